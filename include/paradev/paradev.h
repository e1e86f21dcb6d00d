/* libparadev: the client library of paradev.
 *
 * A program opens a pd_client on a daemon's address, a pd_session on the
 * client, uploads host values into parallel tensors (one component per device
 * of the daemon's mesh), runs ops on them by handle, and downloads results.
 * The wire is paradev/v1/paradev.proto; the model is TensorFlow's remote eager
 * service (eager_service.proto) driven the way TensorFlow's parallel device
 * (tensorflow/c/eager/parallel_device) drives its components.
 *
 * Conventions (as tensorflow/c/c_api.h):
 *  - Types are opaque and come in New/Delete pairs: pd_X_new() returns a new
 *    object the caller owns and frees with pd_X_delete(), which accepts NULL.
 *    Structs the caller fills (pd_client_options, pd_session_options,
 *    pd_call_options, pd_stream_options) start with `struct_size` and have an
 *    _INITIALIZER macro: start from it, so fields can be added later.
 *  - A function that can fail takes a `pd_status *` last and returns its
 *    pd_code (the numbers of gRPC's status codes). The status receives the code
 *    and a message that says what was wrong and what was expected; it may be
 *    NULL when the caller needs only the code. Out-parameters are written only
 *    on success, unless a function says otherwise.
 *  - Ownership: pointers passed in are borrowed for the duration of the call
 *    (the library copies what it keeps); pointers returned by accessors
 *    (pd_status_message, pd_server_info_*, pd_description_*) belong to the
 *    object they came from and live as long as it does.
 *  - Every call to the daemon takes a `const pd_call_options *` (NULL: the
 *    defaults) with its timeout and an optional pd_cancel. A call that runs
 *    past its deadline fails with PD_DEADLINE_EXCEEDED, a cancelled one with
 *    PD_CANCELLED; a daemon that cannot be reached is PD_UNAVAILABLE with a
 *    message "cannot reach TARGET: ...".
 *  - Handles are 64-bit ids the client chooses, unique among the live handles
 *    of its session (0 is never valid), so ops can be pipelined on outputs not
 *    yet heard back about. The library hands out fresh ids at and above
 *    PD_FIRST_LIBRARY_ID (pd_session_new_id, or an output id of 0); a program
 *    that also picks its own should keep them below it.
 *  - Tensors are dense, row-major, little-endian; shapes list dims outermost
 *    first (rank 0 is a scalar). In a parallel tensor's overall shape, -1 marks
 *    an axis on which its components differ.
 *
 * Thread safety: pd_client, pd_session and pd_cancel may be used from any
 * number of threads at once, except their _delete functions, which must be
 * the last use. A pd_stream, pd_attrs or pd_batch is used by one thread at a
 * time (pd_attrs may be read by several calls at once while nobody changes
 * it). A pd_status belongs to one thread at a time.
 *
 * The library never logs and never exits; it calls grpc_init() in
 * pd_client_new and grpc_shutdown() in pd_client_delete.
 */
#ifndef PARADEV_PARADEV_H
#define PARADEV_PARADEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paradev/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PD_VERSION_MAJOR 0
#define PD_VERSION_MINOR 1
#define PD_VERSION_PATCH 0

/* Returns the library's version, "0.1.0". Thread-safe; static storage. */
const char *pd_version(void);

/* ---------------------------------------------------------------------------
 * Status */

typedef struct pd_status pd_status;

/* Returns a new status holding PD_OK and an empty message, or NULL when out of
 * memory. Free it with pd_status_delete. */
pd_status *pd_status_new(void);

/* Frees a status; NULL is a no-op. */
void pd_status_delete(pd_status *s);

/* The code of the last call that wrote `s` (PD_OK for a new status). */
pd_code pd_status_code(const pd_status *s);

/* Its message ("" when OK). Valid until `s` is written again or deleted. */
const char *pd_status_message(const pd_status *s);

/* Sets code and message (copied; truncated to 2 KiB). `msg` may be NULL. */
void pd_status_set(pd_status *s, pd_code code, const char *msg);

/* Returns one sentence about what to do next for `code` (e.g. for
 * PD_UNAVAILABLE: "check that paradevd runs and listens on this address").
 * Thread-safe; static storage. */
const char *pd_status_str(pd_code code);

/* ---------------------------------------------------------------------------
 * Per-call options and cancellation */

typedef struct pd_cancel pd_cancel;

/* A cancellation token: every call started with it (pd_call_options.cancel)
 * ends with PD_CANCELLED once pd_cancel_trigger is called, and calls started
 * later fail at once. Returns NULL when out of memory.
 * Thread safety: may be triggered from any thread while calls use it.
 * Source: TensorFlow's CancellationManager (TFE_CancellationManager). */
pd_cancel *pd_cancel_new(void);

/* Cancels every call in flight with `c` and every later one. Idempotent. */
void pd_cancel_trigger(pd_cancel *c);

/* True once pd_cancel_trigger was called. */
bool pd_cancel_is_triggered(const pd_cancel *c);

/* Frees the token. No call may still be using it. NULL is a no-op. */
void pd_cancel_delete(pd_cancel *c);

#define PD_TIMEOUT_DEFAULT 0   /* the client's default_timeout_ms */
#define PD_TIMEOUT_NONE (-1)   /* no deadline */

/* Options of one call; NULL means PD_CALL_OPTIONS_INITIALIZER. */
typedef struct pd_call_options {
  size_t struct_size;
  int64_t timeout_ms; /* > 0: deadline this long after the call starts;
                         PD_TIMEOUT_DEFAULT or PD_TIMEOUT_NONE */
  pd_cancel *cancel;  /* NULL: not cancellable */
} pd_call_options;

#define PD_CALL_OPTIONS_INITIALIZER \
  {sizeof(pd_call_options), PD_TIMEOUT_DEFAULT, NULL}

/* ---------------------------------------------------------------------------
 * Client: a connection to one daemon */

typedef struct pd_client pd_client;

