/* Tests of MatMul, BatchMatMul and BiasAdd (device/ops/linalg.c) against
 * values worked out by hand and a naive float64 triple loop written here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const double Z[64]; /* zeros */

static const pd_dtype k_float_dtypes[] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16,
                                          PD_BFLOAT16};

static dev_tensor *mm(dev_engine *e, const char *op, dev_tensor *a,
                      dev_tensor *b, bool t1, bool t2) {
  bool bmm = strcmp(op, "BatchMatMul") == 0;
  dev_attr attrs[2] = {dev_attr_bool(bmm ? "adj_x" : "transpose_a", t1),
                       dev_attr_bool(bmm ? "adj_y" : "transpose_b", t2)};
  dev_tensor *in[2] = {a, b};
  return tu_exec(e, op, in, 2, attrs, 2, 0);
}

/* Stores the transpose of an r x c row-major matrix. */
static void transpose(const double *src, int64_t r, int64_t c, double *dst) {
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < c; j++) dst[j * r + i] = src[i * c + j];
}

/* Naive reference: out[m x n] = A[m x k] * B[k x n] (untransposed). */
static void ref_matmul(const double *a, const double *b, int64_t m, int64_t k,
                       int64_t n, double *out) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t p = 0; p < k; p++) s += a[i * k + p] * b[p * n + j];
      out[i * n + j] = s;
    }
}

/* --- MatMul by hand --------------------------------------------------------- */

static void test_matmul_hand(void **state) {
  (void)state;
  /* A = [[1,2,3],[4,5,6]], B = [[7,8],[9,10],[11,12]]:
   * A*B = [[1*7+2*9+3*11, 1*8+2*10+3*12], [4*7+5*9+6*11, 4*8+5*10+6*12]]
   *     = [[58, 64], [139, 154]]. */
  const double A[] = {1, 2, 3, 4, 5, 6}, At[] = {1, 4, 2, 5, 3, 6};
  const double B[] = {7, 8, 9, 10, 11, 12}, Bt[] = {7, 9, 11, 8, 10, 12};
  const double AB[] = {58, 64, 139, 154};
  /* B*A = [[7+32, 14+40, 21+48], [9+40, 18+50, 27+60], [11+48, 22+60, 33+72]] */
  const double BA[] = {39, 54, 69, 49, 68, 87, 59, 82, 105};
  dev_engine *e = tu_engine(1, 0);
  for (size_t d = 0; d < 4; d++) {
    pd_dtype dt = k_float_dtypes[d];
    dev_tensor *a = tu_mirrored(e, dt, 2, (int64_t[]){2, 3}, A);
    dev_tensor *at = tu_mirrored(e, dt, 2, (int64_t[]){3, 2}, At);
    dev_tensor *b = tu_mirrored(e, dt, 2, (int64_t[]){3, 2}, B);
    dev_tensor *bt = tu_mirrored(e, dt, 2, (int64_t[]){2, 3}, Bt);
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        dev_tensor *c = mm(e, "MatMul", ta ? at : a, tb ? bt : b, ta, tb);
        assert_int_equal(dev_tensor_dtype(c), dt);
        tu_assert_shape(dev_tensor_shape(c), 2, 2, 2);
        double got[4];
        assert_int_equal(tu_read(c, 0, got, 4), 4);
        tu_assert_close(got, AB, 4, 0, 0); /* exact in every dtype */
        dev_tensor_release(c);
      }
    /* B*A is 3x3; with transpose_a on Bt and transpose_b on At. */
    dev_tensor *c = mm(e, "MatMul", bt, at, true, true);
    tu_assert_shape(dev_tensor_shape(c), 2, 3, 3);
    double got[9];
    tu_read(c, 0, got, 9);
    tu_assert_close(got, BA, 9, 0, 0);
    dev_tensor_release(c);
    dev_tensor_release(a);
    dev_tensor_release(at);
    dev_tensor_release(b);
    dev_tensor_release(bt);
  }
  dev_engine_destroy(e);
}

