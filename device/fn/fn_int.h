/* Private header of device/fn/ (graph functions, issue #11): the graph the
 * passes work on, its helpers (graph.c), the pipeline's pass table, and the
 * plan an executor runs. Not for other layers (they use dev_function.h).
 *
 * Files (see device/README.md):
 *   graph.c      the graph: create, clone, free, add nodes, uses, replace,
 *                compact, infer one node (this header's fn_graph_*)
 *   library.c    dev_fn_lib: register, lookup, describe (fn_call.h is the
 *                private header of library, instances and calls)
 *   settings.c   pass names, tri-state merge, the log, lookups by name
 *   canon.c      canonical text of a registration (equivalent re-register)
 *   instance.c   instantiation: signature, cache, miss reasons, the call op
 *   pipeline.c   the passes in force with rollback, external passes, plan
 *   inline.c     calls of other functions inlined
 *   gradients.c  Gradients nodes expanded through the tape's VJPs
 *   passes_*.c   the built-in passes (pruning, cse, fold, arithmetic,
 *                fusion, buffer planning)
 *   convert.c    dev_fn_def -> validated, sorted graph (registration,
 *                external passes' results); graph -> dev_fn_def
 *   names.c      the name rule (UTF-8, no ':', spaces, controls), names
 *                in messages, a node's origins and string attributes
 *   run.c        one device's part of a call (the executor's), the plan
 *
 * Conventions: a graph's nodes are always in topological order (a node's
 * inputs refer to args, constants or earlier nodes). A pass marks nodes
 * dead and redirects uses (fn_graph_replace_uses); fn_graph_compact drops
 * dead nodes and renumbers references. Every string and attribute list a
 * graph holds lives in the graph's own allocations (fn_graph_strdup,
 * fn_node_set_attrs): passes never point into another graph.
 */
#ifndef PARADEV_FN_INT_H
#define PARADEV_FN_INT_H

#include "../device_int.h"

/* --- values --------------------------------------------------------------- */

typedef enum fn_ref_kind {
  FN_REF_ARG = 0,   /* argument idx */
  FN_REF_NODE = 1,  /* output `out` of node idx */
  FN_REF_CONST = 2, /* constant idx (fn_graph.consts) */
} fn_ref_kind;

typedef struct fn_ref {
  fn_ref_kind kind;
  int idx;
  int out;
} fn_ref;

static inline fn_ref fn_arg_ref(int i) { return (fn_ref){FN_REF_ARG, i, 0}; }
static inline fn_ref fn_node_ref(int n, int k) {
  return (fn_ref){FN_REF_NODE, n, k};
}
static inline fn_ref fn_const_ref(int c) {
  return (fn_ref){FN_REF_CONST, c, 0};
}
static inline bool fn_ref_eq(fn_ref a, fn_ref b) {
  return a.kind == b.kind && a.idx == b.idx &&
         (a.kind != FN_REF_NODE || a.out == b.out);
}

/* A constant made by constant folding (or a pass): a mirrored host value,
 * uploaded to every device when the plan is built (fn_plan.const_tensors). */
typedef struct fn_const {
  pd_dtype dtype;
  dev_shape shape;
  void *data; /* dense, row-major; owned by the graph */
  size_t bytes;
} fn_const;

/* --- nodes ---------------------------------------------------------------- */

typedef enum fn_node_kind {
  FN_NODE_OP = 0,        /* a registered op (def) */
  FN_NODE_CALL = 1,      /* a call of function `call` (before inlining) */
  FN_NODE_GRADIENTS = 2, /* DEV_FN_GRADIENTS_OP (before expansion) */
} fn_node_kind;

#define FN_MAX_NODE_OUTPUTS DEV_MAX_OUTPUTS

typedef struct fn_node {
  char *name;
  fn_node_kind kind;
  const dev_op_def *def; /* FN_NODE_OP */
  char *call;            /* FN_NODE_CALL: the function's name */
  fn_ref *in;            /* [n_in], owned */
  int n_in;
  /* FN_NODE_OP: resolved attributes, defaults filled (def->num_attrs),
   * strings and lists in attr_arena (owned). Other kinds: the attributes as
   * given (n_attrs of names in attr_names), e.g. "has_grad_y". */
  dev_attr_value attrs[DEV_MAX_ATTRS];
  char *attr_names[DEV_MAX_ATTRS]; /* non-OP kinds only */
  int n_attrs;                     /* non-OP kinds only */
  void *attr_arena;
  /* Outputs: count, and after inference their dtypes and component shapes
   * (out_shape[k * g->n_dev + d]); shapes owned. */
  int n_out;
  pd_dtype out_dtype[FN_MAX_NODE_OUTPUTS];
  dev_shape *out_shape;
  bool out_not_mirrored[FN_MAX_NODE_OUTPUTS];
  bool inferred;
  /* The registered nodes this one stands for (names, owned); n_origins 0:
   * itself. Errors at run time name them. */
  char **origins;
  int n_origins;
  bool dead; /* removed by a pass; dropped by fn_graph_compact */
} fn_node;

