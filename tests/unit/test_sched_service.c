/* The scheduler pieces paradevd's service relies on, on a real CPU engine of
 * two devices without gRPC: waits that never block (sched_tensor_notify),
 * fences and kills (memory is back when the fence passes), quotas that do
 * not charge an aliasing output, default and maximum quotas,
 * reconfiguration, the counters behind /metrics, and the progress watch
 * behind the systemd watchdog. The dispatcher is held (sched_pause) where a
 * test needs ops to stay queued, so nothing here depends on timing.
 * Expected values are worked out by hand in each test. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "scheduler.h"
#include "testutil.h"

#define INC 0x0102030405060708ULL
#define NDEV 2

static dev_engine *g_engine;

static sched *new_sched_cfg(sched_config *cfg) {
  cfg->incarnation = INC;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, cfg, &s, &st), PD_OK);
  return s;
}

static sched *new_sched(void) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  return new_sched_cfg(&cfg);
}

static sched_session *open_new(sched *s, const char *name, const char *job,
                               uint64_t quota, sched_session_info *info) {
  sched_session_params p = {name, job, 0, quota, NULL, 0, 0, 0, NULL, NULL};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_create(s, &p, info, &st), PD_OK);
  sched_session *ss = NULL;
  assert_int_equal(
      sched_session_open(s, info->token, SCHED_TOKEN_BYTES, &ss, &st), PD_OK);
  return ss;
}

/* Uploads a mirrored float32 vector of n values under `id`. */
static pd_code upload(sched_session *ss, uint64_t id, int n, dev_status *st) {
  float v[256];
  assert_true(n <= 256);
  for (int i = 0; i < n; i++) v[i] = (float)i;
  dev_shape shape = {1, {n}};
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  sched_upload *u = NULL;
  pd_code c =
      sched_upload_begin(ss, id, PD_FLOAT32, &lay, &shape, NULL, &u, st);
  if (c != PD_OK) return c;
  assert_int_equal(sched_upload_write(u, 0, 0, v, (size_t)n * 4, st), PD_OK);
  return sched_upload_commit(u, st);
}

static pd_code exec1(sched_session *ss, const char *op, const uint64_t *in,
                     int nin, const dev_attr *attrs, int nattrs, uint64_t out,
                     uint64_t tag, dev_status *st) {
  sched_op o = {op, in, nin, attrs, nattrs, &out, 1, 0, 0, NULL};
  sched_op_result r;
  int failed = 0;
  return sched_execute(ss, &o, 1, tag, &r, &failed, st);
}

static pd_code fill(sched_session *ss, uint64_t out, int n, uint64_t tag,
                    dev_status *st) {
  int64_t dims[1] = {n};
  dev_attr a[3] = {dev_attr_shape("shape", 1, dims),
                   dev_attr_float("value", 1.5),
                   dev_attr_dtype("dtype", PD_FLOAT32)};
  return exec1(ss, "Fill", NULL, 0, a, 3, out, tag, st);
}

static uint64_t mem_read(void) {
  uint64_t sum = 0;
  for (int d = 0; d < NDEV; d++) {
    dev_memory_stats ms = {.struct_size = sizeof(ms)};
    dev_status st = DEV_STATUS_INIT;
    assert_int_equal(dev_engine_memory_stats(g_engine, d, &ms, &st), PD_OK);
    sum += ms.bytes_in_use;
  }
  return sum;
}

/* Device bytes in use once every op queued so far has run and the value has
 * settled: tests share one engine, and a tensor of an earlier test is freed
 * when its last op runs, or just after, by a ready callback that holds it. */
static uint64_t mem_used(void) {
  dev_status sst = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_sync(g_engine, &sst), PD_OK);
  uint64_t prev = mem_read();
  for (int i = 0; i < 200; i++) {
    usleep(2000);
    uint64_t now = mem_read();
    if (now == prev) break;
    prev = now;
  }
  return prev;
}

/* A callback record: set once, from whatever thread. */
typedef struct flag {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int calls;
  pd_code code;
} flag;

