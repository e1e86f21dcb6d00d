/* Gradient ops: what the gradient tape's vector-Jacobian products (tape.c)
 * need beyond the forward ops.
 *
 *  ReluGrad, SqrtGrad, RsqrtGrad, TanhGrad, SigmoidGrad
 *      TensorFlow raw ops of the same names (same inputs, same formulas).
 *  BroadcastToLike, SumToLike, ReshapeLike
 *      paradev's own (SliceGrad, ConcatGrad and GatherGrad, the gradients of
 *      taking parts, are in grad_parts.c). TensorFlow's gradients take shapes from tensors computed
 *      at run time (Shape, BroadcastGradientArgs, ConcatOffset). Here a
 *      component's shape is known at preparation, but the components of one
 *      parallel tensor may differ in shape (uneven shards), so a single shape
 *      attribute cannot describe them all. These ops therefore take a `like`
 *      input and read only its per-component SHAPE, never its data (the tape
 *      passes the forward op's input; its buffers are not touched).
 *
 * Kernels work on float32 and float64 directly; float16 and bfloat16 are
 * widened to float32 scratch and rounded back to nearest even, as the other
 * op files do. Ops that only move bytes (BroadcastToLike without `mean`,
 * ReshapeLike, SliceGrad, ConcatGrad) take every dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"

/* ------------------------------------------------------------------------ */
/* Shared helpers                                                            */

/* Copies n elements of es bytes from src[i*sstride] to dst[i] (sstride 0
 * repeats one element). */
static void copy_strided(char *dst, const char *src, int64_t n, int64_t sstride,
                         size_t es) {
  if (sstride == 1) {
    memcpy(dst, src, (size_t)n * es);
    return;
  }
  switch (es) {
    case 1: {
      uint8_t v = *(const uint8_t *)src;
      memset(dst, v, (size_t)n);
      break;
    }
    case 2: {
      uint16_t v;
      memcpy(&v, src, 2);
      for (int64_t i = 0; i < n; i++) memcpy(dst + 2 * i, &v, 2);
      break;
    }
    case 4: {
      uint32_t v;
      memcpy(&v, src, 4);
      for (int64_t i = 0; i < n; i++) memcpy(dst + 4 * i, &v, 4);
      break;
    }
    default: {
      uint64_t v;
      memcpy(&v, src, 8);
      for (int64_t i = 0; i < n; i++) memcpy(dst + 8 * i, &v, 8);
      break;
    }
  }
}

/* ------------------------------------------------------------------------ */
/* ReluGrad, SqrtGrad, RsqrtGrad, TanhGrad, SigmoidGrad                      */
/* (TensorFlow raw ops): both inputs of one floating dtype and one shape.
 *   ReluGrad(gradients, features) = gradients * (features > 0)
 *   SqrtGrad(y, dy)    = dy * 0.5 / y          (y = sqrt(x))
 *   RsqrtGrad(y, dy)   = dy * -0.5 * y^3       (y = 1/sqrt(x))
 *   TanhGrad(y, dy)    = dy * (1 - y^2)        (y = tanh(x))
 *   SigmoidGrad(y, dy) = dy * y * (1 - y)      (y = sigmoid(x))             */

enum { EG_RELU, EG_SQRT, EG_RSQRT, EG_TANH, EG_SIGMOID };

static pd_code eg_infer(dev_infer_ctx *c, dev_status *st) {
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, DEV_MASK_FLOAT, NULL, st)) ||
      (rc = dev_check_same_dtype(c, 0, 1, st)))
    return rc;
  if (!dev_shape_equal(&c->in_shape[0], &c->in_shape[1])) {
    char a[160], b[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: input '%s' has shape %s but input '%s' has shape %s; "
                     "expected the same "
                     "shape (no broadcasting)",
                     c->op->name, c->op->inputs[0].name,
                     dev_shape_str(&c->in_shape[0], a, sizeof a),
                     c->op->inputs[1].name,
                     dev_shape_str(&c->in_shape[1], b, sizeof b));
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[0];
  return PD_OK;
}

#define EG_LOOPS(T)                                                            \
  switch (kind) {                                                              \
    case EG_RELU:                                                              \
      for (int64_t i = 0; i < n; i++) o[i] = b[i] > (T)0 ? a[i] : (T)0;        \
      break;                                                                   \
    case EG_SQRT:                                                              \
      for (int64_t i = 0; i < n; i++) o[i] = b[i] * (T)0.5 / a[i];             \
      break;                                                                   \
    case EG_RSQRT:                                                             \
      for (int64_t i = 0; i < n; i++)                                          \
        o[i] = (T)-0.5 * (a[i] * a[i] * a[i]) * b[i];                          \
      break;                                                                   \
    case EG_TANH:                                                              \
      for (int64_t i = 0; i < n; i++) o[i] = b[i] * ((T)1 - a[i] * a[i]);      \
      break;                                                                   \
    default:                                                                   \
      for (int64_t i = 0; i < n; i++) o[i] = b[i] * a[i] * ((T)1 - a[i]);      \
      break;                                                                   \
  }

