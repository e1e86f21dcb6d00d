/* Conversions between paradev.proto messages and engine/scheduler types, and
 * the checks of a request's shape against the limits (convert.h). */
#include "convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "log.h"

/* --- the reply arena --------------------------------------------------------- */

void *srv_arena_alloc(srv_arena *a, size_t bytes) {
  struct srv_arena_block *b = calloc(1, sizeof(*b) + bytes);
  if (!b) return NULL;
  b->next = a->head;
  a->head = b;
  return b + 1;
}

void srv_arena_free(srv_arena *a) {
  while (a->head) {
    struct srv_arena_block *b = a->head;
    a->head = b->next;
    free(b);
  }
}

/* --- request limits ------------------------------------------------------------ */

pd_code srv_check_ids(const srv_req_limits *l, size_t n, const char *what,
                      dev_status *st) {
  if (n > (size_t)l->max_ids_per_request)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%zu %s in one request; the limit max_ids_per_request "
                     "is %d",
                     n, what, l->max_ids_per_request);
  return PD_OK;
}

/* INVALID_ARGUMENT naming `what` and the byte where `s` stops being UTF-8
 * (or, unless `controls`, has a control character). */
static pd_code srv_check_text(const char *s, bool controls, const char *what,
                              dev_status *st) {
  const char *why = "";
  long at = srv_log_text_check(s, controls, &why);
  if (at < 0) return PD_OK;
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: byte %ld (0x%02X) %s; expected UTF-8 text%s (proto3 "
                   "strings are UTF-8)",
                   what, at, (unsigned)(unsigned char)s[at], why,
                   controls ? "" : " without control characters");
}

pd_code srv_check_name(const srv_req_limits *l, const char *s, bool printable,
                       const char *what, dev_status *st) {
  size_t n = strlen(s), max = (size_t)l->max_string_bytes;
  bool bad = false;
  for (size_t i = 0; printable && n <= max && i < n; i++)
    if (s[i] < 0x20 || s[i] > 0x7e) bad = true;
  if (n == 0 || n > max || bad)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s of %zu bytes%s; expected 1 to max_string_bytes = %zu "
                     "bytes%s",
                     what, n, bad ? " with unprintable bytes" : "", max,
                     printable ? " of printable ASCII" : "");
  return printable ? PD_OK : srv_check_text(s, true, what, st);
}

/* INVALID_ARGUMENT naming `what` when `s` passes max_string_bytes. */
static pd_code srv_check_len(const srv_req_limits *l, const char *s,
                             const char *what, dev_status *st) {
  size_t n = s ? strlen(s) : 0;
  if (n > (size_t)l->max_string_bytes)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s is %zu bytes; the limit max_string_bytes is %d", what,
                     n, l->max_string_bytes);
  return PD_OK;
}

pd_code srv_check_string(const srv_req_limits *l, const char *s,
                         const char *what, dev_status *st) {
  PD_TRY(srv_check_len(l, s, what, st));
  return srv_check_text(s, true, what, st);
}

pd_code srv_check_label(const srv_req_limits *l, const char *s,
                        const char *what, dev_status *st) {
  PD_TRY(srv_check_len(l, s, what, st));
  return srv_check_text(s, false, what, st);
}

/* --- shapes, dtypes, tensors ------------------------------------------------------ */

pd_code srv_shape_from_pb(const Paradev__V1__Shape *pb, const char *what,
                          dev_shape *out, dev_status *st) {
  size_t rank = pb ? pb->n_dims : 0;
  if (rank > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s has rank %zu; the limit max_rank is %d", what, rank,
                     PD_MAX_RANK);
  dev_shape s = {(int)rank, {0}};
  for (size_t i = 0; i < rank; i++) {
    if (pb->dims[i] < 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: dim %zu is %lld; dims must be >= 0", what, i,
                       (long long)pb->dims[i]);
    s.dims[i] = pb->dims[i];
  }
  *out = s;
  return PD_OK;
}

Paradev__V1__Shape *srv_shape_to_pb(srv_arena *a, const dev_shape *s) {
  Paradev__V1__Shape *pb = srv_arena_alloc(a, sizeof(*pb));
  int64_t *dims = srv_arena_alloc(a, sizeof(int64_t) * PD_MAX_RANK);
  if (!pb || !dims) return NULL;
  paradev__v1__shape__init(pb);
  pb->n_dims = (size_t)s->rank;
  pb->dims = dims;
  for (int i = 0; i < s->rank; i++) dims[i] = s->dims[i];
  return pb;
}

