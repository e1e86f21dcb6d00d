/* paradevd: the daemon's entry point and its service loop.
 *
 * Start-up: configuration (config.c), then the daemon's parts in one order
 * (daemon.c: engine, scheduler, shared memory, health, the gRPC listeners
 * and the admin socket, the HTTP listener); then, and only then, READY=1 to
 * systemd (Type=notify).
 *
 * The main thread then waits for signals (see srv_signal_main) and, at least
 * once a second (and at half of WatchdogSec), looks at the service: whether
 * runnable work makes progress (service.c srv_progress_check: the
 * scheduler's queue and each device; a long kernel is not a stall) and the
 * devices are healthy, which feeds liveness and readiness; WATCHDOG=1 only
 * while live, so a stuck engine lets systemd's watchdog fire (a drain does
 * not stop it); a STATUS= line when something changed; and, while draining
 * to exit, whether the queued work is done or the drain timeout has
 * passed.
 *
 * Signals: SIGTERM or SIGINT drains (health NOT_SERVING, no new sessions,
 * queued work finishes for up to drain_timeout_seconds, then the rest is
 * cancelled) and exits 0; a second one exits at once with status 1, in any
 * phase of the shutdown or of start-up (see srv_signal_main). SIGHUP
 * reloads log levels, limits and quotas (RELOADING=1 ... READY=1).
 *
 * The shutdown is bounded: once the drain's timeout and the calls' grace
 * period (shutdown_grace_ms) are over, the rest (gRPC's shutdown, the HTTP
 * listener, the scheduler and the engine) has SRV_TEARDOWN_S; a part that
 * has not returned by then (a wedged device, a blocked library call) is
 * logged with what is left, and the process exits with status 1.
 *
 * Exit status: 0 after a clean shutdown (a drain that timed out included),
 * 1 when start-up fails, a second SIGTERM cut the shutdown short or the
 * shutdown was stuck, 2 for a bad command line or configuration. */
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc.h>
#include <poll.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "log.h"
#include "mesh.h"
#include "server.h"
#include "tokens.h"
#include "tls.h"

/* Signals, and the shutdown's watchdog.
 *
 * A library may start threads before main runs (OpenBLAS starts its pool
 * from a constructor) with the default mask, and the kernel gives a
 * process-directed signal to any thread that does not block it, so blocking
 * SIGTERM in our threads is not enough: a handler catches it wherever it
 * lands and only writes its number to srv_sig_pipe (write(2) is
 * async-signal-safe). Every thread of ours blocks the signals but one,
 * srv_signal_main, which lives as long as the process and reads that pipe,
 * so a signal is acted on whatever the main thread is doing, blocked in a
 * teardown call that does not return included. It hands the first SIGTERM or
 * SIGINT and every SIGHUP to the main loop (srv_evt_pipe); a second SIGTERM
 * or SIGINT, in any phase, it answers itself: a log line, STOPPING=1, exit
 * status 1.
 *
 * It is also the shutdown's watchdog: from the first SIGTERM (or a drain
 * that ends in exit) the whole shutdown must be over by srv_deadline_ms (the
 * drain's timeout, then the calls' grace period, then SRV_TEARDOWN_S for the
 * rest); past it, the thread logs where the main thread is stuck and what is
 * left (ops on the devices, calls) and exits with status 1, rather than let
 * a wedged device, gRPC or library hang the stop until systemd's SIGKILL.
 * It reads only atomics the main thread publishes (srv_phase, the counts),
 * never the scheduler or the engine, which may be what is stuck. */

/* Seconds the shutdown may take after the calls' grace period: stopping the
 * HTTP listener, gRPC's own shutdown, the scheduler and the engine. Each is
 * quick unless something is stuck. deploy/systemd/paradevd.service's
 * TimeoutStopSec must exceed drain_timeout_seconds + shutdown_grace_ms +
 * this. */
#define SRV_TEARDOWN_S 10

static int srv_sig_pipe[2] = {-1, -1}; /* handler -> srv_signal_main */
static int srv_evt_pipe[2] = {-1, -1}; /* srv_signal_main -> main loop */
static atomic_int srv_term_signals;
/* CLOCK_MONOTONIC milliseconds by which the shutdown must be over; 0: none
 * yet. */
