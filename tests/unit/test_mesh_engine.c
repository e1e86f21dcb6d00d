/* A mesh across machines, the engine's side (issue #16, device/dev_mesh.h):
 * 2 and 3 engines in one process, 2 CPU devices each, wired directly.
 *
 * The wiring stands in for the daemon's data plane: the coordinator's
 * (rank 0's) hooks put commands (copies of what they describe) on a queue
 * per rank, which a replay thread per rank applies to that rank's engine
 * in order (dev_op_prepare_on + dev_op_submit_seq, dev_tensor_create_on /
 * _pending_on + dev_tensor_write(PER_COMPONENT), dev_tensor_read(COMPONENT)
 * answering component_read, dev_tensor_complete, dev_tensor_release); the
 * ranks' local_done fills a per-device progress table that the
 * coordinator's remote_wait waits on (bounded). A fake transport (threads
 * of every engine meeting in shared memory, per group) carries the
 * cross-rank collectives.
 *
 * Every expected value is computed here by hand or in float64, never by
 * the engine; every wait is bounded. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "device_int.h" /* a component's code and message */
#include "dev_function.h"

#define MAXR 3
#define MAXID 4096
#define WAIT_S 20

static struct timespec deadline_in(int s) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += s;
  return ts;
}

/* --- the fake transport ------------------------------------------------------ */

typedef struct fgroup fgroup;
typedef struct fpart {
  fgroup *g;
  int index;
} fpart;

struct fgroup {
  dev_devset set;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned gen;
  void *ptr[PD_MAX_DEVICES];
  fpart parts[PD_MAX_DEVICES];
  fgroup *next;
};

typedef struct ftrans {
  dev_mesh_transport t;
  pthread_mutex_t mu;
  fgroup *groups;
  atomic_int refs;
  atomic_bool fail_data; /* all_reduce of more than one element fails */
} ftrans;

static ftrans *the_ftrans; /* the last one made (tests that break it) */

/* All n participants meet; false after WAIT_S seconds. */
static bool fbarrier(fgroup *g) {
  struct timespec dl = deadline_in(WAIT_S);
  pthread_mutex_lock(&g->mu);
  unsigned gen = g->gen;
  bool ok = true;
  if (++g->arrived == g->set.n) {
    g->arrived = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
  } else {
    while (gen == g->gen && ok)
      ok = pthread_cond_timedwait(&g->cv, &g->mu, &dl) == 0 || gen != g->gen;
  }
  pthread_mutex_unlock(&g->mu);
  return ok;
}

static pd_code f_timeout(dev_status *st) {
  return dev_error(st, PD_DEADLINE_EXCEEDED,
                   "fake transport: a peer did not come within %d s", WAIT_S);
}

static pd_code f_group_get(dev_mesh_transport *t, const dev_devset *set,
                           int index, void **group, dev_status *st) {
  ftrans *f = t->impl;
  pthread_mutex_lock(&f->mu);
  fgroup *g = f->groups;
  while (g && !dev_devset_equal(&g->set, set)) g = g->next;
  if (!g) {
    g = calloc(1, sizeof *g);
    g->set = *set;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int i = 0; i < set->n; i++) g->parts[i] = (fpart){g, i};
    g->next = f->groups;
    f->groups = g;
  }
  pthread_mutex_unlock(&f->mu);
  *group = &g->parts[index];
  (void)st;
  return PD_OK;
}

static double f_get(pd_dtype dt, const void *p, size_t i) {
  switch (dt) {
    case PD_FLOAT32: return ((const float *)p)[i];
    case PD_FLOAT64: return ((const double *)p)[i];
    case PD_INT32: return ((const int32_t *)p)[i];
    case PD_INT64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
  }
}

static void f_put(pd_dtype dt, void *p, size_t i, double v) {
  switch (dt) {
    case PD_FLOAT32: ((float *)p)[i] = (float)v; break;
    case PD_FLOAT64: ((double *)p)[i] = v; break;
    case PD_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case PD_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
  }
}

static pd_code f_all_reduce(dev_mesh_transport *t, void *group, void *buf,
                            size_t count, pd_dtype dt, int red,
                            dev_status *st) {
  fpart *p = group;
  fgroup *g = p->g;
  if (count > 1 && atomic_load(&((ftrans *)t->impl)->fail_data))
    return dev_error(st, PD_UNAVAILABLE,
                     "fake transport: rank 1 closed its connection");
  g->ptr[p->index] = buf;
  if (!fbarrier(g)) return f_timeout(st);
  double *acc = malloc((count ? count : 1) * sizeof *acc);
  for (size_t i = 0; i < count; i++) {
    double a = f_get(dt, g->ptr[0], i);
    for (int k = 1; k < g->set.n; k++) {
      double v = f_get(dt, g->ptr[k], i);
      a = red == DEV_RED_SUM    ? a + v
          : red == DEV_RED_PROD ? a * v
          : red == DEV_RED_MAX  ? (v > a ? v : a)
                                : (v < a ? v : a);
    }
    acc[i] = a;
  }
  bool ok = fbarrier(g); /* every participant has read every buffer */
  for (size_t i = 0; i < count; i++) f_put(dt, buf, i, acc[i]);
  free(acc);
  (void)t;
  return ok ? PD_OK : f_timeout(st);
}

static pd_code f_broadcast(dev_mesh_transport *t, void *group, void *buf,
                           size_t bytes, int root, dev_status *st) {
  fpart *p = group;
  fgroup *g = p->g;
  g->ptr[p->index] = buf;
  if (!fbarrier(g)) return f_timeout(st);
  if (p->index != root && bytes) memcpy(buf, g->ptr[root], bytes);
  (void)t;
  return fbarrier(g) ? PD_OK : f_timeout(st);
}

static pd_code f_all_gather(dev_mesh_transport *t, void *group, const void *in,
                            const size_t *in_bytes, void *out, dev_status *st) {
  fpart *p = group;
  fgroup *g = p->g;
  g->ptr[p->index] = (void *)in;
  if (!fbarrier(g)) return f_timeout(st);
  size_t off = 0;
  for (int k = 0; k < g->set.n; k++) {
    if (in_bytes[k]) memcpy((char *)out + off, g->ptr[k], in_bytes[k]);
    off += in_bytes[k];
  }
  (void)t;
  return fbarrier(g) ? PD_OK : f_timeout(st);
}

static void f_retain(dev_mesh_transport *t) {
  atomic_fetch_add(&((ftrans *)t->impl)->refs, 1);
}

static void f_release(dev_mesh_transport *t) {
  ftrans *f = t->impl;
  if (atomic_fetch_sub(&f->refs, 1) != 1) return;
  while (f->groups) {
    fgroup *g = f->groups;
    f->groups = g->next;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
  }
  pthread_mutex_destroy(&f->mu);
  free(f);
}

/* A transport with one reference (the caller's). */
static dev_mesh_transport *ftrans_new(void) {
  ftrans *f = calloc(1, sizeof *f);
  pthread_mutex_init(&f->mu, NULL);
  atomic_init(&f->refs, 1);
  f->t = (dev_mesh_transport){
      .struct_size = sizeof f->t,
      .impl = f,
      .group_get = f_group_get,
      .all_reduce = f_all_reduce,
      .broadcast = f_broadcast,
      .all_gather = f_all_gather,
      .retain = f_retain,
      .release = f_release,
  };
  the_ftrans = f;
  return &f->t;
}

/* --- the wiring: commands, replay threads, progress ---------------------------- */

typedef enum { C_CREATE, C_WRITE, C_COMPLETE, C_OP, C_READ, C_RELEASE } ckind;

typedef struct reply {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  pd_code code;
  char msg[DEV_STATUS_MSG_MAX];
} reply;

typedef struct cmd {
  ckind kind;
  struct cmd *next;
  uint64_t id; /* the coordinator's tensor id */
  /* create */
  pd_dtype dtype;
  dev_devset set;
  dev_shape shapes[PD_MAX_DEVICES];
  bool pending, not_mirrored;
  int shard_p1;
  /* write, read */
  int comp;
  uint64_t off;
  void *data;
  size_t len;
  reply *rep;
  /* complete */
  pd_code code;
  char msg[256];
  /* op (set above) */
  char name[64];
  uint64_t seq;
  int nin, nout, nattrs;
  uint64_t in_ids[DEV_MAX_INPUTS], out_ids[DEV_MAX_OUTPUTS];
  dev_attr attrs[DEV_MAX_ATTRS];
  void *arena[DEV_MAX_ATTRS];
} cmd;

