/* A data-parallel MLP on paradevd (see dp_mlp.h). Every op is a raw op run
 * on all devices of the daemon's mesh; every handle id comes from
 * pd_session_new_id; everything but uploads and the waits at the end of an
 * epoch goes through one Enqueue stream, so the client never waits for the
 * devices during an epoch. */
#include "dp_mlp.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NW                                                                     \
  4 /* weights: W1 [in, hidden], b1 [hidden], W2 [hidden, classes], b2 */

/* The client runs ahead of the devices by at most 2 * SYNC_EVERY steps:
 * every SYNC_EVERY steps it waits until the step SYNC_EVERY back has been
 * computed. Uploads take device memory at once, so an unbounded run-ahead
 * would hold a whole epoch of batches (and its queued ops) in memory. */
#define SYNC_EVERY 16

struct dp_mlp {
  pd_session *s;
  pd_stream *t;
  dp_mlp_config cfg;
  int ndev;
  pd_attrs *a;     /* scratch attributes of the op being queued */
  uint64_t w[NW];  /* the weights (mirrored) */
  uint64_t m1[NW]; /* Adam's first moment, or SGD's velocity */
  uint64_t m2[NW]; /* Adam's second moment */
  uint64_t c_b1, c_1mb1, c_b2, c_1mb2, c_eps, c_mu, c_lr; /* scalars */
  uint64_t acc_loss, acc_correct; /* per device, since the last epoch end */
  uint64_t scale;                 /* n / B for batches of scale_rows rows */
  int scale_rows;
  long steps;
  uint64_t mark;       /* a step's loss, kept to wait on (0: none) */
  uint64_t mark_index; /* the stream item that computes it */
  uint64_t *tmp;       /* handles to delete at the end of the step */
  int ntmp, captmp;
  pd_status *err;   /* the first failure while queueing (sticky) */
  char fn_name[64]; /* the step's function (DP_MLP_FUNCTION), else "" */
  float *xy;        /* function mode: a batch's rows and labels, packed */
  size_t xy_cap;    /* floats xy holds */
};

static const double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-7, kMomentum = 0.9;

/* --- queueing helpers: each does nothing once a call has failed --------------- */

static bool failed(dp_mlp *m) { return pd_status_code(m->err) != PD_OK; }

static void keep_tmp(dp_mlp *m, uint64_t id) {
  if (failed(m) || id == 0) return;
  if (m->ntmp == m->captmp) {
    int cap = m->captmp ? m->captmp * 2 : 64;
    uint64_t *n = realloc(m->tmp, sizeof(*n) * (size_t)cap);
    if (!n) {
      pd_status_set(m->err, PD_RESOURCE_EXHAUSTED, "out of host memory");
      return;
    }
    m->tmp = n;
    m->captmp = cap;
  }
  m->tmp[m->ntmp++] = id;
}

/* Queues `op` on inputs in[0..n) with attrs m->a (cleared afterwards) and
 * returns its first output's fresh id (0 after a failure). With `outs`, the
 * op has n_out outputs whose ids go there. */
static uint64_t opn(dp_mlp *m, const char *op, const uint64_t *in, int n,
                    uint64_t *outs, int n_out) {
  uint64_t one = 0;
  if (!outs) {
    outs = &one;
    n_out = 1;
  }
  for (int i = 0; i < n_out; i++) outs[i] = 0; /* fresh ids */
  if (!failed(m) && pd_stream_execute(m->t, op, in, n, m->a, outs, n_out, NULL,
                                      m->err) != PD_OK)
    outs[0] = 0;
  pd_attrs_clear(m->a);
  return failed(m) ? 0 : outs[0];
}

static uint64_t op1(dp_mlp *m, const char *op, uint64_t x) {
  return opn(m, op, &x, 1, NULL, 0);
}

static uint64_t op2(dp_mlp *m, const char *op, uint64_t x, uint64_t y) {
  const uint64_t in[2] = {x, y};
  return opn(m, op, in, 2, NULL, 0);
}

/* The same, the output kept for deletion at the end of the step. */
static uint64_t t1(dp_mlp *m, const char *op, uint64_t x) {
  uint64_t id = op1(m, op, x);
  keep_tmp(m, id);
  return id;
}

static uint64_t t2(dp_mlp *m, const char *op, uint64_t x, uint64_t y) {
  uint64_t id = op2(m, op, x, y);
  keep_tmp(m, id);
  return id;
}

/* A float32 tensor of `rank` dims filled with v (rank 0: a scalar). */
static uint64_t fill(dp_mlp *m, const int64_t *dims, int rank, double v) {
  pd_attrs_set_shape(m->a, "shape", dims, rank);
  pd_attrs_set_float(m->a, "value", v);
  pd_attrs_set_dtype(m->a, "dtype", PD_FLOAT32);
  return opn(m, "Fill", NULL, 0, NULL, 0);
}

static uint64_t scalar(dp_mlp *m, double v) { return fill(m, NULL, 0, v); }

/* Sum over every axis (an empty axis list). */
static uint64_t sum_all(dp_mlp *m, uint64_t x) { return t1(m, "Sum", x); }

