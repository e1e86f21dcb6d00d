/* The mesh's control plane on every rank (issue #16; mesh.h, mesh_int.h):
 * the mesh state from the options, the engine's mesh configuration, start
 * and stop; and on the coordinator (rank 0) the Attach streams of the other
 * ranks (paradev.v1.Mesh/Attach, served on the mesh port by rpc.c with the
 * call machinery of call.c): RankHello checks, welcome, formation (epoch,
 * MeshFormed, transports), per-rank command queues written on each
 * stream's own thread, heartbeats and silence, loss (the data plane told,
 * sessions killed, health NOT_SERVING) and re-formation. A rank's side is
 * mesh_link.c; the key-value store mesh_kv.c.
 *
 * Source: JAX's coordination service (one coordinator, heartbeats, a
 * barrier at start), torch.distributed's TCPStore on rank 0. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#define SRV_LOG_SUB SRV_SUB_CORE
#include "log.h"
#include "mesh_int.h"


static bool srv_ctl_send_command(srv_mesh *m, int rank,
                                 const uint8_t *packed, size_t len);

/* --- the state ------------------------------------------------------------ */

int srv_mesh_create(srv *s) {
  const srv_options *o = &s->opt;
  s->mesh = NULL;
  if (o->mesh_world_size <= 1) return 0;
  srv_mesh *m = calloc(1, sizeof *m);
  if (!m) {
    SRV_ERROR("mesh: out of memory");
    return -1;
  }
  m->s = s;
  m->rank = o->mesh_rank;
  m->world = o->mesh_world_size;
  m->per_rank = o->num_devices;
  m->lease_s = o->mesh_lease_s;
  m->join_timeout_s = o->mesh_join_timeout_s;
  m->coll_timeout_s = o->mesh_collective_timeout_s;
  snprintf(m->coordinator, sizeof m->coordinator, "%s", o->mesh_coordinator);
  const char *colon = strrchr(m->coordinator, ':');
  snprintf(m->coord_host, sizeof m->coord_host, "%.*s",
           (int)(colon ? colon - m->coordinator : 0), m->coordinator);
  if (o->mesh_transport_host[0])
    snprintf(m->transport_host, sizeof m->transport_host, "%s",
             o->mesh_transport_host);
  else if (srv_mesh_is_loopback(m->coord_host))
    snprintf(m->transport_host, sizeof m->transport_host, "127.0.0.1");
  else if (gethostname(m->transport_host, sizeof m->transport_host - 1) != 0)
    snprintf(m->transport_host, sizeof m->transport_host, "localhost");
  /* Test-only (tests/integration/test_mesh_control.py): the version a rank
   * reports in its RankHello, to provoke the coordinator's refusal. */
  const char *tv = getenv("PARADEV_TEST_MESH_VERSION");
  snprintf(m->version, sizeof m->version, "%s", tv && *tv ? tv : SRV_VERSION);
  if (tv && *tv)
    SRV_WARN("mesh: test hook PARADEV_TEST_MESH_VERSION: this rank reports "
             "version %s (for tests only)",
             m->version);
  pthread_mutex_init(&m->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cv, &ca);
  pthread_condattr_destroy(&ca);
  snprintf(m->reason, sizeof m->reason, "not formed: waiting for %d ranks",
           m->world - 1);
  if (o->mesh_secret_file[0] &&
      srv_mesh_read_secret(m, o->mesh_secret_file) != 0)
    goto fail;
  if (m->rank == 0) {
    if (!(m->kv = srv_mesh_kv_new(s))) goto fail;
    m->kv_iface = (dev_mesh_kv){m->kv, srv_mesh_kv_local_set,
                                srv_mesh_kv_local_get};
  } else {
    m->kv_iface = (dev_mesh_kv){m, srv_mesh_link_kv_set, srv_mesh_link_kv_get};
  }
  m->send_down = srv_ctl_send_command;
  s->mesh = m;
  if ((m->rank == 0 ? srv_mesh_fwd_create(m) : srv_mesh_apply_create(m)) != 0)
    goto fail;
  char about[1024];
  srv_config_describe_mesh(o, about, sizeof about);
  SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO, "mesh: %s", about);
  SRV_INFO("mesh: this daemon is rank %d of %d (%s); collective transport "
           "host %s",
           m->rank, m->world,
           m->rank == 0 ? "the coordinator, serving the mesh port"
                        : "clients connect to the coordinator",
           m->transport_host);
  return 0;
