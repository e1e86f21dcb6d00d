/* For tests of graph functions' passes and gradient expansion: runs a graph
 * (device/fn/fn_int.h) op by op through dev_execute on its engine, as an
 * eager program would, so a test can compare a graph's values before and
 * after a rewrite without the function executor (device/fn/run.c). */
#ifndef PARADEV_FN_EVAL_H
#define PARADEV_FN_EVAL_H

#include "fn/fn_int.h"

/* Evaluates every live FN_NODE_OP node of g in order with args[0..g->n_args)
 * as the arguments (constants uploaded mirrored) and writes a new reference
 * to each graph output into outs[0..g->n_outputs). Asserts (cmocka) that
 * every op is accepted; returns PD_OK or the first error (status in *st). */
pd_code fn_eval(dev_engine *e, const fn_graph *g, dev_tensor *const *args,
                dev_tensor **outs, dev_status *st);

/* An instantiated graph of n_args arguments with the dtypes and component
 * shapes of args[] (n_dev from e), named `name`, ready for fn_graph_add_op;
 * outputs are added by the test (fn_eval_add_output). */
fn_graph *fn_eval_graph(dev_engine *e, const char *name,
                        dev_tensor *const *args, int n_args);
void fn_eval_add_output(fn_graph *g, const char *name, fn_ref r);

#endif /* PARADEV_FN_EVAL_H */
