/* CUDA kernels of the element-wise ops (device/ops/elementwise.c): unary
 * math, binary arithmetic and comparisons with NumPy broadcasting, Cast,
 * Fill, ZerosLike, OnesLike, BiasAdd (device/ops/linalg.c) as a broadcast
 * Add, and the element-wise gradients of device/ops/grad_ops.c (ReluGrad,
 * SqrtGrad, RsqrtGrad, TanhGrad, SigmoidGrad); plus the element-wise kernels
 * of the copy-path collectives.
 *
 * One generic kernel per family: k_unary<Op, T> and k_binary<Op, T> apply a
 * functor over a dtype's storage type. Binary operands are addressed through
 * the collapsed broadcast (the CPU kernel's plan: size-1 axes dropped,
 * neighbours contiguous in both operands merged), so same-shape and scalar
 * operands are one flat axis and need no index arithmetic.
 *
 * Semantics are the CPU kernels', case by case: integer arithmetic wraps,
 * integer Div truncates, MIN / -1 wraps, a zero divisor or a negative integer
 * exponent fails the op (the kernel records it; the host reads it back after
 * the stream is done), Maximum/Minimum propagate NaN, conversions saturate
 * and map NaN to 0, float16/bfloat16 are computed in float32. */
#include "kernels.cuh"

using namespace pdk;

namespace {

/* ---------------------------------------------------------------------- */
/* float / double math with one name                                        */

__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }

/* ---------------------------------------------------------------------- */
/* Unary                                                                    */

enum Un { UN_NEG, UN_ABS, UN_SQUARE, UN_RELU, UN_EXP, UN_LOG, UN_SQRT, UN_RSQRT, UN_TANH, UN_SIGMOID };

template <int OP, class T>
struct UnaryOp {
  using C = typename Tr<T>::C;
  __device__ __forceinline__ C operator()(C x) const {
    if constexpr (is_floating<T>::value) {
      if constexpr (OP == UN_NEG) return -x;
      else if constexpr (OP == UN_ABS) return m_abs(x);
      else if constexpr (OP == UN_SQUARE) return x * x;
      else if constexpr (OP == UN_RELU) return x < (C)0 ? (C)0 : x; /* NaN stays */
      else if constexpr (OP == UN_EXP) return m_exp(x);
      else if constexpr (OP == UN_LOG) return m_log(x);
      else if constexpr (OP == UN_SQRT) return m_sqrt(x);
      else if constexpr (OP == UN_RSQRT) return (C)1 / m_sqrt(x);
      else if constexpr (OP == UN_TANH) return m_tanh(x);
      else { /* sigmoid; e^-|x| never overflows */
        C e = m_exp(-m_abs(x));
        return (x >= (C)0 ? (C)1 : e) / ((C)1 + e);
      }
    } else {
      using U = typename Unsigned<T>::U;
      constexpr bool is_signed = std::is_signed<T>::value;
      if constexpr (OP == UN_NEG) return (T)(0u - (U)x);
      else if constexpr (OP == UN_SQUARE) return (T)((U)x * (U)x);
      else if constexpr (!is_signed) return x; /* abs and relu of an unsigned value */
      else if constexpr (OP == UN_ABS) return x < (T)0 ? (T)(0u - (U)x) : x;
      else return x < (T)0 ? (T)0 : x; /* relu; the others are float-only */
    }
  }
};

template <int OP, class T>
__global__ void k_unary(const T *in, T *out, int64_t n) {
  UnaryOp<OP, T> f;
  for (int64_t i = global_index(); i < n; i += global_stride())
    out[i] = Tr<T>::store(f(Tr<T>::load(in[i])));
}

