/* server/convert_fn.c, the one FunctionDef converter: a function
 * definition to the wire and back, as RegisterFunction decodes it,
 * DescribeFunction answers it and the optimizer plugins receive and return
 * it (serialized FunctionDef bytes): every attribute type, origins and
 * outputs_info both ways, an absent attr left out; the bounds checked
 * before the engine sees a definition, junk bytes and out-of-range values
 * refused naming what was wrong, and what a FunctionDef cannot carry
 * refused on the way out; strings that are not UTF-8 sent with those
 * bytes as '?'. Expected values are the definitions written here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convert.h"

static const srv_req_limits L = {65536, 256, 4};

/* f(x, w) = { mm = MatMul(x, w, transpose_b=true); s = Sum(mm, axis=[0,1]);
 *             g = Gradients(s, w) (origins: mm) } -> y = mm:0, dw = g */
static const char *const mm_in[] = {"x", "w"}, *const s_in[] = {"mm:0"},
                         *const g_in[] = {"s", "w"}, *const g_orig[] = {"mm"};
static const int64_t axes[2] = {0, 1};

/* The definition and the storage it points into. */
typedef struct fixture {
  dev_attr mm_attrs[1], s_attrs[1];
  dev_fn_node nodes[3];
  dev_fn_arg args[2];
  dev_fn_output outs[2];
  dev_fn_value_info vi[1];
  dev_fn_def d;
} fixture;

static void make_def(fixture *f) {
  dev_attr *mm_attrs = f->mm_attrs, *s_attrs = f->s_attrs;
  dev_fn_node *nodes = f->nodes;
  dev_fn_arg *args = f->args;
  dev_fn_output *outs = f->outs;
  dev_fn_value_info *vi = f->vi;
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
  f->d = d;
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
    assert_int_equal(x->num_outputs_info, y->num_outputs_info);
    for (int k = 0; k < x->num_outputs_info; k++) {
      const dev_fn_value_info *p = &x->outputs_info[k],
                              *q = &y->outputs_info[k];
      assert_int_equal(p->dtype, q->dtype);
      assert_int_equal(p->shape.rank, q->shape.rank);
      for (int r = 0; r < p->shape.rank; r++)
        assert_int_equal(p->shape.dims[r], q->shape.dims[r]);
    }
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
  fixture f;
  make_def(&f);
  dev_fn_def d = f.d;
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
  assert_string_equal(st.msg,
                      "3 bytes that do not parse as a paradev.v1.FunctionDef");
}

static void test_options_round_trip(void **state) {
  (void)state;
  fixture f;
  make_def(&f);
  dev_fn_def d = f.d;
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  o.passes[DEV_PASS_FUSION] = DEV_TRI_OFF;
  o.passes[DEV_PASS_CSE] = DEV_TRI_ON;
  o.max_instantiations = 3;
  srv_arena a = {NULL};
  Paradev__V1__FunctionDef *pb = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_to_pb(&d, &o, &a, &pb, &st), PD_OK);
  assert_int_equal(pb->options->fusion, PARADEV__V1__TRI_STATE__TRI_STATE_OFF);
  srv_fn_decoded dec;
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

/* Every attribute type through the plugins' bytes and back; an absent one
 * (DEV_ATTR_NONE) is left out. */
