/* Cast between any two dtypes (truncating, saturating float -> integer
 * conversions, NaN -> 0; one rounding to the 16-bit floats), Fill (a
 * constant of an attribute's shape and dtype), ZerosLike and OnesLike, after
 * the TensorFlow raw ops of the same names. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "device_int.h"
#include "ops/elementwise_int.h"

/* ------------------------------------------------------------------------ */
/* Cast                                                                     */

#define EW_CAST_LOOP(ST, DT, CONV)                                             \
  do {                                                                         \
    const ST *s_ = (const ST *)in;                                             \
    DT *d_ = (DT *)out;                                                        \
    for (int64_t i = 0; i < n; i++) {                                          \
      ST v = s_[i];                                                            \
      d_[i] = CONV;                                                            \
    }                                                                          \
  } while (0)

/* From a float32 value (float32, float16, bfloat16 sources; WIDEN turns the
 * stored element into float). One rounding only: float16 <-> bfloat16 goes
 * through the exact float32 value. */
#define EW_CAST_FROM_F32(ST, WIDEN)                                            \
  switch (dst) {                                                               \
    case PD_FLOAT32: EW_CAST_LOOP(ST, float, WIDEN(v)); break;                 \
    case PD_FLOAT64: EW_CAST_LOOP(ST, double, (double)WIDEN(v)); break;        \
    case PD_FLOAT16: EW_CAST_LOOP(ST, uint16_t, ew_f32_to_f16(WIDEN(v)));      \
        break;                                                                 \
    case PD_BFLOAT16:                                                          \
      EW_CAST_LOOP(ST, uint16_t, ew_f32_to_bf16(WIDEN(v)));                    \
      break;                                                                   \
    case PD_INT32: EW_CAST_LOOP(ST, int32_t, ew_sat_i32(WIDEN(v))); break;     \
    case PD_INT64: EW_CAST_LOOP(ST, int64_t, ew_sat_i64(WIDEN(v))); break;     \
    case PD_UINT8: EW_CAST_LOOP(ST, uint8_t, ew_sat_u8(WIDEN(v))); break;      \
    case PD_BOOL: EW_CAST_LOOP(ST, uint8_t, (uint8_t)(WIDEN(v) != 0)); break;  \
    default: break;                                                            \
  }

#define EW_SAME(v) (v)

/* From an integer type ST (bool sources are normalised to 0/1 by NORM).
 * Integer -> integer conversions wrap as C's (and TF's) static_cast. */
#define EW_CAST_FROM_INT(ST, NORM)                                             \
  switch (dst) {                                                               \
    case PD_FLOAT32: EW_CAST_LOOP(ST, float, (float)NORM(v)); break;           \
    case PD_FLOAT64: EW_CAST_LOOP(ST, double, (double)NORM(v)); break;         \
    case PD_FLOAT16:                                                           \
      EW_CAST_LOOP(ST, uint16_t, ew_i64_to_f16((int64_t)NORM(v)));             \
      break;                                                                   \
    case PD_BFLOAT16:                                                          \
      EW_CAST_LOOP(ST, uint16_t, ew_i64_to_bf16((int64_t)NORM(v)));            \
      break;                                                                   \
    case PD_INT32: EW_CAST_LOOP(ST, int32_t, (int32_t)(uint32_t)NORM(v));      \
        break;                                                                 \
    case PD_INT64: EW_CAST_LOOP(ST, int64_t, (int64_t)NORM(v)); break;         \
    case PD_UINT8: EW_CAST_LOOP(ST, uint8_t, (uint8_t)NORM(v)); break;         \
    case PD_BOOL: EW_CAST_LOOP(ST, uint8_t, (uint8_t)(v != 0)); break;         \
    default: break;                                                            \
  }

#define EW_BOOL01(v) ((v) != 0)

