/* Common subexpression elimination (Grappler's arithmetic optimizer's
 * dedup stage): two OP nodes with the same op, the same inputs and equal
 * attributes compute the same value, so the later one's uses go to the
 * earlier one and it is removed. Never merged: random ops (two draws are
 * two values even with equal attributes: a program that asks for two is
 * entitled to two nodes), collectives (kept one per node, so the plan's
 * rendezvous stay as registered), function calls. Nodes are visited in
 * order, so chains of duplicates collapse in one run. */
#include <stdlib.h>
#include <string.h>

#include "passes_int.h"

static bool value_equal(const dev_attr_value *a, const dev_attr_value *b) {
  if (a->type != b->type) return false;
  switch (a->type) {
    case DEV_ATTR_NONE: return true;
    case DEV_ATTR_INT: return a->u.i == b->u.i;
    case DEV_ATTR_FLOAT: return memcmp(&a->u.f, &b->u.f, sizeof a->u.f) == 0;
    case DEV_ATTR_BOOL: return a->u.b == b->u.b;
    case DEV_ATTR_DTYPE: return a->u.dtype == b->u.dtype;
    case DEV_ATTR_SHAPE: return dev_shape_equal(&a->u.shape, &b->u.shape);
    case DEV_ATTR_STRING:
      return a->u.s.len == b->u.s.len &&
             (a->u.s.len == 0 ||
              memcmp(a->u.s.ptr, b->u.s.ptr, a->u.s.len) == 0);
    case DEV_ATTR_INT_LIST:
      return a->u.ilist.n == b->u.ilist.n &&
             (a->u.ilist.n == 0 ||
              memcmp(a->u.ilist.v, b->u.ilist.v,
                     sizeof(int64_t) * (size_t)a->u.ilist.n) == 0);
    case DEV_ATTR_FLOAT_LIST:
      return a->u.flist.n == b->u.flist.n &&
             (a->u.flist.n == 0 ||
              memcmp(a->u.flist.v, b->u.flist.v,
                     sizeof(double) * (size_t)a->u.flist.n) == 0);
  }
  return false;
}

bool fn__attrs_equal(const fn_node *a, const fn_node *b) {
  if (a->def != b->def) return false;
  for (int k = 0; k < a->def->num_attrs; k++)
    if (!value_equal(&a->attrs[k], &b->attrs[k])) return false;
  return true;
}

bool fn__op_is_special(const dev_op_def *def) {
  return (def->flags & (DEV_OP_COLLECTIVE | DEV_OP_FUNCTION)) ||
         dev_op_attr_index(def, "seed") >= 0 ||
         strcmp(def->name, "DeviceId") == 0;
}

/* Whether node n may be merged with an equal one. DeviceId is: two give
 * the same value on each device. */
static bool mergeable(const fn_node *n) {
  if (n->dead || n->kind != FN_NODE_OP) return false;
  const dev_op_def *d = n->def;
  return !(d->flags & (DEV_OP_COLLECTIVE | DEV_OP_FUNCTION)) &&
         dev_op_attr_index(d, "seed") < 0;
}

static unsigned node_hash(const fn_node *n) {
  uintptr_t h = (uintptr_t)n->def * 2654435761u;
  for (int j = 0; j < n->n_in; j++)
    h = h * 31u + (unsigned)n->in[j].kind * 7u + (unsigned)n->in[j].idx * 131u +
        (unsigned)n->in[j].out;
  return (unsigned)h ^ (unsigned)n->n_in;
}

static bool same_node(const fn_node *a, const fn_node *b) {
  if (a->def != b->def || a->n_in != b->n_in || a->n_out != b->n_out)
    return false;
  for (int j = 0; j < a->n_in; j++)
    if (!fn_ref_eq(a->in[j], b->in[j]) || a->in[j].out != b->in[j].out)
      return false;
  return fn__attrs_equal(a, b);
}

pd_code fn_pass_cse(fn_graph *g, const fn_pass_ctx *c, int *changes,
                    dev_status *st) {
  (void)c;
  *changes = 0;
  if (g->n_nodes == 0) return PD_OK;
  unsigned *h = malloc(sizeof *h * (size_t)g->n_nodes);
  if (!h) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  for (int i = 0; i < g->n_nodes; i++) {
    fn_node *n = &g->nodes[i];
    if (!mergeable(n)) continue;
    h[i] = node_hash(n); /* after earlier merges redirected its inputs */
    for (int j = 0; j < i; j++) {
      if (!mergeable(&g->nodes[j]) || h[j] != h[i] ||
          !same_node(&g->nodes[j], n))
        continue;
      for (int k = 0; k < n->n_out; k++)
        fn_graph_replace_uses(g, fn_node_ref(i, k), fn_node_ref(j, k), i + 1);
      n->dead = true;
      (*changes)++;
      break;
    }
  }
  free(h);
  return fn__finish_pass(g, changes, st);
}
