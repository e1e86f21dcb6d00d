/* Private header of the mesh's control plane (mesh_ctl.c, mesh_link.c,
 * mesh_kv.c): the state they share. The data plane sees only mesh.h.
 *
 * Locks: srv_mesh.mu guards the coordinator's view of the ranks, the
 * epoch and the state flags; it nests only srv_call_wake (a batch start).
 * The link's own mu (mesh_link.c) and the store's (mesh_kv.c) nest
 * nothing of the mesh. The engine, the scheduler and the data plane are
 * called with no mesh lock held. */
#ifndef PARADEV_SERVER_MESH_INT_H
#define PARADEV_SERVER_MESH_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "dev_gloo.h"
#include "dev_mesh.h"
#include "mesh.h"
#include "server.h"

typedef struct srv_mesh_link srv_mesh_link;
typedef struct srv_mesh_kv srv_mesh_kv;

/* The coordinator's view of one rank (index = rank; 0 is its own). */
typedef struct srv_mesh_peer {
  bool attached;
  srv_call *call; /* its Attach stream, with a reference, while attached */
  uint64_t incarnation, last_seq;
  char host[256];
  double last_seen, last_sent; /* monotonic seconds */
  uint64_t ready_epoch;        /* transport_ready / _error of that epoch */
  /* What the stream's thread writes at its next wake-up. */
  ProtobufCBinaryData *cmds;
  size_t n_cmds, cap_cmds;
  bool send_formed, send_state, send_hb, wake_pending;
  bool end;          /* end the stream with UNAVAILABLE end_msg */
  char end_msg[512];
  bool ever; /* attached at least once */
  /* Each attach's number (srv_attach.gen): a loss, a silence, a transport
   * answer counts only for the stream of the rank's current attach. */
  uint64_t gen;
  /* A loss of this rank is being applied (the data plane told, sessions
   * killed, the transport dropped, outside mu): a new attach waits for it
   * (refused with UNAVAILABLE; the rank tries again), so that the loss's
   * consequences never land on the re-formed mesh (trial finding A7). */
  bool gone_busy;
  char refused[320]; /* the last refusal of an Attach for this rank */
} srv_mesh_peer;

struct srv_mesh {
  srv *s;
  int rank, world, per_rank;
  double lease_s, join_timeout_s, coll_timeout_s;
  char coordinator[SRV_ADDR_MAX]; /* host:port */
  char coord_host[SRV_ADDR_MAX];  /* its host */
  char transport_host[256];
  uint8_t secret[512];
  size_t secret_len;
  bool has_secret;
  char version[64]; /* what a rank reports (PARADEV_TEST_MESH_VERSION) */

  pthread_mutex_t mu;
  pthread_cond_t cv; /* formation, stop, the timer's work */
  srv_mesh_peer peer[SRV_MESH_MAX_RANKS];
  uint64_t epoch;      /* the last MeshFormed's */
  uint64_t own_ready;  /* the coordinator's own transport's epoch */
  bool forming, formed, degraded, ever_formed;
  bool build_pending; /* the timer thread builds the coordinator's transport */
  uint64_t form_top;  /* the ranks' highest last_seq at this formation */
  char reason[512];   /* why not whole ("" when formed) */
  atomic_bool stopping;
  bool interrupted; /* srv_mesh_interrupt (mu) */
  pthread_t timer;
  bool timer_started;
  /* Sessions killed, losses, formations (metrics). */
  atomic_uint_fast64_t sessions_killed, losses, formations;
  atomic_bool a_formed, a_degraded;
  _Atomic uint64_t a_epoch;

  /* The send paths (mesh_state.c calls them): the coordinator's queues
   * (mesh_ctl.c) and a rank's link (mesh_link.c, while it runs). */
  bool (*send_down)(srv_mesh *m, int rank, const uint8_t *packed, size_t len);
  bool (*_Atomic send_up)(srv_mesh *m, const uint8_t *packed, size_t len);
  dev_mesh_config cfg;
  void *data; /* the data plane's */
  srv_mesh_kv *kv;     /* the coordinator's store */
  srv_mesh_link *link; /* a rank's link */
  dev_mesh_kv kv_iface;      /* what the transports rendezvous through */
  /* A rank: the last coordinator's incarnation and the join's failure. */
  char join_error[768];
  bool join_fatal; /* refused for a mismatch it cannot fix */
};