typedef struct harness harness;
typedef struct rankq {
  harness *h;
  int rank;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  cmd *head, *tail;
  bool busy, stop;
  pthread_t th;
  dev_tensor *map[MAXID];
} rankq;

typedef struct prog {
  uint64_t seq;
  pd_code code;
  char msg[DEV_STATUS_MSG_MAX];
} prog;

struct harness {
  int W, n;
  dev_engine *e[MAXR];
  rankq q[MAXR];
  pthread_mutex_t pmu;
  pthread_cond_t pcv;
  prog *p[PD_MAX_DEVICES];
  int np[PD_MAX_DEVICES], cap[PD_MAX_DEVICES];
  bool lost[MAXR];
  atomic_int replay_errors;
  char replay_error[DEV_STATUS_MSG_MAX];
};

static void enqueue(harness *h, int r, cmd *c) {
  rankq *q = &h->q[r];
  c->next = NULL;
  pthread_mutex_lock(&q->mu);
  if (q->tail)
    q->tail->next = c;
  else
    q->head = c;
  q->tail = c;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

static cmd *cmd_new(ckind k, uint64_t id) {
  cmd *c = calloc(1, sizeof *c);
  c->kind = k;
  c->id = id;
  return c;
}

static void cmd_free(cmd *c) {
  free(c->data);
  for (int i = 0; i < c->nattrs; i++) free(c->arena[i]);
  free(c);
}

static void replay_failed(harness *h, const char *what, const char *msg) {
  if (atomic_fetch_add(&h->replay_errors, 1) == 0)
    snprintf(h->replay_error, sizeof h->replay_error, "%.100s: %.400s", what,
             msg);
}

static void progress(harness *h, int device, uint64_t seq, pd_code code,
                     const char *msg) {
  pthread_mutex_lock(&h->pmu);
  if (h->np[device] == h->cap[device]) {
    h->cap[device] = h->cap[device] ? 2 * h->cap[device] : 64;
    h->p[device] = realloc(h->p[device], sizeof(prog) * (size_t)h->cap[device]);
  }
  prog *p = &h->p[device][h->np[device]++];
  p->seq = seq;
  p->code = code;
  snprintf(p->msg, sizeof p->msg, "%s", msg ? msg : "");
  pthread_cond_broadcast(&h->pcv);
  pthread_mutex_unlock(&h->pmu);
}

/* The ranks' local_done. */
static void h_local_done(void *arg, int device, uint64_t seq, pd_code code,
                         const char *msg) {
  progress(arg, device, seq, code, msg);
}

/* The coordinator's remote_wait: the outcome of `seq` on `device`, once
 * reported; UNAVAILABLE at once when its rank is marked lost. */
static pd_code h_remote_wait(void *arg, int device, uint64_t seq,
                             dev_status *st) {
  harness *h = arg;
  const int r = device / h->n;
  struct timespec dl = deadline_in(WAIT_S);
  pd_code rc = PD_OK;
  pthread_mutex_lock(&h->pmu);
  for (;;) {
    if (h->lost[r]) {
      rc = dev_error(st, PD_UNAVAILABLE, "the mesh lost rank %d", r);
      break;
    }
    const prog *hit = NULL;
    for (int i = h->np[device] - 1; i >= 0 && !hit; i--)
      if (h->p[device][i].seq == seq) hit = &h->p[device][i];
    if (hit) {
      if (hit->code != PD_OK)
        rc = dev_error(st, hit->code, "%s (rank %d)", hit->msg, r);
      break;
    }
    if (pthread_cond_timedwait(&h->pcv, &h->pmu, &dl) != 0) {
      rc = dev_error(st, PD_DEADLINE_EXCEEDED,
                     "rank %d did not finish op %llu on device %d", r,
                     (unsigned long long)seq, device);
      break;
    }
  }
  pthread_mutex_unlock(&h->pmu);
  return rc;
}

static int owner(const harness *h, const dev_tensor *t, int comp) {
  return dev_tensor_devset(t)->dev[comp] / h->n;
}

static void h_tensor_created(void *arg, const dev_tensor *t) {
  harness *h = arg;
  for (int r = 1; r < h->W; r++) {
    cmd *c = cmd_new(C_CREATE, dev_tensor_id(t));
    c->dtype = dev_tensor_dtype(t);
    c->set = *dev_tensor_devset(t);
    for (int i = 0; i < c->set.n; i++)
      c->shapes[i] = *dev_tensor_component_shape(t, i);
    c->pending = dev_tensor_is_pending(t);
    dev_tensor_layout_marks(t, &c->not_mirrored, &c->shard_p1);
    enqueue(h, r, c);
  }
}

static pd_code h_component_write(void *arg, const dev_tensor *t, int comp,
                                 uint64_t off, const void *data, size_t len,
                                 dev_status *st) {
  harness *h = arg;
  cmd *c = cmd_new(C_WRITE, dev_tensor_id(t));
  c->comp = comp;
  c->off = off;
  c->len = len;
  c->data = malloc(len);
  memcpy(c->data, data, len);
  enqueue(h, owner(h, t, comp), c);
  (void)st;
  return PD_OK;
}

static pd_code h_component_read(void *arg, const dev_tensor *t, int comp,
                                uint64_t off, void *data, size_t len,
                                dev_status *st) {
  harness *h = arg;
  reply rep = {.done = false};
  pthread_mutex_init(&rep.mu, NULL);
  pthread_cond_init(&rep.cv, NULL);
  cmd *c = cmd_new(C_READ, dev_tensor_id(t));
  c->comp = comp;
  c->off = off;
  c->len = len;
  c->data = data; /* answered into, not freed */
  c->rep = &rep;
  enqueue(h, owner(h, t, comp), c);
  struct timespec dl = deadline_in(WAIT_S);
  pthread_mutex_lock(&rep.mu);
  while (!rep.done)
    if (pthread_cond_timedwait(&rep.cv, &rep.mu, &dl) != 0) break;
  bool done = rep.done;
  pthread_mutex_unlock(&rep.mu);
  if (!done) fail_msg("component_read: no answer within %d s", WAIT_S);
  pthread_mutex_destroy(&rep.mu);
  pthread_cond_destroy(&rep.cv);
  if (rep.code != PD_OK) return dev_error(st, rep.code, "%s", rep.msg);
  return PD_OK;
}

static void h_tensor_completed(void *arg, const dev_tensor *t, pd_code code,
                               const char *msg) {
  harness *h = arg;
  for (int r = 1; r < h->W; r++) {
    cmd *c = cmd_new(C_COMPLETE, dev_tensor_id(t));
    c->code = code;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    enqueue(h, r, c);
  }
}

static void h_tensor_released(void *arg, const dev_tensor *t) {
  harness *h = arg;
  for (int r = 1; r < h->W; r++)
    enqueue(h, r, cmd_new(C_RELEASE, dev_tensor_id(t)));
}

/* Copies the op's resolved attributes back into dev_attr (strings and
 * lists deep-copied). */
static void copy_attrs(cmd *c, const dev_op *op) {
  const dev_op_def *def = dev_op_definition(op);
  const dev_attr_value *v = dev_op_attr_values(op);
  c->nattrs = dev_op_def_num_attrs(def);
  for (int i = 0; i < c->nattrs; i++) {
    dev_op_attr_info info;
    assert_true(dev_op_def_attr(def, i, &info));
    c->attrs[i].name = info.name; /* the definition's: static */
    c->attrs[i].value = v[i];
    dev_attr_value *w = &c->attrs[i].value;
    if (w->type == DEV_ATTR_STRING) {
      char *s = malloc(w->u.s.len + 1);
      memcpy(s, w->u.s.ptr, w->u.s.len);
      s[w->u.s.len] = '\0';
      w->u.s.ptr = s;
      c->arena[i] = s;
    } else if (w->type == DEV_ATTR_INT_LIST) {
      int64_t *l = malloc(sizeof *l * (size_t)(w->u.ilist.n + 1));
      memcpy(l, w->u.ilist.v, sizeof *l * (size_t)w->u.ilist.n);
      w->u.ilist.v = l;
      c->arena[i] = l;
    } else if (w->type == DEV_ATTR_FLOAT_LIST) {
      double *l = malloc(sizeof *l * (size_t)(w->u.flist.n + 1));
      memcpy(l, w->u.flist.v, sizeof *l * (size_t)w->u.flist.n);
      w->u.flist.v = l;
      c->arena[i] = l;
    }
  }
}

static void h_op_submitted(void *arg, const dev_op *op) {
  harness *h = arg;
  for (int r = 1; r < h->W; r++) {
    cmd *c = cmd_new(C_OP, 0);
    snprintf(c->name, sizeof c->name, "%s", dev_op_name(op));
    c->seq = dev_op_seq(op);
    c->set = *dev_op_devset(op);
    c->nin = dev_op_num_inputs(op);
    for (int i = 0; i < c->nin; i++)
      c->in_ids[i] = dev_tensor_id(dev_op_input(op, i));
    c->nout = dev_op_num_outputs(op);
    for (int i = 0; i < c->nout; i++)
      c->out_ids[i] = dev_tensor_id(dev_op_output(op, i));
    copy_attrs(c, op);
    enqueue(h, r, c);
  }
}

static dev_tensor *lookup(rankq *q, uint64_t id) {
  return id < MAXID ? q->map[id] : NULL;
}

static void apply_op(rankq *q, cmd *c) {
  harness *h = q->h;
  dev_engine *e = h->e[q->rank];
  dev_tensor *in[DEV_MAX_INPUTS];
  for (int i = 0; i < c->nin; i++) in[i] = lookup(q, c->in_ids[i]);
  dev_op *op = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_op_prepare_on(e, &c->set, c->name, in, c->nin, c->attrs, c->nattrs,
                        &op, &st) != PD_OK) {
    replay_failed(h, c->name, st.msg);
    int first, count;
    dev_engine_local_devices(e, &first, &count);
    for (int i = 0; i < c->set.n; i++) /* so the coordinator does not wait */
      if (dev_engine_device_is_local(e, c->set.dev[i]))
        progress(h, c->set.dev[i], c->seq, st.code, st.msg);
    return;
  }
  if (dev_op_num_outputs(op) != c->nout) replay_failed(h, c->name, "outputs");
  for (int i = 0; i < c->nout && i < dev_op_num_outputs(op); i++) {
    dev_tensor *t = dev_op_output(op, i);
    dev_tensor_retain(t);
    assert_true(c->out_ids[i] < MAXID);
    q->map[c->out_ids[i]] = t;
  }
  if (dev_op_submit_seq(e, op, c->seq, &st) != PD_OK)
    replay_failed(h, c->name, st.msg);
}

