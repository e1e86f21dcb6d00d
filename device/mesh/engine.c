/* The engine's side of a mesh across machines (issue #16, dev_mesh.h):
 * its place in the mesh, the coordinator's hooks as the engine's files call
 * them, a rank's progress reports, the transport's replacement, the seq
 * accessors, the placement refusal, and what the hooks read (tensor ids,
 * layout marks, an op's parts). Calls no engine file back (mesh_int.h). */
#include <stdio.h>
#include <string.h>

#include "mesh_int.h"

int dev_engine_mesh_rank(const dev_engine *e) {
  return e->mesh ? e->mesh->rank : 0;
}

int dev_engine_mesh_world_size(const dev_engine *e) {
  return e->mesh ? e->mesh->world : 1;
}

void dev_engine_local_devices(const dev_engine *e, int *first, int *count) {
  *first = e->mesh ? e->mesh->first : 0;
  *count = e->mesh ? e->mesh->n_local : e->n;
}

bool dev_engine_device_is_local(const dev_engine *e, int device) {
  return device >= 0 && device < e->n && !dev__mesh_remote(e->mesh, device);
}

void dev_engine_mesh_set_transport(dev_engine *e, dev_mesh_transport *t) {
  dev__mesh *m = e->mesh;
  if (!m) return; /* no mesh: no cross-rank collective ever needs one */
  if (t) t->retain(t);
  pthread_mutex_lock(&m->tmu);
  dev_mesh_transport *old = m->transport;
  m->transport = t;
  pthread_mutex_unlock(&m->tmu);
  if (old) old->release(old); /* running collectives hold their own */
}

uint64_t dev_engine_last_seq(dev_engine *e) {
  return atomic_load_explicit(&e->last_seq, memory_order_relaxed);
}

void dev_engine_advance_seq(dev_engine *e, uint64_t seq) {
  pthread_mutex_lock(&e->submit_mu);
  if (e->seq < seq) {
    e->seq = seq;
    atomic_store_explicit(&e->last_seq, seq, memory_order_relaxed);
  }
  pthread_mutex_unlock(&e->submit_mu);
}

/* --- coordinator hooks -------------------------------------------------------- */

static const dev_mesh_config *coord(const dev_engine *e) {
  return e->mesh && e->mesh->rank == 0 ? &e->mesh->cfg : NULL;
}

void dev__mesh_op_submitted(dev_engine *e, dev_op *op) {
  const dev_mesh_config *c = coord(e);
  if (!c) return;
  for (int o = 0; o < op->num_outputs; o++) op->outputs[o]->mesh_known = true;
  if (c->op_submitted) c->op_submitted(c->arg, op);
}

void dev__mesh_tensor_created(dev_tensor *t) {
  const dev_mesh_config *c = coord(t->engine);
  if (!c) return;
  t->mesh_known = true;
  if (c->tensor_created) c->tensor_created(c->arg, t);
}

void dev__mesh_tensor_completed(dev_tensor *t, pd_code code, const char *msg) {
  const dev_mesh_config *c = coord(t->engine);
  if (c && t->mesh_known && c->tensor_completed)
    c->tensor_completed(c->arg, t, code, msg ? msg : "");
}

void dev__mesh_tensor_released(dev_tensor *t) {
  const dev_mesh_config *c = coord(t->engine);
  if (c && t->mesh_known && c->tensor_released) c->tensor_released(c->arg, t);
}

pd_code dev__mesh_component_write(dev_tensor *t, int comp, uint64_t off,
                                  const void *data, size_t len,
                                  dev_status *st) {
  const dev_mesh_config *c = coord(t->engine);
  if (!c || !c->component_write || len == 0) return PD_OK;
  return c->component_write(c->arg, t, comp, off, data, len, st);
}

pd_code dev__mesh_component_read(dev_tensor *t, int comp, uint64_t off,
                                 void *data, size_t len, dev_status *st) {
  const dev_mesh_config *c = coord(t->engine);
  const dev__mesh *m = t->engine->mesh;
  const int d = t->set.dev[comp];
  if (!c || !c->component_read)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "component %d is on device %d, which is rank %d's; this "
                     "engine is rank %d: read it on its own rank",
                     comp, d, dev__mesh_rank_of(m, d), m->rank);
  if (len == 0) return PD_OK;
  return c->component_read(c->arg, t, comp, off, data, len, st);
}

