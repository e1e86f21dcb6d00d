/* Device memory and copies of the CUDA backend: stream-ordered allocation
 * from each GPU's memory pool (cudaMallocFromPoolAsync / cudaFreeAsync on the
 * owning entry's stream) with per-entry accounting and limit, memory
 * statistics, host copies through pinned staging slots (or directly for
 * pinned or registered host memory), host_register, and device-to-device
 * copies (stream-ordered: on one GPU, peer copies across GPUs, staged
 * through pinned host memory where the GPUs have no peer access). See backend.c's opening comment for why frees are safe while
 * kernels still run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

pd_code cu_allocate(dev_backend *b, int device, size_t bytes, void **out,
                    dev_status *st) {
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  cu_gpu *g = &c->gpus[d->gpu];
  PD_TRY(cu_check_healthy(c, device, st));
  uint64_t limit = d->limit;
  uint64_t cur = atomic_load(&d->in_use);
  for (;;) {
    if (limit && (bytes > limit || cur > limit - bytes))
      return dev_error(st, PD_RESOURCE_EXHAUSTED,
                       "%s is out of memory: %zu bytes requested with %llu of "
                       "%llu bytes in use",
                       d->name, bytes, (unsigned long long)cur,
                       (unsigned long long)limit);
    if (atomic_compare_exchange_weak(&d->in_use, &cur, cur + bytes)) break;
  }
  void *p = NULL;
  cudaError_t e = cudaSetDevice(d->ordinal);
  if (e == cudaSuccess)
    e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, g->pool, d->stream);
  if (e != cudaSuccess) {
    atomic_fetch_sub(&d->in_use, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return dev_error(
          st, PD_RESOURCE_EXHAUSTED,
          "%s is out of memory: %zu bytes requested with %llu bytes in use on "
          "this device (GPU %d, %s, has %llu MiB)",
          d->name, bytes, (unsigned long long)cur, d->ordinal, g->name,
          (unsigned long long)(g->total_mem >> 20));
    }
    return dev_cuda_fail(b, device, e, "cudaMallocFromPoolAsync", st);
  }
  uint64_t now = cur + bytes, peak = atomic_load(&d->peak);
  while (now > peak && !atomic_compare_exchange_weak(&d->peak, &peak, now)) {
  }
  atomic_fetch_add(&d->allocs, 1);
  *out = p;
  return PD_OK;
}

void cu_deallocate(dev_backend *b, int device, void *ptr, size_t bytes) {
  if (!ptr) return;
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  atomic_fetch_sub(&d->in_use, bytes);
  if (atomic_load(&c->gpus[d->gpu].unhealthy)) return; /* the context is gone */
  cudaError_t e = cudaSetDevice(d->ordinal);
  if (e == cudaSuccess) e = cudaFreeAsync(ptr, d->stream);
  if (e != cudaSuccess) dev_cuda_fail(b, device, e, "cudaFreeAsync", NULL);
}

pd_code cu_memory_stats(dev_backend *b, int device, dev_memory_stats *out,
                        dev_status *st) {
  if (device < 0 || device >= b->num_devices)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "device %d is out of range; expected 0 to %d", device,
                     b->num_devices - 1);
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  dev_memory_stats m = {0};
  m.struct_size = sizeof m;
  m.bytes_in_use = atomic_load(&d->in_use);
  m.peak_bytes_in_use = atomic_load(&d->peak);
  m.bytes_limit = d->limit;
  m.bytes_total = c->gpus[d->gpu].total_mem;
  m.num_allocs = atomic_load(&d->allocs);
  *out = m;
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Host copies                                                               */

/* True when the DMA engines can reach `p` directly: pinned host memory (or
 * device or managed memory, which the staging memcpy could not read). */
static bool host_is_pinned(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeDevice ||
         a.type == cudaMemoryTypeManaged;
}

/* Allocates the device's staging slots at first use; under stage_mu. */
static pd_code stage_ready(cu_backend *c, int device, dev_status *st) {
  cu_device *d = &c->devs[device];
  for (int i = 0; i < CU_STAGE_SLOTS; i++) {
    if (d->stage[i]) continue;
    CU_CHECK(&c->base, device,
             cudaHostAlloc(&d->stage[i], CU_STAGE_BYTES, cudaHostAllocPortable),
             st);
  }
  return PD_OK;
}

