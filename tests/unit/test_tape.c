/* Tests of the gradient tape (device/tape.c): every vector-Jacobian product
 * against central finite differences in float64, at random shapes, with
 * broadcasting, uneven shards and collectives; then the tape's behaviour
 * (persistent and one-shot use, no path, integer paths, ops without a
 * gradient, argument errors).
 *
 * The finite-difference reference never looks at the tape: for a target T
 * (a parallel tensor) and random upstream weights W it evaluates
 * L = sum over components d and elements i of W[d][i] * T[d][i] with one
 * input element moved by +-h, and compares (L+ - L-) / 2h with the gradient
 * the tape returned for that element of that component. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define MAXIN 6
#define MAXDEV 4

/* --- executing ops with a tape recording them ------------------------------ */

/* The ops of a forward pass go through here: prepare, offer to every tape,
 * submit (what the scheduler does for a session with active tapes). */
typedef struct fx {
  dev_engine *e;
  dev_tape *tapes[2]; /* NULL entries: not recording */
} fx;

static dev_tensor *fx_exec(fx *f, const char *op, dev_tensor *const *in, int n,
                           const dev_attr *attrs, int na, int which) {
  dev_op *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_op_prepare(f->e, op, in, n, attrs, na, &o, &st) != PD_OK)
    fail_msg("%s: %s: %s", op, pd_code_name(st.code), st.msg);
  for (int t = 0; t < 2; t++)
    if (f->tapes[t] && dev_tape_record(f->tapes[t], o, &st) != PD_OK)
      fail_msg("record %s: %s", op, st.msg);
  dev_tensor *out = dev_op_output(o, which);
  assert_non_null(out);
  dev_tensor_retain(out);
  dev_op_submit(f->e, o);
  return out;
}

static dev_tensor *F1(fx *f, const char *op, dev_tensor *a) {
  return fx_exec(f, op, &a, 1, NULL, 0, 0);
}

static dev_tensor *F2(fx *f, const char *op, dev_tensor *a, dev_tensor *b) {
  dev_tensor *in[2] = {a, b};
  return fx_exec(f, op, in, 2, NULL, 0, 0);
}

/* Like F2, releasing both arguments (for chains of temporaries). */
static dev_tensor *F2r(fx *f, const char *op, dev_tensor *a, dev_tensor *b) {
  dev_tensor *r = F2(f, op, a, b);
  dev_tensor_release(a);
  dev_tensor_release(b);
  return r;
}

/* --- host values ------------------------------------------------------------ */

static uint64_t g_seed = 20240611;

/* A pseudo-random integer in [lo, hi]. */
static int64_t rnd(int64_t lo, int64_t hi) {
  double r;
  tu_fill_random(&r, 1, 0, 1, g_seed++);
  int64_t v = lo + (int64_t)(r * (double)(hi - lo + 1));
  return v > hi ? hi : v;
}

static dev_tensor *upload(dev_engine *e, pd_dtype dt, const dev_shape *shapes,
                          double *const *vals) {
  int n = dev_engine_num_devices(e);
  void *bufs[MAXDEV];
  for (int d = 0; d < n; d++) {
    int64_t c = tu_numel(&shapes[d]);
    bufs[d] = malloc((size_t)(c ? c : 1) * pd_dtype_size(dt));
    for (int64_t i = 0; i < c; i++) dev_store_f64(dt, bufs[d], i, vals[d][i]);
  }
  dev_tensor *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_from_components(e, dt, shapes, (const void *const *)bufs, &t,
                                 &st) != PD_OK)
    fail_msg("upload: %s", st.msg);
  for (int d = 0; d < n; d++) free(bufs[d]);
  return t;
}

/* --- the finite-difference check ---------------------------------------------- */

typedef dev_tensor *(*build_fn)(fx *f, dev_tensor *const *in, const void *arg);

/* One gradient check: inputs (per component shapes and value ranges), which
 * of them are sources, and the forward computation. */
typedef struct gspec {
  char name[96];
  int n_dev, n_in;
  pd_dtype dt[MAXIN];
  dev_shape shape[MAXIN][MAXDEV];
  double lo[MAXIN], hi[MAXIN];
  bool diff[MAXIN];     /* watched, and checked */
  bool integral[MAXIN]; /* integer values in [lo, hi) */
  build_fn build;
  const void *arg;
} gspec;

static gspec spec(const char *name, int n_dev, build_fn b, const void *arg) {
  gspec s;
  memset(&s, 0, sizeof s);
  snprintf(s.name, sizeof s.name, "%s", name);
  s.n_dev = n_dev;
  s.build = b;
  s.arg = arg;
  return s;
}

/* Adds an input with the same shape on every component. */
static int add_in(gspec *s, pd_dtype dt, bool diff, double lo, double hi,
                  int rank, const int64_t *dims) {
  int j = s->n_in++;
  assert_true(j < MAXIN);
  s->dt[j] = dt;
  s->diff[j] = diff;
  s->integral[j] = !dev_dtype_is_floating(dt);
  s->lo[j] = lo;
  s->hi[j] = hi;
  for (int d = 0; d < s->n_dev; d++) {
    s->shape[j][d].rank = rank;
    for (int i = 0; i < rank; i++) s->shape[j][d].dims[i] = dims[i];
  }
  return j;
}

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
/* A float64 source of the given shape, values in [lo, hi). */
#define IN_F(s, lo, hi, rank, ...)                                             \
  add_in((s), PD_FLOAT64, true, (lo), (hi), (rank), DIMS(__VA_ARGS__))
/* A float64 input that is not watched. */
#define IN_C(s, lo, hi, rank, ...)                                             \
  add_in((s), PD_FLOAT64, false, (lo), (hi), (rank), DIMS(__VA_ARGS__))
/* An int32 input with values in [lo, hi). */
#define IN_I(s, lo, hi, rank, ...)                                             \
  add_in((s), PD_INT32, false, (lo), (hi), (rank), DIMS(__VA_ARGS__))

/* Splits input j's shape along `axis` across the components (uneven shards). */
static void shard(gspec *s, int j, int axis) {
  dev_shape host = s->shape[j][0];
  for (int d = 0; d < s->n_dev; d++)
    dev_shard_shape(&host, axis, s->n_dev, d, &s->shape[j][d]);
}

typedef struct gvals {
  double *v[MAXIN][MAXDEV];
  int64_t n[MAXIN][MAXDEV];
} gvals;

static void make_vals(const gspec *s, gvals *g) {
  for (int j = 0; j < s->n_in; j++)
    for (int d = 0; d < s->n_dev; d++) {
      int64_t c = tu_numel(&s->shape[j][d]);
      g->n[j][d] = c;
      g->v[j][d] = malloc(sizeof(double) * (size_t)(c ? c : 1));
      tu_fill_random(g->v[j][d], c, s->lo[j], s->hi[j], g_seed++);
      if (s->integral[j])
        for (int64_t i = 0; i < c; i++) g->v[j][d][i] = floor(g->v[j][d][i]);
    }
}

static void free_vals(const gspec *s, gvals *g) {
  for (int j = 0; j < s->n_in; j++)
    for (int d = 0; d < s->n_dev; d++) free(g->v[j][d]);
}

static void upload_all(dev_engine *e, const gspec *s, const gvals *g,
                       dev_tensor **in) {
  for (int j = 0; j < s->n_in; j++)
    in[j] = upload(e, s->dt[j], s->shape[j], g->v[j]);
}

static void release_all(dev_tensor **t, int n) {
  for (int i = 0; i < n; i++) dev_tensor_release(t[i]);
}

/* sum over components and elements of w * target, the target computed
 * without a tape from the values in g. */
