/* The scheduler: sessions, their handle tables and leases, and the queueing of
 * their ops onto the engine.
 *
 * This is the one header other layers (server/, tests) include. It never
 * includes a gRPC header; it speaks device.h's types and pd_code.
 *
 * Conventions (as device.h): functions that can fail return a pd_code and take
 * a `dev_status *` last (may be NULL); out-parameters are written only on
 * success; nothing here logs (events reach the daemon through a callback).
 *
 * Model: TensorFlow's remote eager service (eager_service.proto). A session is
 * its "context": a namespace of client-named handles (RemoteTensorHandle ids)
 * with a lease that any call renews (KeepAlive for idle clients). When the
 * lease runs out, or the session is closed, every handle is released and the
 * engine frees the memory once no queued op uses it.
 *
 * Session tokens are SCHED_TOKEN_BYTES opaque bytes: the daemon's incarnation
 * (8 bytes, little-endian) followed by 128 bits from getrandom(). A token is
 * checked in this order: wrong length -> UNAUTHENTICATED; another incarnation
 * -> NOT_FOUND "not from this run of paradevd" (an earlier run's token and a
 * forged one cannot be told apart); unknown -> NOT_FOUND. An id of another
 * session is NOT_FOUND with the same message as one that never existed.
 *
 * Queueing: sched_execute validates an op, runs its shape inference and
 * publishes its outputs' handles at once (so the reply carries dtypes and
 * shapes), then appends the prepared op to its session's queue. One
 * dispatcher thread takes ops from the sessions' queues and submits them to
 * the engine, which gives every device the same global order. Which session
 * goes next is the policy's (sched_policy.h): strict priority between bands
 * (sched_session_priority), fair share of device time inside a band
 * (sched_session_weight; each op's cost estimated by dev_op_estimate when
 * queued, corrected by the device time the executors measured), and no more
 * than dispatch_ahead_ns of estimated device time submitted ahead of the
 * devices, so the order is decided here, where it can still change. A
 * session's queue is bounded by max_queued_ops and max_queued_device_ns.
 * Ops still queued can be dropped: those of a cancelled call
 * (sched_cancel), and all of a closed, expired or killed session; their
 * outputs then fail with CANCELLED; and those whose deadline passed before
 * they were submitted (sched_execute), which fail with DEADLINE_EXCEEDED.
 * Ops already submitted run to the end (devices do not preempt a running
 * kernel).
 *
 * Waiting: sched_tensor_notify calls back when a handle's tensor is computed
 * without blocking a thread, so a server can honour its callers' deadlines
 * and cancellation (the blocking sched_tensor_wait / sched_sync remain for
 * programs that have a thread to spare).
 *
 * Accounting: a session's bytes are what its ops newly allocate
 * (dev_op_new_bytes: an output that shares its input's buffer, as Reshape's
 * and Identity's do, costs nothing), and its quota is checked against them.
 * Counters of sessions and ops (by op and outcome, with latencies) are kept
 * for a metrics endpoint (sched_get_stats, sched_op_stats).
 *
 * Thread safety: every function may be called from any thread. A session's
 * calls are serialized on the session's own lock; different sessions proceed
 * in parallel.
 */
#ifndef PARADEV_SCHEDULER_H
#define PARADEV_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "storage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SCHED_TOKEN_BYTES 24
#define SCHED_NAME_MAX 256      /* client name and job id, bytes */
#define SCHED_IDENTITY_MAX 512  /* a session's identity, bytes */
#define SCHED_DISPATCH_BATCH 64 /* ops from one session per dispatcher turn */

typedef struct sched sched;
typedef struct sched_session sched_session;

/* Scheduler configuration; starts with struct_size (grow at the end only). */
typedef struct sched_config {
  size_t struct_size;
  uint64_t incarnation;          /* the daemon's, embedded in tokens */
  uint32_t default_lease_s;      /* lease when a client asks for 0 */
  uint32_t max_lease_s;          /* larger requests are INVALID_ARGUMENT */
  int max_sessions;              /* RESOURCE_EXHAUSTED beyond */
  int max_handles_per_session;   /* RESOURCE_EXHAUSTED beyond */
  int max_ops_per_request;       /* INVALID_ARGUMENT beyond */
  uint32_t lease_check_ms;       /* how often the lease thread looks */
  int max_queued_ops;            /* per session; RESOURCE_EXHAUSTED beyond */
  uint64_t default_memory_quota; /* bytes; for sessions that ask 0; 0: none */
  uint64_t max_memory_quota; /* bytes; 0: no cap (see sched_session_create) */
  /* Checkpoints (issue #13); borrowed, must outlive the scheduler. */
  const stg_roots *storage_roots; /* NULL: loads and saves refused */
  stg_cache *storage_cache;
  int load_workers; /* threads reading loads and writing saves; 0: 2; <= 64 */
  /* Sharing the devices (issue #15; sched_policy.h). */
  int policy; /* SCHED_POLICY_FAIR or SCHED_POLICY_ROUND_ROBIN (baseline) */
  /* Estimated device ns the dispatcher keeps submitted and not completed
   * (the executors' queues); 0: no bound. At least three ops are in flight
   * whatever their cost, so a device never waits for the dispatcher. */
  uint64_t dispatch_ahead_ns;
  /* Estimated device ns of one session's queued ops; 0: no bound.
   * RESOURCE_EXHAUSTED beyond, as max_queued_ops. */
  uint64_t max_queued_device_ns;
  /* Graph functions (issue #11): the settings every session's function
   * library is created with (dev_fn_lib_create copies it; its `external`
   * passes and `log` must outlive the scheduler). Zeroed: the defaults. */
  dev_fn_config functions;
} sched_config;

