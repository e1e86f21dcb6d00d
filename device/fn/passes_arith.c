/* Arithmetic simplification (Grappler's arithmetic optimizer, the parts
 * that need no cost model): Identity removed; x*1, 1*x, x+0, 0+x, x-0 and
 * x/1 replaced by x when "1" / "0" is a constant or a Fill whose every
 * element is that number and the op's output has x's dtype and component
 * shapes (no broadcast hidden); Neg(Neg(x)) -> x; a Transpose whose
 * permutation is the identity removed, two Transposes composed into one;
 * Reshape of a Reshape made one Reshape, a Reshape to the shape its input
 * already has removed (on every component); a Transpose swapping a MatMul
 * operand's two axes (BatchMatMul's last two) folded into transpose_a /
 * transpose_b (adj_x / adj_y). A node rewritten keeps its name and carries
 * the origins of the nodes it absorbed. Nodes left without uses go. */
#include <stdlib.h>
#include <string.h>

#include "passes_int.h"

static pd_code oom(dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
}

bool fn__same_shapes(const fn_graph *g, fn_ref a, fn_ref b) {
  for (int d = 0; d < g->n_dev; d++)
    if (!dev_shape_equal(fn_ref_shape(g, a, d), fn_ref_shape(g, b, d)))
      return false;
  return true;
}

bool fn__uniform_value(const fn_graph *g, fn_ref r, double *v) {
  if (r.kind == FN_REF_CONST) {
    const fn_const *c = &g->consts[r.idx];
    int64_t n = dev_num_elems(&c->shape);
    if (n < 1 || !c->data) return false;
    double v0 = dev_load_f64(c->dtype, c->data, 0);
    if (v0 != v0) return false; /* NaN */
    for (int64_t i = 1; i < n; i++)
      if (dev_load_f64(c->dtype, c->data, i) != v0) return false;
    *v = v0;
    return true;
  }
  if (r.kind != FN_REF_NODE) return false;
  const fn_node *f = &g->nodes[r.idx];
  if (f->dead || f->kind != FN_NODE_OP || strcmp(f->def->name, "Fill") != 0)
    return false;
  const dev_attr_value *val = fn_node_attr(f, "value");
  if (!val || val->type != DEV_ATTR_FLOAT || val->u.f != val->u.f) return false;
  for (int d = 0; d < g->n_dev; d++)
    if (dev_num_elems(&f->out_shape[d]) < 1) return false;
  uint64_t cell = 0; /* the value as the dtype stores it */
  dev_store_f64(f->out_dtype[0], &cell, 0, val->u.f);
  *v = dev_load_f64(f->out_dtype[0], &cell, 0);
  return true;
}

/* Infers def on inputs in[] with attrs: true when it gives node old's
 * dtypes and component shapes. *rc an error only on host memory. */
static bool infers_like(fn_graph *g, int old, const dev_op_def *def,
                        const fn_ref *in, int n_in, const dev_attr *attrs,
                        int n_attrs, pd_code *rc, dev_status *st) {
  const fn_node *o = &g->nodes[old];
  const int nd = g->n_dev;
  dev_attr_value vals[DEV_MAX_ATTRS];
  void *arena = NULL;
  dev_status lst = DEV_STATUS_INIT;
  if (dev__resolve_attrs(def, attrs, n_attrs, vals, &arena, &lst) != PD_OK) {
    if (lst.code == PD_RESOURCE_EXHAUSTED) *rc = oom(st);
    return false;
  }
  pd_dtype in_dt[DEV_MAX_INPUTS], out_dt[DEV_MAX_OUTPUTS];
  dev_shape *shapes =
      malloc(sizeof(dev_shape) * (size_t)nd * (size_t)(n_in + DEV_MAX_OUTPUTS));
  bool ok = false;
  if (!shapes) {
    *rc = oom(st);
    free(arena);
    return false;
  }
  dev_shape *out_sh = shapes + (size_t)nd * (size_t)n_in;
  for (int j = 0; j < n_in; j++) {
    in_dt[j] = fn_ref_dtype(g, in[j]);
    for (int d = 0; d < nd; d++)
      shapes[j * nd + d] = *fn_ref_shape(g, in[j], d);
  }
  int nout = 0;
  if (dev__infer_op(def, vals, NULL, nd, n_in, in_dt, shapes, &nout, out_dt,
                    out_sh, &lst) == PD_OK &&
      nout == o->n_out) {
    ok = true;
    for (int k = 0; k < nout && ok; k++) {
      ok = out_dt[k] == o->out_dtype[k];
      for (int d = 0; d < nd && ok; d++)
        ok = dev_shape_equal(&out_sh[k * nd + d], &o->out_shape[k * nd + d]);
    }
  }
  free(shapes);
  free(arena);
  return ok;
}

