/* Private header of device/: what the engine's own files share (tensors,
 * components, buffers, queued ops, the engine's fields). Not for other
 * layers: they include device/device.h (programs) or device/dev_backend.h
 * (kernels and backends). Non-static names that nothing outside device/ may
 * call carry a double underscore (dev__), as libuv's uv__; the older dev_
 * names here (dev_exec_wait, dev_engine_create_with_backend, ...) are also
 * used by tests/unit/test_fence.c, so they keep their names. The executor's
 * private header is exec_int.h, the tape's tape_int.h. */
#ifndef PARADEV_DEVICE_INT_H
#define PARADEV_DEVICE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "dev_backend.h"
#include "../common/check.h"

#define DEV_CACHE_LINE 64

/* A device buffer, shared by tensors that alias it (Reshape, Identity). */
typedef struct dev_buffer {
  atomic_int refs;
  int device;
  void *data;
  size_t bytes;
  dev_backend *backend;
} dev_buffer;

/* One component of a parallel tensor. `buf`, `code` and `msg` are written by
 * the device's executor before it publishes `ready_seq` as done; readers look
 * at them only after dev__exec_done(device) >= ready_seq. On a backend with
 * fences, the device's completion thread may still set `code` and `msg` (an
 * error the device reported while running the op) until it publishes, under
 * the executor's mutex and leaving `buf` in place (freed with the tensor), so
 * the executor reads the codes of its ops' inputs under that mutex. */
typedef struct dev_component {
  /* Each component starts a cache line of its own (DEV_CACHE_LINE), so one
   * device's executor dropping its holds does not contend with its peers
   * reading theirs (adjacent components shared a line: pipelined dispatch
   * went from ~4.7 to ~5.7 us/op when per-component holds came in). */
  _Alignas(DEV_CACHE_LINE) dev_shape shape;
  size_t bytes;
  dev_buffer *buf;
  _Atomic uint64_t ready_seq; /* 0: ready at creation (uploads);
                               UINT64_MAX: prepared, not yet submitted */
  /* Atomic: release.c may fail an OK component after it was published (a
   * peer's component of the same output failed); readers that see its code
   * not OK see its msg (written first). */
  _Atomic pd_code code;
  char *msg; /* heap, when code != PD_OK */
  /* References that may still read this component: the tensor's refs less
   * the ops that hold it and have finished on this device (exec.c drops
   * theirs per device). At zero the buffer is freed, though the tensor lives
   * on until its peers' ops are done: a device far ahead does not hold its
   * peers' intermediates. */
  atomic_int holders;
} dev_component;

/* What a pending tensor (dev_tensor_create_pending) needs until
 * dev_tensor_complete: its waiters and the dev_tensor_notify registrations
 * deferred until then. Only pending tensors have one; it lives until the
 * tensor is freed. `mu` guards `regs` and the change of dev_tensor.pending. */
typedef struct dev__pending_reg {
  dev_ready_fn fn;
  void *arg;
  struct dev__pending_reg *next;
} dev__pending_reg;

typedef struct dev__pending {
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* CLOCK_MONOTONIC, for deadlines */
  dev__pending_reg *regs; /* in registration order */
  dev__pending_reg *regs_tail;
} dev__pending;

struct dev_tensor {
  atomic_int refs;
  /* True from dev_tensor_create_pending until dev_tensor_complete (written
   * under pend->mu with release order, after the components' codes); false
   * for every other tensor, so their readiness costs one load of it. */
  atomic_bool pending;
  dev__pending *pend; /* NULL unless created pending */
  dev_engine *engine;
  pd_dtype dtype;
  dev_shape shape; /* common shape, -1 where components differ */
  int n;
  uint64_t bytes;
  /* Known not to be mirrored, so a MIRRORED download (component 0) is
   * refused: made from a SHARDED or PER_COMPONENT host value, or the output
   * of an op that passes the mark on (prepare.c outputs_not_mirrored). */
  bool not_mirrored;
  /* The axis + 1 of the SHARDED host value it was made from (an upload or
   * a load, dev_tensor_create_for_layout); 0 where not known (an op's
   * output, another layout). A SHARDED read along another axis is refused
   * (transfer.c check_shard_axis). */
  unsigned char shard_axis_p1;
  /* Placement (issue #17): component i lives on engine device set.dev[i];
   * slot[D] is the component on engine device D, -1 where none. n ==
   * set.n. */
  dev_devset set;
  int8_t slot[PD_MAX_DEVICES];
  /* dev_tensor_id: 1, 2, ... per engine (tensor.c). */
  uint64_t id;
  /* Coordinator of a mesh: the hooks announced it (tensor_created, or an
   * output of an op given to op_submitted), so tensor_released tells of
   * its end; never set elsewhere. */
  bool mesh_known;
  dev_component comps[];
};

