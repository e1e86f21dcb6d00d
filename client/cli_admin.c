/* `paradev admin`: the operators' commands, spoken to paradevd's admin Unix
 * socket (service paradev.v1.Admin, proto/paradev/v1/admin.proto). The
 * socket's group and mode decide who may run them (deploy/: group
 * paradev-admin, 0660); paradevd checks that the caller is an operator.
 *
 *   paradev admin [--socket PATH | --target ADDR [--tls-ca F] [--tls-cert F
 *                  --tls-key F] [--tls-server-name N] [--token-file F]]
 *                 [--timeout TIME] COMMAND
 *     status [--json | --field NAME]  in service or draining; counts
 *     sessions [--job ID] [--json | --field NAME]
 *                                     the open sessions, oldest first
 *     kill (--job ID | --session N | --token HEX) [--verify]
 *                                     end sessions; answers once the devices
 *                                     have freed their memory. --verify: exit
 *                                     3 when no session is left but device
 *                                     memory is still in use
 *     job-token --job ID [--uid N] [--gpus LIST] [--lifetime TIME]
 *               [--json | --field NAME]
 *                                     mint the token that proves a job's id
 *                                     (--gpus 1,3: and holds its sessions to
 *                                     the devices on those GPUs)
 *     kill-job --job ID [--verify] [--json | --field NAME]
 *                                     revoke it and end the job's sessions
 *     drain [--exit | --resume]       stop taking sessions (and exit once the
 *                                     queued work is done), or take them again
 *     log-level SPEC                  e.g. debug, or info,sched=debug
 *
 * The socket: --socket, else $PARADEV_ADMIN_SOCKET, else paradevd's default
 * (/run/paradev/admin.sock under systemd, $XDG_RUNTIME_DIR/paradevd-admin.sock
 * otherwise, /tmp/paradevd-UID/paradevd-admin.sock without a runtime
 * directory). --timeout takes a unit (500ms, 2s, 1m), as the top level's;
 * a bare number is refused. --field NAME prints one member of --json's
 * document alone (a string without quotes, true/false, a number), for
 * scripts: `paradev admin status --field draining`.
 * --target sends the commands to a client listener instead (a remote
 * operator: an identity of [auth] operators, by client certificate or
 * bearer token; cli_admin_set_remote).
 *
 * Exit status: 0 done, 1 the daemon said no (its message is printed), 2 a
 * bad command line (or no such --field), 3 --verify found memory still in
 * use. The unary call itself is cli_admin_rpc.c's, the job commands
 * cli_jobs.c's. */
#include <ctype.h>
#include <errno.h>
#include <grpc/grpc.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_admin.h"
#include "cli_int.h"
#include "paradev/v1/admin.pb-c.h"

int cli_admin(int argc, char **argv);

