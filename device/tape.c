/* The gradient tape (device.h, "Gradient tape"): records the ops that depend
 * on watched tensors and walks them backwards with one vector-Jacobian
 * product (VJP) per op, as TensorFlow's tape (tensorflow/c/eager/tape.h)
 * with the gradient functions of math_grad.py, nn_grad.py and
 * array_grad.py.
 *
 * Recording is on the hot path of training, so it only takes references:
 * one allocation per recorded op holds the input pointers and a copy of the
 * attributes; a pointer hash set tells which tensors are tracked. Tensors
 * are identified by address, which is safe because the tape holds a
 * reference to every tensor it tracks (watched tensors and the outputs of
 * recorded ops) for as long as it may look them up.
 *
 * The backward walk visits the recorded ops in reverse recording order.
 * Recording order is execution order, so every consumer of a tensor comes
 * after its producer, and by the time an op is visited every gradient that
 * reaches its outputs has been summed. Only inputs that were tracked when
 * the op was recorded and from which a source can be reached get a
 * gradient (TensorFlow's skip_input_indices). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"

/* ------------------------------------------------------------------------ */
/* Pointer map: open addressing, linear probing, load <= 1/2, no deletion.   */

typedef struct pmap {
  const void **keys; /* NULL: empty slot */
  void **vals;
  size_t cap; /* 0 or a power of two */
  size_t n;
} pmap;

static size_t pmap_hash(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x;
}

static size_t pmap_slot(const pmap *m, const void *k) {
  size_t mask = m->cap - 1, i = pmap_hash(k) & mask;
  while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
  return i;
}

static bool pmap_get(const pmap *m, const void *k, void **val) {
  if (!m->cap) return false;
  size_t i = pmap_slot(m, k);
  if (!m->keys[i]) return false;
  if (val) *val = m->vals[i];
  return true;
}

/* Makes room for `extra` more keys; false when out of memory (unchanged). */
static bool pmap_reserve(pmap *m, size_t extra) {
  size_t need = m->n + extra;
  if (need * 2 <= m->cap) return true;
  size_t cap = m->cap ? m->cap : 16;
  while (need * 2 > cap) cap *= 2;
  pmap nm = {calloc(cap, sizeof(void *)), calloc(cap, sizeof(void *)), cap, m->n};
  if (!nm.keys || !nm.vals) {
    free(nm.keys);
    free(nm.vals);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) {
      size_t j = pmap_slot(&nm, m->keys[i]);
      nm.keys[j] = m->keys[i];
      nm.vals[j] = m->vals[i];
    }
  free(m->keys);
  free(m->vals);
  *m = nm;
  return true;
}

/* Sets k's value, inserting k; room must have been reserved. */
static void pmap_put(pmap *m, const void *k, void *v) {
  size_t i = pmap_slot(m, k);
  if (!m->keys[i]) {
    m->keys[i] = k;
    m->n++;
  }
  m->vals[i] = v;
}

static void pmap_free(pmap *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------------ */
/* The tape                                                                  */

/* One recorded op. Inputs and outputs are references the record owns. */
typedef struct tape_rec {
  const dev_op_def *def;
  int n_in, n_out;
  uint64_t tracked; /* bit i: input i was tracked when the op was recorded */
  dev_tensor *out[DEV_MAX_OUTPUTS];
  dev_attr_value *attrs; /* [def->num_attrs]; lists and strings copied behind */
  dev_tensor *in[];      /* [n_in] */
} tape_rec;

struct dev_tape {
  dev_engine *engine;
  dev_execute_fn exec; /* how gradient ops run: dev_execute unless set */
  void *exec_arg;
  bool persistent;
  bool used; /* a one-shot tape after its gradient */
  /* tracked tensor -> index of the record that produced it + 1 (0: watched) */
  pmap tracked;
  dev_tensor **watched; /* references */
  size_t n_watched, cap_watched;
  tape_rec **recs;
  size_t n_recs, cap_recs;
};

/* Runs one gradient op through the tape's executor. */
static pd_code tape_exec(const dev_tape *tp, const char *op, dev_tensor *const *in, int n,
                         const dev_attr *attrs, int n_attrs, dev_tensor **outs, int *n_out,
                         dev_status *st) {
  if (tp->exec) return tp->exec(tp->exec_arg, op, in, n, attrs, n_attrs, outs, n_out, st);
  return dev_execute(tp->engine, op, in, n, attrs, n_attrs, outs, n_out, st);
}

void dev_tape_set_executor(dev_tape *tp, dev_execute_fn fn, void *arg) {
  tp->exec = fn;
  tp->exec_arg = arg;
}

static bool is_float(const dev_tensor *t) { return dev_dtype_is_floating(t->dtype); }

static size_t round8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Drops every record and watched tensor. */
static void tape_clear(dev_tape *tp) {
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
  pmap_free(&tp->tracked);
}

pd_code dev_tape_create(dev_engine *e, bool persistent, dev_tape **out, dev_status *st) {
  if (!e || !out) return dev_error(st, PD_INVALID_ARGUMENT, "dev_tape_create: engine or out is NULL");
  dev_tape *tp = calloc(1, sizeof *tp);
  if (!tp) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory creating a gradient tape");
  tp->engine = e;
  tp->persistent = persistent;
  *out = tp;
  return PD_OK;
}

void dev_tape_destroy(dev_tape *tp) {
  if (!tp) return;
  tape_clear(tp);
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
    return dev_error(st, PD_INVALID_ARGUMENT, "dev_tape_watch: %s is NULL", tp ? "the tensor" : "the tape");
  if (tp->used)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "this one-shot gradient tape has already computed its gradient; create a new "
                     "tape (or a persistent one) to watch more tensors");
  if (t->engine != tp->engine)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "dev_tape_watch: the tensor belongs to another engine than the tape");
  if (!is_float(t) || pmap_get(&tp->tracked, t, NULL)) return PD_OK;
  if (!grow_watched(tp) ||
      !pmap_reserve(&tp->tracked, 1))
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory watching a tensor");
  dev_tensor_retain(t);
  tp->watched[tp->n_watched++] = t;
  pmap_put(&tp->tracked, t, NULL);
  return PD_OK;
}