/* Converts n elements of `src` to `dst` (any pair of valid dtypes). */
static void ew_cast(pd_dtype src, const void *in, pd_dtype dst, void *out,
                    int64_t n) {
  if (n <= 0) return;
  if (src == dst && src != PD_BOOL) {
    memcpy(out, in, (size_t)n * pd_dtype_size(src));
    return;
  }
  switch (src) {
    case PD_FLOAT32: EW_CAST_FROM_F32(float, EW_SAME) break;
    case PD_FLOAT16: EW_CAST_FROM_F32(uint16_t, ew_f16_to_f32) break;
    case PD_BFLOAT16: EW_CAST_FROM_F32(uint16_t, ew_bf16_to_f32) break;
    case PD_FLOAT64:
      switch (dst) {
        case PD_FLOAT32: EW_CAST_LOOP(double, float, (float)v); break;
        case PD_FLOAT16:
          EW_CAST_LOOP(double, uint16_t, ew_f64_to_f16(v));
          break;
        case PD_BFLOAT16:
          EW_CAST_LOOP(double, uint16_t, ew_f64_to_bf16(v));
          break;
        case PD_INT32: EW_CAST_LOOP(double, int32_t, ew_sat_i32(v)); break;
        case PD_INT64: EW_CAST_LOOP(double, int64_t, ew_sat_i64(v)); break;
        case PD_UINT8: EW_CAST_LOOP(double, uint8_t, ew_sat_u8(v)); break;
        case PD_BOOL: EW_CAST_LOOP(double, uint8_t, (uint8_t)(v != 0)); break;
        default: break;
      }
      break;
    case PD_INT32: EW_CAST_FROM_INT(int32_t, EW_SAME) break;
    case PD_INT64: EW_CAST_FROM_INT(int64_t, EW_SAME) break;
    case PD_UINT8: EW_CAST_FROM_INT(uint8_t, EW_SAME) break;
    case PD_BOOL: EW_CAST_FROM_INT(uint8_t, EW_BOOL01) break;
    default: break;
  }
}

static pd_code ew_infer_cast(dev_infer_ctx *c, dev_status *st) {
  PD_TRY(dev_check_dtype_in(c, 0, DEV_MASK_ALL, "any dtype", st));
  pd_dtype dst = c->attrs[0].u.dtype;
  if (!dev_dtype_is_valid(dst))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Cast: attr DstT is not a valid dtype (%d); expected "
                     "float32, float64, float16, bfloat16, int32, int64, "
                     "uint8 or bool",
                     (int)dst);
  size_t bytes;
  PD_TRY(dev_shape_byte_size(dst, &c->in_shape[0], &bytes, st));
  c->out_dtype[0] = dst;
  c->out_shape[0] = c->in_shape[0];
  return PD_OK;
}

static pd_code ew_k_cast(dev_kernel_ctx *c, dev_status *st) {
  ew_cast(c->in_dtype[0], c->in_data[0], c->out_dtype[0], c->out_data[0],
          ew_count(&c->out_shape[0]));
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Fill, ZerosLike, OnesLike                                                */

/* Writes n copies of the one element at `elem` (of size es) into out. */
static void ew_fill_bytes(void *out, const void *elem, size_t es, int64_t n) {
  switch (es) {
    case 1: memset(out, *(const uint8_t *)elem, (size_t)n); break;
    case 2: {
      uint16_t v;
      memcpy(&v, elem, 2);
      for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = v;
      break;
    }
    case 4: {
      uint32_t v;
      memcpy(&v, elem, 4);
      for (int64_t i = 0; i < n; i++) ((uint32_t *)out)[i] = v;
      break;
    }
    default: {
      uint64_t v;
      memcpy(&v, elem, 8);
      for (int64_t i = 0; i < n; i++) ((uint64_t *)out)[i] = v;
      break;
    }
  }
}

/* attrs: shape, value, dtype. */
static pd_code ew_infer_fill(dev_infer_ctx *c, dev_status *st) {
  const dev_shape *s = &c->attrs[0].u.shape;
  pd_dtype dt = c->attrs[2].u.dtype;
  if (!dev_dtype_is_valid(dt))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Fill: attr dtype is not a valid dtype (%d); expected "
                     "float32, float64, float16, bfloat16, int32, int64, "
                     "uint8 or bool",
                     (int)dt);
  if (s->rank < 0 || s->rank > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Fill: attr shape has rank %d; expected 0..%d", s->rank,
                     PD_MAX_RANK);
  for (int i = 0; i < s->rank; i++)
    if (s->dims[i] < 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Fill: attr shape has dim %lld on axis %d; expected "
                       "dims >= 0",
                       (long long)s->dims[i], i);
  size_t bytes;
  PD_TRY(dev_shape_byte_size(dt, s, &bytes, st));
  c->out_dtype[0] = dt;
  c->out_shape[0] = *s;
  return PD_OK;
}

