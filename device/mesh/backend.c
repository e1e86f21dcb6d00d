/* The wrapper backend of a mesh engine (issue #16; mesh_int.h explains the
 * design): W*n engine devices over a real backend of the n local ones.
 * Local devices are forwarded with translated indices; remote devices hold
 * placeholder buffers (data NULL, bytes counted per device) and run
 * nothing; collectives are the real backend's within this rank, nothing
 * within another rank, and coll.c's across ranks. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_int.h"

/* Whether backend `b` has the (optional) member `f` (its struct_size). */
#define HAS(b, f)                                                              \
  ((b)->struct_size >= offsetof(dev_backend, f) + sizeof((b)->f) && (b)->f)

static dev__mesh *M(dev_backend *b) { return b->impl; }

static pd_code remote_refused(dev__mesh *m, int d, const char *what,
                              dev_status *st) {
  return dev_error(st, PD_INTERNAL,
                   "%s on device %d, which is rank %d's (this engine is rank "
                   "%d): a remote device has no memory here",
                   what, d, dev__mesh_rank_of(m, d), m->rank);
}

static pd_code w_allocate(dev_backend *b, int d, size_t bytes, void **out,
                          dev_status *st) {
  dev__mesh *m = M(b);
  if (!dev__mesh_remote(m, d))
    return m->inner->allocate(m->inner, d - m->first, bytes, out, st);
  atomic_fetch_add(&m->remote_bytes[d], bytes);
  *out = NULL; /* a placeholder: the bytes are the owning rank's */
  return PD_OK;
}

static void w_deallocate(dev_backend *b, int d, void *ptr, size_t bytes) {
  dev__mesh *m = M(b);
  if (!dev__mesh_remote(m, d)) {
    m->inner->deallocate(m->inner, d - m->first, ptr, bytes);
    return;
  }
  atomic_fetch_sub(&m->remote_bytes[d], bytes);
}

static pd_code w_copy_h2d(dev_backend *b, int d, void *dst, const void *src,
                          size_t bytes, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d)) return remote_refused(m, d, "a copy", st);
  return m->inner->copy_h2d(m->inner, d - m->first, dst, src, bytes, st);
}

static pd_code w_copy_d2h(dev_backend *b, int d, void *dst, const void *src,
                          size_t bytes, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d)) return remote_refused(m, d, "a copy", st);
  return m->inner->copy_d2h(m->inner, d - m->first, dst, src, bytes, st);
}

static pd_code w_copy_d2d(dev_backend *b, int dd, void *dst, int sd,
                          const void *src, size_t bytes, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, dd)) return remote_refused(m, dd, "a copy", st);
  if (dev__mesh_remote(m, sd)) return remote_refused(m, sd, "a copy", st);
  return m->inner->copy_d2d(m->inner, dd - m->first, dst, sd - m->first, src,
                            bytes, st);
}

static pd_code w_run_kernel(dev_backend *b, dev_kernel_fn fn,
                            dev_kernel_ctx *ctx, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, ctx->device))
    return remote_refused(m, ctx->device, "a kernel", st);
  dev_kernel_ctx c = *ctx; /* index, devset: the op's, global */
  c.device -= m->first;
  c.backend = m->inner;
  return m->inner->run_kernel(m->inner, fn, &c, st);
}

static void *w_coll_create(dev_backend *b, dev_collective_kind kind,
                           const dev_devset *set) {
  dev__mesh *m = M(b);
  dev__mesh_coll *mc = calloc(1, sizeof *mc);
  if (!mc) return NULL;
  mc->kind = kind;
  mc->set = *set;
  int r0 = set->n > 0 ? dev__mesh_rank_of(m, set->dev[0]) : m->rank;
  bool one = true;
  for (int i = 1; i < set->n; i++)
    one &= dev__mesh_rank_of(m, set->dev[i]) == r0;
  if (!one) {
    mc->mode = DEV__MC_CROSS;
    if (!dev__mesh_hier_init(m, mc)) {
      free(mc);
      return NULL;
    }
    pthread_mutex_lock(&m->tmu); /* the transport of this op's epoch */
    mc->t = m->transport;
    if (mc->t) mc->t->retain(mc->t);
    pthread_mutex_unlock(&m->tmu);
  } else if (r0 != m->rank) {
    mc->mode = DEV__MC_ELSEWHERE;
  } else {
    mc->mode = DEV__MC_LOCAL;
    mc->tset = *set;
    for (int i = 0; i < set->n; i++)
      mc->tset.dev[i] = (uint8_t)(set->dev[i] - m->first);
    mc->inner = m->inner->collective_create(m->inner, kind, &mc->tset);
    if (!mc->inner) {
      free(mc);
      return NULL;
    }
  }
  return mc;
}

