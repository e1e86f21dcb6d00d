/* The built-in passes of graph functions (device/fn/passes_*.c): for each
 * pass a graph built to trigger it, checked by its structure (node counts,
 * ops, attributes), by its values (tests/unit/fn_eval.c before and after,
 * against float64 references computed here), by idempotence (a second run
 * changes nothing), and graphs where it must not fire (a fetched
 * intermediate, a node used elsewhere, random ops, DeviceId, sharded
 * inputs). Buffer plans are checked pair by pair against live ranges this
 * file computes on its own. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fn_eval.h"
#include "ops/fused_int.h"
#include "testutil.h"

/* --- helpers ---------------------------------------------------------------- */

static fn_ref A(int i) { return fn_arg_ref(i); }
static fn_ref N(int i) { return fn_node_ref(i, 0); }
#define REFS(...) ((fn_ref[]){__VA_ARGS__})
#define NREFS(...) (int)(sizeof(fn_ref[]){__VA_ARGS__} / sizeof(fn_ref))

static int add(fn_graph *g, const char *name, const char *op, const fn_ref *in,
               int n_in, const dev_attr *at, int n_at) {
  const dev_op_def *def = dev_op_lookup(op);
  if (!def) fail_msg("op %s not registered", op);
  int idx = -1;
  dev_status st = DEV_STATUS_INIT;
  if (fn_graph_add_op(g, name, def, in, n_in, at, n_at, &idx, &st) != PD_OK)
    fail_msg("adding %s: %s", name, st.msg);
  return idx;
}
#define ADD(g, name, op, ...)                                                  \
  add(g, name, op, REFS(__VA_ARGS__), NREFS(__VA_ARGS__), NULL, 0)
#define ADDA(g, name, op, at, na, ...)                                         \
  add(g, name, op, REFS(__VA_ARGS__), NREFS(__VA_ARGS__), at, na)

static dev_attr ilist_attr(const char *name, const int64_t *v, int n) {
  dev_attr a = {name, {.type = DEV_ATTR_INT_LIST, .u.ilist = {v, n}}};
  return a;
}

/* A Fill node of `shape` (rank r, dims) and value v, float32. */
static int fill(fn_graph *g, const char *name, int r, const int64_t *dims,
                double v) {
  dev_attr at[2] = {{"shape", {.type = DEV_ATTR_SHAPE}},
                    {"value", {.type = DEV_ATTR_FLOAT, .u.f = v}}};
  at[0].value.u.shape.rank = r;
  for (int i = 0; i < r; i++) at[0].value.u.shape.dims[i] = dims[i];
  return add(g, name, "Fill", NULL, 0, at, 2);
}

static int konst(fn_graph *g, int r, const int64_t *dims, const float *v) {
  dev_shape s = {r, {0}};
  int64_t n = 1;
  for (int i = 0; i < r; i++) n *= s.dims[i] = dims[i];
  int idx;
  assert_int_equal(fn_graph_add_const(g, PD_FLOAT32, &s, v,
                                      sizeof(float) * (size_t)n, &idx, NULL),
                   PD_OK);
  return idx;
}

static dev_fn_config g_cfg = DEV_FN_CONFIG_INITIALIZER;

/* Runs pass p (asserting success and the invariants), then again on its
 * output (asserting it changes nothing); returns the first run's changes. */
static int run_ctx(fn_pass_fn p, fn_graph *g, const fn_pass_ctx *c) {
  int ch = -1, again = -1;
  dev_status st = DEV_STATUS_INIT;
  if (p(g, c, &ch, &st) != PD_OK) fail_msg("pass failed: %s", st.msg);
  assert_int_equal(fn_graph_check(g, &st), PD_OK);
  for (int i = 0; i < g->n_nodes; i++) assert_false(g->nodes[i].dead);
  if (p(g, c, &again, &st) != PD_OK) fail_msg("second run failed: %s", st.msg);
  assert_int_equal(again, 0); /* idempotent */
  return ch;
}

static int run(fn_pass_fn p, fn_graph *g) {
  fn_pass_ctx c = {NULL, &g_cfg, NULL, 0};
  return run_ctx(p, g, &c);
}

static int count_op(const fn_graph *g, const char *op) {
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++)
    k += !g->nodes[i].dead && g->nodes[i].kind == FN_NODE_OP &&
         strcmp(g->nodes[i].def->name, op) == 0;
  return k;
}

static int find_op(const fn_graph *g, const char *op) {
  for (int i = 0; i < g->n_nodes; i++)
    if (!g->nodes[i].dead && strcmp(g->nodes[i].def->name, op) == 0) return i;
  fail_msg("no %s node", op);
  return -1;
}

/* Output o of g on args, component c, into out (n elements). */
static void value_of(dev_engine *e, const fn_graph *g, dev_tensor **args, int o,
                     int c, double *out, int64_t n) {
  dev_tensor *outs[16] = {NULL};
  dev_status st = DEV_STATUS_INIT;
  if (fn_eval(e, g, args, outs, &st) != PD_OK) fail_msg("eval: %s", st.msg);
  assert_int_equal(tu_read(outs[o], c, out, n), n);
  for (int i = 0; i < g->n_outputs; i++) dev_tensor_release(outs[i]);
}

/* Asserts output o of g (component c) equals want[0..n) within rtol. */
static void check_value(dev_engine *e, const fn_graph *g, dev_tensor **args,
                        int o, int c, const double *want, int64_t n,
                        double rtol) {
  double *got = calloc((size_t)n, sizeof *got);
  value_of(e, g, args, o, c, got, n);
  tu_assert_close(got, want, n, rtol, 1e-6);
  free(got);
}

typedef struct fixture {
  dev_engine *e;
  dev_tensor *args[4];
  int n_args;
} fixture;

static void fixture_free(fixture *f) {
  for (int i = 0; i < f->n_args; i++) dev_tensor_release(f->args[i]);
  dev_engine_destroy(f->e);
}

/* --- pruning ---------------------------------------------------------------- */

static void pruning_removes_dead_nodes(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[1] = {3};
  double xv[3] = {1, -2, 0.5};
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 1, d, xv);
  fn_graph *g = fn_eval_graph(f.e, "prune", f.args, 1);
  int a = ADD(g, "a", "Neg", A(0));
  int b = ADD(g, "b", "Exp", A(0)); /* dead */
  ADD(g, "b2", "Mul", N(b), N(b));  /* dead, reads b */
  dev_attr red = {"reduction", {.type = DEV_ATTR_STRING, .u.s = {"sum", 3}}};
  ADDA(g, "coll", "AllReduce", &red, 1, A(0)); /* dead collective */
  int c = ADD(g, "c", "Add", N(a), A(0));
  int kept = ADD(g, "kept", "Square", A(0)); /* a second output */
  fn_eval_add_output(g, "c", N(c));
  fn_eval_add_output(g, "sq", N(kept));
  double want[3], want2[3];
  for (int i = 0; i < 3; i++) {
    want[i] = -xv[i] + xv[i];
    want2[i] = xv[i] * xv[i];
  }
  check_value(f.e, g, f.args, 0, 0, want, 3, 1e-6);
  assert_int_equal(run(fn_pass_pruning, g), 3);
  assert_int_equal(g->n_nodes, 3);
  assert_int_equal(count_op(g, "Exp") + count_op(g, "AllReduce"), 0);
  assert_string_equal(g->nodes[g->outputs[0].idx].name, "c");
  check_value(f.e, g, f.args, 0, 1, want, 3, 1e-6);
  check_value(f.e, g, f.args, 1, 0, want2, 3, 1e-6);
  fn_graph_free(g);
  fixture_free(&f);
}

/* --- CSE -------------------------------------------------------------------- */

