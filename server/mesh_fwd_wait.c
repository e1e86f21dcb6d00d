/* The coordinator's side of the ranks' answers (issue #16, mesh_data.h):
 * per-device progress and failures from MeshProgress, remote_wait on them,
 * component_read through MeshRead / MeshReadResult, and a rank's loss and
 * return. The hooks that send are mesh_fwd.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mesh_data.h"

/* A send the control plane refused: the rank is gone, so every op up to
 * `seq` on its devices fails (the rank's `why`, or a plain one). */
void srv_mfwd_refused(fwd *f, int rank, uint64_t seq) {
  pthread_mutex_lock(&f->mu);
  fwd_rank *r = &f->rank[rank];
  if (seq > r->fail_upto) r->fail_upto = seq;
  if (!r->why[0])
    snprintf(r->why, sizeof r->why, "the mesh lost rank %d: it is not attached",
             rank);
  pthread_mutex_unlock(&f->mu);
}

/* The error of a rank that is lost or refused a command. */
pd_code srv_mfwd_rank_error(fwd *f, int rank, dev_status *st) {
  pthread_mutex_lock(&f->mu);
  char why[FWD_WHY_MAX];
  snprintf(why, sizeof why, "%s", f->rank[rank].why);
  pthread_mutex_unlock(&f->mu);
  if (why[0]) return dev_error(st, PD_UNAVAILABLE, "%s", why);
  return dev_error(st, PD_UNAVAILABLE,
                   "the mesh lost rank %d: it is not attached", rank);
}

/* --- reads ---------------------------------------------------------------- */

static void fwd_reads_unlink(fwd *f, fwd_read *rq, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (fwd_read **p = &f->reads; *p; p = &(*p)->next)
      if (*p == &rq[i]) {
        *p = rq[i].next;
        break;
      }
}

pd_code srv_mfwd_component_read(void *arg, const dev_tensor *t, int component,
                                uint64_t offset, void *data, size_t len,
                                dev_status *st) {
  fwd *f = fwd_of(arg);
  const dev_devset *set = dev_tensor_devset(t);
  if (!f || component < 0 || component >= set->n)
    return dev_error(st, PD_INTERNAL,
                     "mesh: a read of component %d of a tensor of %d",
                     component, set->n);
  if (!len) return PD_OK;
  int rank = srv_mesh_device_rank(f->m, set->dev[component]);
  size_t n = (len + FWD_CHUNK - 1) / FWD_CHUNK;
  fwd_read local[FWD_READS_INLINE], *rq = local;
  if (n > FWD_READS_INLINE && !(rq = calloc(n, sizeof *rq)))
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "mesh: out of memory reading %zu bytes", len);
  memset(rq, 0, sizeof(*rq) * n);
  pthread_mutex_lock(&f->mu);
  if (f->rank[rank].lost) {
    pthread_mutex_unlock(&f->mu);
    if (rq != local) free(rq);
    return srv_mfwd_rank_error(f, rank, st);
  }
  uint64_t losses = f->rank[rank].losses;
  for (size_t i = 0; i < n; i++) {
    rq[i].request = ++f->next_request;
    rq[i].dst = (uint8_t *)data + i * FWD_CHUNK;
    rq[i].len = i + 1 < n ? FWD_CHUNK : len - i * FWD_CHUNK;
    rq[i].next = f->reads;
    f->reads = &rq[i];
  }
  pthread_mutex_unlock(&f->mu);

  bool sent = true;
  for (size_t i = 0; i < n && sent; i++) {
    Paradev__V1__MeshRead r;
    paradev__v1__mesh_read__init(&r);
    r.request = rq[i].request;
    r.id = dev_tensor_id(t);
    r.component = (uint32_t)component;
    r.offset = offset + i * FWD_CHUNK;
    r.length = rq[i].len;
    Paradev__V1__MeshCommand cmd;
    paradev__v1__mesh_command__init(&cmd);
    cmd.kind_case = PARADEV__V1__MESH_COMMAND__KIND_READ;
    cmd.read = &r;
    uint8_t buf[128];
    size_t pl = paradev__v1__mesh_command__pack(&cmd, buf);
    sent = srv_mesh_send_command(f->m, rank, buf, pl);
  }

  pthread_mutex_lock(&f->mu);
  pd_code rc = PD_OK;
  for (;;) {
    size_t done = 0, busy = 0;
    for (size_t i = 0; i < n; i++) {
      done += rq[i].done;
      busy += rq[i].busy;
    }
    /* Lost, even if it attached again since: its answers will not come. */
    bool gone = !sent || f->rank[rank].lost || f->rank[rank].losses != losses;
    if (done == n || (gone && !busy)) break;
    pthread_cond_wait(&f->read_cv, &f->mu);
  }
  fwd_reads_unlink(f, rq, n);
  size_t bad = n;
  for (size_t i = 0; i < n; i++)
    if (!rq[i].done || rq[i].code != PD_OK) {
      bad = i;
      break;
    }
  pthread_mutex_unlock(&f->mu);
  if (bad < n) {
    if (!rq[bad].done)
      rc = srv_mfwd_rank_error(f, rank, st);
    else
      rc = dev_error(st, rq[bad].code, "rank %d: %s", rank, rq[bad].msg);
  }
  if (rq != local) free(rq);
  return rc;
}

