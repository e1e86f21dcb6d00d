/* Gradients nodes expanded (fn_int.h, fn_expand_gradients): each
 * FN_NODE_GRADIENTS node is replaced by the backward nodes the gradient
 * tape's VJPs (device/vjp.c, vjp_more.c) emit, so a function's gradients
 * follow the same rules as the eager tape's, with no second set of them.
 *
 * How: every graph value gets a placeholder dev_tensor with its dtype and
 * component shapes (dev__tensor_new: nothing is allocated or submitted).
 * The forward nodes y depends on are offered to a temporary tape as
 * prepared ops over those placeholders (a dev_op filled by hand from the
 * node: the node is already resolved and inferred, so nothing is prepared
 * twice), the sources are watched, and dev_tape_gradient runs with an
 * executor that appends a node to the graph per gradient op instead of
 * running it (before the Gradients node, so the order stays topological)
 * and answers placeholders of the node's inferred outputs. The uses of the
 * Gradients node's outputs then read the gradients, and the node is
 * dropped. Nodes are expanded in order, so an outer Gradients node whose
 * region holds an inner, already expanded one differentiates through the
 * inner one's backward nodes: gradients of gradients.
 *
 * Source: tf.gradients (a symbolic gradient inside a graph) over
 * GradientTape's rules (tensorflow/c/eager/tape.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tape_int.h"
#include "fn_int.h"

/* One expansion's state: the placeholders of graph values (ref <-> tensor)
 * and where backward nodes go. */
typedef struct gx {
  fn_graph *g;
  dev_engine *e;
  int pos;          /* the Gradients node's index; backward nodes go here */
  const char *name; /* the Gradients node's name (copy) */
  /* Placeholders of forward values, by ref (NULL until made). */
  dev_tensor **arg_t, **const_t, **node_t; /* node_t[i*FN_MAX_NODE_OUTPUTS+k] */
  int n_fwd;                               /* nodes < pos at the start */
  dev_tape *tp;
  int *rec_node; /* tape record r -> the forward node it records */
  int n_rec;
  /* Every placeholder made (references held, so addresses stay unique),
   * with its ref; tensor -> index + 1 in `by_t`. */
  dev_tensor **all;
  fn_ref *refs;
  int n_all, cap_all;
  pmap by_t;
} gx;

static pd_code oom(dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED,
                   "host out of memory expanding a Gradients node");
}

/* Keeps t (a new reference, consumed) as the placeholder of r. */
static pd_code keep(gx *x, dev_tensor *t, fn_ref r, dev_status *st) {
  if (x->n_all == x->cap_all) {
    int cap = x->cap_all ? x->cap_all * 2 : 64;
    dev_tensor **a = realloc(x->all, sizeof *a * (size_t)cap);
    if (!a) goto fail;
    x->all = a;
    fn_ref *rr = realloc(x->refs, sizeof *rr * (size_t)cap);
    if (!rr) goto fail;
    x->refs = rr;
    x->cap_all = cap;
  }
  if (!dev__pmap_reserve(&x->by_t, 1)) goto fail;
  x->all[x->n_all] = t;
  x->refs[x->n_all] = r;
  x->n_all++;
  dev__pmap_put(&x->by_t, t, (void *)(uintptr_t)x->n_all);
  return PD_OK;
fail:
  dev_tensor_release(t);
  return oom(st);
}

/* A placeholder with dtype dt and the component shapes of ref r. */
static pd_code make_placeholder(gx *x, fn_ref r, dev_tensor **out,
                                dev_status *st) {
  const int nd = x->g->n_dev;
  dev_shape *sh = malloc(sizeof *sh * (size_t)nd);
  if (!sh) return oom(st);
  for (int d = 0; d < nd; d++) sh[d] = *fn_ref_shape(x->g, r, d);
  dev_tensor *t = NULL;
  /* n_dev components: the call's set has that many devices; graph values
   * only need the count, so the first nd of the mesh stand for them. */
  dev_devset set = {.n = nd};
  for (int d = 0; d < nd; d++) set.dev[d] = (uint8_t)d;
  pd_code rc = dev__tensor_new(x->e, &set, fn_ref_dtype(x->g, r), sh, &t, st);
  free(sh);
  if (rc != PD_OK) return rc;
  t->not_mirrored = fn_ref_not_mirrored(x->g, r);
  PD_TRY(keep(x, t, r, st));
  *out = t;
  return PD_OK;
}

