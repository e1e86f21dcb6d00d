/* Tests of the fused ops (device/ops/fused.c, contract ops/fused_int.h):
 * _FusedMatMul against MatMul + BiasAdd + the activation's ops, and against
 * a float64 product written here; _FusedElementwise against the unfused ops
 * run one by one on the same inputs (every opcode, the *Grad ones included,
 * broadcasting of up to three inputs, constants, a 21-instruction program),
 * exactly for float32 and float64 (each opcode is its op's expression in the
 * same type) and within the tolerance tables for float16 / bfloat16 (one
 * rounding instead of one per op); the opcode table; and every inference
 * error with its message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_backend.h"
#include "ops/fused_int.h"
#include "testutil.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

static const pd_dtype k_float[] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16,
                                   PD_BFLOAT16};

static dev_engine *g_e;
static const double k_zeros[64];

static int setup(void **state) {
  (void)state;
  g_e = tu_engine(2, 0);
  return 0;
}
static int teardown(void **state) {
  (void)state;
  dev_engine_destroy(g_e);
  return 0;
}

/* Downloads component 0 into a fresh array of n doubles. */
static double *read_all(dev_tensor *t, int64_t *n) {
  const dev_shape *s = dev_tensor_component_shape(t, 0);
  *n = tu_numel(s);
  double *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
  assert_non_null(v);
  tu_read(t, 0, v, *n);
  return v;
}

/* Asserts a and b hold the same values: exactly (rtol 0) or within rtol of
 * the largest |b| (16-bit dtypes). */
static void assert_same(const char *what, dev_tensor *got, dev_tensor *want,
                        double rtol) {
  int64_t ng, nw;
  double *g = read_all(got, &ng), *w = read_all(want, &nw);
  if (ng != nw)
    fail_msg("%s: %lld elements, expected %lld", what, (long long)ng,
             (long long)nw);
  double big = 0;
  for (int64_t i = 0; i < nw; i++)
    if (isfinite(w[i]) && fabs(w[i]) > big) big = fabs(w[i]);
  print_message("%s: %lld elements\n", what, (long long)nw);
  tu_assert_close(g, w, nw, rtol, rtol * big);
  free(g);
  free(w);
}

/* ------------------------------------------------------------------------ */
/* _FusedMatMul                                                              */

static const char *const k_acts[] = {"none", "relu", "relu6", "sigmoid",
                                     "tanh"};

/* The activation as the unfused ops (Relu, Maximum/Minimum, Sigmoid, Tanh). */
static dev_tensor *unfused_act(pd_dtype dt, int act, dev_tensor *x) {
  if (act == 0) {
    dev_tensor_retain(x);
    return x;
  }
  static const char *const ops[] = {NULL, "Relu", NULL, "Sigmoid", "Tanh"};
  if (ops[act]) return tu_exec(g_e, ops[act], &x, 1, NULL, 0, 0);
  double zero = 0, six = 6;
  dev_tensor *z = tu_mirrored(g_e, dt, 0, NULL, &zero);
  dev_tensor *s = tu_mirrored(g_e, dt, 0, NULL, &six);
  dev_tensor *in[2] = {x, z};
  dev_tensor *m = tu_exec(g_e, "Maximum", in, 2, NULL, 0, 0);
  in[0] = m;
  in[1] = s;
  dev_tensor *r = tu_exec(g_e, "Minimum", in, 2, NULL, 0, 0);
  dev_tensor_release(z);
  dev_tensor_release(s);
  dev_tensor_release(m);
  return r;
}

static double ref_act(int act, double x) {
  switch (act) {
    case 1: return x < 0 ? 0 : x;
    case 2: return x < 0 ? 0 : x > 6 ? 6 : x;
    case 3: return 1 / (1 + exp(-x));
    case 4: return tanh(x);
    default: return x;
  }
}

