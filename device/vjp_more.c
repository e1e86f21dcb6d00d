/* More vector-Jacobian products for the tape's table (vjp.c), added with
 * graph functions (issue #11):
 *  - Abs, the Max and Min reductions (TensorFlow's _AbsGrad and
 *    _MinOrMaxGrad, math_grad.py);
 *  - the collectives Broadcast, AllGather and ReduceScatter (their adjoints
 *    across the mesh: a sum to the root, a reduce-scatter, an all-gather);
 *  - the gradient ops' own, so gradients of gradients work inside
 *    functions: ReluGrad, TanhGrad, SigmoidGrad, SqrtGrad, RsqrtGrad
 *    (TensorFlow's _ReluGradGrad, _TanhGradGrad, _SigmoidGradGrad,
 *    _SqrtGradGrad, _RsqrtGradGrad) and the shape-taking SumToLike,
 *    BroadcastToLike and ReshapeLike (each other's adjoints).
 * Same conventions as vjp.c (straight-line code, sticky errors); the small
 * helpers are this file's own so vjp.c and this file do not call each
 * other in a circle (vjp.c's table names these functions). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tape_int.h"

static dev_tensor *cast(vjp_ctx *c, dev_tensor *t, pd_dtype dt) {
  dev_attr a = dev_attr_dtype("DstT", dt);
  return dev__vjp_run1(c, "Cast", t, &a, 1);
}

/* True when every component of t has component 0's shape. */
static bool even(const dev_tensor *t) {
  for (int d = 1; d < t->n; d++)
    if (!dev_shape_equal(&t->comps[d].shape, &t->comps[0].shape)) return false;
  return true;
}

static void fail(vjp_ctx *c, const char *why) {
  if (c->rc == PD_OK)
    c->rc = dev_error(c->st, PD_INVALID_ARGUMENT,
                      "%s has no gradient here: %s, but the target depends on "
                      "a source through it",
                      c->r->def->name, why);
}

#define X(j) (c->r->in[j])
#define Y (c->r->out[0])
#define DY (c->dy[0])

/* d|x| = dy * sign(x), sign(0) = 0 (TensorFlow's _AbsGrad). */
void dev__vjp_abs(vjp_ctx *c) {
  pd_dtype dt = X(0)->dtype;
  dev_tensor *zero = dev__vjp_scalar(c, 0.0, dt);
  dev_tensor *sign = dev__vjp_run2(
      c, "Sub", cast(c, dev__vjp_run2(c, "Greater", X(0), zero, NULL, 0), dt),
      cast(c, dev__vjp_run2(c, "Less", X(0), zero, NULL, 0), dt), NULL, 0);
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "Mul", DY, sign, NULL, 0));
}

/* Max and Min over `axis` (TensorFlow's _MinOrMaxGrad): dy goes to the
 * elements equal to the result, spread equally over ties. */
static void vjp_min_or_max(vjp_ctx *c) {
  const dev_attr_value *axis = dev__vjp_attr(c, "axis");
  bool keep = dev__vjp_attr(c, "keep_dims")->u.b;
  if (c->rc != PD_OK) return;
  pd_dtype dt = X(0)->dtype;
  dev_attr b[2] = {
      dev_attr_int_list("axis", axis->u.ilist.v, keep ? 0 : axis->u.ilist.n),
      dev_attr_bool("mean", false)};
  dev_attr s[2] = {dev_attr_int_list("axis", axis->u.ilist.v, axis->u.ilist.n),
                   dev_attr_bool("keep_dims", keep)};
  dev_tensor *yb = dev__vjp_run2(c, "BroadcastToLike", Y, X(0), b, 2);
  dev_tensor *eq = cast(c, dev__vjp_run2(c, "Equal", X(0), yb, NULL, 0), dt);
  dev_tensor *cnt = dev__vjp_run2(
      c, "BroadcastToLike", dev__vjp_run1(c, "Sum", eq, s, 2), X(0), b, 2);
  dev_tensor *g = dev__vjp_run2(c, "BroadcastToLike", DY, X(0), b, 2);
  dev__vjp_set_dx(
      c, 0,
      dev__vjp_run2(c, "Div", dev__vjp_run2(c, "Mul", g, eq, NULL, 0), cnt,
                    NULL, 0));
}
void dev__vjp_max(vjp_ctx *c) { vjp_min_or_max(c); }
void dev__vjp_min(vjp_ctx *c) { vjp_min_or_max(c); }

/* Broadcast(root): y_d = x_root on every device, so the root's input gets
 * the sum over devices of dy and the others get zeros. */
