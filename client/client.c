/* libparadev: statuses, cancellation, the client (channel), the call
 * machinery shared by every RPC, and the client-level calls (Echo, health,
 * server info). See client_int.h for how calls use completion queues. */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_int.h"
#include "grpc/health/v1/health.pb-c.h"

#define PDC_DEFAULT_MAX_MESSAGE ((uint64_t)64 << 20)
#define PDC_DEFAULT_TIMEOUT_MS 60000
#define PDC_DEFAULT_CHUNK ((uint64_t)1 << 20)
#define PDC_TARGET_MAX 4096

const char *pd_version(void) { return "0.1.0"; }

/* --- status ---------------------------------------------------------------- */

pd_status *pd_status_new(void) { return calloc(1, sizeof(pd_status)); }

void pd_status_delete(pd_status *s) { free(s); }

pd_code pd_status_code(const pd_status *s) { return s ? s->code : PD_OK; }

const char *pd_status_message(const pd_status *s) { return s ? s->msg : ""; }

void pd_status_set(pd_status *s, pd_code code, const char *msg) {
  if (!s) return;
  s->code = code;
  snprintf(s->msg, sizeof(s->msg), "%s", msg ? msg : "");
}

pd_code pdc_error(pd_status *st, pd_code code, const char *fmt, ...) {
  if (st) {
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof(st->msg), fmt, ap);
    va_end(ap);
  }
  return code;
}

void pdc_ok(pd_status *st) {
  if (st) {
    st->code = PD_OK;
    st->msg[0] = '\0';
  }
}

const char *pd_status_str(pd_code code) {
  switch (code) {
    case PD_OK: return "success";
    case PD_CANCELLED: return "the call was cancelled; retry if it is still wanted";
    case PD_UNKNOWN: return "unknown error; see the daemon's log";
    case PD_INVALID_ARGUMENT: return "fix the request as the message says";
    case PD_DEADLINE_EXCEEDED:
      return "the deadline passed; raise the timeout or check the daemon's load";
    case PD_NOT_FOUND:
      return "the session or handle does not exist (closed, expired, deleted, or "
             "the daemon restarted); open a new session";
    case PD_ALREADY_EXISTS: return "pick an id that is not in use";
    case PD_PERMISSION_DENIED: return "not allowed; check permissions";
    case PD_RESOURCE_EXHAUSTED:
      return "a limit or memory ran out; free handles or ask for less";
    case PD_FAILED_PRECONDITION: return "the object is not in a state for this call";
    case PD_ABORTED: return "aborted; retry";
    case PD_OUT_OF_RANGE: return "a value or buffer is out of range; see the message";
    case PD_UNIMPLEMENTED: return "the daemon does not implement this; upgrade it";
    case PD_INTERNAL: return "a bug in paradev; please report it with the daemon's log";
    case PD_UNAVAILABLE:
      return "check that paradevd runs and listens on this address, then retry";
    case PD_DATA_LOSS: return "data was lost or corrupted in transit; retry";
    case PD_UNAUTHENTICATED: return "the session token is malformed; open a new session";
  }
  return "unknown status code";
}

/* pd_code_name, pd_dtype_* (paradev/types.h) are defined in types.c. */

/* --- cancellation ------------------------------------------------------------ */

pd_cancel *pd_cancel_new(void) {
  pd_cancel *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->triggered, false);
  return c;
}

void pd_cancel_trigger(pd_cancel *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  atomic_store(&c->triggered, true);
  for (size_t i = 0; i < c->n; i++) grpc_call_cancel(c->calls[i], NULL);
  pthread_mutex_unlock(&c->mu);
}

bool pd_cancel_is_triggered(const pd_cancel *c) {
  return c && atomic_load(&((pd_cancel *)c)->triggered);
}

void pd_cancel_delete(pd_cancel *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  free(c->calls);
  free(c);
}

/* Registers a call with a token: PD_CANCELLED when the token was already
 * triggered, PD_RESOURCE_EXHAUSTED when out of memory. */
static pd_code pdc_cancel_add(pd_cancel *c, grpc_call *call, pd_status *st) {
  pthread_mutex_lock(&c->mu);
  if (atomic_load(&c->triggered)) {
    pthread_mutex_unlock(&c->mu);
    return pdc_error(st, PD_CANCELLED, "cancelled by the caller (pd_cancel)");
  }
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 8;
    grpc_call **n = realloc(c->calls, cap * sizeof(*n));
    if (!n) {
      pthread_mutex_unlock(&c->mu);
      return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    }
    c->calls = n;
    c->cap = cap;
  }
  c->calls[c->n++] = call;
  pthread_mutex_unlock(&c->mu);
  return PD_OK;
}