/* --- remote_wait ------------------------------------------------------------- */

pd_code srv_mfwd_remote_wait(void *arg, int device, uint64_t seq,
                             dev_status *st) {
  fwd *f = fwd_of(arg);
  if (!f || device < 0 || device >= f->ndev)
    return dev_error(st, PD_INTERNAL, "mesh: a wait on device %d of %d", device,
                     f ? f->ndev : 0);
  int rank = srv_mesh_device_rank(f->m, device);
  fwd_dev *d = &f->dev[device];
  pthread_mutex_lock(&f->mu);
  for (;;) {
    fwd_rank *r = &f->rank[rank];
    if (r->lost || seq <= r->fail_upto) {
      pd_code rc = dev_error(st, PD_UNAVAILABLE, "%s",
                             r->why[0] ? r->why : "the mesh lost the rank");
      pthread_mutex_unlock(&f->mu);
      return rc;
    }
    size_t k = 0; /* records below seq were never this executor's */
    while (k < d->nfails && d->fails[k].seq < seq) free(d->fails[k++].msg);
    if (k) {
      memmove(d->fails, d->fails + k, sizeof(*d->fails) * (d->nfails - k));
      d->nfails -= k;
    }
    if (d->nfails && d->fails[0].seq == seq) {
      fwd_fail fl = d->fails[0];
      memmove(d->fails, d->fails + 1, sizeof(*d->fails) * --d->nfails);
      pthread_mutex_unlock(&f->mu);
      /* The rank's engine names the mesh's device and the rank ("mesh
       * device 4 (rank 2): ..."); a message that does not is prefixed. */
      const char *msg = fl.msg ? fl.msg : "failed";
      char who[32];
      snprintf(who, sizeof who, "rank %d", rank);
      pd_code rc =
          strstr(msg, who)
              ? dev_error(st, fl.code, "%s", msg)
              : dev_error(st, fl.code, "%s (device %d): %s", who, device, msg);
      free(fl.msg);
      return rc;
    }
    if (d->done_seq >= seq) {
      pthread_mutex_unlock(&f->mu);
      return PD_OK;
    }
    d->waiting = true;
    pthread_cond_wait(&d->cv, &f->mu);
  }
}

/* --- from the ranks ----------------------------------------------------------- */

