/* libparadev: gradient tapes on the daemon (StartTape, WatchTape, Gradient,
 * DeleteTape), as calls and as stream items.
 *
 * Part of the API of <paradev/paradev.h>, which includes this header: include
 * that one. Its conventions hold here.
 */
#ifndef PARADEV_TAPE_H
#define PARADEV_TAPE_H

#include "paradev/paradev.h"
#include "paradev/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Gradient tapes
 *
 * A tape lives on the daemon, in the session, under a 64-bit id the caller
 * chooses (unique among the session's live tapes; 0 is never valid;
 * pd_session_new_id gives a fresh one). While it exists, every op the session
 * runs whose inputs include a tensor the tape tracks (a watched handle, or a
 * floating output of an op it recorded) is recorded; pd_tape_gradient then
 * walks the recorded ops backwards and runs the gradient ops on the mesh like
 * any op: asynchronously, queued behind the forward ops, with results that
 * are handles whose dtype and shape are known at once. Integer and bool
 * values carry no gradient. Ops with a gradient: Add Sub Mul Div Neg Abs Exp
 * Log Sqrt Rsqrt Square Tanh Sigmoid Relu Pow Maximum Minimum MatMul
 * BatchMatMul BiasAdd Sum Mean Max Min Reshape Transpose Concat Slice Gather
 * Cast Identity Softmax LogSoftmax SparseSoftmaxCrossEntropyWithLogits
 * AllReduce (sum, mean) Broadcast AllGather ReduceScatter (sum, mean), and
 * the gradient ops ReluGrad TanhGrad SigmoidGrad SqrtGrad RsqrtGrad
 * SumToLike BroadcastToLike ReshapeLike (a tape does not record the ops its
 * own gradients run: gradients of gradients come from Gradients nodes
 * nested in a function, include/paradev/function.h). A session holds at
 * most 64 tapes; they are freed with it.
 *
 * Every tape call has an Enqueue item of the same meaning (pd_stream_tape_*)
 * so that a training step -- start, watch, forward, gradient, update, delete
 * -- is written without waiting for a single reply.
 *
 * Source: TensorFlow's GradientTape (tensorflow/c/eager/tape.h, the
 * gradients of math_grad.py, nn_grad.py, array_grad.py);
 * paradev.v1.ParallelDevice/StartTape, WatchTape, Gradient, DeleteTape. */

/* Starts tape `tape_id` in the session. A one-shot tape (persistent false)
 * answers one pd_tape_gradient and then releases what it recorded; a
 * persistent one answers any number until pd_tape_delete.
 * Errors:   PD_INVALID_ARGUMENT (id 0), PD_ALREADY_EXISTS (a live tape id),
 *           PD_RESOURCE_EXHAUSTED (64 tapes in the session), PD_NOT_FOUND
 *           (session gone), PD_FAILED_PRECONDITION (session closed),
 *           transport errors.
 * Thread safety: thread-safe; a tape records the ops of every thread of the
 *           session in the order the daemon receives them. */
pd_code pd_tape_start(pd_session *s, uint64_t tape_id, bool persistent,
                      const pd_call_options *call, pd_status *st);

/* Watches handles ids[0..n) on the tape, all or nothing: ops that consume
 * them are recorded from now on, and they can be sources of a gradient.
 * Watching a handle twice, or one of an integer or bool dtype, does nothing.
 * Errors:   PD_NOT_FOUND (an unknown tape or handle: nothing is watched),
 *           PD_FAILED_PRECONDITION (a one-shot tape that already computed
 *           its gradient), PD_INVALID_ARGUMENT (over max_ids_per_request),
 *           transport errors.
 * Thread safety: thread-safe. */
pd_code pd_tape_watch(pd_session *s, uint64_t tape_id, const uint64_t *ids,
                      int n, const pd_call_options *call, pd_status *st);

/* Gradients of `target` with respect to sources[0..n_sources), weighted by
 * the upstream gradient: the vector-Jacobian product of every recorded op
 * from target back to each source, summed over all paths.
 *
 * target:          a handle of a floating dtype (normally a loss).
 * sources:         n_sources handles; one the target does not depend on
 *                  through recorded ops gets zeros of its dtype and shape.
 * output_gradient: the upstream gradient of target (its dtype and shape), or
 *                  0 for ones like the target.
 * result_ids:      n_sources fresh ids; an entry of 0 is replaced by a fresh
 *                  id (written back). Result i is the gradient for source i,
 *                  of its dtype and shape; *results (may be NULL; n_sources
 *                  entries) gets the results' dtypes and shapes.
 * Returns once the gradient ops are validated and queued: a failure on a
 *                  device shows on the results (pd_sync, pd_download).
 * Errors:   PD_INVALID_ARGUMENT (a non-floating target, an output gradient of
 *           the wrong dtype or shape, a path from target to a source through
 *           an op that has no gradient -- the message names the op -- or
 *           over max_ids_per_request), PD_NOT_FOUND (an unknown tape, target,
 *           source or output gradient), PD_ALREADY_EXISTS (a live result
 *           id), PD_FAILED_PRECONDITION (a one-shot tape used before),
 *           PD_RESOURCE_EXHAUSTED (the session's memory quota -- the gradient
 *           ops count against it -- or its handle or queue limits),
 *           transport errors. On error no result exists and a one-shot tape
 *           may be asked again.
 * Thread safety: thread-safe.
 * Source: GradientTape.gradient (TensorFlow eager); dev_tape_gradient. */
pd_code pd_tape_gradient(pd_session *s, uint64_t tape_id, uint64_t target,
                         const uint64_t *sources, int n_sources,
                         uint64_t output_gradient, uint64_t *result_ids,
                         pd_tensor_info *results, const pd_call_options *call,
                         pd_status *st);

/* Deletes the tape; the daemon releases what it recorded (tensors whose
 * handles were deleted are freed once no queued op uses them).
 * Errors:   PD_NOT_FOUND (no such tape, or session gone), transport errors.
 * Thread safety: thread-safe. */
pd_code pd_tape_delete(pd_session *s, uint64_t tape_id,
                       const pd_call_options *call, pd_status *st);

/* The same four as items of an Enqueue stream: they return at once (unless
 * max_in_flight items await replies) and their outcome comes in their reply
 * (pd_stream_wait reports failures); a gradient item's reply carries the
 * results as its outputs. Arguments and errors as the unary calls; ops and
 * tape items of one stream take effect in the order they were queued.
 * Errors (at once):   PD_INVALID_ARGUMENT (NULL stream or ids, a negative
 *                     count, target 0), the stream's final error,
 *                     PD_FAILED_PRECONDITION (after pd_stream_close).
 * Thread safety: one thread at a time per stream. */
pd_code pd_stream_tape_start(pd_stream *t, uint64_t tape_id, bool persistent,
                             uint64_t *index, pd_status *st);
pd_code pd_stream_tape_watch(pd_stream *t, uint64_t tape_id,
                             const uint64_t *ids, int n, uint64_t *index,
                             pd_status *st);
pd_code pd_stream_tape_gradient(pd_stream *t, uint64_t tape_id, uint64_t target,
                                const uint64_t *sources, int n_sources,
                                uint64_t output_gradient, uint64_t *result_ids,
                                uint64_t *index, pd_status *st);
pd_code pd_stream_tape_delete(pd_stream *t, uint64_t tape_id, uint64_t *index,
                              pd_status *st);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_TAPE_H */
