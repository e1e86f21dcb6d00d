/* paradev: the command-line client. `info` shows the daemon (version,
 * backend, devices and their memory, limits), `health` runs the standard gRPC
 * health check, `ping` measures Echo round trips; `load` and `save` are
 * cli_checkpoint.c's. Uses libparadev's public API
 * only. Exit status: 0 success, 1 a failed call (or a health status other than
 * SERVING), 2 a bad command line (a bad --target included), 3 `admin kill
 * --verify` found memory still in use; the usage text says the same. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli_int.h"
#include "cli_ops.h"
#include "cli_cmd.h"
#include "common.h"
#include "paradev/paradev.h"

static const char cli_usage[] =
    "Usage: paradev [--target ADDR] [--timeout TIME] COMMAND [OPTIONS]\n"
    "Talk to a paradevd daemon (a machine's devices as one parallel device).\n"
    "\n"
    "Commands:\n"
    "  info     the daemon: version, backend, devices and their memory, "
    "limits\n"
    "  health   the standard gRPC health check; exit 0 only when SERVING\n"
    "  ping     Echo round trips and their latency percentiles\n"
    "  ops      the op reference: every op, or 'ops NAME' in full\n"
    "  load     load a checkpoint on the daemon (safetensors, .npy, .npz)\n"
    "           and show its tensors; 'paradev load --help'\n"
    "  save     load a checkpoint and save it again through the daemon\n"
    "           (convert or copy it); 'paradev save --help'\n"
    "  function check FILE.json [--describe]  register a graph function\n"
    "           (FunctionDef JSON) in a new session: \"ok\" or the error\n"
#ifdef PARADEV_CLI_ADMIN
    "  admin    operators' commands on the admin socket (sessions, kill,\n"
    "           drain, log-level); 'paradev admin --help'\n"
#endif
    "\n"
    "Options:\n"
    "  --target ADDR   unix:/path (at most 107 bytes), host:port or\n"
    "                  [v6]:port (port 1..65535); a path that\n"
    "                  starts with / or ./ is a Unix socket too, and a host\n"
    "                  without a port gets paradevd's 7478 (a bare IPv6\n"
    "                  address too: ::1 is [::1]:7478). Default:\n"
    "                  $PARADEV_TARGET, else the first of\n"
    "                  unix:$XDG_RUNTIME_DIR/paradevd.sock and\n"
    "                  unix:/tmp/paradevd-UID/paradevd.sock (a directory of\n"
    "                  yours, mode 0700) that exists, else 127.0.0.1:7478\n"
    "                  (paradevd's defaults). admin commands do not use it\n"
    "                  (a note on stderr says so): 'admin --socket PATH',\n"
    "                  or 'admin --target ADDR' for a remote operator\n"
    "  --timeout TIME  deadline of each call, 1ms to 24h: 500ms, 2s, 1m, 1h;\n"
    "                  a number needs a unit (default 10s)\n"
    "  --tls-ca FILE   PEM CAs that sign the daemon's certificate; turns TLS\n"
    "                  on for a TCP target (so does tls://host:port).\n"
    "                  Default: $PARADEV_TLS_CA\n"
    "  --tls-cert FILE, --tls-key FILE  client certificate and key (mutual\n"
    "                  TLS). Default: $PARADEV_TLS_CERT, $PARADEV_TLS_KEY\n"
    "  --tls-server-name NAME  the name the daemon's certificate must hold\n"
    "                  (default: $PARADEV_TLS_SERVER_NAME, else the host)\n"
    "  --token-file FILE  a bearer token (its first line), sent on every\n"
    "                  call. Default: $PARADEV_TOKEN, $PARADEV_TOKEN_FILE\n"
    "  --help          this text; 'paradev COMMAND --help' for a command\n"
    "  --version       print the version\n"
    "\n"
    "Exit status: 0 success; 1 a failed call (the daemon unreachable or\n"
    "refusing; for health, a status other than SERVING); 2 a bad command\n"
    "line, a bad --target included; 3 'admin kill --verify' found device\n"
    "memory still in use.\n";

static const char cli_ops_usage[] =
    "Usage: paradev [--target ADDR] ops [NAME] [--markdown]\n"
    "The daemon's op reference (ListOps): without NAME a table of every op\n"
    "(name, inputs -> outputs, summary); with NAME that op in full (inputs\n"
    "and their dtypes, outputs, attributes with kind, default and range,\n"
    "gradient, notes on how it differs from tf.raw_ops). --markdown prints\n"
    "Markdown (docs/ops.md is the same, made without a daemon).\n";

static const char cli_info_usage[] =
    "Usage: paradev [--target ADDR] info\n"
    "Show the daemon's version, incarnation, backend and start time, every\n"
    "device of its mesh (its index and name, which --devices options take,\n"
    "and the physical GPU it runs on, as Slurm's SLURM_JOB_GPUS numbers\n"
    "them; '-' for none) with memory total/limit/used/free/peak, the "
    "limits\n"
    "it puts on clients and its storage roots (GetServerInfo); on a mesh\n"
    "across machines, a mesh: block (world size, this rank, coordinator,\n"
    "epoch, formed or degraded, the missing ranks and why, every rank).\n";

static const char cli_health_usage[] =
    "Usage: paradev [--target ADDR] health [--service NAME]\n"
    "Run grpc.health.v1.Health/Check and print the serving status; after\n"
    "NOT_SERVING, why, when the daemon says (a mesh across machines that is\n"
    "not whole: GetServerInfo.mesh.reason).\n"
    "  --service NAME  \"\" (default: the whole server) or\n"
    "                  paradev.v1.ParallelDevice\n"
    "Exit status: 0 only when SERVING; 1 otherwise (or when unreachable, or\n"
    "for a service the daemon does not know); 2 a bad command line.\n";

static const char cli_ping_usage[] =
    "Usage: paradev [--target ADDR] ping [--count N] [--size BYTES] [--quiet]\n"
    "Send N Echo calls of BYTES payload one after another and print each\n"
    "round trip, then the latency percentiles p50/p90/p99 and the maximum.\n"
    "  --count N       round trips (default 10, 1..1000000)\n"
    "  --size BYTES    payload bytes (default 64; K/M suffixes allowed)\n"
    "  --quiet         only the summary\n";

#ifdef PARADEV_CLI_ADMIN
/* cli_admin.c: `paradev admin ...`; argv[0] is "admin". */
int cli_admin(int argc, char **argv);

