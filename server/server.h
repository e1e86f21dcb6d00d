/* Private header of server/ (paradevd): the daemon's start and stop
 * (daemon.c), the transport (rpc.c), the call machinery (call.c), the method
 * table (methods.c), health (health.c), the HTTP listener and metrics
 * (http.c, metrics.c), the wire helpers (wire.c) and the shared memory
 * registry's entry points (shm_region.c). The method files (info.c,
 * session.c, exec.c, transfer.c, tape.c, shm.c, admin.c, health.c) define
 * only their srv_h_<Method> handlers; conversions are convert.h's, the
 * configuration config.h's. See README.md for the layout.
 *
 * Threading model: the server has `num_threads` completion queues, each
 * driven by one thread, and every call lives on the queue its request was
 * armed on. So all events of one call run on one thread, one at a time, and a
 * call's state needs no lock. Nothing blocks a queue thread: a handler that
 * must wait (Sync, Download of a tensor not yet computed, KillSession until
 * the devices caught up, a health Watch) registers a callback and returns;
 * the callback, on whatever thread it runs, only wakes the call
 * (srv_call_wake), whose method's on_wake then runs on the call's own thread.
 * One exception is bounded work that runs inline: a function's first call
 * instantiates it inside Execute ([functions] instantiation_max_ms); so a
 * watcher (rpc.c) lends a queue whose thread has run one event for over
 * 50 ms to a helper thread that drives it until the owner takes it back
 * (still one thread per queue at a time): calls gRPC handed to that queue
 * meanwhile do not wait.
 *
 * Lifetime: a call holds a reference per gRPC batch in flight plus one for
 * whoever is running its handler, and one per registered wake-up; it is
 * destroyed (method's on_destroy, then grpc_call_unref) when the last one is
 * dropped.
 */
#ifndef PARADEV_SERVER_H
#define PARADEV_SERVER_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "convert.h"
#include "device.h"
#include "ratelimit.h"
#include "scheduler.h"

#define SRV_NUM_CODES 17 /* gRPC status codes 0..16 */
/* Completion-queue threads of the coordinator's mesh port (rpc.c). */
#define SRV_MESH_THREADS 2

typedef struct srv srv;
typedef struct srv_call srv_call;
typedef struct srv_method srv_method;

typedef enum srv_kind {
  SRV_UNARY = 0,
  SRV_SERVER_STREAM = 1, /* one request, a stream of replies */
  SRV_CLIENT_STREAM = 2, /* a stream of requests, one reply */
  SRV_BIDI = 3,
} srv_kind;

/* What a method does at each event of its call; the method files define
 * one per method, `srv_h_<Method>` (methods.c puts them in the table). */
typedef struct srv_handlers {
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
  /* A wake-up (srv_call_wake) arrived, on the call's thread. */
  void (*on_wake)(srv_call *c);
  /* The client cancelled or the deadline passed before the call finished;
   * on the call's thread. NULL: nothing to undo (the call just ends). */
  void (*on_cancel)(srv_call *c);
  /* Unary methods that wait: learn of cancellation while waiting. */
  bool early_close;
} srv_handlers;

/* A method the server registers (methods.c, expanded from
 * proto/paradev/v1/methods.h). */