static void test_fused_matmul_against_unfused(void **state) {
  (void)state;
  enum { M = 5, K = 7, N = 3 };
  char what[160];
  for (int d = 0; d < 4; d++)
    for (int t = 0; t < 4; t++)
      for (int act = 0; act < 5; act++) {
        pd_dtype dt = k_float[d];
        bool ta = t & 1, tb = t & 2;
        double a[M * K], b[K * N], bias[N], want[M * N];
        tu_fill_random(a, M * K, -2, 2, 11 + t);
        tu_fill_random(b, K * N, -2, 2, 23 + t);
        tu_fill_random(bias, N, -3, 3, 37 + act);
        dev_tensor *ta_ =
                       tu_mirrored(g_e, dt, 2, ta ? DIMS(K, M) : DIMS(M, K), a),
                   *tb_ =
                       tu_mirrored(g_e, dt, 2, tb ? DIMS(N, K) : DIMS(K, N), b),
                   *tbias = tu_mirrored(g_e, dt, 1, DIMS(N), bias);
        /* The values as stored (rounded to dt), for the float64 reference. */
        tu_read(ta_, 0, a, M * K);
        tu_read(tb_, 0, b, K * N);
        tu_read(tbias, 0, bias, N);
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
              s += (ta ? a[k * M + i] : a[i * K + k]) *
                   (tb ? b[j * K + k] : b[k * N + j]);
            want[i * N + j] = ref_act(act, s + bias[j]);
          }
        dev_attr at[3] = {dev_attr_bool("transpose_a", ta),
                          dev_attr_bool("transpose_b", tb),
                          dev_attr_string("activation", k_acts[act])};
        dev_tensor *in[3] = {ta_, tb_, tbias};
        dev_tensor *fused = tu_exec(g_e, DEV_FUSED_MATMUL_OP, in, 3, at, 3, 0);
        dev_tensor *mm = tu_exec(g_e, "MatMul", in, 2, at, 2, 0);
        dev_tensor *bin[2] = {mm, tbias};
        dev_tensor *ba = tu_exec(g_e, "BiasAdd", bin, 2, NULL, 0, 0);
        dev_tensor *unf = unfused_act(dt, act, ba);
        snprintf(what, sizeof what, "_FusedMatMul %s ta=%d tb=%d %s",
                 pd_dtype_name(dt), ta, tb, k_acts[act]);
        /* float32/float64: the same gemm, the same sum and activation. */
        bool wide = dt == PD_FLOAT32 || dt == PD_FLOAT64;
        assert_same(what, fused, unf, wide ? 0 : 2 * tu_rtol_backends(dt));
        double rt = dt == PD_FLOAT64   ? 1e-12
                    : dt == PD_FLOAT32 ? 1e-5
                                       : 2 * tu_rtol_backends(dt);
        tu_assert_tensor_close(fused, 1, want, M * N, rt, rt * 10);
        dev_tensor *rel[] = {ta_, tb_, tbias, fused, mm, ba, unf};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++)
          dev_tensor_release(rel[i]);
      }
}

