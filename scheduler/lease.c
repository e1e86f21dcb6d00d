/* Leases: the lease thread wakes every lease_check_ms, takes the sessions
 * whose lease ran out off the table and ends them (SCHED_END_EXPIRED). Any
 * call that opens a session renews its lease (sessions.c). */
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
    sched_end_session(ss, SCHED_END_EXPIRED,
                      "the session's lease expired before the op ran", NULL);
    atomic_fetch_add(&s->n_expired, 1);
    sched_session_put(ss); /* the table's reference */
  }
}

static void sched_lease_deadline(const sched *s, struct timespec *ts) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += s->cfg.lease_check_ms / 1000;
  ts->tv_nsec += (long)(s->cfg.lease_check_ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
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
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}
