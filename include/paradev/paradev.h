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
 *
 * Layout: this header holds the conventions, statuses and cancellation, the
 * client, sessions, attributes, execution and Sync/Describe/Delete; it
 * includes the rest by domain: paradev/transfer.h (Upload, Download),
 * paradev/shm.h (shared memory), paradev/stream.h (the streamed enqueue),
 * paradev/tape.h (gradient tapes) and paradev/checkpoint.h (checkpoints read
 * and written by the daemon). Include <paradev/paradev.h> only.
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

/* Returns one sentence about what to do next after the failure held in `s`:
 * pd_status_str of its code, unless the message tells more. For
 * PD_UNAUTHENTICATED, whether the daemon refused the caller's identity
 * (none given where one is required, a bearer token unknown or not taken:
 * the options that give one), a job token, or a session token; for
 * PD_UNAVAILABLE, a daemon that is draining, and an UNAVAILABLE the daemon
 * itself answered (its mesh across machines not whole, a session the mesh
 * ended, a URL it could not fetch: the message says why; libparadev frames
 * only a transport failure "cannot reach TARGET: ...", and only that gets
 * "check that paradevd runs ..."). NULL `s`: as PD_OK.
 * Thread-safe; static storage. */
const char *pd_status_hint(const pd_status *s);

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

#define PD_TIMEOUT_DEFAULT 0 /* the client's default_timeout_ms */
#define PD_TIMEOUT_NONE (-1) /* no deadline */

/* Options of one call; NULL means PD_CALL_OPTIONS_INITIALIZER. Every call
 * that takes them fails with PD_INVALID_ARGUMENT, naming the field, when
 * struct_size is not one this library knows (start from the initializer) or
 * timeout_ms is under PD_TIMEOUT_NONE. */
typedef struct pd_call_options {
  size_t struct_size;
  int64_t timeout_ms; /* > 0: deadline this long after the call starts;
                         PD_TIMEOUT_DEFAULT or PD_TIMEOUT_NONE */
  pd_cancel *cancel;  /* NULL: not cancellable */
} pd_call_options;

#define PD_CALL_OPTIONS_INITIALIZER                                            \
  { sizeof(pd_call_options), PD_TIMEOUT_DEFAULT, NULL }

/* ---------------------------------------------------------------------------
 * Client: a connection to one daemon */

typedef struct pd_client pd_client;

/* Whether a TCP target is dialed with TLS (pd_client_options.tls). Unix
 * sockets never use TLS. */
typedef enum pd_tls_mode {
  /* TLS when the target is "tls://host:port", or when a CA bundle or a
   * client certificate is given (in the options or the environment). */
  PD_TLS_AUTO = 0,
  PD_TLS_ON = 1,  /* always (a Unix-socket target is then an error) */
  PD_TLS_OFF = 2, /* never: plaintext, whatever the environment says */
} pd_tls_mode;

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
  /* Transport security and credentials (issue #14). Paths are read once,
   * by pd_client_new. A field left NULL takes its environment variable
   * (unless ignore_environment): */
  pd_tls_mode tls;             /* PD_TLS_AUTO (0), PD_TLS_ON, PD_TLS_OFF */
  const char *tls_ca_file;     /* PEM CAs trusted for the daemon's
                                  certificate; $PARADEV_TLS_CA; neither:
                                  gRPC's default roots */
  const char *tls_cert_file;   /* PEM client certificate chain (mutual TLS);
                                  $PARADEV_TLS_CERT */
  const char *tls_key_file;    /* its PEM private key; $PARADEV_TLS_KEY */
  const char *tls_server_name; /* the name the daemon's certificate must
                                  hold (and SNI); $PARADEV_TLS_SERVER_NAME;
                                  neither: the target's host */
  const char *token;           /* bearer token, sent on every call as
                                  "authorization: Bearer TOKEN";
                                  $PARADEV_TOKEN */
  const char *token_file;      /* a file whose first line is the token
                                  (when `token` and $PARADEV_TOKEN are
                                  unset); $PARADEV_TOKEN_FILE */
  int ignore_environment;      /* nonzero: read none of the variables */
} pd_client_options;

