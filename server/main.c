/* paradevd: the daemon's entry point and its service loop.
 *
 * Start-up: configuration (config.c), the engine and the scheduler, the gRPC
 * listeners and the admin socket (rpc.c), the HTTP listener (http.c); then,
 * and only then, READY=1 to systemd (Type=notify).
 *
 * The main thread then waits for signals (see srv_on_signal) and, at least
 * once a second (and at half of WatchdogSec), looks at the service: whether
 * the devices make progress (sched_check_progress) and are healthy, which
 * feeds the health status; WATCHDOG=1 only while they make progress, so a
 * stuck engine lets systemd's watchdog fire; a STATUS= line when something
 * changed; and, while draining to exit, whether the queued work is done or
 * the drain timeout has passed.
 *
 * Signals: SIGTERM or SIGINT drains (health NOT_SERVING, no new sessions,
 * queued work finishes for up to drain_timeout_seconds, then the rest is
 * cancelled) and exits 0; a second one exits at once with status 1. SIGHUP
 * reloads log levels, limits and quotas (RELOADING=1 ... READY=1).
 *
 * Exit status: 0 after a clean shutdown, 1 when start-up fails (or a second
 * SIGTERM cut a drain short), 2 for a bad command line or configuration. */
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc.h>
#include <poll.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "server.h"

/* Signals. A library may start threads before main runs (OpenBLAS starts
 * its pool from a constructor) with the default mask, and the kernel gives a
 * process-directed signal to any thread that does not block it, so blocking
 * SIGTERM in our threads is not enough: a handler catches it wherever it
 * lands and writes its number to a pipe that the main loop polls. Our own
 * threads block the signals; the main thread unblocks them only inside
 * ppoll, so one left pending for it arrives there. */
static int srv_sig_pipe[2] = {-1, -1};

static void srv_on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  ssize_t w = write(srv_sig_pipe[1], &b, 1); /* full pipe: one is enough */
  (void)w;
  errno = saved;
}

static int srv_signals_init(sigset_t *wait_mask) {
  if (pipe2(srv_sig_pipe, O_NONBLOCK | O_CLOEXEC) != 0) return -1;
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGHUP);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = srv_on_signal;
  sa.sa_flags = SA_RESTART;
  sigfillset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  /* Block them before any thread of ours (gRPC's, the engine's,
   * libmicrohttpd's) starts, so all inherit the mask. */
  pthread_sigmask(SIG_BLOCK, &blocked, wait_mask);
  sigdelset(wait_mask, SIGINT);
  sigdelset(wait_mask, SIGTERM);
  sigdelset(wait_mask, SIGHUP);
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

/* Waits up to `seconds` for a signal; returns its number, or 0. */
static int srv_wait_signal(const sigset_t *wait_mask, double seconds) {
  unsigned char b = 0;
  if (read(srv_sig_pipe[0], &b, 1) == 1) return b;
  struct pollfd p = {srv_sig_pipe[0], POLLIN, 0};
  struct timespec ts = {(time_t)seconds,
                        (long)((seconds - (double)(time_t)seconds) * 1e9)};
  ppoll(&p, 1, &ts, wait_mask);
  if (read(srv_sig_pipe[0], &b, 1) == 1) return b;
  return 0;
}

static double srv_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Before the log is set up: plain lines on stderr. */
static void srv_report_stderr(bool error, const char *msg) {
  fprintf(stderr, "paradevd: %s%s\n", error ? "" : "warning: ", msg);
}

static void srv_report_log(bool error, const char *msg) {
  if (error)
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_ERROR, "%s", msg);
  else
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_WARN, "%s", msg);
}

/* Copies what SIGHUP may change into the running daemon. */
static void srv_apply_runtime(srv *s, const srv_options *o) {
  srv_runtime *rt = &s->rt;
  const srv_limits *l = &o->limits;
  atomic_store(&rt->max_tensor_bytes, l->max_tensor_bytes);
  atomic_store(&rt->max_ops_per_request, l->max_ops_per_request);
  atomic_store(&rt->max_handles_per_session, l->max_handles_per_session);
  atomic_store(&rt->max_sessions, l->max_sessions);
  atomic_store(&rt->max_ids_per_request, l->max_ids_per_request);
  atomic_store(&rt->max_queued_ops, l->max_queued_ops);
  atomic_store(&rt->default_lease_s, l->default_lease_s);
  atomic_store(&rt->max_lease_s, l->max_lease_s);
  atomic_store(&rt->default_memory_quota, l->default_memory_quota);
  atomic_store(&rt->max_memory_quota, l->max_memory_quota);
  atomic_store(&rt->drain_timeout_s, o->drain_timeout_s);
  atomic_store(&rt->stall_timeout_s, o->stall_timeout_s);
  srv_log_set(o->log_levels);
}