static void fwd_progress(fwd *f, int rank, const Paradev__V1__MeshProgress *p) {
  int dv = (int)p->device;
  if (dv < 0 || dv >= f->ndev || srv_mesh_device_rank(f->m, dv) != rank) {
    SRV_WARN("mesh: rank %d reported progress of device %u, not its own", rank,
             p->device);
    return;
  }
  fwd_dev *d = &f->dev[dv];
  for (size_t i = 0; i < p->n_failures; i++) {
    const Paradev__V1__MeshFailure *fl = p->failures[i];
    if (fl->seq <= d->done_seq ||
        (d->nfails && fl->seq <= d->fails[d->nfails - 1].seq))
      continue; /* old or out of order: already settled */
    if (d->nfails == d->capfails) {
      size_t c = d->capfails ? d->capfails * 2 : 8;
      fwd_fail *nf = realloc(d->fails, sizeof(*nf) * c);
      if (!nf) continue;
      d->fails = nf;
      d->capfails = c;
    }
    pd_code code = fl->code > 0 ? (pd_code)fl->code : PD_INTERNAL;
    d->fails[d->nfails++] =
        (fwd_fail){fl->seq, code, strdup(fl->message ? fl->message : "")};
  }
  if (p->done_seq > d->done_seq) d->done_seq = p->done_seq;
  if (d->waiting) {
    d->waiting = false;
    pthread_cond_broadcast(&d->cv);
  }
}

static void fwd_read_result(fwd *f, int rank,
                            const Paradev__V1__MeshReadResult *res) {
  fwd_read *rq = f->reads;
  while (rq && rq->request != res->request) rq = rq->next;
  if (!rq || rq->done) return; /* given up on (the rank was lost) */
  if (res->code != PD_OK) {
    rq->code = (pd_code)res->code;
    snprintf(rq->msg, sizeof rq->msg, "%s", res->message ? res->message : "");
  } else if (res->data.len != rq->len) {
    rq->code = PD_DATA_LOSS;
    snprintf(rq->msg, sizeof rq->msg,
             "a read answered %zu bytes; %zu were asked", res->data.len,
             rq->len);
  } else {
    /* Copy without the lock: the waiter stays until busy is cleared. */
    rq->busy = true;
    pthread_mutex_unlock(&f->mu);
    memcpy(rq->dst, res->data.data, rq->len);
    pthread_mutex_lock(&f->mu);
    rq->busy = false;
    rq->code = PD_OK;
  }
  (void)rank;
  rq->done = true;
  pthread_cond_broadcast(&f->read_cv);
}

void srv_mesh_fwd_on_message(srv_mesh *m, int rank,
                             const Paradev__V1__RankMessage *msg) {
  fwd *f = srv_mesh_data(m);
  if (!f || rank <= 0 || rank >= f->world) return;
  pthread_mutex_lock(&f->mu);
  for (size_t i = 0; i < msg->n_progress; i++)
    fwd_progress(f, rank, msg->progress[i]);
  for (size_t i = 0; i < msg->n_read_results; i++)
    fwd_read_result(f, rank, msg->read_results[i]);
  pthread_mutex_unlock(&f->mu);
}

void srv_mesh_fwd_rank_attached(srv_mesh *m, int rank, uint64_t inc,
                                uint64_t last_seq) {
  fwd *f = srv_mesh_data(m);
  if (!f || rank <= 0 || rank >= f->world) return;
  pthread_mutex_lock(&f->mu);
  f->rank[rank].lost = false;
  f->rank[rank].inc = inc;
  for (int i = 0; i < f->per_rank; i++) {
    fwd_dev *d = &f->dev[rank * f->per_rank + i];
    for (size_t k = 0; k < d->nfails; k++) free(d->fails[k].msg);
    d->nfails = 0;
    d->done_seq = last_seq;
  }
  pthread_mutex_unlock(&f->mu);
}

void srv_mesh_fwd_rank_lost(srv_mesh *m, int rank, const char *why) {
  fwd *f = srv_mesh_data(m);
  if (!f || rank <= 0 || rank >= f->world) return;
  pthread_mutex_lock(&f->mu);
  fwd_rank *r = &f->rank[rank];
  r->lost = true;
  r->losses++;
  uint64_t last = atomic_load(&f->last_seq);
  if (last > r->fail_upto) r->fail_upto = last;
  if (why && why[0])
    snprintf(r->why, sizeof r->why, "%s", why);
  else
    snprintf(r->why, sizeof r->why, "the mesh lost rank %d", rank);
  for (int i = 0; i < f->per_rank; i++) {
    fwd_dev *d = &f->dev[rank * f->per_rank + i];
    d->waiting = false;
    pthread_cond_broadcast(&d->cv);
  }
  pthread_cond_broadcast(&f->read_cv);
  pthread_mutex_unlock(&f->mu);
}