pd_code srv_dtype_from_pb(int v, const char *what, pd_dtype *out,
                          dev_status *st) {
  if (v <= PD_DTYPE_INVALID || v >= PD_DTYPE_COUNT) {
    char names[128];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: dtype %d is not a valid dtype; expected one of %s "
                     "(DType 1 to %d)",
                     what, v, pdcom_dtype_list(names, sizeof(names)),
                     PD_DTYPE_COUNT - 1);
  }
  *out = (pd_dtype)v;
  return PD_OK;
}

Paradev__V1__TensorInfo *srv_info_to_pb(srv_arena *a, uint64_t id, pd_dtype dt,
                                        const dev_shape *shape,
                                        const dev_devset *devices) {
  Paradev__V1__TensorInfo *ti = srv_arena_alloc(a, sizeof(*ti));
  if (!ti) return NULL;
  paradev__v1__tensor_info__init(ti);
  ti->id = id;
  ti->dtype = (Paradev__V1__DType)dt;
  ti->shape = srv_shape_to_pb(a, shape);
  if (devices && !srv_devset_to_arena(a, devices, &ti->n_devices, &ti->devices))
    return NULL;
  return ti->shape ? ti : NULL;
}

Paradev__V1__Shape **srv_shapes_to_pb(srv_arena *a, const dev_shape *shapes,
                                      int n) {
  Paradev__V1__Shape **out = srv_arena_alloc(a, sizeof(*out) * (size_t)(n + 1));
  for (int i = 0; out && i < n; i++)
    if (!(out[i] = srv_shape_to_pb(a, &shapes[i]))) return NULL;
  return out;
}

void srv_status_to_pb(const dev_status *st, char *msg,
                      Paradev__V1__Status *out) {
  paradev__v1__status__init(out);
  out->code = (int32_t)st->code;
  out->message = srv_log_utf8(st->msg, msg, DEV_STATUS_MSG_MAX);
}

/* --- device sets ------------------------------------------------------------------ */

pd_code srv_devset_from_pb(const srv_req_limits *l, const int32_t *devs,
                           size_t n, const char *what, dev_devset *room,
                           const dev_devset **out, dev_status *st) {
  *out = NULL;
  if (n == 0) return PD_OK;
  int ndev = l->num_devices;
  if (n > PD_MAX_DEVICES || n > (size_t)ndev)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s lists %zu devices: the mesh has %d (devices 0..%d), "
                     "each listed at most once",
                     what, n, ndev, ndev - 1);
  memset(room, 0, sizeof(*room));
  for (size_t i = 0; i < n; i++) {
    if (devs[i] < 0 || devs[i] >= ndev)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s[%zu] = %d: the mesh has devices 0..%d", what, i,
                       (int)devs[i], ndev - 1);
    for (size_t j = 0; j < i; j++)
      if (devs[j] == devs[i])
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "%s[%zu] = %d: device %d is listed at [%zu] "
                         "already; each device may appear once",
                         what, i, (int)devs[i], (int)devs[i], j);
    room->dev[i] = (uint8_t)devs[i];
  }
  room->n = (int)n;
  *out = room;
  return PD_OK;
}

size_t srv_devset_to_pb(const dev_devset *s, int32_t *out) {
  for (int i = 0; i < s->n; i++) out[i] = s->dev[i];
  return (size_t)s->n;
}

bool srv_devset_to_arena(srv_arena *a, const dev_devset *s, size_t *n,
                         int32_t **devs) {
  *n = 0;
  *devs = NULL;
  if (s->n <= 0) return true;
  int32_t *d = srv_arena_alloc(a, sizeof(*d) * (size_t)s->n);
  if (!d) return false;
  *n = srv_devset_to_pb(s, d);
  *devs = d;
  return true;
}

/* --- operations ------------------------------------------------------------------- */

/* Which op of the request an attr belongs to, for the messages, and the
 * string limit; what srv_op_from_pb's steps share. */
typedef struct srv_op_ctx {
  const char *kind; /* "op" (of a request), "node" (of a function) */
  int index;
  const char *name;
  size_t max_str;
} srv_op_ctx;

