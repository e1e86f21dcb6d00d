/* libparadev: gradient tapes, as unary calls (StartTape, WatchTape,
 * Gradient, DeleteTape) and as items of an Enqueue stream. The daemon owns
 * the tapes; this file only encodes requests and decodes results. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

/* Checks the arguments of a gradient and fills result ids of 0 with fresh
 * ids (written back, so the caller learns them). */
static pd_code pdc_gradient_args(pd_session *s, uint64_t target,
                                 const uint64_t *sources, int n_sources,
                                 uint64_t *result_ids, pd_status *st) {
  if (target == 0)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "the target is handle 0; expected a live handle");
  if (n_sources < 0 || (n_sources > 0 && (!sources || !result_ids)))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%d sources (sources %s, result_ids %s); expected "
                     "n_sources >= 0, the source ids and room for a result id "
                     "per source",
                     n_sources, sources ? "given" : "NULL",
                     result_ids ? "given" : "NULL");
  for (int i = 0; i < n_sources; i++)
    if (result_ids[i] == 0) result_ids[i] = pd_session_new_id(s);
  return PD_OK;
}

static void pdc_gradient_msg(Paradev__V1__TapeGradient *g, uint64_t tape_id,
                             uint64_t target, const uint64_t *sources,
                             int n_sources, uint64_t output_gradient,
                             uint64_t *result_ids) {
  paradev__v1__tape_gradient__init(g);
  g->tape_id = tape_id;
  g->target = target;
  g->n_sources = (size_t)n_sources;
  g->sources = (uint64_t *)sources;
  g->output_gradient = output_gradient;
  g->n_result_ids = (size_t)n_sources;
  g->result_ids = result_ids;
}

/* --- unary calls ---------------------------------------------------------------- */

pd_code pd_tape_start(pd_session *s, uint64_t tape_id, bool persistent,
                      const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  Paradev__V1__TapeStart t = PARADEV__V1__TAPE_START__INIT;
  t.tape_id = tape_id;
  t.persistent = persistent;
  Paradev__V1__StartTapeRequest req = PARADEV__V1__START_TAPE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.tape = &t;
  ProtobufCMessage *resp = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_StartTape, &req.base,
                   &paradev__v1__start_tape_response__descriptor, &resp, call,
                   st));
  pdc_session_touch(s);
  protobuf_c_message_free_unpacked(resp, NULL);
  return PD_OK;
}

pd_code pd_tape_watch(pd_session *s, uint64_t tape_id, const uint64_t *ids,
                      int n, const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  PD_TRY(pdc_check_ids(ids, n, st));
  Paradev__V1__TapeWatch w = PARADEV__V1__TAPE_WATCH__INIT;
  w.tape_id = tape_id;
  w.n_ids = (size_t)n;
  w.ids = (uint64_t *)ids;
  Paradev__V1__WatchTapeRequest req = PARADEV__V1__WATCH_TAPE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.watch = &w;
  ProtobufCMessage *resp = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_WatchTape, &req.base,
                   &paradev__v1__watch_tape_response__descriptor, &resp, call,
                   st));
  pdc_session_touch(s);
  protobuf_c_message_free_unpacked(resp, NULL);
  return PD_OK;
}

pd_code pd_tape_gradient(pd_session *s, uint64_t tape_id, uint64_t target,
                         const uint64_t *sources, int n_sources,
                         uint64_t output_gradient, uint64_t *result_ids,
                         pd_tensor_info *results, const pd_call_options *call,
                         pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  pd_code rc = PD_OK;
  PD_TRY(pdc_gradient_args(s, target, sources, n_sources, result_ids, st));
  Paradev__V1__TapeGradient g;
  pdc_gradient_msg(&g, tape_id, target, sources, n_sources, output_gradient,
                   result_ids);
  Paradev__V1__GradientRequest req = PARADEV__V1__GRADIENT_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.gradient = &g;
  Paradev__V1__GradientResponse *resp = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_Gradient, &req.base,
                   &paradev__v1__gradient_response__descriptor,
                   (ProtobufCMessage **)&resp, call, st));
  pdc_session_touch(s);
  if (resp->n_results != (size_t)n_sources) {
    rc = pdc_error(st, PD_INTERNAL, "Gradient: %zu results for %d sources",
                   resp->n_results, n_sources);
  } else {
    for (int i = 0; results && i < n_sources; i++)
      if (!pdc_info_from_pb(resp->results[i], &results[i])) {
        rc = pdc_error(st, PD_INTERNAL, "Gradient: result %d has rank over %d",
                       i, PD_MAX_RANK);
        break;
      }
  }
  if (rc == PD_OK) pdc_ok(st);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

