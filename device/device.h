/* The paradev engine for those who drive it: parallel tensors, engines, ops
 * by name, statuses and the gradient tape. The scheduler, the server, the
 * examples, the benches and the tests include this header; it never includes
 * a gRPC or protobuf header.
 *
 * Three headers, one per audience (SQLite's btree.h / btreeInt.h shape):
 *   device.h       programs that drive the engine (this one)
 *   dev_backend.h  kernel and backend authors: op definitions, kernel
 *                  registration, inference and kernel contexts, the backend
 *                  function table, the CPU backend
 *   dev_cuda.h     CUDA-only options: dev_cuda_config, the CUDA backend
 * and device_int.h, private to device/, whose non-static names that nothing
 * outside device/ may call carry a double underscore (dev__, libuv's uv__).
 *
 * Conventions
 *  - Functions that can fail return a pd_code and take a `dev_status *` last;
 *    the status (may be NULL) receives the code and a message that names what
 *    was wrong and what was expected. Out-parameters are written only on
 *    success. Library code never logs.
 *  - A parallel tensor (dev_tensor) has one component per device of its
 *    device set (dev_devset.h; the whole mesh by default). Tensors are
 *    reference-counted: dev_tensor_retain / dev_tensor_release. Every tensor
 *    handed out by a function is owned by the caller (one reference).
 *  - Execution is asynchronous and stream-ordered: each device runs its ops in
 *    submission order on its own executor; dev_execute returns once the op is
 *    validated, its output dtypes and shapes inferred, and it is queued on
 *    every device of its set. A failure while running is stored on the op's outputs and
 *    propagates to every op that consumes them. An op counts as done (its
 *    outputs ready, waits and notifications answered) when the device has
 *    finished it: on CUDA, when an event recorded behind its kernels has
 *    completed, not when the kernels were queued (dev_backend.fence_*).
 *  - Every device receives its ops in one global order (submission holds one
 *    engine-wide lock across the devices; an op goes only to the devices of
 *    its set), so a collective never waits on a peer that is busy with
 *    another collective, on overlapping sets too.
 *
 * Source of the semantics: TensorFlow's parallel device
 * (tensorflow/c/eager/parallel_device) for components, mirrored and sharded
 * values and DeviceId; TensorFlow raw ops for op names, attributes and shape
 * rules; NumPy for broadcasting; NCCL for the collectives.
 */
#ifndef PARADEV_DEVICE_H
#define PARADEV_DEVICE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paradev/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Status                                                                    */

#define DEV_STATUS_MSG_MAX 512

typedef struct dev_status {
  pd_code code;
  char msg[DEV_STATUS_MSG_MAX];
} dev_status;

#define DEV_STATUS_INIT                                                        \
  {                                                                            \
    PD_OK, { 0 }                                                               \
  }

/* Sets `st` (if not NULL) to `code` and a printf-formatted message; returns
 * `code`, so error paths read `return dev_error(st, PD_INVALID_ARGUMENT, ...)`.
 * Thread-safe (writes only *st). */
