/* Fair share, priority bands, the dispatch-ahead bound and admission by
 * device time (issue #15): the policy alone with synthetic costs, then the
 * scheduler over a CPU engine with the cost hook of sched_int.h (every op's
 * estimate and charge fixed by the test, so the dispatch order depends on
 * the policy alone, never on timing) and the executors held where in-flight
 * ops must stay in flight (dev__exec_hold). Expected orders and bounds are
 * worked out by hand in each test from sched_policy.h's rules. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_int.h"
#include "sched_int.h"
#include "testutil.h"

#define NDEV 2
#define SLICE ((double)SCHED_FAIR_SLICE_NS)

static dev_engine *g_engine;

/* --- the policy alone ----------------------------------------------------- */

static sched_session *fake(int priority, uint32_t weight) {
  sched_session *ss = calloc(1, sizeof *ss);
  assert_non_null(ss);
  ss->priority = priority;
  ss->weight = weight;
  ss->devices.n = NDEV; /* the whole mesh: every fake contends with all */
  for (int d = 0; d < NDEV; d++) ss->devices.dev[d] = (uint8_t)d;
  assert_true(sched_policy_session_init(ss));
  return ss;
}

static void unfake(sched_session *ss) {
  sched_policy_session_fini(ss);
  free(ss);
}

/* One dispatcher turn over sessions whose every op costs cost[i] (indexed
 * by the session's pointer in ss[]): picks, takes ops within the budget as
 * dispatch.c does, charges, puts the session back. Returns its index. */
static int turn(sched_policy_queue *q, sched_session **ss, const uint64_t *cost,
                int n, double *served) {
  int ops = 0;
  uint64_t budget = 0;
  sched_session *p = sched_policy_pick(q, &ops, &budget, NULL, NULL);
  assert_non_null(p);
  int i = 0;
  while (ss[i] != p) i++;
  assert_true(i < n);
  uint64_t taken = 0;
  for (int k = 0; k < ops && (k == 0 || taken < budget); k++) taken += cost[i];
  served[i] += (double)taken;
  sched_policy_charge(q, p, taken, true);
  return i;
}

static void test_policy_weights_and_bound(void **state) {
  (void)state;
  sched_policy_queue q;
  sched_policy_init(&q, false);
  /* Weights 1, 3, 2 with ops of 50, 7 and 1 us: shares 1/6, 3/6, 2/6. */
  uint64_t cost[3] = {50000, 7000, 1000};
  uint32_t w[3] = {1, 3, 2};
  sched_session *ss[3];
  for (int i = 0; i < 3; i++) {
    ss[i] = fake(0, w[i]);
    sched_policy_ready(&q, ss[i]);
  }
  double served[3] = {0}, worst = 0;
  const double c = 50000;
  for (int t = 0; t < 3000; t++) {
    turn(&q, ss, cost, 3, served);
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++) {
        double lag = fabs(served[i] / w[i] - served[j] / w[j]);
        double bound = (c + SLICE) / w[i] + (c + SLICE) / w[j];
        assert_true(lag <= bound);
        if (lag / c > worst) worst = lag / c;
      }
  }
  /* Shares: within the bound of 1/6, 3/6, 2/6 of the total. */
  double total = served[0] + served[1] + served[2];
  for (int i = 0; i < 3; i++)
    assert_true(fabs(served[i] - total * w[i] / 6.0) <= 4 * (c + SLICE));
  printf("policy: largest lag %.2f largest ops\n", worst);
  for (int i = 0; i < 3; i++) unfake(ss[i]);
}