static const char cli_admin_usage[] =
    "Usage: paradev admin [--socket PATH | --target ADDR [TLS and token\n"
    "                     options]] [--timeout TIME] COMMAND\n"
    "Operate a paradevd through its admin socket, or as a remote operator.\n"
    "\n"
    "Commands:\n"
    "  status [--json]                in service, draining or exiting; the\n"
    "                                 sessions and job tokens live\n"
    "  sessions [--job ID] [--json]   list the open sessions (--json: one\n"
    "                                 document, {\"count\": N, ...,\n"
    "                                 \"sessions\": [...]}); a JOB ending in\n"
    "                                 '?' is only claimed (no job token)\n"
    "  kill --job ID | --session N | --token HEX [--verify]\n"
    "                                 end sessions and free their memory;\n"
    "                                 --verify: exit 3 if no session is left\n"
    "                                 but device memory is still in use\n"
    "  job-token --job ID [--uid N] [--gpus LIST] [--lifetime TIME]\n"
    "                                 mint the token that proves a job's id\n"
    "                                 (the Slurm prolog; prints the token);\n"
    "                                 --gpus 1,3: its sessions may use only\n"
    "                                 the devices on those GPUs (--json:\n"
    "                                 \"devices\", the devices bound)\n"
    "  kill-job --job ID [--verify]   revoke the job's token and end the\n"
    "                                 sessions bound to it (the epilog)\n"
    "  drain [--exit | --resume]      take no new sessions (--exit: exit once\n"
    "                                 queued work is done; --resume: undo)\n"
    "  log-level SPEC                 set log levels: debug, info,sched=debug\n"
    "\n"
    "Options:\n"
    "  --socket PATH      the admin socket (default $PARADEV_ADMIN_SOCKET, or\n"
    "                     /run/paradev/admin.sock when it exists, or\n"
    "                     $XDG_RUNTIME_DIR/paradevd-admin.sock, or without\n"
    "                     XDG_RUNTIME_DIR "
    "/tmp/paradevd-UID/paradevd-admin.sock)\n"
    "  --timeout TIME     give up after this long, 1ms to 24h: 500ms, 2s, 1m;\n"
    "                     a number needs a unit (default 60s)\n"
    "  --json, --field NAME (after status, sessions, job-token, kill-job)\n"
    "                     print the reply as one JSON document, or one member\n"
    "                     of it alone (for scripts)\n"
    "  --target ADDR      a remote operator: the daemon's client listener\n"
    "                     (host:port, tls://host:port) instead of the admin\n"
    "                     socket; the caller must be in [auth] operators\n"
    "  --tls-ca FILE, --tls-cert FILE, --tls-key FILE, --tls-server-name NAME\n"
    "                     TLS with --target, as paradev's own (default\n"
    "                     $PARADEV_TLS_CA, $PARADEV_TLS_CERT, ...)\n"
    "  --token-file FILE  a bearer token with --target (default\n"
    "                     $PARADEV_TOKEN, $PARADEV_TOKEN_FILE)\n"
    "  (paradev's own --target is not used here: a note on stderr says so)\n"
    "\n"
    "Exit status: 0 done; 1 the daemon said no or could not be reached (its\n"
    "message is printed); 2 a bad command line (or no such --field); 3 kill\n"
    "--verify or kill-job --verify found device memory still in use.\n";

static void cli_admin_default_socket(char *out, size_t len) {
  const char *env = getenv("PARADEV_ADMIN_SOCKET");
  struct stat sb;
  if (env && *env) {
    snprintf(out, len, "%s", env);
  } else if (stat("/run/paradev/admin.sock", &sb) == 0) {
    snprintf(out, len, "/run/paradev/admin.sock");
  } else if ((env = getenv("XDG_RUNTIME_DIR")) && *env) {
    snprintf(out, len, "%s/paradevd-admin.sock", env);
  } else {
    char dir[64];
    cli_tmp_socket_dir(dir, sizeof(dir));
    snprintf(out, len, "%s/paradevd-admin.sock", dir);
  }
}

static const char *cli_admin_dur(double s, char *buf, size_t len) {
  uint64_t t = (uint64_t)s;
  if (t < 60)
    snprintf(buf, len, "%" PRIu64 "s", t);
  else if (t < 3600)
    snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", t / 60, t % 60);
  else if (t < 86400)
    snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", t / 3600, (t / 60) % 60);
  else
    snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", t / 86400,
             (t / 3600) % 24);
  return buf;
}

/* The code point of the UTF-8 sequence p..q, and whether a terminal must
 * not get it raw: C1 controls, and the format characters that reorder or
 * hide text (bidi embeddings, overrides and isolates such as U+202E, marks,
 * zero-width characters, line and paragraph separators, tag characters). */
static bool cli_admin_hidden(const char *p, const char *q, unsigned *cp) {
  const unsigned char *u = (const unsigned char *)p;
  size_t n = (size_t)(q - p);
  *cp = n == 2   ? (u[0] & 0x1Fu) << 6 | (u[1] & 0x3Fu)
        : n == 3 ? (u[0] & 0x0Fu) << 12 | (u[1] & 0x3Fu) << 6 | (u[2] & 0x3Fu)
        : n == 4 ? (u[0] & 0x07u) << 18 | (u[1] & 0x3Fu) << 12 |
                       (u[2] & 0x3Fu) << 6 | (u[3] & 0x3Fu)
                 : 0;
  unsigned c = *cp;
  return (c >= 0x80 && c <= 0x9F) || c == 0x61C || c == 0x180E ||
         (c >= 0x200B && c <= 0x200F) || (c >= 0x2028 && c <= 0x202E) ||
         (c >= 0x2060 && c <= 0x206F) || c == 0xFEFF ||
         (c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0xE0000 && c <= 0xE007F);
}

/* A table cell of `width` characters: the text cut to that many characters
 * (the daemon sends valid UTF-8; a character is never cut in two), then
 * padded with spaces. Counts characters, not display columns. A character
 * that would reorder or hide the operator's terminal text is written as
 * \uXXXX (six characters of the cell; \UXXXXXXXX, ten, past U+FFFF);
 * --json keeps every name exact. */
