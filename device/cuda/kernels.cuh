/* Shared by the CUDA kernel files (kernels_*.cu): storage types of the
 * dtypes and their compute types, conversions that match the CPU kernels
 * bit for bit, dtype dispatch, and launch helpers.
 *
 * Conventions of every kernel here:
 *  - float16 and bfloat16 are computed in float32 and rounded to nearest even
 *    on store (as the CPU kernels do); the conversions are the hardware's
 *    round-to-nearest-even instructions (subnormals kept: nvcc's default
 *    -ftz=false), equal to dev_float_to_half & co. for every non-NaN value;
 *    a NaN stays a NaN, as the canonical 0x7fff rather than with the CPU's
 *    sign and payload (the GPU's own arithmetic makes canonical NaNs too).
 *  - integer arithmetic wraps (computed in the unsigned type).
 *  - grid-stride loops with 64-bit indices; grids are capped (launch_grid),
 *    so any element count fits one launch.
 *  - no --use_fast_math: IEEE division and square roots, as on the CPU.
 *  - nvcc contracts a * b + c into one fused multiply-add by default
 *    (--fmad=true); the CPU build never does (ISO C, no -mfma). Where a
 *    product feeds a sum, kernels write it with mul_rn (or __fadd_rn &
 *    co.), which nvcc never fuses, so both backends round twice. */
#ifndef PARADEV_CUDA_KERNELS_CUH
#define PARADEV_CUDA_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <limits>
#include <type_traits>

#include "cuda_int.h"

namespace pdk {

/* Storage types with their own identity (uint16_t is both float16 and
 * bfloat16 otherwise). */
struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};
struct boolean {
  uint8_t v;
};

/* Tr<T>: C is the compute type; load widens a stored value, store rounds a
 * computed one. */
template <class T>
struct Tr {
  using C = T;
  static __device__ __forceinline__ C load(T x) { return x; }
  static __device__ __forceinline__ T store(C x) { return x; }
};
template <>
struct Tr<f16> {
  using C = float;
  static __device__ __forceinline__ float load(f16 x) {
    return __half2float(__ushort_as_half(x.bits));
  }
  static __device__ __forceinline__ f16 store(float x) {
    return f16{__half_as_ushort(__float2half_rn(x))};
  }
};
template <>
struct Tr<bf16> {
  using C = float;
  static __device__ __forceinline__ float load(bf16 x) {
    return __bfloat162float(__ushort_as_bfloat16(x.bits));
  }
  static __device__ __forceinline__ bf16 store(float x) {
    return bf16{__bfloat16_as_ushort(__float2bfloat16_rn(x))};
  }
};
template <>
struct Tr<boolean> {
  using C = uint8_t;
  static __device__ __forceinline__ uint8_t load(boolean x) { return x.v != 0; }
  static __device__ __forceinline__ boolean store(uint8_t x) { return boolean{(uint8_t)(x != 0)}; }
};

template <class T>
struct is_floating {
  static constexpr bool value = false;
};
template <>
struct is_floating<float> {
  static constexpr bool value = true;
};
template <>
struct is_floating<double> {
  static constexpr bool value = true;
};
template <>
struct is_floating<f16> {
  static constexpr bool value = true;
};
template <>
struct is_floating<bf16> {
  static constexpr bool value = true;
};

/* a * b rounded on its own (never fused into a following add, see above). */
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

/* The unsigned type of a signed integer (wrap-around arithmetic). */
template <class T>
struct Unsigned {
  using U = T;
};
template <>
struct Unsigned<int32_t> {
  using U = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using U = uint64_t;
};
template <>
struct Unsigned<uint8_t> {
  using U = uint32_t; /* uint8 arithmetic in unsigned int, truncated on store */
};

/* ---------------------------------------------------------------------- */
/* Conversions matching device/ops/elementwise.c                            */

/* float/double -> integer: truncate toward zero, saturate, NaN -> 0. */
__device__ __forceinline__ int32_t sat_i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return INT32_MAX;
  if (v <= -2147483648.0) return INT32_MIN;
  return (int32_t)v;
}
__device__ __forceinline__ int64_t sat_i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}
__device__ __forceinline__ uint8_t sat_u8(double v) {
  if (v != v) return 0;
  if (v >= 255.0) return 255;
  if (v <= 0.0) return 0;
  return (uint8_t)v;
}

/* double -> float32 rounded to odd (truncate, set the last bit if inexact):
 * rounding that again to float16/bfloat16 rounds the double exactly once. */
__device__ __forceinline__ float f64_to_f32_odd(double d) {
  if (d != d) return (float)d;
  if (fabs(d) > 3.4028234663852886e38) return d < 0 ? -__int_as_float(0x7f7fffff) : __int_as_float(0x7f7fffff);
  float f = __double2float_rz(d);
  if ((double)f == d) return f;
  return __int_as_float(__float_as_int(f) | 1);
}

/* int64 -> float32 rounded to odd. */
__device__ __forceinline__ float i64_to_f32_odd(int64_t v) {
  uint64_t u = v < 0 ? 0ull - (uint64_t)v : (uint64_t)v;
  float f;
  if (u < (1ull << 24)) {
    f = (float)u;
  } else {
    int bits = 64 - __clzll((long long)u);
    int shift = bits - 24;
    uint64_t m = u >> shift;
    if (u & ((1ull << shift) - 1u)) m |= 1u;
    f = ldexpf((float)m, shift);
  }
  return v < 0 ? -f : f;
}

