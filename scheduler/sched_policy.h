/* The dispatcher's policy: which session's queue the dispatcher serves next
 * and how much of it one turn may take (private to scheduler/).
 *
 * Fair share of device time inside priority bands (policy_fair.c, issue #15):
 *
 *  - Bands. A session's band is sched_session_priority (SCHED_PRIORITY_MIN..
 *    MAX). A ready session of a higher band is always served first (strict
 *    priority): a lower band runs only while no higher band has queued ops.
 *  - Inside a band, virtual time. Each session has a virtual time `vtime`:
 *    the device time (ns) it has been charged divided by its weight
 *    (sched_session_weight). The ready session with the smallest vtime goes
 *    next. Each op is charged its estimated cost when taken (dispatch), and
 *    corrected by (measured - estimated) when it completes (the executors
 *    time each op, sched_policy_correct).
 *  - A turn takes ops from the picked session until its vtime would pass the
 *    next session's vtime by more than SCHED_FAIR_SLICE_NS / weight (at least
 *    one op; at most SCHED_DISPATCH_BATCH; a session alone in its band takes
 *    a full batch, so one busy client costs no extra turns).
 *  - Bound. For two sessions i, j backlogged in one band over an interval,
 *    |S_i/w_i - S_j/w_j| <= (C + SLICE)/w_i + (C + SLICE)/w_j plus the
 *    corrections of ops still running, where S is device time served and C
 *    the largest op's cost: at each pick the picked session had the
 *    smallest vtime, and a turn raises it at most SLICE/w past the next
 *    one plus one op. With SLICE below the largest op this is 4 largest ops
 *    for equal weights; tests/unit/test_sched_fair.c checks it.
 *  - Newly active sessions. A session that becomes ready (it had no queued
 *    ops, or was held on a loading tensor) is lifted to the band's current
 *    virtual time: the smallest vtime of the ready sessions of its band, or
 *    the band's last served vtime when none is ready. So an idle session
 *    banks no credit (it cannot come back and monopolise the devices), and is
 *    not behind either (it is served at once, in turn). Its own vtime is
 *    kept when it is ahead (charges it already ran up stay charged).
 *
 * Why this scheme: it is Virtual Token Counter (VTC, Sheng et al., "Fairness
 * in Serving Large Language Models", OSDI 2024), i.e. start-time fair
 * queueing with the lift of CFS's min_vruntime, on device time. Ops are not
 * preemptible and their sizes vary by orders of magnitude: VTC's counters
 * bound the lag by the largest op without needing a quantum per op, the
 * measured correction fits in as one more counter update, and the lift is
 * one max(). EEVDF's virtual deadlines add latency control inside a band,
 * which the priority bands already give here; stride scheduling is the same
 * arithmetic without the lift rule for joining sessions.
 *
 * Placement (issue #17): per device, not per engine. The dispatch-ahead
 * bound is kept for each engine device (an op's estimate counts on every
 * device of its set; it may go when every one of them is under the bound
 * or holds fewer than SCHED_AHEAD_MIN_OPS), and a pick passes over a
 * session whose next op's devices are full rather than waiting for them:
 * a session on [0, 1] with a deep backlog never delays one on [2, 3]. A
 * band whose every ready session waits for its devices lets a lower band
 * run on other devices: strict priority holds among sessions that share a
 * device, since a lower band's op on a full device waits as well.
 *
 * What is fair across overlapping sets: one virtual time per band, as
 * above, charged the op's estimate once (its device time, the slowest
 * component, not multiplied by the set's size). Among backlogged sessions
 * whose sets overlap, each contended turn goes to the smallest vtime, so
 * the bound above holds between any two of them whose next ops contend for
 * a shared device: they split the shared devices' time by weight, and a
 * session on more devices pays no more for them (what it uses beyond the
 * shared ones is contended by no one). Sessions on disjoint sets are never
 * compared for dispatch (each goes whenever its own devices have room);
 * their vtimes drift apart freely. A session skipped because its devices
 * were full is not charged, so it is served first when they free up (the
 * wait was the devices', not the policy's). A newly ready session is
 * lifted to the smallest vtime of the ready sessions of its band whose
 * allowed sets overlap its own (else the band's last time), so it banks no
 * credit against those it will contend with, and is not held back by the
 * vtime of sessions elsewhere on the mesh.
 *
 * Round-robin (the old policy, kept as a baseline: sched_config.policy =
 * SCHED_POLICY_ROUND_ROBIN): every ready session in one FIFO regardless of
 * band and weight, SCHED_DISPATCH_BATCH ops per turn, no cost budget.
 *
 * The ready set holds sessions, not ops: queue.c adds a session when it gets
 * ops while not ready (session.in_ready false; it takes a reference for the
 * set), the dispatcher picks one (it leaves the set), takes ops from its
 * queue within the budget and charges it, saying whether ops remain (then
 * the policy puts it back). Every function but sched_policy_correct is
 * called with sched.qmu held and must not block; a pick scans the ready
 * sessions of one band (O(ready sessions of the band)). */
