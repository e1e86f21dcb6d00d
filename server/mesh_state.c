/* The mesh's state that every part reads (issue #16; mesh.h, mesh_int.h):
 * the accessors, the lock-free flags health, metrics and the methods read,
 * the checks the methods ask (refusals at ranks, of graph functions, of
 * sessions on a broken mesh), the snapshot for GetServerInfo and /metrics,
 * the collective transport of an epoch, and the two send paths, which go
 * to the coordinator's queues (mesh_ctl.c) or the rank's link
 * (mesh_link.c) through the functions those set in srv_mesh (so that
 * calls go one way: the data plane and the methods call here, never into
 * mesh_ctl.c or mesh_link.c). Calls nothing else of server/ but log.c. */
#include <errno.h>
#include <grpc/grpc.h>
#include <openssl/crypto.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SRV_LOG_SUB SRV_SUB_CORE
#include "log.h"
#include "mesh_int.h"
#include "secfile.h"

double srv_mesh_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void srv_mesh_publish(srv_mesh *m) {
  atomic_store(&m->a_formed, m->formed);
  atomic_store(&m->a_degraded, m->degraded);
  atomic_store(&m->a_epoch, m->epoch);
}

srv *srv_mesh_server(srv_mesh *m) { return m->s; }
void *srv_mesh_data(srv_mesh *m) { return m->data; }
void srv_mesh_set_data(srv_mesh *m, void *data) { m->data = data; }
int srv_mesh_rank(const srv_mesh *m) { return m->rank; }
int srv_mesh_world_size(const srv_mesh *m) { return m->world; }
int srv_mesh_devices_per_rank(const srv_mesh *m) { return m->per_rank; }
int srv_mesh_device_rank(const srv_mesh *m, int device) {
  return m->per_rank > 0 ? device / m->per_rank : 0;
}
bool srv_mesh_formed(const srv_mesh *m) { return atomic_load(&m->a_formed); }
bool srv_mesh_degraded(const srv_mesh *m) {
  return atomic_load(&m->a_degraded);
}

bool srv_mesh_send_command(srv_mesh *m, int rank, const uint8_t *packed,
                           size_t len) {
  return m->send_down && m->send_down(m, rank, packed, len);
}

bool srv_mesh_send_to_coordinator(srv_mesh *m, const uint8_t *packed,
                                  size_t len) {
  bool (*up)(srv_mesh *, const uint8_t *, size_t) = atomic_load(&m->send_up);
  return up && up(m, packed, len);
}

/* --- transports ------------------------------------------------------------ */

bool srv_mesh_build_transport(srv_mesh *m, uint64_t epoch, char *err,
                              size_t errlen) {
  char prefix[48];
  snprintf(prefix, sizeof prefix, "epoch/%" PRIu64 "/", epoch);
  dev_mesh_transport *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_gloo_transport_create(&m->kv_iface, prefix, m->transport_host,
                                m->coll_timeout_s, &t, &st) != PD_OK) {
    snprintf(err, errlen, "%s", st.msg);
    SRV_WARN("mesh: epoch %" PRIu64
             ": no collective transport on this rank (%s): collectives "
             "across ranks fail with UNAVAILABLE",
             epoch, st.msg);
    dev_engine_mesh_set_transport(m->s->engine, NULL);
    return false;
  }
  dev_engine_mesh_set_transport(m->s->engine, t); /* takes a reference */
  t->release(t);
  SRV_INFO("mesh: epoch %" PRIu64 ": collective transport built (%s, %s)",
           epoch, m->transport_host, prefix);
  return true;
}

void srv_mesh_drop_transport(srv_mesh *m) {
  if (m->s->engine) dev_engine_mesh_set_transport(m->s->engine, NULL);
}

/* --- what the methods ask ---------------------------------------------------- */

pd_code srv_mesh_check_client(const srv_mesh *m, const char *path,
                              dev_status *st) {
  static const char pd[] = "/paradev.v1.ParallelDevice/";
  if (!m || m->rank == 0 || strncmp(path, pd, sizeof pd - 1) != 0 ||
      strcmp(path + sizeof pd - 1, "GetServerInfo") == 0)
    return PD_OK;
  return dev_error(st, PD_FAILED_PRECONDITION,
                   "this daemon is rank %d of a mesh of %d; clients connect "
                   "to the coordinator (rank 0) on %s",
                   m->rank, m->world, m->coord_host);
}

pd_code srv_mesh_check_functions(const srv_mesh *m, dev_status *st) {
  if (!m) return PD_OK;
  return dev_error(st, PD_UNIMPLEMENTED,
                   "graph functions are not available on a mesh across "
                   "machines yet; run the ops eagerly");
}