template <int OP>
pd_code unary(dev_kernel_ctx *c, dev_status *st) {
  int64_t n = num_elements(&c->out_shape[0]);
  if (n == 0) return PD_OK;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  unsigned grid = launch_grid(n, dev_cuda_sm_count(c->backend, c->device));
  const void *in = c->in_data[0];
  void *out = c->out_data[0];
  bool launched = false;
  if constexpr (OP <= UN_RELU) {
    PDK_DISPATCH_NUMBER(c->in_dtype[0],
                        k_unary<OP, T><<<grid, kThreads, 0, s>>>((const T *)in, (T *)out, n);
                        launched = true)
  } else {
    PDK_DISPATCH_FLOAT(c->in_dtype[0],
                       k_unary<OP, T><<<grid, kThreads, 0, s>>>((const T *)in, (T *)out, n);
                       launched = true)
  }
  if (!launched)
    return dev_error(st, PD_INTERNAL, "%s: no CUDA kernel for dtype %s", c->op->name,
                     pd_dtype_name(c->in_dtype[0]));
  CU_CHECK_LAUNCH(c, c->op->name, st);
  return PD_OK;
}

/* ---------------------------------------------------------------------- */
/* Binary with broadcasting                                                 */

enum Bin {
  BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_POW, BIN_MAX, BIN_MIN, BIN_EQ, BIN_GT, BIN_LT,
  /* Gradient ops of device/ops/grad_ops.c (floating only, same shapes). */
  BIN_RELU_GRAD, BIN_SQRT_GRAD, BIN_RSQRT_GRAD, BIN_TANH_GRAD, BIN_SIGMOID_GRAD,
};

/* Failure bits recorded in the check word (word 1). */
enum { FAIL_DIV_BY_ZERO = 1, FAIL_NEG_POW = 2 };

__device__ __forceinline__ void fail(unsigned long long *flag, unsigned long long bit) {
  if (flag) atomicOr(&flag[1], bit);
}

/* x**y modulo 2^64 (square and multiply), y >= 0. */
__device__ __forceinline__ uint64_t ipow(uint64_t x, uint64_t y) {
  uint64_t r = 1;
  while (y) {
    if (y & 1u) r *= x;
    y >>= 1;
    x *= x;
  }
  return r;
}

template <int OP, class T>
struct BinaryOp {
  using C = typename Tr<T>::C;
  static constexpr bool kBool = OP == BIN_EQ || OP == BIN_GT || OP == BIN_LT;
  using R = typename std::conditional<kBool, uint8_t, C>::type;
  __device__ __forceinline__ R operator()(C x, C y, unsigned long long *flag) const {
    if constexpr (OP == BIN_EQ) return (uint8_t)(x == y);
    else if constexpr (OP == BIN_GT) return (uint8_t)(x > y);
    else if constexpr (OP == BIN_LT) return (uint8_t)(x < y);
    else if constexpr (is_floating<T>::value) {
      if constexpr (OP == BIN_ADD) return x + y;
      else if constexpr (OP == BIN_SUB) return x - y;
      else if constexpr (OP == BIN_MUL) return x * y;
      else if constexpr (OP == BIN_DIV) return x / y;
      else if constexpr (OP == BIN_POW) return m_pow(x, y);
      else if constexpr (OP == BIN_MAX) return (x != x || x > y) ? x : y;
      else if constexpr (OP == BIN_MIN) return (x != x || x < y) ? x : y;
      /* The gradients, in grad_ops.c's order of operations. */
      else if constexpr (OP == BIN_RELU_GRAD) return y > (C)0 ? x : (C)0; /* (gradients, features) */
      else if constexpr (OP == BIN_SQRT_GRAD) return y * (C)0.5 / x;        /* (y, dy) */
      else if constexpr (OP == BIN_RSQRT_GRAD) return (C)-0.5 * (x * x * x) * y;
      /* mul_rn: a fused 1 - x*x differs from the CPU's most near |x| = 1 */
      else if constexpr (OP == BIN_TANH_GRAD) return y * ((C)1 - mul_rn(x, x));
      else return y * x * ((C)1 - x); /* sigmoid */
    } else {
      using U = typename Unsigned<T>::U;
      constexpr bool is_signed = std::is_signed<T>::value;
      if constexpr (OP == BIN_ADD) return (T)((U)x + (U)y);
      else if constexpr (OP == BIN_SUB) return (T)((U)x - (U)y);
      else if constexpr (OP == BIN_MUL) return (T)((U)x * (U)y);
      else if constexpr (OP == BIN_DIV) {
        if (y == 0) {
          fail(flag, FAIL_DIV_BY_ZERO);
          return (T)0;
        }
        if constexpr (is_signed)
          if (y == (T)-1) return (T)(0u - (U)x);
        return (T)(x / y);
      } else if constexpr (OP == BIN_POW) {
        if constexpr (is_signed)
          if (y < 0) {
            fail(flag, FAIL_NEG_POW);
            return (T)0;
          }
        return (T)ipow((uint64_t)x, (uint64_t)y);
      } else if constexpr (OP == BIN_MAX) return x > y ? x : y;
      else return x < y ? x : y;
    }
  }
};

