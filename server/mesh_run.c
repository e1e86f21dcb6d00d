/* The mesh's control plane over time (issue #16; mesh.h, mesh_int.h): the
 * coordinator's timer (heartbeats, silence, its own transport, the store's
 * deadlines), and start, stop and destroy on every rank. The Attach streams
 * and the mesh state from the options are mesh_ctl.c's; a rank's link
 * mesh_link.c. */
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

/* --- the coordinator's timer: heartbeats, silence, its transport, the
 * store's deadlines -------------------------------------------------------- */

static void *srv_mesh_timer_main(void *arg) {
  srv_mesh *m = arg;
  const double hb = m->lease_s / 4;
  const double stall = hb > 0.25 ? hb : 0.25;
  double tick_at = 0; /* the last pass's start (0: work in between) */
  pthread_mutex_lock(&m->mu);
  while (!atomic_load(&m->stopping)) {
    double now = srv_mesh_now();
    if (m->build_pending) {
      tick_at = 0; /* this thread's own work: the others ran meanwhile */
      m->build_pending = false;
      uint64_t e = m->epoch, top = m->form_top;
      pthread_mutex_unlock(&m->mu);
      /* Outside mu: the engine's submit lock is taken before mu (the
       * hooks queue commands under it). */
      dev_engine_advance_seq(m->s->engine, top);
      char err[256];
      srv_mesh_build_transport(m, e, err, sizeof err);
      pthread_mutex_lock(&m->mu);
      if (m->epoch == e && m->forming) {
        m->own_ready = e;
        srv_mesh_maybe_formed(m);
      } else if (!m->formed) {
        /* A rank was lost while it was built: it must not stay the
         * engine's (only this thread builds, and the mesh forms only after
         * it did: no newer epoch's transport is undone here). */
        pthread_mutex_unlock(&m->mu);
        srv_mesh_drop_transport(m);
        SRV_INFO("mesh: epoch %" PRIu64 ": the mesh changed while its "
                 "collective transport was built: dropped",
                 e);
        pthread_mutex_lock(&m->mu);
      }
      continue;
    }
    /* The timer did not run for longer than a heartbeat's period: this
     * daemon was stopped (SIGSTOP) or starved, and the streams' threads no
     * more than it: the ranks' silence over that gap is the coordinator's,
     * so their silence clocks restart (trial findings A5, A6). */
    if (tick_at > 0 && now - tick_at > stall) {
      SRV_WARN("mesh: the coordinator's timer did not run for %.1f s (the "
               "daemon was stopped or starved): the ranks' silence clocks "
               "restart",
               now - tick_at);
      for (int r = 1; r < m->world; r++)
        if (m->peer[r].attached) m->peer[r].last_seen = now;
    }
    tick_at = now;
    int lost = 0;
    uint64_t lost_gen = 0;
    srv_call *lost_call = NULL;
    for (int r = 1; r < m->world && !lost; r++) {
      srv_mesh_peer *p = &m->peer[r];
      if (!p->attached) continue;
      if (now - p->last_seen > m->lease_s) {
        lost = r;
        lost_gen = p->gen;
        lost_call = p->call;
        srv_call_ref(lost_call);
        srv_attach *a = lost_call->user;
        a->end = true;
        snprintf(a->end_msg, sizeof a->end_msg,
                 "the coordinator heard nothing from rank %d for %.0f s "
                 "([mesh] lease_s): counted as lost",
                 r, m->lease_s);
        srv_call_wake(lost_call); /* ends it (srv_attach_wake) */
      } else if (now - p->last_sent >= hb) {
        p->send_hb = true;
        srv_peer_wake(p);
      }
    }
    if (lost) {
      tick_at = 0;
      pthread_mutex_unlock(&m->mu);
      char why[128];
      snprintf(why, sizeof why, "silent for more than the %.0f s lease",
               m->lease_s);
      srv_mesh_rank_gone(m, lost, lost_call, lost_gen, why);
      srv_call_unref(lost_call);
      pthread_mutex_lock(&m->mu);
      continue;
    }
    pthread_mutex_unlock(&m->mu);
    srv_mesh_kv_tick(m->kv, now);
    pthread_mutex_lock(&m->mu);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    if (!m->build_pending && !atomic_load(&m->stopping))
      pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  }
  pthread_mutex_unlock(&m->mu);
  return NULL;
}

/* --- start and stop -------------------------------------------------------- */

static void srv_mesh_abs(struct timespec *ts, double at_mono) {
  ts->tv_sec = (time_t)at_mono;
  ts->tv_nsec = (long)((at_mono - (double)ts->tv_sec) * 1e9);
}

