/* paradevd's gradient tapes on the wire: the unary StartTape, WatchTape,
 * Gradient and DeleteTape methods, and the same four as Enqueue items
 * (exec.c calls srv_tape_item). Each checks its message against the
 * limits and calls the scheduler (scheduler.h, "Gradient tapes"), which owns
 * the tapes and queues the gradient ops on the session's queue. */
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "check.h"
#include "log.h"
#include "server.h"
#include "srv_int.h"

/* INVALID_ARGUMENT for a request that lacks its item (proto3 leaves an
 * unset message field NULL). */
static pd_code srv_missing(const char *what, dev_status *st) {
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "the request has no %s; set it (see paradev.proto)", what);
}

static pd_code srv_tape_start(sched_session *ss,
                              const Paradev__V1__TapeStart *m, dev_status *st) {
  if (!m) return srv_missing("tape (TapeStart)", st);
  return sched_tape_start(ss, m->tape_id, m->persistent != 0, st);
}

static pd_code srv_tape_watch(const srv_req_limits *l, sched_session *ss,
                              const Paradev__V1__TapeWatch *m, dev_status *st) {
  if (!m) return srv_missing("watch (TapeWatch)", st);
  PD_TRY(srv_check_ids(l, m->n_ids, "ids to watch", st));
  return sched_tape_watch(ss, m->tape_id, m->ids, (int)m->n_ids, st);
}

static pd_code srv_tape_delete(sched_session *ss,
                               const Paradev__V1__TapeDelete *m,
                               dev_status *st) {
  if (!m) return srv_missing("tape (TapeDelete)", st);
  return sched_tape_delete(ss, m->tape_id, st);
}

/* Computes a gradient; on success *out gets one TensorInfo per source (in
 * `a`) and *n_out their number. */
static pd_code srv_tape_gradient(const srv_req_limits *l, sched_session *ss,
                                 const Paradev__V1__TapeGradient *m,
                                 uint64_t tag, srv_arena *a,
                                 Paradev__V1__TensorInfo ***out, size_t *n_out,
                                 dev_status *st) {
  if (!m) return srv_missing("gradient (TapeGradient)", st);
  PD_TRY(srv_check_ids(l, m->n_sources, "sources", st));
  if (m->n_result_ids != m->n_sources)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%zu sources but %zu result ids; expected one result id "
                     "per source",
                     m->n_sources, m->n_result_ids);
  size_t n = m->n_sources;
  pd_dtype *dts = srv_arena_alloc(a, sizeof(*dts) * (n + 1));
  dev_shape *shapes = srv_arena_alloc(a, sizeof(*shapes) * (n + 1));
  Paradev__V1__TensorInfo **infos =
      srv_arena_alloc(a, sizeof(*infos) * (n + 1));
  if (!dts || !shapes || !infos)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  sched_gradient g = {m->tape_id,         m->target,     m->sources, (int)n,
                      m->output_gradient, m->result_ids, (int)n};
  PD_TRY(sched_tape_gradient(ss, &g, tag, dts, shapes, st));
  for (size_t i = 0; i < n; i++) {
    infos[i] = srv_info_to_pb(a, m->result_ids[i], dts[i], &shapes[i], NULL);
    if (!infos[i])
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  if (!srv_call_infos_devices(ss, a, infos, n, NULL)) /* issue #17 */
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  *out = infos;
  *n_out = n;
  return PD_OK;
}

bool srv_tape_item(srv_call *c, sched_session *ss, uint64_t tag,
                   const Paradev__V1__EnqueueRequest *req, srv_arena *a,
                   Paradev__V1__TensorInfo ***out, size_t *n_out,
                   dev_status *st) {
  srv_req_limits l = srv_call_limits(c);
  *n_out = 0;
  switch (req->item_case) {
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_START_TAPE:
      srv_tape_start(ss, req->start_tape, st);
      return true;
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_WATCH_TAPE:
      srv_tape_watch(&l, ss, req->watch_tape, st);
      return true;
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_GRADIENT:
      srv_tape_gradient(&l, ss, req->gradient, tag, a, out, n_out, st);
      return true;
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_DELETE_TAPE:
      srv_tape_delete(ss, req->delete_tape, st);
      return true;
    default: return false;
  }
}

/* --- the unary methods --------------------------------------------------------- */

static void srv_start_tape_rpc(srv_call *c, const ProtobufCMessage *msg) {
  const Paradev__V1__StartTapeRequest *req = (const void *)msg;
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (srv_tape_start(ss, req->tape, &st) != PD_OK) {
    srv_call_fail(c, &st);
  } else {
    Paradev__V1__StartTapeResponse resp =
        PARADEV__V1__START_TAPE_RESPONSE__INIT;
    srv_call_reply(c, &resp.base);
  }
  sched_session_put(ss);
}

static void srv_watch_tape_rpc(srv_call *c, const ProtobufCMessage *msg) {
  const Paradev__V1__WatchTapeRequest *req = (const void *)msg;
  srv_req_limits l = srv_call_limits(c);
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (srv_tape_watch(&l, ss, req->watch, &st) != PD_OK) {
    srv_call_fail(c, &st);
  } else {
    Paradev__V1__WatchTapeResponse resp =
        PARADEV__V1__WATCH_TAPE_RESPONSE__INIT;
    srv_call_reply(c, &resp.base);
  }
  sched_session_put(ss);
}

static void srv_gradient_rpc(srv_call *c, const ProtobufCMessage *msg) {
  const Paradev__V1__GradientRequest *req = (const void *)msg;
  srv_req_limits l = srv_call_limits(c);
  dev_status st = DEV_STATUS_INIT;
  if (srv_check_accepting(c->s, "Gradient", &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  srv_arena a = {NULL};
  Paradev__V1__TensorInfo **infos = NULL;
  size_t n = 0;
  if (srv_tape_gradient(&l, ss, req->gradient, 0, &a, &infos, &n, &st) !=
      PD_OK) {
    srv_call_fail(c, &st);
  } else {
    Paradev__V1__GradientResponse resp = PARADEV__V1__GRADIENT_RESPONSE__INIT;
    resp.n_results = n;
    resp.results = infos;
    srv_call_reply(c, &resp.base);
  }
  srv_arena_free(&a);
  sched_session_put(ss);
}

static void srv_delete_tape_rpc(srv_call *c, const ProtobufCMessage *msg) {
  const Paradev__V1__DeleteTapeRequest *req = (const void *)msg;
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (srv_tape_delete(ss, req->tape, &st) != PD_OK) {
    srv_call_fail(c, &st);
  } else {
    Paradev__V1__DeleteTapeResponse resp =
        PARADEV__V1__DELETE_TAPE_RESPONSE__INIT;
    srv_call_reply(c, &resp.base);
  }
  sched_session_put(ss);
}

const srv_handlers srv_h_StartTape = {.on_request = srv_start_tape_rpc};
const srv_handlers srv_h_WatchTape = {.on_request = srv_watch_tape_rpc};
const srv_handlers srv_h_Gradient = {.on_request = srv_gradient_rpc};
const srv_handlers srv_h_DeleteTape = {.on_request = srv_delete_tape_rpc};
