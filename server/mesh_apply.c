/* A rank's data plane (issue #16, server/mesh.h): the coordinator's
 * MeshCommands replayed on this rank's engine in the order they came, and
 * the engine's local_done turned into MeshProgress for the coordinator.
 *
 * Tensors. A table id -> dev_tensor (the coordinator's engine ids, which
 * every rank shares): uploads made by create / write / complete, op outputs
 * recorded when the op is submitted, entries dropped by release. An id
 * whose making failed here (a refused op, a create over the memory limit, a
 * command naming an id this rank never saw) is kept as a failed entry with
 * its code and message, so every later op that reads it fails the same way
 * and reports it.
 *
 * Failed commands and the coordinator's view. The coordinator waits, for
 * every op on each of this rank's devices, until our MeshProgress says the
 * device has done that seq (done_seq >= seq) and takes the failure we list
 * for it, if any. An op that never reaches the engine (refused) has no
 * local_done, so we make one: a MeshFailure for its seq on each local device
 * of its set. It must not come early: done_seq = S promises every op <= S on
 * the device finished (the coordinator's executor takes the outcome of
 * earlier ops from it), so the failure of seq S on device d waits until
 * local_done reported the last op submitted to d before it (`after`);
 * earlier ops still running keep their own outcomes. Ops the engine ran
 * after it on d have higher seqs and report after `after`, so the order per
 * device holds. (ap_defer, ap_local_done.)
 *
 * Progress is coalesced by a sender thread: local_done (an engine thread)
 * only records under a short lock and wakes the sender when it sleeps; the
 * sender sends at once when it has been idle, at most every AP_SEND_GAP_NS
 * when busy, one packed RankMessage with every device that moved.
 *
 * Reads are answered by a worker thread (dev_tensor_wait, then
 * dev_tensor_read of the component), so a large read does not hold up later
 * commands. drop_all bumps a generation: answers of reads queued before it
 * are dropped.
 *
 * Progress and reads are in mesh_apply_progress.c, the state in
 * mesh_data.h. Locks: `mu` (the table), `pmu` (progress), `rmu` (the read
 * queue); none
 * nests another, and none is held across a call into the engine that can
 * block or a send. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "log.h"
#include "mesh_data.h"
#include "server.h"

#define AP_LOG_LIMIT 20 /* warnings of failed commands before debug */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "convert.h"
#include "log.h"
#include "mesh.h"
#include "server.h"

static dev_engine *ap_engine(apply *a) {
  srv *s = srv_mesh_server(a->m);
  return s ? s->engine : NULL;
}

/* --- the table --------------------------------------------------------------- */

static size_t ap_hash(uint64_t id, size_t cap) {
  return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static ap_slot *ap_find(apply *a, uint64_t id) {
  if (!a->cap) return NULL;
  for (size_t i = ap_hash(id, a->cap);; i = (i + 1) & (a->cap - 1)) {
    if (a->slots[i].id == id) return &a->slots[i];
    if (!a->slots[i].id) return NULL;
  }
}

static bool ap_grow(apply *a) {
  size_t nc = a->cap ? a->cap * 2 : 1024;
  ap_slot *ns = calloc(nc, sizeof *ns);
  if (!ns) return false;
  for (size_t i = 0; i < a->cap; i++) {
    if (!a->slots[i].id) continue;
    size_t j = ap_hash(a->slots[i].id, nc);
    while (ns[j].id) j = (j + 1) & (nc - 1);
    ns[j] = a->slots[i];
  }
  free(a->slots);
  a->slots = ns;
  a->cap = nc;
  return true;
}

/* Removes slot `s` (backward-shift deletion: no tombstones). */
static void ap_erase(apply *a, ap_slot *s) {
  size_t i = (size_t)(s - a->slots);
  a->slots[i] = (ap_slot){0};
  a->used--;
  for (size_t j = (i + 1) & (a->cap - 1); a->slots[j].id;
       j = (j + 1) & (a->cap - 1)) {
    size_t h = ap_hash(a->slots[j].id, a->cap);
    /* Slot j may move to the hole i when its home is not in (i, j]. */
    if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
      a->slots[i] = a->slots[j];
      a->slots[j] = (ap_slot){0};
      i = j;
    }
  }
}

