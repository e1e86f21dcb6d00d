/* The coordinator's data plane (issue #16, server/mesh.h): the engine's
 * dev_mesh_config hooks turned into packed MeshCommands for the ranks, and
 * the ranks' MeshProgress and MeshReadResults turned back into the outcomes
 * of remote_wait and component_read.
 *
 * Ordering. Commands to one rank go out in the order their hooks ran:
 * op_submitted runs under the engine's submit lock (so ops go in seq
 * order), and a tensor's create and writes happen before any op can name it
 * (the upload finishes first), its release after every op reading it was
 * forwarded (dev_mesh.h). srv_mesh_send_command keeps that order per rank.
 *
 * Progress. Per global device, done_seq (every op <= it finished there) and
 * the failures the rank reported among them, in seq order. A remote
 * device's executor waits in seq order, so a failure record below the seq it
 * waits for was never its own and is dropped; the one it finds is taken.
 * Memory stays bounded by the ops in flight.
 *
 * Loss. srv_mesh_fwd_rank_lost marks the rank lost and remembers the last
 * seq forwarded so far (fail_upto): every wait on its devices up to that seq
 * fails with UNAVAILABLE and `why`, now and after the rank attached again
 * (a new incarnation never saw those ops); so do ops the control plane
 * refused to queue (srv_mesh_send_command false).
 *
 * Progress, waits, reads and loss are in mesh_fwd_wait.c; the state in
 * mesh_data.h. Locks: `mu` guards progress, ranks and reads; `rel_mu` the
 * release batches; neither nests anything (sends happen outside them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mesh_data.h"

static uint64_t fwd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The ranks other than 0 owning a device of `set`, as a bit mask. */
static uint64_t fwd_ranks_of(const fwd *f, const dev_devset *set) {
  uint64_t mask = 0;
  for (int i = 0; i < set->n; i++) {
    int r = srv_mesh_device_rank(f->m, set->dev[i]);
    if (r > 0 && r < 64) mask |= (uint64_t)1 << r;
  }
  return mask;
}

/* Packs `cmd` into `buf` (grown as needed; *cap its size); the length. */
static size_t fwd_pack(const Paradev__V1__MeshCommand *cmd, uint8_t **buf,
                       size_t *cap) {
  size_t n = paradev__v1__mesh_command__get_packed_size(cmd);
  if (n > *cap) {
    size_t c = *cap ? *cap : 4096;
    while (c < n) c *= 2;
    uint8_t *nb = realloc(*buf, c);
    if (!nb) return 0;
    *buf = nb;
    *cap = c;
  }
  return paradev__v1__mesh_command__pack(cmd, *buf);
}

/* Packs `cmd` once and queues it to every rank of `mask`; false when a rank
 * refused (*refused gets the first). */
static bool fwd_send_mask(fwd *f, uint64_t mask,
                          const Paradev__V1__MeshCommand *cmd, int *refused) {
  uint8_t local[512], *buf = local;
  size_t n = paradev__v1__mesh_command__get_packed_size(cmd);
  if (n > sizeof local && !(buf = malloc(n))) {
    *refused = -1;
    return false;
  }
  paradev__v1__mesh_command__pack(cmd, buf);
  bool ok = true;
  for (int r = 1; r < f->world && r < 64; r++)
    if ((mask >> r & 1) && !srv_mesh_send_command(f->m, r, buf, n)) {
      if (ok) *refused = r;
      ok = false;
    }
  if (buf != local) free(buf);
  return ok;
}

/* --- op_submitted -------------------------------------------------------- */

/* Room for one op's attributes as proto messages, on the stack. */
typedef struct fwd_attrs {
  Paradev__V1__Attr attr[DEV_MAX_ATTRS];
  Paradev__V1__Attr *ptr[DEV_MAX_ATTRS];
  Paradev__V1__AttrValue val[DEV_MAX_ATTRS];
  Paradev__V1__Shape shape[DEV_MAX_ATTRS];
  Paradev__V1__IntList il[DEV_MAX_ATTRS];
  Paradev__V1__FloatList fl[DEV_MAX_ATTRS];
  char str[DEV_MAX_ATTRS][DEV_ATTR_STRING_MAX + 1];
} fwd_attrs;

