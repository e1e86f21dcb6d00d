/* Collectives inside graph functions (device/fn/run.c, passes_buffers.c):
 * AllGather, ReduceScatter, Broadcast and AllReduce whose input another node
 * of the function computes (Exp) and whose output a later node reads (Mul),
 * on 4 CPU devices, even and uneven shards, buffer planning on and off,
 * each call repeated 50 times (queued together, so devices run ahead of
 * each other into later nodes and later calls) and compared with float64
 * references. Nodes after the collective take buffers of the collective's
 * input's size, so a plan that let them reuse those bytes, or a device that
 * freed its memory at the end of its part, would corrupt what a slower peer
 * still reads (the CPU backend's Broadcast, AllGather and ReduceScatter
 * return without a barrier). A gradient through AllGather (its VJP a
 * ReduceScatter) runs the same way. Also: a call's new bytes (the quota's
 * count) include its intermediates with planning on and off, and the
 * signature of uneven shardings names the component shapes. */
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

enum { NDEV = 4, COLS = 3, REPS = 50, MAXR = 64 };

/* --- definitions ------------------------------------------------------------ */

typedef struct tnode {
  const char *name, *op;
  const char *in[3];
  int n_in;
  dev_attr attr;
  int n_attrs;
} tnode;

typedef struct tdef {
  dev_fn_def def;
  dev_fn_arg arg;
  dev_fn_node nodes[8];
  dev_fn_output outs[2];
  tnode tn[8];
} tdef;

static void tdef_make(tdef *t, const char *name, const tnode *nodes, int nn,
                      const dev_fn_output *outs, int no) {
  memset(t, 0, sizeof *t);
  t->def = (dev_fn_def)DEV_FN_DEF_INITIALIZER;
  t->def.name = name;
  t->arg = (dev_fn_arg){"x", PD_FLOAT32};
  memcpy(t->tn, nodes, sizeof *nodes * (size_t)nn);
  for (int i = 0; i < nn; i++) {
    dev_fn_node *n = &t->nodes[i];
    n->name = t->tn[i].name;
    n->op = t->tn[i].op;
    n->inputs = t->tn[i].in;
    n->num_inputs = t->tn[i].n_in;
    n->attrs = &t->tn[i].attr;
    n->num_attrs = t->tn[i].n_attrs;
  }
  memcpy(t->outs, outs, sizeof *outs * (size_t)no);
  t->def.args = &t->arg;
  t->def.num_args = 1;
  t->def.nodes = t->nodes;
  t->def.num_nodes = nn;
  t->def.outputs = t->outs;
  t->def.num_outputs = no;
}

/* Fusion off, so the nodes after the collective stay separate values the
 * planner places (fused, they would write straight into the output). */
static void reg(dev_fn_lib *lib, const tdef *t, bool planning) {
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  o.passes[DEV_PASS_FUSION] = DEV_TRI_OFF;
  o.passes[DEV_PASS_BUFFER_PLANNING] = planning ? DEV_TRI_ON : DEV_TRI_OFF;
  dev_status st = DEV_STATUS_INIT;
  bool existed = true;
  if (dev_fn_register(lib, &t->def, &o, &existed, &st) != PD_OK)
    fail_msg("register %s: %s", t->def.name, st.msg);
}

/* f(x): a = Exp(x); c = COLL(a); h = x*x; h2 = -h; h3 = h2*x; k = h3 + x;
 * o = c*c. Outputs o and k (= x - x^3). */
static void make_coll_fn(tdef *t, const char *name, const char *coll) {
  tnode n[7] = {{"a", "Exp", {"x"}, 1, {0}, 0},
                {"c", coll, {"a"}, 1, {0}, 1},
                {"h", "Mul", {"x", "x"}, 2, {0}, 0},
                {"h2", "Neg", {"h"}, 1, {0}, 0},
                {"h3", "Mul", {"h2", "x"}, 2, {0}, 0},
                {"k", "Add", {"h3", "x"}, 2, {0}, 0},
                {"o", "Mul", {"c", "c"}, 2, {0}, 0}};
  if (!strcmp(coll, "AllGather"))
    n[1].attr = dev_attr_int("axis", 0);
  else if (!strcmp(coll, "Broadcast"))
    n[1].attr = dev_attr_int("root", 1);
  else
    n[1].attr = dev_attr_string("reduction", "sum");
  tdef_make(t, name, n, 7, (dev_fn_output[]){{"o", "o"}, {"k", "k"}}, 2);
}

