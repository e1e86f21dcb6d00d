/* The CUDA backend: one device per mesh entry, each with its own stream.
 *
 * Execution. The engine's executor thread of a device calls run_kernel, which
 * launches the op's kernels on the device's stream and returns: kernels run
 * asynchronously, in stream order, which is the engine's submission order.
 * After each op the executor records a completion fence (an event from a
 * per-device pool) and the engine's completion thread for the device waits
 * for it (fence_record / fence_wait), so an op's outputs are ready, and a
 * download reads them, only once the GPU has finished it; an error the GPU
 * hits inside a kernel comes back from that op's fence.
 *
 * Memory. cudaMallocFromPoolAsync / cudaFreeAsync on the device's stream,
 * from one memory pool per GPU (cudaMemPoolCreate, with the configured
 * release threshold) rather than an allocator of our own: a buffer freed on
 * the stream is reused by later allocations on that stream at once, and the
 * pool's cache makes allocation as cheap as a caching allocator's. Buffers
 * are freed stream-ordered, on the stream of the entry that owns them (from
 * whichever thread drops the last reference: an executor, a completion
 * thread, a download or a session close), and every op and copy that touches
 * a buffer runs on that same stream, so a release while kernels still read a
 * buffer is safe (the engine releases an op's inputs once every device has
 * issued it, without waiting for its fences). The one exception, copy-path
 * collectives reading peers' buffers from their own streams, ends with each
 * stream waiting for its peers' reads (collective.c), so the owner's free
 * still comes after them. Memory statistics count the bytes each mesh entry
 * holds; an optional per-entry limit makes out-of-memory testable, as the CPU
 * backend's.
 *
 * Host copies. Uploads and downloads go through pinned staging slots per
 * device, so the DMA of one chunk overlaps the copy of the next into (or out
 * of) pinned memory; a host buffer that is already pinned (cudaHostAlloc, or
 * registered with host_register: cudaHostRegister) is copied directly, and
 * the copy waits for an event behind it, not for the whole stream.
 *
 * Errors. Every CUDA and cuBLAS call is checked (CU_CHECK); a sticky error
 * marks the GPU unhealthy (dev_backend.healthy), and every later call on its
 * devices fails with UNAVAILABLE instead of touching a lost context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

int dev_cuda_error_is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorContextIsDestroyed:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorExternalDevice:
    case cudaErrorContained:        /* driver_types.h: "leaves the process in an */
    case cudaErrorTensorMemoryLeak: /* inconsistent state", as the ones above */
    case cudaErrorUnknown:
      return 1;
    default:
      return 0;
  }
}

/* The function name of a stringified call: "cudaFoo(a, b)" -> "cudaFoo". */
static void call_name(const char *what, char *buf, size_t len) {
  size_t n = strcspn(what, "(");
  if (n >= len) n = len - 1;
  memcpy(buf, what, n);
  buf[n] = '\0';
}

static void mark_unhealthy(cu_backend *c, int gpu, const char *why) {
  cu_gpu *g = &c->gpus[gpu];
  pthread_mutex_lock(&g->why_mu);
  if (!atomic_load(&g->unhealthy)) {
    snprintf(g->why, sizeof g->why, "%s", why);
    atomic_store(&g->unhealthy, true);
  }
  pthread_mutex_unlock(&g->why_mu);
}

pd_code dev_cuda_fail(dev_backend *b, int device, cudaError_t err, const char *what,
                      dev_status *st) {
  (void)cudaGetLastError(); /* clears the thread's error unless it is sticky */
  char fn[64];
  call_name(what, fn, sizeof fn);
  const char *dn = b && device >= 0 ? b->device_name(b, device) : "cuda";
  if (err == cudaErrorMemoryAllocation)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "%s: %s: out of GPU memory (%s)", dn, fn,
                     cudaGetErrorName(err));
  if (dev_cuda_error_is_sticky(err)) {
    char why[200];
    snprintf(why, sizeof why, "%s: %s (%s)", fn, cudaGetErrorString(err), cudaGetErrorName(err));
    if (b && device >= 0) mark_unhealthy(cu_of(b), cu_of(b)->devs[device].gpu, why);
    return dev_error(st, PD_UNAVAILABLE,
                     "%s: %s; the GPU's CUDA context is lost, so the device is marked "
                     "unhealthy and fails every later op (restart the daemon to recover)",
                     dn, why);
  }
  return dev_error(st, PD_INTERNAL, "%s: %s failed: %s (%s)", dn, fn, cudaGetErrorString(err),
                   cudaGetErrorName(err));
}

static pd_code cublas_fail(dev_backend *b, int device, cublasStatus_t s, const char *what,
                           dev_status *st) {
  char fn[64];
  call_name(what, fn, sizeof fn);
  const char *dn = b->device_name(b, device);
  if (s == CUBLAS_STATUS_ALLOC_FAILED)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "%s: %s: out of GPU memory (%s)", dn, fn,
                     cublasGetStatusName(s));
  return dev_error(st, PD_INTERNAL, "%s: %s failed: %s (%s)", dn, fn, cublasGetStatusString(s),
                   cublasGetStatusName(s));
}

