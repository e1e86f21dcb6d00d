/* A rank's progress and reads (issue #16, mesh_data.h): local_done and the
 * failures of refused ops (deferred until the device finished what came
 * before them) gathered per device and sent by a sender thread as
 * MeshProgress; MeshReads answered by a worker thread. The commands are
 * mesh_apply.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mesh_data.h"

#define AP_SEND_GAP_NS 60000u /* the sender's gap when busy */
/* A read waits at most this long for its tensor (the coordinator reads only
 * what this rank has finished, so it never should). */
#define AP_READ_WAIT_S 60.0

/* --- progress --------------------------------------------------------------- */

static bool ap_fails_push(ap_fails *f, uint64_t seq, uint64_t after,
                          pd_code code, const char *msg) {
  if (f->n == f->cap) {
    size_t c = f->cap ? f->cap * 2 : 4;
    ap_fail *nv = realloc(f->v, sizeof(*nv) * c);
    if (!nv) return false;
    f->v = nv;
    f->cap = c;
  }
  f->v[f->n++] = (ap_fail){seq, after, code, strdup(msg ? msg : "")};
  return true;
}

void srv_mapp_fails_clear(ap_fails *f) {
  for (size_t i = 0; i < f->n; i++) free(f->v[i].msg);
  f->n = 0;
}

/* Under pmu: device `d` moved; wake the sender if it sleeps. */
static void ap_touch(apply *a, ap_dev *d) {
  d->dirty = true;
  if (a->idle) pthread_cond_signal(&a->pcv);
}

/* Under pmu: the deferred failures of `d` whose `after` has finished. */
static void ap_release_deferred(ap_dev *d) {
  size_t k = 0;
  while (k < d->deferred.n && d->deferred.v[k].after <= d->engine_done) {
    ap_fail *f = &d->deferred.v[k];
    ap_fails_push(&d->out, f->seq, 0, f->code, f->msg);
    if (f->seq > d->report) d->report = f->seq;
    free(f->msg);
    k++;
  }
  if (k) {
    memmove(d->deferred.v, d->deferred.v + k,
            sizeof(*d->deferred.v) * (d->deferred.n - k));
    d->deferred.n -= k;
  }
}

_Thread_local bool srv_mapp_in_submit;

void srv_mapp_local_done(void *arg, int device, uint64_t seq, pd_code code,
                         const char *msg) {
  apply *a = srv_mesh_data((srv_mesh *)arg);
  if (!a || device < a->first || device >= a->first + a->count) return;
  /* Called from inside dev_op_submit_seq on the apply thread: the engine
   * refusing the op (a pending input) reports it at once, possibly ahead of
   * earlier ops still running on the device, which done_seq must not pass.
   * The refusal is reported by srv_mapp_defer, in order. */
  if (srv_mapp_in_submit) return;
  ap_dev *d = &a->dev[device - a->first];
  pthread_mutex_lock(&a->pmu);
  if (seq > d->engine_done) d->engine_done = seq;
  if (code != PD_OK) ap_fails_push(&d->out, seq, 0, code, msg);
  if (seq > d->report) d->report = seq;
  ap_release_deferred(d);
  ap_touch(a, d);
  pthread_mutex_unlock(&a->pmu);
}

/* Op `seq`, which never reached the engine, failed with `st` on each local
 * device of `set`: reported once the device finished what came before it
 * (see the header comment). */
void srv_mapp_defer(apply *a, const dev_devset *set, uint64_t seq,
                    const dev_status *st) {
  pthread_mutex_lock(&a->pmu);
  for (int i = 0; set && i < set->n; i++) {
    int dv = set->dev[i];
    if (dv < a->first || dv >= a->first + a->count) continue;
    ap_dev *d = &a->dev[dv - a->first];
    ap_fails_push(&d->deferred, seq, d->last_sub, st->code, st->msg);
    ap_release_deferred(d);
    ap_touch(a, d);
  }
  pthread_mutex_unlock(&a->pmu);
}