pd_code dev_error(dev_status *st, pd_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Resets `st` to PD_OK with an empty message. Accepts NULL. */
void dev_status_clear(dev_status *st);

/* ------------------------------------------------------------------------ */
/* dtypes (see paradev/types.h for the enum)                                  */

/* True for float32, float64, float16 and bfloat16. */
bool dev_dtype_is_floating(pd_dtype dt);
/* True for int32, int64 and uint8. */
bool dev_dtype_is_integer(pd_dtype dt);
/* True for a value of the enum other than PD_DTYPE_INVALID. */
bool dev_dtype_is_valid(pd_dtype dt);

/* IEEE binary16 and bfloat16 conversions; float -> 16 bits rounds to nearest
 * even and keeps NaN a NaN. Thread-safe, no state. */
uint16_t dev_float_to_half(float f);
float dev_half_to_float(uint16_t h);
uint16_t dev_float_to_bfloat16(float f);
float dev_bfloat16_to_float(uint16_t b);

/* Reads element `i` of a buffer of `dt` as double / writes double into it
 * (rounding and saturation as a C cast; bool is 0 or 1). Slow generic path
 * for kernels and tests, not for hot loops. */
double dev_load_f64(pd_dtype dt, const void *data, int64_t i);
void dev_store_f64(pd_dtype dt, void *data, int64_t i, double v);

/* ------------------------------------------------------------------------ */
/* Shapes                                                                    */

/* A shape of rank 0..PD_MAX_RANK. In a parallel tensor's overall shape a dim
 * of -1 marks an axis on which the components differ; component shapes and
 * host shapes never hold -1. */
typedef struct dev_shape {
  int rank;
  int64_t dims[PD_MAX_RANK];
} dev_shape;

/* Builds a shape from `rank` dims; rejects rank outside 0..PD_MAX_RANK or a
 * negative dim (INVALID_ARGUMENT naming the axis). */
pd_code dev_shape_make(int rank, const int64_t *dims, dev_shape *out,
                       dev_status *st);

/* Element count with overflow checks: INVALID_ARGUMENT if a dim is negative or
 * the product exceeds INT64_MAX. */
pd_code dev_shape_num_elements(const dev_shape *s, int64_t *out,
                               dev_status *st);

/* Byte size of a dense tensor of `dt` and shape `s`: INVALID_ARGUMENT if the
 * element count or the byte size overflows (int64 / size_t). */
pd_code dev_shape_byte_size(pd_dtype dt, const dev_shape *s, size_t *out,
                            dev_status *st);

bool dev_shape_equal(const dev_shape *a, const dev_shape *b);

/* Writes "[2, 3, -1]" into buf (always NUL-terminated); returns buf. */
char *dev_shape_str(const dev_shape *s, char *buf, size_t len);

/* NumPy broadcasting of two shapes. INVALID_ARGUMENT (naming both shapes)
 * when they do not broadcast. */
pd_code dev_shape_broadcast(const dev_shape *a, const dev_shape *b,
                            dev_shape *out, dev_status *st);

/* ------------------------------------------------------------------------ */
/* Attributes                                                                */

typedef enum dev_attr_type {
  DEV_ATTR_NONE = 0, /* declared but absent (no default) */
  DEV_ATTR_INT = 1,
  DEV_ATTR_FLOAT = 2,
  DEV_ATTR_BOOL = 3,
  DEV_ATTR_STRING = 4,
  DEV_ATTR_DTYPE = 5,
  DEV_ATTR_SHAPE = 6,
  DEV_ATTR_INT_LIST = 7,
  DEV_ATTR_FLOAT_LIST = 8,
} dev_attr_type;

/* Limits on attribute values a client controls. */
#define DEV_ATTR_LIST_MAX 64
#define DEV_ATTR_STRING_MAX 256

/* A typed attribute value. Strings and lists point at memory the caller owns
 * for the duration of the call that takes them; the engine copies what it
 * keeps. */
typedef struct dev_attr_value {
  dev_attr_type type;
  union {
    int64_t i;
    double f;
    bool b;
    pd_dtype dtype;
    dev_shape shape;
    struct {
      const char *ptr;
      size_t len;
    } s;
    struct {
      const int64_t *v;
      int n;
    } ilist;
    struct {
      const double *v;
      int n;
    } flist;
  } u;
} dev_attr_value;

/* A named attribute as a client gives it. */
typedef struct dev_attr {
  const char *name;
  dev_attr_value value;
} dev_attr;

/* Convenience constructors for dev_attr (no allocation). */
dev_attr dev_attr_int(const char *name, int64_t v);
dev_attr dev_attr_float(const char *name, double v);
dev_attr dev_attr_bool(const char *name, bool v);
dev_attr dev_attr_string(const char *name, const char *s);
dev_attr dev_attr_dtype(const char *name, pd_dtype v);
dev_attr dev_attr_shape(const char *name, int rank, const int64_t *dims);
dev_attr dev_attr_int_list(const char *name, const int64_t *v, int n);
dev_attr dev_attr_float_list(const char *name, const double *v, int n);

/* ------------------------------------------------------------------------ */
/* Ops by name                                                               */

#define DEV_MAX_ATTRS 12 /* attrs declared by one op */
#define DEV_MAX_INPUTS                                                         \
  64 /* flattened inputs of one op (list args count each) */
/* Flattened outputs of one op (a list output counts each). Per-op storage
 * is sized by the real counts on the hot paths (prepare.c, the scheduler,
 * the wire), not by this bound. */
#define DEV_MAX_OUTPUTS 64

/* An op's definition (its arguments, attributes, inference and kernels);
 * its fields are for kernel authors (dev_backend.h). */
typedef struct dev_op_def dev_op_def;

/* Registers every built-in op and its CPU kernels, once (pthread_once).
 * Called by dev_engine_create; safe to call from any thread, many times. */
void dev_registry_init(void);

/* Looks an op up by name (TensorFlow raw-op spelling). NULL if unknown.
 * Thread-safe after dev_registry_init. */
const dev_op_def *dev_op_lookup(const char *name);

/* Number of registered ops and the i-th in name order (for listings). */
int dev_op_count(void);
const dev_op_def *dev_op_at(int i);

/* The op's name (TensorFlow raw-op spelling), e.g. "MatMul". */
const char *dev_op_def_name(const dev_op_def *def);

/* True for a collective op (AllReduce, Broadcast, AllGather, ReduceScatter):
 * every device of the op's set takes part in each run. */
bool dev_op_def_is_collective(const dev_op_def *def);

/* Number of tensors that input argument `arg` of `def` takes when the op is
 * given `num_inputs` flattened inputs (TFE_OpGetInputLength). -1 when
 * num_inputs cannot be split among the args. */
int dev_op_input_length(const dev_op_def *def, int arg, int num_inputs);

/* Number of tensors that output argument `arg` of `def` produces when the
 * op yields `num_outputs` flattened outputs (TFE_OpGetOutputLength; the
 * count comes from the op's inference, e.g. Split's num_split). -1 when
 * num_outputs cannot be split among the args (an op declares at most one
 * list output). Thread-safe. */
int dev_op_output_length(const dev_op_def *def, int arg, int num_outputs);

/* The op reference: what ListOps, `paradev ops` and docs/ops.md show of an
 * op, read from its definition (device/ops/). Strings are static, never
 * NULL ("" when the definition has none). Thread-safe after
 * dev_registry_init. Source: TensorFlow's OpDef (ArgDef, AttrDef). */
typedef struct dev_op_arg_info {
  const char *name;
  bool is_list;
  int min_len;            /* 1 for a plain argument */
  unsigned dtypes;        /* bit (1u << dtype) per accepted / produced dtype */
  const char *dtype_rule; /* "same as x", ...; "" */
  const char *doc;
  /* A list output: the attribute that gives its length (an int, or the
   * length of an int list; TF's ArgDef.number_attr); "" otherwise. */
  const char *length_attr;
} dev_op_arg_info;

typedef struct dev_op_attr_info {
  const char *name;
  dev_attr_type type;
  bool has_default;
  dev_attr_value default_value; /* when has_default; points at static data */
  bool has_min, has_max;        /* inclusive bounds of the value or of every
                                   list element */
  double min, max;
  const char *const *allowed; /* NULL or NULL-terminated strings */
  const char *doc;
} dev_op_attr_info;

/* The one-line summary (never ""), and the notes ("" when none). */
const char *dev_op_def_summary(const dev_op_def *def);
const char *dev_op_def_notes(const dev_op_def *def);
/* True when a tape can differentiate through the op (it has a VJP). */
bool dev_op_def_has_gradient(const dev_op_def *def);
/* Numbers of declared input args, output args and attributes. */
int dev_op_def_num_inputs(const dev_op_def *def);
int dev_op_def_num_outputs(const dev_op_def *def);
int dev_op_def_num_attrs(const dev_op_def *def);
/* Input arg / output / attribute i; false (out untouched) outside range. */
bool dev_op_def_input(const dev_op_def *def, int i, dev_op_arg_info *out);
bool dev_op_def_output(const dev_op_def *def, int i, dev_op_arg_info *out);
bool dev_op_def_attr(const dev_op_def *def, int i, dev_op_attr_info *out);
/* The name of an attribute type as the reference prints it: "int", "float",
 * "bool", "string", "dtype", "shape", "list(int)", "list(float)". */
const char *dev_attr_type_name(dev_attr_type t);

/* ------------------------------------------------------------------------ */
/* Device memory                                                             */

typedef struct dev_memory_stats {
  size_t struct_size;
  uint64_t bytes_in_use;
  uint64_t peak_bytes_in_use;
  uint64_t bytes_limit; /* 0: no limit */
  uint64_t bytes_total; /* physical memory of the device, 0 if unknown */
  uint64_t num_allocs;
  /* Freed blocks the backend keeps for reuse (CPU block cache): host memory
   * held for the device but not in bytes_in_use; dropped before an
   * allocation would fail and after large frees. */
  uint64_t bytes_cached;
} dev_memory_stats;

#define DEV_MEMORY_STATS_STRUCT_SIZE sizeof(dev_memory_stats)

/* A backend: the table of functions an engine runs its devices through
 * (defined in dev_backend.h, for backend authors). */
typedef struct dev_backend dev_backend;

/* ------------------------------------------------------------------------ */
/* Engine                                                                    */

typedef struct dev_engine dev_engine;
typedef struct dev_tensor dev_tensor;

/* Which path collectives take (DEV_CUDA_COLL_AUTO: NCCL when every mesh entry
 * is a distinct GPU and NCCL was built in, the copy path otherwise). With
 * AUTO, the environment variable PARADEV_CUDA_COLLECTIVES=nccl|copy|auto
 * chooses instead (for tests and for ruling NCCL out on a machine). */
typedef enum dev_cuda_collectives {
  DEV_CUDA_COLL_AUTO = 0,
  DEV_CUDA_COLL_NCCL = 1, /* NCCL even for one device; distinct GPUs only */
  DEV_CUDA_COLL_COPY = 2, /* copy-and-reduce kernels on the GPUs */
} dev_cuda_collectives;

/* Engine configuration; starts with struct_size (use
 * DEV_ENGINE_CONFIG_INITIALIZER, then set fields by name). Fields are only
 * ever appended; the engine reads a field only when struct_size covers it. */
/* "The backend's default reserve" (dev_engine_config.memory_reserve). */
#define DEV_MEMORY_RESERVE_DEFAULT UINT64_MAX

typedef struct dev_engine_config {
  size_t struct_size;
  const char *backend; /* "cpu" (default when NULL) or "cuda" */
  int num_devices;     /* cpu: simulated devices, default 4 */
  /* Per-device limit in bytes; 0: the backend's default (cpu: physical
   * memory less memory_reserve, split among the devices; cuda: each GPU's
   * free memory at start less memory_reserve, split among its entries). */
  uint64_t memory_limit;
  /* cuda: the mesh, "cuda:0,cuda:1", "cuda:all" or "cuda:0,cuda:0" (see
   * dev_cuda_config.mesh in dev_cuda.h); NULL: "cuda:all". Ignored by the
   * cpu backend. */
  const char *mesh;
  /* cuda only (the cpu backend ignores them); see dev_cuda_config
   * (dev_cuda.h) for each:
   * TF32 tensor cores for float32 products (default false), bytes each GPU's
   * pool keeps cached (default UINT64_MAX: all), the collective timeout in
   * milliseconds (0: 300000) and the collective path (default AUTO). */
  bool cuda_allow_tf32;
  uint64_t cuda_pool_release_threshold;
  int cuda_collective_timeout_ms;
  dev_cuda_collectives cuda_collectives;
  /* Memory kept back from the default limits, in bytes; UINT64_MAX
   * (DEV_MEMORY_RESERVE_DEFAULT): cpu 1 GiB of the host (a quarter of it
   * when that is less), cuda 512 MiB of each GPU. */
  uint64_t memory_reserve;
  /* cpu: OpenBLAS threads for the process; 0: the cores divided by the
   * devices (at least 1), so the executors' sgemms do not oversubscribe. */
  int blas_threads;
  /* A mesh across machines (issue #16, dev_mesh.h): this engine's rank,
   * the world size and the hooks; NULL (or world_size 1): no mesh. The
   * engine copies it. */
  const struct dev_mesh_config *mesh_config;
} dev_engine_config;

#define DEV_ENGINE_CONFIG_INITIALIZER                                          \
  {                                                                            \
    sizeof(dev_engine_config), NULL, 4, 0, NULL, false, UINT64_MAX, 0,         \
        DEV_CUDA_COLL_AUTO, UINT64_MAX, 0, NULL                                \
  }

/* The thread count of the process's OpenBLAS pool (openblas_get_num_threads;
 * the cpu backend sets it from dev_engine_config.blas_threads), 0 when the
 * linked BLAS has none. Thread-safe. */
int dev_cpu_blas_threads(void);

/* Creates an engine over a new backend and starts one executor thread per
 * device, plus, on a backend with fences (CUDA), one completion thread per
 * device. Errors: INVALID_ARGUMENT (unknown backend, bad device count, a cuda
 * setting out of range), UNAVAILABLE (backend cannot start, e.g. no GPU),
 * RESOURCE_EXHAUSTED (threads). Thread-safe. */
pd_code dev_engine_create(const dev_engine_config *cfg, dev_engine **out,
                          dev_status *st);

/* Waits for all queued work (on a backend with fences, until the devices
 * have finished it), stops the executor and completion threads and frees the
 * engine. Every tensor must have been released. Accepts NULL. */
void dev_engine_destroy(dev_engine *e);

int dev_engine_num_devices(const dev_engine *e);
/* The physical GPU engine device `device` runs on, as the node's scheduler
 * numbers GPUs (SLURM_JOB_GPUS, the CUDA ordinal); several logical devices
 * may share one. The CPU backend's simulated device k stands for GPU k (so
 * tests can bind jobs to "GPUs"). -1 for a device out of range or on no
 * GPU. Thread-safe. (issue #17: jobs held to their GPUs) */
int dev_engine_device_gpu(const dev_engine *e, int device);
/* The engine's backend, for backend and kernel authors (dev_backend.h);
 * programs use the accessors below instead of reading its fields. */
dev_backend *dev_engine_backend(dev_engine *e);

/* The backend's name, "cpu" or "cuda" ("" if it has none; never NULL).
 * Thread-safe. */
const char *dev_engine_backend_name(dev_engine *e);

/* A short description of device `device` ("cpu:0 (simulated)", the GPU's
 * name on CUDA); "" for a device out of range. Thread-safe. */
const char *dev_engine_device_name(dev_engine *e, int device);

/* False once `device` has hit an unrecoverable error (a sticky CUDA error:
 * its context is lost and every later op on it fails with UNAVAILABLE);
 * true on a backend that has no such state (the CPU backend) and false for a
 * device out of range. Thread-safe. */
bool dev_engine_device_healthy(dev_engine *e, int device);

/* Waits until every op submitted so far has run on every device (finished on
 * the device, not only issued). Returns OK (per-op failures are stored on
 * their outputs, not reported here), or the backend's error when a device
 * cannot be synchronized (UNAVAILABLE for an unhealthy GPU). */
pd_code dev_engine_sync(dev_engine *e, dev_status *st);

/* Seconds device `device` has spent busy with ops since the engine was
 * created. Idle time waiting for work is not counted. Monotonic; 0 for a
 * device out of range. A daemon compares it with wall time to tell time on
 * the devices from time spent elsewhere (RPC, queueing). Thread-safe,
 * lock-free.
 *  - CPU backend (no fences): the sum, over every op, of the wall time of the
 *    executor's part of it (allocating outputs, the kernel, or the device's
 *    share of a collective, including the wait for its peers): compute time.
 *  - CUDA (fences): the time the device had issued work that had not yet
 *    finished: for each op, from when its issue began or the previous op
 *    finished on the device, whichever is later, to when its fence reported
 *    it finished. Overlapping ops count once. It includes the completion
 *    thread's wake-up (microseconds) and time a kernel waits inside the GPU
 *    (for a collective's peers), so it is an upper bound on the GPU's own
 *    busy time, as nvidia-smi's utilisation is. */
double dev_engine_busy_seconds(dev_engine *e, int device);

/* --- Progress (for a daemon's liveness) ------------------------------------ */

/* What one device is doing, as dev_engine_watch last saw it. */
typedef enum dev_progress_state {
  DEV_PROGRESS_IDLE = 0, /* every op submitted to it has finished */
  /* An op is in its kernel (on a backend with fences: issued and not yet
   * finished on the device), a collective waiting for its peers included. */
  DEV_PROGRESS_RUNNING,
  /* Ops are submitted to it, but its executor runs none of them. */
  DEV_PROGRESS_WAITING,
} dev_progress_state;

/* The caller's memory between dev_engine_watch calls for one device; zero
 * it first. */
typedef struct dev_progress {
  uint64_t done, run, beats; /* the counters as last sampled */
  double since; /* when it last made progress, or started having work */
  dev_progress_state state;
} dev_progress;

/* Samples `device`'s progress at `now` (seconds, any clock the caller uses
 * consistently) and returns the seconds since it last made progress while
 * it had work (0 when idle); p->state says what it is doing. Progress is an
 * op beginning or finishing on the device, or a heartbeat of the running
 * kernel (dev_kernel_heartbeat); work arriving is not. So a WAITING device
 * whose time keeps growing is stalled (its executor takes no work), and a
 * RUNNING one runs one long kernel (or waits in a collective for a peer).
 * Call it periodically with the same `p`. Lock-free: a wedged executor or
 * device cannot block the caller. Any thread (one per `p`); 0 and IDLE for
 * a device out of range. Source: the liveness/readiness split of
 * Kubernetes probes (issue #14: a long kernel is not a stall). */
double dev_engine_watch(dev_engine *e, int device, dev_progress *p, double now);

/* Test hook: while `hold` is set, `device`'s executor runs nothing (ops
 * queue up; the device reads as DEV_PROGRESS_WAITING). For tests of the
 * daemon's stall detection; never set in service. Thread-safe. */
void dev_engine_test_hold(dev_engine *e, int device, bool hold);

/* Prepares host memory [ptr, ptr + bytes) for fast transfers: on CUDA it is
 * page-locked (cudaHostRegister) so dev_tensor_write / dev_tensor_read from
 * and into it are direct DMA; on the CPU backend it does nothing. Meant for
 * long-lived buffers (shared memory regions), not per-transfer use: page
 * locking costs about as much as one copy. Ranges must not overlap a range
 * already registered. INVALID_ARGUMENT for NULL or bytes == 0;
 * RESOURCE_EXHAUSTED when the OS refuses to lock the pages; ALREADY_EXISTS
 * for a range that overlaps one already registered; UNAVAILABLE when no
 * device is healthy. Thread-safe. */
pd_code dev_engine_host_register(dev_engine *e, void *ptr, size_t bytes,
                                 dev_status *st);
/* Undoes dev_engine_host_register for the range starting at `ptr`. The caller
 * must make sure no transfer from or into it is still running (a finished
 * dev_tensor_write/dev_tensor_read has completed its copies). Thread-safe. */
void dev_engine_host_unregister(dev_engine *e, void *ptr);

/* Memory statistics of one device (see dev_memory_stats). */
pd_code dev_engine_memory_stats(dev_engine *e, int device,
                                dev_memory_stats *out, dev_status *st);

/* Device sets (dev_devset_*, issue #17: placement): dev_devset.h, part of
 * this interface (included at the end; the type is declared here). */
typedef struct dev_devset dev_devset;

/* --- Parallel tensors ---------------------------------------------------- */

/* How a host value maps onto components (upload and download). */
typedef enum dev_layout_kind {
  DEV_LAYOUT_MIRRORED = 0,      /* one host value, copied to every device */
  DEV_LAYOUT_SHARDED = 1,       /* split / concatenated along `axis` */
  DEV_LAYOUT_PER_COMPONENT = 2, /* one host value per component */
  DEV_LAYOUT_COMPONENT = 3,     /* download only: one component, `component` */
} dev_layout_kind;

typedef struct dev_layout {
  dev_layout_kind kind;
  int axis;      /* SHARDED */
  int component; /* COMPONENT */
} dev_layout;

/* Shape of shard `i` of `n` when splitting `host` along `axis`: dims[axis]/n
 * each, the first dims[axis]%n one longer. */
void dev_shard_shape(const dev_shape *host, int axis, int n, int i,
                     dev_shape *out);

/* Creates a tensor of `dtype` with the given component shapes
 * ([num_devices]), allocates its components synchronously and leaves the
 * data unset (for uploads). RESOURCE_EXHAUSTED when a device is over its
 * limit (nothing stays allocated); INVALID_ARGUMENT for a bad dtype/shape. */
pd_code dev_tensor_create(dev_engine *e, pd_dtype dtype,
                          const dev_shape *component_shapes, dev_tensor **out,
                          dev_status *st);

/* Creates a tensor for an upload of a host value of `dtype` and `host_shape`
 * (or, for PER_COMPONENT, `component_shapes[num_devices]`) laid out by
 * `layout`. INVALID_ARGUMENT for an axis out of range. */
pd_code dev_tensor_create_for_layout(dev_engine *e, pd_dtype dtype,
                                     const dev_layout *layout,
                                     const dev_shape *host_shape,
                                     const dev_shape *component_shapes,
                                     dev_tensor **out, dev_status *st);

/* Pending tensors (checkpoint loads, issue #13): created and allocated like
 * dev_tensor_create_for_layout, but not ready until dev_tensor_complete:
 * dev_tensor_is_ready is false, dev_tensor_wait blocks and dev_tensor_notify
 * defers until then. dev_tensor_write fills it meanwhile (one writer per
 * component at a time). An op must not be submitted with a pending input:
 * the scheduler holds such ops (dev_op_has_pending_input). */
pd_code dev_tensor_create_pending(dev_engine *e, pd_dtype dtype,
                                  const dev_layout *layout,
                                  const dev_shape *host_shape,
                                  const dev_shape *component_shapes,
                                  dev_tensor **out, dev_status *st);
/* Ends a pending tensor: ready with its data (code PD_OK), or failed with
 * `code` and `msg` on every component (buffers freed). Wakes its waiters and
 * runs its notifications. Once only; a no-op on a tensor not pending.
 * Thread-safe. */
void dev_tensor_complete(dev_tensor *t, pd_code code, const char *msg);
/* True while a pending tensor has not been completed. */
bool dev_tensor_is_pending(const dev_tensor *t);

/* Writes bytes [offset, offset+len) of the host value of an upload into the
 * components per `layout` (for PER_COMPONENT, of component `component`'s
 * value). Chunks may arrive in any sizes. OUT_OF_RANGE past the end.
 * Not thread-safe for one tensor; the tensor must not yet be used by ops. */
pd_code dev_tensor_write(dev_tensor *t, const dev_layout *layout, int component,
                         uint64_t offset, const void *data, size_t len,
                         dev_status *st);

/* Host byte size of a download of `t` by `layout` (for PER_COMPONENT, of
 * component `component`). MIRRORED means component 0. INVALID_ARGUMENT for
 * a layout that does not fit (axis out of range, components that differ off
 * the axis), and for MIRRORED of a tensor known not to be mirrored: made
 * from a SHARDED or PER_COMPONENT host value, the output of an op that
 * passes that on (any op with such an input, except AllReduce, Broadcast
 * and AllGather; ReduceScatter, DeviceId and per-device random ops always),
 * or whose components differ in shape; never for a tensor on one device
 * (its one component is its value, issue #17). dev_tensor_read and
 * dev_tensor_to_host check the same. */
pd_code dev_tensor_host_size(const dev_tensor *t, const dev_layout *layout,
                             int component, dev_shape *host_shape,
                             uint64_t *bytes, dev_status *st);

/* Reads bytes [offset, offset+len) of the host value of a download. The tensor
 * must be ready (call dev_tensor_wait first). */
pd_code dev_tensor_read(dev_tensor *t, const dev_layout *layout, int component,
                        uint64_t offset, void *data, size_t len,
                        dev_status *st);

/* Convenience: upload a whole host value in one call. `data` holds the host
 * value (PER_COMPONENT: `datas[num_devices]`). */
pd_code dev_tensor_from_host(dev_engine *e, pd_dtype dtype,
                             const dev_layout *layout,
                             const dev_shape *host_shape, const void *data,
                             dev_tensor **out, dev_status *st);
pd_code dev_tensor_from_components(dev_engine *e, pd_dtype dtype,
                                   const dev_shape *shapes,
                                   const void *const *datas, dev_tensor **out,
                                   dev_status *st);

/* Convenience: waits, then downloads the whole value into `data`, which
 * holds `capacity` bytes. Returns the tensor's error if it failed. */
pd_code dev_tensor_to_host(dev_tensor *t, const dev_layout *layout,
                           int component, void *data, size_t capacity,
                           dev_status *st);

void dev_tensor_retain(dev_tensor *t);
/* Drops one reference; at zero the components are freed once no queued op
 * uses them. Accepts NULL. Thread-safe. */
void dev_tensor_release(dev_tensor *t);

pd_dtype dev_tensor_dtype(const dev_tensor *t);
/* The common shape of the components, -1 on axes where they differ. */
const dev_shape *dev_tensor_shape(const dev_tensor *t);
const dev_shape *dev_tensor_component_shape(const dev_tensor *t, int device);
int dev_tensor_num_components(const dev_tensor *t);
/* Bytes of all components together. */
uint64_t dev_tensor_bytes(const dev_tensor *t);
/* The tensor's device set (borrowed; lives as long as the tensor): its
 * component i is on engine device dev_tensor_devset(t)->dev[i], and
 * dev_tensor_num_components(t) == dev_tensor_devset(t)->n. */
const dev_devset *dev_tensor_devset(const dev_tensor *t);
/* Bytes of the tensor's component on engine device `device`; 0 when the
 * tensor has none there (per-device memory accounting). */
uint64_t dev_tensor_device_bytes(const dev_tensor *t, int device);

/* Placement variants of the creators above (dev_tensor_create_on, ...,
 * dev_tensor_from_components_on): dev_devset.h. */

/* Non-blocking: true when every component has been computed (or failed): on
 * a backend with fences (CUDA), when the device has finished the op, not when
 * it was queued. */
bool dev_tensor_is_ready(const dev_tensor *t);

/* Waits until every component is computed (on CUDA: finished on the GPU,
 * see dev_backend.fence_wait); returns the tensor's status (the first failing
 * component's error, naming the device; an error the GPU reported while
 * running the op, such as an illegal address, is that op's).
 * FAILED_PRECONDITION for the output of an op that was prepared but not yet
 * submitted. */
pd_code dev_tensor_wait(dev_tensor *t, dev_status *st);

/* dev_tensor_wait with a deadline in CLOCK_MONOTONIC seconds (as from
 * dev_monotonic_now()); DEADLINE_EXCEEDED when it passes first (the tensor's
 * op goes on). A deadline <= 0 means no deadline. */
pd_code dev_tensor_wait_until(dev_tensor *t, double deadline, dev_status *st);

/* Seconds on CLOCK_MONOTONIC. */
double dev_monotonic_now(void);

/* Calls fn(arg, t, code) exactly once when every component of `t` is
 * computed, where code is the tensor's status (read the message with
 * dev_tensor_wait, which then returns at once). It runs on the caller's thread
 * when `t` is ready already, else on the engine thread of the device that
 * finishes last (its executor, or on a backend with fences its completion
 * thread, once the device has finished the op): it must not block or call
 * back into the engine's waits. The tensor is kept alive until fn returns.
 * Returns RESOURCE_EXHAUSTED (host memory) or
 * FAILED_PRECONDITION (op not yet submitted); fn is then never called.
 * Thread-safe. Source: cudaLaunchHostFunc / TF's AsyncValue::AndThen. */
typedef void (*dev_ready_fn)(void *arg, dev_tensor *t, pd_code code);
pd_code dev_tensor_notify(dev_tensor *t, dev_ready_fn fn, void *arg,
                          dev_status *st);

/* --- Ops ----------------------------------------------------------------- */

typedef struct dev_op dev_op;

/* Validates and prepares one op: looks it up, checks arity (list inputs per
 * TFE_OpGetInputLength), attributes (known names, types, required ones),
 * runs shape inference for every component, and creates its outputs (not yet
 * allocated). Nothing is queued. Errors: INVALID_ARGUMENT for an unknown op, a wrong arity, an unknown/mistyped/missing attribute, or
 * what inference rejects; FAILED_PRECONDITION for an input that belongs to
 * another engine. Thread-safe. */
pd_code dev_op_prepare(dev_engine *e, const char *op_name,
                       dev_tensor *const *inputs, int num_inputs,
                       const dev_attr *attrs, int num_attrs, dev_op **out,
                       dev_status *st);

/* dev_op_prepare with a placement (issue #17): an op without tensor inputs
 * (Fill, RandomNormal, DeviceId, ...) runs on `set`; an op with inputs runs
 * on their set, which must be one: INVALID_ARGUMENT naming both sets and
 * saying how to move a value (ParallelPack, ParallelUnpack, CopyToDevices)
 * when two inputs' sets differ, or when `set` is given and is not theirs.
 * NULL: the inputs' set, or the whole mesh for an op without inputs. The
 * placement ops ParallelPack, ParallelUnpack and CopyToDevices have their
 * own rules (their op reference). dev_op_prepare is this with NULL.
 * Thread-safe. */
pd_code dev_op_prepare_on(dev_engine *e, const dev_devset *set,
                          const char *op_name, dev_tensor *const *inputs,
                          int num_inputs, const dev_attr *attrs, int num_attrs,
                          dev_op **out, dev_status *st);
/* The devices a prepared op runs on (borrowed, lives with the op): its
 * inputs' and outputs' sets together (for the placement ops, the union of
 * their sets), in order of first appearance. The scheduler's per-device
 * accounting and dispatch read it. */
const dev_devset *dev_op_devset(const dev_op *op);
/* Bytes the op will newly allocate on engine device `device` (as
 * dev_op_new_bytes, on that device alone). */
uint64_t dev_op_device_new_bytes(const dev_op *op, int device);

int dev_op_num_outputs(const dev_op *op);
/* Borrowed output i of a prepared op (retain it to keep it). */
dev_tensor *dev_op_output(const dev_op *op, int i);
/* Bytes the outputs will occupy across all devices. */
uint64_t dev_op_output_bytes(const dev_op *op);
/* Bytes the op will newly allocate across all devices (for quotas): like
 * dev_op_output_bytes, but an output that shares its input's buffer
 * (Identity, Reshape) counts 0. A function call (dev_fn_prepare_call)
 * also counts its buffer arena, the largest device's planned bytes, as
 * transient use: held while the call runs, freed after its last node. */
uint64_t dev_op_new_bytes(const dev_op *op);
/* Which outputs share which inputs' buffers: dev_op_output_shares in
 * dev_devset.h. */
/* True when one of the op's inputs is a pending tensor (dev_tensor_create_
 * pending) not yet completed; the first such input in *pending (borrowed)
 * when pending != NULL. Thread-safe. */
bool dev_op_has_pending_input(const dev_op *op, dev_tensor **pending);

/* The estimated cost of a prepared op on its engine's backend, before it
 * runs, from its shapes alone, for the slowest device (the component with
 * the most work; components may differ in shape):
 *   flops    2*M*N*K for MatMul and BatchMatMul (K read off input 0 and
 *            the output's M), 5 per element for the softmax ops, 10 per
 *            output element for random ops, else one per element of the
 *            largest input or output
 *   bytes    every input and output component read or written; none for an
 *            op that may alias its input (Reshape, Identity); a collective's
 *            buffers twice (a ring moves 2(n-1)/n of them)
 *   time_ns  launch + max(flops / FLOP/s, bytes / bandwidth) (a roofline):
 *            CPU 2 us, 20 GFLOP/s, 8 GB/s per device; CUDA 5 us, 30
 *            TFLOP/s, 2 TB/s (DEV_COST_* in device/cost.c). The scheduler
 *            scales it by what completions of the same op measured.
 * `out->struct_size` must be set (DEV_OP_COST_INITIALIZER); fields beyond
 * it are not written. Errors: INVALID_ARGUMENT (NULL op or out, or a
 * struct_size short of `flops`). Thread-safe (reads the prepared op only).
 * Source: the roofline model (Williams et al., CACM 2009). */
typedef struct dev_op_cost {
  size_t struct_size;
  double flops, bytes;
  uint64_t time_ns;
} dev_op_cost;
#define DEV_OP_COST_INITIALIZER                                                \
  { sizeof(dev_op_cost), 0, 0, 0 }
pd_code dev_op_estimate(const dev_op *op, dev_op_cost *out, dev_status *st);

/* Asks each device's executor to add the nanoseconds its part of `op` took
 * to *sink (atomically; the sum over devices) before it publishes the op,
 * so a dev_tensor_notify on output 0 sees every device's time. Only the
 * devices holding a component of output 0 add (a placement op's others,
 * ParallelUnpack's devices past output 0's and CopyToDevices' source-only
 * devices, add nothing: they may finish after output 0 is ready), so *sink
 * may go once output 0 is ready. CPU: the kernel's run; with fences: from
 * when the device could start it (issued, the previous op done) to its
 * fence. Call before dev_op_submit. NULL: none (the default). */
void dev_op_set_time_sink(dev_op *op, uint64_t *sink);

/* Queues a prepared op on every device in the one global order and takes
 * ownership of `op`. Thread-safe. */
void dev_op_submit(dev_engine *e, dev_op *op);

/* Queues ops[0..n) as n dev_op_submit calls in that order would, taking
 * ownership of each, but with one lock and at most one wake-up per device
 * for the whole batch (a dispatcher's turn). An op with a pending input is
 * refused as dev_op_submit refuses it; the others keep their order.
 * Thread-safe. Source: paradev (issue #15, the dispatcher's batches). */
#define DEV_SUBMIT_BATCH_MAX 64
void dev_op_submit_batch(dev_engine *e, dev_op *const *ops, int n);

/* Drops a prepared op without running it; its outputs fail with `code` and
 * `msg` (e.g. CANCELLED). Takes ownership of `op`. */
void dev_op_abandon(dev_op *op, pd_code code, const char *msg);

/* Prepare + submit in one call. On success writes the outputs (owned by the
 * caller) into outputs[0..*num_outputs); `*num_outputs` holds the capacity
 * on entry (INVALID_ARGUMENT when too small). */
pd_code dev_execute(dev_engine *e, const char *op_name,
                    dev_tensor *const *inputs, int num_inputs,
                    const dev_attr *attrs, int num_attrs, dev_tensor **outputs,
                    int *num_outputs, dev_status *st);
/* dev_execute with a placement (see dev_op_prepare_on). */
pd_code dev_execute_on(dev_engine *e, const dev_devset *set,
                       const char *op_name, dev_tensor *const *inputs,
                       int num_inputs, const dev_attr *attrs, int num_attrs,
                       dev_tensor **outputs, int *num_outputs, dev_status *st);

/* The gradient tape (dev_tape_*): dev_tape.h, part of this interface. */
#include "dev_tape.h"

/* Part of this interface: graph functions (dev_fn_*, dev_function.h), device
 * sets and the placement creators (dev_devset.h, issue #17), a mesh across
 * machines (dev_engine_mesh_*, hooks, transport: dev_mesh.h, issue #16). */
#include "dev_function.h"
#include "dev_devset.h"
#include "dev_mesh.h"

#ifdef __cplusplus
}
#endif

#endif /* PARADEV_DEVICE_H */
