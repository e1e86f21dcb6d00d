/* Placement in the scheduler (issue #17): a session's allowed device set
 * (narrowed at creation, never past its job's allocation), placements
 * outside it refused before the engine, memory counted per device, and the
 * dispatcher's per-device bound and pick (a session whose devices are full
 * is passed over). Over a CPU engine of 4 devices, with the cost hook of
 * sched_int.h where the dispatch order matters (every op's estimate fixed
 * by the test, so orders never depend on timing) and the executors held
 * where in-flight ops must stay in flight (dev__exec_hold).
 *
 * Tests that place tensors on a subset of the mesh need the engine's
 * placement: until it is there the engine answers UNIMPLEMENTED for
 * subsets, and those tests skip (they say so) instead of failing. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device_int.h"
#include "sched_int.h"
#include "sched_testutil.h"
#include "testutil.h"

#define NDEV 4
#define SLICE ((double)SCHED_FAIR_SLICE_NS)

static dev_engine *g_engine;
static char g_dir[256];
static stg_roots *g_roots;

static void assert_contains(const char *msg, const char *needle) {
  if (!strstr(msg, needle))
    fail_msg("\"%s\" does not contain \"%s\"", msg, needle);
}

static dev_devset set_of(int n, const int *d) {
  dev_devset s = {0};
  s.n = n;
  for (int i = 0; i < n; i++) s.dev[i] = (uint8_t)d[i];
  return s;
}

#define SET(...)                                                               \
  set_of((int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)),                    \
         (int[]){__VA_ARGS__})

/* A code the engine gives for a subset until its placement is built: the
 * test skips, naming what it waits for. */
static void skip_unless_placed(pd_code c, const dev_status *st) {
  if (c == PD_UNIMPLEMENTED) {
    print_message("skipped (waits on the engine's placement): %s\n", st->msg);
    skip();
  }
}

/* --- a scheduler with the test hooks --------------------------------------- */

#define LOG_MAX 4096

/* The order ops went to the engine (the submitted hook). */
typedef struct sub_log {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n;
  uint64_t session[LOG_MAX];
  uint64_t cost[LOG_MAX];
} sub_log;

static sub_log g_log = {.mu = PTHREAD_MUTEX_INITIALIZER,
                        .cv = PTHREAD_COND_INITIALIZER};

/* An op's cost: 1 us per element of its output 0's component 0. */
static uint64_t cost_hook(void *arg, const dev_op *op) {
  (void)arg;
  const dev_shape *s = dev_tensor_shape(dev_op_output(op, 0));
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) n *= s->dims[i];
  return (uint64_t)n * 1000u;
}

static void submitted_hook(void *arg, sched_session *ss, const dev_op *op,
                           uint64_t est_ns) {
  (void)op;
  sub_log *l = arg;
  pthread_mutex_lock(&l->mu);
  if (l->n < LOG_MAX) {
    l->session[l->n] = sched_session_seq(ss);
    l->cost[l->n] = est_ns;
    l->n++;
  }
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

static int logged(void) {
  pthread_mutex_lock(&g_log.mu);
  int n = g_log.n;
  pthread_mutex_unlock(&g_log.mu);
  return n;
}

/* Waits until `n` ops were submitted (fails after 60 s: a hang, not a
 * timing threshold). */
static void wait_logged(int n) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 60;
  pthread_mutex_lock(&g_log.mu);
  while (g_log.n < n)
    if (pthread_cond_timedwait(&g_log.cv, &g_log.mu, &ts) != 0) break;
  int got = g_log.n;
  pthread_mutex_unlock(&g_log.mu);
  if (got < n) fail_msg("%d ops submitted, expected %d", got, n);
}

static sched *new_sched(uint64_t ahead_ns) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = 17;
  cfg.max_handles_per_session = 10000;
  cfg.dispatch_ahead_ns = ahead_ns;
  cfg.storage_roots = g_roots;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  pthread_mutex_lock(&g_log.mu);
  g_log.n = 0;
  pthread_mutex_unlock(&g_log.mu);
  sched_test_hooks h = {cost_hook, submitted_hook, &g_log};
  sched_set_test_hooks(s, &h);
  return s;
}

