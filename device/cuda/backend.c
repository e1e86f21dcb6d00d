/* The CUDA backend: one device per mesh entry, each with its own stream.
 * This file holds the backend's table (dev_backend), parsing the mesh and
 * creating and destroying the backend; device.c errors, health and kernel
 * services, memory.c memory and copies, fence.c completion fences,
 * collective.c the collectives, register.c and kernels_*.cu the kernels.
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
/* Execution                                                                 */

static pd_code cu_run_kernel(dev_backend *b, dev_kernel_fn fn,
                             dev_kernel_ctx *ctx, dev_status *st) {
  cu_backend *c = cu_of(b);
  pd_code rc = cu_check_healthy(c, ctx->device, st);
  if (rc == PD_OK) rc = cu_bind(c, ctx->device, st);
  if (rc != PD_OK) return rc;
  rc = fn(ctx, st);
  if (rc == PD_OK) {
    cudaError_t e =
        cudaGetLastError(); /* a launch the kernel forgot to check */
    if (e != cudaSuccess)
      rc = dev_cuda_fail(b, ctx->device, e, "kernel launch", st);
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
  return device >= 0 && device < b->num_devices ? cu_of(b)->devs[device].name
                                                : "cuda:?";
}

/* dev_backend.device_gpu: the CUDA ordinal of mesh entry `device`, as this
 * process numbers its GPUs, i.e. after CUDA_VISIBLE_DEVICES (with
 * CUDA_VISIBLE_DEVICES=2,3, cuda:0 is the node's GPU 2 and answers 0; the
 * daemon maps SLURM_JOB_GPUS to devices by it, which agree when the daemon
 * sees the node's GPUs unmasked). Logical devices on one GPU share it; -1
 * for an index outside the mesh. Any thread. */
static int cu_device_gpu(dev_backend *b, int device) {
  if (device < 0 || device >= b->num_devices) return -1;
  return cu_of(b)->devs[device].ordinal;
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
    bool ok = !atomic_load(&c->gpus[d->gpu].unhealthy) &&
              cudaSetDevice(d->ordinal) == cudaSuccess;
    if (ok && d->stream) (void)cudaStreamSynchronize(d->stream);
    if (ok) {
      if (d->cublas) cublasDestroy(d->cublas);
      for (int k = 0; k < 3; k++)
        if (d->coll_ev[k]) cudaEventDestroy(d->coll_ev[k]);
      for (int k = 0; k < CU_STAGE_SLOTS; k++)
        if (d->stage_ev[k]) cudaEventDestroy(d->stage_ev[k]);
      if (d->dflag) cudaFree(d->dflag);
      if (d->copy_stream) (void)cudaStreamSynchronize(d->copy_stream);
      if (d->copy_stream) cudaStreamDestroy(d->copy_stream);
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
    const char *want =
        "expected cuda:N or cuda:all (as in \"cuda:0,cuda:1\" or \"cuda:all\")";
    if (tlen < 6 || strncmp(p, "cuda:", 5) != 0)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "mesh \"%.200s\": entry %d \"%.*s\" is not a CUDA device; %s", spec,
          entry, (int)(tlen > 64 ? 64 : tlen), p, want);
    if (tlen == 8 && strncmp(p + 5, "all", 3) == 0) {
      if (entry != 0 || p[len] == ',')
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "mesh \"%.200s\": cuda:all must be the only entry",
                         spec);
      m->all = true;
      return PD_OK;
    }
    long v = 0;
    for (size_t i = 5; i < tlen; i++) {
      if (p[i] < '0' || p[i] > '9' || v > 100000)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "mesh \"%.200s\": entry %d \"%.*s\": %s", spec, entry,
                         (int)(tlen > 64 ? 64 : tlen), p, want);
      v = v * 10 + (p[i] - '0');
    }
    if (m->n == PD_MAX_DEVICES)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "mesh \"%.200s\" has more than %d entries", spec,
                       PD_MAX_DEVICES);
    m->ordinal[m->n++] = (int)v;
    if (p[len] != ',') return PD_OK;
    p += len + 1;
  }
}

static pd_code init_gpu(cu_backend *c, int gi, const dev_cuda_config *cfg,
                        dev_status *st) {
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
  CU_CHECK(b, -1,
           cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported,
                                  g->ordinal),
           st);
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
  CU_CHECK(
      b, -1,
      cudaMemPoolSetAttribute(g->pool, cudaMemPoolAttrReleaseThreshold, &thr),
      st);
  return PD_OK;
}

