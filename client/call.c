/* libparadev: the call machinery every RPC shares: options, starting a call
 * on its own completion queue, batches, the status and its message, packing
 * and unpacking messages, and the unary call. See client_int.h. */
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stddef.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

/* --- calls ------------------------------------------------------------------------ */

pd_code pdc_call_opts(pd_client *c, const pd_call_options *opts,
                      int64_t *timeout_ms, pd_cancel **cancel, pd_status *st) {
  pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
  if (opts) {
    if (opts->struct_size < offsetof(pd_call_options, cancel) ||
        opts->struct_size > sizeof(o))
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "pd_call_options.struct_size is %zu; expected %zu: "
                       "start from PD_CALL_OPTIONS_INITIALIZER",
                       opts->struct_size, sizeof(o));
    memcpy(&o, opts, opts->struct_size);
  }
  if (o.timeout_ms < PD_TIMEOUT_NONE)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_call_options.timeout_ms is %lld; expected a number "
                     "of milliseconds > 0, PD_TIMEOUT_DEFAULT (0) or "
                     "PD_TIMEOUT_NONE (-1)",
                     (long long)o.timeout_ms);
  *timeout_ms =
      o.timeout_ms == PD_TIMEOUT_DEFAULT ? c->default_timeout_ms : o.timeout_ms;
  *cancel = o.cancel;
  return PD_OK;
}