static void eg_f32(int kind, const float *a, const float *b, float *o,
                   int64_t n) {
  EG_LOOPS(float)
}
static void eg_f64(int kind, const double *a, const double *b, double *o,
                   int64_t n) {
  EG_LOOPS(double)
}

static pd_code eg_kernel(dev_kernel_ctx *c, int kind, dev_status *st) {
  int64_t n = dev_num_elems(&c->out_shape[0]);
  if (n == 0) return PD_OK;
  pd_dtype dt = c->out_dtype[0];
  if (dt == PD_FLOAT32) {
    eg_f32(kind, c->in_data[0], c->in_data[1], c->out_data[0], n);
  } else if (dt == PD_FLOAT64) {
    eg_f64(kind, c->in_data[0], c->in_data[1], c->out_data[0], n);
  } else {
    float *buf = dev__scratch_f32(3 * n);
    if (!buf) return dev__scratch_error(c, 3 * n, st);
    dev__widen_16(dt, c->in_data[0], buf, n);
    dev__widen_16(dt, c->in_data[1], buf + n, n);
    eg_f32(kind, buf, buf + n, buf + 2 * n, n);
    dev__narrow_16(dt, buf + 2 * n, c->out_data[0], n);
    free(buf);
  }
  return PD_OK;
}

static pd_code relu_grad_cpu(dev_kernel_ctx *c, dev_status *st) {
  return eg_kernel(c, EG_RELU, st);
}
static pd_code sqrt_grad_cpu(dev_kernel_ctx *c, dev_status *st) {
  return eg_kernel(c, EG_SQRT, st);
}
static pd_code rsqrt_grad_cpu(dev_kernel_ctx *c, dev_status *st) {
  return eg_kernel(c, EG_RSQRT, st);
}
static pd_code tanh_grad_cpu(dev_kernel_ctx *c, dev_status *st) {
  return eg_kernel(c, EG_TANH, st);
}
static pd_code sigmoid_grad_cpu(dev_kernel_ctx *c, dev_status *st) {
  return eg_kernel(c, EG_SIGMOID, st);
}

#define EG_DEF(NAME, IN0, IN1, OUT, KERNEL, SUMMARY)                           \
  {                                                                            \
    .name = NAME, .num_inputs = 2,                                             \
    .inputs = {{IN0, false, 0, DEV_MASK_FLOAT},                                \
               {IN1, false, 0, DEV_MASK_FLOAT, "same as " IN0}},               \
    .num_outputs = 1,                                                          \
    .outputs = {{OUT, false, 0, DEV_MASK_FLOAT, "same as " IN0}},              \
    .infer = eg_infer, .kernels = {[DEV_BACKEND_CPU] = KERNEL},                \
    .summary = SUMMARY,                                                        \
  }

static dev_op_def eg_defs[] = {
    EG_DEF("ReluGrad", "gradients", "features", "backprops", relu_grad_cpu,
           "backprops = gradients * (features > 0): the gradient of Relu."),
    EG_DEF("SqrtGrad", "y", "dy", "z", sqrt_grad_cpu,
           "z = dy * 0.5 / y, where y = sqrt(x): the gradient of Sqrt."),
    EG_DEF("RsqrtGrad", "y", "dy", "z", rsqrt_grad_cpu,
           "z = dy * -0.5 * y^3, where y = rsqrt(x): the gradient of Rsqrt."),
    EG_DEF("TanhGrad", "y", "dy", "z", tanh_grad_cpu,
           "z = dy * (1 - y^2), where y = tanh(x): the gradient of Tanh."),
    EG_DEF("SigmoidGrad", "y", "dy", "z", sigmoid_grad_cpu,
           "z = dy * y * (1 - y), where y = sigmoid(x): the gradient of "
           "Sigmoid."),
};

#define LIKE_NOTES                                                             \
  "paradev's own (no tf.raw_ops op of this name): TensorFlow's gradients "     \
  "take shapes from tensors computed at run time; here `like` gives each "     \
  "component's shape (its data is never read), so uneven shards work."

