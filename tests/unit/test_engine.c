/* The engine core: dtypes, shapes, parallel tensors and their layouts, the
 * registry's validation, memory accounting and limits, asynchronous errors. */
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void test_dtype_names_and_sizes(void **state) {
  const char *names[] = {"float32", "float64", "float16", "bfloat16",
                         "int32",   "int64",   "uint8",   "bool"};
  const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1, 1};
  for (int i = 0; i < 8; i++) {
    pd_dtype dt = pd_dtype_from_name(names[i]);
    assert_int_equal(dt, i + 1);
    assert_string_equal(pd_dtype_name(dt), names[i]);
    assert_int_equal(pd_dtype_size(dt), sizes[i]);
  }
  assert_int_equal(pd_dtype_from_name("float128"), PD_DTYPE_INVALID);
  assert_int_equal(pd_dtype_size((pd_dtype)99), 0);
  assert_string_equal(pd_code_name(PD_RESOURCE_EXHAUSTED),
                      "RESOURCE_EXHAUSTED");
}

static void test_half_bfloat16_rounding(void **state) {
  /* Bit patterns from IEEE 754 binary16 tables. */
  assert_int_equal(dev_float_to_half(1.0f), 0x3C00);
  assert_int_equal(dev_float_to_half(-2.0f), 0xC000);
  assert_int_equal(dev_float_to_half(65504.0f), 0x7BFF);
  assert_int_equal(dev_float_to_half(65520.0f), 0x7C00); /* ties to even: inf */
  assert_int_equal(dev_float_to_half(65519.0f), 0x7BFF);
  assert_int_equal(dev_float_to_half(1.0f / 3.0f), 0x3555);
  assert_int_equal(dev_float_to_half(5.9604645e-8f),
                   0x0001); /* smallest subnormal */
  assert_int_equal(dev_float_to_half(2.9802322e-8f),
                   0x0000); /* half of it: ties to even 0 */
  assert_int_equal(dev_float_to_half(8.9406967e-8f),
                   0x0002); /* 1.5 ulp: ties to even 2 */
  assert_int_equal(dev_float_to_half(1.0009765625f), 0x3C01);
  assert_int_equal(dev_float_to_half(1.00048828125f), 0x3C00); /* tie -> even */
  assert_int_equal(dev_float_to_half(1.00146484375f),
                   0x3C02); /* tie -> even (up) */
  assert_true((dev_float_to_half(NAN) & 0x7C00) == 0x7C00 &&
              (dev_float_to_half(NAN) & 0x3FF));
  assert_true(dev_half_to_float(0x3555) == 0.333251953125f);
  assert_true(dev_half_to_float(0x0001) == 5.9604644775390625e-8f);
  assert_true(isinf(dev_half_to_float(0xFC00)) &&
              dev_half_to_float(0xFC00) < 0);
  /* bfloat16: the top 16 bits of float32, rounded to nearest even. */
  assert_int_equal(dev_float_to_bfloat16(1.0f), 0x3F80);
  assert_int_equal(dev_float_to_bfloat16(1.00390625f),
                   0x3F80); /* tie -> even */
  assert_int_equal(dev_float_to_bfloat16(1.01171875f),
                   0x3F82); /* tie -> even (up) */
  assert_int_equal(dev_float_to_bfloat16(1.0078125f), 0x3F81);
  assert_true(dev_bfloat16_to_float(0x4049) == 3.140625f);
  assert_true(isnan(dev_bfloat16_to_float(dev_float_to_bfloat16(NAN))));
}