typedef struct pd_client_options {
  size_t struct_size;
  uint64_t max_message_bytes; /* channel limit, both ways; 0: 64 MiB. Must be
                                 at least what the daemon sends. */
  int64_t default_timeout_ms; /* for calls with PD_TIMEOUT_DEFAULT; 0: 60000.
                                 Streams (pd_stream) have none by default. */
  uint64_t chunk_bytes;       /* Upload/Download chunk size; 0: 1 MiB. Capped
                                 by the daemon's max_chunk_bytes and by
                                 max_message_bytes less 1 KiB. */
  const char *user_agent;     /* prefix of gRPC's user agent; NULL: none */
} pd_client_options;

#define PD_CLIENT_OPTIONS_INITIALIZER \
  {sizeof(pd_client_options), 0, 0, 0, NULL}

/* Opens a channel to the daemon at `target`: "unix:/path" (a Unix socket) or
 * "host:port" (TCP, e.g. "127.0.0.1:7478"). Nothing is sent yet: a daemon that
 * is not there shows as PD_UNAVAILABLE on the first call. `opts` may be NULL.
 * Errors:   PD_INVALID_ARGUMENT (empty or over-long target, a TCP port
 *           outside 1..65535, bad options),
 *           PD_RESOURCE_EXHAUSTED (out of memory), PD_INTERNAL (gRPC refused
 *           to create the channel).
 * Thread safety: the client may be shared by threads.
 * Source: grpc_channel_create with insecure credentials (gRPC C core). */
pd_client *pd_client_new(const char *target, const pd_client_options *opts,
                         pd_status *st);

/* Closes the channel and frees the client. Every session, stream and server
 * info made from it must have been deleted first. NULL is a no-op. */
void pd_client_delete(pd_client *c);

/* The target the client was opened on. Valid as long as the client. */
const char *pd_client_target(const pd_client *c);

/* Echo: sends `len` payload bytes and receives them back; the transport
 * baseline (ping, benchmarks). `reply` (capacity `reply_cap` bytes) may be
 * NULL to discard the echo; *reply_len (may be NULL) gets its length.
 * Errors:   PD_DATA_LOSS (the echo differs in length or, when `reply` is
 *           given, does not fit it), PD_RESOURCE_EXHAUSTED (over the message
 *           limit), and the transport's errors (UNAVAILABLE, DEADLINE_EXCEEDED,
 *           CANCELLED).
 * Thread safety: thread-safe.
 * Source: paradev.v1.ParallelDevice/Echo. */
pd_code pd_client_echo(pd_client *c, const void *payload, size_t len,
                       void *reply, size_t reply_cap, size_t *reply_len,
                       const pd_call_options *call, pd_status *st);

/* Serving status of grpc.health.v1.HealthCheckResponse. */
typedef enum pd_serving_status {
  PD_SERVING_UNKNOWN = 0,
  PD_SERVING = 1,
  PD_NOT_SERVING = 2,
  PD_SERVICE_UNKNOWN = 3,
} pd_serving_status;

/* The standard health check. `service` "" (or NULL) is the whole server,
 * "paradev.v1.ParallelDevice" the device service. *out gets the status.
 * Errors:   PD_NOT_FOUND (a service the server does not know), transport
 *           errors.
 * Thread safety: thread-safe.
 * Source: grpc.health.v1.Health/Check (gRPC health checking protocol). */
pd_code pd_client_health(pd_client *c, const char *service,
                         pd_serving_status *out, const pd_call_options *call,
                         pd_status *st);

/* ---------------------------------------------------------------------------
 * Server info */

typedef struct pd_server_info pd_server_info;

/* One device of the daemon's mesh. Fields are only ever added at the end. */
typedef struct pd_device_info {
  int index;
  const char *name;            /* "cpu:0 (simulated)", "cuda:0 (NVIDIA H200)" */
  const char *kind;            /* "cpu", "cuda" */
  uint64_t memory_total_bytes; /* physical memory; 0 if unknown */
  uint64_t memory_limit_bytes; /* configured limit; 0 if none */
  uint64_t memory_used_bytes;
  uint64_t memory_free_bytes;  /* limit (or total) less used; 0 if unknown */
  uint64_t memory_peak_bytes;
  double busy_seconds;         /* seconds the device has spent running ops
                                  since the daemon started (kernels and its
                                  share of collectives): two readings and the
                                  wall time between them give how busy it
                                  was; the rest went to RPC, queueing, idle */
} pd_device_info;

/* The daemon's limits on what a client controls (exceeding one is
 * PD_INVALID_ARGUMENT or PD_RESOURCE_EXHAUSTED). Fields only added at the
 * end. */
typedef struct pd_limits {
  uint64_t max_message_bytes;
  uint64_t max_tensor_bytes;
  int max_rank;
  int max_ops_per_request;
  int max_handles_per_session;
  int max_sessions;
  int max_string_bytes;
  int max_inputs_per_op;
  int max_attrs_per_op;
  int max_list_length;
  int max_ids_per_request;
  uint32_t default_lease_seconds;
  uint32_t max_lease_seconds;
  uint64_t max_chunk_bytes;
} pd_limits;

/* Asks the daemon for its version, incarnation, backend, devices (with their
 * memory now) and limits. Free the result with pd_server_info_delete.
 * Errors:   transport errors; PD_INTERNAL for a reply that cannot be decoded.
 * Thread safety: thread-safe.
 * Source: paradev.v1.ParallelDevice/GetServerInfo. */
pd_server_info *pd_client_get_server_info(pd_client *c,
                                          const pd_call_options *call,
                                          pd_status *st);

void pd_server_info_delete(pd_server_info *info);
const char *pd_server_info_version(const pd_server_info *info);  /* "0.1.0" */
uint64_t pd_server_info_incarnation(const pd_server_info *info); /* random per start */
const char *pd_server_info_backend(const pd_server_info *info);  /* "cpu", "cuda" */
int64_t pd_server_info_start_time_ms(const pd_server_info *info); /* Unix ms */
int pd_server_info_num_devices(const pd_server_info *info);
/* Device i, 0 <= i < num_devices; NULL outside. */
const pd_device_info *pd_server_info_device(const pd_server_info *info, int i);
const pd_limits *pd_server_info_limits(const pd_server_info *info);

