/* Integration test of gradient tapes through the daemon, with libparadev.
 *
 * Starts paradevd (the built binary) on a temporary Unix socket with 4
 * simulated devices and checks, against values worked out by hand (or in
 * float64 here, from the inputs only):
 *  - a gradient through MatMul, Square and Sum, by unary calls and by Enqueue
 *    items, its results' dtypes and shapes known at once;
 *  - a data-parallel gradient: x sharded unevenly (5 rows on 4 devices), each
 *    component's gradient from its own shard, then AllReduce(sum);
 *  - persistent tapes answer twice, one-shot tapes once (FAILED_PRECONDITION
 *    after), a source with no path gets zeros, an output gradient weights;
 *  - errors: unknown tape NOT_FOUND, ids 0 and reuse, an op with no gradient
 *    (INVALID_ARGUMENT naming it), a non-floating target, live result ids,
 *    the memory quota applied to gradient ops;
 *  - a tape holds what it recorded until deleted or its session ends (close,
 *    lease expiry): device memory goes back to the baseline;
 *  - the devices' busy seconds (GetServerInfo) grow with work and never by
 *    more than the wall time that passed.
 *
 * Usage: test_tape PARADEVD
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "paradev/paradev.h"
#include "harness.h"

#define NDEV 4
#define MEM_LIMIT (64u << 20) /* per device */

static const char *paradevd_path;
static pdt_daemon D;

static void daemon_start(pdt_daemon *d) {
  char mem[32], ndev[8];
  snprintf(mem, sizeof(mem), "%u", MEM_LIMIT);
  snprintf(ndev, sizeof(ndev), "%d", NDEV);
  const char *extra[] = {"--devices", ndev, "--memory-limit", mem, "--grace-ms",
                         "2000",      NULL};
  pdt_daemon_start(d, paradevd_path, "pdtape", false, extra);
}

/* --- helpers ------------------------------------------------------------------ */

typedef struct env {
  pd_client *c;
  pd_status *st;
} env;

static pd_session *new_session(env *e, const char *name, uint32_t lease_s,
                               bool keep_alive, uint64_t quota) {
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = name;
  so.lease_seconds = lease_s;
  so.keep_alive = keep_alive;
  so.memory_quota_bytes = quota;
  pd_session *s = pd_session_new(e->c, &so, NULL, e->st);
  if (!s) fail_msg("pd_session_new: %s", pd_status_message(e->st));
  return s;
}

static void upload_f32(env *e, pd_session *s, uint64_t id, const int64_t *dims,
                       int rank, const float *v, pd_layout layout) {
  size_t n = 1;
  for (int i = 0; i < rank; i++) n *= (size_t)dims[i];
  OK(e, pd_upload(s, id, PD_FLOAT32, dims, rank, v, n * sizeof(float), layout,
                  NULL, NULL, e->st));
}

/* Runs a one-output op with ids chosen here. */
static void op1(env *e, pd_session *s, const char *op, const uint64_t *in,
                int n_in, const pd_attrs *a, uint64_t out) {
  uint64_t o = out;
  OK(e, pd_execute(s, op, in, n_in, a, &o, 1, NULL, NULL, e->st));
}

static void download_f32(env *e, pd_session *s, uint64_t id, pd_layout l,
                         float *out, size_t n) {
  OK(e, pd_download(s, id, l, out, n * sizeof(float), NULL, NULL, NULL, e->st));
}

static void assert_shape(const pd_tensor_info *t, pd_dtype dt, int rank,
                         const int64_t *dims) {
  assert_int_equal(t->dtype, dt);
  pdt_assert_shape(t, rank, dims);
}

/* Device memory in use, summed over the devices. */
static uint64_t mem_used(env *e) {
  pd_server_info *info = pd_client_get_server_info(e->c, NULL, e->st);
  if (!info) fail_msg("GetServerInfo: %s", pd_status_message(e->st));
  uint64_t sum = 0;
  for (int i = 0; i < pd_server_info_num_devices(info); i++)
    sum += pd_server_info_device(info, i)->memory_used_bytes;
  pd_server_info_delete(info);
  return sum;
}