static _Atomic int64_t srv_deadline_ms;
/* What the main thread is doing (a static string), and the scheduler's
 * counts as it last read them (ops queued, ops on the devices). */
static _Atomic(const char *) srv_phase = "starting up";
static _Atomic uint64_t srv_last_queued, srv_last_running;

static void srv_on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  ssize_t w = write(srv_sig_pipe[1], &b, 1); /* full pipe: one is enough */
  (void)w;
  errno = saved;
}

static int64_t srv_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sets the shutdown's deadline `ms_from_now` ms ahead and wakes the
 * watchdog to see it; with `if_unset`, only when none was set. */
static void srv_set_deadline(int64_t ms_from_now, bool if_unset) {
  int64_t want = srv_now_ms() + ms_from_now, none = 0;
  if (if_unset)
    atomic_compare_exchange_strong(&srv_deadline_ms, &none, want);
  else
    atomic_store(&srv_deadline_ms, want);
  unsigned char b = 0; /* not a signal: "look at the deadline again" */
  ssize_t w = write(srv_sig_pipe[1], &b, 1);
  (void)w;
}

/* The drain's timeout, the calls' grace period and SRV_TEARDOWN_S, in ms. */
static int64_t srv_shutdown_ms(srv *s, bool with_drain) {
  return (with_drain ? (int64_t)SRV_RT(s, drain_timeout_s) * 1000 : 0) +
         (int64_t)s->opt.grace_ms + (int64_t)SRV_TEARDOWN_S * 1000;
}

static void srv_set_phase(const char *phase) {
  atomic_store(&srv_phase, phase);
}

/* Records the scheduler's counts for the watchdog's and second signal's
 * log lines. Main thread, while the scheduler exists. */
static void srv_note_counts(const sched_stats *st) {
  atomic_store(&srv_last_queued, st->ops_queued);
  atomic_store(&srv_last_running, st->ops_in_flight);
}

/* A second SIGTERM or SIGINT: exit at once, whatever the main thread does. */
static _Noreturn void srv_exit_second_signal(int sig) {
  const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  SRV_WARN(
      "second %s: exiting now with status 1, the drain and shutdown cut "
      "short while %s; abandoning %" PRIu64 " queued ops and %" PRIu64
      " running on the devices (at the last count), %d calls in progress",
      name, atomic_load(&srv_phase), atomic_load(&srv_last_queued),
      atomic_load(&srv_last_running), srv_calls_in_progress());
  sd_notifyf(0, "STOPPING=1\nSTATUS=exited at once (second %s)", name);
  _exit(1);
}

/* The watchdog fired: the shutdown is past its deadline. */
static _Noreturn void srv_exit_stuck(srv *s) {
  SRV_ERROR(
      "shutdown stuck: still %s when the shutdown's time was up (the "
      "drain's %u s, the calls' %d ms grace period, %d s for the "
      "rest); %" PRIu64 " ops queued and %" PRIu64
      " running on the devices (at the last count), %d calls in "
      "progress: exiting with status 1 without waiting any longer",
      atomic_load(&srv_phase), SRV_RT(s, drain_timeout_s), s->opt.grace_ms,
      SRV_TEARDOWN_S, atomic_load(&srv_last_queued),
      atomic_load(&srv_last_running), srv_calls_in_progress());
  sd_notify(0,
            "STOPPING=1\nSTATUS=exited: the shutdown was stuck (see the "
            "log)");
  _exit(1);
}