fail:
  s->mesh = NULL;
  if (m->kv) srv_mesh_kv_free(m->kv);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m);
  return -1;
}

void srv_mesh_engine_config(srv_mesh *m, dev_engine_config *ec) {
  m->cfg = (dev_mesh_config)DEV_MESH_CONFIG_INITIALIZER;
  m->cfg.rank = m->rank;
  m->cfg.world_size = m->world;
  if (m->rank == 0)
    srv_mesh_fwd_hooks(m, &m->cfg);
  else
    srv_mesh_apply_hooks(m, &m->cfg);
  ec->mesh_config = &m->cfg;
}



/* --- the coordinator: queues and wake-ups ------------------------------- */

/* Wakes rank r's stream to write what is pending (mu held). */
void srv_peer_wake(srv_mesh_peer *p) {
  if (!p->attached || !p->call || p->wake_pending) return;
  p->wake_pending = true;
  srv_call_wake(p->call);
}

void srv_peer_clear(srv_mesh_peer *p) {
  for (size_t i = 0; i < p->n_cmds; i++) free(p->cmds[i].data);
  free(p->cmds);
  p->cmds = NULL;
  p->n_cmds = p->cap_cmds = 0;
}

static bool srv_ctl_send_command(srv_mesh *m, int rank,
                                 const uint8_t *packed, size_t len) {
  if (rank <= 0 || rank >= m->world) return false;
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return false;
  memcpy(copy, packed, len);
  pthread_mutex_lock(&m->mu);
  srv_mesh_peer *p = &m->peer[rank];
  bool ok = p->attached && !p->end;
  if (ok && p->n_cmds == p->cap_cmds) {
    size_t ncap = p->cap_cmds ? p->cap_cmds * 2 : 64;
    ProtobufCBinaryData *n = realloc(p->cmds, ncap * sizeof *n);
    if (n) {
      p->cmds = n;
      p->cap_cmds = ncap;
    } else {
      ok = false;
    }
  }
  if (ok) {
    p->cmds[p->n_cmds++] = (ProtobufCBinaryData){len, copy};
    srv_peer_wake(p);
  }
  pthread_mutex_unlock(&m->mu);
  if (!ok) free(copy);
  return ok;
}

/* --- formation and loss -------------------------------------------------- */

int srv_missing(srv_mesh *m, char *buf, size_t len) {
  int n = 0;
  size_t at = 0;
  buf[0] = '\0';
  for (int r = 1; r < m->world; r++)
    if (!m->peer[r].attached) {
      int k = snprintf(buf + at, at < len ? len - at : 0, "%s%d", n ? ", " : "",
                       r);
      if (k > 0) at += (size_t)k;
      n++;
    }
  return n;
}


/* Every rank attached: a new epoch (mu held). The coordinator's own
 * transport is built by the timer thread (it may wait on the store). */
static void srv_mesh_maybe_form(srv_mesh *m) {
  if (m->forming || m->formed || atomic_load(&m->stopping)) return;
  char miss[256];
  if (srv_missing(m, miss, sizeof miss) > 0) return;
  uint64_t top = 0;
  for (int r = 1; r < m->world; r++)
    if (m->peer[r].last_seq > top) top = m->peer[r].last_seq;
  m->form_top = top; /* the timer advances the engine's seq (no lock) */
  m->epoch++;
  m->forming = true;
  m->build_pending = true;
  snprintf(m->reason, sizeof m->reason,
           "forming epoch %" PRIu64 ": building the collective transports",
           m->epoch);
  for (int r = 1; r < m->world; r++) {
    m->peer[r].send_formed = true;
    srv_peer_wake(&m->peer[r]);
  }
  SRV_INFO("mesh: all %d ranks attached: forming epoch %" PRIu64
           " (seq continues above %" PRIu64 ")",
           m->world, m->epoch, top);
  pthread_cond_broadcast(&m->cv);
}

