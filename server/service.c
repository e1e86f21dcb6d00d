/* The service's state, which health reports and every part may change:
 * ready, draining (and exiting), the devices' health and memory, the
 * liveness and readiness as last announced, and the list of open health
 * Watch streams that a change wakes (srv_call_wake), so that the new status
 * is written from each call's own thread (health.c).
 *
 * Liveness (paradev.liveness, /healthz, systemd's WATCHDOG=1): the process
 * is not wedged: every device healthy, and work that is runnable makes
 * progress (srv_progress_check). Readiness (paradev.readiness, "",
 * paradev.v1.ParallelDevice, /readyz): live, every listener accepts, and
 * not draining, so new sessions and new work are taken. A drain is never a
 * liveness failure: an orchestrator must not kill a draining daemon.
 *
 * Progress, once a tick from the main loop: the scheduler's queue
 * (sched_check_progress: queued ops and none dispatched) and each device
 * (dev_engine_watch): a device with ops queued whose executor starts none
 * for stall_timeout_seconds is stalled; one running a single kernel is
 * not, unless that kernel goes kernel_timeout_seconds without progress
 * (finishing, or a heartbeat). */
#define SRV_LOG_SUB SRV_SUB_HEALTH
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "mesh.h"
#include "server.h"

/* Why a device counts against liveness. */
enum { SRV_DEV_OK = 0, SRV_DEV_STALLED, SRV_DEV_WEDGED };
/* Why liveness fails for want of progress (bits). */
enum { SRV_CAUSE_STALLED = 1, SRV_CAUSE_WEDGED = 2 };

struct srv_health {
  pthread_mutex_t mu; /* guards serving, live, closing and the Watch list */
  bool serving;       /* readiness as last announced */
  bool live;          /* liveness as last announced */
  bool closing;
  srv_call **watch;
  size_t n, cap;
  bool dev_ok[PD_MAX_DEVICES];
  /* The progress watch: the main loop's only (srv_progress_check). */
  sched_progress sched_prog;
  bool sched_stalled;
  dev_progress prog[PD_MAX_DEVICES];
  int dev_bad[PD_MAX_DEVICES];   /* SRV_DEV_* */
  bool dev_long[PD_MAX_DEVICES]; /* "a long kernel" logged for this wait */
  /* Why progress fails, as the last check found: SRV_CAUSE_* bits. */
  atomic_int cause;
  /* The test hook (PARADEV_TEST_HOLD): a file whose existence holds device
   * 0's executor; NULL when off. */
  const char *hold_file;
  bool held;
};

int srv_health_init(srv *s) {
  srv_health *h = calloc(1, sizeof(*h));
  if (!h) return -1;
  pthread_mutex_init(&h->mu, NULL);
  for (int i = 0; i < PD_MAX_DEVICES; i++) h->dev_ok[i] = true;
  h->live = true; /* as the gauges start: an alive process */
  const char *hold = getenv("PARADEV_TEST_HOLD");
  if (hold && hold[0]) {
    h->hold_file = hold;
    SRV_WARN(
        "test hook PARADEV_TEST_HOLD is set: device 0's executor runs "
        "nothing while %s exists (for tests of stall detection only)",
        hold);
  }
  s->health = h;
  atomic_store(&s->devices_ok, true);
  return 0;
}

void srv_health_destroy(srv *s) {
  srv_health *h = s->health;
  if (!h) return;
  free(h->watch);
  pthread_mutex_destroy(&h->mu);
  free(h);
  s->health = NULL;
}

bool srv_alive(srv *s) {
  return atomic_load(&s->devices_ok) && !atomic_load(&s->stalled);
}

bool srv_serving(srv *s) {
  /* A mesh (issue #16): only while it is formed and whole. */
  return atomic_load(&s->ready) && !atomic_load(&s->draining) &&
         srv_alive(s) &&
         (!s->mesh || (srv_mesh_formed(s->mesh) && !srv_mesh_degraded(s->mesh)));
}

const char *srv_liveness_cause(srv *s) {
  if (!atomic_load(&s->devices_ok)) return "unhealthy: a device failed";
  if (!atomic_load(&s->stalled)) return NULL;
  int cause = s->health ? atomic_load(&s->health->cause) : 0;
  switch (cause) {
    case SRV_CAUSE_WEDGED:
      return "wedged: a kernel has run past kernel_timeout_seconds without "
             "finishing or a heartbeat";
    case SRV_CAUSE_WEDGED | SRV_CAUSE_STALLED:
      return "wedged and stalled: a kernel has run past "
             "kernel_timeout_seconds without finishing or a heartbeat, and "
             "runnable work makes no progress";
    default: return "stalled: runnable work makes no progress";
  }
}

