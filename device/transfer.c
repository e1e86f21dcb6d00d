/* Uploads and downloads by layout: how a host value maps onto a parallel
 * tensor's components (mirrored, sharded along an axis, one value per
 * component, or one component), in chunks of any size, tensors created
 * pending for a checkpoint load (ready.c completes them), and the one-call
 * conveniences dev_tensor_from_host / dev_tensor_to_host (which waits for
 * the tensor through ready.c). */
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"
#include "mesh/mesh_int.h"

pd_code dev_tensor_create_for_layout(dev_engine *e, pd_dtype dtype,
                                     const dev_layout *layout,
                                     const dev_shape *host_shape,
                                     const dev_shape *component_shapes,
                                     dev_tensor **out, dev_status *st) {
  return dev_tensor_create_for_layout_on(e, NULL, dtype, layout, host_shape,
                                         component_shapes, out, st);
}

/* dev_tensor_create_for_layout_on without the coordinator's hook. */
static pd_code create_for_layout(dev_engine *e, const dev_devset *set,
                                 pd_dtype dtype, const dev_layout *layout,
                                 const dev_shape *host_shape,
                                 const dev_shape *component_shapes,
                                 dev_tensor **out, dev_status *st);

pd_code dev_tensor_create_for_layout_on(dev_engine *e, const dev_devset *set,
                                        pd_dtype dtype,
                                        const dev_layout *layout,
                                        const dev_shape *host_shape,
                                        const dev_shape *component_shapes,
                                        dev_tensor **out, dev_status *st) {
  PD_TRY(create_for_layout(e, set, dtype, layout, host_shape,
                           component_shapes, out, st));
  if (e->mesh) dev__mesh_tensor_created(*out);
  return PD_OK;
}

static pd_code create_for_layout(dev_engine *e, const dev_devset *set,
                                 pd_dtype dtype, const dev_layout *layout,
                                 const dev_shape *host_shape,
                                 const dev_shape *component_shapes,
                                 dev_tensor **out, dev_status *st) {
  dev_devset sset;
  PD_TRY(dev__devset_check(e, set, &sset, st));
  int n = sset.n;
  dev_shape *shapes = malloc(sizeof(dev_shape) * (size_t)n);
  if (!shapes)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  pd_code rc = PD_OK;
  switch (layout->kind) {
    case DEV_LAYOUT_MIRRORED:
      for (int d = 0; d < n; d++) shapes[d] = *host_shape;
      break;
    case DEV_LAYOUT_SHARDED:
      if (layout->axis < 0 || layout->axis >= host_shape->rank) {
        char sb[160];
        rc = dev_error(st, PD_INVALID_ARGUMENT,
                       "sharded layout: axis %d is out of range for shape %s; "
                       "expected 0 to %d",
                       layout->axis, dev_shape_str(host_shape, sb, sizeof sb),
                       host_shape->rank - 1);
        break;
      }
      for (int d = 0; d < n; d++)
        dev_shard_shape(host_shape, layout->axis, n, d, &shapes[d]);
      break;
    case DEV_LAYOUT_PER_COMPONENT:
      if (!component_shapes) {
        rc = dev_error(st, PD_INVALID_ARGUMENT,
                       "per-component layout needs %d component shapes", n);
        break;
      }
      memcpy(shapes, component_shapes, sizeof(dev_shape) * (size_t)n);
      break;
    default:
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "layout kind %d cannot build a tensor; expected mirrored, "
                     "sharded or per-component",
                     (int)layout->kind);
  }
  if (rc == PD_OK) rc = dev__tensor_create_on(e, &sset, dtype, shapes, out, st);
  if (rc == PD_OK) {
    (*out)->not_mirrored = layout->kind != DEV_LAYOUT_MIRRORED;
    if (layout->kind == DEV_LAYOUT_SHARDED)
      (*out)->shard_axis_p1 = (unsigned char)(layout->axis + 1);
  }
  free(shapes);
  return rc;
}

