/* Sessions, handle tables, leases and op queueing (see scheduler.h). */
#include "scheduler.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* Handle table: open addressing on the id (ids are client-chosen, so mix
 * them first), linear probing, tombstones, grows at 1/2 load. */

typedef struct sched_slot {
  uint64_t id; /* 0: empty */
  dev_tensor *t; /* NULL with id != 0: tombstone */
  uint64_t bytes;
} sched_slot;

typedef struct sched_htab {
  sched_slot *slots;
  size_t cap;  /* power of two */
  size_t live;
  size_t used; /* live + tombstones */
} sched_htab;

static uint64_t sched_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

static sched_slot *sched_htab_find(sched_htab *h, uint64_t id) {
  if (h->cap == 0) return NULL;
  size_t mask = h->cap - 1;
  for (size_t i = sched_mix(id) & mask;; i = (i + 1) & mask) {
    sched_slot *sl = &h->slots[i];
    if (sl->id == 0) return NULL;
    if (sl->id == id && sl->t != NULL) return sl;
  }
}

static bool sched_htab_grow(sched_htab *h) {
  size_t ncap = h->cap ? h->cap * 2 : 64;
  while (h->live * 2 >= ncap) ncap *= 2;
  sched_slot *ns = calloc(ncap, sizeof(*ns));
  if (!ns) return false;
  for (size_t i = 0; i < h->cap; i++) {
    sched_slot *sl = &h->slots[i];
    if (sl->id == 0 || sl->t == NULL) continue;
    size_t j = sched_mix(sl->id) & (ncap - 1);
    while (ns[j].id != 0) j = (j + 1) & (ncap - 1);
    ns[j] = *sl;
  }
  free(h->slots);
  h->slots = ns;
  h->cap = ncap;
  h->used = h->live;
  return true;
}

/* Inserts a new id (caller checked it is absent). False on ENOMEM. */
static bool sched_htab_insert(sched_htab *h, uint64_t id, dev_tensor *t,
                              uint64_t bytes) {
  if ((h->used + 1) * 2 > h->cap && !sched_htab_grow(h)) return false;
  size_t mask = h->cap - 1;
  size_t i = sched_mix(id) & mask;
  while (h->slots[i].id != 0 && h->slots[i].t != NULL) i = (i + 1) & mask;
  if (h->slots[i].id == 0) h->used++;
  h->slots[i] = (sched_slot){id, t, bytes};
  h->live++;
  return true;
}

static void sched_htab_remove(sched_htab *h, sched_slot *sl) {
  sl->t = NULL; /* tombstone: id stays so probing continues */
  sl->bytes = 0;
  h->live--;
}

/* ------------------------------------------------------------------------ */

/* One prepared op waiting in its session's queue. Once submitted, the same
 * block rides along as the context of the op's completion callback. */
typedef struct sched_qop {
  dev_op *op;
  uint64_t tag;
  uint64_t seq;       /* position in its session's queue order (1, 2, ...) */
  struct sched_qop *next;
  sched *owner;
  int op_index;       /* into sched->op_stats */
  uint64_t t_enq_ns;  /* sched_execute */
  uint64_t t_sub_ns;  /* submission to the engine */
} sched_qop;

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

typedef struct sched_op_counter {
  _Atomic uint64_t by_code[SCHED_NUM_CODES];
  _Atomic uint64_t run_ns;
} sched_op_counter;

typedef struct sched_op_name {
  const char *name;
  int index;
} sched_op_name;

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
  uint32_t lease_s;
  uint64_t quota;
  int64_t created_ms;         /* monotonic */
  _Atomic int64_t expires_ms; /* monotonic */

  pthread_mutex_t mu; /* guards everything below */
  bool closed;
  sched_htab handles;
  uint64_t bytes;
  sched_tape_ent *tapes; /* the session's gradient tapes */
  int num_tapes, cap_tapes;
  sched_session *next; /* in the scheduler's list (under sched->mu) */

  /* The op queue, under sched->qmu. */
  sched_qop *qhead, *qtail;
  int qlen;
  bool in_ready;         /* in the dispatcher's ready list (holds a ref) */
  sched_session *rnext;  /* next in the ready list */
  uint64_t enqueued;     /* ops ever queued = seq of the last one */
  /* Ops taken off the queue and not yet handed over: the dispatcher's batch
   * (seq >= sub_lo, 0: none) and drops being abandoned. */
  uint64_t sub_lo;
  int dropping;
  sched_dwait *dwait;    /* sched_tensor_notify registrations */

  /* Observers' state (sched_session_attach), under mu; cleared when the
   * session ends (closed). */
  void *attached[SCHED_MAX_OBSERVERS];
};

/* The limits sched_reconfigure may change while sessions run. */
typedef struct sched_limits {
  _Atomic uint32_t default_lease_s, max_lease_s;
  atomic_int max_sessions, max_handles, max_ops, max_queued;
  _Atomic uint64_t default_quota, max_quota;
} sched_limits;

#define SCHED_LIM(s, f) atomic_load_explicit(&(s)->lim.f, memory_order_relaxed)

struct sched {
  dev_engine *engine;
  sched_config cfg; /* incarnation, lease_check_ms, callbacks */
  sched_limits lim;
  pthread_mutex_t mu; /* guards sessions, num_sessions, next_seq, stopping */
  sched_session *sessions; /* newest first */
  int num_sessions;
  uint64_t next_seq;
  bool stopping;
  pthread_cond_t cv;
  pthread_t lease_thread;

  /* Dispatcher: the ready list of sessions with queued ops. */
  pthread_mutex_t qmu;
  pthread_cond_t qcv;  /* work arrived or stopping */
  pthread_cond_t dcv;  /* ops were dispatched or dropped */
  sched_session *rhead, *rtail;
  sched_fence_req *fences;
  bool qstop;
  bool paused;
  pthread_t dispatch_thread;
  atomic_uint_fast64_t next_tag;

  /* Counters. */
  _Atomic uint64_t n_created, n_closed, n_expired, n_killed;
  _Atomic uint64_t n_queued, n_submitted, n_completed, n_dropped;
  _Atomic uint64_t lat_buckets[SCHED_LATENCY_BUCKETS + 1];
  _Atomic uint64_t lat_sum_ns;
  int num_ops;
  sched_op_name *op_names; /* sorted by name */
  sched_op_counter *op_stats;
  pthread_mutex_t done_mu; /* sched_destroy waits for in-flight callbacks */
  pthread_cond_t done_cv;

  /* Observers of sessions' ends; set before serving, read-only after. */
  sched_observer observers[SCHED_MAX_OBSERVERS];
  int num_observers;
};

struct sched_upload {
  sched_session *ss;
  uint64_t id;
  dev_tensor *t;
  dev_layout layout;
};

static int64_t sched_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Constant-time comparison: a token must not leak through timing. */
static bool sched_token_eq(const uint8_t *a, const uint8_t *b) {
  unsigned d = 0;
  for (int i = 0; i < SCHED_TOKEN_BYTES; i++) d |= (unsigned)(a[i] ^ b[i]);
  return d == 0;
}

static void sched_put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t sched_get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static uint64_t sched_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

const double sched_latency_bounds[SCHED_LATENCY_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};

static int sched_op_name_cmp(const void *a, const void *b) {
  return strcmp(((const sched_op_name *)a)->name,
                ((const sched_op_name *)b)->name);
}

/* Index of op `name` into op_stats, or -1 (unknown names never get queued). */
static int sched_op_index(const sched *s, const char *name) {
  sched_op_name key = {name, 0};
  const sched_op_name *e = bsearch(&key, s->op_names, (size_t)s->num_ops,
                                   sizeof(key), sched_op_name_cmp);
  return e ? e->index : -1;
}

static void sched_count_outcome(sched *s, int op_index, pd_code code) {
  if (op_index < 0) return;
  unsigned c = (unsigned)code < SCHED_NUM_CODES ? (unsigned)code : PD_UNKNOWN;
  atomic_fetch_add_explicit(&s->op_stats[op_index].by_code[c], 1,
                            memory_order_relaxed);
}

/* Unlinks the queued ops of `ss` with `tag` (every op when all) into a list
 * for the caller to abandon outside the lock (caller holds s->qmu). The ops
 * count as `dropping` until sched_dropped says they were abandoned. */
static sched_qop *sched_unqueue_locked(sched_session *ss, bool all,
                                       uint64_t tag, int *count) {
  sched_qop *dropped = NULL, **pp = &ss->qhead, *last = NULL;
  int n = 0;
  while (*pp) {
    sched_qop *q = *pp;
    if (all || q->tag == tag) {
      *pp = q->next;
      q->next = dropped;
      dropped = q;
      n++;
    } else {
      last = q;
      pp = &q->next;
    }
  }
  ss->qtail = last;
  ss->qlen -= n;
  ss->dropping += n;
  atomic_fetch_sub(&ss->owner->n_queued, (uint64_t)n);
  *count = n;
  return dropped;
}

/* Abandons dropped ops in queue order (the list is reversed). */
static void sched_abandon_list(sched_qop *q, const char *why) {
  sched_qop *rev = NULL;
  while (q) {
    sched_qop *next = q->next;
    q->next = rev;
    rev = q;
    q = next;
  }
  while (rev) {
    sched_qop *next = rev->next;
    dev_op_abandon(rev->op, PD_CANCELLED, why);
    sched_count_outcome(rev->owner, rev->op_index, PD_CANCELLED);
    atomic_fetch_add(&rev->owner->n_dropped, 1);
    free(rev);
    rev = next;
  }
}

/* True when every op of `ss` with seq <= target was submitted or dropped
 * (caller holds s->qmu). */