static uint64_t all_reduce(dp_mlp *m, uint64_t x, const char *reduction) {
  pd_attrs_set_string(m->a, "reduction", reduction);
  return t1(m, "AllReduce", x);
}

/* Deletes the step's temporaries with one stream item. */
static void flush_tmp(dp_mlp *m) {
  if (!failed(m) && m->ntmp > 0)
    pd_stream_delete_ids(m->t, m->tmp, m->ntmp, NULL, m->err);
  m->ntmp = 0;
}

static pd_code report(dp_mlp *m, pd_status *st) {
  pd_code rc = pd_status_code(m->err);
  if (rc != PD_OK) pd_status_set(st, rc, pd_status_message(m->err));
  return rc;
}

/* Uploads x (rows x inputs) and y (rows) sharded along the rows. */
static pd_code upload_batch(dp_mlp *m, const float *x, const int32_t *y,
                            int rows, uint64_t *xid, uint64_t *yid) {
  if (failed(m)) return pd_status_code(m->err);
  *xid = pd_session_new_id(m->s);
  *yid = pd_session_new_id(m->s);
  const int64_t dx[2] = {rows, m->cfg.inputs}, dy[1] = {rows};
  if (pd_upload(m->s, *xid, PD_FLOAT32, dx, 2, x,
                sizeof(float) * (size_t)rows * (size_t)m->cfg.inputs,
                pd_layout_sharded(0), NULL, NULL, m->err) != PD_OK ||
      pd_upload(m->s, *yid, PD_INT32, dy, 1, y, sizeof(int32_t) * (size_t)rows,
                pd_layout_sharded(0), NULL, NULL, m->err) != PD_OK)
    return pd_status_code(m->err);
  keep_tmp(m, *xid);
  keep_tmp(m, *yid);
  return PD_OK;
}

/* Function mode's batch: one upload, sharded along the rows, of
 * [rows, inputs + 1] float32 -- each row's features, then its label as a
 * float (exact below 2^24): one RPC per step instead of two. */
static pd_code upload_packed(dp_mlp *m, const float *x, const int32_t *y,
                             int rows, uint64_t *xyid) {
  if (failed(m)) return pd_status_code(m->err);
  size_t w = (size_t)m->cfg.inputs + 1, need = w * (size_t)rows;
  if (need > m->xy_cap) {
    float *n = realloc(m->xy, need * sizeof(float));
    if (!n) {
      pd_status_set(m->err, PD_RESOURCE_EXHAUSTED, "out of host memory");
      return PD_RESOURCE_EXHAUSTED;
    }
    m->xy = n;
    m->xy_cap = need;
  }
  for (int r = 0; r < rows; r++) {
    memcpy(m->xy + (size_t)r * w, x + (size_t)r * (w - 1),
           sizeof(float) * (w - 1));
    m->xy[(size_t)r * w + w - 1] = (float)y[r];
  }
  *xyid = pd_session_new_id(m->s);
  const int64_t dims[2] = {rows, (int64_t)w};
  if (pd_upload(m->s, *xyid, PD_FLOAT32, dims, 2, m->xy, need * sizeof(float),
                pd_layout_sharded(0), NULL, NULL, m->err) != PD_OK)
    return pd_status_code(m->err);
  keep_tmp(m, *xyid);
  return PD_OK;
}

/* logits = relu(x W1 + b1) W2 + b2, every intermediate a temporary. */
static uint64_t forward(dp_mlp *m, uint64_t x) {
  uint64_t h = t2(m, "BiasAdd", t2(m, "MatMul", x, m->w[0]), m->w[1]);
  uint64_t r = t1(m, "Relu", h);
  return t2(m, "BiasAdd", t2(m, "MatMul", r, m->w[2]), m->w[3]);
}

/* Correct predictions among logits' rows: Sum(Cast(Equal(ArgMax, y))). */
static uint64_t count_correct(dp_mlp *m, uint64_t logits, uint64_t y) {
  pd_attrs_set_int(m->a, "axis", 1);
  pd_attrs_set_dtype(m->a, "output_type", PD_INT32);
  uint64_t pred = t1(m, "ArgMax", logits);
  uint64_t eq = t2(m, "Equal", pred, y);
  pd_attrs_set_dtype(m->a, "DstT", PD_FLOAT32);
  return sum_all(m, t1(m, "Cast", eq));
}

/* --- function mode: the step as one graph function ----------------------------- */

/* `pat` with its "%d" (if any) replaced by i, into out[32]. */
static void subst(char out[32], const char *pat, int i) {
  const char *p = strstr(pat, "%d");
  if (p)
    snprintf(out, 32, "%.*s%d%s", (int)(p - pat), pat, i, p + 2);
  else
    snprintf(out, 32, "%s", pat);
}

/* A node of the step's function: `name` (its "%d" replaced by i) runs `op`
 * on the n inputs that follow (each with its "%d" replaced by i too), with
 * attributes m->a (cleared afterwards). Does nothing once a call has
 * failed. */
