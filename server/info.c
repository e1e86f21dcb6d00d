/* What a client learns of the daemon before it opens a session:
 * GetServerInfo (version, devices, the limits in force, which are the ones
 * convert.c enforces), and the Echo and EchoStream methods that measure the
 * transport. */
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "log.h"
#include "mesh.h"
#include "server.h"
#include "tls.h"

/* --- Echo, EchoStream ---------------------------------------------------------- */

static void srv_echo(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__EchoRequest *req = (const void *)m;
  Paradev__V1__EchoResponse resp = PARADEV__V1__ECHO_RESPONSE__INIT;
  resp.payload = req->payload;
  srv_call_reply(c, &resp.base);
}

static void srv_echo_stream_msg(srv_call *c, const ProtobufCMessage *m) {
  if (!m) {
    srv_call_finish(c, PD_OK, "%s", "");
    return;
  }
  const Paradev__V1__EchoRequest *req = (const void *)m;
  Paradev__V1__EchoResponse resp = PARADEV__V1__ECHO_RESPONSE__INIT;
  resp.payload = req->payload;
  srv_call_write(c, &resp.base);
}

const srv_handlers srv_h_Echo = {.on_request = srv_echo};
const srv_handlers srv_h_EchoStream = {.on_message = srv_echo_stream_msg};

/* --- GetServerInfo ---------------------------------------------------------- */

/* [functions] as GetServerInfo tells it, in `a` and `fi`; false when out of
 * memory. */
static bool srv_functions_info(srv *s, srv_arena *a,
                               Paradev__V1__FunctionsInfo *fi) {
  paradev__v1__functions_info__init(fi);
  Paradev__V1__PassResult *pr =
      srv_arena_alloc(a, sizeof(*pr) * DEV_PASS_COUNT);
  fi->passes = srv_arena_alloc(a, sizeof(*fi->passes) * DEV_PASS_COUNT);
  char *buf = srv_arena_alloc(a, SRV_AUTH_LIST_MAX);
  fi->optimizer_plugins =
      srv_arena_alloc(a, sizeof(*fi->optimizer_plugins) * SRV_MAX_PLUGINS);
  if (!pr || !fi->passes || !buf || !fi->optimizer_plugins) return false;
  for (int p = 0; p < DEV_PASS_COUNT; p++) {
    paradev__v1__pass_result__init(&pr[p]);
    pr[p].pass = (char *)dev_fn_pass_name((dev_fn_pass)p);
    pr[p].enabled = s->fn_passes[p] != DEV_TRI_OFF; /* DEFAULT: on */
    fi->passes[p] = &pr[p];
  }
  fi->n_passes = DEV_PASS_COUNT;
  fi->max_instantiations = (uint32_t)s->opt.fn_max_instantiations;
  fi->constant_folding_max_bytes = s->opt.fn_fold_max_bytes;
  fi->constant_folding_max_ms = (uint32_t)s->opt.fn_fold_max_ms;
  const char *paths[SRV_MAX_PLUGINS];
  int n = srv_config_plugin_paths(&s->opt, buf, SRV_AUTH_LIST_MAX, paths);
  for (int i = 0; i < n; i++) fi->optimizer_plugins[i] = (char *)paths[i];
  fi->n_optimizer_plugins = (size_t)n;
  return true;
}

