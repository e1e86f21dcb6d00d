/* A mesh across machines (issue #16), the engine's side: one engine per
 * daemon, every daemon's engine over the same global devices, the bytes of a
 * component only where its device is.
 *
 * A mesh of W ranks (daemons) with n local devices each numbers its devices
 * 0 .. W*n-1: rank r's own ("local") devices are [r*n, r*n + n), the rest
 * are "remote". Every rank's engine is created with the same W, its own r
 * and n local devices (dev_engine_config.num_devices / the CUDA mesh), and
 * then has W*n devices (dev_engine_num_devices): tensors, device sets,
 * layouts, shape inference, DeviceId, per-device random streams and
 * collectives are all over the global devices, so every rank's engine agrees
 * on everything except where the bytes are. A component on a remote device
 * has no buffer; its bytes are counted (dev_tensor_device_bytes, quotas) as
 * if it had one. The backend is created with the n local devices only; the
 * engine translates (global device D is backend device D - r*n).
 *
 * The coordinator (rank 0) is the only engine that clients' ops reach. Its
 * hooks (below) see every op it submits, in seq order, and every host
 * transfer that touches a remote component; the daemon's mesh layer sends
 * them to the ranks, whose engines replay them: dev_op_prepare_on with the
 * same op, attributes, inputs and set, then dev_op_submit_seq with the
 * coordinator's seq. A remote device's executor on the coordinator runs no
 * kernel: it waits (remote_wait) until the rank that owns the device says it
 * has run the op there, and takes that outcome as its component's. So the
 * coordinator's readiness, waits, Sync, errors and dispatch bounds follow
 * the ranks' real progress. On the other ranks a remote device's executor
 * does nothing (no wait): each rank runs only its own components. The
 * executors of remote devices are still there (every op is pushed to every
 * device of its set on every rank; the remote ones run nothing), and
 * dev_engine_watch never reads a remote device as quiet (its own rank
 * watches it).
 *
 * Collectives whose device set lies within one rank run as before (the
 * backend's own, issue #17). Collectives whose set spans ranks go through a
 * dev_mesh_transport (Gloo on the CPU backend, device/mesh/gloo.cc): each
 * local device of the set is one participant (its index in the set), or,
 * for AllReduce and ReduceScatter, each rank's first device of the set is
 * (its rank's devices reduce in-process first; mesh/coll.c), with
 * host buffers (the CPU backend's device memory; other backends are staged
 * through host memory). Every participant first all-reduces a failure flag,
 * so a device whose inputs failed makes the collective fail on every device
 * of every rank, naming the device; then the data moves. A transport error
 * (a peer rank died: at once; a peer stalled: after the transport's timeout)
 * fails the collective's outputs with UNAVAILABLE or DEADLINE_EXCEEDED
 * naming the rank.
 *
 * What a multi-rank engine refuses (UNIMPLEMENTED, naming the mesh):
 * graph function calls (dev_fn_prepare_call*; register-time refusal is the
 * server's), and placement ops (ParallelPack, ParallelUnpack,
 * CopyToDevices) whose input and output sets are not all on one rank.
 *
 * Source: TensorFlow's remote eager workers and collective ops, JAX's
 * multi-controller model with a coordinator, torch.distributed's store on
 * rank 0; the one-order rule of this engine (device.h). */
#ifndef PARADEV_DEV_MESH_H
#define PARADEV_DEV_MESH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- The collective transport across ranks --------------------------------- */

/* A transport of collectives between the participants of one device set,
 * one participant per device (set->dev[i] is participant i), each a thread
 * of the rank owning the device. Made by the daemon (device/mesh/gloo.cc's
 * dev_gloo_transport_create over the mesh's key-value store) for one epoch
 * of the mesh; handed to the engine with dev_engine_mesh_set_transport.
 * Every function is thread-safe; calls for one group come from one thread
 * (the participant's executor). Errors name the peer rank or participant
 * and say why (the peer closed its connection; no answer within the
 * timeout), with UNAVAILABLE (a peer went away) or DEADLINE_EXCEEDED (the
 * timeout passed). A call never blocks past the transport's timeout. */