/* sched_config.policy */
#define SCHED_POLICY_FAIR 0        /* bands, then fair share of device time */
#define SCHED_POLICY_ROUND_ROBIN 1 /* FIFO of sessions, 64 ops per turn */

#define SCHED_CONFIG_INITIALIZER                                               \
  {                                                                            \
    sizeof(sched_config), 0, 60, 86400, 1024, 1000000, 4096, 500, 1 << 20, 0,  \
        0, NULL, NULL, 0, SCHED_POLICY_FAIR, 2000000, 600000000000ull,         \
        DEV_FN_CONFIG_INITIALIZER                                              \
  }

/* Creates a scheduler over engine `e` (borrowed; it must outlive the
 * scheduler) and starts its lease and dispatcher threads. INVALID_ARGUMENT for a config with
 * a zero limit or a wrong struct_size; INTERNAL if the thread cannot start. */
pd_code sched_create(dev_engine *e, const sched_config *cfg, sched **out,
                     dev_status *st);

/* Stops the threads, drops the ops still queued (CANCELLED), closes every
 * session (releasing its handles; observers hear SCHED_END_STOPPED for each,
 * on the caller's thread) and frees the scheduler. Calls must have ended;
 * call it before the engine is destroyed. Accepts NULL. */
void sched_destroy(sched *s);

/* Current number of open sessions. */
int sched_num_sessions(sched *s);

/* Replaces the limits of a running scheduler (a daemon's reload): the lease
 * defaults, max_sessions, max_handles_per_session, max_ops_per_request,
 * max_queued_ops, max_queued_device_ns, dispatch_ahead_ns and the memory
 * quotas of `cfg`; the other fields (policy among them) are
 * ignored. Sessions already open keep their lease and quota; a limit that
 * shrinks below what a session holds stops it from growing, nothing is
 * taken away. INVALID_ARGUMENT (nothing changed) as sched_create. */
pd_code sched_reconfigure(sched *s, const sched_config *cfg, dev_status *st);

/* Holds (true) or resumes (false) the dispatcher: while held, executed ops
 * stay queued (ops it is submitting at the moment still go). For draining a
 * daemon before maintenance, and for tests of queueing and cancellation. */
void sched_pause(sched *s, bool paused);

/* --- Sessions ------------------------------------------------------------ */

typedef struct sched_session_params {
  const char *client_name; /* may be NULL; at most SCHED_NAME_MAX bytes */
  const char *job_id;      /* may be NULL; at most SCHED_NAME_MAX bytes */
  uint32_t lease_s;        /* 0: the default */
  uint64_t memory_quota;   /* bytes over all devices; 0: none */
  /* Tenancy and sharing (issues #14, #15); zero for none / the defaults. */
  const char *tenant; /* the owning tenant's name; NULL or "": no tenant */
  int priority;       /* band: a higher band is served strictly first;
                         0 the default, SCHED_PRIORITY_MIN..MAX */
  uint32_t weight;    /* share of device time inside its band; 0: 1 */
  /* Deadlines (issue #15): an op of the session not started (submitted to
   * the devices) within this many ms of being queued fails with
   * DEADLINE_EXCEEDED, unless its own sched_op sets one; 0: none. */
  uint32_t op_timeout_ms;
  /* Placement (issue #17). `devices`: the allowed device set the client
   * asked for (NULL: all of `bound`, else the whole mesh). `bound`: what
   * the session's job or tenant was allocated (NULL: no bound); the
   * allowed set is never more: a `devices` with a device outside it is
   * PERMISSION_DENIED naming the devices. The allowed set is also the
   * session's default placement (uploads, loads, ops without tensor
   * inputs that name none). Both copied. */
  const dev_devset *devices;
  const dev_devset *bound;
} sched_session_params;

/* Where a session comes from, for operators (issue #14); a struct of its
 * own so that sched_session_params' positional initializers stay valid. */
typedef struct sched_session_origin {
  /* Who opened it, for listings; NULL or "": none. At most
   * SCHED_IDENTITY_MAX bytes. */
  const char *identity;
  /* job_id is the client's unproven claim (no job token): listed as such,
   * never matched by a kill by job. false: the server proved it. */
  bool job_claimed;
} sched_session_origin;

#define SCHED_PRIORITY_MIN (-8)
#define SCHED_PRIORITY_MAX 8
#define SCHED_WEIGHT_MAX 10000

typedef struct sched_session_info {
  uint8_t token[SCHED_TOKEN_BYTES];
  uint64_t seq; /* small number for logs (1, 2, ...) */
  uint32_t lease_s;
  uint64_t memory_quota;
  dev_devset devices; /* the session's allowed (and default) device set */
} sched_session_info;

