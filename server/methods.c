/* The one table of paradevd's methods, expanded from the wire's list
 * (proto/paradev/v1/methods.h, PD_*_METHODS): each entry's path, kind and
 * message types come from there, and its handlers from the method file of
 * its domain, which defines `srv_h_<Method>`. A method added to the list and
 * given no handlers fails to link; tests/unit/test_methods.c checks the list
 * against the proto's service descriptors and this table against the list. */
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "paradev/v1/admin.pb-c.h"
#include "paradev/v1/mesh.pb-c.h"
#include "paradev/v1/methods.h"
#include "paradev/v1/paradev.pb-c.h"
#include "server.h"

#define SRV_DECLARE(SVC, METHOD, KIND, REQ, RESP)                              \
  extern const srv_handlers srv_h_##METHOD;
PD_ALL_METHODS(SRV_DECLARE)
#undef SRV_DECLARE

#define SRV_DEFINE(SVC, METHOD, KIND, REQ, RESP)                               \
  static srv_method srv_m_##METHOD = {                                         \
      .path = PD_METHOD_PATH(SVC, METHOD),                                     \
      .kind = SRV_##KIND,                                                      \
      .request = &REQ##__descriptor,                                           \
      .response = &RESP##__descriptor,                                         \
      .h = &srv_h_##METHOD,                                                    \
  };
PD_ALL_METHODS(SRV_DEFINE)
#undef SRV_DEFINE

#define SRV_ENTRY(SVC, METHOD, KIND, REQ, RESP) &srv_m_##METHOD,
srv_method *const srv_methods[] = {PD_PARALLEL_DEVICE_METHODS(SRV_ENTRY)
                                       PD_HEALTH_METHODS(SRV_ENTRY) NULL};
srv_method *const srv_admin_methods[] = {PD_ADMIN_METHODS(SRV_ENTRY) NULL};
srv_method *const srv_mesh_methods[] = {PD_MESH_METHODS(SRV_ENTRY) NULL};
#undef SRV_ENTRY

const srv_method *srv_method_find(const char *path) {
  for (int k = 0; k < 3; k++) {
    srv_method *const *table = k == 0   ? srv_methods
                               : k == 1 ? srv_admin_methods
                                        : srv_mesh_methods;
    for (int i = 0; table[i]; i++)
      if (strcmp(table[i]->path, path) == 0) return table[i];
  }
  return NULL;
}
