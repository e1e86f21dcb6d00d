/* Completion fences (dev_backend.fence_*): on a backend that only queues work
 * (CUDA), an op is done when its fence completes, not when run_kernel
 * returns. The backend here is the CPU backend with fences the test
 * completes by hand, so every check is deterministic: the kernels have run
 * when a fence is recorded, and only the test decides when the "device" has
 * finished.
 *
 * Checked: dev_tensor_is_ready / dev_tensor_wait and notify callbacks wait
 * for the fence; the executor keeps issuing while fences are pending; a fence
 * that completes with an error fails exactly that op's outputs on that
 * device, and the ops that consumed them (issued before or after); a fence
 * that cannot be recorded fails its op; an op's inputs are released once
 * every device has issued it, before its fences complete; engine destruction
 * with fences pending neither hangs nor leaks (the sanitizer build checks
 * leaks). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_int.h"
#include "testutil.h"

/* --- the test backend: CPU + hand-completed fences ------------------------ */

typedef struct tfence {
  int device;
  bool done;
  pd_code code;
  char msg[160];
  struct tfence *next; /* the device's live fences, in record order */
} tfence;

static pthread_mutex_t t_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t t_cv = PTHREAD_COND_INITIALIZER;

static struct { /* under t_mu */
  int recorded[PD_MAX_DEVICES]; /* fences recorded per device */
  tfence *live[PD_MAX_DEVICES];
  int num_live;
  bool auto_done;                /* record fences already completed */
  bool fail_record[PD_MAX_DEVICES];
  int waits;                     /* fence_wait calls */
  void (*cpu_destroy)(dev_backend *b);
  int destroyed_with_live;       /* live fences when the backend was destroyed */
} T;

static pd_code tf_record(dev_backend *b, int device, void **fence, dev_status *st) {
  pthread_mutex_lock(&t_mu);
  if (T.fail_record[device]) {
    T.fail_record[device] = false;
    pthread_mutex_unlock(&t_mu);
    return dev_error(st, PD_INTERNAL, "%s: cannot record a fence (injected)",
                     b->device_name(b, device));
  }
  tfence *f = calloc(1, sizeof *f);
  if (!f) abort(); /* an executor thread: no cmocka assertions here */
  f->device = device;
  f->done = T.auto_done;
  tfence **pp = &T.live[device];
  while (*pp) pp = &(*pp)->next;
  *pp = f;
  T.recorded[device]++;
  T.num_live++;
  pthread_cond_broadcast(&t_cv);
  pthread_mutex_unlock(&t_mu);
  *fence = f;
  return PD_OK;
}

static pd_code tf_wait(dev_backend *b, int device, void *fence, dev_status *st) {
  tfence *f = fence;
  if (f->device != device) abort(); /* a completion thread */
  pthread_mutex_lock(&t_mu);
  T.waits++;
  while (!f->done) pthread_cond_wait(&t_cv, &t_mu);
  pd_code code = f->code;
  char msg[sizeof f->msg];
  memcpy(msg, f->msg, sizeof msg);
  pthread_mutex_unlock(&t_mu);
  return code == PD_OK ? PD_OK : dev_error(st, code, "%s", msg);
}

static void tf_release(dev_backend *b, int device, void *fence) {
  pthread_mutex_lock(&t_mu);
  tfence **pp = &T.live[device];
  while (*pp != fence) pp = &(*pp)->next;
  *pp = ((tfence *)fence)->next;
  T.num_live--;
  pthread_mutex_unlock(&t_mu);
  free(fence);
}

static void tf_destroy(dev_backend *b) {
  pthread_mutex_lock(&t_mu);
  T.destroyed_with_live = T.num_live;
  pthread_mutex_unlock(&t_mu);
  T.cpu_destroy(b);
}

/* An engine of n CPU devices whose ops complete when their fences do. */
static dev_engine *fenced_engine(int n) {
  pthread_mutex_lock(&t_mu);
  memset(T.recorded, 0, sizeof T.recorded);
  memset(T.live, 0, sizeof T.live);
  memset(T.fail_record, 0, sizeof T.fail_record);
  T.num_live = 0;
  T.auto_done = false;
  T.waits = 0;
  T.destroyed_with_live = -1;
  pthread_mutex_unlock(&t_mu);
  dev_cpu_config cc = DEV_CPU_CONFIG_INITIALIZER;
  cc.num_devices = n;
  dev_backend *b = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_cpu_backend_create(&cc, &b, &st), PD_OK);
  assert_true(b->struct_size >= offsetof(dev_backend, fence_release) + sizeof b->fence_release);
  assert_null(b->fence_record); /* the CPU backend has none of its own */
  b->fence_record = tf_record;
  b->fence_wait = tf_wait;
  b->fence_release = tf_release;
  T.cpu_destroy = b->destroy;
  b->destroy = tf_destroy;
  dev_engine *e = NULL;
  assert_int_equal(dev_engine_create_with_backend(b, &e, &st), PD_OK);
  return e;
}

