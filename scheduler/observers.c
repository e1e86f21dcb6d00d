/* Observers of sessions' ends: the parts of the daemon that keep state per
 * session (shared-memory regions, next graph functions, checkpoints,
 * identities) register here, attach their state to sessions, and hear each
 * session's end once, with that state (scheduler.h, "The end of a session").
 * sessions.c decides when a session ends; this file only tells. */
#include "sched_int.h"

const char *sched_end_reason_name(sched_end_reason why) {
  switch (why) {
    case SCHED_END_CLOSED: return "closed";
    case SCHED_END_EXPIRED: return "expired";
    case SCHED_END_KILLED: return "killed";
    case SCHED_END_STOPPED: return "stopped";
    case SCHED_END_FAILED: return "failed";
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
                  "observer %d already has state attached to session %llu", key,
                  (unsigned long long)ss->seq);
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

void sched_notify_end(sched_session *ss, sched_end_reason why, const char *msg,
                      uint64_t handles, void *const *states) {
  sched *s = ss->owner;
  sched_end_info info = {ss->seq, ss->client, ss->job, why, handles, msg};
  for (int k = 0; k < s->num_observers; k++)
    if (s->observers[k].on_end)
      s->observers[k].on_end(s->observers[k].arg, &info, states[k]);
}