/* The placeholder of forward value r (made on first use; borrowed). */
static pd_code fwd_tensor(gx *x, fn_ref r, dev_tensor **out, dev_status *st) {
  dev_tensor **slot = NULL;
  switch (r.kind) {
    case FN_REF_ARG: slot = &x->arg_t[r.idx]; break;
    case FN_REF_CONST: slot = &x->const_t[r.idx]; break;
    case FN_REF_NODE:
      if (r.idx >= x->n_fwd)
        return dev_error(st, PD_INTERNAL,
                         "function '%s', node '%s': a forward value refers "
                         "to node %d, after the Gradients node",
                         x->g->fn_name, x->name, r.idx);
      slot = &x->node_t[r.idx * FN_MAX_NODE_OUTPUTS + r.out];
      break;
  }
  if (!*slot) PD_TRY(make_placeholder(x, r, slot, st));
  *out = *slot;
  return PD_OK;
}

/* The tape's executor: appends op_name as a node before the Gradients node
 * and answers placeholders of its outputs (new references). */
static pd_code emit(void *arg, const char *op_name, dev_tensor *const *inputs,
                    int num_inputs, const dev_attr *attrs, int num_attrs,
                    dev_tensor **outputs, int *num_outputs, dev_status *st) {
  gx *x = arg;
  const dev_op_def *def = dev_op_lookup(op_name);
  if (!def)
    return dev_error(st, PD_INTERNAL, "gradient op %s is not registered",
                     op_name);
  fn_ref in[DEV_MAX_INPUTS];
  if (num_inputs > DEV_MAX_INPUTS)
    return dev_error(st, PD_INTERNAL, "gradient op %s: %d inputs", op_name,
                     num_inputs);
  for (int j = 0; j < num_inputs; j++) {
    void *v = NULL;
    if (!dev__pmap_get(&x->by_t, inputs[j], &v))
      return dev_error(st, PD_INTERNAL,
                       "gradient op %s: input %d is not a value of the graph",
                       op_name, j);
    in[j] = x->refs[(uintptr_t)v - 1];
  }
  char nm[DEV_FN_NAME_MAX + 64];
  snprintf(nm, sizeof nm, "%s/%s", x->name, op_name);
  int idx = -1;
  PD_TRY(fn_graph_insert_op(x->g, x->pos, nm, def, in, num_inputs, attrs,
                            num_attrs, &idx, st));
  x->pos++;
  /* What it stands for: the Gradients node and the forward node whose VJP
   * made it (none for the seed and the zeros of sources not reached), so
   * origins always name registered nodes. */
  int from[2] = {x->pos, -1}, n_from = 1;
  size_t cr = x->tp ? x->tp->cur_rec : 0;
  if (cr > 0 && (int)cr <= x->n_rec) from[n_from++] = x->rec_node[cr - 1];
  PD_TRY(fn_node_merge_origins(x->g, idx, from, n_from, st));
  const fn_node *n = &x->g->nodes[idx];
  if (n->n_out > *num_outputs)
    return dev_error(st, PD_INTERNAL, "gradient op %s: %d outputs, room for %d",
                     op_name, n->n_out, *num_outputs);
  for (int k = 0; k < n->n_out; k++) {
    dev_tensor *t = NULL;
    pd_code rc = make_placeholder(x, fn_node_ref(idx, k), &t, st);
    if (rc != PD_OK) {
      for (int q = 0; q < k; q++) dev_tensor_release(outputs[q]);
      return rc;
    }
    dev_tensor_retain(t); /* one for the map, one for the caller */
    outputs[k] = t;
  }
  *num_outputs = n->n_out;
  return PD_OK;
}

/* Marks in need[] the nodes before `end` that `y` depends on. */
static void mark_ancestors(const fn_graph *g, fn_ref y, int end, bool *need) {
  if (y.kind == FN_REF_NODE) need[y.idx] = true;
  for (int i = end - 1; i >= 0; i--) {
    if (!need[i]) continue;
    const fn_node *n = &g->nodes[i];
    for (int j = 0; j < n->n_in; j++)
      if (n->in[j].kind == FN_REF_NODE) need[n->in[j].idx] = true;
  }
}