/* A product worked by hand: [[1,2],[3,4]] @ [[1,-1],[0,1]] + [-2, -3]. */
static void test_fused_matmul_by_hand(void **state) {
  (void)state;
  dev_tensor *a =
      tu_mirrored(g_e, PD_FLOAT32, 2, DIMS(2, 2), (double[]){1, 2, 3, 4});
  dev_tensor *b =
      tu_mirrored(g_e, PD_FLOAT32, 2, DIMS(2, 2), (double[]){1, -1, 0, 1});
  dev_tensor *bias =
      tu_mirrored(g_e, PD_FLOAT32, 1, DIMS(2), (double[]){-2, -3});
  dev_tensor *in[3] = {a, b, bias};
  /* a @ b = [[1, 1], [3, 1]]; + bias = [[-1, -2], [1, -2]] */
  dev_attr relu = dev_attr_string("activation", "relu");
  dev_tensor *y = tu_exec(g_e, DEV_FUSED_MATMUL_OP, in, 3, &relu, 1, 0);
  tu_assert_components_close(y, ((double[]){0, 0, 1, 0}), 4, 0, 0);
  tu_assert_shape(dev_tensor_shape(y), 2, 2, 2);
  dev_tensor_release(y);
  y = tu_exec(g_e, DEV_FUSED_MATMUL_OP, in, 3, NULL, 0, 0);
  tu_assert_components_close(y, ((double[]){-1, -2, 1, -2}), 4, 0, 0);
  dev_tensor_release(y);
  /* K = 0: the bias alone. */
  dev_tensor *e0 = tu_mirrored(g_e, PD_FLOAT32, 2, DIMS(2, 0), k_zeros);
  dev_tensor *e1 = tu_mirrored(g_e, PD_FLOAT32, 2, DIMS(0, 2), k_zeros);
  dev_tensor *in0[3] = {e0, e1, bias};
  y = tu_exec(g_e, DEV_FUSED_MATMUL_OP, in0, 3, NULL, 0, 0);
  tu_assert_components_close(y, ((double[]){-2, -3, -2, -3}), 4, 0, 0);
  dev_tensor *rel[] = {a, b, bias, y, e0, e1};
  for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++)
    dev_tensor_release(rel[i]);
}

/* ------------------------------------------------------------------------ */
/* _FusedElementwise                                                         */

/* Runs `prog` op by op through the registered ops (dev_ew_opcode_name),
 * constants as scalar tensors of dt: the unfused chain. */
static dev_tensor *run_unfused(pd_dtype dt, const int64_t *prog, int n_ints,
                               dev_tensor *const *in, const double *consts) {
  int n = n_ints / 3;
  dev_tensor *tmp[DEV_EW_MAX_INSTR] = {0};
  for (int j = 0; j < n; j++) {
    const char *op = dev_ew_opcode_name((int)prog[3 * j]);
    assert_non_null(op);
    int ar = dev_ew_arity((int)prog[3 * j]);
    dev_tensor *args[2], *made[2] = {0};
    for (int w = 0; w < ar; w++) {
      int64_t v = prog[3 * j + 1 + w];
      if (v >= DEV_EW_CONST_BASE)
        args[w] = made[w] =
            tu_mirrored(g_e, dt, 0, NULL, &consts[v - DEV_EW_CONST_BASE]);
      else if (v >= DEV_EW_TEMP_BASE)
        args[w] = tmp[v - DEV_EW_TEMP_BASE];
      else
        args[w] = in[v];
    }
    tmp[j] = tu_exec(g_e, op, args, ar, NULL, 0, 0);
    for (int w = 0; w < 2; w++) dev_tensor_release(made[w]);
  }
  for (int j = 0; j < n - 1; j++) dev_tensor_release(tmp[j]);
  return tmp[n - 1];
}

static dev_tensor *run_fused(const int64_t *prog, int n_ints,
                             dev_tensor *const *in, int n_in,
                             const double *consts, int n_consts) {
  dev_attr at[2] = {dev_attr_int_list("program", prog, n_ints),
                    dev_attr_float_list("constants", consts, n_consts)};
  return tu_exec(g_e, DEV_FUSED_ELEMENTWISE_OP, in, n_in, at, 2, 0);
}