/* --- MatMul against the float64 reference at random shapes ------------------ */

static void check_random_matmul(dev_engine *e, pd_dtype dt, int64_t m,
                                int64_t k, int64_t n, bool ta, bool tb,
                                uint64_t seed) {
  int64_t na = m * k, nb = k * n;
  double *a = malloc(sizeof(double) * (size_t)(na + 1));
  double *b = malloc(sizeof(double) * (size_t)(nb + 1));
  double *as = malloc(sizeof(double) * (size_t)(na + 1));
  double *bs = malloc(sizeof(double) * (size_t)(nb + 1));
  double *want = malloc(sizeof(double) * (size_t)(m * n + 1));
  double *got = malloc(sizeof(double) * (size_t)(m * n + 1));
  tu_fill_random(a, na, -1, 1, seed);
  tu_fill_random(b, nb, -1, 1, seed + 1);
  bool half = dt == PD_FLOAT16 || dt == PD_BFLOAT16;
  for (int64_t i = 0; i < na; i++)
    a[i] = half               ? round(a[i] * 16) / 16
           : dt == PD_FLOAT32 ? (double)(float)a[i]
                              : a[i];
  for (int64_t i = 0; i < nb; i++)
    b[i] = half               ? round(b[i] * 16) / 16
           : dt == PD_FLOAT32 ? (double)(float)b[i]
                              : b[i];
  ref_matmul(a, b, m, k, n, want);
  if (ta)
    transpose(a, m, k, as);
  else
    memcpy(as, a, sizeof(double) * (size_t)na);
  if (tb)
    transpose(b, k, n, bs);
  else
    memcpy(bs, b, sizeof(double) * (size_t)nb);
  dev_tensor *ta_t =
      tu_mirrored(e, dt, 2, ta ? (int64_t[]){k, m} : (int64_t[]){m, k}, as);
  dev_tensor *tb_t =
      tu_mirrored(e, dt, 2, tb ? (int64_t[]){n, k} : (int64_t[]){k, n}, bs);
  dev_tensor *c = mm(e, "MatMul", ta_t, tb_t, ta, tb);
  tu_assert_shape(dev_tensor_shape(c), 2, m, n);
  for (int d = 0; d < dev_engine_num_devices(e); d++) {
    assert_int_equal(tu_read(c, d, got, m * n), m * n);
    /* Inputs are exact in dt; sums of k products of magnitude <= 1. */
    double atol = half               ? 0
                  : dt == PD_FLOAT32 ? 4e-7 * (double)(k + 1)
                                     : 1e-14 * (double)(k + 1);
    tu_assert_close(got, want, m * n, tu_rtol_rounded(dt), atol);
  }
  dev_tensor_release(c);
  dev_tensor_release(ta_t);
  dev_tensor_release(tb_t);
  free(a);
  free(b);
  free(as);
  free(bs);
  free(want);
  free(got);
}

static void test_matmul_random(void **state) {
  (void)state;
  static const int64_t shapes[][3] = {{1, 1, 1},    {3, 0, 4},   {0, 5, 2},
                                      {4, 6, 0},    {1, 17, 1},  {7, 13, 5},
                                      {33, 17, 65}, {64, 128, 9}};
  dev_engine *e1 = tu_engine(1, 0), *e3 = tu_engine(3, 0);
  uint64_t seed = 1;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t d = 0; d < 4; d++)
      for (int t = 0; t < 4; t++)
        check_random_matmul(s % 2 ? e3 : e1, k_float_dtypes[d], shapes[s][0],
                            shapes[s][1], shapes[s][2], t & 1, t & 2, seed++);
  dev_engine_destroy(e1);
  dev_engine_destroy(e3);
}

