/* CUDA kernels of the reductions and the softmax family
 * (device/ops/reduce.c): Sum, Mean, Max, Min, ArgMax, Softmax, LogSoftmax and
 * SparseSoftmaxCrossEntropyWithLogits, with the CPU kernels' semantics:
 * float32/16/bfloat16 sums accumulate in float64, integer sums wrap, integer
 * means truncate, Max/Min propagate NaN, ArgMax takes the first maximum (a
 * NaN wins), softmax sums accumulate in float64.
 *
 * Reductions. The input is collapsed as the CPU kernel does (size-1 axes
 * dropped, neighbours that are both reduced or both kept merged); then
 *  - when the last axis is reduced, a group of threads (a warp, or a block
 *    for long reductions) reduces each output's contiguous runs and the
 *    group's partial results are combined with shuffles;
 *  - when the last axis is kept, each thread owns one output, so adjacent
 *    threads read adjacent elements.
 * When there are too few outputs to fill the GPU, the reduction range is
 * also split across blocks, which write partial accumulators that a second
 * kernel combines. */
#include "kernels.cuh"

using namespace pdk;

namespace {

enum { RED_SUM, RED_MEAN, RED_MAX, RED_MIN };

/* ---------------------------------------------------------------------- */
/* Accumulation rules per dtype and kind                                    */

template <class T, int KIND>
struct Red;

/* float32, float16, bfloat16 (compute type float) and float64. */
template <class T, int KIND>
struct RedFloat {
  using C = typename Tr<T>::C;
  static constexpr bool kSum = KIND == RED_SUM || KIND == RED_MEAN;
  using A = typename std::conditional<kSum, double, C>::type;
  static __device__ __forceinline__ A init() {
    if constexpr (kSum) return 0.0;
    else if constexpr (KIND == RED_MAX) return (A)-INFINITY;
    else return (A)INFINITY;
  }
  static __device__ __forceinline__ A load(T x) { return (A)Tr<T>::load(x); }
  static __device__ __forceinline__ A add(A a, A x) {
    if constexpr (kSum) return a + x;
    else if constexpr (KIND == RED_MAX) return (x > a || x != x) ? x : a;
    else return (x < a || x != x) ? x : a;
  }
  static __device__ __forceinline__ T fin(A a, int64_t cnt) {
    if constexpr (KIND == RED_MEAN) {
      if (cnt == 0) return Tr<T>::store((C)NAN);
      return Tr<T>::store((C)(a / (double)cnt));
    } else {
      return Tr<T>::store((C)a);
    }
  }
};

template <int KIND> struct Red<float, KIND> : RedFloat<float, KIND> {};
template <int KIND> struct Red<double, KIND> : RedFloat<double, KIND> {};
template <int KIND> struct Red<f16, KIND> : RedFloat<f16, KIND> {};
template <int KIND> struct Red<bf16, KIND> : RedFloat<bf16, KIND> {};

/* Integers: sums in the unsigned type (wrap), means of int32 in 64 bits,
 * max/min in a type shuffles can carry. */
template <class T, int KIND>
struct RedInt {
  static constexpr bool kSum = KIND == RED_SUM || KIND == RED_MEAN;
  using Wide = typename std::conditional<sizeof(T) < 4, uint32_t, T>::type; /* uint8 max/min */
  using A = typename std::conditional<
      kSum,
      typename std::conditional<KIND == RED_SUM && sizeof(T) == 4, uint32_t, uint64_t>::type,
      typename std::conditional<std::is_signed<T>::value, T, Wide>::type>::type;
  static __device__ __forceinline__ A init() {
    if constexpr (kSum) return 0;
    else if constexpr (KIND == RED_MAX) return (A)std::numeric_limits<T>::lowest();
    else return (A)std::numeric_limits<T>::max();
  }
  static __device__ __forceinline__ A load(T x) {
    if constexpr (kSum) return (A)(typename std::conditional<std::is_signed<T>::value, int64_t, uint64_t>::type)x;
    else return (A)x;
  }
  static __device__ __forceinline__ A add(A a, A x) {
    if constexpr (kSum) return (A)(a + x);
    else if constexpr (KIND == RED_MAX) return x > a ? x : a;
    else return x < a ? x : a;
  }
  static __device__ __forceinline__ T fin(A a, int64_t cnt) {
    if constexpr (KIND == RED_MEAN) {
      if (cnt == 0) return (T)0;
      if constexpr (std::is_signed<T>::value) return (T)((int64_t)a / cnt);
      else return (T)(a / (uint64_t)cnt);
    } else {
      return (T)a;
    }
  }
};

template <int KIND> struct Red<int32_t, KIND> : RedInt<int32_t, KIND> {};
template <int KIND> struct Red<int64_t, KIND> : RedInt<int64_t, KIND> {};
template <int KIND> struct Red<uint8_t, KIND> : RedInt<uint8_t, KIND> {};

/* ---------------------------------------------------------------------- */
/* Group reductions                                                         */

/* Combines the values of a group of G threads (G = 32: one warp; G = 256:
 * the whole block, which every thread must reach). The result is valid in
 * the group's first thread. */
template <int G, class A, class F>
__device__ __forceinline__ A group_reduce(A v, F combine) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, off));
  if constexpr (G > 32) {
    __shared__ A warp_part[G / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* a previous call's reads of warp_part are done */
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    if (warp == 0) {
      v = lane < G / 32 ? warp_part[lane] : warp_part[0];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, off));
    }
  }
  return v;
}

