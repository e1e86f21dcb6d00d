/* Graph functions end to end on the CPU engine (device/fn/: library.c,
 * convert.c, inline.c, instance.c, pipeline.c, run.c): registration errors
 * of each kind, identical re-registration, calls through dev_fn_prepare_call
 * and dev_op_submit with values computed by hand, a collective inside,
 * nested calls (a doubling chain of 4,096 nodes, the failure cache), a node's run-time failure naming the function and node, the
 * cache (hits, explained misses, the cap), a library freed while a call is
 * queued, and the pass settings describe reports. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fn/fn_call.h"
#include "testutil.h"

/* --- building definitions -------------------------------------------------- */

typedef struct tnode {
  const char *name, *op;
  const char *in[4];
  int n_in;
  dev_attr attrs[3];
  int n_attrs;
} tnode;

/* A definition over static-lifetime arrays the test owns. */
typedef struct tdef {
  dev_fn_def def;
  dev_fn_arg args[4];
  dev_fn_node nodes[8];
  dev_fn_output outs[4];
  tnode tn[8]; /* the nodes' inputs and attributes */
} tdef;

static void tdef_make(tdef *t, const char *name, const dev_fn_arg *args, int na,
                      tnode *nodes, int nn, const dev_fn_output *outs, int no) {
  memset(t, 0, sizeof *t);
  t->def = (dev_fn_def)DEV_FN_DEF_INITIALIZER;
  t->def.name = name;
  memcpy(t->args, args, sizeof *args * (size_t)na);
  memcpy(t->tn, nodes, sizeof *nodes * (size_t)nn);
  for (int i = 0; i < nn; i++) {
    dev_fn_node *n = &t->nodes[i];
    n->name = t->tn[i].name;
    n->op = t->tn[i].op;
    n->inputs = t->tn[i].in;
    n->num_inputs = t->tn[i].n_in;
    n->attrs = t->tn[i].attrs;
    n->num_attrs = t->tn[i].n_attrs;
  }
  memcpy(t->outs, outs, sizeof *outs * (size_t)no);
  t->def.args = t->args;
  t->def.num_args = na;
  t->def.nodes = t->nodes;
  t->def.num_nodes = nn;
  t->def.outputs = t->outs;
  t->def.num_outputs = no;
}

static void reg_fails(dev_fn_lib *lib, const tdef *t, pd_code code,
                      const char *needle) {
  dev_status st = DEV_STATUS_INIT;
  bool existed = true;
  assert_int_equal(dev_fn_register(lib, &t->def, NULL, &existed, &st), code);
  if (!strstr(st.msg, needle))
    fail_msg("message \"%s\" lacks \"%s\"", st.msg, needle);
}

/* Options with fusion off, for tests that look at the nodes of the optimized
 * graph by their registered names (fusion would fold them into one
 * _FusedElementwise). */
static dev_fn_options no_fusion(void) {
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  o.passes[DEV_PASS_FUSION] = DEV_TRI_OFF;
  return o;
}

static void reg_ok(dev_fn_lib *lib, const tdef *t, const dev_fn_options *o) {
  dev_status st = DEV_STATUS_INIT;
  bool existed = true;
  if (dev_fn_register(lib, &t->def, o, &existed, &st) != PD_OK)
    fail_msg("register: %s", st.msg);
  assert_false(existed);
}

/* Prepares and submits a call; returns its outputs (references). */
static void call(dev_engine *e, dev_fn_lib *lib, const char *fn,
                 dev_tensor *const *in, int n_in, dev_tensor **out, int n_out) {
  dev_op *op = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_fn_prepare_call(lib, fn, in, n_in, &op, &st) != PD_OK)
    fail_msg("prepare_call: %s", st.msg);
  assert_true(dev_op_is_function_call(op));
  assert_int_equal(dev_op_num_outputs(op), n_out);
  for (int i = 0; i < n_out; i++) {
    out[i] = dev_op_output(op, i);
    dev_tensor_retain(out[i]);
  }
  dev_op_submit(e, op);
}

static const dev_fn_arg k_xy[2] = {{"x", PD_FLOAT32}, {"y", PD_FLOAT32}};

/* f(x, y) = ((x + y) * x, x + y, x, x + y) */
static void make_f(tdef *t) {
  tnode nodes[2] = {{"p", "Mul", {"s", "x"}, 2, {{0}}, 0},
                    {"s", "Add", {"x", "y"}, 2, {{0}}, 0}}; /* unsorted */
  dev_fn_output outs[4] = {
      {"prod", "p"}, {"sum", "s"}, {"xx", "x"}, {"again", "s:0"}};
  tdef_make(t, "f", k_xy, 2, nodes, 2, outs, 4);
}

/* --- registration ---------------------------------------------------------- */

