/* Gradients nodes inside functions (device/fn/gradients.c): graphs built
 * with a Gradients node, expanded through the tape's VJPs, evaluated op by
 * op (fn_eval.c) and compared in float64 with central finite differences,
 * closed forms and hand-computed values: an MLP loss, the VJPs added with
 * issue #11 (Abs, Max/Min with ties, Broadcast, AllGather, ReduceScatter on
 * 2 to 4 devices), second derivatives (a Gradients node over a region that
 * holds an expanded one), an upstream gradient, and the errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fn_eval.h"
#include "testutil.h"

#define F64 PD_FLOAT64

/* Appends op `op` and returns its index (asserting success). */
static int add(fn_graph *g, const char *op, const fn_ref *in, int n,
               const dev_attr *a, int na) {
  int idx = -1;
  dev_status st = DEV_STATUS_INIT;
  pd_code rc =
      fn_graph_add_op(g, op, dev_op_lookup(op), in, n, a, na, &idx, &st);
  if (rc != PD_OK) fail_msg("adding %s: %s", op, st.msg);
  return idx;
}
static int add1(fn_graph *g, const char *op, fn_ref a) {
  return add(g, op, &a, 1, NULL, 0);
}
static int add2(fn_graph *g, const char *op, fn_ref a, fn_ref b) {
  fn_ref in[2] = {a, b};
  return add(g, op, in, 2, NULL, 0);
}
static fn_ref N(int i) { return fn_node_ref(i, 0); }

/* Appends Gradients(y; xs[0..k) [; gy]) and returns its index. */
static int grads(fn_graph *g, fn_ref y, const fn_ref *xs, int k,
                 const fn_ref *gy) {
  fn_ref in[16];
  in[0] = y;
  for (int i = 0; i < k; i++) in[1 + i] = xs[i];
  if (gy) in[1 + k] = *gy;
  int idx = -1;
  assert_int_equal(fn_graph_add_gradients(g, "grad", in, 1 + k + (gy ? 1 : 0),
                                          gy != NULL, &idx, NULL),
                   PD_OK);
  return idx;
}

/* Expands g's Gradients nodes, asserting success and a valid graph. */
static void expand(dev_engine *e, fn_graph *g) {
  dev_status st = DEV_STATUS_INIT;
  if (fn_expand_gradients(g, e, &st) != PD_OK)
    fail_msg("expanding: %s", st.msg);
  assert_int_equal(fn_graph_check(g, NULL), PD_OK);
  for (int i = 0; i < g->n_nodes; i++)
    assert_int_equal(g->nodes[i].kind, FN_NODE_OP);
}

/* Evaluates g and reads output o's component c into v (n elements). */
static void eval_out(dev_engine *e, const fn_graph *g, dev_tensor *const *args,
                     int o, int c, double *v, int n) {
  dev_tensor *outs[16] = {0};
  dev_status st = DEV_STATUS_INIT;
  if (fn_eval(e, g, args, outs, &st) != PD_OK) fail_msg("eval: %s", st.msg);
  assert_int_equal(tu_read(outs[o], c, v, n), n);
  for (int i = 0; i < g->n_outputs; i++) dev_tensor_release(outs[i]);
}

/* Relative error of a against b (the reference), by the max norm. */
static double rel_err(const double *a, const double *b, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; i++) {
    num = fmax(num, fabs(a[i] - b[i]));
    den = fmax(den, fabs(b[i]));
  }
  return den > 0 ? num / den : num;
}

static void assert_close(const double *got, const double *want, int n,
                         double tol, const char *what) {
  double r = rel_err(got, want, n);
  if (!(r < tol)) {
    for (int i = 0; i < n; i++)
      print_message("%s[%d]: got %.15g want %.15g\n", what, i, got[i], want[i]);
    fail_msg("%s: relative error %g, expected < %g", what, r, tol);
  }
}

/* Central differences of output 0 (a scalar, or summed) of g with respect
 * to every element of args[a] (mirrored float64 of shape rank/dims). */
