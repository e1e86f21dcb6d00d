/* The fused ops the fusion pass makes (device/fn/passes_fusion.c; the
 * contract is ops/fused_int.h): _FusedMatMul and _FusedElementwise, their
 * inference and CPU kernels. Opcodes and the program check are in
 * fused_program.c; the CUDA kernels in cuda/kernels_fused.cu and
 * cuda/fused_matmul.c.
 *
 * _FusedMatMul: one sgemm/dgemm into the output, then ONE pass over it adding
 * the bias and applying the activation (float16/bfloat16: widened to float32
 * scratch, sgemm, the pass in float32 and one rounding per element).
 *
 * _FusedElementwise: one pass over the output. The broadcast of the inputs is
 * collapsed as binary.c's (size-1 axes dropped, axes contiguous in every
 * input merged), so the inner axis is a run whose inputs step by 0 or 1; each
 * run is cut into blocks of FE_BLOCK elements and the program runs
 * instruction by instruction over a block (the temporaries stay in L1; a
 * result whose operands are all fixed on the block is computed once). Each
 * opcode is the expression of its registered op (elementwise.c, binary.c,
 * grad_ops.c), in the same type: float32 for float32, float16 and bfloat16
 * (widened on load, rounded once on store), float64 for float64. For
 * float32 and float64 the result is therefore the unfused chain's, bit for
 * bit; the 16-bit dtypes round once instead of after every op. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"
#include "ops/elementwise_int.h"
#include "ops/fused_int.h"

#define FUSED_DTYPES "float32, float64, float16 or bfloat16"

/* ------------------------------------------------------------------------ */
/* _FusedMatMul: inference                                                   */

static const char *tf(bool b) { return b ? "true" : "false"; }

static pd_code fm_infer(dev_infer_ctx *c, dev_status *st) {
  bool ta = c->attrs[DEV_FMM_TRANSPOSE_A].u.b;
  bool tb = c->attrs[DEV_FMM_TRANSPOSE_B].u.b;
  const dev_attr_value *av = &c->attrs[DEV_FMM_ACTIVATION];
  if (dev_fused_activation(av->u.s.ptr, av->u.s.len) < 0) {
    int len = av->u.s.len > 64 ? 64 : (int)av->u.s.len;
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: attribute 'activation' is \"%.*s\"; expected "
                     "\"none\", \"relu\", \"relu6\", \"sigmoid\" or \"tanh\"",
                     c->op->name, len, av->u.s.ptr ? av->u.s.ptr : "");
  }
  pd_code rc;
  if ((rc = dev_check_dtype_in(c, 0, DEV_MASK_FLOAT, FUSED_DTYPES, st)) ||
      (rc = dev_check_same_dtype(c, 0, 1, st)) ||
      (rc = dev_check_same_dtype(c, 0, 2, st)) ||
      (rc = dev_check_rank(c, 0, 2, 2, st)) ||
      (rc = dev_check_rank(c, 1, 2, 2, st)) ||
      (rc = dev_check_rank(c, 2, 1, 1, st)))
    return rc;
  const dev_shape *as = &c->in_shape[0], *bs = &c->in_shape[1];
  int64_t ka = ta ? as->dims[0] : as->dims[1];
  int64_t kb = tb ? bs->dims[1] : bs->dims[0];
  char sa[160], sb[160];
  if (ka != kb)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: inner dimensions differ: a is %s (transpose_a=%s), "
                     "b is %s (transpose_b=%s); expected a's %s (%lld) to "
                     "equal b's %s (%lld)",
                     c->op->name, dev_shape_str(as, sa, sizeof sa), tf(ta),
                     dev_shape_str(bs, sb, sizeof sb), tf(tb),
                     ta ? "rows" : "columns", (long long)ka,
                     tb ? "columns" : "rows", (long long)kb);
  int64_t m = ta ? as->dims[1] : as->dims[0];
  int64_t n = tb ? bs->dims[0] : bs->dims[1];
  const dev_shape *bias = &c->in_shape[2];
  if (bias->dims[0] != n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: bias has shape %s but the product has %lld columns; "
                     "expected bias of size %lld",
                     c->op->name, dev_shape_str(bias, sa, sizeof sa),
                     (long long)n, (long long)n);
  for (int i = 0; i < 2; i++)
    for (int d = 0; d < 2; d++)
      if (c->in_shape[i].dims[d] > INT_MAX)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "%s: input '%s' has shape %s; matrix dimensions "
                         "must be at most %d (the BLAS limit)",
                         c->op->name, c->op->inputs[i].name,
                         dev_shape_str(&c->in_shape[i], sa, sizeof sa),
                         INT_MAX);
  dev_shape out = {.rank = 2, .dims = {m, n}};
  PD_TRY(dev_check_out_size(c, c->in_dtype[0], &out, st));
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* _FusedMatMul: CPU kernel                                                  */

