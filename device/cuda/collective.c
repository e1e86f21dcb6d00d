/* Collectives of the CUDA backend: AllReduce, Broadcast, AllGather and
 * ReduceScatter, with the semantics of device/ops/collective.c. This file
 * holds the entry points; the host meeting is in coll_common.c, the two
 * paths in coll_nccl.c and coll_copy.c (shared header coll_int.h).
 *
 * Every device's executor reaches a collective in the same global order and
 * calls cu_collective_run. The devices first meet on the host (as the CPU
 * backend's do), so a device whose inputs failed makes every peer fail at
 * once, naming it, instead of leaving a peer inside a kernel that waits.
 * Then one of two paths runs, chosen when the backend is created:
 *
 * A collective runs over its op's device set (issue #17): set->n devices,
 * rank r being engine device set->dev[r] (dev_kernel_ctx.index); the whole
 * mesh is the set [0..n-1]. Only the set's devices call it.
 *
 * NCCL, when every mesh entry is a distinct GPU. One communicator per rank
 * of each distinct device set, from a cache keyed by the set (coll_nccl.c:
 * at most CU_COMM_CACHE_MAX sets; the least recently used one that no
 * collective holds is destroyed to make room). A set's communicators are
 * built non-blocking by a background thread started when collective_create
 * first sees the set (the whole mesh's right after start-up), so neither the
 * daemon's start nor the submitting thread waits for NCCL; the last device
 * to reach the collective's host meeting waits for them, bounded by the
 * collective timeout, and a creation that failed or timed out fails the op
 * on every device with NCCL's reason (the next collective on the set tries
 * again). Each
 * device issues its rank's calls inside ncclGroupStart/End on its stream,
 * then waits for them with a deadline, polling the communicator's
 * asynchronous error. On an NCCL error or a timeout the communicator is
 * aborted (ncclCommAbort also stops kernels that wait on a peer), the op
 * fails on every device with a message naming the device and NCCL's error,
 * and a new communicator is built in the background for the next one. A
 * device that fails before or after issuing its part records it at once, and
 * peers still waiting for NCCL abort instead of running into the deadline.
 * One thread per rank, each on its own communicator, is NCCL's "one device
 * per thread" model (NCCL user guide, Thread Safety: no communicator is used
 * by two threads at once; the abort takes the others' read lock first).
 * Reductions where NCCL's arithmetic differs from the CPU's (float max/min
 * drop NaN, 8- and 32-bit integer means wrap) gather the inputs with NCCL
 * and reduce them with this backend's kernel (nccl_matches_cpu).
 *
 * Copy path, when entries share a GPU (NCCL refuses one GPU twice in a
 * communicator), or when NCCL is not built in; the same for any subset. Devices read their peers'
 * buffers directly with CUDA kernels and copies on their own streams; events
 * order the streams:
 *   ev[0] "inputs ready"   recorded by each device before the first meeting;
 *                          every device's stream waits for all of them.
 *   ev[1] "reduced part"   (AllReduce) after each device has reduced its
 *                          1/n of the elements from all inputs (a
 *                          reduce-scatter); the others copy it from there
 *                          (an all-gather).
 *   ev[2] "done reading"   after each device's last read of a peer buffer;
 *                          every stream waits for all of them, so no buffer
 *                          is freed or reused (stream-ordered frees) while a
 *                          peer still reads it.
 * Each device has one event per phase, reused by every collective: a device
 * records phase k again only after the host meeting that follows its peers'
 * waits on the previous record (cudaStreamWaitEvent waits for the record
 * that was current when it was called; later records do not affect it). With
 * subsets, a device may go on to a collective that a peer of the previous
 * one is not in and record ev[2] again before that peer's wait on it: the
 * peer then waits for a later point of the device's stream, which only
 * waits longer (every wait is on work already issued, so no cycle).
 * Copies between entries on distinct GPUs are peer copies (cu_copy_rows).
 *
 * Attributes read here (positions fixed by device/ops/collective.c):
 *   AllReduce, ReduceScatter: attrs[0] "reduction"; Broadcast: attrs[0]
 *   "root"; AllGather: attrs[0] "axis". */
#include <stdlib.h>
#include <string.h>

#include "coll_int.h"

/* ------------------------------------------------------------------------ */
/* Entry points                                                              */

