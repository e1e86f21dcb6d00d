/* Binary element-wise ops with NumPy broadcasting: Add, Sub, Mul, Div, Pow,
 * Maximum, Minimum (arithmetic) and Equal, Greater, Less (comparisons, bool
 * outputs), after the TensorFlow raw ops of the same names. Integer
 * arithmetic wraps around (computed in unsigned types); integer Div
 * truncates toward zero and fails on a zero divisor; integer Pow fails on a
 * negative exponent; Maximum and Minimum propagate NaN; float16 and bfloat16
 * are computed in float32 blocks. The broadcast is collapsed into at most
 * PD_MAX_RANK axes of (out, x, y) strides; the innermost axis becomes a run
 * whose operands step by 0 or 1 (see elementwise.c's opening comment). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "device_int.h"
#include "ops/elementwise_int.h"

/* ------------------------------------------------------------------------ */
/* Binary ops                                                               */

typedef enum ew_binary {
  BIN_ADD,
  BIN_SUB,
  BIN_MUL,
  BIN_DIV,
  BIN_POW,
  BIN_MAX,
  BIN_MIN,
  BIN_EQ,
  BIN_GT,
  BIN_LT,
} ew_binary;

/* Run-time failures of integer ops, reported by the run functions. */
enum { EW_OK = 0, EW_DIV_BY_ZERO = 1, EW_NEG_POW = 2 };

/* A run of n output elements; operand x steps by sa (0 or 1) elements, y by
 * sb. Returns EW_OK or a run-time failure. */
typedef int (*ew_run_fn)(ew_binary op, const void *a, int sa, const void *b,
                         int sb, void *out, int64_t n);

/* The loop of one op over a run, specialised on which operand steps so
 * that the common cases are plain vectorisable loops. EXPR reads x and y. */
#define EW_RUN(T, OT, EXPR)                                                    \
  do {                                                                         \
    const T *pa_ = (const T *)a;                                               \
    const T *pb_ = (const T *)b;                                               \
    OT *po_ = (OT *)out;                                                       \
    if (sa && sb) {                                                            \
      for (int64_t i = 0; i < n; i++) {                                        \
        T x = pa_[i], y = pb_[i];                                              \
        po_[i] = (EXPR);                                                       \
      }                                                                        \
    } else if (sa) {                                                           \
      T y = pb_[0];                                                            \
      for (int64_t i = 0; i < n; i++) {                                        \
        T x = pa_[i];                                                          \
        po_[i] = (EXPR);                                                       \
      }                                                                        \
    } else if (sb) {                                                           \
      T x = pa_[0];                                                            \
      for (int64_t i = 0; i < n; i++) {                                        \
        T y = pb_[i];                                                          \
        po_[i] = (EXPR);                                                       \
      }                                                                        \
    } else {                                                                   \
      T x = pa_[0], y = pb_[0];                                                \
      OT v_ = (EXPR);                                                          \
      for (int64_t i = 0; i < n; i++) po_[i] = v_;                             \
    }                                                                          \
  } while (0)

/* Comparisons write bool (one byte, 0 or 1). */
#define EW_RUN_FLOAT(T, POW)                                                   \
  switch (op) {                                                                \
    case BIN_ADD: EW_RUN(T, T, x + y); break;                                  \
    case BIN_SUB: EW_RUN(T, T, x - y); break;                                  \
    case BIN_MUL: EW_RUN(T, T, x *y); break;                                   \
    case BIN_DIV: EW_RUN(T, T, x / y); break;                                  \
    case BIN_POW: EW_RUN(T, T, POW(x, y)); break;                              \
    case BIN_MAX: EW_RUN(T, T, (x != x || x > y) ? x : y); break;              \
    case BIN_MIN: EW_RUN(T, T, (x != x || x < y) ? x : y); break;              \
    case BIN_EQ: EW_RUN(T, uint8_t, (uint8_t)(x == y)); break;                 \
    case BIN_GT: EW_RUN(T, uint8_t, (uint8_t)(x > y)); break;                  \
    case BIN_LT: EW_RUN(T, uint8_t, (uint8_t)(x < y)); break;                  \
  }                                                                            \
  return EW_OK;

static int ew_run_f32(ew_binary op, const void *a, int sa, const void *b,
                      int sb, void *out, int64_t n) {
  EW_RUN_FLOAT(float, powf)
}

