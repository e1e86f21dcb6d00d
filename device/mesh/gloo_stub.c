/* dev_gloo.h without Gloo: this build found no libgloo-dev at configure
 * time (CMakeLists.txt, "Gloo"), so a mesh across machines has no
 * collective transport on the CPU backend. Everything else of the mesh
 * (forwarded ops, uploads, reads) works; cross-rank collectives fail with
 * the engine's "no collective transport" error. */
#include "dev_gloo.h"

bool dev_gloo_available(void) { return false; }

pd_code dev_gloo_transport_create(const dev_mesh_kv *kv, const char *prefix,
                                  const char *hostname, double timeout_s,
                                  dev_mesh_transport **out, dev_status *st) {
  (void)kv;
  (void)prefix;
  (void)hostname;
  (void)timeout_s;
  (void)out;
  return dev_error(st, PD_UNIMPLEMENTED,
                   "paradevd was built without Gloo (libgloo-dev): no "
                   "collectives across machines on the CPU backend; install "
                   "libgloo-dev (scripts/setup.sh) and rebuild");
}