/* k = 0: the product of [m, 0] and [0, n] is all zeros. */
static void test_matmul_empty_inner(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  for (size_t d = 0; d < 4; d++) {
    dev_tensor *a =
        tu_mirrored(e, k_float_dtypes[d], 2, (int64_t[]){2, 0}, NULL);
    dev_tensor *b =
        tu_mirrored(e, k_float_dtypes[d], 2, (int64_t[]){0, 3}, NULL);
    dev_tensor *c = mm(e, "MatMul", a, b, false, false);
    tu_assert_shape(dev_tensor_shape(c), 2, 2, 3);
    double got[6], want[6] = {0};
    tu_read(c, 0, got, 6);
    tu_assert_close(got, want, 6, 0, 0);
    dev_tensor_release(c);
    dev_tensor_release(a);
    dev_tensor_release(b);
  }
  dev_engine_destroy(e);
}

/* Sharded a: each component multiplies its own rows. */
static void test_matmul_sharded(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double a[7 * 3], b[3 * 2], want[7 * 2], got[7 * 2];
  tu_fill_random(a, 21, -2, 2, 11);
  tu_fill_random(b, 6, -2, 2, 12);
  ref_matmul(a, b, 7, 3, 2, want);
  dev_tensor *ta = tu_sharded(e, PD_FLOAT64, 2, (int64_t[]){7, 3}, 0, a);
  dev_tensor *tb = tu_mirrored(e, PD_FLOAT64, 2, (int64_t[]){3, 2}, b);
  dev_tensor *c = mm(e, "MatMul", ta, tb, false, false);
  tu_assert_shape(dev_tensor_shape(c), 2, -1, 2);
  const int64_t rows[3] = {3, 2, 2};
  int64_t row0 = 0;
  for (int d = 0; d < 3; d++) {
    tu_assert_shape(dev_tensor_component_shape(c, d), 2, rows[d], 2);
    assert_int_equal(tu_read(c, d, got, 14), rows[d] * 2);
    tu_assert_close(got, want + row0 * 2, rows[d] * 2, 1e-13, 1e-13);
    row0 += rows[d];
  }
  dev_tensor_release(c);
  dev_tensor_release(ta);
  dev_tensor_release(tb);
  dev_engine_destroy(e);
}

/* --- BatchMatMul ------------------------------------------------------------ */

/* Reference for BatchMatMulV2: shapes given per operand, batch broadcast. */
static void ref_bmm(const double *x, int xr, const int64_t *xd, const double *y,
                    int yr, const int64_t *yd, bool ax, bool ay, double *out,
                    int64_t *od, int *or_) {
  int xb = xr - 2, yb = yr - 2, nb = xb > yb ? xb : yb;
  int64_t xbd[8], ybd[8];
  for (int i = 0; i < nb; i++) {
    xbd[i] = i - (nb - xb) >= 0 ? xd[i - (nb - xb)] : 1;
    ybd[i] = i - (nb - yb) >= 0 ? yd[i - (nb - yb)] : 1;
    od[i] = xbd[i] == 1 ? ybd[i] : xbd[i]; /* NumPy: 1 stretches, 0 stays */
  }
  int64_t xrws = xd[xr - 2], xcls = xd[xr - 1], yrws = yd[yr - 2],
          ycls = yd[yr - 1];
  int64_t m = ax ? xcls : xrws, k = ax ? xrws : xcls, n = ay ? yrws : ycls;
  od[nb] = m;
  od[nb + 1] = n;
  *or_ = nb + 2;
  int64_t batch = 1;
  for (int i = 0; i < nb; i++) batch *= od[i];
  for (int64_t bi = 0; bi < batch; bi++) {
    int64_t rem = bi, xoff = 0, yoff = 0, xs = 1, ys = 1;
    for (int i = nb - 1; i >= 0; i--) {
      int64_t idx = rem % od[i];
      rem /= od[i];
      xoff += (xbd[i] == 1 ? 0 : idx) * xs;
      yoff += (ybd[i] == 1 ? 0 : idx) * ys;
      xs *= xbd[i];
      ys *= ybd[i];
    }
    const double *X = x + xoff * xrws * xcls, *Y = y + yoff * yrws * ycls;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t p = 0; p < k; p++) {
          double xv = ax ? X[p * xcls + i] : X[i * xcls + p];
          double yv = ay ? Y[j * ycls + p] : Y[p * ycls + j];
          s += xv * yv;
        }
        out[(bi * m + i) * n + j] = s;
      }
  }
}

