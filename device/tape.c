/* The gradient tape (device.h, "Gradient tape"), recording side: creates and
 * destroys tapes, watches tensors and records the ops that depend on them,
 * to be walked backwards by gradient.c with one vector-Jacobian product per
 * op (vjp.c), as TensorFlow's tape (tensorflow/c/eager/tape.h).
 *
 * Recording is on the hot path of training, so it only takes references:
 * one allocation per recorded op holds the input pointers and a copy of the
 * attributes; a pointer hash set tells which tensors are tracked. Tensors
 * are identified by address, which is safe because the tape holds a
 * reference to every tensor it tracks (watched tensors and the outputs of
 * recorded ops) for as long as it may look them up.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tape_int.h"

pd_code dev__tape_exec(const dev_tape *tp, const char *op,
                       dev_tensor *const *in, int n, const dev_attr *attrs,
                       int n_attrs, dev_tensor **outs, int *n_out,
                       dev_status *st) {
  /* An op without inputs (a Fill scalar, DeviceId) goes where the record
   * whose VJP runs lives (issue #17): its first input's set, else its first
   * output's. dev__tape_place carries it to dev_op_prepare through any
   * executor. */
  const dev_devset *place = NULL;
  if (n == 0 && tp->cur_rec > 0 && tp->cur_rec <= tp->n_recs) {
    const tape_rec *r = tp->recs[tp->cur_rec - 1];
    if (r->n_in > 0)
      place = &r->in[0]->set;
    else if (r->n_out > 0)
      place = &r->out[0]->set;
  }
  const dev_devset *saved = dev__tape_place;
  dev__tape_place = place;
  pd_code rc = tp->exec ? tp->exec(tp->exec_arg, op, in, n, attrs, n_attrs,
                                   outs, n_out, st)
                        : dev_execute_on(tp->engine, place, op, in, n, attrs,
                                         n_attrs, outs, n_out, st);
  dev__tape_place = saved;
  return rc;
}

void dev_tape_set_executor(dev_tape *tp, dev_execute_fn fn, void *arg) {
  tp->exec = fn;
  tp->exec_arg = arg;
}

static size_t round8(size_t n) { return (n + 7) & ~(size_t)7; }

void dev__tape_clear(dev_tape *tp) {
  for (size_t r = 0; r < tp->n_recs; r++) {
    tape_rec *rec = tp->recs[r];
    for (int i = 0; i < rec->n_in; i++) dev_tensor_release(rec->in[i]);
    for (int i = 0; i < rec->n_out; i++) dev_tensor_release(rec->out[i]);
    free(rec);
  }
  for (size_t i = 0; i < tp->n_watched; i++) dev_tensor_release(tp->watched[i]);
  free(tp->recs);
  free(tp->watched);
  tp->recs = NULL;
  tp->watched = NULL;
  tp->n_recs = tp->cap_recs = tp->n_watched = tp->cap_watched = 0;
  dev__pmap_free(&tp->tracked);
}

pd_code dev_tape_create(dev_engine *e, bool persistent, dev_tape **out,
                        dev_status *st) {
  if (!e || !out)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_tape_create: engine or out is NULL");
  dev_tape *tp = calloc(1, sizeof *tp);
  if (!tp)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "host out of memory creating a gradient tape");
  tp->engine = e;
  tp->persistent = persistent;
  *out = tp;
  return PD_OK;
}

void dev_tape_destroy(dev_tape *tp) {
  if (!tp) return;
  dev__tape_clear(tp);
  free(tp);
}

/* Make room for one more element; false when out of memory (unchanged). */
static bool grow_watched(dev_tape *tp) {
  if (tp->n_watched < tp->cap_watched) return true;
  size_t cap = tp->cap_watched ? tp->cap_watched * 2 : 16;
  dev_tensor **a = realloc(tp->watched, cap * sizeof *a);
  if (!a) return false;
  tp->watched = a;
  tp->cap_watched = cap;
  return true;
}

static bool grow_recs(dev_tape *tp) {
  if (tp->n_recs < tp->cap_recs) return true;
  size_t cap = tp->cap_recs ? tp->cap_recs * 2 : 64;
  tape_rec **a = realloc(tp->recs, cap * sizeof *a);
  if (!a) return false;
  tp->recs = a;
  tp->cap_recs = cap;
  return true;
}

pd_code dev_tape_watch(dev_tape *tp, dev_tensor *t, dev_status *st) {
  if (!tp || !t)
    return dev_error(st, PD_INVALID_ARGUMENT, "dev_tape_watch: %s is NULL",
                     tp ? "the tensor" : "the tape");
  if (tp->used)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "this one-shot gradient tape has already computed its "
                     "gradient; create a new "
                     "tape (or a persistent one) to watch more tensors");
  if (t->engine != tp->engine)
    return dev_error(
        st, PD_FAILED_PRECONDITION,
        "dev_tape_watch: the tensor belongs to another engine than the tape");
  if (!dev__is_float(t) || dev__pmap_get(&tp->tracked, t, NULL)) return PD_OK;
  if (!grow_watched(tp) || !dev__pmap_reserve(&tp->tracked, 1))
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "host out of memory watching a tensor");
  dev_tensor_retain(t);
  tp->watched[tp->n_watched++] = t;
  dev__pmap_put(&tp->tracked, t, NULL);
  return PD_OK;
}

