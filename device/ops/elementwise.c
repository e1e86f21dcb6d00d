/* Element-wise ops: unary math, binary arithmetic and comparisons with NumPy
 * broadcasting, Cast, Fill, ZerosLike and OnesLike.
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

/* Elements per float32 scratch block of the float16/bfloat16 paths. */
#define EW_BLOCK 256

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */

/* Element count of a shape already validated by inference. */
static int64_t ew_count(const dev_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return n;
}

/* float/double -> integer: truncate toward zero, saturate, NaN -> 0. */
static inline int32_t ew_sat_i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return INT32_MAX;
  if (v <= -2147483648.0) return INT32_MIN;
  return (int32_t)v;
}

static inline int64_t ew_sat_i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

static inline uint8_t ew_sat_u8(double v) {
  if (v != v) return 0;
  if (v >= 255.0) return 255;
  if (v <= 0.0) return 0;
  return (uint8_t)v;
}

/* double -> 16-bit floats with a single rounding (see ew_f64_to_f32_odd). */
static inline uint16_t ew_f64_to_f16(double d) {
  return ew_f32_to_f16(ew_f64_to_f32_odd(d));
}
static inline uint16_t ew_f64_to_bf16(double d) {
  return ew_f32_to_bf16(ew_f64_to_f32_odd(d));
}
static inline uint16_t ew_i64_to_f16(int64_t v) {
  return ew_f32_to_f16(ew_i64_to_f32_odd(v));
}
static inline uint16_t ew_i64_to_bf16(int64_t v) {
  return ew_f32_to_bf16(ew_i64_to_f32_odd(v));
}

/* x**y for integers modulo 2^64 (square and multiply); y >= 0. Truncating
 * the result to a narrower type gives the wrapped power in that type. */
static inline uint64_t ew_ipow(uint64_t x, uint64_t y) {
  uint64_t r = 1;
  while (y) {
    if (y & 1u) r *= x;
    y >>= 1;
    x *= x;
  }
  return r;
}

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

#define EW_LOOP1(T, EXPR)                          \
  do {                                             \
    const T *in_ = (const T *)vin;                 \
    T *out_ = (T *)vout;                           \
    for (int64_t i = 0; i < n; i++) {              \
      T x = in_[i];                                \
      out_[i] = (EXPR);                            \
    }                                              \
  } while (0)

/* One loop per op for a floating type T and its libm functions. Sigmoid is
 * evaluated so that exp never overflows: with e = e^-|x|, 1/(1+e) for
 * x >= 0 and e/(1+e) for x < 0. */
#define EW_UNARY_FLOAT(T, FABS, EXP, LOG, SQRT, TANH)                        \
  switch (op) {                                                              \
    case UN_NEG: EW_LOOP1(T, -x); break;                                     \
    case UN_ABS: EW_LOOP1(T, FABS(x)); break;                                \
    case UN_SQUARE: EW_LOOP1(T, x * x); break;                               \
    case UN_RELU: EW_LOOP1(T, x < (T)0 ? (T)0 : x); break; /* NaN stays */  \
    case UN_EXP: EW_LOOP1(T, EXP(x)); break;                                 \
    case UN_LOG: EW_LOOP1(T, LOG(x)); break;                                 \
    case UN_SQRT: EW_LOOP1(T, SQRT(x)); break;                               \
    case UN_RSQRT: EW_LOOP1(T, (T)1 / SQRT(x)); break;                       \
    case UN_TANH: EW_LOOP1(T, TANH(x)); break;                               \
    case UN_SIGMOID: {                                                       \
      const T *in_ = (const T *)vin;                                         \
      T *out_ = (T *)vout;                                                   \
      for (int64_t i = 0; i < n; i++) {                                      \
        T x = in_[i], e = EXP(-FABS(x)); /* e^-|x| never overflows */       \
        out_[i] = (x >= (T)0 ? (T)1 : e) / ((T)1 + e);                       \
      }                                                                      \
      break;                                                                 \
    }                                                                        \
  }

static void ew_unary_f32(ew_unary op, const void *vin, void *vout, int64_t n) {
  EW_UNARY_FLOAT(float, fabsf, expf, logf, sqrtf, tanhf)
}