/* The op's name and its counts of inputs, attrs and output ids. */
static pd_code srv_op_check_counts(const srv_op_ctx *x,
                                   const Paradev__V1__Operation *pb,
                                   dev_status *st) {
  size_t nlen = strlen(x->name);
  if (nlen == 0 || nlen > x->max_str)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %d: the op name is %zu bytes; expected 1 to "
                     "max_string_bytes = %zu",
                     x->index, nlen, x->max_str);
  if (pb->n_inputs > DEV_MAX_INPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %d (%.64s): %zu inputs; the limit max_inputs_per_op "
                     "is %d",
                     x->index, x->name, pb->n_inputs, DEV_MAX_INPUTS);
  if (pb->n_attrs > DEV_MAX_ATTRS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %d (%.64s): %zu attrs; the limit max_attrs_per_op "
                     "is %d",
                     x->index, x->name, pb->n_attrs, DEV_MAX_ATTRS);
  if (pb->n_output_ids > DEV_MAX_OUTPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %d (%.64s): %zu output ids; no op has more than %d "
                     "outputs",
                     x->index, x->name, pb->n_output_ids, DEV_MAX_OUTPUTS);
  return PD_OK;
}

/* An int_list or float_list value, of at most DEV_ATTR_LIST_MAX values. */
static pd_code srv_attr_list_from_pb(const srv_op_ctx *x, const char *an,
                                     const Paradev__V1__AttrValue *v,
                                     dev_attr *out, dev_status *st) {
  bool is_int = v->value_case == PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST;
  size_t n = is_int ? (v->int_list ? v->int_list->n_values : 0)
                    : (v->float_list ? v->float_list->n_values : 0);
  if (n > DEV_ATTR_LIST_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s %d (%.64s): attr %.64s: a list of %zu values; "
                     "the limit max_list_length is %d",
                     x->kind, x->index, x->name, an, n, DEV_ATTR_LIST_MAX);
  if (is_int)
    *out =
        dev_attr_int_list(an, v->int_list ? v->int_list->values : NULL, (int)n);
  else
    *out = dev_attr_float_list(an, v->float_list ? v->float_list->values : NULL,
                               (int)n);
  return PD_OK;
}

/* The values that need a check of their own: a string, a dtype, a shape.
 * The wire's value case is one of those three. */
static pd_code srv_attr_checked_from_pb(const srv_op_ctx *x, const char *an,
                                        const Paradev__V1__AttrValue *v,
                                        dev_attr *out, dev_status *st) {
  dev_status inner = DEV_STATUS_INIT;
  if (v->value_case == PARADEV__V1__ATTR_VALUE__VALUE_S) {
    size_t sl = strlen(v->s);
    if (sl > x->max_str)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s %d (%.64s): attr %.64s: a string of %zu bytes; "
                       "the limit max_string_bytes is %zu",
                       x->kind, x->index, x->name, an, sl, x->max_str);
    *out = dev_attr_string(an, v->s);
  } else if (v->value_case == PARADEV__V1__ATTR_VALUE__VALUE_DTYPE) {
    pd_dtype dt = PD_DTYPE_INVALID;
    if (srv_dtype_from_pb((int)v->dtype, an, &dt, &inner) != PD_OK)
      return dev_error(st, inner.code, "%s %d (%.64s): attr %s", x->kind,
                       x->index, x->name, inner.msg);
    *out = dev_attr_dtype(an, dt);
  } else {
    dev_shape sh;
    if (srv_shape_from_pb(v->shape, an, &sh, &inner) != PD_OK)
      return dev_error(st, inner.code, "%s %d (%.64s): attr %s", x->kind,
                       x->index, x->name, inner.msg);
    *out = dev_attr_shape(an, sh.rank, sh.dims);
  }
  return PD_OK;
}

