/* Private header of the function library, its instantiations and the call
 * executor (library.c, convert.c, instance.c, run.c): what they share and
 * nothing the passes need (those see fn_int.h only).
 *
 * Lifetime: a library holds its functions (fn_func); a function holds its
 * cached instantiations (fn_inst, most recently used first). An
 * instantiation is reference-counted: the cache holds one reference, each
 * prepared or queued call (fn_call_state, op->fn_call) another, so an
 * evicted instantiation, or one of a destroyed library, lives until the
 * last call using it is freed (dev__op_free -> the state's hdr.free). */
#ifndef PARADEV_FN_CALL_H
#define PARADEV_FN_CALL_H

#include "fn_int.h"

/* One device's CUDA graph of an instantiation (DEV_PASS_CUDA_GRAPH, run.c):
 * captured on the first call, replayed after; its inputs, outputs and
 * values live at fixed offsets of one persistent allocation. Touched only
 * by that device's executor (and freed with the instantiation). */
typedef struct fn_cg {
  int state; /* 0: not tried; 1: captured; -1: stream execution */
  void *graph;
  char *mem;
  size_t mem_bytes;
  uint64_t *off; /* [n_args + n_outputs + n_nodes * FN_MAX_NODE_OUTPUTS] */
} fn_cg;

/* One instantiation: the optimized graph for one signature, its buffer
 * plan, its uploaded constants and the op definition its calls carry. */
typedef struct fn_inst {
  atomic_int refs;
  dev_engine *engine;
  /* The devices its calls run on (issue #17): n_dev == set.n, component d
   * (arenas, cg[d], consts) on engine device set.dev[d]. */
  dev_devset set;
  fn_graph *g; /* optimized, compacted, inferred */
  fn_buffer_plan plan;
  bool planned;        /* plan holds offsets (buffer planning in force) */
  dev_tensor **consts; /* [g->n_consts], mirrored, owned */
  unsigned char *key;  /* the signature key (instance.c sig_key) */
  size_t key_len;
  int n_args;
  pd_dtype *arg_dtype;    /* [n_args], for miss reasons */
  dev_shape *arg_shape;   /* [n_args * n_dev] */
  bool *arg_not_mirrored; /* [n_args] */
  int *coll_nodes;        /* indices of collective nodes */
  int n_coll;
  fn_cg *cg; /* [n_dev] when CUDA graphs are in force and possible */
  atomic_bool cg_captured;
  uint64_t transient_bytes; /* what a call allocates while it runs, all
                               devices together (fn_transient_bytes) */
  dev_op_def def; /* the call's def: flags DEV_OP_FUNCTION, name fn_name */
  dev_fn_inst_info info;
  _Atomic uint64_t calls;
  /* A negative entry: instantiating this signature failed with this code
   * (info.error the message); g is NULL and the call is refused at once. */
  pd_code failed;
} fn_inst;

/* What one device's run of a call allocated (run.c): the value pointers,
 * the bytes + 1 of each allocation of its own (0: none), the arena. */
typedef struct fn_run_mem {
  void **val;  /* [n_nodes * FN_MAX_NODE_OUTPUTS] */
  size_t *own; /* [n_nodes * FN_MAX_NODE_OUTPUTS] */
  char *arena; /* inst->plan.arena_bytes[device] bytes */
} fn_run_mem;

/* What a prepared call holds (dev_op.fn_call). */
typedef struct fn_call_state {
  dev__fn_call hdr; /* first: what the engine's files call (device_int.h) */
  fn_inst *inst;    /* a reference */
  void **colls;     /* [inst->n_coll] rendezvous, from collective_create */
  int n_coll;
  /* [n_dev] when the body has collectives: each device's run leaves its
   * memory here (peers may still read it) and the state's free releases
   * it once every device is done (run.c's opening comment). */
  fn_run_mem *mem;
} fn_call_state;