template <int OP, class T>
__global__ void k_binary(const T *a, const T *b, void *out, int64_t n, Strides p, bool small,
                         unsigned long long *flag) {
  BinaryOp<OP, T> f;
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    int64_t oa, ob;
    if (p.rank == 1) {
      oa = i * p.s0[0];
      ob = i * p.s1[0];
    } else {
      offsets2(p, i, small, &oa, &ob);
    }
    auto r = f(Tr<T>::load(a[oa]), Tr<T>::load(b[ob]), flag);
    if constexpr (BinaryOp<OP, T>::kBool) ((uint8_t *)out)[i] = r;
    else ((T *)out)[i] = Tr<T>::store(r);
  }
}

/* Strides of operand `s` (right-aligned to rank r) on each output axis, 0
 * where it broadcasts. */
void bcast_strides(const dev_shape *s, int r, int64_t *strides) {
  int64_t stride = 1;
  for (int i = r - 1; i >= 0; i--) {
    int j = i - (r - s->rank);
    int64_t d = j >= 0 ? s->dims[j] : 1;
    strides[i] = d == 1 ? 0 : stride;
    stride *= d;
  }
}

/* The collapsed broadcast of (a, b) onto `out` (device/ops/elementwise.c's
 * ew_plan_make). */
Strides bcast_plan(const dev_shape *out, const dev_shape *a, const dev_shape *b) {
  int64_t sa[PD_MAX_RANK], sb[PD_MAX_RANK];
  bcast_strides(a, out->rank, sa);
  bcast_strides(b, out->rank, sb);
  Strides p;
  p.rank = 0;
  for (int i = 0; i < out->rank; i++) {
    int64_t d = out->dims[i];
    if (d == 1) continue;
    int k = p.rank - 1;
    if (k >= 0 && p.s0[k] == sa[i] * d && p.s1[k] == sb[i] * d) {
      p.dims[k] *= d;
      p.s0[k] = sa[i];
      p.s1[k] = sb[i];
      continue;
    }
    p.dims[p.rank] = d;
    p.s0[p.rank] = sa[i];
    p.s1[p.rank] = sb[i];
    p.rank++;
  }
  if (p.rank == 0) {
    p.rank = 1;
    p.dims[0] = 1;
    p.s0[0] = p.s1[0] = 0;
  }
  return p;
}

bool fits32(const Strides &p, int64_t n) {
  if (n > (int64_t)UINT32_MAX) return false;
  for (int i = 0; i < p.rank; i++)
    if (p.dims[i] > (int64_t)UINT32_MAX) return false;
  return true;
}

/* Launches out = x OP y for shapes xs, ys broadcast onto os. Integer Div and
 * Pow arm the check word and read it back (they wait for the stream). */