/* One RankMessage with every device that moved; sent outside pmu. */
static void ap_send_progress(apply *a) {
  Paradev__V1__MeshProgress prog[PD_MAX_DEVICES], *pp[PD_MAX_DEVICES];
  ap_fails taken[PD_MAX_DEVICES];
  size_t np = 0;
  for (int i = 0; i < a->count && i < PD_MAX_DEVICES; i++) {
    ap_dev *d = &a->dev[i];
    if (!d->dirty) continue;
    d->dirty = false;
    paradev__v1__mesh_progress__init(&prog[np]);
    prog[np].device = (uint32_t)(a->first + i);
    prog[np].done_seq = d->report;
    taken[np] = d->out;
    d->out = (ap_fails){0};
    pp[np] = &prog[np];
    np++;
  }
  if (!np) return;
  pthread_mutex_unlock(&a->pmu);
  size_t nf = 0;
  for (size_t i = 0; i < np; i++) nf += taken[i].n;
  Paradev__V1__MeshFailure *fl = nf ? calloc(nf, sizeof *fl) : NULL;
  Paradev__V1__MeshFailure **flp = nf ? calloc(nf, sizeof *flp) : NULL;
  size_t k = 0;
  for (size_t i = 0; i < np && fl && flp; i++) {
    if (!taken[i].n) continue;
    prog[i].failures = flp + k;
    for (size_t j = 0; j < taken[i].n; j++, k++) {
      paradev__v1__mesh_failure__init(&fl[k]);
      fl[k].seq = taken[i].v[j].seq;
      fl[k].code = (int32_t)taken[i].v[j].code;
      fl[k].message = taken[i].v[j].msg;
      flp[k] = &fl[k];
    }
    prog[i].n_failures = taken[i].n;
  }
  if (nf && (!fl || !flp))
    SRV_ERROR("mesh: out of memory reporting %zu failures", nf);
  Paradev__V1__RankMessage msg;
  paradev__v1__rank_message__init(&msg);
  msg.n_progress = np;
  msg.progress = pp;
  size_t len = paradev__v1__rank_message__get_packed_size(&msg);
  uint8_t local[1024], *buf = len <= sizeof local ? local : malloc(len);
  if (buf) {
    paradev__v1__rank_message__pack(&msg, buf);
    srv_mesh_send_to_coordinator(a->m, buf, len);
    if (buf != local) free(buf);
  }
  for (size_t i = 0; i < np; i++) {
    srv_mapp_fails_clear(&taken[i]);
    free(taken[i].v);
  }
  free(fl);
  free(flp);
  pthread_mutex_lock(&a->pmu);
}

static bool ap_any_dirty(const apply *a) {
  for (int i = 0; i < a->count; i++)
    if (a->dev[i].dirty) return true;
  return false;
}

void *srv_mapp_sender_main(void *arg) {
  apply *a = arg;
  pthread_mutex_lock(&a->pmu);
  while (!a->stop) {
    if (!ap_any_dirty(a)) {
      a->idle = true;
      pthread_cond_wait(&a->pcv, &a->pmu);
      a->idle = false;
      continue;
    }
    uint64_t now = ap_now_ns();
    if (now - a->last_send_ns < AP_SEND_GAP_NS) {
      /* Busy: let more progress gather. */
      uint64_t left = AP_SEND_GAP_NS - (now - a->last_send_ns);
      pthread_mutex_unlock(&a->pmu);
      struct timespec ts = {0, (long)left};
      nanosleep(&ts, NULL);
      pthread_mutex_lock(&a->pmu);
    }
    a->last_send_ns = ap_now_ns();
    ap_send_progress(a);
  }
  pthread_mutex_unlock(&a->pmu);
  return NULL;
}

/* --- reads ------------------------------------------------------------------- */

static void ap_answer(apply *a, ap_read *r) {
  dev_status st = DEV_STATUS_INIT;
  uint8_t *buf = NULL;
  if (r->t) {
    dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, r->component};
    if (!(buf = malloc(r->length ? r->length : 1)))
      dev_error(&st, PD_RESOURCE_EXHAUSTED,
                "rank %d: out of memory reading %llu bytes",
                srv_mesh_rank(a->m), (unsigned long long)r->length);
    else if (dev_tensor_wait_until(r->t, dev_monotonic_now() + AP_READ_WAIT_S,
                                   &st) == PD_OK)
      dev_tensor_read(r->t, &lay, r->component, r->offset, buf,
                      (size_t)r->length, &st);
    /* Before the answer: once the coordinator has it, it may release the
     * tensor and end, and this rank's engine may stop. */
    dev_tensor_release(r->t);
    r->t = NULL;
  } else {
    dev_error(&st, r->code, "%s", r->msg);
  }
  Paradev__V1__MeshReadResult res;
  paradev__v1__mesh_read_result__init(&res);
  res.request = r->request;
  res.code = (int32_t)st.code;
  res.message = st.msg;
  if (st.code == PD_OK) {
    res.data.data = buf;
    res.data.len = (size_t)r->length;
  }
  Paradev__V1__MeshReadResult *rp = &res;
  Paradev__V1__RankMessage msg;
  paradev__v1__rank_message__init(&msg);
  msg.n_read_results = 1;
  msg.read_results = &rp;
  size_t len = paradev__v1__rank_message__get_packed_size(&msg);
  uint8_t *out = malloc(len ? len : 1);
  if (out) {
    paradev__v1__rank_message__pack(&msg, out);
    pthread_mutex_lock(&a->rmu);
    bool current = r->gen == a->gen;
    pthread_mutex_unlock(&a->rmu);
    if (current) srv_mesh_send_to_coordinator(a->m, out, len);
  } else {
    SRV_ERROR("mesh: out of memory answering read %llu",
              (unsigned long long)r->request);
  }
  free(out);
  free(buf);
}

void *srv_mapp_reader_main(void *arg) {
  apply *a = arg;
  pthread_mutex_lock(&a->rmu);
  while (!a->rstop) {
    ap_read *r = a->rhead;
    if (!r) {
      pthread_cond_wait(&a->rcv, &a->rmu);
      continue;
    }
    if (!(a->rhead = r->next)) a->rtail = NULL;
    a->reading = true;
    pthread_mutex_unlock(&a->rmu);
    ap_answer(a, r);
    free(r);
    pthread_mutex_lock(&a->rmu);
    a->reading = false;
    pthread_cond_broadcast(&a->rcv);
  }
  pthread_mutex_unlock(&a->rmu);
  return NULL;
}