/* A registered function. */
typedef struct fn_func {
  char *name;
  fn_graph *g; /* registered (n_dev 0), topologically sorted */
  char *canon; /* canonical text of the definition (identity check) */
  size_t canon_len;
  dev_fn_options opts;
  fn_inst *insts[DEV_FN_MAX_INST_CAP]; /* most recently used first */
  int n_insts;
  fn_inst *last_used; /* a reference, for describe's optimized graph */
  uint64_t hits, misses, evictions;
  int n_miss;
  char miss[DEV_FN_MISS_REASONS][256]; /* latest first */
} fn_func;

struct dev_fn_lib {
  dev_engine *engine;
  dev_fn_config cfg;
  pthread_mutex_t mu; /* guards everything below and every fn_func */
  fn_func *fns[DEV_FN_MAX_PER_LIB];
  int n;
};

/* settings.c: the function named `name`, or NULL (lib->mu held). */
fn_func *fn_lib_find(const dev_fn_lib *lib, const char *name);
/* A lookup for fn_inline_calls over a library (arg: the dev_fn_lib). */
const fn_graph *fn_lib_lookup(void *arg, const char *name);
/* The pass `p` in force for function options `o` under config `c`. */
dev_tristate fn_pass_in_force(const dev_fn_options *o, const dev_fn_config *c,
                              dev_fn_pass p);
