/* What every part of the CUDA backend asks of one mesh entry: turning a
 * failed CUDA or cuBLAS call into a status (and marking the GPU unhealthy on
 * a sticky error), the health check, making the entry's GPU current, and the
 * services kernel functions use (the entry's stream, its multiprocessor
 * count, the run-time check word, stream-ordered scratch memory) and the
 * registration of one kernel. Calls nothing else of device/cuda/. */
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
    case cudaErrorContained: /* driver_types.h: "leaves the process in an */
    case cudaErrorTensorMemoryLeak: /* inconsistent state", as the ones above */
    case cudaErrorUnknown: return 1;
    default: return 0;
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

pd_code dev_cuda_fail(dev_backend *b, int device, cudaError_t err,
                      const char *what, dev_status *st) {
  (void)cudaGetLastError(); /* clears the thread's error unless it is sticky */
  char fn[64];
  call_name(what, fn, sizeof fn);
  const char *dn = b && device >= 0 ? b->device_name(b, device) : "cuda";
  if (err == cudaErrorMemoryAllocation)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: %s: out of GPU memory (%s)", dn, fn,
                     cudaGetErrorName(err));
  if (dev_cuda_error_is_sticky(err)) {
    char why[200];
    snprintf(why, sizeof why, "%s: %s (%s)", fn, cudaGetErrorString(err),
             cudaGetErrorName(err));
    if (b && device >= 0)
      mark_unhealthy(cu_of(b), cu_of(b)->devs[device].gpu, why);
    return dev_error(
        st, PD_UNAVAILABLE,
        "%s: %s; the GPU's CUDA context is lost, so the device is marked "
        "unhealthy and fails every later op (restart the daemon to recover)",
        dn, why);
  }
  return dev_error(st, PD_INTERNAL, "%s: %s failed: %s (%s)", dn, fn,
                   cudaGetErrorString(err), cudaGetErrorName(err));
}

pd_code cu_cublas_fail(dev_backend *b, int device, cublasStatus_t s,
                       const char *what, dev_status *st) {
  char fn[64];
  call_name(what, fn, sizeof fn);
  const char *dn = b->device_name(b, device);
  if (s == CUBLAS_STATUS_ALLOC_FAILED)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: %s: out of GPU memory (%s)", dn, fn,
                     cublasGetStatusName(s));
  return dev_error(st, PD_INTERNAL, "%s: %s failed: %s (%s)", dn, fn,
                   cublasGetStatusString(s), cublasGetStatusName(s));
}

pd_code cu_check_healthy(cu_backend *c, int device, dev_status *st) {
  cu_gpu *g = &c->gpus[c->devs[device].gpu];
  if (!atomic_load(&g->unhealthy)) return PD_OK;
  pthread_mutex_lock(&g->why_mu);
  pd_code rc = dev_error(
      st, PD_UNAVAILABLE,
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

cudaStream_t dev_cuda_stream(dev_backend *b, int device) {
  return cu_of(b)->devs[device].stream;
}

int dev_cuda_sm_count(dev_backend *b, int device) {
  cu_backend *c = cu_of(b);
  return c->gpus[c->devs[device].gpu].sm_count;
}

pd_code dev_cuda_flag_arm(dev_kernel_ctx *ctx, unsigned long long **dflag,
                          dev_status *st) {
  cu_device *d = &cu_of(ctx->backend)->devs[ctx->device];
  /* No other op uses the word now: ops that arm it read it back (and so wait
   * for the stream) before they return. */
  d->hflag[0] = UINT64_MAX;
  d->hflag[1] = d->hflag[2] = d->hflag[3] = 0;
  CU_CHECK(ctx->backend, ctx->device,
           cudaMemcpyAsync(d->dflag, d->hflag,
                           DEV_CUDA_FLAG_WORDS * sizeof *d->dflag,
                           cudaMemcpyHostToDevice, d->stream),
           st);
  *dflag = d->dflag;
  return PD_OK;
}

pd_code dev_cuda_flag_read(dev_kernel_ctx *ctx,
                           unsigned long long out[DEV_CUDA_FLAG_WORDS],
                           dev_status *st) {
  cu_device *d = &cu_of(ctx->backend)->devs[ctx->device];
  CU_CHECK(ctx->backend, ctx->device,
           cudaMemcpyAsync(d->hflag, d->dflag,
                           DEV_CUDA_FLAG_WORDS * sizeof *d->dflag,
                           cudaMemcpyDeviceToHost, d->stream),
           st);
  CU_CHECK(ctx->backend, ctx->device, cudaStreamSynchronize(d->stream), st);
  memcpy(out, d->hflag, DEV_CUDA_FLAG_WORDS * sizeof *out);
  return PD_OK;
}

pd_code dev_cuda_scratch(dev_kernel_ctx *ctx, size_t bytes, void **out,
                         dev_status *st) {
  return ctx->backend->allocate(ctx->backend, ctx->device, bytes, out, st);
}

void dev_cuda_scratch_free(dev_kernel_ctx *ctx, void *p, size_t bytes) {
  ctx->backend->deallocate(ctx->backend, ctx->device, p, bytes);
}

void dev_cuda_register(const char *op, dev_kernel_fn fn) {
  dev_status st = DEV_STATUS_INIT;
  if (dev_kernel_register(DEV_BACKEND_CUDA, op, fn, &st) != PD_OK) {
    fprintf(stderr, "paradev: CUDA kernel registration failed: %s\n", st.msg);
    abort();
  }
}
