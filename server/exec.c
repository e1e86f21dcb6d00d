/* Execution on the wire: Execute (a batch of ops), Enqueue (a stream of
 * items: execute, delete, and the tape items of tape.c), Sync, Describe and
 * Delete. Execute and an Enqueue item share one function per item kind
 * (srv_execute_item, srv_delete_item), which convert (convert.c, the checker
 * of every limit) and call the scheduler (sched_execute queues the ops and
 * answers with their outputs' dtypes and shapes). Sync waits for its tensors
 * with srv_call_await (call.c), never a blocked thread. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "check.h"
#include "log.h"
#include "mesh.h"
#include "server.h"
#include "srv_int.h"

/* --- the items Execute and Enqueue share ------------------------------------------ */

/* The call's gRPC deadline as the scheduler takes an op's (CLOCK_MONOTONIC
 * ns; 0: none). gpr's monotonic clock has another origin, so the time left
 * is measured on gpr's clock and added to ours. */
static uint64_t srv_call_deadline_ns(const srv_call *c) {
  if (gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) == 0)
    return 0;
  gpr_timespec left =
      gpr_time_sub(c->deadline, gpr_now(c->deadline.clock_type));
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t secs = left.tv_sec > 100000000 ? 100000000 : left.tv_sec;
  int64_t l_ns = secs * 1000000000 + left.tv_nsec;
  if (l_ns < 0) l_ns = 0; /* passed already: the op expires at its turn */
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec +
         (uint64_t)l_ns;
}

/* An execute item: converts ops[0..n) (checking every limit) and queues them
 * in one sched_execute, each with the call's deadline and `timeout_ms` (the
 * request's op_timeout_ms; 0: the session's); ops_out, res, attrs
 * (n * DEV_MAX_ATTRS) and sets (n: each op's placement) are the caller's;
 * `a` holds the results of ops with more than SCHED_RESULT_INLINE outputs. */
static pd_code srv_execute_item(const srv_req_limits *l, sched_session *ss,
                                Paradev__V1__Operation *const *ops, size_t n,
                                uint64_t tag, uint64_t deadline_ns,
                                uint32_t timeout_ms, dev_attr *attrs,
                                dev_devset *sets, sched_op *ops_out,
                                sched_op_result *res, srv_arena *a,
                                dev_status *st) {
  for (size_t i = 0; i < n; i++) {
    PD_TRY(srv_op_from_pb(l, ops[i], (int)i, attrs + i * DEV_MAX_ATTRS,
                          &sets[i], &ops_out[i], st));
    ops_out[i].deadline_ns = deadline_ns;
    ops_out[i].timeout_ms = timeout_ms;
    /* Results past the inline ones (a list output), sized by the ids */
    res[i].more_dtype = NULL;
    res[i].more_shape = NULL;
    int more = ops_out[i].num_outputs - SCHED_RESULT_INLINE;
    if (more > 0) {
      res[i].more_dtype = srv_arena_alloc(a, sizeof(pd_dtype) * (size_t)more);
      res[i].more_shape = srv_arena_alloc(a, sizeof(dev_shape) * (size_t)more);
      if (!res[i].more_dtype || !res[i].more_shape)
        return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    }
  }
  int failed = 0;
  PD_TRY(sched_execute(ss, ops_out, (int)n, tag, res, &failed, st));
  return PD_OK;
}

/* A delete item: drops the session's handles `ids`. */
static pd_code srv_delete_item(const srv_req_limits *l, sched_session *ss,
                               const uint64_t *ids, size_t n, dev_status *st) {
  PD_TRY(srv_check_ids(l, n, "ids", st));
  return sched_handle_delete(ss, ids, (int)n, st);
}

/* The ids-per-request limit of a Sync, Describe or Delete, checked before
 * its session is opened: false (the call failed) when n passes it. */
static bool srv_ids_ok(srv_call *c, size_t n) {
  srv_req_limits l = srv_call_limits(c);
  dev_status st = DEV_STATUS_INIT;
  if (srv_check_ids(&l, n, "ids", &st) == PD_OK) return true;
  srv_call_fail(c, &st);
  return false;
}

/* --- Execute ----------------------------------------------------------------- */