/* Fused against unfused on inputs of the given shapes, values in [lo, hi). */
static void check_program(const char *what, pd_dtype dt, const int64_t *prog,
                          int n_ints, int n_in, const int *ranks,
                          const int64_t (*dims)[4], double lo, double hi,
                          const double *consts, int n_consts) {
  dev_tensor *in[DEV_EW_MAX_INPUTS];
  for (int k = 0; k < n_in; k++) {
    int64_t n = tu_count(ranks[k], dims[k]);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    tu_fill_random(v, n, lo, hi, 1000 + (uint64_t)k * 77 + (uint64_t)n_ints);
    in[k] = tu_mirrored(g_e, dt, ranks[k], dims[k], v);
    free(v);
  }
  dev_tensor *f = run_fused(prog, n_ints, in, n_in, consts, n_consts);
  dev_tensor *u = run_unfused(dt, prog, n_ints, in, consts);
  char w[200];
  snprintf(w, sizeof w, "%s %s", what, pd_dtype_name(dt));
  bool wide = dt == PD_FLOAT32 || dt == PD_FLOAT64;
  /* 16-bit: the unfused chain rounds after each op; allow a few of them. */
  assert_same(w, f, u, wide ? 0 : 4 * tu_rtol_backends(dt) * n_ints / 3);
  assert_true(dev_shape_equal(dev_tensor_shape(f), dev_tensor_shape(u)));
  dev_tensor_release(f);
  dev_tensor_release(u);
  for (int k = 0; k < n_in; k++) dev_tensor_release(in[k]);
}

static const int k_all_opcodes[] = {
    DEV_EW_ADD,       DEV_EW_SUB,          DEV_EW_MUL,       DEV_EW_DIV,
    DEV_EW_MAXIMUM,   DEV_EW_MINIMUM,      DEV_EW_POW,       DEV_EW_RELU_GRAD,
    DEV_EW_TANH_GRAD, DEV_EW_SIGMOID_GRAD, DEV_EW_SQRT_GRAD, DEV_EW_RSQRT_GRAD,
    DEV_EW_NEG,       DEV_EW_EXP,          DEV_EW_LOG,       DEV_EW_SQRT,
    DEV_EW_RSQRT,     DEV_EW_SQUARE,       DEV_EW_TANH,      DEV_EW_SIGMOID,
    DEV_EW_RELU,      DEV_EW_ABS,          DEV_EW_IDENTITY};
#define N_OPCODES ((int)(sizeof k_all_opcodes / sizeof k_all_opcodes[0]))

/* Each opcode alone: binary ones with broadcasting (x [3, 130], y [130]),
 * the *Grad ones (no broadcasting in their ops) on equal shapes; values in
 * [-3, 3] (Log, Sqrt, Rsqrt, Pow then give NaN for negatives on both sides,
 * which compare equal), and again in (0.1, 3). */
static void test_each_opcode(void **state) {
  (void)state;
  for (int d = 0; d < 4; d++)
    for (int o = 0; o < N_OPCODES; o++)
      for (int pos = 0; pos < 2; pos++) {
        int code = k_all_opcodes[o];
        int ar = dev_ew_arity(code);
        bool grad = code >= DEV_EW_RELU_GRAD && code <= DEV_EW_RSQRT_GRAD;
        int64_t prog[3] = {code, 0, ar == 2 ? 1 : DEV_EW_NONE};
        int ranks[2] = {2, grad ? 2 : 1};
        int64_t dims[2][4] = {{3, 130}, {3, 130}};
        if (!grad) dims[1][0] = 130, dims[1][1] = 0;
        char what[64];
        snprintf(what, sizeof what, "opcode %s (%s)", dev_ew_opcode_name(code),
                 pos ? "positive" : "signed");
        check_program(what, k_float[d], prog, 3, ar, ranks,
                      (const int64_t(*)[4])dims, pos ? 0.1 : -3, 3, NULL, 0);
      }
}

/* x0 [2, 3, 4] * x1 [3, 1] + 0.5, tanh, - x2 [4], Maximum with -0.25:
 * three inputs broadcast, constants on either side. */
/* The cost estimate counts a FLOP per instruction per output element
 * (3 instructions over a [4,5] output: 60), not one per element. */