#define CUBLAS_CHECK_GOTO(B, D, CALL, ST, RC, LABEL)         \
  do {                                                       \
    cublasStatus_t cb_s_ = (CALL);                           \
    if (cb_s_ != CUBLAS_STATUS_SUCCESS) {                    \
      (RC) = cublas_fail((B), (D), cb_s_, #CALL, (ST));      \
      goto LABEL;                                            \
    }                                                        \
  } while (0)

pd_code cu_check_healthy(cu_backend *c, int device, dev_status *st) {
  cu_gpu *g = &c->gpus[c->devs[device].gpu];
  if (!atomic_load(&g->unhealthy)) return PD_OK;
  pthread_mutex_lock(&g->why_mu);
  pd_code rc = dev_error(st, PD_UNAVAILABLE,
                         "%s is unhealthy after an unrecoverable CUDA error (%s); restart the "
                         "daemon to use it again",
                         c->devs[device].name, g->why);
  pthread_mutex_unlock(&g->why_mu);
  return rc;
}

pd_code cu_bind(cu_backend *c, int device, dev_status *st) {
  CU_CHECK(&c->base, device, cudaSetDevice(c->devs[device].ordinal), st);
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* What kernel functions ask of the backend                                  */

cudaStream_t dev_cuda_stream(dev_backend *b, int device) { return cu_of(b)->devs[device].stream; }

int dev_cuda_sm_count(dev_backend *b, int device) {
  cu_backend *c = cu_of(b);
  return c->gpus[c->devs[device].gpu].sm_count;
}

pd_code dev_cuda_flag_arm(dev_kernel_ctx *ctx, unsigned long long **dflag, dev_status *st) {
  cu_device *d = &cu_of(ctx->backend)->devs[ctx->device];
  /* No other op uses the word now: ops that arm it read it back (and so wait
   * for the stream) before they return. */
  d->hflag[0] = UINT64_MAX;
  d->hflag[1] = d->hflag[2] = d->hflag[3] = 0;
  CU_CHECK(ctx->backend, ctx->device,
           cudaMemcpyAsync(d->dflag, d->hflag, DEV_CUDA_FLAG_WORDS * sizeof *d->dflag,
                           cudaMemcpyHostToDevice, d->stream),
           st);
  *dflag = d->dflag;
  return PD_OK;
}

pd_code dev_cuda_flag_read(dev_kernel_ctx *ctx, unsigned long long out[DEV_CUDA_FLAG_WORDS],
                           dev_status *st) {
  cu_device *d = &cu_of(ctx->backend)->devs[ctx->device];
  CU_CHECK(ctx->backend, ctx->device,
           cudaMemcpyAsync(d->hflag, d->dflag, DEV_CUDA_FLAG_WORDS * sizeof *d->dflag,
                           cudaMemcpyDeviceToHost, d->stream),
           st);
  CU_CHECK(ctx->backend, ctx->device, cudaStreamSynchronize(d->stream), st);
  memcpy(out, d->hflag, DEV_CUDA_FLAG_WORDS * sizeof *out);
  return PD_OK;
}

pd_code dev_cuda_scratch(dev_kernel_ctx *ctx, size_t bytes, void **out, dev_status *st) {
  return ctx->backend->allocate(ctx->backend, ctx->device, bytes, out, st);
}

void dev_cuda_scratch_free(dev_kernel_ctx *ctx, void *p, size_t bytes) {
  ctx->backend->deallocate(ctx->backend, ctx->device, p, bytes);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

static pd_code cu_allocate(dev_backend *b, int device, size_t bytes, void **out, dev_status *st) {
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  cu_gpu *g = &c->gpus[d->gpu];
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc != PD_OK) return rc;
  uint64_t limit = c->memory_limit;
  uint64_t cur = atomic_load(&d->in_use);
  for (;;) {
    if (limit && (bytes > limit || cur > limit - bytes))
      return dev_error(st, PD_RESOURCE_EXHAUSTED,
                       "%s is out of memory: %zu bytes requested with %llu of %llu bytes in use",
                       d->name, bytes, (unsigned long long)cur, (unsigned long long)limit);
    if (atomic_compare_exchange_weak(&d->in_use, &cur, cur + bytes)) break;
  }
  void *p = NULL;
  cudaError_t e = cudaSetDevice(d->ordinal);
  if (e == cudaSuccess) e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, g->pool, d->stream);
  if (e != cudaSuccess) {
    atomic_fetch_sub(&d->in_use, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return dev_error(st, PD_RESOURCE_EXHAUSTED,
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

static void cu_deallocate(dev_backend *b, int device, void *ptr, size_t bytes) {
  if (!ptr) return;
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  atomic_fetch_sub(&d->in_use, bytes);
  if (atomic_load(&c->gpus[d->gpu].unhealthy)) return; /* the context is gone */
  cudaError_t e = cudaSetDevice(d->ordinal);
  if (e == cudaSuccess) e = cudaFreeAsync(ptr, d->stream);
  if (e != cudaSuccess) dev_cuda_fail(b, device, e, "cudaFreeAsync", NULL);
}

static pd_code cu_memory_stats(dev_backend *b, int device, dev_memory_stats *out,
                               dev_status *st) {
  if (device < 0 || device >= b->num_devices)
    return dev_error(st, PD_INVALID_ARGUMENT, "device %d is out of range; expected 0 to %d", device,
                     b->num_devices - 1);
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  dev_memory_stats m = {0};
  m.struct_size = sizeof m;
  m.bytes_in_use = atomic_load(&d->in_use);
  m.peak_bytes_in_use = atomic_load(&d->peak);
  m.bytes_limit = c->memory_limit;
  m.bytes_total = c->gpus[d->gpu].total_mem;
  m.num_allocs = atomic_load(&d->allocs);
  *out = m;
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Completion fences                                                         */

/* A fence is an event recorded on a device's stream behind an op's work
 * (dev_backend.fence_record), created with cudaEventBlockingSync, so that the
 * completion thread waiting for it sleeps instead of spinning, and
 * cudaEventDisableTiming, the cheapest kind. Events are reused from a free
 * list per device, as TensorFlow's EventMgr does; the list grows to the most
 * ops ever in flight at once (bounded by the stream's queue). The lists live
 * in the backend's own allocation, after devs[] (cu_fence_pools). */
typedef struct cu_fence {
  cudaEvent_t ev;
  struct cu_fence *next;
} cu_fence;

typedef struct cu_fence_pool {
  pthread_mutex_t mu;
  cu_fence *free;
} cu_fence_pool;

_Static_assert(_Alignof(cu_fence_pool) <= _Alignof(cu_device),
               "cu_fence_pool follows devs[] in one allocation");

static cu_fence_pool *cu_fence_pools(cu_backend *c) {
  return (cu_fence_pool *)(void *)&c->devs[c->base.num_devices];
}

static void cu_fence_put(cu_backend *c, int device, cu_fence *f) {
  cu_fence_pool *p = &cu_fence_pools(c)[device];
  pthread_mutex_lock(&p->mu);
  f->next = p->free;
  p->free = f;
  pthread_mutex_unlock(&p->mu);
}

/* Records a fence behind everything issued so far on `device`'s stream. The
 * calling thread must have the device's GPU current (cu_bind). */
static pd_code cu_fence_take(cu_backend *c, int device, cu_fence **out, dev_status *st) {
  cu_fence_pool *p = &cu_fence_pools(c)[device];
  pthread_mutex_lock(&p->mu);
  cu_fence *f = p->free;
  if (f) p->free = f->next;
  pthread_mutex_unlock(&p->mu);
  if (!f) {
    f = calloc(1, sizeof *f);
    if (!f) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    cudaError_t e = cudaEventCreateWithFlags(&f->ev, cudaEventBlockingSync | cudaEventDisableTiming);
    if (e != cudaSuccess) {
      free(f);
      return dev_cuda_fail(&c->base, device, e, "cudaEventCreateWithFlags(fence)", st);
    }
  }
  cudaError_t e = cudaEventRecord(f->ev, c->devs[device].stream);
  if (e != cudaSuccess) {
    cu_fence_put(c, device, f);
    return dev_cuda_fail(&c->base, device, e, "cudaEventRecord(fence)", st);
  }
  *out = f;
  return PD_OK;
}

/* Blocks until the work before `f` has finished; the first error the GPU hit
 * on the stream (an illegal address in a kernel) comes back here. */
static pd_code cu_fence_sync(cu_backend *c, int device, cu_fence *f, dev_status *st) {
  CU_CHECK(&c->base, device, cudaEventSynchronize(f->ev), st);
  return PD_OK;
}

static pd_code cu_fence_record(dev_backend *b, int device, void **fence, dev_status *st) {
  cu_backend *c = cu_of(b);
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK) rc = cu_bind(c, device, st);
  cu_fence *f = NULL;
  if (rc == PD_OK) rc = cu_fence_take(c, device, &f, st);
  if (rc == PD_OK) *fence = f;
  return rc;
}

static pd_code cu_fence_wait(dev_backend *b, int device, void *fence, dev_status *st) {
  cu_backend *c = cu_of(b);
  /* Once the GPU is unhealthy, its outstanding ops fail without touching the
   * lost context: their values could not be read anyway. */
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK) rc = cu_bind(c, device, st); /* op_free may have bound another */
  if (rc == PD_OK) rc = cu_fence_sync(c, device, fence, st);
  return rc;
}

static void cu_fence_release(dev_backend *b, int device, void *fence) {
  if (fence) cu_fence_put(cu_of(b), device, fence);
}

/* Waits for the work issued so far on `device`'s stream by this thread's
 * caller (a copy), without waiting for what other threads queue after it, as
 * cudaStreamSynchronize would. */
static pd_code cu_wait_issued(cu_backend *c, int device, dev_status *st) {
  cu_fence *f = NULL;
  pd_code rc = cu_fence_take(c, device, &f, st);
  if (rc != PD_OK) return rc;
  rc = cu_fence_sync(c, device, f, st);
  cu_fence_put(c, device, f);
  return rc;
}

/* Frees device i's fences (at destroy: every fence is back in the pool).
 * `ok`: the GPU's context is usable, so the events can be destroyed. */
static void cu_fences_destroy(cu_backend *c, int i, bool ok) {
  cu_fence_pool *p = &cu_fence_pools(c)[i];
  while (p->free) {
    cu_fence *f = p->free;
    p->free = f->next;
    if (ok) cudaEventDestroy(f->ev);
    free(f);
  }
  pthread_mutex_destroy(&p->mu);
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
    CU_CHECK(&c->base, device, cudaHostAlloc(&d->stage[i], CU_STAGE_BYTES, cudaHostAllocPortable),
             st);
  }
  return PD_OK;
}

static pd_code cu_copy_h2d(dev_backend *b, int device, void *dst, const void *src, size_t bytes,
                           dev_status *st) {
  if (bytes == 0) return PD_OK;
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK) rc = cu_bind(c, device, st);
  if (rc != PD_OK) return rc;
  if (host_is_pinned(src) && host_is_pinned((const char *)src + bytes - 1)) {
    /* Straight from the caller's pinned buffer (first and last byte: a range
     * may run past a registered region); it is theirs again on return. */
    CU_CHECK(b, device, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d->stream), st);
    return cu_wait_issued(c, device, st);
  }
  pthread_mutex_lock(&d->stage_mu);
  rc = stage_ready(c, device, st);
  for (size_t off = 0, k = 0; rc == PD_OK && off < bytes; off += CU_STAGE_BYTES, k++) {
    int slot = (int)(k % CU_STAGE_SLOTS);
    size_t n = bytes - off < CU_STAGE_BYTES ? bytes - off : CU_STAGE_BYTES;
    /* The slot's previous DMA must be done before it is overwritten. */
    CU_CHECK_GOTO(b, device, cudaEventSynchronize(d->stage_ev[slot]), st, rc, out);
    memcpy(d->stage[slot], (const char *)src + off, n);
    CU_CHECK_GOTO(b, device,
                  cudaMemcpyAsync((char *)dst + off, d->stage[slot], n, cudaMemcpyHostToDevice,
                                  d->stream),
                  st, rc, out);
    CU_CHECK_GOTO(b, device, cudaEventRecord(d->stage_ev[slot], d->stream), st, rc, out);
  }
out:
  pthread_mutex_unlock(&d->stage_mu);
  return rc;
}

static pd_code cu_copy_d2h(dev_backend *b, int device, void *dst, const void *src, size_t bytes,
                           dev_status *st) {
  if (bytes == 0) return PD_OK;
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[device];
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK) rc = cu_bind(c, device, st);
  if (rc != PD_OK) return rc;
  if (host_is_pinned(dst) && host_is_pinned((const char *)dst + bytes - 1)) {
    CU_CHECK(b, device, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d->stream), st);
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
      CU_CHECK_GOTO(b, device, cudaEventSynchronize(d->stage_ev[slot]), st, rc, out);
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
      CU_CHECK_GOTO(b, device, cudaEventRecord(d->stage_ev[slot], d->stream), st, rc, out);
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
    dev_error(st, PD_UNAVAILABLE, "no GPU of the mesh could be made current (cudaSetDevice)");
  return -1;
}