/* ---------------------------------------------------------------------------
 * Sessions */

typedef struct pd_session pd_session;

typedef struct pd_session_options {
  size_t struct_size;
  const char *client_name;     /* for the daemon's logs; NULL: "libparadev" */
  const char *job_id;          /* e.g. a Slurm job id; NULL: $SLURM_JOB_ID
                                  when set, else none */
  uint32_t lease_seconds;      /* 0: the daemon's default (60) */
  uint64_t memory_quota_bytes; /* 0: no quota of the session's own */
  bool keep_alive;             /* the library renews the lease while the
                                  session is open (default true) */
} pd_session_options;

#define PD_SESSION_OPTIONS_INITIALIZER \
  {sizeof(pd_session_options), NULL, NULL, 0, 0, true}

/* The smallest id the library hands out (pd_session_new_id). */
#define PD_FIRST_LIBRARY_ID (UINT64_C(1) << 62)

/* Opens a session: a namespace of handles with a lease. Unless
 * opts->keep_alive is false, a background thread sends KeepAlive whenever the
 * session has been idle for a third of its lease, until the session is closed
 * or deleted; its last failure is pd_session_keep_alive_status. `opts` may be
 * NULL.
 * Errors:   PD_INVALID_ARGUMENT (lease over max_lease_seconds, over-long
 *           names), PD_RESOURCE_EXHAUSTED (the daemon's max_sessions), and
 *           transport errors.
 * Thread safety: thread-safe (see the header's opening comment).
 * Source: CreateContext of TensorFlow's eager service;
 *         paradev.v1.ParallelDevice/CreateSession. */
pd_session *pd_session_new(pd_client *c, const pd_session_options *opts,
                           const pd_call_options *call, pd_status *st);

/* Closes the session on the daemon (every tensor it holds is freed) and stops
 * the keep-alive. The object stays valid for accessors and pd_session_delete;
 * other calls on it then fail with PD_FAILED_PRECONDITION.
 * Errors:   PD_NOT_FOUND (the session was already gone: lease expired, or the
 *           daemon restarted), transport errors.
 * Source: CloseContext; paradev.v1.ParallelDevice/CloseSession. */
pd_code pd_session_close(pd_session *s, const pd_call_options *call,
                         pd_status *st);

/* Frees the session, closing it first (best effort, 2 s deadline) if
 * pd_session_close was not called. Streams of the session must have been
 * deleted. NULL is a no-op. */
void pd_session_delete(pd_session *s);

/* Renews the lease now (the keep-alive thread does this by itself).
 * Errors:   PD_NOT_FOUND (session gone), PD_FAILED_PRECONDITION (closed),
 *           transport errors.
 * Source: KeepAlive of TensorFlow's eager service. */
pd_code pd_session_keep_alive(pd_session *s, const pd_call_options *call,
                              pd_status *st);

/* The last failure of the background keep-alive (PD_OK when none): a session
 * the daemon lost (PD_NOT_FOUND, e.g. "daemon restarted") shows here. */
pd_code pd_session_keep_alive_status(pd_session *s, pd_status *st);

/* Components of every tensor of the session: the daemon's mesh size. */
int pd_session_num_devices(const pd_session *s);
/* The lease granted, seconds. */
uint32_t pd_session_lease_seconds(const pd_session *s);
/* The daemon's incarnation when the session was opened. */
uint64_t pd_session_incarnation(const pd_session *s);
/* The session's memory quota in bytes (0: none). */
uint64_t pd_session_memory_quota(const pd_session *s);
/* The client the session belongs to. */
pd_client *pd_session_client(const pd_session *s);

/* Returns a fresh handle id (>= PD_FIRST_LIBRARY_ID, never returned before
 * for this session). Thread-safe. */
uint64_t pd_session_new_id(pd_session *s);

/* ---------------------------------------------------------------------------
 * Tensors: upload and download */

/* How a host value maps onto a parallel tensor's components. */
typedef enum pd_layout_kind {
  PD_LAYOUT_MIRRORED = 0,      /* the same value on every device */
  PD_LAYOUT_SHARDED = 1,       /* split (upload) / concatenated (download)
                                  along `axis`; component i gets
                                  dim/n + (i < dim%n) rows, like
                                  numpy.array_split */
  PD_LAYOUT_PER_COMPONENT = 2, /* one host value per component */
  PD_LAYOUT_COMPONENT = 3,     /* download only: component `component` */
} pd_layout_kind;

typedef struct pd_layout {
  pd_layout_kind kind;
  int axis;      /* PD_LAYOUT_SHARDED */
  int component; /* PD_LAYOUT_COMPONENT */
} pd_layout;

static inline pd_layout pd_layout_mirrored(void) {
  pd_layout l = {PD_LAYOUT_MIRRORED, 0, 0};
  return l;
}
static inline pd_layout pd_layout_sharded(int axis) {
  pd_layout l = {PD_LAYOUT_SHARDED, axis, 0};
  return l;
}
static inline pd_layout pd_layout_component(int component) {
  pd_layout l = {PD_LAYOUT_COMPONENT, 0, component};
  return l;
}

/* What the client knows of a handle without waiting for the devices. A plain
 * struct of fixed size (part of the ABI). */
typedef struct pd_tensor_info {
  uint64_t id;
  pd_dtype dtype;
  int rank;
  int64_t dims[PD_MAX_RANK]; /* -1 on axes where components differ */
} pd_tensor_info;

/* Uploads the host value `data` (`bytes` bytes: the product of dims times
 * pd_dtype_size(dtype)) as the new handle `id`, mirrored or sharded along an
 * axis. The value travels in chunks under the message limit. *info (may be
 * NULL) gets the tensor's dtype and overall shape.
 * Errors:   PD_INVALID_ARGUMENT (rank over PD_MAX_RANK, negative dim, `bytes`
 *           that does not match the shape, id 0, layout PER_COMPONENT or
 *           COMPONENT, a sharded axis out of range), PD_ALREADY_EXISTS (a
 *           live id), PD_RESOURCE_EXHAUSTED (max_tensor_bytes, device memory
 *           or the session's quota), PD_NOT_FOUND (session gone), transport
 *           errors.
 * Thread safety: thread-safe; `data` must not change during the call.
 * Source: paradev.v1.ParallelDevice/Upload; TensorFlow's parallel device's
 *         mirrored and sharded tensors. */
