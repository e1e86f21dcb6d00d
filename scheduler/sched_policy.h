/* The dispatcher's policy: which session's queue the dispatcher serves next
 * and how many of its ops it takes in one turn (private to scheduler/).
 *
 * Today's policy (policy_rr.c) is round-robin over the sessions that have
 * queued ops, SCHED_DISPATCH_BATCH ops per turn, so a busy session cannot
 * starve the others. A fair-share policy (issue #15) replaces this header's
 * two structs and policy_rr.c; nothing else in scheduler/ knows how the
 * ready set is kept.
 *
 * The ready set holds sessions, not ops: queue.c adds a session when it gets
 * ops while not ready (session.in_ready false; it takes a reference for the
 * set), the dispatcher picks one, takes up to `budget` ops from its queue and
 * charges it, saying whether ops remain (then the policy keeps it ready).
 * Every function is called with sched.qmu held and must not block. */
#ifndef PARADEV_SCHED_POLICY_H
#define PARADEV_SCHED_POLICY_H

#include <stdbool.h>

#include "scheduler.h"

/* The policy's state in each session. */
typedef struct sched_policy_node {
  sched_session *next; /* in the ready list */
} sched_policy_node;

/* The policy's state in the scheduler: the ready set. */
typedef struct sched_policy_queue {
  sched_session *head, *tail;
} sched_policy_queue;

void sched_policy_init(sched_policy_queue *q);

/* Adds a session that has queued ops and is not in the set. */
void sched_policy_ready(sched_policy_queue *q, sched_session *ss);

/* Removes the session to serve next from the set and sets *budget to the
 * most ops it may submit this turn (1 to SCHED_DISPATCH_BATCH, the size of
 * the dispatcher's batch; larger is cut to it); NULL when the set is empty. */
sched_session *sched_policy_pick(sched_policy_queue *q, int *budget);

/* Accounts `ops` ops taken from `ss` (picked before); `more`: ops remain
 * queued, so the session goes back into the set. */
void sched_policy_charge(sched_policy_queue *q, sched_session *ss, int ops,
                         bool more);

/* True when no session is ready. */
bool sched_policy_empty(const sched_policy_queue *q);

#endif /* PARADEV_SCHED_POLICY_H */
