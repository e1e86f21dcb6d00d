/* The dispatcher: one thread that takes ops from the sessions' queues, in
 * the order the policy (sched_policy.h) picks sessions, submits them to the
 * engine and counts their completion; fence requests go out between turns.
 * It keeps no more than dispatch_ahead_ns of estimated device time on the
 * devices (and at least SCHED_AHEAD_MIN_OPS), so the order is decided here; each
 * completion gives its estimate back and corrects its session's charge by
 * the device time the executors measured (dev_op_set_time_sink).
 * A session whose next op reads a tensor still loading (a pending tensor,
 * loads.c) is held: it leaves the ready set until that tensor completes. An
 * op whose deadline passed while it was queued is dropped at its turn with
 * DEADLINE_EXCEEDED instead of being submitted (the lease thread's timer
 * drops the others, lease.c).
 *
 * Ops reach the engine from this thread, not straight from sched_execute's
 * caller (an RPC thread), even when nothing else is queued: dev_op_submit
 * wakes every device's executor, and a woken executor tends to preempt the
 * thread that woke it. Measured on 2 cores (bench_rpc, Enqueue ops/s over
 * EchoStream msgs/s in one run): submitting from the RPC thread took the
 * ratio from about 0.6 to 0.3; here those wake-ups land on a thread that no
 * client waits for. Where the rest of the time went (perf on the daemon
 * under bench_rpc, issue #15): about 40% of its CPU in the kernel's
 * context-switch and wake-up paths, under 5% in the scheduler's and
 * engine's own code. So a turn costs as few wake-ups as it can: the batch
 * goes out in one dev_op_submit_batch (one lock and at most one wake-up per
 * device, and none for an executor that is running), a completion takes no
 * lock unless sched_destroy waits, and the dispatcher, once woken, first
 * yields to the thread that woke it (it is about to send its reply, or to
 * queue the next streamed op, which then joins this batch): Execute p50
 * over Echo went from 1.17-1.27 to 1.04-1.07 and Enqueue over EchoStream
 * from 0.71-0.80 to about 0.89 (bench_rpc --quick, 3 runs each, same
 * machine). */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

/* Ops kept in flight whatever their cost: one running on each device and
 * two behind it, so a device has its next op while the dispatcher is slow
 * to wake (a loaded host) for up to two ops' time. */
#define SCHED_AHEAD_MIN_OPS 3

/* A device of `mask` holds at most half of dispatch_ahead_ns (or under the
 * minimum): a waiting dispatcher is woken only then, so it submits in
 * batches rather than one op per completion, and the half left covers its
 * wake-up. Per device (issue #17): a completion on [2, 3] wakes it for
 * work on [2, 3] whatever [0, 1] holds. */
static bool sched_ahead_low(sched *s, uint64_t mask) {
  uint64_t bound = SCHED_LIM(s, dispatch_ahead_ns);
  for (; mask; mask &= mask - 1) {
    int d = __builtin_ctzll(mask);
    if (atomic_load(&s->dev_inflight_ops[d]) < SCHED_AHEAD_MIN_OPS ||
        atomic_load(&s->dev_inflight_ns[d]) <= bound / 2)
      return true;
  }
  return false;
}

/* Counts (sign 1) or gives back (-1) an op's estimate and itself on each
 * device of `mask`. */
static void sched_ahead_count(sched *s, uint64_t mask, uint64_t est, int sign) {
  for (; mask; mask &= mask - 1) {
    int d = __builtin_ctzll(mask);
    if (sign > 0) {
      atomic_fetch_add(&s->dev_inflight_ns[d], est);
      atomic_fetch_add(&s->dev_inflight_ops[d], 1);
    } else {
      atomic_fetch_sub(&s->dev_inflight_ns[d], est);
      atomic_fetch_sub(&s->dev_inflight_ops[d], 1);
    }
  }
}

