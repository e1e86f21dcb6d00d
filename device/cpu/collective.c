/* Collectives between the CPU backend's simulated devices.
 *
 * Every device's executor reaches the collective in the same global order and
 * calls dev_cpu_collective_run. The devices meet at a barrier, learn whether
 * any of them failed (then all fail, naming the device), and then split the
 * work: for an all-reduce each device reduces 1/n of the elements from every
 * input and writes the result into every device's output, then meets the
 * others again. So all devices compute at once, on as many cores as there
 * are, and each byte is read once and written once per output.
 *
 * Attributes read here (positions fixed by device/ops/collective.c):
 *   AllReduce, ReduceScatter: attrs[0] "reduction" (string)
 *   Broadcast: attrs[0] "root" (int);  AllGather: attrs[0] "axis" (int). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cpu_int.h"

typedef struct cpu_coll {
  dev_collective_kind kind;
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned generation;
  bool failed;
  dev_status fail_st;
  int fail_device;
  const void *in[PD_MAX_DEVICES];
  void *out[PD_MAX_DEVICES];
  dev_shape in_shape[PD_MAX_DEVICES];
  dev_devset set; /* the devices taking part; rank = position in it */
} cpu_coll;

/* Issue #17: a collective runs over its operands' set: set->n ranks, rank
 * i on engine device set->dev[i] (ctx->index in dev_cpu_collective_run). */
void *dev_cpu_collective_create(dev_backend *b, dev_collective_kind kind,
                                const struct dev_devset *set) {
  (void)b;
  cpu_coll *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->kind = kind;
  c->n = set->n;
  c->set = *set;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  return c;
}

void dev_cpu_collective_release(dev_backend *b, void *coll) {
  cpu_coll *c = coll;
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

static void barrier(cpu_coll *c) {
  pthread_mutex_lock(&c->mu);
  unsigned gen = c->generation;
  if (++c->arrived == c->n) {
    c->arrived = 0;
    c->generation++;
    pthread_cond_broadcast(&c->cv);
  } else {
    while (gen == c->generation) pthread_cond_wait(&c->cv, &c->mu);
  }
  pthread_mutex_unlock(&c->mu);
}

/* --- reductions over [b, e) of n inputs into out, in cache-sized blocks --- */

#define BLK 2048

/* Outputs of a collective larger than this (per device) are written with
 * non-temporal stores: they will not be read again before leaving the cache,
 * and streaming them skips the read-for-ownership of every line. */
#define STREAM_MIN_BYTES ((int64_t)2 << 20)

/* Copies `bytes` to `dst`; with `nt`, through non-temporal stores where the
 * CPU has them (callers fence before others read). */
static void put_bytes(void *dst, const void *src, size_t bytes, bool nt) {
#if defined(__SSE2__)
  if (nt && bytes >= 64) {
    char *d = dst;
    const char *sp = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, sp, head);
    d += head;
    sp += head;
    bytes -= head;
    size_t body = bytes & ~(size_t)15;
    for (size_t i = 0; i < body; i += 16)
      _mm_stream_si128(
          (__m128i *)(void *)(d + i),
          _mm_loadu_si128((const __m128i *)(const void *)(sp + i)));
    memcpy(d + body, sp + body, bytes - body);
    return;
  }
#endif
  (void)nt;
  memcpy(dst, src, bytes);
}

static void stream_fence(bool nt) {
#if defined(__SSE2__)
  if (nt) _mm_sfence();
#endif
  (void)nt;
}

