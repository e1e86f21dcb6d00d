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
 * leaks). Then stress, for the ThreadSanitizer and AddressSanitizer builds as
 * much as for the values: late failures with fences completed in random
 * interleavings (against a simulation of which components must fail), a
 * failure recorded while its consumer is being issued, notifies registered
 * as their op is published, several submitting threads with the engine
 * destroyed under them, and the fence ring growing while it wraps. The
 * fake backend learns which op a fence follows from the kernel the executor
 * ran last (run_kernel is wrapped). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_int.h"
#include "testutil.h"

/* --- the test backend: CPU + hand-completed fences ------------------------ */

typedef struct tfence {
  int device;
  uint64_t seq; /* the op it follows (the last run_kernel on this thread) */
  bool done;
  pd_code code;
  char msg[160];
  struct tfence *next; /* the device's live fences, in record order */
} tfence;

static pthread_mutex_t t_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t t_cv = PTHREAD_COND_INITIALIZER;

static struct {                 /* under t_mu */
  int recorded[PD_MAX_DEVICES]; /* fences recorded per device */
  tfence *live[PD_MAX_DEVICES];
  int num_live;
  bool auto_done; /* record fences already completed */
  bool fail_record[PD_MAX_DEVICES];
  int waits; /* fence_wait calls */
  void (*cpu_destroy)(dev_backend *b);
  pd_code (*cpu_run_kernel)(dev_backend *b, dev_kernel_fn fn,
                            dev_kernel_ctx *ctx, dev_status *st);
  int destroyed_with_live; /* live fences when the backend was destroyed */
  /* Fences random_completer fails: device fail_dev[i] after op fail_seq[i]. */
  int num_fail;
  int fail_dev[8];
  uint64_t fail_seq[8];
  int fail_odd_dev; /* >= 0: every fence of this device behind an odd op fails */
} T;

/* The op whose kernel this executor thread ran last: the op a fence it
 * records next follows (an executor records a fence right after issuing). */
static _Thread_local uint64_t tl_last_seq;

static pd_code tf_run_kernel(dev_backend *b, dev_kernel_fn fn,
                             dev_kernel_ctx *ctx, dev_status *st) {
  tl_last_seq = ctx->op_seq;
  return T.cpu_run_kernel(b, fn, ctx, st);
}

