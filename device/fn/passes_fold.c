/* Constant folding (Grappler's constant folding): a node whose inputs are
 * all constants is evaluated once, on the host, by its op's CPU kernel and
 * replaced by constants, which the plan uploads mirrored. Also folded:
 * ZerosLike / OnesLike of any value whose components all have one shape
 * (the result depends on the shape only), unless it is a graph output known
 * not to be mirrored (the call's output keeps saying so). Never folded: collectives,
 * random ops, DeviceId (per-device or stream values), function calls, a
 * node whose components' shapes differ, an output over the byte bound
 * (cfg->fold_max_bytes, default 65536), and a node whose kernel fails (the
 * call reports that error at run time, naming the node). Folding stops at
 * c->deadline, keeping what it folded (still a valid, smaller graph). */
#include <stdlib.h>
#include <string.h>

#include "passes_int.h"

#define FOLD_DEFAULT_MAX_BYTES 65536

/* Whether every component of node n's outputs has one shape. */
static bool mirrored_shapes(const fn_graph *g, const fn_node *n) {
  for (int k = 0; k < n->n_out; k++)
    for (int d = 1; d < g->n_dev; d++)
      if (!dev_shape_equal(&n->out_shape[k * g->n_dev],
                           &n->out_shape[k * g->n_dev + d]))
        return false;
  return true;
}

static bool shape_only(const fn_node *n) {
  return n->n_in == 1 && (strcmp(n->def->name, "ZerosLike") == 0 ||
                          strcmp(n->def->name, "OnesLike") == 0);
}

/* Whether node i is a graph output known not to be mirrored: folding it
 * would change what the call's output says of itself. */
static bool fetched_not_mirrored(const fn_graph *g, int i) {
  for (int o = 0; o < g->n_outputs; o++)
    if (g->outputs[o].kind == FN_REF_NODE && g->outputs[o].idx == i &&
        g->nodes[i].out_not_mirrored[g->outputs[o].out])
      return true;
  return false;
}

static bool foldable(const fn_graph *g, int i, uint64_t max) {
  const fn_node *n = &g->nodes[i];
  if (n->dead || n->kind != FN_NODE_OP || !n->inferred || n->n_out < 1 ||
      g->n_dev < 1 || fn__op_is_special(n->def))
    return false;
  if (!n->def->kernels[DEV_BACKEND_CPU] &&
      !(n->def->flags & DEV_OP_ALIASES_INPUT))
    return false;
  if (!shape_only(n))
    for (int j = 0; j < n->n_in; j++)
      if (n->in[j].kind != FN_REF_CONST) return false;
  if (!mirrored_shapes(g, n) || fetched_not_mirrored(g, i)) return false;
  for (int k = 0; k < n->n_out; k++) {
    size_t b;
    if (dev_shape_byte_size(n->out_dtype[k], &n->out_shape[k * g->n_dev], &b,
                            NULL) != PD_OK ||
        b > max)
      return false;
  }
  return true;
}

/* Runs node i's kernel on the host into outs[k] (malloc'd, bytes[k]).
 * false when it cannot run or fails: the node stays as it is. */
static bool eval_node(const fn_graph *g, const fn_node *n, void **outs,
                      size_t *bytes) {
  pd_dtype in_dt[DEV_MAX_INPUTS];
  dev_shape in_sh[DEV_MAX_INPUTS];
  const void *in_data[DEV_MAX_INPUTS];
  static const char zero[8];
  for (int j = 0; j < n->n_in; j++) {
    in_dt[j] = fn_ref_dtype(g, n->in[j]);
    in_sh[j] = *fn_ref_shape(g, n->in[j], 0);
    /* ZerosLike / OnesLike of a non-constant: the kernel reads no data. */
    in_data[j] = n->in[j].kind == FN_REF_CONST && g->consts[n->in[j].idx].data
                     ? g->consts[n->in[j].idx].data
                     : zero;
  }
  dev_shape out_sh[DEV_MAX_OUTPUTS];
  int alias[DEV_MAX_OUTPUTS];
  for (int k = 0; k < n->n_out; k++) {
    out_sh[k] = n->out_shape[k * g->n_dev];
    alias[k] = -1;
    dev_shape_byte_size(n->out_dtype[k], &out_sh[k], &bytes[k], NULL);
    outs[k] = calloc(1, bytes[k] ? bytes[k] : 1);
    if (!outs[k]) return false;
  }
  dev_kernel_fn fn = n->def->kernels[DEV_BACKEND_CPU];
  if (fn) {
    dev_kernel_ctx ctx = {
        .op = n->def,
        .attrs = n->attrs,
        .device = 0,
        .num_devices = g->n_dev,
        .num_inputs = n->n_in,
        .in_dtype = in_dt,
        .in_shape = in_sh,
        .in_data = in_data,
        .num_outputs = n->n_out,
        .out_dtype = n->out_dtype,
        .out_shape = out_sh,
        .out_data = outs,
        .out_alias = alias,
    };
    dev_status kst = DEV_STATUS_INIT;
    if (fn(&ctx, &kst) != PD_OK) return false;
  } else {
    alias[0] = 0; /* an aliasing op without a kernel: output 0 = input 0 */
  }
  for (int k = 0; k < n->n_out; k++) {
    if (alias[k] < 0) continue;
    if (alias[k] >= n->n_in || n->in[alias[k]].kind != FN_REF_CONST)
      return false;
    const fn_const *src = &g->consts[n->in[alias[k]].idx];
    if (src->bytes != bytes[k]) return false;
    if (bytes[k]) memcpy(outs[k], src->data, bytes[k]);
  }
  return true;
}

pd_code fn_pass_constant_folding(fn_graph *g, const fn_pass_ctx *c,
                                 int *changes, dev_status *st) {
  *changes = 0;
  uint64_t max = c && c->cfg && c->cfg->fold_max_bytes ? c->cfg->fold_max_bytes
                                                       : FOLD_DEFAULT_MAX_BYTES;
  double deadline = c ? c->deadline : 0;
  pd_code rc = PD_OK;
  for (int i = 0; i < g->n_nodes && rc == PD_OK; i++) {
    fn_node *n = &g->nodes[i];
    if (!foldable(g, i, max)) continue;
    if (deadline > 0 && dev_monotonic_now() > deadline) break;
    void *outs[DEV_MAX_OUTPUTS] = {NULL};
    size_t bytes[DEV_MAX_OUTPUTS] = {0};
    if (eval_node(g, n, outs, bytes)) {
      int cidx[DEV_MAX_OUTPUTS];
      for (int k = 0; k < n->n_out && rc == PD_OK; k++)
        rc = fn_graph_add_const(g, n->out_dtype[k], &n->out_shape[k * g->n_dev],
                                outs[k], bytes[k], &cidx[k], st);
      if (rc == PD_OK) {
        for (int k = 0; k < n->n_out; k++)
          fn_graph_replace_uses(g, fn_node_ref(i, k), fn_const_ref(cidx[k]),
                                i + 1);
        n->dead = true;
        (*changes)++;
      }
    }
    for (int k = 0; k < DEV_MAX_OUTPUTS; k++) free(outs[k]);
  }
  if (rc != PD_OK) return rc;
  return fn__finish_pass(g, changes, st);
}
