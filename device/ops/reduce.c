/* Reductions: Sum, Mean, Max, Min and ArgMax (the softmax family is in
 * softmax.c; shared helpers in reduce_int.h).
 *
 * Semantics: the TensorFlow raw ops of the same names, with two documented
 * differences in Sum/Mean/Max/Min (see reduce_infer): an empty `axis` list
 * reduces over every axis, and the axes come from an attribute rather than a
 * tensor input. Max/Min propagate NaN as NumPy does; ArgMax picks the first
 * maximal index and a NaN wins, as numpy.argmax.
 *
 * Layout of the reduction kernels: the input shape is collapsed (size-1 axes
 * dropped, neighbouring axes that are both reduced or both kept merged), so
 * every reduction is one of two loops:
 *  - the last collapsed axis is reduced: each output element reduces
 *    contiguous runs (reducing the last axis is one run per output);
 *  - the last collapsed axis is kept: rows of the input are accumulated into
 *    a block of output columns (reducing the first axis walks the input once,
 *    row by row).
 * float32 sums accumulate in float64; integer sums wrap (unsigned
 * arithmetic, no undefined behaviour); float16/bfloat16 go through float32
 * scratch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"
#include "ops/reduce_int.h"

/* ------------------------------------------------------------------------ */
/* Shared helpers                                                            */

static int64_t num_elements(const dev_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return n;
}

/* ------------------------------------------------------------------------ */
/* Sum, Mean, Max, Min                                                       */

enum { RED_SUM, RED_MEAN, RED_MAX, RED_MIN };

/* The collapsed geometry of one reduction. */
typedef struct red_geom {
  int n; /* collapsed axes, >= 1 */
  int64_t dims[PD_MAX_RANK];
  int64_t strides[PD_MAX_RANK];
  bool red[PD_MAX_RANK];
  int64_t count; /* input elements per output element */
  int64_t out_n;
  bool empty; /* the input has no elements */
} red_geom;

/* Which axes are reduced: bit i set for axis i. Duplicates and ranges were
 * checked by infer. */
static unsigned red_mask(const dev_attr_value *axis, int rank) {
  if (axis->u.ilist.n == 0) return rank ? (1u << rank) - 1 : 0;
  unsigned m = 0;
  for (int i = 0; i < axis->u.ilist.n; i++) {
    int64_t a = axis->u.ilist.v[i];
    m |= 1u << (a < 0 ? a + rank : a);
  }
  return m;
}

static void red_plan(const dev_shape *s, unsigned mask, red_geom *g) {
  memset(g, 0, sizeof *g);
  g->count = 1;
  g->out_n = 1;
  int64_t total = 1;
  for (int i = 0; i < s->rank; i++) {
    bool r = (mask >> i) & 1u;
    int64_t d = s->dims[i];
    total *= d;
    if (r)
      g->count *= d;
    else
      g->out_n *= d;
    if (d == 1) continue;
    if (g->n > 0 && g->red[g->n - 1] == r) {
      g->dims[g->n - 1] *= d;
    } else {
      g->dims[g->n] = d;
      g->red[g->n] = r;
      g->n++;
    }
  }
  g->empty = total == 0;
  if (g->n == 0) { /* one element */
    g->n = 1;
    g->dims[0] = 1;
    g->red[0] = true;
  }
  int64_t st = 1;
  for (int i = g->n - 1; i >= 0; i--) {
    g->strides[i] = st;
    st *= g->dims[i];
  }
}

/* An odometer over a subset of the collapsed axes, tracking the offset. */
typedef struct odo {
  int n;
  int64_t dims[PD_MAX_RANK];
  int64_t strides[PD_MAX_RANK];
  int64_t idx[PD_MAX_RANK];
  int64_t off;
} odo;

/* Axes i < limit with red[i] == want. */
static void odo_init(odo *o, const red_geom *g, bool want, int limit) {
  memset(o, 0, sizeof *o);
  for (int i = 0; i < limit; i++)
    if (g->red[i] == want) {
      o->dims[o->n] = g->dims[i];
      o->strides[o->n] = g->strides[i];
      o->n++;
    }
}

