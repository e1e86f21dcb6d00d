/* Counters for the metrics endpoint and the watchdog: sessions and ops by
 * outcome, the latency histogram, per-op counts and run time, progress.
 * Everything here is atomics or short reads under the table's locks. */
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

const double sched_latency_bounds[SCHED_LATENCY_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};

static int sched_op_name_cmp(const void *a, const void *b) {
  return strcmp(((const sched_op_name *)a)->name,
                ((const sched_op_name *)b)->name);
}

bool sched_stats_init(sched *s) {
  s->num_ops = dev_op_count();
  s->op_names = calloc((size_t)s->num_ops + 1, sizeof(*s->op_names));
  s->op_stats = calloc((size_t)s->num_ops + 1, sizeof(*s->op_stats));
  if (!s->op_names || !s->op_stats) {
    sched_stats_free(s);
    return false;
  }
  for (int i = 0; i < s->num_ops; i++) {
    const dev_op_def *d = dev_op_at(i);
    s->op_names[i] = (sched_op_name){dev_op_def_name(d), i};
  }
  qsort(s->op_names, (size_t)s->num_ops, sizeof(*s->op_names),
        sched_op_name_cmp);
  return true;
}

void sched_stats_free(sched *s) {
  free(s->op_names);
  free(s->op_stats);
  s->op_names = NULL;
  s->op_stats = NULL;
}

int sched_op_index(const sched *s, const char *name) {
  sched_op_name key = {name, 0};
  const sched_op_name *e = bsearch(&key, s->op_names, (size_t)s->num_ops,
                                   sizeof(key), sched_op_name_cmp);
  return e ? e->index : -1;
}

void sched_count_outcome(sched *s, int op_index, pd_code code) {
  if (op_index < 0) return;
  unsigned c = (unsigned)code < SCHED_NUM_CODES ? (unsigned)code : PD_UNKNOWN;
  atomic_fetch_add_explicit(&s->op_stats[op_index].by_code[c], 1,
                            memory_order_relaxed);
}

