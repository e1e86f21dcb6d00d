/* The default session quota (server.h srv_default_quota), on its own so
 * that what recomputes it (daemon.c at start, main.c on SIGHUP, mesh_ctl.c
 * when a rank's real memory limits arrive) does not call into daemon.c,
 * which starts and stops them all. */
#include "server.h"

uint64_t srv_default_quota(const srv_options *o, dev_engine *e) {
  const srv_limits *l = &o->limits;
  if (l->default_memory_quota == UINT64_MAX) return 0; /* none */
  if (l->default_memory_quota) return l->default_memory_quota;
  uint64_t mesh = srv_mesh_bytes(e);
  uint64_t pct = (uint64_t)l->default_memory_quota_percent;
  uint64_t q = mesh <= UINT64_MAX / 100 ? mesh * pct / 100 : mesh / 100 * pct;
  if (l->max_memory_quota && q > l->max_memory_quota) q = l->max_memory_quota;
  return q;
}