/* Sigmoid as elementwise.c computes it (e^-|x| never overflows). */
static inline float sigmoid_f32(float x) {
  float e = expf(-fabsf(x));
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}
static inline double sigmoid_f64(double x) {
  double e = exp(-fabs(x));
  return (x >= 0.0 ? 1.0 : e) / (1.0 + e);
}

/* row[j] = ACT(row[j] + bias[j]) for the m x n output; ACT reads x. */
#define FM_PASS(T, ACT)                                                        \
  for (int64_t i = 0; i < m; i++) {                                            \
    T *row = out + i * n;                                                      \
    for (int64_t j = 0; j < n; j++) {                                          \
      T x = row[j] + bias[j];                                                  \
      row[j] = (ACT);                                                          \
    }                                                                          \
    if (narrow) dev__narrow_16(dt, (const float *)row, narrow + i * n, n);     \
  }

#define FM_EPILOGUE(T, SIGMOID, TANH)                                          \
  switch (act) {                                                               \
    case DEV_ACT_NONE: FM_PASS(T, x) break;                                    \
    case DEV_ACT_RELU: FM_PASS(T, x < (T)0 ? (T)0 : x) break;                  \
    case DEV_ACT_RELU6:                                                        \
      FM_PASS(T, x < (T)0 ? (T)0 : (x > (T)6 ? (T)6 : x)) break;               \
    case DEV_ACT_SIGMOID: FM_PASS(T, SIGMOID(x)) break;                        \
    default: FM_PASS(T, TANH(x)) break;                                        \
  }

/* The pass over float32 `out` (m x n); `narrow` (16-bit output) or NULL:
 * each row is rounded into it once done, while it is still in cache. */
static void fm_epilogue_f32(int act, float *out, const float *bias, int64_t m,
                            int64_t n, pd_dtype dt, uint16_t *narrow) {
  FM_EPILOGUE(float, sigmoid_f32, tanhf)
}

static void fm_epilogue_f64(int act, double *out, const double *bias, int64_t m,
                            int64_t n) {
  const pd_dtype dt = PD_FLOAT64;
  uint16_t *narrow = NULL;
  FM_EPILOGUE(double, sigmoid_f64, tanh)
}

