/* Private header of client/ (libparadev). Internal names carry `pdc_`.
 *
 * Calls: every RPC creates its grpc_call on a completion queue of its own
 * (pluck for unary and client/server-streaming calls, driven by the calling
 * thread; next for bidirectional streams, driven by the stream's thread), as
 * gRPC's own synchronous C++ API does. Methods are registered on the channel
 * once (grpc_channel_register_call) so a call costs no method lookup.
 *
 * Files, each one domain, none calling another in a circle (README.md has
 * the order): status.c, cancel.c, methods.c, client.c, call.c, info.c,
 * session.c, attrs.c, encode.c, execute.c, handles.c, transfer.c, shm.c,
 * bidi.c, stream.c, tape.c. Locks: pd_client.mu, pd_cancel.mu, the
 * session's ka_mu, a stream's and a bidi call's own mutex; none is held
 * while another is taken, except that pd_cancel_trigger (cancel.c) calls
 * grpc_call_cancel under the token's mutex.
 */
#ifndef PARADEV_CLIENT_INT_H
#define PARADEV_CLIENT_INT_H

#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>

#include "paradev/paradev.h"
#include "paradev/v1/methods.h"
#include "paradev/v1/paradev.pb-c.h"

#define PDC_MSG_MAX 2048

struct pd_status {
  pd_code code;
  char msg[PDC_MSG_MAX];
};

/* --- statuses (status.c) ---------------------------------------------------- */