static void cse_merges_equal_nodes(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[2] = {2, 3};
  double xv[6] = {1, 2, 3, -1, -2, 0.25};
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 2, d, xv);
  fn_graph *g = fn_eval_graph(f.e, "cse", f.args, 1);
  int e1 = ADD(g, "e1", "Exp", A(0));
  int e2 = ADD(g, "e2", "Exp", A(0));
  int s1 = ADD(g, "s1", "Add", N(e1), A(0));
  int s2 = ADD(g, "s2", "Add", N(e2), A(0)); /* equal once e2 is e1 */
  static const int64_t p10[2] = {1, 0};
  dev_attr perm = ilist_attr("perm", p10, 2);
  int t1 = ADDA(g, "t1", "Transpose", &perm, 1, N(s1));
  int t2 = ADDA(g, "t2", "Transpose", &perm, 1, N(s2)); /* list attr equal */
  static const int64_t sh_a[2] = {3, 2}, sh_b[2] = {6, 1};
  dev_attr ra = ilist_attr("shape", sh_a, 2), rb = ilist_attr("shape", sh_b, 2);
  int r1 = ADDA(g, "r1", "Reshape", &ra, 1, N(t1));
  int r2 = ADDA(g, "r2", "Reshape", &rb, 1, N(t2)); /* another shape: kept */
  int m = ADD(g, "m", "Mul", N(t1), N(t2));
  fn_eval_add_output(g, "m", N(m));
  fn_eval_add_output(g, "r1", N(r1));
  fn_eval_add_output(g, "r2", N(r2));
  double want[6]; /* m = (exp(x)+x)^T squared */
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) {
      double v = exp(xv[i * 3 + j]) + xv[i * 3 + j];
      want[j * 2 + i] = v * v;
    }
  check_value(f.e, g, f.args, 0, 0, want, 6, 2e-6);
  assert_int_equal(run(fn_pass_cse, g), 3); /* e2, s2, t2 */
  assert_int_equal(count_op(g, "Exp"), 1);
  assert_int_equal(count_op(g, "Add"), 1);
  assert_int_equal(count_op(g, "Transpose"), 1);
  assert_int_equal(count_op(g, "Reshape"), 2);
  int t = find_op(g, "Transpose");
  int mm = find_op(g, "Mul");
  assert_true(fn_ref_eq(g->nodes[mm].in[0], N(t)));
  assert_true(fn_ref_eq(g->nodes[mm].in[1], N(t)));
  check_value(f.e, g, f.args, 0, 1, want, 6, 2e-6);
  fn_graph_free(g);
  fixture_free(&f);
}

static void cse_leaves_random_and_collectives(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[1] = {4};
  double xv[4] = {1, 2, 3, 4};
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 1, d, xv);
  fn_graph *g = fn_eval_graph(f.e, "cse2", f.args, 1);
  dev_attr ra[2] = {{"shape", {.type = DEV_ATTR_SHAPE}},
                    {"seed", {.type = DEV_ATTR_INT, .u.i = 7}}};
  ra[0].value.u.shape.rank = 1;
  ra[0].value.u.shape.dims[0] = 4;
  int u1 = add(g, "u1", "RandomUniform", NULL, 0, ra, 2);
  int u2 = add(g, "u2", "RandomUniform", NULL, 0, ra, 2);
  dev_attr red = {"reduction", {.type = DEV_ATTR_STRING, .u.s = {"sum", 3}}};
  int c1 = ADDA(g, "c1", "AllReduce", &red, 1, A(0));
  int c2 = ADDA(g, "c2", "AllReduce", &red, 1, A(0));
  int s = ADD(g, "s", "Sub", N(u1), N(u2));
  int t = ADD(g, "t", "Sub", N(c1), N(c2));
  fn_eval_add_output(g, "s", N(s));
  fn_eval_add_output(g, "t", N(t));
  assert_int_equal(run(fn_pass_cse, g), 0);
  assert_int_equal(count_op(g, "RandomUniform"), 2);
  assert_int_equal(count_op(g, "AllReduce"), 2);
  double zero[4] = {0};
  check_value(f.e, g, f.args, 0, 0, zero, 4, 0); /* same seed: u1 == u2 */
  check_value(f.e, g, f.args, 1, 1, zero, 4, 0);
  fn_graph_free(g);
  fixture_free(&f);
}

/* --- constant folding ------------------------------------------------------- */

static void folding_evaluates_constants(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[1] = {2};
  double xv[2] = {10, 20};
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 1, d, xv);
  fn_graph *g = fn_eval_graph(f.e, "fold", f.args, 1);
  static const float cv[2] = {1, 2};
  int c = konst(g, 1, d, cv);
  int fl = fill(g, "three", 1, d, 3);
  int s = ADD(g, "s", "Add", fn_const_ref(c), N(fl)); /* {4, 5} */
  int q = ADD(g, "q", "Square", N(s));                /* {16, 25} */
  int m = ADD(g, "m", "Mul", A(0), N(q));             /* not folded: x */
  int z = ADD(g, "z", "OnesLike", A(0));              /* shape only: folded */
  int o = ADD(g, "o", "Add", N(m), N(z));
  int id = add(g, "id", "DeviceId", NULL, 0, NULL, 0); /* never folded */
  dev_attr cast = {"DstT", {.type = DEV_ATTR_DTYPE, .u.dtype = PD_FLOAT32}};
  int idf = ADDA(g, "idf", "Cast", &cast, 1, N(id));
  int64_t big[1] = {100000}; /* 400 kB: over the default bound */
  int bf = fill(g, "big", 1, big, 1);
  fn_eval_add_output(g, "o", N(o));
  fn_eval_add_output(g, "dev", N(idf));
  fn_eval_add_output(g, "big", N(bf));
  double want[2] = {10 * 16 + 1, 20 * 25 + 1};
  check_value(f.e, g, f.args, 0, 0, want, 2, 1e-6);
  assert_int_equal(run(fn_pass_constant_folding, g), 4); /* fl, s, q, z */
  assert_int_equal(g->n_nodes, 5); /* m, o, id, idf, big */
  assert_int_equal(count_op(g, "DeviceId"), 1);
  assert_int_equal(count_op(g, "Fill"), 1);
  int mi = find_op(g, "Mul");
  assert_int_equal(g->nodes[mi].in[1].kind, FN_REF_CONST);
  const fn_const *k = &g->consts[g->nodes[mi].in[1].idx];
  assert_true(((const float *)k->data)[0] == 16.0f);
  assert_true(((const float *)k->data)[1] == 25.0f);
  check_value(f.e, g, f.args, 0, 1, want, 2, 1e-6);
  double dev1[1] = {1};
  check_value(f.e, g, f.args, 1, 1, dev1, 1, 0); /* still per device */
  fn_graph_free(g);
  fixture_free(&f);
}