/* `paradev --target ADDR admin ...`: admin talks to the admin socket, never
 * to ADDR (a client's $PARADEV_TARGET must not redirect an operator's
 * command), so say so on stderr (one line) and go on; a remote operator
 * says `paradev admin --target ADDR`. */
static int cli_admin_with_target(const char *target, int argc, char **argv) {
  if (target)
    fprintf(stderr,
            "paradev: note: --target %s is not used by admin commands; they "
            "talk to the admin socket: 'paradev admin --socket PATH' (a "
            "remote operator: 'paradev admin --target ADDR')\n",
            target);
  return cli_admin(argc, argv);
}
#endif

/* $PARADEV_TARGET (*from_env set), else paradevd's default Unix socket: in
 * $XDG_RUNTIME_DIR, else in /tmp/paradevd-UID/ when that is the user's
 * private directory (cli_private_dir_ok). */
static const char *cli_default_target(char *buf, size_t len, bool *from_env) {
  const char *env = getenv("PARADEV_TARGET");
  *from_env = env && *env;
  if (*from_env) return env;
  const char *rt = getenv("XDG_RUNTIME_DIR");
  char path[400];
  struct stat sb;
  if (rt && *rt) {
    snprintf(path, sizeof(path), "%s/paradevd.sock", rt);
    if (stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode)) {
      snprintf(buf, len, "unix:%s", path);
      return buf;
    }
  }
  cli_tmp_socket_dir(path, sizeof(path));
  if (cli_private_dir_ok(path)) {
    snprintf(path + strlen(path), sizeof(path) - strlen(path),
             "/paradevd.sock");
    if (stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode)) {
      snprintf(buf, len, "unix:%s", path);
      return buf;
    }
  }
  return "127.0.0.1:7478";
}

/* --- info ----------------------------------------------------------------------- */

/* The storage roots that `paradev load` and `save` may use. */
static void cli_info_storage(const pd_server_info *info) {
  int n = pd_server_info_num_storage_roots(info);
  printf("storage roots:%s\n", n ? "" : " none (checkpoints refused)");
  for (int i = 0; i < n; i++)
    printf("  %s\n", pd_server_info_storage_root(info, i));
}

