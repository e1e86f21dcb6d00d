/* Gradient ops of taking parts: the adjoints of Slice, Concat and Gather,
 * which the gradient tape's vector-Jacobian products (vjp.c) need.
 *
 *  SliceGrad, ConcatGrad, GatherGrad
 *      paradev's own, like the shape-taking ops of grad_ops.c: TensorFlow's
 *      gradients take offsets and shapes from tensors computed at run time
 *      (ConcatOffset, Shape); here they come from a `like` input whose
 *      per-component SHAPE alone is read (components of one parallel tensor
 *      may differ in shape), never its data.
 *
 * SliceGrad and ConcatGrad only move bytes and take every dtype; GatherGrad
 * sums rows, on float32 and float64 directly and on float16 and bfloat16
 * through float32 scratch rounded back to nearest even, as the other op
 * files do. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"

/* ------------------------------------------------------------------------ */
/* SliceGrad(grad, like; begin): zeros of like's shape with grad written at
 * `begin` (the adjoint of Slice; TensorFlow pads instead). Every dtype.     */

enum { SG_BEGIN = 0 };

static pd_code sg_infer(dev_infer_ctx *c, dev_status *st) {
  pd_code rc = dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st);
  if (rc) return rc;
  const dev_shape *g = &c->in_shape[0], *like = &c->in_shape[1];
  const dev_attr_value *b = &c->attrs[SG_BEGIN];
  char a[160], sb[160];
  if (g->rank != like->rank || b->u.ilist.n != like->rank)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "SliceGrad: input 'grad' has shape %s, input 'like' has shape %s and "
        "attribute 'begin' has %d entries; expected one rank for all three",
        dev_shape_str(g, a, sizeof a), dev_shape_str(like, sb, sizeof sb),
        b->u.ilist.n);
  for (int d = 0; d < g->rank; d++) {
    int64_t bg = b->u.ilist.v[d];
    if (bg < 0 || bg > like->dims[d] || g->dims[d] > like->dims[d] - bg)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "SliceGrad: axis %d: begin %lld and grad's size %lld do not fit in "
          "dim %lld "
          "of input 'like' of shape %s; expected 0 <= begin <= %lld - size",
          d, (long long)bg, (long long)g->dims[d], (long long)like->dims[d],
          dev_shape_str(like, sb, sizeof sb), (long long)like->dims[d]);
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = *like;
  return PD_OK;
}

static pd_code sg_cpu(dev_kernel_ctx *c, dev_status *st) {
  (void)st;
  const dev_shape *os = &c->out_shape[0];
  size_t es = pd_dtype_size(c->out_dtype[0]);
  int64_t total = dev_num_elems(os);
  if (total == 0) return PD_OK;
  memset(c->out_data[0], 0, (size_t)total * es);
  dev__copy_box(c->out_data[0], os, c->attrs[SG_BEGIN].u.ilist.v,
                (char *)c->in_data[0], &c->in_shape[0], es, false);
  return PD_OK;
}

#define PARTS_NOTES                                                            \
  "paradev's own (no tf.raw_ops op of this name): TensorFlow's gradients "     \
  "take offsets and shapes from tensors computed at run time; here `like` "    \
  "gives each component's shape (its data is never read)."

static dev_op_def sg_def = {
    .name = "SliceGrad",
    .num_inputs = 2,
    .inputs = {{"grad", false, 0, DEV_MASK_ALL},
               {"like", false, 0, DEV_MASK_ALL, NULL,
                "only its shape is read"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as grad"}},
    .num_attrs = 1,
    .attrs = {{"begin",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_NONE},
               .doc = "Slice's begin, one entry per axis",
               .has_min = true,
               .min = 0}},
    .infer = sg_infer,
    .kernels = {[DEV_BACKEND_CPU] = sg_cpu},
    .summary =
        "Zeros of like's shape with grad written at `begin`: the "
        "gradient of Slice.",
    .notes = PARTS_NOTES,
};

/* ------------------------------------------------------------------------ */
/* ConcatGrad(grad, values...; axis, from_end = false): the part of grad that
 * Concat along `axis` took from one of its inputs. `values` are Concat's
 * inputs values[0..i] (only their shapes are read) and the output is the
 * part of the LAST of them, at offset sum(values[0..i-1].dims[axis]). With
 * from_end, `values` are Concat's inputs values[i..n-1] and the output is the
 * part of the FIRST of them, at offset grad.dims[axis] - sum(their dims);
 * the tape uses it when i+2 inputs would pass the input limit. Every dtype. */

enum { CG_AXIS = 0, CG_FROM_END = 1 };

/* Offset and size along the axis of the part ConcatGrad returns. */
static void cg_part(const dev_shape *g, const dev_shape *vals, int nv, int axis,
                    bool from_end, int64_t *offset, int64_t *size) {
  int64_t sum = 0;
  for (int k = 0; k < nv; k++) sum += vals[k].dims[axis];
  if (from_end) {
    *offset = g->dims[axis] - sum;
    *size = vals[0].dims[axis];
  } else {
    *size = vals[nv - 1].dims[axis];
    *offset = sum - *size;
  }
}

static pd_code cg_infer(dev_infer_ctx *c, dev_status *st) {
  const dev_shape *g = &c->in_shape[0];
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st)) ||
      (rc = dev_check_rank(c, 0, 1, PD_MAX_RANK, st)))
    return rc;
  int axis;
  PD_TRY(
      dev_normalize_axis(c, "axis", c->attrs[CG_AXIS].u.i, g->rank, &axis, st));
  int nv = c->num_inputs - 1;
  int64_t sum = 0;
  char a[160], b[160];
  for (int k = 0; k < nv; k++) {
    const dev_shape *v = &c->in_shape[1 + k];
    bool ok = v->rank == g->rank;
    for (int d = 0; ok && d < g->rank; d++)
      ok = d == axis || v->dims[d] == g->dims[d];
    if (!ok)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "ConcatGrad: input 'values[%d]' has shape %s but 'grad' has shape "
          "%s; "
          "expected the same rank and equal dims except on axis %d",
          k, dev_shape_str(v, a, sizeof a), dev_shape_str(g, b, sizeof b),
          axis);
    sum += v->dims[axis];
  }
  if (sum > g->dims[axis])
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "ConcatGrad: 'values' have %lld elements on axis %d "
                     "together but 'grad' of "
                     "shape %s has %lld; expected at most grad's",
                     (long long)sum, axis, dev_shape_str(g, a, sizeof a),
                     (long long)g->dims[axis]);
  int64_t off, size;
  cg_part(g, &c->in_shape[1], nv, axis, c->attrs[CG_FROM_END].u.b, &off, &size);
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = *g;
  c->out_shape[0].dims[axis] = size;
  return PD_OK;
}

