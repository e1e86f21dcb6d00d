/* libparadev: the calls on a client rather than a session: Echo, the health
 * check, GetServerInfo (pd_server_info), and the transfer chunk size that the
 * daemon's limits cap. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"
#include "grpc/health/v1/health.pb-c.h"

/* --- Echo, health --------------------------------------------------------------- */

pd_code pd_client_echo(pd_client *c, const void *payload, size_t len,
                       void *reply, size_t reply_cap, size_t *reply_len,
                       const pd_call_options *call, pd_status *st) {
  if (!c) return pdc_error(st, PD_INVALID_ARGUMENT, "client is NULL");
  if (len && !payload)
    return pdc_error(st, PD_INVALID_ARGUMENT, "payload is NULL");
  Paradev__V1__EchoRequest req = PARADEV__V1__ECHO_REQUEST__INIT;
  req.payload.data = (uint8_t *)payload;
  req.payload.len = len;
  Paradev__V1__EchoResponse *resp = NULL;
  PD_TRY(pdc_unary(c, PDC_M_Echo, &req.base,
                   &paradev__v1__echo_response__descriptor,
                   (ProtobufCMessage **)&resp, call, st));
  pd_code rc = PD_OK;
  size_t n = resp->payload.len;
  if (n != len)
    rc = pdc_error(st, PD_DATA_LOSS, "Echo: sent %zu bytes, %zu came back", len,
                   n);
  else if (reply && n > reply_cap)
    rc =
        pdc_error(st, PD_DATA_LOSS,
                  "Echo: the reply of %zu bytes does not fit the buffer of %zu",
                  n, reply_cap);
  if (rc == PD_OK) {
    if (reply && n) memcpy(reply, resp->payload.data, n);
    if (reply_len) *reply_len = n;
  }
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

pd_code pd_client_health(pd_client *c, const char *service,
                         pd_serving_status *out, const pd_call_options *call,
                         pd_status *st) {
  if (!c) return pdc_error(st, PD_INVALID_ARGUMENT, "client is NULL");
  Grpc__Health__V1__HealthCheckRequest req =
      GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)(service ? service : "");
  Grpc__Health__V1__HealthCheckResponse *resp = NULL;
  PD_TRY(pdc_unary(c, PDC_M_Check, &req.base,
                   &grpc__health__v1__health_check_response__descriptor,
                   (ProtobufCMessage **)&resp, call, st));
  int v = (int)resp->status;
  if (out) *out = v >= 0 && v <= 3 ? (pd_serving_status)v : PD_SERVING_UNKNOWN;
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return PD_OK;
}

/* --- server info --------------------------------------------------------------- */

struct pd_server_info {
  Paradev__V1__GetServerInfoResponse *pb;
  pd_device_info *devices;
  int num_devices;
  pd_limits limits;
  pd_mesh_rank_info *mesh_ranks; /* GetServerInfo.mesh.ranks, or NULL */
  int num_mesh_ranks;
};

static uint64_t pdc_min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

