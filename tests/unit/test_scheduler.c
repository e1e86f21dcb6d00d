/* The scheduler on a real CPU engine, without gRPC: session tokens, handle
 * isolation, all-or-nothing execution, queueing, cancellation, leases,
 * quotas, and a multi-threaded stress run (meant for the sanitizer build).
 * Expected values are worked out by hand in each test. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler.h"
#include "testutil.h"

#define INC 0x1122334455667788ULL

static dev_engine *g_engine;

static sched *new_sched(uint32_t lease_check_ms, const sched_observer *obs) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = INC;
  cfg.lease_check_ms = lease_check_ms;
  cfg.max_handles_per_session = 100;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  if (obs) assert_true(sched_observer_add(s, obs) >= 0);
  return s;
}

static sched_session *open_new(sched *s, const char *name, uint32_t lease,
                               uint64_t quota, sched_session_info *info) {
  sched_session_params p = {name, "job", lease, quota, NULL, 0, 0, 0, NULL, NULL};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_create(s, &p, info, &st), PD_OK);
  sched_session *ss = NULL;
  assert_int_equal(
      sched_session_open(s, info->token, SCHED_TOKEN_BYTES, &ss, &st), PD_OK);
  return ss;
}

/* Uploads a mirrored float32 vector under `id`. */
static pd_code upload(sched_session *ss, uint64_t id, int n, const float *v,
                      dev_status *st) {
  dev_shape shape = {1, {n}};
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  sched_upload *u = NULL;
  pd_code c =
      sched_upload_begin(ss, id, PD_FLOAT32, &lay, &shape, NULL, &u, st);
  if (c != PD_OK) return c;
  assert_int_equal(sched_upload_expected(u, 0), (uint64_t)n * 4);
  assert_int_equal(sched_upload_write(u, 0, 0, v, (size_t)n * 4, st), PD_OK);
  return sched_upload_commit(u, st);
}

static sched_op op1(const char *name, const uint64_t *in, int nin,
                    const uint64_t *out) {
  sched_op o = {name, in, nin, NULL, 0, out, 1, 0, 0, NULL};
  return o;
}

static void read_f32(sched_session *ss, uint64_t id, float *out, int n) {
  dev_tensor *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_handle_get(ss, id, &t, &st), PD_OK);
  assert_int_equal(sched_tensor_wait(ss, t, &st), PD_OK);
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  assert_int_equal(dev_tensor_to_host(t, &lay, 0, out, (size_t)n * 4, &st),
                   PD_OK);
  dev_tensor_release(t);
}

static void test_tokens(void **state) {
  sched *s = new_sched(500, NULL);
  sched_session_info info;
  sched_session *ss = open_new(s, "a", 0, 0, &info);
  assert_int_equal(info.lease_s, 60);
  uint64_t inc = 0;
  for (int i = 0; i < 8; i++) inc |= (uint64_t)info.token[i] << (8 * i);
  assert_true(inc == INC);
  dev_status st = DEV_STATUS_INIT;
  sched_session *x = NULL;
  assert_int_equal(sched_session_open(s, info.token, 23, &x, &st),
                   PD_UNAUTHENTICATED);
  uint8_t tok[SCHED_TOKEN_BYTES];
  memcpy(tok, info.token, sizeof tok);
  tok[0] ^= 1; /* another incarnation */
  assert_int_equal(sched_session_open(s, tok, sizeof tok, &x, &st),
                   PD_NOT_FOUND);
  assert_non_null(strstr(st.msg, "restarted"));
  memcpy(tok, info.token, sizeof tok);
  tok[20] ^= 1; /* right incarnation, unknown session */
  assert_int_equal(sched_session_open(s, tok, sizeof tok, &x, &st),
                   PD_NOT_FOUND);
  assert_null(strstr(st.msg, "restarted"));
  sched_session_params p = {NULL, NULL, 86401, 0, NULL, 0, 0, 0, NULL, NULL};
  assert_int_equal(sched_session_create(s, &p, &info, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "max_lease_seconds"));
  uint64_t freed = 99;
  sched_session_info i2;
  sched_session *ss2 = open_new(s, "b", 0, 0, &i2);
  assert_int_equal(
      sched_session_close(s, i2.token, SCHED_TOKEN_BYTES, &freed, &st), PD_OK);
  assert_int_equal(freed, 0);
  assert_int_equal(sched_session_open(s, i2.token, SCHED_TOKEN_BYTES, &x, &st),
                   PD_NOT_FOUND);
  /* A call still holding the closed session gets NOT_FOUND, not a crash. */
  dev_tensor *t = NULL;
  assert_int_equal(sched_handle_get(ss2, 1, &t, &st), PD_NOT_FOUND);
  sched_session_put(ss2);
  assert_int_equal(sched_num_sessions(s), 1);
  sched_session_put(ss);
  sched_destroy(s);
}

static void test_isolation_and_execute(void **state) {
  sched *s = new_sched(500, NULL);
  sched_session_info ia, ib;
  sched_session *a = open_new(s, "a", 0, 0, &ia);
  sched_session *b = open_new(s, "b", 0, 0, &ib);
  dev_status st = DEV_STATUS_INIT;
  const float x[3] = {1.f, 2.f, -4.f};
  assert_int_equal(upload(a, 1, 3, x, &st), PD_OK);
  assert_int_equal(upload(a, 1, 3, x, &st), PD_ALREADY_EXISTS);
  assert_int_equal(upload(a, 0, 3, x, &st), PD_INVALID_ARGUMENT);
  /* b cannot see a's handle; the message is that of a never-seen id. */
  dev_tensor *t = NULL;
  char m1[DEV_STATUS_MSG_MAX], m2[DEV_STATUS_MSG_MAX];
  assert_int_equal(sched_handle_get(b, 1, &t, &st), PD_NOT_FOUND);
  snprintf(m1, sizeof m1, "%s", st.msg);
  assert_int_equal(sched_handle_get(b, 2, &t, &st), PD_NOT_FOUND);
  snprintf(m2, sizeof m2, "%s", st.msg);
  m1[strcspn(m1, "0123456789")] = '\0';
  m2[strcspn(m2, "0123456789")] = '\0';
  assert_string_equal(m1, m2);

  /* Chained ops in one request: y = x + x; z = y * x = 2x^2. */
  uint64_t in_xx[2] = {1, 1}, in_yx[2] = {2, 1}, o2 = 2, o3 = 3;
  sched_op ops[2] = {op1("Add", in_xx, 2, &o2), op1("Mul", in_yx, 2, &o3)};
  sched_op_result res[2];
  int failed = -1;
  assert_int_equal(sched_execute(a, ops, 2, 0, res, &failed, &st), PD_OK);
  assert_int_equal(res[1].num_outputs, 1);
  assert_int_equal(res[1].dtype[0], PD_FLOAT32);
  tu_assert_shape(&res[1].shape[0], 1, 3);
  float z[3];
  read_f32(a, 3, z, 3);
  assert_true(z[0] == 2.f && z[1] == 8.f && z[2] == 32.f);

  /* All or nothing: op 1 names a missing input, so op 0's output 4 must not
   * appear. */
  uint64_t o4 = 4, o5 = 5, in_missing[2] = {1, 77};
  sched_op bad[2] = {op1("Neg", in_xx, 1, &o4), op1("Add", in_missing, 2, &o5)};
  assert_int_equal(sched_execute(a, bad, 2, 0, res, &failed, &st),
                   PD_NOT_FOUND);
  assert_int_equal(failed, 1);
  assert_non_null(strstr(st.msg, "op 1 (Add)"));
  assert_int_equal(sched_handle_get(a, 4, &t, &st), PD_NOT_FOUND);
  /* b cannot use a's handle as an input either. */
  assert_int_equal(sched_execute(b, ops, 1, 0, res, &failed, &st),
                   PD_NOT_FOUND);
  /* An output id that is live. */
  sched_op dup = op1("Neg", in_xx, 1, &o2);
  assert_int_equal(sched_execute(a, &dup, 1, 0, res, &failed, &st),
                   PD_ALREADY_EXISTS);
  /* Delete is all or nothing too. */
  uint64_t del_bad[2] = {2, 99}, del[2] = {2, 3};
  assert_int_equal(sched_handle_delete(a, del_bad, 2, &st), PD_NOT_FOUND);
  int nh = 0;
  sched_session_usage(a, &nh, NULL);
  assert_int_equal(nh, 3);
  assert_int_equal(sched_handle_delete(a, del, 2, &st), PD_OK);
  sched_session_usage(a, &nh, NULL);
  assert_int_equal(nh, 1);
  sched_session_put(a);
  sched_session_put(b);
  sched_destroy(s);
}