uint64_t sched_count_done(sched *s, const sched_qop *q, pd_code code,
                          bool timed) {
  uint64_t now = sched_now_ns();
  double lat = (double)(now - q->t_enq_ns) * 1e-9;
  int b = 0;
  while (b < SCHED_LATENCY_BUCKETS && lat > sched_latency_bounds[b]) b++;
  atomic_fetch_add_explicit(&s->lat_buckets[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->lat_sum_ns, now - q->t_enq_ns,
                            memory_order_relaxed);
  sched_count_outcome(s, q->op_index, code);
  if (q->op_index >= 0)
    atomic_fetch_add_explicit(&s->op_stats[q->op_index].run_ns,
                              now - q->t_sub_ns, memory_order_relaxed);
  if (s->hooks.cost || !timed) return q->est_ns;
  int n = dev_engine_num_devices(s->engine);
  uint64_t dev =
      __atomic_load_n(&q->dev_ns, __ATOMIC_RELAXED) / (uint64_t)(n > 0 ? n : 1);
  if (q->op_index >= 0 && q->model_ns > 0) {
    sched_op_counter *c = &s->op_stats[q->op_index];
    atomic_fetch_add_explicit(&c->model_ns, q->model_ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->device_ns, dev, memory_order_relaxed);
  }
  return dev;
}

/* Completions of one op needed before its measured time calibrates the
 * model: 1 ms of modelled time. */
#define SCHED_CALIBRATE_MIN_NS 1000000ull

uint64_t sched_estimate_ns(sched *s, const dev_op *op, int op_index,
                           uint64_t *model_ns) {
  *model_ns = 0;
  if (s->hooks.cost) {
    uint64_t c = s->hooks.cost(s->hooks.arg, op);
    return c ? c : 1;
  }
  dev_op_cost cost = DEV_OP_COST_INITIALIZER;
  if (dev_op_estimate(op, &cost, NULL) != PD_OK) return 1;
  *model_ns = cost.time_ns ? cost.time_ns : 1;
  double est = (double)*model_ns;
  if (op_index >= 0) {
    sched_op_counter *c = &s->op_stats[op_index];
    uint64_t m = atomic_load_explicit(&c->model_ns, memory_order_relaxed);
    uint64_t d = atomic_load_explicit(&c->device_ns, memory_order_relaxed);
    if (m >= SCHED_CALIBRATE_MIN_NS) {
      double r = (double)d / (double)m;
      est *= r < 0.01 ? 0.01 : r > 1000 ? 1000 : r;
    }
  }
  return est < 1 ? 1 : (uint64_t)est;
}

void sched_session_counts(sched_session *ss, uint64_t *handles,
                          uint64_t *bytes) {
  if (pthread_mutex_trylock(&ss->mu) == 0) {
    atomic_store(&ss->seen_handles, (uint64_t)ss->handles.live);
    atomic_store(&ss->seen_bytes, ss->bytes);
    pthread_mutex_unlock(&ss->mu);
  }
  *handles = atomic_load(&ss->seen_handles);
  *bytes = atomic_load(&ss->seen_bytes);
}

void sched_get_stats(sched *s, sched_stats *out) {
  sched_stats r;
  memset(&r, 0, sizeof(r));
  r.struct_size = sizeof(r);
  pthread_mutex_lock(&s->mu);
  r.sessions = s->num_sessions;
  /* Never waits for a session's lock under the table's: a call may hold
   * it for long (an instantiation), and everything else needs sched.mu. */
  for (sched_session *ss = s->sessions; ss; ss = ss->next) {
    uint64_t h, b;
    sched_session_counts(ss, &h, &b);
    r.handles += h;
    r.bytes += b;
  }
  pthread_mutex_unlock(&s->mu);
  r.sessions_created = atomic_load(&s->n_created);
  r.sessions_closed = atomic_load(&s->n_closed);
  r.sessions_expired = atomic_load(&s->n_expired);
  r.sessions_killed = atomic_load(&s->n_killed);
  r.ops_queued = atomic_load(&s->n_queued);
  /* Completed before submitted: in_flight is never negative. */
  r.ops_completed = atomic_load(&s->n_completed);
  r.ops_submitted = atomic_load(&s->n_submitted);
  r.ops_in_flight = r.ops_submitted - r.ops_completed;
  r.ops_dropped = atomic_load(&s->n_dropped);
  r.ops_expired = atomic_load(&s->n_expired_ops);
  uint64_t cum = 0;
  for (int b = 0; b <= SCHED_LATENCY_BUCKETS; b++) {
    cum += atomic_load_explicit(&s->lat_buckets[b], memory_order_relaxed);
    r.latency_buckets[b] = cum;
  }
  r.latency_sum_s = (double)atomic_load(&s->lat_sum_ns) * 1e-9;
  *out = r;
}

void sched_op_stats(sched *s, int op_index, uint64_t by_code[SCHED_NUM_CODES],
                    double *run_seconds) {
  if (op_index < 0 || op_index >= s->num_ops) {
    memset(by_code, 0, sizeof(uint64_t) * SCHED_NUM_CODES);
    if (run_seconds) *run_seconds = 0;
    return;
  }
  sched_op_counter *c = &s->op_stats[op_index];
  for (int i = 0; i < SCHED_NUM_CODES; i++)
    by_code[i] = atomic_load_explicit(&c->by_code[i], memory_order_relaxed);
  if (run_seconds) *run_seconds = (double)atomic_load(&c->run_ns) * 1e-9;
}

bool sched_check_progress(sched *s, sched_progress *p, double now,
                          double stall_s) {
  /* A load's progress counts: ops held on it are queued, not stalled. An
   * op submitted or completed is progress too. Ops on the devices are the
   * engine's to watch (dev_engine_watch: a long kernel is not a stall), so
   * the scheduler only waits while it has queued ops and none out. */
  uint64_t done = atomic_load(&s->n_completed);
  uint64_t submitted = atomic_load(&s->n_submitted);
  uint64_t completed = done + submitted + atomic_load(&s->n_load_steps);
  bool outstanding = atomic_load(&s->n_queued) > 0 && submitted == done;
  bool stalled = false;
  if (!outstanding || !p->outstanding || completed != p->completed)
    p->since = now; /* idle, new work, or progress: the wait starts again */
  else
    stalled = now - p->since > stall_s;
  p->completed = completed;
  p->outstanding = outstanding;
  return stalled;
}