#define DEFINE_REDUCE(NAME, T, ACC, LOAD, STORE)                               \
  static void NAME(int red, int n, const void *const *in, void *const *out,    \
                   int n_out, int64_t b, int64_t e, bool nt) {                 \
    ACC acc[BLK];                                                              \
    T res[BLK];                                                                \
    for (int64_t s = b; s < e; s += BLK) {                                     \
      int64_t m = e - s < BLK ? e - s : BLK;                                   \
      const T *a0 = (const T *)in[0] + s;                                      \
      for (int64_t i = 0; i < m; i++) acc[i] = LOAD(a0[i]);                    \
      for (int k = 1; k < n; k++) {                                            \
        const T *ak = (const T *)in[k] + s;                                    \
        switch (red) {                                                         \
          case DEV_RED_SUM:                                                    \
          case DEV_RED_MEAN:                                                   \
            for (int64_t i = 0; i < m; i++)                                    \
              acc[i] = (ACC)(acc[i] + LOAD(ak[i]));                            \
            break;                                                             \
          case DEV_RED_PROD:                                                   \
            for (int64_t i = 0; i < m; i++)                                    \
              acc[i] = (ACC)(acc[i] * LOAD(ak[i]));                            \
            break;                                                             \
          case DEV_RED_MAX:                                                    \
            for (int64_t i = 0; i < m; i++) {                                  \
              ACC v = LOAD(ak[i]);                                             \
              acc[i] = (v > acc[i] || v != v) ? v : acc[i];                    \
            }                                                                  \
            break;                                                             \
          case DEV_RED_MIN:                                                    \
            for (int64_t i = 0; i < m; i++) {                                  \
              ACC v = LOAD(ak[i]);                                             \
              acc[i] = (v < acc[i] || v != v) ? v : acc[i];                    \
            }                                                                  \
            break;                                                             \
        }                                                                      \
      }                                                                        \
      if (red == DEV_RED_MEAN)                                                 \
        for (int64_t i = 0; i < m; i++) acc[i] = mean_of(acc[i], n);           \
      for (int64_t i = 0; i < m; i++) res[i] = STORE(acc[i]);                  \
      for (int j = 0; j < n_out; j++)                                          \
        put_bytes((T *)out[j] + s, res, (size_t)m * sizeof(T), nt);            \
    }                                                                          \
  }

#define ID(x) (x)
static inline float mean_f(float a, int n) { return a / (float)n; }
static inline double mean_d(double a, int n) { return a / (double)n; }
static inline int64_t mean_i(int64_t a, int n) { return a / n; }
static inline uint64_t mean_u(uint64_t a, int n) { return a / (uint64_t)n; }

#define mean_of(a, n)                                                          \
  _Generic((a), float                                                          \
           : mean_f, double                                                    \
           : mean_d, int64_t                                                   \
           : mean_i, uint64_t                                                  \
           : mean_u)(a, n)

static inline float h2f(uint16_t h) { return dev_half_to_float(h); }
static inline float b2f(uint16_t h) { return dev_bfloat16_to_float(h); }
/* Integers wrap on overflow (two's complement), never undefined behaviour:
 * they are summed as unsigned 64-bit and truncated on store, except for
 * mean/max/min, which need the signed value. */
static inline uint64_t u8_to_u64(uint8_t v) { return v; }
static inline uint8_t u64_to_u8(uint64_t v) { return (uint8_t)v; }

DEFINE_REDUCE(reduce_f32, float, float, ID, ID)
DEFINE_REDUCE(reduce_f64, double, double, ID, ID)
DEFINE_REDUCE(reduce_f16, uint16_t, float, h2f, dev_float_to_half)
DEFINE_REDUCE(reduce_bf16, uint16_t, float, b2f, dev_float_to_bfloat16)
DEFINE_REDUCE(reduce_u8, uint8_t, uint64_t, u8_to_u64, u64_to_u8)

/* Signed integers: sums and products in unsigned arithmetic (wrap-around),
 * comparisons signed. */
#define DEFINE_REDUCE_SIGNED(NAME, T, UT)                                      \
  static void NAME(int red, int n, const void *const *in, void *const *out,    \
                   int n_out, int64_t b, int64_t e, bool nt) {                 \
    (void)nt;                                                                  \
    for (int64_t i = b; i < e; i++) {                                          \
      T v0 = ((const T *)in[0])[i];                                            \
      int64_t acc = v0;                                                        \
      UT uacc = (UT)v0;                                                        \
      for (int k = 1; k < n; k++) {                                            \
        T v = ((const T *)in[k])[i];                                           \
        switch (red) {                                                         \
          case DEV_RED_SUM: uacc = (UT)(uacc + (UT)v); break;                  \
          case DEV_RED_PROD: uacc = (UT)(uacc * (UT)v); break;                 \
          case DEV_RED_MAX:                                                    \
            if (v > acc) acc = v;                                              \
            break;                                                             \
          case DEV_RED_MIN:                                                    \
            if (v < acc) acc = v;                                              \
            break;                                                             \
          case DEV_RED_MEAN: acc += v; break;                                  \
        }                                                                      \
      }                                                                        \
      T r;                                                                     \
      if (red == DEV_RED_SUM || red == DEV_RED_PROD)                           \
        r = (T)uacc;                                                           \
      else if (red == DEV_RED_MEAN)                                            \
        r = (T)(acc / n);                                                      \
      else                                                                     \
        r = (T)acc;                                                            \
      for (int j = 0; j < n_out; j++) ((T *)out[j])[i] = r;                    \
    }                                                                          \
  }