static void test_policy_lift_and_correction(void **state) {
  (void)state;
  sched_policy_queue q;
  sched_policy_init(&q, false);
  sched_session *a = fake(0, 1), *b = fake(0, 1);
  /* a runs alone 100 turns of 10 us: vtime 1 ms; b was idle at 0. */
  sched_policy_ready(&q, a);
  for (int i = 0; i < 100; i++) {
    int ops;
    uint64_t budget;
    assert_ptr_equal(sched_policy_pick(&q, &ops, &budget, NULL, NULL), a);
    assert_int_equal(budget, UINT64_MAX); /* alone in its band */
    sched_policy_charge(&q, a, 10000, i < 99);
  }
  assert_true(sched_policy_empty(&q));
  /* b becomes ready and is lifted to the band's virtual time (a's, 1 ms),
   * so it banked nothing: a and b then alternate from equal times. */
  sched_policy_ready(&q, b);
  assert_true(b->pol.vtime == 1000000.0);
  sched_policy_ready(&q, a);
  assert_true(a->pol.vtime == 1000000.0);
  sched_session *ss[2] = {a, b};
  uint64_t cost[2] = {10000, 10000};
  double served[2] = {0};
  for (int t = 0; t < 100; t++) turn(&q, ss, cost, 2, served);
  assert_true(fabs(served[0] - served[1]) <= 2 * (10000 + SLICE));
  /* A correction (the op really took 1 ms more) lands on a's vtime at the
   * next pick, so b is served until it has caught up. */
  double before = a->pol.vtime;
  sched_policy_correct(a->pol.acct, 1000000);
  int ops;
  uint64_t budget;
  sched_session *p = sched_policy_pick(&q, &ops, &budget, NULL, NULL);
  assert_true(a->pol.vtime == before + 1000000.0);
  assert_ptr_equal(p, b);
  /* b's budget: the gap to a, in b's device ns, plus the slice. */
  assert_true((double)budget >= a->pol.vtime - b->pol.vtime + SLICE - 1);
  sched_policy_charge(&q, b, 10000, true);
  unfake(a);
  unfake(b);
}

static void test_policy_bands_and_round_robin(void **state) {
  (void)state;
  sched_policy_queue q;
  sched_policy_init(&q, false);
  sched_session *lo = fake(-2, 100), *mid = fake(0, 1), *hi = fake(5, 1);
  sched_policy_ready(&q, lo);
  sched_policy_ready(&q, mid);
  sched_policy_ready(&q, hi);
  int ops;
  uint64_t budget;
  /* hi first however much it has had; then mid; lo only when both left. */
  for (int i = 0; i < 10; i++) {
    assert_ptr_equal(sched_policy_pick(&q, &ops, &budget, NULL, NULL), hi);
    sched_policy_charge(&q, hi, 1000000, i < 9);
  }
  assert_ptr_equal(sched_policy_pick(&q, &ops, &budget, NULL, NULL), mid);
  sched_policy_charge(&q, mid, 1000000, false);
  assert_ptr_equal(sched_policy_pick(&q, &ops, &budget, NULL, NULL), lo);
  sched_policy_charge(&q, lo, 1, false);
  assert_true(sched_policy_empty(&q));
  /* Round-robin: FIFO of sessions whatever their band, 64 ops a turn. */
  sched_policy_init(&q, true);
  sched_policy_ready(&q, lo);
  sched_policy_ready(&q, hi);
  sched_session *want[4] = {lo, hi, lo, hi};
  for (int i = 0; i < 4; i++) {
    assert_ptr_equal(sched_policy_pick(&q, &ops, &budget, NULL, NULL), want[i]);
    assert_int_equal(ops, SCHED_DISPATCH_BATCH);
    assert_int_equal(budget, UINT64_MAX);
    sched_policy_charge(&q, want[i], 5, i < 2);
  }
  assert_true(sched_policy_empty(&q));
  unfake(lo);
  unfake(mid);
  unfake(hi);
}

/* --- the scheduler over the CPU engine ------------------------------------ */

#define LOG_MAX 8192

/* The order ops went to the engine (the submitted hook). */
typedef struct sub_log {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n;
  uint64_t session[LOG_MAX];
  uint64_t cost[LOG_MAX];
} sub_log;

