/* paradev.v1.Admin: the operators' service. Every method first asks for an
 * operator (srv_admin_operator): a call on the admin Unix socket is one
 * (the socket's group and mode decide who reaches it); on the client
 * listeners, where rpc.c serves Admin too, only an identity listed as an
 * operator is. Job tokens (CreateJobToken, KillJob) are jobs.c's. */
#define SRV_LOG_SUB SRV_SUB_ADMIN
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "check.h"
#include "jobs.h"
#include "log.h"
#include "ratelimit.h"
#include "paradev/v1/admin.pb-c.h"
#include "server.h"

/* --- who may call ------------------------------------------------------------ */

/* True when the caller of `method` is an operator; otherwise the call is
 * finished (PERMISSION_DENIED naming the method and the identity, or the
 * identity's own error) and the refusal logged. */
static bool srv_admin_operator(srv_call *c, const char *method) {
  const srv_identity *id = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (srv_call_identity(c, &id, &st) != PD_OK) {
    SRV_WARN("refused Admin.%s: %s", method, st.msg);
    srv_call_fail(c, &st);
    return false;
  }
  if (id->is_operator) return true;
  char who[SRV_LOG_QUOTED(96)], tenant[SRV_LOG_QUOTED(64)];
  srv_log_quote(id->name[0] ? id->name : "(none)", who, sizeof who);
  srv_log_quote(id->tenant[0] ? id->tenant : "(none)", tenant, sizeof tenant);
  dev_error(&st, PD_PERMISSION_DENIED,
            "Admin.%s needs an operator: identity \"%s\" (tenant \"%s\") is "
            "not one (use the admin socket as a member of its group, or an "
            "identity listed in [auth] operators)",
            method, who, tenant);
  srv_auth_refused(c, SRV_REFUSE_NOT_OPERATOR, &st); /* logged, counted */
  srv_call_fail(c, &st);
  return false;
}

/* --- ListSessions ---------------------------------------------------------- */

