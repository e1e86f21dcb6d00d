/* Graph functions (issue #11): part of device.h's consumer interface, which
 * includes this file at its end (include device.h, not this).
 *
 * A function is a graph registered once per session and called as one op:
 * named, typed arguments; nodes (a registered op, a call of another function
 * of the same library, or a Gradients node); named outputs. It is
 * instantiated per signature (the arguments' dtypes and component shapes,
 * and whether each is known not to be mirrored), optimized by a fixed
 * pipeline of built-in passes and then by external passes (the daemon's
 * optimizer plugins, include/paradev/optimizer.h), and run on every device
 * of the engine as one op in the one global order: each device's executor
 * runs the whole body on its component, so collectives inside a body keep
 * the one-order rule.
 *
 * Source: TensorFlow's FunctionDef (tensorflow/core/framework/function.proto)
 * for the shape of a definition, the "node:k" input syntax and instantiation
 * per signature; Grappler (tensorflow/core/grappler/optimizers) for the
 * passes and their order; tf.gradients for the Gradients node; JAX's
 * explain_cache_misses for the miss reasons.
 */
#ifndef PARADEV_DEV_FUNCTION_H
#define PARADEV_DEV_FUNCTION_H

#ifndef PARADEV_DEVICE_H
#error "include device.h, which includes dev_function.h"
#endif

/* --- Limits --------------------------------------------------------------- */

#define DEV_FN_NAME_MAX 128 /* bytes of a function, node or arg name */
#define DEV_FN_MAX_NODES                                                       \
  4096                         /* nodes of one definition, and after
                                    inlining and gradient expansion */
#define DEV_FN_MAX_ARGS 64     /* arguments of one function (DEV_MAX_INPUTS) */
#define DEV_FN_MAX_PER_LIB 256 /* functions of one library (session) */
#define DEV_FN_MAX_INST_CAP 64 /* the largest max_instantiations */
#define DEV_FN_DEFAULT_INST_CAP 8
/* [functions] instantiation_max_ms by default (dev_fn_config). */
#define DEV_FN_DEFAULT_INST_MAX_MS 1000
#define DEV_FN_MAX_CALL_DEPTH 16 /* nested calls inlined */

/* The pseudo-op of a gradient node (tf.gradients with one target):
 *   inputs:  y (floating), x_0 .. x_{k-1}, and, when the node's bool attr
 *            "has_grad_y" is true, the upstream gradient of y last
 *            (y's dtype and component shapes; default: ones like y);
 *   outputs: k, output i = d(sum of y * grad_y)/d(x_i), x_i's dtype and
 *            component shapes; zeros where y does not depend on x_i.
 * Expanded at instantiation into the backward nodes the tape's VJPs
 * (device/vjp.c) emit; valid only inside a function. */
#define DEV_FN_GRADIENTS_OP "Gradients"

/* --- Options -------------------------------------------------------------- */

/* TF_TriState: DEFAULT leaves the choice to the next level (function
 * options over the daemon's config over the built-in default, which is ON
 * for every pass). */
typedef enum dev_tristate {
  DEV_TRI_DEFAULT = 0,
  DEV_TRI_OFF = 1,
  DEV_TRI_ON = 2,
} dev_tristate;

/* The built-in passes, in the order they run. */
typedef enum dev_fn_pass {
  DEV_PASS_PRUNING = 0, /* dead nodes (not reaching an output) */
  DEV_PASS_CSE = 1,     /* common subexpression elimination */
  DEV_PASS_CONSTANT_FOLDING = 2,
  DEV_PASS_ARITHMETIC = 3,      /* x*1, x+0, identities, transposes, reshapes */
  DEV_PASS_FUSION = 4,          /* _FusedMatMul, _FusedElementwise */
  DEV_PASS_BUFFER_PLANNING = 5, /* intermediates share memory by lifetime */
  DEV_PASS_CUDA_GRAPH = 6,      /* CUDA: capture once, replay per call */
  DEV_PASS_COUNT = 7,
} dev_fn_pass;

/* "pruning", "cse", "constant_folding", "arithmetic", "fusion",
 * "buffer_planning", "cuda_graph"; NULL outside the enum. */
const char *dev_fn_pass_name(dev_fn_pass p);
/* The pass named `name` (as above), or -1. */
int dev_fn_pass_from_name(const char *name);

/* Per-function options (registration). */
typedef struct dev_fn_options {
  size_t struct_size;
  dev_tristate passes[DEV_PASS_COUNT];
  int max_instantiations; /* 0: the library's; else 1..DEV_FN_MAX_INST_CAP */
} dev_fn_options;