/* Waits (at most 10 s) until device memory is back to `want`: memory of
 * released tensors is freed once the ops that use them have run. */
static void wait_mem(env *e, uint64_t want) {
  uint64_t got = 0;
  for (int i = 0; i < 200; i++) {
    if ((got = mem_used(e)) == want) return;
    usleep(50000);
  }
  fail_msg("device memory is %llu bytes, expected %llu",
           (unsigned long long)got, (unsigned long long)want);
}

/* --- setup -------------------------------------------------------------------------- */

static int setup(void **state) {
  env *e = calloc(1, sizeof(*e));
  e->st = pd_status_new();
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.default_timeout_ms = 30000;
  e->c = pd_client_new(D.unix_target, &co, e->st);
  if (!e->c) {
    fprintf(stderr, "pd_client_new: %s\n", pd_status_message(e->st));
    return -1;
  }
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env *e = *state;
  pd_client_delete(e->c);
  pd_status_delete(e->st);
  free(e);
  return 0;
}

/* --- the values used by several tests -------------------------------------------------
 *
 * x = [[1, 2], [3, 4]], w = [[0.5], [-1]]
 * y = x w = [[-1.5], [-2.5]], loss = sum(y^2) = 2.25 + 6.25 = 8.5
 * d loss / d w = 2 x^T y = 2 [[1*-1.5 + 3*-2.5], [2*-1.5 + 4*-2.5]]
 *              = [[-18], [-26]]
 * d loss / d x = 2 y w^T = [[-1.5, 3], [-2.5, 5]]
 */
static const float X[4] = {1, 2, 3, 4}, W[2] = {0.5f, -1};
static const int64_t DX[2] = {2, 2}, DW[2] = {2, 1};
static const double GW[2] = {-18, -26}, GX[4] = {-1.5, 3, -2.5, 5};

enum { ID_X = 1, ID_W, ID_Y, ID_SQ, ID_LOSS, ID_GW, ID_GX, ID_Z, ID_GZ };

/* Uploads x and w, and runs y, y^2 and loss = Sum(y^2) on the session. */
static void forward(env *e, pd_session *s) {
  const uint64_t xw[2] = {ID_X, ID_W}, y[1] = {ID_Y}, sq[1] = {ID_SQ};
  op1(e, s, "MatMul", xw, 2, NULL, ID_Y);
  op1(e, s, "Square", y, 1, NULL, ID_SQ);
  op1(e, s, "Sum", sq, 1, NULL, ID_LOSS); /* empty axis list: every axis */
}

static void upload_xw(env *e, pd_session *s) {
  upload_f32(e, s, ID_X, DX, 2, X, pd_layout_mirrored());
  upload_f32(e, s, ID_W, DW, 2, W, pd_layout_mirrored());
}

/* --- tests ---------------------------------------------------------------------------- */

