/* _FusedMatMul on CUDA (device/ops/fused.c's semantics: activation(op(a) @
 * op(b) + bias)) through cuBLASLt with an epilogue: CUBLASLT_EPILOGUE_BIAS
 * for "none", CUBLASLT_EPILOGUE_RELU_BIAS for "relu"; relu6, sigmoid and
 * tanh as BIAS and one element-wise launch (dev_cuda_bias_act,
 * kernels_fused.cu). Where cuBLASLt offers no algorithm with the epilogue
 * (its heuristic returns none), the product runs without one and that same
 * launch adds the bias too.
 *
 * Row-major as matmul.c: C = op(A) op(B) is computed as the column-major
 * C^T = op(B)^T op(A)^T, so cuBLASLt's "A" is b's storage and its "B" is a's;
 * D^T has N rows, so the epilogue's bias (one value per row of D) is one per
 * column of our C, as BiasAdd's. Types and TF32 as matmul.c (float32 exact
 * unless the backend allows TF32; float16/bfloat16 accumulate in float32;
 * float64 in float64). The cuBLAS handle serves as the cuBLASLt handle (a
 * cublasHandle_t may be cast to cublasLtHandle_t); the workspace is
 * stream-ordered scratch, so the call can be captured into a CUDA graph. */
#include <cublasLt.h>
#include <limits.h>
#include <string.h>

#include "../ops/fused_int.h"
#include "cuda_int.h"

/* kernels_fused.cu */
cudaError_t dev_cuda_bias_act(pd_dtype dt, void *out, const void *bias,
                              int64_t m, int64_t n, int act, int add_bias,
                              int sm_count, cudaStream_t s);

#define LT_WORKSPACE ((size_t)4 << 20)

typedef struct lt_call {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulPreference_t pref;
} lt_call;

static void lt_free(lt_call *l) {
  if (l->pref) cublasLtMatmulPreferenceDestroy(l->pref);
  if (l->lc) cublasLtMatrixLayoutDestroy(l->lc);
  if (l->lb) cublasLtMatrixLayoutDestroy(l->lb);
  if (l->la) cublasLtMatrixLayoutDestroy(l->la);
  if (l->op) cublasLtMatmulDescDestroy(l->op);
  memset(l, 0, sizeof *l);
}

static bool lt_types(pd_dtype dt, bool tf32, cudaDataType_t *data,
                     cublasComputeType_t *compute, cudaDataType_t *scale) {
  *compute = CUBLAS_COMPUTE_32F;
  *scale = CUDA_R_32F;
  switch (dt) {
    case PD_FLOAT32:
      *data = CUDA_R_32F;
      if (tf32) *compute = CUBLAS_COMPUTE_32F_FAST_TF32;
      return true;
    case PD_FLOAT64:
      *data = CUDA_R_64F;
      *compute = CUBLAS_COMPUTE_64F;
      *scale = CUDA_R_64F;
      return true;
    case PD_FLOAT16: *data = CUDA_R_16F; return true;
    case PD_BFLOAT16: *data = CUDA_R_16BF; return true;
    default: return false;
  }
}

#define LT_TRY(CALL)                                                           \
  CUBLAS_CHECK_GOTO(ctx->backend, ctx->device, (CALL), st, rc, out)

/* Sets up the descriptors with `epi` and asks the heuristic for one
 * algorithm; *found false when it has none (NOT_SUPPORTED included). */
static pd_code lt_plan(dev_kernel_ctx *ctx, lt_call *l, cublasLtEpilogue_t epi,
                       size_t ws, cublasLtMatmulHeuristicResult_t *res,
                       bool *found, dev_status *st) {
  cu_backend *c = cu_of(ctx->backend);
  bool ta = ctx->attrs[DEV_FMM_TRANSPOSE_A].u.b;
  bool tb = ctx->attrs[DEV_FMM_TRANSPOSE_B].u.b;
  const dev_shape *as = &ctx->in_shape[0], *bs = &ctx->in_shape[1];
  int64_t m = ctx->out_shape[0].dims[0], n = ctx->out_shape[0].dims[1];
  cudaDataType_t data = CUDA_R_32F, scale = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (!lt_types(ctx->in_dtype[0], c->allow_tf32, &data, &compute, &scale))
    return dev_error(st, PD_INTERNAL, "%s: no cuBLASLt type for %s",
                     ctx->op->name, pd_dtype_name(ctx->in_dtype[0]));
  cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* b is Lt's A */
  cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const void *bias = ctx->in_data[2];
  pd_code rc = PD_OK;
  *found = false;
  LT_TRY(cublasLtMatmulDescCreate(&l->op, compute, scale));
  LT_TRY(cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                        &opa, sizeof opa));
  LT_TRY(cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                        &opb, sizeof opb));
  LT_TRY(cublasLtMatmulDescSetAttribute(l->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                        &epi, sizeof epi));
  if (epi != CUBLASLT_EPILOGUE_DEFAULT)
    LT_TRY(cublasLtMatmulDescSetAttribute(
        l->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  LT_TRY(cublasLtMatrixLayoutCreate(&l->la, data, (uint64_t)bs->dims[1],
                                    (uint64_t)bs->dims[0], bs->dims[1]));
  LT_TRY(cublasLtMatrixLayoutCreate(&l->lb, data, (uint64_t)as->dims[1],
                                    (uint64_t)as->dims[0], as->dims[1]));
  LT_TRY(cublasLtMatrixLayoutCreate(&l->lc, data, (uint64_t)n, (uint64_t)m, n));
  LT_TRY(cublasLtMatmulPreferenceCreate(&l->pref));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(
      l->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  int count = 0;
  cublasLtHandle_t lt = (cublasLtHandle_t)c->devs[ctx->device].cublas;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
      lt, l->op, l->la, l->lb, l->lc, l->lc, l->pref, 1, res, &count);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED ||
      (s == CUBLAS_STATUS_SUCCESS && !count))
    return PD_OK;
  LT_TRY(s);
  *found = true;
out:
  return rc;
}