/* The engine device of t's component c, and t's component on engine device
 * `device` (-1 when t has none there). */
static inline int dev__comp_device(const dev_tensor *t, int c) {
  return t->set.dev[c];
}
static inline int dev__slot(const dev_tensor *t, int device) {
  return t->slot[device];
}

/* The engine: a backend and one executor per device (exec_int.h). */
struct dev_engine {
  dev_backend *backend;
  int n;
  bool fenced; /* the backend has all three fence functions */
  pthread_mutex_t submit_mu;
  uint64_t seq;              /* the last op seq handed out (under submit_mu) */
  _Atomic uint64_t last_seq; /* the same, lock-free (dev_engine_watch) */
  struct dev_exec *execs;    /* [n] */
  /* Freed ops for reuse (dev__op_alloc / dev__op_recycle), under op_mu, a
   * leaf lock: no malloc of a dev_op per op on the hot path. */
  pthread_mutex_t op_mu;
  struct dev_op *op_free;
  int op_nfree;
  dev_devset all; /* the whole mesh, [0..n) */
  /* A mesh across machines (issue #16, mesh/mesh_int.h), NULL without one
   * (world size 1): owned by the backend (a wrapper, mesh/backend.c). */
  struct dev__mesh *mesh;
  _Atomic uint64_t tensor_ids; /* the last dev_tensor_id handed out */
};

/* The placement of ops without inputs that a gradient tape runs while it
 * computes one record's VJP (a Fill scalar, DeviceId): the recorded op's
 * set, set by dev__tape_exec (tape.c) around the call on the calling
 * thread, so that a tape executor of another layer (the scheduler's), which
 * calls dev_op_prepare, places them there too. NULL otherwise (devset.c). */
extern _Thread_local const dev_devset *dev__tape_place;

/* Fills a set's inverse map: map[D] = D's position in s, -1 for devices
 * outside it (all PD_MAX_DEVICES entries written). */
static inline void dev__devset_map(const dev_devset *s, int8_t *map) {
  for (int d = 0; d < PD_MAX_DEVICES; d++) map[d] = -1;
  for (int i = 0; i < s->n; i++) map[s->dev[i]] = (int8_t)i;
}

/* Deep-copied attribute storage of a queued op. */
struct dev_op {
  const dev_op_def *def;
  dev_engine *engine;
  uint64_t seq;
  atomic_int pending; /* devices that have not run (issued) it yet */
  /* Backends with fences: devices that have not finished it, plus one held
   * by its inputs until every device has issued it (then the inputs are
   * released, so their buffers are freed stream-ordered at once, not when
   * the device catches up). The op is freed at zero. */
  atomic_int inflight;
  int num_inputs;
  int num_outputs;
  dev_attr_value attrs[DEV_MAX_ATTRS];
  void *attr_arena; /* strings and lists of attrs */
  void *collective;
  struct dev_op *next_free;
  /* Submitted, not a collective: each device's executor drops its
   * component's hold on the inputs and outputs once it has run (issued)
   * the op (dev__tensor_drop_component), so freeing the op only unrefs. */
  bool per_device_release;
  /* Backends with fences: an output could not be allocated on a device
   * (over its limit), so release.c frees the peers' components once every
   * device has issued the op. Other failures (late ones, failed inputs) do
   * not set it: each device's component stands on its own there. */
  atomic_bool issue_failed;
  /* dev_op_set_time_sink: each device adds its ns (__atomic, relaxed). */
  uint64_t *time_sink;
  /* DEV_OP_FUNCTION ops (def is the engine's function-call def): the call's
   * state (device/fn/run.c: the instantiation it holds a reference on, the
   * per-collective-node rendezvous), freed with the op. NULL otherwise. */
  void *fn_call;
  /* Placement (issue #17): the devices taking part (dev_op_devset: the
   * inputs' and outputs' sets, their union for the placement ops), and
   * index[D], engine device D's position in it (-1: not taking part). The
   * op is pushed to set.n executors; `pending` and `inflight` count them. */
  dev_devset set;
  int8_t index[PD_MAX_DEVICES];
  /* Not cleared on reuse (dev__op_alloc clears every other field): only
   * [0, num_inputs) and [0, num_outputs) are ever read. */
  dev_tensor *inputs[DEV_MAX_INPUTS];
  dev_tensor *outputs[DEV_MAX_OUTPUTS];
};