static bool sched_handed_over_locked(const sched_session *ss, uint64_t target) {
  if (ss->qhead && ss->qhead->seq <= target) return false;
  if (ss->sub_lo && ss->sub_lo <= target) return false;
  return ss->dropping == 0;
}

/* Unlinks the registrations whose ops were all handed over, or whose
 * tensor is computed already (its op dropped, say) (s->qmu held). */
static sched_dwait *sched_take_waiters_locked(sched_session *ss) {
  sched_dwait *ready = NULL;
  for (sched_dwait **pp = &ss->dwait; *pp;) {
    sched_dwait *w = *pp;
    if (sched_handed_over_locked(ss, w->target) || dev_tensor_is_ready(w->t)) {
      *pp = w->next;
      w->next = ready;
      ready = w;
    } else {
      pp = &w->next;
    }
  }
  return ready;
}

/* Hands registrations on to the engine (no lock held). */
static void sched_fire_waiters(sched_dwait *w) {
  while (w) {
    sched_dwait *next = w->next;
    dev_status st = DEV_STATUS_INIT;
    if (dev_tensor_notify(w->t, w->fn, w->arg, &st) != PD_OK)
      w->fn(w->arg, w->t, st.code);
    dev_tensor_release(w->t);
    free(w);
    w = next;
  }
}

/* Abandons dropped ops, then lets waiters on them go. */
static void sched_finish_drop(sched_session *ss, sched_qop *dropped, int n,
                              const char *why) {
  if (n == 0) return;
  sched *s = ss->owner;
  sched_abandon_list(dropped, why);
  pthread_mutex_lock(&s->qmu);
  ss->dropping -= n;
  sched_dwait *w = sched_take_waiters_locked(ss);
  pthread_cond_broadcast(&s->dcv);
  pthread_mutex_unlock(&s->qmu);
  sched_fire_waiters(w);
}

/* Drops every queued op of a session being closed. */
static void sched_drop_queue(sched_session *ss, const char *why) {
  sched *s = ss->owner;
  int n = 0;
  pthread_mutex_lock(&s->qmu);
  sched_qop *d = sched_unqueue_locked(ss, true, 0, &n);
  pthread_mutex_unlock(&s->qmu);
  sched_finish_drop(ss, d, n, why);
}

/* Completion of a submitted op (on the executor that finished it last). */
static void sched_op_done(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  sched_qop *q = arg;
  sched *s = q->owner;
  uint64_t now = sched_now_ns();
  double lat = (double)(now - q->t_enq_ns) * 1e-9;
  int b = 0;
  while (b < SCHED_LATENCY_BUCKETS && lat > sched_latency_bounds[b]) b++;
  atomic_fetch_add_explicit(&s->lat_buckets[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->lat_sum_ns, now - q->t_enq_ns,
                            memory_order_relaxed);
  sched_count_outcome(s, q->op_index, code);
  if (q->op_index >= 0)
    atomic_fetch_add_explicit(&s->op_stats[q->op_index].run_ns,
                              now - q->t_sub_ns, memory_order_relaxed);
  free(q);
  pthread_mutex_lock(&s->done_mu);
  atomic_fetch_add(&s->n_completed, 1);
  pthread_cond_broadcast(&s->done_cv);
  pthread_mutex_unlock(&s->done_mu);
}

/* Submits one op and arranges for its completion to be counted. */
static void sched_submit(sched *s, sched_qop *q) {
  dev_op *op = q->op;
  dev_tensor *out = dev_op_num_outputs(op) > 0 ? dev_op_output(op, 0) : NULL;
  q->t_sub_ns = sched_now_ns();
  atomic_fetch_add(&s->n_submitted, 1);
  if (out) dev_tensor_retain(out); /* the op belongs to the engine after this */
  dev_op_submit(s->engine, op);
  dev_status st = DEV_STATUS_INIT;
  if (!out)
    sched_op_done(q, NULL, PD_OK);
  else if (dev_tensor_notify(out, sched_op_done, q, &st) != PD_OK)
    sched_op_done(q, out, PD_OK); /* host memory: count it now, untimed */
  dev_tensor_release(out);
}

/* The op that sched_fence queues behind all others: an empty Fill, which
 * holds no memory while its callback runs. */
static void sched_submit_fence(sched *s, sched_fence_req *f) {
  dev_op *op = NULL;
  dev_status st = DEV_STATUS_INIT;
  const int64_t dims[1] = {0};
  const dev_attr attrs[3] = {dev_attr_shape("shape", 1, dims),
                             dev_attr_float("value", 0),
                             dev_attr_dtype("dtype", PD_FLOAT32)};
  if (dev_op_prepare(s->engine, "Fill", NULL, 0, attrs, 3, &op, &st) != PD_OK) {
    f->fn(f->arg, NULL, st.code);
    return;
  }
  dev_tensor *out = dev_op_output(op, 0);
  dev_tensor_retain(out);
  dev_op_submit(s->engine, op);
  if (dev_tensor_notify(out, f->fn, f->arg, &st) != PD_OK)
    f->fn(f->arg, NULL, st.code);
  dev_tensor_release(out);
}

/* The dispatcher. Ops reach the engine from this thread, not straight from
 * sched_execute's caller (an RPC thread), even when nothing else is queued:
 * dev_op_submit wakes every device's executor, and a woken executor tends to
 * preempt the thread that woke it. Measured on 2 cores (bench_rpc, Enqueue
 * ops/s over EchoStream msgs/s in one run): submitting from the RPC thread
 * took the ratio from about 0.6 to 0.3; here those wake-ups land on a thread
 * that no client waits for. */
static void *sched_dispatch_main(void *arg) {
  sched *s = arg;
  sched_qop *batch[SCHED_DISPATCH_BATCH];
  pthread_mutex_lock(&s->qmu);
  for (;;) {
    while (!s->fences && (!s->rhead || s->paused) && !s->qstop)
      pthread_cond_wait(&s->qcv, &s->qmu);
    if (s->qstop) break;
    if (s->fences) { /* every batch taken before was submitted */
      sched_fence_req *f = s->fences;
      s->fences = NULL;
      pthread_mutex_unlock(&s->qmu);
      while (f) {
        sched_fence_req *next = f->next;
        sched_submit_fence(s, f);
        free(f);
        f = next;
      }
      pthread_mutex_lock(&s->qmu);
      continue;
    }
    sched_session *ss = s->rhead;
    s->rhead = ss->rnext;
    if (!s->rhead) s->rtail = NULL;
    ss->rnext = NULL;
    int k = 0;
    while (ss->qhead && k < SCHED_DISPATCH_BATCH) {
      sched_qop *q = ss->qhead;
      ss->qhead = q->next;
      q->next = NULL;
      batch[k++] = q;
    }
    ss->qlen -= k;
    ss->sub_lo = k ? batch[0]->seq : 0;
    atomic_fetch_sub(&s->n_queued, (uint64_t)k);
    bool drop_ref = false;
    if (ss->qhead) { /* back of the line: others get their turn */
      if (s->rtail)
        s->rtail->rnext = ss;
      else
        s->rhead = ss;
      s->rtail = ss;
    } else {
      ss->qtail = NULL;
      ss->in_ready = false;
      drop_ref = true;
    }
    pthread_mutex_unlock(&s->qmu);
    for (int i = 0; i < k; i++) sched_submit(s, batch[i]);
    pthread_mutex_lock(&s->qmu);
    ss->sub_lo = 0;
    sched_dwait *w = sched_take_waiters_locked(ss);
    pthread_cond_broadcast(&s->dcv);
    if (w || drop_ref) {
      pthread_mutex_unlock(&s->qmu);
      sched_fire_waiters(w);
      if (drop_ref) sched_session_put(ss);
      pthread_mutex_lock(&s->qmu);
    }
  }
  pthread_mutex_unlock(&s->qmu);
  return NULL;
}

/* Releases every handle of a session (caller holds ss->mu). */
static uint64_t sched_release_all_locked(sched_session *ss) {
  uint64_t n = 0;
  for (size_t i = 0; i < ss->handles.cap; i++) {
    sched_slot *sl = &ss->handles.slots[i];
    if (sl->id != 0 && sl->t != NULL) {
      dev_tensor_release(sl->t);
      n++;
    }
  }
  free(ss->handles.slots);
  memset(&ss->handles, 0, sizeof(ss->handles));
  ss->bytes = 0;
  /* Tapes hold references to what they recorded: release them too. */
  for (int i = 0; i < ss->num_tapes; i++) dev_tape_destroy(ss->tapes[i].tape);
  free(ss->tapes);
  ss->tapes = NULL;
  ss->num_tapes = ss->cap_tapes = 0;
  ss->closed = true;
  return n;
}

static void sched_session_free(sched_session *ss) {
  pthread_mutex_lock(&ss->mu);
  if (!ss->closed) sched_release_all_locked(ss);
  pthread_mutex_unlock(&ss->mu);
  /* Registrations wait only on queued ops, and queued ops hold a reference:
   * none can be left, but never strand a caller. */
  sched_fire_waiters(ss->dwait);
  pthread_mutex_destroy(&ss->mu);
  free(ss);
}

void sched_session_put(sched_session *ss) {
  if (ss && atomic_fetch_sub(&ss->refs, 1) == 1) sched_session_free(ss);
}

/* Unlinks `ss` from the list (caller holds s->mu). */
static void sched_unlink_locked(sched *s, sched_session *ss) {
  for (sched_session **pp = &s->sessions; *pp; pp = &(*pp)->next) {
    if (*pp == ss) {
      *pp = ss->next;
      ss->next = NULL;
      s->num_sessions--;
      return;
    }
  }
}

static void sched_wait_dispatched(sched_session *ss);

const char *sched_end_reason_name(sched_end_reason why) {
  switch (why) {
    case SCHED_END_CLOSED: return "closed";
    case SCHED_END_EXPIRED: return "expired";
    case SCHED_END_KILLED: return "killed";
    case SCHED_END_STOPPED: return "stopped";
  }
  return "unknown";
}

int sched_observer_add(sched *s, const sched_observer *obs) {
  if (!obs || s->num_observers >= SCHED_MAX_OBSERVERS) return -1;
  s->observers[s->num_observers] = *obs;
  return s->num_observers++;
}

pd_code sched_session_attach(sched_session *ss, int key, void *state,
                             dev_status *st) {
  if (key < 0 || key >= ss->owner->num_observers)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "observer key %d is not one sched_observer_add returned "
                     "(%d registered)",
                     key, ss->owner->num_observers);
  pd_code c = PD_OK;
  pthread_mutex_lock(&ss->mu);
  if (ss->closed)
    c = dev_error(st, PD_FAILED_PRECONDITION,
                  "session %llu has ended: nothing can be attached to it",
                  (unsigned long long)ss->seq);
  else if (ss->attached[key])
    c = dev_error(st, PD_ALREADY_EXISTS,
                  "observer %d already has state attached to session %llu",
                  key, (unsigned long long)ss->seq);
  else
    ss->attached[key] = state;
  pthread_mutex_unlock(&ss->mu);
  return c;
}

