/* One vector-Jacobian product per differentiable op, for the tape's backward
 * walk (gradient.c), following TensorFlow's gradient functions
 * (tensorflow/python/ops/math_grad.py, nn_grad.py, array_grad.py). A VJP is
 * straight-line code over engine ops (dev__vjp_run(): errors are sticky, checked once
 * by the caller); gradient ops that need a shape which may differ between
 * components take the forward tensor as a `like` input (device/ops/grad_ops.c).
 * More VJPs (Abs, Max/Min, the collectives, the gradient ops' own) are in
 * vjp_more.c; the table below names them all. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tape_int.h"

/* t summed down to like's shapes where broadcasting stretched like. */
static dev_tensor *unbroadcast(vjp_ctx *c, dev_tensor *t, dev_tensor *like) {
  if (!t) return NULL;
  return dev__same_shapes(t, like)
             ? t
             : dev__vjp_run2(c, "SumToLike", t, like, NULL, 0);
}

#define X(j) (c->r->in[j])
#define Y (c->r->out[0])
#define DY (c->dy[0])

/* d(x+y) = dy, dy */
static void vjp_add(vjp_ctx *c) {
  if (c->need[0]) dev__vjp_set_dx(c, 0, unbroadcast(c, DY, X(0)));
  if (c->need[1]) dev__vjp_set_dx(c, 1, unbroadcast(c, DY, X(1)));
}

/* d(x-y) = dy, -dy */
static void vjp_sub(vjp_ctx *c) {
  if (c->need[0]) dev__vjp_set_dx(c, 0, unbroadcast(c, DY, X(0)));
  if (c->need[1])
    dev__vjp_set_dx(c, 1,
                    unbroadcast(c, dev__vjp_run1(c, "Neg", DY, NULL, 0), X(1)));
}

/* d(x*y) = dy*y, x*dy */
static void vjp_mul(vjp_ctx *c) {
  if (c->need[0])
    dev__vjp_set_dx(
        c, 0, unbroadcast(c, dev__vjp_run2(c, "Mul", DY, X(1), NULL, 0), X(0)));
  if (c->need[1])
    dev__vjp_set_dx(
        c, 1, unbroadcast(c, dev__vjp_run2(c, "Mul", X(0), DY, NULL, 0), X(1)));
}

/* d(x/y) = dy/y, -(dy/y) * (x/y) */
static void vjp_div(vjp_ctx *c) {
  dev_tensor *t = dev__vjp_run2(c, "Div", DY, X(1), NULL, 0);
  if (c->need[0]) dev__vjp_set_dx(c, 0, unbroadcast(c, t, X(0)));
  if (c->need[1])
    dev__vjp_set_dx(
        c, 1,
        unbroadcast(
            c,
            dev__vjp_run1(c, "Neg", dev__vjp_run2(c, "Mul", t, Y, NULL, 0),
                          NULL, 0),
            X(1)));
}

static void vjp_neg(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run1(c, "Neg", DY, NULL, 0));
}
static void vjp_identity(vjp_ctx *c) { dev__vjp_set_dx(c, 0, DY); }
/* d exp(x) = dy * exp(x) */
static void vjp_exp(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "Mul", DY, Y, NULL, 0));
}
/* d log(x) = dy / x */
static void vjp_log(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "Div", DY, X(0), NULL, 0));
}
static void vjp_sqrt(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "SqrtGrad", Y, DY, NULL, 0));
}
static void vjp_rsqrt(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "RsqrtGrad", Y, DY, NULL, 0));
}
static void vjp_tanh(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "TanhGrad", Y, DY, NULL, 0));
}
static void vjp_sigmoid(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "SigmoidGrad", Y, DY, NULL, 0));
}
/* As TensorFlow, from the output: y > 0 exactly where x > 0. */
static void vjp_relu(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "ReluGrad", DY, Y, NULL, 0));
}

/* d x^2 = dy * 2x */
static void vjp_square(vjp_ctx *c) {
  dev_tensor *two = dev__vjp_scalar(c, 2.0, X(0)->dtype);
  dev__vjp_set_dx(
      c, 0,
      dev__vjp_run2(c, "Mul", DY, dev__vjp_run2(c, "Mul", X(0), two, NULL, 0),
                    NULL, 0));
}

