/* server/convert_fn.c: a function definition to the wire and back, as
 * RegisterFunction decodes it, DescribeFunction answers it and the
 * optimizer plugins receive it (serialized FunctionDef bytes); the bounds
 * the server checks before the engine sees a definition. Expected values
 * are the definition written here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convert.h"

static const srv_req_limits L = {65536, 256};

/* f(x, w) = { mm = MatMul(x, w, transpose_b=true); s = Sum(mm, axis=[0,1]);
 *             g = Gradients(s, w) (origins: mm) } -> y = mm:0, dw = g */
static const char *const mm_in[] = {"x", "w"}, *const s_in[] = {"mm:0"},
                         *const g_in[] = {"s", "w"}, *const g_orig[] = {"mm"};
static const int64_t axes[2] = {0, 1};

static dev_fn_def make_def(dev_attr *mm_attrs, dev_attr *s_attrs,
                           dev_fn_node *nodes, dev_fn_arg *args,
                           dev_fn_output *outs, dev_fn_value_info *vi) {
  args[0] = (dev_fn_arg){"x", PD_FLOAT32};
  args[1] = (dev_fn_arg){"w", PD_FLOAT64};
  mm_attrs[0] = dev_attr_bool("transpose_b", true);
  s_attrs[0] = dev_attr_int_list("axis", axes, 2);
  vi[0].dtype = PD_FLOAT32;
  vi[0].shape.rank = 2;
  vi[0].shape.dims[0] = 32;
  vi[0].shape.dims[1] = -1;
  nodes[0] = (dev_fn_node){.name = "mm",
                           .op = "MatMul",
                           .inputs = mm_in,
                           .num_inputs = 2,
                           .attrs = mm_attrs,
                           .num_attrs = 1,
                           .outputs_info = vi,
                           .num_outputs_info = 1};
  nodes[1] = (dev_fn_node){.name = "s",
                           .op = "Sum",
                           .inputs = s_in,
                           .num_inputs = 1,
                           .attrs = s_attrs,
                           .num_attrs = 1};
  nodes[2] = (dev_fn_node){.name = "g",
                           .op = "Gradients",
                           .inputs = g_in,
                           .num_inputs = 2,
                           .origins = g_orig,
                           .num_origins = 1};
  outs[0] = (dev_fn_output){"y", "mm:0"};
  outs[1] = (dev_fn_output){"dw", "g"};
  dev_fn_def d = DEV_FN_DEF_INITIALIZER;
  d.name = "f";
  d.args = args;
  d.num_args = 2;
  d.nodes = nodes;
  d.num_nodes = 3;
  d.outputs = outs;
  d.num_outputs = 2;
  return d;
}

static void assert_same(const dev_fn_def *a, const dev_fn_def *b) {
  assert_string_equal(a->name, b->name);
  assert_int_equal(a->num_args, b->num_args);
  for (int i = 0; i < a->num_args; i++) {
    assert_string_equal(a->args[i].name, b->args[i].name);
    assert_int_equal(a->args[i].dtype, b->args[i].dtype);
  }
  assert_int_equal(a->num_nodes, b->num_nodes);
  for (int i = 0; i < a->num_nodes; i++) {
    const dev_fn_node *x = &a->nodes[i], *y = &b->nodes[i];
    assert_string_equal(x->name, y->name);
    assert_string_equal(x->op, y->op);
    assert_int_equal(x->num_inputs, y->num_inputs);
    for (int k = 0; k < x->num_inputs; k++)
      assert_string_equal(x->inputs[k], y->inputs[k]);
    assert_int_equal(x->num_origins, y->num_origins);
    for (int k = 0; k < x->num_origins; k++)
      assert_string_equal(x->origins[k], y->origins[k]);
    assert_int_equal(x->num_attrs, y->num_attrs);
    for (int k = 0; k < x->num_attrs; k++) {
      assert_string_equal(x->attrs[k].name, y->attrs[k].name);
      assert_int_equal(x->attrs[k].value.type, y->attrs[k].value.type);
    }
  }
  assert_int_equal(a->num_outputs, b->num_outputs);
  for (int i = 0; i < a->num_outputs; i++) {
    assert_string_equal(a->outputs[i].name, b->outputs[i].name);
    assert_string_equal(a->outputs[i].source, b->outputs[i].source);
  }
}