void dev__vjp_broadcast(vjp_ctx *c) {
  int64_t root = dev__vjp_attr(c, "root")->u.i;
  if (c->rc != PD_OK) return;
  if (!even(X(0))) {
    fail(c, "its input's components differ in shape");
    return;
  }
  dev_attr red = dev_attr_string("reduction", "sum");
  dev_tensor *s = dev__vjp_run1(c, "AllReduce", DY, &red, 1);
  dev_attr f[3] = {dev_attr_shape("shape", 0, NULL),
                   dev_attr_float("value", (double)root),
                   dev_attr_dtype("dtype", PD_INT32)};
  dev_tensor *r = dev__vjp_run(c, "Fill", NULL, 0, f, 3);
  dev_tensor *id = dev__vjp_run(c, "DeviceId", NULL, 0, NULL, 0);
  dev_tensor *m =
      cast(c, dev__vjp_run2(c, "Equal", id, r, NULL, 0), X(0)->dtype);
  dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "Mul", s, m, NULL, 0));
}

/* dy transposed so that `axis` comes first (its own inverse). */
static dev_tensor *swap_first(vjp_ctx *c, dev_tensor *t, int axis, int rank) {
  if (axis == 0) return t;
  int64_t perm[PD_MAX_RANK];
  for (int i = 0; i < rank; i++) perm[i] = i;
  perm[0] = axis;
  perm[axis] = 0;
  dev_attr a = dev_attr_int_list("perm", perm, rank);
  return dev__vjp_run1(c, "Transpose", t, &a, 1);
}

/* AllGather(axis): dx_d is device d's part of the sum over devices of dy,
 * a ReduceScatter (sum) along the gather axis. ReduceScatter splits as
 * numpy.array_split, so the components' sizes along the axis must be that
 * split's. */
void dev__vjp_all_gather(vjp_ctx *c) {
  int64_t ax = dev__vjp_attr(c, "axis")->u.i;
  if (c->rc != PD_OK) return;
  const dev_tensor *x = X(0);
  int rank = x->comps[0].shape.rank;
  int axis = (int)(ax < 0 ? ax + rank : ax);
  int64_t total = 0;
  for (int d = 0; d < x->n; d++) total += x->comps[d].shape.dims[axis];
  for (int d = 0; d < x->n; d++) {
    int64_t want = total / x->n + (d < total % x->n ? 1 : 0);
    if (x->comps[d].shape.dims[axis] != want) {
      fail(c,
           "the components' sizes along the gather axis are not "
           "numpy.array_split's (what ReduceScatter leaves)");
      return;
    }
  }
  dev_attr red = dev_attr_string("reduction", "sum");
  dev_tensor *rs =
      dev__vjp_run1(c, "ReduceScatter", swap_first(c, DY, axis, rank), &red, 1);
  dev__vjp_set_dx(c, 0, swap_first(c, rs, axis, rank));
}

/* ReduceScatter (sum or mean): dx = the AllGather of dy along axis 0
 * (divided by the number of devices for mean). */
void dev__vjp_reduce_scatter(vjp_ctx *c) {
  const dev_attr_value *red = dev__vjp_attr(c, "reduction");
  if (c->rc != PD_OK) return;
  bool mean = dev__vjp_attr_is(red, "mean");
  if (!mean && !dev__vjp_attr_is(red, "sum")) {
    fail(c, "its reduction is not sum or mean");
    return;
  }
  dev_attr a = dev_attr_int("axis", 0);
  dev_tensor *g = dev__vjp_run1(c, "AllGather", DY, &a, 1);
  if (mean)
    g = dev__vjp_run2(c, "Mul", g,
                      dev__vjp_scalar(c, 1.0 / (double)X(0)->n, X(0)->dtype),
                      NULL, 0);
  dev__vjp_set_dx(c, 0, g);
}

/* ReluGrad(g, f) = g * (f > 0): linear in g; zero in f almost everywhere. */
void dev__vjp_relu_grad(vjp_ctx *c) {
  if (c->need[0])
    dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "ReluGrad", DY, X(1), NULL, 0));
}

/* TanhGrad(y, g) = g * (1 - y^2): dy * g * -2y, TanhGrad(y, dy). */
void dev__vjp_tanh_grad(vjp_ctx *c) {
  dev_tensor *y = X(0), *g = X(1);
  if (c->need[0]) {
    dev_tensor *m2 = dev__vjp_scalar(c, -2.0, y->dtype);
    dev__vjp_set_dx(
        c, 0,
        dev__vjp_run2(c, "Mul", dev__vjp_run2(c, "Mul", DY, g, NULL, 0),
                      dev__vjp_run2(c, "Mul", y, m2, NULL, 0), NULL, 0));
  }
  if (c->need[1])
    dev__vjp_set_dx(c, 1, dev__vjp_run2(c, "TanhGrad", y, DY, NULL, 0));
}

/* SigmoidGrad(y, g) = g * y * (1 - y): dy * g * (1 - 2y), SigmoidGrad(y,
 * dy). */