pd_server_info *pd_client_get_server_info(pd_client *c,
                                          const pd_call_options *call,
                                          pd_status *st) {
  if (!c) {
    pdc_error(st, PD_INVALID_ARGUMENT, "client is NULL");
    return NULL;
  }
  Paradev__V1__GetServerInfoRequest req =
      PARADEV__V1__GET_SERVER_INFO_REQUEST__INIT;
  Paradev__V1__GetServerInfoResponse *resp = NULL;
  if (pdc_unary(c, PDC_M_GetServerInfo, &req.base,
                &paradev__v1__get_server_info_response__descriptor,
                (ProtobufCMessage **)&resp, call, st) != PD_OK)
    return NULL;
  pd_server_info *info = calloc(1, sizeof(*info));
  size_t nd = resp->n_devices;
  if (!info || nd > PD_MAX_DEVICES ||
      !(info->devices = calloc(nd ? nd : 1, sizeof(pd_device_info)))) {
    if (nd > PD_MAX_DEVICES)
      pdc_error(st, PD_INTERNAL, "GetServerInfo: %zu devices; at most %d", nd,
                PD_MAX_DEVICES);
    else
      pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    free(info);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return NULL;
  }
  info->pb = resp;
  info->num_devices = (int)nd;
  const Paradev__V1__MeshInfo *mi = resp->mesh;
  size_t nr = mi ? mi->n_ranks : 0;
  if (nr > PD_MAX_DEVICES ||
      (nr && !(info->mesh_ranks = calloc(nr, sizeof(pd_mesh_rank_info))))) {
    if (nr > PD_MAX_DEVICES)
      pdc_error(st, PD_INTERNAL,
                "GetServerInfo: a mesh of %zu ranks; at most %d", nr,
                PD_MAX_DEVICES);
    else
      pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    pd_server_info_delete(info);
    return NULL;
  }
  info->num_mesh_ranks = (int)nr;
  for (size_t i = 0; i < nr; i++) {
    const Paradev__V1__MeshRankInfo *r = mi->ranks[i];
    pd_mesh_rank_info *o = &info->mesh_ranks[i];
    o->rank = (int)r->rank;
    o->host = r->host ? r->host : "";
    o->incarnation = r->incarnation;
    o->attached = r->attached ? 1 : 0;
    o->last_seen_ms_ago = r->last_seen_ms_ago;
  }
  for (size_t i = 0; i < nd; i++) {
    const Paradev__V1__DeviceInfo *d = resp->devices[i];
    pd_device_info *o = &info->devices[i];
    o->index = d->index;
    o->name = d->name ? d->name : "";
    o->kind = d->kind ? d->kind : "";
    o->memory_total_bytes = d->memory_total_bytes;
    o->memory_limit_bytes = d->memory_limit_bytes;
    o->memory_used_bytes = d->memory_used_bytes;
    o->memory_free_bytes = d->memory_free_bytes;
    o->gpu = d->gpu;
    o->memory_peak_bytes = d->memory_peak_bytes;
    o->busy_seconds = d->busy_seconds;
    o->memory_cached_bytes = d->memory_cached_bytes;
  }
  const Paradev__V1__Limits *l = resp->limits;
  if (l) {
    pd_limits *o = &info->limits;
    o->max_message_bytes = l->max_message_bytes;
    o->max_tensor_bytes = l->max_tensor_bytes;
    o->max_rank = l->max_rank;
    o->max_ops_per_request = l->max_ops_per_request;
    o->max_handles_per_session = l->max_handles_per_session;
    o->max_sessions = l->max_sessions;
    o->max_string_bytes = l->max_string_bytes;
    o->max_inputs_per_op = l->max_inputs_per_op;
    o->max_attrs_per_op = l->max_attrs_per_op;
    o->max_list_length = l->max_list_length;
    o->max_ids_per_request = l->max_ids_per_request;
    o->default_lease_seconds = l->default_lease_seconds;
    o->max_lease_seconds = l->max_lease_seconds;
    o->max_chunk_bytes = l->max_chunk_bytes;
    pthread_mutex_lock(&c->mu);
    c->have_limits = true;
    c->server_max_chunk = l->max_chunk_bytes;
    pthread_mutex_unlock(&c->mu);
  }
  pdc_ok(st);
  return info;
}

void pd_server_info_delete(pd_server_info *info) {
  if (!info) return;
  protobuf_c_message_free_unpacked(&info->pb->base, NULL);
  free(info->devices);
  free(info->mesh_ranks);
  free(info);
}

const char *pd_server_info_version(const pd_server_info *info) {
  return info->pb->version ? info->pb->version : "";
}
uint64_t pd_server_info_incarnation(const pd_server_info *info) {
  return info->pb->incarnation;
}
const char *pd_server_info_backend(const pd_server_info *info) {
  return info->pb->backend ? info->pb->backend : "";
}
int64_t pd_server_info_start_time_ms(const pd_server_info *info) {
  return info->pb->start_time_unix_ms;
}
int pd_server_info_num_devices(const pd_server_info *info) {
  return info->num_devices;
}
const pd_device_info *pd_server_info_device(const pd_server_info *info, int i) {
  return i >= 0 && i < info->num_devices ? &info->devices[i] : NULL;
}
const pd_limits *pd_server_info_limits(const pd_server_info *info) {
  return &info->limits;
}
int pd_server_info_num_storage_roots(const pd_server_info *info) {
  return (int)info->pb->n_storage_roots;
}
const char *pd_server_info_storage_root(const pd_server_info *info, int i) {
  return i >= 0 && (size_t)i < info->pb->n_storage_roots
             ? info->pb->storage_roots[i]
             : NULL;
}