static void apply(rankq *q, cmd *c) {
  dev_engine *e = q->h->e[q->rank];
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *t = c->kind == C_OP ? NULL : lookup(q, c->id);
  dev_layout per = {DEV_LAYOUT_PER_COMPONENT, 0, 0};
  switch (c->kind) {
    case C_CREATE: {
      pd_code rc =
          c->pending
              ? dev_tensor_create_pending_on(e, &c->set, c->dtype, &per,
                                             &c->shapes[0], c->shapes, &t, &st)
              : dev_tensor_create_on(e, &c->set, c->dtype, c->shapes, &t, &st);
      if (rc != PD_OK) {
        replay_failed(q->h, "create", st.msg);
        return;
      }
      dev_tensor_set_layout_marks(t, c->not_mirrored, c->shard_p1);
      assert_true(c->id < MAXID);
      q->map[c->id] = t;
      return;
    }
    case C_WRITE:
      if (!t || dev_tensor_write(t, &per, c->comp, c->off, c->data, c->len,
                                 &st) != PD_OK)
        replay_failed(q->h, "write", t ? st.msg : "no tensor");
      return;
    case C_COMPLETE:
      if (t) dev_tensor_complete(t, c->code, c->code ? c->msg : NULL);
      return;
    case C_OP: apply_op(q, c); return;
    case C_READ: {
      dev_layout one = {DEV_LAYOUT_COMPONENT, 0, c->comp};
      pd_code rc = !t ? dev_error(&st, PD_NOT_FOUND, "no tensor %llu",
                                  (unsigned long long)c->id)
                      : dev_tensor_wait(t, &st);
      if (rc == PD_OK)
        rc = dev_tensor_read(t, &one, c->comp, c->off, c->data, c->len, &st);
      pthread_mutex_lock(&c->rep->mu);
      c->rep->code = rc;
      snprintf(c->rep->msg, sizeof c->rep->msg, "%s", st.msg);
      c->rep->done = true;
      pthread_cond_broadcast(&c->rep->cv);
      pthread_mutex_unlock(&c->rep->mu);
      c->data = NULL; /* the reader's */
      return;
    }
    case C_RELEASE:
      if (t) dev_tensor_release(t);
      if (c->id < MAXID) q->map[c->id] = NULL;
      return;
  }
}

static void *replay_main(void *arg) {
  rankq *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    cmd *c = q->head;
    if (!c) {
      pthread_mutex_unlock(&q->mu);
      return NULL;
    }
    q->head = c->next;
    if (!q->head) q->tail = NULL;
    q->busy = true;
    pthread_mutex_unlock(&q->mu);
    apply(q, c);
    cmd_free(c);
    pthread_mutex_lock(&q->mu);
    q->busy = false;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
  }
}

/* Every rank has applied every command so far. */
static void h_drain(harness *h) {
  for (int r = 1; r < h->W; r++) {
    rankq *q = &h->q[r];
    struct timespec dl = deadline_in(WAIT_S);
    pthread_mutex_lock(&q->mu);
    while ((q->head || q->busy) &&
           pthread_cond_timedwait(&q->cv, &q->mu, &dl) == 0) {
    }
    bool idle = !q->head && !q->busy;
    pthread_mutex_unlock(&q->mu);
    if (!idle) fail_msg("rank %d did not drain its commands", r);
  }
}

/* Fences that are done when recorded (a fenced CPU backend): ops then
 * complete through each device's completion thread (device/complete.c). */
static atomic_int fences_recorded;
static pd_code fx_record(dev_backend *b, int device, void **fence,
                         dev_status *st) {
  (void)b;
  (void)device;
  (void)st;
  *fence = malloc(1);
  atomic_fetch_add(&fences_recorded, 1);
  return PD_OK;
}
static pd_code fx_wait(dev_backend *b, int device, void *fence,
                       dev_status *st) {
  (void)b;
  (void)device;
  (void)fence;
  (void)st;
  return PD_OK;
}
static void fx_release(dev_backend *b, int device, void *fence) {
  (void)b;
  (void)device;
  free(fence);
}

static bool g_fenced; /* h_start makes fenced engines */

static dev_engine *fenced_mesh_engine(const dev_mesh_config *mc, int n,
                                      uint64_t limit) {
  dev_cpu_config cc = DEV_CPU_CONFIG_INITIALIZER;
  cc.num_devices = n;
  cc.memory_limit = limit;
  dev_backend *b = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_cpu_backend_create(&cc, &b, &st), PD_OK);
  b->fence_record = fx_record;
  b->fence_wait = fx_wait;
  b->fence_release = fx_release;
  dev_engine *e = NULL;
  if (dev__engine_create_mesh_with_backend(b, mc, &e, &st) != PD_OK)
    fail_msg("fenced engine: %s", st.msg);
  return e;
}

/* W engines of n CPU devices each (rank 1's devices limited to
 * rank1_limit bytes when not 0), with the fake transport when `transport`. */
static harness *h_start(int W, int n, uint64_t rank1_limit, bool transport) {
  harness *h = calloc(1, sizeof *h);
  h->W = W;
  h->n = n;
  pthread_mutex_init(&h->pmu, NULL);
  pthread_cond_init(&h->pcv, NULL);
  dev_mesh_transport *t = transport ? ftrans_new() : NULL;
  for (int r = 0; r < W; r++) {
    dev_mesh_config mc = DEV_MESH_CONFIG_INITIALIZER;
    mc.rank = r;
    mc.world_size = W;
    mc.arg = h;
    if (r == 0) {
      mc.op_submitted = h_op_submitted;
      mc.tensor_created = h_tensor_created;
      mc.component_write = h_component_write;
      mc.component_read = h_component_read;
      mc.tensor_completed = h_tensor_completed;
      mc.tensor_released = h_tensor_released;
      mc.remote_wait = h_remote_wait;
    } else {
      mc.local_done = h_local_done;
    }
    dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
    cfg.num_devices = n;
    cfg.memory_limit = r == 1 ? rank1_limit : 0;
    cfg.mesh_config = &mc;
    dev_status st = DEV_STATUS_INIT;
    if (g_fenced)
      h->e[r] = fenced_mesh_engine(&mc, n, cfg.memory_limit);
    else if (dev_engine_create(&cfg, &h->e[r], &st) != PD_OK)
      fail_msg("engine of rank %d: %s", r, st.msg);
    if (t) dev_engine_mesh_set_transport(h->e[r], t);
    rankq *q = &h->q[r];
    q->h = h;
    q->rank = r;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (r > 0)
      assert_int_equal(pthread_create(&q->th, NULL, replay_main, q), 0);
  }
  if (t) t->release(t); /* the engines hold theirs */
  return h;
}

