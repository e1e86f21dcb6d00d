/* Who is calling: the identity of a call and what it may do (issue #14).
 *
 * An identity comes from the mTLS client certificate (SAN, else CN; gRPC's
 * grpc_auth_context_peer_identity), from a bearer token (`authorization:
 * Bearer ...` checked against the tokens file, which holds only hashes), or,
 * on a Unix socket, from the peer's uid. The config maps identities to
 * tenants ([tenant NAME] identities = ...) and lists operators. Method files
 * ask here, once per call (the answer is cached in the call). */
#ifndef PARADEV_SERVER_AUTH_H
#define PARADEV_SERVER_AUTH_H

#include <stdbool.h>

#include "server.h"

#define SRV_IDENTITY_MAX 512 /* bytes of an identity's name */

typedef enum srv_identity_kind {
  SRV_IDENTITY_NONE = 0,  /* nothing presented (a listener that needs none) */
  SRV_IDENTITY_CERT = 1,  /* mTLS client certificate: "spiffe://...", a DNS
                            name or the CN */
  SRV_IDENTITY_TOKEN = 2, /* bearer token: the name the tokens file gives */
  SRV_IDENTITY_UNIX = 3,  /* Unix socket peer: "uid:1000" */
} srv_identity_kind;

typedef struct srv_identity {
  srv_identity_kind kind;
  char name[SRV_IDENTITY_MAX + 1]; /* "" for SRV_IDENTITY_NONE */
  char tenant[SCHED_NAME_MAX + 1]; /* "" when the identity has no tenant */
  bool is_operator;                /* may call the Admin service's methods */
} srv_identity;

/* The identity of call `c`, resolved at the first ask and cached in the call
 * (one thread per call, so no lock). Errors (the call should fail with them,
 * and the refusal is logged and counted by the caller through
 * srv_auth_refused): UNAUTHENTICATED when the listener requires an identity
 * and none (or a bad token) was presented; PERMISSION_DENIED when the
 * identity maps to no tenant where tenants are configured. */
pd_code srv_call_identity(srv_call *c, const srv_identity **out,
                          dev_status *st);

#endif /* PARADEV_SERVER_AUTH_H */
