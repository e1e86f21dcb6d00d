/* Element-wise ops, unary math here (Neg, Abs, Square, Relu, Exp, Log, Sqrt,
 * Rsqrt, Tanh, Sigmoid); binary arithmetic and comparisons with NumPy
 * broadcasting in binary.c; Cast, Fill, ZerosLike and OnesLike in
 * fill_cast.c. Shared helpers: elementwise_int.h.
 *
 * Semantics follow the TensorFlow raw ops of the same names
 * (tensorflow/core/ops/math_ops.cc, array_ops.cc) and NumPy broadcasting:
 *  - integer arithmetic wraps around (two's complement), computed in unsigned
 *    types so that overflow is never C undefined behaviour;
 *  - integer Div truncates toward zero (C semantics, as TF's Div on integers);
 *    a zero divisor fails the op at run time with INVALID_ARGUMENT;
 *  - integer Pow with a negative exponent fails at run time, as in TF;
 *  - Maximum and Minimum propagate NaN (TF >= 2.x, np.maximum);
 *  - float -> integer conversions truncate, saturate to the target's range
 *    and map NaN to 0 (never C undefined behaviour);
 *  - float16 and bfloat16 are computed in float32 and rounded to nearest
 *    even on store.
 *
 * Layout of the kernels: for float32 and float64 every op has its own tight
 * loop (a switch over the op outside the loop). float16/bfloat16 convert
 * blocks of EW_BLOCK elements to float32, run the float32 loop on the block
 * and convert back. Binary ops collapse the broadcast into at most
 * PD_MAX_RANK axes of (out, x, y) strides, merging axes that are contiguous
 * in both operands; the innermost axis becomes a run of elements whose
 * operands step by 0 or 1, handled by one call of a per-dtype run function.
 * Same-shape operands and a scalar operand thus become a single run; a
 * bias-like operand repeated along leading axes becomes one run per row. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "device_int.h"
#include "ops/elementwise_int.h"

/* ------------------------------------------------------------------------ */
/* Unary ops                                                                */

typedef enum ew_unary {
  UN_NEG,
  UN_ABS,
  UN_SQUARE,
  UN_RELU,
  UN_EXP,
  UN_LOG,
  UN_SQRT,
  UN_RSQRT,
  UN_TANH,
  UN_SIGMOID,
} ew_unary;

#define EW_LOOP1(T, EXPR)                                                      \
  do {                                                                         \
    const T *in_ = (const T *)vin;                                             \
    T *out_ = (T *)vout;                                                       \
    for (int64_t i = 0; i < n; i++) {                                          \
      T x = in_[i];                                                            \
      out_[i] = (EXPR);                                                        \
    }                                                                          \
  } while (0)

/* One loop per op for a floating type T and its libm functions. Sigmoid is
 * evaluated so that exp never overflows: with e = e^-|x|, 1/(1+e) for
 * x >= 0 and e/(1+e) for x < 0. */
#define EW_UNARY_FLOAT(T, FABS, EXP, LOG, SQRT, TANH)                          \
  switch (op) {                                                                \
    case UN_NEG: EW_LOOP1(T, -x); break;                                       \
    case UN_ABS: EW_LOOP1(T, FABS(x)); break;                                  \
    case UN_SQUARE: EW_LOOP1(T, x *x); break;                                  \
    case UN_RELU: EW_LOOP1(T, x < (T)0 ? (T)0 : x); break; /* NaN stays */     \
    case UN_EXP: EW_LOOP1(T, EXP(x)); break;                                   \
    case UN_LOG: EW_LOOP1(T, LOG(x)); break;                                   \
    case UN_SQRT: EW_LOOP1(T, SQRT(x)); break;                                 \
    case UN_RSQRT: EW_LOOP1(T, (T)1 / SQRT(x)); break;                         \
    case UN_TANH: EW_LOOP1(T, TANH(x)); break;                                 \
    case UN_SIGMOID: {                                                         \
      const T *in_ = (const T *)vin;                                           \
      T *out_ = (T *)vout;                                                     \
      for (int64_t i = 0; i < n; i++) {                                        \
        T x = in_[i], e = EXP(-FABS(x)); /* e^-|x| never overflows */          \
        out_[i] = (x >= (T)0 ? (T)1 : e) / ((T)1 + e);                         \
      }                                                                        \
      break;                                                                   \
    }                                                                          \
  }