static void ew_unary_f64(ew_unary op, const void *vin, void *vout, int64_t n) {
  EW_UNARY_FLOAT(double, fabs, exp, log, sqrt, tanh)
}

/* float16 / bfloat16: blocks through the float32 loops. */
#define EW_UNARY_HALF(NAME, TO_F32, FROM_F32)                                 \
  static void NAME(ew_unary op, const void *vin, void *vout, int64_t n) {     \
    const uint16_t *in = (const uint16_t *)vin;                               \
    uint16_t *out = (uint16_t *)vout;                                         \
    float buf[EW_BLOCK];                                                      \
    for (int64_t off = 0; off < n; off += EW_BLOCK) {                         \
      int64_t m = n - off < EW_BLOCK ? n - off : EW_BLOCK;                    \
      for (int64_t i = 0; i < m; i++) buf[i] = TO_F32(in[off + i]);           \
      ew_unary_f32(op, buf, buf, m);                                          \
      for (int64_t i = 0; i < m; i++) out[off + i] = FROM_F32(buf[i]);        \
    }                                                                         \
  }

EW_UNARY_HALF(ew_unary_f16, ew_f16_to_f32, ew_f32_to_f16)
EW_UNARY_HALF(ew_unary_bf16, ew_bf16_to_f32, ew_f32_to_bf16)

/* Signed integers (T, unsigned UT): wrap around, so Neg/Abs of the minimum
 * value give the minimum value, as TF on two's complement hardware. */
#define EW_UNARY_SIGNED(T, UT)                                               \
  switch (op) {                                                              \
    case UN_NEG: EW_LOOP1(T, (T)(0u - (UT)x)); break;                        \
    case UN_ABS: EW_LOOP1(T, x < 0 ? (T)(0u - (UT)x) : x); break;            \
    case UN_SQUARE: EW_LOOP1(T, (T)((UT)x * (UT)x)); break;                  \
    case UN_RELU: EW_LOOP1(T, x < 0 ? (T)0 : x); break;                      \
    default: break; /* floating-only ops are rejected by inference */        \
  }

static void ew_unary_i32(ew_unary op, const void *vin, void *vout, int64_t n) {
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
  pd_code rc = dev_check_dtype_in(c, 0, mask, expected, st);
  if (rc != PD_OK) return rc;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[0];
  return PD_OK;
}

#define EW_EXPECT_NUMBER \
  "a number dtype (float32, float64, float16, bfloat16, int32, int64, uint8)"
#define EW_EXPECT_FLOAT "a floating dtype (float32, float64, float16, bfloat16)"

static pd_code ew_infer_unary_number(dev_infer_ctx *c, dev_status *st) {
  return ew_unary_infer(c, DEV_MASK_NUMBER, EW_EXPECT_NUMBER, st);
}

static pd_code ew_infer_unary_float(dev_infer_ctx *c, dev_status *st) {
  return ew_unary_infer(c, DEV_MASK_FLOAT, EW_EXPECT_FLOAT, st);
}