/* Offers forward node i to the tape as a prepared op over placeholders. */
static pd_code record_node(gx *x, dev_tape *tp, int i, dev_status *st) {
  const fn_node *n = &x->g->nodes[i];
  if (n->kind != FN_NODE_OP)
    return dev_error(st, PD_INTERNAL,
                     "function '%s', node '%s': node '%s' before it is not an "
                     "op (calls are inlined and Gradients nodes expanded "
                     "first)",
                     x->g->fn_name, x->name, n->name);
  dev_op *op = calloc(1, sizeof *op);
  if (!op) return oom(st);
  op->def = n->def;
  op->engine = x->e;
  op->num_inputs = n->n_in;
  op->num_outputs = n->n_out;
  pd_code rc = PD_OK;
  for (int j = 0; j < n->n_in && rc == PD_OK; j++)
    rc = fwd_tensor(x, n->in[j], &op->inputs[j], st);
  for (int k = 0; k < n->n_out && rc == PD_OK; k++)
    rc = fwd_tensor(x, fn_node_ref(i, k), &op->outputs[k], st);
  if (rc == PD_OK) {
    memcpy(op->attrs, n->attrs, sizeof(dev_attr_value) * DEV_MAX_ATTRS);
    size_t before = tp->n_recs;
    rc = dev_tape_record(tp, op, st);
    if (rc == PD_OK && tp->n_recs > before && x->n_rec < x->n_fwd)
      x->rec_node[x->n_rec++] = i;
  }
  free(op); /* the tensors are borrowed from x */
  return rc;
}

static bool node_bool_attr(const fn_node *n, const char *name) {
  for (int a = 0; a < n->n_attrs && a < DEV_MAX_ATTRS; a++)
    if (n->attr_names[a] && strcmp(n->attr_names[a], name) == 0)
      return n->attrs[a].type == DEV_ATTR_BOOL && n->attrs[a].u.b;
  return false;
}

static void gx_free(gx *x) {
  for (int i = 0; i < x->n_all; i++) dev_tensor_release(x->all[i]);
  free(x->all);
  free(x->refs);
  free(x->arg_t);
  free(x->const_t);
  free(x->node_t);
  free(x->rec_node);
  dev__pmap_free(&x->by_t);
}

/* Value flags over args, constants and node outputs before node `end`. */
typedef struct vflags {
  bool *arg, *cst, *node; /* node[i * FN_MAX_NODE_OUTPUTS + k] */
} vflags;

static bool *vflag(const vflags *f, fn_ref r) {
  switch (r.kind) {
    case FN_REF_ARG: return &f->arg[r.idx];
    case FN_REF_CONST: return &f->cst[r.idx];
    case FN_REF_NODE: return &f->node[r.idx * FN_MAX_NODE_OUTPUTS + r.out];
  }
  return NULL;
}

static bool vflags_new(const fn_graph *g, int end, vflags *f) {
  f->arg = calloc((size_t)g->n_args + 1, 1);
  f->cst = calloc((size_t)g->n_consts + 1, 1);
  f->node = calloc((size_t)(end + 1) * FN_MAX_NODE_OUTPUTS, 1);
  return f->arg && f->cst && f->node;
}

static void vflags_free(vflags *f) {
  free(f->arg);
  free(f->cst);
  free(f->node);
}

static bool records(const fn_node *n) {
  return n->kind == FN_NODE_OP && strcmp(n->def->name, "OnesLike") != 0 &&
         strcmp(n->def->name, "ZerosLike") != 0;
}

/* The node the tape's walk from y back to the sources meets first whose op
 * has no gradient (the tape's rules: floating values only, OnesLike and
 * ZerosLike cut paths), or -1. For the error, which names it. */