static void test_store_saturates(void **state) {
  int32_t i32;
  dev_store_f64(PD_INT32, &i32, 0, 1e20);
  assert_int_equal(i32, 2147483647);
  dev_store_f64(PD_INT32, &i32, 0, NAN);
  assert_int_equal(i32, 0);
  dev_store_f64(PD_INT32, &i32, 0, -2.7);
  assert_int_equal(i32, -2);
  uint8_t u8;
  dev_store_f64(PD_UINT8, &u8, 0, -5);
  assert_int_equal(u8, 0);
  dev_store_f64(PD_UINT8, &u8, 0, 300);
  assert_int_equal(u8, 255);
  int64_t i64;
  dev_store_f64(PD_INT64, &i64, 0, 1e300);
  assert_true(i64 == INT64_MAX);
  dev_store_f64(PD_INT64, &i64, 0, -1e300);
  assert_true(i64 == INT64_MIN);
}

static void test_shapes(void **state) {
  dev_shape s;
  dev_status st = DEV_STATUS_INIT;
  int64_t dims9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  assert_int_equal(dev_shape_make(9, dims9, &s, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "rank 9"));
  assert_int_equal(dev_shape_make(2, (int64_t[]){3, -1}, &s, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "dim 1"));
  assert_int_equal(dev_shape_make(0, NULL, &s, &st), PD_OK);
  int64_t n;
  assert_int_equal(dev_shape_num_elements(&s, &n, &st), PD_OK);
  assert_int_equal(n, 1);
  /* 2^31 * 2^31 * 2 overflows int64 */
  dev_shape big = {3, {1LL << 31, 1LL << 31, 2}};
  assert_int_equal(dev_shape_num_elements(&big, &n, &st), PD_INVALID_ARGUMENT);
  /* 2^62 elements fit int64 but not as float32 bytes */
  dev_shape big2 = {2, {1LL << 31, 1LL << 31}};
  size_t bytes;
  assert_int_equal(dev_shape_num_elements(&big2, &n, &st), PD_OK);
  assert_int_equal(dev_shape_byte_size(PD_FLOAT32, &big2, &bytes, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "overflows"));
  /* a zero dim makes the count 0 even with huge other dims */
  dev_shape zero = {3, {0, INT64_MAX, INT64_MAX}};
  assert_int_equal(dev_shape_num_elements(&zero, &n, &st), PD_OK);
  assert_int_equal(n, 0);
  dev_shape a = {3, {3, 1, 4}}, b = {2, {5, 4}}, r;
  assert_int_equal(dev_shape_broadcast(&a, &b, &r, &st), PD_OK);
  tu_assert_shape(&r, 3, 3, 5, 4);
  dev_shape c = {1, {3}};
  assert_int_equal(dev_shape_broadcast(&b, &c, &r, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "[5, 4] and [3] do not broadcast"));
  dev_shape h = {2, {10, 3}}, sh;
  int64_t want[4] = {3, 3, 2, 2};
  for (int i = 0; i < 4; i++) {
    dev_shard_shape(&h, 0, 4, i, &sh);
    assert_int_equal(sh.dims[0], want[i]);
  }
}

/* Sharded upload along axis 1 of a [2, 5] tensor on 3 devices: parts of
 * 2, 2, 1 columns; written in odd-sized chunks; read back every way. */