/* Value `v` into slot `k` of `room` (strings copied, NUL-terminated: the
 * engine's are (ptr, len); lists and shapes point at the op's storage).
 * False for an absent value. */
static bool fwd_attr_value(fwd_attrs *room, int k, const dev_attr_value *v) {
  Paradev__V1__AttrValue *pb = &room->val[k];
  paradev__v1__attr_value__init(pb);
  switch (v->type) {
    case DEV_ATTR_INT:
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_I;
      pb->i = v->u.i;
      return true;
    case DEV_ATTR_FLOAT:
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_F;
      pb->f = v->u.f;
      return true;
    case DEV_ATTR_BOOL:
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_B;
      pb->b = v->u.b;
      return true;
    case DEV_ATTR_STRING: {
      size_t len =
          v->u.s.len < DEV_ATTR_STRING_MAX ? v->u.s.len : DEV_ATTR_STRING_MAX;
      if (len) memcpy(room->str[k], v->u.s.ptr, len);
      room->str[k][len] = '\0';
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_S;
      pb->s = room->str[k];
      return true;
    }
    case DEV_ATTR_DTYPE:
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_DTYPE;
      pb->dtype = (Paradev__V1__DType)v->u.dtype;
      return true;
    case DEV_ATTR_SHAPE:
      paradev__v1__shape__init(&room->shape[k]);
      room->shape[k].n_dims = (size_t)v->u.shape.rank;
      room->shape[k].dims = (int64_t *)v->u.shape.dims;
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_SHAPE;
      pb->shape = &room->shape[k];
      return true;
    case DEV_ATTR_INT_LIST:
      paradev__v1__int_list__init(&room->il[k]);
      room->il[k].n_values = (size_t)v->u.ilist.n;
      room->il[k].values = (int64_t *)v->u.ilist.v;
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST;
      pb->int_list = &room->il[k];
      return true;
    case DEV_ATTR_FLOAT_LIST:
      paradev__v1__float_list__init(&room->fl[k]);
      room->fl[k].n_values = (size_t)v->u.flist.n;
      room->fl[k].values = (double *)v->u.flist.v;
      pb->value_case = PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST;
      pb->float_list = &room->fl[k];
      return true;
    case DEV_ATTR_NONE: break;
  }
  return false;
}

/* The op's declared attributes that have a value, in declaration order;
 * the count. */
static size_t fwd_attrs_fill(fwd_attrs *room, const dev_op *op) {
  const dev_op_def *def = dev_op_definition(op);
  const dev_attr_value *vals = dev_op_attr_values(op);
  int na = def ? dev_op_def_num_attrs(def) : 0;
  size_t k = 0;
  for (int i = 0; i < na && i < DEV_MAX_ATTRS && vals; i++) {
    dev_op_attr_info info;
    if (!dev_op_def_attr(def, i, &info)) continue;
    if (!fwd_attr_value(room, (int)k, &vals[i])) continue;
    paradev__v1__attr__init(&room->attr[k]);
    room->attr[k].name = (char *)info.name;
    room->attr[k].value = &room->val[k];
    room->ptr[k] = &room->attr[k];
    k++;
  }
  return k;
}