/* d x^y = dy * y * x^(y-1), dy * x^y * log(x) with log(x) taken as 0 where
 * x <= 0 (TensorFlow's _PowGrad). */
static void vjp_pow(vjp_ctx *c) {
  pd_dtype dt = Y->dtype;
  dev_tensor *x = X(0), *y = X(1);
  if (c->need[0]) {
    dev_tensor *ym1 =
        dev__vjp_run2(c, "Sub", y, dev__vjp_scalar(c, 1.0, dt), NULL, 0);
    dev_tensor *t = dev__vjp_run2(
        c, "Mul", y, dev__vjp_run2(c, "Pow", x, ym1, NULL, 0), NULL, 0);
    dev__vjp_set_dx(c, 0,
                    unbroadcast(c, dev__vjp_run2(c, "Mul", DY, t, NULL, 0), x));
  }
  if (c->need[1]) {
    dev_attr cast = dev_attr_dtype("DstT", dt);
    dev_tensor *m = dev__vjp_run1(
        c, "Cast",
        dev__vjp_run2(c, "Greater", x, dev__vjp_scalar(c, 0.0, dt), NULL, 0),
        &cast, 1);
    /* x where x > 0, else 1: its log is log(x) or 0. */
    dev_tensor *xs = dev__vjp_run2(
        c, "Add", dev__vjp_run2(c, "Mul", x, m, NULL, 0),
        dev__vjp_run2(c, "Sub", dev__vjp_scalar(c, 1.0, dt), m, NULL, 0), NULL,
        0);
    dev_tensor *t =
        dev__vjp_run2(c, "Mul", dev__vjp_run2(c, "Mul", DY, Y, NULL, 0),
                      dev__vjp_run1(c, "Log", xs, NULL, 0), NULL, 0);
    dev__vjp_set_dx(c, 1, unbroadcast(c, t, y));
  }
}

/* Maximum / Minimum: the gradient goes to the input that was selected; ties
 * go to x (TensorFlow: x >= y for Maximum, x <= y for Minimum). */
static void vjp_select(vjp_ctx *c, const char *y_wins) {
  dev_attr cast = dev_attr_dtype("DstT", Y->dtype);
  dev_tensor *m = dev__vjp_run1(
      c, "Cast", dev__vjp_run2(c, y_wins, X(0), X(1), NULL, 0), &cast, 1);
  dev_tensor *gy = dev__vjp_run2(c, "Mul", DY, m, NULL, 0);
  if (c->need[0])
    dev__vjp_set_dx(
        c, 0, unbroadcast(c, dev__vjp_run2(c, "Sub", DY, gy, NULL, 0), X(0)));
  if (c->need[1]) dev__vjp_set_dx(c, 1, unbroadcast(c, gy, X(1)));
}
static void vjp_maximum(vjp_ctx *c) { vjp_select(c, "Less"); }
static void vjp_minimum(vjp_ctx *c) { vjp_select(c, "Greater"); }

static dev_tensor *mm(vjp_ctx *c, const char *op, const char *na,
                      const char *nb, dev_tensor *a, dev_tensor *b, bool ta,
                      bool tb) {
  dev_attr at[2] = {dev_attr_bool(na, ta), dev_attr_bool(nb, tb)};
  return dev__vjp_run2(c, op, a, b, at, 2);
}

/* MatMul and BatchMatMul (TensorFlow's _MatMulGrad, _BatchMatMulV2): for
 * out = op(a) op(b), each of the four transpose cases; BatchMatMul then sums
 * over the batch axes that were broadcast. */