static pd_code fm_kernel(dev_kernel_ctx *c, dev_status *st) {
  bool ta = c->attrs[DEV_FMM_TRANSPOSE_A].u.b;
  bool tb = c->attrs[DEV_FMM_TRANSPOSE_B].u.b;
  const dev_attr_value *av = &c->attrs[DEV_FMM_ACTIVATION];
  int act = dev_fused_activation(av->u.s.ptr, av->u.s.len);
  const dev_shape *as = &c->in_shape[0], *bs = &c->in_shape[1];
  int64_t m = c->out_shape[0].dims[0], n = c->out_shape[0].dims[1];
  int64_t k = ta ? as->dims[0] : as->dims[1];
  int lda = (int)as->dims[1], ldb = (int)bs->dims[1];
  if (m * n == 0) return PD_OK;
  CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
  CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
  pd_dtype dt = c->out_dtype[0];
  if (dt == PD_FLOAT64) {
    double *out = c->out_data[0];
    if (k == 0)
      memset(out, 0, (size_t)(m * n) * sizeof *out);
    else
      cblas_dgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, 1.0,
                  c->in_data[0], lda, c->in_data[1], ldb, 0.0, out, (int)n);
    dev_kernel_heartbeat(c);
    fm_epilogue_f64(act, out, c->in_data[2], m, n);
    return PD_OK;
  }
  if (dt == PD_FLOAT32) {
    float *out = c->out_data[0];
    if (k == 0)
      memset(out, 0, (size_t)(m * n) * sizeof *out);
    else
      cblas_sgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, 1.0f,
                  c->in_data[0], lda, c->in_data[1], ldb, 0.0f, out, (int)n);
    dev_kernel_heartbeat(c);
    fm_epilogue_f32(act, out, c->in_data[2], m, n, dt, NULL);
    return PD_OK;
  }
  /* float16 / bfloat16: float32 scratch for a, b, the bias and the product,
   * as linalg.c's product path, then one rounding per element. */
  int64_t na = dev_num_elems(as), nb = dev_num_elems(bs);
  int64_t total = na + nb + n + m * n;
  float *buf = dev__scratch_f32(total);
  if (!buf) return dev__scratch_error(c, total, st);
  float *fa = buf, *fb = fa + na, *fbias = fb + nb, *fo = fbias + n;
  dev__widen_16(dt, c->in_data[0], fa, na);
  dev__widen_16(dt, c->in_data[1], fb, nb);
  dev__widen_16(dt, c->in_data[2], fbias, n);
  if (k > 0)
    cblas_sgemm(CblasRowMajor, opa, opb, (int)m, (int)n, (int)k, 1.0f, fa, lda,
                fb, ldb, 0.0f, fo, (int)n);
  dev_kernel_heartbeat(c);
  fm_epilogue_f32(act, fo, fbias, m, n, dt, c->out_data[0]);
  free(buf);
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* _FusedElementwise: inference                                              */

static pd_code fe_infer(dev_infer_ctx *c, dev_status *st) {
  int n_in = c->num_inputs;
  if (n_in < 1 || n_in > DEV_EW_MAX_INPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: got %d inputs; expected 1 to %d", c->op->name, n_in,
                     DEV_EW_MAX_INPUTS);
  PD_TRY(dev_check_dtype_in(c, 0, DEV_MASK_FLOAT, FUSED_DTYPES, st));
  for (int i = 1; i < n_in; i++) PD_TRY(dev_check_same_dtype(c, 0, i, st));
  dev_shape out = c->in_shape[0];
  for (int i = 1; i < n_in; i++) {
    dev_shape next;
    dev_status tmp = DEV_STATUS_INIT;
    if (dev_shape_broadcast(&out, &c->in_shape[i], &next, &tmp) != PD_OK) {
      char so[160], si[160];
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: input 'x[%d]' has shape %s, which does not "
                       "broadcast with %s (the broadcast of x[0..%d]); "
                       "expected each pair of trailing dims to be equal or "
                       "one of them 1 (NumPy broadcasting)",
                       c->op->name, i,
                       dev_shape_str(&c->in_shape[i], si, sizeof si),
                       dev_shape_str(&out, so, sizeof so), i - 1);
    }
    out = next;
  }
  const dev_attr_value *prog = &c->attrs[DEV_FEW_PROGRAM];
  const dev_attr_value *consts = &c->attrs[DEV_FEW_CONSTANTS];
  PD_TRY(dev__ew_program_check(c->op->name, prog->u.ilist.v, prog->u.ilist.n,
                               n_in, consts->u.flist.n, st));
  PD_TRY(dev_check_out_size(c, c->in_dtype[0], &out, st));
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* _FusedElementwise: CPU kernel                                             */