static pd_code create(sched *s, const dev_devset *devices,
                      const dev_devset *bound, sched_session **out,
                      sched_session_info *info, dev_status *st) {
  sched_session_params p = {"place", "job", 0, 0,       NULL,
                            0,       1,     0, devices, bound};
  PD_TRY(sched_session_create(s, &p, info, st));
  return sched_session_open(s, info->token, SCHED_TOKEN_BYTES, out, st);
}

static sched_session *open_on(sched *s, const dev_devset *devices) {
  sched_session_info info;
  sched_session *ss = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(create(s, devices, NULL, &ss, &info, &st), PD_OK);
  return ss;
}

/* Queues `count` ops Neg(in) -> first_id, first_id + 1, ... in one
 * request. */
static pd_code queue_neg(sched_session *ss, uint64_t in, uint64_t first_id,
                         int count, dev_status *st) {
  const uint64_t ins[1] = {in};
  sched_op *ops = calloc((size_t)count, sizeof *ops);
  uint64_t *ids = calloc((size_t)count, sizeof *ids);
  sched_op_result *res = calloc((size_t)count, sizeof *res);
  for (int i = 0; i < count; i++) {
    ids[i] = first_id + (uint64_t)i;
    ops[i] = (sched_op){.op_name = "Neg",
                        .inputs = ins,
                        .num_inputs = 1,
                        .output_ids = &ids[i],
                        .num_outputs = 1};
  }
  int failed = 0;
  pd_code c = sched_execute(ss, ops, count, 0, res, &failed, st);
  free(ops);
  free(ids);
  free(res);
  return c;
}

static void sync_all(sched_session *ss) {
  dev_status st = DEV_STATUS_INIT, terr = DEV_STATUS_INIT;
  uint64_t failed = 0;
  assert_int_equal(sched_sync(ss, NULL, 0, &terr, &failed, &st), PD_OK);
  assert_int_equal(terr.code, PD_OK);
}

/* The listing's entry of `ss`. */
static sched_session_view view_of(sched *s, sched_session *ss) {
  sched_session_view *v = NULL;
  int n = sched_list_sessions(s, NULL, &v);
  assert_true(n >= 0);
  sched_session_view out = {0};
  bool found = false;
  for (int i = 0; i < n; i++)
    if (v[i].seq == sched_session_seq(ss)) {
      out = v[i];
      found = true;
    }
  free(v);
  assert_true(found);
  return out;
}

static void expect_bytes(sched *s, sched_session *ss, const uint64_t *want) {
  sched_session_view v = view_of(s, ss);
  uint64_t total = 0;
  for (int d = 0; d < NDEV; d++) {
    if (v.device_bytes[d] != want[d])
      fail_msg("session %llu device %d: %llu bytes, expected %llu",
               (unsigned long long)v.seq, d,
               (unsigned long long)v.device_bytes[d],
               (unsigned long long)want[d]);
    total += want[d];
  }
  assert_int_equal(v.bytes, total);
}

/* --- the allowed set ------------------------------------------------------- */