static void flag_init(flag *f) {
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  f->calls = 0;
  f->code = PD_UNKNOWN;
}

static void flag_destroy(flag *f) {
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
}

static void flag_set(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  flag *f = arg;
  pthread_mutex_lock(&f->mu);
  f->calls++;
  f->code = code;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

static int flag_calls(flag *f) {
  pthread_mutex_lock(&f->mu);
  int n = f->calls;
  pthread_mutex_unlock(&f->mu);
  return n;
}

/* Waits (up to 60 s: a hang, not a timing assumption) for the callback. */
static pd_code flag_wait(flag *f) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 60;
  pthread_mutex_lock(&f->mu);
  while (f->calls == 0)
    if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) != 0) break;
  int calls = f->calls;
  pd_code code = f->code;
  pthread_mutex_unlock(&f->mu);
  if (calls != 1) fail_msg("callback called %d times, expected once", calls);
  return code;
}

static void test_quota_aliasing(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  /* 100 float32 mirrored on 2 devices: 800 bytes, the whole quota. */
  sched_session *ss = open_new(s, "q", "", 800, &info);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(upload(ss, 1, 100, &st), PD_OK);
  int handles = 0;
  uint64_t bytes = 0;
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(bytes, 800);
  /* Reshape shares its input's buffer: it costs nothing. */
  const uint64_t in1[1] = {1};
  const int64_t shape[2] = {10, 10};
  dev_attr ra = dev_attr_int_list("shape", shape, 2);
  assert_int_equal(exec1(ss, "Reshape", in1, 1, &ra, 1, 2, 0, &st), PD_OK);
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(handles, 2);
  assert_int_equal(bytes, 800);
  /* Neg allocates 800 new bytes: over the quota. */
  assert_int_equal(exec1(ss, "Neg", in1, 1, NULL, 0, 3, 0, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "quota"));
  /* An Identity chain stays free too. */
  const uint64_t in2[1] = {2};
  assert_int_equal(exec1(ss, "Identity", in2, 1, NULL, 0, 4, 0, &st), PD_OK);
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(bytes, 800);
  /* The charge follows the buffer (issue #17): deleting the handle that
   * made it refunds nothing while Reshape's and Identity's outputs still
   * hold the buffer (before, this refunded 800 bytes that stayed in use,
   * and a loop of Reshape + delete passed any quota), so Neg is still
   * over the quota; the last holder's delete refunds the 800 bytes. */
  assert_int_equal(sched_handle_delete(ss, in1, 1, &st), PD_OK);
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(handles, 2);
  assert_int_equal(bytes, 800);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(exec1(ss, "Neg", in2, 1, NULL, 0, 3, 0, &st),
                   PD_RESOURCE_EXHAUSTED);
  const uint64_t in4[1] = {4};
  assert_int_equal(sched_handle_delete(ss, in4, 1, &st), PD_OK);
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(bytes, 800);
  assert_int_equal(sched_handle_delete(ss, in2, 1, &st), PD_OK);
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(handles, 0);
  assert_int_equal(bytes, 0);
  /* Room for one new tensor again. */
  assert_int_equal(upload(ss, 1, 100, &st), PD_OK);
  assert_int_equal(exec1(ss, "Neg", in1, 1, NULL, 0, 3, 0, &st),
                   PD_RESOURCE_EXHAUSTED);
  sched_session_put(ss);
  sched_destroy(s);
}

