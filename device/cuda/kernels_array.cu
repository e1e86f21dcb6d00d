/* CUDA kernels of the array ops (device/ops/array.c: Transpose, Concat,
 * Slice, Gather, OneHot), of the random ops (device/ops/random.c:
 * RandomUniform, RandomNormal, DeviceId) and of the gradient ops that move
 * bytes (device/ops/grad_ops.c: BroadcastToLike, SliceGrad, ConcatGrad,
 * GatherGrad). Identity, Reshape and ReshapeLike alias their input and run
 * no kernel on any backend.
 *
 * Array ops move bytes, so their kernels work on unsigned words of the
 * element size (Gather on the widest word that divides a row). Transpose
 * moves the input's innermost axis through shared-memory tiles when it
 * leaves the innermost position, so both reads and writes are coalesced.
 *
 * The random ops run the CPU kernel's Philox4x32-10 with the same key and
 * counter layout, so the same seed gives the same bits on both backends
 * (uniform values exactly; normals up to the last-place differences of the
 * GPU's logf/sinf/cosf). */
#include <math.h>
#include <stdio.h>

#include "kernels.cuh"

using namespace pdk;

namespace {

/* ---------------------------------------------------------------------- */
/* Strided copy: out[i] = in[base + sum(idx_k * stride_k)], i row-major over
 * p.dims (Slice, Transpose without a moving inner axis).                   */

template <class U>
__global__ void k_strided(const U *in, U *out, int64_t n, Strides p, int64_t base, bool small) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    int64_t oi, unused;
    offsets2(p, i, small, &oi, &unused);
    out[i] = in[base + oi];
  }
}

pd_code strided_copy(dev_kernel_ctx *c, const void *in, void *out, size_t es, const Strides &p,
                     int64_t base, dev_status *st) {
  int64_t n = 1;
  for (int i = 0; i < p.rank; i++) n *= p.dims[i];
  if (n == 0) return PD_OK;
  bool small = n <= (int64_t)UINT32_MAX;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  unsigned grid = launch_grid(n, dev_cuda_sm_count(c->backend, c->device));
  PDK_DISPATCH_SIZE(es, k_strided<T><<<grid, kThreads, 0, s>>>((const T *)in, (T *)out, n, p, base, small))
  CU_CHECK_LAUNCH(c, c->op->name, st);
  return PD_OK;
}

/* The inverse: out[base + sum(idx_k * stride_k)] = in[i] (SliceGrad). */
template <class U>
__global__ void k_strided_scatter(const U *in, U *out, int64_t n, Strides p, int64_t base,
                                  bool small) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    int64_t oi, unused;
    offsets2(p, i, small, &oi, &unused);
    out[base + oi] = in[i];
  }
}

/* ---------------------------------------------------------------------- */
/* Transpose                                                                */

/* The effective permutation (an empty perm reverses the axes). */
void transpose_perm(const dev_attr_value *a, int rank, int *p) {
  if (a->u.ilist.n == 0)
    for (int i = 0; i < rank; i++) p[i] = rank - 1 - i;
  else
    for (int i = 0; i < rank; i++) p[i] = (int)a->u.ilist.v[i];
}

/* Size-1 axes dropped, input axes that stay adjacent merged (array.c's
 * tp_simplify). */
struct TpPlan {
  int rank;
  int64_t dims[PD_MAX_RANK];
  int perm[PD_MAX_RANK];
};

void tp_simplify(const dev_shape *in, const int *perm, TpPlan *p) {
  int newidx[PD_MAX_RANK];
  int r = 0;
  for (int k = 0; k < in->rank; k++) {
    if (in->dims[k] == 1) {
      newidx[k] = -1;
    } else {
      newidx[k] = r;
      p->dims[r++] = in->dims[k];
    }
  }
  int j = 0;
  for (int i = 0; i < in->rank; i++)
    if (newidx[perm[i]] >= 0) p->perm[j++] = newidx[perm[i]];
  p->rank = r;
  for (;;) {
    int at = -1;
    for (int i = 0; i + 1 < p->rank; i++)
      if (p->perm[i + 1] == p->perm[i] + 1) {
        at = i;
        break;
      }
    if (at < 0) break;
    int a = p->perm[at];
    p->dims[a] *= p->dims[a + 1];
    for (int k = a + 1; k + 1 < p->rank; k++) p->dims[k] = p->dims[k + 1];
    for (int i = at + 1; i + 1 < p->rank; i++) p->perm[i] = p->perm[i + 1];
    p->rank--;
    for (int i = 0; i < p->rank; i++)
      if (p->perm[i] > a) p->perm[i]--;
  }
}

/* Batched 2-D transposes through 32x32 shared tiles: output axis J reads the
 * input's contiguous axis, output axis K is the output's contiguous axis;
 * the other axes are the batch. */
struct TileGeom {
  int64_t nj, nk;
  int64_t in_k; /* input stride of output axis K */
  int64_t out_j; /* output stride of output axis J */
  int nb;
  int64_t bdims[PD_MAX_RANK], bin[PD_MAX_RANK], bout[PD_MAX_RANK];
  int64_t batch;
};