static void test_allowed_set(void **state) {
  (void)state;
  sched *s = new_sched(0);
  sched_session_info info;
  sched_session *ss = NULL;
  dev_status st = DEV_STATUS_INIT;
  char buf[DEV_DEVSET_STR_MAX];
  /* Default: the whole mesh. */
  assert_int_equal(create(s, NULL, NULL, &ss, &info, &st), PD_OK);
  assert_string_equal(dev_devset_str(&info.devices, buf, sizeof buf),
                      "[0, 1, 2, 3]");
  assert_true(dev_devset_is_all(g_engine, sched_session_devices(ss)));
  sched_session_put(ss);
  /* Narrowed: a copy, in the order asked. */
  dev_devset want = SET(3, 1);
  assert_int_equal(create(s, &want, NULL, &ss, &info, &st), PD_OK);
  want.dev[0] = 0; /* the session kept its own copy */
  assert_string_equal(dev_devset_str(&info.devices, buf, sizeof buf), "[3, 1]");
  assert_string_equal(
      dev_devset_str(sched_session_devices(ss), buf, sizeof buf), "[3, 1]");
  sched_session_view v = view_of(s, ss);
  assert_string_equal(dev_devset_str(&v.devices, buf, sizeof buf), "[3, 1]");
  sched_session_put(ss);
  /* Bound: all of it by default; within it when narrowed. */
  dev_devset bound = SET(0, 1), two = SET(1), out = SET(1, 2, 3);
  assert_int_equal(create(s, NULL, &bound, &ss, &info, &st), PD_OK);
  assert_string_equal(dev_devset_str(&info.devices, buf, sizeof buf), "[0, 1]");
  sched_session_put(ss);
  assert_int_equal(create(s, &two, &bound, &ss, &info, &st), PD_OK);
  assert_string_equal(dev_devset_str(&info.devices, buf, sizeof buf), "[1]");
  sched_session_put(ss);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(create(s, &out, &bound, &ss, &info, &st),
                   PD_PERMISSION_DENIED);
  assert_string_equal(st.msg,
                      "devices [2, 3] are outside the job's allocation [0, 1]");
  dev_devset one_out = SET(0, 2);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(create(s, &one_out, &bound, &ss, &info, &st),
                   PD_PERMISSION_DENIED);
  assert_string_equal(st.msg,
                      "device [2] is outside the job's allocation [0, 1]");
  /* Malformed sets: the engine's words (index, mesh size). */
  dev_devset dup = SET(1, 1), far = SET(0, 7), empty = {0};
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(create(s, &dup, NULL, &ss, &info, &st), PD_INVALID_ARGUMENT);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(create(s, &far, NULL, &ss, &info, &st), PD_INVALID_ARGUMENT);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(create(s, &empty, NULL, &ss, &info, &st),
                   PD_INVALID_ARGUMENT);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(create(s, NULL, &far, &ss, &info, &st), PD_INVALID_ARGUMENT);
  sched_destroy(s);
}

/* --- placements refused ---------------------------------------------------- */

/* A .npy float32 [4] file `name` in the storage root. */
static void write_npy4(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  const char dict[] =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }";
  size_t dl = sizeof dict - 1, hl = dl + 1;
  while ((10 + hl) % 64) hl++;
  unsigned char hdr[128];
  memcpy(hdr, "\x93NUMPY\x01\x00", 8);
  hdr[8] = (unsigned char)hl;
  hdr[9] = 0;
  memset(hdr + 10, ' ', hl);
  memcpy(hdr + 10, dict, dl);
  hdr[10 + hl - 1] = '\n';
  const float v[4] = {1, 2, 3, 4};
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(hdr, 1, 10 + hl, f), 10 + hl);
  assert_int_equal(fwrite(v, 1, sizeof v, f), sizeof v);
  assert_int_equal(fclose(f), 0);
}

static void test_placements_refused(void **state) {
  (void)state;
  sched *s = new_sched(0);
  dev_devset half = SET(0, 1), far = SET(1, 2, 3), bad = SET(2, 2);
  sched_session *ss = open_on(s, &half);
  dev_status st = DEV_STATUS_INIT;
  /* Uploads. */
  assert_int_equal(tu_sched_upload_on(ss, 1, &far, DEV_LAYOUT_MIRRORED, 4, &st),
                   PD_PERMISSION_DENIED);
  assert_string_equal(
      st.msg,
      "devices [2, 3] are outside the session's allowed devices [0, 1]");
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(tu_sched_upload_on(ss, 1, &bad, DEV_LAYOUT_MIRRORED, 4, &st),
                   PD_INVALID_ARGUMENT);
  /* An op without inputs placed outside. */
  const int64_t dims[1] = {4};
  const dev_attr attrs[3] = {dev_attr_shape("shape", 1, dims),
                             dev_attr_float("value", 1),
                             dev_attr_dtype("dtype", PD_FLOAT32)};
  uint64_t out_id = 5;
  sched_op op = {.op_name = "Fill",
                 .attrs = attrs,
                 .num_attrs = 3,
                 .output_ids = &out_id,
                 .num_outputs = 1,
                 .devices = &far};
  sched_op_result res;
  int failed = -1;
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(sched_execute(ss, &op, 1, 0, &res, &failed, &st),
                   PD_PERMISSION_DENIED);
  assert_int_equal(failed, 0);
  assert_string_equal(st.msg,
                      "op 0 (Fill): devices [2, 3] are outside the session's "
                      "allowed devices [0, 1]");
  /* Loads: the tensor's own devices, then the request's default. */
  write_npy4("x.npy");
  sched_load_tensor t = {"", 1, {DEV_LAYOUT_MIRRORED, 0, 0}, NULL, 0, &far};
  sched_load_request req = {
      "x.npy", STG_FORMAT_AUTO, &t, 1, 0, {DEV_LAYOUT_MIRRORED, 0, 0}, NULL};
  sched_load_result *r = NULL;
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(sched_load_begin(ss, &req, &r, &st), PD_PERMISSION_DENIED);
  assert_contains(st.msg,
                  "devices [2, 3] are outside the session's allowed "
                  "devices [0, 1]");
  t.devices = NULL;
  req.default_devices = &far;
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(sched_load_begin(ss, &req, &r, &st), PD_PERMISSION_DENIED);
  assert_contains(st.msg, "devices [2, 3] are outside");
  /* Nothing was made of any of it. */
  int handles = -1;
  uint64_t bytes = 1;
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(handles, 0);
  assert_int_equal(bytes, 0);
  sched_session_put(ss);
  sched_destroy(s);
}

