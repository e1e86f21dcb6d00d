/* Linear algebra ops: MatMul, BatchMatMul and BiasAdd.
 *
 * Semantics: TensorFlow raw ops MatMul, BatchMatMulV2 (registered as
 * "BatchMatMul": batch dimensions broadcast as NumPy does) and BiasAdd.
 * Matrix products go to CBLAS (OpenBLAS): float32 and float64 call
 * sgemm/dgemm directly on the tensors, with transposes passed to BLAS and
 * batches walked by pointer arithmetic (no copies); float16 and bfloat16 are
 * widened to float32 scratch, multiplied by sgemm and rounded back to nearest
 * even. */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"

/* BLAS takes int dimensions (blasint is int in OpenBLAS's default build). */
#define BLAS_DIM_MAX ((int64_t)INT_MAX)

#define MASK_MATMUL DEV_MASK_FLOAT
#define MATMUL_DTYPES "float32, float64, float16 or bfloat16"

/* ------------------------------------------------------------------------ */
/* Shared helpers                                                            */

static int64_t num_elements(const dev_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return n;
}

static pd_code check_output(const dev_infer_ctx *c, int i, dev_status *st) {
  size_t bytes;
  return dev_shape_byte_size(c->out_dtype[i], &c->out_shape[i], &bytes, st);
}

/* ------------------------------------------------------------------------ */
/* Matrix products                                                           */

/* One product problem: out[b] = op(x[bx]) * op(y[by]) for every batch index b
 * of the broadcast batch shape, where bx/by follow NumPy broadcasting. */
typedef struct mm_problem {
  bool tx, ty;     /* transpose x / y */
  int64_t m, n, k; /* out matrices are m x n, inner dimension k */
  int64_t xr, xc;  /* stored x matrix rows, columns */
  int64_t yr, yc;  /* stored y matrix rows, columns */
  int nb;          /* batch rank of the output */
  int64_t bdims[PD_MAX_RANK];
  int64_t xstride[PD_MAX_RANK]; /* per batch axis, in elements; 0 broadcasts */
  int64_t ystride[PD_MAX_RANK];
  int64_t batch; /* number of output matrices */
  bool y_single; /* y has one matrix (every batch axis broadcasts) */
} mm_problem;

static void mm_plan(const dev_shape *xs, const dev_shape *ys, bool tx, bool ty,
                    mm_problem *p) {
  memset(p, 0, sizeof *p);
  p->tx = tx;
  p->ty = ty;
  p->xr = xs->dims[xs->rank - 2];
  p->xc = xs->dims[xs->rank - 1];
  p->yr = ys->dims[ys->rank - 2];
  p->yc = ys->dims[ys->rank - 1];
  p->m = tx ? p->xc : p->xr;
  p->k = tx ? p->xr : p->xc;
  p->n = ty ? p->yr : p->yc;
  int xb = xs->rank - 2, yb = ys->rank - 2;
  p->nb = xb > yb ? xb : yb;
  int64_t xs_acc = p->xr * p->xc, ys_acc = p->yr * p->yc;
  int64_t ycount = 1;
  p->batch = 1;
  for (int i = p->nb - 1; i >= 0; i--) {
    int xi = i - (p->nb - xb), yi = i - (p->nb - yb);
    int64_t xd = xi >= 0 ? xs->dims[xi] : 1;
    int64_t yd = yi >= 0 ? ys->dims[yi] : 1;
    int64_t od = xd == 1 ? yd : xd;
    p->bdims[i] = od;
    p->xstride[i] = xd == 1 ? 0 : xs_acc;
    p->ystride[i] = yd == 1 ? 0 : ys_acc;
    xs_acc *= xd;
    ys_acc *= yd;
    ycount *= yd;
    p->batch *= od;
  }
  p->y_single = ycount == 1;
}

/* Calls gemm for one matrix: c[m x n] = op(a) * op(b), row-major, with
 * a's and b's leading dimensions their stored column counts (xc, yc); m may
 * be a multiple of p->m when batches are folded. Requires m, n, k > 0. */
static void gemm_f32(const mm_problem *p, int64_t m, const float *a,
                     const float *b, float *c) {
  cblas_sgemm(CblasRowMajor, p->tx ? CblasTrans : CblasNoTrans,
              p->ty ? CblasTrans : CblasNoTrans, (int)m, (int)p->n, (int)p->k,
              1.0f, a, (int)p->xc, b, (int)p->yc, 0.0f, c, (int)p->n);
}

