/* Array ops: Identity, Reshape, Transpose, Concat, Slice, Gather, OneHot.
 *
 * Semantics follow the TensorFlow raw ops of the same names (Concat is
 * ConcatV2 and Gather is GatherV2 without batch_dims, with the axis given as
 * an attribute rather than a tensor). These ops move bytes; kernels work by
 * element size, so every dtype takes the same path, and copy contiguous runs
 * with memcpy wherever the layout allows. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "device_int.h"

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */

/* Formats an int list as "[1, -1, 3]" into buf. */
static char *ilist_str(const int64_t *v, int n, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  int w = snprintf(buf, len, "[");
  if (w < 0 || (size_t)w >= len) return buf;
  off = (size_t)w;
  for (int i = 0; i < n; i++) {
    w = snprintf(buf + off, len - off, "%s%lld", i ? ", " : "", (long long)v[i]);
    if (w < 0 || (size_t)w >= len - off) return buf;
    off += (size_t)w;
  }
  snprintf(buf + off, len - off, "]");
  return buf;
}

/* Checks the output size for overflow (element count and bytes). */
static pd_code check_out_size(const dev_infer_ctx *c, pd_dtype dt,
                              const dev_shape *s, dev_status *st) {
  size_t bytes;
  dev_status tmp = DEV_STATUS_INIT;
  if (dev_shape_byte_size(dt, s, &bytes, &tmp) != PD_OK) {
    char sb[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: output shape %s of dtype %s is too large (%s)",
                     c->op->name, dev_shape_str(s, sb, sizeof sb),
                     pd_dtype_name(dt), tmp.msg);
  }
  return PD_OK;
}

/* ------------------------------------------------------------------------ */
/* Identity (TF Identity): output 0 aliases input 0, no kernel runs.         */

static pd_code identity_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK) return st->code;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[0];
  return PD_OK;
}

static dev_op_def identity_def = {
    .name = "Identity",
    .num_inputs = 1,
    .inputs = {{"input", false, 0}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0}},
    .num_attrs = 0,
    .flags = DEV_OP_ALIASES_INPUT,
    .infer = identity_infer,
    .kernels = {NULL, NULL},
};

/* ------------------------------------------------------------------------ */
/* Reshape (TF Reshape, the shape given as attribute "shape"): one -1 is
 * inferred from the element count, per component. Output aliases input. */

enum { RESHAPE_SHAPE = 0 };

static pd_code reshape_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK) return st->code;
  const dev_attr_value *a = &c->attrs[RESHAPE_SHAPE];
  const int64_t *v = a->u.ilist.v;
  int n = a->u.ilist.n;
  const dev_shape *in = &c->in_shape[0];
  char want[400], got[160];
  if (n > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Reshape: attribute 'shape' %s has %d dims; expected at most %d",
                     ilist_str(v, n, want, sizeof want), n, PD_MAX_RANK);
  int unknown = -1;
  bool has_zero = false;
  int64_t product = 1; /* of the non-zero, known sizes */
  for (int i = 0; i < n; i++) {
    if (v[i] == -1) {
      if (unknown >= 0)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "Reshape: attribute 'shape' %s has -1 at axes %d and %d; "
                         "expected at most one -1",
                         ilist_str(v, n, want, sizeof want), unknown, i);
      unknown = i;
    } else if (v[i] < 0) {
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Reshape: attribute 'shape' %s has %lld at axis %d; "
                       "expected a size >= 0 or -1",
                       ilist_str(v, n, want, sizeof want), (long long)v[i], i);
    } else if (v[i] == 0) {
      has_zero = true;
    } else if (__builtin_mul_overflow(product, v[i], &product)) {
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Reshape: attribute 'shape' %s has more than %lld elements",
                       ilist_str(v, n, want, sizeof want), (long long)INT64_MAX);
    }
  }
  int64_t in_count = dev_num_elems(in);
  dev_shape out;
  out.rank = n;
  for (int i = 0; i < n; i++) out.dims[i] = v[i];
  if (unknown >= 0) {
    /* As TF: with a 0 among the requested sizes, the input's zero dims do
     * not count, so -1 can still be inferred from the other dims. */
    int64_t in_nz = 1;
    bool in_has_zero = false;
    for (int i = 0; i < in->rank; i++) {
      if (in->dims[i] > 0 || !has_zero) in_nz *= in->dims[i];
      else in_has_zero = true;
    }
    int64_t missing = in_nz / product;
    if (!in_has_zero && missing * product != in_nz)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Reshape: cannot reshape input 'tensor' of shape %s (%lld elements) "
                       "into shape %s; expected an element count that is a multiple of %lld",
                       dev_shape_str(in, got, sizeof got), (long long)in_count,
                       ilist_str(v, n, want, sizeof want), (long long)product);
    out.dims[unknown] = missing;
  }
  int64_t out_count = has_zero ? 0 : product;
  if (unknown >= 0 && !has_zero) out_count = product * out.dims[unknown];
  if (out_count != in_count)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Reshape: cannot reshape input 'tensor' of shape %s (%lld elements) "
                     "into shape %s (%lld elements); expected equal element counts",
                     dev_shape_str(in, got, sizeof got), (long long)in_count,
                     ilist_str(v, n, want, sizeof want), (long long)out_count);
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