template <class U>
__global__ void k_transpose_tiled(const U *in, U *out, TileGeom t) {
  __shared__ U tile[32][33];
  const int64_t tj = (t.nj + 31) / 32, tk = (t.nk + 31) / 32;
  for (int64_t bz = blockIdx.z; bz < t.batch; bz += gridDim.z) {
    int64_t ib = 0, ob = 0, r = bz;
    for (int k = t.nb - 1; k >= 0; k--) {
      int64_t q = r / t.bdims[k], idx = r - q * t.bdims[k];
      ib += idx * t.bin[k];
      ob += idx * t.bout[k];
      r = q;
    }
    for (int64_t yk = blockIdx.y; yk < tk; yk += gridDim.y)
      for (int64_t xj = blockIdx.x; xj < tj; xj += gridDim.x) {
        int64_t j0 = xj * 32, k0 = yk * 32;
        for (int rr = threadIdx.y; rr < 32; rr += 8) {
          int64_t j = j0 + threadIdx.x, k = k0 + rr;
          if (j < t.nj && k < t.nk) tile[rr][threadIdx.x] = in[ib + j + k * t.in_k];
        }
        __syncthreads();
        for (int rr = threadIdx.y; rr < 32; rr += 8) {
          int64_t j = j0 + rr, k = k0 + threadIdx.x;
          if (j < t.nj && k < t.nk) out[ob + j * t.out_j + k] = tile[threadIdx.x][rr];
        }
        __syncthreads();
      }
  }
}

pd_code transpose(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *in = &c->in_shape[0];
  size_t es = pd_dtype_size(c->in_dtype[0]);
  int64_t total = num_elements(in);
  if (total == 0) return PD_OK;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  int perm[PD_MAX_RANK];
  transpose_perm(&c->attrs[0], in->rank, perm);
  TpPlan p;
  tp_simplify(in, perm, &p);
  if (p.rank <= 1) {
    CU_CHECK(c->backend, c->device,
             cudaMemcpyAsync(c->out_data[0], c->in_data[0], (size_t)total * es,
                             cudaMemcpyDeviceToDevice, s),
             st);
    return PD_OK;
  }
  const int r = p.rank;
  int64_t is[PD_MAX_RANK], od[PD_MAX_RANK], os[PD_MAX_RANK];
  is[r - 1] = 1;
  for (int k = r - 2; k >= 0; k--) is[k] = is[k + 1] * p.dims[k + 1];
  for (int i = 0; i < r; i++) od[i] = p.dims[p.perm[i]];
  os[r - 1] = 1;
  for (int i = r - 2; i >= 0; i--) os[i] = os[i + 1] * od[i + 1];
  int K = r - 1, J = -1;
  for (int i = 0; i < r; i++)
    if (p.perm[i] == r - 1) J = i;
  if (J == K) { /* rows stay rows: a strided gather reads them coalesced */
    Strides sp;
    sp.rank = r;
    for (int i = 0; i < r; i++) {
      sp.dims[i] = od[i];
      sp.s0[i] = is[p.perm[i]];
      sp.s1[i] = 0;
    }
    return strided_copy(c, c->in_data[0], c->out_data[0], es, sp, 0, st);
  }
  TileGeom t;
  t.nj = od[J];
  t.nk = od[K];
  t.in_k = is[p.perm[K]];
  t.out_j = os[J];
  t.nb = 0;
  t.batch = 1;
  for (int i = 0; i < r; i++) {
    if (i == J || i == K) continue;
    t.bdims[t.nb] = od[i];
    t.bin[t.nb] = is[p.perm[i]];
    t.bout[t.nb] = os[i];
    t.nb++;
    t.batch *= od[i];
  }
  int64_t tj = (t.nj + 31) / 32, tk = (t.nk + 31) / 32;
  dim3 grid((unsigned)(tj < 65535 ? tj : 65535), (unsigned)(tk < 65535 ? tk : 65535),
            (unsigned)(t.batch < 65535 ? t.batch : 65535));
  dim3 block(32, 8);
  PDK_DISPATCH_SIZE(es, k_transpose_tiled<T><<<grid, block, 0, s>>>((const T *)c->in_data[0],
                                                                    (T *)c->out_data[0], t))
  CU_CHECK_LAUNCH(c, "Transpose", st);
  return PD_OK;
}

/* ---------------------------------------------------------------------- */
/* Concat: one 2-D copy per input ([outer, rows_k * inner] blocks).         */

/* Copies `rows` rows of `width` bytes from src (rows `spitch` apart) to dst
 * (rows `dpitch` apart) on c's stream. cudaMemcpy2DAsync refuses a pitch over
 * cudaDevAttrMaxPitch (2^31 - 1 bytes on current GPUs), which a Concat along
 * axis 0 of tensors over 2 GiB reaches: contiguous rows go as one plain copy,
 * and rows that far apart (so few rows: each is over 2 GiB) one copy each. */
pd_code copy_rows(dev_kernel_ctx *c, void *dst, size_t dpitch, const void *src, size_t spitch,
                  size_t width, size_t rows, dev_status *st) {
  const size_t kMaxPitch = 2147483647; /* memPitch of every GPU CUDA 13 supports */
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  if (width == 0 || rows == 0) return PD_OK;
  if (rows == 1 || (dpitch == width && spitch == width)) {
    CU_CHECK(c->backend, c->device,
             cudaMemcpyAsync(dst, src, width * rows, cudaMemcpyDeviceToDevice, s), st);
  } else if (dpitch <= kMaxPitch && spitch <= kMaxPitch) {
    CU_CHECK(c->backend, c->device,
             cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, s),
             st);
  } else {
    for (size_t r = 0; r < rows; r++)
      CU_CHECK(c->backend, c->device,
               cudaMemcpyAsync((char *)dst + r * dpitch, (const char *)src + r * spitch, width,
                               cudaMemcpyDeviceToDevice, s),
               st);
  }
  return PD_OK;
}

pd_code concat(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *os = &c->out_shape[0];
  int rank = os->rank;
  int64_t a = c->attrs[0].u.i;
  int axis = (int)(a < 0 ? a + rank : a);
  size_t es = pd_dtype_size(c->out_dtype[0]);
  if (num_elements(os) == 0) return PD_OK;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; i++) outer *= os->dims[i];
  for (int i = axis + 1; i < rank; i++) inner *= os->dims[i];
  size_t pitch = (size_t)(os->dims[axis] * inner) * es;
  size_t col = 0;
  for (int k = 0; k < c->num_inputs; k++) {
    size_t run = (size_t)(c->in_shape[k].dims[axis] * inner) * es;
    pd_code rc = copy_rows(c, (char *)c->out_data[0] + col, pitch, c->in_data[k], run, run,
                           (size_t)outer, st);
    if (rc != PD_OK) return rc;
    col += run;
  }
  return PD_OK;
}

