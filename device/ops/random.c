/* Random ops: RandomUniform, RandomNormal, and DeviceId.
 *
 * RandomUniform and RandomNormal follow TensorFlow's RandomUniform and
 * RandomStandardNormal (with shape, minval/maxval and mean/stddev given as
 * attributes). The generator is Philox4x32-10 (Salmon et al., "Parallel
 * random numbers: as easy as 1, 2, 3", SC'11; the generator of TensorFlow and
 * cuRAND), counter-based, so every value depends only on (seed, seed2, its
 * position) and, with per_device, the device index:
 *   key     = seed (64 bits; with per_device XORed with a hash of the device)
 *   counter = [block index (64 bits), seed2 (64 bits)]
 * One block of 4 x 32 random bits gives 4 float32 values or 2 float64 values
 * (uniform), 4 float32 or 2 float64 normals (Box-Muller). The same seed gives
 * the same values on every run and on every device set.
 *
 * DeviceId follows the parallel device's DeviceID: each component holds its
 * own device index as an int32 scalar. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "device_int.h"

/* ------------------------------------------------------------------------ */
/* Philox4x32-10                                                             */

typedef struct philox_key {
  uint32_t k[2];
  uint32_t c2, c3; /* the high counter words */
} philox_key;

/* Returns 4 x 32 random bits for counter (ctr_lo, ctr_hi, c2, c3) under key. */
static inline void philox4x32_10(const philox_key *pk, uint64_t block,
                                 uint32_t out[4]) {
  uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32);
  uint32_t c2 = pk->c2, c3 = pk->c3;
  uint32_t k0 = pk->k[0], k1 = pk->k[1];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = (uint32_t)p1;
    c2 = n2;
    c3 = (uint32_t)p0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* SplitMix64's finalizer: a bijective 64-bit hash. */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

static philox_key make_key(uint64_t seed, uint64_t seed2, bool per_device,
                           int device) {
  if (per_device) seed ^= mix64((uint64_t)device + 1);
  philox_key pk;
  pk.k[0] = (uint32_t)seed;
  pk.k[1] = (uint32_t)(seed >> 32);
  pk.c2 = (uint32_t)seed2;
  pk.c3 = (uint32_t)(seed2 >> 32);
  return pk;
}

