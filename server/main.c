/* paradevd: the daemon's entry point. Parses the command line (DESIGN.md),
 * creates the engine and the scheduler, serves until SIGINT or SIGTERM, and
 * shuts down in order (see srv_stop). Exit status: 0 after a clean shutdown,
 * 1 when start-up fails, 2 for a bad command line. */
#include <errno.h>
#include <grpc/grpc.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "server.h"

static const char srv_usage[] =
    "Usage: paradevd [OPTIONS]\n"
    "Serve this machine's devices as one parallel device over gRPC\n"
    "(service paradev.v1.ParallelDevice and grpc.health.v1.Health).\n"
    "\n"
    "  --listen ADDR          unix:/path or host:port; repeat for several.\n"
    "                         127.0.0.1:0 picks a free port (logged).\n"
    "                         Default: 127.0.0.1:7478 and\n"
    "                         unix:$XDG_RUNTIME_DIR/paradevd.sock\n"
    "  --backend cpu|cuda     device backend (default cpu)\n"
    "  --devices N            devices of the mesh, 1..64 (default 4)\n"
    "  --memory-limit BYTES   per-device memory limit (cpu backend; 0: none)\n"
    "  --max-message-bytes N  gRPC message limit, both ways (default 64 MiB)\n"
    "  --threads N            completion-queue threads, 1..16 (default 4)\n"
    "  --grace-ms N           shutdown grace period (default 5000)\n"
    "  --log LEVEL            error|warn|info|debug (default info;\n"
    "                         also PARADEV_LOG)\n"
    "  --help                 this text\n"
    "  --version              print the version\n";

/* Parses a non-negative decimal with an optional K/M/G (powers of 1024). */
static bool srv_parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s || *s == '-') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  if (*end) return false;
  if (shift && v > (ULLONG_MAX >> shift)) return false;
  *out = (uint64_t)v << shift;
  return true;
}

static int srv_usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static int srv_usage_error(const char *fmt, ...) {
  fprintf(stderr, "paradevd: ");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry 'paradevd --help'.\n");
  return 2;
}

/* Returns -1 to go on, or an exit status. */
static int srv_parse_args(int argc, char **argv, srv_options *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = NULL;
    char name[64];
    const char *eq = strchr(a, '=');
    if (strncmp(a, "--", 2) == 0 && eq && (size_t)(eq - a) < sizeof(name)) {
      memcpy(name, a, (size_t)(eq - a));
      name[eq - a] = '\0';
      val = eq + 1;
      a = name;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(srv_usage, stdout);
      return 0;
    }
    if (strcmp(a, "--version") == 0) {
      printf("paradevd %s\n", SRV_VERSION);
      return 0;
    }
    static const char *const with_value[] = {
        "--listen", "--backend", "--devices", "--memory-limit",
        "--max-message-bytes", "--threads", "--grace-ms", "--log",
        "--config", "--mesh", "--metrics-listen", NULL};
    bool known = false;
    for (int k = 0; with_value[k]; k++) known |= strcmp(a, with_value[k]) == 0;
    if (!known) {
      if (strcmp(a, "--check-config") == 0)
        return srv_usage_error("%s is not supported yet", a);
      return srv_usage_error("unknown option '%s'", argv[i]);
    }
    if (!val) {
      if (i + 1 >= argc) return srv_usage_error("%s needs a value", a);
      val = argv[++i];
    }
    uint64_t v = 0;
    if (strcmp(a, "--listen") == 0) {
      if (o->num_listen == SRV_MAX_LISTEN)
        return srv_usage_error("too many --listen (the limit is %d)", SRV_MAX_LISTEN);
      if (!*val) return srv_usage_error("--listen needs an address");
      o->listen[o->num_listen++] = val;
    } else if (strcmp(a, "--backend") == 0) {
      if (strcmp(val, "cpu") != 0 && strcmp(val, "cuda") != 0)
        return srv_usage_error("--backend '%s': expected cpu or cuda", val);
      o->backend = val;
    } else if (strcmp(a, "--devices") == 0) {
      if (!srv_parse_u64(val, &v) || v < 1 || v > PD_MAX_DEVICES)
        return srv_usage_error("--devices '%s': expected 1..64", val);
      o->num_devices = (int)v;
    } else if (strcmp(a, "--memory-limit") == 0) {
      if (!srv_parse_u64(val, &v))
        return srv_usage_error("--memory-limit '%s': expected bytes", val);
      o->memory_limit = v;
    } else if (strcmp(a, "--max-message-bytes") == 0) {
      if (!srv_parse_u64(val, &v) || v < 4096 || v > INT_MAX)
        return srv_usage_error(
            "--max-message-bytes '%s': expected 4096..2147483647", val);
      o->limits.max_message_bytes = v;
    } else if (strcmp(a, "--threads") == 0) {
      if (!srv_parse_u64(val, &v) || v < 1 || v > SRV_MAX_THREADS)
        return srv_usage_error("--threads '%s': expected 1..16", val);
      o->num_threads = (int)v;
    } else if (strcmp(a, "--grace-ms") == 0) {
      if (!srv_parse_u64(val, &v) || v > 600000)
        return srv_usage_error("--grace-ms '%s': expected 0..600000", val);
      o->grace_ms = (int)v;
    } else if (strcmp(a, "--log") == 0) {
      srv_log_level lv;
      if (!srv_log_parse(val, &lv))
        return srv_usage_error("--log '%s': expected error|warn|info|debug",
                               val);
      srv_log_threshold = (int)lv;
    } else {
      return srv_usage_error("%s is not supported yet", a);
    }
  }
  return -1;
}

