/* paradev optimizer plugins: the ABI between paradevd and a shared object
 * that adds a graph pass to the daemon's function optimizer (issue #11).
 *
 * A plugin is a shared object listed in the daemon's config
 *
 *   [functions]
 *   optimizer_plugins = /path/libfoo.so, /path/libbar.so
 *
 * The daemon dlopens each (RTLD_NOW | RTLD_LOCAL) at start, finds
 * PD_InitOptimizer with dlsym and calls it once. The plugin fills in its
 * optimizer (PD_Optimizer) and its wishes for the built-in passes
 * (PD_OptimizerConfigs). On every instantiation of a graph function, after
 * the built-in passes, the daemon hands the graph to each plugin's
 * optimize_func, in the order of the list, as a serialized
 * paradev.v1.FunctionDef (proto/paradev/v1/paradev.proto: the wire's own
 * message, with FunctionNode.outputs_info filled) and reads the rewritten
 * FunctionDef back.
 *
 * The shape follows TensorFlow's Grappler plugin API
 * (tensorflow/c/experimental/grappler/grappler.h: TP_Optimizer,
 * TP_OptimizerConfigs, TP_OptimizerRegistrationParams, TF_InitGraph), with
 * these differences:
 *  - Validation is strict. A plugin-filled struct whose struct_size is
 *    smaller than the daemon's *_STRUCT_SIZE, or a plugin built for another
 *    PD_OPTIMIZER_MAJOR, is refused with a message naming both values, and
 *    the daemon does not start (it was told to load that plugin).
 *  - One rule for memory: every buffer the plugin writes is allocated with
 *    the allocate function the daemon puts in the output PD_Buffer, and the
 *    daemon frees it. The plugin never frees what the daemon gave it, and
 *    the daemon never frees what the plugin owns (its name, its state).
 *  - Strings crossing the ABI carry a length and are NUL-terminated as
 *    well; inputs are const.
 *
 * Self-contained: needs no other paradev header (it does not include
 * paradev/types.h; status codes are gRPC's, as PD_Code spells them). C99 or
 * later, and C++.
 *
 * Thread safety: PD_InitOptimizer and create_func run once, on the daemon's
 * main thread, before it serves. optimize_func may be called from several
 * threads at once (for different functions, or the same function for two
 * signatures): it must be reentrant with respect to its optimizer state.
 * destroy_func runs once at shutdown, after every optimize_func call has
 * returned.
 *
 * See examples/optimizer_plugin/ for a complete plugin and how to build it.
 */
#ifndef PARADEV_OPTIMIZER_H
#define PARADEV_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* --- Versions ------------------------------------------------------------- */

/* The ABI this header describes. MAJOR changes with any change a plugin
 * built against an older header could trip on, a field appended to a
 * plugin-filled struct included: the daemon refuses a struct_size smaller
 * than its own *_STRUCT_SIZE, so those sizes are fixed within one major
 * version (optional additions go through `ext`). MINOR changes with
 * additions an older plugin need not know (a new optional behaviour). The
 * daemon refuses a plugin of another major version and loads one of any
 * minor (logging it when the plugin's is newer than its own). */
#define PD_OPTIMIZER_MAJOR 1
#define PD_OPTIMIZER_MINOR 0

/* The size of a struct up to and including `member`: what *_STRUCT_SIZE
 * means (fields appended later do not change it). */
#define PD_OPTIMIZER_OFFSET_OF_END(type, member)                               \
  (offsetof(type, member) + sizeof(((type *)0)->member))

/* --- Status --------------------------------------------------------------- */

/* gRPC's status codes (the values of paradev's pd_code). */
typedef enum PD_Code {
  PD_CODE_OK = 0,
  PD_CODE_CANCELLED = 1,
  PD_CODE_UNKNOWN = 2,
  PD_CODE_INVALID_ARGUMENT = 3,
  PD_CODE_DEADLINE_EXCEEDED = 4,
  PD_CODE_NOT_FOUND = 5,
  PD_CODE_ALREADY_EXISTS = 6,
  PD_CODE_PERMISSION_DENIED = 7,
  PD_CODE_RESOURCE_EXHAUSTED = 8,
  PD_CODE_FAILED_PRECONDITION = 9,
  PD_CODE_ABORTED = 10,
  PD_CODE_OUT_OF_RANGE = 11,
  PD_CODE_UNIMPLEMENTED = 12,
  PD_CODE_INTERNAL = 13,
  PD_CODE_UNAVAILABLE = 14,
  PD_CODE_DATA_LOSS = 15,
  PD_CODE_UNAUTHENTICATED = 16,
} PD_Code;