/* Same, for a combine that must see every value exactly once (the warp
 * stage above reads warp_part[0] twice for lanes past G/32, which only an
 * idempotent combine such as max tolerates). Sums use this one. */
template <int G, class A, class F>
__device__ __forceinline__ A group_reduce_exact(A v, F combine, A identity) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, off));
  if constexpr (G > 32) {
    __shared__ A warp_part[G / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    if (warp == 0) {
      v = lane < G / 32 ? warp_part[lane] : identity;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v = combine(v, __shfl_down_sync(0xffffffffu, v, off));
    }
  }
  return v;
}

/* ---------------------------------------------------------------------- */
/* Sum, Mean, Max, Min                                                      */

/* The collapsed geometry: kept axes (output order) and reduced axes, each
 * with its input strides. */
struct Geom {
  int nk, nr;
  int64_t kdims[PD_MAX_RANK], kstr[PD_MAX_RANK];
  int64_t rdims[PD_MAX_RANK], rstr[PD_MAX_RANK];
  int64_t count; /* input elements per output */
};

__device__ __forceinline__ int64_t kept_off(const Geom &g, int64_t o) {
  int64_t off = 0;
  for (int k = g.nk - 1; k >= 0; k--) {
    int64_t q = o / g.kdims[k];
    off += (o - q * g.kdims[k]) * g.kstr[k];
    o = q;
  }
  return off;
}

__device__ __forceinline__ int64_t red_off(const Geom &g, int64_t r) {
  if (g.nr == 1) return r * g.rstr[0];
  int64_t off = 0;
  for (int k = g.nr - 1; k >= 0; k--) {
    int64_t q = r / g.rdims[k];
    off += (r - q * g.rdims[k]) * g.rstr[k];
    r = q;
  }
  return off;
}

/* Last axis reduced: a group of G threads per output; blockIdx.y splits the
 * reduction range (partial results to `part` when splits > 1). */
