/* Completion fences of the CUDA backend (dev_backend.fence_record / _wait /
 * _release): an event recorded on a device's stream behind an op's work,
 * waited for by the engine's completion thread of that device, from a free
 * list per device, as TensorFlow's EventMgr does. Also cu_wait_issued, which
 * host copies use to wait for what was issued before them without
 * synchronizing the whole stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"

static void cu_fence_put(cu_backend *c, int device, cu_fence *f) {
  cu_fence_pool *p = &cu_fence_pools(c)[device];
  pthread_mutex_lock(&p->mu);
  f->next = p->free;
  p->free = f;
  pthread_mutex_unlock(&p->mu);
}

/* Records an event of `device`'s pool behind everything issued so far on
 * stream `s` (one of the device's). The calling thread must have the
 * device's GPU current (cu_bind). */
pd_code cu_event_take(cu_backend *c, int device, cudaStream_t s, cu_fence **out,
                      dev_status *st) {
  cu_fence_pool *p = &cu_fence_pools(c)[device];
  pthread_mutex_lock(&p->mu);
  cu_fence *f = p->free;
  if (f) p->free = f->next;
  pthread_mutex_unlock(&p->mu);
  if (!f) {
    f = calloc(1, sizeof *f);
    if (!f) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    cudaError_t e = cudaEventCreateWithFlags(
        &f->ev, cudaEventBlockingSync | cudaEventDisableTiming);
    if (e != cudaSuccess) {
      free(f);
      return dev_cuda_fail(&c->base, device, e,
                           "cudaEventCreateWithFlags(fence)", st);
    }
  }
  cudaError_t e = cudaEventRecord(f->ev, s);
  if (e != cudaSuccess) {
    cu_fence_put(c, device, f);
    return dev_cuda_fail(&c->base, device, e, "cudaEventRecord(fence)", st);
  }
  *out = f;
  return PD_OK;
}

/* Records a fence behind everything issued so far on `device`'s stream. */
static pd_code cu_fence_take(cu_backend *c, int device, cu_fence **out,
                             dev_status *st) {
  return cu_event_take(c, device, c->devs[device].stream, out, st);
}

/* Blocks until the work before `f` has finished; the first error the GPU hit
 * on the stream (an illegal address in a kernel) comes back here. */
static pd_code cu_fence_sync(cu_backend *c, int device, cu_fence *f,
                             dev_status *st) {
  CU_CHECK(&c->base, device, cudaEventSynchronize(f->ev), st);
  return PD_OK;
}

pd_code cu_fence_record(dev_backend *b, int device, void **fence,
                        dev_status *st) {
  cu_backend *c = cu_of(b);
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK) rc = cu_bind(c, device, st);
  cu_fence *f = NULL;
  if (rc == PD_OK) rc = cu_fence_take(c, device, &f, st);
  if (rc == PD_OK) *fence = f;
  return rc;
}

pd_code cu_fence_wait(dev_backend *b, int device, void *fence, dev_status *st) {
  cu_backend *c = cu_of(b);
  /* Once the GPU is unhealthy, its outstanding ops fail without touching the
   * lost context: their values could not be read anyway. */
  pd_code rc = cu_check_healthy(c, device, st);
  if (rc == PD_OK)
    rc = cu_bind(c, device, st); /* op_free may have bound another */
  if (rc == PD_OK) rc = cu_fence_sync(c, device, fence, st);
  return rc;
}

void cu_fence_release(dev_backend *b, int device, void *fence) {
  if (fence) cu_fence_put(cu_of(b), device, fence);
}

/* Waits for the work issued so far on `device`'s stream by this thread's
 * caller (a copy), without waiting for what other threads queue after it, as
 * cudaStreamSynchronize would. */
pd_code cu_wait_issued(cu_backend *c, int device, dev_status *st) {
  cu_fence *f = NULL;
  PD_TRY(cu_fence_take(c, device, &f, st));
  pd_code rc = cu_fence_sync(c, device, f, st);
  cu_fence_put(c, device, f);
  return rc;
}

/* Frees device i's fences (at destroy: every fence is back in the pool).
 * `ok`: the GPU's context is usable, so the events can be destroyed. */
void cu_fences_destroy(cu_backend *c, int i, bool ok) {
  cu_fence_pool *p = &cu_fence_pools(c)[i];
  while (p->free) {
    cu_fence *f = p->free;
    p->free = f->next;
    if (ok) cudaEventDestroy(f->ev);
    free(f);
  }
  pthread_mutex_destroy(&p->mu);
}
