/* `paradev admin`: the operators' commands, spoken to paradevd's admin Unix
 * socket (service paradev.v1.Admin, proto/paradev/v1/admin.proto). The
 * socket's file mode decides who may run them (paradevd creates it 0660).
 *
 *   paradev admin [--socket PATH] [--timeout TIME] COMMAND
 *     sessions [--job ID] [--json]    the open sessions, oldest first
 *     kill (--job ID | --session N | --token HEX) [--verify]
 *                                     end sessions; answers once the devices
 *                                     have freed their memory. --verify: exit
 *                                     3 when no session is left but device
 *                                     memory is still in use
 *     drain [--exit | --resume]       stop taking sessions (and exit once the
 *                                     queued work is done), or take them again
 *     log-level SPEC                  e.g. debug, or info,sched=debug
 *
 * The socket: --socket, else $PARADEV_ADMIN_SOCKET, else paradevd's default
 * (/run/paradev/admin.sock under systemd, $XDG_RUNTIME_DIR/paradevd-admin.sock
 * otherwise, /tmp/paradevd-UID/paradevd-admin.sock without a runtime
 * directory). --timeout takes a unit (500ms, 2s, 1m), as the top level's;
 * a bare number is refused.
 *
 * Exit status: 0 done, 1 the daemon said no (its message is printed), 2 a
 * bad command line, 3 --verify found memory still in use.
 *
 * This file speaks gRPC itself (C core, one blocking call per command):
 * libparadev exports the pd_* API only, and Admin is not part of it. */
#include <ctype.h>
#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_int.h"
#include "paradev/v1/admin.pb-c.h"

int cli_admin(int argc, char **argv);

static const char cli_admin_usage[] =
    "Usage: paradev admin [--socket PATH] [--timeout TIME] COMMAND\n"
    "Operate a paradevd through its admin socket.\n"
    "\n"
    "Commands:\n"
    "  sessions [--job ID] [--json]   list the open sessions (--json: one\n"
    "                                 document, {\"count\": N, ...,\n"
    "                                 \"sessions\": [...]})\n"
    "  kill --job ID | --session N | --token HEX [--verify]\n"
    "                                 end sessions and free their memory;\n"
    "                                 --verify: exit 3 if no session is left\n"
    "                                 but device memory is still in use\n"
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
    "  (paradev's --target is not for these: a note on stderr says so, and\n"
    "  'admin --target' is refused; use --socket PATH)\n"
    "\n"
    "Exit status: 0 done; 1 the daemon said no or could not be reached (its\n"
    "message is printed); 2 a bad command line; 3 kill --verify found device\n"
    "memory still in use.\n";

static int cli_admin_bad(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static int cli_admin_bad(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "paradev admin: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nTry 'paradev admin --help'.\n");
  va_end(ap);
  return 2;
}

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

/* One unary Admin call: its channel, queue and call, the messages, and
 * what comes back. */
typedef struct cli_admin_rpc {
  grpc_channel *ch;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_byte_buffer *send, *recv;
  grpc_metadata_array md_initial, md_trailing;
  grpc_status_code status;
  grpc_slice details;
} cli_admin_rpc;

/* The channel to the admin socket and the call to "/paradev.v1.Admin/METHOD"
 * (the service's name from its descriptor), with the request packed. */
static void cli_admin_open(cli_admin_rpc *r, const char *socket_path,
                           double timeout_s, const char *method,
                           const ProtobufCMessage *req) {
  char target[4200];
  snprintf(target, sizeof(target), "unix:%s", socket_path);
  char path[256];
  snprintf(path, sizeof(path), "/%s/%s", paradev__v1__admin__descriptor.name,
           method);
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  r->ch = grpc_channel_create(target, creds, NULL);
  grpc_channel_credentials_release(creds);
  r->cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice mslice = grpc_slice_from_copied_string(path);
  gpr_timespec deadline = gpr_time_add(
      gpr_now(GPR_CLOCK_REALTIME),
      gpr_time_from_millis((int64_t)(timeout_s * 1000 + 0.5), GPR_TIMESPAN));
  r->call = grpc_channel_create_call(r->ch, NULL, GRPC_PROPAGATE_DEFAULTS,
                                     r->cq, mslice, NULL, deadline, NULL);
  grpc_slice_unref(mslice);
  size_t len = protobuf_c_message_get_packed_size(req);
  grpc_slice out = grpc_slice_malloc(len);
  protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(out));
  r->send = grpc_raw_byte_buffer_create(&out, 1);
  grpc_slice_unref(out);
  grpc_metadata_array_init(&r->md_initial);
  grpc_metadata_array_init(&r->md_trailing);
  r->status = GRPC_STATUS_UNKNOWN;
  r->details = grpc_empty_slice();
}

/* The whole call as one batch, waited for; false if it could not start. */
static bool cli_admin_run(cli_admin_rpc *r) {
  grpc_op ops[6];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = r->send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &r->md_initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &r->recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &r->md_trailing;
  ops[5].data.recv_status_on_client.status = &r->status;
  ops[5].data.recv_status_on_client.status_details = &r->details;
  int tag = 0;
  if (grpc_call_start_batch(r->call, ops, 6, &tag, NULL) != GRPC_CALL_OK)
    return false;
  grpc_completion_queue_pluck(r->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME),
                              NULL);
  return true;
}

