/* `paradev admin job-token` and `kill-job`: a job's token and its end, the
 * two steps of the Slurm prolog and epilog (deploy/slurm/). The token
 * proves a session's job id (Admin.CreateJobToken) and, with --gpus, holds
 * the job's sessions to the daemon devices on its GPUs: printed alone on
 * stdout, so `TOKEN=$(paradev admin job-token --job 1234)` holds it and
 * nothing else; the daemon keeps only its hash. kill-job revokes it and
 * ends exactly the sessions bound to the job (Admin.KillJob). */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_admin.h"
#include "paradev/v1/admin.pb-c.h"

/* A uid: digits only, below 2^32 - 1. */
static bool cli_jobs_uid(const char *v, int64_t *out) {
  if (!*v || strspn(v, "0123456789") != strlen(v) || strlen(v) > 10)
    return false;
  unsigned long long n = strtoull(v, NULL, 10);
  if (n >= UINT32_MAX) return false;
  *out = (int64_t)n;
  return true;
}

/* A list of GPU indices as Slurm gives them (SLURM_JOB_GPUS "1,3",
 * CUDA_VISIBLE_DEVICES "1,3"): numbers 0..2^31-1 separated by commas, at
 * most 64; into out[*n]. False when it is not that. */
static bool cli_jobs_gpus(const char *v, int32_t *out, size_t *n) {
  *n = 0;
  while (*v) {
    size_t digits = strspn(v, "0123456789");
    if (digits == 0 || digits > 9 || *n == 64) return false;
    out[(*n)++] = (int32_t)strtol(v, NULL, 10);
    v += digits;
    if (*v == ',' && v[1])
      v++;
    else if (*v)
      return false;
  }
  return *n > 0;
}

/* A lifetime: whole seconds, minutes, hours or days with their unit (90m,
 * 48h, 7d), 1 s to 30 days (the daemon's bound). */
static bool cli_jobs_lifetime(const char *v, uint32_t *out) {
  size_t digits = strspn(v, "0123456789");
  if (digits == 0 || digits > 8 || strlen(v) != digits + 1) return false;
  unsigned long long n = strtoull(v, NULL, 10), unit;
  switch (v[digits]) {
    case 's': unit = 1; break;
    case 'm': unit = 60; break;
    case 'h': unit = 3600; break;
    case 'd': unit = 86400; break;
    default: return false;
  }
  if (n == 0 || n * unit > 30ull * 86400) return false;
  *out = (uint32_t)(n * unit);
  return true;
}

