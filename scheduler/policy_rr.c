/* The dispatcher's policy: round-robin over ready sessions, in turns of
 * SCHED_DISPATCH_BATCH ops (see sched_policy.h). Called with sched.qmu held. */
#include "sched_int.h"

void sched_policy_init(sched_policy_queue *q) { q->head = q->tail = NULL; }

static void rr_push_back(sched_policy_queue *q, sched_session *ss) {
  ss->pol.next = NULL;
  if (q->tail)
    q->tail->pol.next = ss;
  else
    q->head = ss;
  q->tail = ss;
}

void sched_policy_ready(sched_policy_queue *q, sched_session *ss) {
  rr_push_back(q, ss);
}

sched_session *sched_policy_pick(sched_policy_queue *q, int *budget) {
  sched_session *ss = q->head;
  if (!ss) return NULL;
  q->head = ss->pol.next;
  if (!q->head) q->tail = NULL;
  ss->pol.next = NULL;
  *budget = SCHED_DISPATCH_BATCH;
  return ss;
}

void sched_policy_charge(sched_policy_queue *q, sched_session *ss, int ops,
                         bool more) {
  (void)ops;                     /* every turn costs the same here */
  if (more) rr_push_back(q, ss); /* back of the line: others get their turn */
}

bool sched_policy_empty(const sched_policy_queue *q) { return q->head == NULL; }
