/* Array ops that take or place parts of tensors: Concat, Slice, Gather and
 * OneHot (Identity, Reshape and Transpose are in array.c).
 *
 * Semantics follow the TensorFlow raw ops of the same names (Concat is
 * ConcatV2 and Gather is GatherV2 without batch_dims, with the axis given as
 * an attribute rather than a tensor). Kernels work by element size and copy
 * contiguous runs with memcpy wherever the layout allows. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "device_int.h"

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */

/* ------------------------------------------------------------------------ */
/* Concat (TF ConcatV2, axis as attribute).                                  */

enum { CONCAT_AXIS = 0 };

static pd_code concat_infer(dev_infer_ctx *c, dev_status *st) {
  const dev_shape *s0 = &c->in_shape[0];
  char sa[160], sb[160];
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK)
    return st->code;
  if (s0->rank == 0)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "Concat: input 'values[0]' is a scalar; expected rank >= 1 "
        "(stack scalars with Reshape first)");
  int axis;
  if (dev_normalize_axis(c, "axis", c->attrs[CONCAT_AXIS].u.i, s0->rank, &axis,
                         st) != PD_OK)
    return st->code;
  dev_shape out = *s0;
  for (int k = 1; k < c->num_inputs; k++) {
    const dev_shape *sk = &c->in_shape[k];
    if (dev_check_same_dtype(c, 0, k, st) != PD_OK) return st->code;
    if (sk->rank != s0->rank)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "Concat: input 'values[%d]' has shape %s (rank %d) but "
          "'values[0]' has shape %s (rank %d); expected the same rank",
          k, dev_shape_str(sk, sa, sizeof sa), sk->rank,
          dev_shape_str(s0, sb, sizeof sb), s0->rank);
    for (int d = 0; d < s0->rank; d++) {
      if (d == axis) continue;
      if (sk->dims[d] != s0->dims[d])
        return dev_error(
            st, PD_INVALID_ARGUMENT,
            "Concat: input 'values[%d]' has shape %s but 'values[0]' has "
            "shape %s; expected equal dims except on axis %d (they differ "
            "on axis %d)",
            k, dev_shape_str(sk, sa, sizeof sa),
            dev_shape_str(s0, sb, sizeof sb), axis, d);
    }
    if (__builtin_add_overflow(out.dims[axis], sk->dims[axis], &out.dims[axis]))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Concat: the output's dim on axis %d overflows int64",
                       axis);
  }
  if (dev_check_out_size(c, c->in_dtype[0], &out, st) != PD_OK) return st->code;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

static pd_code concat_kernel(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *os = &c->out_shape[0];
  int rank = os->rank;
  int64_t a = c->attrs[CONCAT_AXIS].u.i;
  int axis = (int)(a < 0 ? a + rank : a);
  size_t es = pd_dtype_size(c->out_dtype[0]);
  int64_t outer = dev_dims_prod(os, 0, axis);
  int64_t inner = dev_dims_prod(os, axis + 1, rank);
  if (dev_num_elems(os) == 0) return PD_OK;
  size_t run[DEV_MAX_INPUTS];
  for (int k = 0; k < c->num_inputs; k++)
    run[k] = (size_t)(c->in_shape[k].dims[axis] * inner) * es;
  char *dst = c->out_data[0];
  for (int64_t o = 0; o < outer; o++) {
    for (int k = 0; k < c->num_inputs; k++) {
      if (run[k] == 0) continue;
      memcpy(dst, (const char *)c->in_data[k] + (size_t)o * run[k], run[k]);
      dst += run[k];
    }
  }
  (void)st;
  return PD_OK;
}