bool fn__replace_node(fn_graph *g, int old, const dev_op_def *def,
                      const fn_ref *in, int n_in, const dev_attr *attrs,
                      int n_attrs, const int *from, int n_from, int *at,
                      pd_code *rc, dev_status *st) {
  *rc = PD_OK;
  if (!def || !infers_like(g, old, def, in, n_in, attrs, n_attrs, rc, st))
    return false;
  int idx;
  dev_status lst = DEV_STATUS_INIT;
  if (fn_graph_insert_op(g, old, g->nodes[old].name, def, in, n_in, attrs,
                         n_attrs, &idx, &lst) != PD_OK) {
    /* At DEV_FN_MAX_NODES the graph stays as it is; only OOM is an error. */
    if (lst.code == PD_RESOURCE_EXHAUSTED) *rc = oom(st);
    return false;
  }
  int from2[64];
  if (n_from > (int)(sizeof from2 / sizeof from2[0]))
    n_from = (int)(sizeof from2 / sizeof from2[0]);
  for (int k = 0; k < n_from; k++)
    from2[k] = from[k] >= idx ? from[k] + 1 : from[k];
  /* Origins first, while old still has its own name (a node without
   * origins stands for itself): after the swap below it carries the
   * insertion's made-up name ("r_1"), which no one registered. */
  *rc = fn_node_merge_origins(g, idx, from2, n_from, st);
  fn_node *nn = &g->nodes[idx], *on = &g->nodes[idx + 1];
  char *tmp = nn->name; /* the rewritten node keeps its name */
  nn->name = on->name;
  on->name = tmp;
  for (int k = 0; k < on->n_out; k++)
    fn_graph_replace_uses(g, fn_node_ref(idx + 1, k), fn_node_ref(idx, k),
                          idx + 2);
  on->dead = true;
  *at = idx;
  return *rc == PD_OK;
}

/* Node i's uses all go to value x; i is removed. */
static void bypass(fn_graph *g, int i, fn_ref x, int *changes) {
  fn_graph_replace_uses(g, fn_node_ref(i, 0), x, i + 1);
  g->nodes[i].dead = true;
  (*changes)++;
}

/* The live OP node r refers to when it runs op `name`, else NULL. */
static const fn_node *producer(const fn_graph *g, fn_ref r, const char *name) {
  if (r.kind != FN_REF_NODE) return NULL;
  const fn_node *p = &g->nodes[r.idx];
  if (p->dead || p->kind != FN_NODE_OP || strcmp(p->def->name, name) != 0)
    return NULL;
  return p;
}

static bool is_value(const fn_graph *g, fn_ref r, double want) {
  double v;
  return fn__uniform_value(g, r, &v) && v == want;
}

/* x op c == x: the operand kept, or -1. */
static int neutral_operand(const fn_graph *g, int i) {
  const fn_node *n = &g->nodes[i];
  if (n->n_in != 2 || n->n_out != 1) return -1;
  const char *op = n->def->name;
  fn_ref me = fn_node_ref(i, 0);
  for (int s = 0; s < 2; s++) {
    fn_ref x = n->in[s], c = n->in[1 - s];
    if (fn_ref_dtype(g, x) != n->out_dtype[0] || !fn__same_shapes(g, me, x))
      continue;
    bool second = s == 0; /* c is the second operand */
    if ((strcmp(op, "Add") == 0 && is_value(g, c, 0)) ||
        (strcmp(op, "Mul") == 0 && is_value(g, c, 1)) ||
        (second && strcmp(op, "Sub") == 0 && is_value(g, c, 0)) ||
        (second && strcmp(op, "Div") == 0 && is_value(g, c, 1)))
      return s;
  }
  return -1;
}

/* The effective permutation of Transpose node n (rank of its input). */
static int perm_of(const fn_graph *g, const fn_node *n, int *p) {
  int r = fn_ref_shape(g, n->in[0], 0)->rank;
  const dev_attr_value *a = fn_node_attr(n, "perm");
  for (int i = 0; i < r; i++)
    p[i] = a->u.ilist.n == 0 ? r - 1 - i : (int)a->u.ilist.v[i];
  return r;
}

static bool perm_is_identity(const int *p, int r) {
  for (int i = 0; i < r; i++)
    if (p[i] != i) return false;
  return true;
}

/* Transpose node i: identity removed, or composed with a Transpose input. */
static pd_code simplify_transpose(fn_graph *g, int *i, int *changes,
                                  dev_status *st) {
  int p2[PD_MAX_RANK], p1[PD_MAX_RANK], q[PD_MAX_RANK];
  int r = perm_of(g, &g->nodes[*i], p2);
  if (perm_is_identity(p2, r)) {
    bypass(g, *i, g->nodes[*i].in[0], changes);
    return PD_OK;
  }
  const fn_node *t = producer(g, g->nodes[*i].in[0], "Transpose");
  if (!t) return PD_OK;
  perm_of(g, t, p1);
  for (int k = 0; k < r; k++) q[k] = p1[p2[k]];
  fn_ref x = t->in[0];
  if (perm_is_identity(q, r)) {
    bypass(g, *i, x, changes);
    return PD_OK;
  }
  int64_t qv[PD_MAX_RANK];
  for (int k = 0; k < r; k++) qv[k] = q[k];
  dev_attr at = {"perm", {.type = DEV_ATTR_INT_LIST, .u.ilist = {qv, r}}};
  int from[2] = {g->nodes[*i].in[0].idx, *i}, idx;
  pd_code rc;
  if (fn__replace_node(g, *i, g->nodes[*i].def, &x, 1, &at, 1, from, 2, &idx,
                       &rc, st)) {
    (*changes)++;
    *i = idx + 1;
  }
  return rc;
}