static void folding_leaves_sharded_and_stops_at_deadline(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[1] = {3};
  double xv[3] = {1, 2, 3};
  f.args[0] = tu_sharded(f.e, PD_FLOAT32, 1, d, 0, xv); /* [2] and [1] */
  fn_graph *g = fn_eval_graph(f.e, "fold2", f.args, 1);
  g->arg_not_mirrored[0] = true;
  int z = ADD(g, "z", "ZerosLike", A(0)); /* shapes differ: kept */
  int64_t d2[1] = {2};
  static const float cv[2] = {1, 2};
  int c = konst(g, 1, d2, cv);
  int n = ADD(g, "n", "Neg", fn_const_ref(c));
  int64_t d4[1] = {4};
  double yv[4] = {1, 2, 3, 4};
  f.args[1] = tu_sharded(f.e, PD_FLOAT32, 1, d4, 0, yv); /* [2] and [2] */
  f.n_args = 2;
  fn_graph *tmp = fn_eval_graph(f.e, "fold2", f.args, 2); /* arg 1's shapes */
  assert_int_equal(fn_graph_add_arg(g, "x1", PD_FLOAT32, NULL), PD_OK);
  g->arg_shape = realloc(g->arg_shape, sizeof(dev_shape) * 4);
  g->arg_not_mirrored = realloc(g->arg_not_mirrored, 2);
  memcpy(g->arg_shape, tmp->arg_shape, sizeof(dev_shape) * 4);
  g->arg_not_mirrored[1] = true;
  fn_graph_free(tmp);
  int zo = ADD(g, "zo", "ZerosLike", A(1)); /* fetched, not mirrored: kept */
  int zi = ADD(g, "zi", "OnesLike", A(1));  /* equal shapes: folded */
  int ys = ADD(g, "ys", "Add", N(zi), A(1));
  fn_eval_add_output(g, "z", N(z));
  fn_eval_add_output(g, "n", N(n));
  fn_eval_add_output(g, "zo", N(zo));
  fn_eval_add_output(g, "ys", N(ys));
  fn_graph *h = fn_graph_clone(g);
  /* A deadline already passed: nothing folded. */
  fn_pass_ctx past = {NULL, &g_cfg, NULL, 1e-9};
  assert_int_equal(run_ctx(fn_pass_constant_folding, h, &past), 0);
  assert_int_equal(h->n_nodes, 5);
  fn_graph_free(h);
  /* A bound below the value's 8 bytes: nothing folded either. */
  dev_fn_config small = DEV_FN_CONFIG_INITIALIZER;
  small.fold_max_bytes = 4;
  fn_pass_ctx sc = {NULL, &small, NULL, 0};
  h = fn_graph_clone(g);
  assert_int_equal(run_ctx(fn_pass_constant_folding, h, &sc), 0);
  fn_graph_free(h);
  assert_int_equal(run(fn_pass_constant_folding, g), 2); /* n, zi */
  assert_int_equal(count_op(g, "ZerosLike"), 2);
  assert_int_equal(count_op(g, "OnesLike"), 0);
  assert_int_equal(g->outputs[1].kind, FN_REF_CONST);
  double zero[2] = {0, 0}, neg[2] = {-1, -2}, y1[2] = {4, 5};
  check_value(f.e, g, f.args, 0, 0, zero, 2, 0);
  check_value(f.e, g, f.args, 0, 1, zero, 1, 0);
  check_value(f.e, g, f.args, 1, 1, neg, 2, 0);
  check_value(f.e, g, f.args, 2, 1, zero, 2, 0);
  check_value(f.e, g, f.args, 3, 1, y1, 2, 0);
  fn_graph_free(g);
  fixture_free(&f);
}

/* Aliasing ops (no kernel) fold by copying their input's bytes. */
static void folding_through_aliases(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[1] = {1};
  double xv[1] = {0};
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 1, d, xv);
  fn_graph *g = fn_eval_graph(f.e, "alias", f.args, 1);
  static const float cv[6] = {1, 2, 3, 4, 5, 6};
  int64_t d23[2] = {2, 3};
  int c = konst(g, 2, d23, cv);
  static const int64_t s32[2] = {3, 2}, p10[2] = {1, 0};
  dev_attr rs = ilist_attr("shape", s32, 2), perm = ilist_attr("perm", p10, 2);
  int r = ADDA(g, "r", "Reshape", &rs, 1, fn_const_ref(c));
  int id = ADD(g, "id", "Identity", N(r));
  int t = ADDA(g, "t", "Transpose", &perm, 1, N(id)); /* [2,3] */
  fn_eval_add_output(g, "t", N(t));
  assert_int_equal(run(fn_pass_constant_folding, g), 3);
  assert_int_equal(g->n_nodes, 0);
  assert_int_equal(g->outputs[0].kind, FN_REF_CONST);
  const fn_const *k = &g->consts[g->outputs[0].idx];
  assert_int_equal(k->shape.rank, 2);
  assert_int_equal(k->shape.dims[0], 2);
  assert_int_equal(k->shape.dims[1], 3);
  /* r = [[1,2],[3,4],[5,6]], t = r^T */
  static const float want[6] = {1, 3, 5, 2, 4, 6};
  assert_memory_equal(k->data, want, sizeof want);
  fn_graph_free(g);
  fixture_free(&f);
}

/* --- arithmetic ------------------------------------------------------------- */

static void arithmetic_removes_neutral_ops(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[2] = {2, 3};
  double xv[6] = {1, -2, 3, 0.5, 4, -6};
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 2, d, xv);
  fn_graph *g = fn_eval_graph(f.e, "arith", f.args, 1);
  int zero = fill(g, "zero", 0, NULL, 0);
  static const float ones[3] = {1, 1, 1};
  int64_t d3[1] = {3};
  int one = konst(g, 1, d3, ones); /* [3] broadcasts into [2,3]: x's shape */
  int a = ADD(g, "a", "Add", A(0), N(zero));            /* x + 0 */
  int b = ADD(g, "b", "Mul", fn_const_ref(one), N(a));  /* 1 * x */
  int c = ADD(g, "c", "Sub", N(b), N(zero));            /* x - 0 */
  int dv = ADD(g, "d", "Div", N(c), fn_const_ref(one)); /* x / 1 */
  int id = ADD(g, "id", "Identity", N(dv));
  int n1 = ADD(g, "n1", "Neg", N(id));
  int n2 = ADD(g, "n2", "Neg", N(n1));        /* Neg(Neg(x)) */
  int r = ADD(g, "r", "Sub", N(zero), N(n2)); /* 0 - x: kept */
  int64_t d23[2] = {2, 3};
  int big1 = fill(g, "ones23", 2, d23, 1);
  int64_t d4[3] = {2, 2, 3};
  int big2 = fill(g, "ones223", 3, d4, 1);
  int m1 = ADD(g, "m1", "Mul", N(r), N(big1));  /* same shape: removed */
  int m2 = ADD(g, "m2", "Mul", N(m1), N(big2)); /* broadcasts: kept */
  fn_eval_add_output(g, "m2", N(m2));
  fn_eval_add_output(g, "n1", N(n1)); /* a fetched intermediate */
  double want[12], wn1[6];
  for (int i = 0; i < 12; i++) want[i] = -xv[i % 6];
  for (int i = 0; i < 6; i++) wn1[i] = -xv[i];
  check_value(f.e, g, f.args, 0, 0, want, 12, 1e-6);
  /* a, b, c, d, id, n2, m1 */
  assert_int_equal(run(fn_pass_arithmetic, g), 7 + 1); /* + ones23 gone */
  assert_int_equal(count_op(g, "Identity") + count_op(g, "Div"), 0);
  assert_int_equal(count_op(g, "Neg"), 1); /* n1, fetched */
  assert_int_equal(count_op(g, "Sub"), 1);
  assert_int_equal(count_op(g, "Mul"), 1);
  int s = find_op(g, "Sub");
  assert_true(fn_ref_eq(g->nodes[s].in[1], A(0))); /* 0 - x */
  check_value(f.e, g, f.args, 0, 1, want, 12, 1e-6);
  check_value(f.e, g, f.args, 1, 0, wn1, 6, 1e-6);
  fn_graph_free(g);
  fixture_free(&f);
}