/* Opens a session. Its quota is p->memory_quota, or default_memory_quota
 * when that is 0; with max_memory_quota set, a session asking for none gets
 * max_memory_quota. Errors: INVALID_ARGUMENT (a name over SCHED_NAME_MAX, a
 * lease over max_lease_s, a quota over max_memory_quota, each naming the
 * limit), RESOURCE_EXHAUSTED (at max_sessions, or the tenant at its
 * max_sessions (sched_tenant_configure): the message names the tenant, the
 * limit and the sessions in use), INTERNAL (getrandom failed). A session of
 * a tenant with a memory quota also fails ops, uploads and loads with
 * RESOURCE_EXHAUSTED when the tenant's sessions together would hold more
 * (naming the tenant, the bytes held and the quota), and its checkpoint
 * loads and saves use the tenant's storage roots. Placement (issue #17):
 * INVALID_ARGUMENT for a p->devices or p->bound that is not a set of this
 * mesh (empty, an index outside it, one given twice); PERMISSION_DENIED
 * "devices [2, 3] are outside the job's allocation [0, 1]" for a
 * p->devices not within p->bound. */
pd_code sched_session_create(sched *s, const sched_session_params *p,
                             sched_session_info *out, dev_status *st);
/* The same, with the session's origin (NULL: no identity, job id proven,
 * as sched_session_create). Errors as above, and INVALID_ARGUMENT for an
 * identity over SCHED_IDENTITY_MAX. */
pd_code sched_session_create_from(sched *s, const sched_session_params *p,
                                  const sched_session_origin *origin,
                                  sched_session_info *out, dev_status *st);

/* Looks a session up by token and renews its lease. On success the caller
 * holds a reference: drop it with sched_session_put. Errors as described at
 * the top (UNAUTHENTICATED, NOT_FOUND). */
pd_code sched_session_open(sched *s, const void *token, size_t len,
                           sched_session **out, dev_status *st);

/* Drops a reference from sched_session_open. Accepts NULL. */
void sched_session_put(sched_session *ss);

/* Closes the session of `token`: it leaves the table and releases every
 * handle. *handles_freed (may be NULL) receives their number. Errors as
 * sched_session_open. */
pd_code sched_session_close(sched *s, const void *token, size_t len,
                            uint64_t *handles_freed, dev_status *st);

/* Renews the lease of a session the caller holds (long-lived streams). */
void sched_session_touch(sched_session *ss);

/* The session's allowed device set (issue #17), which is also its default
 * placement. Thread-safe (fixed at creation). */
const dev_devset *sched_session_devices(const sched_session *ss);

uint64_t sched_session_seq(const sched_session *ss);
/* The tenant the session belongs to ("" for none), its band and weight, as
 * set at sched_session_create. Thread-safe (fixed for the session's life). */
const char *sched_session_tenant(const sched_session *ss);
/* Who opened it (sched_session_origin.identity; "" for none). Thread-safe
 * (fixed for the session's life). */
const char *sched_session_identity(const sched_session *ss);
int sched_session_priority(const sched_session *ss);
uint32_t sched_session_weight(const sched_session *ss);
uint32_t sched_session_lease_s(const sched_session *ss);
/* The session's default op timeout in ms (0: none), as created. */
uint32_t sched_session_op_timeout_ms(const sched_session *ss);

/* The limits of a tenant's sessions together (issue #14). */
typedef struct sched_tenant_limits {
  int max_sessions;      /* sessions in the table at once; 0: none */
  uint64_t memory_quota; /* bytes over all its sessions' handles; 0: none */
  /* The roots its sessions' checkpoint loads and saves may use; NULL: the
   * scheduler's (sched_config.storage_roots). Borrowed: must outlive every
   * session made under it (the daemon keeps them until sched_destroy). */
  const stg_roots *storage_roots;
} sched_tenant_limits;

/* Sets the limits of tenant `tenant` (its account is made when missing)
 * for the sessions created from now on; those open keep their roots, and
 * the new session count and quota apply to the next session and the next
 * op. A tenant never configured has none. Errors: INVALID_ARGUMENT (an
 * empty name or one over SCHED_NAME_MAX), RESOURCE_EXHAUSTED (host memory).
 * Thread-safe (the daemon's start and reload). */
pd_code sched_tenant_configure(sched *s, const char *tenant,
                               const sched_tenant_limits *lim, dev_status *st);

/* A tenant's sessions in the table and the bytes their handles hold
 * (accounted as for quotas); 0 and 0 for a tenant never seen. Thread-safe
 * (takes the session table's lock). For metrics, admin and tests. */
void sched_tenant_usage(sched *s, const char *tenant, int *sessions,
                        uint64_t *bytes);

/* --- The end of a session: observers ------------------------------------ */