static sub_log g_log = {.mu = PTHREAD_MUTEX_INITIALIZER,
                        .cv = PTHREAD_COND_INITIALIZER};

/* An op's cost: 1 us per element of its output 0. */
static uint64_t cost_hook(void *arg, const dev_op *op) {
  (void)arg;
  const dev_shape *s = dev_tensor_shape(dev_op_output(op, 0));
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return (uint64_t)n * 1000u;
}

static void submitted_hook(void *arg, sched_session *ss, const dev_op *op,
                           uint64_t est_ns) {
  (void)op;
  sub_log *l = arg;
  pthread_mutex_lock(&l->mu);
  if (l->n < LOG_MAX) {
    l->session[l->n] = sched_session_seq(ss);
    l->cost[l->n] = est_ns;
    l->n++;
  }
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

/* Waits until `n` ops were submitted (fails after 60 s: a hang, not a
 * timing threshold). */
static void wait_logged(int n) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 60;
  pthread_mutex_lock(&g_log.mu);
  while (g_log.n < n)
    if (pthread_cond_timedwait(&g_log.cv, &g_log.mu, &ts) != 0) break;
  int got = g_log.n;
  pthread_mutex_unlock(&g_log.mu);
  if (got < n) fail_msg("%d ops submitted, expected %d", got, n);
}

static sched *new_sched(uint64_t ahead_ns, uint64_t max_queued_ns) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = 7;
  cfg.max_handles_per_session = 100000;
  cfg.dispatch_ahead_ns = ahead_ns;
  cfg.max_queued_device_ns = max_queued_ns;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  pthread_mutex_lock(&g_log.mu);
  g_log.n = 0;
  pthread_mutex_unlock(&g_log.mu);
  sched_test_hooks h = {cost_hook, submitted_hook, &g_log};
  sched_set_test_hooks(s, &h);
  return s;
}

/* A session of band `priority` and `weight` holding a float32 vector of `n`
 * elements under id 1 (its ops, Neg of it, cost n us). */
static sched_session *session(sched *s, int priority, uint32_t weight, int n) {
  sched_session_params p = {"fair",   "job",  0, 0,    NULL,
                            priority, weight, 0, NULL, NULL};
  sched_session_info info;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_create(s, &p, &info, &st), PD_OK);
  sched_session *ss = NULL;
  assert_int_equal(
      sched_session_open(s, info.token, SCHED_TOKEN_BYTES, &ss, &st), PD_OK);
  dev_shape shape = {1, {n}};
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  float *v = calloc((size_t)n, sizeof *v);
  sched_upload *u = NULL;
  assert_int_equal(
      sched_upload_begin(ss, 1, PD_FLOAT32, &lay, &shape, NULL, &u, &st),
      PD_OK);
  assert_int_equal(sched_upload_write(u, 0, 0, v, (size_t)n * 4, &st), PD_OK);
  assert_int_equal(sched_upload_commit(u, &st), PD_OK);
  free(v);
  return ss;
}

/* Queues `count` ops Neg(1) -> first_id, first_id + 1, ... in one request. */
static pd_code queue_ops(sched_session *ss, uint64_t first_id, int count,
                         dev_status *st) {
  static const uint64_t in[1] = {1};
  sched_op *ops = calloc((size_t)count, sizeof *ops);
  uint64_t *ids = calloc((size_t)count, sizeof *ids);
  sched_op_result *res = calloc((size_t)count, sizeof *res);
  for (int i = 0; i < count; i++) {
    ids[i] = first_id + (uint64_t)i;
    ops[i] = (sched_op){"Neg", in, 1, NULL, 0, &ids[i], 1, 0, 0, NULL};
  }
  int failed = 0;
  pd_code c = sched_execute(ss, ops, count, 0, res, &failed, st);
  free(ops);
  free(ids);
  free(res);
  return c;
}