/* Uniform in [0, 1) from the top 24 bits (float32) or 53 bits (float64). */
static inline float u24(uint32_t x) { return (float)(x >> 8) * 0x1p-24f; }
static inline double u53(uint32_t hi, uint32_t lo) {
  return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

/* ------------------------------------------------------------------------ */
/* Representable bounds of [minval, maxval) in a float dtype                 */

static uint16_t f16_bits(pd_dtype dt, float f) {
  return dt == PD_FLOAT16 ? dev_float_to_half(f) : dev_float_to_bfloat16(f);
}
static float f16_val(pd_dtype dt, uint16_t h) {
  return dt == PD_FLOAT16 ? dev_half_to_float(h) : dev_bfloat16_to_float(h);
}
/* Next 16-bit float pattern up / down (sign-magnitude encoding). */
static uint16_t f16_up(uint16_t h) {
  if (h == 0x8000) return 0x0001;
  return (h & 0x8000) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}
static uint16_t f16_down(uint16_t h) {
  if (h == 0x0000) return 0x8001;
  return (h & 0x8000) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

/* Largest finite value of a float dtype. */
static double dtype_max(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT64: return DBL_MAX;
    case PD_FLOAT32: return FLT_MAX;
    case PD_FLOAT16: return 65504.0;
    default: return 0x1.fep127; /* bfloat16 */
  }
}

/* Smallest value of dt >= minval (lo) and largest value of dt < maxval (hi),
 * as doubles. minval and maxval are finite and within dt's range. Returns
 * false when no value of dt lies in [minval, maxval). */
static bool uniform_bounds(pd_dtype dt, double minval, double maxval,
                           double *lo, double *hi) {
  switch (dt) {
    case PD_FLOAT64:
      *lo = minval;
      *hi = nextafter(maxval, -INFINITY);
      break;
    case PD_FLOAT32: {
      float l = (float)minval, h = (float)maxval;
      if ((double)l < minval) l = nextafterf(l, INFINITY);
      if ((double)h >= maxval) h = nextafterf(h, -INFINITY);
      *lo = l;
      *hi = h;
      break;
    }
    default: { /* float16, bfloat16: float -> 16 bits may round twice */
      uint16_t l = f16_bits(dt, (float)minval), h = f16_bits(dt, (float)maxval);
      while ((double)f16_val(dt, l) < minval) l = f16_up(l);
      while ((double)f16_val(dt, f16_down(l)) >= minval) l = f16_down(l);
      while ((double)f16_val(dt, h) >= maxval) h = f16_down(h);
      while ((double)f16_val(dt, f16_up(h)) < maxval) h = f16_up(h);
      *lo = f16_val(dt, l);
      *hi = f16_val(dt, h);
      break;
    }
  }
  return *lo <= *hi;
}

/* ------------------------------------------------------------------------ */
/* RandomUniform, RandomNormal                                               */

/* Attribute order shared by both ops; P0/P1 are minval/maxval (uniform) or
 * mean/stddev (normal). */
enum { R_SHAPE, R_DTYPE, R_SEED, R_SEED2, R_P0, R_P1, R_PER_DEVICE };

static pd_code random_common_infer(dev_infer_ctx *c, dev_status *st) {
  const char *op = c->op->name;
  pd_dtype dt = c->attrs[R_DTYPE].u.dtype;
  const dev_shape *s = &c->attrs[R_SHAPE].u.shape;
  if (!(DEV_MASK_FLOAT & DEV_DTYPE_BIT(dt)))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "%s: attribute 'dtype' is %s; expected float32, float64, float16 "
        "or bfloat16",
        op, pd_dtype_name(dt));
  char sb[160];
  if (s->rank < 0 || s->rank > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: attribute 'shape' has rank %d; expected 0..%d", op,
                     s->rank, PD_MAX_RANK);
  for (int d = 0; d < s->rank; d++)
    if (s->dims[d] < 0)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "%s: attribute 'shape' %s has %lld on axis %d; expected dims >= 0",
          op, dev_shape_str(s, sb, sizeof sb), (long long)s->dims[d], d);
  size_t bytes;
  dev_status tmp = DEV_STATUS_INIT;
  if (dev_shape_byte_size(dt, s, &bytes, &tmp) != PD_OK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: attribute 'shape' %s of dtype %s is too large (%s)",
                     op, dev_shape_str(s, sb, sizeof sb), pd_dtype_name(dt),
                     tmp.msg);
  c->out_dtype[0] = dt;
  c->out_shape[0] = *s;
  return PD_OK;
}

static pd_code uniform_infer(dev_infer_ctx *c, dev_status *st) {
  if (random_common_infer(c, st) != PD_OK) return st->code;
  pd_dtype dt = c->out_dtype[0];
  double minval = c->attrs[R_P0].u.f, maxval = c->attrs[R_P1].u.f,
         m = dtype_max(dt);
  if (!(fabs(minval) <= m) || !(fabs(maxval) <= m))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "RandomUniform: attributes minval = %g, maxval = %g; expected "
        "finite values within the range of %s (+-%g)",
        minval, maxval, pd_dtype_name(dt), m);
  if (!(maxval > minval))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "RandomUniform: attributes minval = %g, maxval = %g; expected "
        "maxval > minval",
        minval, maxval);
  if (!isfinite(maxval - minval))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "RandomUniform: maxval - minval (%g - %g) overflows float64", maxval,
        minval);
  double lo, hi;
  if (!uniform_bounds(dt, minval, maxval, &lo, &hi))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "RandomUniform: no %s value lies in [minval, maxval) = [%.17g, "
        "%.17g); expected a wider interval",
        pd_dtype_name(dt), minval, maxval);
  return PD_OK;
}