static void check_bmm(dev_engine *e, pd_dtype dt, int xr, const int64_t *xd,
                      int yr, const int64_t *yd, bool ax, bool ay,
                      uint64_t seed) {
  int64_t nx = tu_count(xr, xd), ny = tu_count(yr, yd);
  double *x = malloc(sizeof(double) * (size_t)(nx + 1));
  double *y = malloc(sizeof(double) * (size_t)(ny + 1));
  tu_fill_random(x, nx, -1, 1, seed);
  tu_fill_random(y, ny, -1, 1, seed + 7);
  for (int64_t i = 0; i < nx; i++) x[i] = round(x[i] * 16) / 16;
  for (int64_t i = 0; i < ny; i++) y[i] = round(y[i] * 16) / 16;
  int64_t od[8];
  int orank;
  double *want = malloc(sizeof(double) * 4096);
  double *got = malloc(sizeof(double) * 4096);
  ref_bmm(x, xr, xd, y, yr, yd, ax, ay, want, od, &orank);
  int64_t no = tu_count(orank, od);
  assert_true(no <= 4096);
  dev_tensor *tx = tu_mirrored(e, dt, xr, xd, x);
  dev_tensor *ty = tu_mirrored(e, dt, yr, yd, y);
  dev_tensor *c = mm(e, "BatchMatMul", tx, ty, ax, ay);
  tu_assert_shape_impl(dev_tensor_shape(c), orank, od, __FILE__, __LINE__);
  assert_int_equal(tu_read(c, dev_engine_num_devices(e) - 1, got, 4096), no);
  tu_assert_close(got, want, no, tu_rtol_rounded(dt), 0);
  dev_tensor_release(c);
  dev_tensor_release(tx);
  dev_tensor_release(ty);
  free(x);
  free(y);
  free(want);
  free(got);
}