static void h_stop(harness *h) {
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_sync(h->e[0], &st), PD_OK);
  h_drain(h);
  for (int r = 1; r < h->W; r++) {
    rankq *q = &h->q[r];
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
  }
  dev_engine_destroy(h->e[0]);
  int leaked = 0;
  for (int r = 1; r < h->W; r++) {
    rankq *q = &h->q[r];
    while (q->head) { /* releases the coordinator's teardown sent */
      cmd *c = q->head;
      q->head = c->next;
      apply(q, c);
      cmd_free(c);
    }
    for (int i = 0; i < MAXID; i++)
      if (q->map[i]) {
        leaked++;
        dev_tensor_release(q->map[i]);
      }
    assert_int_equal(dev_engine_sync(h->e[r], &st), PD_OK);
    dev_engine_destroy(h->e[r]);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
  }
  if (atomic_load(&h->replay_errors))
    fail_msg("%d replay errors, the first: %s", atomic_load(&h->replay_errors),
             h->replay_error);
  assert_int_equal(leaked, 0); /* every tensor's release reached the ranks */
  for (int d = 0; d < PD_MAX_DEVICES; d++) free(h->p[d]);
  pthread_mutex_destroy(&h->pmu);
  pthread_cond_destroy(&h->pcv);
  free(h);
}

/* --- helpers -------------------------------------------------------------------- */

/* A tensor of float32 components of shape dims[rank] on every device, value
 * f(component, element). */
static dev_tensor *components(dev_engine *e, pd_dtype dt, int rank,
                              const int64_t *dims,
                              double (*f)(int comp, int64_t i)) {
  const int n = dev_engine_num_devices(e);
  dev_shape shapes[PD_MAX_DEVICES];
  void *datas[PD_MAX_DEVICES];
  dev_status st = DEV_STATUS_INIT;
  const int64_t count = tu_count(rank, dims);
  for (int d = 0; d < n; d++) {
    assert_int_equal(dev_shape_make(rank, dims, &shapes[d], &st), PD_OK);
    datas[d] = malloc((size_t)(count ? count : 1) * pd_dtype_size(dt));
    for (int64_t i = 0; i < count; i++) {
      double v = f(d, i);
      if (dt == PD_FLOAT32)
        ((float *)datas[d])[i] = (float)v;
      else if (dt == PD_INT32)
        ((int32_t *)datas[d])[i] = (int32_t)v;
      else
        ((double *)datas[d])[i] = v;
    }
  }
  dev_tensor *t = NULL;
  if (dev_tensor_from_components(e, dt, shapes, (const void *const *)datas, &t,
                                 &st) != PD_OK)
    fail_msg("upload: %s", st.msg);
  for (int d = 0; d < n; d++) free(datas[d]);
  return t;
}

/* Component c's code and message once every component is done. */
static pd_code comp_code(dev_tensor *t, int c, const char **msg) {
  dev_status st = DEV_STATUS_INIT;
  (void)dev_tensor_wait(t, &st);
  pd_code code = atomic_load(&t->comps[c].code);
  if (msg) *msg = t->comps[c].msg ? t->comps[c].msg : "";
  return code;
}

static double f_lin(int c, int64_t i) { return 10.0 * (c + 1) + (double)i; }
static double f_mix(int c, int64_t i) {
  return (double)((c * 7 + (int)i * 3) % 11) - 5.0;
}

/* --- tests ---------------------------------------------------------------------- */

/* Two engines: the global numbering, names, memory accounting, elementwise
 * ops over a sharded upload read back SHARDED, and the rank's own copy. */
static void test_elementwise_sharded(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, true);
  dev_engine *e0 = h->e[0], *e1 = h->e[1];
  assert_int_equal(dev_engine_num_devices(e0), 4);
  assert_int_equal(dev_engine_num_devices(e1), 4);
  assert_int_equal(dev_engine_mesh_rank(e1), 1);
  assert_int_equal(dev_engine_mesh_world_size(e0), 2);
  int first, count;
  dev_engine_local_devices(e1, &first, &count);
  assert_int_equal(first, 2);
  assert_int_equal(count, 2);
  assert_true(dev_engine_device_is_local(e0, 1));
  assert_false(dev_engine_device_is_local(e0, 2));
  assert_true(dev_engine_device_is_local(e1, 3));
  /* Remote devices: "r<R>/dev:<i>" until their rank says its names. */
  assert_string_equal(dev_engine_device_name(e0, 3), "r1/dev:1");
  assert_string_equal(dev_engine_device_name(e1, 0), "r0/dev:0");
  assert_true(dev_engine_device_healthy(e0, 2));

  int64_t dims[2] = {8, 3};
  double vals[24], want[24], got[24];
  for (int i = 0; i < 24; i++) {
    vals[i] = 0.5 * i - 3.0;
    want[i] = vals[i] * vals[i] + vals[i];
  }
  dev_tensor *x = tu_sharded(e0, PD_FLOAT32, 2, dims, 0, vals);
  dev_memory_stats ms = {.struct_size = sizeof ms},
                   l0 = {.struct_size = sizeof l0};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_memory_stats(e0, 2, &ms, &st), PD_OK);
  assert_int_equal(dev_engine_memory_stats(e0, 0, &l0, &st), PD_OK);
  assert_true(ms.bytes_in_use >= 2 * 3 * 4); /* x's rows 4..5, no memory */
  assert_int_equal(ms.bytes_limit, l0.bytes_limit);
  /* What rank 1 reports when it attaches (B6, B7): its own name and its
   * own limit; local devices and devices out of range are left alone. */
  dev_engine_mesh_set_remote_device(e0, 3, "cpu:1", 16u << 20, 0);
  dev_engine_mesh_set_remote_device(e0, 0, "cpu:9", 5, 5);
  dev_engine_mesh_set_remote_device(e0, 9, "cpu:9", 5, 5);
  assert_string_equal(dev_engine_device_name(e0, 3), "r1/cpu:1");
  assert_string_equal(dev_engine_device_name(e0, 2), "r1/dev:0");
  assert_string_equal(dev_engine_device_name(e0, 0),
                      dev_engine_device_name(e1, 2)); /* both "cpu:0" */
  dev_memory_stats m3 = {.struct_size = sizeof m3};
  assert_int_equal(dev_engine_memory_stats(e0, 3, &m3, &st), PD_OK);
  assert_int_equal(m3.bytes_limit, 16u << 20);
  assert_int_equal(m3.bytes_total, 16u << 20);
  assert_int_equal(dev_engine_memory_stats(e0, 0, &m3, &st), PD_OK);
  assert_int_equal(m3.bytes_limit, l0.bytes_limit);
  assert_int_equal(dev_tensor_device_bytes(x, 2), 2 * 3 * 4);
  dev_tensor *ins[2] = {x, x};
  dev_tensor *y = tu_exec(e0, "Mul", ins, 2, NULL, 0, 0);
  dev_tensor *yx[2] = {y, x};
  dev_tensor *z = tu_exec(e0, "Add", yx, 2, NULL, 0, 0);
  dev_layout sh = {DEV_LAYOUT_SHARDED, 0, 0};
  float buf[24];
  assert_int_equal(dev_tensor_to_host(z, &sh, 0, buf, sizeof buf, &st), PD_OK);
  for (int i = 0; i < 24; i++) got[i] = buf[i];
  tu_assert_close(got, want, 24, 1e-6, 0);
  /* The rank computed its own rows: component 2 (rows 4, 5) on rank 1. */
  h_drain(h);
  dev_tensor *z1 = h->q[1].map[dev_tensor_id(z)];
  assert_non_null(z1);
  double mine[6];
  assert_int_equal(tu_read(z1, 2, mine, 6), 6);
  tu_assert_close(mine, want + 12, 6, 1e-6, 0);
  /* ... and cannot read its remote component. */
  dev_layout c0 = {DEV_LAYOUT_COMPONENT, 0, 0};
  assert_int_equal(dev_tensor_to_host(z1, &c0, 0, buf, sizeof buf, &st),
                   PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "rank 0"));
  dev_tensor_release(x);
  dev_tensor_release(y);
  dev_tensor_release(z);
  assert_int_equal(dev_engine_sync(e0, &st), PD_OK);
  assert_int_equal(dev_engine_memory_stats(e0, 2, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 0); /* every placeholder went */
  h_stop(h);
}