static int ew_run_f64(ew_binary op, const void *a, int sa, const void *b,
                      int sb, void *out, int64_t n){EW_RUN_FLOAT(double, pow)}
/* float16 / bfloat16: convert a block of each stepping operand (or the one
 * element of a fixed one) to float32, run the float32 loop, round back.
 * Comparisons write their bools straight into the output. */
#define EW_RUN_HALF(NAME, TO_F32, FROM_F32)                                    \
  static int NAME(ew_binary op, const void *a, int sa, const void *b, int sb,  \
                  void *out, int64_t n) {                                      \
    const uint16_t *ha = (const uint16_t *)a;                                  \
    const uint16_t *hb = (const uint16_t *)b;                                  \
    bool cmp = op == BIN_EQ || op == BIN_GT || op == BIN_LT;                   \
    float fa[EW_BLOCK], fb[EW_BLOCK], fo[EW_BLOCK];                            \
    if (!sa) fa[0] = TO_F32(ha[0]);                                            \
    if (!sb) fb[0] = TO_F32(hb[0]);                                            \
    for (int64_t off = 0; off < n; off += EW_BLOCK) {                          \
      int64_t m = n - off < EW_BLOCK ? n - off : EW_BLOCK;                     \
      if (sa)                                                                  \
        for (int64_t i = 0; i < m; i++) fa[i] = TO_F32(ha[off + i]);           \
      if (sb)                                                                  \
        for (int64_t i = 0; i < m; i++) fb[i] = TO_F32(hb[off + i]);           \
      if (cmp) {                                                               \
        ew_run_f32(op, fa, sa, fb, sb, (uint8_t *)out + off, m);               \
      } else {                                                                 \
        uint16_t *ho = (uint16_t *)out + off;                                  \
        ew_run_f32(op, fa, sa, fb, sb, fo, m);                                 \
        for (int64_t i = 0; i < m; i++) ho[i] = FROM_F32(fo[i]);               \
      }                                                                        \
    }                                                                          \
    return EW_OK;                                                              \
  }

EW_RUN_HALF(ew_run_f16, ew_f16_to_f32, ew_f32_to_f16)
    EW_RUN_HALF(ew_run_bf16, ew_bf16_to_f32, ew_f32_to_bf16)

/* Signed integers: wrap-around arithmetic in the unsigned type UT; Div
 * truncates toward zero and MIN / -1 wraps to MIN (no trap). */
#define EW_RUN_SIGNED(T, UT)                                                   \
  int bad = EW_OK;                                                             \
  switch (op) {                                                                \
    case BIN_ADD: EW_RUN(T, T, (T)((UT)x + (UT)y)); break;                     \
    case BIN_SUB: EW_RUN(T, T, (T)((UT)x - (UT)y)); break;                     \
    case BIN_MUL: EW_RUN(T, T, (T)((UT)x * (UT)y)); break;                     \
    case BIN_DIV:                                                              \
      EW_RUN(T, T,                                                             \
             y == 0    ? (bad = EW_DIV_BY_ZERO, (T)0)                          \
             : y == -1 ? (T)(0u - (UT)x)                                       \
                       : (T)(x / y));                                          \
      break;                                                                   \
    case BIN_POW:                                                              \
      EW_RUN(T, T,                                                             \
             y < 0 ? (bad = EW_NEG_POW, (T)0)                                  \
                   : (T)(UT)ew_ipow((uint64_t)x, (uint64_t)y));                \
      break;                                                                   \
    case BIN_MAX: EW_RUN(T, T, x > y ? x : y); break;                          \
    case BIN_MIN: EW_RUN(T, T, x < y ? x : y); break;                          \
    case BIN_EQ: EW_RUN(T, uint8_t, (uint8_t)(x == y)); break;                 \
    case BIN_GT: EW_RUN(T, uint8_t, (uint8_t)(x > y)); break;                  \
    case BIN_LT: EW_RUN(T, uint8_t, (uint8_t)(x < y)); break;                  \
  }                                                                            \
  return bad;

        static int ew_run_i32(ew_binary op, const void *a, int sa,
                              const void *b, int sb, void *out, int64_t n) {
  EW_RUN_SIGNED(int32_t, uint32_t)
}

static int ew_run_i64(ew_binary op, const void *a, int sa, const void *b,
                      int sb, void *out, int64_t n) {
  EW_RUN_SIGNED(int64_t, uint64_t)
}