/* Drops what slot `s` holds (its tensor or failure) and frees the slot. */
static void ap_slot_drop(apply *a, ap_slot *s, dev_tensor **release) {
  *release = s->t;
  if (s->t) a->ntensors--;
  free(s->msg);
  ap_erase(a, s);
}

/* id -> tensor `t` (taking the caller's reference) or, with t NULL, the
 * failure code / msg. A former entry of the id is dropped. */
static void ap_put(apply *a, uint64_t id, dev_tensor *t, pd_code code,
                   const char *msg) {
  dev_tensor *old = NULL;
  pthread_mutex_lock(&a->mu);
  ap_slot *s = ap_find(a, id);
  if (s) ap_slot_drop(a, s, &old);
  if ((a->used + 1) * 10 > a->cap * 7 && !ap_grow(a)) {
    pthread_mutex_unlock(&a->mu);
    SRV_ERROR("mesh: out of memory recording tensor %llu",
              (unsigned long long)id);
    dev_tensor_release(t);
    dev_tensor_release(old);
    return;
  }
  size_t i = ap_hash(id, a->cap);
  while (a->slots[i].id) i = (i + 1) & (a->cap - 1);
  a->slots[i] = (ap_slot){id, t, code, t ? NULL : strdup(msg ? msg : "")};
  a->used++;
  if (t) a->ntensors++;
  pthread_mutex_unlock(&a->mu);
  dev_tensor_release(old);
}

/* The tensor of `id` with a reference for the caller, or its failure in
 * `st` (NOT_FOUND-like INTERNAL for an id this rank never saw). */
static dev_tensor *ap_get(apply *a, uint64_t id, dev_status *st) {
  pthread_mutex_lock(&a->mu);
  ap_slot *s = ap_find(a, id);
  dev_tensor *t = s ? s->t : NULL;
  if (t)
    dev_tensor_retain(t);
  else if (s)
    dev_error(st, s->code, "%s", s->msg ? s->msg : "failed");
  else
    dev_error(st, PD_INTERNAL,
              "rank %d holds no tensor %llu (the coordinator's commands "
              "and this rank's tensors disagree)",
              srv_mesh_rank(a->m), (unsigned long long)id);
  pthread_mutex_unlock(&a->mu);
  return t;
}

/* --- commands ------------------------------------------------------------------ */

static void *ap_arena_alloc(void *data, size_t size) {
  ap_arena *ar = data;
  size = (size + 15) & ~(size_t)15;
  if (size <= sizeof ar->buf - ar->used) {
    void *p = ar->buf + ar->used;
    ar->used += size;
    return p;
  }
  if (ar->nbig == ar->capbig) {
    size_t c = ar->capbig ? ar->capbig * 2 : 8;
    void **nb = realloc(ar->big, sizeof(*nb) * c);
    if (!nb) return NULL;
    ar->big = nb;
    ar->capbig = c;
  }
  void *p = malloc(size);
  if (p) ar->big[ar->nbig++] = p;
  return p;
}

static void ap_arena_free(void *data, void *p) {
  (void)data;
  (void)p; /* freed at the reset */
}

static void ap_arena_reset(ap_arena *ar) {
  for (size_t i = 0; i < ar->nbig; i++) free(ar->big[i]);
  ar->nbig = 0;
  ar->used = 0;
}

/* A failed command's log line: the first AP_LOG_LIMIT as warnings. */
static void ap_log(apply *a, const char *what, uint64_t n, const char *msg) {
  if (a->logged++ < AP_LOG_LIMIT)
    SRV_WARN("mesh: %s %llu failed on rank %d: %s%s", what,
             (unsigned long long)n, srv_mesh_rank(a->m), msg,
             a->logged == AP_LOG_LIMIT ? " (further ones at debug)" : "");
  else
    SRV_DEBUG("mesh: %s %llu failed on rank %d: %s", what,
              (unsigned long long)n, srv_mesh_rank(a->m), msg);
}