static void fnode(dp_mlp *m, pd_function *f, const char *name, int i,
                  const char *op, int n, ...) {
  char nm[32], in[4][32];
  const char *ins[4];
  subst(nm, name, i);
  va_list ap;
  va_start(ap, n);
  for (int k = 0; k < n && k < 4; k++) {
    subst(in[k], va_arg(ap, const char *), i);
    ins[k] = in[k];
  }
  va_end(ap);
  if (!failed(m)) pd_function_add_node(f, nm, op, ins, n, m->a, m->err);
  pd_attrs_clear(m->a);
}

/* A float32 scalar constant node. */
static void fconst(dp_mlp *m, pd_function *f, const char *name, double v) {
  pd_attrs_set_shape(m->a, "shape", NULL, 0);
  pd_attrs_set_float(m->a, "value", v);
  pd_attrs_set_dtype(m->a, "dtype", PD_FLOAT32);
  fnode(m, f, name, 0, "Fill", 0);
}

/* The optimizer's update of weight i from its averaged gradient gm<i>:
 * the same ops, in the same order, as eager mode's. */
static void fupdate(dp_mlp *m, pd_function *f, int i) {
  if (m->cfg.optimizer == DP_MLP_ADAM) {
    fnode(m, f, "m1a%d", i, "Mul", 2, "m%d", "beta1");
    fnode(m, f, "m1b%d", i, "Mul", 2, "gm%d", "one_m_beta1");
    fnode(m, f, "m%d_new", i, "Add", 2, "m1a%d", "m1b%d");
    fnode(m, f, "sq%d", i, "Square", 1, "gm%d");
    fnode(m, f, "m2a%d", i, "Mul", 2, "v%d", "beta2");
    fnode(m, f, "m2b%d", i, "Mul", 2, "sq%d", "one_m_beta2");
    fnode(m, f, "v%d_new", i, "Add", 2, "m2a%d", "m2b%d");
    fnode(m, f, "sqrt%d", i, "Sqrt", 1, "v%d_new");
    fnode(m, f, "den%d", i, "Add", 2, "sqrt%d", "eps");
    fnode(m, f, "q%d", i, "Div", 2, "m%d_new", "den%d");
    fnode(m, f, "upd%d", i, "Mul", 2, "q%d", "lr");
  } else {
    fnode(m, f, "va%d", i, "Mul", 2, "m%d", "mu");
    fnode(m, f, "m%d_new", i, "Add", 2, "va%d", "gm%d");
    fnode(m, f, "upd%d", i, "Mul", 2, "m%d_new", "lr");
  }
  fnode(m, f, "w%d_new", i, "Sub", 2, "w%d", "upd%d");
}

/* gm0..gm3 = AllReduce(mean) of g:0..g:3 as ONE collective (gradient
 * bucketing, as DistributedDataParallel's): flattened, joined, all-reduced,
 * cut back. Element by element, so the values of four; one rendezvous. */
static void all_reduce_gradients(dp_mlp *m, pd_function *f) {
  const int64_t in = m->cfg.inputs, hid = m->cfg.hidden, cls = m->cfg.classes;
  const int64_t dims[NW][2] = {{in, hid}, {hid, 0}, {hid, cls}, {cls, 0}};
  for (int i = 0; i < NW; i += 2) { /* the kernels, rank 2 */
    const int64_t flat = dims[i][0] * dims[i][1];
    pd_attrs_set_int_list(m->a, "shape", &flat, 1);
    fnode(m, f, "gflat%d", i, "Reshape", 1, "g:%d");
  }
  pd_attrs_set_int(m->a, "axis", 0);
  fnode(m, f, "gcat", 0, "Concat", 4, "gflat0", "g:1", "gflat2", "g:3");
  pd_attrs_set_string(m->a, "reduction", "mean");
  fnode(m, f, "gall", 0, "AllReduce", 1, "gcat");
  int64_t off = 0;
  for (int i = 0; i < NW; i++) {
    int64_t n = dims[i][0] * (dims[i][1] ? dims[i][1] : 1);
    pd_attrs_set_int_list(m->a, "begin", &off, 1);
    pd_attrs_set_int_list(m->a, "size", &n, 1);
    fnode(m, f, dims[i][1] ? "gpart%d" : "gm%d", i, "Slice", 1, "gall");
    if (dims[i][1]) {
      pd_attrs_set_int_list(m->a, "shape", dims[i], 2);
      fnode(m, f, "gm%d", i, "Reshape", 1, "gpart%d");
    }
    off += n;
  }
}

/* The step of dp_mlp_step as a function. Arguments: xy [rows, inputs + 1]
 * float32 (upload_packed's rows and labels), scale and lr (float32
 * scalars: n/B and the step's rate), w0..w3, m0..m3 (first moment or velocity),
 * v0..v3 (Adam's second moment), acc_loss, acc_correct. Outputs, in order:
 * the new w0..w3, m0..m3, v0..v3 (Adam), acc_loss, acc_correct, and the
 * step's loss (n/B times the shard's summed loss). */