static void fwd_op_submitted(void *arg, const dev_op *op) {
  fwd *f = fwd_of(arg);
  if (!f) return;
  uint64_t t0 = fwd_now_ns();
  const dev_devset *set = dev_op_devset(op);
  uint64_t mask = fwd_ranks_of(f, set);
  if (!mask) return; /* the coordinator's own devices only */
  uint64_t seq = dev_op_seq(op);
  /* Before the sends: a rank lost from here on fails this op too (see
   * srv_mesh_fwd_rank_lost). */
  atomic_store(&f->last_seq, seq);

  fwd_attrs room;
  uint64_t ins[DEV_MAX_INPUTS], outs_local[DEV_MAX_OUTPUTS], *outs = outs_local;
  uint32_t devs[PD_MAX_DEVICES];
  int ni = dev_op_num_inputs(op), no = dev_op_num_outputs(op);
  if (ni > DEV_MAX_INPUTS) ni = DEV_MAX_INPUTS;
  if (no > DEV_MAX_OUTPUTS && !(outs = malloc(sizeof(*outs) * (size_t)no))) {
    SRV_ERROR("mesh: op %llu (%s): out of memory forwarding it",
              (unsigned long long)seq, dev_op_name(op));
    for (int r = 1; r < f->world && r < 64; r++)
      if (mask >> r & 1) srv_mfwd_refused(f, r, seq);
    return;
  }
  for (int i = 0; i < ni; i++) ins[i] = dev_tensor_id(dev_op_input(op, i));
  for (int i = 0; i < no; i++) outs[i] = dev_tensor_id(dev_op_output(op, i));
  for (int i = 0; i < set->n; i++) devs[i] = set->dev[i];

  Paradev__V1__MeshOp mop;
  paradev__v1__mesh_op__init(&mop);
  mop.seq = seq;
  mop.op = (char *)dev_op_name(op);
  mop.n_attrs = fwd_attrs_fill(&room, op);
  mop.attrs = room.ptr;
  mop.n_inputs = (size_t)ni;
  mop.inputs = ins;
  mop.n_outputs = (size_t)no;
  mop.outputs = outs;
  mop.n_devices = (size_t)set->n;
  mop.devices = devs;
  Paradev__V1__MeshCommand cmd;
  paradev__v1__mesh_command__init(&cmd);
  cmd.kind_case = PARADEV__V1__MESH_COMMAND__KIND_OP;
  cmd.op = &mop;
  size_t len = fwd_pack(&cmd, &f->opbuf, &f->opcap);
  if (outs != outs_local) free(outs);
  uint64_t t1 = fwd_now_ns();
  for (int r = 1; r < f->world && r < 64; r++) {
    if (!(mask >> r & 1)) continue;
    if (!len || !srv_mesh_send_command(f->m, r, f->opbuf, len))
      srv_mfwd_refused(f, r, seq);
  }
  atomic_fetch_add_explicit(&f->ops, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->op_bytes, len, memory_order_relaxed);
  atomic_fetch_add_explicit(&f->pack_ns, t1 - t0, memory_order_relaxed);
  if (!f->pack_min_ns || t1 - t0 < f->pack_min_ns) f->pack_min_ns = t1 - t0;
  atomic_fetch_add_explicit(&f->op_ns, fwd_now_ns() - t0, memory_order_relaxed);
}

/* --- tensors --------------------------------------------------------------- */

static void fwd_tensor_created(void *arg, const dev_tensor *t) {
  fwd *f = fwd_of(arg);
  if (!f) return;
  const dev_devset *set = dev_tensor_devset(t);
  uint64_t mask = fwd_ranks_of(f, set);
  if (!mask) return;
  uint32_t devs[PD_MAX_DEVICES];
  Paradev__V1__Shape shapes[PD_MAX_DEVICES], *sp[PD_MAX_DEVICES];
  for (int i = 0; i < set->n; i++) {
    const dev_shape *s = dev_tensor_component_shape(t, i);
    devs[i] = set->dev[i];
    paradev__v1__shape__init(&shapes[i]);
    shapes[i].n_dims = s ? (size_t)s->rank : 0;
    shapes[i].dims = s ? (int64_t *)s->dims : NULL;
    sp[i] = &shapes[i];
  }
  bool nm = false;
  int axis_p1 = 0;
  dev_tensor_layout_marks(t, &nm, &axis_p1);
  Paradev__V1__MeshCreateTensor c;
  paradev__v1__mesh_create_tensor__init(&c);
  c.id = dev_tensor_id(t);
  c.dtype = (Paradev__V1__DType)dev_tensor_dtype(t);
  c.n_devices = (size_t)set->n;
  c.devices = devs;
  c.n_component_shapes = (size_t)set->n;
  c.component_shapes = sp;
  c.pending = dev_tensor_is_pending(t);
  c.not_mirrored = nm;
  c.shard_axis_p1 = (uint32_t)(axis_p1 > 0 ? axis_p1 : 0);
  Paradev__V1__MeshCommand cmd;
  paradev__v1__mesh_command__init(&cmd);
  cmd.kind_case = PARADEV__V1__MESH_COMMAND__KIND_CREATE;
  cmd.create = &c;
  int refused = 0;
  if (!fwd_send_mask(f, mask, &cmd, &refused))
    SRV_DEBUG("mesh: tensor %llu not created on rank %d (not attached)",
              (unsigned long long)c.id, refused);
}