/* The mesh across machines this daemon is a rank of (issue #16), when it
 * is on one: world size, this rank, epoch, whether formed or degraded, the
 * missing ranks and why, and the coordinator's view of every rank. */
static void cli_info_mesh(const pd_server_info *info) {
  if (!pd_server_info_has_mesh(info)) return;
  int w = pd_server_info_mesh_world_size(info);
  int rank = pd_server_info_mesh_rank(info);
  int formed = pd_server_info_mesh_formed(info);
  int degraded = pd_server_info_mesh_degraded(info);
  printf("mesh:\n");
  printf("  world size   %d (%d devices per rank)\n", w,
         pd_server_info_mesh_devices_per_rank(info));
  printf("  this rank    %d%s\n", rank,
         rank == 0 ? " (the coordinator: clients use this daemon)"
                   : " (clients connect to the coordinator, rank 0)");
  printf("  coordinator  %s\n", pd_server_info_mesh_coordinator(info));
  printf("  epoch        %" PRIu64 "\n", pd_server_info_mesh_epoch(info));
  printf("  state        %s\n",
         degraded ? "degraded (a rank was lost)"
         : formed ? "formed (every rank attached)"
                  : "not formed (waiting for ranks to attach)");
  int nm = pd_server_info_mesh_num_missing_ranks(info);
  if (nm > 0) {
    printf("  missing      ");
    for (int i = 0; i < nm; i++)
      printf("%s%d", i ? ", " : "rank ",
             pd_server_info_mesh_missing_rank(info, i));
    printf("\n");
  }
  const char *why = pd_server_info_mesh_reason(info);
  if (why[0]) printf("  reason       %s\n", why);
  int nr = pd_server_info_mesh_num_ranks(info);
  if (nr > 0)
    printf("  %-5s %-8s %-16s %-32s %s\n", "RANK", "STATE", "INCARNATION",
           "HOST", "LAST SEEN");
  for (int i = 0; i < nr; i++) {
    const pd_mesh_rank_info *r = pd_server_info_mesh_rank_info(info, i);
    char seen[32] = "-";
    if (r->rank != 0 && r->incarnation)
      snprintf(seen, sizeof seen, "%.1f s ago",
               (double)r->last_seen_ms_ago / 1000.0);
    char inc[20] = "-";
    if (r->incarnation)
      snprintf(inc, sizeof inc, "%016" PRIx64, r->incarnation);
    printf("  %-5d %-8s %-16s %-32s %s\n", r->rank,
           r->attached ? "attached" : "missing", inc,
           r->host[0] ? r->host : "-", seen);
  }
}