template <class T, int KIND, int G>
__global__ void k_reduce_inner(const T *in, T *out, typename Red<T, KIND>::A *part, Geom g,
                               int64_t out_n, int64_t chunk) {
  using R = Red<T, KIND>;
  using A = typename R::A;
  constexpr int groups = kThreads / G;
  const int lane = threadIdx.x % G, gid = threadIdx.x / G;
  const int64_t lo = (int64_t)blockIdx.y * chunk;
  const int64_t hi = lo + chunk < g.count ? lo + chunk : g.count;
  /* The loop bound is the same for the whole block (G = 256 syncs inside). */
  for (int64_t ob = (int64_t)blockIdx.x * groups; ob < out_n; ob += (int64_t)gridDim.x * groups) {
    int64_t o = ob + gid;
    A acc = R::init();
    if (o < out_n) {
      const T *base = in + kept_off(g, o);
      for (int64_t r = lo + lane; r < hi; r += G) acc = R::add(acc, R::load(base[red_off(g, r)]));
    }
    acc = group_reduce_exact<G>(acc, [](A a, A b) { return R::add(a, b); }, R::init());
    if (lane == 0 && o < out_n) {
      if (part) part[o * gridDim.y + blockIdx.y] = acc;
      else out[o] = R::fin(acc, g.count);
    }
  }
}

/* Last axis kept: one thread per output. */
template <class T, int KIND>
__global__ void k_reduce_outer(const T *in, T *out, typename Red<T, KIND>::A *part, Geom g,
                               int64_t out_n, int64_t chunk) {
  using R = Red<T, KIND>;
  using A = typename R::A;
  const int64_t lo = (int64_t)blockIdx.y * chunk;
  const int64_t hi = lo + chunk < g.count ? lo + chunk : g.count;
  for (int64_t o = global_index(); o < out_n; o += global_stride()) {
    const T *base = in + kept_off(g, o);
    A acc = R::init();
    for (int64_t r = lo; r < hi; r++) acc = R::add(acc, R::load(base[red_off(g, r)]));
    if (part) part[o * gridDim.y + blockIdx.y] = acc;
    else out[o] = R::fin(acc, g.count);
  }
}

template <class T, int KIND>
__global__ void k_reduce_final(const typename Red<T, KIND>::A *part, T *out, int64_t out_n,
                               int splits, int64_t count) {
  using R = Red<T, KIND>;
  for (int64_t o = global_index(); o < out_n; o += global_stride()) {
    typename R::A acc = R::init();
    for (int s = 0; s < splits; s++) acc = R::add(acc, part[o * splits + s]);
    out[o] = R::fin(acc, count);
  }
}

/* Collapses shape `s` with reduced-axis bits `mask` (device/ops/reduce.c's
 * red_plan), then lists kept and reduced axes with their strides. */
Geom make_geom(const dev_shape *s, unsigned mask, bool *last_reduced) {
  int n = 0;
  int64_t dims[PD_MAX_RANK];
  bool red[PD_MAX_RANK];
  Geom g;
  g.count = 1;
  for (int i = 0; i < s->rank; i++) {
    bool r = (mask >> i) & 1u;
    int64_t d = s->dims[i];
    if (r) g.count *= d;
    if (d == 1) continue;
    if (n > 0 && red[n - 1] == r) {
      dims[n - 1] *= d;
    } else {
      dims[n] = d;
      red[n] = r;
      n++;
    }
  }
  if (n == 0) { /* one element */
    dims[0] = 1;
    red[0] = true;
    n = 1;
  }
  int64_t strides[PD_MAX_RANK], st = 1;
  for (int i = n - 1; i >= 0; i--) {
    strides[i] = st;
    st *= dims[i];
  }
  g.nk = g.nr = 0;
  for (int i = 0; i < n; i++) {
    if (red[i]) {
      g.rdims[g.nr] = dims[i];
      g.rstr[g.nr++] = strides[i];
    } else {
      g.kdims[g.nk] = dims[i];
      g.kstr[g.nk++] = strides[i];
    }
  }
  *last_reduced = red[n - 1];
  return g;
}

unsigned red_mask(const dev_attr_value *axis, int rank) {
  if (axis->u.ilist.n == 0) return rank ? (1u << rank) - 1 : 0;
  unsigned m = 0;
  for (int i = 0; i < axis->u.ilist.n; i++) {
    int64_t a = axis->u.ilist.v[i];
    m |= 1u << (a < 0 ? a + rank : a);
  }
  return m;
}

