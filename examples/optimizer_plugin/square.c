/* An optimizer plugin for paradevd (include/paradev/optimizer.h): rewrites
 * Mul(x, x) into Square(x).
 *
 * The node count is unchanged, but the kernel reads its input once instead
 * of twice, and the rewrite is exact: Square computes x * x in the same
 * type as Mul does (on the CPU and on CUDA), so every value, NaN and
 * infinity included, is bit for bit what Mul gave. The built-in passes
 * leave this pattern alone (arithmetic simplification removes x*1 and x+0,
 * not x*x).
 *
 * The rewritten node keeps the Mul node's name (so its consumers and the
 * function's outputs need no change) and its origins (or, for a node of
 * the registered definition, names it), so a run-time error still names
 * the user's node.
 *
 * Stateless and reentrant: optimize may run on several threads at once.
 * Build: see README.md next to this file. */
#include <stdlib.h>
#include <string.h>

#include "paradev/optimizer.h"
#include "paradev/v1/paradev.pb-c.h"

/* "node" and "node:0" name the same value. */
static int same_value(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 2 && !strcmp(a + la - 2, ":0")) la -= 2;
  if (lb > 2 && !strcmp(b + lb - 2, ":0")) lb -= 2;
  return la == lb && !memcmp(a, b, la);
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *c = malloc(n);
  if (c) memcpy(c, s, n);
  return c;
}

/* Mul(x, x) -> Square(x) in place; returns 1 when rewritten, 0 when not a
 * match, -1 when out of memory. The message's memory is protobuf-c's
 * (malloc with the default allocator), so replaced parts are freed and new
 * ones malloc'd, and free_unpacked frees the result. */
static int rewrite(Paradev__V1__FunctionNode *nd) {
  if (strcmp(nd->op, "Mul") != 0 || nd->n_inputs != 2 ||
      !same_value(nd->inputs[0], nd->inputs[1]))
    return 0;
  char *op = dup_str("Square");
  char **origins = nd->origins;
  if (nd->n_origins == 0) origins = malloc(sizeof(char *));
  char *self = nd->n_origins == 0 ? dup_str(nd->name) : NULL;
  if (!op || !origins || (nd->n_origins == 0 && !self)) {
    free(op), free(self);
    if (origins != nd->origins) free(origins);
    return -1;
  }
  free(nd->op);
  nd->op = op;
  free(nd->inputs[1]);
  nd->n_inputs = 1;
  for (size_t i = 0; i < nd->n_attrs; i++)
    paradev__v1__attr__free_unpacked(nd->attrs[i], NULL);
  nd->n_attrs = 0; /* Mul's and Square's attributes are all inferred */
  if (nd->n_origins == 0) {
    origins[0] = self;
    nd->origins = origins;
    nd->n_origins = 1;
  }
  return 1;
}

static void optimize(void *optimizer, const PD_Buffer *graph_in,
                     PD_Buffer *graph_out, PD_Status *status) {
  (void)optimizer;
  Paradev__V1__FunctionDef *def =
      paradev__v1__function_def__unpack(NULL, graph_in->length, graph_in->data);
  if (!def) {
    PD_SetStatus(status, PD_CODE_INVALID_ARGUMENT,
                 "square: the input is not a paradev.v1.FunctionDef");
    return;
  }
  int changed = 0;
  for (size_t i = 0; i < def->n_nodes; i++) {
    int r = rewrite(def->nodes[i]);
    if (r < 0) {
      PD_SetStatus(status, PD_CODE_RESOURCE_EXHAUSTED, "square: out of memory");
      paradev__v1__function_def__free_unpacked(def, NULL);
      return;
    }
    changed |= r;
  }
  if (changed) { /* else leave graph_out empty: "unchanged" */
    size_t n = paradev__v1__function_def__get_packed_size(def);
    void *out = graph_out->allocate(graph_out, n);
    if (out)
      paradev__v1__function_def__pack(def, out);
    else
      PD_SetStatus(status, PD_CODE_RESOURCE_EXHAUSTED, "square: out of memory");
  }
  paradev__v1__function_def__free_unpacked(def, NULL);
}

__attribute__((visibility("default"))) void PD_InitOptimizer(
    PD_OptimizerRegistrationParams *params, PD_Status *status) {
  if (params->major_version != PD_OPTIMIZER_MAJOR) {
    PD_SetStatus(status, PD_CODE_FAILED_PRECONDITION,
                 "square: built for another optimizer ABI major version");
    return;
  }
  params->plugin_major_version = PD_OPTIMIZER_MAJOR;
  params->plugin_minor_version = PD_OPTIMIZER_MINOR;
  params->name = "square";
  params->name_length = strlen(params->name);
  params->configs->struct_size = PD_OPTIMIZER_CONFIGS_STRUCT_SIZE;
  /* every built-in pass left to the daemon: PD_TRI_DEFAULT (zeroed) */
  params->optimizer->struct_size = PD_OPTIMIZER_STRUCT_SIZE;
  params->optimizer->optimize_func = optimize;
}