static void gemm_f64(const mm_problem *p, int64_t m, const double *a,
                     const double *b, double *c) {
  cblas_dgemm(CblasRowMajor, p->tx ? CblasTrans : CblasNoTrans,
              p->ty ? CblasTrans : CblasNoTrans, (int)m, (int)p->n, (int)p->k,
              1.0, a, (int)p->xc, b, (int)p->yc, 0.0, c, (int)p->n);
}

/* Runs the whole (batched) product for float32 or float64 data; one
 * heartbeat per matrix of a batch walked one by one (a long batch is
 * progress, not a wedged kernel: dev_kernel_heartbeat). */
static void mm_run(const dev_kernel_ctx *ctx, const mm_problem *p, bool f64,
                   const void *x, const void *y, void *out) {
  size_t es = f64 ? sizeof(double) : sizeof(float);
  int64_t out_n = p->batch * p->m * p->n;
  if (out_n == 0) return;
  if (p->k == 0) { /* empty sum: zeros */
    memset(out, 0, (size_t)out_n * es);
    return;
  }
  /* Fold the batch into the rows when y is one matrix (then x's matrices are
   * the whole batch, one after another) and x is not transposed: one gemm of
   * (batch*m) x k by k x n. */
  if (p->y_single && !p->tx && p->batch * p->m <= BLAS_DIM_MAX) {
    if (f64)
      gemm_f64(p, p->batch * p->m, x, y, out);
    else
      gemm_f32(p, p->batch * p->m, x, y, out);
    return;
  }
  int64_t idx[PD_MAX_RANK] = {0};
  int64_t xoff = 0, yoff = 0, mn = p->m * p->n;
  for (int64_t b = 0; b < p->batch; b++) {
    if (f64)
      gemm_f64(p, p->m, (const double *)x + xoff, (const double *)y + yoff,
               (double *)out + b * mn);
    else
      gemm_f32(p, p->m, (const float *)x + xoff, (const float *)y + yoff,
               (float *)out + b * mn);
    dev_kernel_heartbeat(ctx);
    for (int i = p->nb - 1; i >= 0; i--) { /* odometer over batch axes */
      xoff += p->xstride[i];
      yoff += p->ystride[i];
      if (++idx[i] < p->bdims[i]) break;
      xoff -= p->xstride[i] * p->bdims[i];
      yoff -= p->ystride[i] * p->bdims[i];
      idx[i] = 0;
    }
  }
}

/* Kernel body shared by MatMul and BatchMatMul. */
static pd_code mm_kernel(dev_kernel_ctx *ctx, bool tx, bool ty,
                         dev_status *st) {
  mm_problem p;
  mm_plan(&ctx->in_shape[0], &ctx->in_shape[1], tx, ty, &p);
  pd_dtype dt = ctx->in_dtype[0];
  if (dt == PD_FLOAT32 || dt == PD_FLOAT64) {
    mm_run(ctx, &p, dt == PD_FLOAT64, ctx->in_data[0], ctx->in_data[1],
           ctx->out_data[0]);
    return PD_OK;
  }
  /* float16 / bfloat16: widen to float32 scratch, sgemm, round back. */
  int64_t nx = num_elements(&ctx->in_shape[0]);
  int64_t ny = num_elements(&ctx->in_shape[1]);
  int64_t no = num_elements(&ctx->out_shape[0]);
  if (no == 0) return PD_OK;
  float *buf = malloc(((size_t)nx + (size_t)ny + (size_t)no) * sizeof(float));
  if (!buf) return dev__scratch_error(ctx, nx + ny + no, st);
  float *fx = buf, *fy = buf + nx, *fo = buf + nx + ny;
  dev__widen_16(dt, ctx->in_data[0], fx, nx);
  dev__widen_16(dt, ctx->in_data[1], fy, ny);
  mm_run(ctx, &p, false, fx, fy, fo);
  dev__narrow_16(dt, fo, ctx->out_data[0], no);
  free(buf);
  return PD_OK;
}

static const char *tf(bool b) { return b ? "true" : "false"; }

/* Checks that every dimension BLAS sees fits its int arguments. */
static pd_code check_blas_dims(const dev_infer_ctx *c, dev_status *st) {
  for (int i = 0; i < 2; i++) {
    const dev_shape *s = &c->in_shape[i];
    for (int d = s->rank - 2; d < s->rank; d++)
      if (s->dims[d] > BLAS_DIM_MAX) {
        char sb[160];
        return dev_error(
            st, PD_INVALID_ARGUMENT,
            "%s: input '%s' has shape %s; matrix dimensions must be "
            "at most %lld (the BLAS limit)",
            c->op->name, c->op->inputs[i].name, dev_shape_str(s, sb, sizeof sb),
            (long long)BLAS_DIM_MAX);
      }
  }
  return PD_OK;
}