static pd_code w_coll_run(dev_backend *b, dev_kernel_ctx *ctx,
                          const dev_status *failed, dev_status *st) {
  dev__mesh *m = M(b);
  dev__mesh_coll *mc = ctx->collective;
  switch (mc->mode) {
    case DEV__MC_LOCAL: {
      dev_kernel_ctx c = *ctx;
      c.device -= m->first;
      c.backend = m->inner;
      c.collective = mc->inner;
      c.devset = &mc->tset;
      return m->inner->collective_run(m->inner, &c, failed, st);
    }
    case DEV__MC_CROSS: return dev__mesh_coll_run(m, mc, ctx, failed, st);
    case DEV__MC_ELSEWHERE: break;
  }
  return remote_refused(m, ctx->device, "a collective", st);
}

static void w_coll_release(dev_backend *b, void *coll) {
  dev__mesh *m = M(b);
  dev__mesh_coll *mc = coll;
  if (!mc) return;
  if (mc->mode == DEV__MC_LOCAL && m->inner->collective_release)
    m->inner->collective_release(m->inner, mc->inner);
  dev__mesh_hier_free(mc);
  if (mc->t) mc->t->release(mc->t);
  free(mc);
}

static pd_code w_synchronize(dev_backend *b, int d, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d)) return PD_OK;
  return m->inner->synchronize(m->inner, d - m->first, st);
}

static pd_code w_memory_stats(dev_backend *b, int d, dev_memory_stats *out,
                              dev_status *st) {
  dev__mesh *m = M(b);
  if (!dev__mesh_remote(m, d))
    return m->inner->memory_stats(m->inner, d - m->first, out, st);
  dev_memory_stats local = {.struct_size = sizeof local};
  PD_TRY(m->inner->memory_stats(m->inner, 0, &local, st));
  uint64_t used = atomic_load(&m->remote_bytes[d]);
  uint64_t limit = atomic_load(&m->remote_limit[d]);
  uint64_t total = atomic_load(&m->remote_total[d]);
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  out->bytes_in_use = used;
  out->peak_bytes_in_use = used;
  /* The rank's own figures once it attached; before, local device 0's. */
  out->bytes_limit = limit ? limit : local.bytes_limit;
  out->bytes_total = total ? total : limit ? limit : local.bytes_total;
  return PD_OK;
}

void dev_engine_mesh_set_remote_device(dev_engine *e, int device,
                                       const char *name, uint64_t bytes_limit,
                                       uint64_t bytes_total) {
  dev__mesh *m = e ? e->mesh : NULL;
  if (!m || device < 0 || device >= m->world * m->n_local ||
      !dev__mesh_remote(m, device))
    return;
  atomic_store(&m->remote_limit[device], bytes_limit);
  atomic_store(&m->remote_total[device], bytes_total);
  if (!name || !*name) return;
  char buf[sizeof m->names[0]];
  snprintf(buf, sizeof buf, "r%d/%s", device / m->n_local, name);
  /* Written once per attach and the same text every time a rank with the
   * same backend attaches again: only when it changed. */
  pthread_mutex_lock(&m->tmu);
  if (strcmp(buf, m->names[device]) != 0)
    memcpy(m->names[device], buf, sizeof buf);
  pthread_mutex_unlock(&m->tmu);
}

static const char *w_device_name(dev_backend *b, int d) {
  dev__mesh *m = M(b);
  if (d < 0 || d >= b->num_devices) return "";
  if (dev__mesh_remote(m, d)) return m->names[d];
  return m->inner->device_name(m->inner, d - m->first);
}

static void w_destroy(dev_backend *b) {
  dev__mesh *m = M(b);
  m->inner->destroy(m->inner);
  if (m->transport) m->transport->release(m->transport);
  pthread_mutex_destroy(&m->tmu);
  free(m);
  free(b);
}

static bool w_healthy(dev_backend *b, int d) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d) || !HAS(m->inner, healthy)) return true;
  return m->inner->healthy(m->inner, d - m->first);
}

static pd_code w_host_register(dev_backend *b, void *p, size_t n,
                               dev_status *st) {
  dev__mesh *m = M(b);
  return m->inner->host_register(m->inner, p, n, st);
}

static void w_host_unregister(dev_backend *b, void *p) {
  dev__mesh *m = M(b);
  m->inner->host_unregister(m->inner, p);
}

static pd_code w_fence_record(dev_backend *b, int d, void **f, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d)) {
    *f = NULL; /* never issued there (exec.c) */
    return PD_OK;
  }
  return m->inner->fence_record(m->inner, d - m->first, f, st);
}

static pd_code w_fence_wait(dev_backend *b, int d, void *f, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d) || !f) return PD_OK;
  return m->inner->fence_wait(m->inner, d - m->first, f, st);
}

