/* Array ops that reshape or reorder a whole tensor: Identity, Reshape and
 * Transpose (Concat, Slice, Gather and OneHot are in slicing.c).
 *
 * Semantics follow the TensorFlow raw ops of the same names. These ops move
 * bytes; kernels work by element size, so every dtype takes the same path,
 * and copy contiguous runs with memcpy wherever the layout allows. */
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
    w = snprintf(buf + off, len - off, "%s%lld", i ? ", " : "",
                 (long long)v[i]);
    if (w < 0 || (size_t)w >= len - off) return buf;
    off += (size_t)w;
  }
  snprintf(buf + off, len - off, "]");
  return buf;
}

/* ------------------------------------------------------------------------ */
/* Identity (TF Identity): output 0 aliases input 0, no kernel runs.         */

static pd_code identity_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK)
    return st->code;
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[0];
  return PD_OK;
}

static dev_op_def identity_def = {
    .name = "Identity",
    .num_inputs = 1,
    .inputs = {{"input", false, 0, DEV_MASK_ALL}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as input"}},
    .num_attrs = 0,
    .flags = DEV_OP_ALIASES_INPUT,
    .infer = identity_infer,
    .kernels = {NULL, NULL},
    .summary = "output = input (shares input's memory; no kernel runs).",
};

/* ------------------------------------------------------------------------ */
/* Reshape (TF Reshape, the shape given as attribute "shape"): one -1 is
 * inferred from the element count, per component. Output aliases input. */

enum { RESHAPE_SHAPE = 0 };

static pd_code reshape_infer(dev_infer_ctx *c, dev_status *st) {
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK)
    return st->code;
  const dev_attr_value *a = &c->attrs[RESHAPE_SHAPE];
  const int64_t *v = a->u.ilist.v;
  int n = a->u.ilist.n;
  const dev_shape *in = &c->in_shape[0];
  char want[400], got[160];
  if (n > PD_MAX_RANK)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "Reshape: attribute 'shape' %s has %d dims; expected at most %d",
        ilist_str(v, n, want, sizeof want), n, PD_MAX_RANK);
  int unknown = -1;
  bool has_zero = false;
  int64_t product = 1; /* of the non-zero, known sizes */
  for (int i = 0; i < n; i++) {
    if (v[i] == -1) {
      if (unknown >= 0)
        return dev_error(
            st, PD_INVALID_ARGUMENT,
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
      return dev_error(
          st, PD_INVALID_ARGUMENT,
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
      if (in->dims[i] > 0 || !has_zero)
        in_nz *= in->dims[i];
      else
        in_has_zero = true;
    }
    int64_t missing = in_nz / product;
    if (!in_has_zero && missing * product != in_nz)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "Reshape: cannot reshape input 'tensor' of shape %s (%lld elements) "
          "into shape %s; expected an element count that is a multiple of %lld",
          dev_shape_str(in, got, sizeof got), (long long)in_count,
          ilist_str(v, n, want, sizeof want), (long long)product);
    out.dims[unknown] = missing;
  }
  int64_t out_count = has_zero ? 0 : product;
  if (unknown >= 0 && !has_zero) out_count = product * out.dims[unknown];
  if (out_count != in_count)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
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
    .inputs = {{"tensor", false, 0, DEV_MASK_ALL}},
    .num_outputs = 1,
    .outputs = {{"output", false, 0, DEV_MASK_ALL, "same as tensor"}},
    .num_attrs = 1,
    .attrs = {{"shape",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_NONE},
               .doc = "the new dims; one -1 is inferred from the element "
                      "count (per component)",
               .has_min = true,
               .min = -1}},
    .flags = DEV_OP_ALIASES_INPUT,
    .infer = reshape_infer,
    .kernels = {NULL, NULL},
    .summary =
        "output = tensor's elements in row-major order with the "
        "attribute shape (shares tensor's memory).",
    .notes =
        "Differs from tf.raw_ops.Reshape: TF takes the new shape as an "
        "input tensor `shape` (int32/int64); here `shape` is an int-list "
        "attribute. As in TF, one entry may be -1.",
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
  if (dev_check_dtype_in(c, 0, DEV_MASK_ALL, NULL, st) != PD_OK)
    return st->code;
  const dev_attr_value *a = &c->attrs[TRANSPOSE_PERM];
  const dev_shape *in = &c->in_shape[0];
  int n = a->u.ilist.n;
  char pb[400], sb[160];
  if (n != 0) {
    if (n != in->rank)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "Transpose: attribute 'perm' %s has %d entries but input 'x' has "
          "shape %s (rank %d); expected a permutation of 0..%d",
          ilist_str(a->u.ilist.v, n, pb, sizeof pb), n,
          dev_shape_str(in, sb, sizeof sb), in->rank, in->rank - 1);
    bool seen[PD_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
      int64_t p = a->u.ilist.v[i];
      if (p < 0 || p >= n || seen[p])
        return dev_error(
            st, PD_INVALID_ARGUMENT,
            "Transpose: attribute 'perm' %s is not a permutation of 0..%d "
            "(entry %d is %lld); expected each axis of input 'x' exactly once",
            ilist_str(a->u.ilist.v, n, pb, sizeof pb), n - 1, i, (long long)p);
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
      if (p->perm[i + 1] == p->perm[i] + 1) {
        at = i;
        break;
      }
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
#define DEFINE_TP_TILE(NAME, T)                                                \
  static void NAME(const void *in_, void *out_, int64_t nj, int64_t nk,        \
                   int64_t os_j, int64_t is_k) {                               \
    const T *in = (const T *)in_;                                              \
    T *out = (T *)out_;                                                        \
    for (int64_t j0 = 0; j0 < nj; j0 += TP_TILE) {                             \
      int64_t j1 = j0 + TP_TILE < nj ? j0 + TP_TILE : nj;                      \
      for (int64_t k0 = 0; k0 < nk; k0 += TP_TILE) {                           \
        int64_t k1 = k0 + TP_TILE < nk ? k0 + TP_TILE : nk;                    \
        for (int64_t j = j0; j < j1; j++) {                                    \
          T *o = out + j * os_j;                                               \
          const T *s = in + j;                                                 \
          for (int64_t k = k0; k < k1; k++) o[k] = s[k * is_k];                \
        }                                                                      \
      }                                                                        \
    }                                                                          \
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
  tp_tile_fn tile = es == 1   ? tp_tile_1
                    : es == 2 ? tp_tile_2
                    : es == 4 ? tp_tile_4
                              : tp_tile_8;
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
    .inputs = {{"x", false, 0, DEV_MASK_ALL}},
    .num_outputs = 1,
    .outputs = {{"y", false, 0, DEV_MASK_ALL, "same as x"}},
    .num_attrs = 1,
    .attrs = {{"perm",
               DEV_ATTR_INT_LIST,
               {.type = DEV_ATTR_NONE},
               .doc = "a permutation of 0..rank-1; [] reverses the axes",
               .has_min = true,
               .min = 0}},
    .infer = transpose_infer,
    .kernels = {transpose_kernel, NULL},
    .summary = "y = x with its axes permuted: y.dims[i] = x.dims[perm[i]].",
    .notes =
        "Differs from tf.raw_ops.Transpose: TF takes `perm` as an input "
        "tensor; here it is a required int-list attribute, and an "
        "empty `perm` reverses the axes (numpy.transpose).",
};

/* Registers Identity, Reshape and Transpose and their CPU kernels (called by
 * dev_registry_init). */
void dev_register_array_ops(void) {
  dev__register_or_die(&identity_def);
  dev__register_or_die(&reshape_def);
  dev__register_or_die(&transpose_def);
}