static pd_code cg_cpu(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *g = &c->in_shape[0];
  int64_t a = c->attrs[CG_AXIS].u.i;
  int axis = (int)(a < 0 ? a + g->rank : a);
  int64_t off, size;
  cg_part(g, &c->in_shape[1], c->num_inputs - 1, axis,
          c->attrs[CG_FROM_END].u.b, &off, &size);
  size_t es = pd_dtype_size(c->out_dtype[0]);
  int64_t outer = dev_dims_prod(g, 0, axis),
          inner = dev_dims_prod(g, axis + 1, g->rank);
  size_t run = (size_t)(size * inner) * es,
         grow = (size_t)(g->dims[axis] * inner) * es;
  if (run == 0) return PD_OK;
  const char *src = (const char *)c->in_data[0] + (size_t)(off * inner) * es;
  char *dst = c->out_data[0];
  for (int64_t o = 0; o < outer; o++)
    memcpy(dst + (size_t)o * run, src + (size_t)o * grow, run);
  (void)st;
  return PD_OK;
}

static dev_op_def cg_def = {
    .name = "ConcatGrad",
    .num_inputs = 2,
    .inputs = {{"grad", false, 0, DEV_MASK_ALL},
               {"values", true, 1, DEV_MASK_ALL, NULL,
                "Concat's inputs up to the one wanted (only shapes are "
                "read)"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as grad"}},
    .num_attrs = 2,
    .attrs = {{"axis",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_NONE},
               .doc = "Concat's axis; -rank..rank-1"},
              {"from_end",
               DEV_ATTR_BOOL,
               {.type = DEV_ATTR_BOOL, .u.b = false},
               .doc = "values are Concat's inputs from the wanted one to the "
                      "last"}},
    .infer = cg_infer,
    .kernels = {[DEV_BACKEND_CPU] = cg_cpu},
    .summary =
        "The part of grad that Concat along `axis` took from the last "
        "of `values` (the first, with from_end): the gradient of "
        "Concat.",
    .notes = PARTS_NOTES,
};

/* ------------------------------------------------------------------------ */
/* GatherGrad(grad, indices, like; axis = 0): zeros of like's shape with
 * grad's slices added at `indices` along `axis` (the adjoint of Gather;
 * TensorFlow's UnsortedSegmentSum of the IndexedSlices). grad has Gather's
 * output shape like[:axis] + indices.shape + like[axis+1:]. Repeated indices
 * add up. An index outside [0, like.dims[axis]) fails the op. Floating
 * dtypes for grad; int32 or int64 indices.                                  */

enum { GG_AXIS = 0 };

static pd_code gg_infer(dev_infer_ctx *c, dev_status *st) {
  const dev_shape *g = &c->in_shape[0], *is = &c->in_shape[1],
                  *like = &c->in_shape[2];
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, DEV_MASK_FLOAT, NULL, st)) ||
      (rc = dev_check_dtype_in(
           c, 1, DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64),
           "int32 or int64", st)) ||
      (rc = dev_check_rank(c, 2, 1, PD_MAX_RANK, st)))
    return rc;
  int axis;
  if ((rc = dev_normalize_axis(c, "axis", c->attrs[GG_AXIS].u.i, like->rank,
                               &axis, st)))
    return rc;
  dev_shape want;
  want.rank = like->rank - 1 + is->rank;
  bool ok = want.rank <= PD_MAX_RANK;
  if (ok) {
    int o = 0;
    for (int d = 0; d < axis; d++) want.dims[o++] = like->dims[d];
    for (int d = 0; d < is->rank; d++) want.dims[o++] = is->dims[d];
    for (int d = axis + 1; d < like->rank; d++) want.dims[o++] = like->dims[d];
    ok = dev_shape_equal(&want, g);
  }
  if (!ok) {
    char a[160], b[160], ib[160], w[160];
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "GatherGrad: input 'grad' has shape %s; expected Gather's output shape "
        "for "
        "'like' of shape %s, indices of shape %s and axis %d (%s)",
        dev_shape_str(g, a, sizeof a), dev_shape_str(like, b, sizeof b),
        dev_shape_str(is, ib, sizeof ib), axis,
        want.rank <= PD_MAX_RANK ? dev_shape_str(&want, w, sizeof w)
                                 : "too many axes");
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = *like;
  return PD_OK;
}