/* The inner-dimension check of both products. */
static pd_code check_inner(const dev_infer_ctx *c, const char *tx_name, bool tx,
                           const char *ty_name, bool ty, dev_status *st) {
  const dev_shape *xs = &c->in_shape[0], *ys = &c->in_shape[1];
  int64_t kx = tx ? xs->dims[xs->rank - 2] : xs->dims[xs->rank - 1];
  int64_t ky = ty ? ys->dims[ys->rank - 1] : ys->dims[ys->rank - 2];
  if (kx == ky) return PD_OK;
  char a[160], b[160];
  const char *xn = c->op->inputs[0].name, *yn = c->op->inputs[1].name;
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: inner dimensions differ: %s is %s (%s=%s), %s is %s "
                   "(%s=%s); expected %s's %s (%lld) to equal %s's %s (%lld)",
                   c->op->name, xn, dev_shape_str(xs, a, sizeof a), tx_name,
                   tf(tx), yn, dev_shape_str(ys, b, sizeof b), ty_name, tf(ty),
                   xn, tx ? "rows" : "columns", (long long)kx, yn,
                   ty ? "columns" : "rows", (long long)ky);
}

/* MatMul (TensorFlow raw op): product = op(a) * op(b), a and b matrices. */
static pd_code matmul_infer(dev_infer_ctx *c, dev_status *st) {
  bool ta = c->attrs[0].u.b, tb = c->attrs[1].u.b;
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, MASK_MATMUL, MATMUL_DTYPES, st)) ||
      (rc = dev_check_same_dtype(c, 0, 1, st)) ||
      (rc = dev_check_rank(c, 0, 2, 2, st)) ||
      (rc = dev_check_rank(c, 1, 2, 2, st)) ||
      (rc = check_inner(c, "transpose_a", ta, "transpose_b", tb, st)) ||
      (rc = check_blas_dims(c, st)))
    return rc;
  const dev_shape *as = &c->in_shape[0], *bs = &c->in_shape[1];
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0].rank = 2;
  c->out_shape[0].dims[0] = ta ? as->dims[1] : as->dims[0];
  c->out_shape[0].dims[1] = tb ? bs->dims[0] : bs->dims[1];
  return check_output(c, 0, st);
}

static pd_code matmul_cpu(dev_kernel_ctx *ctx, dev_status *st) {
  return mm_kernel(ctx, ctx->attrs[0].u.b, ctx->attrs[1].u.b, st);
}

/* BatchMatMul (TensorFlow raw op BatchMatMulV2): output[..., :, :] =
 * op(x[..., :, :]) * op(y[..., :, :]) with the batch axes broadcast. */
static pd_code bmm_infer(dev_infer_ctx *c, dev_status *st) {
  bool ax = c->attrs[0].u.b, ay = c->attrs[1].u.b;
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, MASK_MATMUL, MATMUL_DTYPES, st)) ||
      (rc = dev_check_same_dtype(c, 0, 1, st)) ||
      (rc = dev_check_rank(c, 0, 2, PD_MAX_RANK, st)) ||
      (rc = dev_check_rank(c, 1, 2, PD_MAX_RANK, st)) ||
      (rc = check_inner(c, "adj_x", ax, "adj_y", ay, st)) ||
      (rc = check_blas_dims(c, st)))
    return rc;
  const dev_shape *xs = &c->in_shape[0], *ys = &c->in_shape[1];
  int xb = xs->rank - 2, yb = ys->rank - 2, nb = xb > yb ? xb : yb;
  dev_shape *o = &c->out_shape[0];
  o->rank = nb + 2;
  for (int i = 0; i < nb; i++) {
    int xi = i - (nb - xb), yi = i - (nb - yb);
    int64_t xd = xi >= 0 ? xs->dims[xi] : 1;
    int64_t yd = yi >= 0 ? ys->dims[yi] : 1;
    if (xd != yd && xd != 1 && yd != 1) {
      char a[160], b[160];
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "BatchMatMul: batch dimensions do not broadcast: x is %s, "
          "y is %s; x's axis %d is %lld and y's axis %d is %lld, "
          "expected equal sizes or 1",
          dev_shape_str(xs, a, sizeof a), dev_shape_str(ys, b, sizeof b), xi,
          (long long)xd, yi, (long long)yd);
    }
    o->dims[i] = xd == 1 ? yd : xd;
  }
  o->dims[nb] = ax ? xs->dims[xs->rank - 1] : xs->dims[xs->rank - 2];
  o->dims[nb + 1] = ay ? ys->dims[ys->rank - 2] : ys->dims[ys->rank - 1];
  c->out_dtype[0] = c->in_dtype[0];
  return check_output(c, 0, st);
}