static double eval_loss(dev_engine *e, const gspec *s, const gvals *g,
                        double *const *w) {
  dev_tensor *in[MAXIN];
  upload_all(e, s, g, in);
  fx f = {e, {NULL, NULL}};
  dev_tensor *t = s->build(&f, in, s->arg);
  double L = 0;
  for (int d = 0; d < s->n_dev; d++) {
    int64_t c = tu_numel(dev_tensor_component_shape(t, d));
    double *buf = malloc(sizeof(double) * (size_t)(c ? c : 1));
    tu_read(t, d, buf, c);
    for (int64_t i = 0; i < c; i++) L += w[d][i] * buf[i];
    free(buf);
  }
  dev_tensor_release(t);
  release_all(in, s->n_in);
  return L;
}

static void check(const gspec *s) {
  dev_engine *e = tu_engine(s->n_dev, 0);
  gvals g;
  make_vals(s, &g);
  dev_tensor *in[MAXIN];
  upload_all(e, s, &g, in);
  dev_tape *tp = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tape_create(e, false, &tp, &st), PD_OK);
  dev_tensor *src[MAXIN];
  int src_in[MAXIN], ns = 0;
  for (int j = 0; j < s->n_in; j++)
    if (s->diff[j]) {
      assert_int_equal(dev_tape_watch(tp, in[j], &st), PD_OK);
      src_in[ns] = j;
      src[ns++] = in[j];
    }
  fx f = {e, {tp, NULL}};
  dev_tensor *target = s->build(&f, in, s->arg);
  assert_int_equal(dev_tensor_dtype(target), PD_FLOAT64);

  /* Random upstream gradient, one per component. */
  double *w[MAXDEV];
  dev_shape ts[MAXDEV];
  for (int d = 0; d < s->n_dev; d++) {
    ts[d] = *dev_tensor_component_shape(target, d);
    int64_t c = tu_numel(&ts[d]);
    w[d] = malloc(sizeof(double) * (size_t)(c ? c : 1));
    tu_fill_random(w[d], c, -1, 1, g_seed++);
  }
  dev_tensor *wt = upload(e, PD_FLOAT64, ts, w);
  dev_tensor *grads[MAXIN];
  if (dev_tape_gradient(tp, target, src, ns, &wt, grads, &st) != PD_OK)
    fail_msg("%s: gradient: %s: %s", s->name, pd_code_name(st.code), st.msg);
  dev_tape_destroy(tp);
  dev_tensor_release(target);
  dev_tensor_release(wt);
  release_all(in, s->n_in);

  for (int k = 0; k < ns; k++) {
    int j = src_in[k];
    assert_int_equal(dev_tensor_dtype(grads[k]), s->dt[j]);
    for (int d = 0; d < s->n_dev; d++) {
      const dev_shape *gs = dev_tensor_component_shape(grads[k], d);
      if (!dev_shape_equal(gs, &s->shape[j][d])) {
        char a[128], b[128];
        fail_msg("%s: gradient of input %d, component %d has shape %s; want %s",
                 s->name, j, d, dev_shape_str(gs, a, sizeof a),
                 dev_shape_str(&s->shape[j][d], b, sizeof b));
      }
      int64_t c = g.n[j][d];
      double *got = malloc(sizeof(double) * (size_t)(c ? c : 1));
      tu_read(grads[k], d, got, c);
      for (int64_t i = 0; i < c; i++) {
        double v = g.v[j][d][i], h = 1e-5 * fmax(1.0, fabs(v));
        g.v[j][d][i] = v + h;
        double lp = eval_loss(e, s, &g, w);
        g.v[j][d][i] = v - h;
        double lm = eval_loss(e, s, &g, w);
        g.v[j][d][i] = v;
        double want = (lp - lm) / (2 * h);
        if (!(fabs(got[i] - want) <= 1e-6 + 1e-6 * fabs(want)))
          fail_msg(
              "%s: d/d input %d [component %d, element %lld]: tape %.12g, "
              "finite "
              "differences %.12g",
              s->name, j, d, (long long)i, got[i], want);
      }
      free(got);
    }
    dev_tensor_release(grads[k]);
  }
  for (int d = 0; d < s->n_dev; d++) free(w[d]);
  free_vals(s, &g);
  dev_engine_destroy(e);
}

/* --- builders ------------------------------------------------------------------ */

/* One op over the first n_in inputs; the target is output `which`. */
typedef struct opa {
  const char *op;
  int n_in;
  dev_attr attrs[4];
  int na;
  int which;
} opa;

static dev_tensor *b_op(fx *f, dev_tensor *const *in, const void *arg) {
  const opa *a = arg;
  return fx_exec(f, a->op, in, a->n_in, a->attrs, a->na, a->which);
}

/* Random shape of rank lo..hi with dims 1..4. */
static int rand_shape(int64_t *dims, int lo, int hi) {
  int r = (int)rnd(lo, hi);
  for (int i = 0; i < r; i++) dims[i] = rnd(1, 4);
  return r;
}

/* --- elementwise ---------------------------------------------------------------- */

static void test_unary_vjps(void **state) {
  (void)state;
  static const struct {
    const char *op;
    double lo, hi;
  } ops[] = {{"Neg", -2, 2},     {"Exp", -2, 2},     {"Log", 0.5, 3},
             {"Sqrt", 0.5, 3},   {"Rsqrt", 0.5, 3},  {"Square", -2, 2},
             {"Tanh", -2, 2},    {"Sigmoid", -3, 3}, {"Relu", -1, 1},
             {"Identity", -2, 2}};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
    for (int rep = 0; rep < 3; rep++) {
      opa a = {ops[k].op, 1, {{0}}, 0, 0};
      gspec s = spec(ops[k].op, rep == 2 ? 2 : 1, b_op, &a);
      int64_t dims[4];
      int r = rand_shape(dims, rep, 3);
      add_in(&s, PD_FLOAT64, true, ops[k].lo, ops[k].hi, r, dims);
      check(&s);
    }
}

static void test_binary_vjps(void **state) {
  (void)state;
  static const struct {
    const char *op;
    double xlo, xhi, ylo, yhi;
  } ops[] = {{"Add", -2, 2, -2, 2},    {"Sub", -2, 2, -2, 2},
             {"Mul", -2, 2, -2, 2},    {"Div", -2, 2, 0.5, 2},
             {"Pow", 0.5, 2, -2, 2},   {"Maximum", -2, 2, -2, 2},
             {"Minimum", -2, 2, -2, 2}};
  /* x shape, y shape: equal (random), the brief's [3,1,4] + [5,4], a scalar,
   * and both sides broadcast. */
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    opa a = {ops[k].op, 2, {{0}}, 0, 0};
    for (int c = 0; c < 5; c++) {
      char name[64];
      snprintf(name, sizeof name, "%s case %d", ops[k].op, c);
      gspec s = spec(name, 1, b_op, &a);
      int64_t dx[4], dy[4];
      int rx, ry;
      switch (c) {
        case 0:
          rx = ry = rand_shape(dx, 1, 3);
          memcpy(dy, dx, sizeof dx);
          break;
        case 1:
          rx = 3;
          ry = 2;
          memcpy(dx, DIMS(3, 1, 4), 24);
          memcpy(dy, DIMS(5, 4), 16);
          break;
        case 2:
          rx = 2;
          ry = 3;
          memcpy(dx, DIMS(5, 4), 16);
          memcpy(dy, DIMS(3, 1, 4), 24);
          break;
        case 3:
          rx = 0;
          ry = rand_shape(dy, 1, 3);
          break;
        default:
          rx = 2;
          ry = 2;
          memcpy(dx, DIMS(4, 1), 16);
          memcpy(dy, DIMS(1, 3), 16);
          break;
      }
      add_in(&s, PD_FLOAT64, true, ops[k].xlo, ops[k].xhi, rx, dx);
      add_in(&s, PD_FLOAT64, true, ops[k].ylo, ops[k].yhi, ry, dy);
      check(&s);
    }
  }
}