/* Why a session ended. */
typedef enum sched_end_reason {
  SCHED_END_CLOSED = 0,  /* CloseSession by its client */
  SCHED_END_EXPIRED = 1, /* its lease ran out */
  SCHED_END_KILLED = 2,  /* an operator's KillSession */
  SCHED_END_STOPPED = 3, /* the daemon stopped (sched_destroy) */
  SCHED_END_FAILED = 4,  /* the daemon's own kill (sched_kill_because) */
} sched_end_reason;

const char *sched_end_reason_name(sched_end_reason why); /* "closed", ... */

/* What an observer learns of an ended session. Pointers valid during the call. */
typedef struct sched_end_info {
  uint64_t session_seq; /* sched_session_seq() of the session */
  const char *client;   /* its client name ("" if none) */
  const char *job_id;   /* its job id ("" if none) */
  sched_end_reason why;
  uint64_t handles_freed; /* handles it still held */
  const char *message; /* what its queued ops failed with */
} sched_end_info;

/* A part of the daemon that keeps state per session or wants to hear of
 * every session's end (shared-memory regions today; graph functions,
 * checkpoints and identities next). */
typedef struct sched_observer {
  const char *name; /* for logs, "shm" */
  /* Called once for every session that ends, for every registered observer,
   * with the state this observer attached to it (NULL if none): after the
   * session left the session table (no call can open it any more) and its
   * queued work was dropped or handed to the devices, on the thread that
   * ended it (an RPC thread for close and kill, the lease thread for expiry,
   * sched_destroy's caller for stop), with no scheduler lock held. Must not
   * block for long and must not call back into this session. */
  void (*on_end)(void *arg, const sched_end_info *info, void *state);
  void *arg;
} sched_observer;

#define SCHED_MAX_OBSERVERS 8

/* Registers an observer; returns its key (0..SCHED_MAX_OBSERVERS-1), or -1
 * when all are taken. Call before the daemon serves (not thread-safe against
 * the calls below); the sched keeps a copy of *obs. */
int sched_observer_add(sched *s, const sched_observer *obs);

/* Attaches `state` under observer `key` to a live session. Errors:
 * PD_INVALID_ARGUMENT (bad key), PD_ALREADY_EXISTS (state already attached
 * under key), PD_FAILED_PRECONDITION (the session has ended: the caller
 * still owns state and must free it). Thread-safe. */
pd_code sched_session_attach(sched_session *ss, int key, void *state,
                             dev_status *st);

/* The state attached under `key`, or NULL. Valid while the caller holds a
 * reference to ss (sched_session_open/put) and the session has not ended. Thread-safe. */
void *sched_session_attached(sched_session *ss, int key);

/* --- Handles ------------------------------------------------------------- */

/* Retains the tensor of handle `id` into *out. NOT_FOUND when the session has
 * no live handle `id` (or the session was closed meanwhile). */
pd_code sched_handle_get(sched_session *ss, uint64_t id, dev_tensor **out,
                         dev_status *st);

/* Drops handles `ids[0..n)`, all or nothing: NOT_FOUND for the first unknown
 * id (nothing deleted), INVALID_ARGUMENT for an id given twice. */
pd_code sched_handle_delete(sched_session *ss, const uint64_t *ids, int n,
                            dev_status *st);

/* Number of live handles and their bytes (for quotas and tests). */
void sched_session_usage(sched_session *ss, int *handles, uint64_t *bytes);

/* --- Uploads ------------------------------------------------------------- */

typedef struct sched_upload sched_upload;

/* Starts an upload into a new handle `id`: creates the tensor (allocated,
 * data unset) per `layout`; see dev_tensor_create_for_layout for the shapes.
 * Errors: INVALID_ARGUMENT (id 0, bad dtype/shape/layout), ALREADY_EXISTS
 * (a live id), RESOURCE_EXHAUSTED (session quota, handle limit, device
 * memory). The upload holds a reference on the session. */
pd_code sched_upload_begin(sched_session *ss, uint64_t id, pd_dtype dtype,
                           const dev_layout *layout,
                           const dev_shape *host_shape,
                           const dev_shape *component_shapes,
                           sched_upload **out, dev_status *st);
/* The same on a chosen device set (issue #17; NULL: the session's
 * default). PERMISSION_DENIED, naming the devices, for a set outside the
 * session's allowed set; INVALID_ARGUMENT for a malformed one. Quota and
 * room are counted per device of the set. */
pd_code sched_upload_begin_on(sched_session *ss, uint64_t id,
                              const dev_devset *devices, pd_dtype dtype,
                              const dev_layout *layout,
                              const dev_shape *host_shape,
                              const dev_shape *component_shapes,
                              sched_upload **out, dev_status *st);

/* Host bytes the upload expects for `component` (PER_COMPONENT) or in all. */
uint64_t sched_upload_expected(const sched_upload *u, int component);

/* Writes a chunk (see dev_tensor_write). */
pd_code sched_upload_write(sched_upload *u, int component, uint64_t offset,
                           const void *data, size_t len, dev_status *st);

/* Publishes the tensor under its id (ALREADY_EXISTS if the id was taken
 * meanwhile, NOT_FOUND if the session closed) and frees `u` in every case.
 * Read what the reply needs (sched_upload_tensor) before committing. */
pd_code sched_upload_commit(sched_upload *u, dev_status *st);