/* Ops whose outputs do not depend on their inputs' values: their gradient is
 * zero, so they are not recorded (TensorFlow's ops.NotDifferentiable). */
static bool not_differentiable(const dev_op_def *def) {
  return strcmp(def->name, "OnesLike") == 0 || strcmp(def->name, "ZerosLike") == 0;
}

pd_code dev_tape_record(dev_tape *tp, const dev_op *op, dev_status *st) {
  if (!tp || !op)
    return dev_error(st, PD_INVALID_ARGUMENT, "dev_tape_record: %s is NULL", tp ? "the op" : "the tape");
  if (tp->used || tp->tracked.n == 0) return PD_OK;
  if (op->engine != tp->engine)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "dev_tape_record: op %s belongs to another engine than the tape", op->def->name);
  uint64_t mask = 0;
  for (int i = 0; i < op->num_inputs; i++)
    if (pmap_get(&tp->tracked, op->inputs[i], NULL)) mask |= UINT64_C(1) << i;
  if (!mask) return PD_OK;
  int n_float = 0;
  for (int o = 0; o < op->num_outputs; o++) {
    if (!is_float(op->outputs[o])) continue;
    if (pmap_get(&tp->tracked, op->outputs[o], NULL)) return PD_OK; /* recorded before */
    n_float++;
  }
  if (n_float == 0 || not_differentiable(op->def)) return PD_OK; /* no gradient comes back */

  const dev_op_def *def = op->def;
  size_t arena = 0;
  for (int a = 0; a < def->num_attrs; a++) {
    const dev_attr_value *v = &op->attrs[a];
    if (v->type == DEV_ATTR_STRING) arena += round8(v->u.s.len + 1);
    else if (v->type == DEV_ATTR_INT_LIST) arena += (size_t)v->u.ilist.n * 8;
    else if (v->type == DEV_ATTR_FLOAT_LIST) arena += (size_t)v->u.flist.n * 8;
  }
  size_t head = round8(sizeof(tape_rec) + (size_t)op->num_inputs * sizeof(dev_tensor *));
  size_t attrs_bytes = (size_t)def->num_attrs * sizeof(dev_attr_value);
  if (!grow_recs(tp) ||
      !pmap_reserve(&tp->tracked, (size_t)n_float))
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory recording op %s", def->name);
  tape_rec *r = malloc(head + attrs_bytes + arena);
  if (!r) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory recording op %s", def->name);

  r->def = def;
  r->n_in = op->num_inputs;
  r->n_out = op->num_outputs;
  r->tracked = mask;
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
    if (is_float(op->outputs[o])) pmap_put(&tp->tracked, op->outputs[o], (void *)(uintptr_t)(index + 1));
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Vector-Jacobian products                                                  */

#define VJP_TEMPS 160

/* One VJP call. A VJP reads dy (the gradients that reached the op's outputs;
 * NULL where none did) and writes dx[j] for the inputs with need[j]. Ops run
 * through run(), whose outputs are temporaries released after the call;
 * set_dx() keeps a reference to a result. Errors are sticky: after the first
 * failure run() returns NULL and does nothing, so VJPs are straight-line
 * code and the caller checks rc once. */
typedef struct vjp_ctx {
  dev_engine *e;
  const dev_tape *tp;
  const tape_rec *r;
  dev_tensor *dy[DEV_MAX_OUTPUTS];
  bool need[DEV_MAX_INPUTS];
  dev_tensor *dx[DEV_MAX_INPUTS];
  dev_tensor *temps[VJP_TEMPS];
  int n_temps;
  dev_status *st;
  pd_code rc;
} vjp_ctx;

