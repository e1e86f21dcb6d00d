/* The softmax family: Softmax and LogSoftmax over the last axis, and
 * SparseSoftmaxCrossEntropyWithLogits (loss and backprop per row), after the
 * TensorFlow raw ops of the same names. Row sums accumulate in double;
 * float16/bfloat16 go through float32 scratch (reduce_int.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"
#include "ops/reduce_int.h"

/* ------------------------------------------------------------------------ */
/* Softmax, LogSoftmax                                                       */

/* Softmax / LogSoftmax (TensorFlow raw ops) over the last axis:
 * softmax = exp(x - max) / sum(exp(x - max)),
 * logsoftmax = (x - max) - log(sum(exp(x - max))). */
static pd_code softmax_infer(dev_infer_ctx *c, dev_status *st) {
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, DEV_MASK_FLOAT, NULL, st)) ||
      (rc = dev_check_rank(c, 0, 1, PD_MAX_RANK, st)))
    return rc;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[0];
  return check_output(c, 0, st);
}

/* Row kernels; `log` selects LogSoftmax. Sums accumulate in double. */
static void softmax_rows_f32(const float *in, float *out, int64_t rows,
                             int64_t L, bool lg) {
  for (int64_t r = 0; r < rows; r++) {
    const float *x = in + r * L;
    float *y = out + r * L;
    float m = x[0];
    for (int64_t j = 1; j < L; j++) m = x[j] > m ? x[j] : m;
    double s = 0.0;
    if (lg) {
      for (int64_t j = 0; j < L; j++) s += expf(x[j] - m);
      double ls = log(s);
      for (int64_t j = 0; j < L; j++) y[j] = (float)((double)(x[j] - m) - ls);
    } else {
      for (int64_t j = 0; j < L; j++) {
        float e = expf(x[j] - m);
        y[j] = e;
        s += e;
      }
      double inv = 1.0 / s;
      for (int64_t j = 0; j < L; j++) y[j] = (float)(y[j] * inv);
    }
  }
}

static void softmax_rows_f64(const double *in, double *out, int64_t rows,
                             int64_t L, bool lg) {
  for (int64_t r = 0; r < rows; r++) {
    const double *x = in + r * L;
    double *y = out + r * L;
    double m = x[0];
    for (int64_t j = 1; j < L; j++) m = x[j] > m ? x[j] : m;
    double s = 0.0;
    if (lg) {
      for (int64_t j = 0; j < L; j++) s += exp(x[j] - m);
      double ls = log(s);
      for (int64_t j = 0; j < L; j++) y[j] = (x[j] - m) - ls;
    } else {
      for (int64_t j = 0; j < L; j++) {
        y[j] = exp(x[j] - m);
        s += y[j];
      }
      for (int64_t j = 0; j < L; j++) y[j] /= s;
    }
  }
}

static bool is_log_softmax(const dev_kernel_ctx *ctx) {
  return ctx->op->name[0] == 'L';
}

static void softmax_geom(const dev_shape *s, int64_t *rows, int64_t *L) {
  *L = s->dims[s->rank - 1];
  *rows = 1;
  for (int i = 0; i < s->rank - 1; i++) *rows *= s->dims[i];
}

static pd_code softmax_half_body(dev_kernel_ctx *ctx, const float *in,
                                 float *out, float *out2, dev_status *st) {
  int64_t rows, L;
  softmax_geom(&ctx->in_shape[0], &rows, &L);
  softmax_rows_f32(in, out, rows, L, is_log_softmax(ctx));
  return PD_OK;
}

static pd_code softmax_cpu(dev_kernel_ctx *ctx, dev_status *st) {
  int64_t rows, L;
  softmax_geom(&ctx->in_shape[0], &rows, &L);
  if (rows * L == 0) return PD_OK;
  bool lg = is_log_softmax(ctx);
  switch (ctx->in_dtype[0]) {
    case PD_FLOAT32:
      softmax_rows_f32(ctx->in_data[0], ctx->out_data[0], rows, L, lg);
      return PD_OK;
    case PD_FLOAT64:
      softmax_rows_f64(ctx->in_data[0], ctx->out_data[0], rows, L, lg);
      return PD_OK;
    default:
      return run_widened(ctx, softmax_half_body, rows * L, rows * L, 0, st);
  }
}