static pd_function *step_function(dp_mlp *m) {
  bool adam = m->cfg.optimizer == DP_MLP_ADAM;
  pd_function *f = pd_function_new(m->fn_name);
  if (!f) {
    pd_status_set(m->err, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  char nm[32];
  pd_function_add_arg(f, "xy", PD_FLOAT32);
  pd_function_add_arg(f, "scale", PD_FLOAT32);
  pd_function_add_arg(f, "lr", PD_FLOAT32);
  const char *state[3] = {"w%d", "m%d", "v%d"};
  for (int k = 0; k < (adam ? 3 : 2); k++)
    for (int i = 0; i < NW; i++) {
      subst(nm, state[k], i);
      pd_function_add_arg(f, nm, PD_FLOAT32);
    }
  pd_function_add_arg(f, "acc_loss", PD_FLOAT32);
  pd_function_add_arg(f, "acc_correct", PD_FLOAT32);

  /* x = xy[:, :inputs], y = int32(xy[:, inputs]) (upload_packed) */
  const int64_t zero2[2] = {0, 0}, xsize[2] = {-1, m->cfg.inputs};
  const int64_t ybegin[2] = {0, m->cfg.inputs}, ysize[2] = {-1, 1}, flat = -1;
  pd_attrs_set_int_list(m->a, "begin", zero2, 2);
  pd_attrs_set_int_list(m->a, "size", xsize, 2);
  fnode(m, f, "x", 0, "Slice", 1, "xy");
  pd_attrs_set_int_list(m->a, "begin", ybegin, 2);
  pd_attrs_set_int_list(m->a, "size", ysize, 2);
  fnode(m, f, "ycol", 0, "Slice", 1, "xy");
  pd_attrs_set_int_list(m->a, "shape", &flat, 1);
  fnode(m, f, "yflat", 0, "Reshape", 1, "ycol");
  pd_attrs_set_dtype(m->a, "DstT", PD_INT32);
  fnode(m, f, "y", 0, "Cast", 1, "yflat");
  fnode(m, f, "mm1", 0, "MatMul", 2, "x", "w0");
  fnode(m, f, "h", 0, "BiasAdd", 2, "mm1", "w1");
  fnode(m, f, "r", 0, "Relu", 1, "h");
  fnode(m, f, "mm2", 0, "MatMul", 2, "r", "w2");
  fnode(m, f, "logits", 0, "BiasAdd", 2, "mm2", "w3");
  fnode(m, f, "xent", 0, "SparseSoftmaxCrossEntropyWithLogits", 2, "logits",
        "y");
  fnode(m, f, "loss_sum", 0, "Sum", 1, "xent:0");
  fnode(m, f, "loss", 0, "Mul", 2, "loss_sum", "scale");
  /* tf.gradients(loss, [w0..w3]): outputs g:0..g:3 */
  if (!failed(m)) {
    const char *gin[5] = {"loss", "w0", "w1", "w2", "w3"};
    pd_function_add_node(f, "g", "Gradients", gin, 5, NULL, m->err);
  }
  all_reduce_gradients(m, f);
  fnode(m, f, "acc_loss_new", 0, "Add", 2, "acc_loss", "loss_sum");
  pd_attrs_set_int(m->a, "axis", 1);
  pd_attrs_set_dtype(m->a, "output_type", PD_INT32);
  fnode(m, f, "pred", 0, "ArgMax", 1, "logits");
  fnode(m, f, "eq", 0, "Equal", 2, "pred", "y");
  pd_attrs_set_dtype(m->a, "DstT", PD_FLOAT32);
  fnode(m, f, "eqf", 0, "Cast", 1, "eq");
  fnode(m, f, "ncorrect", 0, "Sum", 1, "eqf");
  fnode(m, f, "acc_correct_new", 0, "Add", 2, "acc_correct", "ncorrect");
  if (adam) {
    fconst(m, f, "beta1", kBeta1);
    fconst(m, f, "one_m_beta1", 1 - kBeta1);
    fconst(m, f, "beta2", kBeta2);
    fconst(m, f, "one_m_beta2", 1 - kBeta2);
    fconst(m, f, "eps", kEps);
  } else {
    fconst(m, f, "mu", kMomentum);
  }
  for (int i = 0; i < NW; i++) fupdate(m, f, i);

  char src[40];
  for (int k = 0; k < (adam ? 3 : 2) && !failed(m); k++)
    for (int i = 0; i < NW && !failed(m); i++) {
      subst(nm, state[k], i);
      snprintf(src, sizeof src, "%s_new", nm);
      pd_function_add_output(f, nm, src, m->err);
    }
  const char *outs[3][2] = {{"acc_loss", "acc_loss_new"},
                            {"acc_correct", "acc_correct_new"},
                            {"loss", "loss"}};
  for (int k = 0; k < 3 && !failed(m); k++)
    pd_function_add_output(f, outs[k][0], outs[k][1], m->err);
  if (failed(m)) {
    pd_function_delete(f);
    return NULL;
  }
  return f;
}

static pd_code register_step(dp_mlp *m) {
  snprintf(m->fn_name, sizeof m->fn_name, "dp_mlp_step_%s_%d_%d_%d",
           m->cfg.optimizer == DP_MLP_ADAM ? "adam" : "sgd", m->cfg.inputs,
           m->cfg.hidden, m->cfg.classes);
  pd_function *f = step_function(m);
  if (f) pd_register_function(m->s, f, NULL, NULL, m->err);
  pd_function_delete(f);
  return pd_status_code(m->err);
}

const char *dp_mlp_function_name(const dp_mlp *m) { return m->fn_name; }

/* --- the model -------------------------------------------------------------------- */

dp_mlp *dp_mlp_new(pd_session *s, const dp_mlp_config *cfg, pd_status *st) {
  dp_mlp *m = calloc(1, sizeof(*m));
  if (!m || !(m->a = pd_attrs_new()) || !(m->err = pd_status_new())) {
    pd_status_set(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    if (m) pd_attrs_delete(m->a);
    free(m);
    return NULL;
  }
  m->s = s;
  m->cfg = *cfg;
  m->ndev = pd_session_num_devices(s);
  m->t = pd_stream_new(s, NULL, m->err);
  if (!m->t) {
    report(m, st);
    dp_mlp_delete(m);
    return NULL;
  }
  const int64_t shapes[NW][2] = {{cfg->inputs, cfg->hidden},
                                 {cfg->hidden, 0},
                                 {cfg->hidden, cfg->classes},
                                 {cfg->classes, 0}};
  const int ranks[NW] = {2, 1, 2, 1};
  for (int i = 0; i < NW; i++) {
    if (ranks[i] == 2) {
      /* He-normal: stddev sqrt(2 / fan_in). per_device=false: the same
       * stream on every device, so the weights start mirrored. */
      pd_attrs_set_shape(m->a, "shape", shapes[i], 2);
      pd_attrs_set_dtype(m->a, "dtype", PD_FLOAT32);
      pd_attrs_set_int(m->a, "seed", (int64_t)(cfg->seed & INT64_MAX));
      pd_attrs_set_int(m->a, "seed2", i + 1);
      pd_attrs_set_float(m->a, "stddev", sqrt(2.0 / (double)shapes[i][0]));
      pd_attrs_set_bool(m->a, "per_device", false);
      m->w[i] = opn(m, "RandomNormal", NULL, 0, NULL, 0);
    } else {
      m->w[i] = fill(m, shapes[i], 1, 0.0);
    }
    m->m1[i] = fill(m, shapes[i], ranks[i], 0.0);
    if (cfg->optimizer == DP_MLP_ADAM)
      m->m2[i] = fill(m, shapes[i], ranks[i], 0.0);
  }
  m->c_b1 = scalar(m, kBeta1);
  m->c_1mb1 = scalar(m, 1 - kBeta1);
  m->c_b2 = scalar(m, kBeta2);
  m->c_1mb2 = scalar(m, 1 - kBeta2);
  m->c_eps = scalar(m, kEps);
  m->c_mu = scalar(m, kMomentum);
  m->c_lr = scalar(m, cfg->lr);
  m->acc_loss = scalar(m, 0);
  m->acc_correct = scalar(m, 0);
  if (cfg->mode == DP_MLP_FUNCTION && !failed(m)) register_step(m);
  if (report(m, st) != PD_OK) {
    dp_mlp_delete(m);
    return NULL;
  }
  return m;
}

long dp_mlp_steps(const dp_mlp *m) { return m->steps; }

/* Waits until the devices computed the last marked step, then marks `loss`
 * (just queued) as the next one to wait on. */
static void bound_run_ahead(dp_mlp *m, uint64_t loss) {
  if (failed(m)) return;
  if (m->mark) {
    /* The marker's item must have been answered (so that the handle exists)
     * before Sync can name it; it almost always has. */
    if (pd_stream_num_replies(m->t) <= m->mark_index)
      pd_stream_wait(m->t, PD_TIMEOUT_NONE, m->err);
    if (!failed(m)) pd_sync(m->s, &m->mark, 1, NULL, NULL, m->err);
    keep_tmp(m, m->mark);
  }
  m->mark = loss;
  m->mark_index = pd_stream_num_items(m->t) - 1;
}

/* Replaces handle *slot by `id`; the old one is deleted with the step's
 * temporaries. */
static void replace(dp_mlp *m, uint64_t *slot, uint64_t id) {
  keep_tmp(m, *slot);
  *slot = id;
}

/* The loss scale n / B of a batch of `rows` rows (see dp_mlp_step), kept
 * while the batches keep their size: an epoch makes it twice. */
static uint64_t loss_scale(dp_mlp *m, int rows) {
  if (m->scale == 0 || m->scale_rows != rows) {
    keep_tmp(m, m->scale);
    m->scale = scalar(m, (double)m->ndev / (double)rows);
    m->scale_rows = rows;
  }
  return m->scale;
}

/* Function mode's step: the step-dependent scalars, then one call of the
 * step's function whose outputs replace the weights, the optimizer's state
 * and the running sums. */
static void step_call(dp_mlp *m, uint64_t xyid, int rows) {
  bool adam = m->cfg.optimizer == DP_MLP_ADAM;
  uint64_t scale = loss_scale(m, rows);
  uint64_t lr = m->c_lr;
  if (adam) {
    double t = (double)m->steps;
    lr = scalar(m, m->cfg.lr * sqrt(1 - pow(kBeta2, t)) / (1 - pow(kBeta1, t)));
    keep_tmp(m, lr);
  }
  uint64_t in[3 + 3 * NW + 2], out[3 * NW + 3];
  int n = 0, k = 0, n_out = (adam ? 3 : 2) * NW + 3;
  in[n++] = xyid;
  in[n++] = scale;
  in[n++] = lr;
  for (int i = 0; i < NW; i++) in[n++] = m->w[i];
  for (int i = 0; i < NW; i++) in[n++] = m->m1[i];
  for (int i = 0; adam && i < NW; i++) in[n++] = m->m2[i];
  in[n++] = m->acc_loss;
  in[n++] = m->acc_correct;
  opn(m, m->fn_name, in, n, out, n_out);
  if (failed(m)) return;
  for (int i = 0; i < NW; i++) replace(m, &m->w[i], out[k++]);
  for (int i = 0; i < NW; i++) replace(m, &m->m1[i], out[k++]);
  for (int i = 0; adam && i < NW; i++) replace(m, &m->m2[i], out[k++]);
  replace(m, &m->acc_loss, out[k++]);
  replace(m, &m->acc_correct, out[k++]);
  if (m->steps % SYNC_EVERY == 0)
    bound_run_ahead(m, out[k]);
  else
    keep_tmp(m, out[k]);
}

pd_code dp_mlp_step(dp_mlp *m, const float *x, const int32_t *y, int rows,
                    pd_status *st) {
  if (rows <= 0) {
    pd_status_set(st, PD_INVALID_ARGUMENT, "a step needs at least one row");
    return PD_INVALID_ARGUMENT;
  }
  uint64_t xid = 0, yid = 0;
  if (m->cfg.mode == DP_MLP_FUNCTION) {
    if (upload_packed(m, x, y, rows, &xid) != PD_OK) return report(m, st);
    m->steps++;
    step_call(m, xid, rows);
    flush_tmp(m);
    return report(m, st);
  }
  if (upload_batch(m, x, y, rows, &xid, &yid) != PD_OK) return report(m, st);
  m->steps++;

  /* The loss each device differentiates. Its shard holds b_d of the batch's
   * B rows (b_d differs by one between devices, and may be 0, when B does
   * not divide by the mesh size n). A per-device mean over the shard,
   * averaged over the devices, would weight a row of a short shard more
   * than one of a long shard. Instead each device takes the SUM of its
   * rows' losses scaled by n / B: AllReduce(mean) of the gradients is then
   * (1/n) sum_d (n/B) sum_{i in d} grad l_i = (1/B) sum_i grad l_i, exactly
   * the gradient of the mean loss over the whole batch, for any mesh size
   * and any split. */
  uint64_t scale = loss_scale(m, rows);
  uint64_t tape = pd_session_new_id(m->s);
  if (!failed(m)) pd_stream_tape_start(m->t, tape, false, NULL, m->err);
  if (!failed(m)) pd_stream_tape_watch(m->t, tape, m->w, NW, NULL, m->err);
  uint64_t logits = forward(m, xid);
  uint64_t xent[2];
  const uint64_t xin[2] = {logits, yid};
  opn(m, "SparseSoftmaxCrossEntropyWithLogits", xin, 2, xent, 2);
  keep_tmp(m, xent[0]);
  keep_tmp(m, xent[1]);
  uint64_t loss_sum = sum_all(m, xent[0]);
  uint64_t loss = op2(m, "Mul", loss_sum, scale);
  if (m->steps % SYNC_EVERY == 0)
    bound_run_ahead(m, loss);
  else
    keep_tmp(m, loss);
  uint64_t g[NW] = {0, 0, 0, 0};
  if (!failed(m))
    pd_stream_tape_gradient(m->t, tape, loss, m->w, NW, 0, g, NULL, m->err);
  for (int i = 0; i < NW; i++) keep_tmp(m, g[i]);
  /* The one-shot tape has done its work; the ops below are not recorded. */
  if (!failed(m)) pd_stream_tape_delete(m->t, tape, NULL, m->err);
  uint64_t gm[NW];
  for (int i = 0; i < NW; i++) gm[i] = all_reduce(m, g[i], "mean");

  /* Running loss and accuracy, on the devices. */
  replace(m, &m->acc_loss, op2(m, "Add", m->acc_loss, loss_sum));
  replace(m, &m->acc_correct,
          op2(m, "Add", m->acc_correct, count_correct(m, logits, yid)));

  /* The same update on every device, from the same averaged gradients. */
  if (m->cfg.optimizer == DP_MLP_ADAM) {
    double t = (double)m->steps;
    uint64_t lr_t =
        scalar(m, m->cfg.lr * sqrt(1 - pow(kBeta2, t)) / (1 - pow(kBeta1, t)));
    keep_tmp(m, lr_t);
    for (int i = 0; i < NW; i++) {
      uint64_t m1 = op2(m, "Add", t2(m, "Mul", m->m1[i], m->c_b1),
                        t2(m, "Mul", gm[i], m->c_1mb1));
      uint64_t m2 = op2(m, "Add", t2(m, "Mul", m->m2[i], m->c_b2),
                        t2(m, "Mul", t1(m, "Square", gm[i]), m->c_1mb2));
      uint64_t den = t2(m, "Add", t1(m, "Sqrt", m2), m->c_eps);
      uint64_t upd = t2(m, "Mul", t2(m, "Div", m1, den), lr_t);
      replace(m, &m->w[i], op2(m, "Sub", m->w[i], upd));
      replace(m, &m->m1[i], m1);
      replace(m, &m->m2[i], m2);
    }
  } else {
    for (int i = 0; i < NW; i++) {
      uint64_t v = op2(m, "Add", t2(m, "Mul", m->m1[i], m->c_mu), gm[i]);
      replace(m, &m->w[i], op2(m, "Sub", m->w[i], t2(m, "Mul", v, m->c_lr)));
      replace(m, &m->m1[i], v);
    }
  }
  flush_tmp(m);
  return report(m, st);
}

/* Waits for the stream's replies, then downloads a scalar (every component
 * holds it after an AllReduce). */
static pd_code fetch_scalar(dp_mlp *m, uint64_t id, double *out) {
  float v = 0;
  if (!failed(m) && pd_download(m->s, id, pd_layout_mirrored(), &v, sizeof(v),
                                NULL, NULL, NULL, m->err) == PD_OK)
    *out = v;
  return pd_status_code(m->err);
}

pd_code dp_mlp_epoch_end(dp_mlp *m, double *loss_sum, double *correct,
                         pd_status *st) {
  uint64_t tl = all_reduce(m, m->acc_loss, "sum");
  uint64_t tc = all_reduce(m, m->acc_correct, "sum");
  replace(m, &m->acc_loss, scalar(m, 0));
  replace(m, &m->acc_correct, scalar(m, 0));
  keep_tmp(m, m->mark); /* everything is waited for below */
  m->mark = 0;
  /* Every item answered: the handles exist, and no item failed. */
  if (!failed(m)) pd_stream_wait(m->t, PD_TIMEOUT_NONE, m->err);
  fetch_scalar(m, tl, loss_sum);
  fetch_scalar(m, tc, correct);
  flush_tmp(m);
  return report(m, st);
}

pd_code dp_mlp_evaluate(dp_mlp *m, const float *x, const int32_t *y, int rows,
                        double *correct, pd_status *st) {
  uint64_t xid = 0, yid = 0;
  if (upload_batch(m, x, y, rows, &xid, &yid) != PD_OK) return report(m, st);
  uint64_t total = all_reduce(m, count_correct(m, forward(m, xid), yid), "sum");
  if (!failed(m)) pd_stream_wait(m->t, PD_TIMEOUT_NONE, m->err);
  fetch_scalar(m, total, correct);
  flush_tmp(m);
  return report(m, st);
}

pd_code dp_mlp_check_replicas(dp_mlp *m, bool *identical, uint64_t *bytes,
                              pd_status *st) {
  if (!failed(m)) pd_stream_wait(m->t, PD_TIMEOUT_NONE, m->err);
  const size_t n[NW] = {
      (size_t)m->cfg.inputs * (size_t)m->cfg.hidden, (size_t)m->cfg.hidden,
      (size_t)m->cfg.hidden * (size_t)m->cfg.classes, (size_t)m->cfg.classes};
  bool same = true;
  uint64_t total = 0;
  for (int i = 0; i < NW && !failed(m); i++) {
    float **comp = calloc((size_t)m->ndev, sizeof(*comp));
    size_t *cap = calloc((size_t)m->ndev, sizeof(*cap));
    bool ok = comp && cap;
    for (int d = 0; ok && d < m->ndev; d++) {
      cap[d] = n[i] * sizeof(float);
      ok = (comp[d] = malloc(cap[d])) != NULL;
    }
    if (!ok)
      pd_status_set(m->err, PD_RESOURCE_EXHAUSTED, "out of host memory");
    else if (pd_download_components(m->s, m->w[i], m->ndev, (void *const *)comp,
                                    cap, NULL, NULL, m->err) == PD_OK)
      for (int d = 1; d < m->ndev; d++)
        same &= memcmp(comp[0], comp[d], cap[0]) == 0;
    for (int d = 0; comp && d < m->ndev; d++) free(comp[d]);
    free(comp);
    free(cap);
    total += n[i] * sizeof(float);
  }
  if (report(m, st) != PD_OK) return pd_status_code(st);
  *identical = same;
  if (bytes) *bytes = total;
  return PD_OK;
}

const char *const dp_mlp_weight_names[NW] = {"hidden.kernel", "hidden.bias",
                                             "output.kernel", "output.bias"};

/* A call that may take as long as the file does (the default is 10 s). */
static const pd_call_options *long_call(void) {
  static pd_call_options co = PD_CALL_OPTIONS_INITIALIZER;
  co.timeout_ms = 10 * 60 * 1000;
  return &co;
}

pd_code dp_mlp_save(dp_mlp *m, const char *path, bool overwrite,
                    uint64_t *bytes, pd_status *st) {
  if (!failed(m)) pd_stream_wait(m->t, PD_TIMEOUT_NONE, m->err);
  if (failed(m)) return report(m, st);
  pd_save_spec specs[NW];
  for (int i = 0; i < NW; i++) {
    specs[i].name = dp_mlp_weight_names[i];
    specs[i].id = m->w[i];
    specs[i].layout = (pd_layout){PD_LAYOUT_MIRRORED, 0, 0};
  }
  char sizes[64];
  snprintf(sizes, sizeof sizes, "%d-%d-%d", m->cfg.inputs, m->cfg.hidden,
           m->cfg.classes);
  const char *keys[] = {"model", "layers"};
  const char *values[] = {"paradev dp_mlp", sizes};
  pd_save_options so = PD_SAVE_OPTIONS_INITIALIZER;
  so.format = PD_CHECKPOINT_SAFETENSORS;
  so.overwrite = overwrite;
  so.meta_keys = keys;
  so.meta_values = values;
  so.n_meta = 2;
  return pd_save_tensors(m->s, path, specs, NW, &so, bytes, long_call(), st);
}

pd_code dp_mlp_load(dp_mlp *m, const char *path, pd_status *st) {
  if (!failed(m)) pd_stream_wait(m->t, PD_TIMEOUT_NONE, m->err);
  if (failed(m)) return report(m, st);
  const int64_t want[NW][2] = {{m->cfg.inputs, m->cfg.hidden},
                               {m->cfg.hidden, 0},
                               {m->cfg.hidden, m->cfg.classes},
                               {m->cfg.classes, 0}};
  pd_load_spec specs[NW];
  for (int i = 0; i < NW; i++) {
    specs[i] = (pd_load_spec){.name = dp_mlp_weight_names[i],
                              .layout = {PD_LAYOUT_MIRRORED, 0, 0}};
  }
  pd_load *l = NULL;
  pd_code rc =
      pd_load_tensors(m->s, path, specs, NW, NULL, &l, long_call(), st);
  if (rc != PD_OK) return rc;
  uint64_t ids[NW];
  for (int i = 0; i < NW && rc == PD_OK; i++) {
    pd_tensor_info info;
    pd_load_tensor_info(l, i, &info);
    ids[i] = info.id;
    int rank = want[i][1] ? 2 : 1;
    bool ok = info.dtype == PD_FLOAT32 && info.rank == rank &&
              info.dims[0] == want[i][0] &&
              (rank == 1 || info.dims[1] == want[i][1]);
    if (!ok) {
      char msg[256], dims[48];
      if (rank == 2)
        snprintf(dims, sizeof dims, "%lld,%lld", (long long)want[i][0],
                 (long long)want[i][1]);
      else
        snprintf(dims, sizeof dims, "%lld", (long long)want[i][0]);
      snprintf(msg, sizeof msg,
               "%s: weight '%s' is not float32 [%s] as the model's", path,
               dp_mlp_weight_names[i], dims);
      pd_status_set(st, PD_INVALID_ARGUMENT, msg);
      rc = PD_INVALID_ARGUMENT;
    }
  }
  if (rc != PD_OK) {
    pd_delete(m->s, ids, NW, NULL, NULL);
  } else {
    /* The old weights go; the loaded ones are the model's from now on. */
    for (int i = 0; i < NW; i++) {
      keep_tmp(m, m->w[i]);
      m->w[i] = ids[i];
    }
    flush_tmp(m);
    rc = report(m, st);
  }
  pd_load_delete(l);
  return rc;
}

void dp_mlp_delete(dp_mlp *m) {
  if (!m) return;
  if (m->t) {
    /* The session's close frees everything anyway; deleting here keeps a
     * long-lived session tidy. Errors no longer matter. */
    pd_status_set(m->err, PD_OK, NULL);
    keep_tmp(m, m->acc_loss);
    keep_tmp(m, m->acc_correct);
    keep_tmp(m, m->scale);
    keep_tmp(m, m->mark);
    const uint64_t *lists[3] = {m->w, m->m1, m->m2};
    for (int k = 0; k < 3; k++)
      for (int i = 0; i < NW; i++) keep_tmp(m, lists[k][i]);
    const uint64_t consts[7] = {m->c_b1,  m->c_1mb1, m->c_b2, m->c_1mb2,
                                m->c_eps, m->c_mu,   m->c_lr};
    for (int i = 0; i < 7; i++) keep_tmp(m, consts[i]);
    flush_tmp(m);
    pd_stream_close(m->t, 30000, NULL);
    pd_stream_delete(m->t);
  }
  pd_attrs_delete(m->a);
  pd_status_delete(m->err);
  free(m->xy);
  free(m->tmp);
  free(m);
}