DEFINE_REDUCE_SIGNED(reduce_i32, int32_t, uint32_t)

/* int64 means sum in unsigned 64-bit too (wrap-around rather than overflow). */
static void reduce_i64(int red, int n, const void *const *in, void *const *out,
                       int n_out, int64_t b, int64_t e, bool nt) {
  (void)nt;
  for (int64_t i = b; i < e; i++) {
    int64_t acc = ((const int64_t *)in[0])[i];
    uint64_t uacc = (uint64_t)acc;
    for (int k = 1; k < n; k++) {
      int64_t v = ((const int64_t *)in[k])[i];
      switch (red) {
        case DEV_RED_SUM:
        case DEV_RED_MEAN: uacc += (uint64_t)v; break;
        case DEV_RED_PROD: uacc *= (uint64_t)v; break;
        case DEV_RED_MAX:
          if (v > acc) acc = v;
          break;
        case DEV_RED_MIN:
          if (v < acc) acc = v;
          break;
      }
    }
    int64_t r = acc;
    if (red == DEV_RED_SUM || red == DEV_RED_PROD)
      r = (int64_t)uacc;
    else if (red == DEV_RED_MEAN)
      r = (int64_t)uacc / n;
    for (int j = 0; j < n_out; j++) ((int64_t *)out[j])[i] = r;
  }
}

/* bool: sum and max are logical or; prod and min are logical and. */
static void reduce_bool(int red, int n, const void *const *in, void *const *out,
                        int n_out, int64_t b, int64_t e, bool nt) {
  (void)nt;
  bool any = red == DEV_RED_SUM || red == DEV_RED_MAX || red == DEV_RED_MEAN;
  for (int64_t i = b; i < e; i++) {
    uint8_t acc = ((const uint8_t *)in[0])[i] != 0;
    for (int k = 1; k < n; k++) {
      uint8_t v = ((const uint8_t *)in[k])[i] != 0;
      acc = any ? (acc | v) : (acc & v);
    }
    for (int j = 0; j < n_out; j++) ((uint8_t *)out[j])[i] = acc;
  }
}

/* Reduces elements [b, e) of the n inputs and stores the result into each of
 * the n_out outputs (same element indices), streaming the stores with nt. */
typedef void (*reduce_fn)(int red, int n, const void *const *in,
                          void *const *out, int n_out, int64_t b, int64_t e,
                          bool nt);

static reduce_fn reducer(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT32: return reduce_f32;
    case PD_FLOAT64: return reduce_f64;
    case PD_FLOAT16: return reduce_f16;
    case PD_BFLOAT16: return reduce_bf16;
    case PD_INT32: return reduce_i32;
    case PD_INT64: return reduce_i64;
    case PD_UINT8: return reduce_u8;
    case PD_BOOL: return reduce_bool;
    default: return NULL;
  }
}

static int parse_reduction(const dev_attr_value *v) {
  return dev_reduction_from_name(v->u.s.ptr, v->u.s.len);
}

