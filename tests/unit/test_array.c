/* Tests of the array ops (device/ops/array.c): Identity, Reshape, Transpose,
 * Concat, Slice, Gather, OneHot. Expected values are written out by hand or
 * computed here by index arithmetic independent of the kernels. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const pd_dtype k_all_dtypes[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                                        PD_BFLOAT16, PD_INT32,   PD_INT64,
                                        PD_UINT8,    PD_BOOL};
#define N_DTYPES ((int)(sizeof k_all_dtypes / sizeof k_all_dtypes[0]))

/* Values exactly representable in every dtype (bool: 0/1). */
static double exact_val(pd_dtype dt, int64_t i) {
  if (dt == PD_BOOL) return (double)(i % 2);
  if (dt == PD_UINT8 || dt == PD_BFLOAT16) return (double)(i % 200);
  return (double)((i * 7) % 1000) - 500; /* |x| <= 2048: exact in float16 */
}

static double *vals_for(pd_dtype dt, int64_t n) {
  double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
  assert_non_null(v);
  for (int64_t i = 0; i < n; i++) v[i] = exact_val(dt, i);
  return v;
}

/* Flat index from a multi-index. */
static int64_t flat(int rank, const int64_t *dims, const int64_t *idx) {
  int64_t f = 0;
  for (int d = 0; d < rank; d++) f = f * dims[d] + idx[d];
  return f;
}

/* Increments a multi-index; false after the last. */
static bool next_index(int rank, const int64_t *dims, int64_t *idx) {
  for (int d = rank - 1; d >= 0; d--) {
    if (++idx[d] < dims[d]) return true;
    idx[d] = 0;
  }
  return false;
}

/* A good op runs after errors: a 2x2 transpose. */
static void engine_still_works(dev_engine *e) {
  int64_t dims[2] = {2, 2};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 2, dims, (double[]){1, 2, 3, 4});
  dev_attr a = dev_attr_int_list("perm", (int64_t[]){1, 0}, 2);
  dev_tensor *y = tu_exec(e, "Transpose", &x, 1, &a, 1, 0);
  tu_assert_components_close(y, ((double[]){1, 3, 2, 4}), 4, 0, 0);
  dev_tensor_release(x);
  dev_tensor_release(y);
}

/* ------------------------------------------------------------------------ */
/* Identity                                                                   */

static void test_identity(void **state) {
  (void)state;
  for (int n = 1; n <= 3; n += 2) {
    dev_engine *e = tu_engine(n, 0);
    for (int k = 0; k < N_DTYPES; k++) {
      pd_dtype dt = k_all_dtypes[k];
      double *v = vals_for(dt, 6);
      dev_tensor *x = tu_mirrored(e, dt, 2, (int64_t[]){2, 3}, v);
      dev_tensor *y = tu_exec(e, "Identity", &x, 1, NULL, 0, 0);
      assert_int_equal(dev_tensor_dtype(y), dt);
      tu_assert_shape(dev_tensor_shape(y), 2, 2, 3);
      tu_assert_components_close(y, v, 6, 0, 0);
      dev_tensor_release(x);
      dev_tensor_release(y);
      free(v);
    }
    /* rank 0 and zero-size */
    dev_tensor *s = tu_mirrored(e, PD_INT64, 0, NULL, (double[]){-5});
    dev_tensor *ys = tu_exec(e, "Identity", &s, 1, NULL, 0, 0);
    tu_assert_components_close(ys, ((double[]){-5}), 1, 0, 0);
    dev_tensor *z = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){0, 4}, NULL);
    dev_tensor *yz = tu_exec(e, "Identity", &z, 1, NULL, 0, 0);
    tu_assert_shape(dev_tensor_shape(yz), 2, 0, 4);
    tu_assert_components_close(yz, NULL, 0, 0, 0);
    dev_tensor_release(s);
    dev_tensor_release(ys);
    dev_tensor_release(z);
    dev_tensor_release(yz);
    dev_engine_destroy(e);
  }
}

/* The input stays usable after its alias is released, and the alias after
 * the input is released. */
static void test_identity_lifetimes(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  dev_tensor *y = tu_exec(e, "Identity", &x, 1, NULL, 0, 0);
  dev_tensor_release(x);
  tu_assert_components_close(y, ((double[]){1, 2, 3}), 3, 0, 0);
  dev_tensor *z = tu_exec(e, "Identity", &y, 1, NULL, 0, 0);
  dev_tensor_release(z);
  tu_assert_components_close(y, ((double[]){1, 2, 3}), 3, 0, 0);
  dev_tensor_release(y);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Reshape                                                                    */

static void test_reshape(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  for (int k = 0; k < N_DTYPES; k++) {
    pd_dtype dt = k_all_dtypes[k];
    double *v = vals_for(dt, 24);
    dev_tensor *x = tu_mirrored(e, dt, 3, (int64_t[]){2, 3, 4}, v);
    dev_attr a = dev_attr_int_list("shape", (int64_t[]){4, -1}, 2);
    dev_tensor *y = tu_exec(e, "Reshape", &x, 1, &a, 1, 0);
    assert_int_equal(dev_tensor_dtype(y), dt);
    tu_assert_shape(dev_tensor_shape(y), 2, 4, 6);
    tu_assert_components_close(y, v, 24, 0, 0); /* row-major order is kept */
    dev_tensor_release(y);
    a = dev_attr_int_list("shape", (int64_t[]){-1}, 1);
    y = tu_exec(e, "Reshape", &x, 1, &a, 1, 0);
    tu_assert_shape(dev_tensor_shape(y), 1, 24);
    dev_tensor_release(y);
    a = dev_attr_int_list("shape", (int64_t[]){3, 2, -1, 2}, 4);
    y = tu_exec(e, "Reshape", &x, 1, &a, 1, 0);
    tu_assert_shape(dev_tensor_shape(y), 4, 3, 2, 2, 2);
    tu_assert_components_close(y, v, 24, 0, 0);
    dev_tensor_release(y);
    dev_tensor_release(x);
    free(v);
  }
  /* scalar <-> [1, 1] */
  dev_tensor *s = tu_mirrored(e, PD_FLOAT64, 0, NULL, (double[]){2.5});
  dev_attr a = dev_attr_int_list("shape", (int64_t[]){1, -1}, 2);
  dev_tensor *y = tu_exec(e, "Reshape", &s, 1, &a, 1, 0);
  tu_assert_shape(dev_tensor_shape(y), 2, 1, 1);
  tu_assert_components_close(y, ((double[]){2.5}), 1, 0, 0);
  dev_attr a0 = dev_attr_int_list("shape", NULL, 0);
  dev_tensor *y0 = tu_exec(e, "Reshape", &y, 1, &a0, 1, 0);
  tu_assert_shape(dev_tensor_shape(y0), 0);
  tu_assert_components_close(y0, ((double[]){2.5}), 1, 0, 0);
  dev_tensor_release(s);
  dev_tensor_release(y);
  dev_tensor_release(y0);
  /* zero-size: [0, 4] -> [0, -1] infers 4 (as TF); -> [2, 0, 3] */
  dev_tensor *z = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){0, 4}, NULL);
  a = dev_attr_int_list("shape", (int64_t[]){0, -1}, 2);
  y = tu_exec(e, "Reshape", &z, 1, &a, 1, 0);
  tu_assert_shape(dev_tensor_shape(y), 2, 0, 4);
  dev_tensor_release(y);
  a = dev_attr_int_list("shape", (int64_t[]){2, 0, 3}, 3);
  y = tu_exec(e, "Reshape", &z, 1, &a, 1, 0);
  tu_assert_shape(dev_tensor_shape(y), 3, 2, 0, 3);
  tu_assert_components_close(y, NULL, 0, 0, 0);
  dev_tensor_release(y);
  dev_tensor_release(z);
  dev_engine_destroy(e);
}

