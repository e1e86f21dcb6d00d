/* PLACEHOLDER (issue #11, core branch): stand-ins for the built-in passes,
 * gradient expansion and buffer planning, so that this branch links and
 * runs before the branches that implement them (passes_*.c, gradients.c)
 * are merged. THE LEAD DELETES THIS FILE AT MERGE.
 *   fn_pass_*:           change nothing (changes 0, PD_OK)
 *   fn_expand_gradients: INVALID_ARGUMENT when the graph has a Gradients
 *                        node, else PD_OK
 *   fn_plan_buffers:     every value FN_NOT_PLANNED, arena_bytes 0 (one
 *                        allocation per intermediate); fn_buffer_plan_free */
#include <stdlib.h>
#include <string.h>

#include "fn_int.h"

#define FN_PLACEHOLDER_PASS(fn)                                                \
  pd_code fn(fn_graph *g, const fn_pass_ctx *c, int *changes,                  \
             dev_status *st) {                                                 \
    (void)g;                                                                   \
    (void)c;                                                                   \
    (void)st;                                                                  \
    *changes = 0;                                                              \
    return PD_OK;                                                              \
  }
FN_PLACEHOLDER_PASS(fn_pass_pruning)
FN_PLACEHOLDER_PASS(fn_pass_cse)
FN_PLACEHOLDER_PASS(fn_pass_constant_folding)
FN_PLACEHOLDER_PASS(fn_pass_arithmetic)
FN_PLACEHOLDER_PASS(fn_pass_fusion)

pd_code fn_plan_buffers(const fn_graph *g, fn_buffer_plan *out,
                        dev_status *st) {
  const size_t n = (size_t)(g->n_nodes ? g->n_nodes : 1) * FN_MAX_NODE_OUTPUTS *
                   (size_t)g->n_dev;
  fn_buffer_plan p = {g->n_dev, calloc((size_t)g->n_dev, sizeof(uint64_t)),
                      malloc(n * sizeof(uint64_t)), 0};
  if (!p.arena_bytes || !p.offset) {
    free(p.arena_bytes);
    free(p.offset);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  memset(p.offset, 0xff, n * sizeof(uint64_t)); /* FN_NOT_PLANNED */
  *out = p;
  return PD_OK;
}

void fn_buffer_plan_free(fn_buffer_plan *p) {
  if (!p) return;
  free(p->arena_bytes);
  free(p->offset);
  p->arena_bytes = NULL;
  p->offset = NULL;
}
