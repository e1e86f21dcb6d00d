/* libparadev: a bidirectional stream with a write queue (see client_int.h).
 *
 * gRPC allows one send in flight per call, so writers append to a queue and
 * whoever sees the sender idle (a writer, or the stream's thread when a send
 * completes) starts the next send. One receive is always armed; the stream's
 * thread hands each reply to on_message, in order, and re-arms it. The thread
 * ends once the call's status has arrived and no batch is in flight. */
#include <grpc/support/time.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_int.h"

struct pdc_bidi {
  pdc_call k;
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* the write queue */
  grpc_byte_buffer **wq;
  size_t head, len, cap;
  grpc_byte_buffer *in_flight;
  bool sending, send_failed, close_requested, close_sent;
  uint64_t written;              /* messages accepted by pdc_bidi_write */
  atomic_uint_fast64_t received; /* replies handed to on_message */
  int max_in_flight;
  /* reading */
  grpc_byte_buffer *recv_bb;
  bool done;       /* the status arrived */
  int outstanding; /* batches started and not completed */
  pdc_bidi_msg_fn on_message;
  void *arg;
  /* tags (addresses only) */
  char t_start, t_send, t_recv, t_status, t_close;
};

/* Starts a batch (caller holds mu). */
static bool pdc_bidi_batch(pdc_bidi *b, const grpc_op *ops, size_t n,
                           void *tag) {
  b->outstanding++;
  if (grpc_call_start_batch(b->k.call, ops, n, tag, NULL) != GRPC_CALL_OK) {
    b->outstanding--;
    return false;
  }
  return true;
}

/* Sends the next queued message, or the half-close (caller holds mu). */
static void pdc_bidi_pump(pdc_bidi *b) {
  if (b->sending || b->send_failed || b->done) return;
  grpc_op op;
  memset(&op, 0, sizeof(op));
  if (b->len) {
    b->in_flight = b->wq[b->head];
    b->head = (b->head + 1) % b->cap;
    b->len--;
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = b->in_flight;
    b->sending = true;
    if (!pdc_bidi_batch(b, &op, 1, &b->t_send)) {
      b->sending = false;
      b->send_failed = true;
      grpc_byte_buffer_destroy(b->in_flight);
      b->in_flight = NULL;
      grpc_call_cancel(b->k.call, NULL);
    }
  } else if (b->close_requested && !b->close_sent) {
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    b->close_sent = true;
    if (!pdc_bidi_batch(b, &op, 1, &b->t_close)) b->send_failed = true;
  }
}

static void pdc_bidi_arm_recv(pdc_bidi *b, bool with_md) {
  grpc_op ops[2];
  memset(ops, 0, sizeof(ops));
  size_t n = 0;
  if (with_md) {
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata =
        &b->k.md_initial;
  }
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &b->recv_bb;
  if (!pdc_bidi_batch(b, ops, n, &b->t_recv)) grpc_call_cancel(b->k.call, NULL);
}

static void *pdc_bidi_main(void *arg) {
  pdc_bidi *b = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        b->k.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) break;
    pthread_mutex_lock(&b->mu);
    b->outstanding--;
    if (ev.tag == &b->t_send) {
      grpc_byte_buffer_destroy(b->in_flight);
      b->in_flight = NULL;
      b->sending = false;
      if (!ev.success) b->send_failed = true;
      pdc_bidi_pump(b);
      pthread_cond_broadcast(&b->cv);
    } else if (ev.tag == &b->t_recv) {
      grpc_byte_buffer *bb = b->recv_bb;
      b->recv_bb = NULL;
      if (ev.success && bb) {
        pthread_mutex_unlock(&b->mu);
        b->on_message(b->arg, bb);
        grpc_byte_buffer_destroy(bb);
        pthread_mutex_lock(&b->mu);
        atomic_fetch_add(&b->received, 1);
        pdc_bidi_arm_recv(b, false);
        pthread_cond_broadcast(&b->cv);
      } else if (bb) {
        grpc_byte_buffer_destroy(bb);
      }
    } else if (ev.tag == &b->t_status) {
      b->done = true;
      /* A send blocked on flow control would wait forever for a peer that
       * has stopped reading: cancelling the ended call fails it. */
      if (b->outstanding > 0) grpc_call_cancel(b->k.call, NULL);
      pthread_cond_broadcast(&b->cv);
    }
    bool end = b->done && b->outstanding == 0;
    pthread_mutex_unlock(&b->mu);
    if (end) break;
  }
  return NULL;
}