static bool ap_devset(dev_engine *e, const uint32_t *devs, size_t n,
                      dev_devset *out, dev_status *st) {
  int nd = dev_engine_num_devices(e);
  if (n < 1 || n > PD_MAX_DEVICES) {
    dev_error(st, PD_INTERNAL, "a device set of %zu devices", n);
    return false;
  }
  out->n = (int)n;
  for (size_t i = 0; i < n; i++) {
    if ((int)devs[i] >= nd) {
      dev_error(st, PD_INTERNAL, "device %u: the mesh has %d", devs[i], nd);
      return false;
    }
    out->dev[i] = (uint8_t)devs[i];
  }
  return true;
}

static void ap_op(apply *a, dev_engine *e, const Paradev__V1__MeshOp *c) {
  dev_status st = DEV_STATUS_INIT;
  dev_devset set;
  dev_tensor *ins[DEV_MAX_INPUTS];
  dev_attr attrs[DEV_MAX_ATTRS];
  size_t ni = 0;
  dev_op *op = NULL;
  bool have_set = ap_devset(e, c->devices, c->n_devices, &set, &st);
  const char *name = c->op ? c->op : "";
  if (!have_set) goto failed;
  if (c->n_inputs > DEV_MAX_INPUTS) {
    dev_error(&st, PD_INTERNAL, "%zu inputs", c->n_inputs);
    goto failed;
  }
  for (; ni < c->n_inputs; ni++)
    if (!(ins[ni] = ap_get(a, c->inputs[ni], &st))) goto failed;
  srv_req_limits lim = {1 << 20, 4096, dev_engine_num_devices(e)};
  if (srv_attrs_from_pb(&lim, "op", (int)c->seq, name, c->attrs, c->n_attrs,
                        attrs, &st) != PD_OK)
    goto failed;
  if (dev_op_prepare_on(e, &set, name, ins, (int)ni, attrs, (int)c->n_attrs,
                        &op, &st) != PD_OK)
    goto failed;
  if ((size_t)dev_op_num_outputs(op) != c->n_outputs) {
    dev_error(&st, PD_INTERNAL,
              "%s made %d outputs here; the coordinator's made %zu", name,
              dev_op_num_outputs(op), c->n_outputs);
    dev_op_abandon(op, st.code, st.msg);
    goto failed;
  }
  set = *dev_op_devset(op);
  for (size_t i = 0; i < c->n_outputs; i++) {
    dev_tensor *t = dev_op_output(op, (int)i);
    dev_tensor_retain(t);
    ap_put(a, c->outputs[i], t, PD_OK, NULL);
  }
  srv_mapp_in_submit = true;
  pd_code rc = dev_op_submit_seq(e, op, c->seq, &st);
  srv_mapp_in_submit = false;
  if (rc != PD_OK) {
    /* Abandoned by the engine: its outputs (recorded) fail with st. */
    ap_log(a, "op", c->seq, st.msg);
    srv_mapp_defer(a, &set, c->seq, &st);
  } else {
    for (int i = 0; i < set.n; i++)
      if (set.dev[i] >= a->first && set.dev[i] < a->first + a->count)
        a->dev[set.dev[i] - a->first].last_sub = c->seq;
  }
  for (size_t i = 0; i < ni; i++) dev_tensor_release(ins[i]);
  return;
failed:
  for (size_t i = 0; i < ni; i++) dev_tensor_release(ins[i]);
  ap_log(a, "op", c->seq, st.msg);
  for (size_t i = 0; i < c->n_outputs; i++)
    ap_put(a, c->outputs[i], NULL, st.code, st.msg);
  if (have_set) srv_mapp_defer(a, &set, c->seq, &st);
}