/* --- graphs --------------------------------------------------------------- */

typedef struct fn_graph {
  char *fn_name;
  int n_dev; /* 0 for a registered (not instantiated) graph */
  int n_args;
  char **arg_names;
  pd_dtype *arg_dtype;
  dev_shape *arg_shape;   /* [n_args * n_dev] when instantiated */
  bool *arg_not_mirrored; /* [n_args] when instantiated */
  fn_node *nodes;
  int n_nodes, cap_nodes;
  int n_outputs;
  char **out_names;
  fn_ref *outputs;
  fn_const *consts;
  int n_consts, cap_consts;
} fn_graph;

/* graph.c. Every function returning pd_code fails only on host memory
 * (RESOURCE_EXHAUSTED) unless it says more; on failure the graph is left
 * valid (possibly with a node added but unused, which pruning removes). */
fn_graph *fn_graph_new(const char *fn_name, int n_dev);
void fn_graph_free(fn_graph *g); /* accepts NULL */
/* Deep copy (the pipeline rolls a failed pass back to it). NULL on OOM. */
fn_graph *fn_graph_clone(const fn_graph *g);
char *fn_graph_strdup(const char *s); /* NULL on OOM (or NULL s) */
pd_code fn_graph_add_arg(fn_graph *g, const char *name, pd_dtype dt,
                         dev_status *st);
/* Appends a node of registered op `def` reading in[0..n_in) with the given
 * attributes (resolved like dev_op_prepare: unknown or mistyped ones are
 * INVALID_ARGUMENT naming the op), and infers it when the graph is
 * instantiated (what inference rejects is INVALID_ARGUMENT naming the node).
 * The name is made unique ("name", "name_1", ...). Appending keeps the
 * topological order when every input refers to earlier nodes. *idx gets the
 * new node's index. */
pd_code fn_graph_add_op(fn_graph *g, const char *name, const dev_op_def *def,
                        const fn_ref *in, int n_in, const dev_attr *attrs,
                        int n_attrs, int *idx, dev_status *st);
/* The same, inserting the node at position `pos` (references to nodes at
 * or after pos are renumbered); for passes that replace a node by several
 * that must come before its consumers. */
pd_code fn_graph_insert_op(fn_graph *g, int pos, const char *name,
                           const dev_op_def *def, const fn_ref *in, int n_in,
                           const dev_attr *attrs, int n_attrs, int *idx,
                           dev_status *st);
/* Appends a FN_NODE_GRADIENTS node (DEV_FN_GRADIENTS_OP, dev_function.h)
 * reading in[0..n_in) = y, the sources[, grad_y when has_grad_y] with the
 * attribute "has_grad_y"; its n_in - 1 - has_grad_y outputs are inferred as
 * the sources' dtypes and component shapes when the graph is instantiated.
 * INVALID_ARGUMENT: fewer than 1 (2 with grad_y) inputs or more than
 * FN_MAX_NODE_OUTPUTS sources; node limit. The name is made unique. */
pd_code fn_graph_add_gradients(fn_graph *g, const char *name, const fn_ref *in,
                               int n_in, bool has_grad_y, int *idx,
                               dev_status *st);
/* Sets node i's origins to the union of the origins of nodes[from[0..n)]
 * (a node without origins counts as its own name). */
pd_code fn_node_merge_origins(fn_graph *g, int i, const int *from, int n,
                              dev_status *st);
/* Adds a constant (data copied); *idx its index. */
pd_code fn_graph_add_const(fn_graph *g, pd_dtype dt, const dev_shape *shape,
                           const void *data, size_t bytes, int *idx,
                           dev_status *st);
/* Infers node i from its inputs (instantiated graphs): fills n_out,
 * out_dtype, out_shape, out_not_mirrored. INVALID_ARGUMENT naming the
 * function and node (and its origins) on what the op's inference rejects.
 * A Gradients node's outputs are its sources' dtypes and shapes (so nodes
 * after it infer before expansion); a call not inlined is INTERNAL. */
pd_code fn_graph_infer_node(fn_graph *g, int i, dev_status *st);
/* Infers every node in order. */
pd_code fn_graph_infer(fn_graph *g, dev_status *st);
/* dtype and component d's shape of a value. */
pd_dtype fn_ref_dtype(const fn_graph *g, fn_ref r);
const dev_shape *fn_ref_shape(const fn_graph *g, fn_ref r, int d);
bool fn_ref_not_mirrored(const fn_graph *g, fn_ref r);
/* Uses of every value: counts[i * FN_MAX_NODE_OUTPUTS + k] for node i's
 * output k, counting node inputs of live nodes and graph outputs (a graph
 * output counts FN_USE_OUTPUT extra, so passes can tell fetched values).
 * Caller frees. NULL on OOM. */
#define FN_USE_OUTPUT 1000000
int *fn_graph_use_counts(const fn_graph *g);
/* Redirects every use of `from` (node inputs at or after node `first`, and
 * graph outputs) to `to`. */
