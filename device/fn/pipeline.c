/* The optimizer pipeline of one instantiation (fn_call.h): the built-in
 * passes in enum order, each only when in force (function option over the
 * library's config over ON) and each on a backup, so that an error or a
 * graph that fails fn_graph_check restores the graph from before it and is
 * logged (the call goes on); then every external pass (the daemon's
 * plugins) through a definition, its result validated as a registration and
 * inferred, refused and logged otherwise; then buffer planning. Source:
 * Grappler's MetaOptimizer (tensorflow/core/grappler/optimizers/
 * meta_optimizer.cc): fixed order, a failing optimizer skipped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fn_call.h"

static const fn_pass_fn builtin[] = {
    fn_pass_pruning,    fn_pass_cse,    fn_pass_constant_folding,
    fn_pass_arithmetic, fn_pass_fusion,
};

static void run_builtin(dev_fn_lib *lib, const fn_func *f, fn_graph **gp,
                        const fn_pass_ctx *ctx, int p, dev_fn_inst_info *info) {
  fn_graph *bk = fn_graph_clone(*gp);
  if (!bk) {
    info->pass_changes[p] = -2;
    fn_log(&lib->cfg, DEV_FN_LOG_WARNING, f->name,
           "pass '%s' skipped: host out of memory", dev_fn_pass_name(p));
    return;
  }
  int changes = 0;
  dev_status pst = DEV_STATUS_INIT;
  pd_code rc = builtin[p](*gp, ctx, &changes, &pst);
  if (rc == PD_OK) {
    fn_graph_compact(*gp);
    rc = fn_graph_check(*gp, &pst);
  }
  if (rc != PD_OK) {
    fn_graph_free(*gp);
    *gp = bk;
    info->pass_changes[p] = -2;
    fn_log(&lib->cfg, DEV_FN_LOG_WARNING, f->name,
           "pass '%s' failed and was rolled back: %s", dev_fn_pass_name(p),
           pst.msg);
    return;
  }
  fn_graph_free(bk);
  info->pass_changes[p] = changes;
}

/* Checks that `ng` (an external pass's result, its strings already checked
 * by fn_graph_from_def) keeps g's function name, arguments (names and
 * dtypes) and outputs (names, and after inferring ng, dtypes and component
 * shapes on every device), then makes it g's instantiation. */
static pd_code adopt(const fn_graph *g, fn_graph *ng, dev_status *st) {
  if (strcmp(ng->fn_name, g->fn_name) != 0) {
    char shown[4 * DEV_FN_NAME_MAX + 1];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "the graph is named '%s'; expected the function's name "
                     "'%s'",
                     fn_name_printable(ng->fn_name, shown, sizeof shown),
                     g->fn_name);
  }
  if (ng->n_args != g->n_args || ng->n_outputs != g->n_outputs)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%d arguments and %d outputs; expected %d and %d",
                     ng->n_args, ng->n_outputs, g->n_args, g->n_outputs);
  for (int a = 0; a < g->n_args; a++)
    if (strcmp(ng->arg_names[a], g->arg_names[a]) ||
        ng->arg_dtype[a] != g->arg_dtype[a])
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "argument %d is '%s' %s; expected '%s' %s", a,
                       ng->arg_names[a], pd_dtype_name(ng->arg_dtype[a]),
                       g->arg_names[a], pd_dtype_name(g->arg_dtype[a]));
  for (int n = 0; n < ng->n_nodes; n++)
    if (ng->nodes[n].kind != FN_NODE_OP)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "node '%s' is not a registered op", ng->nodes[n].name);
  const size_t sb = sizeof(dev_shape) * (size_t)(g->n_args * g->n_dev + 1);
  ng->n_dev = g->n_dev;
  ng->arg_shape = malloc(sb);
  ng->arg_not_mirrored = malloc((size_t)g->n_args + 1);
  if (!ng->arg_shape || !ng->arg_not_mirrored)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  memcpy(ng->arg_shape, g->arg_shape, sb - sizeof(dev_shape));
  memcpy(ng->arg_not_mirrored, g->arg_not_mirrored, (size_t)g->n_args);
  PD_TRY(fn_graph_infer(ng, st));
  for (int o = 0; o < g->n_outputs; o++)
    if (strcmp(ng->out_names[o], g->out_names[o]) ||
        fn_ref_dtype(ng, ng->outputs[o]) != fn_ref_dtype(g, g->outputs[o]))
      return dev_error(
          st, PD_INVALID_ARGUMENT, "output %d is '%s' %s; expected '%s' %s", o,
          ng->out_names[o], pd_dtype_name(fn_ref_dtype(ng, ng->outputs[o])),
          g->out_names[o], pd_dtype_name(fn_ref_dtype(g, g->outputs[o])));
  for (int o = 0; o < g->n_outputs; o++)
    for (int d = 0; d < g->n_dev; d++) {
      const dev_shape *ns = fn_ref_shape(ng, ng->outputs[o], d);
      const dev_shape *os = fn_ref_shape(g, g->outputs[o], d);
      if (!dev_shape_equal(ns, os)) {
        char a[160], b[160];
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "output %d ('%s') has shape %s on device %d; "
                         "expected %s, the function's",
                         o, g->out_names[o], dev_shape_str(ns, a, sizeof a), d,
                         dev_shape_str(os, b, sizeof b));
      }
    }
  return fn_graph_check(ng, st);
}