static void w_fence_release(dev_backend *b, int d, void *f) {
  dev__mesh *m = M(b);
  if (!dev__mesh_remote(m, d) && f)
    m->inner->fence_release(m->inner, d - m->first, f);
}

static void w_trim(dev_backend *b, int d) {
  dev__mesh *m = M(b);
  if (!dev__mesh_remote(m, d)) m->inner->trim(m->inner, d - m->first);
}

static pd_code w_capture_begin(dev_backend *b, int d, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d)) return remote_refused(m, d, "a capture", st);
  return m->inner->capture_begin(m->inner, d - m->first, st);
}

static pd_code w_capture_end(dev_backend *b, int d, void **g, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d)) return remote_refused(m, d, "a capture", st);
  return m->inner->capture_end(m->inner, d - m->first, g, st);
}

static pd_code w_graph_launch(dev_backend *b, int d, void *g, dev_status *st) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d)) return remote_refused(m, d, "a graph", st);
  return m->inner->graph_launch(m->inner, d - m->first, g, st);
}

static void w_graph_destroy(dev_backend *b, int d, void *g) {
  dev__mesh *m = M(b);
  if (!dev__mesh_remote(m, d))
    m->inner->graph_destroy(m->inner, d - m->first, g);
}

static int w_device_gpu(dev_backend *b, int d) {
  dev__mesh *m = M(b);
  if (dev__mesh_remote(m, d)) return -1;
  if (!HAS(m->inner, device_gpu)) return d - m->first;
  return m->inner->device_gpu(m->inner, d - m->first);
}

pd_code dev__mesh_backend_create(dev_backend *inner, const dev_mesh_config *cfg,
                                 dev_backend **out, dev__mesh **mesh,
                                 dev_status *st) {
  const int n = inner->num_devices, w = cfg->world_size;
  if (w < 2 || cfg->rank < 0 || cfg->rank >= w)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "mesh rank %d of world size %d; expected a world size of "
                     "at least 2 and a rank from 0 to world size - 1",
                     cfg->rank, w);
  if (n < 1 || (int64_t)w * n > PD_MAX_DEVICES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a mesh of %d ranks with %d devices each has %lld "
                     "devices; an engine has at most %d",
                     w, n, (long long)w * n, PD_MAX_DEVICES);
  dev__mesh *m = calloc(1, sizeof *m);
  dev_backend *b = calloc(1, sizeof *b);
  if (!m || !b) {
    free(m);
    free(b);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  m->cfg = *cfg;
  m->rank = cfg->rank;
  m->world = w;
  m->n_local = n;
  m->first = cfg->rank * n;
  m->inner = inner;
  const char *knob = getenv("PARADEV_MESH_STAGED");
  m->staged =
      inner->kind != DEV_BACKEND_CPU || (knob && strcmp(knob, "1") == 0);
  const char *flat = getenv("PARADEV_MESH_FLAT_ALLREDUCE");
  m->flat = flat && strcmp(flat, "1") == 0;
  pthread_mutex_init(&m->tmu, NULL);
  for (int d = 0; d < w * n; d++)
    snprintf(m->names[d], sizeof m->names[d], "r%d/dev:%d", d / n, d % n);
  b->struct_size = sizeof *b;
  b->name = inner->name;
  b->kind = inner->kind;
  b->num_devices = w * n;
  b->impl = m;
  b->allocate = w_allocate;
  b->deallocate = w_deallocate;
  b->copy_h2d = w_copy_h2d;
  b->copy_d2h = w_copy_d2h;
  b->copy_d2d = w_copy_d2d;
  b->run_kernel = w_run_kernel;
  b->collective_create = w_coll_create;
  b->collective_run = w_coll_run;
  b->collective_release = w_coll_release;
  b->synchronize = w_synchronize;
  b->memory_stats = w_memory_stats;
  b->device_name = w_device_name;
  b->destroy = w_destroy;
  b->healthy = w_healthy;
  if (HAS(inner, host_register) && HAS(inner, host_unregister)) {
    b->host_register = w_host_register;
    b->host_unregister = w_host_unregister;
  }
  if (HAS(inner, fence_record) && HAS(inner, fence_wait) &&
      HAS(inner, fence_release)) {
    b->fence_record = w_fence_record;
    b->fence_wait = w_fence_wait;
    b->fence_release = w_fence_release;
  }
  if (HAS(inner, trim)) b->trim = w_trim;
  if (HAS(inner, capture_begin) && HAS(inner, capture_end) &&
      HAS(inner, graph_launch) && HAS(inner, graph_destroy)) {
    b->capture_begin = w_capture_begin;
    b->capture_end = w_capture_end;
    b->graph_launch = w_graph_launch;
    b->graph_destroy = w_graph_destroy;
  }
  b->device_gpu = w_device_gpu;
  *out = b;
  *mesh = m;
  return PD_OK;
}
