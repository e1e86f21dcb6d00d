/* MatMul and BatchMatMul through cuBLAS (device/ops/linalg.c's semantics:
 * TensorFlow's MatMul and BatchMatMulV2, batch axes broadcast as NumPy).
 *
 * cuBLAS is column-major and our tensors row-major: a row-major matrix is
 * its transpose in column-major, so C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T, i.e. gemm(opB, opA, n, m, k, B, A, C) with the
 * leading dimensions of the stored rows. No copies, no explicit transposes.
 *
 * Types: float32 in float32 (CUBLAS_COMPUTE_32F: exact float32 products;
 * TF32 tensor cores only when the backend allows them), float64 in float64,
 * float16 and bfloat16 on tensor cores with float32 accumulation (the CPU
 * kernel also accumulates them in float32).
 *
 * Batches: when y is one matrix and x is not transposed, the batch folds
 * into the rows (one gemm, as the CPU kernel). Otherwise batch axes whose
 * strides chain are merged and each remaining run is one strided-batched
 * call (stride 0 for a broadcast operand); the usual cases are one call. */
#include <limits.h>
#include <string.h>

#include "cuda_int.h"

typedef struct mm_problem {
  bool tx, ty;
  int64_t m, n, k;
  int64_t xr, xc, yr, yc;
  int nb;
  int64_t bdims[PD_MAX_RANK];
  int64_t xstride[PD_MAX_RANK];
  int64_t ystride[PD_MAX_RANK];
  int64_t batch;
  bool y_single;
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
  int64_t xs_acc = p->xr * p->xc, ys_acc = p->yr * p->yc, ycount = 1;
  p->batch = 1;
  for (int i = p->nb - 1; i >= 0; i--) {
    int xi = i - (p->nb - xb), yi = i - (p->nb - yb);
    int64_t xd = xi >= 0 ? xs->dims[xi] : 1;
    int64_t yd = yi >= 0 ? ys->dims[yi] : 1;
    p->bdims[i] = xd == 1 ? yd : xd;
    p->xstride[i] = xd == 1 ? 0 : xs_acc;
    p->ystride[i] = yd == 1 ? 0 : ys_acc;
    xs_acc *= xd;
    ys_acc *= yd;
    ycount *= yd;
    p->batch *= p->bdims[i];
  }
  p->y_single = ycount == 1;
}

/* Merges batch axes whose strides chain (outer stride = inner stride x inner
 * dim, in x, y and the output alike) and drops axes of 1. */
static void mm_merge_batch(mm_problem *p) {
  int64_t bd[PD_MAX_RANK], xs[PD_MAX_RANK], ys[PD_MAX_RANK], os[PD_MAX_RANK];
  int nb = 0;
  int64_t ostride = p->m * p->n, oacc = ostride;
  int64_t oall[PD_MAX_RANK];
  for (int i = p->nb - 1; i >= 0; i--) {
    oall[i] = oacc;
    oacc *= p->bdims[i];
  }
  for (int i = 0; i < p->nb; i++) {
    if (p->bdims[i] == 1) continue;
    if (nb > 0) {
      int j = nb - 1;
      if (xs[j] == p->xstride[i] * p->bdims[i] &&
          ys[j] == p->ystride[i] * p->bdims[i] &&
          os[j] == oall[i] * p->bdims[i]) {
        bd[j] *= p->bdims[i];
        xs[j] = p->xstride[i];
        ys[j] = p->ystride[i];
        os[j] = oall[i];
        continue;
      }
    }
    bd[nb] = p->bdims[i];
    xs[nb] = p->xstride[i];
    ys[nb] = p->ystride[i];
    os[nb] = oall[i];
    nb++;
  }
  p->nb = nb;
  for (int i = 0; i < nb; i++) {
    p->bdims[i] = bd[i];
    p->xstride[i] = xs[i];
    p->ystride[i] = ys[i];
  }
}

static pd_code cublas_error(dev_kernel_ctx *ctx, cublasStatus_t s,
                            const char *what, dev_status *st) {
  dev_backend *b = ctx->backend;
  cudaError_t ce = cudaGetLastError();
  if (ce != cudaSuccess) return dev_cuda_fail(b, ctx->device, ce, what, st);
  if (s == CUBLAS_STATUS_ALLOC_FAILED)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: %s: cuBLAS could not allocate GPU memory",
                     b->device_name(b, ctx->device), what);
  return dev_error(st, PD_INTERNAL, "%s: %s failed: %s (%s)",
                   b->device_name(b, ctx->device), what,
                   cublasGetStatusString(s), cublasGetStatusName(s));
}

typedef struct mm_types {
  cudaDataType_t data;
  cublasComputeType_t compute;
  const void *alpha, *beta;
  size_t es;
} mm_types;

