/* Sharing the devices (issue #15): one high-priority session sending small
 * ops at a fixed rate while 3 best-effort sessions send large ops back to
 * back, on the scheduler over a CPU engine, in one process (no RPC: what is
 * measured is the dispatcher's policy, not the wire).
 *
 *  hp_p50_us / hp_p99_us  the high-priority op's latency (Execute to
 *                         computed), under load, beside the same alone
 *  be_ops_per_s           the best-effort sessions' MatMuls per second under
 *                         fair share, beside round-robin dispatch (the old
 *                         policy: sched_config.policy ROUND_ROBIN, nothing
 *                         bounded ahead) with the same load
 *  jain_index             Jain's fairness index of the best-effort sessions'
 *                         served ops (equal weights, equal ops): 1 is fair
 *  max_lag_ops            the largest gap in ops submitted between two
 *                         best-effort sessions while both had ops queued,
 *                         in units of the largest op (the submitted hook of
 *                         sched_int.h counts them on the dispatcher thread)
 *  hp_p99_us (rr)         the high-priority latency under round-robin, for
 *                         comparison
 *
 * Each figure is the median of interleaved repetitions (alone, fair,
 * round-robin, again). The CPU "devices" are threads on the same cores as
 * the clients and the dispatcher, so on a small shared machine the figures
 * include the OS's scheduling of those threads; a GPU's do not.
 *
 * Usage: bench_sched [--quick]; PARADEV_BENCH_SCHED_AHEAD_US sets the
 * fair runs' dispatch_ahead (default 50 us: about five of the MatMuls).
 * Results: a table and JSON lines, bench "sched" (benchutil.h). Exit
 * status 1 if an op failed. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "benchutil.h"
#include "sched_int.h"

#define DEVICES 2
#define BE_SESSIONS 3
#define BE_DEPTH 8 /* ops each best-effort session keeps outstanding */
#define BE_N 96    /* MatMul [96,96] x [96,96]: 1.8 MFLOP per device */
#define HP_N 64    /* Add of [64] vectors */
#define HP_PERIOD_US 2000
static int AHEAD_US = 50; /* dispatch_ahead for the fair runs */

static atomic_int g_failed;

typedef struct be_arg {
  sched_session *ss;
  atomic_bool stop;
  _Atomic uint64_t done; /* ops computed */
} be_arg;

/* The submitted hook: the largest service lag between best-effort sessions,
 * in device time charged by the policy (estimates at dispatch, corrected by
 * the measured time of completed ops: sched_policy_node.served_ns), over
 * intervals in which every one had ops queued (a session that drains is not
 * backlogged, so the lag starts again from its current service when one is
 * found empty). served_ns and qlen are read without qmu: a benchmark's
 * estimate. In units of the
 * largest best-effort op as measured (sched_account.largest_ns: on a
 * shared CPU host an op whose executor thread was preempted counts its
 * whole wall time, as a device it occupied). Dispatcher thread only. */
typedef struct lag_watch {
  atomic_bool counting;
  sched_session *be[BE_SESSIONS];
  double base[BE_SESSIONS];
  double max_lag_ns;
  double largest_ns;
} lag_watch;