/* The head of every dev_op.fn_call (device/fn/fn_call.h): the engine's own
 * files reach a function call only through these pointers, so they never
 * call into device/fn/, whose files call theirs (no circle between files).
 *   free:     frees the call state (dev__op_free).
 *   run:      device `device`'s part of the call (exec.c run_op): reads
 *             in_data (the inputs' components), writes out_data (the
 *             outputs', allocated; NULL when `failed`), runs every
 *             collective node even when failed; true when work was issued,
 *             *st the first error (naming the function and node) otherwise.
 *   estimate: the call's cost (dev_op_estimate, cost.c): the sum of its
 *             nodes' FLOPs, bytes and roofline ns on the worst device.
 *   transient_bytes: the buffer arena of the largest device (counted by
 *             dev_op_new_bytes: memory the call holds while it runs).
 *   collectives: the body holds collectives: its holds stay with the op
 *             (engine.c per_device_release), as a collective's. */
typedef struct dev__fn_call {
  void (*free)(void *call);
  bool (*run)(dev_op *op, int device, const void *const *in_data,
              void *const *out_data, bool failed, _Atomic uint64_t *beats,
              dev_status *st);
  void (*estimate)(const dev_op *op, double *flops, double *bytes, double *ns);
  uint64_t transient_bytes;
  bool collectives;
} dev__fn_call;

/* Cost of one node on the roofline of backend kind `kind` (cost.c): FLOPs,
 * bytes and ns (launch included) from its inputs' and outputs' shapes and
 * byte sizes on one device. */
double dev__cost_node(dev_backend_kind kind, const dev_op_def *def,
                      const dev_attr_value *attrs, int num_inputs,
                      const dev_shape *in_shape, const size_t *in_bytes,
                      int num_outputs, const dev_shape *out_shape,
                      const size_t *out_bytes, double *flops, double *bytes);

/* Allocates a buffer of `bytes` on `device` through the backend. */
pd_code dev__buffer_alloc(dev_backend *b, int device, size_t bytes,
                          dev_buffer **out, dev_status *st);
void dev__buffer_retain(dev_buffer *buf);
void dev__buffer_release(dev_buffer *buf);

/* Drops one hold on t's component d (its buffer is freed at the last), and
 * one reference on t without touching the components' holds (the tensor is
 * freed at the last). dev_tensor_release is both, for every component. */
void dev__tensor_drop_component(dev_tensor *t, int d);
void dev__tensor_unref(dev_tensor *t);

/* Creates a tensor on `set` (NULL: the whole mesh) with unallocated
 * components (shapes[set->n]; the executor allocates). */
pd_code dev__tensor_new(dev_engine *e, const dev_devset *set, pd_dtype dtype,
                        const dev_shape *shapes, dev_tensor **out,
                        dev_status *st);
/* dev_tensor_create_on without the coordinator's tensor_created hook
 * (tensor.c): for creators that set marks or the pending state first and
 * then call dev__mesh_tensor_created themselves. */
pd_code dev__tensor_create_on(dev_engine *e, const dev_devset *set,
                              pd_dtype dtype, const dev_shape *shapes,
                              dev_tensor **out, dev_status *st);
/* Checks that `set` is a set of e's devices (INVALID_ARGUMENT naming the
 * entry); NULL is the whole mesh. Writes the set to use into *out. */
pd_code dev__devset_check(const dev_engine *e, const dev_devset *set,
                          dev_devset *out, dev_status *st);