pd_code dev_tensor_create_pending(dev_engine *e, pd_dtype dtype,
                                  const dev_layout *layout,
                                  const dev_shape *host_shape,
                                  const dev_shape *component_shapes,
                                  dev_tensor **out, dev_status *st) {
  return dev_tensor_create_pending_on(e, NULL, dtype, layout, host_shape,
                                      component_shapes, out, st);
}

pd_code dev_tensor_create_pending_on(dev_engine *e, const dev_devset *set,
                                     pd_dtype dtype, const dev_layout *layout,
                                     const dev_shape *host_shape,
                                     const dev_shape *component_shapes,
                                     dev_tensor **out, dev_status *st) {
  dev_tensor *t = NULL;
  PD_TRY(create_for_layout(e, set, dtype, layout, host_shape, component_shapes,
                           &t, st));
  pd_code rc = dev__tensor_set_pending(t, st);
  if (rc != PD_OK) {
    dev_tensor_release(t);
    return rc;
  }
  if (e->mesh) dev__mesh_tensor_created(t);
  *out = t;
  return PD_OK;
}

/* Where host byte ranges land for a layout. Concatenation along `axis` views
 * the host value as [outer, D, inner] and component c as [outer, D_c, inner]. */
typedef struct span_map {
  int n;
  uint64_t inner; /* bytes of one row along the axis */
  uint64_t outer;
  uint64_t rows;                          /* D */
  uint64_t first_row[PD_MAX_DEVICES + 1]; /* prefix sums of D_c */
} span_map;

static pd_code concat_map(const dev_tensor *t, int axis, span_map *m,
                          dev_shape *host, dev_status *st) {
  const dev_shape *s0 = &t->comps[0].shape;
  if (axis < 0 || axis >= s0->rank)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "concatenation axis %d is out of range; expected 0 to %d for rank %d",
        axis, s0->rank - 1, s0->rank);
  m->n = t->n;
  m->first_row[0] = 0;
  for (int d = 0; d < t->n; d++) {
    const dev_shape *s = &t->comps[d].shape;
    for (int i = 0; i < s0->rank; i++)
      if (i != axis && s->dims[i] != s0->dims[i]) {
        char a[160], b[160];
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "components 0 %s and %d %s differ on axis %d, not "
                         "only on the concatenation axis %d",
                         dev_shape_str(s0, a, sizeof a), d,
                         dev_shape_str(s, b, sizeof b), i, axis);
      }
    m->first_row[d + 1] = m->first_row[d] + (uint64_t)s->dims[axis];
  }
  *host = *s0;
  host->dims[axis] = (int64_t)m->first_row[t->n];
  m->rows = m->first_row[t->n];
  m->inner = pd_dtype_size(t->dtype);
  for (int i = axis + 1; i < s0->rank; i++) m->inner *= (uint64_t)s0->dims[i];
  m->outer = 1;
  for (int i = 0; i < axis; i++) m->outer *= (uint64_t)s0->dims[i];
  return PD_OK;
}

typedef pd_code (*span_fn)(dev_tensor *t, int comp, uint64_t comp_off,
                           void *host, size_t len, dev_status *st);

/* Walks host bytes [offset, offset+len) and calls fn on each contiguous run
 * that lands in one component. */
static pd_code walk_concat(dev_tensor *t, const span_map *m, uint64_t offset,
                           char *host, size_t len, span_fn fn, dev_status *st) {
  while (len > 0) {
    uint64_t block = m->rows * m->inner;
    uint64_t o = offset / block, rem = offset % block;
    uint64_t r = rem / m->inner, within = rem % m->inner;
    int c = 0;
    while (c < m->n - 1 && m->first_row[c + 1] <= r) c++;
    uint64_t dc = m->first_row[c + 1] - m->first_row[c];
    uint64_t comp_off = (o * dc + (r - m->first_row[c])) * m->inner + within;
    uint64_t run = (m->first_row[c + 1] - r) * m->inner - within;
    size_t take = run < len ? (size_t)run : len;
    PD_TRY(fn(t, c, comp_off, host, take, st));
    host += take;
    offset += take;
    len -= take;
  }
  return PD_OK;
}