static void on_submit(void *arg, sched_session *ss, const dev_op *op,
                      uint64_t est_ns) {
  (void)op;
  lag_watch *w = arg;
  if (!atomic_load_explicit(&w->counting, memory_order_relaxed)) return;
  int i = 0;
  while (i < BE_SESSIONS && w->be[i] != ss) i++;
  if (i == BE_SESSIONS) return;
  (void)est_ns;
  bool all_backlogged = true;
  for (int k = 0; k < BE_SESSIONS; k++)
    all_backlogged &=
        k == i || __atomic_load_n(&w->be[k]->qlen, __ATOMIC_RELAXED) > 0;
  double lo = INFINITY, hi = -INFINITY;
  for (int k = 0; k < BE_SESSIONS; k++) {
    double big = (double)atomic_load(&w->be[k]->pol.acct->largest_ns);
    if (big > w->largest_ns) w->largest_ns = big;
    double v = (double)w->be[k]->pol.served_ns;
    if (!all_backlogged) w->base[k] = v;
    v -= w->base[k];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  if (hi - lo > w->max_lag_ns) w->max_lag_ns = hi - lo;
}

static sched_session *open_session(sched *s, int priority) {
  sched_session_params p = {"bench", "sched", 0, 0, NULL, priority, 1, 0, NULL, NULL};
  sched_session_info info;
  sched_session *ss = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (sched_session_create(s, &p, &info, &st) != PD_OK ||
      sched_session_open(s, info.token, SCHED_TOKEN_BYTES, &ss, &st) != PD_OK) {
    fprintf(stderr, "bench_sched: %s\n", st.msg);
    exit(1);
  }
  return ss;
}

static void upload(sched_session *ss, uint64_t id, int rank, int64_t n) {
  dev_shape shape = {rank, {n, n}};
  size_t elems = rank == 2 ? (size_t)(n * n) : (size_t)n;
  float *v = bu_xmalloc(elems * sizeof *v);
  for (size_t i = 0; i < elems; i++) v[i] = (float)(i % 7) * 0.25f;
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  sched_upload *u = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (sched_upload_begin(ss, id, PD_FLOAT32, &lay, &shape, NULL, &u, &st) !=
          PD_OK ||
      sched_upload_write(u, 0, 0, v, elems * sizeof *v, &st) != PD_OK ||
      sched_upload_commit(u, &st) != PD_OK) {
    fprintf(stderr, "bench_sched: upload: %s\n", st.msg);
    exit(1);
  }
  free(v);
}

/* One op `name`(1, 2) -> id. */
static bool exec_op(sched_session *ss, const char *name, uint64_t id) {
  static const uint64_t in[2] = {1, 2};
  sched_op op = {name, in, 2, NULL, 0, &id, 1, 0, 0, NULL};
  sched_op_result res;
  int failed = 0;
  dev_status st = DEV_STATUS_INIT;
  if (sched_execute(ss, &op, 1, 0, &res, &failed, &st) != PD_OK) {
    fprintf(stderr, "bench_sched: %s: %s\n", name, st.msg);
    atomic_store(&g_failed, 1);
    return false;
  }
  return true;
}

/* Waits for handle id and deletes it. */
static void finish(sched_session *ss, uint64_t id) {
  dev_tensor *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (sched_handle_get(ss, id, &t, &st) != PD_OK ||
      sched_tensor_wait(ss, t, &st) != PD_OK) {
    fprintf(stderr, "bench_sched: wait: %s\n", st.msg);
    atomic_store(&g_failed, 1);
  }
  dev_tensor_release(t);
  sched_handle_delete(ss, &id, 1, NULL);
}

/* A best-effort session: MatMuls back to back, BE_DEPTH outstanding. */
static void *be_main(void *p) {
  be_arg *a = p;
  uint64_t next = 100, oldest = 100;
  while (!atomic_load(&a->stop) && !atomic_load(&g_failed)) {
    if (next - oldest == BE_DEPTH) {
      finish(a->ss, oldest++);
      atomic_fetch_add(&a->done, 1);
    }
    if (!exec_op(a->ss, "MatMul", next++)) break;
  }
  while (oldest < next) finish(a->ss, oldest++);
  return NULL;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

typedef struct run_result {
  double p50_us, p99_us;
  double be_ops_per_s;
  double jain;
  double max_lag_ops;
} run_result;

static void sleep_until(double t) {
  double now = bu_now();
  if (t <= now) return;
  struct timespec ts = {(time_t)(t - now),
                        (long)((t - now - (double)(time_t)(t - now)) * 1e9)};
  nanosleep(&ts, NULL);
}

/* One run: `samples` high-priority ops at HP_PERIOD_US, with BE_SESSIONS
 * best-effort sessions (load) or without. */
static run_result run(dev_engine *e, int policy, bool load, int samples) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.policy = policy;
  cfg.dispatch_ahead_ns =
      policy == SCHED_POLICY_FAIR ? (uint64_t)AHEAD_US * 1000 : 0;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (sched_create(e, &cfg, &s, &st) != PD_OK) {
    fprintf(stderr, "bench_sched: %s\n", st.msg);
    exit(1);
  }
  static lag_watch w;
  memset(&w, 0, sizeof w);
  sched_test_hooks h = {NULL, on_submit, &w};
  sched_set_test_hooks(s, &h);
  sched_session *hp = open_session(s, 1);
  upload(hp, 1, 1, HP_N);
  upload(hp, 2, 1, HP_N);
  be_arg be[BE_SESSIONS];
  pthread_t th[BE_SESSIONS];
  int nbe = load ? BE_SESSIONS : 0;
  for (int i = 0; i < nbe; i++) {
    be[i].ss = open_session(s, 0);
    w.be[i] = be[i].ss;
    upload(be[i].ss, 1, 2, BE_N);
    upload(be[i].ss, 2, 2, BE_N);
    atomic_init(&be[i].stop, false);
    atomic_init(&be[i].done, 0);
    pthread_create(&th[i], NULL, be_main, &be[i]);
  }
  /* Warm up: let the load reach its steady state. */
  for (int k = 0; k < 20; k++) {
    exec_op(hp, "Add", 1000);
    finish(hp, 1000);
    sleep_until(bu_now() + HP_PERIOD_US * 1e-6);
  }
  uint64_t done0[BE_SESSIONS];
  for (int i = 0; i < nbe; i++) done0[i] = atomic_load(&be[i].done);
  atomic_store(&w.counting, true);
  double *lat = bu_xmalloc((size_t)samples * sizeof *lat);
  double t0 = bu_now();
  for (int k = 0; k < samples; k++) {
    sleep_until(t0 + k * HP_PERIOD_US * 1e-6);
    double a = bu_now();
    exec_op(hp, "Add", 2000 + (uint64_t)k);
    finish(hp, 2000 + (uint64_t)k);
    lat[k] = (bu_now() - a) * 1e6;
  }
  double t1 = bu_now();
  atomic_store(&w.counting, false);
  run_result r = {0};
  double sum = 0, sq = 0;
  for (int i = 0; i < nbe; i++) {
    double x = (double)(atomic_load(&be[i].done) - done0[i]);
    sum += x;
    sq += x * x;
  }
  for (int i = 0; i < nbe; i++) atomic_store(&be[i].stop, true);
  for (int i = 0; i < nbe; i++) {
    pthread_join(th[i], NULL);
    sched_session_put(be[i].ss);
  }
  qsort(lat, (size_t)samples, sizeof *lat, cmp_double);
  r.p50_us = lat[samples / 2];
  r.p99_us = lat[(samples * 99) / 100];
  r.be_ops_per_s = sum / (t1 - t0);
  r.jain = nbe && sq > 0 ? sum * sum / (nbe * sq) : 1;
  r.max_lag_ops = w.largest_ns > 0 ? w.max_lag_ns / w.largest_ns : 0;
  free(lat);
  sched_session_put(hp);
  sched_destroy(s);
  return r;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define REPS_MAX 9

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  const char *ahead = getenv("PARADEV_BENCH_SCHED_AHEAD_US");
  if (ahead && atoi(ahead) > 0) AHEAD_US = atoi(ahead);
  int samples = quick ? 100 : 300, reps = quick ? 3 : 7;
  dev_engine_config ec = DEV_ENGINE_CONFIG_INITIALIZER;
  ec.num_devices = DEVICES;
  ec.blas_threads = 1; /* sgemm on the executor's own thread */
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_create(&ec, &e, &st) != PD_OK) {
    fprintf(stderr, "bench_sched: %s\n", st.msg);
    return 1;
  }
  /* Interleaved repetitions (alone, fair, round-robin, again), medians of
   * each figure: the ratios then hold from run to run on a shared machine
   * better than one long run of each. */
  double m[10][REPS_MAX];
  for (int r = 0; r < reps; r++) {
    run_result alone = run(e, SCHED_POLICY_FAIR, false, samples);
    run_result fair = run(e, SCHED_POLICY_FAIR, true, samples);
    run_result rr = run(e, SCHED_POLICY_ROUND_ROBIN, true, samples);
    double row[10] = {alone.p50_us,      alone.p99_us,    fair.p50_us,
                      fair.p99_us,       rr.p50_us,       rr.p99_us,
                      fair.be_ops_per_s, rr.be_ops_per_s, fair.jain,
                      fair.max_lag_ops};
    for (int k = 0; k < 10; k++) m[k][r] = row[k];
  }
  dev_engine_destroy(e);
  if (atomic_load(&g_failed)) return 1;
  double med[10];
  for (int k = 0; k < 10; k++) med[k] = median(m[k], reps);

  char params[320];
  snprintf(params, sizeof params,
           "\"devices\": %d, \"backend\": \"cpu\", \"be_sessions\": %d, "
           "\"be_op\": \"MatMul %dx%d\", \"hp_op\": \"Add [%d]\", "
           "\"hp_period_us\": %d, \"dispatch_ahead_us\": %d, "
           "\"samples\": %d, \"reps\": %d",
           DEVICES, BE_SESSIONS, BE_N, BE_N, HP_N, HP_PERIOD_US, AHEAD_US,
           samples, reps);
  bu_record("sched", params, "hp_p50_us", med[2], "hp_p50_alone_us", med[0]);
  bu_record("sched", params, "hp_p99_us", med[3], "hp_p99_alone_us", med[1]);
  bu_record("sched", params, "be_ops_per_s", med[6], "be_ops_per_s_round_robin",
            med[7]);
  bu_record("sched", params, "jain_index", med[8], NULL, 0);
  bu_record("sched", params, "max_lag_ops", med[9], NULL, 0);
  bu_record("sched", params, "hp_p50_us_round_robin", med[4], "hp_p50_alone_us",
            med[0]);
  bu_record("sched", params, "hp_p99_us_round_robin", med[5], "hp_p99_alone_us",
            med[1]);
  return bu_print_table();
}