static pd_code bmm_cpu(dev_kernel_ctx *ctx, dev_status *st) {
  return mm_kernel(ctx, ctx->attrs[0].u.b, ctx->attrs[1].u.b, st);
}

/* ------------------------------------------------------------------------ */
/* BiasAdd                                                                   */

static bool attr_is(const dev_attr_value *v, const char *s) {
  size_t n = strlen(s);
  return v->u.s.len == n && memcmp(v->u.s.ptr, s, n) == 0;
}

/* BiasAdd (TensorFlow raw op): output = value + bias, bias broadcast along
 * the channel axis (the last for "NHWC", axis 1 for "NCHW"). */
static pd_code biasadd_infer(dev_infer_ctx *c, dev_status *st) {
  const dev_attr_value *fmt = &c->attrs[0];
  bool nchw = attr_is(fmt, "NCHW");
  if (!nchw && !attr_is(fmt, "NHWC")) {
    int len = fmt->u.s.len > 64 ? 64 : (int)fmt->u.s.len;
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "BiasAdd: attribute 'data_format' is \"%.*s\"; expected "
                     "\"NHWC\" or \"NCHW\"",
                     len, fmt->u.s.ptr ? fmt->u.s.ptr : "");
  }
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, DEV_MASK_NUMBER, NULL, st)) ||
      (rc = dev_check_same_dtype(c, 0, 1, st)) ||
      (rc = dev_check_rank(c, 0, 2, PD_MAX_RANK, st)) ||
      (rc = dev_check_rank(c, 1, 1, 1, st)))
    return rc;
  const dev_shape *vs = &c->in_shape[0], *bs = &c->in_shape[1];
  int ch = nchw ? 1 : vs->rank - 1;
  if (bs->dims[0] != vs->dims[ch]) {
    char a[160], b[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "BiasAdd: bias has shape %s but value has shape %s "
                     "(data_format=%s); expected bias of size %lld (value's "
                     "dimension %d)",
                     dev_shape_str(bs, b, sizeof b),
                     dev_shape_str(vs, a, sizeof a), nchw ? "NCHW" : "NHWC",
                     (long long)vs->dims[ch], ch);
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = *vs;
  return check_output(c, 0, st);
}

/* out[(o*C + ch)*inner + i] = v[...] + b[ch]. Integer types add in unsigned
 * arithmetic, so overflow wraps instead of being undefined. */
#define BIAS_LOOP(T, EXPR)                                                     \
  do {                                                                         \
    const T *v = ctx->in_data[0], *bias = ctx->in_data[1];                     \
    T *out = ctx->out_data[0];                                                 \
    for (int64_t o = 0; o < outer; o++)                                        \
      for (int64_t ch = 0; ch < C; ch++) {                                     \
        const T bv = bias[ch];                                                 \
        const T *vr = v + (o * C + ch) * inner;                                \
        T *orow = out + (o * C + ch) * inner;                                  \
        for (int64_t i = 0; i < inner; i++) orow[i] = EXPR;                    \
      }                                                                        \
  } while (0)