static int ew_run_u8(ew_binary op, const void *a, int sa, const void *b, int sb,
                     void *out, int64_t n) {
  int bad = EW_OK;
  switch (op) {
    case BIN_ADD: EW_RUN(uint8_t, uint8_t, (uint8_t)(x + y)); break;
    case BIN_SUB: EW_RUN(uint8_t, uint8_t, (uint8_t)(x - y)); break;
    case BIN_MUL: EW_RUN(uint8_t, uint8_t, (uint8_t)((unsigned)x * y)); break;
    case BIN_DIV:
      EW_RUN(uint8_t, uint8_t,
             y == 0 ? (bad = EW_DIV_BY_ZERO, (uint8_t)0) : (uint8_t)(x / y));
      break;
    case BIN_POW: EW_RUN(uint8_t, uint8_t, (uint8_t)ew_ipow(x, y)); break;
    case BIN_MAX: EW_RUN(uint8_t, uint8_t, x > y ? x : y); break;
    case BIN_MIN: EW_RUN(uint8_t, uint8_t, x < y ? x : y); break;
    case BIN_EQ: EW_RUN(uint8_t, uint8_t, (uint8_t)(x == y)); break;
    case BIN_GT: EW_RUN(uint8_t, uint8_t, (uint8_t)(x > y)); break;
    case BIN_LT: EW_RUN(uint8_t, uint8_t, (uint8_t)(x < y)); break;
  }
  return bad;
}

/* bool takes Equal only; any non-zero byte is true. */
static int ew_run_bool(ew_binary op, const void *a, int sa, const void *b,
                       int sb, void *out, int64_t n) {
  if (op == BIN_EQ) EW_RUN(uint8_t, uint8_t, (uint8_t)((x != 0) == (y != 0)));
  return EW_OK;
}

/* The broadcast of (x, y) onto the output, collapsed: `rank` axes with the
 * output's dims and each operand's element strides (0 where broadcast). */
typedef struct ew_plan {
  int rank;
  int64_t dims[PD_MAX_RANK];
  int64_t sa[PD_MAX_RANK];
  int64_t sb[PD_MAX_RANK];
} ew_plan;

/* Strides of operand `s` (right-aligned to the output's rank `r`) on each
 * output axis: 0 where the operand has no such axis or a dim of 1. */
static void ew_strides(const dev_shape *s, int r, int64_t *strides) {
  int64_t stride = 1;
  for (int i = r - 1; i >= 0; i--) {
    int j = i - (r - s->rank);
    int64_t d = j >= 0 ? s->dims[j] : 1;
    strides[i] = d == 1 ? 0 : stride;
    stride *= d;
  }
}

/* Drops output axes of size 1 and merges neighbours that are contiguous in
 * both operands (outer stride == inner stride * inner dim, which also holds
 * for two broadcast axes). The innermost stride of each operand stays 0 or
 * 1. A single-element output ends up with one axis of 1. */
static void ew_plan_make(const dev_shape *out, const dev_shape *a,
                         const dev_shape *b, ew_plan *p) {
  int64_t sa[PD_MAX_RANK], sb[PD_MAX_RANK];
  ew_strides(a, out->rank, sa);
  ew_strides(b, out->rank, sb);
  p->rank = 0;
  for (int i = 0; i < out->rank; i++) {
    int64_t d = out->dims[i];
    if (d == 1) continue;
    int k = p->rank - 1;
    if (k >= 0 && p->sa[k] == sa[i] * d && p->sb[k] == sb[i] * d) {
      p->dims[k] *= d;
      p->sa[k] = sa[i];
      p->sb[k] = sb[i];
      continue;
    }
    p->dims[p->rank] = d;
    p->sa[p->rank] = sa[i];
    p->sb[p->rank] = sb[i];
    p->rank++;
  }
  if (p->rank == 0) {
    p->rank = 1;
    p->dims[0] = 1;
    p->sa[0] = 0;
    p->sb[0] = 0;
  }
}

/* Walks the outer axes of the plan with an N-d counter and calls `run` on
 * each innermost run. Stops at the first run-time failure. */