pd_code pd_tape_delete(pd_session *s, uint64_t tape_id,
                       const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  Paradev__V1__TapeDelete t = PARADEV__V1__TAPE_DELETE__INIT;
  t.tape_id = tape_id;
  Paradev__V1__DeleteTapeRequest req = PARADEV__V1__DELETE_TAPE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.tape = &t;
  ProtobufCMessage *resp = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_DeleteTape, &req.base,
                   &paradev__v1__delete_tape_response__descriptor, &resp, call,
                   st));
  pdc_session_touch(s);
  protobuf_c_message_free_unpacked(resp, NULL);
  return PD_OK;
}

/* --- stream items ----------------------------------------------------------------- */

pd_code pd_stream_tape_start(pd_stream *t, uint64_t tape_id, bool persistent,
                             uint64_t *index, pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  Paradev__V1__TapeStart m = PARADEV__V1__TAPE_START__INIT;
  m.tape_id = tape_id;
  m.persistent = persistent;
  Paradev__V1__EnqueueRequest r = PARADEV__V1__ENQUEUE_REQUEST__INIT;
  r.item_case = PARADEV__V1__ENQUEUE_REQUEST__ITEM_START_TAPE;
  r.start_tape = &m;
  return pdc_stream_send(t, &r, index, st);
}

pd_code pd_stream_tape_watch(pd_stream *t, uint64_t tape_id,
                             const uint64_t *ids, int n, uint64_t *index,
                             pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  PD_TRY(pdc_check_ids(ids, n, st));
  Paradev__V1__TapeWatch m = PARADEV__V1__TAPE_WATCH__INIT;
  m.tape_id = tape_id;
  m.n_ids = (size_t)n;
  m.ids = (uint64_t *)ids;
  Paradev__V1__EnqueueRequest r = PARADEV__V1__ENQUEUE_REQUEST__INIT;
  r.item_case = PARADEV__V1__ENQUEUE_REQUEST__ITEM_WATCH_TAPE;
  r.watch_tape = &m;
  return pdc_stream_send(t, &r, index, st);
}

pd_code pd_stream_tape_gradient(pd_stream *t, uint64_t tape_id, uint64_t target,
                                const uint64_t *sources, int n_sources,
                                uint64_t output_gradient, uint64_t *result_ids,
                                uint64_t *index, pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  PD_TRY(pdc_gradient_args(pdc_stream_session(t), target, sources, n_sources,
                           result_ids, st));
  Paradev__V1__TapeGradient m;
  pdc_gradient_msg(&m, tape_id, target, sources, n_sources, output_gradient,
                   result_ids);
  Paradev__V1__EnqueueRequest r = PARADEV__V1__ENQUEUE_REQUEST__INIT;
  r.item_case = PARADEV__V1__ENQUEUE_REQUEST__ITEM_GRADIENT;
  r.gradient = &m;
  return pdc_stream_send(t, &r, index, st);
}

pd_code pd_stream_tape_delete(pd_stream *t, uint64_t tape_id, uint64_t *index,
                              pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  Paradev__V1__TapeDelete m = PARADEV__V1__TAPE_DELETE__INIT;
  m.tape_id = tape_id;
  Paradev__V1__EnqueueRequest r = PARADEV__V1__ENQUEUE_REQUEST__INIT;
  r.item_case = PARADEV__V1__ENQUEUE_REQUEST__ITEM_DELETE_TAPE;
  r.delete_tape = &m;
  return pdc_stream_send(t, &r, index, st);
}