/* DeviceId is the global index, on 2 and 3 engines. */
static void test_device_id(void **state) {
  (void)state;
  for (int W = 2; W <= 3; W++) {
    harness *h = h_start(W, 2, 0, true);
    dev_tensor *id = tu_exec(h->e[0], "DeviceId", NULL, 0, NULL, 0, 0);
    for (int d = 0; d < 2 * W; d++) {
      double v = -1;
      assert_int_equal(tu_read(id, d, &v, 1), 1);
      assert_true(v == (double)d);
    }
    dev_tensor_release(id);
    h_stop(h);
  }
}

/* AllReduce sum, mean, max across ranks (float32 and int32) on 2 and 3
 * engines, against sums computed here. */
static void test_all_reduce(void **state) {
  (void)state;
  static const char *reds[] = {"sum", "mean", "max", "min"};
  for (int W = 2; W <= 3; W++) {
    harness *h = h_start(W, 2, 0, true);
    const int n = 2 * W;
    int64_t dims[2] = {3, 5};
    for (int k = 0; k < 3; k++) {
      static const pd_dtype dts[3] = {PD_FLOAT32, PD_INT32, PD_FLOAT64};
      pd_dtype dt = dts[k];
      dev_tensor *x = components(h->e[0], dt, 2, dims, f_mix);
      for (int r = 0; r < 4; r++) {
        dev_attr a = dev_attr_string("reduction", reds[r]);
        dev_tensor *y = tu_exec(h->e[0], "AllReduce", &x, 1, &a, 1, 0);
        double want[15], got[15];
        for (int i = 0; i < 15; i++) {
          double s = 0, mx = -1e300, mn = 1e300;
          for (int d = 0; d < n; d++) {
            double v = f_mix(d, i);
            s += v;
            mx = v > mx ? v : mx;
            mn = v < mn ? v : mn;
          }
          double mean = dt == PD_INT32 ? (double)((int64_t)s / n) : s / n;
          want[i] = r == 0 ? s : r == 1 ? mean : r == 2 ? mx : mn;
        }
        for (int d = 0; d < n; d++) {
          assert_int_equal(tu_read(y, d, got, 15), 15);
          tu_assert_close(got, want, 15, 1e-6, 0);
        }
        dev_tensor_release(y);
      }
      dev_tensor_release(x);
    }
    h_stop(h);
  }
}

/* Broadcast from a root on rank 1 (set index 3). */
static void test_broadcast(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, true);
  int64_t dims[1] = {6};
  dev_tensor *x = components(h->e[0], PD_FLOAT32, 1, dims, f_lin);
  dev_attr a = dev_attr_int("root", 3);
  dev_tensor *y = tu_exec(h->e[0], "Broadcast", &x, 1, &a, 1, 0);
  double want[6], got[6];
  for (int i = 0; i < 6; i++) want[i] = 40.0 + i; /* f_lin(3, i) */
  for (int d = 0; d < 4; d++) {
    assert_int_equal(tu_read(y, d, got, 6), 6);
    tu_assert_close(got, want, 6, 0, 0);
  }
  dev_tensor_release(x);
  dev_tensor_release(y);
  h_stop(h);
}

/* AllGather along axis 0 (components of different lengths) and axis 1. */
static void test_all_gather(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, true);
  dev_engine *e0 = h->e[0];
  dev_status st = DEV_STATUS_INIT;
  /* axis 0: component d is [d + 1, 2] of 100 d + i */
  dev_shape shapes[4];
  float data[4][8];
  const void *datas[4];
  double want0[20];
  int k = 0;
  for (int d = 0; d < 4; d++) {
    int64_t dd[2] = {d + 1, 2};
    assert_int_equal(dev_shape_make(2, dd, &shapes[d], &st), PD_OK);
    for (int i = 0; i < 2 * (d + 1); i++) {
      data[d][i] = (float)(100 * d + i);
      want0[k++] = 100.0 * d + i;
    }
    datas[d] = data[d];
  }
  dev_tensor *x = NULL;
  assert_int_equal(
      dev_tensor_from_components(e0, PD_FLOAT32, shapes, datas, &x, &st),
      PD_OK);
  dev_attr a0 = dev_attr_int("axis", 0);
  dev_tensor *y = tu_exec(e0, "AllGather", &x, 1, &a0, 1, 0);
  double got[24];
  for (int d = 0; d < 4; d++) {
    assert_int_equal(tu_read(y, d, got, 24), 20);
    tu_assert_close(got, want0, 20, 0, 0);
  }
  dev_tensor_release(y);
  dev_tensor_release(x);
  /* axis 1: component d is [2, 3] of f_lin; the result is [2, 12] */
  int64_t dims[2] = {2, 3};
  x = components(e0, PD_FLOAT32, 2, dims, f_lin);
  dev_attr a1 = dev_attr_int("axis", 1);
  y = tu_exec(e0, "AllGather", &x, 1, &a1, 1, 0);
  double want1[24];
  for (int r = 0; r < 2; r++)
    for (int d = 0; d < 4; d++)
      for (int j = 0; j < 3; j++)
        want1[r * 12 + d * 3 + j] = f_lin(d, r * 3 + j);
  for (int d = 0; d < 4; d++) {
    assert_int_equal(tu_read(y, d, got, 24), 24);
    tu_assert_close(got, want1, 24, 0, 0);
  }
  dev_tensor_release(y);
  dev_tensor_release(x);
  h_stop(h);
}

/* ReduceScatter across ranks against one engine of 4 devices and against
 * hand-computed sums: 5 rows over 4 devices, component 0 gets two. */
static void test_reduce_scatter(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, true);
  dev_engine *one = tu_engine(4, 0);
  int64_t dims[2] = {5, 2};
  static const char *reds[] = {"sum", "mean"};
  for (int r = 0; r < 2; r++) {
    dev_attr a = dev_attr_string("reduction", reds[r]);
    dev_tensor *x = components(h->e[0], PD_FLOAT32, 2, dims, f_mix);
    dev_tensor *y = tu_exec(h->e[0], "ReduceScatter", &x, 1, &a, 1, 0);
    dev_tensor *x1 = components(one, PD_FLOAT32, 2, dims, f_mix);
    dev_tensor *y1 = tu_exec(one, "ReduceScatter", &x1, 1, &a, 1, 0);
    static const int first_row[4] = {0, 2, 3, 4}, rows[4] = {2, 1, 1, 1};
    for (int d = 0; d < 4; d++) {
      double got[4], ref[4], want[4];
      assert_int_equal(tu_read(y, d, got, 4), 2 * rows[d]);
      assert_int_equal(tu_read(y1, d, ref, 4), 2 * rows[d]);
      for (int i = 0; i < 2 * rows[d]; i++) {
        double s = 0;
        for (int p = 0; p < 4; p++) s += f_mix(p, first_row[d] * 2 + i);
        want[i] = r ? s / 4 : s;
      }
      tu_assert_close(got, want, 2 * rows[d], 1e-6, 0);
      tu_assert_close(got, ref, 2 * rows[d], 1e-6, 0);
    }
    dev_tensor_release(x);
    dev_tensor_release(y);
    dev_tensor_release(x1);
    dev_tensor_release(y1);
  }
  dev_engine_destroy(one);
  h_stop(h);
}

/* A failed input on rank 1 (over its devices' 4 KiB limit) feeding an
 * AllReduce fails the output on every device of every engine, with the
 * rank's code, naming the device. */