static const char *srv_why_not(srv *s) {
  if (!atomic_load(&s->devices_ok)) return "a device is unhealthy";
  if (atomic_load(&s->stalled)) return srv_liveness_cause(s);
  if (!atomic_load(&s->ready)) return "not ready";
  if (s->mesh && srv_mesh_degraded(s->mesh))
    return "the mesh is degraded (a rank was lost; see the mesh log lines)";
  if (s->mesh && !srv_mesh_formed(s->mesh))
    return "the mesh is not formed (ranks missing, or the coordinator gone)";
  return atomic_load(&s->exiting) ? "draining to exit" : "draining";
}

void srv_health_update(srv *s) {
  srv_health *h = s->health;
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  bool ready = srv_serving(s), live = srv_alive(s);
  bool changed = ready != h->serving || live != h->live;
  if (live != h->live) {
    h->live = live;
    if (live)
      SRV_INFO("liveness SERVING");
    else
      SRV_ERROR("liveness NOT_SERVING: %s", srv_why_not(s));
  }
  if (ready != h->serving) {
    h->serving = ready;
    if (ready)
      SRV_INFO("SERVING");
    else
      SRV_INFO("NOT_SERVING: %s", srv_why_not(s));
  }
  if (changed)
    for (size_t i = 0; i < h->n; i++) srv_call_wake(h->watch[i]);
  pthread_mutex_unlock(&h->mu);
}

void srv_health_close(srv *s) {
  srv_health *h = s->health;
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  h->closing = true;
  for (size_t i = 0; i < h->n; i++) srv_call_wake(h->watch[i]);
  pthread_mutex_unlock(&h->mu);
}

bool srv_devices_healthy(srv *s) {
  int n = dev_engine_num_devices(s->engine);
  bool all = true;
  srv_health *h = s->health;
  for (int i = 0; i < n && i < PD_MAX_DEVICES; i++) {
    bool ok = dev_engine_device_healthy(s->engine, i);
    all &= ok;
    if (h && ok != h->dev_ok[i]) {
      h->dev_ok[i] = ok;
      if (ok)
        SRV_INFO("device %d (%s) is healthy again", i,
                 dev_engine_device_name(s->engine, i));
      else
        SRV_ERROR(
            "device %d (%s) is unhealthy: its ops fail until paradevd "
            "restarts",
            i, dev_engine_device_name(s->engine, i));
    }
  }
  return all;
}

uint64_t srv_device_memory_used(srv *s) {
  uint64_t sum = 0;
  int n = dev_engine_num_devices(s->engine);
  for (int i = 0; i < n; i++) {
    dev_memory_stats ms = {.struct_size = sizeof(ms)};
    if (dev_engine_memory_stats(s->engine, i, &ms, NULL) == PD_OK)
      sum += ms.bytes_in_use;
  }
  return sum;
}

bool srv_drain(srv *s, bool exit) {
  bool was = atomic_exchange(&s->draining, true);
  if (exit) atomic_store(&s->exiting, true);
  srv_health_update(s);
  return !was;
}

bool srv_resume(srv *s) {
  if (atomic_load(&s->exiting) || !atomic_load(&s->draining)) return false;
  atomic_store(&s->draining, false);
  srv_health_update(s);
  return true;
}

bool srv_health_watch_add(srv *s, srv_call *c, bool *listed) {
  srv_health *h = s->health;
  *listed = false;
  pthread_mutex_lock(&h->mu);
  bool closing = h->closing;
  if (!closing && h->n == h->cap) {
    size_t ncap = h->cap ? h->cap * 2 : 8;
    srv_call **nw = realloc(h->watch, ncap * sizeof(*nw));
    if (nw) {
      h->watch = nw;
      h->cap = ncap;
    }
  }
  if (!closing && h->n < h->cap) {
    srv_call_ref(c);
    h->watch[h->n++] = c;
    *listed = true;
  }
  pthread_mutex_unlock(&h->mu);
  return !closing;
}

void srv_health_watch_remove(srv *s, srv_call *c) {
  srv_health *h = s->health;
  pthread_mutex_lock(&h->mu);
  for (size_t i = 0; i < h->n; i++)
    if (h->watch[i] == c) {
      h->watch[i] = h->watch[--h->n];
      break;
    }
  pthread_mutex_unlock(&h->mu);
  srv_call_unref(c); /* the list's */
}

bool srv_health_closing(srv *s) {
  srv_health *h = s->health;
  pthread_mutex_lock(&h->mu);
  bool closing = h->closing;
  pthread_mutex_unlock(&h->mu);
  return closing;
}