/* Page-locks a host range for every GPU (cudaHostRegisterPortable), so that
 * host_is_pinned() sends copies to and from it straight to the DMA engines. */
static pd_code cu_host_register(dev_backend *b, void *ptr, size_t bytes, dev_status *st) {
  cu_backend *c = cu_of(b);
  int dev = cu_bind_any(c, st);
  if (dev < 0) return st ? st->code : PD_UNAVAILABLE;
  cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault | cudaHostRegisterPortable);
  if (e == cudaSuccess) return PD_OK;
  (void)cudaGetLastError();
  switch (e) {
    case cudaErrorHostMemoryAlreadyRegistered:
      return dev_error(st, PD_ALREADY_EXISTS,
                       "cannot page-lock %zu bytes of host memory at %p: the range overlaps one "
                       "already registered (%s); unregister it first",
                       bytes, ptr, cudaGetErrorName(e));
    case cudaErrorMemoryAllocation:
      return dev_error(st, PD_RESOURCE_EXHAUSTED,
                       "cannot page-lock %zu bytes of host memory at %p: %s (%s); the OS "
                       "refused to lock the pages (see ulimit -l, or LimitMEMLOCK= in the "
                       "systemd unit)",
                       bytes, ptr, cudaGetErrorString(e), cudaGetErrorName(e));
    case cudaErrorInvalidValue:
    case cudaErrorNotSupported:
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "cannot page-lock %zu bytes of host memory at %p: %s (%s); expected "
                       "a range of mapped, writable memory of this process",
                       bytes, ptr, cudaGetErrorString(e), cudaGetErrorName(e));
    default: {
      dev_status fst = DEV_STATUS_INIT;
      dev_cuda_fail(b, dev, e, "cudaHostRegister", &fst);
      return dev_error(st, fst.code, "page-locking %zu bytes of host memory at %p: %s", bytes,
                       ptr, fst.msg);
    }
  }
}