static void test_default_and_max_quota(void **state) {
  (void)state;
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.default_memory_quota = 1000;
  cfg.max_memory_quota = 5000;
  sched *s = new_sched_cfg(&cfg);
  dev_status st = DEV_STATUS_INIT;
  sched_session_info info;
  sched_session_params p = {"a", "", 0, 0, NULL, 0, 0, 0, NULL, NULL};
  assert_int_equal(sched_session_create(s, &p, &info, &st), PD_OK);
  assert_int_equal(info.memory_quota, 1000);
  p.memory_quota = 4000;
  assert_int_equal(sched_session_create(s, &p, &info, &st), PD_OK);
  assert_int_equal(info.memory_quota, 4000);
  p.memory_quota = 5001;
  assert_int_equal(sched_session_create(s, &p, &info, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "max_memory_quota = 5000"));
  /* Without a default, the maximum is what a session asking none gets. */
  cfg.default_memory_quota = 0;
  assert_int_equal(sched_reconfigure(s, &cfg, &st), PD_OK);
  p.memory_quota = 0;
  assert_int_equal(sched_session_create(s, &p, &info, &st), PD_OK);
  assert_int_equal(info.memory_quota, 5000);
  /* A default over the maximum is refused, and nothing changes. */
  cfg.default_memory_quota = 6000;
  assert_int_equal(sched_reconfigure(s, &cfg, &st), PD_INVALID_ARGUMENT);
  assert_int_equal(sched_session_create(s, &p, &info, &st), PD_OK);
  assert_int_equal(info.memory_quota, 5000);
  sched_destroy(s);
}

static void test_reconfigure_limits(void **state) {
  (void)state;
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  sched *s = new_sched_cfg(&cfg);
  dev_status st = DEV_STATUS_INIT;
  sched_session_info i1, i2, i3;
  sched_session *a = open_new(s, "a", "", 0, &i1);
  sched_session *b = open_new(s, "b", "", 0, &i2);
  cfg.max_sessions = 2;
  cfg.max_ops_per_request = 1;
  cfg.default_lease_s = 7;
  assert_int_equal(sched_reconfigure(s, &cfg, &st), PD_OK);
  sched_session_params p = {"c", "", 0, 0, NULL, 0, 0, 0, NULL, NULL};
  assert_int_equal(sched_session_create(s, &p, &i3, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "max_sessions = 2"));
  int64_t dims[1] = {1};
  dev_attr fa[3] = {dev_attr_shape("shape", 1, dims),
                    dev_attr_float("value", 1),
                    dev_attr_dtype("dtype", PD_FLOAT32)};
  uint64_t outs[2] = {1, 2};
  sched_op two[2] = {{"Fill", NULL, 0, fa, 3, &outs[0], 1, 0, 0, NULL},
                     {"Fill", NULL, 0, fa, 3, &outs[1], 1, 0, 0, NULL}};
  sched_op_result r[2];
  int failed = 0;
  assert_int_equal(sched_execute(a, two, 2, 0, r, &failed, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "max_ops_per_request = 1"));
  /* Sessions already open keep their lease; new ones get the new default. */
  assert_int_equal(sched_session_lease_s(a), 60);
  uint64_t freed = 0;
  assert_int_equal(
      sched_session_close(s, i2.token, SCHED_TOKEN_BYTES, &freed, &st), PD_OK);
  assert_int_equal(sched_session_create(s, &p, &i3, &st), PD_OK);
  assert_int_equal(i3.lease_s, 7);
  /* An inconsistent config is refused as a whole. */
  cfg.default_lease_s = 100;
  cfg.max_lease_s = 50;
  cfg.max_sessions = 100;
  assert_int_equal(sched_reconfigure(s, &cfg, &st), PD_INVALID_ARGUMENT);
  sched_session_info i4;
  assert_int_equal(sched_session_create(s, &p, &i4, &st),
                   PD_RESOURCE_EXHAUSTED);
  sched_session_put(a);
  sched_session_put(b);
  sched_destroy(s);
}