/* CopyToDevices' target outside the allowed set (its input must be the
 * session's, on a subset: waits on the engine). */
static void test_copy_target_refused(void **state) {
  (void)state;
  sched *s = new_sched(0);
  dev_devset half = SET(0, 1);
  sched_session *ss = open_on(s, &half);
  dev_status st = DEV_STATUS_INIT;
  pd_code c = tu_sched_upload_on(ss, 1, NULL, DEV_LAYOUT_MIRRORED, 4, &st);
  if (c != PD_OK) {
    sched_session_put(ss);
    sched_destroy(s);
    skip_unless_placed(c, &st);
  }
  assert_int_equal(c, PD_OK);
  const int64_t to[2] = {2, 3};
  const dev_attr attrs[1] = {dev_attr_int_list("devices", to, 2)};
  const uint64_t in[1] = {1};
  uint64_t out_id = 2;
  sched_op op = {.op_name = "CopyToDevices",
                 .inputs = in,
                 .num_inputs = 1,
                 .attrs = attrs,
                 .num_attrs = 1,
                 .output_ids = &out_id,
                 .num_outputs = 1};
  sched_op_result res;
  int failed = -1;
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(sched_execute(ss, &op, 1, 0, &res, &failed, &st),
                   PD_PERMISSION_DENIED);
  assert_contains(st.msg,
                  "devices [2, 3] are outside the session's allowed "
                  "devices [0, 1]");
  sched_session_put(ss);
  sched_destroy(s);
}

/* A narrowed session's default placement: an upload and an op without
 * inputs that name no devices land on the allowed set. */