typedef struct dev_mesh_transport dev_mesh_transport;
struct dev_mesh_transport {
  size_t struct_size;
  void *impl;
  /* Participant `index` of `set` (global engine devices, in order) joins
   * the set's group, made once per (set, index) and cached by the
   * transport; blocks until every participant of the set has joined (their
   * rendezvous), at most the timeout. *group is the transport's until
   * `release`. */
  pd_code (*group_get)(dev_mesh_transport *t, const dev_devset *set,
                       int index, void **group, dev_status *st);
  /* In place over `count` elements of `dtype` (every dtype the engine's
   * collectives take: float32, float64, float16, bfloat16, int32, int64,
   * uint8, bool), with `red` a dev_reduction (dev_backend.h): SUM, PROD,
   * MAX or MIN (MEAN is the
   * engine's: SUM, then a division). */
  pd_code (*all_reduce)(dev_mesh_transport *t, void *group, void *buf,
                        size_t count, pd_dtype dtype, int red,
                        dev_status *st);
  /* `bytes` bytes from participant `root` to every participant's buf. */
  pd_code (*broadcast)(dev_mesh_transport *t, void *group, void *buf,
                       size_t bytes, int root, dev_status *st);
  /* Participant i's in_bytes[i] bytes (this participant's from `in`),
   * concatenated in participant order into every participant's `out` (sum
   * of in_bytes). */
  pd_code (*all_gather)(dev_mesh_transport *t, void *group, const void *in,
                        const size_t *in_bytes, void *out, dev_status *st);
  /* Takes and drops a reference on the transport itself: the engine holds
   * one while a collective runs on it, the daemon one while it is the
   * engine's current transport. The last release frees it (closing its
   * groups' connections). */
  void (*retain)(dev_mesh_transport *t);
  void (*release)(dev_mesh_transport *t);
};

#define DEV_MESH_TRANSPORT_STRUCT_SIZE sizeof(dev_mesh_transport)

/* --- The engine's mesh configuration and hooks ------------------------------ */

/* dev_engine_config.mesh_config. Every hook gets `arg`. Hooks marked coordinator
 * are called only on rank 0 (set them NULL elsewhere); remote_wait and
 * local_done by device executors, the rest by whichever thread made the
 * call into the engine. None may call back into the engine's waits. */
typedef struct dev_mesh_config {
  size_t struct_size;
  int rank;       /* 0 .. world_size-1; 0 is the coordinator */
  int world_size; /* >= 1; 1 is an ordinary engine (no hook is called) */
  void *arg;

  /* Coordinator: op `op` was just given seq dev_op_seq(op) and is being
   * pushed to its devices, under the engine's submit lock, in seq order.
   * Read it with the accessors below; pack what the ranks need now (the op
   * may be freed once this returns) and queue it; do not block. */
  void (*op_submitted)(void *arg, const dev_op *op);
  /* Coordinator: a tensor for host data was created (the dev_tensor_create
   * family and dev_tensor_create_pending_on; never an op's output), before
   * any write to it: its id, dtype, set, component shapes, pending state
   * and layout marks (dev_tensor_layout_marks). */
  void (*tensor_created)(void *arg, const dev_tensor *t);
  /* Coordinator: bytes [offset, offset + len) of the dense buffer of
   * component `component` (on a remote device) were written by an upload
   * or a load (dev_tensor_write, whatever its layout: the engine cuts it per
   * component). The data is the caller's; copy it. An error fails the
   * write (the caller's upload fails with it). */
  pd_code (*component_write)(void *arg, const dev_tensor *t, int component,
                             uint64_t offset, const void *data, size_t len,
                             dev_status *st);
  /* Coordinator: reads bytes [offset, offset + len) of remote component
   * `component` into `data` (dev_tensor_read and dev_tensor_to_host, after
   * the component is ready); blocks until the rank answered (errors:
   * UNAVAILABLE naming the rank when it went away). */
  pd_code (*component_read)(void *arg, const dev_tensor *t, int component,
                            uint64_t offset, void *data, size_t len,
                            dev_status *st);
  /* Coordinator: a pending tensor made by tensor_created was completed
   * (dev_tensor_complete) with `code` / `msg`. */
  void (*tensor_completed)(void *arg, const dev_tensor *t, pd_code code,
                           const char *msg);
  /* Coordinator: the last reference on `t` went (called once per tensor,
   * for op outputs too, after every op that reads it was submitted and
   * forwarded); the ranks may release their copy. */
  void (*tensor_released)(void *arg, const dev_tensor *t);
  /* Coordinator: remote device `device`'s executor reached op `seq`:
   * blocks until the rank owning the device has finished that op there and
   * returns its outcome there (PD_OK, or the error the rank's component got,
   * the message naming the rank). UNAVAILABLE naming the rank, without
   * waiting, once the rank is gone. */
  pd_code (*remote_wait)(void *arg, int device, uint64_t seq,
                         dev_status *st);

  /* Ranks other than 0: op `seq` has finished on local device `device`
   * (the outputs' components there are published: dev_tensor_read of them
   * works) with `code` / `msg`: PD_OK, or the first failed output
   * component's error on that device. Called for every op pushed to a local
   * device, in seq order per device, on an engine thread (the executor or
   * the completion thread); must not block. */
  void (*local_done)(void *arg, int device, uint64_t seq, pd_code code,
                     const char *msg);
} dev_mesh_config;