static gpr_timespec pdc_deadline(int64_t timeout_ms) {
  if (timeout_ms < 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

pd_code pdc_call_start(pdc_call *k, pd_client *c, pdc_method m,
                       int64_t timeout_ms, pd_cancel *cancel, bool use_next,
                       pd_status *st) {
  memset(k, 0, sizeof(*k));
  k->c = c;
  k->method = m;
  k->timeout_ms = timeout_ms;
  k->details = grpc_empty_slice();
  grpc_metadata_array_init(&k->md_initial);
  grpc_metadata_array_init(&k->md_trailing);
  if (cancel && atomic_load(&cancel->triggered))
    return pdc_error(st, PD_CANCELLED,
                     "%s: cancelled by the caller (pd_cancel)",
                     pdc_method_paths[m]);
  k->next_cq = use_next;
  k->cq = use_next ? grpc_completion_queue_create_for_next(NULL)
                   : grpc_completion_queue_create_for_pluck(NULL);
  if (!k->cq) return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  k->call = grpc_channel_create_registered_call(
      c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, k->cq, c->reg[m],
      pdc_deadline(timeout_ms), NULL);
  if (!k->call)
    return pdc_error(st, PD_INTERNAL, "gRPC could not create a call to %s",
                     pdc_method_paths[m]);
  if (cancel) {
    PD_TRY(pdc_cancel_add(cancel, k->call, st));
    k->cancel = cancel;
  }
  if (!use_next) {
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &k->md_trailing;
    op.data.recv_status_on_client.status = &k->status;
    op.data.recv_status_on_client.status_details = &k->details;
    op.data.recv_status_on_client.error_string = &k->error_string;
    if (grpc_call_start_batch(k->call, &op, 1, &k->status, NULL) !=
        GRPC_CALL_OK)
      return pdc_error(st, PD_INTERNAL, "gRPC refused to start %s",
                       pdc_method_paths[m]);
    k->status_started = true;
  }
  return PD_OK;
}

static bool pdc_pluck(pdc_call *k, void *tag) {
  grpc_event ev = grpc_completion_queue_pluck(
      k->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  return ev.type == GRPC_OP_COMPLETE && ev.success;
}

bool pdc_call_batch(pdc_call *k, const grpc_op *ops, size_t n, void *tag) {
  if (grpc_call_start_batch(k->call, ops, n, tag, NULL) != GRPC_CALL_OK)
    return false;
  return pdc_pluck(k, tag);
}

bool pdc_call_request(pdc_call *k, grpc_byte_buffer *send,
                      grpc_byte_buffer **recv) {
  grpc_op ops[5];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  pdc_security_md(k->c, &ops[0]);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &k->md_initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = recv;
  return pdc_call_batch(k, ops, recv ? 5 : 4, &k->md_initial);
}

/* Whether `needle` occurs in the first n bytes of d (not NUL-terminated),
 * anywhere or (`at_start`) at its start. */
static bool pdc_has_n(const char *d, size_t n, const char *needle,
                      bool at_start) {
  size_t m = strlen(needle);
  for (size_t i = 0; m <= n && i + m <= n; i++) {
    if (memcmp(d + i, needle, m) == 0) return true;
    if (at_start) break;
  }
  return false;
}

/* What gRPC's transport writes as a status's details when a connection
 * fails or breaks (its own error descriptions, strerror's words); never the
 * start of a sentence the daemon writes. */
static const char *const pdc_transport_details[] = {"failed to connect",
                                                    "Socket closed",
                                                    "Broken pipe",
                                                    "Connection reset",
                                                    "Connection refused",
                                                    "Connection closed",
                                                    "Connection aborted",
                                                    "Connection timed out",
                                                    "No such file or directory",
                                                    "Endpoint",
                                                    "FD shutdown",
                                                    "Transport closed",
                                                    "GOAWAY",
                                                    "keepalive",
                                                    "Keepalive",
                                                    "Stream removed",
                                                    "Stream closed",
                                                    "Delayed close",
                                                    "OS Error",
                                                    "recvmsg",
                                                    "sendmsg",
                                                    "Handshake",
                                                    "Ssl handshake",
                                                    "Cancelling all calls",
                                                    "Timeout occurred",
                                                    "Too many pings",
                                                    "Server shutdown",
                                                    "Failed parsing HTTP/2",
                                                    "connections to all"};

/* Whether a non-OK status is the daemon's own answer (a handler's
 * srv_call_finish) rather than one gRPC made for a connection that failed
 * or broke. Two signals, both needed:
 *  - gRPC core (src/core/lib/surface/call.cc) builds the error of a status
 *    it found in the call's trailers as "Error received from peer ADDRESS",
 *    and RECV_STATUS_ON_CLIENT's error_string shows it (gRPC 1.51:
 *    "UNKNOWN:Error received from peer unix:/run/x.sock {grpc_message:"the
 *    mesh is not whole ...", grpc_status:14, ...}"); a status made on this
 *    side before any trailers ("UNKNOWN:failed to connect to all addresses;
 *    last error: ...") never says it.
 *  - But the HTTP/2 transport fakes trailers for a stream its connection
 *    broke (grpc_chttp2_fake_status: details "Broken pipe", "Socket
 *    closed", ...), which then read as the peer's too: so details that
 *    start with gRPC's transport words (pdc_transport_details) are the
 *    transport's, whatever the error string says. The daemon's own text is
 *    a sentence of its own (a strerror it quotes comes after a prefix:
 *    "GET 'URL': Connection refused").
 * Without an error string (not seen with gRPC 1.51) the transport's words
 * anywhere in the details, or none, mean the transport. */
static bool pdc_status_from_daemon(const pdc_call *k, const char *d, int dlen) {
  size_t n = dlen > 0 ? (size_t)dlen : 0;
  if (n == 0) return false;
  size_t nt = sizeof(pdc_transport_details) / sizeof(pdc_transport_details[0]);
  for (size_t i = 0; i < nt; i++)
    if (pdc_has_n(d, n, pdc_transport_details[i], true)) return false;
  if (k->error_string)
    return strstr(k->error_string, "Error received from peer") != NULL;
  for (size_t i = 0; i < nt; i++)
    if (pdc_has_n(d, n, pdc_transport_details[i], false)) return false;
  return true;
}

pd_code pdc_call_status(pdc_call *k, pd_status *st) {
  const char *path = pdc_method_paths[k->method];
  const char *method = strrchr(path, '/') + 1;
  int dlen = (int)GRPC_SLICE_LENGTH(k->details);
  const char *d = (const char *)GRPC_SLICE_START_PTR(k->details);
  pd_code code = pdc_code_from_wire(k->status);
  if (code == PD_OK) {
    pdc_ok(st);
    return PD_OK;
  }
  if (code == PD_CANCELLED && k->cancel && atomic_load(&k->cancel->triggered))
    return pdc_error(st, code, "%s: cancelled by the caller (pd_cancel)",
                     method);
  if (code == PD_DEADLINE_EXCEEDED && k->timeout_ms >= 0)
    return pdc_error(st, code, "%s: deadline of %lld ms exceeded (%.*s)",
                     method, (long long)k->timeout_ms, dlen, d);
  /* The daemon's own UNAVAILABLE (it is draining, its mesh across machines
   * is not whole, a session the mesh ended, a storage URL it could not
   * fetch) says what happened in its words: it was reached. Only a
   * transport's is framed "cannot reach TARGET" (pd_status_hint then gives
   * the connectivity advice). */
  if (code == PD_UNAVAILABLE && dlen > 9 && memcmp(d, "paradevd ", 9) == 0)
    return pdc_error(st, code, "%.*s", dlen, d);
  if (code == PD_UNAVAILABLE && dlen > 0 && pdc_status_from_daemon(k, d, dlen))
    return pdc_error(st, code, "%.*s", dlen, d);
  char why[PDC_MSG_MAX];
  if (code == PD_UNAVAILABLE &&
      pdc_security_explain(k->c, d, dlen, why, sizeof(why)))
    return pdc_error(st, code, "%s", why);
  if (code == PD_UNAVAILABLE)
    return pdc_error(st, code, "cannot reach %s: %.*s", k->c->target, dlen,
                     dlen ? d : "unavailable");
  if (code == PD_RESOURCE_EXHAUSTED && dlen > 0 &&
      strstr(d, "message larger than max") != NULL)
    return pdc_error(st, code,
                     "%s: %.*s (the client's limit is max_message_bytes = "
                     "%llu)",
                     method, dlen, d,
                     (unsigned long long)k->c->max_message_bytes);
  return pdc_error(st, code, "%.*s", dlen, d);
}

pd_code pdc_call_finish(pdc_call *k, pd_status *st) {
  if (!k->status_started)
    return pdc_error(st, PD_INTERNAL, "%s: no status batch",
                     pdc_method_paths[k->method]);
  pdc_pluck(k, &k->status);
  k->status_started = false;
  return pdc_call_status(k, st);
}

void pdc_call_destroy(pdc_call *k) {
  if (k->call) {
    if (k->status_started) {
      grpc_call_cancel(k->call, NULL);
      pdc_pluck(k, &k->status);
    }
    if (k->cancel) pdc_cancel_remove(k->cancel, k->call);
    grpc_call_unref(k->call);
    k->call = NULL;
  }
  if (k->cq) {
    grpc_completion_queue_shutdown(k->cq);
    for (;;) {
      gpr_timespec inf = gpr_inf_future(GPR_CLOCK_REALTIME);
      grpc_event ev = k->next_cq
                          ? grpc_completion_queue_next(k->cq, inf, NULL)
                          : grpc_completion_queue_pluck(k->cq, NULL, inf, NULL);
      if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    }
    grpc_completion_queue_destroy(k->cq);
    k->cq = NULL;
  }
  grpc_metadata_array_destroy(&k->md_initial);
  grpc_metadata_array_destroy(&k->md_trailing);
  grpc_slice_unref(k->details);
  k->details = grpc_empty_slice();
  if (k->error_string) gpr_free((void *)k->error_string);
  k->error_string = NULL;
}

grpc_byte_buffer *pdc_pack(const ProtobufCMessage *m) {
  size_t len = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(len);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

ProtobufCMessage *pdc_unpack(const ProtobufCMessageDescriptor *d,
                             grpc_byte_buffer *bb) {
  if (bb->type == GRPC_BB_RAW &&
      bb->data.raw.compression == GRPC_COMPRESS_NONE &&
      bb->data.raw.slice_buffer.count == 1) {
    grpc_slice s = bb->data.raw.slice_buffer.slices[0];
    return protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s),
                                     GRPC_SLICE_START_PTR(s));
  }
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s),
                                                  GRPC_SLICE_START_PTR(s));
  grpc_slice_unref(s);
  return m;
}