/* Every rank answered for the epoch (mu held). */
void srv_mesh_maybe_formed(srv_mesh *m) {
  if (!m->forming || m->own_ready != m->epoch) return;
  for (int r = 1; r < m->world; r++)
    if (m->peer[r].ready_epoch != m->epoch) return;
  m->forming = false;
  m->formed = true;
  bool again = m->degraded;
  m->degraded = false;
  m->ever_formed = true;
  m->reason[0] = '\0';
  atomic_fetch_add(&m->formations, 1);
  for (int r = 1; r < m->world; r++) {
    m->peer[r].send_state = true;
    srv_peer_wake(&m->peer[r]);
  }
  srv_mesh_publish(m);
  SRV_NOTICE("mesh: %s: epoch %" PRIu64 ", %d ranks of %d devices%s",
             again ? "re-formed, the mesh is whole again" : "formed",
             m->epoch, m->world, m->per_rank,
             again ? " (open new sessions)" : "");
  pthread_cond_broadcast(&m->cv);
}

/* Ends every open session: their tensors had components on the lost rank;
 * their queued ops, and later calls with their tokens, fail with
 * UNAVAILABLE and `why` (the loss). Returns how many. No mesh lock held. */
static int srv_mesh_kill_sessions(srv_mesh *m, const char *why) {
  if (!m->s->sched) return 0;
  sched_session_view *v = NULL;
  int n = sched_list_sessions(m->s->sched, NULL, &v), killed = 0;
  for (int i = 0; i < n; i++) {
    sched_kill_target t = {NULL, 0, NULL, v[i].seq};
    sched_kill_result r;
    dev_status st = DEV_STATUS_INIT;
    if (sched_kill_because(m->s->sched, &t, PD_UNAVAILABLE, why, &r, &st) ==
        PD_OK)
      killed += r.sessions;
  }
  free(v);
  atomic_fetch_add(&m->sessions_killed, (uint64_t)killed);
  return killed;
}

/* Rank `rank`'s stream `c` of attach `gen` is gone (`why`): detaches it
 * once (a stream that is not the rank's current one changes nothing). The
 * consequences (the data plane, sessions, the transport) are applied with
 * p->gone_busy set, which holds the rank's next attach, and with it any
 * re-formation, until they are done. Any thread, no lock held. */
void srv_mesh_rank_gone(srv_mesh *m, int rank, srv_call *c,
                               uint64_t gen, const char *why) {
  pthread_mutex_lock(&m->mu);
  srv_mesh_peer *p = &m->peer[rank];
  if (!p->attached || p->call != c || p->gen != gen) {
    pthread_mutex_unlock(&m->mu);
    return;
  }
  p->attached = false;
  p->call = NULL;
  srv_peer_clear(p);
  p->send_formed = p->send_state = p->send_hb = p->wake_pending = false;
  if (atomic_load(&m->stopping)) { /* the coordinator's own shutdown */
    pthread_mutex_unlock(&m->mu);
    srv_call_unref(c);
    return;
  }
  bool was = m->formed || m->forming || m->ever_formed;
  p->gone_busy = true;
  m->formed = m->forming = false;
  m->build_pending = false;
  if (was) m->degraded = true;
  char host[256];
  snprintf(host, sizeof host, "%s", p->host);
  char msg[512];
  snprintf(msg, sizeof msg,
           "the mesh lost rank %d (%s): %s; its components are gone; open a "
           "new session once the mesh is whole",
           rank, host, why);
  char miss[256];
  srv_missing(m, miss, sizeof miss);
  snprintf(m->reason, sizeof m->reason, "%s rank%s %s missing (rank %d: %s)",
           was ? "degraded:" : "not formed:", strchr(miss, ',') ? "s" : "",
           miss, rank, why);
  for (int r = 1; r < m->world; r++)
    if (m->peer[r].attached) {
      m->peer[r].send_state = true;
      srv_peer_wake(&m->peer[r]);
    }
  srv_mesh_publish(m);
  pthread_mutex_unlock(&m->mu);

  atomic_fetch_add(&m->losses, 1);
  srv_mesh_fwd_rank_lost(m, rank, msg);
  int killed = was ? srv_mesh_kill_sessions(m, msg) : 0;
  if (was) srv_mesh_drop_transport(m);
  if (was)
    SRV_ERROR("mesh: rank %d (%s) lost: %s; mesh degraded; %d session%s "
              "killed",
              rank, host, why, killed, killed == 1 ? "" : "s");
  else
    SRV_WARN("mesh: rank %d (%s) detached before the mesh formed: %s", rank,
             host, why);
  srv_health_update(m->s);
  pthread_mutex_lock(&m->mu);
  p->gone_busy = false; /* the rank may attach again */
  pthread_mutex_unlock(&m->mu);
  srv_call_unref(c);
}

