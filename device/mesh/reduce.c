/* The local step of a hierarchical cross-rank reduction (issue #16,
 * coll.c): a rank's participants' host buffers reduced element-wise into
 * one, with the transport's semantics (dev_mesh.h: SUM, PROD, MAX, MIN;
 * coll.c maps MEAN to SUM and bool to MAX / MIN first).
 *
 * Floats accumulate in their own type (16-bit floats in float32, rounded
 * once per element); integers wrap (two's complement, summed unsigned);
 * max / min propagate NaN as the CPU backend's local collectives do; bool
 * is a logical or (MAX) / and (MIN) of "not zero". In blocks of BLK
 * elements so the accumulator stays in the cache. */
#include <string.h>

#include "mesh_int.h"

#define BLK 1024

#define FLOAT_REDUCE(NAME, T, ACC, LOAD, STORE)                                \
  static void NAME(int red, int nin, const void *const *in, void *out,         \
                   size_t lo, size_t hi) {                                     \
    ACC acc[BLK];                                                              \
    for (size_t s = lo; s < hi; s += BLK) {                                    \
      const size_t m = hi - s < BLK ? hi - s : BLK;                            \
      const T *a0 = (const T *)in[0] + s;                                      \
      for (size_t i = 0; i < m; i++) acc[i] = LOAD(a0[i]);                     \
      for (int k = 1; k < nin; k++) {                                          \
        const T *ak = (const T *)in[k] + s;                                    \
        switch (red) {                                                         \
          case DEV_RED_SUM:                                                    \
            for (size_t i = 0; i < m; i++) acc[i] += LOAD(ak[i]);              \
            break;                                                             \
          case DEV_RED_PROD:                                                   \
            for (size_t i = 0; i < m; i++) acc[i] *= LOAD(ak[i]);              \
            break;                                                             \
          case DEV_RED_MAX:                                                    \
            for (size_t i = 0; i < m; i++) {                                   \
              ACC v = LOAD(ak[i]);                                             \
              acc[i] = (v > acc[i] || v != v) ? v : acc[i];                    \
            }                                                                  \
            break;                                                             \
          default:                                                             \
            for (size_t i = 0; i < m; i++) {                                   \
              ACC v = LOAD(ak[i]);                                             \
              acc[i] = (v < acc[i] || v != v) ? v : acc[i];                    \
            }                                                                  \
            break;                                                             \
        }                                                                      \
      }                                                                        \
      T *o = (T *)out + s;                                                     \
      for (size_t i = 0; i < m; i++) o[i] = STORE(acc[i]);                     \
    }                                                                          \
  }

#define ID(x) (x)
static inline float h2f(uint16_t h) { return dev_half_to_float(h); }
static inline float b2f(uint16_t h) { return dev_bfloat16_to_float(h); }

FLOAT_REDUCE(reduce_f32, float, float, ID, ID)
FLOAT_REDUCE(reduce_f64, double, double, ID, ID)
FLOAT_REDUCE(reduce_f16, uint16_t, float, h2f, dev_float_to_half)
FLOAT_REDUCE(reduce_bf16, uint16_t, float, b2f, dev_float_to_bfloat16)

/* Integers: sums and products unsigned (wrap-around), comparisons in T. */
#define INT_REDUCE(NAME, T, UT)                                                \
  static void NAME(int red, int nin, const void *const *in, void *out,         \
                   size_t lo, size_t hi) {                                     \
    T *o = out;                                                                \
    for (size_t i = lo; i < hi; i++) {                                         \
      T a = ((const T *)in[0])[i];                                             \
      for (int k = 1; k < nin; k++) {                                          \
        T v = ((const T *)in[k])[i];                                           \
        switch (red) {                                                         \
          case DEV_RED_SUM: a = (T)((UT)a + (UT)v); break;                     \
          case DEV_RED_PROD: a = (T)((UT)a * (UT)v); break;                    \
          case DEV_RED_MAX: a = v > a ? v : a; break;                          \
          default: a = v < a ? v : a; break;                                   \
        }                                                                      \
      }                                                                        \
      o[i] = a;                                                                \
    }                                                                          \
  }

INT_REDUCE(reduce_i32, int32_t, uint32_t)
INT_REDUCE(reduce_i64, int64_t, uint64_t)
INT_REDUCE(reduce_u8, uint8_t, uint8_t)

/* bool: MAX (or) and MIN (and) of "not zero"; coll.c maps SUM / PROD. */
static void reduce_bool(int red, int nin, const void *const *in, void *out,
                        size_t lo, size_t hi) {
  uint8_t *o = out;
  const bool any = red != DEV_RED_MIN && red != DEV_RED_PROD;
  for (size_t i = lo; i < hi; i++) {
    uint8_t a = ((const uint8_t *)in[0])[i] != 0;
    for (int k = 1; k < nin; k++) {
      uint8_t v = ((const uint8_t *)in[k])[i] != 0;
      a = any ? (uint8_t)(a | v) : (uint8_t)(a & v);
    }
    o[i] = a;
  }
}

bool dev__mesh_reduce(pd_dtype dt, int red, int nin, const void *const *in,
                      void *out, size_t lo, size_t hi) {
  void (*fn)(int, int, const void *const *, void *, size_t, size_t) = NULL;
  switch (dt) {
    case PD_FLOAT32: fn = reduce_f32; break;
    case PD_FLOAT64: fn = reduce_f64; break;
    case PD_FLOAT16: fn = reduce_f16; break;
    case PD_BFLOAT16: fn = reduce_bf16; break;
    case PD_INT32: fn = reduce_i32; break;
    case PD_INT64: fn = reduce_i64; break;
    case PD_UINT8: fn = reduce_u8; break;
    case PD_BOOL: fn = reduce_bool; break;
    default: return false;
  }
  if (hi > lo) fn(red, nin, in, out, lo, hi);
  return true;
}