static void test_batch_matmul_broadcast(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  /* The brief's case: [2,1,3,4] x [3,4,5] -> [2,3,3,5]. */
  {
    double x[24 * 1], y[60];
    for (int i = 0; i < 24; i++) x[i] = i % 5 - 2;
    for (int i = 0; i < 60; i++) y[i] = i % 7 - 3;
    dev_tensor *tx = tu_mirrored(e, PD_FLOAT32, 4, (int64_t[]){2, 1, 3, 4}, x);
    dev_tensor *ty = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){3, 4, 5}, y);
    dev_tensor *c = mm(e, "BatchMatMul", tx, ty, false, false);
    tu_assert_shape(dev_tensor_shape(c), 4, 2, 3, 3, 5);
    double got[90], want[90];
    /* out[b0, b1] = x[b0, 0] * y[b1], written out as loops here. */
    for (int b0 = 0; b0 < 2; b0++)
      for (int b1 = 0; b1 < 3; b1++)
        for (int i = 0; i < 3; i++)
          for (int j = 0; j < 5; j++) {
            double s = 0;
            for (int p = 0; p < 4; p++)
              s += x[b0 * 12 + i * 4 + p] * y[b1 * 20 + p * 5 + j];
            want[((b0 * 3 + b1) * 3 + i) * 5 + j] = s;
          }
    for (int d = 0; d < 3; d++) {
      tu_read(c, d, got, 90);
      tu_assert_close(got, want, 90, 0, 0);
    }
    dev_tensor_release(c);
    dev_tensor_release(tx);
    dev_tensor_release(ty);
  }
  static const struct {
    int xr;
    int64_t xd[5];
    int yr;
    int64_t yd[5];
  } cases[] = {
      {4, {2, 1, 3, 4}, 3, {3, 4, 5}},       /* broadcast both ways */
      {4, {2, 3, 4, 5}, 2, {5, 6}},          /* y one matrix (folded gemm) */
      {2, {4, 5}, 3, {3, 5, 6}},             /* x one matrix */
      {3, {3, 1, 1}, 3, {3, 1, 1}},          /* 1x1 matrices */
      {3, {0, 2, 3}, 2, {3, 4}},             /* empty batch */
      {3, {2, 2, 0}, 3, {2, 0, 3}},          /* k = 0: zeros */
      {5, {2, 1, 2, 3, 4}, 4, {3, 1, 4, 2}}, /* ranks 5 and 4 */
  };
  uint64_t seed = 100;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (size_t d = 0; d < 4; d++) {
      /* Untransposed as listed; adj variants use the transposed layouts. */
      check_bmm(e, k_float_dtypes[d], cases[i].xr, cases[i].xd, cases[i].yr,
                cases[i].yd, false, false, seed++);
      int64_t xd[5], yd[5];
      memcpy(xd, cases[i].xd, sizeof xd);
      memcpy(yd, cases[i].yd, sizeof yd);
      int64_t t = xd[cases[i].xr - 1];
      xd[cases[i].xr - 1] = xd[cases[i].xr - 2];
      xd[cases[i].xr - 2] = t;
      t = yd[cases[i].yr - 1];
      yd[cases[i].yr - 1] = yd[cases[i].yr - 2];
      yd[cases[i].yr - 2] = t;
      check_bmm(e, k_float_dtypes[d], cases[i].xr, xd, cases[i].yr, cases[i].yd,
                true, false, seed++);
      check_bmm(e, k_float_dtypes[d], cases[i].xr, cases[i].xd, cases[i].yr, yd,
                false, true, seed++);
      check_bmm(e, k_float_dtypes[d], cases[i].xr, xd, cases[i].yr, yd, true,
                true, seed++);
    }
  dev_engine_destroy(e);
}

/* --- BiasAdd ------------------------------------------------------------------ */

static dev_tensor *bias_add(dev_engine *e, dev_tensor *v, dev_tensor *b,
                            const char *fmt) {
  dev_tensor *in[2] = {v, b};
  dev_attr a = dev_attr_string("data_format", fmt);
  return tu_exec(e, "BiasAdd", in, 2, fmt ? &a : NULL, fmt ? 1 : 0, 0);
}