static dev_op_def concat_def = {
    .name = "Concat",
    .num_inputs = 1,
    .inputs = {{"values", true, 1, DEV_MASK_ALL, "one dtype for all",
                "tensors of one rank (>= 1), equal dims except on axis"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as values"}},
    .num_attrs = 1,
    .attrs = {{"axis",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_NONE},
               .doc = "the axis to join along; -rank..rank-1"}},
    .infer = concat_infer,
    .kernels = {concat_kernel, NULL},
    .summary =
        "output = the `values` joined along `axis` (as "
        "numpy.concatenate).",
    .notes =
        "Follows tf.raw_ops.ConcatV2, with `axis` an int attribute "
        "rather than an input tensor; tf.raw_ops.Concat of the same name "
        "takes `concat_dim` as its first input.",
};

/* ------------------------------------------------------------------------ */
/* Slice (TF Slice, begin and size as attributes; size -1: to the end).      */

enum { SLICE_BEGIN = 0, SLICE_SIZE = 1 };

static pd_code slice_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK)
    return st->code;
  const dev_shape *in = &c->in_shape[0];
  const dev_attr_value *b = &c->attrs[SLICE_BEGIN], *z = &c->attrs[SLICE_SIZE];
  char sb[160];
  if (b->u.ilist.n != in->rank || z->u.ilist.n != in->rank)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "Slice: attributes 'begin' (%d entries) and 'size' (%d entries) "
        "must have one entry per axis of input 'input' of shape %s (rank %d)",
        b->u.ilist.n, z->u.ilist.n, dev_shape_str(in, sb, sizeof sb), in->rank);
  dev_shape out;
  out.rank = in->rank;
  for (int d = 0; d < in->rank; d++) {
    int64_t bg = b->u.ilist.v[d], sz = z->u.ilist.v[d], dim = in->dims[d];
    if (bg < 0 || bg > dim)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "Slice: axis %d: begin %lld is outside [0, %lld] for input "
          "'input' of shape %s",
          d, (long long)bg, (long long)dim, dev_shape_str(in, sb, sizeof sb));
    if (sz == -1) sz = dim - bg;
    if (sz < 0 || sz > dim - bg)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "Slice: axis %d: size %lld with begin %lld does not fit in dim "
          "%lld of input 'input' of shape %s; expected -1 or 0..%lld",
          d, (long long)z->u.ilist.v[d], (long long)bg, (long long)dim,
          dev_shape_str(in, sb, sizeof sb), (long long)(dim - bg));
    out.dims[d] = sz;
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

static pd_code slice_kernel(dev_kernel_ctx *c, dev_status *st) {
  (void)st;
  dev__copy_box((char *)c->in_data[0], &c->in_shape[0],
                c->attrs[SLICE_BEGIN].u.ilist.v, c->out_data[0],
                &c->out_shape[0], pd_dtype_size(c->in_dtype[0]), true);
  return PD_OK;
}

static dev_op_def slice_def = {
    .name = "Slice",
    .num_inputs = 1,
    .inputs = {{"input", false, 0, DEV_MASK_ALL}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as input"}},
    .num_attrs = 2,
    .attrs = {{"begin",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_NONE},
               .doc = "the first index on each axis, 0..dim",
               .has_min = true,
               .min = 0},
              {"size",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_NONE},
               .doc = "the extent on each axis; -1: to the end",
               .has_min = true,
               .min = -1}},
    .infer = slice_infer,
    .kernels = {slice_kernel, NULL},
    .summary = "output = input[begin[i] : begin[i] + size[i]] on every axis i.",
    .notes =
        "Differs from tf.raw_ops.Slice: TF takes `begin` and `size` as "
        "input tensors; here they are int-list attributes with one "
        "entry per axis (size -1 as in TF).",
};

/* ------------------------------------------------------------------------ */
/* Gather (TF GatherV2 with batch_dims = 0, axis as attribute):
 * output = params[:axis] + indices.shape + params[axis+1:].                 */

enum { GATHER_AXIS = 0 };

static pd_code gather_infer(dev_infer_ctx *c, dev_status *st) {
  const dev_shape *ps = &c->in_shape[0], *is = &c->in_shape[1];
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK)
    return st->code;
  if (dev_check_dtype_in(c, 1,
                         DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64),
                         "int32 or int64", st) != PD_OK)
    return st->code;
  if (dev_check_rank(c, 0, 1, PD_MAX_RANK, st) != PD_OK) return st->code;
  int axis;
  if (dev_normalize_axis(c, "axis", c->attrs[GATHER_AXIS].u.i, ps->rank, &axis,
                         st) != PD_OK)
    return st->code;
  int rank = ps->rank - 1 + is->rank;
  char sa[160], sb[160];
  if (rank > PD_MAX_RANK)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "Gather: params of shape %s and indices of shape %s give an "
        "output of rank %d; expected at most %d",
        dev_shape_str(ps, sa, sizeof sa), dev_shape_str(is, sb, sizeof sb),
        rank, PD_MAX_RANK);
  dev_shape out;
  out.rank = rank;
  int o = 0;
  for (int d = 0; d < axis; d++) out.dims[o++] = ps->dims[d];
  for (int d = 0; d < is->rank; d++) out.dims[o++] = is->dims[d];
  for (int d = axis + 1; d < ps->rank; d++) out.dims[o++] = ps->dims[d];
  if (dev_check_out_size(c, c->in_dtype[0], &out, st) != PD_OK) return st->code;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