static void test_elementwise_estimate(void **state) {
  (void)state;
  int64_t dims[2] = {4, 5};
  double v[20] = {0};
  dev_tensor *x = tu_mirrored(g_e, PD_FLOAT32, 2, dims, v);
  int64_t prog[9] = {DEV_EW_EXP, 0,          DEV_EW_NONE, DEV_EW_MUL, 100,
                     0,          DEV_EW_NEG, 101,         DEV_EW_NONE};
  dev_attr at[1] = {dev_attr_int_list("program", prog, 9)};
  dev_op *op = NULL;
  assert_int_equal(
      dev_op_prepare(g_e, DEV_FUSED_ELEMENTWISE_OP, &x, 1, at, 1, &op, NULL),
      PD_OK);
  dev_op_cost c = DEV_OP_COST_INITIALIZER;
  assert_int_equal(dev_op_estimate(op, &c, NULL), PD_OK);
  assert_true(c.flops == 60.0);
  dev_op_abandon(op, PD_CANCELLED, "test");
  dev_tensor_release(x);
}

static void test_chain_with_broadcast(void **state) {
  (void)state;
  const int64_t prog[] = {
      DEV_EW_MUL,     0,    1,           DEV_EW_ADD, 100, 1000,
      DEV_EW_TANH,    101,  DEV_EW_NONE, DEV_EW_SUB, 102, 2,
      DEV_EW_MAXIMUM, 1001, 103};
  const double consts[] = {0.5, -0.25};
  const int ranks[] = {3, 2, 1};
  const int64_t dims[3][4] = {{2, 3, 4}, {3, 1}, {4}};
  for (int d = 0; d < 4; d++)
    check_program("chain of 5, 3 inputs", k_float[d], prog, 15, 3, ranks, dims,
                  -2, 2, consts, 2);
  /* A scalar and a column against a long row: runs longer than a block. */
  const int64_t p2[] = {
      DEV_EW_MUL,          1,   2,   DEV_EW_SIGMOID, 100, DEV_EW_NONE,
      DEV_EW_SIGMOID_GRAD, 101, 100, DEV_EW_MUL,     102, 0};
  const int r2[] = {0, 2, 1};
  const int64_t d2[3][4] = {{0}, {3, 1}, {1000}};
  for (int d = 0; d < 4; d++)
    check_program("sigmoid and its gradient, scalar input", k_float[d], p2, 12,
                  3, r2, d2, -2, 2, NULL, 0);
}

/* 21 instructions (DEV_EW_MAX_INSTR), every result used later, bounded
 * values: each opcode at least once. */
static void test_21_instructions(void **state) {
  (void)state;
  assert_int_equal(DEV_EW_MAX_INSTR, 21);
  const int64_t prog[] = {
      DEV_EW_SIGMOID,      0,   DEV_EW_NONE, /* 100 in (0, 1) */
      DEV_EW_TANH,         1,   DEV_EW_NONE, /* 101 in (-1, 1) */
      DEV_EW_ADD,          100, 1000,        /* 102 in (1, 2) */
      DEV_EW_SQRT,         102, DEV_EW_NONE, /* 103 */
      DEV_EW_RSQRT,        102, DEV_EW_NONE, /* 104 */
      DEV_EW_LOG,          102, DEV_EW_NONE, /* 105 */
      DEV_EW_EXP,          101, DEV_EW_NONE, /* 106 */
      DEV_EW_MUL,          105, 106,         /* 107 */
      DEV_EW_SUB,          107, 103,         /* 108 */
      DEV_EW_DIV,          108, 102,         /* 109 */
      DEV_EW_POW,          102, 101,         /* 110 */
      DEV_EW_SQUARE,       109, DEV_EW_NONE, /* 111 */
      DEV_EW_NEG,          110, DEV_EW_NONE, /* 112 */
      DEV_EW_ABS,          112, DEV_EW_NONE, /* 113 */
      DEV_EW_MAXIMUM,      111, 101,         /* 114 */
      DEV_EW_MINIMUM,      114, 113,         /* 115 */
      DEV_EW_RELU_GRAD,    115, 108,         /* 116 */
      DEV_EW_TANH_GRAD,    101, 116,         /* 117 */
      DEV_EW_SQRT_GRAD,    103, 117,         /* 118 */
      DEV_EW_RSQRT_GRAD,   104, 118,         /* 119 */
      DEV_EW_SIGMOID_GRAD, 100, 119,         /* 120 */
  };
  const double consts[] = {1.0};
  const int ranks[] = {2, 2};
  const int64_t dims[2][4] = {{17, 19}, {17, 19}};
  for (int d = 0; d < 4; d++)
    check_program("21 instructions", k_float[d], prog, 63, 2, ranks, dims, -3,
                  3, consts, 1);
  /* Relu and Identity, which the chain above lacks. */
  const int64_t p2[] = {DEV_EW_RELU,     0,   DEV_EW_NONE,
                        DEV_EW_IDENTITY, 100, DEV_EW_NONE};
  const int r2[] = {1};
  const int64_t d2[1][4] = {{300}};
  for (int d = 0; d < 4; d++)
    check_program("relu, identity", k_float[d], p2, 6, 1, r2, d2, -3, 3, NULL,
                  0);
}