/* ---------------------------------------------------------------------- */
/* Dispatch from a pd_dtype to a storage type                               */

#define PDK_CASE(DT, TYPE, ...) \
  case DT: {                    \
    using T = TYPE;             \
    __VA_ARGS__;                \
  } break;

/* Every dtype; bool as `boolean`. */
#define PDK_DISPATCH_ALL(dt, ...)                          \
  switch (dt) {                                            \
    PDK_CASE(PD_FLOAT32, float, __VA_ARGS__)               \
    PDK_CASE(PD_FLOAT64, double, __VA_ARGS__)              \
    PDK_CASE(PD_FLOAT16, ::pdk::f16, __VA_ARGS__)          \
    PDK_CASE(PD_BFLOAT16, ::pdk::bf16, __VA_ARGS__)        \
    PDK_CASE(PD_INT32, int32_t, __VA_ARGS__)               \
    PDK_CASE(PD_INT64, int64_t, __VA_ARGS__)               \
    PDK_CASE(PD_UINT8, uint8_t, __VA_ARGS__)               \
    PDK_CASE(PD_BOOL, ::pdk::boolean, __VA_ARGS__)         \
    default: break;                                        \
  }

/* The number dtypes (no bool). */
#define PDK_DISPATCH_NUMBER(dt, ...)                       \
  switch (dt) {                                            \
    PDK_CASE(PD_FLOAT32, float, __VA_ARGS__)               \
    PDK_CASE(PD_FLOAT64, double, __VA_ARGS__)              \
    PDK_CASE(PD_FLOAT16, ::pdk::f16, __VA_ARGS__)          \
    PDK_CASE(PD_BFLOAT16, ::pdk::bf16, __VA_ARGS__)        \
    PDK_CASE(PD_INT32, int32_t, __VA_ARGS__)               \
    PDK_CASE(PD_INT64, int64_t, __VA_ARGS__)               \
    PDK_CASE(PD_UINT8, uint8_t, __VA_ARGS__)               \
    default: break;                                        \
  }

/* The floating dtypes. */
#define PDK_DISPATCH_FLOAT(dt, ...)                        \
  switch (dt) {                                            \
    PDK_CASE(PD_FLOAT32, float, __VA_ARGS__)               \
    PDK_CASE(PD_FLOAT64, double, __VA_ARGS__)              \
    PDK_CASE(PD_FLOAT16, ::pdk::f16, __VA_ARGS__)          \
    PDK_CASE(PD_BFLOAT16, ::pdk::bf16, __VA_ARGS__)        \
    default: break;                                        \
  }

/* Unsigned integers of 1, 2, 4 and 8 bytes: kernels that only move bytes. */
#define PDK_DISPATCH_SIZE(es, ...)                         \
  switch (es) {                                            \
    PDK_CASE(1, uint8_t, __VA_ARGS__)                      \
    PDK_CASE(2, uint16_t, __VA_ARGS__)                     \
    PDK_CASE(4, uint32_t, __VA_ARGS__)                     \
    PDK_CASE(8, uint64_t, __VA_ARGS__)                     \
    default: break;                                        \
  }

/* ---------------------------------------------------------------------- */
/* Launch helpers                                                           */

constexpr int kThreads = 256;

/* Blocks for n elements with a grid-stride loop: enough to fill the GPU a
 * few times over, never more than needed. */
inline unsigned launch_grid(int64_t n, int sm_count) {
  int64_t want = (n + kThreads - 1) / kThreads;
  int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 80) * 16;
  if (want > cap) want = cap;
  return (unsigned)(want > 0 ? want : 1);
}

__device__ __forceinline__ int64_t global_index() {
  return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t global_stride() { return (int64_t)gridDim.x * blockDim.x; }

inline int64_t num_elements(const dev_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return n;
}

/* Up to PD_MAX_RANK dims and strides passed by value to a kernel. */
struct Strides {
  int rank;
  int64_t dims[PD_MAX_RANK];
  int64_t s0[PD_MAX_RANK]; /* operand strides in elements */
  int64_t s1[PD_MAX_RANK];
};

/* Offsets of element i of a row-major index space `p.dims` in two operands
 * with strides p.s0 / p.s1. 32-bit division when everything fits. */
__device__ __forceinline__ void offsets2(const Strides &p, int64_t i, bool small, int64_t *o0,
                                         int64_t *o1) {
  int64_t a = 0, b = 0;
  if (small) {
    uint32_t r = (uint32_t)i;
#pragma unroll
    for (int k = PD_MAX_RANK - 1; k >= 0; k--) {
      if (k >= p.rank) continue;
      uint32_t d = (uint32_t)p.dims[k];
      uint32_t q = r / d, idx = r - q * d;
      a += (int64_t)idx * p.s0[k];
      b += (int64_t)idx * p.s1[k];
      r = q;
    }
  } else {
    int64_t r = i;
#pragma unroll
    for (int k = PD_MAX_RANK - 1; k >= 0; k--) {
      if (k >= p.rank) continue;
      int64_t q = r / p.dims[k], idx = r - q * p.dims[k];
      a += idx * p.s0[k];
      b += idx * p.s1[k];
      r = q;
    }
  }
  *o0 = a;
  *o1 = b;
}

}  // namespace pdk

#endif /* PARADEV_CUDA_KERNELS_CUH */
