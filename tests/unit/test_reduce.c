/* Tests of Sum, Mean, Max, Min, ArgMax, Softmax, LogSoftmax and
 * SparseSoftmaxCrossEntropyWithLogits (device/ops/reduce.c) against values
 * worked out by hand and float64 references written here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const char *const k_red_ops[] = {"Sum", "Mean", "Max", "Min"};
static const pd_dtype k_all_dtypes[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                                        PD_BFLOAT16, PD_INT32,   PD_INT64,
                                        PD_UINT8};
static const pd_dtype k_float_dtypes[] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16,
                                          PD_BFLOAT16};

static bool is_int(pd_dtype dt) {
  return dt == PD_INT32 || dt == PD_INT64 || dt == PD_UINT8;
}

static dev_tensor *reduce(dev_engine *e, const char *op, dev_tensor *t,
                          const int64_t *axes, int n, bool keep) {
  dev_attr attrs[2] = {dev_attr_int_list("axis", axes, n),
                       dev_attr_bool("keep_dims", keep)};
  return tu_exec(e, op, &t, 1, attrs, 2, 0);
}

/* --- hand cases --------------------------------------------------------------- */

static void test_reduce_hand(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  /* x = [[1, 2, 3], [4, 5, 6]] */
  const double x[] = {1, 2, 3, 4, 5, 6};
  for (size_t d = 0; d < sizeof k_all_dtypes / sizeof k_all_dtypes[0]; d++) {
    pd_dtype dt = k_all_dtypes[d];
    dev_tensor *t = tu_mirrored(e, dt, 2, (int64_t[]){2, 3}, x);
    double got[6];
    struct {
      const char *op;
      int n;
      int64_t axes[2];
      bool keep;
      int rank;
      int64_t dims[2];
      int count;
      double want[3];
    } cases[] = {
        {"Sum", 1, {0}, false, 1, {3}, 3, {5, 7, 9}},
        {"Sum", 1, {1}, false, 1, {2}, 2, {6, 15}},
        {"Sum", 1, {-1}, true, 2, {2, 1}, 2, {6, 15}},
        {"Sum", 0, {0}, false, 0, {0}, 1, {21}},
        {"Sum", 0, {0}, true, 2, {1, 1}, 1, {21}},
        {"Sum", 2, {1, 0}, false, 0, {0}, 1, {21}},
        {"Sum", 2, {-2, -1}, true, 2, {1, 1}, 1, {21}},
        {"Mean", 1, {1}, false, 1, {2}, 2, {2, 5}},
        {"Mean", 1, {0}, true, 2, {1, 3}, 3, {2.5, 3.5, 4.5}},
        {"Mean", 0, {0}, false, 0, {0}, 1, {3.5}},
        {"Max", 1, {0}, false, 1, {3}, 3, {4, 5, 6}},
        {"Max", 1, {-1}, false, 1, {2}, 2, {3, 6}},
        {"Min", 1, {1}, false, 1, {2}, 2, {1, 4}},
        {"Min", 1, {-2}, true, 2, {1, 3}, 3, {1, 2, 3}},
        {"Max", 0, {0}, false, 0, {0}, 1, {6}},
        {"Min", 0, {0}, false, 0, {0}, 1, {1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      dev_tensor *o =
          reduce(e, cases[c].op, t, cases[c].axes, cases[c].n, cases[c].keep);
      assert_int_equal(dev_tensor_dtype(o), dt);
      tu_assert_shape_impl(dev_tensor_shape(o), cases[c].rank, cases[c].dims,
                           __FILE__, __LINE__);
      assert_int_equal(tu_read(o, 0, got, 6), cases[c].count);
      double want[3];
      for (int i = 0; i < cases[c].count; i++)
        /* Integer means truncate: 2.5 -> 2, 3.5 -> 3, 4.5 -> 4. */
        want[i] = is_int(dt) ? trunc(cases[c].want[i]) : cases[c].want[i];
      tu_assert_close(got, want, cases[c].count, 0, 0);
      dev_tensor_release(o);
    }
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

/* --- every axis subset of a rank-3 tensor against a reference ------------------ */

/* Reference: reduces x of dims[3] over the axes in `mask` (0: all) into out
 * (row-major over kept axes). Integer sums are exact here; the caller wraps. */
static int64_t ref_reduce(int op, const double *x, const int64_t *dims,
                          unsigned mask, double *out) {
  if (mask == 0) mask = 7;
  int64_t od[3], on = 1, cnt = 1;
  for (int i = 0; i < 3; i++) {
    od[i] = (mask >> i) & 1 ? 1 : dims[i];
    on *= od[i];
    if ((mask >> i) & 1) cnt *= dims[i];
  }
  for (int64_t o = 0; o < on; o++)
    out[o] = op == 0 || op == 1 ? 0 : op == 2 ? -INFINITY : INFINITY;
  for (int64_t i = 0; i < dims[0]; i++)
    for (int64_t j = 0; j < dims[1]; j++)
      for (int64_t k = 0; k < dims[2]; k++) {
        int64_t oi = (mask & 1) ? 0 : i, oj = (mask & 2) ? 0 : j,
                ok = (mask & 4) ? 0 : k;
        int64_t o = (oi * od[1] + oj) * od[2] + ok;
        double v = x[(i * dims[1] + j) * dims[2] + k];
        if (op <= 1)
          out[o] += v;
        else if (op == 2)
          out[o] = v > out[o] ? v : out[o];
        else
          out[o] = v < out[o] ? v : out[o];
      }
  if (op == 1)
    for (int64_t o = 0; o < on; o++) out[o] /= (double)cnt;
  return on;
}

static void check_subsets(dev_engine *e, pd_dtype dt, const int64_t *dims,
                          uint64_t seed) {
  int64_t n = dims[0] * dims[1] * dims[2];
  double *x = malloc(sizeof(double) * (size_t)(n + 1));
  double *want = malloc(sizeof(double) * (size_t)(n + 1));
  double *got = malloc(sizeof(double) * (size_t)(n + 1));
  tu_fill_random(x, n, -8, 8, seed);
  for (int64_t i = 0; i < n; i++) {
    if (is_int(dt))
      x[i] = dt == PD_UINT8 ? floor(x[i] * 16 + 128) : floor(x[i] * 1000);
    else if (dt == PD_FLOAT32)
      x[i] = (double)(float)x[i];
    else if (dt != PD_FLOAT64)
      x[i] = round(x[i] * 4) / 4; /* exact in 16 bits */
  }
  dev_tensor *t = tu_mirrored(e, dt, 3, dims, x);
  for (int op = 0; op < 4; op++)
    for (unsigned mask = 0; mask < 8; mask++)
      for (int keep = 0; keep < 2; keep++) {
        /* Axes listed in a scrambled order, negative every other time. */
        int64_t axes[3];
        int na = 0;
        for (int a = 2; a >= 0; a--)
          if ((mask >> a) & 1) {
            axes[na] = (na % 2) ? a - 3 : a;
            na++;
          }
        int64_t on = ref_reduce(op, x, dims, mask, want);
        for (int64_t i = 0; i < on; i++) {
          if (dt == PD_UINT8 && op == 0)
            want[i] = fmod(want[i], 256);
          else if (is_int(dt) && op == 1)
            want[i] = trunc(want[i]);
        }
        dev_tensor *o = reduce(e, k_red_ops[op], t, axes, na, keep);
        /* Expected shape. */
        int64_t wd[3];
        int wr = 0;
        unsigned m = mask ? mask : 7;
        for (int a = 0; a < 3; a++) {
          if (!((m >> a) & 1))
            wd[wr++] = dims[a];
          else if (keep)
            wd[wr++] = 1;
        }
        tu_assert_shape_impl(dev_tensor_shape(o), wr, wd, __FILE__, __LINE__);
        int dev = dev_engine_num_devices(e) - 1;
        assert_int_equal(tu_read(o, dev, got, n + 1), on);
        double rtol = tu_rtol_rounded(dt);
        /* float32 Mean divides once more; sums are accurate in float64. */
        if (dt == PD_FLOAT32) rtol = 2e-6;
        double atol = dt == PD_FLOAT32 ? 1e-4 : dt == PD_FLOAT64 ? 1e-9 : 0;
        tu_assert_close(got, want, on, rtol, atol);
        dev_tensor_release(o);
      }
  dev_tensor_release(t);
  free(x);
  free(want);
  free(got);
}

static void test_reduce_axis_subsets(void **state) {
  (void)state;
  static const int64_t shapes[][3] = {{3, 4, 5},   {2, 1, 7},    {1, 6, 1},
                                      {5, 300, 3}, {4, 3, 1100}, {600, 2, 2}};
  dev_engine *e1 = tu_engine(1, 0), *e3 = tu_engine(3, 0);
  uint64_t seed = 1;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t d = 0; d < sizeof k_all_dtypes / sizeof k_all_dtypes[0]; d++)
      check_subsets(s % 2 ? e3 : e1, k_all_dtypes[d], shapes[s], seed++);
  dev_engine_destroy(e1);
  dev_engine_destroy(e3);
}

/* Rank 5, every one of the 32 axis subsets: alternating kept and reduced
 * axes need the kernels' multi-axis walks. Generic reference by index math. */
static void test_reduce_rank5(void **state) {
  (void)state;
  const int64_t dims[5] = {2, 3, 2, 3, 4};
  enum { N = 2 * 3 * 2 * 3 * 4 };
  double x[N], got[N], want[N];
  int64_t cnt[N];
  dev_engine *e = tu_engine(1, 0);
  tu_fill_random(x, N, -100, 100, 9);
  for (int i = 0; i < N; i++) x[i] = floor(x[i]);
  static const pd_dtype dts[] = {PD_FLOAT32, PD_INT32, PD_INT64};
  for (size_t d = 0; d < 3; d++) {
    dev_tensor *t = tu_mirrored(e, dts[d], 5, dims, x);
    for (int op = 0; op < 4; op++)
      for (unsigned mask = 1; mask < 32; mask++) {
        int64_t axes[5], od[5];
        int na = 0;
        for (int a = 0; a < 5; a++) {
          od[a] = (mask >> a) & 1 ? 1 : dims[a];
          if ((mask >> a) & 1) axes[na++] = a;
        }
        for (int i = 0; i < N; i++) {
          want[i] = op <= 1 ? 0 : op == 2 ? -INFINITY : INFINITY;
          cnt[i] = 0;
        }
        for (int i = 0; i < N; i++) {
          int64_t rem = i, o = 0, mul = 1;
          for (int a = 4; a >= 0; a--) {
            int64_t idx = rem % dims[a];
            rem /= dims[a];
            o += (od[a] == 1 ? 0 : idx) * mul;
            mul *= od[a];
          }
          if (op <= 1)
            want[o] += x[i];
          else if (op == 2)
            want[o] = fmax(want[o], x[i]);
          else
            want[o] = fmin(want[o], x[i]);
          cnt[o]++;
        }
        int64_t on = 1;
        for (int a = 0; a < 5; a++) on *= od[a];
        if (op == 1)
          for (int64_t o = 0; o < on; o++) {
            want[o] /= (double)cnt[o];
            if (dts[d] != PD_FLOAT32) want[o] = trunc(want[o]);
          }
        dev_tensor *r = reduce(e, k_red_ops[op], t, axes, na, true);
        tu_assert_shape_impl(dev_tensor_shape(r), 5, od, __FILE__, __LINE__);
        assert_int_equal(tu_read(r, 0, got, N), on);
        tu_assert_close(got, want, on, 1e-6, 0);
        dev_tensor_release(r);
      }
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

/* float32 sums stay accurate over a million elements (a float accumulator
 * would be off by ~1%), along the last and along the first axis. */
static void test_reduce_sum_accuracy(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t n = 1000000;
  double *x = malloc(sizeof(double) * (size_t)n * 2);
  for (int64_t i = 0; i < 2 * n; i++) x[i] = 0.1;
  const double want = (double)n * (double)0.1f;
  dev_tensor *row = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, n}, x);
  dev_tensor *col = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){n, 2}, x);
  dev_tensor *o = reduce(e, "Sum", row, (int64_t[]){1}, 1, false);
  double got[2];
  tu_read(o, 0, got, 2);
  tu_assert_close(got, ((double[]){want, want}), 2, 1e-7, 0);
  dev_tensor_release(o);
  o = reduce(e, "Sum", col, (int64_t[]){0}, 1, false);
  tu_read(o, 0, got, 2);
  tu_assert_close(got, ((double[]){want, want}), 2, 1e-7, 0);
  dev_tensor_release(o);
  o = reduce(e, "Mean", col, (int64_t[]){0}, 1, false);
  tu_read(o, 0, got, 2);
  tu_assert_close(got, ((double[]){(double)0.1f, (double)0.1f}), 2, 1e-7, 0);
  dev_tensor_release(o);
  o = reduce(e, "Sum", row, NULL, 0, false);
  tu_read(o, 0, got, 1);
  tu_assert_close(got, ((double[]){2 * want}), 1, 1e-7, 0);
  dev_tensor_release(o);
  dev_tensor_release(row);
  dev_tensor_release(col);
  free(x);
  dev_engine_destroy(e);
}

static void expect1(dev_engine *e, const char *op, pd_dtype dt, int rank,
                    const int64_t *dims, const double *vals,
                    const int64_t *axes, int na, const double *want, int nw) {
  dev_tensor *t = tu_mirrored(e, dt, rank, dims, vals);
  dev_tensor *o = reduce(e, op, t, axes, na, false);
  double got[8];
  assert_int_equal(tu_read(o, 0, got, 8), nw);
  tu_assert_close(got, want, nw, 0, 0);
  dev_tensor_release(o);
  dev_tensor_release(t);
}

/* Integer paths: wrapping sums, truncating means, extreme values. */
static void test_reduce_integers(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const int64_t d2[] = {2}, d3[] = {3};
  /* Sum wraps modulo 2^bits. */
  expect1(e, "Sum", PD_INT32, 1, d2, (double[]){2147483647.0, 1}, NULL, 0,
          (double[]){-2147483648.0}, 1);
  expect1(e, "Sum", PD_INT32, 1, d2, (double[]){-2147483648.0, -1}, NULL, 0,
          (double[]){2147483647.0}, 1);
  expect1(e, "Sum", PD_INT64, 1, d2, (double[]){9223372036854775807.0, 0}, NULL,
          0, (double[]){9223372036854775807.0}, 1);
  expect1(e, "Sum", PD_UINT8, 1, d2, (double[]){200, 100}, NULL, 0,
          (double[]){44}, 1);
  /* Mean truncates toward zero. */
  expect1(e, "Mean", PD_INT32, 1, d2, (double[]){1, 2}, NULL, 0, (double[]){1},
          1);
  expect1(e, "Mean", PD_INT32, 1, d2, (double[]){-1, -2}, NULL, 0,
          (double[]){-1}, 1);
  expect1(e, "Mean", PD_INT64, 1, d3, (double[]){-7, 0, 0}, NULL, 0,
          (double[]){-2}, 1);
  expect1(e, "Mean", PD_UINT8, 1, d3, (double[]){255, 255, 254}, NULL, 0,
          (double[]){254}, 1);
  /* The mean of two INT32_MAX is INT32_MAX. */
  expect1(e, "Mean", PD_INT32, 1, d2, (double[]){2147483647.0, 2147483647.0},
          NULL, 0, (double[]){2147483647.0}, 1);
  expect1(e, "Max", PD_INT64, 1, d3, (double[]){-9223372036854775808.0, -5, -9},
          NULL, 0, (double[]){-5}, 1);
  expect1(e, "Min", PD_INT32, 1, d3, (double[]){-2147483648.0, 5, 9}, NULL, 0,
          (double[]){-2147483648.0}, 1);
  expect1(e, "Max", PD_UINT8, 1, d3, (double[]){0, 255, 9}, NULL, 0,
          (double[]){255}, 1);
  dev_engine_destroy(e);
}

/* Reductions over zero elements, zero-size outputs, rank 0, NaN. */
static void test_reduce_edge_cases(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const int64_t d03[] = {0, 3}, ax0[] = {0};
  for (size_t d = 0; d < sizeof k_float_dtypes / sizeof k_float_dtypes[0];
       d++) {
    pd_dtype dt = k_float_dtypes[d];
    expect1(e, "Sum", dt, 2, d03, NULL, ax0, 1, (double[]){0, 0, 0}, 3);
    expect1(e, "Mean", dt, 2, d03, NULL, ax0, 1, (double[]){NAN, NAN, NAN}, 3);
    expect1(e, "Max", dt, 2, d03, NULL, ax0, 1,
            (double[]){-INFINITY, -INFINITY, -INFINITY}, 3);
    expect1(e, "Min", dt, 2, d03, NULL, ax0, 1,
            (double[]){INFINITY, INFINITY, INFINITY}, 3);
    expect1(e, "Max", dt, 1, (int64_t[]){3}, (double[]){1, NAN, 3}, NULL, 0,
            (double[]){NAN}, 1);
    expect1(e, "Min", dt, 1, (int64_t[]){3}, (double[]){1, 3, NAN}, NULL, 0,
            (double[]){NAN}, 1);
    expect1(e, "Max", dt, 1, (int64_t[]){3}, (double[]){NAN, -1, 3}, NULL, 0,
            (double[]){NAN}, 1);
    expect1(e, "Sum", dt, 0, NULL, (double[]){2.5}, NULL, 0, (double[]){2.5},
            1);
    expect1(e, "Mean", dt, 0, NULL, (double[]){2.5}, NULL, 0, (double[]){2.5},
            1);
  }
  expect1(e, "Max", PD_INT32, 2, d03, NULL, ax0, 1,
          (double[]){-2147483648.0, -2147483648.0, -2147483648.0}, 3);
  expect1(e, "Min", PD_INT32, 2, d03, NULL, ax0, 1,
          (double[]){2147483647.0, 2147483647.0, 2147483647.0}, 3);
  expect1(e, "Max", PD_INT64, 2, d03, NULL, ax0, 1,
          (double[]){-9223372036854775808.0, -9223372036854775808.0,
                     -9223372036854775808.0},
          3);
  expect1(e, "Min", PD_UINT8, 2, d03, NULL, ax0, 1, (double[]){255, 255, 255},
          3);
  expect1(e, "Max", PD_UINT8, 2, d03, NULL, ax0, 1, (double[]){0, 0, 0}, 3);
  expect1(e, "Sum", PD_INT64, 2, d03, NULL, ax0, 1, (double[]){0, 0, 0}, 3);
  expect1(e, "Sum", PD_INT32, 0, NULL, (double[]){-7}, NULL, 0, (double[]){-7},
          1);
  /* Output with zero elements: [3, 0] over axis 0 is [0]; integer Mean too. */
  for (size_t d = 0; d < sizeof k_all_dtypes / sizeof k_all_dtypes[0]; d++) {
    dev_tensor *t = tu_mirrored(e, k_all_dtypes[d], 2, (int64_t[]){3, 0}, NULL);
    for (int op = 0; op < 4; op++) {
      dev_tensor *o = reduce(e, k_red_ops[op], t, ax0, 1, false);
      tu_assert_shape(dev_tensor_shape(o), 1, 0);
      double got[1];
      assert_int_equal(tu_read(o, 0, got, 1), 0);
      dev_tensor_release(o);
      o = reduce(e, k_red_ops[op], t, ax0, 1, true);
      tu_assert_shape(dev_tensor_shape(o), 2, 1, 0);
      dev_tensor_release(o);
    }
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

/* Sharded input: each component reduces its own shard. */
static void test_reduce_sharded(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double x[7 * 4];
  for (int i = 0; i < 28; i++) x[i] = i;
  dev_tensor *t = tu_sharded(e, PD_FLOAT32, 2, (int64_t[]){7, 4}, 0, x);
  const int64_t rows[3] = {3, 2, 2};
  dev_tensor *o1 = reduce(e, "Sum", t, (int64_t[]){1}, 1, false);
  dev_tensor *o0 = reduce(e, "Max", t, (int64_t[]){0}, 1, true);
  tu_assert_shape(dev_tensor_shape(o1), 1, -1);
  tu_assert_shape(dev_tensor_shape(o0), 2, 1, 4);
  int64_t r0 = 0;
  for (int d = 0; d < 3; d++) {
    double got[4], want[4];
    tu_assert_shape(dev_tensor_component_shape(o1, d), 1, rows[d]);
    assert_int_equal(tu_read(o1, d, got, 4), rows[d]);
    for (int64_t r = 0; r < rows[d]; r++) {
      int64_t i = r0 + r; /* row i holds 4i .. 4i+3: sum 16i + 6 */
      want[r] = 16.0 * (double)i + 6;
    }
    tu_assert_close(got, want, rows[d], 0, 0);
    assert_int_equal(tu_read(o0, d, got, 4), 4);
    for (int c = 0; c < 4; c++) want[c] = 4.0 * (double)(r0 + rows[d] - 1) + c;
    tu_assert_close(got, want, 4, 0, 0);
    r0 += rows[d];
  }
  dev_tensor_release(o1);
  dev_tensor_release(o0);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

/* --- ArgMax ------------------------------------------------------------------ */

static dev_tensor *argmax(dev_engine *e, dev_tensor *t, int64_t axis,
                          pd_dtype ot) {
  dev_attr attrs[2] = {dev_attr_int("axis", axis),
                       dev_attr_dtype("output_type", ot)};
  return tu_exec(e, "ArgMax", &t, 1, attrs, ot == PD_DTYPE_INVALID ? 1 : 2, 0);
}

static void test_argmax_hand(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  /* x = [[1, 5, 5], [7, 2, 7]]: ties give the first index. */
  const double x[] = {1, 5, 5, 7, 2, 7};
  for (size_t d = 0; d < sizeof k_all_dtypes / sizeof k_all_dtypes[0]; d++) {
    dev_tensor *t = tu_mirrored(e, k_all_dtypes[d], 2, (int64_t[]){2, 3}, x);
    double got[3];
    dev_tensor *o = argmax(e, t, 1, PD_DTYPE_INVALID); /* default int64 */
    assert_int_equal(dev_tensor_dtype(o), PD_INT64);
    tu_assert_shape(dev_tensor_shape(o), 1, 2);
    tu_read(o, 0, got, 3);
    tu_assert_close(got, ((double[]){1, 0}), 2, 0, 0);
    dev_tensor_release(o);
    o = argmax(e, t, -1, PD_INT32);
    assert_int_equal(dev_tensor_dtype(o), PD_INT32);
    tu_read(o, 0, got, 3);
    tu_assert_close(got, ((double[]){1, 0}), 2, 0, 0);
    dev_tensor_release(o);
    o = argmax(e, t, 0, PD_INT32);
    tu_assert_shape(dev_tensor_shape(o), 1, 3);
    tu_read(o, 0, got, 3);
    tu_assert_close(got, ((double[]){1, 0, 1}), 3, 0, 0);
    dev_tensor_release(o);
    o = argmax(e, t, -2, PD_INT64);
    tu_read(o, 0, got, 3);
    tu_assert_close(got, ((double[]){1, 0, 1}), 3, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(t);
  }
  /* NaN wins, the first NaN. */
  for (size_t d = 0; d < sizeof k_float_dtypes / sizeof k_float_dtypes[0];
       d++) {
    dev_tensor *t =
        tu_mirrored(e, k_float_dtypes[d], 2, (int64_t[]){2, 4},
                    (double[]){1, NAN, 3, NAN, -INFINITY, -INFINITY, 2, 2});
    double got[2];
    dev_tensor *o = argmax(e, t, 1, PD_INT64);
    tu_read(o, 0, got, 2);
    tu_assert_close(got, ((double[]){1, 2}), 2, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(t);
  }
  /* Zero-size output ([0, 3] along axis 1) and a rank-1 input. */
  dev_tensor *t = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){0, 3}, NULL);
  dev_tensor *o = argmax(e, t, 1, PD_INT64);
  tu_assert_shape(dev_tensor_shape(o), 1, 0);
  dev_tensor_release(o);
  dev_tensor_release(t);
  t = tu_mirrored(e, PD_UINT8, 1, (int64_t[]){4}, (double[]){3, 200, 7, 200});
  o = argmax(e, t, 0, PD_INT64);
  tu_assert_shape(dev_tensor_shape(o), 0);
  double got[1];
  tu_read(o, 0, got, 1);
  tu_assert_close(got, ((double[]){1}), 1, 0, 0);
  dev_tensor_release(o);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

/* Random [a, b, c] along every axis (the middle axis with a wide inner part
 * exercises the blocked path) against a reference here. */
static void test_argmax_random(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const int64_t dims[3] = {3, 5, 1100};
  const int64_t n = 3 * 5 * 1100;
  double *x = malloc(sizeof(double) * (size_t)n);
  double *got = malloc(sizeof(double) * (size_t)n);
  double *want = malloc(sizeof(double) * (size_t)n);
  tu_fill_random(x, n, 0, 6, 5);
  for (int64_t i = 0; i < n; i++) x[i] = floor(x[i]); /* many ties */
  for (size_t d = 0; d < sizeof k_all_dtypes / sizeof k_all_dtypes[0]; d++) {
    dev_tensor *t = tu_mirrored(e, k_all_dtypes[d], 3, dims, x);
    for (int ax = 0; ax < 3; ax++) {
      int64_t outer = 1, inner = 1;
      for (int i = 0; i < ax; i++) outer *= dims[i];
      for (int i = ax + 1; i < 3; i++) inner *= dims[i];
      for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
          int64_t best = 0;
          for (int64_t l = 1; l < dims[ax]; l++)
            if (x[(o * dims[ax] + l) * inner + j] >
                x[(o * dims[ax] + best) * inner + j])
              best = l;
          want[o * inner + j] = (double)best;
        }
      dev_tensor *r = argmax(e, t, ax, d % 2 ? PD_INT32 : PD_INT64);
      assert_int_equal(tu_read(r, 2, got, n), outer * inner);
      tu_assert_close(got, want, outer * inner, 0, 0);
      dev_tensor_release(r);
    }
    dev_tensor_release(t);
  }
  free(x);
  free(got);
  free(want);
  dev_engine_destroy(e);
}

/* --- Softmax, LogSoftmax ------------------------------------------------------ */

static void check_softmax(dev_engine *e, pd_dtype dt, int rank,
                          const int64_t *dims, const double *x) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  int64_t L = dims[rank - 1], rows = L ? n / L : 0;
  double *xs = malloc(sizeof(double) * (size_t)(n + 1));
  double *sm = malloc(sizeof(double) * (size_t)(n + 1));
  double *lsm = malloc(sizeof(double) * (size_t)(n + 1));
  double *got = malloc(sizeof(double) * (size_t)(n + 1));
  /* The values as stored in dt (round trip through the device). */
  dev_tensor *t = tu_mirrored(e, dt, rank, dims, x);
  tu_read(t, 0, xs, n);
  for (int64_t r = 0; r < rows; r++) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < L; j++) m = fmax(m, xs[r * L + j]);
    for (int64_t j = 0; j < L; j++) s += exp(xs[r * L + j] - m);
    for (int64_t j = 0; j < L; j++) {
      sm[r * L + j] = exp(xs[r * L + j] - m) / s;
      lsm[r * L + j] = xs[r * L + j] - m - log(s);
    }
  }
  double rtol = dt == PD_FLOAT64   ? 1e-13
                : dt == PD_FLOAT32 ? 1e-5
                                   : tu_rtol_rounded(dt) * 2;
  dev_tensor *o = tu_exec(e, "Softmax", &t, 1, NULL, 0, 0);
  assert_int_equal(dev_tensor_dtype(o), dt);
  tu_assert_shape_impl(dev_tensor_shape(o), rank, dims, __FILE__, __LINE__);
  tu_read(o, dev_engine_num_devices(e) - 1, got, n);
  tu_assert_close(got, sm, n, rtol, dt == PD_FLOAT64 ? 1e-15 : 1e-7);
  for (int64_t r = 0; r < rows; r++) { /* rows sum to 1 */
    double s = 0;
    for (int64_t j = 0; j < L; j++) {
      assert_true(got[r * L + j] >= 0 && got[r * L + j] <= 1);
      s += got[r * L + j];
    }
    tu_assert_close(&s, ((double[]){1}), 1, rtol * 2, 0);
  }
  dev_tensor_release(o);
  o = tu_exec(e, "LogSoftmax", &t, 1, NULL, 0, 0);
  tu_read(o, 0, got, n);
  tu_assert_close(got, lsm, n, rtol, dt == PD_FLOAT64 ? 1e-13 : 1e-5);
  dev_tensor_release(o);
  dev_tensor_release(t);
  free(xs);
  free(sm);
  free(lsm);
  free(got);
}

static void test_softmax(void **state) {
  (void)state;
  dev_engine *e1 = tu_engine(1, 0), *e3 = tu_engine(3, 0);
  double x[4 * 3 * 37];
  tu_fill_random(x, 4 * 3 * 37, -5, 5, 77);
  for (size_t d = 0; d < sizeof k_float_dtypes / sizeof k_float_dtypes[0];
       d++) {
    pd_dtype dt = k_float_dtypes[d];
    check_softmax(e1, dt, 1, (int64_t[]){5}, x);
    check_softmax(e3, dt, 2, (int64_t[]){4, 37}, x);
    check_softmax(e1, dt, 3, (int64_t[]){4, 3, 37}, x);
    check_softmax(e3, dt, 2, (int64_t[]){3, 1}, x);
    check_softmax(e1, dt, 2, (int64_t[]){0, 4}, x);
    check_softmax(e1, dt, 2, (int64_t[]){4, 0}, x);
  }
  /* Hand case: softmax([0, ln 3]) = [1/4, 3/4]. */
  dev_tensor *t =
      tu_mirrored(e1, PD_FLOAT64, 1, (int64_t[]){2}, (double[]){0, log(3.0)});
  dev_tensor *o = tu_exec(e1, "Softmax", &t, 1, NULL, 0, 0);
  double got[2];
  tu_read(o, 0, got, 2);
  tu_assert_close(got, ((double[]){0.25, 0.75}), 2, 1e-15, 0);
  dev_tensor_release(o);
  o = tu_exec(e1, "LogSoftmax", &t, 1, NULL, 0, 0);
  tu_read(o, 0, got, 2);
  tu_assert_close(got, ((double[]){log(0.25), log(0.75)}), 2, 1e-15, 0);
  dev_tensor_release(o);
  dev_tensor_release(t);
  /* Extreme logits: no inf, no NaN. softmax([1000, -1000]) = [1, 0];
   * logsoftmax = [0, -2000]. */
  for (size_t d = 0; d < sizeof k_float_dtypes / sizeof k_float_dtypes[0];
       d++) {
    pd_dtype dt = k_float_dtypes[d];
    t = tu_mirrored(e1, dt, 2, (int64_t[]){2, 2},
                    (double[]){1000, -1000, -1000, 1000});
    o = tu_exec(e1, "Softmax", &t, 1, NULL, 0, 0);
    double g4[4];
    tu_read(o, 0, g4, 4);
    tu_assert_close(g4, ((double[]){1, 0, 0, 1}), 4, 0, 0);
    dev_tensor_release(o);
    o = tu_exec(e1, "LogSoftmax", &t, 1, NULL, 0, 0);
    tu_read(o, 0, g4, 4);
    tu_assert_close(g4, ((double[]){0, -2000, -2000, 0}), 4, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(t);
  }
  dev_engine_destroy(e1);
  dev_engine_destroy(e3);
}

/* --- SparseSoftmaxCrossEntropyWithLogits -------------------------------------- */

static void sxent(dev_engine *e, dev_tensor *f, dev_tensor *l,
                  dev_tensor **loss, dev_tensor **bp) {
  dev_tensor *in[2] = {f, l};
  dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
  int n = DEV_MAX_OUTPUTS;
  dev_status st = DEV_STATUS_INIT;
  if (dev_execute(e, "SparseSoftmaxCrossEntropyWithLogits", in, 2, NULL, 0,
                  outs, &n, &st))
    fail_msg("SparseSoftmaxCrossEntropyWithLogits: %s", st.msg);
  assert_int_equal(n, 2);
  *loss = outs[0];
  *bp = outs[1];
}

static void test_sxent_hand(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  /* Row 0: features [0, 0, 0], label 1: loss = ln 3, backprop = [1/3, -2/3, 1/3].
   * Row 1: features [1, 2, 3], label 2: softmax = [0.09003057317038046,
   * 0.24472847105479767, 0.6652409557748219]; loss = -ln(0.6652409557748219)
   * = 0.40760596444438046; backprop = softmax - [0, 0, 1]. */
  const double f[] = {0, 0, 0, 1, 2, 3};
  const double want_loss[] = {1.0986122886681098, 0.40760596444438046};
  const double want_bp[] = {1.0 / 3,
                            -2.0 / 3,
                            1.0 / 3,
                            0.09003057317038046,
                            0.24472847105479767,
                            0.6652409557748219 - 1};
  for (size_t d = 0; d < sizeof k_float_dtypes / sizeof k_float_dtypes[0]; d++)
    for (int li = 0; li < 2; li++) {
      pd_dtype dt = k_float_dtypes[d];
      dev_tensor *tf = tu_mirrored(e, dt, 2, (int64_t[]){2, 3}, f);
      dev_tensor *tl = tu_mirrored(e, li ? PD_INT64 : PD_INT32, 1,
                                   (int64_t[]){2}, (double[]){1, 2});
      dev_tensor *loss, *bp;
      sxent(e, tf, tl, &loss, &bp);
      assert_int_equal(dev_tensor_dtype(loss), dt);
      assert_int_equal(dev_tensor_dtype(bp), dt);
      tu_assert_shape(dev_tensor_shape(loss), 1, 2);
      tu_assert_shape(dev_tensor_shape(bp), 2, 2, 3);
      double got[6];
      double rtol = dt == PD_FLOAT64   ? 1e-13
                    : dt == PD_FLOAT32 ? 1e-6
                                       : tu_rtol_rounded(dt) * 2;
      tu_read(loss, 0, got, 2);
      tu_assert_close(got, want_loss, 2, rtol, 0);
      tu_read(bp, 0, got, 6);
      tu_assert_close(got, want_bp, 6, rtol, dt == PD_FLOAT64 ? 1e-15 : 1e-7);
      dev_tensor_release(loss);
      dev_tensor_release(bp);
      dev_tensor_release(tf);
      dev_tensor_release(tl);
    }
  /* Extreme logits stay finite: [1000, -1000] label 1: loss 2000,
   * backprop [1, -1]. */
  dev_tensor *tf =
      tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){1, 2}, (double[]){1000, -1000});
  dev_tensor *tl = tu_mirrored(e, PD_INT32, 1, (int64_t[]){1}, (double[]){1});
  dev_tensor *loss, *bp;
  sxent(e, tf, tl, &loss, &bp);
  double got[2];
  tu_read(loss, 0, got, 1);
  tu_assert_close(got, ((double[]){2000}), 1, 0, 0);
  tu_read(bp, 0, got, 2);
  tu_assert_close(got, ((double[]){1, -1}), 2, 0, 0);
  dev_tensor_release(loss);
  dev_tensor_release(bp);
  dev_tensor_release(tf);
  dev_tensor_release(tl);
  dev_engine_destroy(e);
}