/* --- the coordinator: the Attach stream ------------------------------------ */

/* Refuses an Attach; `rank` (the hello's, when in range) remembers why,
 * for the join timeout's message. */
static void srv_attach_refuse(srv_mesh *m, uint32_t rank, srv_call *c,
                              const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void srv_attach_refuse(srv_mesh *m, uint32_t rank, srv_call *c,
                              const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (m && rank > 0 && (int)rank < m->world) {
    pthread_mutex_lock(&m->mu);
    snprintf(m->peer[rank].refused, sizeof m->peer[rank].refused, "%.300s",
             msg);
    pthread_mutex_unlock(&m->mu);
  }
  SRV_WARN("mesh: refused an Attach: %s", msg);
  srv_call_finish(c, PD_FAILED_PRECONDITION, "%s", msg);
}


static void srv_attach_hello(srv_call *c, srv_attach *a,
                             const Paradev__V1__RankHello *h) {
  srv_mesh *m = a->m;
  const char *backend = dev_engine_backend_name(m->s->engine);
  char host[SRV_LOG_QUOTED(128)];
  srv_log_quote(h->host ? h->host : "", host, sizeof host);
  if (!srv_mesh_secret_ok(m, h->secret.data, h->secret.len)) {
    if (h->secret.len == 0)
      srv_attach_refuse(m, h->rank, c,
                        "rank %u (%s) sent no shared secret; this coordinator "
                        "requires one (set [mesh] secret_file on every rank, "
                        "holding the same bytes)",
                        h->rank, host);
    else
      srv_attach_refuse(m, h->rank, c,
                        "rank %u (%s): the mesh's shared secret does not match "
                        "([mesh] secret_file must hold the same bytes on every "
                        "rank)",
                        h->rank, host);
    return;
  }
  if (!m->has_secret && h->secret.len > 0)
    SRV_WARN("mesh: rank %u (%s) offered a shared secret, but this "
             "coordinator has no [mesh] secret_file and does not check it: "
             "any host that reaches the mesh port may attach (set the same "
             "secret_file here)",
             h->rank, host);
  if ((int)h->world_size != m->world) {
    srv_attach_refuse(m, h->rank, c,
                      "rank %u (%s) has world size %u; this mesh has %d "
                      "ranks (set the same --world-size on every rank)",
                      h->rank, host, h->world_size, m->world);
    return;
  }
  if (h->rank == 0 || (int)h->rank >= m->world) {
    srv_attach_refuse(m, h->rank, c,
                      "rank %u (%s) is out of range: the other ranks of a "
                      "mesh of %d are 1 to %d (rank 0 is the coordinator)",
                      h->rank, host, m->world, m->world - 1);
    return;
  }
  if (strcmp(h->version ? h->version : "", SRV_VERSION) != 0) {
    srv_attach_refuse(m, h->rank, c,
                      "rank %u (%s) runs paradevd %s; the coordinator runs %s "
                      "(every rank must run the same version)",
                      h->rank, host, h->version ? h->version : "", SRV_VERSION);
    return;
  }
  if (strcmp(h->backend ? h->backend : "", backend) != 0) {
    srv_attach_refuse(m, h->rank, c,
                      "rank %u (%s) has backend %s; the coordinator has %s "
                      "(every rank must have the same backend)",
                      h->rank, host, h->backend ? h->backend : "", backend);
    return;
  }
  if ((int)h->num_devices != m->per_rank) {
    srv_attach_refuse(m, h->rank, c,
                      "rank %u (%s) has %u devices; every rank of this mesh "
                      "has %d (the coordinator's)",
                      h->rank, host, h->num_devices, m->per_rank);
    return;
  }
  pthread_mutex_lock(&m->mu);
  srv_mesh_peer *p = &m->peer[h->rank];
  if (p->attached && p->call && p->incarnation == h->incarnation) {
    /* The same daemon attaches again: it gave its old stream up (it heard
     * nothing for a lease: this coordinator was stopped, or the network
     * stalled) before that stream's end reached here. The old stream is
     * lost now, its consequences applied, then this one attaches. */
    srv_call *old = p->call;
    uint64_t old_gen = p->gen;
    srv_call_ref(old);
    srv_attach *oa = old->user;
    if (oa) {
      oa->end = true;
      snprintf(oa->end_msg, sizeof oa->end_msg,
               "this stream was superseded by a new Attach of rank %u", h->rank);
    }
    srv_call_wake(old); /* ends it (srv_attach_wake) */
    pthread_mutex_unlock(&m->mu);
    srv_mesh_rank_gone(m, (int)h->rank, old, old_gen,
                       "it attached again, giving its old stream up");
    srv_call_unref(old);
    pthread_mutex_lock(&m->mu);
  }
  if (p->attached) {
    char other[256];
    snprintf(other, sizeof other, "%s", p->host);
    uint64_t inc = p->incarnation;
    pthread_mutex_unlock(&m->mu);
    srv_attach_refuse(m, h->rank, c,
                      "rank %u (%s) is already attached (incarnation "
                      "%016" PRIx64 " from %s): two daemons were given the "
                      "same rank",
                      h->rank, host, inc, other);
    return;
  }
  if (atomic_load(&m->stopping)) {
    pthread_mutex_unlock(&m->mu);
    srv_call_finish(c, PD_UNAVAILABLE, "the coordinator is stopping");
    return;
  }
  if (p->gone_busy) { /* its last stream's loss is still being applied */
    pthread_mutex_unlock(&m->mu);
    SRV_INFO("mesh: rank %u (%s) attaches again while the loss of its "
             "previous stream is still being applied: asked to retry",
             h->rank, host);
    srv_call_finish(c, PD_UNAVAILABLE,
                    "the coordinator is still applying the loss of this "
                    "rank's previous stream; attach again");
    return;
  }
  bool again = p->ever;
  p->attached = p->ever = true;
  p->gen++;
  p->refused[0] = '\0';
  a->gen = p->gen;
  srv_call_ref(c);
  p->call = c;
  p->incarnation = h->incarnation;
  p->last_seq = h->last_seq;
  snprintf(p->host, sizeof p->host, "%s", h->host ? h->host : "");
  p->last_seen = p->last_sent = srv_mesh_now();
  p->ready_epoch = 0;
  p->end = false;
  a->rank = (int)h->rank;
  /* Its devices' names and memory as it reported them (B6, B7): the
   * coordinator's info, quotas' shares and placement names use them. */
  for (int i = 0; i < m->per_rank; i++)
    dev_engine_mesh_set_remote_device(
        m->s->engine, (int)h->rank * m->per_rank + i,
        i < (int)h->n_device_names ? h->device_names[i] : NULL,
        i < (int)h->n_device_memory_limits ? h->device_memory_limits[i] : 0,
        i < (int)h->n_device_memory_totals ? h->device_memory_totals[i] : 0);
  char miss[256];
  int n_miss = srv_missing(m, miss, sizeof miss);
  if (!m->formed && !m->forming && n_miss)
    snprintf(m->reason, sizeof m->reason, "%s: rank%s %s missing",
             m->degraded ? "degraded" : "not formed", n_miss > 1 ? "s" : "",
             miss);
  pthread_mutex_unlock(&m->mu);
  /* A default quota that is a share of the mesh's memory was worked out
   * before the ranks attached: again, with this rank's real limits. */
  atomic_store(&m->s->rt.default_memory_quota,
               srv_default_quota(&m->s->opt, m->s->engine));

  Paradev__V1__CoordinatorMessage out = PARADEV__V1__COORDINATOR_MESSAGE__INIT;
  Paradev__V1__MeshWelcome w = PARADEV__V1__MESH_WELCOME__INIT;
  w.coordinator_incarnation = m->s->incarnation;
  w.world_size = (uint32_t)m->world;
  w.devices_per_rank = (uint32_t)m->per_rank;
  out.welcome = &w;
  srv_call_write(c, &out.base);
  srv_mesh_fwd_rank_attached(m, (int)h->rank, h->incarnation, h->last_seq);
  SRV_INFO("mesh: rank %u (%s) %sattached: incarnation %016" PRIx64
           ", last seq %" PRIu64 "; %d rank%s still missing%s%s",
           h->rank, host, again ? "re-" : "", h->incarnation, h->last_seq,
           n_miss, n_miss == 1 ? "" : "s", n_miss ? ": " : "", miss);
  pthread_mutex_lock(&m->mu);
  srv_mesh_maybe_form(m);
  pthread_mutex_unlock(&m->mu);
}

static void srv_attach_message(srv_call *c, const ProtobufCMessage *msg) {
  srv_attach *a = c->user;
  if (!a) {
    if (!(a = calloc(1, sizeof *a))) {
      srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
      return;
    }
    a->m = c->s->mesh;
    a->rank = -1;
    c->user = a;
  }
  srv_mesh *m = a->m;
  if (!msg) {
    if (a->rank > 0)
      srv_mesh_rank_gone(m, a->rank, c, a->gen, "its stream ended (the rank stopped, or its connection closed)");
    srv_call_finish(c, PD_OK, "%s", "the stream ended");
    return;
  }
  const Paradev__V1__RankMessage *rm = (const void *)msg;
  if (a->rank < 0) {
    if (!rm->hello) {
      srv_attach_refuse(NULL, 0, c, "the first message of an Attach stream must be a "
                           "RankHello");
      return;
    }
    srv_attach_hello(c, a, rm->hello);
    return;
  }
  pthread_mutex_lock(&m->mu);
  srv_mesh_peer *p = &m->peer[a->rank];
  bool mine = p->attached && p->call == c && p->gen == a->gen;
  if (mine) p->last_seen = srv_mesh_now();
  if (mine && (rm->transport_ready || rm->transport_error)) {
    uint64_t e = rm->transport_ready;
    if (!e) e = m->epoch; /* an error answers the current epoch */
    /* A stale epoch's answer never stands for a newer one's; an epoch the
     * coordinator has not formed is no answer at all. */
    if (e < p->ready_epoch || e > m->epoch) e = p->ready_epoch;
    if (rm->transport_error)
      SRV_WARN("mesh: rank %d could not build its collective transport for "
               "epoch %" PRIu64 ": %s",
               a->rank, e,
               rm->transport_error->message ? rm->transport_error->message
                                            : "");
    p->ready_epoch = e;
    srv_mesh_maybe_formed(m);
  }
  pthread_mutex_unlock(&m->mu);
  if (rm->n_progress || rm->n_read_results)
    srv_mesh_fwd_on_message(m, a->rank, rm);
}

/* Writes what is pending for the rank: MeshFormed, MeshState, commands,
 * a heartbeat; or ends the stream. On the stream's thread. */
static void srv_attach_wake(srv_call *c) {
  srv_attach *a = c->user;
  if (!a || a->rank <= 0) return;
  srv_mesh *m = a->m;
  Paradev__V1__CoordinatorMessage out = PARADEV__V1__COORDINATOR_MESSAGE__INIT;
  Paradev__V1__MeshFormed f = PARADEV__V1__MESH_FORMED__INIT;
  Paradev__V1__MeshState st = PARADEV__V1__MESH_STATE__INIT;
  uint32_t ranks[SRV_MESH_MAX_RANKS], missing[SRV_MESH_MAX_RANKS];
  char *hosts[SRV_MESH_MAX_RANKS];
  char hostbuf[SRV_MESH_MAX_RANKS][256];
  char reason[512];
  ProtobufCBinaryData *cmds = NULL;
  size_t n_cmds = 0;
  bool any = false;
  char end_msg[512] = "";
  pthread_mutex_lock(&m->mu);
  srv_mesh_peer *p = &m->peer[a->rank];
  bool mine = p->call == c && p->gen == a->gen;
  if (a->end) { /* lost to the timer, which detaches it (rank_gone) */
    snprintf(end_msg, sizeof end_msg, "%s", a->end_msg);
    a->end = false;
    pthread_mutex_unlock(&m->mu);
    srv_call_finish(c, PD_UNAVAILABLE, "%s", end_msg);
    return;
  }
  if (mine && p->end) { /* the coordinator stops: detached here, quietly */
    snprintf(end_msg, sizeof end_msg, "%s", p->end_msg);
    p->attached = false;
    p->call = NULL;
    srv_peer_clear(p);
    p->end = p->wake_pending = false;
    pthread_mutex_unlock(&m->mu);
    srv_call_finish(c, PD_UNAVAILABLE, "%s", end_msg);
    srv_call_unref(c); /* the peer's; the wake-up holds its own */
    return;
  }
  if (!mine) {
    pthread_mutex_unlock(&m->mu);
    return;
  }
  p->wake_pending = false;
  if (p->send_formed) {
    f.epoch = m->epoch;
    for (int r = 0; r < m->world; r++) {
      ranks[r] = (uint32_t)r;
      snprintf(hostbuf[r], sizeof hostbuf[r], "%s",
               r == 0 ? m->transport_host : m->peer[r].host);
      hosts[r] = hostbuf[r];
    }
    f.n_ranks = f.n_hosts = (size_t)m->world;
    f.ranks = ranks;
    f.hosts = hosts;
    out.formed = &f;
    any = true;
  }
  if (p->send_state) {
    st.degraded = m->degraded;
    for (int r = 1; r < m->world; r++)
      if (!m->peer[r].attached) missing[st.n_missing_ranks++] = (uint32_t)r;
    st.missing_ranks = missing;
    snprintf(reason, sizeof reason, "%s", m->reason);
    st.reason = reason;
    out.state = &st;
    any = true;
  }
  if (p->n_cmds) {
    cmds = p->cmds;
    n_cmds = p->n_cmds;
    p->cmds = NULL;
    p->n_cmds = p->cap_cmds = 0;
    out.commands = cmds;
    out.n_commands = n_cmds;
    any = true;
  }
  if (p->send_hb && !any) {
    out.heartbeat = true;
    any = true;
  }
  p->send_formed = p->send_state = p->send_hb = false;
  if (any) p->last_sent = srv_mesh_now();
  pthread_mutex_unlock(&m->mu);
  /* The commands queued since the last wake-up go out in messages of at
   * most SRV_MESH_BATCH_BYTES each (every command is at most a 4 MiB write
   * or read, mesh_fwd.c): uploads queue writes faster than a stream drains,
   * and one message of all of them passed gRPC's 64 MiB limit, which broke
   * the stream and lost a live rank (trial finding A4). srv_call_write packs
   * at once, so the commands are freed after. */
  size_t next = 0;
  while (any) {
    size_t bytes = 0, k = next;
    while (k < n_cmds && (k == next || bytes + cmds[k].len + 16 <=
                                           SRV_MESH_BATCH_BYTES)) {
      bytes += cmds[k].len + 16;
      k++;
    }
    out.commands = n_cmds ? cmds + next : NULL;
    out.n_commands = k - next;
    srv_call_write(c, &out.base);
    out.formed = NULL;
    out.state = NULL;
    out.heartbeat = false;
    next = k;
    if (next >= n_cmds) break;
  }
  for (size_t i = 0; i < n_cmds; i++) free(cmds[i].data);
  free(cmds);
}

static void srv_attach_cancel(srv_call *c) {
  srv_attach *a = c->user;
  if (a && a->rank > 0)
    srv_mesh_rank_gone(a->m, a->rank, c, a->gen,
                       "its stream broke (the connection closed: the rank "
                       "ended or its machine went away)");
}

static void srv_attach_destroy(srv_call *c) {
  free(c->user);
  c->user = NULL;
}

const srv_handlers srv_h_Attach = {
    .on_message = srv_attach_message,
    .on_wake = srv_attach_wake,
    .on_cancel = srv_attach_cancel,
    .on_destroy = srv_attach_destroy,
};

