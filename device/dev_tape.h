/* The engine's gradient tape: part of device.h's consumer interface, which
 * includes this file at its end (include device.h, not this). Split out of
 * device.h by domain: recording ops and computing their vector-Jacobian
 * products. */
#ifndef PARADEV_DEV_TAPE_H
#define PARADEV_DEV_TAPE_H

#ifndef PARADEV_DEVICE_H
#error "include device.h, which includes dev_tape.h"
#endif

/* ------------------------------------------------------------------------ */
/* Gradient tape                                                             */
/*
 * A tape records the ops that depend on the tensors it watches and computes
 * gradients by walking them backwards, as TensorFlow's GradientTape
 * (tensorflow/c/eager/tape.h; the vector-Jacobian products follow
 * tensorflow/python/ops/math_grad.py, nn_grad.py and array_grad.py).
 *
 *  - Tracked tensors are the watched ones and the floating outputs of
 *    recorded ops. dev_tape_record records an op when one of its inputs is
 *    tracked and it has a floating output; integer and bool values are never
 *    tracked, so they carry no gradient. OnesLike and ZerosLike have a zero
 *    gradient (TensorFlow's NotDifferentiable) and are not recorded.
 *  - Gradients are parallel tensors like any other: one gradient per
 *    component, computed by ordinary engine ops queued with dev_execute
 *    (asynchronous; a failure shows on the gradient tensors). The ops a
 *    gradient runs are not themselves recorded (no higher-order gradients
 *    on one tape); inside a function, a Gradients node over a region that
 *    holds another one's backward nodes differentiates them (gradients of
 *    gradients, device/fn/gradients.c), through the gradient ops' VJPs.
 *  - A tape keeps a reference to every input and output of every op it
 *    recorded (references only, no copies of data) until dev_tape_destroy,
 *    or, for a one-shot tape, until its one successful dev_tape_gradient.
 *  - Gradient ops that need a shape which may differ between components
 *    (uneven shards) take the forward tensor as a `like` input and read only
 *    its shape: BroadcastToLike, SumToLike, ReshapeLike, SliceGrad,
 *    ConcatGrad, GatherGrad (device/ops/grad_ops.c), beside TensorFlow's
 *    ReluGrad, SqrtGrad, RsqrtGrad, TanhGrad and SigmoidGrad.
 *
 * Ops with a gradient: Add Sub Mul Div Neg Abs Exp Log Sqrt Rsqrt Square
 * Tanh Sigmoid Relu Pow Maximum Minimum MatMul BatchMatMul BiasAdd Sum Mean
 * Max Min Reshape Transpose Concat Slice Gather Cast Identity Softmax
 * LogSoftmax SparseSoftmaxCrossEntropyWithLogits AllReduce (sum and mean)
 * Broadcast AllGather ReduceScatter (sum and mean), and the gradient ops
 * ReluGrad TanhGrad SigmoidGrad SqrtGrad RsqrtGrad SumToLike BroadcastToLike
 * ReshapeLike (device/vjp.c's table; vjp_more.c). Broadcasting is undone: an
 * input's gradient is summed over the axes it was broadcast along.
 * Maximum/Minimum send the gradient of a tie to x, as TensorFlow; the Max and
 * Min reductions spread it equally over the tied elements (_MinOrMaxGrad).
 * Abs: dy * sign(x), 0 at 0. Broadcast: the root gets the sum over devices
 * of dy, the others zeros; AllGather: a ReduceScatter (sum) of dy along the
 * gather axis (the components' sizes along it must be numpy.array_split's);
 * ReduceScatter: an AllGather of dy along axis 0.
 *
 * Thread safety: a tape is not thread-safe; it is used by one thread at a
 * time (the session's). Different tapes are independent.
 */

typedef struct dev_tape dev_tape;

/* Creates an empty tape on engine `e`. A persistent tape answers any number
 * of dev_tape_gradient calls; a one-shot tape answers one and then releases
 * what it recorded. Errors: RESOURCE_EXHAUSTED (host memory). */
pd_code dev_tape_create(dev_engine *e, bool persistent, dev_tape **out,
                        dev_status *st);

/* Releases every tensor reference the tape holds and frees it. Accepts NULL.
 * Must be called before dev_engine_destroy. */
