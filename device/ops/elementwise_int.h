/* Private header of the element-wise op files (device/ops/elementwise.c:
 * unary math, binary.c: binary arithmetic and comparisons with broadcasting,
 * fill_cast.c: Cast, Fill, ZerosLike, OnesLike): inline float16 / bfloat16
 * conversions for the kernels' hot loops, the helpers Cast uses for
 * conversions that must round exactly once (double and 64-bit integers to
 * the 16-bit floats), saturating conversions, and the op-definition macros.
 *
 * Everything here is pure integer bit manipulation, so the result does not
 * depend on the compiler's floating-point contraction or the FPU's rounding
 * mode; it matches dev_float_to_half & co. (IEEE 754 round to nearest even,
 * NaN stays a quiet NaN). Kept inline because an out-of-line call per
 * element would dominate Add or Mul on 16-bit data. */
#ifndef PARADEV_OPS_ELEMENTWISE_INT_H
#define PARADEV_OPS_ELEMENTWISE_INT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../device_int.h"

static inline uint32_t ew_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float ew_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* bfloat16 is the upper half of a float32: widening is exact. */
static inline float ew_bf16_to_f32(uint16_t b) {
  return ew_f32_from_bits((uint32_t)b << 16);
}

/* float32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t ew_f32_to_bf16(float f) {
  uint32_t u = ew_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* IEEE binary16 -> float32 (exact). */
static inline float ew_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t e = ((uint32_t)h >> 10) & 0x1fu;
  uint32_t m = (uint32_t)h & 0x3ffu;
  if (e == 0x1fu) return ew_f32_from_bits(sign | 0x7f800000u | (m << 13));
  if (e != 0) return ew_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
  /* zero or subnormal: m * 2^-24, exact in float32 */
  float f = (float)m * 0x1p-24f;
  return sign ? -f : f;
}

/* float32 -> IEEE binary16, round to nearest even (65520 and above go to
 * infinity, as IEEE requires); NaN stays a quiet NaN. */
static inline uint16_t ew_f32_to_f16(float f) {
  uint32_t x = ew_f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) /* NaN: quiet, keep the top of the payload */
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 */
  if (ax >= 0x38800000u) {         /* normal half: 2^-14 <= |f| < 65520 */
    uint32_t r = ax - 0x38000000u; /* rebias the exponent: 127 -> 15 */
    r += 0x0fffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  if (ax <= 0x33000000u) return sign; /* |f| <= 2^-25 rounds to zero */
  /* subnormal half: |f| = mant * 2^(e-150); in units of 2^-24 that is
   * mant >> (126 - e), 14 <= 126 - e <= 24. */
  uint32_t e = ax >> 23;
  uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126u - e;
  uint32_t m = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (m & 1u))) m++;
  return (uint16_t)(sign | m);
}

/* double -> float32 rounded to odd: truncate toward zero and set the last
 * bit when inexact. Rounding that result once more to a format at least two
 * bits narrower (float16, bfloat16) gives the correctly rounded value of the
 * double (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums:
 * proved algorithms using rounding to odd", 2008); rounding through a plain
 * float32 would round twice. */
static inline float ew_f64_to_f32_odd(double d) {
  if (d != d) return (float)d;
  if (fabs(d) > 3.4028234663852886e38) /* beyond FLT_MAX: odd max float */
    return d < 0 ? -ew_f32_from_bits(0x7f7fffffu)
                 : ew_f32_from_bits(0x7f7fffffu);
  float f = (float)d;
  if ((double)f == d) return f;
  if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f);
  return ew_f32_from_bits(ew_f32_bits(f) | 1u);
}

/* int64 -> float32 rounded to odd (see ew_f64_to_f32_odd). */
static inline float ew_i64_to_f32_odd(int64_t v) {
  uint64_t u = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
  float f;
  if (u < (UINT64_C(1) << 24)) {
    f = (float)u;
  } else {
    int bits = 64 - __builtin_clzll(u);
    int shift = bits - 24;
    uint64_t m = u >> shift;
    if (u & ((UINT64_C(1) << shift) - 1u)) m |= 1u;
    f = ldexpf((float)m, shift);
  }
  return v < 0 ? -f : f;
}

/* ------------------------------------------------------------------------ */
/* Helpers shared by the element-wise op files                              */

/* Elements per float32 scratch block of the float16/bfloat16 paths. */
#define EW_BLOCK 256

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */

/* Element count of a shape already validated by inference. */
static inline int64_t ew_count(const dev_shape *s) {
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

/* A unary element-wise op: x of a dtype in MASK, y of x's dtype and shape;
 * SUMMARY and NOTES (NULL: none) for the op reference. */
#define EW_UNARY_DEF(NAME, INFER, KERNEL, MASK, SUMMARY, NOTES)                \
  {                                                                            \
    .name = NAME, .num_inputs = 1, .inputs = {{"x", false, 1, MASK}},          \
    .num_outputs = 1, .outputs = {{"y", false, 1, MASK, "same as x"}},         \
    .infer = INFER, .kernels = {[DEV_BACKEND_CPU] = KERNEL},                   \
    .summary = SUMMARY, .notes = NOTES,                                        \
  }

/* A binary element-wise op with NumPy broadcasting: x and y of one dtype in
 * MASK; z of OUT_MASK (RULE says which). */
#define EW_BINARY_DEF(NAME, INFER, KERNEL, MASK, OUT_MASK, RULE, SUMMARY,      \
                      NOTES)                                                   \
  {                                                                            \
    .name = NAME, .num_inputs = 2,                                             \
    .inputs = {{"x", false, 1, MASK}, {"y", false, 1, MASK, "same as x"}},     \
    .num_outputs = 1, .outputs = {{"z", false, 1, OUT_MASK, RULE}},            \
    .infer = INFER, .kernels = {[DEV_BACKEND_CPU] = KERNEL},                   \
    .summary = SUMMARY, .notes = NOTES,                                        \
  }

/* What infer messages say the dtype masks accept. */
#define EW_EXPECT_NUMBER                                                       \
  "a number dtype (float32, float64, float16, bfloat16, int32, int64, uint8)"
#define EW_EXPECT_FLOAT "a floating dtype (float32, float64, float16, bfloat16)"

#endif /* PARADEV_OPS_ELEMENTWISE_INT_H */
