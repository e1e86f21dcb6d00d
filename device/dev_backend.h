/* The engine for kernel and backend authors: op definitions and their
 * registration, the contexts of shape inference and of kernels, the helpers
 * infer functions share, collectives, and the backend function table (with
 * the CPU backend). Programs that only drive the engine include device.h;
 * CUDA-only options are in dev_cuda.h. Included by device/ops/, device/cpu/,
 * device/cuda/ and by tests and benches that call kernels directly.
 *
 * The conventions of device.h hold here (status last, out-parameters only on
 * success, no logging). Source: TensorFlow's op registry (REGISTER_OP,
 * OpDef) and kernel registration, and its pluggable-device structs
 * (tensorflow/c/experimental/stream_executor/stream_executor.h) for the
 * backend table.
 */
#ifndef PARADEV_DEV_BACKEND_H
#define PARADEV_DEV_BACKEND_H

#ifndef __cplusplus
#include <stdatomic.h>
#define DEV__ATOMIC_U64 _Atomic uint64_t
#else /* CUDA translation units (C++): the field's layout, no heartbeat */
#define DEV__ATOMIC_U64 uint64_t
#endif

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Op definitions                                                            */

#define DEV_MAX_ARGS 8 /* input or output args declared by one op */

typedef struct dev_kernel_ctx dev_kernel_ctx;
typedef struct dev_infer_ctx dev_infer_ctx;

/* One declared input or output argument. A list argument (is_list) takes
 * min_len or more tensors, as TFE_OpGetInputLength describes; an op declares
 * at most one list input and at most one list output. A list output's
 * length is what the infer function writes to ctx->num_outputs (less the
 * op's other outputs; dev_op_output_length), at most DEV_MAX_OUTPUTS. The rest is the op reference's (ListOps,
 * docs/ops.md): `dtypes` the dtypes the infer function accepts (an output:
 * can produce), `dtype_rule` NULL or a few words on how they must agree
 * ("same as x"), `doc` NULL or a few words on the argument. */
typedef struct dev_arg_def {
  const char *name;
  bool is_list;
  int min_len;
  unsigned dtypes; /* DEV_DTYPE_BIT of each dtype */
  const char *dtype_rule;
  const char *doc;
  /* A list output: the attribute giving its length (an int attribute's
   * value, or an int-list attribute's length: "num_split", "size_splits"),
   * so clients know how many outputs to name before they run the op (TF's
   * ArgDef.number_attr). NULL otherwise. */
  const char *length_attr;
} dev_arg_def;

/* One declared attribute: its type and its default (type DEV_ATTR_NONE when
 * the attribute is required). The rest is the op reference's: `doc` NULL or
 * a few words (bounds that depend on the inputs go here: "-rank..rank-1");
 * `allowed` NULL or the NULL-terminated values a STRING attribute may take;
 * inclusive bounds of the value (INT, FLOAT) or of every element (lists)
 * when has_min / has_max. The infer function enforces all of them. */
typedef struct dev_attr_def {
  const char *name;
  dev_attr_type type;
  dev_attr_value default_value;
  const char *doc;
  const char *const *allowed;
  bool has_min, has_max;
  double min, max;
} dev_attr_def;

/* Shape/dtype inference for one component: reads ctx->in_dtype/in_shape of
 * device ctx->device and the resolved attrs; writes ctx->out_dtype/out_shape.
 * Must validate everything the kernel relies on (dtypes, ranks, dims,
 * attribute ranges) and return INVALID_ARGUMENT naming the op, the input or
 * attribute, what it got and what was expected. Runs on the caller's thread,
 * never touches data. */
typedef pd_code (*dev_infer_fn)(dev_infer_ctx *ctx, dev_status *st);

/* A kernel for one backend: computes the outputs of one component.
 * Outputs are already allocated (ctx->out_data) unless the op sets
 * DEV_OP_ALIASES_INPUT, in which case the kernel may alias. */
typedef pd_code (*dev_kernel_fn)(dev_kernel_ctx *ctx, dev_status *st);

