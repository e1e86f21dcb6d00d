/* Tests of the random ops (device/ops/random.c): RandomUniform, RandomNormal
 * and DeviceId. Reproducibility is checked across engines and mesh sizes,
 * the generator against Random123's Philox4x32-10 known answer, and the
 * distributions by their sample moments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const pd_dtype k_float_dtypes[] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16,
                                          PD_BFLOAT16};

/* Runs a random op with the given attributes (shape [n]) on `e` and returns
 * the output tensor. */
static dev_tensor *draw(dev_engine *e, const char *op, pd_dtype dt, int64_t n,
                        int64_t seed, int64_t seed2, bool per_device,
                        const dev_attr *extra, int n_extra) {
  dev_attr a[8];
  int k = 0;
  a[k++] = dev_attr_shape("shape", 1, &n);
  a[k++] = dev_attr_dtype("dtype", dt);
  a[k++] = dev_attr_int("seed", seed);
  a[k++] = dev_attr_int("seed2", seed2);
  a[k++] = dev_attr_bool("per_device", per_device);
  for (int i = 0; i < n_extra; i++) a[k++] = extra[i];
  return tu_exec(e, op, NULL, 0, a, k, 0);
}

static double *read_comp(dev_tensor *t, int c, int64_t n) {
  double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  assert_non_null(v);
  assert_int_equal(tu_read(t, c, v, n), n);
  return v;
}