template <int OP>
pd_code binary_shapes(dev_kernel_ctx *c, const dev_shape *os, const dev_shape *xs,
                      const dev_shape *ys, dev_status *st) {
  int64_t n = num_elements(os);
  if (n == 0) return PD_OK;
  pd_dtype dt = c->in_dtype[0];
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  unsigned grid = launch_grid(n, dev_cuda_sm_count(c->backend, c->device));
  Strides p = bcast_plan(os, xs, ys);
  bool small = fits32(p, n);
  unsigned long long *flag = nullptr;
  bool checked = (OP == BIN_DIV || OP == BIN_POW) && dev_dtype_is_integer(dt);
  if (checked) {
    pd_code rc = dev_cuda_flag_arm(c, &flag, st);
    if (rc != PD_OK) return rc;
  }
  const void *a = c->in_data[0], *b = c->in_data[1];
  void *out = c->out_data[0];
  bool launched = false;
  if constexpr (OP == BIN_EQ) {
    PDK_DISPATCH_ALL(dt, k_binary<OP, T><<<grid, kThreads, 0, s>>>((const T *)a, (const T *)b,
                                                                    out, n, p, small, flag);
                     launched = true)
  } else if constexpr (OP >= BIN_RELU_GRAD) {
    PDK_DISPATCH_FLOAT(dt, k_binary<OP, T><<<grid, kThreads, 0, s>>>((const T *)a, (const T *)b,
                                                                      out, n, p, small, flag);
                       launched = true)
  } else {
    PDK_DISPATCH_NUMBER(dt, k_binary<OP, T><<<grid, kThreads, 0, s>>>((const T *)a, (const T *)b,
                                                                       out, n, p, small, flag);
                        launched = true)
  }
  if (!launched)
    return dev_error(st, PD_INTERNAL, "%s: no CUDA kernel for dtype %s", c->op->name,
                     pd_dtype_name(dt));
  CU_CHECK_LAUNCH(c, c->op->name, st);
  if (checked) {
    unsigned long long w[DEV_CUDA_FLAG_WORDS];
    pd_code rc = dev_cuda_flag_read(c, w, st);
    if (rc != PD_OK) return rc;
    if (w[1] & FAIL_DIV_BY_ZERO)
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: integer division by zero", c->op->name);
    if (w[1] & FAIL_NEG_POW)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: integers to negative integer powers are not allowed", c->op->name);
  }
  return PD_OK;
}

template <int OP>
pd_code binary(dev_kernel_ctx *c, dev_status *st) {
  return binary_shapes<OP>(c, &c->out_shape[0], &c->in_shape[0], &c->in_shape[1], st);
}

/* BiasAdd: value + bias along the channel axis (the last for NHWC, axis 1
 * for NCHW), as a broadcast Add with bias viewed as [C] or [C, 1, ..., 1]. */
pd_code bias_add(dev_kernel_ctx *c, dev_status *st) {
  const dev_attr_value *fmt = &c->attrs[0];
  bool nchw = fmt->u.s.len == 4 && fmt->u.s.ptr[0] == 'N' && fmt->u.s.ptr[1] == 'C';
  const dev_shape *vs = &c->in_shape[0];
  dev_shape bs = c->in_shape[1];
  if (nchw) {
    bs.rank = vs->rank - 1;
    bs.dims[0] = c->in_shape[1].dims[0];
    for (int i = 1; i < bs.rank; i++) bs.dims[i] = 1;
  }
  return binary_shapes<BIN_ADD>(c, vs, vs, &bs, st);
}

/* ---------------------------------------------------------------------- */
/* Cast                                                                     */

template <class D>
__device__ __forceinline__ D from_f32(float w) {
  if constexpr (std::is_same<D, float>::value) return w;
  else if constexpr (std::is_same<D, double>::value) return (double)w;
  else if constexpr (std::is_same<D, f16>::value || std::is_same<D, bf16>::value) return Tr<D>::store(w);
  else if constexpr (std::is_same<D, int32_t>::value) return sat_i32(w);
  else if constexpr (std::is_same<D, int64_t>::value) return sat_i64(w);
  else if constexpr (std::is_same<D, uint8_t>::value) return sat_u8(w);
  else return boolean{(uint8_t)(w != 0)};
}