/* Random batch on 3 devices, features sharded by rows, against a reference. */
static void test_sxent_sharded(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  enum { B = 8, C = 10 };
  double f[B * C], lab[B], wl[B], wb[B * C];
  tu_fill_random(f, B * C, -4, 4, 3);
  for (int b = 0; b < B; b++) lab[b] = (b * 7) % C;
  for (int b = 0; b < B; b++) {
    double m = -INFINITY, s = 0;
    for (int j = 0; j < C; j++) m = fmax(m, f[b * C + j]);
    for (int j = 0; j < C; j++) s += exp(f[b * C + j] - m);
    wl[b] = m + log(s) - f[b * C + (int)lab[b]];
    for (int j = 0; j < C; j++)
      wb[b * C + j] = exp(f[b * C + j] - m) / s - (j == (int)lab[b]);
  }
  dev_tensor *tf = tu_sharded(e, PD_FLOAT64, 2, (int64_t[]){B, C}, 0, f);
  dev_tensor *tl = tu_sharded(e, PD_INT64, 1, (int64_t[]){B}, 0, lab);
  dev_tensor *loss, *bp;
  sxent(e, tf, tl, &loss, &bp);
  const int rows[3] = {3, 3, 2};
  int r0 = 0;
  for (int d = 0; d < 3; d++) {
    double got[B * C];
    assert_int_equal(tu_read(loss, d, got, B), rows[d]);
    tu_assert_close(got, wl + r0, rows[d], 1e-12, 1e-14);
    assert_int_equal(tu_read(bp, d, got, B * C), rows[d] * C);
    tu_assert_close(got, wb + r0 * C, rows[d] * C, 1e-12, 1e-15);
    r0 += rows[d];
  }
  dev_tensor_release(loss);
  dev_tensor_release(bp);
  dev_tensor_release(tf);
  dev_tensor_release(tl);
  dev_engine_destroy(e);
}