void *sched_session_attached(sched_session *ss, int key) {
  if (key < 0 || key >= SCHED_MAX_OBSERVERS) return NULL;
  pthread_mutex_lock(&ss->mu);
  void *state = ss->attached[key];
  pthread_mutex_unlock(&ss->mu);
  return state;
}

/* Tells every observer that `ss` ended (no lock held). */
static void sched_notify_end(sched_session *ss, sched_end_reason why,
                             uint64_t handles, void *const *states) {
  sched *s = ss->owner;
  sched_end_info info = {ss->seq, ss->client, ss->job, why, handles};
  for (int k = 0; k < s->num_observers; k++)
    if (s->observers[k].on_end)
      s->observers[k].on_end(s->observers[k].arg, &info, states[k]);
}

/* Ends a session already unlinked from the table: releases its handles,
 * drops its queue, waits for the dispatcher to hand over what it took of
 * it, and tells the observers. The caller drops the table's reference.
 * Returns the handles freed. */
static uint64_t sched_end_session(sched_session *ss, sched_end_reason why,
                                  const char *msg, uint64_t *bytes) {
  void *states[SCHED_MAX_OBSERVERS];
  pthread_mutex_lock(&ss->mu);
  if (bytes) *bytes = ss->bytes;
  uint64_t n = ss->closed ? 0 : sched_release_all_locked(ss);
  memcpy(states, ss->attached, sizeof(states));
  memset(ss->attached, 0, sizeof(ss->attached));
  pthread_mutex_unlock(&ss->mu);
  sched_drop_queue(ss, msg);
  sched_wait_dispatched(ss);
  sched_notify_end(ss, why, n, states);
  return n;
}

static void *sched_lease_main(void *arg) {
  sched *s = arg;
  pthread_mutex_lock(&s->mu);
  while (!s->stopping) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += s->cfg.lease_check_ms / 1000;
    ts.tv_nsec += (long)(s->cfg.lease_check_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    if (s->stopping) break;
    int64_t now = sched_now_ms();
    sched_session *expired = NULL;
    for (sched_session **pp = &s->sessions; *pp;) {
      sched_session *ss = *pp;
      if (atomic_load(&ss->expires_ms) <= now) {
        *pp = ss->next;
        s->num_sessions--;
        ss->next = expired;
        expired = ss;
      } else {
        pp = &ss->next;
      }
    }
    pthread_mutex_unlock(&s->mu);
    while (expired) {
      sched_session *ss = expired;
      expired = ss->next;
      uint64_t n = sched_end_session(
          ss, SCHED_END_EXPIRED,
          "the session's lease expired before the op ran", NULL);
      atomic_fetch_add(&s->n_expired, 1);
      if (s->cfg.on_expired)
        s->cfg.on_expired(s->cfg.on_expired_arg, ss->seq, ss->client, n);
      sched_session_put(ss); /* the table's reference */
    }
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static bool sched_config_valid(const sched_config *cfg) {
  return cfg->default_lease_s != 0 && cfg->max_lease_s >= cfg->default_lease_s &&
         cfg->max_sessions > 0 && cfg->max_handles_per_session > 0 &&
         cfg->max_ops_per_request > 0 && cfg->lease_check_ms != 0 &&
         cfg->max_queued_ops > 0 &&
         (cfg->max_memory_quota == 0 ||
          cfg->default_memory_quota <= cfg->max_memory_quota);
}

static void sched_set_limits(sched *s, const sched_config *cfg) {
  sched_limits *l = &s->lim;
  atomic_store(&l->default_lease_s, cfg->default_lease_s);
  atomic_store(&l->max_lease_s, cfg->max_lease_s);
  atomic_store(&l->max_sessions, cfg->max_sessions);
  atomic_store(&l->max_handles, cfg->max_handles_per_session);
  atomic_store(&l->max_ops, cfg->max_ops_per_request);
  atomic_store(&l->max_queued, cfg->max_queued_ops);
  atomic_store(&l->default_quota, cfg->default_memory_quota);
  atomic_store(&l->max_quota, cfg->max_memory_quota);
}

#define SCHED_CONFIG_RULES                                                  \
  "every limit must be positive, default_lease_s <= max_lease_s, and "      \
  "default_memory_quota <= max_memory_quota when a maximum is set"

pd_code sched_reconfigure(sched *s, const sched_config *cfg, dev_status *st) {
  if (!cfg || cfg->struct_size != sizeof(sched_config))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_config.struct_size is %zu, expected %zu",
                     cfg ? cfg->struct_size : 0, sizeof(sched_config));
  sched_config c = *cfg;
  c.lease_check_ms = s->cfg.lease_check_ms;
  if (!sched_config_valid(&c))
    return dev_error(st, PD_INVALID_ARGUMENT, "sched_config: " SCHED_CONFIG_RULES);
  sched_set_limits(s, &c);
  return PD_OK;
}

pd_code sched_create(dev_engine *e, const sched_config *cfg, sched **out,
                     dev_status *st) {
  if (!e || !cfg || !out)
    return dev_error(st, PD_INVALID_ARGUMENT, "sched_create: NULL argument");
  if (cfg->struct_size != sizeof(sched_config))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_config.struct_size is %zu, expected %zu",
                     cfg->struct_size, sizeof(sched_config));
  if (!sched_config_valid(cfg))
    return dev_error(st, PD_INVALID_ARGUMENT, "sched_config: " SCHED_CONFIG_RULES);
  sched *s = calloc(1, sizeof(*s));
  if (!s) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  s->engine = e;
  s->cfg = *cfg;
  sched_set_limits(s, cfg);
  s->next_seq = 1;
  s->num_ops = dev_op_count();
  s->op_names = calloc((size_t)s->num_ops + 1, sizeof(*s->op_names));
  s->op_stats = calloc((size_t)s->num_ops + 1, sizeof(*s->op_stats));
  if (!s->op_names || !s->op_stats) {
    free(s->op_names);
    free(s->op_stats);
    free(s);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (int i = 0; i < s->num_ops; i++) {
    const dev_op_def *d = dev_op_at(i);
    s->op_names[i] = (sched_op_name){d->name, i};
  }
  qsort(s->op_names, (size_t)s->num_ops, sizeof(*s->op_names),
        sched_op_name_cmp);
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&s->qmu, NULL);
  pthread_cond_init(&s->qcv, NULL);
  pthread_cond_init(&s->dcv, NULL);
  pthread_mutex_init(&s->done_mu, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  atomic_init(&s->next_tag, 1);
  int rc = pthread_create(&s->lease_thread, NULL, sched_lease_main, s);
  if (rc != 0) goto fail_lease;
  rc = pthread_create(&s->dispatch_thread, NULL, sched_dispatch_main, s);
  if (rc != 0) goto fail_dispatch;
  *out = s;
  return PD_OK;

fail_dispatch:
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->lease_thread, NULL);
fail_lease:
  pthread_cond_destroy(&s->done_cv);
  pthread_mutex_destroy(&s->done_mu);
  pthread_cond_destroy(&s->dcv);
  pthread_cond_destroy(&s->qcv);
  pthread_mutex_destroy(&s->qmu);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s->op_names);
  free(s->op_stats);
  free(s);
  return dev_error(st, PD_INTERNAL, "cannot start the scheduler's threads: %s",
                   strerror(rc));
}

