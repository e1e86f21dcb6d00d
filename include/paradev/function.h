/* libparadev: graph functions on the daemon (RegisterFunction,
 * DescribeFunction), as calls and as stream items.
 *
 * Part of the API of <paradev/paradev.h>, which includes this header: include
 * that one. Its conventions hold here.
 */
#ifndef PARADEV_FUNCTION_H
#define PARADEV_FUNCTION_H

#include "paradev/paradev.h"
#include "paradev/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Graph functions
 *
 * A function is a graph the session registers once and then calls like an
 * op, by its name (pd_execute, pd_batch_add, pd_stream_execute): typed
 * arguments, nodes (a registered op, another function of the session, or
 * the pseudo-op "Gradients"), and named outputs. A node's input is written
 * "arg" (an argument's name), "node" (the node's output 0) or "node:k" (its
 * output k). The daemon instantiates the function per signature of the
 * call's inputs (dtypes and component shapes), optimizes it (pruning,
 * common subexpressions, constant folding, arithmetic simplification,
 * fusion into _FusedMatMul / _FusedElementwise, buffer planning, then its
 * optimizer plugins) and runs the whole body on every device as one op.
 *
 * "Gradients" (tf.gradients with one target): inputs y, x_0..x_{k-1} and,
 * with the bool attribute has_grad_y, the upstream gradient of y last;
 * outputs the k gradients of y with respect to each x_i. A whole training
 * step -- forward, loss, Gradients, AllReduce, update -- is one function.
 *
 * Functions belong to the session and are freed with it.
 * Source: TensorFlow's FunctionDef and Grappler; tf.gradients;
 * paradev.v1.ParallelDevice/RegisterFunction, DescribeFunction. */

typedef struct pd_function pd_function;

/* TF_TriState: DEFAULT defers to the daemon's configuration (default on). */
typedef enum pd_tristate {
  PD_TRISTATE_DEFAULT = 0,
  PD_TRISTATE_OFF = 1,
  PD_TRISTATE_ON = 2,
} pd_tristate;

/* The built-in passes, in the order the daemon runs them. */
typedef enum pd_pass {
  PD_PASS_PRUNING = 0,
  PD_PASS_CSE = 1,
  PD_PASS_CONSTANT_FOLDING = 2,
  PD_PASS_ARITHMETIC = 3,
  PD_PASS_FUSION = 4,
  PD_PASS_BUFFER_PLANNING = 5,
  PD_PASS_CUDA_GRAPH = 6,
} pd_pass;
#define PD_PASS_COUNT 7

/* "pruning", "cse", "constant_folding", "arithmetic", "fusion",
 * "buffer_planning", "cuda_graph"; NULL outside the enum. */
const char *pd_pass_name(pd_pass p);

/* A new, empty definition named `name` (copied), or NULL when out of
 * memory. Thread safety: one writer at a time. */
pd_function *pd_function_new(const char *name);
/* Accepts NULL. */
void pd_function_delete(pd_function *f);

/* Appends an argument (name copied). Returns its index, or -1 (remembered:
 * the registration then fails with PD_INVALID_ARGUMENT saying why) for a
 * NULL or empty name or out of memory. */
int pd_function_add_arg(pd_function *f, const char *name, pd_dtype dtype);

/* Appends a node: `op` a registered op, another function's name or
 * "Gradients"; inputs[0..n_inputs) as "arg", "node" or "node:k"; attrs may
 * be NULL. Everything is copied. The daemon validates (unknown op, dangling
 * or cyclic input, duplicate name, arity, attribute names and kinds) and
 * names the node in its error. Errors: PD_INVALID_ARGUMENT (NULL or empty
 * name or op, negative count), PD_RESOURCE_EXHAUSTED. */
pd_code pd_function_add_node(pd_function *f, const char *name, const char *op,
                             const char *const *inputs, int n_inputs,
                             const pd_attrs *attrs, pd_status *st);

/* Appends an output named `name` whose value is `source` ("arg", "node" or
 * "node:k"). Errors as pd_function_add_node. */
pd_code pd_function_add_output(pd_function *f, const char *name,
                               const char *source, pd_status *st);

/* Switches a built-in pass for this function; caps its cache of
 * instantiations (0: the daemon's, default 8; at most 64). */
void pd_function_set_pass(pd_function *f, pd_pass pass, pd_tristate v);
void pd_function_set_max_instantiations(pd_function *f, int n);

/* Registers `f` in the session.
 * Errors: PD_INVALID_ARGUMENT (the definition, naming the node),
 *         PD_ALREADY_EXISTS (the name holds another body; an identical one
 *         is a no-op and *already_registered (may be NULL) is true),
 *         PD_RESOURCE_EXHAUSTED (the session's function limit), transport
 *         errors.
 * Thread safety: thread-safe. Source: RegisterFunction. */
pd_code pd_register_function(pd_session *s, const pd_function *f,
                             bool *already_registered,
                             const pd_call_options *call, pd_status *st);

/* The same as a stream item, ordered before the items that follow it; its
 * outcome arrives in the stream's replies (no outputs). Errors: as
 * pd_stream_execute. */
pd_code pd_stream_register_function(pd_stream *s, const pd_function *f,
                                    pd_status *st);

/* DescribeFunction's answer as JSON text (the wire message in protobuf's
 * JSON mapping, fields by their proto names), in *json (the caller frees it
 * with free()). Errors: PD_NOT_FOUND (no such function), transport
 * errors. Thread safety: thread-safe. Source: DescribeFunction. */
pd_code pd_describe_function(pd_session *s, const char *name, char **json,
                             const pd_call_options *call, pd_status *st);

#ifdef __cplusplus
}
#endif

#endif /* PARADEV_FUNCTION_H */
