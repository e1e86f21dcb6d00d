/* Array ops with a list of outputs or of inputs along one axis: Split,
 * SplitV, Unpack (a list output each) and Pack (a list input).
 *
 * Semantics follow the TensorFlow raw ops of the same names with the axis
 * and sizes given as attributes rather than tensors (as Concat takes its
 * axis): Split splits `value` into num_split equal parts along `axis`,
 * SplitV into parts of size_splits (one -1 takes the rest), Unpack (tf.unstack)
 * into num rank-1 slices, and Pack (tf.stack) joins N same-shape tensors
 * along a new axis. On a sharded input each component splits its own shape,
 * so every check is per component and its message names the component.
 * Kernels copy contiguous runs with memcpy, by element size. */
#include <stdio.h>
#include <string.h>

#include "device_int.h"

/* " (component d)" on a mesh of several devices, "" otherwise. */
static const char *comp_str(const dev_infer_ctx *c, char *buf, size_t len) {
  if (c->num_devices <= 1)
    buf[0] = '\0';
  else
    snprintf(buf, len, " (component %d)", c->device);
  return buf;
}

static pd_code check_count(const dev_infer_ctx *c, const char *attr, int64_t n,
                           dev_status *st) {
  if (n < 1 || n > DEV_MAX_OUTPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: attribute '%s' is %lld; expected 1..%d (the limit "
                     "of outputs of one op)",
                     c->op->name, attr, (long long)n, DEV_MAX_OUTPUTS);
  return PD_OK;
}

/* Checks the input (rank >= 1, any dtype) and normalizes attribute `axis`. */
static pd_code split_input(dev_infer_ctx *c, int axis_attr, int *axis,
                           dev_status *st) {
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK)
    return st->code;
  if (c->in_shape[0].rank == 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: input 'value' is a scalar; expected rank >= 1",
                     c->op->name);
  return dev_normalize_axis(c, "axis", c->attrs[axis_attr].u.i,
                            c->in_shape[0].rank, axis, st);
}

/* Writes n outputs of the input's dtype and shape with dims[axis] set to
 * sizes[k] (or dropped when `drop`, for Unpack). */
static void set_parts(dev_infer_ctx *c, int axis, int n, const int64_t *sizes,
                      bool drop) {
  const dev_shape *in = &c->in_shape[0];
  c->num_outputs = n;
  for (int k = 0; k < n; k++) {
    dev_shape s = *in;
    if (drop) {
      for (int d = axis; d + 1 < in->rank; d++) s.dims[d] = in->dims[d + 1];
      s.rank = in->rank - 1;
    } else {
      s.dims[axis] = sizes ? sizes[k] : in->dims[axis] / n;
    }
    c->out_dtype[k] = c->in_dtype[0];
    c->out_shape[k] = s;
  }
}

/* ------------------------------------------------------------------------ */
/* Split (TF Split, split_dim as attribute `axis`).                          */

enum { SPLIT_AXIS = 0, SPLIT_NUM = 1 };

static pd_code split_infer(dev_infer_ctx *c, dev_status *st) {
  int axis;
  char cs[32], sa[160];
  PD_TRY(split_input(c, SPLIT_AXIS, &axis, st));
  int64_t n = c->attrs[SPLIT_NUM].u.i;
  PD_TRY(check_count(c, "num_split", n, st));
  const dev_shape *in = &c->in_shape[0];
  if (in->dims[axis] % n != 0)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "Split: input 'value'%s has shape %s whose dim %lld on axis %d is not "
        "divisible by num_split %lld; expected a multiple of num_split%s",
        comp_str(c, cs, sizeof cs), dev_shape_str(in, sa, sizeof sa),
        (long long)in->dims[axis], axis, (long long)n,
        c->num_devices > 1 ? " on every component (each component splits "
                             "its own shard)"
                           : "");
  set_parts(c, axis, (int)n, NULL, false);
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* SplitV (TF SplitV, size_splits and split_dim as attributes).              */

enum { SPLITV_SIZES = 0, SPLITV_AXIS = 1 };