#define DEV_FN_OPTIONS_INITIALIZER                                             \
  { sizeof(dev_fn_options), {DEV_TRI_DEFAULT}, 0 }

/* --- Definitions (borrowed views, as the server decodes them) ------------- */

typedef struct dev_fn_arg {
  const char *name;
  pd_dtype dtype;
} dev_fn_arg;

/* What inference found for one output of a node (filled in graphs the
 * engine hands out: external passes, dev_fn_describe; ignored on input). */
typedef struct dev_fn_value_info {
  pd_dtype dtype;
  dev_shape shape; /* common shape, -1 where components differ */
} dev_fn_value_info;

typedef struct dev_fn_node {
  const char *name;
  const char *op; /* a registered op, a function of the library, or
                     DEV_FN_GRADIENTS_OP */
  /* "arg" (an argument's name), "node" (its output 0) or "node:k" */
  const char *const *inputs;
  int num_inputs;
  const dev_attr *attrs;
  int num_attrs;
  /* The nodes of the registered definition this node stands for (a node
   * made by fusion names those it replaced); empty for an original node,
   * which stands for itself. */
  const char *const *origins;
  int num_origins;
  /* Out only (see dev_fn_value_info). */
  const dev_fn_value_info *outputs_info;
  int num_outputs_info;
} dev_fn_node;

typedef struct dev_fn_output {
  const char *name;
  const char *source; /* "arg", "node" or "node:k" */
} dev_fn_output;

typedef struct dev_fn_def {
  size_t struct_size;
  const char *name;
  const dev_fn_arg *args;
  int num_args;
  const dev_fn_node *nodes; /* any order; registration sorts them */
  int num_nodes;
  const dev_fn_output *outputs;
  int num_outputs;
} dev_fn_def;

#define DEV_FN_DEF_INITIALIZER                                                 \
  { sizeof(dev_fn_def), NULL, NULL, 0, NULL, 0, NULL, 0 }

/* A definition the engine allocated (dev_fn_describe, external passes'
 * input): one block, freed with dev_fn_def_free. Accepts NULL. */
void dev_fn_def_free(dev_fn_def *def);

/* --- External passes (the daemon's optimizer plugins) --------------------- */

/* A pass the engine runs after the built-in ones on every instantiation,
 * in registration order (dev_fn_config.external).
 *
 * run:  gets the instantiated, optimized graph `in` (borrowed for the call;
 *       outputs_info filled; the argument dtypes are the signature's) and
 *       the passes in force for the function; on PD_OK writes a new graph
 *       into *out, which the engine frees with `free_out` after use. The
 *       engine validates the result as a registration (every string:
 *       names and origins by the name rule, string attributes UTF-8
 *       text), that it keeps `in`'s function name, arguments (names,
 *       dtypes) and outputs (names, and inferred dtypes and component
 *       shapes); a failure there or an error from `run` leaves the graph as it
 *       was, and `on_error` (may be NULL) receives the pass name, the
 *       function and the reason (the daemon logs it). *changed: false when
 *       the pass left the graph alone (the engine keeps `in`).
 * Called on the thread instantiating (a caller of dev_fn_prepare_call),
 * possibly on several threads at once for different libraries. */
typedef struct dev_fn_external_pass {
  size_t struct_size;
  const char *name; /* "plugin:libfoo.so/fold_gelu": logs, describe */
  void *arg;
  pd_code (*run)(void *arg, const dev_fn_def *in,
                 const dev_tristate *passes /* [DEV_PASS_COUNT] */,
                 dev_fn_def **out, bool *changed, dev_status *st);
  void (*free_out)(void *arg, dev_fn_def *out);
} dev_fn_external_pass;

/* Engine-wide function settings, shared by every library (the daemon's
 * [functions] section). Copied by dev_fn_lib_create, except `external` and
 * `on_error`, which must outlive every library. */
/* How much an event matters: a cache miss is INFO; a pass rolled back, an
 * external pass refused or skipped is WARNING. */
typedef enum dev_fn_log_level {
  DEV_FN_LOG_INFO = 0,
  DEV_FN_LOG_WARNING = 1,
} dev_fn_log_level;
typedef void (*dev_fn_log_fn)(void *arg, dev_fn_log_level level,
                              const char *fn_name, const char *what);