static void pdc_cancel_remove(pd_cancel *c, grpc_call *call) {
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < c->n; i++)
    if (c->calls[i] == call) {
      c->calls[i] = c->calls[--c->n];
      break;
    }
  pthread_mutex_unlock(&c->mu);
}

/* --- client -------------------------------------------------------------------- */

const char *const pdc_method_paths[PDC_NUM_METHODS] = {
    [PDC_GET_SERVER_INFO] = "/paradev.v1.ParallelDevice/GetServerInfo",
    [PDC_CREATE_SESSION] = "/paradev.v1.ParallelDevice/CreateSession",
    [PDC_KEEP_ALIVE] = "/paradev.v1.ParallelDevice/KeepAlive",
    [PDC_CLOSE_SESSION] = "/paradev.v1.ParallelDevice/CloseSession",
    [PDC_UPLOAD] = "/paradev.v1.ParallelDevice/Upload",
    [PDC_DOWNLOAD] = "/paradev.v1.ParallelDevice/Download",
    [PDC_EXECUTE] = "/paradev.v1.ParallelDevice/Execute",
    [PDC_ENQUEUE] = "/paradev.v1.ParallelDevice/Enqueue",
    [PDC_SYNC] = "/paradev.v1.ParallelDevice/Sync",
    [PDC_DESCRIBE] = "/paradev.v1.ParallelDevice/Describe",
    [PDC_DELETE] = "/paradev.v1.ParallelDevice/Delete",
    [PDC_ECHO] = "/paradev.v1.ParallelDevice/Echo",
    [PDC_ECHO_STREAM] = "/paradev.v1.ParallelDevice/EchoStream",
    [PDC_HEALTH_CHECK] = "/grpc.health.v1.Health/Check",
    [PDC_START_TAPE] = "/paradev.v1.ParallelDevice/StartTape",
    [PDC_WATCH_TAPE] = "/paradev.v1.ParallelDevice/WatchTape",
    [PDC_GRADIENT] = "/paradev.v1.ParallelDevice/Gradient",
    [PDC_DELETE_TAPE] = "/paradev.v1.ParallelDevice/DeleteTape",
    [PDC_REGISTER_SHM] = "/paradev.v1.ParallelDevice/RegisterSharedMemory",
    [PDC_UNREGISTER_SHM] = "/paradev.v1.ParallelDevice/UnregisterSharedMemory",
    [PDC_UPLOAD_SHM] = "/paradev.v1.ParallelDevice/UploadFromSharedMemory",
    [PDC_DOWNLOAD_SHM] = "/paradev.v1.ParallelDevice/DownloadToSharedMemory",
};

/* gRPC reads a port past 65535 modulo 65536 (127.0.0.1:99999 dials port
 * 34463) and cannot dial port 0: refuse both. Checks "host:port",
 * "[v6]:port" and "scheme:///host:port"; other forms are left to gRPC. */
static pd_code pdc_check_port(const char *target, pd_status *st) {
  const char *a = target, *port;
  if (strncmp(a, "unix:", 5) == 0 || strncmp(a, "unix-abstract:", 14) == 0)
    return PD_OK;
  const char *slashes = strstr(a, "///");
  if (slashes) a = slashes + 3;
  if (a[0] == '[') {
    const char *rb = strchr(a, ']');
    if (!rb || rb[1] != ':') return PD_OK;
    port = rb + 2;
  } else {
    port = strchr(a, ':');
    if (!port || strchr(port + 1, ':')) return PD_OK; /* none, or bare IPv6 */
    port++;
  }
  size_t n = strlen(port);
  if (n == 0 || strspn(port, "0123456789") != n) return PD_OK;
  unsigned long v = n > 9 ? 0 : strtoul(port, NULL, 10);
  if (v >= 1 && v <= 65535) return PD_OK;
  return pdc_error(st, PD_INVALID_ARGUMENT,
                   "target \"%s\": port %s is out of range; a port must be 1 "
                   "to 65535",
                   target, port);
}