int srv_mesh_start(srv *s) {
  srv_mesh *m = s->mesh;
  if (!m) return 0;
  int first = 0, count = 0;
  dev_engine_local_devices(s->engine, &first, &count);
  if (count > 0) m->per_rank = count;
  /* READY=1 comes from main.c once this returns: only once formed. */
  sd_notifyf(0, "STATUS=joining the mesh: rank %d of %d, coordinator %s (up "
             "to %.0f s)", m->rank, m->world, m->coordinator,
             m->join_timeout_s);
  if (m->rank != 0) return srv_mesh_link_start(m);
  if (pthread_create(&m->timer, NULL, srv_mesh_timer_main, m) != 0) {
    SRV_ERROR("mesh: cannot start the coordinator's timer thread");
    return -1;
  }
  m->timer_started = true;
  SRV_INFO("mesh: waiting up to %.0f s for ranks 1 to %d to attach on the "
           "mesh port %s",
           m->join_timeout_s, m->world - 1, m->coordinator);
  double deadline = srv_mesh_now() + m->join_timeout_s;
  struct timespec ts;
  srv_mesh_abs(&ts, deadline);
  pthread_mutex_lock(&m->mu);
  while (!m->formed && !atomic_load(&m->stopping) && !m->interrupted &&
         srv_mesh_now() < deadline)
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  bool formed = m->formed, interrupted = m->interrupted;
  char miss[256];
  int n = srv_missing(m, miss, sizeof miss);
  /* The missing ranks the coordinator refused: why, last (a wrong secret,
   * version... is not fixed by --world-size). */
  char refused[1024] = "";
  size_t at = 0;
  int n_refused = 0;
  for (int r = 1; r < m->world; r++)
    if (!m->peer[r].attached && m->peer[r].refused[0]) {
      int k = snprintf(refused + at, at < sizeof refused ? sizeof refused - at
                                                         : 0,
                       "; rank %d was refused: %s", r, m->peer[r].refused);
      if (k > 0) at += (size_t)k;
      n_refused++;
    }
  pthread_mutex_unlock(&m->mu);
  if (formed) return 0;
  if (interrupted)
    SRV_ERROR("mesh: stopped (a signal) while waiting for rank%s %s to "
              "attach",
              n > 1 ? "s" : "", miss);
  else if (n && n_refused == n)
    SRV_ERROR("mesh: rank%s %s did not attach within [mesh] join_timeout_s "
              "(%.0f s): giving up%s",
              n > 1 ? "s" : "", miss, m->join_timeout_s, refused);
  else if (n)
    SRV_ERROR("mesh: rank%s %s did not attach within [mesh] join_timeout_s "
              "(%.0f s): giving up (start them with --world-size %d "
              "--coordinator %s and their --rank)%s",
              n > 1 ? "s" : "", miss, m->join_timeout_s, m->world,
              m->coordinator, refused);
  else
    SRV_ERROR("mesh: every rank attached but the mesh did not form within "
              "[mesh] join_timeout_s (%.0f s): the collective transports "
              "were not built in time (see the ranks' logs)",
              m->join_timeout_s);
  return -1;
}

void srv_mesh_stop(srv *s) {
  srv_mesh *m = s->mesh;
  if (!m) return;
  atomic_store(&m->stopping, true);
  if (m->rank != 0) {
    srv_mesh_link_stop(m); /* no more commands come */
    /* The engine needs every tensor released before it stops (mesh.h). */
    srv_mesh_apply_drop_all(m, "the rank's daemon is stopping");
    return;
  }
  pthread_mutex_lock(&m->mu);
  for (int r = 1; r < m->world; r++) {
    srv_mesh_peer *p = &m->peer[r];
    if (!p->attached) continue;
    p->end = true;
    snprintf(p->end_msg, sizeof p->end_msg,
             "the coordinator is stopping: drop its tensors and attach again "
             "when it is back");
    srv_peer_wake(p);
  }
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  if (m->timer_started) {
    pthread_join(m->timer, NULL);
    m->timer_started = false;
  }
  srv_mesh_kv_close(m->kv);
}

void srv_mesh_destroy(srv *s) {
  srv_mesh *m = s->mesh;
  if (!m) return;
  if (m->rank == 0)
    srv_mesh_fwd_destroy(m);
  else
    srv_mesh_apply_destroy(m);
  for (int r = 0; r < m->world; r++) {
    srv_peer_clear(&m->peer[r]);
    if (m->peer[r].call) srv_call_unref(m->peer[r].call);
  }
  if (m->kv) srv_mesh_kv_free(m->kv);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m);
  s->mesh = NULL;
}