pd_code pd_upload(pd_session *s, uint64_t id, pd_dtype dtype,
                  const int64_t *dims, int rank, const void *data, size_t bytes,
                  pd_layout layout, pd_tensor_info *info,
                  const pd_call_options *call, pd_status *st);

/* Uploads one host value per component (layout PER_COMPONENT):
 * num_components must be pd_session_num_devices(s); component i has shape
 * dims[i][0..ranks[i]) and `bytes[i]` bytes at data[i]. Shapes may differ
 * (the overall shape then has -1 on those axes).
 * Errors:   as pd_upload, plus PD_INVALID_ARGUMENT for a wrong count.
 * Source: paradev.v1.ParallelDevice/Upload (PER_COMPONENT);
 *         TensorFlow's ParallelTensor::FromTensorHandles. */
pd_code pd_upload_components(pd_session *s, uint64_t id, pd_dtype dtype,
                             int num_components, const int64_t *const *dims,
                             const int *ranks, const void *const *data,
                             const size_t *bytes, pd_tensor_info *info,
                             const pd_call_options *call, pd_status *st);

/* Downloads handle `id` into `data` (capacity `capacity` bytes), waiting until
 * it is computed. Layout MIRRORED gives component 0, COMPONENT the chosen
 * component, SHARDED the concatenation of all components along `axis`.
 * *info (may be NULL) gets the dtype and host shape of what was written;
 * *bytes_out (may be NULL) its size.
 * Errors:   PD_OUT_OF_RANGE (`capacity` is smaller than the value: the message
 *           gives the size needed), PD_INVALID_ARGUMENT (layout
 *           PER_COMPONENT: use pd_download_components; a component out of
 *           range; components that cannot be concatenated), PD_NOT_FOUND
 *           (unknown id), the error stored on a tensor whose op failed (e.g.
 *           PD_RESOURCE_EXHAUSTED), transport errors.
 * Thread safety: thread-safe.
 * Source: paradev.v1.ParallelDevice/Download. */
pd_code pd_download(pd_session *s, uint64_t id, pd_layout layout, void *data,
                    size_t capacity, pd_tensor_info *info, size_t *bytes_out,
                    const pd_call_options *call, pd_status *st);

/* Downloads every component: num_components must be
 * pd_session_num_devices(s); component i goes to data[i] (capacity
 * capacity[i]); infos (may be NULL; num_components entries) get each
 * component's host shape.
 * Errors:   as pd_download.
 * Source: paradev.v1.ParallelDevice/Download (PER_COMPONENT). */
pd_code pd_download_components(pd_session *s, uint64_t id, int num_components,
                               void *const *data, const size_t *capacity,
                               pd_tensor_info *infos,
                               const pd_call_options *call, pd_status *st);

/* ---------------------------------------------------------------------------
 * Shared memory transfers (clients on the daemon's machine)
 *
 * A region is a POSIX shared memory object mapped both by the program and by
 * the daemon: pd_upload_from_shared_memory reads a host value from it and
 * pd_download_to_shared_memory writes one into it, and the daemon copies
 * straight between its mapping and the devices (page-locked on CUDA, so the
 * copies are DMA), without the bytes travelling through gRPC. Use it for
 * large tensors when the program runs on the daemon's machine; over the
 * network, use pd_upload / pd_download.
 *
 * The object's first PD_SHARED_MEMORY_HEADER_BYTES bytes are a header that
 * proves it belongs to the session ("PDSHM", version 1, the session token);
 * pd_shared_memory_data points past it, and offsets count from there. The
 * daemon checks the header once, at registration, so it never maps memory of
 * another user on a client's word. The header holds the session token:
 * whoever can read the object can act as the session, so keep the object
 * private (mode 0600; for a daemon that runs as a service user, mode 0660 and
 * a group only the daemon's user is in). A region ends when destroyed, when
 * the session is closed, or when its lease runs out (the daemon unmaps it);
 * tensors uploaded from it count toward the session's quota as pd_upload's.
 * Once pd_shared_memory_destroy or pd_session_close has returned, the daemon
 * never touches the object again: it waited for the copies running, and a
 * transfer still waiting for its tensor then fails with PD_CANCELLED.
 * Limits: 64 regions per session and 4096 per daemon; registered bytes
 * (data and headers) at most half the machine's physical memory per daemon
 * and per session, and at most the session's memory quota when it has one.
 * Source: NVIDIA Triton's system shared memory extension
 * (RegisterSystemSharedMemory; tritonclient.utils.shared_memory);
 * paradev.v1.ParallelDevice/RegisterSharedMemory. */

#define PD_SHARED_MEMORY_HEADER_BYTES 64

typedef struct pd_shared_memory pd_shared_memory;

/* Creates a fresh shared memory object of `bytes` bytes of data (plus the
 * header) under an unguessable key "/paradev-PID-RANDOM" (shm_open with
 * O_CREAT|O_EXCL, then exactly `mode`: 0 means 0600), maps it, writes the
 * session's header and registers it with the daemon under the key's name.
 * *out gets the region; free it with pd_shared_memory_destroy (which also
 * unlinks the object). The data starts zeroed. Every page of the object is
 * reserved at once (posix_fallocate: time and memory in proportion to
 * `bytes`), so a /dev/shm without room fails here instead of killing the
 * program with SIGBUS at its first write (Docker's /dev/shm is 64 MiB unless
 * --shm-size says otherwise).
 * Errors:   PD_INVALID_ARGUMENT (bytes 0, mode with bits beyond 0777),
 *           PD_RESOURCE_EXHAUSTED (no room in /dev/shm: the message gives
 *           the bytes needed and free, and no object is left; no room in the
 *           address space; the limits above: the message names the limit,
 *           what is registered and what was asked), PD_PERMISSION_DENIED
 *           (the daemon's user cannot open the object: see `mode`),
 *           PD_FAILED_PRECONDITION (session closed), transport errors.
 * Thread safety: thread-safe; the region may be used by several threads.
 * Source: tritonclient.utils.shared_memory.create_shared_memory_region +
 *         RegisterSystemSharedMemory. */