struct srv_method {
  const char *path; /* PD_METHOD_PATH: "/<service>/<method>" */
  srv_kind kind;
  const ProtobufCMessageDescriptor *request, *response;
  const srv_handlers *h;
  void *registered;    /* grpc_server_register_method's handle */
  grpc_server *server; /* the server it is registered on */
  /* Admin methods: the handle on the main server as well, where only
   * operator identities may call them (admin.c checks). */
  void *registered_main;
  /* Finished calls by status code (metrics). */
  _Atomic uint64_t codes[SRV_NUM_CODES];
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
  grpc_server *gs; /* the server whose request this call answered */
  int cq_index;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload; /* initial payload, then each stream read */
  atomic_int refs;
  atomic_bool cancelled; /* the client went away or the deadline passed */
  bool started;          /* a request arrived (counted in metrics) */
  srv_call *live_prev, *live_next; /* the calls in progress (call.c) */
  bool md_sent, status_sent, finishing, reading, writing, read_paused, eof;
  bool close_started;
  grpc_status_code fin_code;
  char *fin_msg;
  /* pending writes */
  grpc_byte_buffer **wq;
  size_t wq_head, wq_len, wq_cap;
  grpc_byte_buffer *in_flight;
  /* the request of a unary/server-stream call and its allocator */
  srv_budget budget;
  ProtobufCMessage *req;
  /* the caller (auth.h), resolved at the first srv_call_identity */
  struct srv_identity *identity;
  /* a bearer token's caller: the tokens table it was checked against and
   * that table's generation before the check (srv_call_recheck) */
  const void *auth_tokens;
  uint64_t auth_gen;
  /* method state */
  void *user;
  /* tags */
  struct srv_tag {
    void (*fn)(srv_call *c, bool ok);
    srv_call *c;
  } t_req, t_recv, t_send, t_close, t_final, t_wake;
  int close_cancelled;
  /* Held while one of the call's events runs (rpc.c's srv_cq_step): a lent
   * queue's helper thread may get an event of a call whose handler still
   * holds the owner thread (a Download's read of a silent rank's component
   * blocks until the lease ends), and must wait for it, so one call's
   * events still run one at a time. */
  pthread_mutex_t run_mu;
};

/* Values SIGHUP may change, read by any thread. */
typedef struct srv_runtime {
  _Atomic uint64_t max_tensor_bytes;
  atomic_int max_ops_per_request;
  atomic_int max_handles_per_session;
  atomic_int max_sessions;
  atomic_int max_ids_per_request;
  atomic_int max_queued_ops;
  _Atomic uint32_t default_lease_s, max_lease_s;
  _Atomic uint64_t default_memory_quota, max_memory_quota;
  /* default_memory_quota is a share of the mesh's memory (no byte value
   * configured): a session allowed fewer devices gets that share of
   * theirs (issue #17, trial finding P9). */
  _Atomic bool default_quota_is_share;
  _Atomic uint32_t drain_timeout_s, stall_timeout_s, kernel_timeout_s;
  atomic_bool require_job_token;         /* [auth] require_job_token */
  _Atomic uint32_t job_token_lifetime_s; /* [auth] job_token_lifetime_s */
} srv_runtime;

#define SRV_RT(s, f) atomic_load_explicit(&(s)->rt.f, memory_order_relaxed)

typedef struct srv_health srv_health;
typedef struct srv_shm srv_shm;
typedef struct srv_storage srv_storage;
typedef struct srv_jobs srv_jobs;