#define DEFINE_GG(FN, T)                                                       \
  static void FN(const T *g, T *out, const dev_kernel_ctx *c, int64_t outer,   \
                 int64_t n, int64_t ni, int64_t inner) {                       \
    bool i64 = c->in_dtype[1] == PD_INT64;                                     \
    const int32_t *ix32 = c->in_data[1];                                       \
    const int64_t *ix64 = c->in_data[1];                                       \
    for (int64_t o = 0; o < outer; o++)                                        \
      for (int64_t i = 0; i < ni; i++, g += inner) {                           \
        int64_t v = i64 ? ix64[i] : ix32[i];                                   \
        T *dst = out + (o * n + v) * inner;                                    \
        for (int64_t k = 0; k < inner; k++) dst[k] += g[k];                    \
      }                                                                        \
  }

DEFINE_GG(gg_f32, float)
DEFINE_GG(gg_f64, double)

static pd_code gg_cpu(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *like = &c->in_shape[2];
  int64_t a = c->attrs[GG_AXIS].u.i;
  int axis = (int)(a < 0 ? a + like->rank : a);
  int64_t outer = dev_dims_prod(like, 0, axis), n = like->dims[axis];
  int64_t inner = dev_dims_prod(like, axis + 1, like->rank);
  int64_t ni = dev_num_elems(&c->in_shape[1]);
  bool i64 = c->in_dtype[1] == PD_INT64;
  for (int64_t i = 0; i < ni; i++) {
    int64_t v = i64 ? ((const int64_t *)c->in_data[1])[i]
                    : ((const int32_t *)c->in_data[1])[i];
    if (v < 0 || v >= n)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "GatherGrad: indices[%lld] = %lld is not in [0, %lld)",
                       (long long)i, (long long)v, (long long)n);
  }
  pd_dtype dt = c->out_dtype[0];
  int64_t total = dev_num_elems(like), gn = dev_num_elems(&c->in_shape[0]);
  if (total == 0) return PD_OK;
  if (dt == PD_FLOAT32 || dt == PD_FLOAT64) {
    memset(c->out_data[0], 0, (size_t)total * pd_dtype_size(dt));
    if (gn == 0) return PD_OK;
    if (dt == PD_FLOAT32)
      gg_f32(c->in_data[0], c->out_data[0], c, outer, n, ni, inner);
    else
      gg_f64(c->in_data[0], c->out_data[0], c, outer, n, ni, inner);
    return PD_OK;
  }
  float *buf = dev__scratch_f32(gn + total);
  if (!buf) return dev__scratch_error(c, gn + total, st);
  dev__widen_16(dt, c->in_data[0], buf, gn);
  gg_f32(buf, buf + gn, c, outer, n, ni, inner);
  dev__narrow_16(dt, buf + gn, c->out_data[0], total);
  free(buf);
  return PD_OK;
}

static dev_op_def gg_def = {
    .name = "GatherGrad",
    .num_inputs = 3,
    .inputs = {{"grad", false, 0, DEV_MASK_FLOAT},
               {"indices", false, 0,
                DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64)},
               {"like", false, 0, DEV_MASK_ALL, NULL,
                "only its shape is read"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_FLOAT, "same as grad"}},
    .num_attrs = 1,
    .attrs = {{"axis",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_INT, .u.i = 0},
               .doc = "Gather's axis; -rank..rank-1"}},
    .infer = gg_infer,
    .kernels = {[DEV_BACKEND_CPU] = gg_cpu},
    .summary =
        "Zeros of like's shape with grad's slices added at `indices` "
        "along `axis` (repeats add up): the gradient of Gather.",
    .notes = PARTS_NOTES,
};

/* ------------------------------------------------------------------------ */
/* Registration                                                              */

/* Registers SliceGrad, ConcatGrad and GatherGrad with their CPU kernels
 * (called by dev_registry_init). */
void dev_register_grad_parts_ops(void) {
  dev__register_or_die(&sg_def);
  dev__register_or_die(&cg_def);
  dev__register_or_die(&gg_def);
}
