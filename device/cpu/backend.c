/* The CPU backend: N simulated devices in host memory. Each device has its
 * own memory accounting and an optional limit, so out-of-memory can be
 * exercised without a GPU. Kernels run on the engine's executor thread of
 * their device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_int.h"

/* Freed blocks of 1 MiB and more are kept per device for reuse, as a CUDA
 * memory pool keeps memory up to its release threshold. Large blocks come
 * from the kernel as fresh pages (glibc mmaps anything above 32 MiB at most),
 * and faulting them in again on every op costs more than the op itself. */
#define CACHE_MIN_BYTES (1u << 20)
#define CACHE_SLOTS 8
#define CACHE_MAX_BYTES ((uint64_t)1 << 30) /* per device */

typedef struct cached_block {
  void *ptr;
  size_t size; /* rounded allocation size */
} cached_block;

typedef struct cpu_device {
  pthread_mutex_t cache_mu;
  cached_block cache[CACHE_SLOTS];
  int cached;
  uint64_t cached_bytes;
  _Atomic uint64_t in_use;
  _Atomic uint64_t peak;
  _Atomic uint64_t allocs;
  char name[32];
} cpu_device;

typedef struct cpu_backend {
  dev_backend base;
  uint64_t limit;
  uint64_t total;
  cpu_device devs[];
} cpu_backend;

static cpu_backend *cpu(dev_backend *b) { return (cpu_backend *)b; }

static pd_code cpu_allocate(dev_backend *b, int device, size_t bytes,
                            void **out, dev_status *st) {
  cpu_device *d = &cpu(b)->devs[device];
  uint64_t limit = cpu(b)->limit;
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
  /* 64-byte alignment suits SIMD loads and BLAS. */
  size_t sz = bytes ? (bytes + 63) & ~(size_t)63 : 64;
  void *p = NULL;
  if (sz >= CACHE_MIN_BYTES) {
    pthread_mutex_lock(&d->cache_mu);
    for (int i = 0; i < d->cached; i++)
      if (d->cache[i].size == sz) {
        p = d->cache[i].ptr;
        d->cached_bytes -= sz;
        d->cache[i] = d->cache[--d->cached];
        break;
      }
    pthread_mutex_unlock(&d->cache_mu);
  }
  if (!p && sz >= bytes) p = aligned_alloc(64, sz);
  if (!p) {
    atomic_fetch_sub(&d->in_use, bytes);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: host allocation of %zu bytes failed", d->name, bytes);
  }
  uint64_t now = cur + bytes, peak = atomic_load(&d->peak);
  while (now > peak && !atomic_compare_exchange_weak(&d->peak, &peak, now)) {
  }
  atomic_fetch_add(&d->allocs, 1);
  *out = p;
  return PD_OK;
}

static void cpu_deallocate(dev_backend *b, int device, void *ptr,
                           size_t bytes) {
  if (!ptr) return;
  cpu_device *d = &cpu(b)->devs[device];
  atomic_fetch_sub(&d->in_use, bytes);
  size_t sz = bytes ? (bytes + 63) & ~(size_t)63 : 64;
  if (sz >= CACHE_MIN_BYTES) {
    pthread_mutex_lock(&d->cache_mu);
    if (d->cached == CACHE_SLOTS) { /* evict the oldest-placed slot */
      free(d->cache[0].ptr);
      d->cached_bytes -= d->cache[0].size;
      d->cache[0] = d->cache[--d->cached];
    }
    if (d->cached_bytes + sz <= CACHE_MAX_BYTES) {
      d->cache[d->cached++] = (cached_block){ptr, sz};
      d->cached_bytes += sz;
      ptr = NULL;
    }
    pthread_mutex_unlock(&d->cache_mu);
  }
  free(ptr);
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
  m.bytes_total = cpu(b)->limit ? cpu(b)->limit : cpu(b)->total;
  m.num_allocs = atomic_load(&d->allocs);
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

pd_code dev_cpu_backend_create(const dev_cpu_config *cfg, dev_backend **out,
                               dev_status *st) {
  if (!cfg || cfg->struct_size < sizeof(dev_cpu_config))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_cpu_config: struct_size too small");
  int n = cfg->num_devices;
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
  c->limit = cfg->memory_limit;
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  c->total = pages > 0 && psize > 0
                 ? (uint64_t)pages * (uint64_t)psize / (uint64_t)n
                 : 0;
  for (int i = 0; i < n; i++) {
    snprintf(c->devs[i].name, sizeof c->devs[i].name, "cpu:%d", i);
    pthread_mutex_init(&c->devs[i].cache_mu, NULL);
  }
  *out = b;
  return PD_OK;
}