static pd_code fwd_component_write(void *arg, const dev_tensor *t,
                                   int component, uint64_t offset,
                                   const void *data, size_t len,
                                   dev_status *st) {
  fwd *f = fwd_of(arg);
  const dev_devset *set = dev_tensor_devset(t);
  if (!f || component < 0 || component >= set->n)
    return dev_error(st, PD_INTERNAL,
                     "mesh: a write to component %d of a tensor of %d",
                     component, set->n);
  int rank = srv_mesh_device_rank(f->m, set->dev[component]);
  uint8_t *buf = NULL;
  size_t cap = 0;
  pd_code rc = PD_OK;
  size_t done = 0;
  do {
    size_t n = len - done < FWD_CHUNK ? len - done : FWD_CHUNK;
    Paradev__V1__MeshWrite w;
    paradev__v1__mesh_write__init(&w);
    w.id = dev_tensor_id(t);
    w.component = (uint32_t)component;
    w.offset = offset + done;
    w.data.data = (uint8_t *)data + done;
    w.data.len = n;
    Paradev__V1__MeshCommand cmd;
    paradev__v1__mesh_command__init(&cmd);
    cmd.kind_case = PARADEV__V1__MESH_COMMAND__KIND_WRITE;
    cmd.write = &w;
    size_t pl = fwd_pack(&cmd, &buf, &cap);
    if (!pl) {
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "mesh: out of memory packing a write of %zu bytes", n);
      break;
    }
    if (!srv_mesh_send_command(f->m, rank, buf, pl)) {
      rc = srv_mfwd_rank_error(f, rank, st);
      break;
    }
    done += n;
  } while (done < len);
  free(buf);
  return rc;
}

/* A one-field command (complete, release) to the ranks of `t`. */
static void fwd_send_tensor(fwd *f, const dev_tensor *t,
                            const Paradev__V1__MeshCommand *cmd,
                            const char *what) {
  uint64_t mask = fwd_ranks_of(f, dev_tensor_devset(t));
  int refused = 0;
  if (mask && !fwd_send_mask(f, mask, cmd, &refused))
    SRV_DEBUG("mesh: %s of tensor %llu not sent to rank %d", what,
              (unsigned long long)dev_tensor_id(t), refused);
}

static void fwd_tensor_completed(void *arg, const dev_tensor *t, pd_code code,
                                 const char *msg) {
  fwd *f = fwd_of(arg);
  if (!f) return;
  Paradev__V1__MeshComplete c;
  paradev__v1__mesh_complete__init(&c);
  c.id = dev_tensor_id(t);
  c.code = (int32_t)code;
  c.message = (char *)(msg ? msg : "");
  Paradev__V1__MeshCommand cmd;
  paradev__v1__mesh_command__init(&cmd);
  cmd.kind_case = PARADEV__V1__MESH_COMMAND__KIND_COMPLETE;
  cmd.complete = &c;
  fwd_send_tensor(f, t, &cmd, "the completion");
}

/* Sends rank r's batch of releases (ids[0..n)). */
static void fwd_send_releases(fwd *f, int r, uint64_t *ids, size_t n) {
  Paradev__V1__MeshRelease rel;
  paradev__v1__mesh_release__init(&rel);
  rel.n_ids = n;
  rel.ids = ids;
  Paradev__V1__MeshCommand cmd;
  paradev__v1__mesh_command__init(&cmd);
  cmd.kind_case = PARADEV__V1__MESH_COMMAND__KIND_RELEASE;
  cmd.release = &rel;
  int refused = 0;
  if (!fwd_send_mask(f, (uint64_t)1 << r, &cmd, &refused))
    SRV_DEBUG("mesh: %zu releases not sent to rank %d", n, r);
  atomic_fetch_add_explicit(&f->release_msgs, 1, memory_order_relaxed);
}