#define PD_CLIENT_OPTIONS_INITIALIZER                                          \
  {                                                                            \
    sizeof(pd_client_options), 0, 0, 0, NULL, PD_TLS_AUTO, NULL, NULL, NULL,   \
        NULL, NULL, NULL, 0                                                    \
  }

/* paradevd's TCP port, for a target that names none. */
#define PD_DEFAULT_PORT 7478

/* Opens a channel to the daemon at `target`: "unix:/path" (a Unix socket; a
 * bare path that starts with "/", "./" or "../" means the same), or
 * "host:port" (TCP, e.g. "127.0.0.1:7478"; "[::1]:7478" for IPv6), or
 * "tls://host:port" (TCP with TLS). A host without a port ("localhost",
 * "[::1]") gets PD_DEFAULT_PORT, not gRPC's 443. pd_client_target gives the
 * address as dialed ("unix:/path", "host:7478", without "tls://");
 * pd_client_tls says whether TLS is on.
 * TLS (see pd_client_options.tls): the daemon's certificate must chain to
 * tls_ca_file (or gRPC's default roots) and name the target's host (or
 * tls_server_name); a client certificate and key are offered when given.
 * A token (token, $PARADEV_TOKEN, token_file, $PARADEV_TOKEN_FILE, first
 * found) is sent on every call, with TLS or without (on plaintext TCP it
 * crosses the network readable: use TLS off loopback).
 * A failed handshake shows on the first call as PD_UNAVAILABLE with a
 * message that names the cause and the fix: the daemon's certificate is
 * not signed by a trusted CA (or expired), does not name the host (name
 * mismatch), the daemon requires a client certificate or refused the one
 * given, or the daemon does not speak TLS (or speaks only TLS).
 * Nothing is sent yet: a daemon that is not there shows as PD_UNAVAILABLE on
 * the first call. `opts` may be NULL.
 * Errors:   PD_INVALID_ARGUMENT (empty or over-long target, "unix:" without
 *           a path, an empty TCP port or one outside 1..65535: the message
 *           names the target and the forms expected; bad options, among
 *           them a struct_size that is not the initializer's; a TLS or
 *           token file that cannot be read or is empty, a certificate
 *           without its key, a token that is not printable ASCII, TLS on
 *           a Unix socket with PD_TLS_ON; the message names the option or
 *           environment variable), PD_RESOURCE_EXHAUSTED (out of memory),
 *           PD_INTERNAL (gRPC refused to create the channel).
 * Thread safety: the client may be shared by threads.
 * Source: grpc_channel_create with insecure or SSL credentials
 * (grpc_ssl_credentials_create; gRPC C core). */
pd_client *pd_client_new(const char *target, const pd_client_options *opts,
                         pd_status *st);

/* Closes the channel and frees the client. Every session, stream and server
 * info made from it must have been deleted first. NULL is a no-op. */
void pd_client_delete(pd_client *c);

/* The address the client dials (the target with "unix:" or the default port
 * added, see pd_client_new). Valid as long as the client. */
const char *pd_client_target(const pd_client *c);

/* 1 when the client dials with TLS, 0 when in plaintext (Unix sockets
 * always); 0 for NULL. */
int pd_client_tls(const pd_client *c);

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
  uint64_t memory_free_bytes; /* limit (or total) less used; 0 if unknown */
  uint64_t memory_peak_bytes;
  double busy_seconds;          /* seconds the device has spent running ops
                                  since the daemon started (kernels and its
                                  share of collectives): two readings and the
                                  wall time between them give how busy it
                                  was; the rest went to RPC, queueing, idle */
  uint64_t memory_cached_bytes; /* freed blocks kept for reuse (CPU block
                                   cache), not in memory_used_bytes */
  int gpu; /* issue #17: the physical GPU the device runs on, as the node's
              scheduler numbers them (SLURM_JOB_GPUS, the CUDA ordinal; the
              CPU backend's simulated device k stands for GPU k); several
              devices may share one; -1: none (0 from a daemon older than
              issue #17) */
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
const char *pd_server_info_version(const pd_server_info *info); /* "0.1.0" */
uint64_t pd_server_info_incarnation(
    const pd_server_info *info); /* random per start */