static void srv_on_expired(void *arg, uint64_t seq, const char *client,
                           uint64_t freed) {
  (void)arg;
  char cn[65];
  SRV_INFO("session %" PRIu64 " (client \"%s\") lease expired: %" PRIu64
           " handles freed",
           seq, srv_log_clean(client, cn, sizeof cn), freed);
}

int main(int argc, char **argv) {
  static srv s;
  srv_options *o = &s.opt;
  o->backend = "cpu";
  o->num_devices = 4;
  o->num_threads = 4;
  o->grace_ms = 5000;
  o->limits = (srv_limits){
      .max_message_bytes = 64u << 20,
      .max_tensor_bytes = (uint64_t)4 << 30,
      .max_ops_per_request = 4096,
      .max_handles_per_session = 1000000,
      .max_sessions = 1024,
      .max_string_bytes = DEV_ATTR_STRING_MAX,
      .max_ids_per_request = 65536,
      .default_lease_s = 60,
      .max_lease_s = 86400,
      .max_chunk_bytes = 0,
      .default_chunk_bytes = 1u << 20,
  };
  const char *env = getenv("PARADEV_LOG");
  srv_log_level lv;
  if (env && srv_log_parse(env, &lv)) srv_log_threshold = (int)lv;
  int rc = srv_parse_args(argc, argv, o);
  if (rc >= 0) return rc;
  /* Chunks leave room for the rest of their message under the limit. */
  o->limits.max_chunk_bytes = o->limits.max_message_bytes - 1024;
  if (o->limits.default_chunk_bytes > o->limits.max_chunk_bytes)
    o->limits.default_chunk_bytes = o->limits.max_chunk_bytes;

  static char default_unix[512];
  if (o->num_listen == 0) {
    const char *rt = getenv("XDG_RUNTIME_DIR");
    if (rt && *rt)
      snprintf(default_unix, sizeof(default_unix), "unix:%s/paradevd.sock", rt);
    else
      snprintf(default_unix, sizeof(default_unix), "unix:/tmp/paradevd-%u.sock",
               (unsigned)getuid());
    o->listen[o->num_listen++] = "127.0.0.1:7478";
    o->listen[o->num_listen++] = default_unix;
  }

  /* Signals are taken by sigwait on this thread only; block them before any
   * thread (ours, gRPC's, the engine's) starts, so all inherit the mask. */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (getrandom(&s.incarnation, sizeof(s.incarnation), 0) !=
      (ssize_t)sizeof(s.incarnation)) {
    SRV_ERROR("getrandom failed: %s", strerror(errno));
    return 1;
  }
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  s.start_unix_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;

  dev_status st = DEV_STATUS_INIT;
  dev_engine_config ec = DEV_ENGINE_CONFIG_INITIALIZER;
  ec.backend = o->backend;
  ec.num_devices = o->num_devices;
  ec.memory_limit = o->memory_limit;
  if (dev_engine_create(&ec, &s.engine, &st) != PD_OK) {
    SRV_ERROR("cannot start the %s backend with %d devices: %s", o->backend,
              o->num_devices, st.msg);
    return 1;
  }
  sched_config sc = SCHED_CONFIG_INITIALIZER;
  sc.incarnation = s.incarnation;
  sc.default_lease_s = o->limits.default_lease_s;
  sc.max_lease_s = o->limits.max_lease_s;
  sc.max_sessions = o->limits.max_sessions;
  sc.max_handles_per_session = o->limits.max_handles_per_session;
  sc.max_ops_per_request = o->limits.max_ops_per_request;
  sc.on_expired = srv_on_expired;
  if (sched_create(s.engine, &sc, &s.sched, &st) != PD_OK) {
    SRV_ERROR("cannot start the scheduler: %s", st.msg);
    dev_engine_destroy(s.engine);
    return 1;
  }
  if (srv_start(&s) != 0) {
    sched_destroy(s.sched);
    dev_engine_destroy(s.engine);
    return 1;
  }
  SRV_INFO("ready: paradevd %s, backend %s, %d devices, incarnation "
           "%016" PRIx64 ", max message %" PRIu64 " bytes",
           SRV_VERSION, o->backend, dev_engine_num_devices(s.engine),
           s.incarnation, o->limits.max_message_bytes);

  int sig = 0;
  while (sigwait(&sigs, &sig) != 0) {
  }
  SRV_INFO("%s: shutting down (grace period %d ms)",
           sig == SIGINT ? "SIGINT" : "SIGTERM", o->grace_ms);
  srv_stop(&s);
  sched_destroy(s.sched);
  dev_engine_destroy(s.engine);
  SRV_INFO("stopped");
  return 0;
}