/* The upload's tensor (borrowed, for metadata). */
const dev_tensor *sched_upload_tensor(const sched_upload *u);

/* Drops an upload; frees `u`. Accepts NULL. */
void sched_upload_abort(sched_upload *u);

/* --- Checkpoints: loads and saves (issue #13) -------------------------------
 *
 * A load opens and indexes its files at once (so header errors, unknown
 * names, dtypes and layouts are the call's error and nothing is published),
 * creates every tensor pending (dev_tensor_create_pending), publishes the
 * handles (dtype and shape known at once, bytes counted against the quota as
 * an upload's) and hands the reads to the scheduler's load workers, which
 * read through the storage cache and write into the tensors. A Sync or a
 * Download of a pending tensor waits for it; an op with a pending input
 * stays queued in the scheduler, holding its session's later ops behind it
 * (other sessions go on), until the load of that input ends. A read error is
 * stored on that tensor alone (dev_tensor_complete), like any run-time
 * failure. A load is cancelled with its session (its pending tensors fail
 * with CANCELLED). A sharded tensor's component k reads only its own bytes
 * where the entry is random-access.
 *
 * The storage roots and cache come from sched_config (storage_roots,
 * storage_cache; NULL: loads and saves are FAILED_PRECONDITION "no storage
 * root is configured"). */

#define SCHED_LOAD_MAX_TENSORS 4096 /* per request */

typedef struct sched_load_tensor {
  const char *name;  /* in the checkpoint ("" for a .npy) */
  uint64_t id;       /* the new handle's id */
  dev_layout layout; /* MIRRORED, SHARDED (axis) or PER_COMPONENT */
  /* PER_COMPONENT: one file per device holding `name`; n == 0: entries
   * "<name>:<k>" of the request's source (what a per-component save writes) */
  const char *const *component_sources;
  int n_component_sources;
  /* Where the tensor goes (issue #17); NULL: the request's
   * default_devices, else the session's default. Checked as an upload's. */
  const dev_devset *devices;
} sched_load_tensor;

typedef struct sched_load_request {
  const char *source; /* path beneath a root, or http(s):// URL */
  stg_format format;  /* STG_FORMAT_AUTO: by magic bytes */
  const sched_load_tensor *tensors;
  int n; /* 0: every tensor of `source`, by `default_layout`, ids first_id.. */
  uint64_t first_id;
  dev_layout default_layout;
  const dev_devset *default_devices; /* NULL: the session's default */
} sched_load_request;

typedef struct sched_loaded {
  char name[SCHED_NAME_MAX];
  uint64_t id;
  pd_dtype dtype;
  dev_shape shape; /* as dev_tensor_shape */
} sched_loaded;

typedef struct sched_load_result {
  uint64_t load_id; /* for sched_load_progress; unique in the session */
  uint64_t total_bytes;
  int n;
  sched_loaded *tensors; /* [n], in the request's (or the file's) order */
} sched_load_result;
void sched_load_result_free(sched_load_result *r);

/* INVALID_ARGUMENT (names, layouts, ids, formats; naming the tensor),
 * NOT_FOUND (a name not in the checkpoint, naming it), ALREADY_EXISTS (an id
 * in use), PERMISSION_DENIED (roots), RESOURCE_EXHAUSTED (quota, handles,
 * device memory), UNIMPLEMENTED (dtype), FAILED_PRECONDITION (no storage). */
pd_code sched_load_begin(sched_session *ss, const sched_load_request *req,
                         sched_load_result **out, dev_status *st);

/* sched_load_begin off the caller's thread (issue #13: a stalled source
 * must not hold an RPC thread): checks the request at once
 * (FAILED_PRECONDITION without storage, INVALID_ARGUMENT for its counts,
 * NOT_FOUND for a session already closed), then opens and indexes the
 * files on an open worker and calls done(arg, code, st, r) there exactly
 * once: r (owned by done; free with sched_load_result_free) on PD_OK, else
 * NULL with sched_load_begin's errors, DEADLINE_EXCEEDED (deadline_s, on
 * stg_now_s's clock, 0: none, passed during the open: every fetch of the
 * open and index is bounded by it) or CANCELLED (the session ended, or
 * sched_load_pending_cancel). `req` and everything it points to must stay
 * valid until done is called. *out is a reference for the caller: drop it
 * with sched_load_pending_put (after done, or after cancelling), holding a
 * reference on ss until then. */
typedef struct sched_load_pending sched_load_pending;
typedef void (*sched_load_done_fn)(void *arg, pd_code code,
                                   const dev_status *st, sched_load_result *r);
pd_code sched_load_begin_async(sched_session *ss, const sched_load_request *req,
                               double deadline_s, sched_load_done_fn done,
                               void *arg, sched_load_pending **out,
                               dev_status *st);
/* The caller no longer wants the load (its call was cancelled): if the
 * handles are not published yet, its fetches abort and done gets
 * CANCELLED, nothing published; a load already published goes on. Any
 * thread. */
void sched_load_pending_cancel(sched_load_pending *p);
void sched_load_pending_put(sched_load_pending *p); /* accepts NULL */