static void cli_admin_cell(const char *s, int width) {
  int n = 0;
  const char *p = s;
  while (*p) {
    const char *q = p + 1;
    while ((*q & 0xC0) == 0x80) q++; /* continuation bytes */
    unsigned cp;
    bool hide = cli_admin_hidden(p, q, &cp);
    int w = !hide ? 1 : cp > 0xFFFF ? 10 : 6;
    if (n + w > width) break;
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      putchar('?'); /* a terminal's control: not from this daemon */
    else if (hide)
      printf(cp > 0xFFFF ? "\\U%08X" : "\\u%04X", cp);
    else
      fwrite(p, 1, (size_t)(q - p), stdout);
    n += w;
    p = q;
  }
  printf("%*s", width - n, "");
}

/* One session of ListSessions as a JSON object. */
static json_object *cli_admin_session_json(
    const Paradev__V1__SessionSummary *e) {
  char sec[2][32];
  json_object *o = json_object_new_object();
  snprintf(sec[0], sizeof sec[0], "%.3f", e->age_seconds);
  snprintf(sec[1], sizeof sec[1], "%.3f", e->idle_seconds);
  json_object_object_add(o, "session_id",
                         json_object_new_uint64(e->session_id));
  json_object_object_add(o, "client_name",
                         json_object_new_string(e->client_name));
  json_object_object_add(o, "job_id", json_object_new_string(e->job_id));
  json_object_object_add(o, "job_proven",
                         json_object_new_boolean(e->job_proven));
  json_object_object_add(o, "tenant", json_object_new_string(e->tenant));
  json_object_object_add(o, "identity", json_object_new_string(e->identity));
  json_object_object_add(o, "memory_bytes",
                         json_object_new_uint64(e->memory_bytes));
  json_object_object_add(o, "handles", json_object_new_uint64(e->handles));
  json_object_object_add(o, "queued_ops",
                         json_object_new_uint64(e->queued_ops));
  json_object_object_add(o, "age_seconds",
                         json_object_new_double_s(e->age_seconds, sec[0]));
  json_object_object_add(o, "idle_seconds",
                         json_object_new_double_s(e->idle_seconds, sec[1]));
  json_object_object_add(o, "lease_seconds",
                         json_object_new_uint64(e->lease_seconds));
  json_object_object_add(o, "memory_quota_bytes",
                         json_object_new_uint64(e->memory_quota_bytes));
  /* Placement (issue #17): the allowed devices, and the bytes held on each
   * of the daemon's devices (index = device). */
  json_object *devs = json_object_new_array(), *per = json_object_new_array();
  for (size_t k = 0; k < e->n_devices; k++)
    json_object_array_add(devs, json_object_new_int(e->devices[k]));
  for (size_t k = 0; k < e->n_device_memory_bytes; k++)
    json_object_array_add(per,
                          json_object_new_uint64(e->device_memory_bytes[k]));
  json_object_object_add(o, "devices", devs);
  json_object_object_add(o, "device_memory_bytes", per);
  return o;
}

/* The session's devices for the table: "1,2" (at most `len` bytes, cut
 * with "..."), and after the table each device's bytes. */
static const char *cli_admin_devices_cell(const Paradev__V1__SessionSummary *e,
                                          char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (size_t k = 0; k < e->n_devices; k++) {
    int w = snprintf(buf + o, len - o, "%s%d", k ? "," : "", e->devices[k]);
    if (w < 0 || (size_t)w >= len - o) {
      snprintf(buf + (len > 4 ? len - 4 : 0), len > 4 ? 4 : len, "...");
      break;
    }
    o += (size_t)w;
  }
  return buf[0] ? buf : "-";
}

/* The daemon's state from a ListSessions reply, the members `status` and
 * `sessions` share. The incarnation is a string: a 64-bit number does not
 * survive JSON readers that use doubles. */