static void test_default_placement(void **state) {
  (void)state;
  sched *s = new_sched(0);
  dev_devset half = SET(2, 3);
  sched_session *ss = open_on(s, &half);
  dev_status st = DEV_STATUS_INIT;
  pd_code c = tu_sched_upload_on(ss, 1, NULL, DEV_LAYOUT_SHARDED, 8, &st);
  if (c != PD_OK) {
    sched_session_put(ss);
    sched_destroy(s);
    skip_unless_placed(c, &st);
  }
  assert_int_equal(c, PD_OK);
  dev_tensor *t = NULL;
  char buf[DEV_DEVSET_STR_MAX];
  assert_int_equal(sched_handle_get(ss, 1, &t, &st), PD_OK);
  assert_string_equal(dev_devset_str(dev_tensor_devset(t), buf, sizeof buf),
                      "[2, 3]");
  dev_tensor_release(t);
  const int64_t dims[1] = {4};
  const dev_attr attrs[3] = {dev_attr_shape("shape", 1, dims),
                             dev_attr_float("value", 1),
                             dev_attr_dtype("dtype", PD_FLOAT32)};
  uint64_t out_id = 2;
  sched_op op = {.op_name = "Fill",
                 .attrs = attrs,
                 .num_attrs = 3,
                 .output_ids = &out_id,
                 .num_outputs = 1};
  sched_op_result res;
  int failed = -1;
  assert_int_equal(sched_execute(ss, &op, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_handle_get(ss, 2, &t, &st), PD_OK);
  assert_string_equal(dev_devset_str(dev_tensor_devset(t), buf, sizeof buf),
                      "[2, 3]");
  dev_tensor_release(t);
  sync_all(ss);
  sched_session_put(ss);
  sched_destroy(s);
}

/* --- memory per device ------------------------------------------------------ */

/* The whole mesh (runs now): per-device bytes by hand. float32 [8]
 * mirrored: 32 bytes on each of 4 devices; sharded along 0: 2 elements,
 * 8 bytes each; Neg of the sharded one: 8 more each. */
static void test_bytes_per_device_whole_mesh(void **state) {
  (void)state;
  sched *s = new_sched(0);
  sched_session *ss = open_on(s, NULL);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(tu_sched_upload_on(ss, 1, NULL, DEV_LAYOUT_MIRRORED, 8, &st),
                   PD_OK);
  expect_bytes(s, ss, (uint64_t[NDEV]){32, 32, 32, 32});
  assert_int_equal(tu_sched_upload_on(ss, 2, NULL, DEV_LAYOUT_SHARDED, 8, &st),
                   PD_OK);
  expect_bytes(s, ss, (uint64_t[NDEV]){40, 40, 40, 40});
  assert_int_equal(queue_neg(ss, 2, 3, 1, &st), PD_OK);
  sync_all(ss);
  expect_bytes(s, ss, (uint64_t[NDEV]){48, 48, 48, 48});
  assert_int_equal(sched_handle_delete(ss, (uint64_t[]){1}, 1, &st), PD_OK);
  expect_bytes(s, ss, (uint64_t[NDEV]){16, 16, 16, 16});
  assert_int_equal(sched_handle_delete(ss, (uint64_t[]){2, 3}, 2, &st), PD_OK);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 0, 0, 0});
  sched_session_put(ss);
  sched_destroy(s);
}

/* Two sessions on disjoint halves: each sees only its own use. A on
 * [0, 1]: float32 [4] mirrored (16 bytes on 0 and 1) and [8] sharded (16
 * each); B on [2, 3]: float32 [6] sharded (12 each), then Neg of it (12
 * more each). */
static void test_bytes_disjoint_halves(void **state) {
  (void)state;
  sched *s = new_sched(0);
  dev_devset lo = SET(0, 1), hi = SET(2, 3);
  sched_session *a = open_on(s, &lo), *b = open_on(s, &hi);
  dev_status st = DEV_STATUS_INIT;
  pd_code c = tu_sched_upload_on(a, 1, NULL, DEV_LAYOUT_MIRRORED, 4, &st);
  if (c != PD_OK) {
    sched_session_put(a);
    sched_session_put(b);
    sched_destroy(s);
    skip_unless_placed(c, &st);
  }
  assert_int_equal(c, PD_OK);
  assert_int_equal(tu_sched_upload_on(a, 2, NULL, DEV_LAYOUT_SHARDED, 8, &st),
                   PD_OK);
  assert_int_equal(tu_sched_upload_on(b, 1, NULL, DEV_LAYOUT_SHARDED, 6, &st),
                   PD_OK);
  assert_int_equal(queue_neg(b, 1, 2, 1, &st), PD_OK);
  sync_all(b);
  expect_bytes(s, a, (uint64_t[NDEV]){32, 32, 0, 0});
  expect_bytes(s, b, (uint64_t[NDEV]){0, 0, 24, 24});
  assert_int_equal(sched_handle_delete(a, (uint64_t[]){1}, 1, &st), PD_OK);
  expect_bytes(s, a, (uint64_t[NDEV]){16, 16, 0, 0});
  expect_bytes(s, b, (uint64_t[NDEV]){0, 0, 24, 24});
  sched_session_put(a);
  sched_session_put(b);
  sched_destroy(s);
}

/* ParallelUnpack and ParallelPack share their inputs' buffers: their
 * outputs join the parts' charges, so each device's bytes stay what the upload
 * took (float32 [8] sharded over 4: 8 bytes on each device). */