static void test_notify_waits_for_the_queue(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  sched_session *ss = open_new(s, "n", "", 0, &info);
  dev_status st = DEV_STATUS_INIT;
  sched_pause(s, true);
  assert_int_equal(fill(ss, 1, 8, 1, &st), PD_OK);
  assert_int_equal(fill(ss, 2, 8, 2, &st), PD_OK);
  dev_tensor *t1 = NULL, *t2 = NULL;
  assert_int_equal(sched_handle_get(ss, 1, &t1, &st), PD_OK);
  assert_int_equal(sched_handle_get(ss, 2, &t2, &st), PD_OK);
  flag f1, f2;
  flag_init(&f1);
  flag_init(&f2);
  /* Registered while both ops are queued: no callback yet. */
  assert_int_equal(sched_tensor_notify(ss, t1, flag_set, &f1, &st), PD_OK);
  assert_int_equal(sched_tensor_notify(ss, t2, flag_set, &f2, &st), PD_OK);
  assert_int_equal(flag_calls(&f1), 0);
  /* Dropping the later op (tag 2) reports it at once, CANCELLED; the
   * earlier one is still queued, so its wait goes on. */
  assert_int_equal(sched_cancel(ss, 2), 1);
  assert_int_equal(flag_wait(&f2), PD_CANCELLED);
  assert_int_equal(flag_calls(&f1), 0);
  sched_stats stats = {.struct_size = sizeof(stats)};
  sched_get_stats(s, &stats);
  assert_int_equal(stats.ops_queued, 1);
  assert_int_equal(stats.ops_dropped, 1);
  sched_pause(s, false);
  assert_int_equal(flag_wait(&f1), PD_OK);
  /* A computed tensor: the callback runs at once, on this thread. */
  flag f3;
  flag_init(&f3);
  assert_int_equal(sched_tensor_notify(ss, t1, flag_set, &f3, &st), PD_OK);
  assert_int_equal(flag_calls(&f3), 1);
  assert_int_equal(f3.code, PD_OK);
  dev_tensor_release(t1);
  dev_tensor_release(t2);
  flag_destroy(&f1);
  flag_destroy(&f2);
  flag_destroy(&f3);
  /* A session closed with a registration pending: it fires, CANCELLED. */
  sched_pause(s, true);
  assert_int_equal(fill(ss, 3, 8, 0, &st), PD_OK);
  dev_tensor *t3 = NULL;
  assert_int_equal(sched_handle_get(ss, 3, &t3, &st), PD_OK);
  flag f4;
  flag_init(&f4);
  assert_int_equal(sched_tensor_notify(ss, t3, flag_set, &f4, &st), PD_OK);
  uint64_t freed = 0;
  assert_int_equal(
      sched_session_close(s, info.token, SCHED_TOKEN_BYTES, &freed, &st),
      PD_OK);
  assert_int_equal(flag_wait(&f4), PD_CANCELLED);
  dev_tensor_release(t3);
  flag_destroy(&f4);
  sched_pause(s, false);
  sched_session_put(ss);
  sched_destroy(s);
}

/* A session whose job id is only claimed (no job token, issue #14) is
 * listed with its job, flagged, and never ended by a kill of that job; its
 * identity is kept for listings. */
static void test_kill_skips_claimed_job(void **state) {
  (void)state;
  sched *s = new_sched();
  dev_status st = DEV_STATUS_INIT;
  sched_session_info ia, ic;
  sched_session_params p = {"bound", "job-5", 0, 0,    "tenant-a",
                            0,       0,       0, NULL, NULL};
  sched_session_origin proven = {"uid:1000", false};
  assert_int_equal(sched_session_create_from(s, &p, &proven, &ia, &st), PD_OK);
  sched_session_params q = {"spoof", "job-5", 0, 0, NULL, 0, 0, 0, NULL, NULL};
  sched_session_origin claim = {"uid:1001", true};
  assert_int_equal(sched_session_create_from(s, &q, &claim, &ic, &st), PD_OK);
  sched_session_view *v = NULL;
  assert_int_equal(sched_list_sessions(s, "job-5", &v), 2);
  assert_string_equal(v[0].client, "bound");
  assert_false(v[0].job_claimed);
  assert_string_equal(v[0].identity, "uid:1000");
  assert_string_equal(v[0].tenant, "tenant-a");
  assert_string_equal(v[1].client, "spoof");
  assert_true(v[1].job_claimed);
  assert_string_equal(v[1].job, "job-5");
  free(v);
  sched_kill_target t = {NULL, 0, "job-5", 0};
  sched_kill_result r = {0, 0, 0};
  assert_int_equal(sched_kill(s, &t, &r, &st), PD_OK);
  assert_int_equal(r.sessions, 1);
  assert_int_equal(sched_num_sessions(s), 1);
  assert_int_equal(sched_list_sessions(s, NULL, &v), 1);
  assert_string_equal(v[0].client, "spoof");
  free(v);
  /* The claim is still ended by its number. */
  sched_kill_target by_seq = {NULL, 0, NULL, ic.seq};
  assert_int_equal(sched_kill(s, &by_seq, &r, &st), PD_OK);
  assert_int_equal(r.sessions, 1);
  /* An identity over the limit is refused, naming it. */
  char big[SCHED_IDENTITY_MAX + 2];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  sched_session_origin huge = {big, false};
  assert_int_equal(sched_session_create_from(s, &p, &huge, &ia, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "identity is 513 bytes"));
  sched_destroy(s);
}

