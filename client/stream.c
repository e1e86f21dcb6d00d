/* libparadev: pd_stream, the streamed Enqueue of execute and delete items
 * over a pdc_bidi. Replies are decoded on the stream's thread; failures are
 * counted and the first one since the last wait is kept for pd_stream_wait. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

struct pd_stream {
  pd_session *s;
  pdc_bidi *b;
  pd_stream_reply_fn on_reply;
  void *on_reply_arg;
  int64_t deadline_ms;    /* < 0: none */
  uint32_t op_timeout_ms; /* sent with every execute item; 0: none */
  bool token_sent;
  bool closed;
  uint64_t items;
  /* written by the stream's thread, read by the caller's */
  pthread_mutex_t mu;
  uint64_t failed;
  uint64_t pending_failed; /* since the last wait */
  uint64_t first_index;
  pd_code first_code;
  char first_msg[PDC_MSG_MAX];
};

static void pdc_stream_on_message(void *arg, grpc_byte_buffer *bb) {
  pd_stream *t = arg;
  Paradev__V1__EnqueueResponse *r = (Paradev__V1__EnqueueResponse *)pdc_unpack(
      &paradev__v1__enqueue_response__descriptor, bb);
  pd_stream_reply rep;
  memset(&rep, 0, sizeof(rep));
  pd_tensor_info outs_small[8];
  pd_tensor_info *outs = outs_small;
  if (!r) {
    rep.code = PD_INTERNAL;
    rep.message = "Enqueue: a reply that cannot be decoded";
    rep.index = pdc_bidi_received(t->b);
  } else {
    rep.index = r->index;
    int code = r->status ? r->status->code : 0;
    rep.code = pdc_code_from_wire(code);
    rep.message = r->status && r->status->message ? r->status->message : "";
    if (rep.code == PD_OK && r->n_outputs) {
      if (r->n_outputs > 8) outs = calloc(r->n_outputs, sizeof(*outs));
      if (!outs) {
        rep.code = PD_RESOURCE_EXHAUSTED;
        rep.message = "out of host memory decoding a reply";
        outs = outs_small;
      } else {
        size_t k = 0;
        for (size_t i = 0; i < r->n_outputs; i++)
          if (pdc_info_from_pb(r->outputs[i], &outs[k])) k++;
        rep.num_outputs = (int)k;
        rep.outputs = outs;
      }
    }
  }
  if (rep.code != PD_OK) {
    pthread_mutex_lock(&t->mu);
    t->failed++;
    if (t->pending_failed++ == 0) {
      t->first_index = rep.index;
      t->first_code = rep.code;
      pd_status tmp;
      pdc_error(&tmp, rep.code, "%s", rep.message);
      memcpy(t->first_msg, tmp.msg, sizeof(t->first_msg));
    }
    pthread_mutex_unlock(&t->mu);
  }
  if (t->on_reply) t->on_reply(t->on_reply_arg, &rep);
  if (outs != outs_small) free(outs);
  if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
}

