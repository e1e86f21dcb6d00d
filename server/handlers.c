/* paradevd's unary methods: server info, sessions, Execute, Sync, Describe,
 * Delete, Echo. Each decodes and checks its request against the limits,
 * calls the scheduler, and encodes the reply. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "common.h"
#include "log.h"
#include "paradev/v1/paradev.pb-c.h"
#include "server.h"
#include "srv_int.h"

/* --- a small arena for building replies ------------------------------------ */

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

/* --- conversions ------------------------------------------------------------ */

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
                     what, v, pdcom_dtype_list(names, sizeof(names)), PD_DTYPE_COUNT - 1);
  }
  *out = (pd_dtype)v;
  return PD_OK;
}

Paradev__V1__TensorInfo *srv_info_to_pb(srv_arena *a, uint64_t id,
                                        pd_dtype dt, const dev_shape *shape) {
  Paradev__V1__TensorInfo *ti = srv_arena_alloc(a, sizeof(*ti));
  if (!ti) return NULL;
  paradev__v1__tensor_info__init(ti);
  ti->id = id;
  ti->dtype = (Paradev__V1__DType)dt;
  ti->shape = srv_shape_to_pb(a, shape);
  return ti->shape ? ti : NULL;
}

/* Opens the session of a token, failing the call when it cannot. */
sched_session *srv_open_session(srv_call *c, ProtobufCBinaryData token) {
  sched_session *ss = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (sched_session_open(c->s->sched, token.data, token.len, &ss, &st) !=
      PD_OK) {
    srv_call_fail(c, &st);
    return NULL;
  }
  return ss;
}

static bool srv_check_ids(srv_call *c, size_t n) {
  int max_ids = SRV_RT(c->s, max_ids_per_request);
  if (n > (size_t)max_ids) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "%zu ids in one request; the limit max_ids_per_request is "
                    "%d",
                    n, max_ids);
    return false;
  }
  return true;
}

/* --- Echo ------------------------------------------------------------------- */

static void srv_echo(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__EchoRequest *req = (const void *)m;
  Paradev__V1__EchoResponse resp = PARADEV__V1__ECHO_RESPONSE__INIT;
  resp.payload = req->payload;
  srv_call_reply(c, &resp.base);
}

/* --- GetServerInfo ---------------------------------------------------------- */