/* Attr `i` of the op: its name, then its value by the wire's value case. */
static pd_code srv_attr_from_pb(const srv_op_ctx *x, size_t i,
                                const Paradev__V1__Attr *a, dev_attr *out,
                                dev_status *st) {
  const char *an = a->name ? a->name : "";
  if (strlen(an) == 0 || strlen(an) > x->max_str)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s %d (%.64s): attr %zu has a name of %zu bytes; "
                     "expected 1 to max_string_bytes = %zu",
                     x->kind, x->index, x->name, i, strlen(an), x->max_str);
  const Paradev__V1__AttrValue *v = a->value;
  int vc = v ? (int)v->value_case : 0;
  switch (vc) {
    case PARADEV__V1__ATTR_VALUE__VALUE_I:
      *out = dev_attr_int(an, v->i);
      return PD_OK;
    case PARADEV__V1__ATTR_VALUE__VALUE_F:
      *out = dev_attr_float(an, v->f);
      return PD_OK;
    case PARADEV__V1__ATTR_VALUE__VALUE_B:
      *out = dev_attr_bool(an, v->b != 0);
      return PD_OK;
    case PARADEV__V1__ATTR_VALUE__VALUE_S:
    case PARADEV__V1__ATTR_VALUE__VALUE_DTYPE:
    case PARADEV__V1__ATTR_VALUE__VALUE_SHAPE:
      return srv_attr_checked_from_pb(x, an, v, out, st);
    case PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST:
    case PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST:
      return srv_attr_list_from_pb(x, an, v, out, st);
    default:
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s %d (%.64s): attr %.64s has no value (set one of "
                       "i, f, b, s, dtype, shape, int_list, float_list)",
                       x->kind, x->index, x->name, an);
  }
}

pd_code srv_op_from_pb(const srv_req_limits *l,
                       const Paradev__V1__Operation *pb, int index,
                       dev_attr *attrs, dev_devset *set, sched_op *out,
                       dev_status *st) {
  srv_op_ctx x = {"op", index, pb->op ? pb->op : "",
                  (size_t)l->max_string_bytes};
  PD_TRY(srv_op_check_counts(&x, pb, st));
  for (size_t i = 0; i < pb->n_attrs; i++)
    PD_TRY(srv_attr_from_pb(&x, i, pb->attrs[i], &attrs[i], st));
  out->op_name = x.name;
  out->inputs = pb->inputs;
  out->num_inputs = (int)pb->n_inputs;
  out->attrs = attrs;
  out->num_attrs = (int)pb->n_attrs;
  out->output_ids = pb->output_ids;
  out->num_outputs = (int)pb->n_output_ids;
  /* Placement (issue #17): Operation.devices, NULL (the session's default)
   * when empty. */
  out->devices = NULL;
  if (!pb->n_devices) return PD_OK;
  char what[96];
  snprintf(what, sizeof what, "op %d (%.64s): Operation.devices", index,
           x.name);
  return srv_devset_from_pb(l, pb->devices, pb->n_devices, what, set,
                            &out->devices, st);
}

pd_code srv_attrs_from_pb(const srv_req_limits *l, const char *kind, int index,
                          const char *name, Paradev__V1__Attr *const *attrs,
                          size_t n, dev_attr *out, dev_status *st) {
  srv_op_ctx x = {kind, index, name ? name : "", (size_t)l->max_string_bytes};
  if (n > DEV_MAX_ATTRS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s %d (%.64s): %zu attrs; the limit max_attrs_per_op "
                     "is %d",
                     kind, index, x.name, n, DEV_MAX_ATTRS);
  for (size_t i = 0; i < n; i++)
    PD_TRY(srv_attr_from_pb(&x, i, attrs[i], &out[i], st));
  return PD_OK;
}

Paradev__V1__OpResult *srv_result_to_pb(srv_arena *a, const sched_op *op,
                                        const sched_op_result *r) {
  Paradev__V1__OpResult *pr = srv_arena_alloc(a, sizeof(*pr));
  Paradev__V1__TensorInfo **outs =
      srv_arena_alloc(a, sizeof(*outs) * (size_t)(r->num_outputs + 1));
  if (!pr || !outs) return NULL;
  paradev__v1__op_result__init(pr);
  for (int j = 0; j < r->num_outputs; j++) {
    outs[j] = srv_info_to_pb(a, op->output_ids[j], sched_result_dtype(r, j),
                             sched_result_shape(r, j), NULL);
    if (!outs[j]) return NULL;
  }
  pr->n_outputs = (size_t)r->num_outputs;
  pr->outputs = outs;
  return pr;
}