static pd_code write_span(dev_tensor *t, int c, uint64_t off, void *host,
                          size_t len, dev_status *st) {
  dev_backend *b = t->engine->backend;
  if (dev__mesh_remote(t->engine->mesh, dev__comp_device(t, c)))
    return dev__mesh_component_write(t, c, off, host, len, st);
  return b->copy_h2d(b, dev__comp_device(t, c),
                     (char *)t->comps[c].buf->data + off, host, len, st);
}

static pd_code read_span(dev_tensor *t, int c, uint64_t off, void *host,
                         size_t len, dev_status *st) {
  dev_backend *b = t->engine->backend;
  if (dev__mesh_remote(t->engine->mesh, dev__comp_device(t, c)))
    return dev__mesh_component_read(t, c, off, host, len, st);
  return b->copy_d2h(b, dev__comp_device(t, c), host,
                     (char *)t->comps[c].buf->data + off, len, st);
}

static pd_code check_range(uint64_t offset, size_t len, uint64_t total,
                           dev_status *st) {
  if (offset > total || len > total - offset)
    return dev_error(
        st, PD_OUT_OF_RANGE,
        "bytes [%llu, %llu) run past the end of the tensor's %llu bytes",
        (unsigned long long)offset, (unsigned long long)(offset + len),
        (unsigned long long)total);
  return PD_OK;
}

static pd_code check_component(const dev_tensor *t, int c, dev_status *st) {
  if (c < 0 || c >= t->n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "component %d is out of range; expected 0 to %d", c,
                     t->n - 1);
  return PD_OK;
}

/* Every component gets the same bytes. On the CPU backend the source goes
 * out in pieces small enough to stay in the core's cache between the
 * components' copies, so it is read from memory once, not once per device;
 * a GPU backend gets one copy per device (each call has its own cost). */
#define MIRROR_PIECE ((size_t)256 << 10)

static pd_code write_mirrored(dev_tensor *t, uint64_t offset, const void *data,
                              size_t len, dev_status *st) {
  size_t piece = t->engine->backend->kind == DEV_BACKEND_CPU && t->n > 1
                     ? MIRROR_PIECE
                     : len;
  for (size_t done = 0; done < len || len == 0;) {
    size_t n = len - done < piece ? len - done : piece;
    for (int d = 0; d < t->n; d++)
      PD_TRY(write_span(t, d, offset + done, (char *)data + done, n, st));
    done += n;
    if (len == 0) break;
  }
  return PD_OK;
}

pd_code dev_tensor_write(dev_tensor *t, const dev_layout *layout, int component,
                         uint64_t offset, const void *data, size_t len,
                         dev_status *st) {
  switch (layout->kind) {
    case DEV_LAYOUT_MIRRORED:
      PD_TRY(check_range(offset, len, t->comps[0].bytes, st));
      return write_mirrored(t, offset, data, len, st);
    case DEV_LAYOUT_PER_COMPONENT:
    case DEV_LAYOUT_COMPONENT:
      PD_TRY(check_component(t, component, st));
      PD_TRY(check_range(offset, len, t->comps[component].bytes, st));
      return write_span(t, component, offset, (void *)data, len, st);
    case DEV_LAYOUT_SHARDED: {
      span_map m;
      dev_shape host;
      PD_TRY(concat_map(t, layout->axis, &m, &host, st));
      PD_TRY(check_range(offset, len, t->bytes, st));
      return walk_concat(t, &m, offset, (char *)data, len, write_span, st);
    }
  }
  return dev_error(st, PD_INVALID_ARGUMENT, "unknown layout kind %d",
                   (int)layout->kind);
}

/* A MIRRORED download returns component 0: refused when the components are
 * known to differ (uploaded sharded or per component, or of different
 * shapes), so that it never silently returns one shard. A tensor on one
 * device is a plain single-device tensor (issue #17): its one component
 * is its value, whatever marks it carries (a sharded upload onto one
 * device, DeviceId placed there, ParallelPack of one input). */