static void arithmetic_transposes_and_reshapes(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 2};
  int64_t da[2] = {3, 2}, db[2] = {3, 4};
  double av[6] = {1, 2, 3, 4, 5, 6}, bv[12];
  for (int i = 0; i < 12; i++) bv[i] = 0.5 * i - 2;
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 2, da, av); /* a^T is [2,3] */
  f.args[1] = tu_mirrored(f.e, PD_FLOAT32, 2, db, bv);
  fn_graph *g = fn_eval_graph(f.e, "tr", f.args, 2);
  static const int64_t p10[2] = {1, 0}, s6[1] = {6}, s32[2] = {3, 2},
                       s23[2] = {2, 3}, p021[3] = {0, 2, 1},
                       p120[3] = {1, 2, 0}, s132[3] = {1, 3, 2};
  dev_attr perm = ilist_attr("perm", p10, 2);
  int at = ADDA(g, "at", "Transpose", &perm, 1, A(0));
  int mm = ADD(g, "mm", "MatMul", N(at), A(1)); /* [2,4] = a^T b */
  int t1 = ADDA(g, "t1", "Transpose", &perm, 1, N(mm));
  int t2 = ADDA(g, "t2", "Transpose", &perm, 1, N(t1)); /* = mm */
  dev_attr r6 = ilist_attr("shape", s6, 1), r32 = ilist_attr("shape", s32, 2),
           r23 = ilist_attr("shape", s23, 2);
  int ra = ADDA(g, "ra", "Reshape", &r6, 1, A(0));
  int rb = ADDA(g, "rb", "Reshape", &r23, 1, N(ra)); /* -> Reshape(a) */
  int rc = ADDA(g, "rc", "Reshape", &r32, 1, A(0));  /* a's shape: removed */
  dev_attr s3 = ilist_attr("shape", s132, 3);
  int r3 = ADDA(g, "r3", "Reshape", &s3, 1, N(rc)); /* [1,3,2] */
  dev_attr q021 = ilist_attr("perm", p021, 3),
           q120 = ilist_attr("perm", p120, 3);
  int u1 = ADDA(g, "u1", "Transpose", &q021, 1, N(r3)); /* [1,2,3] */
  int u2 = ADDA(g, "u2", "Transpose", &q120, 1, N(u1)); /* composed */
  fn_eval_add_output(g, "t2", N(t2));
  fn_eval_add_output(g, "rb", N(rb));
  fn_eval_add_output(g, "u2", N(u2));
  fn_eval_add_output(g, "ra", N(ra)); /* fetched: kept */
  double want[8] = {0}, wrb[6], wu2[6];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      for (int k = 0; k < 3; k++)
        want[i * 4 + j] += av[k * 2 + i] * bv[k * 4 + j];
  for (int i = 0; i < 6; i++) wrb[i] = av[i];
  /* u1[0][i][j] = a[j][i] (i<2, j<3); u2 = u1 with perm (1,2,0): [2,3,1],
   * u2[i][j][0] = u1[0][i][j] = a[j][i]. */
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) wu2[i * 3 + j] = av[j * 2 + i];
  check_value(f.e, g, f.args, 0, 0, want, 8, 1e-6);
  check_value(f.e, g, f.args, 2, 0, wu2, 6, 0);
  int ch = run(fn_pass_arithmetic, g);
  /* mm rewritten (+at gone), t2 removed (+t1 gone), rb rewritten, rc
   * removed, u2 rewritten (+u1 gone) */
  assert_int_equal(ch, 8);
  int m = find_op(g, "MatMul");
  assert_true(fn_ref_eq(g->nodes[m].in[0], A(0)));
  assert_true(fn_node_attr(&g->nodes[m], "transpose_a")->u.b);
  assert_false(fn_node_attr(&g->nodes[m], "transpose_b")->u.b);
  assert_string_equal(g->nodes[m].name, "mm");
  assert_int_equal(g->nodes[m].n_origins, 2);
  assert_true(fn_ref_eq(g->outputs[0], N(m))); /* t2 -> mm */
  assert_int_equal(count_op(g, "Transpose"), 1);
  int u = find_op(g, "Transpose");
  const dev_attr_value *q = fn_node_attr(&g->nodes[u], "perm");
  assert_int_equal(q->u.ilist.n, 3); /* (0,2,1) then (1,2,0): (2,1,0) */
  assert_int_equal(q->u.ilist.v[0], 2);
  assert_int_equal(q->u.ilist.v[1], 1);
  assert_int_equal(q->u.ilist.v[2], 0);
  assert_int_equal(count_op(g, "Reshape"), 3); /* ra, rb', r3 */
  assert_true(fn_ref_eq(g->nodes[g->outputs[1].idx].in[0], A(0)));
  check_value(f.e, g, f.args, 0, 1, want, 8, 1e-6);
  check_value(f.e, g, f.args, 1, 0, wrb, 6, 0);
  check_value(f.e, g, f.args, 2, 1, wu2, 6, 0);
  check_value(f.e, g, f.args, 3, 0, wrb, 6, 0);
  (void)mm;
  (void)ra;
  fn_graph_free(g);
  fixture_free(&f);
}

static void arithmetic_batch_matmul_adjoints(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 3};
  int64_t dx[3] = {2, 3, 2}, dw[3] = {3, 2, 2};
  double xv[12], yv[12], wv[12];
  for (int i = 0; i < 12; i++) {
    xv[i] = i * 0.25 - 1;
    yv[i] = 2 - i * 0.5;
    wv[i] = (i % 5) - 2;
  }
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 3, dx, xv);
  f.args[1] = tu_mirrored(f.e, PD_FLOAT32, 3, dx, yv);
  f.args[2] = tu_mirrored(f.e, PD_FLOAT32, 3, dw, wv);
  fn_graph *g = fn_eval_graph(f.e, "bmm", f.args, 3);
  static const int64_t p021[3] = {0, 2, 1}, p102[3] = {1, 0, 2};
  dev_attr sw = ilist_attr("perm", p021, 3), bad = ilist_attr("perm", p102, 3);
  int tx = ADDA(g, "tx", "Transpose", &sw, 1, A(0));  /* [2,2,3] */
  int b = ADD(g, "b", "BatchMatMul", N(tx), A(1));    /* [2,2,2] */
  int tw = ADDA(g, "tw", "Transpose", &bad, 1, A(2)); /* batch axis moved */
  int b2 = ADD(g, "b2", "BatchMatMul", N(tx), N(tw)); /* [2,2,2] */
  fn_eval_add_output(g, "b", N(b));
  fn_eval_add_output(g, "b2", N(b2));
  double want[8] = {0}, w2[8] = {0};
  for (int n = 0; n < 2; n++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++)
        for (int k = 0; k < 3; k++) {
          want[n * 4 + i * 2 + j] +=
              xv[n * 6 + k * 2 + i] * yv[n * 6 + k * 2 + j];
          /* tw[n][k][j] = w[k][n][j] */
          w2[n * 4 + i * 2 + j] +=
              xv[n * 6 + k * 2 + i] * wv[k * 4 + n * 2 + j];
        }
  check_value(f.e, g, f.args, 0, 0, want, 8, 1e-6);
  check_value(f.e, g, f.args, 1, 0, w2, 8, 1e-6);
  assert_int_equal(run(fn_pass_arithmetic, g), 3); /* b, b2; tx gone */
  assert_int_equal(count_op(g, "Transpose"), 1);   /* tw stays */
  int bi = g->outputs[0].idx;
  assert_true(fn_ref_eq(g->nodes[bi].in[0], A(0)));
  assert_true(fn_node_attr(&g->nodes[bi], "adj_x")->u.b);
  assert_false(fn_node_attr(&g->nodes[bi], "adj_y")->u.b);
  int b2i = g->outputs[1].idx;
  assert_true(fn_node_attr(&g->nodes[b2i], "adj_x")->u.b);
  assert_false(fn_node_attr(&g->nodes[b2i], "adj_y")->u.b);
  assert_int_equal(g->nodes[b2i].in[1].kind, FN_REF_NODE); /* tw kept */
  check_value(f.e, g, f.args, 0, 1, want, 8, 1e-6);
  check_value(f.e, g, f.args, 1, 1, w2, 8, 1e-6);
  (void)tx;
  (void)tw;
  fn_graph_free(g);
  fixture_free(&f);
}