static void srv_admin_list(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__ListSessionsRequest *req = (const void *)m;
  srv *s = c->s;
  if (!srv_admin_operator(c, "ListSessions")) return;
  sched_session_view *v = NULL;
  int n = sched_list_sessions(s->sched, req->job_id, &v);
  srv_arena a = {NULL};
  Paradev__V1__SessionSummary **list =
      n >= 0 ? srv_arena_alloc(&a, sizeof(*list) * (size_t)(n + 1)) : NULL;
  Paradev__V1__SessionSummary *e =
      n >= 0 ? srv_arena_alloc(&a, sizeof(*e) * (size_t)(n + 1)) : NULL;
  /* Client names and job ids are the clients' bytes: proto3 strings must
   * be UTF-8, so they go out as valid UTF-8 (any language kept; control
   * characters and other bytes as '?'). */
  size_t per = 3 * (SCHED_NAME_MAX + 1) + SCHED_IDENTITY_MAX + 1;
  char *names = n >= 0 ? srv_arena_alloc(&a, (size_t)(n + 1) * per) : NULL;
  /* Placement (issue #17): each session's allowed set and its bytes on
   * every daemon device. */
  int ndev = dev_engine_num_devices(s->engine);
  int32_t *devs = n >= 0
                      ? srv_arena_alloc(&a, sizeof(int32_t) * PD_MAX_DEVICES *
                                                (size_t)(n + 1))
                      : NULL;
  uint64_t *bytes = n >= 0
                        ? srv_arena_alloc(&a, sizeof(uint64_t) * (size_t)ndev *
                                                  (size_t)(n + 1))
                        : NULL;
  if (!list || !e || !names || !devs || !bytes) {
    free(v);
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  for (int i = 0; i < n; i++) {
    paradev__v1__session_summary__init(&e[i]);
    char *cn = names + (size_t)i * per;
    char *job = cn + SCHED_NAME_MAX + 1;
    char *tenant = job + SCHED_NAME_MAX + 1;
    char *ident = tenant + SCHED_NAME_MAX + 1;
    e[i].session_id = v[i].seq;
    e[i].client_name = srv_log_utf8(v[i].client, cn, SCHED_NAME_MAX + 1);
    e[i].job_id = srv_log_utf8(v[i].job, job, SCHED_NAME_MAX + 1);
    e[i].memory_bytes = v[i].bytes;
    e[i].handles = v[i].handles;
    e[i].age_seconds = v[i].age_s;
    e[i].idle_seconds = v[i].idle_s;
    e[i].lease_seconds = v[i].lease_s;
    e[i].memory_quota_bytes = v[i].memory_quota;
    e[i].queued_ops = v[i].queued_ops;
    e[i].tenant = srv_log_utf8(v[i].tenant, tenant, SCHED_NAME_MAX + 1);
    e[i].identity = srv_log_utf8(v[i].identity, ident, SCHED_IDENTITY_MAX + 1);
    e[i].job_proven = v[i].job[0] && !v[i].job_claimed;
    dev_devset all;
    if (v[i].devices.n <= 0) dev_devset_all(s->engine, &all);
    int32_t *d = devs + (size_t)i * PD_MAX_DEVICES;
    e[i].n_devices =
        srv_devset_to_pb(v[i].devices.n > 0 ? &v[i].devices : &all, d);
    e[i].devices = d;
    uint64_t *b = bytes + (size_t)i * (size_t)ndev;
    for (int k = 0; k < ndev; k++) b[k] = v[i].device_bytes[k];
    e[i].n_device_memory_bytes = (size_t)ndev;
    e[i].device_memory_bytes = b;
    list[i] = &e[i];
  }
  Paradev__V1__ListSessionsResponse resp =
      PARADEV__V1__LIST_SESSIONS_RESPONSE__INIT;
  resp.n_sessions = (size_t)n;
  resp.sessions = list;
  resp.incarnation = s->incarnation;
  resp.draining = atomic_load(&s->draining);
  resp.device_memory_used_bytes = srv_device_memory_used(s);
  resp.exiting = atomic_load(&s->exiting);
  resp.job_tokens = (uint32_t)srv_jobs_count(s->jobs);
  resp.require_job_token = SRV_RT(s, require_job_token);
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
  free(v);
}

/* --- KillSession, KillJob ----------------------------------------------------- */

typedef struct srv_kill_state {
  sched_kill_result r;
  srv_wait *w;  /* the fence: the devices ran what was submitted before */
  bool job;     /* KillJob: its reply */
  bool revoked; /* KillJob: the job had a live token */
  char job_id[SRV_JOB_ID_MAX + 1];
} srv_kill_state;

static void srv_admin_kill_destroy(srv_call *c) {
  srv_kill_state *k = c->user;
  if (!k) return;
  srv_wait_cancel(k->w);
  srv_wait_put(k->w, false);
  free(k);
  c->user = NULL;
}

/* Sessions still bound to `job` (not those that only claim it). */
static uint32_t srv_admin_job_sessions(srv *s, const char *job) {
  sched_session_view *v = NULL;
  int n = sched_list_sessions(s->sched, job, &v);
  uint32_t bound = 0;
  for (int i = 0; i < n; i++) bound += !v[i].job_claimed;
  free(v);
  return bound;
}

static void srv_admin_kill_reply(srv_call *c, srv_kill_state *k) {
  srv *s = c->s;
  if (!k->job) {
    Paradev__V1__KillSessionResponse resp =
        PARADEV__V1__KILL_SESSION_RESPONSE__INIT;
    resp.sessions_killed = (uint32_t)k->r.sessions;
    resp.handles_freed = k->r.handles;
    resp.bytes_freed = k->r.bytes;
    resp.sessions_remaining = (uint32_t)sched_num_sessions(s->sched);
    resp.device_memory_used_bytes = srv_device_memory_used(s);
    srv_call_reply(c, &resp.base);
    return;
  }
  Paradev__V1__KillJobResponse resp = PARADEV__V1__KILL_JOB_RESPONSE__INIT;
  resp.job_id = k->job_id;
  resp.token_revoked = k->revoked;
  resp.sessions_killed = (uint32_t)k->r.sessions;
  resp.handles_freed = k->r.handles;
  resp.bytes_freed = k->r.bytes;
  resp.job_sessions_remaining = srv_admin_job_sessions(s, k->job_id);
  resp.sessions_remaining = (uint32_t)sched_num_sessions(s->sched);
  resp.device_memory_used_bytes = srv_device_memory_used(s);
  srv_call_reply(c, &resp.base);
}

/* The fence passed: the memory of the killed sessions is free. */
static void srv_admin_kill_done(srv_call *c) {
  srv_kill_state *k = c->user;
  pd_code fence = PD_OK;
  if (k->w) {
    fence = srv_wait_code(k->w);
    srv_wait_put(k->w, false);
    k->w = NULL;
  }
  if (fence != PD_OK)
    SRV_WARN(
        "%s: the devices could not confirm the memory is free "
        "(%s); reporting what is known",
        k->job ? "KillJob" : "KillSession", pd_code_name(fence));
  srv_admin_kill_reply(c, k);
}

static void srv_admin_kill_cancel(srv_call *c) {
  srv_kill_state *k = c->user;
  if (k && k->w) {
    srv_wait_cancel(k->w);
    srv_wait_put(k->w, false);
    k->w = NULL;
  }
  srv_call_finish_cancelled(c, "KillSession (the sessions are gone already)");
}

/* Kills the target's sessions, then answers once the devices caught up
 * (srv_admin_kill_done). `k` becomes the call's. */
static void srv_admin_kill_run(srv_call *c, srv_kill_state *k,
                               const sched_kill_target *t, const char *what) {
  srv *s = c->s;
  c->user = k;
  dev_status st = DEV_STATUS_INIT;
  if (sched_kill(s->sched, t, &k->r, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  SRV_INFO("killed %s: %d session%s, %llu handles, %llu bytes", what,
           k->r.sessions, k->r.sessions == 1 ? "" : "s",
           (unsigned long long)k->r.handles, (unsigned long long)k->r.bytes);
  srv_wait *w = srv_wait_new(c);
  if (!w) {
    srv_admin_kill_done(c);
    return;
  }
  k->w = w;
  if (sched_fence(s->sched, srv_wait_ready, w, &st) != PD_OK) {
    srv_wait_cancel(w);
    srv_wait_put(w, true);
    k->w = NULL;
    srv_admin_kill_done(c);
  }
}

static void srv_admin_kill(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__KillSessionRequest *req = (const void *)m;
  if (!srv_admin_operator(c, "KillSession")) return;
  sched_kill_target t = {NULL, 0, NULL, 0};
  char what[SRV_LOG_QUOTED(64) + 64]; /* for the log line */
  switch (req->target_case) {
    case PARADEV__V1__KILL_SESSION_REQUEST__TARGET_SESSION_TOKEN:
      t.token = req->session_token.data ? req->session_token.data : (void *)"";
      t.token_len = req->session_token.len;
      snprintf(what, sizeof(what), "the session of a token");
      break;
    case PARADEV__V1__KILL_SESSION_REQUEST__TARGET_JOB_ID: {
      char job[SRV_LOG_QUOTED(64)];
      t.job = req->job_id ? req->job_id : "";
      snprintf(what, sizeof(what), "the sessions of job \"%s\"",
               srv_log_quote(t.job, job, sizeof job));
      break;
    }
    case PARADEV__V1__KILL_SESSION_REQUEST__TARGET_SESSION_ID:
      t.seq = req->session_id;
      if (t.seq == 0) {
        srv_call_finish(c, PD_INVALID_ARGUMENT,
                        "session_id 0 names no session (they count from 1)");
        return;
      }
      snprintf(what, sizeof(what), "session %llu", (unsigned long long)t.seq);
      break;
    default:
      srv_call_finish(c, PD_INVALID_ARGUMENT,
                      "KillSession needs a target: session_token, job_id or "
                      "session_id");
      return;
  }
  srv_kill_state *k = calloc(1, sizeof(*k));
  if (!k) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  srv_admin_kill_run(c, k, &t, what);
}

/* KillJob: the token goes first, so that no session can be bound to the
 * job between the kill and the reply. */
static void srv_admin_kill_job(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__KillJobRequest *req = (const void *)m;
  if (!srv_admin_operator(c, "KillJob")) return;
  const char *job = req->job_id ? req->job_id : "";
  size_t n = strlen(job);
  dev_status st = DEV_STATUS_INIT;
  if (srv_jobs_check_id(job, &st) != PD_OK) { /* no token could name it */
    srv_call_fail(c, &st);
    return;
  }
  srv_kill_state *k = calloc(1, sizeof(*k));
  if (!k) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  k->job = true;
  memcpy(k->job_id, job, n + 1);
  k->revoked = srv_jobs_revoke(c->s->jobs, job, &st);
  if (st.code != PD_OK)
    SRV_ERROR("KillJob: job \"%s\"'s token is revoked, but %s", job, st.msg);
  char q[SRV_LOG_QUOTED(64)], what[SRV_LOG_QUOTED(64) + 64];
  snprintf(what, sizeof what, "job \"%s\" (token %s)",
           srv_log_quote(job, q, sizeof q),
           k->revoked ? "revoked" : "none live");
  sched_kill_target t = {NULL, 0, k->job_id, 0};
  srv_admin_kill_run(c, k, &t, what);
}

/* --- CreateJobToken ------------------------------------------------------------ */

/* The job's GPUs (CreateJobTokenRequest.gpus, as Slurm numbers them) as the
 * daemon devices on them (dev_engine_device_gpu), in mesh order: every
 * device of every GPU. INVALID_ARGUMENT naming a GPU given twice, a
 * negative one, or one no device of this daemon runs on. */
static pd_code srv_admin_gpu_devices(srv *s, const int32_t *gpus, size_t n,
                                     dev_devset *out, dev_status *st) {
  int ndev = dev_engine_num_devices(s->engine);
  if (n > PD_MAX_DEVICES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "CreateJobTokenRequest.gpus lists %zu GPUs; at most %d", n,
                     PD_MAX_DEVICES);
  bool want[PD_MAX_DEVICES] = {false};
  for (size_t i = 0; i < n; i++) {
    for (size_t j = 0; j < i; j++)
      if (gpus[j] == gpus[i])
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "CreateJobTokenRequest.gpus[%zu] = %d: GPU %d is "
                         "gpus[%zu] already; each GPU may appear once",
                         i, (int)gpus[i], (int)gpus[i], j);
    bool found = false;
    for (int d = 0; d < ndev; d++)
      if (gpus[i] >= 0 && dev_engine_device_gpu(s->engine, d) == gpus[i]) {
        want[d] = true;
        found = true;
      }
    if (!found) {
      char have[256] = "";
      size_t o = 0;
      for (int d = 0; d < ndev && o < sizeof have; d++) {
        int w = snprintf(have + o, sizeof have - o, "%s%d", d ? ", " : "",
                         dev_engine_device_gpu(s->engine, d));
        o += w > 0 ? (size_t)w : 0;
      }
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "CreateJobTokenRequest.gpus[%zu] = %d: no device of "
                       "this paradevd runs on GPU %d (its devices 0..%d are "
                       "on GPUs %s): is the job on this node, and are its "
                       "GPUs in paradevd's mesh?",
                       i, (int)gpus[i], (int)gpus[i], ndev - 1, have);
    }
  }
  memset(out, 0, sizeof(*out));
  for (int d = 0; d < ndev; d++)
    if (want[d]) out->dev[out->n++] = (uint8_t)d;
  return PD_OK;
}

/* The devices a new token binds its job to: `gpus` mapped to devices, or
 * `devices` as given; out->n == 0 for neither. Both: INVALID_ARGUMENT. */
static pd_code srv_admin_job_devices(
    srv_call *c, const Paradev__V1__CreateJobTokenRequest *req, dev_devset *out,
    dev_status *st) {
  memset(out, 0, sizeof(*out));
  if (req->n_gpus && req->n_devices)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "CreateJobToken: gpus and devices both given; bind the "
                     "job by its GPUs (as Slurm numbers them) or by daemon "
                     "device indices, not both");
  if (req->n_gpus)
    return srv_admin_gpu_devices(c->s, req->gpus, req->n_gpus, out, st);
  srv_req_limits l = srv_call_limits(c);
  const dev_devset *set = NULL;
  PD_TRY(srv_devset_from_pb(&l, req->devices, req->n_devices,
                            "CreateJobTokenRequest.devices", out, &set, st));
  if (!set) memset(out, 0, sizeof(*out));
  return PD_OK;
}