/* Sets a status (st may be NULL) and returns the code. */
pd_code pdc_error(pd_status *st, pd_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pdc_ok(pd_status *st);
/* A status code from the wire as a pd_code: PD_UNKNOWN when out of range. */
pd_code pdc_code_from_wire(int64_t code);

/* The methods the library calls, one per entry of proto/paradev/v1/methods.h
 * (PD_PARALLEL_DEVICE_METHODS, then PD_HEALTH_METHODS): PDC_M_Execute,
 * PDC_M_Check, ... in that order, which is the order they are registered. */
#define PDC_METHOD_ENUM(SERVICE, METHOD, KIND, REQUEST, RESPONSE)              \
  PDC_M_##METHOD,
typedef enum pdc_method {
  PD_PARALLEL_DEVICE_METHODS(PDC_METHOD_ENUM) PD_HEALTH_METHODS(PDC_METHOD_ENUM)
      PDC_NUM_METHODS
} pdc_method;
#undef PDC_METHOD_ENUM

/* "/paradev.v1.ParallelDevice/Execute", ... (methods.c). */
extern const char *const pdc_method_paths[PDC_NUM_METHODS];

/* --- the client (client.c) and its calls (call.c, info.c) ------------------ */

/* What the channel's security is (security.c): TLS or not, what was given,
 * for the handshake's errors; the bearer token's metadata. */
typedef struct pdc_security {
  bool tls;
  bool client_cert;      /* a certificate and key are offered */
  char ca_from[320];     /* "tls_ca_file /x", "$PARADEV_TLS_CA (/x)", "" */
  char cert_from[320];   /* likewise for the certificate */
  char server_name[256]; /* the override, "" for the target's host */
  bool token;            /* md holds "authorization: Bearer ..." */
  grpc_metadata md;
} pdc_security;

struct pd_client {
  char *target;
  grpc_channel *channel;
  pdc_security sec;
  void *reg[PDC_NUM_METHODS];
  uint64_t max_message_bytes;
  int64_t default_timeout_ms;
  uint64_t chunk_bytes_opt;
  /* Server limits, fetched once (GetServerInfo) when a transfer needs them. */
  pthread_mutex_t mu;
  bool have_limits;
  uint64_t server_max_chunk;
};

/* Cancellation tokens (cancel.c). */
struct pd_cancel {
  pthread_mutex_t mu;
  atomic_bool triggered;
  grpc_call **calls; /* in flight with the token, under mu */
  size_t n, cap;
};

/* Registers a call with a token (cancel.c): PD_CANCELLED when the token was
 * already triggered, PD_RESOURCE_EXHAUSTED when out of memory. */
pd_code pdc_cancel_add(pd_cancel *c, grpc_call *call, pd_status *st);
/* Unregisters a call (a no-op when it is not registered). */
void pdc_cancel_remove(pd_cancel *c, grpc_call *call);

/* --- security (security.c): TLS and the bearer token --------------------- */

/* Resolves the options' and the environment's TLS settings and token into
 * c->sec and the channel's credentials (*creds, the caller releases them);
 * *name_arg is set when a target-name override must go in the channel's
 * arguments. `tls_scheme`: the target said "tls://"; `unix_target`: a Unix
 * socket. c->sec.server_name, when set, goes into the channel's arguments
 * (GRPC_SSL_TARGET_NAME_OVERRIDE_ARG). PD_INVALID_ARGUMENT names the option
 * or variable at fault. */
pd_code pdc_security_init(pd_client *c, const pd_client_options *o,
                          bool tls_scheme, bool unix_target,
                          grpc_channel_credentials **creds, pd_status *st);
/* Frees what pdc_security_init kept. */
void pdc_security_free(pd_client *c);
/* Puts the call's initial metadata (the token, if any) into a
 * GRPC_OP_SEND_INITIAL_METADATA op. */
void pdc_security_md(const pd_client *c, grpc_op *op);
/* A message for an UNAVAILABLE whose details `d` (dlen bytes) show a TLS
 * handshake failure, naming the cause and the fix; false when they do not. */
bool pdc_security_explain(const pd_client *c, const char *d, int dlen,
                          char *out, size_t len);

/* One call in flight, with what its status batch receives. */
typedef struct pdc_call {
  pd_client *c;
  pdc_method method;
  grpc_completion_queue *cq;
  grpc_call *call;
  pd_cancel *cancel;  /* registered with, or NULL */
  int64_t timeout_ms; /* effective; < 0: none */
  grpc_metadata_array md_initial, md_trailing;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;
  bool status_started;
  bool next_cq; /* the queue is of the `next` kind (bidi streams) */
} pdc_call;

/* Checks and resolves the call options (NULL: defaults): *timeout_ms < 0
 * means none. PD_INVALID_ARGUMENT names a bad struct_size or timeout_ms. */
pd_code pdc_call_opts(pd_client *c, const pd_call_options *opts,
                      int64_t *timeout_ms, pd_cancel **cancel, pd_status *st);

/* Starts a call on a new completion queue (`next` kind when use_next, else
 * pluck), registered with the cancel token. With a pluck queue, a batch with
 * RECV_STATUS_ON_CLIENT is started at once (tag &k->status). */
pd_code pdc_call_start(pdc_call *k, pd_client *c, pdc_method m,
                       int64_t timeout_ms, pd_cancel *cancel, bool use_next,
                       pd_status *st);
/* Starts a batch on a pluck call and waits for it; returns its success. */
bool pdc_call_batch(pdc_call *k, const grpc_op *ops, size_t n, void *tag);
/* Sends a unary or server-streaming call's request (initial metadata, the
 * message, half-close) and waits for the initial metadata and, when recv is
 * not NULL, the first reply; returns the batch's success. */
bool pdc_call_request(pdc_call *k, grpc_byte_buffer *send,
                      grpc_byte_buffer **recv);
/* Waits for the status (pluck) and converts it. */
pd_code pdc_call_finish(pdc_call *k, pd_status *st);
/* Converts a received status into pd_code + message. */
pd_code pdc_call_status(pdc_call *k, pd_status *st);
/* Cancels (when not finished), unregisters, frees everything. */
void pdc_call_destroy(pdc_call *k);

/* Packs a message into a new byte buffer (one copy). NULL when out of
 * memory. */
grpc_byte_buffer *pdc_pack(const ProtobufCMessage *m);
/* Unpacks a received buffer; NULL on malformed bytes. */
ProtobufCMessage *pdc_unpack(const ProtobufCMessageDescriptor *d,
                             grpc_byte_buffer *bb);

/* A unary call: packs `req`, waits for the reply and unpacks it into *resp
 * (free with protobuf_c_message_free_unpacked(*resp, NULL)). */
pd_code pdc_unary(pd_client *c, pdc_method m, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *resp_desc,
                  ProtobufCMessage **resp, const pd_call_options *o,
                  pd_status *st);

/* The chunk size for transfers: options, the daemon's limit, the channel's
 * (info.c: it asks GetServerInfo once). */
pd_code pdc_chunk_bytes(pd_client *c, const pd_call_options *o, size_t *out,
                        pd_status *st);

/* --- sessions (session.c) -------------------------------------------------- */

struct pd_session {
  pd_client *c;
  uint8_t *token;
  size_t token_len;
  uint32_t lease_s;
  uint64_t incarnation;
  uint64_t memory_quota;
  int num_devices;                 /* the size of the allowed device set */
  int32_t devices[PD_MAX_DEVICES]; /* the allowed set, in order */
  atomic_bool closed;
  atomic_uint_fast64_t next_id;
  atomic_int_fast64_t last_call_ms; /* CLOCK_MONOTONIC; the lease's renewal */
  /* keep-alive */
  bool ka_running;
  pthread_t ka_thread;
  pthread_mutex_t ka_mu;
  pthread_cond_t ka_cv;
  bool ka_stop;
  pd_cancel *ka_cancel; /* ends a renewal in flight when the session closes */
  pd_code ka_code;
  char ka_msg[PDC_MSG_MAX];
};

int64_t pdc_now_ms(void);
/* Fails with FAILED_PRECONDITION when the session was closed. */
pd_code pdc_session_check(pd_session *s, pd_status *st);
/* Notes a successful call (renews the lease as the daemon does). */
void pdc_session_touch(pd_session *s);
/* A placement argument (issue #17): INVALID_ARGUMENT, naming `what`, unless
 * 0 <= n <= PD_MAX_DEVICES and devices is given when n > 0. Which devices
 * are valid is the daemon's to say. */
pd_code pdc_check_devices(const int32_t *devices, int n, const char *what,
                          pd_status *st);

/* --- attributes (attrs.c) and op encoding (encode.c) ---------------------- */

/* The wire attributes of a set (borrowed: valid while `a` is unchanged), or
 * the first error a setter recorded, with its message. */
pd_code pdc_attrs_encoded(const pd_attrs *a, Paradev__V1__Attr ***attrs,
                          size_t *n, const char **err_msg);

/* Fills `op` with pointers to the arguments (nothing is copied or
 * allocated: `op` lives as long as they do). Output ids of 0 are replaced
 * with fresh ids of `s`. */
pd_code pdc_op_build(Paradev__V1__Operation *op, pd_session *s,
                     const char *name, const uint64_t *inputs, int n_inputs,
                     const pd_attrs *attrs, uint64_t *output_ids, int n_outputs,
                     pd_status *st);
/* Sets op->devices (borrowed) after pdc_op_build, checked as
 * pdc_check_devices (named by the op). */
pd_code pdc_op_place(Paradev__V1__Operation *op, const int32_t *devices,
                     int n_devices, pd_status *st);
/* INVALID_ARGUMENT unless n >= 0 and ids is given when n > 0. */
pd_code pdc_check_ids(const uint64_t *ids, int n, pd_status *st);
/* Copies every attribute of src into dst; false when out of memory. */
bool pdc_attrs_copy(pd_attrs *dst, const pd_attrs *src);
/* Copies a wire TensorInfo; false when it cannot be represented. */
bool pdc_info_from_pb(const Paradev__V1__TensorInfo *ti, pd_tensor_info *out);
bool pdc_shape_from_pb(const Paradev__V1__Shape *sh, pd_tensor_info *out);
/* Copies a wire device list into out->num_devices / devices; false when it
 * has more than PD_MAX_DEVICES. */
bool pdc_devices_from_pb(const int32_t *devices, size_t n, pd_tensor_info *out);

/* --- streams (stream.c) -------------------------------------------------------- */

/* Sends one Enqueue item (the session token goes with the first); *index
 * (may be NULL) gets its position. Errors as pd_stream_execute. */
pd_code pdc_stream_send(pd_stream *t, Paradev__V1__EnqueueRequest *r,
                        uint64_t *index, pd_status *st);
/* The session a stream was opened on. */
pd_session *pdc_stream_session(const pd_stream *t);

/* --- bidirectional streams (bidi.c) ---------------------------------------- */

/* A bidirectional call with a write queue: writers append byte buffers,
 * the stream's thread sends them one at a time (gRPC allows one send in
 * flight) and reads the replies, handing each to on_message. */
typedef struct pdc_bidi pdc_bidi;
typedef void (*pdc_bidi_msg_fn)(void *arg, grpc_byte_buffer *bb);

/* Starts the call and its thread. max_in_flight: items written and not yet
 * answered before pdc_bidi_write waits. */
pdc_bidi *pdc_bidi_new(pd_client *c, pdc_method m, int64_t timeout_ms,
                       int max_in_flight, pdc_bidi_msg_fn on_message, void *arg,
                       pd_status *st);
/* Queues one message (takes ownership of bb, also on failure). */
pd_code pdc_bidi_write(pdc_bidi *b, grpc_byte_buffer *bb, pd_status *st);
/* Waits until `count` replies arrived or the call ended; deadline_ms is
 * CLOCK_MONOTONIC ms (< 0: none). Returns PD_OK, PD_DEADLINE_EXCEEDED, or the
 * call's final error when it ended before. */
pd_code pdc_bidi_wait(pdc_bidi *b, uint64_t count, int64_t deadline_ms,
                      pd_status *st);
/* Half-closes and waits for the call's status (deadline as above; on timeout
 * the call is cancelled). */
pd_code pdc_bidi_close(pdc_bidi *b, int64_t deadline_ms, pd_status *st);
uint64_t pdc_bidi_written(const pdc_bidi *b);
uint64_t pdc_bidi_received(const pdc_bidi *b);
/* Cancels if still running, joins the thread, frees. */
void pdc_bidi_delete(pdc_bidi *b);

#endif /* PARADEV_CLIENT_INT_H */
