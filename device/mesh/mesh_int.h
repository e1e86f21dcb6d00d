/* Private header of the engine's mesh across machines (issue #16; the
 * contract is dev_mesh.h): the state one multi-rank engine shares between
 * its wrapper backend (mesh/backend.c), its cross-rank collectives
 * (mesh/coll.c) and the engine's own files (mesh/engine.c: hooks, the
 * refusals, the accessors).
 *
 * How it fits. An engine created with dev_engine_config.mesh_config of
 * world_size W > 1 wraps its real backend (n local devices) in a backend of
 * W*n devices (dev__mesh_backend_create): local devices [first, first + n)
 * are forwarded with translated indices (kernel ctx.device - first and
 * ctx.backend the real backend; ctx.index unchanged; a collective whose set
 * lies within this rank gets the real backend's own collective over the
 * translated set); remote devices never touch memory: allocate gives a
 * placeholder buffer with data NULL (the bytes are counted per device for
 * memory_stats, so every path that frees keeps working unchanged), copies
 * and kernels there are refused as internal errors (the engine never issues
 * them: exec.c runs a remote device's op through its own branch, transfer.c
 * sends remote components to the hooks). So an engine without a mesh pays
 * one pointer test (e->mesh) on the paths that care.
 *
 * Call direction (tests/lint/check_layout.py: no circles between files):
 * the engine's files call mesh/engine.c and mesh/backend.c; backend.c
 * calls coll.c; none of the mesh files calls back into the engine's files
 * (only status.c, dtype helpers and function pointers). */
#ifndef PARADEV_MESH_INT_H
#define PARADEV_MESH_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "../device_int.h"

typedef struct dev__mesh {
  dev_mesh_config cfg; /* the caller's, copied */
  int rank, world;
  int n_local; /* the real backend's devices */
  int first;   /* rank * n_local: the first local engine device */
  dev_backend *inner;
  /* The transport of cross-rank collectives and its lock (a leaf). */
  pthread_mutex_t tmu;
  dev_mesh_transport *transport;
  /* Bytes of placeholder components per engine device (remote ones). */
  _Atomic uint64_t remote_bytes[PD_MAX_DEVICES];
  char names[PD_MAX_DEVICES][48]; /* remote devices' names */
  /* Remote devices' memory limit and total as their rank reported them
   * (dev_engine_mesh_set_remote_device; 0: unknown). */
  _Atomic uint64_t remote_limit[PD_MAX_DEVICES];
  _Atomic uint64_t remote_total[PD_MAX_DEVICES];
  /* Cross-rank collectives stage through host buffers: every backend but
   * the CPU's, or any with PARADEV_MESH_STAGED=1 at creation (a test knob). */
  bool staged;
  /* Cross-rank AllReduce / ReduceScatter run one transport participant
   * per device instead of one per rank (PARADEV_MESH_FLAT_ALLREDUCE=1 at
   * creation: a test knob, so tests cover both paths). */
  bool flat;
} dev__mesh;

/* True when engine device `d` of a mesh engine is remote. */
static inline bool dev__mesh_remote(const dev__mesh *m, int d) {
  return m && (d < m->first || d >= m->first + m->n_local);
}
/* The rank owning engine device `d`. */
static inline int dev__mesh_rank_of(const dev__mesh *m, int d) {
  return d / m->n_local;
}

/* A collective's state on the wrapper (backend.c): LOCAL, a set within
 * this rank (the real backend's collective over `tset`); ELSEWHERE, within
 * another rank (nothing runs here: its devices are remote); CROSS, a set
 * spanning ranks (coll.c, through the transport). */
