/* Fusion (Grappler's remapper): patterns whose fused kernel does the work
 * in one pass over the data (device/ops/fused_int.h).
 *  (a) MatMul + BiasAdd (or an Add of a rank-1 [N] bias broadcasting
 *      exactly like BiasAdd) + optionally Relu / Relu6 / Sigmoid / Tanh
 *      -> _FusedMatMul(a, b, bias; transpose_a, transpose_b, activation).
 *  (b) Chains (DAGs) of element-wise ops of one dtype -> _FusedElementwise
 *      with a program: at most DEV_EW_MAX_INPUTS inputs and DEV_EW_MAX_INSTR
 *      instructions; an operand whose every element is one number (a
 *      constant or a Fill) that does not change the op's shape becomes a
 *      program constant. At least two nodes.
 * A node is absorbed only when its results are used solely inside the
 * pattern and it is not a graph output (a fetched intermediate stays). The
 * fused node takes the last node's name and the origins of all the nodes it
 * replaced, so run-time errors name them. Each pattern is skipped when its
 * op is not registered (dev_op_lookup), or when the fused node does not
 * infer to the dtypes and component shapes of the node it replaces. */
#include <stdlib.h>
#include <string.h>

#include "../ops/fused_int.h"
#include "passes_int.h"

static pd_code oom(dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
}

/* Uses of node i's output 0 when it may be absorbed: used only by nodes
 * (not a graph output), else -1. */
static int inner_uses(const int *uses, int i) {
  int u = uses[i * FN_MAX_NODE_OUTPUTS];
  return u >= FN_USE_OUTPUT ? -1 : u;
}

static const fn_node *live_op(const fn_graph *g, fn_ref r, const char *name) {
  if (r.kind != FN_REF_NODE || r.out != 0) return NULL;
  const fn_node *p = &g->nodes[r.idx];
  if (p->dead || p->kind != FN_NODE_OP || !p->inferred ||
      (name && strcmp(p->def->name, name) != 0))
    return NULL;
  return p;
}

static const char *activation_of(const char *op) {
  if (strcmp(op, "Relu") == 0) return "relu";
  if (strcmp(op, "Relu6") == 0) return "relu6";
  if (strcmp(op, "Sigmoid") == 0) return "sigmoid";
  if (strcmp(op, "Tanh") == 0) return "tanh";
  return NULL;
}

/* Node b adds a bias to a MatMul's output: writes the MatMul's index and
 * the bias, true when the pattern holds. */
static bool bias_of(const fn_graph *g, const int *uses, int b, int *mm,
                    fn_ref *bias) {
  const fn_node *n = &g->nodes[b];
  bool biasadd = strcmp(n->def->name, "BiasAdd") == 0;
  if (!biasadd && strcmp(n->def->name, "Add") != 0) return false;
  if (n->n_in != 2) return false;
  for (int s = 0; s < (biasadd ? 1 : 2); s++) {
    const fn_node *m = live_op(g, n->in[s], "MatMul");
    if (!m || inner_uses(uses, n->in[s].idx) != 1) continue;
    fn_ref bv = n->in[1 - s];
    if (fn_ref_dtype(g, bv) != n->out_dtype[0]) continue;
    bool ok = fn__same_shapes(g, fn_node_ref(b, 0), n->in[s]);
    for (int d = 0; d < g->n_dev && ok; d++) {
      const dev_shape *bs = fn_ref_shape(g, bv, d);
      const dev_shape *ms = fn_ref_shape(g, n->in[s], d);
      ok = bs->rank == 1 && ms->rank == 2 && bs->dims[0] == ms->dims[1];
    }
    if (!ok) continue;
    *mm = n->in[s].idx;
    *bias = bv;
    return true;
  }
  return false;
}