/* Blocks until `device` has recorded n fences (its executor issued n ops). */
static void wait_recorded(int device, int n) {
  pthread_mutex_lock(&t_mu);
  while (T.recorded[device] < n) pthread_cond_wait(&t_cv, &t_mu);
  pthread_mutex_unlock(&t_mu);
}

/* Completes the oldest live fence of `device` that is not yet completed,
 * with `code` (and `msg` when code != OK). */
static void complete_next(int device, pd_code code, const char *msg) {
  pthread_mutex_lock(&t_mu);
  tfence *f = T.live[device];
  while (f && f->done) f = f->next;
  assert_non_null(f);
  f->done = true;
  f->code = code;
  snprintf(f->msg, sizeof f->msg, "%s", msg ? msg : "");
  pthread_cond_broadcast(&t_cv);
  pthread_mutex_unlock(&t_mu);
}

/* Completes every live fence, and every later one as it is recorded. */
static void complete_all(void) {
  pthread_mutex_lock(&t_mu);
  T.auto_done = true;
  for (int d = 0; d < PD_MAX_DEVICES; d++)
    for (tfence *f = T.live[d]; f; f = f->next) f->done = true;
  pthread_cond_broadcast(&t_cv);
  pthread_mutex_unlock(&t_mu);
}

/* A notify callback that records its calls. */
typedef struct note {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int calls;
  pd_code code;
} note;

#define NOTE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, PD_OK}

static void note_fn(void *arg, dev_tensor *t, pd_code code) {
  note *n = arg;
  pthread_mutex_lock(&n->mu);
  n->calls++;
  n->code = code;
  pthread_cond_broadcast(&n->cv);
  pthread_mutex_unlock(&n->mu);
}

static int note_calls(note *n) {
  pthread_mutex_lock(&n->mu);
  int c = n->calls;
  pthread_mutex_unlock(&n->mu);
  return c;
}

static void note_wait(note *n) {
  pthread_mutex_lock(&n->mu);
  while (n->calls == 0) pthread_cond_wait(&n->cv, &n->mu);
  pthread_mutex_unlock(&n->mu);
}

static dev_tensor *exec2(dev_engine *e, const char *op, dev_tensor *x, dev_tensor *y) {
  dev_tensor *in[2] = {x, y};
  return tu_exec(e, op, in, y ? 2 : 1, NULL, 0, 0);
}

static const int64_t dims3[1] = {3};

/* --- tests ---------------------------------------------------------------- */

static void test_ready_waits_for_fence(void **state) {
  dev_engine *e = fenced_engine(2);
  dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
  dev_tensor *b = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){10, 20, 30});
  assert_true(dev_tensor_is_ready(a)); /* uploads are ready at once */
  dev_tensor *c = exec2(e, "Add", a, b);
  wait_recorded(0, 1);
  wait_recorded(1, 1); /* both executors have run the kernel */
  assert_false(dev_tensor_is_ready(c));
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait_until(c, dev_monotonic_now() + 0.01, &st),
                   PD_DEADLINE_EXCEEDED);
  complete_next(0, PD_OK, NULL);
  assert_false(dev_tensor_is_ready(c)); /* device 1 has not finished */
  dev_exec_wait(e, 0, atomic_load(&c->comps[0].ready_seq)); /* device 0 has */
  assert_int_equal(dev_tensor_wait_until(c, dev_monotonic_now() + 0.01, &st),
                   PD_DEADLINE_EXCEEDED);
  assert_non_null(strstr(st.msg, "cpu:1"));
  complete_next(1, PD_OK, NULL);
  assert_int_equal(dev_tensor_wait(c, &st), PD_OK);
  assert_true(dev_tensor_is_ready(c));
  double got[3];
  for (int d = 0; d < 2; d++) {
    assert_int_equal(tu_read(c, d, got, 3), 3);
    tu_assert_close(got, ((double[]){11, 22, 33}), 3, 0, 0);
  }
  /* Busy time on a fenced device runs from issue to the fence's completion. */
  assert_true(dev_engine_busy_seconds(e, 0) > 0 && dev_engine_busy_seconds(e, 1) > 0);
  dev_tensor_release(a);
  dev_tensor_release(b);
  dev_tensor_release(c);
  dev_engine_destroy(e);
  assert_int_equal(T.destroyed_with_live, 0);
}