static void test_kill_and_fence(void **state) {
  (void)state;
  sched *s = new_sched();
  uint64_t base = mem_used();
  dev_status st = DEV_STATUS_INIT;
  sched_session_info ia, ib, ic;
  sched_session *a = open_new(s, "a", "job-7", 0, &ia);
  sched_session *b = open_new(s, "b", "job-7", 0, &ib);
  sched_session *c = open_new(s, "c", "job-8", 0, &ic);
  assert_int_equal(upload(a, 1, 100, &st), PD_OK); /* 800 bytes */
  assert_int_equal(fill(a, 2, 50, 0, &st), PD_OK); /* 400 */
  assert_int_equal(upload(b, 1, 25, &st), PD_OK);  /* 200 */
  assert_int_equal(upload(c, 1, 10, &st), PD_OK);  /* 80 */
  sched_session_view *v = NULL;
  int n = sched_list_sessions(s, "job-7", &v);
  assert_int_equal(n, 2);
  assert_string_equal(v[0].client, "a"); /* oldest first */
  assert_string_equal(v[1].client, "b");
  assert_int_equal(v[0].bytes, 1200);
  assert_int_equal(v[0].handles, 2);
  assert_int_equal(v[1].bytes, 200);
  assert_string_equal(v[0].job, "job-7");
  assert_true(v[0].age_s >= v[1].age_s && v[1].age_s >= 0);
  free(v);

  sched_kill_target t = {NULL, 0, "job-7", 0};
  sched_kill_result r = {0, 0, 0};
  assert_int_equal(sched_kill(s, &t, &r, &st), PD_OK);
  assert_int_equal(r.sessions, 2);
  assert_int_equal(r.handles, 3);
  assert_int_equal(r.bytes, 1400);
  flag f;
  flag_init(&f);
  assert_int_equal(sched_fence(s, flag_set, &f, &st), PD_OK);
  assert_int_equal(flag_wait(&f), PD_OK);
  flag_destroy(&f);
  /* The calls' references (a, b) still pin their sessions' structs, not
   * their tensors: the memory is back. */
  assert_int_equal(mem_used(), base + 80);
  dev_tensor *x = NULL;
  assert_int_equal(sched_handle_get(a, 1, &x, &st), PD_NOT_FOUND);
  assert_int_equal(sched_num_sessions(s), 1);

  /* Kill by number and by token; mistakes. */
  sched_kill_target none = {NULL, 0, "job-9", 0};
  assert_int_equal(sched_kill(s, &none, &r, &st), PD_OK);
  assert_int_equal(r.sessions, 0);
  sched_kill_target empty = {NULL, 0, "", 0};
  assert_int_equal(sched_kill(s, &empty, &r, &st), PD_INVALID_ARGUMENT);
  sched_kill_target two = {ic.token, SCHED_TOKEN_BYTES, "job-8", 0};
  assert_int_equal(sched_kill(s, &two, &r, &st), PD_INVALID_ARGUMENT);
  sched_kill_target nobody = {NULL, 0, NULL, 0};
  assert_int_equal(sched_kill(s, &nobody, &r, &st), PD_INVALID_ARGUMENT);
  sched_kill_target bad_seq = {NULL, 0, NULL, 999};
  assert_int_equal(sched_kill(s, &bad_seq, &r, &st), PD_NOT_FOUND);
  sched_kill_target by_tok = {ic.token, 5, NULL, 0};
  assert_int_equal(sched_kill(s, &by_tok, &r, &st), PD_UNAUTHENTICATED);
  sched_kill_target by_seq = {NULL, 0, NULL, ic.seq};
  assert_int_equal(sched_kill(s, &by_seq, &r, &st), PD_OK);
  assert_int_equal(r.sessions, 1);
  assert_int_equal(r.bytes, 80);
  flag_init(&f);
  assert_int_equal(sched_fence(s, flag_set, &f, &st), PD_OK);
  assert_int_equal(flag_wait(&f), PD_OK);
  flag_destroy(&f);
  assert_int_equal(mem_used(), base);

  sched_session_info id;
  sched_session *d = open_new(s, "d", "", 0, &id);
  sched_kill_target tok = {id.token, SCHED_TOKEN_BYTES, NULL, 0};
  assert_int_equal(sched_kill(s, &tok, &r, &st), PD_OK);
  assert_int_equal(r.sessions, 1);
  sched_stats stats = {.struct_size = sizeof(stats)};
  sched_get_stats(s, &stats);
  assert_int_equal(stats.sessions_killed, 4);
  assert_int_equal(stats.sessions_created, 4);
  assert_int_equal(stats.sessions, 0);
  sched_session_put(a);
  sched_session_put(b);
  sched_session_put(c);
  sched_session_put(d);
  sched_destroy(s);
}