#define FE_BLOCK 128

/* The broadcast of every input onto the output, collapsed (binary.c's plan
 * for n inputs): `rank` axes, each input's element stride on each. */
typedef struct fe_plan {
  int rank;
  int64_t dims[PD_MAX_RANK];
  int64_t s[DEV_EW_MAX_INPUTS][PD_MAX_RANK];
} fe_plan;

static void fe_plan_make(const dev_shape *out, const dev_shape *in, int n_in,
                         fe_plan *p) {
  int64_t s[DEV_EW_MAX_INPUTS][PD_MAX_RANK];
  for (int k = 0; k < n_in; k++) {
    int64_t stride = 1;
    for (int i = out->rank - 1; i >= 0; i--) {
      int j = i - (out->rank - in[k].rank);
      int64_t d = j >= 0 ? in[k].dims[j] : 1;
      s[k][i] = d == 1 ? 0 : stride;
      stride *= d;
    }
  }
  p->rank = 0;
  for (int i = 0; i < out->rank; i++) {
    int64_t d = out->dims[i];
    if (d == 1) continue;
    int r = p->rank - 1;
    bool merge = r >= 0;
    for (int k = 0; merge && k < n_in; k++) merge = p->s[k][r] == s[k][i] * d;
    if (merge) {
      p->dims[r] *= d;
      for (int k = 0; k < n_in; k++) p->s[k][r] = s[k][i];
      continue;
    }
    p->dims[p->rank] = d;
    for (int k = 0; k < n_in; k++) p->s[k][p->rank] = s[k][i];
    p->rank++;
  }
  if (p->rank == 0) {
    p->rank = 1;
    p->dims[0] = 1;
    for (int k = 0; k < n_in; k++) p->s[k][0] = 0;
  }
}

/* An instruction's operand over a block: its values and whether they step
 * (1) or are one value repeated (0). */
#define FE_OPERAND(T)                                                          \
  struct {                                                                     \
    const T *p;                                                                \
    int step;                                                                  \
  }

/* d[i] = EXPR over L elements, x (and y) read from operands A (and B). */
#define FE_RUN1(T, EXPR)                                                       \
  do {                                                                         \
    const T *pa_ = A.p;                                                        \
    if (A.step) {                                                              \
      for (int i = 0; i < L; i++) {                                            \
        T x = pa_[i];                                                          \
        d[i] = (EXPR);                                                         \
      }                                                                        \
    } else {                                                                   \
      T x = pa_[0];                                                            \
      d[0] = (EXPR);                                                           \
    }                                                                          \
  } while (0)

#define FE_RUN2(T, EXPR)                                                       \
  do {                                                                         \
    const T *pa_ = A.p, *pb_ = B.p;                                            \
    if (A.step && B.step) {                                                    \
      for (int i = 0; i < L; i++) {                                            \
        T x = pa_[i], y = pb_[i];                                              \
        d[i] = (EXPR);                                                         \
      }                                                                        \
    } else if (A.step) {                                                       \
      T y = pb_[0];                                                            \
      for (int i = 0; i < L; i++) {                                            \
        T x = pa_[i];                                                          \
        d[i] = (EXPR);                                                         \
      }                                                                        \
    } else if (B.step) {                                                       \
      T x = pa_[0];                                                            \
      for (int i = 0; i < L; i++) {                                            \
        T y = pb_[i];                                                          \
        d[i] = (EXPR);                                                         \
      }                                                                        \
    } else {                                                                   \
      T x = pa_[0], y = pb_[0];                                                \
      d[0] = (EXPR);                                                           \
    }                                                                          \
  } while (0)