/* Components of a sharded tensor differ in shape: -1 resolves per component. */
static void test_reshape_sharded(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double v[14];
  for (int i = 0; i < 14; i++) v[i] = i;
  /* [7, 2] split along axis 0 on 3 devices: [3, 2], [2, 2], [2, 2]. */
  dev_tensor *x = tu_sharded(e, PD_FLOAT32, 2, (int64_t[]){7, 2}, 0, v);
  dev_attr a = dev_attr_int_list("shape", (int64_t[]){-1}, 1);
  dev_tensor *y = tu_exec(e, "Reshape", &x, 1, &a, 1, 0);
  tu_assert_shape(dev_tensor_component_shape(y, 0), 1, 6);
  tu_assert_shape(dev_tensor_component_shape(y, 1), 1, 4);
  tu_assert_shape(dev_tensor_component_shape(y, 2), 1, 4);
  tu_assert_shape(dev_tensor_shape(y), 1, -1);
  tu_assert_tensor_close(y, 0, ((double[]){0, 1, 2, 3, 4, 5}), 6, 0, 0);
  tu_assert_tensor_close(y, 1, ((double[]){6, 7, 8, 9}), 4, 0, 0);
  tu_assert_tensor_close(y, 2, ((double[]){10, 11, 12, 13}), 4, 0, 0);
  dev_tensor_release(y);
  /* [-1, 2, 1]: [3, 2, 1], [2, 2, 1], [2, 2, 1] */
  a = dev_attr_int_list("shape", (int64_t[]){-1, 2, 1}, 3);
  y = tu_exec(e, "Reshape", &x, 1, &a, 1, 0);
  tu_assert_shape(dev_tensor_component_shape(y, 0), 3, 3, 2, 1);
  tu_assert_shape(dev_tensor_component_shape(y, 2), 3, 2, 2, 1);
  tu_assert_tensor_close(y, 2, ((double[]){10, 11, 12, 13}), 4, 0, 0);
  dev_tensor_release(y);
  /* [3, -1] fits component 0 (6) but not components 1, 2 (4 elements). */
  a = dev_attr_int_list("shape", (int64_t[]){3, -1}, 2);
  tu_exec_fails(e, "Reshape", &x, 1, &a, 1, PD_INVALID_ARGUMENT,
                "multiple of 3");
  dev_tensor_release(x);
  engine_still_works(e);
  dev_engine_destroy(e);
}

static void test_reshape_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  double v[6] = {1, 2, 3, 4, 5, 6};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, 3}, v);
  dev_attr a = dev_attr_int_list("shape", (int64_t[]){4, 2}, 2);
  tu_exec_fails(e, "Reshape", &x, 1, &a, 1, PD_INVALID_ARGUMENT, "[2, 3]");
  tu_exec_fails(e, "Reshape", &x, 1, &a, 1, PD_INVALID_ARGUMENT, "[4, 2]");
  a = dev_attr_int_list("shape", (int64_t[]){-1, -1}, 2);
  tu_exec_fails(e, "Reshape", &x, 1, &a, 1, PD_INVALID_ARGUMENT,
                "at most one -1");
  a = dev_attr_int_list("shape", (int64_t[]){4, -1}, 2);
  tu_exec_fails(e, "Reshape", &x, 1, &a, 1, PD_INVALID_ARGUMENT,
                "multiple of 4");
  a = dev_attr_int_list("shape", (int64_t[]){-2, -3}, 2);
  tu_exec_fails(e, "Reshape", &x, 1, &a, 1, PD_INVALID_ARGUMENT, "-2");
  a = dev_attr_int_list("shape", (int64_t[]){1, 1, 1, 1, 1, 1, 1, 2, 3}, 9);
  tu_exec_fails(e, "Reshape", &x, 1, &a, 1, PD_INVALID_ARGUMENT, "at most 8");
  a = dev_attr_int_list("shape", (int64_t[]){INT64_MAX, INT64_MAX}, 2);
  tu_exec_fails(e, "Reshape", &x, 1, &a, 1, PD_INVALID_ARGUMENT, "Reshape");
  /* missing required attribute */
  tu_exec_fails(e, "Reshape", &x, 1, NULL, 0, PD_INVALID_ARGUMENT, "shape");
  dev_tensor_release(x);
  engine_still_works(e);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Transpose                                                                  */

static void test_transpose_2x3(void **state) {
  (void)state;
  for (int n = 1; n <= 3; n += 2) {
    dev_engine *e = tu_engine(n, 0);
    for (int k = 0; k < N_DTYPES; k++) {
      pd_dtype dt = k_all_dtypes[k];
      double in[6] = {1, 2, 3, 4, 5, 6};
      if (dt == PD_BOOL) memcpy(in, (double[]){1, 0, 0, 1, 1, 0}, sizeof in);
      /* [[1 2 3] [4 5 6]]^T = [[1 4] [2 5] [3 6]] */
      double want[6] = {in[0], in[3], in[1], in[4], in[2], in[5]};
      dev_tensor *x = tu_mirrored(e, dt, 2, (int64_t[]){2, 3}, in);
      dev_attr a = dev_attr_int_list("perm", (int64_t[]){1, 0}, 2);
      dev_tensor *y = tu_exec(e, "Transpose", &x, 1, &a, 1, 0);
      assert_int_equal(dev_tensor_dtype(y), dt);
      tu_assert_shape(dev_tensor_shape(y), 2, 3, 2);
      tu_assert_components_close(y, want, 6, 0, 0);
      dev_tensor_release(y);
      /* empty perm reverses the axes (numpy.transpose) */
      a = dev_attr_int_list("perm", NULL, 0);
      y = tu_exec(e, "Transpose", &x, 1, &a, 1, 0);
      tu_assert_shape(dev_tensor_shape(y), 2, 3, 2);
      tu_assert_components_close(y, want, 6, 0, 0);
      dev_tensor_release(y);
      /* identity perm */
      a = dev_attr_int_list("perm", (int64_t[]){0, 1}, 2);
      y = tu_exec(e, "Transpose", &x, 1, &a, 1, 0);
      tu_assert_components_close(y, in, 6, 0, 0);
      dev_tensor_release(y);
      dev_tensor_release(x);
    }
    dev_engine_destroy(e);
  }
}

/* Runs Transpose of `dims` by `perm` on dtype dt and checks every element by
 * index arithmetic: out[i_0..i_r-1] = in[j] with j[perm[k]] = i_k. */