static void test_sharded_layout_roundtrip(void **state) {
  dev_engine *e = tu_engine(3, 0);
  dev_shape hs = {2, {2, 5}};
  dev_layout lay = {DEV_LAYOUT_SHARDED, 1, 0};
  dev_tensor *t;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      dev_tensor_create_for_layout(e, PD_INT32, &lay, &hs, NULL, &t, &st),
      PD_OK);
  tu_assert_shape(dev_tensor_shape(t), 2, 2, -1);
  tu_assert_shape(dev_tensor_component_shape(t, 0), 2, 2, 2);
  tu_assert_shape(dev_tensor_component_shape(t, 2), 2, 2, 1);
  int32_t host[10] = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14};
  const char *bytes = (const char *)host;
  uint64_t off = 0;
  size_t chunk[] = {3, 7, 1, 13, 16};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(
        dev_tensor_write(t, &lay, 0, off, bytes + off, chunk[i], &st), PD_OK);
    off += chunk[i];
  }
  assert_int_equal(off, 40);
  assert_int_equal(dev_tensor_write(t, &lay, 0, 38, host, 4, &st),
                   PD_OUT_OF_RANGE);
  /* component 1 holds columns 2..3 */
  double got[10];
  tu_read(t, 1, got, 10);
  tu_assert_close(got, ((double[]){2, 3, 12, 13}), 4, 0, 0);
  tu_read(t, 2, got, 10);
  tu_assert_close(got, ((double[]){4, 14}), 2, 0, 0);
  /* concatenation along axis 1 gives the host value back, in odd chunks */
  int32_t back[10] = {0};
  off = 0;
  for (int i = 0; i < 5; i++) {
    assert_int_equal(
        dev_tensor_read(t, &lay, 0, off, (char *)back + off, chunk[i], &st),
        PD_OK);
    off += chunk[i];
  }
  assert_memory_equal(back, host, sizeof host);
  /* concatenation along axis 0 is refused: components differ on axis 1 */
  dev_layout lay0 = {DEV_LAYOUT_SHARDED, 0, 0};
  uint64_t sz;
  assert_int_equal(dev_tensor_host_size(t, &lay0, 0, NULL, &sz, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "differ on axis 1"));
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

static void test_mirrored_and_per_component(void **state) {
  dev_engine *e = tu_engine(4, 0);
  dev_tensor *m =
      tu_mirrored(e, PD_FLOAT64, 2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
  double got[4];
  for (int d = 0; d < 4; d++) {
    tu_read(m, d, got, 4);
    tu_assert_close(got, ((double[]){1, 2, 3, 4}), 4, 0, 0);
  }
  tu_assert_shape(dev_tensor_shape(m), 2, 2, 2);
  assert_int_equal(dev_tensor_bytes(m), 4 * 32);
  /* per-component with different lengths: overall shape [-1] */
  dev_shape shapes[4] = {{1, {1}}, {1, {2}}, {1, {3}}, {1, {0}}};
  float c0[1] = {1}, c1[2] = {2, 3}, c2[3] = {4, 5, 6}, c3[1] = {0};
  const void *datas[4] = {c0, c1, c2, c3};
  dev_tensor *p;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      dev_tensor_from_components(e, PD_FLOAT32, shapes, datas, &p, &st), PD_OK);
  tu_assert_shape(dev_tensor_shape(p), 1, -1);
  dev_layout cat = {DEV_LAYOUT_SHARDED, 0, 0};
  float all[6];
  dev_shape hs;
  uint64_t sz;
  assert_int_equal(dev_tensor_host_size(p, &cat, 0, &hs, &sz, &st), PD_OK);
  tu_assert_shape(&hs, 1, 6);
  assert_int_equal(dev_tensor_to_host(p, &cat, 0, all, sizeof all, &st), PD_OK);
  for (int i = 0; i < 6; i++) assert_true(all[i] == (float)(i + 1));
  assert_int_equal(dev_tensor_to_host(p, &cat, 0, all, 8, &st),
                   PD_INVALID_ARGUMENT);
  /* ranks must agree */
  dev_shape bad[4] = {{1, {1}}, {2, {1, 1}}, {1, {1}}, {1, {1}}};
  dev_tensor *never = NULL;
  assert_int_equal(dev_tensor_create(e, PD_FLOAT32, bad, &never, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "rank"));
  dev_tensor_release(p);
  dev_tensor_release(m);
  dev_engine_destroy(e);
}