static json_object *cli_admin_state_json(
    const Paradev__V1__ListSessionsResponse *r) {
  char inc[20];
  snprintf(inc, sizeof inc, "%016" PRIx64, r->incarnation);
  json_object *doc = json_object_new_object();
  json_object_object_add(doc, "incarnation", json_object_new_string(inc));
  json_object_object_add(doc, "state",
                         json_object_new_string(r->exiting    ? "exiting"
                                                : r->draining ? "draining"
                                                              : "serving"));
  json_object_object_add(doc, "draining", json_object_new_boolean(r->draining));
  json_object_object_add(doc, "exiting", json_object_new_boolean(r->exiting));
  json_object_object_add(doc, "job_tokens",
                         json_object_new_uint64(r->job_tokens));
  json_object_object_add(doc, "require_job_token",
                         json_object_new_boolean(r->require_job_token));
  json_object_object_add(doc, "device_memory_used_bytes",
                         json_object_new_uint64(r->device_memory_used_bytes));
  return doc;
}

static void cli_admin_sessions_table(const Paradev__V1__ListSessionsResponse *r,
                                     const char *job) {
  char b1[32], b2[32], b3[32], b4[32], dv[16];
  printf("%-6s %-20s %-13s %-12s %-11s %11s %8s %7s %8s %7s %6s %11s\n", "ID",
         "CLIENT", "JOB", "TENANT", "DEVICES", "MEMORY", "HANDLES", "QUEUED",
         "AGE", "IDLE", "LEASE", "QUOTA");
  for (size_t i = 0; i < r->n_sessions; i++) {
    const Paradev__V1__SessionSummary *e = r->sessions[i];
    char quota[32];
    if (e->memory_quota_bytes)
      cli_admin_bytes(e->memory_quota_bytes, quota, sizeof quota);
    else
      snprintf(quota, sizeof quota, "-");
    printf("%-6" PRIu64 " ", e->session_id);
    cli_admin_cell(e->client_name[0] ? e->client_name : "-", 20);
    putchar(' ');
    cli_admin_cell(e->job_id[0] ? e->job_id : "-", 12);
    /* A job id the client only claimed (no job token) ends in '?'. */
    putchar(e->job_id[0] && !e->job_proven ? '?' : ' ');
    putchar(' ');
    cli_admin_cell(e->tenant[0] ? e->tenant : "-", 12);
    printf(" %-11s", cli_admin_devices_cell(e, dv, 12));
    printf(" %11s %8" PRIu64 " %7" PRIu64 " %8s %7s %5us %11s\n",
           cli_admin_bytes(e->memory_bytes, b1, sizeof b1), e->handles,
           e->queued_ops, cli_admin_dur(e->age_seconds, b2, sizeof b2),
           cli_admin_dur(e->idle_seconds, b3, sizeof b3), e->lease_seconds,
           quota);
  }
  /* Each session's bytes per device (issue #17), on the devices it holds
   * any or may use. */
  for (size_t i = 0; i < r->n_sessions; i++) {
    const Paradev__V1__SessionSummary *e = r->sessions[i];
    printf("  session %" PRIu64 " per device:", e->session_id);
    for (size_t k = 0; k < e->n_device_memory_bytes; k++) {
      bool allowed = false;
      for (size_t q = 0; q < e->n_devices; q++)
        allowed |= e->devices[q] == (int32_t)k;
      if (allowed || e->device_memory_bytes[k])
        printf(" %zu: %s", k,
               cli_admin_bytes(e->device_memory_bytes[k], b1, sizeof b1));
    }
    putchar('\n');
  }
  printf("(%zu session%s%s; device memory in use: %s%s)\n", r->n_sessions,
         r->n_sessions == 1 ? "" : "s", job[0] ? " of that job" : "",
         cli_admin_bytes(r->device_memory_used_bytes, b4, sizeof b4),
         r->exiting    ? "; DRAINING to exit"
         : r->draining ? "; DRAINING"
                       : "");
}

/* ListSessions, for `sessions` and `status`; 0 or 1 (printed). */
static int cli_admin_list(const char *sock, double timeout, const char *job,
                          Paradev__V1__ListSessionsResponse **r) {
  Paradev__V1__ListSessionsRequest req;
  paradev__v1__list_sessions_request__init(&req);
  req.job_id = (char *)job;
  return cli_admin_call(sock, timeout, "ListSessions", &req.base,
                        &paradev__v1__list_sessions_response__descriptor,
                        (ProtobufCMessage **)r);
}

