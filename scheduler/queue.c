/* Sessions' op queues: appending prepared ops (and making the session ready
 * for the dispatcher's policy, unless it is held on a loading tensor), unqueueing and dropping them (sched_cancel,
 * a session's end) with CANCELLED, and tags. Queues are under sched.qmu. */
#include <stdlib.h>

#include "sched_int.h"

void sched_make_ready_locked(sched_session *ss) {
  sched *s = ss->owner;
  if (ss->in_ready || ss->held_on || !ss->qhead || s->qstop) return;
  ss->in_ready = true;
  sched_session_ref(ss); /* the ready set's */
  sched_policy_ready(&s->ready, ss);
  pthread_cond_signal(&s->qcv);
}

void sched_queue_append_locked(sched_session *ss, sched_qop *first,
                               sched_qop *last, int n) {
  sched *s = ss->owner;
  if (ss->qtail)
    ss->qtail->next = first;
  else
    ss->qhead = first;
  ss->qtail = last;
  ss->qlen += n;
  for (sched_qop *q = first; q; q = q == last ? NULL : q->next)
    ss->q_est_ns += q->est_ns;
  atomic_fetch_add(&s->n_queued, (uint64_t)n);
  sched_make_ready_locked(ss); /* not while held on a loading tensor */
}

/* Unlinks the queued ops of `ss` with `tag` (every op when all) into a list
 * for the caller to abandon outside the lock (qmu held). The ops count as
 * `dropping` until sched_finish_drop says they were abandoned. */
static sched_qop *sched_unqueue_locked(sched_session *ss, bool all,
                                       uint64_t tag, int *count) {
  sched_qop *dropped = NULL, **pp = &ss->qhead, *last = NULL;
  int n = 0;
  while (*pp) {
    sched_qop *q = *pp;
    if (all || q->tag == tag) {
      ss->q_est_ns -= q->est_ns;
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

/* Unqueues (all, or those with `tag`) and drops; returns how many. */
static int sched_drop(sched_session *ss, bool all, uint64_t tag,
                      const char *why) {
  sched *s = ss->owner;
  int n = 0;
  pthread_mutex_lock(&s->qmu);
  sched_qop *d = sched_unqueue_locked(ss, all, tag, &n);
  if (n > 0 && ss->held_on) {
    /* The held op may be gone: let the dispatcher look at the new head (a
     * head still pending holds the session again; the old hold's callback
     * then finds held_on changed and does nothing). */
    ss->held_on = NULL;
    sched_make_ready_locked(ss);
  }
  pthread_mutex_unlock(&s->qmu);
  sched_finish_drop(ss, d, n, why);
  return n;
}

void sched_drop_queue(sched_session *ss, const char *why) {
  sched_drop(ss, true, 0, why);
}

int sched_cancel(sched_session *ss, uint64_t tag) {
  return sched_drop(ss, false, tag,
                    "the call that queued the op was cancelled");
}

uint64_t sched_new_tag(sched *s) { return atomic_fetch_add(&s->next_tag, 1); }