static dev_tensor *run(vjp_ctx *c, const char *op, dev_tensor *const *in, int n,
                       const dev_attr *attrs, int n_attrs) {
  if (c->rc != PD_OK) return NULL;
  for (int i = 0; i < n; i++)
    if (!in[i]) {
      c->rc = dev_error(c->st, PD_INTERNAL, "gradient of %s: %s is missing input %d",
                        c->r->def->name, op, i);
      return NULL;
    }
  if (c->n_temps == VJP_TEMPS) {
    c->rc = dev_error(c->st, PD_INTERNAL, "gradient of %s: more than %d ops", c->r->def->name,
                      VJP_TEMPS);
    return NULL;
  }
  dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
  int n_out = DEV_MAX_OUTPUTS;
  dev_status s = DEV_STATUS_INIT;
  if (tape_exec(c->tp, op, in, n, attrs, n_attrs, outs, &n_out, &s) != PD_OK) {
    c->rc = dev_error(c->st, s.code, "gradient of %s: %s", c->r->def->name, s.msg);
    return NULL;
  }
  for (int i = 1; i < n_out; i++) dev_tensor_release(outs[i]);
  c->temps[c->n_temps++] = outs[0];
  return outs[0];
}

static dev_tensor *run1(vjp_ctx *c, const char *op, dev_tensor *a, const dev_attr *attrs,
                        int n_attrs) {
  return run(c, op, &a, 1, attrs, n_attrs);
}

static dev_tensor *run2(vjp_ctx *c, const char *op, dev_tensor *a, dev_tensor *b,
                        const dev_attr *attrs, int n_attrs) {
  dev_tensor *in[2] = {a, b};
  return run(c, op, in, 2, attrs, n_attrs);
}

static void set_dx(vjp_ctx *c, int j, dev_tensor *t) {
  if (c->rc != PD_OK || !t) return;
  dev_tensor_retain(t);
  c->dx[j] = t;
}

static bool same_shapes(const dev_tensor *a, const dev_tensor *b) {
  for (int d = 0; d < a->n; d++)
    if (!dev_shape_equal(&a->comps[d].shape, &b->comps[d].shape)) return false;
  return true;
}

/* t summed down to like's shapes where broadcasting stretched like. */
static dev_tensor *unbroadcast(vjp_ctx *c, dev_tensor *t, dev_tensor *like) {
  if (!t) return NULL;
  return same_shapes(t, like) ? t : run2(c, "SumToLike", t, like, NULL, 0);
}

/* A scalar of dtype dt, mirrored. */
static dev_tensor *scalar(vjp_ctx *c, double v, pd_dtype dt) {
  dev_attr a[3] = {dev_attr_shape("shape", 0, NULL), dev_attr_float("value", v),
                   dev_attr_dtype("dtype", dt)};
  return run(c, "Fill", NULL, 0, a, 3);
}

static const dev_attr_value *attr(vjp_ctx *c, const char *name) {
  static const dev_attr_value none = {.type = DEV_ATTR_NONE};
  int i = dev_op_attr_index(c->r->def, name);
  if (i >= 0) return &c->r->attrs[i];
  if (c->rc == PD_OK)
    c->rc = dev_error(c->st, PD_INTERNAL, "gradient of %s: no attribute '%s'", c->r->def->name, name);
  return &none;
}

static bool attr_is(const dev_attr_value *v, const char *s) {
  size_t n = strlen(s);
  return v->type == DEV_ATTR_STRING && v->u.s.len == n && memcmp(v->u.s.ptr, s, n) == 0;
}

#define X(j) (c->r->in[j])
#define Y (c->r->out[0])
#define DY (c->dy[0])

/* d(x+y) = dy, dy */
static void vjp_add(vjp_ctx *c) {
  if (c->need[0]) set_dx(c, 0, unbroadcast(c, DY, X(0)));
  if (c->need[1]) set_dx(c, 1, unbroadcast(c, DY, X(1)));
}

/* d(x-y) = dy, -dy */
static void vjp_sub(vjp_ctx *c) {
  if (c->need[0]) set_dx(c, 0, unbroadcast(c, DY, X(0)));
  if (c->need[1]) set_dx(c, 1, unbroadcast(c, run1(c, "Neg", DY, NULL, 0), X(1)));
}

/* d(x*y) = dy*y, x*dy */
static void vjp_mul(vjp_ctx *c) {
  if (c->need[0]) set_dx(c, 0, unbroadcast(c, run2(c, "Mul", DY, X(1), NULL, 0), X(0)));
  if (c->need[1]) set_dx(c, 1, unbroadcast(c, run2(c, "Mul", X(0), DY, NULL, 0), X(1)));
}

/* d(x/y) = dy/y, -(dy/y) * (x/y) */
static void vjp_div(vjp_ctx *c) {
  dev_tensor *t = run2(c, "Div", DY, X(1), NULL, 0);
  if (c->need[0]) set_dx(c, 0, unbroadcast(c, t, X(0)));
  if (c->need[1])
    set_dx(c, 1, unbroadcast(c, run1(c, "Neg", run2(c, "Mul", t, Y, NULL, 0), NULL, 0), X(1)));
}