void fn_graph_replace_uses(fn_graph *g, fn_ref from, fn_ref to, int first);
/* Drops dead nodes (and constants nothing uses), renumbering references;
 * the order of the live nodes is kept. */
void fn_graph_compact(fn_graph *g);
/* Number of live nodes. */
int fn_graph_live(const fn_graph *g);
/* Checks the invariants (references in range and earlier, dtypes of node
 * inputs equal the producing outputs') after a pass: INTERNAL naming the
 * node on a violation. */
pd_code fn_graph_check(const fn_graph *g, dev_status *st);
/* "fn 'step', node 'dense1/relu' (fused from dense1/mm, dense1/bias)"
 * into buf; returns buf. */
char *fn_node_describe(const fn_graph *g, int i, char *buf, size_t len);
/* Attribute `name` of an OP node (NULL when the op has none). */
const dev_attr_value *fn_node_attr(const fn_node *n, const char *name);

/* --- the pipeline (instance.c) -------------------------------------------- */

/* What a pass may read while it runs. */
typedef struct fn_pass_ctx {
  dev_engine *engine;
  const dev_fn_config *cfg;   /* fold bounds, log */
  const dev_tristate *passes; /* in force, [DEV_PASS_COUNT], ON or OFF */
  double deadline;            /* dev_monotonic_now() bound (constant folding) */
} fn_pass_ctx;

/* A built-in pass: rewrites g in place; *changes gets the number of nodes
 * it removed or rewrote (0: left alone). A pass is idempotent: running it
 * again on its own output changes nothing. An error makes the pipeline
 * restore the graph from before the pass and log why (the registration and
 * the call go on). Passes: passes_prune.c, passes_cse.c, passes_fold.c,
 * passes_arith.c, passes_fusion.c. */
typedef pd_code (*fn_pass_fn)(fn_graph *g, const fn_pass_ctx *c, int *changes,
                              dev_status *st);
pd_code fn_pass_pruning(fn_graph *g, const fn_pass_ctx *c, int *changes,
                        dev_status *st);
pd_code fn_pass_cse(fn_graph *g, const fn_pass_ctx *c, int *changes,
                    dev_status *st);
pd_code fn_pass_constant_folding(fn_graph *g, const fn_pass_ctx *c,
                                 int *changes, dev_status *st);
pd_code fn_pass_arithmetic(fn_graph *g, const fn_pass_ctx *c, int *changes,
                           dev_status *st);
pd_code fn_pass_fusion(fn_graph *g, const fn_pass_ctx *c, int *changes,
                       dev_status *st);

/* Calls of other functions inlined (inline.c): every FN_NODE_CALL node is
 * replaced by the callee's nodes (renamed "call/node"), recursively up to
 * DEV_FN_MAX_CALL_DEPTH. `lookup` finds a registered graph by name. */
typedef const fn_graph *(*fn_lookup_fn)(void *arg, const char *name);
pd_code fn_inline_calls(fn_graph *g, fn_lookup_fn lookup, void *arg,
                        dev_status *st);

/* Gradients nodes expanded (gradients.c): every FN_NODE_GRADIENTS node of
 * an inferred graph is replaced by the backward nodes the tape's VJPs emit
 * (in order, so a Gradients node over a region holding an expanded one
 * gives gradients of gradients). INVALID_ARGUMENT naming the node when y
 * depends on a source through an op without a gradient. */
pd_code fn_expand_gradients(fn_graph *g, dev_engine *e, dev_status *st);

/* --- buffer planning (passes_buffers.c) ------------------------------------ */

/* Where each intermediate of one call lives on a device: one arena per
 * device per call, offsets by lifetime (values whose live ranges do not
 * overlap share bytes). Values that are graph outputs, args, constants or
 * made by an aliasing op (DEV_OP_ALIASES_INPUT: they share their input's
 * buffer, extending its lifetime) are not in the arena: offset
 * FN_NOT_PLANNED. */
#define FN_NOT_PLANNED UINT64_MAX
#define FN_ARENA_ALIGN 256
typedef struct fn_buffer_plan {
  int n_dev;
  uint64_t *arena_bytes;    /* [n_dev] */
  uint64_t *offset;         /* [n_nodes * FN_MAX_NODE_OUTPUTS * n_dev]:
                            (i * FN_MAX_NODE_OUTPUTS + k) * n_dev + d */
  uint64_t unplanned_bytes; /* fn_unplanned_bytes(g) */
} fn_buffer_plan;
/* Plans g (compacted, inferred). INVALID_ARGUMENT never; OOM only. */
pd_code fn_plan_buffers(const fn_graph *g, fn_buffer_plan *out, dev_status *st);
void fn_buffer_plan_free(fn_buffer_plan *p);
/* What one allocation per value the plan would place takes, each rounded
 * up to FN_ARENA_ALIGN as the arena's are: the largest device's sum, never
 * below its arena_bytes (0 on host out of memory). */
uint64_t fn_unplanned_bytes(const fn_graph *g);

#endif /* PARADEV_FN_INT_H */