static void registration_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  dev_fn_output out1[1] = {{"o", "a"}};
  tnode n1[1] = {{"a", "Neg", {"x"}, 1, {{0}}, 0}};

  tdef_make(&t, "Add", k_xy, 1, n1, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "the name is a registered op");
  tdef_make(&t, "bad:name", k_xy, 1, n1, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "the function's name 'bad:name' (8 bytes) (byte 3, 0x3A, is not "
            "allowed) is not valid; expected 1 to 128 bytes of UTF-8 text "
            "without ':', spaces or control characters");
  /* Not UTF-8, or a control character: refused, shown as \xNN. */
  tdef_make(&t, "f\xff", k_xy, 1, n1, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "'f\\xFF' (2 bytes) (byte 1");
  tdef_make(&t, "f\xc2\x85", k_xy, 1, n1, 1, out1, 1); /* C1 NEL */
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "'f\\xC2\\x85' (3 bytes)");
  tnode ctl[1] = {{"a\x1b[31m", "Neg", {"x"}, 1, {{0}}, 0}};
  tdef_make(&t, "g", k_xy, 1, ctl, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'g': node 0 has name 'a\\x1B[31m' (6 bytes) (byte 1");
  /* The pseudo-op's name would shadow it. */
  tdef_make(&t, "Gradients", k_xy, 1, n1, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'Gradients': the name is the Gradients pseudo-op");
  /* has_grad_y of the wrong type says which type it takes. */
  tnode gy[2] = {{"a", "Neg", {"x"}, 1, {{0}}, 0},
                 {"g", "Gradients", {"a", "x"}, 2, {{0}}, 1}};
  gy[1].attrs[0] = dev_attr_int("has_grad_y", 1);
  dev_fn_output outg[1] = {{"o", "g"}};
  tdef_make(&t, "g", k_xy, 1, gy, 2, outg, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'g', node 'g': Gradients attribute 'has_grad_y' is "
            "int; expected a bool");
  /* "node:k" has one spelling: no leading zeros, signs or spaces. */
  dev_fn_output out00[1] = {{"o", "a:00"}};
  tdef_make(&t, "g", k_xy, 1, n1, 1, out00, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'g', output 'o': 'a:00' has a leading zero in its "
            "output index; expected \"node:k\" with k in decimal without "
            "leading zeros (\"a:0\")");
  const char *bad_k[3] = {"a:+0", "a: 0", "a:0x"};
  for (int k = 0; k < 3; k++) {
    dev_fn_output ob[1] = {{"o", bad_k[k]}};
    tdef_make(&t, "g", k_xy, 1, n1, 1, ob, 1);
    reg_fails(lib, &t, PD_INVALID_ARGUMENT, "names no argument or node");
  }
  tnode dup[2] = {{"x", "Neg", {"x"}, 1, {{0}}, 0},
                  {"a", "Neg", {"x"}, 1, {{0}}, 0}};
  tdef_make(&t, "g", k_xy, 1, dup, 2, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "node 'x' has the name of an");
  tnode unk[1] = {{"a", "Frobnicate", {"x"}, 1, {{0}}, 0}};
  tdef_make(&t, "g", k_xy, 1, unk, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'g', node 'a': unknown op 'Frobnicate'");
  tnode dang[1] = {{"a", "Neg", {"nope"}, 1, {{0}}, 0}};
  tdef_make(&t, "g", k_xy, 1, dang, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'g', node 'a' input 0: 'nope' names no argument");
  tnode badk[2] = {{"a", "Neg", {"x"}, 1, {{0}}, 0},
                   {"b", "Neg", {"a:1"}, 1, {{0}}, 0}};
  tdef_make(&t, "g", k_xy, 1, badk, 2, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "node 'a' has 1 outputs");
  tnode cyc[2] = {{"a", "Neg", {"b"}, 1, {{0}}, 0},
                  {"b", "Neg", {"a"}, 1, {{0}}, 0}};
  tdef_make(&t, "g", k_xy, 1, cyc, 2, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "node 'a' is on a cycle");
  tnode ar[1] = {{"a", "Add", {"x"}, 1, {{0}}, 0}};
  tdef_make(&t, "g", k_xy, 1, ar, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'g', node 'a': Add got 1 inputs");
  /* A list input takes 1 or more: Concat of none is refused, of 3 is fine. */
  tnode cat0[1] = {{"a", "Concat", {NULL}, 0, {{0}}, 0}};
  cat0[0].attrs[0] = dev_attr_int("axis", 0);
  cat0[0].n_attrs = 1;
  tdef_make(&t, "g", k_xy, 1, cat0, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "Concat got 0 inputs");
  tnode attr[1] = {{"a", "Sum", {"x"}, 1, {{0}}, 1}};
  attr[0].attrs[0] = dev_attr_int("axis", 0); /* an int list */
  tdef_make(&t, "g", k_xy, 1, attr, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'g', node 'a': Sum: attribute 'axis' has type int");
  tnode attr2[1] = {{"a", "Neg", {"x"}, 1, {{0}}, 1}};
  attr2[0].attrs[0] = dev_attr_int("bogus", 0);
  tdef_make(&t, "g", k_xy, 1, attr2, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "unknown attribute 'bogus'");
  tnode gr[1] = {{"a", "Gradients", {"x"}, 1, {{0}}, 0}};
  tdef_make(&t, "g", k_xy, 1, gr, 1, out1, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "Gradients got 1 inputs");
  dev_fn_output bad_out[2] = {{"o", "a"}, {"o", "x"}};
  tdef_make(&t, "g", k_xy, 1, n1, 1, bad_out, 2);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "output 'o' is named twice");
  dev_fn_output dang_out[1] = {{"o", "zz"}};
  tdef_make(&t, "g", k_xy, 1, n1, 1, dang_out, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "function 'g', output 'o'");
  /* A call of a function not (yet) registered is an unknown op; a call with
   * the wrong number of inputs names the callee's arguments. */
  tnode c1[1] = {{"c", "h", {"x"}, 1, {{0}}, 0}};
  dev_fn_output outc[1] = {{"o", "c"}};
  tdef_make(&t, "g", k_xy, 1, c1, 1, outc, 1);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT, "unknown op 'h'");
  tdef h;
  tdef_make(&h, "h", k_xy, 2, (tnode[]){{"s", "Add", {"x", "y"}, 2, {{0}}, 0}},
            1, (dev_fn_output[]){{"o", "s"}}, 1);
  reg_ok(lib, &h, NULL);
  reg_fails(lib, &t, PD_INVALID_ARGUMENT,
            "function 'h' got 1 inputs; expected 2");
  assert_int_equal(dev_fn_lib_count(lib), 1);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

static void reregistration(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  make_f(&t);
  reg_ok(lib, &t, NULL);
  bool existed = false;
  assert_int_equal(dev_fn_register(lib, &t.def, NULL, &existed, NULL), PD_OK);
  assert_true(existed);
  assert_int_equal(dev_fn_lib_count(lib), 1);
  assert_string_equal(dev_fn_lib_name_at(lib, 0), "f");
  assert_true(dev_fn_lib_has(lib, "f"));
  assert_false(dev_fn_lib_has(lib, "g"));
  t.nodes[0].op = "Sub"; /* another body */
  reg_fails(lib, &t, PD_ALREADY_EXISTS, "already registered");
  make_f(&t);
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  o.max_instantiations = 3; /* other options */
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_fn_register(lib, &t.def, &o, &existed, &st),
                   PD_ALREADY_EXISTS);
  /* A name in any language is a name (UTF-8, kept as given). */
  make_f(&t);
  t.def.name = "f\xc3\xbcnf\xe2\x82\xac"; /* fünf€ */
  reg_ok(lib, &t, NULL);
  assert_string_equal(dev_fn_lib_name_at(lib, 1), "f\xc3\xbcnf\xe2\x82\xac");
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

static void reg_same(dev_fn_lib *lib, const dev_fn_def *d,
                     const dev_fn_options *o) {
  dev_status st = DEV_STATUS_INIT;
  bool existed = false;
  if (dev_fn_register(lib, d, o, &existed, &st) != PD_OK)
    fail_msg("re-register '%s': %s", d->name, st.msg);
  assert_true(existed);
}

/* Equivalent definitions are one registration (canon.c): defaults given
 * explicitly, attributes in another order, "a:0" for "a", nodes in another
 * order, options spelled out as the defaults in force, and the definition
 * dev_fn_describe returns. Anything that changes the meaning is another. */
static void reregistration_equivalent(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  tnode mm[2] = {{"m", "MatMul", {"x", "y"}, 2, {{0}}, 0},
                 {"n", "Neg", {"m"}, 1, {{0}}, 0}};
  dev_fn_output outs[2] = {{"o", "n"}, {"p", "m"}};
  tdef_make(&t, "m", k_xy, 2, mm, 2, outs, 2);
  reg_ok(lib, &t, NULL);
  tdef v;
  tdef_make(&v, "m", k_xy, 2, mm, 2, outs, 2); /* defaults explicit */
  v.tn[0].attrs[0] = dev_attr_bool("transpose_a", false);
  v.tn[0].n_attrs = v.nodes[0].num_attrs = 1;
  reg_same(lib, &v.def, NULL);
  v.tn[0].attrs[0] = dev_attr_bool("transpose_b", false); /* other order */
  v.tn[0].attrs[1] = dev_attr_bool("transpose_a", false);
  v.tn[0].n_attrs = v.nodes[0].num_attrs = 2;
  reg_same(lib, &v.def, NULL);
  tnode swapped[2] = {mm[1], mm[0]};
  swapped[0].in[0] = "m:0"; /* and "m:0" for "m" */
  dev_fn_output outs0[2] = {{"o", "n:0"}, {"p", "m:0"}};
  tdef_make(&v, "m", k_xy, 2, swapped, 2, outs0, 2);
  reg_same(lib, &v.def, NULL);
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  o.max_instantiations = DEV_FN_DEFAULT_INST_CAP;
  for (int p = 0; p < DEV_PASS_COUNT; p++) o.passes[p] = DEV_TRI_ON;
  reg_same(lib, &t.def, &o);
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "m", &info, NULL), PD_OK);
  reg_same(lib, info.def, NULL); /* "as registered" */
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  /* Other meanings. */
  v = t;
  v.def.args = v.args;
  v.def.nodes = v.nodes;
  v.def.outputs = v.outs;
  v.tn[0].attrs[0] = dev_attr_bool("transpose_a", true);
  v.nodes[0].attrs = v.tn[0].attrs;
  v.nodes[0].num_attrs = 1;
  reg_fails(lib, &v, PD_ALREADY_EXISTS, "already registered");
  v.nodes[0].num_attrs = 0;
  v.outs[1].source = "n";
  reg_fails(lib, &v, PD_ALREADY_EXISTS, "already registered");
  v.outs[1].source = "m";
  o.passes[DEV_PASS_CSE] = DEV_TRI_OFF;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_fn_register(lib, &v.def, &o, NULL, &st),
                   PD_ALREADY_EXISTS);
  reg_same(lib, &v.def, NULL); /* the copy is still t */
  assert_int_equal(dev_fn_lib_count(lib), 1);
  dev_fn_lib_destroy(lib);
  /* Under a config with CSE off, DEFAULT and OFF are one setting. */
  dev_fn_config cfg = DEV_FN_CONFIG_INITIALIZER;
  cfg.passes[DEV_PASS_CSE] = DEV_TRI_OFF;
  cfg.max_instantiations = 4;
  assert_int_equal(dev_fn_lib_create(e, &cfg, &lib, NULL), PD_OK);
  reg_ok(lib, &t, NULL);
  dev_fn_options off = DEV_FN_OPTIONS_INITIALIZER;
  off.passes[DEV_PASS_CSE] = DEV_TRI_OFF;
  off.max_instantiations = 4;
  reg_same(lib, &t.def, &off);
  off.max_instantiations = DEV_FN_DEFAULT_INST_CAP; /* not this library's */
  assert_int_equal(dev_fn_register(lib, &t.def, &off, NULL, &st),
                   PD_ALREADY_EXISTS);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* --- calls ---------------------------------------------------------------- */

static void call_values(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  make_f(&t);
  reg_ok(lib, &t, NULL);
  /* x sharded unevenly ([3] and [2]); y mirrored would not broadcast, so y
   * is sharded too. */
  int64_t dims[1] = {5};
  double xv[5] = {1, 2, 3, 4, 5}, yv[5] = {10, 20, 30, 40, 50};
  dev_tensor *in[2] = {tu_sharded(e, PD_FLOAT32, 1, dims, 0, xv),
                       tu_sharded(e, PD_FLOAT32, 1, dims, 0, yv)};
  dev_tensor *out[4];
  call(e, lib, "f", in, 2, out, 4);
  /* Known before running: dtype and component shapes. */
  assert_int_equal(dev_tensor_dtype(out[0]), PD_FLOAT32);
  assert_int_equal(dev_tensor_component_shape(out[0], 0)->dims[0], 3);
  assert_int_equal(dev_tensor_component_shape(out[0], 1)->dims[0], 2);
  assert_int_equal(dev_tensor_shape(out[0])->dims[0], -1);
  double got[3];
  for (int c = 0; c < 2; c++) {
    int off = c == 0 ? 0 : 3, n = c == 0 ? 3 : 2;
    double want_p[3], want_s[3], want_x[3];
    for (int i = 0; i < n; i++) {
      want_s[i] = xv[off + i] + yv[off + i];
      want_p[i] = want_s[i] * xv[off + i];
      want_x[i] = xv[off + i];
    }
    assert_int_equal(tu_read(out[0], c, got, 3), n);
    tu_assert_close(got, want_p, n, 0, 0);
    tu_read(out[1], c, got, 3);
    tu_assert_close(got, want_s, n, 0, 0);
    tu_read(out[2], c, got, 3);
    tu_assert_close(got, want_x, n, 0, 0);
    tu_read(out[3], c, got, 3);
    tu_assert_close(got, want_s, n, 0, 0);
  }
  /* Mirrored inputs: a second instantiation, mirrored outputs. */
  int64_t d2[1] = {2};
  double a[2] = {1.5, -2}, b[2] = {4, 8};
  dev_tensor *m[2] = {tu_mirrored(e, PD_FLOAT32, 1, d2, a),
                      tu_mirrored(e, PD_FLOAT32, 1, d2, b)};
  dev_tensor *mo[4];
  call(e, lib, "f", m, 2, mo, 4);
  for (int c = 0; c < 2; c++) {
    tu_read(mo[0], c, got, 2);
    tu_assert_close(got, ((double[]){(1.5 + 4) * 1.5, (-2 + 8) * -2.0}), 2, 0,
                    0);
  }
  /* Bad calls: arity, dtype, unknown function. */
  dev_op *op = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_fn_prepare_call(lib, "f", m, 1, &op, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "got 1 inputs; expected 2"));
  dev_tensor *i32 = tu_mirrored(e, PD_INT32, 1, d2, a);
  dev_tensor *bad[2] = {m[0], i32};
  assert_int_equal(dev_fn_prepare_call(lib, "f", bad, 2, &op, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "input 1 is int32; argument 'y' is float32"));
  assert_int_equal(dev_fn_prepare_call(lib, "nope", m, 2, &op, &st),
                   PD_NOT_FOUND);
  /* A call's device time reaches its time sink. */
  uint64_t sink = 0;
  assert_int_equal(dev_fn_prepare_call(lib, "f", m, 2, &op, &st), PD_OK);
  dev_op_set_time_sink(op, &sink);
  dev_tensor *ts = dev_op_output(op, 0);
  dev_tensor_retain(ts);
  dev_op_submit(e, op);
  assert_int_equal(dev_engine_sync(e, NULL), PD_OK);
  assert_true(__atomic_load_n(&sink, __ATOMIC_RELAXED) > 0);
  dev_tensor_release(ts);
  /* A prepared call estimated, then abandoned: its outputs carry the code. */
  assert_int_equal(dev_fn_prepare_call(lib, "f", m, 2, &op, &st), PD_OK);
  dev_op_cost cost = DEV_OP_COST_INITIALIZER;
  assert_int_equal(dev_op_estimate(op, &cost, NULL), PD_OK);
  assert_true(cost.time_ns > 0 && cost.bytes > 0);
  assert_true(dev_op_new_bytes(op) >= dev_op_output_bytes(op));
  dev_tensor *ab = dev_op_output(op, 0);
  dev_tensor_retain(ab);
  dev_op_abandon(op, PD_CANCELLED, "abandoned");
  assert_int_equal(dev_tensor_wait(ab, &st), PD_CANCELLED);
  dev_tensor_release(ab);
  for (int i = 0; i < 4; i++) {
    dev_tensor_release(out[i]);
    dev_tensor_release(mo[i]);
  }
  for (int i = 0; i < 2; i++) {
    dev_tensor_release(in[i]);
    dev_tensor_release(m[i]);
  }
  dev_tensor_release(i32);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* g(x) = AllReduce(sum, x * x) + x, on 3 devices, in one batch of two
 * calls. */
static void collective_inside(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tnode nodes[3] = {{"sq", "Mul", {"x", "x"}, 2, {{0}}, 0},
                    {"ar", "AllReduce", {"sq"}, 1, {{0}}, 1},
                    {"o", "Add", {"ar", "x"}, 2, {{0}}, 0}};
  nodes[1].attrs[0] = dev_attr_string("reduction", "sum");
  tdef t;
  tdef_make(&t, "g", k_xy, 1, nodes, 3,
            (dev_fn_output[]){{"out", "o"}, {"red", "ar"}}, 2);
  reg_ok(lib, &t, NULL);
  int64_t dims[1] = {6};
  double xv[6] = {1, 2, 3, 4, 5, 6};
  dev_tensor *x = tu_sharded(e, PD_FLOAT32, 1, dims, 0, xv);
  dev_op *ops[2];
  for (int k = 0; k < 2; k++)
    assert_int_equal(dev_fn_prepare_call(lib, "g", &x, 1, &ops[k], NULL),
                     PD_OK);
  dev_tensor *o[2] = {dev_op_output(ops[0], 0), dev_op_output(ops[1], 1)};
  dev_tensor_retain(o[0]);
  dev_tensor_retain(o[1]);
  assert_false(dev_tensor_shape(o[1])->dims[0] < 0);
  dev_op_submit_batch(e, ops, 2);
  /* red = 1+9+25, 4+16+36 on every device; out = red + the shard. */
  double red[2] = {35, 56}, got[2];
  for (int c = 0; c < 3; c++) {
    tu_read(o[1], c, got, 2);
    tu_assert_close(got, red, 2, 0, 0);
    tu_read(o[0], c, got, 2);
    double want[2] = {red[0] + xv[2 * c], red[1] + xv[2 * c + 1]};
    tu_assert_close(got, want, 2, 0, 0);
  }
  dev_tensor_release(o[0]);
  dev_tensor_release(o[1]);
  dev_tensor_release(x);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* outer(x, y) = inner(x, y) + x, inner(a, b) = twice(a) * b, twice(v) =
 * v + v: three levels inlined. */
static void nested_calls(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef tw, in, out;
  tdef_make(&tw, "twice", (dev_fn_arg[]){{"v", PD_FLOAT64}}, 1,
            (tnode[]){{"s", "Add", {"v", "v"}, 2, {{0}}, 0}}, 1,
            (dev_fn_output[]){{"o", "s"}}, 1);
  reg_ok(lib, &tw, NULL);
  tdef_make(&in, "inner", (dev_fn_arg[]){{"a", PD_FLOAT64}, {"b", PD_FLOAT64}},
            2,
            (tnode[]){{"t", "twice", {"a"}, 1, {{0}}, 0},
                      {"m", "Mul", {"t", "b"}, 2, {{0}}, 0}},
            2, (dev_fn_output[]){{"o", "m"}}, 1);
  reg_ok(lib, &in, NULL);
  tdef_make(&out, "outer", (dev_fn_arg[]){{"x", PD_FLOAT64}, {"y", PD_FLOAT64}},
            2,
            (tnode[]){{"c", "inner", {"x", "y"}, 2, {{0}}, 0},
                      {"r", "Add", {"c", "x"}, 2, {{0}}, 0}},
            2, (dev_fn_output[]){{"o", "r"}}, 1);
  dev_fn_options nf = no_fusion();
  reg_ok(lib, &out, &nf);
  int64_t dims[1] = {3};
  double xv[3] = {1, 2, 3}, yv[3] = {0.5, -1, 4};
  dev_tensor *args[2] = {tu_mirrored(e, PD_FLOAT64, 1, dims, xv),
                         tu_mirrored(e, PD_FLOAT64, 1, dims, yv)};
  dev_tensor *r;
  call(e, lib, "outer", args, 2, &r, 1);
  double got[3], want[3];
  for (int i = 0; i < 3; i++) want[i] = 2 * xv[i] * yv[i] + xv[i];
  tu_read(r, 1, got, 3);
  tu_assert_close(got, want, 3, 0, 0);
  /* The optimized graph names the inlined nodes "call/node". */
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "outer", &info, NULL), PD_OK);
  assert_non_null(info.optimized);
  bool found = false;
  for (int i = 0; i < info.optimized->num_nodes; i++)
    found |= strcmp(info.optimized->nodes[i].name, "c/t/s") == 0;
  assert_true(found);
  assert_int_equal(info.insts[0].nodes_in, 3);
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  /* fn_inline_calls on the registered graph: every level inlined. */
  fn_graph *g = fn_graph_clone(lib->fns[2]->g);
  assert_int_equal(fn_inline_calls(g, fn_lib_lookup, lib, NULL), PD_OK);
  assert_int_equal(g->n_nodes, 3);
  assert_string_equal(g->nodes[0].name, "c/t/s");
  assert_int_equal(g->nodes[0].in[0].kind, FN_REF_ARG);
  fn_graph_free(g);
  /* A call whose input has another dtype than the callee's argument. */
  tdef bad;
  tdef_make(&bad, "castme", (dev_fn_arg[]){{"x", PD_FLOAT32}}, 1,
            (tnode[]){{"c", "twice", {"x"}, 1, {{0}}, 0}}, 1,
            (dev_fn_output[]){{"o", "c"}}, 1);
  reg_ok(lib, &bad, NULL);
  dev_tensor *f32 = tu_mirrored(e, PD_FLOAT32, 1, dims, xv);
  dev_op *op;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_fn_prepare_call(lib, "castme", &f32, 1, &op, &st),
                   PD_INVALID_ARGUMENT);
  if (!strstr(st.msg,
              "function 'castme', node 'c': input 0 is float32; "
              "argument 'v' of function 'twice' is float64"))
    fail_msg("message: %s", st.msg);
  dev_tensor_release(f32);
  dev_tensor_release(r);
  dev_tensor_release(args[0]);
  dev_tensor_release(args[1]);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* p0(x) = Neg(Neg(x)), p_k(x) = p_{k-1}(p_{k-1}(x)): p_k inlines to
 * 2^(k+1) nodes (4,096 for p11), each level calling the one below twice.
 * Inlining is one pass (fn_inline_all), linear in the nodes made; p12 would
 * make 8,192 and fails with the node limit, and that failure is cached: the
 * second call fails at once with the same message, describe shows it, and
 * the miss count stays. A deadline already past stops inlining with
 * RESOURCE_EXHAUSTED naming the phase. */
static void doubling_chain(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  char names[13][8];
  tdef t;
  for (int k = 0; k <= 12; k++) {
    snprintf(names[k], sizeof names[k], "p%d", k);
    const char *op = k ? names[k - 1] : "Neg";
    tdef_make(
        &t, names[k], (dev_fn_arg[]){{"x", PD_FLOAT64}}, 1,
        (tnode[]){{"a", op, {"x"}, 1, {{0}}, 0}, {"b", op, {"a"}, 1, {{0}}, 0}},
        2, (dev_fn_output[]){{"o", "b"}}, 1);
    reg_ok(lib, &t, NULL);
  }
  int64_t dims[1] = {3};
  double xv[3] = {1.5, -2, 0.25};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 1, dims, xv);
  dev_tensor *r;
  call(e, lib, "p11", &x, 1, &r, 1);
  double got[3];
  tu_read(r, 1, got, 3);
  tu_assert_close(got, xv, 3, 0, 0); /* 4,096 negations: x itself */
  dev_tensor_release(r);
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "p11", &info, NULL), PD_OK);
  assert_int_equal(info.insts[0].nodes_in, 4096);
  assert_string_equal(info.insts[0].error, "");
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  /* p12: over the node limit, refused; the refusal is remembered. */
  dev_op *op = NULL;
  dev_status st1 = DEV_STATUS_INIT, st2 = DEV_STATUS_INIT;
  assert_int_equal(dev_fn_prepare_call(lib, "p12", &x, 1, &op, &st1),
                   PD_INVALID_ARGUMENT);
  if (!strstr(st1.msg,
              "function 'p12': inlining 'p0' (node "
              "'b/a/a/a/a/a/a/a/a/a/a/a') makes more than 4096 nodes"))
    fail_msg("message: %s", st1.msg);
  assert_int_equal(dev_fn_prepare_call(lib, "p12", &x, 1, &op, &st2),
                   PD_INVALID_ARGUMENT);
  if (strncmp(st2.msg, st1.msg, strlen(st1.msg)) != 0 ||
      !strstr(st2.msg, "(cached"))
    fail_msg("second message: %s (first: %s)", st2.msg, st1.msg);
  info = (dev_fn_info){.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "p12", &info, NULL), PD_OK);
  assert_int_equal(info.num_instantiations, 1); /* within the cap */
  assert_int_equal(info.misses, 1);
  assert_int_equal(info.hits, 1);
  assert_string_equal(info.insts[0].error, st1.msg);
  assert_null(info.optimized);
  dev_fn_def_free(info.def);
  /* A deadline already past: RESOURCE_EXHAUSTED naming the phase. */
  fn_graph *g = fn_graph_clone(fn_lib_find(lib, "p11")->g);
  fn_inline_ctx xc = {fn_lib_lookup, lib, NULL, NULL, NULL, 1e-9, 7};
  dev_status st3 = DEV_STATUS_INIT;
  assert_int_equal(fn_inline_all(g, &xc, &st3), PD_RESOURCE_EXHAUSTED);
  if (!strstr(st3.msg,
              "function 'p11': instantiation took more than "
              "instantiation_max_ms = 7 ms while inlining calls"))
    fail_msg("message: %s", st3.msg);
  fn_graph_free(g);
  dev_tensor_release(x);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* A node that cannot allocate its output at run time: the call's outputs
 * carry an error naming the function, the node and the device. */