/* ------------------------------------------------------------------------ */
/* SparseSoftmaxCrossEntropyWithLogits                                       */

/* SparseSoftmaxCrossEntropyWithLogits (TensorFlow raw op): for features
 * [batch, classes] and labels [batch],
 * loss[b] = logsumexp(features[b]) - features[b, labels[b]] and
 * backprop[b] = softmax(features[b]) - onehot(labels[b]).
 * A label outside [0, classes) fails the op when it runs. */
static pd_code sxent_infer(dev_infer_ctx *c, dev_status *st) {
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, DEV_MASK_FLOAT, NULL, st)) ||
      (rc = dev_check_dtype_in(
           c, 1, DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64), NULL,
           st)) ||
      (rc = dev_check_rank(c, 0, 2, 2, st)) ||
      (rc = dev_check_rank(c, 1, 1, 1, st)))
    return rc;
  const dev_shape *fs = &c->in_shape[0], *ls = &c->in_shape[1];
  char a[160], b[160];
  if (fs->dims[0] != ls->dims[0])
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "SparseSoftmaxCrossEntropyWithLogits: features has shape "
                     "%s but labels has shape %s; expected labels of shape "
                     "[%lld] (features' batch dimension)",
                     dev_shape_str(fs, a, sizeof a),
                     dev_shape_str(ls, b, sizeof b), (long long)fs->dims[0]);
  if (fs->dims[0] > 0 && fs->dims[1] == 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "SparseSoftmaxCrossEntropyWithLogits: features has shape "
                     "%s; expected at least one class",
                     dev_shape_str(fs, a, sizeof a));
  c->out_dtype[0] = c->out_dtype[1] = c->in_dtype[0];
  c->out_shape[0].rank = 1;
  c->out_shape[0].dims[0] = fs->dims[0];
  c->out_shape[1] = *fs;
  PD_TRY(check_output(c, 0, st));
  return check_output(c, 1, st);
}

static int64_t label_at(const dev_kernel_ctx *ctx, int64_t i) {
  if (ctx->in_dtype[1] == PD_INT32)
    return ((const int32_t *)ctx->in_data[1])[i];
  return ((const int64_t *)ctx->in_data[1])[i];
}

static pd_code check_labels(const dev_kernel_ctx *ctx, int64_t batch,
                            int64_t classes, dev_status *st) {
  for (int64_t i = 0; i < batch; i++) {
    int64_t l = label_at(ctx, i);
    if (l < 0 || l >= classes)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "SparseSoftmaxCrossEntropyWithLogits: Received a label "
                       "value of %lld which is outside the valid range of "
                       "[0, %lld) (labels[%lld])",
                       (long long)l, (long long)classes, (long long)i);
  }
  return PD_OK;
}

#define DEFINE_SXENT(FN, T, EXP)                                               \
  static void FN(const dev_kernel_ctx *ctx, const T *f, T *loss, T *bp,        \
                 int64_t batch, int64_t C) {                                   \
    for (int64_t b = 0; b < batch; b++) {                                      \
      const T *x = f + b * C;                                                  \
      T *g = bp + b * C;                                                       \
      int64_t lab = label_at(ctx, b);                                          \
      T m = x[0];                                                              \
      for (int64_t j = 1; j < C; j++) m = x[j] > m ? x[j] : m;                 \
      double s = 0.0;                                                          \
      for (int64_t j = 0; j < C; j++) {                                        \
        T e = EXP(x[j] - m);                                                   \
        g[j] = e;                                                              \
        s += e;                                                                \
      }                                                                        \
      double inv = 1.0 / s;                                                    \
      for (int64_t j = 0; j < C; j++) g[j] = (T)(g[j] * inv);                  \
      g[lab] -= (T)1;                                                          \
      loss[b] = (T)(log(s) - (double)(x[lab] - m));                            \
    }                                                                          \
  }