/* Formats flat index i of `s` as "[1,2]" (TF's style) or "" for a scalar. */
static void multi_index_str(const dev_shape *s, int64_t i, char *buf,
                            size_t len) {
  int64_t idx[PD_MAX_RANK];
  for (int d = s->rank - 1; d >= 0; d--) {
    idx[d] = s->dims[d] ? i % s->dims[d] : 0;
    i = s->dims[d] ? i / s->dims[d] : 0;
  }
  buf[0] = '\0';
  if (s->rank == 0) return;
  size_t off = 0;
  for (int d = 0; d < s->rank; d++) {
    int w = snprintf(buf + off, len - off, "%s%lld", d ? "," : "[",
                     (long long)idx[d]);
    if (w < 0 || (size_t)w >= len - off) return;
    off += (size_t)w;
  }
  snprintf(buf + off, len - off, "]");
}

static pd_code gather_bad_index(dev_kernel_ctx *c, int64_t i, int64_t v,
                                int64_t n, dev_status *st) {
  char ib[160];
  multi_index_str(&c->in_shape[1], i, ib, sizeof ib);
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "Gather: indices%s = %lld is not in [0, %lld)", ib,
                   (long long)v, (long long)n);
}

static pd_code gather_kernel(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *ps = &c->in_shape[0];
  int64_t a = c->attrs[GATHER_AXIS].u.i;
  int axis = (int)(a < 0 ? a + ps->rank : a);
  int64_t outer = dev_dims_prod(ps, 0, axis), n = ps->dims[axis];
  size_t inner = (size_t)dev_dims_prod(ps, axis + 1, ps->rank) *
                 pd_dtype_size(c->in_dtype[0]);
  int64_t ni = dev_num_elems(&c->in_shape[1]);
  bool i64 = c->in_dtype[1] == PD_INT64;
  const int32_t *ix32 = c->in_data[1];
  const int64_t *ix64 = c->in_data[1];
  /* Validate every index first: a bad index fails the op as TF does. */
  for (int64_t i = 0; i < ni; i++) {
    int64_t v = i64 ? ix64[i] : ix32[i];
    if (v < 0 || v >= n) return gather_bad_index(c, i, v, n, st);
  }
  if (inner == 0 || outer == 0 || ni == 0) return PD_OK;
  const char *src = c->in_data[0];
  char *dst = c->out_data[0];
  for (int64_t o = 0; o < outer; o++) {
    const char *base = src + (size_t)(o * n) * inner;
    if (i64) {
      for (int64_t i = 0; i < ni; i++, dst += inner)
        memcpy(dst, base + (size_t)ix64[i] * inner, inner);
    } else {
      for (int64_t i = 0; i < ni; i++, dst += inner)
        memcpy(dst, base + (size_t)ix32[i] * inner, inner);
    }
  }
  return PD_OK;
}

static dev_op_def gather_def = {
    .name = "Gather",
    .num_inputs = 2,
    .inputs = {{"params", false, 0, DEV_MASK_ALL, NULL, "rank >= 1"},
               {"indices", false, 0,
                DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64)}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as params"}},
    .num_attrs = 1,
    .attrs = {{"axis",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_INT, .u.i = 0},
               .doc = "the axis of params to index; -rank..rank-1"}},
    .infer = gather_infer,
    .kernels = {gather_kernel, NULL},
    .summary =
        "output = params indexed by indices along `axis`: shape "
        "params[:axis] + indices.shape + params[axis+1:].",
    .notes =
        "Follows tf.raw_ops.GatherV2 with batch_dims = 0 and `axis` an "
        "int attribute rather than an input tensor; tf.raw_ops.Gather "
        "of the same name has no axis (and a validate_indices "
        "attribute, absent here).",
};

/* ------------------------------------------------------------------------ */
/* OneHot (TF OneHot, depth/on_value/off_value as attributes): the new axis
 * of size depth goes at `axis` (-1: last); indices outside [0, depth) give
 * a row of off_value.                                                       */

enum { ONEHOT_DEPTH, ONEHOT_ON, ONEHOT_OFF, ONEHOT_AXIS, ONEHOT_DTYPE };