static void cu_host_unregister(dev_backend *b, void *ptr) {
  cu_backend *c = cu_of(b);
  /* With no healthy GPU the pages stay locked until the process exits. */
  if (cu_bind_any(c, NULL) < 0) return;
  if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}

/* Device to device, possibly across GPUs. Synchronous: both streams are
 * drained, so neither side needs events afterwards. */
static pd_code cu_copy_d2d(dev_backend *b, int dst_device, void *dst, int src_device,
                           const void *src, size_t bytes, dev_status *st) {
  if (bytes == 0) return PD_OK;
  cu_backend *c = cu_of(b);
  pd_code rc = cu_check_healthy(c, dst_device, st);
  if (rc == PD_OK) rc = cu_check_healthy(c, src_device, st);
  if (rc == PD_OK) rc = cu_bind(c, dst_device, st);
  if (rc != PD_OK) return rc;
  cu_device *s = &c->devs[src_device], *d = &c->devs[dst_device];
  CU_CHECK(b, src_device, cudaStreamSynchronize(s->stream), st);
  /* Pool memory of another GPU needs a peer copy: a plain cudaMemcpyAsync
   * of it from another device fails unless that pool is mapped there
   * (cudaMemPoolSetAccess, done only for the copy path's meshes). */
  if (s->ordinal != d->ordinal)
    CU_CHECK(b, dst_device, cudaMemcpyPeerAsync(dst, d->ordinal, src, s->ordinal, bytes, d->stream),
             st);
  else
    CU_CHECK(b, dst_device, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->stream),
             st);
  CU_CHECK(b, dst_device, cudaStreamSynchronize(d->stream), st);
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Execution                                                                 */