static pd_code normal_infer(dev_infer_ctx *c, dev_status *st) {
  if (random_common_infer(c, st) != PD_OK) return st->code;
  double mean = c->attrs[R_P0].u.f, stddev = c->attrs[R_P1].u.f;
  if (!isfinite(mean) || !isfinite(stddev) || stddev < 0)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "RandomNormal: attributes mean = %g, stddev = %g; expected finite "
        "values and stddev >= 0",
        mean, stddev);
  return PD_OK;
}

static philox_key kernel_key(const dev_kernel_ctx *c) {
  return make_key((uint64_t)c->attrs[R_SEED].u.i,
                  (uint64_t)c->attrs[R_SEED2].u.i, c->attrs[R_PER_DEVICE].u.b,
                  c->index); /* per position in the op's set (issue #17) */
}

static int64_t out_count(const dev_kernel_ctx *c) {
  int64_t n = 1;
  for (int d = 0; d < c->out_shape[0].rank; d++) n *= c->out_shape[0].dims[d];
  return n;
}

static pd_code uniform_kernel(dev_kernel_ctx *c, dev_status *st) {
  philox_key pk = kernel_key(c);
  pd_dtype dt = c->out_dtype[0];
  double minval = c->attrs[R_P0].u.f, maxval = c->attrs[R_P1].u.f;
  double range = maxval - minval, lo, hi;
  uniform_bounds(dt, minval, maxval, &lo, &hi);
  int64_t n = out_count(c);
  uint32_t x[4];
  /* Each value is clamped into [lo, hi], both representable in dt, before
   * rounding to dt; rounding is monotonic, so it stays in [minval, maxval). */
  if (dt == PD_FLOAT64) {
    double *out = c->out_data[0];
    for (int64_t i = 0; i < n; i += 2) {
      philox4x32_10(&pk, (uint64_t)(i / 2), x);
      double v[2] = {minval + range * u53(x[0], x[1]),
                     minval + range * u53(x[2], x[3])};
      for (int j = 0; j < 2 && i + j < n; j++)
        out[i + j] = fmin(fmax(v[j], lo), hi);
    }
  } else if (dt == PD_FLOAT32) {
    float *out = c->out_data[0];
    for (int64_t i = 0; i < n; i += 4) {
      philox4x32_10(&pk, (uint64_t)(i / 4), x);
      for (int j = 0; j < 4 && i + j < n; j++) {
        double v = minval + range * (double)u24(x[j]);
        out[i + j] = (float)fmin(fmax(v, lo), hi);
      }
    }
  } else {
    /* 16-bit floats: a uniform on the dtype's own grid over [0, 1) (11 bits
     * for float16, 8 for bfloat16, exact in the dtype), as TF does. */
    int bits = dt == PD_FLOAT16 ? 11 : 8;
    float scale = dt == PD_FLOAT16 ? 0x1p-11f : 0x1p-8f;
    uint16_t *out = c->out_data[0];
    for (int64_t i = 0; i < n; i += 4) {
      philox4x32_10(&pk, (uint64_t)(i / 4), x);
      for (int j = 0; j < 4 && i + j < n; j++) {
        double u = (double)((float)(x[j] >> (32 - bits)) * scale);
        float v = (float)fmin(fmax(minval + range * u, lo), hi);
        out[i + j] = f16_bits(dt, v);
      }
    }
  }
  (void)st;
  return PD_OK;
}

/* double -> float with IEEE overflow to +-inf, never C undefined behaviour. */
static float d2f(double v) {
  if (v > FLT_MAX) return v < 0x1.ffffffp127 ? FLT_MAX : INFINITY;
  if (v < -FLT_MAX) return v > -0x1.ffffffp127 ? -FLT_MAX : -INFINITY;
  return (float)v;
}

