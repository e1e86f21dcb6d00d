/* Sessions' op queues: appending prepared ops (and making the session ready
 * for the dispatcher's policy, unless it is held on a loading tensor),
 * unqueueing and dropping them (sched_cancel, a session's end) with
 * CANCELLED, dropping those whose deadline passed with DEADLINE_EXCEEDED,
 * and tags. Queues are under sched.qmu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

/* --- Queue entries: a free list (issue #15: no per-op malloc) ----------- */

sched_qop *sched_qop_new(sched *s) {
  pthread_mutex_lock(&s->qop_mu);
  sched_qop *q = s->qop_free;
  if (q) {
    s->qop_free = q->next;
    s->qop_nfree--;
  }
  pthread_mutex_unlock(&s->qop_mu);
  if (!q) return calloc(1, sizeof(*q));
  memset(q, 0, sizeof(*q));
  return q;
}

void sched_qop_free(sched *s, sched_qop *q) {
  if (!q) return;
  pthread_mutex_lock(&s->qop_mu);
  if (s->qop_nfree < SCHED_QOP_POOL) {
    q->next = s->qop_free;
    s->qop_free = q;
    s->qop_nfree++;
    q = NULL;
  }
  pthread_mutex_unlock(&s->qop_mu);
  free(q);
}

void sched_qop_pool_free(sched *s) {
  while (s->qop_free) {
    sched_qop *q = s->qop_free;
    s->qop_free = q->next;
    free(q);
  }
  s->qop_nfree = 0;
}

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
static void sched_abandon_list(sched_qop *q, pd_code code, const char *why) {
  sched_qop *rev = NULL;
  while (q) {
    sched_qop *next = q->next;
    q->next = rev;
    rev = q;
    q = next;
  }
  while (rev) {
    sched_qop *next = rev->next;
    dev_op_abandon(rev->op, code, why);
    sched_count_outcome(rev->owner, rev->op_index, code);
    atomic_fetch_add(&rev->owner->n_dropped, 1);
    sched_qop_free(rev->owner, rev);
    rev = next;
  }
}

/* Abandons dropped ops, then lets waiters on them go. */
static void sched_finish_drop(sched_session *ss, sched_qop *dropped, int n,
                              pd_code code, const char *why) {
  if (n == 0) return;
  sched *s = ss->owner;
  sched_abandon_list(dropped, code, why);
  pthread_mutex_lock(&s->qmu);
  ss->dropping -= n;
  sched_dwait *w = sched_take_waiters_locked(ss);
  pthread_cond_broadcast(&s->dcv);
  pthread_mutex_unlock(&s->qmu);
  sched_fire_waiters(w);
}

/* Unqueues (all, or those with `tag`) and drops; returns how many. */
static int sched_drop(sched_session *ss, bool all, uint64_t tag, pd_code code,
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
  /* Their outputs fail before qmu is let go: an op left in the queue that
   * reads one (another tag's) may be submitted as soon as it is, and must
   * find the error there, not a buffer never allocated. */
  sched_abandon_list(d, code, why);
  pthread_mutex_unlock(&s->qmu);
  sched_finish_drop(ss, NULL, n, code, why);
  return n;
}

void sched_drop_queue(sched_session *ss, pd_code code, const char *why) {
  sched_drop(ss, true, 0, code, why);
}

int sched_cancel(sched_session *ss, uint64_t tag) {
  return sched_drop(ss, false, tag, PD_CANCELLED,
                    "the call that queued the op was cancelled");
}

uint64_t sched_new_tag(sched *s) { return atomic_fetch_add(&s->next_tag, 1); }

/* --- Deadlines ------------------------------------------------------------- */

bool sched_deadline_note_locked(sched *s, uint64_t deadline_ns) {
  uint64_t cur = atomic_load_explicit(&s->dl_next_ns, memory_order_relaxed);
  if (deadline_ns >= cur) return false;
  atomic_store(&s->dl_next_ns, deadline_ns); /* writers hold qmu */
  return true;
}

void sched_deadline_kick(sched *s) {
  pthread_mutex_lock(&s->mu); /* the lease thread reads dl_next_ns under mu */
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

sched_qop *sched_unqueue_expired_locked(sched_session *ss, uint64_t now, int *n,
                                        uint64_t *next_dl) {
  sched_qop *expired = NULL, **tail = &expired, **pp = &ss->qhead, *last = NULL;
  int k = 0;
  while (*pp) {
    sched_qop *q = *pp;
    if (q->deadline_ns && q->deadline_ns <= now) {
      *pp = q->next;
      q->next = NULL;
      *tail = q; /* kept in queue order */
      tail = &q->next;
      ss->q_est_ns -= q->est_ns; /* admission counts what is queued */
      k++;
    } else {
      if (q->deadline_ns && q->deadline_ns < *next_dl)
        *next_dl = q->deadline_ns;
      last = q;
      pp = &q->next;
    }
  }
  *n = k;
  if (k == 0) return NULL;
  ss->qtail = last;
  ss->qlen -= k;
  ss->dropping += k;
  atomic_fetch_sub(&ss->owner->n_queued, (uint64_t)k);
  if (ss->held_on) { /* as sched_drop: the held op may be gone */
    ss->held_on = NULL;
    sched_make_ready_locked(ss);
  }
  return expired;
}

static const char *sched_dl_source(int src) {
  switch (src) {
    case SCHED_DL_CALL: return "the deadline of the call that queued it";
    case SCHED_DL_OP: return "the op's own timeout_ms";
    default: return "the session's op_timeout_ms";
  }
}

/* Abandons one expired op with a message naming it, its deadline and its
 * time in the queue. */
static void sched_abandon_expired(sched_qop *q, uint64_t now) {
  int idx = q->op_index;
  sched *s = q->owner;
  const char *name = "op";
  for (int i = 0; i < s->num_ops; i++)
    if (s->op_names[i].index == idx) name = s->op_names[i].name;
  double dl_ms = (double)(q->deadline_ns - q->t_enq_ns) / 1e6;
  double waited_ms = (double)(now - q->t_enq_ns) / 1e6;
  char msg[DEV_STATUS_MSG_MAX];
  snprintf(msg, sizeof msg,
           "%s (op %llu of its session) was not started by its deadline, "
           "%.1f ms after it was queued (%s): it waited %.1f ms in the queue "
           "and was dropped; ops that consume its outputs fail too",
           name, (unsigned long long)q->seq, dl_ms, sched_dl_source(q->dl_src),
           waited_ms);
  dev_op_abandon(q->op, PD_DEADLINE_EXCEEDED, msg);
  sched_count_outcome(s, idx, PD_DEADLINE_EXCEEDED);
  atomic_fetch_add(&s->n_expired_ops, 1);
  sched_qop_free(s, q);
}

void sched_abandon_expired_list(sched_qop *list) {
  uint64_t now = sched_now_ns();
  while (list) {
    sched_qop *next = list->next;
    sched_abandon_expired(list, now);
    list = next;
  }
}

void sched_finish_expire(sched_session *ss, sched_qop *list, int n) {
  if (n == 0) return;
  sched *s = ss->owner;
  sched_abandon_expired_list(list);
  pthread_mutex_lock(&s->qmu);
  ss->dropping -= n;
  sched_dwait *w = sched_take_waiters_locked(ss);
  pthread_cond_broadcast(&s->dcv);
  pthread_mutex_unlock(&s->qmu);
  sched_fire_waiters(w);
}