static pd_code cu_run_kernel(dev_backend *b, dev_kernel_fn fn, dev_kernel_ctx *ctx,
                             dev_status *st) {
  cu_backend *c = cu_of(b);
  pd_code rc = cu_check_healthy(c, ctx->device, st);
  if (rc == PD_OK) rc = cu_bind(c, ctx->device, st);
  if (rc != PD_OK) return rc;
  rc = fn(ctx, st);
  if (rc == PD_OK) {
    cudaError_t e = cudaGetLastError(); /* a launch the kernel forgot to check */
    if (e != cudaSuccess) rc = dev_cuda_fail(b, ctx->device, e, "kernel launch", st);
  }
  return rc;
}

static pd_code cu_synchronize(dev_backend *b, int device, dev_status *st) {
  cu_backend *c = cu_of(b);
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK) rc = cu_bind(c, device, st);
  if (rc != PD_OK) return rc;
  CU_CHECK(b, device, cudaStreamSynchronize(c->devs[device].stream), st);
  return PD_OK;
}

static const char *cu_device_name(dev_backend *b, int device) {
  return device >= 0 && device < b->num_devices ? cu_of(b)->devs[device].name : "cuda:?";
}

static bool cu_healthy(dev_backend *b, int device) {
  if (device < 0 || device >= b->num_devices) return false;
  cu_backend *c = cu_of(b);
  return !atomic_load(&c->gpus[c->devs[device].gpu].unhealthy);
}

/* ------------------------------------------------------------------------ */
/* Lifetime                                                                  */

/* Frees whatever exists of a backend, fully or partly created (fields not yet
 * set are zero). Waits for every stream first. */
static void cu_destroy(dev_backend *b) {
  cu_backend *c = cu_of(b);
  cu_collectives_destroy(c);
  for (int i = 0; i < b->num_devices; i++) {
    cu_device *d = &c->devs[i];
    bool ok = !atomic_load(&c->gpus[d->gpu].unhealthy) && cudaSetDevice(d->ordinal) == cudaSuccess;
    if (ok && d->stream) (void)cudaStreamSynchronize(d->stream);
    if (ok) {
      if (d->cublas) cublasDestroy(d->cublas);
      for (int k = 0; k < 3; k++)
        if (d->coll_ev[k]) cudaEventDestroy(d->coll_ev[k]);
      for (int k = 0; k < CU_STAGE_SLOTS; k++)
        if (d->stage_ev[k]) cudaEventDestroy(d->stage_ev[k]);
      if (d->dflag) cudaFree(d->dflag);
      if (d->stream) cudaStreamDestroy(d->stream);
    }
    cu_fences_destroy(c, i, ok);
    /* Pinned host memory belongs to the process, not to a context. */
    for (int k = 0; k < CU_STAGE_SLOTS; k++)
      if (d->stage[k]) cudaFreeHost(d->stage[k]);
    if (d->hflag) cudaFreeHost(d->hflag);
    pthread_mutex_destroy(&d->stage_mu);
  }
  for (int g = 0; g < c->num_gpus; g++) {
    /* The pool's memory returns to the GPU once its last buffer is freed. */
    if (c->gpus[g].pool_created && !atomic_load(&c->gpus[g].unhealthy))
      (void)cudaMemPoolDestroy(c->gpus[g].pool);
    pthread_mutex_destroy(&c->gpus[g].why_mu);
  }
  (void)cudaGetLastError();
  free(c);
}