static void srv_execute(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__ExecuteRequest *req = (const void *)m;
  srv_req_limits l = srv_call_limits(c);
  dev_status st = DEV_STATUS_INIT;
  if (srv_check_accepting(c->s, "Execute", &st) != PD_OK ||
      sched_check_ops(c->s->sched,
                      req->n_ops > LONG_MAX ? LONG_MAX : (long)req->n_ops,
                      &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  size_t n = req->n_ops;
  srv_arena a = {NULL};
  sched_op *ops = srv_arena_alloc(&a, sizeof(*ops) * n);
  sched_op_result *res = srv_arena_alloc(&a, sizeof(*res) * n);
  dev_attr *attrs = srv_arena_alloc(&a, sizeof(*attrs) * n * DEV_MAX_ATTRS);
  dev_devset *sets = srv_arena_alloc(&a, sizeof(*sets) * n);
  Paradev__V1__OpResult **pres = srv_arena_alloc(&a, sizeof(*pres) * n);
  if (!ops || !res || !attrs || !sets || !pres) {
    dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto fail;
  }
  if (srv_execute_item(&l, ss, req->ops, n, 0, srv_call_deadline_ns(c),
                       req->op_timeout_ms, attrs, sets, ops, res, &a,
                       &st) != PD_OK)
    goto fail;
  for (size_t i = 0; i < n; i++) {
    pres[i] = srv_result_to_pb(&a, &ops[i], &res[i]);
    if (!pres[i] || !srv_call_infos_devices(ss, &a, pres[i]->outputs,
                                            pres[i]->n_outputs, NULL)) {
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

/* --- Enqueue ----------------------------------------------------------------- */

typedef struct srv_enqueue_state {
  sched_session *ss;
  uint8_t token[SCHED_TOKEN_BYTES];
  uint64_t index;
  uint64_t tag;         /* marks this stream's queued ops */
  uint64_t deadline_ns; /* the stream's gRPC deadline (0: none) */
} srv_enqueue_state;

static void srv_enqueue_destroy(srv_call *c) {
  srv_enqueue_state *e = c->user;
  if (!e) return;
  /* A stream the client abandoned takes its not-yet-started ops with it. */
  if (e->ss && atomic_load(&c->cancelled)) {
    int n = sched_cancel(e->ss, e->tag);
    if (n) SRV_INFO("Enqueue stream cancelled: %d queued ops dropped", n);
  }
  sched_session_put(e->ss);
  free(e);
  c->user = NULL;
}

static void srv_enqueue_reply(srv_call *c, uint64_t index, const dev_status *st,
                              Paradev__V1__TensorInfo **outs, size_t n_outs) {
  Paradev__V1__Status ps;
  char msg[DEV_STATUS_MSG_MAX];
  srv_status_to_pb(st, msg, &ps);
  Paradev__V1__EnqueueResponse resp = PARADEV__V1__ENQUEUE_RESPONSE__INIT;
  resp.index = index;
  resp.status = &ps;
  if (st->code == PD_OK && outs) {
    resp.n_outputs = n_outs;
    resp.outputs = outs;
  }
  srv_call_write(c, &resp.base);
}

static void srv_enqueue_msg(srv_call *c, const ProtobufCMessage *m) {
  srv_enqueue_state *e = c->user;
  if (!m) {
    srv_call_finish(c, PD_OK, "%s", "");
    return;
  }
  const Paradev__V1__EnqueueRequest *req = (const void *)m;
  if (!e) {
    e = c->user = calloc(1, sizeof(*e));
    if (!e) {
      srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
      return;
    }
    e->ss = srv_call_session(c, req->session_token);
    if (!e->ss) return; /* the stream ends with the session's error */
    memcpy(e->token, req->session_token.data, SCHED_TOKEN_BYTES);
    e->tag = sched_new_tag(c->s->sched);
    e->deadline_ns = srv_call_deadline_ns(c);
  } else {
    sched_session_touch(e->ss);
  }
  uint64_t index = e->index++;
  dev_status st = DEV_STATUS_INIT;
  if (req->session_token.len != 0 &&
      (req->session_token.len != SCHED_TOKEN_BYTES ||
       memcmp(req->session_token.data, e->token, SCHED_TOKEN_BYTES) != 0)) {
    dev_error(&st, PD_INVALID_ARGUMENT,
              "item %llu names another session than the stream's first item",
              (unsigned long long)index);
    srv_enqueue_reply(c, index, &st, NULL, 0);
    return;
  }
  srv_req_limits l = srv_call_limits(c);
  /* While draining, items that bring new work are refused one by one; the
   * stream stays open for the rest (delete items, tape bookkeeping). */
  if ((req->item_case == PARADEV__V1__ENQUEUE_REQUEST__ITEM_EXECUTE ||
       req->item_case == PARADEV__V1__ENQUEUE_REQUEST__ITEM_GRADIENT) &&
      srv_check_accepting(
          c->s,
          req->item_case == PARADEV__V1__ENQUEUE_REQUEST__ITEM_EXECUTE
              ? "an Enqueue execute item"
              : "an Enqueue gradient item",
          &st) != PD_OK) {
    srv_enqueue_reply(c, index, &st, NULL, 0);
    return;
  }
  if (req->item_case == PARADEV__V1__ENQUEUE_REQUEST__ITEM_EXECUTE) {
    dev_attr attrs[DEV_MAX_ATTRS];
    dev_devset set;
    sched_op op;
    sched_op_result res;
    srv_op_infos infos; /* no arena: this is the path of every streamed op */
    infos.n = 0;
    infos.ptrs = NULL;
    srv_arena more = {NULL}; /* allocates only for a list output's results */
    Paradev__V1__Operation *const ops[1] = {req->execute};
    if (srv_execute_item(&l, e->ss, ops, 1, e->tag, e->deadline_ns,
                         req->op_timeout_ms, attrs, &set, &op, &res, &more,
                         &st) == PD_OK &&
        (!srv_op_infos_fill(&infos, &more, &op, &res) ||
         !srv_call_infos_devices(
             e->ss, &more, infos.ptrs, infos.n,
             infos.ptrs == infos.local ? infos.devs : NULL)))
      dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    srv_enqueue_reply(c, index, &st, infos.ptrs, infos.n);
    srv_arena_free(&more);
  } else if (req->item_case ==
             PARADEV__V1__ENQUEUE_REQUEST__ITEM_REGISTER_FUNCTION) {
    /* Done before the next item is read: the calls behind it find it. */
    if (srv_mesh_check_functions(c->s->mesh, &st) == PD_OK)
      srv_register_function_item(&l, e->ss, req->register_function, NULL,
                                 &st);
    srv_enqueue_reply(c, index, &st, NULL, 0);
  } else if (req->item_case == PARADEV__V1__ENQUEUE_REQUEST__ITEM_DELETE) {
    const Paradev__V1__DeleteItem *di = req->delete_;
    srv_delete_item(&l, e->ss, di->ids, di->n_ids, &st);
    srv_enqueue_reply(c, index, &st, NULL, 0);
  } else {
    srv_arena a = {NULL};
    Paradev__V1__TensorInfo **outs = NULL;
    size_t n_outs = 0;
    if (!srv_tape_item(c, e->ss, e->tag, req, &a, &outs, &n_outs, &st))
      dev_error(&st, PD_INVALID_ARGUMENT,
                "item %llu has no item (execute, delete, start_tape, "
                "watch_tape, gradient, delete_tape or register_function)",
                (unsigned long long)index);
    srv_enqueue_reply(c, index, &st, outs, n_outs);
    srv_arena_free(&a);
  }
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
  srv_call_await_cancel(&y->w);
  sched_refs_release(y->refs, y->n);
  sched_session_put(y->ss);
  free(y);
  c->user = NULL;
}

static void srv_sync_step(srv_call *c) {
  srv_sync_state *y = c->user;
  if (y->w) srv_call_await_woken(&y->w);
  while (y->next < y->n) {
    dev_tensor *t = y->refs[y->next].t;
    if (!srv_call_await(c, y->ss, t, &y->w)) return; /* on_wake: back here */
    dev_status ts = DEV_STATUS_INIT;
    if (dev_tensor_wait(t, &ts) != PD_OK && y->first.code == PD_OK) {
      y->first = ts;
      y->first_id = y->refs[y->next].id;
    }
    y->next++;
  }
  Paradev__V1__Status es;
  char msg[DEV_STATUS_MSG_MAX];
  srv_status_to_pb(&y->first, msg, &es);
  Paradev__V1__SyncResponse resp = PARADEV__V1__SYNC_RESPONSE__INIT;
  resp.error = &es;
  resp.failed_id = y->first_id;
  srv_call_reply(c, &resp.base);
}

static void srv_sync_cancel(srv_call *c) {
  srv_sync_state *y = c->user;
  if (y) srv_call_await_cancel(&y->w);
  srv_call_finish_cancelled(c, "Sync");
}

static void srv_sync(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__SyncRequest *req = (const void *)m;
  if (!srv_ids_ok(c, req->n_ids)) return;
  srv_sync_state *y = calloc(1, sizeof(*y));
  if (!y) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->user = y;
  y->ss = srv_call_session(c, req->session_token);
  if (!y->ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (sched_collect(y->ss, req->ids, (int)req->n_ids, &y->refs, &y->n, &st) !=
      PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  srv_sync_step(c);
}

/* --- Describe, Delete ---------------------------------------------------------- */

static void srv_describe(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DescribeRequest *req = (const void *)m;
  if (!srv_ids_ok(c, req->n_ids)) return;
  sched_session *ss = srv_call_session(c, req->session_token);
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
    if (!srv_devset_to_arena(&a, dev_tensor_devset(t), &d->n_devices,
                             &d->devices)) {
      dev_tensor_release(t);
      dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      goto fail;
    }
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
  if (!srv_ids_ok(c, req->n_ids)) return;
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  srv_req_limits l = srv_call_limits(c);
  dev_status st = DEV_STATUS_INIT;
  if (srv_delete_item(&l, ss, req->ids, req->n_ids, &st) != PD_OK) {
    srv_call_fail(c, &st);
  } else {
    Paradev__V1__DeleteResponse resp = PARADEV__V1__DELETE_RESPONSE__INIT;
    resp.deleted = req->n_ids;
    srv_call_reply(c, &resp.base);
  }
  sched_session_put(ss);
}

const srv_handlers srv_h_Execute = {.on_request = srv_execute};
const srv_handlers srv_h_Enqueue = {.on_message = srv_enqueue_msg,
                                    .on_destroy = srv_enqueue_destroy};
const srv_handlers srv_h_Sync = {.on_request = srv_sync,
                                 .on_destroy = srv_sync_destroy,
                                 .on_wake = srv_sync_step,
                                 .on_cancel = srv_sync_cancel,
                                 .early_close = true};
const srv_handlers srv_h_Describe = {.on_request = srv_describe};
const srv_handlers srv_h_Delete = {.on_request = srv_delete};
