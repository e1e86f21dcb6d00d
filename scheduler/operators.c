/* Operators' view of sessions: listing them (admin "sessions") and killing
 * them by token, number or job (SCHED_END_KILLED); the daemon's own kills
 * (sched_kill_because, SCHED_END_FAILED), remembered for later calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

static void sched_fill_view(sched_session *ss, int64_t now,
                            sched_session_view *e) {
  sched *s = ss->owner;
  e->seq = ss->seq;
  memcpy(e->client, ss->client, sizeof(e->client));
  memcpy(e->job, ss->job, sizeof(e->job));
  memcpy(e->tenant, ss->tenant, sizeof(e->tenant));
  memcpy(e->identity, ss->identity, sizeof(e->identity));
  e->job_claimed = ss->job_claimed;
  e->memory_quota = ss->quota;
  e->lease_s = ss->lease_s;
  e->age_s = (double)(now - ss->created_ms) / 1000.0;
  int64_t last = atomic_load(&ss->expires_ms) - (int64_t)ss->lease_s * 1000;
  e->idle_s = now > last ? (double)(now - last) / 1000.0 : 0.0;
  sched_session_counts(ss, &e->handles, &e->bytes); /* never waits */
  e->devices = ss->devices; /* fixed; the bytes are atomics: no lock */
  for (int d = 0; d < PD_MAX_DEVICES; d++)
    e->device_bytes[d] =
        atomic_load_explicit(&ss->dev_bytes[d], memory_order_relaxed);
  pthread_mutex_lock(&s->qmu);
  e->queued_ops = (uint64_t)ss->qlen;
  pthread_mutex_unlock(&s->qmu);
}

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
    sched_session_ref(ss);
    list[n++] = ss;
  }
  pthread_mutex_unlock(&s->mu);
  sched_session_view *v = calloc(n ? n : 1, sizeof(*v));
  int64_t now = sched_now_ms();
  for (size_t i = 0; i < n; i++) {
    sched_session *ss = list[n - 1 - i]; /* the table is newest first */
    if (v) sched_fill_view(ss, now, &v[i]);
    sched_session_put(ss);
  }
  free(list);
  if (!v) return -1;
  *out = v;
  return (int)n;
}

/* Unlinks every session of `job` into a list (sched.mu held); a session
 * that only claimed the job id is not the job's. */
static sched_session *sched_take_job_locked(sched *s, const char *job) {
  sched_session *victims = NULL;
  for (sched_session **pp = &s->sessions; *pp;) {
    sched_session *ss = *pp;
    if (!ss->job_claimed && strcmp(ss->job, job) == 0) {
      *pp = ss->next;
      s->num_sessions--;
      ss->next = victims;
      victims = ss;
    } else {
      pp = &ss->next;
    }
  }
  return victims;
}

/* Unlinks the target's sessions into *victims (sched.mu held). */
static pd_code sched_take_victims_locked(sched *s, const sched_kill_target *t,
                                         sched_session **victims,
                                         dev_status *st) {
  if (t->job) {
    *victims = sched_take_job_locked(s, t->job);
    return PD_OK;
  }
  sched_session *ss = NULL;
  if (t->seq) {
    for (ss = s->sessions; ss && ss->seq != t->seq; ss = ss->next) {
    }
    if (!ss)
      return dev_error(st, PD_NOT_FOUND, "no open session numbered %llu",
                       (unsigned long long)t->seq);
  } else {
    PD_TRY(sched_find_locked(s, t->token, t->token_len, &ss, st));
  }
  sched_unlink_locked(s, ss);
  *victims = ss;
  return PD_OK;
}

/* Remembers the victims' tokens under a new reason (sched.mu held). */
static void sched_remember_locked(sched *s, sched_session *victims,
                                  pd_code code, const char *why) {
  uint64_t r = s->n_reasons++;
  s->reasons[r % SCHED_REASONS_KEPT].code = code;
  snprintf(s->reasons[r % SCHED_REASONS_KEPT].why,
           sizeof s->reasons[0].why, "%s", why);
  for (sched_session *ss = victims; ss; ss = ss->next) {
    uint64_t k = s->n_ended++ % SCHED_ENDED_KEPT;
    memcpy(s->ended[k].token, ss->token, SCHED_TOKEN_BYTES);
    s->ended[k].reason = r;
  }
}

/* sched_kill and sched_kill_because: an operator's kill when why is NULL. */
static pd_code sched_kill_as(sched *s, const sched_kill_target *t,
                             pd_code code, const char *why,
                             sched_kill_result *out, dev_status *st) {
  int given = (t->token != NULL || t->token_len != 0) + (t->job != NULL) +
              (t->seq != 0);
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
  pthread_mutex_lock(&s->mu);
  pd_code c = sched_take_victims_locked(s, t, &victims, st);
  if (c == PD_OK && why) sched_remember_locked(s, victims, code, why);
  pthread_mutex_unlock(&s->mu);
  if (c != PD_OK) return c;
  sched_kill_result r = {0, 0, 0};
  while (victims) {
    sched_session *ss = victims;
    victims = ss->next;
    uint64_t bytes = 0;
    if (why) {
      pthread_mutex_lock(&ss->mu);
      ss->end_code = code;
      snprintf(ss->end_msg, sizeof ss->end_msg, "%s", why);
      pthread_mutex_unlock(&ss->mu);
    }
    r.handles += sched_end_session(
        ss, why ? SCHED_END_FAILED : SCHED_END_KILLED,
        why ? code : PD_CANCELLED,
        why ? why : "the session was killed by an operator before the op ran",
        &bytes);
    r.bytes += bytes;
    r.sessions++;
    atomic_fetch_add(&s->n_killed, 1);
    sched_session_put(ss);
  }
  if (out) *out = r;
  return PD_OK;
}

pd_code sched_kill(sched *s, const sched_kill_target *t, sched_kill_result *out,
                   dev_status *st) {
  return sched_kill_as(s, t, PD_CANCELLED, NULL, out, st);
}

pd_code sched_kill_because(sched *s, const sched_kill_target *t, pd_code code,
                           const char *why, sched_kill_result *out,
                           dev_status *st) {
  if (code == PD_OK || !why || !*why)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_kill_because: give an error code and a reason");
  return sched_kill_as(s, t, code, why, out, st);
}