static dev_op_def reshape_def = {
    .name = "Reshape",
    .num_inputs = 1,
    .inputs = {{"tensor", false, 0}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0}},
    .num_attrs = 1,
    .attrs = {{"shape", DEV_ATTR_INT_LIST, {.type = DEV_ATTR_NONE}}},
    .flags = DEV_OP_ALIASES_INPUT,
    .infer = reshape_infer,
    .kernels = {NULL, NULL},
};

/* ------------------------------------------------------------------------ */
/* Transpose (TF Transpose, perm as attribute; an empty perm reverses the
 * axes as numpy.transpose does). out.dims[i] = in.dims[perm[i]].           */

enum { TRANSPOSE_PERM = 0 };

/* Writes the effective permutation (perm or the reversal) into p. */
static void transpose_perm(const dev_attr_value *a, int rank, int *p) {
  if (a->u.ilist.n == 0) {
    for (int i = 0; i < rank; i++) p[i] = rank - 1 - i;
  } else {
    for (int i = 0; i < rank; i++) p[i] = (int)a->u.ilist.v[i];
  }
}

static pd_code transpose_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK) return st->code;
  const dev_attr_value *a = &c->attrs[TRANSPOSE_PERM];
  const dev_shape *in = &c->in_shape[0];
  int n = a->u.ilist.n;
  char pb[400], sb[160];
  if (n != 0) {
    if (n != in->rank)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Transpose: attribute 'perm' %s has %d entries but input 'x' has "
                       "shape %s (rank %d); expected a permutation of 0..%d",
                       ilist_str(a->u.ilist.v, n, pb, sizeof pb), n,
                       dev_shape_str(in, sb, sizeof sb), in->rank, in->rank - 1);
    bool seen[PD_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
      int64_t p = a->u.ilist.v[i];
      if (p < 0 || p >= n || seen[p])
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "Transpose: attribute 'perm' %s is not a permutation of 0..%d "
                         "(entry %d is %lld); expected each axis of input 'x' exactly once",
                         ilist_str(a->u.ilist.v, n, pb, sizeof pb), n - 1, i,
                         (long long)p);
      seen[p] = true;
    }
  }
  int p[PD_MAX_RANK];
  transpose_perm(a, in->rank, p);
  dev_shape out;
  out.rank = in->rank;
  for (int i = 0; i < in->rank; i++) out.dims[i] = in->dims[p[i]];
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

/* A transpose reduced to its essentials: axes of size 1 dropped and input
 * axes that stay adjacent in the output merged. */
typedef struct tp_plan {
  int rank;
  int64_t dims[PD_MAX_RANK]; /* input dims */
  int perm[PD_MAX_RANK];     /* out axis i reads input axis perm[i] */
} tp_plan;