/* bytes_done: read from storage and written so far (short of bytes_total
 * when a tensor failed); tensors_done: tensors that ended, loaded or failed;
 * tensors_failed: those of them that failed; done: the load has ended. */
typedef struct sched_load_progress {
  uint64_t bytes_done, bytes_total;
  int tensors_done, tensors_total, tensors_failed;
  bool done;
  pd_code code; /* the first failure's, PD_OK while none */
  char message[DEV_STATUS_MSG_MAX];
} sched_load_progress;

/* NOT_FOUND for a load id the session never had. Finished loads are kept
 * (the last 64 per session) so a late poll still sees the outcome. */
pd_code sched_load_get_progress(sched_session *ss, uint64_t load_id,
                                sched_load_progress *out, dev_status *st);

typedef struct sched_save_tensor {
  const char *name;  /* in the file */
  uint64_t id;       /* a live handle */
  dev_layout layout; /* MIRRORED: component 0 saved once; SHARDED: gathered
                        along axis; PER_COMPONENT: entries "<name>:<k>" and
                        __metadata__ "paradev.components.<name>" = n */
} sched_save_tensor;

typedef struct sched_save_request {
  const char *path;  /* beneath a root; ".npy" (one tensor) or safetensors */
  stg_format format; /* AUTO: .npy by extension, else safetensors */
  const sched_save_tensor *tensors;
  int n;
  const char *const *meta_keys, *const *meta_values;
  int n_meta;
  bool overwrite;
} sched_save_request;

typedef struct sched_save_result {
  uint64_t bytes_written; /* the tensors' data bytes (without the header) */
  char path[4096];        /* the absolute path written (stg_out_path) */
} sched_save_result;

/* Called once, from a save worker, when a save ended (code PD_OK or the
 * error, with `st` filled). Must not block. */
typedef void (*sched_save_done_fn)(void *arg, pd_code code,
                                   const dev_status *st,
                                   const sched_save_result *res);

/* Validates at once (names, ids, layouts, path beneath a root; errors as
 * sched_load_begin's, plus ALREADY_EXISTS for an existing file without
 * overwrite), then, on a save worker, waits for the tensors, writes the file
 * atomically (stg_out) and calls `done`. When it returns an error, `done` is
 * never called. Cancelled with the session (done gets CANCELLED and the
 * temporary file is removed). */
pd_code sched_save_begin(sched_session *ss, const sched_save_request *req,
                         sched_save_done_fn done, void *arg, dev_status *st);

/* --- Ops ----------------------------------------------------------------- */

/* One op of a request, as the server decoded it (borrowed memory). */
typedef struct sched_op {
  const char *op_name;
  const uint64_t *inputs; /* handle ids */
  int num_inputs;
  const dev_attr *attrs;
  int num_attrs;
  const uint64_t *output_ids; /* fresh ids, one per output of the op */
  int num_outputs;
  /* Deadlines (issue #15), zero for none: an absolute deadline on
   * CLOCK_MONOTONIC in ns (the server passes the call's gRPC deadline), and
   * a timeout in ms from queueing that replaces the session's op_timeout_ms.
   * The op gets the earlier of the two; see sched_execute. */
  uint64_t deadline_ns;
  uint32_t timeout_ms;
  /* Placement (issue #17): where an op without tensor inputs runs (NULL:
   * the session's default set). An op with inputs runs on their set; a
   * `devices` that is not theirs is INVALID_ARGUMENT (dev_op_prepare_on).
   * A set outside the session's allowed set is PERMISSION_DENIED naming
   * the devices (CopyToDevices' target too). */
  const dev_devset *devices;
} sched_op;

/* One op's outputs: the first SCHED_RESULT_INLINE inline (a 4096-op request
 * pays 8 per op, not DEV_MAX_OUTPUTS); the rest (a list output) go to
 * more_dtype / more_shape, which the caller points at room for num_outputs -
 * SCHED_RESULT_INLINE each (NULL: INVALID_ARGUMENT). */
#define SCHED_RESULT_INLINE 8
typedef struct sched_op_result {
  int num_outputs;
  pd_dtype dtype[SCHED_RESULT_INLINE];
  dev_shape shape[SCHED_RESULT_INLINE];
  pd_dtype *more_dtype;
  dev_shape *more_shape;
} sched_op_result;
/* Output j's dtype and shape (a const dev_shape *). */
#define sched_result_dtype(r, j) (*SCHED_RESULT_AT(r, dtype, more_dtype, j))
#define sched_result_shape(r, j) SCHED_RESULT_AT(r, shape, more_shape, j)
#define SCHED_RESULT_AT(r, f, more, j)                                         \
  ((j) < SCHED_RESULT_INLINE ? &(r)->f[j] : &(r)->more[(j)-SCHED_RESULT_INLINE])

/* Checks that one request's `n` ops are within the scheduler's
 * max_ops_per_request: the one check (and message) of that limit, which
 * sched_execute makes too and the server makes before it decodes a request's
 * ops. Errors: PD_INVALID_ARGUMENT (n < 1 or over the limit). Thread-safe. */
pd_code sched_check_ops(sched *s, long n, dev_status *st);