pd_code pd_shared_memory_create(pd_session *s, size_t bytes, unsigned mode,
                                pd_shared_memory **out,
                                const pd_call_options *call, pd_status *st);

/* Registers an existing object `key` ("/" + 1 to 200 of [A-Za-z0-9._-]) that
 * the program manages, under `name` (NULL: the key without its '/'; 1 to
 * max_string_bytes printable ASCII bytes, unique among the session's
 * regions). `byte_size` bytes from the object's start are mapped, header
 * included (0: the object's whole size). With `write_header` the library
 * writes the session's header into the object first (it must be writable
 * here); without it, the program wrote it (pd_shared_memory_write_header)
 * and the daemon checks it before the library maps the object. The object
 * is not unlinked by pd_shared_memory_destroy. Reserving its pages is the
 * program's part (posix_fallocate; the library reserves the header's page
 * before writing it): on a full /dev/shm, copies that touch a page never
 * allocated fail with PD_RESOURCE_EXHAUSTED in the daemon, and the
 * program's own first write to one raises SIGBUS.
 * Errors:   PD_INVALID_ARGUMENT (bad key or name, byte_size not over the
 *           header, an object smaller than byte_size or not a regular one),
 *           PD_NOT_FOUND (no such object), PD_PERMISSION_DENIED (the daemon's
 *           user cannot open it for reading and writing, or its header is not
 *           this session's), PD_ALREADY_EXISTS (a live name),
 *           PD_RESOURCE_EXHAUSTED (the region and byte limits above; no room
 *           in /dev/shm for the header), transport errors.
 * Thread safety: thread-safe.
 * Source: RegisterSystemSharedMemory of Triton's extension. */
pd_code pd_shared_memory_register(pd_session *s, const char *key,
                                  const char *name, size_t byte_size,
                                  bool write_header, pd_shared_memory **out,
                                  const pd_call_options *call, pd_status *st);

/* Writes the session's 64-byte header into `header` (at least
 * PD_SHARED_MEMORY_HEADER_BYTES bytes: the start of an object), for programs
 * that register objects with write_header false.
 * Errors:   PD_INVALID_ARGUMENT (NULL, len under the header's size).
 * Thread safety: thread-safe. */
pd_code pd_shared_memory_write_header(const pd_session *s, void *header,
                                      size_t len, pd_status *st);

/* The data area (past the header) and its size in bytes. Valid until
 * pd_shared_memory_destroy. NULL / 0 for a NULL region. */
void *pd_shared_memory_data(const pd_shared_memory *r);
size_t pd_shared_memory_size(const pd_shared_memory *r);
/* The region's name in the session and the object's key. */
const char *pd_shared_memory_name(const pd_shared_memory *r);
const char *pd_shared_memory_key(const pd_shared_memory *r);

/* Unregisters the region (unless the session was closed; a region the daemon
 * already dropped with its session counts as done), unmaps it here, unlinks
 * an object pd_shared_memory_create made, and frees `r` in every case. The
 * session must still exist (pd_session_delete comes after). NULL is a no-op.
 * When it returns, the daemon has unmapped the object and will not touch it
 * again (copies running when the request arrived finished first; a download
 * still waiting for its tensor fails with PD_CANCELLED, writing nothing).
 * Errors:   transport errors of the unregistration (the region is freed
 *           here anyway).
 * Thread safety: no transfer may be using `r`. */
pd_code pd_shared_memory_destroy(pd_shared_memory *r,
                                 const pd_call_options *call, pd_status *st);

/* pd_upload with the host value read by the daemon from `region` at data
 * offset `offset` (bytes past the header): a value of `dtype` and shape
 * dims[0..rank), mirrored or sharded. The region's bytes must not change
 * during the call; the program may reuse them once it returns.
 * Errors:   as pd_upload, plus PD_NOT_FOUND (the region is not registered in
 *           this session), PD_OUT_OF_RANGE (the value runs past the region's
 *           data: the message gives offset, size and the region's size),
 *           PD_FAILED_PRECONDITION (the object was truncated while mapped),
 *           PD_RESOURCE_EXHAUSTED (also: a page of the object could not be
 *           allocated because /dev/shm is full; the object's pages were not
 *           reserved), PD_CANCELLED (the region was unregistered, or its
 *           session ended, before the daemon began to read it).
 * Thread safety: thread-safe.
 * Source: paradev.v1.ParallelDevice/UploadFromSharedMemory; Triton's
 *         shared_memory_region / shared_memory_offset input parameters. */
pd_code pd_upload_from_shared_memory(pd_session *s, uint64_t id,
                                     pd_dtype dtype, const int64_t *dims,
                                     int rank, pd_shared_memory *region,
                                     uint64_t offset, pd_layout layout,
                                     pd_tensor_info *info,
                                     const pd_call_options *call,
                                     pd_status *st);

/* pd_upload_components from a region: component i's value (shape
 * dims[i][0..ranks[i])) follows component i-1's, from data offset `offset`
 * on, with no padding. num_components must be pd_session_num_devices(s).
 * Errors:   as pd_upload_from_shared_memory, plus PD_INVALID_ARGUMENT for a
 *           wrong count.
 * Source: paradev.v1.ParallelDevice/UploadFromSharedMemory (PER_COMPONENT). */
pd_code pd_upload_components_from_shared_memory(
    pd_session *s, uint64_t id, pd_dtype dtype, int num_components,
    const int64_t *const *dims, const int *ranks, pd_shared_memory *region,
    uint64_t offset, pd_tensor_info *info, const pd_call_options *call,
    pd_status *st);

