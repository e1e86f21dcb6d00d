/* The NCCL path of the CUDA collectives, when every mesh entry is a distinct
 * GPU: communicators per device set, from a cache keyed by the set (at most
 * CU_COMM_CACHE_MAX sets; the least recently acquired one that no collective
 * holds and that is not being built is destroyed to make room, by the new
 * set's builder thread; the whole mesh's set is held for the backend's
 * lifetime), each set's one communicator per rank created non-blocking by a
 * background thread started when collective_create first sees the set; each
 * device issues its rank's calls in a group on its stream and waits with a
 * deadline, polling its communicator's asynchronous error; on an error or a
 * timeout the set's communicators are aborted and rebuilt (collective.c's
 * opening comment has the whole story). Lock order: a set's `use` rwlock,
 * then the cache's mu. Empty without PARADEV_HAVE_NCCL. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef PARADEV_HAVE_NCCL
#include <nccl.h>
#endif

#include "coll_int.h"

#ifdef PARADEV_HAVE_NCCL

/* Device sets whose communicators the cache keeps (issue #17). */
#define CU_COMM_CACHE_MAX 16

enum { COMM_INIT, COMM_READY, COMM_FAILED };

/* One device set's communicators: one NCCL communicator per rank, built
 * together by a background thread (nccl_build_main). */
struct cu_comm {
  cu_backend *c;
  dev_devset set;
  /* Under cu_nccl.mu: */
  int state;
  char error[DEV_STATUS_MSG_MAX];
  int refs;         /* collectives (and the backend, for the whole mesh) */
  pthread_t thread; /* the builder */
  bool thread_live; /* a thread to join */
  double build_ms;  /* the last finished build, ms (-1: none yet) */
  int builds;       /* builds started */
  cu_comm *victims; /* evicted entries the builder destroys first */
  cu_comm *next;    /* the cache, most recently acquired first */
  /* comm[] by rank: readers (issuing, polling the asynchronous error) hold
   * `use` for reading; the builder publishing them and an abort, for
   * writing. generation is bumped by each abort (under both locks). */
  ncclComm_t comm[PD_MAX_DEVICES];
  uint64_t generation;
  pthread_rwlock_t use;
};