static void finite_diff(dev_engine *e, const fn_graph *g, dev_tensor **args,
                        int a, int rank, const int64_t *dims, const double *x0,
                        int n, int y_n, double *fd) {
  const double h = 1e-6;
  double *x = malloc(sizeof *x * (size_t)n),
         *y = malloc(sizeof *y * (size_t)y_n);
  dev_tensor *saved = args[a];
  for (int i = 0; i < n; i++) {
    double f[2];
    for (int s = 0; s < 2; s++) {
      memcpy(x, x0, sizeof *x * (size_t)n);
      x[i] += s ? -h : h;
      args[a] = tu_mirrored(e, F64, rank, dims, x);
      eval_out(e, g, args, 0, 0, y, y_n);
      f[s] = 0;
      for (int k = 0; k < y_n; k++) f[s] += y[k];
      dev_tensor_release(args[a]);
    }
    fd[i] = (f[0] - f[1]) / (2 * h);
  }
  args[a] = saved;
  free(x);
  free(y);
}

/* A reproducible value in [-1, 1). */
static double rnd(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return ((*s >> 8) & 0xffff) / 32768.0 - 1.0;
}

/* ------------------------------------------------------------------------ */

static void mlp_loss_matches_finite_differences(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  enum { B = 4, I = 3, H = 5, C = 3 };
  int64_t dx[2] = {B, I}, dw1[2] = {I, H}, db1[1] = {H}, dw2[2] = {H, C},
          db2[1] = {C}, dl[1] = {B};
  double xv[B * I], w1[I * H], b1[H], w2[H * C], b2[C], lab[B] = {0, 2, 1, 2};
  unsigned s = 7;
  for (int i = 0; i < B * I; i++) xv[i] = rnd(&s);
  for (int i = 0; i < I * H; i++) w1[i] = rnd(&s);
  for (int i = 0; i < H; i++) b1[i] = 0.1 * rnd(&s);
  for (int i = 0; i < H * C; i++) w2[i] = rnd(&s);
  for (int i = 0; i < C; i++) b2[i] = 0.1 * rnd(&s);
  dev_tensor *args[6] = {
      tu_mirrored(e, F64, 2, dx, xv),  tu_mirrored(e, F64, 2, dw1, w1),
      tu_mirrored(e, F64, 1, db1, b1), tu_mirrored(e, F64, 2, dw2, w2),
      tu_mirrored(e, F64, 1, db2, b2), tu_mirrored(e, PD_INT32, 1, dl, lab)};
  fn_graph *g = fn_eval_graph(e, "mlp", args, 6);
  int h1 =
      add2(g, "BiasAdd", N(add2(g, "MatMul", fn_arg_ref(0), fn_arg_ref(1))),
           fn_arg_ref(2));
  int r = add1(g, "Relu", N(h1));
  int lg = add2(g, "BiasAdd", N(add2(g, "MatMul", N(r), fn_arg_ref(3))),
                fn_arg_ref(4));
  int xe = add2(g, "SparseSoftmaxCrossEntropyWithLogits", N(lg), fn_arg_ref(5));
  int loss = add1(g, "Mean", N(xe));
  fn_ref xs[5] = {fn_arg_ref(0), fn_arg_ref(1), fn_arg_ref(2), fn_arg_ref(3),
                  fn_arg_ref(4)};
  int gn = grads(g, N(loss), xs, 5, NULL);
  fn_eval_add_output(g, "loss", N(loss));
  for (int i = 0; i < 5; i++) fn_eval_add_output(g, "g", fn_node_ref(gn, i));
  expand(e, g);

  const double *x0[5] = {xv, w1, b1, w2, b2};
  const int64_t *dims[5] = {dx, dw1, db1, dw2, db2};
  int ranks[5] = {2, 2, 1, 2, 1}, ns[5] = {B * I, I * H, H, H * C, C};
  for (int a = 0; a < 5; a++) {
    double got[32], fd[32];
    eval_out(e, g, args, 1 + a, 1, got, ns[a]); /* device 1 too */
    finite_diff(e, g, args, a, ranks[a], dims[a], x0[a], ns[a], 1, fd);
    assert_close(got, fd, ns[a], 1e-6, "mlp gradient");
  }
  fn_graph_free(g);
  for (int i = 0; i < 6; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

/* Abs: dy * sign(x), with sign(0) = 0; checked by hand and by finite
 * differences away from 0. */
static void abs_gradient(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  int64_t d[1] = {5};
  double xv[5] = {-2, -0.5, 0, 0.3, 1.5}, dy[5] = {1, 2, 3, 4, 5};
  dev_tensor *args[2] = {tu_mirrored(e, F64, 1, d, xv),
                         tu_mirrored(e, F64, 1, d, dy)};
  fn_graph *g = fn_eval_graph(e, "abs", args, 2);
  int a = add1(g, "Abs", fn_arg_ref(0));
  fn_ref x = fn_arg_ref(0), gy = fn_arg_ref(1);
  int gn = grads(g, N(a), &x, 1, &gy);
  fn_eval_add_output(g, "y", N(a));
  fn_eval_add_output(g, "dx", N(gn));
  expand(e, g);
  double got[5], want[5] = {-1, -2, 0, 4, 5};
  eval_out(e, g, args, 1, 0, got, 5);
  assert_close(got, want, 5, 1e-15, "abs");
  fn_graph_free(g);

  /* finite differences of sum(|x|) */
  double xf[4] = {-2, -0.5, 0.3, 1.5}, fd[4], g2[4];
  int64_t d4[1] = {4};
  dev_tensor *a2[1] = {tu_mirrored(e, F64, 1, d4, xf)};
  g = fn_eval_graph(e, "abs2", a2, 1);
  int s = add1(g, "Sum", N(add1(g, "Abs", fn_arg_ref(0))));
  gn = grads(g, N(s), &x, 1, NULL);
  fn_eval_add_output(g, "y", N(s));
  fn_eval_add_output(g, "dx", N(gn));
  expand(e, g);
  eval_out(e, g, a2, 1, 0, g2, 4);
  finite_diff(e, g, a2, 0, 1, d4, xf, 4, 1, fd);
  assert_close(g2, fd, 4, 1e-6, "abs fd");
  fn_graph_free(g);
  dev_tensor_release(a2[0]);
  for (int i = 0; i < 2; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

/* Max and Min reductions: dy spread equally over ties (hand-computed). */
static void max_min_spread_over_ties(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int64_t d[2] = {2, 3}, d2[1] = {2}, d13[2] = {1, 3};
  double xv[6] = {1, 3, 3, 2, 0, 2}, dy2[2] = {1, 4};
  double xm[6] = {1, 3, 2, 1, 0, 2}, dy13[3] = {1, 2, 3};
  dev_tensor *args[4] = {
      tu_mirrored(e, F64, 2, d, xv), tu_mirrored(e, F64, 1, d2, dy2),
      tu_mirrored(e, F64, 2, d, xm), tu_mirrored(e, F64, 2, d13, dy13)};
  fn_graph *g = fn_eval_graph(e, "minmax", args, 4);
  int64_t ax1 = 1, ax0 = 0;
  dev_attr amax = dev_attr_int_list("axis", &ax1, 1);
  dev_attr amin[2] = {dev_attr_int_list("axis", &ax0, 1),
                      dev_attr_bool("keep_dims", true)};
  fn_ref x0 = fn_arg_ref(0), x2 = fn_arg_ref(2);
  int mx = add(g, "Max", &x0, 1, &amax, 1);
  int mn = add(g, "Min", &x2, 1, amin, 2);
  int all = add(g, "Max", &x0, 1, NULL, 0); /* every axis: 3, twice */
  fn_ref gy1 = fn_arg_ref(1), gy3 = fn_arg_ref(3);
  int g1 = grads(g, N(mx), &x0, 1, &gy1);
  int g2 = grads(g, N(mn), &x2, 1, &gy3);
  int g3 = grads(g, N(all), &x0, 1, NULL);
  fn_eval_add_output(g, "a", N(g1));
  fn_eval_add_output(g, "b", N(g2));
  fn_eval_add_output(g, "c", N(g3));
  expand(e, g);
  double got[6];
  double w1[6] = {0, 0.5, 0.5, 2, 0, 2};
  double w2[6] = {0.5, 0, 1.5, 0.5, 2, 1.5};
  double w3[6] = {0, 0.5, 0.5, 0, 0, 0};
  eval_out(e, g, args, 0, 1, got, 6);
  assert_close(got, w1, 6, 1e-15, "max axis 1");
  eval_out(e, g, args, 1, 0, got, 6);
  assert_close(got, w2, 6, 1e-15, "min axis 0 keep_dims");
  eval_out(e, g, args, 2, 0, got, 6);
  assert_close(got, w3, 6, 1e-15, "max of all");
  fn_graph_free(g);
  for (int i = 0; i < 4; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

/* Broadcast(root 1) on 3 devices: the root's input gets the sum over
 * devices of dy, the others zeros. */
static void broadcast_gradient(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  int64_t d[2] = {3, 2};
  double xv[6] = {1, 2, 3, 4, 5, 6}, dy[6] = {1, 10, 100, 1000, 7, 70};
  dev_tensor *args[2] = {tu_sharded(e, F64, 2, d, 0, xv),
                         tu_sharded(e, F64, 2, d, 0, dy)};
  fn_graph *g = fn_eval_graph(e, "bcast", args, 2);
  dev_attr root = dev_attr_int("root", 1);
  fn_ref x = fn_arg_ref(0), gy = fn_arg_ref(1);
  int b = add(g, "Broadcast", &x, 1, &root, 1);
  int gn = grads(g, N(b), &x, 1, &gy);
  fn_eval_add_output(g, "dx", N(gn));
  expand(e, g);
  double got[2], sum[2] = {108, 1080}, zero[2] = {0, 0};
  for (int c = 0; c < 3; c++) {
    eval_out(e, g, args, 0, c, got, 2);
    assert_close(got, c == 1 ? sum : zero, 2, 1e-15, "broadcast");
  }
  fn_graph_free(g);
  for (int i = 0; i < 2; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

/* AllGather along `axis` on n devices: dx_d is device d's part of the sum
 * over devices of dy. x: [2, 2n] split along axis 1 (axis 1) or [2n, 2]
 * along axis 0; dy: one [.., ..] of the gathered shape per device. */
static void all_gather_case(int n, int axis) {
  dev_engine *e = tu_engine(n, 0);
  int64_t dxs[2] = {axis ? 2 : 2 * n, axis ? 2 * n : 2};
  int64_t dys[2] = {n * dxs[0], dxs[1]}; /* per device one gathered block */
  int nx = 4 * n, ny = 4 * n * n;
  double *xv = calloc((size_t)nx, sizeof *xv), *dy = calloc((size_t)ny, 8);
  for (int i = 0; i < nx; i++) xv[i] = i;
  for (int i = 0; i < ny; i++) dy[i] = (i * 37) % 11 + 0.25 * i;
  dev_tensor *args[2] = {tu_sharded(e, F64, 2, dxs, axis, xv),
                         tu_sharded(e, F64, 2, dys, 0, dy)};
  fn_graph *g = fn_eval_graph(e, "gather", args, 2);
  dev_attr ax = dev_attr_int("axis", axis);
  fn_ref x = fn_arg_ref(0), gy = fn_arg_ref(1);
  int ag = add(g, "AllGather", &x, 1, &ax, 1);
  int gn = grads(g, N(ag), &x, 1, &gy);
  fn_eval_add_output(g, "dx", N(gn));
  expand(e, g);
  /* sum over devices of dy: gathered shape [R, Cc] */
  int R = (int)dxs[0], Cc = (int)dxs[1];
  double *sum = calloc((size_t)(R * Cc), sizeof *sum);
  for (int d = 0; d < n; d++)
    for (int i = 0; i < R * Cc; i++) sum[i] += dy[d * R * Cc + i];
  for (int d = 0; d < n; d++) {
    double got[8], want[8];
    eval_out(e, g, args, 0, d, got, 4);
    for (int r = 0; r < 2; r++)
      for (int c = 0; c < 2; c++)
        want[r * 2 + c] =
            axis ? sum[r * Cc + 2 * d + c] : sum[(2 * d + r) * Cc + c];
    assert_close(got, want, 4, 1e-15, "all-gather");
  }
  free(sum);
  free(xv);
  free(dy);
  fn_graph_free(g);
  for (int i = 0; i < 2; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

static void all_gather_gradient(void **state) {
  (void)state;
  all_gather_case(2, 0);
  all_gather_case(4, 1);
}

/* ReduceScatter (sum, mean) on 2 devices: every device's input gets the
 * all-gather of dy (halved for mean). */
static void reduce_scatter_gradient(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int64_t dxs[2] = {8, 2}, dys[2] = {4, 2};
  double xv[16], dy[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int i = 0; i < 16; i++) xv[i] = i;
  dev_tensor *args[2] = {tu_sharded(e, F64, 2, dxs, 0, xv),
                         tu_sharded(e, F64, 2, dys, 0, dy)};
  fn_graph *g = fn_eval_graph(e, "rs", args, 2);
  dev_attr sum = dev_attr_string("reduction", "sum"),
           mean = dev_attr_string("reduction", "mean");
  fn_ref x = fn_arg_ref(0), gy = fn_arg_ref(1);
  int a = add(g, "ReduceScatter", &x, 1, &sum, 1);
  int b = add(g, "ReduceScatter", &x, 1, &mean, 1);
  fn_eval_add_output(g, "ds", N(grads(g, N(a), &x, 1, &gy)));
  fn_eval_add_output(g, "dm", N(grads(g, N(b), &x, 1, &gy)));
  expand(e, g);
  double got[8], half[8];
  for (int i = 0; i < 8; i++) half[i] = dy[i] / 2;
  for (int d = 0; d < 2; d++) {
    eval_out(e, g, args, 0, d, got, 8);
    assert_close(got, dy, 8, 1e-15, "reduce-scatter sum");
    eval_out(e, g, args, 1, d, got, 8);
    assert_close(got, half, 8, 1e-15, "reduce-scatter mean");
  }
  fn_graph_free(g);
  for (int i = 0; i < 2; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* Second derivatives: g1 = Gradients(y, x) (elementwise f'(x) for y =
 * sum f(x)), g2 = Gradients(Sum(g1), x) = f''(x). */

enum { SD_TANH_X, SD_X6, SD_SIGMOID };

static void second_case(int which) {
  dev_engine *e = tu_engine(2, 0);
  enum { M = 5 };
  int64_t d[1] = {M};
  double xv[M] = {-1.3, -0.2, 0.4, 1.1, 2.0};
  dev_tensor *args[1] = {tu_mirrored(e, F64, 1, d, xv)};
  fn_graph *g = fn_eval_graph(e, "second", args, 1);
  fn_ref x = fn_arg_ref(0);
  int y;
  if (which == SD_TANH_X) {
    y = add2(g, "Mul", N(add1(g, "Tanh", x)), x);
  } else if (which == SD_X6) {
    int x3 = add2(g, "Mul", N(add2(g, "Mul", x, x)), x);
    y = add1(g, "Sum", N(add1(g, "Square", N(x3))));
  } else {
    y = add1(g, "Sigmoid", x);
  }
  int g1 = grads(g, N(y), &x, 1, NULL);
  int s1 = add1(g, "Sum", N(g1));
  int g2 = grads(g, N(s1), &x, 1, NULL);
  fn_eval_add_output(g, "g1", N(g1));
  fn_eval_add_output(g, "g2", N(g2));
  expand(e, g);
  double got1[M], got2[M], w1[M], w2[M], fd[M];
  for (int i = 0; i < M; i++) {
    double v = xv[i], t = tanh(v), s = 1 / (1 + exp(-v));
    if (which == SD_TANH_X) {
      w1[i] = t + v * (1 - t * t);
      w2[i] = 2 * (1 - t * t) * (1 - v * t);
    } else if (which == SD_X6) {
      w1[i] = 6 * pow(v, 5);
      w2[i] = 30 * pow(v, 4);
    } else {
      w1[i] = s * (1 - s);
      w2[i] = s * (1 - s) * (1 - 2 * s);
    }
  }
  eval_out(e, g, args, 0, 0, got1, M);
  eval_out(e, g, args, 1, 1, got2, M);
  assert_close(got1, w1, M, 1e-12, "first derivative");
  assert_close(got2, w2, M, 1e-12, "second derivative");
  /* finite differences of the first-derivative graph: d(sum g1)/dx */
  finite_diff(e, g, args, 0, 1, d, xv, M, M, fd);
  assert_close(got2, fd, M, 1e-6, "second derivative by differences");
  fn_graph_free(g);
  dev_tensor_release(args[0]);
  dev_engine_destroy(e);
}

static void second_derivatives(void **state) {
  (void)state;
  second_case(SD_TANH_X);
  second_case(SD_X6);
  second_case(SD_SIGMOID);
}

/* Hessian-vector products through the VJPs' own gradients: for y built
 * from x (arg 0), s = sum(Gradients(y, x) * v) (v: arg 1) and h =
 * Gradients(s, x) = H v, compared with central differences of s. */
enum {
  HV_SOFTMAX,
  HV_LOG_SOFTMAX,
  HV_CENTERED,
  HV_MEAN_AXIS,
  HV_SQRT_RSQRT,
  HV_RELU,
  HV_MATMUL_RESHAPE,
  HV_XENT,
  HV_ABS,
  HV_MAX,
  HV_LOG_DIV,
  HV_BIAS_TRANSPOSE,
  HV_POW,
  HV_COUNT
};

static fn_ref hv_build(fn_graph *g, int which) {
  fn_ref x = fn_arg_ref(0);
  int64_t ax1 = 1, shp[2] = {4, 3};
  dev_attr keep[2] = {dev_attr_int_list("axis", &ax1, 1),
                      dev_attr_bool("keep_dims", true)};
  dev_attr no_keep = dev_attr_int_list("axis", &ax1, 1);
  dev_attr rs = dev_attr_int_list("shape", shp, 2);
  int t;
  switch (which) {
    case HV_SOFTMAX: t = add1(g, "Square", N(add1(g, "Softmax", x))); break;
    case HV_LOG_SOFTMAX:
      t = add1(g, "Square", N(add1(g, "LogSoftmax", x)));
      break;
    case HV_CENTERED: /* BroadcastToLike (keep_dims), SumToLike */
      t = add1(g, "Square",
               N(add2(g, "Sub", x, N(add(g, "Mean", &x, 1, keep, 2)))));
      t = add2(g, "Mul", N(t), x);
      break;
    case HV_MEAN_AXIS: /* BroadcastToLike with axis, mean */
      t = add1(g, "Square", N(add(g, "Mean", &x, 1, &no_keep, 1)));
      t = add2(g, "Mul", N(t), N(add(g, "Sum", &x, 1, &no_keep, 1)));
      break;
    case HV_SQRT_RSQRT: {
      int ex = add1(g, "Exp", x);
      t = add2(g, "Add", N(add1(g, "Sqrt", N(ex))), N(add1(g, "Rsqrt", N(ex))));
      t = add2(g, "Mul", N(t), x);
      break;
    }
    case HV_RELU: {
      int r = add1(g, "Relu", x);
      t = add2(g, "Mul", N(add2(g, "Mul", N(r), N(r))), x);
      break;
    }
    case HV_MATMUL_RESHAPE:
      t = add1(g, "Square",
               N(add2(g, "MatMul", N(add(g, "Reshape", &x, 1, &rs, 1)), x)));
      break;
    case HV_XENT:
      t = add2(g, "SparseSoftmaxCrossEntropyWithLogits", N(add1(g, "Tanh", x)),
               fn_arg_ref(2));
      break;
    case HV_ABS:
      t = add2(g, "Mul", N(add1(g, "Abs", x)), N(add1(g, "Tanh", x)));
      break;
    case HV_LOG_DIV: {
      int ex = add1(g, "Exp", x);
      t = add2(
          g, "Div",
          N(add1(g, "Log", N(add2(g, "Add", N(add1(g, "Square", x)), N(ex))))),
          N(ex));
      break;
    }
    case HV_BIAS_TRANSPOSE: {
      int64_t ax0 = 0, perm[2] = {1, 0};
      dev_attr s0 = dev_attr_int_list("axis", &ax0, 1);
      dev_attr p = dev_attr_int_list("perm", perm, 2);
      int b = add2(g, "BiasAdd", x, N(add(g, "Sum", &x, 1, &s0, 1)));
      fn_ref br = N(b);
      int tr = add(g, "Transpose", &br, 1, &p, 1);
      t = add1(g, "Square", N(add2(g, "MatMul", N(tr), N(add1(g, "Tanh", x)))));
      break;
    }
    case HV_POW: {
      int ex = add1(g, "Exp", x);
      t = add2(g, "Pow", N(ex), N(add1(g, "Sigmoid", x)));
      break;
    }
    default: t = add1(g, "Square", N(add(g, "Max", &x, 1, &no_keep, 1))); break;
  }
  return N(add1(g, "Sum", N(t)));
}

static void hessian_vector_products(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  enum { R = 3, C = 4 };
  int64_t d[2] = {R, C}, dl[1] = {R};
  double xv[R * C], vv[R * C], lab[R] = {1, 3, 0};
  unsigned sd = 11;
  for (int i = 0; i < R * C; i++) xv[i] = rnd(&sd) * 1.5;
  for (int i = 0; i < R * C; i++) vv[i] = rnd(&sd);
  dev_tensor *args[3] = {tu_mirrored(e, F64, 2, d, xv),
                         tu_mirrored(e, F64, 2, d, vv),
                         tu_mirrored(e, PD_INT32, 1, dl, lab)};
  for (int which = 0; which < HV_COUNT; which++) {
    fn_graph *g = fn_eval_graph(e, "hvp", args, 3);
    fn_ref x = fn_arg_ref(0);
    fn_ref y = hv_build(g, which);
    int g1 = grads(g, y, &x, 1, NULL);
    int s = add1(g, "Sum", N(add2(g, "Mul", N(g1), fn_arg_ref(1))));
    int h = grads(g, N(s), &x, 1, NULL);
    fn_eval_add_output(g, "s", N(s));
    fn_eval_add_output(g, "h", N(h));
    expand(e, g);
    double got[R * C], fd[R * C];
    eval_out(e, g, args, 1, 1, got, R * C);
    finite_diff(e, g, args, 0, 2, d, xv, R * C, 1, fd);
    char what[32];
    snprintf(what, sizeof what, "hvp case %d", which);
    assert_close(got, fd, R * C, 1e-6, what);
    fn_graph_free(g);
  }
  for (int i = 0; i < 3; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

/* An upstream gradient; a source y does not depend on gets zeros; a source
 * equal to y gets the upstream gradient. */
static void upstream_gradient_and_zeros(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int64_t d[1] = {3};
  double xv[3] = {1, -2, 3}, zv[3] = {5, 6, 7}, dy[3] = {0.5, 2, -1};
  dev_tensor *args[3] = {tu_mirrored(e, F64, 1, d, xv),
                         tu_mirrored(e, F64, 1, d, zv),
                         tu_mirrored(e, F64, 1, d, dy)};
  fn_graph *g = fn_eval_graph(e, "up", args, 3);
  int y = add2(g, "Mul", fn_arg_ref(0), fn_arg_ref(0));
  fn_ref xs[3] = {fn_arg_ref(0), fn_arg_ref(1), N(y)}, gy = fn_arg_ref(2);
  int gn = grads(g, N(y), xs, 3, &gy);
  for (int i = 0; i < 3; i++) fn_eval_add_output(g, "g", fn_node_ref(gn, i));
  expand(e, g);
  double got[3], w[3], zero[3] = {0, 0, 0};
  for (int i = 0; i < 3; i++) w[i] = 2 * xv[i] * dy[i];
  eval_out(e, g, args, 0, 1, got, 3);
  assert_close(got, w, 3, 1e-15, "upstream");
  eval_out(e, g, args, 1, 0, got, 3);
  assert_close(got, zero, 3, 0.5, "zeros");
  assert_true(got[0] == 0 && got[1] == 0 && got[2] == 0);
  eval_out(e, g, args, 2, 0, got, 3);
  assert_close(got, dy, 3, 1e-15, "source equal to y");
  fn_graph_free(g);
  for (int i = 0; i < 3; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

/* Errors name the function, the Gradients node and the op. */
static void errors_name_node_and_op(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int64_t d[1] = {4}, d2[1] = {6};
  double xv[4] = {1, 2, 3, 4}, lv[6] = {0};
  dev_tensor *args[2] = {tu_mirrored(e, F64, 1, d, xv),
                         tu_mirrored(e, F64, 1, d2, lv)};
  dev_status st = DEV_STATUS_INIT;

  /* SliceGrad has no gradient */
  fn_graph *g = fn_eval_graph(e, "nograd", args, 2);
  int64_t begin = 1;
  dev_attr b = dev_attr_int_list("begin", &begin, 1);
  fn_ref in[2] = {fn_arg_ref(0), fn_arg_ref(1)};
  int sg = add(g, "SliceGrad", in, 2, &b, 1);
  int s = add1(g, "Sum", N(sg));
  fn_ref x = fn_arg_ref(0);
  int gn = grads(g, N(s), &x, 1, NULL);
  fn_eval_add_output(g, "g", N(gn));
  assert_int_equal(fn_expand_gradients(g, e, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "function 'nograd'"));
  assert_non_null(strstr(st.msg, "node 'grad'"));
  assert_non_null(strstr(st.msg, "node 'SliceGrad' (op SliceGrad)"));
  assert_int_equal(fn_graph_check(g, NULL), PD_OK); /* left valid */
  fn_graph_free(g);

  /* y not floating */
  g = fn_eval_graph(e, "intgrad", args, 2);
  int am = add1(g, "ArgMax", fn_arg_ref(0));
  gn = grads(g, N(am), &x, 1, NULL);
  fn_eval_add_output(g, "g", N(gn));
  assert_int_equal(fn_expand_gradients(g, e, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "node 'grad'"));
  assert_non_null(strstr(st.msg, "floating"));
  fn_graph_free(g);

  /* AllReduce max has no gradient */
  g = fn_eval_graph(e, "armax", args, 2);
  dev_attr red = dev_attr_string("reduction", "max");
  int ar = add(g, "AllReduce", &x, 1, &red, 1);
  gn = grads(g, N(add1(g, "Sum", N(ar))), &x, 1, NULL);
  fn_eval_add_output(g, "g", N(gn));
  assert_int_equal(fn_expand_gradients(g, e, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "function 'armax'"));
  assert_non_null(strstr(st.msg, "'max'"));
  fn_graph_free(g);

  for (int i = 0; i < 2; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mlp_loss_matches_finite_differences),
      cmocka_unit_test(abs_gradient),
      cmocka_unit_test(max_min_spread_over_ties),
      cmocka_unit_test(broadcast_gradient),
      cmocka_unit_test(all_gather_gradient),
      cmocka_unit_test(reduce_scatter_gradient),
      cmocka_unit_test(second_derivatives),
      cmocka_unit_test(hessian_vector_products),
      cmocka_unit_test(upstream_gradient_and_zeros),
      cmocka_unit_test(errors_name_node_and_op),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
