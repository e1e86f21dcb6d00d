/* Placement (issue #17): where an op runs, and the three ops that move a
 * value between device sets.
 *
 * dev_op_prepare_on is the entry of every op's preparation: the ordinary
 * ops go to prepare.c (dev__op_prepare_plain: they run on their inputs'
 * one set); ParallelPack, ParallelUnpack and CopyToDevices (defined in
 * ops/placement.c) are prepared here, since their outputs live on other
 * sets than their inputs: the op's participant set (dev_op.set) is the
 * union of its inputs' and outputs' sets, and each of those devices'
 * executors calls dev__place_run for its part:
 *   ParallelPack    output component i shares input i's buffer (device i);
 *   ParallelUnpack  output i shares the input's component i;
 *   CopyToDevices   each destination device allocates its component and
 *                   copies its source component into it with
 *                   backend->copy_d2d, once the source device has finished
 *                   the op producing it (a peer copy on CUDA).
 * Pack and unpack allocate nothing (dev_op_new_bytes is 0 for them).
 *
 * A placement op keeps its holds on its inputs until every device of its
 * set is done (engine.c per_device_release; complete.c keeps them past
 * issue), as a collective does: a destination reads a source component on
 * another device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec_int.h"
#include "mesh/mesh_int.h"

pd_code dev_op_prepare(dev_engine *e, const char *op_name,
                       dev_tensor *const *inputs, int num_inputs,
                       const dev_attr *attrs, int num_attrs, dev_op **out,
                       dev_status *st) {
  return dev_op_prepare_on(e, NULL, op_name, inputs, num_inputs, attrs,
                           num_attrs, out, st);
}

/* Adds s's devices missing from *u to it, in order. */
static void set_union(dev_devset *u, const dev_devset *s) {
  for (int i = 0; i < s->n; i++)
    if (dev_devset_index(u, s->dev[i]) < 0) u->dev[u->n++] = s->dev[i];
}

/* Creates output o of op on `set` with `shapes` (not yet allocated nor
 * submitted). */
static pd_code place_output(dev_engine *e, dev_op *op, int o,
                            const dev_devset *set, pd_dtype dt,
                            const dev_shape *shapes, dev_status *st) {
  PD_TRY(dev__tensor_new(e, set, dt, shapes, &op->outputs[o], st));
  op->num_outputs = o + 1;
  for (int c = 0; c < set->n; c++)
    atomic_store(&op->outputs[o]->comps[c].ready_seq, UINT64_MAX);
  return PD_OK;
}

static pd_code prepare_pack(dev_engine *e, dev_op *op, dev_tensor *const *in,
                            int n, dev_status *st) {
  const char *nm = op->def->name;
  dev_devset set = {.n = 0};
  dev_shape shapes[PD_MAX_DEVICES];
  if (n > PD_MAX_DEVICES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: %d inputs; at most %d (one per device)", nm, n,
                     PD_MAX_DEVICES);
  char sb[DEV_DEVSET_STR_MAX];
  for (int i = 0; i < n; i++) {
    if (in[i]->n != 1)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: input %d is on %d devices %s; expected tensors "
                       "each on a set of one device (ParallelUnpack splits "
                       "a parallel tensor)",
                       nm, i, in[i]->n,
                       dev_devset_str(&in[i]->set, sb, sizeof sb));
    if (in[i]->dtype != in[0]->dtype)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: input %d is %s but input 0 is %s; expected one "
                       "dtype",
                       nm, i, pd_dtype_name(in[i]->dtype),
                       pd_dtype_name(in[0]->dtype));
    int dev = in[i]->set.dev[0];
    int prev = dev_devset_index(&set, dev);
    if (prev >= 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: inputs %d and %d are both on device %d; expected "
                       "distinct devices (CopyToDevices moves a value)",
                       nm, prev, i, dev);
    set.dev[set.n++] = (uint8_t)dev;
    shapes[i] = in[i]->comps[0].shape;
    if (i > 0 && shapes[i].rank != shapes[0].rank)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: input %d has rank %d but input 0 has rank %d; "
                       "expected one rank",
                       nm, i, shapes[i].rank, shapes[0].rank);
  }
  PD_TRY(place_output(e, op, 0, &set, in[0]->dtype, shapes, st));
  op->outputs[0]->not_mirrored = true;
  dev__op_set_devset(op, &set);
  return PD_OK;
}