/* Box-Muller: two standard normals from u1 in (0, 1] and u2 in [0, 1). */
static inline void box_muller_f(uint32_t a, uint32_t b, float *z0, float *z1) {
  float u1 = (float)((a >> 8) + 1) * 0x1p-24f; /* never 0: no log(0) */
  float u2 = u24(b);
  float r = sqrtf(-2.0f * logf(u1));
  float t = 6.2831853071795864769f * u2;
  *z0 = r * cosf(t);
  *z1 = r * sinf(t);
}

static pd_code normal_kernel(dev_kernel_ctx *c, dev_status *st) {
  philox_key pk = kernel_key(c);
  pd_dtype dt = c->out_dtype[0];
  double mean = c->attrs[R_P0].u.f, stddev = c->attrs[R_P1].u.f;
  int64_t n = out_count(c);
  uint32_t x[4];
  if (dt == PD_FLOAT64) {
    double *out = c->out_data[0];
    for (int64_t i = 0; i < n; i += 2) {
      philox4x32_10(&pk, (uint64_t)(i / 2), x);
      double u1 =
          (double)(((((uint64_t)x[0] << 32) | x[1]) >> 11) + 1) * 0x1p-53;
      double u2 = u53(x[2], x[3]);
      double r = sqrt(-2.0 * log(u1)), t = 6.283185307179586476925 * u2;
      out[i] = mean + stddev * r * cos(t);
      if (i + 1 < n) out[i + 1] = mean + stddev * r * sin(t);
    }
    return PD_OK;
  }
  float m = d2f(mean), s = d2f(stddev);
  float z[4];
  if (dt == PD_FLOAT32) {
    float *out = c->out_data[0];
    for (int64_t i = 0; i < n; i += 4) {
      philox4x32_10(&pk, (uint64_t)(i / 4), x);
      box_muller_f(x[0], x[1], &z[0], &z[1]);
      box_muller_f(x[2], x[3], &z[2], &z[3]);
      for (int j = 0; j < 4 && i + j < n; j++) out[i + j] = m + s * z[j];
    }
  } else {
    uint16_t *out = c->out_data[0];
    for (int64_t i = 0; i < n; i += 4) {
      philox4x32_10(&pk, (uint64_t)(i / 4), x);
      box_muller_f(x[0], x[1], &z[0], &z[1]);
      box_muller_f(x[2], x[3], &z[2], &z[3]);
      for (int j = 0; j < 4 && i + j < n; j++)
        out[i + j] = f16_bits(dt, m + s * z[j]);
    }
  }
  (void)st;
  return PD_OK;
}

#define RANDOM_ATTRS(P0, D0, DOC0, P1, D1, DOC1)                               \
  {                                                                            \
    {"shape",                                                                  \
     DEV_ATTR_SHAPE,                                                           \
     {.type = DEV_ATTR_NONE},                                                  \
     .doc = "the output's shape (every component's)"},                         \
        {"dtype",                                                              \
         DEV_ATTR_DTYPE,                                                       \
         {.type = DEV_ATTR_DTYPE, .u.dtype = PD_FLOAT32},                      \
         .doc = "float32, float64, float16 or bfloat16"},                      \
        {"seed",                                                               \
         DEV_ATTR_INT,                                                         \
         {.type = DEV_ATTR_INT, .u.i = 0},                                     \
         .doc =                                                                \
             "with seed2, picks the stream; the same seeds give the same "     \
             "values"},                                                        \
        {"seed2",                                                              \
         DEV_ATTR_INT,                                                         \
         {.type = DEV_ATTR_INT, .u.i = 0},                                     \
         .doc = "second seed"},                                                \
        {P0,                                                                   \
         DEV_ATTR_FLOAT,                                                       \
         {.type = DEV_ATTR_FLOAT, .u.f = D0},                                  \
         .doc = DOC0},                                                         \
        {P1,                                                                   \
         DEV_ATTR_FLOAT,                                                       \
         {.type = DEV_ATTR_FLOAT, .u.f = D1},                                  \
         .doc = DOC1},                                                         \
    {                                                                          \
      "per_device", DEV_ATTR_BOOL, {.type = DEV_ATTR_BOOL, .u.b = false},      \
          .doc =                                                               \
              "a different stream per component (by its index within the "     \
              "op's device set; false: every component gets the same "         \
              "values)"                                                        \
    }                                                                          \
  }