static bool mm_types_for(pd_dtype dt, bool tf32, mm_types *t) {
  static const float f1 = 1.0f, f0 = 0.0f;
  static const double d1 = 1.0, d0 = 0.0;
  t->alpha = &f1;
  t->beta = &f0;
  t->compute = CUBLAS_COMPUTE_32F;
  switch (dt) {
    case PD_FLOAT32:
      t->data = CUDA_R_32F;
      if (tf32) t->compute = CUBLAS_COMPUTE_32F_FAST_TF32;
      t->es = 4;
      return true;
    case PD_FLOAT64:
      t->data = CUDA_R_64F;
      t->compute = CUBLAS_COMPUTE_64F;
      t->alpha = &d1;
      t->beta = &d0;
      t->es = 8;
      return true;
    case PD_FLOAT16:
      t->data = CUDA_R_16F;
      t->es = 2;
      return true;
    case PD_BFLOAT16:
      t->data = CUDA_R_16BF;
      t->es = 2;
      return true;
    default: return false;
  }
}

static pd_code mm_kernel(dev_kernel_ctx *ctx, bool tx, bool ty,
                         dev_status *st) {
  dev_backend *b = ctx->backend;
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[ctx->device];
  mm_problem p;
  mm_plan(&ctx->in_shape[0], &ctx->in_shape[1], tx, ty, &p);
  mm_types t;
  if (!mm_types_for(ctx->in_dtype[0], c->allow_tf32, &t))
    return dev_error(st, PD_INTERNAL, "%s: no cuBLAS type for %s",
                     ctx->op->name, pd_dtype_name(ctx->in_dtype[0]));
  /* cuBLAS takes int sizes and leading dimensions. Inference already refuses
   * matrix dims over INT_MAX (linalg.c, check_blas_dims); this keeps a
   * change there from turning into silently truncated sizes here. */
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX || p.xc > INT_MAX ||
      p.yc > INT_MAX)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "%s: a %lld x %lld by %lld x %lld product has a dimension over %d, the "
        "largest cuBLAS takes",
        ctx->op->name, (long long)p.m, (long long)p.k, (long long)p.k,
        (long long)p.n, INT_MAX);
  int64_t out_n = p.batch * p.m * p.n;
  if (out_n == 0) return PD_OK;
  if (p.k == 0) { /* an empty sum */
    CU_CHECK(
        b, ctx->device,
        cudaMemsetAsync(ctx->out_data[0], 0, (size_t)out_n * t.es, d->stream),
        st);
    return PD_OK;
  }
  const cublasOperation_t opA = tx ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opB = ty ? CUBLAS_OP_T : CUBLAS_OP_N;
  const char *x = ctx->in_data[0], *y = ctx->in_data[1];
  char *out = ctx->out_data[0];
  cublasStatus_t s;
  if (p.y_single && !tx && p.batch * p.m <= INT_MAX) {
    s = cublasGemmEx(d->cublas, opB, opA, (int)p.n, (int)(p.batch * p.m),
                     (int)p.k, t.alpha, y, t.data, (int)p.yc, x, t.data,
                     (int)p.xc, t.beta, out, t.data, (int)p.n, t.compute,
                     CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
      return cublas_error(ctx, s, "cublasGemmEx", st);
    return PD_OK;
  }
  mm_merge_batch(&p);
  /* The innermost batch axis goes to one strided-batched call; the outer
   * ones are walked. */
  int inner = p.nb - 1;
  int64_t count = inner >= 0 ? p.bdims[inner] : 1;
  int64_t sx = inner >= 0 ? p.xstride[inner] : 0,
          sy = inner >= 0 ? p.ystride[inner] : 0;
  int64_t so = p.m * p.n;
  int64_t outer = count ? p.batch / count : 0;
  int64_t idx[PD_MAX_RANK] = {0};
  int64_t xoff = 0, yoff = 0;
  for (int64_t it = 0; it < outer; it++) {
    for (int64_t done = 0; done < count;) {
      int64_t step = count - done < INT_MAX ? count - done : INT_MAX;
      s = cublasGemmStridedBatchedEx(
          d->cublas, opB, opA, (int)p.n, (int)p.m, (int)p.k, t.alpha,
          y + (size_t)(yoff + done * sy) * t.es, t.data, (int)p.yc,
          (long long)sy, x + (size_t)(xoff + done * sx) * t.es, t.data,
          (int)p.xc, (long long)sx, t.beta,
          out + (size_t)((it * count + done) * so) * t.es, t.data, (int)p.n,
          (long long)so, (int)step, t.compute, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS)
        return cublas_error(ctx, s, "cublasGemmStridedBatchedEx", st);
      done += step;
    }
    for (int i = inner - 1; i >= 0; i--) { /* odometer over the outer axes */
      xoff += p.xstride[i];
      yoff += p.ystride[i];
      if (++idx[i] < p.bdims[i]) break;
      xoff -= p.xstride[i] * p.bdims[i];
      yoff -= p.ystride[i] * p.bdims[i];
      idx[i] = 0;
    }
  }
  return PD_OK;
}

static pd_code matmul(dev_kernel_ctx *ctx, dev_status *st) {
  return mm_kernel(ctx, ctx->attrs[0].u.b, ctx->attrs[1].u.b, st);
}

void dev_cuda_register_linalg(void) {
  dev_cuda_register("MatMul", matmul);
  dev_cuda_register("BatchMatMul", matmul);
}
