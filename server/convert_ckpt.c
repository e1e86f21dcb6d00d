/* Conversions of the checkpoint methods (LoadTensors, GetLoadProgress,
 * SaveTensors) and their request-shape limits, declared in convert.h with
 * the others: convert.c would pass 800 lines with them. Like convert.c it
 * depends on nothing else in server/ but convert.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "convert.h"
#include "log.h"

/* --- checkpoints ------------------------------------------------------------------ */

/* A source, path or component source: 1 to SRV_CKPT_PATH_MAX bytes (NUL
 * bytes never reach here: srv_unpack refuses them). */
static pd_code srv_ckpt_path_ok(const char *p, const char *what,
                                dev_status *st) {
  size_t n = p ? strlen(p) : 0;
  if (n == 0 || n > SRV_CKPT_PATH_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s of %zu bytes; expected a path beneath a storage root "
                     "or an http(s):// URL of 1 to %d bytes",
                     what, n, SRV_CKPT_PATH_MAX);
  return PD_OK;
}

/* A tensor's name in a checkpoint: up to max_string_bytes ("" allowed). */
static pd_code srv_ckpt_name_ok(const srv_req_limits *l, const char *name,
                                int i, dev_status *st) {
  size_t n = name ? strlen(name) : 0;
  if (n > (size_t)l->max_string_bytes)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor %d: a name of %zu bytes; the limit "
                     "max_string_bytes is %d",
                     i, n, l->max_string_bytes);
  return PD_OK;
}

/* A checkpoint tensor's layout. A load reads one host value, so no layout
 * (or UNSPECIFIED) is MIRRORED there, as for an upload; a save reads the
 * devices, where MIRRORED means component 0, so it must say, as a download
 * must (issue #12: layouts never guess). */
static pd_code srv_ckpt_layout_from_pb(const Paradev__V1__Layout *pb, int i,
                                       bool save, dev_layout *out,
                                       dev_status *st) {
  dev_layout l = {DEV_LAYOUT_MIRRORED, 0, 0};
  if (save && (!pb || pb->kind == PARADEV__V1__LAYOUT_KIND__LAYOUT_UNSPECIFIED))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor %d: no layout; a saved tensor is MIRRORED "
                     "(component 0, for a tensor the same on every device), "
                     "SHARDED (gathered along an axis) or PER_COMPONENT",
                     i);
  if (pb && (int)pb->kind != 0) {
    switch ((int)pb->kind) {
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_MIRRORED: break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_SHARDED:
        if (pb->axis < 0 || pb->axis >= PD_MAX_RANK)
          return dev_error(st, PD_INVALID_ARGUMENT,
                           "tensor %d: SHARDED along axis %d; expected an "
                           "axis from 0 to %d",
                           i, pb->axis, PD_MAX_RANK - 1);
        l.kind = DEV_LAYOUT_SHARDED;
        l.axis = pb->axis;
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_PER_COMPONENT:
        l.kind = DEV_LAYOUT_PER_COMPONENT;
        break;
      default:
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "tensor %d: layout kind %d; a checkpoint tensor is "
                         "MIRRORED, SHARDED or PER_COMPONENT",
                         i, (int)pb->kind);
    }
  }
  *out = l;
  return PD_OK;
}

static pd_code srv_ckpt_format_from_pb(int v, bool save, stg_format *out,
                                       dev_status *st) {
  if (v < STG_FORMAT_AUTO || v > (save ? STG_FORMAT_NPY : STG_FORMAT_NPZ))
    return dev_error(st, PD_INVALID_ARGUMENT, "format %d; expected %s", v,
                     save ? "AUTO (0), SAFETENSORS (1) or NPY (2)"
                          : "AUTO (0), SAFETENSORS (1), NPY (2) or NPZ (3)");
  *out = (stg_format)v;
  return PD_OK;
}

/* One LoadTensorSpec; `ndev`: the components of a tensor placed by
 * default, `set` room for its own placement (LoadTensorSpec.devices). */