bool srv_op_infos_fill(srv_op_infos *o, srv_arena *a, const sched_op *op,
                       const sched_op_result *r) {
  o->ptrs = o->local;
  o->n = 0;
  if (r->num_outputs > SCHED_RESULT_INLINE) {
    Paradev__V1__OpResult *pr = srv_result_to_pb(a, op, r);
    if (!pr) return false;
    o->ptrs = pr->outputs;
    o->n = pr->n_outputs;
    return true;
  }
  for (int j = 0; j < r->num_outputs; j++) {
    const dev_shape *sh = &r->shape[j];
    paradev__v1__shape__init(&o->shape[j]);
    o->shape[j].n_dims = (size_t)sh->rank;
    o->shape[j].dims = o->dims[j];
    for (int k = 0; k < sh->rank; k++) o->dims[j][k] = sh->dims[k];
    paradev__v1__tensor_info__init(&o->info[j]);
    o->info[j].id = op->output_ids[j];
    o->info[j].dtype = (Paradev__V1__DType)r->dtype[j];
    o->info[j].shape = &o->shape[j];
    o->local[j] = &o->info[j];
  }
  o->n = (size_t)r->num_outputs;
  return true;
}

/* --- transfers ------------------------------------------------------------------- */

pd_code srv_upload_spec_from_pb(int ndev, uint64_t max_tensor, int dtype,
                                const Paradev__V1__Shape *shape,
                                const Paradev__V1__Layout *layout,
                                size_t n_component_shapes,
                                Paradev__V1__Shape *const *component_shapes,
                                srv_upload_spec *out, dev_status *st) {
  srv_upload_spec *u = out;
  u->host = (dev_shape){0, {0}};
  u->layout = (dev_layout){DEV_LAYOUT_MIRRORED, 0, 0};
  u->total = 0;
  PD_TRY(srv_dtype_from_pb(dtype, "header", &u->dtype, st));
  if (layout) {
    switch ((int)layout->kind) {
      /* UNSPECIFIED is MIRRORED on the way in: one host value for every
       * device is unambiguous, and it is what older clients' zero meant. */
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_UNSPECIFIED:
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_MIRRORED: break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_SHARDED:
        u->layout.kind = DEV_LAYOUT_SHARDED;
        u->layout.axis = layout->axis;
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_PER_COMPONENT:
        u->layout.kind = DEV_LAYOUT_PER_COMPONENT;
        break;
      default:
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "upload layout kind %d; expected MIRRORED (1), "
                         "SHARDED (2) or PER_COMPONENT (3)",
                         (int)layout->kind);
    }
  }
  if (u->layout.kind == DEV_LAYOUT_PER_COMPONENT) {
    if (n_component_shapes != (size_t)ndev)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "a PER_COMPONENT upload needs %d component_shapes (one "
                       "per device); got %zu",
                       ndev, n_component_shapes);
    for (int i = 0; i < ndev; i++) {
      size_t b = 0;
      PD_TRY(srv_shape_from_pb(component_shapes[i], "component shape",
                               &u->comps[i], st));
      PD_TRY(dev_shape_byte_size(u->dtype, &u->comps[i], &b, st));
      if (u->total + b < u->total)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "the component shapes' bytes add up past 2^64");
      u->total += b;
    }
  } else {
    size_t b = 0;
    PD_TRY(srv_shape_from_pb(shape, "shape", &u->host, st));
    PD_TRY(dev_shape_byte_size(u->dtype, &u->host, &b, st));
    u->total = b;
    if (u->layout.kind == DEV_LAYOUT_SHARDED && u->host.rank == 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "a SHARDED upload along axis %d of a scalar (rank 0): "
                       "a scalar has no axis to shard; upload it MIRRORED, "
                       "or give it rank >= 1",
                       u->layout.axis);
  }
  if (u->total > max_tensor)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the upload holds %llu bytes; the limit max_tensor_bytes "
                     "is %llu",
                     (unsigned long long)u->total,
                     (unsigned long long)max_tensor);
  return PD_OK;
}

#define SRV_DOWNLOAD_LAYOUTS_MSG                                               \
  "expected MIRRORED (1: component 0, for a mirrored tensor), SHARDED (2: "    \
  "the components concatenated along `axis`), PER_COMPONENT (3: each "         \
  "component) or COMPONENT (4: component `component`)"