#define EW_UNARY_KERNEL(FN, OP)                                 \
  static pd_code FN(dev_kernel_ctx *c, dev_status *st) {        \
    return ew_unary_kernel(c, OP, st);                          \
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
/* Binary ops                                                               */

typedef enum ew_binary {
  BIN_ADD,
  BIN_SUB,
  BIN_MUL,
  BIN_DIV,
  BIN_POW,
  BIN_MAX,
  BIN_MIN,
  BIN_EQ,
  BIN_GT,
  BIN_LT,
} ew_binary;

/* Run-time failures of integer ops, reported by the run functions. */
enum { EW_OK = 0, EW_DIV_BY_ZERO = 1, EW_NEG_POW = 2 };

/* A run of n output elements; operand x steps by sa (0 or 1) elements, y by
 * sb. Returns EW_OK or a run-time failure. */
typedef int (*ew_run_fn)(ew_binary op, const void *a, int sa, const void *b,
                         int sb, void *out, int64_t n);

/* The loop of one op over a run, specialised on which operand steps so
 * that the common cases are plain vectorisable loops. EXPR reads x and y. */
#define EW_RUN(T, OT, EXPR)                                                  \
  do {                                                                       \
    const T *pa_ = (const T *)a;                                             \
    const T *pb_ = (const T *)b;                                             \
    OT *po_ = (OT *)out;                                                     \
    if (sa && sb) {                                                          \
      for (int64_t i = 0; i < n; i++) {                                      \
        T x = pa_[i], y = pb_[i];                                            \
        po_[i] = (EXPR);                                                     \
      }                                                                      \
    } else if (sa) {                                                         \
      T y = pb_[0];                                                          \
      for (int64_t i = 0; i < n; i++) {                                      \
        T x = pa_[i];                                                        \
        po_[i] = (EXPR);                                                     \
      }                                                                      \
    } else if (sb) {                                                         \
      T x = pa_[0];                                                          \
      for (int64_t i = 0; i < n; i++) {                                      \
        T y = pb_[i];                                                        \
        po_[i] = (EXPR);                                                     \
      }                                                                      \
    } else {                                                                 \
      T x = pa_[0], y = pb_[0];                                              \
      OT v_ = (EXPR);                                                        \
      for (int64_t i = 0; i < n; i++) po_[i] = v_;                           \
    }                                                                        \
  } while (0)

/* Comparisons write bool (one byte, 0 or 1). */
#define EW_RUN_FLOAT(T, POW)                                                 \
  switch (op) {                                                              \
    case BIN_ADD: EW_RUN(T, T, x + y); break;                                \
    case BIN_SUB: EW_RUN(T, T, x - y); break;                                \
    case BIN_MUL: EW_RUN(T, T, x * y); break;                                \
    case BIN_DIV: EW_RUN(T, T, x / y); break;                                \
    case BIN_POW: EW_RUN(T, T, POW(x, y)); break;                            \
    case BIN_MAX: EW_RUN(T, T, (x != x || x > y) ? x : y); break;            \
    case BIN_MIN: EW_RUN(T, T, (x != x || x < y) ? x : y); break;            \
    case BIN_EQ: EW_RUN(T, uint8_t, (uint8_t)(x == y)); break;               \
    case BIN_GT: EW_RUN(T, uint8_t, (uint8_t)(x > y)); break;                \
    case BIN_LT: EW_RUN(T, uint8_t, (uint8_t)(x < y)); break;                \
  }                                                                          \
  return EW_OK;

static int ew_run_f32(ew_binary op, const void *a, int sa, const void *b,
                      int sb, void *out, int64_t n) {
  EW_RUN_FLOAT(float, powf)
}

static int ew_run_f64(ew_binary op, const void *a, int sa, const void *b,
                      int sb, void *out, int64_t n) {
  EW_RUN_FLOAT(double, pow)
}

/* float16 / bfloat16: convert a block of each stepping operand (or the one
 * element of a fixed one) to float32, run the float32 loop, round back.
 * Comparisons write their bools straight into the output. */
#define EW_RUN_HALF(NAME, TO_F32, FROM_F32)                                  \
  static int NAME(ew_binary op, const void *a, int sa, const void *b,        \
                  int sb, void *out, int64_t n) {                            \
    const uint16_t *ha = (const uint16_t *)a;                                \
    const uint16_t *hb = (const uint16_t *)b;                                \
    bool cmp = op == BIN_EQ || op == BIN_GT || op == BIN_LT;                 \
    float fa[EW_BLOCK], fb[EW_BLOCK], fo[EW_BLOCK];                          \
    if (!sa) fa[0] = TO_F32(ha[0]);                                          \
    if (!sb) fb[0] = TO_F32(hb[0]);                                          \
    for (int64_t off = 0; off < n; off += EW_BLOCK) {                        \
      int64_t m = n - off < EW_BLOCK ? n - off : EW_BLOCK;                   \
      if (sa)                                                                \
        for (int64_t i = 0; i < m; i++) fa[i] = TO_F32(ha[off + i]);         \
      if (sb)                                                                \
        for (int64_t i = 0; i < m; i++) fb[i] = TO_F32(hb[off + i]);         \
      if (cmp) {                                                             \
        ew_run_f32(op, fa, sa, fb, sb, (uint8_t *)out + off, m);             \
      } else {                                                               \
        uint16_t *ho = (uint16_t *)out + off;                                \
        ew_run_f32(op, fa, sa, fb, sb, fo, m);                               \
        for (int64_t i = 0; i < m; i++) ho[i] = FROM_F32(fo[i]);             \
      }                                                                      \
    }                                                                        \
    return EW_OK;                                                            \
  }

EW_RUN_HALF(ew_run_f16, ew_f16_to_f32, ew_f32_to_f16)
EW_RUN_HALF(ew_run_bf16, ew_bf16_to_f32, ew_f32_to_bf16)

/* Signed integers: wrap-around arithmetic in the unsigned type UT; Div
 * truncates toward zero and MIN / -1 wraps to MIN (no trap). */
#define EW_RUN_SIGNED(T, UT)                                                 \
  int bad = EW_OK;                                                           \
  switch (op) {                                                              \
    case BIN_ADD: EW_RUN(T, T, (T)((UT)x + (UT)y)); break;                   \
    case BIN_SUB: EW_RUN(T, T, (T)((UT)x - (UT)y)); break;                   \
    case BIN_MUL: EW_RUN(T, T, (T)((UT)x * (UT)y)); break;                   \
    case BIN_DIV:                                                            \
      EW_RUN(T, T,                                                           \
             y == 0 ? (bad = EW_DIV_BY_ZERO, (T)0)                           \
                    : y == -1 ? (T)(0u - (UT)x) : (T)(x / y));               \
      break;                                                                 \
    case BIN_POW:                                                            \
      EW_RUN(T, T,                                                           \
             y < 0 ? (bad = EW_NEG_POW, (T)0)                                \
                   : (T)(UT)ew_ipow((uint64_t)x, (uint64_t)y));              \
      break;                                                                 \
    case BIN_MAX: EW_RUN(T, T, x > y ? x : y); break;                        \
    case BIN_MIN: EW_RUN(T, T, x < y ? x : y); break;                        \
    case BIN_EQ: EW_RUN(T, uint8_t, (uint8_t)(x == y)); break;               \
    case BIN_GT: EW_RUN(T, uint8_t, (uint8_t)(x > y)); break;                \
    case BIN_LT: EW_RUN(T, uint8_t, (uint8_t)(x < y)); break;                \
  }                                                                          \
  return bad;

static int ew_run_i32(ew_binary op, const void *a, int sa, const void *b,
                      int sb, void *out, int64_t n) {
  EW_RUN_SIGNED(int32_t, uint32_t)
}

static int ew_run_i64(ew_binary op, const void *a, int sa, const void *b,
                      int sb, void *out, int64_t n) {
  EW_RUN_SIGNED(int64_t, uint64_t)
}

static int ew_run_u8(ew_binary op, const void *a, int sa, const void *b,
                     int sb, void *out, int64_t n) {
  int bad = EW_OK;
  switch (op) {
    case BIN_ADD: EW_RUN(uint8_t, uint8_t, (uint8_t)(x + y)); break;
    case BIN_SUB: EW_RUN(uint8_t, uint8_t, (uint8_t)(x - y)); break;
    case BIN_MUL: EW_RUN(uint8_t, uint8_t, (uint8_t)((unsigned)x * y)); break;
    case BIN_DIV:
      EW_RUN(uint8_t, uint8_t,
             y == 0 ? (bad = EW_DIV_BY_ZERO, (uint8_t)0) : (uint8_t)(x / y));
      break;
    case BIN_POW: EW_RUN(uint8_t, uint8_t, (uint8_t)ew_ipow(x, y)); break;
    case BIN_MAX: EW_RUN(uint8_t, uint8_t, x > y ? x : y); break;
    case BIN_MIN: EW_RUN(uint8_t, uint8_t, x < y ? x : y); break;
    case BIN_EQ: EW_RUN(uint8_t, uint8_t, (uint8_t)(x == y)); break;
    case BIN_GT: EW_RUN(uint8_t, uint8_t, (uint8_t)(x > y)); break;
    case BIN_LT: EW_RUN(uint8_t, uint8_t, (uint8_t)(x < y)); break;
  }
  return bad;
}

/* bool takes Equal only; any non-zero byte is true. */
static int ew_run_bool(ew_binary op, const void *a, int sa, const void *b,
                       int sb, void *out, int64_t n) {
  if (op == BIN_EQ) EW_RUN(uint8_t, uint8_t, (uint8_t)((x != 0) == (y != 0)));
  return EW_OK;
}

/* The broadcast of (x, y) onto the output, collapsed: `rank` axes with the
 * output's dims and each operand's element strides (0 where broadcast). */
typedef struct ew_plan {
  int rank;
  int64_t dims[PD_MAX_RANK];
  int64_t sa[PD_MAX_RANK];
  int64_t sb[PD_MAX_RANK];
} ew_plan;

/* Strides of operand `s` (right-aligned to the output's rank `r`) on each
 * output axis: 0 where the operand has no such axis or a dim of 1. */
static void ew_strides(const dev_shape *s, int r, int64_t *strides) {
  int64_t stride = 1;
  for (int i = r - 1; i >= 0; i--) {
    int j = i - (r - s->rank);
    int64_t d = j >= 0 ? s->dims[j] : 1;
    strides[i] = d == 1 ? 0 : stride;
    stride *= d;
  }
}

/* Drops output axes of size 1 and merges neighbours that are contiguous in
 * both operands (outer stride == inner stride * inner dim, which also holds
 * for two broadcast axes). The innermost stride of each operand stays 0 or
 * 1. A single-element output ends up with one axis of 1. */
static void ew_plan_make(const dev_shape *out, const dev_shape *a,
                         const dev_shape *b, ew_plan *p) {
  int64_t sa[PD_MAX_RANK], sb[PD_MAX_RANK];
  ew_strides(a, out->rank, sa);
  ew_strides(b, out->rank, sb);
  p->rank = 0;
  for (int i = 0; i < out->rank; i++) {
    int64_t d = out->dims[i];
    if (d == 1) continue;
    int k = p->rank - 1;
    if (k >= 0 && p->sa[k] == sa[i] * d && p->sb[k] == sb[i] * d) {
      p->dims[k] *= d;
      p->sa[k] = sa[i];
      p->sb[k] = sb[i];
      continue;
    }
    p->dims[p->rank] = d;
    p->sa[p->rank] = sa[i];
    p->sb[p->rank] = sb[i];
    p->rank++;
  }
  if (p->rank == 0) {
    p->rank = 1;
    p->dims[0] = 1;
    p->sa[0] = 0;
    p->sb[0] = 0;
  }
}

/* Walks the outer axes of the plan with an N-d counter and calls `run` on
 * each innermost run. Stops at the first run-time failure. */
static int ew_broadcast(const ew_plan *p, ew_run_fn run, ew_binary op,
                        const char *a, const char *b, char *out, size_t es,
                        size_t out_es) {
  int inner = p->rank - 1;
  int64_t len = p->dims[inner];
  int ia = p->sa[inner] != 0, ib = p->sb[inner] != 0;
  int64_t idx[PD_MAX_RANK] = {0};
  int64_t oa = 0, ob = 0, oo = 0;
  for (;;) {
    int bad = run(op, a + (size_t)oa * es, ia, b + (size_t)ob * es, ib,
                  out + (size_t)oo * out_es, len);
    if (bad != EW_OK) return bad;
    oo += len;
    int k = inner - 1;
    for (; k >= 0; k--) {
      oa += p->sa[k];
      ob += p->sb[k];
      if (++idx[k] < p->dims[k]) break;
      oa -= p->sa[k] * p->dims[k];
      ob -= p->sb[k] * p->dims[k];
      idx[k] = 0;
    }
    if (k < 0) return EW_OK;
  }
}

static pd_code ew_binary_kernel(dev_kernel_ctx *c, ew_binary op,
                                dev_status *st) {
  const dev_shape *os = &c->out_shape[0];
  if (ew_count(os) == 0) return PD_OK;
  ew_run_fn run;
  switch (c->in_dtype[0]) {
    case PD_FLOAT32: run = ew_run_f32; break;
    case PD_FLOAT64: run = ew_run_f64; break;
    case PD_FLOAT16: run = ew_run_f16; break;
    case PD_BFLOAT16: run = ew_run_bf16; break;
    case PD_INT32: run = ew_run_i32; break;
    case PD_INT64: run = ew_run_i64; break;
    case PD_UINT8: run = ew_run_u8; break;
    case PD_BOOL: run = ew_run_bool; break;
    default:
      return dev_error(st, PD_INTERNAL, "%s: no kernel for dtype %s",
                       c->op->name, pd_dtype_name(c->in_dtype[0]));
  }
  ew_plan plan;
  ew_plan_make(os, &c->in_shape[0], &c->in_shape[1], &plan);
  int bad = ew_broadcast(&plan, run, op, (const char *)c->in_data[0],
                         (const char *)c->in_data[1], (char *)c->out_data[0],
                         pd_dtype_size(c->in_dtype[0]),
                         pd_dtype_size(c->out_dtype[0]));
  if (bad == EW_DIV_BY_ZERO)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: integer division by zero",
                     c->op->name);
  if (bad == EW_NEG_POW)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: integers to negative integer powers are not allowed",
                     c->op->name);
  return PD_OK;
}