/* One instruction over a block, each opcode its op's expression. */
#define FE_INSTR(T, FABS, EXP, LOG, SQRT, TANH, POW, SIGMOID)                  \
  switch (op) {                                                                \
    case DEV_EW_ADD: FE_RUN2(T, x + y); break;                                 \
    case DEV_EW_SUB: FE_RUN2(T, x - y); break;                                 \
    case DEV_EW_MUL: FE_RUN2(T, x *y); break;                                  \
    case DEV_EW_DIV: FE_RUN2(T, x / y); break;                                 \
    case DEV_EW_MAXIMUM: FE_RUN2(T, (x != x || x > y) ? x : y); break;         \
    case DEV_EW_MINIMUM: FE_RUN2(T, (x != x || x < y) ? x : y); break;         \
    case DEV_EW_POW: FE_RUN2(T, POW(x, y)); break;                             \
    case DEV_EW_RELU_GRAD: FE_RUN2(T, y > (T)0 ? x : (T)0); break;             \
    case DEV_EW_TANH_GRAD: FE_RUN2(T, y *((T)1 - x * x)); break;               \
    case DEV_EW_SIGMOID_GRAD: FE_RUN2(T, y *x *((T)1 - x)); break;             \
    case DEV_EW_SQRT_GRAD: FE_RUN2(T, y *(T)0.5 / x); break;                   \
    case DEV_EW_RSQRT_GRAD: FE_RUN2(T, (T)-0.5 * (x * x * x) * y); break;      \
    case DEV_EW_NEG: FE_RUN1(T, -x); break;                                    \
    case DEV_EW_EXP: FE_RUN1(T, EXP(x)); break;                                \
    case DEV_EW_LOG: FE_RUN1(T, LOG(x)); break;                                \
    case DEV_EW_SQRT: FE_RUN1(T, SQRT(x)); break;                              \
    case DEV_EW_RSQRT: FE_RUN1(T, (T)1 / SQRT(x)); break;                      \
    case DEV_EW_SQUARE: FE_RUN1(T, x *x); break;                               \
    case DEV_EW_TANH: FE_RUN1(T, TANH(x)); break;                              \
    case DEV_EW_SIGMOID: FE_RUN1(T, SIGMOID(x)); break;                        \
    case DEV_EW_RELU: FE_RUN1(T, x < (T)0 ? (T)0 : x); break;                  \
    case DEV_EW_ABS: FE_RUN1(T, FABS(x)); break;                               \
    default: FE_RUN1(T, x); break; /* Identity */                              \
  }

/* The decoded program. */
typedef struct fe_prog {
  int n;
  int op[DEV_EW_MAX_INSTR], a[DEV_EW_MAX_INSTR], b[DEV_EW_MAX_INSTR];
  int n_consts;
  const double *consts;
} fe_prog;

/* Evaluates the program on one block of L elements: in[k] (step in_step[k])
 * are the inputs' values in the compute type; the result goes to `res`
 * (L values, or one when *res_step comes back 0). */
#define FE_BLOCK_FN(NAME, T, FABS, EXP, LOG, SQRT, TANH, POW, SIGMOID)         \
  static void NAME(const fe_prog *pg, const T *const *in, const int *in_step,  \
                   const T *cv, T(*tmp)[FE_BLOCK], int L, const T **res,       \
                   int *res_step) {                                            \
    typedef FE_OPERAND(T) operand;                                             \
    int tstep[DEV_EW_MAX_INSTR];                                               \
    for (int j = 0; j < pg->n; j++) {                                          \
      operand A = {0}, B = {0};                                                \
      for (int w = 0; w < 2; w++) {                                            \
        int v = w ? pg->b[j] : pg->a[j];                                       \
        operand o = {0};                                                       \
        if (v == DEV_EW_NONE) continue;                                        \
        if (v >= DEV_EW_CONST_BASE) {                                          \
          o.p = &cv[v - DEV_EW_CONST_BASE];                                    \
        } else if (v >= DEV_EW_TEMP_BASE) {                                    \
          o.p = tmp[v - DEV_EW_TEMP_BASE];                                     \
          o.step = tstep[v - DEV_EW_TEMP_BASE];                                \
        } else {                                                               \
          o.p = in[v];                                                         \
          o.step = in_step[v];                                                 \
        }                                                                      \
        if (w)                                                                 \
          B = o;                                                               \
        else                                                                   \
          A = o;                                                               \
      }                                                                        \
      T *d = tmp[j];                                                           \
      int op = pg->op[j];                                                      \
      tstep[j] = A.step | B.step;                                              \
      FE_INSTR(T, FABS, EXP, LOG, SQRT, TANH, POW, SIGMOID)                    \
    }                                                                          \
    *res = tmp[pg->n - 1];                                                     \
    *res_step = tstep[pg->n - 1];                                              \
  }