int cli_admin_job_token(const char *sock, double timeout, int argc,
                        char **argv) {
  Paradev__V1__CreateJobTokenRequest req;
  paradev__v1__create_job_token_request__init(&req);
  req.uid = -1;
  const char *job = NULL;
  int32_t gpus[64];
  cli_admin_out out = {false, NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int f = cli_admin_out_flag("job-token", argc, argv, &i, &out);
    if (f < 0) return 2;
    if (f) continue;
    bool is_job = strcmp(a, "--job") == 0 || strncmp(a, "--job=", 6) == 0;
    bool is_uid = strcmp(a, "--uid") == 0 || strncmp(a, "--uid=", 6) == 0;
    bool is_life =
        strcmp(a, "--lifetime") == 0 || strncmp(a, "--lifetime=", 11) == 0;
    bool is_gpus = strcmp(a, "--gpus") == 0 || strncmp(a, "--gpus=", 7) == 0;
    if (!is_job && !is_uid && !is_life && !is_gpus)
      return cli_admin_bad("job-token: unexpected '%s'", a);
    const char *v = cli_admin_value(argc, argv, &i);
    const char *flag = is_job    ? "--job"
                       : is_uid  ? "--uid"
                       : is_gpus ? "--gpus"
                                 : "--lifetime";
    if (!v) return cli_admin_bad("job-token: %s needs a value", flag);
    if (is_job) {
      job = v;
    } else if (is_gpus) {
      if (!cli_jobs_gpus(v, gpus, &req.n_gpus))
        return cli_admin_bad(
            "job-token: --gpus '%s': expected at most 64 GPU indices of at "
            "most 9 digits each, separated by commas, such as 1,3 (as "
            "$SLURM_JOB_GPUS gives them)",
            v);
      req.gpus = gpus;
    } else if (is_uid) {
      if (!cli_jobs_uid(v, &req.uid))
        return cli_admin_bad(
            "job-token: --uid '%s': expected the job user's numeric uid "
            "(such as $SLURM_JOB_UID)",
            v);
    } else {
      if (!cli_jobs_lifetime(v, &req.lifetime_seconds))
        return cli_admin_bad(
            "job-token: --lifetime '%s': expected whole seconds, minutes, "
            "hours or days with their unit, 1s to 30d, such as 90m, 48h or "
            "7d (the daemon's default when not given)",
            v);
    }
  }
  if (!job)
    return cli_admin_bad("job-token: --job ID is required (the job's id)");
  req.job_id = (char *)job;
  Paradev__V1__CreateJobTokenResponse *r = NULL;
  if (cli_admin_call(sock, timeout, "CreateJobToken", &req.base,
                     &paradev__v1__create_job_token_response__descriptor,
                     (ProtobufCMessage **)&r))
    return 1;
  int rc = 0;
  if (out.json) {
    json_object *doc = json_object_new_object();
    json_object_object_add(doc, "job_id", json_object_new_string(r->job_id));
    json_object_object_add(doc, "token", json_object_new_string(r->token));
    json_object_object_add(doc, "uid", json_object_new_int64(req.uid));
    json_object_object_add(doc, "lifetime_seconds",
                           json_object_new_uint64(r->lifetime_seconds));
    json_object_object_add(doc, "replaced",
                           json_object_new_boolean(r->replaced));
    /* The daemon devices the job is bound to (issue #17); [] for none
     * (--field devices prints [1,3]). */
    json_object *devs = json_object_new_array();
    for (size_t k = 0; k < r->n_devices; k++)
      json_object_array_add(devs, json_object_new_int(r->devices[k]));
    json_object_object_add(doc, "devices", devs);
    rc = cli_admin_emit(doc, &out, "job-token");
  } else {
    puts(r->token);
    char text[64 * 4] = "every device";
    size_t o = 0;
    for (size_t k = 0; k < r->n_devices; k++) {
      int w = snprintf(text + o, sizeof text - o, "%s%d", k ? "," : "devices ",
                       (int)r->devices[k]);
      if (w > 0 && (size_t)w < sizeof text - o) o += (size_t)w;
    }
    fprintf(stderr,
            "paradev admin: job %s: token valid for %u s, %s%s (give it to "
            "the job as PARADEV_JOB_TOKEN)\n",
            r->job_id, r->lifetime_seconds, text,
            r->replaced ? "; the job's older token no longer works" : "");
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

static json_object *cli_jobs_kill_json(const Paradev__V1__KillJobResponse *r) {
  json_object *doc = json_object_new_object();
  json_object_object_add(doc, "job_id", json_object_new_string(r->job_id));
  json_object_object_add(doc, "token_revoked",
                         json_object_new_boolean(r->token_revoked));
  json_object_object_add(doc, "sessions_killed",
                         json_object_new_uint64(r->sessions_killed));
  json_object_object_add(doc, "handles_freed",
                         json_object_new_uint64(r->handles_freed));
  json_object_object_add(doc, "bytes_freed",
                         json_object_new_uint64(r->bytes_freed));
  json_object_object_add(doc, "job_sessions_remaining",
                         json_object_new_uint64(r->job_sessions_remaining));
  json_object_object_add(doc, "sessions_remaining",
                         json_object_new_uint64(r->sessions_remaining));
  json_object_object_add(doc, "device_memory_used_bytes",
                         json_object_new_uint64(r->device_memory_used_bytes));
  return doc;
}

int cli_admin_kill_job(const char *sock, double timeout, int argc,
                       char **argv) {
  const char *job = NULL;
  bool verify = false;
  cli_admin_out out = {false, NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int f = cli_admin_out_flag("kill-job", argc, argv, &i, &out);
    if (f < 0) return 2;
    if (f) continue;
    if (strcmp(a, "--verify") == 0) {
      verify = true;
    } else if (strcmp(a, "--job") == 0 || strncmp(a, "--job=", 6) == 0) {
      if (!(job = cli_admin_value(argc, argv, &i)))
        return cli_admin_bad("kill-job: --job needs a value (a job id)");
    } else {
      return cli_admin_bad("kill-job: unexpected '%s'", a);
    }
  }
  if (!job)
    return cli_admin_bad("kill-job: --job ID is required (the job's id)");
  Paradev__V1__KillJobRequest req;
  paradev__v1__kill_job_request__init(&req);
  req.job_id = (char *)job;
  Paradev__V1__KillJobResponse *r = NULL;
  if (cli_admin_call(sock, timeout, "KillJob", &req.base,
                     &paradev__v1__kill_job_response__descriptor,
                     (ProtobufCMessage **)&r))
    return 1;
  int rc = 0;
  if (out.json) {
    rc = cli_admin_emit(cli_jobs_kill_json(r), &out, "kill-job");
  } else {
    char b1[32], b2[32];
    printf("killed %u session%s of job %s: %" PRIu64
           " handles, %s freed; token %s; %u session%s left; device memory "
           "in use: %s\n",
           r->sessions_killed, r->sessions_killed == 1 ? "" : "s", r->job_id,
           r->handles_freed, cli_admin_bytes(r->bytes_freed, b1, sizeof b1),
           r->token_revoked ? "revoked" : "none live", r->sessions_remaining,
           r->sessions_remaining == 1 ? "" : "s",
           cli_admin_bytes(r->device_memory_used_bytes, b2, sizeof b2));
  }
  if (verify && r->job_sessions_remaining) {
    fprintf(stderr,
            "paradev admin: %u session%s of job %s still open after the "
            "kill\n",
            r->job_sessions_remaining,
            r->job_sessions_remaining == 1 ? " is" : "s are", r->job_id);
    rc = 1;
  } else if (verify && r->sessions_remaining == 0 &&
             r->device_memory_used_bytes) {
    fprintf(stderr,
            "paradev admin: no session is open but the devices still hold "
            "%" PRIu64 " bytes: memory was not given back\n",
            r->device_memory_used_bytes);
    rc = 3;
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}