static pd_code init_device(cu_backend *c, int i, dev_status *st) {
  cu_device *d = &c->devs[i];
  dev_backend *b = &c->base;
  pd_code rc = PD_OK;
  CU_CHECK(b, i, cudaSetDevice(d->ordinal), st);
  CU_CHECK(b, i, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking),
           st);
  CU_CHECK(b, i,
           cudaStreamCreateWithFlags(&d->copy_stream, cudaStreamNonBlocking),
           st);
  for (int k = 0; k < 3; k++)
    CU_CHECK(b, i,
             cudaEventCreateWithFlags(&d->coll_ev[k], cudaEventDisableTiming),
             st);
  for (int k = 0; k < CU_STAGE_SLOTS; k++)
    CU_CHECK(b, i,
             cudaEventCreateWithFlags(&d->stage_ev[k], cudaEventDisableTiming),
             st);
  CU_CHECK(
      b, i,
      cudaMalloc((void **)&d->dflag, DEV_CUDA_FLAG_WORDS * sizeof *d->dflag),
      st);
  CU_CHECK(
      b, i,
      cudaHostAlloc((void **)&d->hflag, DEV_CUDA_FLAG_WORDS * sizeof *d->hflag,
                    cudaHostAllocPortable),
      st);
  CUBLAS_CHECK_GOTO(b, i, cublasCreate(&d->cublas), st, rc, out);
  CUBLAS_CHECK_GOTO(b, i, cublasSetStream(d->cublas, d->stream), st, rc, out);
  /* Products follow the compute type each call asks for (exact float32
   * unless the backend allows TF32); no implicit tensor-op downcasts. */
  CUBLAS_CHECK_GOTO(b, i, cublasSetMathMode(d->cublas, CUBLAS_DEFAULT_MATH), st,
                    rc, out);
out:
  return rc;
}

/* Peer access between the mesh's GPUs, once at start: for each ordered pair
 * (g reads h) that cudaDeviceCanAccessPeer allows, peer access from g's
 * context to h (cudaDeviceEnablePeerAccess, for memory outside the pools)
 * and h's pool mapped for g (cudaMemPoolSetAccess: stream-ordered
 * allocations are reachable only through their pool's access list); then
 * c->peer_copy[g][h]. The copy path's kernels read peers' buffers, so it
 * needs every pair (c->peer_ok, and why not in c->peer_why); copy_d2d
 * stages through host memory where a pair has none, and everywhere with
 * PARADEV_CUDA_STAGED_COPIES=1 in the environment (a test knob: the staged
 * path on a machine whose GPUs do have peer access). */
static void enable_peers(cu_backend *c) {
  const char *knob = getenv("PARADEV_CUDA_STAGED_COPIES");
  const bool staged = knob && !strcmp(knob, "1");
  c->peer_ok = true;
  for (int g = 0; g < c->num_gpus; g++)
    for (int h = 0; h < c->num_gpus; h++) {
      if (g == h) continue;
      const int og = c->gpus[g].ordinal, oh = c->gpus[h].ordinal;
      int can = 0;
      cudaError_t e = cudaDeviceCanAccessPeer(&can, og, oh);
      if (e == cudaSuccess && !can) e = cudaErrorPeerAccessUnsupported;
      if (e == cudaSuccess) e = cudaSetDevice(og);
      if (e == cudaSuccess) {
        e = cudaDeviceEnablePeerAccess(oh, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) e = cudaSuccess;
      }
      if (e == cudaSuccess) {
        struct cudaMemAccessDesc desc;
        memset(&desc, 0, sizeof desc);
        desc.location.type = cudaMemLocationTypeDevice;
        desc.location.id = og;
        desc.flags = cudaMemAccessFlagsProtReadWrite;
        e = cudaMemPoolSetAccess(c->gpus[h].pool, &desc, 1);
      }
      (void)cudaGetLastError();
      c->peer_copy[g][h] = e == cudaSuccess && !staged;
      if (e != cudaSuccess && c->peer_ok) {
        c->peer_ok = false;
        snprintf(c->peer_why, sizeof c->peer_why,
                 "GPU %d cannot access GPU %d's memory (%s), so the copy path "
                 "cannot join them; use a mesh of distinct GPUs (NCCL) or of "
                 "one GPU",
                 og, oh, cudaGetErrorString(e));
      }
    }
}

/* Checks cfg and picks the collective path (cfg->collectives, or with AUTO
 * the environment's PARADEV_CUDA_COLLECTIVES). */
