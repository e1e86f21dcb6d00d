/* Collectives on meshes of 1, 2, 3, 4 and 8 devices with element counts that
 * do not divide evenly; expected values computed here in float64. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const int kMeshes[] = {1, 2, 3, 4, 8};
#define NMESH 5

/* Per-component inputs: component d, element i = f(d, i). */
static double val(int d, int64_t i) {
  return (double)((d + 1) * 3 - (int)(i % 7)) * 0.5;
}

static dev_tensor *per_component(dev_engine *e, pd_dtype dt, int n,
                                 const dev_shape *shapes,
                                 double (*f)(int, int64_t)) {
  void **bufs = calloc((size_t)n, sizeof *bufs);
  for (int d = 0; d < n; d++) {
    int64_t cnt;
    assert_int_equal(dev_shape_num_elements(&shapes[d], &cnt, NULL), PD_OK);
    bufs[d] = malloc((size_t)(cnt ? cnt : 1) * pd_dtype_size(dt));
    for (int64_t i = 0; i < cnt; i++) dev_store_f64(dt, bufs[d], i, f(d, i));
  }
  dev_tensor *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_from_components(e, dt, shapes, (const void *const *)bufs, &t,
                                 &st) != PD_OK)
    fail_msg("%s", st.msg);
  for (int d = 0; d < n; d++) free(bufs[d]);
  free(bufs);
  return t;
}

/* Values in [0, 2] in steps of 1/4: exact in every float dtype, and products
 * of 8 of them stay inside float16's range. */
static double fval(int d, int64_t i) {
  return 0.25 * (double)((d * 5 + i) % 9);
}
static double ival(int d, int64_t i) { return (double)(d * 10 + (i % 5) - 7); }

static double reduce_ref(double (*f)(int, int64_t), const char *red, int n,
                         int64_t i, bool integer) {
  double acc = f(0, i);
  for (int d = 1; d < n; d++) {
    double v = f(d, i);
    if (!strcmp(red, "sum") || !strcmp(red, "mean"))
      acc += v;
    else if (!strcmp(red, "prod"))
      acc *= v;
    else if (!strcmp(red, "max"))
      acc = v > acc ? v : acc;
    else
      acc = v < acc ? v : acc;
  }
  if (!strcmp(red, "mean")) acc = integer ? trunc(acc / n) : acc / n;
  return acc;
}

static void test_all_reduce(void **state) {
  const char *reds[] = {"sum", "mean", "max", "min", "prod"};
  const pd_dtype dts[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                          PD_BFLOAT16, PD_INT32,   PD_INT64};
  for (int m = 0; m < NMESH; m++) {
    int n = kMeshes[m];
    dev_engine *e = tu_engine(n, 0);
    dev_shape *shapes = calloc((size_t)n, sizeof *shapes);
    for (int d = 0; d < n; d++)
      shapes[d] = (dev_shape){2, {7, 3}}; /* 21 elements */
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
      pd_dtype dt = dts[k];
      bool integer = dev_dtype_is_integer(dt);
      double (*f)(int, int64_t) = integer ? ival : fval;
      dev_tensor *in = per_component(e, dt, n, shapes, f);
      for (int r = 0; r < 5; r++) {
        dev_attr a = dev_attr_string("reduction", reds[r]);
        dev_tensor *out = tu_exec(e, "AllReduce", &in, 1, &a, 1, 0);
        tu_assert_shape(dev_tensor_shape(out), 2, 7, 3);
        double want[21], got[21];
        for (int i = 0; i < 21; i++) {
          want[i] = reduce_ref(f, reds[r], n, i, integer);
          if (integer && !strcmp(reds[r], "prod")) {
            /* integer products wrap around (two's complement), as in C on
             * unsigned values: compute modulo 2^64, then narrow. */
            uint64_t p = (uint64_t)(int64_t)f(0, i);
            for (int d = 1; d < n; d++) p *= (uint64_t)(int64_t)f(d, i);
            want[i] = dt == PD_INT32 ? (double)(int32_t)(uint32_t)p
                                     : (double)(int64_t)p;
          }
        }
        /* results rounded once to the dtype: half 11 bits, bfloat16 8 bits */
        double tol = dt == PD_FLOAT16    ? 1e-3
                     : dt == PD_BFLOAT16 ? 8e-3
                     : dt == PD_FLOAT32  ? 1e-6
                                         : 0;
        for (int d = 0; d < n; d++) {
          assert_int_equal(tu_read(out, d, got, 21), 21);
          tu_assert_close(got, want, 21, tol, 0);
        }
        dev_tensor_release(out);
      }
      dev_tensor_release(in);
    }
    free(shapes);
    dev_engine_destroy(e);
  }
}