static void test_pipelined_notify_after_fence(void **state) {
  dev_engine *e = fenced_engine(2);
  dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
  dev_tensor *b = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){10, 20, 30});
  dev_tensor *c1 = exec2(e, "Add", a, b);
  dev_tensor *c2 = exec2(e, "Mul", c1, c1);
  dev_tensor *c3 = exec2(e, "Neg", c2, NULL);
  /* The executors issued all three without waiting for a fence. */
  wait_recorded(0, 3);
  wait_recorded(1, 3);
  note n1 = NOTE_INIT, n3 = NOTE_INIT;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_notify(c1, note_fn, &n1, &st), PD_OK);
  assert_int_equal(dev_tensor_notify(c3, note_fn, &n3, &st), PD_OK);
  assert_int_equal(note_calls(&n1), 0);
  assert_int_equal(note_calls(&n3), 0);
  complete_next(0, PD_OK, NULL);
  assert_int_equal(note_calls(&n1), 0); /* device 1 has not finished c1 */
  complete_next(1, PD_OK, NULL);
  note_wait(&n1);
  assert_int_equal(n1.code, PD_OK);
  assert_int_equal(note_calls(&n3), 0);
  complete_next(0, PD_OK, NULL);
  complete_next(0, PD_OK, NULL);
  complete_next(1, PD_OK, NULL);
  assert_int_equal(note_calls(&n3), 0); /* c3's fence on device 1 is pending */
  complete_next(1, PD_OK, NULL);
  note_wait(&n3);
  assert_int_equal(n3.code, PD_OK);
  assert_int_equal(note_calls(&n1), 1);
  double got[3];
  for (int d = 0; d < 2; d++) {
    tu_read(c3, d, got, 3);
    tu_assert_close(got, ((double[]){-121, -484, -1089}), 3, 0, 0); /* -(a+b)^2 */
  }
  dev_tensor *all[] = {a, b, c1, c2, c3};
  for (int i = 0; i < 5; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
  assert_int_equal(T.destroyed_with_live, 0);
}

static void test_fence_error_fails_that_op(void **state) {
  dev_engine *e = fenced_engine(2);
  dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
  dev_tensor *b = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){10, 20, 30});
  dev_tensor *c1 = exec2(e, "Add", a, b);  /* its fence on device 1 fails */
  dev_tensor *c2 = exec2(e, "Mul", c1, a); /* consumes c1, issued before the failure shows */
  dev_tensor *alias = exec2(e, "Identity", c1, NULL);
  dev_tensor *u = exec2(e, "Neg", a, NULL); /* independent of c1 */
  /* Add, Mul and Neg: Identity shares c1's buffer, so it issues no work and
   * records no fence. */
  wait_recorded(0, 3);
  wait_recorded(1, 3);
  const char *why =
      "cpu:1: cudaEventSynchronize: an illegal memory access was encountered "
      "(cudaErrorIllegalAddress)";
  complete_next(1, PD_UNAVAILABLE, why);
  complete_all();

  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(c1, &st), PD_UNAVAILABLE);
  assert_non_null(strstr(st.msg, "Add on cpu:1: "));
  assert_non_null(strstr(st.msg, why));
  assert_int_equal(c1->comps[0].code, PD_OK); /* only device 1's component */
  assert_int_equal(c1->comps[1].code, PD_UNAVAILABLE);
  dev_tensor *late[] = {c2, alias};
  for (int i = 0; i < 2; i++) {
    dev_status lst = DEV_STATUS_INIT;
    assert_int_equal(dev_tensor_wait(late[i], &lst), PD_UNAVAILABLE);
    assert_string_equal(lst.msg, st.msg);
    assert_int_equal(late[i]->comps[0].code, PD_OK);
  }
  double got[3];
  dev_layout comp0 = {DEV_LAYOUT_COMPONENT, 0, 0};
  assert_int_equal(dev_tensor_read(c2, &comp0, 0, 0, got, 0, &st), PD_UNAVAILABLE);
  assert_int_equal(dev_tensor_wait(u, &st), PD_OK); /* the error stays on its op */
  for (int d = 0; d < 2; d++) {
    tu_read(u, d, got, 3);
    tu_assert_close(got, ((double[]){-1, -2, -3}), 3, 0, 0);
  }
  /* An op issued after the failure showed fails at once, with the same error. */
  dev_tensor *c4 = exec2(e, "Sub", c1, a);
  dev_status st4 = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(c4, &st4), PD_UNAVAILABLE);
  assert_string_equal(st4.msg, st.msg);
  /* The device goes on: a new op on it succeeds. */
  dev_tensor *c5 = exec2(e, "Add", a, a);
  tu_read(c5, 1, got, 3);
  tu_assert_close(got, ((double[]){2, 4, 6}), 3, 0, 0);
  dev_tensor *all[] = {a, b, c1, c2, alias, u, c4, c5};
  for (int i = 0; i < 8; i++) dev_tensor_release(all[i]);
  dev_engine_destroy(e);
  assert_int_equal(T.destroyed_with_live, 0);
}

