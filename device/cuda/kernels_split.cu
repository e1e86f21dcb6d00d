/* CUDA kernels of the list ops (device/ops/split_pack.c: Split, SplitV,
 * Unpack, Pack). They move bytes only, as Concat does (kernels_array.cu):
 * each output (Split, SplitV, Unpack) or input (Pack) is one 2-D copy of
 * [outer, run] blocks on the device's stream, where run is the part's
 * bytes per outer index. Shapes and attributes were checked by the shared
 * infer functions; each component runs on its own shapes. */
#include "kernels.cuh"

using namespace pdk;

namespace {

/* Copies `rows` rows of `width` bytes from src (rows `spitch` apart) to dst
 * (rows `dpitch` apart) on c's stream: one plain copy when the rows are
 * contiguous, else cudaMemcpy2DAsync, or one copy per row past the pitch
 * limit (cudaDevAttrMaxPitch, 2^31 - 1 bytes). */
pd_code copy_rows(dev_kernel_ctx *c, void *dst, size_t dpitch, const void *src, size_t spitch,
                  size_t width, size_t rows, dev_status *st) {
  const size_t kMaxPitch = 2147483647;
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

int64_t prod(const dev_shape *s, int lo, int hi) {
  int64_t n = 1;
  for (int i = lo; i < hi; i++) n *= s->dims[i];
  return n;
}

/* Split and SplitV: output k takes out_shape[k].dims[axis] slices of each of
 * the input's `outer` blocks. `drop`: Unpack, whose outputs lose the axis
 * (one slice each). */
pd_code split_parts(dev_kernel_ctx *c, int64_t a, bool drop, dev_status *st) {
  const dev_shape *in = &c->in_shape[0];
  int axis = (int)(a < 0 ? a + in->rank : a);
  size_t es = pd_dtype_size(c->in_dtype[0]);
  int64_t outer = prod(in, 0, axis), inner = prod(in, axis + 1, in->rank);
  size_t in_run = (size_t)(in->dims[axis] * inner) * es;
  if (in_run == 0 || outer == 0) return PD_OK;
  size_t off = 0;
  for (int k = 0; k < c->num_outputs; k++) {
    int64_t rows = drop ? 1 : c->out_shape[k].dims[axis];
    size_t run = (size_t)(rows * inner) * es;
    pd_code rc = copy_rows(c, c->out_data[k], run, (const char *)c->in_data[0] + off, in_run, run,
                           (size_t)outer, st);
    if (rc != PD_OK) return rc;
    off += run;
  }
  return PD_OK;
}

pd_code split(dev_kernel_ctx *c, dev_status *st) {
  return split_parts(c, c->attrs[0].u.i, false, st); /* axis, num_split */
}

pd_code splitv(dev_kernel_ctx *c, dev_status *st) {
  return split_parts(c, c->attrs[1].u.i, false, st); /* size_splits, axis */
}

pd_code unpack(dev_kernel_ctx *c, dev_status *st) {
  return split_parts(c, c->attrs[1].u.i, true, st); /* num, axis */
}

/* Pack: input k fills run bytes at column k * run of each outer block. */
pd_code pack(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *s0 = &c->in_shape[0];
  int64_t a = c->attrs[0].u.i;
  int axis = (int)(a < 0 ? a + s0->rank + 1 : a);
  size_t es = pd_dtype_size(c->in_dtype[0]);
  int64_t outer = prod(s0, 0, axis);
  size_t run = (size_t)prod(s0, axis, s0->rank) * es;
  if (run == 0 || outer == 0) return PD_OK;
  size_t pitch = run * (size_t)c->num_inputs;
  for (int k = 0; k < c->num_inputs; k++) {
    pd_code rc = copy_rows(c, (char *)c->out_data[0] + (size_t)k * run, pitch, c->in_data[k], run,
                           run, (size_t)outer, st);
    if (rc != PD_OK) return rc;
  }
  return PD_OK;
}

}  // namespace

extern "C" void dev_cuda_register_split(void) {
  dev_cuda_register("Split", split);
  dev_cuda_register("SplitV", splitv);
  dev_cuda_register("Unpack", unpack);
  dev_cuda_register("Pack", pack);
}