static void test_round_trip_bytes(void **state) {
  (void)state;
  dev_attr ma[1], sa[1];
  dev_fn_node nodes[3];
  dev_fn_arg args[2];
  dev_fn_output outs[2];
  dev_fn_value_info vi[1];
  dev_fn_def d = make_def(ma, sa, nodes, args, outs, vi);
  dev_status st = DEV_STATUS_INIT;
  uint8_t *bytes = NULL;
  size_t len = 0;
  assert_int_equal(srv_fn_def_to_proto(&d, &bytes, &len, &st), PD_OK);
  /* The bytes are a FunctionDef with the value infos filled. */
  Paradev__V1__FunctionDef *pb =
      paradev__v1__function_def__unpack(NULL, len, bytes);
  assert_non_null(pb);
  assert_int_equal(pb->n_nodes, 3);
  assert_int_equal(pb->nodes[0]->n_outputs_info, 1);
  assert_int_equal(pb->nodes[0]->outputs_info[0]->dtype,
                   PARADEV__V1__DTYPE__DTYPE_FLOAT32);
  assert_int_equal(pb->nodes[0]->outputs_info[0]->shape->n_dims, 2);
  assert_int_equal(pb->nodes[0]->outputs_info[0]->shape->dims[1], -1);
  assert_int_equal(pb->nodes[1]->attrs[0]->value->int_list->n_values, 2);
  assert_null(pb->options); /* no options: a plugin's graph has none */
  paradev__v1__function_def__free_unpacked(pb, NULL);
  dev_fn_def *back = NULL;
  assert_int_equal(srv_fn_def_from_proto(bytes, len, &back, &st), PD_OK);
  assert_same(&d, back);
  assert_true(back->nodes[0].attrs[0].value.u.b);
  assert_int_equal(back->nodes[1].attrs[0].value.u.ilist.n, 2);
  assert_int_equal(back->nodes[1].attrs[0].value.u.ilist.v[1], 1);
  srv_fn_def_proto_free(back);
  free(bytes);
  srv_fn_def_proto_free(NULL);
  /* Bytes that are not a FunctionDef. */
  const uint8_t junk[] = {0xff, 0xff, 0xff};
  assert_int_equal(srv_fn_def_from_proto(junk, sizeof junk, &back, &st),
                   PD_INVALID_ARGUMENT);
}

static void test_options_round_trip(void **state) {
  (void)state;
  dev_attr ma[1], sa[1];
  dev_fn_node nodes[3];
  dev_fn_arg args[2];
  dev_fn_output outs[2];
  dev_fn_value_info vi[1];
  dev_fn_def d = make_def(ma, sa, nodes, args, outs, vi);
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  o.passes[DEV_PASS_FUSION] = DEV_TRI_OFF;
  o.passes[DEV_PASS_CSE] = DEV_TRI_ON;
  o.max_instantiations = 3;
  srv_arena a = {NULL};
  Paradev__V1__FunctionDef *pb = srv_fn_def_to_pb(&d, &o, &a);
  assert_non_null(pb);
  assert_int_equal(pb->options->fusion, PARADEV__V1__TRI_STATE__TRI_STATE_OFF);
  srv_fn_decoded dec;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_from_pb(&L, pb, &a, &dec, &st), PD_OK);
  assert_same(&d, &dec.def);
  assert_int_equal(dec.opts.passes[DEV_PASS_FUSION], DEV_TRI_OFF);
  assert_int_equal(dec.opts.passes[DEV_PASS_CSE], DEV_TRI_ON);
  assert_int_equal(dec.opts.passes[DEV_PASS_PRUNING], DEV_TRI_DEFAULT);
  assert_int_equal(dec.opts.max_instantiations, 3);
  srv_arena_free(&a);
}