static pd_code ew_k_fill(dev_kernel_ctx *c, dev_status *st) {
  uint8_t elem[8];
  double v = c->attrs[1].u.f;
  pd_dtype dt = c->out_dtype[0];
  ew_cast(PD_FLOAT64, &v, dt, elem, 1);
  ew_fill_bytes(c->out_data[0], elem, pd_dtype_size(dt),
                ew_count(&c->out_shape[0]));
  return PD_OK;
}

static pd_code ew_infer_like(dev_infer_ctx *c, dev_status *st) {
  PD_TRY(dev_check_dtype_in(c, 0, DEV_MASK_ALL, "any dtype", st));
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[0];
  return PD_OK;
}

static pd_code ew_k_zeros_like(dev_kernel_ctx *c, dev_status *st) {
  int64_t n = ew_count(&c->out_shape[0]);
  memset(c->out_data[0], 0, (size_t)n * pd_dtype_size(c->out_dtype[0]));
  return PD_OK;
}

static pd_code ew_k_ones_like(dev_kernel_ctx *c, dev_status *st) {
  uint8_t elem[8];
  uint8_t one = 1;
  pd_dtype dt = c->out_dtype[0];
  ew_cast(PD_UINT8, &one, dt, elem, 1);
  ew_fill_bytes(c->out_data[0], elem, pd_dtype_size(dt),
                ew_count(&c->out_shape[0]));
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Registration                                                             */

static dev_op_def fill_cast_defs[] = {
    /* Cast(x; DstT, Truncate): Truncate is accepted and ignored. */
    {
        .name = "Cast",
        .num_inputs = 1,
        .inputs = {{"x", false, 1, DEV_MASK_ALL}},
        .num_outputs = 1,
        .outputs = {{"y", false, 1, DEV_MASK_ALL, "the attribute DstT"}},
        .num_attrs = 2,
        .attrs = {{"DstT",
                   DEV_ATTR_DTYPE,
                   {.type = DEV_ATTR_NONE},
                   .doc = "the output's dtype"},
                  {"Truncate",
                   DEV_ATTR_BOOL,
                   {.type = DEV_ATTR_BOOL, .u.b = false},
                   .doc = "accepted and ignored"}},
        .infer = ew_infer_cast,
        .kernels = {[DEV_BACKEND_CPU] = ew_k_cast},
        .summary = "y = x converted to dtype DstT, element-wise; float to "
                   "integer truncates, saturates and maps NaN to 0.",
        .notes = "Differs from tf.raw_ops.Cast: SrcT is not an attribute (it "
                 "is x's dtype), and Truncate is accepted but ignored.",
    },
    /* Fill(; shape, value, dtype): TF's Fill takes dims and value as
     * tensors; here they are attributes. */
    {
        .name = "Fill",
        .num_inputs = 0,
        .num_outputs = 1,
        .outputs = {{"output", false, 1, DEV_MASK_ALL, "the attribute dtype"}},
        .num_attrs = 3,
        .attrs = {{"shape",
                   DEV_ATTR_SHAPE,
                   {.type = DEV_ATTR_NONE},
                   .doc = "the output's shape"},
                  {"value",
                   DEV_ATTR_FLOAT,
                   {.type = DEV_ATTR_NONE},
                   .doc = "every element, converted to dtype"},
                  {"dtype",
                   DEV_ATTR_DTYPE,
                   {.type = DEV_ATTR_DTYPE, .u.dtype = PD_FLOAT32},
                   .doc = "the output's dtype"}},
        .infer = ew_infer_fill,
        .kernels = {[DEV_BACKEND_CPU] = ew_k_fill},
        .summary = "A tensor of the attribute shape whose every element is "
                   "value, of dtype dtype.",
        .notes = "Differs from tf.raw_ops.Fill: TF takes `dims` and `value` "
                 "as input tensors (the dtype is value's); here `shape` is a "
                 "shape attribute, `value` a float attribute and `dtype` an "
                 "attribute (default float32).",
    },
    EW_UNARY_DEF("ZerosLike", ew_infer_like, ew_k_zeros_like, DEV_MASK_ALL,
                 "y = zeros of x's shape and dtype.", NULL),
    EW_UNARY_DEF("OnesLike", ew_infer_like, ew_k_ones_like, DEV_MASK_ALL,
                 "y = ones of x's shape and dtype.", NULL),
};

/* Registers the Cast, Fill, ZerosLike and OnesLike and their CPU kernels. */
void dev_register_fill_cast_ops(void) {
  for (size_t i = 0; i < sizeof fill_cast_defs / sizeof fill_cast_defs[0]; i++)
    dev__register_or_die(&fill_cast_defs[i]);
}