/* A label out of range fails the op when it runs; the error is stored on both
 * outputs, and the engine goes on. */
static void test_sxent_bad_label(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const double f[10] = {0};
  dev_tensor *tf = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, 5}, f);
  const double bad[][2] = {{1, 7}, {-1, 0}, {5, 0}};
  const char *needles[] = {
      "Received a label value of 7 which is outside the valid range of [0, 5)",
      "Received a label value of -1 which is outside the valid range of [0, 5)",
      "Received a label value of 5 which is outside the valid range of [0, 5)"};
  for (int i = 0; i < 3; i++) {
    dev_tensor *tl =
        tu_mirrored(e, i == 1 ? PD_INT64 : PD_INT32, 1, (int64_t[]){2}, bad[i]);
    dev_tensor *loss, *bp;
    sxent(e, tf, tl, &loss, &bp);
    dev_status st = DEV_STATUS_INIT;
    assert_int_equal(dev_tensor_wait(loss, &st), PD_INVALID_ARGUMENT);
    if (!strstr(st.msg, needles[i]))
      fail_msg("message \"%s\" lacks \"%s\"", st.msg, needles[i]);
    dev_status_clear(&st);
    assert_int_equal(dev_tensor_wait(bp, &st), PD_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, needles[i]));
    /* An op consuming the failed loss fails with the same error. */
    dev_tensor *s = NULL, *outs[1];
    int n = 1;
    dev_attr attrs[1] = {dev_attr_int_list("axis", NULL, 0)};
    assert_int_equal(dev_execute(e, "Sum", &loss, 1, attrs, 1, outs, &n, &st),
                     PD_OK);
    s = outs[0];
    dev_status_clear(&st);
    assert_int_equal(dev_tensor_wait(s, &st), PD_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, needles[i]));
    dev_tensor_release(s);
    dev_tensor_release(loss);
    dev_tensor_release(bp);
    dev_tensor_release(tl);
  }
  /* The engine still runs a good op. */
  dev_tensor *tl =
      tu_mirrored(e, PD_INT32, 1, (int64_t[]){2}, (double[]){0, 4});
  dev_tensor *loss, *bp;
  sxent(e, tf, tl, &loss, &bp);
  double got[2];
  tu_read(loss, 1, got, 2);
  tu_assert_close(got, ((double[]){log(5.0), log(5.0)}), 2, 1e-6, 0);
  dev_tensor_release(loss);
  dev_tensor_release(bp);
  dev_tensor_release(tl);
  dev_tensor_release(tf);
  dev_engine_destroy(e);
}