static void arithmetic_leaves_sharded_shapes(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[2] = {4, 3};
  double xv[12];
  for (int i = 0; i < 12; i++) xv[i] = i;
  f.args[0] = tu_sharded(f.e, PD_FLOAT32, 2, d, 0, xv); /* [2,3] each */
  fn_graph *g = fn_eval_graph(f.e, "sh", f.args, 1);
  g->arg_not_mirrored[0] = true;
  int64_t d1[2] = {1, 3};
  int o = fill(g, "one", 2, d1, 1);
  static const int64_t s6[2] = {-1, 3};
  dev_attr r = ilist_attr("shape", s6, 2);
  int rs = ADDA(g, "rs", "Reshape", &r, 1, A(0)); /* same shape on each */
  int m = ADD(g, "m", "Mul", N(rs), N(o));
  fn_eval_add_output(g, "m", N(m));
  assert_int_equal(run(fn_pass_arithmetic, g), 3); /* rs, m, one */
  assert_true(fn_ref_eq(g->outputs[0], A(0)));
  fn_graph_free(g);
  /* A Reshape that only matches on one component stays. */
  int64_t d5[1] = {3};
  double yv[3] = {1, 2, 3};
  dev_tensor *y = tu_sharded(f.e, PD_FLOAT32, 1, d5, 0, yv); /* [2], [1] */
  g = fn_eval_graph(f.e, "sh2", &y, 1);
  static const int64_t s2[1] = {-1};
  dev_attr r2 = ilist_attr("shape", s2, 1);
  static const int64_t s21[2] = {-1, 1};
  dev_attr r21 = ilist_attr("shape", s21, 2);
  int a1 = ADDA(g, "a1", "Reshape", &r21, 1, A(0));
  int a2 = ADDA(g, "a2", "Reshape", &r2, 1, N(a1)); /* back to x's shapes */
  fn_eval_add_output(g, "a2", N(a2));
  assert_int_equal(run(fn_pass_arithmetic, g), 2);
  assert_true(fn_ref_eq(g->outputs[0], A(0)));
  fn_graph_free(g);
  dev_tensor_release(y);
  /* A Reshape that keeps the shape of one component only stays. */
  int64_t d32[2] = {3, 2};
  double wv[6] = {1, 2, 3, 4, 5, 6};
  dev_tensor *w = tu_sharded(f.e, PD_FLOAT32, 2, d32, 0, wv); /* [2,2] [1,2] */
  g = fn_eval_graph(f.e, "sh3", &w, 1);
  g->arg_not_mirrored[0] = true;
  static const int64_t s2m[2] = {2, -1};
  dev_attr r2m = ilist_attr("shape", s2m, 2);
  int keep = ADDA(g, "keep", "Reshape", &r2m, 1, A(0)); /* [2,2], [2,1] */
  fn_eval_add_output(g, "keep", N(keep));
  assert_int_equal(run(fn_pass_arithmetic, g), 0);
  assert_int_equal(count_op(g, "Reshape"), 1);
  double w1[2] = {5, 6};
  check_value(f.e, g, &w, 0, 1, w1, 2, 0);
  fn_graph_free(g);
  dev_tensor_release(w);
  fixture_free(&f);
}

/* --- fusion ----------------------------------------------------------------- */

static bool fused_ops_registered(void) {
  return dev_op_lookup(DEV_FUSED_MATMUL_OP) &&
         dev_op_lookup(DEV_FUSED_ELEMENTWISE_OP);
}

/* True when node n's origins hold `name`. */
static bool has_origin(const fn_node *n, const char *name) {
  for (int k = 0; k < n->n_origins; k++)
    if (strcmp(n->origins[k], name) == 0) return true;
  return false;
}

static void fusion_matmul_bias_activation(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 3};
  int64_t da[2] = {2, 3}, db[2] = {3, 4}, dc[1] = {4};
  double av[6], bv[12], cv[4] = {0.5, -1, 2, -3};
  for (int i = 0; i < 6; i++) av[i] = i - 2.5;
  for (int i = 0; i < 12; i++) bv[i] = 0.25 * i - 1;
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 2, da, av);
  f.args[1] = tu_mirrored(f.e, PD_FLOAT32, 2, db, bv);
  f.args[2] = tu_mirrored(f.e, PD_FLOAT32, 1, dc, cv);
  fn_graph *g = fn_eval_graph(f.e, "fmm", f.args, 3);
  int mm = ADD(g, "dense/mm", "MatMul", A(0), A(1));
  int ba = ADD(g, "dense/bias", "BiasAdd", N(mm), A(2));
  int r = ADD(g, "dense/relu", "Relu", N(ba));
  int mm2 = ADD(g, "mm2", "MatMul", A(0), A(1)); /* second use: kept */
  int ad = ADD(g, "add2", "Add", A(2), N(mm2));  /* bias first */
  int t = ADD(g, "tanh2", "Tanh", N(ad));
  int sq = ADD(g, "use2", "Square", N(mm2));
  fn_eval_add_output(g, "relu", N(r));
  fn_eval_add_output(g, "tanh", N(t));
  fn_eval_add_output(g, "sq", N(sq));
  double pre[8] = {0}, wr[8], wt[8], ws[8];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      for (int k = 0; k < 3; k++)
        pre[i * 4 + j] += av[i * 3 + k] * bv[k * 4 + j];
  for (int i = 0; i < 8; i++) {
    double v = pre[i] + cv[i % 4];
    wr[i] = v > 0 ? v : 0;
    wt[i] = tanh(v);
    ws[i] = pre[i] * pre[i];
  }
  check_value(f.e, g, f.args, 0, 0, wr, 8, 1e-6);
  if (!fused_ops_registered()) {
    assert_int_equal(run(fn_pass_fusion, g), 0);
    assert_int_equal(g->n_nodes, 7);
    fn_graph_free(g);
    fixture_free(&f);
    skip(); /* the fused ops come with device/ops/fused.c */
  }
  int ch = run(fn_pass_fusion, g);
  assert_true(ch >= 3);
  assert_int_equal(count_op(g, DEV_FUSED_MATMUL_OP), 1);
  int fm = g->outputs[0].idx;
  assert_string_equal(g->nodes[fm].def->name, DEV_FUSED_MATMUL_OP);
  assert_string_equal(g->nodes[fm].name, "dense/relu");
  assert_int_equal(g->nodes[fm].n_origins, 3);
  /* Registered names only: the fused node's own, not the "dense/relu_1"
   * its insertion made up. */
  assert_true(has_origin(&g->nodes[fm], "dense/relu"));
  for (int k = 0; k < 3; k++)
    assert_null(strstr(g->nodes[fm].origins[k], "_1"));
  const dev_attr_value *act = fn_node_attr(&g->nodes[fm], "activation");
  assert_true(act->u.s.len == 4 && memcmp(act->u.s.ptr, "relu", 4) == 0);
  assert_true(fn_ref_eq(g->nodes[fm].in[2], A(2)));
  assert_int_equal(count_op(g, "MatMul"), 1); /* mm2: used twice */
  check_value(f.e, g, f.args, 0, 1, wr, 8, 1e-5);
  check_value(f.e, g, f.args, 1, 0, wt, 8, 1e-5);
  check_value(f.e, g, f.args, 2, 0, ws, 8, 1e-5);
  (void)mm;
  (void)ba;
  fn_graph_free(g);
  fixture_free(&f);
}

