/* The scheduler's private header: its data structures, its locks and the
 * functions its files share (SQLite's btreeInt.h beside btree.h). Nothing
 * outside scheduler/ includes it; scheduler.h is the interface.
 *
 * Locks, in the order they nest (a thread holding one may take only those
 * below it; none is held across a call into another layer except the engine,
 * and none while an observer, a waiter's callback or a fence's runs):
 *
 *   1. sched.mu       the session table: sessions, num_sessions, next_seq,
 *                     stopping (and cv, the lease thread's sleep).
 *   2. session.mu     one session's handles, bytes, tapes, closed and
 *                     attached[]; held through a whole sched_execute /
 *                     sched_tape_gradient, so a session's calls are serial.
 *   3. sched.qmu      every session's op queue (qhead..dwait below), the
 *                     policy's ready set, fences, paused, qstop (qcv: work
 *                     arrived; dcv: ops were handed over or dropped).
 *   3b. sched.io_mu   the load workers' FIFO and counts (workers.c); may
 *                     be taken under session.mu, never with qmu, and
 *                     nothing is taken or called under it.
 *   4. sched.done_mu  only to wake sched_destroy when n_completed moves
 *                     (done_cv); never held with another.
 *   5. the engine's own locks (dev_*), taken inside dev_* calls.
 *
 * Nestings that occur: mu -> session.mu only by trylock (sched_get_stats:
 * a busy session's last counts are used, nothing waits for a session under
 * mu), session.mu ->
 * qmu (sched_execute, the tape executor), mu -> qmu (the lease thread's
 * deadline sweep, lease.c), qmu -> engine (dev_tensor_is_ready, and
 * dev_op_abandon of cancelled and expired ops, so their outputs carry the
 * error before an op behind them can be dispatched). A session's `refs`, `expires_ms`, the limits and the
 * counters are atomics and need no lock. The observers table is written
 * before serving only.
 *
 * Files, lowest first (each calls only files listed before it; the call
 * graph is acyclic):
 *   htab.c, policy_fair.c, stats.c, observers.c, workers.c, tenants.c,
 *   placement.c   no
 *                 scheduler calls (workers.c runs work through function
 *                 pointers)
 *   handles.c     handle table use, room checks, release of a session's state
 *   waits.c       handed-over checks, queue waiters, Sync
 *   queue.c       appending, unqueueing and dropping ops; cancel
 *   sessions.c    tokens, create/open/close, ending a session, refs
 *   uploads.c, execute.c, tapes.c, lease.c, dispatch.c, operators.c,
 *   loads.c, saves.c (checkpoints: they queue work on workers.c)
 *   sched.c       create, destroy, reconfigure, pause
 */
#ifndef PARADEV_SCHED_INT_H
#define PARADEV_SCHED_INT_H


/* How many sessions sched_kill_because remembers (their tokens). */
#define SCHED_ENDED_KEPT 1024
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "check.h"
#include "sched_policy.h"
#include "scheduler.h"

/* --- Handle table (htab.c) ------------------------------------------------
 * Open addressing on the id (ids are client-chosen, so mixed first), linear
 * probing, tombstones, grows at 1/2 load. Used under its session's mu. */

/* The charge of one component's buffer on one engine device (issue #17:
 * the charge follows the buffer), shared by the session's handles whose
 * components share that buffer (output 0 of Identity / Reshape, every
 * output of ParallelPack / ParallelUnpack: dev_op_output_shares). Counted
 * in the session (total, tenant, dev_bytes) once, when `charged` is set,
 * and refunded when the last holder lets go (refs 0). Under session.mu. */
typedef struct sched_charge {
  int refs;     /* handles and pending outputs pointing at it */
  int dev;      /* engine device */
  bool charged; /* counted in the session's bytes */
  uint64_t bytes;
} sched_charge;

typedef struct sched_slot {
  uint64_t id;   /* 0: empty */
  dev_tensor *t; /* NULL with id != 0: tombstone */
  /* NULL (every handle that shares nothing: no allocation): the handle
   * alone holds its buffers, charged `bytes` (the tensor's). Else one
   * record per component of t (sched_charge), `bytes` 0. */
  uint64_t bytes;
  sched_charge **ch;
} sched_slot;

typedef struct sched_htab {
  sched_slot *slots;
  size_t cap; /* power of two */
  size_t live;
  size_t used; /* live + tombstones */
} sched_htab;