/* Makes a new tensor pending (tensor.c): RESOURCE_EXHAUSTED on host OOM. */
pd_code dev__tensor_set_pending(dev_tensor *t, dev_status *st);
/* Sets a component's error (copies msg) and frees its buffer (ready.c). */
void dev__component_set_error(dev_component *c, pd_code code, const char *msg);
/* Sets an error the device reported after the op was issued, unless the
 * component has one already; leaves the buffer (a later op already issued
 * may still read it). Under the device's mutex (exec_int.h). */
void dev__component_set_late_error(dev_component *c, pd_code code,
                                   const char *msg);

/* Resolves attributes as dev_op_prepare does (prepare.c): checks the given
 * ones against def (known names, types, limits, required ones present),
 * writes def->num_attrs values into vals (defaults filled) and deep-copies
 * strings and lists into one allocation (*arena, NULL when none; the caller
 * frees it). INVALID_ARGUMENT naming the op and the attribute;
 * RESOURCE_EXHAUSTED. */
pd_code dev__resolve_attrs(const dev_op_def *def, const dev_attr *attrs,
                           int num_attrs, dev_attr_value *vals, void **arena,
                           dev_status *st);

/* Names flattened output o of an op that yields num_outputs: "'z'" or, in
 * a list output, "'output[3]'"; the bare index when the count does not fit
 * the definition (opdef.c). Returns buf. */
const char *dev__output_name(const dev_op_def *def, int num_outputs, int o,
                             char *buf, size_t len);

/* The most outputs `def` can yield: def->num_outputs, or DEV_MAX_OUTPUTS
 * when it declares a list output (prepare.c). */
int dev__op_max_outputs(const dev_op_def *def);

/* Runs def's inference for every one of n components (prepare.c):
 * in_shapes[i * n + d] is input i's component d; on success *num_outputs
 * (what infer wrote to ctx->num_outputs, at most dev__op_max_outputs),
 * out_dtype[o] and out_shapes[o * n + d] (room for dev__op_max_outputs(def)
 * * n; DEV_MAX_OUTPUTS * n always suffices).
 * `set`: the op's device set (of n devices) for the infer functions'
 * messages, or NULL (a graph function's node).
 * Errors: what the op's infer returns. No tensor needed: graph functions
 * infer their nodes with it. */
pd_code dev__infer_op(const dev_op_def *def, const dev_attr_value *attrs,
                      const dev_devset *set, int n, int num_inputs,
                      const pd_dtype *in_dtype, const dev_shape *in_shapes,
                      int *num_outputs, pd_dtype *out_dtype,
                      dev_shape *out_shapes, dev_status *st);

/* Whether an op's outputs are known not to be mirrored (prepare.c; see
 * dev_tensor.not_mirrored), given whether any input is. */
bool dev__outputs_not_mirrored(const dev_op_def *def,
                               const dev_attr_value *attrs,
                               bool input_not_mirrored);

/* Sets op's participant set (dev_op.set, .index) and the counts of the
 * devices that will run it (pending, and inflight with its extra hold). */
static inline void dev__op_set_devset(dev_op *op, const dev_devset *s) {
  op->set = *s;
  dev__devset_map(s, op->index);
  atomic_init(&op->pending, s->n);
  atomic_init(&op->inflight, s->n + 1);
}

/* dev_op_prepare_on for every op but the placement ops (prepare.c): the
 * set resolved from the inputs (or `set`, or the whole mesh); place.c's
 * dev_op_prepare_on sends the placement ops to their own path. */
pd_code dev__op_prepare_plain(dev_engine *e, const dev_op_def *def,
                              const dev_devset *set, dev_tensor *const *inputs,
                              int num_inputs, const dev_attr *attrs,
                              int num_attrs, dev_op **out, dev_status *st);
/* Checks the arity of a call of `def` and that every input is there and
 * belongs to `e` (prepare.c). */
pd_code dev__check_inputs(const dev_op_def *def, const dev_engine *e,
                          dev_tensor *const *inputs, int num_inputs,
                          dev_status *st);

/* The placement ops (place.c): an executor's part of ParallelPack,
 * ParallelUnpack or CopyToDevices on engine device `device` (exec.c);
 * true when work was issued (a copy), *st the error otherwise. */
bool dev__place_run(dev_op *op, int device, dev_status *st);

/* Frees a queued or prepared op: releases its tensors, collective and
 * attribute storage (prepare.c). */
void dev__op_free(dev_op *op);