static pd_code fused_matmul(dev_kernel_ctx *ctx, dev_status *st) {
  dev_backend *b = ctx->backend;
  cu_backend *c = cu_of(b);
  cu_device *d = &c->devs[ctx->device];
  const dev_attr_value *av = &ctx->attrs[DEV_FMM_ACTIVATION];
  int act = dev_fused_activation(av->u.s.ptr, av->u.s.len);
  bool ta = ctx->attrs[DEV_FMM_TRANSPOSE_A].u.b;
  pd_dtype dt = ctx->in_dtype[0];
  int64_t m = ctx->out_shape[0].dims[0], n = ctx->out_shape[0].dims[1];
  int64_t k = ta ? ctx->in_shape[0].dims[0] : ctx->in_shape[0].dims[1];
  int sms = dev_cuda_sm_count(b, ctx->device);
  if (m * n == 0) return PD_OK;
  if (k == 0) { /* an empty sum: the bias alone */
    CU_CHECK(b, ctx->device,
             cudaMemsetAsync(ctx->out_data[0], 0,
                             (size_t)(m * n) * pd_dtype_size(dt), d->stream),
             st);
    CU_CHECK(b, ctx->device,
             dev_cuda_bias_act(dt, ctx->out_data[0], ctx->in_data[2], m, n, act,
                               1, sms, d->stream),
             st);
    return PD_OK;
  }
  void *ws = NULL;
  PD_TRY(dev_cuda_scratch(ctx, LT_WORKSPACE, &ws, st));
  cublasLtEpilogue_t epi = act == DEV_ACT_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS
                                               : CUBLASLT_EPILOGUE_BIAS;
  lt_call l = {0};
  cublasLtMatmulHeuristicResult_t res;
  bool found = false;
  pd_code rc = lt_plan(ctx, &l, epi, LT_WORKSPACE, &res, &found, st);
  bool epilogue = found;
  if (rc == PD_OK && !found) { /* no epilogue for these types: bias below */
    lt_free(&l);
    rc = lt_plan(ctx, &l, CUBLASLT_EPILOGUE_DEFAULT, LT_WORKSPACE, &res, &found,
                 st);
    if (rc == PD_OK && !found)
      rc = dev_error(st, PD_INTERNAL,
                     "%s: cuBLASLt has no algorithm for a %lld x %lld x %lld "
                     "%s product",
                     d->name, (long long)m, (long long)k, (long long)n,
                     pd_dtype_name(dt));
  }
  if (rc == PD_OK) {
    static const float f1 = 1.0f, f0 = 0.0f;
    static const double d1 = 1.0, d0 = 0.0;
    const void *alpha = dt == PD_FLOAT64 ? (const void *)&d1 : &f1;
    const void *beta = dt == PD_FLOAT64 ? (const void *)&d0 : &f0;
    cublasLtHandle_t lt = (cublasLtHandle_t)d->cublas;
    LT_TRY(cublasLtMatmul(lt, l.op, alpha, ctx->in_data[1], l.la,
                          ctx->in_data[0], l.lb, beta, ctx->out_data[0], l.lc,
                          ctx->out_data[0], l.lc, &res.algo, ws, LT_WORKSPACE,
                          d->stream));
    /* What the epilogue did not do: the bias (no epilogue) and the
     * activations cuBLASLt has none for. */
    int rest = act == DEV_ACT_RELU && epilogue ? DEV_ACT_NONE : act;
    if (!epilogue || rest != DEV_ACT_NONE) {
      cudaError_t e = dev_cuda_bias_act(dt, ctx->out_data[0], ctx->in_data[2],
                                        m, n, rest, !epilogue, sms, d->stream);
      if (e != cudaSuccess)
        rc = dev_cuda_fail(b, ctx->device, e, "dev_cuda_bias_act", st);
    }
  }
out:
  lt_free(&l);
  dev_cuda_scratch_free(ctx, ws, LT_WORKSPACE);
  return rc;
}

void dev_cuda_register_fused_matmul(void) {
  dev_cuda_register(DEV_FUSED_MATMUL_OP, fused_matmul);
}