static void vjp_neg(vjp_ctx *c) { set_dx(c, 0, run1(c, "Neg", DY, NULL, 0)); }
static void vjp_identity(vjp_ctx *c) { set_dx(c, 0, DY); }
/* d exp(x) = dy * exp(x) */
static void vjp_exp(vjp_ctx *c) { set_dx(c, 0, run2(c, "Mul", DY, Y, NULL, 0)); }
/* d log(x) = dy / x */
static void vjp_log(vjp_ctx *c) { set_dx(c, 0, run2(c, "Div", DY, X(0), NULL, 0)); }
static void vjp_sqrt(vjp_ctx *c) { set_dx(c, 0, run2(c, "SqrtGrad", Y, DY, NULL, 0)); }
static void vjp_rsqrt(vjp_ctx *c) { set_dx(c, 0, run2(c, "RsqrtGrad", Y, DY, NULL, 0)); }
static void vjp_tanh(vjp_ctx *c) { set_dx(c, 0, run2(c, "TanhGrad", Y, DY, NULL, 0)); }
static void vjp_sigmoid(vjp_ctx *c) { set_dx(c, 0, run2(c, "SigmoidGrad", Y, DY, NULL, 0)); }
/* As TensorFlow, from the output: y > 0 exactly where x > 0. */
static void vjp_relu(vjp_ctx *c) { set_dx(c, 0, run2(c, "ReluGrad", DY, Y, NULL, 0)); }

/* d x^2 = dy * 2x */
static void vjp_square(vjp_ctx *c) {
  dev_tensor *two = scalar(c, 2.0, X(0)->dtype);
  set_dx(c, 0, run2(c, "Mul", DY, run2(c, "Mul", X(0), two, NULL, 0), NULL, 0));
}

/* d x^y = dy * y * x^(y-1), dy * x^y * log(x) with log(x) taken as 0 where
 * x <= 0 (TensorFlow's _PowGrad). */
static void vjp_pow(vjp_ctx *c) {
  pd_dtype dt = Y->dtype;
  dev_tensor *x = X(0), *y = X(1);
  if (c->need[0]) {
    dev_tensor *ym1 = run2(c, "Sub", y, scalar(c, 1.0, dt), NULL, 0);
    dev_tensor *t = run2(c, "Mul", y, run2(c, "Pow", x, ym1, NULL, 0), NULL, 0);
    set_dx(c, 0, unbroadcast(c, run2(c, "Mul", DY, t, NULL, 0), x));
  }
  if (c->need[1]) {
    dev_attr cast = dev_attr_dtype("DstT", dt);
    dev_tensor *m = run1(c, "Cast", run2(c, "Greater", x, scalar(c, 0.0, dt), NULL, 0), &cast, 1);
    /* x where x > 0, else 1: its log is log(x) or 0. */
    dev_tensor *xs = run2(c, "Add", run2(c, "Mul", x, m, NULL, 0),
                          run2(c, "Sub", scalar(c, 1.0, dt), m, NULL, 0), NULL, 0);
    dev_tensor *t = run2(c, "Mul", run2(c, "Mul", DY, Y, NULL, 0), run1(c, "Log", xs, NULL, 0),
                         NULL, 0);
    set_dx(c, 1, unbroadcast(c, t, y));
  }
}

/* Maximum / Minimum: the gradient goes to the input that was selected; ties
 * go to x (TensorFlow: x >= y for Maximum, x <= y for Minimum). */
static void vjp_select(vjp_ctx *c, const char *y_wins) {
  dev_attr cast = dev_attr_dtype("DstT", Y->dtype);
  dev_tensor *m = run1(c, "Cast", run2(c, y_wins, X(0), X(1), NULL, 0), &cast, 1);
  dev_tensor *gy = run2(c, "Mul", DY, m, NULL, 0);
  if (c->need[0]) set_dx(c, 0, unbroadcast(c, run2(c, "Sub", DY, gy, NULL, 0), X(0)));
  if (c->need[1]) set_dx(c, 1, unbroadcast(c, gy, X(1)));
}
static void vjp_maximum(vjp_ctx *c) { vjp_select(c, "Less"); }
static void vjp_minimum(vjp_ctx *c) { vjp_select(c, "Greater"); }

static dev_tensor *mm(vjp_ctx *c, const char *op, const char *na, const char *nb, dev_tensor *a,
                      dev_tensor *b, bool ta, bool tb) {
  dev_attr at[2] = {dev_attr_bool(na, ta), dev_attr_bool(nb, tb)};
  return run2(c, op, a, b, at, 2);
}

/* MatMul and BatchMatMul (TensorFlow's _MatMulGrad, _BatchMatMulV2): for
 * out = op(a) op(b), each of the four transpose cases; BatchMatMul then sums
 * over the batch axes that were broadcast. */