static void ew_unary_f32(ew_unary op, const void *vin, void *vout, int64_t n) {
  EW_UNARY_FLOAT(float, fabsf, expf, logf, sqrtf, tanhf)
}

static void ew_unary_f64(ew_unary op, const void *vin, void *vout, int64_t n){
    EW_UNARY_FLOAT(double, fabs, exp, log, sqrt, tanh)}
/* float16 / bfloat16: blocks through the float32 loops. */
#define EW_UNARY_HALF(NAME, TO_F32, FROM_F32)                                  \
  static void NAME(ew_unary op, const void *vin, void *vout, int64_t n) {      \
    const uint16_t *in = (const uint16_t *)vin;                                \
    uint16_t *out = (uint16_t *)vout;                                          \
    float buf[EW_BLOCK];                                                       \
    for (int64_t off = 0; off < n; off += EW_BLOCK) {                          \
      int64_t m = n - off < EW_BLOCK ? n - off : EW_BLOCK;                     \
      for (int64_t i = 0; i < m; i++) buf[i] = TO_F32(in[off + i]);            \
      ew_unary_f32(op, buf, buf, m);                                           \
      for (int64_t i = 0; i < m; i++) out[off + i] = FROM_F32(buf[i]);         \
    }                                                                          \
  }

EW_UNARY_HALF(ew_unary_f16, ew_f16_to_f32, ew_f32_to_f16)
    EW_UNARY_HALF(ew_unary_bf16, ew_bf16_to_f32, ew_f32_to_bf16)

/* Signed integers (T, unsigned UT): wrap around, so Neg/Abs of the minimum
 * value give the minimum value, as TF on two's complement hardware. */
#define EW_UNARY_SIGNED(T, UT)                                                 \
  switch (op) {                                                                \
    case UN_NEG: EW_LOOP1(T, (T)(0u - (UT)x)); break;                          \
    case UN_ABS: EW_LOOP1(T, x < 0 ? (T)(0u - (UT)x) : x); break;              \
    case UN_SQUARE: EW_LOOP1(T, (T)((UT)x * (UT)x)); break;                    \
    case UN_RELU: EW_LOOP1(T, x < 0 ? (T)0 : x); break;                        \
    default: break; /* floating-only ops are rejected by inference */          \
  }

        static void ew_unary_i32(ew_unary op, const void *vin, void *vout,
                                 int64_t n) {
  EW_UNARY_SIGNED(int32_t, uint32_t)
}

static void ew_unary_i64(ew_unary op, const void *vin, void *vout, int64_t n) {
  EW_UNARY_SIGNED(int64_t, uint64_t)
}

static void ew_unary_u8(ew_unary op, const void *vin, void *vout, int64_t n) {
  switch (op) {
    case UN_NEG: EW_LOOP1(uint8_t, (uint8_t)(0u - x)); break;
    case UN_ABS:
    case UN_RELU: EW_LOOP1(uint8_t, x); break;
    case UN_SQUARE: EW_LOOP1(uint8_t, (uint8_t)((unsigned)x * x)); break;
    default: break;
  }
}

static pd_code ew_unary_kernel(dev_kernel_ctx *c, ew_unary op, dev_status *st) {
  int64_t n = ew_count(&c->out_shape[0]);
  const void *in = c->in_data[0];
  void *out = c->out_data[0];
  switch (c->in_dtype[0]) {
    case PD_FLOAT32: ew_unary_f32(op, in, out, n); break;
    case PD_FLOAT64: ew_unary_f64(op, in, out, n); break;
    case PD_FLOAT16: ew_unary_f16(op, in, out, n); break;
    case PD_BFLOAT16: ew_unary_bf16(op, in, out, n); break;
    case PD_INT32: ew_unary_i32(op, in, out, n); break;
    case PD_INT64: ew_unary_i64(op, in, out, n); break;
    case PD_UINT8: ew_unary_u8(op, in, out, n); break;
    default:
      return dev_error(st, PD_INTERNAL, "%s: no kernel for dtype %s",
                       c->op->name, pd_dtype_name(c->in_dtype[0]));
  }
  return PD_OK;
}