static void vjp_matmul_common(vjp_ctx *c, const char *op, const char *na,
                              const char *nb, bool batch) {
  bool ta = dev__vjp_attr(c, na)->u.b, tb = dev__vjp_attr(c, nb)->u.b;
  dev_tensor *a = X(0), *b = X(1), *g = DY;
  if (c->need[0]) {
    dev_tensor *da;
    if (!ta && !tb)
      da = mm(c, op, na, nb, g, b, false, true);
    else if (!ta)
      da = mm(c, op, na, nb, g, b, false, false);
    else if (!tb)
      da = mm(c, op, na, nb, b, g, false, true);
    else
      da = mm(c, op, na, nb, b, g, true, true);
    dev__vjp_set_dx(c, 0, batch ? unbroadcast(c, da, a) : da);
  }
  if (c->need[1]) {
    dev_tensor *db;
    if (!ta && !tb)
      db = mm(c, op, na, nb, a, g, true, false);
    else if (!ta)
      db = mm(c, op, na, nb, g, a, true, false);
    else if (!tb)
      db = mm(c, op, na, nb, a, g, false, false);
    else
      db = mm(c, op, na, nb, g, a, true, true);
    dev__vjp_set_dx(c, 1, batch ? unbroadcast(c, db, b) : db);
  }
}
static void vjp_matmul(vjp_ctx *c) {
  vjp_matmul_common(c, "MatMul", "transpose_a", "transpose_b", false);
}
static void vjp_batch_matmul(vjp_ctx *c) {
  vjp_matmul_common(c, "BatchMatMul", "adj_x", "adj_y", true);
}

/* BiasAdd: value gets dy, bias gets dy summed over every axis but the
 * channel axis (TensorFlow's BiasAddGrad). */
static void vjp_bias_add(vjp_ctx *c) {
  if (c->need[0]) dev__vjp_set_dx(c, 0, DY);
  if (c->need[1]) {
    int rank = X(0)->shape.rank;
    int ch = dev__vjp_attr_is(dev__vjp_attr(c, "data_format"), "NCHW")
                 ? 1
                 : rank - 1;
    int64_t axes[PD_MAX_RANK];
    int n = 0;
    for (int i = 0; i < rank; i++)
      if (i != ch) axes[n++] = i;
    dev_attr a = dev_attr_int_list("axis", axes, n);
    dev__vjp_set_dx(c, 1, dev__vjp_run1(c, "Sum", DY, &a, 1));
  }
}

/* Sum and Mean: dy broadcast back over the reduced axes (divided by the
 * number of elements each output averaged, for Mean). */
static void vjp_reduce(vjp_ctx *c, bool mean) {
  const dev_attr_value *axis = dev__vjp_attr(c, "axis");
  bool keep = dev__vjp_attr(c, "keep_dims")->u.b;
  dev_attr a[2] = {
      dev_attr_int_list("axis", axis->u.ilist.v, keep ? 0 : axis->u.ilist.n),
      dev_attr_bool("mean", mean)};
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "BroadcastToLike", DY, X(0), a, 2));
}
static void vjp_sum(vjp_ctx *c) { vjp_reduce(c, false); }
static void vjp_mean(vjp_ctx *c) { vjp_reduce(c, true); }

static void vjp_reshape(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "ReshapeLike", DY, X(0), NULL, 0));
}

/* Transpose: dy transposed by the inverse permutation. */
static void vjp_transpose(vjp_ctx *c) {
  const dev_attr_value *perm = dev__vjp_attr(c, "perm");
  int64_t inv[PD_MAX_RANK];
  int n = perm->u.ilist.n; /* 0: reversal, its own inverse */
  for (int i = 0; i < n && i < PD_MAX_RANK; i++) inv[perm->u.ilist.v[i]] = i;
  dev_attr a = dev_attr_int_list("perm", inv, n);
  dev__vjp_set_dx(c, 0, dev__vjp_run1(c, "Transpose", DY, &a, 1));
}

/* Concat: each input gets its part of dy (ConcatGrad; from the end when the
 * inputs before it would pass the input limit). */
static void vjp_concat(vjp_ctx *c) {
  int64_t axis = dev__vjp_attr(c, "axis")->u.i;
  int n = c->r->n_in;
  for (int j = 0; j < n; j++) {
    if (!c->need[j]) continue;
    dev_tensor *in[DEV_MAX_INPUTS];
    int cnt = 0;
    bool from_end = j + 2 > DEV_MAX_INPUTS;
    in[cnt++] = DY;
    if (!from_end)
      for (int k = 0; k <= j; k++) in[cnt++] = X(k);
    else
      for (int k = j; k < n; k++) in[cnt++] = X(k);
    dev_attr a[2] = {dev_attr_int("axis", axis),
                     dev_attr_bool("from_end", from_end)};
    dev__vjp_set_dx(c, j, dev__vjp_run(c, "ConcatGrad", in, cnt, a, 2));
  }
}

