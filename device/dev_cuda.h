/* CUDA-only options: the CUDA backend's configuration and constructor (device/cuda/;
 * built when CMake's PARADEV_CUDA is on, which defines PARADEV_HAVE_CUDA for
 * users of this library). A daemon reaches the CUDA backend through
 * dev_engine_create and dev_engine_config's cuda_* fields (device.h); this
 * header is for those who build a CUDA backend themselves (tests/gpu, the
 * engine). The collective path, dev_cuda_collectives, is in device.h, beside
 * dev_engine_config.
 */
#ifndef PARADEV_DEV_CUDA_H
#define PARADEV_DEV_CUDA_H

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Configuration of the CUDA backend; starts with struct_size (use
 * DEV_CUDA_CONFIG_INITIALIZER, then set fields by name). */
typedef struct dev_cuda_config {
  size_t struct_size;
  /* The mesh: comma-separated entries "cuda:N" (N an ordinal among the GPUs
   * CUDA_VISIBLE_DEVICES leaves visible), or "cuda:all" alone. An ordinal may
   * repeat: each entry is one device of the mesh (a logical device with its
   * own stream and memory accounting), so "cuda:0,cuda:0" is a mesh of two on
   * one GPU, as TensorFlow's virtual GPUs. NULL or "": "cuda:all". */
  const char *mesh;
  /* float32 MatMul/BatchMatMul may use TF32 tensor cores (10-bit mantissa
   * inputs). Default false: float32 products are exact float32. */
  bool allow_tf32;
  /* Bytes each GPU's memory pool keeps cached across synchronizations
   * (cudaMemPoolAttrReleaseThreshold). Default UINT64_MAX: keep everything. */
  uint64_t pool_release_threshold;
  /* Per mesh entry limit in bytes; 0: the default, the GPU's free memory at
   * start less memory_reserve, split among the entries on that GPU. */
  uint64_t memory_limit;
  /* A collective that has not completed after this many milliseconds fails,
   * and the NCCL communicator is aborted and rebuilt. 0: 300000 (5 min). */
  int collective_timeout_ms;
  dev_cuda_collectives collectives;
  /* Bytes of each GPU's free memory kept back from the default limits (for
   * cuBLAS workspaces, NCCL buffers, other processes);
   * DEV_MEMORY_RESERVE_DEFAULT (dev_backend.h): 512 MiB. */
  uint64_t memory_reserve;
} dev_cuda_config;

#define DEV_CUDA_CONFIG_INITIALIZER                                            \
  {                                                                            \
    sizeof(dev_cuda_config), NULL, false, UINT64_MAX, 0, 0,                    \
        DEV_CUDA_COLL_AUTO, UINT64_MAX                                         \
  }

/* Creates the CUDA backend: one device per mesh entry, each with its own
 * stream; memory from a stream-ordered pool per GPU (cudaMallocAsync); host
 * copies through pinned staging buffers; cuBLAS for matrix products; NCCL or
 * copy-and-reduce kernels for collectives (NCCL's communicator is created in
 * the background, so this returns quickly). Registers the CUDA kernels once.
 *
 * Errors: INVALID_ARGUMENT (malformed mesh, ordinal out of range, more than
 * PD_MAX_DEVICES entries, NCCL asked for a mesh that repeats a GPU);
 * UNAVAILABLE when no GPU can be used ("no CUDA GPU found (cudaGetDeviceCount:
 * <CUDA's reason>); run with --backend=cpu"), or when the build has no kernel
 * image for the GPU. Never crashes on a machine without a GPU or driver.
 * Thread safety: the backend's functions follow dev_backend's rules.
 * Defined only when PARADEV_HAVE_CUDA is; otherwise dev_engine_create with
 * backend "cuda" reports UNAVAILABLE. */
pd_code dev_cuda_backend_create(const dev_cuda_config *cfg, dev_backend **out,
                                dev_status *st);

/* One device set's NCCL communicators in a CUDA backend's cache (issue #17;
 * see dev_cuda_comm_stats). */
typedef struct dev_cuda_comm_info {
  dev_devset set;  /* the engine devices, rank order */
  int state;       /* 0: being built, 1: ready, 2: the last build failed */
  double build_ms; /* the last finished build (ncclGetUniqueId to every
                    * rank's communicator ready), milliseconds; -1: none */
  int builds;      /* builds started (the first, and one after each abort or
                   * failure) */
  int refs;        /* collectives holding it (+1 for the whole mesh's) */
} dev_cuda_comm_info;

/* The NCCL communicator cache of CUDA backend `b` (benchmarks, tests): at
 * most `max` entries into out[], most recently used set first; returns how
 * many sets the cache holds (it keeps at most 16 not held by a collective).
 * 0 for a backend on the copy path, built without NCCL, or not CUDA's.
 * Thread-safe. */
int dev_cuda_comm_stats(dev_backend *b, dev_cuda_comm_info *out, int max);

/* Registers the CUDA kernels of every built-in op (pthread_once; called by
 * dev_cuda_backend_create). Needs no GPU, so tests call it to check that
 * every name it registers is an op. Aborts on a name the registry does not
 * know (a programming error, as dev__register_or_die). */
void dev_register_cuda_kernels(void);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_DEV_CUDA_H */