static void run_time_failure(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 1 << 20);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  int64_t big[1] = {1 << 19}; /* 2 MiB of float32, over the 1 MiB limit */
  int64_t axis[1] = {0};
  tnode nodes[3] = {{"big", "Fill", {NULL}, 0, {{0}}, 2},
                    {"sum", "Sum", {"big"}, 1, {{0}}, 1},
                    {"o", "Add", {"sum", "x"}, 2, {{0}}, 0}};
  nodes[0].attrs[0] = dev_attr_shape("shape", 1, big);
  nodes[0].attrs[1] = dev_attr_float("value", 1);
  nodes[1].attrs[0] = dev_attr_int_list("axis", axis, 1);
  tdef t;
  tdef_make(&t, "step", k_xy, 1, nodes, 3, (dev_fn_output[]){{"out", "o"}}, 1);
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  o.passes[DEV_PASS_BUFFER_PLANNING] = DEV_TRI_OFF;
  o.passes[DEV_PASS_CONSTANT_FOLDING] = DEV_TRI_OFF;
  reg_ok(lib, &t, &o);
  double xv[1] = {2};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 0, NULL, xv);
  dev_tensor *r;
  call(e, lib, "step", &x, 1, &r, 1);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(r, &st), PD_RESOURCE_EXHAUSTED);
  if (!strstr(st.msg, "function 'step', node 'big'"))
    fail_msg("message: %s", st.msg);
  /* An input that failed upstream fails the call too, with its error. */
  dev_tensor *r2;
  call(e, lib, "step", &r, 1, &r2, 1);
  assert_int_equal(dev_tensor_wait(r2, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "node 'big'"));
  dev_tensor_release(r2);
  /* The same body with a small Fill runs: 4 * 1 + 2. */
  dev_tensor_release(r);
  dev_tensor_release(x);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* --- the cache ------------------------------------------------------------ */

