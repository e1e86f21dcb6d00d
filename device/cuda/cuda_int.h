/* Private header of the CUDA backend (device/cuda/): what its C files and its
 * CUDA C++ kernel files share. Not for other layers (they use device/device.h and device/dev_cuda.h).
 *
 * Included from C11 (backend.c, collective.c, matmul.c, register.c) and from
 * CUDA C++ (kernels_*.cu): the part both see is plain C declarations; the
 * backend's state is visible to the C files only.
 *
 * Error handling follows NCCL's checks.h: every CUDA, cuBLAS and NCCL call is
 * wrapped in a CHECK macro that turns a failure into a pd_code and a message
 * naming the device and the call, clears a non-sticky error and marks the GPU
 * unhealthy on a sticky one (a lost context cannot run anything again). */
#ifndef PARADEV_CUDA_INT_H
#define PARADEV_CUDA_INT_H

#include <cuda_runtime_api.h>

#include "dev_backend.h"
#include "dev_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

/* Turns a failed CUDA call on mesh entry `device` (-1: none in particular)
 * into a status: RESOURCE_EXHAUSTED for out of memory, UNAVAILABLE for a
 * sticky error (the GPU is then marked unhealthy), INTERNAL otherwise. The
 * message names the device, the call (`what`) and CUDA's reason. Clears the
 * thread's last error. Returns the code. */
pd_code dev_cuda_fail(dev_backend *b, int device, cudaError_t err,
                      const char *what, dev_status *st);

/* True for the CUDA errors after which the context is unusable. */
int dev_cuda_error_is_sticky(cudaError_t err);