static void test_bias_add(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  static const pd_dtype dts[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                                 PD_BFLOAT16, PD_INT32,   PD_INT64,
                                 PD_UINT8};
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
    pd_dtype dt = dts[d];
    /* NHWC (default): value [2, 3], bias [3] added to each row. */
    const double v[] = {1, 2, 3, 4, 5, 6}, b[] = {10, 20, 30};
    const double want[] = {11, 22, 33, 14, 25, 36};
    dev_tensor *tv = tu_mirrored(e, dt, 2, (int64_t[]){2, 3}, v);
    dev_tensor *tb = tu_mirrored(e, dt, 1, (int64_t[]){3}, b);
    double got[12];
    dev_tensor *o = bias_add(e, tv, tb, NULL);
    assert_int_equal(dev_tensor_dtype(o), dt);
    tu_assert_shape(dev_tensor_shape(o), 2, 2, 3);
    tu_read(o, 0, got, 6);
    tu_assert_close(got, want, 6, 0, 0);
    dev_tensor_release(o);
    o = bias_add(e, tv, tb, "NHWC");
    tu_read(o, 0, got, 6);
    tu_assert_close(got, want, 6, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(tv);
    /* NCHW: value [2, 3, 2], bias[c] added over each [n, c, :]. */
    const double v2[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const double want2[] = {11, 12, 23, 24, 35, 36, 17, 18, 29, 30, 41, 42};
    tv = tu_mirrored(e, dt, 3, (int64_t[]){2, 3, 2}, v2);
    o = bias_add(e, tv, tb, "NCHW");
    tu_assert_shape(dev_tensor_shape(o), 3, 2, 3, 2);
    tu_read(o, 0, got, 12);
    tu_assert_close(got, want2, 12, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(tv);
    /* NHWC on rank 4: [1, 2, 2, 3]. */
    tv = tu_mirrored(e, dt, 4, (int64_t[]){1, 2, 2, 3}, v2);
    o = bias_add(e, tv, tb, NULL);
    const double want3[] = {11, 22, 33, 14, 25, 36, 17, 28, 39, 20, 31, 42};
    tu_read(o, 0, got, 12);
    tu_assert_close(got, want3, 12, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(tv);
    /* Zero-size value. */
    tv = tu_mirrored(e, dt, 2, (int64_t[]){0, 3}, NULL);
    o = bias_add(e, tv, tb, NULL);
    tu_assert_shape(dev_tensor_shape(o), 2, 0, 3);
    dev_tensor_release(o);
    dev_tensor_release(tv);
    dev_tensor_release(tb);
  }
  /* Integer addition wraps: uint8 250 + 10 = 4, int32 INT32_MAX + 1 = INT32_MIN. */
  {
    dev_tensor *tv =
        tu_mirrored(e, PD_UINT8, 2, (int64_t[]){1, 2}, (double[]){250, 5});
    dev_tensor *tb =
        tu_mirrored(e, PD_UINT8, 1, (int64_t[]){2}, (double[]){10, 10});
    dev_tensor *o = bias_add(e, tv, tb, NULL);
    double got[2];
    tu_read(o, 0, got, 2);
    tu_assert_close(got, ((double[]){4, 15}), 2, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(tv);
    dev_tensor_release(tb);
    tv = tu_mirrored(e, PD_INT32, 2, (int64_t[]){1, 2},
                     (double[]){2147483647.0, -5});
    tb = tu_mirrored(e, PD_INT32, 1, (int64_t[]){2}, (double[]){1, 1});
    o = bias_add(e, tv, tb, NULL);
    tu_read(o, 0, got, 2);
    tu_assert_close(got, ((double[]){-2147483648.0, -4}), 2, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(tv);
    dev_tensor_release(tb);
  }
  /* float16 rounding: 1 + 2^-11 rounds to even (1.0); bfloat16 1 + 2^-8 too. */
  {
    dev_tensor *tv =
        tu_mirrored(e, PD_FLOAT16, 2, (int64_t[]){1, 1}, (double[]){1.0});
    dev_tensor *tb = tu_mirrored(e, PD_FLOAT16, 1, (int64_t[]){1},
                                 (double[]){1.0 / 2048 * 3});
    dev_tensor *o = bias_add(e, tv, tb, NULL);
    double got[1];
    tu_read(o, 0, got, 1);
    /* 1 + 3*2^-11 lies halfway between 1+2^-10 and 1+2^-9: even is 1+2^-9. */
    tu_assert_close(got, ((double[]){1.0 + 1.0 / 512}), 1, 0, 0);
    dev_tensor_release(o);
    dev_tensor_release(tv);
    dev_tensor_release(tb);
  }
  dev_engine_destroy(e);
}

/* Sharded value on 3 devices, components [2,3], [1,3], [1,3]. */
static void test_bias_add_sharded(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double v[12];
  for (int i = 0; i < 12; i++) v[i] = i;
  dev_tensor *tv = tu_sharded(e, PD_FLOAT32, 2, (int64_t[]){4, 3}, 0, v);
  dev_tensor *tb =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){3}, (double[]){0.5, -1, 2});
  dev_tensor *o = bias_add(e, tv, tb, NULL);
  const int64_t rows[3] = {2, 1, 1};
  int64_t r0 = 0;
  for (int d = 0; d < 3; d++) {
    double got[6], want[6];
    for (int64_t i = 0; i < rows[d] * 3; i++)
      want[i] = v[r0 * 3 + i] + (double[]){0.5, -1, 2}[i % 3];
    assert_int_equal(tu_read(o, d, got, 6), rows[d] * 3);
    tu_assert_close(got, want, rows[d] * 3, 0, 0);
    r0 += rows[d];
  }
  dev_tensor_release(o);
  dev_tensor_release(tv);
  dev_tensor_release(tb);
  dev_engine_destroy(e);
}

/* --- validation errors ------------------------------------------------------ */

static void still_works(dev_engine *e) {
  dev_tensor *a =
      tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){1, 2}, (double[]){1, 2});
  dev_tensor *b =
      tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, 1}, (double[]){3, 4});
  dev_tensor *c = mm(e, "MatMul", a, b, false, false);
  double got[1];
  tu_read(c, 0, got, 1);
  tu_assert_close(got, ((double[]){11}), 1, 0, 0);
  dev_tensor_release(c);
  dev_tensor_release(a);
  dev_tensor_release(b);
}