static dev_tensor *vec(dev_engine *e, int n) {
  double v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t d[1] = {n};
  return tu_mirrored(e, PD_FLOAT32, 1, d, v);
}

static void one_call(dev_engine *e, dev_fn_lib *lib, dev_tensor *x,
                     double want0) {
  dev_tensor *r;
  call(e, lib, "neg", &x, 1, &r, 1);
  double got[8];
  tu_read(r, 0, got, 8);
  assert_true(got[0] == want0);
  dev_tensor_release(r);
}

static void cache_hits_misses_cap(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  tdef_make(&t, "neg", k_xy, 1, (tnode[]){{"n", "Neg", {"x"}, 1, {{0}}, 0}}, 1,
            (dev_fn_output[]){{"o", "n"}}, 1);
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  o.max_instantiations = 2;
  o.passes[DEV_PASS_CSE] = DEV_TRI_OFF;
  reg_ok(lib, &t, &o);
  dev_tensor *a = vec(e, 4), *b = vec(e, 3), *c = vec(e, 2);
  int64_t d4[1] = {4};
  double v4[4] = {1, 2, 3, 4};
  dev_tensor *as = tu_sharded(e, PD_FLOAT32, 1, d4, 0, v4); /* [2] each */
  one_call(e, lib, a, -1);  /* miss: first call */
  one_call(e, lib, a, -1);  /* hit */
  one_call(e, lib, b, -1);  /* miss: shape */
  one_call(e, lib, a, -1);  /* hit; a most recent */
  one_call(e, lib, c, -1);  /* miss: evicts b */
  one_call(e, lib, as, -1); /* miss: sharded, evicts a */
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "neg", &info, NULL), PD_OK);
  assert_int_equal(info.hits, 2);
  assert_int_equal(info.misses, 4);
  assert_int_equal(info.evictions, 2);
  assert_int_equal(info.max_instantiations, 2);
  assert_int_equal(info.num_instantiations, 2);
  assert_int_equal(info.num_miss_reasons, 4);
  assert_string_equal(info.miss_reasons[3], "first call");
  assert_string_equal(info.miss_reasons[2], "input 0 shape [3], cached [4]");
  assert_string_equal(info.miss_reasons[1], "input 0 shape [2], cached [4]");
  assert_string_equal(info.miss_reasons[0],
                      "input 0 is sharded (not mirrored), cached mirrored");
  assert_string_equal(info.insts[0].signature, "(float32[2] sharded)");
  assert_string_equal(info.insts[1].signature, "(float32[2])");
  assert_int_equal(info.insts[1].calls, 1);
  /* The pass switched off for this function shows -1 and is in force OFF. */
  assert_int_equal(info.insts[0].pass_changes[DEV_PASS_CSE], -1);
  assert_int_equal(info.passes_in_force[DEV_PASS_CSE], DEV_TRI_OFF);
  assert_int_equal(info.passes_in_force[DEV_PASS_PRUNING], DEV_TRI_ON);
  assert_true(info.insts[0].pass_changes[DEV_PASS_PRUNING] >= 0);
  assert_string_equal(info.def->name, "neg");
  assert_int_equal(info.optimized->nodes[0].num_outputs_info, 1);
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  /* An evicted shape comes back as a miss, explained against the latest. */
  one_call(e, lib, b, -1);
  assert_int_equal(dev_fn_describe(lib, "neg", &info, NULL), PD_OK);
  assert_string_equal(info.miss_reasons[0],
                      "input 0 is mirrored, cached sharded (not mirrored)");
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  assert_int_equal(dev_fn_describe(lib, "zz", &info, NULL), PD_NOT_FOUND);
  dev_tensor_release(a);
  dev_tensor_release(b);
  dev_tensor_release(c);
  dev_tensor_release(as);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* A call still queued (device 0 held) when its library is destroyed runs
 * to the right values: it holds its instantiation. */