template <class D>
__device__ __forceinline__ D from_f64(double v) {
  if constexpr (std::is_same<D, float>::value) return (float)v;
  else if constexpr (std::is_same<D, double>::value) return v;
  else if constexpr (std::is_same<D, f16>::value || std::is_same<D, bf16>::value)
    return Tr<D>::store(f64_to_f32_odd(v)); /* one rounding of the double */
  else if constexpr (std::is_same<D, int32_t>::value) return sat_i32(v);
  else if constexpr (std::is_same<D, int64_t>::value) return sat_i64(v);
  else if constexpr (std::is_same<D, uint8_t>::value) return sat_u8(v);
  else return boolean{(uint8_t)(v != 0)};
}

/* From an integer (bool normalised to 0/1); integer targets wrap as C casts. */
template <class D>
__device__ __forceinline__ D from_int(int64_t v) {
  if constexpr (std::is_same<D, float>::value) return (float)v;
  else if constexpr (std::is_same<D, double>::value) return (double)v;
  else if constexpr (std::is_same<D, f16>::value || std::is_same<D, bf16>::value)
    return Tr<D>::store(i64_to_f32_odd(v));
  else if constexpr (std::is_same<D, int32_t>::value) return (int32_t)(uint32_t)v;
  else if constexpr (std::is_same<D, int64_t>::value) return v;
  else if constexpr (std::is_same<D, uint8_t>::value) return (uint8_t)v;
  else return boolean{(uint8_t)(v != 0)};
}

template <class S, class D>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same<S, float>::value) return from_f32<D>(v);
  else if constexpr (std::is_same<S, f16>::value || std::is_same<S, bf16>::value)
    return from_f32<D>(Tr<S>::load(v));
  else if constexpr (std::is_same<S, double>::value) return from_f64<D>(v);
  else if constexpr (std::is_same<S, boolean>::value) return from_int<D>(v.v != 0);
  else return from_int<D>((int64_t)v);
}

template <class S, class D>
__global__ void k_cast(const S *in, D *out, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) out[i] = convert<S, D>(in[i]);
}

template <class S>
void cast_from(pd_dtype dst, const S *in, void *out, int64_t n, unsigned grid, cudaStream_t s) {
  switch (dst) {
    case PD_FLOAT32: k_cast<S, float><<<grid, kThreads, 0, s>>>(in, (float *)out, n); break;
    case PD_FLOAT64: k_cast<S, double><<<grid, kThreads, 0, s>>>(in, (double *)out, n); break;
    case PD_FLOAT16: k_cast<S, f16><<<grid, kThreads, 0, s>>>(in, (f16 *)out, n); break;
    case PD_BFLOAT16: k_cast<S, bf16><<<grid, kThreads, 0, s>>>(in, (bf16 *)out, n); break;
    case PD_INT32: k_cast<S, int32_t><<<grid, kThreads, 0, s>>>(in, (int32_t *)out, n); break;
    case PD_INT64: k_cast<S, int64_t><<<grid, kThreads, 0, s>>>(in, (int64_t *)out, n); break;
    case PD_UINT8: k_cast<S, uint8_t><<<grid, kThreads, 0, s>>>(in, (uint8_t *)out, n); break;
    case PD_BOOL: k_cast<S, boolean><<<grid, kThreads, 0, s>>>(in, (boolean *)out, n); break;
    default: break;
  }
}

