/* Leases: the lease thread wakes every lease_check_ms, takes the sessions
 * whose lease ran out off the table and ends them (SCHED_END_EXPIRED). Any
 * call that opens a session renews its lease (sessions.c).
 *
 * It is also the deadlines' timer (issue #15): it wakes at the earliest
 * deadline of a queued op (sched.dl_next_ns; sched_execute wakes it when an
 * op lowers it) and sweeps every session's queue for ops whose deadline
 * passed, so they fail on time even when no dispatcher turn reaches them (a
 * paused dispatcher, a session held on a loading tensor). The dispatcher
 * also drops an expired op it meets at the head of a queue (dispatch.c). */
#include "sched_int.h"

/* Unlinks the sessions whose lease ran out by `now` into a list
 * (sched.mu held). */
static sched_session *sched_take_expired_locked(sched *s, int64_t now) {
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
  return expired;
}

/* Ends expired sessions (no lock held). */
static void sched_expire(sched *s, sched_session *expired) {
  while (expired) {
    sched_session *ss = expired;
    expired = ss->next;
    sched_end_session(ss, SCHED_END_EXPIRED, PD_CANCELLED,
                      "the session's lease expired before the op ran", NULL);
    atomic_fetch_add(&s->n_expired, 1);
    sched_session_put(ss); /* the table's reference */
  }
}

/* Takes the expired ops of every session off its queue (each session swept
 * gets a reference and its list in xops), recomputes dl_next_ns, then drops
 * them with DEADLINE_EXCEEDED outside the locks. */
static void sched_sweep_deadlines(sched *s) {
  sched_session *swept = NULL;
  uint64_t now = sched_now_ns(), next = UINT64_MAX;
  pthread_mutex_lock(&s->mu);
  pthread_mutex_lock(&s->qmu);
  for (sched_session *ss = s->sessions; ss; ss = ss->next) {
    int n = 0;
    sched_qop *l = sched_unqueue_expired_locked(ss, now, &n, &next);
    if (!n) continue;
    /* Failed before an op behind them can be dispatched (qmu held). */
    sched_abandon_expired_list(l);
    sched_session_ref(ss);
    ss->xn = n;
    ss->xnext = swept;
    swept = ss;
  }
  /* Ops queued meanwhile lowered it only under qmu, held here. */
  atomic_store(&s->dl_next_ns, next);
  pthread_mutex_unlock(&s->qmu);
  pthread_mutex_unlock(&s->mu);
  while (swept) {
    sched_session *ss = swept;
    swept = ss->xnext;
    sched_finish_expire(ss, NULL, ss->xn);
    sched_session_put(ss);
  }
}

/* The next wake-up: lease_check_ms from now, or the earliest deadline of a
 * queued op when that comes first (CLOCK_MONOTONIC, the cv's clock). */
static void sched_lease_deadline(const sched *s, struct timespec *ts) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  uint64_t now = (uint64_t)ts->tv_sec * 1000000000u + (uint64_t)ts->tv_nsec;
  uint64_t at = now + (uint64_t)s->cfg.lease_check_ms * 1000000u;
  uint64_t dl = atomic_load(&s->dl_next_ns);
  if (dl < at) at = dl > now ? dl : now;
  ts->tv_sec = (time_t)(at / 1000000000u);
  ts->tv_nsec = (long)(at % 1000000000u);
}

void *sched_lease_main(void *arg) {
  sched *s = arg;
  pthread_mutex_lock(&s->mu);
  while (!s->stopping) {
    struct timespec ts;
    sched_lease_deadline(s, &ts);
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    if (s->stopping) break;
    sched_session *expired = sched_take_expired_locked(s, sched_now_ms());
    pthread_mutex_unlock(&s->mu);
    sched_expire(s, expired);
    if (sched_now_ns() >= atomic_load(&s->dl_next_ns)) sched_sweep_deadlines(s);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}
