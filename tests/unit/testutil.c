#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dev_engine *tu_engine(int n, uint64_t memory_limit) {
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.num_devices = n;
  cfg.memory_limit = memory_limit;
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_create(&cfg, &e, &st) != PD_OK) fail_msg("engine: %s", st.msg);
  return e;
}

static void *pack(pd_dtype dtype, int64_t n, const double *vals) {
  size_t es = pd_dtype_size(dtype);
  void *buf = malloc(n > 0 ? (size_t)n * es : 1);
  assert_non_null(buf);
  for (int64_t i = 0; i < n; i++) dev_store_f64(dtype, buf, i, vals[i]);
  return buf;
}

static dev_tensor *upload(dev_engine *e, pd_dtype dtype, int rank,
                          const int64_t *dims, dev_layout *lay,
                          const double *vals) {
  dev_shape s;
  dev_status st = DEV_STATUS_INIT;
  if (dev_shape_make(rank, dims, &s, &st) != PD_OK)
    fail_msg("shape: %s", st.msg);
  int64_t n = 0;
  assert_int_equal(dev_shape_num_elements(&s, &n, &st), PD_OK);
  void *buf = pack(dtype, n, vals);
  dev_tensor *t = NULL;
  if (dev_tensor_from_host(e, dtype, lay, &s, buf, &t, &st) != PD_OK)
    fail_msg("upload: %s", st.msg);
  free(buf);
  return t;
}

dev_tensor *tu_mirrored(dev_engine *e, pd_dtype dtype, int rank,
                        const int64_t *dims, const double *vals) {
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  return upload(e, dtype, rank, dims, &lay, vals);
}

dev_tensor *tu_sharded(dev_engine *e, pd_dtype dtype, int rank,
                       const int64_t *dims, int axis, const double *vals) {
  dev_layout lay = {DEV_LAYOUT_SHARDED, axis, 0};
  return upload(e, dtype, rank, dims, &lay, vals);
}

int64_t tu_read(dev_tensor *t, int c, double *out, int64_t n) {
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_wait(t, &st) != PD_OK)
    fail_msg("tensor failed: %s: %s", pd_code_name(st.code), st.msg);
  dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, c};
  dev_shape hs;
  uint64_t bytes = 0;
  assert_int_equal(dev_tensor_host_size(t, &lay, 0, &hs, &bytes, &st), PD_OK);
  int64_t count = 0;
  assert_int_equal(dev_shape_num_elements(&hs, &count, &st), PD_OK);
  if (count > n)
    fail_msg("tu_read: %lld elements, capacity %lld", (long long)count,
             (long long)n);
  void *buf = malloc(bytes ? bytes : 1);
  assert_non_null(buf);
  if (dev_tensor_to_host(t, &lay, 0, buf, bytes, &st) != PD_OK)
    fail_msg("download: %s", st.msg);
  pd_dtype dt = dev_tensor_dtype(t);
  for (int64_t i = 0; i < count; i++) out[i] = dev_load_f64(dt, buf, i);
  free(buf);
  return count;
}

dev_tensor *tu_exec(dev_engine *e, const char *op, dev_tensor *const *in,
                    int n_in, const dev_attr *attrs, int n_attrs, int which) {
  dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
  int n_out = DEV_MAX_OUTPUTS;
  dev_status st = DEV_STATUS_INIT;
  if (dev_execute(e, op, in, n_in, attrs, n_attrs, outs, &n_out, &st) != PD_OK)
    fail_msg("%s failed: %s: %s", op, pd_code_name(st.code), st.msg);
  assert_true(which < n_out);
  for (int i = 0; i < n_out; i++)
    if (i != which) dev_tensor_release(outs[i]);
  return outs[which];
}

