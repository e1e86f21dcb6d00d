/* The CPU backend: N simulated devices in host memory. Each device has its
 * own memory accounting and a limit (by default its share of physical
 * memory less the daemon's reserve), so out-of-memory is an op's
 * RESOURCE_EXHAUSTED, never the kernel's OOM killer. Kernels run on the
 * engine's executor thread of their device. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_DEFAULT */
#endif
#include <dlfcn.h>
#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_int.h"

/* Freed blocks of 1 MiB and more are kept per device for reuse, as a CUDA
 * memory pool keeps memory up to its release threshold. Large blocks come
 * from the kernel as fresh pages (glibc mmaps anything above 32 MiB at most),
 * and faulting them in again on every op costs more than the op itself.
 * The cache counts against the device's limit with bytes_in_use (so the two
 * never hold more host memory than the limit lends): an allocation that
 * would not fit beside it drops cached blocks first, and the executor drops
 * them all once its device has been idle a while (cpu_trim). */
#define CACHE_MIN_BYTES (1u << 20)
#define CACHE_SLOTS 8
#define CACHE_MAX_BYTES ((uint64_t)1 << 30) /* per device */
/* After this many bytes went back to malloc, malloc_trim hands the free
 * pages to the kernel (glibc keeps freed heap memory mapped otherwise). */
#define TRIM_AFTER_BYTES ((uint64_t)64 << 20)
#define RESERVE_DEFAULT ((uint64_t)1 << 30)

typedef struct cached_block {
  void *ptr;
  size_t size; /* rounded allocation size */
} cached_block;

typedef struct cpu_device {
  pthread_mutex_t cache_mu;
  cached_block cache[CACHE_SLOTS]; /* under cache_mu */
  int cached;                      /* under cache_mu */
  _Atomic uint64_t cached_bytes;   /* written under cache_mu */
  _Atomic uint64_t in_use;
  _Atomic uint64_t peak;
  _Atomic uint64_t allocs;
  char name[32];
} cpu_device;

typedef struct cpu_backend {
  dev_backend base;
  uint64_t limit; /* per device; 0: none (physical memory unknown) */
  uint64_t total;
  _Atomic uint64_t freed_untrimmed; /* bytes freed since the last trim */
  cpu_device devs[];
} cpu_backend;

static cpu_backend *cpu(dev_backend *b) { return (cpu_backend *)b; }

/* Counts `sz` bytes given back to malloc, and trims malloc's free pages once
 * TRIM_AFTER_BYTES have been. */
static void note_freed(cpu_backend *c, uint64_t sz) {
  if (atomic_fetch_add(&c->freed_untrimmed, sz) + sz < TRIM_AFTER_BYTES) return;
  atomic_store(&c->freed_untrimmed, 0);
  malloc_trim(0);
}

/* Frees cached blocks of `d`, oldest placed first, until at most `keep`
 * bytes stay cached. Returns the bytes freed. */
static uint64_t cache_drop(cpu_device *d, uint64_t keep) {
  uint64_t freed = 0;
  pthread_mutex_lock(&d->cache_mu);
  while (d->cached > 0 && atomic_load(&d->cached_bytes) > keep) {
    free(d->cache[0].ptr);
    freed += d->cache[0].size;
    atomic_fetch_sub(&d->cached_bytes, d->cache[0].size);
    d->cache[0] = d->cache[--d->cached];
  }
  pthread_mutex_unlock(&d->cache_mu);
  return freed;
}

/* Takes a cached block of exactly `sz` bytes, or NULL. */
static void *cache_take(cpu_device *d, size_t sz) {
  void *p = NULL;
  pthread_mutex_lock(&d->cache_mu);
  for (int i = 0; i < d->cached; i++)
    if (d->cache[i].size == sz) {
      p = d->cache[i].ptr;
      atomic_fetch_sub(&d->cached_bytes, sz);
      d->cache[i] = d->cache[--d->cached];
      break;
    }
  pthread_mutex_unlock(&d->cache_mu);
  return p;
}