static void fusion_elementwise_chain(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 2};
  int64_t dx[2] = {2, 3}, dz[1] = {3};
  double xv[6] = {0.5, -1, 2, 0, 1.5, -0.25}, zv[3] = {1, 2, 3};
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 2, dx, xv);
  f.args[1] = tu_mirrored(f.e, PD_FLOAT32, 1, dz, zv);
  fn_graph *g = fn_eval_graph(f.e, "few", f.args, 2);
  int two = fill(g, "two", 0, NULL, 2);
  int e = ADD(g, "e", "Exp", A(0));
  int m = ADD(g, "m", "Mul", N(e), N(two));
  int s = ADD(g, "s", "Add", N(m), A(1)); /* broadcast [3] */
  int q = ADD(g, "q", "Mul", N(s), N(s)); /* a DAG: s used twice */
  int fetched = ADD(g, "fe", "Neg", A(1));
  int t = ADD(g, "t", "Tanh", N(fetched)); /* fe is an output: alone */
  fn_eval_add_output(g, "q", N(q));
  fn_eval_add_output(g, "fe", N(fetched));
  fn_eval_add_output(g, "t", N(t));
  double wq[6], wf[3], wt[3];
  for (int i = 0; i < 6; i++) {
    double v = exp(xv[i]) * 2 + zv[i % 3];
    wq[i] = v * v;
  }
  for (int i = 0; i < 3; i++) {
    wf[i] = -zv[i];
    wt[i] = tanh(-zv[i]);
  }
  check_value(f.e, g, f.args, 0, 0, wq, 6, 1e-6);
  if (!fused_ops_registered()) {
    assert_int_equal(run(fn_pass_fusion, g), 0);
    fn_graph_free(g);
    fixture_free(&f);
    skip();
  }
  run(fn_pass_fusion, g);
  assert_int_equal(count_op(g, DEV_FUSED_ELEMENTWISE_OP), 1);
  int fe = g->outputs[0].idx;
  const fn_node *n = &g->nodes[fe];
  assert_string_equal(n->def->name, DEV_FUSED_ELEMENTWISE_OP);
  assert_string_equal(n->name, "q");
  assert_int_equal(n->n_in, 2); /* x, z */
  assert_int_equal(n->n_origins, 4);
  assert_true(has_origin(n, "e") && has_origin(n, "m") && has_origin(n, "s") &&
              has_origin(n, "q"));
  const dev_attr_value *p = fn_node_attr(n, "program");
  const dev_attr_value *c = fn_node_attr(n, "constants");
  assert_int_equal(p->u.ilist.n, 12);
  assert_int_equal(c->u.flist.n, 1);
  assert_true(c->u.flist.v[0] == 2.0);
  static const int64_t want_prog[12] = {DEV_EW_EXP,
                                        0,
                                        DEV_EW_NONE,
                                        DEV_EW_MUL,
                                        DEV_EW_TEMP_BASE + 0,
                                        DEV_EW_CONST_BASE + 0,
                                        DEV_EW_ADD,
                                        DEV_EW_TEMP_BASE + 1,
                                        1,
                                        DEV_EW_MUL,
                                        DEV_EW_TEMP_BASE + 2,
                                        DEV_EW_TEMP_BASE + 2};
  for (int i = 0; i < 12; i++) assert_int_equal(p->u.ilist.v[i], want_prog[i]);
  assert_int_equal(count_op(g, "Neg"), 1);
  assert_int_equal(count_op(g, "Tanh"), 1);
  assert_int_equal(count_op(g, "Fill"), 0);
  check_value(f.e, g, f.args, 0, 1, wq, 6, 1e-5);
  check_value(f.e, g, f.args, 1, 0, wf, 3, 1e-6);
  check_value(f.e, g, f.args, 2, 0, wt, 3, 1e-5);
  (void)e;
  (void)m;
  (void)s;
  (void)two;
  fn_graph_free(g);
  fixture_free(&f);
}

static void fusion_leaves_values_used_elsewhere(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 3};
  int64_t da[2] = {2, 2}, dc[1] = {2};
  double av[4] = {1, -2, 3, 0.5}, bv[4] = {0.5, 1, -1, 2}, cv[2] = {-4, 1};
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 2, da, av);
  f.args[1] = tu_mirrored(f.e, PD_FLOAT32, 2, da, bv);
  f.args[2] = tu_mirrored(f.e, PD_FLOAT32, 1, dc, cv);
  fn_graph *g = fn_eval_graph(f.e, "fused2", f.args, 3);
  int mm = ADD(g, "mm", "MatMul", A(0), A(1));
  int ba = ADD(g, "ba", "BiasAdd", N(mm), A(2)); /* fetched */
  int r = ADD(g, "r", "Relu", N(ba));
  int e = ADD(g, "e", "Exp", A(0));
  static const int64_t p10[2] = {1, 0};
  dev_attr perm = ilist_attr("perm", p10, 2);
  int t = ADDA(g, "t", "Transpose", &perm, 1, N(e)); /* e used elsewhere */
  int s = ADD(g, "s", "Sub", N(e), A(1));
  int q = ADD(g, "q", "Square", N(s));
  fn_eval_add_output(g, "ba", N(ba));
  fn_eval_add_output(g, "r", N(r));
  fn_eval_add_output(g, "t", N(t));
  fn_eval_add_output(g, "q", N(q));
  double wb[4] = {0}, wr[4], wt[4], wq[4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      for (int k = 0; k < 2; k++)
        wb[i * 2 + j] += av[i * 2 + k] * bv[k * 2 + j];
      wb[i * 2 + j] += cv[j];
      wt[j * 2 + i] = exp(av[i * 2 + j]);
      double v = exp(av[i * 2 + j]) - bv[i * 2 + j];
      wq[i * 2 + j] = v * v;
    }
  for (int i = 0; i < 4; i++) wr[i] = wb[i] > 0 ? wb[i] : 0;
  if (!fused_ops_registered()) {
    assert_int_equal(run(fn_pass_fusion, g), 0);
    fn_graph_free(g);
    fixture_free(&f);
    skip();
  }
  run(fn_pass_fusion, g);
  /* MatMul + BiasAdd fused (the bias's value is fetched: no activation). */
  int fm = g->outputs[0].idx;
  assert_string_equal(g->nodes[fm].def->name, DEV_FUSED_MATMUL_OP);
  const dev_attr_value *act = fn_node_attr(&g->nodes[fm], "activation");
  assert_true(act->u.s.len == 4 && memcmp(act->u.s.ptr, "none", 4) == 0);
  assert_string_equal(g->nodes[g->outputs[1].idx].def->name, "Relu");
  /* e stays (Transpose reads it); s, q fuse with e as an input. */
  assert_int_equal(count_op(g, "Exp"), 1);
  const fn_node *fe = &g->nodes[g->outputs[3].idx];
  assert_string_equal(fe->def->name, DEV_FUSED_ELEMENTWISE_OP);
  assert_int_equal(fe->n_in, 2);
  assert_true(fn_ref_eq(fe->in[0], N(find_op(g, "Exp"))));
  assert_int_equal(fn_node_attr(fe, "program")->u.ilist.n, 6);
  check_value(f.e, g, f.args, 0, 0, wb, 4, 1e-5);
  check_value(f.e, g, f.args, 1, 1, wr, 4, 1e-5);
  check_value(f.e, g, f.args, 2, 0, wt, 4, 1e-6);
  check_value(f.e, g, f.args, 3, 1, wq, 4, 1e-5);
  (void)mm;
  (void)e;
  fn_graph_free(g);
  fixture_free(&f);
}

/* Chains over the limits: 25 Abs in a row (more than DEV_EW_MAX_INSTR
 * instructions) and a sum of 18 arguments (more than DEV_EW_MAX_INPUTS
 * inputs) split into several fused nodes, each within the limits. */
