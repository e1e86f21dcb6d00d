/* Tests of the list-output ops and Pack (device/ops/split_pack.c): Split,
 * SplitV, Unpack and Pack against hand-computed values (negative axes, more
 * outputs than the old limit of 8, sharded inputs splitting each
 * component's own shape), their errors, dev_op_output_length, and their
 * VJPs through the tape against hand-computed gradients, with the round
 * trip Pack(Unpack(x)) == x. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_backend.h"
#include "testutil.h"

static dev_engine *g_e1, *g_e2;

static int setup(void **state) {
  (void)state;
  g_e1 = tu_engine(1, 0);
  g_e2 = tu_engine(2, 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  dev_engine_destroy(g_e1);
  dev_engine_destroy(g_e2);
  return 0;
}

/* x = 0, 1, 2, ... of the given shape (float64, mirrored). */
static dev_tensor *iota(dev_engine *e, int rank, const int64_t *dims) {
  int64_t n = tu_count(rank, dims);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = (double)i;
  dev_tensor *t = tu_mirrored(e, PD_FLOAT64, rank, dims, v);
  free(v);
  return t;
}

/* Runs op, asserts success and n_want outputs, returns them in outs. */
static void exec_all(dev_engine *e, const char *op, dev_tensor *const *in,
                     int n_in, const dev_attr *attrs, int n_attrs,
                     dev_tensor **outs, int n_want) {
  int n_out = DEV_MAX_OUTPUTS;
  dev_status st = DEV_STATUS_INIT;
  if (dev_execute(e, op, in, n_in, attrs, n_attrs, outs, &n_out, &st) != PD_OK)
    fail_msg("%s failed: %s: %s", op, pd_code_name(st.code), st.msg);
  assert_int_equal(n_out, n_want);
}

static void release_all(dev_tensor **t, int n) {
  for (int i = 0; i < n; i++) dev_tensor_release(t[i]);
}

static void assert_shape(dev_tensor *t, int rank, const int64_t *dims) {
  const dev_shape *s = dev_tensor_shape(t);
  assert_int_equal(s->rank, rank);
  for (int i = 0; i < rank; i++) assert_int_equal(s->dims[i], dims[i]);
}

static void test_split(void **state) {
  (void)state;
  int64_t d[2] = {2, 6};
  dev_tensor *x = iota(g_e1, 2, d);
  const int64_t axes[2] = {1, -1};
  for (int k = 0; k < 2; k++) {
    dev_attr a[2] = {dev_attr_int("axis", axes[k]),
                     dev_attr_int("num_split", 3)};
    dev_tensor *o[DEV_MAX_OUTPUTS] = {0};
    exec_all(g_e1, "Split", &x, 1, a, 2, o, 3);
    const double want[3][4] = {{0, 1, 6, 7}, {2, 3, 8, 9}, {4, 5, 10, 11}};
    int64_t ds[2] = {2, 2};
    for (int j = 0; j < 3; j++) {
      assert_shape(o[j], 2, ds);
      tu_assert_tensor_close(o[j], 0, want[j], 4, 0, 0);
    }
    release_all(o, 3);
  }
  /* along axis 0 (-2): rows */
  dev_attr a[2] = {dev_attr_int("axis", -2), dev_attr_int("num_split", 2)};
  dev_tensor *o[DEV_MAX_OUTPUTS] = {0};
  exec_all(g_e1, "Split", &x, 1, a, 2, o, 2);
  const double r1[6] = {6, 7, 8, 9, 10, 11};
  tu_assert_tensor_close(o[1], 0, r1, 6, 0, 0);
  release_all(o, 2);
  dev_tensor_release(x);
}

/* More outputs than the old DEV_MAX_OUTPUTS of 8, on a 2-device mesh. */
static void test_split_many(void **state) {
  (void)state;
  int64_t d[2] = {12, 2};
  dev_tensor *x = iota(g_e2, 2, d);
  dev_attr a[2] = {dev_attr_int("axis", 0), dev_attr_int("num_split", 12)};
  dev_tensor *o[DEV_MAX_OUTPUTS] = {0};
  exec_all(g_e2, "Split", &x, 1, a, 2, o, 12);
  for (int j = 0; j < 12; j++) {
    double want[2] = {2.0 * j, 2.0 * j + 1};
    tu_assert_tensor_close(o[j], 0, want, 2, 0, 0);
    tu_assert_tensor_close(o[j], 1, want, 2, 0, 0);
  }
  release_all(o, 12);
  dev_tensor_release(x);
}