struct srv {
  srv_options opt; /* as started; never written after start */
  srv_runtime rt;
  int argc;
  char **argv;
  uint64_t incarnation;
  /* [functions]: the built-in passes in force daemon-wide, the daemon's
   * switches merged with its optimizer plugins' (srv_optimizer_load), as
   * GetServerInfo reports them. */
  dev_tristate fn_passes[DEV_PASS_COUNT];
  /* Every session's function cache counts (the engine adds, /metrics
   * reads), and the rate limit of the engine's function log lines. */
  dev_fn_counters fn_counters;
  srv_rate fn_log_rate;
  int64_t start_unix_ms;
  dev_engine *engine;
  sched *sched;
  grpc_server *server;       /* ParallelDevice, Health */
  grpc_server *admin_server; /* Admin, on the admin socket; may be NULL */
  srv_jobs *jobs;            /* job tokens (jobs.h) */
  /* cqs[0, mesh_cq_first) serve the client-facing servers (ParallelDevice,
   * Health, Admin); cqs[mesh_cq_first, num_cqs) the coordinator's mesh port
   * alone (SRV_MESH_THREADS of them, issue #16), so a client call that
   * waits on a rank (a Download reading a remote component) can never hold
   * up the Attach streams whose messages end that wait. */
  grpc_completion_queue *cqs[SRV_MAX_THREADS + SRV_MESH_THREADS];
  int num_cqs;
  int mesh_cq_first;
  atomic_bool shutting_down;
  atomic_int active_calls; /* calls created and not yet destroyed */
  /* Service state. */
  atomic_bool ready;    /* every listener accepts */
  atomic_bool draining; /* no new sessions */
  atomic_bool exiting;  /* the drain ends in exit */
  /* No progress while work is runnable for stall_timeout_s, or one kernel
   * without progress for kernel_timeout_s (service.c srv_progress_check). */
  atomic_bool stalled;
  atomic_bool devices_ok;
  /* Per device, the milliseconds since its last progress while it had work
   * (0 when idle), as the last check saw them (metrics). */
  _Atomic uint64_t dev_quiet_ms[PD_MAX_DEVICES];
  srv_health *health;
  /* Counters the handlers keep. */
  _Atomic uint64_t upload_bytes, download_bytes;
  _Atomic uint64_t unknown_method_calls;
  /* HTTP listener (http.c). */
  void *http;
  void *http_guard; /* the request deadline's (http.c) */
  int http_port;
  /* Shared memory regions (shm.c) and the bytes their transfers moved. */
  srv_shm *shm;
  _Atomic uint64_t shm_upload_bytes, shm_download_bytes;
  /* Checkpoints (storage.c): the storage roots and the block cache (made
   * before the scheduler, which borrows them, and freed after it), and the
   * GetLoadProgress calls that wait for a change. */
  stg_roots *storage_roots;
  stg_cache *storage_cache;
  srv_storage *storage;
  /* Identities, tenants and refusals (auth.c). */
  struct srv_auth *auth;
  /* TLS of the TCP listeners (tls.h); NULL without [tls] cert_file. Made
   * and freed by rpc.c, reloaded on SIGHUP by main.c. */
  struct srv_tls *tls;
  /* A mesh across machines (mesh.h, issue #16); NULL for one daemon. */
  struct srv_mesh *mesh;
  /* The coordinator's mesh port (paradev.v1.Mesh only); NULL elsewhere. */
  grpc_server *mesh_server;
};

/* --- daemon.c ----------------------------------------------------------------- */

/* Starts the daemon's parts in order: the engine, the scheduler, the shared
 * memory registry, health, the gRPC listeners and their threads, the HTTP
 * listener. Returns 0, or -1 after logging why with every part started so
 * far stopped again (libuv's uv_loop_init shape). Main thread. */
int srv_daemon_start(srv *s);
/* Stops serving, in the reverse order: health's watches end, the gRPC
 * listeners close (the calls' grace period), the HTTP listener stops.
 * `phase` hears what is being done (the shutdown watchdog's log). Main
 * thread. */
void srv_daemon_stop_serving(srv *s, void (*phase)(const char *what));
/* Then the rest: the scheduler (every open session ends, and with it its
 * shared memory regions), the registry, health, the engine. A daemon that
 * exits with ops still on the devices skips this. Main thread. */
void srv_daemon_stop_devices(srv *s, void (*phase)(const char *what));
/* --check-config's check of [functions] optimizer_plugins
 * (srv_config_plugin_check_fn, config.h): loads the plugins as
 * srv_daemon_start does and unloads them; returns the number of errors
 * reported (0 or 1: the first refusal, as a start stops at it). Main
 * thread, before anything started. */
int srv_functions_check(const srv_options *o, srv_config_report_fn report);
/* The scheduler's configuration from the options (start and SIGHUP). */
void srv_daemon_sched_config(const srv_options *o, dev_engine *e,
                             sched_config *sc);
/* (quota.c) The default session quota in bytes: [sessions] default_memory_quota, or
 * when that is 0, default_memory_quota_percent of the sum of the devices'
 * limits (capped at max_memory_quota); UINT64_MAX ("unlimited") is none. */
uint64_t srv_default_quota(const srv_options *o, dev_engine *e);
/* The mesh's memory in bytes: the sum of the devices' limits (a device
 * without one: its total); 0 without an engine. Any thread. In session.c,
 * which caps asked quotas with it (daemon.c's default quota uses it too). */
