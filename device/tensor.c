/* Parallel tensors: device buffers (shared by aliasing tensors), creating a
 * tensor's components (and the state of a pending one), references, and the
 * metadata accessors. Uploads and
 * downloads by layout are in transfer.c, readiness and waits in ready.c. */
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"
#include "mesh/mesh_int.h"

pd_code dev__buffer_alloc(dev_backend *b, int device, size_t bytes,
                          dev_buffer **out, dev_status *st) {
  dev_buffer *buf = malloc(sizeof *buf);
  if (!buf) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  void *p = NULL;
  pd_code rc = b->allocate(b, device, bytes, &p, st);
  if (rc != PD_OK) {
    free(buf);
    return rc;
  }
  atomic_init(&buf->refs, 1);
  buf->device = device;
  buf->data = p;
  buf->bytes = bytes;
  buf->backend = b;
  *out = buf;
  return PD_OK;
}

void dev__buffer_retain(dev_buffer *buf) { atomic_fetch_add(&buf->refs, 1); }

void dev__buffer_release(dev_buffer *buf) {
  if (!buf) return;
  if (atomic_fetch_sub(&buf->refs, 1) == 1) {
    buf->backend->deallocate(buf->backend, buf->device, buf->data, buf->bytes);
    free(buf);
  }
}

static void merge_shape(dev_tensor *t) {
  t->shape = t->comps[0].shape;
  for (int d = 1; d < t->n; d++)
    for (int i = 0; i < t->shape.rank; i++)
      if (t->comps[d].shape.dims[i] != t->shape.dims[i]) t->shape.dims[i] = -1;
}

pd_code dev__tensor_new(dev_engine *e, const dev_devset *set, pd_dtype dtype,
                        const dev_shape *shapes, dev_tensor **out,
                        dev_status *st) {
  if (!dev_dtype_is_valid(dtype))
    return dev_error(st, PD_INVALID_ARGUMENT, "dtype %d is not a valid dtype",
                     (int)dtype);
  if (!set) set = &e->all;
  int n = set->n;
  for (int d = 0; d < n; d++)
    if (shapes[d].rank != shapes[0].rank)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "component %d has rank %d but component 0 has rank %d; "
                       "expected equal ranks",
                       d, shapes[d].rank, shapes[0].rank);
  size_t size = sizeof(dev_tensor) + (size_t)n * sizeof(dev_component);
  size = (size + DEV_CACHE_LINE - 1) / DEV_CACHE_LINE * DEV_CACHE_LINE;
  dev_tensor *t = aligned_alloc(DEV_CACHE_LINE, size); /* comps[] aligned */
  if (!t) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  memset(t, 0, size);
  atomic_init(&t->refs, 1);
  atomic_init(&t->pending, false);
  t->engine = e;
  t->id = atomic_fetch_add_explicit(&e->tensor_ids, 1, memory_order_relaxed) + 1;
  t->dtype = dtype;
  t->n = n;
  t->set = *set;
  dev__devset_map(set, t->slot);
  for (int d = 0; d < n; d++) {
    dev_component *c = &t->comps[d];
    char sb[160];
    if (dev_shape_byte_size(dtype, &shapes[d], &c->bytes, st) != PD_OK) {
      pd_code rc = dev_error(st, PD_INVALID_ARGUMENT,
                             "component %d: shape %s of %s is invalid: %s", d,
                             dev_shape_str(&shapes[d], sb, sizeof sb),
                             pd_dtype_name(dtype), st ? st->msg : "");
      free(t);
      return rc;
    }
    c->shape = shapes[d];
    atomic_init(&c->ready_seq, 0);
    atomic_init(&c->holders, 1);
    t->bytes += c->bytes;
  }
  merge_shape(t);
  *out = t;
  return PD_OK;
}

pd_code dev_tensor_create(dev_engine *e, pd_dtype dtype,
                          const dev_shape *shapes, dev_tensor **out,
                          dev_status *st) {
  return dev_tensor_create_on(e, NULL, dtype, shapes, out, st);
}