pd_code dev__mesh_remote_wait(dev_engine *e, int d, uint64_t seq,
                              dev_status *st) {
  const dev_mesh_config *c = coord(e);
  if (!c || !c->remote_wait) return PD_OK;
  dev_status w = DEV_STATUS_INIT;
  if (c->remote_wait(c->arg, d, seq, &w) == PD_OK) return PD_OK;
  return dev_error(st, w.code == PD_OK ? PD_UNKNOWN : w.code, "%s", w.msg);
}

/* --- ranks' progress ---------------------------------------------------------- */

bool dev__mesh_reports(const dev_engine *e, int d) {
  const dev__mesh *m = e->mesh;
  return m && m->rank != 0 && m->cfg.local_done && !dev__mesh_remote(m, d);
}

pd_code dev__mesh_done_info(const dev_op *op, int d, char *msg, size_t len) {
  msg[0] = '\0';
  for (int i = 0; i < op->num_outputs; i++) {
    const int ci = dev__slot(op->outputs[i], d);
    if (ci < 0) continue;
    const dev_component *c = &op->outputs[i]->comps[ci];
    pd_code code = atomic_load(&c->code);
    if (code != PD_OK) { /* named globally: the backend names its own */
      snprintf(msg, len, "mesh device %d (rank %d): %s", d,
               op->engine->mesh->rank, c->msg ? c->msg : "");
      return code;
    }
  }
  return PD_OK;
}

void dev__mesh_local_done(dev_engine *e, int d, uint64_t seq, pd_code code,
                          const char *msg) {
  const dev_mesh_config *c = &e->mesh->cfg;
  c->local_done(c->arg, d, seq, code, msg);
}

/* --- refusals ------------------------------------------------------------------ */

pd_code dev__mesh_check_placement(const dev_engine *e, const dev_op_def *def,
                                  const dev_devset *set, dev_status *st) {
  const dev__mesh *m = e->mesh;
  if (!m || set->n == 0) return PD_OK;
  const int r0 = dev__mesh_rank_of(m, set->dev[0]);
  for (int i = 1; i < set->n; i++) {
    const int r = dev__mesh_rank_of(m, set->dev[i]);
    if (r == r0) continue;
    char sb[DEV_DEVSET_STR_MAX];
    return dev_error(st, PD_UNIMPLEMENTED,
                     "%s: its devices %s span ranks of the mesh (device %d is "
                     "rank %d's, device %d rank %d's); placement ops across "
                     "machines are not available yet: keep ParallelPack, "
                     "ParallelUnpack and CopyToDevices within one rank's "
                     "devices (%d per rank)",
                     def->name, dev_devset_str(set, sb, sizeof sb),
                     set->dev[0], r0, set->dev[i], r, m->n_local);
  }
  return PD_OK;
}

/* --- what the hooks read -------------------------------------------------------- */

uint64_t dev_tensor_id(const dev_tensor *t) { return t->id; }

void dev_tensor_layout_marks(const dev_tensor *t, bool *not_mirrored,
                             int *shard_axis_p1) {
  if (not_mirrored) *not_mirrored = t->not_mirrored;
  if (shard_axis_p1) *shard_axis_p1 = t->shard_axis_p1;
}

void dev_tensor_set_layout_marks(dev_tensor *t, bool not_mirrored,
                                 int shard_axis_p1) {
  t->not_mirrored = not_mirrored;
  t->shard_axis_p1 = (unsigned char)(shard_axis_p1 < 0 ? 0 : shard_axis_p1);
}

uint64_t dev_op_seq(const dev_op *op) { return op->seq; }
const dev_op_def *dev_op_definition(const dev_op *op) { return op->def; }
const char *dev_op_name(const dev_op *op) { return op->def->name; }
int dev_op_num_inputs(const dev_op *op) { return op->num_inputs; }
dev_tensor *dev_op_input(const dev_op *op, int i) {
  return i >= 0 && i < op->num_inputs ? op->inputs[i] : NULL;
}
const dev_attr_value *dev_op_attr_values(const dev_op *op) {
  return op->attrs;
}
