/* dtypes: classes, float16/bfloat16 conversions and a generic slow element
 * accessor (names and sizes: common/types.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"

bool dev_dtype_is_valid(pd_dtype dt) {
  return dt > PD_DTYPE_INVALID && dt < PD_DTYPE_COUNT;
}

bool dev_dtype_is_floating(pd_dtype dt) {
  return dt == PD_FLOAT32 || dt == PD_FLOAT64 || dt == PD_FLOAT16 ||
         dt == PD_BFLOAT16;
}

bool dev_dtype_is_integer(pd_dtype dt) {
  return dt == PD_INT32 || dt == PD_INT64 || dt == PD_UINT8;
}

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* IEEE 754 binary32 -> binary16, round to nearest even, NaN stays NaN. */
uint16_t dev_float_to_half(float f) {
  uint32_t x = f2u(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) /* inf or NaN */
    return (uint16_t)(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  if (abs >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to inf */
  if (abs < 0x38800000u) {              /* subnormal half or zero */
    if (abs < 0x33000000u) return sign; /* < half the smallest subnormal */
    uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    int shift = 126 - (int)(abs >> 23); /* 14..24 */
    uint32_t h = mant >> (shift);
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13); /* rebias exponent 127->15 */
  uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float dev_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return u2f(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return u2f(sign);
    float v = ldexpf((float)mant, -24);
    return sign ? -v : v;
  }
  return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t dev_float_to_bfloat16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u);
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7FFFu + lsb;
  return (uint16_t)(x >> 16);
}

float dev_bfloat16_to_float(uint16_t b) { return u2f((uint32_t)b << 16); }

/* Converts a double to an integer type without undefined behaviour: NaN gives
 * 0 and out-of-range values saturate. */
static int64_t sat_i64(double v, double lo, double hi) {
  if (isnan(v)) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return hi >= 9223372036854775807.0 ? INT64_MAX : (int64_t)hi;
  return (int64_t)v;
}

double dev_load_f64(pd_dtype dt, const void *data, int64_t i) {
  switch (dt) {
    case PD_FLOAT32: return ((const float *)data)[i];
    case PD_FLOAT64: return ((const double *)data)[i];
    case PD_FLOAT16: return dev_half_to_float(((const uint16_t *)data)[i]);
    case PD_BFLOAT16: return dev_bfloat16_to_float(((const uint16_t *)data)[i]);
    case PD_INT32: return ((const int32_t *)data)[i];
    case PD_INT64: return (double)((const int64_t *)data)[i];
    case PD_UINT8: return ((const uint8_t *)data)[i];
    case PD_BOOL: return ((const uint8_t *)data)[i] ? 1.0 : 0.0;
    default: return 0.0;
  }
}

void dev_store_f64(pd_dtype dt, void *data, int64_t i, double v) {
  switch (dt) {
    case PD_FLOAT32: ((float *)data)[i] = (float)v; break;
    case PD_FLOAT64: ((double *)data)[i] = v; break;
    case PD_FLOAT16: ((uint16_t *)data)[i] = dev_float_to_half((float)v); break;
    case PD_BFLOAT16:
      ((uint16_t *)data)[i] = dev_float_to_bfloat16((float)v);
      break;
    case PD_INT32:
      ((int32_t *)data)[i] = (int32_t)sat_i64(v, -2147483648.0, 2147483647.0);
      break;
    case PD_INT64:
      ((int64_t *)data)[i] =
          sat_i64(v, -9223372036854775808.0, 9223372036854775807.0);
      break;
    case PD_UINT8:
      ((uint8_t *)data)[i] = (uint8_t)sat_i64(v, 0.0, 255.0);
      break;
    case PD_BOOL: ((uint8_t *)data)[i] = v != 0.0; break;
    default: break;
  }
}

void dev__widen_16(pd_dtype dt, const uint16_t *src, float *dst, int64_t n) {
  if (dt == PD_FLOAT16)
    for (int64_t i = 0; i < n; i++) dst[i] = dev_half_to_float(src[i]);
  else
    for (int64_t i = 0; i < n; i++) dst[i] = dev_bfloat16_to_float(src[i]);
}

void dev__narrow_16(pd_dtype dt, const float *src, uint16_t *dst, int64_t n) {
  if (dt == PD_FLOAT16)
    for (int64_t i = 0; i < n; i++) dst[i] = dev_float_to_half(src[i]);
  else
    for (int64_t i = 0; i < n; i++) dst[i] = dev_float_to_bfloat16(src[i]);
}

void dev__copy_box(char *full, const dev_shape *full_shape,
                   const int64_t *begin, char *box, const dev_shape *box_shape,
                   size_t es, bool to_box) {
  int r = box_shape->rank;
  int64_t outer_total = 1;
  for (int d = 0; d < r; d++) outer_total *= box_shape->dims[d];
  if (outer_total == 0) return;
  if (r == 0) {
    if (to_box)
      memcpy(box, full, es);
    else
      memcpy(full, box, es);
    return;
  }
  /* Innermost axes taken whole extend the contiguous run. */
  int k = r - 1;
  while (k > 0 && begin[k] == 0 && box_shape->dims[k] == full_shape->dims[k])
    k--;
  int64_t fs[PD_MAX_RANK];
  fs[r - 1] = 1;
  for (int d = r - 2; d >= 0; d--) fs[d] = fs[d + 1] * full_shape->dims[d + 1];
  size_t run = (size_t)(box_shape->dims[k] * fs[k]) * es;
  int64_t off = 0;
  for (int d = 0; d <= k; d++) off += begin[d] * fs[d];
  int64_t outer = 1;
  for (int d = 0; d < k; d++) outer *= box_shape->dims[d];
  int64_t idx[PD_MAX_RANK] = {0};
  for (int64_t it = 0; it < outer; it++) {
    if (to_box)
      memcpy(box, full + (size_t)off * es, run);
    else
      memcpy(full + (size_t)off * es, box, run);
    box += run;
    for (int d = k - 1; d >= 0; d--) {
      off += fs[d];
      if (++idx[d] < box_shape->dims[d]) break;
      off -= fs[d] * box_shape->dims[d];
      idx[d] = 0;
    }
  }
}

float *dev__scratch_f32(int64_t n) {
  return calloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

pd_code dev__scratch_error(const dev_kernel_ctx *c, int64_t n, dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED,
                   "%s: cannot allocate %lld float32 scratch elements",
                   c->op->name, (long long)n);
}