pd_code cast(dev_kernel_ctx *c, dev_status *st) {
  int64_t n = num_elements(&c->out_shape[0]);
  if (n == 0) return PD_OK;
  pd_dtype src = c->in_dtype[0], dst = c->out_dtype[0];
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  if (src == dst && src != PD_BOOL) {
    CU_CHECK(c->backend, c->device,
             cudaMemcpyAsync(c->out_data[0], c->in_data[0], (size_t)n * pd_dtype_size(src),
                             cudaMemcpyDeviceToDevice, s),
             st);
    return PD_OK;
  }
  unsigned grid = launch_grid(n, dev_cuda_sm_count(c->backend, c->device));
  PDK_DISPATCH_ALL(src, cast_from<T>(dst, (const T *)c->in_data[0], c->out_data[0], n, grid, s))
  CU_CHECK_LAUNCH(c, "Cast", st);
  return PD_OK;
}

/* ---------------------------------------------------------------------- */
/* Fill, ZerosLike, OnesLike                                                */

template <class U>
__global__ void k_fill(U *out, int64_t n, U v) {
  for (int64_t i = global_index(); i < n; i += global_stride()) out[i] = v;
}

/* Writes n copies of the element at `elem` (es bytes, host memory). */
pd_code fill_elem(dev_kernel_ctx *c, void *out, int64_t n, const void *elem, size_t es,
                  dev_status *st) {
  if (n == 0) return PD_OK;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  const uint8_t *e = (const uint8_t *)elem;
  bool same = true;
  for (size_t i = 1; i < es; i++) same &= e[i] == e[0];
  if (same) {
    CU_CHECK(c->backend, c->device, cudaMemsetAsync(out, e[0], (size_t)n * es, s), st);
    return PD_OK;
  }
  unsigned grid = launch_grid(n, dev_cuda_sm_count(c->backend, c->device));
  PDK_DISPATCH_SIZE(es, T v; memcpy(&v, elem, sizeof v);
                    k_fill<T><<<grid, kThreads, 0, s>>>((T *)out, n, v))
  CU_CHECK_LAUNCH(c, c->op->name, st);
  return PD_OK;
}

/* The one element Fill or OnesLike writes, computed by the op's own CPU
 * kernel on a one-element host buffer: both backends then write the same
 * bits for every attribute value (the attribute-to-dtype rounding lives in
 * one place, device/ops/elementwise.c). */
pd_code host_element(dev_kernel_ctx *c, uint64_t *elem, dev_status *st) {
  dev_kernel_fn cpu = c->op->kernels[DEV_BACKEND_CPU];
  if (!cpu) return dev_error(st, PD_INTERNAL, "%s: no CPU kernel to take the value from", c->op->name);
  uint8_t in_elem[8] = {0};
  dev_kernel_ctx one = *c;
  dev_shape scalar;
  scalar.rank = 0;
  const void *in_data[DEV_MAX_INPUTS];
  dev_shape in_shape[DEV_MAX_INPUTS];
  for (int i = 0; i < c->num_inputs && i < DEV_MAX_INPUTS; i++) {
    in_data[i] = in_elem;
    in_shape[i] = scalar;
  }
  void *out_data[1] = {elem};
  one.in_data = in_data;
  one.in_shape = in_shape;
  one.out_shape = &scalar;
  one.out_data = out_data;
  one.num_outputs = 1;
  *elem = 0;
  return cpu(&one, st);
}

pd_code fill_from_cpu(dev_kernel_ctx *c, dev_status *st) {
  uint64_t elem;
  pd_code rc = host_element(c, &elem, st);
  if (rc != PD_OK) return rc;
  return fill_elem(c, c->out_data[0], num_elements(&c->out_shape[0]), &elem,
                   pd_dtype_size(c->out_dtype[0]), st);
}

pd_code zeros_like(dev_kernel_ctx *c, dev_status *st) {
  int64_t n = num_elements(&c->out_shape[0]);
  if (n == 0) return PD_OK;
  CU_CHECK(c->backend, c->device,
           cudaMemsetAsync(c->out_data[0], 0, (size_t)n * pd_dtype_size(c->out_dtype[0]),
                           dev_cuda_stream(c->backend, c->device)),
           st);
  return PD_OK;
}

/* ---------------------------------------------------------------------- */
/* Collective element-wise kernels (device/cpu/collective.c's semantics)    */