static void tp_simplify(const dev_shape *in, const int *perm, tp_plan *p) {
  int newidx[PD_MAX_RANK];
  int r = 0;
  for (int k = 0; k < in->rank; k++) {
    if (in->dims[k] == 1) {
      newidx[k] = -1;
    } else {
      newidx[k] = r;
      p->dims[r++] = in->dims[k];
    }
  }
  int j = 0;
  for (int i = 0; i < in->rank; i++)
    if (newidx[perm[i]] >= 0) p->perm[j++] = newidx[perm[i]];
  p->rank = r;
  /* Merge input axes a, a+1 that appear as consecutive output axes. */
  for (;;) {
    int at = -1;
    for (int i = 0; i + 1 < p->rank; i++)
      if (p->perm[i + 1] == p->perm[i] + 1) { at = i; break; }
    if (at < 0) break;
    int a = p->perm[at];
    p->dims[a] *= p->dims[a + 1];
    for (int k = a + 1; k + 1 < p->rank; k++) p->dims[k] = p->dims[k + 1];
    for (int i = at + 1; i + 1 < p->rank; i++) p->perm[i] = p->perm[i + 1];
    p->rank--;
    for (int i = 0; i < p->rank; i++)
      if (p->perm[i] > a) p->perm[i]--;
  }
}

#define TP_TILE 32

/* out[j*os_j + k] = in[j + k*is_k] for j < nj, k < nk, in TP_TILE square
 * tiles so that both the strided reads and the writes stay in cache. */
#define DEFINE_TP_TILE(NAME, T)                                              \
  static void NAME(const void *in_, void *out_, int64_t nj, int64_t nk,      \
                   int64_t os_j, int64_t is_k) {                             \
    const T *in = (const T *)in_;                                            \
    T *out = (T *)out_;                                                      \
    for (int64_t j0 = 0; j0 < nj; j0 += TP_TILE) {                           \
      int64_t j1 = j0 + TP_TILE < nj ? j0 + TP_TILE : nj;                    \
      for (int64_t k0 = 0; k0 < nk; k0 += TP_TILE) {                         \
        int64_t k1 = k0 + TP_TILE < nk ? k0 + TP_TILE : nk;                  \
        for (int64_t j = j0; j < j1; j++) {                                  \
          T *o = out + j * os_j;                                             \
          const T *s = in + j;                                               \
          for (int64_t k = k0; k < k1; k++) o[k] = s[k * is_k];              \
        }                                                                    \
      }                                                                      \
    }                                                                        \
  }

DEFINE_TP_TILE(tp_tile_1, uint8_t)
DEFINE_TP_TILE(tp_tile_2, uint16_t)
DEFINE_TP_TILE(tp_tile_4, uint32_t)
DEFINE_TP_TILE(tp_tile_8, uint64_t)

typedef void (*tp_tile_fn)(const void *, void *, int64_t, int64_t, int64_t,
                           int64_t);

static pd_code transpose_kernel(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *in = &c->in_shape[0];
  size_t es = pd_dtype_size(c->in_dtype[0]);
  int64_t total = dev_num_elems(in);
  if (total == 0) return PD_OK;
  const char *src = c->in_data[0];
  char *dst = c->out_data[0];
  int perm[PD_MAX_RANK];
  transpose_perm(&c->attrs[TRANSPOSE_PERM], in->rank, perm);
  tp_plan p;
  tp_simplify(in, perm, &p);
  if (p.rank <= 1) { /* the identity permutation after simplification */
    memcpy(dst, src, (size_t)total * es);
    return PD_OK;
  }
  int r = p.rank;
  int64_t is[PD_MAX_RANK], od[PD_MAX_RANK], os[PD_MAX_RANK];
  is[r - 1] = 1;
  for (int k = r - 2; k >= 0; k--) is[k] = is[k + 1] * p.dims[k + 1];
  for (int i = 0; i < r; i++) od[i] = p.dims[p.perm[i]];
  os[r - 1] = 1;
  for (int i = r - 2; i >= 0; i--) os[i] = os[i + 1] * od[i + 1];

  /* Output axis K = r-1 is the one the output writes contiguously; output
   * axis J reads the input's contiguous axis. When J == K the innermost axis
   * stays put and rows are copied whole; otherwise (J, K) is transposed in
   * tiles. The remaining output axes are walked with an odometer. */
  int K = r - 1, J = -1;
  for (int i = 0; i < r; i++)
    if (p.perm[i] == r - 1) J = i;
  tp_tile_fn tile = es == 1 ? tp_tile_1 : es == 2 ? tp_tile_2
                  : es == 4 ? tp_tile_4 : tp_tile_8;
  size_t row = (size_t)od[K] * es;
  int other[PD_MAX_RANK], no = 0;
  for (int i = 0; i < r; i++)
    if (i != J && i != K) other[no++] = i;
  int64_t idx[PD_MAX_RANK] = {0};
  int64_t outer = 1;
  for (int t = 0; t < no; t++) outer *= od[other[t]];
  int64_t in_off = 0, out_off = 0;
  for (int64_t it = 0; it < outer; it++) {
    if (J == K)
      memcpy(dst + (size_t)out_off * es, src + (size_t)in_off * es, row);
    else
      tile(src + (size_t)in_off * es, dst + (size_t)out_off * es, od[J], od[K],
           os[J], is[p.perm[K]]);
    for (int t = no - 1; t >= 0; t--) { /* odometer step */
      int i = other[t];
      in_off += is[p.perm[i]];
      out_off += os[i];
      if (++idx[t] < od[i]) break;
      in_off -= is[p.perm[i]] * od[i];
      out_off -= os[i] * od[i];
      idx[t] = 0;
    }
  }
  (void)st;
  return PD_OK;
}

