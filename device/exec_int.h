/* Private header of the engine's executor files (engine.c, exec.c,
 * complete.c, ready.c): the per-device executor, its completion queue for
 * backends with fences, and the per-device readiness that waits and
 * notifications read. Not for kernels, backends or other layers.
 *
 * Lock: each device has one mutex, dev_exec.mu. It guards the executor's
 * op ring and stop flag, the completion queue (fring, outstanding, pushed),
 * the device's notify list and done_cv (dev__ready, which borrows the same
 * mutex), and the codes of components that the completion thread may still
 * set late. Nothing is ever taken under it except the engine's submit_mu,
 * which is taken first (dev_op_submit: submit_mu, then each device's mu). */
#ifndef PARADEV_EXEC_INT_H
#define PARADEV_EXEC_INT_H

#include <time.h>

#include "device_int.h"

/* --- readiness (ready.c) ------------------------------------------------- */

typedef struct dev__waiter dev__waiter;

/* How far one device has finished, and who waits for it. */
typedef struct dev__ready {
  pthread_mutex_t *mu;       /* the device's mutex (dev_exec.mu) */
  pthread_cond_t done_cv;    /* CLOCK_MONOTONIC, for deadlines */
  _Atomic uint64_t done_seq; /* largest op seq the device has finished */
  atomic_int waiters;        /* threads blocked on done_cv */
  /* Under *mu, ascending by seq: ops finish in seq order, so waiters are
   * only ever taken from the head (a pipelining client can have an op's
   * worth of waiters for every op it queued ahead, so walking them all per
   * op would be quadratic). */
  dev__waiter *notify, *notify_tail;
  atomic_int notify_count;
} dev__ready;

/* Sets up `r` over the device's mutex `mu`; dev__ready_destroy undoes it. */
void dev__ready_init(dev__ready *r, pthread_mutex_t *mu);
void dev__ready_destroy(dev__ready *r);

/* Publishes that the device has finished op `seq` (after the caller dropped
 * its hold on the op): advances done_seq, wakes waiters and fires the notify
 * callbacks of tensors now ready. Called by the executor (no fences) or the
 * completion thread, never under *mu. */
void dev__ready_publish(dev__ready *r, uint64_t seq);

/* --- executor (exec.c) --------------------------------------------------- */

/* Where device d adds its time of `op` (dev_op_set_time_sink), or NULL.
 * Only a device holding a component of output 0 adds: the sink's owner may
 * free it as soon as output 0 is ready (the scheduler frees its queued op
 * in a notify on output 0), and a device without such a component may run
 * its part later than that (ParallelUnpack's devices past output 0's; a
 * source-only device of CopyToDevices, whose destinations wait only for
 * the source's producer). Ordinary ops have every output on the op's set,
 * so every device adds. */
static inline uint64_t *dev__op_time_sink(const dev_op *op, int d) {
  if (!op->time_sink) return NULL;
  if (op->num_outputs > 0 && dev__slot(op->outputs[0], d) < 0) return NULL;
  return op->time_sink;
}

/* Inputs of an issued op that were still in flight on the device when it was
 * issued, as the seqs of the ops producing them. */
#define DEV_INLINE_DEPS 4

/* One op issued on a fenced device, waiting for the device to finish it. */
typedef struct dev_inflight {
  dev_op *op;
  void *fence;      /* NULL: the op issued no work (it failed, or aliases) */
  uint64_t t_issue; /* when the executor began issuing it (ns) */
  int ndeps;
  uint64_t dep[DEV_INLINE_DEPS];
  uint64_t *more_deps; /* all ndeps of them when ndeps > DEV_INLINE_DEPS */
} dev_inflight;

/* An op whose outputs on a device failed after it was issued. */
typedef struct dev_late {
  uint64_t seq;
  uint64_t horizon; /* ops pushed before this one may consume its outputs */
  pd_code code;
  char *msg;
} dev_late;