/* ------------------------------------------------------------------------ */
/* BroadcastToLike(input, like; axis = [], mean = false)                     */
/* output has like's shape: input broadcast to it as NumPy does. With `axis`
 * (the adjoint of a reduction without keep_dims) input's shape is like's with
 * those axes removed, and size-1 axes are put back there first. With `mean`
 * every element is divided by how many output elements each input element
 * fills (the adjoint of Mean). Every dtype; `mean` needs a floating one.    */

enum { BTL_AXIS = 0, BTL_MEAN = 1 };

/* Writes input's shape as aligned with like (rank like->rank). `op` names the
 * op in errors; st may be NULL (kernels, after infer accepted the shapes). */
static pd_code btl_expand(const char *op, const dev_shape *in,
                          const dev_shape *like, const dev_attr_value *axis,
                          dev_shape *xe, dev_status *st) {
  char a[160], b[160];
  const int L = like->rank;
  unsigned mask = 0;
  for (int i = 0; i < axis->u.ilist.n; i++) {
    int64_t v = axis->u.ilist.v[i];
    if (v < -(int64_t)L || v >= L)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: attribute 'axis' has %lld; expected -%d to %d for "
                       "input 'like' of rank %d",
                       op, (long long)v, L, L - 1, L);
    int ax = (int)(v < 0 ? v + L : v);
    if (mask & (1u << ax))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: attribute 'axis' lists axis %d more than once; "
                       "expected distinct axes",
                       op, ax);
    mask |= 1u << ax;
  }
  int nred = axis->u.ilist.n;
  xe->rank = L;
  if (nred > 0 && in->rank == L - nred) {
    for (int i = 0, k = 0; i < L; i++)
      xe->dims[i] = (mask & (1u << i)) ? 1 : in->dims[k++];
  } else if (in->rank <= L && (nred == 0 || in->rank == L)) {
    for (int i = 0; i < L; i++) {
      int k = i - (L - in->rank);
      xe->dims[i] = k >= 0 ? in->dims[k] : 1;
    }
  } else {
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: input 'input' has shape %s (rank %d) and input "
                     "'like' has shape %s "
                     "(rank %d) with %d axes in 'axis'; expected input of rank "
                     "%d (axes removed), "
                     "%d or less",
                     op, dev_shape_str(in, a, sizeof a), in->rank,
                     dev_shape_str(like, b, sizeof b), L, nred, L - nred, L);
  }
  for (int i = 0; i < L; i++)
    if (xe->dims[i] != 1 && xe->dims[i] != like->dims[i])
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "%s: input 'input' of shape %s does not broadcast to shape %s of "
          "input "
          "'like' (axis %d has %lld and %lld); expected equal sizes or 1",
          op, dev_shape_str(in, a, sizeof a), dev_shape_str(like, b, sizeof b),
          i, (long long)xe->dims[i], (long long)like->dims[i]);
  return PD_OK;
}

static pd_code btl_infer(dev_infer_ctx *c, dev_status *st) {
  bool mean = c->attrs[BTL_MEAN].u.b;
  pd_code rc =
      mean ? dev_check_dtype_in(c, 0, DEV_MASK_FLOAT,
                                "a floating dtype (mean=true divides)", st)
           : dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st);
  if (rc) return rc;
  dev_shape xe;
  if ((rc = btl_expand(c->op->name, &c->in_shape[0], &c->in_shape[1],
                       &c->attrs[BTL_AXIS], &xe, st)))
    return rc;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[1];
  return dev_check_out_size(c, c->out_dtype[0], &c->out_shape[0], st);
}

/* Divides n elements of a floating buffer by `count`. */
static void divide_by(pd_dtype dt, void *p, int64_t n, double count) {
  switch (dt) {
    case PD_FLOAT32: {
      float *f = p, d = (float)count;
      for (int64_t i = 0; i < n; i++) f[i] /= d;
      break;
    }
    case PD_FLOAT64: {
      double *f = p;
      for (int64_t i = 0; i < n; i++) f[i] /= count;
      break;
    }
    default: {
      uint16_t *h = p;
      float d = (float)count;
      if (dt == PD_FLOAT16)
        for (int64_t i = 0; i < n; i++)
          h[i] = dev_float_to_half(dev_half_to_float(h[i]) / d);
      else
        for (int64_t i = 0; i < n; i++)
          h[i] = dev_float_to_bfloat16(dev_bfloat16_to_float(h[i]) / d);
      break;
    }
  }
}