static void sync_all(sched_session *ss) {
  dev_status st = DEV_STATUS_INIT, terr = DEV_STATUS_INIT;
  uint64_t failed = 0;
  assert_int_equal(sched_sync(ss, NULL, 0, &terr, &failed, &st), PD_OK);
  assert_int_equal(terr.code, PD_OK);
}

/* Service of each session over log[from..to) while all of `seqs` stay
 * backlogged (until the first one's last op): the largest normalized lag,
 * in units of `c` ns, asserting the bound of sched_policy.h. */
static double check_lag(int from, int to, const uint64_t *seqs,
                        const uint32_t *w, const int *count, int n, double c) {
  double served[8] = {0}, worst = 0;
  int left[8];
  for (int i = 0; i < n; i++) left[i] = count[i];
  for (int k = from; k < to; k++) {
    int i = 0;
    while (i < n && g_log.session[k] != seqs[i]) i++;
    assert_true(i < n);
    served[i] += (double)g_log.cost[k];
    if (--left[i] == 0) break; /* no longer backlogged */
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++) {
        double lag = fabs(served[a] / w[a] - served[b] / w[b]);
        assert_true(lag <= (c + SLICE) / w[a] + (c + SLICE) / w[b]);
        if (lag / c > worst) worst = lag / c;
      }
  }
  return worst;
}

static void test_weighted_share_over_engine(void **state) {
  (void)state;
  sched *s = new_sched(2000000, 0);
  /* Ops of 40, 8 and 4 us; weights 1, 2, 1: each runs out near the same
   * virtual time (4 ms of weighted service). */
  uint32_t w[3] = {1, 2, 1};
  int elems[3] = {40, 8, 4}, count[3] = {100, 1000, 1000};
  sched_session *ss[3];
  uint64_t seqs[3];
  for (int i = 0; i < 3; i++) {
    ss[i] = session(s, 0, w[i], elems[i]);
    seqs[i] = sched_session_seq(ss[i]);
  }
  sched_pause(s, true);
  dev_status st = DEV_STATUS_INIT;
  for (int i = 0; i < 3; i++)
    assert_int_equal(queue_ops(ss[i], 100, count[i], &st), PD_OK);
  sched_pause(s, false);
  wait_logged(2100);
  for (int i = 0; i < 3; i++) sync_all(ss[i]);
  double worst = check_lag(0, 2100, seqs, w, count, 3, 40000);
  printf("engine: largest lag %.2f largest ops\n", worst);
  for (int i = 0; i < 3; i++) sched_session_put(ss[i]);
  sched_destroy(s);
}

static void test_new_session_not_starved_nor_owed(void **state) {
  (void)state;
  sched *s = new_sched(2000000, 0);
  sched_session *a = session(s, 0, 1, 10), *b = session(s, 0, 1, 10);
  dev_status st = DEV_STATUS_INIT;
  /* b runs one op, then idles while a runs 300. */
  assert_int_equal(queue_ops(b, 100, 1, &st), PD_OK);
  sync_all(b);
  assert_int_equal(queue_ops(a, 100, 300, &st), PD_OK);
  wait_logged(301);
  sync_all(a);
  /* Both queue 100 more at once: b, idle 3 ms of a's service, is lifted to
   * a's virtual time, so they alternate rather than b taking 100 ops in a
   * row to "catch up" (banked credit), and b is served at once. */
  sched_pause(s, true);
  assert_int_equal(queue_ops(a, 1000, 100, &st), PD_OK);
  assert_int_equal(queue_ops(b, 1000, 100, &st), PD_OK);
  sched_pause(s, false);
  wait_logged(501);
  sync_all(a);
  sync_all(b);
  uint64_t seqs[2] = {sched_session_seq(a), sched_session_seq(b)};
  uint32_t w[2] = {1, 1};
  int count[2] = {100, 100};
  double worst = check_lag(301, 501, seqs, w, count, 2, 10000);
  printf("rejoin: largest lag %.2f largest ops\n", worst);
  /* Not starved: b is among the first ops after the pause; not owed: a is
   * too (in 10 ops each got at least 10 - bound). */
  int na = 0, nb = 0;
  for (int k = 301; k < 311; k++) {
    if (g_log.session[k] == seqs[0])
      na++;
    else
      nb++;
  }
  assert_true(na >= 3 && nb >= 3);
  sched_session_put(a);
  sched_session_put(b);
  sched_destroy(s);
}