static void *srv_signal_main(void *arg) {
  srv *s = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  for (;;) {
    int64_t deadline = atomic_load(&srv_deadline_ms);
    int timeout = -1;
    if (deadline > 0) {
      int64_t left = deadline - srv_now_ms();
      if (left <= 0) srv_exit_stuck(s);
      timeout = left > INT_MAX ? INT_MAX : (int)left;
    }
    struct pollfd p = {srv_sig_pipe[0], POLLIN, 0};
    poll(&p, 1, timeout); /* EINTR: a signal landed here; read the pipe */
    unsigned char b;
    while (read(srv_sig_pipe[0], &b, 1) == 1) {
      if (b == 0) continue;
      if (b == SIGTERM || b == SIGINT) {
        if (atomic_fetch_add(&srv_term_signals, 1) > 0)
          srv_exit_second_signal(b);
        /* Even if the main loop never gets to it (stuck), the shutdown
         * ends in time. */
        srv_set_deadline(srv_shutdown_ms(s, true), true);
        srv_mesh_interrupt(s->mesh); /* a start waiting for its mesh */
      }
      ssize_t w = write(srv_evt_pipe[1], &b, 1);
      (void)w;
    }
  }
  return NULL;
}

static int srv_signals_init(srv *s) {
  if (pipe2(srv_sig_pipe, O_NONBLOCK | O_CLOEXEC) != 0 ||
      pipe2(srv_evt_pipe, O_NONBLOCK | O_CLOEXEC) != 0)
    return -1;
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGHUP);
  /* Block them before any thread of ours (gRPC's, the engine's,
   * libmicrohttpd's) starts, so all inherit the mask; srv_signal_main
   * unblocks them for itself. */
  pthread_sigmask(SIG_BLOCK, &blocked, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = srv_on_signal;
  sa.sa_flags = SA_RESTART;
  sigfillset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  pthread_t t;
  if (pthread_create(&t, NULL, srv_signal_main, s) != 0) return -1;
  pthread_detach(t);
  return 0;
}

/* Waits up to `seconds` for a signal srv_signal_main hands on; returns its
 * number, or 0. */
static int srv_wait_signal(double seconds) {
  unsigned char b = 0;
  if (read(srv_evt_pipe[0], &b, 1) == 1) return b;
  struct pollfd p = {srv_evt_pipe[0], POLLIN, 0};
  poll(&p, 1, (int)(seconds * 1000) + 1);
  if (read(srv_evt_pipe[0], &b, 1) == 1) return b;
  return 0;
}

static double srv_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Before the log is set up: plain lines on stderr. */
/* Configuration messages quote what the file, the flags or the environment
 * held (keys, sections, values): whatever bytes those were, the output is
 * valid UTF-8 without control characters (srv_log_printable). */
static void srv_report_stderr(bool error, const char *msg) {
  char clean[SRV_LOG_QUOTED(1024)];
  fprintf(stderr, "paradevd: %s%s\n", error ? "" : "warning: ",
          srv_log_printable(msg, clean, sizeof clean));
}

static void srv_report_log(bool error, const char *msg) {
  char clean[SRV_LOG_QUOTED(1024)];
  srv_log_printable(msg, clean, sizeof clean);
  if (error)
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_ERROR, "%s", clean);
  else
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_WARN, "%s", clean);
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
  atomic_store(&rt->default_memory_quota, srv_default_quota(o, s->engine));
  atomic_store(&rt->default_quota_is_share, l->default_memory_quota == 0);
  atomic_store(&rt->max_memory_quota, l->max_memory_quota);
  atomic_store(&rt->drain_timeout_s, o->drain_timeout_s);
  atomic_store(&rt->stall_timeout_s, o->stall_timeout_s);
  atomic_store(&rt->kernel_timeout_s, o->kernel_timeout_s);
  atomic_store(&rt->require_job_token, o->require_job_token);
  atomic_store(&rt->job_token_lifetime_s, o->job_token_lifetime_s);
  srv_log_set(o->log_levels);
}

/* The STATUS= text: what an operator sees in `systemctl status`. */
static void srv_status_text(srv *s, const sched_stats *st, double drain_left,
                            char *out, size_t len) {
  /* Liveness first: a draining daemon that is also stalled says so. */
  const char *state =
      srv_serving(s)                 ? "serving"
      : !atomic_load(&s->devices_ok) ? "NOT SERVING: a device is unhealthy"
      : atomic_load(&s->stalled)  ? "NOT SERVING: the devices make no progress"
      : atomic_load(&s->exiting)  ? "draining to exit"
      : atomic_load(&s->draining) ? "draining"
                                  : "starting";
  const char *backend = dev_engine_backend_name(s->engine);
  int n = snprintf(out, len,
                   "%s: %d session%s on %d %s device%s, %" PRIu64
                   " ops queued, %" PRIu64 " running",
                   state, st->sessions, st->sessions == 1 ? "" : "s",
                   dev_engine_num_devices(s->engine),
                   backend[0] ? backend : s->opt.backend,
                   dev_engine_num_devices(s->engine) == 1 ? "" : "s",
                   st->ops_queued, st->ops_in_flight);
  if (drain_left >= 0 && n > 0 && (size_t)n < len)
    snprintf(out + n, len - (size_t)n, ", %.0f s of drain left", drain_left);
}