/* Takes every rank's batch under rel_mu and sends them outside it. */
static void fwd_flush_releases(fwd *f) {
  for (int r = 1; r < f->world; r++) {
    pthread_mutex_lock(&f->rel_mu);
    uint64_t *ids = f->rel[r];
    size_t n = f->nrel[r];
    f->rel[r] = NULL;
    f->nrel[r] = f->caprel[r] = 0;
    pthread_mutex_unlock(&f->rel_mu);
    if (n) fwd_send_releases(f, r, ids, n);
    free(ids);
  }
}

/* The flusher: once releases are pending, waits FWD_RELEASE_DELAY_NS for
 * more to gather, then sends one MeshRelease per rank. */
static void *fwd_release_main(void *arg) {
  fwd *f = arg;
  pthread_mutex_lock(&f->rel_mu);
  while (!f->rel_stop) {
    if (!f->rel_pending) {
      pthread_cond_wait(&f->rel_cv, &f->rel_mu);
      continue;
    }
    f->rel_pending = false;
    pthread_mutex_unlock(&f->rel_mu);
    struct timespec ts = {0, FWD_RELEASE_DELAY_NS};
    nanosleep(&ts, NULL);
    fwd_flush_releases(f);
    pthread_mutex_lock(&f->rel_mu);
  }
  pthread_mutex_unlock(&f->rel_mu);
  return NULL;
}

/* Releases are batched per rank: a release can wait, since the coordinator
 * never names the id again (ids are not reused) and every op reading it
 * was forwarded before (dev_mesh.h). The flusher sends a batch within
 * FWD_RELEASE_DELAY_NS, or this thread at once when one reaches
 * FWD_RELEASE_BATCH ids. */
static void fwd_tensor_released(void *arg, const dev_tensor *t) {
  fwd *f = fwd_of(arg);
  if (!f) return;
  uint64_t mask = fwd_ranks_of(f, dev_tensor_devset(t));
  if (!mask) return;
  uint64_t id = dev_tensor_id(t);
  atomic_fetch_add_explicit(&f->releases, 1, memory_order_relaxed);
  for (int r = 1; r < f->world && r < 64; r++) {
    if (!(mask >> r & 1)) continue;
    uint64_t *full = NULL, one = id;
    size_t nfull = 0;
    pthread_mutex_lock(&f->rel_mu);
    if (f->nrel[r] == f->caprel[r]) {
      size_t c = f->caprel[r] ? f->caprel[r] * 2 : 64;
      uint64_t *nv = realloc(f->rel[r], sizeof(*nv) * c);
      if (nv) {
        f->rel[r] = nv;
        f->caprel[r] = c;
      }
    }
    if (f->nrel[r] < f->caprel[r]) {
      f->rel[r][f->nrel[r]++] = id;
      if (f->nrel[r] >= FWD_RELEASE_BATCH) {
        full = f->rel[r];
        nfull = f->nrel[r];
        f->rel[r] = NULL;
        f->nrel[r] = f->caprel[r] = 0;
      } else if (!f->rel_pending) {
        f->rel_pending = true;
        pthread_cond_signal(&f->rel_cv);
      }
    } else {
      full = &one; /* out of memory: send it alone */
      nfull = 1;
    }
    pthread_mutex_unlock(&f->rel_mu);
    if (nfull) fwd_send_releases(f, r, full, nfull);
    if (full != &one) free(full);
  }
}

/* --- life ------------------------------------------------------------------- */