/* --- submission and completion (issue #15) --------------------------------
 * sched_submit_batch and sched_op_finish are the dispatcher's hot path: one
 * dev_op_submit_batch per turn (one lock and at most one wake-up per
 * device for the whole batch), and a completion that takes no lock unless
 * the dispatcher waits for dispatch-ahead room or sched_destroy waits for
 * it (done_waiting). */

/* Completion of a submitted op (on the executor that finished it last;
 * `timed`: every device has added its time to q->dev_ns): counted, its
 * session's charge corrected by the measured device time, and the
 * dispatch-ahead room given back (waking the dispatcher if it waits for it). */
static void sched_op_finish(sched_qop *q, pd_code code, bool timed) {
  sched *s = q->owner;
  uint64_t dev = sched_count_done(s, q, code, timed);
  sched_policy_correct(q->acct, (int64_t)dev - (int64_t)q->est_ns);
  sched_account_note_op(q->acct, dev);
  sched_account_put(q->acct);
  uint64_t devs = q->devs;
  sched_ahead_count(s, devs, q->est_ns, -1);
  if (atomic_load(&s->ahead_wait) && sched_ahead_low(s, devs)) {
    pthread_mutex_lock(&s->qmu);
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
  }
  sched_qop_free(s, q);
  /* The count is the last touch of s: once it reaches n_submitted,
   * sched_destroy may free s. While it waits, the count moves under
   * done_mu and wakes it; a completion that saw it not waiting yet moves
   * the count alone, which sched_destroy's timed wait picks up. */
  if (atomic_load(&s->done_waiting)) {
    pthread_mutex_lock(&s->done_mu);
    atomic_fetch_add(&s->n_completed, 1);
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->done_mu);
  } else {
    atomic_fetch_add(&s->n_completed, 1);
  }
}

static void sched_op_done(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  sched_op_finish(arg, code, true);
}

/* Submits batch[0..k) of `ss` in order and arranges for each completion to
 * be counted and its device time measured (dev_op_set_time_sink into
 * q->dev_ns). */
static void sched_submit_batch(sched *s, sched_session *ss,
                               sched_qop *const *batch, int k) {
  if (k <= 0) return;
  dev_op *ops[SCHED_DISPATCH_BATCH];
  dev_tensor *outs[SCHED_DISPATCH_BATCH];
  uint64_t now = sched_now_ns();
  for (int i = 0; i < k; i++) {
    sched_qop *q = batch[i];
    dev_op *op = q->op;
    if (s->hooks.submitted) s->hooks.submitted(s->hooks.arg, ss, op, q->est_ns);
    q->acct = sched_account_ref(ss->pol.acct);
    q->t_sub_ns = now;
    sched_ahead_count(s, q->devs, q->est_ns, 1);
    ops[i] = op;
    outs[i] = dev_op_num_outputs(op) > 0 ? dev_op_output(op, 0) : NULL;
    if (outs[i]) {
      dev_tensor_retain(outs[i]); /* the ops belong to the engine after this */
      dev_op_set_time_sink(op, &q->dev_ns);
    }
  }
  atomic_fetch_add(&s->n_submitted, (uint64_t)k);
  dev_op_submit_batch(s->engine, ops, k);
  for (int i = 0; i < k; i++) {
    dev_status st = DEV_STATUS_INIT;
    if (!outs[i])
      sched_op_finish(batch[i], PD_OK, false);
    else if (dev_tensor_notify(outs[i], sched_op_done, batch[i], &st) != PD_OK)
      sched_op_finish(batch[i], PD_OK, false); /* host memory: now, untimed */
    dev_tensor_release(outs[i]);
  }
}

/* Every device of `mask` may take one more op: it holds (with what this
 * turn took, `t`, may be NULL) fewer than SCHED_AHEAD_MIN_OPS, so a device
 * has its next op when it finishes one, or under dispatch_ahead_ns of
 * estimated device time. No bound at 0 or under round-robin (qmu held or
 * not: atomics). */