/* ---------------------------------------------------------------------- */
/* Slice                                                                    */

pd_code slice(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *in = &c->in_shape[0], *out = &c->out_shape[0];
  const int64_t *begin = c->attrs[0].u.ilist.v;
  size_t es = pd_dtype_size(c->in_dtype[0]);
  int r = in->rank;
  if (num_elements(out) == 0) return PD_OK;
  if (r == 0) {
    CU_CHECK(c->backend, c->device,
             cudaMemcpyAsync(c->out_data[0], c->in_data[0], es, cudaMemcpyDeviceToDevice,
                             dev_cuda_stream(c->backend, c->device)),
             st);
    return PD_OK;
  }
  int64_t is[PD_MAX_RANK];
  is[r - 1] = 1;
  for (int d = r - 2; d >= 0; d--) is[d] = is[d + 1] * in->dims[d + 1];
  Strides p;
  p.rank = r;
  int64_t base = 0;
  for (int d = 0; d < r; d++) {
    p.dims[d] = out->dims[d];
    p.s0[d] = is[d];
    p.s1[d] = 0;
    base += begin[d] * is[d];
  }
  return strided_copy(c, c->in_data[0], c->out_data[0], es, p, base, st);
}

/* ---------------------------------------------------------------------- */
/* Gather                                                                   */

template <class I>
__global__ void k_gather_check(const I *idx, int64_t ni, int64_t n, unsigned long long *flag) {
  for (int64_t i = global_index(); i < ni; i += global_stride()) {
    int64_t v = (int64_t)idx[i];
    if (v < 0 || v >= n) atomicMin(&flag[0], (unsigned long long)i);
  }
}

/* out[o, i, e] = params[o, idx[i], e] in words of U; inner counts words. */
template <class U, class I>
__global__ void k_gather(const U *params, const I *idx, U *out, int64_t outer, int64_t ni,
                         int64_t n, int64_t inner) {
  const int64_t total = outer * ni * inner;
  for (int64_t x = global_index(); x < total; x += global_stride()) {
    int64_t t = x / inner, e = x - t * inner;
    int64_t o = t / ni, i = t - o * ni;
    int64_t v = (int64_t)idx[i];
    if (v < 0 || v >= n) v = 0; /* the op fails; stay in bounds meanwhile */
    out[x] = params[(o * n + v) * inner + e];
  }
}

struct alignas(16) Word16 {
  uint4 v;
};

template <class I>
void gather_launch(const void *params, const I *idx, void *out, int64_t outer, int64_t ni,
                   int64_t n, size_t row_bytes, unsigned grid, cudaStream_t s) {
  if (row_bytes % 16 == 0)
    k_gather<Word16, I><<<grid, kThreads, 0, s>>>((const Word16 *)params, idx, (Word16 *)out,
                                                  outer, ni, n, (int64_t)(row_bytes / 16));
  else if (row_bytes % 8 == 0)
    k_gather<uint64_t, I><<<grid, kThreads, 0, s>>>((const uint64_t *)params, idx, (uint64_t *)out,
                                                    outer, ni, n, (int64_t)(row_bytes / 8));
  else if (row_bytes % 4 == 0)
    k_gather<uint32_t, I><<<grid, kThreads, 0, s>>>((const uint32_t *)params, idx, (uint32_t *)out,
                                                    outer, ni, n, (int64_t)(row_bytes / 4));
  else if (row_bytes % 2 == 0)
    k_gather<uint16_t, I><<<grid, kThreads, 0, s>>>((const uint16_t *)params, idx, (uint16_t *)out,
                                                    outer, ni, n, (int64_t)(row_bytes / 2));
  else
    k_gather<uint8_t, I><<<grid, kThreads, 0, s>>>((const uint8_t *)params, idx, (uint8_t *)out,
                                                   outer, ni, n, (int64_t)row_bytes);
}

/* Flat index i of shape s as "[1,2]" (array.c's multi_index_str). */
void multi_index_str(const dev_shape *s, int64_t i, char *buf, size_t len) {
  int64_t idx[PD_MAX_RANK];
  for (int d = s->rank - 1; d >= 0; d--) {
    idx[d] = s->dims[d] ? i % s->dims[d] : 0;
    i = s->dims[d] ? i / s->dims[d] : 0;
  }
  buf[0] = '\0';
  if (s->rank == 0) return;
  size_t off = 0;
  for (int d = 0; d < s->rank; d++) {
    int w = snprintf(buf + off, len - off, "%s%lld", d ? "," : "[", (long long)idx[d]);
    if (w < 0 || (size_t)w >= len - off) return;
    off += (size_t)w;
  }
  snprintf(buf + off, len - off, "]");
}

/* Every index is checked (a bad one fails the op, as on the CPU), so Gather
 * reads the check back and waits for its stream. */