static pd_code cpu_allocate(dev_backend *b, int device, size_t bytes,
                            void **out, dev_status *st) {
  cpu_backend *c = cpu(b);
  cpu_device *d = &c->devs[device];
  uint64_t limit = c->limit;
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
  uint64_t now = cur + bytes;
  /* 64-byte alignment suits SIMD loads and BLAS. */
  size_t sz = bytes ? (bytes + 63) & ~(size_t)63 : 64;
  void *p = sz >= CACHE_MIN_BYTES ? cache_take(d, sz) : NULL;
  if (!p && limit && now + atomic_load(&d->cached_bytes) > limit) {
    /* Under pressure: what is cached makes room first. */
    uint64_t freed = cache_drop(d, limit - now);
    if (freed) note_freed(c, freed);
  }
  if (!p && sz >= bytes) p = aligned_alloc(64, sz);
  if (!p) {
    atomic_fetch_sub(&d->in_use, bytes);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: host allocation of %zu bytes failed", d->name, bytes);
  }
  uint64_t peak = atomic_load(&d->peak);
  while (now > peak && !atomic_compare_exchange_weak(&d->peak, &peak, now)) {
  }
  atomic_fetch_add(&d->allocs, 1);
  *out = p;
  return PD_OK;
}

static void cpu_deallocate(dev_backend *b, int device, void *ptr,
                           size_t bytes) {
  if (!ptr) return;
  cpu_backend *c = cpu(b);
  cpu_device *d = &c->devs[device];
  size_t sz = bytes ? (bytes + 63) & ~(size_t)63 : 64;
  uint64_t freed = 0;
  if (sz >= CACHE_MIN_BYTES) {
    pthread_mutex_lock(&d->cache_mu);
    if (d->cached == CACHE_SLOTS) { /* evict the oldest-placed slot */
      free(d->cache[0].ptr);
      freed += d->cache[0].size;
      atomic_fetch_sub(&d->cached_bytes, d->cache[0].size);
      d->cache[0] = d->cache[--d->cached];
    }
    if (atomic_load(&d->cached_bytes) + sz <= CACHE_MAX_BYTES) {
      d->cache[d->cached++] = (cached_block){ptr, sz};
      atomic_fetch_add(&d->cached_bytes, sz);
      ptr = NULL;
    }
    pthread_mutex_unlock(&d->cache_mu);
  }
  /* in_use drops after the block is cached, so in_use + cached never reads
   * less than what the device holds. */
  atomic_fetch_sub(&d->in_use, bytes);
  if (ptr) {
    free(ptr);
    freed += sz;
  }
  if (freed >= CACHE_MIN_BYTES) note_freed(c, freed);
}

/* Idle device: every cached block goes back to the system. */
static void cpu_trim(dev_backend *b, int device) {
  cpu_backend *c = cpu(b);
  if (cache_drop(&c->devs[device], 0) || atomic_load(&c->freed_untrimmed) > 0) {
    atomic_store(&c->freed_untrimmed, 0);
    malloc_trim(0);
  }
}

static pd_code cpu_copy(dev_backend *b, int device, void *dst, const void *src,
                        size_t bytes, dev_status *st) {
  if (bytes) memcpy(dst, src, bytes);
  return PD_OK;
}

static pd_code cpu_copy_d2d(dev_backend *b, int dst_device, void *dst,
                            int src_device, const void *src, size_t bytes,
                            dev_status *st) {
  if (bytes) memcpy(dst, src, bytes);
  return PD_OK;
}

static pd_code cpu_run_kernel(dev_backend *b, dev_kernel_fn fn,
                              dev_kernel_ctx *ctx, dev_status *st) {
  return fn(ctx, st);
}

static pd_code cpu_synchronize(dev_backend *b, int device, dev_status *st) {
  return PD_OK;
}

static pd_code cpu_memory_stats(dev_backend *b, int device,
                                dev_memory_stats *out, dev_status *st) {
  if (device < 0 || device >= b->num_devices)
    return dev_error(st, PD_INVALID_ARGUMENT, "device %d is out of range",
                     device);
  cpu_device *d = &cpu(b)->devs[device];
  dev_memory_stats m = {0};
  m.struct_size = sizeof m;
  m.bytes_in_use = atomic_load(&d->in_use);
  m.peak_bytes_in_use = atomic_load(&d->peak);
  m.bytes_limit = cpu(b)->limit;
  m.bytes_total = cpu(b)->total;
  m.num_allocs = atomic_load(&d->allocs);
  m.bytes_cached = atomic_load(&d->cached_bytes);
  *out = m;
  return PD_OK;
}

static const char *cpu_device_name(dev_backend *b, int device) {
  return device >= 0 && device < b->num_devices ? cpu(b)->devs[device].name
                                                : "cpu:?";
}