static int cli_info(const cli_opts *o, int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(cli_info_usage, stdout);
      return 0;
    }
    return cli_usage_error("info", "unknown argument '%s'", argv[i]);
  }
  pd_status *st = pd_status_new();
  int rc = 0;
  pd_client *c = cli_connect(o, "info", st, &rc);
  if (!c) {
    pd_status_delete(st);
    return rc;
  }
  pd_server_info *info = pd_client_get_server_info(c, NULL, st);
  if (!info) {
    rc = cli_fail("info", st);
    goto out;
  }
  char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
  printf("paradevd %s at %s\n", pd_server_info_version(info), o->target);
  printf("  incarnation  %016" PRIx64 "\n", pd_server_info_incarnation(info));
  printf("  backend      %s\n", pd_server_info_backend(info));
  printf("  transport    %s%s\n", pd_client_tls(c) ? "TLS" : "plaintext",
         pd_server_info_client_cert_required(info)
             ? " (the daemon requires client certificates)"
             : "");
  for (int i = 0; i < pd_server_info_num_warnings(info); i++)
    printf("  warning      %s\n", pd_server_info_warning(info, i));
  int64_t start_ms = pd_server_info_start_time_ms(info);
  if (start_ms > 0) {
    time_t t = (time_t)(start_ms / 1000);
    struct tm tm;
    char when[64];
    gmtime_r(&t, &tm);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
    int64_t up = (int64_t)time(NULL) - (int64_t)t;
    if (up < 0) up = 0;
    printf("  started      %s (up %" PRId64 "h %02" PRId64 "m %02" PRId64
           "s)\n",
           when, up / 3600, up / 60 % 60, up % 60);
  }
  int n = pd_server_info_num_devices(info);
  printf("devices: %d\n", n);
  printf("  %-3s %-28s %-5s %-4s %10s %10s %10s %10s %10s %10s\n", "#", "NAME",
         "KIND", "GPU", "TOTAL", "LIMIT", "USED", "FREE", "PEAK", "CACHED");
  for (int i = 0; i < n; i++) {
    const pd_device_info *d = pd_server_info_device(info, i);
    char gpu[16] = "-";
    if (d->gpu >= 0) snprintf(gpu, sizeof(gpu), "%d", d->gpu);
    printf(
        "  %-3d %-28s %-5s %-4s %10s %10s %10s %10s %10s %10s\n", d->index,
        d->name, d->kind, gpu,
        d->memory_total_bytes ? cli_size(d->memory_total_bytes, b1, sizeof b1)
                              : "-",
        d->memory_limit_bytes ? cli_size(d->memory_limit_bytes, b2, sizeof b2)
                              : "-",
        cli_size(d->memory_used_bytes, b3, sizeof b3),
        d->memory_total_bytes || d->memory_limit_bytes
            ? cli_size(d->memory_free_bytes, b4, sizeof b4)
            : "-",
        cli_size(d->memory_peak_bytes, b5, sizeof b5),
        cli_size(d->memory_cached_bytes, b6, sizeof b6));
  }
  const pd_limits *l = pd_server_info_limits(info);
  printf("limits:\n");
  printf("  max_message_bytes        %" PRIu64 " (%s)\n", l->max_message_bytes,
         cli_size(l->max_message_bytes, b1, sizeof b1));
  printf("  max_tensor_bytes         %" PRIu64 " (%s)\n", l->max_tensor_bytes,
         cli_size(l->max_tensor_bytes, b1, sizeof b1));
  printf("  max_chunk_bytes          %" PRIu64 "\n", l->max_chunk_bytes);
  printf("  max_rank                 %d\n", l->max_rank);
  printf("  max_ops_per_request      %d\n", l->max_ops_per_request);
  printf("  max_inputs_per_op        %d\n", l->max_inputs_per_op);
  printf("  max_attrs_per_op         %d\n", l->max_attrs_per_op);
  printf("  max_list_length          %d\n", l->max_list_length);
  printf("  max_string_bytes         %d\n", l->max_string_bytes);
  printf("  max_ids_per_request      %d\n", l->max_ids_per_request);
  printf("  max_handles_per_session  %d\n", l->max_handles_per_session);
  printf("  max_sessions             %d\n", l->max_sessions);
  printf("  lease_seconds            %u default, %u max\n",
         l->default_lease_seconds, l->max_lease_seconds);
  cli_info_storage(info);
  cli_info_mesh(info);
  pd_server_info_delete(info);
out:
  pd_client_delete(c);
  pd_status_delete(st);
  return rc;
}

/* --- health --------------------------------------------------------------------- */

/* Why the daemon is NOT_SERVING, when it says so: on a mesh across
 * machines that is not whole (issue #16), GetServerInfo.mesh.reason
 * ("degraded: rank 1 missing (...)"). The health reply has no reason
 * field; liveness ("paradev.liveness") does not follow the mesh, so none
 * for it. `out` is "" when there is nothing to say. */
static void cli_health_reason(pd_client *c, const char *service, char *out,
                              size_t cap) {
  out[0] = '\0';
  if (strcmp(service, "paradev.liveness") == 0) return;
  pd_status *st = pd_status_new();
  pd_server_info *info = st ? pd_client_get_server_info(c, NULL, st) : NULL;
  if (info && pd_server_info_has_mesh(info) &&
      (!pd_server_info_mesh_formed(info) ||
       pd_server_info_mesh_degraded(info)) &&
      pd_server_info_mesh_reason(info)[0])
    snprintf(out, cap, "the mesh is not whole (%s)",
             pd_server_info_mesh_reason(info));
  pd_server_info_delete(info);
  pd_status_delete(st);
}