static pd_code check_config(const dev_cuda_config *cfg,
                            dev_cuda_collectives *path, dev_status *st) {
  if (!cfg || cfg->struct_size < sizeof(dev_cuda_config))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "dev_cuda_config: struct_size too small; initialize it with "
        "DEV_CUDA_CONFIG_INITIALIZER");
  if (cfg->collectives != DEV_CUDA_COLL_AUTO &&
      cfg->collectives != DEV_CUDA_COLL_NCCL &&
      cfg->collectives != DEV_CUDA_COLL_COPY)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "dev_cuda_config: collectives is %d; expected auto, nccl or copy",
        (int)cfg->collectives);
  *path = cfg->collectives;
  const char *env = getenv("PARADEV_CUDA_COLLECTIVES");
  if (*path == DEV_CUDA_COLL_AUTO && env && *env) {
    if (strcmp(env, "nccl") == 0)
      *path = DEV_CUDA_COLL_NCCL;
    else if (strcmp(env, "copy") == 0)
      *path = DEV_CUDA_COLL_COPY;
    else if (strcmp(env, "auto") != 0)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "PARADEV_CUDA_COLLECTIVES=%.64s; expected auto, nccl or copy", env);
  }
  return PD_OK;
}

/* Parses cfg->mesh into m against the GPUs CUDA can see. */
static pd_code resolve_mesh(const dev_cuda_config *cfg, mesh_spec *m,
                            dev_status *st) {
  PD_TRY(parse_mesh(cfg->mesh, m, st));
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    return dev_error(
        st, PD_UNAVAILABLE,
        "no CUDA GPU found (cudaGetDeviceCount: %s); run with --backend=cpu",
        e != cudaSuccess ? cudaGetErrorString(e)
                         : cudaGetErrorString(cudaErrorNoDevice));
  }
  if (m->all) {
    m->n = count < PD_MAX_DEVICES ? count : PD_MAX_DEVICES;
    for (int i = 0; i < m->n; i++) m->ordinal[i] = i;
  }
  for (int i = 0; i < m->n; i++)
    if (m->ordinal[i] >= count) {
      const char *vis = getenv("CUDA_VISIBLE_DEVICES");
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "mesh \"%.200s\": entry %d names cuda:%d, but %d GPU%s "
                       "visible (cuda:0 to "
                       "cuda:%d; CUDA_VISIBLE_DEVICES=%s)",
                       cfg->mesh ? cfg->mesh : "", i, m->ordinal[i], count,
                       count == 1 ? " is" : "s are", count - 1,
                       vis ? vis : "(unset)");
    }
  return PD_OK;
}

/* The backend's function table. */
static void fill_table(cu_backend *c, int n) {
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
  b->capture_begin = cu_capture_begin;
  b->capture_end = cu_capture_end;
  b->graph_launch = cu_graph_launch;
  b->graph_destroy = cu_graph_destroy;
  b->device_gpu = cu_device_gpu;
}

/* Maps the mesh entries onto distinct GPUs and names each entry: cuda:G when
 * G appears once in the mesh, cuda:G/K for the K-th of several entries on G.
 * Returns whether every entry is a distinct GPU. */
static bool assign_gpus(cu_backend *c, const mesh_spec *m) {
  const int n = m->n;
  bool distinct = true;
  for (int i = 0; i < n; i++) {
    cu_device *d = &c->devs[i];
    d->ordinal = m->ordinal[i];
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
    if (same == 1)
      snprintf(d->name, sizeof d->name, "cuda:%d", d->ordinal);
    else
      snprintf(d->name, sizeof d->name, "cuda:%d/%d", d->ordinal, before);
  }
  return distinct;
}

/* One empty kernel per GPU: is there a kernel image for it? */
static pd_code probe_kernels(cu_backend *c, dev_status *st) {
  for (int g = 0; g < c->num_gpus; g++) {
    int i = 0;
    while (c->devs[i].gpu != g) i++;
    cudaError_t pe = cudaSetDevice(c->gpus[g].ordinal);
    if (pe == cudaSuccess) pe = dev_cuda_probe(c->devs[i].stream);
    if (pe == cudaSuccess) pe = cudaStreamSynchronize(c->devs[i].stream);
    if (pe == cudaErrorNoKernelImageForDevice ||
        pe == cudaErrorUnsupportedPtxVersion) {
      (void)cudaGetLastError();
      return dev_error(st, PD_UNAVAILABLE,
                       "this build of paradev has no kernels for GPU %d (%s, "
                       "compute capability "
                       "%d.%d): rebuild with CMAKE_CUDA_ARCHITECTURES "
                       "including %d%d, or run with "
                       "--backend=cpu",
                       c->gpus[g].ordinal, c->gpus[g].name, c->gpus[g].cc_major,
                       c->gpus[g].cc_minor, c->gpus[g].cc_major,
                       c->gpus[g].cc_minor);
    } else if (pe != cudaSuccess) {
      return dev_cuda_fail(&c->base, i, pe, "probe kernel", st);
    }
  }
  return PD_OK;
}