static void test_every_attr_type(void **state) {
  (void)state;
  static const int64_t il[3] = {1, -2, 3};
  static const double fl[2] = {0.5, -1e300};
  static const int64_t dims[2] = {2, 5};
  dev_attr at[9] = {dev_attr_int("i", -7),
                    dev_attr_float("f", 0.25),
                    dev_attr_bool("b", true),
                    dev_attr_string("s", "hello"),
                    dev_attr_dtype("t", PD_BFLOAT16),
                    dev_attr_shape("sh", 2, dims),
                    dev_attr_int_list("il", il, 3),
                    dev_attr_float_list("fl", fl, 2),
                    {"absent", {.type = DEV_ATTR_NONE}}};
  static const char *const org[2] = {"p", "q"};
  static const char *const ins[1] = {"x"};
  static const dev_fn_arg args[1] = {{"x", PD_FLOAT32}};
  static const dev_fn_value_info vi[2] = {{PD_FLOAT32, {2, {3, 4}}},
                                          {PD_INT64, {0, {0}}}};
  dev_fn_node nd = {"n", "Foo", ins, 1, at, 9, org, 2, vi, 2};
  dev_fn_output o = {"y", "n:0"};
  dev_fn_def d = DEV_FN_DEF_INITIALIZER;
  d.name = "g", d.args = args, d.num_args = 1, d.nodes = &nd, d.num_nodes = 1;
  d.outputs = &o, d.num_outputs = 1;
  uint8_t *bytes = NULL;
  size_t n = 0;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_to_proto(&d, &bytes, &n, &st), PD_OK);
  assert_true(n > 0);
  dev_fn_def *b = NULL;
  assert_int_equal(srv_fn_def_from_proto(bytes, n, &b, &st), PD_OK);
  free(bytes);
  assert_string_equal(b->name, "g");
  assert_int_equal(b->args[0].dtype, PD_FLOAT32);
  assert_string_equal(b->outputs[0].source, "n:0");
  const dev_fn_node *m = &b->nodes[0];
  assert_int_equal(m->num_attrs, 8);
  assert_string_equal(m->attrs[0].name, "i");
  assert_int_equal(m->attrs[0].value.type, DEV_ATTR_INT);
  assert_int_equal(m->attrs[0].value.u.i, -7);
  assert_int_equal(m->attrs[1].value.type, DEV_ATTR_FLOAT);
  assert_true(m->attrs[1].value.u.f == 0.25);
  assert_int_equal(m->attrs[2].value.type, DEV_ATTR_BOOL);
  assert_true(m->attrs[2].value.u.b);
  assert_int_equal(m->attrs[3].value.type, DEV_ATTR_STRING);
  assert_int_equal(m->attrs[3].value.u.s.len, 5);
  assert_memory_equal(m->attrs[3].value.u.s.ptr, "hello", 5);
  assert_int_equal(m->attrs[4].value.type, DEV_ATTR_DTYPE);
  assert_int_equal(m->attrs[4].value.u.dtype, PD_BFLOAT16);
  assert_int_equal(m->attrs[5].value.type, DEV_ATTR_SHAPE);
  assert_int_equal(m->attrs[5].value.u.shape.rank, 2);
  assert_int_equal(m->attrs[5].value.u.shape.dims[0], 2);
  assert_int_equal(m->attrs[5].value.u.shape.dims[1], 5);
  assert_int_equal(m->attrs[6].value.type, DEV_ATTR_INT_LIST);
  assert_int_equal(m->attrs[6].value.u.ilist.n, 3);
  assert_int_equal(m->attrs[6].value.u.ilist.v[1], -2);
  assert_int_equal(m->attrs[7].value.type, DEV_ATTR_FLOAT_LIST);
  assert_string_equal(m->attrs[7].name, "fl");
  assert_int_equal(m->attrs[7].value.u.flist.n, 2);
  assert_true(m->attrs[7].value.u.flist.v[1] == -1e300);
  assert_int_equal(m->num_origins, 2);
  assert_string_equal(m->origins[1], "q");
  assert_int_equal(m->num_outputs_info, 2);
  assert_int_equal(m->outputs_info[0].dtype, PD_FLOAT32);
  assert_int_equal(m->outputs_info[0].shape.rank, 2);
  assert_int_equal(m->outputs_info[0].shape.dims[0], 3);
  assert_int_equal(m->outputs_info[0].shape.dims[1], 4);
  assert_int_equal(m->outputs_info[1].dtype, PD_INT64);
  assert_int_equal(m->outputs_info[1].shape.rank, 0);
  srv_fn_def_proto_free(b);
}

/* Serializes `pb` and expects srv_fn_def_from_proto to refuse it with
 * INVALID_ARGUMENT and `needle` in the message. */
/* `pb` serialized, as a plugin writes it; *n bytes (malloc'd). */
static uint8_t *pack(const Paradev__V1__FunctionDef *pb, size_t *n) {
  *n = paradev__v1__function_def__get_packed_size(pb);
  uint8_t *bytes = malloc(*n ? *n : 1);
  assert_non_null(bytes);
  paradev__v1__function_def__pack(pb, bytes);
  return bytes;
}

static void expect_bad_bytes(const Paradev__V1__FunctionDef *pb,
                             const char *needle) {
  size_t n = 0;
  uint8_t *bytes = pack(pb, &n);
  dev_fn_def *b = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_from_proto(bytes, n, &b, &st),
                   PD_INVALID_ARGUMENT);
  assert_null(b);
  if (!strstr(st.msg, needle))
    fail_msg("message \"%s\" does not contain \"%s\"", st.msg, needle);
  free(bytes);
}

/* Bytes that parse but hold what the engine's types cannot: each refused
 * naming the node, arg or attr. */