static void test_memory_accounting_and_limit(void **state) {
  dev_engine *e = tu_engine(2, 1000);
  dev_memory_stats ms;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_memory_stats(e, 1, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 0);
  assert_int_equal(ms.bytes_limit, 1000);
  dev_shape s = {1, {200}};
  dev_shape shapes[2] = {s, s};
  dev_tensor *a;
  assert_int_equal(dev_tensor_create(e, PD_FLOAT32, shapes, &a, &st), PD_OK);
  assert_int_equal(dev_engine_memory_stats(e, 0, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 800);
  /* 800 + 800 > 1000: RESOURCE_EXHAUSTED naming the device, nothing leaks */
  dev_tensor *b = NULL;
  assert_int_equal(dev_tensor_create(e, PD_FLOAT32, shapes, &b, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "cpu:0 is out of memory"));
  assert_int_equal(dev_engine_memory_stats(e, 1, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 800);
  /* Identity aliases its input: no new bytes */
  dev_tensor *id = tu_exec(e, "Identity", &a, 1, NULL, 0, 0);
  assert_int_equal(dev_tensor_wait(id, &st), PD_OK);
  assert_int_equal(dev_engine_memory_stats(e, 0, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 800);
  dev_tensor_release(a);
  assert_int_equal(dev_engine_memory_stats(e, 0, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 800); /* still held by the alias */
  dev_tensor_release(id);
  assert_int_equal(dev_engine_memory_stats(e, 0, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 0);
  assert_int_equal(ms.peak_bytes_in_use, 800);
  dev_engine_destroy(e);
}

/* An op whose output does not fit fails alone, asynchronously; ops that
 * consume its output fail with the same error; the engine goes on. */
static void test_async_error_propagates(void **state) {
  dev_engine *e = tu_engine(2, 4096);
  double v[600] = {0};
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){600}, v);     /* 2400 B */
  dev_tensor *y = tu_exec(e, "AllReduce", &x, 1, NULL, 0, 0); /* +2400 > 4096 */
  dev_tensor *z = tu_exec(e, "Identity", &y, 1, NULL, 0, 0);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(z, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "out of memory"));
  assert_true(dev_tensor_is_ready(z));
  double buf[4];
  dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, 0};
  assert_int_equal(dev_tensor_to_host(z, &lay, 0, buf, sizeof buf, &st),
                   PD_RESOURCE_EXHAUSTED);
  dev_tensor_release(z);
  dev_tensor_release(y);
  dev_tensor_release(x);
  dev_tensor *ok =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){1.5, 2});
  dev_tensor *s = tu_exec(e, "AllReduce", &ok, 1, NULL, 0, 0);
  double got[2];
  tu_read(s, 1, got, 2);
  tu_assert_close(got, ((double[]){3, 4}), 2, 0, 0);
  dev_tensor_release(s);
  dev_tensor_release(ok);
  dev_memory_stats ms;
  assert_int_equal(dev_engine_memory_stats(e, 0, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 0);
  dev_engine_destroy(e);
}

static void test_validation_errors(void **state) {
  dev_engine *e = tu_engine(2, 0);
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_tensor *two[2] = {x, x};
  tu_exec_fails(e, "NoSuchOp", &x, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "unknown op 'NoSuchOp'");
  tu_exec_fails(e, NULL, &x, 1, NULL, 0, PD_INVALID_ARGUMENT, "unknown op");
  tu_exec_fails(e, "AllReduce", two, 2, NULL, 0, PD_INVALID_ARGUMENT,
                "got 2 inputs; expected 1 (input)");
  tu_exec_fails(e, "AllReduce", NULL, 0, NULL, 0, PD_INVALID_ARGUMENT,
                "got 0 inputs");
  dev_attr unknown = dev_attr_int("bogus", 1);
  tu_exec_fails(e, "AllReduce", &x, 1, &unknown, 1, PD_INVALID_ARGUMENT,
                "unknown attribute 'bogus'; expected one of reduction");
  dev_attr dup[2] = {dev_attr_string("reduction", "sum"),
                     dev_attr_string("reduction", "max")};
  tu_exec_fails(e, "AllReduce", &x, 1, dup, 2, PD_INVALID_ARGUMENT,
                "given twice");
  char longs[400];
  memset(longs, 'a', sizeof longs - 1);
  longs[sizeof longs - 1] = 0;
  dev_attr lng = dev_attr_string("reduction", longs);
  tu_exec_fails(e, "AllReduce", &x, 1, &lng, 1, PD_INVALID_ARGUMENT,
                "the limit is 256");
  dev_tensor *none = NULL;
  tu_exec_fails(e, "AllReduce", &none, 1, NULL, 0, PD_INVALID_ARGUMENT,
                "missing");
  /* a tensor of another engine */
  dev_engine *other = tu_engine(2, 0);
  dev_tensor *y =
      tu_mirrored(other, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){1, 2});
  tu_exec_fails(e, "AllReduce", &y, 1, NULL, 0, PD_FAILED_PRECONDITION,
                "another engine");
  dev_tensor_release(y);
  dev_engine_destroy(other);
  /* too little room for outputs */
  dev_tensor *outs[1];
  int nout = 0;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      dev_execute(e, "AllReduce", &x, 1, NULL, 0, outs, &nout, &st),
      PD_INVALID_ARGUMENT);
  dev_tensor_release(x);
  dev_engine_destroy(e);
}