static void test_failed_input_fails_everywhere(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 4096, true);
  int64_t big[1] = {2048}; /* 8 KiB of float32 per device */
  dev_attr fa[2] = {dev_attr_shape("shape", 1, big),
                    dev_attr_float("value", 1)};
  dev_tensor *f = tu_exec(h->e[0], "Fill", NULL, 0, fa, 2, 0);
  dev_attr a = dev_attr_string("reduction", "sum");
  dev_tensor *y = tu_exec(h->e[0], "AllReduce", &f, 1, &a, 1, 0);
  const char *msg = NULL;
  assert_int_equal(comp_code(f, 2, &msg), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(msg, "mesh device 2"));
  for (int d = 0; d < 4; d++) {
    assert_int_equal(comp_code(y, d, &msg), PD_RESOURCE_EXHAUSTED);
    if (!strstr(msg, "device 2")) fail_msg("component %d: %s", d, msg);
  }
  h_drain(h);
  dev_tensor *y1 = h->q[1].map[dev_tensor_id(y)];
  assert_non_null(y1);
  for (int d = 2; d < 4; d++) {
    assert_int_equal(comp_code(y1, d, &msg), PD_RESOURCE_EXHAUSTED);
  }
  dev_tensor_release(f);
  dev_tensor_release(y);
  h_stop(h);
}

/* The coordinator's remote_wait failing (its rank lost) reaches the
 * outputs, and Sync returns. */
static void test_remote_wait_error(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, true);
  int64_t dims[1] = {4};
  dev_tensor *x = components(h->e[0], PD_FLOAT32, 1, dims, f_lin);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_sync(h->e[0], &st), PD_OK);
  pthread_mutex_lock(&h->pmu);
  h->lost[1] = true;
  pthread_cond_broadcast(&h->pcv);
  pthread_mutex_unlock(&h->pmu);
  dev_tensor *y = tu_exec(h->e[0], "Neg", &x, 1, NULL, 0, 0);
  assert_int_equal(dev_engine_sync(h->e[0], &st), PD_OK);
  assert_int_equal(dev_tensor_wait(y, &st), PD_UNAVAILABLE);
  assert_non_null(strstr(st.msg, "rank 1"));
  const char *msg;
  assert_int_equal(comp_code(y, 3, &msg), PD_UNAVAILABLE);
  dev_tensor_release(x);
  dev_tensor_release(y);
  h_stop(h);
}

/* Graph functions and placement ops across ranks are refused; a copy
 * within rank 1 runs there. */
static void test_refusals(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, true);
  dev_engine *e0 = h->e[0];
  dev_status st = DEV_STATUS_INIT;
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e0, NULL, &lib, &st), PD_OK);
  dev_op *op = NULL;
  assert_int_equal(dev_fn_prepare_call(lib, "f", NULL, 0, &op, &st),
                   PD_UNIMPLEMENTED);
  assert_string_equal(st.msg,
                      "graph functions are not available on a mesh across "
                      "machines yet; run the ops eagerly");
  dev_fn_lib_destroy(lib);

  int64_t d0[1] = {0}, d2[1] = {2}, d3[1] = {3};
  dev_devset s0, s2;
  assert_int_equal(dev_devset_make(e0, d0, 1, &s0, &st), PD_OK);
  assert_int_equal(dev_devset_make(e0, d2, 1, &s2, &st), PD_OK);
  float v[3] = {1.5f, -2.0f, 4.0f};
  int64_t dims[1] = {3};
  dev_shape shp;
  assert_int_equal(dev_shape_make(1, dims, &shp, &st), PD_OK);
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *x0 = NULL, *x2 = NULL;
  assert_int_equal(
      dev_tensor_from_host_on(e0, &s0, PD_FLOAT32, &mir, &shp, v, &x0, &st),
      PD_OK);
  assert_int_equal(
      dev_tensor_from_host_on(e0, &s2, PD_FLOAT32, &mir, &shp, v, &x2, &st),
      PD_OK);
  dev_attr to2 = dev_attr_int_list("devices", d2, 1);
  tu_exec_fails(e0, "CopyToDevices", &x0, 1, &to2, 1, PD_UNIMPLEMENTED,
                "rank 1");
  dev_tensor *pair[2] = {x0, x2};
  tu_exec_fails(e0, "ParallelPack", pair, 2, NULL, 0, PD_UNIMPLEMENTED,
                "span ranks");
  dev_attr to3 = dev_attr_int_list("devices", d3, 1);
  dev_tensor *y = tu_exec(e0, "CopyToDevices", &x2, 1, &to3, 1, 0);
  double got[3], want[3] = {1.5, -2.0, 4.0};
  assert_int_equal(tu_read(y, 0, got, 3), 3);
  tu_assert_close(got, want, 3, 0, 0);
  assert_int_equal(dev_tensor_devset(y)->dev[0], 3);
  dev_tensor_release(x0);
  dev_tensor_release(x2);
  dev_tensor_release(y);
  h_stop(h);
}

static atomic_uint_fast64_t lone_last;
static void lone_done(void *arg, int device, uint64_t seq, pd_code code,
                      const char *msg) {
  (void)arg;
  (void)device;
  (void)code;
  (void)msg;
  atomic_store(&lone_last, seq);
}

/* Waits (bounded) until local_done reported `seq`: it comes after the
 * publish that wakes readers. */
static void wait_lone(uint64_t seq) {
  for (int i = 0; i < WAIT_S * 1000 && atomic_load(&lone_last) != seq; i++) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  assert_int_equal(atomic_load(&lone_last), seq);
}

/* dev_op_submit_seq jumps to the coordinator's seq and refuses an old one;
 * dev_engine_advance_seq moves the next seq above a given one. */
static void test_submit_seq(void **state) {
  (void)state;
  dev_mesh_config mc = DEV_MESH_CONFIG_INITIALIZER;
  mc.rank = 1;
  mc.world_size = 2;
  mc.local_done = lone_done;
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.num_devices = 2;
  cfg.mesh_config = &mc;
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  mc.rank = 2; /* not a rank of a mesh of 2 */
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "rank 2 of world size 2"));
  mc.rank = 1;
  cfg.num_devices = 40; /* 80 devices: over PD_MAX_DEVICES */
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_INVALID_ARGUMENT);
  cfg.num_devices = 2;
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_OK);
  int64_t d2[1] = {2}, dims[1] = {3};
  dev_devset s2;
  assert_int_equal(dev_devset_make(e, d2, 1, &s2, &st), PD_OK);
  dev_attr fa[2] = {dev_attr_shape("shape", 1, dims),
                    dev_attr_float("value", 7)};
  dev_op *op = NULL;
  assert_int_equal(dev_op_prepare_on(e, &s2, "Fill", NULL, 0, fa, 2, &op, &st),
                   PD_OK);
  dev_tensor *a = dev_op_output(op, 0);
  dev_tensor_retain(a);
  assert_int_equal(dev_op_submit_seq(e, op, 100, &st), PD_OK);
  assert_int_equal(dev_engine_last_seq(e), 100);
  double got[3], want[3] = {7, 7, 7};
  assert_int_equal(tu_read(a, 0, got, 3), 3);
  tu_assert_close(got, want, 3, 0, 0);
  wait_lone(100);
  assert_int_equal(dev_op_prepare_on(e, &s2, "Fill", NULL, 0, fa, 2, &op, &st),
                   PD_OK);
  dev_tensor *b = dev_op_output(op, 0);
  dev_tensor_retain(b);
  assert_int_equal(dev_op_submit_seq(e, op, 50, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "not above"));
  assert_int_equal(dev_tensor_wait(b, &st), PD_INVALID_ARGUMENT);
  assert_int_equal(dev_engine_last_seq(e), 100);
  dev_engine_advance_seq(e, 500);
  dev_engine_advance_seq(e, 400); /* no-op: already above */
  assert_int_equal(dev_engine_last_seq(e), 500);
  dev_tensor *c = tu_exec(e, "Neg", &a, 1, NULL, 0, 0);
  assert_int_equal(tu_read(c, 0, got, 3), 3);
  assert_int_equal(dev_engine_last_seq(e), 501);
  wait_lone(501);
  /* An op on a remote device runs nothing here and cannot be read. */
  int64_t d0[1] = {0};
  dev_devset s0;
  assert_int_equal(dev_devset_make(e, d0, 1, &s0, &st), PD_OK);
  assert_int_equal(dev_op_prepare_on(e, &s0, "Fill", NULL, 0, fa, 2, &op, &st),
                   PD_OK);
  dev_tensor *r = dev_op_output(op, 0);
  dev_tensor_retain(r);
  assert_int_equal(dev_op_submit_seq(e, op, 600, &st), PD_OK);
  assert_int_equal(dev_tensor_wait(r, &st), PD_OK);
  dev_layout c0 = {DEV_LAYOUT_COMPONENT, 0, 0};
  float buf[3];
  assert_int_equal(dev_tensor_to_host(r, &c0, 0, buf, sizeof buf, &st),
                   PD_FAILED_PRECONDITION);
  /* An op reading a pending tensor is refused, and reported (the
   * coordinator waits for its seq). */
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_shape shp;
  assert_int_equal(dev_shape_make(1, dims, &shp, &st), PD_OK);
  dev_tensor *p = NULL;
  assert_int_equal(dev_tensor_create_pending_on(e, &s2, PD_FLOAT32, &mir, &shp,
                                                NULL, &p, &st),
                   PD_OK);
  assert_int_equal(dev_op_prepare_on(e, NULL, "Neg", &p, 1, NULL, 0, &op, &st),
                   PD_OK);
  assert_int_equal(dev_op_submit_seq(e, op, 700, &st), PD_FAILED_PRECONDITION);
  wait_lone(700);
  dev_tensor_complete(p, PD_CANCELLED, "not loaded");
  dev_tensor_release(p);
  dev_tensor_release(a);
  dev_tensor_release(b);
  dev_tensor_release(c);
  dev_tensor_release(r);
  dev_engine_destroy(e);
}