uint64_t srv_mesh_bytes(dev_engine *e);
/* The same for the devices of `set` only (issue #17: a session's share). */
uint64_t srv_set_bytes(dev_engine *e, const dev_devset *set);

/* --- rpc.c: the transport ----------------------------------------------------- */

/* Starts gRPC, binds every listen address and the admin socket (logging the
 * bound ones), starts the threads. Returns 0 or -1 after logging why
 * (nothing left running). */
int srv_rpc_start(srv *s);
/* Shutdown in NOTES.md order: stop accepting, grace period, cancel what
 * remains, destroy the servers, drain and destroy the queues, grpc_shutdown.
 * It can block past the grace period when a call or gRPC itself is stuck
 * (a queue thread blocked in a device call); paradevd's shutdown watchdog
 * (main.c, srv_signal_main) bounds the whole shutdown and exits with status
 * 1 then. Returns false when calls were still active after 30 s (gRPC is
 * then left as it is). Main thread. */
bool srv_rpc_stop(srv *s);

/* --- call.c: the call machinery -------------------------------------------------- */

/* Calls a client started and the server has not yet destroyed (requests
 * armed for future calls do not count). Lock-free: any thread, the
 * shutdown's watchdog included. */
int srv_calls_in_progress(void);

/* For rpc.c only: a new call for method `m` (NULL: the generic UNIMPLEMENTED
 * answer) whose request tag runs `on_request`; its request arrived (counts
 * it, unpacks it, runs the method); one batch with a reference; ending every
 * call in progress from its own thread (returns how many). */
srv_call *srv__call_new(srv *s, const srv_method *m, grpc_server *gs, int cqi,
                        void (*on_request)(srv_call *c, bool ok));
void srv__call_begin(srv_call *c);
bool srv__call_batch(srv_call *c, const grpc_op *ops, size_t n,
                     struct srv_tag *tag);
int srv__calls_end_live(void);

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
/* Takes / drops a reference on a call (for a registered wake-up). */
void srv_call_ref(srv_call *c);
void srv_call_unref(srv_call *c);
/* Makes the method's on_wake run on the call's thread. Any thread; the
 * caller must hold a reference. False when gRPC refused (logged). */
bool srv_call_wake(srv_call *c);
/* Ends a call that waits when its client cancelled or its deadline passed:
 * DEADLINE_EXCEEDED or CANCELLED naming `what`. */
void srv_call_finish_cancelled(srv_call *c, const char *what);

/* A one-shot wake-up for a call that waits on an engine callback
 * (dev_ready_fn): the callback may outlive the call, so it holds this small
 * object, not the call. */
typedef struct srv_wait srv_wait;
/* Creates a wait for `c` (holds a call reference until it fires or is
 * cancelled). NULL when out of memory. */
srv_wait *srv_wait_new(srv_call *c);
/* The dev_ready_fn to register with arg = the wait: wakes the call once. */
void srv_wait_ready(void *arg, dev_tensor *t, pd_code code);
/* The status code the callback reported (after the wake-up). */
pd_code srv_wait_code(const srv_wait *w);
/* The call no longer waits (cancelled, or registration failed): it will not
 * be woken. Then srv_wait_put. */
void srv_wait_cancel(srv_wait *w);
/* Drops the call side's reference (and, after a failed registration, the
 * callback side's, with `both`). Accepts NULL. */
void srv_wait_put(srv_wait *w, bool both);

/* Waits for tensor `t` of `ss` without holding a thread: true when it is
 * computed (go on now); false when the call now waits (*slot holds the wait,
 * the method's on_wake comes and calls srv_call_await_woken first) or could
 * not wait (the call has ended with the error). */
bool srv_call_await(srv_call *c, sched_session *ss, dev_tensor *t,
                    srv_wait **slot);
/* The wait in *slot is over (on_wake); *slot becomes NULL. */
void srv_call_await_woken(srv_wait **slot);
/* The call no longer waits (cancelled, destroyed); accepts *slot NULL. */
void srv_call_await_cancel(srv_wait **slot);