DEFINE_SXENT(sxent_f32, float, expf)
DEFINE_SXENT(sxent_f64, double, exp)

static pd_code sxent_half_body(dev_kernel_ctx *ctx, const float *in, float *out,
                               float *out2, dev_status *st) {
  const dev_shape *fs = &ctx->in_shape[0];
  sxent_f32(ctx, in, out, out2, fs->dims[0], fs->dims[1]);
  return PD_OK;
}

static pd_code sxent_cpu(dev_kernel_ctx *ctx, dev_status *st) {
  const dev_shape *fs = &ctx->in_shape[0];
  int64_t batch = fs->dims[0], C = fs->dims[1];
  pd_code rc = check_labels(ctx, batch, C, st);
  if (rc) return rc;
  if (batch == 0) return PD_OK;
  switch (ctx->in_dtype[0]) {
    case PD_FLOAT32:
      sxent_f32(ctx, ctx->in_data[0], ctx->out_data[0], ctx->out_data[1], batch,
                C);
      return PD_OK;
    case PD_FLOAT64:
      sxent_f64(ctx, ctx->in_data[0], ctx->out_data[0], ctx->out_data[1], batch,
                C);
      return PD_OK;
    default:
      return run_widened(ctx, sxent_half_body, batch * C, batch, batch * C, st);
  }
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */

static dev_op_def softmax_def = {
    .name = "Softmax",
    .num_inputs = 1,
    .inputs = {{"logits", false, 0, DEV_MASK_FLOAT, NULL, "rank >= 1"}},
    .num_outputs = 1,
    .outputs = {{"softmax", false, 0, DEV_MASK_FLOAT, "same as logits"}},
    .infer = softmax_infer,
    .kernels = {[DEV_BACKEND_CPU] = softmax_cpu},
    .summary = "softmax = exp(logits) / sum(exp(logits)) along the last axis.",
};

static dev_op_def log_softmax_def = {
    .name = "LogSoftmax",
    .num_inputs = 1,
    .inputs = {{"logits", false, 0, DEV_MASK_FLOAT, NULL, "rank >= 1"}},
    .num_outputs = 1,
    .outputs = {{"logsoftmax", false, 0, DEV_MASK_FLOAT, "same as logits"}},
    .infer = softmax_infer,
    .kernels = {[DEV_BACKEND_CPU] = softmax_cpu},
    .summary =
        "logsoftmax = logits - log(sum(exp(logits))) along the last "
        "axis.",
};

static dev_op_def sxent_def = {
    .name = "SparseSoftmaxCrossEntropyWithLogits",
    .num_inputs = 2,
    .inputs = {{"features", false, 0, DEV_MASK_FLOAT, NULL,
                "[batch, classes] logits"},
               {"labels", false, 0,
                DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64), NULL,
                "[batch] class indices in 0..classes-1"}},
    .num_outputs = 2,
    .outputs = {{"loss", false, 0, DEV_MASK_FLOAT, "same as features",
                 "[batch]"},
                {"backprop", false, 0, DEV_MASK_FLOAT, "same as features",
                 "[batch, classes]: softmax(features) - onehot(labels)"}},
    .infer = sxent_infer,
    .kernels = {[DEV_BACKEND_CPU] = sxent_cpu},
    .summary =
        "Per-example cross-entropy of softmax(features) against "
        "integer labels, and its gradient with respect to features.",
};

/* Registers Softmax, LogSoftmax and SparseSoftmaxCrossEntropyWithLogits
 * with their CPU kernels. */
void dev_register_softmax_ops(void) {
  dev__register_or_die(&softmax_def);
  dev__register_or_die(&log_softmax_def);
  dev__register_or_die(&sxent_def);
}
