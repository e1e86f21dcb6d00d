/* libparadev: checkpoints (include/paradev/checkpoint.h): LoadTensors,
 * GetLoadProgress and SaveTensors, each one unary call. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

/* Ids reserved for a load of every tensor of a file: the daemon's limit of
 * tensors per load. */
#define PDC_LOAD_ID_BLOCK 4096

struct pd_load {
  uint64_t load_id, total_bytes;
  int n;
  char (*names)[PD_CHECKPOINT_NAME_MAX];
  pd_tensor_info *infos;
  pd_tensor_info *hosts; /* rank -1: none */
};

/* A checkpoint tensor's layout on the wire, as given: the daemon decides
 * what each kind means there (UNSPECIFIED loads MIRRORED and is refused for
 * a save) and refuses the kinds a checkpoint cannot take, as for Download. */
static void pdc_ckpt_layout(pd_layout in, Paradev__V1__Layout *out) {
  paradev__v1__layout__init(out);
  out->kind = (Paradev__V1__LayoutKind)in.kind;
  out->axis = in.axis;
}

/* The request's specs, in `specs_pb` and `lay` (n each). */
static pd_code pdc_load_specs(pd_session *s, const pd_load_spec *specs, int n,
                              Paradev__V1__LoadTensorSpec *pb,
                              Paradev__V1__LoadTensorSpec **ptrs,
                              Paradev__V1__Layout *lay, pd_status *st) {
  for (int i = 0; i < n; i++) {
    const pd_load_spec *sp = &specs[i];
    paradev__v1__load_tensor_spec__init(&pb[i]);
    pdc_ckpt_layout(sp->layout, &lay[i]);
    if (sp->n_component_sources < 0 ||
        (sp->n_component_sources > 0 && !sp->component_sources))
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "tensor %d: %d component sources (sources %s)", i,
                       sp->n_component_sources,
                       sp->component_sources ? "given" : "NULL");
    char what[48];
    snprintf(what, sizeof(what), "pd_load_tensors: spec %d", i);
    PD_TRY(pdc_check_devices(sp->devices, sp->n_devices, what, st));
    pb[i].n_devices = (size_t)sp->n_devices;
    pb[i].devices = sp->n_devices ? (int32_t *)sp->devices : NULL;
    pb[i].name = (char *)(sp->name ? sp->name : "");
    pb[i].id = sp->id ? sp->id : pd_session_new_id(s);
    pb[i].layout = &lay[i];
    pb[i].n_component_sources = (size_t)sp->n_component_sources;
    pb[i].component_sources = (char **)sp->component_sources;
    ptrs[i] = &pb[i];
  }
  return PD_OK;
}

