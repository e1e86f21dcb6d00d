/* Pending tensors (device.h, dev_tensor_create_pending): not ready until
 * dev_tensor_complete, waits block and honour their deadline, notify
 * registrations are deferred and fire once, a failed completion is stored
 * on every component (buffers freed) and propagates to consumers like any
 * run-time failure, and completion happens once. Expected values by hand. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "testutil.h"

typedef struct note {
  atomic_int calls;
  _Atomic pd_code code;
} note;

static void on_ready(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  note *n = arg;
  atomic_store(&n->code, code);
  atomic_fetch_add(&n->calls, 1);
}

typedef struct waiter {
  dev_tensor *t;
  pd_code code;
  dev_status st;
} waiter;

static void *wait_main(void *arg) {
  waiter *w = arg;
  w->code = dev_tensor_wait(w->t, &w->st);
  return NULL;
}

static dev_tensor *pending_vec(dev_engine *e, int n, dev_layout lay) {
  dev_shape shape = {1, {n}};
  dev_tensor *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      dev_tensor_create_pending(e, PD_FLOAT32, &lay, &shape, NULL, &t, &st),
      PD_OK);
  return t;
}

static void test_pending_then_ready(void **state) {
  dev_engine *e = tu_engine(2, 0);
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *t = pending_vec(e, 3, mir);
  assert_true(dev_tensor_is_pending(t));
  assert_false(dev_tensor_is_ready(t));
  dev_status st = DEV_STATUS_INIT;
  /* A deadline already passed: the wait gives up instead of blocking. */
  assert_int_equal(dev_tensor_wait_until(t, dev_monotonic_now() - 1, &st),
                   PD_DEADLINE_EXCEEDED);
  assert_non_null(strstr(st.msg, "loaded"));
  /* A deadline a little ahead passes too (the tensor never completes). */
  assert_int_equal(dev_tensor_wait_until(t, dev_monotonic_now() + 0.05, &st),
                   PD_DEADLINE_EXCEEDED);
  note n = {0, PD_UNKNOWN};
  assert_int_equal(dev_tensor_notify(t, on_ready, &n, &st), PD_OK);
  assert_int_equal(atomic_load(&n.calls), 0);
  waiter w = {t, PD_UNKNOWN, DEV_STATUS_INIT};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, wait_main, &w), 0);
  const float v[3] = {1.5f, -2.0f, 4.25f};
  assert_int_equal(dev_tensor_write(t, &mir, 0, 0, v, 8, &st), PD_OK);
  assert_int_equal(dev_tensor_write(t, &mir, 0, 8, v + 2, 4, &st), PD_OK);
  assert_int_equal(atomic_load(&n.calls), 0);
  dev_tensor_complete(t, PD_OK, NULL);
  pthread_join(th, NULL);
  assert_int_equal(w.code, PD_OK);
  assert_int_equal(atomic_load(&n.calls), 1);
  assert_int_equal(atomic_load(&n.code), PD_OK);
  assert_false(dev_tensor_is_pending(t));
  assert_true(dev_tensor_is_ready(t));
  /* Completing twice is a no-op: no second callback, the data stays. */
  dev_tensor_complete(t, PD_DATA_LOSS, "too late");
  assert_int_equal(atomic_load(&n.calls), 1);
  double got[3];
  tu_read(t, 1, got, 3);
  tu_assert_close(got, ((double[]){1.5, -2.0, 4.25}), 3, 0, 0);
  /* A registration after completion fires at once. */
  note n2 = {0, PD_UNKNOWN};
  assert_int_equal(dev_tensor_notify(t, on_ready, &n2, &st), PD_OK);
  assert_int_equal(atomic_load(&n2.calls), 1);
  /* Ops on it run as on any ready tensor: Neg gives -v on both devices. */
  dev_tensor *neg = tu_exec(e, "Neg", &t, 1, NULL, 0, 0);
  tu_read(neg, 0, got, 3);
  tu_assert_close(got, ((double[]){-1.5, 2.0, -4.25}), 3, 0, 0);
  dev_tensor_release(neg);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