static void vjp_matmul_common(vjp_ctx *c, const char *op, const char *na, const char *nb,
                              bool batch) {
  bool ta = attr(c, na)->u.b, tb = attr(c, nb)->u.b;
  dev_tensor *a = X(0), *b = X(1), *g = DY;
  if (c->need[0]) {
    dev_tensor *da;
    if (!ta && !tb) da = mm(c, op, na, nb, g, b, false, true);
    else if (!ta) da = mm(c, op, na, nb, g, b, false, false);
    else if (!tb) da = mm(c, op, na, nb, b, g, false, true);
    else da = mm(c, op, na, nb, b, g, true, true);
    set_dx(c, 0, batch ? unbroadcast(c, da, a) : da);
  }
  if (c->need[1]) {
    dev_tensor *db;
    if (!ta && !tb) db = mm(c, op, na, nb, a, g, true, false);
    else if (!ta) db = mm(c, op, na, nb, g, a, true, false);
    else if (!tb) db = mm(c, op, na, nb, a, g, false, false);
    else db = mm(c, op, na, nb, g, a, true, true);
    set_dx(c, 1, batch ? unbroadcast(c, db, b) : db);
  }
}
static void vjp_matmul(vjp_ctx *c) { vjp_matmul_common(c, "MatMul", "transpose_a", "transpose_b", false); }
static void vjp_batch_matmul(vjp_ctx *c) { vjp_matmul_common(c, "BatchMatMul", "adj_x", "adj_y", true); }

/* BiasAdd: value gets dy, bias gets dy summed over every axis but the
 * channel axis (TensorFlow's BiasAddGrad). */
static void vjp_bias_add(vjp_ctx *c) {
  if (c->need[0]) set_dx(c, 0, DY);
  if (c->need[1]) {
    int rank = X(0)->shape.rank;
    int ch = attr_is(attr(c, "data_format"), "NCHW") ? 1 : rank - 1;
    int64_t axes[PD_MAX_RANK];
    int n = 0;
    for (int i = 0; i < rank; i++)
      if (i != ch) axes[n++] = i;
    dev_attr a = dev_attr_int_list("axis", axes, n);
    set_dx(c, 1, run1(c, "Sum", DY, &a, 1));
  }
}

/* Sum and Mean: dy broadcast back over the reduced axes (divided by the
 * number of elements each output averaged, for Mean). */
static void vjp_reduce(vjp_ctx *c, bool mean) {
  const dev_attr_value *axis = attr(c, "axis");
  bool keep = attr(c, "keep_dims")->u.b;
  dev_attr a[2] = {dev_attr_int_list("axis", axis->u.ilist.v, keep ? 0 : axis->u.ilist.n),
                   dev_attr_bool("mean", mean)};
  set_dx(c, 0, run2(c, "BroadcastToLike", DY, X(0), a, 2));
}
static void vjp_sum(vjp_ctx *c) { vjp_reduce(c, false); }
static void vjp_mean(vjp_ctx *c) { vjp_reduce(c, true); }

static void vjp_reshape(vjp_ctx *c) { set_dx(c, 0, run2(c, "ReshapeLike", DY, X(0), NULL, 0)); }

/* Transpose: dy transposed by the inverse permutation. */
static void vjp_transpose(vjp_ctx *c) {
  const dev_attr_value *perm = attr(c, "perm");
  int64_t inv[PD_MAX_RANK];
  int n = perm->u.ilist.n; /* 0: reversal, its own inverse */
  for (int i = 0; i < n && i < PD_MAX_RANK; i++) inv[perm->u.ilist.v[i]] = i;
  dev_attr a = dev_attr_int_list("perm", inv, n);
  set_dx(c, 0, run1(c, "Transpose", DY, &a, 1));
}

/* Concat: each input gets its part of dy (ConcatGrad; from the end when the
 * inputs before it would pass the input limit). */
static void vjp_concat(vjp_ctx *c) {
  int64_t axis = attr(c, "axis")->u.i;
  int n = c->r->n_in;
  for (int j = 0; j < n; j++) {
    if (!c->need[j]) continue;
    dev_tensor *in[DEV_MAX_INPUTS];
    int cnt = 0;
    bool from_end = j + 2 > DEV_MAX_INPUTS;
    in[cnt++] = DY;
    if (!from_end)
      for (int k = 0; k <= j; k++) in[cnt++] = X(k);
    else
      for (int k = j; k < n; k++) in[cnt++] = X(k);
    dev_attr a[2] = {dev_attr_int("axis", axis), dev_attr_bool("from_end", from_end)};
    set_dx(c, j, run(c, "ConcatGrad", in, cnt, a, 2));
  }
}

static void vjp_slice(vjp_ctx *c) {
  const dev_attr_value *b = attr(c, "begin");
  dev_attr a = dev_attr_int_list("begin", b->u.ilist.v, b->u.ilist.n);
  set_dx(c, 0, run2(c, "SliceGrad", DY, X(0), &a, 1));
}

/* Gather: dy's slices added back at the indices; the indices get none. */
static void vjp_gather(vjp_ctx *c) {
  if (!c->need[0]) return;
  dev_attr a = dev_attr_int("axis", attr(c, "axis")->u.i);
  dev_tensor *in[3] = {DY, X(1), X(0)};
  set_dx(c, 0, run(c, "GatherGrad", in, 3, &a, 1));
}