static pd_code ew_unary_infer(dev_infer_ctx *c, unsigned mask,
                              const char *expected, dev_status *st) {
  PD_TRY(dev_check_dtype_in(c, 0, mask, expected, st));
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[0];
  return PD_OK;
}

static pd_code ew_infer_unary_number(dev_infer_ctx *c, dev_status *st) {
  return ew_unary_infer(c, DEV_MASK_NUMBER, EW_EXPECT_NUMBER, st);
}

static pd_code ew_infer_unary_float(dev_infer_ctx *c, dev_status *st) {
  return ew_unary_infer(c, DEV_MASK_FLOAT, EW_EXPECT_FLOAT, st);
}

#define EW_UNARY_KERNEL(FN, OP)                                                \
  static pd_code FN(dev_kernel_ctx *c, dev_status *st) {                       \
    return ew_unary_kernel(c, OP, st);                                         \
  }

EW_UNARY_KERNEL(ew_k_neg, UN_NEG)
EW_UNARY_KERNEL(ew_k_abs, UN_ABS)
EW_UNARY_KERNEL(ew_k_square, UN_SQUARE)
EW_UNARY_KERNEL(ew_k_relu, UN_RELU)
EW_UNARY_KERNEL(ew_k_exp, UN_EXP)
EW_UNARY_KERNEL(ew_k_log, UN_LOG)
EW_UNARY_KERNEL(ew_k_sqrt, UN_SQRT)
EW_UNARY_KERNEL(ew_k_rsqrt, UN_RSQRT)
EW_UNARY_KERNEL(ew_k_tanh, UN_TANH)
EW_UNARY_KERNEL(ew_k_sigmoid, UN_SIGMOID)

/* ------------------------------------------------------------------------ */
/* Registration                                                             */

static dev_op_def elementwise_defs[] = {
    /* Unary, TF raw ops Neg, Abs, Square, Relu, Exp, Log, Sqrt, Rsqrt,
     * Tanh, Sigmoid. */
    EW_UNARY_DEF("Neg", ew_infer_unary_number, ew_k_neg, DEV_MASK_NUMBER,
                 "y = -x, element-wise; integers wrap around.", NULL),
    EW_UNARY_DEF(
        "Abs", ew_infer_unary_number, ew_k_abs, DEV_MASK_NUMBER,
        "y = |x|, element-wise; the most negative integer stays itself.", NULL),
    EW_UNARY_DEF("Square", ew_infer_unary_number, ew_k_square, DEV_MASK_NUMBER,
                 "y = x * x, element-wise; integers wrap around.", NULL),
    EW_UNARY_DEF(
        "Relu", ew_infer_unary_number, ew_k_relu, DEV_MASK_NUMBER,
        "y = max(x, 0), element-wise.",
        "Differs from tf.raw_ops.Relu in argument names only: the input is `x` "
        "(TF: `features`) and the output `y` (TF: `activations`)."),
    EW_UNARY_DEF("Exp", ew_infer_unary_float, ew_k_exp, DEV_MASK_FLOAT,
                 "y = e^x, element-wise.", NULL),
    EW_UNARY_DEF("Log", ew_infer_unary_float, ew_k_log, DEV_MASK_FLOAT,
                 "y = ln(x), element-wise (-inf at 0, NaN below).", NULL),
    EW_UNARY_DEF("Sqrt", ew_infer_unary_float, ew_k_sqrt, DEV_MASK_FLOAT,
                 "y = sqrt(x), element-wise (NaN below 0).", NULL),
    EW_UNARY_DEF("Rsqrt", ew_infer_unary_float, ew_k_rsqrt, DEV_MASK_FLOAT,
                 "y = 1 / sqrt(x), element-wise.", NULL),
    EW_UNARY_DEF("Tanh", ew_infer_unary_float, ew_k_tanh, DEV_MASK_FLOAT,
                 "y = tanh(x), element-wise.", NULL),
    EW_UNARY_DEF("Sigmoid", ew_infer_unary_float, ew_k_sigmoid, DEV_MASK_FLOAT,
                 "y = 1 / (1 + e^-x), element-wise.", NULL),
};

/* Registers the unary element-wise ops and their CPU kernels. */
void dev_register_elementwise_ops(void) {
  for (size_t i = 0; i < sizeof elementwise_defs / sizeof elementwise_defs[0];
       i++)
    dev__register_or_die(&elementwise_defs[i]);
}