static void test_pending_failed(void **state) {
  dev_engine *e = tu_engine(2, 0);
  dev_layout sh = {DEV_LAYOUT_SHARDED, 0, 0};
  dev_tensor *t = pending_vec(e, 5, sh); /* components of 3 and 2 floats */
  dev_status st = DEV_STATUS_INIT;
  dev_memory_stats ms;
  assert_int_equal(dev_engine_memory_stats(e, 0, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 12);
  note n = {0, PD_UNKNOWN};
  assert_int_equal(dev_tensor_notify(t, on_ready, &n, &st), PD_OK);
  dev_tensor_complete(t, PD_DATA_LOSS, "x.safetensors: short read");
  assert_int_equal(atomic_load(&n.calls), 1);
  assert_int_equal(atomic_load(&n.code), PD_DATA_LOSS);
  assert_true(dev_tensor_is_ready(t));
  assert_int_equal(dev_tensor_wait(t, &st), PD_DATA_LOSS);
  assert_string_equal(st.msg, "x.safetensors: short read");
  /* Buffers are freed at once, while the tensor is still referenced. */
  for (int d = 0; d < 2; d++) {
    assert_int_equal(dev_engine_memory_stats(e, d, &ms, &st), PD_OK);
    assert_int_equal(ms.bytes_in_use, 0);
  }
  float buf[5];
  assert_int_equal(dev_tensor_to_host(t, &sh, 0, buf, sizeof buf, &st),
                   PD_DATA_LOSS);
  /* A consumer fails with the same error; completing again changes nothing. */
  dev_tensor *neg = tu_exec(e, "Neg", &t, 1, NULL, 0, 0);
  assert_int_equal(dev_tensor_wait(neg, &st), PD_DATA_LOSS);
  assert_non_null(strstr(st.msg, "short read"));
  dev_tensor_complete(t, PD_OK, NULL);
  assert_int_equal(dev_tensor_wait(t, &st), PD_DATA_LOSS);
  assert_int_equal(atomic_load(&n.calls), 1);
  dev_tensor_release(neg);
  dev_tensor_release(t);
  dev_engine_destroy(e);
}

static void test_pending_input_of_op(void **state) {
  dev_engine *e = tu_engine(2, 0);
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *p = pending_vec(e, 2, mir);
  dev_tensor *r =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){10, 20});
  assert_false(dev_tensor_is_pending(r));
  dev_tensor_complete(r, PD_CANCELLED, "not pending: ignored");
  assert_int_equal(dev_tensor_wait(r, NULL), PD_OK);
  dev_tensor *in[2] = {r, p};
  dev_op *op = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_op_prepare(e, "Add", in, 2, NULL, 0, &op, &st), PD_OK);
  dev_tensor *which = NULL;
  assert_true(dev_op_has_pending_input(op, &which));
  assert_ptr_equal(which, p);
  /* Submitting it anyway is refused on the op's outputs, not run. */
  dev_tensor *out = dev_op_output(op, 0);
  dev_tensor_retain(out);
  dev_op_submit(e, op);
  assert_int_equal(dev_tensor_wait(out, &st), PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "still loading"));
  dev_tensor_release(out);
  /* Once complete, the same op prepares without a pending input and runs. */
  const float v[2] = {1, 2};
  assert_int_equal(dev_tensor_write(p, &mir, 0, 0, v, 8, &st), PD_OK);
  dev_tensor_complete(p, PD_OK, NULL);
  assert_int_equal(dev_op_prepare(e, "Add", in, 2, NULL, 0, &op, &st), PD_OK);
  assert_false(dev_op_has_pending_input(op, NULL));
  out = dev_op_output(op, 0);
  dev_tensor_retain(out);
  dev_op_submit(e, op);
  double got[2];
  tu_read(out, 1, got, 2);
  tu_assert_close(got, ((double[]){11, 22}), 2, 0, 0);
  dev_tensor_release(out);
  dev_tensor_release(r);
  dev_tensor_release(p);
  dev_engine_destroy(e);
}

/* Completing from one thread while others register and wait: every
 * registration fires exactly once, every waiter returns. */
typedef struct race {
  dev_tensor *t;
  note notes[64];
} race;