/* Values worked by hand: (x + 1) * y with x = [1, 2, 3], y scalar 2. */
static void test_elementwise_by_hand(void **state) {
  (void)state;
  dev_tensor *x = tu_mirrored(g_e, PD_FLOAT64, 1, DIMS(3), (double[]){1, 2, 3});
  double two = 2;
  dev_tensor *y = tu_mirrored(g_e, PD_FLOAT64, 0, NULL, &two);
  const int64_t prog[] = {DEV_EW_ADD, 0, 1000, DEV_EW_MUL, 100, 1};
  const double one = 1;
  dev_tensor *in[2] = {x, y};
  dev_tensor *r = run_fused(prog, 6, in, 2, &one, 1);
  tu_assert_components_close(r, ((double[]){4, 6, 8}), 3, 0, 0);
  dev_tensor_release(r);
  /* Empty output. */
  dev_tensor *z = tu_mirrored(g_e, PD_FLOAT64, 2, DIMS(0, 3), k_zeros);
  in[0] = z;
  r = run_fused(prog, 6, in, 2, &one, 1);
  tu_assert_shape(dev_tensor_shape(r), 2, 0, 3);
  dev_tensor_release(r);
  dev_tensor_release(z);
  dev_tensor_release(x);
  dev_tensor_release(y);
}

static void test_opcode_table(void **state) {
  (void)state;
  for (int o = 0; o < N_OPCODES; o++) {
    int code = k_all_opcodes[o];
    const char *name = dev_ew_opcode_name(code);
    assert_non_null(name);
    assert_int_equal(dev_ew_opcode_for(name), code);
    assert_non_null(dev_op_lookup(name));
    assert_int_equal(dev_ew_arity(code), code < DEV_EW_NEG ? 2 : 1);
  }
  assert_int_equal(dev_ew_opcode_for("MatMul"), 0);
  assert_int_equal(dev_ew_opcode_for(NULL), 0);
  assert_int_equal(dev_ew_arity(0), 0);
  assert_int_equal(dev_ew_arity(31), 0);
  assert_null(dev_ew_opcode_name(99));
}

/* ------------------------------------------------------------------------ */
/* Inference errors                                                          */