/* An op of two outputs alone in a call (the shape of every streamed op):
 * both outputs are published with their metadata, and a later call can use
 * the second. SparseSoftmaxCrossEntropyWithLogits of rows of equal logits
 * over 3 classes: softmax = 1/3 each, so loss = ln 3 per row and backprop =
 * 1/3 minus 1 at the label. */
static void test_two_outputs(void **state) {
  sched *s = new_sched(500, NULL);
  sched_session_info ia;
  sched_session *a = open_new(s, "a", 0, 0, &ia);
  dev_status st = DEV_STATUS_INIT;
  const float feat[6] = {0.f, 0.f, 0.f, 1.f, 1.f, 1.f};
  const int32_t labels[2] = {1, 0};
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_shape fshape = {2, {2, 3}}, lshape = {1, {2}};
  sched_upload *u = NULL;
  assert_int_equal(
      sched_upload_begin(a, 1, PD_FLOAT32, &lay, &fshape, NULL, &u, &st),
      PD_OK);
  assert_int_equal(sched_upload_write(u, 0, 0, feat, sizeof feat, &st), PD_OK);
  assert_int_equal(sched_upload_commit(u, &st), PD_OK);
  assert_int_equal(
      sched_upload_begin(a, 2, PD_INT32, &lay, &lshape, NULL, &u, &st), PD_OK);
  assert_int_equal(sched_upload_write(u, 0, 0, labels, sizeof labels, &st),
                   PD_OK);
  assert_int_equal(sched_upload_commit(u, &st), PD_OK);

  const uint64_t in[2] = {1, 2}, outs[2] = {10, 11};
  sched_op op = {
      "SparseSoftmaxCrossEntropyWithLogits", in, 2, NULL, 0, outs, 2, 0, 0, NULL};
  sched_op_result res;
  int failed = -1;
  assert_int_equal(sched_execute(a, &op, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(res.num_outputs, 2);
  assert_int_equal(res.dtype[0], PD_FLOAT32);
  assert_int_equal(res.dtype[1], PD_FLOAT32);
  tu_assert_shape(&res.shape[0], 1, 2);
  tu_assert_shape(&res.shape[1], 2, 2, 3);
  /* The second output feeds a call of its own: n = -backprop. */
  const uint64_t in_n[1] = {11}, o_n = 12;
  sched_op neg = op1("Neg", in_n, 1, &o_n);
  assert_int_equal(sched_execute(a, &neg, 1, 0, &res, &failed, &st), PD_OK);
  const double third = 1.0 / 3.0, ln3 = 1.0986122886681098;
  const double want_loss[2] = {ln3, ln3};
  const double want_neg[6] = {-third,    1 - third, -third,
                              1 - third, -third,    -third};
  float loss[2], n[6];
  read_f32(a, 10, loss, 2);
  read_f32(a, 12, n, 6);
  for (int i = 0; i < 2; i++)
    assert_true(fabs(loss[i] - want_loss[i]) <= 1e-6 * ln3);
  for (int i = 0; i < 6; i++) assert_true(fabs(n[i] - want_neg[i]) <= 1e-6);

  /* One output id for two outputs: refused, and nothing is published. */
  const uint64_t one_out = 20;
  sched_op short_op = {
      "SparseSoftmaxCrossEntropyWithLogits", in, 2, NULL, 0, &one_out, 1, 0, 0,
      NULL};
  assert_int_equal(sched_execute(a, &short_op, 1, 0, &res, &failed, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(failed, 0);
  assert_non_null(strstr(st.msg, "the op has 2 outputs; the request names 1"));
  dev_tensor *t = NULL;
  assert_int_equal(sched_handle_get(a, 20, &t, &st), PD_NOT_FOUND);
  int nh = 0;
  sched_session_usage(a, &nh, NULL);
  assert_int_equal(nh, 5); /* 1, 2, 10, 11, 12 */
  sched_session_put(a);
  sched_destroy(s);
}

static void test_queue_cancel(void **state) {
  sched *s = new_sched(500, NULL);
  sched_session_info ia;
  sched_session *a = open_new(s, "a", 0, 0, &ia);
  dev_status st = DEV_STATUS_INIT;
  const float x[2] = {3.f, -1.f};
  assert_int_equal(upload(a, 1, 2, x, &st), PD_OK);
  sched_pause(s, true);
  uint64_t in1 = 1, o10 = 10, o11 = 11, o12 = 12;
  sched_op neg10 = op1("Neg", &in1, 1, &o10);
  sched_op neg11 = op1("Neg", &o10, 1, &o11); /* consumes a cancelled op */
  sched_op neg12 = op1("Neg", &in1, 1, &o12);
  sched_op_result res;
  int failed;
  assert_int_equal(sched_execute(a, &neg10, 1, 7, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_execute(a, &neg11, 1, 8, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_execute(a, &neg12, 1, 7, &res, &failed, &st), PD_OK);
  dev_tensor *t = NULL;
  assert_int_equal(sched_handle_get(a, 11, &t, &st), PD_OK);
  assert_false(dev_tensor_is_ready(t)); /* still queued */
  assert_int_equal(sched_cancel(a, 7), 2);
  assert_int_equal(sched_cancel(a, 7), 0);
  sched_pause(s, false);
  dev_status err = DEV_STATUS_INIT;
  uint64_t failed_id = 0;
  assert_int_equal(sched_sync(a, NULL, 0, &err, &failed_id, &st), PD_OK);
  assert_int_equal(err.code, PD_CANCELLED);
  assert_true(failed_id == 10 || failed_id == 11 || failed_id == 12);
  /* 11 ran on a cancelled input: it carries the CANCELLED error too. */
  assert_int_equal(sched_tensor_wait(a, t, &st), PD_CANCELLED);
  dev_tensor_release(t);
  /* Closing a session with ops still queued drops them (no leak). */
  sched_pause(s, true);
  uint64_t o13 = 13;
  sched_op neg13 = op1("Neg", &in1, 1, &o13);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(sched_execute(a, &neg13, 1, 0, &res, &failed, &st), PD_OK);
    assert_int_equal(sched_handle_delete(a, &o13, 1, &st), PD_OK);
  }
  uint64_t freed = 0;
  assert_int_equal(
      sched_session_close(s, ia.token, SCHED_TOKEN_BYTES, &freed, &st), PD_OK);
  assert_int_equal(freed, 4); /* 1, 10, 11, 12 */
  sched_pause(s, false);
  sched_session_put(a);
  sched_destroy(s);
}

/* Deadlines (issue #15): ops held in the queue (dispatcher paused) past
 * their deadline fail with DEADLINE_EXCEEDED without a dispatcher turn (the
 * lease thread's timer), their consumers fail with the same error once they
 * run, ops without a deadline are untouched and the session goes on. The
 * waits below end only through the timer, so no timing is asserted. */
static void test_deadlines(void **state) {
  sched *s = new_sched(60000, NULL); /* the lease check never fires here */
  sched_session_info ia;
  sched_session *a = open_new(s, "a", 0, 0, &ia);
  dev_status st = DEV_STATUS_INIT;
  const float x[2] = {3.f, -1.f};
  assert_int_equal(upload(a, 1, 2, x, &st), PD_OK);
  sched_pause(s, true);
  uint64_t in1 = 1, o10 = 10, o11 = 11, o12 = 12;
  sched_op neg10 = op1("Neg", &in1, 1, &o10);
  neg10.timeout_ms = 20;
  sched_op neg11 = op1("Neg", &o10, 1, &o11); /* no deadline: a consumer */
  sched_op neg12 = op1("Neg", &in1, 1, &o12); /* no deadline */
  sched_op_result res;
  int failed;
  assert_int_equal(sched_execute(a, &neg10, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_execute(a, &neg11, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_execute(a, &neg12, 1, 0, &res, &failed, &st), PD_OK);
  dev_tensor *t10 = NULL, *t11 = NULL;
  assert_int_equal(sched_handle_get(a, 10, &t10, &st), PD_OK);
  assert_int_equal(sched_handle_get(a, 11, &t11, &st), PD_OK);
  /* The dispatcher is paused: only the timer can end this wait. */
  assert_int_equal(sched_tensor_wait(a, t10, &st), PD_DEADLINE_EXCEEDED);
  assert_non_null(strstr(st.msg, "Neg (op 1 of its session) was not started"));
  assert_non_null(strstr(st.msg, "20.0 ms after it was queued"));
  assert_non_null(strstr(st.msg, "the op's own timeout_ms"));
  assert_non_null(strstr(st.msg, "ms in the queue"));
  assert_false(dev_tensor_is_ready(t11)); /* still queued, no deadline */
  sched_stats ss0;
  memset(&ss0, 0, sizeof ss0);
  ss0.struct_size = sizeof ss0;
  sched_get_stats(s, &ss0);
  assert_int_equal(ss0.ops_expired, 1);
  assert_int_equal(ss0.ops_queued, 2);
  sched_pause(s, false);
  dev_status e11 = DEV_STATUS_INIT;
  assert_int_equal(sched_tensor_wait(a, t11, &e11), PD_DEADLINE_EXCEEDED);
  assert_non_null(strstr(e11.msg, "Neg (op 1 of its session)"));
  float y[2];
  read_f32(a, 12, y, 2);
  assert_true(y[0] == -3.f && y[1] == 1.f);
  dev_tensor_release(t10);
  dev_tensor_release(t11);

  /* A call's absolute deadline that comes before the timeout wins; an op
   * queued behind the expired one (same deadline) fails with its own. */
  sched_pause(s, true);
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  uint64_t in11[2] = {1, 1}, o20 = 20, o21 = 21, o22 = 22;
  sched_op add20 = op1("Add", in11, 2, &o20);
  add20.deadline_ns = (uint64_t)now.tv_sec * 1000000000u +
                      (uint64_t)now.tv_nsec + 10000000u; /* 10 ms */
  add20.timeout_ms = 600000;
  sched_op mul21 = op1("Mul", (uint64_t[]){20, 1}, 2, &o21);
  mul21.deadline_ns = add20.deadline_ns;
  sched_op add22 = op1("Add", in11, 2, &o22);
  assert_int_equal(sched_execute(a, &add20, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_execute(a, &mul21, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_execute(a, &add22, 1, 0, &res, &failed, &st), PD_OK);
  dev_tensor *t21 = NULL;
  assert_int_equal(sched_handle_get(a, 21, &t21, &st), PD_OK);
  assert_int_equal(sched_tensor_wait(a, t21, &st), PD_DEADLINE_EXCEEDED);
  assert_non_null(strstr(st.msg, "Mul (op 5 of its session)"));
  assert_non_null(strstr(st.msg, "the deadline of the call that queued it"));
  dev_tensor_release(t21);
  sched_pause(s, false);
  read_f32(a, 22, y, 2);
  assert_true(y[0] == 6.f && y[1] == -2.f);
  dev_status err = DEV_STATUS_INIT;
  uint64_t failed_id = 0;
  assert_int_equal(sched_sync(a, &o20, 1, &err, &failed_id, &st), PD_OK);
  assert_int_equal(err.code, PD_DEADLINE_EXCEEDED);
  assert_true(failed_id == 20);
  sched_session_put(a);

  /* The session's default: every op of it gets op_timeout_ms; an op
   * submitted in time is not touched, and the session goes on. */
  sched_session_params p = {"b", NULL, 0, 0, NULL, 0, 0, 15, NULL, NULL};
  sched_session_info ib;
  assert_int_equal(sched_session_create(s, &p, &ib, &st), PD_OK);
  sched_session *b = NULL;
  assert_int_equal(sched_session_open(s, ib.token, SCHED_TOKEN_BYTES, &b, &st),
                   PD_OK);
  assert_int_equal(sched_session_op_timeout_ms(b), 15);
  assert_int_equal(upload(b, 1, 2, x, &st), PD_OK);
  sched_op neg30 = op1("Neg", &in1, 1, (uint64_t[]){30});
  assert_int_equal(sched_execute(b, &neg30, 1, 0, &res, &failed, &st), PD_OK);
  read_f32(b, 30, y, 2); /* dispatched at once: well within 15 ms... */
  assert_true(y[0] == -3.f && y[1] == 1.f);
  sched_pause(s, true); /* ...but not while the dispatcher is held */
  sched_op neg31 = op1("Neg", (uint64_t[]){30}, 1, (uint64_t[]){31});
  assert_int_equal(sched_execute(b, &neg31, 1, 0, &res, &failed, &st), PD_OK);
  dev_tensor *t31 = NULL;
  assert_int_equal(sched_handle_get(b, 31, &t31, &st), PD_OK);
  assert_int_equal(sched_tensor_wait(b, t31, &st), PD_DEADLINE_EXCEEDED);
  assert_non_null(strstr(st.msg, "the session's op_timeout_ms"));
  dev_tensor_release(t31);
  sched_pause(s, false);
  sched_op neg32 = op1("Neg", (uint64_t[]){30}, 1, (uint64_t[]){32});
  assert_int_equal(sched_execute(b, &neg32, 1, 0, &res, &failed, &st), PD_OK);
  read_f32(b, 32, y, 2);
  assert_true(y[0] == 3.f && y[1] == -1.f);
  sched_session_put(b);
  sched_destroy(s);
}

static atomic_int g_expired;

static void on_expired(void *arg, const sched_end_info *info, void *state) {
  if (info->why == SCHED_END_STOPPED)
    return; /* the "quota" session, at the end */
  assert_int_equal(info->why, SCHED_END_EXPIRED);
  assert_string_equal(info->client, "short");
  assert_int_equal(info->handles_freed, 1);
  assert_null(state);
  atomic_fetch_add(&g_expired, 1);
}

static void test_lease_and_quota(void **state) {
  const sched_observer obs = {.name = "test", .on_end = on_expired};
  sched *s = new_sched(20, &obs);
  sched_session_info i1, i2;
  sched_session *a = open_new(s, "short", 1, 0, &i1);
  dev_status st = DEV_STATUS_INIT;
  const float x[4] = {1, 2, 3, 4};
  assert_int_equal(upload(a, 1, 4, x, &st), PD_OK);
  sched_session_put(a);
  dev_memory_stats ms = {.struct_size = sizeof ms};
  assert_int_equal(dev_engine_memory_stats(g_engine, 0, &ms, &st), PD_OK);
  uint64_t held = ms.bytes_in_use;
  assert_true(held >= 16);
  /* The lease is 1 s; wait for the lease thread (up to 60 s: a hang, not a
   * timing assumption). */
  for (int i = 0; i < 6000 && atomic_load(&g_expired) == 0; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(atomic_load(&g_expired), 1);
  sched_session *x2 = NULL;
  assert_int_equal(sched_session_open(s, i1.token, SCHED_TOKEN_BYTES, &x2, &st),
                   PD_NOT_FOUND);
  assert_int_equal(dev_engine_memory_stats(g_engine, 0, &ms, &st), PD_OK);
  assert_int_equal(ms.bytes_in_use, held - 16);

  /* Quota: 2 devices x 16 bytes per 4-float tensor; 100 bytes hold 3. */
  sched_session *q = open_new(s, "quota", 0, 100, &i2);
  assert_int_equal(upload(q, 1, 4, x, &st), PD_OK);
  uint64_t in[2] = {1, 1}, o2 = 2, o3 = 3, o4 = 4;
  sched_op ops[3] = {op1("Add", in, 2, &o2), op1("Add", in, 2, &o3),
                     op1("Add", in, 2, &o4)};
  sched_op_result res[3];
  int failed;
  assert_int_equal(sched_execute(q, ops, 3, 0, res, &failed, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "quota 100"));
  assert_int_equal(sched_execute(q, ops, 2, 0, res, &failed, &st), PD_OK);
  assert_int_equal(upload(q, 9, 4, x, &st), PD_RESOURCE_EXHAUSTED);
  uint64_t bytes = 0;
  sched_session_usage(q, NULL, &bytes);
  assert_int_equal(bytes, 96);
  sched_session_put(q);
  sched_destroy(s);
}

/* A function call is charged what it holds while it runs (dev_op_new_bytes:
 * its intermediates, with buffer planning on or off) and, after it, its
 * outputs. hog(x) = Sum(Exp(Neg(x))) over x of 4096 floats mirrored on 2
 * devices (32768 bytes held): two intermediates of 16384 bytes per device
 * (planned: both live at Exp's step, so the arena is as large), 65536 in
 * all, plus 8 bytes of output: over a 65536-byte quota. */
static void test_function_quota(void **state) {
  (void)state;
  sched *s = new_sched(500, NULL);
  float x[4096];
  for (int i = 0; i < 4096; i++) x[i] = 0;
  const char *in_a[1] = {"x"}, *in_b[1] = {"a"}, *in_s[1] = {"b"};
  dev_fn_node nodes[3] = {
      {.name = "a", .op = "Neg", .inputs = in_a, .num_inputs = 1},
      {.name = "b", .op = "Exp", .inputs = in_b, .num_inputs = 1},
      {.name = "s", .op = "Sum", .inputs = in_s, .num_inputs = 1}};
  dev_fn_arg arg = {"x", PD_FLOAT32};
  dev_fn_output out = {"s", "s"};
  for (int plan = 0; plan < 2; plan++) {
    for (int quota = 0; quota < 2; quota++) {
      sched_session_info info;
      sched_session *ss = open_new(s, "fq", 0, quota ? 65536 : 0, &info);
      dev_status st = DEV_STATUS_INIT;
      assert_int_equal(upload(ss, 1, 4096, x, &st), PD_OK);
      dev_fn_def def = DEV_FN_DEF_INITIALIZER;
      def.name = "hog";
      def.args = &arg;
      def.num_args = 1;
      def.nodes = nodes;
      def.num_nodes = 3;
      def.outputs = &out;
      def.num_outputs = 1;
      dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
      o.passes[DEV_PASS_FUSION] = DEV_TRI_OFF;
      o.passes[DEV_PASS_BUFFER_PLANNING] = plan ? DEV_TRI_ON : DEV_TRI_OFF;
      bool existed;
      if (sched_register_function(ss, &def, &o, &existed, &st) != PD_OK)
        fail_msg("register: %s", st.msg);
      uint64_t in = 1, o2 = 2;
      sched_op op = op1("hog", &in, 1, &o2);
      sched_op_result res;
      int failed;
      pd_code c = sched_execute(ss, &op, 1, 0, &res, &failed, &st);
      uint64_t bytes = 0;
      if (quota) {
        assert_int_equal(c, PD_RESOURCE_EXHAUSTED);
        if (!strstr(st.msg, "32768 bytes held + 65544 new > quota 65536") ||
            !strstr(st.msg, "function 'hog'") ||
            !strstr(st.msg, "65536 bytes of intermediates"))
          fail_msg("planning %d: %s", plan, st.msg);
      } else {
        if (c != PD_OK) fail_msg("planning %d: %s", plan, st.msg);
        float got[1];
        read_f32(ss, 2, got, 1);
        assert_true(got[0] == 4096.0f);
        /* The output is charged once the call is queued (4 bytes on each
         * device), the intermediates not. */
        sched_session_usage(ss, NULL, &bytes);
        assert_int_equal(bytes, 32768 + 8);
      }
      sched_session_put(ss);
    }
  }
  sched_destroy(s);
}

static void test_limits(void **state) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = INC;
  cfg.max_sessions = 2;
  cfg.max_handles_per_session = 5;
  cfg.max_ops_per_request = 3;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  sched_session_info i1, i2, i3;
  sched_session *a = open_new(s, "a", 0, 0, &i1);
  sched_session *b = open_new(s, "b", 0, 0, &i2);
  sched_session_params p = {"c", NULL, 0, 0, NULL, 0, 0, 0, NULL, NULL};
  assert_int_equal(sched_session_create(s, &p, &i3, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "max_sessions = 2"));
  char longname[SCHED_NAME_MAX + 2];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  p.client_name = longname;
  assert_int_equal(sched_session_create(s, &p, &i3, &st), PD_INVALID_ARGUMENT);
  const float x[1] = {1};
  for (uint64_t id = 1; id <= 5; id++)
    assert_int_equal(upload(a, id, 1, x, &st), PD_OK);
  assert_int_equal(upload(a, 6, 1, x, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "max_handles_per_session is 5"));
  uint64_t in = 1, o[4] = {7, 8, 9, 10};
  sched_op ops[4] = {op1("Neg", &in, 1, &o[0]), op1("Neg", &in, 1, &o[1]),
                     op1("Neg", &in, 1, &o[2]), op1("Neg", &in, 1, &o[3])};
  sched_op_result res[4];
  int failed;
  assert_int_equal(sched_execute(a, ops, 4, 0, res, &failed, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "max_ops_per_request = 3"));
  assert_int_equal(sched_execute(a, ops, 1, 0, res, &failed, &st),
                   PD_RESOURCE_EXHAUSTED);
  uint64_t del = 5;
  assert_int_equal(sched_handle_delete(a, &del, 1, &st), PD_OK);
  assert_int_equal(sched_execute(a, ops, 1, 0, res, &failed, &st), PD_OK);
  sched_session_put(a);
  sched_session_put(b);
  sched_destroy(s);
}

static void on_fence(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  (void)code;
  atomic_store((atomic_bool *)arg, true);
}

/* Waits until everything submitted so far ran and released what it used
 * (sched_fence). */
static void fence_wait(sched *s) {
  atomic_bool done;
  atomic_init(&done, false);
  assert_int_equal(sched_fence(s, on_fence, &done, NULL), PD_OK);
  while (!atomic_load(&done)) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* Device memory in use, summed over the engine's devices. */
static uint64_t engine_bytes(void) {
  uint64_t sum = 0;
  for (int d = 0; d < dev_engine_num_devices(g_engine); d++) {
    dev_memory_stats ms = {.struct_size = sizeof(ms)};
    assert_int_equal(dev_engine_memory_stats(g_engine, d, &ms, NULL), PD_OK);
    sum += ms.bytes_in_use;
  }
  return sum;
}

/* Gradient tapes in the scheduler: gradient ops queue behind forward ops
 * that have not reached the devices (the dispatcher is held), their results
 * are published at once with dtype and shape, they are cancelled by tag,
 * counted against max_queued_ops, and a killed session's tapes are freed.
 * x = [3, -1]; d sum(x^2) / dx = 2x = [6, -2]. */
static void test_tapes(void **state) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = INC;
  cfg.max_queued_ops = 6;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  fence_wait(s);
  uint64_t base = engine_bytes();
  sched_session_info ia;
  sched_session *a = open_new(s, "a", 0, 0, &ia);
  const float x[2] = {3.f, -1.f};
  assert_int_equal(upload(a, 1, 2, x, &st), PD_OK);
  assert_int_equal(sched_tape_start(a, 100, false, &st), PD_OK);
  assert_int_equal(sched_tape_start(a, 100, true, &st), PD_ALREADY_EXISTS);
  uint64_t in1 = 1;
  assert_int_equal(sched_tape_watch(a, 100, &in1, 1, &st), PD_OK);
  sched_pause(s, true);
  uint64_t o10 = 10, o11 = 11;
  sched_op sq = op1("Square", &in1, 1, &o10), sum = op1("Sum", &o10, 1, &o11);
  sched_op_result res;
  int failed;
  assert_int_equal(sched_execute(a, &sq, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_execute(a, &sum, 1, 0, &res, &failed, &st), PD_OK);
  /* 2 queued; the gradient's 5 ops (ones, broadcast, 2, 2x, dy*2x) would
   * make 7 > max_queued_ops = 6. */
  uint64_t r20 = 20;
  sched_gradient g = {100, 11, &in1, 1, 0, &r20, 1};
  pd_dtype dt;
  dev_shape shape;
  assert_int_equal(sched_tape_gradient(a, &g, 0, &dt, &shape, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "max_queued_ops"));
  sched_pause(s, false);
  dev_tensor *t = NULL;
  assert_int_equal(sched_handle_get(a, 11, &t, &st), PD_OK);
  assert_int_equal(sched_tensor_wait(a, t, &st), PD_OK);
  dev_tensor_release(t);
  /* Queue empty again (the ops of the failed gradient ran and are gone):
   * now held, the gradient queues behind nothing that ran yet. */
  sched_pause(s, true);
  assert_int_equal(sched_execute(a, &sq, 1, 0, &res, &failed, &st),
                   PD_ALREADY_EXISTS); /* 10 is live */
  assert_int_equal(sched_tape_gradient(a, &g, 0, &dt, &shape, &st), PD_OK);
  assert_int_equal(dt, PD_FLOAT32);
  assert_int_equal(shape.rank, 1);
  assert_int_equal(shape.dims[0], 2);
  assert_int_equal(sched_handle_get(a, 20, &t, &st), PD_OK);
  assert_false(dev_tensor_is_ready(t)); /* queued, not run */
  dev_tensor_release(t);
  sched_pause(s, false);
  float gx[2];
  read_f32(a, 20, gx, 2);
  assert_true(gx[0] == 6.f && gx[1] == -2.f);
  /* One-shot: used. */
  uint64_t r21 = 21;
  sched_gradient g2 = {100, 11, &in1, 1, 0, &r21, 1};
  assert_int_equal(sched_tape_gradient(a, &g2, 0, &dt, &shape, &st),
                   PD_FAILED_PRECONDITION);
  /* A persistent tape's gradient cancelled by its tag before it ran. */
  assert_int_equal(sched_tape_start(a, 200, true, &st), PD_OK);
  assert_int_equal(sched_tape_watch(a, 200, &in1, 1, &st), PD_OK);
  uint64_t o30 = 30, o31 = 31;
  sched_op sq2 = op1("Square", &in1, 1, &o30), sum2 = op1("Sum", &o30, 1, &o31);
  assert_int_equal(sched_execute(a, &sq2, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_execute(a, &sum2, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_handle_get(a, 31, &t, &st), PD_OK);
  assert_int_equal(sched_tensor_wait(a, t, &st), PD_OK); /* queue empty */
  dev_tensor_release(t);
  sched_pause(s, true);
  sched_gradient g3 = {200, 31, &in1, 1, 0, &r21, 1};
  assert_int_equal(sched_tape_gradient(a, &g3, 9, &dt, &shape, &st), PD_OK);
  assert_int_equal(sched_cancel(a, 9), 5);
  sched_pause(s, false);
  assert_int_equal(sched_handle_get(a, 21, &t, &st), PD_OK);
  assert_int_equal(sched_tensor_wait(a, t, &st), PD_CANCELLED);
  dev_tensor_release(t);
  /* Handles deleted, the tapes still hold x, x^2, sum: memory stays until
   * the session is killed. */
  const uint64_t all[7] = {1, 10, 11, 20, 21, 30, 31};
  assert_int_equal(sched_handle_delete(a, all, 7, &st), PD_OK);
  fence_wait(s);
  assert_true(engine_bytes() > base);
  sched_kill_target kt = {NULL, 0, NULL, ia.seq};
  sched_kill_result kr;
  assert_int_equal(sched_kill(s, &kt, &kr, &st), PD_OK);
  fence_wait(s);
  assert_int_equal(engine_bytes(), base);
  assert_int_equal(sched_tape_delete(a, 200, &st), PD_NOT_FOUND);
  sched_session_put(a);
  sched_destroy(s);
}

/* Session ends as events: two observers each hear every end once, with the
 * reason and the state attached under their own key. */
typedef struct end_rec {
  uint64_t seq;
  sched_end_reason why;
  uint64_t handles;
  void *state;
  char client[32], job[32];
  uint64_t queued; /* the scheduler's queued ops when it was called */
} end_rec;

typedef struct end_log {
  sched *s; /* when set, the callback reads the counters (takes the
             * scheduler's locks: none may be held) */
  pthread_mutex_t mu;
  int n;
  end_rec recs[16];
} end_log;

static void on_end_rec(void *arg, const sched_end_info *info, void *state) {
  end_log *l = arg;
  uint64_t queued = 0;
  if (l->s) {
    sched_stats a = {.struct_size = sizeof(a)};
    sched_get_stats(l->s, &a);
    queued = a.ops_queued;
  }
  pthread_mutex_lock(&l->mu);
  assert_true(l->n < 16);
  end_rec *r = &l->recs[l->n++];
  r->seq = info->session_seq;
  r->why = info->why;
  r->handles = info->handles_freed;
  r->state = state;
  snprintf(r->client, sizeof r->client, "%s", info->client);
  snprintf(r->job, sizeof r->job, "%s", info->job_id);
  r->queued = queued;
  pthread_mutex_unlock(&l->mu);
}

static int end_count(end_log *l) {
  pthread_mutex_lock(&l->mu);
  int n = l->n;
  pthread_mutex_unlock(&l->mu);
  return n;
}

/* A copy of the one record of session `seq` in `l` (asserts there is
 * exactly one). */
static end_rec end_find(end_log *l, uint64_t seq) {
  pthread_mutex_lock(&l->mu);
  int found = -1;
  for (int i = 0; i < l->n; i++) {
    if (l->recs[i].seq != seq) continue;
    assert_int_equal(found, -1);
    found = i;
  }
  assert_true(found >= 0);
  end_rec r = l->recs[found];
  pthread_mutex_unlock(&l->mu);
  return r;
}

static void test_session_end_events(void **state) {
  sched *s = new_sched(20, NULL);
  end_log la = {s, PTHREAD_MUTEX_INITIALIZER, 0, {{0}}};
  end_log lb = {NULL, PTHREAD_MUTEX_INITIALIZER, 0, {{0}}};
  sched_observer oa = {"a", on_end_rec, &la}, ob = {"b", on_end_rec, &lb};
  int ka = sched_observer_add(s, &oa), kb = sched_observer_add(s, &ob);
  assert_int_equal(ka, 0);
  assert_int_equal(kb, 1);
  int sa = 0, sb = 0, sc = 0, sd = 0; /* the states: their addresses */
  dev_status st = DEV_STATUS_INIT;
  sched_session_info ic, ie, ik, is;
  sched_session *c = open_new(s, "closer", 0, 0, &ic);
  sched_session *k = open_new(s, "victim", 0, 0, &ik);
  sched_session *d = open_new(s, "left", 0, 0, &is);
  /* Keys: bad ones, a double attach, and what comes back. */
  assert_int_equal(sched_session_attach(c, -1, &sa, &st), PD_INVALID_ARGUMENT);
  assert_int_equal(sched_session_attach(c, 2, &sa, &st), PD_INVALID_ARGUMENT);
  assert_int_equal(sched_session_attach(c, SCHED_MAX_OBSERVERS, &sa, &st),
                   PD_INVALID_ARGUMENT);
  assert_null(sched_session_attached(c, ka));
  assert_int_equal(sched_session_attach(c, ka, &sa, &st), PD_OK);
  assert_int_equal(sched_session_attach(c, ka, &sb, &st), PD_ALREADY_EXISTS);
  assert_ptr_equal(sched_session_attached(c, ka), &sa);
  assert_null(sched_session_attached(c, kb));
  assert_null(sched_session_attached(c, -1));
  assert_int_equal(sched_session_attach(k, ka, &sc, &st), PD_OK);
  assert_int_equal(sched_session_attach(k, kb, &sd, &st), PD_OK);
  assert_ptr_equal(sched_session_attached(k, kb), &sd);
  const float x[2] = {1, 2};
  assert_int_equal(upload(c, 1, 2, x, &st), PD_OK);
  assert_int_equal(upload(c, 2, 2, x, &st), PD_OK);
  assert_int_equal(upload(k, 1, 2, x, &st), PD_OK);
  /* The short-lived session last, so its lease (1 s) runs from here. */
  sched_session *e = open_new(s, "short", 1, 0, &ie);
  assert_int_equal(sched_session_attach(e, kb, &sb, &st), PD_OK);
  assert_int_equal(upload(e, 1, 2, x, &st), PD_OK);
  sched_session_put(e); /* so that its lease can run out */

  /* Ops queued on the closing session (the dispatcher held) are dropped
   * before the observers hear of the end. */
  sched_pause(s, true);
  uint64_t in_c[2] = {1, 2}, o_c[3] = {10, 11, 12};
  for (int i = 0; i < 3; i++) {
    sched_op o = op1("Add", in_c, 2, &o_c[i]);
    sched_op_result res;
    int failed = -1;
    assert_int_equal(sched_execute(c, &o, 1, 0, &res, &failed, &st), PD_OK);
  }
  sched_stats stq = {.struct_size = sizeof(stq)};
  sched_get_stats(s, &stq);
  assert_int_equal(stq.ops_queued, 3);
  /* Close: heard at once, on this thread (the short lease may have run out
   * meanwhile on a slow machine, so records are looked up by session). */
  uint64_t freed = 0;
  assert_int_equal(
      sched_session_close(s, ic.token, SCHED_TOKEN_BYTES, &freed, &st), PD_OK);
  assert_int_equal(freed, 5);
  sched_pause(s, false);
  end_rec r = end_find(&la, ic.seq);
  assert_int_equal(r.why, SCHED_END_CLOSED);
  assert_int_equal(r.handles, 5);
  assert_int_equal(r.queued, 0);
  assert_ptr_equal(r.state, &sa);
  assert_string_equal(r.client, "closer");
  assert_string_equal(r.job, "job");
  r = end_find(&lb, ic.seq);
  assert_int_equal(r.why, SCHED_END_CLOSED);
  assert_null(r.state);
  /* After the end: nothing attaches, nothing is attached. */
  assert_int_equal(sched_session_attach(c, kb, &sb, &st),
                   PD_FAILED_PRECONDITION);
  assert_null(sched_session_attached(c, ka));
  sched_session_put(c);

  /* Kill. */
  sched_kill_target kt = {NULL, 0, NULL, ik.seq};
  sched_kill_result kr;
  assert_int_equal(sched_kill(s, &kt, &kr, &st), PD_OK);
  r = end_find(&la, ik.seq);
  assert_int_equal(r.why, SCHED_END_KILLED);
  assert_int_equal(r.handles, 1);
  assert_ptr_equal(r.state, &sc);
  r = end_find(&lb, ik.seq);
  assert_int_equal(r.why, SCHED_END_KILLED);
  assert_ptr_equal(r.state, &sd);
  assert_int_equal(sched_session_attach(k, ka, &sa, &st),
                   PD_FAILED_PRECONDITION);
  sched_session_put(k);

  /* Expiry (a lease of 1 s): heard on the lease thread; wait for it. */
  for (int i = 0; i < 3000 && (end_count(&la) < 3 || end_count(&lb) < 3); i++) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(end_count(&la), 3);
  assert_int_equal(end_count(&lb), 3);
  r = end_find(&la, ie.seq);
  assert_int_equal(r.why, SCHED_END_EXPIRED);
  assert_int_equal(r.handles, 1);
  assert_null(r.state);
  assert_string_equal(r.client, "short");
  r = end_find(&lb, ie.seq);
  assert_int_equal(r.why, SCHED_END_EXPIRED);
  assert_ptr_equal(r.state, &sb);

  /* Stop: the session still open ends in sched_destroy. */
  assert_int_equal(sched_session_attach(d, ka, &sd, &st), PD_OK);
  sched_session_put(d);
  sched_destroy(s);
  assert_int_equal(la.n, 4);
  assert_int_equal(lb.n, 4);
  r = end_find(&la, is.seq);
  assert_int_equal(r.why, SCHED_END_STOPPED);
  assert_int_equal(r.handles, 0);
  assert_ptr_equal(r.state, &sd);
  assert_string_equal(r.client, "left");
  r = end_find(&lb, is.seq);
  assert_int_equal(r.why, SCHED_END_STOPPED);
  assert_null(r.state);
  /* Every session once per observer: four distinct sequence numbers. */
  end_find(&la, ic.seq);
  end_find(&lb, ie.seq);

  assert_string_equal(sched_end_reason_name(SCHED_END_CLOSED), "closed");
  assert_string_equal(sched_end_reason_name(SCHED_END_EXPIRED), "expired");
  assert_string_equal(sched_end_reason_name(SCHED_END_KILLED), "killed");
  assert_string_equal(sched_end_reason_name(SCHED_END_STOPPED), "stopped");
}

/* The daemon's own kill (a mesh lost a rank): queued ops fail with its code
 * and text, not an operator's CANCELLED; observers hear SCHED_END_FAILED
 * with the text; the session's token then gets the code and the reason;
 * an operator's kill keeps its CANCELLED text. */
static char kb_msg[600];
static sched_end_reason kb_why;
static void on_end_msg(void *arg, const sched_end_info *info, void *state) {
  (void)arg;
  (void)state;
  kb_why = info->why;
  snprintf(kb_msg, sizeof kb_msg, "%s", info->message ? info->message : "");
}

static void test_kill_because(void **state) {
  (void)state;
  sched_observer ob = {"msg", on_end_msg, NULL};
  sched *s = new_sched(20, &ob);
  dev_status st = DEV_STATUS_INIT;
  sched_session_info ia, ib;
  sched_session *a = open_new(s, "lost", 0, 0, &ia);
  sched_session *b = open_new(s, "op", 0, 0, &ib);
  const float x[2] = {1, 2};
  assert_int_equal(upload(a, 1, 2, x, &st), PD_OK);
  assert_int_equal(upload(b, 1, 2, x, &st), PD_OK);
  sched_pause(s, true);
  uint64_t in[2] = {1, 1}, out = 2;
  sched_op o = op1("Add", in, 2, &out);
  sched_op_result res;
  int failed = -1;
  dev_tensor *ta = NULL, *tb = NULL;
  assert_int_equal(sched_execute(a, &o, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_handle_get(a, 2, &ta, &st), PD_OK);
  assert_int_equal(sched_execute(b, &o, 1, 0, &res, &failed, &st), PD_OK);
  assert_int_equal(sched_handle_get(b, 2, &tb, &st), PD_OK);
  const char *why = "the mesh lost rank 1 (h): its stream broke";
  sched_kill_target kt = {NULL, 0, NULL, ia.seq};
  sched_kill_result kr;
  assert_int_equal(sched_kill_because(s, &kt, PD_OK, why, &kr, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(sched_kill_because(s, &kt, PD_UNAVAILABLE, why, &kr, &st),
                   PD_OK);
  assert_int_equal(kr.sessions, 1);
  assert_int_equal(kb_why, SCHED_END_FAILED);
  assert_string_equal(kb_msg, why);
  sched_kill_target kb = {NULL, 0, NULL, ib.seq};
  assert_int_equal(sched_kill(s, &kb, &kr, &st), PD_OK);
  assert_int_equal(kb_why, SCHED_END_KILLED);
  sched_pause(s, false);
  dev_status wa = DEV_STATUS_INIT, wb = DEV_STATUS_INIT;
  assert_int_equal(dev_tensor_wait(ta, &wa), PD_UNAVAILABLE);
  if (!strstr(wa.msg, why)) fail_msg("queued op's error: %s", wa.msg);
  assert_int_equal(dev_tensor_wait(tb, &wb), PD_CANCELLED);
  if (!strstr(wb.msg, "killed by an operator")) fail_msg("%s", wb.msg);
  dev_tensor_release(ta);
  dev_tensor_release(tb);
  /* Later calls: the loss for a's token, plain NOT_FOUND for b's. */
  sched_session *z = NULL;
  assert_int_equal(
      sched_session_open(s, ia.token, SCHED_TOKEN_BYTES, &z, &st),
      PD_UNAVAILABLE);
  assert_string_equal(st.msg,
                      "session not found: it was ended: the mesh lost rank 1 "
                      "(h): its stream broke");
  assert_int_equal(
      sched_session_open(s, ib.token, SCHED_TOKEN_BYTES, &z, &st),
      PD_NOT_FOUND);
  /* A call in flight (it opened the session first) learns it too. */
  dev_status ce = DEV_STATUS_INIT;
  assert_int_equal(sched_handle_get(a, 1, &ta, &ce), PD_UNAVAILABLE);
  if (!strstr(ce.msg, "it was ended: the mesh lost rank 1"))
    fail_msg("%s", ce.msg);
  sched_stats ss = {.struct_size = sizeof(ss)};
  sched_get_stats(s, &ss);
  assert_int_equal(ss.sessions_killed, 2);
  assert_string_equal(sched_end_reason_name(SCHED_END_FAILED), "failed");
  sched_session_put(a);
  sched_session_put(b);
  sched_destroy(s);
}

/* At most SCHED_MAX_OBSERVERS observers. */
static void test_observer_slots(void **state) {
  sched *s = new_sched(500, NULL);
  end_log l = {NULL, PTHREAD_MUTEX_INITIALIZER, 0, {{0}}};
  sched_observer o = {"x", on_end_rec, &l};
  for (int i = 0; i < SCHED_MAX_OBSERVERS; i++)
    assert_int_equal(sched_observer_add(s, &o), i);
  assert_int_equal(sched_observer_add(s, &o), -1);
  sched_session_info info;
  sched_session *ss = open_new(s, "a", 0, 0, &info);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_attach(ss, SCHED_MAX_OBSERVERS - 1, &l, &st),
                   PD_OK);
  sched_session_put(ss);
  sched_destroy(s);
  assert_int_equal(l.n, SCHED_MAX_OBSERVERS); /* one session, 8 observers */
  int with_state = 0;
  for (int i = 0; i < l.n; i++) {
    assert_int_equal(l.recs[i].why, SCHED_END_STOPPED);
    with_state += l.recs[i].state == &l;
  }
  assert_int_equal(with_state, 1);
}

/* Several threads, each opening sessions in turn, executing a chain of ops
 * into each, cancelling some while they are queued, syncing, and closing the
 * session (odd workers) or leaving it open (even workers), while another
 * thread reads the counters and the session list. Run under
 * AddressSanitizer, it checks for races that lose or double-free memory;
 * every call's outcome is asserted, and afterwards (behind a fence) the
 * counters must add up to what the workers did. */
#define STRESS_WORKERS 4
#define STRESS_ROUNDS 25
#define STRESS_CHAIN 40 /* handles 1 (uploaded) .. 39 per session */

typedef struct stress_arg {
  sched *s;
  int k;
  /* What the worker did. */
  uint64_t created, executed, dropped, closed, open_handles;
} stress_arg;

/* One session's life in a stress worker. */
static void stress_round(stress_arg *a) {
  sched_session_info info;
  sched_session_params prm = {"stress", NULL, 86400, 0,
                              NULL,     0,    0,     0,
                              NULL,     NULL}; /* never expires */
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_create(a->s, &prm, &info, &st), PD_OK);
  a->created++;
  sched_session *ss = NULL;
  assert_int_equal(
      sched_session_open(a->s, info.token, SCHED_TOKEN_BYTES, &ss, &st), PD_OK);
  const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(upload(ss, 1, 8, x, &st), PD_OK);
  uint64_t dropped = 0;
  for (uint64_t i = 2; i < STRESS_CHAIN; i++) {
    uint64_t in[2] = {i - 1, 1};
    sched_op o = op1("Add", in, 2, &i);
    sched_op_result r;
    int failed = -1;
    assert_int_equal(sched_execute(ss, &o, 1, (uint64_t)a->k, &r, &failed, &st),
                     PD_OK);
    a->executed++;
    if (i % 9 == 0) dropped += (uint64_t)sched_cancel(ss, (uint64_t)a->k);
  }
  a->dropped += dropped;
  dev_status err = DEV_STATUS_INIT;
  uint64_t fid = 0;
  assert_int_equal(sched_sync(ss, NULL, 0, &err, &fid, &st), PD_OK);
  /* Each op consumes the one before: a dropped op fails everything after
   * it with CANCELLED, and nothing else fails. */
  assert_int_equal(err.code, dropped ? PD_CANCELLED : PD_OK);
  assert_true(dropped ? fid >= 2 && fid < STRESS_CHAIN : fid == 0);
  int handles = 0;
  sched_session_usage(ss, &handles, NULL);
  assert_int_equal(handles, STRESS_CHAIN - 1);
  if (a->k % 2) {
    uint64_t freed = 0;
    assert_int_equal(
        sched_session_close(a->s, info.token, SCHED_TOKEN_BYTES, &freed, &st),
        PD_OK);
    assert_int_equal(freed, STRESS_CHAIN - 1);
    a->closed++;
  } else {
    a->open_handles += STRESS_CHAIN - 1;
  }
  sched_session_put(ss);
}

static void *stress_worker(void *p) {
  stress_arg *a = p;
  for (int r = 0; r < STRESS_ROUNDS; r++) stress_round(a);
  return NULL;
}

typedef struct stress_reader {
  sched *s;
  atomic_bool stop;
  uint64_t reads;
} stress_reader;

/* Reads the counters and the session list while the workers run. */
static void *stress_read(void *p) {
  stress_reader *rd = p;
  while (!atomic_load(&rd->stop)) {
    sched_stats a = {.struct_size = sizeof(a)};
    sched_get_stats(rd->s, &a);
    assert_true(a.ops_completed <= a.ops_submitted);
    assert_true(a.sessions >= 0 &&
                a.sessions <= STRESS_WORKERS * STRESS_ROUNDS);
    sched_session_view *v = NULL;
    int n = sched_list_sessions(rd->s, NULL, &v);
    assert_true(n >= 0);
    for (int i = 0; i < n; i++) assert_string_equal(v[i].client, "stress");
    free(v);
    rd->reads++;
  }
  return NULL;
}

static void test_stress(void **state) {
  sched *s = new_sched(5, NULL);
  pthread_t th[STRESS_WORKERS], reader;
  stress_arg args[STRESS_WORKERS];
  stress_reader rd = {s, false, 0};
  assert_int_equal(pthread_create(&reader, NULL, stress_read, &rd), 0);
  for (int k = 0; k < STRESS_WORKERS; k++) {
    args[k] = (stress_arg){s, k + 1, 0, 0, 0, 0, 0};
    assert_int_equal(pthread_create(&th[k], NULL, stress_worker, &args[k]), 0);
  }
  for (int k = 0; k < STRESS_WORKERS; k++) pthread_join(th[k], NULL);
  atomic_store(&rd.stop, true);
  pthread_join(reader, NULL);
  assert_true(rd.reads > 0);

  uint64_t created = 0, executed = 0, dropped = 0, closed = 0, handles = 0;
  for (int k = 0; k < STRESS_WORKERS; k++) {
    const stress_arg *a = &args[k];
    assert_int_equal(a->created, STRESS_ROUNDS);
    assert_int_equal(a->executed, STRESS_ROUNDS * (STRESS_CHAIN - 2));
    assert_int_equal(a->closed, a->k % 2 ? STRESS_ROUNDS : 0);
    assert_int_equal(a->open_handles,
                     a->k % 2 ? 0 : STRESS_ROUNDS * (STRESS_CHAIN - 1));
    created += a->created;
    executed += a->executed;
    dropped += a->dropped;
    closed += a->closed;
    handles += a->open_handles;
  }
  /* Every op was submitted or dropped (each session was synced); once the
   * fence passed, every submitted op has completed and been counted. */
  fence_wait(s);
  sched_stats st = {.struct_size = sizeof(st)};
  sched_get_stats(s, &st);
  assert_int_equal(st.sessions_created, created);
  assert_int_equal(st.sessions_closed, closed);
  assert_int_equal(st.sessions_expired, 0);
  assert_int_equal(st.sessions_killed, 0);
  assert_int_equal(st.sessions, (int)(created - closed));
  assert_int_equal(sched_num_sessions(s), (int)(created - closed));
  assert_int_equal(st.handles, handles);
  assert_int_equal(st.ops_queued, 0);
  assert_int_equal(st.ops_dropped, dropped);
  assert_int_equal(st.ops_submitted + st.ops_dropped, executed);
  assert_int_equal(st.ops_completed, st.ops_submitted);
  assert_int_equal(st.ops_in_flight, 0);
  assert_int_equal(st.latency_buckets[SCHED_LATENCY_BUCKETS], st.ops_completed);
  /* Per op: every Add ran to some outcome or was dropped (CANCELLED). */
  int add = -1;
  for (int i = 0; i < dev_op_count(); i++)
    if (strcmp(dev_op_def_name(dev_op_at(i)), "Add") == 0) add = i;
  assert_true(add >= 0);
  uint64_t by[SCHED_NUM_CODES], outcomes = 0;
  sched_op_stats(s, add, by, NULL);
  for (int c = 0; c < SCHED_NUM_CODES; c++) outcomes += by[c];
  assert_int_equal(outcomes, executed);
  assert_true(by[PD_CANCELLED] >= dropped);
  assert_int_equal(by[PD_OK] + by[PD_CANCELLED], executed);
  sched_destroy(s); /* sessions left open are freed here */
}

int main(void) {
  g_engine = tu_engine(2, 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tokens),
      cmocka_unit_test(test_isolation_and_execute),
      cmocka_unit_test(test_two_outputs),
      cmocka_unit_test(test_queue_cancel),
      cmocka_unit_test(test_lease_and_quota),
      cmocka_unit_test(test_function_quota),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_tapes),
      cmocka_unit_test(test_session_end_events),
      cmocka_unit_test(test_kill_because),
      cmocka_unit_test(test_observer_slots),
      cmocka_unit_test(test_deadlines),
      cmocka_unit_test(test_stress),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  dev_engine_destroy(g_engine);
  return rc;
}