static pd_code srv_load_spec_from_pb(const srv_req_limits *l, int ndev, int i,
                                     const Paradev__V1__LoadTensorSpec *pb,
                                     dev_devset *set, sched_load_tensor *out,
                                     dev_status *st) {
  PD_TRY(srv_ckpt_name_ok(l, pb->name, i, st));
  char what[64];
  snprintf(what, sizeof what, "tensor %d: LoadTensorSpec.devices", i);
  PD_TRY(srv_devset_from_pb(l, pb->devices, pb->n_devices, what, set,
                            &out->devices, st));
  if (out->devices) ndev = out->devices->n;
  PD_TRY(srv_ckpt_layout_from_pb(pb->layout, i, false, &out->layout, st));
  if (pb->n_component_sources && out->layout.kind != DEV_LAYOUT_PER_COMPONENT)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor %d: component_sources are for a PER_COMPONENT "
                     "layout only",
                     i);
  if (pb->n_component_sources && pb->n_component_sources != (size_t)ndev)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor %d: %zu component_sources; expected none or one "
                     "per device (%d)",
                     i, pb->n_component_sources, ndev);
  for (size_t k = 0; k < pb->n_component_sources; k++)
    PD_TRY(
        srv_ckpt_path_ok(pb->component_sources[k], "a component source", st));
  out->name = pb->name ? pb->name : "";
  out->id = pb->id;
  out->component_sources = (const char *const *)pb->component_sources;
  out->n_component_sources = (int)pb->n_component_sources;
  return PD_OK;
}

pd_code srv_load_from_pb(const srv_req_limits *l, int ndev,
                         const Paradev__V1__LoadTensorsRequest *pb,
                         sched_load_request *out, dev_status *st) {
  memset(out, 0, sizeof(*out));
  PD_TRY(srv_ckpt_path_ok(pb->source, "source", st));
  PD_TRY(srv_ckpt_format_from_pb((int)pb->format, false, &out->format, st));
  if (pb->n_tensors > SRV_CKPT_MAX_TENSORS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%zu tensors in one LoadTensors; the limit is %d",
                     pb->n_tensors, SRV_CKPT_MAX_TENSORS);
  PD_TRY(srv_ckpt_layout_from_pb(pb->default_layout, -1, false,
                                 &out->default_layout, st));
  if (pb->n_tensors == 0 &&
      out->default_layout.kind == DEV_LAYOUT_PER_COMPONENT)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "default_layout PER_COMPONENT: list the tensors (each "
                     "with its component sources) instead");
  /* The placements (issue #17) live with the tensors: one block, the sets
   * after the specs, and the request's default after them; freed with
   * them (srv_load_request_free). */
  size_t n = pb->n_tensors;
  char *block = calloc(1, n * (sizeof(sched_load_tensor) + sizeof(dev_devset)) +
                              sizeof(dev_devset));
  if (!block) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  sched_load_tensor *t = (sched_load_tensor *)block;
  dev_devset *sets = (dev_devset *)(block + n * sizeof(sched_load_tensor));
  pd_code rc = srv_devset_from_pb(l, pb->default_devices, pb->n_default_devices,
                                  "LoadTensorsRequest.default_devices",
                                  &sets[n], &out->default_devices, st);
  if (out->default_devices) ndev = out->default_devices->n;
  for (size_t i = 0; rc == PD_OK && i < n; i++)
    rc = srv_load_spec_from_pb(l, ndev, (int)i, pb->tensors[i], &sets[i], &t[i],
                               st);
  if (rc != PD_OK) {
    free(block);
    out->default_devices = NULL;
    return rc;
  }
  out->source = pb->source;
  out->tensors = t;
  out->n = (int)pb->n_tensors;
  out->first_id = pb->first_id;
  return PD_OK;
}

void srv_load_request_free(sched_load_request *r) {
  free((void *)r->tensors); /* and the placements after them */
  r->tensors = NULL;
  r->default_devices = NULL;
}

