/* Placement (issue #17): tensors and ops on subsets of a 4-device CPU mesh
 * (1, 2 and 3 devices; values against hand-computed references), DeviceId
 * within the set, inputs on different sets refused, collectives over
 * subsets, two threads interleaving collectives on overlapping subsets
 * (bounded waits: a deadlock fails, never hangs), dev_engine_sync after
 * ops on a subset, ParallelPack / ParallelUnpack sharing buffers (no new
 * device memory) and CopyToDevices, their VJPs through the tape, a graph
 * function called on a subset with an AllReduce inside, a failed input on
 * a subset, and the same paths on a CPU backend with completion fences.
 * From the trials: MIRRORED reads of one-device tensors, placement ops
 * refused at function registration, Broadcast's root within the set, an
 * output gradient on another set, and a time sink written only by the
 * devices of output 0. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "device_int.h"
#include "testutil.h"

enum { NDEV = 4 };
#define WAIT_S 60.0 /* bound of every wait: a deadlock fails the test */

static dev_devset mkset(int n, ...) {
  dev_devset s;
  memset(&s, 0, sizeof s);
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) s.dev[i] = (uint8_t)va_arg(ap, int);
  va_end(ap);
  s.n = n;
  return s;
}

/* A float64 upload on `set` with `layout` (mirrored or sharded). */
static dev_tensor *up(dev_engine *e, const dev_devset *set, dev_layout lay,
                      int rank, const int64_t *dims, const double *v) {
  dev_shape s;
  assert_int_equal(dev_shape_make(rank, dims, &s, NULL), PD_OK);
  dev_tensor *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_from_host_on(e, set, PD_FLOAT64, &lay, &s, v, &t, &st) !=
      PD_OK)
    fail_msg("upload: %s", st.msg);
  return t;
}

static const dev_layout MIR = {DEV_LAYOUT_MIRRORED, 0, 0};
static const dev_layout SH0 = {DEV_LAYOUT_SHARDED, 0, 0};

/* Runs op on `set` (NULL: its inputs'); returns output `which`. */
static dev_tensor *run_on(dev_engine *e, const dev_devset *set, const char *op,
                          dev_tensor *const *in, int n, const dev_attr *a,
                          int na, int which) {
  dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
  int nout = DEV_MAX_OUTPUTS;
  dev_status st = DEV_STATUS_INIT;
  if (dev_execute_on(e, set, op, in, n, a, na, outs, &nout, &st) != PD_OK)
    fail_msg("%s: %s", op, st.msg);
  for (int i = 0; i < nout; i++)
    if (i != which) dev_tensor_release(outs[i]);
  return outs[which];
}

/* Waits for t with a deadline; asserts it succeeded. */
static void wait_ok(dev_tensor *t) {
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = dev_tensor_wait_until(t, dev_monotonic_now() + WAIT_S, &st);
  if (rc != PD_OK) fail_msg("wait: %s: %s", pd_code_name(rc), st.msg);
}

/* Asserts component c of t holds want[0..n). */
static void expect(dev_tensor *t, int c, const double *want, int64_t n) {
  wait_ok(t);
  double got[64];
  assert_true(n <= 64);
  int64_t k = tu_read(t, c, got, 64);
  assert_int_equal(k, n);
  tu_assert_close(got, want, n, 1e-12, 0);
}

static void expect_set(const dev_tensor *t, const dev_devset *s) {
  const dev_devset *ts = dev_tensor_devset(t);
  char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
  if (!dev_devset_equal(ts, s))
    fail_msg("tensor on %s, expected %s", dev_devset_str(ts, a, sizeof a),
             dev_devset_str(s, b, sizeof b));
  assert_int_equal(dev_tensor_num_components(t), s->n);
}

static uint64_t in_use(dev_engine *e, int d) {
  dev_memory_stats m = {.struct_size = sizeof m};
  assert_int_equal(dev_engine_memory_stats(e, d, &m, NULL), PD_OK);
  return m.bytes_in_use;
}

/* Runs `op` expecting `code` at preparation, its message holding every
 * needle (NULL-terminated). */
static void refused(dev_engine *e, const dev_devset *set, const char *op,
                    dev_tensor *const *in, int n, const dev_attr *a, int na,
                    pd_code code, ...) {
  dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
  int nout = DEV_MAX_OUTPUTS;
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = dev_execute_on(e, set, op, in, n, a, na, outs, &nout, &st);
  if (rc != code)
    fail_msg("%s: got %s (%s), expected %s", op, pd_code_name(rc), st.msg,
             pd_code_name(code));
  va_list ap;
  va_start(ap, code);
  for (const char *s; (s = va_arg(ap, const char *));)
    if (!strstr(st.msg, s)) fail_msg("'%s' not in: %s", s, st.msg);
  va_end(ap);
}

/* --- tensors and ops on subsets ------------------------------------------- */

static void check_subset(dev_engine *e, const dev_devset *s) {
  const double v[6] = {1, -2, 3, 4.5, -5, 6};
  uint64_t before[NDEV];
  for (int d = 0; d < NDEV; d++) before[d] = in_use(e, d);
  dev_tensor *x = up(e, s, MIR, 2, (int64_t[]){2, 3}, v);
  expect_set(x, s);
  for (int d = 0; d < NDEV; d++) {
    bool in = dev_devset_index(s, d) >= 0;
    assert_int_equal(dev_tensor_device_bytes(x, d), in ? 48 : 0);
    assert_int_equal(in_use(e, d) - before[d], in ? 48 : 0);
  }
  dev_tensor *in2[2] = {x, x};
  dev_tensor *y = run_on(e, NULL, "Add", in2, 2, NULL, 0, 0);
  expect_set(y, s);
  double w[6];
  for (int i = 0; i < 6; i++) w[i] = 2 * v[i];
  for (int c = 0; c < s->n; c++) expect(y, c, w, 6);
  /* MatMul: x [2,3] by x^T-shaped b [3,2] */
  const double bv[6] = {1, 0, 0, 1, 2, -1};
  dev_tensor *b = up(e, s, MIR, 2, (int64_t[]){3, 2}, bv);
  dev_tensor *mm_in[2] = {x, b};
  dev_tensor *m = run_on(e, NULL, "MatMul", mm_in, 2, NULL, 0, 0);
  double mw[4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      double acc = 0;
      for (int k = 0; k < 3; k++) acc += v[i * 3 + k] * bv[k * 2 + j];
      mw[i * 2 + j] = acc;
    }
  expect_set(m, s);
  for (int c = 0; c < s->n; c++) expect(m, c, mw, 4);
  dev_tensor_release(m);
  dev_tensor_release(b);
  dev_tensor_release(y);
  dev_tensor_release(x);
}