sched_slot *sched_htab_find(sched_htab *h, uint64_t id);
bool sched_htab_grow(sched_htab *h);
/* Grows until `extra` inserts cannot fail. False on ENOMEM. */
bool sched_htab_reserve(sched_htab *h, size_t extra);
/* Inserts a new id (the caller checked it is absent). False on ENOMEM. */
bool sched_htab_insert(sched_htab *h, uint64_t id, dev_tensor *t,
                       uint64_t bytes, sched_charge **ch);
void sched_htab_remove(sched_htab *h, sched_slot *sl);

/* --- Queue entries and waiters ------------------------------------------- */

/* One prepared op waiting in its session's queue. Once submitted, the same
 * block rides along as the context of the op's completion callback. */
typedef struct sched_qop {
  dev_op *op;
  uint64_t tag;
  uint64_t seq; /* position in its session's queue order (1, 2, ...) */
  struct sched_qop *next;
  sched *owner;
  int op_index;      /* into sched->op_stats */
  uint64_t t_enq_ns; /* sched_execute */
  uint64_t t_sub_ns; /* submission to the engine */
  /* CLOCK_MONOTONIC ns by which it must be submitted (0: none), and where
   * that came from (SCHED_DL_*, for the message). */
  uint64_t deadline_ns;
  int dl_src;
  uint64_t est_ns; /* estimated device ns (sched_estimate_ns) */
  /* Its devices (bit d: engine device d; dev_op_devset), set when it is
   * queued: what its estimate is charged to on submission (issue #17). */
  uint64_t devs;
  uint64_t model_ns; /* dev_op_estimate's part of it (calibration) */
  /* Device ns the executors measured, summed over the devices (they add to
   * it through dev_op_set_time_sink before they publish the op). */
  uint64_t dev_ns;
  sched_account *acct; /* its session's, from submission to completion */
} sched_qop;

enum { SCHED_DL_CALL = 1, SCHED_DL_OP = 2, SCHED_DL_SESSION = 3 };

_Static_assert(PD_MAX_DEVICES <= 64, "sched_qop.devs is a 64-bit mask");

/* A device set as a mask (bit d: engine device d). */
static inline uint64_t sched_devmask(const dev_devset *set) {
  uint64_t m = 0;
  for (int i = 0; i < set->n; i++) m |= (uint64_t)1 << set->dev[i];
  return m;
}

/* A sched_tensor_notify registration waiting for its session's queue. */
typedef struct sched_dwait {
  uint64_t target; /* every op with seq <= target must be submitted/dropped */
  dev_tensor *t;
  dev_ready_fn fn;
  void *arg;
  struct sched_dwait *next;
} sched_dwait;

/* A sched_fence request for the dispatcher. */
typedef struct sched_fence_req {
  dev_ready_fn fn;
  void *arg;
  struct sched_fence_req *next;
} sched_fence_req;

/* --- Checkpoint I/O: the worker pool and records (workers.c) --------------- */

/* One unit of work for the load workers: a piece of a load, or a save.
 * Embedded in its owner; `run` frees what it must (never touched after). */
typedef struct sched_work {
  void (*run)(struct sched_work *w); /* on a worker, or on the thread that
                                        ends its session (then cancelled) */
  sched_session *ss;                 /* whose, for cancellation (borrowed) */
  struct sched_work *next;           /* in the pool's FIFO */
} sched_work;

/* A load or a save of a session, on the session's list (newest first, under
 * session.mu) from its begin until the session is freed, until its begin
 * fails (sched_io_remove), or until trimmed once finished (SCHED_LOADS_KEPT
 * finished loads stay, for late polls). References: the list's, the running
 * job's, and a pending load's holder (load_begin.c). */
typedef struct sched_io {
  atomic_int refs;
  atomic_bool cancelled; /* the session ended: stop at the next chunk */
  atomic_bool finished;
  bool is_load;
  uint64_t id; /* a load's id (sched_load_result.load_id); 0 for a save */
  void (*free)(struct sched_io *io);
  struct sched_io *next;
} sched_io;

#define SCHED_LOADS_KEPT 64

/* Test hook (tests/unit/test_sched_load.c): called by a load worker before
 * each chunk it reads, with the tensor's name in the checkpoint, the
 * component (-1: all) and the host offset; may block (a gate the test opens)
 * and may return an error, which then stands for that chunk's read error. */
typedef pd_code (*sched_load_hook_fn)(void *arg, const char *name,
                                      int component, uint64_t offset,
                                      dev_status *st);

/* --- Counters (stats.c) ---------------------------------------------------- */