static void srv_reload(srv *s) {
  uint64_t usec = (uint64_t)(srv_now() * 1e6);
  sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64 "\nSTATUS=reloading %s",
             usec, s->opt.config_path);
  srv_tls_reload(s->tls); /* the certificate files, even if the rest fails */
  srv_options o;
  bool check = false;
  if (srv_config_load(s->argc, s->argv, &o, &check, srv_report_log) ==
      SRV_CONFIG_RUN) {
    srv_config_restart_keys(&s->opt, &o, srv_report_log);
    sched_config sc = SCHED_CONFIG_INITIALIZER;
    srv_daemon_sched_config(&o, s->engine, &sc);
    dev_status st = DEV_STATUS_INIT;
    if (sched_reconfigure(s->sched, &sc, &st) != PD_OK) {
      SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_ERROR,
                 "reload: %s; keeping the running configuration", st.msg);
    } else {
      srv_apply_runtime(s, &o);
      srv_auth_reload(s, &o); /* keeps the old tables when it fails */
      char spec[256];
      srv_log_spec(o.log_levels, spec, sizeof(spec));
      SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO,
                 "reloaded %s: log %s, max_sessions %d, "
                 "max_handles_per_session %d, quotas default %" PRIu64
                 " max %" PRIu64 " bytes",
                 o.config_loaded ? o.config_path : "(no file)", spec,
                 o.limits.max_sessions, o.limits.max_handles_per_session,
                 srv_default_quota(&o, s->engine), o.limits.max_memory_quota);
    }
  } else {
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_ERROR,
               "reload failed: keeping the running configuration");
  }
  sd_notify(0, "READY=1");
}

/* --- the service loop ------------------------------------------------------ */

/* What the service loop carries from one turn to the next. */
typedef struct srv_loop {
  sched_stats stats;
  char status[256], last_status[256]; /* the STATUS= line, and the last sent */
  bool watchdog;                      /* WatchdogSec is set */
  double wd_period;                   /* half of it, in seconds */
  double next_tick, next_wd;          /* when the loop looks next */
  double drain_start;                 /* -1 until draining to exit */
  bool timed_out, stopping_sent;
} srv_loop;

/* The configuration, runtime settings and signal handling, before any part
 * of the daemon starts: -1 to go on, or main's exit status. */
static int srv_main_prepare(srv *s, int argc, char **argv) {
  s->argc = argc;
  s->argv = argv;
  if (argc == 2 && strcmp(argv[1], "--hash-token") == 0)
    return srv_tokens_hash_main();
  bool check = false;
  srv_config_plugin_check = srv_functions_check;
  switch (srv_config_load(argc, argv, &s->opt, &check, srv_report_stderr)) {
    case SRV_CONFIG_EXIT_OK: return 0;
    case SRV_CONFIG_EXIT_BAD:
      if (!check) fprintf(stderr, "Try 'paradevd --help'.\n");
      return 2;
    case SRV_CONFIG_RUN: break;
  }
  srv_apply_runtime(s, &s->opt);
  if (srv_signals_init(s) != 0) {
    SRV_ERROR("cannot set up signal handling (pipes, a thread): %s",
              strerror(errno));
    return 1;
  }
  if (s->opt.config_loaded)
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO, "configuration from %s",
               s->opt.config_path);
  else
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO,
               "no %s: built-in defaults and flags", s->opt.config_path);
  return -1;
}

/* Once every listener accepts (grpc_server_start and MHD_start_daemon have
 * bound and listen): ready in the health status, the log and to systemd. */