/* x and y of one dtype in `mask`, shapes that broadcast (NumPy); output of
 * the broadcast shape and of x's dtype, or bool when `to_bool`. */
static pd_code ew_binary_infer(dev_infer_ctx *c, unsigned mask,
                               const char *expected, bool to_bool,
                               dev_status *st) {
  pd_code rc = dev_check_dtype_in(c, 0, mask, expected, st);
  if (rc == PD_OK) rc = dev_check_same_dtype(c, 0, 1, st);
  if (rc != PD_OK) return rc;
  dev_shape out;
  dev_status tmp = DEV_STATUS_INIT;
  if (dev_shape_broadcast(&c->in_shape[0], &c->in_shape[1], &out, &tmp) !=
      PD_OK) {
    char sx[128], sy[128];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: x has shape %s and y has shape %s, which do not "
                     "broadcast; expected each pair of trailing dims to be "
                     "equal or one of them 1 (NumPy broadcasting)",
                     c->op->name, dev_shape_str(&c->in_shape[0], sx, sizeof sx),
                     dev_shape_str(&c->in_shape[1], sy, sizeof sy));
  }
  pd_dtype odt = to_bool ? PD_BOOL : c->in_dtype[0];
  size_t bytes;
  rc = dev_shape_byte_size(odt, &out, &bytes, st);
  if (rc != PD_OK) return rc;
  c->out_dtype[0] = odt;
  c->out_shape[0] = out;
  return PD_OK;
}