pdc_bidi *pdc_bidi_new(pd_client *c, pdc_method m, int64_t timeout_ms,
                       int max_in_flight, pdc_bidi_msg_fn on_message, void *arg,
                       pd_status *st) {
  pdc_bidi *b = calloc(1, sizeof(*b));
  if (!b) {
    pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  pthread_mutex_init(&b->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&b->cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&b->received, 0);
  b->max_in_flight = max_in_flight > 0 ? max_in_flight : 4096;
  b->on_message = on_message;
  b->arg = arg;
  if (pdc_call_start(&b->k, c, m, timeout_ms, NULL, true, st) != PD_OK)
    goto fail;
  grpc_op ops[2];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &b->k.md_trailing;
  ops[0].data.recv_status_on_client.status = &b->k.status;
  ops[0].data.recv_status_on_client.status_details = &b->k.details;
  ops[0].data.recv_status_on_client.error_string = &b->k.error_string;
  pthread_mutex_lock(&b->mu);
  bool ok = pdc_bidi_batch(b, ops, 1, &b->t_status);
  if (ok) {
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    pdc_security_md(c, &ops[0]);
    ok = pdc_bidi_batch(b, ops, 1, &b->t_start);
    if (ok)
      pdc_bidi_arm_recv(b, true);
    else
      grpc_call_cancel(b->k.call, NULL);
  }
  pthread_mutex_unlock(&b->mu);
  if (!ok) {
    /* Nothing started means no event will come: nothing to drain. */
    if (b->outstanding == 0) {
      pdc_error(st, PD_INTERNAL, "gRPC refused to start %s",
                pdc_method_paths[m]);
      goto fail;
    }
  }
  int e = pthread_create(&b->thread, NULL, pdc_bidi_main, b);
  if (e != 0) {
    grpc_call_cancel(b->k.call, NULL);
    /* Drain here: the batches complete on the queue. */
    pdc_bidi_main(b);
    pdc_error(st, PD_RESOURCE_EXHAUSTED, "cannot start the stream's thread");
    goto fail;
  }
  b->thread_started = true;
  pdc_ok(st);
  return b;
fail:
  pdc_call_destroy(&b->k);
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
  free(b);
  return NULL;
}

/* The call's error once it ended (caller holds mu, b->done). */
static pd_code pdc_bidi_ended(pdc_bidi *b, pd_status *st) {
  pd_code rc = pdc_call_status(&b->k, st);
  if (rc == PD_OK)
    rc =
        pdc_error(st, PD_FAILED_PRECONDITION, "%s: the daemon ended the stream",
                  pdc_method_paths[b->k.method]);
  return rc;
}

pd_code pdc_bidi_write(pdc_bidi *b, grpc_byte_buffer *bb, pd_status *st) {
  pd_code rc = PD_OK;
  pthread_mutex_lock(&b->mu);
  while (!b->done && !b->send_failed &&
         b->written - atomic_load(&b->received) >= (uint64_t)b->max_in_flight)
    pthread_cond_wait(&b->cv, &b->mu);
  if (b->close_requested) {
    rc = pdc_error(st, PD_FAILED_PRECONDITION,
                   "the stream was closed for writing");
  } else if (b->send_failed || b->done) {
    while (!b->done) pthread_cond_wait(&b->cv, &b->mu);
    rc = pdc_bidi_ended(b, st);
  } else {
    if (b->len == b->cap) {
      size_t cap = b->cap ? b->cap * 2 : 64;
      grpc_byte_buffer **n = malloc(cap * sizeof(*n));
      if (!n) {
        rc = pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
        goto out;
      }
      for (size_t i = 0; i < b->len; i++) n[i] = b->wq[(b->head + i) % b->cap];
      free(b->wq);
      b->wq = n;
      b->head = 0;
      b->cap = cap;
    }
    b->wq[(b->head + b->len) % b->cap] = bb;
    b->len++;
    bb = NULL;
    b->written++;
    pdc_bidi_pump(b);
    pdc_ok(st);
  }
out:
  pthread_mutex_unlock(&b->mu);
  if (bb) grpc_byte_buffer_destroy(bb);
  return rc;
}

/* Waits on cv until `deadline_ms` (monotonic; < 0: none). False on timeout. */
static bool pdc_bidi_wait_cv(pdc_bidi *b, int64_t deadline_ms) {
  if (deadline_ms < 0) {
    pthread_cond_wait(&b->cv, &b->mu);
    return true;
  }
  int64_t now = pdc_now_ms();
  if (now >= deadline_ms) return false;
  struct timespec ts = {(time_t)(deadline_ms / 1000),
                        (long)(deadline_ms % 1000) * 1000000L};
  pthread_cond_timedwait(&b->cv, &b->mu, &ts);
  return true;
}

pd_code pdc_bidi_wait(pdc_bidi *b, uint64_t count, int64_t deadline_ms,
                      pd_status *st) {
  pd_code rc = PD_OK;
  pthread_mutex_lock(&b->mu);
  for (;;) {
    if (atomic_load(&b->received) >= count) break;
    if (b->done) {
      rc = pdc_bidi_ended(b, st);
      goto out;
    }
    if (!pdc_bidi_wait_cv(b, deadline_ms)) {
      rc = pdc_error(st, PD_DEADLINE_EXCEEDED,
                     "%s: %llu of %llu replies within the timeout",
                     pdc_method_paths[b->k.method],
                     (unsigned long long)atomic_load(&b->received),
                     (unsigned long long)count);
      goto out;
    }
  }
  pdc_ok(st);
out:
  pthread_mutex_unlock(&b->mu);
  return rc;
}

pd_code pdc_bidi_close(pdc_bidi *b, int64_t deadline_ms, pd_status *st) {
  pthread_mutex_lock(&b->mu);
  b->close_requested = true;
  pdc_bidi_pump(b);
  bool timed_out = false;
  while (!b->done) {
    if (!pdc_bidi_wait_cv(b, timed_out ? -1 : deadline_ms)) {
      timed_out = true;
      grpc_call_cancel(b->k.call, NULL);
    }
  }
  pd_code rc = timed_out ? pdc_error(st, PD_DEADLINE_EXCEEDED,
                                     "%s: the stream did not end within the "
                                     "timeout; it was cancelled",
                                     pdc_method_paths[b->k.method])
                         : pdc_call_status(&b->k, st);
  pthread_mutex_unlock(&b->mu);
  return rc;
}

uint64_t pdc_bidi_written(const pdc_bidi *b) { return b->written; }

uint64_t pdc_bidi_received(const pdc_bidi *b) {
  return atomic_load(&((pdc_bidi *)b)->received);
}

void pdc_bidi_delete(pdc_bidi *b) {
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  if (!b->done) grpc_call_cancel(b->k.call, NULL);
  pthread_mutex_unlock(&b->mu);
  if (b->thread_started) pthread_join(b->thread, NULL);
  while (b->len) {
    grpc_byte_buffer_destroy(b->wq[b->head]);
    b->head = (b->head + 1) % b->cap;
    b->len--;
  }
  free(b->wq);
  if (b->in_flight) grpc_byte_buffer_destroy(b->in_flight);
  if (b->recv_bb) grpc_byte_buffer_destroy(b->recv_bb);
  pdc_call_destroy(&b->k);
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
  free(b);
}