pd_code cu_copy_h2d(dev_backend *b, int device, void *dst, const void *src,
                    size_t bytes, dev_status *st) {
  if (bytes == 0) return PD_OK;
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK) rc = cu_bind(c, device, st);
  if (rc != PD_OK) return rc;
  if (host_is_pinned(src) && host_is_pinned((const char *)src + bytes - 1)) {
    /* Straight from the caller's pinned buffer (first and last byte: a range
     * may run past a registered region); it is theirs again on return. */
    CU_CHECK(b, device,
             cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d->stream),
             st);
    return cu_wait_issued(c, device, st);
  }
  pthread_mutex_lock(&d->stage_mu);
  rc = stage_ready(c, device, st);
  for (size_t off = 0, k = 0; rc == PD_OK && off < bytes;
       off += CU_STAGE_BYTES, k++) {
    int slot = (int)(k % CU_STAGE_SLOTS);
    size_t n = bytes - off < CU_STAGE_BYTES ? bytes - off : CU_STAGE_BYTES;
    /* The slot's previous DMA must be done before it is overwritten. */
    CU_CHECK_GOTO(b, device, cudaEventSynchronize(d->stage_ev[slot]), st, rc,
                  out);
    memcpy(d->stage[slot], (const char *)src + off, n);
    CU_CHECK_GOTO(b, device,
                  cudaMemcpyAsync((char *)dst + off, d->stage[slot], n,
                                  cudaMemcpyHostToDevice, d->stream),
                  st, rc, out);
    CU_CHECK_GOTO(b, device, cudaEventRecord(d->stage_ev[slot], d->stream), st,
                  rc, out);
  }
out:
  pthread_mutex_unlock(&d->stage_mu);
  return rc;
}

pd_code cu_copy_d2h(dev_backend *b, int device, void *dst, const void *src,
                    size_t bytes, dev_status *st) {
  if (bytes == 0) return PD_OK;
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK) rc = cu_bind(c, device, st);
  if (rc != PD_OK) return rc;
  if (host_is_pinned(dst) && host_is_pinned((const char *)dst + bytes - 1)) {
    CU_CHECK(b, device,
             cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d->stream),
             st);
    return cu_wait_issued(c, device, st);
  }
  size_t chunks = (bytes + CU_STAGE_BYTES - 1) / CU_STAGE_BYTES;
  pthread_mutex_lock(&d->stage_mu);
  rc = stage_ready(c, device, st);
  /* Keep up to CU_STAGE_SLOTS chunks in flight; drain them in order. */
  for (size_t k = 0; rc == PD_OK && k < chunks + CU_STAGE_SLOTS; k++) {
    if (k >= CU_STAGE_SLOTS) { /* chunk k - SLOTS has landed: copy it out */
      size_t j = k - CU_STAGE_SLOTS, off = j * CU_STAGE_BYTES;
      int slot = (int)(j % CU_STAGE_SLOTS);
      size_t n = bytes - off < CU_STAGE_BYTES ? bytes - off : CU_STAGE_BYTES;
      CU_CHECK_GOTO(b, device, cudaEventSynchronize(d->stage_ev[slot]), st, rc,
                    out);
      memcpy((char *)dst + off, d->stage[slot], n);
    }
    if (k < chunks) {
      size_t off = k * CU_STAGE_BYTES;
      int slot = (int)(k % CU_STAGE_SLOTS);
      size_t n = bytes - off < CU_STAGE_BYTES ? bytes - off : CU_STAGE_BYTES;
      CU_CHECK_GOTO(b, device,
                    cudaMemcpyAsync(d->stage[slot], (const char *)src + off, n,
                                    cudaMemcpyDeviceToHost, d->stream),
                    st, rc, out);
      CU_CHECK_GOTO(b, device, cudaEventRecord(d->stage_ev[slot], d->stream),
                    st, rc, out);
    }
  }
out:
  pthread_mutex_unlock(&d->stage_mu);
  return rc;
}

/* The first healthy mesh entry, made current, for calls that act on the
 * whole process (cudaHostRegister); -1 with UNAVAILABLE when none is. */