/* x*x + exp(x) - x/(1+x^2): several paths into one tensor are summed. */
static dev_tensor *b_paths(fx *f, dev_tensor *const *in, const void *arg) {
  (void)arg;
  dev_tensor *x = in[0];
  dev_tensor *sq = F2(f, "Mul", x, x);
  dev_tensor *ex = F1(f, "Exp", x);
  dev_tensor *den = F2r(f, "Add", F1(f, "Square", x), F1(f, "OnesLike", x));
  dev_tensor *q = F2r(f, "Div", (dev_tensor_retain(x), x), den);
  return F2r(f, "Sub", F2r(f, "Add", sq, ex), q);
}

static void test_multiple_paths(void **state) {
  (void)state;
  gspec s = spec("x*x + exp(x) - x/(1+x^2)", 2, b_paths, NULL);
  IN_F(&s, -1, 1, 2, 3, 2);
  check(&s);
}

/* --- linear algebra ------------------------------------------------------------- */

static void test_matmul_vjps(void **state) {
  (void)state;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t m = rnd(1, 4), k = rnd(1, 4), n = rnd(1, 4);
      opa a = {
          "MatMul",
          2,
          {dev_attr_bool("transpose_a", ta), dev_attr_bool("transpose_b", tb)},
          2,
          0};
      char name[64];
      snprintf(name, sizeof name, "MatMul ta=%d tb=%d", ta, tb);
      gspec s = spec(name, 2, b_op, &a);
      if (ta)
        IN_F(&s, -1, 1, 2, k, m);
      else
        IN_F(&s, -1, 1, 2, m, k);
      if (tb)
        IN_F(&s, -1, 1, 2, n, k);
      else
        IN_F(&s, -1, 1, 2, k, n);
      check(&s);
    }
}

static void test_batch_matmul_vjps(void **state) {
  (void)state;
  for (int ax = 0; ax < 2; ax++)
    for (int ay = 0; ay < 2; ay++)
      for (int bc = 0; bc < 3; bc++) {
        opa a = {"BatchMatMul",
                 2,
                 {dev_attr_bool("adj_x", ax), dev_attr_bool("adj_y", ay)},
                 2,
                 0};
        char name[64];
        snprintf(name, sizeof name,
                 "BatchMatMul adj_x=%d adj_y=%d batch case %d", ax, ay, bc);
        gspec s = spec(name, 1, b_op, &a);
        int64_t m = rnd(1, 3), k = rnd(1, 3), n = rnd(1, 3);
        int64_t xm[2] = {ax ? k : m, ax ? m : k},
                ym[2] = {ay ? n : k, ay ? k : n};
        switch (bc) {
          case 0: /* same batch */
            IN_F(&s, -1, 1, 3, 2, xm[0], xm[1]);
            IN_F(&s, -1, 1, 3, 2, ym[0], ym[1]);
            break;
          case 1: /* x [2,1,..] with y [3,..]: both broadcast */
            IN_F(&s, -1, 1, 4, 2, 1, xm[0], xm[1]);
            IN_F(&s, -1, 1, 3, 3, ym[0], ym[1]);
            break;
          default: /* y one matrix */
            IN_F(&s, -1, 1, 3, 3, xm[0], xm[1]);
            IN_F(&s, -1, 1, 2, ym[0], ym[1]);
            break;
        }
        check(&s);
      }
}

static void test_bias_add_vjps(void **state) {
  (void)state;
  opa nhwc = {"BiasAdd", 2, {{0}}, 0, 0};
  gspec s = spec("BiasAdd NHWC", 2, b_op, &nhwc);
  IN_F(&s, -1, 1, 3, 2, 3, 4);
  IN_F(&s, -1, 1, 1, 4);
  check(&s);
  opa nchw = {"BiasAdd", 2, {dev_attr_string("data_format", "NCHW")}, 1, 0};
  s = spec("BiasAdd NCHW", 1, b_op, &nchw);
  IN_F(&s, -1, 1, 3, 2, 3, 2);
  IN_F(&s, -1, 1, 1, 3);
  check(&s);
  s = spec("BiasAdd NHWC rank 2, sharded batch", 3, b_op, &nhwc);
  IN_F(&s, -1, 1, 2, 5, 3);
  IN_F(&s, -1, 1, 1, 3);
  shard(&s, 0, 0);
  check(&s);
}

/* --- reductions ------------------------------------------------------------------- */

static void test_reduce_vjps(void **state) {
  (void)state;
  static const struct {
    int n;
    int64_t axes[3];
  } axes[] = {{0, {0}},  {1, {1}},       {2, {0, 2}},
              {1, {-1}}, {3, {2, 0, 1}}, {2, {-2, 0}}};
  const char *ops[] = {"Sum", "Mean"};
  for (int o = 0; o < 2; o++)
    for (size_t k = 0; k < sizeof axes / sizeof axes[0]; k++)
      for (int keep = 0; keep < 2; keep++) {
        opa a = {ops[o],
                 1,
                 {dev_attr_int_list("axis", axes[k].axes, axes[k].n),
                  dev_attr_bool("keep_dims", keep)},
                 2,
                 0};
        char name[80];
        snprintf(name, sizeof name, "%s axes case %zu keep_dims=%d", ops[o], k,
                 keep);
        gspec s = spec(name, 1, b_op, &a);
        IN_F(&s, -1, 1, 3, rnd(1, 4), rnd(1, 4), rnd(1, 4));
        check(&s);
      }
  /* Uneven shards: every component reduces its own count. */
  for (int o = 0; o < 2; o++)
    for (int keep = 0; keep < 2; keep++) {
      int64_t ax0[1] = {0};
      opa all = {ops[o], 1, {dev_attr_bool("keep_dims", keep)}, 1, 0};
      opa first = {
          ops[o],
          1,
          {dev_attr_int_list("axis", ax0, 1), dev_attr_bool("keep_dims", keep)},
          2,
          0};
      gspec s = spec("reduce all, sharded", 3, b_op, &all);
      IN_F(&s, -1, 1, 2, 7, 2);
      shard(&s, 0, 0);
      check(&s);
      s = spec("reduce axis 0, sharded", 3, b_op, &first);
      IN_F(&s, -1, 1, 2, 5, 3);
      shard(&s, 0, 0);
      check(&s);
    }
}

/* --- array ops -------------------------------------------------------------------- */