/* The reply as a pd_load. */
static pd_code pdc_load_from_pb(const Paradev__V1__LoadTensorsResponse *r,
                                pd_load **out, pd_status *st) {
  pd_load *l = calloc(1, sizeof(*l));
  size_t n = r->n_tensors;
  if (l && n) {
    l->names = calloc(n, sizeof(*l->names));
    l->infos = calloc(n, sizeof(*l->infos));
    l->hosts = calloc(n, sizeof(*l->hosts));
  }
  if (!l || (n && (!l->names || !l->infos || !l->hosts))) {
    pd_load_delete(l);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (size_t i = 0; i < n; i++) {
    const Paradev__V1__LoadedTensor *t = r->tensors[i];
    if (!pdc_info_from_pb(t->tensor, &l->infos[i])) {
      pd_load_delete(l);
      return pdc_error(st, PD_INTERNAL,
                       "LoadTensors: the reply's tensor %zu has no info, a "
                       "rank over %d or over %d devices",
                       i, PD_MAX_RANK, PD_MAX_DEVICES);
    }
    snprintf(l->names[i], sizeof(l->names[i]), "%s", t->name ? t->name : "");
    l->hosts[i].rank = -1;
    if (t->host_shape && !pdc_shape_from_pb(t->host_shape, &l->hosts[i]))
      l->hosts[i].rank = -1;
  }
  l->n = (int)n;
  l->load_id = r->load_id;
  l->total_bytes = r->total_bytes;
  *out = l;
  return PD_OK;
}

pd_code pd_load_tensors(pd_session *s, const char *source,
                        const pd_load_spec *specs, int n,
                        const pd_load_options *opts, pd_load **out,
                        const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  pd_load_options o = PD_LOAD_OPTIONS_INITIALIZER;
  if (opts) {
    /* The size before issue #17's default_devices is still accepted. */
    if (opts->struct_size != sizeof(o) &&
        opts->struct_size != offsetof(pd_load_options, default_devices))
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "pd_load_options.struct_size %zu; expected %zu (start "
                       "from PD_LOAD_OPTIONS_INITIALIZER)",
                       opts->struct_size, sizeof(o));
    memcpy(&o, opts, opts->struct_size);
  }
  PD_TRY(pdc_check_devices(o.default_devices, o.n_default_devices,
                           "pd_load_options.default_devices", st));
  if (!source || !out || n < 0 || (n > 0 && !specs))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_load_tensors needs a source, an out pointer and n "
                     ">= 0 specs (got n = %d)",
                     n);
  Paradev__V1__LoadTensorSpec *pb = calloc((size_t)n + 1, sizeof(*pb));
  Paradev__V1__LoadTensorSpec **ptrs = calloc((size_t)n + 1, sizeof(*ptrs));
  Paradev__V1__Layout *lay = calloc((size_t)n + 1, sizeof(*lay));
  Paradev__V1__LoadTensorsResponse *resp = NULL;
  pd_code rc = PD_OK;
  if (!pb || !ptrs || !lay) {
    rc = pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto out;
  }
  PD_TRY_GOTO(pdc_load_specs(s, specs, n, pb, ptrs, lay, st), rc, out);
  Paradev__V1__Layout dl;
  pdc_ckpt_layout(o.default_layout, &dl);
  Paradev__V1__LoadTensorsRequest req = PARADEV__V1__LOAD_TENSORS_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.source = (char *)source;
  req.format = (Paradev__V1__CheckpointFormat)o.format;
  req.n_tensors = (size_t)n;
  req.tensors = ptrs;
  req.default_layout = &dl;
  req.first_id = o.first_id;
  req.n_default_devices = (size_t)o.n_default_devices;
  req.default_devices =
      o.n_default_devices ? (int32_t *)o.default_devices : NULL;
  if (n == 0 && !req.first_id)
    req.first_id = atomic_fetch_add(&s->next_id, PDC_LOAD_ID_BLOCK);
  PD_TRY_GOTO(pdc_unary(s->c, PDC_M_LoadTensors, &req.base,
                        &paradev__v1__load_tensors_response__descriptor,
                        (ProtobufCMessage **)&resp, call, st),
              rc, out);
  pdc_session_touch(s);
  rc = pdc_load_from_pb(resp, out, st);
  if (rc == PD_OK) pdc_ok(st);
out:
  if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
  free(pb);
  free(ptrs);
  free(lay);
  return rc;
}

void pd_load_delete(pd_load *l) {
  if (!l) return;
  free(l->names);
  free(l->infos);
  free(l->hosts);
  free(l);
}

bool pd_load_tensor_host_shape(const pd_load *l, int i, int *rank,
                               int64_t dims[PD_MAX_RANK]) {
  if (!l || i < 0 || i >= l->n || l->hosts[i].rank < 0 || !rank || !dims)
    return false;
  *rank = l->hosts[i].rank;
  for (int k = 0; k < *rank; k++) dims[k] = l->hosts[i].dims[k];
  return true;
}

uint64_t pd_load_id(const pd_load *l) { return l ? l->load_id : 0; }
uint64_t pd_load_total_bytes(const pd_load *l) {
  return l ? l->total_bytes : 0;
}
int pd_load_num_tensors(const pd_load *l) { return l ? l->n : 0; }

const char *pd_load_tensor_name(const pd_load *l, int i) {
  return l && i >= 0 && i < l->n ? l->names[i] : NULL;
}

bool pd_load_tensor_info(const pd_load *l, int i, pd_tensor_info *out) {
  if (!l || i < 0 || i >= l->n || !out) return false;
  *out = l->infos[i];
  return true;
}

pd_code pd_load_progress(pd_session *s, uint64_t load_id, uint32_t wait_ms,
                         pd_load_progress_info *out,
                         const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  if (!out)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_load_progress needs an out pointer");
  Paradev__V1__GetLoadProgressRequest req =
      PARADEV__V1__GET_LOAD_PROGRESS_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.load_id = load_id;
  req.wait_ms = wait_ms;
  Paradev__V1__GetLoadProgressResponse *r = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_GetLoadProgress, &req.base,
                   &paradev__v1__get_load_progress_response__descriptor,
                   (ProtobufCMessage **)&r, call, st));
  pdc_session_touch(s);
  pd_load_progress_info p;
  memset(&p, 0, sizeof(p));
  p.bytes_done = r->bytes_done;
  p.bytes_total = r->bytes_total;
  p.tensors_done = r->tensors_done;
  p.tensors_total = r->tensors_total;
  p.tensors_failed = r->tensors_failed;
  p.done = r->done;
  if (r->status && r->status->code) {
    p.code = pdc_code_from_wire(r->status->code);
    snprintf(p.message, sizeof(p.message), "%s",
             r->status->message ? r->status->message : "");
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  *out = p;
  pdc_ok(st);
  return PD_OK;
}