static void test_pack_unpack_charged_once(void **state) {
  (void)state;
  if (!dev_op_lookup("ParallelUnpack")) {
    print_message("skipped (waits on the engine's placement ops)\n");
    skip();
  }
  sched *s = new_sched(0);
  sched_session *ss = open_on(s, NULL);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(tu_sched_upload_on(ss, 1, NULL, DEV_LAYOUT_SHARDED, 8, &st),
                   PD_OK);
  const uint64_t in[1] = {1}, parts[NDEV] = {2, 3, 4, 5};
  uint64_t packed = 6;
  sched_op ops[2] = {{.op_name = "ParallelUnpack",
                      .inputs = in,
                      .num_inputs = 1,
                      .output_ids = parts,
                      .num_outputs = NDEV},
                     {.op_name = "ParallelPack",
                      .inputs = parts,
                      .num_inputs = NDEV,
                      .output_ids = &packed,
                      .num_outputs = 1}};
  sched_op_result res[2];
  int failed = -1;
  pd_code c = sched_execute(ss, ops, 2, 0, res, &failed, &st);
  if (c != PD_OK) print_message("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
  sync_all(ss);
  expect_bytes(s, ss, (uint64_t[NDEV]){8, 8, 8, 8});
  dev_tensor *t = NULL;
  char buf[DEV_DEVSET_STR_MAX];
  assert_int_equal(sched_handle_get(ss, 4, &t, &st), PD_OK);
  assert_string_equal(dev_devset_str(dev_tensor_devset(t), buf, sizeof buf),
                      "[2]");
  dev_tensor_release(t);
  sched_session_put(ss);
  sched_destroy(s);
}

/* A tape's gradient ops follow their inputs (one without inputs, the seed
 * of ones, goes on the target's set): on a session narrowed to [1, 3],
 * x = [0, 1, 2, 3] sharded (component 0 [0, 1] on device 1, component 1
 * [2, 3] on device 3), y = Sum(Square(x)) per component, dy/dx = 2x =
 * [0, 2, 4, 6] on [1, 3]; each device holds x, Square(x), the sum (one
 * float) and the gradient: 8 + 8 + 4 + 8 = 28 bytes, none elsewhere. */
static void test_gradient_on_its_set(void **state) {
  (void)state;
  sched *s = new_sched(0);
  dev_devset odd = SET(1, 3);
  sched_session *ss = open_on(s, &odd);
  dev_status st = DEV_STATUS_INIT;
  pd_code c = tu_sched_upload_on(ss, 1, NULL, DEV_LAYOUT_SHARDED, 4, &st);
  if (c != PD_OK) {
    sched_session_put(ss);
    sched_destroy(s);
    skip_unless_placed(c, &st);
  }
  assert_int_equal(c, PD_OK);
  const uint64_t x = 1, sq = 2, sum = 3, r = 4;
  assert_int_equal(sched_tape_start(ss, 7, false, &st), PD_OK);
  assert_int_equal(sched_tape_watch(ss, 7, &x, 1, &st), PD_OK);
  sched_op ops[2] = {{.op_name = "Square",
                      .inputs = &x,
                      .num_inputs = 1,
                      .output_ids = &sq,
                      .num_outputs = 1},
                     {.op_name = "Sum",
                      .inputs = &sq,
                      .num_inputs = 1,
                      .output_ids = &sum,
                      .num_outputs = 1}};
  sched_op_result res[2];
  int failed = -1;
  assert_int_equal(sched_execute(ss, ops, 2, 0, res, &failed, &st), PD_OK);
  sched_gradient g = {7, sum, &x, 1, 0, &r, 1};
  pd_dtype dt;
  dev_shape shape;
  c = sched_tape_gradient(ss, &g, 0, &dt, &shape, &st);
  if (c != PD_OK) print_message("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
  sync_all(ss);
  dev_tensor *t = NULL;
  assert_int_equal(sched_handle_get(ss, r, &t, &st), PD_OK);
  char buf[DEV_DEVSET_STR_MAX];
  assert_string_equal(dev_devset_str(dev_tensor_devset(t), buf, sizeof buf),
                      "[1, 3]");
  float got[4] = {-1, -1, -1, -1};
  dev_layout cat = {DEV_LAYOUT_SHARDED, 0, 0};
  assert_int_equal(dev_tensor_to_host(t, &cat, 0, got, sizeof got, &st), PD_OK);
  const float want[4] = {0, 2, 4, 6};
  assert_memory_equal(got, want, sizeof want);
  dev_tensor_release(t);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 28, 0, 28});
  sched_session_put(ss);
  sched_destroy(s);
}