static void check_transpose(dev_engine *e, pd_dtype dt, int rank,
                            const int64_t *dims, const int64_t *perm) {
  int64_t n = 1;
  for (int d = 0; d < rank; d++) n *= dims[d];
  double *in = vals_for(dt, n),
         *want = malloc((size_t)(n ? n : 1) * sizeof *want);
  assert_non_null(want);
  int64_t od[PD_MAX_RANK], oi[PD_MAX_RANK] = {0}, ii[PD_MAX_RANK];
  for (int d = 0; d < rank; d++) od[d] = dims[perm[d]];
  if (n > 0) {
    int64_t o = 0;
    do {
      for (int d = 0; d < rank; d++) ii[perm[d]] = oi[d];
      want[o++] = in[flat(rank, dims, ii)];
    } while (next_index(rank, od, oi));
    assert_int_equal(o, n);
  }
  dev_tensor *x = tu_mirrored(e, dt, rank, dims, in);
  dev_attr a = dev_attr_int_list("perm", perm, rank);
  dev_tensor *y = tu_exec(e, "Transpose", &x, 1, &a, 1, 0);
  const dev_shape *ys = dev_tensor_shape(y);
  assert_int_equal(ys->rank, rank);
  for (int d = 0; d < rank; d++) assert_int_equal(ys->dims[d], od[d]);
  tu_assert_components_close(y, want, n, 0, 0);
  dev_tensor_release(x);
  dev_tensor_release(y);
  free(in);
  free(want);
}

static void test_transpose_perms(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  static const int64_t perms3[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                       {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (int k = 0; k < N_DTYPES; k++)
    for (int p = 0; p < 6; p++)
      check_transpose(e, k_all_dtypes[k], 3, (int64_t[]){2, 3, 4}, perms3[p]);
  /* every permutation of rank 4, with a size-1 axis among them */
  int64_t perm[4];
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 4; c++) {
        int d = 6 - a - b - c;
        if (a == b || a == c || b == c || d < 0 || d > 3 || d == a || d == b ||
            d == c)
          continue;
        perm[0] = a;
        perm[1] = b;
        perm[2] = c;
        perm[3] = d;
        check_transpose(e, PD_FLOAT32, 4, (int64_t[]){2, 3, 4, 5}, perm);
        check_transpose(e, PD_INT64, 4, (int64_t[]){3, 1, 5, 2}, perm);
        check_transpose(e, PD_FLOAT16, 4, (int64_t[]){2, 3, 1, 4}, perm);
      }
  /* large 2-D, larger than a tile, odd sizes; and 3-D with big inner axes */
  check_transpose(e, PD_FLOAT32, 2, (int64_t[]){67, 45}, (int64_t[]){1, 0});
  check_transpose(e, PD_FLOAT64, 2, (int64_t[]){33, 100}, (int64_t[]){1, 0});
  check_transpose(e, PD_UINT8, 2, (int64_t[]){129, 70}, (int64_t[]){1, 0});
  check_transpose(e, PD_BFLOAT16, 2, (int64_t[]){40, 65}, (int64_t[]){1, 0});
  check_transpose(e, PD_FLOAT32, 3, (int64_t[]){3, 50, 40},
                  (int64_t[]){0, 2, 1});
  check_transpose(e, PD_FLOAT32, 3, (int64_t[]){37, 5, 41},
                  (int64_t[]){2, 1, 0});
  check_transpose(e, PD_INT32, 5, (int64_t[]){2, 3, 2, 3, 2},
                  (int64_t[]){4, 0, 3, 1, 2});
  /* zero-size and rank 0/1 */
  check_transpose(e, PD_FLOAT32, 3, (int64_t[]){2, 0, 3}, (int64_t[]){2, 0, 1});
  check_transpose(e, PD_FLOAT32, 1, (int64_t[]){5}, (int64_t[]){0});
  check_transpose(e, PD_FLOAT32, 0, NULL, NULL);
  dev_engine_destroy(e);
}

static void test_transpose_sharded(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double v[8];
  for (int i = 0; i < 8; i++) v[i] = i;
  /* [4, 2] split on axis 0: [2, 2], [1, 2], [1, 2] */
  dev_tensor *x = tu_sharded(e, PD_FLOAT32, 2, (int64_t[]){4, 2}, 0, v);
  dev_attr a = dev_attr_int_list("perm", (int64_t[]){1, 0}, 2);
  dev_tensor *y = tu_exec(e, "Transpose", &x, 1, &a, 1, 0);
  tu_assert_shape(dev_tensor_component_shape(y, 0), 2, 2, 2);
  tu_assert_shape(dev_tensor_component_shape(y, 1), 2, 2, 1);
  tu_assert_tensor_close(y, 0, ((double[]){0, 2, 1, 3}), 4, 0, 0);
  tu_assert_tensor_close(y, 1, ((double[]){4, 5}), 2, 0, 0);
  tu_assert_tensor_close(y, 2, ((double[]){6, 7}), 2, 0, 0);
  dev_tensor_release(x);
  dev_tensor_release(y);
  dev_engine_destroy(e);
}

static void test_transpose_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){1, 2, 3},
                              (double[]){1, 2, 3, 4, 5, 6});
  dev_attr a = dev_attr_int_list("perm", (int64_t[]){0, 0, 1}, 3);
  tu_exec_fails(e, "Transpose", &x, 1, &a, 1, PD_INVALID_ARGUMENT,
                "not a permutation");
  a = dev_attr_int_list("perm", (int64_t[]){0, 1, 3}, 3);
  tu_exec_fails(e, "Transpose", &x, 1, &a, 1, PD_INVALID_ARGUMENT,
                "not a permutation");
  a = dev_attr_int_list("perm", (int64_t[]){0, -1, 1}, 3);
  tu_exec_fails(e, "Transpose", &x, 1, &a, 1, PD_INVALID_ARGUMENT,
                "not a permutation");
  a = dev_attr_int_list("perm", (int64_t[]){1, 0}, 2);
  tu_exec_fails(e, "Transpose", &x, 1, &a, 1, PD_INVALID_ARGUMENT, "rank 3");
  tu_exec_fails(e, "Transpose", &x, 1, NULL, 0, PD_INVALID_ARGUMENT, "perm");
  dev_attr wrong = dev_attr_int("perm", 1);
  tu_exec_fails(e, "Transpose", &x, 1, &wrong, 1, PD_INVALID_ARGUMENT, "perm");
  dev_tensor_release(x);
  engine_still_works(e);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Concat                                                                     */