static void test_gradient_unary(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "grad", 0, true, 0);
  upload_xw(e, s);
  const uint64_t tape = 77;
  OK(e, pd_tape_start(s, tape, false, NULL, e->st));
  const uint64_t watch[2] = {ID_X, ID_W};
  OK(e, pd_tape_watch(s, tape, watch, 2, NULL, e->st));
  forward(e, s);
  const uint64_t srcs[2] = {ID_W, ID_X};
  uint64_t res[2] = {ID_GW, ID_GX};
  pd_tensor_info info[2];
  OK(e, pd_tape_gradient(s, tape, ID_LOSS, srcs, 2, 0, res, info, NULL, e->st));
  /* Known before the devices ran: the sources' dtypes and shapes. */
  assert_int_equal(info[0].id, ID_GW);
  assert_shape(&info[0], PD_FLOAT32, 2, DW);
  assert_int_equal(info[1].id, ID_GX);
  assert_shape(&info[1], PD_FLOAT32, 2, DX);
  float gw[2], gx[4], loss;
  download_f32(e, s, ID_LOSS, pd_layout_mirrored(), &loss, 1);
  assert_true(loss == 8.5f);
  for (int d = 0; d < NDEV; d++) { /* every component, the same values */
    download_f32(e, s, ID_GW, pd_layout_component(d), gw, 2);
    pdt_assert_close_f32(gw, GW, 2, 1e-6);
    download_f32(e, s, ID_GX, pd_layout_component(d), gx, 4);
    pdt_assert_close_f32(gx, GX, 4, 1e-6);
  }
  /* One-shot: a second gradient, or a watch, is FAILED_PRECONDITION. */
  uint64_t res2[1] = {100};
  EXPECT_CODE(
      e, PD_FAILED_PRECONDITION,
      pd_tape_gradient(s, tape, ID_LOSS, srcs, 1, 0, res2, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "one-shot");
  EXPECT_CODE(e, PD_FAILED_PRECONDITION,
              pd_tape_watch(s, tape, watch, 1, NULL, e->st));
  /* The failed call published nothing: id 100 is free. */
  op1(e, s, "Neg", watch, 1, NULL, 100);
  OK(e, pd_tape_delete(s, tape, NULL, e->st));
  EXPECT_CODE(e, PD_NOT_FOUND, pd_tape_delete(s, tape, NULL, e->st));
  /* The id can be used again once deleted. */
  OK(e, pd_tape_start(s, tape, true, NULL, e->st));
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

static void test_persistent_and_no_path(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "persistent", 0, true, 0);
  upload_xw(e, s);
  const float z[3] = {7, 8, 9};
  const int64_t dz[1] = {3};
  upload_f32(e, s, ID_Z, dz, 1, z, pd_layout_mirrored());
  const uint64_t tape = 5;
  OK(e, pd_tape_start(s, tape, true, NULL, e->st));
  const uint64_t watch[3] = {ID_X, ID_W, ID_Z};
  OK(e, pd_tape_watch(s, tape, watch, 3, NULL, e->st));
  OK(e, pd_tape_watch(s, tape, watch, 1, NULL, e->st)); /* twice: no-op */
  forward(e, s);
  /* Twice from the same persistent tape; z has no path to the loss. */
  for (int round = 0; round < 2; round++) {
    const uint64_t srcs[2] = {ID_W, ID_Z};
    uint64_t res[2] = {0, 0}; /* fresh ids from the library */
    pd_tensor_info info[2];
    OK(e,
       pd_tape_gradient(s, tape, ID_LOSS, srcs, 2, 0, res, info, NULL, e->st));
    assert_true(res[0] >= PD_FIRST_LIBRARY_ID && res[1] > res[0]);
    assert_shape(&info[1], PD_FLOAT32, 1, dz);
    float gw[2], gz[3];
    download_f32(e, s, res[0], pd_layout_mirrored(), gw, 2);
    pdt_assert_close_f32(gw, GW, 2, 1e-6);
    download_f32(e, s, res[1], pd_layout_mirrored(), gz, 3);
    const double zeros[3] = {0, 0, 0};
    pdt_assert_close_f32(gz, zeros, 3, 0);
  }
  /* An output gradient of 3 triples the gradient. */
  const float three = 3;
  upload_f32(e, s, 50, NULL, 0, &three, pd_layout_mirrored());
  const uint64_t src_w[1] = {ID_W};
  uint64_t res3[1] = {51};
  OK(e,
     pd_tape_gradient(s, tape, ID_LOSS, src_w, 1, 50, res3, NULL, NULL, e->st));
  float gw3[2];
  download_f32(e, s, 51, pd_layout_mirrored(), gw3, 2);
  const double want3[2] = {3 * GW[0], 3 * GW[1]};
  pdt_assert_close_f32(gw3, want3, 2, 1e-6);
  /* The target itself as the source: the upstream gradient (ones). */
  const uint64_t src_l[1] = {ID_LOSS};
  uint64_t res4[1] = {52};
  OK(e,
     pd_tape_gradient(s, tape, ID_LOSS, src_l, 1, 0, res4, NULL, NULL, e->st));
  float one;
  download_f32(e, s, 52, pd_layout_mirrored(), &one, 1);
  assert_true(one == 1.0f);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

/* The data-parallel step: x sharded unevenly over the 4 devices (rows
 * 2, 1, 1, 1 of 5), w mirrored; each device's gradient comes from its own
 * shard, and AllReduce(sum) of them is the gradient of the whole batch. */
static void test_sharded_allreduce(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "sharded", 0, true, 0);
  const float x[10] = {1, 2, 3, 4, 5, 6, -1, 0.5f, 2, -3};
  const int64_t dx[2] = {5, 2};
  const int rows[NDEV] = {2, 1, 1, 1}, first[NDEV] = {0, 2, 3, 4};
  upload_f32(e, s, ID_X, dx, 2, x, pd_layout_sharded(0));
  upload_f32(e, s, ID_W, DW, 2, W, pd_layout_mirrored());
  pd_stream *t = pd_stream_new(s, NULL, e->st);
  assert_non_null(t);
  const uint64_t tape = 9, w[1] = {ID_W}, xw[2] = {ID_X, ID_W}, y[1] = {ID_Y},
                 sq[1] = {ID_SQ};
  OK(e, pd_stream_tape_start(t, tape, false, NULL, e->st));
  OK(e, pd_stream_tape_watch(t, tape, w, 1, NULL, e->st));
  uint64_t o = ID_Y;
  OK(e, pd_stream_execute(t, "MatMul", xw, 2, NULL, &o, 1, NULL, e->st));
  o = ID_SQ;
  OK(e, pd_stream_execute(t, "Square", y, 1, NULL, &o, 1, NULL, e->st));
  o = ID_LOSS;
  OK(e, pd_stream_execute(t, "Sum", sq, 1, NULL, &o, 1, NULL, e->st));
  uint64_t res[1] = {ID_GW}, idx = 0;
  OK(e, pd_stream_tape_gradient(t, tape, ID_LOSS, w, 1, 0, res, &idx, e->st));
  assert_int_equal(idx, 5);
  OK(e, pd_stream_tape_delete(t, tape, NULL, e->st));
  pd_attrs *a = pd_attrs_new();
  pd_attrs_set_string(a, "reduction", "sum");
  const uint64_t gw[1] = {ID_GW};
  o = 60;
  OK(e, pd_stream_execute(t, "AllReduce", gw, 1, a, &o, 1, NULL, e->st));
  pd_attrs_delete(a);
  OK(e, pd_stream_close(t, 30000, e->st));
  pd_stream_delete(t);
  /* Per device: 2 x_d^T (x_d w), in float64 from the inputs. */
  double total[2] = {0, 0};
  for (int d = 0; d < NDEV; d++) {
    double want[2] = {0, 0};
    for (int r = first[d]; r < first[d] + rows[d]; r++) {
      double yr = x[2 * r] * (double)W[0] + x[2 * r + 1] * (double)W[1];
      want[0] += 2 * x[2 * r] * yr;
      want[1] += 2 * x[2 * r + 1] * yr;
    }
    float got[2];
    download_f32(e, s, ID_GW, pd_layout_component(d), got, 2);
    pdt_assert_close_f32(got, want, 2, 1e-6);
    total[0] += want[0];
    total[1] += want[1];
  }
  for (int d = 0; d < NDEV; d++) {
    float got[2];
    download_f32(e, s, 60, pd_layout_component(d), got, 2);
    pdt_assert_close_f32(got, total, 2, 1e-6);
  }
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

/* The stream's reply to a gradient item carries the results. */
typedef struct reply_log {
  int n;
  uint64_t index[16];
  pd_code code[16];
  int num_outputs[16];
  pd_tensor_info out0[16];
} reply_log;

static void on_reply(void *arg, const pd_stream_reply *r) {
  reply_log *l = arg;
  if (l->n >= 16) return;
  l->index[l->n] = r->index;
  l->code[l->n] = r->code;
  l->num_outputs[l->n] = r->num_outputs;
  if (r->num_outputs) l->out0[l->n] = r->outputs[0];
  l->n++;
}

static void test_stream_items(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "stream", 0, true, 0);
  upload_xw(e, s);
  reply_log log;
  memset(&log, 0, sizeof(log));
  pd_stream_options so = PD_STREAM_OPTIONS_INITIALIZER;
  so.on_reply = on_reply;
  so.on_reply_arg = &log;
  pd_stream *t = pd_stream_new(s, &so, e->st);
  assert_non_null(t);
  const uint64_t tape = 3, watch[1] = {ID_X}, xw[2] = {ID_X, ID_W},
                 y[1] = {ID_Y}, sq[1] = {ID_SQ}, srcs[1] = {ID_X};
  OK(e, pd_stream_tape_start(t, tape, false, NULL, e->st));    /* 0 */
  OK(e, pd_stream_tape_start(t, tape, false, NULL, e->st));    /* 1: exists */
  OK(e, pd_stream_tape_watch(t, tape, watch, 1, NULL, e->st)); /* 2 */
  uint64_t o = ID_Y;
  OK(e, pd_stream_execute(t, "MatMul", xw, 2, NULL, &o, 1, NULL, e->st));
  o = ID_SQ;
  OK(e, pd_stream_execute(t, "Square", y, 1, NULL, &o, 1, NULL, e->st));
  o = ID_LOSS;
  OK(e, pd_stream_execute(t, "Sum", sq, 1, NULL, &o, 1, NULL, e->st));
  uint64_t res[1] = {ID_GX};
  OK(e, pd_stream_tape_gradient(t, tape, ID_LOSS, srcs, 1, 0, res, NULL,
                                e->st)); /* 6 */
  uint64_t res2[1] = {ID_GZ};
  OK(e, pd_stream_tape_gradient(t, 404, ID_LOSS, srcs, 1, 0, res2, NULL,
                                e->st));              /* 7 */
  OK(e, pd_stream_tape_delete(t, tape, NULL, e->st)); /* 8 */
  OK(e, pd_stream_tape_delete(t, tape, NULL, e->st)); /* 9: gone */
  EXPECT_CODE(e, PD_ALREADY_EXISTS, pd_stream_wait(t, 30000, e->st));
  ASSERT_MSG_HAS(e, "item 1");
  ASSERT_MSG_HAS(e, "2 more items failed");
  OK(e, pd_stream_close(t, 30000, e->st));
  pd_stream_delete(t);
  assert_int_equal(log.n, 10);
  const pd_code want[10] = {
      PD_OK, PD_ALREADY_EXISTS, PD_OK, PD_OK,       PD_OK, PD_OK,
      PD_OK, PD_NOT_FOUND,      PD_OK, PD_NOT_FOUND};
  for (int i = 0; i < 10; i++) {
    assert_int_equal(log.index[i], i);
    if (log.code[i] != want[i])
      fail_msg("item %d: %s, expected %s", i, pd_code_name(log.code[i]),
               pd_code_name(want[i]));
  }
  assert_int_equal(log.num_outputs[6], 1);
  assert_int_equal(log.out0[6].id, ID_GX);
  assert_shape(&log.out0[6], PD_FLOAT32, 2, DX);
  float gx[4];
  download_f32(e, s, ID_GX, pd_layout_mirrored(), gx, 4);
  pdt_assert_close_f32(gx, GX, 4, 1e-6);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

static void test_errors(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "errors", 0, true, 0);
  upload_xw(e, s);
  const uint64_t watch[1] = {ID_X}, x[1] = {ID_X}, srcs[1] = {ID_X};
  uint64_t res[1] = {40};
  /* Unknown tapes. */
  EXPECT_CODE(e, PD_NOT_FOUND, pd_tape_watch(s, 12, watch, 1, NULL, e->st));
  ASSERT_MSG_HAS(e, "tape 12");
  EXPECT_CODE(
      e, PD_NOT_FOUND,
      pd_tape_gradient(s, 12, ID_X, srcs, 1, 0, res, NULL, NULL, e->st));
  EXPECT_CODE(e, PD_NOT_FOUND, pd_tape_delete(s, 12, NULL, e->st));
  /* Ids. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT, pd_tape_start(s, 0, false, NULL, e->st));
  OK(e, pd_tape_start(s, 1, true, NULL, e->st));
  EXPECT_CODE(e, PD_ALREADY_EXISTS, pd_tape_start(s, 1, false, NULL, e->st));
  const uint64_t unknown[2] = {ID_X, 999};
  EXPECT_CODE(e, PD_NOT_FOUND, pd_tape_watch(s, 1, unknown, 2, NULL, e->st));
  ASSERT_MSG_HAS(e, "999");
  OK(e, pd_tape_watch(s, 1, watch, 1, NULL, e->st));
  /* An op with no gradient on the path (SliceGrad; Abs has one since
   * issue #11): INVALID_ARGUMENT naming it. */
  const uint64_t xx[2] = {ID_X, ID_X};
  const int64_t begin[2] = {0, 0};
  pd_attrs *sa = pd_attrs_new();
  pd_attrs_set_int_list(sa, "begin", begin, 2);
  op1(e, s, "SliceGrad", xx, 2, sa, 20);
  pd_attrs_delete(sa);
  const uint64_t sg_out[1] = {20};
  op1(e, s, "Sum", sg_out, 1, NULL, 21);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_tape_gradient(s, 1, 21, srcs, 1, 0, res, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "SliceGrad");
  ASSERT_MSG_HAS(e, "no gradient");
  /* A target that is not floating. */
  pd_attrs *a = pd_attrs_new();
  pd_attrs_set_dtype(a, "DstT", PD_INT32);
  op1(e, s, "Cast", x, 1, a, 22);
  pd_attrs_delete(a);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_tape_gradient(s, 1, 22, srcs, 1, 0, res, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "int32");
  /* Unknown target, source, output gradient; a live result id. */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_tape_gradient(s, 1, 555, srcs, 1, 0, res, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "target");
  const uint64_t bad_src[1] = {556};
  EXPECT_CODE(
      e, PD_NOT_FOUND,
      pd_tape_gradient(s, 1, ID_X, bad_src, 1, 0, res, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "source 0");
  EXPECT_CODE(
      e, PD_NOT_FOUND,
      pd_tape_gradient(s, 1, ID_X, srcs, 1, 557, res, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "output gradient");
  uint64_t live[1] = {ID_W};
  EXPECT_CODE(
      e, PD_ALREADY_EXISTS,
      pd_tape_gradient(s, 1, ID_X, srcs, 1, 0, live, NULL, NULL, e->st));
  /* An output gradient of the wrong shape. */
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_tape_gradient(s, 1, ID_X, srcs, 1, ID_W, res, NULL, NULL, e->st));
  /* Arguments the library rejects before sending. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_tape_gradient(s, 1, 0, srcs, 1, 0, res, NULL, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_tape_gradient(s, 1, ID_X, NULL, 1, 0, res, NULL, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_tape_watch(s, 1, NULL, 2, NULL, e->st));
  /* 64 tapes at most. */
  for (uint64_t id = 2; id <= 64; id++)
    OK(e, pd_tape_start(s, id, false, NULL, e->st));
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_tape_start(s, 65, false, NULL, e->st));
  ASSERT_MSG_HAS(e, "64");
  /* After all of that the session still computes a gradient. */
  OK(e, pd_tape_delete(s, 64, NULL, e->st));
  OK(e, pd_tape_start(s, 65, false, NULL, e->st));
  OK(e, pd_tape_watch(s, 65, watch, 1, NULL, e->st));
  forward(e, s);
  OK(e, pd_tape_gradient(s, 65, ID_LOSS, srcs, 1, 0, res, NULL, NULL, e->st));
  float gx[4];
  download_f32(e, s, 40, pd_layout_mirrored(), gx, 4);
  pdt_assert_close_f32(gx, GX, 4, 1e-6);
  /* A closed session: the library says so. */
  OK(e, pd_session_close(s, NULL, e->st));
  EXPECT_CODE(e, PD_FAILED_PRECONDITION,
              pd_tape_start(s, 70, false, NULL, e->st));
  pd_session_delete(s);
}