static void ap_create(apply *a, dev_engine *e,
                      const Paradev__V1__MeshCreateTensor *c) {
  dev_status st = DEV_STATUS_INIT;
  dev_devset set;
  dev_shape comps[PD_MAX_DEVICES];
  pd_dtype dt = PD_DTYPE_INVALID;
  dev_tensor *t = NULL;
  if (!ap_devset(e, c->devices, c->n_devices, &set, &st)) goto failed;
  if (c->n_component_shapes != c->n_devices) {
    dev_error(&st, PD_INTERNAL, "%zu component shapes for %zu devices",
              c->n_component_shapes, c->n_devices);
    goto failed;
  }
  if (srv_dtype_from_pb((int)c->dtype, "dtype", &dt, &st) != PD_OK) goto failed;
  for (size_t i = 0; i < c->n_devices; i++)
    if (srv_shape_from_pb(c->component_shapes[i], "component shape", &comps[i],
                          &st) != PD_OK)
      goto failed;
  dev_layout per = {DEV_LAYOUT_PER_COMPONENT, 0, 0};
  pd_code rc = c->pending ? dev_tensor_create_pending_on(e, &set, dt, &per,
                                                         NULL, comps, &t, &st)
                          : dev_tensor_create_on(e, &set, dt, comps, &t, &st);
  if (rc != PD_OK) goto failed;
  dev_tensor_set_layout_marks(t, c->not_mirrored, (int)c->shard_axis_p1);
  ap_put(a, c->id, t, PD_OK, NULL);
  return;
failed:
  ap_log(a, "tensor", c->id, st.msg);
  ap_put(a, c->id, NULL, st.code, st.msg);
}

static void ap_write(apply *a, const Paradev__V1__MeshWrite *w) {
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *t = ap_get(a, w->id, &st);
  if (!t) return; /* failed already (logged then) */
  dev_layout per = {DEV_LAYOUT_PER_COMPONENT, 0, (int)w->component};
  if (dev_tensor_write(t, &per, (int)w->component, w->offset, w->data.data,
                       w->data.len, &st) != PD_OK) {
    ap_log(a, "write to tensor", w->id, st.msg);
    ap_put(a, w->id, NULL, st.code, st.msg);
  }
  dev_tensor_release(t);
}

static void ap_complete(apply *a, const Paradev__V1__MeshComplete *c) {
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *t = ap_get(a, c->id, &st);
  if (!t) return;
  dev_tensor_complete(t, (pd_code)c->code, c->message ? c->message : "");
  dev_tensor_release(t);
}

static void ap_release(apply *a, const Paradev__V1__MeshRelease *r) {
  for (size_t i = 0; i < r->n_ids; i++) {
    dev_tensor *t = NULL;
    pthread_mutex_lock(&a->mu);
    ap_slot *s = ap_find(a, r->ids[i]);
    if (s) ap_slot_drop(a, s, &t);
    pthread_mutex_unlock(&a->mu);
    if (!s)
      SRV_DEBUG("mesh: release of tensor %llu, which rank %d does not hold",
                (unsigned long long)r->ids[i], srv_mesh_rank(a->m));
    dev_tensor_release(t);
  }
}

static void ap_read_cmd(apply *a, const Paradev__V1__MeshRead *c) {
  ap_read *r = calloc(1, sizeof *r);
  if (!r) {
    SRV_ERROR("mesh: out of memory queueing read %llu",
              (unsigned long long)c->request);
    return; /* the coordinator's read waits until the rank is lost */
  }
  dev_status st = DEV_STATUS_INIT;
  r->request = c->request;
  r->component = (int)c->component;
  r->offset = c->offset;
  r->length = c->length;
  if (!(r->t = ap_get(a, c->id, &st))) {
    r->code = st.code;
    snprintf(r->msg, sizeof r->msg, "%s", st.msg);
  }
  pthread_mutex_lock(&a->rmu);
  r->gen = a->gen;
  if (a->rtail)
    a->rtail->next = r;
  else
    a->rhead = r;
  a->rtail = r;
  pthread_cond_broadcast(&a->rcv);
  pthread_mutex_unlock(&a->rmu);
}