#define RANDOM_OUT                                                             \
  {                                                                            \
    { "output", false, 0, DEV_MASK_FLOAT, "the attribute dtype" }              \
  }

static dev_op_def uniform_def = {
    .name = "RandomUniform",
    .num_inputs = 0,
    .num_outputs = 1,
    .outputs = RANDOM_OUT,
    .num_attrs = 7,
    .attrs = RANDOM_ATTRS("minval", 0.0, "the lower bound (included)", "maxval",
                          1.0, "the upper bound (excluded)"),
    .infer = uniform_infer,
    .kernels = {uniform_kernel, NULL},
    .summary =
        "Uniform random values in [minval, maxval) of the attribute "
        "shape and dtype (Philox4x32-10, counter-based).",
    .notes =
        "Differs from tf.raw_ops.RandomUniform: TF takes `shape` as an "
        "input tensor and draws from [0, 1) only; here `shape` is a "
        "shape attribute, `minval` / `maxval` are float attributes and "
        "`per_device` chooses one stream per device. The values are not "
        "TF's for the same seeds.",
};

static dev_op_def normal_def = {
    .name = "RandomNormal",
    .num_inputs = 0,
    .num_outputs = 1,
    .outputs = RANDOM_OUT,
    .num_attrs = 7,
    .attrs = RANDOM_ATTRS("mean", 0.0, "the mean", "stddev", 1.0,
                          "the standard deviation (>= 0)"),
    .infer = normal_infer,
    .kernels = {normal_kernel, NULL},
    .summary =
        "Normal random values (mean, stddev) of the attribute shape "
        "and dtype (Philox4x32-10 and Box-Muller).",
    .notes =
        "No tf.raw_ops op of this name: it follows "
        "tf.raw_ops.RandomStandardNormal, which takes `shape` as an "
        "input tensor and has no mean / stddev; here `shape` is a shape "
        "attribute, `mean` / `stddev` are float attributes and "
        "`per_device` chooses one stream per device.",
};

/* ------------------------------------------------------------------------ */
/* DeviceId                                                                  */

static pd_code device_id_infer(dev_infer_ctx *c, dev_status *st) {
  (void)st;
  c->out_dtype[0] = PD_INT32;
  c->out_shape[0].rank = 0;
  return PD_OK;
}

static pd_code device_id_kernel(dev_kernel_ctx *c, dev_status *st) {
  int32_t id = c->index; /* the index within the op's device set */
  memcpy(c->out_data[0], &id, sizeof id);
  (void)st;
  return PD_OK;
}

static dev_op_def device_id_def = {
    .name = "DeviceId",
    .num_inputs = 0,
    .num_outputs = 1,
    .outputs = {{"device_id", false, 0, DEV_DTYPE_BIT(PD_INT32), "int32"}},
    .num_attrs = 0,
    .infer = device_id_infer,
    .kernels = {device_id_kernel, NULL},
    .summary =
        "A scalar int32 holding each component's index within the op's "
        "device set (0..n-1 for a set of n devices; placed on [3, 1]: 0 "
        "and 1).",
    .notes =
        "paradev's own (no tf.raw_ops op of this name), after the "
        "DeviceID op of TensorFlow's parallel device.",
};

/* Registers the random ops and DeviceId with their CPU kernels (called by
 * dev_registry_init). */
void dev_register_random_ops(void) {
  dev__register_or_die(&uniform_def);
  dev__register_or_die(&normal_def);
  dev__register_or_die(&device_id_def);
}