static void library_freed_while_queued(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tnode nodes[2] = {{"ar", "AllReduce", {"x"}, 1, {{0}}, 1},
                    {"m", "Mul", {"ar", "x"}, 2, {{0}}, 0}};
  nodes[0].attrs[0] = dev_attr_string("reduction", "max");
  tdef t;
  tdef_make(&t, "f", k_xy, 1, nodes, 2, (dev_fn_output[]){{"o", "m"}}, 1);
  reg_ok(lib, &t, NULL);
  int64_t dims[1] = {4};
  double xv[4] = {1, -2, 3, 4};
  dev_tensor *x = tu_sharded(e, PD_FLOAT32, 1, dims, 0, xv);
  dev_engine_test_hold(e, 0, true);
  dev_tensor *r;
  call(e, lib, "f", &x, 1, &r, 1);
  dev_fn_lib_destroy(lib);
  dev_engine_test_hold(e, 0, false);
  /* max over devices: [3, 4]; times the shard. */
  double got[2];
  tu_read(r, 0, got, 2);
  tu_assert_close(got, ((double[]){3, -8}), 2, 0, 0);
  tu_read(r, 1, got, 2);
  tu_assert_close(got, ((double[]){9, 16}), 2, 0, 0);
  dev_tensor_release(r);
  dev_tensor_release(x);
  dev_engine_destroy(e);
}

/* --- external passes and the log ------------------------------------------ */

typedef struct logbuf {
  char text[4096];
} logbuf;

static void log_to(void *arg, dev_fn_log_level level, const char *fn,
                   const char *what) {
  (void)level;
  logbuf *l = arg;
  size_t n = strlen(l->text);
  snprintf(l->text + n, sizeof l->text - n, "[%s] %s\n", fn, what);
}

/* The pass's own copy of a definition: the input's arrays, node ops
 * rewritten per `mode` (0: Mul(a, a) -> Square(a); 1: output renamed). */
typedef struct xout {
  dev_fn_def def;
  dev_fn_node nodes[16];
  dev_fn_output outs[4];
} xout;

static pd_code x_run(void *arg, const dev_fn_def *in, const dev_tristate *p,
                     dev_fn_def **out, bool *changed, dev_status *st) {
  int mode = *(int *)arg;
  (void)p;
  if (mode == 2) return dev_error(st, PD_INTERNAL, "the plugin gave up");
  assert_true(in->num_nodes <= 16);
  xout *x = calloc(1, sizeof *x);
  x->def = *in;
  memcpy(x->nodes, in->nodes, sizeof *in->nodes * (size_t)in->num_nodes);
  memcpy(x->outs, in->outputs, sizeof *in->outputs * (size_t)in->num_outputs);
  x->def.nodes = x->nodes;
  x->def.outputs = x->outs;
  *changed = false;
  for (int i = 0; mode == 0 && i < in->num_nodes; i++) {
    dev_fn_node *n = &x->nodes[i];
    if (strcmp(n->op, "Mul") == 0 && n->num_inputs == 2 &&
        strcmp(n->inputs[0], n->inputs[1]) == 0) {
      assert_int_equal(n->num_outputs_info, 1); /* inference travels */
      n->op = "Square";
      n->num_inputs = 1;
      static const char *const origin[1] = {"sq"};
      n->origins = origin;
      n->num_origins = 1;
      *changed = true;
    }
  }
  if (mode == 1) {
    x->outs[0].name = "renamed";
    *changed = true;
  }
  for (int i = 0; mode == 3 && i < in->num_nodes; i++)
    if (strcmp(x->nodes[i].op, "Neg") == 0) { /* [3] -> a scalar */
      x->nodes[i].op = "Sum";
      *changed = true;
    }
  if (mode == 4) {
    x->def.name = "other";
    *changed = true;
  }
  if (mode == 5) {
    static const char *const evil[1] = {"evil\n\x1b[31mred\xff"};
    x->nodes[in->num_nodes - 1].origins = evil;
    x->nodes[in->num_nodes - 1].num_origins = 1;
    *changed = true;
  }
  *out = &x->def;
  return PD_OK;
}

static void x_free(void *arg, dev_fn_def *out) {
  (void)arg;
  free(out);
}

static void external_passes(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int modes[3] = {0, 1, 2};
  dev_fn_external_pass xp[3];
  const dev_fn_external_pass *list[3];
  const char *names[3] = {"test:square", "test:rename", "test:fails"};
  for (int k = 0; k < 3; k++) {
    xp[k] = (dev_fn_external_pass){sizeof xp[k], names[k], &modes[k], x_run,
                                   x_free};
    list[k] = &xp[k];
  }
  logbuf lb = {{0}};
  dev_fn_config cfg = DEV_FN_CONFIG_INITIALIZER;
  cfg.external = list;
  cfg.num_external = 3;
  cfg.log = log_to;
  cfg.log_arg = &lb;
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, &cfg, &lib, NULL), PD_OK);
  tdef t;
  tdef_make(&t, "sq", k_xy, 1,
            (tnode[]){{"sq", "Mul", {"x", "x"}, 2, {{0}}, 0},
                      {"n", "Neg", {"sq"}, 1, {{0}}, 0}},
            2, (dev_fn_output[]){{"o", "n"}}, 1);
  dev_fn_options nf = no_fusion();
  reg_ok(lib, &t, &nf);
  int64_t d[1] = {3};
  double xv[3] = {1, -2, 3};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 1, d, xv), *r;
  call(e, lib, "sq", &x, 1, &r, 1);
  double got[3];
  tu_read(r, 1, got, 3);
  tu_assert_close(got, ((double[]){-1, -4, -9}), 3, 0, 0);
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "sq", &info, NULL), PD_OK);
  assert_int_equal(info.insts[0].external_changed, 1);
  bool square = false;
  for (int i = 0; i < info.optimized->num_nodes; i++)
    square |= strcmp(info.optimized->nodes[i].op, "Square") == 0;
  assert_true(square);
  assert_string_equal(info.optimized->outputs[0].name, "o");
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  if (!strstr(lb.text, "[sq] cache miss: first call") ||
      !strstr(lb.text,
              "external pass 'test:rename' refused: output 0 is "
              "'renamed'") ||
      !strstr(lb.text,
              "external pass 'test:fails' refused: the plugin gave "
              "up"))
    fail_msg("log:\n%s", lb.text);
  dev_tensor_release(r);
  dev_tensor_release(x);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* Results an external pass may not give: an output of another shape (Neg
 * rewritten to Sum: [3] -> []), the function renamed, an origin that is
 * not a name (not UTF-8, control characters). Each is refused and logged
 * saying why, and the call runs the graph as it was. */