pd_code dev_cpu_collective_run(dev_backend *b, dev_kernel_ctx *ctx,
                               const dev_status *failed, dev_status *st) {
  cpu_coll *c = ctx->collective;
  const int d = ctx->index, n = c->n; /* rank within the set */
  pthread_mutex_lock(&c->mu);
  c->in[d] = ctx->num_inputs > 0 ? ctx->in_data[0] : NULL;
  c->out[d] = ctx->num_outputs > 0 ? ctx->out_data[0] : NULL;
  if (ctx->num_inputs > 0) c->in_shape[d] = ctx->in_shape[0];
  if (failed && (!c->failed || d < c->fail_device)) {
    c->failed = true;
    c->fail_device = d;
    c->fail_st = *failed;
  }
  pthread_mutex_unlock(&c->mu);
  barrier(c);
  if (c->failed) {
    if (c->fail_device == d)
      return dev_error(st, c->fail_st.code, "%s", c->fail_st.msg);
    return dev_error(st, c->fail_st.code, "%s: cancelled because %s failed: %s",
                     ctx->op->name,
                     b->device_name(b, c->set.dev[c->fail_device]),
                     c->fail_st.msg);
  }

  const pd_dtype dt = ctx->in_dtype[0];
  const size_t es = pd_dtype_size(dt);
  switch (c->kind) {
    case DEV_COLL_ALL_REDUCE: {
      /* Device d reduces its 1/n of the elements and writes the result into
       * every device's output: n*S bytes read and n*S written in all, the
       * least an all-reduce with n outputs can move. A last barrier keeps any
       * device from finishing while peers still write into its output. */
      int red = parse_reduction(&ctx->attrs[0]);
      int64_t count = dev_num_elems(&c->in_shape[d]);
      int64_t lo = count * d / n, hi = count * (d + 1) / n;
      bool nt = count * (int64_t)es >= STREAM_MIN_BYTES;
      reducer(dt)(red, n, c->in, c->out, n, lo, hi, nt);
      stream_fence(nt);
      barrier(c);
      return PD_OK;
    }
    case DEV_COLL_BROADCAST: {
      int root = (int)ctx->attrs[0].u.i;
      size_t bytes = (size_t)dev_num_elems(&c->in_shape[root]) * es;
      if (bytes) memcpy(c->out[d], c->in[root], bytes);
      return PD_OK;
    }
    case DEV_COLL_ALL_GATHER: {
      int axis = (int)ctx->attrs[0].u.i;
      int rank = c->in_shape[0].rank;
      if (axis < 0) axis += rank;
      int64_t outer = 1, inner = (int64_t)es;
      for (int i = 0; i < axis; i++) outer *= c->in_shape[0].dims[i];
      for (int i = axis + 1; i < rank; i++) inner *= c->in_shape[0].dims[i];
      int64_t out_rows = 0;
      for (int p = 0; p < n; p++) out_rows += c->in_shape[p].dims[axis];
      char *o = c->out[d];
      for (int64_t x = 0; x < outer; x++) {
        int64_t row = 0;
        for (int p = 0; p < n; p++) {
          int64_t rows = c->in_shape[p].dims[axis];
          size_t run = (size_t)(rows * inner);
          if (run)
            memcpy(o + (x * out_rows + row) * inner,
                   (const char *)c->in[p] + x * rows * inner, run);
          row += rows;
        }
      }
      return PD_OK;
    }
    case DEV_COLL_REDUCE_SCATTER: {
      int red = parse_reduction(&ctx->attrs[0]);
      const dev_shape *s = &c->in_shape[d];
      int64_t rows = s->dims[0],
              row_elems = dev_num_elems(s) / (rows ? rows : 1);
      if (rows == 0) return PD_OK;
      int64_t q = rows / n, r = rows % n;
      int64_t first = d * q + (d < r ? d : r);
      int64_t mine = q + (d < r ? 1 : 0);
      const void *shifted[PD_MAX_DEVICES];
      for (int p = 0; p < n; p++)
        shifted[p] = (const char *)c->in[p] + first * row_elems * (int64_t)es;
      bool nt = mine * row_elems * (int64_t)es >= STREAM_MIN_BYTES;
      reducer(dt)(red, n, shifted, &c->out[d], 1, 0, mine * row_elems, nt);
      stream_fence(nt);
      return PD_OK;
    }
    case DEV_COLL_NONE: break;
  }
  return dev_error(st, PD_INTERNAL, "%s: unknown collective kind %d",
                   ctx->op->name, (int)c->kind);
}