static dev_op_def transpose_def = {
    .name = "Transpose",
    .num_inputs = 1,
    .inputs = {{"x", false, 0}},
    .num_outputs = 1,
    .outputs = {{"y", false, 0}},
    .num_attrs = 1,
    .attrs = {{"perm", DEV_ATTR_INT_LIST, {.type = DEV_ATTR_NONE}}},
    .infer = transpose_infer,
    .kernels = {transpose_kernel, NULL},
};

/* ------------------------------------------------------------------------ */
/* Concat (TF ConcatV2, axis as attribute).                                  */

enum { CONCAT_AXIS = 0 };

static pd_code concat_infer(dev_infer_ctx *c, dev_status *st) {
  const dev_shape *s0 = &c->in_shape[0];
  char sa[160], sb[160];
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK) return st->code;
  if (s0->rank == 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Concat: input 'values[0]' is a scalar; expected rank >= 1 "
                     "(stack scalars with Reshape first)");
  int axis;
  if (dev_normalize_axis(c, "axis", c->attrs[CONCAT_AXIS].u.i, s0->rank, &axis,
                         st) != PD_OK)
    return st->code;
  dev_shape out = *s0;
  for (int k = 1; k < c->num_inputs; k++) {
    const dev_shape *sk = &c->in_shape[k];
    if (dev_check_same_dtype(c, 0, k, st) != PD_OK) return st->code;
    if (sk->rank != s0->rank)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Concat: input 'values[%d]' has shape %s (rank %d) but "
                       "'values[0]' has shape %s (rank %d); expected the same rank",
                       k, dev_shape_str(sk, sa, sizeof sa), sk->rank,
                       dev_shape_str(s0, sb, sizeof sb), s0->rank);
    for (int d = 0; d < s0->rank; d++) {
      if (d == axis) continue;
      if (sk->dims[d] != s0->dims[d])
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "Concat: input 'values[%d]' has shape %s but 'values[0]' has "
                         "shape %s; expected equal dims except on axis %d (they differ "
                         "on axis %d)",
                         k, dev_shape_str(sk, sa, sizeof sa),
                         dev_shape_str(s0, sb, sizeof sb), axis, d);
    }
    if (__builtin_add_overflow(out.dims[axis], sk->dims[axis], &out.dims[axis]))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Concat: the output's dim on axis %d overflows int64", axis);
  }
  if (check_out_size(c, c->in_dtype[0], &out, st) != PD_OK) return st->code;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