static int first_without_gradient(const fn_graph *g, int gi) {
  const fn_node *gn = &g->nodes[gi];
  int k = gn->n_in - 1 - (node_bool_attr(gn, "has_grad_y") ? 1 : 0);
  vflags reach = {0}, want = {0};
  int found = -1;
  if (!vflags_new(g, gi, &reach) || !vflags_new(g, gi, &want)) goto out;
  for (int s = 0; s < k; s++)
    if (dev_dtype_is_floating(fn_ref_dtype(g, gn->in[1 + s])))
      *vflag(&reach, gn->in[1 + s]) = true;
  for (int i = 0; i < gi; i++) {
    const fn_node *n = &g->nodes[i];
    bool hit = false;
    for (int j = 0; j < n->n_in && !hit && !n->dead && records(n); j++)
      hit = *vflag(&reach, n->in[j]);
    for (int o = 0; hit && o < n->n_out; o++)
      if (dev_dtype_is_floating(n->out_dtype[o]))
        *vflag(&reach, fn_node_ref(i, o)) = true;
  }
  *vflag(&want, gn->in[0]) = true;
  for (int i = gi - 1; i >= 0 && found < 0; i--) {
    const fn_node *n = &g->nodes[i];
    bool wanted = false, any_in = false;
    for (int o = 0; o < n->n_out && !wanted; o++)
      wanted = *vflag(&want, fn_node_ref(i, o));
    if (!wanted || n->dead || !records(n)) continue;
    for (int j = 0; j < n->n_in; j++)
      if (*vflag(&reach, n->in[j]) &&
          dev_dtype_is_floating(fn_ref_dtype(g, n->in[j]))) {
        any_in = true;
        *vflag(&want, n->in[j]) = true;
      }
    if (any_in && !dev_op_def_has_gradient(n->def)) found = i;
  }
out:
  vflags_free(&reach);
  vflags_free(&want);
  return found;
}

/* Checks node gi's inputs: y floating, grad_y like y. */
static pd_code check_node(const fn_graph *g, int gi, int k, bool has_gy,
                          dev_status *st) {
  const fn_node *n = &g->nodes[gi];
  char where[300];
  fn_node_describe(g, gi, where, sizeof where);
  if (k < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: %s has %d inputs; expected y, the sources%s", where,
                     DEV_FN_GRADIENTS_OP, n->n_in, has_gy ? " and grad_y" : "");
  if (k > FN_MAX_NODE_OUTPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: %d sources; at most %d gradients per %s node", where,
                     k, FN_MAX_NODE_OUTPUTS, DEV_FN_GRADIENTS_OP);
  pd_dtype ydt = fn_ref_dtype(g, n->in[0]);
  if (!dev_dtype_is_floating(ydt))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: y has dtype %s; expected a floating dtype (integer "
                     "and bool values carry no gradient)",
                     where, pd_dtype_name(ydt));
  if (!has_gy) return PD_OK;
  fn_ref gy = n->in[n->n_in - 1];
  bool same = fn_ref_dtype(g, gy) == ydt;
  for (int d = 0; same && d < g->n_dev; d++)
    same =
        dev_shape_equal(fn_ref_shape(g, gy, d), fn_ref_shape(g, n->in[0], d));
  if (!same) {
    char a[160], b[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: grad_y has dtype %s and shape %s but y has dtype %s "
                     "and shape %s; expected y's dtype and shape on every "
                     "component",
                     where, pd_dtype_name(fn_ref_dtype(g, gy)),
                     dev_shape_str(fn_ref_shape(g, gy, 0), a, sizeof a),
                     pd_dtype_name(ydt),
                     dev_shape_str(fn_ref_shape(g, n->in[0], 0), b, sizeof b));
  }
  return PD_OK;
}

/* Expands Gradients node gi: backward nodes inserted before it, its uses
 * redirected, the node marked dead (the caller compacts). */