static void test_ops_on_subsets(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset one = mkset(1, 2), two = mkset(2, 3, 1), three = mkset(3, 0, 2, 3);
  check_subset(e, &one);
  check_subset(e, &two);
  check_subset(e, &three);
  /* sharded over 3: 7 rows split 3, 2, 2 */
  double v[14];
  for (int i = 0; i < 14; i++) v[i] = i + 1;
  dev_tensor *x = up(e, &three, SH0, 2, (int64_t[]){7, 2}, v);
  assert_int_equal(dev_tensor_component_shape(x, 0)->dims[0], 3);
  assert_int_equal(dev_tensor_component_shape(x, 2)->dims[0], 2);
  expect(x, 0, v, 6);
  expect(x, 1, v + 6, 4);
  expect(x, 2, v + 10, 4);
  dev_tensor *nx = run_on(e, NULL, "Neg", &x, 1, NULL, 0, 0);
  double w[4] = {-11, -12, -13, -14};
  expect(nx, 2, w, 4);
  /* and back through the sharded download */
  double all[14];
  assert_int_equal(dev_tensor_to_host(nx, &SH0, 0, all, sizeof all, NULL),
                   PD_OK);
  for (int i = 0; i < 14; i++) assert_true(all[i] == -v[i]);
  dev_tensor_release(nx);
  dev_tensor_release(x);
  /* per component on [3, 1]: shapes [2] and [3] */
  dev_shape sh[2];
  dev_shape_make(1, (int64_t[]){2}, &sh[0], NULL);
  dev_shape_make(1, (int64_t[]){3}, &sh[1], NULL);
  const double c0[2] = {1, 2}, c1[3] = {3, 4, 5};
  const void *datas[2] = {c0, c1};
  dev_tensor *p = NULL;
  assert_int_equal(
      dev_tensor_from_components_on(e, &two, PD_FLOAT64, sh, datas, &p, NULL),
      PD_OK);
  dev_tensor *sq = run_on(e, NULL, "Square", &p, 1, NULL, 0, 0);
  expect(sq, 0, (double[]){1, 4}, 2);
  expect(sq, 1, (double[]){9, 16, 25}, 3);
  dev_tensor_release(sq);
  dev_tensor_release(p);
  dev_engine_destroy(e);
}

static void test_device_id_within_set(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset s = mkset(2, 3, 1), one = mkset(1, 2);
  dev_tensor *id = run_on(e, &s, "DeviceId", NULL, 0, NULL, 0, 0);
  expect_set(id, &s);
  expect(id, 0, (double[]){0}, 1);
  expect(id, 1, (double[]){1}, 1);
  dev_tensor *id1 = run_on(e, &one, "DeviceId", NULL, 0, NULL, 0, 0);
  expect(id1, 0, (double[]){0}, 1);
  dev_attr f[3] = {dev_attr_shape("shape", 1, (int64_t[]){2}),
                   dev_attr_float("value", 7),
                   dev_attr_dtype("dtype", PD_FLOAT64)};
  dev_tensor *fl = run_on(e, &s, "Fill", NULL, 0, f, 3, 0);
  expect_set(fl, &s);
  expect(fl, 1, (double[]){7, 7}, 2);
  dev_tensor_release(fl);
  dev_tensor_release(id1);
  dev_tensor_release(id);
  dev_engine_destroy(e);
}