template <class T, int KIND>
pd_code reduce_typed(dev_kernel_ctx *c, const Geom &g, bool last_reduced, int64_t out_n,
                     dev_status *st) {
  using A = typename Red<T, KIND>::A;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  const int sms = dev_cuda_sm_count(c->backend, c->device);
  const int64_t target = 2LL * sms; /* blocks that keep every SM busy */
  const T *in = (const T *)c->in_data[0];
  T *out = (T *)c->out_data[0];
  const bool inner = last_reduced && g.count > 0;
  int G = inner && g.count >= 4096 ? 256 : 32;
  int64_t groups = kThreads / G;
  int64_t blocks = inner ? (out_n + groups - 1) / groups : (out_n + kThreads - 1) / kThreads;
  int64_t splits = 1;
  int64_t min_chunk = inner ? (int64_t)G * 16 : 64;
  if (blocks < target && g.count >= 2 * min_chunk) {
    splits = (target + blocks - 1) / blocks;
    int64_t by_size = g.count / min_chunk;
    if (splits > by_size) splits = by_size;
    if (splits > 65535) splits = 65535;
    if (splits < 1) splits = 1;
  }
  int64_t chunk = (g.count + splits - 1) / splits;
  if (chunk < 1) chunk = 1;
  A *part = nullptr;
  size_t part_bytes = 0;
  if (splits > 1) {
    part_bytes = (size_t)out_n * (size_t)splits * sizeof(A);
    pd_code rc = dev_cuda_scratch(c, part_bytes, (void **)&part, st);
    if (rc != PD_OK) return rc;
  }
  int64_t gx = blocks < 65535LL * 16 ? blocks : 65535LL * 16;
  dim3 grid((unsigned)(gx > 0 ? gx : 1), (unsigned)splits);
  if (inner && G == 256)
    k_reduce_inner<T, KIND, 256><<<grid, kThreads, 0, s>>>(in, out, part, g, out_n, chunk);
  else if (inner)
    k_reduce_inner<T, KIND, 32><<<grid, kThreads, 0, s>>>(in, out, part, g, out_n, chunk);
  else
    k_reduce_outer<T, KIND><<<grid, kThreads, 0, s>>>(in, out, part, g, out_n, chunk);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && part)
    k_reduce_final<T, KIND><<<launch_grid(out_n, sms), kThreads, 0, s>>>(part, out, out_n,
                                                                         (int)splits, g.count);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (part) dev_cuda_scratch_free(c, part, part_bytes);
  if (e != cudaSuccess) return dev_cuda_fail(c->backend, c->device, e, c->op->name, st);
  return PD_OK;
}

template <int KIND>
pd_code reduce(dev_kernel_ctx *c, dev_status *st) {
  int64_t out_n = num_elements(&c->out_shape[0]);
  if (out_n == 0) return PD_OK;
  const dev_shape *s = &c->in_shape[0];
  bool last_reduced;
  Geom g = make_geom(s, red_mask(&c->attrs[0], s->rank), &last_reduced);
  /* `launched`, not rc == PD_INTERNAL: a failed launch is INTERNAL too, and
   * its message must not be replaced. */
  pd_code rc = PD_OK;
  bool launched = false;
  PDK_DISPATCH_NUMBER(c->in_dtype[0], rc = reduce_typed<T, KIND>(c, g, last_reduced, out_n, st);
                      launched = true)
  if (!launched)
    return dev_error(st, PD_INTERNAL, "%s: no CUDA kernel for dtype %s", c->op->name,
                     pd_dtype_name(c->in_dtype[0]));
  return rc;
}

/* SumToLike (device/ops/grad_ops.c): input summed over the axes that
 * broadcasting like's shape to input's created or stretched; a Sum over
 * those axes, whose kept axes are like's in order. */