pd_code gather(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *ps = &c->in_shape[0];
  int64_t a = c->attrs[0].u.i;
  int axis = (int)(a < 0 ? a + ps->rank : a);
  int64_t outer = 1, n = ps->dims[axis], inner = 1;
  for (int i = 0; i < axis; i++) outer *= ps->dims[i];
  for (int i = axis + 1; i < ps->rank; i++) inner *= ps->dims[i];
  size_t row_bytes = (size_t)inner * pd_dtype_size(c->in_dtype[0]);
  int64_t ni = num_elements(&c->in_shape[1]);
  if (ni == 0) return PD_OK;
  bool i64 = c->in_dtype[1] == PD_INT64;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  int sms = dev_cuda_sm_count(c->backend, c->device);
  unsigned long long *flag;
  pd_code rc = dev_cuda_flag_arm(c, &flag, st);
  if (rc != PD_OK) return rc;
  unsigned cgrid = launch_grid(ni, sms);
  if (i64) k_gather_check<int64_t><<<cgrid, kThreads, 0, s>>>((const int64_t *)c->in_data[1], ni, n, flag);
  else k_gather_check<int32_t><<<cgrid, kThreads, 0, s>>>((const int32_t *)c->in_data[1], ni, n, flag);
  CU_CHECK_LAUNCH(c, "Gather", st);
  /* With no rows (n == 0) every index is bad and the op fails; the gather
   * kernel, which reads row 0 for a bad index, must not run then. */
  if (row_bytes && outer && n > 0) {
    size_t unit = row_bytes % 16 == 0 ? 16 : row_bytes % 8 == 0 ? 8 : row_bytes % 4 == 0 ? 4
                : row_bytes % 2 == 0 ? 2 : 1;
    unsigned grid = launch_grid(outer * ni * (int64_t)(row_bytes / unit), sms);
    if (i64)
      gather_launch<int64_t>(c->in_data[0], (const int64_t *)c->in_data[1], c->out_data[0], outer,
                             ni, n, row_bytes, grid, s);
    else
      gather_launch<int32_t>(c->in_data[0], (const int32_t *)c->in_data[1], c->out_data[0], outer,
                             ni, n, row_bytes, grid, s);
    CU_CHECK_LAUNCH(c, "Gather", st);
  }
  unsigned long long w[DEV_CUDA_FLAG_WORDS];
  if ((rc = dev_cuda_flag_read(c, w, st)) != PD_OK) return rc;
  if (w[0] == UINT64_MAX) return PD_OK;
  int64_t bad = (int64_t)w[0], v = 0;
  int32_t v32 = 0;
  size_t isz = i64 ? 8 : 4;
  CU_CHECK(c->backend, c->device,
           cudaMemcpy(i64 ? (void *)&v : (void *)&v32, (const char *)c->in_data[1] + (size_t)bad * isz,
                      isz, cudaMemcpyDeviceToHost),
           st);
  if (!i64) v = v32;
  char ib[160];
  multi_index_str(&c->in_shape[1], bad, ib, sizeof ib);
  return dev_error(st, PD_INVALID_ARGUMENT, "Gather: indices%s = %lld is not in [0, %lld)", ib,
                   (long long)v, (long long)n);
}

/* ---------------------------------------------------------------------- */
/* OneHot                                                                   */

template <class U, class I>
__global__ void k_onehot(const I *idx, U *out, int64_t outer, int64_t depth, int64_t inner, U on,
                         U off) {
  const int64_t total = outer * depth * inner;
  for (int64_t x = global_index(); x < total; x += global_stride()) {
    int64_t t = x / inner, i = x - t * inner;
    int64_t o = t / depth, v = t - o * depth;
    out[x] = (int64_t)idx[o * inner + i] == v ? on : off;
  }
}

/* on_value and off_value in the output dtype, from the CPU kernel run on two
 * indices {0, -1} with depth 1: the same rounding as the CPU's by
 * construction. */
pd_code onehot_values(dev_kernel_ctx *c, uint64_t *on, uint64_t *off, dev_status *st) {
  dev_kernel_fn cpu = c->op->kernels[DEV_BACKEND_CPU];
  int di = dev_op_attr_index(c->op, "depth"), ai = dev_op_attr_index(c->op, "axis");
  if (!cpu || di < 0 || ai < 0 || c->op->num_attrs > DEV_MAX_ATTRS)
    return dev_error(st, PD_INTERNAL, "OneHot: cannot evaluate on_value/off_value");
  dev_attr_value attrs[DEV_MAX_ATTRS];
  for (int i = 0; i < c->op->num_attrs; i++) attrs[i] = c->attrs[i];
  attrs[di].u.i = 1;
  attrs[ai].u.i = -1;
  int32_t ind[2] = {0, -1};
  const void *in_data[1] = {ind};
  pd_dtype in_dtype[1] = {PD_INT32};
  dev_shape in_shape[1];
  in_shape[0].rank = 1;
  in_shape[0].dims[0] = 2;
  dev_shape out_shape;
  out_shape.rank = 2;
  out_shape.dims[0] = 2;
  out_shape.dims[1] = 1;
  uint64_t vals[2] = {0, 0}; /* room for two elements of up to 8 bytes */
  uint8_t buf[16] = {0};
  void *out_data[1] = {buf};
  dev_kernel_ctx one = *c;
  one.attrs = attrs;
  one.num_inputs = 1;
  one.in_dtype = in_dtype;
  one.in_shape = in_shape;
  one.in_data = in_data;
  one.out_shape = &out_shape;
  one.out_data = out_data;
  pd_code rc = cpu(&one, st);
  if (rc != PD_OK) return rc;
  size_t es = pd_dtype_size(c->out_dtype[0]);
  memcpy(&vals[0], buf, es);
  memcpy(&vals[1], buf + es, es);
  *on = vals[0];
  *off = vals[1];
  return PD_OK;
}

template <class U>
void onehot_launch(pd_dtype idt, const void *idx, void *out, int64_t outer, int64_t depth,
                   int64_t inner, uint64_t on, uint64_t off, unsigned grid, cudaStream_t s) {
  U on_u, off_u;
  memcpy(&on_u, &on, sizeof on_u);
  memcpy(&off_u, &off, sizeof off_u);
  if (idt == PD_INT64)
    k_onehot<U, int64_t><<<grid, kThreads, 0, s>>>((const int64_t *)idx, (U *)out, outer, depth, inner, on_u, off_u);
  else if (idt == PD_INT32)
    k_onehot<U, int32_t><<<grid, kThreads, 0, s>>>((const int32_t *)idx, (U *)out, outer, depth, inner, on_u, off_u);
  else
    k_onehot<U, uint8_t><<<grid, kThreads, 0, s>>>((const uint8_t *)idx, (U *)out, outer, depth, inner, on_u, off_u);
}