struct Ptrs {
  const void *p[PD_MAX_DEVICES];
};

template <class T>
struct CollAcc {
  using A = typename Tr<T>::C; /* floats: float (f32/f16/bf16) or double */
};
template <>
struct CollAcc<uint8_t> {
  using A = uint64_t;
};
template <>
struct CollAcc<int32_t> {
  using A = int64_t; /* max/min/mean signed; sum/prod wrap through uint32 */
};
template <>
struct CollAcc<int64_t> {
  using A = int64_t;
};

template <class T>
__global__ void k_coll_reduce(Ptrs in, int n, int red, int64_t off, T *out, int64_t count) {
  for (int64_t i = global_index(); i < count; i += global_stride()) {
    if constexpr (std::is_same<T, boolean>::value) {
      bool any = red == DEV_RED_SUM || red == DEV_RED_MAX || red == DEV_RED_MEAN;
      uint8_t acc = ((const boolean *)in.p[0])[off + i].v != 0;
      for (int k = 1; k < n; k++) {
        uint8_t v = ((const boolean *)in.p[k])[off + i].v != 0;
        acc = any ? (acc | v) : (acc & v);
      }
      out[i].v = acc;
    } else if constexpr (is_floating<T>::value || std::is_same<T, uint8_t>::value) {
      using A = typename CollAcc<T>::A;
      auto ld = [&](int k) -> A { return (A)Tr<T>::load(((const T *)in.p[k])[off + i]); };
      A acc = ld(0);
      for (int k = 1; k < n; k++) {
        A v = ld(k);
        switch (red) {
          case DEV_RED_SUM:
          case DEV_RED_MEAN: acc = (A)(acc + v); break;
          case DEV_RED_PROD: acc = (A)(acc * v); break;
          case DEV_RED_MAX: acc = (v > acc || v != v) ? v : acc; break;
          case DEV_RED_MIN: acc = (v < acc || v != v) ? v : acc; break;
        }
      }
      if (red == DEV_RED_MEAN) acc = (A)(acc / (A)n);
      if constexpr (std::is_same<T, uint8_t>::value) out[i] = (uint8_t)acc;
      else out[i] = Tr<T>::store((typename Tr<T>::C)acc);
    } else { /* int32, int64 */
      using U = typename std::make_unsigned<T>::type;
      T v0 = ((const T *)in.p[0])[off + i];
      int64_t acc = v0;
      U uacc = (U)v0;
      uint64_t usum = (uint64_t)(int64_t)v0; /* int64 mean sums wrap-around */
      for (int k = 1; k < n; k++) {
        T v = ((const T *)in.p[k])[off + i];
        switch (red) {
          case DEV_RED_SUM: uacc = (U)(uacc + (U)v); break;
          case DEV_RED_PROD: uacc = (U)(uacc * (U)v); break;
          case DEV_RED_MAX: if (v > acc) acc = v; break;
          case DEV_RED_MIN: if (v < acc) acc = v; break;
          case DEV_RED_MEAN: acc += v; usum += (uint64_t)(int64_t)v; break;
        }
      }
      T r;
      if (red == DEV_RED_SUM || red == DEV_RED_PROD) r = (T)uacc;
      else if (red == DEV_RED_MEAN)
        r = sizeof(T) == 8 ? (T)((int64_t)usum / n) : (T)(acc / n);
      else r = (T)acc;
      out[i] = r;
    }
  }
}

template <class T>
__global__ void k_div_by(T *data, int64_t count, int n) {
  for (int64_t i = global_index(); i < count; i += global_stride()) {
    if constexpr (is_floating<T>::value) {
      using C = typename Tr<T>::C;
      data[i] = Tr<T>::store(Tr<T>::load(data[i]) / (C)n);
    } else {
      data[i] = (T)(data[i] / (T)n);
    }
  }
}