static void srv_get_server_info(srv_call *c, const ProtobufCMessage *m) {
  srv *s = c->s;
  int n = dev_engine_num_devices(s->engine);
  srv_arena a = {NULL};
  Paradev__V1__DeviceInfo **devs =
      srv_arena_alloc(&a, sizeof(*devs) * (size_t)n);
  Paradev__V1__DeviceInfo *dv = srv_arena_alloc(&a, sizeof(*dv) * (size_t)n);
  if (!devs || !dv) {
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  for (int i = 0; i < n; i++) {
    paradev__v1__device_info__init(&dv[i]);
    dv[i].index = i;
    dv[i].name = (char *)dev_engine_device_name(s->engine, i);
    dv[i].kind = (char *)dev_engine_backend_name(s->engine);
    /* Issue #17: the GPU a job bound by CreateJobToken.gpus names it by. */
    dv[i].gpu = dev_engine_device_gpu(s->engine, i);
    dev_memory_stats ms = {.struct_size = sizeof(ms)};
    dev_status st = DEV_STATUS_INIT;
    if (dev_engine_memory_stats(s->engine, i, &ms, &st) == PD_OK) {
      dv[i].memory_total_bytes = ms.bytes_total;
      dv[i].memory_limit_bytes = ms.bytes_limit;
      dv[i].memory_used_bytes = ms.bytes_in_use;
      dv[i].memory_peak_bytes = ms.peak_bytes_in_use;
      dv[i].memory_cached_bytes = ms.bytes_cached;
      uint64_t cap = ms.bytes_limit ? ms.bytes_limit : ms.bytes_total;
      dv[i].memory_free_bytes =
          cap > ms.bytes_in_use ? cap - ms.bytes_in_use : 0;
    } else {
      SRV_WARN("memory stats of device %d: %s", i, st.msg);
    }
    dv[i].busy_seconds = dev_engine_busy_seconds(s->engine, i);
    devs[i] = &dv[i];
  }
  const srv_limits *l = &s->opt.limits;
  Paradev__V1__Limits lim = PARADEV__V1__LIMITS__INIT;
  lim.max_message_bytes = l->max_message_bytes;
  lim.max_tensor_bytes = SRV_RT(s, max_tensor_bytes);
  lim.max_rank = PD_MAX_RANK;
  lim.max_ops_per_request = SRV_RT(s, max_ops_per_request);
  lim.max_handles_per_session = SRV_RT(s, max_handles_per_session);
  lim.max_sessions = SRV_RT(s, max_sessions);
  lim.max_string_bytes = srv_call_limits(c).max_string_bytes;
  lim.max_inputs_per_op = DEV_MAX_INPUTS;
  lim.max_attrs_per_op = DEV_MAX_ATTRS;
  lim.max_list_length = DEV_ATTR_LIST_MAX;
  lim.max_ids_per_request = SRV_RT(s, max_ids_per_request);
  lim.default_lease_seconds = SRV_RT(s, default_lease_s);
  lim.max_lease_seconds = SRV_RT(s, max_lease_s);
  lim.max_chunk_bytes = l->max_chunk_bytes;

  Paradev__V1__GetServerInfoResponse resp =
      PARADEV__V1__GET_SERVER_INFO_RESPONSE__INIT;
  resp.version = (char *)SRV_VERSION;
  resp.incarnation = s->incarnation;
  const char *backend = dev_engine_backend_name(s->engine);
  resp.backend = (char *)(backend[0] ? backend : s->opt.backend);
  resp.n_devices = (size_t)n;
  resp.devices = devs;
  resp.limits = &lim;
  resp.start_time_unix_ms = s->start_unix_ms;
  int nr = s->storage_roots ? stg_roots_count(s->storage_roots) : 0;
  char **roots = srv_arena_alloc(&a, sizeof(*roots) * (size_t)(nr + 1));
  for (int i = 0; roots && i < nr; i++)
    roots[i] = (char *)stg_roots_entry(s->storage_roots, i);
  resp.n_storage_roots = roots ? (size_t)nr : 0;
  resp.storage_roots = roots;
  resp.tls = s->tls != NULL;
  resp.client_cert_required = srv_tls_requires_client_cert(s->tls);
  char insecure[SRV_ADDR_MAX + 512];
  srv_config_insecure_warning(&s->opt, insecure, sizeof(insecure));
  char *warnings[1] = {insecure};
  resp.insecure_tcp = insecure[0] != '\0';
  resp.n_warnings = resp.insecure_tcp ? 1 : 0;
  resp.warnings = warnings;
  Paradev__V1__FunctionsInfo fi;
  if (srv_functions_info(s, &a, &fi)) resp.functions = &fi;
  /* A mesh across machines (issue #16). */
  Paradev__V1__MeshInfo mi = PARADEV__V1__MESH_INFO__INIT;
  Paradev__V1__MeshRankInfo ri[64], *rip[64];
  uint32_t missing[64];
  srv_mesh_view *mv = s->mesh ? malloc(sizeof *mv) : NULL;
  if (mv) {
    srv_mesh_info(s->mesh, mv);
    mi.world_size = (uint32_t)mv->world;
    mi.rank = (uint32_t)mv->rank;
    mi.devices_per_rank = (uint32_t)mv->per_rank;
    mi.formed = mv->formed;
    mi.degraded = mv->degraded;
    mi.epoch = mv->epoch;
    mi.coordinator = mv->coordinator;
    mi.reason = mv->reason;
    for (int i = 0; i < mv->n_missing; i++)
      missing[i] = (uint32_t)mv->missing[i];
    mi.n_missing_ranks = (size_t)mv->n_missing;
    mi.missing_ranks = missing;
    if (mv->rank == 0) {
      for (int r = 0; r < mv->world && r < 64; r++) {
        Paradev__V1__MeshRankInfo x = PARADEV__V1__MESH_RANK_INFO__INIT;
        x.rank = (uint32_t)r;
        x.host = mv->ranks[r].host;
        x.incarnation = mv->ranks[r].incarnation;
        x.attached = mv->ranks[r].attached;
        x.last_seen_ms_ago = (uint64_t)(mv->ranks[r].last_seen_s * 1000);
        ri[r] = x;
        rip[r] = &ri[r];
      }
      mi.n_ranks = (size_t)mv->world;
      mi.ranks = rip;
    }
    resp.mesh = &mi;
  }
  srv_call_reply(c, &resp.base);
  free(mv);
  srv_arena_free(&a);
}

const srv_handlers srv_h_GetServerInfo = {.on_request = srv_get_server_info};
