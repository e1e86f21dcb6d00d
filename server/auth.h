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

#define SRV_IDENTITY_MAX SRV_IDENTITY_NAME_MAX /* bytes of a name */

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

/* Checks again, at each message of a stream, that the bearer token call
 * `c` was let in with is still valid (trial finding 7: a revoked holder
 * must not keep an Enqueue stream). Cheap: only when the tokens table in
 * force is another one (a reload) or its generation moved
 * (srv_tokens_generation, which looks at the file at most once a second)
 * is the token checked again. PD_OK for a call of any other identity.
 * UNAUTHENTICATED when the token is revoked, names another identity now,
 * or the daemon takes no tokens any more (the caller fails the call and
 * counts the refusal as bad_token). The call's thread. */
pd_code srv_call_recheck(srv_call *c, dev_status *st);

/* --- The daemon's side: tables, refusals (auth.c) ------------------------ */

/* Why a request was refused, for the log and for /metrics
 * (paradev_auth_refusals_total{reason=...}); names in srv_refusal_name. */
typedef enum srv_refusal {
  SRV_REFUSE_NO_IDENTITY = 0,  /* none presented where one is required */
  SRV_REFUSE_BAD_TOKEN = 1,    /* a bearer token not in the tokens file */
  SRV_REFUSE_NO_TENANT = 2,    /* an identity that maps to no tenant */
  SRV_REFUSE_OTHER_TENANT = 3, /* another tenant's session (NOT_FOUND) */
  SRV_REFUSE_TENANT_LIMIT = 4, /* the tenant's sessions, memory or lease */
  SRV_REFUSE_NOT_OPERATOR = 5, /* an Admin method without operator rights */
  SRV_REFUSE_JOB_TOKEN = 6,    /* a job token unknown, expired, another
                                  uid's, or a job id claimed without one */
  SRV_REFUSE_COUNT
} srv_refusal;

const char *srv_refusal_name(srv_refusal r);

/* Logs (rate-limited: at most SRV_REFUSAL_LOG_PER_S lines a second, the
 * rest counted and summed up in the next line) and counts a refusal of
 * call `c`: the method, the caller's identity and tenant when known, and
 * st->msg. Any thread that runs the call. */
#define SRV_REFUSAL_LOG_PER_S 20
void srv_auth_refused(srv_call *c, srv_refusal why, const dev_status *st);
/* Refusals so far, by reason (metrics). */
uint64_t srv_auth_refusals(srv *s, srv_refusal why);

/* What a tenant's sessions get (CreateSession): copied out of the table in
 * force. The roots stay valid until srv_auth_destroy. */
typedef struct srv_tenant_terms {
  uint64_t memory_quota; /* bytes over all its sessions; 0: none */
  int max_sessions;      /* 0: none */
  uint32_t max_lease_s;  /* 0: the daemon's */
  int priority;
  uint32_t weight;
  /* [tenant NAME] devices (issue #17): the daemon devices its sessions may
   * use; num_devices 0: every device. */
  int num_devices;
  uint8_t devices[PD_MAX_DEVICES];
} srv_tenant_terms;
/* False when `tenant` is not configured (any more: a reload removed it). */
bool srv_auth_tenant_terms(srv *s, const char *tenant, srv_tenant_terms *out);

/* Builds the tables from s->opt (tenants, operators, the tokens file, and
 * each tenant's storage roots) and sets every tenant's limits in the
 * scheduler (sched_tenant_configure). After sched_create, before serving.
 * 0, or -1 after logging why (nothing left). */
int srv_auth_init(srv *s);
/* SIGHUP: the same from `o`; the old table stays in force when the new one
 * cannot be made (logged, -1). Sessions keep their terms. Main thread. */
int srv_auth_reload(srv *s, const srv_options *o);
/* Frees every table; after sched_destroy. Accepts a server without one. */
void srv_auth_destroy(srv *s);

/* The mTLS client certificate's identity of `call` into out[cap]: its
 * spiffe:// URI SAN when it has exactly one, else gRPC's peer identity (the
 * first SAN when the certificate has any, else the CN); false when the call
 * has no authenticated peer (no TLS, or no certificate). */
bool srv_auth_cert_identity(grpc_call *call, char *out, size_t cap);

/* --- Unix socket peers (peercred.c) ----------------------------------------- */

/* gRPC C core does not tell a server the uid of a Unix socket's peer, so
 * the daemon accepts on its Unix listen sockets itself: a thread per socket
 * accepts, reads SO_PEERCRED, notes the uid under the connection's fd and
 * hands the fd to gRPC (grpc_server_add_channel_from_fd), whose calls then
 * carry the peer "fd:N". */

/* Binds and listens on the Unix socket `path` for `gs` (a stale socket file
 * is replaced; whether a live one serves is the caller's check), with mode
 * `mode` when not 0. Call before the server starts; the accepting starts
 * with srv_unix_serve. 0, or -1 after logging why. */
int srv_unix_listen(grpc_server *gs, const char *path, unsigned mode);
/* Starts the accept threads (after grpc_server_start). 0, or -1 (logged). */
int srv_unix_serve(void);
/* Stops accepting and closes the listening sockets (before the servers
 * shut down; connections already handed to gRPC are gRPC's). */
void srv_unix_stop(void);
/* The uid of the peer of a connection accepted here, by its gRPC peer
 * string ("fd:N"); false for any other peer. Thread-safe. */
bool srv_unix_peer_uid(const char *peer, unsigned *uid);

#endif /* PARADEV_SERVER_AUTH_H */