static void srv_sched_config(const srv_options *o, sched_config *sc) {
  const srv_limits *l = &o->limits;
  sc->default_lease_s = l->default_lease_s;
  sc->max_lease_s = l->max_lease_s;
  sc->max_sessions = l->max_sessions;
  sc->max_handles_per_session = l->max_handles_per_session;
  sc->max_ops_per_request = l->max_ops_per_request;
  sc->max_queued_ops = l->max_queued_ops;
  sc->default_memory_quota = l->default_memory_quota;
  sc->max_memory_quota = l->max_memory_quota;
}

static void srv_on_expired(void *arg, uint64_t seq, const char *client,
                           uint64_t freed) {
  (void)arg;
  char cn[65];
  SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_INFO,
             "session %" PRIu64 " (client \"%s\") lease expired: %" PRIu64
             " handles freed",
             seq, srv_log_clean(client, cn, sizeof cn), freed);
}

/* The STATUS= text: what an operator sees in `systemctl status`. */
static void srv_status_text(srv *s, const sched_stats *st, double drain_left,
                            char *out, size_t len) {
  const char *state = srv_serving(s)              ? "serving"
                      : atomic_load(&s->exiting)  ? "draining to exit"
                      : atomic_load(&s->draining) ? "draining"
                      : !atomic_load(&s->devices_ok) ? "NOT SERVING: a device is unhealthy"
                      : atomic_load(&s->stalled)  ? "NOT SERVING: the devices make no progress"
                                                  : "starting";
  dev_backend *b = dev_engine_backend(s->engine);
  int n = snprintf(out, len,
                   "%s: %d session%s on %d %s device%s, %" PRIu64
                   " ops queued, %" PRIu64 " running",
                   state, st->sessions, st->sessions == 1 ? "" : "s",
                   dev_engine_num_devices(s->engine),
                   b && b->name ? b->name : s->opt.backend,
                   dev_engine_num_devices(s->engine) == 1 ? "" : "s",
                   st->ops_queued, st->ops_in_flight);
  if (drain_left >= 0 && n > 0 && (size_t)n < len)
    snprintf(out + n, len - (size_t)n, ", %.0f s of drain left", drain_left);
}

static void srv_reload(srv *s) {
  uint64_t usec = (uint64_t)(srv_now() * 1e6);
  sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64 "\nSTATUS=reloading %s",
             usec, s->opt.config_path);
  srv_options o;
  bool check = false;
  if (srv_config_load(s->argc, s->argv, &o, &check, srv_report_log) ==
      SRV_CONFIG_RUN) {
    srv_config_restart_keys(&s->opt, &o, srv_report_log);
    sched_config sc = SCHED_CONFIG_INITIALIZER;
    srv_sched_config(&o, &sc);
    dev_status st = DEV_STATUS_INIT;
    if (sched_reconfigure(s->sched, &sc, &st) != PD_OK) {
      SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_ERROR,
                 "reload: %s; keeping the running configuration", st.msg);
    } else {
      srv_apply_runtime(s, &o);
      char spec[256];
      srv_log_spec(o.log_levels, spec, sizeof(spec));
      SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO,
                 "reloaded %s: log %s, max_sessions %d, "
                 "max_handles_per_session %d, quotas default %" PRIu64
                 " max %" PRIu64 " bytes",
                 o.config_loaded ? o.config_path : "(no file)", spec,
                 o.limits.max_sessions, o.limits.max_handles_per_session,
                 o.limits.default_memory_quota, o.limits.max_memory_quota);
    }
  } else {
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_ERROR,
               "reload failed: keeping the running configuration");
  }
  sd_notify(0, "READY=1");
}