static pd_code fuse_matmuls(fn_graph *g, int *changes, dev_status *st) {
  const dev_op_def *fdef = dev_op_lookup(DEV_FUSED_MATMUL_OP);
  if (!fdef) return PD_OK;
  int *uses = fn_graph_use_counts(g);
  if (!uses) return oom(st);
  pd_code rc = PD_OK;
  for (int b = g->n_nodes - 1; b >= 0 && rc == PD_OK; b--) {
    const fn_node *n = &g->nodes[b];
    int mm, last = b;
    fn_ref bias;
    if (n->dead || n->kind != FN_NODE_OP || !n->inferred ||
        !bias_of(g, uses, b, &mm, &bias))
      continue;
    const char *act = "none";
    /* The activation: the bias's only consumer (a later node). */
    if (inner_uses(uses, b) == 1)
      for (int a = b + 1; a < g->n_nodes; a++) {
        const fn_node *an = &g->nodes[a];
        if (an->dead || an->n_in != 1 || an->kind != FN_NODE_OP ||
            !fn_ref_eq(an->in[0], fn_node_ref(b, 0)) || an->in[0].out != 0)
          continue;
        if (activation_of(an->def->name)) {
          act = activation_of(an->def->name);
          last = a;
        }
        break;
      }
    const fn_node *m = &g->nodes[mm];
    fn_ref in[3] = {m->in[0], m->in[1], bias};
    dev_attr at[3] = {
        {"transpose_a", *fn_node_attr(m, "transpose_a")},
        {"transpose_b", *fn_node_attr(m, "transpose_b")},
        {"activation", {.type = DEV_ATTR_STRING, .u.s = {act, strlen(act)}}},
    };
    int from[3] = {mm, b, last}, nf = last == b ? 2 : 3, idx;
    if (fn__replace_node(g, last, fdef, in, 3, at, 3, from, nf, &idx, &rc,
                         st)) {
      int shift = 1; /* nodes at or after idx moved by one */
      g->nodes[mm >= idx ? mm + shift : mm].dead = true;
      g->nodes[b >= idx ? b + shift : b].dead = true;
      *changes += nf;
      free(uses); /* indices moved: recount */
      if (!(uses = fn_graph_use_counts(g))) return oom(st);
    }
  }
  free(uses);
  return rc;
}

/* --- element-wise chains ---------------------------------------------------- */

typedef struct ew_group {
  int members[DEV_EW_MAX_INSTR]; /* node indices, ascending */
  int n;
  fn_ref ext[DEV_EW_MAX_INPUTS];
  int n_ext;
  double consts[DEV_ATTR_LIST_MAX];
  int n_consts;
} ew_group;

/* Whether node i is an element-wise op the fused op can take for dtype. */
static bool ew_node(const fn_graph *g, int i, unsigned mask) {
  const fn_node *n = &g->nodes[i];
  if (n->dead || n->kind != FN_NODE_OP || !n->inferred || n->n_out != 1 ||
      !(mask & DEV_DTYPE_BIT(n->out_dtype[0])))
    return false;
  int op = dev_ew_opcode_for(n->def->name);
  if (op == 0 || dev_ew_arity(op) != n->n_in) return false;
  for (int j = 0; j < n->n_in; j++)
    if (fn_ref_dtype(g, n->in[j]) != n->out_dtype[0]) return false;
  return true;
}

static int member_pos(const ew_group *G, int node) {
  for (int k = 0; k < G->n; k++)
    if (G->members[k] == node) return k;
  return -1;
}

/* Operand j of binary member node i as a program constant: its value,
 * when it is uniform and the other operand alone gives i's shape (when both
 * qualify, only the second becomes a constant). */
static bool ew_const_operand(const fn_graph *g, int i, int j, double *v) {
  const fn_node *n = &g->nodes[i];
  if (n->n_in != 2) return false;
  fn_ref me = fn_node_ref(i, 0);
  double w;
  if (!fn__same_shapes(g, me, n->in[1 - j]) ||
      !fn__uniform_value(g, n->in[j], v))
    return false;
  return j == 1 || !(fn__same_shapes(g, me, n->in[0]) &&
                     fn__uniform_value(g, n->in[1], &w));
}

/* Recomputes G's external inputs and constants; false over the limits. */
static bool ew_operands(const fn_graph *g, ew_group *G) {
  G->n_ext = 0;
  G->n_consts = 0;
  for (int k = 0; k < G->n; k++) {
    const fn_node *n = &g->nodes[G->members[k]];
    for (int j = 0; j < n->n_in; j++) {
      fn_ref r = n->in[j];
      if (r.kind == FN_REF_NODE && member_pos(G, r.idx) >= 0) continue;
      double v;
      if (ew_const_operand(g, G->members[k], j, &v)) {
        int c = 0;
        while (c < G->n_consts && G->consts[c] != v) c++;
        if (c == G->n_consts) {
          if (G->n_consts == DEV_ATTR_LIST_MAX) return false;
          G->consts[G->n_consts++] = v;
        }
        continue;
      }
      int e = 0;
      while (e < G->n_ext &&
             !(fn_ref_eq(G->ext[e], r) && G->ext[e].out == r.out))
        e++;
      if (e == G->n_ext) {
        if (G->n_ext == DEV_EW_MAX_INPUTS) return false;
        G->ext[G->n_ext++] = r;
      }
    }
  }
  return G->n_ext >= 1;
}

/* Inserts p into G's ascending members. */
static void ew_add(ew_group *G, int p) {
  int k = G->n++;
  while (k > 0 && G->members[k - 1] > p) {
    G->members[k] = G->members[k - 1];
    k--;
  }
  G->members[k] = p;
}

static void ew_remove(ew_group *G, int p) {
  int k = member_pos(G, p);
  for (; k >= 0 && k + 1 < G->n; k++) G->members[k] = G->members[k + 1];
  G->n--;
}