typedef struct sched_op_counter {
  _Atomic uint64_t by_code[SCHED_NUM_CODES];
  _Atomic uint64_t run_ns;
  /* Timed completions: dev_op_estimate's ns and the measured device ns (per
   * device), whose ratio calibrates the estimates of this op. */
  _Atomic uint64_t model_ns, device_ns;
} sched_op_counter;

/* Test hooks (tests/unit/test_sched_fair.c), set before any op is queued:
 * `cost` replaces an op's estimate and its measured device time (so charges
 * are exact and the dispatch order does not depend on timing); `submitted`
 * is called on the dispatcher thread, no lock held, just before each op
 * goes to the engine. */
typedef struct sched_test_hooks {
  uint64_t (*cost)(void *arg, const dev_op *op);
  void (*submitted)(void *arg, sched_session *ss, const dev_op *op,
                    uint64_t est_ns);
  void *arg;
} sched_test_hooks;
void sched_set_test_hooks(sched *s, const sched_test_hooks *h);

typedef struct sched_op_name {
  const char *name;
  int index;
} sched_op_name;

/* --- Tenants' accounts (tenants.c) ---------------------------------------- */

typedef struct sched_tenant {
  struct sched_tenant *next; /* sched.tenants, under sched.mu */
  int sessions;              /* in the table now, under sched.mu */
  int max_sessions;          /* 0: none; under sched.mu */
  _Atomic uint64_t bytes;    /* held by all its sessions */
  _Atomic uint64_t quota;    /* bytes; 0: none */
  const stg_roots *roots;    /* NULL: the scheduler's; under sched.mu */
  char name[SCHED_NAME_MAX + 1];
} sched_tenant;

/* Counts new session `ss` in the account of its tenant (ss->tenant; made
 * at first use) and sets ss->tn and ss->roots; RESOURCE_EXHAUSTED naming
 * the tenant when it holds max_sessions (> 0) already (sched.mu held). */
pd_code sched_tenant_join_locked(struct sched *s, struct sched_session *ss,
                                 dev_status *st);
/* A session of `tn` ended (sched.mu held; accepts NULL). Called only by
 * sched_end_session, which every end of a session passes through. */
void sched_tenant_leave_locked(sched_tenant *tn);
/* RESOURCE_EXHAUSTED naming the tenant when `extra_bytes` more would go
 * over its quota (any lock; reads atomics). */
pd_code sched_tenant_room(const sched_tenant *tn, uint64_t extra_bytes,
                          dev_status *st);
/* A checkpoint path refused (PERMISSION_DENIED in `c`) for session `ss`
 * whose roots are its tenant's own: appends to st->msg that the tenant's
 * storage_roots is the rule, so the caller sees why a path beneath a
 * [storage] root is refused. Returns `c`. Any thread (reads ss->tn, set
 * once at creation). */
pd_code sched_tenant_roots_note(const struct sched *s,
                                const struct sched_session *ss, pd_code c,
                                dev_status *st);
/* Adds and subtracts bytes held by one of its sessions (accepts NULL). */
void sched_tenant_charge(sched_tenant *tn, uint64_t add, uint64_t sub);
/* Frees every account (sched_destroy). */
void sched_tenants_free(struct sched *s);

/* --- Placement (placement.c, issue #17) ---------------------------------- */

/* PD_OK when every device of `set` is in `allowed`; else PERMISSION_DENIED
 * "devices [2, 3] are outside <allowed_what> [0, 1]" naming those outside.
 * Any thread. */
pd_code sched_devset_within(const dev_devset *set, const dev_devset *allowed,
                            const char *allowed_what, dev_status *st);
/* Copies a caller's set into *out, checked against the engine's mesh
 * (INVALID_ARGUMENT, dev_devset_make's text: empty, an index outside the
 * mesh, one given twice). */
pd_code sched_devset_check(const struct sched *s, const dev_devset *set,
                           dev_devset *out, dev_status *st);
/* The allowed set of a session asking `p`: p->devices (checked, within
 * p->bound: PERMISSION_DENIED "... outside the job's allocation [..]"),
 * else all of p->bound, else the whole mesh. */
pd_code sched_session_allowed(const struct sched *s,
                              const sched_session_params *p, dev_devset *out,
                              dev_status *st);
/* A tensor or op placed on `set` is within the session's allowed set
 * (PERMISSION_DENIED "devices [..] are outside the session's allowed
 * devices [..]"). Any thread (the set is fixed at creation). */
pd_code sched_placement_check(const struct sched_session *ss,
                              const dev_devset *set, dev_status *st);
/* Where a tensor asked on `want` goes: the session's default set for NULL,
 * else `want` checked (sched_devset_check) and within the allowed set
 * (sched_placement_check). */