static pd_code splitv_infer(dev_infer_ctx *c, dev_status *st) {
  int axis;
  char cs[32], sa[160];
  PD_TRY(split_input(c, SPLITV_AXIS, &axis, st));
  const dev_attr_value *z = &c->attrs[SPLITV_SIZES];
  PD_TRY(check_count(c, "size_splits' length", z->u.ilist.n, st));
  const dev_shape *in = &c->in_shape[0];
  const int64_t dim = in->dims[axis];
  int64_t sizes[DEV_MAX_OUTPUTS], sum = 0;
  int fill = -1;
  bool over = false;
  for (int k = 0; k < z->u.ilist.n && !over; k++) {
    int64_t v = z->u.ilist.v[k];
    sizes[k] = v;
    if (v == -1 && fill < 0) {
      fill = k;
      continue;
    }
    if (v < 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "SplitV: attribute 'size_splits' has %lld at index %d; "
                       "expected sizes >= 0 with at most one -1",
                       (long long)v, k);
    if (v > dim - sum)
      over = true;
    else
      sum += v;
  }
  if (over || (fill < 0 && sum != dim))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "SplitV: attribute 'size_splits' sums to %s%lld but input 'value'%s "
        "has shape %s with dim %lld on axis %d; expected the sizes to sum to "
        "that dim%s",
        over ? "more than " : "", (long long)(over ? dim : sum),
        comp_str(c, cs, sizeof cs), dev_shape_str(in, sa, sizeof sa),
        (long long)dim, axis, fill < 0 ? "" : " or less (one size is -1)");
  if (fill >= 0) sizes[fill] = dim - sum;
  set_parts(c, axis, z->u.ilist.n, sizes, false);
  return PD_OK;
}

/* The kernel of Split and SplitV: output k takes the next
 * out_shape[k].dims[axis] slices of each outer block. */
static pd_code split_parts(dev_kernel_ctx *c, int64_t a) {
  const dev_shape *in = &c->in_shape[0];
  int axis = (int)(a < 0 ? a + in->rank : a);
  size_t es = pd_dtype_size(c->in_dtype[0]);
  int64_t outer = dev_dims_prod(in, 0, axis);
  int64_t inner = dev_dims_prod(in, axis + 1, in->rank);
  size_t in_run = (size_t)(in->dims[axis] * inner) * es;
  if (in_run == 0 || outer == 0) return PD_OK;
  const char *src = c->in_data[0];
  size_t off = 0;
  for (int k = 0; k < c->num_outputs; k++) {
    size_t run = (size_t)(c->out_shape[k].dims[axis] * inner) * es;
    if (run == 0) continue;
    char *dst = c->out_data[k];
    for (int64_t o = 0; o < outer; o++)
      memcpy(dst + (size_t)o * run, src + (size_t)o * in_run + off, run);
    off += run;
  }
  return PD_OK;
}

static pd_code split_kernel(dev_kernel_ctx *c, dev_status *st) {
  (void)st;
  return split_parts(c, c->attrs[SPLIT_AXIS].u.i);
}

static pd_code splitv_kernel(dev_kernel_ctx *c, dev_status *st) {
  (void)st;
  return split_parts(c, c->attrs[SPLITV_AXIS].u.i);
}

/* ------------------------------------------------------------------------ */
/* Unpack (TF Unpack, tf.unstack).                                           */

enum { UNPACK_NUM = 0, UNPACK_AXIS = 1 };

static pd_code unpack_infer(dev_infer_ctx *c, dev_status *st) {
  int axis;
  char cs[32], sa[160];
  PD_TRY(split_input(c, UNPACK_AXIS, &axis, st));
  int64_t n = c->attrs[UNPACK_NUM].u.i;
  PD_TRY(check_count(c, "num", n, st));
  const dev_shape *in = &c->in_shape[0];
  if (in->dims[axis] != n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Unpack: attribute 'num' is %lld but input 'value'%s has "
                     "shape %s with dim %lld on axis %d; expected num to "
                     "equal that dim",
                     (long long)n, comp_str(c, cs, sizeof cs),
                     dev_shape_str(in, sa, sizeof sa),
                     (long long)in->dims[axis], axis);
  set_parts(c, axis, (int)n, NULL, true);
  return PD_OK;
}