static void test_all_reduce_int_mean_truncates(void **state) {
  dev_engine *e = tu_engine(3, 0);
  dev_shape shapes[3] = {{1, {5}}, {1, {5}}, {1, {5}}};
  dev_tensor *in = per_component(e, PD_INT32, 3, shapes, ival);
  dev_attr a = dev_attr_string("reduction", "mean");
  dev_tensor *out = tu_exec(e, "AllReduce", &in, 1, &a, 1, 0);
  /* element i: (-7+i) + (3+i) + (13+i) = 9 + 3i, / 3 = 3 + i */
  double want[5] = {3, 4, 5, 6, 7}, got[5];
  tu_read(out, 2, got, 5);
  tu_assert_close(got, want, 5, 0, 0);
  dev_tensor_release(out);
  /* -7, -6 ... with sum of a negative odd number: [-8,-7,-6] / 3 style */
  dev_tensor_release(in);
  dev_engine_destroy(e);
}

static void test_all_reduce_large_uneven(void **state) {
  /* 1,000,003 float32 elements on 3 and 8 devices: chunks do not divide. */
  const int ns[] = {3, 8};
  for (int k = 0; k < 2; k++) {
    int n = ns[k];
    dev_engine *e = tu_engine(n, 0);
    int64_t count = 1000003;
    dev_shape *shapes = calloc((size_t)n, sizeof *shapes);
    for (int d = 0; d < n; d++) shapes[d] = (dev_shape){1, {count}};
    dev_tensor *in = per_component(e, PD_FLOAT32, n, shapes, val);
    dev_attr a = dev_attr_string("reduction", "sum");
    dev_tensor *out = tu_exec(e, "AllReduce", &in, 1, &a, 1, 0);
    double *got = malloc(sizeof(double) * (size_t)count),
           *want = malloc(sizeof(double) * (size_t)count);
    for (int64_t i = 0; i < count; i++)
      want[i] = reduce_ref(val, "sum", n, i, false);
    for (int d = 0; d < n; d += n - 1) {
      tu_read(out, d, got, count);
      tu_assert_close(got, want, count, 1e-6, 1e-6);
    }
    free(got);
    free(want);
    free(shapes);
    dev_tensor_release(out);
    dev_tensor_release(in);
    dev_engine_destroy(e);
  }
}

static void test_broadcast(void **state) {
  for (int m = 0; m < NMESH; m++) {
    int n = kMeshes[m];
    dev_engine *e = tu_engine(n, 0);
    dev_shape *shapes = calloc((size_t)n, sizeof *shapes);
    for (int d = 0; d < n; d++) shapes[d] = (dev_shape){1, {(int64_t)(d + 2)}};
    dev_tensor *in = per_component(e, PD_FLOAT64, n, shapes, val);
    int root = n - 1;
    dev_attr a = dev_attr_int("root", root);
    dev_tensor *out = tu_exec(e, "Broadcast", &in, 1, &a, 1, 0);
    tu_assert_shape(dev_tensor_shape(out), 1, (int64_t)(root + 2));
    double want[16], got[16];
    for (int i = 0; i < root + 2; i++) want[i] = val(root, i);
    for (int d = 0; d < n; d++) {
      assert_int_equal(tu_read(out, d, got, 16), root + 2);
      tu_assert_close(got, want, root + 2, 0, 0);
    }
    dev_tensor_release(out);
    dev_attr bad = dev_attr_int("root", n);
    tu_exec_fails(e, "Broadcast", &in, 1, &bad, 1, PD_INVALID_ARGUMENT, "root");
    dev_tensor_release(in);
    free(shapes);
    dev_engine_destroy(e);
  }
}