static void test_matmul_errors(void **state) {
  (void)state;
  dev_tensor *a = tu_mirrored(g_e, PD_FLOAT32, 2, DIMS(2, 3), k_zeros);
  dev_tensor *b = tu_mirrored(g_e, PD_FLOAT32, 2, DIMS(3, 4), k_zeros);
  dev_tensor *bias = tu_mirrored(g_e, PD_FLOAT32, 1, DIMS(4), k_zeros);
  dev_tensor *bias3 = tu_mirrored(g_e, PD_FLOAT32, 1, DIMS(3), k_zeros);
  dev_tensor *b64 = tu_mirrored(g_e, PD_FLOAT64, 2, DIMS(3, 4), k_zeros);
  dev_tensor *ai = tu_mirrored(g_e, PD_INT32, 2, DIMS(2, 3), k_zeros);
  dev_tensor *r3 = tu_mirrored(g_e, PD_FLOAT32, 3, DIMS(1, 2, 3), k_zeros);
  const char *op = DEV_FUSED_MATMUL_OP;
  dev_attr bad = dev_attr_string("activation", "gelu");
  tu_exec_fails(g_e, op, (dev_tensor *[]){a, b, bias}, 3, &bad, 1,
                PD_INVALID_ARGUMENT,
                "_FusedMatMul: attribute 'activation' is \"gelu\"; expected "
                "\"none\", \"relu\", \"relu6\", \"sigmoid\" or \"tanh\"");
  tu_exec_fails(g_e, op, (dev_tensor *[]){ai, b, bias}, 3, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'a' has dtype int32; expected float32, float64, "
                "float16 or bfloat16");
  tu_exec_fails(g_e, op, (dev_tensor *[]){a, b64, bias}, 3, NULL, 0,
                PD_INVALID_ARGUMENT,
                "input 'a' has dtype float32 but input 'b' has dtype float64");
  tu_exec_fails(g_e, op, (dev_tensor *[]){r3, b, bias}, 3, NULL, 0,
                PD_INVALID_ARGUMENT, "input 'a' has shape [1, 2, 3] (rank 3)");
  tu_exec_fails(g_e, op, (dev_tensor *[]){a, b, a}, 3, NULL, 0,
                PD_INVALID_ARGUMENT, "input 'bias' has shape [2, 3] (rank 2)");
  dev_attr tb = dev_attr_bool("transpose_b", true);
  tu_exec_fails(g_e, op, (dev_tensor *[]){a, b, bias}, 3, &tb, 1,
                PD_INVALID_ARGUMENT,
                "inner dimensions differ: a is [2, 3] (transpose_a=false), b "
                "is [3, 4] (transpose_b=true); expected a's columns (3) to "
                "equal b's columns (4)");
  tu_exec_fails(g_e, op, (dev_tensor *[]){a, b, bias3}, 3, NULL, 0,
                PD_INVALID_ARGUMENT,
                "bias has shape [3] but the product has 4 columns; expected "
                "bias of size 4");
  tu_exec_fails(g_e, op, (dev_tensor *[]){a, b}, 2, NULL, 0,
                PD_INVALID_ARGUMENT, "got 2 inputs; expected 3");
  dev_tensor *rel[] = {a, b, bias, bias3, b64, ai, r3};
  for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++)
    dev_tensor_release(rel[i]);
}

static void fe_fails(dev_tensor *const *in, int n_in, const int64_t *prog,
                     int n_ints, int n_consts, const char *needle) {
  static const double c[4] = {1, 2, 3, 4};
  dev_attr at[2] = {dev_attr_int_list("program", prog, n_ints),
                    dev_attr_float_list("constants", c, n_consts)};
  tu_exec_fails(g_e, DEV_FUSED_ELEMENTWISE_OP, in, n_in, at, 2,
                PD_INVALID_ARGUMENT, needle);
}