static pd_code ew_infer_arith(dev_infer_ctx *c, dev_status *st) {
  return ew_binary_infer(c, DEV_MASK_NUMBER, EW_EXPECT_NUMBER, false, st);
}

static pd_code ew_infer_order(dev_infer_ctx *c, dev_status *st) {
  return ew_binary_infer(c, DEV_MASK_NUMBER, EW_EXPECT_NUMBER, true, st);
}

static pd_code ew_infer_equal(dev_infer_ctx *c, dev_status *st) {
  return ew_binary_infer(c, DEV_MASK_ALL, "any dtype", true, st);
}

#define EW_BINARY_KERNEL(FN, OP)                                \
  static pd_code FN(dev_kernel_ctx *c, dev_status *st) {        \
    return ew_binary_kernel(c, OP, st);                         \
  }

EW_BINARY_KERNEL(ew_k_add, BIN_ADD)
EW_BINARY_KERNEL(ew_k_sub, BIN_SUB)
EW_BINARY_KERNEL(ew_k_mul, BIN_MUL)
EW_BINARY_KERNEL(ew_k_div, BIN_DIV)
EW_BINARY_KERNEL(ew_k_pow, BIN_POW)
EW_BINARY_KERNEL(ew_k_max, BIN_MAX)
EW_BINARY_KERNEL(ew_k_min, BIN_MIN)
EW_BINARY_KERNEL(ew_k_equal, BIN_EQ)
EW_BINARY_KERNEL(ew_k_greater, BIN_GT)
EW_BINARY_KERNEL(ew_k_less, BIN_LT)