#ifndef PARADEV_SCHED_POLICY_H
#define PARADEV_SCHED_POLICY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "scheduler.h"

/* How far past the next session's virtual time one turn may run, in device
 * ns at weight 1: a few tiny ops per turn rather than one. */
#define SCHED_FAIR_SLICE_NS 20000

#define SCHED_NUM_BANDS (SCHED_PRIORITY_MAX - SCHED_PRIORITY_MIN + 1)

/* A session's corrections, shared with its ops in flight (they may complete
 * after the session is freed): measured minus estimated device ns, added by
 * completions without a lock and folded into vtime by the policy. */
typedef struct sched_account {
  atomic_int refs;
  _Atomic int64_t owed_ns;
  _Atomic uint64_t largest_ns; /* the largest op's measured device ns */
} sched_account;

/* The policy's state in each session. */
typedef struct sched_policy_node {
  sched_session *prev, *next; /* in its band's ready list */
  double vtime;               /* charged device ns / weight */
  uint64_t served_ns;         /* device ns charged, corrections included */
  sched_account *acct;
} sched_policy_node;

typedef struct sched_policy_band {
  sched_session *head, *tail;
  double vtime; /* the band's virtual time when none is ready: the last
                   picked session's, or the last to leave's */
} sched_policy_band;

/* The policy's state in the scheduler: the ready set. */
typedef struct sched_policy_queue {
  bool round_robin;
  sched_policy_band bands[SCHED_NUM_BANDS];
  int ready; /* sessions in the set */
} sched_policy_queue;

void sched_policy_init(sched_policy_queue *q, bool round_robin);

/* A session's account: set up at its creation (false on host OOM), dropped
 * at its free (in-flight ops keep theirs). */
bool sched_policy_session_init(sched_session *ss);
void sched_policy_session_fini(sched_session *ss);
sched_account *sched_account_ref(sched_account *a);
void sched_account_put(sched_account *a);

/* Adds a session that has queued ops and is not in the set, lifting its
 * virtual time to its band's (see above). */
void sched_policy_ready(sched_policy_queue *q, sched_session *ss);

/* Whether a ready session may be served now: the dispatcher's test that
 * the devices of its next op have dispatch-ahead room (dispatch.c). */
typedef bool (*sched_policy_can_fn)(void *arg, sched_session *ss);

/* Removes the session to serve next from the set, among those `can`
 * accepts (NULL: all): the highest band with an accepted session, the
 * smallest vtime in it (round-robin: the first accepted in FIFO order).
 * *ops gets the most ops it may take this turn (SCHED_DISPATCH_BATCH) and
 * *budget_ns the estimated device ns it may take (at least one op whatever
 * its cost; UINT64_MAX: no bound). NULL when none is accepted. */
sched_session *sched_policy_pick(sched_policy_queue *q, int *ops,
                                 uint64_t *budget_ns, sched_policy_can_fn can,
                                 void *arg);
/* True when a ready session is accepted by `can` (NULL: any ready). */
bool sched_policy_can_pick(const sched_policy_queue *q, sched_policy_can_fn can,
                           void *arg);

/* Charges `cost_ns` estimated device ns for the ops taken from `ss` (picked
 * before); `more`: ops remain queued, so the session goes back into the set
 * (behind its band's other sessions of equal virtual time). */
void sched_policy_charge(sched_policy_queue *q, sched_session *ss,
                         uint64_t cost_ns, bool more);

/* A completed op took `measured_ns - estimated_ns` more device time than it
 * was charged (negative: less). Any thread, no lock: folded in later. */
void sched_policy_correct(sched_account *a, int64_t delta_ns);
/* Notes an op's measured device ns (the largest is kept: the unit of the
 * lag bound). Any thread, no lock. */
void sched_account_note_op(sched_account *a, uint64_t ns);

/* True when no session is ready. */
bool sched_policy_empty(const sched_policy_queue *q);

#endif /* PARADEV_SCHED_POLICY_H */