/* One external pass over *gp; true when it changed the graph. */
static bool run_external(dev_fn_lib *lib, const fn_func *f, fn_graph **gp,
                         const dev_fn_external_pass *x,
                         const dev_tristate *passes) {
  const char *xname = x && x->name ? x->name : "external pass";
  if (!x || !x->run) return false;
  dev_fn_def *in = fn_graph_to_def(*gp);
  if (!in) return false;
  dev_fn_def *res = NULL;
  bool changed = false;
  dev_status xst = DEV_STATUS_INIT;
  pd_code rc = x->run(x->arg, in, passes, &res, &changed, &xst);
  fn_graph *ng = NULL;
  if (rc == PD_OK && changed && res) {
    rc = fn_graph_from_def(res, *gp, NULL, NULL, &ng, &xst);
    if (rc == PD_OK) rc = adopt(*gp, ng, &xst);
    if (rc == PD_OK) {
      fn_graph_compact(ng);
      fn_graph_free(*gp);
      *gp = ng;
      ng = NULL;
    }
  }
  if (res && x->free_out) x->free_out(x->arg, res);
  fn_graph_free(ng);
  dev_fn_def_free(in);
  if (rc != PD_OK) {
    fn_log(&lib->cfg, DEV_FN_LOG_WARNING, f->name,
           "external pass '%s' refused: %s", xname, xst.msg);
    return false;
  }
  return changed;
}

/* RESOURCE_EXHAUSTED when the instantiation's deadline passed during
 * `phase` (what ran last). */
static pd_code past_deadline(const fn_graph *g, double deadline, int budget_ms,
                             const char *kind, const char *phase,
                             dev_status *st) {
  if (deadline <= 0 || dev_monotonic_now() <= deadline) return PD_OK;
  return dev_error(st, PD_RESOURCE_EXHAUSTED,
                   "function '%s': instantiation took more than "
                   "instantiation_max_ms = %d ms (after %s '%s'); raise "
                   "[functions] instantiation_max_ms, turn the pass off in "
                   "the function's options, or register a smaller function",
                   g->fn_name, budget_ms, kind, phase);
}

pd_code fn_pipeline(dev_fn_lib *lib, const fn_func *f, fn_graph **g,
                    dev_fn_inst_info *info, double deadline, int budget_ms,
                    dev_status *st) {
  dev_tristate passes[DEV_PASS_COUNT];
  for (int p = 0; p < DEV_PASS_COUNT; p++)
    passes[p] = fn_pass_in_force(&f->opts, &lib->cfg, p);
  dev_fn_config cfg = lib->cfg;
  if (!cfg.fold_max_bytes) cfg.fold_max_bytes = 65536;
  if (!cfg.fold_max_ms) cfg.fold_max_ms = 50;
  fn_pass_ctx ctx = {lib->engine, &cfg, passes,
                     dev_monotonic_now() + cfg.fold_max_ms / 1000.0};
  for (int p = 0; p < (int)(sizeof builtin / sizeof builtin[0]); p++) {
    if (passes[p] == DEV_TRI_OFF) {
      info->pass_changes[p] = -1;
      continue;
    }
    run_builtin(lib, f, g, &ctx, p, info);
    PD_TRY(past_deadline(*g, deadline, budget_ms, "the pass",
                         dev_fn_pass_name((dev_fn_pass)p), st));
  }
  /* A plugin cannot be interrupted: the bound is checked after each. */
  for (int k = 0; k < lib->cfg.num_external; k++) {
    const dev_fn_external_pass *x = lib->cfg.external[k];
    info->external_changed += run_external(lib, f, g, x, passes);
    PD_TRY(past_deadline(*g, deadline, budget_ms, "the optimizer plugin",
                         x && x->name ? x->name : "external pass", st));
  }
  return PD_OK;
}

void fn_plan_for(dev_fn_lib *lib, const fn_func *f, fn_inst *inst) {
  dev_fn_inst_info *info = &inst->info;
  info->pass_changes[DEV_PASS_CUDA_GRAPH] =
      fn_pass_in_force(&f->opts, &lib->cfg, DEV_PASS_CUDA_GRAPH) == DEV_TRI_OFF
          ? -1
          : 0;
  if (fn_pass_in_force(&f->opts, &lib->cfg, DEV_PASS_BUFFER_PLANNING) ==
      DEV_TRI_OFF) {
    info->pass_changes[DEV_PASS_BUFFER_PLANNING] = -1;
    return;
  }
  dev_status pst = DEV_STATUS_INIT;
  if (fn_plan_buffers(inst->g, &inst->plan, &pst) != PD_OK) {
    info->pass_changes[DEV_PASS_BUFFER_PLANNING] = -2;
    fn_log(&lib->cfg, DEV_FN_LOG_WARNING, f->name, "buffer planning failed: %s",
           pst.msg);
    return;
  }
  inst->planned = true;
  int planned = 0;
  const fn_graph *g = inst->g;
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_out; k++)
      planned += inst->plan.offset &&
                 inst->plan.offset[(i * FN_MAX_NODE_OUTPUTS + k) * g->n_dev] !=
                     FN_NOT_PLANNED;
  info->pass_changes[DEV_PASS_BUFFER_PLANNING] = planned;
  for (int d = 0; d < inst->plan.n_dev; d++)
    if (inst->plan.arena_bytes[d] > info->arena_bytes)
      info->arena_bytes = inst->plan.arena_bytes[d];
}
