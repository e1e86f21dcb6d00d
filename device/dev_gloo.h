/* The cross-rank collective transport over Gloo (issue #16;
 * device/mesh/gloo.cc, C++ behind this C interface): a dev_mesh_transport
 * (dev_mesh.h) whose groups are Gloo contexts over TCP, rendezvousing
 * through the mesh's key-value store. Gloo's exceptions never cross this
 * interface: every failure is a status naming the peer and why.
 *
 * Source: Gloo (github.com/facebookincubator/gloo; Debian's libgloo-dev):
 * gloo::rendezvous::Context::connectFullMesh over a Store,
 * gloo::transport::tcp, gloo::allreduce / broadcast / allgatherv. */
#ifndef PARADEV_DEV_GLOO_H
#define PARADEV_DEV_GLOO_H

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The mesh's key-value store as the transport's rendezvous uses it (the
 * daemon's: KvSet / KvGet on the coordinator, paradev.v1.Mesh). Both
 * thread-safe. get waits up to timeout_s for the key to exist and returns a
 * malloc'd copy of its value (the caller frees it); NOT_FOUND naming the key
 * when it did not appear in time, UNAVAILABLE when the store cannot be
 * reached. */
typedef struct dev_mesh_kv {
  void *arg;
  pd_code (*set)(void *arg, const char *key, const void *value, size_t len,
                 dev_status *st);
  pd_code (*get)(void *arg, const char *key, double timeout_s, void **value,
                 size_t *len, dev_status *st);
} dev_mesh_kv;

/* True when this build has Gloo (libgloo-dev found at configure time);
 * without it dev_gloo_transport_create is UNIMPLEMENTED. */
bool dev_gloo_available(void);

/* Creates a transport whose groups' keys all start with `prefix` (the mesh
 * epoch: "epoch/3/"), listening on `hostname` (this rank's address the
 * others can reach; an IP or a name) and failing any rendezvous or
 * collective that makes no progress for timeout_s seconds (Gloo's context
 * timeout: DEADLINE_EXCEEDED; a peer that closed its connection:
 * UNAVAILABLE at once). `kv` is copied; its arg must outlive the transport.
 * One reference, the caller's (t->release). Errors: INVALID_ARGUMENT
 * (timeout_s <= 0, an empty hostname), UNAVAILABLE (hostname does not
 * resolve), UNIMPLEMENTED without Gloo. Thread-safe. */
pd_code dev_gloo_transport_create(const dev_mesh_kv *kv, const char *prefix,
                                  const char *hostname, double timeout_s,
                                  dev_mesh_transport **out, dev_status *st);

#ifdef __cplusplus
}
#endif

#endif /* PARADEV_DEV_GLOO_H */