static pd_code check_mirrored(const dev_tensor *t, dev_status *st) {
  if (t->n == 1) return PD_OK;
  const char *why = NULL;
  char sb[160], ax[96];
  if (t->shard_axis_p1) {
    snprintf(ax, sizeof ax, "it was uploaded or loaded SHARDED along axis %d",
             t->shard_axis_p1 - 1);
    why = ax;
  } else if (t->not_mirrored) {
    why =
        "it may differ between devices: uploaded or loaded PER_COMPONENT, "
        "computed per device or from sharded values, or packed from "
        "single-device tensors by ParallelPack";
  }
  for (int d = 1; d < t->n && !why; d++)
    if (!dev_shape_equal(&t->comps[d].shape, &t->comps[0].shape))
      why = "its components differ in shape";
  if (!why) return PD_OK;
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "a MIRRORED download returns component 0 as the value of "
                   "every device, but this tensor of shape %s is not "
                   "mirrored (%s); download it with layout SHARDED (the "
                   "components concatenated along an axis), COMPONENT (one "
                   "component) or PER_COMPONENT (each)",
                   dev_shape_str(&t->shape, sb, sizeof sb), why);
}

/* A SHARDED read along another axis than the one the tensor was uploaded
 * or loaded sharded along would concatenate its shards into a wrong value
 * (sharded(0) [4,6] on 4 devices read along 1: [1,24]): refused. */
static pd_code check_shard_axis(const dev_tensor *t, int axis, dev_status *st) {
  /* One device: every axis joins the one shard into the same value. */
  if (!t->shard_axis_p1 || t->shard_axis_p1 - 1 == axis || t->n == 1)
    return PD_OK;
  char sb[160];
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "this tensor (components %s) was uploaded or loaded "
                   "SHARDED along axis %d; reading it SHARDED along axis %d "
                   "would join its shards into a different value: read it "
                   "SHARDED along axis %d",
                   dev_shape_str(&t->comps[0].shape, sb, sizeof sb),
                   t->shard_axis_p1 - 1, axis, t->shard_axis_p1 - 1);
}

pd_code dev_tensor_host_size(const dev_tensor *t, const dev_layout *layout,
                             int component, dev_shape *host_shape,
                             uint64_t *bytes, dev_status *st) {
  switch (layout->kind) {
    case DEV_LAYOUT_MIRRORED:
      PD_TRY(check_mirrored(t, st));
      component = 0;
      /* fall through */
    case DEV_LAYOUT_PER_COMPONENT:
    case DEV_LAYOUT_COMPONENT:
      if (layout->kind == DEV_LAYOUT_COMPONENT) component = layout->component;
      PD_TRY(check_component(t, component, st));
      if (host_shape) *host_shape = t->comps[component].shape;
      *bytes = t->comps[component].bytes;
      return PD_OK;
    case DEV_LAYOUT_SHARDED: {
      span_map m;
      dev_shape host;
      /* concat_map first: shards that cannot join along the axis keep its
       * message; check_shard_axis refuses those that would join wrongly. */
      PD_TRY(concat_map(t, layout->axis, &m, &host, st));
      PD_TRY(check_shard_axis(t, layout->axis, st));
      if (host_shape) *host_shape = host;
      *bytes = t->bytes;
      return PD_OK;
    }
  }
  return dev_error(st, PD_INVALID_ARGUMENT, "unknown layout kind %d",
                   (int)layout->kind);
}