static void test_splitv(void **state) {
  (void)state;
  int64_t d[2] = {2, 6};
  dev_tensor *x = iota(g_e1, 2, d);
  const int64_t sz[3] = {1, -1, 2};
  dev_attr a[2] = {dev_attr_int_list("size_splits", sz, 3),
                   dev_attr_int("axis", -1)};
  dev_tensor *o[DEV_MAX_OUTPUTS] = {0};
  exec_all(g_e1, "SplitV", &x, 1, a, 2, o, 3);
  const double w0[2] = {0, 6}, w1[6] = {1, 2, 3, 7, 8, 9},
               w2[4] = {4, 5, 10, 11};
  int64_t s0[2] = {2, 1}, s1[2] = {2, 3}, s2[2] = {2, 2};
  assert_shape(o[0], 2, s0);
  assert_shape(o[1], 2, s1);
  assert_shape(o[2], 2, s2);
  tu_assert_tensor_close(o[0], 0, w0, 2, 0, 0);
  tu_assert_tensor_close(o[1], 0, w1, 6, 0, 0);
  tu_assert_tensor_close(o[2], 0, w2, 4, 0, 0);
  release_all(o, 3);
  /* a zero-sized part */
  const int64_t z[2] = {0, 6};
  dev_attr b[2] = {dev_attr_int_list("size_splits", z, 2),
                   dev_attr_int("axis", 1)};
  exec_all(g_e1, "SplitV", &x, 1, b, 2, o, 2);
  int64_t e0[2] = {2, 0};
  assert_shape(o[0], 2, e0);
  const double all[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  tu_assert_tensor_close(o[1], 0, all, 12, 0, 0);
  release_all(o, 2);
  dev_tensor_release(x);
}

static void test_unpack_pack(void **state) {
  (void)state;
  int64_t d[2] = {2, 3};
  dev_tensor *x = iota(g_e1, 2, d);
  dev_attr a0[2] = {dev_attr_int("num", 2), dev_attr_int("axis", 0)};
  dev_tensor *o[DEV_MAX_OUTPUTS] = {0};
  exec_all(g_e1, "Unpack", &x, 1, a0, 2, o, 2);
  const double u0[3] = {0, 1, 2}, u1[3] = {3, 4, 5};
  int64_t s3[1] = {3};
  assert_shape(o[0], 1, s3);
  tu_assert_tensor_close(o[0], 0, u0, 3, 0, 0);
  tu_assert_tensor_close(o[1], 0, u1, 3, 0, 0);
  /* Pack them back along a new last axis: the transpose */
  dev_attr p1 = dev_attr_int("axis", -1);
  dev_tensor *t = tu_exec(g_e1, "Pack", o, 2, &p1, 1, 0);
  int64_t s32[2] = {3, 2};
  assert_shape(t, 2, s32);
  const double tr[6] = {0, 3, 1, 4, 2, 5};
  tu_assert_tensor_close(t, 0, tr, 6, 0, 0);
  dev_tensor_release(t);
  release_all(o, 2);

  dev_attr a1[2] = {dev_attr_int("num", 3), dev_attr_int("axis", -1)};
  exec_all(g_e1, "Unpack", &x, 1, a1, 2, o, 3);
  const double c1[2] = {1, 4};
  int64_t s2[1] = {2};
  assert_shape(o[1], 1, s2);
  tu_assert_tensor_close(o[1], 0, c1, 2, 0, 0);
  /* round trip: Pack(Unpack(x, axis 1), axis 1) == x */
  dev_attr p = dev_attr_int("axis", 1);
  dev_tensor *y = tu_exec(g_e1, "Pack", o, 3, &p, 1, 0);
  assert_shape(y, 2, d);
  const double xs[6] = {0, 1, 2, 3, 4, 5};
  tu_assert_tensor_close(y, 0, xs, 6, 0, 0);
  dev_tensor_release(y);
  release_all(o, 3);

  /* Pack of scalars (default axis 0) */
  double v1 = 7, v2 = -2;
  dev_tensor *sc[2] = {tu_mirrored(g_e1, PD_FLOAT32, 0, NULL, &v1),
                       tu_mirrored(g_e1, PD_FLOAT32, 0, NULL, &v2)};
  dev_tensor *v = tu_exec(g_e1, "Pack", sc, 2, NULL, 0, 0);
  const double vv[2] = {7, -2};
  assert_shape(v, 1, s2);
  tu_assert_tensor_close(v, 0, vv, 2, 0, 0);
  dev_tensor_release(v);
  release_all(sc, 2);
  dev_tensor_release(x);
}

/* A sharded input: each component splits its own shape. */
static void test_sharded(void **state) {
  (void)state;
  int64_t d[2] = {4, 6};
  double v[24];
  for (int i = 0; i < 24; i++) v[i] = i;
  dev_tensor *x = tu_sharded(g_e2, PD_FLOAT64, 2, d, 0, v); /* [2,6] each */
  dev_attr a[2] = {dev_attr_int("axis", 1), dev_attr_int("num_split", 2)};
  dev_tensor *o[DEV_MAX_OUTPUTS] = {0};
  exec_all(g_e2, "Split", &x, 1, a, 2, o, 2);
  const double c0[6] = {3, 4, 5, 9, 10, 11}, c1[6] = {15, 16, 17, 21, 22, 23};
  tu_assert_tensor_close(o[1], 0, c0, 6, 0, 0);
  tu_assert_tensor_close(o[1], 1, c1, 6, 0, 0);
  release_all(o, 2);
  /* Unpack along the sharded axis: 2 rows on each component */
  dev_attr u[2] = {dev_attr_int("num", 2), dev_attr_int("axis", 0)};
  exec_all(g_e2, "Unpack", &x, 1, u, 2, o, 2);
  const double r0[6] = {6, 7, 8, 9, 10, 11}, r1[6] = {18, 19, 20, 21, 22, 23};
  tu_assert_tensor_close(o[1], 0, r0, 6, 0, 0);
  tu_assert_tensor_close(o[1], 1, r1, 6, 0, 0);
  release_all(o, 2);
  dev_tensor_release(x);

  /* unequal shards along the split axis: [2,2] and [1,2] */
  int64_t d3[2] = {3, 2};
  dev_tensor *y = tu_sharded(g_e2, PD_FLOAT64, 2, d3, 0, v);
  dev_attr b[2] = {dev_attr_int("axis", 0), dev_attr_int("num_split", 2)};
  tu_exec_fails(g_e2, "Split", &y, 1, b, 2, PD_INVALID_ARGUMENT,
                "(component 1)");
  tu_exec_fails(g_e2, "Split", &y, 1, b, 2, PD_INVALID_ARGUMENT,
                "each component splits its own shard");
  dev_attr n2[2] = {dev_attr_int("num", 2), dev_attr_int("axis", 0)};
  tu_exec_fails(g_e2, "Unpack", &y, 1, n2, 2, PD_INVALID_ARGUMENT,
                "(component 1)");
  dev_tensor_release(y);
}

static void test_errors(void **state) {
  (void)state;
  int64_t d[2] = {2, 5};
  dev_tensor *x = iota(g_e1, 2, d);
  dev_attr a[2] = {dev_attr_int("axis", 1), dev_attr_int("num_split", 2)};
  tu_exec_fails(g_e1, "Split", &x, 1, a, 2, PD_INVALID_ARGUMENT,
                "not divisible by num_split 2");
  a[1] = dev_attr_int("num_split", 0);
  tu_exec_fails(g_e1, "Split", &x, 1, a, 2, PD_INVALID_ARGUMENT,
                "'num_split' is 0; expected 1..64");
  a[1] = dev_attr_int("num_split", 65);
  tu_exec_fails(g_e1, "Split", &x, 1, a, 2, PD_INVALID_ARGUMENT,
                "expected 1..64");
  a[0] = dev_attr_int("axis", 2);
  a[1] = dev_attr_int("num_split", 1);
  tu_exec_fails(g_e1, "Split", &x, 1, a, 2, PD_INVALID_ARGUMENT, "axis");

  const int64_t bad1[2] = {1, 1}, bad2[3] = {-1, -1, 5}, bad3[2] = {4, 3},
                bad4[2] = {-2, 7}, bad5[2] = {6, -1};
  struct {
    const int64_t *v;
    int n;
    const char *needle;
  } cases[] = {{bad1, 2, "sums to 2"},
               {bad2, 3, "at most one -1"},
               {bad3, 2, "sums to more than 5"},
               {bad4, 2, "has -2 at index 0"},
               {bad5, 2, "sums to more than 5"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dev_attr b[2] = {dev_attr_int_list("size_splits", cases[i].v, cases[i].n),
                     dev_attr_int("axis", 1)};
    tu_exec_fails(g_e1, "SplitV", &x, 1, b, 2, PD_INVALID_ARGUMENT,
                  cases[i].needle);
  }
  dev_attr u[2] = {dev_attr_int("num", 3), dev_attr_int("axis", 1)};
  tu_exec_fails(g_e1, "Unpack", &x, 1, u, 2, PD_INVALID_ARGUMENT,
                "'num' is 3 but input 'value' has shape [2, 5]");
  double s = 1;
  dev_tensor *sc = tu_mirrored(g_e1, PD_FLOAT64, 0, NULL, &s);
  tu_exec_fails(g_e1, "Unpack", &sc, 1, u, 2, PD_INVALID_ARGUMENT,
                "is a scalar");
  dev_tensor *pk[2] = {x, sc};
  tu_exec_fails(g_e1, "Pack", pk, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "expected equal shapes");
  dev_attr pa = dev_attr_int("axis", 3);
  dev_tensor *pk2[2] = {x, x};
  tu_exec_fails(g_e1, "Pack", pk2, 2, &pa, 1, PD_INVALID_ARGUMENT, "axis");
  /* dev_execute with room for fewer outputs than the list yields */
  int64_t d12[1] = {12};
  dev_tensor *y = iota(g_e1, 1, d12);
  dev_attr sp[2] = {dev_attr_int("axis", 0), dev_attr_int("num_split", 12)};
  dev_tensor *o[4] = {0};
  int room = 4;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_execute(g_e1, "Split", &y, 1, sp, 2, o, &room, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(
      strstr(st.msg, "yields 12 outputs here; room was given for 4"));
  assert_int_equal(room, 4);
  assert_null(o[0]);
  dev_tensor_release(y);
  dev_tensor_release(sc);
  dev_tensor_release(x);
}

static void test_output_length(void **state) {
  (void)state;
  const dev_op_def *sp = dev_op_lookup("Split");
  assert_int_equal(dev_op_output_length(sp, 0, 12), 12);
  assert_int_equal(dev_op_output_length(sp, 0, 1), 1);
  assert_int_equal(dev_op_output_length(sp, 0, 0), -1);
  assert_int_equal(dev_op_output_length(sp, 1, 3), -1);
  const dev_op_def *mm = dev_op_lookup("MatMul");
  assert_int_equal(dev_op_output_length(mm, 0, 1), 1);
  assert_int_equal(dev_op_output_length(mm, 0, 2), -1);
  dev_op_arg_info ai;
  assert_true(dev_op_def_output(sp, 0, &ai));
  assert_true(ai.is_list);
  assert_string_equal(ai.length_attr, "num_split");
  assert_true(dev_op_def_output(dev_op_lookup("SplitV"), 0, &ai));
  assert_string_equal(ai.length_attr, "size_splits");
  assert_true(dev_op_def_output(mm, 0, &ai));
  assert_false(ai.is_list);
  assert_string_equal(ai.length_attr, "");
}

/* --- VJPs through the tape ------------------------------------------------ */

/* Prepares op, records it on tape, submits; outputs in o (n_want). */
static void tape_exec(dev_tape *tp, const char *op, dev_tensor *const *in,
                      int n, const dev_attr *attrs, int na, dev_tensor **o,
                      int n_want) {
  dev_op *p = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_op_prepare(g_e1, op, in, n, attrs, na, &p, &st) != PD_OK)
    fail_msg("%s: %s", op, st.msg);
  if (dev_tape_record(tp, p, &st) != PD_OK) fail_msg("record: %s", st.msg);
  assert_int_equal(dev_op_num_outputs(p), n_want);
  for (int i = 0; i < n_want; i++) {
    o[i] = dev_op_output(p, i);
    dev_tensor_retain(o[i]);
  }
  dev_op_submit(g_e1, p);
}

static dev_tensor *grad1(dev_tape *tp, dev_tensor *target, dev_tensor *src) {
  dev_tensor *g = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_tape_gradient(tp, target, &src, 1, NULL, &g, &st) != PD_OK)
    fail_msg("gradient: %s", st.msg);
  return g;
}

static dev_tape *new_tape(dev_tensor *watch) {
  dev_tape *tp = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tape_create(g_e1, true, &tp, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, watch, &st), PD_OK);
  return tp;
}