/* --- dispatch per device ----------------------------------------------------- */

/* The policy alone: a pick passes over sessions the dispatcher's test
 * refuses (their devices full), and a newly ready session is lifted only
 * to the virtual time of sessions whose sets overlap its own. */
static sched_session *fake(const dev_devset *devices) {
  sched_session *ss = calloc(1, sizeof *ss);
  assert_non_null(ss);
  ss->weight = 1;
  ss->devices = *devices;
  assert_true(sched_policy_session_init(ss));
  return ss;
}

static void unfake(sched_session *ss) {
  sched_policy_session_fini(ss);
  free(ss);
}

static uint64_t g_full; /* devices the test calls full (a mask) */

static bool fake_room(void *arg, sched_session *ss) {
  (void)arg;
  return (sched_devmask(&ss->devices) & g_full) == 0;
}

static void test_policy_skips_full_devices(void **state) {
  (void)state;
  sched_policy_queue q;
  sched_policy_init(&q, false);
  dev_devset lo = SET(0, 1), hi = SET(2, 3), mid = SET(1, 2), d3 = SET(3);
  sched_session *a = fake(&lo), *b = fake(&hi);
  sched_policy_ready(&q, a);
  sched_policy_ready(&q, b);
  int ops;
  uint64_t budget;
  /* a has the smaller vtime but its devices are full: b goes, a stays. */
  b->pol.vtime = 1e6;
  g_full = 0x3;
  assert_true(sched_policy_can_pick(&q, fake_room, NULL));
  for (int i = 0; i < 5; i++) {
    assert_ptr_equal(sched_policy_pick(&q, &ops, &budget, fake_room, NULL), b);
    assert_int_equal(budget, UINT64_MAX); /* alone among the accepted */
    sched_policy_charge(&q, b, 1000, true);
  }
  /* Every device full: nothing to pick, nothing taken out. */
  g_full = 0xf;
  assert_false(sched_policy_can_pick(&q, fake_room, NULL));
  assert_null(sched_policy_pick(&q, &ops, &budget, fake_room, NULL));
  assert_int_equal(q.ready, 2);
  /* Room again: a, uncharged meanwhile, goes first. */
  g_full = 0;
  assert_ptr_equal(sched_policy_pick(&q, &ops, &budget, fake_room, NULL), a);
  sched_policy_charge(&q, a, 1000, true);
  /* Lift, with a (vtime 1000) and b (1e6 + 5000) ready: a new session on
   * [3] overlaps b alone, so it is lifted to b's time, not to a's smaller
   * one; one on [1, 2] overlaps both: the smaller, a's. */
  sched_session *c = fake(&d3), *e = fake(&mid);
  sched_policy_ready(&q, c);
  assert_true(c->pol.vtime == 1e6 + 5000);
  sched_policy_ready(&q, e);
  assert_true(e->pol.vtime == 1000);
  unfake(a);
  unfake(b);
  unfake(c);
  unfake(e);
}

static void hold_devices(int from, int to, bool hold) {
  for (int dv = from; dv < to; dv++) dev__exec_hold(g_engine, dv, hold);
}

/* Over the engine: ops of 100 us, 250 us ahead per device. A on [0, 1]
 * with its executors held fills its devices after 3 ops; B on [2, 3],
 * queued behind, still gets every one of its 20 ops submitted, and A's
 * backlog goes on only once its devices are let go. */