static void test_array_vjps(void **state) {
  (void)state;
  int64_t shp[2] = {4, -1}, shp1[2] = {-1, 2};
  opa rs = {"Reshape", 1, {dev_attr_int_list("shape", shp, 2)}, 1, 0};
  gspec s = spec("Reshape", 1, b_op, &rs);
  IN_F(&s, -1, 1, 3, 2, 3, 4);
  check(&s);
  opa rs1 = {"Reshape", 1, {dev_attr_int_list("shape", shp1, 2)}, 1, 0};
  s = spec("Reshape, sharded", 3, b_op, &rs1);
  IN_F(&s, -1, 1, 2, 7, 2);
  shard(&s, 0, 0);
  check(&s);

  int64_t perm[3] = {2, 0, 1};
  opa tp = {"Transpose", 1, {dev_attr_int_list("perm", perm, 3)}, 1, 0};
  s = spec("Transpose [2,0,1]", 2, b_op, &tp);
  IN_F(&s, -1, 1, 3, rnd(1, 4), rnd(1, 4), rnd(1, 4));
  check(&s);
  opa tr = {"Transpose", 1, {dev_attr_int_list("perm", NULL, 0)}, 1, 0};
  s = spec("Transpose reversal", 1, b_op, &tr);
  IN_F(&s, -1, 1, 3, 2, 3, 4);
  check(&s);

  opa cc = {"Concat", 3, {dev_attr_int("axis", 1)}, 1, 0};
  s = spec("Concat axis 1", 1, b_op, &cc);
  IN_F(&s, -1, 1, 3, 2, 1, 3);
  IN_C(&s, -1, 1, 3, 2, 2, 3);
  IN_F(&s, -1, 1, 3, 2, 3, 3);
  check(&s);
  opa cc0 = {"Concat", 2, {dev_attr_int("axis", -2)}, 1, 0};
  s = spec("Concat axis 0, sharded", 3, b_op, &cc0);
  IN_F(&s, -1, 1, 2, 5, 2);
  IN_F(&s, -1, 1, 2, 4, 2);
  shard(&s, 0, 0);
  shard(&s, 1, 0);
  check(&s);

  int64_t begin[3] = {1, 0, 2}, size[3] = {2, -1, 1};
  opa sl = {"Slice",
            1,
            {dev_attr_int_list("begin", begin, 3),
             dev_attr_int_list("size", size, 3)},
            2,
            0};
  s = spec("Slice", 2, b_op, &sl);
  IN_F(&s, -1, 1, 3, 4, 3, 4);
  check(&s);
  int64_t b2[2] = {0, 1}, z2[2] = {-1, 1};
  opa sl2 = {
      "Slice",
      1,
      {dev_attr_int_list("begin", b2, 2), dev_attr_int_list("size", z2, 2)},
      2,
      0};
  s = spec("Slice, sharded", 3, b_op, &sl2);
  IN_F(&s, -1, 1, 2, 7, 3);
  shard(&s, 0, 0);
  check(&s);

  opa g0 = {"Gather", 2, {{0}}, 0, 0};
  s = spec("Gather axis 0 (repeated indices)", 1, b_op, &g0);
  IN_F(&s, -1, 1, 2, 3, 2);
  IN_I(&s, 0, 3, 1, 6); /* six indices into three rows: repeats add up */
  check(&s);
  opa g1 = {"Gather", 2, {dev_attr_int("axis", 1)}, 1, 0};
  s = spec("Gather axis 1, 2-d indices", 2, b_op, &g1);
  IN_F(&s, -1, 1, 3, 2, 4, 2);
  IN_I(&s, 0, 4, 2, 2, 3);
  check(&s);
}

/* --- softmax family --------------------------------------------------------------- */

/* Mul(backprop, c): a target that depends on the backprop output. */
static dev_tensor *b_xent_backprop(fx *f, dev_tensor *const *in,
                                   const void *arg) {
  (void)arg;
  dev_tensor *bp =
      fx_exec(f, "SparseSoftmaxCrossEntropyWithLogits", in, 2, NULL, 0, 1);
  dev_tensor *r = F2(f, "Mul", bp, in[2]);
  dev_tensor_release(bp);
  return r;
}

/* loss + sum(backprop * c) per row: both outputs carry gradient. */
static dev_tensor *b_xent_both(fx *f, dev_tensor *const *in, const void *arg) {
  (void)arg;
  dev_tensor *loss =
      fx_exec(f, "SparseSoftmaxCrossEntropyWithLogits", in, 2, NULL, 0, 0);
  dev_tensor *bp =
      fx_exec(f, "SparseSoftmaxCrossEntropyWithLogits", in, 2, NULL, 0, 1);
  int64_t ax = 1;
  dev_attr a = dev_attr_int_list("axis", &ax, 1);
  dev_tensor *m = F2(f, "Mul", bp, in[2]);
  dev_tensor *rs = fx_exec(f, "Sum", &m, 1, &a, 1, 0);
  dev_tensor_release(m);
  dev_tensor_release(bp);
  return F2r(f, "Add", loss, rs);
}

static void test_softmax_vjps(void **state) {
  (void)state;
  const char *ops[] = {"Softmax", "LogSoftmax"};
  for (int o = 0; o < 2; o++) {
    opa a = {ops[o], 1, {{0}}, 0, 0};
    gspec s = spec(ops[o], 2, b_op, &a);
    IN_F(&s, -2, 2, 2, rnd(1, 4), rnd(2, 5));
    check(&s);
    s = spec(ops[o], 1, b_op, &a);
    IN_F(&s, -2, 2, 3, 2, 2, 3);
    check(&s);
  }
  opa x = {"SparseSoftmaxCrossEntropyWithLogits", 2, {{0}}, 0, 0};
  gspec s = spec("SparseSoftmaxCrossEntropyWithLogits loss", 1, b_op, &x);
  IN_F(&s, -2, 2, 2, 4, 5);
  IN_I(&s, 0, 5, 1, 4);
  check(&s);
  s = spec("SparseSoftmaxCrossEntropyWithLogits loss, sharded", 3, b_op, &x);
  IN_F(&s, -2, 2, 2, 7, 3);
  IN_I(&s, 0, 3, 1, 7);
  shard(&s, 0, 0);
  shard(&s, 1, 0);
  check(&s);
  s = spec("SparseSoftmaxCrossEntropyWithLogits backprop", 1, b_xent_backprop,
           NULL);
  IN_F(&s, -2, 2, 2, 3, 4);
  IN_I(&s, 0, 4, 1, 3);
  IN_C(&s, -1, 1, 2, 3, 4);
  check(&s);
  s = spec("SparseSoftmaxCrossEntropyWithLogits both outputs", 2, b_xent_both,
           NULL);
  IN_F(&s, -2, 2, 2, 3, 4);
  IN_I(&s, 0, 4, 1, 3);
  IN_C(&s, -1, 1, 2, 3, 4);
  check(&s);
}

/* --- collectives ---------------------------------------------------------------- */

/* AllReduce(x) * y: every component's result depends on every component of
 * x, and y makes the upstream gradient differ per component. */
static dev_tensor *b_all_reduce(fx *f, dev_tensor *const *in, const void *arg) {
  dev_attr a = dev_attr_string("reduction", arg);
  dev_tensor *r = fx_exec(f, "AllReduce", in, 1, &a, 1, 0);
  return F2r(f, "Mul", r, (dev_tensor_retain(in[1]), in[1]));
}

/* AllReduce of per-shard sums: tanh(AllReduce(Sum(x, axis 0, keep))) with x
 * sharded unevenly. */
static dev_tensor *b_all_reduce_sharded(fx *f, dev_tensor *const *in,
                                        const void *arg) {
  int64_t ax = 0;
  dev_attr s[2] = {dev_attr_int_list("axis", &ax, 1),
                   dev_attr_bool("keep_dims", true)};
  dev_tensor *t = fx_exec(f, "Sum", in, 1, s, 2, 0);
  dev_attr a = dev_attr_string("reduction", arg);
  dev_tensor *r = fx_exec(f, "AllReduce", &t, 1, &a, 1, 0);
  dev_tensor_release(t);
  dev_tensor *y = F1(f, "Tanh", r);
  dev_tensor_release(r);
  return y;
}

static void test_all_reduce_vjps(void **state) {
  (void)state;
  const char *reds[] = {"sum", "mean"};
  for (int r = 0; r < 2; r++) {
    char name[64];
    snprintf(name, sizeof name, "AllReduce %s, per-component values", reds[r]);
    gspec s = spec(name, 3, b_all_reduce, reds[r]);
    IN_F(&s, -1, 1, 2, 2, 3);
    IN_F(&s, -1, 1, 2, 2, 3);
    check(&s);
    snprintf(name, sizeof name, "AllReduce %s of sharded sums", reds[r]);
    s = spec(name, 3, b_all_reduce_sharded, reds[r]);
    IN_F(&s, -1, 1, 2, 7, 2);
    shard(&s, 0, 0);
    check(&s);
  }
}

/* --- the VJPs added with issue #11 (vjp_more.c) ------------------------------ */