pd_code sum_to_like(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *in = &c->in_shape[0], *like = &c->in_shape[1];
  int64_t out_n = num_elements(like);
  if (out_n == 0) return PD_OK;
  unsigned mask = 0;
  for (int i = 0; i < in->rank; i++) {
    int k = i - (in->rank - like->rank);
    bool kept = k >= 0 && like->dims[k] == in->dims[i] && in->dims[i] != 1;
    if (!kept) mask |= 1u << i;
  }
  bool last_reduced;
  Geom g = make_geom(in, mask, &last_reduced);
  pd_code rc = PD_OK;
  bool launched = false;
  PDK_DISPATCH_FLOAT(c->in_dtype[0], rc = reduce_typed<T, RED_SUM>(c, g, last_reduced, out_n, st);
                     launched = true)
  if (!launched)
    return dev_error(st, PD_INTERNAL, "SumToLike: no CUDA kernel for dtype %s",
                     pd_dtype_name(c->in_dtype[0]));
  return rc;
}

/* ---------------------------------------------------------------------- */
/* ArgMax                                                                   */

template <class T>
struct ArgVal {
  using V = typename Tr<T>::C;
};
template <>
struct ArgVal<uint8_t> {
  using V = int32_t;
};

/* Is (v, i) better than (bv, bi)? A NaN beats any number; between equals,
 * and between NaNs, the smaller index wins; bi < 0 means "none yet". So the
 * result does not depend on the order values are combined in, and equals the
 * CPU kernel's sequential scan. */
template <class V>
__device__ __forceinline__ bool arg_better(V v, int64_t i, V bv, int64_t bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  if (v > bv) return true;
  if (v < bv) return false;
  return i < bi;
}

template <class T, int G>
__global__ void k_argmax_rows(const T *in, int64_t rows, int64_t L, int64_t *o64, int32_t *o32) {
  using V = typename ArgVal<T>::V;
  constexpr int groups = kThreads / G;
  const int lane = threadIdx.x % G, gid = threadIdx.x / G;
  for (int64_t rb = (int64_t)blockIdx.x * groups; rb < rows; rb += (int64_t)gridDim.x * groups) {
    int64_t r = rb + gid;
    V best = V();
    int64_t bi = -1;
    if (r < rows)
      for (int64_t l = lane; l < L; l += G) {
        V v = (V)Tr<T>::load(in[r * L + l]);
        if (arg_better(v, l, best, bi)) {
          best = v;
          bi = l;
        }
      }
    /* Reduce (value, index) pairs: shuffle both, keep the better. */
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      V ov = __shfl_down_sync(0xffffffffu, best, off);
      int64_t oi = __shfl_down_sync(0xffffffffu, bi, off);
      if (arg_better(ov, oi, best, bi)) {
        best = ov;
        bi = oi;
      }
    }
    if constexpr (G > 32) {
      __shared__ V pv[G / 32];
      __shared__ int64_t pi[G / 32];
      int wl = threadIdx.x & 31, warp = threadIdx.x >> 5;
      __syncthreads();
      if (wl == 0) {
        pv[warp] = best;
        pi[warp] = bi;
      }
      __syncthreads();
      if (warp == 0) {
        best = wl < G / 32 ? pv[wl] : V();
        bi = wl < G / 32 ? pi[wl] : -1;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          V ov = __shfl_down_sync(0xffffffffu, best, off);
          int64_t oi = __shfl_down_sync(0xffffffffu, bi, off);
          if (arg_better(ov, oi, best, bi)) {
            best = ov;
            bi = oi;
          }
        }
      }
    }
    if (lane == 0 && r < rows) {
      if (o64) o64[r] = bi;
      else o32[r] = (int32_t)bi;
    }
  }
}