pd_code sched_place(const struct sched_session *ss, const dev_devset *want,
                    dev_devset *out, dev_status *st);
/* A per-component load of `name` from file ix (`file`, for the message)
 * onto `set`: INVALID_ARGUMENT "'pc' was saved with 4 components in
 * f.safetensors; the device set [1, 2] has 2 ..." when the file's count
 * (its metadata paradev.components.<name>, else the entries "<name>:<k>"
 * present) is not the set's size; PD_OK when equal or when it holds none
 * (the load then says which entry is missing). */
pd_code sched_components_check(const stg_index *ix, const char *file,
                               const char *name, const dev_devset *set,
                               dev_status *st);

/* --- Sessions and the scheduler ---------------------------------------- */

/* A gradient tape of a session, under its client-chosen id. */
typedef struct sched_tape_ent {
  uint64_t id;
  dev_tape *tape;
} sched_tape_ent;

struct sched_session {
  atomic_int refs;
  sched *owner;
  uint8_t token[SCHED_TOKEN_BYTES];
  uint64_t seq;
  char client[SCHED_NAME_MAX + 1];
  char job[SCHED_NAME_MAX + 1];
  char tenant[SCHED_NAME_MAX + 1];
  sched_tenant *tn; /* its tenant's account; NULL: no tenant */
  bool in_tenant;   /* counted in tn->sessions (under sched.mu): cleared by
                     sched_end_session, the one place every end passes */
  const stg_roots *roots; /* its loads' and saves' roots; NULL: none */
  char identity[SCHED_IDENTITY_MAX + 1];
  bool job_claimed; /* the job id is a label, not proven: kills skip it */
  int priority;     /* band, SCHED_PRIORITY_MIN..MAX */
  uint32_t weight;  /* >= 1 */
  uint32_t lease_s;
  uint32_t op_timeout_ms; /* default deadline of its ops; 0: none */
  uint64_t quota;
  /* The allowed device set (issue #17): where it may place tensors, and
   * its default placement; fixed at creation. */
  dev_devset devices;
  int64_t created_ms;         /* monotonic */
  _Atomic int64_t expires_ms; /* monotonic */
  /* The handles and bytes last read under mu (sched_session_counts): what
   * stats and listings report while a call holds mu (an instantiation may
   * hold it long), so they never wait for a session's lock. */
  _Atomic uint64_t seen_handles, seen_bytes;

  pthread_mutex_t mu; /* lock 2: guards closed .. attached */
  bool closed;        /* ended: handles released, nothing attaches */
  /* Set (under mu) before the session ends by sched_kill_because: the
   * code and reason calls in flight then get (PD_OK: other ends). */
  pd_code end_code;
  char end_msg[512];
  sched_htab handles;
  uint64_t bytes;
  /* The same bytes per engine device (written under mu, read by listings
   * without it: atomics), so sessions on disjoint devices share none. */
  _Atomic uint64_t dev_bytes[PD_MAX_DEVICES];
  sched_tape_ent *tapes; /* the session's gradient tapes */
  int num_tapes, cap_tapes;
  /* Its graph functions (functions.c): made at the first registration,
   * destroyed when the session ends (sched_end_session); NULL: none. */
  dev_fn_lib *fns;
  /* Observers' state (sched_session_attach); cleared when the session ends. */
  void *attached[SCHED_MAX_OBSERVERS];
  sched_session *next; /* in the scheduler's table (under sched->mu) */
  sched_io *io;        /* loads and saves (workers.c), newest first */
  uint64_t last_load_id;

  /* The op queue, under sched->qmu. */
  sched_qop *qhead, *qtail;
  int qlen;
  bool in_ready;         /* in the policy's ready set (holds a ref) */
  sched_policy_node pol; /* the policy's per-session state */
  uint64_t enqueued;     /* ops ever queued = seq of the last one */
  /* Ops taken off the queue and not yet handed over: the dispatcher's batch
   * (seq >= sub_lo, 0: none) and drops being abandoned. */
  uint64_t sub_lo;
  int dropping;
  sched_dwait *dwait; /* sched_tensor_notify registrations */
  uint64_t q_est_ns;  /* estimated device ns of the queued ops */
  /* The pending tensor (a load's) that the head op reads: while set the
   * session is held out of the ready set (dispatch.c); a borrowed pointer,
   * compared only while a hold's registration keeps the tensor alive. */
  dev_tensor *held_on;
  /* The lease thread's deadline sweep (lease.c), under qmu: how many
   * expired ops it dropped from the queue and the next session swept. */
  int xn;
  sched_session *xnext;
};