void srv_mesh_fwd_hooks(srv_mesh *m, dev_mesh_config *cfg) {
  cfg->arg = m;
  cfg->op_submitted = fwd_op_submitted;
  cfg->tensor_created = fwd_tensor_created;
  cfg->component_write = fwd_component_write;
  cfg->component_read = srv_mfwd_component_read;
  cfg->tensor_completed = fwd_tensor_completed;
  cfg->tensor_released = fwd_tensor_released;
  cfg->remote_wait = srv_mfwd_remote_wait;
  cfg->local_done = NULL;
}

int srv_mesh_fwd_create(srv_mesh *m) {
  int world = srv_mesh_world_size(m), per = srv_mesh_devices_per_rank(m);
  if (world < 1 || world > 64 || per < 1 || world * per > PD_MAX_DEVICES) {
    SRV_ERROR(
        "mesh: %d ranks of %d devices: the mesh takes at most %d "
        "devices",
        world, per, PD_MAX_DEVICES);
    return -1;
  }
  fwd *f = calloc(1, sizeof *f);
  if (!f) goto oom;
  f->m = m;
  f->world = world;
  f->per_rank = per;
  f->ndev = world * per;
  f->dev = calloc((size_t)f->ndev, sizeof *f->dev);
  f->rank = calloc((size_t)world, sizeof *f->rank);
  f->rel = calloc((size_t)world, sizeof *f->rel);
  f->nrel = calloc((size_t)world, sizeof *f->nrel);
  f->caprel = calloc((size_t)world, sizeof *f->caprel);
  if (!f->dev || !f->rank || !f->rel || !f->nrel || !f->caprel) goto oom;
  pthread_mutex_init(&f->rel_mu, NULL);
  pthread_cond_init(&f->rel_cv, NULL);
  if (pthread_create(&f->rel_thread, NULL, fwd_release_main, f) != 0) {
    pthread_mutex_destroy(&f->rel_mu);
    pthread_cond_destroy(&f->rel_cv);
    goto oom;
  }
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->read_cv, NULL);
  for (int i = 0; i < f->ndev; i++) pthread_cond_init(&f->dev[i].cv, NULL);
  srv_mesh_set_data(m, f);
  return 0;
oom:
  if (f) {
    free(f->dev);
    free(f->rank);
    free(f->rel);
    free(f->nrel);
    free(f->caprel);
    free(f);
  }
  SRV_ERROR(
      "mesh: out of memory (or threads) making the coordinator's "
      "data plane");
  return -1;
}

void srv_mesh_fwd_destroy(srv_mesh *m) {
  fwd *f = srv_mesh_data(m);
  if (!f) return;
  pthread_mutex_lock(&f->rel_mu);
  f->rel_stop = true;
  pthread_cond_signal(&f->rel_cv);
  pthread_mutex_unlock(&f->rel_mu);
  pthread_join(f->rel_thread, NULL);
  fwd_flush_releases(f);
  uint64_t rels = atomic_load(&f->releases);
  if (rels)
    SRV_INFO("mesh: forwarded %llu releases in %llu messages",
             (unsigned long long)rels,
             (unsigned long long)atomic_load(&f->release_msgs));
  uint64_t ops = atomic_load(&f->ops);
  if (ops)
    SRV_INFO(
        "mesh: forwarded %llu ops: %.2f us each to pack (%.2f at "
        "least), %.2f us with the queueing, %.0f bytes each",
        (unsigned long long)ops,
        (double)atomic_load(&f->pack_ns) / (double)ops / 1e3,
        (double)f->pack_min_ns / 1e3,
        (double)atomic_load(&f->op_ns) / (double)ops / 1e3,
        (double)atomic_load(&f->op_bytes) / (double)ops);
  for (int i = 0; i < f->ndev; i++) {
    for (size_t k = 0; k < f->dev[i].nfails; k++) free(f->dev[i].fails[k].msg);
    free(f->dev[i].fails);
    pthread_cond_destroy(&f->dev[i].cv);
  }
  pthread_cond_destroy(&f->read_cv);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->rel_cv);
  pthread_mutex_destroy(&f->rel_mu);
  free(f->rel);
  free(f->nrel);
  free(f->caprel);
  free(f->opbuf);
  free(f->dev);
  free(f->rank);
  free(f);
  srv_mesh_set_data(m, NULL);
}