/* The shared state of one collective (created per op at submission), over
 * the op's device set: rank r is engine device set->dev[r]; on the NCCL
 * path it takes a reference on the set's communicators, whose building
 * starts then, in the background, when the set is new. */
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

pd_code cu_collective_run(dev_backend *b, dev_kernel_ctx *ctx,
                          const dev_status *failed, dev_status *st) {
  cu_backend *c = cu_of(b);
  cu_coll *k = ctx->collective;
  const int d = ctx->device, r = cu_coll_rank(k, ctx);
  dev_status lst = DEV_STATUS_INIT;
  if (r < 0) /* it cannot meet peers it does not belong with */
    return dev_error(st, PD_INTERNAL,
                     "%s on %s: the device is not in the collective's set "
                     "of %d devices (an engine bug)",
                     ctx->op->name, b->device_name(b, d), k->n);
  /* A device that cannot run says so at the meeting, like a failed input. */
  if (!failed && cu_check_healthy(c, d, &lst) != PD_OK) failed = &lst;
  if (!failed && cu_bind(c, d, &lst) != PD_OK) failed = &lst;
  if (!failed && !c->use_nccl) {
    cudaError_t e = cudaEventRecord(c->devs[d].coll_ev[0], c->devs[d].stream);
    if (e != cudaSuccess) {
      dev_cuda_fail(b, d, e, "cudaEventRecord(inputs ready)", &lst);
      failed = &lst;
    }
  }
  pthread_mutex_lock(&k->mu);
  k->in[r] = ctx->num_inputs > 0 ? ctx->in_data[0] : NULL;
  k->out[r] = ctx->num_outputs > 0 ? ctx->out_data[0] : NULL;
  if (ctx->num_inputs > 0) k->in_shape[r] = ctx->in_shape[0];
  if (failed && (!k->failed || d < k->fail_device)) {
    k->failed = true;
    k->fail_device = d;
    k->fail_st = *failed;
  }
  pthread_mutex_unlock(&k->mu);

#ifdef PARADEV_HAVE_NCCL
  cu_coll_meet(k, c->use_nccl ? cu_nccl_decide : NULL, c);
#else
  cu_coll_meet(k, NULL, NULL);
#endif
  if (k->failed) {
    if (k->fail_device == d)
      return dev_error(st, k->fail_st.code, "%s", k->fail_st.msg);
    return dev_error(st, k->fail_st.code, "%s: cancelled because %s failed: %s",
                     ctx->op->name, b->device_name(b, k->fail_device),
                     k->fail_st.msg);
  }
  if (!c->use_nccl) {
    if (!c->peer_ok)
      return dev_error(st, PD_FAILED_PRECONDITION, "%s: %s", ctx->op->name,
                       c->peer_why);
    return cu_copy_run(c, k, ctx, st);
  }
#ifdef PARADEV_HAVE_NCCL
  if (!k->comm_ok)
    return dev_error(st, k->comm_st.code, "%s on %s: %s", ctx->op->name,
                     b->device_name(b, d), k->comm_st.msg);
  pd_code rc = cu_nccl_run(c, k, ctx, &lst);
  if (rc != PD_OK) cu_coll_run_failed(k, d, &lst);
  cu_coll_meet(k, NULL, NULL); /* the same result on every device */
  return cu_coll_run_result(b, k, ctx, st);
#else
  return dev_error(st, PD_INTERNAL, "%s: NCCL is not built in", ctx->op->name);
#endif
}

pd_code cu_collectives_init(cu_backend *c, dev_status *st) {
#ifdef PARADEV_HAVE_NCCL
  if (c->use_nccl) return cu_nccl_init(c, st);
#endif
  return PD_OK;
}

void cu_collectives_destroy(cu_backend *c) {
#ifdef PARADEV_HAVE_NCCL
  if (c->nccl) cu_nccl_destroy(c);
#else
  (void)c;
#endif
}

int dev_cuda_comm_stats(dev_backend *b, dev_cuda_comm_info *out, int max) {
  if (!b || b->kind != DEV_BACKEND_CUDA || strcmp(b->name, "cuda") != 0)
    return 0;
#ifdef PARADEV_HAVE_NCCL
  return cu_nccl_stats(cu_of(b), out, max);
#else
  (void)out;
  (void)max;
  return 0;
#endif
}
