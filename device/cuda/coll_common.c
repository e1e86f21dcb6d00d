/* The host meeting of one CUDA collective: its shared state (created per op
 * at submission, over the op's device set: rank r is engine device
 * set->dev[r]; on the NCCL path it takes a reference on the set's
 * communicators, whose building starts then, in the background), the
 * meetings every device of the set passes the same number of times, the
 * first failure, and the row copies both paths use between mesh entries
 * (peer copies across GPUs). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

/* `set` NULL (an engine without device sets): the whole mesh. */
void *cu_collective_create(dev_backend *b, dev_collective_kind kind,
                           const struct dev_devset *set) {
  cu_coll *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->kind = kind;
  if (set) {
    c->set = *set;
  } else {
    c->set.n = b->num_devices;
    for (int i = 0; i < b->num_devices; i++) c->set.dev[i] = (uint8_t)i;
  }
  c->n = c->set.n;
#ifdef PARADEV_HAVE_NCCL
  if (cu_of(b)->use_nccl && !(c->comm = cu_nccl_acquire(cu_of(b), &c->set))) {
    free(c);
    return NULL;
  }
#endif
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  return c;
}

void cu_collective_release(dev_backend *b, void *coll) {
  cu_coll *c = coll;
  if (!c) return;
#ifdef PARADEV_HAVE_NCCL
  if (c->comm) cu_nccl_release(cu_of(b), c->comm);
#else
  (void)b;
#endif
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

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
