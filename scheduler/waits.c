/* Waits and fences: learning when a session's queued ops were handed over
 * (submitted or dropped), so that a wait on one of their outputs has a place
 * in the devices' order; sched_tensor_notify's registrations that wait for
 * that without a thread; the blocking waits (sched_tensor_wait, sched_sync);
 * and sched_fence, whose requests the dispatcher submits behind every batch
 * it took before. */
#include <stdlib.h>

#include "sched_int.h"

bool sched_handed_over_locked(const sched_session *ss, uint64_t target) {
  if (ss->qhead && ss->qhead->seq <= target) return false;
  if (ss->sub_lo && ss->sub_lo <= target) return false;
  return ss->dropping == 0;
}

/* The registrations whose ops were all handed over, or whose tensor is
 * computed already (its op dropped, say). */
sched_dwait *sched_take_waiters_locked(sched_session *ss) {
  sched_dwait *ready = NULL;
  for (sched_dwait **pp = &ss->dwait; *pp;) {
    sched_dwait *w = *pp;
    if (sched_handed_over_locked(ss, w->target) || dev_tensor_is_ready(w->t)) {
      *pp = w->next;
      w->next = ready;
      ready = w;
    } else {
      pp = &w->next;
    }
  }
  return ready;
}

void sched_fire_waiters(sched_dwait *w) {
  while (w) {
    sched_dwait *next = w->next;
    dev_status st = DEV_STATUS_INIT;
    if (dev_tensor_notify(w->t, w->fn, w->arg, &st) != PD_OK)
      w->fn(w->arg, w->t, st.code);
    dev_tensor_release(w->t);
    free(w);
    w = next;
  }
}

/* Only then do the session's outputs have a place in the devices' order to
 * wait on. */
void sched_wait_dispatched(sched_session *ss) {
  sched *s = ss->owner;
  pthread_mutex_lock(&s->qmu);
  uint64_t target = ss->enqueued;
  while (!sched_handed_over_locked(ss, target) && !s->qstop)
    pthread_cond_wait(&s->dcv, &s->qmu);
  pthread_mutex_unlock(&s->qmu);
}

pd_code sched_tensor_wait(sched_session *ss, dev_tensor *t, dev_status *st) {
  if (!dev_tensor_is_ready(t)) {
    /* As sched_wait_dispatched, but a tensor whose op was dropped (its
     * deadline passed, say) while later ops stay queued is ready at once. */
    sched *s = ss->owner;
    pthread_mutex_lock(&s->qmu);
    uint64_t target = ss->enqueued;
    while (!sched_handed_over_locked(ss, target) && !s->qstop &&
           !dev_tensor_is_ready(t))
      pthread_cond_wait(&s->dcv, &s->qmu);
    pthread_mutex_unlock(&s->qmu);
  }
  return dev_tensor_wait(t, st);
}

pd_code sched_tensor_notify(sched_session *ss, dev_tensor *t, dev_ready_fn fn,
                            void *arg, dev_status *st) {
  sched *s = ss->owner;
  if (!dev_tensor_is_ready(t)) {
    pthread_mutex_lock(&s->qmu);
    uint64_t target = ss->enqueued;
    if (!sched_handed_over_locked(ss, target)) {
      sched_dwait *w = calloc(1, sizeof(*w));
      if (!w) {
        pthread_mutex_unlock(&s->qmu);
        return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      }
      dev_tensor_retain(t);
      *w = (sched_dwait){target, t, fn, arg, ss->dwait};
      ss->dwait = w;
      pthread_mutex_unlock(&s->qmu);
      return PD_OK;
    }
    pthread_mutex_unlock(&s->qmu);
  }
  return dev_tensor_notify(t, fn, arg, st);
}

pd_code sched_sync(sched_session *ss, const uint64_t *ids, int n,
                   dev_status *tensor_err, uint64_t *failed_id,
                   dev_status *st) {
  sched_ref *list = NULL;
  size_t k = 0;
  PD_TRY(sched_collect(ss, ids, n, &list, &k, st));
  dev_status first = DEV_STATUS_INIT;
  uint64_t first_id = 0;
  sched_wait_dispatched(ss);
  for (size_t i = 0; i < k; i++) {
    dev_status ts = DEV_STATUS_INIT;
    if (dev_tensor_wait(list[i].t, &ts) != PD_OK && first.code == PD_OK) {
      first = ts;
      first_id = list[i].id;
    }
  }
  sched_refs_release(list, k);
  if (tensor_err) *tensor_err = first;
  if (failed_id) *failed_id = first_id;
  return PD_OK;
}

pd_code sched_fence(sched *s, dev_ready_fn fn, void *arg, dev_status *st) {
  sched_fence_req *f = calloc(1, sizeof(*f));
  if (!f) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  f->fn = fn;
  f->arg = arg;
  pthread_mutex_lock(&s->qmu);
  if (s->qstop) {
    pthread_mutex_unlock(&s->qmu);
    free(f);
    fn(arg, NULL, PD_CANCELLED);
    return PD_OK;
  }
  f->next = s->fences;
  s->fences = f;
  pthread_cond_signal(&s->qcv);
  pthread_mutex_unlock(&s->qmu);
  return PD_OK;
}

/* The op that sched_fence queues behind all others: an empty Fill, which
 * holds no memory while its callback runs. */
static void sched_submit_fence(sched *s, sched_fence_req *f) {
  dev_op *op = NULL;
  dev_status st = DEV_STATUS_INIT;
  const int64_t dims[1] = {0};
  const dev_attr attrs[3] = {dev_attr_shape("shape", 1, dims),
                             dev_attr_float("value", 0),
                             dev_attr_dtype("dtype", PD_FLOAT32)};
  if (dev_op_prepare(s->engine, "Fill", NULL, 0, attrs, 3, &op, &st) != PD_OK) {
    f->fn(f->arg, NULL, st.code);
    return;
  }
  dev_tensor *out = dev_op_output(op, 0);
  dev_tensor_retain(out);
  dev_op_submit(s->engine, op);
  if (dev_tensor_notify(out, f->fn, f->arg, &st) != PD_OK)
    f->fn(f->arg, NULL, st.code);
  dev_tensor_release(out);
}

void sched_run_fences(sched *s, sched_fence_req *f) {
  while (f) {
    sched_fence_req *next = f->next;
    sched_submit_fence(s, f);
    free(f);
    f = next;
  }
}

void sched_cancel_fences(sched_fence_req *f) {
  while (f) {
    sched_fence_req *next = f->next;
    f->fn(f->arg, NULL, PD_CANCELLED);
    free(f);
    f = next;
  }
}