static void test_inputs_freed_at_issue(void **state) {
  dev_engine *e = fenced_engine(2);
  dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
  dev_tensor *x = exec2(e, "Neg", a, NULL);
  dev_tensor_release(a); /* only Neg's op holds it now */
  dev_tensor *z = exec2(e, "Neg", x, NULL);
  /* Each executor drops its hold on Neg(a) before it issues Neg(x). */
  wait_recorded(0, 2);
  wait_recorded(1, 2);
  /* No fence has completed, yet a's 12 bytes per device are freed (on a GPU,
   * stream-ordered behind Neg(a)); x's and z's remain. */
  for (int d = 0; d < 2; d++) {
    dev_memory_stats ms;
    dev_status st = DEV_STATUS_INIT;
    assert_int_equal(dev_engine_memory_stats(e, d, &ms, &st), PD_OK);
    assert_int_equal(ms.bytes_in_use, 24);
  }
  assert_false(dev_tensor_is_ready(x));
  complete_all();
  double got[3];
  tu_read(z, 1, got, 3);
  tu_assert_close(got, ((double[]){1, 2, 3}), 3, 0, 0);
  dev_tensor_release(x);
  dev_tensor_release(z);
  dev_engine_destroy(e);
  assert_int_equal(T.destroyed_with_live, 0);
}

static void test_fence_record_failure(void **state) {
  dev_engine *e = fenced_engine(3);
  dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
  pthread_mutex_lock(&t_mu);
  T.fail_record[2] = true;
  pthread_mutex_unlock(&t_mu);
  complete_all();
  dev_tensor *c = exec2(e, "Square", a, NULL);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(c, &st), PD_INTERNAL);
  assert_string_equal(st.msg, "Square on cpu:2: cpu:2: cannot record a fence (injected)");
  assert_int_equal(c->comps[0].code, PD_OK);
  assert_int_equal(c->comps[1].code, PD_OK);
  dev_tensor_release(c);
  dev_tensor_release(a);
  dev_engine_destroy(e);
  assert_int_equal(T.destroyed_with_live, 0);
}

static void *complete_later(void *arg) {
  /* A delay, so that dev_engine_destroy is (almost surely) waiting by now;
   * the test holds whichever way the race goes. */
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  complete_next(1, PD_UNAVAILABLE, "cpu:1: the device failed (injected)");
  complete_all();
  return NULL;
}

static void test_destroy_with_pending_fences(void **state) {
  dev_engine *e = fenced_engine(3);
  dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
  dev_tensor *t = a;
  dev_tensor_retain(t);
  for (int i = 0; i < 6; i++) { /* a chain whose results nobody keeps */
    dev_tensor *next = exec2(e, "Add", t, a);
    dev_tensor_release(t);
    t = next;
  }
  note n = NOTE_INIT;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_notify(t, note_fn, &n, &st), PD_OK);
  dev_tensor_release(t);
  dev_tensor_release(a);
  for (int d = 0; d < 3; d++) wait_recorded(d, 6);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, complete_later, NULL), 0);
  dev_engine_destroy(e); /* returns once the fences complete */
  pthread_join(th, NULL);
  assert_int_equal(T.destroyed_with_live, 0);
  assert_int_equal(T.num_live, 0);
  /* The last op's notification fired, with device 1's error. */
  assert_int_equal(n.calls, 1);
  assert_int_equal(n.code, PD_UNAVAILABLE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ready_waits_for_fence),
      cmocka_unit_test(test_pipelined_notify_after_fence),
      cmocka_unit_test(test_fence_error_fails_that_op),
      cmocka_unit_test(test_inputs_freed_at_issue),
      cmocka_unit_test(test_fence_record_failure),
      cmocka_unit_test(test_destroy_with_pending_fences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