bool srv_loaded_to_pb(srv_arena *a, const sched_load_result *r,
                      Paradev__V1__LoadTensorsResponse *out) {
  Paradev__V1__LoadedTensor **v =
      srv_arena_alloc(a, sizeof(*v) * (size_t)(r->n + 1));
  Paradev__V1__LoadedTensor *lt =
      srv_arena_alloc(a, sizeof(*lt) * (size_t)(r->n + 1));
  if (!v || !lt) return false;
  for (int i = 0; i < r->n; i++) {
    const sched_loaded *x = &r->tensors[i];
    paradev__v1__loaded_tensor__init(&lt[i]);
    /* A name from the file (an .npz member's may be any bytes): proto3
     * strings are UTF-8, so other bytes become '?'. */
    char *name = srv_arena_alloc(a, sizeof(x->name));
    if (!name) return false;
    lt[i].name = srv_log_utf8(x->name, name, sizeof(x->name));
    lt[i].tensor = srv_info_to_pb(a, x->id, x->dtype, &x->shape, NULL);
    if (!lt[i].tensor) return false;
    v[i] = &lt[i];
  }
  out->n_tensors = (size_t)r->n;
  out->tensors = v;
  out->load_id = r->load_id;
  out->total_bytes = r->total_bytes;
  return true;
}

void srv_progress_to_pb(const sched_load_progress *p, char *msg,
                        Paradev__V1__Status *status,
                        Paradev__V1__GetLoadProgressResponse *out) {
  dev_status st = DEV_STATUS_INIT;
  st.code = p->code;
  snprintf(st.msg, sizeof(st.msg), "%s", p->message);
  srv_status_to_pb(&st, msg, status);
  paradev__v1__get_load_progress_response__init(out);
  out->bytes_done = p->bytes_done;
  out->bytes_total = p->bytes_total;
  out->tensors_done = p->tensors_done;
  out->tensors_total = p->tensors_total;
  out->tensors_failed = p->tensors_failed;
  out->done = p->done;
  out->status = status;
}

/* The metadata of a save: keys 1 to max_string_bytes, values up to it. */
static pd_code srv_save_meta_from_pb(const srv_req_limits *l,
                                     const Paradev__V1__SaveTensorsRequest *pb,
                                     sched_save_request *out, dev_status *st) {
  if (pb->n_metadata > SRV_CKPT_MAX_META)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%zu metadata entries; the limit is %d", pb->n_metadata,
                     SRV_CKPT_MAX_META);
  if (!pb->n_metadata) return PD_OK;
  const char **k = calloc(pb->n_metadata, sizeof(*k));
  const char **v = calloc(pb->n_metadata, sizeof(*v));
  out->meta_keys = k;
  out->meta_values = v;
  if (!k || !v)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t i = 0; i < pb->n_metadata; i++) {
    const Paradev__V1__MetadataEntry *e = pb->metadata[i];
    PD_TRY(
        srv_check_name(l, e->key ? e->key : "", false, "a metadata key", st));
    PD_TRY(srv_check_string(l, e->value, "a metadata value", st));
    k[i] = e->key;
    v[i] = e->value ? e->value : "";
  }
  out->n_meta = (int)pb->n_metadata;
  return PD_OK;
}

pd_code srv_save_from_pb(const srv_req_limits *l,
                         const Paradev__V1__SaveTensorsRequest *pb,
                         sched_save_request *out, dev_status *st) {
  memset(out, 0, sizeof(*out));
  PD_TRY(srv_ckpt_path_ok(pb->path, "path", st));
  PD_TRY(srv_ckpt_format_from_pb((int)pb->format, true, &out->format, st));
  if (pb->n_tensors == 0 || pb->n_tensors > SRV_CKPT_MAX_TENSORS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%zu tensors in one SaveTensors; expected 1 to %d",
                     pb->n_tensors, SRV_CKPT_MAX_TENSORS);
  sched_save_tensor *t = calloc(pb->n_tensors, sizeof(*t));
  out->tensors = t;
  if (!t) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t i = 0; i < pb->n_tensors; i++) {
    const Paradev__V1__SaveTensorSpec *sp = pb->tensors[i];
    PD_TRY(srv_ckpt_name_ok(l, sp->name, (int)i, st));
    PD_TRY(srv_ckpt_layout_from_pb(sp->layout, (int)i, true, &t[i].layout, st));
    t[i].name = sp->name ? sp->name : "";
    t[i].id = sp->id;
  }
  out->n = (int)pb->n_tensors;
  PD_TRY(srv_save_meta_from_pb(l, pb, out, st));
  out->path = pb->path;
  out->overwrite = pb->overwrite;
  return PD_OK;
}

void srv_save_request_free(sched_save_request *r) {
  free((void *)r->tensors);
  free((void *)r->meta_keys);
  free((void *)r->meta_values);
  r->tensors = NULL;
  r->meta_keys = r->meta_values = NULL;
}