static pd_code prepare_unpack(dev_engine *e, dev_op *op, dev_tensor *x,
                              dev_status *st) {
  int64_t num = op->attrs[0].u.i;
  if (num != 0 && num != x->n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: attribute 'num' is %lld but the input is on %d "
                     "devices; expected 0 or %d",
                     op->def->name, (long long)num, x->n, x->n);
  for (int i = 0; i < x->n; i++) {
    dev_devset one = {.n = 1};
    one.dev[0] = x->set.dev[i];
    PD_TRY(place_output(e, op, i, &one, x->dtype, &x->comps[i].shape, st));
  }
  dev__op_set_devset(op, &x->set);
  return PD_OK;
}

/* The source component of CopyToDevices' output component j, for an input
 * on ns devices copied to nt. */
static int copy_source(const dev_tensor *x, int nt, int j) {
  return x->n == nt ? j : 0;
}

static pd_code prepare_copy(dev_engine *e, dev_op *op, dev_tensor *x,
                            dev_status *st) {
  const char *nm = op->def->name;
  const dev_attr_value *v = &op->attrs[0];
  dev_devset to;
  dev_status sst = DEV_STATUS_INIT;
  if (dev_devset_make(e, v->u.ilist.v, v->u.ilist.n, &to, &sst) != PD_OK)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute 'devices': %s", nm,
                     sst.msg);
  char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
  if (x->n != to.n && x->n != 1 && x->not_mirrored)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "%s: the input is on %d devices %s and not mirrored, the destination "
        "%s has %d; expected the same device count, an input on one device "
        "(replicated), or a mirrored input (its component 0 is copied); "
        "ParallelUnpack and ParallelPack regroup components",
        nm, x->n, dev_devset_str(&x->set, a, sizeof a),
        dev_devset_str(&to, b, sizeof b), to.n);
  dev_shape shapes[PD_MAX_DEVICES];
  for (int j = 0; j < to.n; j++)
    shapes[j] = x->comps[copy_source(x, to.n, j)].shape;
  PD_TRY(place_output(e, op, 0, &to, x->dtype, shapes, st));
  op->outputs[0]->not_mirrored = x->n == to.n && x->not_mirrored;
  dev_devset u = x->set;
  set_union(&u, &to);
  dev__op_set_devset(op, &u);
  return PD_OK;
}

/* Prepares a placement op: attributes, output sets and shapes, holds. */
static pd_code place_prepare(dev_engine *e, const dev_op_def *def,
                             const dev_devset *set, dev_tensor *const *inputs,
                             int num_inputs, const dev_attr *attrs,
                             int num_attrs, dev_op **out, dev_status *st) {
  PD_TRY(dev__check_inputs(def, e, inputs, num_inputs, st));
  dev_op *op = dev__op_alloc(e);
  if (!op) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  op->def = def;
  op->engine = e;
  pd_code rc;
  PD_TRY_GOTO(
      dev__resolve_attrs(def, attrs, num_attrs, op->attrs, &op->attr_arena, st),
      rc, fail);
  op->num_inputs = num_inputs;
  for (int i = 0; i < num_inputs; i++) {
    dev_tensor_retain(inputs[i]);
    op->inputs[i] = inputs[i];
  }
  switch (def->placement) {
    case DEV_PLACE_PACK:
      rc = prepare_pack(e, op, inputs, num_inputs, st);
      break;
    case DEV_PLACE_UNPACK: rc = prepare_unpack(e, op, inputs[0], st); break;
    default: rc = prepare_copy(e, op, inputs[0], st); break;
  }
  if (rc == PD_OK && e->mesh) /* issue #16: not across machines yet */
    rc = dev__mesh_check_placement(e, def, &op->set, st);
  if (rc != PD_OK) goto fail;
  if (set && !dev_devset_equal(set, &op->outputs[0]->set) &&
      !dev_devset_equal(set, &op->set)) {
    char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: placed on devices %s, but it runs on devices %s "
                   "(its inputs' and outputs' devices); give no placement",
                   def->name, dev_devset_str(set, a, sizeof a),
                   dev_devset_str(&op->set, b, sizeof b));
    goto fail;
  }
  *out = op;
  return PD_OK;