typedef enum dev_op_flags {
  DEV_OP_COLLECTIVE = 1 << 0,    /* runs through backend->collective */
  DEV_OP_MESH_INFER = 1 << 1,    /* infer sees every component at once */
  DEV_OP_ALIASES_INPUT = 1 << 3, /* output 0 may share input 0's buffer */
  /* The call of a graph function (device/fn/): the executor runs its body
   * (device/fn/run.c) instead of a kernel. Never in the registry. */
  DEV_OP_FUNCTION = 1 << 4,
  /* A placement op (ParallelPack, ParallelUnpack, CopyToDevices; issue
   * #17): its outputs live on other sets than its inputs, so it has its
   * own prepare and run (device/place.c), never a kernel; `placement`
   * says which (dev_placement_kind). */
  DEV_OP_PLACEMENT = 1 << 5,
} dev_op_flags;

typedef enum dev_placement_kind {
  DEV_PLACE_NONE = 0,
  DEV_PLACE_PACK = 1,
  DEV_PLACE_UNPACK = 2,
  DEV_PLACE_COPY = 3,
} dev_placement_kind;

/* Backend kinds that kernels are registered for. */
typedef enum dev_backend_kind {
  DEV_BACKEND_CPU = 0,
  DEV_BACKEND_CUDA = 1,
  DEV_BACKEND_KINDS = 2,
} dev_backend_kind;

struct dev_op_def {
  const char *name;
  int num_inputs;
  dev_arg_def inputs[DEV_MAX_ARGS];
  int num_outputs;
  dev_arg_def outputs[DEV_MAX_ARGS]; /* at most one list (is_list) */
  int num_attrs;
  dev_attr_def attrs[DEV_MAX_ATTRS];
  unsigned flags;
  dev_infer_fn infer;
  dev_kernel_fn kernels[DEV_BACKEND_KINDS];
  /* Collective kind for DEV_OP_COLLECTIVE ops (dev_collective_kind). */
  int collective;
  /* The op reference (ListOps, `paradev ops`, docs/ops.md): one line saying
   * what the op computes (required: registration refuses an op without
   * one), and NULL or more text, which says where the op differs from
   * tf.raw_ops.<name>. */
  const char *summary;
  const char *notes;
  /* DEV_OP_PLACEMENT ops: which one (dev_placement_kind). */
  int placement;
};

/* Registers an op (the registry keeps the pointer; `def` must outlive the
 * process, normally a static). ALREADY_EXISTS for a duplicate name. Called
 * from dev_registry_init only; not thread-safe against lookups. */
pd_code dev_op_register(dev_op_def *def, dev_status *st);

/* Sets the kernel of `op_name` for `kind`. NOT_FOUND for an unknown op. */
pd_code dev_kernel_register(dev_backend_kind kind, const char *op_name,
                            dev_kernel_fn fn, dev_status *st);

/* Index of attr `name` in def->attrs, or -1. */
int dev_op_attr_index(const dev_op_def *def, const char *name);

/* Resolved inputs of an infer call, per component. */
struct dev_infer_ctx {
  const dev_op_def *op;
  int device;      /* which component is being inferred: its position in
                      the op's device set (issue #17), not an engine device */
  int num_devices; /* the op's set size */
  /* The op's device set (engine devices, for messages), or NULL where it
   * is not known (a node of a graph function). */
  const struct dev_devset *devset;
  int num_inputs;
  const pd_dtype *in_dtype;             /* [num_inputs] */
  const dev_shape *in_shape;            /* [num_inputs] this component's */
  const dev_shape *const *all_in_shape; /* [num_inputs][num_devices], for
                                          DEV_OP_MESH_INFER ops */
  const dev_attr_value *attrs;          /* [op->num_attrs], defaults filled */
  int num_outputs;
  pd_dtype out_dtype[DEV_MAX_OUTPUTS];
  dev_shape out_shape[DEV_MAX_OUTPUTS];
};

/* Per-component arguments of a kernel call. */
struct dev_kernel_ctx {
  const dev_op_def *op;
  const dev_attr_value *attrs; /* [op->num_attrs] */
  int device;
  int num_devices;
  struct dev_backend *backend;
  uint64_t op_seq; /* engine-wide sequence number of this op */
  int num_inputs;
  const pd_dtype *in_dtype;
  const dev_shape *in_shape;
  const void *const *in_data;
  int num_outputs;
  const pd_dtype *out_dtype;
  const dev_shape *out_shape;
  void **out_data;
  /* Set by an aliasing kernel (DEV_OP_ALIASES_INPUT) to make output i share
   * input j's buffer: out_alias[i] = j. -1 otherwise. */
  int *out_alias;
  /* The collective rendezvous of DEV_OP_COLLECTIVE ops (backend-private). */
  void *collective;
  /* The device's heartbeat counter (the executor's; NULL where none): see
   * dev_kernel_heartbeat. */
  DEV__ATOMIC_U64 *heartbeat;
  /* Placement (issue #17): the op's device set and this component's index
   * in it. `device` stays the engine device (memory, streams, names);
   * what is per position (DeviceId, a shard's place, random streams, a
   * collective's rank) reads `index`. num_devices == devset->n. */
  int index;
  const struct dev_devset *devset;
};