/* Opens (and renews) the session of a token; on failure ends the call with
 * the error and returns NULL. */
sched_session *srv_call_session(srv_call *c, ProtobufCBinaryData token);
/* The request-shape limits in force now (convert.h checks them). */
srv_req_limits srv_call_limits(const srv_call *c);
/* Placement (issue #17): sets infos[i]->devices to the device set of
 * handle infos[i]->id of `ss` (tensors just published: an op's outputs, a
 * gradient's), into room[i] (PD_MAX_DEVICES each) or, room NULL, arrays
 * in `a`. A handle gone meanwhile (deleted by another call of the client)
 * keeps devices empty. False when out of memory. One sched_handle_get
 * each. */
bool srv_call_infos_devices(sched_session *ss, srv_arena *a,
                            Paradev__V1__TensorInfo *const *infos, size_t n,
                            int32_t (*room)[PD_MAX_DEVICES]);

/* --- wire.c -------------------------------------------------------------- */

void srv_budget_init(srv_budget *b, size_t bytes);
/* The decoding budget of a request of `len` bytes. Small nested messages (an
 * Operation with its attrs) grow about tenfold when unpacked, bytes fields
 * not at all; so 16x, but at most 256 MiB beyond the message itself,
 * whatever its shape, plus 1 MiB. */
size_t srv_budget_bytes(size_t len);
/* Unpacks `len` bytes of message type `d` with allocator `b`: NULL with a
 * status (RESOURCE_EXHAUSTED over the budget, INVALID_ARGUMENT for
 * malformed bytes or a string field, at any depth, that holds a NUL). Free
 * the result with protobuf_c_message_free_unpacked(m, &b->alloc). What
 * srv_unpack runs on a request's bytes; tests/fuzz/ drives it directly. */
ProtobufCMessage *srv_unpack_bytes(const ProtobufCMessageDescriptor *d,
                                   const uint8_t *data, size_t len,
                                   srv_budget *b, dev_status *st);
/* srv_unpack_bytes on a byte buffer's bytes (INVALID_ARGUMENT too when they
 * cannot be read: compressed with an unknown algorithm). */
ProtobufCMessage *srv_unpack(const ProtobufCMessageDescriptor *d,
                             grpc_byte_buffer *bb, srv_budget *b,
                             dev_status *st);
/* Packs a message into a new byte buffer (one copy). */
grpc_byte_buffer *srv_pack(const ProtobufCMessage *m);

/* --- methods.c: the method table ----------------------------------------------- */

/* The methods paradevd registers (NULL-terminated), expanded from
 * proto/paradev/v1/methods.h: ParallelDevice and Health on the listen
 * addresses, Admin on the admin socket and (operators' identities only,
 * admin.c checks) on the listen addresses too. */
extern srv_method *const srv_methods[];
extern srv_method *const srv_admin_methods[];
/* paradev.v1.Mesh (issue #16), on the coordinator's mesh port only. */
extern srv_method *const srv_mesh_methods[];
/* The method of a path ("/paradev.v1.Admin/Drain"), or NULL. */
const srv_method *srv_method_find(const char *path);

/* --- service.c: the service's state (health.c reports it) ---------------- */

/* Liveness: every device healthy and runnable work making progress (not
 * stalled, no kernel past kernel_timeout_seconds). Draining does not
 * change it. Any thread. */
bool srv_alive(srv *s);
/* Why liveness fails, as /healthz and the log name it: NULL while alive;
 * else "unhealthy: a device failed", "stalled: runnable work makes no
 * progress" (stall_timeout_seconds), "wedged: a kernel has run past
 * kernel_timeout_seconds ..." or both of the last two. A static string.
 * Any thread. */
const char *srv_liveness_cause(srv *s);
/* Readiness (SERVING for "", paradev.v1.ParallelDevice, paradev.readiness):
 * live, every listener accepts, and not draining. Any thread. */