/* Inner axes kept: one thread per (outer, inner) output scans the axis. */
template <class T>
__global__ void k_argmax_cols(const T *in, int64_t outer, int64_t L, int64_t inner, int64_t *o64,
                              int32_t *o32) {
  using V = typename ArgVal<T>::V;
  for (int64_t x = global_index(); x < outer * inner; x += global_stride()) {
    int64_t o = x / inner, i = x - o * inner;
    const T *p = in + o * L * inner + i;
    V best = (V)Tr<T>::load(p[0]);
    int64_t bi = 0;
    for (int64_t l = 1; l < L; l++) {
      V v = (V)Tr<T>::load(p[l * inner]);
      if (arg_better(v, l, best, bi)) {
        best = v;
        bi = l;
      }
    }
    if (o64) o64[x] = bi;
    else o32[x] = (int32_t)bi;
  }
}

pd_code argmax(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *s = &c->in_shape[0];
  int64_t ax = c->attrs[0].u.i;
  int a = (int)(ax < 0 ? ax + s->rank : ax);
  int64_t outer = 1, L = s->dims[a], inner = 1;
  for (int i = 0; i < a; i++) outer *= s->dims[i];
  for (int i = a + 1; i < s->rank; i++) inner *= s->dims[i];
  if (outer * inner == 0) return PD_OK;
  bool i64 = c->out_dtype[0] == PD_INT64;
  int64_t *o64 = i64 ? (int64_t *)c->out_data[0] : nullptr;
  int32_t *o32 = i64 ? nullptr : (int32_t *)c->out_data[0];
  cudaStream_t st_ = dev_cuda_stream(c->backend, c->device);
  int sms = dev_cuda_sm_count(c->backend, c->device);
  const void *in = c->in_data[0];
  if (inner == 1) {
    int64_t rows = outer;
    bool big = L >= 4096;
    int64_t groups = big ? 1 : kThreads / 32;
    int64_t blocks = (rows + groups - 1) / groups;
    unsigned grid = (unsigned)(blocks < (int64_t)sms * 32 ? blocks : (int64_t)sms * 32);
    if (big) {
      PDK_DISPATCH_NUMBER(c->in_dtype[0],
                          k_argmax_rows<T, 256><<<grid, kThreads, 0, st_>>>((const T *)in, rows, L, o64, o32))
    } else {
      PDK_DISPATCH_NUMBER(c->in_dtype[0],
                          k_argmax_rows<T, 32><<<grid, kThreads, 0, st_>>>((const T *)in, rows, L, o64, o32))
    }
  } else {
    unsigned grid = launch_grid(outer * inner, sms);
    PDK_DISPATCH_NUMBER(c->in_dtype[0],
                        k_argmax_cols<T><<<grid, kThreads, 0, st_>>>((const T *)in, outer, L, inner, o64, o32))
  }
  CU_CHECK_LAUNCH(c, "ArgMax", st);
  return PD_OK;
}

/* ---------------------------------------------------------------------- */
/* Softmax, LogSoftmax, SparseSoftmaxCrossEntropyWithLogits                 */

__device__ __forceinline__ float s_exp(float x) { return expf(x); }
__device__ __forceinline__ double s_exp(double x) { return exp(x); }

/* The row maximum and sum of exp(x - max) (in float64) of row r, shared by
 * the whole group. */
template <class T, int G>
__device__ __forceinline__ void row_stats(const T *x, int64_t L, int lane,
                                          typename Tr<T>::C *m_out, double *s_out) {
  using C = typename Tr<T>::C;
  C m = (C)-INFINITY;
  for (int64_t j = lane; j < L; j += G) {
    C v = Tr<T>::load(x[j]);
    m = v > m ? v : m;
  }
  m = group_reduce<G>(m, [](C a, C b) { return b > a ? b : a; });
  if constexpr (G > 32) {
    __shared__ C bm;
    if (threadIdx.x == 0) bm = m;
    __syncthreads();
    m = bm;
  } else {
    m = __shfl_sync(0xffffffffu, m, 0);
  }
  double s = 0.0;
  for (int64_t j = lane; j < L; j += G) s += (double)s_exp(Tr<T>::load(x[j]) - m);
  s = group_reduce_exact<G>(s, [](double a, double b) { return a + b; }, 0.0);
  if constexpr (G > 32) {
    __shared__ double bs;
    if (threadIdx.x == 0) bs = s;
    __syncthreads();
    s = bs;
  } else {
    s = __shfl_sync(0xffffffffu, s, 0);
  }
  *m_out = m;
  *s_out = s;
}