static void test_more_vjps(void **state) {
  (void)state;
  opa abs_ = {"Abs", 1, {{0}}, 0, 0};
  gspec s = spec("Abs", 2, b_op, &abs_);
  IN_F(&s, -2, 2, 2, 3, 4);
  check(&s);
  /* Max and Min over axes, with and without keep_dims (random values: no
   * ties; test_fn_gradients checks ties by hand). */
  static const struct {
    int n;
    int64_t axes[2];
  } axes[] = {{0, {0}}, {1, {1}}, {2, {0, 2}}, {1, {-1}}};
  const char *red[] = {"Max", "Min"};
  for (int o = 0; o < 2; o++)
    for (size_t k = 0; k < sizeof axes / sizeof axes[0]; k++)
      for (int keep = 0; keep < 2; keep++) {
        opa a = {red[o],
                 1,
                 {dev_attr_int_list("axis", axes[k].axes, axes[k].n),
                  dev_attr_bool("keep_dims", keep)},
                 2,
                 0};
        char name[80];
        snprintf(name, sizeof name, "%s axes case %zu keep_dims=%d", red[o], k,
                 keep);
        s = spec(name, 1, b_op, &a);
        IN_F(&s, -1, 1, 3, 2, 3, 4);
        check(&s);
      }
  /* Collectives on 3 devices, per-component values. */
  opa bc = {"Broadcast", 1, {dev_attr_int("root", 1)}, 1, 0};
  s = spec("Broadcast root 1", 3, b_op, &bc);
  IN_F(&s, -1, 1, 2, 2, 3);
  check(&s);
  for (int ax = 0; ax < 2; ax++) {
    opa ag = {"AllGather", 1, {dev_attr_int("axis", ax)}, 1, 0};
    s = spec(ax ? "AllGather axis 1" : "AllGather axis 0", 3, b_op, &ag);
    IN_F(&s, -1, 1, 2, 2, 3);
    check(&s);
  }
  opa agu = {"AllGather", 1, {dev_attr_int("axis", 0)}, 1, 0};
  s = spec("AllGather of uneven shards", 3, b_op, &agu);
  IN_F(&s, -1, 1, 2, 7, 2);
  shard(&s, 0, 0);
  check(&s);
  const char *reds[] = {"sum", "mean"};
  for (int r = 0; r < 2; r++) {
    opa rs = {
        "ReduceScatter", 1, {dev_attr_string("reduction", reds[r])}, 1, 0};
    s = spec(r ? "ReduceScatter mean" : "ReduceScatter sum", 3, b_op, &rs);
    IN_F(&s, -1, 1, 2, 7, 2);
    check(&s);
  }
}

/* --- a small MLP -------------------------------------------------------------------- */

/* loss = AllReduce(mean)(Mean(xent(relu(x W1 + b1) W2 + b2, labels)))
 * with x and labels sharded along the batch. */
static dev_tensor *b_mlp(fx *f, dev_tensor *const *in, const void *arg) {
  (void)arg;
  dev_tensor *x = in[0], *w1 = in[1], *b1 = in[2], *w2 = in[3], *b2 = in[4],
             *lab = in[5];
  dev_tensor *h =
      F2r(f, "BiasAdd", F2(f, "MatMul", x, w1), (dev_tensor_retain(b1), b1));
  dev_tensor *a = F1(f, "Relu", h);
  dev_tensor_release(h);
  dev_tensor *logits =
      F2r(f, "BiasAdd", F2r(f, "MatMul", a, (dev_tensor_retain(w2), w2)),
          (dev_tensor_retain(b2), b2));
  dev_tensor *xin[2] = {logits, lab};
  dev_tensor *loss =
      fx_exec(f, "SparseSoftmaxCrossEntropyWithLogits", xin, 2, NULL, 0, 0);
  dev_tensor_release(logits);
  dev_tensor *m = F1(f, "Mean", loss);
  dev_tensor_release(loss);
  dev_attr red = dev_attr_string("reduction", "mean");
  dev_tensor *out = fx_exec(f, "AllReduce", &m, 1, &red, 1, 0);
  dev_tensor_release(m);
  return out;
}

static void mlp_spec(gspec *s, int n_dev, int batch) {
  *s = spec("2-layer MLP", n_dev, b_mlp, NULL);
  IN_C(s, 0, 1, 2, batch, 4); /* x: data, not a source */
  IN_F(s, -1, 1, 2, 4, 5);    /* W1 */
  IN_F(s, -0.5, 0.5, 1, 5);   /* b1 */
  IN_F(s, -1, 1, 2, 5, 3);    /* W2 */
  IN_F(s, -0.5, 0.5, 1, 3);   /* b2 */
  IN_I(s, 0, 3, 1, batch);    /* labels */
  shard(s, 0, 0);
  shard(s, 5, 0);
}

static void test_mlp(void **state) {
  (void)state;
  gspec s;
  mlp_spec(&s, 3, 8); /* shards of 3, 3, 2 rows */
  check(&s);
  mlp_spec(&s, 1, 5);
  check(&s);
}

/* The same MLP in float32 gives the float64 gradients to float32 accuracy. */
static void test_mlp_float32(void **state) {
  (void)state;
  gspec s;
  mlp_spec(&s, 2, 9);
  gvals g;
  make_vals(&s, &g);
  double *got[2][MAXIN][MAXDEV] = {{{0}}};
  for (int pass = 0; pass < 2; pass++) {
    pd_dtype dt = pass ? PD_FLOAT32 : PD_FLOAT64;
    dev_engine *e = tu_engine(s.n_dev, 0);
    gspec sp = s;
    for (int j = 0; j < 5; j++) sp.dt[j] = dt;
    dev_tensor *in[MAXIN];
    upload_all(e, &sp, &g, in);
    dev_tape *tp;
    dev_status st = DEV_STATUS_INIT;
    assert_int_equal(dev_tape_create(e, false, &tp, &st), PD_OK);
    for (int j = 1; j < 5; j++)
      assert_int_equal(dev_tape_watch(tp, in[j], &st), PD_OK);
    fx f = {e, {tp, NULL}};
    dev_tensor *loss = b_mlp(&f, in, NULL);
    dev_tensor *grads[4];
    assert_int_equal(dev_tape_gradient(tp, loss, in + 1, 4, NULL, grads, &st),
                     PD_OK);
    for (int k = 0; k < 4; k++) {
      assert_int_equal(dev_tensor_dtype(grads[k]), dt);
      for (int d = 0; d < s.n_dev; d++) {
        int64_t c = g.n[k + 1][d];
        got[pass][k][d] = malloc(sizeof(double) * (size_t)c);
        tu_read(grads[k], d, got[pass][k][d], c);
      }
      dev_tensor_release(grads[k]);
    }
    dev_tensor_release(loss);
    dev_tape_destroy(tp);
    release_all(in, s.n_in);
    dev_engine_destroy(e);
  }
  for (int k = 0; k < 4; k++)
    for (int d = 0; d < s.n_dev; d++) {
      tu_assert_close(got[1][k][d], got[0][k][d], g.n[k + 1][d], 1e-4, 1e-5);
      free(got[0][k][d]);
      free(got[1][k][d]);
    }
  free_vals(&s, &g);
}

/* --- Cast ----------------------------------------------------------------------- */

/* Cast between floating dtypes passes the gradient back, cast to the
 * input's dtype; float64 -> float32 -> float64 gives w rounded to float32. */