/* A zeroed dev_op from e's free list (NULL on host out of memory), and its
 * return (at most DEV_OP_POOL are kept; the rest are freed); the list's
 * end with the engine (dev_engine_destroy; also destroys op_mu, which
 * dev_engine_create_with_backend sets up). Thread-safe (prepare.c). */
#define DEV_OP_POOL 1024
dev_op *dev__op_alloc(dev_engine *e);
void dev__op_recycle(dev_op *op);
void dev__op_pool_free(dev_engine *e);

/* Creates an engine over `b` (engine.c; taking ownership of it: on failure it is
 * destroyed) and starts its threads: what dev_engine_create does once it has
 * made the backend. For tests that wrap a backend (a fenced CPU backend). */
pd_code dev_engine_create_with_backend(dev_backend *b, dev_engine **out,
                                       dev_status *st);

/* Readiness (ready.c). Largest sequence number that `device` has finished
 * (on a backend with fences, finished on the device). */
uint64_t dev__exec_done(dev_engine *e, int device);
/* Blocks until `device`'s executor has finished op `seq`. */
void dev_exec_wait(dev_engine *e, int device, uint64_t seq);
/* The same with a CLOCK_MONOTONIC deadline in seconds (<= 0: none); false
 * when the deadline passed first. */
bool dev__exec_wait_until(dev_engine *e, int device, uint64_t seq,
                          double deadline);

/* Test hook (release.c): while `hold` is set, `device`'s executor runs
 * nothing (ops queue up; other devices run on, far ahead of it). */
void dev__exec_hold(dev_engine *e, int device, bool hold);

/* Registration of the built-in op groups (device/ops/ files). Each registers
 * its op defs and their CPU kernels. */
void dev_register_elementwise_ops(void);
void dev_register_binary_ops(void);
void dev_register_fill_cast_ops(void);
void dev_register_linalg_ops(void);
void dev_register_reduce_ops(void);
void dev_register_softmax_ops(void);
void dev_register_array_ops(void);
void dev_register_slicing_ops(void);
void dev_register_split_pack_ops(void);
void dev_register_random_ops(void);
void dev_register_collective_ops(void);
void dev_register_grad_ops(void);
void dev_register_grad_parts_ops(void);
void dev_register_fused_ops(void);     /* ops/fused.c: _FusedMatMul & co. */
void dev_register_placement_ops(void); /* ops/placement.c (issue #17) */

/* Element count of a shape already checked by infer (no overflow checks:
 * for kernels), and the product of its dims[lo..hi). */
static inline int64_t dev_num_elems(const dev_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return n;
}
static inline int64_t dev_dims_prod(const dev_shape *s, int lo, int hi) {
  int64_t n = 1;
  for (int i = lo; i < hi; i++) n *= s->dims[i];
  return n;
}

/* Widens n float16 (dt == PD_FLOAT16) or bfloat16 values to float32 (exact),
 * and rounds n float32 values back to nearest even: the float32 compute path
 * of the 16-bit dtypes. */
void dev__widen_16(pd_dtype dt, const uint16_t *src, float *dst, int64_t n);
void dev__narrow_16(pd_dtype dt, const float *src, uint16_t *dst, int64_t n);

/* float32 scratch of n elements (at least one, zeroed) for that path; NULL
 * when out of host memory, which dev__scratch_error reports as the kernel's
 * RESOURCE_EXHAUSTED ("OP: cannot allocate N float32 scratch elements"). */
float *dev__scratch_f32(int64_t n);
pd_code dev__scratch_error(const dev_kernel_ctx *c, int64_t n, dev_status *st);

/* Copies the box of `box_shape` at offset `begin` of a dense tensor of
 * `full_shape` (elements of `es` bytes) out of it into the dense `box`
 * (to_box), or from `box` into it. Runs of whole inner axes are copied with
 * one memcpy. Slice and its gradient. */
void dev__copy_box(char *full, const dev_shape *full_shape,
                   const int64_t *begin, char *box, const dev_shape *box_shape,
                   size_t es, bool to_box);

/* Registers an op def and its CPU kernel; aborts on a registration error
 * (a programming error caught by any test run). */
void dev__register_or_die(dev_op_def *def);

#endif /* PARADEV_DEVICE_INT_H */