static void srv_admin_job_token(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__CreateJobTokenRequest *req = (const void *)m;
  srv *s = c->s;
  if (!srv_admin_operator(c, "CreateJobToken")) return;
  uint32_t life = req->lifetime_seconds ? req->lifetime_seconds
                                        : SRV_RT(s, job_token_lifetime_s);
  char token[SRV_JOB_TOKEN_CHARS + 1];
  bool replaced = false;
  dev_status st = DEV_STATUS_INIT;
  dev_devset bound;
  if (srv_admin_job_devices(c, req, &bound, &st) != PD_OK ||
      srv_jobs_mint(s->jobs, req->job_id, req->uid, &bound, life, token,
                    &replaced, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  char uid[32] = "any uid", devs[DEV_DEVSET_STR_MAX] = "every device";
  if (req->uid >= 0) snprintf(uid, sizeof uid, "uid %lld", (long long)req->uid);
  if (bound.n) dev_devset_str(&bound, devs, sizeof devs);
  SRV_INFO("job token for job \"%s\" (%s, devices %s, %u s)%s", req->job_id,
           uid, devs, life,
           replaced ? "; the job's older token no longer works" : "");
  int32_t bdev[PD_MAX_DEVICES];
  Paradev__V1__CreateJobTokenResponse resp =
      PARADEV__V1__CREATE_JOB_TOKEN_RESPONSE__INIT;
  resp.token = token;
  resp.job_id = req->job_id;
  resp.lifetime_seconds = life;
  resp.replaced = replaced;
  resp.n_devices = srv_devset_to_pb(&bound, bdev);
  resp.devices = bdev;
  srv_call_reply(c, &resp.base);
  OPENSSL_cleanse(token, sizeof token);
}

/* --- Drain ------------------------------------------------------------------- */

static void srv_admin_drain(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DrainRequest *req = (const void *)m;
  srv *s = c->s;
  if (!srv_admin_operator(c, "Drain")) return;
  if (req->resume && req->exit_when_drained) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "resume and exit_when_drained contradict each other");
    return;
  }
  if (req->resume) {
    if (atomic_load(&s->exiting)) {
      srv_call_finish(c, PD_FAILED_PRECONDITION,
                      "paradevd is draining to exit (SIGTERM or a drain "
                      "with exit_when_drained); it cannot resume");
      return;
    }
    if (srv_resume(s)) SRV_INFO("back in service (Drain with resume)");
  } else {
    bool started = srv_drain(s, req->exit_when_drained);
    if (started || req->exit_when_drained)
      SRV_INFO(
          "draining on an operator's request%s",
          req->exit_when_drained ? "; exiting when queued work is done" : "");
  }
  sched_stats ss = {.struct_size = sizeof(ss)};
  sched_get_stats(s->sched, &ss);
  Paradev__V1__DrainResponse resp = PARADEV__V1__DRAIN_RESPONSE__INIT;
  resp.draining = atomic_load(&s->draining);
  resp.exiting = atomic_load(&s->exiting);
  resp.sessions = (uint32_t)ss.sessions;
  resp.ops_outstanding = ss.ops_queued + ss.ops_in_flight;
  srv_call_reply(c, &resp.base);
}