const char *pd_server_info_backend(
    const pd_server_info *info); /* "cpu", "cuda" */
int64_t pd_server_info_start_time_ms(const pd_server_info *info); /* Unix ms */
int pd_server_info_num_devices(const pd_server_info *info);
/* Device i, 0 <= i < num_devices; NULL outside. */
const pd_device_info *pd_server_info_device(const pd_server_info *info, int i);
const pd_limits *pd_server_info_limits(const pd_server_info *info);
/* The daemon's storage roots (directories and URL prefixes that checkpoint
 * loads and saves may use; see paradev/checkpoint.h): how many, and root i
 * as configured (NULL outside 0 <= i < num). */
int pd_server_info_num_storage_roots(const pd_server_info *info);
const char *pd_server_info_storage_root(const pd_server_info *info, int i);
/* Transport security as the daemon reports it: 1 when its TCP listeners
 * serve TLS, when they require a client certificate (mutual TLS), when a
 * non-loopback TCP listener serves plaintext ([tls] allow_insecure_tcp);
 * else 0. */
int pd_server_info_tls(const pd_server_info *info);
int pd_server_info_client_cert_required(const pd_server_info *info);
int pd_server_info_insecure_tcp(const pd_server_info *info);
/* The daemon's warnings for its operator (one sentence each): how many,
 * and warning i (NULL outside 0 <= i < num). */
int pd_server_info_num_warnings(const pd_server_info *info);
const char *pd_server_info_warning(const pd_server_info *info, int i);

/* A mesh across machines (issue #16), GetServerInfo.mesh:
 * pd_server_info_mesh_* in paradev/mesh.h. */

/* ---------------------------------------------------------------------------
 * Sessions */

typedef struct pd_session pd_session;

typedef struct pd_session_options {
  size_t struct_size;
  const char *client_name;     /* for the daemon's logs; NULL: "libparadev" */
  const char *job_id;          /* e.g. a Slurm job id; NULL: none (the job
                                  comes from job_token; $SLURM_JOB_ID is
                                  never read: alone it is only a claim,
                                  which [auth] require_job_token refuses) */
  uint32_t lease_seconds;      /* 0: the daemon's default (60) */
  uint64_t memory_quota_bytes; /* 0: no quota of the session's own */
  bool keep_alive;             /* the library renews the lease while the
                                  session is open (default true) */
  uint32_t op_timeout_ms;      /* an op of the session not started on the
                                  devices within this many ms of being queued
                                  fails with PD_DEADLINE_EXCEEDED, and so do
                                  the ops that consume it; 0: none. A call's
                                  own deadline (pd_call_options) bounds the
                                  ops of a pd_execute too. */
  const char *job_token;       /* the job's proof (the Slurm prolog's token):
                                  the session's job id comes from it. NULL:
                                  $PARADEV_JOB_TOKEN when set, else none */
  /* Sharing the devices (README, "Sharing the devices"): the priority band,
   * -8..8 (0: the default; a higher band is served strictly first), and the
   * weight, the session's share of device time inside its band, 1..10000
   * (0: 1). Out of range: PD_INVALID_ARGUMENT. */
  int priority;
  uint32_t weight;
  /* Placement (issue #17): narrow the session to these daemon devices (its
   * allowed device set and default placement, in order); NULL / 0: all the
   * session may use (the whole mesh, or its job's or tenant's devices). A
   * device outside the job's or tenant's: PD_PERMISSION_DENIED; out of the
   * daemon's range or named twice: PD_INVALID_ARGUMENT. num_devices out of
   * 0..PD_MAX_DEVICES, or devices NULL with num_devices > 0:
   * PD_INVALID_ARGUMENT from the library, before any call. */
  const int32_t *devices;
  int num_devices;
} pd_session_options;