pd_code srv_mesh_check_whole(srv_mesh *m, dev_status *st) {
  if (!m || m->rank != 0) return PD_OK;
  pthread_mutex_lock(&m->mu);
  bool whole = m->formed && !m->degraded;
  char reason[512];
  snprintf(reason, sizeof reason, "%s", m->reason);
  pthread_mutex_unlock(&m->mu);
  if (whole) return PD_OK;
  return dev_error(st, PD_UNAVAILABLE,
                   "the mesh is not whole (%s); open a session once every "
                   "rank has attached again",
                   reason);
}

void srv_mesh_info(srv_mesh *m, srv_mesh_view *v) {
  memset(v, 0, sizeof *v);
  double now = srv_mesh_now();
  pthread_mutex_lock(&m->mu);
  v->world = m->world;
  v->rank = m->rank;
  v->per_rank = m->per_rank;
  v->formed = m->formed;
  v->degraded = m->degraded;
  v->epoch = m->epoch;
  snprintf(v->reason, sizeof v->reason, "%s", m->reason);
  snprintf(v->coordinator, sizeof v->coordinator, "%s", m->coordinator);
  for (int r = 0; r < m->world; r++) {
    srv_mesh_peer_view *p = &v->ranks[r];
    if (m->rank != 0) break;
    p->attached = r == 0 || m->peer[r].attached;
    snprintf(p->host, sizeof p->host, "%s",
             r == 0 ? m->transport_host : m->peer[r].host);
    p->incarnation = r == 0 ? m->s->incarnation : m->peer[r].incarnation;
    p->last_seen_s =
        r == 0 || !m->peer[r].ever ? 0 : now - m->peer[r].last_seen;
    if (r > 0 && !m->peer[r].attached) v->missing[v->n_missing++] = r;
  }
  v->sessions_killed = atomic_load(&m->sessions_killed);
  v->losses = atomic_load(&m->losses);
  v->formations = atomic_load(&m->formations);
  pthread_mutex_unlock(&m->mu);
}

/* --- the options' parts read at start --------------------------------------- */

bool srv_mesh_is_loopback(const char *host) {
  return strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 ||
         strcmp(host, "::1") == 0 || strcmp(host, "[::1]") == 0;
}

int srv_mesh_read_secret(srv_mesh *m, const char *path) {
  /* A secret: a regular file, opened without blocking, that no other user
   * could have written (whoever may write it may attach as a rank). */
  srv_file_rules rules = {"[mesh] secret_file", true, false,
                          "another user could attach daemons to the mesh"};
  int fd = -1;
  struct stat sb;
  dev_status st = DEV_STATUS_INIT;
  if (srv_file_open(path, &rules, &fd, &sb, &st) != PD_OK) {
    SRV_ERROR("mesh: %s", st.msg);
    return -1;
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    SRV_ERROR("mesh: cannot read [mesh] secret_file %s: %s", path,
              strerror(errno));
    return -1;
  }
  size_t n = fread(m->secret, 1, sizeof m->secret, f);
  bool more = fgetc(f) != EOF;
  fclose(f);
  while (n && (m->secret[n - 1] == '\n' || m->secret[n - 1] == '\r')) n--;
  if (more || n == 0) {
    SRV_ERROR("mesh: [mesh] secret_file %s: expected 1 to %zu bytes, %s",
              path, sizeof m->secret, n == 0 ? "it is empty" : "it is longer");
    return -1;
  }
  m->secret_len = n;
  m->has_secret = true;
  return 0;
}


bool srv_mesh_secret_ok(const srv_mesh *m, const uint8_t *got, size_t len) {
  if (!m->has_secret) return true;
  uint8_t pad[sizeof m->secret] = {0}, want[sizeof m->secret] = {0};
  size_t n = len < sizeof pad ? len : sizeof pad;
  if (n) memcpy(pad, got, n);
  memcpy(want, m->secret, m->secret_len);
  return (CRYPTO_memcmp(pad, want, sizeof pad) == 0) & (len == m->secret_len);
}

bool srv_mesh_call_secret_ok(const srv_mesh *m, const grpc_metadata_array *md) {
  if (!m->has_secret) return true;
  for (size_t i = 0; i < md->count; i++) {
    const grpc_metadata *e = &md->metadata[i];
    if (GRPC_SLICE_LENGTH(e->key) == strlen(SRV_MESH_SECRET_MD) &&
        memcmp(GRPC_SLICE_START_PTR(e->key), SRV_MESH_SECRET_MD,
               strlen(SRV_MESH_SECRET_MD)) == 0)
      return srv_mesh_secret_ok(m, GRPC_SLICE_START_PTR(e->value),
                                GRPC_SLICE_LENGTH(e->value));
  }
  return false;
}

void srv_mesh_interrupt(srv_mesh *m) {
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  m->interrupted = true;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}