static void test_all_gather(void **state) {
  for (int m = 0; m < NMESH; m++) {
    int n = kMeshes[m];
    dev_engine *e = tu_engine(n, 0);
    dev_shape *shapes = calloc((size_t)n, sizeof *shapes);
    /* component d is [2, d+1, 3]: gather along axis 1 (uneven parts) */
    int64_t total = 0;
    for (int d = 0; d < n; d++) {
      shapes[d] = (dev_shape){3, {2, (int64_t)(d + 1), 3}};
      total += d + 1;
    }
    dev_tensor *in = per_component(e, PD_INT32, n, shapes, ival);
    dev_attr a = dev_attr_int("axis", -2);
    dev_tensor *out = tu_exec(e, "AllGather", &in, 1, &a, 1, 0);
    tu_assert_shape(dev_tensor_shape(out), 3, 2, total, 3);
    int64_t cnt = 2 * total * 3;
    double *want = malloc(sizeof(double) * (size_t)cnt),
           *got = malloc(sizeof(double) * (size_t)cnt);
    for (int64_t x = 0; x < 2; x++) {
      int64_t row = 0;
      for (int d = 0; d < n; d++) {
        for (int64_t r = 0; r < d + 1; r++)
          for (int64_t j = 0; j < 3; j++)
            want[(x * total + row + r) * 3 + j] =
                ival(d, (x * (d + 1) + r) * 3 + j);
        row += d + 1;
      }
    }
    for (int d = 0; d < n; d++) {
      tu_read(out, d, got, cnt);
      tu_assert_close(got, want, cnt, 0, 0);
    }
    free(want);
    free(got);
    dev_tensor_release(out);
    dev_tensor_release(in);
    free(shapes);
    dev_engine_destroy(e);
  }
}

static void test_reduce_scatter(void **state) {
  for (int m = 0; m < NMESH; m++) {
    int n = kMeshes[m];
    dev_engine *e = tu_engine(n, 0);
    dev_shape *shapes = calloc((size_t)n, sizeof *shapes);
    int64_t rows = 11;
    for (int d = 0; d < n; d++) shapes[d] = (dev_shape){2, {rows, 2}};
    dev_tensor *in = per_component(e, PD_FLOAT32, n, shapes, val);
    const char *reds[] = {"sum", "mean"};
    for (int r = 0; r < 2; r++) {
      dev_attr a = dev_attr_string("reduction", reds[r]);
      dev_tensor *out = tu_exec(e, "ReduceScatter", &in, 1, &a, 1, 0);
      int64_t first = 0;
      for (int d = 0; d < n; d++) {
        int64_t mine = rows / n + (d < rows % n ? 1 : 0);
        tu_assert_shape(dev_tensor_component_shape(out, d), 2, mine, 2);
        double want[22], got[22];
        for (int64_t i = 0; i < mine * 2; i++)
          want[i] = reduce_ref(val, reds[r], n, first * 2 + i, false);
        tu_read(out, d, got, 22);
        tu_assert_close(got, want, mine * 2, 1e-6, 1e-6);
        first += mine;
      }
      dev_tensor_release(out);
    }
    dev_tensor_release(in);
    free(shapes);
    dev_engine_destroy(e);
  }
}