static void vjp_slice(vjp_ctx *c) {
  const dev_attr_value *b = dev__vjp_attr(c, "begin");
  dev_attr a = dev_attr_int_list("begin", b->u.ilist.v, b->u.ilist.n);
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "SliceGrad", DY, X(0), &a, 1));
}

/* Gather: dy's slices added back at the indices; the indices get none. */
static void vjp_gather(vjp_ctx *c) {
  if (!c->need[0]) return;
  dev_attr a = dev_attr_int("axis", dev__vjp_attr(c, "axis")->u.i);
  dev_tensor *in[3] = {DY, X(1), X(0)};
  dev__vjp_set_dx(c, 0, dev__vjp_run(c, "GatherGrad", in, 3, &a, 1));
}

/* Cast between floating dtypes: dy cast back. Other casts carry nothing. */
static void vjp_cast(vjp_ctx *c) {
  if (!dev__is_float(Y)) return;
  if (Y->dtype == X(0)->dtype) {
    dev__vjp_set_dx(c, 0, DY);
    return;
  }
  dev_attr a = dev_attr_dtype("DstT", X(0)->dtype);
  dev__vjp_set_dx(c, 0, dev__vjp_run1(c, "Cast", DY, &a, 1));
}

/* y = softmax(x) over the last axis: dx = (dy - sum(dy*y)) * y. */
static dev_tensor *softmax_vjp(vjp_ctx *c, dev_tensor *dy, dev_tensor *y) {
  int64_t last = -1;
  dev_attr a[2] = {dev_attr_int_list("axis", &last, 1),
                   dev_attr_bool("keep_dims", true)};
  dev_tensor *s =
      dev__vjp_run1(c, "Sum", dev__vjp_run2(c, "Mul", dy, y, NULL, 0), a, 2);
  return dev__vjp_run2(c, "Mul", dev__vjp_run2(c, "Sub", dy, s, NULL, 0), y,
                       NULL, 0);
}
static void vjp_softmax(vjp_ctx *c) {
  dev__vjp_set_dx(c, 0, softmax_vjp(c, DY, Y));
}

/* y = logsoftmax(x): dx = dy - exp(y) * sum(dy). */
static void vjp_log_softmax(vjp_ctx *c) {
  int64_t last = -1;
  dev_attr a[2] = {dev_attr_int_list("axis", &last, 1),
                   dev_attr_bool("keep_dims", true)};
  dev_tensor *s = dev__vjp_run1(c, "Sum", DY, a, 2);
  dev__vjp_set_dx(
      c, 0,
      dev__vjp_run2(c, "Sub", DY,
                    dev__vjp_run2(c, "Mul", dev__vjp_run1(c, "Exp", Y, NULL, 0),
                                  s, NULL, 0),
                    NULL, 0));
}

/* SparseSoftmaxCrossEntropyWithLogits (TensorFlow's
 * _SparseSoftmaxCrossEntropyWithLogitsGrad): the loss's gradient is
 * dloss[:, None] * backprop; a gradient reaching the backprop output adds
 * softmax's VJP of it. Labels get none. */
static void vjp_sparse_xent(vjp_ctx *c) {
  if (!c->need[0]) return;
  dev_tensor *g = NULL;
  if (c->dy[0]) {
    int64_t shape[2] = {-1, 1};
    dev_attr a = dev_attr_int_list("shape", shape, 2);
    g = dev__vjp_run2(c, "Mul", dev__vjp_run1(c, "Reshape", c->dy[0], &a, 1),
                      c->r->out[1], NULL, 0);
  }
  if (c->dy[1]) {
    dev_tensor *h =
        softmax_vjp(c, c->dy[1], dev__vjp_run1(c, "Softmax", X(0), NULL, 0));
    g = g ? dev__vjp_run2(c, "Add", g, h, NULL, 0) : h;
  }
  dev__vjp_set_dx(c, 0, g);
}