pd_code srv_download_layout_from_pb(const Paradev__V1__Layout *pb, int ndev,
                                    dev_layout *out, int *num_parts,
                                    dev_status *st) {
  dev_layout l = {DEV_LAYOUT_MIRRORED, 0, 0};
  int parts = 1;
  if (!pb || pb->kind == PARADEV__V1__LAYOUT_KIND__LAYOUT_UNSPECIFIED)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "the download's layout is unspecified (LayoutKind 0, "
                     "the default: paradevd does not guess); %s",
                     SRV_DOWNLOAD_LAYOUTS_MSG);
  {
    switch ((int)pb->kind) {
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_MIRRORED: break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_SHARDED:
        l.kind = DEV_LAYOUT_SHARDED;
        l.axis = pb->axis;
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_PER_COMPONENT:
        l.kind = DEV_LAYOUT_PER_COMPONENT;
        parts = ndev;
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_COMPONENT:
        l.kind = DEV_LAYOUT_COMPONENT;
        l.component = pb->component;
        if (pb->component < 0 || pb->component >= ndev)
          return dev_error(st, PD_INVALID_ARGUMENT,
                           "component %d; the tensor has components 0..%d "
                           "(one per device of its set)",
                           pb->component, ndev - 1);
        break;
      default:
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "download layout kind %d is unknown; %s",
                         (int)pb->kind, SRV_DOWNLOAD_LAYOUTS_MSG);
    }
  }
  *out = l;
  *num_parts = parts;
  return PD_OK;
}

static size_t srv_varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *srv_put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

/* DownloadResponse{chunk (2): DownloadChunk{component (1), offset (2),
 * data (3)}}, defaults omitted as proto3 does. */
static size_t srv_chunk_inner(int component, uint64_t offset, size_t len) {
  uint64_t ucomp = (uint64_t)component;
  size_t inner = 1 + srv_varint_len(len) + len;
  if (ucomp) inner += 1 + srv_varint_len(ucomp);
  if (offset) inner += 1 + srv_varint_len(offset);
  return inner;
}

size_t srv_chunk_header_len(int component, uint64_t offset, size_t len) {
  size_t inner = srv_chunk_inner(component, offset, len);
  return 1 + srv_varint_len(inner) + inner - len;
}

uint8_t *srv_chunk_header(uint8_t *p, int component, uint64_t offset,
                          size_t len) {
  uint64_t ucomp = (uint64_t)component;
  *p++ = 0x12;
  p = srv_put_varint(p, srv_chunk_inner(component, offset, len));
  if (ucomp) {
    *p++ = 0x08;
    p = srv_put_varint(p, ucomp);
  }
  if (offset) {
    *p++ = 0x10;
    p = srv_put_varint(p, offset);
  }
  *p++ = 0x1a;
  return srv_put_varint(p, len);
}

/* --- the op reference (ListOps) ------------------------------------------------ */

static char *srv_str_or_empty(const char *s) { return (char *)(s ? s : ""); }

static Paradev__V1__ArgDef *srv_arg_to_pb(const dev_op_arg_info *ai,
                                          srv_arena *a) {
  Paradev__V1__ArgDef *pb = srv_arena_alloc(a, sizeof *pb);
  Paradev__V1__DType *dts =
      srv_arena_alloc(a, sizeof *dts * (size_t)PD_DTYPE_COUNT);
  if (!pb || !dts) return NULL;
  paradev__v1__arg_def__init(pb);
  pb->name = srv_str_or_empty(ai->name);
  pb->is_list = ai->is_list;
  pb->min_length = ai->min_len;
  for (int dt = 1; dt < PD_DTYPE_COUNT; dt++)
    if (ai->dtypes & (1u << dt)) dts[pb->n_dtypes++] = (Paradev__V1__DType)dt;
  pb->dtypes = dts;
  pb->dtype_rule = srv_str_or_empty(ai->dtype_rule);
  pb->doc = srv_str_or_empty(ai->doc);
  pb->length_attr = srv_str_or_empty(ai->length_attr);
  return pb;
}