static void cpu_destroy(dev_backend *b) {
  for (int i = 0; i < b->num_devices; i++) {
    cpu_device *d = &cpu(b)->devs[i];
    for (int k = 0; k < d->cached; k++) free(d->cache[k].ptr);
    pthread_mutex_destroy(&d->cache_mu);
  }
  free(b);
}

/* One OpenBLAS pool serves the process: `threads` of them (0: the online
 * cores shared among the n executors), so n executors each calling sgemm
 * use about the cores there are. openblas_set_num_threads is looked up at
 * run time: a reference CBLAS has no pool and no such function. */
static void set_blas_threads(int threads, int n) {
  if (threads <= 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores > n ? (int)(cores / n) : 1;
  }
  void (*set)(int) =
      (void (*)(int))dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
  if (set) set(threads);
}

int dev_cpu_blas_threads(void) {
  int (*get)(void) =
      (int (*)(void))dlsym(RTLD_DEFAULT, "openblas_get_num_threads");
  return get ? get() : 0;
}

pd_code dev_cpu_backend_create(const dev_cpu_config *cfg, dev_backend **out,
                               dev_status *st) {
  if (!cfg || cfg->struct_size < sizeof(dev_cpu_config))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_cpu_config: struct_size too small");
  int n = cfg->num_devices;
  if (cfg->struct_size >=
          offsetof(dev_cpu_config, blas_threads) + sizeof cfg->blas_threads &&
      cfg->blas_threads < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "cpu backend: blas_threads %d; expected 0 (the cores "
                     "divided by the devices) or more",
                     cfg->blas_threads);
  if (n < 1 || n > PD_MAX_DEVICES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "cpu backend: %d devices; expected 1 to %d", n,
                     PD_MAX_DEVICES);
  cpu_backend *c = calloc(1, sizeof *c + (size_t)n * sizeof(cpu_device));
  if (!c) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  dev_backend *b = &c->base;
  b->struct_size = DEV_BACKEND_STRUCT_SIZE;
  b->name = "cpu";
  b->kind = DEV_BACKEND_CPU;
  b->num_devices = n;
  b->impl = c;
  b->allocate = cpu_allocate;
  b->deallocate = cpu_deallocate;
  b->copy_h2d = cpu_copy;
  b->copy_d2h = cpu_copy;
  b->copy_d2d = cpu_copy_d2d;
  b->run_kernel = cpu_run_kernel;
  b->collective_create = dev_cpu_collective_create;
  b->collective_run = dev_cpu_collective_run;
  b->collective_release = dev_cpu_collective_release;
  b->synchronize = cpu_synchronize;
  b->memory_stats = cpu_memory_stats;
  b->device_name = cpu_device_name;
  b->destroy = cpu_destroy;
  b->trim = cpu_trim;
  bool has_new = cfg->struct_size >= offsetof(dev_cpu_config, blas_threads) +
                                         sizeof cfg->blas_threads;
  uint64_t reserve = has_new ? cfg->memory_reserve : DEV_MEMORY_RESERVE_DEFAULT;
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  uint64_t phys =
      pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
  if (reserve == DEV_MEMORY_RESERVE_DEFAULT)
    reserve = phys / 4 < RESERVE_DEFAULT ? phys / 4 : RESERVE_DEFAULT;
  /* What each device reports as its total is what it may use. */
  c->total = phys > reserve ? (phys - reserve) / (uint64_t)n : 0;
  c->limit = cfg->memory_limit ? cfg->memory_limit : c->total;
  set_blas_threads(has_new ? cfg->blas_threads : 0, n);
  for (int i = 0; i < n; i++) {
    snprintf(c->devs[i].name, sizeof c->devs[i].name, "cpu:%d", i);
    pthread_mutex_init(&c->devs[i].cache_mu, NULL);
  }
  /* glibc's malloc sets itself up on its first call, without a lock. Under
   * a malloc that replaces glibc's (AddressSanitizer's, a preloaded
   * tcmalloc) that first call is malloc_trim, which is not replaced, and
   * the executors' idle trims (cpu_trim) come at once on several threads:
   * each would take glibc's main arena as its own while it counts one
   * thread, and the second of them to exit aborts the daemon ("malloc
   * assertion failure in __malloc_arena_thread_freeres"). So the first call
   * is made here, on the creating thread, before any executor runs. */
  malloc_trim(0);
  *out = b;
  return PD_OK;
}