static pd_code tf_record(dev_backend *b, int device, void **fence,
                         dev_status *st) {
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
  f->seq = tl_last_seq;
  f->done = T.auto_done;
  if (device == T.fail_odd_dev &&
      f->seq % 2 == 1) { /* fails as soon as recorded */
    f->done = true;
    f->code = PD_UNAVAILABLE;
    snprintf(f->msg, sizeof f->msg, "cpu:%d: op %llu faulted (injected)",
             device, (unsigned long long)f->seq);
  }
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

static pd_code tf_wait(dev_backend *b, int device, void *fence,
                       dev_status *st) {
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
static dev_engine *fenced_engine_limit(int n, uint64_t limit);
static dev_engine *fenced_engine(int n) { return fenced_engine_limit(n, 0); }

/* The same with a per-device memory limit (0: the default). */
static dev_engine *fenced_engine_limit(int n, uint64_t limit) {
  pthread_mutex_lock(&t_mu);
  memset(T.recorded, 0, sizeof T.recorded);
  memset(T.live, 0, sizeof T.live);
  memset(T.fail_record, 0, sizeof T.fail_record);
  T.num_live = 0;
  T.auto_done = false;
  T.waits = 0;
  T.destroyed_with_live = -1;
  T.num_fail = 0;
  T.fail_odd_dev = -1;
  pthread_mutex_unlock(&t_mu);
  dev_cpu_config cc = DEV_CPU_CONFIG_INITIALIZER;
  cc.num_devices = n;
  cc.memory_limit = limit;
  dev_backend *b = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_cpu_backend_create(&cc, &b, &st), PD_OK);
  assert_true(b->struct_size >=
              offsetof(dev_backend, fence_release) + sizeof b->fence_release);
  assert_null(b->fence_record); /* the CPU backend has none of its own */
  b->fence_record = tf_record;
  b->fence_wait = tf_wait;
  b->fence_release = tf_release;
  T.cpu_destroy = b->destroy;
  b->destroy = tf_destroy;
  T.cpu_run_kernel = b->run_kernel;
  b->run_kernel = tf_run_kernel;
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

#define NOTE_INIT                                                              \
  { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, PD_OK }

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

static dev_tensor *exec2(dev_engine *e, const char *op, dev_tensor *x,
                         dev_tensor *y) {
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
  assert_true(dev_engine_busy_seconds(e, 0) > 0 &&
              dev_engine_busy_seconds(e, 1) > 0);
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
    tu_assert_close(got, ((double[]){-121, -484, -1089}), 3, 0,
                    0); /* -(a+b)^2 */
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
  dev_tensor *c1 = exec2(e, "Add", a, b); /* its fence on device 1 fails */
  dev_tensor *c2 =
      exec2(e, "Mul", c1, a); /* consumes c1, issued before the failure shows */
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
  assert_int_equal(dev_tensor_read(c2, &comp0, 0, 0, got, 0, &st),
                   PD_UNAVAILABLE);
  assert_int_equal(dev_tensor_wait(u, &st),
                   PD_OK); /* the error stays on its op */
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

/* An allocation over device 1's limit fails the op as it is issued there;
 * once every device has issued it, device 0's component is freed too (as
 * on a GPU: stream-ordered, by its own executor), while y is still held. */
static void test_issue_failure_frees_peers(void **state) {
  const uint64_t MiB = 1u << 20;
  dev_engine *e = fenced_engine_limit(2, 64 * MiB);
  complete_all();
  dev_shape sh[2] = {{.rank = 1, .dims = {1}},
                     {.rank = 1, .dims = {(int64_t)(56 * MiB / 4)}}};
  dev_tensor *fill;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_create(e, PD_FLOAT32, sh, &fill, &st), PD_OK);
  int64_t dims[1] = {(int64_t)(16 * MiB / 4)};
  dev_attr a[2] = {dev_attr_shape("shape", 1, dims),
                   dev_attr_dtype("dtype", PD_FLOAT32)};
  dev_tensor *y = tu_exec(e, "RandomNormal", NULL, 0, a, 2, 0);
  assert_int_equal(dev_tensor_wait(y, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "cpu:1 is out of memory"));
  dev_tensor *b = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
  dev_tensor *z = exec2(e, "Neg", b, NULL); /* queued behind the release */
  assert_int_equal(dev_tensor_wait(z, &st), PD_OK);
  dev_memory_stats ms;
  assert_int_equal(dev_engine_memory_stats(e, 0, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, 4 + 12 + 12); /* fill, b, z */
  assert_int_equal(y->comps[0].code, PD_RESOURCE_EXHAUSTED);
  dev_tensor_release(z);
  dev_tensor_release(b);
  dev_tensor_release(y);
  dev_tensor_release(fill);
  dev_engine_destroy(e);
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
  assert_string_equal(
      st.msg, "Square on cpu:2: cpu:2: cannot record a fence (injected)");
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

/* --- stress: threads racing the completion path ---------------------------- */

/* Completes the live fences of devices [0, ndev) in a pseudo-random
 * interleaving of the devices (each device's in record order, a few at a
 * time), failing the ones T.fail_* names, until told to stop: so the
 * executors, the completion threads and the test's own threads race freely. */
typedef struct rcompleter {
  pthread_t th;
  int ndev;
  uint32_t seed;
  atomic_bool stop;
} rcompleter;

static bool tf_should_fail(const tfence *f) { /* t_mu held */
  for (int i = 0; i < T.num_fail; i++)
    if (T.fail_dev[i] == f->device && T.fail_seq[i] == f->seq) return true;
  return false;
}

static void *rcompleter_main(void *arg) {
  rcompleter *r = arg;
  uint32_t s = r->seed;
  while (!atomic_load(&r->stop)) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    int d = (int)(s % (uint32_t)r->ndev);
    int burst = 1 + (int)((s >> 8) % 4);
    bool any = false;
    pthread_mutex_lock(&t_mu);
    for (tfence *f = T.live[d]; f && burst > 0; f = f->next) {
      if (f->done) continue;
      f->done = true;
      if (tf_should_fail(f)) {
        f->code = PD_UNAVAILABLE;
        snprintf(f->msg, sizeof f->msg,
                 "cpu:%d: the device failed behind op %llu (injected)", d,
                 (unsigned long long)f->seq);
      }
      burst--;
      any = true;
    }
    if (any) pthread_cond_broadcast(&t_cv);
    pthread_mutex_unlock(&t_mu);
    if (!any || (s >> 12) % 8 == 0) {
      struct timespec ts = {0, 20 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  return NULL;
}

static void rcompleter_start(rcompleter *r, int ndev, uint32_t seed) {
  r->ndev = ndev;
  r->seed = seed;
  atomic_init(&r->stop, false);
  assert_int_equal(pthread_create(&r->th, NULL, rcompleter_main, r), 0);
}

static void rcompleter_stop(rcompleter *r) {
  atomic_store(&r->stop, true);
  pthread_join(r->th, NULL);
}

static const int64_t dims2[1] = {2};

/* Late failures with every interleaving the scheduler gives: one thread
 * submits a DAG of 600 ops over 6 chains (Add of a ones tensor; every fifth op
 * a Maximum with the next chain), now and then waiting for its last output so
 * that later consumers are issued after a failure showed; fences complete in
 * a random interleaving of the devices, six of them with an error (two in a
 * row on device 1, and the very last op); another thread registers a notify
 * on every output as it appears and polls them. Each component must fail
 * exactly when its op's fence, or that of an op upstream on the same device,
 * failed (a simulation in the test says which); every other value is the
 * simulated one (exact: small integers); every notify fires once, with
 * UNAVAILABLE exactly when some component failed. */
#define LF_CHAINS 6
#define LF_OPS 600
#define LF_DEV 3

typedef struct lf_watch {
  atomic_int calls;
  atomic_int code;
} lf_watch;

static struct {
  dev_tensor *out[LF_OPS];
  atomic_int published; /* out[0..published) are set */
  lf_watch w[LF_OPS];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int fired;
} LF = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void lf_note(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  lf_watch *w = arg;
  atomic_store(&w->code, (int)code);
  atomic_fetch_add(&w->calls, 1);
  pthread_mutex_lock(&LF.mu);
  LF.fired++;
  pthread_cond_broadcast(&LF.cv);
  pthread_mutex_unlock(&LF.mu);
}

static void *lf_watcher(void *arg) {
  (void)arg;
  for (int i = 0; i < LF_OPS; i++) {
    while (atomic_load(&LF.published) <= i) sched_yield();
    dev_tensor *t = LF.out[i];
    (void)dev_tensor_is_ready(t);
    dev_status st = DEV_STATUS_INIT;
    if (dev_tensor_notify(t, lf_note, &LF.w[i], &st) != PD_OK)
      abort(); /* not a cmocka thread */
    if (i % 9 == 0)
      (void)dev_tensor_wait_until(t, dev_monotonic_now() + 1e-4, &st);
  }
  return NULL;
}

static void test_stress_late_failures(void **state) {
  dev_engine *e = fenced_engine(LF_DEV);
  /* {device, op index}; op i is the engine's (i+1)-th, so its seq is i + 1. */
  static const int fails[][2] = {{1, 40},  {1, 41},  {2, 45},
                                 {0, 300}, {1, 301}, {2, LF_OPS - 1}};
  const int nfail = (int)(sizeof fails / sizeof fails[0]);
  pthread_mutex_lock(&t_mu);
  T.num_fail = nfail;
  for (int i = 0; i < nfail; i++) {
    T.fail_dev[i] = fails[i][0];
    T.fail_seq[i] = (uint64_t)fails[i][1] + 1;
  }
  pthread_mutex_unlock(&t_mu);
  atomic_store(&LF.published, 0);
  LF.fired = 0;
  for (int i = 0; i < LF_OPS; i++) {
    atomic_store(&LF.w[i].calls, 0);
    atomic_store(&LF.w[i].code, -1);
  }
  rcompleter rc;
  rcompleter_start(&rc, LF_DEV, 0x9e3779b9u);
  pthread_t watcher;
  assert_int_equal(pthread_create(&watcher, NULL, lf_watcher, NULL), 0);

  static double want[LF_OPS][2];
  static bool want_bad[LF_OPS][LF_DEV];
  double val[LF_CHAINS][2];
  bool bad[LF_DEV][LF_CHAINS] = {{0}};
  dev_tensor *x[LF_CHAINS];
  for (int c = 0; c < LF_CHAINS; c++) {
    val[c][0] = c;
    val[c][1] = -c;
    x[c] = tu_mirrored(e, PD_FLOAT32, 1, dims2, val[c]);
  }
  dev_tensor *one = tu_mirrored(e, PD_FLOAT32, 1, dims2, (double[]){1, 1});
  for (int i = 0; i < LF_OPS; i++) {
    int c = i % LF_CHAINS, c2 = (c + 1) % LF_CHAINS;
    bool mix = i % 5 == 0;
    dev_tensor *in[2] = {x[c], mix ? x[c2] : one};
    dev_tensor *y = tu_exec(e, mix ? "Maximum" : "Add", in, 2, NULL, 0, 0);
    assert_int_equal(atomic_load(&y->comps[0].ready_seq), (uint64_t)i + 1);
    for (int d = 0; d < LF_DEV; d++) {
      bool injected = false;
      for (int k = 0; k < nfail; k++)
        injected |= fails[k][0] == d && fails[k][1] == i;
      want_bad[i][d] = bad[d][c] || (mix && bad[d][c2]) || injected;
      bad[d][c] = want_bad[i][d];
    }
    for (int k = 0; k < 2; k++) {
      want[i][k] = mix ? (val[c][k] > val[c2][k] ? val[c][k] : val[c2][k])
                       : val[c][k] + 1;
      val[c][k] = want[i][k];
    }
    dev_tensor_release(x[c]);
    x[c] = y;
    dev_tensor_retain(y); /* LF.out's reference */
    LF.out[i] = y;
    atomic_store(&LF.published, i + 1);
    if (i % 50 ==
        49) { /* later consumers issue after earlier failures showed */
      dev_status st = DEV_STATUS_INIT;
      (void)dev_tensor_wait(y, &st);
    }
  }
  /* The last op done on every device: so is every op (in-order publication). */
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(LF.out[LF_OPS - 1], &st), PD_UNAVAILABLE);
  pthread_join(watcher, NULL);
  pthread_mutex_lock(&LF.mu);
  while (LF.fired < LF_OPS) pthread_cond_wait(&LF.cv, &LF.mu);
  pthread_mutex_unlock(&LF.mu);
  rcompleter_stop(&rc);

  int nbad = 0, nconsumers_bad = 0;
  for (int i = 0; i < LF_OPS; i++) {
    dev_tensor *t = LF.out[i];
    bool any_bad = false;
    for (int d = 0; d < LF_DEV; d++) {
      pd_code code = t->comps[d].code;
      if (want_bad[i][d] != (code != PD_OK))
        fail_msg("op %d on device %d: expected %s, got %s (%s)", i, d,
                 want_bad[i][d] ? "UNAVAILABLE" : "OK", pd_code_name(code),
                 t->comps[d].msg ? t->comps[d].msg : "");
      if (code != PD_OK) {
        assert_int_equal(code, PD_UNAVAILABLE);
        assert_non_null(t->comps[d].msg);
        assert_non_null(strstr(t->comps[d].msg, "(injected)"));
        nbad++;
        any_bad = true;
      }
    }
    assert_int_equal(atomic_load(&LF.w[i].calls), 1);
    assert_int_equal(atomic_load(&LF.w[i].code),
                     any_bad ? PD_UNAVAILABLE : PD_OK);
    if (!any_bad) {
      double got[2];
      for (int d = 0; d < LF_DEV; d++) {
        tu_read(t, d, got, 2);
        tu_assert_close(got, want[i], 2, 0, 0);
      }
    }
  }
  for (int i = 0; i < LF_OPS; i++)
    for (int d = 0; d < LF_DEV; d++) nconsumers_bad += want_bad[i][d];
  assert_int_equal(nbad, nconsumers_bad);
  assert_true(nbad > nfail); /* the failures did propagate to consumers */
  for (int i = 0; i < LF_OPS; i++) dev_tensor_release(LF.out[i]);
  for (int c = 0; c < LF_CHAINS; c++) dev_tensor_release(x[c]);
  dev_tensor_release(one);
  dev_engine_destroy(e);
  assert_int_equal(T.destroyed_with_live, 0);
}

/* A failure the completion thread records while the executor is issuing a
 * consumer of the failed op (the consumer read its input as fine a moment
 * before): pairs of ops, a producer whose fence on device 1 fails the moment
 * it is recorded and a consumer submitted right behind it, 2000 times, so the
 * two threads meet in that window now and then. Every consumer must fail on
 * device 1, and only there. */
static void test_late_failure_meets_issue(void **state) {
  dev_engine *e = fenced_engine(2);
  dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
  pthread_mutex_lock(&t_mu);
  T.fail_odd_dev = 1; /* the producers are the odd seqs: 1, 3, 5, ... */
  pthread_mutex_unlock(&t_mu);
  complete_all();
  enum { PAIRS = 2000 };
  static dev_tensor *prod[PAIRS], *cons[PAIRS];
  for (int i = 0; i < PAIRS; i++) {
    prod[i] = exec2(e, "Add", a, a);
    cons[i] = exec2(e, "Neg", prod[i], NULL);
  }
  for (int i = 0; i < PAIRS; i++) {
    dev_status st = DEV_STATUS_INIT;
    assert_int_equal(atomic_load(&prod[i]->comps[0].ready_seq),
                     (uint64_t)(2 * i + 1));
    assert_int_equal(dev_tensor_wait(cons[i], &st), PD_UNAVAILABLE);
    if (!strstr(st.msg, "faulted (injected)"))
      fail_msg("pair %d: %s", i, st.msg);
    assert_int_equal(prod[i]->comps[1].code, PD_UNAVAILABLE);
    assert_int_equal(cons[i]->comps[1].code, PD_UNAVAILABLE);
    assert_int_equal(prod[i]->comps[0].code, PD_OK);
    assert_int_equal(cons[i]->comps[0].code, PD_OK);
  }
  double got[3];
  dev_layout comp0 = {DEV_LAYOUT_COMPONENT, 0, 0};
  dev_status st = DEV_STATUS_INIT;
  float f[3];
  /* Device 0's values are right ((a + a) negated); dev_tensor_read refuses a
   * tensor with a failed component, so read the buffer. */
  memcpy(f, cons[PAIRS - 1]->comps[0].buf->data, sizeof f);
  for (int k = 0; k < 3; k++) got[k] = f[k];
  tu_assert_close(got, ((double[]){-2, -4, -6}), 3, 0, 0);
  assert_int_equal(dev_tensor_read(cons[0], &comp0, 0, 0, f, sizeof f, &st),
                   PD_UNAVAILABLE);
  for (int i = 0; i < PAIRS; i++) {
    dev_tensor_release(prod[i]);
    dev_tensor_release(cons[i]);
  }
  dev_tensor_release(a);
  dev_engine_destroy(e);
  assert_int_equal(T.destroyed_with_live, 0);
}

/* Notifies registered while the device publishes that very op, with no op
 * after it to publish again: each round a fresh engine runs one op, the
 * test registers 16 notifies on its output at once (one of them likely
 * straddles the publication) and destroys the engine; each callback must
 * have fired exactly once (a registration the publisher missed would never
 * fire). On the fenced and on the plain CPU backend. */
static void test_notify_races_publication(void **state) {
  for (int r = 0; r < 400; r++) {
    bool fenced = r % 2;
    dev_engine *e = fenced ? fenced_engine(2) : tu_engine(2, 0);
    if (fenced) complete_all();
    dev_tensor *a = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 2, 3});
    dev_tensor *c = exec2(e, "Neg", a, NULL);
    note n[16];
    dev_status st = DEV_STATUS_INIT;
    for (int k = 0; k < 16; k++) {
      n[k] = (note)NOTE_INIT;
      assert_int_equal(dev_tensor_notify(c, note_fn, &n[k], &st), PD_OK);
    }
    dev_tensor_release(c);
    dev_tensor_release(a);
    dev_engine_destroy(e);
    for (int k = 0; k < 16; k++) {
      if (n[k].calls != 1)
        fail_msg("round %d (%s), notify %d: %d calls", r,
                 fenced ? "fenced" : "cpu", k, n[k].calls);
      assert_int_equal(n[k].code, PD_OK);
    }
  }
}

/* Several threads submit chains to one engine at once, register a notify on
 * every output and drop their references as they go; the engine is destroyed
 * while their ops are still in flight. Every notify fires exactly once, and
 * the last one of each chain sees its value: x + 300 (exact). On the fenced
 * backend (fences completed in a random interleaving) and, for comparison,
 * the plain CPU backend. */
#define ST_THREADS 3
#define ST_OPS 300
#define ST_DEV 3

typedef struct st_thread {
  dev_engine *e;
  int id;
  pthread_t th;
  atomic_int calls; /* notifies fired for this thread's outputs */
  atomic_int failed;
  atomic_int last_calls;
  double last[ST_DEV][2];            /* written by the last notify */
  char err[DEV_STATUS_MSG_MAX + 32]; /* the submitter's error, when failed */
} st_thread;

static void st_note(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  st_thread *th = arg;
  if (code != PD_OK) atomic_store(&th->failed, 1);
  atomic_fetch_add(&th->calls, 1);
}

static void st_note_last(void *arg, dev_tensor *t, pd_code code) {
  st_thread *th = (st_thread *)((char *)arg - offsetof(st_thread, last_calls));
  if (code != PD_OK) atomic_store(&th->failed, 1);
  for (int d = 0; d < ST_DEV && code == PD_OK; d++) {
    float f[2];
    dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, d};
    dev_status st = DEV_STATUS_INIT;
    if (dev_tensor_read(t, &lay, 0, 0, f, sizeof f, &st) != PD_OK)
      atomic_store(&th->failed, 1);
    th->last[d][0] = f[0];
    th->last[d][1] = f[1];
  }
  atomic_fetch_add(&th->calls, 1);
  atomic_fetch_add(&th->last_calls, 1);
}

static void *st_submitter(void *arg) {
  st_thread *th = arg;
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *x = NULL, *one = NULL;
  dev_shape s;
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  float v0[2] = {(float)th->id, (float)(10 * th->id)}, v1[2] = {1, 1};
  if (dev_shape_make(1, dims2, &s, &st) != PD_OK ||
      dev_tensor_from_host(th->e, PD_FLOAT32, &mir, &s, v0, &x, &st) != PD_OK ||
      dev_tensor_from_host(th->e, PD_FLOAT32, &mir, &s, v1, &one, &st) != PD_OK)
    goto fail;
  for (int i = 0; i < ST_OPS; i++) {
    dev_tensor *in[2] = {x, one}, *out[1] = {NULL};
    int n_out = 1;
    if (dev_execute(th->e, "Add", in, 2, NULL, 0, out, &n_out, &st) != PD_OK)
      goto fail;
    dev_tensor_release(x);
    x = out[0];
    bool last = i == ST_OPS - 1;
    if (dev_tensor_notify(x, last ? st_note_last : st_note,
                          last ? (void *)&th->last_calls : (void *)th,
                          &st) != PD_OK)
      goto fail;
    if (i % 37 == 0)
      (void)dev_tensor_wait_until(x, dev_monotonic_now() + 1e-4, &st);
  }
  dev_tensor_release(x);
  dev_tensor_release(one);
  return NULL;
fail:
  snprintf(th->err, sizeof th->err, "%s: %s", pd_code_name(st.code), st.msg);
  atomic_store(&th->failed, 1);
  dev_tensor_release(x);
  dev_tensor_release(one);
  return NULL;
}

static void stress_threads(bool fenced) {
  dev_engine *e = fenced ? fenced_engine(ST_DEV) : tu_engine(ST_DEV, 0);
  rcompleter rc;
  if (fenced) rcompleter_start(&rc, ST_DEV, 12345u);
  static st_thread th[ST_THREADS];
  for (int t = 0; t < ST_THREADS; t++) {
    memset(&th[t], 0, sizeof th[t]);
    th[t].e = e;
    th[t].id = t + 1;
    assert_int_equal(pthread_create(&th[t].th, NULL, st_submitter, &th[t]), 0);
  }
  for (int t = 0; t < ST_THREADS; t++) pthread_join(th[t].th, NULL);
  dev_engine_destroy(e); /* with ops in flight: runs and publishes them all */
  if (fenced) {
    rcompleter_stop(&rc);
    assert_int_equal(T.destroyed_with_live, 0);
  }
  for (int t = 0; t < ST_THREADS; t++) {
    if (atomic_load(&th[t].failed))
      fail_msg("thread %d failed: %s", t, th[t].err);
    assert_int_equal(atomic_load(&th[t].calls), ST_OPS);
    assert_int_equal(atomic_load(&th[t].last_calls), 1);
    double want[2] = {th[t].id + ST_OPS, 10 * th[t].id + ST_OPS};
    for (int d = 0; d < ST_DEV; d++)
      tu_assert_close(th[t].last[d], want, 2, 0, 0);
  }
}

static void test_stress_threads_fenced(void **state) { stress_threads(true); }
static void test_stress_threads_cpu(void **state) { stress_threads(false); }

/* The fence ring grows while it holds ops and wraps: 200 ops issued with no
 * fence complete, 150 of them completed (the ring's head moves to 150), then
 * 400 more (the ring, 256 entries at first, must double with its 50 live
 * entries starting at 150). Every op completes, in order: x + 600. */
static void test_fence_ring_growth(void **state) {
  dev_engine *e = fenced_engine(2);
  dev_tensor *one = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){1, 1, 1});
  dev_tensor *x = tu_mirrored(e, PD_FLOAT32, 1, dims3, (double[]){0, 1, 2});
  note n = NOTE_INIT;
  dev_tensor *mark = NULL;
  for (int i = 0; i < 600; i++) {
    dev_tensor *y = exec2(e, "Add", x, one);
    dev_tensor_release(x);
    x = y;
    if (i == 149) {
      mark = x;
      dev_tensor_retain(mark);
    }
    if (i == 199) {
      for (int d = 0; d < 2; d++) {
        wait_recorded(d, 200);
        for (int k = 0; k < 150; k++) complete_next(d, PD_OK, NULL);
      }
      dev_status st = DEV_STATUS_INIT;
      assert_int_equal(dev_tensor_wait(mark, &st),
                       PD_OK); /* both heads at 150 */
      assert_false(dev_tensor_is_ready(x));
    }
  }
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_notify(x, note_fn, &n, &st), PD_OK);
  for (int d = 0; d < 2; d++) wait_recorded(d, 600);
  assert_int_equal(note_calls(&n), 0);
  complete_all();
  note_wait(&n);
  assert_int_equal(n.code, PD_OK);
  double got[3];
  for (int d = 0; d < 2; d++) {
    tu_read(x, d, got, 3);
    tu_assert_close(got, ((double[]){600, 601, 602}), 3, 0, 0);
    tu_read(mark, d, got, 3);
    tu_assert_close(got, ((double[]){150, 151, 152}), 3, 0, 0);
  }
  dev_tensor_release(mark);
  dev_tensor_release(x);
  dev_tensor_release(one);
  dev_engine_destroy(e);
  assert_int_equal(T.destroyed_with_live, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ready_waits_for_fence),
      cmocka_unit_test(test_pipelined_notify_after_fence),
      cmocka_unit_test(test_fence_error_fails_that_op),
      cmocka_unit_test(test_issue_failure_frees_peers),
      cmocka_unit_test(test_inputs_freed_at_issue),
      cmocka_unit_test(test_fence_record_failure),
      cmocka_unit_test(test_destroy_with_pending_fences),
      cmocka_unit_test(test_stress_late_failures),
      cmocka_unit_test(test_late_failure_meets_issue),
      cmocka_unit_test(test_notify_races_publication),
      cmocka_unit_test(test_stress_threads_fenced),
      cmocka_unit_test(test_stress_threads_cpu),
      cmocka_unit_test(test_fence_ring_growth),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