static void srv_announce_ready(srv *s, srv_loop *L) {
  atomic_store(&s->ready, true);
  atomic_store(&s->devices_ok, srv_devices_healthy(s));
  srv_health_update(s);
  srv_options *o = &s->opt;
  SRV_INFO(
      "ready: paradevd %s, backend %s, %d devices, incarnation "
      "%016" PRIx64 ", max message %" PRIu64 " bytes",
      SRV_VERSION, o->backend, dev_engine_num_devices(s->engine),
      s->incarnation, o->limits.max_message_bytes);
  sched_get_stats(s->sched, &L->stats);
  srv_set_phase("serving (the main loop)");
  srv_status_text(s, &L->stats, -1, L->status, sizeof(L->status));
  sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%lu", L->status,
             (unsigned long)getpid());
  snprintf(L->last_status, sizeof(L->last_status), "%s", L->status);
}

/* systemd's watchdog, if WatchdogSec is set: WATCHDOG=1 at half its period. */
static void srv_watchdog_init(srv_loop *L) {
  uint64_t wd_usec = 0;
  L->watchdog = sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0;
  L->wd_period = L->watchdog ? (double)wd_usec * 1e-6 / 2 : 0;
  if (L->watchdog)
    SRV_LOG_AT(SRV_SUB_HEALTH, SRV_LOG_INFO,
               "systemd watchdog: WATCHDOG=1 every %.3f s while the devices "
               "make progress",
               L->wd_period);
}

/* Waits for a signal until the next tick or watchdog beat, and acts on it. */
static void srv_loop_wait(srv *s, const srv_loop *L) {
  double wake = L->next_tick;
  if (L->watchdog && L->next_wd < wake) wake = L->next_wd;
  double wait = wake - srv_now();
  if (wait < 0) wait = 0;
  int sig = srv_wait_signal(wait);
  if (sig == SIGTERM || sig == SIGINT) {
    /* The first one (srv_signal_main answers a second itself). */
    const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    srv_drain(s, true);
    SRV_INFO(
        "%s: draining: no new sessions; queued work has %u s to finish "
        "(a second %s exits at once)",
        name, SRV_RT(s, drain_timeout_s), name);
  } else if (sig == SIGHUP) {
    srv_reload(s);
  }
}

/* Progress, device health, and with them the health status; the fresh
 * counts in L->stats. True while liveness fails (stalled, or a device
 * unhealthy). */
static bool srv_loop_health(srv *s, srv_loop *L, double now) {
  bool stalled = srv_progress_check(s, now);
  if (stalled != atomic_load(&s->stalled)) {
    atomic_store(&s->stalled, stalled);
    if (stalled)
      SRV_LOG_AT(SRV_SUB_HEALTH, SRV_LOG_ERROR,
                 "runnable work makes no progress (see above): liveness "
                 "and readiness NOT_SERVING%s",
                 L->watchdog ? ", and no more WATCHDOG=1" : "");
    else
      SRV_LOG_AT(SRV_SUB_HEALTH, SRV_LOG_INFO,
                 "the devices make progress again");
  }
  atomic_store(&s->devices_ok, srv_devices_healthy(s));
  srv_health_update(s);
  sched_get_stats(s->sched, &L->stats);
  srv_note_counts(&L->stats);
  return !srv_alive(s);
}

/* Draining to exit (SIGTERM, or Admin Drain with exit_when_drained): true
 * when the loop is over (drained, or the drain timed out); else the seconds
 * of drain left in *drain_left (-1 when not draining). */