static void test_collective_errors(void **state) {
  dev_engine *e = tu_engine(3, 0);
  dev_shape shapes[3] = {{1, {4}}, {1, {5}}, {1, {4}}};
  dev_tensor *in = per_component(e, PD_FLOAT32, 3, shapes, val);
  tu_exec_fails(e, "AllReduce", &in, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "same shape on every device");
  dev_attr bad = dev_attr_string("reduction", "median");
  dev_tensor *ok =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){1, 2});
  tu_exec_fails(e, "AllReduce", &ok, 1, &bad, 1, PD_INVALID_ARGUMENT, "median");
  dev_attr badtype = dev_attr_int("reduction", 1);
  tu_exec_fails(e, "AllReduce", &ok, 1, &badtype, 1, PD_INVALID_ARGUMENT,
                "expected string");
  dev_attr axis = dev_attr_int("axis", 1);
  tu_exec_fails(e, "AllGather", &ok, 1, &axis, 1, PD_INVALID_ARGUMENT, "axis");
  dev_tensor *scalar = tu_mirrored(e, PD_FLOAT32, 0, NULL, (double[]){1});
  tu_exec_fails(e, "ReduceScatter", &scalar, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "rank");
  /* still usable: */
  dev_tensor *out = tu_exec(e, "AllReduce", &ok, 1, NULL, 0, 0);
  double got[2];
  tu_read(out, 1, got, 2);
  tu_assert_close(got, ((double[]){3, 6}), 2, 0, 0);
  dev_tensor_release(out);
  dev_tensor_release(scalar);
  dev_tensor_release(ok);
  dev_tensor_release(in);
  dev_engine_destroy(e);
}

/* A device that runs out of memory inside a collective fails it on every
 * device (naming the device), nobody hangs, and the mesh keeps working. */
static void test_collective_oom_fails_alone(void **state) {
  /* limit 4 KiB per device: a 1,000-float (4,000-byte) input fits, but its
   * all-reduce output does not. */
  dev_engine *e = tu_engine(4, 4096);
  double *v = calloc(1000, sizeof(double));
  dev_tensor *in = tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){1000}, v);
  free(v);
  dev_tensor *out = tu_exec(e, "AllReduce", &in, 1, NULL, 0, 0);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(out, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "cpu:0"));
  assert_non_null(strstr(st.msg, "out of memory"));
  dev_tensor_release(out);
  dev_tensor_release(in);
  dev_tensor *small =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  out = tu_exec(e, "AllReduce", &small, 1, NULL, 0, 0);
  double got[3];
  tu_read(out, 3, got, 3);
  tu_assert_close(got, ((double[]){4, 8, 12}), 3, 0, 0);
  dev_tensor_release(out);
  dev_tensor_release(small);
  dev_engine_destroy(e);
}

/* Many collectives queued back to back, interleaved with other ops: the one
 * global order means none deadlocks. */
static void test_many_collectives_in_order(void **state) {
  dev_engine *e = tu_engine(4, 0);
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT64, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  for (int i = 0; i < 200; i++) {
    dev_tensor *y =
        tu_exec(e, "AllReduce", &x, 1,
                (dev_attr[]){dev_attr_string("reduction", "mean")}, 1, 0);
    dev_tensor_release(x);
    x = y;
  }
  double got[3];
  tu_read(x, 2, got, 3);
  tu_assert_close(got, ((double[]){1, 2, 3}), 3, 1e-12, 0);
  dev_tensor_release(x);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_reduce),
      cmocka_unit_test(test_all_reduce_int_mean_truncates),
      cmocka_unit_test(test_all_reduce_large_uneven),
      cmocka_unit_test(test_broadcast),
      cmocka_unit_test(test_all_gather),
      cmocka_unit_test(test_reduce_scatter),
      cmocka_unit_test(test_collective_errors),
      cmocka_unit_test(test_collective_oom_fails_alone),
      cmocka_unit_test(test_many_collectives_in_order),
  };
  return cmocka_run_group_tests_name("collective", tests, NULL, NULL);
}