static void external_refused(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int modes[3] = {3, 4, 5};
  dev_fn_external_pass xp[3];
  const dev_fn_external_pass *list[3];
  const char *names[3] = {"test:neg2sum", "test:name", "test:origins"};
  for (int k = 0; k < 3; k++) {
    xp[k] = (dev_fn_external_pass){sizeof xp[k], names[k], &modes[k], x_run,
                                   x_free};
    list[k] = &xp[k];
  }
  logbuf lb = {{0}};
  dev_fn_config cfg = DEV_FN_CONFIG_INITIALIZER;
  cfg.external = list;
  cfg.num_external = 3;
  cfg.log = log_to;
  cfg.log_arg = &lb;
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, &cfg, &lib, NULL), PD_OK);
  tdef t;
  tdef_make(&t, "ng", k_xy, 1,
            (tnode[]){{"a", "Exp", {"x"}, 1, {{0}}, 0},
                      {"n", "Neg", {"a"}, 1, {{0}}, 0}},
            2, (dev_fn_output[]){{"o", "n"}}, 1);
  dev_fn_options nf = no_fusion();
  reg_ok(lib, &t, &nf);
  int64_t d[1] = {3};
  double xv[3] = {0, 1, -2};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 1, d, xv), *r;
  call(e, lib, "ng", &x, 1, &r, 1);
  assert_int_equal(dev_tensor_component_shape(r, 0)->rank, 1);
  assert_int_equal(dev_tensor_component_shape(r, 0)->dims[0], 3);
  double got[3], want[3];
  for (int i = 0; i < 3; i++) want[i] = -exp(xv[i]);
  for (int c = 0; c < 2; c++) {
    assert_int_equal(tu_read(r, c, got, 3), 3);
    tu_assert_close(got, want, 3, 1e-6, 1e-6);
  }
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "ng", &info, NULL), PD_OK);
  assert_int_equal(info.insts[0].external_changed, 0);
  assert_string_equal(info.optimized->name, "ng");
  for (int i = 0; i < info.optimized->num_nodes; i++) {
    assert_string_not_equal(info.optimized->nodes[i].op, "Sum");
    assert_int_equal(info.optimized->nodes[i].num_origins, 0);
  }
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  if (!strstr(lb.text,
              "external pass 'test:neg2sum' refused: output 0 ('o') has "
              "shape [] on device 0; expected [3], the function's") ||
      !strstr(lb.text,
              "external pass 'test:name' refused: the graph is named "
              "'other'; expected the function's name 'ng'") ||
      !strstr(lb.text,
              "external pass 'test:origins' refused: function 'ng', node "
              "'n': origin 0 'evil\\x0A\\x1B[31mred\\xFF' is not a node "
              "name"))
    fail_msg("log:\n%s", lb.text);
  dev_tensor_release(r);
  dev_tensor_release(x);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* Every origin of every node of `d` (or, without origins, its name) is
 * one of names[0..n). */
static void origins_within(const dev_fn_def *d, const char *const *names,
                           int n) {
  for (int i = 0; i < d->num_nodes; i++) {
    const dev_fn_node *nd = &d->nodes[i];
    if (strcmp(nd->op, "_Const") == 0) continue;
    int m = nd->num_origins ? nd->num_origins : 1;
    for (int k = 0; k < m; k++) {
      const char *o = nd->num_origins ? nd->origins[k] : nd->name;
      bool found = false;
      for (int j = 0; j < n && !found; j++) found = strcmp(o, names[j]) == 0;
      if (!found)
        fail_msg("node '%s' (%s): origin '%s' was never registered", nd->name,
                 nd->op, o);
    }
  }
}

/* Nodes made by passes and by gradient expansion carry the origins of what
 * they came from, so origins only ever name registered nodes: a fused
 * MatMul -> BiasAdd -> Relu names mm, ba and r (not a made-up "r_1"); a
 * backward node names the Gradients node and the forward node whose VJP
 * made it. */