static pd_code concat_kernel(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *os = &c->out_shape[0];
  int rank = os->rank;
  int64_t a = c->attrs[CONCAT_AXIS].u.i;
  int axis = (int)(a < 0 ? a + rank : a);
  size_t es = pd_dtype_size(c->out_dtype[0]);
  int64_t outer = dev_dims_prod(os, 0, axis);
  int64_t inner = dev_dims_prod(os, axis + 1, rank);
  if (dev_num_elems(os) == 0) return PD_OK;
  size_t run[DEV_MAX_INPUTS];
  for (int k = 0; k < c->num_inputs; k++)
    run[k] = (size_t)(c->in_shape[k].dims[axis] * inner) * es;
  char *dst = c->out_data[0];
  for (int64_t o = 0; o < outer; o++) {
    for (int k = 0; k < c->num_inputs; k++) {
      if (run[k] == 0) continue;
      memcpy(dst, (const char *)c->in_data[k] + (size_t)o * run[k], run[k]);
      dst += run[k];
    }
  }
  (void)st;
  return PD_OK;
}

static dev_op_def concat_def = {
    .name = "Concat",
    .num_inputs = 1,
    .inputs = {{"values", true, 1}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0}},
    .num_attrs = 1,
    .attrs = {{"axis", DEV_ATTR_INT, {.type = DEV_ATTR_NONE}}},
    .infer = concat_infer,
    .kernels = {concat_kernel, NULL},
};

/* ------------------------------------------------------------------------ */
/* Slice (TF Slice, begin and size as attributes; size -1: to the end).      */

enum { SLICE_BEGIN = 0, SLICE_SIZE = 1 };

static pd_code slice_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK) return st->code;
  const dev_shape *in = &c->in_shape[0];
  const dev_attr_value *b = &c->attrs[SLICE_BEGIN], *z = &c->attrs[SLICE_SIZE];
  char sb[160];
  if (b->u.ilist.n != in->rank || z->u.ilist.n != in->rank)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Slice: attributes 'begin' (%d entries) and 'size' (%d entries) "
                     "must have one entry per axis of input 'input' of shape %s (rank %d)",
                     b->u.ilist.n, z->u.ilist.n, dev_shape_str(in, sb, sizeof sb),
                     in->rank);
  dev_shape out;
  out.rank = in->rank;
  for (int d = 0; d < in->rank; d++) {
    int64_t bg = b->u.ilist.v[d], sz = z->u.ilist.v[d], dim = in->dims[d];
    if (bg < 0 || bg > dim)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Slice: axis %d: begin %lld is outside [0, %lld] for input "
                       "'input' of shape %s",
                       d, (long long)bg, (long long)dim, dev_shape_str(in, sb, sizeof sb));
    if (sz == -1) sz = dim - bg;
    if (sz < 0 || sz > dim - bg)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "Slice: axis %d: size %lld with begin %lld does not fit in dim "
                       "%lld of input 'input' of shape %s; expected -1 or 0..%lld",
                       d, (long long)z->u.ilist.v[d], (long long)bg, (long long)dim,
                       dev_shape_str(in, sb, sizeof sb), (long long)(dim - bg));
    out.dims[d] = sz;
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

static pd_code slice_kernel(dev_kernel_ctx *c, dev_status *st) {
  (void)st;
  dev__copy_box((char *)c->in_data[0], &c->in_shape[0], c->attrs[SLICE_BEGIN].u.ilist.v,
               c->out_data[0], &c->out_shape[0], pd_dtype_size(c->in_dtype[0]), true);
  return PD_OK;
}

static dev_op_def slice_def = {
    .name = "Slice",
    .num_inputs = 1,
    .inputs = {{"input", false, 0}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0}},
    .num_attrs = 2,
    .attrs = {{"begin", DEV_ATTR_INT_LIST, {.type = DEV_ATTR_NONE}},
              {"size", DEV_ATTR_INT_LIST, {.type = DEV_ATTR_NONE}}},
    .infer = slice_infer,
    .kernels = {slice_kernel, NULL},
};

/* ------------------------------------------------------------------------ */
/* Gather (TF GatherV2 with batch_dims = 0, axis as attribute):
 * output = params[:axis] + indices.shape + params[axis+1:].                 */

enum { GATHER_AXIS = 0 };