pd_code pdc_unary(pd_client *c, pdc_method m, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *resp_desc,
                  ProtobufCMessage **resp, const pd_call_options *o,
                  pd_status *st) {
  int64_t timeout;
  pd_cancel *cancel;
  PD_TRY(pdc_call_opts(c, o, &timeout, &cancel, st));
  size_t len = protobuf_c_message_get_packed_size(req);
  if (len > c->max_message_bytes)
    return pdc_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: the request is %zu bytes; the limit "
                     "max_message_bytes is %llu",
                     strrchr(pdc_method_paths[m], '/') + 1, len,
                     (unsigned long long)c->max_message_bytes);
  pdc_call k;
  grpc_byte_buffer *send = NULL, *recv = NULL;
  pd_code rc = pdc_call_start(&k, c, m, timeout, cancel, false, st);
  if (rc != PD_OK) goto out;
  send = pdc_pack(req);
  pdc_call_request(&k, send, &recv);
  rc = pdc_call_finish(&k, st);
  if (rc != PD_OK) goto out;
  if (!recv) {
    rc =
        pdc_error(st, PD_INTERNAL, "%s: the daemon answered OK without a reply",
                  pdc_method_paths[m]);
    goto out;
  }
  *resp = pdc_unpack(resp_desc, recv);
  if (!*resp)
    rc = pdc_error(st, PD_INTERNAL,
                   "%s: the reply (%zu bytes) cannot be decoded",
                   pdc_method_paths[m], grpc_byte_buffer_length(recv));
out:
  if (send) grpc_byte_buffer_destroy(send);
  if (recv) grpc_byte_buffer_destroy(recv);
  pdc_call_destroy(&k);
  return rc;
}