pd_code onehot(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *in = &c->in_shape[0];
  int di = dev_op_attr_index(c->op, "depth"), ai = dev_op_attr_index(c->op, "axis");
  int64_t depth = c->attrs[di].u.i, axis = c->attrs[ai].u.i;
  int ax = axis == -1 ? in->rank : (int)axis;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < ax; i++) outer *= in->dims[i];
  for (int i = ax; i < in->rank; i++) inner *= in->dims[i];
  int64_t total = outer * depth * inner;
  if (total == 0) return PD_OK;
  uint64_t on, off;
  pd_code rc = onehot_values(c, &on, &off, st);
  if (rc != PD_OK) return rc;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  unsigned grid = launch_grid(total, dev_cuda_sm_count(c->backend, c->device));
  PDK_DISPATCH_SIZE(pd_dtype_size(c->out_dtype[0]),
                    onehot_launch<T>(c->in_dtype[0], c->in_data[0], c->out_data[0], outer, depth,
                                     inner, on, off, grid, s))
  CU_CHECK_LAUNCH(c, "OneHot", st);
  return PD_OK;
}

/* ---------------------------------------------------------------------- */
/* Philox4x32-10 (device/ops/random.c)                                      */

struct PhiloxKey {
  uint32_t k0, k1, c2, c3;
};