static int cli_admin_sessions(const char *sock, double timeout, int argc,
                              char **argv) {
  const char *job = "";
  cli_admin_out out = {false, NULL};
  for (int i = 1; i < argc; i++) {
    int f = cli_admin_out_flag("sessions", argc, argv, &i, &out);
    if (f < 0) return 2;
    if (f) continue;
    if (strcmp(argv[i], "--job") == 0 || strncmp(argv[i], "--job=", 6) == 0) {
      if (!(job = cli_admin_value(argc, argv, &i)))
        return cli_admin_bad("sessions: --job needs a value (a job id)");
    } else {
      return cli_admin_bad("sessions: unexpected '%s'", argv[i]);
    }
  }
  Paradev__V1__ListSessionsResponse *r = NULL;
  if (cli_admin_list(sock, timeout, job, &r)) return 1;
  int rc = 0;
  if (out.json) {
    /* One document: the summary the table's last line gives, then the list
     * (an empty list when there are none); UTF-8 as the daemon sent it.
     * job_sessions: those bound to the job (job_proven), which its kills
     * end; count: every session listed, claims of the job id included. */
    json_object *doc = cli_admin_state_json(r), *list = json_object_new_array();
    uint64_t bound = 0;
    for (size_t i = 0; i < r->n_sessions; i++) {
      json_object_array_add(list, cli_admin_session_json(r->sessions[i]));
      bound += r->sessions[i]->job_proven;
    }
    json_object_object_add(doc, "job_id", json_object_new_string(job));
    json_object_object_add(doc, "count", json_object_new_uint64(r->n_sessions));
    json_object_object_add(doc, "job_sessions",
                           json_object_new_uint64(job[0] ? bound : 0));
    json_object_object_add(doc, "sessions", list);
    rc = cli_admin_emit(doc, &out, "sessions");
  } else {
    cli_admin_sessions_table(r, job);
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

/* `status`: in service or draining, and the counts, from ListSessions. */
static int cli_admin_status(const char *sock, double timeout, int argc,
                            char **argv) {
  cli_admin_out out = {false, NULL};
  for (int i = 1; i < argc; i++) {
    int f = cli_admin_out_flag("status", argc, argv, &i, &out);
    if (f < 0) return 2;
    if (!f) return cli_admin_bad("status: unexpected '%s'", argv[i]);
  }
  Paradev__V1__ListSessionsResponse *r = NULL;
  if (cli_admin_list(sock, timeout, "", &r)) return 1;
  int rc = 0;
  if (out.json) {
    json_object *doc = cli_admin_state_json(r);
    json_object_object_add(doc, "sessions",
                           json_object_new_uint64(r->n_sessions));
    rc = cli_admin_emit(doc, &out, "status");
  } else {
    char b[32];
    printf(
        "%s: %zu session%s open, %u job token%s live%s; device memory in "
        "use: %s\n",
        r->exiting    ? "draining to exit"
        : r->draining ? "draining"
                      : "in service",
        r->n_sessions, r->n_sessions == 1 ? "" : "s", r->job_tokens,
        r->job_tokens == 1 ? "" : "s",
        r->require_job_token ? " (job ids need a job token)" : "",
        cli_admin_bytes(r->device_memory_used_bytes, b, sizeof b));
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

static int cli_admin_hex(const char *hex, uint8_t *out, size_t cap,
                         size_t *len) {
  size_t n = strlen(hex);
  if (n % 2 || n / 2 > cap) return -1;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (!isxdigit((unsigned char)hex[2 * i]) ||
        !isxdigit((unsigned char)hex[2 * i + 1]) ||
        sscanf(hex + 2 * i, "%2x", &v) != 1)
      return -1;
    out[i] = (uint8_t)v;
  }
  *len = n / 2;
  return 0;
}

static int cli_admin_kill(const char *sock, double timeout, int argc,
                          char **argv) {
  Paradev__V1__KillSessionRequest req;
  paradev__v1__kill_session_request__init(&req);
  uint8_t token[256];
  int targets = 0;
  bool verify = false;
  char what[320] = "";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--verify") == 0) {
      verify = true;
      continue;
    }
    if (strcmp(a, "--job") != 0 && strcmp(a, "--session") != 0 &&
        strcmp(a, "--token") != 0)
      return cli_admin_bad("kill: unexpected '%s'", a);
    const char *v = cli_admin_value(argc, argv, &i);
    if (!v) return cli_admin_bad("kill: %s needs a value", a);
    targets++;
    if (strcmp(a, "--job") == 0) {
      if (!*v) return cli_admin_bad("kill: --job needs a job id");
      req.target_case = PARADEV__V1__KILL_SESSION_REQUEST__TARGET_JOB_ID;
      req.job_id = (char *)v;
      snprintf(what, sizeof what, " of job %.256s", v);
    } else if (strcmp(a, "--session") == 0) {
      /* Digits only: strtoull reads "-1" as 18446744073709551615. */
      char *end = NULL;
      errno = 0;
      unsigned long long n = strtoull(v, &end, 10);
      if (errno || *end || !*v || n == 0 ||
          strspn(v, "0123456789") != strlen(v))
        return cli_admin_bad(
            "kill: --session '%s': expected a session number "
            "(paradev admin sessions lists them)",
            v);
      req.target_case = PARADEV__V1__KILL_SESSION_REQUEST__TARGET_SESSION_ID;
      req.session_id = n;
    } else {
      size_t len = 0;
      if (cli_admin_hex(v, token, sizeof token, &len) != 0 || len == 0)
        return cli_admin_bad("kill: --token '%s': expected the token in hex",
                             v);
      req.target_case = PARADEV__V1__KILL_SESSION_REQUEST__TARGET_SESSION_TOKEN;
      req.session_token.data = token;
      req.session_token.len = len;
    }
  }
  if (targets != 1)
    return cli_admin_bad("kill: name one of --job, --session, --token");
  Paradev__V1__KillSessionResponse *r = NULL;
  if (cli_admin_call(sock, timeout, "KillSession", &req.base,
                     &paradev__v1__kill_session_response__descriptor,
                     (ProtobufCMessage **)&r))
    return 1;
  char b1[32], b2[32];
  printf("killed %u session%s%s: %" PRIu64
         " handles, %s freed; %u session%s "
         "left; device memory in use: %s\n",
         r->sessions_killed, r->sessions_killed == 1 ? "" : "s", what,
         r->handles_freed, cli_admin_bytes(r->bytes_freed, b1, sizeof b1),
         r->sessions_remaining, r->sessions_remaining == 1 ? "" : "s",
         cli_admin_bytes(r->device_memory_used_bytes, b2, sizeof b2));
  int rc = 0;
  if (verify && r->sessions_remaining == 0 && r->device_memory_used_bytes) {
    fprintf(stderr,
            "paradev admin: no session is open but the devices still hold "
            "%" PRIu64 " bytes: memory was not given back\n",
            r->device_memory_used_bytes);
    rc = 3;
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

static int cli_admin_drain(const char *sock, double timeout, int argc,
                           char **argv) {
  Paradev__V1__DrainRequest req;
  paradev__v1__drain_request__init(&req);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--exit") == 0)
      req.exit_when_drained = true;
    else if (strcmp(argv[i], "--resume") == 0)
      req.resume = true;
    else
      return cli_admin_bad("drain: unexpected '%s'", argv[i]);
  }
  Paradev__V1__DrainResponse *r = NULL;
  if (cli_admin_call(sock, timeout, "Drain", &req.base,
                     &paradev__v1__drain_response__descriptor,
                     (ProtobufCMessage **)&r))
    return 1;
  printf("%s%s: %u session%s open, %" PRIu64 " ops queued or running\n",
         r->draining ? "draining" : "in service",
         r->exiting ? " (exits when the queued work is done)" : "", r->sessions,
         r->sessions == 1 ? "" : "s", r->ops_outstanding);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return 0;
}

static int cli_admin_log(const char *sock, double timeout, int argc,
                         char **argv) {
  if (argc != 2)
    return cli_admin_bad(
        "log-level needs one SPEC, such as debug or "
        "info,sched=debug");
  Paradev__V1__SetLogLevelRequest req;
  paradev__v1__set_log_level_request__init(&req);
  req.spec = argv[1];
  Paradev__V1__SetLogLevelResponse *r = NULL;
  if (cli_admin_call(sock, timeout, "SetLogLevel", &req.base,
                     &paradev__v1__set_log_level_response__descriptor,
                     (ProtobufCMessage **)&r))
    return 1;
  printf("log levels: %s (were %s)\n", r->current, r->previous);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return 0;
}

/* The member of `r` that option a[0..nlen) sets, or NULL. */
static const char **cli_admin_remote_flag(cli_admin_remote *r, const char *a,
                                          size_t nlen) {
  static const char *const names[] = {"--target",          "--tls-ca",
                                      "--tls-cert",        "--tls-key",
                                      "--tls-server-name", "--token-file"};
  const char **members[] = {&r->target,  &r->tls_ca,          &r->tls_cert,
                            &r->tls_key, &r->tls_server_name, &r->token_file};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
    if (strlen(names[k]) == nlen && strncmp(a, names[k], nlen) == 0)
      return members[k];
  return NULL;
}

/* argv[0] is "admin". */
int cli_admin(int argc, char **argv) {
  char sock[4096];
  cli_admin_default_socket(sock, sizeof(sock));
  double timeout = 60;
  cli_admin_remote remote = {NULL};
  const char *remote_flag = NULL; /* a TLS or token option given */
  bool socket_given = false;
  int i = 1;
  for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0) {
      fputs(cli_admin_usage, stdout);
      return 0;
    }
    const char *eq = strchr(a, '=');
    size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
    bool is_socket = nlen == 8 && strncmp(a, "--socket", 8) == 0;
    bool is_timeout = nlen == 9 && strncmp(a, "--timeout", 9) == 0;
    const char **remote_opt = cli_admin_remote_flag(&remote, a, nlen);
    if (!is_socket && !is_timeout && !remote_opt)
      return cli_admin_bad("unknown option '%s'", a);
    if (!v || (!eq && strncmp(v, "--", 2) == 0))
      return cli_admin_bad("%.*s needs a value", (int)nlen, a);
    if (!eq) i++;
    if (remote_opt) {
      *remote_opt = v;
      if (remote_opt != &remote.target) remote_flag = a;
    } else if (is_socket) {
      socket_given = true;
      if (!*v || strlen(v) >= sizeof(sock))
        return cli_admin_bad("--socket '%s': expected a path", v);
      snprintf(sock, sizeof(sock), "%s", v);
    } else {
      int64_t ms;
      if (!cli_parse_duration_ms(v, &ms))
        return cli_admin_bad("--timeout '%s': " CLI_TIMEOUT_EXPECTED, v);
      timeout = (double)ms / 1000;
    }
  }
  if (i >= argc) {
    fputs(cli_admin_usage, stderr);
    return 2;
  }
  if (remote.target && socket_given)
    return cli_admin_bad("--target and --socket: give one of the two");
  if (!remote.target && remote_flag)
    return cli_admin_bad(
        "%s needs --target HOST:PORT: the admin socket is local and "
        "plaintext (its group decides who may use it); a remote "
        "operator's certificate or token goes to a client listener",
        remote_flag);
  if (remote.target) {
    int rc = cli_admin_set_remote(&remote);
    if (rc) return rc;
  }
  const char *cmd = argv[i];
  int sub_argc = argc - i;
  char **sub_argv = argv + i;
  int (*fn)(const char *, double, int, char **) = NULL;
  if (strcmp(cmd, "sessions") == 0)
    fn = cli_admin_sessions;
  else if (strcmp(cmd, "status") == 0)
    fn = cli_admin_status;
  else if (strcmp(cmd, "job-token") == 0)
    fn = cli_admin_job_token;
  else if (strcmp(cmd, "kill-job") == 0)
    fn = cli_admin_kill_job;
  else if (strcmp(cmd, "kill") == 0)
    fn = cli_admin_kill;
  else if (strcmp(cmd, "drain") == 0)
    fn = cli_admin_drain;
  else if (strcmp(cmd, "log-level") == 0)
    fn = cli_admin_log;
  else
    return cli_admin_bad(
        "unknown command '%s' (status, sessions, kill, job-token, "
        "kill-job, drain, log-level)",
        cmd);
  /* A socket in /tmp/paradevd-UID is paradevd's only when that directory
   * is ours alone (see cli_private_dir_ok); one that does not exist is
   * reported by the call. */
  char dir[64];
  struct stat sb;
  cli_tmp_socket_dir(dir, sizeof(dir));
  size_t dl = strlen(dir);
  if (!remote.target && strncmp(sock, dir, dl) == 0 && sock[dl] == '/' &&
      lstat(dir, &sb) == 0 && !cli_private_dir_ok(dir)) {
    fprintf(stderr,
            "paradev admin: %s is not a directory of yours that only you may "
            "enter (owner uid %u, mode %04o; expected uid %u, mode 0700), so "
            "%s may not be paradevd's; remove the directory or pass --socket\n",
            dir, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777),
            (unsigned)getuid(), sock);
    return 1;
  }
  grpc_init();
  int rc = fn(sock, timeout, sub_argc, sub_argv);
  grpc_shutdown();
  return rc;
}