static void test_bad_bytes_refused(void **state) {
  (void)state;
  Paradev__V1__FunctionDef def = PARADEV__V1__FUNCTION_DEF__INIT;
  def.name = "f";
  Paradev__V1__FunctionArg ar = PARADEV__V1__FUNCTION_ARG__INIT;
  Paradev__V1__FunctionArg *ars[1] = {&ar};
  ar.name = "x";
  ar.dtype = (Paradev__V1__DType)42;
  def.n_args = 1;
  def.args = ars;
  expect_bad_bytes(&def, "arg 0 ('x'): dtype: dtype 42 is not a valid dtype");
  ar.dtype = PARADEV__V1__DTYPE__DTYPE_FLOAT32;

  Paradev__V1__FunctionNode nd = PARADEV__V1__FUNCTION_NODE__INIT;
  Paradev__V1__FunctionNode *nds[1] = {&nd};
  char *in[1] = {"x"};
  nd.name = "n";
  nd.op = "Relu";
  nd.n_inputs = 1;
  nd.inputs = in;
  def.n_nodes = 1;
  def.nodes = nds;
  /* An attr without a value, then one with a string over the engine's
   * DEV_ATTR_STRING_MAX. */
  Paradev__V1__Attr at = PARADEV__V1__ATTR__INIT;
  Paradev__V1__Attr *ats[1] = {&at};
  Paradev__V1__AttrValue v = PARADEV__V1__ATTR_VALUE__INIT;
  at.name = "alpha";
  at.value = &v;
  nd.n_attrs = 1;
  nd.attrs = ats;
  expect_bad_bytes(&def, "node 0 (n): attr alpha has no value");
  char big[DEV_ATTR_STRING_MAX + 2];
  memset(big, 's', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  v.value_case = PARADEV__V1__ATTR_VALUE__VALUE_S;
  v.s = big;
  expect_bad_bytes(&def, "attr alpha: a string of 257 bytes");
  nd.n_attrs = 0;
  /* outputs_info: a rank over PD_MAX_RANK, a dim below -1, a dtype past the
   * enum. */
  Paradev__V1__ValueInfo vi = PARADEV__V1__VALUE_INFO__INIT;
  Paradev__V1__ValueInfo *vis[1] = {&vi};
  Paradev__V1__Shape sh = PARADEV__V1__SHAPE__INIT;
  int64_t dims[PD_MAX_RANK + 1] = {0};
  sh.dims = dims;
  sh.n_dims = PD_MAX_RANK + 1;
  vi.dtype = PARADEV__V1__DTYPE__DTYPE_FLOAT32;
  vi.shape = &sh;
  nd.n_outputs_info = 1;
  nd.outputs_info = vis;
  char want[160];
  snprintf(want, sizeof want,
           "node 0 ('n'): outputs_info 0 has dtype 1 and a shape of rank %d",
           PD_MAX_RANK + 1);
  expect_bad_bytes(&def, want);
  sh.n_dims = 2;
  dims[1] = -2;
  expect_bad_bytes(&def, "outputs_info 0 has dtype 1 and a shape of rank 2");
  dims[1] = -1; /* -1: the components differ; fine */
  vi.dtype = (Paradev__V1__DType)PD_DTYPE_COUNT;
  snprintf(want, sizeof want, "outputs_info 0 has dtype %d", PD_DTYPE_COUNT);
  expect_bad_bytes(&def, want);
  vi.dtype = PARADEV__V1__DTYPE__DTYPE_FLOAT32;
  /* Too many outputs_info. */
  Paradev__V1__ValueInfo *many[DEV_MAX_OUTPUTS + 1];
  for (int i = 0; i <= DEV_MAX_OUTPUTS; i++) many[i] = &vi;
  nd.n_outputs_info = DEV_MAX_OUTPUTS + 1;
  nd.outputs_info = many;
  char too_many[32];
  snprintf(too_many, sizeof too_many, "%d outputs_info", DEV_MAX_OUTPUTS + 1);
  expect_bad_bytes(&def, too_many);
  nd.n_outputs_info = 1;
  nd.outputs_info = vis;
  /* Now valid: parsed, the value info kept. */
  Paradev__V1__FunctionOutput out = PARADEV__V1__FUNCTION_OUTPUT__INIT;
  Paradev__V1__FunctionOutput *outs[1] = {&out};
  out.name = "y";
  out.source = "n";
  def.n_outputs = 1;
  def.outputs = outs;
  size_t n = 0;
  uint8_t *bytes = pack(&def, &n);
  dev_fn_def *b = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_from_proto(bytes, n, &b, &st), PD_OK);
  free(bytes);
  assert_int_equal(b->nodes[0].num_outputs_info, 1);
  assert_int_equal(b->nodes[0].outputs_info[0].shape.dims[1], -1);
  srv_fn_def_proto_free(b);
}

