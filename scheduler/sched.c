/* The scheduler's life: creating it (limits, counters, locks, the lease and
 * dispatcher threads), reconfiguring its limits, holding the dispatcher, and
 * destroying it (stopping the threads, dropping what is queued, ending every
 * open session as SCHED_END_STOPPED, waiting for the ops on the devices). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

static bool sched_config_valid(const sched_config *cfg) {
  return cfg->load_workers >= 0 && cfg->load_workers <= 64 &&
         cfg->default_lease_s != 0 &&
         cfg->max_lease_s >= cfg->default_lease_s && cfg->max_sessions > 0 &&
         cfg->max_handles_per_session > 0 && cfg->max_ops_per_request > 0 &&
         cfg->lease_check_ms != 0 && cfg->max_queued_ops > 0 &&
         (cfg->policy == SCHED_POLICY_FAIR ||
          cfg->policy == SCHED_POLICY_ROUND_ROBIN) &&
         (cfg->max_memory_quota == 0 ||
          cfg->default_memory_quota <= cfg->max_memory_quota);
}

static void sched_set_limits(sched *s, const sched_config *cfg) {
  sched_limits *l = &s->lim;
  atomic_store(&l->default_lease_s, cfg->default_lease_s);
  atomic_store(&l->max_lease_s, cfg->max_lease_s);
  atomic_store(&l->max_sessions, cfg->max_sessions);
  atomic_store(&l->max_handles, cfg->max_handles_per_session);
  atomic_store(&l->max_ops, cfg->max_ops_per_request);
  atomic_store(&l->max_queued, cfg->max_queued_ops);
  atomic_store(&l->default_quota, cfg->default_memory_quota);
  atomic_store(&l->max_quota, cfg->max_memory_quota);
  atomic_store(&l->dispatch_ahead_ns, cfg->dispatch_ahead_ns);
  atomic_store(&l->max_queued_device_ns, cfg->max_queued_device_ns);
}

#define SCHED_CONFIG_RULES                                                     \
  "every limit must be positive, default_lease_s <= max_lease_s, and "         \
  "default_memory_quota <= max_memory_quota when a maximum is set, and "       \
  "load_workers 0 (the default, 2) to 64, and policy SCHED_POLICY_FAIR or "    \
  "SCHED_POLICY_ROUND_ROBIN"

static pd_code sched_check_size(const sched_config *cfg, dev_status *st) {
  if (cfg->struct_size != sizeof(sched_config))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_config.struct_size is %zu, expected %zu",
                     cfg->struct_size, sizeof(sched_config));
  return PD_OK;
}

pd_code sched_reconfigure(sched *s, const sched_config *cfg, dev_status *st) {
  if (!cfg)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_config.struct_size is %zu, expected %zu", (size_t)0,
                     sizeof(sched_config));
  PD_TRY(sched_check_size(cfg, st));
  sched_config c = *cfg;
  c.lease_check_ms = s->cfg.lease_check_ms;
  if (!sched_config_valid(&c))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_config: " SCHED_CONFIG_RULES);
  sched_set_limits(s, &c);
  /* A dispatcher waiting for room ahead re-reads dispatch_ahead_ns. */
  pthread_mutex_lock(&s->qmu);
  pthread_cond_broadcast(&s->qcv);
  pthread_mutex_unlock(&s->qmu);
  return PD_OK;
}

static void sched_locks_init(sched *s) {
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&s->qmu, NULL);
  pthread_cond_init(&s->qcv, NULL);
  pthread_cond_init(&s->dcv, NULL);
  pthread_mutex_init(&s->done_mu, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  pthread_mutex_init(&s->io_mu, NULL);
  pthread_cond_init(&s->io_cv, NULL);
  pthread_cond_init(&s->io_idle_cv, NULL);
  atomic_init(&s->dl_next_ns, UINT64_MAX); /* no queued op has a deadline */
  pthread_mutex_init(&s->qop_mu, NULL);
}

static void sched_locks_destroy(sched *s) {
  sched_qop_pool_free(s);
  pthread_mutex_destroy(&s->qop_mu);
  pthread_cond_destroy(&s->io_idle_cv);
  pthread_cond_destroy(&s->io_cv);
  pthread_mutex_destroy(&s->io_mu);
  pthread_cond_destroy(&s->done_cv);
  pthread_mutex_destroy(&s->done_mu);
  pthread_cond_destroy(&s->dcv);
  pthread_cond_destroy(&s->qcv);
  pthread_mutex_destroy(&s->qmu);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
}

static void sched_stop_lease_thread(sched *s) {
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->lease_thread, NULL);
}

