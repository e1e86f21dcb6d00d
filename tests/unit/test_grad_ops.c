/* Tests of the gradient ops (device/ops/grad_ops.c): ReluGrad, SqrtGrad,
 * RsqrtGrad, TanhGrad, SigmoidGrad, BroadcastToLike, SumToLike, ReshapeLike,
 * SliceGrad, ConcatGrad and GatherGrad, against values worked out by hand and
 * float64 references written here, on every dtype each op takes, with
 * per-component shapes (uneven shards) for the `like` inputs, and their
 * validation errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

static const pd_dtype k_float_dtypes[] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16,
                                          PD_BFLOAT16};
static const pd_dtype k_all_dtypes[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                                        PD_BFLOAT16, PD_INT32,   PD_INT64,
                                        PD_UINT8,    PD_BOOL};

/* Uploads values rounded to dt and gives back the rounded values. */
static dev_tensor *up(dev_engine *e, pd_dtype dt, int rank, const int64_t *dims,
                      double *vals) {
  dev_tensor *t = tu_mirrored(e, dt, rank, dims, vals);
  dev_shape s;
  assert_int_equal(dev_shape_make(rank, dims, &s, NULL), PD_OK);
  tu_read(t, 0, vals, tu_numel(&s));
  return t;
}

static dev_tensor *exec2(dev_engine *e, const char *op, dev_tensor *a,
                         dev_tensor *b, const dev_attr *attrs, int na) {
  dev_tensor *in[2] = {a, b};
  return tu_exec(e, op, in, 2, attrs, na, 0);
}

/* --- ReluGrad, SqrtGrad, RsqrtGrad, TanhGrad, SigmoidGrad ---------------------- */

static double eg_ref(const char *op, double a, double b) {
  if (!strcmp(op, "ReluGrad")) return b > 0 ? a : 0;
  if (!strcmp(op, "SqrtGrad")) return b * 0.5 / a;
  if (!strcmp(op, "RsqrtGrad")) return -0.5 * a * a * a * b;
  if (!strcmp(op, "TanhGrad")) return b * (1 - a * a);
  return b * a * (1 - a);
}