pd_code dev_tensor_read(dev_tensor *t, const dev_layout *layout, int component,
                        uint64_t offset, void *data, size_t len,
                        dev_status *st) {
  uint64_t total;
  PD_TRY(dev_tensor_host_size(t, layout, component, NULL, &total, st));
  PD_TRY(check_range(offset, len, total, st));
  /* Every code first: a failed component makes release.c free its peers'
   * buffers, so their buf is looked at only when none failed. */
  for (int d = 0; d < t->n; d++) {
    pd_code code = t->comps[d].code;
    if (code != PD_OK)
      return dev_error(st, code, "%s", t->comps[d].msg ? t->comps[d].msg : "");
  }
  /* A remote component (issue #16) is read through the mesh, wherever its
   * placeholder is. */
  for (int d = 0; d < t->n; d++)
    if (!t->comps[d].buf &&
        !dev__mesh_remote(t->engine->mesh, dev__comp_device(t, d)))
      return dev_error(st, PD_FAILED_PRECONDITION, "tensor is not ready");
  if (layout->kind == DEV_LAYOUT_SHARDED) {
    span_map m;
    dev_shape host;
    PD_TRY(concat_map(t, layout->axis, &m, &host, st));
    return walk_concat(t, &m, offset, data, len, read_span, st);
  }
  int c = layout->kind == DEV_LAYOUT_MIRRORED    ? 0
          : layout->kind == DEV_LAYOUT_COMPONENT ? layout->component
                                                 : component;
  return read_span(t, c, offset, data, len, st);
}

pd_code dev_tensor_from_host(dev_engine *e, pd_dtype dtype,
                             const dev_layout *layout,
                             const dev_shape *host_shape, const void *data,
                             dev_tensor **out, dev_status *st) {
  return dev_tensor_from_host_on(e, NULL, dtype, layout, host_shape, data, out,
                                 st);
}

pd_code dev_tensor_from_host_on(dev_engine *e, const dev_devset *set,
                                pd_dtype dtype, const dev_layout *layout,
                                const dev_shape *host_shape, const void *data,
                                dev_tensor **out, dev_status *st) {
  if (layout->kind == DEV_LAYOUT_PER_COMPONENT)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "use dev_tensor_from_components for per-component values");
  dev_tensor *t;
  PD_TRY(dev_tensor_create_for_layout_on(e, set, dtype, layout, host_shape,
                                         NULL, &t, st));
  uint64_t bytes =
      layout->kind == DEV_LAYOUT_MIRRORED ? t->comps[0].bytes : t->bytes;
  pd_code rc = dev_tensor_write(t, layout, 0, 0, data, bytes, st);
  if (rc != PD_OK) {
    dev_tensor_release(t);
    return rc;
  }
  *out = t;
  return PD_OK;
}

pd_code dev_tensor_from_components(dev_engine *e, pd_dtype dtype,
                                   const dev_shape *shapes,
                                   const void *const *datas, dev_tensor **out,
                                   dev_status *st) {
  return dev_tensor_from_components_on(e, NULL, dtype, shapes, datas, out, st);
}

pd_code dev_tensor_from_components_on(dev_engine *e, const dev_devset *set,
                                      pd_dtype dtype, const dev_shape *shapes,
                                      const void *const *datas,
                                      dev_tensor **out, dev_status *st) {
  dev_tensor *t;
  PD_TRY(dev__tensor_create_on(e, set, dtype, shapes, &t, st));
  t->not_mirrored = true;
  if (e->mesh) dev__mesh_tensor_created(t);
  dev_layout lay = {DEV_LAYOUT_PER_COMPONENT, 0, 0};
  for (int d = 0; d < t->n; d++) {
    pd_code rc =
        dev_tensor_write(t, &lay, d, 0, datas[d], t->comps[d].bytes, st);
    if (rc != PD_OK) {
      dev_tensor_release(t);
      return rc;
    }
  }
  *out = t;
  return PD_OK;
}

pd_code dev_tensor_to_host(dev_tensor *t, const dev_layout *layout,
                           int component, void *data, size_t capacity,
                           dev_status *st) {
  PD_TRY(dev_tensor_wait(t, st));
  uint64_t bytes;
  PD_TRY(dev_tensor_host_size(t, layout, component, NULL, &bytes, st));
  if (bytes > capacity)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "download needs %llu bytes; the buffer holds %zu",
                     (unsigned long long)bytes, capacity);
  return dev_tensor_read(t, layout, component, 0, data, (size_t)bytes, st);
}