static int cu_bind_any(cu_backend *c, dev_status *st) {
  for (int i = 0; i < c->base.num_devices; i++)
    if (!atomic_load(&c->gpus[c->devs[i].gpu].unhealthy) &&
        cudaSetDevice(c->devs[i].ordinal) == cudaSuccess)
      return i;
  (void)cudaGetLastError();
  if (st && cu_check_healthy(c, 0, st) == PD_OK)
    dev_error(st, PD_UNAVAILABLE,
              "no GPU of the mesh could be made current (cudaSetDevice)");
  return -1;
}

/* Page-locks a host range for every GPU (cudaHostRegisterPortable), so that
 * host_is_pinned() sends copies to and from it straight to the DMA engines. */
pd_code cu_host_register(dev_backend *b, void *ptr, size_t bytes,
                         dev_status *st) {
  cu_backend *c = cu_of(b);
  int dev = cu_bind_any(c, st);
  if (dev < 0) return st ? st->code : PD_UNAVAILABLE;
  cudaError_t e = cudaHostRegister(
      ptr, bytes, cudaHostRegisterDefault | cudaHostRegisterPortable);
  if (e == cudaSuccess) return PD_OK;
  (void)cudaGetLastError();
  switch (e) {
    case cudaErrorHostMemoryAlreadyRegistered:
      return dev_error(st, PD_ALREADY_EXISTS,
                       "cannot page-lock %zu bytes of host memory at %p: the "
                       "range overlaps one "
                       "already registered (%s); unregister it first",
                       bytes, ptr, cudaGetErrorName(e));
    case cudaErrorMemoryAllocation:
      return dev_error(
          st, PD_RESOURCE_EXHAUSTED,
          "cannot page-lock %zu bytes of host memory at %p: %s (%s); the OS "
          "refused to lock the pages (see ulimit -l, or LimitMEMLOCK= in the "
          "systemd unit)",
          bytes, ptr, cudaGetErrorString(e), cudaGetErrorName(e));
    case cudaErrorInvalidValue:
    case cudaErrorNotSupported:
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "cannot page-lock %zu bytes of host memory at %p: %s (%s); expected "
          "a range of mapped, writable memory of this process",
          bytes, ptr, cudaGetErrorString(e), cudaGetErrorName(e));
    default: {
      dev_status fst = DEV_STATUS_INIT;
      dev_cuda_fail(b, dev, e, "cudaHostRegister", &fst);
      return dev_error(st, fst.code,
                       "page-locking %zu bytes of host memory at %p: %s", bytes,
                       ptr, fst.msg);
    }
  }
}

void cu_host_unregister(dev_backend *b, void *ptr) {
  cu_backend *c = cu_of(b);
  /* With no healthy GPU the pages stay locked until the process exits. */
  if (cu_bind_any(c, NULL) < 0) return;
  if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}

/* ------------------------------------------------------------------------ */
/* Device-to-device copies                                                   */

/* Makes stream `waiter` of entry `wd` wait for everything issued so far on
 * stream `s` of entry `sd` (an event of sd's fence pool, given back at once:
 * the wait keeps the record current when it was made). Leaves wd's GPU
 * current. */
static pd_code stream_after(cu_backend *c, int wd, cudaStream_t waiter, int sd,
                            cudaStream_t s, dev_status *st) {
  dev_backend *b = &c->base;
  cu_fence *f = NULL;
  PD_TRY(cu_bind(c, sd, st));
  PD_TRY(cu_event_take(c, sd, s, &f, st));
  pd_code rc = cu_bind(c, wd, st);
  if (rc == PD_OK) {
    cudaError_t e = cudaStreamWaitEvent(waiter, f->ev, 0);
    if (e != cudaSuccess)
      rc = dev_cuda_fail(b, wd, e, "cudaStreamWaitEvent(copy)", st);
  }
  cu_fence_release(b, sd, f);
  return rc;
}

/* Across GPUs without peer access: through dst's pinned staging slots, all
 * of it stream-ordered, nothing waited for on the host. Chunk k goes
 * src -> slot on src's copy stream (once the slot's previous DMA is done:
 * dst's stage_ev[slot]), then slot -> dst on dst's stream (after an event
 * behind the first copy), and stage_ev[slot] marks the slot busy until
 * then. Host copies of dst take the same slots under the same lock and
 * wait for stage_ev before reusing one. */
