/* Unit tests of the element-wise ops (device/ops/elementwise.c): unary math,
 * binary arithmetic and comparisons with NumPy broadcasting, Cast, Fill,
 * ZerosLike and OnesLike.
 *
 * Expected values are worked out by hand (written in the tests), by a
 * float64 reference written here for random broadcasting shapes, or, for
 * float16/bfloat16 rounding, by decoding bit patterns with this file's own
 * decoder. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const pd_dtype k_float_dtypes[] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16,
                                          PD_BFLOAT16};
static const pd_dtype k_number_dtypes[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                                           PD_BFLOAT16, PD_INT32,   PD_INT64,
                                           PD_UINT8};
static const pd_dtype k_all_dtypes[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                                        PD_BFLOAT16, PD_INT32,   PD_INT64,
                                        PD_UINT8,    PD_BOOL};

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */

static dev_tensor *mk(dev_engine *e, pd_dtype dt, int rank, const int64_t *dims,
                      const double *vals) {
  return tu_mirrored(e, dt, rank, dims, vals);
}

static dev_tensor *run1(dev_engine *e, const char *op, dev_tensor *x) {
  dev_tensor *in[1] = {x};
  return tu_exec(e, op, in, 1, NULL, 0, 0);
}

static dev_tensor *run2(dev_engine *e, const char *op, dev_tensor *x,
                        dev_tensor *y) {
  dev_tensor *in[2] = {x, y};
  return tu_exec(e, op, in, 2, NULL, 0, 0);
}

static dev_tensor *cast(dev_engine *e, dev_tensor *x, pd_dtype dst) {
  dev_tensor *in[1] = {x};
  dev_attr a[1] = {dev_attr_dtype("DstT", dst)};
  return tu_exec(e, "Cast", in, 1, a, 1, 0);
}

#define check(t, want, n, rtol, atol)                                          \
  tu_assert_tensor_close((t), 0, (want), (n), (rtol), (atol))

static dev_tensor *raw_mirrored(dev_engine *e, pd_dtype dt, int rank,
                                const int64_t *dims, const void *data) {
  dev_shape s;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_shape_make(rank, dims, &s, &st), PD_OK);
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *t = NULL;
  if (dev_tensor_from_host(e, dt, &lay, &s, data, &t, &st) != PD_OK)
    fail_msg("upload: %s", st.msg);
  return t;
}

/* Downloads component c of t as raw bytes; asserts the size is `bytes`. */
static void read_raw(dev_tensor *t, int c, void *buf, size_t bytes) {
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_wait(t, &st) != PD_OK)
    fail_msg("tensor failed: %s: %s", pd_code_name(st.code), st.msg);
  dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, c};
  dev_shape hs;
  uint64_t got = 0;
  assert_int_equal(dev_tensor_host_size(t, &lay, 0, &hs, &got, &st), PD_OK);
  assert_int_equal(got, bytes);
  if (dev_tensor_to_host(t, &lay, 0, buf, bytes ? bytes : 1, &st) != PD_OK)
    fail_msg("download: %s", st.msg);
}

/* The test's own IEEE binary16 decoder. */
static double half_value(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  int m = h & 0x3ff;
  double v;
  if (e == 0x1f)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, -24);
  else
    v = ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