static pd_code onehot_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0,
                         DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64) |
                             DEV_DTYPE_BIT(PD_UINT8),
                         "int32, int64 or uint8", st) != PD_OK)
    return st->code;
  const dev_shape *in = &c->in_shape[0];
  int64_t depth = c->attrs[ONEHOT_DEPTH].u.i;
  int64_t axis = c->attrs[ONEHOT_AXIS].u.i;
  pd_dtype dt = c->attrs[ONEHOT_DTYPE].u.dtype;
  if (depth < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "OneHot: attribute 'depth' is %lld; expected >= 0",
                     (long long)depth);
  if (!(DEV_MASK_NUMBER & DEV_DTYPE_BIT(dt)))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "OneHot: attribute 'dtype' is %s; expected a number dtype "
        "(float32, float64, float16, bfloat16, int32, int64, uint8)",
        pd_dtype_name(dt));
  if (in->rank + 1 > PD_MAX_RANK) {
    char sb[160];
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "OneHot: input 'indices' has shape %s (rank %d); expected rank "
        "at most %d",
        dev_shape_str(in, sb, sizeof sb), in->rank, PD_MAX_RANK - 1);
  }
  if (axis < -1 || axis > in->rank)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "OneHot: attribute 'axis' is %lld; expected -1 or 0..%d for "
        "indices of rank %d",
        (long long)axis, in->rank, in->rank);
  int ax = axis == -1 ? in->rank : (int)axis;
  dev_shape out;
  out.rank = in->rank + 1;
  for (int d = 0, o = 0; d < out.rank; d++)
    out.dims[d] = d == ax ? depth : in->dims[o++];
  if (dev_check_out_size(c, dt, &out, st) != PD_OK) return st->code;
  c->out_dtype[0] = dt;
  c->out_shape[0] = out;
  return PD_OK;
}

/* double -> float with IEEE overflow to +-inf, never C undefined behaviour. */
static float d2f(double v) {
  if (v > FLT_MAX) return v < 0x1.ffffffp127 ? FLT_MAX : INFINITY;
  if (v < -FLT_MAX) return v > -0x1.ffffffp127 ? -FLT_MAX : -INFINITY;
  return (float)v;
}

/* Converts v to one element of dt in *out (8 bytes of room): floats round to
 * nearest even, integers truncate and saturate, NaN -> 0. */
static void store_scalar(pd_dtype dt, double v, void *out) {
  switch (dt) {
    case PD_FLOAT32: {
      float f = d2f(v);
      memcpy(out, &f, 4);
      break;
    }
    case PD_FLOAT64: memcpy(out, &v, 8); break;
    case PD_FLOAT16: {
      uint16_t h = dev_float_to_half(d2f(v));
      memcpy(out, &h, 2);
      break;
    }
    case PD_BFLOAT16: {
      uint16_t h = dev_float_to_bfloat16(d2f(v));
      memcpy(out, &h, 2);
      break;
    }
    case PD_INT32: {
      int32_t x = isnan(v)             ? 0
                  : v >= 2147483647.0  ? INT32_MAX
                  : v <= -2147483648.0 ? INT32_MIN
                                       : (int32_t)v;
      memcpy(out, &x, 4);
      break;
    }
    case PD_INT64: {
      int64_t x = isnan(v)       ? 0
                  : v >= 0x1p63  ? INT64_MAX
                  : v <= -0x1p63 ? INT64_MIN
                                 : (int64_t)v;
      memcpy(out, &x, 8);
      break;
    }
    case PD_UINT8: {
      uint8_t x = isnan(v) ? 0 : v >= 255.0 ? 255 : v <= 0.0 ? 0 : (uint8_t)v;
      memcpy(out, &x, 1);
      break;
    }
    case PD_BOOL: {
      uint8_t x = v != 0.0;
      memcpy(out, &x, 1);
      break;
    }
    default: break;
  }
}

static inline int64_t load_index(pd_dtype dt, const void *p, int64_t i) {
  switch (dt) {
    case PD_INT32: return ((const int32_t *)p)[i];
    case PD_INT64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
  }
}