static void test_cast_vjp(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_status st = DEV_STATUS_INIT;
  double xv[6], wv[6], want[6], got[6];
  tu_fill_random(xv, 6, -3, 3, 7);
  tu_fill_random(wv, 6, -1, 1, 8);
  for (int i = 0; i < 6; i++) want[i] = (double)((float)wv[i] * 3.0f);
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 2, DIMS(2, 3), xv);
  dev_tensor *w = tu_mirrored(e, PD_FLOAT64, 2, DIMS(2, 3), wv);
  dev_tape *tp;
  assert_int_equal(dev_tape_create(e, false, &tp, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK);
  fx f = {e, {tp, NULL}};
  dev_attr to32 = dev_attr_dtype("DstT", PD_FLOAT32),
           to64 = dev_attr_dtype("DstT", PD_FLOAT64);
  dev_tensor *x32 = fx_exec(&f, "Cast", &x, 1, &to32, 1, 0);
  dev_tensor *three = fx_exec(
      &f, "Fill", NULL, 0,
      (dev_attr[]){dev_attr_shape("shape", 0, NULL), dev_attr_float("value", 3),
                   dev_attr_dtype("dtype", PD_FLOAT32)},
      3, 0);
  dev_tensor *y32 = F2(&f, "Mul", x32, three);
  dev_tensor *y = fx_exec(&f, "Cast", &y32, 1, &to64, 1, 0);
  dev_tensor *g;
  assert_int_equal(dev_tape_gradient(tp, y, &x, 1, &w, &g, &st), PD_OK);
  assert_int_equal(dev_tensor_dtype(g), PD_FLOAT64);
  for (int d = 0; d < 2; d++) {
    tu_read(g, d, got, 6);
    tu_assert_close(got, want, 6, 0, 0);
  }
  dev_tensor *all[] = {x, w, x32, three, y32, y, g};
  release_all(all, 7);
  dev_tape_destroy(tp);
  dev_engine_destroy(e);
}

/* --- the tape's behaviour ---------------------------------------------------------- */

/* Reads component d of t and compares with want (n elements). */
static void expect(dev_tensor *t, int d, const double *want, int64_t n) {
  double *got = malloc(sizeof(double) * (size_t)(n ? n : 1));
  assert_int_equal(tu_read(t, d, got, n), n);
  tu_assert_close(got, want, n, 1e-12, 1e-12);
  free(got);
}

static void test_persistent_twice(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_status st = DEV_STATUS_INIT;
  const double xv[3] = {1, -2, 3}, yv[3] = {0.5, 4, -1};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 1, DIMS(3), xv);
  dev_tensor *y = tu_mirrored(e, PD_FLOAT64, 1, DIMS(3), yv);
  dev_tape *tp;
  assert_int_equal(dev_tape_create(e, true, &tp, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, y, &st), PD_OK);
  fx f = {e, {tp, NULL}};
  dev_tensor *xy = F2(&f, "Mul", x, y); /* x*y */
  dev_tensor *z = F2(&f, "Mul", xy, x); /* x^2 y */
  dev_tensor *src[2] = {x, y}, *g[2];
  for (int rep = 0; rep < 2; rep++) {
    /* d(x^2 y)/dx = 2xy, /dy = x^2 */
    assert_int_equal(dev_tape_gradient(tp, z, src, 2, NULL, g, &st), PD_OK);
    double gx[3], gy[3];
    for (int i = 0; i < 3; i++) {
      gx[i] = 2 * xv[i] * yv[i];
      gy[i] = xv[i] * xv[i];
    }
    for (int d = 0; d < 2; d++) {
      expect(g[0], d, gx, 3);
      expect(g[1], d, gy, 3);
    }
    release_all(g, 2);
  }
  /* A different target on the same tape: d(xy)/dx = y. */
  assert_int_equal(dev_tape_gradient(tp, xy, src, 1, NULL, g, &st), PD_OK);
  expect(g[0], 1, yv, 3);
  dev_tensor_release(g[0]);
  /* Ops recorded after a gradient are on the tape too. */
  dev_tensor *w = F1(&f, "Exp", y);
  assert_int_equal(dev_tape_gradient(tp, w, src + 1, 1, NULL, g, &st), PD_OK);
  double ey[3];
  for (int i = 0; i < 3; i++) ey[i] = exp(yv[i]);
  expect(g[0], 0, ey, 3);
  dev_tensor_release(g[0]);
  dev_tensor *all[] = {x, y, xy, z, w};
  release_all(all, 5);
  dev_tape_destroy(tp);
  dev_engine_destroy(e);
}

static void test_one_shot(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 0);
  dev_status st = DEV_STATUS_INIT;
  const double xv[2] = {3, -1};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 1, DIMS(2), xv);
  dev_tape *tp;
  assert_int_equal(dev_tape_create(e, false, &tp, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK);
  fx f = {e, {tp, NULL}};
  dev_tensor *y = F1(&f, "Square", x);
  /* A failing call does not use the tape up. */
  dev_tensor *bad_src = NULL, *g = NULL;
  assert_int_equal(dev_tape_gradient(tp, y, &bad_src, 1, NULL, &g, &st),
                   PD_INVALID_ARGUMENT);
  assert_null(g);
  assert_int_equal(dev_tape_gradient(tp, y, &x, 1, NULL, &g, &st), PD_OK);
  expect(g, 0, (const double[]){6, -2}, 2);
  dev_tensor_release(g);
  g = NULL;
  dev_status_clear(&st);
  assert_int_equal(dev_tape_gradient(tp, y, &x, 1, NULL, &g, &st),
                   PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "one-shot"));
  assert_null(g);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_FAILED_PRECONDITION);
  /* Recording on a used one-shot tape does nothing. */
  dev_tensor *z = F1(&f, "Exp", y);
  dev_tensor *all[] = {x, y, z};
  release_all(all, 3);
  dev_tape_destroy(tp);
  dev_engine_destroy(e);
}

static void test_no_path(void **state) {
  (void)state;
  dev_engine *e = tu_engine(3, 0);
  dev_status st = DEV_STATUS_INIT;
  double v[7] = {1, 2, 3, 4, 5, 6, 7};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 1, DIMS(3), v);
  dev_tensor *y =
      tu_sharded(e, PD_FLOAT64, 2, DIMS(7, 1), 0, v);        /* 3, 2, 2 rows */
  dev_tensor *u = tu_mirrored(e, PD_FLOAT64, 1, DIMS(2), v); /* never watched */
  dev_tape *tp;
  assert_int_equal(dev_tape_create(e, true, &tp, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, y, &st), PD_OK);
  fx f = {e, {tp, NULL}};
  dev_tensor *tx = F1(&f, "Exp", x);
  dev_tensor *ty =
      F1(&f, "Exp", y); /* recorded, but not on the target's path */
  dev_tensor *src[3] = {y, u, x}, *g[3];
  assert_int_equal(dev_tape_gradient(tp, tx, src, 3, NULL, g, &st), PD_OK);
  const double zeros[3] = {0, 0, 0};
  for (int d = 0; d < 3; d++) {
    const dev_shape *s = dev_tensor_component_shape(g[0], d);
    assert_true(dev_shape_equal(s, dev_tensor_component_shape(y, d)));
    expect(g[0], d, zeros, d == 0 ? 3 : 2);
    expect(g[1], d, zeros, 2);
  }
  double ex[3];
  for (int i = 0; i < 3; i++) ex[i] = exp(v[i]);
  expect(g[2], 2, ex, 3);
  release_all(g, 3);
  /* A target that is a source gets the upstream gradient; an unrelated
   * target gives zeros. */
  assert_int_equal(dev_tape_gradient(tp, x, src + 2, 1, NULL, g, &st), PD_OK);
  expect(g[0], 1, (const double[]){1, 1, 1}, 3);
  dev_tensor_release(g[0]);
  assert_int_equal(dev_tape_gradient(tp, u, src + 2, 1, NULL, g, &st), PD_OK);
  expect(g[0], 0, zeros, 3);
  dev_tensor_release(g[0]);
  /* No sources at all. */
  assert_int_equal(dev_tape_gradient(tp, tx, NULL, 0, NULL, NULL, &st), PD_OK);
  dev_tensor *all[] = {x, y, u, tx, ty};
  release_all(all, 5);
  dev_tape_destroy(tp);
  dev_engine_destroy(e);
}

/* Integer and bool values carry no gradient: x's gradient comes only
 * through the floating path; ArgMax and casts to integers cut the path. */