/* Grows a group back from root r: a node joins when every use of it is by
 * a member (visited from high to low indices, so all its consumers that
 * will join already have). */
static void ew_grow(const fn_graph *g, const int *uses, const bool *taken,
                    unsigned mask, int r, ew_group *G) {
  G->n = 0;
  ew_add(G, r);
  for (int p = r - 1; p >= 0 && G->n < DEV_EW_MAX_INSTR; p--) {
    if (taken[p] || !ew_node(g, p, mask)) continue;
    if (g->nodes[p].out_dtype[0] != g->nodes[r].out_dtype[0]) continue;
    int want = inner_uses(uses, p), refs = 0;
    if (want < 1) continue;
    for (int k = 0; k < G->n; k++) {
      const fn_node *m = &g->nodes[G->members[k]];
      for (int j = 0; j < m->n_in; j++)
        refs += m->in[j].kind == FN_REF_NODE && m->in[j].idx == p;
    }
    if (refs != want) continue;
    ew_add(G, p);
    if (!ew_operands(g, G)) ew_remove(G, p);
  }
  if (!ew_operands(g, G)) G->n = 0;
}

static int ew_operand_code(const fn_graph *g, const ew_group *G, int i, int j) {
  fn_ref r = g->nodes[i].in[j];
  int pos;
  if (r.kind == FN_REF_NODE && (pos = member_pos(G, r.idx)) >= 0)
    return DEV_EW_TEMP_BASE + pos;
  double v;
  if (ew_const_operand(g, i, j, &v))
    for (int c = 0; c < G->n_consts; c++)
      if (G->consts[c] == v) return DEV_EW_CONST_BASE + c;
  for (int e = 0; e < G->n_ext; e++)
    if (fn_ref_eq(G->ext[e], r) && G->ext[e].out == r.out) return e;
  return DEV_EW_NONE; /* not reached: ew_operands listed every operand */
}

static pd_code ew_fuse(fn_graph *g, const dev_op_def *fdef, const ew_group *G,
                       bool *done, dev_status *st) {
  int64_t prog[DEV_EW_MAX_INSTR * 3];
  for (int k = 0; k < G->n; k++) {
    int i = G->members[k];
    const fn_node *n = &g->nodes[i];
    prog[3 * k] = dev_ew_opcode_for(n->def->name);
    prog[3 * k + 1] = ew_operand_code(g, G, i, 0);
    prog[3 * k + 2] = n->n_in > 1 ? ew_operand_code(g, G, i, 1) : DEV_EW_NONE;
  }
  dev_attr at[2] = {
      {"program", {.type = DEV_ATTR_INT_LIST, .u.ilist = {prog, 3 * G->n}}},
      {"constants",
       {.type = DEV_ATTR_FLOAT_LIST, .u.flist = {G->consts, G->n_consts}}},
  };
  int root = G->members[G->n - 1], idx;
  pd_code rc;
  *done = fn__replace_node(g, root, fdef, G->ext, G->n_ext, at, 2, G->members,
                           G->n, &idx, &rc, st);
  if (*done)
    for (int k = 0; k + 1 < G->n; k++) g->nodes[G->members[k]].dead = true;
  return rc;
}

static pd_code fuse_elementwise(fn_graph *g, int *changes, dev_status *st) {
  const dev_op_def *fdef = dev_op_lookup(DEV_FUSED_ELEMENTWISE_OP);
  if (!fdef || g->n_nodes == 0) return PD_OK;
  unsigned mask = fdef->inputs[0].dtypes;
  int *uses = fn_graph_use_counts(g);
  bool *taken = calloc((size_t)g->n_nodes, sizeof *taken);
  ew_group *G = malloc(sizeof *G);
  pd_code rc = PD_OK;
  if (!uses || !taken || !G) rc = oom(st);
  /* Roots from the last node down; a group's members are below its root,
   * so a fused root's insertion moves nothing still to visit. */
  for (int r = g->n_nodes - 1; r >= 0 && rc == PD_OK; r--) {
    if (taken[r] || !ew_node(g, r, mask)) continue;
    ew_grow(g, uses, taken, mask, r, G);
    if (G->n < 2) continue;
    bool done = false;
    rc = ew_fuse(g, fdef, G, &done, st);
    if (!done) continue;
    for (int k = 0; k < G->n; k++) taken[G->members[k]] = true;
    *changes += G->n;
  }
  free(uses);
  free(taken);
  free(G);
  return rc;
}

pd_code fn_pass_fusion(fn_graph *g, const fn_pass_ctx *c, int *changes,
                       dev_status *st) {
  (void)c;
  *changes = 0;
  PD_TRY(fuse_matmuls(g, changes, st));
  PD_TRY(fn__finish_pass(g, changes, st));
  PD_TRY(fuse_elementwise(g, changes, st));
  return fn__finish_pass(g, changes, st);
}