/* Ops whose outputs do not depend on their inputs' values: their gradient is
 * zero, so they are not recorded (TensorFlow's ops.NotDifferentiable). */
static bool not_differentiable(const dev_op_def *def) {
  return strcmp(def->name, "OnesLike") == 0 ||
         strcmp(def->name, "ZerosLike") == 0;
}

pd_code dev_tape_record(dev_tape *tp, const dev_op *op, dev_status *st) {
  if (!tp || !op)
    return dev_error(st, PD_INVALID_ARGUMENT, "dev_tape_record: %s is NULL",
                     tp ? "the op" : "the tape");
  if (tp->used || tp->tracked.n == 0) return PD_OK;
  if (op->engine != tp->engine)
    return dev_error(
        st, PD_FAILED_PRECONDITION,
        "dev_tape_record: op %s belongs to another engine than the tape",
        op->def->name);
  uint64_t mask = 0;
  for (int i = 0; i < op->num_inputs; i++)
    if (dev__pmap_get(&tp->tracked, op->inputs[i], NULL))
      mask |= UINT64_C(1) << i;
  if (!mask) return PD_OK;
  int n_float = 0;
  for (int o = 0; o < op->num_outputs; o++) {
    if (!dev__is_float(op->outputs[o])) continue;
    if (dev__pmap_get(&tp->tracked, op->outputs[o], NULL))
      return PD_OK; /* recorded before */
    n_float++;
  }
  if (n_float == 0 || not_differentiable(op->def))
    return PD_OK; /* no gradient comes back */

  const dev_op_def *def = op->def;
  size_t arena = 0;
  for (int a = 0; a < def->num_attrs; a++) {
    const dev_attr_value *v = &op->attrs[a];
    if (v->type == DEV_ATTR_STRING)
      arena += round8(v->u.s.len + 1);
    else if (v->type == DEV_ATTR_INT_LIST)
      arena += (size_t)v->u.ilist.n * 8;
    else if (v->type == DEV_ATTR_FLOAT_LIST)
      arena += (size_t)v->u.flist.n * 8;
  }
  size_t head =
      round8(sizeof(tape_rec) +
             (size_t)(op->num_inputs + op->num_outputs) * sizeof(dev_tensor *));
  size_t attrs_bytes = (size_t)def->num_attrs * sizeof(dev_attr_value);
  if (!grow_recs(tp) || !dev__pmap_reserve(&tp->tracked, (size_t)n_float))
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "host out of memory recording op %s", def->name);
  tape_rec *r = malloc(head + attrs_bytes + arena);
  if (!r)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "host out of memory recording op %s", def->name);

  r->def = def;
  r->n_in = op->num_inputs;
  r->n_out = op->num_outputs;
  r->tracked = mask;
  r->out = &r->in[op->num_inputs];
  for (int i = 0; i < op->num_inputs; i++) {
    dev_tensor_retain(op->inputs[i]);
    r->in[i] = op->inputs[i];
  }
  for (int o = 0; o < op->num_outputs; o++) {
    dev_tensor_retain(op->outputs[o]);
    r->out[o] = op->outputs[o];
  }
  r->attrs = (dev_attr_value *)(void *)((char *)r + head);
  char *p = (char *)r + head + attrs_bytes;
  for (int a = 0; a < def->num_attrs; a++) {
    dev_attr_value v = op->attrs[a];
    if (v.type == DEV_ATTR_STRING) {
      if (v.u.s.len) memcpy(p, v.u.s.ptr, v.u.s.len);
      p[v.u.s.len] = '\0';
      v.u.s.ptr = p;
      p += round8(v.u.s.len + 1);
    } else if (v.type == DEV_ATTR_INT_LIST && v.u.ilist.n) {
      memcpy(p, v.u.ilist.v, (size_t)v.u.ilist.n * 8);
      v.u.ilist.v = (const int64_t *)(void *)p;
      p += (size_t)v.u.ilist.n * 8;
    } else if (v.type == DEV_ATTR_FLOAT_LIST && v.u.flist.n) {
      memcpy(p, v.u.flist.v, (size_t)v.u.flist.n * 8);
      v.u.flist.v = (const double *)(void *)p;
      p += (size_t)v.u.flist.n * 8;
    }
    r->attrs[a] = v;
  }
  size_t index = tp->n_recs;
  tp->recs[tp->n_recs++] = r;
  for (int o = 0; o < op->num_outputs; o++)
    if (dev__is_float(op->outputs[o]))
      dev__pmap_put(&tp->tracked, op->outputs[o],
                    (void *)(uintptr_t)(index + 1));
  return PD_OK;
}
