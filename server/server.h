/* Private header of server/: paradevd's gRPC plumbing (rpc.c), its method
 * handlers (handlers.c, stream.c) and the wire helpers (wire.c).
 *
 * Threading model: the server has `num_threads` completion queues, each
 * driven by one thread, and every call lives on the queue its request was
 * armed on. So all events of one call run on one thread, one at a time, and a
 * call's state needs no lock. The exception is a handler that must block
 * (Sync, Download of a tensor not yet computed): it hands the call to a
 * detached thread (srv_call_spawn), which owns the call until it starts the
 * call's next gRPC operation.
 *
 * Lifetime: a call holds a reference per gRPC batch in flight plus one for
 * whoever is running its handler; it is destroyed (method's on_destroy, then
 * grpc_call_unref) when the last one is dropped.
 */
#ifndef PARADEV_SERVER_H
#define PARADEV_SERVER_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "scheduler.h"

#define SRV_VERSION "0.1.0"
#define SRV_MAX_LISTEN 16
#define SRV_MAX_THREADS 16

/* What a client controls is bounded by these (reported by GetServerInfo). */
typedef struct srv_limits {
  uint64_t max_message_bytes;  /* gRPC receive and send limit */
  uint64_t max_tensor_bytes;   /* host bytes of one upload */
  int max_ops_per_request;
  int max_handles_per_session;
  int max_sessions;
  int max_string_bytes;
  int max_ids_per_request;
  uint32_t default_lease_s;
  uint32_t max_lease_s;
  uint64_t max_chunk_bytes;     /* Upload chunk / Download chunk_bytes */
  uint64_t default_chunk_bytes; /* Download when the client says 0 */
} srv_limits;

/* Daemon options (command line). */
typedef struct srv_options {
  const char *listen[SRV_MAX_LISTEN];
  int num_listen;
  const char *backend; /* "cpu" (default) or "cuda" */
  int num_devices;
  uint64_t memory_limit; /* per device, bytes; 0: none */
  int num_threads;       /* completion-queue threads */
  int grace_ms;          /* shutdown grace period */
  srv_limits limits;
} srv_options;

typedef struct srv srv;
typedef struct srv_call srv_call;
typedef struct srv_method srv_method;

typedef enum srv_kind {
  SRV_UNARY = 0,
  SRV_SERVER_STREAM = 1, /* one request, a stream of replies */
  SRV_CLIENT_STREAM = 2, /* a stream of requests, one reply */
  SRV_BIDI = 3,
} srv_kind;

/* A method the server registers. */
struct srv_method {
  const char *path; /* "/paradev.v1.ParallelDevice/Echo" */
  srv_kind kind;
  const ProtobufCMessageDescriptor *request;
  /* UNARY, SERVER_STREAM: the request arrived (owned by the call until it is
   * destroyed). Must end in srv_call_reply/srv_call_finish (now or later). */
  void (*on_request)(srv_call *c, const ProtobufCMessage *req);
  /* CLIENT_STREAM, BIDI: one request message (freed when this returns), or
   * NULL when the client closed its side. */
  void (*on_message)(srv_call *c, const ProtobufCMessage *msg);
  /* Streams: the write queue ran empty (produce more, or finish). */
  void (*on_drained)(srv_call *c);
  /* The call is being destroyed: free c->user. May be NULL. */
  void (*on_destroy)(srv_call *c);
  void *registered; /* grpc_server_register_method's handle */
};

/* Byte-budget allocator for unpacking untrusted messages (protobuf-c has no
 * limit of its own). */
typedef struct srv_budget {
  ProtobufCAllocator alloc;
  size_t left;
  bool exceeded;
} srv_budget;

struct srv_call {
  srv *s;
  const srv_method *m;
  int cq_index;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;   /* initial payload, then each stream read */
  atomic_int refs;
  atomic_bool cancelled;       /* the client went away or the deadline passed */
  bool md_sent, status_sent, finishing, reading, writing, read_paused, eof;
  grpc_status_code fin_code;
  char *fin_msg;
  /* pending writes */
  grpc_byte_buffer **wq;
  size_t wq_head, wq_len, wq_cap;
  grpc_byte_buffer *in_flight;
  /* the request of a unary/server-stream call and its allocator */
  srv_budget budget;
  ProtobufCMessage *req;
  /* method state */
  void *user;
  /* tags */
  struct srv_tag {
    void (*fn)(srv_call *c, bool ok);
    srv_call *c;
  } t_req, t_recv, t_send, t_close, t_final;
  int close_cancelled;
};

struct srv {
  srv_options opt;
  uint64_t incarnation;
  int64_t start_unix_ms;
  dev_engine *engine;
  sched *sched;
  grpc_server *server;
  grpc_completion_queue *cqs[SRV_MAX_THREADS];
  int num_cqs;
  atomic_bool shutting_down;
  atomic_int active_calls; /* calls created and not yet destroyed */
};

/* --- rpc.c --------------------------------------------------------------- */

/* Starts gRPC, binds every listen address (logging the bound ones), starts
 * the threads. Returns 0 or -1 after logging why (nothing left running). */
int srv_start(srv *s);
/* Shutdown in NOTES.md order: stop accepting, grace period, cancel what
 * remains, destroy the server, drain and destroy the queues, grpc_shutdown. */
void srv_stop(srv *s);

/* Unary success: sends `resp` and status OK; the call ends. */
void srv_call_reply(srv_call *c, const ProtobufCMessage *resp);
/* Queues one message of a stream (packed now; `msg` may be freed after). */
void srv_call_write(srv_call *c, const ProtobufCMessage *msg);
/* Queues an already-encoded message; takes ownership of `bb`. */
void srv_call_write_buffer(srv_call *c, grpc_byte_buffer *bb);
/* Ends the call with a status once the queued writes are sent (an error
 * status discards queued writes). */
void srv_call_finish(srv_call *c, pd_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Ends the call with a dev_status. */
void srv_call_fail(srv_call *c, const dev_status *st);
/* Pending writes (backpressure for bidi streams). */
size_t srv_call_queued(const srv_call *c);
/* Runs fn(c) on a new detached thread that owns the call until it starts an
 * operation on it (reply, write, finish). Returns false (and does nothing)
 * when no thread can be started. */
bool srv_call_spawn(srv_call *c, void (*fn)(srv_call *c));

/* --- wire.c -------------------------------------------------------------- */

void srv_budget_init(srv_budget *b, size_t bytes);
/* Unpacks a byte buffer; NULL with a status (RESOURCE_EXHAUSTED over the
 * budget, INVALID_ARGUMENT for malformed bytes). */
ProtobufCMessage *srv_unpack(const ProtobufCMessageDescriptor *d,
                             grpc_byte_buffer *bb, srv_budget *b,
                             dev_status *st);
/* Packs a message into a new byte buffer (one copy). */
grpc_byte_buffer *srv_pack(const ProtobufCMessage *m);

/* --- handlers.c ---------------------------------------------------------- */

/* The methods paradevd registers (NULL-terminated). */
extern srv_method *const srv_methods[];

#endif /* PARADEV_SERVER_H */