static double bf16_value(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Asserts that a good op still runs on e. */
static void engine_still_works(dev_engine *e) {
  const int64_t d[1] = {2};
  dev_tensor *x = mk(e, PD_FLOAT32, 1, d, (const double[]){1, 2});
  dev_tensor *z = run2(e, "Add", x, x);
  check(z, ((const double[]){2, 4}), 2, 0, 0);
  dev_tensor_release(z);
  dev_tensor_release(x);
}

/* ------------------------------------------------------------------------ */
/* Unary                                                                    */

static void test_unary_exact_floats(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[2] = {2, 3};
  const double x[6] = {-2, -0.5, 0, 0.5, 1, 3};
  const double neg[6] = {2, 0.5, 0, -0.5, -1, -3};
  const double abs_[6] = {2, 0.5, 0, 0.5, 1, 3};
  const double sq[6] = {4, 0.25, 0, 0.25, 1, 9};
  const double relu[6] = {0, 0, 0, 0.5, 1, 3};
  for (int k = 0; k < N_OF(k_float_dtypes); k++) {
    pd_dtype dt = k_float_dtypes[k];
    dev_tensor *t = mk(e, dt, 2, d, x);
    const char *ops[4] = {"Neg", "Abs", "Square", "Relu"};
    const double *want[4] = {neg, abs_, sq, relu};
    for (int o = 0; o < 4; o++) {
      dev_tensor *y = run1(e, ops[o], t);
      assert_int_equal(dev_tensor_dtype(y), dt);
      tu_assert_shape(dev_tensor_shape(y), 2, 2, 3);
      check(y, want[o], 6, 0, 0);
      dev_tensor_release(y);
    }
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

/* Relu and the float ops keep NaN a NaN; Log(0) = -inf, Rsqrt(0) = inf. */
static void test_unary_special_values(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {4};
  for (int k = 0; k < N_OF(k_float_dtypes); k++) {
    pd_dtype dt = k_float_dtypes[k];
    dev_tensor *t = mk(e, dt, 1, d, (const double[]){NAN, 0, -1, INFINITY});
    struct {
      const char *op;
      double want[4];
    } cases[] = {
        {"Relu", {NAN, 0, 0, INFINITY}},
        {"Abs", {NAN, 0, 1, INFINITY}},
        {"Log", {NAN, -INFINITY, NAN, INFINITY}},
        {"Sqrt", {NAN, 0, NAN, INFINITY}},
        {"Rsqrt", {NAN, INFINITY, NAN, 0}},
        {"Exp", {NAN, 1, 0.36787944117144233, INFINITY}},
        {"Tanh", {NAN, 0, -0.7615941559557649, 1}},
        {"Sigmoid", {NAN, 0.5, 0.2689414213699951, 1}},
    };
    for (int c = 0; c < N_OF(cases); c++) {
      dev_tensor *y = run1(e, cases[c].op, t);
      check(y, cases[c].want, 4, tu_rtol_f64_op(dt), 0);
      dev_tensor_release(y);
    }
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

static void test_unary_math(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {5};
  struct {
    const char *op;
    double x[5];
    double want[5];
  } cases[] = {
      {"Exp",
       {0, 1, -1, 2, 0.5},
       {1, 2.718281828459045, 0.36787944117144233, 7.38905609893065,
        1.6487212707001282}},
      {"Log",
       {1, 2, 0.5, 4, 8},
       {0, 0.6931471805599453, -0.6931471805599453, 1.3862943611198906,
        2.0794415416798357}},
      {"Sqrt", {0, 4, 2, 0.25, 9}, {0, 2, 1.4142135623730951, 0.5, 3}},
      {"Rsqrt", {4, 0.25, 2, 1, 16}, {0.5, 2, 0.7071067811865475, 1, 0.25}},
      {"Tanh",
       {0, 0.5, -1, 20, -0.5},
       {0, 0.46211715726000974, -0.7615941559557649, 1, -0.46211715726000974}},
      {"Sigmoid",
       {0, 2, -2, 0.5, 1},
       {0.5, 0.8807970779778823, 0.11920292202211755, 0.6224593312018546,
        0.7310585786300049}},
  };
  for (int k = 0; k < N_OF(k_float_dtypes); k++) {
    pd_dtype dt = k_float_dtypes[k];
    for (int c = 0; c < N_OF(cases); c++) {
      dev_tensor *t = mk(e, dt, 1, d, cases[c].x);
      dev_tensor *y = run1(e, cases[c].op, t);
      assert_int_equal(dev_tensor_dtype(y), dt);
      check(y, cases[c].want, 5, tu_rtol_f64_op(dt), 0);
      dev_tensor_release(y);
      dev_tensor_release(t);
    }
  }
  dev_engine_destroy(e);
}

/* Sigmoid of large |x| is 1 or (almost) 0, never NaN; exp(-|x|) is what
 * it must use. */
static void test_sigmoid_stable(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {6};
  const double x[6] = {100, -100, 1000, -1000, 60000, -60000};
  const double want[6] = {1, 3.720075976020836e-44, 1, 0, 1, 0};
  for (int k = 0; k < N_OF(k_float_dtypes); k++) {
    pd_dtype dt = k_float_dtypes[k];
    dev_tensor *t = mk(e, dt, 1, d, x);
    dev_tensor *y = run1(e, "Sigmoid", t);
    /* float16/bfloat16 cannot hold 3.7e-44 (flush to 0), float32 holds it as
     * a subnormal: absolute tolerance far below any normal number. */
    check(y, want, 6, tu_rtol_f64_op(dt), 1e-40);
    dev_tensor_release(y);
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

static void test_unary_int(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  {
    const int64_t d[1] = {5};
    int32_t x[5] = {-3, 0, 5, INT32_MIN, 46341};
    dev_tensor *t = raw_mirrored(e, PD_INT32, 1, d, x);
    struct {
      const char *op;
      int32_t want[5];
    } cases[] = {
        {"Neg", {3, 0, -5, INT32_MIN, -46341}},
        {"Abs", {3, 0, 5, INT32_MIN, 46341}},
        /* 46341^2 = 2147488281 wraps to 2147488281 - 2^32 */
        {"Square", {9, 0, 25, 0, -2147479015}},
        {"Relu", {0, 0, 5, 0, 46341}},
    };
    for (int c = 0; c < N_OF(cases); c++) {
      dev_tensor *y = run1(e, cases[c].op, t);
      assert_int_equal(dev_tensor_dtype(y), PD_INT32);
      int32_t got[5];
      read_raw(y, 0, got, sizeof got);
      for (int i = 0; i < 5; i++) assert_int_equal(got[i], cases[c].want[i]);
      dev_tensor_release(y);
    }
    dev_tensor_release(t);
  }
  {
    const int64_t d[1] = {4};
    int64_t x[4] = {-7, INT64_MIN, INT64_MAX, 3037000500};
    dev_tensor *t = raw_mirrored(e, PD_INT64, 1, d, x);
    struct {
      const char *op;
      int64_t want[4];
    } cases[] = {
        {"Neg", {7, INT64_MIN, -INT64_MAX, -3037000500}},
        {"Abs", {7, INT64_MIN, INT64_MAX, 3037000500}},
        /* INT64_MAX^2 = 1 (mod 2^64); 3037000500^2 = 9223372037000250000
         * wraps to 9223372037000250000 - 2^64 */
        {"Square", {49, 0, 1, -9223372036709301616}},
        {"Relu", {0, 0, INT64_MAX, 3037000500}},
    };
    for (int c = 0; c < N_OF(cases); c++) {
      dev_tensor *y = run1(e, cases[c].op, t);
      int64_t got[4];
      read_raw(y, 0, got, sizeof got);
      for (int i = 0; i < 4; i++) assert_int_equal(got[i], cases[c].want[i]);
      dev_tensor_release(y);
    }
    dev_tensor_release(t);
  }
  {
    const int64_t d[1] = {4};
    dev_tensor *t = mk(e, PD_UINT8, 1, d, (const double[]){0, 1, 200, 16});
    struct {
      const char *op;
      double want[4];
    } cases[] = {
        {"Neg", {0, 255, 56, 240}},
        {"Abs", {0, 1, 200, 16}},
        {"Square", {0, 1, 64, 0}}, /* 40000 % 256 = 64, 256 % 256 = 0 */
        {"Relu", {0, 1, 200, 16}},
    };
    for (int c = 0; c < N_OF(cases); c++) {
      dev_tensor *y = run1(e, cases[c].op, t);
      assert_int_equal(dev_tensor_dtype(y), PD_UINT8);
      check(y, cases[c].want, 4, 0, 0);
      dev_tensor_release(y);
    }
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

/* Blocks of the float16/bfloat16 path: lengths around the block size. */
static void test_unary_half_long(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t lens[] = {255, 256, 257, 1000};
  for (int l = 0; l < N_OF(lens); l++) {
    int64_t n = lens[l];
    double *x = malloc((size_t)n * sizeof *x),
           *xr = malloc((size_t)n * sizeof *x);
    double *want = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    assert_non_null(xr);
    assert_non_null(want);
    tu_fill_random(x, n, -4, 4, (uint64_t)(n + 1));
    pd_dtype dts[2] = {PD_FLOAT16, PD_BFLOAT16};
    for (int k = 0; k < 2; k++) {
      dev_tensor *t = mk(e, dts[k], 1, &n, x);
      assert_int_equal(tu_read(t, 0, xr, n), n); /* the rounded inputs */
      for (int64_t i = 0; i < n; i++) want[i] = tanh(xr[i]);
      dev_tensor *y = run1(e, "Tanh", t);
      check(y, want, n, tu_rtol_f64_op(dts[k]), 1e-6);
      dev_tensor_release(y);
      for (int64_t i = 0; i < n; i++) want[i] = -xr[i];
      y = run1(e, "Neg", t);
      check(y, want, n, 0, 0);
      dev_tensor_release(y);
      dev_tensor_release(t);
    }
    free(x);
    free(xr);
    free(want);
  }
  dev_engine_destroy(e);
}

static void test_unary_zero_size_and_scalar(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[2] = {0, 3};
  for (int k = 0; k < N_OF(k_number_dtypes); k++) {
    dev_tensor *t = mk(e, k_number_dtypes[k], 2, d, NULL);
    dev_tensor *y = run1(e, "Abs", t);
    tu_assert_shape(dev_tensor_shape(y), 2, 0, 3);
    check(y, NULL, 0, 0, 0);
    dev_tensor_release(y);
    dev_tensor_release(t);
  }
  dev_tensor *s = mk(e, PD_FLOAT64, 0, NULL, (const double[]){4});
  dev_tensor *y = run1(e, "Sqrt", s);
  tu_assert_shape(dev_tensor_shape(y), 0, 0);
  check(y, ((const double[]){2}), 1, 0, 0);
  dev_tensor_release(y);
  dev_tensor_release(s);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Binary: hand-computed cases per dtype class                              */

static void test_binary_floats(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {6};
  const double x[6] = {1, 2, 3, -4, 6, 8};
  const double y[6] = {2, 2, 2, 4, -3, 0.5};
  struct {
    const char *op;
    double want[6];
  } cases[] = {
      {"Add", {3, 4, 5, 0, 3, 8.5}},
      {"Sub", {-1, 0, 1, -8, 9, 7.5}},
      {"Mul", {2, 4, 6, -16, -18, 4}},
      {"Div", {0.5, 1, 1.5, -1, -2, 16}},
      {"Pow", {1, 4, 9, 256, 1.0 / 216, 2.8284271247461903}},
      {"Maximum", {2, 2, 3, 4, 6, 8}},
      {"Minimum", {1, 2, 2, -4, -3, 0.5}},
      {"Equal", {0, 1, 0, 0, 0, 0}},
      {"Greater", {0, 0, 1, 0, 1, 1}},
      {"Less", {1, 0, 0, 1, 0, 0}},
  };
  for (int k = 0; k < N_OF(k_float_dtypes); k++) {
    pd_dtype dt = k_float_dtypes[k];
    dev_tensor *tx = mk(e, dt, 1, d, x), *ty = mk(e, dt, 1, d, y);
    for (int c = 0; c < N_OF(cases); c++) {
      dev_tensor *z = run2(e, cases[c].op, tx, ty);
      bool cmp = c >= 7;
      assert_int_equal(dev_tensor_dtype(z), cmp ? PD_BOOL : dt);
      tu_assert_shape(dev_tensor_shape(z), 1, 6);
      check(z, cases[c].want, 6, tu_rtol_f64_op(dt), 0);
      dev_tensor_release(z);
    }
    dev_tensor_release(tx);
    dev_tensor_release(ty);
  }
  dev_engine_destroy(e);
}

/* IEEE special values: x/0, NaN propagation through Maximum/Minimum, NaN
 * compares unequal to itself. */
static void test_binary_float_specials(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {4};
  const double x[4] = {1, -1, 0, NAN};
  const double y[4] = {0, 0, 0, 1};
  const double x2[4] = {NAN, 1, NAN, 2};
  const double y2[4] = {1, NAN, NAN, 2};
  for (int k = 0; k < N_OF(k_float_dtypes); k++) {
    pd_dtype dt = k_float_dtypes[k];
    dev_tensor *tx = mk(e, dt, 1, d, x), *ty = mk(e, dt, 1, d, y);
    dev_tensor *z = run2(e, "Div", tx, ty);
    check(z, ((const double[]){INFINITY, -INFINITY, NAN, NAN}), 4, 0, 0);
    dev_tensor_release(z);
    dev_tensor_release(tx);
    dev_tensor_release(ty);
    tx = mk(e, dt, 1, d, x2);
    ty = mk(e, dt, 1, d, y2);
    z = run2(e, "Maximum", tx, ty);
    check(z, ((const double[]){NAN, NAN, NAN, 2}), 4, 0, 0);
    dev_tensor_release(z);
    z = run2(e, "Minimum", tx, ty);
    check(z, ((const double[]){NAN, NAN, NAN, 2}), 4, 0, 0);
    dev_tensor_release(z);
    z = run2(e, "Equal", tx, ty);
    check(z, ((const double[]){0, 0, 0, 1}), 4, 0, 0);
    dev_tensor_release(z);
    z = run2(e, "Greater", tx, ty);
    check(z, ((const double[]){0, 0, 0, 0}), 4, 0, 0);
    dev_tensor_release(z);
    dev_tensor_release(tx);
    dev_tensor_release(ty);
  }
  dev_engine_destroy(e);
}

static void test_binary_int32(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {8};
  int32_t x[8] = {-7, 7, -7, 7, INT32_MAX, INT32_MIN, 65536, 0};
  int32_t y[8] = {2, -2, -2, 2, 1, -1, 65536, 5};
  struct {
    const char *op;
    int32_t want[8];
  } cases[] = {
      {"Add", {-5, 5, -9, 9, INT32_MIN, INT32_MAX, 131072, 5}},
      {"Sub", {-9, 9, -5, 5, INT32_MAX - 1, INT32_MIN + 1, 0, -5}},
      /* 65536 * 65536 = 2^32 wraps to 0; MIN * -1 wraps to MIN */
      {"Mul", {-14, -14, 14, 14, INT32_MAX, INT32_MIN, 0, 0}},
      /* truncation toward zero; MIN / -1 wraps to MIN */
      {"Div", {-3, -3, 3, 3, INT32_MAX, INT32_MIN, 1, 0}},
      {"Maximum", {2, 7, -2, 7, INT32_MAX, -1, 65536, 5}},
      {"Minimum", {-7, -2, -7, 2, 1, INT32_MIN, 65536, 0}},
  };
  dev_tensor *tx = raw_mirrored(e, PD_INT32, 1, d, x);
  dev_tensor *ty = raw_mirrored(e, PD_INT32, 1, d, y);
  for (int c = 0; c < N_OF(cases); c++) {
    dev_tensor *z = run2(e, cases[c].op, tx, ty);
    assert_int_equal(dev_tensor_dtype(z), PD_INT32);
    int32_t got[8];
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 8; i++) {
      if (got[i] != cases[c].want[i])
        fail_msg("%s element %d: got %d, want %d", cases[c].op, i, got[i],
                 cases[c].want[i]);
    }
    dev_tensor_release(z);
  }
  const char *cmps[3] = {"Equal", "Greater", "Less"};
  const uint8_t cmp_want[3][8] = {{0, 0, 0, 0, 0, 0, 1, 0},
                                  {0, 1, 0, 1, 1, 0, 0, 0},
                                  {1, 0, 1, 0, 0, 1, 0, 1}};
  for (int c = 0; c < 3; c++) {
    dev_tensor *z = run2(e, cmps[c], tx, ty);
    assert_int_equal(dev_tensor_dtype(z), PD_BOOL);
    uint8_t got[8];
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], cmp_want[c][i]);
    dev_tensor_release(z);
  }
  dev_tensor_release(tx);
  dev_tensor_release(ty);

  /* Pow: wrap-around, (-2)^3, 0^0 = 1, 2^31 wraps to MIN. */
  int32_t px[5] = {2, -2, 0, 3, 7};
  int32_t py[5] = {31, 3, 0, 4, 1};
  int32_t pw[5] = {INT32_MIN, -8, 1, 81, 7};
  const int64_t d5[1] = {5};
  tx = raw_mirrored(e, PD_INT32, 1, d5, px);
  ty = raw_mirrored(e, PD_INT32, 1, d5, py);
  dev_tensor *z = run2(e, "Pow", tx, ty);
  int32_t got[5];
  read_raw(z, 0, got, sizeof got);
  for (int i = 0; i < 5; i++) assert_int_equal(got[i], pw[i]);
  dev_tensor_release(z);
  dev_tensor_release(tx);
  dev_tensor_release(ty);
  dev_engine_destroy(e);
}

static void test_binary_int64(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {5};
  int64_t x[5] = {INT64_MAX, INT64_MIN, -9, 4294967296, 3};
  int64_t y[5] = {1, -1, 4, 4294967296, 40};
  struct {
    const char *op;
    int64_t want[5];
  } cases[] = {
      {"Add", {INT64_MIN, INT64_MAX, -5, 8589934592, 43}},
      {"Sub", {INT64_MAX - 1, INT64_MIN + 1, -13, 0, -37}},
      {"Mul", {INT64_MAX, INT64_MIN, -36, 0, 120}}, /* 2^64 wraps to 0 */
      {"Div", {INT64_MAX, INT64_MIN, -2, 1, 0}},
      {"Maximum", {INT64_MAX, -1, 4, 4294967296, 40}},
      {"Minimum", {1, INT64_MIN, -9, 4294967296, 3}},
  };
  dev_tensor *tx = raw_mirrored(e, PD_INT64, 1, d, x);
  dev_tensor *ty = raw_mirrored(e, PD_INT64, 1, d, y);
  for (int c = 0; c < N_OF(cases); c++) {
    dev_tensor *z = run2(e, cases[c].op, tx, ty);
    assert_int_equal(dev_tensor_dtype(z), PD_INT64);
    int64_t got[5];
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 5; i++) {
      if (got[i] != cases[c].want[i])
        fail_msg("%s element %d: got %lld, want %lld", cases[c].op, i,
                 (long long)got[i], (long long)cases[c].want[i]);
    }
    dev_tensor_release(z);
  }
  dev_tensor *z = run2(e, "Less", tx, ty);
  check(z, ((const double[]){0, 1, 1, 0, 1}), 5, 0, 0);
  dev_tensor_release(z);
  dev_tensor_release(tx);
  dev_tensor_release(ty);
  /* Pow: 3^40 = 12157665459056928801 wraps to that - 2^64; 2^64 wraps to
   * 0; (-1)^(2^62+1) = -1 (the exponent loop must not take 2^62 steps). */
  int64_t px[4] = {3, 2, -1, INT64_MAX};
  int64_t py[4] = {40, 64, INT64_C(4611686018427387905), 1};
  int64_t pw[4] = {-6289078614652622815, 0, -1, INT64_MAX};
  const int64_t d4[1] = {4};
  tx = raw_mirrored(e, PD_INT64, 1, d4, px);
  ty = raw_mirrored(e, PD_INT64, 1, d4, py);
  z = run2(e, "Pow", tx, ty);
  int64_t got[4];
  read_raw(z, 0, got, sizeof got);
  for (int i = 0; i < 4; i++) assert_int_equal(got[i], pw[i]);
  dev_tensor_release(z);
  dev_tensor_release(tx);
  dev_tensor_release(ty);
  dev_engine_destroy(e);
}

static void test_binary_uint8(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {5};
  const double x[5] = {1, 200, 16, 7, 2};
  const double y[5] = {2, 100, 16, 2, 9};
  struct {
    const char *op;
    double want[5];
  } cases[] = {
      {"Add", {3, 44, 32, 9, 11}},    /* 300 % 256 = 44 */
      {"Sub", {255, 100, 0, 5, 249}}, /* 1 - 2 wraps to 255 */
      {"Mul", {2, 32, 0, 14, 18}},    /* 20000 % 256 = 32 */
      {"Div", {0, 2, 1, 3, 0}},
      {"Pow", {1, 0, 0, 49, 0}}, /* 200^100, 16^16, 2^9 wrap to 0 */
      {"Maximum", {2, 200, 16, 7, 9}},
      {"Minimum", {1, 100, 16, 2, 2}},
      {"Equal", {0, 0, 1, 0, 0}},
      {"Greater", {0, 1, 0, 1, 0}},
      {"Less", {1, 0, 0, 0, 1}},
  };
  dev_tensor *tx = mk(e, PD_UINT8, 1, d, x), *ty = mk(e, PD_UINT8, 1, d, y);
  for (int c = 0; c < N_OF(cases); c++) {
    dev_tensor *z = run2(e, cases[c].op, tx, ty);
    assert_int_equal(dev_tensor_dtype(z), c >= 7 ? PD_BOOL : PD_UINT8);
    check(z, cases[c].want, 5, 0, 0);
    dev_tensor_release(z);
  }
  dev_tensor_release(tx);
  dev_tensor_release(ty);
  dev_engine_destroy(e);
}

static void test_equal_bool(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {4};
  dev_tensor *a = mk(e, PD_BOOL, 1, d, (const double[]){1, 0, 1, 0});
  dev_tensor *b = mk(e, PD_BOOL, 1, d, (const double[]){1, 1, 0, 0});
  dev_tensor *z = run2(e, "Equal", a, b);
  assert_int_equal(dev_tensor_dtype(z), PD_BOOL);
  check(z, ((const double[]){1, 0, 0, 1}), 4, 0, 0);
  dev_tensor_release(z);
  dev_tensor *s = mk(e, PD_BOOL, 0, NULL, (const double[]){0});
  z = run2(e, "Equal", a, s);
  check(z, ((const double[]){0, 1, 0, 1}), 4, 0, 0);
  dev_tensor_release(z);
  dev_tensor_release(s);
  dev_tensor_release(a);
  dev_tensor_release(b);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Broadcasting                                                             */

static void test_broadcast_hand(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  for (int k = 0; k < N_OF(k_number_dtypes); k++) {
    pd_dtype dt = k_number_dtypes[k];
    /* [2,3] + [3] (bias) and [3] + [2,3] */
    {
      const int64_t dx[2] = {2, 3}, dy[1] = {3};
      dev_tensor *x = mk(e, dt, 2, dx, (const double[]){1, 2, 3, 4, 5, 6});
      dev_tensor *y = mk(e, dt, 1, dy, (const double[]){10, 20, 30});
      const double want[6] = {11, 22, 33, 14, 25, 36};
      dev_tensor *z = run2(e, "Add", x, y);
      tu_assert_shape(dev_tensor_shape(z), 2, 2, 3);
      check(z, want, 6, 0, 0);
      dev_tensor_release(z);
      z = run2(e, "Add", y, x);
      tu_assert_shape(dev_tensor_shape(z), 2, 2, 3);
      check(z, want, 6, 0, 0);
      dev_tensor_release(z);
      dev_tensor_release(x);
      dev_tensor_release(y);
    }
    /* [2,1,4] * [3,1] -> [2,3,4] */
    {
      const int64_t dx[3] = {2, 1, 4}, dy[2] = {3, 1};
      dev_tensor *x =
          mk(e, dt, 3, dx, (const double[]){1, 2, 3, 4, 5, 6, 7, 8});
      dev_tensor *y = mk(e, dt, 2, dy, (const double[]){1, 2, 3});
      const double want[24] = {1, 2, 3, 4, 2,  4,  6,  8,  3,  6,  9,  12,
                               5, 6, 7, 8, 10, 12, 14, 16, 15, 18, 21, 24};
      dev_tensor *z = run2(e, "Mul", x, y);
      tu_assert_shape(dev_tensor_shape(z), 3, 2, 3, 4);
      check(z, want, 24, 0, 0);
      dev_tensor_release(z);
      dev_tensor_release(x);
      dev_tensor_release(y);
    }
    /* [3,1] - [1,4] (outer) */
    {
      const int64_t dx[2] = {3, 1}, dy[2] = {1, 4};
      dev_tensor *x = mk(e, dt, 2, dx, (const double[]){10, 20, 30});
      dev_tensor *y = mk(e, dt, 2, dy, (const double[]){1, 2, 3, 4});
      const double want[12] = {9, 8, 7, 6, 19, 18, 17, 16, 29, 28, 27, 26};
      dev_tensor *z = run2(e, "Sub", x, y);
      tu_assert_shape(dev_tensor_shape(z), 2, 3, 4);
      check(z, want, 12, 0, 0);
      dev_tensor_release(z);
      dev_tensor_release(x);
      dev_tensor_release(y);
    }
    /* scalar with rank 3, both ways */
    {
      const int64_t dx[3] = {2, 2, 2};
      dev_tensor *x =
          mk(e, dt, 3, dx, (const double[]){0, 1, 2, 3, 4, 5, 6, 7});
      dev_tensor *s = mk(e, dt, 0, NULL, (const double[]){10});
      dev_tensor *z = run2(e, "Sub", s, x);
      tu_assert_shape(dev_tensor_shape(z), 3, 2, 2, 2);
      check(z, ((const double[]){10, 9, 8, 7, 6, 5, 4, 3}), 8, 0, 0);
      dev_tensor_release(z);
      z = run2(e, "Maximum", x, s);
      check(z, ((const double[]){10, 10, 10, 10, 10, 10, 10, 10}), 8, 0, 0);
      dev_tensor_release(z);
      z = run2(e, "Greater", x, s);
      assert_int_equal(dev_tensor_dtype(z), PD_BOOL);
      tu_assert_shape(dev_tensor_shape(z), 3, 2, 2, 2);
      check(z, ((const double[]){0, 0, 0, 0, 0, 0, 0, 0}), 8, 0, 0);
      dev_tensor_release(z);
      dev_tensor_release(s);
      dev_tensor_release(x);
    }
    /* rank 0 with rank 0; [1,1] with rank 0 */
    {
      dev_tensor *a = mk(e, dt, 0, NULL, (const double[]){3});
      dev_tensor *b = mk(e, dt, 0, NULL, (const double[]){4});
      dev_tensor *z = run2(e, "Mul", a, b);
      tu_assert_shape(dev_tensor_shape(z), 0, 0);
      check(z, ((const double[]){12}), 1, 0, 0);
      dev_tensor_release(z);
      const int64_t d11[2] = {1, 1};
      dev_tensor *c = mk(e, dt, 2, d11, (const double[]){5});
      z = run2(e, "Add", a, c);
      tu_assert_shape(dev_tensor_shape(z), 2, 1, 1);
      check(z, ((const double[]){8}), 1, 0, 0);
      dev_tensor_release(z);
      dev_tensor_release(c);
      dev_tensor_release(a);
      dev_tensor_release(b);
    }
    /* zero-size dims: [0,3] + [1,3], [2,0] * [], [0] vs [1] */
    {
      const int64_t d03[2] = {0, 3}, d13[2] = {1, 3}, d20[2] = {2, 0};
      dev_tensor *a = mk(e, dt, 2, d03, NULL);
      dev_tensor *b = mk(e, dt, 2, d13, (const double[]){1, 2, 3});
      dev_tensor *z = run2(e, "Add", a, b);
      tu_assert_shape(dev_tensor_shape(z), 2, 0, 3);
      check(z, NULL, 0, 0, 0);
      dev_tensor_release(z);
      z = run2(e, "Less", b, a);
      assert_int_equal(dev_tensor_dtype(z), PD_BOOL);
      tu_assert_shape(dev_tensor_shape(z), 2, 0, 3);
      check(z, NULL, 0, 0, 0);
      dev_tensor_release(z);
      dev_tensor *c = mk(e, dt, 2, d20, NULL);
      dev_tensor *s = mk(e, dt, 0, NULL, (const double[]){2});
      z = run2(e, "Mul", c, s);
      tu_assert_shape(dev_tensor_shape(z), 2, 2, 0);
      check(z, NULL, 0, 0, 0);
      dev_tensor_release(z);
      dev_tensor_release(c);
      dev_tensor_release(s);
      dev_tensor_release(a);
      dev_tensor_release(b);
    }
  }
  dev_engine_destroy(e);
}

/* float64 reference of one binary op. */
static double ref_op(const char *op, double x, double y) {
  if (!strcmp(op, "Add")) return x + y;
  if (!strcmp(op, "Sub")) return x - y;
  if (!strcmp(op, "Mul")) return x * y;
  if (!strcmp(op, "Div")) return x / y;
  if (!strcmp(op, "Pow")) return pow(x, y);
  if (!strcmp(op, "Maximum")) return x > y ? x : y;
  if (!strcmp(op, "Minimum")) return x < y ? x : y;
  if (!strcmp(op, "Equal")) return x == y;
  if (!strcmp(op, "Greater")) return x > y;
  if (!strcmp(op, "Less")) return x < y;
  fail_msg("no reference for %s", op);
  return 0;
}

/* NumPy broadcasting done naively: unravel each output index and map it to
 * each operand (index 0 on axes where the operand has dim 1 or no axis). */
static void ref_broadcast(const char *op, const dev_shape *o,
                          const dev_shape *a, const double *va,
                          const dev_shape *b, const double *vb, double *out,
                          int64_t n) {
  for (int64_t f = 0; f < n; f++) {
    int64_t idx[PD_MAX_RANK], rem = f;
    for (int i = o->rank - 1; i >= 0; i--) {
      idx[i] = rem % o->dims[i];
      rem /= o->dims[i];
    }
    int64_t ia = 0, ib = 0;
    for (int i = 0; i < o->rank; i++) {
      int ja = i - (o->rank - a->rank), jb = i - (o->rank - b->rank);
      if (ja >= 0) ia = ia * a->dims[ja] + (a->dims[ja] == 1 ? 0 : idx[i]);
      if (jb >= 0) ib = ib * b->dims[jb] + (b->dims[jb] == 1 ? 0 : idx[i]);
    }
    out[f] = ref_op(op, va[ia], vb[ib]);
  }
}

/* Random pairs of broadcasting shapes (rank up to 5, dims 1..4, sometimes 0),
 * every binary op, every floating dtype, against the float64 reference. */
static void test_broadcast_random_reference(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const char *ops[] = {"Add",     "Sub",     "Mul",   "Div",     "Pow",
                       "Maximum", "Minimum", "Equal", "Greater", "Less"};
  double r[16];
  for (int trial = 0; trial < 40; trial++) {
    tu_fill_random(r, 16, 0, 1, (uint64_t)(1000 + trial));
    dev_shape o, sa, sb;
    o.rank = 1 + (int)(r[0] * 5);
    for (int i = 0; i < o.rank; i++) {
      o.dims[i] = 1 + (int64_t)(r[1 + i] * 4);
      if (trial % 13 == 5 && i == 0) o.dims[i] = 0;
    }
    sa.rank = o.rank - (int)(r[7] * 2 > 1.5 ? 1 : 0);
    sb.rank = o.rank - (int)(r[8] * o.rank);
    for (int i = 0; i < sa.rank; i++) {
      int oi = i + o.rank - sa.rank;
      sa.dims[i] = r[9 + oi] < 0.3 ? 1 : o.dims[oi];
    }
    for (int i = 0; i < sb.rank; i++) {
      int oi = i + o.rank - sb.rank;
      sb.dims[i] = r[10 + oi % 5] > 0.6 ? 1 : o.dims[oi];
    }
    /* the output shape: NumPy's rule, right-aligned, the non-1 dim wins */
    dev_shape want;
    want.rank = sa.rank > sb.rank ? sa.rank : sb.rank;
    for (int i = 0; i < want.rank; i++) {
      int ja = i - (want.rank - sa.rank), jb = i - (want.rank - sb.rank);
      int64_t da = ja >= 0 ? sa.dims[ja] : 1, db = jb >= 0 ? sb.dims[jb] : 1;
      want.dims[i] = da == 1 ? db : da;
    }
    int64_t na = tu_numel(&sa), nb = tu_numel(&sb), no = tu_numel(&want);
    double *va = malloc(sizeof(double) * (size_t)(na + 1));
    double *vb = malloc(sizeof(double) * (size_t)(nb + 1));
    double *ra = malloc(sizeof(double) * (size_t)(na + 1));
    double *rb = malloc(sizeof(double) * (size_t)(nb + 1));
    double *ref = malloc(sizeof(double) * (size_t)(no + 1));
    assert_true(va && vb && ra && rb && ref);
    for (int k = 0; k < N_OF(k_float_dtypes); k++) {
      pd_dtype dt = k_float_dtypes[k];
      for (int o_ = 0; o_ < N_OF(ops); o_++) {
        const char *op = ops[o_];
        bool positive = !strcmp(op, "Div") || !strcmp(op, "Pow");
        bool cmp = o_ >= 7;
        tu_fill_random(va, na, positive ? 0.5 : -3, 3,
                       (uint64_t)(trial * 31 + o_));
        tu_fill_random(vb, nb, positive ? 0.5 : -3, 3,
                       (uint64_t)(trial * 37 + o_ + 7));
        if (cmp) { /* small integers, so that Equal is often true */
          for (int64_t i = 0; i < na; i++) va[i] = round(va[i]);
          for (int64_t i = 0; i < nb; i++) vb[i] = round(vb[i]);
        }
        dev_tensor *ta = mk(e, dt, sa.rank, sa.dims, va);
        dev_tensor *tb = mk(e, dt, sb.rank, sb.dims, vb);
        /* the reference works on the inputs as rounded to dt */
        assert_int_equal(tu_read(ta, 0, ra, na + 1), na);
        assert_int_equal(tu_read(tb, 0, rb, nb + 1), nb);
        ref_broadcast(op, &want, &sa, ra, &sb, rb, ref, no);
        dev_tensor *z = run2(e, op, ta, tb);
        const dev_shape *zs = dev_tensor_shape(z);
        assert_true(dev_shape_equal(zs, &want));
        assert_int_equal(dev_tensor_dtype(z), cmp ? PD_BOOL : dt);
        check(z, ref, no, cmp ? 0 : tu_rtol_f64_op(dt),
              cmp ? 0 : tu_atol_f64_op(dt));
        dev_tensor_release(z);
        dev_tensor_release(ta);
        dev_tensor_release(tb);
      }
    }
    free(va);
    free(vb);
    free(ra);
    free(rb);
    free(ref);
  }
  dev_engine_destroy(e);
}

/* Integer dtypes on random broadcasting shapes; reference in float64 with
 * trunc() for Div (exact for these magnitudes). */
static void test_broadcast_random_int(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const char *ops[] = {"Add",     "Sub",     "Mul",    "Div",
                       "Maximum", "Minimum", "Greater"};
  const pd_dtype dts[2] = {PD_INT32, PD_INT64};
  const int64_t dx[3] = {3, 1, 5}, dy[2] = {4, 1};
  dev_shape sx, sy, so;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_shape_make(3, dx, &sx, &st), PD_OK);
  assert_int_equal(dev_shape_make(2, dy, &sy, &st), PD_OK);
  assert_int_equal(dev_shape_broadcast(&sx, &sy, &so, &st), PD_OK);
  double vx[15], vy[4], ref[60];
  tu_fill_random(vx, 15, -1000, 1000, 5);
  tu_fill_random(vy, 4, 1, 50, 6);
  for (int i = 0; i < 15; i++) vx[i] = trunc(vx[i]);
  for (int i = 0; i < 4; i++) vy[i] = trunc(vy[i]) * (i % 2 ? -1 : 1);
  for (int k = 0; k < 2; k++) {
    dev_tensor *tx = mk(e, dts[k], 3, dx, vx), *ty = mk(e, dts[k], 2, dy, vy);
    for (int o = 0; o < N_OF(ops); o++) {
      ref_broadcast(ops[o], &so, &sx, vx, &sy, vy, ref, 60);
      if (!strcmp(ops[o], "Div"))
        for (int i = 0; i < 60; i++) ref[i] = trunc(ref[i]);
      dev_tensor *z = run2(e, ops[o], tx, ty);
      tu_assert_shape(dev_tensor_shape(z), 3, 3, 4, 5);
      check(z, ref, 60, 0, 0);
      dev_tensor_release(z);
    }
    dev_tensor_release(tx);
    dev_tensor_release(ty);
  }
  dev_engine_destroy(e);
}

/* A mesh of 3 devices: x sharded [7,4] along axis 0 (components of 3, 2
 * and 2 rows), y mirrored [4] or sharded [7,1]; each component broadcasts
 * on its own shape. */
static void test_sharded_mesh(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const int64_t dx[2] = {7, 4}, dy[1] = {4}, dc[2] = {7, 1};
  double vx[28], vy[4], vc[7];
  for (int i = 0; i < 28; i++) vx[i] = i;
  for (int i = 0; i < 4; i++) vy[i] = 100 * (i + 1);
  for (int i = 0; i < 7; i++) vc[i] = i + 1;
  const int rows[3] = {3, 2, 2}, first[3] = {0, 3, 5};
  for (int k = 0; k < N_OF(k_number_dtypes); k++) {
    pd_dtype dt = k_number_dtypes[k];
    if (dt == PD_UINT8) continue; /* values above 255 */
    dev_tensor *x = tu_sharded(e, dt, 2, dx, 0, vx);
    dev_tensor *y = mk(e, dt, 1, dy, vy);
    dev_tensor *c = tu_sharded(e, dt, 2, dc, 0, vc);
    dev_tensor *z = run2(e, "Add", x, y);
    dev_tensor *w = run2(e, "Mul", x, c);
    dev_tensor *n = run1(e, "Neg", x);
    tu_assert_shape(dev_tensor_shape(z), 2, -1, 4);
    for (int d = 0; d < 3; d++) {
      tu_assert_shape(dev_tensor_component_shape(z, d), 2, rows[d], 4);
      double want[12], wmul[12], wneg[12];
      for (int i = 0; i < rows[d]; i++)
        for (int j = 0; j < 4; j++) {
          int gi = first[d] + i;
          want[i * 4 + j] = vx[gi * 4 + j] + vy[j];
          wmul[i * 4 + j] = vx[gi * 4 + j] * vc[gi];
          wneg[i * 4 + j] = -vx[gi * 4 + j];
        }
      tu_assert_tensor_close_impl(z, d, want, rows[d] * 4, tu_rtol_f64_op(dt),
                                  0, __FILE__, __LINE__);
      tu_assert_tensor_close_impl(w, d, wmul, rows[d] * 4, tu_rtol_f64_op(dt),
                                  0, __FILE__, __LINE__);
      tu_assert_tensor_close_impl(n, d, wneg, rows[d] * 4, 0, 0, __FILE__,
                                  __LINE__);
    }
    dev_tensor_release(z);
    dev_tensor_release(w);
    dev_tensor_release(n);
    dev_tensor_release(x);
    dev_tensor_release(y);
    dev_tensor_release(c);
  }
  /* mirrored rank-0 values and Fill give the same value on every device */
  dev_tensor *a = mk(e, PD_FLOAT32, 0, NULL, (const double[]){1.5});
  dev_tensor *z = run2(e, "Mul", a, a);
  for (int d = 0; d < 3; d++)
    tu_assert_tensor_close_impl(z, d, (const double[]){2.25}, 1, 0, 0, __FILE__,
                                __LINE__);
  dev_tensor_release(z);
  dev_tensor_release(a);
  const int64_t fd[2] = {2, 2};
  dev_attr fa[2] = {dev_attr_shape("shape", 2, fd),
                    dev_attr_float("value", -2)};
  z = tu_exec(e, "Fill", NULL, 0, fa, 2, 0);
  for (int d = 0; d < 3; d++)
    tu_assert_tensor_close_impl(z, d, (const double[]){-2, -2, -2, -2}, 4, 0, 0,
                                __FILE__, __LINE__);
  dev_tensor_release(z);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* float16 / bfloat16 rounding                                              */

static void test_half_rounding_bits(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d1[1] = {1};
  /* 1/3 computed in float32 and rounded: float16 0x3555, bfloat16 0x3EAB
   * (float32 1/3 is 0x3EAAAAAB; its low half 0xAAAB rounds up). */
  {
    uint16_t one[1] = {0x3C00}, three[1] = {0x4200};
    dev_tensor *a = raw_mirrored(e, PD_FLOAT16, 1, d1, one);
    dev_tensor *b = raw_mirrored(e, PD_FLOAT16, 1, d1, three);
    dev_tensor *z = run2(e, "Div", a, b);
    uint16_t got;
    read_raw(z, 0, &got, 2);
    assert_int_equal(got, 0x3555);
    dev_tensor_release(z);
    dev_tensor_release(a);
    dev_tensor_release(b);
    uint16_t bone[1] = {0x3F80}, bthree[1] = {0x4040};
    a = raw_mirrored(e, PD_BFLOAT16, 1, d1, bone);
    b = raw_mirrored(e, PD_BFLOAT16, 1, d1, bthree);
    z = run2(e, "Div", a, b);
    read_raw(z, 0, &got, 2);
    assert_int_equal(got, 0x3EAB);
    dev_tensor_release(z);
    dev_tensor_release(a);
    dev_tensor_release(b);
  }
  /* Add rounds half-way cases to even: 1 + 2^-11 -> 1 (0x3C00),
   * (1 + 2^-10) + 2^-11 -> 1 + 2^-9 (0x3C02). */
  {
    const int64_t d2[1] = {2};
    uint16_t x[2] = {0x3C00, 0x3C01}, y[2] = {0x1000, 0x1000};
    dev_tensor *a = raw_mirrored(e, PD_FLOAT16, 1, d2, x);
    dev_tensor *b = raw_mirrored(e, PD_FLOAT16, 1, d2, y);
    dev_tensor *z = run2(e, "Add", a, b);
    uint16_t got[2];
    read_raw(z, 0, got, 4);
    assert_int_equal(got[0], 0x3C00);
    assert_int_equal(got[1], 0x3C02);
    dev_tensor_release(z);
    dev_tensor_release(a);
    dev_tensor_release(b);
  }
  /* Cast float32 -> bfloat16: 1.00390625 = 1 + 2^-8 is half-way between
   * 0x3F80 and 0x3F81 and rounds to even 0x3F80; 1 + 3*2^-8 -> 0x3F82;
   * 1 + 2^-8 + 2^-20 is above half-way -> 0x3F81; 0x1.ffp+127 is half-way
   * between the largest bfloat16 (0x7F7F) and 2^128 and rounds to inf. */
  {
    const int64_t d[1] = {6};
    float x[6] = {1.00390625f,  1.01171875f,  1.0f + 0x1p-8f + 0x1p-20f,
                  -1.00390625f, 0x1.ffp+127f, -INFINITY};
    uint16_t want[6] = {0x3F80, 0x3F82, 0x3F81, 0xBF80, 0x7F80, 0xFF80};
    dev_tensor *t = raw_mirrored(e, PD_FLOAT32, 1, d, x);
    dev_tensor *z = cast(e, t, PD_BFLOAT16);
    uint16_t got[6];
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 6; i++)
      if (got[i] != want[i])
        fail_msg("bf16 %d: got 0x%04x want 0x%04x", i, got[i], want[i]);
    dev_tensor_release(z);
    dev_tensor_release(t);
  }
  /* Cast float32 -> float16 at the edges of the range. */
  {
    const int64_t d[1] = {11};
    float x[11] = {65504.0f, 65519.0f,     65520.0f, 0x1p-24f,
                   0x1p-25f, 0x1.8p-25f,   0x1p-14f, -0.0f,
                   1e-8f,    0x1.ffcp-15f, -1e6f};
    uint16_t want[11] = {0x7BFF, 0x7BFF, 0x7C00, 0x0001, 0x0000, 0x0001,
                         0x0400, 0x8000, 0x0000, 0x0400, 0xFC00};
    dev_tensor *t = raw_mirrored(e, PD_FLOAT32, 1, d, x);
    dev_tensor *z = cast(e, t, PD_FLOAT16);
    uint16_t got[11];
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 11; i++)
      if (got[i] != want[i])
        fail_msg("f16 %d: got 0x%04x want 0x%04x", i, got[i], want[i]);
    dev_tensor_release(z);
    dev_tensor_release(t);
  }
  /* NaN stays NaN both ways. */
  {
    float x[1] = {NAN};
    dev_tensor *t = raw_mirrored(e, PD_FLOAT32, 1, d1, x);
    dev_tensor *h = cast(e, t, PD_FLOAT16), *b = cast(e, t, PD_BFLOAT16);
    uint16_t gh, gb;
    read_raw(h, 0, &gh, 2);
    read_raw(b, 0, &gb, 2);
    assert_true((gh & 0x7C00) == 0x7C00 && (gh & 0x3FF) != 0);
    assert_true((gb & 0x7F80) == 0x7F80 && (gb & 0x7F) != 0);
    dev_tensor_release(h);
    dev_tensor_release(b);
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

/* Every finite float16 value, the midpoint between each pair of neighbours
 * and the floats just beside it, cast from float32: each must land on the
 * nearest float16, ties on the even one. Also every float16 pattern cast up
 * to float32 must equal this file's decoding. Same for bfloat16. */
static void test_half_exhaustive(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t n16 = 65536;
  uint16_t *pat = malloc(sizeof(uint16_t) * (size_t)n16);
  float *f = malloc(sizeof(float) * (size_t)n16);
  assert_true(pat && f);
  for (int64_t i = 0; i < n16; i++) pat[i] = (uint16_t)i;
  for (int kind = 0; kind < 2; kind++) {
    pd_dtype dt = kind ? PD_BFLOAT16 : PD_FLOAT16;
    double (*val)(uint16_t) = kind ? bf16_value : half_value;
    /* up-cast of every pattern */
    dev_tensor *t = raw_mirrored(e, dt, 1, &n16, pat);
    dev_tensor *z = cast(e, t, PD_FLOAT32);
    read_raw(z, 0, f, sizeof(float) * (size_t)n16);
    for (int64_t i = 0; i < n16; i++) {
      double w = val((uint16_t)i);
      if (isnan(w) ? !isnan(f[i]) : (double)f[i] != w)
        fail_msg("%s 0x%04x -> float32 %.9g, want %.9g", pd_dtype_name(dt),
                 (unsigned)i, f[i], w);
    }
    dev_tensor_release(z);
    dev_tensor_release(t);
    /* down-cast: for positive finite h (and its negative), the value, the
     * midpoint to h+1 and the floats just below and above the midpoint. */
    int64_t top = kind ? 0x7F80 : 0x7C00; /* first non-finite pattern */
    int64_t m = 0;
    float *xs = malloc(sizeof(float) * (size_t)top * 8);
    uint16_t *want = malloc(sizeof(uint16_t) * (size_t)top * 8);
    assert_true(xs && want);
    for (int64_t h = 0; h < top; h++) {
      /* past the largest finite value, the next step of an unbounded
       * exponent range (its midpoint must round to infinity) */
      double v = val((uint16_t)h);
      double v1 = h + 1 < top ? val((uint16_t)(h + 1))
                  : kind      ? 0x1p128
                              : 65536.0;
      double mid = (v + v1) / 2; /* exact in float32 */
      uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
      float fm = (float)mid;
      assert_true((double)fm == mid);
      float cand[4] = {(float)v, fm, nextafterf(fm, 0.0f),
                       nextafterf(fm, INFINITY)};
      uint16_t res[4] = {(uint16_t)h, even, (uint16_t)h, (uint16_t)(h + 1)};
      for (int c = 0; c < 4; c++) {
        for (int s = 0; s < 2; s++) {
          xs[m] = s ? -cand[c] : cand[c];
          want[m] = (uint16_t)(res[c] | (s ? 0x8000 : 0));
          m++;
        }
      }
    }
    dev_tensor *tf = raw_mirrored(e, PD_FLOAT32, 1, &m, xs);
    dev_tensor *th = cast(e, tf, dt);
    uint16_t *got = malloc(sizeof(uint16_t) * (size_t)m);
    assert_non_null(got);
    read_raw(th, 0, got, sizeof(uint16_t) * (size_t)m);
    for (int64_t i = 0; i < m; i++)
      if (got[i] != want[i])
        fail_msg("float32 %.9g -> %s 0x%04x, want 0x%04x", xs[i],
                 pd_dtype_name(dt), got[i], want[i]);
    free(got);
    dev_tensor_release(th);
    dev_tensor_release(tf);
    free(xs);
    free(want);
  }
  free(pat);
  free(f);
  dev_engine_destroy(e);
}

/* Conversions from float64 and int64 round once, not through float32:
 * 1 + 2^-11 + 2^-40 is just above a float16 half-way point (NumPy gives
 * 0x3C01; rounding through float32 would give 0x3C00). */
static void test_cast_single_rounding(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {3};
  double x[3] = {1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-8 + 0x1p-40, 1 + 0x1p-11};
  dev_tensor *t = raw_mirrored(e, PD_FLOAT64, 1, d, x);
  dev_tensor *h = cast(e, t, PD_FLOAT16), *b = cast(e, t, PD_BFLOAT16);
  uint16_t gh[3], gb[3];
  read_raw(h, 0, gh, sizeof gh);
  read_raw(b, 0, gb, sizeof gb);
  assert_int_equal(gh[0], 0x3C01);
  assert_int_equal(gh[2], 0x3C00); /* exact tie: even */
  assert_int_equal(gb[1], 0x3F81);
  assert_int_equal(gb[0], 0x3F80);
  dev_tensor_release(h);
  dev_tensor_release(b);
  dev_tensor_release(t);
  /* int64 2^24 + 2^16 + 1 -> bfloat16 2^24 + 2^17 (0x4B81), above the tie;
   * int32 2049 -> float16 2048 (tie, even), 2051 -> 2052, 70000 -> inf. */
  int64_t xi[1] = {16777216 + 65536 + 1};
  const int64_t d1[1] = {1};
  t = raw_mirrored(e, PD_INT64, 1, d1, xi);
  b = cast(e, t, PD_BFLOAT16);
  read_raw(b, 0, gb, 2);
  assert_int_equal(gb[0], 0x4B81);
  dev_tensor_release(b);
  dev_tensor_release(t);
  int32_t xs[3] = {2049, 2051, 70000};
  t = raw_mirrored(e, PD_INT32, 1, d, xs);
  h = cast(e, t, PD_FLOAT16);
  read_raw(h, 0, gh, sizeof gh);
  assert_int_equal(gh[0], 0x6800);
  assert_int_equal(gh[1], 0x6802);
  assert_int_equal(gh[2], 0x7C00);
  dev_tensor_release(h);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Cast                                                                     */

static void test_cast_corners(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[1] = {10};
  float x[10] = {NAN,   1e20f,  -1e20f,   2.7f,      -2.7f,
                 -1.5f, 300.5f, INFINITY, -INFINITY, 255.9f};
  dev_tensor *t = raw_mirrored(e, PD_FLOAT32, 1, d, x);
  {
    dev_tensor *z = cast(e, t, PD_INT32);
    int32_t got[10], want[10] = {0,  INT32_MAX, INT32_MIN, 2,         -2,
                                 -1, 300,       INT32_MAX, INT32_MIN, 255};
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 10; i++) assert_int_equal(got[i], want[i]);
    dev_tensor_release(z);
  }
  {
    dev_tensor *z = cast(e, t, PD_INT64);
    int64_t got[10], want[10] = {0,  INT64_MAX, INT64_MIN, 2,         -2,
                                 -1, 300,       INT64_MAX, INT64_MIN, 255};
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 10; i++) assert_int_equal(got[i], want[i]);
    dev_tensor_release(z);
  }
  {
    dev_tensor *z = cast(e, t, PD_UINT8);
    uint8_t got[10], want[10] = {0, 255, 0, 2, 0, 0, 255, 255, 0, 255};
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 10; i++) assert_int_equal(got[i], want[i]);
    dev_tensor_release(z);
  }
  {
    dev_tensor *z = cast(e, t, PD_BOOL);
    uint8_t got[10];
    read_raw(z, 0, got, sizeof got);
    for (int i = 0; i < 10; i++) assert_int_equal(got[i], 1); /* all != 0 */
    dev_tensor_release(z);
  }
  dev_tensor_release(t);
  /* float64 extremes: 1e19 saturates int64; 1e300 -> float32 inf;
   * -0.0 and 0 -> bool false; 9.2e18 < 2^63 stays exact. */
  {
    const int64_t d4[1] = {4};
    double xd[4] = {1e19, 1e300, -0.0, 4611686018427387904.0};
    dev_tensor *td = raw_mirrored(e, PD_FLOAT64, 1, d4, xd);
    dev_tensor *z = cast(e, td, PD_INT64);
    int64_t gi[4];
    read_raw(z, 0, gi, sizeof gi);
    assert_int_equal(gi[0], INT64_MAX);
    assert_int_equal(gi[1], INT64_MAX);
    assert_int_equal(gi[2], 0);
    assert_int_equal(gi[3], INT64_C(4611686018427387904));
    dev_tensor_release(z);
    z = cast(e, td, PD_FLOAT32);
    check(z, ((const double[]){1e19f, INFINITY, 0, 4611686018427387904.0}), 4,
          0, 0);
    dev_tensor_release(z);
    z = cast(e, td, PD_BOOL);
    check(z, ((const double[]){1, 1, 0, 1}), 4, 0, 0);
    dev_tensor_release(z);
    dev_tensor_release(td);
  }
  /* integer -> integer wraps as a C cast; bool -> number is 0/1 */
  {
    const int64_t d3[1] = {3};
    int64_t xi[3] = {4294967301LL, -1, 300};
    dev_tensor *ti = raw_mirrored(e, PD_INT64, 1, d3, xi);
    dev_tensor *z = cast(e, ti, PD_INT32);
    check(z, ((const double[]){5, -1, 300}), 3, 0, 0);
    dev_tensor_release(z);
    z = cast(e, ti, PD_UINT8);
    check(z, ((const double[]){5, 255, 44}), 3, 0, 0);
    dev_tensor_release(z);
    dev_tensor_release(ti);
    uint8_t bx[3] = {0, 1, 7}; /* any non-zero byte reads as true */
    dev_tensor *tb = raw_mirrored(e, PD_BOOL, 1, d3, bx);
    z = cast(e, tb, PD_FLOAT32);
    check(z, ((const double[]){0, 1, 1}), 3, 0, 0);
    dev_tensor_release(z);
    z = cast(e, tb, PD_INT64);
    check(z, ((const double[]){0, 1, 1}), 3, 0, 0);
    dev_tensor_release(z);
    z = cast(e, tb, PD_BOOL);
    uint8_t gb[3];
    read_raw(z, 0, gb, 3);
    assert_int_equal(gb[0], 0);
    assert_int_equal(gb[1], 1);
    assert_int_equal(gb[2], 1);
    dev_tensor_release(z);
    dev_tensor_release(tb);
  }
  /* Truncate is accepted and changes nothing. */
  {
    const int64_t d2[1] = {2};
    dev_tensor *tx = mk(e, PD_FLOAT32, 1, d2, (const double[]){2.5, -7});
    dev_tensor *in[1] = {tx};
    dev_attr a[2] = {dev_attr_dtype("DstT", PD_INT32),
                     dev_attr_bool("Truncate", true)};
    dev_tensor *z = tu_exec(e, "Cast", in, 1, a, 2, 0);
    assert_int_equal(dev_tensor_dtype(z), PD_INT32);
    check(z, ((const double[]){2, -7}), 2, 0, 0);
    dev_tensor_release(z);
    dev_tensor_release(tx);
  }
  dev_engine_destroy(e);
}

/* Every pair of dtypes on values every dtype holds exactly. */
static void test_cast_all_pairs(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[2] = {2, 2};
  const double x[4] = {0, 1, 2, 5};
  for (int s = 0; s < N_OF(k_all_dtypes); s++) {
    dev_tensor *t = mk(e, k_all_dtypes[s], 2, d, x);
    bool from_bool = k_all_dtypes[s] == PD_BOOL;
    for (int k = 0; k < N_OF(k_all_dtypes); k++) {
      pd_dtype dst = k_all_dtypes[k];
      dev_tensor *z = cast(e, t, dst);
      assert_int_equal(dev_tensor_dtype(z), dst);
      tu_assert_shape(dev_tensor_shape(z), 2, 2, 2);
      if (from_bool || dst == PD_BOOL)
        check(z, ((const double[]){0, 1, 1, 1}), 4, 0, 0);
      else
        check(z, x, 4, 0, 0);
      dev_tensor_release(z);
    }
    dev_tensor_release(t);
  }
  /* zero elements */
  const int64_t d0[1] = {0};
  dev_tensor *t = mk(e, PD_FLOAT32, 1, d0, NULL);
  dev_tensor *z = cast(e, t, PD_FLOAT16);
  tu_assert_shape(dev_tensor_shape(z), 1, 0);
  dev_tensor_release(z);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Fill, ZerosLike, OnesLike                                                */

static dev_tensor *fill(dev_engine *e, int rank, const int64_t *dims,
                        double value, pd_dtype dt) {
  dev_attr a[3] = {dev_attr_shape("shape", rank, dims),
                   dev_attr_float("value", value), dev_attr_dtype("dtype", dt)};
  return tu_exec(e, "Fill", NULL, 0, a, 3, 0);
}

static void test_fill(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[2] = {2, 3};
  /* default dtype float32 */
  dev_attr a[2] = {dev_attr_shape("shape", 2, d), dev_attr_float("value", 1.5)};
  dev_tensor *z = tu_exec(e, "Fill", NULL, 0, a, 2, 0);
  assert_int_equal(dev_tensor_dtype(z), PD_FLOAT32);
  tu_assert_shape(dev_tensor_shape(z), 2, 2, 3);
  check(z, ((const double[]){1.5, 1.5, 1.5, 1.5, 1.5, 1.5}), 6, 0, 0);
  dev_tensor_release(z);
  struct {
    pd_dtype dt;
    double v, want;
  } cases[] = {
      {PD_FLOAT64, 0.1, 0.1}, {PD_INT32, 7.9, 7},     {PD_INT64, -3.5, -3},
      {PD_UINT8, -3, 0},      {PD_UINT8, 1000, 255},  {PD_BOOL, 2, 1},
      {PD_BOOL, 0, 0},        {PD_FLOAT16, 0.5, 0.5}, {PD_BFLOAT16, -2, -2},
      {PD_INT32, NAN, 0},
  };
  for (int c = 0; c < N_OF(cases); c++) {
    z = fill(e, 2, d, cases[c].v, cases[c].dt);
    assert_int_equal(dev_tensor_dtype(z), cases[c].dt);
    double want[6];
    for (int i = 0; i < 6; i++) want[i] = cases[c].want;
    check(z, want, 6, 0, 0);
    dev_tensor_release(z);
  }
  /* float16 of 1/3 is 0x3555 (rounded once from the float64 value) */
  const int64_t d3[1] = {3};
  z = fill(e, 1, d3, 1.0 / 3.0, PD_FLOAT16);
  uint16_t got[3];
  read_raw(z, 0, got, sizeof got);
  for (int i = 0; i < 3; i++) assert_int_equal(got[i], 0x3555);
  dev_tensor_release(z);
  /* rank 0 and zero-size */
  z = fill(e, 0, NULL, 4, PD_INT64);
  tu_assert_shape(dev_tensor_shape(z), 0, 0);
  check(z, ((const double[]){4}), 1, 0, 0);
  dev_tensor_release(z);
  const int64_t d05[2] = {0, 5};
  z = fill(e, 2, d05, 4, PD_FLOAT32);
  tu_assert_shape(dev_tensor_shape(z), 2, 0, 5);
  check(z, NULL, 0, 0, 0);
  dev_tensor_release(z);
  dev_engine_destroy(e);
}

static void test_zeros_ones_like(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d[2] = {3, 2};
  const double x[6] = {5, 0, 1, 2, 3, 4};
  for (int k = 0; k < N_OF(k_all_dtypes); k++) {
    pd_dtype dt = k_all_dtypes[k];
    dev_tensor *t = mk(e, dt, 2, d, x);
    dev_tensor *z = run1(e, "ZerosLike", t), *o = run1(e, "OnesLike", t);
    assert_int_equal(dev_tensor_dtype(z), dt);
    assert_int_equal(dev_tensor_dtype(o), dt);
    tu_assert_shape(dev_tensor_shape(z), 2, 3, 2);
    tu_assert_shape(dev_tensor_shape(o), 2, 3, 2);
    check(z, ((const double[]){0, 0, 0, 0, 0, 0}), 6, 0, 0);
    check(o, ((const double[]){1, 1, 1, 1, 1, 1}), 6, 0, 0);
    size_t es = pd_dtype_size(dt);
    uint8_t raw[6 * 8];
    read_raw(o, 0, raw, 6 * es);
    if (dt == PD_FLOAT16 || dt == PD_BFLOAT16) {
      uint16_t h;
      memcpy(&h, raw + 2, 2);
      assert_int_equal(h, dt == PD_FLOAT16 ? 0x3C00 : 0x3F80);
    }
    if (dt == PD_BOOL) assert_int_equal(raw[5], 1);
    dev_tensor_release(z);
    dev_tensor_release(o);
    dev_tensor_release(t);
  }
  const int64_t d0[1] = {0};
  dev_tensor *t = mk(e, PD_INT32, 1, d0, NULL);
  dev_tensor *o = run1(e, "OnesLike", t);
  tu_assert_shape(dev_tensor_shape(o), 1, 0);
  check(o, NULL, 0, 0, 0);
  dev_tensor_release(o);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Validation and run-time errors                                           */

static void test_validation_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const int64_t d23[2] = {2, 3}, d4[1] = {4}, d3[1] = {3};
  const double v[6] = {1, 2, 3, 4, 5, 6};
  dev_tensor *f23 = mk(e, PD_FLOAT32, 2, d23, v);
  dev_tensor *f4 = mk(e, PD_FLOAT32, 1, d4, v);
  dev_tensor *i3 = mk(e, PD_INT32, 1, d3, v);
  dev_tensor *f3 = mk(e, PD_FLOAT32, 1, d3, v);
  dev_tensor *b3 = mk(e, PD_BOOL, 1, d3, v);

  /* dtype mismatch between x and y */
  dev_tensor *in[2] = {f3, i3};
  tu_exec_fails(
      e, "Add", in, 2, NULL, 0, PD_INVALID_ARGUMENT,
      "Add: input 'x' has dtype float32 but input 'y' has dtype int32");
  tu_exec_fails(e, "Equal", in, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "Equal: input");
  /* shapes that do not broadcast */
  in[0] = f23;
  in[1] = f4;
  tu_exec_fails(
      e, "Mul", in, 2, NULL, 0, PD_INVALID_ARGUMENT,
      "Mul: x has shape [2, 3] and y has shape [4], which do not broadcast");
  tu_exec_fails(e, "Less", in, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "do not broadcast");
  /* floating-only op on an integer */
  in[0] = i3;
  tu_exec_fails(e, "Exp", in, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "Exp: input 'x' has dtype int32; expected a floating dtype");
  tu_exec_fails(e, "Sigmoid", in, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "dtype int32");
  /* number-only ops on bool */
  in[0] = b3;
  tu_exec_fails(e, "Neg", in, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "Neg: input 'x' has dtype bool; expected a number dtype");
  in[1] = b3;
  tu_exec_fails(e, "Greater", in, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "Greater: input 'x' has dtype bool");
  tu_exec_fails(e, "Add", in, 2, NULL, 0, PD_INVALID_ARGUMENT, "dtype bool");
  /* Fill with a negative dim, missing value, an input */
  const int64_t neg[2] = {2, -1};
  dev_attr fa[2] = {dev_attr_shape("shape", 2, neg),
                    dev_attr_float("value", 1)};
  tu_exec_fails(e, "Fill", NULL, 0, fa, 2, PD_INVALID_ARGUMENT,
                "Fill: attribute 'shape'");
  tu_exec_fails(e, "Fill", NULL, 0, fa, 2, PD_INVALID_ARGUMENT, "-1");
  const int64_t ok[1] = {2};
  dev_attr fb[1] = {dev_attr_shape("shape", 1, ok)};
  tu_exec_fails(e, "Fill", NULL, 0, fb, 1, PD_INVALID_ARGUMENT,
                "Fill: attribute 'value' (float) is required");
  dev_attr fc[2] = {dev_attr_shape("shape", 1, ok), dev_attr_float("value", 1)};
  in[0] = f3;
  tu_exec_fails(e, "Fill", in, 1, fc, 2, PD_INVALID_ARGUMENT,
                "Fill: got 1 inputs; expected 0");
  /* unknown attribute, wrong arity */
  dev_attr unk[1] = {dev_attr_int("foo", 1)};
  in[0] = f3;
  in[1] = f3;
  tu_exec_fails(e, "Add", in, 2, unk, 1, PD_INVALID_ARGUMENT,
                "Add: unknown attribute 'foo'");
  tu_exec_fails(e, "Add", in, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "Add: got 1 inputs; expected 2");
  tu_exec_fails(e, "Neg", in, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "Neg: got 2 inputs; expected 1");
  tu_exec_fails(e, "ZerosLike", NULL, 0, NULL, 0, PD_INVALID_ARGUMENT,
                "ZerosLike: got 0 inputs; expected 1");
  /* Cast without DstT, with DstT of the wrong type or an invalid dtype */
  tu_exec_fails(e, "Cast", in, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "Cast: attribute 'DstT' (dtype) is required");
  dev_attr ci[1] = {dev_attr_int("DstT", 1)};
  tu_exec_fails(e, "Cast", in, 1, ci, 1, PD_INVALID_ARGUMENT,
                "Cast: attribute 'DstT' has type");
  dev_attr cd[1] = {dev_attr_dtype("DstT", (pd_dtype)42)};
  tu_exec_fails(e, "Cast", in, 1, cd, 1, PD_INVALID_ARGUMENT, "DstT");

  dev_tensor_release(f23);
  dev_tensor_release(f4);
  dev_tensor_release(i3);
  dev_tensor_release(f3);
  dev_tensor_release(b3);
  engine_still_works(e);
  dev_engine_destroy(e);
}

/* Waits for t and asserts that it failed with code and a message holding
 * needle. */
static void assert_failed(dev_tensor *t, pd_code code, const char *needle) {
  dev_status st = DEV_STATUS_INIT;
  pd_code got = dev_tensor_wait(t, &st);
  if (got != code)
    fail_msg("expected %s, got %s: %s", pd_code_name(code), pd_code_name(got),
             st.msg);
  if (!strstr(st.msg, needle))
    fail_msg("message \"%s\" lacks \"%s\"", st.msg, needle);
}

/* Integer division by zero and negative integer powers fail at run time:
 * the error is stored on the output, a consumer fails with it, and the
 * engine keeps working. On a mesh only the device that saw the zero
 * fails, and the error names it. */
static void test_runtime_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const int64_t d3[1] = {3};
  const pd_dtype ints[3] = {PD_INT32, PD_INT64, PD_UINT8};
  for (int k = 0; k < 3; k++) {
    dev_tensor *x = mk(e, ints[k], 1, d3, (const double[]){1, 2, 3});
    dev_tensor *y = mk(e, ints[k], 1, d3, (const double[]){1, 0, 1});
    dev_tensor *z = run2(e, "Div", x, y);
    assert_failed(z, PD_INVALID_ARGUMENT, "Div: integer division by zero");
    dev_tensor *w = run2(e, "Add", z, x); /* consumer of a failed tensor */
    assert_failed(w, PD_INVALID_ARGUMENT, "Div: integer division by zero");
    dev_tensor_release(w);
    dev_tensor_release(z);
    /* scalar zero divisor, broadcast */
    dev_tensor *s = mk(e, ints[k], 0, NULL, (const double[]){0});
    z = run2(e, "Div", x, s);
    assert_failed(z, PD_INVALID_ARGUMENT, "Div: integer division by zero");
    dev_tensor_release(z);
    dev_tensor_release(s);
    dev_tensor_release(x);
    dev_tensor_release(y);
  }
  for (int k = 0; k < 2; k++) {
    dev_tensor *x = mk(e, ints[k], 1, d3, (const double[]){2, 2, 2});
    dev_tensor *y = mk(e, ints[k], 1, d3, (const double[]){1, -1, 1});
    dev_tensor *z = run2(e, "Pow", x, y);
    assert_failed(z, PD_INVALID_ARGUMENT,
                  "Pow: integers to negative integer powers are not allowed");
    dev_tensor_release(z);
    dev_tensor_release(x);
    dev_tensor_release(y);
  }
  /* sharded divisor: only device 1 holds the zero */
  {
    dev_tensor *x =
        tu_sharded(e, PD_INT32, 1, d3, 0, (const double[]){6, 6, 6});
    dev_tensor *y =
        tu_sharded(e, PD_INT32, 1, d3, 0, (const double[]){2, 0, 3});
    dev_tensor *z = run2(e, "Div", x, y);
    assert_failed(z, PD_INVALID_ARGUMENT, "Div: integer division by zero");
    assert_failed(z, PD_INVALID_ARGUMENT, "cpu:1");
    dev_tensor_release(z);
    dev_tensor_release(x);
    dev_tensor_release(y);
  }
  /* float division by zero is no error */
  {
    dev_tensor *x = mk(e, PD_FLOAT32, 1, d3, (const double[]){1, 2, 3});
    dev_tensor *y = mk(e, PD_FLOAT32, 1, d3, (const double[]){1, 0, 1});
    dev_tensor *z = run2(e, "Div", x, y);
    check(z, ((const double[]){1, INFINITY, 3}), 3, 0, 0);
    dev_tensor_release(z);
    dev_tensor_release(x);
    dev_tensor_release(y);
  }
  engine_still_works(e);
  dev_engine_destroy(e);
}

/* Long float16/bfloat16 binary runs cross block boundaries, with each
 * operand stepping or fixed. */
static void test_binary_half_long(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t n = 777;
  double x[777], y[1], xr[777], want[777];
  tu_fill_random(x, n, -8, 8, 77);
  y[0] = 0.75;
  pd_dtype dts[2] = {PD_FLOAT16, PD_BFLOAT16};
  for (int k = 0; k < 2; k++) {
    dev_tensor *tx = mk(e, dts[k], 1, &n, x);
    dev_tensor *ty = mk(e, dts[k], 0, NULL, y);
    assert_int_equal(tu_read(tx, 0, xr, n), n);
    for (int64_t i = 0; i < n; i++) want[i] = xr[i] * 0.75;
    dev_tensor *z = run2(e, "Mul", tx, ty);
    check(z, want, n, tu_rtol_f64_op(dts[k]), 1e-6);
    dev_tensor_release(z);
    for (int64_t i = 0; i < n; i++) want[i] = 0.75 - xr[i];
    z = run2(e, "Sub", ty, tx);
    check(z, want, n, tu_rtol_f64_op(dts[k]), 1e-6);
    dev_tensor_release(z);
    for (int64_t i = 0; i < n; i++) want[i] = xr[i] < 0.75;
    z = run2(e, "Less", tx, ty);
    check(z, want, n, 0, 0);
    dev_tensor_release(z);
    for (int64_t i = 0; i < n; i++) want[i] = xr[i] + xr[i];
    z = run2(e, "Add", tx, tx);
    check(z, want, n, 0, 0); /* doubling is exact */
    dev_tensor_release(z);
    dev_tensor_release(tx);
    dev_tensor_release(ty);
  }
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unary_exact_floats),
      cmocka_unit_test(test_unary_special_values),
      cmocka_unit_test(test_unary_math),
      cmocka_unit_test(test_sigmoid_stable),
      cmocka_unit_test(test_unary_int),
      cmocka_unit_test(test_unary_half_long),
      cmocka_unit_test(test_unary_zero_size_and_scalar),
      cmocka_unit_test(test_binary_floats),
      cmocka_unit_test(test_binary_float_specials),
      cmocka_unit_test(test_binary_int32),
      cmocka_unit_test(test_binary_int64),
      cmocka_unit_test(test_binary_uint8),
      cmocka_unit_test(test_equal_bool),
      cmocka_unit_test(test_binary_half_long),
      cmocka_unit_test(test_broadcast_hand),
      cmocka_unit_test(test_broadcast_random_reference),
      cmocka_unit_test(test_broadcast_random_int),
      cmocka_unit_test(test_sharded_mesh),
      cmocka_unit_test(test_half_rounding_bits),
      cmocka_unit_test(test_half_exhaustive),
      cmocka_unit_test(test_cast_single_rounding),
      cmocka_unit_test(test_cast_corners),
      cmocka_unit_test(test_cast_all_pairs),
      cmocka_unit_test(test_fill),
      cmocka_unit_test(test_zeros_ones_like),
      cmocka_unit_test(test_validation_errors),
      cmocka_unit_test(test_runtime_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