void sched_destroy(sched *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->lease_thread, NULL);
  pthread_mutex_lock(&s->qmu);
  s->qstop = true;
  pthread_cond_broadcast(&s->qcv);
  sched_fence_req *f = s->fences;
  s->fences = NULL;
  pthread_mutex_unlock(&s->qmu);
  pthread_join(s->dispatch_thread, NULL);
  while (f) {
    sched_fence_req *next = f->next;
    f->fn(f->arg, NULL, PD_CANCELLED);
    free(f);
    f = next;
  }
  /* The dispatcher is gone: drop what it did not reach. */
  while (s->rhead) {
    sched_session *ss = s->rhead;
    s->rhead = ss->rnext;
    ss->rnext = NULL;
    ss->in_ready = false;
    sched_drop_queue(ss, "the daemon shut down before the op ran");
    sched_session_put(ss);
  }
  s->rtail = NULL;
  pthread_mutex_lock(&s->mu);
  sched_session *open = s->sessions;
  s->sessions = NULL;
  s->num_sessions = 0;
  pthread_mutex_unlock(&s->mu);
  while (open) { /* the engine still runs: observers may use it */
    sched_session *ss = open;
    open = ss->next;
    ss->next = NULL;
    sched_end_session(ss, SCHED_END_STOPPED,
                      "the daemon shut down before the op ran", NULL);
    sched_session_put(ss); /* the table's reference */
  }
  /* Ops on the devices still report their completion here. */
  pthread_mutex_lock(&s->done_mu);
  while (atomic_load(&s->n_completed) < atomic_load(&s->n_submitted))
    pthread_cond_wait(&s->done_cv, &s->done_mu);
  pthread_mutex_unlock(&s->done_mu);
  pthread_cond_destroy(&s->done_cv);
  pthread_mutex_destroy(&s->done_mu);
  pthread_cond_destroy(&s->dcv);
  pthread_cond_destroy(&s->qcv);
  pthread_mutex_destroy(&s->qmu);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s->op_names);
  free(s->op_stats);
  free(s);
}

void sched_pause(sched *s, bool paused) {
  pthread_mutex_lock(&s->qmu);
  s->paused = paused;
  pthread_cond_broadcast(&s->qcv);
  pthread_mutex_unlock(&s->qmu);
}

int sched_num_sessions(sched *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->num_sessions;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static pd_code sched_copy_name(char *dst, const char *src, const char *what,
                               dev_status *st) {
  size_t len = src ? strlen(src) : 0;
  if (len > SCHED_NAME_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s is %zu bytes; the limit (max_string_bytes) is %d",
                     what, len, SCHED_NAME_MAX);
  if (len) memcpy(dst, src, len);
  dst[len] = '\0';
  return PD_OK;
}

pd_code sched_session_create(sched *s, const sched_session_params *p,
                             sched_session_info *out, dev_status *st) {
  uint32_t max_lease = SCHED_LIM(s, max_lease_s);
  uint32_t lease = p->lease_s ? p->lease_s : SCHED_LIM(s, default_lease_s);
  if (lease > max_lease)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "lease_seconds %u is over the limit max_lease_seconds = %u",
                     lease, max_lease);
  uint64_t max_quota = SCHED_LIM(s, max_quota);
  uint64_t quota = p->memory_quota ? p->memory_quota : SCHED_LIM(s, default_quota);
  if (max_quota && quota > max_quota)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "memory_quota_bytes %llu is over the limit "
                     "max_memory_quota = %llu bytes",
                     (unsigned long long)quota, (unsigned long long)max_quota);
  if (max_quota && quota == 0) quota = max_quota;
  sched_session *ss = calloc(1, sizeof(*ss));
  if (!ss) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  pd_code c;
  if ((c = sched_copy_name(ss->client, p->client_name, "client_name", st)) ||
      (c = sched_copy_name(ss->job, p->job_id, "job_id", st))) {
    free(ss);
    return c;
  }
  sched_put_le64(ss->token, s->cfg.incarnation);
  size_t got = 0;
  while (got < 16) {
    ssize_t r = getrandom(ss->token + 8 + got, 16 - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      free(ss);
      return dev_error(st, PD_INTERNAL, "getrandom failed: %s",
                       strerror(errno));
    }
    got += (size_t)r;
  }
  atomic_init(&ss->refs, 1); /* the table's */
  ss->owner = s;
  ss->lease_s = lease;
  ss->quota = quota;
  ss->created_ms = sched_now_ms();
  atomic_init(&ss->expires_ms, ss->created_ms + (int64_t)lease * 1000);
  pthread_mutex_init(&ss->mu, NULL);

  pthread_mutex_lock(&s->mu);
  int max_sessions = SCHED_LIM(s, max_sessions);
  if (s->num_sessions >= max_sessions) {
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&ss->mu);
    free(ss);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the daemon holds max_sessions = %d sessions; close one "
                     "or wait for a lease to end",
                     max_sessions);
  }
  ss->seq = s->next_seq++;
  ss->next = s->sessions;
  s->sessions = ss;
  s->num_sessions++;
  pthread_mutex_unlock(&s->mu);
  atomic_fetch_add(&s->n_created, 1);

  memcpy(out->token, ss->token, SCHED_TOKEN_BYTES);
  out->seq = ss->seq;
  out->lease_s = lease;
  out->memory_quota = ss->quota;
  return PD_OK;
}

/* Finds the session of a token (caller holds s->mu). */
static pd_code sched_find_locked(sched *s, const void *token, size_t len,
                                 sched_session **out, dev_status *st) {
  if (len != SCHED_TOKEN_BYTES)
    return dev_error(st, PD_UNAUTHENTICATED,
                     "malformed session token: %zu bytes, expected %d (the "
                     "session_token CreateSession returned)",
                     len, SCHED_TOKEN_BYTES);
  /* Nothing persists across restarts, so a real earlier run's token and a
   * forged one look alike: the message names both possibilities. */
  if (sched_get_le64(token) != s->cfg.incarnation)
    return dev_error(st, PD_NOT_FOUND,
                     "session token is not from this run of paradevd (token "
                     "incarnation %016" PRIx64 ", this daemon %016" PRIx64
                     "): the daemon restarted since the session was created, "
                     "or the token was not issued by it; create a new session",
                     sched_get_le64(token), s->cfg.incarnation);
  for (sched_session *ss = s->sessions; ss; ss = ss->next) {
    if (sched_token_eq(ss->token, token)) {
      *out = ss;
      return PD_OK;
    }
  }
  return dev_error(st, PD_NOT_FOUND,
                   "session not found: closed, lease expired, or never "
                   "created");
}

pd_code sched_session_open(sched *s, const void *token, size_t len,
                           sched_session **out, dev_status *st) {
  pthread_mutex_lock(&s->mu);
  sched_session *ss = NULL;
  pd_code c = sched_find_locked(s, token, len, &ss, st);
  if (c == PD_OK) {
    atomic_fetch_add(&ss->refs, 1);
    atomic_store(&ss->expires_ms, sched_now_ms() + (int64_t)ss->lease_s * 1000);
    *out = ss;
  }
  pthread_mutex_unlock(&s->mu);
  return c;
}

pd_code sched_session_close(sched *s, const void *token, size_t len,
                            uint64_t *handles_freed, dev_status *st) {
  pthread_mutex_lock(&s->mu);
  sched_session *ss = NULL;
  pd_code c = sched_find_locked(s, token, len, &ss, st);
  if (c == PD_OK) sched_unlink_locked(s, ss);
  pthread_mutex_unlock(&s->mu);
  if (c != PD_OK) return c;
  uint64_t n = sched_end_session(ss, SCHED_END_CLOSED,
                                 "the session was closed before the op ran",
                                 NULL);
  atomic_fetch_add(&s->n_closed, 1);
  sched_session_put(ss);
  if (handles_freed) *handles_freed = n;
  return PD_OK;
}

void sched_session_touch(sched_session *ss) {
  atomic_store(&ss->expires_ms, sched_now_ms() + (int64_t)ss->lease_s * 1000);
}

uint64_t sched_session_seq(const sched_session *ss) { return ss->seq; }
uint32_t sched_session_lease_s(const sched_session *ss) { return ss->lease_s; }

/* ------------------------------------------------------------------------ */
/* Handles */

static pd_code sched_closed_error(dev_status *st) {
  return dev_error(st, PD_NOT_FOUND,
                   "session not found: closed or lease expired during the "
                   "call");
}

static pd_code sched_not_found(uint64_t id, dev_status *st) {
  return dev_error(st, PD_NOT_FOUND,
                   "handle %llu not found in this session (never created, "
                   "deleted, or another session's)",
                   (unsigned long long)id);
}

pd_code sched_handle_get(sched_session *ss, uint64_t id, dev_tensor **out,
                         dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  sched_slot *sl = NULL;
  if (ss->closed) {
    c = sched_closed_error(st);
  } else if ((sl = sched_htab_find(&ss->handles, id)) == NULL) {
    c = sched_not_found(id, st);
  } else {
    dev_tensor_retain(sl->t);
    *out = sl->t;
  }
  pthread_mutex_unlock(&ss->mu);
  return c;
}

pd_code sched_handle_delete(sched_session *ss, const uint64_t *ids, int n,
                            dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  if (ss->closed) c = sched_closed_error(st);
  for (int i = 0; c == PD_OK && i < n; i++) {
    if (!sched_htab_find(&ss->handles, ids[i])) c = sched_not_found(ids[i], st);
    for (int j = 0; c == PD_OK && j < i; j++)
      if (ids[j] == ids[i])
        c = dev_error(st, PD_INVALID_ARGUMENT,
                      "handle %llu is listed twice (positions %d and %d)",
                      (unsigned long long)ids[i], j, i);
  }
  if (c == PD_OK) {
    for (int i = 0; i < n; i++) {
      sched_slot *sl = sched_htab_find(&ss->handles, ids[i]);
      dev_tensor *t = sl->t;
      ss->bytes -= sl->bytes;
      sched_htab_remove(&ss->handles, sl);
      dev_tensor_release(t);
    }
  }
  pthread_mutex_unlock(&ss->mu);
  return c;
}

void sched_session_usage(sched_session *ss, int *handles, uint64_t *bytes) {
  pthread_mutex_lock(&ss->mu);
  if (handles) *handles = (int)ss->handles.live;
  if (bytes) *bytes = ss->bytes;
  pthread_mutex_unlock(&ss->mu);
}

