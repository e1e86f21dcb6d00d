/* See fn_eval.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fn_eval.h"

fn_graph *fn_eval_graph(dev_engine *e, const char *name,
                        dev_tensor *const *args, int n_args) {
  int n = dev_engine_num_devices(e);
  fn_graph *g = fn_graph_new(name, n);
  assert_non_null(g);
  for (int i = 0; i < n_args; i++) {
    char an[32];
    snprintf(an, sizeof an, "x%d", i);
    assert_int_equal(fn_graph_add_arg(g, an, dev_tensor_dtype(args[i]), NULL),
                     PD_OK);
  }
  size_t na = n_args > 0 ? (size_t)n_args : 1, nd = n > 0 ? (size_t)n : 1;
  g->arg_shape = calloc(na * nd, sizeof(dev_shape));
  g->arg_not_mirrored = calloc(na, sizeof(bool));
  assert_non_null(g->arg_shape);
  for (int i = 0; i < n_args; i++)
    for (int d = 0; d < n; d++)
      g->arg_shape[i * n + d] = *dev_tensor_component_shape(args[i], d);
  return g;
}

void fn_eval_add_output(fn_graph *g, const char *name, fn_ref r) {
  int k = g->n_outputs + 1;
  g->out_names = realloc(g->out_names, sizeof *g->out_names * (size_t)k);
  g->outputs = realloc(g->outputs, sizeof *g->outputs * (size_t)k);
  assert_non_null(g->out_names);
  assert_non_null(g->outputs);
  g->out_names[k - 1] = strdup(name);
  g->outputs[k - 1] = r;
  g->n_outputs = k;
}

/* The node's attributes back in the dev_attr form dev_execute takes. */
static int node_attrs(const fn_node *nd, dev_attr *out) {
  int k = 0;
  for (int a = 0; a < nd->def->num_attrs; a++) {
    if (nd->attrs[a].type == DEV_ATTR_NONE) continue;
    out[k].name = nd->def->attrs[a].name;
    out[k].value = nd->attrs[a];
    k++;
  }
  return k;
}

pd_code fn_eval(dev_engine *e, const fn_graph *g, dev_tensor *const *args,
                dev_tensor **outs, dev_status *st) {
  dev_tensor **cvals =
      calloc((size_t)(g->n_consts ? g->n_consts : 1), sizeof *cvals);
  dev_tensor **vals =
      calloc((size_t)(g->n_nodes ? g->n_nodes : 1) * FN_MAX_NODE_OUTPUTS,
             sizeof *vals);
  assert_non_null(cvals);
  assert_non_null(vals);
  pd_code rc = PD_OK;
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  for (int c = 0; c < g->n_consts && rc == PD_OK; c++)
    rc = dev_tensor_from_host(e, g->consts[c].dtype, &mir, &g->consts[c].shape,
                              g->consts[c].data, &cvals[c], st);
#define VAL(r)                                                                 \
  ((r).kind == FN_REF_ARG     ? args[(r).idx]                                  \
   : (r).kind == FN_REF_CONST ? cvals[(r).idx]                                 \
                              : vals[(r).idx * FN_MAX_NODE_OUTPUTS + (r).out])
  for (int i = 0; i < g->n_nodes && rc == PD_OK; i++) {
    const fn_node *nd = &g->nodes[i];
    if (nd->dead) continue;
    assert_int_equal(nd->kind, FN_NODE_OP);
    dev_tensor *in[DEV_MAX_INPUTS];
    for (int j = 0; j < nd->n_in; j++) in[j] = VAL(nd->in[j]);
    dev_attr attrs[DEV_MAX_ATTRS];
    int na = node_attrs(nd, attrs);
    int nout = FN_MAX_NODE_OUTPUTS;
    rc = dev_execute(e, nd->def->name, in, nd->n_in, attrs, na,
                     &vals[i * FN_MAX_NODE_OUTPUTS], &nout, st);
  }
  for (int o = 0; o < g->n_outputs && rc == PD_OK; o++) {
    outs[o] = VAL(g->outputs[o]);
    dev_tensor_retain(outs[o]);
  }
#undef VAL
  for (int i = 0; i < g->n_nodes * FN_MAX_NODE_OUTPUTS; i++)
    dev_tensor_release(vals[i]);
  for (int c = 0; c < g->n_consts; c++) dev_tensor_release(cvals[c]);
  free(vals);
  free(cvals);
  return rc;
}