/* target = o0 + o2 * o2 of Split(x [2,3], axis -1, 3): d/dx = 1 in column 0,
 * 0 in column 1 (no gradient reached o1: zeros), 2 * x in column 2. */
static void test_vjp_split(void **state) {
  (void)state;
  const double xv[6] = {1, 2, 3, 4, 5, 6};
  int64_t d[2] = {2, 3};
  dev_tensor *x = tu_mirrored(g_e1, PD_FLOAT64, 2, d, xv);
  dev_tape *tp = new_tape(x);
  dev_tensor *o[3], *sq, *t;
  dev_attr a[2] = {dev_attr_int("axis", -1), dev_attr_int("num_split", 3)};
  tape_exec(tp, "Split", &x, 1, a, 2, o, 3);
  dev_tensor *in2[2] = {o[2], o[2]};
  tape_exec(tp, "Mul", in2, 2, NULL, 0, &sq, 1);
  dev_tensor *in3[2] = {o[0], sq};
  tape_exec(tp, "Add", in3, 2, NULL, 0, &t, 1);
  dev_tensor *g = grad1(tp, t, x);
  const double want[6] = {1, 0, 6, 1, 0, 12};
  tu_assert_tensor_close(g, 0, want, 6, 1e-15, 0);
  dev_tensor_release(g);

  /* SplitV [1, 2] on axis 1: target = o1 * 3 (o0 gets zeros) */
  const int64_t sz[2] = {1, -1};
  dev_attr b[2] = {dev_attr_int_list("size_splits", sz, 2),
                   dev_attr_int("axis", 1)};
  dev_tensor *v[2], *m;
  tape_exec(tp, "SplitV", &x, 1, b, 2, v, 2);
  dev_tensor *in4[2] = {v[1], v[1]};
  tape_exec(tp, "Add", in4, 2, NULL, 0, &m, 1);
  g = grad1(tp, m, x);
  const double want2[6] = {0, 2, 2, 0, 2, 2};
  tu_assert_tensor_close(g, 0, want2, 6, 1e-15, 0);
  dev_tensor_release(g);
  dev_tensor_release(m);
  release_all(v, 2);
  dev_tape_destroy(tp);
  release_all(o, 3);
  dev_tensor_release(sq);
  dev_tensor_release(t);
  dev_tensor_release(x);
}