static pd_code unpack_kernel(dev_kernel_ctx *c, dev_status *st) {
  (void)st;
  const dev_shape *in = &c->in_shape[0];
  int64_t a = c->attrs[UNPACK_AXIS].u.i;
  int axis = (int)(a < 0 ? a + in->rank : a);
  size_t es = pd_dtype_size(c->in_dtype[0]);
  int64_t outer = dev_dims_prod(in, 0, axis);
  size_t run = (size_t)dev_dims_prod(in, axis + 1, in->rank) * es;
  size_t in_run = run * (size_t)c->num_outputs;
  if (run == 0 || outer == 0) return PD_OK;
  const char *src = c->in_data[0];
  for (int k = 0; k < c->num_outputs; k++) {
    char *dst = c->out_data[k];
    for (int64_t o = 0; o < outer; o++)
      memcpy(dst + (size_t)o * run, src + (size_t)o * in_run + k * run, run);
  }
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Pack (TF Pack, tf.stack).                                                 */

enum { PACK_AXIS = 0 };

static pd_code pack_infer(dev_infer_ctx *c, dev_status *st) {
  char cs[32], sa[160], sb[160];
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK)
    return st->code;
  const dev_shape *s0 = &c->in_shape[0];
  if (s0->rank >= PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Pack: input 'values[0]' has rank %d; expected below %d "
                     "(the output has one more axis, at most %d)",
                     s0->rank, PD_MAX_RANK, PD_MAX_RANK);
  int axis;
  PD_TRY(dev_normalize_axis(c, "axis", c->attrs[PACK_AXIS].u.i, s0->rank + 1,
                            &axis, st));
  for (int k = 1; k < c->num_inputs; k++) {
    PD_TRY(dev_check_same_dtype(c, 0, k, st));
    if (!dev_shape_equal(&c->in_shape[k], s0))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Pack: input 'values[%d]'%s has shape %s but "
                       "'values[0]' has shape %s; expected equal shapes",
                       k, comp_str(c, cs, sizeof cs),
                       dev_shape_str(&c->in_shape[k], sa, sizeof sa),
                       dev_shape_str(s0, sb, sizeof sb));
  }
  dev_shape out = {.rank = s0->rank + 1};
  for (int d = 0, j = 0; d < out.rank; d++)
    out.dims[d] = d == axis ? c->num_inputs : s0->dims[j++];
  PD_TRY(dev_check_out_size(c, c->in_dtype[0], &out, st));
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

static pd_code pack_kernel(dev_kernel_ctx *c, dev_status *st) {
  (void)st;
  const dev_shape *s0 = &c->in_shape[0];
  int64_t a = c->attrs[PACK_AXIS].u.i;
  int axis = (int)(a < 0 ? a + s0->rank + 1 : a);
  size_t es = pd_dtype_size(c->in_dtype[0]);
  int64_t outer = dev_dims_prod(s0, 0, axis);
  size_t run = (size_t)dev_dims_prod(s0, axis, s0->rank) * es;
  if (run == 0 || outer == 0) return PD_OK;
  char *dst = c->out_data[0];
  for (int64_t o = 0; o < outer; o++)
    for (int k = 0; k < c->num_inputs; k++) {
      memcpy(dst, (const char *)c->in_data[k] + (size_t)o * run, run);
      dst += run;
    }
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Definitions                                                               */

#define AXIS_DOC "the axis to split along; -rank..rank-1"
#define COUNT_MAX                                                              \
  .has_min = true, .min = 1, .has_max = true, .max = DEV_MAX_OUTPUTS

static dev_op_def split_def = {
    .name = "Split",
    .num_inputs = 1,
    .inputs = {{"value", false, 1, DEV_MASK_ALL, NULL, "rank >= 1"}},
    .num_outputs = 1,
    .outputs = {{"output", true, 1, DEV_MASK_ALL, "same as value",
                 "num_split parts, dims[axis] / num_split each", "num_split"}},
    .num_attrs = 2,
    .attrs = {{"axis", DEV_ATTR_INT, {.type = DEV_ATTR_NONE}, .doc = AXIS_DOC},
              {"num_split",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_NONE},
               .doc = "the number of outputs; divides dims[axis]",
               COUNT_MAX}},
    .infer = split_infer,
    .kernels = {split_kernel, NULL},
    .summary =
        "output = `num_split` equal parts of `value` along `axis` (as "
        "numpy.split with an int).",
    .notes =
        "Follows tf.raw_ops.Split with `split_dim` the int attribute "
        "`axis` rather than an input tensor. A sharded `value` splits "
        "each component's own shape: dims[axis] must be divisible on "
        "every component.",
};