/* The outcome of a call into the plugin. Daemon-filled: the daemon sets
 * struct_size and `set` and starts every call with code PD_CODE_OK. The
 * plugin reports an error by calling status->set(status, code, msg, len):
 * `msg` is `len` bytes (need not be NUL-terminated; the daemon copies at
 * most PD_STATUS_MESSAGE_MAX - 1 bytes of it and keeps its own copy, so
 * `msg` may be on the plugin's stack). Calling it with PD_CODE_OK clears
 * the status. Leaving the status OK means success. Thread safety: a status
 * belongs to one call. */
#define PD_STATUS_MESSAGE_MAX 512
typedef struct PD_Status {
  size_t struct_size; /* PD_STATUS_STRUCT_SIZE or more (daemon's) */
  void *ext;          /* reserved: NULL */
  void (*set)(struct PD_Status *status, PD_Code code, const char *msg,
              size_t len);
  PD_Code code;                        /* what `set` stored; read-only */
  char message[PD_STATUS_MESSAGE_MAX]; /* NUL-terminated; read-only */
} PD_Status;
#define PD_STATUS_STRUCT_SIZE PD_OPTIMIZER_OFFSET_OF_END(PD_Status, message)

/* --- Buffers -------------------------------------------------------------- */

/* A block of bytes: a serialized paradev.v1.FunctionDef. Daemon-filled.
 *
 * As input (graph_in): `data` / `length` are the daemon's, valid for the
 * duration of the call, read-only; `allocate` is NULL.
 *
 * As output (graph_out): starts with data NULL, length 0 and `allocate`
 * set. To return a graph the plugin calls graph_out->allocate(graph_out, n),
 * which returns n writable bytes (suitably aligned for any type) and sets
 * graph_out->data and ->length to them, or returns NULL when out of memory
 * (then report RESOURCE_EXHAUSTED). It writes the serialized FunctionDef
 * there. Calling allocate again replaces (and frees) the previous block.
 * The daemon owns and frees the block after the call, whatever the status.
 * Leaving graph_out empty (never calling allocate) with an OK status means
 * "this graph is left as it was". */
typedef struct PD_Buffer {
  size_t struct_size; /* PD_BUFFER_STRUCT_SIZE or more (daemon's) */
  void *ext;          /* reserved: NULL */
  const void *data;
  size_t length; /* bytes */
  void *(*allocate)(struct PD_Buffer *self, size_t length);
  void *allocate_state; /* the daemon's; do not touch */
} PD_Buffer;
#define PD_BUFFER_STRUCT_SIZE                                                  \
  PD_OPTIMIZER_OFFSET_OF_END(PD_Buffer, allocate_state)

/* --- Plugin-filled structs ------------------------------------------------- */

/* TF_TriState: what the plugin asks of one built-in pass. The daemon merges
 * every plugin's wishes with its own config: OFF where any of them says
 * OFF, else ON where any says ON, else DEFAULT (the daemon's default, on).
 * A function's registration options still apply on top. */
typedef enum PD_TriState {
  PD_TRI_DEFAULT = 0,
  PD_TRI_OFF = 1,
  PD_TRI_ON = 2,
} PD_TriState;

/* The plugin's wishes for the built-in passes (device/dev_function.h's
 * dev_fn_pass, in the order they run). The daemon zeroes the struct
 * (every field DEFAULT) before PD_InitOptimizer; the plugin must set
 * struct_size to PD_OPTIMIZER_CONFIGS_STRUCT_SIZE. */
typedef struct PD_OptimizerConfigs {
  size_t struct_size;
  void *ext;                    /* reserved: leave NULL */
  PD_TriState pruning;          /* dead nodes */
  PD_TriState cse;              /* common subexpression elimination */
  PD_TriState constant_folding; /* bounded in bytes and time */
  PD_TriState arithmetic;       /* x*1, x+0, identities, transposes */
  PD_TriState fusion;           /* _FusedMatMul, _FusedElementwise */
  PD_TriState buffer_planning;  /* intermediates share memory */
  PD_TriState cuda_graph;       /* CUDA: capture once, replay */
} PD_OptimizerConfigs;
#define PD_OPTIMIZER_CONFIGS_STRUCT_SIZE                                       \
  PD_OPTIMIZER_OFFSET_OF_END(PD_OptimizerConfigs, cuda_graph)