/* Unpack x [2,3] on axis 0 and target = u1 * u1: d/dx = 0 in row 0, 2 x in
 * row 1. Pack a, b on axis 1 and target = p * w: da = w[:, 0], db = w[:, 1]. */
static void test_vjp_unpack_pack(void **state) {
  (void)state;
  const double xv[6] = {1, 2, 3, 4, 5, 6};
  int64_t d[2] = {2, 3};
  dev_tensor *x = tu_mirrored(g_e1, PD_FLOAT64, 2, d, xv);
  dev_tape *tp = new_tape(x);
  dev_tensor *u[2], *t;
  dev_attr a[2] = {dev_attr_int("num", 2), dev_attr_int("axis", 0)};
  tape_exec(tp, "Unpack", &x, 1, a, 2, u, 2);
  dev_tensor *in2[2] = {u[1], u[1]};
  tape_exec(tp, "Mul", in2, 2, NULL, 0, &t, 1);
  dev_tensor *g = grad1(tp, t, x);
  const double want[6] = {0, 0, 0, 8, 10, 12};
  tu_assert_tensor_close(g, 0, want, 6, 1e-15, 0);
  dev_tensor_release(g);
  dev_tape_destroy(tp);
  release_all(u, 2);
  dev_tensor_release(t);
  dev_tensor_release(x);

  const double av[2] = {1, 2}, bv[2] = {3, 4}, wv[4] = {1, 2, 3, 4};
  int64_t d2[1] = {2}, d22[2] = {2, 2};
  dev_tensor *ab[2] = {tu_mirrored(g_e1, PD_FLOAT64, 1, d2, av),
                       tu_mirrored(g_e1, PD_FLOAT64, 1, d2, bv)};
  dev_tensor *w = tu_mirrored(g_e1, PD_FLOAT64, 2, d22, wv);
  tp = new_tape(ab[0]);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tape_watch(tp, ab[1], &st), PD_OK);
  dev_tensor *p, *pw;
  dev_attr pa = dev_attr_int("axis", 1);
  tape_exec(tp, "Pack", ab, 2, &pa, 1, &p, 1);
  dev_tensor *in3[2] = {p, w};
  tape_exec(tp, "Mul", in3, 2, NULL, 0, &pw, 1);
  dev_tensor *gs[2] = {0};
  assert_int_equal(dev_tape_gradient(tp, pw, ab, 2, NULL, gs, &st), PD_OK);
  const double ga[2] = {1, 3}, gb[2] = {2, 4};
  tu_assert_tensor_close(gs[0], 0, ga, 2, 1e-15, 0);
  tu_assert_tensor_close(gs[1], 0, gb, 2, 1e-15, 0);
  release_all(gs, 2);
  dev_tape_destroy(tp);
  dev_tensor_release(p);
  dev_tensor_release(pw);
  dev_tensor_release(w);
  release_all(ab, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_split_many),
      cmocka_unit_test(test_splitv),
      cmocka_unit_test(test_unpack_pack),
      cmocka_unit_test(test_sharded),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_output_length),
      cmocka_unit_test(test_vjp_split),
      cmocka_unit_test(test_vjp_unpack_pack),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