static void test_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  dev_tensor *a23 = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, 3},
                                (double[]){0, 0, 0, 0, 0, 0});
  dev_tensor *b45 = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){4, 5}, Z);
  dev_tensor *b32d = tu_mirrored(e, PD_FLOAT64, 2, (int64_t[]){3, 2},
                                 (double[]){0, 0, 0, 0, 0, 0});
  dev_tensor *i23 = tu_mirrored(e, PD_INT32, 2, (int64_t[]){2, 3},
                                (double[]){0, 0, 0, 0, 0, 0});
  dev_tensor *r3 = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){1, 2, 3},
                               (double[]){0, 0, 0, 0, 0, 0});
  dev_tensor *r1 =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){3}, (double[]){0, 0, 0});
  dev_tensor *r0 = tu_mirrored(e, PD_FLOAT32, 0, NULL, (double[]){0});
  dev_tensor *bl = tu_mirrored(e, PD_BOOL, 2, (int64_t[]){2, 3},
                               (double[]){0, 0, 0, 0, 0, 0});

  /* MatMul */
  tu_exec_fails(
      e, "MatMul", (dev_tensor *[]){a23, b45}, 2, NULL, 0, PD_INVALID_ARGUMENT,
      "MatMul: inner dimensions differ: a is [2, 3] (transpose_a=false), b is "
      "[4, 5] (transpose_b=false); expected a's columns (3) to equal b's rows "
      "(4)");
  dev_attr tr[2] = {dev_attr_bool("transpose_a", true),
                    dev_attr_bool("transpose_b", true)};
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){a23, b45}, 2, tr, 2,
                PD_INVALID_ARGUMENT,
                "expected a's rows (2) to equal b's columns (5)");
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){a23, b32d}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "expected the same dtype");
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){i23, i23}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'a' has dtype int32; expected float32, float64, float16 "
                "or bfloat16");
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){r3, a23}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'a' has shape [1, 2, 3] (rank 3); expected rank 2");
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){a23, r1}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'b' has shape [3] (rank 1); expected rank 2");
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){r0, r0}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "rank 0");
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){a23}, 1, NULL, 0,
                PD_INVALID_ARGUMENT, NULL);
  dev_attr wrong_type = dev_attr_int("transpose_a", 1);
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){a23, b32d}, 2, &wrong_type, 1,
                PD_INVALID_ARGUMENT, "transpose_a");

  /* BatchMatMul */
  dev_tensor *x234 = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){2, 3, 4}, Z);
  dev_tensor *y345 = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){3, 4, 5}, Z);
  dev_tensor *y255 = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){2, 5, 5}, Z);
  tu_exec_fails(e, "BatchMatMul", (dev_tensor *[]){x234, y345}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "BatchMatMul: batch dimensions do not broadcast: x is [2, 3, "
                "4], y is [3, 4, 5]; "
                "x's axis 0 is 2 and y's axis 0 is 3");
  tu_exec_fails(e, "BatchMatMul", (dev_tensor *[]){x234, y255}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "BatchMatMul: inner dimensions differ: x is [2, 3, 4] "
                "(adj_x=false), y is "
                "[2, 5, 5] (adj_y=false); expected x's columns (4) to equal "
                "y's rows (5)");
  tu_exec_fails(e, "BatchMatMul", (dev_tensor *[]){r1, x234}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'x' has shape [3] (rank 1); expected rank 2 to 8");
  tu_exec_fails(e, "BatchMatMul", (dev_tensor *[]){i23, i23}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "input 'x' has dtype int32");
  tu_exec_fails(e, "BatchMatMul", (dev_tensor *[]){x234, b32d}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "expected the same dtype");

  /* BiasAdd */
  dev_tensor *b3 =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  dev_tensor *b2 =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_attr nchw = dev_attr_string("data_format", "NCHW");
  dev_attr bad = dev_attr_string("data_format", "NCWH");
  tu_exec_fails(e, "BiasAdd", (dev_tensor *[]){a23, b3}, 2, &bad, 1,
                PD_INVALID_ARGUMENT,
                "BiasAdd: attribute 'data_format' is \"NCWH\"; expected "
                "\"NHWC\" or \"NCHW\"");
  tu_exec_fails(e, "BiasAdd", (dev_tensor *[]){a23, b2}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "BiasAdd: bias has shape [2] but value has shape [2, 3] "
                "(data_format=NHWC); "
                "expected bias of size 3");
  tu_exec_fails(e, "BiasAdd", (dev_tensor *[]){r3, b3}, 2, &nchw, 1,
                PD_INVALID_ARGUMENT,
                "BiasAdd: bias has shape [3] but value has shape [1, 2, 3] "
                "(data_format=NCHW); "
                "expected bias of size 2");
  tu_exec_fails(e, "BiasAdd", (dev_tensor *[]){r1, b3}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'value' has shape [3] (rank 1); expected rank 2 to 8");
  tu_exec_fails(e, "BiasAdd", (dev_tensor *[]){a23, a23}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'bias' has shape [2, 3] (rank 2); expected rank 1");
  tu_exec_fails(e, "BiasAdd", (dev_tensor *[]){bl, b3}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "input 'value' has dtype bool");
  tu_exec_fails(e, "BiasAdd", (dev_tensor *[]){a23, b32d}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "expected the same dtype");

  still_works(e);
  dev_tensor *all[] = {a23, b45,  b32d, i23,  r3, r1, r0,
                       bl,  x234, y345, y255, b3, b2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

/* Components whose shapes make the product valid on one device and not on
 * another are rejected as a whole, naming the shapes. */
static void test_error_on_one_component(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  /* a sharded on axis 1: [2,3] per device -> [2,1] each; b [1,2] mirrored ok.
   * With a [2,4]: components [2,2], [2,1], [2,1]: device 0 differs. */
  double a[8] = {0};
  dev_tensor *ta = tu_sharded(e, PD_FLOAT32, 2, (int64_t[]){2, 4}, 1, a);
  dev_tensor *tb =
      tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){1, 2}, (double[]){1, 2});
  tu_exec_fails(e, "MatMul", (dev_tensor *[]){ta, tb}, 2, NULL, 0,
                PD_INVALID_ARGUMENT,
                "expected a's columns (2) to equal b's rows (1)");
  still_works(e);
  dev_tensor_release(ta);
  dev_tensor_release(tb);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul_hand),
      cmocka_unit_test(test_matmul_random),
      cmocka_unit_test(test_matmul_empty_inner),
      cmocka_unit_test(test_matmul_sharded),
      cmocka_unit_test(test_batch_matmul_broadcast),
      cmocka_unit_test(test_bias_add),
      cmocka_unit_test(test_bias_add_sharded),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_error_on_one_component),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