void srv_mesh_apply_commands(srv_mesh *m, const ProtobufCBinaryData *cmds,
                             size_t n) {
  apply *a = srv_mesh_data(m);
  dev_engine *e = a ? ap_engine(a) : NULL;
  if (!e) return;
  ProtobufCAllocator alloc = {ap_arena_alloc, ap_arena_free, &a->arena};
  for (size_t i = 0; i < n; i++) {
    uint64_t t0 = ap_now_ns();
    Paradev__V1__MeshCommand *c =
        paradev__v1__mesh_command__unpack(&alloc, cmds[i].len, cmds[i].data);
    uint64_t t1 = ap_now_ns();
    if (!c) {
      SRV_ERROR(
          "mesh: rank %d got a command of %zu bytes that does not "
          "parse; dropped",
          srv_mesh_rank(m), cmds[i].len);
      ap_arena_reset(&a->arena);
      continue;
    }
    switch (c->kind_case) {
      case PARADEV__V1__MESH_COMMAND__KIND_OP: {
        ap_op(a, e, c->op);
        uint64_t t2 = ap_now_ns();
        a->ops++;
        a->unpack_ns += t1 - t0;
        a->op_ns += t2 - t0;
        if (!a->op_min_ns || t2 - t0 < a->op_min_ns) a->op_min_ns = t2 - t0;
        break;
      }
      case PARADEV__V1__MESH_COMMAND__KIND_CREATE:
        ap_create(a, e, c->create);
        break;
      case PARADEV__V1__MESH_COMMAND__KIND_WRITE: ap_write(a, c->write); break;
      case PARADEV__V1__MESH_COMMAND__KIND_COMPLETE:
        ap_complete(a, c->complete);
        break;
      case PARADEV__V1__MESH_COMMAND__KIND_RELEASE:
        ap_release(a, c->release);
        break;
      case PARADEV__V1__MESH_COMMAND__KIND_READ: ap_read_cmd(a, c->read); break;
      case PARADEV__V1__MESH_COMMAND__KIND_DROP_ALL:
        srv_mesh_apply_drop_all(m, c->drop_all->reason ? c->drop_all->reason
                                                       : "the coordinator "
                                                         "asked");
        break;
      default:
        SRV_WARN(
            "mesh: rank %d got a command of an unknown kind (%d); "
            "ignored",
            srv_mesh_rank(m), (int)c->kind_case);
    }
    ap_arena_reset(&a->arena);
  }
}

void srv_mesh_apply_drop_all(srv_mesh *m, const char *why) {
  apply *a = srv_mesh_data(m);
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  ap_slot *slots = a->slots;
  size_t cap = a->cap, nt = a->ntensors;
  a->slots = NULL;
  a->cap = a->used = a->ntensors = 0;
  pthread_mutex_unlock(&a->mu);
  pthread_mutex_lock(&a->rmu);
  a->gen++;
  ap_read *q = a->rhead;
  a->rhead = a->rtail = NULL;
  /* A read being answered holds its tensor until it is read (bounded by
   * AP_READ_WAIT_S): after drop_all the rank holds none. */
  while (a->reading) pthread_cond_wait(&a->rcv, &a->rmu);
  pthread_mutex_unlock(&a->rmu);
  while (q) {
    ap_read *nx = q->next;
    dev_tensor_release(q->t);
    free(q);
    q = nx;
  }
  pthread_mutex_lock(&a->pmu);
  for (int i = 0; i < a->count; i++) {
    srv_mapp_fails_clear(&a->dev[i].out);
    srv_mapp_fails_clear(&a->dev[i].deferred);
  }
  pthread_mutex_unlock(&a->pmu);
  for (size_t i = 0; i < cap; i++) {
    free(slots[i].msg);
    dev_tensor_release(slots[i].t);
  }
  free(slots);
  if (nt)
    SRV_WARN("mesh: rank %d dropped its %zu tensors: %s", srv_mesh_rank(m), nt,
             why ? why : "");
  else
    SRV_DEBUG("mesh: rank %d holds no tensors to drop: %s", srv_mesh_rank(m),
              why ? why : "");
}

size_t srv_mesh_apply_tensors(srv_mesh *m) {
  apply *a = srv_mesh_data(m);
  if (!a) return 0;
  pthread_mutex_lock(&a->mu);
  size_t n = a->ntensors;
  pthread_mutex_unlock(&a->mu);
  return n;
}

/* --- life ------------------------------------------------------------------- */

void srv_mesh_apply_hooks(srv_mesh *m, dev_mesh_config *cfg) {
  cfg->arg = m;
  cfg->local_done = srv_mapp_local_done;
}