/* pd_download into `region` from data offset `offset` on, waiting until the
 * tensor is computed: layout MIRRORED (component 0), COMPONENT or SHARDED.
 * *info (may be NULL) gets the dtype and host shape written, *bytes_out (may
 * be NULL) its size. Nothing is written when the value would not fit.
 * Errors:   as pd_download (the error stored on a failed tensor included),
 *           plus PD_NOT_FOUND (region not registered in this session),
 *           PD_OUT_OF_RANGE (the value does not fit at `offset`: the message
 *           gives the size needed), PD_FAILED_PRECONDITION (truncated),
 *           PD_RESOURCE_EXHAUSTED (also: /dev/shm full, as for uploads),
 *           PD_CANCELLED (the region was unregistered, or its session
 *           ended, while the call waited for the tensor: nothing written).
 * Thread safety: thread-safe.
 * Source: paradev.v1.ParallelDevice/DownloadToSharedMemory; Triton's
 *         shared memory output parameters. */
pd_code pd_download_to_shared_memory(pd_session *s, uint64_t id,
                                     pd_layout layout,
                                     pd_shared_memory *region, uint64_t offset,
                                     pd_tensor_info *info, size_t *bytes_out,
                                     const pd_call_options *call,
                                     pd_status *st);

/* Every component into `region`, one after another from data offset
 * `offset` on; infos (may be NULL; num_components entries) get each one's
 * host shape, *bytes_out (may be NULL) the total. num_components must be
 * pd_session_num_devices(s).
 * Errors:   as pd_download_to_shared_memory.
 * Source: paradev.v1.ParallelDevice/DownloadToSharedMemory (PER_COMPONENT). */
pd_code pd_download_components_to_shared_memory(
    pd_session *s, uint64_t id, int num_components, pd_shared_memory *region,
    uint64_t offset, pd_tensor_info *infos, size_t *bytes_out,
    const pd_call_options *call, pd_status *st);

/* ---------------------------------------------------------------------------
 * Attributes of an op */

typedef struct pd_attrs pd_attrs;

/* A set of named, typed attribute values (TensorFlow's AttrValue: the kinds
 * paradev's ops use). Setting a name again replaces its value. Setters do not
 * fail: a bad value (an empty name, a shape of rank over PD_MAX_RANK, a
 * negative list length, out of memory) is remembered and reported as
 * PD_INVALID_ARGUMENT (or PD_RESOURCE_EXHAUSTED) by the call that uses the
 * set. The daemon checks the rest (names its op knows, value kinds, list
 * lengths against max_list_length, string lengths). Strings and lists are
 * copied. Returns NULL when out of memory.
 * Thread safety: one writer at a time; calls may read a set concurrently.
 * Source: TFE_OpSetAttr* of TensorFlow's eager C API. */
pd_attrs *pd_attrs_new(void);
void pd_attrs_delete(pd_attrs *a);
/* Removes every attribute (and a remembered error). */
void pd_attrs_clear(pd_attrs *a);
void pd_attrs_set_int(pd_attrs *a, const char *name, int64_t v);
void pd_attrs_set_float(pd_attrs *a, const char *name, double v);
void pd_attrs_set_bool(pd_attrs *a, const char *name, bool v);
void pd_attrs_set_string(pd_attrs *a, const char *name, const char *v);
void pd_attrs_set_dtype(pd_attrs *a, const char *name, pd_dtype v);
void pd_attrs_set_shape(pd_attrs *a, const char *name, const int64_t *dims,
                        int rank);
void pd_attrs_set_int_list(pd_attrs *a, const char *name, const int64_t *v,
                           int n);
void pd_attrs_set_float_list(pd_attrs *a, const char *name, const double *v,
                             int n);
/* Number of attributes set. */
int pd_attrs_count(const pd_attrs *a);

/* ---------------------------------------------------------------------------
 * Execute */

/* Runs `op` (a TensorFlow raw-op name: "Add", "MatMul", "AllReduce", ...) on
 * every device of the session's mesh.
 *
 * inputs:   n_inputs handles of the session (each component is read on its own
 *           device); outputs of earlier ops, even ones not computed yet.
 * outputs:  output_ids holds n_outputs ids (the op's number of outputs); an
 *           entry of 0 is replaced by a fresh id. On return each names a
 *           parallel tensor whose dtype and shape are already known; *outputs
 *           (may be NULL; n_outputs entries) gets them.
 * Returns once the op is validated and queued: a failure on a device is
 *           stored on its outputs and reported by pd_sync or pd_download (and
 *           by ops that consume them).
 * Errors:   PD_INVALID_ARGUMENT (unknown op, wrong arity, dtype or shape,
 *           a bad attribute, a limit), PD_NOT_FOUND (an input not in the
 *           session), PD_ALREADY_EXISTS (an output id in use),
 *           PD_RESOURCE_EXHAUSTED (quota, handle limit), transport errors.
 * Thread safety: thread-safe; ops of one thread run in the order called.
 * Source: TFE_Execute on TensorFlow's parallel device;
 *         paradev.v1.ParallelDevice/Execute. */
pd_code pd_execute(pd_session *s, const char *op, const uint64_t *inputs,
                   int n_inputs, const pd_attrs *attrs, uint64_t *output_ids,
                   int n_outputs, pd_tensor_info *outputs,
                   const pd_call_options *call, pd_status *st);

/* A list of ops sent in one Execute request (all or nothing). */
typedef struct pd_batch pd_batch;

/* Returns an empty batch, or NULL when out of memory. */
pd_batch *pd_batch_new(void);
void pd_batch_delete(pd_batch *b);
/* Empties the batch for reuse. */
void pd_batch_clear(pd_batch *b);
/* Appends an op; arguments as pd_execute (the batch copies them). Output ids
 * of 0 are replaced by fresh ids of `s` now, and written back to output_ids,
 * so later ops of the batch can name them.
 * Errors:   PD_INVALID_ARGUMENT (empty op name, negative counts, a bad
 *           attribute), PD_RESOURCE_EXHAUSTED (out of memory). */
