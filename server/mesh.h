/* Private header of the daemon's mesh across machines (issue #16): what
 * the control plane (mesh_ctl.c, mesh_link.c, mesh_kv.c: joining, the
 * Attach streams, heartbeats, formation and loss, the key-value store, the
 * collective transport's epochs) and the data plane (mesh_fwd.c on the
 * coordinator: the engine's hooks -> packed MeshCommands, progress and reads
 * back; mesh_apply.c on the other ranks: commands -> the rank's engine,
 * local_done -> MeshProgress) offer each other. paradev.v1.Mesh is in
 * proto/paradev/v1/mesh.proto; the engine side in device/dev_mesh.h.
 *
 * Order at start (daemon.c): srv_mesh_create (options; before the engine),
 * srv_mesh_engine_config (the hooks go into dev_engine_config.mesh_config),
 * the engine, the scheduler, srv_mesh_start (the coordinator's mesh
 * listener or the rank's link; returns once the mesh is formed, or -1 after
 * join_timeout_s with the missing ranks logged), serving. At stop:
 * srv_mesh_stop before the scheduler ends, srv_mesh_destroy after the
 * engine. A daemon without [mesh] (world_size 1) has s->mesh == NULL and
 * none of this runs.
 *
 * Threads: every function here is thread-safe unless it says otherwise. */
#ifndef PARADEV_SERVER_MESH_H
#define PARADEV_SERVER_MESH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "paradev/v1/mesh.pb-c.h"

typedef struct srv srv;
typedef struct srv_mesh srv_mesh;

/* --- control plane (mesh_ctl.c), for daemon.c and the data plane --------- */

/* Makes the mesh state from s->opt's [mesh] options (world size, rank,
 * coordinator, from flags, the file or the launcher's environment) into
 * s->mesh; leaves s->mesh NULL for world size 1. 0, or -1 after logging. */
int srv_mesh_create(srv *s);
/* Fills ec->mesh_config (a dev_mesh_config the mesh owns) with rank, world
 * size and the data plane's hooks (srv_mesh_fwd_hooks / srv_mesh_apply_hooks
 * below). */
void srv_mesh_engine_config(srv_mesh *m, dev_engine_config *ec);
/* Starts the mesh once the engine and scheduler exist (see above). */
int srv_mesh_start(srv *s);
/* A SIGTERM or SIGINT (main.c's signal thread): a srv_mesh_start still
 * waiting for the mesh gives up (-1, logged), so a stop never waits for
 * join_timeout_s. Any thread; accepts NULL. */
void srv_mesh_interrupt(srv_mesh *m);
void srv_mesh_stop(srv *s);
void srv_mesh_destroy(srv *s);

/* The daemon of `m`, and the slot where the data plane keeps its state
 * (mesh_fwd.c's on rank 0, mesh_apply.c's elsewhere). */
srv *srv_mesh_server(srv_mesh *m);
void *srv_mesh_data(srv_mesh *m);
void srv_mesh_set_data(srv_mesh *m, void *data);

int srv_mesh_rank(const srv_mesh *m);
int srv_mesh_world_size(const srv_mesh *m);
int srv_mesh_devices_per_rank(const srv_mesh *m);
/* The rank owning global engine device `device`. */
int srv_mesh_device_rank(const srv_mesh *m, int device);
/* Every rank attached and the transport of the current epoch built on all
 * of them (the coordinator's readiness; a rank: joined). */
bool srv_mesh_formed(const srv_mesh *m);
/* The coordinator lost a rank and it has not come back. */
bool srv_mesh_degraded(const srv_mesh *m);

/* What the methods ask (mesh_ctl.c; each accepts m NULL: PD_OK, no mesh).
 * srv_mesh_check_client: on ranks other than 0 every ParallelDevice method
 * but GetServerInfo (`path` "/paradev.v1.ParallelDevice/Execute") is
 * FAILED_PRECONDITION naming the rank and the coordinator's host.
 * srv_mesh_check_functions: RegisterFunction on a mesh, UNIMPLEMENTED.
 * srv_mesh_check_whole: CreateSession on a coordinator whose mesh is not
 * formed or degraded, UNAVAILABLE naming the missing ranks. (Sessions the
 * loss of a rank ended: calls with their tokens get UNAVAILABLE naming the
 * loss from the scheduler, sched_kill_because.) */
pd_code srv_mesh_check_client(const srv_mesh *m, const char *path,
                              dev_status *st);
pd_code srv_mesh_check_functions(const srv_mesh *m, dev_status *st);
pd_code srv_mesh_check_whole(srv_mesh *m, dev_status *st);

