/* Dead-node pruning (Grappler's dependency/model pruner): a node none of
 * whose outputs reaches a graph output is removed. No op has side effects
 * today: collectives are values too (every device runs the same body, so
 * every device drops the same dead collective and the one-order rule
 * holds), random ops are values of their seeds, and the executor runs
 * nothing but what the plan holds. An op with side effects would have to be
 * kept here; none is registered. Also the helper other passes end with. */
#include <stdlib.h>

#include "passes_int.h"

int fn__mark_unreachable(fn_graph *g) {
  if (g->n_nodes == 0) return 0;
  bool *live = calloc((size_t)g->n_nodes, sizeof *live);
  if (!live) return 0; /* out of memory: prune nothing (still valid) */
  for (int o = 0; o < g->n_outputs; o++)
    if (g->outputs[o].kind == FN_REF_NODE) live[g->outputs[o].idx] = true;
  for (int i = g->n_nodes - 1; i >= 0; i--) {
    const fn_node *n = &g->nodes[i];
    if (!live[i] || n->dead) continue;
    for (int j = 0; j < n->n_in; j++)
      if (n->in[j].kind == FN_REF_NODE) live[n->in[j].idx] = true;
  }
  int marked = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (!live[i] && !g->nodes[i].dead) {
      g->nodes[i].dead = true;
      marked++;
    }
  free(live);
  return marked;
}

pd_code fn__finish_pass(fn_graph *g, int *changes, dev_status *st) {
  int marked = fn__mark_unreachable(g);
  int dead = 0;
  for (int i = 0; i < g->n_nodes; i++) dead += g->nodes[i].dead;
  if (dead) fn_graph_compact(g);
  *changes += marked;
  return fn_graph_check(g, st);
}

pd_code fn_pass_pruning(fn_graph *g, const fn_pass_ctx *c, int *changes,
                        dev_status *st) {
  (void)c;
  *changes = 0;
  return fn__finish_pass(g, changes, st);
}