void dev__vjp_sigmoid_grad(vjp_ctx *c) {
  dev_tensor *y = X(0), *g = X(1);
  if (c->need[0]) {
    dev_tensor *gb = dev__vjp_run2(c, "Mul", DY, g, NULL, 0);
    dev_tensor *two = dev__vjp_scalar(c, 2.0, y->dtype);
    dev__vjp_set_dx(
        c, 0,
        dev__vjp_run2(
            c, "Sub", gb,
            dev__vjp_run2(c, "Mul", dev__vjp_run2(c, "Mul", gb, y, NULL, 0),
                          two, NULL, 0),
            NULL, 0));
  }
  if (c->need[1])
    dev__vjp_set_dx(c, 1, dev__vjp_run2(c, "SigmoidGrad", y, DY, NULL, 0));
}

/* SqrtGrad(y, g) = z = 0.5 g / y: -dy * z / y, SqrtGrad(y, dy). */
void dev__vjp_sqrt_grad(vjp_ctx *c) {
  dev_tensor *y = X(0);
  if (c->need[0])
    dev__vjp_set_dx(
        c, 0,
        dev__vjp_run1(
            c, "Neg",
            dev__vjp_run2(c, "Mul", dev__vjp_run2(c, "Div", DY, y, NULL, 0), Y,
                          NULL, 0),
            NULL, 0));
  if (c->need[1])
    dev__vjp_set_dx(c, 1, dev__vjp_run2(c, "SqrtGrad", y, DY, NULL, 0));
}

/* RsqrtGrad(y, g) = -0.5 y^3 g: dy * g * -1.5 y^2, RsqrtGrad(y, dy). */
void dev__vjp_rsqrt_grad(vjp_ctx *c) {
  dev_tensor *y = X(0), *g = X(1);
  if (c->need[0]) {
    dev_tensor *k = dev__vjp_scalar(c, -1.5, y->dtype);
    dev_tensor *t =
        dev__vjp_run2(c, "Mul", dev__vjp_run2(c, "Mul", DY, g, NULL, 0),
                      dev__vjp_run1(c, "Square", y, NULL, 0), NULL, 0);
    dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "Mul", t, k, NULL, 0));
  }
  if (c->need[1])
    dev__vjp_set_dx(c, 1, dev__vjp_run2(c, "RsqrtGrad", y, DY, NULL, 0));
}

/* SumToLike(input, like): dy broadcast back to input's shape. `like` gets
 * nothing (only its shape is read). */
void dev__vjp_sum_to_like(vjp_ctx *c) {
  if (c->need[0])
    dev__vjp_set_dx(c, 0,
                    dev__vjp_run2(c, "BroadcastToLike", DY, X(0), NULL, 0));
}

/* BroadcastToLike(input, like; axis, mean): dy summed (mean: averaged) over
 * the axes broadcasting stretched, reshaped to input's shape. The axes are
 * read off component 0 (a graph node has one set of attributes). */
void dev__vjp_broadcast_to_like(vjp_ctx *c) {
  if (!c->need[0]) return;
  const dev_attr_value *axis = dev__vjp_attr(c, "axis");
  bool mean = dev__vjp_attr(c, "mean")->u.b;
  if (c->rc != PD_OK) return;
  const dev_shape *in = &X(0)->comps[0].shape, *like = &X(1)->comps[0].shape;
  const int L = like->rank, nred = axis->u.ilist.n;
  unsigned mask = 0;
  for (int i = 0; i < nred; i++) {
    int64_t v = axis->u.ilist.v[i];
    mask |= 1u << (int)(v < 0 ? v + L : v);
  }
  int64_t xe[PD_MAX_RANK], axes[PD_MAX_RANK];
  for (int i = 0, k = 0; i < L; i++) {
    if (nred > 0 && in->rank == L - nred)
      xe[i] = (mask & (1u << i)) ? 1 : in->dims[k++];
    else
      xe[i] = i - (L - in->rank) >= 0 ? in->dims[i - (L - in->rank)] : 1;
  }
  int n = 0;
  for (int i = 0; i < L; i++)
    if (xe[i] == 1 && like->dims[i] != 1) axes[n++] = i;
  dev_tensor *t = DY;
  if (n > 0) {
    dev_attr a[2] = {dev_attr_int_list("axis", axes, n),
                     dev_attr_bool("keep_dims", true)};
    t = dev__vjp_run1(c, mean ? "Mean" : "Sum", DY, a, 2);
  }
  if (t && !dev__same_shapes(t, X(0)))
    t = dev__vjp_run2(c, "ReshapeLike", t, X(0), NULL, 0);
  dev__vjp_set_dx(c, 0, t);
}

/* ReshapeLike(input, like): dy with input's shape. */
void dev__vjp_reshape_like(vjp_ctx *c) {
  if (c->need[0])
    dev__vjp_set_dx(c, 0, dev__vjp_run2(c, "ReshapeLike", DY, X(0), NULL, 0));
}

#undef X
#undef Y
#undef DY