static void origins_name_registered_nodes(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  static const dev_fn_arg k_xwb[3] = {
      {"x", PD_FLOAT32}, {"w", PD_FLOAT32}, {"b", PD_FLOAT32}};
  tdef t;
  tdef_make(&t, "dense", k_xwb, 3,
            (tnode[]){{"mm", "MatMul", {"x", "w"}, 2, {{0}}, 0},
                      {"ba", "BiasAdd", {"mm", "b"}, 2, {{0}}, 0},
                      {"r", "Relu", {"ba"}, 1, {{0}}, 0},
                      {"s", "Sum", {"r"}, 1, {{0}}, 0},
                      {"g", "Gradients", {"s", "x", "w"}, 3, {{0}}, 0}},
            5, (dev_fn_output[]){{"y", "r"}, {"dx", "g"}, {"dw", "g:1"}}, 3);
  reg_ok(lib, &t, NULL);
  int64_t dx[2] = {2, 3}, dw[2] = {3, 2}, db[1] = {2};
  double xv[6] = {1, -2, 0.5, 3, 1, -1}, wv[6] = {0.5, -1, 2, 0.25, -1, 1},
         bv[2] = {0.1, -0.2};
  dev_tensor *in[3] = {tu_mirrored(e, PD_FLOAT32, 2, dx, xv),
                       tu_mirrored(e, PD_FLOAT32, 2, dw, wv),
                       tu_mirrored(e, PD_FLOAT32, 1, db, bv)};
  dev_tensor *out[3];
  call(e, lib, "dense", in, 3, out, 3);
  /* The values: y = relu(x w + b); dy/dx = mask . w^T, dy/dw = x^T . mask */
  double y[4], mask[4], want_dx[6] = {0}, want_dw[6] = {0}, got[6];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      double v = bv[j];
      for (int k = 0; k < 3; k++) v += xv[i * 3 + k] * wv[k * 2 + j];
      y[i * 2 + j] = v > 0 ? v : 0;
      mask[i * 2 + j] = v > 0;
    }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 3; k++)
      for (int j = 0; j < 2; j++) {
        want_dx[i * 3 + k] += mask[i * 2 + j] * wv[k * 2 + j];
        want_dw[k * 2 + j] += xv[i * 3 + k] * mask[i * 2 + j];
      }
  tu_read(out[0], 1, got, 4);
  tu_assert_close(got, y, 4, 1e-6, 1e-6);
  tu_read(out[1], 1, got, 6);
  tu_assert_close(got, want_dx, 6, 1e-6, 1e-6);
  tu_read(out[2], 1, got, 6);
  tu_assert_close(got, want_dw, 6, 1e-6, 1e-6);
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "dense", &info, NULL), PD_OK);
  const char *const registered[5] = {"mm", "ba", "r", "s", "g"};
  origins_within(info.optimized, registered, 5);
  /* Something was made: a fused node, and backward nodes named after g. */
  bool fused = false, backward = false;
  for (int i = 0; i < info.optimized->num_nodes; i++) {
    const dev_fn_node *nd = &info.optimized->nodes[i];
    fused |= nd->num_origins > 1 && strcmp(nd->name, "r") == 0;
    backward |= strncmp(nd->name, "g/", 2) == 0 && nd->num_origins >= 1;
  }
  assert_true(backward);
  (void)fused; /* fusion may fold r into the backward mask: not asserted */
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  /* Every pass off: the backward nodes alone carry g and their forward
   * node. */
  dev_fn_options off = DEV_FN_OPTIONS_INITIALIZER;
  for (int p = 0; p < DEV_PASS_COUNT; p++) off.passes[p] = DEV_TRI_OFF;
  t.def.name = "dense_raw";
  reg_ok(lib, &t, &off);
  dev_tensor *out2[3];
  call(e, lib, "dense_raw", in, 3, out2, 3);
  tu_read(out2[2], 0, got, 6);
  tu_assert_close(got, want_dw, 6, 1e-6, 1e-6);
  assert_int_equal(dev_fn_describe(lib, "dense_raw", &info, NULL), PD_OK);
  origins_within(info.optimized, registered, 5);
  int with_fwd = 0;
  for (int i = 0; i < info.optimized->num_nodes; i++) {
    const dev_fn_node *nd = &info.optimized->nodes[i];
    if (strncmp(nd->name, "g/", 2) != 0) continue;
    assert_true(nd->num_origins >= 1);
    assert_string_equal(nd->origins[0], "g");
    with_fwd += nd->num_origins == 2;
  }
  assert_true(with_fwd >= 3); /* the VJPs of Sum, Relu, BiasAdd, MatMul */
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  for (int i = 0; i < 3; i++) {
    dev_tensor_release(out[i]);
    dev_tensor_release(out2[i]);
    dev_tensor_release(in[i]);
  }
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* The executor with a buffer plan (passes_buffers.c's shape of one): a
 * plan with every intermediate at its own offset in one arena, put on the
 * cached instantiation; the next call (a hit) runs from the arena. */
static void planned_arena(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  tdef_make(&t, "chain", k_xy, 1,
            (tnode[]){{"a", "Mul", {"x", "x"}, 2, {{0}}, 0},
                      {"b", "Add", {"a", "x"}, 2, {{0}}, 0},
                      {"r", "Reshape", {"b"}, 1, {{0}}, 1},
                      {"c", "Neg", {"r"}, 1, {{0}}, 0}},
            4, (dev_fn_output[]){{"o", "c"}, {"mid", "b"}}, 2);
  int64_t shp[1] = {4};
  t.tn[2].attrs[0] = dev_attr_int_list("shape", shp, 1);
  dev_fn_options nf = no_fusion();
  reg_ok(lib, &t, &nf);
  int64_t d[1] = {4};
  double xv[4] = {1, 2, -3, 0.5}, want[4], mid[4];
  for (int i = 0; i < 4; i++) {
    mid[i] = xv[i] * xv[i] + xv[i];
    want[i] = -mid[i];
  }
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 1, d, xv), *r[2];
  call(e, lib, "chain", &x, 1, r, 2);
  dev_tensor_release(r[0]);
  dev_tensor_release(r[1]);
  fn_inst *inst = lib->fns[0]->insts[0];
  const fn_graph *g = inst->g;
  fn_buffer_plan_free(&inst->plan);
  size_t n = (size_t)g->n_nodes * FN_MAX_NODE_OUTPUTS * (size_t)g->n_dev;
  inst->plan.n_dev = g->n_dev;
  inst->plan.offset = malloc(n * sizeof(uint64_t));
  inst->plan.arena_bytes = calloc((size_t)g->n_dev, sizeof(uint64_t));
  memset(inst->plan.offset, 0xff, n * sizeof(uint64_t));
  uint64_t off = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    bool out = false;
    for (int o = 0; o < g->n_outputs; o++)
      out |= fn_ref_eq(g->outputs[o], fn_node_ref(i, 0));
    if (out || (g->nodes[i].def->flags & DEV_OP_ALIASES_INPUT)) continue;
    for (int dv = 0; dv < g->n_dev; dv++)
      inst->plan.offset[(size_t)(i * FN_MAX_NODE_OUTPUTS) * 2 + dv] = off;
    off += FN_ARENA_ALIGN;
  }
  assert_true(off > 0); /* "a" is in the arena */
  for (int dv = 0; dv < g->n_dev; dv++) inst->plan.arena_bytes[dv] = off;
  inst->planned = true;
  inst->info.arena_bytes = off;
  inst->transient_bytes = fn_transient_bytes(inst);
  dev_op *op;
  assert_int_equal(dev_fn_prepare_call(lib, "chain", &x, 1, &op, NULL), PD_OK);
  /* The arena on each device; nothing else is allocated ("b" is an output,
   * "r" its alias). */
  assert_int_equal(dev_op_new_bytes(op), dev_op_output_bytes(op) + 2 * off);
  r[0] = dev_op_output(op, 0);
  r[1] = dev_op_output(op, 1);
  dev_tensor_retain(r[0]);
  dev_tensor_retain(r[1]);
  dev_op_submit(e, op);
  double got[4];
  for (int c = 0; c < 2; c++) {
    tu_read(r[0], c, got, 4);
    tu_assert_close(got, want, 4, 0, 0);
    tu_read(r[1], c, got, 4);
    tu_assert_close(got, mid, 4, 0, 0);
  }
  dev_tensor_release(r[0]);
  dev_tensor_release(r[1]);
  dev_tensor_release(x);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* --- a fenced CPU backend with capture hooks --------------------------------
 * Fences that are done at once, and a capture that records kernels and
 * copies instead of running them, replayed by graph_launch: the CUDA graph
 * path of run.c on the CPU. */

enum { CG_MAX_REC = 64, CG_MAX_IO = 8 };
typedef struct cg_rec {
  dev_kernel_fn fn; /* NULL: a copy */
  dev_kernel_ctx ctx;
  pd_dtype in_dt[CG_MAX_IO], out_dt[CG_MAX_IO];
  dev_shape in_sh[CG_MAX_IO], out_sh[CG_MAX_IO];
  const void *in_p[CG_MAX_IO];
  void *out_p[CG_MAX_IO];
  int out_alias[CG_MAX_IO];
  void *dst;
  const void *src;
  size_t bytes;
} cg_rec;
typedef struct cg_graph {
  cg_rec r[CG_MAX_REC];
  int n;
} cg_graph;

static struct {
  pd_code (*run_kernel)(dev_backend *, dev_kernel_fn, dev_kernel_ctx *,
                        dev_status *);
  pd_code (*copy_d2d)(dev_backend *, int, void *, int, const void *, size_t,
                      dev_status *);
  cg_graph *capturing[PD_MAX_DEVICES];
  atomic_int captures, launches;
} CG;

static pd_code cg_run_kernel(dev_backend *b, dev_kernel_fn fn,
                             dev_kernel_ctx *c, dev_status *st) {
  cg_graph *g = CG.capturing[c->device];
  if (!g) return CG.run_kernel(b, fn, c, st);
  if (g->n == CG_MAX_REC || c->num_inputs > CG_MAX_IO ||
      c->num_outputs > CG_MAX_IO)
    return dev_error(st, PD_UNIMPLEMENTED, "too much to capture");
  cg_rec *r = &g->r[g->n++];
  r->fn = fn;
  r->ctx = *c;
  for (int i = 0; i < c->num_inputs; i++) {
    r->in_dt[i] = c->in_dtype[i];
    r->in_sh[i] = c->in_shape[i];
    r->in_p[i] = c->in_data[i];
  }
  for (int i = 0; i < c->num_outputs; i++) {
    r->out_dt[i] = c->out_dtype[i];
    r->out_sh[i] = c->out_shape[i];
    r->out_p[i] = c->out_data[i];
    r->out_alias[i] = -1;
  }
  r->ctx.in_dtype = r->in_dt;
  r->ctx.in_shape = r->in_sh;
  r->ctx.in_data = r->in_p;
  r->ctx.out_dtype = r->out_dt;
  r->ctx.out_shape = r->out_sh;
  r->ctx.out_data = r->out_p;
  r->ctx.out_alias = r->out_alias;
  r->ctx.heartbeat = NULL;
  return PD_OK;
}

static pd_code cg_copy(dev_backend *b, int dd, void *dst, int sd,
                       const void *src, size_t bytes, dev_status *st) {
  cg_graph *g = CG.capturing[dd];
  if (!g) return CG.copy_d2d(b, dd, dst, sd, src, bytes, st);
  if (g->n == CG_MAX_REC)
    return dev_error(st, PD_UNIMPLEMENTED, "too much to capture");
  g->r[g->n++] = (cg_rec){.dst = dst, .src = src, .bytes = bytes};
  return PD_OK;
}

static pd_code cg_begin(dev_backend *b, int d, dev_status *st) {
  (void)b;
  (void)st;
  CG.capturing[d] = calloc(1, sizeof(cg_graph));
  return PD_OK;
}

static pd_code cg_end(dev_backend *b, int d, void **graph, dev_status *st) {
  (void)b;
  (void)st;
  *graph = CG.capturing[d];
  CG.capturing[d] = NULL;
  atomic_fetch_add(&CG.captures, 1);
  return PD_OK;
}

static pd_code cg_launch(dev_backend *b, int d, void *graph, dev_status *st) {
  (void)d;
  cg_graph *g = graph;
  atomic_fetch_add(&CG.launches, 1);
  for (int i = 0; i < g->n; i++) {
    cg_rec *r = &g->r[i];
    pd_code rc = r->fn ? CG.run_kernel(b, r->fn, &r->ctx, st)
                       : CG.copy_d2d(b, d, r->dst, d, r->src, r->bytes, st);
    if (rc != PD_OK) return rc;
  }
  return PD_OK;
}