/* What a FunctionDef cannot carry is refused on the way out, naming the
 * function, the node and the attr (the engine's graphs hold none). */
/* Strings that are not UTF-8 (a plugin's origin, as the trial's
 * "evil\n\x1b[31mred\xff") go out with those bytes (and control
 * characters) as '?', never as they are: proto3 strings must be UTF-8 and
 * Python's protobuf refuses a whole reply holding one that is not. Valid
 * UTF-8 (any language) is kept exactly, in every field. */
static void test_not_utf8_replaced(void **state) {
  (void)state;
  fixture f;
  make_def(&f);
  static const char *const bad_orig[] = {"evil\n\x1b[31mred\xff",
                                         "caf\xc3\xa9"};
  f.nodes[2].origins = bad_orig;
  f.nodes[2].num_origins = 2;
  f.nodes[0].name = "m\xc0\xafm"; /* overlong '/' */
  f.outs[0].source = "m\xc0\xafm:0";
  f.args[0].name = "\xed\xa0\x80x"; /* a surrogate */
  f.mm_attrs[0] = dev_attr_string("note",
                                  "a\xfe"
                                  "b");
  dev_fn_def d = f.d;
  d.name = "f\xe2\x82"; /* cut inside a character */
  srv_arena a = {NULL};
  Paradev__V1__FunctionDef *pb = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_to_pb(&d, NULL, &a, &pb, &st), PD_OK);
  assert_string_equal(pb->name, "f??");
  assert_string_equal(pb->args[0]->name, "???x");
  assert_string_equal(pb->args[1]->name, "w");
  assert_string_equal(pb->nodes[0]->name, "m??m");
  assert_string_equal(pb->outputs[0]->source, "m??m:0");
  assert_string_equal(pb->nodes[0]->attrs[0]->value->s, "a?b");
  assert_int_equal(pb->nodes[2]->n_origins, 2);
  assert_string_equal(pb->nodes[2]->origins[0], "evil??[31mred?");
  assert_string_equal(pb->nodes[2]->origins[1], "caf\xc3\xa9");
  /* The definition itself is not touched. */
  assert_string_equal(f.nodes[2].origins[0], "evil\n\x1b[31mred\xff");
  srv_arena_free(&a);
  /* DescribeFunction's signature and miss reasons too. */
  dev_fn_info info;
  memset(&info, 0, sizeof info);
  info.num_instantiations = 1;
  snprintf(info.insts[0].signature, sizeof info.insts[0].signature,
           "(float32[2]\xff)");
  info.num_miss_reasons = 1;
  snprintf(info.miss_reasons[0], sizeof info.miss_reasons[0], "x\x80y");
  Paradev__V1__DescribeFunctionResponse r =
      PARADEV__V1__DESCRIBE_FUNCTION_RESPONSE__INIT;
  assert_int_equal(srv_fn_info_to_pb(&info, &a, &r, &st), PD_OK);
  assert_string_equal(r.instantiations[0]->signature, "(float32[2]?)");
  assert_string_equal(r.cache_misses[0], "x?y");
  srv_arena_free(&a);
}

static void test_unfit_def_refused(void **state) {
  (void)state;
  fixture f;
  make_def(&f);
  dev_fn_def d = f.d;
  uint8_t *bytes = NULL;
  size_t len = 0;
  dev_status st = DEV_STATUS_INIT;
  f.mm_attrs[0].value.type = (dev_attr_type)99;
  assert_int_equal(srv_fn_def_to_proto(&d, &bytes, &len, &st),
                   PD_INVALID_ARGUMENT);
  assert_string_equal(st.msg,
                      "function 'f': node 'mm': attr 'transpose_b' (type 99) "
                      "holds a type outside dev_attr_type; a FunctionDef "
                      "cannot carry it");
  f.mm_attrs[0] = dev_attr_bool("transpose_b", true);
  f.vi[0].shape.rank = PD_MAX_RANK + 1;
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_to_proto(&d, &bytes, &len, &st),
                   PD_INVALID_ARGUMENT);
  char want[128];
  snprintf(want, sizeof want,
           "function 'f': node 'mm': output 0 has rank %d; expected 0 to %d",
           PD_MAX_RANK + 1, PD_MAX_RANK);
  assert_string_equal(st.msg, want);
  assert_null(bytes);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(srv_fn_def_to_proto(NULL, &bytes, &len, &st),
                   PD_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_bytes),
      cmocka_unit_test(test_options_round_trip),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_every_attr_type),
      cmocka_unit_test(test_bad_bytes_refused),
      cmocka_unit_test(test_unfit_def_refused),
      cmocka_unit_test(test_not_utf8_replaced),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