pd_code dev_tensor_create_on(dev_engine *e, const dev_devset *set,
                             pd_dtype dtype, const dev_shape *shapes,
                             dev_tensor **out, dev_status *st) {
  PD_TRY(dev__tensor_create_on(e, set, dtype, shapes, out, st));
  if (e->mesh) dev__mesh_tensor_created(*out);
  return PD_OK;
}

pd_code dev__tensor_create_on(dev_engine *e, const dev_devset *set,
                              pd_dtype dtype, const dev_shape *shapes,
                              dev_tensor **out, dev_status *st) {
  dev_devset s;
  PD_TRY(dev__devset_check(e, set, &s, st));
  dev_tensor *t;
  PD_TRY(dev__tensor_new(e, &s, dtype, shapes, &t, st));
  dev_backend *b = e->backend;
  for (int d = 0; d < t->n; d++) {
    pd_code rc = dev__buffer_alloc(b, dev__comp_device(t, d), t->comps[d].bytes,
                                   &t->comps[d].buf, st);
    if (rc != PD_OK) {
      dev_tensor_release(t);
      return rc;
    }
  }
  *out = t;
  return PD_OK;
}

pd_code dev__tensor_set_pending(dev_tensor *t, dev_status *st) {
  dev__pending *p = calloc(1, sizeof *p);
  if (!p) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  pthread_mutex_init(&p->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* wait deadlines */
  pthread_cond_init(&p->cv, &ca);
  pthread_condattr_destroy(&ca);
  t->pend = p;
  atomic_store(&t->pending, true);
  return PD_OK;
}

static void pending_free(dev__pending *p) {
  if (!p) return;
  /* Registrations hold a reference on the tensor: none can be left. */
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

void dev_tensor_retain(dev_tensor *t) {
  for (int d = 0; d < t->n; d++) atomic_fetch_add(&t->comps[d].holders, 1);
  atomic_fetch_add(&t->refs, 1);
}

void dev__tensor_drop_component(dev_tensor *t, int d) {
  dev_component *c = &t->comps[d];
  if (atomic_fetch_sub(&c->holders, 1) != 1) return;
  /* No one can read it any more: the last holder was the caller. */
  dev_buffer *buf = c->buf;
  c->buf = NULL;
  dev__buffer_release(buf);
}

void dev__tensor_unref(dev_tensor *t) {
  if (atomic_fetch_sub(&t->refs, 1) != 1) return;
  if (t->mesh_known) dev__mesh_tensor_released(t); /* the coordinator's */
  for (int d = 0; d < t->n; d++) {
    dev__buffer_release(t->comps[d].buf); /* NULL unless holds remain */
    free(t->comps[d].msg);
  }
  pending_free(t->pend);
  free(t);
}

void dev_tensor_release(dev_tensor *t) {
  if (!t) return;
  for (int d = 0; d < t->n; d++) dev__tensor_drop_component(t, d);
  dev__tensor_unref(t);
}

pd_dtype dev_tensor_dtype(const dev_tensor *t) { return t->dtype; }
const dev_shape *dev_tensor_shape(const dev_tensor *t) { return &t->shape; }
const dev_shape *dev_tensor_component_shape(const dev_tensor *t, int d) {
  return d >= 0 && d < t->n ? &t->comps[d].shape : NULL;
}
int dev_tensor_num_components(const dev_tensor *t) { return t->n; }
uint64_t dev_tensor_bytes(const dev_tensor *t) { return t->bytes; }
const dev_devset *dev_tensor_devset(const dev_tensor *t) { return &t->set; }
uint64_t dev_tensor_device_bytes(const dev_tensor *t, int device) {
  if (device < 0 || device >= PD_MAX_DEVICES) return 0;
  int c = t->slot[device];
  return c >= 0 ? t->comps[c].bytes : 0;
}