static void test_engine_config_errors(void **state) {
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  cfg.num_devices = 0;
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "expected 1 to 64"));
  cfg.num_devices = 65;
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_INVALID_ARGUMENT);
  cfg.num_devices = 2;
  cfg.backend = "tpu";
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "unknown backend 'tpu'"));
  cfg.backend = "cpu";
  cfg.num_devices = 64;
  assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_OK);
  assert_int_equal(dev_engine_num_devices(e), 64);
  dev_engine_destroy(e);
}

static void test_prepare_abandon(void **state) {
  dev_engine *e = tu_engine(2, 0);
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){1, 2});
  dev_op *op;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_op_prepare(e, "AllReduce", &x, 1, NULL, 0, &op, &st),
                   PD_OK);
  assert_int_equal(dev_op_output_bytes(op), 16);
  dev_tensor *out = dev_op_output(op, 0);
  dev_tensor_retain(out);
  assert_false(dev_tensor_is_ready(out));
  dev_op_abandon(op, PD_CANCELLED, "call cancelled");
  assert_int_equal(dev_tensor_wait(out, &st), PD_CANCELLED);
  assert_string_equal(st.msg, "call cancelled");
  dev_tensor_release(out);
  dev_tensor_release(x);
  assert_int_equal(dev_engine_sync(e, &st), PD_OK);
  dev_engine_destroy(e);
}

typedef struct notify_rec {
  atomic_int calls;
  pd_code code;
  dev_tensor *seen;
} notify_rec;

static void on_ready(void *arg, dev_tensor *t, pd_code code) {
  notify_rec *r = arg;
  r->code = code;
  r->seen = t;
  atomic_fetch_add(&r->calls, 1);
}

/* dev_tensor_notify fires once, with the tensor's status, whether the tensor
 * is ready already or finishes later on another thread. */