static void *register_main(void *arg) {
  race *r = arg;
  for (int i = 0; i < 64; i++)
    assert_int_equal(dev_tensor_notify(r->t, on_ready, &r->notes[i], NULL),
                     PD_OK);
  return NULL;
}

static void test_pending_race(void **state) {
  dev_engine *e = tu_engine(2, 0);
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  for (int round = 0; round < 20; round++) {
    race r;
    memset(&r, 0, sizeof r);
    r.t = pending_vec(e, 1, mir);
    pthread_t reg, wt;
    waiter w = {r.t, PD_UNKNOWN, DEV_STATUS_INIT};
    assert_int_equal(pthread_create(&reg, NULL, register_main, &r), 0);
    assert_int_equal(pthread_create(&wt, NULL, wait_main, &w), 0);
    dev_tensor_complete(r.t, PD_ABORTED, "aborted");
    pthread_join(reg, NULL);
    pthread_join(wt, NULL);
    assert_int_equal(w.code, PD_ABORTED);
    for (int i = 0; i < 64; i++) {
      assert_int_equal(atomic_load(&r.notes[i].calls), 1);
      assert_int_equal(atomic_load(&r.notes[i].code), PD_ABORTED);
    }
    dev_tensor_release(r.t);
  }
  dev_engine_destroy(e);
}

/* dev_op_submit_batch (issue #15): 150 chained ops (each adds 1 to the
 * previous result) handed over in one call, more than DEV_SUBMIT_BATCH_MAX,
 * keep their order (x + 150 by hand); an op with a pending input in the
 * middle is refused as dev_op_submit refuses it, and its consumer fails
 * with its error, while the chain around it is unaffected. */
static void test_submit_batch(void **state) {
  dev_engine *e = tu_engine(3, 0);
  dev_tensor *x =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){1.5, -4});
  dev_tensor *one =
      tu_mirrored(e, PD_FLOAT32, 1, (int64_t[]){2}, (double[]){1, 1});
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *p = pending_vec(e, 2, mir);
  enum { N = 150 };
  dev_op *ops[N + 2];
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *cur = x;
  int k = 0;
  for (int i = 0; i < N; i++) {
    dev_tensor *in[2] = {cur, one};
    assert_int_equal(dev_op_prepare(e, "Add", in, 2, NULL, 0, &ops[k], &st),
                     PD_OK);
    cur = dev_op_output(ops[k++], 0);
    if (i == 70) { /* the pending op and its consumer, mid-chain */
      dev_tensor *pin[2] = {p, one};
      assert_int_equal(
          dev_op_prepare(e, "Add", pin, 2, NULL, 0, &ops[k++], &st), PD_OK);
      dev_tensor *cin[1] = {dev_op_output(ops[k - 1], 0)};
      assert_int_equal(
          dev_op_prepare(e, "Neg", cin, 1, NULL, 0, &ops[k++], &st), PD_OK);
    }
  }
  dev_tensor *last = cur, *refused = dev_op_output(ops[71], 0);
  dev_tensor *consumer = dev_op_output(ops[72], 0);
  dev_tensor_retain(last);
  dev_tensor_retain(refused);
  dev_tensor_retain(consumer);
  dev_op_submit_batch(e, ops, k);
  double out[2];
  for (int c = 0; c < 3; c++) {
    assert_int_equal(tu_read(last, c, out, 2), 2);
    assert_true(out[0] == 151.5 && out[1] == 146);
  }
  assert_int_equal(dev_tensor_wait(refused, &st), PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "still loading"));
  assert_int_equal(dev_tensor_wait(consumer, &st), PD_FAILED_PRECONDITION);
  dev_tensor_complete(p, PD_OK, "");
  dev_tensor_release(last);
  dev_tensor_release(refused);
  dev_tensor_release(consumer);
  dev_tensor_release(p);
  dev_tensor_release(one);
  dev_tensor_release(x);
  dev_engine_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pending_then_ready),
      cmocka_unit_test(test_pending_failed),
      cmocka_unit_test(test_pending_input_of_op),
      cmocka_unit_test(test_pending_race),
      cmocka_unit_test(test_submit_batch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