static dev_op_def splitv_def = {
    .name = "SplitV",
    .num_inputs = 1,
    .inputs = {{"value", false, 1, DEV_MASK_ALL, NULL, "rank >= 1"}},
    .num_outputs = 1,
    .outputs = {{"output", true, 1, DEV_MASK_ALL, "same as value",
                 "one part per size_splits entry", "size_splits"}},
    .num_attrs = 2,
    .attrs = {{"size_splits",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_NONE},
               .doc = "the parts' sizes along axis, summing to dims[axis]; "
                      "one may be -1 (the rest)",
               .has_min = true,
               .min = -1},
              {"axis", DEV_ATTR_INT, {.type = DEV_ATTR_NONE}, .doc = AXIS_DOC}},
    .infer = splitv_infer,
    .kernels = {splitv_kernel, NULL},
    .summary =
        "output = the parts of `value` along `axis` of sizes "
        "`size_splits` (one -1 takes the rest).",
    .notes =
        "Follows tf.raw_ops.SplitV with `size_splits` and `split_dim` "
        "(here `axis`) attributes rather than input tensors; the number "
        "of outputs is the length of `size_splits`. A sharded `value` "
        "splits each component's own shape.",
};

static dev_op_def unpack_def = {
    .name = "Unpack",
    .num_inputs = 1,
    .inputs = {{"value", false, 1, DEV_MASK_ALL, NULL, "rank >= 1"}},
    .num_outputs = 1,
    .outputs = {{"output", true, 1, DEV_MASK_ALL, "same as value",
                 "num slices of rank - 1, axis removed", "num"}},
    .num_attrs = 2,
    .attrs = {{"num",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_NONE},
               .doc = "the number of outputs; equals dims[axis]",
               COUNT_MAX},
              {"axis",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_INT, .u.i = 0},
               .doc = "the axis to unstack along; -rank..rank-1"}},
    .infer = unpack_infer,
    .kernels = {unpack_kernel, NULL},
    .summary =
        "output = the `num` slices of `value` along `axis` (as "
        "tf.unstack).",
    .notes =
        "Follows tf.raw_ops.Unpack, with num >= 1 (TensorFlow allows 0). "
        "A sharded `value` must have dims[axis] == num on every "
        "component.",
};

static dev_op_def pack_def = {
    .name = "Pack",
    .num_inputs = 1,
    .inputs = {{"values", true, 1, DEV_MASK_ALL, "one dtype for all",
                "tensors of one shape"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 1, DEV_MASK_ALL, "same as values",
                 "rank + 1, N on axis"}},
    .num_attrs = 1,
    .attrs = {{"axis",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_INT, .u.i = 0},
               .doc = "the new axis; -(rank+1)..rank"}},
    .infer = pack_infer,
    .kernels = {pack_kernel, NULL},
    .summary =
        "output = the N `values` stacked along a new axis `axis` (as "
        "numpy.stack).",
    .notes =
        "Follows tf.raw_ops.Pack (tf.stack); N is the number of "
        "inputs.",
};

void dev_register_split_pack_ops(void) {
  dev__register_or_die(&split_def);
  dev__register_or_die(&splitv_def);
  dev__register_or_die(&unpack_def);
  dev__register_or_die(&pack_def);
}
