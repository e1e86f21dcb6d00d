/* Memory that is enforced (issue #15), on in-process CPU engines: the
 * default per-device limit (an op asking more fails with RESOURCE_EXHAUSTED
 * naming the device and the engine runs on), a failed op's components on the
 * other devices freed, the block cache counted in the statistics and dropped
 * under pressure and when idle, and buffers freed per device under drift
 * (one device held by the test hook while another runs far ahead). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_int.h"
#include "testutil.h"

#define MiB ((uint64_t)1 << 20)

static dev_memory_stats stats(dev_engine *e, int d) {
  dev_memory_stats m = {.struct_size = sizeof m};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_memory_stats(e, d, &m, &st), PD_OK);
  return m;
}

/* Runs a tiny op and waits for it: every device's executor has then taken
 * what was queued for it before (the releases of a failed op included). */
static void barrier(dev_engine *e) {
  int64_t dims[1] = {1};
  double v = 1;
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 1, dims, &v);
  dev_tensor *in[1] = {x};
  dev_tensor *y = tu_exec(e, "Neg", in, 1, NULL, 0, 0);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(y, &st), PD_OK);
  dev_tensor_release(y);
  dev_tensor_release(x);
}

/* Default config: each device's limit is its share of physical memory less
 * the reserve, and is what it reports as total. */
static void test_default_limit_is_share_of_ram(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE);
  uint64_t reserve = phys / 4 < ((uint64_t)1 << 30) ? phys / 4 : (1u << 30);
  for (int d = 0; d < 2; d++) {
    dev_memory_stats m = stats(e, d);
    assert_int_equal(m.bytes_limit, (phys - reserve) / 2);
    assert_int_equal(m.bytes_total, m.bytes_limit);
  }
  dev_engine_destroy(e);

  /* An explicit reserve and limit keep working. */
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.num_devices = 2;
  cfg.memory_reserve = 0;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_OK);
  assert_int_equal(stats(e, 1).bytes_limit, phys / 2);
  dev_engine_destroy(e);
  cfg.memory_limit = 3 * MiB;
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_OK);
  assert_int_equal(stats(e, 0).bytes_limit, 3 * MiB);
  dev_engine_destroy(e);
}

/* RandomNormal [50000, 50000] float32 (10 GB a component) on the default
 * limits of 4 devices (on a host of 40 GB or more, a second dim that makes
 * it more than a device's limit): RESOURCE_EXHAUSTED naming the device, the
 * bytes asked and in use; nothing allocated; the engine serves the next op. */
static void test_op_over_device_total_fails(void **state) {
  (void)state;
  dev_engine *e = tu_engine(4, 0);
  int64_t dims[2] = {50000, 50000};
  uint64_t limit = stats(e, 0).bytes_limit;
  if (limit >= 10000000000u) dims[1] = (int64_t)(limit / 200000) + 1;
  char want[64];
  snprintf(want, sizeof want, "%llu bytes requested",
           (unsigned long long)(dims[0] * dims[1] * 4));
  dev_attr a[2] = {dev_attr_shape("shape", 2, dims),
                   dev_attr_dtype("dtype", PD_FLOAT32)};
  dev_tensor *y = tu_exec(e, "RandomNormal", NULL, 0, a, 2, 0);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(y, &st), PD_RESOURCE_EXHAUSTED);
  printf("error: %s\n", st.msg);
  assert_non_null(strstr(st.msg, "cpu:0 is out of memory"));
  assert_non_null(strstr(st.msg, want));
  assert_non_null(strstr(st.msg, "bytes in use"));
  for (int d = 0; d < 4; d++) {
    assert_int_equal(stats(e, d).bytes_in_use, 0);
    assert_int_equal(stats(e, d).num_allocs, 0);
  }
  dev_tensor_release(y);
  barrier(e);
  dev_engine_destroy(e);
}

/* Device 1 is nearly full, device 0 empty: an op whose output fits on
 * device 0 only fails, and device 0's component is freed too (with the
 * failed component's error). */
static void test_failed_op_frees_peer_components(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 64 * MiB);
  dev_shape sh[2] = {{.rank = 1, .dims = {1}},
                     {.rank = 1, .dims = {(int64_t)(56 * MiB / 4)}}};
  dev_tensor *fill;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_create(e, PD_FLOAT32, sh, &fill, &st), PD_OK);
  uint64_t used0 = stats(e, 0).bytes_in_use;
  int64_t dims[1] = {(int64_t)(16 * MiB / 4)};
  dev_attr a[2] = {dev_attr_shape("shape", 1, dims),
                   dev_attr_dtype("dtype", PD_FLOAT32)};
  dev_tensor *y = tu_exec(e, "RandomNormal", NULL, 0, a, 2, 0);
  assert_int_equal(dev_tensor_wait(y, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "cpu:1 is out of memory"));
  barrier(e);
  /* y is still held here, yet device 0 holds nothing for it. */
  assert_int_equal(stats(e, 0).bytes_in_use, used0);
  assert_int_equal(y->comps[0].code, PD_RESOURCE_EXHAUSTED);
  assert_null(y->comps[0].buf);
  assert_string_equal(y->comps[0].msg, y->comps[1].msg); /* the root cause */
  dev_tensor_release(y);
  dev_tensor_release(fill);
  dev_engine_destroy(e);
}

