/* The NCCL path of the CUDA collectives, when every mesh entry is a distinct
 * GPU: one communicator per mesh, created non-blocking in the background;
 * each device issues its rank's calls in a group on its stream and waits with
 * a deadline, polling the communicator's asynchronous error; on an error or a
 * timeout the communicator is aborted and rebuilt (collective.c's opening
 * comment has the whole story). Empty without PARADEV_HAVE_NCCL. */
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

enum { COMM_IDLE, COMM_INIT, COMM_READY, COMM_FAILED };

struct cu_nccl {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state;
  char error[DEV_STATUS_MSG_MAX];
  ncclComm_t comm[PD_MAX_DEVICES];
  uint64_t generation; /* bumped when the communicator is aborted */
  pthread_t thread;
  bool thread_live; /* a thread to join */
  atomic_bool stop; /* read by the init thread without mu */
  /* Readers use comm[] (ncclCommGetAsyncError, issuing ops); the writer
   * aborts and clears it. */
  pthread_rwlock_t use;
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

/* Background thread: builds the communicator of the whole mesh, one rank per
 * device, non-blocking, and polls it until ready, failed or past the
 * deadline. */
static void *nccl_init_main(void *arg) {
  cu_backend *c = arg;
  cu_nccl *x = c->nccl;
  const int n = c->base.num_devices;
  ncclComm_t comm[PD_MAX_DEVICES] = {0};
  char err[DEV_STATUS_MSG_MAX] = "";
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    snprintf(err, sizeof err, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    goto done;
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  r = ncclGroupStart();
  for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
    if (cudaSetDevice(c->devs[i].ordinal) != cudaSuccess) {
      snprintf(err, sizeof err, "cudaSetDevice(%d): %s", c->devs[i].ordinal,
               cudaGetErrorString(cudaGetLastError()));
      break;
    }
    r = ncclCommInitRankConfig(&comm[i], n, id, i, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      snprintf(err, sizeof err, "ncclCommInitRankConfig(rank %d, %s): %s", i,
               c->devs[i].name, ncclGetErrorString(r));
  }
  ncclResult_t ge = ncclGroupEnd();
  if (!err[0] && ge != ncclSuccess && ge != ncclInProgress)
    snprintf(err, sizeof err, "ncclGroupEnd: %s", ncclGetErrorString(ge));
  double deadline = now_s() + c->coll_timeout_ms / 1000.0;
  for (int i = 0, k = 0; !err[0] && i < n;) {
    ncclResult_t s = ncclSuccess;
    r = ncclCommGetAsyncError(comm[i], &s);
    if (r != ncclSuccess || (s != ncclSuccess && s != ncclInProgress)) {
      snprintf(err, sizeof err, "communicator of %s: %s (%s)", c->devs[i].name,
               ncclGetErrorString(r != ncclSuccess ? r : s),
               ncclGetLastError(comm[i]));
    } else if (s == ncclSuccess) {
      i++;
    } else if (atomic_load(&x->stop)) {
      snprintf(err, sizeof err, "the backend is shutting down");
    } else if (now_s() > deadline) {
      snprintf(err, sizeof err,
               "ncclCommInitRankConfig did not finish in %d ms",
               c->coll_timeout_ms);
    } else {
      backoff(&k);
    }
  }
done:
  if (err[0]) abort_comms(comm, n);
  (void)cudaGetLastError();
  pthread_mutex_lock(&x->mu);
  if (err[0]) {
    snprintf(x->error, sizeof x->error, "%s", err);
    x->state = COMM_FAILED;
  } else {
    memcpy(x->comm, comm, sizeof comm);
    x->state = COMM_READY;
  }
  pthread_cond_broadcast(&x->cv);
  pthread_mutex_unlock(&x->mu);
  return NULL;
}

/* Starts building a communicator; under x->mu, state IDLE or FAILED. */
static void nccl_start(cu_backend *c) {
  cu_nccl *x = c->nccl;
  if (x->thread_live)
    pthread_join(x->thread, NULL); /* finished: state says so */
  x->thread_live = false;
  x->state = COMM_INIT;
  if (pthread_create(&x->thread, NULL, nccl_init_main, c) == 0) {
    x->thread_live = true;
  } else {
    x->state = COMM_FAILED;
    snprintf(x->error, sizeof x->error,
             "could not start the thread that builds the communicator");
  }
}

/* Aborts the communicator of generation `gen` (if it is still the current
 * one) and starts building the next. `why` goes into the error of those who
 * wait for it. */
static void nccl_abort(cu_backend *c, uint64_t gen) {
  cu_nccl *x = c->nccl;
  pthread_rwlock_wrlock(&x->use);
  pthread_mutex_lock(&x->mu);
  if (x->generation == gen && x->state == COMM_READY) {
    abort_comms(x->comm, c->base.num_devices);
    x->generation++;
    (void)cudaGetLastError();
    if (!atomic_load(&x->stop)) nccl_start(c);
  }
  pthread_mutex_unlock(&x->mu);
  pthread_rwlock_unlock(&x->use);
}

/* Run by the last device to arrive: makes sure a communicator exists
 * (rebuilding a failed one) and waits for it, bounded by the timeout. */
void cu_nccl_decide(cu_coll *k, void *arg) {
  cu_backend *c = arg;
  cu_nccl *x = c->nccl;
  if (k->failed) return;
  pthread_mutex_lock(&x->mu);
  if (x->state == COMM_FAILED || x->state == COMM_IDLE) nccl_start(c);
  double deadline = now_s() + c->coll_timeout_ms / 1000.0;
  struct timespec ts = {(time_t)deadline,
                        (long)((deadline - (double)(time_t)deadline) * 1e9)};
  while (x->state == COMM_INIT)
    if (pthread_cond_timedwait(&x->cv, &x->mu, &ts) == ETIMEDOUT) break;
  if (x->state == COMM_READY) {
    k->comm_ok = true;
    k->comm_gen = x->generation;
  } else if (x->state == COMM_INIT) {
    dev_error(&k->comm_st, PD_DEADLINE_EXCEEDED,
              "the NCCL communicator is still being built after %d ms",
              c->coll_timeout_ms);
  } else {
    dev_error(&k->comm_st, PD_UNAVAILABLE,
              "the NCCL communicator could not be built: %s", x->error);
  }
  pthread_mutex_unlock(&x->mu);
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
  const int d = q->ctx->device, n = k->n;
  if (q->gather) {
    q->tmp_bytes = (size_t)n * (size_t)cu_coll_elems(&k->in_shape[d]) * q->es;
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
  const int d = ctx->device, n = k->n;
  const pd_dtype dt = q->dt;
  const int red = q->red;
  const ncclDataType_t type = q->type;
  void *tmp = q->tmp;
  const dev_shape *s = &k->in_shape[d];
  NCCL_ISSUE(ncclGroupStart());
  switch (k->kind) {
    case DEV_COLL_ALL_REDUCE: {
      int64_t count = cu_coll_elems(s);
      if (q->gather) {
        NCCL_ISSUE(ncclAllGather(k->in[d], tmp, (size_t)count, type, comm,
                                 dev->stream));
        break;
      }
      NCCL_ISSUE(ncclAllReduce(k->in[d], k->out[d], (size_t)count, type,
                               nccl_op(dt, red), comm, dev->stream));
      q->post_count = count;
      break;
    }
    case DEV_COLL_BROADCAST: {
      int root = (int)ctx->attrs[0].u.i;
      NCCL_ISSUE(ncclBroadcast(k->in[d], k->out[d],
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
        NCCL_ISSUE(ncclAllGather(k->in[d], tmp ? tmp : k->out[d],
                                 (size_t)cu_coll_elems(s), type, comm,
                                 dev->stream));
      } else { /* uneven parts: one broadcast from each rank */
        char *base = tmp ? tmp : k->out[d];
        size_t off = 0;
        for (int p = 0; p < n; p++) {
          int64_t cnt = cu_coll_elems(&k->in_shape[p]);
          NCCL_ISSUE(ncclBroadcast(k->in[d], base + off, (size_t)cnt, type, p,
                                   comm, dev->stream));
          off += (size_t)cnt * q->es;
        }
      }
      break;
    }
    case DEV_COLL_REDUCE_SCATTER: {
      int64_t rows = s->rank ? s->dims[0] : 1;
      int64_t row_elems = rows ? cu_coll_elems(s) / rows : 0;
      int64_t qq = rows / n, r = rows % n;
      if (q->gather) {
        NCCL_ISSUE(ncclAllGather(k->in[d], tmp, (size_t)cu_coll_elems(s), type,
                                 comm, dev->stream));
        break;
      }
      if (r == 0) {
        NCCL_ISSUE(ncclReduceScatter(k->in[d], k->out[d],
                                     (size_t)(qq * row_elems), type,
                                     nccl_op(dt, red), comm, dev->stream));
      } else { /* uneven shards: a reduce to each rank of its rows */
        for (int p = 0; p < n; p++) {
          int64_t first = p * qq + (p < r ? p : r), mine = qq + (p < r ? 1 : 0);
          NCCL_ISSUE(ncclReduce(
              (const char *)k->in[d] + first * row_elems * (int64_t)q->es,
              k->out[d], (size_t)(mine * row_elems), type, nccl_op(dt, red), p,
              comm, dev->stream));
        }
      }
      int64_t mine = qq + (d < r ? 1 : 0);
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
  const int d = q->ctx->device, n = k->n;
  const dev_shape *s = &k->in_shape[d];
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
      int64_t qq = rows / n, r = rows % n;
      off = (d * qq + (d < r ? d : r)) * row_elems;
      cnt = (qq + (d < r ? 1 : 0)) * row_elems;
    }
    ce = dev_cuda_coll_reduce(q->dt, q->red, n, parts, off, k->out[d], cnt,
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
      ce = cu_copy_rows(q->c, d, (char *)k->out[d] + row * inner,
                        (size_t)(out_rows * inner), d, (char *)q->tmp + off, w,
                        w, (size_t)outer, dev->stream);
      off += (size_t)cu_coll_elems(&k->in_shape[p]) * es;
      row += rows;
    }
  }
  if (ce == cudaSuccess && q->post_count > 0) {
    if (q->dt == PD_BOOL)
      ce = dev_cuda_bool_normalize(k->out[d], q->post_count, dev->stream);
    else if (q->red == DEV_RED_MEAN)
      ce = dev_cuda_div_by(q->dt, k->out[d], q->post_count, n, dev->stream);
  }
  if (ce == cudaSuccess) ce = cudaEventRecord(dev->coll_ev[0], dev->stream);
  return ce;
}

/* Waits for the part to complete on the device, bounded, watching for NCCL
 * errors (into err) and for an abort by a peer. */
static pd_code wait_done(nccl_part *q, char *err, dev_status *st) {
  cu_backend *c = q->c;
  cu_nccl *x = c->nccl;
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
    pthread_rwlock_rdlock(&x->use);
    if (x->generation != q->k->comm_gen) {
      pthread_rwlock_unlock(&x->use);
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
    pthread_rwlock_unlock(&x->use);
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
  cu_nccl *x = c->nccl;
  const int d = ctx->device;
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

  pthread_rwlock_rdlock(&x->use);
  if (x->generation != k->comm_gen || !x->comm[d]) {
    pthread_rwlock_unlock(&x->use);
    if (q.tmp) b->deallocate(b, d, q.tmp, q.tmp_bytes);
    return dev_error(st, PD_ABORTED,
                     "%s on %s: the NCCL communicator was aborted by a failure "
                     "in another collective",
                     ctx->op->name, q.dev->name);
  }
  q.comm = x->comm[d];
  issue(&q, err);
  wait_enqueued(&q, err);
  pthread_rwlock_unlock(&x->use);

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
    nccl_abort(c, k->comm_gen);
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
  pthread_rwlock_init(&x->use, NULL);
  c->nccl = x;
  pthread_mutex_lock(&x->mu);
  nccl_start(c); /* in the background: creation returns now */
  pthread_mutex_unlock(&x->mu);
  return PD_OK;
}

void cu_nccl_destroy(cu_backend *c) {
  cu_nccl *x = c->nccl;
  pthread_mutex_lock(&x->mu);
  atomic_store(&x->stop, true);
  pthread_mutex_unlock(&x->mu);
  if (x->thread_live) pthread_join(x->thread, NULL);
  /* Streams were drained by the engine; abort frees a healthy communicator
   * as well and never waits on a peer. */
  abort_comms(x->comm, c->base.num_devices);
  pthread_rwlock_destroy(&x->use);
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