/* ------------------------------------------------------------------------ */
/* Cast                                                                     */

#define EW_CAST_LOOP(ST, DT, CONV)                 \
  do {                                             \
    const ST *s_ = (const ST *)in;                 \
    DT *d_ = (DT *)out;                            \
    for (int64_t i = 0; i < n; i++) {              \
      ST v = s_[i];                                \
      d_[i] = CONV;                                \
    }                                              \
  } while (0)

/* From a float32 value (float32, float16, bfloat16 sources; WIDEN turns the
 * stored element into float). One rounding only: float16 <-> bfloat16 goes
 * through the exact float32 value. */
#define EW_CAST_FROM_F32(ST, WIDEN)                                          \
  switch (dst) {                                                             \
    case PD_FLOAT32: EW_CAST_LOOP(ST, float, WIDEN(v)); break;               \
    case PD_FLOAT64: EW_CAST_LOOP(ST, double, (double)WIDEN(v)); break;      \
    case PD_FLOAT16: EW_CAST_LOOP(ST, uint16_t, ew_f32_to_f16(WIDEN(v))); break; \
    case PD_BFLOAT16:                                                        \
      EW_CAST_LOOP(ST, uint16_t, ew_f32_to_bf16(WIDEN(v)));                  \
      break;                                                                 \
    case PD_INT32: EW_CAST_LOOP(ST, int32_t, ew_sat_i32(WIDEN(v))); break;   \
    case PD_INT64: EW_CAST_LOOP(ST, int64_t, ew_sat_i64(WIDEN(v))); break;   \
    case PD_UINT8: EW_CAST_LOOP(ST, uint8_t, ew_sat_u8(WIDEN(v))); break;    \
    case PD_BOOL: EW_CAST_LOOP(ST, uint8_t, (uint8_t)(WIDEN(v) != 0)); break; \
    default: break;                                                          \
  }

