/* Helpers shared by the method handlers (handlers.c, stream.c): reply arenas
 * and conversions between paradev.proto messages and device.h types. */
#ifndef PARADEV_SERVER_SRV_INT_H
#define PARADEV_SERVER_SRV_INT_H

#include "paradev/v1/paradev.pb-c.h"
#include "server.h"

/* Blocks freed together once a reply is packed. */
typedef struct srv_arena {
  struct srv_arena_block {
    struct srv_arena_block *next;
    max_align_t align[];
  } *head;
} srv_arena;

/* Zeroed memory that lives until srv_arena_free; NULL when out of memory. */
void *srv_arena_alloc(srv_arena *a, size_t bytes);
void srv_arena_free(srv_arena *a);

/* Proto Shape (NULL: a scalar) -> dev_shape: INVALID_ARGUMENT (naming `what`)
 * for rank over PD_MAX_RANK or a negative dim. */
pd_code srv_shape_from_pb(const Paradev__V1__Shape *pb, const char *what,
                          dev_shape *out, dev_status *st);
Paradev__V1__Shape *srv_shape_to_pb(srv_arena *a, const dev_shape *s);
/* Wire dtype -> pd_dtype: INVALID_ARGUMENT outside 1..PD_DTYPE_COUNT-1. */
pd_code srv_dtype_from_pb(int v, const char *what, pd_dtype *out,
                          dev_status *st);
Paradev__V1__TensorInfo *srv_info_to_pb(srv_arena *a, uint64_t id, pd_dtype dt,
                                        const dev_shape *shape);

/* Proto Operation -> sched_op, checking the per-op limits. `attrs` holds
 * DEV_MAX_ATTRS entries; the result points into `pb` and `attrs`. */
pd_code srv_op_from_pb(const Paradev__V1__Operation *pb, int index,
                       dev_attr *attrs, sched_op *out, dev_status *st);
Paradev__V1__OpResult *srv_result_to_pb(srv_arena *a, const sched_op *op,
                                        const sched_op_result *r);

/* Opens (and renews) the session of a token; on failure ends the call with
 * the error and returns NULL. */
sched_session *srv_open_session(srv_call *c, ProtobufCBinaryData token);

/* What an upload's header says (Upload, UploadFromSharedMemory). */
typedef struct srv_upload_spec {
  pd_dtype dtype;
  dev_layout layout;               /* MIRRORED, SHARDED or PER_COMPONENT */
  dev_shape host;                  /* MIRRORED, SHARDED */
  dev_shape comps[PD_MAX_DEVICES]; /* PER_COMPONENT: one per device */
  uint64_t total;                  /* host bytes, all components together */
} srv_upload_spec;

/* Checks an upload header's dtype, shape, layout and component shapes
 * against the mesh and max_tensor_bytes: INVALID_ARGUMENT naming what was
 * wrong, RESOURCE_EXHAUSTED over max_tensor_bytes (stream.c). */
pd_code srv_upload_spec_from_pb(srv *s, int dtype,
                                const Paradev__V1__Shape *shape,
                                const Paradev__V1__Layout *layout,
                                size_t n_component_shapes,
                                Paradev__V1__Shape *const *component_shapes,
                                srv_upload_spec *out, dev_status *st);

/* A download's layout (NULL: MIRRORED) for a tensor of `ndev` components;
 * *num_parts gets the host values it makes (ndev for PER_COMPONENT, else 1).
 * INVALID_ARGUMENT for an unknown kind or a component out of range. */
pd_code srv_download_layout_from_pb(const Paradev__V1__Layout *pb, int ndev,
                                    dev_layout *out, int *num_parts,
                                    dev_status *st);

/* Streaming methods (stream.c). */
extern srv_method srv_m_upload, srv_m_download, srv_m_enqueue,
    srv_m_echo_stream;

/* Gradient tapes (tape.c): the unary methods, and the Enqueue items. */
extern srv_method srv_m_start_tape, srv_m_watch_tape, srv_m_gradient,
    srv_m_delete_tape;
/* Runs a tape item of an Enqueue stream (start_tape, watch_tape, gradient,
 * delete_tape) with the stream's tag; its outcome goes to *st and a
 * gradient's results to *out / *n_out (in `a`). False when `req` holds no
 * tape item. */
bool srv_tape_item(srv_call *c, sched_session *ss, uint64_t tag,
                   const Paradev__V1__EnqueueRequest *req, srv_arena *a,
                   Paradev__V1__TensorInfo ***out, size_t *n_out,
                   dev_status *st);

/* Shared memory regions (shm.c): the four unary methods. */
extern srv_method srv_m_register_shm, srv_m_unregister_shm, srv_m_upload_shm,
    srv_m_download_shm;

#endif /* PARADEV_SERVER_SRV_INT_H */