static int cli_health(const cli_opts *o, int argc, char **argv) {
  const char *service = "";
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(cli_health_usage, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--service") == 0) {
      if (i + 1 >= argc)
        return cli_usage_error("health", "%s needs a value", argv[i]);
      service = argv[++i];
    } else if (strncmp(argv[i], "--service=", 10) == 0) {
      service = argv[i] + 10;
    } else {
      return cli_usage_error("health", "unknown argument '%s'", argv[i]);
    }
  }
  pd_status *st = pd_status_new();
  int rc = 0;
  pd_client *c = cli_connect(o, "health", st, &rc);
  if (!c) {
    pd_status_delete(st);
    return rc;
  }
  pd_serving_status s = PD_SERVING_UNKNOWN;
  if (pd_client_health(c, service, &s, NULL, st) != PD_OK) {
    /* NOT_FOUND here is the health protocol's unknown service, not a
     * session's: the daemon's message lists the services it has. */
    rc = cli_fail_hint("health", st,
                       pd_status_code(st) == PD_NOT_FOUND
                           ? "no such service; use one the message lists"
                           : NULL);
  } else {
    static const char *const names[] = {"UNKNOWN", "SERVING", "NOT_SERVING",
                                        "SERVICE_UNKNOWN"};
    char why[1024] = "";
    if (s == PD_NOT_SERVING) cli_health_reason(c, service, why, sizeof why);
    printf("%s%s%s\n", names[s], why[0] ? ": " : "", why);
    rc = s == PD_SERVING ? 0 : 1;
  }
  pd_client_delete(c);
  pd_status_delete(st);
  return rc;
}

/* --- ping ----------------------------------------------------------------------- */

static int cli_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples. */
static double cli_percentile(const double *v, size_t n, double p) {
  size_t rank = (size_t)ceil(p / 100.0 * (double)n);
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return v[rank - 1];
}

static double cli_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* What ping was asked for, and its buffers. */
typedef struct cli_ping_run {
  uint64_t count, size;
  bool quiet;
  unsigned char *payload, *reply;
  double *ms; /* each round trip's time, count of them */
} cli_ping_run;

/* One --count or --size flag with its value (--flag=V or --flag V, the
 * latter advancing *i): 0, or the exit status of a usage error. */
static int cli_ping_flag(cli_ping_run *p, int argc, char **argv, int *i) {
  const char *a = argv[*i], *val = NULL;
  bool is_count =
      strncmp(a, "--count", 7) == 0 && (a[7] == '\0' || a[7] == '=');
  bool is_size = strncmp(a, "--size", 6) == 0 && (a[6] == '\0' || a[6] == '=');
  if (!is_count && !is_size)
    return cli_usage_error("ping", "unknown argument '%s'", a);
  const char *eq = strchr(a, '=');
  if (eq) {
    val = eq + 1;
  } else {
    if (*i + 1 >= argc) return cli_usage_error("ping", "%s needs a value", a);
    val = argv[++*i];
  }
  if (is_count) {
    if (!pdcom_parse_size(val, &p->count) || p->count < 1 || p->count > 1000000)
      return cli_usage_error("ping", "--count '%s': expected 1..1000000", val);
  } else if (!pdcom_parse_size(val, &p->size) || p->size > (uint64_t)INT_MAX) {
    return cli_usage_error("ping", "--size '%s': expected bytes", val);
  }
  return 0;
}

/* The command line: -1 to go on, or the exit status (--help, an error). */
static int cli_ping_args(cli_ping_run *p, int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(cli_ping_usage, stdout);
      return 0;
    }
    if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
      p->quiet = true;
      continue;
    }
    int rc = cli_ping_flag(p, argc, argv, &i);
    if (rc != 0) return rc;
  }
  return -1;
}

/* The round trips, each timed and its echo compared: 0, or 1 (said). The
 * first call also connects: timed and shown apart. */
static int cli_ping_trips(const cli_opts *o, pd_client *c, cli_ping_run *p,
                          pd_status *st) {
  size_t size = (size_t)p->size;
  double t0 = cli_now_ms();
  if (pd_client_echo(c, p->payload, size, p->reply, size, NULL, NULL, st) !=
      PD_OK)
    return cli_fail("ping", st);
  printf("PING %s: %" PRIu64 "-byte Echo, connected in %.3f ms\n", o->target,
         p->size, cli_now_ms() - t0);
  for (uint64_t i = 0; i < p->count; i++) {
    p->payload[0] = (unsigned char)i;
    size_t got = 0;
    double a = cli_now_ms();
    if (pd_client_echo(c, p->payload, size, p->reply, size, &got, NULL, st) !=
        PD_OK)
      return cli_fail("ping", st);
    p->ms[i] = cli_now_ms() - a;
    if (got != size || (size && memcmp(p->payload, p->reply, size) != 0)) {
      fprintf(stderr,
              "paradev ping: seq=%" PRIu64
              ": the echo differs from "
              "what was sent\n",
              i);
      return 1;
    }
    if (!p->quiet) printf("seq=%" PRIu64 " time=%.3f ms\n", i, p->ms[i]);
  }
  return 0;
}