/* Checks that `extra_handles` more handles of `extra_bytes` fit (ss->mu held). */
static pd_code sched_check_room_locked(sched_session *ss, int extra_handles,
                                       uint64_t extra_bytes, dev_status *st) {
  sched *s = ss->owner;
  int max_handles = SCHED_LIM(s, max_handles);
  if (ss->handles.live + (size_t)extra_handles > (size_t)max_handles)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the session would hold %zu handles; the limit "
                     "max_handles_per_session is %d (delete some)",
                     ss->handles.live + (size_t)extra_handles, max_handles);
  if (ss->quota && (extra_bytes > ss->quota || ss->bytes > ss->quota - extra_bytes))
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "session memory quota exceeded: %llu bytes held + %llu "
                     "new > quota %llu bytes",
                     (unsigned long long)ss->bytes,
                     (unsigned long long)extra_bytes,
                     (unsigned long long)ss->quota);
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Uploads */

pd_code sched_upload_begin(sched_session *ss, uint64_t id, pd_dtype dtype,
                           const dev_layout *layout,
                           const dev_shape *host_shape,
                           const dev_shape *component_shapes,
                           sched_upload **out, dev_status *st) {
  if (id == 0)
    return dev_error(st, PD_INVALID_ARGUMENT, "handle id 0 is reserved");
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  if (ss->closed)
    c = sched_closed_error(st);
  else if (sched_htab_find(&ss->handles, id))
    c = dev_error(st, PD_ALREADY_EXISTS,
                  "handle %llu is already live in this session",
                  (unsigned long long)id);
  else
    c = sched_check_room_locked(ss, 1, 0, st);
  pthread_mutex_unlock(&ss->mu);
  if (c != PD_OK) return c;

  dev_tensor *t = NULL;
  c = dev_tensor_create_for_layout(ss->owner->engine, dtype, layout,
                                   host_shape, component_shapes, &t, st);
  if (c != PD_OK) return c;
  pthread_mutex_lock(&ss->mu);
  c = sched_check_room_locked(ss, 1, dev_tensor_bytes(t), st);
  pthread_mutex_unlock(&ss->mu);
  if (c != PD_OK) {
    dev_tensor_release(t);
    return c;
  }
  sched_upload *u = calloc(1, sizeof(*u));
  if (!u) {
    dev_tensor_release(t);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  atomic_fetch_add(&ss->refs, 1);
  u->ss = ss;
  u->id = id;
  u->t = t;
  u->layout = *layout;
  *out = u;
  return PD_OK;
}

uint64_t sched_upload_expected(const sched_upload *u, int component) {
  uint64_t bytes = 0;
  if (dev_tensor_host_size(u->t, &u->layout, component, NULL, &bytes, NULL) !=
      PD_OK)
    return 0;
  return bytes;
}

pd_code sched_upload_write(sched_upload *u, int component, uint64_t offset,
                           const void *data, size_t len, dev_status *st) {
  return dev_tensor_write(u->t, &u->layout, component, offset, data, len, st);
}

const dev_tensor *sched_upload_tensor(const sched_upload *u) { return u->t; }

pd_code sched_upload_commit(sched_upload *u, dev_status *st) {
  sched_session *ss = u->ss;
  uint64_t bytes = dev_tensor_bytes(u->t);
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  if (ss->closed)
    c = sched_closed_error(st);
  else if (sched_htab_find(&ss->handles, u->id))
    c = dev_error(st, PD_ALREADY_EXISTS,
                  "handle %llu is already live in this session",
                  (unsigned long long)u->id);
  else if ((c = sched_check_room_locked(ss, 1, bytes, st)) == PD_OK) {
    if (sched_htab_insert(&ss->handles, u->id, u->t, bytes)) {
      ss->bytes += bytes;
      u->t = NULL; /* the table owns it now */
    } else {
      c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    }
  }
  pthread_mutex_unlock(&ss->mu);
  sched_upload_abort(u);
  return c;
}

void sched_upload_abort(sched_upload *u) {
  if (!u) return;
  dev_tensor_release(u->t);
  sched_session_put(u->ss);
  free(u);
}

/* ------------------------------------------------------------------------ */
/* Ops */

/* Prefixes an error message with the op's index and name. */
static pd_code sched_op_error(dev_status *st, int i, const char *name,
                              const dev_status *inner) {
  if (!st) return inner->code;
  dev_status tmp = *inner;
  return dev_error(st, tmp.code, "op %d (%.64s): %s", i, name ? name : "",
                   tmp.msg);
}

/* Appends the queue entries first..last (n of them, seq already set) to the
 * session's queue and puts the session in the dispatcher's ready list
 * (caller holds s->qmu). */
static void sched_queue_append_locked(sched_session *ss, sched_qop *first,
                                      sched_qop *last, int n) {
  sched *s = ss->owner;
  if (ss->qtail)
    ss->qtail->next = first;
  else
    ss->qhead = first;
  ss->qtail = last;
  ss->qlen += n;
  atomic_fetch_add(&s->n_queued, (uint64_t)n);
  if (!ss->in_ready) {
    ss->in_ready = true;
    atomic_fetch_add(&ss->refs, 1);
    if (s->rtail)
      s->rtail->rnext = ss;
    else
      s->rhead = ss;
    s->rtail = ss;
    pthread_cond_signal(&s->qcv);
  }
}

typedef struct sched_pending {
  uint64_t id;
  dev_tensor *t;  /* borrowed from its prepared op */
  uint64_t bytes; /* what it is charged: 0 for a buffer shared with an input */
} sched_pending;

pd_code sched_execute(sched_session *ss, const sched_op *ops, int n,
                      uint64_t tag, sched_op_result *results, int *failed_op,
                      dev_status *st) {
  sched *s = ss->owner;
  int max_ops = SCHED_LIM(s, max_ops);
  if (n <= 0 || n > max_ops) {
    if (failed_op) *failed_op = n > 0 ? max_ops : 0;
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a request holds %d ops; expected 1 to "
                     "max_ops_per_request = %d",
                     n, max_ops);
  }
  /* A call of one op (every streamed op) needs no allocation here. */
  dev_op *prepared1[1] = {NULL};
  sched_pending pend1[DEV_MAX_OUTPUTS];
  dev_op **prepared = prepared1;
  sched_pending *pend = pend1;
  if (n > 1) {
    prepared = calloc((size_t)n, sizeof(*prepared));
    pend = calloc((size_t)n * DEV_MAX_OUTPUTS, sizeof(*pend));
    if (!prepared || !pend) {
      free(prepared);
      free(pend);
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    }
  }
  int npend = 0, bad = -1;
  uint64_t new_bytes = 0;
  dev_status inner = DEV_STATUS_INIT;
  dev_tensor *inputs[DEV_MAX_INPUTS];
  sched_qop *chain = NULL;
  pd_code c = PD_OK;

  pthread_mutex_lock(&ss->mu);
  if (ss->closed) {
    c = sched_closed_error(st);
    bad = 0;
    goto unwind;
  }
  for (int i = 0; i < n; i++) {
    const sched_op *op = &ops[i];
    bad = i;
    if (op->num_inputs < 0 || op->num_inputs > DEV_MAX_INPUTS) {
      c = dev_error(&inner, PD_INVALID_ARGUMENT,
                    "%d inputs; the limit max_inputs_per_op is %d",
                    op->num_inputs, DEV_MAX_INPUTS);
      goto op_failed;
    }
    if (op->num_outputs < 0 || op->num_outputs > DEV_MAX_OUTPUTS) {
      c = dev_error(&inner, PD_INVALID_ARGUMENT,
                    "%d output ids; no op has more than %d outputs",
                    op->num_outputs, DEV_MAX_OUTPUTS);
      goto op_failed;
    }
    /* Resolve inputs: live handles first, then outputs of earlier ops of
     * this request (the latest one wins; ids are unique anyway). */
    for (int j = 0; j < op->num_inputs; j++) {
      uint64_t id = op->inputs[j];
      sched_slot *sl = sched_htab_find(&ss->handles, id);
      dev_tensor *t = sl ? sl->t : NULL;
      for (int k = npend - 1; !t && k >= 0; k--)
        if (pend[k].id == id) t = pend[k].t;
      if (!t) {
        c = dev_error(&inner, PD_NOT_FOUND,
                      "input %d: handle %llu not found in this session "
                      "(never created, deleted, or another session's)",
                      j, (unsigned long long)id);
        goto op_failed;
      }
      inputs[j] = t;
    }
    for (int j = 0; j < op->num_outputs; j++) {
      uint64_t id = op->output_ids[j];
      if (id == 0) {
        c = dev_error(&inner, PD_INVALID_ARGUMENT,
                      "output %d: handle id 0 is reserved", j);
        goto op_failed;
      }
      bool dup = sched_htab_find(&ss->handles, id) != NULL;
      for (int k = 0; !dup && k < npend; k++) dup = pend[k].id == id;
      for (int k = 0; !dup && k < j; k++) dup = op->output_ids[k] == id;
      if (dup) {
        c = dev_error(&inner, PD_ALREADY_EXISTS,
                      "output %d: handle %llu is already live in this "
                      "session (or named twice in this request)",
                      j, (unsigned long long)id);
        goto op_failed;
      }
    }
    c = dev_op_prepare(s->engine, op->op_name, inputs, op->num_inputs,
                       op->attrs, op->num_attrs, &prepared[i], &inner);
    if (c != PD_OK) goto op_failed;
    int nout = dev_op_num_outputs(prepared[i]);
    if (nout != op->num_outputs) {
      c = dev_error(&inner, PD_INVALID_ARGUMENT,
                    "the op has %d outputs; the request names %d output ids",
                    nout, op->num_outputs);
      goto op_failed;
    }
    results[i].num_outputs = nout;
    /* Only output 0 can share input 0's buffer (DEV_OP_ALIASES_INPUT). */
    uint64_t nb = dev_op_new_bytes(prepared[i]);
    uint64_t shared = dev_op_output_bytes(prepared[i]) - nb;
    for (int j = 0; j < nout; j++) {
      dev_tensor *t = dev_op_output(prepared[i], j);
      results[i].dtype[j] = dev_tensor_dtype(t);
      results[i].shape[j] = *dev_tensor_shape(t);
      uint64_t b = dev_tensor_bytes(t);
      uint64_t cut = j == 0 ? (shared < b ? shared : b) : 0;
      pend[npend++] = (sched_pending){op->output_ids[j], t, b - cut};
    }
    new_bytes += nb;
  }
  bad = -1;
  c = sched_check_room_locked(ss, npend, new_bytes, st);
  if (c != PD_OK) {
    bad = 0;
    goto unwind;
  }
  /* Commit: make room first so that nothing can fail after publishing. */
  while ((ss->handles.used + (size_t)npend + 1) * 2 > ss->handles.cap) {
    if (!sched_htab_grow(&ss->handles)) {
      c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      bad = 0;
      goto unwind;
    }
  }
  for (int i = n - 1; i >= 0; i--) { /* the queue entries, in order */
    sched_qop *q = calloc(1, sizeof(*q));
    if (!q) {
      c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      bad = 0;
      goto unwind;
    }
    q->tag = tag;
    q->owner = s;
    q->op_index = sched_op_index(s, ops[i].op_name);
    q->next = chain;
    chain = q;
  }
  /* Only this session's calls add to its queue, and they hold ss->mu: the
   * queue can only shrink between this check and the append below. */
  pthread_mutex_lock(&s->qmu);
  int ql = ss->qlen;
  pthread_mutex_unlock(&s->qmu);
  int max_queued = SCHED_LIM(s, max_queued);
  if (ql + n > max_queued) {
    c = dev_error(st, PD_RESOURCE_EXHAUSTED,
                  "the session has %d ops queued; with %d more it would pass "
                  "the limit max_queued_ops = %d (Sync, or send fewer at once)",
                  ql, n, max_queued);
    bad = 0;
    goto unwind;
  }
  /* Every op will run: offer each, in order, to the session's tapes (between
   * preparation and queueing, as dev_tape_record asks). A tape that runs out
   * of host memory fails the request before anything is published (records
   * of earlier ops of this request may stay on a tape; their outputs are
   * cancelled, so a gradient through them fails rather than being wrong). */
  for (int i = 0; i < n && ss->num_tapes > 0; i++) {
    for (int k = 0; k < ss->num_tapes; k++) {
      if (dev_tape_record(ss->tapes[k].tape, prepared[i], &inner) != PD_OK) {
        c = dev_error(&inner, inner.code, "gradient tape %llu: %s",
                      (unsigned long long)ss->tapes[k].id, inner.msg);
        bad = i;
        goto op_failed;
      }
    }
  }
  uint64_t t_enq = sched_now_ns();
  pthread_mutex_lock(&s->qmu);
  {
    int k = 0;
    sched_qop *q = chain, *last = NULL;
    for (int i = 0; i < n; i++, last = q, q = q->next) {
      int nout = dev_op_num_outputs(prepared[i]);
      for (int j = 0; j < nout; j++, k++) {
        dev_tensor *t = pend[k].t;
        dev_tensor_retain(t);
        sched_htab_insert(&ss->handles, pend[k].id, t, pend[k].bytes);
        ss->bytes += pend[k].bytes;
      }
      q->op = prepared[i];
      q->seq = ++ss->enqueued;
      q->t_enq_ns = t_enq;
      prepared[i] = NULL;
    }
    sched_queue_append_locked(ss, chain, last, n);
    chain = NULL;
  }
  pthread_mutex_unlock(&s->qmu);
  pthread_mutex_unlock(&ss->mu);
  if (n > 1) {
    free(prepared);
    free(pend);
  }
  return PD_OK;

op_failed:
  sched_op_error(st, bad, ops[bad].op_name, &inner);
unwind:
  pthread_mutex_unlock(&ss->mu);
  while (chain) {
    sched_qop *q = chain;
    chain = q->next;
    free(q);
  }
  for (int i = 0; i < n; i++)
    if (prepared[i])
      dev_op_abandon(prepared[i], PD_CANCELLED,
                     "another op of the same request was rejected");
  if (n > 1) {
    free(prepared);
    free(pend);
  }
  if (failed_op) *failed_op = bad < 0 ? 0 : bad;
  return c;
}