template <class T, int G>
__global__ void k_softmax(const T *in, T *out, int64_t rows, int64_t L, bool lg) {
  using C = typename Tr<T>::C;
  constexpr int groups = kThreads / G;
  const int lane = threadIdx.x % G, gid = threadIdx.x / G;
  for (int64_t rb = (int64_t)blockIdx.x * groups; rb < rows; rb += (int64_t)gridDim.x * groups) {
    int64_t r = rb + gid < rows ? rb + gid : rows - 1; /* spare groups redo the last row */
    const T *x = in + r * L;
    T *y = out + r * L;
    C m;
    double s;
    row_stats<T, G>(x, L, lane, &m, &s);
    if (rb + gid >= rows) continue;
    if (lg) {
      double ls = log(s);
      for (int64_t j = lane; j < L; j += G)
        y[j] = Tr<T>::store((C)((double)(Tr<T>::load(x[j]) - m) - ls));
    } else if constexpr (std::is_same<C, double>::value) {
      for (int64_t j = lane; j < L; j += G) y[j] = Tr<T>::store(s_exp(Tr<T>::load(x[j]) - m) / s);
    } else {
      double inv = 1.0 / s;
      for (int64_t j = lane; j < L; j += G)
        y[j] = Tr<T>::store((C)((double)s_exp(Tr<T>::load(x[j]) - m) * inv));
    }
  }
}

template <class T, class LabelT, int G>
__global__ void k_sxent(const T *f, const LabelT *labels, T *loss, T *bp, int64_t batch,
                        int64_t C_, unsigned long long *flag) {
  using C = typename Tr<T>::C;
  constexpr int groups = kThreads / G;
  const int lane = threadIdx.x % G, gid = threadIdx.x / G;
  for (int64_t rb = (int64_t)blockIdx.x * groups; rb < batch; rb += (int64_t)gridDim.x * groups) {
    int64_t b = rb + gid < batch ? rb + gid : batch - 1;
    const T *x = f + b * C_;
    C m;
    double s;
    row_stats<T, G>(x, C_, lane, &m, &s);
    if (rb + gid >= batch) continue;
    int64_t lab = (int64_t)labels[b];
    if (lab < 0 || lab >= C_) {
      if (lane == 0) atomicMin(&flag[0], (unsigned long long)b);
      continue;
    }
    T *g = bp + b * C_;
    double inv = 1.0 / s;
    for (int64_t j = lane; j < C_; j += G) {
      C e = s_exp(Tr<T>::load(x[j]) - m);
      C v = (C)(e * inv);
      if (j == lab) v -= (C)1;
      g[j] = Tr<T>::store(v);
    }
    if (lane == 0) loss[b] = Tr<T>::store((C)(log(s) - (double)(Tr<T>::load(x[lab]) - m)));
  }
}

unsigned row_grid(int64_t rows, int G, int sms) {
  int64_t groups = kThreads / G;
  int64_t blocks = (rows + groups - 1) / groups;
  int64_t cap = (int64_t)sms * 32;
  return (unsigned)(blocks < cap ? blocks : cap);
}