/* The default's value; the arrays point into the registry's static data. */
Paradev__V1__AttrValue *srv_attr_value_to_pb(const dev_attr_value *v,
                                             srv_arena *a) {
  Paradev__V1__AttrValue *pb = srv_arena_alloc(a, sizeof *pb);
  if (!pb) return NULL;
  paradev__v1__attr_value__init(pb);
  switch (v->type) {
    case DEV_ATTR_INT:
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_I;
      pb->i = v->u.i;
      break;
    case DEV_ATTR_FLOAT:
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_F;
      pb->f = v->u.f;
      break;
    case DEV_ATTR_BOOL:
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_B;
      pb->b = v->u.b;
      break;
    case DEV_ATTR_STRING: {
      char *s = srv_arena_alloc(a, v->u.s.len + 1);
      if (!s) return NULL;
      memcpy(s, v->u.s.ptr, v->u.s.len);
      s[v->u.s.len] = '\0';
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_S;
      pb->s = s;
      break;
    }
    case DEV_ATTR_DTYPE:
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_DTYPE;
      pb->dtype = (Paradev__V1__DType)v->u.dtype;
      break;
    case DEV_ATTR_SHAPE: {
      Paradev__V1__Shape *sh = srv_arena_alloc(a, sizeof *sh);
      if (!sh) return NULL;
      paradev__v1__shape__init(sh);
      sh->n_dims = (size_t)v->u.shape.rank;
      sh->dims = (int64_t *)v->u.shape.dims;
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_SHAPE;
      pb->shape = sh;
      break;
    }
    case DEV_ATTR_INT_LIST: {
      Paradev__V1__IntList *l = srv_arena_alloc(a, sizeof *l);
      if (!l) return NULL;
      paradev__v1__int_list__init(l);
      l->n_values = (size_t)v->u.ilist.n;
      l->values = (int64_t *)v->u.ilist.v;
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST;
      pb->int_list = l;
      break;
    }
    case DEV_ATTR_FLOAT_LIST: {
      Paradev__V1__FloatList *l = srv_arena_alloc(a, sizeof *l);
      if (!l) return NULL;
      paradev__v1__float_list__init(l);
      l->n_values = (size_t)v->u.flist.n;
      l->values = (double *)v->u.flist.v;
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST;
      pb->float_list = l;
      break;
    }
    case DEV_ATTR_NONE: break;
  }
  return pb;
}

static Paradev__V1__AttrDef *srv_attr_def_to_pb(const dev_op_attr_info *ai,
                                                srv_arena *a) {
  Paradev__V1__AttrDef *pb = srv_arena_alloc(a, sizeof *pb);
  if (!pb) return NULL;
  paradev__v1__attr_def__init(pb);
  pb->name = srv_str_or_empty(ai->name);
  pb->kind = (Paradev__V1__AttrKind)ai->type;
  if (ai->has_default &&
      !(pb->default_value = srv_attr_value_to_pb(&ai->default_value, a)))
    return NULL;
  pb->has_minimum = ai->has_min;
  pb->minimum = ai->min;
  pb->has_maximum = ai->has_max;
  pb->maximum = ai->max;
  size_t n = 0;
  while (ai->allowed && ai->allowed[n]) n++;
  pb->n_allowed_values = n;
  pb->allowed_values = (char **)ai->allowed;
  pb->doc = srv_str_or_empty(ai->doc);
  return pb;
}

Paradev__V1__OpDef *srv_op_def_to_pb(const dev_op_def *def, srv_arena *a) {
  Paradev__V1__OpDef *pb = srv_arena_alloc(a, sizeof *pb);
  int ni = dev_op_def_num_inputs(def), no = dev_op_def_num_outputs(def),
      na = dev_op_def_num_attrs(def);
  Paradev__V1__ArgDef **in = srv_arena_alloc(a, sizeof *in * (size_t)(ni + 1));
  Paradev__V1__ArgDef **out =
      srv_arena_alloc(a, sizeof *out * (size_t)(no + 1));
  Paradev__V1__AttrDef **at = srv_arena_alloc(a, sizeof *at * (size_t)(na + 1));
  if (!pb || !in || !out || !at) return NULL;
  paradev__v1__op_def__init(pb);
  pb->name = (char *)dev_op_def_name(def);
  pb->summary = (char *)dev_op_def_summary(def);
  pb->notes = (char *)dev_op_def_notes(def);
  dev_op_arg_info ai;
  dev_op_attr_info ti;
  for (int i = 0; i < ni; i++)
    if (!dev_op_def_input(def, i, &ai) || !(in[i] = srv_arg_to_pb(&ai, a)))
      return NULL;
  for (int i = 0; i < no; i++)
    if (!dev_op_def_output(def, i, &ai) || !(out[i] = srv_arg_to_pb(&ai, a)))
      return NULL;
  for (int i = 0; i < na; i++)
    if (!dev_op_def_attr(def, i, &ti) || !(at[i] = srv_attr_def_to_pb(&ti, a)))
      return NULL;
  pb->n_inputs = (size_t)ni;
  pb->inputs = in;
  pb->n_outputs = (size_t)no;
  pb->outputs = out;
  pb->n_attrs = (size_t)na;
  pb->attrs = at;
  pb->has_gradient = dev_op_def_has_gradient(def);
  pb->is_collective = dev_op_def_is_collective(def);
  return pb;
}