pd_code pd_batch_add(pd_batch *b, pd_session *s, const char *op,
                     const uint64_t *inputs, int n_inputs,
                     const pd_attrs *attrs, uint64_t *output_ids,
                     int n_outputs, pd_status *st);
/* Number of ops and of outputs (all ops together) in the batch. */
int pd_batch_num_ops(const pd_batch *b);
int pd_batch_num_outputs(const pd_batch *b);

/* Sends the batch as one Execute request: when any op is invalid none is
 * queued and the message names the op's index. *outputs (may be NULL) gets
 * pd_batch_num_outputs(b) entries, op by op.
 * Errors:   as pd_execute, plus PD_INVALID_ARGUMENT for an empty batch or one
 *           over max_ops_per_request.
 * Source: paradev.v1.ParallelDevice/Execute. */
pd_code pd_execute_batch(pd_session *s, const pd_batch *b,
                         pd_tensor_info *outputs, const pd_call_options *call,
                         pd_status *st);

/* ---------------------------------------------------------------------------
 * Streamed enqueue */

typedef struct pd_stream pd_stream;

/* The daemon's answer to one stream item. Valid during the callback only. */
typedef struct pd_stream_reply {
  uint64_t index;                /* 0-based position of the item */
  pd_code code;                  /* the item's outcome */
  const char *message;           /* "" when OK */
  int num_outputs;               /* execute items that succeeded */
  const pd_tensor_info *outputs;
} pd_stream_reply;

typedef void (*pd_stream_reply_fn)(void *arg, const pd_stream_reply *reply);

typedef struct pd_stream_options {
  size_t struct_size;
  pd_stream_reply_fn on_reply; /* called for every reply, in order, on the
                                  stream's own thread; must not call into the
                                  stream. NULL: none. */
  void *on_reply_arg;
  int max_in_flight;           /* items sent and not yet answered before
                                  pd_stream_execute waits; 0: 4096 */
  int64_t timeout_ms;          /* deadline of the whole stream; 0: none */
} pd_stream_options;

#define PD_STREAM_OPTIONS_INITIALIZER \
  {sizeof(pd_stream_options), NULL, NULL, 0, 0}

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
                          uint64_t *output_ids, int n_outputs,
                          uint64_t *index, pd_status *st);

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

/* ---------------------------------------------------------------------------
 * Gradient tapes
 *
 * A tape lives on the daemon, in the session, under a 64-bit id the caller
 * chooses (unique among the session's live tapes; 0 is never valid;
 * pd_session_new_id gives a fresh one). While it exists, every op the session
 * runs whose inputs include a tensor the tape tracks (a watched handle, or a
 * floating output of an op it recorded) is recorded; pd_tape_gradient then
 * walks the recorded ops backwards and runs the gradient ops on the mesh like
 * any op: asynchronously, queued behind the forward ops, with results that
 * are handles whose dtype and shape are known at once. Integer and bool
 * values carry no gradient. Ops with a gradient: Add Sub Mul Div Neg Exp Log
 * Sqrt Rsqrt Square Tanh Sigmoid Relu Pow Maximum Minimum MatMul BatchMatMul
 * BiasAdd Sum Mean Reshape Transpose Concat Slice Gather Cast Identity
 * Softmax LogSoftmax SparseSoftmaxCrossEntropyWithLogits AllReduce (sum,
 * mean). A session holds at most 64 tapes; they are freed with it.
 *
 * Every tape call has an Enqueue item of the same meaning (pd_stream_tape_*)
 * so that a training step -- start, watch, forward, gradient, update, delete
 * -- is written without waiting for a single reply.
 *
 * Source: TensorFlow's GradientTape (tensorflow/c/eager/tape.h, the
 * gradients of math_grad.py, nn_grad.py, array_grad.py);
 * paradev.v1.ParallelDevice/StartTape, WatchTape, Gradient, DeleteTape. */

/* Starts tape `tape_id` in the session. A one-shot tape (persistent false)
 * answers one pd_tape_gradient and then releases what it recorded; a
 * persistent one answers any number until pd_tape_delete.
 * Errors:   PD_INVALID_ARGUMENT (id 0), PD_ALREADY_EXISTS (a live tape id),
 *           PD_RESOURCE_EXHAUSTED (64 tapes in the session), PD_NOT_FOUND
 *           (session gone), PD_FAILED_PRECONDITION (session closed),
 *           transport errors.
 * Thread safety: thread-safe; a tape records the ops of every thread of the
 *           session in the order the daemon receives them. */
pd_code pd_tape_start(pd_session *s, uint64_t tape_id, bool persistent,
                      const pd_call_options *call, pd_status *st);

/* Watches handles ids[0..n) on the tape, all or nothing: ops that consume
 * them are recorded from now on, and they can be sources of a gradient.
 * Watching a handle twice, or one of an integer or bool dtype, does nothing.
 * Errors:   PD_NOT_FOUND (an unknown tape or handle: nothing is watched),
 *           PD_FAILED_PRECONDITION (a one-shot tape that already computed
 *           its gradient), PD_INVALID_ARGUMENT (over max_ids_per_request),
 *           transport errors.
 * Thread safety: thread-safe. */
pd_code pd_tape_watch(pd_session *s, uint64_t tape_id, const uint64_t *ids,
                      int n, const pd_call_options *call, pd_status *st);

