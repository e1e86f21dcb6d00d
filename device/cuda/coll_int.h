/* Private header of the CUDA backend's collectives (collective.c: entry
 * points; coll_common.c: the host meeting of one collective; coll_nccl.c:
 * the NCCL path; coll_copy.c: the copy path). See collective.c's opening
 * comment for how the paths work. C files only. collective.c calls the two
 * paths, which call coll_common.c; nothing calls back up. */
#ifndef PARADEV_CUDA_COLL_INT_H
#define PARADEV_CUDA_COLL_INT_H

#include "cuda_int.h"

typedef struct cu_comm cu_comm; /* coll_nccl.c: one set's communicators */

/* The shared state of one collective across the devices of its set
 * (collective_create). Everything per device is indexed by rank: the
 * device's position in `set` (dev_kernel_ctx.index); rank r is engine device
 * set.dev[r]. */
typedef struct cu_coll {
  dev_collective_kind kind;
  int n; /* set.n */
  dev_devset set;
  /* NCCL path: the set's communicators (a reference on the cache entry,
   * taken at create, so the entry is not evicted while this op lives). */
  cu_comm *comm;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned generation;
  /* A device whose inputs failed (before anything ran); fail_device and
   * run_device are engine devices. */
  bool failed;
  int fail_device;
  dev_status fail_st;
  /* A device that failed while running its part. */
  bool run_failed;
  int run_device;
  dev_status run_st;
  const void *in[PD_MAX_DEVICES]; /* by rank */
  void *out[PD_MAX_DEVICES];
  dev_shape in_shape[PD_MAX_DEVICES];
  /* NCCL path: decided once, by the last device to arrive. */
  bool comm_ok;
  uint64_t comm_gen;
  dev_status comm_st;
} cu_coll;

/* Waits until all n devices have arrived. The last one runs `last(arg)`
 * first, under the lock, before it releases the others. */
void cu_coll_meet(cu_coll *c, void (*last)(cu_coll *, void *), void *arg);

/* Records device d's failure while running (the first one wins). */
void cu_coll_run_failed(cu_coll *c, int d, const dev_status *st);

/* The collective's result on device d once everyone has met after running:
 * OK, the device's own error, or the error of the device that failed. */
pd_code cu_coll_run_result(dev_backend *b, cu_coll *c, dev_kernel_ctx *ctx,
                           dev_status *st);

/* The rank of ctx's device in collective k: its position in k's set, the
 * op's set given to collective_create (so it equals dev_kernel_ctx.index
 * under the placement contract, and is right also where an engine leaves
 * index unset); -1 when the device is not in it. */
static inline int cu_coll_rank(const cu_coll *k, const dev_kernel_ctx *ctx) {
  return dev_devset_index(&k->set, ctx->device);
}

/* The engine device of rank r. */
static inline int cu_coll_dev(const cu_coll *k, int r) { return k->set.dev[r]; }

static inline int64_t cu_coll_elems(const dev_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return n;
}

static inline int cu_coll_reduction(const dev_kernel_ctx *ctx) {
  return dev_reduction_from_name(ctx->attrs[0].u.s.ptr, ctx->attrs[0].u.s.len);
}

/* True once a peer has recorded a failure while running its part. */
static inline bool cu_coll_peer_failed(cu_coll *c) {
  pthread_mutex_lock(&c->mu);
  bool f = c->run_failed;
  pthread_mutex_unlock(&c->mu);
  return f;
}

/* Copies `height` rows of `width` bytes, `spitch` apart at src on mesh entry
 * sd's GPU, to rows `dpitch` apart at dst on entry dd's GPU, on stream s.
 *  - Across GPUs it takes the peer copies (cudaMemcpyPeerAsync,
 *    cudaMemcpy3DPeerAsync), which work on stream-ordered allocations of
 *    another GPU whether or not its pool is mapped there; a plain
 *    cudaMemcpyAsync of such memory from another device fails.
 *  - 2D and 3D copies refuse pitches beyond the device's maximum (memPitch,
 *    2^31 - 1 bytes: cudaErrorInvalidPitchValue), so a contiguous block is
 *    one 1D copy and wider rows go one by one. */
cudaError_t cu_copy_rows(cu_backend *c, int dd, void *dst, size_t dpitch,
                         int sd, const void *src, size_t spitch, size_t width,
                         size_t height, cudaStream_t s);

/* The NCCL path (coll_nccl.c, built with PARADEV_HAVE_NCCL): the cache of
 * communicators per device set, the decision the last device to arrive takes
 * for everyone (is the set's communicator ready?), one device's part, and
 * the cache's lifetime.
 * cu_nccl_acquire: the set's cache entry with a reference taken, created
 *   (its communicators built by a background thread, started now) when the
 *   set has none; NULL only when the host is out of memory. Never blocks on
 *   NCCL. Any thread (collective_create runs at submission).
 * cu_nccl_release: drops that reference (any thread, never blocks on NCCL:
 *   an evicted entry is destroyed by the next entry's builder thread, or at
 *   cu_nccl_destroy). */
cu_comm *cu_nccl_acquire(cu_backend *c, const dev_devset *set);
void cu_nccl_release(cu_backend *c, cu_comm *m);
void cu_nccl_decide(cu_coll *k, void *arg);
/* dev_cuda_comm_stats's answer. */
int cu_nccl_stats(cu_backend *c, dev_cuda_comm_info *out, int max);
pd_code cu_nccl_run(cu_backend *c, cu_coll *k, dev_kernel_ctx *ctx,
                    dev_status *st);
pd_code cu_nccl_init(cu_backend *c, dev_status *st);
void cu_nccl_destroy(cu_backend *c);

/* The copy path (coll_copy.c): one device's part. */
pd_code cu_copy_run(cu_backend *c, cu_coll *k, dev_kernel_ctx *ctx,
                    dev_status *st);

#endif /* PARADEV_CUDA_COLL_INT_H */