typedef struct dev_exec {
  dev_engine *engine;
  int device;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;
  dev_op **ring;
  size_t cap, head, count;
  bool stop;
  bool sleeping; /* waiting on work_cv: only then does a push signal it */
  dev__ready ready;
  _Atomic uint64_t busy_ns; /* dev_engine_busy_seconds */
  /* For dev_engine_watch (ready.c), lock-free so that a wedged executor
   * cannot block the watcher: the seq of the op the executor began last
   * (stored before its kernel runs), and the heartbeats of running kernels
   * (dev_kernel_heartbeat, through dev_kernel_ctx.heartbeat). */
  _Atomic uint64_t run_seq;
  _Atomic uint64_t beats;
  /* The seq of the last op pushed to this device (written under the
   * engine's submit_mu; read lock-free by dev_engine_watch and
   * dev_engine_sync): ops of sets without this device never reach it. */
  _Atomic uint64_t pushed_seq;
  /* Backends with fences only. Under mu: fring holds the ops issued on the
   * device whose fence the completion thread has not yet taken, in issue
   * order; `outstanding` counts the ops pushed to this device that are not
   * yet taken by the completion thread, so that submission keeps room in
   * fring for every one of them (the executor never allocates there);
   * `pushed` counts the ops ever put in fring. */
  bool fenced;
  bool completer_started;
  pthread_t completer;
  pthread_cond_t fence_cv;
  dev_inflight *fring;
  size_t fcap, fhead, fcount, outstanding;
  uint64_t pushed;
  bool fstop, fsleeping;
  /* Completion thread only: ops whose outputs failed late (after ops that
   * consume them may have been issued), kept until every op issued before
   * the failure was published has completed; and how many ops completed. */
  dev_late *late;
  int nlate, late_cap;
  uint64_t completed;
  uint64_t last_done_ns; /* when the previous op finished (busy time) */
  /* Under mu: components of this device to free because a peer's component
   * of the same output failed (release.c), taken by the executor between
   * ops; and the test hook's hold (dev__exec_hold): the executor runs
   * nothing while it is set. */
  struct dev__released *released;
  bool held;
} dev_exec;

/* One component of a failed op's output to free on its device. */
typedef struct dev__released {
  dev_tensor *t; /* a reference */
  pd_code code;
  struct dev__released *next;
} dev__released;

/* The executor thread of one device (pthread start routine; arg: dev_exec). */
void *dev__exec_main(void *arg);

/* Makes room in x's ring (and, with fences, its completion queue) for n
 * more ops; called under the engine's submit lock, so the room stays (the
 * executor only removes ops). False on host out of memory. */
bool dev__exec_reserve_n(dev_exec *x, size_t n);

/* Appends ops[0..n) to x's ring (room reserved) under one lock, with at most
 * one wake-up (only when the executor sleeps); dev_op_submit_batch. */
void dev__exec_push_n(dev_exec *x, dev_op *const *ops, size_t n);

/* --- release after failure (release.c) ---------------------------------- */

/* Called once every device has run (issued) `op`: when one device's
 * component of an output failed, queues the output's other components that
 * hold a buffer for freeing on their own devices (each device's executor
 * frees its own, between ops, so no op reading it is running), with the
 * failure's code; their message then names the failed component. A failed
 * op thus holds no memory on any device. On host out of memory the buffers
 * stay until the tensor is released. With fences (complete.c) only when an
 * output could not be allocated (op->issue_failed): after other failures
 * (late ones, failed inputs) each device's component stands on its own
 * (tests/unit/test_fence.c relies on it). The freed components take the
 * failed one's code and message, so waits report the root cause. */
void dev__exec_release_failed(dev_engine *e, dev_op *op);

/* The executor's side: frees the components queued for x (x->mu held on
 * entry and on return; dropped while freeing). */
void dev__exec_drain_released(dev_exec *x);

/* --- completion (complete.c) --------------------------------------------- */

/* Records the fence of an op the executor has just issued (issued: its work
 * reached the device) and queues it for the completion thread, with the
 * seqs of the in-flight ops it read from (deps[0..ndeps)). */
void dev__complete_queue(dev_exec *x, dev_op *op, bool issued, uint64_t t0,
                         const uint64_t *deps, int ndeps);

/* The completion thread of one fenced device (arg: dev_exec). */
void *dev__complete_main(void *arg);

/* Nanoseconds on CLOCK_MONOTONIC (busy time). */
static inline uint64_t dev__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif /* PARADEV_EXEC_INT_H */