static void fusion_splits_at_the_limits(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  enum { NA = 18 };
  dev_tensor *args[NA];
  int64_t d[1] = {2};
  double want_sum[2] = {0, 0};
  for (int i = 0; i < NA; i++) {
    double v[2] = {i - 8.5, 0.25 * i};
    args[i] = tu_mirrored(e, PD_FLOAT32, 1, d, v);
    want_sum[0] += v[0];
    want_sum[1] += v[1];
  }
  fn_graph *g = fn_eval_graph(e, "limits", args, NA);
  int prev = ADD(g, "abs", "Abs", A(0));
  for (int i = 1; i < 25; i++) prev = ADD(g, "abs", "Abs", N(prev));
  int s = ADD(g, "sum", "Add", A(0), A(1));
  for (int i = 2; i < NA; i++) s = ADD(g, "sum", "Add", N(s), A(i));
  fn_eval_add_output(g, "abs", N(prev));
  fn_eval_add_output(g, "sum", N(s));
  double want_abs[2] = {8.5, 0};
  if (!fused_ops_registered()) {
    assert_int_equal(run(fn_pass_fusion, g), 0);
    fn_graph_free(g);
    for (int i = 0; i < NA; i++) dev_tensor_release(args[i]);
    dev_engine_destroy(e);
    skip();
  }
  run(fn_pass_fusion, g);
  int fused = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const fn_node *n = &g->nodes[i];
    if (strcmp(n->def->name, DEV_FUSED_ELEMENTWISE_OP) != 0) continue;
    fused++;
    assert_true(n->n_in <= DEV_EW_MAX_INPUTS);
    assert_true(fn_node_attr(n, "program")->u.ilist.n <= 3 * DEV_EW_MAX_INSTR);
  }
  assert_true(fused >= 4);              /* two per chain at least */
  assert_true(g->n_nodes <= fused + 2); /* at most a single node each left */
  check_value(e, g, args, 0, 1, want_abs, 2, 0);
  check_value(e, g, args, 1, 0, want_sum, 2, 1e-6);
  fn_graph_free(g);
  for (int i = 0; i < NA; i++) dev_tensor_release(args[i]);
  dev_engine_destroy(e);
}

/* --- buffer planning -------------------------------------------------------- */

/* The value r stands for through aliasing nodes, -1 for args and consts. */
static int root_of(const fn_graph *g, fn_ref r) {
  while (r.kind == FN_REF_NODE &&
         (g->nodes[r.idx].def->flags & DEV_OP_ALIASES_INPUT))
    r = g->nodes[r.idx].in[0];
  return r.kind == FN_REF_NODE ? r.idx * FN_MAX_NODE_OUTPUTS + r.out : -1;
}

/* Checks plan p of g: graph outputs, aliases not planned; alignment; every
 * pair of planned values live at once (this file's own live ranges,
 * collectives' operands one step longer) disjoint; within the arena. */
static void check_plan(const fn_graph *g, const fn_buffer_plan *p) {
  const int K = FN_MAX_NODE_OUTPUTS, nd = g->n_dev, nv = g->n_nodes * K;
  int *last = calloc((size_t)nv, sizeof *last);
  for (int v = 0; v < nv; v++) last[v] = v / K;
  for (int i = 0; i < g->n_nodes; i++) {
    const fn_node *n = &g->nodes[i];
    int t = (n->def->flags & DEV_OP_COLLECTIVE) ? i + 1 : i;
    for (int j = 0; j < n->n_in; j++) {
      int v = root_of(g, n->in[j]);
      if (v >= 0 && last[v] < t) last[v] = t;
    }
    if (n->def->flags & DEV_OP_COLLECTIVE) last[i * K] = i + 1;
  }
  for (int o = 0; o < g->n_outputs; o++) {
    int v = root_of(g, g->outputs[o]);
    if (v >= 0)
      for (int d = 0; d < nd; d++)
        assert_true(p->offset[(size_t)v * nd + d] == FN_NOT_PLANNED);
  }
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].def->flags & DEV_OP_ALIASES_INPUT)
      assert_true(p->offset[(size_t)i * K * nd] == FN_NOT_PLANNED);
  for (int d = 0; d < nd; d++)
    for (int a = 0; a < nv; a++) {
      uint64_t oa = p->offset[(size_t)a * nd + d];
      if (oa == FN_NOT_PLANNED) continue;
      const fn_node *na = &g->nodes[a / K];
      size_t sa = 0;
      dev_shape_byte_size(na->out_dtype[a % K],
                          &na->out_shape[(a % K) * nd + d], &sa, NULL);
      assert_int_equal(oa % FN_ARENA_ALIGN, 0);
      assert_true(oa + sa <= p->arena_bytes[d]);
      for (int b = a + 1; b < nv; b++) {
        uint64_t ob = p->offset[(size_t)b * nd + d];
        if (ob == FN_NOT_PLANNED) continue;
        const fn_node *nb = &g->nodes[b / K];
        size_t sb = 0;
        dev_shape_byte_size(nb->out_dtype[b % K],
                            &nb->out_shape[(b % K) * nd + d], &sb, NULL);
        bool live_together = a / K <= last[b] && b / K <= last[a];
        bool overlap = sa && sb && oa < ob + sb && ob < oa + sa;
        if (live_together && overlap)
          fail_msg("device %d: values %d and %d live at once share bytes", d, a,
                   b);
      }
    }
  free(last);
}

static void buffers_reuse_by_lifetime(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[1] = {1000};
  double *xv = calloc(1000, sizeof *xv);
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 1, d, xv);
  free(xv);
  fn_graph *g = fn_eval_graph(f.e, "chain", f.args, 1);
  int prev = ADD(g, "n0", "Neg", A(0));
  static const int64_t s[2] = {10, 100};
  dev_attr rs = ilist_attr("shape", s, 2);
  int held = ADDA(g, "alias", "Reshape", &rs, 1, N(prev)); /* keeps n0 */
  for (int i = 1; i < 8; i++) {
    char nm[16];
    snprintf(nm, sizeof nm, "n%d", i);
    prev = ADD(g, nm, "Neg", N(prev));
  }
  int r2 = ADDA(g, "r2", "Reshape", &rs, 1, N(prev));
  int late = ADD(g, "late", "Add", N(held), N(r2));
  int out = ADD(g, "out", "Neg", N(late));
  int64_t s1[1] = {1000};
  dev_attr rback = ilist_attr("shape", s1, 1);
  int oa = ADDA(g, "oa", "Reshape", &rback, 1, N(late)); /* output alias */
  fn_eval_add_output(g, "out", N(out));
  fn_eval_add_output(g, "oa", N(oa));
  fn_buffer_plan p;
  assert_int_equal(fn_plan_buffers(g, &p, NULL), PD_OK);
  check_plan(g, &p);
  assert_int_equal(p.n_dev, 2);
  /* n0..n7 and late are intermediates (late through oa is an output's:
   * not planned): 8 of 4000 bytes, aligned to 4096. */
  assert_int_equal(p.unplanned_bytes, 8 * 4096);
  assert_true(p.arena_bytes[0] < p.unplanned_bytes);
  assert_true(p.arena_bytes[0] >= 3 * 4096); /* n0 held + two in flight */
  assert_true(p.offset[(size_t)late * FN_MAX_NODE_OUTPUTS * 2] ==
              FN_NOT_PLANNED);
  fn_buffer_plan_free(&p);
  fn_buffer_plan_free(&p); /* twice is harmless */
  (void)held;
  fn_graph_free(g);
  fixture_free(&f);
}