/* A parsed mesh: explicit ordinals, or "all". */
typedef struct mesh_spec {
  bool all;
  int n;
  int ordinal[PD_MAX_DEVICES];
} mesh_spec;

static pd_code parse_mesh(const char *spec, mesh_spec *m, dev_status *st) {
  memset(m, 0, sizeof *m);
  if (!spec || !*spec) {
    m->all = true;
    return PD_OK;
  }
  const char *p = spec;
  for (int entry = 0;; entry++) {
    while (*p == ' ') p++;
    size_t len = strcspn(p, ",");
    size_t tlen = len;
    while (tlen > 0 && p[tlen - 1] == ' ') tlen--;
    const char *want = "expected cuda:N or cuda:all (as in \"cuda:0,cuda:1\" or \"cuda:all\")";
    if (tlen < 6 || strncmp(p, "cuda:", 5) != 0)
      return dev_error(st, PD_INVALID_ARGUMENT, "mesh \"%.200s\": entry %d \"%.*s\" is not a CUDA device; %s",
                       spec, entry, (int)(tlen > 64 ? 64 : tlen), p, want);
    if (tlen == 8 && strncmp(p + 5, "all", 3) == 0) {
      if (entry != 0 || p[len] == ',')
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "mesh \"%.200s\": cuda:all must be the only entry", spec);
      m->all = true;
      return PD_OK;
    }
    long v = 0;
    for (size_t i = 5; i < tlen; i++) {
      if (p[i] < '0' || p[i] > '9' || v > 100000)
        return dev_error(st, PD_INVALID_ARGUMENT, "mesh \"%.200s\": entry %d \"%.*s\": %s", spec,
                         entry, (int)(tlen > 64 ? 64 : tlen), p, want);
      v = v * 10 + (p[i] - '0');
    }
    if (m->n == PD_MAX_DEVICES)
      return dev_error(st, PD_INVALID_ARGUMENT, "mesh \"%.200s\" has more than %d entries", spec,
                       PD_MAX_DEVICES);
    m->ordinal[m->n++] = (int)v;
    if (p[len] != ',') return PD_OK;
    p += len + 1;
  }
}

static pd_code init_gpu(cu_backend *c, int gi, const dev_cuda_config *cfg, dev_status *st) {
  cu_gpu *g = &c->gpus[gi];
  dev_backend *b = &c->base;
  CU_CHECK(b, -1, cudaSetDevice(g->ordinal), st);
  struct cudaDeviceProp prop;
  CU_CHECK(b, -1, cudaGetDeviceProperties(&prop, g->ordinal), st);
  snprintf(g->name, sizeof g->name, "%.*s", (int)sizeof g->name - 1, prop.name);
  g->sm_count = prop.multiProcessorCount;
  g->cc_major = prop.major;
  g->cc_minor = prop.minor;
  g->total_mem = prop.totalGlobalMem;
  int pools = 0;
  CU_CHECK(b, -1, cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, g->ordinal), st);
  if (!pools)
    return dev_error(st, PD_UNAVAILABLE,
                     "GPU %d (%s) does not support stream-ordered memory pools "
                     "(cudaMallocAsync); run with --backend=cpu",
                     g->ordinal, g->name);
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = g->ordinal;
  CU_CHECK(b, -1, cudaMemPoolCreate(&g->pool, &props), st);
  g->pool_created = true;
  uint64_t thr = cfg->pool_release_threshold;
  CU_CHECK(b, -1, cudaMemPoolSetAttribute(g->pool, cudaMemPoolAttrReleaseThreshold, &thr), st);
  return PD_OK;
}

static pd_code init_device(cu_backend *c, int i, dev_status *st) {
  cu_device *d = &c->devs[i];
  dev_backend *b = &c->base;
  pd_code rc = PD_OK;
  CU_CHECK(b, i, cudaSetDevice(d->ordinal), st);
  CU_CHECK(b, i, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), st);
  for (int k = 0; k < 3; k++)
    CU_CHECK(b, i, cudaEventCreateWithFlags(&d->coll_ev[k], cudaEventDisableTiming), st);
  for (int k = 0; k < CU_STAGE_SLOTS; k++)
    CU_CHECK(b, i, cudaEventCreateWithFlags(&d->stage_ev[k], cudaEventDisableTiming), st);
  CU_CHECK(b, i, cudaMalloc((void **)&d->dflag, DEV_CUDA_FLAG_WORDS * sizeof *d->dflag), st);
  CU_CHECK(b, i, cudaHostAlloc((void **)&d->hflag, DEV_CUDA_FLAG_WORDS * sizeof *d->hflag,
                               cudaHostAllocPortable), st);
  CUBLAS_CHECK_GOTO(b, i, cublasCreate(&d->cublas), st, rc, out);
  CUBLAS_CHECK_GOTO(b, i, cublasSetStream(d->cublas, d->stream), st, rc, out);
  /* Products follow the compute type each call asks for (exact float32
   * unless the backend allows TF32); no implicit tensor-op downcasts. */
  CUBLAS_CHECK_GOTO(b, i, cublasSetMathMode(d->cublas, CUBLAS_DEFAULT_MATH), st, rc, out);
