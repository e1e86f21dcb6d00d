/* Gradient tapes in sessions: part of scheduler.h's interface, which
 * includes this file at its end (include scheduler.h, not this).
 * scheduler/tapes.c implements it. */
#ifndef PARADEV_SCHED_TAPE_H
#define PARADEV_SCHED_TAPE_H

#ifndef PARADEV_SCHEDULER_H
#error "include scheduler.h, which includes sched_tape.h"
#endif

/* --- Gradient tapes -------------------------------------------------------
 *
 * A session's tapes (TensorFlow's GradientTape; device.h, "Gradient tape")
 * under client-chosen 64-bit ids (0 is reserved). Every op sched_execute
 * queues for the session is offered to each of its tapes (dev_tape_record,
 * between preparation and queueing); a tape records it when it consumes a
 * tensor the tape tracks. Gradient ops run through the tape's executor
 * (dev_tape_set_executor), which prepares each one and appends it to the
 * session's queue, in order, behind the forward ops it differentiates: they
 * are ordinary ops of the session (cancellable by tag, counted against
 * max_queued_ops and the memory quota) and their results are published as
 * handles at once. Tapes are freed with the session (close, lease expiry,
 * kill). A tape is used under the session's lock, one call at a time. */

#define SCHED_MAX_TAPES 64           /* per session */
#define SCHED_MAX_GRAD_SOURCES 65536 /* sources of one gradient */

/* Starts an empty tape `tape_id`; a one-shot tape (persistent false) answers
 * one gradient and then releases what it recorded. Errors: INVALID_ARGUMENT
 * (id 0), ALREADY_EXISTS (a live tape id), RESOURCE_EXHAUSTED (SCHED_MAX_TAPES
 * tapes, host memory), NOT_FOUND (the session closed meanwhile). */
pd_code sched_tape_start(sched_session *ss, uint64_t tape_id, bool persistent,
                         dev_status *st);

/* Watches handles ids[0..n) on tape `tape_id`, all or nothing (an integer or
 * bool handle is accepted and carries no gradient). Errors: NOT_FOUND (an
 * unknown tape or handle; nothing watched), FAILED_PRECONDITION (a one-shot
 * tape that computed its gradient), RESOURCE_EXHAUSTED (host memory). */
pd_code sched_tape_watch(sched_session *ss, uint64_t tape_id,
                         const uint64_t *ids, int n, dev_status *st);

/* One gradient request (borrowed memory). */
typedef struct sched_gradient {
  uint64_t tape_id;
  uint64_t target;
  const uint64_t *sources;
  int num_sources;
  uint64_t output_gradient;   /* 0: ones like the target */
  const uint64_t *result_ids; /* fresh ids, one per source */
  int num_results;
} sched_gradient;

/* Computes d(target)/d(sources[i]) on the tape (dev_tape_gradient), queueing
 * the gradient ops on the session's queue marked with `tag` (0: none), and
 * publishes result i under result_ids[i]; dtypes[i] and shapes[i] (room for
 * num_sources each) get its dtype and shape, known before the devices run.
 * Quota: every byte the gradient's ops allocate counts against the session's
 * free quota while the call runs (their temporaries are not handles); the
 * results are then charged as handles.
 * Errors: INVALID_ARGUMENT (counts that differ, a result id 0 or given twice,
 * and what dev_tape_gradient rejects: a non-floating target, a bad output
 * gradient, a path through an op with no gradient, whose name the message
 * gives), NOT_FOUND (an unknown tape, target, source or output gradient),
 * ALREADY_EXISTS (a live result id), FAILED_PRECONDITION (a one-shot tape
 * used before), RESOURCE_EXHAUSTED (quota, handle or queue limit, host
 * memory). On error no result is published; gradient ops queued before the
 * failure still run and are freed. */
pd_code sched_tape_gradient(sched_session *ss, const sched_gradient *g,
                            uint64_t tag, pd_dtype *dtypes, dev_shape *shapes,
                            dev_status *st);

/* Deletes tape `tape_id`, releasing what it recorded. NOT_FOUND when the
 * session has no such tape. */
pd_code sched_tape_delete(sched_session *ss, uint64_t tape_id, dev_status *st);

#endif /* PARADEV_SCHED_TAPE_H */