static void buffers_per_device_and_collectives(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 1};
  int64_t d[1] = {300};
  double *xv = calloc(300, sizeof *xv);
  f.args[0] = tu_sharded(f.e, PD_FLOAT32, 1, d, 0, xv); /* 150 each */
  free(xv);
  fn_graph *g = fn_eval_graph(f.e, "coll", f.args, 1);
  g->arg_not_mirrored[0] = true;
  int a = ADD(g, "a", "Neg", A(0));
  dev_attr ax = {"axis", {.type = DEV_ATTR_INT, .u.i = 0}};
  int ag = ADDA(g, "ag", "AllGather", &ax, 1, N(a)); /* [300] */
  int b = ADD(g, "b", "Exp", N(ag));
  int c = ADD(g, "c", "Neg", N(b));
  int e = ADD(g, "e", "Neg", N(c));
  fn_eval_add_output(g, "e", N(e));
  fn_buffer_plan p;
  assert_int_equal(fn_plan_buffers(g, &p, NULL), PD_OK);
  check_plan(g, &p);
  /* a and ag live through b (one step past the collective): b does not
   * take a's bytes. */
  const int K = FN_MAX_NODE_OUTPUTS;
  for (int dv = 0; dv < 2; dv++) {
    uint64_t oa = p.offset[(size_t)a * K * 2 + dv],
             ob = p.offset[(size_t)b * K * 2 + dv];
    assert_true(oa != FN_NOT_PLANNED && ob != FN_NOT_PLANNED);
    assert_true(oa != ob);
  }
  fn_buffer_plan_free(&p);
  (void)c;
  fn_graph_free(g);
  /* Per-device sizes: a sharded chain of [2] and [1] rows of 512 floats. */
  int64_t d2[2] = {3, 512};
  double *yv = calloc(3 * 512, sizeof *yv);
  dev_tensor *y = tu_sharded(f.e, PD_FLOAT32, 2, d2, 0, yv);
  free(yv);
  g = fn_eval_graph(f.e, "uneven", &y, 1);
  g->arg_not_mirrored[0] = true;
  int prev = ADD(g, "m0", "Neg", A(0));
  for (int i = 1; i < 5; i++) prev = ADD(g, "m", "Neg", N(prev));
  fn_eval_add_output(g, "m", N(prev));
  assert_int_equal(fn_plan_buffers(g, &p, NULL), PD_OK);
  check_plan(g, &p);
  assert_int_equal(p.arena_bytes[0], 2 * 4096); /* 2 rows: 4096 bytes */
  assert_int_equal(p.arena_bytes[1], 2 * 2048);
  assert_int_equal(p.unplanned_bytes, 4 * 4096);
  fn_buffer_plan_free(&p);
  fn_graph_free(g);
  dev_tensor_release(y);
  fixture_free(&f);
}

/* --- all together ------------------------------------------------------------ */

/* The pipeline's order on one graph (a dense layer with redundancy in it):
 * values stay, every pass is idempotent, the plan holds. */
static void passes_in_pipeline_order(void **state) {
  (void)state;
  fixture f = {tu_engine(2, 0), {NULL}, 3};
  int64_t dx[2] = {4, 3}, dw[2] = {3, 2}, db[1] = {2};
  double xv[12], wv[6] = {0.5, -1, 0.25, 2, -0.75, 1}, bv[2] = {0.1, -0.2};
  for (int i = 0; i < 12; i++) xv[i] = 0.3 * i - 1.5;
  f.args[0] = tu_mirrored(f.e, PD_FLOAT32, 2, dx, xv);
  f.args[1] = tu_mirrored(f.e, PD_FLOAT32, 2, dw, wv);
  f.args[2] = tu_mirrored(f.e, PD_FLOAT32, 1, db, bv);
  fn_graph *g = fn_eval_graph(f.e, "step", f.args, 3);
  static const int64_t p10[2] = {1, 0};
  dev_attr perm = ilist_attr("perm", p10, 2);
  ADD(g, "dead", "Neg", A(0));
  int h = ADD(g, "h", "Identity", A(0));
  int t1 = ADDA(g, "t1", "Transpose", &perm, 1, N(h));
  int t2 = ADDA(g, "t2", "Transpose", &perm, 1, N(t1));
  int m = ADD(g, "mm", "MatMul", N(t2), A(1));
  int one = fill(g, "one", 0, NULL, 1);
  int y = ADD(g, "y", "Mul", N(m), N(one));
  int z = ADD(g, "z", "BiasAdd", N(y), A(2));
  int r = ADD(g, "r", "Relu", N(z));
  int r2 = ADD(g, "r2", "Relu", N(z)); /* CSE: same as r */
  int o = ADD(g, "o", "Add", N(r), N(r2));
  int e = ADD(g, "e", "Exp", N(o));
  static const float hv[1] = {0.5f};
  int half = konst(g, 0, NULL, hv);
  int64_t d1[1] = {1};
  int hh = ADD(g, "hh", "Add", fn_const_ref(half), fn_const_ref(half)); /* 1 */
  int q = ADD(g, "q", "Mul", N(e), N(hh)); /* Mul by 1 once folded */
  int w = ADD(g, "w", "Sub", N(q), N(o));
  fn_eval_add_output(g, "w", N(w));
  (void)d1;
  double want[8];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++) {
      double v = bv[j];
      for (int k = 0; k < 3; k++) v += xv[i * 3 + k] * wv[k * 2 + j];
      v = v > 0 ? 2 * v : 0;
      want[i * 2 + j] = exp(v) - v;
    }
  check_value(f.e, g, f.args, 0, 0, want, 8, 1e-5);
  static const fn_pass_fn order[] = {fn_pass_pruning, fn_pass_cse,
                                     fn_pass_constant_folding,
                                     fn_pass_arithmetic, fn_pass_fusion};
  int total = 0;
  for (size_t p = 0; p < sizeof order / sizeof order[0]; p++) {
    total += run(order[p], g);
    check_value(f.e, g, f.args, 0, (int)(p % 2), want, 8, 1e-5);
  }
  assert_true(total >= 9);
  assert_int_equal(count_op(g, "Identity") + count_op(g, "Transpose"), 0);
  assert_int_equal(count_op(g, "Relu") + count_op(g, "Neg"),
                   fused_ops_registered() ? 0 : 1);
  if (fused_ops_registered()) {
    assert_int_equal(g->n_nodes, 2); /* _FusedMatMul, _FusedElementwise */
    assert_int_equal(count_op(g, DEV_FUSED_MATMUL_OP), 1);
  } else {
    assert_int_equal(g->n_nodes, 6); /* mm z r o e w: q was x*1 */
  }
  fn_buffer_plan p;
  assert_int_equal(fn_plan_buffers(g, &p, NULL), PD_OK);
  check_plan(g, &p);
  fn_buffer_plan_free(&p);
  (void)h;
  (void)t1;
  (void)m;
  (void)y;
  (void)r2;
  (void)q;
  (void)one;
  (void)z;
  (void)r;
  (void)e;
  fn_graph_free(g);
  fixture_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(pruning_removes_dead_nodes),
      cmocka_unit_test(cse_merges_equal_nodes),
      cmocka_unit_test(cse_leaves_random_and_collectives),
      cmocka_unit_test(folding_evaluates_constants),
      cmocka_unit_test(folding_leaves_sharded_and_stops_at_deadline),
      cmocka_unit_test(folding_through_aliases),
      cmocka_unit_test(arithmetic_removes_neutral_ops),
      cmocka_unit_test(arithmetic_transposes_and_reshapes),
      cmocka_unit_test(arithmetic_batch_matmul_adjoints),
      cmocka_unit_test(arithmetic_leaves_sharded_shapes),
      cmocka_unit_test(fusion_matmul_bias_activation),
      cmocka_unit_test(fusion_elementwise_chain),
      cmocka_unit_test(fusion_leaves_values_used_elsewhere),
      cmocka_unit_test(fusion_splits_at_the_limits),
      cmocka_unit_test(buffers_reuse_by_lifetime),
      cmocka_unit_test(buffers_per_device_and_collectives),
      cmocka_unit_test(passes_in_pipeline_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