static void srv_get_server_info(srv_call *c, const ProtobufCMessage *m) {
  srv *s = c->s;
  int n = dev_engine_num_devices(s->engine);
  dev_backend *b = dev_engine_backend(s->engine);
  srv_arena a = {NULL};
  Paradev__V1__DeviceInfo **devs = srv_arena_alloc(&a, sizeof(*devs) * (size_t)n);
  Paradev__V1__DeviceInfo *dv = srv_arena_alloc(&a, sizeof(*dv) * (size_t)n);
  if (!devs || !dv) {
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  for (int i = 0; i < n; i++) {
    paradev__v1__device_info__init(&dv[i]);
    dv[i].index = i;
    dv[i].name = (char *)(b && b->device_name ? b->device_name(b, i) : "");
    dv[i].kind = (char *)(b && b->name ? b->name : "");
    dev_memory_stats ms = {sizeof(ms), 0, 0, 0, 0, 0};
    dev_status st = DEV_STATUS_INIT;
    if (dev_engine_memory_stats(s->engine, i, &ms, &st) == PD_OK) {
      dv[i].memory_total_bytes = ms.bytes_total;
      dv[i].memory_limit_bytes = ms.bytes_limit;
      dv[i].memory_used_bytes = ms.bytes_in_use;
      dv[i].memory_peak_bytes = ms.peak_bytes_in_use;
      uint64_t cap = ms.bytes_limit ? ms.bytes_limit : ms.bytes_total;
      dv[i].memory_free_bytes = cap > ms.bytes_in_use ? cap - ms.bytes_in_use : 0;
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
  lim.max_string_bytes = l->max_string_bytes;
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
  resp.backend = (char *)(b && b->name ? b->name : s->opt.backend);
  resp.n_devices = (size_t)n;
  resp.devices = devs;
  resp.limits = &lim;
  resp.start_time_unix_ms = s->start_unix_ms;
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
}

/* --- sessions ---------------------------------------------------------------- */

static void srv_create_session(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__CreateSessionRequest *req = (const void *)m;
  if (atomic_load(&c->s->draining)) {
    srv_call_finish(c, PD_UNAVAILABLE,
                    "paradevd is draining (%s): it takes no new sessions; "
                    "open one on another daemon or retry later",
                    atomic_load(&c->s->exiting) ? "shutting down"
                                                : "out of service");
    return;
  }
  sched_session_params p = {req->client_name, req->job_id, req->lease_seconds,
                            req->memory_quota_bytes};
  sched_session_info info;
  dev_status st = DEV_STATUS_INIT;
  if (sched_session_create(c->s->sched, &p, &info, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  char cn[65], job[65];
  SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_INFO, "session %llu opened: client \"%s\" job \"%s\" lease %u s "
           "quota %llu bytes",
           (unsigned long long)info.seq,
           srv_log_clean(req->client_name, cn, sizeof cn),
           srv_log_clean(req->job_id, job, sizeof job), info.lease_s,
           (unsigned long long)info.memory_quota);
  Paradev__V1__CreateSessionResponse resp =
      PARADEV__V1__CREATE_SESSION_RESPONSE__INIT;
  resp.session_token.data = info.token;
  resp.session_token.len = SCHED_TOKEN_BYTES;
  resp.lease_seconds = info.lease_s;
  resp.incarnation = c->s->incarnation;
  resp.memory_quota_bytes = info.memory_quota;
  resp.num_devices = dev_engine_num_devices(c->s->engine);
  srv_call_reply(c, &resp.base);
}

static void srv_keep_alive(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__KeepAliveRequest *req = (const void *)m;
  sched_session *ss = srv_open_session(c, req->session_token);
  if (!ss) return;
  Paradev__V1__KeepAliveResponse resp = PARADEV__V1__KEEP_ALIVE_RESPONSE__INIT;
  resp.incarnation = c->s->incarnation;
  resp.lease_seconds = sched_session_lease_s(ss);
  sched_session_put(ss);
  srv_call_reply(c, &resp.base);
}

static void srv_close_session(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__CloseSessionRequest *req = (const void *)m;
  uint64_t freed = 0;
  dev_status st = DEV_STATUS_INIT;
  if (sched_session_close(c->s->sched, req->session_token.data,
                          req->session_token.len, &freed, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  srv_shm_sweep(c->s); /* its shared memory regions go with it */
  SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_INFO,
             "session closed by its client: %llu handles freed",
           (unsigned long long)freed);
  Paradev__V1__CloseSessionResponse resp =
      PARADEV__V1__CLOSE_SESSION_RESPONSE__INIT;
  resp.incarnation = c->s->incarnation;
  resp.handles_freed = freed;
  srv_call_reply(c, &resp.base);
}

/* --- Execute ----------------------------------------------------------------- */

pd_code srv_op_from_pb(const Paradev__V1__Operation *pb, int index,
                       dev_attr *attrs, sched_op *out, dev_status *st) {
  const char *name = pb->op ? pb->op : "";
  size_t nlen = strlen(name);
  if (nlen == 0 || nlen > DEV_ATTR_STRING_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %d: the op name is %zu bytes; expected 1 to "
                     "max_string_bytes = %d",
                     index, nlen, DEV_ATTR_STRING_MAX);
  if (pb->n_inputs > DEV_MAX_INPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %d (%.64s): %zu inputs; the limit max_inputs_per_op "
                     "is %d",
                     index, name, pb->n_inputs, DEV_MAX_INPUTS);
  if (pb->n_attrs > DEV_MAX_ATTRS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %d (%.64s): %zu attrs; the limit max_attrs_per_op "
                     "is %d",
                     index, name, pb->n_attrs, DEV_MAX_ATTRS);
  if (pb->n_output_ids > DEV_MAX_OUTPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %d (%.64s): %zu output ids; no op has more than %d "
                     "outputs",
                     index, name, pb->n_output_ids, DEV_MAX_OUTPUTS);
  for (size_t i = 0; i < pb->n_attrs; i++) {
    const Paradev__V1__Attr *a = pb->attrs[i];
    const char *an = a->name ? a->name : "";
    if (strlen(an) == 0 || strlen(an) > DEV_ATTR_STRING_MAX)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "op %d (%.64s): attr %zu has a name of %zu bytes; "
                       "expected 1 to max_string_bytes = %d",
                       index, name, i, strlen(an), DEV_ATTR_STRING_MAX);
    const Paradev__V1__AttrValue *v = a->value;
    int vc = v ? (int)v->value_case : 0;
    dev_status inner = DEV_STATUS_INIT;
    switch (vc) {
      case PARADEV__V1__ATTR_VALUE__VALUE_I:
        attrs[i] = dev_attr_int(an, v->i);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_F:
        attrs[i] = dev_attr_float(an, v->f);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_B:
        attrs[i] = dev_attr_bool(an, v->b != 0);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_S: {
        size_t sl = strlen(v->s);
        if (sl > DEV_ATTR_STRING_MAX)
          return dev_error(st, PD_INVALID_ARGUMENT,
                           "op %d (%.64s): attr %.64s: a string of %zu bytes; "
                           "the limit max_string_bytes is %d",
                           index, name, an, sl, DEV_ATTR_STRING_MAX);
        attrs[i] = dev_attr_string(an, v->s);
        break;
      }
      case PARADEV__V1__ATTR_VALUE__VALUE_DTYPE: {
        pd_dtype dt = PD_DTYPE_INVALID;
        if (srv_dtype_from_pb((int)v->dtype, an, &dt, &inner) != PD_OK)
          return dev_error(st, inner.code, "op %d (%.64s): attr %s", index,
                           name, inner.msg);
        attrs[i] = dev_attr_dtype(an, dt);
        break;
      }
      case PARADEV__V1__ATTR_VALUE__VALUE_SHAPE: {
        dev_shape sh;
        if (srv_shape_from_pb(v->shape, an, &sh, &inner) != PD_OK)
          return dev_error(st, inner.code, "op %d (%.64s): attr %s", index,
                           name, inner.msg);
        attrs[i] = dev_attr_shape(an, sh.rank, sh.dims);
        break;
      }
      case PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST:
      case PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST: {
        bool is_int = vc == PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST;
        size_t n = is_int ? (v->int_list ? v->int_list->n_values : 0)
                          : (v->float_list ? v->float_list->n_values : 0);
        if (n > DEV_ATTR_LIST_MAX)
          return dev_error(st, PD_INVALID_ARGUMENT,
                           "op %d (%.64s): attr %.64s: a list of %zu values; "
                           "the limit max_list_length is %d",
                           index, name, an, n, DEV_ATTR_LIST_MAX);
        if (is_int)
          attrs[i] = dev_attr_int_list(
              an, v->int_list ? v->int_list->values : NULL, (int)n);
        else
          attrs[i] = dev_attr_float_list(
              an, v->float_list ? v->float_list->values : NULL, (int)n);
        break;
      }
      default:
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "op %d (%.64s): attr %.64s has no value (set one of "
                         "i, f, b, s, dtype, shape, int_list, float_list)",
                         index, name, an);
    }
  }
  out->op_name = name;
  out->inputs = pb->inputs;
  out->num_inputs = (int)pb->n_inputs;
  out->attrs = attrs;
  out->num_attrs = (int)pb->n_attrs;
  out->output_ids = pb->output_ids;
  out->num_outputs = (int)pb->n_output_ids;
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
    outs[j] = srv_info_to_pb(a, op->output_ids[j], r->dtype[j], &r->shape[j]);
    if (!outs[j]) return NULL;
  }
  pr->n_outputs = (size_t)r->num_outputs;
  pr->outputs = outs;
  return pr;
}

static void srv_execute(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__ExecuteRequest *req = (const void *)m;
  int max_ops = SRV_RT(c->s, max_ops_per_request);
  if (req->n_ops == 0 || req->n_ops > (size_t)max_ops) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "%zu ops in one request; expected 1 to "
                    "max_ops_per_request = %d",
                    req->n_ops, max_ops);
    return;
  }
  sched_session *ss = srv_open_session(c, req->session_token);
  if (!ss) return;
  size_t n = req->n_ops;
  srv_arena a = {NULL};
  sched_op *ops = srv_arena_alloc(&a, sizeof(*ops) * n);
  sched_op_result *res = srv_arena_alloc(&a, sizeof(*res) * n);
  dev_attr *attrs = srv_arena_alloc(&a, sizeof(*attrs) * n * DEV_MAX_ATTRS);
  Paradev__V1__OpResult **pres = srv_arena_alloc(&a, sizeof(*pres) * n);
  dev_status st = DEV_STATUS_INIT;
  if (!ops || !res || !attrs || !pres) {
    dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto fail;
  }
  for (size_t i = 0; i < n; i++)
    if (srv_op_from_pb(req->ops[i], (int)i, attrs + i * DEV_MAX_ATTRS, &ops[i],
                       &st) != PD_OK)
      goto fail;
  int failed = 0;
  if (sched_execute(ss, ops, (int)n, 0, res, &failed, &st) != PD_OK) goto fail;
  for (size_t i = 0; i < n; i++) {
    pres[i] = srv_result_to_pb(&a, &ops[i], &res[i]);
    if (!pres[i]) {
      dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      goto fail;
    }
  }
  Paradev__V1__ExecuteResponse resp = PARADEV__V1__EXECUTE_RESPONSE__INIT;
  resp.n_results = n;
  resp.results = pres;
  resp.incarnation = c->s->incarnation;
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
  sched_session_put(ss);
  return;
fail:
  srv_call_fail(c, &st);
  srv_arena_free(&a);
  sched_session_put(ss);
}