static int ew_broadcast(const ew_plan *p, ew_run_fn run, ew_binary op,
                        const char *a, const char *b, char *out, size_t es,
                        size_t out_es) {
  int inner = p->rank - 1;
  int64_t len = p->dims[inner];
  int ia = p->sa[inner] != 0, ib = p->sb[inner] != 0;
  int64_t idx[PD_MAX_RANK] = {0};
  int64_t oa = 0, ob = 0, oo = 0;
  for (;;) {
    int bad = run(op, a + (size_t)oa * es, ia, b + (size_t)ob * es, ib,
                  out + (size_t)oo * out_es, len);
    if (bad != EW_OK) return bad;
    oo += len;
    int k = inner - 1;
    for (; k >= 0; k--) {
      oa += p->sa[k];
      ob += p->sb[k];
      if (++idx[k] < p->dims[k]) break;
      oa -= p->sa[k] * p->dims[k];
      ob -= p->sb[k] * p->dims[k];
      idx[k] = 0;
    }
    if (k < 0) return EW_OK;
  }
}

static pd_code ew_binary_kernel(dev_kernel_ctx *c, ew_binary op,
                                dev_status *st) {
  const dev_shape *os = &c->out_shape[0];
  if (ew_count(os) == 0) return PD_OK;
  ew_run_fn run;
  switch (c->in_dtype[0]) {
    case PD_FLOAT32: run = ew_run_f32; break;
    case PD_FLOAT64: run = ew_run_f64; break;
    case PD_FLOAT16: run = ew_run_f16; break;
    case PD_BFLOAT16: run = ew_run_bf16; break;
    case PD_INT32: run = ew_run_i32; break;
    case PD_INT64: run = ew_run_i64; break;
    case PD_UINT8: run = ew_run_u8; break;
    case PD_BOOL: run = ew_run_bool; break;
    default:
      return dev_error(st, PD_INTERNAL, "%s: no kernel for dtype %s",
                       c->op->name, pd_dtype_name(c->in_dtype[0]));
  }
  ew_plan plan;
  ew_plan_make(os, &c->in_shape[0], &c->in_shape[1], &plan);
  int bad = ew_broadcast(&plan, run, op, (const char *)c->in_data[0],
                         (const char *)c->in_data[1], (char *)c->out_data[0],
                         pd_dtype_size(c->in_dtype[0]),
                         pd_dtype_size(c->out_dtype[0]));
  if (bad == EW_DIV_BY_ZERO)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: integer division by zero",
                     c->op->name);
  if (bad == EW_NEG_POW)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: integers to negative integer powers are not allowed",
                     c->op->name);
  return PD_OK;
}

/* x and y of one dtype in `mask`, shapes that broadcast (NumPy); output of
 * the broadcast shape and of x's dtype, or bool when `to_bool`. */
static pd_code ew_binary_infer(dev_infer_ctx *c, unsigned mask,
                               const char *expected, bool to_bool,
                               dev_status *st) {
  pd_code rc = dev_check_dtype_in(c, 0, mask, expected, st);
  if (rc == PD_OK) rc = dev_check_same_dtype(c, 0, 1, st);
  if (rc != PD_OK) return rc;
  dev_shape out;
  dev_status tmp = DEV_STATUS_INIT;
  if (dev_shape_broadcast(&c->in_shape[0], &c->in_shape[1], &out, &tmp) !=
      PD_OK) {
    char sx[128], sy[128];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: x has shape %s and y has shape %s, which do not "
                     "broadcast; expected each pair of trailing dims to be "
                     "equal or one of them 1 (NumPy broadcasting)",
                     c->op->name, dev_shape_str(&c->in_shape[0], sx, sizeof sx),
                     dev_shape_str(&c->in_shape[1], sy, sizeof sy));
  }
  pd_dtype odt = to_bool ? PD_BOOL : c->in_dtype[0];
  size_t bytes;
  PD_TRY(dev_shape_byte_size(odt, &out, &bytes, st));
  c->out_dtype[0] = odt;
  c->out_shape[0] = out;
  return PD_OK;
}

static pd_code ew_infer_arith(dev_infer_ctx *c, dev_status *st) {
  return ew_binary_infer(c, DEV_MASK_NUMBER, EW_EXPECT_NUMBER, false, st);
}

static pd_code ew_infer_order(dev_infer_ctx *c, dev_status *st) {
  return ew_binary_infer(c, DEV_MASK_NUMBER, EW_EXPECT_NUMBER, true, st);
}

static pd_code ew_infer_equal(dev_infer_ctx *c, dev_status *st) {
  return ew_binary_infer(c, DEV_MASK_ALL, "any dtype", true, st);
}