/* Cast between floating dtypes: dy cast back. Other casts carry nothing. */
static void vjp_cast(vjp_ctx *c) {
  if (!is_float(Y)) return;
  if (Y->dtype == X(0)->dtype) {
    set_dx(c, 0, DY);
    return;
  }
  dev_attr a = dev_attr_dtype("DstT", X(0)->dtype);
  set_dx(c, 0, run1(c, "Cast", DY, &a, 1));
}

/* y = softmax(x) over the last axis: dx = (dy - sum(dy*y)) * y. */
static dev_tensor *softmax_vjp(vjp_ctx *c, dev_tensor *dy, dev_tensor *y) {
  int64_t last = -1;
  dev_attr a[2] = {dev_attr_int_list("axis", &last, 1), dev_attr_bool("keep_dims", true)};
  dev_tensor *s = run1(c, "Sum", run2(c, "Mul", dy, y, NULL, 0), a, 2);
  return run2(c, "Mul", run2(c, "Sub", dy, s, NULL, 0), y, NULL, 0);
}
static void vjp_softmax(vjp_ctx *c) { set_dx(c, 0, softmax_vjp(c, DY, Y)); }

/* y = logsoftmax(x): dx = dy - exp(y) * sum(dy). */
static void vjp_log_softmax(vjp_ctx *c) {
  int64_t last = -1;
  dev_attr a[2] = {dev_attr_int_list("axis", &last, 1), dev_attr_bool("keep_dims", true)};
  dev_tensor *s = run1(c, "Sum", DY, a, 2);
  set_dx(c, 0, run2(c, "Sub", DY, run2(c, "Mul", run1(c, "Exp", Y, NULL, 0), s, NULL, 0), NULL, 0));
}

/* SparseSoftmaxCrossEntropyWithLogits (TensorFlow's
 * _SparseSoftmaxCrossEntropyWithLogitsGrad): the loss's gradient is
 * dloss[:, None] * backprop; a gradient reaching the backprop output adds
 * softmax's VJP of it. Labels get none. */
static void vjp_sparse_xent(vjp_ctx *c) {
  if (!c->need[0]) return;
  dev_tensor *g = NULL;
  if (c->dy[0]) {
    int64_t shape[2] = {-1, 1};
    dev_attr a = dev_attr_int_list("shape", shape, 2);
    g = run2(c, "Mul", run1(c, "Reshape", c->dy[0], &a, 1), c->r->out[1], NULL, 0);
  }
  if (c->dy[1]) {
    dev_tensor *h = softmax_vjp(c, c->dy[1], run1(c, "Softmax", X(0), NULL, 0));
    g = g ? run2(c, "Add", g, h, NULL, 0) : h;
  }
  set_dx(c, 0, g);
}

/* AllReduce: the adjoint across the mesh is the same all-reduce of dy (sum
 * for sum, mean for mean); max, min and prod have no gradient here. */
static void vjp_all_reduce(vjp_ctx *c) {
  const dev_attr_value *red = attr(c, "reduction");
  if (c->rc != PD_OK) return;
  if (!attr_is(red, "sum") && !attr_is(red, "mean")) {
    c->rc = dev_error(c->st, PD_INVALID_ARGUMENT,
                      "AllReduce with reduction '%.*s' has no gradient, but the target depends on "
                      "a source through it; expected reduction sum or mean on the path",
                      (int)(red->u.s.len > 16 ? 16 : red->u.s.len), red->u.s.ptr);
    return;
  }
  dev_attr a = dev_attr_string("reduction", attr_is(red, "sum") ? "sum" : "mean");
  set_dx(c, 0, run1(c, "AllReduce", DY, &a, 1));
}

typedef void (*vjp_fn)(vjp_ctx *c);

static const struct {
  const char *name;
  vjp_fn fn;
} k_vjps[] = {
    {"Add", vjp_add},
    {"AllReduce", vjp_all_reduce},
    {"BatchMatMul", vjp_batch_matmul},
    {"BiasAdd", vjp_bias_add},
    {"Cast", vjp_cast},
    {"Concat", vjp_concat},
    {"Div", vjp_div},
    {"Exp", vjp_exp},
    {"Gather", vjp_gather},
    {"Identity", vjp_identity},
    {"Log", vjp_log},
    {"LogSoftmax", vjp_log_softmax},
    {"MatMul", vjp_matmul},
    {"Maximum", vjp_maximum},
    {"Mean", vjp_mean},
    {"Minimum", vjp_minimum},
    {"Mul", vjp_mul},
    {"Neg", vjp_neg},
    {"Pow", vjp_pow},
    {"Relu", vjp_relu},
    {"Reshape", vjp_reshape},
    {"Rsqrt", vjp_rsqrt},
    {"Sigmoid", vjp_sigmoid},
    {"Slice", vjp_slice},
    {"Softmax", vjp_softmax},
    {"SparseSoftmaxCrossEntropyWithLogits", vjp_sparse_xent},
    {"Sqrt", vjp_sqrt},
    {"Square", vjp_square},
    {"Sub", vjp_sub},
    {"Sum", vjp_sum},
    {"Tanh", vjp_tanh},
    {"Transpose", vjp_transpose},
};

