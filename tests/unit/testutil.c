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
  if (dev_shape_make(rank, dims, &s, &st) != PD_OK) fail_msg("shape: %s", st.msg);
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
  if (count > n) fail_msg("tu_read: %lld elements, capacity %lld", (long long)count, (long long)n);
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
                          double rtol, double atol, const char *file, int line) {
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

void tu_assert_shape_impl(const dev_shape *s, int rank, const int64_t *dims,
                          const char *file, int line) {
  int ok = s->rank == rank;
  for (int i = 0; ok && i < rank; i++) ok = s->dims[i] == dims[i];
  if (!ok) {
    char buf[128];
    { print_error("shape %s, want rank %d\n", dev_shape_str(s, buf, sizeof buf), rank); _fail(file, line); }
  }
}

void tu_fill_random(double *out, int64_t n, double lo, double hi, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    out[i] = lo + (hi - lo) * ((double)(x >> 11) / 9007199254740992.0);
  }
}