fail:
  dev__op_free(op);
  return rc;
}

pd_code dev_op_prepare_on(dev_engine *e, const dev_devset *set,
                          const char *op_name, dev_tensor *const *inputs,
                          int num_inputs, const dev_attr *attrs, int num_attrs,
                          dev_op **out, dev_status *st) {
  const dev_op_def *def = dev_op_lookup(op_name);
  if (!def)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "unknown op '%.64s'; expected a registered op name",
                     op_name ? op_name : "(null)");
  if (def->flags & DEV_OP_PLACEMENT)
    return place_prepare(e, def, set, inputs, num_inputs, attrs, num_attrs, out,
                         st);
  return dev__op_prepare_plain(e, def, set, inputs, num_inputs, attrs,
                               num_attrs, out, st);
}

/* --- running (each device's executor, exec.c run_op) --------------------- */

/* Output component `oc` of `t` shares `src`'s buffer. */
static void share(dev_tensor *t, int oc, const dev_component *src) {
  if (!src->buf) return;
  dev__buffer_retain(src->buf);
  t->comps[oc].buf = src->buf;
}

/* CopyToDevices' part on `device`: its output component, from its source
 * component on the source device.
 *
 * Waiting here on another device cannot deadlock, by the one-order rule:
 * this op has seq S and the source component was produced by an op of seq
 * P < S pushed to the source device E. Every device runs its ops in seq
 * order, so everything this device had to do before S (a collective with E
 * included) is done, and whatever E still has to do up to P has seqs < S:
 * by induction on seq, none of it waits on an op of seq >= S, so E reaches
 * P while this executor waits. A fenced device publishes P once its stream
 * finished it, independently of its executor. */
static bool run_copy(dev_op *op, int device, dev_status *st) {
  dev_engine *e = op->engine;
  dev_backend *b = e->backend;
  dev_tensor *x = op->inputs[0], *y = op->outputs[0];
  const int j = dev__slot(y, device);
  if (j < 0) return false; /* a source-only device: nothing to do */
  const int s = copy_source(x, y->n, j);
  dev_component *src = &x->comps[s];
  const int from = dev__comp_device(x, s);
  if (from != device) dev_exec_wait(e, from, atomic_load(&src->ready_seq));
  pd_code code = atomic_load(&src->code);
  if (code != PD_OK) {
    dev_error(st, code, "%s", src->msg ? src->msg : "");
    return false;
  }
  dev_component *c = &y->comps[j];
  dev_status ast = DEV_STATUS_INIT;
  if (dev__buffer_alloc(b, device, c->bytes, &c->buf, &ast) != PD_OK) {
    atomic_store(&op->issue_failed, true);
    dev_error(st, ast.code, "%s: %s", op->def->name, ast.msg);
    return false;
  }
  if (!c->bytes) return false;
  if (!src->buf) {
    dev_error(st, PD_INTERNAL, "%s: source component %d has no buffer",
              op->def->name, s);
    return false;
  }
  dev_status cst = DEV_STATUS_INIT;
  if (b->copy_d2d(b, device, c->buf->data, from, src->buf->data, c->bytes,
                  &cst) != PD_OK) {
    dev_error(st, cst.code, "%s: copy from %s to %s: %s", op->def->name,
              b->device_name(b, from), b->device_name(b, device), cst.msg);
    return false;
  }
  return true;
}

bool dev__place_run(dev_op *op, int device, dev_status *st) {
  switch (op->def->placement) {
    case DEV_PLACE_PACK:
      for (int i = 0; i < op->num_inputs; i++)
        if (dev__slot(op->inputs[i], device) == 0)
          share(op->outputs[0], dev__slot(op->outputs[0], device),
                &op->inputs[i]->comps[0]);
      return false;
    case DEV_PLACE_UNPACK: {
      const int c = dev__slot(op->inputs[0], device);
      for (int o = 0; c >= 0 && o < op->num_outputs; o++)
        if (dev__slot(op->outputs[o], device) == 0)
          share(op->outputs[o], 0, &op->inputs[0]->comps[c]);
      return false;
    }
    default: return run_copy(op, device, st);
  }
}