/* Without a transport a cross-rank collective fails at once with
 * UNAVAILABLE on every device of every engine (no hang). */
static void test_no_transport(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, false);
  int64_t dims[1] = {4};
  dev_tensor *x = components(h->e[0], PD_FLOAT32, 1, dims, f_lin);
  dev_attr a = dev_attr_string("reduction", "sum");
  dev_tensor *y = tu_exec(h->e[0], "AllReduce", &x, 1, &a, 1, 0);
  const char *msg;
  for (int d = 0; d < 4; d++) {
    assert_int_equal(comp_code(y, d, &msg), PD_UNAVAILABLE);
    if (!strstr(msg,
                "the mesh has no collective transport (not formed, or "
                "degraded)"))
      fail_msg("component %d: %s", d, msg);
  }
  /* A collective within one rank needs none. */
  dev_tensor *id = tu_exec(h->e[0], "DeviceId", NULL, 0, NULL, 0, 0);
  assert_non_null(id);
  dev_tensor_release(id);
  dev_tensor_release(x);
  dev_tensor_release(y);
  h_stop(h);
}

/* A pending tensor (a checkpoint load) across ranks: created, written in
 * chunks, completed, read by ops there; one completed with an error fails
 * its consumers on every device with that error. */
static void test_pending_load(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, true);
  dev_engine *e0 = h->e[0];
  dev_status st = DEV_STATUS_INIT;
  int64_t dims[2] = {4, 2};
  dev_shape hs;
  assert_int_equal(dev_shape_make(2, dims, &hs, &st), PD_OK);
  dev_layout sh = {DEV_LAYOUT_SHARDED, 0, 0};
  dev_tensor *p = NULL;
  assert_int_equal(
      dev_tensor_create_pending(e0, PD_FLOAT32, &sh, &hs, NULL, &p, &st),
      PD_OK);
  float v[8];
  for (int i = 0; i < 8; i++) v[i] = (float)(i * i) - 4.0f;
  for (int off = 0; off < 8; off += 3) { /* chunks across components */
    int len = 8 - off < 3 ? 8 - off : 3;
    assert_int_equal(dev_tensor_write(p, &sh, 0, (uint64_t)off * 4, v + off,
                                      (size_t)len * 4, &st),
                     PD_OK);
  }
  dev_tensor_complete(p, PD_OK, NULL);
  dev_tensor *y = tu_exec(e0, "Neg", &p, 1, NULL, 0, 0);
  float got[8];
  assert_int_equal(dev_tensor_to_host(y, &sh, 0, got, sizeof got, &st), PD_OK);
  for (int i = 0; i < 8; i++) assert_true(got[i] == -v[i]);
  dev_tensor *q = NULL;
  assert_int_equal(
      dev_tensor_create_pending(e0, PD_FLOAT32, &sh, &hs, NULL, &q, &st),
      PD_OK);
  dev_tensor_complete(q, PD_DATA_LOSS, "checkpoint shard 3 is damaged");
  dev_tensor *z = tu_exec(e0, "Neg", &q, 1, NULL, 0, 0);
  const char *msg;
  for (int d = 0; d < 4; d++) {
    assert_int_equal(comp_code(z, d, &msg), PD_DATA_LOSS);
    assert_non_null(strstr(msg, "damaged"));
  }
  dev_tensor_release(p);
  dev_tensor_release(q);
  dev_tensor_release(y);
  dev_tensor_release(z);
  h_stop(h);
}

/* Three engines: a sharded elementwise op, AllGather and ReduceScatter over
 * six devices. */
static void test_three_engines(void **state) {
  (void)state;
  harness *h = h_start(3, 2, 0, true);
  dev_engine *e0 = h->e[0];
  dev_status st = DEV_STATUS_INIT;
  int64_t dims[2] = {12, 2};
  double vals[24];
  for (int i = 0; i < 24; i++) vals[i] = i - 7.5;
  dev_tensor *x = tu_sharded(e0, PD_FLOAT32, 2, dims, 0, vals);
  dev_tensor *xx[2] = {x, x};
  dev_tensor *y = tu_exec(e0, "Mul", xx, 2, NULL, 0, 0);
  dev_layout sh = {DEV_LAYOUT_SHARDED, 0, 0};
  float got[24];
  assert_int_equal(dev_tensor_to_host(y, &sh, 0, got, sizeof got, &st), PD_OK);
  for (int i = 0; i < 24; i++)
    assert_true(got[i] == (float)(vals[i] * vals[i]));
  dev_attr a0 = dev_attr_int("axis", 0);
  dev_tensor *g = tu_exec(e0, "AllGather", &y, 1, &a0, 1, 0);
  double all[24];
  for (int d = 0; d < 6; d++) {
    assert_int_equal(tu_read(g, d, all, 24), 24);
    for (int i = 0; i < 24; i++) assert_true(all[i] == vals[i] * vals[i]);
  }
  dev_attr sum = dev_attr_string("reduction", "sum");
  dev_tensor *rs = tu_exec(e0, "ReduceScatter", &g, 1, &sum, 1, 0);
  for (int d = 0; d < 6; d++) { /* 12 rows over 6: rows 2d, 2d + 1 */
    double part[4];
    assert_int_equal(tu_read(rs, d, part, 4), 4);
    for (int i = 0; i < 4; i++) {
      double w = vals[4 * d + i] * vals[4 * d + i] * 6;
      assert_true(part[i] == w);
    }
  }
  dev_tensor_release(x);
  dev_tensor_release(y);
  dev_tensor_release(g);
  dev_tensor_release(rs);
  h_stop(h);
}

/* A transport error fails the outputs with its code and message on every
 * device; a transport taken away (degraded) makes the next collective
 * fail with UNAVAILABLE. */
static void test_transport_error(void **state) {
  (void)state;
  harness *h = h_start(2, 2, 0, true);
  int64_t dims[1] = {4};
  dev_tensor *x = components(h->e[0], PD_FLOAT32, 1, dims, f_lin);
  dev_attr a = dev_attr_string("reduction", "sum");
  atomic_store(&the_ftrans->fail_data, true);
  dev_tensor *y = tu_exec(h->e[0], "AllReduce", &x, 1, &a, 1, 0);
  const char *msg;
  for (int d = 0; d < 4; d++) {
    assert_int_equal(comp_code(y, d, &msg), PD_UNAVAILABLE);
    if (!strstr(msg, "closed its connection"))
      fail_msg("component %d: %s", d, msg);
  }
  atomic_store(&the_ftrans->fail_data, false);
  dev_tensor *ok = tu_exec(h->e[0], "AllReduce", &x, 1, &a, 1, 0);
  double got[4], want[4];
  for (int i = 0; i < 4; i++) want[i] = 100.0 + 4 * i; /* 10+20+30+40 + 4i */
  assert_int_equal(tu_read(ok, 2, got, 4), 4);
  tu_assert_close(got, want, 4, 0, 0);
  for (int r = 0; r < 2; r++) dev_engine_mesh_set_transport(h->e[r], NULL);
  dev_tensor *z = tu_exec(h->e[0], "AllReduce", &x, 1, &a, 1, 0);
  for (int d = 0; d < 4; d++)
    assert_int_equal(comp_code(z, d, &msg), PD_UNAVAILABLE);
  dev_tensor_release(x);
  dev_tensor_release(y);
  dev_tensor_release(ok);
  dev_tensor_release(z);
  h_stop(h);
}