static void test_mixed_sets_refused(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset a = mkset(2, 0, 1), b = mkset(2, 1, 2), c = mkset(2, 2, 3);
  dev_tensor *x = up(e, &a, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tensor *y = up(e, &b, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tensor *in[2] = {x, y};
  refused(e, NULL, "Add", in, 2, NULL, 0, PD_INVALID_ARGUMENT, "Add", "input 0",
          "[0, 1]", "input 1", "[1, 2]", "CopyToDevices", "ParallelPack",
          "ParallelUnpack", NULL);
  refused(e, &c, "Neg", &x, 1, NULL, 0, PD_INVALID_ARGUMENT, "Neg", "[2, 3]",
          "[0, 1]", "CopyToDevices", NULL);
  dev_devset bad = mkset(2, 0, 7);
  dev_attr f[3] = {dev_attr_shape("shape", 0, NULL), dev_attr_float("value", 1),
                   dev_attr_dtype("dtype", PD_FLOAT64)};
  refused(e, &bad, "Fill", NULL, 0, f, 3, PD_INVALID_ARGUMENT, "Fill",
          "entry 1", "device 7", NULL);
  dev_tensor_release(x);
  dev_tensor_release(y);
  dev_engine_destroy(e);
}

/* --- collectives over subsets ------------------------------------------- */

static void test_collectives_on_subsets(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset s2 = mkset(2, 1, 3), s3 = mkset(3, 0, 2, 3),
             r3 = mkset(3, 2, 0, 1);
  dev_tensor *x = up(e, &s2, SH0, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  dev_attr sum = dev_attr_string("reduction", "sum");
  dev_tensor *ar = run_on(e, NULL, "AllReduce", &x, 1, &sum, 1, 0);
  expect_set(ar, &s2);
  expect(ar, 0, (double[]){4, 6}, 2);
  expect(ar, 1, (double[]){4, 6}, 2);
  dev_tensor *y =
      up(e, &s3, SH0, 1, (int64_t[]){6}, (double[]){1, 2, 3, 4, 5, 6});
  dev_attr ax = dev_attr_int("axis", 0);
  dev_tensor *ag = run_on(e, NULL, "AllGather", &y, 1, &ax, 1, 0);
  for (int c = 0; c < 3; c++) expect(ag, c, (double[]){1, 2, 3, 4, 5, 6}, 6);
  dev_attr root = dev_attr_int("root", 1);
  dev_tensor *bc = run_on(e, NULL, "Broadcast", &y, 1, &root, 1, 0);
  for (int c = 0; c < 3; c++) expect(bc, c, (double[]){3, 4}, 2);
  dev_tensor *z =
      up(e, &r3, MIR, 1, (int64_t[]){6}, (double[]){1, 2, 3, 4, 5, 6});
  dev_tensor *rs = run_on(e, NULL, "ReduceScatter", &z, 1, &sum, 1, 0);
  expect(rs, 0, (double[]){3, 6}, 2);
  expect(rs, 1, (double[]){9, 12}, 2);
  expect(rs, 2, (double[]){15, 18}, 2);
  dev_tensor *t[] = {x, ar, y, ag, bc, z, rs};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_release(t[i]);
  dev_engine_destroy(e);
}

typedef struct chain_arg {
  dev_engine *e;
  dev_devset set;
  int iters;
  int failed; /* 0: fine */
  char msg[DEV_STATUS_MSG_MAX];
} chain_arg;

/* AllReduce (mean) over `set`, over and over, waiting (bounded) every few
 * ops; the value stays what it was. */
static void *chain(void *p) {
  chain_arg *a = p;
  const double v[3] = {1, 2, 3};
  dev_layout lay = MIR;
  dev_shape s;
  dev_shape_make(1, (int64_t[]){3}, &s, NULL);
  dev_tensor *x = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_from_host_on(a->e, &a->set, PD_FLOAT64, &lay, &s, v, &x,
                              &st) != PD_OK) {
    a->failed = 1;
    snprintf(a->msg, sizeof a->msg, "%s", st.msg);
    return NULL;
  }
  dev_attr mean = dev_attr_string("reduction", "mean");
  for (int i = 0; i < a->iters && !a->failed; i++) {
    dev_tensor *y = NULL;
    int n = 1;
    if (dev_execute(a->e, "AllReduce", &x, 1, &mean, 1, &y, &n, &st) != PD_OK) {
      a->failed = 1;
      snprintf(a->msg, sizeof a->msg, "%s", st.msg);
      break;
    }
    dev_tensor_release(x);
    x = y;
    if (i % 16 == 15 &&
        dev_tensor_wait_until(x, dev_monotonic_now() + WAIT_S, &st) != PD_OK) {
      a->failed = 2;
      snprintf(a->msg, sizeof a->msg, "%s", st.msg);
    }
  }
  if (!a->failed &&
      dev_tensor_wait_until(x, dev_monotonic_now() + WAIT_S, &st) != PD_OK) {
    a->failed = 2;
    snprintf(a->msg, sizeof a->msg, "%s", st.msg);
  }
  double got[3];
  dev_layout c = {DEV_LAYOUT_COMPONENT, 0, a->set.n - 1};
  if (!a->failed &&
      (dev_tensor_to_host(x, &c, 0, got, sizeof got, &st) != PD_OK ||
       got[0] != 1 || got[1] != 2 || got[2] != 3)) {
    a->failed = 3;
    snprintf(a->msg, sizeof a->msg, "value %g %g %g (%.200s)", got[0], got[1],
             got[2], st.msg);
  }
  dev_tensor_release(x);
  return NULL;
}

static void test_overlapping_collectives_two_threads(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  chain_arg a = {e, mkset(3, 0, 1, 2), 300, 0, ""};
  chain_arg b = {e, mkset(3, 1, 2, 3), 300, 0, ""};
  chain_arg c = {e, mkset(2, 3, 0), 300, 0, ""}; /* reversed order too */
  pthread_t ta, tb, tc;
  assert_int_equal(pthread_create(&ta, NULL, chain, &a), 0);
  assert_int_equal(pthread_create(&tb, NULL, chain, &b), 0);
  assert_int_equal(pthread_create(&tc, NULL, chain, &c), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  pthread_join(tc, NULL);
  if (a.failed || b.failed || c.failed)
    fail_msg("chains: %d %s / %d %s / %d %s", a.failed, a.msg, b.failed, b.msg,
             c.failed, c.msg);
  dev_engine_destroy(e);
}

/* dev_engine_sync on another thread, bounded: a device waiting for a seq
 * it never receives would hang it. */
typedef struct sync_arg {
  dev_engine *e;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  pd_code rc;
} sync_arg;

static void *sync_main(void *p) {
  sync_arg *a = p;
  pd_code rc = dev_engine_sync(a->e, NULL);
  pthread_mutex_lock(&a->mu);
  a->rc = rc;
  a->done = true;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

static void bounded_sync(dev_engine *e) {
  sync_arg a = {.e = e};
  pthread_mutex_init(&a.mu, NULL);
  pthread_cond_init(&a.cv, NULL);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, sync_main, &a), 0);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += (time_t)WAIT_S;
  pthread_mutex_lock(&a.mu);
  while (!a.done)
    if (pthread_cond_timedwait(&a.cv, &a.mu, &ts) != 0 && !a.done) {
      pthread_mutex_unlock(&a.mu);
      fail_msg("dev_engine_sync did not return within %g s", WAIT_S);
    }
  pthread_mutex_unlock(&a.mu);
  pthread_join(t, NULL);
  assert_int_equal(a.rc, PD_OK);
}

static void test_sync_and_watch_after_subset(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset one = mkset(1, 2);
  dev_tensor *x = up(e, &one, MIR, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  for (int i = 0; i < 50; i++) {
    dev_tensor *y = run_on(e, NULL, "Neg", &x, 1, NULL, 0, 0);
    dev_tensor_release(x);
    x = y;
  }
  bounded_sync(e);
  assert_true(dev_tensor_is_ready(x));
  expect(x, 0, (double[]){1, 2, 3}, 3);
  for (int d = 0; d < NDEV; d++) {
    dev_progress p;
    memset(&p, 0, sizeof p);
    dev_engine_watch(e, d, &p, 1.0);
    assert_int_equal(p.state, DEV_PROGRESS_IDLE);
  }
  dev_tensor_release(x);
  dev_engine_destroy(e);
}

/* --- pack, unpack, copy --------------------------------------------------- */

static void test_pack_unpack_share_buffers(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset d1 = mkset(1, 1), d3 = mkset(1, 3), both = mkset(2, 1, 3);
  dev_tensor *a = up(e, &d1, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tensor *b = up(e, &d3, MIR, 1, (int64_t[]){2}, (double[]){3, 4});
  wait_ok(a);
  wait_ok(b);
  uint64_t before[NDEV];
  for (int d = 0; d < NDEV; d++) before[d] = in_use(e, d);
  dev_tensor *ab[2] = {a, b};
  dev_tensor *p = run_on(e, NULL, "ParallelPack", ab, 2, NULL, 0, 0);
  expect_set(p, &both);
  expect(p, 0, (double[]){1, 2}, 2);
  expect(p, 1, (double[]){3, 4}, 2);
  for (int d = 0; d < NDEV; d++) assert_int_equal(in_use(e, d), before[d]);
  double tmp[2];
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_to_host(p, &MIR, 0, tmp, sizeof tmp, &st),
                   PD_INVALID_ARGUMENT); /* marked not mirrored */
  dev_tensor *parts[2];
  for (int i = 0; i < 2; i++)
    parts[i] = run_on(e, NULL, "ParallelUnpack", &p, 1, NULL, 0, i);
  expect_set(parts[0], &d1);
  expect_set(parts[1], &d3);
  expect(parts[0], 0, (double[]){1, 2}, 2);
  expect(parts[1], 0, (double[]){3, 4}, 2);
  for (int d = 0; d < NDEV; d++) assert_int_equal(in_use(e, d), before[d]);
  /* a shared buffer lives while any sharer does */
  dev_tensor_release(a);
  dev_tensor_release(p);
  expect(parts[0], 0, (double[]){1, 2}, 2);
  /* unpack of a tensor on three devices */
  dev_devset s3 = mkset(3, 2, 0, 3);
  dev_tensor *x = up(e, &s3, SH0, 1, (int64_t[]){5}, (double[]){1, 2, 3, 4, 5});
  dev_tensor *x2 = run_on(e, NULL, "ParallelUnpack", &x, 1, NULL, 0, 2);
  dev_devset d3b = mkset(1, 3);
  expect_set(x2, &d3b);
  expect(x2, 0, (double[]){5}, 1);
  /* refusals */
  dev_tensor *bad[2] = {x, b};
  refused(e, NULL, "ParallelPack", bad, 2, NULL, 0, PD_INVALID_ARGUMENT,
          "input 0", "one device", NULL);
  dev_tensor *same[2] = {b, x2};
  refused(e, NULL, "ParallelPack", same, 2, NULL, 0, PD_INVALID_ARGUMENT,
          "device 3", "distinct", NULL);
  dev_tensor *i32 = run_on(e, &d1, "DeviceId", NULL, 0, NULL, 0, 0);
  dev_tensor *mix[2] = {i32, b};
  refused(e, NULL, "ParallelPack", mix, 2, NULL, 0, PD_INVALID_ARGUMENT,
          "dtype", NULL);
  dev_tensor *t[] = {b, parts[0], parts[1], x, x2, i32};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_release(t[i]);
  dev_engine_destroy(e);
}

static dev_tensor *copy_to(dev_engine *e, dev_tensor *x, const dev_devset *s) {
  int64_t devs[PD_MAX_DEVICES];
  for (int i = 0; i < s->n; i++) devs[i] = s->dev[i];
  dev_attr a = dev_attr_int_list("devices", devs, s->n);
  return run_on(e, NULL, "CopyToDevices", &x, 1, &a, 1, 0);
}

static void test_copy_to_devices(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset s01 = mkset(2, 0, 1), s32 = mkset(2, 3, 2), s0 = mkset(1, 0);
  dev_devset s123 = mkset(3, 1, 2, 3), s3 = mkset(1, 3), s13 = mkset(2, 1, 3);
  /* same size: component i -> device i of the new set */
  dev_tensor *x = up(e, &s01, SH0, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  dev_tensor *nx = run_on(e, NULL, "Neg", &x, 1, NULL, 0, 0); /* in flight */
  dev_tensor *y = copy_to(e, nx, &s32);
  expect_set(y, &s32);
  expect(y, 0, (double[]){-1, -2}, 2);
  expect(y, 1, (double[]){-3, -4}, 2);
  assert_int_equal(dev_tensor_device_bytes(y, 3), 16);
  /* 1 -> k: replicated */
  dev_tensor *o = up(e, &s0, MIR, 1, (int64_t[]){2}, (double[]){5, 6});
  dev_tensor *r = copy_to(e, o, &s123);
  for (int c = 0; c < 3; c++) expect(r, c, (double[]){5, 6}, 2);
  /* mirrored k -> m: component 0 everywhere */
  dev_tensor *m = up(e, &s123, MIR, 1, (int64_t[]){2}, (double[]){7, 8});
  dev_tensor *m1 = copy_to(e, m, &s3);
  expect(m1, 0, (double[]){7, 8}, 2);
  dev_tensor *m2 = copy_to(e, m, &s01);
  expect(m2, 1, (double[]){7, 8}, 2);
  /* refusals */
  dev_tensor *sh = up(e, &s123, SH0, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  refused(e, NULL, "CopyToDevices", &sh, 1,
          (dev_attr[]){dev_attr_int_list("devices", (int64_t[]){1, 3}, 2)}, 1,
          PD_INVALID_ARGUMENT, "not mirrored", "ParallelUnpack", NULL);
  refused(e, NULL, "CopyToDevices", &o, 1,
          (dev_attr[]){dev_attr_int_list("devices", (int64_t[]){2, 2}, 2)}, 1,
          PD_INVALID_ARGUMENT, "devices", "entry 1", NULL);
  refused(e, NULL, "CopyToDevices", &o, 1,
          (dev_attr[]){dev_attr_int_list("devices", (int64_t[]){9}, 1)}, 1,
          PD_INVALID_ARGUMENT, "entry 0", NULL);
  (void)s13;
  dev_tensor *t[] = {x, nx, y, o, r, m, m1, m2, sh};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_release(t[i]);
  bounded_sync(e);
  dev_engine_destroy(e);
}

/* One dev_op_submit_batch of ops on different sets (a dispatcher's turn):
 * each device receives only its own, in batch order; chains of Neg on each
 * set and AllReduces on overlapping sets give their values. */
static void test_batch_of_mixed_sets(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset sets[3] = {mkset(1, 0), mkset(2, 1, 2), mkset(3, 3, 1, 0)};
  dev_tensor *cur[3];
  for (int k = 0; k < 3; k++)
    cur[k] = up(e, &sets[k], MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_op *ops[DEV_SUBMIT_BATCH_MAX];
  int n = 0;
  dev_attr mean = dev_attr_string("reduction", "mean");
  for (int i = 0; n + 3 <= DEV_SUBMIT_BATCH_MAX - 1; i++)
    for (int k = 0; k < 3; k++) {
      dev_status st = DEV_STATUS_INIT;
      const bool coll = k > 0 && i % 2;
      if (dev_op_prepare(e, coll ? "AllReduce" : "Neg", &cur[k], 1,
                         coll ? &mean : NULL, coll ? 1 : 0, &ops[n],
                         &st) != PD_OK)
        fail_msg("prepare: %s", st.msg);
      dev_tensor_release(cur[k]);
      cur[k] = dev_op_output(ops[n], 0);
      dev_tensor_retain(cur[k]);
      n++;
    }
  dev_op_submit_batch(e, ops, n);
  int negs[3] = {0, 0, 0};
  for (int j = 0; j < n; j++) {
    int k = j % 3, i = j / 3;
    negs[k] += !(k > 0 && i % 2);
  }
  for (int k = 0; k < 3; k++) {
    double sg = negs[k] % 2 ? -1 : 1;
    for (int c = 0; c < sets[k].n; c++)
      expect(cur[k], c, (double[]){sg, 2 * sg}, 2);
    dev_tensor_release(cur[k]);
  }
  bounded_sync(e);
  dev_engine_destroy(e);
}

/* Batches whose ops span two sets, from several threads at once (the
 * trials' deadlock): an op pushed to the last of its devices may finish
 * and be recycled while the batch is still being pushed to other devices,
 * so submission must never read an op after pushing it. Each thread's
 * batch: Fill on A, AllReduce(sum) of it, Fill on B, AllReduce of that;
 * the sums are |A| and |B|. Single-device sets make ops finish (and go
 * back to the free list) fastest. Every wait bounded. */
typedef struct batch_arg {
  dev_engine *e;
  dev_devset a, b;
  int iters;
  int failed;
  char msg[DEV_STATUS_MSG_MAX];
} batch_arg;

static bool batch_fail(batch_arg *x, int code, const dev_status *st) {
  x->failed = code;
  snprintf(x->msg, sizeof x->msg, "%s", st->msg);
  return false;
}

static bool batch_turn(batch_arg *x, dev_tensor **last) {
  int64_t dims[1] = {3};
  dev_attr fill[3] = {dev_attr_shape("shape", 1, dims),
                      dev_attr_float("value", 1),
                      dev_attr_dtype("dtype", PD_FLOAT64)};
  dev_attr sum = dev_attr_string("reduction", "sum");
  dev_op *ops[4];
  dev_status st = DEV_STATUS_INIT;
  const dev_devset *sets[2] = {&x->a, &x->b};
  for (int k = 0; k < 2; k++) {
    if (dev_op_prepare_on(x->e, sets[k], "Fill", NULL, 0, fill, 3, &ops[2 * k],
                          &st) != PD_OK)
      return batch_fail(x, 1, &st);
    dev_tensor *f = dev_op_output(ops[2 * k], 0);
    if (dev_op_prepare(x->e, "AllReduce", &f, 1, &sum, 1, &ops[2 * k + 1],
                       &st) != PD_OK)
      return batch_fail(x, 1, &st);
    dev_tensor_release(last[k]);
    last[k] = dev_op_output(ops[2 * k + 1], 0);
    dev_tensor_retain(last[k]);
  }
  dev_op_submit_batch(x->e, ops, 4);
  return true;
}

static void *batch_main(void *p) {
  batch_arg *x = p;
  dev_tensor *last[2] = {NULL, NULL};
  dev_status st = DEV_STATUS_INIT;
  for (int i = 0; i < x->iters && !x->failed; i++) {
    if (!batch_turn(x, last)) break;
    for (int k = 0; i % 8 == 7 && k < 2 && !x->failed; k++)
      if (dev_tensor_wait_until(last[k], dev_monotonic_now() + WAIT_S, &st) !=
          PD_OK)
        batch_fail(x, 2, &st);
  }
  const int n[2] = {x->a.n, x->b.n};
  for (int k = 0; k < 2 && last[k]; k++) {
    double got[3] = {0, 0, 0};
    dev_layout c = {DEV_LAYOUT_COMPONENT, 0, 0};
    if (!x->failed &&
        (dev_tensor_wait_until(last[k], dev_monotonic_now() + WAIT_S, &st) !=
             PD_OK ||
         dev_tensor_to_host(last[k], &c, 0, got, sizeof got, &st) != PD_OK))
      batch_fail(x, 2, &st);
    else if (!x->failed && (got[0] != n[k] || got[2] != n[k])) {
      x->failed = 3;
      snprintf(x->msg, sizeof x->msg, "sum %g, want %d", got[0], n[k]);
    }
    dev_tensor_release(last[k]);
  }
  return NULL;
}

static void test_batches_spanning_two_sets(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  batch_arg x[6] = {
      {e, mkset(2, 0, 1), mkset(2, 2, 3), 400, 0, ""},
      {e, mkset(4, 0, 1, 2, 3), mkset(4, 3, 2, 1, 0), 400, 0, ""},
      {e, mkset(1, 0), mkset(1, 3), 400, 0, ""},
      {e, mkset(1, 1), mkset(1, 2), 400, 0, ""},
      {e, mkset(1, 3), mkset(1, 0), 400, 0, ""},
      {e, mkset(3, 0, 1, 2), mkset(3, 1, 2, 3), 400, 0, ""},
  };
  pthread_t t[6];
  for (int i = 0; i < 6; i++)
    assert_int_equal(pthread_create(&t[i], NULL, batch_main, &x[i]), 0);
  for (int i = 0; i < 6; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 6; i++)
    if (x[i].failed) fail_msg("thread %d: %d %s", i, x[i].failed, x[i].msg);
  bounded_sync(e);
  dev_engine_destroy(e);
}

/* A copy waits for its source device: with device 0 held, a copy onto
 * device 2 of a value device 0 has yet to compute does not finish, and
 * devices 1-3 stay free (an op on [1] runs meanwhile); released, it does. */
static void test_copy_waits_for_source_device(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset d0 = mkset(1, 0), d1 = mkset(1, 1), d2 = mkset(1, 2);
  dev_tensor *a = up(e, &d0, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_engine_test_hold(e, 0, true);
  dev_tensor *na = run_on(e, NULL, "Neg", &a, 1, NULL, 0, 0);
  dev_tensor *c = copy_to(e, na, &d2);
  dev_tensor *b = up(e, &d1, MIR, 1, (int64_t[]){1}, (double[]){5});
  dev_tensor *nb = run_on(e, NULL, "Neg", &b, 1, NULL, 0, 0);
  expect(nb, 0, (double[]){-5}, 1); /* device 1 is not held up */
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait_until(c, dev_monotonic_now() + 0.2, &st),
                   PD_DEADLINE_EXCEEDED);
  dev_engine_test_hold(e, 0, false);
  expect(c, 0, (double[]){-1, -2}, 2);
  dev_tensor *t[] = {a, na, c, b, nb};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_release(t[i]);
  dev_engine_destroy(e);
}

/* --- VJPs through the tape ------------------------------------------------ */

/* Prepares op, records it on tp, submits it; returns output `which`. */
static dev_tensor *taped(dev_engine *e, dev_tape *tp, const char *op,
                         dev_tensor *const *in, int n, const dev_attr *a,
                         int na, int which) {
  dev_op *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_op_prepare(e, op, in, n, a, na, &o, &st) != PD_OK)
    fail_msg("%s: %s", op, st.msg);
  assert_int_equal(dev_tape_record(tp, o, &st), PD_OK);
  dev_tensor *out = dev_op_output(o, which);
  dev_tensor_retain(out);
  dev_op_submit(e, o);
  return out;
}

static void grads(dev_tape *tp, dev_tensor *target, dev_tensor *const *src,
                  int n, dev_tensor **out) {
  dev_status st = DEV_STATUS_INIT;
  if (dev_tape_gradient(tp, target, src, n, NULL, out, &st) != PD_OK)
    fail_msg("gradient: %s", st.msg);
}

static void test_placement_vjps(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset d1 = mkset(1, 1), d3 = mkset(1, 3), s02 = mkset(2, 0, 2);
  dev_devset s0 = mkset(1, 0), s123 = mkset(3, 1, 2, 3), s01 = mkset(2, 0, 1);
  dev_devset s23 = mkset(2, 2, 3);
  dev_tape *tp = NULL;
  assert_int_equal(dev_tape_create(e, true, &tp, NULL), PD_OK);
  /* pack: d(sum of squares)/da = 2a, on a's own device */
  dev_tensor *a = up(e, &d1, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tensor *b = up(e, &d3, MIR, 1, (int64_t[]){2}, (double[]){3, 4});
  dev_tape_watch(tp, a, NULL);
  dev_tape_watch(tp, b, NULL);
  dev_tensor *ab[2] = {a, b};
  dev_tensor *p = taped(e, tp, "ParallelPack", ab, 2, NULL, 0, 0);
  dev_tensor *pp[2] = {p, p};
  dev_tensor *y = taped(e, tp, "Mul", pp, 2, NULL, 0, 0);
  dev_tensor *g[2] = {0};
  grads(tp, y, ab, 2, g);
  expect_set(g[0], &d1);
  expect_set(g[1], &d3);
  expect(g[0], 0, (double[]){2, 4}, 2);
  expect(g[1], 0, (double[]){6, 8}, 2);
  dev_tensor_release(g[0]);
  dev_tensor_release(g[1]);
  /* unpack: only part 0 reaches the target; part 1's gradient is zeros */
  dev_tensor *x = up(e, &s02, SH0, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  dev_tape_watch(tp, x, NULL);
  dev_tensor *x0 = taped(e, tp, "ParallelUnpack", &x, 1, NULL, 0, 0);
  dev_tensor *x00[2] = {x0, x0};
  dev_tensor *y0 = taped(e, tp, "Mul", x00, 2, NULL, 0, 0);
  dev_tensor *gx = NULL;
  grads(tp, y0, &x, 1, &gx);
  expect_set(gx, &s02);
  expect(gx, 0, (double[]){2, 4}, 2);
  expect(gx, 1, (double[]){0, 0}, 2);
  dev_tensor_release(gx);
  /* copy, 1 -> 3: the sum over the destinations */
  dev_tensor *o = up(e, &s0, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tape_watch(tp, o, NULL);
  dev_attr to3 = dev_attr_int_list("devices", (int64_t[]){1, 2, 3}, 3);
  dev_tensor *c3 = taped(e, tp, "CopyToDevices", &o, 1, &to3, 1, 0);
  expect_set(c3, &s123);
  dev_tensor *cc[2] = {c3, c3};
  dev_tensor *yc = taped(e, tp, "Mul", cc, 2, NULL, 0, 0);
  dev_tensor *go = NULL;
  grads(tp, yc, &o, 1, &go);
  expect_set(go, &s0);
  expect(go, 0, (double[]){6, 12}, 2);
  dev_tensor_release(go);
  /* copy, same size: back onto the input's devices */
  dev_tensor *w = up(e, &s01, SH0, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  dev_tape_watch(tp, w, NULL);
  dev_attr to23 = dev_attr_int_list("devices", (int64_t[]){2, 3}, 2);
  dev_tensor *cw = taped(e, tp, "CopyToDevices", &w, 1, &to23, 1, 0);
  expect_set(cw, &s23);
  dev_tensor *scale = up(e, &s23, MIR, 1, (int64_t[]){2}, (double[]){10, 100});
  dev_tensor *ws[2] = {cw, scale};
  dev_tensor *yw = taped(e, tp, "Mul", ws, 2, NULL, 0, 0);
  dev_tensor *gw = NULL;
  grads(tp, yw, &w, 1, &gw);
  expect_set(gw, &s01);
  expect(gw, 0, (double[]){10, 100}, 2);
  expect(gw, 1, (double[]){10, 100}, 2);
  dev_tensor_release(gw);
  /* copy of a mirrored input, 2 -> 3: its component 0 fed every
   * destination, so it gets their sum; component 1 gets zeros */
  dev_tensor *mx = up(e, &s01, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tape_watch(tp, mx, NULL);
  dev_tensor *cm = taped(e, tp, "CopyToDevices", &mx, 1, &to3, 1, 0);
  dev_tensor *cmm[2] = {cm, cm};
  dev_tensor *ym = taped(e, tp, "Mul", cmm, 2, NULL, 0, 0);
  dev_tensor *gm = NULL;
  grads(tp, ym, &mx, 1, &gm);
  expect_set(gm, &s01);
  expect(gm, 0, (double[]){6, 12}, 2);
  expect(gm, 1, (double[]){0, 0}, 2);
  dev_tensor_release(gm);
  dev_tensor_release(mx);
  dev_tensor_release(cm);
  dev_tensor_release(ym);
  dev_tape_destroy(tp);
  dev_tensor *t[] = {a, b, p, y, x, x0, y0, o, c3, yc, w, cw, scale, yw};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_release(t[i]);
  dev_engine_destroy(e);
}

/* --- a function on a subset ------------------------------------------------ */

static void test_function_on_subset(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  const char *in_x[] = {"x"}, *in_c[] = {"c", "c"};
  dev_attr sum = dev_attr_string("reduction", "sum");
  dev_fn_node nodes[2] = {
      {.name = "c",
       .op = "AllReduce",
       .inputs = in_x,
       .num_inputs = 1,
       .attrs = &sum,
       .num_attrs = 1},
      {.name = "o", .op = "Add", .inputs = in_c, .num_inputs = 2}};
  dev_fn_arg arg = {"x", PD_FLOAT64};
  dev_fn_output out = {"o", "o"};
  dev_fn_def def = DEV_FN_DEF_INITIALIZER;
  def.name = "f";
  def.args = &arg;
  def.num_args = 1;
  def.nodes = nodes;
  def.num_nodes = 2;
  def.outputs = &out;
  def.num_outputs = 1;
  dev_fn_options opt = DEV_FN_OPTIONS_INITIALIZER;
  bool existed = true;
  dev_status st = DEV_STATUS_INIT;
  if (dev_fn_register(lib, &def, &opt, &existed, &st) != PD_OK)
    fail_msg("register: %s", st.msg);
  dev_devset s2 = mkset(2, 1, 3), s3 = mkset(3, 0, 1, 2);
  dev_tensor *x = up(e, &s2, SH0, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  dev_tensor *z = up(e, &s3, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tensor *ins[2] = {x, z};
  for (int k = 0; k < 2; k++) {
    for (int rep = 0; rep < 3; rep++) { /* cached per set */
      dev_op *op = NULL;
      if (dev_fn_prepare_call_on(lib, NULL, "f", &ins[k], 1, &op, &st) != PD_OK)
        fail_msg("call: %s", st.msg);
      assert_true(dev_devset_equal(dev_op_devset(op), k ? &s3 : &s2));
      dev_tensor *r = dev_op_output(op, 0);
      dev_tensor_retain(r);
      dev_op_submit(e, op);
      expect_set(r, k ? &s3 : &s2);
      if (k == 0) {
        expect(r, 0, (double[]){8, 12}, 2);
        expect(r, 1, (double[]){8, 12}, 2);
      } else {
        for (int c = 0; c < 3; c++) expect(r, c, (double[]){6, 12}, 2);
      }
      dev_tensor_release(r);
    }
  }
  dev_op *op = NULL;
  assert_int_equal(dev_fn_prepare_call_on(lib, &s3, "f", &x, 1, &op, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "CopyToDevices"));
  /* a function without arguments runs on the set it is placed on */
  dev_fn_node idn = {.name = "d", .op = "DeviceId"};
  dev_fn_output dout = {"d", "d"};
  dev_fn_def g = DEV_FN_DEF_INITIALIZER;
  g.name = "g";
  g.nodes = &idn;
  g.num_nodes = 1;
  g.outputs = &dout;
  g.num_outputs = 1;
  if (dev_fn_register(lib, &g, &opt, &existed, &st) != PD_OK)
    fail_msg("register g: %s", st.msg);
  dev_devset r2 = mkset(2, 3, 1);
  if (dev_fn_prepare_call_on(lib, &r2, "g", NULL, 0, &op, &st) != PD_OK)
    fail_msg("call g: %s", st.msg);
  dev_tensor *ids = dev_op_output(op, 0);
  dev_tensor_retain(ids);
  dev_op_submit(e, op);
  expect_set(ids, &r2);
  expect(ids, 0, (double[]){0}, 1);
  expect(ids, 1, (double[]){1}, 1);
  dev_tensor_release(ids);
  dev_tensor_release(x);
  dev_tensor_release(z);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* --- failures on a subset -------------------------------------------------- */

static void test_failed_input_on_subset(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 1u << 20); /* 1 MiB per device */
  dev_devset s = mkset(2, 1, 2);
  dev_attr f[3] = {dev_attr_shape("shape", 1, (int64_t[]){1 << 18}),
                   dev_attr_float("value", 1),
                   dev_attr_dtype("dtype", PD_FLOAT64)}; /* 2 MiB */
  dev_tensor *big = run_on(e, &s, "Fill", NULL, 0, f, 3, 0);
  dev_tensor *n = run_on(e, NULL, "Neg", &big, 1, NULL, 0, 0);
  dev_attr sum = dev_attr_string("reduction", "sum");
  dev_tensor *ar = run_on(e, NULL, "AllReduce", &n, 1, &sum, 1, 0);
  dev_tensor *cp = copy_to(e, n, &(dev_devset){.n = 2, .dev = {3, 0}});
  dev_tensor *t[] = {big, n, ar, cp};
  for (size_t i = 0; i < 4; i++) {
    dev_status st = DEV_STATUS_INIT;
    pd_code rc = dev_tensor_wait_until(t[i], dev_monotonic_now() + WAIT_S, &st);
    if (rc != PD_RESOURCE_EXHAUSTED)
      fail_msg("tensor %zu: %s %s", i, pd_code_name(rc), st.msg);
  }
  for (size_t i = 0; i < 4; i++) dev_tensor_release(t[i]);
  bounded_sync(e);
  for (int d = 0; d < NDEV; d++) assert_int_equal(in_use(e, d), 0);
  dev_engine_destroy(e);
}

/* --- the same on a backend with completion fences -------------------------
 * The CPU backend with fences that are done when recorded: the engine takes
 * its fenced path (completion threads, holds until issue, late errors). */

static int g_fence_token;
static pd_code ff_record(dev_backend *b, int device, void **fence,
                         dev_status *st) {
  (void)b, (void)device, (void)st;
  *fence = &g_fence_token;
  return PD_OK;
}
static pd_code ff_wait(dev_backend *b, int device, void *fence,
                       dev_status *st) {
  (void)b, (void)device, (void)fence, (void)st;
  return PD_OK;
}
static void ff_release(dev_backend *b, int device, void *fence) {
  (void)b, (void)device, (void)fence;
}

static void test_fenced_backend(void **state) {
  (void)state;
  dev_cpu_config cc = DEV_CPU_CONFIG_INITIALIZER;
  cc.num_devices = NDEV;
  dev_backend *b = NULL;
  assert_int_equal(dev_cpu_backend_create(&cc, &b, NULL), PD_OK);
  b->fence_record = ff_record;
  b->fence_wait = ff_wait;
  b->fence_release = ff_release;
  dev_engine *e = NULL;
  assert_int_equal(dev_engine_create_with_backend(b, &e, NULL), PD_OK);
  check_subset(e, &(dev_devset){.n = 2, .dev = {2, 0}});
  dev_devset s3 = mkset(3, 3, 1, 2), d0 = mkset(1, 0), d2 = mkset(1, 2);
  dev_tensor *x =
      up(e, &s3, SH0, 1, (int64_t[]){6}, (double[]){1, 2, 3, 4, 5, 6});
  dev_attr sum = dev_attr_string("reduction", "sum");
  dev_tensor *ar = run_on(e, NULL, "AllReduce", &x, 1, &sum, 1, 0);
  for (int c = 0; c < 3; c++) expect(ar, c, (double[]){9, 12}, 2);
  dev_tensor *a = up(e, &d0, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tensor *na = run_on(e, NULL, "Neg", &a, 1, NULL, 0, 0);
  dev_tensor *c = copy_to(e, na, &d2);
  dev_tensor *pk[2] = {c, na};
  dev_tensor *p = run_on(e, NULL, "ParallelPack", pk, 2, NULL, 0, 0);
  expect(p, 0, (double[]){-1, -2}, 2);
  expect(p, 1, (double[]){-1, -2}, 2);
  dev_tensor *u = run_on(e, NULL, "ParallelUnpack", &p, 1, NULL, 0, 1);
  expect(u, 0, (double[]){-1, -2}, 2);
  dev_tensor *t[] = {x, ar, a, na, c, p, u};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_release(t[i]);
  bounded_sync(e);
  dev_engine_destroy(e);
}

/* --- trial findings (issue #17) -------------------------------------------- */

/* A tensor on one device is a plain single-device tensor: a MIRRORED read of
 * it returns its one component whatever marks it carries (trial T4, P8);
 * with two components the marks still refuse it. */
static void test_one_device_reads_mirrored(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset d1 = mkset(1, 1), d2 = mkset(1, 2), d3 = mkset(1, 3);
  dev_status st = DEV_STATUS_INIT;
  /* DeviceId placed on [1]: index 0 within its set */
  dev_tensor *id = run_on(e, &d1, "DeviceId", NULL, 0, NULL, 0, 0);
  wait_ok(id);
  int32_t idv = -1;
  if (dev_tensor_to_host(id, &MIR, 0, &idv, sizeof idv, &st) != PD_OK)
    fail_msg("DeviceId on [1], MIRRORED: %s", st.msg);
  assert_int_equal(idv, 0);
  /* a sharded upload onto one device */
  dev_tensor *sh = up(e, &d2, SH0, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  wait_ok(sh);
  double v[3] = {0};
  if (dev_tensor_to_host(sh, &MIR, 0, v, sizeof v, &st) != PD_OK)
    fail_msg("sharded on [2], MIRRORED: %s", st.msg);
  const double w123[3] = {1, 2, 3};
  tu_assert_close(v, w123, 3, 0, 0);
  /* and what is computed from it */
  dev_tensor *n = run_on(e, NULL, "Neg", &sh, 1, NULL, 0, 0);
  wait_ok(n);
  if (dev_tensor_to_host(n, &MIR, 0, v, sizeof v, &st) != PD_OK)
    fail_msg("Neg of sharded on [2], MIRRORED: %s", st.msg);
  const double wn[3] = {-1, -2, -3};
  tu_assert_close(v, wn, 3, 0, 0);
  /* ParallelPack of one input on [3] */
  dev_tensor *b = up(e, &d3, MIR, 1, (int64_t[]){2}, (double[]){3, 4});
  dev_tensor *p = run_on(e, NULL, "ParallelPack", &b, 1, NULL, 0, 0);
  expect_set(p, &d3);
  wait_ok(p);
  double pv[2] = {0};
  if (dev_tensor_to_host(p, &MIR, 0, pv, sizeof pv, &st) != PD_OK)
    fail_msg("pack of one on [3], MIRRORED: %s", st.msg);
  const double w34[2] = {3, 4};
  tu_assert_close(pv, w34, 2, 0, 0);
  uint64_t bytes = 0;
  assert_int_equal(dev_tensor_host_size(p, &MIR, 0, NULL, &bytes, &st), PD_OK);
  assert_int_equal(bytes, 16);
  /* a per-component upload onto one device */
  dev_shape s2;
  assert_int_equal(dev_shape_make(1, (int64_t[]){2}, &s2, NULL), PD_OK);
  const void *datas[1] = {(double[]){5, 6}};
  dev_tensor *pc = NULL;
  assert_int_equal(
      dev_tensor_from_components_on(e, &d1, PD_FLOAT64, &s2, datas, &pc, &st),
      PD_OK);
  wait_ok(pc);
  if (dev_tensor_to_host(pc, &MIR, 0, pv, sizeof pv, &st) != PD_OK)
    fail_msg("per-component on [1], MIRRORED: %s", st.msg);
  const double w56[2] = {5, 6};
  tu_assert_close(pv, w56, 2, 0, 0);
  /* two components: still refused */
  dev_tensor *two[2] = {b, pc};
  dev_tensor *p2 = run_on(e, NULL, "ParallelPack", two, 2, NULL, 0, 0);
  wait_ok(p2);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_to_host(p2, &MIR, 0, pv, sizeof pv, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "not mirrored"));
  dev_tensor *t[] = {id, sh, n, b, p, pc, p2};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_release(t[i]);
  bounded_sync(e);
  dev_engine_destroy(e);
}

/* A placement op as a node of a graph function is refused at registration
 * (it could never be called), naming the function and the node (T5). */
static void test_placement_ops_refused_in_functions(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  const char *in_x[] = {"x"};
  dev_attr to0 = dev_attr_int_list("devices", (int64_t[]){0}, 1);
  struct {
    const char *op;
    const dev_attr *attrs;
    int na;
  } cases[] = {{"ParallelUnpack", NULL, 0},
               {"ParallelPack", NULL, 0},
               {"CopyToDevices", &to0, 1}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    dev_fn_node node = {.name = "moved",
                        .op = cases[k].op,
                        .inputs = in_x,
                        .num_inputs = 1,
                        .attrs = cases[k].attrs,
                        .num_attrs = cases[k].na};
    dev_fn_arg arg = {"x", PD_FLOAT64};
    dev_fn_output out = {"y", "moved"};
    dev_fn_def def = DEV_FN_DEF_INITIALIZER;
    def.name = "mover";
    def.args = &arg;
    def.num_args = 1;
    def.nodes = &node;
    def.num_nodes = 1;
    def.outputs = &out;
    def.num_outputs = 1;
    dev_fn_options opt = DEV_FN_OPTIONS_INITIALIZER;
    bool existed = false;
    dev_status st = DEV_STATUS_INIT;
    pd_code rc = dev_fn_register(lib, &def, &opt, &existed, &st);
    if (rc != PD_INVALID_ARGUMENT)
      fail_msg("%s: got %s (%s)", cases[k].op, pd_code_name(rc), st.msg);
    char want[160];
    snprintf(want, sizeof want,
             "function 'mover', node 'moved': %s moves a value between "
             "device sets and cannot be a node of a graph function",
             cases[k].op);
    if (!strstr(st.msg, want)) fail_msg("'%s' not in: %s", want, st.msg);
  }
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* Broadcast's root is an index within the input's set, and its error says
 * so naming the set (P2). */
static void test_broadcast_root_within_set(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset s31 = mkset(2, 3, 1);
  dev_tensor *x = up(e, &s31, SH0, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  dev_attr r1 = dev_attr_int("root", 1);
  dev_tensor *y = run_on(e, NULL, "Broadcast", &x, 1, &r1, 1, 0);
  expect(y, 0, (double[]){3, 4}, 2); /* component 1, on device 1 */
  expect(y, 1, (double[]){3, 4}, 2);
  dev_attr r2 = dev_attr_int("root", 2);
  refused(e, NULL, "Broadcast", &x, 1, &r2, 1, PD_INVALID_ARGUMENT,
          "'root' is 2; expected an index within the input's device set "
          "[3, 1] (0 to 1)",
          NULL);
  dev_attr r3 = dev_attr_int("root", 3); /* an engine device of the set */
  refused(e, NULL, "Broadcast", &x, 1, &r3, 1, PD_INVALID_ARGUMENT,
          "'root' is 3", "[3, 1] (0 to 1)", NULL);
  dev_tensor_release(y);
  dev_tensor_release(x);
  bounded_sync(e);
  dev_engine_destroy(e);
}

/* An output gradient on another set than the target is the caller's error,
 * said up front naming both sets (P6), not by the first VJP's op. */
static void test_output_gradient_on_other_set(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset s23 = mkset(2, 2, 3), s01 = mkset(2, 0, 1), s32 = mkset(2, 3, 2);
  dev_tape *tp = NULL;
  assert_int_equal(dev_tape_create(e, true, &tp, NULL), PD_OK);
  dev_tensor *a = up(e, &s23, MIR, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tape_watch(tp, a, NULL);
  dev_tensor *aa[2] = {a, a};
  dev_tensor *y = taped(e, tp, "Mul", aa, 2, NULL, 0, 0);
  dev_attr ax = dev_attr_int_list("axis", (int64_t[]){0}, 1);
  dev_tensor *l = taped(e, tp, "Sum", &y, 1, &ax, 1, 0);
  dev_tensor *ogs[3] = {
      up(e, &s01, MIR, 0, NULL, (double[]){1}),
      up(e, &s32, MIR, 0, NULL, (double[]){1}), /* same devices, other order */
      up(e, &s23, MIR, 0, NULL, (double[]){3}),
  };
  const char *want[2] = {
      "output_gradient is on devices [0, 1] but the target "
      "on [2, 3]",
      "output_gradient is on devices [3, 2] but the target "
      "on [2, 3]"};
  for (int k = 0; k < 2; k++) {
    dev_tensor *g = NULL;
    dev_status st = DEV_STATUS_INIT;
    pd_code rc = dev_tape_gradient(tp, l, &a, 1, &ogs[k], &g, &st);
    if (rc != PD_INVALID_ARGUMENT)
      fail_msg("og %d: got %s (%s)", k, pd_code_name(rc), st.msg);
    if (!strstr(st.msg, want[k]) || !strstr(st.msg, "CopyToDevices"))
      fail_msg("og %d: %s", k, st.msg);
    assert_null(strstr(st.msg, "BroadcastToLike"));
  }
  /* on the target's set: d(3 * sum a^2)/da = 6a */
  dev_tensor *g = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_tape_gradient(tp, l, &a, 1, &ogs[2], &g, &st) != PD_OK)
    fail_msg("gradient: %s", st.msg);
  expect_set(g, &s23);
  for (int c = 0; c < 2; c++) expect(g, c, (double[]){6, 12}, 2);
  dev_tensor_release(g);
  dev_tape_destroy(tp);
  dev_tensor *t[] = {a, y, l, ogs[0], ogs[1], ogs[2]};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_release(t[i]);
  bounded_sync(e);
  dev_engine_destroy(e);
}

/* A time sink is written only by the devices of output 0: its owner (the
 * scheduler's queued op) goes once output 0 is ready, and ParallelUnpack's
 * other devices may run their part later (here device 2, held). */
static void test_time_sink_only_output0_devices(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_devset s = mkset(2, 1, 2);
  dev_tensor *x = up(e, &s, SH0, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  wait_ok(x);
  uint64_t *sink = calloc(1, sizeof *sink);
  assert_non_null(sink);
  dev_engine_test_hold(e, 2, true);
  dev_op *op = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_op_prepare(e, "ParallelUnpack", &x, 1, NULL, 0, &op, &st) != PD_OK)
    fail_msg("unpack: %s", st.msg);
  dev_tensor *o0 = dev_op_output(op, 0), *o1 = dev_op_output(op, 1);
  dev_tensor_retain(o0);
  dev_tensor_retain(o1);
  dev_op_set_time_sink(op, sink);
  dev_op_submit(e, op);
  expect(o0, 0, (double[]){1, 2}, 2); /* device 1 alone */
  const uint64_t seen = __atomic_load_n(sink, __ATOMIC_RELAXED);
  dev_engine_test_hold(e, 2, false);
  expect(o1, 0, (double[]){3, 4}, 2);
  bounded_sync(e);
  assert_int_equal(__atomic_load_n(sink, __ATOMIC_RELAXED), seen);
  free(sink);
  dev_tensor_release(o0);
  dev_tensor_release(o1);
  dev_tensor_release(x);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ops_on_subsets),
      cmocka_unit_test(test_device_id_within_set),
      cmocka_unit_test(test_mixed_sets_refused),
      cmocka_unit_test(test_collectives_on_subsets),
      cmocka_unit_test(test_overlapping_collectives_two_threads),
      cmocka_unit_test(test_batches_spanning_two_sets),
      cmocka_unit_test(test_sync_and_watch_after_subset),
      cmocka_unit_test(test_pack_unpack_share_buffers),
      cmocka_unit_test(test_copy_to_devices),
      cmocka_unit_test(test_copy_waits_for_source_device),
      cmocka_unit_test(test_batch_of_mixed_sets),
      cmocka_unit_test(test_placement_vjps),
      cmocka_unit_test(test_function_on_subset),
      cmocka_unit_test(test_failed_input_on_subset),
      cmocka_unit_test(test_fenced_backend),
      cmocka_unit_test(test_one_device_reads_mirrored),
      cmocka_unit_test(test_placement_ops_refused_in_functions),
      cmocka_unit_test(test_broadcast_root_within_set),
      cmocka_unit_test(test_output_gradient_on_other_set),
      cmocka_unit_test(test_time_sink_only_output0_devices),
  };
  return cmocka_run_group_tests_name("placement", tests, NULL, NULL);
}