static pd_code copy_staged(cu_backend *c, int dd, void *dst, int sd,
                           const void *src, size_t bytes, dev_status *st) {
  dev_backend *b = &c->base;
  cu_device *d = &c->devs[dd], *s = &c->devs[sd];
  pthread_mutex_lock(&d->stage_mu);
  pd_code rc = stage_ready(c, dd, st);
  for (size_t off = 0, k = 0; rc == PD_OK && off < bytes;
       off += CU_STAGE_BYTES, k++) {
    const int slot = (int)(k % CU_STAGE_SLOTS);
    const size_t n =
        bytes - off < CU_STAGE_BYTES ? bytes - off : CU_STAGE_BYTES;
    if ((rc = cu_bind(c, sd, st)) != PD_OK) break;
    CU_CHECK_GOTO(b, sd,
                  cudaStreamWaitEvent(s->copy_stream, d->stage_ev[slot], 0), st,
                  rc, out);
    CU_CHECK_GOTO(b, sd,
                  cudaMemcpyAsync(d->stage[slot], (const char *)src + off, n,
                                  cudaMemcpyDeviceToHost, s->copy_stream),
                  st, rc, out);
    rc = stream_after(c, dd, d->stream, sd, s->copy_stream, st);
    if (rc != PD_OK) break;
    CU_CHECK_GOTO(b, dd,
                  cudaMemcpyAsync((char *)dst + off, d->stage[slot], n,
                                  cudaMemcpyHostToDevice, d->stream),
                  st, rc, out);
    CU_CHECK_GOTO(b, dd, cudaEventRecord(d->stage_ev[slot], d->stream), st, rc,
                  out);
  }
out:
  pthread_mutex_unlock(&d->stage_mu);
  return rc;
}

/* Device to device (dev_backend.copy_d2d), stream-ordered on the
 * destination entry's stream; returns once the copy is queued, so a fence
 * recorded on dst_device afterwards (the executor's, after the op that
 * called it) covers it. What the caller guarantees (the engine's
 * CopyToDevices, device/place.c, does both):
 *  - the source is complete (its op's fence waited for): the copy does not
 *    wait for src's stream, whose tail may hold a later collective's NCCL
 *    kernel that waits for dst's part, queued behind this copy (a deadlock);
 *  - the source stays allocated until dst's fence after the copy (its
 *    stream-ordered free on src's stream is not ordered after a read from
 *    dst's stream). Making src's stream wait for the copy instead would tie
 *    the source device to the destination's backlog.
 * Paths: one entry, a copy on its stream (function bodies' copies); two on
 * one GPU (logical devices), cudaMemcpyAsync; GPUs with peer access
 * (enabled at start, backend.c enable_peers), cudaMemcpyPeerAsync; others
 * through pinned host memory (copy_staged).
 * Any thread; errors name the device (UNAVAILABLE for an unhealthy one). */
pd_code cu_copy_d2d(dev_backend *b, int dst_device, void *dst, int src_device,
                    const void *src, size_t bytes, dev_status *st) {
  if (bytes == 0) return PD_OK;
  cu_backend *c = cu_of(b);
  pd_code rc = cu_check_healthy(c, dst_device, st);
  if (rc == PD_OK && src_device != dst_device)
    rc = cu_check_healthy(c, src_device, st);
  if (rc != PD_OK) return rc;
  cu_device *s = &c->devs[src_device], *d = &c->devs[dst_device];
  if (s->gpu != d->gpu && !c->peer_copy[d->gpu][s->gpu])
    return copy_staged(c, dst_device, dst, src_device, src, bytes, st);
  PD_TRY(cu_bind(c, dst_device, st));
  /* Pool memory of another GPU needs a peer copy: a plain cudaMemcpyAsync
   * of it from another device fails unless that pool is mapped there. */
  if (s->gpu != d->gpu)
    CU_CHECK(
        b, dst_device,
        cudaMemcpyPeerAsync(dst, d->ordinal, src, s->ordinal, bytes, d->stream),
        st);
  else
    CU_CHECK(
        b, dst_device,
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->stream),
        st);
  return PD_OK;
}