#define CU_CHECK(B, D, CALL, ST)                                               \
  do {                                                                         \
    cudaError_t cu_err_ = (CALL);                                              \
    if (cu_err_ != cudaSuccess)                                                \
      return dev_cuda_fail((B), (D), cu_err_, #CALL, (ST));                    \
  } while (0)

#define CU_CHECK_GOTO(B, D, CALL, ST, RC, LABEL)                               \
  do {                                                                         \
    cudaError_t cu_err_ = (CALL);                                              \
    if (cu_err_ != cudaSuccess) {                                              \
      (RC) = dev_cuda_fail((B), (D), cu_err_, #CALL, (ST));                    \
      goto LABEL;                                                              \
    }                                                                          \
  } while (0)

/* After a kernel launch (<<<...>>> reports errors through the last error). */
#define CU_CHECK_LAUNCH(CTX, WHAT, ST)                                         \
  do {                                                                         \
    cudaError_t cu_err_ = cudaGetLastError();                                  \
    if (cu_err_ != cudaSuccess)                                                \
      return dev_cuda_fail((CTX)->backend, (CTX)->device, cu_err_, (WHAT),     \
                           (ST));                                              \
  } while (0)

/* ------------------------------------------------------------------------ */
/* What kernel functions ask of the backend                                  */

/* The stream of mesh entry `device`; every kernel of that device runs on it. */
cudaStream_t dev_cuda_stream(dev_backend *b, int device);

/* The component's position in the op's device set (issue #17: DeviceId and
 * per-device random streams read it, as the CPU kernels read ctx->index);
 * the device itself where an engine gives no set (the whole mesh). */
static inline int dev_cuda_position(const dev_kernel_ctx *c) {
  return c->devset ? c->index : c->device;
}

/* Multiprocessors of the GPU under `device` (for grid sizes). */
int dev_cuda_sm_count(dev_backend *b, int device);

/* Run-time checks of ops that can fail on their data (integer division by
 * zero, an index out of range): the kernel records the first bad position in
 * a per-device word, and the kernel function reads it back (which waits for
 * the stream). Layout of the word, reset by dev_cuda_flag_arm:
 *   [0] smallest bad position (UINT64_MAX: none), for atomicMin
 *   [1] bits of failure kinds, for atomicOr
 *   [2], [3] free for the kernel (e.g. the offending value) */
#define DEV_CUDA_FLAG_WORDS 4
pd_code dev_cuda_flag_arm(dev_kernel_ctx *ctx, unsigned long long **dflag,
                          dev_status *st);
pd_code dev_cuda_flag_read(dev_kernel_ctx *ctx,
                           unsigned long long out[DEV_CUDA_FLAG_WORDS],
                           dev_status *st);

/* Stream-ordered scratch memory on ctx's device (freed with
 * dev_cuda_scratch_free, also stream-ordered, so it may be freed right after
 * the launches that use it). Counts toward the device's memory. */
pd_code dev_cuda_scratch(dev_kernel_ctx *ctx, size_t bytes, void **out,
                         dev_status *st);
void dev_cuda_scratch_free(dev_kernel_ctx *ctx, void *p, size_t bytes);

/* Registers `fn` as the CUDA kernel of `op`; aborts when no such op exists. */
void dev_cuda_register(const char *op, dev_kernel_fn fn);

/* Kernel registration of each kernel file. */
void dev_cuda_register_elementwise(void);
void dev_cuda_register_reduce(void);
void dev_cuda_register_array(void);
void dev_cuda_register_split(void); /* kernels_split.cu */
void dev_cuda_register_linalg(void);
void dev_cuda_register_fused(void);        /* kernels_fused.cu */
void dev_cuda_register_fused_matmul(void); /* fused_matmul.c */

/* ------------------------------------------------------------------------ */
/* Launchers for the backend's own use (collectives, start-up)              */

/* An empty kernel: proves the build has a kernel image for the current GPU
 * (cudaErrorNoKernelImageForDevice otherwise). */
cudaError_t dev_cuda_probe(cudaStream_t s);

/* out[i] = reduction over k < n of in[k][in_off + i], i < count, with the CPU
 * collectives' semantics (device/cpu/collective.c): float sums in the
 * dtype's compute type in input order, integer sums wrap, max/min propagate
 * NaN, mean divides (integers truncate), bool sum/max are or, prod/min and.
 * `in` is a host array of n device pointers (n <= PD_MAX_DEVICES). */
cudaError_t dev_cuda_coll_reduce(pd_dtype dt, int red, int n,
                                 const void *const *in, int64_t in_off,
                                 void *out, int64_t count, cudaStream_t s);

/* In place: data[i] /= n (integers truncate toward zero), for the mean of an
 * NCCL sum. */
cudaError_t dev_cuda_div_by(pd_dtype dt, void *data, int64_t count, int n,
                            cudaStream_t s);

/* In place: bool bytes to 0 or 1. */
cudaError_t dev_cuda_bool_normalize(void *data, int64_t count, cudaStream_t s);

#ifdef __cplusplus
}
#endif

/* ------------------------------------------------------------------------ */
/* Backend state (C files only)                                              */

#ifndef __cplusplus
#include <pthread.h>

#include "../../common/check.h"
#include <stdatomic.h>

#include <cublas_v2.h>

/* Staging slots per device for host copies: a copy of one chunk into pinned
 * memory overlaps the DMA of the previous one. */
#define CU_STAGE_SLOTS 3
#define CU_STAGE_BYTES ((size_t)4 << 20)

typedef struct cu_nccl
    cu_nccl; /* graph.c: the CUDA-graph hooks (see its opening comment for what the
 * executor must not do while a capture is open). */
pd_code cu_capture_begin(dev_backend *b, int device, dev_status *st);
pd_code cu_capture_end(dev_backend *b, int device, void **graph,
                       dev_status *st);
pd_code cu_graph_launch(dev_backend *b, int device, void *graph,
                        dev_status *st);
void cu_graph_destroy(dev_backend *b, int device, void *graph);

/* collective.c */

/* The default reserve of each GPU's free memory (dev_cuda_config). */
#define CU_RESERVE_DEFAULT ((uint64_t)512 << 20)

/* One physical GPU (several mesh entries may share it). */
typedef struct cu_gpu {
  int ordinal;
  int sm_count;
  int cc_major, cc_minor;
  uint64_t total_mem;
  uint64_t free_at_start; /* cudaMemGetInfo once the mesh is set up */
  int entries;            /* mesh entries on this GPU */
  char name[96];
  cudaMemPool_t pool;
  bool pool_created;
  atomic_bool unhealthy;
  pthread_mutex_t why_mu;
  char why[256]; /* the sticky error, once unhealthy */
} cu_gpu;

/* One mesh entry. */
typedef struct cu_device {
  int gpu; /* index into cu_backend.gpus */
  int ordinal;
  cudaStream_t stream;
  /* Reads of this entry's buffers for staged copies to another GPU
   * (copy_d2d without peer access): not behind the stream's later work. */
  cudaStream_t copy_stream;
  cublasHandle_t cublas;
  /* Phase events of the copy-path collectives (see collective.c). */
  cudaEvent_t coll_ev[3];
  /* Host copies: pinned slots, allocated at first use. */
  pthread_mutex_t stage_mu;
  void *stage[CU_STAGE_SLOTS];
  cudaEvent_t stage_ev[CU_STAGE_SLOTS];
  /* Run-time check word (DEV_CUDA_FLAG_WORDS) on the device and its pinned
   * host copy. */
  unsigned long long *dflag;
  unsigned long long *hflag;
  _Atomic uint64_t in_use, peak, allocs;
  /* Bytes this entry may hold: dev_cuda_config.memory_limit, or by default
   * its share of the GPU's free memory at start less the reserve. */
  uint64_t limit;
  char name[32];
} cu_device;

typedef struct cu_backend {
  dev_backend base;
  bool allow_tf32;
  uint64_t memory_limit;
  int coll_timeout_ms;
  bool use_nccl;      /* collectives through NCCL (else the copy path) */
  bool peer_ok;       /* copy path across GPUs: every pool is mapped to all */
  char peer_why[200]; /* why not, when !peer_ok */
  /* peer_copy[g][h]: GPU g (index into gpus) reads GPU h's memory directly
   * (peer access enabled and h's pool mapped for g at start); copy_d2d
   * otherwise stages through pinned host memory. */
  bool peer_copy[PD_MAX_DEVICES][PD_MAX_DEVICES];
  cu_nccl *nccl;
  int num_gpus;
  cu_gpu gpus[PD_MAX_DEVICES];
  cu_device devs[];
} cu_backend;

static inline cu_backend *cu_of(dev_backend *b) { return (cu_backend *)b; }

/* Makes `device`'s GPU current on the calling thread. */
pd_code cu_bind(cu_backend *c, int device, dev_status *st);

/* UNAVAILABLE naming the device and its sticky error when it is unhealthy. */
pd_code cu_check_healthy(cu_backend *c, int device, dev_status *st);

#define CUBLAS_CHECK_GOTO(B, D, CALL, ST, RC, LABEL)                           \
  do {                                                                         \
    cublasStatus_t cb_s_ = (CALL);                                             \
    if (cb_s_ != CUBLAS_STATUS_SUCCESS) {                                      \
      (RC) = cu_cublas_fail((B), (D), cb_s_, #CALL, (ST));                     \
      goto LABEL;                                                              \
    }                                                                          \
  } while (0)

/* A failed cuBLAS call as a status (RESOURCE_EXHAUSTED for out of memory). */
pd_code cu_cublas_fail(dev_backend *b, int device, cublasStatus_t s,
                       const char *what, dev_status *st);

/* --- fence.c -------------------------------------------------------------- */

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

static inline cu_fence_pool *cu_fence_pools(cu_backend *c) {
  return (cu_fence_pool *)(void *)&c->devs[c->base.num_devices];
}

pd_code cu_fence_record(dev_backend *b, int device, void **fence,
                        dev_status *st);
pd_code cu_fence_wait(dev_backend *b, int device, void *fence, dev_status *st);
void cu_fence_release(dev_backend *b, int device, void *fence);
/* An event of `device`'s fence pool recorded on stream `s` of that device
 * (its own stream or its copy stream), its GPU current; give it back with
 * cu_fence_release once waits on it are issued (a wait keeps the record
 * current when it was made). */
pd_code cu_event_take(cu_backend *c, int device, cudaStream_t s, cu_fence **out,
                      dev_status *st);
/* Waits for everything issued so far on `device`'s stream (an event, not a
 * stream synchronization). */
pd_code cu_wait_issued(cu_backend *c, int device, dev_status *st);
/* Frees device i's fence list (ok: its GPU can still be used). */
void cu_fences_destroy(cu_backend *c, int i, bool ok);

/* --- memory.c ------------------------------------------------------------- */

pd_code cu_allocate(dev_backend *b, int device, size_t bytes, void **out,
                    dev_status *st);
void cu_deallocate(dev_backend *b, int device, void *ptr, size_t bytes);
pd_code cu_memory_stats(dev_backend *b, int device, dev_memory_stats *out,
                        dev_status *st);
pd_code cu_copy_h2d(dev_backend *b, int device, void *dst, const void *src,
                    size_t bytes, dev_status *st);
pd_code cu_copy_d2h(dev_backend *b, int device, void *dst, const void *src,
                    size_t bytes, dev_status *st);
pd_code cu_copy_d2d(dev_backend *b, int dst_device, void *dst, int src_device,
                    const void *src, size_t bytes, dev_status *st);
pd_code cu_host_register(dev_backend *b, void *ptr, size_t bytes,
                         dev_status *st);
void cu_host_unregister(dev_backend *b, void *ptr);

/* collective.c */
pd_code cu_collectives_init(cu_backend *c, dev_status *st);
void cu_collectives_destroy(cu_backend *c);
void *cu_collective_create(dev_backend *b, dev_collective_kind kind,
                           const struct dev_devset *set);
pd_code cu_collective_run(dev_backend *b, dev_kernel_ctx *ctx,
                          const dev_status *failed, dev_status *st);
void cu_collective_release(dev_backend *b, void *coll);
#endif /* !__cplusplus */

#endif /* PARADEV_CUDA_INT_H */