static pd_code btl_cpu(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *os = &c->out_shape[0];
  int64_t total = dev_num_elems(os);
  if (total == 0) return PD_OK;
  dev_shape xe;
  btl_expand(c->op->name, &c->in_shape[0], &c->in_shape[1], &c->attrs[BTL_AXIS],
             &xe, NULL);
  size_t es = pd_dtype_size(c->out_dtype[0]);
  const char *src = c->in_data[0];
  char *dst = c->out_data[0];
  const int L = os->rank;
  if (L == 0) {
    memcpy(dst, src, es);
  } else {
    int64_t
        xs[PD_MAX_RANK]; /* input strides in elements, 0 on broadcast axes */
    int64_t acc = 1;
    for (int i = L - 1; i >= 0; i--) {
      xs[i] = xe.dims[i] == 1 ? 0 : acc;
      acc *= xe.dims[i];
    }
    int64_t row = os->dims[L - 1], outer = total / row;
    int64_t idx[PD_MAX_RANK] = {0}, off = 0;
    for (int64_t it = 0; it < outer; it++) {
      copy_strided(dst, src + (size_t)off * es, row, xs[L - 1], es);
      dst += (size_t)row * es;
      for (int d = L - 2; d >= 0; d--) {
        off += xs[d];
        if (++idx[d] < os->dims[d]) break;
        off -= xs[d] * os->dims[d];
        idx[d] = 0;
      }
    }
  }
  if (c->attrs[BTL_MEAN].u.b) {
    int64_t in_n = dev_num_elems(&xe);
    if (in_n > 0 && total != in_n)
      divide_by(c->out_dtype[0], c->out_data[0], total, (double)(total / in_n));
  }
  (void)st;
  return PD_OK;
}