/* AllReduce: the adjoint across the mesh is the same all-reduce of dy (sum
 * for sum, mean for mean); max, min and prod have no gradient here. */
static void vjp_all_reduce(vjp_ctx *c) {
  const dev_attr_value *red = dev__vjp_attr(c, "reduction");
  if (c->rc != PD_OK) return;
  if (!dev__vjp_attr_is(red, "sum") && !dev__vjp_attr_is(red, "mean")) {
    c->rc = dev_error(
        c->st, PD_INVALID_ARGUMENT,
        "AllReduce with reduction '%.*s' has no gradient, but the target "
        "depends on "
        "a source through it; expected reduction sum or mean on the path",
        (int)(red->u.s.len > 16 ? 16 : red->u.s.len), red->u.s.ptr);
    return;
  }
  dev_attr a = dev_attr_string("reduction",
                               dev__vjp_attr_is(red, "sum") ? "sum" : "mean");
  dev__vjp_set_dx(c, 0, dev__vjp_run1(c, "AllReduce", DY, &a, 1));
}

static const struct {
  const char *name;
  vjp_fn fn;
} k_vjps[] = {
    {"Abs", dev__vjp_abs},
    {"Add", vjp_add},
    {"AllGather", dev__vjp_all_gather},
    {"AllReduce", vjp_all_reduce},
    {"BatchMatMul", vjp_batch_matmul},
    {"BiasAdd", vjp_bias_add},
    {"Broadcast", dev__vjp_broadcast},
    {"BroadcastToLike", dev__vjp_broadcast_to_like},
    {"Cast", vjp_cast},
    {"Concat", vjp_concat},
    {"CopyToDevices", dev__vjp_copy_to_devices},
    {"Div", vjp_div},
    {"Exp", vjp_exp},
    {"Gather", vjp_gather},
    {"Identity", vjp_identity},
    {"Log", vjp_log},
    {"LogSoftmax", vjp_log_softmax},
    {"MatMul", vjp_matmul},
    {"Max", dev__vjp_max},
    {"Maximum", vjp_maximum},
    {"Mean", vjp_mean},
    {"Min", dev__vjp_min},
    {"Minimum", vjp_minimum},
    {"Mul", vjp_mul},
    {"Neg", vjp_neg},
    {"Pack", dev__vjp_pack},
    {"ParallelPack", dev__vjp_parallel_pack},
    {"ParallelUnpack", dev__vjp_parallel_unpack},
    {"Pow", vjp_pow},
    {"ReduceScatter", dev__vjp_reduce_scatter},
    {"Relu", vjp_relu},
    {"ReluGrad", dev__vjp_relu_grad},
    {"Reshape", vjp_reshape},
    {"ReshapeLike", dev__vjp_reshape_like},
    {"Rsqrt", vjp_rsqrt},
    {"RsqrtGrad", dev__vjp_rsqrt_grad},
    {"Sigmoid", vjp_sigmoid},
    {"SigmoidGrad", dev__vjp_sigmoid_grad},
    {"Slice", vjp_slice},
    {"Softmax", vjp_softmax},
    {"Split", dev__vjp_split},
    {"SplitV", dev__vjp_split},
    {"SparseSoftmaxCrossEntropyWithLogits", vjp_sparse_xent},
    {"Sqrt", vjp_sqrt},
    {"SqrtGrad", dev__vjp_sqrt_grad},
    {"Square", vjp_square},
    {"Sub", vjp_sub},
    {"Sum", vjp_sum},
    {"SumToLike", dev__vjp_sum_to_like},
    {"Tanh", vjp_tanh},
    {"TanhGrad", dev__vjp_tanh_grad},
    {"Transpose", vjp_transpose},
    {"Unpack", dev__vjp_unpack},
};

vjp_fn dev__vjp_for(const dev_op_def *def) {
  for (size_t i = 0; i < sizeof k_vjps / sizeof k_vjps[0]; i++)
    if (strcmp(k_vjps[i].name, def->name) == 0) return k_vjps[i].fn;
  return NULL;
}

bool dev_op_def_has_gradient(const dev_op_def *def) {
  return dev__vjp_for(def) != NULL;
}

#undef X
#undef Y
#undef DY