/* --- progress: what liveness means by "not wedged" ------------------------ */

/* The test hook: holds device 0's executor while the file exists. */
static void srv_test_hold(srv *s, srv_health *h) {
  if (!h->hold_file) return;
  struct stat sb;
  bool hold = stat(h->hold_file, &sb) == 0;
  if (hold == h->held) return;
  h->held = hold;
  dev_engine_test_hold(s->engine, 0, hold);
  SRV_WARN("test hook: device 0's executor %s", hold ? "held" : "released");
}

/* Logs device d's change of state (SRV_DEV_*) and returns the new one. */
static int srv_device_verdict(srv *s, srv_health *h, int d, double quiet) {
  const dev_progress *p = &h->prog[d];
  double stall = (double)SRV_RT(s, stall_timeout_s);
  double bound = (double)SRV_RT(s, kernel_timeout_s);
  int bad = SRV_DEV_OK;
  if (p->state == DEV_PROGRESS_WAITING && quiet > stall)
    bad = SRV_DEV_STALLED;
  else if (p->state == DEV_PROGRESS_RUNNING && bound > 0 && quiet > bound)
    bad = SRV_DEV_WEDGED;
  const char *name = dev_engine_device_name(s->engine, d);
  bool long_op = p->state == DEV_PROGRESS_RUNNING && quiet > stall;
  if (long_op && !h->dev_long[d] && bad == SRV_DEV_OK)
    SRV_INFO(
        "device %d (%s): one op has run for over %.0f s "
        "(stall_timeout_seconds): a long kernel (or a collective waiting "
        "for its peers), not a stall; "
        "kernel_timeout_seconds (%.0f s%s) bounds it",
        d, name, stall, bound, bound > 0 ? "" : ": off");
  h->dev_long[d] = long_op;
  if (bad == h->dev_bad[d]) return bad;
  if (bad == SRV_DEV_STALLED)
    SRV_ERROR(
        "device %d (%s): ops are queued on it but its executor has "
        "started none for %.0f s (stall_timeout_seconds): stalled",
        d, name, quiet);
  else if (bad == SRV_DEV_WEDGED)
    SRV_ERROR(
        "device %d (%s): one op's kernel has run %.0f s without "
        "finishing or a heartbeat (kernel_timeout_seconds %.0f): "
        "wedged",
        d, name, quiet, bound);
  else
    SRV_INFO("device %d (%s) makes progress again", d, name);
  h->dev_bad[d] = bad;
  return bad;
}

bool srv_progress_check(srv *s, double now) {
  srv_health *h = s->health;
  srv_test_hold(s, h);
  double stall = (double)SRV_RT(s, stall_timeout_s);
  bool stalled = sched_check_progress(s->sched, &h->sched_prog, now, stall);
  if (stalled != h->sched_stalled) {
    h->sched_stalled = stalled;
    if (stalled)
      SRV_ERROR(
          "ops are queued and none was dispatched for %.0f s "
          "(stall_timeout_seconds): the scheduler is stalled",
          stall);
    else
      SRV_INFO("the scheduler dispatches again");
  }
  int cause = stalled ? SRV_CAUSE_STALLED : 0;
  int n = dev_engine_num_devices(s->engine);
  for (int d = 0; d < n && d < PD_MAX_DEVICES; d++) {
    double quiet = dev_engine_watch(s->engine, d, &h->prog[d], now);
    atomic_store(&s->dev_quiet_ms[d], (uint64_t)(quiet * 1000));
    int bad = srv_device_verdict(s, h, d, quiet);
    if (bad == SRV_DEV_STALLED) cause |= SRV_CAUSE_STALLED;
    if (bad == SRV_DEV_WEDGED) cause |= SRV_CAUSE_WEDGED;
  }
  atomic_store(&h->cause, cause);
  return cause != 0;
}

/* --- drain: no new work ---------------------------------------------------- */

pd_code srv_check_accepting(srv *s, const char *what, dev_status *st) {
  if (!atomic_load(&s->draining)) return PD_OK;
  if (atomic_load(&s->exiting))
    return dev_error(
        st, PD_UNAVAILABLE,
        "paradevd is draining (shutting down): it takes no new work (%s); "
        "the work already queued finishes. Download your results (Download, "
        "Sync, Describe still work), close the session, and retry on a "
        "daemon that is serving",
        what);
  return dev_error(
      st, PD_UNAVAILABLE,
      "paradevd is draining for maintenance: it takes no new work (%s); the "
      "work already queued finishes. Download your results (Download, Sync, "
      "Describe still work), close the session, and continue on another "
      "daemon or retry once this one is back in service",
      what);
}