static void test_concat_hand(void **state) {
  (void)state;
  for (int n = 1; n <= 3; n += 2) {
    dev_engine *e = tu_engine(n, 0);
    for (int k = 0; k < N_DTYPES; k++) {
      pd_dtype dt = k_all_dtypes[k];
      bool b = dt == PD_BOOL;
      /* a = [[1 2] [3 4]], c = [[5] [6]] (bool: 0/1 patterns) */
      double av[4] = {1, 2, 3, 4}, cv[2] = {5, 6}, dv[2] = {7, 8};
      if (b) {
        memcpy(av, (double[]){1, 0, 0, 1}, sizeof av);
        memcpy(cv, (double[]){1, 1}, sizeof cv);
        memcpy(dv, (double[]){0, 0}, sizeof dv);
      }
      dev_tensor *in[2];
      in[0] = tu_mirrored(e, dt, 2, (int64_t[]){2, 2}, av);
      in[1] = tu_mirrored(e, dt, 2, (int64_t[]){2, 1}, cv);
      /* axis 1 and -1: [[1 2 5] [3 4 6]] */
      double want1[6] = {av[0], av[1], cv[0], av[2], av[3], cv[1]};
      for (int ax = 1; ax >= -1; ax -= 2) {
        dev_attr a = dev_attr_int("axis", ax);
        dev_tensor *y = tu_exec(e, "Concat", in, 2, &a, 1, 0);
        assert_int_equal(dev_tensor_dtype(y), dt);
        tu_assert_shape(dev_tensor_shape(y), 2, 2, 3);
        tu_assert_components_close(y, want1, 6, 0, 0);
        dev_tensor_release(y);
      }
      /* axis 0 and -2 with d = [[7 8]]: [[1 2] [3 4] [7 8]] */
      dev_tensor_release(in[1]);
      in[1] = tu_mirrored(e, dt, 2, (int64_t[]){1, 2}, dv);
      double want0[6] = {av[0], av[1], av[2], av[3], dv[0], dv[1]};
      for (int ax = 0; ax >= -2; ax -= 2) {
        dev_attr a = dev_attr_int("axis", ax);
        dev_tensor *y = tu_exec(e, "Concat", in, 2, &a, 1, 0);
        tu_assert_shape(dev_tensor_shape(y), 2, 3, 2);
        tu_assert_components_close(y, want0, 6, 0, 0);
        dev_tensor_release(y);
      }
      dev_tensor_release(in[0]);
      dev_tensor_release(in[1]);
    }
    dev_engine_destroy(e);
  }
}

/* A list of one, and a list of five along each axis of a rank-3 input,
 * checked against index arithmetic. */
static void test_concat_lists(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double v[24];
  for (int i = 0; i < 24; i++) v[i] = i + 1;
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){2, 3, 4}, v);
  dev_attr a = dev_attr_int("axis", 1);
  dev_tensor *y = tu_exec(e, "Concat", &x, 1, &a, 1, 0);
  tu_assert_shape(dev_tensor_shape(y), 3, 2, 3, 4);
  tu_assert_components_close(y, v, 24, 0, 0);
  dev_tensor_release(y);
  dev_tensor_release(x);

  for (int axis = -3; axis < 3; axis++) {
    int ax = axis < 0 ? axis + 3 : axis;
    dev_tensor *in[5];
    double *vals[5];
    int64_t dims[5][3];
    int64_t total_ax = 0;
    for (int k = 0; k < 5; k++) {
      int64_t d[3] = {2, 3, 2};
      d[ax] = (k % 3); /* 0, 1, 2, 0, 1: includes empty pieces */
      memcpy(dims[k], d, sizeof d);
      total_ax += d[ax];
      int64_t n = d[0] * d[1] * d[2];
      vals[k] = malloc((size_t)(n ? n : 1) * sizeof(double));
      for (int64_t i = 0; i < n; i++) vals[k][i] = 100 * k + (double)i;
      in[k] = tu_mirrored(e, PD_INT64, 3, d, vals[k]);
    }
    int64_t od[3] = {2, 3, 2};
    od[ax] = total_ax;
    int64_t n = od[0] * od[1] * od[2];
    double *want = malloc((size_t)n * sizeof *want);
    int64_t oi[3] = {0, 0, 0}, o = 0;
    do {
      int64_t pos = oi[ax];
      int k = 0;
      while (pos >= dims[k][ax]) pos -= dims[k++][ax];
      int64_t ii[3] = {oi[0], oi[1], oi[2]};
      ii[ax] = pos;
      want[o++] = vals[k][flat(3, dims[k], ii)];
    } while (next_index(3, od, oi));
    a = dev_attr_int("axis", axis);
    y = tu_exec(e, "Concat", in, 5, &a, 1, 0);
    const dev_shape *ys = dev_tensor_shape(y);
    for (int d = 0; d < 3; d++) assert_int_equal(ys->dims[d], od[d]);
    tu_assert_components_close(y, want, n, 0, 0);
    dev_tensor_release(y);
    free(want);
    for (int k = 0; k < 5; k++) {
      dev_tensor_release(in[k]);
      free(vals[k]);
    }
  }
  dev_engine_destroy(e);
}

static void test_concat_sharded(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double v[5] = {0, 1, 2, 3, 4}, w[3] = {10, 11, 12};
  dev_tensor *in[2];
  in[0] = tu_sharded(e, PD_FLOAT64, 1, (int64_t[]){5}, 0, v); /* 2, 2, 1 */
  in[1] = tu_sharded(e, PD_FLOAT64, 1, (int64_t[]){3}, 0, w); /* 1, 1, 1 */
  dev_attr a = dev_attr_int("axis", 0);
  dev_tensor *y = tu_exec(e, "Concat", in, 2, &a, 1, 0);
  tu_assert_tensor_close(y, 0, ((double[]){0, 1, 10}), 3, 0, 0);
  tu_assert_tensor_close(y, 1, ((double[]){2, 3, 11}), 3, 0, 0);
  tu_assert_tensor_close(y, 2, ((double[]){4, 12}), 2, 0, 0);
  tu_assert_shape(dev_tensor_shape(y), 1, -1);
  dev_tensor_release(y);
  dev_tensor_release(in[0]);
  dev_tensor_release(in[1]);
  dev_engine_destroy(e);
}

static void test_concat_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  dev_tensor *a22 =
      tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
  dev_tensor *i22 =
      tu_mirrored(e, PD_INT32, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
  dev_tensor *a3 =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
  dev_tensor *a23 = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){2, 3},
                                (double[]){1, 2, 3, 4, 5, 6});
  dev_tensor *sc = tu_mirrored(e, PD_FLOAT32, 0, NULL, (double[]){1});
  dev_attr ax0 = dev_attr_int("axis", 0);
  dev_tensor *in[2] = {a22, i22};
  tu_exec_fails(e, "Concat", in, 2, &ax0, 1, PD_INVALID_ARGUMENT, "int32");
  in[1] = a3;
  tu_exec_fails(e, "Concat", in, 2, &ax0, 1, PD_INVALID_ARGUMENT, "rank");
  in[1] = a23; /* differs on axis 1, fine on axis 1 only */
  tu_exec_fails(e, "Concat", in, 2, &ax0, 1, PD_INVALID_ARGUMENT, "values[1]");
  dev_attr ax = dev_attr_int("axis", 2);
  tu_exec_fails(e, "Concat", in, 2, &ax, 1, PD_INVALID_ARGUMENT, "axis");
  ax = dev_attr_int("axis", -3);
  tu_exec_fails(e, "Concat", in, 2, &ax, 1, PD_INVALID_ARGUMENT, "axis");
  tu_exec_fails(e, "Concat", &sc, 1, &ax0, 1, PD_INVALID_ARGUMENT, "scalar");
  tu_exec_fails(e, "Concat", in, 0, &ax0, 1, PD_INVALID_ARGUMENT, NULL);
  tu_exec_fails(e, "Concat", in, 2, NULL, 0, PD_INVALID_ARGUMENT, "axis");
  ax = dev_attr_int("axis", 1);
  dev_tensor *y = tu_exec(e, "Concat", in, 2, &ax, 1, 0);
  tu_assert_components_close(y, ((double[]){1, 2, 1, 2, 3, 3, 4, 4, 5, 6}), 10,
                             0, 0);
  dev_tensor_release(y);
  dev_tensor_release(a22);
  dev_tensor_release(i22);
  dev_tensor_release(a3);
  dev_tensor_release(a23);
  dev_tensor_release(sc);
  engine_still_works(e);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Slice                                                                      */