#define PD_SESSION_OPTIONS_INITIALIZER                                         \
  { sizeof(pd_session_options), NULL, NULL, 0, 0, true, 0, NULL, 0, 0, NULL, 0 }

/* The smallest id the library hands out (pd_session_new_id). */
#define PD_FIRST_LIBRARY_ID (UINT64_C(1) << 62)

/* Opens a session: a namespace of handles with a lease. Unless
 * opts->keep_alive is false, a background thread sends KeepAlive whenever the
 * session has been idle for a third of its lease, until the session is closed
 * or deleted; its last failure is pd_session_keep_alive_status. `opts` may be
 * NULL.
 * Errors:   PD_INVALID_ARGUMENT (lease over max_lease_seconds, priority or
 *           weight out of range, over-long names, a job_id that is not the
 *           job token's, a bad opts->devices list: see there),
 *           PD_UNAUTHENTICATED (a job token unknown, revoked or expired),
 *           PD_PERMISSION_DENIED (a job id without a token where the daemon
 *           requires one; a token of another uid; opts->devices beyond
 *           what the job or tenant was allocated), PD_RESOURCE_EXHAUSTED
 *           (the daemon's max_sessions), and transport errors.
 * Thread safety: thread-safe (see the header's opening comment).
 * Source: CreateContext of TensorFlow's eager service;
 *         paradev.v1.ParallelDevice/CreateSession. */
pd_session *pd_session_new(pd_client *c, const pd_session_options *opts,
                           const pd_call_options *call, pd_status *st);

/* The session's allowed device set (issue #17), which is also its default
 * placement, as CreateSession answered it: writes up to `cap` daemon device
 * indices into out (may be NULL with cap 0; in order) and returns how many
 * the set has (pd_session_num_devices(s)); 0 for a NULL session. A daemon
 * older than issue #17 names no set: its sessions span the whole mesh, and
 * this gives 0..n-1. No call is made; no error.
 * Thread safety: thread-safe (the set never changes).
 * Source: CreateSessionResponse.devices of paradev.v1. */
int pd_session_devices(const pd_session *s, int32_t *out, int cap);

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

/* The size of the session's allowed device set (pd_session_devices): the
 * components of a tensor placed by default (the daemon's mesh size unless
 * the session was narrowed or bound to a job's or tenant's devices). A
 * tensor placed elsewhere has as many components as its own set. */
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
 * Tensors: layouts, and what the client knows of a handle (the transfers
 * themselves are in paradev/transfer.h and paradev/shm.h) */

/* How a host value maps onto a parallel tensor's components. The numbers are
 * the wire's (paradev.v1.LayoutKind). The zero value is UNSPECIFIED, so a
 * pd_layout left zeroed never guesses: a download refuses it with
 * PD_INVALID_ARGUMENT; an upload takes it as MIRRORED (what older clients
 * meant by the zero value; one host value is unambiguous on the way in). */
typedef enum pd_layout_kind {
  PD_LAYOUT_UNSPECIFIED = 0,   /* no layout given: see above */
  PD_LAYOUT_MIRRORED = 1,      /* the same value on every device; a download
                                  returns component 0 and is refused for a
                                  tensor known to be sharded or whose
                                  components differ in shape */
  PD_LAYOUT_SHARDED = 2,       /* split (upload) / concatenated (download)
                                  along `axis`; component i gets
                                  dim/n + (i < dim%n) rows, like
                                  numpy.array_split */
  PD_LAYOUT_PER_COMPONENT = 3, /* one host value per component */
  PD_LAYOUT_COMPONENT = 4,     /* download only: component `component` */
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
  /* Placement (issue #17): the tensor's device set, the daemon's device
   * indices in component order (component i lives on devices[i]);
   * num_devices 0 when the daemon did not say (one older than issue #17).
   * Every info the library fills (execute, streams, uploads, loads,
   * gradients, Describe) carries it; downloads' host shapes do not. */
  int num_devices;
  int32_t devices[PD_MAX_DEVICES];
} pd_tensor_info;

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
 * every device of the session's default device set (pd_session_devices;
 * pd_execute_on chooses another for an op without inputs); an op with
 * inputs runs on their device set.
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