/* Three engines and an uneven share of a subset set: [0, 2, 3, 4] puts one
 * participant on rank 0, two on rank 1 (device 3 is not its leader) and
 * one on rank 2. AllReduce sum / mean / max / min and ReduceScatter (sum,
 * mean) against sums computed here; then an input failed on device 3 alone
 * (over rank 1's 4 KiB limit there, while device 2 fits) fails the
 * AllReduce on every device of the set on every engine, naming device 3. */
static void test_uneven_subset(void **state) {
  (void)state;
  harness *h = h_start(3, 2, 4096, true);
  dev_engine *e0 = h->e[0];
  dev_status st = DEV_STATUS_INIT;
  const int64_t ids[4] = {0, 2, 3, 4};
  dev_devset set;
  assert_int_equal(dev_devset_make(e0, ids, 4, &set, &st), PD_OK);
  int64_t dims[2] = {5, 2};
  dev_shape shapes[4];
  float data[4][10];
  const void *datas[4];
  for (int c = 0; c < 4; c++) {
    assert_int_equal(dev_shape_make(2, dims, &shapes[c], &st), PD_OK);
    for (int i = 0; i < 10; i++) data[c][i] = (float)f_mix((int)ids[c], i);
    datas[c] = data[c];
  }
  dev_tensor *x = NULL;
  assert_int_equal(dev_tensor_from_components_on(e0, &set, PD_FLOAT32, shapes,
                                                 datas, &x, &st),
                   PD_OK);
  static const char *reds[] = {"sum", "mean", "max", "min"};
  for (int r = 0; r < 4; r++) {
    dev_attr a = dev_attr_string("reduction", reds[r]);
    dev_tensor *y = tu_exec(e0, "AllReduce", &x, 1, &a, 1, 0);
    double want[10], got[10];
    for (int i = 0; i < 10; i++) {
      double s = 0, mx = -1e300, mn = 1e300;
      for (int c = 0; c < 4; c++) {
        s += data[c][i];
        mx = data[c][i] > mx ? data[c][i] : mx;
        mn = data[c][i] < mn ? data[c][i] : mn;
      }
      want[i] = r == 0 ? s : r == 1 ? s / 4 : r == 2 ? mx : mn;
    }
    for (int c = 0; c < 4; c++) {
      assert_int_equal(tu_read(y, c, got, 10), 10);
      tu_assert_close(got, want, 10, 1e-6, 0);
    }
    dev_tensor_release(y);
  }
  for (int r = 0; r < 2; r++) { /* 5 rows over 4: component 0 gets two */
    dev_attr a = dev_attr_string("reduction", reds[r]);
    dev_tensor *y = tu_exec(e0, "ReduceScatter", &x, 1, &a, 1, 0);
    static const int first_row[4] = {0, 2, 3, 4}, rows[4] = {2, 1, 1, 1};
    for (int c = 0; c < 4; c++) {
      double got[4], want[4];
      assert_int_equal(tu_read(y, c, got, 4), 2 * rows[c]);
      for (int i = 0; i < 2 * rows[c]; i++) {
        double s = 0;
        for (int p = 0; p < 4; p++) s += data[p][first_row[c] * 2 + i];
        want[i] = r ? s / 4 : s;
      }
      tu_assert_close(got, want, 2 * rows[c], 1e-6, 0);
    }
    dev_tensor_release(y);
  }
  dev_tensor_release(x);
  /* 1 KiB inputs everywhere, then 2.5 KiB held on device 3 only: the
   * AllReduce's 1 KiB output fits on device 2 (the leader) and not on
   * device 3, whose part then arrives failed. */
  const int64_t d3[1] = {3}, hog_dims[1] = {640}, in_dims[1] = {256};
  dev_attr fa[2] = {dev_attr_shape("shape", 1, in_dims),
                    dev_attr_float("value", 1)};
  dev_op *op = NULL;
  assert_int_equal(
      dev_op_prepare_on(e0, &set, "Fill", NULL, 0, fa, 2, &op, &st), PD_OK);
  dev_tensor *f = dev_op_output(op, 0);
  dev_tensor_retain(f);
  dev_op_submit(e0, op);
  dev_devset s3;
  assert_int_equal(dev_devset_make(e0, d3, 1, &s3, &st), PD_OK);
  float *zeros = calloc(640, sizeof(float));
  dev_shape hs;
  assert_int_equal(dev_shape_make(1, hog_dims, &hs, &st), PD_OK);
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *hog = NULL;
  assert_int_equal(
      dev_tensor_from_host_on(e0, &s3, PD_FLOAT32, &mir, &hs, zeros, &hog, &st),
      PD_OK);
  free(zeros);
  dev_attr a = dev_attr_string("reduction", "sum");
  dev_tensor *y = tu_exec(e0, "AllReduce", &f, 1, &a, 1, 0);
  const char *msg = NULL;
  for (int c = 0; c < 4; c++) {
    assert_int_equal(comp_code(f, c, &msg), PD_OK);
    assert_int_equal(comp_code(y, c, &msg), PD_RESOURCE_EXHAUSTED);
    if (!strstr(msg, "device 3")) fail_msg("component %d: %s", c, msg);
  }
  h_drain(h);
  for (int r = 1; r < 3; r++) { /* rank 1: components 1, 2; rank 2: 3 */
    dev_tensor *yr = h->q[r].map[dev_tensor_id(y)];
    assert_non_null(yr);
    for (int c = r == 1 ? 1 : 3; c <= (r == 1 ? 2 : 3); c++) {
      assert_int_equal(comp_code(yr, c, &msg), PD_RESOURCE_EXHAUSTED);
      if (!strstr(msg, "device 3") && !strstr(msg, "cpu:1 is out of memory"))
        fail_msg("rank %d component %d: %s", r, c, msg);
    }
  }
  dev_tensor_release(hog);
  dev_tensor_release(f);
  dev_tensor_release(y);
  h_stop(h);
}

/* The cross-rank AllReduce / ReduceScatter with one transport participant
 * per device (PARADEV_MESH_FLAT_ALLREDUCE=1), as before the hierarchical
 * path: the same results and errors. */
static void test_flat(void **state) {
  setenv("PARADEV_MESH_FLAT_ALLREDUCE", "1", 1);
  test_all_reduce(state);
  test_reduce_scatter(state);
  test_failed_input_fails_everywhere(state);
  test_no_transport(state);
  test_three_engines(state);
  test_transport_error(state);
  test_uneven_subset(state);
  unsetenv("PARADEV_MESH_FLAT_ALLREDUCE");
}

/* The same paths on a backend with fences: ranks report from the
 * completion threads, remote devices record no fence. */
static void test_fenced(void **state) {
  g_fenced = true;
  atomic_store(&fences_recorded, 0);
  test_elementwise_sharded(state);
  test_all_reduce(state);
  test_failed_input_fails_everywhere(state);
  test_refusals(state);
  g_fenced = false;
  assert_true(atomic_load(&fences_recorded) > 0);
}

/* The collectives staged through host buffers, as on a GPU backend
 * (PARADEV_MESH_STAGED=1: copy_d2h, the transport, copy_h2d). */
static void test_staged(void **state) {
  setenv("PARADEV_MESH_STAGED", "1", 1);
  test_all_reduce(state);
  test_broadcast(state);
  test_all_gather(state);
  test_reduce_scatter(state);
  test_uneven_subset(state);
  test_failed_input_fails_everywhere(state);
  unsetenv("PARADEV_MESH_STAGED");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_elementwise_sharded),
      cmocka_unit_test(test_device_id),
      cmocka_unit_test(test_all_reduce),
      cmocka_unit_test(test_broadcast),
      cmocka_unit_test(test_all_gather),
      cmocka_unit_test(test_reduce_scatter),
      cmocka_unit_test(test_failed_input_fails_everywhere),
      cmocka_unit_test(test_remote_wait_error),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_submit_seq),
      cmocka_unit_test(test_no_transport),
      cmocka_unit_test(test_pending_load),
      cmocka_unit_test(test_three_engines),
      cmocka_unit_test(test_transport_error),
      cmocka_unit_test(test_uneven_subset),
      cmocka_unit_test(test_flat),
      cmocka_unit_test(test_fenced),
      cmocka_unit_test(test_staged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