/* The optimizer. The daemon zeroes it before PD_InitOptimizer; the plugin
 * sets struct_size to PD_OPTIMIZER_STRUCT_SIZE and the functions.
 *
 * create_func (optional): called once after PD_InitOptimizer succeeded;
 *   its result is the `optimizer` argument of optimize_func and
 *   destroy_func (NULL when create_func is NULL). Returning NULL is
 *   allowed (a plugin without state).
 * optimize_func (mandatory): rewrites one instantiated graph.
 *   graph_in:  the serialized FunctionDef (see PD_Buffer): its arguments
 *              carry the signature's dtypes, every node its outputs_info
 *              (dtype, shape; -1 on axes where components differ) and its
 *              origins (the registered nodes it stands for; a node a
 *              plugin creates should carry the origins of the nodes it
 *              replaces, so run-time errors name the user's nodes).
 *   graph_out: where to write the rewritten FunctionDef (see PD_Buffer), or
 *              nothing for "unchanged". Its arguments and outputs must keep
 *              the input's names and dtypes. The daemon validates it as a
 *              registration (known ops, no dangling or cyclic inputs,
 *              arity) and infers it; a graph that fails, an unparsable
 *              one, or an error status makes the daemon ignore this plugin
 *              for this function's instantiation (and log why): the graph
 *              stays as the built-in passes left it, and the daemon keeps
 *              serving.
 *   status:    set on error (see PD_Status).
 *   May run on several threads at once (see the top of this file).
 * destroy_func (optional): called once at shutdown with create_func's
 *   result, before the daemon dlcloses the plugin. */
typedef struct PD_Optimizer {
  size_t struct_size;
  void *ext; /* reserved: leave NULL */
  void *(*create_func)(void);
  void (*optimize_func)(void *optimizer, const PD_Buffer *graph_in,
                        PD_Buffer *graph_out, PD_Status *status);
  void (*destroy_func)(void *optimizer);
} PD_Optimizer;
#define PD_OPTIMIZER_STRUCT_SIZE                                               \
  PD_OPTIMIZER_OFFSET_OF_END(PD_Optimizer, destroy_func)

/* What PD_InitOptimizer receives.
 *
 * Daemon-filled: struct_size (the daemon's PD_OPTIMIZER_REGISTRATION_PARAMS
 *   _STRUCT_SIZE), major_version / minor_version (the daemon's
 *   PD_OPTIMIZER_MAJOR / MINOR: a plugin should refuse a major it was not
 *   built for, setting an error status), optimizer and configs (zeroed,
 *   owned by the daemon: fill them in, do not keep the pointers).
 * Plugin-filled: plugin_major_version / plugin_minor_version (the
 *   PD_OPTIMIZER_MAJOR / MINOR the plugin was built with: the daemon
 *   refuses another major), name / name_length (the pass's name in logs
 *   and DescribeFunction, 1 to PD_OPTIMIZER_NAME_MAX bytes of printable
 *   ASCII, NUL-terminated at name[name_length]; static storage or the
 *   plugin's own, valid until the plugin is unloaded: the daemon copies
 *   it). */
#define PD_OPTIMIZER_NAME_MAX 64
typedef struct PD_OptimizerRegistrationParams {
  size_t struct_size;
  void *ext; /* reserved: NULL */
  int32_t major_version;
  int32_t minor_version;
  int32_t plugin_major_version;
  int32_t plugin_minor_version;
  const char *name;
  size_t name_length;
  PD_OptimizerConfigs *configs;
  PD_Optimizer *optimizer;
} PD_OptimizerRegistrationParams;
#define PD_OPTIMIZER_REGISTRATION_PARAMS_STRUCT_SIZE                           \
  PD_OPTIMIZER_OFFSET_OF_END(PD_OptimizerRegistrationParams, optimizer)

/* --- The entry point -------------------------------------------------------- */

/* Every plugin defines this symbol (exported, C linkage). The daemon calls
 * it once, on its main thread, with `status` OK. On success the plugin has
 * filled params->configs, params->optimizer and the plugin_* and name
 * fields, and left `status` OK; an error status refuses the plugin (the
 * daemon reports the message, naming the file, and does not start). */
void PD_InitOptimizer(PD_OptimizerRegistrationParams *params,
                      PD_Status *status);
typedef void (*PD_InitOptimizerFn)(PD_OptimizerRegistrationParams *params,
                                   PD_Status *status);

/* Convenience for plugins: status->set with a NUL-terminated message. */
static inline void PD_SetStatus(PD_Status *status, PD_Code code,
                                const char *msg) {
  size_t n = 0;
  if (msg)
    while (msg[n]) n++;
  status->set(status, code, msg ? msg : "", n);
}

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_OPTIMIZER_H */