static vjp_fn vjp_for(const dev_op_def *def) {
  for (size_t i = 0; i < sizeof k_vjps / sizeof k_vjps[0]; i++)
    if (strcmp(k_vjps[i].name, def->name) == 0) return k_vjps[i].fn;
  return NULL;
}

#undef X
#undef Y
#undef DY

/* ------------------------------------------------------------------------ */
/* The backward walk                                                         */

/* Adds g (consumed) to the gradient of `key` in `grads`. */
static pd_code accumulate(const dev_tape *tp, pmap *grads, dev_tensor *key, dev_tensor *g,
                          const char *op_name, dev_status *st) {
  void *old;
  if (!pmap_get(grads, key, &old)) {
    if (!pmap_reserve(grads, 1)) {
      dev_tensor_release(g);
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory computing a gradient");
    }
    pmap_put(grads, key, g);
    return PD_OK;
  }
  dev_tensor *in[2] = {old, g}, *sum = NULL;
  int n_out = 1;
  dev_status s = DEV_STATUS_INIT;
  pd_code rc = tape_exec(tp, "Add", in, 2, NULL, 0, &sum, &n_out, &s);
  dev_tensor_release(g);
  if (rc != PD_OK) return dev_error(st, rc, "gradient of %s: summing gradients: %s", op_name, s.msg);
  dev_tensor_release(old);
  pmap_put(grads, key, sum);
  return PD_OK;
}

static void release_map_values(pmap *m) {
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) dev_tensor_release(m->vals[i]);
}

/* Checks one tensor argument of dev_tape_gradient. */
static pd_code check_arg(const dev_tape *tp, const dev_tensor *t, const char *what, int i,
                         dev_status *st) {
  char name[32];
  if (i >= 0) snprintf(name, sizeof name, "%s %d", what, i);
  else snprintf(name, sizeof name, "%s", what);
  if (!t) return dev_error(st, PD_INVALID_ARGUMENT, "dev_tape_gradient: %s is NULL", name);
  if (t->engine != tp->engine)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "dev_tape_gradient: %s belongs to another engine than the tape", name);
  return PD_OK;
}

