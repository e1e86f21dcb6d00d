/* The dispatcher's policy: strict priority between bands, fair share of
 * device time inside a band by virtual time (VTC), or the old round-robin
 * as a baseline (see sched_policy.h for the scheme, its bound and why).
 * Called with sched.qmu held, except sched_policy_correct and the accounts'
 * references. */
#include <math.h>
#include <stdlib.h>

#include "sched_int.h"

void sched_policy_init(sched_policy_queue *q, bool round_robin) {
  *q = (sched_policy_queue){.round_robin = round_robin};
}

bool sched_policy_session_init(sched_session *ss) {
  sched_account *a = calloc(1, sizeof *a);
  if (!a) return false;
  atomic_init(&a->refs, 1);
  atomic_init(&a->owed_ns, 0);
  atomic_init(&a->largest_ns, 0);
  ss->pol.acct = a;
  return true;
}

void sched_policy_session_fini(sched_session *ss) {
  sched_account_put(ss->pol.acct);
  ss->pol.acct = NULL;
}

sched_account *sched_account_ref(sched_account *a) {
  atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
  return a;
}

void sched_account_put(sched_account *a) {
  if (a && atomic_fetch_sub(&a->refs, 1) == 1) free(a);
}

void sched_policy_correct(sched_account *a, int64_t delta_ns) {
  if (delta_ns)
    atomic_fetch_add_explicit(&a->owed_ns, delta_ns, memory_order_relaxed);
}

void sched_account_note_op(sched_account *a, uint64_t ns) {
  uint64_t cur = atomic_load_explicit(&a->largest_ns, memory_order_relaxed);
  while (ns > cur && !atomic_compare_exchange_weak_explicit(
                         &a->largest_ns, &cur, ns, memory_order_relaxed,
                         memory_order_relaxed)) {
  }
}

/* Folds the corrections that completions left into the session's vtime. */
static void fair_fold(sched_session *ss) {
  sched_account *a = ss->pol.acct;
  if (!a || atomic_load_explicit(&a->owed_ns, memory_order_relaxed) == 0)
    return;
  int64_t d = atomic_exchange_explicit(&a->owed_ns, 0, memory_order_relaxed);
  ss->pol.vtime += (double)d / (double)ss->weight;
  if (d < 0 && (uint64_t)-d > ss->pol.served_ns)
    ss->pol.served_ns = 0;
  else
    ss->pol.served_ns += (uint64_t)d;
}

static sched_policy_band *band_of(sched_policy_queue *q,
                                  const sched_session *ss) {
  int b = q->round_robin ? 0 : ss->priority - SCHED_PRIORITY_MIN;
  return &q->bands[b];
}

static void band_push_back(sched_policy_band *b, sched_session *ss) {
  ss->pol.next = NULL;
  ss->pol.prev = b->tail;
  if (b->tail)
    b->tail->pol.next = ss;
  else
    b->head = ss;
  b->tail = ss;
}

static void band_unlink(sched_policy_band *b, sched_session *ss) {
  if (ss->pol.prev)
    ss->pol.prev->pol.next = ss->pol.next;
  else
    b->head = ss->pol.next;
  if (ss->pol.next)
    ss->pol.next->pol.prev = ss->pol.prev;
  else
    b->tail = ss->pol.prev;
  ss->pol.next = ss->pol.prev = NULL;
}

/* The band's ready session of smallest vtime (the first of equals) among
 * those `can` accepts (all, when `can` is NULL), with corrections folded
 * in; *next_v: the smallest vtime of the other accepted ones (INFINITY when
 * alone). */
static sched_session *band_min(sched_policy_band *b, double *next_v,
                               sched_policy_can_fn can, void *arg) {
  sched_session *best = NULL;
  double second = INFINITY;
  for (sched_session *ss = b->head; ss; ss = ss->pol.next) {
    if (can && !can(arg, ss)) continue;
    fair_fold(ss);
    if (!best || ss->pol.vtime < best->pol.vtime) {
      if (best) second = best->pol.vtime;
      best = ss;
    } else if (ss->pol.vtime < second) {
      second = ss->pol.vtime;
    }
  }
  *next_v = second;
  return best;
}

/* Accepts the sessions whose allowed set overlaps `arg`'s (a newly ready
 * session is lifted to the virtual time of those it may contend with). */
static bool overlaps_session(void *arg, sched_session *ss) {
  const sched_session *me = arg;
  return dev_devset_overlaps(&me->devices, &ss->devices);
}

void sched_policy_ready(sched_policy_queue *q, sched_session *ss) {
  sched_policy_band *b = band_of(q, ss);
  if (!q->round_robin) {
    fair_fold(ss);
    double now_v = b->vtime, ignored;
    sched_session *m = band_min(b, &ignored, overlaps_session, ss);
    if (m) now_v = m->pol.vtime; /* the current virtual time of the band */
    if (ss->pol.vtime < now_v) ss->pol.vtime = now_v; /* no banked credit */
  }
  band_push_back(b, ss);
  q->ready++;
}

sched_session *sched_policy_pick(sched_policy_queue *q, int *ops,
                                 uint64_t *budget_ns, sched_policy_can_fn can,
                                 void *arg) {
  *ops = SCHED_DISPATCH_BATCH;
  *budget_ns = UINT64_MAX;
  if (q->ready == 0) return NULL;
  if (q->round_robin) {
    sched_session *ss = q->bands[0].head;
    while (ss && can && !can(arg, ss)) ss = ss->pol.next;
    if (!ss) return NULL;
    band_unlink(&q->bands[0], ss);
    q->ready--;
    return ss;
  }
  for (int i = SCHED_NUM_BANDS - 1; i >= 0; i--) {
    sched_policy_band *b = &q->bands[i];
    if (!b->head) continue;
    double next_v = INFINITY;
    sched_session *ss = band_min(b, &next_v, can, arg);
    if (!ss) continue; /* every session of the band waits for its devices */
    band_unlink(b, ss);
    q->ready--;
    if (ss->pol.vtime > b->vtime) b->vtime = ss->pol.vtime;
    if (isfinite(next_v)) {
      double room = (next_v - ss->pol.vtime) * (double)ss->weight;
      *budget_ns = (uint64_t)(room > 0 ? room : 0) + SCHED_FAIR_SLICE_NS;
    }
    return ss;
  }
  return NULL; /* not reached: ready > 0 means a band has a session */
}

void sched_policy_charge(sched_policy_queue *q, sched_session *ss,
                         uint64_t cost_ns, bool more) {
  ss->pol.vtime += (double)cost_ns / (double)ss->weight;
  ss->pol.served_ns += cost_ns;
  sched_policy_band *b = band_of(q, ss);
  if (more) {
    band_push_back(b, ss);
    q->ready++;
  } else if (!b->head && ss->pol.vtime > b->vtime) {
    b->vtime = ss->pol.vtime; /* the last to leave sets the band's time */
  }
}

bool sched_policy_empty(const sched_policy_queue *q) { return q->ready == 0; }

bool sched_policy_can_pick(const sched_policy_queue *q, sched_policy_can_fn can,
                           void *arg) {
  if (q->ready == 0) return false;
  if (!can) return true;
  for (int i = 0; i < SCHED_NUM_BANDS; i++)
    for (sched_session *ss = q->bands[i].head; ss; ss = ss->pol.next)
      if (can(arg, ss)) return true;
  return false;
}