static int64_t odo_count(const odo *o) {
  int64_t c = 1;
  for (int i = 0; i < o->n; i++) c *= o->dims[i];
  return c;
}

static inline void odo_next(odo *o) {
  for (int i = o->n - 1; i >= 0; i--) {
    o->off += o->strides[i];
    if (++o->idx[i] < o->dims[i]) return;
    o->off -= o->strides[i] * o->dims[i];
    o->idx[i] = 0;
  }
}

#define RED_BLOCK 1024 /* output columns accumulated at once */

/* Defines `static void FN(const T *in, T *out, const red_geom *g)` for one
 * dtype and one reduction: A is the accumulator type, INIT its start value,
 * ADD(a, x) folds an element (or another accumulator) into it, FIN(a, cnt)
 * gives the output value. */
#define DEFINE_REDUCE(FN, T, A, INIT, ADD, FIN)                                \
  static void FN(const T *in, T *out, const red_geom *g) {                     \
    const int64_t cnt = g->count;                                              \
    (void)cnt;                                                                 \
    if (g->out_n == 0) return;                                                 \
    if (g->empty) {                                                            \
      for (int64_t o = 0; o < g->out_n; o++) {                                 \
        A a = (INIT);                                                          \
        out[o] = FIN(a, cnt);                                                  \
      }                                                                        \
      return;                                                                  \
    }                                                                          \
    const int last = g->n - 1;                                                 \
    if (g->red[last]) {                                                        \
      /* Contiguous runs of L elements per step. */                            \
      const int64_t L = g->dims[last];                                         \
      odo ko, ro;                                                              \
      odo_init(&ko, g, false, last);                                           \
      odo_init(&ro, g, true, last);                                            \
      const int64_t nr = odo_count(&ro);                                       \
      for (int64_t o = 0; o < g->out_n; o++, odo_next(&ko)) {                  \
        A a0 = (INIT), a1 = (INIT), a2 = (INIT), a3 = (INIT);                  \
        ro.off = 0;                                                            \
        memset(ro.idx, 0, sizeof ro.idx);                                      \
        for (int64_t r = 0; r < nr; r++, odo_next(&ro)) {                      \
          const T *p = in + ko.off + ro.off;                                   \
          int64_t i = 0;                                                       \
          for (; i + 4 <= L; i += 4) {                                         \
            ADD(a0, p[i]);                                                     \
            ADD(a1, p[i + 1]);                                                 \
            ADD(a2, p[i + 2]);                                                 \
            ADD(a3, p[i + 3]);                                                 \
          }                                                                    \
          for (; i < L; i++) ADD(a0, p[i]);                                    \
        }                                                                      \
        ADD(a0, a1);                                                           \
        ADD(a2, a3);                                                           \
        ADD(a0, a2);                                                           \
        out[o] = FIN(a0, cnt);                                                 \
      }                                                                        \
    } else {                                                                   \
      /* Accumulate input rows into blocks of K output columns. */             \
      const int64_t K = g->dims[last];                                         \
      A acc[RED_BLOCK];                                                        \
      odo ko, ro;                                                              \
      odo_init(&ko, g, false, last);                                           \
      odo_init(&ro, g, true, last);                                            \
      const int64_t nk = odo_count(&ko), nr = odo_count(&ro);                  \
      for (int64_t o = 0; o < nk; o++, odo_next(&ko)) {                        \
        for (int64_t c0 = 0; c0 < K; c0 += RED_BLOCK) {                        \
          const int64_t w = K - c0 < RED_BLOCK ? K - c0 : RED_BLOCK;           \
          for (int64_t j = 0; j < w; j++) acc[j] = (INIT);                     \
          ro.off = 0;                                                          \
          memset(ro.idx, 0, sizeof ro.idx);                                    \
          for (int64_t r = 0; r < nr; r++, odo_next(&ro)) {                    \
            const T *p = in + ko.off + ro.off + c0;                            \
            for (int64_t j = 0; j < w; j++) ADD(acc[j], p[j]);                 \
          }                                                                    \
          T *q = out + o * K + c0;                                             \
          for (int64_t j = 0; j < w; j++) q[j] = FIN(acc[j], cnt);             \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }

/* Accumulation rules. */
#define ADD_SUM(a, x) ((a) += (x))
#define ADD_USUM32(a, x) ((a) += (uint32_t)(x))
#define ADD_USUM64(a, x) ((a) += (uint64_t)(x))
/* NaN-propagating max/min: once the accumulator is NaN it stays NaN. */
#define ADD_FMAX(a, x) ((a) = ((x) > (a) || (x) != (x)) ? (x) : (a))
#define ADD_FMIN(a, x) ((a) = ((x) < (a) || (x) != (x)) ? (x) : (a))
#define ADD_IMAX(a, x) ((a) = (x) > (a) ? (x) : (a))
#define ADD_IMIN(a, x) ((a) = (x) < (a) ? (x) : (a))

#define FIN_ID(a, cnt) (a)
#define FIN_F32(a, cnt) ((float)(a))
#define FIN_MEAN_F32(a, cnt) ((cnt) ? (float)((a) / (double)(cnt)) : NAN)
#define FIN_MEAN_F64(a, cnt) ((cnt) ? (a) / (double)(cnt) : NAN)
/* Integer sums wrap: the unsigned accumulator converts back modulo 2^n. */
#define FIN_I32(a, cnt) ((int32_t)(a))
#define FIN_I64(a, cnt) ((int64_t)(a))
#define FIN_U8(a, cnt) ((uint8_t)(a))
/* Integer means divide the (int64) sum as integers, truncating toward zero. */
#define FIN_MEAN_I32(a, cnt) ((cnt) ? (int32_t)((int64_t)(a) / (cnt)) : 0)
#define FIN_MEAN_I64(a, cnt) ((cnt) ? (int64_t)(a) / (cnt) : 0)
#define FIN_MEAN_U8(a, cnt) ((cnt) ? (uint8_t)((a) / (uint64_t)(cnt)) : 0)

DEFINE_REDUCE(sum_f32, float, double, 0.0, ADD_SUM, FIN_F32)
DEFINE_REDUCE(mean_f32, float, double, 0.0, ADD_SUM, FIN_MEAN_F32)
DEFINE_REDUCE(max_f32, float, float, -INFINITY, ADD_FMAX, FIN_ID)
DEFINE_REDUCE(min_f32, float, float, INFINITY, ADD_FMIN, FIN_ID)
DEFINE_REDUCE(sum_f64, double, double, 0.0, ADD_SUM, FIN_ID)
DEFINE_REDUCE(mean_f64, double, double, 0.0, ADD_SUM, FIN_MEAN_F64)
DEFINE_REDUCE(max_f64, double, double, -INFINITY, ADD_FMAX, FIN_ID)
DEFINE_REDUCE(min_f64, double, double, INFINITY, ADD_FMIN, FIN_ID)
DEFINE_REDUCE(sum_i32, int32_t, uint32_t, 0u, ADD_USUM32, FIN_I32)
DEFINE_REDUCE(mean_i32, int32_t, uint64_t, 0u, ADD_USUM64, FIN_MEAN_I32)
DEFINE_REDUCE(max_i32, int32_t, int32_t, INT32_MIN, ADD_IMAX, FIN_ID)
DEFINE_REDUCE(min_i32, int32_t, int32_t, INT32_MAX, ADD_IMIN, FIN_ID)
DEFINE_REDUCE(sum_i64, int64_t, uint64_t, 0u, ADD_USUM64, FIN_I64)
DEFINE_REDUCE(mean_i64, int64_t, uint64_t, 0u, ADD_USUM64, FIN_MEAN_I64)
DEFINE_REDUCE(max_i64, int64_t, int64_t, INT64_MIN, ADD_IMAX, FIN_ID)
DEFINE_REDUCE(min_i64, int64_t, int64_t, INT64_MAX, ADD_IMIN, FIN_ID)
DEFINE_REDUCE(sum_u8, uint8_t, uint64_t, 0u, ADD_USUM64, FIN_U8)
DEFINE_REDUCE(mean_u8, uint8_t, uint64_t, 0u, ADD_USUM64, FIN_MEAN_U8)
DEFINE_REDUCE(max_u8, uint8_t, uint8_t, 0, ADD_IMAX, FIN_ID)
DEFINE_REDUCE(min_u8, uint8_t, uint8_t, UINT8_MAX, ADD_IMIN, FIN_ID)

static const char *const k_red_names[] = {"Sum", "Mean", "Max", "Min"};

static int red_kind(const dev_op_def *op) {
  for (int i = 0; i < 4; i++)
    if (strcmp(op->name, k_red_names[i]) == 0) return i;
  return RED_SUM;
}

/* Sum, Mean, Max, Min (TensorFlow raw ops, axes as an attribute).
 *
 * `axis` lists the axes to reduce; negative axes count from the end; a
 * duplicate or out-of-range axis is INVALID_ARGUMENT. An EMPTY `axis` list
 * (the default) reduces over ALL axes — a deliberate difference from
 * TensorFlow, where an empty reduction_indices tensor reduces nothing: here
 * the attribute's default must mean something useful, and "reduce
 * everything" is what tf.reduce_sum(x) and numpy.sum(x) do without axes.
 * With keep_dims the reduced axes stay with size 1.
 *
 * A Mean of an integer dtype over zero elements (with a non-empty output) has
 * no value and is INVALID_ARGUMENT; floats give NaN. Sum over zero elements
 * is 0; Max/Min give -inf/+inf (floats) or the dtype's lowest/highest. */
static pd_code reduce_infer(dev_infer_ctx *c, dev_status *st) {
  pd_code rc = dev_check_dtype_in(c, 0, DEV_MASK_NUMBER, NULL, st);
  if (rc) return rc;
  const dev_shape *s = &c->in_shape[0];
  const dev_attr_value *axis = &c->attrs[0];
  bool keep = c->attrs[1].u.b;
  unsigned mask = 0;
  for (int i = 0; i < axis->u.ilist.n; i++) {
    int a;
    if ((rc = dev_normalize_axis(c, "axis", axis->u.ilist.v[i], s->rank, &a,
                                 st)))
      return rc;
    if (mask & (1u << a))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: attribute 'axis' lists axis %d more than once "
                       "(entry %d is %lld); expected distinct axes",
                       c->op->name, a, i, (long long)axis->u.ilist.v[i]);
    mask |= 1u << a;
  }
  if (axis->u.ilist.n == 0 && s->rank > 0) mask = (1u << s->rank) - 1;
  dev_shape *o = &c->out_shape[0];
  o->rank = 0;
  int64_t count = 1, out_n = 1;
  for (int i = 0; i < s->rank; i++) {
    if (mask & (1u << i)) {
      count *= s->dims[i];
      if (keep) o->dims[o->rank++] = 1;
    } else {
      out_n *= s->dims[i];
      o->dims[o->rank++] = s->dims[i];
    }
  }
  if (red_kind(c->op) == RED_MEAN && dev_dtype_is_integer(c->in_dtype[0]) &&
      count == 0 && out_n > 0) {
    char sb[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Mean: input has shape %s and dtype %s; the mean over the "
                     "reduced axes (zero elements) is undefined for integers; "
                     "expected at least one element per output",
                     dev_shape_str(s, sb, sizeof sb),
                     pd_dtype_name(c->in_dtype[0]));
  }
  c->out_dtype[0] = c->in_dtype[0];
  return check_output(c, 0, st);
}

static void reduce_f32(int kind, const float *in, float *out,
                       const red_geom *g) {
  switch (kind) {
    case RED_SUM: sum_f32(in, out, g); break;
    case RED_MEAN: mean_f32(in, out, g); break;
    case RED_MAX: max_f32(in, out, g); break;
    default: min_f32(in, out, g); break;
  }
}

static pd_code reduce_half_body(dev_kernel_ctx *ctx, const float *in,
                                float *out, float *out2, dev_status *st) {
  red_geom g;
  red_plan(&ctx->in_shape[0], red_mask(&ctx->attrs[0], ctx->in_shape[0].rank),
           &g);
  reduce_f32(red_kind(ctx->op), in, out, &g);
  return PD_OK;
}

#define RED_DISPATCH(SUF, T)                                                   \
  switch (kind) {                                                              \
    case RED_SUM: sum_##SUF((const T *)in, (T *)out, &g); break;               \
    case RED_MEAN: mean_##SUF((const T *)in, (T *)out, &g); break;             \
    case RED_MAX: max_##SUF((const T *)in, (T *)out, &g); break;               \
    default: min_##SUF((const T *)in, (T *)out, &g); break;                    \
  }

static pd_code reduce_cpu(dev_kernel_ctx *ctx, dev_status *st) {
  const dev_shape *s = &ctx->in_shape[0];
  int kind = red_kind(ctx->op);
  pd_dtype dt = ctx->in_dtype[0];
  if (is_half(dt))
    return run_widened(ctx, reduce_half_body, num_elements(s),
                       num_elements(&ctx->out_shape[0]), 0, st);
  red_geom g;
  red_plan(s, red_mask(&ctx->attrs[0], s->rank), &g);
  const void *in = ctx->in_data[0];
  void *out = ctx->out_data[0];
  switch (dt) {
    case PD_FLOAT32: reduce_f32(kind, in, out, &g); break;
    case PD_FLOAT64: RED_DISPATCH(f64, double); break;
    case PD_INT32: RED_DISPATCH(i32, int32_t); break;
    case PD_INT64: RED_DISPATCH(i64, int64_t); break;
    case PD_UINT8: RED_DISPATCH(u8, uint8_t); break;
    default:
      return dev_error(st, PD_INTERNAL, "%s: unexpected dtype %s",
                       ctx->op->name, pd_dtype_name(dt));
  }
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* ArgMax                                                                    */

/* ArgMax (TensorFlow raw op): index of the largest value along `axis`; the
 * first one on ties; a NaN counts as larger than any number (the first NaN
 * wins, as numpy.argmax). Output dtype is `output_type` (int32 or int64). */
static pd_code argmax_infer(dev_infer_ctx *c, dev_status *st) {
  pd_code rc = dev_check_dtype_in(c, 0, DEV_MASK_NUMBER, NULL, st);
  if (rc) return rc;
  const dev_shape *s = &c->in_shape[0];
  pd_dtype ot = c->attrs[1].u.dtype;
  if (ot != PD_INT32 && ot != PD_INT64)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "ArgMax: attribute 'output_type' is %s; expected int32 or "
                     "int64",
                     pd_dtype_name(ot));
  int a;
  if ((rc = dev_normalize_axis(c, "axis", c->attrs[0].u.i, s->rank, &a, st)))
    return rc;
  char sb[160];
  if (s->dims[a] == 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "ArgMax: reduction axis %d is empty in input shape %s; "
                     "expected at least one element along the axis",
                     a, dev_shape_str(s, sb, sizeof sb));
  if (ot == PD_INT32 && s->dims[a] > INT32_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "ArgMax: axis %d of input shape %s has %lld elements, "
                     "too many for output_type int32; expected int64",
                     a, dev_shape_str(s, sb, sizeof sb), (long long)s->dims[a]);
  dev_shape *o = &c->out_shape[0];
  o->rank = 0;
  for (int i = 0; i < s->rank; i++)
    if (i != a) o->dims[o->rank++] = s->dims[i];
  c->out_dtype[0] = ot;
  return check_output(c, 0, st);
}

/* Better(x, best): x replaces the current best. */
#define BETTER_F(x, b) ((b) == (b) && ((x) > (b) || (x) != (x)))
#define BETTER_I(x, b) ((x) > (b))

/* Defines FN(in, outer, L, inner, out64, out32): argmax over the middle axis
 * of [outer, L, inner]; L >= 1. Exactly one of out64/out32 is non-NULL. */
#define DEFINE_ARGMAX(FN, T, BETTER)                                           \
  static void FN(const T *in, int64_t outer, int64_t L, int64_t inner,         \
                 int64_t *o64, int32_t *o32) {                                 \
    if (inner == 1) {                                                          \
      for (int64_t o = 0; o < outer; o++) {                                    \
        const T *p = in + o * L;                                               \
        T best = p[0];                                                         \
        int64_t bi = 0;                                                        \
        for (int64_t l = 1; l < L; l++)                                        \
          if (BETTER(p[l], best)) {                                            \
            best = p[l];                                                       \
            bi = l;                                                            \
          }                                                                    \
        if (o64)                                                               \
          o64[o] = bi;                                                         \
        else                                                                   \
          o32[o] = (int32_t)bi;                                                \
      }                                                                        \
      return;                                                                  \
    }                                                                          \
    T best[RED_BLOCK];                                                         \
    int64_t bi[RED_BLOCK];                                                     \
    for (int64_t o = 0; o < outer; o++)                                        \
      for (int64_t c0 = 0; c0 < inner; c0 += RED_BLOCK) {                      \
        const int64_t w = inner - c0 < RED_BLOCK ? inner - c0 : RED_BLOCK;     \
        const T *p = in + o * L * inner + c0;                                  \
        for (int64_t j = 0; j < w; j++) {                                      \
          best[j] = p[j];                                                      \
          bi[j] = 0;                                                           \
        }                                                                      \
        for (int64_t l = 1; l < L; l++) {                                      \
          const T *row = p + l * inner;                                        \
          for (int64_t j = 0; j < w; j++)                                      \
            if (BETTER(row[j], best[j])) {                                     \
              best[j] = row[j];                                                \
              bi[j] = l;                                                       \
            }                                                                  \
        }                                                                      \
        int64_t base = o * inner + c0;                                         \
        for (int64_t j = 0; j < w; j++) {                                      \
          if (o64)                                                             \
            o64[base + j] = bi[j];                                             \
          else                                                                 \
            o32[base + j] = (int32_t)bi[j];                                    \
        }                                                                      \
      }                                                                        \
  }

DEFINE_ARGMAX(argmax_f32, float, BETTER_F)
DEFINE_ARGMAX(argmax_f64, double, BETTER_F)
DEFINE_ARGMAX(argmax_i32, int32_t, BETTER_I)
DEFINE_ARGMAX(argmax_i64, int64_t, BETTER_I)
DEFINE_ARGMAX(argmax_u8, uint8_t, BETTER_I)

static pd_code argmax_cpu(dev_kernel_ctx *ctx, dev_status *st) {
  const dev_shape *s = &ctx->in_shape[0];
  int64_t ax = ctx->attrs[0].u.i;
  int a = (int)(ax < 0 ? ax + s->rank : ax);
  int64_t outer = 1, L = s->dims[a], inner = 1;
  for (int i = 0; i < a; i++) outer *= s->dims[i];
  for (int i = a + 1; i < s->rank; i++) inner *= s->dims[i];
  if (outer * inner == 0) return PD_OK;
  bool i64 = ctx->out_dtype[0] == PD_INT64;
  int64_t *o64 = i64 ? ctx->out_data[0] : NULL;
  int32_t *o32 = i64 ? NULL : ctx->out_data[0];
  const void *in = ctx->in_data[0];
  pd_dtype dt = ctx->in_dtype[0];
  switch (dt) {
    case PD_FLOAT32: argmax_f32(in, outer, L, inner, o64, o32); break;
    case PD_FLOAT64: argmax_f64(in, outer, L, inner, o64, o32); break;
    case PD_INT32: argmax_i32(in, outer, L, inner, o64, o32); break;
    case PD_INT64: argmax_i64(in, outer, L, inner, o64, o32); break;
    case PD_UINT8: argmax_u8(in, outer, L, inner, o64, o32); break;
    case PD_FLOAT16:
    case PD_BFLOAT16: {
      int64_t n = outer * L * inner;
      float *buf = malloc((size_t)n * sizeof(float));
      if (!buf) return dev__scratch_error(ctx, n, st);
      dev__widen_16(dt, in, buf,
                    n); /* exact: every half/bfloat16 is a float32 */
      argmax_f32(buf, outer, L, inner, o64, o32);
      free(buf);
      break;
    }
    default:
      return dev_error(st, PD_INTERNAL, "ArgMax: unexpected dtype %s",
                       pd_dtype_name(dt));
  }
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */

#define REDUCE_NOTES(NM)                                                       \
  "Differs from tf.raw_ops." NM                                                \
  ": TF takes the axes as an input tensor "                                    \
  "`reduction_indices`; here `axis` is an int-list attribute, and an EMPTY "   \
  "`axis` (the default) reduces over every axis, where TF's empty "            \
  "reduction_indices reduces nothing. `keep_dims` is TF's."

#define REDUCE_DEF(NM, SUMMARY)                                                \
  {                                                                            \
    .name = NM, .num_inputs = 1,                                               \
    .inputs = {{"input", false, 0, DEV_MASK_NUMBER}}, .num_outputs = 1,        \
    .outputs = {{"output", false, 0, DEV_MASK_NUMBER, "same as input"}},       \
    .num_attrs = 2,                                                            \
    .attrs = {{"axis",                                                         \
               DEV_ATTR_INT_LIST,                                              \
               {.type = DEV_ATTR_INT_LIST, .u.ilist = {NULL, 0}},              \
               .doc = "distinct axes to reduce, -rank..rank-1; [] reduces "    \
                      "every axis"},                                           \
              {"keep_dims",                                                    \
               DEV_ATTR_BOOL,                                                  \
               {.type = DEV_ATTR_BOOL, .u.b = false},                          \
               .doc = "keep the reduced axes with size 1"}},                   \
    .infer = reduce_infer, .kernels = {[DEV_BACKEND_CPU] = reduce_cpu},        \
    .summary = SUMMARY, .notes = REDUCE_NOTES(NM),                             \
  }

static dev_op_def reduce_defs[4] = {
    REDUCE_DEF("Sum", "The sum of input's elements over `axis` (0 over none)."),
    REDUCE_DEF("Mean",
               "The mean of input's elements over `axis` (NaN over "
               "none for floats; an error for integers)."),
    REDUCE_DEF("Max",
               "The largest of input's elements over `axis`; NaN "
               "propagates."),
    REDUCE_DEF("Min",
               "The smallest of input's elements over `axis`; NaN "
               "propagates.")};

static dev_op_def argmax_def = {
    .name = "ArgMax",
    .num_inputs = 1,
    .inputs = {{"input", false, 0, DEV_MASK_NUMBER}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0,
                 DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64),
                 "the attribute output_type"}},
    .num_attrs = 2,
    .attrs = {{"axis",
               DEV_ATTR_INT,
               {.type = DEV_ATTR_INT, .u.i = 0},
               .doc = "the axis to search; -rank..rank-1"},
              {"output_type",
               DEV_ATTR_DTYPE,
               {.type = DEV_ATTR_DTYPE, .u.dtype = PD_INT64},
               .doc = "int32 or int64"}},
    .infer = argmax_infer,
    .kernels = {[DEV_BACKEND_CPU] = argmax_cpu},
    .summary =
        "The index of the largest element along `axis` (the first on "
        "ties; a NaN wins, as numpy.argmax).",
    .notes =
        "Differs from tf.raw_ops.ArgMax: TF takes the axis as an input "
        "tensor `dimension`; here `axis` is an int attribute (default "
        "0).",
};

/* Registers Sum, Mean, Max, Min and ArgMax with their CPU kernels. */
void dev_register_reduce_ops(void) {
  for (int i = 0; i < 4; i++) dev__register_or_die(&reduce_defs[i]);
  dev__register_or_die(&argmax_def);
}