#define EW_BINARY_KERNEL(FN, OP)                                               \
  static pd_code FN(dev_kernel_ctx *c, dev_status *st) {                       \
    return ew_binary_kernel(c, OP, st);                                        \
  }

EW_BINARY_KERNEL(ew_k_add, BIN_ADD)
EW_BINARY_KERNEL(ew_k_sub, BIN_SUB)
EW_BINARY_KERNEL(ew_k_mul, BIN_MUL)
EW_BINARY_KERNEL(ew_k_div, BIN_DIV)
EW_BINARY_KERNEL(ew_k_pow, BIN_POW)
EW_BINARY_KERNEL(ew_k_max, BIN_MAX)
EW_BINARY_KERNEL(ew_k_min, BIN_MIN)
EW_BINARY_KERNEL(ew_k_equal, BIN_EQ)
EW_BINARY_KERNEL(ew_k_greater, BIN_GT)
EW_BINARY_KERNEL(ew_k_less, BIN_LT)

/* ------------------------------------------------------------------------ */
/* Registration                                                             */

static dev_op_def binary_defs[] = {
    /* Binary with broadcasting, TF raw ops of the same names. */
    EW_BINARY_DEF("Add", ew_infer_arith, ew_k_add, DEV_MASK_NUMBER,
                  DEV_MASK_NUMBER, "same as x",
                  "z = x + y, element-wise with NumPy broadcasting; integers "
                  "wrap around.",
                  NULL),
    EW_BINARY_DEF("Sub", ew_infer_arith, ew_k_sub, DEV_MASK_NUMBER,
                  DEV_MASK_NUMBER, "same as x",
                  "z = x - y, element-wise with NumPy broadcasting; integers "
                  "wrap around.",
                  NULL),
    EW_BINARY_DEF("Mul", ew_infer_arith, ew_k_mul, DEV_MASK_NUMBER,
                  DEV_MASK_NUMBER, "same as x",
                  "z = x * y, element-wise with NumPy broadcasting; integers "
                  "wrap around.",
                  NULL),
    EW_BINARY_DEF("Div", ew_infer_arith, ew_k_div, DEV_MASK_NUMBER,
                  DEV_MASK_NUMBER, "same as x",
                  "z = x / y, element-wise with NumPy broadcasting; integer "
                  "division truncates toward zero and fails on a zero divisor.",
                  NULL),
    EW_BINARY_DEF("Pow", ew_infer_arith, ew_k_pow, DEV_MASK_NUMBER,
                  DEV_MASK_NUMBER, "same as x",
                  "z = x ^ y, element-wise with NumPy broadcasting; an integer "
                  "to a negative power fails.",
                  NULL),
    EW_BINARY_DEF(
        "Maximum", ew_infer_arith, ew_k_max, DEV_MASK_NUMBER, DEV_MASK_NUMBER,
        "same as x",
        "z = max(x, y), element-wise with NumPy broadcasting; NaN propagates.",
        NULL),
    EW_BINARY_DEF(
        "Minimum", ew_infer_arith, ew_k_min, DEV_MASK_NUMBER, DEV_MASK_NUMBER,
        "same as x",
        "z = min(x, y), element-wise with NumPy broadcasting; NaN propagates.",
        NULL),
    EW_BINARY_DEF(
        "Equal", ew_infer_equal, ew_k_equal, DEV_MASK_ALL,
        DEV_DTYPE_BIT(PD_BOOL), "bool",
        "z = (x == y) as bool, element-wise with NumPy broadcasting.",
        "Differs from tf.raw_ops.Equal: no `incompatible_shape_error` "
        "attribute (shapes that do not broadcast are always an error)."),
    EW_BINARY_DEF("Greater", ew_infer_order, ew_k_greater, DEV_MASK_NUMBER,
                  DEV_DTYPE_BIT(PD_BOOL), "bool",
                  "z = (x > y) as bool, element-wise with NumPy broadcasting.",
                  NULL),
    EW_BINARY_DEF("Less", ew_infer_order, ew_k_less, DEV_MASK_NUMBER,
                  DEV_DTYPE_BIT(PD_BOOL), "bool",
                  "z = (x < y) as bool, element-wise with NumPy broadcasting.",
                  NULL),
};

/* Registers the binary element-wise ops and their CPU kernels. */
void dev_register_binary_ops(void) {
  for (size_t i = 0; i < sizeof binary_defs / sizeof binary_defs[0]; i++)
    dev__register_or_die(&binary_defs[i]);
}