/* Stops the dispatcher; returns the fence requests it did not reach. */
static sched_fence_req *sched_stop_dispatcher(sched *s) {
  pthread_mutex_lock(&s->qmu);
  s->qstop = true;
  pthread_cond_broadcast(&s->qcv);
  sched_fence_req *f = s->fences;
  s->fences = NULL;
  pthread_mutex_unlock(&s->qmu);
  pthread_join(s->dispatch_thread, NULL);
  return f;
}

pd_code sched_create(dev_engine *e, const sched_config *cfg, sched **out,
                     dev_status *st) {
  if (!e || !cfg || !out)
    return dev_error(st, PD_INVALID_ARGUMENT, "sched_create: NULL argument");
  PD_TRY(sched_check_size(cfg, st));
  if (!sched_config_valid(cfg))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_config: " SCHED_CONFIG_RULES);
  sched *s = calloc(1, sizeof(*s));
  if (!s) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  s->engine = e;
  s->cfg = *cfg;
  sched_set_limits(s, cfg);
  s->next_seq = 1;
  sched_policy_init(&s->ready, cfg->policy == SCHED_POLICY_ROUND_ROBIN);
  if (!sched_stats_init(s)) {
    free(s);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  sched_locks_init(s);
  atomic_init(&s->next_tag, 1);
  int rc = pthread_create(&s->lease_thread, NULL, sched_lease_main, s);
  if (rc != 0) goto fail_lease;
  rc = pthread_create(&s->dispatch_thread, NULL, sched_dispatch_main, s);
  if (rc != 0) goto fail_dispatch;
  if (!sched_workers_start(s, cfg->load_workers > 0 ? cfg->load_workers : 2)) {
    rc = EAGAIN;
    goto fail_workers;
  }
  *out = s;
  return PD_OK;

fail_workers:
  sched_cancel_fences(sched_stop_dispatcher(s));
fail_dispatch:
  sched_stop_lease_thread(s);
fail_lease:
  sched_locks_destroy(s);
  sched_stats_free(s);
  free(s);
  return dev_error(st, PD_INTERNAL, "cannot start the scheduler's threads: %s",
                   strerror(rc));
}

/* Drops the queues of the sessions the dispatcher did not reach (it is
 * gone) and the ready set's references. */
static void sched_drain_ready(sched *s) {
  for (;;) {
    int budget = 0;
    uint64_t budget_ns = 0;
    pthread_mutex_lock(&s->qmu);
    sched_session *ss =
        sched_policy_pick(&s->ready, &budget, &budget_ns, NULL, NULL);
    if (ss) ss->in_ready = false;
    pthread_mutex_unlock(&s->qmu);
    if (!ss) return;
    sched_drop_queue(ss, PD_CANCELLED, "the daemon shut down before the op ran");
    sched_session_put(ss);
  }
}

/* Ends every session still in the table (the engine still runs, so
 * observers may use it). */
static void sched_end_all(sched *s) {
  pthread_mutex_lock(&s->mu);
  sched_session *open = s->sessions;
  s->sessions = NULL;
  s->num_sessions = 0;
  pthread_mutex_unlock(&s->mu);
  while (open) {
    sched_session *ss = open;
    open = ss->next;
    ss->next = NULL;
    sched_end_session(ss, SCHED_END_STOPPED, PD_CANCELLED,
                      "the daemon shut down before the op ran", NULL);
    sched_session_put(ss); /* the table's reference */
  }
}

void sched_destroy(sched *s) {
  if (!s) return;
  sched_stop_lease_thread(s);
  sched_cancel_fences(sched_stop_dispatcher(s));
  sched_drain_ready(s);
  sched_end_all(s);
  /* Loads and saves end (cancelled) before the workers stop. */
  sched_workers_stop(s);
  /* Ops on the devices still report their completion here. */
  pthread_mutex_lock(&s->done_mu);
  atomic_store(&s->done_waiting, true); /* from now on completions wake us */
  while (atomic_load(&s->n_completed) < atomic_load(&s->n_submitted)) {
    /* Timed: a completion that read done_waiting false just before it was
     * set counts without waking us (dispatch.c sched_op_done). */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* done_cv's clock */
    ts.tv_nsec += 1000000;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->done_cv, &s->done_mu, &ts);
  }
  pthread_mutex_unlock(&s->done_mu);
  sched_tenants_free(s);
  sched_locks_destroy(s);
  sched_stats_free(s);
  free(s);
}

void sched_set_test_hooks(sched *s, const sched_test_hooks *h) {
  pthread_mutex_lock(&s->qmu);
  s->hooks = *h;
  pthread_mutex_unlock(&s->qmu);
}

void sched_pause(sched *s, bool paused) {
  pthread_mutex_lock(&s->qmu);
  s->paused = paused;
  pthread_cond_broadcast(&s->qcv);
  pthread_mutex_unlock(&s->qmu);
}