__global__ void k_bool_normalize(uint8_t *data, int64_t count) {
  for (int64_t i = global_index(); i < count; i += global_stride()) data[i] = data[i] != 0;
}

__global__ void k_probe() {}

int current_sm_count() {
  int dev = 0, sms = 80;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
    return sms;
  return 80;
}

}  // namespace

extern "C" cudaError_t dev_cuda_coll_reduce(pd_dtype dt, int red, int n, const void *const *in,
                                            int64_t in_off, void *out, int64_t count,
                                            cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  Ptrs p;
  for (int k = 0; k < n && k < PD_MAX_DEVICES; k++) p.p[k] = in[k];
  unsigned grid = launch_grid(count, current_sm_count());
  PDK_DISPATCH_ALL(dt, k_coll_reduce<T><<<grid, kThreads, 0, s>>>(p, n, red, in_off, (T *)out, count))
  return cudaGetLastError();
}

extern "C" cudaError_t dev_cuda_div_by(pd_dtype dt, void *data, int64_t count, int n,
                                       cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  unsigned grid = launch_grid(count, current_sm_count());
  PDK_DISPATCH_NUMBER(dt, k_div_by<T><<<grid, kThreads, 0, s>>>((T *)data, count, n))
  return cudaGetLastError();
}

extern "C" cudaError_t dev_cuda_bool_normalize(void *data, int64_t count, cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  k_bool_normalize<<<launch_grid(count, current_sm_count()), kThreads, 0, s>>>((uint8_t *)data,
                                                                              count);
  return cudaGetLastError();
}

extern "C" cudaError_t dev_cuda_probe(cudaStream_t s) {
  k_probe<<<1, 1, 0, s>>>();
  return cudaGetLastError();
}

/* ---------------------------------------------------------------------- */
/* Registration                                                             */

extern "C" void dev_cuda_register_elementwise(void) {
  dev_cuda_register("Neg", unary<UN_NEG>);
  dev_cuda_register("Abs", unary<UN_ABS>);
  dev_cuda_register("Square", unary<UN_SQUARE>);
  dev_cuda_register("Relu", unary<UN_RELU>);
  dev_cuda_register("Exp", unary<UN_EXP>);
  dev_cuda_register("Log", unary<UN_LOG>);
  dev_cuda_register("Sqrt", unary<UN_SQRT>);
  dev_cuda_register("Rsqrt", unary<UN_RSQRT>);
  dev_cuda_register("Tanh", unary<UN_TANH>);
  dev_cuda_register("Sigmoid", unary<UN_SIGMOID>);
  dev_cuda_register("Add", binary<BIN_ADD>);
  dev_cuda_register("Sub", binary<BIN_SUB>);
  dev_cuda_register("Mul", binary<BIN_MUL>);
  dev_cuda_register("Div", binary<BIN_DIV>);
  dev_cuda_register("Pow", binary<BIN_POW>);
  dev_cuda_register("Maximum", binary<BIN_MAX>);
  dev_cuda_register("Minimum", binary<BIN_MIN>);
  dev_cuda_register("Equal", binary<BIN_EQ>);
  dev_cuda_register("Greater", binary<BIN_GT>);
  dev_cuda_register("Less", binary<BIN_LT>);
  dev_cuda_register("BiasAdd", bias_add);
  dev_cuda_register("ReluGrad", binary<BIN_RELU_GRAD>);
  dev_cuda_register("SqrtGrad", binary<BIN_SQRT_GRAD>);
  dev_cuda_register("RsqrtGrad", binary<BIN_RSQRT_GRAD>);
  dev_cuda_register("TanhGrad", binary<BIN_TANH_GRAD>);
  dev_cuda_register("SigmoidGrad", binary<BIN_SIGMOID_GRAD>);
  dev_cuda_register("Cast", cast);
  dev_cuda_register("Fill", fill_from_cpu);
  dev_cuda_register("ZerosLike", zeros_like);
  dev_cuda_register("OnesLike", fill_from_cpu);
}
