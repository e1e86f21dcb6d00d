/* libparadev: the handle calls of a session: Sync (wait for handles),
 * Describe (pd_description) and Delete. */
#include <inttypes.h>
#include <stdlib.h>

#include "check.h"
#include "client_int.h"

/* --- Sync, Describe, Delete ------------------------------------------------------- */

pd_code pd_sync(pd_session *s, const uint64_t *ids, int n, uint64_t *failed_id,
                const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  PD_TRY(pdc_check_ids(ids, n, st));
  pd_code rc = PD_OK;
  Paradev__V1__SyncRequest req = PARADEV__V1__SYNC_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.n_ids = (size_t)n;
  req.ids = (uint64_t *)ids;
  Paradev__V1__SyncResponse *resp = NULL;
  rc = pdc_unary(s->c, PDC_M_Sync, &req.base,
                 &paradev__v1__sync_response__descriptor,
                 (ProtobufCMessage **)&resp, call, st);
  if (rc != PD_OK) {
    if (failed_id) *failed_id = 0;
    return rc;
  }
  pdc_session_touch(s);
  const Paradev__V1__Status *e = resp->error;
  if (e && e->code != 0) {
    pd_code code = pdc_code_from_wire(e->code);
    rc = pdc_error(st, code, "handle %" PRIu64 " failed: %s", resp->failed_id,
                   e->message ? e->message : "");
    if (failed_id) *failed_id = resp->failed_id;
  } else {
    pdc_ok(st);
    if (failed_id) *failed_id = 0;
  }
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

struct pd_description {
  Paradev__V1__DescribeResponse *pb;
};

pd_description *pd_describe(pd_session *s, const uint64_t *ids, int n,
                            const pd_call_options *call, pd_status *st) {
  if (pdc_session_check(s, st) != PD_OK || pdc_check_ids(ids, n, st) != PD_OK)
    return NULL;
  Paradev__V1__DescribeRequest req = PARADEV__V1__DESCRIBE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.n_ids = (size_t)n;
  req.ids = (uint64_t *)ids;
  Paradev__V1__DescribeResponse *resp = NULL;
  if (pdc_unary(s->c, PDC_M_Describe, &req.base,
                &paradev__v1__describe_response__descriptor,
                (ProtobufCMessage **)&resp, call, st) != PD_OK)
    return NULL;
  pdc_session_touch(s);
  const char *bad = resp->n_tensors != (size_t)n ? "a count" : NULL;
  for (size_t i = 0; !bad && i < resp->n_tensors; i++) {
    const Paradev__V1__TensorDescription *t = resp->tensors[i];
    if (!t->shape || t->shape->n_dims > PD_MAX_RANK) bad = "a shape";
    if (t->n_devices > PD_MAX_DEVICES) bad = "a device set";
    for (size_t k = 0; !bad && k < t->n_component_shapes; k++)
      if (t->component_shapes[k]->n_dims > PD_MAX_RANK) bad = "a shape";
  }
  pd_description *d = bad ? NULL : malloc(sizeof(*d));
  if (!d) {
    if (bad)
      pdc_error(st, PD_INTERNAL, "Describe: the reply has %s out of range",
                bad);
    else
      pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return NULL;
  }
  d->pb = resp;
  pdc_ok(st);
  return d;
}

void pd_description_delete(pd_description *d) {
  if (!d) return;
  protobuf_c_message_free_unpacked(&d->pb->base, NULL);
  free(d);
}

int pd_description_count(const pd_description *d) {
  return d ? (int)d->pb->n_tensors : 0;
}

static const Paradev__V1__TensorDescription *pdc_desc(const pd_description *d,
                                                      int i) {
  if (!d || i < 0 || (size_t)i >= d->pb->n_tensors) return NULL;
  return d->pb->tensors[i];
}

bool pd_description_info(const pd_description *d, int i, pd_tensor_info *out) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  if (!t || !out) return false;
  out->id = t->id;
  out->dtype = (pd_dtype)t->dtype;
  return pdc_shape_from_pb(t->shape, out) &&
         pdc_devices_from_pb(t->devices, t->n_devices, out);
}

int pd_description_devices(const pd_description *d, int i, int32_t *out,
                           int cap) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  if (!t) return 0;
  for (int k = 0; out && k < cap && (size_t)k < t->n_devices; k++)
    out[k] = t->devices[k];
  return (int)t->n_devices;
}

int pd_description_num_components(const pd_description *d, int i) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  return t ? (int)t->n_component_shapes : 0;
}

bool pd_description_component(const pd_description *d, int i, int component,
                              pd_tensor_info *out) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  if (!t || !out || component < 0 || (size_t)component >= t->n_component_shapes)
    return false;
  out->id = t->id;
  out->dtype = (pd_dtype)t->dtype;
  /* the component's own device: a set of one */
  int32_t dev = (size_t)component < t->n_devices ? t->devices[component] : 0;
  return pdc_shape_from_pb(t->component_shapes[component], out) &&
         pdc_devices_from_pb(&dev, (size_t)component < t->n_devices ? 1 : 0,
                             out);
}

uint64_t pd_description_bytes(const pd_description *d, int i) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  return t ? t->bytes : 0;
}

bool pd_description_ready(const pd_description *d, int i) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  return t && t->ready;
}

pd_code pd_description_status(const pd_description *d, int i,
                              const char **message) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  if (!t || !t->status || t->status->code == 0) {
    if (message) *message = "";
    return PD_OK;
  }
  if (message) *message = t->status->message ? t->status->message : "";
  return pdc_code_from_wire(t->status->code);
}

pd_code pd_delete(pd_session *s, const uint64_t *ids, int n,
                  const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  PD_TRY(pdc_check_ids(ids, n, st));
  Paradev__V1__DeleteRequest req = PARADEV__V1__DELETE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.n_ids = (size_t)n;
  req.ids = (uint64_t *)ids;
  Paradev__V1__DeleteResponse *resp = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_Delete, &req.base,
                   &paradev__v1__delete_response__descriptor,
                   (ProtobufCMessage **)&resp, call, st));
  pdc_session_touch(s);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return PD_OK;
}