/* The request's specs and metadata; arrays of n (n_meta) in `buf`. */
typedef struct pdc_save_bufs {
  Paradev__V1__SaveTensorSpec *specs, **sptrs;
  Paradev__V1__Layout *lay;
  Paradev__V1__MetadataEntry *meta, **mptrs;
} pdc_save_bufs;

static void pdc_save_bufs_free(pdc_save_bufs *b) {
  free(b->specs);
  free(b->sptrs);
  free(b->lay);
  free(b->meta);
  free(b->mptrs);
}

static pd_code pdc_save_fill(const pd_save_spec *specs, int n,
                             const pd_save_options *o, pdc_save_bufs *b,
                             pd_status *st) {
  size_t nm = (size_t)o->n_meta;
  b->specs = calloc((size_t)n, sizeof(*b->specs));
  b->sptrs = calloc((size_t)n, sizeof(*b->sptrs));
  b->lay = calloc((size_t)n, sizeof(*b->lay));
  b->meta = calloc(nm + 1, sizeof(*b->meta));
  b->mptrs = calloc(nm + 1, sizeof(*b->mptrs));
  if (!b->specs || !b->sptrs || !b->lay || !b->meta || !b->mptrs)
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < n; i++) {
    paradev__v1__save_tensor_spec__init(&b->specs[i]);
    pdc_ckpt_layout(specs[i].layout, &b->lay[i]);
    b->specs[i].name = (char *)(specs[i].name ? specs[i].name : "");
    b->specs[i].id = specs[i].id;
    b->specs[i].layout = &b->lay[i];
    b->sptrs[i] = &b->specs[i];
  }
  for (size_t i = 0; i < nm; i++) {
    paradev__v1__metadata_entry__init(&b->meta[i]);
    if (!o->meta_keys[i] || !o->meta_values[i])
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "metadata entry %zu has a NULL key or value", i);
    b->meta[i].key = (char *)o->meta_keys[i];
    b->meta[i].value = (char *)o->meta_values[i];
    b->mptrs[i] = &b->meta[i];
  }
  return PD_OK;
}

pd_code pd_save_tensors(pd_session *s, const char *path,
                        const pd_save_spec *specs, int n,
                        const pd_save_options *opts, uint64_t *bytes_written,
                        const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  pd_save_options o = PD_SAVE_OPTIONS_INITIALIZER;
  if (opts) {
    size_t old_size = offsetof(pd_save_options, path_out);
    if (opts->struct_size != sizeof(o) && opts->struct_size != old_size)
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "pd_save_options.struct_size %zu; expected %zu (start "
                       "from PD_SAVE_OPTIONS_INITIALIZER)",
                       opts->struct_size, sizeof(o));
    memcpy(&o, opts, opts->struct_size);
  }
  if (!path || n < 1 || !specs || o.n_meta < 0 ||
      (o.n_meta > 0 && (!o.meta_keys || !o.meta_values)))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_save_tensors needs a path, n >= 1 specs (got %d) and "
                     "n_meta >= 0 keys and values (got %d)",
                     n, o.n_meta);
  pdc_save_bufs b = {0};
  Paradev__V1__SaveTensorsResponse *resp = NULL;
  pd_code rc = pdc_save_fill(specs, n, &o, &b, st);
  if (rc != PD_OK) goto out;
  Paradev__V1__SaveTensorsRequest req = PARADEV__V1__SAVE_TENSORS_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.path = (char *)path;
  req.n_tensors = (size_t)n;
  req.tensors = b.sptrs;
  req.n_metadata = (size_t)o.n_meta;
  req.metadata = b.mptrs;
  req.overwrite = o.overwrite;
  req.format = (Paradev__V1__CheckpointFormat)o.format;
  PD_TRY_GOTO(pdc_unary(s->c, PDC_M_SaveTensors, &req.base,
                        &paradev__v1__save_tensors_response__descriptor,
                        (ProtobufCMessage **)&resp, call, st),
              rc, out);
  pdc_session_touch(s);
  if (bytes_written) *bytes_written = resp->bytes_written;
  if (o.path_out && o.path_cap)
    snprintf(o.path_out, o.path_cap, "%s",
             resp->path && resp->path[0] ? resp->path : path);
  pdc_ok(st);
out:
  if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
  pdc_save_bufs_free(&b);
  return rc;
}
