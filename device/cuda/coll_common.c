/* The host meeting of one CUDA collective (its shared state is made in
 * collective.c): the meetings every device of the set passes the same
 * number of times, the first failure, and the row copies both paths use
 * between mesh entries (peer copies across GPUs). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

void cu_coll_meet(cu_coll *c, void (*last)(cu_coll *, void *), void *arg) {
  pthread_mutex_lock(&c->mu);
  unsigned gen = c->generation;
  if (++c->arrived == c->n) {
    if (last) last(c, arg);
    c->arrived = 0;
    c->generation++;
    pthread_cond_broadcast(&c->cv);
  } else {
    while (gen == c->generation) pthread_cond_wait(&c->cv, &c->mu);
  }
  pthread_mutex_unlock(&c->mu);
}

void cu_coll_run_failed(cu_coll *c, int d, const dev_status *st) {
  pthread_mutex_lock(&c->mu);
  if (!c->run_failed) {
    c->run_failed = true;
    c->run_device = d;
    c->run_st = *st;
  }
  pthread_mutex_unlock(&c->mu);
}

pd_code cu_coll_run_result(dev_backend *b, cu_coll *c, dev_kernel_ctx *ctx,
                           dev_status *st) {
  if (!c->run_failed) return PD_OK;
  if (c->run_device == ctx->device)
    return dev_error(st, c->run_st.code, "%s", c->run_st.msg);
  return dev_error(st, c->run_st.code, "%s: cancelled because %s failed: %s",
                   ctx->op->name, b->device_name(b, c->run_device),
                   c->run_st.msg);
}

cudaError_t cu_copy_rows(cu_backend *c, int dd, void *dst, size_t dpitch,
                         int sd, const void *src, size_t spitch, size_t width,
                         size_t height, cudaStream_t s) {
  if (width == 0 || height == 0) return cudaSuccess;
  const int dord = c->devs[dd].ordinal, sord = c->devs[sd].ordinal;
  const bool peer = dord != sord;
  if (height == 1 || (dpitch == width && spitch == width)) {
    size_t bytes = width * height;
    return peer ? cudaMemcpyPeerAsync(dst, dord, src, sord, bytes, s)
                : cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  }
  if (dpitch <= (size_t)INT_MAX && spitch <= (size_t)INT_MAX) {
    if (!peer)
      return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                               cudaMemcpyDeviceToDevice, s);
    struct cudaMemcpy3DPeerParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr.ptr = (void *)src;
    p.srcPtr.pitch = spitch;
    p.srcPtr.xsize = width;
    p.srcPtr.ysize = height;
    p.srcDevice = sord;
    p.dstPtr.ptr = dst;
    p.dstPtr.pitch = dpitch;
    p.dstPtr.xsize = width;
    p.dstPtr.ysize = height;
    p.dstDevice = dord;
    p.extent.width = width; /* bytes, for linear memory */
    p.extent.height = height;
    p.extent.depth = 1;
    return cudaMemcpy3DPeerAsync(&p, s);
  }
  cudaError_t e = cudaSuccess;
  for (size_t r = 0; r < height && e == cudaSuccess; r++) {
    char *to = (char *)dst + r * dpitch;
    const char *from = (const char *)src + r * spitch;
    e = peer ? cudaMemcpyPeerAsync(to, dord, from, sord, width, s)
             : cudaMemcpyAsync(to, from, width, cudaMemcpyDeviceToDevice, s);
  }
  return e;
}