static int srv_start_all(srv *s) {
  srv_options *o = &s->opt;
  if (getrandom(&s->incarnation, sizeof(s->incarnation), 0) !=
      (ssize_t)sizeof(s->incarnation)) {
    SRV_ERROR("getrandom failed: %s", strerror(errno));
    return -1;
  }
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  s->start_unix_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;

  dev_status st = DEV_STATUS_INIT;
  dev_engine_config ec = DEV_ENGINE_CONFIG_INITIALIZER;
  ec.backend = o->backend;
  ec.num_devices = o->num_devices;
  ec.memory_limit = o->memory_limit;
  ec.mesh = o->mesh[0] ? o->mesh : NULL;
  ec.cuda_allow_tf32 = o->cuda_allow_tf32;
  ec.cuda_pool_release_threshold = o->cuda_pool_release_threshold;
  ec.cuda_collective_timeout_ms = o->cuda_collective_timeout_ms;
  ec.cuda_collectives = (dev_cuda_collectives)o->cuda_collectives;
  char devs[512];
  srv_config_describe_devices(o, devs, sizeof(devs));
  SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO, "devices: %s", devs);
  if (dev_engine_create(&ec, &s->engine, &st) != PD_OK) {
    SRV_ERROR("cannot start the %s backend: %s", o->backend, st.msg);
    sd_notifyf(0, "STATUS=failed: cannot start the %s backend: %s",
               o->backend, st.msg);
    return -1;
  }
  sched_config sc = SCHED_CONFIG_INITIALIZER;
  sc.incarnation = s->incarnation;
  srv_sched_config(o, &sc);
  sc.on_expired = srv_on_expired;
  if (sched_create(s->engine, &sc, &s->sched, &st) != PD_OK) {
    SRV_ERROR("cannot start the scheduler: %s", st.msg);
    goto fail_engine;
  }
  if (srv_health_init(s) != 0) {
    SRV_ERROR("out of memory");
    goto fail_sched;
  }
  if (srv_start(s) != 0) goto fail_health;
  if (srv_http_start(s) != 0) goto fail_grpc;
  return 0;

fail_grpc:
  srv_stop(s);
fail_health:
  srv_health_destroy(s);
fail_sched:
  sched_destroy(s->sched);
fail_engine:
  dev_engine_destroy(s->engine);
  sd_notify(0, "STATUS=failed to start (see the log)");
  return -1;
}