static int op_index(const char *name) {
  for (int i = 0; i < dev_op_count(); i++)
    if (strcmp(dev_op_def_name(dev_op_at(i)), name) == 0) return i;
  fail_msg("no op %s", name);
  return -1;
}

static void test_counters_and_progress(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  sched_session *ss = open_new(s, "c", "", 0, &info);
  dev_status st = DEV_STATUS_INIT;
  sched_progress p;
  memset(&p, 0, sizeof(p));
  assert_false(sched_check_progress(s, &p, 0.0, 5.0)); /* idle */
  assert_false(sched_check_progress(s, &p, 100.0, 5.0));
  sched_pause(s, true);
  for (uint64_t i = 1; i <= 3; i++)
    assert_int_equal(fill(ss, i, 4, 0, &st), PD_OK);
  sched_stats a = {.struct_size = sizeof(a)};
  sched_get_stats(s, &a);
  assert_int_equal(a.ops_queued, 3);
  assert_int_equal(a.ops_in_flight, 0);
  /* Work outstanding and nothing completes: stalled only once the wait
   * is longer than the limit. */
  assert_false(sched_check_progress(s, &p, 200.0, 5.0));
  assert_false(sched_check_progress(s, &p, 204.0, 5.0));
  assert_true(sched_check_progress(s, &p, 206.0, 5.0));
  sched_pause(s, false);
  dev_status err = DEV_STATUS_INIT;
  uint64_t failed_id = 0;
  assert_int_equal(sched_sync(ss, NULL, 0, &err, &failed_id, &st), PD_OK);
  /* Sync saw the outputs computed; the counting callback may still be
   * finishing on the executor that ran them last. A fence runs behind it on
   * every executor, so once it passed the counts are complete. */
  flag f;
  flag_init(&f);
  assert_int_equal(sched_fence(s, flag_set, &f, &st), PD_OK);
  assert_int_equal(flag_wait(&f), PD_OK);
  flag_destroy(&f);
  sched_get_stats(s, &a);
  assert_int_equal(a.ops_submitted, 3);
  assert_int_equal(a.ops_completed, 3);
  assert_int_equal(a.ops_in_flight, 0);
  assert_int_equal(a.latency_buckets[SCHED_LATENCY_BUCKETS], 3);
  for (int b = 1; b <= SCHED_LATENCY_BUCKETS; b++)
    assert_true(a.latency_buckets[b] >= a.latency_buckets[b - 1]);
  assert_false(sched_check_progress(s, &p, 207.0, 5.0)); /* done: progress */
  assert_false(sched_check_progress(s, &p, 500.0, 5.0)); /* idle */
  uint64_t by[SCHED_NUM_CODES];
  double secs = -1;
  sched_op_stats(s, op_index("Fill"), by, &secs);
  assert_int_equal(by[PD_OK], 3);
  assert_true(secs >= 0);
  /* An op that fails on the devices counts under its code (one rejected at
   * validation never ran, and is not counted). 2^40 floats is 4 TiB: shape
   * inference accepts it, and the allocation certainly fails on devices
   * limited to 64 MiB each (setup). */
  const uint64_t in[1] = {1};
  int64_t huge[1] = {(int64_t)1 << 40};
  dev_attr fa[3] = {dev_attr_shape("shape", 1, huge),
                    dev_attr_float("value", 0),
                    dev_attr_dtype("dtype", PD_FLOAT32)};
  assert_int_equal(exec1(ss, "Fill", NULL, 0, fa, 3, 9, 0, &st), PD_OK);
  dev_tensor *t = NULL;
  assert_int_equal(sched_handle_get(ss, 9, &t, &st), PD_OK);
  assert_int_equal(sched_tensor_wait(ss, t, &st), PD_RESOURCE_EXHAUSTED);
  dev_tensor_release(t);
  flag_init(&f);
  assert_int_equal(sched_fence(s, flag_set, &f, &st), PD_OK);
  assert_int_equal(flag_wait(&f), PD_OK);
  flag_destroy(&f);
  sched_op_stats(s, op_index("Fill"), by, NULL);
  assert_int_equal(by[PD_RESOURCE_EXHAUSTED], 1);
  assert_int_equal(by[PD_OK], 3);
  assert_int_equal(exec1(ss, "Neg", in, 1, NULL, 0, 10, 0, &st), PD_OK);
  /* Dropped ops count as CANCELLED. */
  sched_pause(s, true);
  assert_int_equal(exec1(ss, "Neg", in, 1, NULL, 0, 11, 5, &st), PD_OK);
  assert_int_equal(sched_cancel(ss, 5), 1);
  sched_pause(s, false);
  sched_op_stats(s, op_index("Neg"), by, NULL);
  assert_int_equal(by[PD_CANCELLED], 1);
  sched_session_put(ss);
  sched_destroy(s);
}