/* Gradient ops count against the session's memory quota. x is [64, 64]
 * float32: 16 KiB per device, 64 KiB (K) over the 4 devices; y = x^2 is
 * another K, loss = Sum(y) 16 bytes. The gradient of the loss runs OnesLike
 * (16 B), BroadcastToLike (K), a scalar 2 (16 B), x*2 (K), dy*(2x) (K): 3 K
 * and 48 bytes. With a quota of 4.5 K, holding x and y (2 K) leaves too
 * little; once y's handle is deleted (the tape still holds y, but the quota
 * counts handles), 1 K + 3 K fits, and so does the result (K). */
static void test_quota(void **state) {
  env *e = *state;
  const uint64_t K = 64 << 10;
  pd_session *s = new_session(e, "quota", 0, true, K * 9 / 2);
  float *x = malloc(64 * 64 * sizeof(float));
  for (int i = 0; i < 64 * 64; i++) x[i] = (float)(i % 7) - 3;
  const int64_t dx[2] = {64, 64};
  upload_f32(e, s, ID_X, dx, 2, x, pd_layout_mirrored());
  OK(e, pd_tape_start(s, 1, false, NULL, e->st));
  const uint64_t in[1] = {ID_X}, y[1] = {ID_Y};
  OK(e, pd_tape_watch(s, 1, in, 1, NULL, e->st));
  op1(e, s, "Square", in, 1, NULL, ID_Y);
  op1(e, s, "Sum", y, 1, NULL, ID_LOSS);
  uint64_t res[1] = {ID_GX};
  EXPECT_CODE(
      e, PD_RESOURCE_EXHAUSTED,
      pd_tape_gradient(s, 1, ID_LOSS, in, 1, 0, res, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "quota");
  /* The one-shot tape was not used up by the failure: ask again. */
  const uint64_t del[1] = {ID_Y};
  OK(e, pd_delete(s, del, 1, NULL, e->st));
  OK(e, pd_tape_gradient(s, 1, ID_LOSS, in, 1, 0, res, NULL, NULL, e->st));
  float *g = malloc(64 * 64 * sizeof(float));
  double *want = malloc(64 * 64 * sizeof(double));
  for (int i = 0; i < 64 * 64; i++) want[i] = 2.0 * x[i];
  download_f32(e, s, ID_GX, pd_layout_mirrored(), g, 64 * 64);
  pdt_assert_close_f32(g, want, 64 * 64, 0);
  free(g);
  free(want);
  free(x);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

/* What a tape recorded stays allocated until the tape is deleted or its
 * session ends, even when the handles are gone. */
static void test_tape_memory(void **state) {
  env *e = *state;
  /* The baseline once earlier tests' last references are gone (they go a
   * moment after their ops finished): two equal readings 50 ms apart. */
  uint64_t base = mem_used(e), prev = UINT64_MAX;
  for (int i = 0; i < 100 && base != prev; i++) {
    usleep(50000);
    prev = base;
    base = mem_used(e);
  }
  const int64_t dx[1] = {1 << 16}; /* 256 KiB per device */
  float *x = malloc((size_t)dx[0] * sizeof(float));
  for (int64_t i = 0; i < dx[0]; i++) x[i] = (float)i;
  const uint64_t in[1] = {ID_X}, y[1] = {ID_Y}, sq[1] = {ID_SQ};
  const uint64_t per = (uint64_t)dx[0] * sizeof(float) * NDEV;
  for (int how = 0; how < 3; how++) { /* delete the tape, close, lease */
    pd_session *s = new_session(e, "memory", how == 2 ? 1 : 0, how != 2, 0);
    upload_f32(e, s, ID_X, dx, 1, x, pd_layout_mirrored());
    OK(e, pd_tape_start(s, 8, true, NULL, e->st));
    OK(e, pd_tape_watch(s, 8, in, 1, NULL, e->st));
    op1(e, s, "Exp", in, 1, NULL, ID_Y);
    op1(e, s, "Square", y, 1, NULL, ID_SQ);
    op1(e, s, "Sum", sq, 1, NULL, ID_LOSS);
    const uint64_t del[4] = {ID_X, ID_Y, ID_SQ, ID_LOSS};
    OK(e, pd_delete(s, del, 4, NULL, e->st));
    /* No handle left, but the tape holds x, exp(x), its square. */
    wait_mem(e, base + 3 * per + NDEV * sizeof(float));
    if (how == 0) {
      OK(e, pd_tape_delete(s, 8, NULL, e->st));
      wait_mem(e, base);
      OK(e, pd_session_close(s, NULL, e->st));
    } else if (how == 1) {
      OK(e, pd_session_close(s, NULL, e->st));
      wait_mem(e, base);
    } else {
      /* No keep-alive: the 1 s lease runs out and takes the tape. */
      wait_mem(e, base);
      EXPECT_CODE(e, PD_NOT_FOUND, pd_tape_delete(s, 8, NULL, e->st));
    }
    pd_session_delete(s);
  }
  free(x);
}

static void test_busy_seconds(void **state) {
  env *e = *state;
  pd_server_info *before = pd_client_get_server_info(e->c, NULL, e->st);
  assert_non_null(before);
  double t0 = pdt_now();
  pd_session *s = new_session(e, "busy", 0, true, 0);
  const int64_t dims[2] = {256, 256};
  float *a = malloc(256 * 256 * sizeof(float));
  for (int i = 0; i < 256 * 256; i++) a[i] = (float)(i % 13) * 0.01f;
  upload_f32(e, s, 1, dims, 2, a, pd_layout_mirrored());
  free(a);
  for (uint64_t i = 0; i < 20; i++) {
    const uint64_t in[2] = {1, 1};
    op1(e, s, "MatMul", in, 2, NULL, 100 + i);
  }
  OK(e, pd_sync(s, NULL, 0, NULL, NULL, e->st));
  pd_server_info *after = pd_client_get_server_info(e->c, NULL, e->st);
  double wall = pdt_now() - t0;
  assert_non_null(after);
  for (int d = 0; d < NDEV; d++) {
    double b = pd_server_info_device(before, d)->busy_seconds;
    double x = pd_server_info_device(after, d)->busy_seconds;
    /* 20 products of 256^3 multiply-adds took some time on every device,
     * and no more than the wall time that passed. */
    if (!(x > b) || x - b > wall + 1e-3)
      fail_msg("device %d: busy %.6f -> %.6f s over %.6f s of wall time", d, b,
               x, wall);
  }
  pd_server_info_delete(before);
  pd_server_info_delete(after);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PARADEVD\n", argv[0]);
    return 2;
  }
  paradevd_path = argv[1];
  signal(SIGPIPE, SIG_IGN);
  daemon_start(&D);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gradient_unary),
      cmocka_unit_test(test_persistent_and_no_path),
      cmocka_unit_test(test_sharded_allreduce),
      cmocka_unit_test(test_stream_items),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_quota),
      cmocka_unit_test(test_tape_memory),
      cmocka_unit_test(test_busy_seconds),
  };
  int failed = cmocka_run_group_tests_name("gradient tapes through paradevd",
                                           tests, setup, teardown);
  int rc = pdt_daemon_stop(&D);
  if (rc != 0) {
    fprintf(stderr, "paradevd exited with %d after SIGTERM; log:\n%s\n", rc,
            D.log ? D.log : "");
    failed++;
  }
  if (D.log &&
      (strstr(D.log, "AddressSanitizer") || strstr(D.log, "runtime error"))) {
    fprintf(stderr, "sanitizer report in the daemon's log:\n%s\n", D.log);
    failed++;
  }
  free(D.log);
  return failed ? 1 : 0;
}