bool srv_serving(srv *s);
/* Samples the scheduler's and every device's progress at `now` (seconds,
 * CLOCK_MONOTONIC), logs what changed (a device stalled or wedged, a long
 * kernel, progress again), stores each device's seconds without progress
 * for /metrics, and applies the PARADEV_TEST_HOLD test hook. True when
 * liveness must fail for want of progress. Main loop only, once a tick. */
bool srv_progress_check(srv *s, double now);
/* PD_OK unless draining; then UNAVAILABLE in *st, saying that the daemon is
 * draining (for maintenance, or shutting down), that `what` (a method or an
 * item: "Execute") is new work it no longer takes, that queued work
 * finishes, and what the client should do. Every method that brings new
 * work (CreateSession, Execute and Enqueue's execute and gradient items,
 * Gradient, Upload, UploadFromSharedMemory, LoadTensors) asks it first;
 * collecting results (Sync, Download, Describe, SaveTensors) and ending
 * sessions (Delete, KeepAlive, CloseSession) are never refused. Any
 * thread. */
pd_code srv_check_accepting(srv *s, const char *what, dev_status *st);
/* Recomputes the status (after any input changed; any thread) and streams
 * a change to every Watch. */
void srv_health_update(srv *s);
/* Devices' health (backend `healthy`); logs changes. Returns all healthy. */
bool srv_devices_healthy(srv *s);
/* Ends every Watch stream (at shutdown, after the last update). */
void srv_health_close(srv *s);
int srv_health_init(srv *s);
void srv_health_destroy(srv *s);
/* The Watch list (service.c): lists call `c` with a reference unless the
 * service is closing (returns false then); *listed is false when it could
 * not be listed (out of memory). srv_health_watch_remove unlists it and
 * drops that reference. srv_health_closing: srv_health_close has run. */
bool srv_health_watch_add(srv *s, srv_call *c, bool *listed);
void srv_health_watch_remove(srv *s, srv_call *c);
bool srv_health_closing(srv *s);

/* Sums bytes_in_use over the devices (metrics, Admin). */
uint64_t srv_device_memory_used(srv *s);
/* Starts draining (no new sessions, health NOT_SERVING); with `exit`, the
 * daemon exits once queued work is done or the drain timeout passes.
 * Any thread. Returns false if it was draining already. */
bool srv_drain(srv *s, bool exit);
/* Back in service (not once exiting). */
bool srv_resume(srv *s);

/* --- storage.c: checkpoints ------------------------------------------------ */

/* Creates the storage roots ([storage] roots, --storage-root) and the block
 * cache from the options, points the storage layer's log at the daemon's,
 * and starts the thread that ends GetLoadProgress waits. Called by
 * srv_daemon_start before sched_create. Returns 0, or -1 after logging why
 * (nothing left). */
int srv_storage_init(srv *s);
/* Stops the thread and frees the cache and roots; after sched_destroy.
 * Accepts a server whose storage was never created. */
void srv_storage_destroy(srv *s);

/* --- metrics.c, http.c ------------------------------------------------------ */

/* Appends the Prometheus text exposition (format 0.0.4) to a new string
 * (free() it); NULL when out of memory. */
char *srv_metrics_render(srv *s, size_t *len);
/* Starts / stops the HTTP listener of opt.metrics_listen (no-op when empty).
 * srv_http_start logs the bound address; -1 after logging why. */
int srv_http_start(srv *s);
void srv_http_stop(srv *s);

/* --- shm_region.c: shared memory regions ------------------------------------------ */

/* Creates the registry of regions, registers it as an observer of the
 * scheduler's sessions (their regions go when they end, whatever the
 * reason), and installs the SIGBUS guard of copies from and into mappings.
 * Called by srv_daemon_start after sched_create, before serving. Returns 0,
 * or -1 after logging why. */
int srv_shm_init(srv *s);
/* Frees the registry once every session has ended (after sched_destroy);
 * accepts a server whose registry was never created. */
void srv_shm_destroy(srv *s);
/* Registered regions and their mapped bytes now (metrics). */
void srv_shm_stats(srv *s, uint64_t *regions, uint64_t *bytes);

#endif /* PARADEV_SERVER_H */