/* --- Sync ------------------------------------------------------------------- */

/* Sync waits for its handles one at a time without holding a thread: each
 * tensor not yet computed gets a wake-up (sched_tensor_notify), and the
 * call's deadline or cancellation ends the wait at once. */
typedef struct srv_sync_state {
  sched_session *ss;
  sched_ref *refs;
  size_t n, next;
  srv_wait *w; /* the wake-up in flight, if any */
  dev_status first;
  uint64_t first_id;
} srv_sync_state;

static void srv_sync_destroy(srv_call *c) {
  srv_sync_state *y = c->user;
  if (!y) return;
  srv_wait_cancel(y->w);
  srv_wait_put(y->w, false);
  sched_refs_release(y->refs, y->n);
  sched_session_put(y->ss);
  free(y);
  c->user = NULL;
}

static void srv_sync_step(srv_call *c) {
  srv_sync_state *y = c->user;
  if (y->w) { /* woken: that wait is over */
    srv_wait_put(y->w, false);
    y->w = NULL;
  }
  while (y->next < y->n) {
    dev_tensor *t = y->refs[y->next].t;
    if (!dev_tensor_is_ready(t)) {
      dev_status st = DEV_STATUS_INIT;
      srv_wait *w = srv_wait_new(c);
      if (!w) {
        srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
        return;
      }
      if (sched_tensor_notify(y->ss, t, srv_wait_ready, w, &st) != PD_OK) {
        srv_wait_cancel(w);
        srv_wait_put(w, true);
        srv_call_fail(c, &st);
        return;
      }
      y->w = w; /* on_wake comes back here */
      return;
    }
    dev_status ts = DEV_STATUS_INIT;
    if (dev_tensor_wait(t, &ts) != PD_OK && y->first.code == PD_OK) {
      y->first = ts;
      y->first_id = y->refs[y->next].id;
    }
    y->next++;
  }
  Paradev__V1__Status es = PARADEV__V1__STATUS__INIT;
  char msg[DEV_STATUS_MSG_MAX];
  es.code = (int32_t)y->first.code;
  es.message = srv_log_clean(y->first.msg, msg, sizeof msg); /* proto3: UTF-8 */
  Paradev__V1__SyncResponse resp = PARADEV__V1__SYNC_RESPONSE__INIT;
  resp.error = &es;
  resp.failed_id = y->first_id;
  srv_call_reply(c, &resp.base);
}