FE_BLOCK_FN(fe_block_f32, float, fabsf, expf, logf, sqrtf, tanhf, powf,
            sigmoid_f32)
FE_BLOCK_FN(fe_block_f64, double, fabs, exp, log, sqrt, tanh, pow, sigmoid_f64)

/* Loads one input's block in float32: float32 data is read in place, 16-bit
 * data widened into `buf`; a fixed input (step 0) is one element. */
static const float *fe_load_f32(pd_dtype dt, const char *base, int64_t off,
                                int step, int L, float *buf) {
  if (dt == PD_FLOAT32) return (const float *)(const void *)base + off;
  const uint16_t *h = (const uint16_t *)(const void *)base + off;
  int m = step ? L : 1;
  if (dt == PD_FLOAT16)
    for (int i = 0; i < m; i++) buf[i] = ew_f16_to_f32(h[i]);
  else
    for (int i = 0; i < m; i++) buf[i] = ew_bf16_to_f32(h[i]);
  return buf;
}

/* Stores a block's result: L values, or one repeated (step 0). */
static void fe_store(pd_dtype dt, const void *res, int step, int L, char *out,
                     int64_t off) {
  if (dt == PD_FLOAT64) {
    double *o = (double *)(void *)out + off;
    const double *r = res;
    if (step)
      memcpy(o, r, (size_t)L * sizeof *o);
    else
      for (int i = 0; i < L; i++) o[i] = r[0];
    return;
  }
  const float *r = res;
  if (dt == PD_FLOAT32) {
    float *o = (float *)(void *)out + off;
    if (step)
      memcpy(o, r, (size_t)L * sizeof *o);
    else
      for (int i = 0; i < L; i++) o[i] = r[0];
    return;
  }
  uint16_t *o = (uint16_t *)(void *)out + off;
  for (int i = 0; i < L; i++) {
    float v = r[step ? i : 0];
    o[i] = dt == PD_FLOAT16 ? ew_f32_to_f16(v) : ew_f32_to_bf16(v);
  }
}

/* One block at output offset `oo`, inputs at offsets off[k]. */
static void fe_do_block(const fe_prog *pg, pd_dtype dt, int n_in,
                        const char *const *data, const int64_t *off,
                        const int *step, int L, char *out, int64_t oo,
                        const void *cv, void *tmp, float (*wide)[FE_BLOCK]) {
  int rstep;
  if (dt == PD_FLOAT64) {
    const double *in[DEV_EW_MAX_INPUTS], *res;
    for (int k = 0; k < n_in; k++)
      in[k] = (const double *)(const void *)data[k] + off[k];
    fe_block_f64(pg, in, step, cv, tmp, L, &res, &rstep);
    fe_store(dt, res, rstep, L, out, oo);
  } else {
    const float *in[DEV_EW_MAX_INPUTS], *res;
    for (int k = 0; k < n_in; k++)
      in[k] = fe_load_f32(dt, data[k], off[k], step[k], L, wide[k]);
    fe_block_f32(pg, in, step, cv, tmp, L, &res, &rstep);
    fe_store(dt, res, rstep, L, out, oo);
  }
}