/* pd_execute with a placement (issue #17): an op without tensor inputs
 * (Fill, RandomNormal, DeviceId, ...) runs on devices[0..n_devices) (daemon
 * device indices, in order: component i on devices[i]); NULL / 0: the
 * session's default. An op with inputs runs on their device set; naming
 * another is PD_INVALID_ARGUMENT. *outputs' devices give each output's set.
 * Layouts split over the set, DeviceId is the index within it, collectives
 * run over it.
 * Errors:   as pd_execute, plus PD_INVALID_ARGUMENT (n_devices out of
 *           0..PD_MAX_DEVICES or devices NULL with n_devices > 0, checked
 *           here; from the daemon: inputs on different sets, both named:
 *           move one with ParallelPack, ParallelUnpack or CopyToDevices; a
 *           device out of range or named twice), PD_PERMISSION_DENIED (a
 *           device outside the session's allowed set, named),
 *           PD_UNIMPLEMENTED (a daemon that places only on its whole mesh).
 * Thread safety: thread-safe; `devices` is read during the call only.
 * Source: TensorFlow's parallel device over a chosen list of devices;
 *         Operation.devices of paradev.v1. */
pd_code pd_execute_on(pd_session *s, const int32_t *devices, int n_devices,
                      const char *op, const uint64_t *inputs, int n_inputs,
                      const pd_attrs *attrs, uint64_t *output_ids,
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
                     const pd_attrs *attrs, uint64_t *output_ids, int n_outputs,
                     pd_status *st);
/* pd_batch_add with a placement, as pd_execute_on (issue #17): the batch
 * copies `devices`. The daemon checks the placement when the batch is sent.
 * Errors:   as pd_batch_add, plus PD_INVALID_ARGUMENT (n_devices out of
 *           0..PD_MAX_DEVICES, devices NULL with n_devices > 0).
 * Thread safety: one thread at a time per batch.
 * Source: Operation.devices of paradev.v1. */
pd_code pd_batch_add_on(pd_batch *b, pd_session *s, const int32_t *devices,
                        int n_devices, const char *op, const uint64_t *inputs,
                        int n_inputs, const pd_attrs *attrs,
                        uint64_t *output_ids, int n_outputs, pd_status *st);
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
/* Tensor i's id, dtype, overall shape (-1 on axes where components differ)
 * and device set (num_devices/devices). Returns false for i out of range. */
bool pd_description_info(const pd_description *d, int i, pd_tensor_info *out);
/* Tensor i's device set (issue #17): up to `cap` daemon device indices into
 * out (may be NULL with cap 0), in component order; returns the set's size
 * (0 for i out of range, or from a daemon older than issue #17). No error.
 * Thread safety: thread-safe on a description no one is deleting.
 * Source: TensorDescription.devices of paradev.v1. */
int pd_description_devices(const pd_description *d, int i, int32_t *out,
                           int cap);
/* Components of tensor i (0 for i out of range). */
int pd_description_num_components(const pd_description *d, int i);
/* Shape of component `component` of tensor i (into out->rank/dims; out->id
 * and dtype as the tensor's; out->devices the one device it lives on, when
 * the daemon names the set). False when out of range. */
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

/* The rest of the API, by domain; each holds to the conventions above. */
#include "paradev/transfer.h"   /* pd_upload, pd_download */
#include "paradev/shm.h"        /* pd_shared_memory and its transfers */
#include "paradev/stream.h"     /* pd_stream: the streamed enqueue */
#include "paradev/tape.h"       /* gradient tapes */
#include "paradev/checkpoint.h" /* checkpoints: load and save on the daemon */
#include "paradev/mesh.h"       /* the daemon's place in a mesh */
#include "paradev/ops.h"        /* the op reference (ListOps) */
#include "paradev/function.h"   /* graph functions */

#endif /* PARADEV_PARADEV_H */