#define EW_SAME(v) (v)

/* From an integer type ST (bool sources are normalised to 0/1 by NORM).
 * Integer -> integer conversions wrap as C's (and TF's) static_cast. */
#define EW_CAST_FROM_INT(ST, NORM)                                           \
  switch (dst) {                                                             \
    case PD_FLOAT32: EW_CAST_LOOP(ST, float, (float)NORM(v)); break;         \
    case PD_FLOAT64: EW_CAST_LOOP(ST, double, (double)NORM(v)); break;       \
    case PD_FLOAT16:                                                         \
      EW_CAST_LOOP(ST, uint16_t, ew_i64_to_f16((int64_t)NORM(v)));           \
      break;                                                                 \
    case PD_BFLOAT16:                                                        \
      EW_CAST_LOOP(ST, uint16_t, ew_i64_to_bf16((int64_t)NORM(v)));          \
      break;                                                                 \
    case PD_INT32: EW_CAST_LOOP(ST, int32_t, (int32_t)(uint32_t)NORM(v)); break; \
    case PD_INT64: EW_CAST_LOOP(ST, int64_t, (int64_t)NORM(v)); break;       \
    case PD_UINT8: EW_CAST_LOOP(ST, uint8_t, (uint8_t)NORM(v)); break;       \
    case PD_BOOL: EW_CAST_LOOP(ST, uint8_t, (uint8_t)(v != 0)); break;       \
    default: break;                                                          \
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
        case PD_FLOAT16: EW_CAST_LOOP(double, uint16_t, ew_f64_to_f16(v)); break;
        case PD_BFLOAT16: EW_CAST_LOOP(double, uint16_t, ew_f64_to_bf16(v)); break;
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
  pd_code rc = dev_check_dtype_in(c, 0, DEV_MASK_ALL, "any dtype", st);
  if (rc != PD_OK) return rc;
  pd_dtype dst = c->attrs[0].u.dtype;
  if (!dev_dtype_is_valid(dst))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Cast: attr DstT is not a valid dtype (%d); expected "
                     "float32, float64, float16, bfloat16, int32, int64, "
                     "uint8 or bool",
                     (int)dst);
  size_t bytes;
  rc = dev_shape_byte_size(dst, &c->in_shape[0], &bytes, st);
  if (rc != PD_OK) return rc;
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
  pd_code rc = dev_shape_byte_size(dt, s, &bytes, st);
  if (rc != PD_OK) return rc;
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
  pd_code rc = dev_check_dtype_in(c, 0, DEV_MASK_ALL, "any dtype", st);
  if (rc != PD_OK) return rc;
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

#define EW_UNARY_DEF(NAME, INFER, KERNEL)                                    \
  {                                                                          \
    .name = NAME, .num_inputs = 1, .inputs = {{"x", false, 1}},              \
    .num_outputs = 1, .outputs = {{"y", false, 1}}, .infer = INFER,          \
    .kernels = {[DEV_BACKEND_CPU] = KERNEL},                                 \
  }