/* What the dispatcher's current turn took on each device (not yet counted
 * in dev_inflight_*: the dispatcher alone submits). */
typedef struct sched_turn_load {
  uint64_t ns[PD_MAX_DEVICES];
  int ops[PD_MAX_DEVICES];
} sched_turn_load;

/* The limits sched_reconfigure may change while sessions run. */
typedef struct sched_limits {
  _Atomic uint32_t default_lease_s, max_lease_s;
  atomic_int max_sessions, max_handles, max_ops, max_queued;
  _Atomic uint64_t default_quota, max_quota;
  _Atomic uint64_t dispatch_ahead_ns, max_queued_device_ns;
} sched_limits;

#define SCHED_LIM(s, f) atomic_load_explicit(&(s)->lim.f, memory_order_relaxed)

#define SCHED_REASONS_KEPT 4

struct sched {
  dev_engine *engine;
  sched_config cfg; /* incarnation, lease_check_ms, callbacks */
  sched_limits lim;
  pthread_mutex_t mu;      /* lock 1: the session table */
  sched_session *sessions; /* newest first */
  int num_sessions;
  sched_tenant *tenants; /* tenants' accounts (tenants.c) */
  uint64_t next_seq;
  /* Sessions sched_kill_because ended (a ring under mu, n_ended written
   * ever): a later call with such a token learns why (sched_find_locked).
   * Each names one of the last SCHED_REASONS_KEPT reasons (reason: its
   * number, n_reasons written ever). */
  struct {
    uint8_t token[SCHED_TOKEN_BYTES];
    uint64_t reason;
  } ended[SCHED_ENDED_KEPT];
  uint64_t n_ended;
  struct {
    pd_code code;
    char why[512];
  } reasons[SCHED_REASONS_KEPT];
  uint64_t n_reasons;
  bool stopping;
  pthread_cond_t cv;
  pthread_t lease_thread;

  /* Dispatcher (lock 3). */
  pthread_mutex_t qmu;
  pthread_cond_t qcv;       /* work arrived or stopping */
  pthread_cond_t dcv;       /* ops were dispatched or dropped */
  sched_policy_queue ready; /* sessions with queued ops */
  sched_fence_req *fences;
  bool qstop;
  bool paused;
  pthread_t dispatch_thread;
  atomic_uint_fast64_t next_tag;
  /* Submitted and not completed, per engine device (issue #17): the
   * estimated device ns and the ops each device holds (an op counts on
   * every device of its set): the dispatch-ahead bound is per device, so
   * sessions on disjoint devices never share it. Written by the
   * dispatcher (submission) and completions (atomics). ahead_wait: the
   * dispatcher sleeps on qcv until a completion brings a device under
   * half the bound. */
  _Atomic uint64_t dev_inflight_ns[PD_MAX_DEVICES];
  atomic_int dev_inflight_ops[PD_MAX_DEVICES];
  atomic_bool ahead_wait;
  /* The dispatcher's scratch (dispatch.c, its thread only). */
  sched_turn_load turn_load;
  sched_test_hooks hooks;

  /* Counters. */
  _Atomic uint64_t n_created, n_closed, n_expired, n_killed;
  _Atomic uint64_t n_queued, n_submitted, n_completed, n_dropped, n_expired_ops;
  /* The earliest deadline of a queued op (CLOCK_MONOTONIC ns; UINT64_MAX:
   * none), a lower bound: lowered by sched_execute, recomputed by the lease
   * thread's sweep, which runs when it passes. */
  _Atomic uint64_t dl_next_ns;
  /* Chunks the load workers wrote and tensors they ended: progress for
   * sched_check_progress while ops wait, held, for a load. */
  _Atomic uint64_t n_load_steps;
  _Atomic uint64_t lat_buckets[SCHED_LATENCY_BUCKETS + 1];
  _Atomic uint64_t lat_sum_ns;
  int num_ops;
  sched_op_name *op_names; /* sorted by name */
  sched_op_counter *op_stats;
  pthread_mutex_t done_mu;  /* lock 4: sched_destroy waits for callbacks */
  atomic_bool done_waiting; /* set by sched_destroy: completions wake it */
  /* Queue entries for reuse (queue.c sched_qop_new/free), under qop_mu, a
   * leaf lock (taken under any other, nothing under it). */
  pthread_mutex_t qop_mu;
  sched_qop *qop_free;
  int qop_nfree;
  pthread_cond_t done_cv;

  /* Observers of sessions' ends; set before serving, read-only after. */
  sched_observer observers[SCHED_MAX_OBSERVERS];
  int num_observers;