struct cu_nccl {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* an entry's build finished */
  cu_comm *head;     /* the cache, most recently acquired first */
  int count;
  cu_comm *mesh;    /* the whole mesh's entry: one reference held always */
  atomic_bool stop; /* read by the builders without mu */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sleeps a little longer each time: spins first, for short collectives. */
static void backoff(int *k) {
  if (*k < 64) {
    sched_yield();
  } else {
    int us = *k < 200 ? 20 : 200;
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
  }
  (*k)++;
}

static void abort_comms(ncclComm_t *comm, int n) {
  for (int i = 0; i < n; i++)
    if (comm[i]) {
      (void)ncclCommAbort(comm[i]);
      comm[i] = NULL;
    }
}

/* "[0, 2] (cuda:0, cuda:1)": a set in messages. */
static const char *set_name(cu_backend *c, const dev_devset *s, char *buf,
                            size_t len) {
  char ids[DEV_DEVSET_STR_MAX];
  int off = snprintf(buf, len, "%s (", dev_devset_str(s, ids, sizeof ids));
  for (int i = 0; i < s->n && off > 0 && (size_t)off < len; i++)
    off += snprintf(buf + off, len - (size_t)off, "%s%s", i ? ", " : "",
                    c->devs[s->dev[i]].name);
  if (off > 0 && (size_t)off < len) snprintf(buf + off, len - (size_t)off, ")");
  return buf;
}

/* Frees an entry nobody can reach any more (evicted, or at destroy): its
 * builder joined, its communicators aborted (abort also frees a healthy
 * communicator and never waits on a peer; no collective holds it, so no
 * NCCL work of it is in flight). Then the entries it was to destroy. */
static void comm_free_chain(cu_comm *m) {
  while (m) {
    cu_comm *next = m->victims;
    if (m->thread_live) pthread_join(m->thread, NULL);
    abort_comms(m->comm, m->set.n);
    pthread_rwlock_destroy(&m->use);
    free(m);
    m = next;
  }
  (void)cudaGetLastError();
}

/* Builds comm[0..n) for the set: one rank per device, in one process, so
 * the per-device inits go inside one ncclGroupStart/End; non-blocking
 * (blocking = 0), polled with ncclCommGetAsyncError until ready, failed or
 * past the deadline (then aborted). err is empty on success. */
static void build_comms(cu_backend *c, const dev_devset *set, ncclComm_t *comm,
                        char *err, size_t errlen) {
  cu_nccl *x = c->nccl;
  const int n = set->n;
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    snprintf(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    return;
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  r = ncclGroupStart();
  for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
    const cu_device *dv = &c->devs[set->dev[i]];
    cudaError_t ce = cudaSetDevice(dv->ordinal);
    if (ce != cudaSuccess) {
      snprintf(err, errlen, "cudaSetDevice(%d): %s", dv->ordinal,
               cudaGetErrorString(ce));
      break;
    }
    r = ncclCommInitRankConfig(&comm[i], n, id, i, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      snprintf(err, errlen, "ncclCommInitRankConfig(rank %d, %s): %s", i,
               dv->name, ncclGetErrorString(r));
  }
  ncclResult_t ge = ncclGroupEnd();
  if (!err[0] && ge != ncclSuccess && ge != ncclInProgress)
    snprintf(err, errlen, "ncclGroupEnd: %s", ncclGetErrorString(ge));
  double deadline = now_s() + c->coll_timeout_ms / 1000.0;
  for (int i = 0, k = 0; !err[0] && i < n;) {
    ncclResult_t s = ncclSuccess;
    r = ncclCommGetAsyncError(comm[i], &s);
    if (r != ncclSuccess || (s != ncclSuccess && s != ncclInProgress)) {
      snprintf(err, errlen, "communicator of %s: %s (%s)",
               c->devs[set->dev[i]].name,
               ncclGetErrorString(r != ncclSuccess ? r : s),
               ncclGetLastError(comm[i]));
    } else if (s == ncclSuccess) {
      i++;
    } else if (atomic_load(&x->stop)) {
      snprintf(err, errlen, "the backend is shutting down");
    } else if (now_s() > deadline) {
      snprintf(err, errlen, "ncclCommInitRankConfig did not finish in %d ms",
               c->coll_timeout_ms);
    } else {
      backoff(&k);
    }
  }
  if (err[0]) abort_comms(comm, n);
  (void)cudaGetLastError();
}

/* Background thread of one entry: destroys the entries evicted to make room
 * for it, then builds its communicators and publishes them (or the error). */
static void *nccl_build_main(void *arg) {
  cu_comm *m = arg;
  cu_backend *c = m->c;
  cu_nccl *x = c->nccl;
  pthread_mutex_lock(&x->mu);
  cu_comm *victims = m->victims;
  m->victims = NULL;
  pthread_mutex_unlock(&x->mu);
  comm_free_chain(victims);

  ncclComm_t comm[PD_MAX_DEVICES] = {0};
  char err[DEV_STATUS_MSG_MAX] = "";
  double t0 = now_s();
  build_comms(c, &m->set, comm, err, sizeof err);
  double ms = (now_s() - t0) * 1e3;

  pthread_rwlock_wrlock(&m->use);
  pthread_mutex_lock(&x->mu);
  if (err[0]) {
    snprintf(m->error, sizeof m->error, "%s", err);
    m->state = COMM_FAILED;
  } else {
    memcpy(m->comm, comm, sizeof comm);
    m->state = COMM_READY;
  }
  m->build_ms = ms;
  pthread_cond_broadcast(&x->cv);
  pthread_mutex_unlock(&x->mu);
  pthread_rwlock_unlock(&m->use);
  return NULL;
}

/* Starts building m's communicators; under x->mu, m not being built. */
static void nccl_start(cu_backend *c, cu_comm *m) {
  if (m->thread_live) /* finished: its state says so */
    pthread_join(m->thread, NULL);
  m->thread_live = false;
  if (atomic_load(&c->nccl->stop)) {
    m->state = COMM_FAILED;
    snprintf(m->error, sizeof m->error, "the backend is shutting down");
    return;
  }
  m->state = COMM_INIT;
  m->builds++;
  if (pthread_create(&m->thread, NULL, nccl_build_main, m) == 0) {
    m->thread_live = true;
  } else {
    m->state = COMM_FAILED;
    snprintf(m->error, sizeof m->error,
             "could not start the thread that builds the communicators");
  }
}

/* Makes room for one more entry, under x->mu: takes the least recently
 * acquired entries that no collective holds and that are not being built
 * out of the cache, onto `into`'s victims (its builder destroys them, so
 * this never waits for NCCL). When every entry is held or being built the
 * cache stays over its bound until one is free. */
static void evict_for(cu_nccl *x, cu_comm *into) {
  while (x->count >= CU_COMM_CACHE_MAX) {
    cu_comm **pick = NULL;
    for (cu_comm **pp = &x->head; *pp; pp = &(*pp)->next)
      if ((*pp)->refs == 0 && (*pp)->state != COMM_INIT) pick = pp;
    if (!pick) return;
    cu_comm *v = *pick;
    *pick = v->next;
    x->count--;
    /* v's own victims (if its builder never started) go along. */
    cu_comm *tail = v;
    while (tail->victims) tail = tail->victims;
    tail->victims = into->victims;
    into->victims = v;
  }
}

cu_comm *cu_nccl_acquire(cu_backend *c, const dev_devset *set) {
  cu_nccl *x = c->nccl;
  pthread_mutex_lock(&x->mu);
  cu_comm **pp = &x->head, *m = x->head;
  while (m && !dev_devset_equal(&m->set, set)) {
    pp = &m->next;
    m = m->next;
  }
  if (m) {
    *pp = m->next; /* to the front below */
  } else {
    m = calloc(1, sizeof *m);
    if (!m) {
      pthread_mutex_unlock(&x->mu);
      return NULL;
    }
    m->c = c;
    m->set = *set;
    m->build_ms = -1;
    pthread_rwlock_init(&m->use, NULL);
    evict_for(x, m);
    x->count++;
    nccl_start(c, m); /* in the background: the submitter goes on */
  }
  m->next = x->head;
  x->head = m;
  m->refs++;
  pthread_mutex_unlock(&x->mu);
  return m;
}

void cu_nccl_release(cu_backend *c, cu_comm *m) {
  cu_nccl *x = c->nccl;
  pthread_mutex_lock(&x->mu);
  m->refs--;
  pthread_mutex_unlock(&x->mu);
}

/* Aborts the communicators of generation `gen` (if still the current ones)
 * and starts building the next in the background. */
static void nccl_abort(cu_backend *c, cu_comm *m, uint64_t gen) {
  cu_nccl *x = c->nccl;
  pthread_rwlock_wrlock(&m->use);
  pthread_mutex_lock(&x->mu);
  if (m->generation == gen && m->state == COMM_READY) {
    abort_comms(m->comm, m->set.n);
    m->generation++;
    (void)cudaGetLastError();
    nccl_start(c, m);
  }
  pthread_mutex_unlock(&x->mu);
  pthread_rwlock_unlock(&m->use);
}

/* Run by the last device to arrive: makes sure the set's communicators exist
 * (rebuilding failed ones) and waits for them, bounded by the timeout. */
void cu_nccl_decide(cu_coll *k, void *arg) {
  cu_backend *c = arg;
  cu_nccl *x = c->nccl;
  cu_comm *m = k->comm;
  if (k->failed) return;
  char sn[DEV_STATUS_MSG_MAX / 2];
  pthread_mutex_lock(&x->mu);
  if (m->state == COMM_FAILED) nccl_start(c, m);
  double deadline = now_s() + c->coll_timeout_ms / 1000.0;
  struct timespec ts = {(time_t)deadline,
                        (long)((deadline - (double)(time_t)deadline) * 1e9)};
  while (m->state == COMM_INIT)
    if (pthread_cond_timedwait(&x->cv, &x->mu, &ts) == ETIMEDOUT) break;
  if (m->state == COMM_READY) {
    k->comm_ok = true;
    k->comm_gen = m->generation;
  } else if (m->state == COMM_INIT) {
    dev_error(&k->comm_st, PD_DEADLINE_EXCEEDED,
              "the NCCL communicators of devices %s are still being built "
              "after %d ms",
              set_name(c, &m->set, sn, sizeof sn), c->coll_timeout_ms);
  } else {
    dev_error(&k->comm_st, PD_UNAVAILABLE,
              "the NCCL communicators of devices %s could not be built: %s",
              set_name(c, &m->set, sn, sizeof sn), m->error);
  }
  pthread_mutex_unlock(&x->mu);
}

int cu_nccl_stats(cu_backend *c, dev_cuda_comm_info *out, int max) {
  cu_nccl *x = c->nccl;
  if (!x) return 0;
  pthread_mutex_lock(&x->mu);
  int i = 0;
  for (cu_comm *m = x->head; m; m = m->next, i++)
    if (i < max && out) {
      dev_cuda_comm_info *o = &out[i];
      memset(o, 0, sizeof *o);
      o->set = m->set;
      o->state = m->state == COMM_READY ? 1 : m->state == COMM_FAILED ? 2 : 0;
      o->build_ms = m->build_ms;
      o->builds = m->builds;
      o->refs = m->refs;
    }
  pthread_mutex_unlock(&x->mu);
  return i;
}

static bool nccl_type(pd_dtype dt, ncclDataType_t *t) {
  switch (dt) {
    case PD_FLOAT32: *t = ncclFloat32; return true;
    case PD_FLOAT64: *t = ncclFloat64; return true;
    case PD_FLOAT16: *t = ncclFloat16; return true;
    case PD_BFLOAT16: *t = ncclBfloat16; return true;
    case PD_INT32: *t = ncclInt32; return true;
    case PD_INT64: *t = ncclInt64; return true;
    case PD_UINT8:
    case PD_BOOL: *t = ncclUint8; return true;
    default: return false;
  }
}

/* NCCL's op for a reduction: mean is a sum divided afterwards (so integer
 * means truncate as the CPU backend's); bool or/and are max/min of 0/1. */
static ncclRedOp_t nccl_op(pd_dtype dt, int red) {
  if (dt == PD_BOOL)
    return red == DEV_RED_PROD || red == DEV_RED_MIN ? ncclMin : ncclMax;
  switch (red) {
    case DEV_RED_PROD: return ncclProd;
    case DEV_RED_MAX: return ncclMax;
    case DEV_RED_MIN: return ncclMin;
    default: return ncclSum;
  }
}

/* False where NCCL's reduction gives other values than the CPU collectives
 * (device/cpu/collective.c), which such reductions then match by gathering
 * every input and reducing locally (dev_cuda_coll_reduce):
 *  - float max/min: NCCL takes fmaxf/fminf (__hmax/__hmin for 16 bits),
 *    which drop a NaN; the CPU propagates it.
 *  - uint8 and int32 mean: NCCL's sum wraps in the dtype before the divide;
 *    the CPU sums in 64 bits (int64 wraps in both).
 * Float sums and products keep NCCL's ring order and, for 16-bit types, its
 * 16-bit arithmetic: the result differs from the CPU's in rounding only. */
static bool nccl_matches_cpu(pd_dtype dt, int red) {
  if ((red == DEV_RED_MAX || red == DEV_RED_MIN) && dev_dtype_is_floating(dt))
    return false;
  if (red == DEV_RED_MEAN && (dt == PD_UINT8 || dt == PD_INT32)) return false;
  return true;
}

/* Issues one NCCL call; a failure lands in err (DEV_STATUS_MSG_MAX bytes),
 * the first one wins. */
#define NCCL_ISSUE(CALL)                                                       \
  do {                                                                         \
    ncclResult_t nr_ = (CALL);                                                 \
    if (nr_ != ncclSuccess && nr_ != ncclInProgress && !err[0])                \
      snprintf(err, DEV_STATUS_MSG_MAX, "%s: %s (%s)", #CALL,                  \
               ncclGetErrorString(nr_), ncclGetLastError(comm));               \
  } while (0)

/* One device's part of an NCCL collective, as cu_nccl_run's steps share it. */
typedef struct nccl_part {
  cu_backend *c;
  cu_coll *k;
  dev_kernel_ctx *ctx;
  cu_device *dev;
  ncclComm_t comm;
  pd_dtype dt;
  size_t es;
  ncclDataType_t type;
  int red;
  bool gather; /* gather every input into tmp, then reduce here */
  void *tmp;   /* device scratch (gather, or an inner-axis AllGather) */
  size_t tmp_bytes;
  int64_t post_count; /* elements of out to divide (mean) or normalize (bool) */
} nccl_part;

/* Allocates the part's scratch: every input for a gathering reduction, or
 * the gathered parts of an AllGather along an inner axis. */
static pd_code alloc_scratch(nccl_part *q, dev_status *st) {
  dev_backend *b = &q->c->base;
  cu_coll *k = q->k;
  const int d = q->ctx->device, r = cu_coll_rank(k, q->ctx), n = k->n;
  if (q->gather) {
    q->tmp_bytes = (size_t)n * (size_t)cu_coll_elems(&k->in_shape[r]) * q->es;
    PD_TRY(b->allocate(b, d, q->tmp_bytes, &q->tmp, st));
  }
  if (q->ctx->num_outputs > 0 && k->kind == DEV_COLL_ALL_GATHER) {
    /* A gather along an inner axis lands in a temporary buffer first. */
    int axis = (int)q->ctx->attrs[0].u.i;
    if (axis < 0) axis += k->in_shape[0].rank;
    int64_t outer = 1;
    for (int i = 0; i < axis; i++) outer *= k->in_shape[0].dims[i];
    if (outer > 1) {
      for (int p = 0; p < n; p++)
        q->tmp_bytes += (size_t)cu_coll_elems(&k->in_shape[p]) * q->es;
      PD_TRY(b->allocate(b, d, q->tmp_bytes, &q->tmp, st));
    }
  }
  return PD_OK;
}

/* Issues the part's NCCL calls in one group on the device's stream. */
static void issue(nccl_part *q, char *err) {
  cu_coll *k = q->k;
  dev_kernel_ctx *ctx = q->ctx;
  cu_device *dev = q->dev;
  ncclComm_t comm = q->comm;
  const int r = cu_coll_rank(k, ctx), n = k->n; /* k's arrays are by rank */
  const pd_dtype dt = q->dt;
  const int red = q->red;
  const ncclDataType_t type = q->type;
  void *tmp = q->tmp;
  const dev_shape *s = &k->in_shape[r];
  NCCL_ISSUE(ncclGroupStart());
  switch (k->kind) {
    case DEV_COLL_ALL_REDUCE: {
      int64_t count = cu_coll_elems(s);
      if (q->gather) {
        NCCL_ISSUE(ncclAllGather(k->in[r], tmp, (size_t)count, type, comm,
                                 dev->stream));
        break;
      }
      NCCL_ISSUE(ncclAllReduce(k->in[r], k->out[r], (size_t)count, type,
                               nccl_op(dt, red), comm, dev->stream));
      q->post_count = count;
      break;
    }
    case DEV_COLL_BROADCAST: {
      int root = (int)ctx->attrs[0].u.i;
      NCCL_ISSUE(ncclBroadcast(k->in[r], k->out[r],
                               (size_t)cu_coll_elems(&k->in_shape[root]), type,
                               root, comm, dev->stream));
      break;
    }
    case DEV_COLL_ALL_GATHER: {
      bool equal = true;
      for (int p = 1; p < n; p++)
        equal &=
            cu_coll_elems(&k->in_shape[p]) == cu_coll_elems(&k->in_shape[0]);
      if (equal) { /* into place, or into tmp for an inner axis */
        NCCL_ISSUE(ncclAllGather(k->in[r], tmp ? tmp : k->out[r],
                                 (size_t)cu_coll_elems(s), type, comm,
                                 dev->stream));
      } else { /* uneven parts: one broadcast from each rank */
        char *base = tmp ? tmp : k->out[r];
        size_t off = 0;
        for (int p = 0; p < n; p++) {
          int64_t cnt = cu_coll_elems(&k->in_shape[p]);
          NCCL_ISSUE(ncclBroadcast(k->in[r], base + off, (size_t)cnt, type, p,
                                   comm, dev->stream));
          off += (size_t)cnt * q->es;
        }
      }
      break;
    }
    case DEV_COLL_REDUCE_SCATTER: {
      int64_t rows = s->rank ? s->dims[0] : 1;
      int64_t row_elems = rows ? cu_coll_elems(s) / rows : 0;
      int64_t qq = rows / n, rem = rows % n;
      if (q->gather) {
        NCCL_ISSUE(ncclAllGather(k->in[r], tmp, (size_t)cu_coll_elems(s), type,
                                 comm, dev->stream));
        break;
      }
      if (rem == 0) {
        NCCL_ISSUE(ncclReduceScatter(k->in[r], k->out[r],
                                     (size_t)(qq * row_elems), type,
                                     nccl_op(dt, red), comm, dev->stream));
      } else { /* uneven shards: a reduce to each rank of its rows */
        for (int p = 0; p < n; p++) {
          int64_t first = p * qq + (p < rem ? p : rem),
                  mine = qq + (p < rem ? 1 : 0);
          NCCL_ISSUE(ncclReduce(
              (const char *)k->in[r] + first * row_elems * (int64_t)q->es,
              k->out[r], (size_t)(mine * row_elems), type, nccl_op(dt, red), p,
              comm, dev->stream));
        }
      }
      int64_t mine = qq + (r < rem ? 1 : 0);
      q->post_count = mine * row_elems;
      break;
    }
    case DEV_COLL_NONE: break;
  }
  NCCL_ISSUE(ncclGroupEnd());
}

/* Waits until the non-blocking communicator has enqueued the calls (they
 * may still be being enqueued after ncclGroupEnd), with the collective's
 * deadline; a failure, a peer's failure or the deadline lands in err. */
static void wait_enqueued(nccl_part *q, char *err) {
  ncclComm_t comm = q->comm;
  double deadline = now_s() + q->c->coll_timeout_ms / 1000.0;
  for (int spin = 0; !err[0];) {
    ncclResult_t s2 = ncclSuccess;
    NCCL_ISSUE(ncclCommGetAsyncError(comm, &s2));
    if (s2 == ncclSuccess) break;
    if (s2 != ncclInProgress) {
      snprintf(err, DEV_STATUS_MSG_MAX, "%s (%s)", ncclGetErrorString(s2),
               ncclGetLastError(comm));
      break;
    }
    /* A peer that failed before issuing its part never will: without this,
     * its abort would wait for our read lock until the deadline. */
    if (cu_coll_peer_failed(q->k)) {
      snprintf(err, DEV_STATUS_MSG_MAX,
               "cancelled because another device failed");
      break;
    }
    if (now_s() > deadline)
      snprintf(err, DEV_STATUS_MSG_MAX,
               "enqueueing the calls did not finish in %d ms",
               q->c->coll_timeout_ms);
    backoff(&spin);
  }
}

/* After the NCCL calls, on the device's stream: the local reduction of a
 * gathering one, the interleaving of an inner-axis AllGather, the mean's
 * divide or bool's normalization, then the event the wait watches. */
static cudaError_t post_process(nccl_part *q) {
  cu_coll *k = q->k;
  const int d = q->ctx->device, r = cu_coll_rank(k, q->ctx), n = k->n;
  const dev_shape *s = &k->in_shape[r];
  const size_t es = q->es;
  cu_device *dev = q->dev;
  cudaError_t ce = cudaSuccess;
  if (q->gather) { /* every input is in tmp, in rank order */
    const void *parts[PD_MAX_DEVICES];
    const int64_t count = cu_coll_elems(s);
    for (int p = 0; p < n; p++)
      parts[p] = (const char *)q->tmp + (size_t)(p * count) * es;
    int64_t off = 0, cnt = count;
    if (k->kind == DEV_COLL_REDUCE_SCATTER) {
      int64_t rows = s->dims[0], row_elems = rows ? count / rows : 0;
      int64_t qq = rows / n, rem = rows % n;
      off = (r * qq + (r < rem ? r : rem)) * row_elems;
      cnt = (qq + (r < rem ? 1 : 0)) * row_elems;
    }
    ce = dev_cuda_coll_reduce(q->dt, q->red, n, parts, off, k->out[r], cnt,
                              dev->stream);
  }
  if (k->kind == DEV_COLL_ALL_GATHER && q->tmp) {
    /* Interleave the parts: [outer, rows_p, inner] each, concatenated on the
     * axis. */
    int axis = (int)q->ctx->attrs[0].u.i;
    if (axis < 0) axis += s->rank;
    int64_t outer = 1, inner = (int64_t)es, out_rows = 0;
    for (int i = 0; i < axis; i++) outer *= s->dims[i];
    for (int i = axis + 1; i < s->rank; i++) inner *= s->dims[i];
    for (int p = 0; p < n; p++) out_rows += k->in_shape[p].dims[axis];
    size_t off = 0;
    int64_t row = 0;
    for (int p = 0; p < n && ce == cudaSuccess; p++) {
      int64_t rows = k->in_shape[p].dims[axis];
      size_t w = (size_t)(rows * inner);
      ce = cu_copy_rows(q->c, d, (char *)k->out[r] + row * inner,
                        (size_t)(out_rows * inner), d, (char *)q->tmp + off, w,
                        w, (size_t)outer, dev->stream);
      off += (size_t)cu_coll_elems(&k->in_shape[p]) * es;
      row += rows;
    }
  }
  if (ce == cudaSuccess && q->post_count > 0) {
    if (q->dt == PD_BOOL)
      ce = dev_cuda_bool_normalize(k->out[r], q->post_count, dev->stream);
    else if (q->red == DEV_RED_MEAN)
      ce = dev_cuda_div_by(q->dt, k->out[r], q->post_count, n, dev->stream);
  }
  if (ce == cudaSuccess) ce = cudaEventRecord(dev->coll_ev[0], dev->stream);
  return ce;
}

/* Waits for the part to complete on the device, bounded, watching for NCCL
 * errors (into err) and for an abort by a peer. */
static pd_code wait_done(nccl_part *q, char *err, dev_status *st) {
  cu_backend *c = q->c;
  cu_comm *m = q->k->comm;
  dev_backend *b = &c->base;
  const int d = q->ctx->device;
  cu_device *dev = q->dev;
  ncclComm_t comm = q->comm;
  double deadline = now_s() + c->coll_timeout_ms / 1000.0;
  for (int spin = 0; !err[0];) {
    cudaError_t qe = cudaEventQuery(dev->coll_ev[0]);
    if (qe == cudaSuccess) break;
    if (qe != cudaErrorNotReady)
      return dev_cuda_fail(b, d, qe, "cudaEventQuery(collective)", st);
    pthread_rwlock_rdlock(&m->use);
    if (m->generation != q->k->comm_gen) {
      pthread_rwlock_unlock(&m->use);
      return dev_error(st, PD_ABORTED,
                       "%s on %s: the NCCL communicator was aborted",
                       q->ctx->op->name, dev->name);
    }
    ncclResult_t as = ncclSuccess;
    ncclResult_t gr = ncclCommGetAsyncError(comm, &as);
    if (gr != ncclSuccess || (as != ncclSuccess && as != ncclInProgress))
      snprintf(err, DEV_STATUS_MSG_MAX, "%s (%s)",
               ncclGetErrorString(gr != ncclSuccess ? gr : as),
               ncclGetLastError(comm));
    pthread_rwlock_unlock(&m->use);
    if (!err[0] &&
        cu_coll_peer_failed(
            q->k)) /* its part may never run: ours would wait forever */
      snprintf(err, DEV_STATUS_MSG_MAX,
               "cancelled because another device failed");
    if (!err[0] && now_s() > deadline)
      snprintf(err, DEV_STATUS_MSG_MAX,
               "timed out after %d ms (a peer may be stuck)",
               c->coll_timeout_ms);
    backoff(&spin);
  }
  return PD_OK;
}

/* Issues device d's part on its stream and waits for it. */
pd_code cu_nccl_run(cu_backend *c, cu_coll *k, dev_kernel_ctx *ctx,
                    dev_status *st) {
  dev_backend *b = &c->base;
  cu_comm *m = k->comm;
  const int d = ctx->device, r = cu_coll_rank(k, ctx);
  nccl_part q = {
      .c = c, .k = k, .ctx = ctx, .dev = &c->devs[d], .dt = ctx->in_dtype[0]};
  q.es = pd_dtype_size(q.dt);
  char err[DEV_STATUS_MSG_MAX] = "";
  if (!nccl_type(q.dt, &q.type))
    return dev_error(st, PD_INTERNAL, "%s: dtype %s has no NCCL type",
                     ctx->op->name, pd_dtype_name(q.dt));
  const bool reducing =
      k->kind == DEV_COLL_ALL_REDUCE || k->kind == DEV_COLL_REDUCE_SCATTER;
  q.red = reducing ? cu_coll_reduction(ctx) : DEV_RED_SUM;
  /* Gather every input, then reduce here, where NCCL's own reduction would
   * differ from the CPU's (also on a mesh of one, where it is cheap, so that
   * one GPU tests this path). */
  q.gather = reducing && !nccl_matches_cpu(q.dt, q.red);
  PD_TRY(alloc_scratch(&q, st));

  pthread_rwlock_rdlock(&m->use);
  if (m->generation != k->comm_gen || !m->comm[r]) {
    pthread_rwlock_unlock(&m->use);
    if (q.tmp) b->deallocate(b, d, q.tmp, q.tmp_bytes);
    return dev_error(st, PD_ABORTED,
                     "%s on %s: the NCCL communicator was aborted by a failure "
                     "in another collective",
                     ctx->op->name, q.dev->name);
  }
  q.comm = m->comm[r];
  issue(&q, err);
  wait_enqueued(&q, err);
  pthread_rwlock_unlock(&m->use);

  pd_code rc = PD_OK;
  cudaError_t ce = err[0] ? cudaSuccess : post_process(&q);
  if (ce != cudaSuccess)
    rc = dev_cuda_fail(b, d, ce, "collective post-processing", st);
  if (q.tmp) b->deallocate(b, d, q.tmp, q.tmp_bytes); /* stream-ordered */
  if (rc == PD_OK) rc = wait_done(&q, err, st);
  if (err[0]) {
    rc = dev_error(st, PD_UNAVAILABLE,
                   "%s on %s: NCCL: %s; the communicator is aborted and "
                   "rebuilt",
                   ctx->op->name, q.dev->name, err);
    cu_coll_run_failed(k, d, st); /* the cause, before peers see the abort */
    nccl_abort(c, m, k->comm_gen);
  }
  return rc;
}

pd_code cu_nccl_init(cu_backend *c, dev_status *st) {
  cu_nccl *x = calloc(1, sizeof *x);
  if (!x) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  pthread_mutex_init(&x->mu, NULL);
  pthread_condattr_t ca; /* deadlines are CLOCK_MONOTONIC (now_s) */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&x->cv, &ca);
  pthread_condattr_destroy(&ca);
  c->nccl = x;
  /* The whole mesh's communicators, in the background (creation returns
   * now), held for the backend's lifetime: never evicted. */
  dev_devset all = {.n = c->base.num_devices};
  for (int i = 0; i < all.n; i++) all.dev[i] = (uint8_t)i;
  x->mesh = cu_nccl_acquire(c, &all);
  if (!x->mesh) {
    cu_nccl_destroy(c);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  return PD_OK;
}

void cu_nccl_destroy(cu_backend *c) {
  cu_nccl *x = c->nccl;
  pthread_mutex_lock(&x->mu);
  atomic_store(&x->stop, true); /* builders give up at their next poll */
  cu_comm *m = x->head;
  x->head = NULL;
  pthread_mutex_unlock(&x->mu);
  /* Streams were drained by the engine and every collective released. */
  while (m) {
    cu_comm *next = m->next;
    comm_free_chain(m);
    m = next;
  }
  pthread_cond_destroy(&x->cv);
  pthread_mutex_destroy(&x->mu);
  free(x);
  c->nccl = NULL;
}

#else /* !PARADEV_HAVE_NCCL */

struct cu_nccl {
  int unused;
};

#endif