static bool srv_loop_drain(srv *s, srv_loop *L, double now,
                           double *drain_left) {
  *drain_left = -1;
  if (!atomic_load(&s->exiting)) return false;
  if (L->drain_start < 0) {
    L->drain_start = now;
    srv_set_phase("draining (the main loop)");
  }
  if (!L->stopping_sent) {
    sd_notify(0, "STOPPING=1");
    L->stopping_sent = true;
  }
  /* The watchdog's deadline follows the drain's timeout (which a SIGHUP may
   * change). */
  srv_set_deadline(
      (int64_t)((L->drain_start - now) * 1000) + srv_shutdown_ms(s, true),
      false);
  uint64_t outstanding = L->stats.ops_queued + L->stats.ops_in_flight;
  double limit = (double)SRV_RT(s, drain_timeout_s);
  if (outstanding == 0) {
    SRV_INFO("drained: the queued work is done (%.1f s)", now - L->drain_start);
    return true;
  }
  if (now - L->drain_start >= limit) {
    SRV_WARN("drain timeout (%.0f s): cancelling %" PRIu64
             " queued ops; %" PRIu64 " running on the devices are left",
             limit, L->stats.ops_queued, L->stats.ops_in_flight);
    L->timed_out = true;
    return true;
  }
  *drain_left = limit - (now - L->drain_start);
  return false;
}

/* A STATUS= line when it changed, WATCHDOG=1 when due and live (the same
 * signal as paradev.liveness and /healthz; a drain keeps it coming), and
 * the next tick. */
static void srv_loop_notify(srv *s, srv_loop *L, double now, bool dead,
                            double drain_left) {
  srv_status_text(s, &L->stats, drain_left, L->status, sizeof(L->status));
  if (strcmp(L->status, L->last_status) != 0) {
    sd_notifyf(0, "STATUS=%s", L->status);
    snprintf(L->last_status, sizeof(L->last_status), "%s", L->status);
  }
  if (L->watchdog && now >= L->next_wd) {
    if (!dead) sd_notify(0, "WATCHDOG=1");
    L->next_wd = now + L->wd_period;
  }
  if (now >= L->next_tick) L->next_tick = now + 1.0;
}

/* The service loop, until the drain to exit is over. */
static void srv_serve(srv *s, srv_loop *L) {
  srv_watchdog_init(L);
  double now = srv_now();
  L->next_tick = now;
  L->next_wd = now;
  L->drain_start = -1;
  for (;;) {
    srv_loop_wait(s, L);
    now = srv_now();
    bool dead = srv_loop_health(s, L, now);
    double drain_left;
    if (srv_loop_drain(s, L, now, &drain_left)) break;
    srv_loop_notify(s, L, now, dead, drain_left);
  }
}

/* The shutdown after the loop. The rest must be over within the calls' grace
 * period and SRV_TEARDOWN_S, or srv_signal_main ends the process with
 * status 1. */
static void srv_shutdown(srv *s, srv_loop *L) {
  srv_set_deadline(srv_shutdown_ms(s, false), false);
  if (!L->stopping_sent) sd_notify(0, "STOPPING=1");
  sd_notify(0, "STATUS=stopping: closing the listeners");
  SRV_INFO(
      "shutting down (grace period %d ms for calls in progress, then "
      "%d s for the rest)",
      s->opt.grace_ms, SRV_TEARDOWN_S);
  srv_daemon_stop_serving(s, srv_set_phase);
  sched_get_stats(s->sched, &L->stats);
  srv_note_counts(&L->stats);
  if (L->timed_out && L->stats.ops_in_flight > 0) {
    /* The devices still run ops the drain gave up on: exit without waiting
     * for them (the kernel and the driver free the memory). */
    SRV_WARN("exiting with %" PRIu64 " ops still running on the devices",
             L->stats.ops_in_flight);
    _exit(0);
  }
  srv_daemon_stop_devices(s, srv_set_phase);
  /* exit() runs the libraries' destructors (and a sanitizer's leak check):
   * SRV_TEARDOWN_S of their own. */
  srv_set_phase("exiting (library destructors)");
  srv_set_deadline((int64_t)SRV_TEARDOWN_S * 1000, false);
  SRV_INFO("stopped");
}

int main(int argc, char **argv) {
  static srv s;
  int rc = srv_main_prepare(&s, argc, argv);
  if (rc >= 0) return rc;
  sd_notify(0, "STATUS=starting");
  if (srv_daemon_start(&s) != 0) return 1;
  srv_loop L = {.stats = {.struct_size = sizeof(L.stats)}};
  srv_announce_ready(&s, &L);
  srv_serve(&s, &L);
  srv_shutdown(&s, &L);
  return 0;
}