static pd_code biasadd_cpu(dev_kernel_ctx *ctx, dev_status *st) {
  const dev_shape *vs = &ctx->in_shape[0];
  bool nchw = attr_is(&ctx->attrs[0], "NCHW");
  int ch_axis = nchw ? 1 : vs->rank - 1;
  int64_t outer = 1, C = vs->dims[ch_axis], inner = 1;
  for (int i = 0; i < ch_axis; i++) outer *= vs->dims[i];
  for (int i = ch_axis + 1; i < vs->rank; i++) inner *= vs->dims[i];
  if (outer * C * inner == 0) return PD_OK;
  switch (ctx->in_dtype[0]) {
    case PD_FLOAT32: BIAS_LOOP(float, vr[i] + bv); break;
    case PD_FLOAT64: BIAS_LOOP(double, vr[i] + bv); break;
    case PD_INT32:
      BIAS_LOOP(int32_t, (int32_t)((uint32_t)vr[i] + (uint32_t)bv));
      break;
    case PD_INT64:
      BIAS_LOOP(int64_t, (int64_t)((uint64_t)vr[i] + (uint64_t)bv));
      break;
    case PD_UINT8: BIAS_LOOP(uint8_t, (uint8_t)(vr[i] + bv)); break;
    case PD_FLOAT16:
      BIAS_LOOP(uint16_t, dev_float_to_half(dev_half_to_float(vr[i]) +
                                            dev_half_to_float(bv)));
      break;
    case PD_BFLOAT16:
      BIAS_LOOP(uint16_t, dev_float_to_bfloat16(dev_bfloat16_to_float(vr[i]) +
                                                dev_bfloat16_to_float(bv)));
      break;
    default:
      return dev_error(st, PD_INTERNAL, "BiasAdd: unexpected dtype %s",
                       pd_dtype_name(ctx->in_dtype[0]));
  }
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */

#define BOOL_ATTR(nm, DOC)                                                     \
  { nm, DEV_ATTR_BOOL, {.type = DEV_ATTR_BOOL, .u.b = false}, .doc = DOC }

static const char *const k_data_formats[] = {"NHWC", "NCHW", NULL};

static dev_op_def matmul_def = {
    .name = "MatMul",
    .num_inputs = 2,
    .inputs = {{"a", false, 0, MASK_MATMUL, NULL, "a matrix"},
               {"b", false, 0, MASK_MATMUL, "same as a", "a matrix"}},
    .num_outputs = 1,
    .outputs = {{"product", false, 0, MASK_MATMUL, "same as a"}},
    .num_attrs = 2,
    .attrs = {BOOL_ATTR("transpose_a", "use a's transpose"),
              BOOL_ATTR("transpose_b", "use b's transpose")},
    .infer = matmul_infer,
    .kernels = {[DEV_BACKEND_CPU] = matmul_cpu},
    .summary =
        "product = op(a) @ op(b) for matrices, op transposing when "
        "transpose_a / transpose_b.",
    .notes =
        "Differs from tf.raw_ops.MatMul: no grad_a / grad_b hint "
        "attributes; floating dtypes only (TF also takes integers).",
};

static dev_op_def bmm_def = {
    .name = "BatchMatMul",
    .num_inputs = 2,
    .inputs = {{"x", false, 0, MASK_MATMUL, NULL, "rank >= 2"},
               {"y", false, 0, MASK_MATMUL, "same as x", "rank >= 2"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, MASK_MATMUL, "same as x"}},
    .num_attrs = 2,
    .attrs = {BOOL_ATTR("adj_x", "use x's last two axes transposed"),
              BOOL_ATTR("adj_y", "use y's last two axes transposed")},
    .infer = bmm_infer,
    .kernels = {[DEV_BACKEND_CPU] = bmm_cpu},
    .summary =
        "output[..., :, :] = op(x[..., :, :]) @ op(y[..., :, :]), the "
        "batch axes broadcast as NumPy does.",
    .notes =
        "Follows tf.raw_ops.BatchMatMulV2 (batch axes broadcast); "
        "tf.raw_ops.BatchMatMul of the same name requires equal batch "
        "axes. Floating dtypes only.",
};

static dev_op_def biasadd_def = {
    .name = "BiasAdd",
    .num_inputs = 2,
    .inputs = {{"value", false, 0, DEV_MASK_NUMBER},
               {"bias", false, 0, DEV_MASK_NUMBER, "same as value", "rank 1"}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_NUMBER, "same as value"}},
    .num_attrs = 1,
    .attrs = {{"data_format",
               DEV_ATTR_STRING,
               {.type = DEV_ATTR_STRING, .u.s = {"NHWC", 4}},
               .doc = "where the channel axis is: last (NHWC) or 1 (NCHW)",
               .allowed = k_data_formats}},
    .infer = biasadd_infer,
    .kernels = {[DEV_BACKEND_CPU] = biasadd_cpu},
    .summary = "output = value + bias, bias broadcast along the channel axis.",
};

/* Registers MatMul, BatchMatMul and BiasAdd with their CPU kernels. */
void dev_register_linalg_ops(void) {
  dev__register_or_die(&matmul_def);
  dev__register_or_die(&bmm_def);
  dev__register_or_die(&biasadd_def);
}