static void test_strict_priority(void **state) {
  (void)state;
  sched *s = new_sched(2000000, 0);
  sched_session *lo = session(s, -1, 1000, 5), *mid = session(s, 0, 1, 5),
                *hi = session(s, 3, 1, 5);
  dev_status st = DEV_STATUS_INIT;
  sched_pause(s, true);
  assert_int_equal(queue_ops(lo, 100, 50, &st), PD_OK);
  assert_int_equal(queue_ops(mid, 100, 50, &st), PD_OK);
  assert_int_equal(queue_ops(hi, 100, 50, &st), PD_OK);
  sched_pause(s, false);
  wait_logged(150);
  for (int k = 0; k < 150; k++) {
    sched_session *want = k < 50 ? hi : k < 100 ? mid : lo;
    assert_int_equal(g_log.session[k], sched_session_seq(want));
  }
  sync_all(lo);
  sched_session_put(lo);
  sched_session_put(mid);
  sched_session_put(hi);
  sched_destroy(s);
}

static void assert_contains(const char *msg, const char *needle) {
  if (!strstr(msg, needle))
    fail_msg("\"%s\" does not contain \"%s\"", msg, needle);
}

static void hold_devices(bool hold) {
  for (int d = 0; d < NDEV; d++) dev__exec_hold(g_engine, d, hold);
}

static void test_high_priority_waits_only_for_in_flight(void **state) {
  (void)state;
  /* Ops of 100 us, 250 us ahead: the dispatcher submits 3 (it stops once
   * 300 us are in flight), and the devices are held so they stay there. */
  sched *s = new_sched(250000, 0);
  sched_session *lo = session(s, 0, 1, 100), *hi = session(s, 1, 1, 1);
  dev_status st = DEV_STATUS_INIT;
  hold_devices(true);
  assert_int_equal(queue_ops(lo, 100, 50, &st), PD_OK);
  wait_logged(3);
  /* The fourth stays queued while the devices hold 300 us. */
  pthread_mutex_lock(&g_log.mu);
  assert_int_equal(g_log.n, 3);
  pthread_mutex_unlock(&g_log.mu);
  assert_int_equal(queue_ops(hi, 100, 1, &st), PD_OK);
  hold_devices(false);
  wait_logged(51);
  /* hi's op went next, behind the 3 already on the devices only. */
  assert_int_equal(g_log.session[3], sched_session_seq(hi));
  for (int k = 0; k < 51; k++)
    if (k != 3) assert_int_equal(g_log.session[k], sched_session_seq(lo));
  sync_all(lo);
  sync_all(hi);
  sched_session_put(lo);
  sched_session_put(hi);
  sched_destroy(s);
}