/* ------------------------------------------------------------------------ */
/* Gradient tapes */

/* The tape of `id` (caller holds ss->mu), or NULL after a NOT_FOUND. */
static sched_tape_ent *sched_tape_find_locked(sched_session *ss, uint64_t id,
                                              dev_status *st) {
  for (int i = 0; i < ss->num_tapes; i++)
    if (ss->tapes[i].id == id) return &ss->tapes[i];
  dev_error(st, PD_NOT_FOUND,
            "gradient tape %llu not found in this session (never started, "
            "or deleted)",
            (unsigned long long)id);
  return NULL;
}

pd_code sched_tape_start(sched_session *ss, uint64_t tape_id, bool persistent,
                         dev_status *st) {
  if (tape_id == 0)
    return dev_error(st, PD_INVALID_ARGUMENT, "tape id 0 is reserved");
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  dev_tape *tape = NULL;
  if (ss->closed) {
    c = sched_closed_error(st);
    goto out;
  }
  for (int i = 0; i < ss->num_tapes; i++)
    if (ss->tapes[i].id == tape_id) {
      c = dev_error(st, PD_ALREADY_EXISTS,
                    "gradient tape %llu already exists in this session "
                    "(delete it first, or choose another id)",
                    (unsigned long long)tape_id);
      goto out;
    }
  if (ss->num_tapes >= SCHED_MAX_TAPES) {
    c = dev_error(st, PD_RESOURCE_EXHAUSTED,
                  "the session holds %d gradient tapes, the limit "
                  "(delete tapes it no longer needs)",
                  SCHED_MAX_TAPES);
    goto out;
  }
  if (ss->num_tapes == ss->cap_tapes) {
    int cap = ss->cap_tapes ? ss->cap_tapes * 2 : 4;
    sched_tape_ent *nt = realloc(ss->tapes, sizeof(*nt) * (size_t)cap);
    if (!nt) {
      c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      goto out;
    }
    ss->tapes = nt;
    ss->cap_tapes = cap;
  }
  c = dev_tape_create(ss->owner->engine, persistent, &tape, st);
  if (c == PD_OK) ss->tapes[ss->num_tapes++] = (sched_tape_ent){tape_id, tape};
out:
  pthread_mutex_unlock(&ss->mu);
  return c;
}

pd_code sched_tape_watch(sched_session *ss, uint64_t tape_id,
                         const uint64_t *ids, int n, dev_status *st) {
  if (n < 0 || (n > 0 && !ids))
    return dev_error(st, PD_INVALID_ARGUMENT, "%d ids to watch", n);
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  sched_tape_ent *te = NULL;
  if (ss->closed) {
    c = sched_closed_error(st);
  } else if ((te = sched_tape_find_locked(ss, tape_id, st)) == NULL) {
    c = PD_NOT_FOUND;
  } else {
    /* All or nothing: every id must be live before any is watched. */
    for (int i = 0; c == PD_OK && i < n; i++)
      if (!sched_htab_find(&ss->handles, ids[i])) c = sched_not_found(ids[i], st);
    for (int i = 0; c == PD_OK && i < n; i++) {
      dev_status inner = DEV_STATUS_INIT;
      if (dev_tape_watch(te->tape, sched_htab_find(&ss->handles, ids[i])->t,
                         &inner) != PD_OK)
        c = dev_error(st, inner.code, "gradient tape %llu: handle %llu: %s",
                      (unsigned long long)tape_id,
                      (unsigned long long)ids[i], inner.msg);
    }
  }
  pthread_mutex_unlock(&ss->mu);
  return c;
}

pd_code sched_tape_delete(sched_session *ss, uint64_t tape_id, dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  sched_tape_ent *te = NULL;
  if (ss->closed) {
    c = sched_closed_error(st);
  } else if ((te = sched_tape_find_locked(ss, tape_id, st)) == NULL) {
    c = PD_NOT_FOUND;
  } else {
    dev_tape_destroy(te->tape);
    *te = ss->tapes[--ss->num_tapes];
  }
  pthread_mutex_unlock(&ss->mu);
  return c;
}

/* The state of one sched_tape_gradient call, for its executor. */
typedef struct sched_grad_ctx {
  sched_session *ss;
  uint64_t tag;
  uint64_t new_bytes; /* what the gradient's ops allocate, so far */
  int ops;            /* gradient ops queued so far */
} sched_grad_ctx;

/* The tape's executor (dev_execute_fn): prepares one gradient op and appends
 * it to the session's queue behind everything the session queued before
 * (the forward ops it differentiates may not have reached the devices yet).
 * Runs under ss->mu, inside sched_tape_gradient. Gradient ops are counted
 * against the session's queue limit and its memory quota like any op; as
 * their outputs are not handles, the quota check is conservative: every
 * byte a gradient's ops allocate counts until the call returns. */