static int setup(void **state) {
  (void)state;
  g_engine = tu_engine(NDEV, 64 << 20);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  dev_engine_destroy(g_engine);
  return 0;
}

/* Ops on the devices are not the scheduler's stall however long they take
 * (the engine's watch says whether the devices progress); ops queued with
 * none on the devices are, once nothing was dispatched for the limit. */
static void test_progress_leaves_running_ops_to_the_engine(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  sched_session *ss = open_new(s, "c", "", 0, &info);
  dev_status st = DEV_STATUS_INIT;
  sched_progress p;
  memset(&p, 0, sizeof(p));
  dev_engine_test_hold(g_engine, 0, true);
  assert_int_equal(fill(ss, 1, 4, 0, &st), PD_OK);
  sched_stats a = {.struct_size = sizeof(a)};
  for (;;) { /* the dispatcher submits it */
    sched_get_stats(s, &a);
    if (a.ops_in_flight == 1 && a.ops_queued == 0) break;
    sched_yield();
  }
  assert_false(sched_check_progress(s, &p, 0.0, 5.0));
  assert_false(sched_check_progress(s, &p, 100.0, 5.0));
  dev_engine_test_hold(g_engine, 0, false);
  dev_status err = DEV_STATUS_INIT;
  uint64_t failed_id = 0;
  assert_int_equal(sched_sync(ss, NULL, 0, &err, &failed_id, &st), PD_OK);
  assert_false(sched_check_progress(s, &p, 200.0, 5.0));
  sched_session_put(ss);
  sched_destroy(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quota_aliasing),
      cmocka_unit_test(test_default_and_max_quota),
      cmocka_unit_test(test_reconfigure_limits),
      cmocka_unit_test(test_notify_waits_for_the_queue),
      cmocka_unit_test(test_kill_and_fence),
      cmocka_unit_test(test_kill_skips_claimed_job),
      cmocka_unit_test(test_counters_and_progress),
      cmocka_unit_test(test_progress_leaves_running_ops_to_the_engine),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