out:
  return rc;
}

/* Makes every GPU's pool readable and writable from every other GPU of the
 * mesh, for the copy path's kernels that read peers' buffers. */
static void enable_peer_pools(cu_backend *c) {
  c->peer_ok = true;
  for (int g = 0; g < c->num_gpus && c->peer_ok; g++)
    for (int h = 0; h < c->num_gpus && c->peer_ok; h++) {
      if (g == h) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, c->gpus[h].ordinal, c->gpus[g].ordinal) != cudaSuccess ||
          !can) {
        c->peer_ok = false;
        snprintf(c->peer_why, sizeof c->peer_why,
                 "GPU %d cannot access GPU %d's memory (no peer access), so the copy path "
                 "cannot join them; use a mesh of distinct GPUs (NCCL) or of one GPU",
                 c->gpus[h].ordinal, c->gpus[g].ordinal);
        break;
      }
      struct cudaMemAccessDesc desc;
      memset(&desc, 0, sizeof desc);
      desc.location.type = cudaMemLocationTypeDevice;
      desc.location.id = c->gpus[h].ordinal;
      desc.flags = cudaMemAccessFlagsProtReadWrite;
      cudaError_t e = cudaMemPoolSetAccess(c->gpus[g].pool, &desc, 1);
      if (e != cudaSuccess) {
        c->peer_ok = false;
        snprintf(c->peer_why, sizeof c->peer_why,
                 "cudaMemPoolSetAccess(GPU %d's pool for GPU %d): %s", c->gpus[g].ordinal,
                 c->gpus[h].ordinal, cudaGetErrorString(e));
      }
    }
  (void)cudaGetLastError();
}