static void test_slice(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  for (int k = 0; k < N_DTYPES; k++) {
    pd_dtype dt = k_all_dtypes[k];
    double *v = vals_for(dt, 12);
    /* x = 3x4 of v; x[1:3, 1:3] */
    dev_tensor *x = tu_mirrored(e, dt, 2, (int64_t[]){3, 4}, v);
    dev_attr a[2] = {dev_attr_int_list("begin", (int64_t[]){1, 1}, 2),
                     dev_attr_int_list("size", (int64_t[]){2, 2}, 2)};
    dev_tensor *y = tu_exec(e, "Slice", &x, 1, a, 2, 0);
    assert_int_equal(dev_tensor_dtype(y), dt);
    tu_assert_shape(dev_tensor_shape(y), 2, 2, 2);
    tu_assert_components_close(y, ((double[]){v[5], v[6], v[9], v[10]}), 4, 0,
                               0);
    dev_tensor_release(y);
    /* size -1: x[1:, 2:] */
    a[0] = dev_attr_int_list("begin", (int64_t[]){1, 2}, 2);
    a[1] = dev_attr_int_list("size", (int64_t[]){-1, -1}, 2);
    y = tu_exec(e, "Slice", &x, 1, a, 2, 0);
    tu_assert_shape(dev_tensor_shape(y), 2, 2, 2);
    tu_assert_components_close(y, ((double[]){v[6], v[7], v[10], v[11]}), 4, 0,
                               0);
    dev_tensor_release(y);
    /* whole rows: x[2:3, :] */
    a[0] = dev_attr_int_list("begin", (int64_t[]){2, 0}, 2);
    a[1] = dev_attr_int_list("size", (int64_t[]){1, -1}, 2);
    y = tu_exec(e, "Slice", &x, 1, a, 2, 0);
    tu_assert_shape(dev_tensor_shape(y), 2, 1, 4);
    tu_assert_components_close(y, ((double[]){v[8], v[9], v[10], v[11]}), 4, 0,
                               0);
    dev_tensor_release(y);
    /* empty: begin at the end, size 0 */
    a[0] = dev_attr_int_list("begin", (int64_t[]){3, 4}, 2);
    a[1] = dev_attr_int_list("size", (int64_t[]){0, -1}, 2);
    y = tu_exec(e, "Slice", &x, 1, a, 2, 0);
    tu_assert_shape(dev_tensor_shape(y), 2, 0, 0);
    tu_assert_components_close(y, NULL, 0, 0, 0);
    dev_tensor_release(y);
    dev_tensor_release(x);
    free(v);
  }
  /* rank 3 against index arithmetic, including a full inner axis */
  double v[60];
  for (int i = 0; i < 60; i++) v[i] = i;
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){3, 4, 5}, v);
  static const int64_t cases[][6] = {{1, 1, 0, 2, 2, 5},
                                     {0, 2, 1, -1, 1, 3},
                                     {2, 0, 4, 1, -1, 1},
                                     {0, 0, 0, -1, -1, -1}};
  for (int c = 0; c < 4; c++) {
    const int64_t *b = cases[c], *s = cases[c] + 3;
    int64_t sz[3], dims[3] = {3, 4, 5};
    for (int d = 0; d < 3; d++) sz[d] = s[d] == -1 ? dims[d] - b[d] : s[d];
    double want[60];
    int64_t oi[3] = {0, 0, 0}, o = 0;
    do {
      int64_t ii[3] = {oi[0] + b[0], oi[1] + b[1], oi[2] + b[2]};
      want[o++] = v[flat(3, dims, ii)];
    } while (next_index(3, sz, oi));
    dev_attr a[2] = {dev_attr_int_list("begin", b, 3),
                     dev_attr_int_list("size", s, 3)};
    dev_tensor *y = tu_exec(e, "Slice", &x, 1, a, 2, 0);
    tu_assert_shape(dev_tensor_shape(y), 3, sz[0], sz[1], sz[2]);
    tu_assert_components_close(y, want, o, 0, 0);
    dev_tensor_release(y);
  }
  dev_tensor_release(x);
  /* rank 0 */
  dev_tensor *s0 = tu_mirrored(e, PD_INT32, 0, NULL, (double[]){9});
  dev_attr a0[2] = {dev_attr_int_list("begin", NULL, 0),
                    dev_attr_int_list("size", NULL, 0)};
  dev_tensor *y0 = tu_exec(e, "Slice", &s0, 1, a0, 2, 0);
  tu_assert_components_close(y0, ((double[]){9}), 1, 0, 0);
  dev_tensor_release(y0);
  dev_tensor_release(s0);
  dev_engine_destroy(e);
}

static void test_slice_sharded_and_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double v[12];
  for (int i = 0; i < 12; i++) v[i] = i;
  /* [5, 2] on axis 0: [2, 2], [2, 2], [1, 2]; take [1:, 1:] of each */
  dev_tensor *x = tu_sharded(e, PD_FLOAT32, 2, (int64_t[]){5, 2}, 0, v);
  dev_attr a[2] = {dev_attr_int_list("begin", (int64_t[]){1, 1}, 2),
                   dev_attr_int_list("size", (int64_t[]){-1, -1}, 2)};
  dev_tensor *y = tu_exec(e, "Slice", &x, 1, a, 2, 0);
  tu_assert_tensor_close(y, 0, ((double[]){3}), 1, 0, 0);
  tu_assert_tensor_close(y, 1, ((double[]){7}), 1, 0, 0);
  tu_assert_shape(dev_tensor_component_shape(y, 2), 2, 0, 1);
  dev_tensor_release(y);
  /* size 2 on axis 0 fits components 0, 1 but not 2 */
  a[0] = dev_attr_int_list("begin", (int64_t[]){0, 0}, 2);
  a[1] = dev_attr_int_list("size", (int64_t[]){2, 1}, 2);
  tu_exec_fails(e, "Slice", &x, 1, a, 2, PD_INVALID_ARGUMENT, "axis 0");
  dev_tensor_release(x);

  dev_tensor *m = tu_mirrored(e, PD_FLOAT32, 2, (int64_t[]){3, 4}, v);
  a[0] = dev_attr_int_list("begin", (int64_t[]){0, 5}, 2);
  a[1] = dev_attr_int_list("size", (int64_t[]){1, -1}, 2);
  tu_exec_fails(e, "Slice", &m, 1, a, 2, PD_INVALID_ARGUMENT, "axis 1");
  a[0] = dev_attr_int_list("begin", (int64_t[]){-1, 0}, 2);
  tu_exec_fails(e, "Slice", &m, 1, a, 2, PD_INVALID_ARGUMENT, "axis 0");
  a[0] = dev_attr_int_list("begin", (int64_t[]){1, 1}, 2);
  a[1] = dev_attr_int_list("size", (int64_t[]){1, 4}, 2);
  tu_exec_fails(e, "Slice", &m, 1, a, 2, PD_INVALID_ARGUMENT, "axis 1");
  a[1] = dev_attr_int_list("size", (int64_t[]){-2, 1}, 2);
  tu_exec_fails(e, "Slice", &m, 1, a, 2, PD_INVALID_ARGUMENT, "axis 0");
  a[1] = dev_attr_int_list("size", (int64_t[]){1}, 1);
  tu_exec_fails(e, "Slice", &m, 1, a, 2, PD_INVALID_ARGUMENT,
                "one entry per axis");
  tu_exec_fails(e, "Slice", &m, 1, a, 1, PD_INVALID_ARGUMENT, "size");
  dev_tensor_release(m);
  engine_still_works(e);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Gather                                                                     */