/* Validates, infers and queues ops[0..n) in order, all or nothing: an op may
 * consume outputs of earlier ops of the same call. On success results[i]
 * gives op i's outputs' dtypes and shapes, known before the devices run.
 * `tag` (0: none) marks the queued ops for sched_cancel.
 * Errors (the message starts with "op <i> (<name>): ", *failed_op = i, and
 * nothing is queued): INVALID_ARGUMENT (too many ops, id 0, an output id
 * given twice, the wrong number of output ids, anything dev_op_prepare
 * rejects), NOT_FOUND (an input not in the session), ALREADY_EXISTS (an
 * output id that is live), RESOURCE_EXHAUSTED (quota, handle limit).
 * Deadlines: an op still queued (not submitted to the engine) at its
 * deadline (ops[i].deadline_ns, or timeout_ms / the session's op_timeout_ms
 * after queueing, whichever is earlier) is dropped, at the dispatcher's turn
 * or by the lease thread's timer when nothing dispatches it (a paused
 * dispatcher, a session held on a loading tensor): its outputs fail with
 * DEADLINE_EXCEEDED naming the op, its deadline and how long it was queued,
 * and so do the ops that consume them (the engine passes an input's error
 * on). An op already on the devices runs to its end. The session goes on. */
pd_code sched_execute(sched_session *ss, const sched_op *ops, int n,
                      uint64_t tag, sched_op_result *results, int *failed_op,
                      dev_status *st);

/* Drops the session's ops queued with `tag` (not yet given to the engine);
 * their outputs fail with CANCELLED. Returns how many were dropped. */
int sched_cancel(sched_session *ss, uint64_t tag);

/* A tag no other caller of this scheduler got (never 0). */
uint64_t sched_new_tag(sched *s);

/* Waits until `t` (a tensor of session `ss`, e.g. from sched_handle_get) is
 * computed: first until the session's queue has handed over every op queued
 * so far (or until t's own op was dropped: cancelled, past its deadline),
 * then on the devices. Returns the tensor's stored error, if any. */
pd_code sched_tensor_wait(sched_session *ss, dev_tensor *t, dev_status *st);

/* Waits for handles ids[0..n) (n == 0: every live handle of the session),
 * as sched_tensor_wait.
 * Returns OK or a lookup error (NOT_FOUND); the first error stored on the
 * tensors goes to *tensor_err (code OK when none) and its id to *failed_id
 * (0 when none). */
pd_code sched_sync(sched_session *ss, const uint64_t *ids, int n,
                   dev_status *tensor_err, uint64_t *failed_id, dev_status *st);

/* Calls fn(arg, t, code) once `t` (a tensor of session `ss`) is computed, as
 * dev_tensor_notify does, but also for the output of an op still in the
 * session's queue: the registration then waits, without a thread, until
 * every op queued before it was submitted or dropped. fn runs on the
 * caller's thread (already computed), the dispatcher's, or an executor's; it
 * must not block. Returns RESOURCE_EXHAUSTED (host memory); fn is then never
 * called. */
pd_code sched_tensor_notify(sched_session *ss, dev_tensor *t, dev_ready_fn fn,
                            void *arg, dev_status *st);

/* A handle and a reference on its tensor (sched_collect). */
typedef struct sched_ref {
  uint64_t id;
  dev_tensor *t;
} sched_ref;

/* Retains the tensors of handles ids[0..n) (n == 0: every live handle) into
 * a new array *out of *count entries; free it with sched_refs_release.
 * Errors: NOT_FOUND (an unknown id, nothing retained), RESOURCE_EXHAUSTED. */
pd_code sched_collect(sched_session *ss, const uint64_t *ids, int n,
                      sched_ref **out, size_t *count, dev_status *st);
void sched_refs_release(sched_ref *refs, size_t count);

/* Calls fn(arg, NULL, code) once every op submitted to the engine so far,
 * by any session, has run on every device and released what it used, so
 * the memory of released tensors is free again. Queues a tiny op on every
 * device behind all others (devices run their ops in order). fn runs on an
 * executor thread and must not block; code is OK, or CANCELLED when the
 * scheduler is destroyed first, or the error of the fence op itself.
 * Errors: RESOURCE_EXHAUSTED (host memory; fn is never called). */
pd_code sched_fence(sched *s, dev_ready_fn fn, void *arg, dev_status *st);

/* --- Operators: listing and killing sessions ------------------------------ */

typedef struct sched_session_view {
  uint64_t seq; /* the session's number (logs, admin) */
  char client[SCHED_NAME_MAX + 1];
  char job[SCHED_NAME_MAX + 1];
  uint64_t bytes; /* accounted as for the quota */
  uint64_t handles;
  uint64_t memory_quota; /* 0: none */
  uint32_t lease_s;
  double age_s;  /* since it was created */
  double idle_s; /* since the last call that renewed it */
  uint64_t queued_ops;
  char tenant[SCHED_NAME_MAX + 1];
  char identity[SCHED_IDENTITY_MAX + 1];
  bool job_claimed; /* as sched_session_origin.job_claimed */
  /* Placement (issue #17): the allowed set, and the bytes the session
   * holds on each engine device (index = engine device; a handle's
   * components there; one that shares its input's buffer, in proportion
   * to what it is charged). Read without the session's lock. */
  dev_devset devices;
  uint64_t device_bytes[PD_MAX_DEVICES];
} sched_session_view;