/* Sends "what" for function `fn` to the config's log. */
void fn_log(const dev_fn_config *c, dev_fn_log_level level, const char *fn,
            const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* convert.c (canon.c: fn_graph_canonical). Builds a graph (n_dev 0) from a definition and validates it as
 * dev_fn_register documents; `lookup` resolves calls of other functions
 * (NULL: none allowed). With `base` (an external pass's result over the
 * graph `base`), nodes of op "_Const" with int attr "index" stand for
 * base's constant `index`, calls and Gradients nodes are refused. */
pd_code fn_graph_from_def(const dev_fn_def *def, const fn_graph *base,
                          fn_lookup_fn lookup, void *arg, fn_graph **out,
                          dev_status *st);
/* names.c. True when `s` is a valid name of a function, argument, node or output
 * (and an origin): 1..DEV_FN_NAME_MAX bytes of well-formed UTF-8 without
 * ':', spaces, invisible format characters or control characters (C0, DEL,
 * C1), so every name can be sent as a proto3 string and shows as it is.
 * *bad_at (may be NULL) gets the offset of the first byte refused, or
 * (size_t)-1 when the length is what is wrong. */
bool fn_name_is_valid(const char *s, size_t *bad_at);
/* Copies s for a message: valid UTF-8 kept as it is (names in any
 * language come out exactly as given), control characters and bytes that
 * are not UTF-8 as \xNN; cut to fit `len` between characters. Returns out. */
char *fn_name_printable(const char *s, char *out, size_t len);
/* Checks node i of d: its origins by the name rule and, when `external`
 * (an external pass's result), its attribute names and string values
 * (UTF-8 text without control characters). INVALID_ARGUMENT naming the
 * function, the node and the bad string (shown by fn_name_printable). */
pd_code fn_check_node_strings(const dev_fn_def *d, int i, bool external,
                              dev_status *st);
/* The definition of g in one allocation (dev_fn_def_free): nodes in g's
 * order, outputs_info filled when g is instantiated, origins, and one
 * "_Const" node per constant. NULL on host out of memory. */
dev_fn_def *fn_graph_to_def(const fn_graph *g);
/* Canonical text of a registered graph (fn_graph_from_def's) and its
 * options under library config c: equal texts are identical registrations
 * (node order, attribute order and defaults, "a:0" for "a", DEFAULT for
 * the setting in force do not count). Caller frees; NULL on OOM. */
char *fn_graph_canonical(const fn_graph *g, const dev_fn_options *o,
                         const dev_fn_config *c, size_t *len);

/* pipeline.c. Runs the built-in passes in force (each on a backup: an
 * error or a failed check restores it and is logged) and then the external
 * passes on *g, recording pass_changes and external_changed in info (a
 * pass that cannot run is skipped and logged). Fails only when
 * dev_monotonic_now() is past `deadline` (0: none) after a pass or a
 * plugin: RESOURCE_EXHAUSTED naming the function, instantiation_max_ms
 * (budget_ms) and that pass or plugin. */
pd_code fn_pipeline(dev_fn_lib *lib, const fn_func *f, fn_graph **g,
                    dev_fn_inst_info *info, double deadline, int budget_ms,
                    dev_status *st);
/* Plans inst's buffers when DEV_PASS_BUFFER_PLANNING is in force (else, or
 * when planning fails, every value gets its own allocation); fills
 * info.arena_bytes and the pass_changes of planning and CUDA graphs. */
void fn_plan_for(dev_fn_lib *lib, const fn_func *f, fn_inst *inst);

/* run.c: device `device`'s part of a call (dev__fn_call.run). */
bool fn_run_call(dev_op *op, int device, const void *const *in_data,
                 void *const *out_data, bool failed, _Atomic uint64_t *beats,
                 dev_status *st);
/* Frees what device `device`'s run allocated (*m zeroed after). */
void fn_run_release(const fn_inst *inst, int index, fn_run_mem *m);
/* The bytes a call of inst allocates while it runs, summed over devices
 * (as a tensor's bytes are): the arena where planned, plus every value
 * run.c gives an allocation of its own (neither a graph output, nor an
 * alias of its input, nor in the arena). Set inst->planned and the plan
 * first. */
uint64_t fn_transient_bytes(const fn_inst *inst);

/* inline.c: inlines the call at node i of g (its callee `callee`) in
 * place: the callee's nodes take positions i.. (not inferred). */
pd_code fn_inline_call_at(fn_graph *g, int i, const fn_graph *callee,
                          dev_status *st);

/* inline.c: every call of g inlined front to back in one pass, in time
 * linear in the nodes made (fn_inline_call_at rebuilds the node array per
 * call: quadratic for functions nesting calls). Each node appended (an OP
 * or GRADIENTS node, named "call/.../node") is handed to `emit` (g, its
 * index) before the next is appended, so a call's inputs are inferred when
 * it is reached; `check` (may be NULL) sees each call's node (its inputs
 * already mapped) and its callee before the callee's nodes are made.
 * Errors: INVALID_ARGUMENT (a callee not in the library, the wrong number
 * of inputs, calls nesting deeper than DEV_FN_MAX_CALL_DEPTH, more than
 * DEV_FN_MAX_NODES nodes: checked as each node is made, naming the call);
 * RESOURCE_EXHAUSTED when dev_monotonic_now() passes `deadline` (0: none)
 * before it is done, or on host memory; what emit and check return. On an
 * error g is left valid to free only. */
typedef pd_code (*fn_emit_fn)(void *arg, fn_graph *g, int i, dev_status *st);
typedef pd_code (*fn_check_call_fn)(void *arg, fn_graph *g, const fn_node *call,
                                    const fn_graph *callee, dev_status *st);
typedef struct fn_inline_ctx {
  fn_lookup_fn lookup;
  void *lookup_arg;
  fn_emit_fn emit;
  fn_check_call_fn check;
  void *arg; /* emit's and check's */
  double deadline;
  int budget_ms; /* for the message */
} fn_inline_ctx;
pd_code fn_inline_all(fn_graph *g, const fn_inline_ctx *x, dev_status *st);

/* instance.c */
void fn_inst_unref(fn_inst *inst); /* accepts NULL */
pd_code fn_prepare_call_locked(dev_fn_lib *lib, fn_func *f,
                               const dev_devset *set, dev_tensor *const *inputs,
                               int num_inputs, dev_op **out, dev_status *st);

#endif /* PARADEV_FN_CALL_H */