  /* Load workers (workers.c), lock 3b: io_mu guards the FIFO, io_live and
   * io_stop; nothing is called or locked under it. */
  pthread_mutex_t io_mu;
  pthread_cond_t io_cv;      /* work arrived, or io_stop */
  pthread_cond_t io_idle_cv; /* io_live dropped to 0 */
  sched_work *io_head, *io_tail;
  int io_live; /* loads and saves begun and not yet ended */
  bool io_stop;
  pthread_t *io_threads;
  int n_io_threads;
  /* Open workers (workers.c), also under io_mu: the opens and indexes of
   * loads begun with sched_load_begin_async, on their own FIFO and threads
   * so a stalled source never holds a load worker (or an RPC thread). */
  pthread_cond_t open_cv; /* open work arrived, or io_stop */
  sched_work *open_head, *open_tail;
  pthread_t *open_threads;
  int n_open_threads;
  size_t load_chunk;       /* bytes a worker reads at once */
  sched_load_hook_fn hook; /* tests only; set before any load */
  void *hook_arg;
};

static inline int64_t sched_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline uint64_t sched_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* True when q has a deadline and `*now` (read lazily: 0 until needed) is
 * past it. */
static inline bool sched_qop_expired(const sched_qop *q, uint64_t *now) {
  if (!q->deadline_ns) return false;
  if (!*now) *now = sched_now_ns();
  return *now >= q->deadline_ns;
}

static inline void sched_session_ref(sched_session *ss) {
  atomic_fetch_add(&ss->refs, 1);
}

/* --- stats.c --------------------------------------------------------------- */

/* Builds the op-name index and the per-op counters. False on ENOMEM. */
bool sched_stats_init(sched *s);
void sched_stats_free(sched *s);
/* Index of op `name` into op_stats, or -1 (unknown names never get queued). */
int sched_op_index(const sched *s, const char *name);
void sched_count_outcome(sched *s, int op_index, pd_code code);
/* Counts a submitted op's completion: latency, outcome, run time, and the
 * measured device ns against the estimate (`timed`: q->dev_ns holds every
 * device's time). Returns the measured device ns per device (q->est_ns when
 * not timed or under the cost hook). */
uint64_t sched_count_done(sched *s, const sched_qop *q, pd_code code,
                          bool timed);
/* The estimated device ns of a prepared op (per device, the slowest
 * component): dev_op_estimate, scaled by what this op's completions
 * measured so far (*model_ns: the model's own figure, for that
 * calibration; 0 under the hook); the test hook's cost when set. >= 1. */
uint64_t sched_estimate_ns(sched *s, const dev_op *op, int op_index,
                           uint64_t *model_ns);

/* --- observers.c ----------------------------------------------------------- */

/* Tells every observer that `ss` ended, with states[k] for observer k (no
 * lock held). */
void sched_notify_end(sched_session *ss, sched_end_reason why, const char *msg,
                      uint64_t handles, void *const *states);

/* --- workers.c -------------------------------------------------------------- */

/* Starts n load workers (io_mu and cvs are set up by the caller). False when
 * a thread cannot start (those started are stopped). */
bool sched_workers_start(sched *s, int n);
/* Waits until every load and save has ended, then stops the workers. */
void sched_workers_stop(sched *s);
/* A load or save begins / has ended (counted, so sched_workers_stop waits). */
void sched_io_begin(sched *s);
void sched_io_end(sched *s);
/* Queues work for the workers (no lock held). */
void sched_work_queue(sched *s, sched_work *w);
/* Queues w on the open workers (never run at a session's end: it must see
 * its record's `cancelled` itself). */
void sched_open_queue(sched *s, sched_work *w);
#define SCHED_OPEN_WORKERS 4

/* Loads (loads.c), for load_begin.c. sched_load_new checks req and puts a
 * new load on ss's list, counted by sched_io_begin; *out has two
 * references, the list's and the caller's; req (borrowed) and deadline_s
 * (stg_now_s's clock, 0: none) serve sched_load_run, which opens, indexes,
 * publishes and starts the reads (*out: the result) or, failing, takes the
 * load off the list and ends its sched_io_begin. sched_load_abandon cancels
 * a load whose handles are not yet published (its fetches abort); the
 * caller holds a reference on its session. */
pd_code sched_load_new(sched_session *ss, const sched_load_request *req,
                       double deadline_s, sched_io **out, dev_status *st);
pd_code sched_load_run(sched_io *io, sched_load_result **out, dev_status *st);
void sched_load_abandon(sched_io *io);
/* The end of a session (no lock held, the session closed, so its list is
 * frozen): marks its loads and saves cancelled and runs the work of it still
 * queued on this thread, where it sees the cancellation and ends at once. */