static bool same(const double *a, const double *b, int64_t n) {
  return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

/* Philox4x32-10 of counter 0 under key 0 is, per Random123's
 * tests/kat_vectors, {6627e8d5 e169c58d bc57ac4c 9b00dbd8}. With seed 0 and
 * seed2 0 that is block 0: float32 uniforms are the top 24 bits / 2^24,
 * float64 uniforms the top 53 bits of (w0:w1) and (w2:w3) / 2^53. */
static void test_philox_known_answer(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const uint32_t w[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  dev_tensor *t = draw(e, "RandomUniform", PD_FLOAT32, 4, 0, 0, false, NULL, 0);
  double *v = read_comp(t, 0, 4);
  double want[4];
  for (int i = 0; i < 4; i++) want[i] = (double)(w[i] >> 8) / 16777216.0;
  tu_assert_close(v, want, 4, 0, 0);
  free(v);
  dev_tensor_release(t);
  t = draw(e, "RandomUniform", PD_FLOAT64, 2, 0, 0, false, NULL, 0);
  v = read_comp(t, 0, 2);
  double w64[2] = {
      (double)((((uint64_t)w[0] << 32) | w[1]) >> 11) / 9007199254740992.0,
      (double)((((uint64_t)w[2] << 32) | w[3]) >> 11) / 9007199254740992.0};
  tu_assert_close(v, w64, 2, 0, 0);
  free(v);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

/* Same seed: identical values from two engines and on meshes of 1 and 3;
 * a prefix of a longer draw equals a shorter draw (values depend on the
 * position only). Different seed or seed2: different values. */
static void test_reproducible(void **state) {
  (void)state;
  const char *ops[2] = {"RandomUniform", "RandomNormal"};
  const int64_t n = 1001;
  for (int o = 0; o < 2; o++)
    for (int k = 0; k < 4; k++) {
      pd_dtype dt = k_float_dtypes[k];
      dev_engine *e1 = tu_engine(1, 0), *e1b = tu_engine(1, 0),
                 *e3 = tu_engine(3, 0);
      dev_tensor *a = draw(e1, ops[o], dt, n, 42, 7, false, NULL, 0);
      dev_tensor *b = draw(e1b, ops[o], dt, n, 42, 7, false, NULL, 0);
      dev_tensor *c = draw(e3, ops[o], dt, n, 42, 7, false, NULL, 0);
      dev_tensor *p = draw(e3, ops[o], dt, 5, 42, 7, false, NULL, 0);
      dev_tensor *d = draw(e1, ops[o], dt, n, 43, 7, false, NULL, 0);
      dev_tensor *d2 = draw(e1, ops[o], dt, n, 42, 8, false, NULL, 0);
      double *va = read_comp(a, 0, n), *vb = read_comp(b, 0, n);
      assert_true(same(va, vb, n));
      for (int i = 0; i < 3; i++) {
        double *vc = read_comp(c, i, n), *vp = read_comp(p, i, 5);
        assert_true(same(va, vc, n));
        assert_true(same(va, vp, 5));
        free(vc);
        free(vp);
      }
      double *vd = read_comp(d, 0, n), *vd2 = read_comp(d2, 0, n);
      int64_t diff = 0, diff2 = 0;
      for (int64_t i = 0; i < n; i++) {
        diff += va[i] != vd[i];
        diff2 += va[i] != vd2[i];
      }
      /* bfloat16 has 256 uniform values: some coincide by chance */
      assert_true(diff > n / 2);
      assert_true(diff2 > n / 2);
      free(va);
      free(vb);
      free(vd);
      free(vd2);
      dev_tensor_release(a);
      dev_tensor_release(b);
      dev_tensor_release(c);
      dev_tensor_release(p);
      dev_tensor_release(d);
      dev_tensor_release(d2);
      dev_engine_destroy(e1);
      dev_engine_destroy(e1b);
      dev_engine_destroy(e3);
    }
}

/* per_device false: all components identical; true: they differ, and each
 * device's values are the same on every run and mesh size. */
static void test_per_device(void **state) {
  (void)state;
  const char *ops[2] = {"RandomUniform", "RandomNormal"};
  const int64_t n = 256;
  for (int o = 0; o < 2; o++) {
    dev_engine *e = tu_engine(3, 0), *e2 = tu_engine(3, 0),
               *e4 = tu_engine(4, 0);
    dev_tensor *m = draw(e, ops[o], PD_FLOAT32, n, 5, 0, false, NULL, 0);
    dev_tensor *s = draw(e, ops[o], PD_FLOAT32, n, 5, 0, true, NULL, 0);
    dev_tensor *s2 = draw(e2, ops[o], PD_FLOAT32, n, 5, 0, true, NULL, 0);
    dev_tensor *s4 = draw(e4, ops[o], PD_FLOAT32, n, 5, 0, true, NULL, 0);
    double *m0 = read_comp(m, 0, n);
    double *sv[3];
    for (int c = 0; c < 3; c++) {
      double *mc = read_comp(m, c, n);
      assert_true(same(m0, mc, n));
      free(mc);
      sv[c] = read_comp(s, c, n);
      double *s2c = read_comp(s2, c, n), *s4c = read_comp(s4, c, n);
      assert_true(same(sv[c], s2c, n));
      assert_true(same(sv[c], s4c, n));
      free(s2c);
      free(s4c);
    }
    for (int a = 0; a < 3; a++)
      for (int b = a + 1; b < 3; b++) {
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += sv[a][i] != sv[b][i];
        assert_true(diff > n * 9 / 10);
      }
    for (int c = 0; c < 3; c++) free(sv[c]);
    free(m0);
    dev_tensor_release(m);
    dev_tensor_release(s);
    dev_tensor_release(s2);
    dev_tensor_release(s4);
    dev_engine_destroy(e);
    dev_engine_destroy(e2);
    dev_engine_destroy(e4);
  }
}

/* Sample mean and variance within 5 standard errors of the theory. For a
 * distribution with variance v and fourth central moment m4, the sample
 * mean's SE is sqrt(v/n) and the sample variance's sqrt((m4 - v^2)/n). */
static void check_moments(const double *x, int64_t n, double mean, double var,
                          double m4, const char *what) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += x[i];
  double mu = s / (double)n, ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (x[i] - mu) * (x[i] - mu);
  double v = ss / (double)(n - 1);
  double se_mean = sqrt(var / (double)n),
         se_var = sqrt((m4 - var * var) / (double)n);
  if (fabs(mu - mean) > 5 * se_mean || fabs(v - var) > 5 * se_var)
    fail_msg("%s: mean %g (want %g +- %g), variance %g (want %g +- %g)", what,
             mu, mean, 5 * se_mean, v, var, 5 * se_var);
}

/* Uniform values are drawn on a grid of G = 2^b points over [0, 1) (b = 24
 * for float32, 53 for float64; 11 for float16 and 8 for bfloat16, where the
 * points are exact in the dtype, as TF does). Its moments on [0, 1): mean
 * (G-1)/(2G), variance (G^2-1)/(12 G^2); the grid's m4 is taken as 1/80. */
static double grid_points(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT16: return 2048;
    case PD_BFLOAT16: return 256;
    case PD_FLOAT32: return 16777216;
    default: return 9007199254740992.0;
  }
}

static void test_uniform_distribution(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const int64_t n = 200000;
  for (int k = 0; k < 4; k++) {
    pd_dtype dt = k_float_dtypes[k];
    double g = grid_points(dt);
    double m01 = (g - 1) / (2 * g), v01 = (1 - 1 / (g * g)) / 12;
    /* [0, 1): mean 1/2, variance 1/12, m4 1/80 */
    dev_tensor *t = draw(e, "RandomUniform", dt, n, 1234, 0, true, NULL, 0);
    for (int c = 0; c < 3; c++) {
      double *v = read_comp(t, c, n);
      for (int64_t i = 0; i < n; i++)
        if (!(v[i] >= 0 && v[i] < 1))
          fail_msg("%s: value %.17g outside [0, 1)", pd_dtype_name(dt), v[i]);
      check_moments(v, n, m01, v01, 1.0 / 80, pd_dtype_name(dt));
      free(v);
    }
    dev_tensor_release(t);
    /* [-3, 5): mean -3 + 8*m01, variance 64*v01, m4 8^4/80 */
    dev_attr mm[2] = {dev_attr_float("minval", -3),
                      dev_attr_float("maxval", 5)};
    t = draw(e, "RandomUniform", dt, n, 99, 3, false, mm, 2);
    double *v = read_comp(t, 1, n);
    for (int64_t i = 0; i < n; i++)
      if (!(v[i] >= -3 && v[i] < 5))
        fail_msg("%s: value %.17g outside [-3, 5)", pd_dtype_name(dt), v[i]);
    check_moments(v, n, -3 + 8 * m01, 64 * v01, 4096.0 / 80, pd_dtype_name(dt));
    free(v);
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

/* Bounds that are not representable in the dtype, and intervals narrower
 * than the dtype's spacing: every value still lies in [minval, maxval). */
static void test_uniform_bounds(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  const double cases[][2] = {{0.1, 0.3},    {0.7, 0.70001},
                             {-1e-3, 1e-3}, {1000, 1001},
                             {-0.7, -0.69}, {1.0, 1.0078125 * 1.0001}};
  const int64_t n = 4096;
  for (int k = 0; k < 4; k++)
    for (int c = 0; c < 6; c++) {
      pd_dtype dt = k_float_dtypes[k];
      double lo = cases[c][0], hi = cases[c][1];
      dev_attr mm[2] = {dev_attr_float("minval", lo),
                        dev_attr_float("maxval", hi)};
      dev_attr a[4] = {dev_attr_shape("shape", 1, &n),
                       dev_attr_dtype("dtype", dt), mm[0], mm[1]};
      dev_tensor *outs[1];
      int n_out = 1;
      dev_status st = DEV_STATUS_INIT;
      pd_code code =
          dev_execute(e, "RandomUniform", NULL, 0, a, 4, outs, &n_out, &st);
      if (code != PD_OK) {
        /* only an interval with no value of the dtype may be refused */
        assert_int_equal(code, PD_INVALID_ARGUMENT);
        assert_non_null(strstr(st.msg, "no "));
        assert_true(dt == PD_FLOAT16 || dt == PD_BFLOAT16);
        continue;
      }
      double *v = read_comp(outs[0], 0, n);
      for (int64_t i = 0; i < n; i++)
        if (!(v[i] >= lo && v[i] < hi))
          fail_msg("%s: value %.17g outside [%.17g, %.17g)", pd_dtype_name(dt),
                   v[i], lo, hi);
      free(v);
      dev_tensor_release(outs[0]);
    }
  /* [0.7, 0.70001) holds no bfloat16 (spacing 2^-8 near 0.7): refused */
  int64_t one = 1;
  dev_attr a[4] = {
      dev_attr_shape("shape", 1, &one), dev_attr_dtype("dtype", PD_BFLOAT16),
      dev_attr_float("minval", 0.7), dev_attr_float("maxval", 0.70001)};
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 4, PD_INVALID_ARGUMENT,
                "no bfloat16 value");
  dev_engine_destroy(e);
}

/* The fraction of standard-normal values in each of the bins split at
 * -2, -1, -0.5, 0, 0.5, 1, 2 is within 5 standard errors of Phi's mass. */
static void check_normal_bins(const double *x, int64_t n, const char *what) {
  const double cut[7] = {-2, -1, -0.5, 0, 0.5, 1, 2};
  int64_t count[8] = {0};
  for (int64_t i = 0; i < n; i++) {
    int b = 0;
    while (b < 7 && x[i] >= cut[b]) b++;
    count[b]++;
  }
  for (int b = 0; b < 8; b++) {
    double lo = b == 0 ? 0 : 0.5 * erfc(-cut[b - 1] / sqrt(2.0));
    double hi = b == 7 ? 1 : 0.5 * erfc(-cut[b] / sqrt(2.0));
    double p = hi - lo, f = (double)count[b] / (double)n,
           se = sqrt(p * (1 - p) / (double)n);
    if (fabs(f - p) > 5 * se)
      fail_msg("%s: bin %d holds %.5f of the values, want %.5f +- %.5f", what,
               b, f, p, 5 * se);
  }
}

static void test_normal_distribution(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const int64_t n = 200000;
  for (int k = 0; k < 4; k++) {
    pd_dtype dt = k_float_dtypes[k];
    /* standard normal: mean 0, variance 1, m4 3 */
    dev_tensor *t = draw(e, "RandomNormal", dt, n, 77, 1, true, NULL, 0);
    for (int c = 0; c < 3; c++) {
      double *v = read_comp(t, c, n);
      for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) fail_msg("%s: value %g", pd_dtype_name(dt), v[i]);
      check_moments(v, n, 0, 1, 3, pd_dtype_name(dt));
      check_normal_bins(v, n, pd_dtype_name(dt));
      free(v);
    }
    dev_tensor_release(t);
    /* mean 10, stddev 2: variance 4, m4 3*16 */
    dev_attr ms[2] = {dev_attr_float("mean", 10), dev_attr_float("stddev", 2)};
    t = draw(e, "RandomNormal", dt, n, 78, 0, false, ms, 2);
    double *v = read_comp(t, 2, n);
    check_moments(v, n, 10, 4, 48, pd_dtype_name(dt));
    free(v);
    dev_tensor_release(t);
  }
  /* stddev 0: every value is the mean */
  dev_attr ms[2] = {dev_attr_float("mean", -1.5), dev_attr_float("stddev", 0)};
  dev_tensor *t = draw(e, "RandomNormal", PD_FLOAT64, 9, 1, 0, false, ms, 2);
  double *v = read_comp(t, 0, 9);
  for (int i = 0; i < 9; i++) assert_true(v[i] == -1.5);
  free(v);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

/* Shapes: rank 0, rank 3, zero-size; defaults (float32, seed 0). */
static void test_shapes_and_defaults(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  const char *ops[2] = {"RandomUniform", "RandomNormal"};
  for (int o = 0; o < 2; o++) {
    dev_attr a = dev_attr_shape("shape", 0, NULL);
    dev_tensor *t = tu_exec(e, ops[o], NULL, 0, &a, 1, 0);
    assert_int_equal(dev_tensor_dtype(t), PD_FLOAT32);
    tu_assert_shape(dev_tensor_shape(t), 0);
    double v;
    assert_int_equal(tu_read(t, 2, &v, 1), 1);
    assert_true(isfinite(v));
    dev_tensor_release(t);
    a = dev_attr_shape("shape", 3, (int64_t[]){2, 3, 5});
    t = tu_exec(e, ops[o], NULL, 0, &a, 1, 0);
    tu_assert_shape(dev_tensor_shape(t), 3, 2, 3, 5);
    /* the same values as a flat draw of 30 with the default seeds */
    double *v3 = read_comp(t, 0, 30);
    dev_tensor *f = draw(e, ops[o], PD_FLOAT32, 30, 0, 0, false, NULL, 0);
    double *vf = read_comp(f, 1, 30);
    assert_true(same(v3, vf, 30));
    free(v3);
    free(vf);
    dev_tensor_release(f);
    dev_tensor_release(t);
    a = dev_attr_shape("shape", 2, (int64_t[]){4, 0});
    t = tu_exec(e, ops[o], NULL, 0, &a, 1, 0);
    tu_assert_shape(dev_tensor_shape(t), 2, 4, 0);
    assert_int_equal(tu_read(t, 0, &v, 1), 0);
    dev_tensor_release(t);
  }
  dev_engine_destroy(e);
}

static void test_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  int64_t n = 4;
  dev_attr a[4] = {dev_attr_shape("shape", 1, &n),
                   dev_attr_dtype("dtype", PD_INT32)};
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 2, PD_INVALID_ARGUMENT,
                "dtype");
  tu_exec_fails(e, "RandomNormal", NULL, 0, a, 2, PD_INVALID_ARGUMENT, "dtype");
  tu_exec_fails(e, "RandomUniform", NULL, 0, NULL, 0, PD_INVALID_ARGUMENT,
                "shape");
  a[1] = dev_attr_float("maxval", 0);
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 2, PD_INVALID_ARGUMENT,
                "maxval > minval");
  a[1] = dev_attr_float("maxval", -1);
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 2, PD_INVALID_ARGUMENT,
                "maxval > minval");
  a[1] = dev_attr_float("maxval", INFINITY);
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 2, PD_INVALID_ARGUMENT,
                "maxval");
  a[1] = dev_attr_float("minval", NAN);
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 2, PD_INVALID_ARGUMENT,
                "minval");
  a[1] = dev_attr_float("maxval", 1e6);
  a[2] = dev_attr_dtype("dtype", PD_FLOAT16);
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 3, PD_INVALID_ARGUMENT,
                "float16");
  a[1] = dev_attr_float("minval", -1.7e308);
  a[2] = dev_attr_float("maxval", 1.7e308);
  a[3] = dev_attr_dtype("dtype", PD_FLOAT64);
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 4, PD_INVALID_ARGUMENT,
                "overflow");
  a[3] = dev_attr_dtype("dtype", PD_FLOAT32);
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 4, PD_INVALID_ARGUMENT,
                "float32");
  a[1] = dev_attr_float("stddev", -1);
  tu_exec_fails(e, "RandomNormal", NULL, 0, a, 2, PD_INVALID_ARGUMENT,
                "stddev");
  a[1] = dev_attr_float("mean", NAN);
  tu_exec_fails(e, "RandomNormal", NULL, 0, a, 2, PD_INVALID_ARGUMENT, "mean");
  a[1] = dev_attr_float("stddev", 1);
  tu_exec_fails(e, "RandomUniform", NULL, 0, a, 2, PD_INVALID_ARGUMENT,
                "stddev");
  int64_t huge[2] = {INT64_MAX / 2, 4};
  a[1] = dev_attr_shape("shape", 2, huge);
  tu_exec_fails(e, "RandomNormal", NULL, 0, &a[1], 1, PD_INVALID_ARGUMENT,
                "shape");
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 0, NULL, (double[]){1});
  tu_exec_fails(e, "RandomUniform", &x, 1, a, 1, PD_INVALID_ARGUMENT, NULL);
  tu_exec_fails(e, "DeviceId", &x, 1, NULL, 0, PD_INVALID_ARGUMENT, NULL);
  dev_tensor_release(x);
  /* the engine still draws */
  dev_tensor *t = tu_exec(e, "RandomUniform", NULL, 0, a, 1, 0);
  double v[4];
  assert_int_equal(tu_read(t, 0, v, 4), 4);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

static void test_device_id(void **state) {
  (void)state;
  for (int n = 1; n <= 5; n += 2) {
    dev_engine *e = tu_engine(n, 0);
    dev_tensor *t = tu_exec(e, "DeviceId", NULL, 0, NULL, 0, 0);
    assert_int_equal(dev_tensor_dtype(t), PD_INT32);
    tu_assert_shape(dev_tensor_shape(t), 0);
    assert_int_equal(dev_tensor_num_components(t), n);
    for (int c = 0; c < n; c++) {
      double v = -1;
      assert_int_equal(tu_read(t, c, &v, 1), 1);
      assert_true(v == (double)c);
    }
    dev_tensor_release(t);
    dev_engine_destroy(e);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_philox_known_answer),
      cmocka_unit_test(test_reproducible),
      cmocka_unit_test(test_per_device),
      cmocka_unit_test(test_uniform_distribution),
      cmocka_unit_test(test_uniform_bounds),
      cmocka_unit_test(test_normal_distribution),
      cmocka_unit_test(test_shapes_and_defaults),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_device_id),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