static pd_code expand_one(fn_graph *g, dev_engine *e, int gi, dev_status *st) {
  fn_node *gn = &g->nodes[gi];
  bool has_gy = node_bool_attr(gn, "has_grad_y");
  int k = gn->n_in - 1 - (has_gy ? 1 : 0);
  PD_TRY(check_node(g, gi, k, has_gy, st));

  gx x;
  memset(&x, 0, sizeof x);
  x.g = g;
  x.e = e;
  x.pos = gi;
  x.n_fwd = gi;
  char *gname = fn_graph_strdup(gn->name);
  fn_ref *ins = malloc(sizeof *ins * (size_t)gn->n_in);
  bool *need = calloc((size_t)(gi ? gi : 1), 1);
  x.arg_t = calloc((size_t)(g->n_args ? g->n_args : 1), sizeof *x.arg_t);
  x.const_t =
      calloc((size_t)(g->n_consts ? g->n_consts : 1), sizeof *x.const_t);
  x.node_t =
      calloc((size_t)(gi ? gi : 1) * FN_MAX_NODE_OUTPUTS, sizeof *x.node_t);
  x.rec_node = calloc((size_t)(gi ? gi : 1), sizeof *x.rec_node);
  dev_tape *tp = NULL;
  pd_code rc = PD_OK;
  if (!gname || !ins || !need || !x.arg_t || !x.const_t || !x.node_t ||
      !x.rec_node) {
    rc = oom(st);
    goto out;
  }
  x.name = gname;
  memcpy(ins, gn->in, sizeof *ins * (size_t)gn->n_in);
  PD_TRY_GOTO(dev_tape_create(e, false, &tp, st), rc, out);
  dev_tape_set_executor(tp, emit, &x);
  x.tp = tp;

  dev_tensor *y = NULL, *gy = NULL, *src[FN_MAX_NODE_OUTPUTS];
  PD_TRY_GOTO(fwd_tensor(&x, ins[0], &y, st), rc, out);
  for (int i = 0; i < k; i++)
    PD_TRY_GOTO(fwd_tensor(&x, ins[1 + i], &src[i], st), rc, out);
  if (has_gy) PD_TRY_GOTO(fwd_tensor(&x, ins[k + 1], &gy, st), rc, out);
  /* A source is watched before its consumers are recorded and after its
   * producer is (a watched tensor's producer would not be recorded, and
   * the paths through a source to earlier sources would be lost). */
  for (int i = 0; i < k; i++)
    if (ins[1 + i].kind != FN_REF_NODE)
      PD_TRY_GOTO(dev_tape_watch(tp, src[i], st), rc, out);
  mark_ancestors(g, ins[0], gi, need);
  for (int i = 0; i < gi; i++) {
    if (need[i] && !g->nodes[i].dead)
      PD_TRY_GOTO(record_node(&x, tp, i, st), rc, out);
    for (int s = 0; s < k; s++)
      if (ins[1 + s].kind == FN_REF_NODE && ins[1 + s].idx == i)
        PD_TRY_GOTO(dev_tape_watch(tp, src[s], st), rc, out);
  }

  dev_tensor *grads[FN_MAX_NODE_OUTPUTS] = {0};
  dev_status ts = DEV_STATUS_INIT;
  rc = dev_tape_gradient(tp, y, src, k, has_gy ? &gy : NULL, grads, &ts);
  if (rc != PD_OK) {
    char where[300];
    fn_node_describe(g, x.pos, where, sizeof where);
    int bad = rc == PD_INVALID_ARGUMENT ? first_without_gradient(g, x.pos) : -1;
    if (bad >= 0)
      rc = dev_error(st, rc,
                     "%s (%s): y depends on a source through node '%s' (op "
                     "%s), which has no gradient; expected only ops with a "
                     "gradient between y and the sources",
                     where, DEV_FN_GRADIENTS_OP, g->nodes[bad].name,
                     g->nodes[bad].def->name);
    else
      rc = dev_error(st, rc, "%s (%s): %s", where, DEV_FN_GRADIENTS_OP, ts.msg);
    goto out;
  }
  /* Each gradient is a placeholder the executor made (or a forward value:
   * the upstream gradient when a source is y). */
  fn_ref res[FN_MAX_NODE_OUTPUTS];
  for (int i = 0; i < k; i++) {
    void *v = NULL;
    if (!dev__pmap_get(&x.by_t, grads[i], &v) && rc == PD_OK)
      rc = dev_error(st, PD_INTERNAL,
                     "function '%s', node '%s': gradient %d is not a value of "
                     "the graph",
                     g->fn_name, gname, i);
    else if (v)
      res[i] = x.refs[(uintptr_t)v - 1];
    dev_tensor_release(grads[i]);
  }
  if (rc != PD_OK) goto out;
  gi = x.pos; /* the Gradients node, after the inserted nodes */
  for (int i = 0; i < k; i++)
    fn_graph_replace_uses(g, fn_node_ref(gi, i), res[i], gi + 1);
  g->nodes[gi].dead = true;
out:
  dev_tape_destroy(tp);
  gx_free(&x);
  free(gname);
  free(ins);
  free(need);
  return rc;
}

pd_code fn_expand_gradients(fn_graph *g, dev_engine *e, dev_status *st) {
  for (;;) {
    int gi = -1;
    for (int i = 0; i < g->n_nodes && gi < 0; i++)
      if (!g->nodes[i].dead && g->nodes[i].kind == FN_NODE_GRADIENTS) gi = i;
    if (gi < 0) return PD_OK;
    PD_TRY(expand_one(g, e, gi, st));
    fn_graph_compact(g);
  }
}