/* Cache counts summed over every library whose config points here (a
 * daemon's /metrics): relaxed atomics, any thread. misses counts every
 * miss, failed instantiations included; instantiations the successful
 * ones; evictions those dropped for max_instantiations. */
#ifndef __cplusplus
typedef _Atomic uint64_t dev_fn_counter;
#else /* CUDA translation units (C++) see the layout only */
typedef uint64_t dev_fn_counter;
#endif
typedef struct dev_fn_counters {
  dev_fn_counter hits, misses, instantiations, evictions;
} dev_fn_counters;

typedef struct dev_fn_config {
  size_t struct_size;
  dev_tristate passes[DEV_PASS_COUNT]; /* the daemon's; DEFAULT: on */
  int max_instantiations;              /* 0: DEV_FN_DEFAULT_INST_CAP */
  /* Constant folding bounds: a folded value of at most this many bytes
   * (0: 65536), and at most this many ms spent folding one instantiation
   * (0: 50). */
  uint64_t fold_max_bytes;
  int fold_max_ms;
  const dev_fn_external_pass *const *external;
  int num_external;
  /* Where the engine reports what a daemon logs: a pass that failed and was
   * rolled back, a cache miss and its reason, an external pass refused.
   * NULL: nowhere. Called on the instantiating thread. */
  dev_fn_log_fn log;
  void *log_arg;
  /* Where the cache's counts are added (NULL: nowhere); shared, not
   * copied: it must outlive every library made with this config. */
  dev_fn_counters *counters;
  /* At most this many ms of inlining and gradient expansion per
   * instantiation (0: 1000): past it the call fails with RESOURCE_EXHAUSTED
   * naming the function and the phase; unlike the definition's own errors
   * it is not cached (it depends on the load). Added after counters (struct_size: older callers get 1000). */
  int instantiation_max_ms;
} dev_fn_config;

#define DEV_FN_CONFIG_INITIALIZER                                              \
  {                                                                            \
    sizeof(dev_fn_config), {DEV_TRI_DEFAULT}, 0, 0, 0, NULL, 0, NULL, NULL,    \
        NULL, 0                                                                \
  }

/* --- Libraries: one session's functions ------------------------------------ */

typedef struct dev_fn_lib dev_fn_lib;

/* Creates an empty library of functions on engine `e` (a session's).
 * `cfg` may be NULL (defaults). Errors: INVALID_ARGUMENT (a bad config:
 * max_instantiations outside 0..DEV_FN_MAX_INST_CAP), RESOURCE_EXHAUSTED.
 * Thread-safe. */
pd_code dev_fn_lib_create(dev_engine *e, const dev_fn_config *cfg,
                          dev_fn_lib **out, dev_status *st);

/* Frees the library, its functions and their instantiations (captured
 * constants released). Calls already prepared or submitted keep what they
 * need (each holds a reference on its instantiation). Accepts NULL. */
void dev_fn_lib_destroy(dev_fn_lib *lib);

/* Registers `def` (copied) with `opts` (NULL: defaults).
 * Validates: names (1..DEV_FN_NAME_MAX bytes of UTF-8 without ':', spaces
 * or control characters: a name in any language is kept as given), unique
 * among args and nodes; origins by the same rule; inputs "node:k" with k
 * in decimal without leading zeros; the function name not a registered op
 * nor DEV_FN_GRADIENTS_OP; every op
 * known (a registered op, a function already in the library, or
 * DEV_FN_GRADIENTS_OP); every input resolves to an arg or to an existing
 * output of a node; no cycle; arity of each node against its op (list
 * inputs per dev_op_input_length, a called function's args); attribute
 * names and types against the op's definition; outputs named uniquely and
 * resolving. Errors name the function and the node (or arg, or output):
 *   INVALID_ARGUMENT  any of the above; limits (DEV_FN_MAX_NODES, ...)
 *   ALREADY_EXISTS    the name is registered with another body (an
 *                     equivalent definition and options is a no-op,
 *                     *existed = true: compared after resolving, so node
 *                     order, attribute order, defaults given explicitly,
 *                     "a:0" for "a" and DEFAULT for the setting in force
 *                     do not count; dev_fn_describe's def re-registers)
 *   RESOURCE_EXHAUSTED DEV_FN_MAX_PER_LIB, host memory.
 * Thread-safe (the library has a lock). */
pd_code dev_fn_register(dev_fn_lib *lib, const dev_fn_def *def,
                        const dev_fn_options *opts, bool *existed,
                        dev_status *st);

/* True when `name` is a function of the library. Thread-safe. */
bool dev_fn_lib_has(const dev_fn_lib *lib, const char *name);