void sched_io_cancel_session(sched_session *ss);
void sched_io_ref(sched_io *io);
void sched_io_unref(sched_io *io);
/* Puts io on the session's list and drops finished records beyond what is
 * kept (ss->mu held). */
void sched_io_add_locked(sched_session *ss, sched_io *io);
/* Takes io off the session's list (session.mu taken here), dropping the
 * list's reference; nothing when it is not there. */
void sched_io_remove(sched_session *ss, sched_io *io);
/* Drops the list's references (sched_session_free). */
void sched_io_release_all(sched_session *ss);
/* Test hook and the chunk size of reads (0: SCHED_LOAD_CHUNK). Call before
 * any load. */
void sched_set_load_hook(sched *s, sched_load_hook_fn fn, void *arg,
                         size_t chunk_bytes);

#define SCHED_LOAD_CHUNK ((size_t)4 << 20)

/* --- handles.c ------------------------------------------------------------- */

pd_code sched_closed_error(const struct sched_session *ss, dev_status *st);

/* functions.c: prepares op `name` of the session -- a call of one of its
 * functions (dev_fn_prepare_call_on) or else a registered op
 * (dev_op_prepare_on) -- placed on `devices` (NULL: an op without inputs
 * on the session's default set, one with inputs on theirs). A set, a
 * CopyToDevices target or the prepared op's set (dev_op_devset) outside
 * the allowed set is PERMISSION_DENIED naming the devices, the first two
 * before the engine sees the op. Under ss->mu. */
pd_code sched_prepare_named_locked(sched_session *ss, const char *name,
                                   const dev_devset *devices,
                                   dev_tensor *const *inputs, int num_inputs,
                                   const dev_attr *attrs, int num_attrs,
                                   dev_op **out, dev_status *st);
/* functions.c: takes the session's library away (under ss->mu); the caller
 * destroys it after unlocking (dev_fn_lib_destroy). */
dev_fn_lib *sched_take_functions_locked(sched_session *ss);
pd_code sched_not_found(uint64_t id, dev_status *st);
/* A session's live handles and bytes without waiting: read under its mu
 * when free (and remembered in seen_*), else the counts last read. Any
 * lock (or none) may be held. */
void sched_session_counts(sched_session *ss, uint64_t *handles,
                          uint64_t *bytes);

/* Checks that `extra_handles` more handles of `extra_bytes` fit (ss->mu). */
pd_code sched_check_room_locked(sched_session *ss, int extra_handles,
                                uint64_t extra_bytes, dev_status *st);
/* Releases every handle and tape and marks the session closed (ss->mu).
 * Returns the handles released. */
uint64_t sched_release_all_locked(sched_session *ss);
/* Counts `add` bytes more and `sub` fewer held by the session's handles, in
 * the session and its tenant's account (ss->mu). */
void sched_charge_locked(sched_session *ss, uint64_t add, uint64_t sub);
/* Counts (add) or uncounts a handle of tensor `t` charged `bytes` (its
 * whole size): in the session's total and its tenant's
 * (sched_charge_locked), and on each device of the tensor's set
 * (session.dev_bytes: its component's bytes there). ss->mu. */
void sched_charge_tensor_locked(sched_session *ss, const dev_tensor *t,
                                uint64_t bytes, bool add);
/* Shared charges (sched_charge, issue #17). sched_charges_new: one record
 * per component of t (refs 1, `charged` as given: true when it takes over
 * a live handle's inline charge, which then goes to 0), NULL on ENOMEM;
 * sched_charge_new: one. sched_charges_charge_locked counts the records
 * not yet counted; sched_charges_put_locked drops one reference on each of
 * t's records, refunds and frees those at 0, and frees the array (accepts
 * NULL). ss->mu. */
sched_charge **sched_charges_new(const dev_tensor *t, bool charged);
sched_charge *sched_charge_new(const dev_tensor *t, int comp, bool charged);
void sched_charges_charge_locked(sched_session *ss, const dev_tensor *t,
                                 sched_charge **ch);
void sched_charges_put_locked(sched_session *ss, const dev_tensor *t,
                              sched_charge **ch);
/* Makes a live handle's charge shared records (sched_charges_new, the
 * totals unchanged), so an aliasing output can join them. False on ENOMEM.
 * ss->mu. */
bool sched_slot_share_locked(sched_slot *sl);

/* --- waits.c --------------------------------------------------------------- */