static void test_gather(void **state) {
  (void)state;
  for (int n = 1; n <= 3; n += 2) {
    dev_engine *e = tu_engine(n, 0);
    /* params = [[1 2 3] [4 5 6] [7 8 9] [10 11 12]] */
    double p[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    for (int k = 0; k < N_DTYPES; k++) {
      pd_dtype dt = k_all_dtypes[k];
      double pv[12];
      for (int i = 0; i < 12; i++)
        pv[i] = dt == PD_BOOL ? (double)(i % 3 == 0) : p[i];
      dev_tensor *params = tu_mirrored(e, dt, 2, (int64_t[]){4, 3}, pv);
      for (int it = 0; it < 2; it++) {
        pd_dtype idt = it ? PD_INT64 : PD_INT32;
        /* axis 0, indices [3, 0, 3] -> rows 3, 0, 3 */
        dev_tensor *in[2] = {params, tu_mirrored(e, idt, 1, (int64_t[]){3},
                                                 (double[]){3, 0, 3})};
        dev_tensor *y = tu_exec(e, "Gather", in, 2, NULL, 0, 0);
        assert_int_equal(dev_tensor_dtype(y), dt);
        tu_assert_shape(dev_tensor_shape(y), 2, 3, 3);
        tu_assert_components_close(
            y,
            ((double[]){pv[9], pv[10], pv[11], pv[0], pv[1], pv[2], pv[9],
                        pv[10], pv[11]}),
            9, 0, 0);
        dev_tensor_release(y);
        /* axis 1 (and -1), indices [2, 1] -> columns 2, 1 */
        dev_tensor_release(in[1]);
        in[1] = tu_mirrored(e, idt, 1, (int64_t[]){2}, (double[]){2, 1});
        for (int ax = 1; ax >= -1; ax -= 2) {
          dev_attr a = dev_attr_int("axis", ax);
          y = tu_exec(e, "Gather", in, 2, &a, 1, 0);
          tu_assert_shape(dev_tensor_shape(y), 2, 4, 2);
          tu_assert_components_close(y,
                                     ((double[]){pv[2], pv[1], pv[5], pv[4],
                                                 pv[8], pv[7], pv[11], pv[10]}),
                                     8, 0, 0);
          dev_tensor_release(y);
        }
        dev_tensor_release(in[1]);
        /* rank-2 indices on axis 0: [[1 2] [0 1]] -> [2, 2, 3] */
        in[1] =
            tu_mirrored(e, idt, 2, (int64_t[]){2, 2}, (double[]){1, 2, 0, 1});
        y = tu_exec(e, "Gather", in, 2, NULL, 0, 0);
        tu_assert_shape(dev_tensor_shape(y), 3, 2, 2, 3);
        tu_assert_components_close(
            y,
            ((double[]){pv[3], pv[4], pv[5], pv[6], pv[7], pv[8], pv[0], pv[1],
                        pv[2], pv[3], pv[4], pv[5]}),
            12, 0, 0);
        dev_tensor_release(y);
        /* rank-2 indices on axis 1 -> [4, 2, 2] */
        dev_attr a1 = dev_attr_int("axis", 1);
        y = tu_exec(e, "Gather", in, 2, &a1, 1, 0);
        tu_assert_shape(dev_tensor_shape(y), 3, 4, 2, 2);
        double want[16];
        const int ix[4] = {1, 2, 0, 1};
        for (int r = 0; r < 4; r++)
          for (int j = 0; j < 4; j++) want[r * 4 + j] = pv[r * 3 + ix[j]];
        tu_assert_components_close(y, want, 16, 0, 0);
        dev_tensor_release(y);
        dev_tensor_release(in[1]);
        /* scalar index drops the axis: params[2] -> [3] */
        in[1] = tu_mirrored(e, idt, 0, NULL, (double[]){2});
        y = tu_exec(e, "Gather", in, 2, NULL, 0, 0);
        tu_assert_shape(dev_tensor_shape(y), 1, 3);
        tu_assert_components_close(y, ((double[]){pv[6], pv[7], pv[8]}), 3, 0,
                                   0);
        dev_tensor_release(y);
        dev_tensor_release(in[1]);
        /* empty indices -> [0, 3] */
        in[1] = tu_mirrored(e, idt, 1, (int64_t[]){0}, NULL);
        y = tu_exec(e, "Gather", in, 2, NULL, 0, 0);
        tu_assert_shape(dev_tensor_shape(y), 2, 0, 3);
        tu_assert_components_close(y, NULL, 0, 0, 0);
        dev_tensor_release(y);
        dev_tensor_release(in[1]);
      }
      dev_tensor_release(params);
    }
    dev_engine_destroy(e);
  }
}

/* Larger random case on rank 3 against index arithmetic; sharded indices. */
static void test_gather_random_and_sharded(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  double pv[5 * 6 * 7];
  tu_fill_random(pv, 210, -10, 10, 3);
  dev_tensor *params = tu_mirrored(e, PD_FLOAT64, 3, (int64_t[]){5, 6, 7}, pv);
  double ir[8];
  tu_fill_random(ir, 8, 0, 6, 4);
  for (int i = 0; i < 8; i++) ir[i] = floor(ir[i]);
  dev_tensor *idx = tu_mirrored(e, PD_INT64, 2, (int64_t[]){2, 4}, ir);
  dev_tensor *in[2] = {params, idx};
  dev_attr a = dev_attr_int("axis", -2);
  dev_tensor *y = tu_exec(e, "Gather", in, 2, &a, 1, 0);
  tu_assert_shape(dev_tensor_shape(y), 4, 5, 2, 4, 7);
  double want[5 * 8 * 7];
  int o = 0;
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 8; j++)
      for (int k = 0; k < 7; k++) want[o++] = pv[(i * 6 + (int)ir[j]) * 7 + k];
  tu_assert_components_close(y, want, o, 0, 0);
  dev_tensor_release(y);
  dev_tensor_release(idx);
  /* indices sharded [5] -> 2, 2, 1 per component */
  idx =
      tu_sharded(e, PD_INT32, 1, (int64_t[]){5}, 0, (double[]){4, 0, 1, 3, 2});
  in[1] = idx;
  y = tu_exec(e, "Gather", in, 2, NULL, 0, 0);
  tu_assert_shape(dev_tensor_component_shape(y, 0), 3, 2, 6, 7);
  tu_assert_shape(dev_tensor_component_shape(y, 2), 3, 1, 6, 7);
  double w1[84];
  memcpy(w1, pv + 1 * 42, 42 * sizeof(double)); /* component 1: rows 1, 3 */
  memcpy(w1 + 42, pv + 3 * 42, 42 * sizeof(double));
  tu_assert_tensor_close(y, 1, w1, 84, 0, 0);
  tu_assert_tensor_close(y, 2, pv + 2 * 42, 42, 0, 0); /* component 2: row 2 */
  dev_tensor_release(y);
  dev_tensor_release(idx);
  dev_tensor_release(params);
  dev_engine_destroy(e);
}