void tu_exec_fails(dev_engine *e, const char *op, dev_tensor *const *in,
                   int n_in, const dev_attr *attrs, int n_attrs, pd_code code,
                   const char *needle) {
  dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
  int n_out = DEV_MAX_OUTPUTS;
  dev_status st = DEV_STATUS_INIT;
  pd_code got = dev_execute(e, op, in, n_in, attrs, n_attrs, outs, &n_out, &st);
  if (got == PD_OK) {
    for (int i = 0; i < n_out; i++) dev_tensor_release(outs[i]);
    fail_msg("%s: expected %s, it succeeded", op, pd_code_name(code));
  }
  if (got != code)
    fail_msg("%s: expected %s, got %s: %s", op, pd_code_name(code),
             pd_code_name(got), st.msg);
  if (needle && !strstr(st.msg, needle))
    fail_msg("%s: message \"%s\" lacks \"%s\"", op, st.msg, needle);
}

void tu_assert_close_impl(const double *got, const double *want, int64_t n,
                          double rtol, double atol, const char *file,
                          int line) {
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], w = want[i];
    if (isnan(g) && isnan(w)) continue;
    if (isinf(w) && g == w) continue;
    if (!(fabs(g - w) <= atol + rtol * fabs(w))) {
      print_error("element %lld: got %.17g, want %.17g (rtol %g, atol %g)\n",
                  (long long)i, g, w, rtol, atol);
      _fail(file, line);
    }
  }
}

void tu_assert_tensor_close_impl(dev_tensor *t, int c, const double *want,
                                 int64_t n, double rtol, double atol,
                                 const char *file, int line) {
  double *got = calloc((size_t)(n > 0 ? n : 1), sizeof *got);
  assert_non_null(got);
  int64_t cnt = tu_read(t, c, got, n > 0 ? n : 1);
  if (cnt != n) {
    /* got is leaked on purpose: GCC does not know _fail never returns and
     * would warn about a use after free below (-Werror in Release). */
    print_error("component %d: element count %lld, want %lld\n", c,
                (long long)cnt, (long long)n);
    _fail(file, line);
  } else {
    tu_assert_close_impl(got, want, n, rtol, atol, file, line);
    free(got);
  }
}

void tu_assert_shape_impl(const dev_shape *s, int rank, const int64_t *dims,
                          const char *file, int line) {
  int ok = s->rank == rank;
  for (int i = 0; ok && i < rank; i++) ok = s->dims[i] == dims[i];
  if (!ok) {
    char got[128], want[128];
    int len = snprintf(want, sizeof want, "[");
    for (int i = 0; i < rank && len > 0 && (size_t)len < sizeof want; i++)
      len += snprintf(want + len, sizeof want - (size_t)len, "%s%lld",
                      i ? ", " : "", (long long)dims[i]);
    if (len > 0 && (size_t)len < sizeof want)
      snprintf(want + len, sizeof want - (size_t)len, "]");
    print_error("shape %s, want %s (rank %d)\n",
                dev_shape_str(s, got, sizeof got), want, rank);
    _fail(file, line);
  }
}

double tu_rtol_rounded(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT16: return 1.0 / 1024;
    case PD_BFLOAT16: return 1.0 / 128;
    case PD_FLOAT32: return 1e-6;
    case PD_FLOAT64: return 1e-13;
    default: return 0;
  }
}

double tu_rtol_f64_op(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT64: return 1e-14;
    case PD_FLOAT32: return 1e-6;
    case PD_FLOAT16: return 1.5e-3;  /* 2^-11 = 4.9e-4 per rounding */
    case PD_BFLOAT16: return 1.2e-2; /* 2^-8 = 3.9e-3 per rounding */
    default: return 0;
  }
}

double tu_atol_f64_op(pd_dtype dt) { return dt == PD_FLOAT16 ? 0x1p-24 : 0; }

double tu_rtol_f32_op(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT16: return 2e-3;
    case PD_BFLOAT16: return 1.6e-2;
    case PD_FLOAT32: return 2e-6;
    default: return 1e-14;
  }
}

double tu_rtol_backends(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT32: return 1e-5;
    case PD_FLOAT64: return 1e-12;
    case PD_FLOAT16: return 2e-3;
    case PD_BFLOAT16: return 1e-2;
    default: return 0;
  }
}

int64_t tu_count(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  return n;
}

int64_t tu_numel(const dev_shape *s) { return tu_count(s->rank, s->dims); }

void tu_fill_random(double *out, int64_t n, double lo, double hi,
                    uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = lo + (hi - lo) * ((double)(x >> 11) / 9007199254740992.0);
  }
}