pd_code dev_cuda_backend_create(const dev_cuda_config *cfg, dev_backend **out, dev_status *st) {
  if (!cfg || cfg->struct_size < sizeof(dev_cuda_config))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_cuda_config: struct_size too small; initialize it with "
                     "DEV_CUDA_CONFIG_INITIALIZER");
  if (cfg->collectives != DEV_CUDA_COLL_AUTO && cfg->collectives != DEV_CUDA_COLL_NCCL &&
      cfg->collectives != DEV_CUDA_COLL_COPY)
    return dev_error(st, PD_INVALID_ARGUMENT, "dev_cuda_config: collectives is %d; expected auto, nccl or copy",
                     (int)cfg->collectives);
  dev_cuda_collectives path = cfg->collectives;
  const char *env = getenv("PARADEV_CUDA_COLLECTIVES");
  if (path == DEV_CUDA_COLL_AUTO && env && *env) {
    if (strcmp(env, "nccl") == 0) path = DEV_CUDA_COLL_NCCL;
    else if (strcmp(env, "copy") == 0) path = DEV_CUDA_COLL_COPY;
    else if (strcmp(env, "auto") != 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "PARADEV_CUDA_COLLECTIVES=%.64s; expected auto, nccl or copy", env);
  }
  mesh_spec m;
  pd_code rc = parse_mesh(cfg->mesh, &m, st);
  if (rc != PD_OK) return rc;

  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    return dev_error(st, PD_UNAVAILABLE,
                     "no CUDA GPU found (cudaGetDeviceCount: %s); run with --backend=cpu",
                     e != cudaSuccess ? cudaGetErrorString(e) : cudaGetErrorString(cudaErrorNoDevice));
  }
  if (m.all) {
    m.n = count < PD_MAX_DEVICES ? count : PD_MAX_DEVICES;
    for (int i = 0; i < m.n; i++) m.ordinal[i] = i;
  }
  for (int i = 0; i < m.n; i++)
    if (m.ordinal[i] >= count) {
      const char *vis = getenv("CUDA_VISIBLE_DEVICES");
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "mesh \"%.200s\": entry %d names cuda:%d, but %d GPU%s visible (cuda:0 to "
                       "cuda:%d; CUDA_VISIBLE_DEVICES=%s)",
                       cfg->mesh ? cfg->mesh : "", i, m.ordinal[i], count, count == 1 ? " is" : "s are",
                       count - 1, vis ? vis : "(unset)");
    }

  dev_register_cuda_kernels();

  const int n = m.n;
  cu_backend *c = calloc(1, sizeof *c + (size_t)n * (sizeof(cu_device) + sizeof(cu_fence_pool)));
  if (!c) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  dev_backend *b = &c->base;
  b->struct_size = DEV_BACKEND_STRUCT_SIZE;
  b->name = "cuda";
  b->kind = DEV_BACKEND_CUDA;
  b->num_devices = n;
  b->impl = c;
  b->allocate = cu_allocate;
  b->deallocate = cu_deallocate;
  b->copy_h2d = cu_copy_h2d;
  b->copy_d2h = cu_copy_d2h;
  b->copy_d2d = cu_copy_d2d;
  b->run_kernel = cu_run_kernel;
  b->collective_create = cu_collective_create;
  b->collective_run = cu_collective_run;
  b->collective_release = cu_collective_release;
  b->synchronize = cu_synchronize;
  b->memory_stats = cu_memory_stats;
  b->device_name = cu_device_name;
  b->destroy = cu_destroy;
  b->healthy = cu_healthy;
  b->host_register = cu_host_register;
  b->host_unregister = cu_host_unregister;
  b->fence_record = cu_fence_record;
  b->fence_wait = cu_fence_wait;
  b->fence_release = cu_fence_release;
  c->allow_tf32 = cfg->allow_tf32;
  c->memory_limit = cfg->memory_limit;
  c->coll_timeout_ms = cfg->collective_timeout_ms > 0 ? cfg->collective_timeout_ms : 300000;

  /* Distinct GPUs, and each entry's name: cuda:G when G appears once in the
   * mesh, cuda:G/K for the K-th of several entries on G. */
  bool distinct = true;
  for (int i = 0; i < n; i++) {
    cu_device *d = &c->devs[i];
    d->ordinal = m.ordinal[i];
    pthread_mutex_init(&d->stage_mu, NULL);
    pthread_mutex_init(&cu_fence_pools(c)[i].mu, NULL);
    int g = 0;
    while (g < c->num_gpus && c->gpus[g].ordinal != d->ordinal) g++;
    if (g == c->num_gpus) {
      c->gpus[g].ordinal = d->ordinal;
      pthread_mutex_init(&c->gpus[g].why_mu, NULL);
      c->num_gpus++;
    } else {
      distinct = false;
    }
    d->gpu = g;
  }
  for (int i = 0; i < n; i++) {
    cu_device *d = &c->devs[i];
    int same = 0, before = 0;
    for (int j = 0; j < n; j++)
      if (c->devs[j].ordinal == d->ordinal) {
        same++;
        if (j < i) before++;
      }
    if (same == 1) snprintf(d->name, sizeof d->name, "cuda:%d", d->ordinal);
    else snprintf(d->name, sizeof d->name, "cuda:%d/%d", d->ordinal, before);
  }

  for (int g = 0; g < c->num_gpus && rc == PD_OK; g++) rc = init_gpu(c, g, cfg, st);
  for (int i = 0; i < n && rc == PD_OK; i++) rc = init_device(c, i, st);
  /* One empty kernel per GPU: is there a kernel image for it? */
  for (int g = 0; g < c->num_gpus && rc == PD_OK; g++) {
    int i = 0;
    while (c->devs[i].gpu != g) i++;
    cudaError_t pe = cudaSetDevice(c->gpus[g].ordinal);
    if (pe == cudaSuccess) pe = dev_cuda_probe(c->devs[i].stream);
    if (pe == cudaSuccess) pe = cudaStreamSynchronize(c->devs[i].stream);
    if (pe == cudaErrorNoKernelImageForDevice || pe == cudaErrorUnsupportedPtxVersion) {
      (void)cudaGetLastError();
      rc = dev_error(st, PD_UNAVAILABLE,
                     "this build of paradev has no kernels for GPU %d (%s, compute capability "
                     "%d.%d): rebuild with CMAKE_CUDA_ARCHITECTURES including %d%d, or run with "
                     "--backend=cpu",
                     c->gpus[g].ordinal, c->gpus[g].name, c->gpus[g].cc_major, c->gpus[g].cc_minor,
                     c->gpus[g].cc_major, c->gpus[g].cc_minor);
    } else if (pe != cudaSuccess) {
      rc = dev_cuda_fail(b, i, pe, "probe kernel", st);
    }
  }
  if (rc != PD_OK) goto fail;

  if (path == DEV_CUDA_COLL_NCCL) {
#ifndef PARADEV_HAVE_NCCL
    rc = dev_error(st, PD_UNAVAILABLE, "collectives through NCCL were asked for, but this build "
                                       "has no NCCL; use the copy path (collectives = auto or copy)");
    goto fail;
#else
    if (!distinct) {
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "mesh \"%.200s\" names one GPU more than once; NCCL needs distinct GPUs "
                     "(use collectives = auto or copy)",
                     cfg->mesh ? cfg->mesh : "");
      goto fail;
    }
    c->use_nccl = true;
#endif
  } else if (path == DEV_CUDA_COLL_AUTO) {
#ifdef PARADEV_HAVE_NCCL
    c->use_nccl = distinct && n > 1;
#endif
  }
  (void)distinct; /* only NCCL builds look at it */
  if (!c->use_nccl && c->num_gpus > 1) enable_peer_pools(c);
  else c->peer_ok = true;
  rc = cu_collectives_init(c, st);
  if (rc != PD_OK) goto fail;
  *out = b;
  return PD_OK;

fail:
  cu_destroy(b);
  return rc;
}