static void cg_destroy(dev_backend *b, int d, void *graph) {
  (void)b;
  (void)d;
  free(graph);
}

static int cg_fence_token;
static pd_code cg_record(dev_backend *b, int d, void **f, dev_status *st) {
  (void)b;
  (void)d;
  (void)st;
  *f = &cg_fence_token;
  return PD_OK;
}
static pd_code cg_wait(dev_backend *b, int d, void *f, dev_status *st) {
  (void)b;
  (void)d;
  (void)f;
  (void)st;
  return PD_OK;
}
static void cg_release(dev_backend *b, int d, void *f) {
  (void)b;
  (void)d;
  (void)f;
}

static dev_engine *capture_engine(int n) {
  dev_cpu_config cc = DEV_CPU_CONFIG_INITIALIZER;
  cc.num_devices = n;
  dev_backend *b = NULL;
  assert_int_equal(dev_cpu_backend_create(&cc, &b, NULL), PD_OK);
  assert_null(b->capture_begin); /* the CPU backend has none */
  CG.run_kernel = b->run_kernel;
  CG.copy_d2d = b->copy_d2d;
  atomic_store(&CG.captures, 0);
  atomic_store(&CG.launches, 0);
  b->run_kernel = cg_run_kernel;
  b->copy_d2d = cg_copy;
  b->fence_record = cg_record;
  b->fence_wait = cg_wait;
  b->fence_release = cg_release;
  b->capture_begin = cg_begin;
  b->capture_end = cg_end;
  b->graph_launch = cg_launch;
  b->graph_destroy = cg_destroy;
  dev_engine *e = NULL;
  assert_int_equal(dev_engine_create_with_backend(b, &e, NULL), PD_OK);
  return e;
}

/* Captured on the first call of each device, replayed with new inputs;
 * a body with a collective runs on the stream. */
static void cuda_graph_replay(void **state) {
  (void)state;
  dev_engine *e = capture_engine(2);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  tdef_make(&t, "fma", k_xy, 2,
            (tnode[]){{"m", "Mul", {"x", "y"}, 2, {{0}}, 0},
                      {"a", "Add", {"m", "x"}, 2, {{0}}, 0},
                      {"n", "Neg", {"a"}, 1, {{0}}, 0}},
            3, (dev_fn_output[]){{"o", "n"}, {"x", "x"}}, 2);
  reg_ok(lib, &t, NULL);
  int64_t d[1] = {3};
  for (int k = 0; k < 3; k++) {
    double xv[3] = {1.0 + k, 2, -3}, yv[3] = {4, 0.5 * k, 2};
    dev_tensor *in[2] = {tu_mirrored(e, PD_FLOAT32, 1, d, xv),
                         tu_mirrored(e, PD_FLOAT32, 1, d, yv)};
    dev_tensor *r[2];
    call(e, lib, "fma", in, 2, r, 2);
    double got[3], want[3];
    for (int i = 0; i < 3; i++) want[i] = -(xv[i] * yv[i] + xv[i]);
    for (int c = 0; c < 2; c++) {
      tu_read(r[0], c, got, 3);
      tu_assert_close(got, want, 3, 0, 0);
      tu_read(r[1], c, got, 3);
      tu_assert_close(got, xv, 3, 0, 0);
    }
    for (int i = 0; i < 2; i++) {
      dev_tensor_release(r[i]);
      dev_tensor_release(in[i]);
    }
  }
  assert_int_equal(atomic_load(&CG.captures), 2);
  assert_int_equal(atomic_load(&CG.launches), 6);
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "fma", &info, NULL), PD_OK);
  assert_true(info.insts[0].cuda_graph);
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);

  /* With a collective: stream execution, holds kept, values right. */
  tnode cn[2] = {{"ar", "AllReduce", {"x"}, 1, {{0}}, 1},
                 {"n", "Neg", {"ar"}, 1, {{0}}, 0}};
  cn[0].attrs[0] = dev_attr_string("reduction", "sum");
  tdef_make(&t, "coll", k_xy, 1, cn, 2, (dev_fn_output[]){{"o", "n"}}, 1);
  reg_ok(lib, &t, NULL);
  int64_t d4[1] = {4};
  double xv[4] = {1, 2, 3, 4};
  dev_tensor *x = tu_sharded(e, PD_FLOAT32, 1, d4, 0, xv), *r;
  call(e, lib, "coll", &x, 1, &r, 1);
  double got[2];
  tu_read(r, 1, got, 2);
  tu_assert_close(got, ((double[]){-4, -6}), 2, 0, 0);
  assert_int_equal(atomic_load(&CG.captures), 2);
  dev_tensor_release(r);
  dev_tensor_release(x);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* A graph constant (as constant folding makes them): uploaded once per
 * instantiation, read by a node, and carried through describe as a
 * "_Const" node. */
static void captured_constants(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  tdef_make(&t, "k", k_xy, 1, (tnode[]){{"a", "Add", {"x", "x"}, 2, {{0}}, 0}},
            1, (dev_fn_output[]){{"o", "a"}, {"c", "x"}}, 2);
  reg_ok(lib, &t, NULL);
  fn_graph *g = lib->fns[0]->g; /* what folding would have left */
  float cv[3] = {10, 20, 30};
  dev_shape cs = {1, {3}};
  int c = -1;
  assert_int_equal(
      fn_graph_add_const(g, PD_FLOAT32, &cs, cv, sizeof cv, &c, NULL), PD_OK);
  g->nodes[0].in[1] = fn_const_ref(c);
  g->outputs[1] = fn_const_ref(c);
  int64_t d[1] = {3};
  double xv[3] = {1, 2, 3}, got[3];
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 1, d, xv), *r[2];
  for (int k = 0; k < 2; k++) {
    call(e, lib, "k", &x, 1, r, 2);
    for (int dv = 0; dv < 2; dv++) {
      tu_read(r[0], dv, got, 3);
      tu_assert_close(got, ((double[]){11, 22, 33}), 3, 0, 0);
      tu_read(r[1], dv, got, 3);
      tu_assert_close(got, ((double[]){10, 20, 30}), 3, 0, 0);
    }
    dev_tensor_release(r[0]);
    dev_tensor_release(r[1]);
  }
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "k", &info, NULL), PD_OK);
  assert_int_equal(info.hits, 1);
  const dev_fn_def *od = info.optimized;
  assert_string_equal(od->nodes[0].op, "_Const");
  assert_int_equal(od->nodes[0].outputs_info[0].shape.dims[0], 3);
  assert_string_equal(od->nodes[1].inputs[1], od->nodes[0].name);
  /* The definition converts back over the graph it came from. */
  fn_graph *back = NULL;
  assert_int_equal(
      fn_graph_from_def(od, lib->fns[0]->insts[0]->g, NULL, NULL, &back, NULL),
      PD_OK);
  assert_int_equal(back->n_consts, 1);
  assert_int_equal(back->n_nodes, 1);
  assert_int_equal(back->nodes[0].in[1].kind, FN_REF_CONST);
  fn_graph_free(back);
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  dev_tensor_release(x);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

static void pass_names(void **state) {
  (void)state;
  for (int p = 0; p < DEV_PASS_COUNT; p++)
    assert_int_equal(dev_fn_pass_from_name(dev_fn_pass_name(p)), p);
  assert_string_equal(dev_fn_pass_name(DEV_PASS_CONSTANT_FOLDING),
                      "constant_folding");
  assert_null(dev_fn_pass_name(DEV_PASS_COUNT));
  assert_int_equal(dev_fn_pass_from_name("nope"), -1);
  dev_engine *e = tu_engine(1, 0);
  dev_fn_lib *lib = NULL;
  dev_fn_config c = DEV_FN_CONFIG_INITIALIZER;
  c.max_instantiations = DEV_FN_MAX_INST_CAP + 1;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_fn_lib_create(e, &c, &lib, &st), PD_INVALID_ARGUMENT);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(registration_errors),
      cmocka_unit_test(reregistration),
      cmocka_unit_test(reregistration_equivalent),
      cmocka_unit_test(call_values),
      cmocka_unit_test(collective_inside),
      cmocka_unit_test(nested_calls),
      cmocka_unit_test(doubling_chain),
      cmocka_unit_test(run_time_failure),
      cmocka_unit_test(cache_hits_misses_cap),
      cmocka_unit_test(library_freed_while_queued),
      cmocka_unit_test(external_passes),
      cmocka_unit_test(external_refused),
      cmocka_unit_test(origins_name_registered_nodes),
      cmocka_unit_test(planned_arena),
      cmocka_unit_test(cuda_graph_replay),
      cmocka_unit_test(captured_constants),
      cmocka_unit_test(pass_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