pd_stream *pd_stream_new(pd_session *s, const pd_stream_options *opts,
                         pd_status *st) {
  pd_stream_options o = PD_STREAM_OPTIONS_INITIALIZER;
  if (pdc_session_check(s, st) != PD_OK) return NULL;
  if (opts) {
    if (opts->struct_size < offsetof(pd_stream_options, timeout_ms) ||
        opts->struct_size > sizeof(o)) {
      pdc_error(st, PD_INVALID_ARGUMENT,
                "pd_stream_options.struct_size is %zu; start from "
                "PD_STREAM_OPTIONS_INITIALIZER",
                opts->struct_size);
      return NULL;
    }
    memcpy(&o, opts, opts->struct_size);
  }
  if (o.max_in_flight < 0 || o.timeout_ms < 0) {
    pdc_error(st, PD_INVALID_ARGUMENT,
              "max_in_flight %d and timeout_ms %lld must be >= 0",
              o.max_in_flight, (long long)o.timeout_ms);
    return NULL;
  }
  pd_stream *t = calloc(1, sizeof(*t));
  if (!t) {
    pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  t->s = s;
  t->on_reply = o.on_reply;
  t->on_reply_arg = o.on_reply_arg;
  t->deadline_ms = o.timeout_ms ? pdc_now_ms() + o.timeout_ms : -1;
  t->op_timeout_ms = o.op_timeout_ms;
  pthread_mutex_init(&t->mu, NULL);
  t->b = pdc_bidi_new(s->c, PDC_M_Enqueue, o.timeout_ms ? o.timeout_ms : -1,
                      o.max_in_flight, pdc_stream_on_message, t, st);
  if (!t->b) {
    pthread_mutex_destroy(&t->mu);
    free(t);
    return NULL;
  }
  return t;
}

pd_session *pdc_stream_session(const pd_stream *t) { return t->s; }

pd_code pdc_stream_send(pd_stream *t, Paradev__V1__EnqueueRequest *r,
                        uint64_t *index, pd_status *st) {
  if (t->closed)
    return pdc_error(st, PD_FAILED_PRECONDITION,
                     "the stream was closed (pd_stream_close)");
  if (!t->token_sent) {
    r->session_token.data = t->s->token;
    r->session_token.len = t->s->token_len;
  }
  size_t len = protobuf_c_message_get_packed_size(&r->base);
  if (len > t->s->c->max_message_bytes)
    return pdc_error(st, PD_RESOURCE_EXHAUSTED,
                     "an Enqueue item of %zu bytes; the limit "
                     "max_message_bytes is %llu",
                     len, (unsigned long long)t->s->c->max_message_bytes);
  grpc_byte_buffer *bb = pdc_pack(&r->base);
  PD_TRY(pdc_bidi_write(t->b, bb, st));
  t->token_sent = true;
  if (index) *index = t->items;
  t->items++;
  pdc_session_touch(t->s);
  return PD_OK;
}

pd_code pd_stream_execute(pd_stream *t, const char *op, const uint64_t *inputs,
                          int n_inputs, const pd_attrs *attrs,
                          uint64_t *output_ids, int n_outputs, uint64_t *index,
                          pd_status *st) {
  return pd_stream_execute_on(t, NULL, 0, op, inputs, n_inputs, attrs,
                              output_ids, n_outputs, index, st);
}

pd_code pd_stream_execute_on(pd_stream *t, const int32_t *devices,
                             int n_devices, const char *op,
                             const uint64_t *inputs, int n_inputs,
                             const pd_attrs *attrs, uint64_t *output_ids,
                             int n_outputs, uint64_t *index, pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  Paradev__V1__Operation o;
  PD_TRY(pdc_op_build(&o, t->s, op, inputs, n_inputs, attrs, output_ids,
                      n_outputs, st));
  PD_TRY(pdc_op_place(&o, devices, n_devices, st));
  Paradev__V1__EnqueueRequest r = PARADEV__V1__ENQUEUE_REQUEST__INIT;
  r.item_case = PARADEV__V1__ENQUEUE_REQUEST__ITEM_EXECUTE;
  r.execute = &o;
  r.op_timeout_ms = t->op_timeout_ms;
  return pdc_stream_send(t, &r, index, st);
}

pd_code pd_stream_delete_ids(pd_stream *t, const uint64_t *ids, int n,
                             uint64_t *index, pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  PD_TRY(pdc_check_ids(ids, n, st));
  Paradev__V1__DeleteItem d = PARADEV__V1__DELETE_ITEM__INIT;
  d.n_ids = (size_t)n;
  d.ids = (uint64_t *)ids;
  Paradev__V1__EnqueueRequest r = PARADEV__V1__ENQUEUE_REQUEST__INIT;
  r.item_case = PARADEV__V1__ENQUEUE_REQUEST__ITEM_DELETE;
  r.delete_ = &d;
  return pdc_stream_send(t, &r, index, st);
}

/* Reports (and forgets) the items that failed since the last report. */
static pd_code pdc_stream_failures(pd_stream *t, pd_status *st) {
  pthread_mutex_lock(&t->mu);
  pd_code rc = PD_OK;
  if (t->pending_failed) {
    if (t->pending_failed > 1)
      rc = pdc_error(st, t->first_code,
                     "item %" PRIu64 ": %s (and %" PRIu64 " more items failed)",
                     t->first_index, t->first_msg, t->pending_failed - 1);
    else
      rc = pdc_error(st, t->first_code, "item %" PRIu64 ": %s", t->first_index,
                     t->first_msg);
    t->pending_failed = 0;
  } else {
    pdc_ok(st);
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

static int64_t pdc_stream_deadline(const pd_stream *t, int64_t timeout_ms) {
  int64_t d = timeout_ms >= 0 ? pdc_now_ms() + timeout_ms : -1;
  if (t->deadline_ms >= 0 && (d < 0 || t->deadline_ms < d)) d = t->deadline_ms;
  return d;
}

pd_code pd_stream_wait(pd_stream *t, int64_t timeout_ms, pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  PD_TRY(pdc_bidi_wait(t->b, t->items, pdc_stream_deadline(t, timeout_ms), st));
  return pdc_stream_failures(t, st);
}

pd_code pd_stream_close(pd_stream *t, int64_t timeout_ms, pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  if (t->closed)
    return pdc_error(st, PD_FAILED_PRECONDITION,
                     "the stream was already closed");
  t->closed = true;
  PD_TRY(pdc_bidi_close(t->b, pdc_stream_deadline(t, timeout_ms), st));
  uint64_t got = pdc_bidi_received(t->b);
  if (got != t->items)
    return pdc_error(st, PD_INTERNAL,
                     "Enqueue: the stream ended with %" PRIu64
                     " replies for %" PRIu64 " items",
                     got, t->items);
  return pdc_stream_failures(t, st);
}

uint64_t pd_stream_num_items(const pd_stream *t) { return t ? t->items : 0; }

uint64_t pd_stream_num_replies(const pd_stream *t) {
  return t ? pdc_bidi_received(t->b) : 0;
}

uint64_t pd_stream_num_failed(const pd_stream *t) {
  if (!t) return 0;
  pthread_mutex_lock(&((pd_stream *)t)->mu);
  uint64_t n = t->failed;
  pthread_mutex_unlock(&((pd_stream *)t)->mu);
  return n;
}

void pd_stream_delete(pd_stream *t) {
  if (!t) return;
  pdc_bidi_delete(t->b);
  pthread_mutex_destroy(&t->mu);
  free(t);
}