static bool sched_devs_room(sched *s, uint64_t mask, const sched_turn_load *t) {
  uint64_t bound = SCHED_LIM(s, dispatch_ahead_ns);
  if (bound == 0 || s->ready.round_robin) return true;
  for (; mask; mask &= mask - 1) {
    int d = __builtin_ctzll(mask);
    int ops = atomic_load(&s->dev_inflight_ops[d]) + (t ? t->ops[d] : 0);
    uint64_t ns = atomic_load(&s->dev_inflight_ns[d]) + (t ? t->ns[d] : 0);
    if (ops >= SCHED_AHEAD_MIN_OPS && ns >= bound) return false;
  }
  return true;
}

/* The policy's test (sched_policy_can_fn): the session's next op has room
 * on its devices; a session whose devices are full is passed over. */
static bool sched_head_has_room(void *arg, sched_session *ss) {
  return !ss->qhead || sched_devs_room(arg, ss->qhead->devs, NULL);
}

static void sched_turn_add(sched_turn_load *t, uint64_t mask, uint64_t est) {
  for (; mask; mask &= mask - 1) {
    int d = __builtin_ctzll(mask);
    t->ns[d] += est;
    t->ops[d]++;
  }
}

/* The end of a hold (sched_hold): the pending tensor the session's head op
 * reads has completed, so the session is ready again (a dev_tensor_notify
 * callback: on the thread that completed the tensor, or the dispatcher's).
 * A hold that a drop already lifted (held_on changed) does nothing. */
static void sched_unhold(void *arg, dev_tensor *t, pd_code code) {
  (void)code;
  sched_session *ss = arg;
  sched *s = ss->owner;
  pthread_mutex_lock(&s->qmu);
  if (ss->held_on == t) {
    ss->held_on = NULL;
    sched_make_ready_locked(ss);
  }
  pthread_mutex_unlock(&s->qmu);
  sched_session_put(ss); /* the registration's */
}

/* Waits, without a thread, for the pending tensor `t` that the session's
 * head op reads (no lock held; the caller holds a reference on t). */
static void sched_hold(sched_session *ss, dev_tensor *t) {
  dev_status st = DEV_STATUS_INIT;
  sched_session_ref(ss);
  if (dev_tensor_notify(t, sched_unhold, ss, &st) != PD_OK)
    sched_unhold(ss, t, st.code); /* host memory: try again next turn */
}

/* Takes up to `budget` ops off the head of the session's queue into batch[]
 * while their estimated device ns stay within `budget_ns` (at least one op)
 * and their devices have dispatch-ahead room (sched_devs_room), and charges
 * the policy with their estimates (qmu held). It stops before an op whose
 * devices are full (the session stays ready), and before an op with a pending
 * input (a tensor still loading): the session is then held on it (*hold,
 * retained) and leaves the ready set with its later ops queued behind; other
 * sessions go on. An op whose deadline passed is not submitted: it goes to
 * *expired (in queue order, *nexp of them, counted as dropping) for the
 * caller to drop with sched_finish_expire before it submits the batch, and
 * costs the session nothing. *idle: the session left the ready set (empty
 * or held; its reference is the caller's to drop). */