/* Says that a long kernel is still making progress (a block of a batched
 * product done, a chunk of a long loop): the daemon's liveness watch
 * (dev_engine_watch) then does not count the op's time against the kernel
 * bound. Call it between blocks of work, not per element: one relaxed
 * atomic add. Any kernel thread; a ctx without a counter is ignored. */
#ifndef __cplusplus
static inline void dev_kernel_heartbeat(const dev_kernel_ctx *ctx) {
  if (ctx->heartbeat)
    atomic_fetch_add_explicit(ctx->heartbeat, 1, memory_order_relaxed);
}
#endif

/* Helpers for infer functions: each returns INVALID_ARGUMENT with a message
 * naming the op and the input when the check fails. */
pd_code dev_check_dtype_in(const dev_infer_ctx *c, int input, unsigned mask,
                           const char *expected, dev_status *st);
pd_code dev_check_same_dtype(const dev_infer_ctx *c, int a, int b,
                             dev_status *st);
pd_code dev_check_rank(const dev_infer_ctx *c, int input, int min_rank,
                       int max_rank, dev_status *st);
/* Normalizes a possibly negative axis against `rank` (valid: -rank..rank-1),
 * INVALID_ARGUMENT naming the attribute otherwise. */
pd_code dev_normalize_axis(const dev_infer_ctx *c, const char *attr,
                           int64_t axis, int rank, int *out, dev_status *st);
/* INVALID_ARGUMENT when an output of shape `s` and dtype `dt` overflows the
 * element count or byte size ("OP: output shape [..] of dtype D is too
 * large (why)"). */
pd_code dev_check_out_size(const dev_infer_ctx *c, pd_dtype dt,
                           const dev_shape *s, dev_status *st);

#define DEV_DTYPE_BIT(dt) (1u << (unsigned)(dt))
#define DEV_MASK_FLOAT                                                         \
  (DEV_DTYPE_BIT(PD_FLOAT32) | DEV_DTYPE_BIT(PD_FLOAT64) |                     \
   DEV_DTYPE_BIT(PD_FLOAT16) | DEV_DTYPE_BIT(PD_BFLOAT16))
#define DEV_MASK_INT                                                           \
  (DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64) | DEV_DTYPE_BIT(PD_UINT8))
#define DEV_MASK_NUMBER (DEV_MASK_FLOAT | DEV_MASK_INT)
#define DEV_MASK_ALL (DEV_MASK_NUMBER | DEV_DTYPE_BIT(PD_BOOL))
/* ------------------------------------------------------------------------ */
/* Backends                                                                  */

/* Collective kinds and reductions (NCCL's names). */
typedef enum dev_collective_kind {
  DEV_COLL_NONE = 0,
  DEV_COLL_ALL_REDUCE = 1,
  DEV_COLL_BROADCAST = 2,
  DEV_COLL_ALL_GATHER = 3,
  DEV_COLL_REDUCE_SCATTER = 4,
} dev_collective_kind;

typedef enum dev_reduction {
  DEV_RED_SUM = 0,
  DEV_RED_PROD = 1,
  DEV_RED_MAX = 2,
  DEV_RED_MIN = 3,
  DEV_RED_MEAN = 4,
} dev_reduction;

/* Parses "sum|prod|max|min|mean"; -1 when unknown. */
int dev_reduction_from_name(const char *s, size_t len);

/* A backend: a table of functions over N devices. It starts with
 * struct_size so it can grow without breaking older code, as TensorFlow's
 * pluggable-device structs (SP_StreamExecutor) do. All functions may be called
 * concurrently for different devices; for one device they are called from that
 * device's executor thread, except allocate/deallocate/copy_* used by uploads
 * and downloads (and deallocate when an op's or a client's last reference
 * goes, on any thread), and fence_wait and fence_release (the device's
 * completion thread), which the backend must make thread-safe. */