pd_code softmax(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *s = &c->in_shape[0];
  int64_t L = s->dims[s->rank - 1], rows = 1;
  for (int i = 0; i < s->rank - 1; i++) rows *= s->dims[i];
  if (rows * L == 0) return PD_OK;
  bool lg = c->op->name[0] == 'L';
  cudaStream_t cs = dev_cuda_stream(c->backend, c->device);
  int sms = dev_cuda_sm_count(c->backend, c->device);
  const void *in = c->in_data[0];
  void *out = c->out_data[0];
  if (L >= 2048) {
    PDK_DISPATCH_FLOAT(c->in_dtype[0], k_softmax<T, 256><<<row_grid(rows, 256, sms), kThreads, 0, cs>>>(
                                           (const T *)in, (T *)out, rows, L, lg))
  } else {
    PDK_DISPATCH_FLOAT(c->in_dtype[0], k_softmax<T, 32><<<row_grid(rows, 32, sms), kThreads, 0, cs>>>(
                                           (const T *)in, (T *)out, rows, L, lg))
  }
  CU_CHECK_LAUNCH(c, c->op->name, st);
  return PD_OK;
}

template <class T, class LabelT>
void sxent_launch(dev_kernel_ctx *c, int64_t batch, int64_t C_, unsigned long long *flag) {
  cudaStream_t cs = dev_cuda_stream(c->backend, c->device);
  int sms = dev_cuda_sm_count(c->backend, c->device);
  const T *f = (const T *)c->in_data[0];
  const LabelT *lab = (const LabelT *)c->in_data[1];
  T *loss = (T *)c->out_data[0], *bp = (T *)c->out_data[1];
  if (C_ >= 2048)
    k_sxent<T, LabelT, 256><<<row_grid(batch, 256, sms), kThreads, 0, cs>>>(f, lab, loss, bp, batch, C_, flag);
  else
    k_sxent<T, LabelT, 32><<<row_grid(batch, 32, sms), kThreads, 0, cs>>>(f, lab, loss, bp, batch, C_, flag);
}

/* A label outside [0, classes) fails the op, naming the first such label
 * (as the CPU kernel, which checks before computing). The check reads the
 * flag back, so this op waits for the stream. */
pd_code sxent(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *fs = &c->in_shape[0];
  int64_t batch = fs->dims[0], C_ = fs->dims[1];
  if (batch == 0) return PD_OK;
  unsigned long long *flag;
  pd_code rc = dev_cuda_flag_arm(c, &flag, st);
  if (rc != PD_OK) return rc;
  bool l64 = c->in_dtype[1] == PD_INT64;
  PDK_DISPATCH_FLOAT(c->in_dtype[0],
                     if (l64) sxent_launch<T, int64_t>(c, batch, C_, flag);
                     else sxent_launch<T, int32_t>(c, batch, C_, flag))
  CU_CHECK_LAUNCH(c, "SparseSoftmaxCrossEntropyWithLogits", st);
  unsigned long long w[DEV_CUDA_FLAG_WORDS];
  if ((rc = dev_cuda_flag_read(c, w, st)) != PD_OK) return rc;
  if (w[0] == UINT64_MAX) return PD_OK;
  int64_t i = (int64_t)w[0], v = 0;
  size_t ls = l64 ? 8 : 4;
  int32_t v32 = 0;
  CU_CHECK(c->backend, c->device,
           cudaMemcpy(l64 ? (void *)&v : (void *)&v32, (const char *)c->in_data[1] + (size_t)i * ls,
                      ls, cudaMemcpyDeviceToHost),
           st);
  if (!l64) v = v32;
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "SparseSoftmaxCrossEntropyWithLogits: Received a label value of %lld which is "
                   "outside the valid range of [0, %lld) (labels[%lld])",
                   (long long)v, (long long)C_, (long long)i);
}

}  // namespace

extern "C" void dev_cuda_register_reduce(void) {
  dev_cuda_register("Sum", reduce<RED_SUM>);
  dev_cuda_register("Mean", reduce<RED_MEAN>);
  dev_cuda_register("Max", reduce<RED_MAX>);
  dev_cuda_register("Min", reduce<RED_MIN>);
  dev_cuda_register("ArgMax", argmax);
  dev_cuda_register("Softmax", softmax);
  dev_cuda_register("LogSoftmax", softmax);
  dev_cuda_register("SparseSoftmaxCrossEntropyWithLogits", sxent);
  dev_cuda_register("SumToLike", sum_to_like);
}