int main(int argc, char **argv) {
  static srv s;
  s.argc = argc;
  s.argv = argv;
  bool check = false;
  switch (srv_config_load(argc, argv, &s.opt, &check, srv_report_stderr)) {
    case SRV_CONFIG_EXIT_OK: return 0;
    case SRV_CONFIG_EXIT_BAD:
      if (!check) fprintf(stderr, "Try 'paradevd --help'.\n");
      return 2;
    case SRV_CONFIG_RUN: break;
  }
  srv_apply_runtime(&s, &s.opt);

  sigset_t wait_mask;
  if (srv_signals_init(&wait_mask) != 0) {
    SRV_ERROR("cannot create the signal pipe: %s", strerror(errno));
    return 1;
  }

  if (s.opt.config_loaded)
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO, "configuration from %s",
               s.opt.config_path);
  else
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO,
               "no %s: built-in defaults and flags", s.opt.config_path);
  sd_notify(0, "STATUS=starting");
  if (srv_start_all(&s) != 0) return 1;

  /* Every listener accepts from here on (grpc_server_start and
   * MHD_start_daemon have bound and listen). */
  atomic_store(&s.ready, true);
  atomic_store(&s.devices_ok, srv_devices_healthy(&s));
  srv_health_update(&s);
  srv_options *o = &s.opt;
  SRV_INFO("ready: paradevd %s, backend %s, %d devices, incarnation "
           "%016" PRIx64 ", max message %" PRIu64 " bytes",
           SRV_VERSION, o->backend, dev_engine_num_devices(s.engine),
           s.incarnation, o->limits.max_message_bytes);
  sched_stats stats = {.struct_size = sizeof(stats)};
  sched_get_stats(s.sched, &stats);
  char status[256], last_status[256] = "";
  srv_status_text(&s, &stats, -1, status, sizeof(status));
  sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%lu", status,
             (unsigned long)getpid());
  snprintf(last_status, sizeof(last_status), "%s", status);

  uint64_t wd_usec = 0;
  bool watchdog = sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0;
  double wd_period = watchdog ? (double)wd_usec * 1e-6 / 2 : 0;
  if (watchdog)
    SRV_LOG_AT(SRV_SUB_HEALTH, SRV_LOG_INFO,
               "systemd watchdog: WATCHDOG=1 every %.3f s while the devices "
               "make progress",
               wd_period);
  double now = srv_now(), next_tick = now, next_wd = now;
  double drain_start = -1;
  sched_progress prog = {0, false, 0};
  bool timed_out = false, stopping_sent = false;
  int term_signals = 0;

  for (;;) {
    now = srv_now();
    double wake = next_tick;
    if (watchdog && next_wd < wake) wake = next_wd;
    double wait = wake - now;
    if (wait < 0) wait = 0;
    int sig = srv_wait_signal(&wait_mask, wait);
    if (sig == SIGTERM || sig == SIGINT) {
      const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      if (term_signals++ > 0) {
        SRV_WARN("second %s: exiting now, abandoning the queued work", name);
        sd_notify(0, "STATUS=exiting at once (second signal)");
        _exit(1);
      }
      srv_drain(&s, true);
      SRV_INFO("%s: draining: no new sessions; queued work has %u s to finish "
               "(a second %s exits at once)",
               name, SRV_RT(&s, drain_timeout_s), name);
    } else if (sig == SIGHUP) {
      srv_reload(&s);
    }

    now = srv_now();
    /* Progress, device health, and with them the health status. */
    bool stalled = sched_check_progress(s.sched, &prog, now,
                                        (double)SRV_RT(&s, stall_timeout_s));
    if (stalled != atomic_load(&s.stalled)) {
      atomic_store(&s.stalled, stalled);
      if (stalled)
        SRV_LOG_AT(SRV_SUB_HEALTH, SRV_LOG_ERROR,
                   "no op completed for %u s while work is outstanding: "
                   "NOT_SERVING%s",
                   SRV_RT(&s, stall_timeout_s),
                   watchdog ? ", and no more WATCHDOG=1" : "");
      else
        SRV_LOG_AT(SRV_SUB_HEALTH, SRV_LOG_INFO, "the devices make progress again");
    }
    atomic_store(&s.devices_ok, srv_devices_healthy(&s));
    srv_health_update(&s);
    sched_get_stats(s.sched, &stats);

    /* Draining to exit (SIGTERM, or Admin Drain with exit_when_drained). */
    double drain_left = -1;
    if (atomic_load(&s.exiting)) {
      if (drain_start < 0) drain_start = now;
      if (!stopping_sent) {
        sd_notify(0, "STOPPING=1");
        stopping_sent = true;
      }
      uint64_t outstanding = stats.ops_queued + stats.ops_in_flight;
      double limit = (double)SRV_RT(&s, drain_timeout_s);
      if (outstanding == 0) {
        SRV_INFO("drained: the queued work is done (%.1f s)", now - drain_start);
        break;
      }
      if (now - drain_start >= limit) {
        SRV_WARN("drain timeout (%.0f s): cancelling %" PRIu64
                 " queued ops; %" PRIu64 " running on the devices are left",
                 limit, stats.ops_queued, stats.ops_in_flight);
        timed_out = true;
        break;
      }
      drain_left = limit - (now - drain_start);
    }

    srv_status_text(&s, &stats, drain_left, status, sizeof(status));
    if (strcmp(status, last_status) != 0) {
      sd_notifyf(0, "STATUS=%s", status);
      snprintf(last_status, sizeof(last_status), "%s", status);
    }
    if (watchdog && now >= next_wd) {
      if (!stalled) sd_notify(0, "WATCHDOG=1");
      next_wd = now + wd_period;
    }
    if (now >= next_tick) next_tick = now + 1.0;
  }

  if (!stopping_sent) sd_notify(0, "STOPPING=1");
  sd_notify(0, "STATUS=stopping: closing the listeners");
  SRV_INFO("shutting down (grace period %d ms for calls in progress)",
           o->grace_ms);
  srv_health_update(&s);
  srv_health_close(&s);
  srv_stop(&s);
  srv_http_stop(&s);
  sched_get_stats(s.sched, &stats);
  if (timed_out && stats.ops_in_flight > 0) {
    /* The devices still run ops the drain gave up on: exit without waiting
     * for them (the kernel and the driver free the memory). */
    SRV_WARN("exiting with %" PRIu64 " ops still running on the devices",
             stats.ops_in_flight);
    _exit(0);
  }
  sched_destroy(s.sched);
  srv_health_destroy(&s);
  dev_engine_destroy(s.engine);
  SRV_INFO("stopped");
  return 0;
}