static void test_elementwise_errors(void **state) {
  (void)state;
  dev_tensor *x = tu_mirrored(g_e, PD_FLOAT32, 2, DIMS(2, 3), k_zeros);
  dev_tensor *y = tu_mirrored(g_e, PD_FLOAT32, 1, DIMS(4), k_zeros);
  dev_tensor *xi = tu_mirrored(g_e, PD_INT64, 2, DIMS(2, 3), k_zeros);
  dev_tensor *x64 = tu_mirrored(g_e, PD_FLOAT64, 2, DIMS(2, 3), k_zeros);
  const int64_t add[] = {DEV_EW_ADD, 0, 1};
  const int64_t neg[] = {DEV_EW_NEG, 0, DEV_EW_NONE};
  fe_fails((dev_tensor *[]){xi}, 1, neg, 3, 0,
           "_FusedElementwise: input 'x[0]' has dtype int64; expected "
           "float32, float64, float16 or bfloat16");
  fe_fails((dev_tensor *[]){x, x64}, 2, add, 3, 0,
           "input 'x[0]' has dtype float32 but input 'x[1]' has dtype "
           "float64; expected the same dtype");
  fe_fails((dev_tensor *[]){x, y}, 2, add, 3, 0,
           "input 'x[1]' has shape [4], which does not broadcast with [2, 3] "
           "(the broadcast of x[0..0])");
  fe_fails((dev_tensor *[]){x}, 1, add, 2, 0,
           "attribute 'program' has 2 ints; expected 3 per instruction");
  fe_fails((dev_tensor *[]){x}, 1, add, 0, 0,
           "attribute 'program' has 0 ints; expected 3 per instruction");
  const int64_t badop[] = {31, 0, DEV_EW_NONE};
  fe_fails((dev_tensor *[]){x}, 1, badop, 3, 0,
           "instruction 0 has opcode 31, which is none of");
  fe_fails((dev_tensor *[]){x}, 1, add, 3, 0,
           "instruction 0 operand b is 1; expected an input 0..0, an earlier "
           "result 100..99 or a constant 1000..999");
  const int64_t fwd[] = {DEV_EW_NEG, 0, DEV_EW_NONE, DEV_EW_ADD, 101, 0};
  fe_fails((dev_tensor *[]){x}, 1, fwd, 6, 0,
           "instruction 1 operand a is 101; expected an input 0..0, an "
           "earlier result 100..100");
  const int64_t konst[] = {DEV_EW_ADD, 0, 1002};
  fe_fails((dev_tensor *[]){x}, 1, konst, 3, 2,
           "instruction 0 operand b is 1002; expected an input 0..0, an "
           "earlier result 100..99 or a constant 1000..1001");
  const int64_t unary_b[] = {DEV_EW_EXP, 0, 0};
  fe_fails((dev_tensor *[]){x}, 1, unary_b, 3, 0,
           "instruction 0 (Exp) is unary but operand b is 0; expected -1");
  dev_tensor *many[17];
  for (int i = 0; i < 17; i++) many[i] = x;
  fe_fails(many, 17, neg, 3, 0,
           "_FusedElementwise: got 17 inputs; expected 1 to 16");
  int64_t big[66];
  for (int i = 0; i < 22; i++) {
    big[3 * i] = DEV_EW_NEG;
    big[3 * i + 1] = i ? 100 + i - 1 : 0;
    big[3 * i + 2] = DEV_EW_NONE;
  }
  fe_fails((dev_tensor *[]){x}, 1, big, 66, 0,
           "attribute 'program' is a list of 66 values; expected 0 to 64");
  dev_attr none[1] = {dev_attr_float_list("constants", NULL, 0)};
  tu_exec_fails(g_e, DEV_FUSED_ELEMENTWISE_OP, (dev_tensor *[]){x}, 1, none, 1,
                PD_INVALID_ARGUMENT,
                "attribute 'program' (int list) is required");
  dev_tensor *rel[] = {x, y, xi, x64};
  for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++)
    dev_tensor_release(rel[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fused_matmul_against_unfused),
      cmocka_unit_test(test_fused_matmul_by_hand),
      cmocka_unit_test(test_each_opcode),
      cmocka_unit_test(test_chain_with_broadcast),
      cmocka_unit_test(test_elementwise_estimate),
      cmocka_unit_test(test_21_instructions),
      cmocka_unit_test(test_elementwise_by_hand),
      cmocka_unit_test(test_opcode_table),
      cmocka_unit_test(test_matmul_errors),
      cmocka_unit_test(test_elementwise_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