/* The status, then the reply decoded into *resp: 0, or 1 (printed). */
static int cli_admin_reply(const cli_admin_rpc *r, const char *socket_path,
                           const char *method,
                           const ProtobufCMessageDescriptor *resp_desc,
                           ProtobufCMessage **resp) {
  if (r->status != GRPC_STATUS_OK) {
    size_t dl = GRPC_SLICE_LENGTH(r->details);
    fprintf(stderr, "paradev admin: %s: %.*s (status %d)\n", method, (int)dl,
            (const char *)GRPC_SLICE_START_PTR(r->details), (int)r->status);
    if (r->status == GRPC_STATUS_UNAVAILABLE)
      fprintf(stderr,
              "paradev admin: is paradevd running, and is %s its admin "
              "socket? (--socket, $PARADEV_ADMIN_SOCKET)\n",
              socket_path);
    return 1;
  }
  if (!r->recv) {
    fprintf(stderr, "paradev admin: %s: the reply carried no message\n",
            method);
    return 1;
  }
  grpc_byte_buffer_reader rd;
  if (grpc_byte_buffer_reader_init(&rd, r->recv)) {
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    *resp = protobuf_c_message_unpack(resp_desc, NULL, GRPC_SLICE_LENGTH(all),
                                      GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
  }
  if (*resp) return 0;
  fprintf(stderr, "paradev admin: %s: the reply does not decode\n", method);
  return 1;
}

/* Undoes cli_admin_open, the queue drained before it is destroyed. */
static void cli_admin_close(cli_admin_rpc *r) {
  if (r->recv) grpc_byte_buffer_destroy(r->recv);
  grpc_byte_buffer_destroy(r->send);
  grpc_slice_unref(r->details);
  grpc_metadata_array_destroy(&r->md_initial);
  grpc_metadata_array_destroy(&r->md_trailing);
  grpc_call_unref(r->call);
  grpc_completion_queue_shutdown(r->cq);
  while (grpc_completion_queue_pluck(r->cq, NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(r->cq);
  grpc_channel_destroy(r->ch);
}

/* One unary call. On success *resp is set (free with
 * protobuf_c_message_free_unpacked(resp, NULL)) and 0 returned; else the
 * error was printed and 1 returned. */
static int cli_admin_call(const char *socket_path, double timeout_s,
                          const char *method, const ProtobufCMessage *req,
                          const ProtobufCMessageDescriptor *resp_desc,
                          ProtobufCMessage **resp) {
  cli_admin_rpc r = {NULL};
  cli_admin_open(&r, socket_path, timeout_s, method, req);
  int rc = 1;
  if (!cli_admin_run(&r))
    fprintf(stderr, "paradev admin: internal: cannot start the call\n");
  else
    rc = cli_admin_reply(&r, socket_path, method, resp_desc, resp);
  cli_admin_close(&r);
  return rc;
}

/* 1536 -> "1.5 KiB". */
static const char *cli_admin_bytes(uint64_t b, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%" PRIu64 " B", b);
  else
    snprintf(buf, len, "%.1f %s", v, units[u]);
  return buf;
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

/* A table cell of `width` characters: the text cut to that many characters
 * (the daemon sends valid UTF-8; a character is never cut in two), then
 * padded with spaces. Counts characters, not display columns. */
static void cli_admin_cell(const char *s, int width) {
  int n = 0;
  const char *p = s;
  while (*p) {
    const char *q = p + 1;
    while ((*q & 0xC0) == 0x80) q++; /* continuation bytes */
    if (n == width) break;
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      putchar('?'); /* a terminal's control: not from this daemon */
    else
      fwrite(p, 1, (size_t)(q - p), stdout);
    n++;
    p = q;
  }
  printf("%*s", width - n, "");
}

/* The value of the flag at argv[*i], "--flag VALUE" (*i moves past it) or
 * "--flag=VALUE"; NULL when there is none: the flag is last, its value is
 * empty, or what follows is another flag ("--job --json"). */
static const char *cli_admin_value(int argc, char **argv, int *i) {
  const char *eq = strchr(argv[*i], '=');
  const char *v = eq ? eq + 1 : (*i + 1 < argc ? argv[*i + 1] : NULL);
  if (!v || !*v || (!eq && strncmp(v, "--", 2) == 0)) return NULL;
  if (!eq) (*i)++;
  return v;
}

static int cli_admin_sessions(const char *sock, double timeout, int argc,
                              char **argv) {
  const char *job = "";
  bool json = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--job") == 0 || strncmp(argv[i], "--job=", 6) == 0) {
      if (!(job = cli_admin_value(argc, argv, &i)))
        return cli_admin_bad("sessions: --job needs a value (a job id)");
    } else if (strcmp(argv[i], "--json") == 0) {
      json = true;
    } else {
      return cli_admin_bad("sessions: unexpected '%s'", argv[i]);
    }
  }
  Paradev__V1__ListSessionsRequest req;
  paradev__v1__list_sessions_request__init(&req);
  req.job_id = (char *)job;
  Paradev__V1__ListSessionsResponse *r = NULL;
  if (cli_admin_call(sock, timeout, "ListSessions", &req.base,
                     &paradev__v1__list_sessions_response__descriptor,
                     (ProtobufCMessage **)&r))
    return 1;
  char b1[32], b2[32], b3[32], b4[32];
  if (json) {
    /* One document: the summary the table's last line gives, then the list
     * (an empty list when there are none). The incarnation is a string: a
     * 64-bit number does not survive JSON readers that use doubles. */
    char inc[20], sec[2][32];
    snprintf(inc, sizeof inc, "%016" PRIx64, r->incarnation);
    json_object *doc = json_object_new_object(),
                *list = json_object_new_array();
    json_object_object_add(doc, "incarnation", json_object_new_string(inc));
    json_object_object_add(doc, "job_id", json_object_new_string(job));
    json_object_object_add(doc, "count", json_object_new_uint64(r->n_sessions));
    json_object_object_add(doc, "draining",
                           json_object_new_boolean(r->draining));
    json_object_object_add(doc, "device_memory_used_bytes",
                           json_object_new_uint64(r->device_memory_used_bytes));
    for (size_t i = 0; i < r->n_sessions; i++) {
      const Paradev__V1__SessionSummary *e = r->sessions[i];
      json_object *o = json_object_new_object();
      snprintf(sec[0], sizeof sec[0], "%.3f", e->age_seconds);
      snprintf(sec[1], sizeof sec[1], "%.3f", e->idle_seconds);
      json_object_object_add(o, "session_id",
                             json_object_new_uint64(e->session_id));
      json_object_object_add(o, "client_name",
                             json_object_new_string(e->client_name));
      json_object_object_add(o, "job_id", json_object_new_string(e->job_id));
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
      json_object_array_add(list, o);
    }
    json_object_object_add(doc, "sessions", list);
    /* Spaced ("count": 0, as deploy/slurm/epilog.sh matches) and one
     * member per line; UTF-8 as the daemon sent it. */
    puts(json_object_to_json_string_ext(
        doc, JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_PRETTY |
                 JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(doc);
  } else {
    printf("%-6s %-20s %-12s %11s %8s %7s %8s %7s %6s %11s\n", "ID", "CLIENT",
           "JOB", "MEMORY", "HANDLES", "QUEUED", "AGE", "IDLE", "LEASE",
           "QUOTA");
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
      printf(" %11s %8" PRIu64 " %7" PRIu64 " %8s %7s %5us %11s\n",
             cli_admin_bytes(e->memory_bytes, b1, sizeof b1), e->handles,
             e->queued_ops, cli_admin_dur(e->age_seconds, b2, sizeof b2),
             cli_admin_dur(e->idle_seconds, b3, sizeof b3), e->lease_seconds,
             quota);
    }
    printf("(%zu session%s%s; device memory in use: %s%s)\n", r->n_sessions,
           r->n_sessions == 1 ? "" : "s", job[0] ? " of that job" : "",
           cli_admin_bytes(r->device_memory_used_bytes, b4, sizeof b4),
           r->draining ? "; DRAINING" : "");
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return 0;
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

/* argv[0] is "admin". */
int cli_admin(int argc, char **argv) {
  char sock[4096];
  cli_admin_default_socket(sock, sizeof(sock));
  double timeout = 60;
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
    if (nlen == 8 && strncmp(a, "--target", 8) == 0)
      return cli_admin_bad(
          "unknown option '--target': admin commands talk to the admin "
          "socket; use --socket PATH");
    if (!is_socket && !is_timeout)
      return cli_admin_bad("unknown option '%s'", a);
    if (!v || (!eq && strncmp(v, "--", 2) == 0))
      return cli_admin_bad("%.*s needs a value", (int)nlen, a);
    if (!eq) i++;
    if (is_socket) {
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
  const char *cmd = argv[i];
  int sub_argc = argc - i;
  char **sub_argv = argv + i;
  int (*fn)(const char *, double, int, char **) = NULL;
  if (strcmp(cmd, "sessions") == 0)
    fn = cli_admin_sessions;
  else if (strcmp(cmd, "kill") == 0)
    fn = cli_admin_kill;
  else if (strcmp(cmd, "drain") == 0)
    fn = cli_admin_drain;
  else if (strcmp(cmd, "log-level") == 0)
    fn = cli_admin_log;
  else
    return cli_admin_bad(
        "unknown command '%s' (sessions, kill, drain, "
        "log-level)",
        cmd);
  /* A socket in /tmp/paradevd-UID is paradevd's only when that directory
   * is ours alone (see cli_private_dir_ok); one that does not exist is
   * reported by the call. */
  char dir[64];
  struct stat sb;
  cli_tmp_socket_dir(dir, sizeof(dir));
  size_t dl = strlen(dir);
  if (strncmp(sock, dir, dl) == 0 && sock[dl] == '/' && lstat(dir, &sb) == 0 &&
      !cli_private_dir_ok(dir)) {
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
