/* libparadev: a daemon's place in a mesh across machines (issue #16).
 * Part of the API of <paradev/paradev.h>, which includes this header:
 * include that one. */
#ifndef PARADEV_MESH_H
#define PARADEV_MESH_H

#include "paradev/paradev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A mesh across machines (issue #16): GetServerInfo.mesh, this daemon's
 * place in it. pd_server_info_has_mesh is 1 when the daemon is a rank of a
 * mesh ([mesh] world_size > 1), else 0; off a mesh the other accessors give
 * a daemon of its own: world size 1, rank 0, devices per rank the number of
 * devices, not formed, not degraded, no missing ranks, epoch 0, coordinator
 * and reason "", no ranks. A NULL info: as off a mesh, 0 devices per rank.
 *  - world size: the ranks of the mesh (one paradevd each); rank: this
 *    daemon's (0 is the coordinator, the only one clients use); devices per
 *    rank: every rank's local devices (rank r owns the global devices
 *    [r*n, r*n+n) of pd_server_info_device).
 *  - formed: 1 once every rank has attached and the transports are built;
 *    degraded: 1 while a rank that was attached is lost and has not come
 *    back. The mesh serves sessions only when formed and not degraded (the
 *    health check says NOT_SERVING otherwise).
 *  - missing ranks: the ranks not attached now (the coordinator's view;
 *    another rank reports none): how many, and missing rank i (-1 outside
 *    0 <= i < num).
 *  - epoch: grows by one at each (re-)formation; 0 before the first.
 *  - coordinator: HOST:PORT of the coordinator's mesh port.
 *  - reason: why the mesh is degraded or not formed, one sentence
 *    ("not formed: waiting for 1 ranks"); "" when it is whole.
 * Strings are valid until pd_server_info_delete.
 * Thread safety: thread-safe on a pd_server_info no one deletes.
 * Source: GetServerInfoResponse.mesh (MeshInfo). */
int pd_server_info_has_mesh(const pd_server_info *info);
int pd_server_info_mesh_world_size(const pd_server_info *info);
int pd_server_info_mesh_rank(const pd_server_info *info);
int pd_server_info_mesh_devices_per_rank(const pd_server_info *info);
int pd_server_info_mesh_formed(const pd_server_info *info);
int pd_server_info_mesh_degraded(const pd_server_info *info);
int pd_server_info_mesh_num_missing_ranks(const pd_server_info *info);
int pd_server_info_mesh_missing_rank(const pd_server_info *info, int i);
uint64_t pd_server_info_mesh_epoch(const pd_server_info *info);
const char *pd_server_info_mesh_coordinator(const pd_server_info *info);
const char *pd_server_info_mesh_reason(const pd_server_info *info);

/* One rank as the coordinator sees it (MeshRankInfo). Fields are only ever
 * added at the end. */
typedef struct pd_mesh_rank_info {
  int rank;
  const char *host;          /* its address for the mesh's transport */
  uint64_t incarnation;      /* random at each start of that paradevd */
  int attached;              /* 1 while its mesh stream is up (rank 0: 1) */
  uint64_t last_seen_ms_ago; /* since its last message; 0 for rank 0 and
                                for a rank never seen */
} pd_mesh_rank_info;

/* The coordinator's view of every rank: how many (the world size on rank
 * 0; 0 on another rank and off a mesh), and rank i's (NULL outside
 * 0 <= i < num), valid until pd_server_info_delete. */
int pd_server_info_mesh_num_ranks(const pd_server_info *info);
const pd_mesh_rank_info *pd_server_info_mesh_rank_info(
    const pd_server_info *info, int i);

#ifdef __cplusplus
}
#endif

#endif /* PARADEV_MESH_H */
