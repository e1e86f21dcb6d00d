/* PLACEHOLDER (helper C's branch only; the lead deletes this file at the
 * merge): no-op versions of the data plane (helper D: mesh_fwd.c,
 * mesh_apply.c) and of the Gloo transport (helper G; the engine's mesh
 * functions came with the merge of wt-engine), so that the control plane
 * builds and its tests run before those merge. Every definition is weak.
 * The hooks stay NULL; the transport is UNIMPLEMENTED. */
#include <stdio.h>
#include <stdlib.h>

#include "dev_gloo.h"
#include "dev_mesh.h"
#include "mesh.h"

#define SRV_WEAK __attribute__((weak))

SRV_WEAK void srv_mesh_fwd_hooks(srv_mesh *m, dev_mesh_config *cfg) {
  (void)m;
  (void)cfg;
}
SRV_WEAK int srv_mesh_fwd_create(srv_mesh *m) {
  (void)m;
  return 0;
}
SRV_WEAK void srv_mesh_fwd_destroy(srv_mesh *m) { (void)m; }
SRV_WEAK void srv_mesh_fwd_on_message(srv_mesh *m, int rank,
                                      const Paradev__V1__RankMessage *msg) {
  (void)m;
  (void)rank;
  (void)msg;
}
SRV_WEAK void srv_mesh_fwd_rank_attached(srv_mesh *m, int rank, uint64_t inc,
                                         uint64_t last_seq) {
  (void)m;
  (void)rank;
  (void)inc;
  (void)last_seq;
}
SRV_WEAK void srv_mesh_fwd_rank_lost(srv_mesh *m, int rank, const char *why) {
  (void)m;
  (void)rank;
  (void)why;
}
SRV_WEAK void srv_mesh_apply_hooks(srv_mesh *m, dev_mesh_config *cfg) {
  (void)m;
  (void)cfg;
}
SRV_WEAK int srv_mesh_apply_create(srv_mesh *m) {
  (void)m;
  return 0;
}
SRV_WEAK void srv_mesh_apply_destroy(srv_mesh *m) { (void)m; }
SRV_WEAK void srv_mesh_apply_commands(srv_mesh *m,
                                      const ProtobufCBinaryData *cmds,
                                      size_t n) {
  (void)m;
  (void)cmds;
  (void)n;
}
SRV_WEAK void srv_mesh_apply_drop_all(srv_mesh *m, const char *why) {
  (void)m;
  (void)why;
}
SRV_WEAK size_t srv_mesh_apply_tensors(srv_mesh *m) {
  (void)m;
  return 0;
}

/* Gloo's (helper G). */
SRV_WEAK bool dev_gloo_available(void) { return false; }
SRV_WEAK pd_code dev_gloo_transport_create(const dev_mesh_kv *kv,
                                           const char *prefix,
                                           const char *hostname,
                                           double timeout_s,
                                           dev_mesh_transport **out,
                                           dev_status *st) {
  (void)kv;
  (void)prefix;
  (void)hostname;
  (void)timeout_s;
  *out = NULL;
  return dev_error(st, PD_UNIMPLEMENTED,
                   "this build has no Gloo (placeholder transport)");
}