static pd_code gather_infer(dev_infer_ctx *c, dev_status *st) {
  const dev_shape *ps = &c->in_shape[0], *is = &c->in_shape[1];
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK) return st->code;
  if (dev_check_dtype_in(c, 1, DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64),
                         "int32 or int64", st) != PD_OK)
    return st->code;
  if (dev_check_rank(c, 0, 1, PD_MAX_RANK, st) != PD_OK) return st->code;
  int axis;
  if (dev_normalize_axis(c, "axis", c->attrs[GATHER_AXIS].u.i, ps->rank, &axis,
                         st) != PD_OK)
    return st->code;
  int rank = ps->rank - 1 + is->rank;
  char sa[160], sb[160];
  if (rank > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Gather: params of shape %s and indices of shape %s give an "
                     "output of rank %d; expected at most %d",
                     dev_shape_str(ps, sa, sizeof sa), dev_shape_str(is, sb, sizeof sb),
                     rank, PD_MAX_RANK);
  dev_shape out;
  out.rank = rank;
  int o = 0;
  for (int d = 0; d < axis; d++) out.dims[o++] = ps->dims[d];
  for (int d = 0; d < is->rank; d++) out.dims[o++] = is->dims[d];
  for (int d = axis + 1; d < ps->rank; d++) out.dims[o++] = ps->dims[d];
  if (check_out_size(c, c->in_dtype[0], &out, st) != PD_OK) return st->code;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

/* Formats flat index i of `s` as "[1,2]" (TF's style) or "" for a scalar. */
static void multi_index_str(const dev_shape *s, int64_t i, char *buf, size_t len) {
  int64_t idx[PD_MAX_RANK];
  for (int d = s->rank - 1; d >= 0; d--) {
    idx[d] = s->dims[d] ? i % s->dims[d] : 0;
    i = s->dims[d] ? i / s->dims[d] : 0;
  }
  buf[0] = '\0';
  if (s->rank == 0) return;
  size_t off = 0;
  for (int d = 0; d < s->rank; d++) {
    int w = snprintf(buf + off, len - off, "%s%lld", d ? "," : "[", (long long)idx[d]);
    if (w < 0 || (size_t)w >= len - off) return;
    off += (size_t)w;
  }
  snprintf(buf + off, len - off, "]");
}

static pd_code gather_bad_index(dev_kernel_ctx *c, int64_t i, int64_t v, int64_t n,
                                dev_status *st) {
  char ib[160];
  multi_index_str(&c->in_shape[1], i, ib, sizeof ib);
  return dev_error(st, PD_INVALID_ARGUMENT, "Gather: indices%s = %lld is not in [0, %lld)",
                   ib, (long long)v, (long long)n);
}

static pd_code gather_kernel(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *ps = &c->in_shape[0];
  int64_t a = c->attrs[GATHER_AXIS].u.i;
  int axis = (int)(a < 0 ? a + ps->rank : a);
  int64_t outer = dev_dims_prod(ps, 0, axis), n = ps->dims[axis];
  size_t inner = (size_t)dev_dims_prod(ps, axis + 1, ps->rank) * pd_dtype_size(c->in_dtype[0]);
  int64_t ni = dev_num_elems(&c->in_shape[1]);
  bool i64 = c->in_dtype[1] == PD_INT64;
  const int32_t *ix32 = c->in_data[1];
  const int64_t *ix64 = c->in_data[1];
  /* Validate every index first: a bad index fails the op as TF does. */
  for (int64_t i = 0; i < ni; i++) {
    int64_t v = i64 ? ix64[i] : ix32[i];
    if (v < 0 || v >= n) return gather_bad_index(c, i, v, n, st);
  }
  if (inner == 0 || outer == 0 || ni == 0) return PD_OK;
  const char *src = c->in_data[0];
  char *dst = c->out_data[0];
  for (int64_t o = 0; o < outer; o++) {
    const char *base = src + (size_t)(o * n) * inner;
    if (i64) {
      for (int64_t i = 0; i < ni; i++, dst += inner)
        memcpy(dst, base + (size_t)ix64[i] * inner, inner);
    } else {
      for (int64_t i = 0; i < ni; i++, dst += inner)
        memcpy(dst, base + (size_t)ix32[i] * inner, inner);
    }
  }
  return PD_OK;
}

static dev_op_def gather_def = {
    .name = "Gather",
    .num_inputs = 2,
    .inputs = {{"params", false, 0}, {"indices", false, 0}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0}},
    .num_attrs = 1,
    .attrs = {{"axis", DEV_ATTR_INT, {.type = DEV_ATTR_INT, .u.i = 0}}},
    .infer = gather_infer,
    .kernels = {gather_kernel, NULL},
};