static void srv_sync_cancel(srv_call *c) {
  srv_sync_state *y = c->user;
  if (y && y->w) {
    srv_wait_cancel(y->w);
    srv_wait_put(y->w, false);
    y->w = NULL;
  }
  srv_call_finish_cancelled(c, "Sync");
}

static void srv_sync(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__SyncRequest *req = (const void *)m;
  if (!srv_check_ids(c, req->n_ids)) return;
  srv_sync_state *y = calloc(1, sizeof(*y));
  if (!y) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->user = y;
  y->ss = srv_open_session(c, req->session_token);
  if (!y->ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (sched_collect(y->ss, req->ids, (int)req->n_ids, &y->refs, &y->n, &st) !=
      PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  srv_sync_step(c);
}

/* --- Describe, Delete --------------------------------------------------------- */

static void srv_describe(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DescribeRequest *req = (const void *)m;
  if (!srv_check_ids(c, req->n_ids)) return;
  sched_session *ss = srv_open_session(c, req->session_token);
  if (!ss) return;
  size_t n = req->n_ids;
  srv_arena a = {NULL};
  dev_status st = DEV_STATUS_INIT;
  Paradev__V1__TensorDescription **ds =
      srv_arena_alloc(&a, sizeof(*ds) * (n + 1));
  if (!ds) {
    dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto fail;
  }
  for (size_t i = 0; i < n; i++) {
    dev_tensor *t = NULL;
    if (sched_handle_get(ss, req->ids[i], &t, &st) != PD_OK) goto fail;
    Paradev__V1__TensorDescription *d = srv_arena_alloc(&a, sizeof(*d));
    int nc = dev_tensor_num_components(t);
    Paradev__V1__Shape **cs = srv_arena_alloc(&a, sizeof(*cs) * (size_t)nc);
    Paradev__V1__Status *ps = srv_arena_alloc(&a, sizeof(*ps));
    char *msg = srv_arena_alloc(&a, DEV_STATUS_MSG_MAX);
    if (!d || !cs || !ps || !msg) {
      dev_tensor_release(t);
      dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      goto fail;
    }
    paradev__v1__tensor_description__init(d);
    paradev__v1__status__init(ps);
    d->id = req->ids[i];
    d->dtype = (Paradev__V1__DType)dev_tensor_dtype(t);
    d->shape = srv_shape_to_pb(&a, dev_tensor_shape(t));
    for (int k = 0; k < nc; k++)
      cs[k] = srv_shape_to_pb(&a, dev_tensor_component_shape(t, k));
    d->n_component_shapes = (size_t)nc;
    d->component_shapes = cs;
    d->bytes = dev_tensor_bytes(t);
    d->ready = dev_tensor_is_ready(t);
    if (d->ready) {
      dev_status ts = DEV_STATUS_INIT;
      dev_tensor_wait(t, &ts); /* ready: returns at once */
      ps->code = (int32_t)ts.code;
      ps->message = srv_log_clean(ts.msg, msg, DEV_STATUS_MSG_MAX);
    } else {
      ps->message = (char *)"";
    }
    d->status = ps;
    dev_tensor_release(t);
    ds[i] = d;
  }
  Paradev__V1__DescribeResponse resp = PARADEV__V1__DESCRIBE_RESPONSE__INIT;
  resp.n_tensors = n;
  resp.tensors = ds;
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
  sched_session_put(ss);
  return;
fail:
  srv_call_fail(c, &st);
  srv_arena_free(&a);
  sched_session_put(ss);
}

static void srv_delete(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DeleteRequest *req = (const void *)m;
  if (!srv_check_ids(c, req->n_ids)) return;
  sched_session *ss = srv_open_session(c, req->session_token);
  if (!ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (sched_handle_delete(ss, req->ids, (int)req->n_ids, &st) != PD_OK) {
    srv_call_fail(c, &st);
  } else {
    Paradev__V1__DeleteResponse resp = PARADEV__V1__DELETE_RESPONSE__INIT;
    resp.deleted = req->n_ids;
    srv_call_reply(c, &resp.base);
  }
  sched_session_put(ss);
}

/* --- the method table ---------------------------------------------------------- */

#define SRV_PD "/paradev.v1.ParallelDevice/"
#define SRV_UNARY_METHOD(var, name, desc, fn)                       \
  static srv_method var = {.path = SRV_PD name, .kind = SRV_UNARY, \
                           .request = &desc, .on_request = fn}

SRV_UNARY_METHOD(m_echo, "Echo", paradev__v1__echo_request__descriptor,
                 srv_echo);
SRV_UNARY_METHOD(m_info, "GetServerInfo",
                 paradev__v1__get_server_info_request__descriptor,
                 srv_get_server_info);
SRV_UNARY_METHOD(m_create, "CreateSession",
                 paradev__v1__create_session_request__descriptor,
                 srv_create_session);
SRV_UNARY_METHOD(m_keep, "KeepAlive", paradev__v1__keep_alive_request__descriptor,
                 srv_keep_alive);
SRV_UNARY_METHOD(m_close, "CloseSession",
                 paradev__v1__close_session_request__descriptor,
                 srv_close_session);
SRV_UNARY_METHOD(m_execute, "Execute", paradev__v1__execute_request__descriptor,
                 srv_execute);
SRV_UNARY_METHOD(m_describe, "Describe",
                 paradev__v1__describe_request__descriptor, srv_describe);
SRV_UNARY_METHOD(m_delete, "Delete", paradev__v1__delete_request__descriptor,
                 srv_delete);
static srv_method m_sync = {.path = SRV_PD "Sync",
                            .kind = SRV_UNARY,
                            .request = &paradev__v1__sync_request__descriptor,
                            .on_request = srv_sync,
                            .on_destroy = srv_sync_destroy,
                            .on_wake = srv_sync_step,
                            .on_cancel = srv_sync_cancel,
                            .early_close = true};

srv_method *const srv_methods[] = {
    &m_echo,     &m_info,    &m_create,  &m_keep,
    &m_close,    &m_execute, &m_sync,    &m_describe,
    &m_delete,   &srv_m_health_check, &srv_m_health_watch, &srv_m_upload,
    &srv_m_download, &srv_m_enqueue, &srv_m_echo_stream,
    &srv_m_start_tape, &srv_m_watch_tape, &srv_m_gradient,
    &srv_m_delete_tape, &srv_m_register_shm, &srv_m_unregister_shm,
    &srv_m_upload_shm, &srv_m_download_shm, NULL};