static pd_code simplify_reshape(fn_graph *g, int *i, int *changes,
                                dev_status *st) {
  fn_ref me = fn_node_ref(*i, 0);
  fn_ref in = g->nodes[*i].in[0];
  if (fn__same_shapes(g, me, in)) {
    bypass(g, *i, in, changes);
    return PD_OK;
  }
  const fn_node *t = producer(g, in, "Reshape");
  if (!t) return PD_OK;
  fn_ref x = t->in[0];
  if (fn__same_shapes(g, me, x)) {
    bypass(g, *i, x, changes);
    return PD_OK;
  }
  const dev_attr_value *s = fn_node_attr(&g->nodes[*i], "shape");
  int64_t sv[DEV_ATTR_LIST_MAX];
  int n = s->u.ilist.n;
  if (n) memcpy(sv, s->u.ilist.v, sizeof(int64_t) * (size_t)n);
  dev_attr at = {"shape", {.type = DEV_ATTR_INT_LIST, .u.ilist = {sv, n}}};
  int from[2] = {in.idx, *i}, idx;
  pd_code rc;
  if (fn__replace_node(g, *i, g->nodes[*i].def, &x, 1, &at, 1, from, 2, &idx,
                       &rc, st)) {
    (*changes)++;
    *i = idx + 1;
  }
  return rc;
}

/* A MatMul / BatchMatMul operand that is a Transpose of its two (last two)
 * axes becomes the Transpose's input with the op's flag flipped. */
static pd_code fold_transposes(fn_graph *g, int *i, int *changes,
                               dev_status *st) {
  const fn_node *m = &g->nodes[*i];
  bool batch = strcmp(m->def->name, "BatchMatMul") == 0;
  const char *flag[2] = {batch ? "adj_x" : "transpose_a",
                         batch ? "adj_y" : "transpose_b"};
  fn_ref in[2] = {m->in[0], m->in[1]};
  dev_attr at[2];
  int from[3], nf = 0;
  for (int s = 0; s < 2; s++) {
    const dev_attr_value *fv = fn_node_attr(m, flag[s]);
    at[s].name = flag[s];
    at[s].value = *fv;
    const fn_node *t = producer(g, m->in[s], "Transpose");
    if (!t) continue;
    int p[PD_MAX_RANK], r = perm_of(g, t, p);
    if (r < 2 || (!batch && r != 2)) continue;
    bool swap = p[r - 1] == r - 2 && p[r - 2] == r - 1;
    for (int k = 0; k + 2 < r && swap; k++) swap = p[k] == k;
    if (!swap) continue;
    in[s] = t->in[0];
    at[s].value.u.b = !fv->u.b;
    from[nf++] = m->in[s].idx;
  }
  if (nf == 0) return PD_OK;
  from[nf++] = *i;
  int idx;
  pd_code rc;
  if (fn__replace_node(g, *i, m->def, in, 2, at, 2, from, nf, &idx, &rc, st)) {
    (*changes)++;
    *i = idx + 1;
  }
  return rc;
}

pd_code fn_pass_arithmetic(fn_graph *g, const fn_pass_ctx *c, int *changes,
                           dev_status *st) {
  (void)c;
  *changes = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const fn_node *n = &g->nodes[i];
    if (n->dead || n->kind != FN_NODE_OP || !n->inferred) continue;
    const char *op = n->def->name;
    pd_code rc = PD_OK;
    int s;
    if (strcmp(op, "Identity") == 0) {
      bypass(g, i, n->in[0], changes);
    } else if ((s = neutral_operand(g, i)) >= 0) {
      bypass(g, i, n->in[s], changes);
    } else if (strcmp(op, "Neg") == 0) {
      const fn_node *p = producer(g, n->in[0], "Neg");
      if (p) bypass(g, i, p->in[0], changes);
    } else if (strcmp(op, "Transpose") == 0) {
      rc = simplify_transpose(g, &i, changes, st);
    } else if (strcmp(op, "Reshape") == 0) {
      rc = simplify_reshape(g, &i, changes, st);
    } else if (strcmp(op, "MatMul") == 0 || strcmp(op, "BatchMatMul") == 0) {
      rc = fold_transposes(g, &i, changes, st);
    }
    if (rc != PD_OK) return rc;
  }
  return fn__finish_pass(g, changes, st);
}