/* ------------------------------------------------------------------------ */
/* OneHot (TF OneHot, depth/on_value/off_value as attributes): the new axis
 * of size depth goes at `axis` (-1: last); indices outside [0, depth) give
 * a row of off_value.                                                       */

enum { ONEHOT_DEPTH, ONEHOT_ON, ONEHOT_OFF, ONEHOT_AXIS, ONEHOT_DTYPE };

static pd_code onehot_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0,
                         DEV_DTYPE_BIT(PD_INT32) | DEV_DTYPE_BIT(PD_INT64) |
                             DEV_DTYPE_BIT(PD_UINT8),
                         "int32, int64 or uint8", st) != PD_OK)
    return st->code;
  const dev_shape *in = &c->in_shape[0];
  int64_t depth = c->attrs[ONEHOT_DEPTH].u.i;
  int64_t axis = c->attrs[ONEHOT_AXIS].u.i;
  pd_dtype dt = c->attrs[ONEHOT_DTYPE].u.dtype;
  if (depth < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "OneHot: attribute 'depth' is %lld; expected >= 0", (long long)depth);
  if (!(DEV_MASK_NUMBER & DEV_DTYPE_BIT(dt)))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "OneHot: attribute 'dtype' is %s; expected a number dtype "
                     "(float32, float64, float16, bfloat16, int32, int64, uint8)",
                     pd_dtype_name(dt));
  if (in->rank + 1 > PD_MAX_RANK) {
    char sb[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "OneHot: input 'indices' has shape %s (rank %d); expected rank "
                     "at most %d",
                     dev_shape_str(in, sb, sizeof sb), in->rank, PD_MAX_RANK - 1);
  }
  if (axis < -1 || axis > in->rank)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "OneHot: attribute 'axis' is %lld; expected -1 or 0..%d for "
                     "indices of rank %d",
                     (long long)axis, in->rank, in->rank);
  int ax = axis == -1 ? in->rank : (int)axis;
  dev_shape out;
  out.rank = in->rank + 1;
  for (int d = 0, o = 0; d < out.rank; d++)
    out.dims[d] = d == ax ? depth : in->dims[o++];
  if (check_out_size(c, dt, &out, st) != PD_OK) return st->code;
  c->out_dtype[0] = dt;
  c->out_shape[0] = out;
  return PD_OK;
}

/* double -> float with IEEE overflow to +-inf, never C undefined behaviour. */
static float d2f(double v) {
  if (v > FLT_MAX) return v < 0x1.ffffffp127 ? FLT_MAX : INFINITY;
  if (v < -FLT_MAX) return v > -0x1.ffffffp127 ? -FLT_MAX : -INFINITY;
  return (float)v;
}

/* Converts v to one element of dt in *out (8 bytes of room): floats round to
 * nearest even, integers truncate and saturate, NaN -> 0. */
static void store_scalar(pd_dtype dt, double v, void *out) {
  switch (dt) {
  case PD_FLOAT32: { float f = d2f(v); memcpy(out, &f, 4); break; }
  case PD_FLOAT64: memcpy(out, &v, 8); break;
  case PD_FLOAT16: { uint16_t h = dev_float_to_half(d2f(v)); memcpy(out, &h, 2); break; }
  case PD_BFLOAT16: { uint16_t h = dev_float_to_bfloat16(d2f(v)); memcpy(out, &h, 2); break; }
  case PD_INT32: {
    int32_t x = isnan(v) ? 0 : v >= 2147483647.0 ? INT32_MAX
              : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
    memcpy(out, &x, 4);
    break;
  }
  case PD_INT64: {
    int64_t x = isnan(v) ? 0 : v >= 0x1p63 ? INT64_MAX
              : v <= -0x1p63 ? INT64_MIN : (int64_t)v;
    memcpy(out, &x, 8);
    break;
  }
  case PD_UINT8: {
    uint8_t x = isnan(v) ? 0 : v >= 255.0 ? 255 : v <= 0.0 ? 0 : (uint8_t)v;
    memcpy(out, &x, 1);
    break;
  }
  case PD_BOOL: { uint8_t x = v != 0.0; memcpy(out, &x, 1); break; }
  default: break;
  }
}