/* The summary: min, mean and percentiles of the round trips (sorts ms). */
static void cli_ping_stats(const cli_opts *o, cli_ping_run *p) {
  uint64_t count = p->count;
  double *ms = p->ms, sum = 0;
  for (uint64_t i = 0; i < count; i++) sum += ms[i];
  qsort(ms, (size_t)count, sizeof(double), cli_cmp_double);
  printf("--- %s ping statistics ---\n", o->target);
  printf("%" PRIu64 " round trips of %" PRIu64
         " bytes: min %.3f ms, mean %.3f ms\n",
         count, p->size, ms[0], sum / (double)count);
  printf("latency p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms\n",
         cli_percentile(ms, (size_t)count, 50),
         cli_percentile(ms, (size_t)count, 90),
         cli_percentile(ms, (size_t)count, 99), ms[count - 1]);
}

static int cli_ping(const cli_opts *o, int argc, char **argv) {
  cli_ping_run p = {.count = 10, .size = 64};
  int rc = cli_ping_args(&p, argc, argv);
  if (rc >= 0) return rc;
  p.payload = malloc(p.size ? p.size : 1);
  p.reply = malloc(p.size ? p.size : 1);
  p.ms = malloc(sizeof(double) * p.count);
  if (!p.payload || !p.reply || !p.ms) {
    fprintf(stderr, "paradev ping: out of memory\n");
    rc = 1;
    goto out_free;
  }
  for (uint64_t i = 0; i < p.size; i++)
    p.payload[i] = (unsigned char)(i * 31 + 7);
  pd_status *st = pd_status_new();
  rc = 0;
  pd_client *c = cli_connect(o, "ping", st, &rc);
  if (c) rc = cli_ping_trips(o, c, &p, st);
  if (c && rc == 0) cli_ping_stats(o, &p);
  pd_client_delete(c);
  pd_status_delete(st);
out_free:
  free(p.payload);
  free(p.reply);
  free(p.ms);
  return rc;
}

/* --- ops ------------------------------------------------------------------------ */

/* After NOT_FOUND for `name`: "did you mean 'MatMul'?" (into buf) when an op
 * matches it ignoring case, else NULL (the default hint). */
static const char *cli_ops_suggest(pd_client *c, const char *name, char *buf,
                                   size_t cap) {
  pd_op_info *all = NULL;
  int n = 0;
  pd_status *st = pd_status_new();
  const char *hint = NULL;
  if (st && pd_list_ops(c, NULL, &all, &n, NULL, st) == PD_OK)
    for (int i = 0; i < n && !hint; i++)
      if (strcasecmp(all[i].name, name) == 0) {
        snprintf(buf, cap, "did you mean '%s'?", all[i].name);
        hint = buf;
      }
  pd_ops_free(all, n);
  pd_status_delete(st);
  return hint;
}

static int cli_ops(const cli_opts *o, int argc, char **argv) {
  const char *name = NULL;
  bool md = false;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(cli_ops_usage, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--markdown") == 0)
      md = true;
    else if (argv[i][0] == '-' || name)
      return cli_usage_error("ops", "unknown argument '%s'", argv[i]);
    else
      name = argv[i];
  }
  pd_status *st = pd_status_new();
  int rc = 0;
  pd_client *c = cli_connect(o, "ops", st, &rc);
  if (!c) {
    pd_status_delete(st);
    return rc;
  }
  pd_op_info *ops = NULL;
  int n = 0;
  if (pd_list_ops(c, name, &ops, &n, NULL, st) != PD_OK) {
    char hint[128];
    rc = cli_fail_hint("ops", st,
                       name && pd_status_code(st) == PD_NOT_FOUND
                           ? cli_ops_suggest(c, name, hint, sizeof hint)
                           : NULL);
  } else if (md) {
    cli_ops_print_markdown(stdout, ops, n);
  } else if (name && n == 1) {
    cli_ops_print_one(stdout, &ops[0]);
  } else {
    cli_ops_print_table(stdout, ops, n);
  }
  pd_ops_free(ops, n);
  pd_client_delete(c);
  pd_status_delete(st);
  return rc;
}

/* --- main ------------------------------------------------------------------------ */