pd_client *pd_client_new(const char *target, const pd_client_options *opts,
                         pd_status *st) {
  pd_client_options o = PD_CLIENT_OPTIONS_INITIALIZER;
  if (opts) {
    if (opts->struct_size < offsetof(pd_client_options, user_agent) ||
        opts->struct_size > sizeof(o)) {
      pdc_error(st, PD_INVALID_ARGUMENT,
                "pd_client_options.struct_size is %zu; start from "
                "PD_CLIENT_OPTIONS_INITIALIZER",
                opts->struct_size);
      return NULL;
    }
    memcpy(&o, opts, opts->struct_size);
  }
  size_t tlen = target ? strlen(target) : 0;
  if (tlen == 0 || tlen > PDC_TARGET_MAX) {
    pdc_error(st, PD_INVALID_ARGUMENT,
              "target is %zu bytes; expected \"unix:/path\" or \"host:port\" "
              "(1 to %d bytes)",
              tlen, PDC_TARGET_MAX);
    return NULL;
  }
  if (strncmp(target, "unix:", 5) == 0 && target[5] == '\0') {
    pdc_error(st, PD_INVALID_ARGUMENT,
              "target \"unix:\" has no path; expected \"unix:/path\"");
    return NULL;
  }
  if (pdc_check_port(target, st) != PD_OK) return NULL;
  if (o.max_message_bytes > INT_MAX) {
    pdc_error(st, PD_INVALID_ARGUMENT,
              "max_message_bytes %llu is over gRPC's limit of %d",
              (unsigned long long)o.max_message_bytes, INT_MAX);
    return NULL;
  }
  if (o.max_message_bytes && o.max_message_bytes < 4096) {
    pdc_error(st, PD_INVALID_ARGUMENT,
              "max_message_bytes %llu is under the minimum of 4096",
              (unsigned long long)o.max_message_bytes);
    return NULL;
  }
  if (o.default_timeout_ms < 0) {
    pdc_error(st, PD_INVALID_ARGUMENT,
              "default_timeout_ms is %lld; expected 0 (60 s) or more",
              (long long)o.default_timeout_ms);
    return NULL;
  }
  pd_client *c = calloc(1, sizeof(*c));
  if (!c || !(c->target = strdup(target))) {
    free(c);
    pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  c->max_message_bytes = o.max_message_bytes ? o.max_message_bytes
                                             : PDC_DEFAULT_MAX_MESSAGE;
  c->default_timeout_ms =
      o.default_timeout_ms ? o.default_timeout_ms : PDC_DEFAULT_TIMEOUT_MS;
  c->chunk_bytes_opt = o.chunk_bytes ? o.chunk_bytes : PDC_DEFAULT_CHUNK;
  pthread_mutex_init(&c->mu, NULL);

  grpc_init();
  grpc_arg args[3];
  size_t nargs = 0;
  args[nargs].type = GRPC_ARG_INTEGER;
  args[nargs].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[nargs++].value.integer = (int)c->max_message_bytes;
  args[nargs].type = GRPC_ARG_INTEGER;
  args[nargs].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[nargs++].value.integer = (int)c->max_message_bytes;
  if (o.user_agent) {
    args[nargs].type = GRPC_ARG_STRING;
    args[nargs].key = (char *)GRPC_ARG_PRIMARY_USER_AGENT_STRING;
    args[nargs++].value.string = (char *)o.user_agent;
  }
  grpc_channel_args chargs = {nargs, args};
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  c->channel = grpc_channel_create(target, creds, &chargs);
  grpc_channel_credentials_release(creds);
  if (!c->channel) {
    pdc_error(st, PD_INTERNAL, "gRPC could not create a channel to %s", target);
    goto fail;
  }
  for (int i = 0; i < PDC_NUM_METHODS; i++) {
    c->reg[i] = grpc_channel_register_call(c->channel, pdc_method_paths[i],
                                           NULL, NULL);
    if (!c->reg[i]) {
      pdc_error(st, PD_INTERNAL, "gRPC could not register %s",
                pdc_method_paths[i]);
      goto fail;
    }
  }
  pdc_ok(st);
  return c;
fail:
  if (c->channel) grpc_channel_destroy(c->channel);
  grpc_shutdown();
  pthread_mutex_destroy(&c->mu);
  free(c->target);
  free(c);
  return NULL;
}

void pd_client_delete(pd_client *c) {
  if (!c) return;
  grpc_channel_destroy(c->channel);
  grpc_shutdown();
  pthread_mutex_destroy(&c->mu);
  free(c->target);
  free(c);
}

const char *pd_client_target(const pd_client *c) { return c ? c->target : ""; }

/* --- calls ------------------------------------------------------------------------ */

void pdc_call_opts(pd_client *c, const pd_call_options *o, bool stream,
                   int64_t *timeout_ms, pd_cancel **cancel) {
  int64_t t = o ? o->timeout_ms : PD_TIMEOUT_DEFAULT;
  if (t == PD_TIMEOUT_DEFAULT) t = stream ? -1 : c->default_timeout_ms;
  if (t < 0) t = -1;
  *timeout_ms = t;
  *cancel = o ? o->cancel : NULL;
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
    return pdc_error(st, PD_CANCELLED, "%s: cancelled by the caller (pd_cancel)",
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
    pd_code rc = pdc_cancel_add(cancel, k->call, st);
    if (rc != PD_OK) return rc;
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
    if (grpc_call_start_batch(k->call, &op, 1, &k->status, NULL) != GRPC_CALL_OK)
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

pd_code pdc_call_status(pdc_call *k, pd_status *st) {
  const char *path = pdc_method_paths[k->method];
  const char *method = strrchr(path, '/') + 1;
  int dlen = (int)GRPC_SLICE_LENGTH(k->details);
  const char *d = (const char *)GRPC_SLICE_START_PTR(k->details);
  pd_code code = (pd_code)k->status;
  if (code == PD_OK) {
    pdc_ok(st);
    return PD_OK;
  }
  if ((unsigned)code > PD_UNAUTHENTICATED) code = PD_UNKNOWN;
  if (code == PD_CANCELLED && k->cancel && atomic_load(&k->cancel->triggered))
    return pdc_error(st, code, "%s: cancelled by the caller (pd_cancel)",
                     method);
  if (code == PD_DEADLINE_EXCEEDED && k->timeout_ms >= 0)
    return pdc_error(st, code, "%s: deadline of %lld ms exceeded (%.*s)",
                     method, (long long)k->timeout_ms, dlen, d);
  /* The daemon's own UNAVAILABLE (it is draining) says what happened; a
   * transport's does not name the daemon. */
  if (code == PD_UNAVAILABLE && dlen > 9 && memcmp(d, "paradevd ", 9) == 0)
    return pdc_error(st, code, "%.*s", dlen, d);
  if (code == PD_UNAVAILABLE)
    return pdc_error(st, code, "cannot reach %s: %.*s", k->c->target, dlen,
                     dlen ? d : "unavailable");
  if (code == PD_RESOURCE_EXHAUSTED && dlen > 0 &&
      strstr(d, "message larger than max") != NULL)
    return pdc_error(st, code,
                     "%s: %.*s (the client's limit is max_message_bytes = "
                     "%llu)",
                     method, dlen, d, (unsigned long long)k->c->max_message_bytes);
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
  pdc_call_opts(c, o, false, &timeout, &cancel);
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
  grpc_op ops[5];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &k.md_initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &recv;
  pdc_call_batch(&k, ops, 5, &k.md_initial);
  rc = pdc_call_finish(&k, st);
  if (rc != PD_OK) goto out;
  if (!recv) {
    rc = pdc_error(st, PD_INTERNAL, "%s: the daemon answered OK without a reply",
                   pdc_method_paths[m]);
    goto out;
  }
  *resp = pdc_unpack(resp_desc, recv);
  if (!*resp)
    rc = pdc_error(st, PD_INTERNAL, "%s: the reply (%zu bytes) cannot be decoded",
                   pdc_method_paths[m], grpc_byte_buffer_length(recv));
out:
  if (send) grpc_byte_buffer_destroy(send);
  if (recv) grpc_byte_buffer_destroy(recv);
  pdc_call_destroy(&k);
  return rc;
}

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
  pd_code rc = pdc_unary(c, PDC_ECHO, &req.base,
                         &paradev__v1__echo_response__descriptor,
                         (ProtobufCMessage **)&resp, call, st);
  if (rc != PD_OK) return rc;
  size_t n = resp->payload.len;
  if (n != len)
    rc = pdc_error(st, PD_DATA_LOSS, "Echo: sent %zu bytes, %zu came back", len,
                   n);
  else if (reply && n > reply_cap)
    rc = pdc_error(st, PD_DATA_LOSS,
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
  pd_code rc = pdc_unary(c, PDC_HEALTH_CHECK, &req.base,
                         &grpc__health__v1__health_check_response__descriptor,
                         (ProtobufCMessage **)&resp, call, st);
  if (rc != PD_OK) return rc;
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
  if (pdc_unary(c, PDC_GET_SERVER_INFO, &req.base,
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
    o->memory_peak_bytes = d->memory_peak_bytes;
    o->busy_seconds = d->busy_seconds;
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