/* Decodes `pb` expecting INVALID_ARGUMENT with `needle` in the message. */
static void expect_bad(const Paradev__V1__FunctionDef *pb, const char *needle) {
  srv_arena a = {NULL};
  srv_fn_decoded dec;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_from_pb(&L, pb, &a, &dec, &st),
                   PD_INVALID_ARGUMENT);
  if (!strstr(st.msg, needle))
    fail_msg("message \"%s\" does not contain \"%s\"", st.msg, needle);
  srv_arena_free(&a);
}

static void test_bounds(void **state) {
  (void)state;
  expect_bad(NULL, "no function");
  Paradev__V1__FunctionDef def = PARADEV__V1__FUNCTION_DEF__INIT;
  def.name = "";
  expect_bad(&def, "0 bytes");
  char big[DEV_FN_NAME_MAX + 2];
  memset(big, 'n', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  def.name = big;
  expect_bad(&def, "129 bytes");
  def.name = "f";
  /* A node named over the limit, one with an empty input, one with too
   * many inputs. */
  Paradev__V1__FunctionNode nd = PARADEV__V1__FUNCTION_NODE__INIT;
  Paradev__V1__FunctionNode *nds[1] = {&nd};
  def.n_nodes = 1;
  def.nodes = nds;
  nd.name = big;
  nd.op = "Relu";
  expect_bad(&def, "node 0 is 129 bytes");
  nd.name = "n";
  char *in1[1] = {""};
  nd.n_inputs = 1;
  nd.inputs = in1;
  expect_bad(&def, "node 0 ('n'): an input is 0 bytes");
  char *many[DEV_MAX_INPUTS + 1];
  for (int i = 0; i <= DEV_MAX_INPUTS; i++) many[i] = "x";
  nd.n_inputs = DEV_MAX_INPUTS + 1;
  nd.inputs = many;
  expect_bad(&def, "65 inputs");
  nd.n_inputs = 0;
  nd.op = "";
  expect_bad(&def, "its op name is 0 bytes");
  nd.op = "Relu";
  /* An output without a source. */
  Paradev__V1__FunctionOutput out = PARADEV__V1__FUNCTION_OUTPUT__INIT;
  Paradev__V1__FunctionOutput *outs[1] = {&out};
  out.name = "y";
  out.source = "";
  def.n_outputs = 1;
  def.outputs = outs;
  expect_bad(&def, "the source of output 0 is 0 bytes");
  out.source = "n";
  /* An arg of dtype 0. */
  Paradev__V1__FunctionArg ar = PARADEV__V1__FUNCTION_ARG__INIT;
  Paradev__V1__FunctionArg *ars[1] = {&ar};
  ar.name = "x";
  def.n_args = 1;
  def.args = ars;
  expect_bad(&def, "arg 0 ('x')");
  ar.dtype = PARADEV__V1__DTYPE__DTYPE_INT64;
  /* Options out of range. */
  Paradev__V1__FunctionOptions op = PARADEV__V1__FUNCTION_OPTIONS__INIT;
  def.options = &op;
  op.cuda_graph = (Paradev__V1__TriState)3;
  expect_bad(&def, "options.cuda_graph is 3");
  op.cuda_graph = PARADEV__V1__TRI_STATE__TRI_STATE_ON;
  op.max_instantiations = DEV_FN_MAX_INST_CAP + 1;
  expect_bad(&def, "options.max_instantiations is 65");
  op.max_instantiations = DEV_FN_MAX_INST_CAP;
  /* Now valid. */
  srv_arena a = {NULL};
  srv_fn_decoded dec;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_from_pb(&L, &def, &a, &dec, &st), PD_OK);
  assert_int_equal(dec.def.num_nodes, 1);
  assert_int_equal(dec.def.args[0].dtype, PD_INT64);
  assert_int_equal(dec.opts.passes[DEV_PASS_CUDA_GRAPH], DEV_TRI_ON);
  assert_int_equal(dec.opts.max_instantiations, DEV_FN_MAX_INST_CAP);
  srv_arena_free(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_bytes),
      cmocka_unit_test(test_options_round_trip),
      cmocka_unit_test(test_bounds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