/* --- SetLogLevel --------------------------------------------------------------- */

static void srv_admin_log(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__SetLogLevelRequest *req = (const void *)m;
  if (!srv_admin_operator(c, "SetLogLevel")) return;
  int levels[SRV_SUB_COUNT], before[SRV_SUB_COUNT];
  srv_log_get(levels);
  memcpy(before, levels, sizeof(before));
  char err[512];
  if (!srv_log_parse_spec(req->spec, levels, err, sizeof(err))) {
    char cs[128];
    srv_call_finish(c, PD_INVALID_ARGUMENT, "log spec '%s': %s",
                    srv_log_clean(req->spec, cs, sizeof cs), err);
    return;
  }
  char prev[256], cur[256];
  srv_log_spec(before, prev, sizeof(prev));
  srv_log_spec(levels, cur, sizeof(cur));
  srv_log_set(levels);
  SRV_LOG_AT(SRV_SUB_ADMIN, SRV_LOG_WARN, "log levels: %s (were %s)", cur,
             prev);
  Paradev__V1__SetLogLevelResponse resp =
      PARADEV__V1__SET_LOG_LEVEL_RESPONSE__INIT;
  resp.previous = prev;
  resp.current = cur;
  srv_call_reply(c, &resp.base);
}

const srv_handlers srv_h_ListSessions = {.on_request = srv_admin_list};
const srv_handlers srv_h_KillSession = {.on_request = srv_admin_kill,
                                        .on_destroy = srv_admin_kill_destroy,
                                        .on_wake = srv_admin_kill_done,
                                        .on_cancel = srv_admin_kill_cancel,
                                        .early_close = true};
const srv_handlers srv_h_Drain = {.on_request = srv_admin_drain};
const srv_handlers srv_h_SetLogLevel = {.on_request = srv_admin_log};
const srv_handlers srv_h_CreateJobToken = {.on_request = srv_admin_job_token};
const srv_handlers srv_h_KillJob = {.on_request = srv_admin_kill_job,
                                    .on_destroy = srv_admin_kill_destroy,
                                    .on_wake = srv_admin_kill_done,
                                    .on_cancel = srv_admin_kill_cancel,
                                    .early_close = true};