/* Snapshot of the open sessions (those of job `job` only, when not NULL or
 * empty: proven and claimed alike, see job_claimed), oldest first, into a
 * new array (free() it). Returns the number, or -1 when out of host
 * memory. */
int sched_list_sessions(sched *s, const char *job, sched_session_view **out);

/* Which sessions sched_kill ends: exactly one of the three. */
typedef struct sched_kill_target {
  const void *token; /* a session token, token_len bytes */
  size_t token_len;
  const char *job; /* every session of this job id (may be none), except
                      those whose job id is only claimed (job_claimed) */
  uint64_t seq;    /* the session numbered seq */
} sched_kill_target;

typedef struct sched_kill_result {
  int sessions;
  uint64_t handles;
  uint64_t bytes;
} sched_kill_result;

/* Ends sessions as CloseSession does (handles released, queued ops dropped
 * with CANCELLED), on an operator's order. Killing a job with no session is
 * OK with zero sessions. Errors: INVALID_ARGUMENT (no target or more than
 * one, an empty job id), UNAUTHENTICATED / NOT_FOUND (token, seq). Follow
 * with sched_fence to learn when the memory is free. */
pd_code sched_kill(sched *s, const sched_kill_target *target,
                   sched_kill_result *out, dev_status *st);

/* sched_kill on the daemon's own order (a mesh rank lost): queued ops fail
 * with `code` (not OK) and `why`, observers hear SCHED_END_FAILED with
 * message `why`, later calls with a killed token get `code` and "session
 * not found: it was ended: <why>" (the last SCHED_ENDED_KEPT, sched_int.h,
 * are remembered). Errors as sched_kill; INVALID_ARGUMENT for code OK or no
 * why. Thread-safe. */
pd_code sched_kill_because(sched *s, const sched_kill_target *target,
                           pd_code code, const char *why,
                           sched_kill_result *out, dev_status *st);

/* --- Counters ---------------------------------------------------------------- */

#define SCHED_NUM_CODES 17 /* pd_code values 0..16 */
#define SCHED_LATENCY_BUCKETS 18

/* Upper bounds (seconds) of the op latency histogram's buckets, ascending;
 * a last, implicit bucket is +Inf. */
extern const double sched_latency_bounds[SCHED_LATENCY_BUCKETS];

typedef struct sched_stats {
  size_t struct_size;
  int sessions;     /* open now */
  uint64_t handles; /* live handles, all sessions */
  uint64_t bytes;   /* accounted bytes, all sessions */
  uint64_t sessions_created;
  uint64_t sessions_closed;  /* by their clients */
  uint64_t sessions_expired; /* leases that ran out */
  uint64_t sessions_killed;  /* by sched_kill */
  uint64_t ops_queued;       /* now: in session queues */
  uint64_t ops_in_flight;    /* now: submitted, not yet computed */
  uint64_t ops_submitted;    /* ever */
  uint64_t ops_completed;    /* ever (any outcome) */
  uint64_t ops_dropped;      /* ever: dropped from queues (CANCELLED) */
  /* Latency of ops from sched_execute to computed: cumulative counts per
   * bucket of sched_latency_bounds, plus +Inf (= count). */
  uint64_t latency_buckets[SCHED_LATENCY_BUCKETS + 1];
  double latency_sum_s;
  uint64_t ops_expired; /* ever: dropped at their deadline (issue #15) */
} sched_stats;

void sched_get_stats(sched *s, sched_stats *out);

/* Per op (index 0..dev_op_count()-1 as dev_op_at): how many ran to each
 * outcome (by pd_code; dropped ops count as CANCELLED) and the seconds from
 * submission to the engine until computed, summed. */
void sched_op_stats(sched *s, int op_index, uint64_t by_code[SCHED_NUM_CODES],
                    double *run_seconds);

/* --- Progress (for a watchdog) ------------------------------------------- */

/* The caller's memory between sched_check_progress calls; zero it first. */
typedef struct sched_progress {
  uint64_t completed;
  bool outstanding;
  double since; /* when the current wait for progress began */
} sched_progress;

/* Says whether the scheduler is stalled at time `now` (seconds, any clock
 * the caller uses consistently): ops were queued with none on the devices,
 * and none was submitted or completed (nor a checkpoint load moved) for
 * longer than `stall_s`. Idle is not stalled, and neither is work on the
 * devices: whether they progress is dev_engine_watch's to say (a long
 * kernel is not a stall). Call it periodically with the same `p`. */
bool sched_check_progress(sched *s, sched_progress *p, double now,
                          double stall_s);

/* Gradient tapes (sched_tape_*) and graph functions in sessions
 * (sched_register_function, ...): part of this interface, in sched_tape.h
 * and sched_function.h. */
#include "sched_tape.h"
#include "sched_function.h"

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_SCHEDULER_H */