/* --- references --------------------------------------------------------------- */

/* Rows of shard d of `rows` rows on NDEV devices (dev_shard_shape: the first
 * rows % NDEV shards one row longer). */
static int64_t shard_rows(int64_t rows, int d, int64_t *first) {
  int64_t q = rows / NDEV, r = rows % NDEV;
  *first = d * q + (d < r ? d : r);
  return q + (d < r ? 1 : 0);
}

/* The expected o of component d (want, count in *n) for x of `rows` rows
 * sharded along axis 0. */
static void want_o(const char *coll, const double *x, int64_t rows, int d,
                   double *want, int64_t *n) {
  int64_t f, m;
  if (!strcmp(coll, "AllGather")) { /* exp(x)^2, all rows */
    for (int64_t i = 0; i < rows * COLS; i++) want[i] = exp(2 * x[i]);
    *n = rows * COLS;
    return;
  }
  if (!strcmp(coll, "Broadcast")) { /* root 1's shard */
    m = shard_rows(rows, 1, &f);
    for (int64_t i = 0; i < m * COLS; i++) want[i] = exp(2 * x[f * COLS + i]);
    *n = m * COLS;
    return;
  }
  /* Sum over devices of exp(shard p); every shard has rows / NDEV rows. */
  const int64_t per = rows / NDEV;
  double sum[MAXR * COLS];
  for (int64_t i = 0; i < per * COLS; i++) {
    sum[i] = 0;
    for (int p = 0; p < NDEV; p++) sum[i] += exp(x[p * per * COLS + i]);
  }
  if (!strcmp(coll, "AllReduce")) {
    for (int64_t i = 0; i < per * COLS; i++) want[i] = sum[i] * sum[i];
    *n = per * COLS;
    return;
  }
  m = shard_rows(per, d, &f); /* ReduceScatter: rows of my part */
  for (int64_t i = 0; i < m * COLS; i++)
    want[i] = sum[f * COLS + i] * sum[f * COLS + i];
  *n = m * COLS;
}

/* --- the cases ---------------------------------------------------------------- */

/* Calls fn REPS times with x (rows x COLS, sharded), all queued before any
 * is read, and checks o and k on every component of every call. */
static void run_case(dev_engine *e, dev_fn_lib *lib, const char *fn,
                     const char *coll, int64_t rows) {
  double x[MAXR * COLS];
  tu_fill_random(x, rows * COLS, -1, 1, (uint64_t)rows * 7919u + 1);
  int64_t dims[2] = {rows, COLS};
  dev_tensor *xt = tu_sharded(e, PD_FLOAT32, 2, dims, 0, x);
  dev_tensor *o[REPS], *k[REPS];
  for (int r = 0; r < REPS; r++) {
    dev_op *op = NULL;
    dev_status st = DEV_STATUS_INIT;
    if (dev_fn_prepare_call(lib, fn, &xt, 1, &op, &st) != PD_OK)
      fail_msg("%s: prepare_call: %s", fn, st.msg);
    o[r] = dev_op_output(op, 0);
    k[r] = dev_op_output(op, 1);
    dev_tensor_retain(o[r]);
    dev_tensor_retain(k[r]);
    dev_op_submit(e, op);
  }
  for (int r = 0; r < REPS; r++) {
    for (int d = 0; d < NDEV; d++) {
      double want[MAXR * COLS], kw[MAXR * COLS];
      int64_t n = 0, f;
      want_o(coll, x, rows, d, want, &n);
      tu_assert_tensor_close(o[r], d, want, n, 1e-5, 0);
      int64_t m = shard_rows(rows, d, &f);
      for (int64_t i = 0; i < m * COLS; i++) {
        double v = x[f * COLS + i];
        kw[i] = v - v * v * v;
      }
      tu_assert_tensor_close(k[r], d, kw, m * COLS, 1e-5, 1e-6);
    }
    dev_tensor_release(o[r]);
    dev_tensor_release(k[r]);
  }
  dev_tensor_release(xt);
}

/* One collective: planning on and off, two sizes each. AllGather and
 * Broadcast take x of 8 rows (shards 2,2,2,2) and 10 (3,3,2,2);
 * ReduceScatter and AllReduce need equal components: 32 rows (8 per
 * device; ReduceScatter's parts 2 each) and 40 (10 per device; parts
 * 3,3,2,2). */