/* Gradients of `target` with respect to sources[0..n_sources), weighted by
 * the upstream gradient: the vector-Jacobian product of every recorded op
 * from target back to each source, summed over all paths.
 *
 * target:          a handle of a floating dtype (normally a loss).
 * sources:         n_sources handles; one the target does not depend on
 *                  through recorded ops gets zeros of its dtype and shape.
 * output_gradient: the upstream gradient of target (its dtype and shape), or
 *                  0 for ones like the target.
 * result_ids:      n_sources fresh ids; an entry of 0 is replaced by a fresh
 *                  id (written back). Result i is the gradient for source i,
 *                  of its dtype and shape; *results (may be NULL; n_sources
 *                  entries) gets the results' dtypes and shapes.
 * Returns once the gradient ops are validated and queued: a failure on a
 *                  device shows on the results (pd_sync, pd_download).
 * Errors:   PD_INVALID_ARGUMENT (a non-floating target, an output gradient of
 *           the wrong dtype or shape, a path from target to a source through
 *           an op that has no gradient -- the message names the op -- or
 *           over max_ids_per_request), PD_NOT_FOUND (an unknown tape, target,
 *           source or output gradient), PD_ALREADY_EXISTS (a live result
 *           id), PD_FAILED_PRECONDITION (a one-shot tape used before),
 *           PD_RESOURCE_EXHAUSTED (the session's memory quota -- the gradient
 *           ops count against it -- or its handle or queue limits),
 *           transport errors. On error no result exists and a one-shot tape
 *           may be asked again.
 * Thread safety: thread-safe.
 * Source: GradientTape.gradient (TensorFlow eager); dev_tape_gradient. */
pd_code pd_tape_gradient(pd_session *s, uint64_t tape_id, uint64_t target,
                         const uint64_t *sources, int n_sources,
                         uint64_t output_gradient, uint64_t *result_ids,
                         pd_tensor_info *results, const pd_call_options *call,
                         pd_status *st);

/* Deletes the tape; the daemon releases what it recorded (tensors whose
 * handles were deleted are freed once no queued op uses them).
 * Errors:   PD_NOT_FOUND (no such tape, or session gone), transport errors.
 * Thread safety: thread-safe. */
pd_code pd_tape_delete(pd_session *s, uint64_t tape_id,
                       const pd_call_options *call, pd_status *st);

/* The same four as items of an Enqueue stream: they return at once (unless
 * max_in_flight items await replies) and their outcome comes in their reply
 * (pd_stream_wait reports failures); a gradient item's reply carries the
 * results as its outputs. Arguments and errors as the unary calls; ops and
 * tape items of one stream take effect in the order they were queued.
 * Errors (at once):   PD_INVALID_ARGUMENT (NULL stream or ids, a negative
 *                     count, target 0), the stream's final error,
 *                     PD_FAILED_PRECONDITION (after pd_stream_close).
 * Thread safety: one thread at a time per stream. */
pd_code pd_stream_tape_start(pd_stream *t, uint64_t tape_id, bool persistent,
                             uint64_t *index, pd_status *st);
pd_code pd_stream_tape_watch(pd_stream *t, uint64_t tape_id,
                             const uint64_t *ids, int n, uint64_t *index,
                             pd_status *st);
pd_code pd_stream_tape_gradient(pd_stream *t, uint64_t tape_id,
                                uint64_t target, const uint64_t *sources,
                                int n_sources, uint64_t output_gradient,
                                uint64_t *result_ids, uint64_t *index,
                                pd_status *st);
pd_code pd_stream_tape_delete(pd_stream *t, uint64_t tape_id, uint64_t *index,
                              pd_status *st);

/* ---------------------------------------------------------------------------
 * Sync, Describe, Delete */

/* Waits until the session's work (n == 0) or the given handles are computed.
 * Returns PD_OK, or the first error stored on them, whose handle goes to
 * *failed_id (may be NULL; 0 when the call itself failed). The session stays
 * usable after a stored error.
 * Errors:   a stored error's code (e.g. PD_RESOURCE_EXHAUSTED of an op out of
 *           memory), PD_NOT_FOUND (unknown id), PD_INVALID_ARGUMENT (over
 *           max_ids_per_request), PD_DEADLINE_EXCEEDED, PD_CANCELLED,
 *           transport errors.
 * Thread safety: thread-safe.
 * Source: TFE_ContextAsyncWait; paradev.v1.ParallelDevice/Sync. */
pd_code pd_sync(pd_session *s, const uint64_t *ids, int n, uint64_t *failed_id,
                const pd_call_options *call, pd_status *st);

typedef struct pd_description pd_description;

/* Describes handles without waiting for the devices: dtype, overall shape,
 * per-component shapes, bytes, and whether computed (or failed, and why).
 * Free the result with pd_description_delete.
 * Errors:   PD_NOT_FOUND (an unknown id: nothing is described),
 *           PD_INVALID_ARGUMENT (over max_ids_per_request), transport errors.
 * Thread safety: thread-safe.
 * Source: TensorFlow's RemoteTensorHandle metadata;
 *         paradev.v1.ParallelDevice/Describe. */
pd_description *pd_describe(pd_session *s, const uint64_t *ids, int n,
                            const pd_call_options *call, pd_status *st);

void pd_description_delete(pd_description *d);
/* Number of tensors described (n of the call). */
int pd_description_count(const pd_description *d);
/* Tensor i's id, dtype and overall shape (-1 on axes where components
 * differ). Returns false for i out of range. */
bool pd_description_info(const pd_description *d, int i, pd_tensor_info *out);
/* Components of tensor i (0 for i out of range). */
int pd_description_num_components(const pd_description *d, int i);
/* Shape of component `component` of tensor i (into out->rank/dims; out->id
 * and dtype as the tensor's). False when out of range. */
bool pd_description_component(const pd_description *d, int i, int component,
                              pd_tensor_info *out);
/* Bytes of all components of tensor i together. */
uint64_t pd_description_bytes(const pd_description *d, int i);
/* True when tensor i is computed or failed. */
bool pd_description_ready(const pd_description *d, int i);
/* When ready: the error stored on tensor i (PD_OK if none); *message (may be
 * NULL) gets its text, valid as long as `d`. */
pd_code pd_description_status(const pd_description *d, int i,
                              const char **message);

/* Drops handles (all or nothing); their memory is freed once no queued op
 * uses it. Deleted ids may be used again.
 * Errors:   PD_NOT_FOUND (an unknown id: nothing is deleted),
 *           PD_INVALID_ARGUMENT (over max_ids_per_request), transport errors.
 * Thread safety: thread-safe.
 * Source: TensorFlow's DeleteTensorHandle; paradev.v1.ParallelDevice/Delete. */
pd_code pd_delete(pd_session *s, const uint64_t *ids, int n,
                  const pd_call_options *call, pd_status *st);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_PARADEV_H */