/* --- validation errors -------------------------------------------------------- */

static void still_works(dev_engine *e) {
  dev_tensor *t =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  dev_tensor *o = reduce(e, "Sum", t, NULL, 0, false);
  double got[1];
  tu_read(o, 0, got, 1);
  tu_assert_close(got, ((double[]){6}), 1, 0, 0);
  dev_tensor_release(o);
  dev_tensor_release(t);
}

static void test_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const double z[24] = {0};
  dev_tensor *r3 = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){2, 3, 4}, z);
  dev_tensor *s0 = tu_mirrored(e, PD_FLOAT32, 0, NULL, z);
  dev_tensor *bl = tu_mirrored(e, PD_BOOL, 1, (int64_t[]){3}, z);
  dev_tensor *i2 = tu_mirrored(e, PD_INT32, 2, (int64_t[]){2, 3}, z);
  dev_tensor *e20 = tu_mirrored(e, PD_INT32, 2, (int64_t[]){2, 0}, z);
  dev_tensor *f20 = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, 0}, z);
  dev_tensor *f23 = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, 3}, z);
  dev_tensor *l2 = tu_mirrored(e, PD_INT32, 1, (int64_t[]){2}, z);
  dev_tensor *l3 = tu_mirrored(e, PD_INT32, 1, (int64_t[]){3}, z);
  dev_tensor *lf = tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, z);
  dev_tensor *l22 = tu_mirrored(e, PD_INT64, 2, (int64_t[]){2, 2}, z);

  for (int op = 0; op < 4; op++) {
    char msg[160];
    const char *nm = k_red_ops[op];
    dev_attr a[2] = {dev_attr_int_list("axis", (int64_t[]){1, -2}, 2),
                     dev_attr_bool("keep_dims", false)};
    snprintf(msg, sizeof msg,
             "%s: attribute 'axis' lists axis 1 more than once", nm);
    tu_exec_fails(e, nm, &r3, 1, a, 2, PD_INVALID_ARGUMENT, msg);
    a[0] = dev_attr_int_list("axis", (int64_t[]){0, 3}, 2);
    snprintf(msg, sizeof msg,
             "%s: attribute 'axis' is 3; expected -3 to 2 for rank 3", nm);
    tu_exec_fails(e, nm, &r3, 1, a, 2, PD_INVALID_ARGUMENT, msg);
    a[0] = dev_attr_int_list("axis", (int64_t[]){-4}, 1);
    tu_exec_fails(e, nm, &r3, 1, a, 2, PD_INVALID_ARGUMENT,
                  "attribute 'axis' is -4");
    a[0] = dev_attr_int_list("axis", (int64_t[]){0}, 1);
    tu_exec_fails(e, nm, &s0, 1, a, 2, PD_INVALID_ARGUMENT,
                  "attribute 'axis' is 0");
    snprintf(msg, sizeof msg, "%s: input 'input' has dtype bool", nm);
    tu_exec_fails(e, nm, &bl, 1, NULL, 0, PD_INVALID_ARGUMENT, msg);
    dev_attr wrong = dev_attr_int("axis", 0);
    tu_exec_fails(e, nm, &r3, 1, &wrong, 1, PD_INVALID_ARGUMENT, "axis");
  }
  /* Integer Mean over zero elements has no value. */
  dev_attr ax1 = dev_attr_int_list("axis", (int64_t[]){1}, 1);
  tu_exec_fails(
      e, "Mean", &e20, 1, &ax1, 1, PD_INVALID_ARGUMENT,
      "Mean: input has shape [2, 0] and dtype int32; the mean over the reduced "
      "axes (zero elements) is undefined for integers");

  /* ArgMax */
  dev_attr am[2] = {dev_attr_int("axis", 1),
                    dev_attr_dtype("output_type", PD_FLOAT32)};
  tu_exec_fails(
      e, "ArgMax", &f23, 1, am, 2, PD_INVALID_ARGUMENT,
      "ArgMax: attribute 'output_type' is float32; expected int32 or int64");
  am[1] = dev_attr_dtype("output_type", PD_INT32);
  tu_exec_fails(e, "ArgMax", &f20, 1, am, 2, PD_INVALID_ARGUMENT,
                "ArgMax: reduction axis 1 is empty in input shape [2, 0]");
  am[0] = dev_attr_int("axis", 2);
  tu_exec_fails(e, "ArgMax", &f23, 1, am, 2, PD_INVALID_ARGUMENT,
                "ArgMax: attribute 'axis' is 2; expected -2 to 1 for rank 2");
  am[0] = dev_attr_int("axis", -3);
  tu_exec_fails(e, "ArgMax", &f23, 1, am, 2, PD_INVALID_ARGUMENT,
                "attribute 'axis' is -3");
  tu_exec_fails(e, "ArgMax", &s0, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "for rank 0");
  tu_exec_fails(e, "ArgMax", &bl, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "ArgMax: input 'input' has dtype bool");

  /* Softmax / LogSoftmax */
  tu_exec_fails(e, "Softmax", &i2, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "Softmax: input 'logits' has dtype int32; expected float32");
  tu_exec_fails(
      e, "LogSoftmax", &s0, 1, NULL, 0, PD_INVALID_ARGUMENT,
      "LogSoftmax: input 'logits' has shape [] (rank 0); expected rank 1 to 8");

  /* SparseSoftmaxCrossEntropyWithLogits */
  const char *X = "SparseSoftmaxCrossEntropyWithLogits";
  tu_exec_fails(e, X, (dev_tensor *[]){f23, l3}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "SparseSoftmaxCrossEntropyWithLogits: features has shape [2, "
                "3] but labels "
                "has shape [3]; expected labels of shape [2]");
  tu_exec_fails(e, X, (dev_tensor *[]){f23, lf}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'labels' has dtype float32; expected int32, int64");
  tu_exec_fails(e, X, (dev_tensor *[]){i2, l2}, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "input 'features' has dtype int32");
  tu_exec_fails(e, X, (dev_tensor *[]){l3, l2}, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "input 'features' has dtype int32");
  tu_exec_fails(
      e, X, (dev_tensor *[]){r3, l2}, 2, NULL, 0, PD_INVALID_ARGUMENT,
      "input 'features' has shape [2, 3, 4] (rank 3); expected rank 2");
  tu_exec_fails(e, X, (dev_tensor *[]){f23, l22}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'labels' has shape [2, 2] (rank 2); expected rank 1");
  tu_exec_fails(e, X, (dev_tensor *[]){f20, l2}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "features has shape [2, 0]; expected at least one class");
  tu_exec_fails(e, X, (dev_tensor *[]){f23}, 1, NULL, 0, PD_INVALID_ARGUMENT,
                NULL);

  still_works(e);
  dev_tensor *all[] = {r3, s0, bl, i2, e20, f20, f23, l2, l3, lf, l22};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reduce_hand),
      cmocka_unit_test(test_reduce_axis_subsets),
      cmocka_unit_test(test_reduce_rank5),
      cmocka_unit_test(test_reduce_sum_accuracy),
      cmocka_unit_test(test_reduce_integers),
      cmocka_unit_test(test_reduce_edge_cases),
      cmocka_unit_test(test_reduce_sharded),
      cmocka_unit_test(test_argmax_hand),
      cmocka_unit_test(test_argmax_random),
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_sxent_hand),
      cmocka_unit_test(test_sxent_sharded),
      cmocka_unit_test(test_sxent_bad_label),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