static void test_notify_and_deadline(void **state) {
  dev_engine *e = tu_engine(3, 4096);
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  dev_status st = DEV_STATUS_INIT;
  notify_rec r1 = {0};
  assert_int_equal(dev_tensor_notify(x, on_ready, &r1, &st),
                   PD_OK); /* ready: runs now */
  assert_int_equal(atomic_load(&r1.calls), 1);
  assert_int_equal(r1.code, PD_OK);
  assert_ptr_equal(r1.seen, x);
  /* many queued ops, then a notify on the last output */
  dev_tensor *y = x;
  dev_tensor_retain(y);
  for (int i = 0; i < 100; i++) {
    dev_tensor *z = tu_exec(e, "AllReduce", &y, 1, NULL, 0, 0);
    dev_tensor_release(y);
    y = z;
  }
  notify_rec r2 = {0};
  assert_int_equal(dev_tensor_notify(y, on_ready, &r2, &st), PD_OK);
  assert_int_equal(dev_tensor_wait_until(y, dev_monotonic_now() + 30, &st),
                   PD_OK);
  assert_int_equal(dev_engine_sync(e, &st), PD_OK);
  while (atomic_load(&r2.calls) ==
         0) { /* fires right after the last executor */
  }
  assert_int_equal(atomic_load(&r2.calls), 1);
  assert_int_equal(r2.code, PD_OK);
  /* a failed tensor: notify reports its code */
  double big[1000] = {0};
  dev_tensor *b = tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){1000}, big);
  dev_tensor *f =
      tu_exec(e, "AllReduce", &b, 1, NULL, 0, 0); /* 4000 + 4000 > 4096 */
  notify_rec r3 = {0};
  assert_int_equal(dev_tensor_notify(f, on_ready, &r3, &st), PD_OK);
  assert_int_equal(dev_tensor_wait(f, &st), PD_RESOURCE_EXHAUSTED);
  assert_int_equal(dev_engine_sync(e, &st), PD_OK);
  while (atomic_load(&r3.calls) == 0) {
  }
  assert_int_equal(r3.code, PD_RESOURCE_EXHAUSTED);
  /* a prepared, unsubmitted op: notify refuses, wait_until with a deadline
   * refuses too (it would never finish) */
  dev_op *op;
  assert_int_equal(dev_op_prepare(e, "AllReduce", &x, 1, NULL, 0, &op, &st),
                   PD_OK);
  notify_rec r4 = {0};
  assert_int_equal(dev_tensor_notify(dev_op_output(op, 0), on_ready, &r4, &st),
                   PD_FAILED_PRECONDITION);
  assert_int_equal(dev_tensor_wait_until(dev_op_output(op, 0),
                                         dev_monotonic_now() + 0.01, &st),
                   PD_FAILED_PRECONDITION);
  dev_op_abandon(op, PD_CANCELLED, "dropped");
  assert_int_equal(atomic_load(&r4.calls), 0);
  dev_tensor *tensors[] = {x, y, b, f};
  for (int i = 0; i < 4; i++) dev_tensor_release(tensors[i]);
  dev_engine_destroy(e);
}

/* A deadline that passes while the op is still queued gives
 * DEADLINE_EXCEEDED; the op itself goes on and completes. */
static void test_wait_deadline_exceeded(void **state) {
  dev_engine *e = tu_engine(2, 0);
  /* a large MatMul keeps the executors busy for a while */
  int64_t n = 768;
  double *v = malloc(sizeof(double) * (size_t)(n * n));
  tu_fill_random(v, n * n, -1, 1, 7);
  dev_tensor *a = tu_mirrored(e, PD_FLOAT64, 2, (int64_t[]){n, n}, v);
  free(v);
  dev_tensor *in[2] = {a, a};
  dev_tensor *c = NULL;
  for (int i = 0; i < 8; i++) {
    dev_tensor *m = tu_exec(e, "MatMul", in, 2, NULL, 0, 0);
    dev_tensor_release(c);
    c = m;
  }
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = dev_tensor_wait_until(c, dev_monotonic_now() + 1e-4, &st);
  /* eight 768^3 float64 products take far more than 100 us */
  assert_int_equal(rc, PD_DEADLINE_EXCEEDED);
  assert_non_null(strstr(st.msg, "deadline"));
  assert_int_equal(dev_tensor_wait(c, &st), PD_OK);
  dev_tensor_release(c);
  dev_tensor_release(a);
  dev_engine_destroy(e);
}

static void test_registry_listing(void **state) {
  int n = dev_op_count();
  assert_true(n >= 4);
  for (int i = 1; i < n; i++)
    assert_true(strcmp(dev_op_def_name(dev_op_at(i - 1)),
                       dev_op_def_name(dev_op_at(i))) < 0);
  const dev_op_def *d = dev_op_lookup("AllReduce");
  assert_non_null(d);
  assert_int_equal(dev_op_input_length(d, 0, 1), 1);
  assert_int_equal(dev_op_input_length(d, 0, 2), -1);
  assert_null(dev_op_lookup("allreduce"));
}

/* Samples device d until it reads `want` (a hang fails the test). */
static void watch_until(dev_engine *e, int d, dev_progress *p, double now,
                        dev_progress_state want) {
  double limit = dev_monotonic_now() + 60;
  for (;;) {
    dev_engine_watch(e, d, p, now);
    if (p->state == want) return;
    assert_true(dev_monotonic_now() < limit);
    sched_yield();
  }
}