/* True when every op of `ss` with seq <= target was submitted or dropped
 * (qmu held). */
bool sched_handed_over_locked(const sched_session *ss, uint64_t target);
/* Unlinks the registrations that may go on to the engine (qmu held). */
sched_dwait *sched_take_waiters_locked(sched_session *ss);
/* Hands registrations on to the engine (no lock held). */
void sched_fire_waiters(sched_dwait *w);
/* Waits until every op the session queued so far was handed over. */
void sched_wait_dispatched(sched_session *ss);
/* Submits fence requests behind everything submitted so far and frees them
 * (the dispatcher, no lock held). */
void sched_run_fences(sched *s, sched_fence_req *f);
/* Answers fence requests with CANCELLED and frees them (sched_destroy). */
void sched_cancel_fences(sched_fence_req *f);

/* --- queue.c --------------------------------------------------------------- */

/* Puts the session in the policy's ready set, with a reference, when it has
 * queued ops, is not there yet, is not held and the dispatcher runs (qmu
 * held). */
void sched_make_ready_locked(sched_session *ss);
/* Appends first..last (n entries, seq set) to the session's queue and makes
 * the session ready (qmu held). */
void sched_queue_append_locked(sched_session *ss, sched_qop *first,
                               sched_qop *last, int n);
/* Queue entries from the scheduler's free list (no malloc on the hot path;
 * at most SCHED_QOP_POOL are kept): a zeroed entry, or NULL when out of
 * host memory; and its return. Any lock state (qop_mu is a leaf). */
#define SCHED_QOP_POOL 4096
sched_qop *sched_qop_new(sched *s);
void sched_qop_free(sched *s, sched_qop *q);
/* Frees the free list (sched_destroy). */
void sched_qop_pool_free(sched *s);
/* Drops every queued op of a session being ended (no lock held). */
void sched_drop_queue(sched_session *ss, pd_code code, const char *why);
/* Deadlines. Unlinks the queued ops of ss whose deadline passed by `now`
 * into a list (returned; *n of them), counted as `dropping` until
 * sched_finish_expire; *next_dl gets the earliest deadline of the ops left
 * (lowered only). A session held on a loading tensor is let go when ops
 * left its queue, so the dispatcher looks at the new head (qmu held). */
sched_qop *sched_unqueue_expired_locked(sched_session *ss, uint64_t now, int *n,
                                        uint64_t *next_dl);
/* Abandons expired ops (a list from sched_unqueue_expired_locked or the
 * dispatcher's, in queue order) with DEADLINE_EXCEEDED, each with a message
 * naming it, its deadline and its time queued (any lock state: the engine
 * is called, nothing of the scheduler). The lease thread's sweep does it
 * under qmu, before an op behind them in the queue can be dispatched and
 * read their outputs. */
void sched_abandon_expired_list(sched_qop *list);
/* Abandons `list` (may be NULL: abandoned already), then ends the n ops'
 * `dropping` and lets waiters on them go (no lock held). */
void sched_finish_expire(sched_session *ss, sched_qop *list, int n);
/* Notes that an op with `deadline_ns` was queued: lowers dl_next_ns and
 * returns true when the lease thread must be woken for it (qmu held). */
bool sched_deadline_note_locked(sched *s, uint64_t deadline_ns);
/* Wakes the lease thread to look at dl_next_ns again (no lock held). */
void sched_deadline_kick(sched *s);

/* --- sessions.c ------------------------------------------------------------ */

/* Finds the session of a token (sched->mu held); errors as
 * sched_session_open. */
pd_code sched_find_locked(sched *s, const void *token, size_t len,
                          sched_session **out, dev_status *st);
/* Unlinks `ss` from the table (sched->mu held). Its tenant's count drops
 * later, in sched_end_session. */
void sched_unlink_locked(sched *s, sched_session *ss);
/* Ends a session already unlinked from the table (no lock held): releases
 * its handles, drops its queue, waits for what the dispatcher took of it and
 * gives its tenant's session slot back (takes sched.mu briefly) and tells
 * the observers. The caller then drops the table's reference.
 * Its queued ops fail with `code` and `msg` (which observers see as
 * sched_end_info.message). *bytes (may be NULL) gets its accounted bytes.
 * Returns the handles freed. */
uint64_t sched_end_session(sched_session *ss, sched_end_reason why,
                           pd_code code, const char *msg, uint64_t *bytes);

/* --- lease.c, dispatch.c: the threads ------------------------------------ */

void *sched_lease_main(void *arg);
void *sched_dispatch_main(void *arg);

#endif /* PARADEV_SCHED_INT_H */