#define DEV_MESH_CONFIG_INITIALIZER                                            \
  { sizeof(dev_mesh_config), 0, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL,   \
    NULL, NULL }

/* The engine's place in its mesh: its rank, the world size and its local
 * devices [*first, *first + *count) (first 0 and count all of them for an
 * engine without a mesh). Thread-safe. */
int dev_engine_mesh_rank(const dev_engine *e);
int dev_engine_mesh_world_size(const dev_engine *e);
void dev_engine_local_devices(const dev_engine *e, int *first, int *count);
/* True when engine device `device` is local (always, without a mesh). */
bool dev_engine_device_is_local(const dev_engine *e, int device);

/* Replaces the transport of cross-rank collectives (NULL: none; such a
 * collective then fails with UNAVAILABLE "the mesh has no collective
 * transport (not formed, or degraded)"). Takes a reference on `t`
 * (t->retain) and drops the old one's. A collective uses the transport
 * that was current when it was submitted (collectives submitted before
 * the change keep the old one until they end), so an epoch's ops never
 * run on the next epoch's groups. Thread-safe. */
void dev_engine_mesh_set_transport(dev_engine *e, dev_mesh_transport *t);

/* What the rank owning remote engine device `device` said of it when it
 * attached (the coordinator, server/mesh_ctl.c): its name on that rank
 * (the engine names the device "r<R>/<name>", e.g. "r1/cpu:0"; until then
 * "r<R>/dev:<i>"; NULL or "": unchanged) and its memory limit and total in
 * bytes (0: unknown: local device 0's figures stand in), which
 * memory_stats reports from then on (info, quotas' shares). A local
 * device, an engine without a mesh or a device out of range: ignored.
 * Thread-safe (a reader of the name may see the old one while it changes,
 * which happens only at a rank's first attach). */
void dev_engine_mesh_set_remote_device(dev_engine *e, int device,
                                       const char *name, uint64_t bytes_limit,
                                       uint64_t bytes_total);

/* The last seq the engine handed out (0 before any op). Thread-safe. */
uint64_t dev_engine_last_seq(dev_engine *e);
/* Coordinator: the next op's seq will be above `seq` (no-op when it is
 * already): a new coordinator starts above every rank's last seq. */
void dev_engine_advance_seq(dev_engine *e, uint64_t seq);

/* Ranks: dev_op_submit with the coordinator's seq for the op (the engine's
 * seq jumps to it). INVALID_ARGUMENT when `seq` is not above
 * dev_engine_last_seq (the op is then abandoned with that error). Takes
 * ownership of `op` either way. Thread-safe, but the ranks' replay submits
 * from one thread, in the coordinator's order. */
pd_code dev_op_submit_seq(dev_engine *e, dev_op *op, uint64_t seq,
                          dev_status *st);

/* --- What the hooks read ------------------------------------------------------ */

/* The engine-unique id of a tensor: 1, 2, ... in creation order, never
 * reused within an engine. The mesh's name for it on every rank. */
uint64_t dev_tensor_id(const dev_tensor *t);
/* The marks a download checks (device_int.h dev_tensor.not_mirrored and
 * .shard_axis_p1), to read on the coordinator and set on a rank's copy
 * before any op uses it. */
void dev_tensor_layout_marks(const dev_tensor *t, bool *not_mirrored,
                             int *shard_axis_p1);
void dev_tensor_set_layout_marks(dev_tensor *t, bool not_mirrored,
                                 int shard_axis_p1);

/* A submitted or prepared op: its seq (valid in op_submitted; 0 before),
 * its definition and name, its inputs (borrowed) and its resolved
 * attribute values, def's num_attrs of them in declaration order (defaults
 * filled; names and types from dev_op_def_attr), all borrowed from the op.
 * Outputs: dev_op_num_outputs / dev_op_output (device.h); set:
 * dev_op_devset. */
uint64_t dev_op_seq(const dev_op *op);
const dev_op_def *dev_op_definition(const dev_op *op);
const char *dev_op_name(const dev_op *op);
int dev_op_num_inputs(const dev_op *op);
dev_tensor *dev_op_input(const dev_op *op, int i);
const dev_attr_value *dev_op_attr_values(const dev_op *op);

#ifdef __cplusplus
}
#endif

#endif /* PARADEV_DEV_MESH_H */
