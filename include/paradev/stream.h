/* libparadev: the streamed enqueue (pd_stream): execute and delete items
 * written without waiting for their replies (the Enqueue bidi stream).
 *
 * Part of the API of <paradev/paradev.h>, which includes this header: include
 * that one. Its conventions hold here.
 */
#ifndef PARADEV_STREAM_H
#define PARADEV_STREAM_H

#include "paradev/paradev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Streamed enqueue */

typedef struct pd_stream pd_stream;

/* The daemon's answer to one stream item. Valid during the callback only. */
typedef struct pd_stream_reply {
  uint64_t index;      /* 0-based position of the item */
  pd_code code;        /* the item's outcome */
  const char *message; /* "" when OK */
  int num_outputs;     /* execute items that succeeded */
  const pd_tensor_info *outputs;
} pd_stream_reply;

typedef void (*pd_stream_reply_fn)(void *arg, const pd_stream_reply *reply);

typedef struct pd_stream_options {
  size_t struct_size;
  pd_stream_reply_fn on_reply; /* called for every reply, in order, on the
                                  stream's own thread; must not call into the
                                  stream. NULL: none. */
  void *on_reply_arg;
  int max_in_flight;      /* items sent and not yet answered before
                                  pd_stream_execute waits; 0: 4096 */
  int64_t timeout_ms;     /* deadline of the whole stream; 0: none */
  uint32_t op_timeout_ms; /* each execute item's op must start on the
                             devices within this many ms of being queued
                             (else it and its consumers fail with
                             PD_DEADLINE_EXCEEDED); 0: the session's */
} pd_stream_options;

#define PD_STREAM_OPTIONS_INITIALIZER                                          \
  { sizeof(pd_stream_options), NULL, NULL, 0, 0, 0 }

/* Opens a bidirectional Enqueue stream on the session: items (execute,
 * delete, and the tape items below) are written without waiting for their replies, in order, and the
 * daemon answers each one, in order. A failed item does not end the stream.
 * The stream keeps a write queue (gRPC allows one send in flight) and a
 * thread that moves it and reads the replies. `opts` may be NULL. A stream
 * takes no pd_call_options: its deadline is opts->timeout_ms, and
 * pd_stream_delete cancels it.
 * Errors:   PD_FAILED_PRECONDITION (session closed), PD_RESOURCE_EXHAUSTED.
 *           Problems with the session or the daemon show on the first wait.
 * Thread safety: one thread at a time per stream.
 * Source: StreamingEnqueue of TensorFlow's eager service;
 *         paradev.v1.ParallelDevice/Enqueue. */
pd_stream *pd_stream_new(pd_session *s, const pd_stream_options *opts,
                         pd_status *st);

/* Queues an execute item; arguments as pd_execute (output ids of 0 are
 * replaced by fresh ids). Returns at once, unless max_in_flight items await
 * their replies: then it waits for one. *index (may be NULL) gets the item's
 * position. The item's own outcome comes in its reply.
 * Errors:   PD_INVALID_ARGUMENT (empty op name, a bad attribute), the
 *           stream's final error once it has ended (e.g. PD_NOT_FOUND for a
 *           session that is gone), PD_FAILED_PRECONDITION (after
 *           pd_stream_close). */
pd_code pd_stream_execute(pd_stream *t, const char *op, const uint64_t *inputs,
                          int n_inputs, const pd_attrs *attrs,
                          uint64_t *output_ids, int n_outputs, uint64_t *index,
                          pd_status *st);

/* pd_stream_execute with a placement (issue #17), as pd_execute_on: an op
 * without tensor inputs runs on devices[0..n_devices) (daemon device
 * indices, in order; NULL / 0: the session's default); an op with inputs
 * runs on their device set. The library checks only the list itself; the
 * daemon answers the rest in the item's reply.
 * Errors:   as pd_stream_execute, plus PD_INVALID_ARGUMENT (n_devices
 *           outside 0..PD_MAX_DEVICES, devices NULL with n_devices > 0);
 *           in the item's reply PD_PERMISSION_DENIED (a device outside the
 *           session's allowed set) and PD_INVALID_ARGUMENT (inputs on
 *           different sets, a device out of range or named twice).
 * Thread safety: as pd_stream_execute (one thread at a time per stream).
 * Source: TensorFlow's parallel device over a chosen list of devices;
 *         Operation.devices of paradev.v1. */
pd_code pd_stream_execute_on(pd_stream *t, const int32_t *devices,
                             int n_devices, const char *op,
                             const uint64_t *inputs, int n_inputs,
                             const pd_attrs *attrs, uint64_t *output_ids,
                             int n_outputs, uint64_t *index, pd_status *st);

/* Queues a delete item for `n` handles (all or nothing, as pd_delete).
 * Errors:   as pd_stream_execute. */
pd_code pd_stream_delete_ids(pd_stream *t, const uint64_t *ids, int n,
                             uint64_t *index, pd_status *st);

/* Waits until every item queued so far has its reply (or the stream ended),
 * at most timeout_ms (PD_TIMEOUT_NONE: no limit). Returns PD_OK when all of
 * them succeeded; otherwise the code of the first item that failed since the
 * last wait, with "item N: message (and K more items failed)"; each failure
 * is reported once.
 * Errors:   PD_DEADLINE_EXCEEDED (timeout), the first failed item's code, the
 *           stream's error. */
pd_code pd_stream_wait(pd_stream *t, int64_t timeout_ms, pd_status *st);

/* Ends the writing side, waits for the remaining replies and the call's
 * status. Returns as pd_stream_wait, or the call's error.
 * Errors:   as pd_stream_wait. */
pd_code pd_stream_close(pd_stream *t, int64_t timeout_ms, pd_status *st);

/* Items queued so far, replies received, and items that failed. */
uint64_t pd_stream_num_items(const pd_stream *t);
uint64_t pd_stream_num_replies(const pd_stream *t);
uint64_t pd_stream_num_failed(const pd_stream *t);

/* Frees the stream; one not closed is cancelled (items not yet started by the
 * daemon are dropped). NULL is a no-op. */
void pd_stream_delete(pd_stream *t);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_STREAM_H */