/* Freed blocks show as bytes_cached (not in use); an allocation that would
 * not fit beside them drops them first; an idle device drops them all. */
static void test_cache_counted_and_trimmed(void **state) {
  (void)state;
  dev_engine *e = tu_engine(1, 16 * MiB);
  dev_shape s8 = {.rank = 1, .dims = {(int64_t)(8 * MiB / 4)}};
  dev_shape s12 = {.rank = 1, .dims = {(int64_t)(12 * MiB / 4)}};
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *t;
  assert_int_equal(dev_tensor_create(e, PD_FLOAT32, &s8, &t, &st), PD_OK);
  dev_tensor_release(t);
  dev_memory_stats m = stats(e, 0);
  assert_int_equal(m.bytes_in_use, 0);
  assert_int_equal(m.bytes_cached, 8 * MiB);
  /* 12 MiB in use + 8 MiB cached > 16 MiB: the cache goes first. */
  assert_int_equal(dev_tensor_create(e, PD_FLOAT32, &s12, &t, &st), PD_OK);
  m = stats(e, 0);
  assert_int_equal(m.bytes_in_use, 12 * MiB);
  assert_int_equal(m.bytes_cached, 0);
  dev_tensor_release(t);
  assert_int_equal(stats(e, 0).bytes_cached, 12 * MiB);
  /* Over the limit itself: refused, with the cache left as it was. */
  dev_shape s20 = {.rank = 1, .dims = {(int64_t)(20 * MiB / 4)}};
  assert_int_equal(dev_tensor_create(e, PD_FLOAT32, &s20, &t, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "cpu:0 is out of memory: 20971520 bytes"));
  /* Idle: once the executor has run something and then waited
   * DEV_IDLE_TRIM_MS, the cache is empty (polled, not timed). */
  barrier(e);
  for (int i = 0; i < 600 && stats(e, 0).bytes_cached; i++) usleep(50000);
  assert_int_equal(stats(e, 0).bytes_cached, 0);
  dev_engine_destroy(e);
}

/* Device 1 held: device 0 runs a chain of 24 Negs of 4 MiB each whose
 * intermediates the caller drops at once. Device 0 holds only the input
 * and the last output (its consumers there are done), not 24
 * intermediates kept for device 1. Released, device 1 catches up and both
 * compute the right value. */
static void test_drift_frees_per_device(void **state) {
  (void)state;
  enum { STEPS = 24 };
  dev_engine *e = tu_engine(2, 0);
  int64_t n = (int64_t)(4 * MiB / 4);
  double *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = (double)(i % 97) - 48;
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 1, &n, v);
  uint64_t base1 = stats(e, 1).bytes_in_use;
  dev__exec_hold(e, 1, true);
  dev_tensor *cur = x;
  dev_tensor_retain(cur);
  for (int s = 0; s < STEPS; s++) {
    dev_tensor *in[1] = {cur};
    dev_tensor *next = tu_exec(e, "Neg", in, 1, NULL, 0, 0);
    dev_tensor_release(cur);
    cur = next;
  }
  pthread_mutex_lock(&e->submit_mu);
  uint64_t last = e->seq;
  pthread_mutex_unlock(&e->submit_mu);
  dev_exec_wait(e, 0, last); /* device 0 is done, device 1 has run nothing */
  dev_memory_stats m0 = stats(e, 0);
  printf("device 0 ahead: %llu bytes in use (input and last output: %llu)\n",
         (unsigned long long)m0.bytes_in_use, (unsigned long long)(8 * MiB));
  assert_int_equal(m0.bytes_in_use, 8 * MiB);
  assert_int_equal(stats(e, 1).bytes_in_use, base1);
  dev__exec_hold(e, 1, false);
  for (int d = 0; d < 2; d++)
    tu_assert_tensor_close(cur, d, v, n, 0, 0); /* an even number of Negs */
  dev_tensor_release(cur);
  dev_tensor_release(x);
  barrier(e);
  assert_int_equal(stats(e, 0).bytes_in_use, 0);
  assert_int_equal(stats(e, 1).bytes_in_use, 0);
  free(v);
  dev_engine_destroy(e);
}

/* OpenBLAS's pool: the cores divided by the devices by default, else as
 * configured (skipped when the linked BLAS has no pool). */
static void test_blas_threads(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int got = dev_cpu_blas_threads();
  dev_engine_destroy(e);
  if (got == 0) skip();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int want = cores > 2 ? (int)(cores / 2) : 1;
  /* OpenBLAS caps it at the cores it was started with. */
  assert_int_equal(got, want);
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.num_devices = 4;
  cfg.blas_threads = 1;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_OK);
  assert_int_equal(dev_cpu_blas_threads(), 1);
  dev_engine_destroy(e);
  cfg.blas_threads = -1;
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "blas_threads -1"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_limit_is_share_of_ram),
      cmocka_unit_test(test_op_over_device_total_fails),
      cmocka_unit_test(test_failed_op_frees_peer_components),
      cmocka_unit_test(test_cache_counted_and_trimmed),
      cmocka_unit_test(test_drift_frees_per_device),
      cmocka_unit_test(test_blas_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