static void test_integer_paths(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_status st = DEV_STATUS_INIT;
  const double xv[6] = {0.5, 2.5, -1, 3, 1.5, -2};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 2, DIMS(2, 3), xv);
  const double iv[3] = {1, 2, 3};
  dev_tensor *k = tu_mirrored(e, PD_INT32, 1, DIMS(3), iv);
  dev_tape *tp;
  assert_int_equal(dev_tape_create(e, false, &tp, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, k, &st), PD_OK); /* accepted, ignored */
  fx f = {e, {tp, NULL}};
  dev_attr to_i = dev_attr_dtype("DstT", PD_INT32),
           to_f = dev_attr_dtype("DstT", PD_FLOAT64);
  dev_tensor *xi = fx_exec(&f, "Cast", &x, 1, &to_i, 1, 0);
  dev_tensor *xf = fx_exec(&f, "Cast", &xi, 1, &to_f, 1, 0);
  dev_attr am = dev_attr_int("axis", 1);
  dev_tensor *idx = fx_exec(&f, "ArgMax", &x, 1, &am, 1, 0);
  dev_tensor *idxf = fx_exec(&f, "Cast", &idx, 1, &to_f, 1, 0);
  int64_t rs[2] = {2, 1};
  dev_attr ra = dev_attr_int_list("shape", rs, 2);
  dev_tensor *idx2 = fx_exec(&f, "Reshape", &idxf, 1, &ra, 1, 0);
  dev_tensor *gt = F2(&f, "Greater", x, xf); /* bool */
  dev_tensor *gtf = fx_exec(&f, "Cast", &gt, 1, &to_f, 1, 0);
  /* target = 2x + cast(cast(x)) + argmax + (x > cast(cast(x))) */
  dev_tensor *t =
      F2r(&f, "Add", F2(&f, "Add", x, x), (dev_tensor_retain(xf), xf));
  t = F2r(&f, "Add", t, (dev_tensor_retain(idx2), idx2));
  t = F2r(&f, "Add", t, (dev_tensor_retain(gtf), gtf));
  dev_tensor *src[2] = {x, k}, *g[2];
  assert_int_equal(dev_tape_gradient(tp, t, src, 2, NULL, g, &st), PD_OK);
  expect(g[0], 1, (const double[]){2, 2, 2, 2, 2, 2}, 6);
  assert_int_equal(dev_tensor_dtype(g[1]), PD_INT32);
  expect(g[1], 0, (const double[]){0, 0, 0}, 3);
  release_all(g, 2);
  /* An integer target is refused. */
  dev_tape *tp2;
  assert_int_equal(dev_tape_create(e, true, &tp2, &st), PD_OK);
  assert_int_equal(dev_tape_gradient(tp2, idx, &x, 1, NULL, g, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "int64"));
  dev_tape_destroy(tp2);
  dev_tensor *all[] = {x, k, xi, xf, idx, idxf, idx2, gt, gtf, t};
  release_all(all, 10);
  dev_tape_destroy(tp);
  dev_engine_destroy(e);
}

/* An op with no gradient on the path is INVALID_ARGUMENT naming it; off the
 * path it does not matter. */
static void test_no_vjp(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_status st = DEV_STATUS_INIT;
  const double xv[4] = {1, -2, 3, -4};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 2, DIMS(2, 2), xv);
  dev_tape *tp;
  assert_int_equal(dev_tape_create(e, true, &tp, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK);
  fx f = {e, {tp, NULL}};
  /* SliceGrad has no VJP (Abs and Max got theirs with issue #11). */
  dev_tensor *g = NULL;
  {
    const int64_t begin[2] = {0, 0};
    dev_attr b = dev_attr_int_list("begin", begin, 2);
    dev_tensor *in2[2] = {x, x};
    dev_tensor *a = fx_exec(&f, "SliceGrad", in2, 2, &b, 1, 0);
    dev_tensor *t = F1(&f, "Exp", a);
    dev_status_clear(&st);
    assert_int_equal(dev_tape_gradient(tp, t, &x, 1, NULL, &g, &st),
                     PD_INVALID_ARGUMENT);
    assert_null(g);
    if (!strstr(st.msg, "SliceGrad"))
      fail_msg("message \"%s\" does not name SliceGrad", st.msg);
    dev_tensor_release(a);
    dev_tensor_release(t);
  }
  dev_attr mx = dev_attr_string("reduction", "max");
  dev_tensor *ar = fx_exec(&f, "AllReduce", &x, 1, &mx, 1, 0);
  assert_int_equal(dev_tape_gradient(tp, ar, &x, 1, NULL, &g, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "AllReduce with reduction 'max'"));
  /* Abs of something that is not a source's descendant: no error. */
  dev_tensor *c = tu_mirrored(e, PD_FLOAT64, 2, DIMS(2, 2), xv);
  dev_tensor *ac = F1(&f, "Abs", c);
  dev_tensor *t = F2(&f, "Mul", ac, x);
  assert_int_equal(dev_tape_gradient(tp, t, &x, 1, NULL, &g, &st), PD_OK);
  expect(g, 0, (const double[]){1, 2, 3, 4}, 4);
  dev_tensor *all[] = {x, ar, c, ac, t, g};
  release_all(all, 6);
  dev_tape_destroy(tp);
  dev_engine_destroy(e);
}