static void test_gather_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  dev_tensor *p =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){5}, (double[]){1, 2, 3, 4, 5});
  dev_tensor *bad =
      tu_mirrored(e, PD_INT32, 1, (int64_t[]){4}, (double[]){0, 1, 2, 7});
  dev_tensor *in[2] = {p, bad};
  /* a data-dependent error: the op is accepted, its output carries it */
  dev_tensor *outs[1] = {NULL};
  int n_out = 1;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_execute(e, "Gather", in, 2, NULL, 0, outs, &n_out, &st),
                   PD_OK);
  assert_int_equal(dev_tensor_wait(outs[0], &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "Gather: indices[3] = 7 is not in [0, 5)"));
  /* an op consuming the failed output fails with the same error */
  dev_tensor *y = NULL;
  n_out = 1;
  dev_status st2 = DEV_STATUS_INIT;
  assert_int_equal(
      dev_execute(e, "Identity", outs, 1, NULL, 0, &y, &n_out, &st2), PD_OK);
  assert_int_equal(dev_tensor_wait(y, &st2), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st2.msg, "indices[3] = 7"));
  dev_tensor_release(y);
  dev_tensor_release(outs[0]);
  dev_tensor_release(bad);
  /* negative index, int64, rank-2 indices: TF's multi-index */
  bad = tu_mirrored(e, PD_INT64, 2, (int64_t[]){2, 2}, (double[]){0, 1, -1, 2});
  in[1] = bad;
  n_out = 1;
  assert_int_equal(dev_execute(e, "Gather", in, 2, NULL, 0, outs, &n_out, &st),
                   PD_OK);
  assert_int_equal(dev_tensor_wait(outs[0], &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "indices[1,0] = -1 is not in [0, 5)"));
  dev_tensor_release(outs[0]);
  dev_tensor_release(bad);
  /* an index equal to the dim is out of range too */
  bad = tu_mirrored(e, PD_INT32, 1, (int64_t[]){2}, (double[]){4, 5});
  in[1] = bad;
  n_out = 1;
  assert_int_equal(dev_execute(e, "Gather", in, 2, NULL, 0, outs, &n_out, &st),
                   PD_OK);
  assert_int_equal(dev_tensor_wait(outs[0], &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "indices[1] = 5 is not in [0, 5)"));
  dev_tensor_release(outs[0]);
  dev_tensor_release(bad);
  /* validation errors */
  dev_tensor *fidx =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){1}, (double[]){0});
  in[1] = fidx;
  tu_exec_fails(e, "Gather", in, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "int32 or int64");
  dev_tensor *good = tu_mirrored(e, PD_INT32, 1, (int64_t[]){1}, (double[]){0});
  in[1] = good;
  dev_attr a = dev_attr_int("axis", 1);
  tu_exec_fails(e, "Gather", in, 2, &a, 1, PD_INVALID_ARGUMENT, "axis");
  dev_tensor *sc = tu_mirrored(e, PD_FLOAT32, 0, NULL, (double[]){1});
  in[0] = sc;
  tu_exec_fails(e, "Gather", in, 2, NULL, 0, PD_INVALID_ARGUMENT, "params");
  tu_exec_fails(e, "Gather", in, 1, NULL, 0, PD_INVALID_ARGUMENT, NULL);
  /* output rank over 8 */
  int64_t d8[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  dev_tensor *p8 = tu_mirrored(e, PD_FLOAT32, 8, d8, (double[]){1});
  dev_tensor *i2 =
      tu_mirrored(e, PD_INT32, 2, (int64_t[]){1, 1}, (double[]){0});
  in[0] = p8;
  in[1] = i2;
  tu_exec_fails(e, "Gather", in, 2, NULL, 0, PD_INVALID_ARGUMENT, "rank 9");
  dev_tensor_release(p8);
  dev_tensor_release(i2);
  dev_tensor_release(sc);
  dev_tensor_release(fidx);
  /* the engine still runs a good Gather */
  in[0] = p;
  in[1] = good;
  y = tu_exec(e, "Gather", in, 2, NULL, 0, 0);
  tu_assert_components_close(y, ((double[]){1}), 1, 0, 0);
  dev_tensor_release(y);
  dev_tensor_release(good);
  dev_tensor_release(p);
  engine_still_works(e);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* OneHot                                                                     */

static void test_onehot(void **state) {
  (void)state;
  for (int n = 1; n <= 3; n += 2) {
    dev_engine *e = tu_engine(n, 0);
    const pd_dtype idts[3] = {PD_INT32, PD_INT64, PD_UINT8};
    for (int it = 0; it < 3; it++) {
      /* indices [0, 2, 5, 1] with depth 3: 5 is out of range -> a row of off */
      double iv[4] = {0, 2, 5, 1};
      dev_tensor *ind = tu_mirrored(e, idts[it], 1, (int64_t[]){4}, iv);
      dev_attr a = dev_attr_int("depth", 3);
      dev_tensor *y = tu_exec(e, "OneHot", &ind, 1, &a, 1, 0);
      assert_int_equal(dev_tensor_dtype(y), PD_FLOAT32);
      tu_assert_shape(dev_tensor_shape(y), 2, 4, 3);
      tu_assert_components_close(
          y, ((double[]){1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}), 12, 0, 0);
      dev_tensor_release(y);
      /* axis 0: [3, 4], transposed */
      dev_attr a2[4] = {dev_attr_int("depth", 3), dev_attr_int("axis", 0),
                        dev_attr_float("on_value", 5),
                        dev_attr_float("off_value", -1)};
      y = tu_exec(e, "OneHot", &ind, 1, a2, 4, 0);
      tu_assert_shape(dev_tensor_shape(y), 2, 3, 4);
      tu_assert_components_close(
          y, ((double[]){5, -1, -1, -1, -1, -1, -1, 5, -1, 5, -1, -1}), 12, 0,
          0);
      dev_tensor_release(y);
      dev_tensor_release(ind);
      /* index == depth and a large index: rows of off */
      ind = tu_mirrored(e, idts[it], 1, (int64_t[]){3}, (double[]){3, 200, 2});
      y = tu_exec(e, "OneHot", &ind, 1, &a, 1, 0);
      tu_assert_components_close(y, ((double[]){0, 0, 0, 0, 0, 0, 0, 0, 1}), 9,
                                 0, 0);
      dev_tensor_release(y);
      dev_tensor_release(ind);
    }
    /* negative index -> off row; rank 2 with axis 1 (middle), int64 dtype */
    dev_tensor *ind =
        tu_mirrored(e, PD_INT64, 2, (int64_t[]){2, 2}, (double[]){1, -1, 0, 1});
    dev_attr a[4] = {dev_attr_int("depth", 2), dev_attr_int("axis", 1),
                     dev_attr_dtype("dtype", PD_INT64),
                     dev_attr_float("off_value", 7)};
    dev_tensor *y = tu_exec(e, "OneHot", &ind, 1, a, 4, 0);
    assert_int_equal(dev_tensor_dtype(y), PD_INT64);
    tu_assert_shape(dev_tensor_shape(y), 3, 2, 2, 2);
    /* out[i, d, j] = ind[i, j] == d ? 1 : 7 */
    tu_assert_components_close(y, ((double[]){7, 7, 1, 7, 1, 7, 7, 1}), 8, 0,
                               0);
    dev_tensor_release(y);
    /* axis -1 explicitly on rank 2 equals the default */
    a[1] = dev_attr_int("axis", -1);
    y = tu_exec(e, "OneHot", &ind, 1, a, 4, 0);
    tu_assert_shape(dev_tensor_shape(y), 3, 2, 2, 2);
    tu_assert_components_close(y, ((double[]){7, 1, 7, 7, 1, 7, 7, 1}), 8, 0,
                               0);
    dev_tensor_release(y);
    /* axis 2 == rank behaves as -1 */
    a[1] = dev_attr_int("axis", 2);
    y = tu_exec(e, "OneHot", &ind, 1, a, 4, 0);
    tu_assert_components_close(y, ((double[]){7, 1, 7, 7, 1, 7, 7, 1}), 8, 0,
                               0);
    dev_tensor_release(y);
    /* every number dtype: on 2.5 / off -1.5 convert as to that dtype */
    const pd_dtype odts[7] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16, PD_BFLOAT16,
                              PD_INT32,   PD_INT64,   PD_UINT8};
    const double on_want[7] = {2.5, 2.5, 2.5, 2.5, 2, 2, 2};
    const double off_want[7] = {-1.5, -1.5, -1.5, -1.5, -1, -1, 0};
    dev_tensor *i1 =
        tu_mirrored(e, PD_INT32, 1, (int64_t[]){2}, (double[]){1, 0});
    for (int k = 0; k < 7; k++) {
      dev_attr b[4] = {
          dev_attr_int("depth", 2), dev_attr_dtype("dtype", odts[k]),
          dev_attr_float("on_value", 2.5), dev_attr_float("off_value", -1.5)};
      y = tu_exec(e, "OneHot", &i1, 1, b, 4, 0);
      assert_int_equal(dev_tensor_dtype(y), odts[k]);
      double on = on_want[k], off = off_want[k];
      tu_assert_components_close(y, ((double[]){off, on, on, off}), 4, 0, 0);
      dev_tensor_release(y);
    }
    /* saturation and NaN into integer dtypes */
    dev_attr c[4] = {
        dev_attr_int("depth", 2), dev_attr_dtype("dtype", PD_UINT8),
        dev_attr_float("on_value", 1e9), dev_attr_float("off_value", NAN)};
    y = tu_exec(e, "OneHot", &i1, 1, c, 4, 0);
    tu_assert_components_close(y, ((double[]){0, 255, 255, 0}), 4, 0, 0);
    dev_tensor_release(y);
    c[1] = dev_attr_dtype("dtype", PD_INT32);
    c[2] = dev_attr_float("on_value", -1e20);
    y = tu_exec(e, "OneHot", &i1, 1, c, 4, 0);
    tu_assert_components_close(
        y, ((double[]){0, -2147483648.0, -2147483648.0, 0}), 4, 0, 0);
    dev_tensor_release(y);
    /* depth 0 and scalar indices */
    dev_attr d0 = dev_attr_int("depth", 0);
    y = tu_exec(e, "OneHot", &i1, 1, &d0, 1, 0);
    tu_assert_shape(dev_tensor_shape(y), 2, 2, 0);
    tu_assert_components_close(y, NULL, 0, 0, 0);
    dev_tensor_release(y);
    dev_tensor *s = tu_mirrored(e, PD_UINT8, 0, NULL, (double[]){2});
    dev_attr d4 = dev_attr_int("depth", 4);
    y = tu_exec(e, "OneHot", &s, 1, &d4, 1, 0);
    tu_assert_shape(dev_tensor_shape(y), 1, 4);
    tu_assert_components_close(y, ((double[]){0, 0, 1, 0}), 4, 0, 0);
    dev_tensor_release(y);
    dev_tensor_release(s);
    dev_tensor_release(i1);
    dev_tensor_release(ind);
    dev_engine_destroy(e);
  }
}

