/* The daemon's optimizer plugin loader (server/optimizer.c) with the test
 * plugins of tests/plugins/ and the example of examples/optimizer_plugin/:
 * each refusal names the file and both values (struct sizes, major
 * versions); the merge of the built-in passes' switches (OFF wins over ON,
 * ON over DEFAULT) and the logged table and disagreement warning; the
 * external pass on a small graph (Mul(x, x) becomes Square(x) with its
 * origins, other nodes untouched; a plugin that leaves the graph alone is
 * "unchanged"; a failing plugin's error and message come back; garbage
 * output is an error; an invalid graph comes back parsed for the engine to
 * refuse). The graphs' serialization is convert_fn.c's, tested by
 * test_srv_fn_convert.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "optimizer.h"
#include "paradev/optimizer.h"

static const dev_tristate none_set[DEV_PASS_COUNT] = {DEV_TRI_DEFAULT};

/* Loads `paths`, capturing what the loader logs into `log` (len bytes). */
static pd_code load_logged(const char *const *paths, int n,
                           const dev_tristate *daemon,
                           const dev_fn_external_pass *const **passes, int *np,
                           dev_tristate *merged, dev_status *st, char *log,
                           size_t len) {
  fflush(stderr);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  int saved = dup(2);
  dup2(fileno(tmp), 2);
  pd_code rc = srv_optimizer_load(paths, n, daemon, passes, np, merged, st);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  size_t got = fread(log, 1, len - 1, tmp);
  log[got] = 0;
  fclose(tmp);
  fputs(log, stderr); /* still visible in the test's output */
  return rc;
}

static pd_code load_one(const char *path, dev_status *st) {
  const dev_fn_external_pass *const *passes = NULL;
  int np = -1;
  dev_tristate merged[DEV_PASS_COUNT];
  return srv_optimizer_load(&path, 1, none_set, &passes, &np, merged, st);
}

static void test_refusals(void **state) {
  (void)state;
  dev_status st = DEV_STATUS_INIT;
  char want[128];

  assert_int_equal(load_one(PLUGIN_SMALL_STRUCT, &st), PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "libpd_test_small_struct.so"));
  assert_non_null(strstr(st.msg, "PD_Optimizer.struct_size"));
  snprintf(want, sizeof want, "is %zu; this daemon needs at least %zu",
           (size_t)PD_OPTIMIZER_STRUCT_SIZE - 8,
           (size_t)PD_OPTIMIZER_STRUCT_SIZE);
  assert_non_null(strstr(st.msg, want));

  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(load_one(PLUGIN_WRONG_MAJOR, &st), PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "libpd_test_wrong_major.so"));
  snprintf(want, sizeof want, "major version %d; this daemon's is %d",
           PD_OPTIMIZER_MAJOR + 1, PD_OPTIMIZER_MAJOR);
  assert_non_null(strstr(st.msg, want));

  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(load_one("/nonexistent/libnope.so", &st),
                   PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "/nonexistent/libnope.so: cannot load it"));

  /* A good plugin before a bad one: nothing stays loaded. */
  const char *two[2] = {PLUGIN_SQUARE, PLUGIN_WRONG_MAJOR};
  const dev_fn_external_pass *const *passes = NULL;
  int np = -1;
  dev_tristate merged[DEV_PASS_COUNT];
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(
      srv_optimizer_load(two, 2, none_set, &passes, &np, merged, &st),
      PD_FAILED_PRECONDITION);
  assert_int_equal(np, -1);
  srv_optimizer_unload();
  srv_optimizer_unload(); /* twice is fine */
}

static void test_merge(void **state) {
  (void)state;
  const char *paths[3] = {PLUGIN_CSE_OFF, PLUGIN_CSE_ON, PLUGIN_SQUARE};
  dev_tristate daemon[DEV_PASS_COUNT] = {DEV_TRI_DEFAULT};
  daemon[DEV_PASS_CONSTANT_FOLDING] = DEV_TRI_OFF;
  daemon[DEV_PASS_ARITHMETIC] = DEV_TRI_ON;
  daemon[DEV_PASS_FUSION] = DEV_TRI_ON;
  const dev_fn_external_pass *const *passes = NULL;
  int np = 0;
  dev_tristate merged[DEV_PASS_COUNT];
  dev_status st = DEV_STATUS_INIT;
  static char log[16384];
  assert_int_equal(
      load_logged(paths, 3, daemon, &passes, &np, merged, &st, log, sizeof log),
      PD_OK);
  assert_int_equal(np, 3);
  assert_string_equal(passes[0]->name, "plugin:libpd_test_cse_off.so/cse_off");
  assert_string_equal(passes[2]->name, "plugin:libpd_square.so/square");
  assert_int_equal(merged[DEV_PASS_CSE], DEV_TRI_OFF); /* off beats on */
  assert_int_equal(merged[DEV_PASS_FUSION],
                   DEV_TRI_OFF); /* plugin off, daemon on */
  assert_int_equal(merged[DEV_PASS_CONSTANT_FOLDING], DEV_TRI_OFF); /* daemon */
  assert_int_equal(merged[DEV_PASS_ARITHMETIC], DEV_TRI_ON);
  assert_int_equal(merged[DEV_PASS_PRUNING], DEV_TRI_DEFAULT);
  assert_int_equal(merged[DEV_PASS_CUDA_GRAPH], DEV_TRI_DEFAULT);
  /* The table: one header and one row per pass, then the warnings. */
  assert_non_null(strstr(log,
                         "| daemon  | plugin:libpd_test_cse_off.so/cse_off "
                         "| plugin:libpd_test_cse_on.so/cse_on "
                         "| plugin:libpd_square.so/square | in force"));
  assert_non_null(strstr(log, "cse              | default | off"));
  assert_non_null(strstr(log, "| off\n"));
  assert_non_null(strstr(log,
                         "disagree on pass cse: libpd_test_cse_off.so ask "
                         "off, libpd_test_cse_on.so ask on; off wins"));
  /* fusion: the daemon says on, one plugin off: not two plugins disagreeing */
  assert_null(strstr(log, "disagree on pass fusion"));
  srv_optimizer_unload();
}