void dev_tape_destroy(dev_tape *tape);

/* Watches `t`: ops that consume it are recorded from now on, and it can be a
 * source of dev_tape_gradient. The tape keeps a reference. Watching a tensor
 * twice is a no-op; watching one of an integer or bool dtype is accepted and
 * does nothing (its gradient is zeros, as TensorFlow ignores it).
 * Errors: INVALID_ARGUMENT (t is NULL), FAILED_PRECONDITION (t belongs to
 * another engine, or the tape is one-shot and already used),
 * RESOURCE_EXHAUSTED (host memory). */
pd_code dev_tape_watch(dev_tape *tape, dev_tensor *t, dev_status *st);

/* Offers a prepared op to the tape. Called by whoever executes ops, for each
 * active tape, after dev_op_prepare and before dev_op_submit (submission
 * hands the op over). The tape records the op if an input is tracked and an
 * output is floating, keeping references to its inputs and outputs and a
 * copy of its attributes; otherwise it does nothing. Cost: one allocation
 * and a hash lookup per input; no data is touched and nothing waits.
 * Recording the same op twice records it once; a used one-shot tape records
 * nothing. Errors: INVALID_ARGUMENT (NULL op), FAILED_PRECONDITION (the op
 * belongs to another engine), RESOURCE_EXHAUSTED (host memory; nothing is
 * recorded and the op itself is unaffected). */
pd_code dev_tape_record(dev_tape *tape, const dev_op *op, dev_status *st);

/* How a tape runs its gradient ops: dev_execute's contract (validate, infer,
 * queue; outputs are new references). A daemon passes a function that queues
 * the op on the session's queue, so gradient ops keep the session's order
 * after the forward ops that may not have reached the devices yet. */
typedef pd_code (*dev_execute_fn)(void *arg, const char *op_name,
                                  dev_tensor *const *inputs, int num_inputs,
                                  const dev_attr *attrs, int num_attrs,
                                  dev_tensor **outputs, int *num_outputs,
                                  dev_status *st);

/* Sets the executor of `tape`'s gradient ops (NULL: dev_execute on the
 * tape's engine). Not thread-safe against a running dev_tape_gradient. */
void dev_tape_set_executor(dev_tape *tape, dev_execute_fn fn, void *arg);

/* Computes d(target)/d(sources[i]) for i < n_sources, weighted by the
 * upstream gradient: the vector-Jacobian product of every recorded op from
 * `target` back to each source, summed over all paths.
 *
 * target:           a floating tensor (normally a loss); need not be tracked.
 * sources:          n_sources >= 0 tensors; a source that is not tracked, or
 *                   that target does not depend on through recorded ops, gets
 *                   zeros of its own dtype and component shapes. A source
 *                   equal to target gets the upstream gradient.
 * output_gradients: NULL for ones like target, or output_gradients[0] is the
 *                   upstream gradient of target: on target's device set
 *                   (issue #17), of target's dtype and, on every component,
 *                   target's shape.
 * out_grads:        room for n_sources tensors; on success out_grads[i] is a
 *                   new reference to a tensor of sources[i]'s dtype and
 *                   component shapes. The values are computed asynchronously
 *                   (dev_tensor_wait reports a failure of any op on the way).
 * Errors: INVALID_ARGUMENT (a NULL or non-floating target; n_sources < 0; a
 *         NULL source; an output gradient on another device set than the
 *         target's, or of the wrong dtype or shape; the
 *         target depends on a source through an op that has no gradient --
 *         the message names the op -- or through AllReduce with a reduction
 *         other than sum or mean), FAILED_PRECONDITION (a one-shot tape used
 *         before; a tensor of another engine), RESOURCE_EXHAUSTED (host
 *         memory). On error nothing is written and the tape is unchanged (a
 *         one-shot tape can be asked again).
 * Source: GradientTape.gradient and imperative_grad (TensorFlow eager). */
pd_code dev_tape_gradient(dev_tape *tape, dev_tensor *target,
                          dev_tensor *const *sources, int n_sources,
                          dev_tensor *const *output_gradients,
                          dev_tensor **out_grads, dev_status *st);

#endif /* PARADEV_DEV_TAPE_H */
