/* The graph functions' IR (device/fn/graph.c): building an instantiated
 * graph, inference of its nodes, uses, redirection, compaction, clones and
 * origins, checked by evaluating it (tests/unit/fn_eval.c) against values
 * computed by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fn_eval.h"
#include "testutil.h"

static void builds_infers_and_evaluates(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int64_t dims[1] = {3};
  double xv[3] = {1, 2, 3}, yv[3] = {10, 20, 30};
  dev_tensor *args[2] = {tu_mirrored(e, PD_FLOAT32, 1, dims, xv),
                         tu_mirrored(e, PD_FLOAT32, 1, dims, yv)};
  fn_graph *g = fn_eval_graph(e, "f", args, 2);
  int add, mul, dead;
  fn_ref in[2] = {fn_arg_ref(0), fn_arg_ref(1)};
  assert_int_equal(
      fn_graph_add_op(g, "s", dev_op_lookup("Add"), in, 2, NULL, 0, &add, NULL),
      PD_OK);
  fn_ref in2[2] = {fn_node_ref(add, 0), fn_arg_ref(0)};
  assert_int_equal(fn_graph_add_op(g, "p", dev_op_lookup("Mul"), in2, 2, NULL,
                                   0, &mul, NULL),
                   PD_OK);
  assert_int_equal(fn_graph_add_op(g, "s", dev_op_lookup("Neg"), in, 1, NULL, 0,
                                   &dead, NULL),
                   PD_OK);
  assert_string_equal(g->nodes[dead].name, "s_1"); /* made unique */
  assert_int_equal(g->nodes[mul].out_dtype[0], PD_FLOAT32);
  assert_int_equal(g->nodes[mul].out_shape[0].dims[0], 3);
  fn_eval_add_output(g, "out", fn_node_ref(mul, 0));
  assert_int_equal(fn_graph_check(g, NULL), PD_OK);

  int *uses = fn_graph_use_counts(g);
  assert_int_equal(uses[add * FN_MAX_NODE_OUTPUTS], 1);
  assert_int_equal(uses[mul * FN_MAX_NODE_OUTPUTS], FN_USE_OUTPUT);
  assert_int_equal(uses[dead * FN_MAX_NODE_OUTPUTS], 0);
  free(uses);

  dev_tensor *out = NULL;
  assert_int_equal(fn_eval(e, g, args, &out, NULL), PD_OK);
  double got[3];
  tu_read(out, 1, got, 3);
  for (int i = 0; i < 3; i++) assert_true(got[i] == (xv[i] + yv[i]) * xv[i]);
  dev_tensor_release(out);

  /* A clone is independent; compaction drops the dead node, renumbering. */
  fn_graph *c = fn_graph_clone(g);
  assert_non_null(c);
  c->nodes[dead].dead = true;
  fn_graph_compact(c);
  assert_int_equal(c->n_nodes, 2);
  assert_int_equal(fn_graph_check(c, NULL), PD_OK);
  assert_int_equal(g->n_nodes, 3);

  /* Redirecting the output to the sum leaves Mul unused. */
  fn_graph_replace_uses(c, fn_node_ref(1, 0), fn_node_ref(0, 0), 0);
  assert_true(fn_ref_eq(c->outputs[0], fn_node_ref(0, 0)));
  assert_int_equal(fn_eval(e, c, args, &out, NULL), PD_OK);
  tu_read(out, 0, got, 3);
  for (int i = 0; i < 3; i++) assert_true(got[i] == xv[i] + yv[i]);
  dev_tensor_release(out);

  /* Origins merge without duplicates; the description names them. */
  int from[2] = {0, 1};
  assert_int_equal(fn_node_merge_origins(c, 1, from, 2, NULL), PD_OK);
  assert_int_equal(c->nodes[1].n_origins, 2);
  char buf[200];
  fn_node_describe(c, 1, buf, sizeof buf);
  assert_non_null(strstr(buf, "(from s, p)")); /* not a _Fused op */
  fn_graph_free(c);

  /* Inserting before a node renumbers the references after it. */
  int ins;
  fn_ref x0 = fn_arg_ref(0);
  assert_int_equal(fn_graph_insert_op(g, 0, "n", dev_op_lookup("Neg"), &x0, 1,
                                      NULL, 0, &ins, NULL),
                   PD_OK);
  assert_int_equal(ins, 0);
  assert_true(fn_ref_eq(g->nodes[2].in[0], fn_node_ref(1, 0)));
  assert_true(fn_ref_eq(g->outputs[0], fn_node_ref(2, 0)));

  /* What inference rejects names the function and the node. */
  int64_t d2[1] = {4};
  double zv[4] = {0};
  dev_tensor *z = tu_mirrored(e, PD_FLOAT32, 1, d2, zv);
  fn_graph *h = fn_eval_graph(e, "g", (dev_tensor *[]){args[0], z}, 2);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(fn_graph_add_op(h, "bad", dev_op_lookup("Add"), in, 2, NULL,
                                   0, NULL, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "function 'g', node 'bad'"));
  fn_graph_free(h);
  dev_tensor_release(z);

  fn_graph_free(g);
  dev_tensor_release(args[0]);
  dev_tensor_release(args[1]);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(builds_infers_and_evaluates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