int srv_mesh_apply_create(srv_mesh *m) {
  apply *a = calloc(1, sizeof *a);
  int per = srv_mesh_devices_per_rank(m);
  if (!a || per < 1 || per > PD_MAX_DEVICES) {
    free(a);
    SRV_ERROR("mesh: cannot make rank %d's data plane (%d devices)",
              srv_mesh_rank(m), per);
    return -1;
  }
  a->m = m;
  a->first = srv_mesh_rank(m) * per;
  a->count = per;
  if (!(a->dev = calloc((size_t)per, sizeof *a->dev))) {
    free(a);
    SRV_ERROR("mesh: out of memory making rank %d's data plane",
              srv_mesh_rank(m));
    return -1;
  }
  pthread_mutex_init(&a->mu, NULL);
  pthread_mutex_init(&a->pmu, NULL);
  pthread_cond_init(&a->pcv, NULL);
  pthread_mutex_init(&a->rmu, NULL);
  pthread_cond_init(&a->rcv, NULL);
  srv_mesh_set_data(m, a);
  if (pthread_create(&a->sender, NULL, srv_mapp_sender_main, a) != 0)
    goto nothreads;
  if (pthread_create(&a->reader, NULL, srv_mapp_reader_main, a) != 0) {
    pthread_mutex_lock(&a->pmu);
    a->stop = true;
    pthread_cond_signal(&a->pcv);
    pthread_mutex_unlock(&a->pmu);
    pthread_join(a->sender, NULL);
    goto nothreads;
  }
  return 0;
nothreads:
  srv_mesh_set_data(m, NULL);
  free(a->dev);
  free(a);
  SRV_ERROR("mesh: cannot start rank %d's data plane threads",
            srv_mesh_rank(m));
  return -1;
}

void srv_mesh_apply_destroy(srv_mesh *m) {
  apply *a = srv_mesh_data(m);
  if (!a) return;
  if (a->ops)
    SRV_INFO(
        "mesh: rank %d applied %llu ops: %.2f us each to unpack, %.2f us "
        "with the prepare and submit (%.2f at least)",
        srv_mesh_rank(m), (unsigned long long)a->ops,
        (double)a->unpack_ns / (double)a->ops / 1e3,
        (double)a->op_ns / (double)a->ops / 1e3, (double)a->op_min_ns / 1e3);
  pthread_mutex_lock(&a->pmu);
  a->stop = true;
  pthread_cond_signal(&a->pcv);
  pthread_mutex_unlock(&a->pmu);
  pthread_join(a->sender, NULL);
  pthread_mutex_lock(&a->rmu);
  a->rstop = true;
  pthread_cond_broadcast(&a->rcv);
  pthread_mutex_unlock(&a->rmu);
  pthread_join(a->reader, NULL);
  /* The engine is gone by now (mesh.h's order): its tensors must have been
   * dropped before it (srv_mesh_stop), so none is released here. */
  if (a->ntensors)
    SRV_ERROR(
        "mesh: rank %d still holds %zu tensors at its end (they "
        "should have been dropped before the engine stopped); left "
        "as they are",
        srv_mesh_rank(m), a->ntensors);
  for (size_t i = 0; i < a->cap; i++) free(a->slots[i].msg);
  free(a->slots);
  for (ap_read *q = a->rhead, *nx; q; q = nx) {
    nx = q->next;
    free(q);
  }
  for (int i = 0; i < a->count; i++) {
    srv_mapp_fails_clear(&a->dev[i].out);
    srv_mapp_fails_clear(&a->dev[i].deferred);
    free(a->dev[i].out.v);
    free(a->dev[i].deferred.v);
  }
  ap_arena_reset(&a->arena);
  free(a->arena.big);
  pthread_mutex_destroy(&a->mu);
  pthread_mutex_destroy(&a->pmu);
  pthread_cond_destroy(&a->pcv);
  pthread_mutex_destroy(&a->rmu);
  pthread_cond_destroy(&a->rcv);
  free(a->dev);
  free(a);
  srv_mesh_set_data(m, NULL);
}