static int sched_take_batch_locked(sched *s, sched_session *ss, int budget,
                                   uint64_t budget_ns, sched_qop **batch,
                                   bool *idle, dev_tensor **hold,
                                   sched_qop **expired, int *nexp) {
  int k = 0, x = 0;
  uint64_t cost = 0, xcost = 0;
  uint64_t now = 0; /* read once, at the first op with a deadline */
  sched_qop **xtail = expired;
  sched_turn_load *tl = &s->turn_load;
  memset(tl, 0, sizeof *tl);
  *hold = NULL;
  *expired = NULL;
  while (ss->qhead && k < budget && (k == 0 || cost < budget_ns)) {
    sched_qop *q = ss->qhead;
    if (sched_qop_expired(q, &now)) {
      ss->qhead = q->next;
      q->next = NULL;
      xcost += q->est_ns;
      *xtail = q;
      xtail = &q->next;
      x++;
      continue;
    }
    if (dev_op_has_pending_input(q->op, hold)) {
      dev_tensor_retain(*hold); /* the op may be dropped once qmu is let go */
      ss->held_on = *hold;
      break;
    }
    if (!sched_devs_room(s, q->devs, tl)) break; /* its devices are full */
    ss->qhead = q->next;
    q->next = NULL;
    batch[k++] = q;
    cost += q->est_ns;
    sched_turn_add(tl, q->devs, q->est_ns);
  }
  ss->qlen -= k + x;
  ss->q_est_ns -= cost + xcost;
  ss->dropping += x;
  *nexp = x;
  ss->sub_lo = k ? batch[0]->seq : 0;
  atomic_fetch_sub(&s->n_queued, (uint64_t)(k + x));
  if (!ss->qhead) ss->qtail = NULL;
  *idle = ss->qhead == NULL || *hold != NULL;
  if (*idle) ss->in_ready = false;
  sched_policy_charge(&s->ready, ss, cost, !*idle);
  return k;
}

/* One turn: serves the session the policy picks (qmu held on entry and
 * exit, dropped while submitting). */
static void sched_dispatch_turn_locked(sched *s, sched_qop **batch) {
  int budget = 0;
  uint64_t budget_ns = 0;
  sched_session *ss =
      sched_policy_pick(&s->ready, &budget, &budget_ns, sched_head_has_room, s);
  if (!ss) return; /* raced: every ready session's devices are full */
  if (budget > SCHED_DISPATCH_BATCH) budget = SCHED_DISPATCH_BATCH;
  bool drop_ref = false;
  dev_tensor *hold = NULL;
  sched_qop *expired = NULL;
  int nexp = 0;
  int k = sched_take_batch_locked(s, ss, budget, budget_ns, batch, &drop_ref,
                                  &hold, &expired, &nexp);
  pthread_mutex_unlock(&s->qmu);
  sched_finish_expire(ss, expired, nexp); /* before ops that may read them */
  sched_submit_batch(s, ss, batch, k);
  if (hold) {
    sched_hold(ss, hold);
    dev_tensor_release(hold);
  }
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

/* Woken by the thread that queued work (an RPC thread, most often): let it
 * run on first (it is about to send its reply, or to queue the next op of
 * a stream, which then joins this batch) rather than preempting it (qmu
 * held on entry and exit). Measured with bench_rpc on 2 cores: see the
 * header. */
static void sched_dispatch_yield_locked(sched *s) {
  pthread_mutex_unlock(&s->qmu);
  sched_yield();
  pthread_mutex_lock(&s->qmu);
}

void *sched_dispatch_main(void *arg) {
  sched *s = arg;
  sched_qop *batch[SCHED_DISPATCH_BATCH];
  pthread_mutex_lock(&s->qmu);
  for (;;) {
    bool slept = false;
    for (;;) { /* ahead_wait set before the room is read: no lost wake-up */
      bool idle = sched_policy_empty(&s->ready) || s->paused;
      atomic_store(&s->ahead_wait, !idle);
      if (s->fences || s->qstop ||
          (!idle && sched_policy_can_pick(&s->ready, sched_head_has_room, s)))
        break;
      pthread_cond_wait(&s->qcv, &s->qmu);
      slept = true;
    }
    atomic_store(&s->ahead_wait, false);
    if (s->qstop) break;
    if (slept) sched_dispatch_yield_locked(s);
    if (s->fences) { /* every batch taken before was submitted */
      sched_fence_req *f = s->fences;
      s->fences = NULL;
      pthread_mutex_unlock(&s->qmu);
      sched_run_fences(s, f);
      pthread_mutex_lock(&s->qmu);
      continue;
    }
    sched_dispatch_turn_locked(s, batch);
  }
  pthread_mutex_unlock(&s->qmu);
  return NULL;
}