int pd_server_info_tls(const pd_server_info *info) {
  return info && info->pb->tls;
}
int pd_server_info_client_cert_required(const pd_server_info *info) {
  return info && info->pb->client_cert_required;
}
int pd_server_info_insecure_tcp(const pd_server_info *info) {
  return info && info->pb->insecure_tcp;
}
int pd_server_info_num_warnings(const pd_server_info *info) {
  return info ? (int)info->pb->n_warnings : 0;
}
const char *pd_server_info_warning(const pd_server_info *info, int i) {
  return info && i >= 0 && (size_t)i < info->pb->n_warnings
             ? info->pb->warnings[i]
             : NULL;
}

/* --- GetServerInfo.mesh (issue #16) --- */

int pd_server_info_has_mesh(const pd_server_info *info) {
  return info && info->pb->mesh ? 1 : 0;
}
int pd_server_info_mesh_world_size(const pd_server_info *info) {
  return info && info->pb->mesh ? (int)info->pb->mesh->world_size : 1;
}
int pd_server_info_mesh_rank(const pd_server_info *info) {
  return info && info->pb->mesh ? (int)info->pb->mesh->rank : 0;
}
int pd_server_info_mesh_devices_per_rank(const pd_server_info *info) {
  if (!info) return 0;
  return info->pb->mesh ? (int)info->pb->mesh->devices_per_rank
                        : info->num_devices;
}
int pd_server_info_mesh_formed(const pd_server_info *info) {
  return info && info->pb->mesh && info->pb->mesh->formed ? 1 : 0;
}
int pd_server_info_mesh_degraded(const pd_server_info *info) {
  return info && info->pb->mesh && info->pb->mesh->degraded ? 1 : 0;
}
int pd_server_info_mesh_num_missing_ranks(const pd_server_info *info) {
  return info && info->pb->mesh ? (int)info->pb->mesh->n_missing_ranks : 0;
}
int pd_server_info_mesh_missing_rank(const pd_server_info *info, int i) {
  const Paradev__V1__MeshInfo *m = info ? info->pb->mesh : NULL;
  return m && i >= 0 && (size_t)i < m->n_missing_ranks
             ? (int)m->missing_ranks[i]
             : -1;
}
uint64_t pd_server_info_mesh_epoch(const pd_server_info *info) {
  return info && info->pb->mesh ? info->pb->mesh->epoch : 0;
}
const char *pd_server_info_mesh_coordinator(const pd_server_info *info) {
  const Paradev__V1__MeshInfo *m = info ? info->pb->mesh : NULL;
  return m && m->coordinator ? m->coordinator : "";
}
const char *pd_server_info_mesh_reason(const pd_server_info *info) {
  const Paradev__V1__MeshInfo *m = info ? info->pb->mesh : NULL;
  return m && m->reason ? m->reason : "";
}
int pd_server_info_mesh_num_ranks(const pd_server_info *info) {
  return info ? info->num_mesh_ranks : 0;
}
const pd_mesh_rank_info *pd_server_info_mesh_rank_info(
    const pd_server_info *info, int i) {
  return info && i >= 0 && i < info->num_mesh_ranks ? &info->mesh_ranks[i]
                                                    : NULL;
}

pd_code pdc_chunk_bytes(pd_client *c, const pd_call_options *o, size_t *out,
                        pd_status *st) {
  pthread_mutex_lock(&c->mu);
  bool have = c->have_limits;
  pthread_mutex_unlock(&c->mu);
  if (!have) {
    pd_status local;
    pd_server_info *info = pd_client_get_server_info(c, o, &local);
    if (!info) return pdc_error(st, local.code, "%s", local.msg);
    pd_server_info_delete(info);
  }
  pthread_mutex_lock(&c->mu);
  uint64_t chunk = c->chunk_bytes_opt;
  if (c->server_max_chunk) chunk = pdc_min_u64(chunk, c->server_max_chunk);
  pthread_mutex_unlock(&c->mu);
  chunk = pdc_min_u64(chunk, c->max_message_bytes - 1024);
  *out = (size_t)chunk;
  return PD_OK;
}