static void test_admission_by_device_time(void **state) {
  (void)state;
  /* 1 ms of queued device time per session; ops of 300 us. */
  sched *s = new_sched(2000000, 1000000);
  sched_session *a = session(s, 0, 1, 300), *big = session(s, 0, 1, 5000);
  dev_status st = DEV_STATUS_INIT;
  sched_pause(s, true);
  for (int i = 0; i < 3; i++)
    assert_int_equal(queue_ops(a, 100 + (uint64_t)i, 1, &st), PD_OK);
  assert_int_equal(queue_ops(a, 200, 1, &st), PD_RESOURCE_EXHAUSTED);
  assert_contains(st.msg, "3 ops queued, an estimated 0.900 ms");
  assert_contains(st.msg, "with 1 more (0.300 ms)");
  assert_contains(st.msg, "max_queued_device_ms = 1.000 ms");
  /* One op over the bound alone on an empty queue still goes (5 ms); a
   * second does not, nor a request of two on an empty queue. */
  assert_int_equal(queue_ops(big, 100, 1, &st), PD_OK);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(queue_ops(big, 101, 1, &st), PD_RESOURCE_EXHAUSTED);
  assert_contains(st.msg, "1 ops queued, an estimated 5.000 ms");
  sched_pause(s, false);
  sync_all(a);
  sync_all(big);
  sched_session *c = session(s, 0, 1, 600);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(queue_ops(c, 100, 2, &st), PD_RESOURCE_EXHAUSTED);
  assert_contains(st.msg, "0 ops queued, an estimated 0.000 ms");
  /* Drained, the session is admitted again. */
  assert_int_equal(queue_ops(a, 200, 3, &st), PD_OK);
  sync_all(a);
  sched_session_put(a);
  sched_session_put(big);
  sched_session_put(c);
  sched_destroy(s);
}

/* --- estimates and measured device time ----------------------------------- */

static void test_estimate_and_time_sink(void **state) {
  (void)state;
  /* MatMul [64,32] x [32,48]: 2*64*48*32 FLOPs per device. */
  double *zeros = calloc(64 * 48, sizeof *zeros);
  dev_tensor *a =
      tu_mirrored(g_engine, PD_FLOAT32, 2, (int64_t[]){64, 32}, zeros);
  dev_tensor *b =
      tu_mirrored(g_engine, PD_FLOAT32, 2, (int64_t[]){32, 48}, zeros);
  free(zeros);
  dev_tensor *in[2] = {a, b};
  dev_op *op = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_op_prepare(g_engine, "MatMul", in, 2, NULL, 0, &op, &st),
                   PD_OK);
  dev_op_cost c = DEV_OP_COST_INITIALIZER;
  assert_int_equal(dev_op_estimate(op, &c, &st), PD_OK);
  assert_true(c.flops == 2.0 * 64 * 48 * 32);
  assert_true(c.bytes == 4.0 * (64 * 32 + 32 * 48 + 64 * 48));
  /* CPU: 2 us + max(196608 / 20e9, 26624 / 8e9) s = 2 + 9.8304 us. */
  assert_int_equal(c.time_ns, 2000 + 9830);
  dev_op_cost small = {offsetof(dev_op_cost, flops) - 1, 0, 0, 0};
  assert_int_equal(dev_op_estimate(op, &small, &st), PD_INVALID_ARGUMENT);
  /* Every device adds its time before the output is ready. */
  uint64_t sink = 0;
  dev_op_set_time_sink(op, &sink);
  dev_tensor *out = dev_op_output(op, 0);
  dev_tensor_retain(out);
  dev_op_submit(g_engine, op);
  assert_int_equal(dev_tensor_wait(out, &st), PD_OK);
  assert_true(__atomic_load_n(&sink, __ATOMIC_RELAXED) > 0);
  dev_tensor_release(out);
  dev_tensor_release(a);
  dev_tensor_release(b);
}

static int setup(void **state) {
  (void)state;
  g_engine = tu_engine(NDEV, 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  dev_engine_destroy(g_engine);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_policy_weights_and_bound),
      cmocka_unit_test(test_policy_lift_and_correction),
      cmocka_unit_test(test_policy_bands_and_round_robin),
      cmocka_unit_test(test_weighted_share_over_engine),
      cmocka_unit_test(test_new_session_not_starved_nor_owed),
      cmocka_unit_test(test_strict_priority),
      cmocka_unit_test(test_high_priority_waits_only_for_in_flight),
      cmocka_unit_test(test_admission_by_device_time),
      cmocka_unit_test(test_estimate_and_time_sink),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