typedef struct dev__mesh_hier dev__mesh_hier; /* coll.c's */
typedef enum { DEV__MC_LOCAL, DEV__MC_ELSEWHERE, DEV__MC_CROSS } dev__mc_mode;
typedef struct dev__mesh_coll {
  dev__mc_mode mode;
  dev_collective_kind kind;
  dev_devset set;  /* engine devices */
  dev_devset tset; /* LOCAL: the real backend's devices */
  void *inner;     /* LOCAL: the real backend's collective */
  /* CROSS AllReduce / ReduceScatter with local participants, unless
   * m->flat: the rendezvous of this engine's participants (coll.c). */
  dev__mesh_hier *hier;
  /* CROSS: the transport current when the op was submitted (a reference,
   * NULL when there was none). An op submitted in one epoch of the mesh
   * never runs on the next epoch's groups: a stale op running late on a
   * new transport desynchronised its groups' calls across ranks, and a
   * peer's data landed in a 4-byte flag receive (an uncaught
   * gloo::EnforceNotMet in Gloo's thread that aborted the coordinator,
   * trial finding C4). */
  dev_mesh_transport *t;
} dev__mesh_coll;

/* Wraps `inner` (n local devices) in a backend of world*n devices for the
 * mesh `cfg` (backend.c). On success *out owns inner and *mesh (freed by
 * its destroy); on failure (INVALID_ARGUMENT for a bad rank, world size or
 * more than PD_MAX_DEVICES devices; RESOURCE_EXHAUSTED) inner is left to
 * the caller. */
pd_code dev__mesh_backend_create(dev_backend *inner, const dev_mesh_config *cfg,
                                 dev_backend **out, dev__mesh **mesh,
                                 dev_status *st);

/* Device ctx->index's part of a CROSS collective (coll.c): on the
 * participant's executor, through the current transport. */
pd_code dev__mesh_coll_run(dev__mesh *m, const dev__mesh_coll *mc,
                           dev_kernel_ctx *ctx, const dev_status *failed,
                           dev_status *st);

/* The hierarchical state of CROSS collective `mc` (coll.c): sets
 * mc->hier for an AllReduce or ReduceScatter with a participant on this
 * rank (unless m->flat). False when out of memory. hier_free frees it. */
bool dev__mesh_hier_init(dev__mesh *m, dev__mesh_coll *mc);
void dev__mesh_hier_free(dev__mesh_coll *mc);

/* out[lo, hi) = in[0] op in[1] op ... op in[nin-1] over [lo, hi), element
 * indices, `red` a transport reduction (SUM, PROD, MAX, MIN; reduce.c). out
 * may be one of the inputs. False for a dtype it does not take. */
bool dev__mesh_reduce(pd_dtype dt, int red, int nin, const void *const *in,
                      void *out, size_t lo, size_t hi);

/* --- what the engine's files call (mesh/engine.c) -------------------------- */

/* Coordinator hooks; each is a no-op without a mesh, off rank 0 or without
 * the hook. */
void dev__mesh_op_submitted(dev_engine *e, dev_op *op);
void dev__mesh_tensor_created(dev_tensor *t);
void dev__mesh_tensor_completed(dev_tensor *t, pd_code code, const char *msg);
void dev__mesh_tensor_released(dev_tensor *t);
/* A write or read of t's component c on a remote device: the coordinator
 * calls its hook; another rank skips a write (OK) and refuses a read
 * (FAILED_PRECONDITION naming the device and its rank). */
pd_code dev__mesh_component_write(dev_tensor *t, int c, uint64_t off,
                                  const void *data, size_t len, dev_status *st);
pd_code dev__mesh_component_read(dev_tensor *t, int c, uint64_t off, void *data,
                                 size_t len, dev_status *st);
/* Coordinator: remote device d's executor reached op `seq` (OK elsewhere). */
pd_code dev__mesh_remote_wait(dev_engine *e, int d, uint64_t seq,
                              dev_status *st);
/* Ranks other than 0, local devices: whether to report ops of device d
 * (local_done set), the outcome of op on d to report (code, msg copied into
 * msg[len]; call before the op may be freed), and the report. */
bool dev__mesh_reports(const dev_engine *e, int d);
pd_code dev__mesh_done_info(const dev_op *op, int d, char *msg, size_t len);
void dev__mesh_local_done(dev_engine *e, int d, uint64_t seq, pd_code code,
                          const char *msg);
/* INVALID... UNIMPLEMENTED when a placement op's set spans ranks (place.c). */
pd_code dev__mesh_check_placement(const dev_engine *e, const dev_op_def *def,
                                  const dev_devset *set, dev_status *st);

#endif /* PARADEV_MESH_INT_H */