/* x (float32); m = Mul(x, x); a = Add(m, x); outputs m and a. */
static const dev_fn_arg args[1] = {{"x", PD_FLOAT32}};
static const char *const in_xx[2] = {"x", "x:0"};
static const char *const in_mx[2] = {"m", "x"};
static const dev_fn_value_info vi[1] = {{PD_FLOAT32, {2, {3, 4}}}};

static dev_fn_def small_def(dev_fn_node *nodes, dev_fn_output *outs) {
  nodes[0] = (dev_fn_node){"m", "Mul", in_xx, 2, NULL, 0, NULL, 0, vi, 1};
  nodes[1] = (dev_fn_node){"a", "Add", in_mx, 2, NULL, 0, NULL, 0, vi, 1};
  outs[0] = (dev_fn_output){"sq", "m"};
  outs[1] = (dev_fn_output){"sum", "a:0"};
  dev_fn_def d = DEV_FN_DEF_INITIALIZER;
  d.name = "f", d.args = args, d.num_args = 1;
  d.nodes = nodes, d.num_nodes = 2, d.outputs = outs, d.num_outputs = 2;
  return d;
}

static const dev_fn_external_pass *load_pass(const char *path) {
  const dev_fn_external_pass *const *passes = NULL;
  int np = 0;
  dev_tristate merged[DEV_PASS_COUNT];
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      srv_optimizer_load(&path, 1, none_set, &passes, &np, merged, &st), PD_OK);
  assert_int_equal(np, 1);
  return passes[0];
}

static void test_square_pass(void **state) {
  (void)state;
  dev_fn_node nodes[2];
  dev_fn_output outs[2];
  dev_fn_def d = small_def(nodes, outs);
  const dev_fn_external_pass *p = load_pass(PLUGIN_SQUARE);
  dev_fn_def *out = NULL;
  bool changed = false;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(p->run(p->arg, &d, none_set, &out, &changed, &st), PD_OK);
  assert_true(changed);
  assert_int_equal(out->num_nodes, 2);
  assert_string_equal(out->nodes[0].name, "m");
  assert_string_equal(out->nodes[0].op, "Square");
  assert_int_equal(out->nodes[0].num_inputs, 1);
  assert_string_equal(out->nodes[0].inputs[0], "x");
  assert_int_equal(out->nodes[0].num_origins, 1);
  assert_string_equal(out->nodes[0].origins[0], "m");
  assert_string_equal(out->nodes[1].op, "Add"); /* left alone */
  assert_int_equal(out->nodes[1].num_origins, 0);
  assert_int_equal(out->nodes[1].num_outputs_info, 1);
  assert_int_equal(out->nodes[1].outputs_info[0].shape.dims[1], 4);
  assert_string_equal(out->outputs[1].source, "a:0");
  assert_int_equal(out->args[0].dtype, PD_FLOAT32);
  p->free_out(p->arg, out);

  /* Run again on what it made: nothing left to rewrite. */
  nodes[0].op = "Square", nodes[0].num_inputs = 1;
  out = NULL;
  changed = true;
  assert_int_equal(p->run(p->arg, &d, none_set, &out, &changed, &st), PD_OK);
  assert_false(changed);
  assert_non_null(out); /* a copy of the input */
  assert_string_equal(out->nodes[0].op, "Square");
  p->free_out(p->arg, out);
  srv_optimizer_unload();
}

static void test_failing_passes(void **state) {
  (void)state;
  dev_fn_node nodes[2];
  dev_fn_output outs[2];
  dev_fn_def d = small_def(nodes, outs);
  dev_fn_def *out = NULL;
  bool changed = false;
  dev_status st = DEV_STATUS_INIT;

  const dev_fn_external_pass *p = load_pass(PLUGIN_FAILING);
  assert_int_equal(p->run(p->arg, &d, none_set, &out, &changed, &st),
                   PD_INTERNAL);
  assert_string_equal(st.msg,
                      "optimizer plugin plugin:libpd_test_failing.so/"
                      "failing: INTERNAL: deliberate failure");
  srv_optimizer_unload();

  st = (dev_status)DEV_STATUS_INIT;
  p = load_pass(PLUGIN_GARBAGE);
  assert_int_equal(p->run(p->arg, &d, none_set, &out, &changed, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg,
                         "libpd_test_garbage.so/garbage: its output "
                         "graph: 7 bytes that do not parse"));
  srv_optimizer_unload();

  /* Parsed fine; the engine's validation refuses the dangling input. */
  st = (dev_status)DEV_STATUS_INIT;
  p = load_pass(PLUGIN_INVALID_GRAPH);
  assert_int_equal(p->run(p->arg, &d, none_set, &out, &changed, &st), PD_OK);
  assert_true(changed);
  assert_string_equal(out->nodes[0].inputs[0], "no_such_node");
  p->free_out(p->arg, out);
  srv_optimizer_unload();

  /* Leaves graphs alone. */
  p = load_pass(PLUGIN_CSE_ON);
  out = NULL;
  assert_int_equal(p->run(p->arg, &d, none_set, &out, &changed, &st), PD_OK);
  assert_false(changed);
  p->free_out(p->arg, out);
  srv_optimizer_unload();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_merge),
      cmocka_unit_test(test_square_pass),
      cmocka_unit_test(test_failing_passes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