/* `a` is option `name`, alone or as name=value. */
static bool cli_is_opt(const char *a, const char *name) {
  size_t n = strlen(name);
  return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

/* The field of a TLS or token option (--tls-ca, ...), or NULL. */
static const char **cli_security_opt(cli_opts *o, const char *a) {
  if (cli_is_opt(a, "--tls-ca")) return &o->tls_ca;
  if (cli_is_opt(a, "--tls-cert")) return &o->tls_cert;
  if (cli_is_opt(a, "--tls-key")) return &o->tls_key;
  if (cli_is_opt(a, "--tls-server-name")) return &o->tls_server_name;
  if (cli_is_opt(a, "--token-file")) return &o->token_file;
  return NULL;
}

int main(int argc, char **argv) {
  cli_opts o = {NULL, false, 10000, NULL, NULL, NULL, NULL, NULL};
  char defbuf[512];
  const char *cmd = NULL;
  char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
  int nrest = 0;
  if (!rest) return 1;
  int rc = -1;
  bool want_help = false, target_given = false;
  for (int i = 1; i < argc && rc < 0; i++) {
    const char *a = argv[i];
    const char *val = NULL;
    bool is_target = cli_is_opt(a, "--target");
    bool is_timeout = cli_is_opt(a, "--timeout");
    const char **sec = cli_security_opt(&o, a);
    if (is_target || is_timeout || sec) {
      const char *eq = strchr(a, '=');
      if (eq) {
        val = eq + 1;
      } else if (i + 1 < argc) {
        val = argv[++i];
      } else {
        rc = cli_usage_error(cmd, "%s needs a value", a);
        break;
      }
      if (sec) {
        if (!*val)
          rc = cli_usage_error(cmd, "%.*s needs a value", (int)strcspn(a, "="),
                               a);
        *sec = val;
      } else if (is_target) {
        if (!*val) rc = cli_usage_error(cmd, "--target needs an address");
        o.target = val;
        target_given = true;
      } else {
        if (!cli_parse_duration_ms(val, &o.timeout_ms))
          rc = cli_usage_error(cmd, "--timeout '%s': " CLI_TIMEOUT_EXPECTED,
                               val);
      }
    } else if (!cmd && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 ||
                        strcmp(a, "help") == 0)) {
      want_help = true;
    } else if (!cmd && strcmp(a, "--version") == 0) {
      printf("paradev %s\n", pd_version());
      rc = 0;
    } else if (!cmd && a[0] == '-') {
      rc = cli_usage_error(NULL, "unknown option '%s'", a);
    } else if (!cmd) {
      cmd = a;
      /* admin has options of its own (its --timeout reads as this one):
       * all of the rest is its. */
      if (strcmp(cmd, "admin") == 0) {
        rest[nrest++] = argv[i];
        for (i++; i < argc; i++) rest[nrest++] = argv[i];
        break;
      }
    } else {
      rest[nrest++] = argv[i];
    }
  }
  if (rc < 0 && want_help) {
    fputs(cli_usage, stdout);
    rc = 0;
  }
  if (rc < 0 && !cmd) rc = cli_usage_error(NULL, "no command given");
  if (rc < 0) {
    if (!o.target)
      o.target = cli_default_target(defbuf, sizeof(defbuf), &o.target_from_env);
    if (strcmp(cmd, "info") == 0)
      rc = cli_info(&o, nrest, rest);
    else if (strcmp(cmd, "health") == 0)
      rc = cli_health(&o, nrest, rest);
    else if (strcmp(cmd, "ping") == 0)
      rc = cli_ping(&o, nrest, rest);
    else if (strcmp(cmd, "ops") == 0)
      rc = cli_ops(&o, nrest, rest);
    else if (strcmp(cmd, "load") == 0)
      rc = cli_load(&o, nrest, rest);
    else if (strcmp(cmd, "save") == 0)
      rc = cli_save(&o, nrest, rest);
    else if (strcmp(cmd, "function") == 0)
      rc = cli_function(&o, nrest, rest);
#ifdef PARADEV_CLI_ADMIN
    else if (strcmp(cmd, "admin") == 0)
      rc = cli_admin_with_target(target_given ? o.target : NULL, nrest, rest);
#endif
    else
      rc = cli_usage_error(NULL, "unknown command '%s'", cmd);
  }
  free(rest);
  return rc;
}