static pd_code sched_grad_exec(void *arg, const char *op_name,
                               dev_tensor *const *inputs, int num_inputs,
                               const dev_attr *attrs, int num_attrs,
                               dev_tensor **outputs, int *num_outputs,
                               dev_status *st) {
  sched_grad_ctx *g = arg;
  sched_session *ss = g->ss;
  sched *s = ss->owner;
  dev_op *op = NULL;
  pd_code c = dev_op_prepare(s->engine, op_name, inputs, num_inputs, attrs,
                             num_attrs, &op, st);
  if (c != PD_OK) return c;
  int nout = dev_op_num_outputs(op);
  uint64_t nb = dev_op_new_bytes(op);
  sched_qop *q = NULL;
  if (nout > *num_outputs) {
    c = dev_error(st, PD_INTERNAL, "%s has %d outputs; room for %d", op_name,
                  nout, *num_outputs);
  } else if (ss->quota &&
             (nb > ss->quota || g->new_bytes > ss->quota - nb ||
              ss->bytes > ss->quota - nb - g->new_bytes)) {
    c = dev_error(st, PD_RESOURCE_EXHAUSTED,
                  "session memory quota exceeded by the gradient's ops: %llu "
                  "bytes held + %llu bytes of gradient ops so far + %llu new "
                  "(%s) > quota %llu bytes",
                  (unsigned long long)ss->bytes,
                  (unsigned long long)g->new_bytes, (unsigned long long)nb,
                  op_name, (unsigned long long)ss->quota);
  } else if ((q = calloc(1, sizeof(*q))) == NULL) {
    c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  if (c != PD_OK) {
    dev_op_abandon(op, PD_CANCELLED, "the gradient was not computed");
    return c;
  }
  q->tag = g->tag;
  q->owner = s;
  q->op_index = sched_op_index(s, op_name);
  q->op = op;
  pthread_mutex_lock(&s->qmu);
  int max_queued = SCHED_LIM(s, max_queued);
  if (ss->qlen + 1 > max_queued) {
    int ql = ss->qlen;
    pthread_mutex_unlock(&s->qmu);
    free(q);
    dev_op_abandon(op, PD_CANCELLED, "the gradient was not computed");
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the session has %d ops queued; the gradient's op %s "
                     "would pass the limit max_queued_ops = %d (Sync before "
                     "asking for gradients, or raise the limit)",
                     ql, op_name, max_queued);
  }
  /* The caller's references, taken before the dispatcher may own the op. */
  for (int j = 0; j < nout; j++) {
    outputs[j] = dev_op_output(op, j);
    dev_tensor_retain(outputs[j]);
  }
  q->seq = ++ss->enqueued;
  q->t_enq_ns = sched_now_ns();
  sched_queue_append_locked(ss, q, q, 1);
  pthread_mutex_unlock(&s->qmu);
  *num_outputs = nout;
  g->new_bytes += nb;
  g->ops++;
  return PD_OK;
}

pd_code sched_tape_gradient(sched_session *ss, const sched_gradient *g,
                            uint64_t tag, pd_dtype *dtypes, dev_shape *shapes,
                            dev_status *st) {
  int n = g->num_sources;
  if (n < 0 || n > SCHED_MAX_GRAD_SOURCES || (n > 0 && (!g->sources || !g->result_ids)))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%d sources; expected 0 to %d, each with a result id", n,
                     SCHED_MAX_GRAD_SOURCES);
  if (g->num_results != n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%d sources but %d result ids; expected one result id "
                     "per source",
                     n, g->num_results);
  for (int i = 0; i < n; i++) {
    if (g->result_ids[i] == 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "result %d: handle id 0 is reserved", i);
    for (int j = 0; j < i; j++)
      if (g->result_ids[j] == g->result_ids[i])
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "result ids %d and %d are both %llu; expected "
                         "distinct ids",
                         j, i, (unsigned long long)g->result_ids[i]);
  }
  dev_tensor **srcs = calloc((size_t)(n ? n : 1), sizeof(*srcs));
  dev_tensor **outs = calloc((size_t)(n ? n : 1), sizeof(*outs));
  if (!srcs || !outs) {
    free(srcs);
    free(outs);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  pd_code c = PD_OK;
  bool computed = false;
  pthread_mutex_lock(&ss->mu);
  sched_tape_ent *te = NULL;
  sched_slot *sl = NULL;
  dev_tensor *target = NULL, *og = NULL;
  if (ss->closed) {
    c = sched_closed_error(st);
    goto out;
  }
  if ((te = sched_tape_find_locked(ss, g->tape_id, st)) == NULL) {
    c = PD_NOT_FOUND;
    goto out;
  }
  for (int i = 0; i < n; i++)
    if (sched_htab_find(&ss->handles, g->result_ids[i])) {
      c = dev_error(st, PD_ALREADY_EXISTS,
                    "result %d: handle %llu is already live in this session",
                    i, (unsigned long long)g->result_ids[i]);
      goto out;
    }
  if ((c = sched_check_room_locked(ss, n, 0, st)) != PD_OK) goto out;
  if ((sl = sched_htab_find(&ss->handles, g->target)) == NULL) {
    c = dev_error(st, PD_NOT_FOUND,
                  "target: handle %llu not found in this session (never "
                  "created, deleted, or another session's)",
                  (unsigned long long)g->target);
    goto out;
  }
  target = sl->t;
  if (g->output_gradient) {
    if ((sl = sched_htab_find(&ss->handles, g->output_gradient)) == NULL) {
      c = dev_error(st, PD_NOT_FOUND,
                    "output gradient: handle %llu not found in this session "
                    "(never created, deleted, or another session's)",
                    (unsigned long long)g->output_gradient);
      goto out;
    }
    og = sl->t;
  }
  for (int i = 0; i < n; i++) {
    if ((sl = sched_htab_find(&ss->handles, g->sources[i])) == NULL) {
      c = dev_error(st, PD_NOT_FOUND,
                    "source %d: handle %llu not found in this session (never "
                    "created, deleted, or another session's)",
                    i, (unsigned long long)g->sources[i]);
      goto out;
    }
    srcs[i] = sl->t;
  }
  sched_grad_ctx ctx = {ss, tag, 0, 0};
  dev_status inner = DEV_STATUS_INIT;
  dev_tape_set_executor(te->tape, sched_grad_exec, &ctx);
  c = dev_tape_gradient(te->tape, target, srcs, n, og ? &og : NULL, outs,
                        &inner);
  dev_tape_set_executor(te->tape, NULL, NULL);
  if (c != PD_OK) {
    /* Gradient ops queued before the failure still run; nothing holds
     * their outputs, so they are freed once they have. */
    dev_error(st, c, "gradient tape %llu: %s", (unsigned long long)g->tape_id,
              inner.msg);
    goto out;
  }
  computed = true;
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) bytes += dev_tensor_bytes(outs[i]);
  if ((c = sched_check_room_locked(ss, n, bytes, st)) != PD_OK) goto out;
  while ((ss->handles.used + (size_t)n + 1) * 2 > ss->handles.cap) {
    if (!sched_htab_grow(&ss->handles)) {
      c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      goto out;
    }
  }
  for (int i = 0; i < n; i++) {
    uint64_t b = dev_tensor_bytes(outs[i]);
    sched_htab_insert(&ss->handles, g->result_ids[i], outs[i], b);
    ss->bytes += b;
    dtypes[i] = dev_tensor_dtype(outs[i]);
    shapes[i] = *dev_tensor_shape(outs[i]);
    outs[i] = NULL; /* the table's now */
  }
out:
  pthread_mutex_unlock(&ss->mu);
  if (computed)
    for (int i = 0; i < n; i++) dev_tensor_release(outs[i]);
  free(srcs);
  free(outs);
  return c;
}

int sched_cancel(sched_session *ss, uint64_t tag) {
  sched *s = ss->owner;
  int n = 0;
  pthread_mutex_lock(&s->qmu);
  sched_qop *d = sched_unqueue_locked(ss, false, tag, &n);
  pthread_mutex_unlock(&s->qmu);
  sched_finish_drop(ss, d, n, "the call that queued the op was cancelled");
  return n;
}

uint64_t sched_new_tag(sched *s) { return atomic_fetch_add(&s->next_tag, 1); }

/* Waits until every op the session queued so far was submitted or dropped:
 * only then do its outputs have a place in the devices' order to wait on. */
static void sched_wait_dispatched(sched_session *ss) {
  sched *s = ss->owner;
  pthread_mutex_lock(&s->qmu);
  uint64_t target = ss->enqueued;
  while (!sched_handed_over_locked(ss, target) && !s->qstop)
    pthread_cond_wait(&s->dcv, &s->qmu);
  pthread_mutex_unlock(&s->qmu);
}

pd_code sched_tensor_wait(sched_session *ss, dev_tensor *t, dev_status *st) {
  if (!dev_tensor_is_ready(t)) sched_wait_dispatched(ss);
  return dev_tensor_wait(t, st);
}

pd_code sched_tensor_notify(sched_session *ss, dev_tensor *t, dev_ready_fn fn,
                            void *arg, dev_status *st) {
  sched *s = ss->owner;
  if (!dev_tensor_is_ready(t)) {
    pthread_mutex_lock(&s->qmu);
    uint64_t target = ss->enqueued;
    if (!sched_handed_over_locked(ss, target)) {
      sched_dwait *w = calloc(1, sizeof(*w));
      if (!w) {
        pthread_mutex_unlock(&s->qmu);
        return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      }
      dev_tensor_retain(t);
      *w = (sched_dwait){target, t, fn, arg, ss->dwait};
      ss->dwait = w;
      pthread_mutex_unlock(&s->qmu);
      return PD_OK;
    }
    pthread_mutex_unlock(&s->qmu);
  }
  return dev_tensor_notify(t, fn, arg, st);
}