static void test_onehot_sharded_and_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  dev_tensor *ind =
      tu_sharded(e, PD_INT32, 1, (int64_t[]){4}, 0, (double[]){2, 0, 1, 9});
  dev_attr a = dev_attr_int("depth", 3);
  dev_tensor *y = tu_exec(e, "OneHot", &ind, 1, &a, 1, 0);
  tu_assert_tensor_close(y, 0, ((double[]){0, 0, 1, 1, 0, 0}), 6, 0, 0);
  tu_assert_tensor_close(y, 1, ((double[]){0, 1, 0}), 3, 0, 0);
  tu_assert_tensor_close(y, 2, ((double[]){0, 0, 0}), 3, 0, 0);
  dev_tensor_release(y);
  a = dev_attr_int("depth", -1);
  tu_exec_fails(e, "OneHot", &ind, 1, &a, 1, PD_INVALID_ARGUMENT, "depth");
  dev_attr b[2] = {dev_attr_int("depth", 3), dev_attr_int("axis", 2)};
  tu_exec_fails(e, "OneHot", &ind, 1, b, 2, PD_INVALID_ARGUMENT, "axis");
  b[1] = dev_attr_int("axis", -2);
  tu_exec_fails(e, "OneHot", &ind, 1, b, 2, PD_INVALID_ARGUMENT, "axis");
  b[1] = dev_attr_dtype("dtype", PD_BOOL);
  tu_exec_fails(e, "OneHot", &ind, 1, b, 2, PD_INVALID_ARGUMENT, "dtype");
  tu_exec_fails(e, "OneHot", &ind, 1, NULL, 0, PD_INVALID_ARGUMENT, "depth");
  dev_tensor *f = tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){1}, (double[]){0});
  tu_exec_fails(e, "OneHot", &f, 1, b, 1, PD_INVALID_ARGUMENT,
                "int32, int64 or uint8");
  dev_attr big = dev_attr_int("depth", INT64_MAX);
  tu_exec_fails(e, "OneHot", &ind, 1, &big, 1, PD_INVALID_ARGUMENT, "OneHot");
  dev_tensor_release(f);
  dev_tensor_release(ind);
  engine_still_works(e);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_identity),
      cmocka_unit_test(test_identity_lifetimes),
      cmocka_unit_test(test_reshape),
      cmocka_unit_test(test_reshape_sharded),
      cmocka_unit_test(test_reshape_errors),
      cmocka_unit_test(test_transpose_2x3),
      cmocka_unit_test(test_transpose_perms),
      cmocka_unit_test(test_transpose_sharded),
      cmocka_unit_test(test_transpose_errors),
      cmocka_unit_test(test_concat_hand),
      cmocka_unit_test(test_concat_lists),
      cmocka_unit_test(test_concat_sharded),
      cmocka_unit_test(test_concat_errors),
      cmocka_unit_test(test_slice),
      cmocka_unit_test(test_slice_sharded_and_errors),
      cmocka_unit_test(test_gather),
      cmocka_unit_test(test_gather_random_and_sharded),
      cmocka_unit_test(test_gather_errors),
      cmocka_unit_test(test_onehot),
      cmocka_unit_test(test_onehot_sharded_and_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