static inline int64_t load_index(pd_dtype dt, const void *p, int64_t i) {
  switch (dt) {
  case PD_INT32: return ((const int32_t *)p)[i];
  case PD_INT64: return ((const int64_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}

#define DEFINE_ONEHOT(NAME, T)                                               \
  static void NAME(const void *ind, pd_dtype idt, void *out_, int64_t outer, \
                   int64_t depth, int64_t inner, const void *on_,            \
                   const void *off_) {                                       \
    T on, off;                                                               \
    memcpy(&on, on_, sizeof on);                                             \
    memcpy(&off, off_, sizeof off);                                          \
    T *out = (T *)out_;                                                      \
    int64_t total = outer * depth * inner;                                   \
    for (int64_t i = 0; i < total; i++) out[i] = off;                        \
    for (int64_t o = 0; o < outer; o++)                                      \
      for (int64_t i = 0; i < inner; i++) {                                  \
        int64_t v = load_index(idt, ind, o * inner + i);                     \
        if (v >= 0 && v < depth) out[(o * depth + v) * inner + i] = on;      \
      }                                                                      \
  }

DEFINE_ONEHOT(onehot_1, uint8_t)
DEFINE_ONEHOT(onehot_2, uint16_t)
DEFINE_ONEHOT(onehot_4, uint32_t)
DEFINE_ONEHOT(onehot_8, uint64_t)

static pd_code onehot_kernel(dev_kernel_ctx *c, dev_status *st) {
  const dev_shape *in = &c->in_shape[0];
  int64_t depth = c->attrs[ONEHOT_DEPTH].u.i;
  int64_t axis = c->attrs[ONEHOT_AXIS].u.i;
  int ax = axis == -1 ? in->rank : (int)axis;
  pd_dtype dt = c->out_dtype[0];
  int64_t outer = dev_dims_prod(in, 0, ax), inner = dev_dims_prod(in, ax, in->rank);
  uint64_t on = 0, off = 0;
  store_scalar(dt, c->attrs[ONEHOT_ON].u.f, &on);
  store_scalar(dt, c->attrs[ONEHOT_OFF].u.f, &off);
  switch (pd_dtype_size(dt)) {
  case 1: onehot_1(c->in_data[0], c->in_dtype[0], c->out_data[0], outer, depth, inner, &on, &off); break;
  case 2: onehot_2(c->in_data[0], c->in_dtype[0], c->out_data[0], outer, depth, inner, &on, &off); break;
  case 4: onehot_4(c->in_data[0], c->in_dtype[0], c->out_data[0], outer, depth, inner, &on, &off); break;
  default: onehot_8(c->in_data[0], c->in_dtype[0], c->out_data[0], outer, depth, inner, &on, &off); break;
  }
  (void)st;
  return PD_OK;
}

static dev_op_def onehot_def = {
    .name = "OneHot",
    .num_inputs = 1,
    .inputs = {{"indices", false, 0}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0}},
    .num_attrs = 5,
    .attrs = {{"depth", DEV_ATTR_INT, {.type = DEV_ATTR_NONE}},
              {"on_value", DEV_ATTR_FLOAT, {.type = DEV_ATTR_FLOAT, .u.f = 1.0}},
              {"off_value", DEV_ATTR_FLOAT, {.type = DEV_ATTR_FLOAT, .u.f = 0.0}},
              {"axis", DEV_ATTR_INT, {.type = DEV_ATTR_INT, .u.i = -1}},
              {"dtype", DEV_ATTR_DTYPE, {.type = DEV_ATTR_DTYPE, .u.dtype = PD_FLOAT32}}},
    .infer = onehot_infer,
    .kernels = {onehot_kernel, NULL},
};

/* Registers the array ops and their CPU kernels (called by
 * dev_registry_init). */
void dev_register_array_ops(void) {
  dev__register_or_die(&identity_def);
  dev__register_or_die(&reshape_def);
  dev__register_or_die(&transpose_def);
  dev__register_or_die(&concat_def);
  dev__register_or_die(&slice_def);
  dev__register_or_die(&gather_def);
  dev__register_or_die(&onehot_def);
}