static void coll_case(const char *coll) {
  dev_engine *e = tu_engine(NDEV, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  bool gathers = !strcmp(coll, "AllGather") || !strcmp(coll, "Broadcast");
  const int64_t sizes[2] = {gathers ? 8 : 32, gathers ? 10 : 40};
  for (int plan = 0; plan < 2; plan++) {
    char name[32];
    snprintf(name, sizeof name, "%s_%s", coll, plan ? "planned" : "unplanned");
    tdef t;
    make_coll_fn(&t, name, coll);
    reg(lib, &t, plan);
    for (int s = 0; s < 2; s++) run_case(e, lib, name, coll, sizes[s]);
    dev_fn_info info = {.struct_size = sizeof info};
    assert_int_equal(dev_fn_describe(lib, name, &info, NULL), PD_OK);
    assert_int_equal(info.num_instantiations, 2);
    for (int i = 0; i < 2; i++) {
      assert_int_equal(info.insts[i].pass_changes[DEV_PASS_BUFFER_PLANNING] > 0,
                       plan);
      assert_true(info.insts[i].arena_bytes <= info.insts[i].unplanned_bytes);
    }
    dev_fn_def_free(info.def);
    dev_fn_def_free(info.optimized);
  }
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

static void all_gather_inside(void **state) {
  (void)state;
  coll_case("AllGather");
}
static void reduce_scatter_inside(void **state) {
  (void)state;
  coll_case("ReduceScatter");
}
static void broadcast_inside(void **state) {
  (void)state;
  coll_case("Broadcast");
}
static void all_reduce_inside(void **state) {
  (void)state;
  coll_case("AllReduce");
}

/* The plan keeps a collective's input and output until the end of the call:
 * no value placed after it shares their bytes on any device. */
static void plan_keeps_collective_operands(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tdef t;
  make_coll_fn(&t, "ag", "AllGather");
  reg(lib, &t, true);
  double x[8 * COLS] = {0};
  int64_t dims[2] = {8, COLS};
  dev_tensor *xt = tu_sharded(e, PD_FLOAT32, 2, dims, 0, x);
  dev_op *op = NULL;
  assert_int_equal(dev_fn_prepare_call(lib, "ag", &xt, 1, &op, NULL), PD_OK);
  const fn_inst *inst = ((const fn_call_state *)op->fn_call)->inst;
  const fn_graph *g = inst->g;
  assert_true(inst->planned);
  int ci = -1;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].def->flags & DEV_OP_COLLECTIVE) ci = i;
  assert_true(ci >= 0);
  const int in_v = g->nodes[ci].in[0].idx * FN_MAX_NODE_OUTPUTS;
  const int out_v = ci * FN_MAX_NODE_OUTPUTS;
  const size_t nd = (size_t)g->n_dev;
  for (int d = 0; d < g->n_dev; d++) {
    uint64_t a = inst->plan.offset[(size_t)in_v * nd + (size_t)d];
    uint64_t c = inst->plan.offset[(size_t)out_v * nd + (size_t)d];
    assert_true(a != FN_NOT_PLANNED && c != FN_NOT_PLANNED);
    for (int i = ci + 1; i < g->n_nodes; i++) {
      uint64_t off =
          inst->plan.offset[(size_t)(i * FN_MAX_NODE_OUTPUTS) * nd + (size_t)d];
      if (off == FN_NOT_PLANNED) continue;
      assert_true(off != a && off != c);
    }
  }
  dev_op_abandon(op, PD_CANCELLED, "not run");
  dev_tensor_release(xt);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* g(x) = -Gradients(Sum(Square(AllGather(Exp(x)))), x): the loss is the
 * same on every device, AllGather's VJP sums the devices' upstream
 * gradients (a ReduceScatter), so g = -NDEV * 2 exp(2x) on each shard. */
static void gradient_through_all_gather(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tnode n[6] = {{"a", "Exp", {"x"}, 1, {0}, 0},
                {"c", "AllGather", {"a"}, 1, {0}, 1},
                {"sq", "Square", {"c"}, 1, {0}, 0},
                {"s", "Sum", {"sq"}, 1, {0}, 0},
                {"gr", "Gradients", {"s", "x"}, 2, {0}, 0},
                {"ng", "Neg", {"gr"}, 1, {0}, 0}};
  n[1].attr = dev_attr_int("axis", 0);
  for (int plan = 0; plan < 2; plan++) {
    const char *name = plan ? "grad_planned" : "grad_unplanned";
    tdef t;
    tdef_make(&t, name, n, 6, (dev_fn_output[]){{"g", "ng"}, {"s", "s"}}, 2);
    reg(lib, &t, plan);
    for (int rows = 8; rows <= 10; rows += 2) {
      double x[10 * COLS];
      tu_fill_random(x, rows * COLS, -1, 1, 77u + (uint64_t)rows);
      int64_t dims[2] = {rows, COLS};
      dev_tensor *xt = tu_sharded(e, PD_FLOAT32, 2, dims, 0, x);
      double loss = 0;
      for (int i = 0; i < rows * COLS; i++) loss += exp(2 * x[i]);
      dev_tensor *gt[REPS], *lt[REPS];
      for (int r = 0; r < REPS; r++) {
        dev_op *op = NULL;
        dev_status st = DEV_STATUS_INIT;
        if (dev_fn_prepare_call(lib, name, &xt, 1, &op, &st) != PD_OK)
          fail_msg("%s: %s", name, st.msg);
        gt[r] = dev_op_output(op, 0);
        lt[r] = dev_op_output(op, 1);
        dev_tensor_retain(gt[r]);
        dev_tensor_retain(lt[r]);
        dev_op_submit(e, op);
      }
      for (int r = 0; r < REPS; r++) {
        for (int d = 0; d < NDEV; d++) {
          int64_t f, m = shard_rows(rows, d, &f);
          double want[10 * COLS];
          for (int64_t i = 0; i < m * COLS; i++)
            want[i] = -NDEV * 2 * exp(2 * x[f * COLS + i]);
          tu_assert_tensor_close(gt[r], d, want, m * COLS, 1e-5, 0);
          tu_assert_tensor_close(lt[r], d, &loss, 1, 1e-5, 0);
        }
        dev_tensor_release(gt[r]);
        dev_tensor_release(lt[r]);
      }
      dev_tensor_release(xt);
    }
  }
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* --- memory a call holds ------------------------------------------------------ */

/* f(x) = Sum(Exp(Neg(x))) over x [1000] mirrored on NDEV devices: two
 * intermediates of 4000 bytes per device. With planning off each is an
 * allocation of its own: the call's new bytes are its output's (4 bytes per
 * device) plus 8000 per device; with planning on, the arena's (two values
 * live at once: 2 * 4096 aligned per device), never less than what the
 * unplanned run takes minus the alignment. */
static void new_bytes_count_intermediates(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tnode n[3] = {{"a", "Neg", {"x"}, 1, {0}, 0},
                {"b", "Exp", {"a"}, 1, {0}, 0},
                {"s", "Sum", {"b"}, 1, {0}, 0}};
  double x[1000] = {0};
  int64_t dims[1] = {1000};
  dev_tensor *xt = tu_mirrored(e, PD_FLOAT32, 1, dims, x);
  for (int plan = 0; plan < 2; plan++) {
    const char *name = plan ? "hog_planned" : "hog_unplanned";
    tdef t;
    tdef_make(&t, name, n, 3, (dev_fn_output[]){{"s", "s"}}, 1);
    reg(lib, &t, plan);
    dev_op *op = NULL;
    assert_int_equal(dev_fn_prepare_call(lib, name, &xt, 1, &op, NULL), PD_OK);
    assert_int_equal(dev_op_output_bytes(op), 4 * NDEV);
    uint64_t inter = plan ? 2 * 4096 : 2 * 4000;
    assert_int_equal(dev_op_new_bytes(op), 4 * NDEV + inter * NDEV);
    dev_tensor *s = dev_op_output(op, 0);
    dev_tensor_retain(s);
    dev_op_submit(e, op);
    double want = 1000, got;
    tu_read(s, 0, &got, 1);
    tu_assert_close(&got, &want, 1, 1e-6, 0);
    dev_tensor_release(s);
    dev_fn_info info = {.struct_size = sizeof info};
    assert_int_equal(dev_fn_describe(lib, name, &info, NULL), PD_OK);
    /* Comparable figures: both with the arena's alignment. */
    assert_int_equal(info.insts[0].unplanned_bytes, 2 * 4096);
    assert_int_equal(info.insts[0].arena_bytes, plan ? 2 * 4096 : 0);
    dev_fn_def_free(info.def);
    dev_fn_def_free(info.optimized);
  }
  dev_tensor_release(xt);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* A small chain: planned, the arena is never above the unplanned figure
 * (the trial saw 768 against 480 when unplanned was counted unaligned). */
static void arena_not_above_unplanned(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tnode n[4] = {{"a", "Neg", {"x"}, 1, {0}, 0},
                {"b", "Exp", {"a"}, 1, {0}, 0},
                {"c", "Mul", {"a", "b"}, 2, {0}, 0},
                {"o", "Neg", {"c"}, 1, {0}, 0}};
  tdef t;
  tdef_make(&t, "small", n, 4, (dev_fn_output[]){{"o", "o"}}, 1);
  reg(lib, &t, true);
  double x[10] = {0};
  int64_t dims[1] = {10};
  dev_tensor *xt = tu_mirrored(e, PD_FLOAT32, 1, dims, x);
  dev_op *op = NULL;
  assert_int_equal(dev_fn_prepare_call(lib, "small", &xt, 1, &op, NULL), PD_OK);
  dev_op_abandon(op, PD_CANCELLED, "not run");
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "small", &info, NULL), PD_OK);
  /* a, b and c: three 40-byte values, 256 each aligned; a and b are live
   * at c's step, c reuses nothing: arena 768, unplanned 768. */
  assert_int_equal(info.insts[0].unplanned_bytes, 3 * FN_ARENA_ALIGN);
  assert_true(info.insts[0].arena_bytes <= info.insts[0].unplanned_bytes);
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  dev_tensor_release(xt);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

/* --- signatures --------------------------------------------------------------- */

/* x of 10 and 11 rows on 4 devices: both "float32[-1,5] sharded", told
 * apart by their component shapes; even shards need none. */
static void signature_names_components(void **state) {
  (void)state;
  dev_engine *e = tu_engine(NDEV, 0);
  dev_fn_lib *lib = NULL;
  assert_int_equal(dev_fn_lib_create(e, NULL, &lib, NULL), PD_OK);
  tnode n[1] = {{"a", "Neg", {"x"}, 1, {0}, 0}};
  tdef t;
  tdef_make(&t, "neg", n, 1, (dev_fn_output[]){{"o", "a"}}, 1);
  reg(lib, &t, true);
  const int64_t rows[3] = {10, 11, 8};
  for (int i = 0; i < 3; i++) {
    double x[11 * 5] = {0};
    int64_t dims[2] = {rows[i], 5};
    dev_tensor *xt = tu_sharded(e, PD_FLOAT32, 2, dims, 0, x);
    dev_op *op = NULL;
    assert_int_equal(dev_fn_prepare_call(lib, "neg", &xt, 1, &op, NULL), PD_OK);
    dev_op_abandon(op, PD_CANCELLED, "not run");
    dev_tensor_release(xt);
  }
  dev_fn_info info = {.struct_size = sizeof info};
  assert_int_equal(dev_fn_describe(lib, "neg", &info, NULL), PD_OK);
  assert_int_equal(info.num_instantiations, 3);
  /* Most recently used first. */
  assert_string_equal(info.insts[2].signature,
                      "(float32[-1,5] sharded as [3,5],[3,5],[2,5],[2,5])");
  assert_string_equal(info.insts[1].signature,
                      "(float32[-1,5] sharded as [3,5],[3,5],[3,5],[2,5])");
  assert_null(strstr(info.insts[0].signature, " as "));
  assert_non_null(strstr(info.insts[0].signature, "sharded"));
  dev_fn_def_free(info.def);
  dev_fn_def_free(info.optimized);
  dev_fn_lib_destroy(lib);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(all_gather_inside),
      cmocka_unit_test(reduce_scatter_inside),
      cmocka_unit_test(broadcast_inside),
      cmocka_unit_test(all_reduce_inside),
      cmocka_unit_test(plan_keeps_collective_operands),
      cmocka_unit_test(gradient_through_all_gather),
      cmocka_unit_test(new_bytes_count_intermediates),
      cmocka_unit_test(arena_not_above_unplanned),
      cmocka_unit_test(signature_names_components),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