static void test_errors(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0), *e2 = tu_engine(2, 0);
  dev_status st = DEV_STATUS_INIT;
  const double v[6] = {1, 2, 3, 4, 5, 6};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 2, DIMS(2, 3), v);
  dev_tensor *other = tu_mirrored(e2, PD_FLOAT64, 2, DIMS(2, 3), v);
  dev_tensor *w23f = tu_mirrored(e, PD_FLOAT32, 2, DIMS(2, 3), v);
  dev_tensor *w32 = tu_mirrored(e, PD_FLOAT64, 2, DIMS(3, 2), v);
  dev_tape *tp;
  assert_int_equal(dev_tape_create(e, true, &tp, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, NULL, &st), PD_INVALID_ARGUMENT);
  assert_int_equal(dev_tape_watch(tp, other, &st), PD_FAILED_PRECONDITION);
  assert_int_equal(dev_tape_record(tp, NULL, &st), PD_INVALID_ARGUMENT);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK);
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK); /* twice: no-op */
  /* An op of another engine. */
  dev_op *op;
  assert_int_equal(dev_op_prepare(e2, "Exp", &other, 1, NULL, 0, &op, &st),
                   PD_OK);
  assert_int_equal(dev_tape_record(tp, op, &st), PD_FAILED_PRECONDITION);
  dev_op_abandon(op, PD_CANCELLED, "test");
  /* Recording one op twice records it once. */
  assert_int_equal(
      dev_op_prepare(e, "Mul", (dev_tensor *[]){x, x}, 2, NULL, 0, &op, &st),
      PD_OK);
  assert_int_equal(dev_tape_record(tp, op, &st), PD_OK);
  assert_int_equal(dev_tape_record(tp, op, &st), PD_OK);
  dev_tensor *y = dev_op_output(op, 0);
  dev_tensor_retain(y);
  dev_op_submit(e, op);
  dev_tensor *g = NULL;
  assert_int_equal(dev_tape_gradient(tp, y, &x, 1, NULL, &g, &st), PD_OK);
  expect(g, 1, (const double[]){2, 4, 6, 8, 10, 12}, 6);
  dev_tensor_release(g);
  g = NULL;

  assert_int_equal(dev_tape_gradient(NULL, y, &x, 1, NULL, &g, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(dev_tape_gradient(tp, NULL, &x, 1, NULL, &g, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(dev_tape_gradient(tp, y, &x, -1, NULL, &g, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(dev_tape_gradient(tp, y, NULL, 1, NULL, &g, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(dev_tape_gradient(tp, y, &other, 1, NULL, &g, &st),
                   PD_FAILED_PRECONDITION);
  assert_int_equal(dev_tape_gradient(tp, other, &x, 1, NULL, &g, &st),
                   PD_FAILED_PRECONDITION);
  assert_int_equal(dev_tape_gradient(tp, y, &x, 1, &w23f, &g, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "output gradient has dtype float32"));
  assert_int_equal(dev_tape_gradient(tp, y, &x, 1, &w32, &g, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "shape [3, 2]"));
  assert_null(g);
  dev_tape_destroy(NULL);
  dev_tensor *all[] = {x, other, w23f, w32, y};
  release_all(all, 5);
  dev_tape_destroy(tp);
  dev_engine_destroy(e);
  dev_engine_destroy(e2);
}

/* Two tapes at once each see the ops; a failure while running (a bad
 * Gather index) shows on the gradient tensors, asynchronously. */
static void test_two_tapes_and_async_failure(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_status st = DEV_STATUS_INIT;
  const double xv[3] = {1, 2, 3}, iv[2] = {0, 5};
  dev_tensor *x = tu_mirrored(e, PD_FLOAT64, 1, DIMS(3), xv);
  dev_tensor *bad = tu_mirrored(e, PD_INT32, 1, DIMS(2), iv);
  dev_tape *t1, *t2;
  assert_int_equal(dev_tape_create(e, false, &t1, &st), PD_OK);
  assert_int_equal(dev_tape_create(e, false, &t2, &st), PD_OK);
  assert_int_equal(dev_tape_watch(t1, x, &st), PD_OK);
  fx f = {e, {t1, t2}};
  dev_tensor *y =
      F1(&f, "Sigmoid", x); /* only t1 records: t2 watches nothing yet */
  assert_int_equal(dev_tape_watch(t2, y, &st), PD_OK);
  dev_tensor *z = F2(&f, "Mul", y, y);
  dev_tensor *g1, *g2;
  assert_int_equal(dev_tape_gradient(t1, z, &x, 1, NULL, &g1, &st), PD_OK);
  assert_int_equal(dev_tape_gradient(t2, z, &x, 1, NULL, &g2, &st), PD_OK);
  double want[3];
  for (int i = 0; i < 3; i++) {
    double s = 1 / (1 + exp(-xv[i]));
    want[i] = 2 * s * s * (1 - s);
  }
  expect(g1, 0, want, 3);
  expect(g2, 1, (const double[]){0, 0, 0}, 3); /* x is not on t2 */
  release_all((dev_tensor *[]){g1, g2, y, z}, 4);
  dev_tape_destroy(t1);
  dev_tape_destroy(t2);

  dev_tape *t3;
  assert_int_equal(dev_tape_create(e, false, &t3, &st), PD_OK);
  assert_int_equal(dev_tape_watch(t3, x, &st), PD_OK);
  f.tapes[0] = t3;
  f.tapes[1] = NULL;
  dev_tensor *gth = F2(&f, "Gather", x, bad);
  assert_int_equal(dev_tape_gradient(t3, gth, &x, 1, NULL, &g1, &st), PD_OK);
  assert_int_equal(dev_tensor_wait(g1, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "Gather"));
  release_all((dev_tensor *[]){g1, gth, x, bad}, 4);
  dev_tape_destroy(t3);
  dev_engine_destroy(e);
}

/* --- a deferred queue, as the daemon's scheduler keeps per session -------- */

typedef struct dq {
  dev_engine *e;
  dev_op *ops[64];
  int n;
  int exec_calls;
} dq;

static dev_tensor *dq_prepare(dq *q, dev_tape *tp, const char *op,
                              dev_tensor *const *in, int n,
                              const dev_attr *attrs, int na) {
  dev_op *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_op_prepare(q->e, op, in, n, attrs, na, &o, &st) != PD_OK)
    fail_msg("%s: %s", op, st.msg);
  if (tp && dev_tape_record(tp, o, &st) != PD_OK)
    fail_msg("record: %s", st.msg);
  dev_tensor *out = dev_op_output(o, 0);
  dev_tensor_retain(out);
  assert_true(q->n < 64);
  q->ops[q->n++] = o;
  return out;
}

static pd_code dq_exec(void *arg, const char *op, dev_tensor *const *in, int n,
                       const dev_attr *attrs, int na, dev_tensor **outs,
                       int *n_out, dev_status *st) {
  dq *q = arg;
  q->exec_calls++;
  dev_op *o = NULL;
  pd_code rc = dev_op_prepare(q->e, op, in, n, attrs, na, &o, st);
  if (rc != PD_OK) return rc;
  if (*n_out < dev_op_num_outputs(o)) {
    dev_op_abandon(o, PD_CANCELLED, "no room");
    return dev_error(st, PD_INVALID_ARGUMENT, "no room for outputs");
  }
  *n_out = dev_op_num_outputs(o);
  for (int i = 0; i < *n_out; i++) {
    outs[i] = dev_op_output(o, i);
    dev_tensor_retain(outs[i]);
  }
  assert_true(q->n < 64);
  q->ops[q->n++] = o;
  return PD_OK;
}

/* Gradient ops go through the tape's executor: with the forward ops still
 * unsubmitted in a queue, the gradient's ops queue after them and the whole
 * queue then runs in order. d/dx sum(x*x + x) = 2x + 1. */
static void test_gradient_through_deferred_executor(void **state) {
  dev_engine *e = tu_engine(2, 0);
  dq q = {.e = e};
  dev_tape *tp;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tape_create(e, false, &tp, &st), PD_OK);
  dev_tape_set_executor(tp, dq_exec, &q);
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT64, 1, (int64_t[]){3}, (double[]){1, 2, -3});
  assert_int_equal(dev_tape_watch(tp, x, &st), PD_OK);
  dev_tensor *xx[2] = {x, x};
  dev_tensor *sq = dq_prepare(&q, tp, "Mul", xx, 2, NULL, 0);
  dev_tensor *ys[2] = {sq, x};
  dev_tensor *y = dq_prepare(&q, tp, "Add", ys, 2, NULL, 0);
  dev_tensor *loss = dq_prepare(&q, tp, "Sum", &y, 1, NULL, 0);
  int forward = q.n;
  dev_tensor *g = NULL;
  assert_int_equal(dev_tape_gradient(tp, loss, &x, 1, NULL, &g, &st), PD_OK);
  assert_true(q.exec_calls > 0);
  assert_true(q.n >
              forward); /* the gradient's ops queued behind the forward ops */
  for (int i = 0; i < q.n; i++) dev_op_submit(e, q.ops[i]);
  double got[3];
  tu_read(g, 1, got, 3);
  tu_assert_close(got, ((double[]){3, 5, -5}), 3, 1e-12, 0);
  dev_tensor *ts[] = {x, sq, y, loss, g};
  for (int i = 0; i < 5; i++) dev_tensor_release(ts[i]);
  dev_tape_destroy(tp);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unary_vjps),
      cmocka_unit_test(test_binary_vjps),
      cmocka_unit_test(test_multiple_paths),
      cmocka_unit_test(test_matmul_vjps),
      cmocka_unit_test(test_batch_matmul_vjps),
      cmocka_unit_test(test_bias_add_vjps),
      cmocka_unit_test(test_reduce_vjps),
      cmocka_unit_test(test_array_vjps),
      cmocka_unit_test(test_softmax_vjps),
      cmocka_unit_test(test_all_reduce_vjps),
      cmocka_unit_test(test_more_vjps),
      cmocka_unit_test(test_mlp),
      cmocka_unit_test(test_mlp_float32),
      cmocka_unit_test(test_cast_vjp),
      cmocka_unit_test(test_persistent_twice),
      cmocka_unit_test(test_one_shot),
      cmocka_unit_test(test_no_path),
      cmocka_unit_test(test_integer_paths),
      cmocka_unit_test(test_no_vjp),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_two_tapes_and_async_failure),
      cmocka_unit_test(test_gradient_through_deferred_executor),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