typedef struct dev_backend {
  size_t struct_size;
  const char *name; /* "cpu", "cuda" */
  dev_backend_kind kind;
  int num_devices;
  void *impl;

  /* Allocates `bytes` on `device`; RESOURCE_EXHAUSTED (naming the device,
   * the request and the limit) when over the device's limit. bytes == 0 gives
   * a unique non-NULL pointer. */
  pd_code (*allocate)(struct dev_backend *b, int device, size_t bytes,
                      void **out, dev_status *st);
  void (*deallocate)(struct dev_backend *b, int device, void *ptr,
                     size_t bytes);
  pd_code (*copy_h2d)(struct dev_backend *b, int device, void *dst,
                      const void *src, size_t bytes, dev_status *st);
  pd_code (*copy_d2h)(struct dev_backend *b, int device, void *dst,
                      const void *src, size_t bytes, dev_status *st);
  pd_code (*copy_d2d)(struct dev_backend *b, int dst_device, void *dst,
                      int src_device, const void *src, size_t bytes,
                      dev_status *st);
  /* Runs a kernel for one component, on that device's executor. */
  pd_code (*run_kernel)(struct dev_backend *b, dev_kernel_fn fn,
                        dev_kernel_ctx *ctx, dev_status *st);
  /* Creates the shared state of one collective across all devices; called
   * once per collective op at submission. */
  /* `set` is the devices taking part (issue #17: a collective runs over
   * its operands' device set; set->n of them, ctx->index their order). */
  void *(*collective_create)(struct dev_backend *b, dev_collective_kind kind,
                             const struct dev_devset *set);
  /* Runs device ctx->device's part of a collective. Every device calls it
   * (with ctx->collective from collective_create), in the same global order;
   * a device whose inputs failed still calls it with `failed` set so peers
   * learn of it instead of waiting. Returns the collective's status, the same
   * on every device. */
  pd_code (*collective_run)(struct dev_backend *b, dev_kernel_ctx *ctx,
                            const dev_status *failed, dev_status *st);
  void (*collective_release)(struct dev_backend *b, void *coll);
  /* Waits for all work issued on `device` (a no-op on the CPU backend). */
  pd_code (*synchronize)(struct dev_backend *b, int device, dev_status *st);
  pd_code (*memory_stats)(struct dev_backend *b, int device,
                          dev_memory_stats *out, dev_status *st);
  /* A short description of the device ("cpu:0 (simulated)"). */
  const char *(*device_name)(struct dev_backend *b, int device);
  void (*destroy)(struct dev_backend *b);
  /* False once `device` has hit an unrecoverable error (a sticky CUDA error:
   * the device's context is lost and every later op on it fails with
   * UNAVAILABLE). NULL means always healthy (the CPU backend). Check
   * struct_size before reading it from a backend built against an older
   * header. Thread-safe. */
  bool (*healthy)(struct dev_backend *b, int device);
  /* Page-locks [ptr, ptr + bytes) of host memory (e.g. a client's shared
   * memory region mapped by the daemon) so copy_h2d/copy_d2h to and from it
   * run as direct DMA at copy-engine speed instead of through staging
   * buffers, as cudaHostRegister does. NULL when the backend has nothing to
   * do (the CPU backend). host_unregister undoes it; it is called only with
   * a ptr that host_register accepted. Check struct_size before reading them.
   * Thread-safe. */
  pd_code (*host_register)(struct dev_backend *b, void *ptr, size_t bytes,
                           dev_status *st);
  void (*host_unregister)(struct dev_backend *b, void *ptr);
  /* Completion fences, for a backend whose run_kernel and collective_run
   * return once the work is queued on the device rather than done (CUDA).
   * All three or none; NULL on the CPU backend, whose ops are done when
   * run_kernel returns. Check struct_size before reading them.
   *
   * fence_record: called on `device`'s executor right after it issued an
   *   op's work; returns in *fence a marker behind all work issued so far on
   *   the device (cudaEventRecord on its stream). Errors name the device.
   * fence_wait: blocks, without spinning, until that work has finished on
   *   the device; returns the first error it hit (naming the device and the
   *   backend's reason), e.g. an illegal address inside a kernel. Called on
   *   the device's completion thread, in the order the fences were recorded.
   * fence_release: gives the fence back once fence_wait has returned (on
   *   the completion thread).
   * The engine marks an op's outputs on the device ready only once its fence
   * has been waited for, as TensorFlow's GPU EventMgr does. Source:
   * tensorflow/core/common_runtime/device/device_event_mgr.h. */
  pd_code (*fence_record)(struct dev_backend *b, int device, void **fence,
                          dev_status *st);
  pd_code (*fence_wait)(struct dev_backend *b, int device, void *fence,
                        dev_status *st);
  void (*fence_release)(struct dev_backend *b, int device, void *fence);

  /* Optional (NULL: nothing to do; check struct_size first). Called on
   * `device`'s executor once the device has been idle a while
   * (DEV_IDLE_TRIM_MS): gives cached memory back to the system (the CPU
   * backend's block cache, then malloc_trim). */
  void (*trim)(struct dev_backend *b, int device);

  /* Optional CUDA graphs for graph functions (issue #11; NULL: none; check
   * struct_size first). Called on `device`'s executor only.
   * capture_begin: the device's following work is captured, not run
   *   (cudaStreamBeginCapture on its stream, relaxed mode).
   * capture_end: ends the capture and instantiates it into *graph
   *   (cudaStreamEndCapture + cudaGraphInstantiate); an error (a kernel
   *   that cannot be captured) leaves the stream as it was, nothing run.
   * graph_launch: replays *graph on the device's stream (the work runs
   *   as if issued again: a fence recorded afterwards covers it).
   * graph_destroy: frees it (any thread, once no launch is in flight).
   * Source: CUDA Programming Guide, "CUDA Graphs" (stream capture). */
  pd_code (*capture_begin)(struct dev_backend *b, int device, dev_status *st);
  pd_code (*capture_end)(struct dev_backend *b, int device, void **graph,
                         dev_status *st);
  pd_code (*graph_launch)(struct dev_backend *b, int device, void *graph,
                          dev_status *st);
  void (*graph_destroy)(struct dev_backend *b, int device, void *graph);

  /* Optional (issue #17; NULL: the device's own index stands for its GPU,
   * as the CPU backend's simulated devices do). The physical GPU `device`
   * runs on as the node's scheduler numbers it (the CUDA ordinal), -1 for
   * none; logical devices on one GPU share it. Any thread. */
  int (*device_gpu)(struct dev_backend *b, int device);
} dev_backend;