/* dev_engine_watch: idle reads 0; a held executor with an op queued reads
 * WAITING, its time without progress growing with the caller's clock; its
 * peer, inside the collective waiting for it, reads RUNNING; finishing is
 * progress; a batched product's heartbeats (one per matrix) are progress
 * too, counted in p->beats. */
static void test_watch_progress(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  dev_progress p0, p1;
  memset(&p0, 0, sizeof p0);
  memset(&p1, 0, sizeof p1);
  assert_true(dev_engine_watch(e, 0, &p0, 100.0) == 0.0);
  assert_int_equal(p0.state, DEV_PROGRESS_IDLE);
  assert_true(dev_engine_watch(e, 5, &p1, 100.0) == 0.0); /* out of range */
  assert_int_equal(p1.state, DEV_PROGRESS_IDLE);
  memset(&p1, 0, sizeof p1);
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){4}, (double[]){1, 2, 3, 4});
  dev_engine_test_hold(e, 1, true);
  dev_tensor *y = tu_exec(e, "AllReduce", &x, 1, NULL, 0, 0);
  watch_until(e, 0, &p0, 101.0, DEV_PROGRESS_RUNNING);
  assert_true(dev_engine_watch(e, 1, &p1, 101.0) == 0.0); /* work came */
  assert_int_equal(p1.state, DEV_PROGRESS_WAITING);
  assert_true(dev_engine_watch(e, 1, &p1, 111.0) == 10.0);
  assert_int_equal(p1.state, DEV_PROGRESS_WAITING);
  assert_true(dev_engine_watch(e, 0, &p0, 111.0) == 10.0);
  assert_int_equal(p0.state, DEV_PROGRESS_RUNNING);
  dev_engine_test_hold(e, 1, false);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(y, &st), PD_OK);
  assert_int_equal(dev_engine_sync(e, &st), PD_OK);
  for (int d = 0; d < 2; d++) {
    dev_progress *p = d ? &p1 : &p0;
    assert_true(dev_engine_watch(e, d, p, 112.0) == 0.0);
    assert_int_equal(p->state, DEV_PROGRESS_IDLE);
  }
  /* 8 products of 2 x 2 matrices, walked one by one: 8 beats a device. */
  double v[32];
  for (int i = 0; i < 32; i++) v[i] = i % 5;
  dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 3, (int64_t[]){8, 2, 2}, v);
  uint64_t before = p0.beats;
  dev_tensor *in[2] = {a, a};
  dev_tensor *b = tu_exec(e, "BatchMatMul", in, 2, NULL, 0, 0);
  assert_int_equal(dev_tensor_wait(b, &st), PD_OK);
  assert_int_equal(dev_engine_sync(e, &st), PD_OK);
  dev_engine_watch(e, 0, &p0, 113.0);
  assert_int_equal(p0.beats, before + 8);
  dev_tensor *all[] = {x, y, a, b};
  for (int i = 0; i < 4; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_names_and_sizes),
      cmocka_unit_test(test_half_bfloat16_rounding),
      cmocka_unit_test(test_store_saturates),
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_sharded_layout_roundtrip),
      cmocka_unit_test(test_mirrored_and_per_component),
      cmocka_unit_test(test_memory_accounting_and_limit),
      cmocka_unit_test(test_async_error_propagates),
      cmocka_unit_test(test_validation_errors),
      cmocka_unit_test(test_engine_config_errors),
      cmocka_unit_test(test_prepare_abandon),
      cmocka_unit_test(test_registry_listing),
      cmocka_unit_test(test_notify_and_deadline),
      cmocka_unit_test(test_wait_deadline_exceeded),
      cmocka_unit_test(test_watch_progress),
  };
  return cmocka_run_group_tests_name("engine", tests, NULL, NULL);
}