static void test_dispatch_disjoint_not_held_back(void **state) {
  (void)state;
  sched *s = new_sched(250000);
  dev_devset lo = SET(0, 1), hi = SET(2, 3);
  sched_session *a = open_on(s, &lo), *b = open_on(s, &hi);
  dev_status st = DEV_STATUS_INIT;
  pd_code c = tu_sched_upload_on(a, 1, NULL, DEV_LAYOUT_MIRRORED, 100, &st);
  if (c != PD_OK) {
    sched_session_put(a);
    sched_session_put(b);
    sched_destroy(s);
    skip_unless_placed(c, &st);
  }
  assert_int_equal(c, PD_OK);
  assert_int_equal(
      tu_sched_upload_on(b, 1, NULL, DEV_LAYOUT_MIRRORED, 100, &st), PD_OK);
  hold_devices(0, 2, true);
  assert_int_equal(queue_neg(a, 1, 100, 50, &st), PD_OK);
  wait_logged(3);
  assert_int_equal(queue_neg(b, 1, 100, 20, &st), PD_OK);
  wait_logged(23);
  /* Every op of B went while A's devices stayed full with its 3. */
  int na = 0, nb = 0;
  pthread_mutex_lock(&g_log.mu);
  for (int k = 0; k < g_log.n; k++)
    g_log.session[k] == sched_session_seq(a) ? na++ : nb++;
  pthread_mutex_unlock(&g_log.mu);
  assert_int_equal(na, 3);
  assert_int_equal(nb, 20);
  sync_all(b);
  assert_int_equal(logged(), 23);
  hold_devices(0, 2, false);
  wait_logged(70);
  sync_all(a);
  sched_session_put(a);
  sched_session_put(b);
  sched_destroy(s);
}

/* Fair share on overlapping sets: A on [0, 1] and B on [1, 2], both
 * backlogged (paused while they queue), share by vtime: the lag bound of
 * sched_policy.h holds between them over the whole run (ops of 10 us). */
static void test_fair_overlapping_sets(void **state) {
  (void)state;
  sched *s = new_sched(2000000);
  dev_devset x = SET(0, 1), y = SET(1, 2);
  sched_session *a = open_on(s, &x), *b = open_on(s, &y);
  dev_status st = DEV_STATUS_INIT;
  pd_code c = tu_sched_upload_on(a, 1, NULL, DEV_LAYOUT_MIRRORED, 10, &st);
  if (c != PD_OK) {
    sched_session_put(a);
    sched_session_put(b);
    sched_destroy(s);
    skip_unless_placed(c, &st);
  }
  assert_int_equal(c, PD_OK);
  assert_int_equal(tu_sched_upload_on(b, 1, NULL, DEV_LAYOUT_MIRRORED, 10, &st),
                   PD_OK);
  sched_pause(s, true);
  assert_int_equal(queue_neg(a, 1, 100, 200, &st), PD_OK);
  assert_int_equal(queue_neg(b, 1, 100, 200, &st), PD_OK);
  sched_pause(s, false);
  wait_logged(400);
  sync_all(a);
  sync_all(b);
  double sa = 0, sb = 0, cop = 10000;
  int la = 200, lb = 200;
  for (int k = 0; k < 400 && la > 0 && lb > 0; k++) {
    if (g_log.session[k] == sched_session_seq(a)) {
      sa += (double)g_log.cost[k];
      la--;
    } else {
      sb += (double)g_log.cost[k];
      lb--;
    }
    assert_true(fabs(sa - sb) <= 2 * (cop + SLICE));
  }
  sched_session_put(a);
  sched_session_put(b);
  sched_destroy(s);
}

static int rm_dir(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "%s/x.npy", g_dir);
  remove(cmd);
  return rmdir(g_dir);
}

int main(void) {
  g_engine = tu_engine(NDEV, 0);
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/paradev-place-XXXXXX", tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) return 1;
  const char *roots[1] = {g_dir};
  if (stg_roots_create(roots, 1, &g_roots, NULL) != PD_OK) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_allowed_set),
      cmocka_unit_test(test_placements_refused),
      cmocka_unit_test(test_copy_target_refused),
      cmocka_unit_test(test_default_placement),
      cmocka_unit_test(test_bytes_per_device_whole_mesh),
      cmocka_unit_test(test_bytes_disjoint_halves),
      cmocka_unit_test(test_pack_unpack_charged_once),
      cmocka_unit_test(test_gradient_on_its_set),
      cmocka_unit_test(test_policy_skips_full_devices),
      cmocka_unit_test(test_dispatch_disjoint_not_held_back),
      cmocka_unit_test(test_fair_overlapping_sets),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  stg_roots_destroy(g_roots);
  rm_dir();
  dev_engine_destroy(g_engine);
  return rc;
}