static dev_op_def btl_def = {
    .name = "BroadcastToLike",
    .num_inputs = 2,
    .inputs = {{"input", false, 0, DEV_MASK_ALL},
               {"like", false, 0, DEV_MASK_ALL, NULL,
                "only its shape is read"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as input"}},
    .num_attrs = 2,
    .attrs = {{"axis",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_INT_LIST, .u.ilist = {NULL, 0}},
               .doc = "axes of like missing from input (a reduction's "
                      "axes without keep_dims); -rank..rank-1"},
              {"mean",
               DEV_ATTR_BOOL,
               {.type = DEV_ATTR_BOOL, .u.b = false},
               .doc = "divide by the broadcast factor (the gradient of "
                      "Mean; floating dtypes)"}},
    .infer = btl_infer,
    .kernels = {[DEV_BACKEND_CPU] = btl_cpu},
    .summary =
        "output = input broadcast to like's shape (NumPy), size-1 "
        "axes put back at `axis` first: the gradient of a reduction.",
    .notes = LIKE_NOTES,
};

/* ------------------------------------------------------------------------ */
/* SumToLike(input, like)                                                    */
/* The adjoint of NumPy broadcasting: input summed over the axes that
 * broadcasting like's shape to input's shape created or stretched, so the
 * output has like's shape. Floating dtypes; sums accumulate in float64.     */

static pd_code stl_infer(dev_infer_ctx *c, dev_status *st) {
  pd_code rc = dev_check_dtype_in(c, 0, DEV_MASK_FLOAT, NULL, st);
  if (rc) return rc;
  const dev_shape *in = &c->in_shape[0], *like = &c->in_shape[1];
  bool ok = like->rank <= in->rank;
  for (int i = 0; ok && i < like->rank; i++) {
    int64_t d = in->dims[in->rank - like->rank + i];
    ok = like->dims[i] == d || like->dims[i] == 1;
  }
  if (!ok) {
    char a[160], b[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "SumToLike: input 'like' has shape %s, which does not "
                     "broadcast to shape %s "
                     "of input 'input'; expected like's trailing dims to equal "
                     "input's or be 1",
                     dev_shape_str(like, b, sizeof b),
                     dev_shape_str(in, a, sizeof a));
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = *like;
  return PD_OK;
}

#define DEFINE_STL(FN, T)                                                      \
  static void FN(const T *x, double *acc, const dev_shape *in,                 \
                 const int64_t *os) {                                          \
    const int R = in->rank;                                                    \
    int64_t row = in->dims[R - 1], outer = dev_num_elems(in) / row;            \
    int64_t idx[PD_MAX_RANK] = {0}, off = 0;                                   \
    for (int64_t it = 0; it < outer; it++, x += row) {                         \
      if (os[R - 1]) {                                                         \
        for (int64_t j = 0; j < row; j++) acc[off + j] += (double)x[j];        \
      } else {                                                                 \
        double s = 0;                                                          \
        for (int64_t j = 0; j < row; j++) s += (double)x[j];                   \
        acc[off] += s;                                                         \
      }                                                                        \
      for (int d = R - 2; d >= 0; d--) {                                       \
        off += os[d];                                                          \
        if (++idx[d] < in->dims[d]) break;                                     \
        off -= os[d] * in->dims[d];                                            \
        idx[d] = 0;                                                            \
      }                                                                        \
    }                                                                          \
  }

DEFINE_STL(stl_f32, float)
DEFINE_STL(stl_f64, double)

static pd_code stl_cpu(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *in = &c->in_shape[0], *like = &c->in_shape[1];
  pd_dtype dt = c->out_dtype[0];
  int64_t on = dev_num_elems(like), inn = dev_num_elems(in);
  if (on == 0) return PD_OK;
  double *acc = calloc((size_t)on, sizeof(double));
  if (!acc)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "SumToLike: cannot allocate %lld float64 scratch elements",
                     (long long)on);
  if (inn > 0 && in->rank > 0) {
    /* Output strides per input axis, 0 on the summed ones. */
    int64_t os[PD_MAX_RANK], s = 1;
    for (int i = in->rank - 1; i >= 0; i--) {
      int k = i - (in->rank - like->rank);
      bool kept = k >= 0 && like->dims[k] == in->dims[i] && in->dims[i] != 1;
      os[i] = kept ? s : 0;
      if (k >= 0) s *= like->dims[k];
    }
    if (dt == PD_FLOAT32) {
      stl_f32(c->in_data[0], acc, in, os);
    } else if (dt == PD_FLOAT64) {
      stl_f64(c->in_data[0], acc, in, os);
    } else {
      float *buf = dev__scratch_f32(inn);
      if (!buf) {
        free(acc);
        return dev__scratch_error(c, inn, st);
      }
      dev__widen_16(dt, c->in_data[0], buf, inn);
      stl_f32(buf, acc, in, os);
      free(buf);
    }
  } else if (inn > 0) { /* scalar to scalar */
    acc[0] = dev_load_f64(dt, c->in_data[0], 0);
  }
  for (int64_t i = 0; i < on; i++) dev_store_f64(dt, c->out_data[0], i, acc[i]);
  free(acc);
  return PD_OK;
}

static dev_op_def stl_def = {
    .name = "SumToLike",
    .num_inputs = 2,
    .inputs = {{"input", false, 0, DEV_MASK_FLOAT},
               {"like", false, 0, DEV_MASK_ALL, NULL,
                "only its shape is read"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_FLOAT, "same as input"}},
    .infer = stl_infer,
    .kernels = {[DEV_BACKEND_CPU] = stl_cpu},
    .summary =
        "output = input summed over the axes that broadcasting like "
        "to input created or stretched: the gradient of broadcasting.",
    .notes = LIKE_NOTES,
};

/* ------------------------------------------------------------------------ */
/* ReshapeLike(input, like): input's elements with like's shape (equal
 * element counts). Output 0 aliases input 0, no kernel runs (as Reshape).   */

static pd_code rsl_infer(dev_infer_ctx *c, dev_status *st) {
  pd_code rc = dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st);
  if (rc) return rc;
  const dev_shape *in = &c->in_shape[0], *like = &c->in_shape[1];
  if (dev_num_elems(in) != dev_num_elems(like)) {
    char a[160], b[160];
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "ReshapeLike: input 'input' has shape %s (%lld elements) but input "
        "'like' has "
        "shape %s (%lld elements); expected equal element counts",
        dev_shape_str(in, a, sizeof a), (long long)dev_num_elems(in),
        dev_shape_str(like, b, sizeof b), (long long)dev_num_elems(like));
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = *like;
  return PD_OK;
}

static dev_op_def rsl_def = {
    .name = "ReshapeLike",
    .num_inputs = 2,
    .inputs = {{"input", false, 0, DEV_MASK_ALL},
               {"like", false, 0, DEV_MASK_ALL, NULL,
                "only its shape is read"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as input"}},
    .flags = DEV_OP_ALIASES_INPUT,
    .infer = rsl_infer,
    .kernels = {NULL, NULL},
    .summary =
        "output = input's elements with like's shape (equal element "
        "counts; shares input's memory): the gradient of Reshape.",
    .notes = LIKE_NOTES,
};

/* ------------------------------------------------------------------------ */
/* Registration                                                              */

void dev_register_grad_ops(void);

/* Registers the gradient ops and their CPU kernels (called by
 * dev_registry_init). */
void dev_register_grad_ops(void) {
  for (size_t i = 0; i < sizeof eg_defs / sizeof eg_defs[0]; i++)
    dev__register_or_die(&eg_defs[i]);
  dev__register_or_die(&btl_def);
  dev__register_or_die(&stl_def);
  dev__register_or_die(&rsl_def);
}