pd_code dev_tape_gradient(dev_tape *tp, dev_tensor *target, dev_tensor *const *sources,
                          int n_sources, dev_tensor *const *output_gradients,
                          dev_tensor **out_grads, dev_status *st) {
  if (!tp) return dev_error(st, PD_INVALID_ARGUMENT, "dev_tape_gradient: the tape is NULL");
  if (tp->used)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "this one-shot gradient tape has already computed its gradient; use a "
                     "persistent tape to compute gradients more than once");
  pd_code rc;
  if ((rc = check_arg(tp, target, "the target", -1, st))) return rc;
  if (n_sources < 0 || (n_sources > 0 && (!sources || !out_grads)))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_tape_gradient: %d sources%s; expected 0 or more sources and room for "
                     "their gradients",
                     n_sources, n_sources > 0 ? " but no source array or no output array" : "");
  for (int i = 0; i < n_sources; i++)
    if ((rc = check_arg(tp, sources[i], "source", i, st))) return rc;
  if (!dev_dtype_is_floating(target->dtype))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_tape_gradient: the target has dtype %s; expected a floating dtype "
                     "(integer and bool values carry no gradient)",
                     pd_dtype_name(target->dtype));
  dev_tensor *og = output_gradients ? output_gradients[0] : NULL;
  if (og) {
    if ((rc = check_arg(tp, og, "the output gradient", -1, st))) return rc;
    if (og->dtype != target->dtype || !same_shapes(og, target)) {
      char a[160], b[160];
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "dev_tape_gradient: the output gradient has dtype %s and shape %s but the "
                       "target has dtype %s and shape %s; expected the target's dtype and shape "
                       "on every component",
                       pd_dtype_name(og->dtype), dev_shape_str(&og->shape, a, sizeof a),
                       pd_dtype_name(target->dtype), dev_shape_str(&target->shape, b, sizeof b));
    }
  }

  dev_engine *e = tp->engine;
  pmap reach = {0}, grads = {0};
  dev_tensor **results = NULL;
  rc = PD_OK;

  /* Records after the target's producer cannot lead to it. */
  size_t end = 0;
  void *v = NULL;
  if (pmap_get(&tp->tracked, target, &v)) end = (size_t)(uintptr_t)v;

  bool target_is_source = false;
  for (int i = 0; i < n_sources; i++) target_is_source |= sources[i] == target;

  /* Tensors from which a tracked source can be reached, forwards. */
  if (!pmap_reserve(&reach, (size_t)n_sources)) goto oom;
  for (int i = 0; i < n_sources; i++)
    if (pmap_get(&tp->tracked, sources[i], NULL)) pmap_put(&reach, sources[i], NULL);
  for (size_t r = 0; r < end && reach.n > 0; r++) {
    const tape_rec *rec = tp->recs[r];
    bool hit = false;
    for (int j = 0; j < rec->n_in && !hit; j++)
      hit = ((rec->tracked >> j) & 1) && pmap_get(&reach, rec->in[j], NULL);
    if (!hit) continue;
    if (!pmap_reserve(&reach, (size_t)rec->n_out)) goto oom;
    for (int o = 0; o < rec->n_out; o++)
      if (is_float(rec->out[o])) pmap_put(&reach, rec->out[o], NULL);
  }

  /* The upstream gradient of the target. */
  if ((end > 0 && reach.n > 0) || target_is_source) {
    dev_tensor *dy = og;
    if (dy) {
      dev_tensor_retain(dy);
    } else {
      int n_out = 1;
      dev_status s = DEV_STATUS_INIT;
      if ((rc = tape_exec(tp, "OnesLike", &target, 1, NULL, 0, &dy, &n_out, &s)) != PD_OK) {
        rc = dev_error(st, rc, "gradient: ones like the target: %s", s.msg);
        goto fail;
      }
    }
    if (!pmap_reserve(&grads, 1)) {
      dev_tensor_release(dy);
      goto oom;
    }
    pmap_put(&grads, target, dy);
  }

  /* Backwards over the records. */
  for (size_t r = reach.n > 0 ? end : 0; r-- > 0;) {
    const tape_rec *rec = tp->recs[r];
    vjp_ctx c;
    memset(&c, 0, offsetof(vjp_ctx, temps)); /* dy, need, dx; temps are counted */
    c.n_temps = 0;
    bool any_dy = false, any_need = false;
    for (int o = 0; o < rec->n_out; o++) {
      void *g = NULL;
      c.dy[o] = pmap_get(&grads, rec->out[o], &g) ? g : NULL;
      any_dy |= c.dy[o] != NULL;
    }
    if (!any_dy) continue;
    for (int j = 0; j < rec->n_in; j++) {
      c.need[j] = ((rec->tracked >> j) & 1) && is_float(rec->in[j]) &&
                  pmap_get(&reach, rec->in[j], NULL);
      any_need |= c.need[j];
    }
    if (!any_need) continue;
    vjp_fn fn = vjp_for(rec->def);
    if (!fn) {
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "op %s has no gradient, but the target depends on a source through it; "
                     "expected only ops with a gradient between the target and the sources",
                     rec->def->name);
      goto fail;
    }
    c.e = e;
    c.tp = tp;
    c.r = rec;
    c.st = st;
    c.rc = PD_OK;
    fn(&c);
    for (int k = 0; k < c.n_temps; k++) dev_tensor_release(c.temps[k]);
    rc = c.rc;
    for (int j = 0; j < rec->n_in; j++) {
      dev_tensor *g = c.dx[j];
      if (!g) continue;
      if (rc != PD_OK || !c.need[j]) {
        dev_tensor_release(g);
        continue;
      }
      if (g->dtype != rec->in[j]->dtype || !same_shapes(g, rec->in[j])) {
        char a[160], b[160];
        rc = dev_error(st, PD_INTERNAL,
                       "gradient of %s: input %d's gradient has dtype %s and shape %s; expected "
                       "%s and %s",
                       rec->def->name, j, pd_dtype_name(g->dtype),
                       dev_shape_str(&g->shape, a, sizeof a), pd_dtype_name(rec->in[j]->dtype),
                       dev_shape_str(&rec->in[j]->shape, b, sizeof b));
        dev_tensor_release(g);
        continue;
      }
      rc = accumulate(tp, &grads, rec->in[j], g, rec->def->name, st);
    }
    if (rc != PD_OK) goto fail;
  }

  /* One gradient per source; zeros where none arrived. */
  if (n_sources > 0) {
    results = calloc((size_t)n_sources, sizeof *results);
    if (!results) goto oom;
  }
  for (int i = 0; i < n_sources; i++) {
    void *g;
    if (pmap_get(&grads, sources[i], &g)) {
      dev_tensor_retain(g);
      results[i] = g;
      continue;
    }
    int n_out = 1;
    dev_status s = DEV_STATUS_INIT;
    if ((rc = tape_exec(tp, "ZerosLike", &sources[i], 1, NULL, 0, &results[i], &n_out, &s))) {
      rc = dev_error(st, rc, "gradient: zeros like source %d: %s", i, s.msg);
      goto fail;
    }
  }
  for (int i = 0; i < n_sources; i++) out_grads[i] = results[i];
  free(results);
  release_map_values(&grads);
  pmap_free(&grads);
  pmap_free(&reach);
  if (!tp->persistent) {
    tape_clear(tp);
    tp->used = true;
  }
  return PD_OK;

oom:
  rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory computing a gradient");
fail:
  if (results)
    for (int i = 0; i < n_sources; i++) dev_tensor_release(results[i]);
  free(results);
  release_map_values(&grads);
  pmap_free(&grads);
  pmap_free(&reach);
  return rc;
}