/* Prepares a call of function `name` as one op (dev_op_prepare's contract:
 * the op is not queued; dev_op_submit / dev_op_abandon take it; the
 * outputs' dtypes and shapes are known at return): instantiates the
 * function for the inputs' signature on a cache miss (inline, infer,
 * expand gradients, the passes, buffer plan), reusing a cached
 * instantiation otherwise; at most max_instantiations per function are kept
 * (least recently used evicted). A miss is explained in the function's
 * miss reasons (dev_fn_describe) and through the config's log, naming what
 * changed ("input 0 shape [32,64], cached [31,64]").
 * Errors: NOT_FOUND (no such function), INVALID_ARGUMENT (wrong number of
 * inputs, an input's dtype not the arg's, what inference of a node rejects,
 * naming the function and the node), FAILED_PRECONDITION (an input of
 * another engine), RESOURCE_EXHAUSTED. At run time a node's failure is the
 * call's outputs' error, naming the function and the original node(s).
 * Thread-safe. */
pd_code dev_fn_prepare_call(dev_fn_lib *lib, const char *name,
                            dev_tensor *const *inputs, int num_inputs,
                            dev_op **out, dev_status *st);
/* dev_fn_prepare_call with a placement (issue #17): a call runs on its
 * inputs' set (one set, as dev_op_prepare_on); a function without inputs on
 * `set` (NULL: the whole mesh). The instantiation's signature includes the
 * set's size; collectives inside run over the set. */
pd_code dev_fn_prepare_call_on(dev_fn_lib *lib, const dev_devset *set,
                               const char *name, dev_tensor *const *inputs,
                               int num_inputs, dev_op **out, dev_status *st);

/* What dev_fn_describe tells of one cached instantiation. */
typedef struct dev_fn_inst_info {
  /* "(float32[32,784], float32[-1,5] sharded as [3,5],[2,5],[2,5],[2,5])":
   * component shapes follow "as" where they differ */
  char signature[512];
  int nodes_in;  /* after inlining and gradient expansion */
  int nodes_out; /* after the passes */
  /* Nodes removed or rewritten by each pass; -1 when it was off, -2 when it
   * failed (rolled back). */
  int pass_changes[DEV_PASS_COUNT];
  int external_changed; /* external passes that changed the graph */
  uint64_t arena_bytes; /* per device, the largest: planned memory */
  /* What one buffer per value the arena would hold takes, each rounded up
   * to the arena's alignment (256 bytes), the largest device's: comparable
   * with arena_bytes, never below it. */
  uint64_t unplanned_bytes;
  uint64_t calls;
  bool cuda_graph; /* replayed as a CUDA graph */
  /* Non-empty: instantiating this signature failed with this message (a
   * negative cache entry, counted within max_instantiations); calls with
   * this signature fail at once with it, until it is evicted. */
  char error[512];
} dev_fn_inst_info;

#define DEV_FN_MISS_REASONS 8

typedef struct dev_fn_info {
  size_t struct_size;
  dev_fn_def *def;       /* the registered definition (dev_fn_def_free) */
  dev_fn_def *optimized; /* the most recently used instantiation's graph,
                            outputs_info filled; NULL when none */
  dev_fn_options options;
  dev_tristate passes_in_force[DEV_PASS_COUNT]; /* ON or OFF, merged */
  int max_instantiations;
  int num_instantiations;
  dev_fn_inst_info insts[DEV_FN_MAX_INST_CAP]; /* most recently used first */
  uint64_t hits, misses, evictions;
  int num_miss_reasons;
  char miss_reasons[DEV_FN_MISS_REASONS][256]; /* latest first */
} dev_fn_info;

/* Describes function `name`: out->struct_size must be set; on success the
 * caller frees out->def and out->optimized (dev_fn_def_free).
 * Errors: NOT_FOUND, RESOURCE_EXHAUSTED. Thread-safe. */
pd_code dev_fn_describe(dev_fn_lib *lib, const char *name, dev_fn_info *out,
                        dev_status *st);

/* Number of functions in the library and their names (borrowed until the
 * library is destroyed; functions are never removed before). */
int dev_fn_lib_count(const dev_fn_lib *lib);
const char *dev_fn_lib_name_at(const dev_fn_lib *lib, int i);

/* True for an op prepared by dev_fn_prepare_call. */
bool dev_op_is_function_call(const dev_op *op);

#endif /* PARADEV_DEV_FUNCTION_H */