/* Milliseconds an executor waits idle before calling its backend's trim. */
#define DEV_IDLE_TRIM_MS 1000

#define DEV_BACKEND_STRUCT_SIZE sizeof(dev_backend)

/* Configuration of the CPU backend; starts with struct_size. */
typedef struct dev_cpu_config {
  size_t struct_size;
  int num_devices; /* 1..PD_MAX_DEVICES */
  /* Per device, bytes; 0: the default, (physical memory - memory_reserve)
   * split evenly among the devices. */
  uint64_t memory_limit;
  /* Host memory kept back for the daemon itself (not lent to any device)
   * when memory_limit is 0. DEV_MEMORY_RESERVE_DEFAULT: 1 GiB, or a quarter
   * of physical memory when that is less. */
  uint64_t memory_reserve;
  /* OpenBLAS threads (one pool for the process, shared by every device's
   * executor): 0: the online cores divided by the devices, at least 1. */
  int blas_threads;
} dev_cpu_config;

#define DEV_CPU_CONFIG_INITIALIZER                                             \
  { sizeof(dev_cpu_config), 4, 0, DEV_MEMORY_RESERVE_DEFAULT, 0 }

/* Creates the CPU backend of `cfg->num_devices` simulated devices, each
 * with a memory limit (cfg->memory_limit, or the default above): an
 * allocation over it fails with RESOURCE_EXHAUSTED naming the device, the
 * bytes asked and the bytes in use, after first dropping the device's cache
 * of freed blocks. Sets OpenBLAS's thread count (cfg->blas_threads; through
 * openblas_set_num_threads when the linked BLAS has it). INVALID_ARGUMENT for
 * a device count outside 1..64 or negative blas_threads. */
pd_code dev_cpu_backend_create(const dev_cpu_config *cfg, dev_backend **out,
                               dev_status *st);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_DEV_BACKEND_H */