#define EW_BINARY_DEF(NAME, INFER, KERNEL)                                   \
  {                                                                          \
    .name = NAME, .num_inputs = 2, .inputs = {{"x", false, 1}, {"y", false, 1}}, \
    .num_outputs = 1, .outputs = {{"z", false, 1}}, .infer = INFER,          \
    .kernels = {[DEV_BACKEND_CPU] = KERNEL},                                 \
  }

static dev_op_def ew_defs[] = {
    /* Unary, TF raw ops Neg, Abs, Square, Relu, Exp, Log, Sqrt, Rsqrt,
     * Tanh, Sigmoid. */
    EW_UNARY_DEF("Neg", ew_infer_unary_number, ew_k_neg),
    EW_UNARY_DEF("Abs", ew_infer_unary_number, ew_k_abs),
    EW_UNARY_DEF("Square", ew_infer_unary_number, ew_k_square),
    EW_UNARY_DEF("Relu", ew_infer_unary_number, ew_k_relu),
    EW_UNARY_DEF("Exp", ew_infer_unary_float, ew_k_exp),
    EW_UNARY_DEF("Log", ew_infer_unary_float, ew_k_log),
    EW_UNARY_DEF("Sqrt", ew_infer_unary_float, ew_k_sqrt),
    EW_UNARY_DEF("Rsqrt", ew_infer_unary_float, ew_k_rsqrt),
    EW_UNARY_DEF("Tanh", ew_infer_unary_float, ew_k_tanh),
    EW_UNARY_DEF("Sigmoid", ew_infer_unary_float, ew_k_sigmoid),
    /* Binary with broadcasting, TF raw ops of the same names. */
    EW_BINARY_DEF("Add", ew_infer_arith, ew_k_add),
    EW_BINARY_DEF("Sub", ew_infer_arith, ew_k_sub),
    EW_BINARY_DEF("Mul", ew_infer_arith, ew_k_mul),
    EW_BINARY_DEF("Div", ew_infer_arith, ew_k_div),
    EW_BINARY_DEF("Pow", ew_infer_arith, ew_k_pow),
    EW_BINARY_DEF("Maximum", ew_infer_arith, ew_k_max),
    EW_BINARY_DEF("Minimum", ew_infer_arith, ew_k_min),
    EW_BINARY_DEF("Equal", ew_infer_equal, ew_k_equal),
    EW_BINARY_DEF("Greater", ew_infer_order, ew_k_greater),
    EW_BINARY_DEF("Less", ew_infer_order, ew_k_less),
    /* Cast(x; DstT, Truncate): Truncate is accepted and ignored. */
    {
        .name = "Cast",
        .num_inputs = 1,
        .inputs = {{"x", false, 1}},
        .num_outputs = 1,
        .outputs = {{"y", false, 1}},
        .num_attrs = 2,
        .attrs = {{"DstT", DEV_ATTR_DTYPE, {.type = DEV_ATTR_NONE}},
                  {"Truncate", DEV_ATTR_BOOL,
                   {.type = DEV_ATTR_BOOL, .u.b = false}}},
        .infer = ew_infer_cast,
        .kernels = {[DEV_BACKEND_CPU] = ew_k_cast},
    },
    /* Fill(; shape, value, dtype): TF's Fill takes dims and value as
     * tensors; here they are attributes. */
    {
        .name = "Fill",
        .num_inputs = 0,
        .num_outputs = 1,
        .outputs = {{"output", false, 1}},
        .num_attrs = 3,
        .attrs = {{"shape", DEV_ATTR_SHAPE, {.type = DEV_ATTR_NONE}},
                  {"value", DEV_ATTR_FLOAT, {.type = DEV_ATTR_NONE}},
                  {"dtype", DEV_ATTR_DTYPE,
                   {.type = DEV_ATTR_DTYPE, .u.dtype = PD_FLOAT32}}},
        .infer = ew_infer_fill,
        .kernels = {[DEV_BACKEND_CPU] = ew_k_fill},
    },
    EW_UNARY_DEF("ZerosLike", ew_infer_like, ew_k_zeros_like),
    EW_UNARY_DEF("OnesLike", ew_infer_like, ew_k_ones_like),
};

/* Registers the element-wise ops and their CPU kernels. */
void dev_register_elementwise_ops(void) {
  for (size_t i = 0; i < sizeof ew_defs / sizeof ew_defs[0]; i++)
    dev_register_or_die(&ew_defs[i]);
}