pd_code sched_collect(sched_session *ss, const uint64_t *ids, int n,
                      sched_ref **out, size_t *count, dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  if (ss->closed) {
    pthread_mutex_unlock(&ss->mu);
    return sched_closed_error(st);
  }
  size_t cnt = n > 0 ? (size_t)n : ss->handles.live;
  sched_ref *list = calloc(cnt ? cnt : 1, sizeof(*list));
  if (!list) {
    pthread_mutex_unlock(&ss->mu);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  size_t k = 0;
  pd_code c = PD_OK;
  if (n > 0) {
    for (int i = 0; i < n; i++) {
      sched_slot *sl = sched_htab_find(&ss->handles, ids[i]);
      if (!sl) {
        c = sched_not_found(ids[i], st);
        break;
      }
      list[k++] = (sched_ref){ids[i], sl->t};
    }
  } else {
    for (size_t i = 0; i < ss->handles.cap; i++) {
      sched_slot *sl = &ss->handles.slots[i];
      if (sl->id != 0 && sl->t != NULL) list[k++] = (sched_ref){sl->id, sl->t};
    }
  }
  if (c == PD_OK)
    for (size_t i = 0; i < k; i++) dev_tensor_retain(list[i].t);
  pthread_mutex_unlock(&ss->mu);
  if (c != PD_OK) {
    free(list);
    return c;
  }
  *out = list;
  *count = k;
  return PD_OK;
}

void sched_refs_release(sched_ref *refs, size_t count) {
  for (size_t i = 0; refs && i < count; i++) dev_tensor_release(refs[i].t);
  free(refs);
}

pd_code sched_sync(sched_session *ss, const uint64_t *ids, int n,
                   dev_status *tensor_err, uint64_t *failed_id,
                   dev_status *st) {
  sched_ref *list = NULL;
  size_t k = 0;
  pd_code c = sched_collect(ss, ids, n, &list, &k, st);
  if (c != PD_OK) return c;
  dev_status first = DEV_STATUS_INIT;
  uint64_t first_id = 0;
  sched_wait_dispatched(ss);
  for (size_t i = 0; i < k; i++) {
    dev_status ts = DEV_STATUS_INIT;
    if (dev_tensor_wait(list[i].t, &ts) != PD_OK && first.code == PD_OK) {
      first = ts;
      first_id = list[i].id;
    }
  }
  sched_refs_release(list, k);
  if (tensor_err) *tensor_err = first;
  if (failed_id) *failed_id = first_id;
  return PD_OK;
}

pd_code sched_fence(sched *s, dev_ready_fn fn, void *arg, dev_status *st) {
  sched_fence_req *f = calloc(1, sizeof(*f));
  if (!f) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  f->fn = fn;
  f->arg = arg;
  pthread_mutex_lock(&s->qmu);
  if (s->qstop) {
    pthread_mutex_unlock(&s->qmu);
    free(f);
    fn(arg, NULL, PD_CANCELLED);
    return PD_OK;
  }
  f->next = s->fences;
  s->fences = f;
  pthread_cond_signal(&s->qcv);
  pthread_mutex_unlock(&s->qmu);
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Operators */

int sched_list_sessions(sched *s, const char *job, sched_session_view **out) {
  bool all = !job || !*job;
  pthread_mutex_lock(&s->mu);
  size_t cap = (size_t)s->num_sessions;
  sched_session **list = calloc(cap ? cap : 1, sizeof(*list));
  if (!list) {
    pthread_mutex_unlock(&s->mu);
    return -1;
  }
  size_t n = 0;
  for (sched_session *ss = s->sessions; ss && n < cap; ss = ss->next) {
    if (!all && strcmp(ss->job, job) != 0) continue;
    atomic_fetch_add(&ss->refs, 1);
    list[n++] = ss;
  }
  pthread_mutex_unlock(&s->mu);
  sched_session_view *v = calloc(n ? n : 1, sizeof(*v));
  int64_t now = sched_now_ms();
  for (size_t i = 0; i < n; i++) {
    sched_session *ss = list[n - 1 - i]; /* the table is newest first */
    if (v) {
      sched_session_view *e = &v[i];
      e->seq = ss->seq;
      memcpy(e->client, ss->client, sizeof(e->client));
      memcpy(e->job, ss->job, sizeof(e->job));
      e->memory_quota = ss->quota;
      e->lease_s = ss->lease_s;
      e->age_s = (double)(now - ss->created_ms) / 1000.0;
      int64_t last = atomic_load(&ss->expires_ms) - (int64_t)ss->lease_s * 1000;
      e->idle_s = now > last ? (double)(now - last) / 1000.0 : 0.0;
      pthread_mutex_lock(&ss->mu);
      e->bytes = ss->bytes;
      e->handles = ss->handles.live;
      pthread_mutex_unlock(&ss->mu);
      pthread_mutex_lock(&s->qmu);
      e->queued_ops = (uint64_t)ss->qlen;
      pthread_mutex_unlock(&s->qmu);
    }
    sched_session_put(ss);
  }
  free(list);
  if (!v) return -1;
  *out = v;
  return (int)n;
}

pd_code sched_kill(sched *s, const sched_kill_target *t,
                   sched_kill_result *out, dev_status *st) {
  int given = (t->token != NULL || t->token_len != 0) +
              (t->job != NULL) + (t->seq != 0);
  if (given != 1)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "name exactly one of: a session token, a job id, a "
                     "session number (%d given)",
                     given);
  if (t->job && !*t->job)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "an empty job id names no job (sessions without a job "
                     "id are killed by token or number)");
  sched_session *victims = NULL;
  pd_code c = PD_OK;
  pthread_mutex_lock(&s->mu);
  if (t->job) {
    for (sched_session **pp = &s->sessions; *pp;) {
      sched_session *ss = *pp;
      if (strcmp(ss->job, t->job) == 0) {
        *pp = ss->next;
        s->num_sessions--;
        ss->next = victims;
        victims = ss;
      } else {
        pp = &ss->next;
      }
    }
  } else {
    sched_session *ss = NULL;
    if (t->seq) {
      for (ss = s->sessions; ss && ss->seq != t->seq; ss = ss->next) {
      }
      if (!ss)
        c = dev_error(st, PD_NOT_FOUND, "no open session numbered %llu",
                      (unsigned long long)t->seq);
    } else {
      c = sched_find_locked(s, t->token, t->token_len, &ss, st);
    }
    if (c == PD_OK) {
      sched_unlink_locked(s, ss);
      victims = ss;
    }
  }
  pthread_mutex_unlock(&s->mu);
  if (c != PD_OK) return c;
  sched_kill_result r = {0, 0, 0};
  while (victims) {
    sched_session *ss = victims;
    victims = ss->next;
    uint64_t bytes = 0;
    r.handles += sched_end_session(
        ss, SCHED_END_KILLED,
        "the session was killed by an operator before the op ran", &bytes);
    r.bytes += bytes;
    r.sessions++;
    atomic_fetch_add(&s->n_killed, 1);
    sched_session_put(ss);
  }
  if (out) *out = r;
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Counters */

void sched_get_stats(sched *s, sched_stats *out) {
  sched_stats r;
  memset(&r, 0, sizeof(r));
  r.struct_size = sizeof(r);
  pthread_mutex_lock(&s->mu);
  r.sessions = s->num_sessions;
  for (sched_session *ss = s->sessions; ss; ss = ss->next) {
    pthread_mutex_lock(&ss->mu);
    r.handles += ss->handles.live;
    r.bytes += ss->bytes;
    pthread_mutex_unlock(&ss->mu);
  }
  pthread_mutex_unlock(&s->mu);
  r.sessions_created = atomic_load(&s->n_created);
  r.sessions_closed = atomic_load(&s->n_closed);
  r.sessions_expired = atomic_load(&s->n_expired);
  r.sessions_killed = atomic_load(&s->n_killed);
  r.ops_queued = atomic_load(&s->n_queued);
  /* Completed before submitted: in_flight is never negative. */
  r.ops_completed = atomic_load(&s->n_completed);
  r.ops_submitted = atomic_load(&s->n_submitted);
  r.ops_in_flight = r.ops_submitted - r.ops_completed;
  r.ops_dropped = atomic_load(&s->n_dropped);
  uint64_t cum = 0;
  for (int b = 0; b <= SCHED_LATENCY_BUCKETS; b++) {
    cum += atomic_load_explicit(&s->lat_buckets[b], memory_order_relaxed);
    r.latency_buckets[b] = cum;
  }
  r.latency_sum_s = (double)atomic_load(&s->lat_sum_ns) * 1e-9;
  *out = r;
}

void sched_op_stats(sched *s, int op_index, uint64_t by_code[SCHED_NUM_CODES],
                    double *run_seconds) {
  if (op_index < 0 || op_index >= s->num_ops) {
    memset(by_code, 0, sizeof(uint64_t) * SCHED_NUM_CODES);
    if (run_seconds) *run_seconds = 0;
    return;
  }
  sched_op_counter *c = &s->op_stats[op_index];
  for (int i = 0; i < SCHED_NUM_CODES; i++)
    by_code[i] = atomic_load_explicit(&c->by_code[i], memory_order_relaxed);
  if (run_seconds) *run_seconds = (double)atomic_load(&c->run_ns) * 1e-9;
}

bool sched_check_progress(sched *s, sched_progress *p, double now,
                          double stall_s) {
  uint64_t completed = atomic_load(&s->n_completed);
  bool outstanding = atomic_load(&s->n_queued) > 0 ||
                     atomic_load(&s->n_submitted) > completed;
  bool stalled = false;
  if (!outstanding || !p->outstanding || completed != p->completed)
    p->since = now; /* idle, new work, or progress: the wait starts again */
  else
    stalled = now - p->since > stall_s;
  p->completed = completed;
  p->outstanding = outstanding;
  return stalled;
}