double srv_mesh_now(void);
/* Copies formed / degraded / epoch to the lock-free readers (mu held). */
void srv_mesh_publish(srv_mesh *m);
/* Builds the transport of `epoch` and hands it to the engine (NULL and a
 * warning when it cannot be built); true when built. No lock held. */
bool srv_mesh_build_transport(srv_mesh *m, uint64_t epoch, char *err,
                              size_t errlen);
/* The shared secret's check, in constant time (true without one): a
 * hello's bytes, or a KvSet / KvGet call's SRV_MESH_SECRET_MD metadata. */
#define SRV_MESH_SECRET_MD "paradev-mesh-secret-bin"

/* The most bytes of commands in one CoordinatorMessage (mesh_ctl.c): well
 * under the 64 MiB gRPC message limit ranks receive with. */
#define SRV_MESH_BATCH_BYTES (16u << 20)
bool srv_mesh_secret_ok(const srv_mesh *m, const uint8_t *got, size_t len);
bool srv_mesh_call_secret_ok(const srv_mesh *m, const grpc_metadata_array *md);
/* localhost, 127.x, ::1. */
bool srv_mesh_is_loopback(const char *host);
/* Reads [mesh] secret_file (1 .. 512 bytes, trailing newlines not part of
 * it) into m->secret; 0, or -1 after logging why. */
int srv_mesh_read_secret(srv_mesh *m, const char *path);
/* Drops the engine's transport (loss, a coordinator gone). */
void srv_mesh_drop_transport(srv_mesh *m);

/* mesh_kv.c: the coordinator's store. */
srv_mesh_kv *srv_mesh_kv_new(srv *s);
void srv_mesh_kv_free(srv_mesh_kv *kv);
/* Fails the KvGet calls whose wait is over (the timer thread). */
void srv_mesh_kv_tick(srv_mesh_kv *kv, double now);
/* Ends every waiting KvGet (stop). */
void srv_mesh_kv_close(srv_mesh_kv *kv);
/* The coordinator's own dev_mesh_kv functions (arg = the store). */
pd_code srv_mesh_kv_local_set(void *arg, const char *key, const void *value,
                              size_t len, dev_status *st);
pd_code srv_mesh_kv_local_get(void *arg, const char *key, double timeout_s,
                              void **value, size_t *len, dev_status *st);

/* mesh_link.c: a rank's link to the coordinator. */
int srv_mesh_link_start(srv_mesh *m);
void srv_mesh_link_stop(srv_mesh *m);
/* The rank's dev_mesh_kv functions over the link (arg = the mesh). */
pd_code srv_mesh_link_kv_set(void *arg, const char *key, const void *value,
                             size_t len, dev_status *st);
pd_code srv_mesh_link_kv_get(void *arg, const char *key, double timeout_s,
                             void **value, size_t *len, dev_status *st);

/* One Attach stream's state (srv_call.user; mesh_ctl.c, mesh_run.c). */
typedef struct srv_attach {
  srv_mesh *m;
  int rank; /* -1 until its hello was accepted */
  uint64_t gen; /* its attach's (srv_mesh_peer.gen) */
  /* The timer counted the rank as lost: end the stream (m->mu). */
  bool end;
  char end_msg[512];
} srv_attach;

/* --- mesh_ctl.c's helpers that mesh_run.c (the timer, start, stop) uses */

/* Wakes a peer's Attach stream to send what is queued for it (m->mu held). */
void srv_peer_wake(srv_mesh_peer *p);
/* Frees a peer's queued commands (m->mu held). */
void srv_peer_clear(srv_mesh_peer *p);
/* Writes "1, 3" (the ranks not attached) into buf; returns their count
 * (m->mu held). */
int srv_missing(srv_mesh *m, char *buf, size_t len);
/* Ends the forming of the current epoch once every transport is built
 * (m->mu held). */
void srv_mesh_maybe_formed(srv_mesh *m);
/* Rank `rank`'s stream `c` (attach generation `gen`) is gone: `why`. Only
 * the rank's current stream counts (mesh_ctl.c says what follows). */
void srv_mesh_rank_gone(srv_mesh *m, int rank, srv_call *c, uint64_t gen,
                        const char *why);

#endif /* PARADEV_SERVER_MESH_INT_H */