static void test_elementwise_grads(void **state) {
  (void)state;
  const char *ops[] = {"ReluGrad", "SqrtGrad", "RsqrtGrad", "TanhGrad",
                       "SigmoidGrad"};
  dev_engine *e = tu_engine(2, 0);
  for (size_t o = 0; o < 5; o++)
    for (size_t k = 0; k < 4; k++) {
      pd_dtype dt = k_float_dtypes[k];
      enum { N = 37 };
      double a[N], b[N], want[N], got[N];
      tu_fill_random(a, N, o == 1 ? 0.5 : -2, 2, 100 + o * 8 + k);
      tu_fill_random(b, N, -2, 2, 200 + o * 8 + k);
      dev_tensor *ta = up(e, dt, 2, DIMS(37, 1), a),
                 *tb = up(e, dt, 2, DIMS(37, 1), b);
      for (int i = 0; i < N; i++) want[i] = eg_ref(ops[o], a[i], b[i]);
      dev_tensor *out = exec2(e, ops[o], ta, tb, NULL, 0);
      assert_int_equal(dev_tensor_dtype(out), dt);
      tu_assert_shape(dev_tensor_shape(out), 2, 37, 1);
      tu_read(out, 1, got, N);
      tu_assert_close(got, want, N, tu_rtol_f32_op(dt),
                      dt == PD_FLOAT64 ? 1e-15 : 1e-6);
      dev_tensor_release(out);
      dev_tensor_release(ta);
      dev_tensor_release(tb);
    }
  /* Hand values: ReluGrad keeps the gradient where the feature is > 0 only. */
  double g[4] = {1, 2, 3, 4}, f[4] = {-1, 0, 0.5, 7};
  dev_tensor *tg = up(e, PD_FLOAT32, 1, DIMS(4), g),
             *tf = up(e, PD_FLOAT32, 1, DIMS(4), f);
  dev_tensor *r = exec2(e, "ReluGrad", tg, tf, NULL, 0);
  double got[4];
  tu_read(r, 0, got, 4);
  tu_assert_close(got, ((const double[]){0, 0, 3, 4}), 4, 0, 0);
  dev_tensor_release(r);
  /* Errors: shapes differ, dtypes differ, integers. */
  double z[6] = {0};
  dev_tensor *t23 = up(e, PD_FLOAT32, 2, DIMS(2, 3), z),
             *d4 = up(e, PD_FLOAT64, 1, DIMS(4), z);
  dev_tensor *i4 = up(e, PD_INT32, 1, DIMS(4), z);
  tu_exec_fails(e, "TanhGrad", (dev_tensor *[]){tg, t23}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'y' has shape [4] but input 'dy' has shape [2, 3]");
  tu_exec_fails(e, "SqrtGrad", (dev_tensor *[]){tg, d4}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "expected the same dtype");
  tu_exec_fails(e, "ReluGrad", (dev_tensor *[]){i4, i4}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "input 'gradients' has dtype int32");
  dev_tensor *all[] = {tg, tf, t23, d4, i4};
  for (int i = 0; i < 5; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

/* --- BroadcastToLike ------------------------------------------------------------- */

static void test_broadcast_to_like_hand(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  double x3[3] = {1, 2, 3}, x2[2] = {4, 8}, s1[1] = {5}, like[6] = {0}, got[6];
  dev_tensor *a = up(e, PD_FLOAT32, 1, DIMS(3), x3),
             *b = up(e, PD_FLOAT32, 1, DIMS(2), x2);
  dev_tensor *s = up(e, PD_FLOAT32, 0, DIMS(0), s1);
  dev_tensor *l23 = up(e, PD_INT32, 2, DIMS(2, 3), like);
  /* NumPy broadcasting: [3] -> [2, 3] */
  dev_tensor *o = exec2(e, "BroadcastToLike", a, l23, NULL, 0);
  assert_int_equal(dev_tensor_dtype(o), PD_FLOAT32);
  tu_assert_shape(dev_tensor_shape(o), 2, 2, 3);
  tu_read(o, 0, got, 6);
  tu_assert_close(got, ((const double[]){1, 2, 3, 1, 2, 3}), 6, 0, 0);
  dev_tensor_release(o);
  /* A reduction's adjoint: [2] with axis [1] -> [2, 3]; mean divides by 3. */
  int64_t ax1 = 1, axm1 = -1;
  dev_attr at[2] = {dev_attr_int_list("axis", &ax1, 1),
                    dev_attr_bool("mean", true)};
  o = exec2(e, "BroadcastToLike", b, l23, at, 1);
  tu_read(o, 0, got, 6);
  tu_assert_close(got, ((const double[]){4, 4, 4, 8, 8, 8}), 6, 0, 0);
  dev_tensor_release(o);
  at[0] = dev_attr_int_list("axis", &axm1, 1);
  o = exec2(e, "BroadcastToLike", b, l23, at, 2);
  tu_read(o, 0, got, 6);
  tu_assert_close(
      got, ((const double[]){4. / 3, 4. / 3, 4. / 3, 8. / 3, 8. / 3, 8. / 3}),
      6, 1e-7, 0);
  dev_tensor_release(o);
  /* A scalar, with mean over all 6 elements. */
  o = exec2(e, "BroadcastToLike", s, l23, at + 1, 1);
  tu_read(o, 0, got, 6);
  tu_assert_close(
      got, ((const double[]){5. / 6, 5. / 6, 5. / 6, 5. / 6, 5. / 6, 5. / 6}),
      6, 1e-7, 0);
  dev_tensor_release(o);
  /* Every dtype moves as bytes. */
  for (size_t k = 0; k < sizeof k_all_dtypes / sizeof k_all_dtypes[0]; k++) {
    double v[2] = {1, 0};
    dev_tensor *t = up(e, k_all_dtypes[k], 2, DIMS(2, 1), v);
    o = exec2(e, "BroadcastToLike", t, l23, NULL, 0);
    assert_int_equal(dev_tensor_dtype(o), k_all_dtypes[k]);
    tu_read(o, 0, got, 6);
    tu_assert_close(got, ((const double[]){1, 1, 1, 0, 0, 0}), 6, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(t);
  }
  /* Errors. */
  int64_t ax9 = 9, dup[2] = {1, -1};
  dev_attr bad_axis = dev_attr_int_list("axis", &ax9, 1),
           dup_axis = dev_attr_int_list("axis", dup, 2);
  dev_tensor *li = up(e, PD_INT32, 1, DIMS(3), like);
  tu_exec_fails(e, "BroadcastToLike", (dev_tensor *[]){b, l23}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "does not broadcast to shape [2, 3]");
  tu_exec_fails(e, "BroadcastToLike", (dev_tensor *[]){b, l23}, 2, &bad_axis, 1,
                PD_INVALID_ARGUMENT, "attribute 'axis' has 9");
  tu_exec_fails(e, "BroadcastToLike", (dev_tensor *[]){l23, l23}, 2, &dup_axis,
                1, PD_INVALID_ARGUMENT, "more than once");
  tu_exec_fails(e, "BroadcastToLike", (dev_tensor *[]){l23, li}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "rank");
  tu_exec_fails(e, "BroadcastToLike", (dev_tensor *[]){li, l23}, 2, at + 1, 1,
                PD_INVALID_ARGUMENT, "mean=true");
  dev_tensor *all[] = {a, b, s, l23, li};
  for (int i = 0; i < 5; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

/* Random rank-4 broadcasts against index arithmetic, every float dtype, with
 * a `like` whose components differ in shape ([2, 4, 4, 5] sharded on axis 1
 * into 2, 1 and 1 rows; x has 1 there). */
static void test_broadcast_to_like_random(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const int64_t ld[4] = {2, 4, 4, 5}, rows[3] = {2, 1, 1};
  double *like = calloc(160, sizeof(double)),
         *got = malloc(160 * sizeof(double));
  double *want = malloc(160 * sizeof(double));
  for (unsigned mask = 0; mask < 8; mask++)
    for (size_t k = 0; k < 4; k++) {
      pd_dtype dt = k_float_dtypes[k];
      int64_t xd[4] = {mask & 1 ? 1 : 2, 1, mask & 2 ? 1 : 4, mask & 4 ? 1 : 5};
      double x[40];
      tu_fill_random(x, 40, -4, 4, mask * 4 + k);
      dev_tensor *tx = up(e, dt, 4, xd, x);
      dev_tensor *tl = tu_sharded(e, PD_UINT8, 4, ld, 1, like);
      dev_tensor *o = exec2(e, "BroadcastToLike", tx, tl, NULL, 0);
      for (int d = 0; d < 3; d++) {
        tu_assert_shape(dev_tensor_component_shape(o, d), 4, 2, rows[d], 4, 5);
        int64_t n = 0;
        for (int64_t i0 = 0; i0 < 2; i0++)
          for (int64_t i1 = 0; i1 < rows[d]; i1++)
            for (int64_t i2 = 0; i2 < 4; i2++)
              for (int64_t i3 = 0; i3 < 5; i3++) {
                int64_t j0 = xd[0] == 1 ? 0 : i0, j2 = xd[2] == 1 ? 0 : i2;
                int64_t j3 = xd[3] == 1 ? 0 : i3;
                want[n++] = x[(j0 * xd[2] + j2) * xd[3] + j3];
              }
        tu_read(o, d, got, n);
        tu_assert_close(got, want, n, 0, 0);
      }
      dev_tensor_release(o);
      dev_tensor_release(tl);
      dev_tensor_release(tx);
    }
  free(like);
  free(got);
  free(want);
  dev_engine_destroy(e);
}

/* --- SumToLike ------------------------------------------------------------------- */

static void test_sum_to_like(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double z[64] = {0}, got[64], want[64];
  /* Hand: [2, 3] summed to [3], to [2, 1], to [] and to itself. */
  double x[6] = {1, 2, 3, 4, 5, 6};
  dev_tensor *tx = up(e, PD_FLOAT64, 2, DIMS(2, 3), x);
  struct {
    int rank;
    int64_t dims[2];
    int n;
    double want[6];
  } cases[] = {{1, {3}, 3, {5, 7, 9}},
               {2, {2, 1}, 2, {6, 15}},
               {2, {1, 3}, 3, {5, 7, 9}},
               {0, {0}, 1, {21}},
               {2, {2, 3}, 6, {1, 2, 3, 4, 5, 6}}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    dev_tensor *tl = up(e, PD_BOOL, cases[c].rank, cases[c].dims, z);
    dev_tensor *o = exec2(e, "SumToLike", tx, tl, NULL, 0);
    tu_assert_shape_impl(dev_tensor_shape(o), cases[c].rank, cases[c].dims,
                         __FILE__, __LINE__);
    tu_read(o, 2, got, 6);
    tu_assert_close(got, cases[c].want, cases[c].n, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(tl);
  }
  /* Random [3, 4, 5] to every like shape with 1s and fewer axes, every float
   * dtype. */
  for (size_t k = 0; k < 4; k++) {
    pd_dtype dt = k_float_dtypes[k];
    double v[60];
    tu_fill_random(v, 60, -2, 2, 40 + k);
    dev_tensor *tv = up(e, dt, 3, DIMS(3, 4, 5), v);
    for (int lead = 0; lead <= 3; lead++)
      for (unsigned mask = 0; mask < 8; mask++) {
        int64_t full[3] = {3, 4, 5}, ld[3];
        int lr = 3 - lead;
        for (int i = 0; i < lr; i++)
          ld[i] = (mask >> i) & 1 ? 1 : full[lead + i];
        /* reference: sum over axes dropped (i < lead) or kept as 1 */
        int64_t on = 1;
        for (int i = 0; i < lr; i++) on *= ld[i];
        for (int64_t i = 0; i < on; i++) want[i] = 0;
        for (int64_t a = 0; a < 3; a++)
          for (int64_t b = 0; b < 4; b++)
            for (int64_t c = 0; c < 5; c++) {
              int64_t idx[3] = {a, b, c}, o = 0;
              for (int i = 0; i < lr; i++)
                o = o * ld[i] + (ld[i] == 1 ? 0 : idx[lead + i]);
              want[o] += v[(a * 4 + b) * 5 + c];
            }
        dev_tensor *tl = up(e, PD_FLOAT32, lr, ld, z);
        dev_tensor *o = exec2(e, "SumToLike", tv, tl, NULL, 0);
        assert_int_equal(dev_tensor_dtype(o), dt);
        tu_read(o, 0, got, on);
        tu_assert_close(got, want, on, tu_rtol_f32_op(dt),
                        dt == PD_FLOAT64 ? 1e-13 : 1e-5);
        dev_tensor_release(o);
        dev_tensor_release(tl);
      }
    dev_tensor_release(tv);
  }
  /* Components of different shapes: [7, 2] sharded (3, 2, 2 rows) to [1, 2]. */
  double s[14];
  for (int i = 0; i < 14; i++) s[i] = i;
  dev_tensor *ts = tu_sharded(e, PD_FLOAT64, 2, DIMS(7, 2), 0, s);
  dev_tensor *l12 = up(e, PD_FLOAT64, 2, DIMS(1, 2), z);
  dev_tensor *o = exec2(e, "SumToLike", ts, l12, NULL, 0);
  const double w0[2] = {0 + 2 + 4, 1 + 3 + 5}, w1[2] = {6 + 8, 7 + 9},
               w2[2] = {10 + 12, 11 + 13};
  tu_read(o, 0, got, 2);
  tu_assert_close(got, w0, 2, 0, 0);
  tu_read(o, 1, got, 2);
  tu_assert_close(got, w1, 2, 0, 0);
  tu_read(o, 2, got, 2);
  tu_assert_close(got, w2, 2, 0, 0);
  dev_tensor_release(o);
  /* Errors. */
  dev_tensor *i23 = up(e, PD_INT32, 2, DIMS(2, 3), z),
             *l4 = up(e, PD_FLOAT64, 1, DIMS(4), z);
  dev_tensor *l123 = up(e, PD_FLOAT64, 3, DIMS(1, 2, 3), z);
  tu_exec_fails(e, "SumToLike", (dev_tensor *[]){i23, tx}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "input 'input' has dtype int32");
  tu_exec_fails(
      e, "SumToLike", (dev_tensor *[]){tx, l4}, 2, NULL, 0, PD_INVALID_ARGUMENT,
      "input 'like' has shape [4], which does not broadcast to shape [2, 3]");
  tu_exec_fails(e, "SumToLike", (dev_tensor *[]){tx, l123}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, NULL);
  dev_tensor *all[] = {tx, ts, l12, i23, l4, l123};
  for (int i = 0; i < 6; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

/* --- ReshapeLike ----------------------------------------------------------------- */

static void test_reshape_like(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double v[14], got[14], z[14] = {0};
  for (int i = 0; i < 14; i++) v[i] = i + 0.5;
  /* Sharded [7, 2] (3, 2, 2 rows) takes the shapes [6], [4], [4] of another
   * sharded [7, 2] flattened per component. */
  dev_tensor *x = tu_sharded(e, PD_FLOAT64, 2, DIMS(7, 2), 0, v);
  dev_tensor *sh = tu_sharded(e, PD_INT64, 2, DIMS(7, 2), 0, z);
  int64_t m1 = -1;
  dev_attr flat = dev_attr_int_list("shape", &m1, 1);
  dev_tensor *like = tu_exec(e, "Reshape", &sh, 1, &flat, 1, 0);
  dev_tensor *o = exec2(e, "ReshapeLike", x, like, NULL, 0);
  assert_int_equal(dev_tensor_dtype(o), PD_FLOAT64);
  const int64_t n[3] = {6, 4, 4}, off[3] = {0, 6, 10};
  for (int d = 0; d < 3; d++) {
    tu_assert_shape(dev_tensor_component_shape(o, d), 1, n[d]);
    tu_read(o, d, got, n[d]);
    tu_assert_close(got, v + off[d], n[d], 0, 0);
  }
  dev_tensor_release(o);
  dev_tensor_release(like);
  dev_tensor_release(sh);
  /* Equal counts per component. */
  dev_tensor *l32 = up(e, PD_BOOL, 2, DIMS(3, 2), z);
  dev_tensor *x6 = up(e, PD_FLOAT16, 1, DIMS(6), v);
  o = exec2(e, "ReshapeLike", x6, l32, NULL, 0);
  tu_assert_shape(dev_tensor_shape(o), 2, 3, 2);
  assert_int_equal(dev_tensor_dtype(o), PD_FLOAT16);
  tu_read(o, 1, got, 6);
  tu_assert_close(got, v, 6, 0, 0);
  dev_tensor_release(o);
  tu_exec_fails(e, "ReshapeLike", (dev_tensor *[]){x, l32}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "expected equal element counts");
  dev_tensor *all[] = {x, l32, x6};
  for (int i = 0; i < 3; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

/* --- SliceGrad ------------------------------------------------------------------- */

static void test_slice_grad(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  double z[120] = {0}, got[120], want[120];
  /* Hand: [2, 3] written at [1, 2] of [4, 5]. */
  double g[6] = {1, 2, 3, 4, 5, 6};
  dev_tensor *tg = up(e, PD_FLOAT32, 2, DIMS(2, 3), g),
             *l45 = up(e, PD_UINT8, 2, DIMS(4, 5), z);
  int64_t b12[2] = {1, 2};
  dev_attr bg = dev_attr_int_list("begin", b12, 2);
  dev_tensor *o = exec2(e, "SliceGrad", tg, l45, &bg, 1);
  tu_assert_shape(dev_tensor_shape(o), 2, 4, 5);
  assert_int_equal(dev_tensor_dtype(o), PD_FLOAT32);
  tu_read(o, 1, got, 20);
  const double hand[20] = {0, 0, 0, 0, 0, 0, 0, 1, 2, 3,
                           0, 0, 4, 5, 6, 0, 0, 0, 0, 0};
  tu_assert_close(got, hand, 20, 0, 0);
  dev_tensor_release(o);
  /* Random rank-3 placements, every dtype, against index arithmetic. */
  const int64_t L[3] = {4, 5, 6};
  for (int rep = 0; rep < 24; rep++) {
    pd_dtype dt = k_all_dtypes[rep % 8];
    double r[6];
    tu_fill_random(r, 6, 0, 1, 300 + rep);
    int64_t gd[3], b[3];
    for (int i = 0; i < 3; i++) {
      gd[i] = (int64_t)(r[i] * (double)(L[i] + 1));
      if (gd[i] > L[i]) gd[i] = L[i];
      b[i] = (int64_t)(r[3 + i] * (double)(L[i] - gd[i] + 1));
      if (b[i] > L[i] - gd[i]) b[i] = L[i] - gd[i];
    }
    double gv[120];
    for (int i = 0; i < 120; i++) gv[i] = dt == PD_BOOL ? 1 : (i % 50) + 1;
    dev_tensor *t = up(e, dt, 3, gd, gv);
    dev_tensor *lk = up(e, PD_FLOAT64, 3, L, z);
    dev_attr ba = dev_attr_int_list("begin", b, 3);
    o = exec2(e, "SliceGrad", t, lk, &ba, 1);
    for (int i = 0; i < 120; i++) want[i] = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < gd[0]; i++)
      for (int64_t j = 0; j < gd[1]; j++)
        for (int64_t k = 0; k < gd[2]; k++)
          want[((b[0] + i) * 5 + b[1] + j) * 6 + b[2] + k] = gv[n++];
    tu_read(o, 0, got, 120);
    tu_assert_close(got, want, 120, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(t);
    dev_tensor_release(lk);
  }
  /* Errors. */
  int64_t b33[2] = {3, 3}, b1[1] = {0};
  dev_attr far = dev_attr_int_list("begin", b33, 2),
           short_b = dev_attr_int_list("begin", b1, 1);
  tu_exec_fails(e, "SliceGrad", (dev_tensor *[]){tg, l45}, 2, &far, 1,
                PD_INVALID_ARGUMENT,
                "axis 0: begin 3 and grad's size 2 do not fit in dim 4");
  tu_exec_fails(e, "SliceGrad", (dev_tensor *[]){tg, l45}, 2, &short_b, 1,
                PD_INVALID_ARGUMENT, "expected one rank for all three");
  tu_exec_fails(e, "SliceGrad", (dev_tensor *[]){tg, l45}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "'begin'");
  dev_tensor_release(tg);
  dev_tensor_release(l45);
  dev_engine_destroy(e);
}

/* --- ConcatGrad ------------------------------------------------------------------ */

static void test_concat_grad(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  double z[12] = {0}, got[12];
  double g[12] = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15}; /* [2, 6] */
  dev_tensor *tg = up(e, PD_FLOAT64, 2, DIMS(2, 6), g);
  dev_tensor *v0 = up(e, PD_INT32, 2, DIMS(2, 1), z),
             *v1 = up(e, PD_INT32, 2, DIMS(2, 2), z);
  dev_tensor *v2 = up(e, PD_INT32, 2, DIMS(2, 3), z);
  dev_attr ax[2] = {dev_attr_int("axis", 1), dev_attr_bool("from_end", true)};
  /* Prefix form: the part of the last value listed. */
  dev_tensor *o =
      tu_exec(e, "ConcatGrad", (dev_tensor *[]){tg, v0}, 2, ax, 1, 0);
  tu_assert_shape(dev_tensor_shape(o), 2, 2, 1);
  tu_read(o, 0, got, 2);
  tu_assert_close(got, ((const double[]){0, 10}), 2, 0, 0);
  dev_tensor_release(o);
  o = tu_exec(e, "ConcatGrad", (dev_tensor *[]){tg, v0, v1}, 3, ax, 1, 0);
  tu_read(o, 0, got, 4);
  tu_assert_close(got, ((const double[]){1, 2, 11, 12}), 4, 0, 0);
  dev_tensor_release(o);
  o = tu_exec(e, "ConcatGrad", (dev_tensor *[]){tg, v0, v1, v2}, 4, ax, 1, 0);
  tu_read(o, 0, got, 6);
  tu_assert_close(got, ((const double[]){3, 4, 5, 13, 14, 15}), 6, 0, 0);
  dev_tensor_release(o);
  /* from_end: the part of the first value listed, counted from the end. */
  o = tu_exec(e, "ConcatGrad", (dev_tensor *[]){tg, v1, v2}, 3, ax, 2, 0);
  tu_read(o, 0, got, 4);
  tu_assert_close(got, ((const double[]){1, 2, 11, 12}), 4, 0, 0);
  dev_tensor_release(o);
  o = tu_exec(e, "ConcatGrad", (dev_tensor *[]){tg, v2}, 2, ax, 2, 0);
  tu_read(o, 0, got, 6);
  tu_assert_close(got, ((const double[]){3, 4, 5, 13, 14, 15}), 6, 0, 0);
  dev_tensor_release(o);
  /* Axis 0 of a [2, 6] bool grad. */
  dev_tensor *tb = up(e, PD_BOOL, 2, DIMS(2, 6),
                      (double[]){0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1});
  dev_tensor *r1 = up(e, PD_FLOAT32, 2, DIMS(1, 6), z);
  dev_attr a0 = dev_attr_int("axis", 0);
  o = tu_exec(e, "ConcatGrad", (dev_tensor *[]){tb, r1, r1}, 3, &a0, 1, 0);
  assert_int_equal(dev_tensor_dtype(o), PD_BOOL);
  tu_read(o, 0, got, 6);
  tu_assert_close(got, ((const double[]){1, 1, 0, 0, 0, 1}), 6, 0, 0);
  dev_tensor_release(o);
  /* Errors. */
  dev_tensor *w = up(e, PD_INT32, 2, DIMS(3, 2), z);
  dev_attr a5 = dev_attr_int("axis", 5);
  tu_exec_fails(e, "ConcatGrad", (dev_tensor *[]){tg, v2, v2, v2}, 4, ax, 1,
                PD_INVALID_ARGUMENT,
                "'values' have 9 elements on axis 1 together");
  tu_exec_fails(e, "ConcatGrad", (dev_tensor *[]){tg, w}, 2, ax, 1,
                PD_INVALID_ARGUMENT, "input 'values[0]' has shape [3, 2]");
  tu_exec_fails(e, "ConcatGrad", (dev_tensor *[]){tg, v0}, 2, &a5, 1,
                PD_INVALID_ARGUMENT, "attribute 'axis' is 5");
  tu_exec_fails(e, "ConcatGrad", (dev_tensor *[]){tg}, 1, ax, 1,
                PD_INVALID_ARGUMENT, NULL);
  dev_tensor *all[] = {tg, v0, v1, v2, tb, r1, w};
  for (int i = 0; i < 7; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

/* --- GatherGrad ------------------------------------------------------------------ */

static void test_gather_grad(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  double z[24] = {0}, got[24];
  /* Rows of grad added back at indices [0, 2, 0] of a [4, 2] like. */
  double g[6] = {1, 2, 3, 4, 5, 6};
  for (size_t k = 0; k < 4; k++) {
    pd_dtype dt = k_float_dtypes[k];
    dev_tensor *tg = up(e, dt, 2, DIMS(3, 2), g);
    dev_tensor *ix =
        up(e, k % 2 ? PD_INT64 : PD_INT32, 1, DIMS(3), (double[]){0, 2, 0});
    dev_tensor *lk = up(e, PD_FLOAT64, 2, DIMS(4, 2), z);
    dev_tensor *o =
        tu_exec(e, "GatherGrad", (dev_tensor *[]){tg, ix, lk}, 3, NULL, 0, 0);
    assert_int_equal(dev_tensor_dtype(o), dt);
    tu_assert_shape(dev_tensor_shape(o), 2, 4, 2);
    tu_read(o, 1, got, 8);
    tu_assert_close(got, ((const double[]){6, 8, 0, 0, 3, 4, 0, 0}), 8, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(tg);
    dev_tensor_release(ix);
    dev_tensor_release(lk);
  }
  /* axis 1 with 2-d indices: like [2, 3, 2], indices [2, 2], grad [2, 2, 2, 2]. */
  double g16[16];
  for (int i = 0; i < 16; i++) g16[i] = i + 1;
  dev_tensor *tg = up(e, PD_FLOAT64, 4, DIMS(2, 2, 2, 2), g16);
  dev_tensor *ix = up(e, PD_INT32, 2, DIMS(2, 2), (double[]){2, 0, 2, 2});
  dev_tensor *lk = up(e, PD_INT32, 3, DIMS(2, 3, 2), z);
  dev_attr a1 = dev_attr_int("axis", 1);
  dev_tensor *o =
      tu_exec(e, "GatherGrad", (dev_tensor *[]){tg, ix, lk}, 3, &a1, 1, 0);
  /* out[o, ix[i], k] += g[o, i, k] for i over the 4 indices 2, 0, 2, 2 */
  double want[12] = {0};
  const int idx[4] = {2, 0, 2, 2};
  for (int oo = 0; oo < 2; oo++)
    for (int i = 0; i < 4; i++)
      for (int k = 0; k < 2; k++)
        want[(oo * 3 + idx[i]) * 2 + k] += g16[(oo * 4 + i) * 2 + k];
  tu_read(o, 0, got, 12);
  tu_assert_close(got, want, 12, 0, 0);
  dev_tensor_release(o);
  /* A bad index fails the op when it runs. */
  dev_tensor *bad = up(e, PD_INT64, 2, DIMS(2, 2), (double[]){0, 3, 1, 1});
  o = tu_exec(e, "GatherGrad", (dev_tensor *[]){tg, bad, lk}, 3, &a1, 1, 0);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(o, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "indices[1] = 3 is not in [0, 3)"));
  dev_tensor_release(o);
  /* Errors at preparation. */
  dev_tensor *ig = up(e, PD_INT32, 4, DIMS(2, 2, 2, 2), z);
  dev_tensor *fx = up(e, PD_FLOAT32, 2, DIMS(2, 2), z);
  dev_attr a7 = dev_attr_int("axis", 7);
  tu_exec_fails(e, "GatherGrad", (dev_tensor *[]){ig, ix, lk}, 3, &a1, 1,
                PD_INVALID_ARGUMENT, "input 'grad' has dtype int32");
  tu_exec_fails(e, "GatherGrad", (dev_tensor *[]){tg, fx, lk}, 3, &a1, 1,
                PD_INVALID_ARGUMENT, "input 'indices' has dtype float32");
  tu_exec_fails(e, "GatherGrad", (dev_tensor *[]){tg, ix, lk}, 3, NULL, 0,
                PD_INVALID_ARGUMENT, "expected Gather's output shape");
  tu_exec_fails(e, "GatherGrad", (dev_tensor *[]){tg, ix, lk}, 3, &a7, 1,
                PD_INVALID_ARGUMENT, "attribute 'axis' is 7");
  dev_tensor *all[] = {tg, ix, lk, bad, ig, fx};
  for (int i = 0; i < 6; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_elementwise_grads),
      cmocka_unit_test(test_broadcast_to_like_hand),
      cmocka_unit_test(test_broadcast_to_like_random),
      cmocka_unit_test(test_sum_to_like),
      cmocka_unit_test(test_reshape_like),
      cmocka_unit_test(test_slice_grad),
      cmocka_unit_test(test_concat_grad),
      cmocka_unit_test(test_gather_grad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