/* A snapshot of the mesh for GetServerInfo and /metrics. */
typedef struct srv_mesh_peer_view {
  bool attached;
  char host[256];
  uint64_t incarnation;
  double last_seen_s; /* since its last message (0: rank 0, or never) */
} srv_mesh_peer_view;
typedef struct srv_mesh_view {
  int world, rank, per_rank;
  bool formed, degraded;
  uint64_t epoch;
  char reason[512];
  char coordinator[256];
  int missing[64];
  int n_missing;
  srv_mesh_peer_view ranks[64]; /* the coordinator's view; zero elsewhere */
  uint64_t sessions_killed, losses, formations;
  size_t tensors; /* ranks: srv_mesh_apply_tensors */
} srv_mesh_view;
void srv_mesh_info(srv_mesh *m, srv_mesh_view *v);

/* Coordinator: queues one packed MeshCommand (bytes copied) for rank
 * `rank`'s stream, after every command queued for it before. Never blocks
 * on the network. false when the rank is not attached (the command is
 * dropped; the data plane has already failed that rank's waits, see
 * srv_mesh_fwd_rank_lost). */
bool srv_mesh_send_command(srv_mesh *m, int rank, const uint8_t *packed,
                           size_t len);
/* Rank: queues one packed RankMessage (progress, read results) for the
 * coordinator. false when not attached (dropped). */
bool srv_mesh_send_to_coordinator(srv_mesh *m, const uint8_t *packed,
                                  size_t len);

/* --- data plane, coordinator side (mesh_fwd.c) ---------------------------- */

/* The coordinator's dev_mesh_config hooks (op_submitted, tensor_created,
 * component_write / _read, tensor_completed, tensor_released, remote_wait),
 * arg = the mesh's data state. Called by srv_mesh_engine_config on rank 0. */
void srv_mesh_fwd_hooks(srv_mesh *m, dev_mesh_config *cfg);
/* Makes / frees the coordinator's data state (m's; before the engine / after
 * it). 0 or -1 after logging. */
int srv_mesh_fwd_create(srv_mesh *m);
void srv_mesh_fwd_destroy(srv_mesh *m);
/* A RankMessage from rank `rank` arrived (its progress and read results;
 * the control plane handles hello, heartbeat and transport fields), on the
 * stream's thread, in the rank's order. */
void srv_mesh_fwd_on_message(srv_mesh *m, int rank,
                             const Paradev__V1__RankMessage *msg);
/* Rank `rank` attached (incarnation `inc`): its devices' progress starts
 * afresh at `last_seq`. */
void srv_mesh_fwd_rank_attached(srv_mesh *m, int rank, uint64_t inc,
                                uint64_t last_seq);
/* Rank `rank` is gone (stream ended, lease passed): every wait and read on
 * its devices, present and future, fails with UNAVAILABLE and `why` (which
 * names the rank) until it attaches again. */
void srv_mesh_fwd_rank_lost(srv_mesh *m, int rank, const char *why);

/* --- data plane, rank side (mesh_apply.c) --------------------------------- */

/* The ranks' dev_mesh_config hooks (local_done). */
void srv_mesh_apply_hooks(srv_mesh *m, dev_mesh_config *cfg);
/* Makes the rank's data state (before the engine) and its two threads (the
 * progress sender, the read worker). srv_mesh_apply_destroy (after the
 * engine) frees it; the rank's tensors must have been dropped before the
 * engine was destroyed (srv_mesh_apply_drop_all in srv_mesh_stop, once the
 * link delivers no more commands), since the engine needs every tensor
 * released. */
int srv_mesh_apply_create(srv_mesh *m);
void srv_mesh_apply_destroy(srv_mesh *m);
/* Applies the packed MeshCommands of one CoordinatorMessage, in order, on
 * the link's receive thread (ops are prepared and submitted here; reads are
 * answered from a worker so they do not hold up later commands). A command
 * that fails (an unknown tensor id, a refused op) fails what it makes (the
 * op's outputs on this rank, reported in MeshProgress) and is logged; it
 * never stops the stream. */
void srv_mesh_apply_commands(srv_mesh *m, const ProtobufCBinaryData *cmds,
                             size_t n);
/* The coordinator is gone or was replaced: releases every tensor the rank
 * holds for it and forgets pending reads (their answers are dropped). */
void srv_mesh_apply_drop_all(srv_mesh *m, const char *why);
/* Tensors the rank holds for the coordinator now (metrics, logs). */
size_t srv_mesh_apply_tensors(srv_mesh *m);

#endif /* PARADEV_SERVER_MESH_H */