__device__ __forceinline__ void philox(const PhiloxKey &pk, uint64_t block, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = pk.c2, c3 = pk.c3;
  uint32_t k0 = pk.k0, k1 = pk.k1;
#pragma unroll
  for (int r = 0; r < 10; r++) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

__device__ __forceinline__ float u24(uint32_t x) { return (float)(x >> 8) * 0x1p-24f; }
__device__ __forceinline__ double u53(uint32_t hi, uint32_t lo) {
  return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

/* Attribute order shared by both random ops (random.c). */
enum { R_SHAPE, R_DTYPE, R_SEED, R_SEED2, R_P0, R_P1, R_PER_DEVICE };

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

PhiloxKey kernel_key(const dev_kernel_ctx *c) {
  uint64_t seed = (uint64_t)c->attrs[R_SEED].u.i, seed2 = (uint64_t)c->attrs[R_SEED2].u.i;
  if (c->attrs[R_PER_DEVICE].u.b) seed ^= mix64((uint64_t)dev_cuda_position(c) + 1);
  return PhiloxKey{(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)seed2, (uint32_t)(seed2 >> 32)};
}

/* Representable bounds of [minval, maxval) in a float dtype (random.c's
 * uniform_bounds; infer has checked that they exist). */
uint16_t f16_bits(pd_dtype dt, float f) {
  return dt == PD_FLOAT16 ? dev_float_to_half(f) : dev_float_to_bfloat16(f);
}
float f16_val(pd_dtype dt, uint16_t h) {
  return dt == PD_FLOAT16 ? dev_half_to_float(h) : dev_bfloat16_to_float(h);
}
uint16_t f16_up(uint16_t h) {
  if (h == 0x8000) return 0x0001;
  return (h & 0x8000) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}
uint16_t f16_down(uint16_t h) {
  if (h == 0x0000) return 0x8001;
  return (h & 0x8000) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

void uniform_bounds(pd_dtype dt, double minval, double maxval, double *lo, double *hi) {
  switch (dt) {
    case PD_FLOAT64:
      *lo = minval;
      *hi = nextafter(maxval, -INFINITY);
      break;
    case PD_FLOAT32: {
      float l = (float)minval, h = (float)maxval;
      if ((double)l < minval) l = nextafterf(l, INFINITY);
      if ((double)h >= maxval) h = nextafterf(h, -INFINITY);
      *lo = l;
      *hi = h;
      break;
    }
    default: {
      uint16_t l = f16_bits(dt, (float)minval), h = f16_bits(dt, (float)maxval);
      while ((double)f16_val(dt, l) < minval) l = f16_up(l);
      while ((double)f16_val(dt, f16_down(l)) >= minval) l = f16_down(l);
      while ((double)f16_val(dt, h) >= maxval) h = f16_down(h);
      while ((double)f16_val(dt, f16_up(h)) < maxval) h = f16_up(h);
      *lo = f16_val(dt, l);
      *hi = f16_val(dt, h);
      break;
    }
  }
}

template <class T>
__global__ void k_uniform(PhiloxKey pk, T *out, int64_t n, double minval, double range, double lo,
                          double hi, int bits, float scale) {
  constexpr int per = std::is_same<T, double>::value ? 2 : 4;
  const int64_t blocks = (n + per - 1) / per;
  for (int64_t b = global_index(); b < blocks; b += global_stride()) {
    uint32_t x[4];
    philox(pk, (uint64_t)b, x);
    int64_t i = b * per;
    /* minval + range * u rounded twice, as the CPU computes it: no fused
     * multiply-add, so the values are the same bits. */
    if constexpr (std::is_same<T, double>::value) {
      double v[2] = {__dadd_rn(minval, __dmul_rn(range, u53(x[0], x[1]))),
                     __dadd_rn(minval, __dmul_rn(range, u53(x[2], x[3])))};
      for (int j = 0; j < 2 && i + j < n; j++) out[i + j] = fmin(fmax(v[j], lo), hi);
    } else if constexpr (std::is_same<T, float>::value) {
      for (int j = 0; j < 4 && i + j < n; j++) {
        double v = __dadd_rn(minval, __dmul_rn(range, (double)u24(x[j])));
        out[i + j] = (float)fmin(fmax(v, lo), hi);
      }
    } else { /* 16-bit floats: the dtype's own grid over [0, 1) */
      for (int j = 0; j < 4 && i + j < n; j++) {
        double u = (double)((float)(x[j] >> (32 - bits)) * scale);
        float v = (float)fmin(fmax(__dadd_rn(minval, __dmul_rn(range, u)), lo), hi);
        out[i + j] = Tr<T>::store(v);
      }
    }
  }
}

__device__ __forceinline__ void box_muller_f(uint32_t a, uint32_t b, float *z0, float *z1) {
  float u1 = (float)((a >> 8) + 1) * 0x1p-24f; /* never 0 */
  float u2 = u24(b);
  float r = sqrtf(-2.0f * logf(u1));
  float t = 6.2831853071795864769f * u2;
  *z0 = r * cosf(t);
  *z1 = r * sinf(t);
}

template <class T>
__global__ void k_normal(PhiloxKey pk, T *out, int64_t n, double mean, double stddev, float m,
                         float s) {
  constexpr int per = std::is_same<T, double>::value ? 2 : 4;
  const int64_t blocks = (n + per - 1) / per;
  for (int64_t b = global_index(); b < blocks; b += global_stride()) {
    uint32_t x[4];
    philox(pk, (uint64_t)b, x);
    int64_t i = b * per;
    if constexpr (std::is_same<T, double>::value) {
      double u1 = (double)(((((uint64_t)x[0] << 32) | x[1]) >> 11) + 1) * 0x1p-53;
      double u2 = u53(x[2], x[3]);
      double r = sqrt(-2.0 * log(u1)), t = 6.283185307179586476925 * u2;
      /* mean + stddev * r * cos(t) with the CPU's two roundings (no FMA) */
      double sr = __dmul_rn(stddev, r);
      out[i] = __dadd_rn(mean, __dmul_rn(sr, cos(t)));
      if (i + 1 < n) out[i + 1] = __dadd_rn(mean, __dmul_rn(sr, sin(t)));
    } else {
      float z[4];
      box_muller_f(x[0], x[1], &z[0], &z[1]);
      box_muller_f(x[2], x[3], &z[2], &z[3]);
      for (int j = 0; j < 4 && i + j < n; j++) {
        float v = __fadd_rn(m, __fmul_rn(s, z[j])); /* m + s * z unfused, as the CPU */
        if constexpr (std::is_same<T, float>::value) out[i + j] = v;
        else out[i + j] = Tr<T>::store(v);
      }
    }
  }
}

/* double -> float with IEEE overflow to +-inf (random.c's d2f). */
float d2f(double v) {
  if (v > 3.4028234663852886e38) return v < 0x1.ffffffp127 ? 3.4028234663852886e38f : INFINITY;
  if (v < -3.4028234663852886e38) return v > -0x1.ffffffp127 ? -3.4028234663852886e38f : -INFINITY;
  return (float)v;
}

unsigned random_grid(dev_kernel_ctx *c, int64_t n) {
  return launch_grid((n + 3) / 4, dev_cuda_sm_count(c->backend, c->device));
}

pd_code random_uniform(dev_kernel_ctx *c, dev_status *st) {
  int64_t n = num_elements(&c->out_shape[0]);
  if (n == 0) return PD_OK;
  PhiloxKey pk = kernel_key(c);
  pd_dtype dt = c->out_dtype[0];
  double minval = c->attrs[R_P0].u.f, maxval = c->attrs[R_P1].u.f, lo, hi;
  uniform_bounds(dt, minval, maxval, &lo, &hi);
  double range = maxval - minval;
  int bits = dt == PD_FLOAT16 ? 11 : 8;
  float scale = dt == PD_FLOAT16 ? 0x1p-11f : 0x1p-8f;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  unsigned grid = random_grid(c, n);
  PDK_DISPATCH_FLOAT(dt, k_uniform<T><<<grid, kThreads, 0, s>>>(pk, (T *)c->out_data[0], n, minval,
                                                                range, lo, hi, bits, scale))
  CU_CHECK_LAUNCH(c, "RandomUniform", st);
  return PD_OK;
}

pd_code random_normal(dev_kernel_ctx *c, dev_status *st) {
  int64_t n = num_elements(&c->out_shape[0]);
  if (n == 0) return PD_OK;
  PhiloxKey pk = kernel_key(c);
  double mean = c->attrs[R_P0].u.f, stddev = c->attrs[R_P1].u.f;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  unsigned grid = random_grid(c, n);
  PDK_DISPATCH_FLOAT(c->out_dtype[0],
                     k_normal<T><<<grid, kThreads, 0, s>>>(pk, (T *)c->out_data[0], n, mean, stddev,
                                                           d2f(mean), d2f(stddev)))
  CU_CHECK_LAUNCH(c, "RandomNormal", st);
  return PD_OK;
}

__global__ void k_set_i32(int32_t *out, int32_t v) { *out = v; }

/* DeviceId: the component's index within the op's device set, as a kernel
 * parameter (no host buffer to keep alive until a copy runs). */
pd_code device_id(dev_kernel_ctx *c, dev_status *st) {
  k_set_i32<<<1, 1, 0, dev_cuda_stream(c->backend, c->device)>>>((int32_t *)c->out_data[0],
                                                                 (int32_t)dev_cuda_position(c));
  CU_CHECK_LAUNCH(c, "DeviceId", st);
  return PD_OK;
}

/* ---------------------------------------------------------------------- */
/* Gradient ops that move bytes (device/ops/grad_ops.c)                     */

template <class T>
__global__ void k_div_count(T *data, int64_t n, double count) {
  using C = typename Tr<T>::C;
  for (int64_t i = global_index(); i < n; i += global_stride())
    data[i] = Tr<T>::store(Tr<T>::load(data[i]) / (C)count);
}

/* Input's shape aligned with like's (grad_ops.c's btl_expand; infer has
 * checked that it broadcasts). */
void btl_expand(const dev_shape *in, const dev_shape *like, const dev_attr_value *axis,
                dev_shape *xe) {
  const int L = like->rank;
  unsigned mask = 0;
  for (int i = 0; i < axis->u.ilist.n; i++) {
    int64_t v = axis->u.ilist.v[i];
    mask |= 1u << (int)(v < 0 ? v + L : v);
  }
  int nred = axis->u.ilist.n;
  xe->rank = L;
  if (nred > 0 && in->rank == L - nred) {
    for (int i = 0, k = 0; i < L; i++) xe->dims[i] = (mask & (1u << i)) ? 1 : in->dims[k++];
  } else {
    for (int i = 0; i < L; i++) {
      int k = i - (L - in->rank);
      xe->dims[i] = k >= 0 ? in->dims[k] : 1;
    }
  }
}

/* BroadcastToLike(input, like; axis, mean): input broadcast to like's shape,
 * divided by the fan-out with `mean`. */
pd_code broadcast_to_like(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *os = &c->out_shape[0];
  int64_t total = num_elements(os);
  if (total == 0) return PD_OK;
  dev_shape xe;
  btl_expand(&c->in_shape[0], &c->in_shape[1], &c->attrs[0], &xe);
  Strides p;
  p.rank = os->rank;
  int64_t acc = 1;
  for (int i = os->rank - 1; i >= 0; i--) {
    p.dims[i] = os->dims[i];
    p.s0[i] = xe.dims[i] == 1 ? 0 : acc;
    p.s1[i] = 0;
    acc *= xe.dims[i];
  }
  pd_code rc = strided_copy(c, c->in_data[0], c->out_data[0], pd_dtype_size(c->out_dtype[0]), p,
                            0, st);
  if (rc != PD_OK || !c->attrs[1].u.b) return rc;
  int64_t in_n = num_elements(&xe);
  if (in_n > 0 && total != in_n) {
    unsigned grid = launch_grid(total, dev_cuda_sm_count(c->backend, c->device));
    cudaStream_t s = dev_cuda_stream(c->backend, c->device);
    double count = (double)(total / in_n);
    PDK_DISPATCH_FLOAT(c->out_dtype[0],
                       k_div_count<T><<<grid, kThreads, 0, s>>>((T *)c->out_data[0], total, count))
    CU_CHECK_LAUNCH(c, "BroadcastToLike", st);
  }
  return PD_OK;
}

/* SliceGrad(grad, like; begin): zeros of like's shape, grad written at begin. */
pd_code slice_grad(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *os = &c->out_shape[0], *gs = &c->in_shape[0];
  size_t es = pd_dtype_size(c->out_dtype[0]);
  int64_t total = num_elements(os);
  if (total == 0) return PD_OK;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  CU_CHECK(c->backend, c->device, cudaMemsetAsync(c->out_data[0], 0, (size_t)total * es, s), st);
  int64_t n = num_elements(gs);
  if (n == 0) return PD_OK;
  const int64_t *begin = c->attrs[0].u.ilist.v;
  int r = os->rank;
  Strides p;
  p.rank = r;
  int64_t stride = 1, base = 0;
  for (int d = r - 1; d >= 0; d--) {
    p.dims[d] = gs->dims[d];
    p.s0[d] = stride;
    p.s1[d] = 0;
    base += begin[d] * stride;
    stride *= os->dims[d];
  }
  if (r == 0) {
    p.rank = 1;
    p.dims[0] = 1;
    p.s0[0] = 0;
    p.s1[0] = 0;
  }
  bool small = n <= (int64_t)UINT32_MAX;
  unsigned grid = launch_grid(n, dev_cuda_sm_count(c->backend, c->device));
  PDK_DISPATCH_SIZE(es, k_strided_scatter<T><<<grid, kThreads, 0, s>>>(
                            (const T *)c->in_data[0], (T *)c->out_data[0], n, p, base, small))
  CU_CHECK_LAUNCH(c, "SliceGrad", st);
  return PD_OK;
}

/* ConcatGrad(grad, values...; axis, from_end): the part of grad that one of
 * Concat's inputs filled (grad_ops.c's cg_part), as one 2-D copy. */
pd_code concat_grad(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *g = &c->in_shape[0];
  int64_t a = c->attrs[0].u.i;
  int axis = (int)(a < 0 ? a + g->rank : a);
  bool from_end = c->attrs[1].u.b;
  int nv = c->num_inputs - 1;
  int64_t sum = 0, off, size;
  for (int k = 0; k < nv; k++) sum += c->in_shape[1 + k].dims[axis];
  if (from_end) {
    off = g->dims[axis] - sum;
    size = c->in_shape[1].dims[axis];
  } else {
    size = c->in_shape[nv].dims[axis];
    off = sum - size;
  }
  size_t es = pd_dtype_size(c->out_dtype[0]);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; i++) outer *= g->dims[i];
  for (int i = axis + 1; i < g->rank; i++) inner *= g->dims[i];
  size_t run = (size_t)(size * inner) * es, grow = (size_t)(g->dims[axis] * inner) * es;
  return copy_rows(c, c->out_data[0], run, (const char *)c->in_data[0] + (size_t)(off * inner) * es,
                   grow, run, (size_t)outer, st);
}

/* GatherGrad(grad, indices, like; axis): zeros of like's shape with grad's
 * slices added at the indices (atomic adds: repeated indices accumulate in
 * an unspecified order, so sums agree with the CPU's to rounding). float16
 * and bfloat16 accumulate in float32 scratch, as the CPU kernel does. */
template <class A, class T, class I>
__global__ void k_gather_grad(const T *g, const I *idx, A *acc, int64_t outer, int64_t ni,
                              int64_t n, int64_t inner) {
  const int64_t total = outer * ni * inner;
  for (int64_t x = global_index(); x < total; x += global_stride()) {
    int64_t t = x / inner, e = x - t * inner;
    int64_t o = t / ni, i = t - o * ni;
    int64_t v = (int64_t)idx[i];
    if (v < 0 || v >= n) continue; /* the op fails */
    atomicAdd(&acc[(o * n + v) * inner + e], (A)Tr<T>::load(g[x]));
  }
}

template <class T>
__global__ void k_narrow(const float *in, T *out, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) out[i] = Tr<T>::store(in[i]);
}

template <class T, class I>
cudaError_t gather_grad_launch(dev_kernel_ctx *c, const I *idx, void *acc, int64_t outer,
                               int64_t ni, int64_t n, int64_t inner, unsigned grid, cudaStream_t s) {
  using A = typename std::conditional<std::is_same<T, double>::value, double, float>::type;
  k_gather_grad<A, T, I><<<grid, kThreads, 0, s>>>((const T *)c->in_data[0], idx, (A *)acc, outer,
                                                    ni, n, inner);
  return cudaGetLastError();
}

pd_code gather_grad(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *like = &c->in_shape[2];
  int64_t a = c->attrs[0].u.i;
  int axis = (int)(a < 0 ? a + like->rank : a);
  int64_t outer = 1, n = like->dims[axis], inner = 1;
  for (int i = 0; i < axis; i++) outer *= like->dims[i];
  for (int i = axis + 1; i < like->rank; i++) inner *= like->dims[i];
  int64_t ni = num_elements(&c->in_shape[1]), total = num_elements(like);
  int64_t gn = num_elements(&c->in_shape[0]);
  pd_dtype dt = c->out_dtype[0];
  bool i64 = c->in_dtype[1] == PD_INT64;
  cudaStream_t s = dev_cuda_stream(c->backend, c->device);
  int sms = dev_cuda_sm_count(c->backend, c->device);
  unsigned long long *flag;
  pd_code rc = dev_cuda_flag_arm(c, &flag, st);
  if (rc != PD_OK) return rc;
  if (ni > 0) {
    unsigned cgrid = launch_grid(ni, sms);
    if (i64) k_gather_check<int64_t><<<cgrid, kThreads, 0, s>>>((const int64_t *)c->in_data[1], ni, n, flag);
    else k_gather_check<int32_t><<<cgrid, kThreads, 0, s>>>((const int32_t *)c->in_data[1], ni, n, flag);
    CU_CHECK_LAUNCH(c, "GatherGrad", st);
  }
  bool half = dt == PD_FLOAT16 || dt == PD_BFLOAT16;
  void *acc = c->out_data[0];
  size_t acc_bytes = (size_t)total * (half ? sizeof(float) : pd_dtype_size(dt));
  if (half && total > 0) {
    rc = dev_cuda_scratch(c, acc_bytes, &acc, st);
    if (rc != PD_OK) return rc;
  }
  cudaError_t e = cudaSuccess;
  if (total > 0) e = cudaMemsetAsync(acc, 0, acc_bytes, s);
  if (e == cudaSuccess && gn > 0) {
    unsigned grid = launch_grid(gn, sms);
    PDK_DISPATCH_FLOAT(dt, e = i64 ? gather_grad_launch<T, int64_t>(c, (const int64_t *)c->in_data[1], acc, outer, ni, n, inner, grid, s)
                                   : gather_grad_launch<T, int32_t>(c, (const int32_t *)c->in_data[1], acc, outer, ni, n, inner, grid, s))
  }
  if (e == cudaSuccess && half && total > 0) {
    unsigned grid = launch_grid(total, sms);
    if (dt == PD_FLOAT16) k_narrow<f16><<<grid, kThreads, 0, s>>>((const float *)acc, (f16 *)c->out_data[0], total);
    else k_narrow<bf16><<<grid, kThreads, 0, s>>>((const float *)acc, (bf16 *)c->out_data[0], total);
    e = cudaGetLastError();
  }
  if (half && total > 0) dev_cuda_scratch_free(c, acc, acc_bytes);
  if (e != cudaSuccess) return dev_cuda_fail(c->backend, c->device, e, "GatherGrad", st);
  unsigned long long w[DEV_CUDA_FLAG_WORDS];
  if ((rc = dev_cuda_flag_read(c, w, st)) != PD_OK) return rc;
  if (w[0] == UINT64_MAX) return PD_OK;
  int64_t bad = (int64_t)w[0], v = 0;
  int32_t v32 = 0;
  size_t isz = i64 ? 8 : 4;
  CU_CHECK(c->backend, c->device,
           cudaMemcpy(i64 ? (void *)&v : (void *)&v32, (const char *)c->in_data[1] + (size_t)bad * isz,
                      isz, cudaMemcpyDeviceToHost),
           st);
  if (!i64) v = v32;
  return dev_error(st, PD_INVALID_ARGUMENT, "GatherGrad: indices[%lld] = %lld is not in [0, %lld)",
                   (long long)bad, (long long)v, (long long)n);
}

}  // namespace

extern "C" void dev_cuda_register_array(void) {
  dev_cuda_register("BroadcastToLike", broadcast_to_like);
  dev_cuda_register("SliceGrad", slice_grad);
  dev_cuda_register("ConcatGrad", concat_grad);
  dev_cuda_register("GatherGrad", gather_grad);
  dev_cuda_register("Transpose", transpose);
  dev_cuda_register("Concat", concat);
  dev_cuda_register("Slice", slice);
  dev_cuda_register("Gather", gather);
  dev_cuda_register("OneHot", onehot);
  dev_cuda_register("RandomUniform", random_uniform);
  dev_cuda_register("RandomNormal", random_normal);
  dev_cuda_register("DeviceId", device_id);
}