static pd_code fe_kernel(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *os = &c->out_shape[0];
  if (dev_num_elems(os) == 0) return PD_OK;
  int n_in = c->num_inputs;
  pd_dtype dt = c->out_dtype[0];
  const dev_attr_value *pv = &c->attrs[DEV_FEW_PROGRAM];
  const dev_attr_value *kv = &c->attrs[DEV_FEW_CONSTANTS];
  fe_prog pg = {.n = pv->u.ilist.n / 3, .n_consts = kv->u.flist.n};
  for (int j = 0; j < pg.n; j++) {
    pg.op[j] = (int)pv->u.ilist.v[3 * j];
    pg.a[j] = (int)pv->u.ilist.v[3 * j + 1];
    pg.b[j] = (int)pv->u.ilist.v[3 * j + 2];
  }
  /* Constants in the compute type (float32 for the 16-bit dtypes). */
  double cd[DEV_ATTR_LIST_MAX];
  float cf[DEV_ATTR_LIST_MAX];
  for (int k = 0; k < pg.n_consts; k++) {
    cd[k] = kv->u.flist.v[k];
    cf[k] = (float)kv->u.flist.v[k];
  }
  const void *cv = dt == PD_FLOAT64 ? (const void *)cd : (const void *)cf;
  void *tmp = malloc(sizeof(double) * DEV_EW_MAX_INSTR * FE_BLOCK +
                     sizeof(float) * DEV_EW_MAX_INPUTS * FE_BLOCK);
  if (!tmp)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%s: cannot allocate its block scratch", c->op->name);
  float(*wide)[FE_BLOCK] = (float(*)[FE_BLOCK])(
      (char *)tmp + sizeof(double) * DEV_EW_MAX_INSTR * FE_BLOCK);
  fe_plan p;
  fe_plan_make(os, c->in_shape, n_in, &p);
  const char *data[DEV_EW_MAX_INPUTS];
  int step[DEV_EW_MAX_INPUTS];
  int inner = p.rank - 1;
  for (int k = 0; k < n_in; k++) {
    data[k] = c->in_data[k];
    step[k] = p.s[k][inner] != 0;
  }
  int64_t len = p.dims[inner], idx[PD_MAX_RANK] = {0};
  int64_t base[DEV_EW_MAX_INPUTS] = {0}, oo = 0, blocks = 0;
  for (;;) {
    for (int64_t done = 0; done < len; done += FE_BLOCK) {
      int L = (int)(len - done < FE_BLOCK ? len - done : FE_BLOCK);
      int64_t off[DEV_EW_MAX_INPUTS];
      for (int k = 0; k < n_in; k++) off[k] = base[k] + (step[k] ? done : 0);
      fe_do_block(&pg, dt, n_in, data, off, step, L, c->out_data[0], oo + done,
                  cv, tmp, wide);
      if ((++blocks & 1023) == 0) dev_kernel_heartbeat(c);
    }
    oo += len;
    int k = inner - 1;
    for (; k >= 0; k--) { /* odometer over the outer axes */
      for (int q = 0; q < n_in; q++) base[q] += p.s[q][k];
      if (++idx[k] < p.dims[k]) break;
      for (int q = 0; q < n_in; q++) base[q] -= p.s[q][k] * p.dims[k];
      idx[k] = 0;
    }
    if (k < 0) break;
  }
  free(tmp);
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */

static const char *const k_activations[] = {"none",    "relu", "relu6",
                                            "sigmoid", "tanh", NULL};

static dev_op_def fused_matmul_def = {
    .name = DEV_FUSED_MATMUL_OP,
    .num_inputs = 3,
    .inputs = {{"a", false, 0, DEV_MASK_FLOAT, NULL,
                "[M, K], or [K, M] with transpose_a"},
               {"b", false, 0, DEV_MASK_FLOAT, "same as a",
                "[K, N], or [N, K] with transpose_b"},
               {"bias", false, 0, DEV_MASK_FLOAT, "same as a", "[N]"}},
    .num_outputs = 1,
    .outputs = {{"product", false, 0, DEV_MASK_FLOAT, "same as a", "[M, N]"}},
    .num_attrs = 3,
    .attrs = {{"transpose_a",
               DEV_ATTR_BOOL,
               {.type = DEV_ATTR_BOOL, .u.b = false},
               .doc = "use a's transpose"},
              {"transpose_b",
               DEV_ATTR_BOOL,
               {.type = DEV_ATTR_BOOL, .u.b = false},
               .doc = "use b's transpose"},
              {"activation",
               DEV_ATTR_STRING,
               {.type = DEV_ATTR_STRING, .u.s = {"none", 4}},
               .doc = "applied after the bias",
               .allowed = k_activations}},
    .infer = fm_infer,
    .kernels = {[DEV_BACKEND_CPU] = fm_kernel},
    .summary =
        "product = activation(op(a) @ op(b) + bias): MatMul, BiasAdd "
        "and an activation in one kernel.",
    .notes =
        "Made by the fusion pass of graph functions (device/fn/), not "
        "usually called directly. Differs from TensorFlow's internal "
        "_FusedMatMul: one `bias` input instead of the `args` list and "
        "`fused_ops` attribute, the activation as a string attribute "
        "(none, relu, relu6, sigmoid, tanh; relu and relu6 keep NaN), no "
        "`epsilon` or `leakyrelu_alpha`; floating dtypes only. On the CPU one "
        "sgemm/dgemm then one pass for bias and activation; on CUDA "
        "cuBLASLt epilogues. float16/bfloat16 round once, not after each op.",
};

static dev_op_def fused_elementwise_def = {
    .name = DEV_FUSED_ELEMENTWISE_OP,
    .num_inputs = 1,
    .inputs = {{"x", true, 1, DEV_MASK_FLOAT, "one dtype for all",
                "1 to 16 tensors, NumPy-broadcast against each other"}},
    .num_outputs = 1,
    .outputs = {{"y", false, 0, DEV_MASK_FLOAT, "same as x",
                 "the broadcast shape of x"}},
    .num_attrs = 2,
    .attrs = {{"program",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_NONE},
               .doc = "3 ints per instruction: opcode, operand a, operand b "
                      "(-1 for unary); operands: input i, 100 + j (result "
                      "of instruction j), 1000 + c (constants[c]); at most "
                      "21 instructions"},
              {"constants",
               DEV_ATTR_FLOAT_LIST,
               {.type = DEV_ATTR_FLOAT_LIST, .u.flist = {NULL, 0}},
               .doc = "the program's constants"}},
    .infer = fe_infer,
    .kernels = {[DEV_BACKEND_CPU] = fe_kernel},
    .summary =
        "y = the result of a small program of element-wise ops over "
        "broadcast inputs, evaluated per element in one pass.",
    .notes =
        "paradev's own (no tf.raw_ops op of this name): made by the fusion "
        "pass of graph functions (device/fn/) from chains of Add, Sub, Mul, "
        "Div, Maximum, Minimum, Pow, Neg, Exp, Log, Sqrt, Rsqrt, Square, "
        "Tanh, Sigmoid, Relu, Abs, Identity and ReluGrad, TanhGrad, "
        "SigmoidGrad, SqrtGrad, RsqrtGrad (opcodes in "
        "device/ops/fused_int.h); each opcode computes what its op does. "
        "float32 and float64 give the unfused chain's values exactly; "
        "float16 and bfloat16 are computed in float32 and round once. On "
        "CUDA one launch interprets the program per element.",
};

/* Registers _FusedMatMul and _FusedElementwise with their CPU kernels. */
void dev_register_fused_ops(void) {
  dev__register_or_die(&fused_matmul_def);
  dev__register_or_die(&fused_elementwise_def);
}