/* Each entry's memory limit: the configured one, or its share of its GPU's
 * free memory now (after the contexts, streams and cuBLAS handles took
 * theirs) less the reserve kept for cuBLAS workspaces, NCCL and kernels, so
 * that an allocation over it is an op's RESOURCE_EXHAUSTED. */
static pd_code set_limits(cu_backend *c, const dev_cuda_config *cfg,
                          dev_status *st) {
  dev_backend *b = &c->base;
  uint64_t reserve = cfg->memory_reserve == DEV_MEMORY_RESERVE_DEFAULT
                         ? CU_RESERVE_DEFAULT
                         : cfg->memory_reserve;
  for (int i = 0; i < b->num_devices; i++) c->gpus[c->devs[i].gpu].entries++;
  for (int g = 0; g < c->num_gpus; g++) {
    size_t free_b = 0, total_b = 0;
    CU_CHECK(b, -1, cudaSetDevice(c->gpus[g].ordinal), st);
    CU_CHECK(b, -1, cudaMemGetInfo(&free_b, &total_b), st);
    c->gpus[g].free_at_start = free_b;
  }
  for (int i = 0; i < b->num_devices; i++) {
    cu_gpu *g = &c->gpus[c->devs[i].gpu];
    uint64_t avail = g->free_at_start > reserve ? g->free_at_start - reserve
                                                : g->free_at_start / 2;
    c->devs[i].limit = cfg->memory_limit
                           ? cfg->memory_limit
                           : avail / (uint64_t)(g->entries ? g->entries : 1);
  }
  return PD_OK;
}

/* Sets c->use_nccl from the chosen path (NCCL needs distinct GPUs and an
 * NCCL build) and prepares the copy path's peer access otherwise. */
static pd_code choose_collectives(cu_backend *c, dev_cuda_collectives path,
                                  bool distinct, const dev_cuda_config *cfg,
                                  dev_status *st) {
  (void)distinct; /* only NCCL builds look at them */
  (void)cfg;
  if (path == DEV_CUDA_COLL_NCCL) {
#ifndef PARADEV_HAVE_NCCL
    return dev_error(
        st, PD_UNAVAILABLE,
        "collectives through NCCL were asked for, but this build "
        "has no NCCL; use the copy path (collectives = auto or copy)");
#else
    if (!distinct)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "mesh \"%.200s\" names one GPU more than once; NCCL "
                       "needs distinct GPUs "
                       "(use collectives = auto or copy)",
                       cfg->mesh ? cfg->mesh : "");
    c->use_nccl = true;
#endif
  } else if (path == DEV_CUDA_COLL_AUTO) {
#ifdef PARADEV_HAVE_NCCL
    c->use_nccl = distinct && c->base.num_devices > 1;
#endif
  }
  /* Every mesh of several GPUs: copy_d2d (CopyToDevices) takes peer copies
   * where it can, on the NCCL path too. */
  if (c->num_gpus > 1)
    enable_peers(c);
  else
    c->peer_ok = true;
  if (c->use_nccl) c->peer_ok = true; /* the copy path's need only */
  return PD_OK;
}

pd_code dev_cuda_backend_create(const dev_cuda_config *cfg, dev_backend **out,
                                dev_status *st) {
  dev_cuda_collectives path;
  PD_TRY(check_config(cfg, &path, st));
  mesh_spec m;
  PD_TRY(resolve_mesh(cfg, &m, st));

  dev_register_cuda_kernels();

  const int n = m.n;
  cu_backend *c = calloc(
      1, sizeof *c + (size_t)n * (sizeof(cu_device) + sizeof(cu_fence_pool)));
  if (!c) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  fill_table(c, n);
  c->allow_tf32 = cfg->allow_tf32;
  c->memory_limit = cfg->memory_limit;
  c->coll_timeout_ms =
      cfg->collective_timeout_ms > 0 ? cfg->collective_timeout_ms : 300000;
  bool distinct = assign_gpus(c, &m);

  pd_code rc = PD_OK;
  for (int g = 0; g < c->num_gpus && rc == PD_OK; g++)
    rc = init_gpu(c, g, cfg, st);
  for (int i = 0; i < n && rc == PD_OK; i++) rc = init_device(c, i, st);
  if (rc == PD_OK) rc = probe_kernels(c, st);
  if (rc == PD_OK) rc = set_limits(c, cfg, st);
  if (rc == PD_OK) rc = choose_collectives(c, path, distinct, cfg, st);
  if (rc == PD_OK) rc = cu_collectives_init(c, st);
  if (rc != PD_OK) {
    cu_destroy(&c->base);
    return rc;
  }
  *out = &c->base;
  return PD_OK;
}