#define DEFINE_ONEHOT(NAME, T)                                                 \
  static void NAME(const void *ind, pd_dtype idt, void *out_, int64_t outer,   \
                   int64_t depth, int64_t inner, const void *on_,              \
                   const void *off_) {                                         \
    T on, off;                                                                 \
    memcpy(&on, on_, sizeof on);                                               \
    memcpy(&off, off_, sizeof off);                                            \
    T *out = (T *)out_;                                                        \
    int64_t total = outer * depth * inner;                                     \
    for (int64_t i = 0; i < total; i++) out[i] = off;                          \
    for (int64_t o = 0; o < outer; o++)                                        \
      for (int64_t i = 0; i < inner; i++) {                                    \
        int64_t v = load_index(idt, ind, o * inner + i);                       \
        if (v >= 0 && v < depth) out[(o * depth + v) * inner + i] = on;        \
      }                                                                        \
  }

DEFINE_ONEHOT(onehot_1, uint8_t)
DEFINE_ONEHOT(onehot_2, uint16_t)
DEFINE_ONEHOT(onehot_4, uint32_t)
DEFINE_ONEHOT(onehot_8, uint64_t)

static pd_code onehot_kernel(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *in = &c->in_shape[0];
  int64_t depth = c->attrs[ONEHOT_DEPTH].u.i;
  int64_t axis = c->attrs[ONEHOT_AXIS].u.i;
  int ax = axis == -1 ? in->rank : (int)axis;
  pd_dtype dt = c->out_dtype[0];
  int64_t outer = dev_dims_prod(in, 0, ax),
          inner = dev_dims_prod(in, ax, in->rank);
  uint64_t on = 0, off = 0;
  store_scalar(dt, c->attrs[ONEHOT_ON].u.f, &on);
  store_scalar(dt, c->attrs[ONEHOT_OFF].u.f, &off);
  switch (pd_dtype_size(dt)) {
    case 1:
      onehot_1(c->in_data[0], c->in_dtype[0], c->out_data[0], outer, depth,
               inner, &on, &off);
      break;
    case 2:
      onehot_2(c->in_data[0], c->in_dtype[0], c->out_data[0], outer, depth,
               inner, &on, &off);
      break;
    case 4:
      onehot_4(c->in_data[0], c->in_dtype[0], c->out_data[0], outer, depth,
               inner, &on, &off);
      break;
    default:
      onehot_8(c->in_data[0], c->in_dtype[0], c->out_data[0], outer, depth,
               inner, &on, &off);
      break;
  }
  (void)st;
  return PD_OK;
}

static dev_op_def onehot_def = {
    .name = "OneHot",
    .num_inputs = 1,
    .inputs = {{"indices", false, 0,
                DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64) |
                    DEV_DTYPE_BIT(PD_UINT8)}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_NUMBER, "the attribute dtype"}},
    .num_attrs = 5,
    .attrs = {{"depth",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_NONE},
               .doc = "the size of the new axis",
               .has_min = true,
               .min = 0},
              {"on_value",
               DEV_ATTR_FLOAT,
               {.type = DEV_ATTR_FLOAT, .u.f = 1.0},
               .doc = "the value at each index"},
              {"off_value",
               DEV_ATTR_FLOAT,
               {.type = DEV_ATTR_FLOAT, .u.f = 0.0},
               .doc = "the value elsewhere"},
              {"axis",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_INT, .u.i = -1},
               .doc = "where the new axis goes: -1 (last) or 0..rank"},
              {"dtype",
               DEV_ATTR_DTYPE,
               {.type = DEV_ATTR_DTYPE, .u.dtype = PD_FLOAT32},
               .doc = "the output's dtype (a number dtype)"}},
    .infer = onehot_infer,
    .kernels = {onehot_kernel, NULL},
    .summary =
        "A one-hot encoding of indices: a new axis of size depth at "
        "`axis`, on_value at each index and off_value elsewhere.",
    .notes =
        "Differs from tf.raw_ops.OneHot: TF takes `depth`, `on_value` "
        "and `off_value` as input tensors (T is on_value's dtype); here "
        "`depth` is an int attribute, `on_value` / `off_value` float "
        "attributes and `dtype` (TF: T) an attribute. Indices outside "
        "[0, depth) give a row of off_value, as in TF.",
};

/* Registers Concat, Slice, Gather and OneHot and their CPU kernels (called
 * by dev_registry_init). */
void dev_register_slicing_ops(void) {
  dev__register_or_die(&concat_def);
  dev__register_or_die(&slice_def);
  dev__register_or_die(&gather_def);
  dev__register_or_die(&onehot_def);
}
