/* Integration test of graph functions through libparadev against the real
 * daemon (issue #11): RegisterFunction, calls through pd_execute and through
 * an Enqueue stream (register item, then call items, no waiting between),
 * the outputs' dtypes and shapes in the reply, values downloaded and checked
 * against a float64 reference computed here, every kind of registration
 * error (INVALID_ARGUMENT naming the node), ALREADY_EXISTS, an identical
 * re-registration, a call with a wrong input dtype (naming the function),
 * DescribeFunction's JSON (a cache miss explained after a shape change, the
 * passes in force), functions per session and freed with it; and, on the
 * wire alone, the daemon's [functions] section in GetServerInfo, bounds the
 * server checks before the engine sees a definition, and a bad [functions]
 * value refusing the start with FILE:LINE.
 *
 * The daemon runs with a [functions] section (fusion = off,
 * max_instantiations = 5) so that the config's effect is visible.
 *
 * Tests marked ENGINE need the engine's function library (device/fn/); on a
 * build where device/fn/lib_placeholder.c stands in for it (registration
 * answers UNIMPLEMENTED "graph functions: engine not merged yet") they say
 * SKIP and why.
 *
 * Usage: test_functions_client PARADEVD PARADEV_CLI
 */
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "paradev/paradev.h"
#include "harness.h"
/* White-box, for two things only: GetServerInfo's `functions` field, which
 * libparadev's pd_server_info does not expose, and a RegisterFunction with
 * a tri-state value the builder refuses, both through pdc_unary. */
#include "client_int.h"

#define NDEV 4
#define PLACEHOLDER_MSG "engine not merged yet"

static const char *paradevd_path;
static const char *cli_path;
static pdt_daemon D;
static char conf_path[128];
static bool engine_present; /* set by the first registration */

typedef struct env {
  pd_client *c;
  pd_session *s;
  pd_status *st;
} env;

#define NEED_ENGINE()                                                          \
  do {                                                                         \
    if (!engine_present) {                                                     \
      fprintf(stderr,                                                          \
              "SKIP: the engine's function library is not linked "             \
              "(" PLACEHOLDER_MSG ")\n");                                      \
      skip();                                                                  \
    }                                                                          \
  } while (0)

static pd_session *new_session(env *e, const char *name) {
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = name;
  pd_session *s = pd_session_new(e->c, &so, NULL, e->st);
  if (!s) fail_msg("pd_session_new: %s", pd_status_message(e->st));
  return s;
}

/* --- the function under test ------------------------------------------------------ */

/* affine(x[N,3], w[3,2], b[2]) -> y = relu_op(BiasAdd(MatMul(x, w), b)),
 * m = MatMul(x, w) (relu_op "Relu"; another op makes another body). */
static pd_function *affine_fn(const char *name, const char *relu_op) {
  pd_function *f = pd_function_new(name);
  pd_status *st = pd_status_new();
  assert_int_equal(pd_function_add_arg(f, "x", PD_FLOAT32), 0);
  assert_int_equal(pd_function_add_arg(f, "w", PD_FLOAT32), 1);
  assert_int_equal(pd_function_add_arg(f, "b", PD_FLOAT32), 2);
  const char *mm_in[] = {"x", "w"}, *ba_in[] = {"mm", "b"}, *r_in[] = {"ba"};
  assert_int_equal(pd_function_add_node(f, "mm", "MatMul", mm_in, 2, NULL, st),
                   PD_OK);
  assert_int_equal(pd_function_add_node(f, "ba", "BiasAdd", ba_in, 2, NULL, st),
                   PD_OK);
  assert_int_equal(pd_function_add_node(f, "r", relu_op, r_in, 1, NULL, st),
                   PD_OK);
  assert_int_equal(pd_function_add_output(f, "y", "r", st), PD_OK);
  assert_int_equal(pd_function_add_output(f, "m", "mm:0", st), PD_OK);
  pd_status_delete(st);
  return f;
}

static const float W[6] = {1, -2, 0.5f, 1, -1, 3}; /* [3,2] row-major */
static const float B[2] = {0.25f, -4};

/* x[n,3] with x[i][k] = (i + 1) * (k - 1) + 0.5 */
static void make_x(float *x, int n) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < 3; k++)
      x[i * 3 + k] = (float)((i + 1) * (k - 1)) + 0.5f;
}

/* The float64 reference of affine. */
static void affine_ref(const float *x, int n, double *y, double *m) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < 2; j++) {
      double acc = 0;
      for (int k = 0; k < 3; k++) acc += (double)x[i * 3 + k] * W[k * 2 + j];
      m[i * 2 + j] = acc;
      y[i * 2 + j] = acc + B[j] > 0 ? acc + B[j] : 0;
    }
}

static void upload_inputs(env *e, pd_session *s, uint64_t base, int n) {
  float x[64 * 3];
  make_x(x, n);
  int64_t xd[2] = {n, 3}, wd[2] = {3, 2}, bd[1] = {2};
  OK(e, pd_upload(s, base, PD_FLOAT32, xd, 2, x, (size_t)n * 3 * sizeof(float),
                  pd_layout_mirrored(), NULL, NULL, e->st));
  OK(e, pd_upload(s, base + 1, PD_FLOAT32, wd, 2, W, sizeof W,
                  pd_layout_mirrored(), NULL, NULL, e->st));
  OK(e, pd_upload(s, base + 2, PD_FLOAT32, bd, 1, B, sizeof B,
                  pd_layout_mirrored(), NULL, NULL, e->st));
}

static void check_outputs(env *e, pd_session *s, uint64_t y_id, uint64_t m_id,
                          int n) {
  float x[64 * 3], y[64 * 2], m[64 * 2];
  double yr[64 * 2], mr[64 * 2];
  make_x(x, n);
  affine_ref(x, n, yr, mr);
  OK(e, pd_download(s, y_id, pd_layout_mirrored(), y, sizeof y, NULL, NULL,
                    NULL, e->st));
  OK(e, pd_download(s, m_id, pd_layout_mirrored(), m, sizeof m, NULL, NULL,
                    NULL, e->st));
  pdt_assert_close_f32(y, yr, (size_t)n * 2, 1e-6);
  pdt_assert_close_f32(m, mr, (size_t)n * 2, 1e-6);
}

/* --- group setup -------------------------------------------------------------------- */

static int setup(void **state) {
  env *e = calloc(1, sizeof(*e));
  e->st = pd_status_new();
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.default_timeout_ms = 30000;
  e->c = pd_client_new(D.unix_target, &co, e->st);
  if (!e->c) return -1;
  e->s = new_session(e, "test_functions");
  /* Registration tells whether the engine is there (see the header). */
  pd_function *f = affine_fn("affine", "Relu");
  bool existed = true;
  pd_code rc = pd_register_function(e->s, f, &existed, NULL, e->st);
  pd_function_delete(f);
  if (rc == PD_OK) {
    engine_present = true;
    if (existed) return -1; /* the first registration of the name */
  } else if (rc != PD_UNIMPLEMENTED ||
             !strstr(pd_status_message(e->st), PLACEHOLDER_MSG)) {
    fprintf(stderr, "registering affine: %s: %s\n", pd_code_name(rc),
            pd_status_message(e->st));
    return -1;
  }
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env *e = *state;
  if (!e) return 0;
  pd_session_close(e->s, NULL, e->st);
  pd_session_delete(e->s);
  pd_client_delete(e->c);
  pd_status_delete(e->st);
  free(e);
  return 0;
}

/* --- ENGINE: calls ------------------------------------------------------------------- */

static void test_call_execute(void **state) {
  NEED_ENGINE();
  env *e = *state;
  upload_inputs(e, e->s, 100, 4);
  uint64_t in[3] = {100, 101, 102}, out[2] = {110, 111};
  pd_tensor_info info[2];
  OK(e, pd_execute(e->s, "affine", in, 3, NULL, out, 2, info, NULL, e->st));
  int64_t d[2] = {4, 2};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(info[i].id, out[i]);
    assert_int_equal(info[i].dtype, PD_FLOAT32);
    pdt_assert_shape(&info[i], 2, d);
  }
  check_outputs(e, e->s, 110, 111, 4);
}

typedef struct replies {
  int n;
  pd_code code[8];
  int num_outputs[8];
  pd_tensor_info out[8][2];
} replies;

static void on_reply(void *arg, const pd_stream_reply *r) {
  replies *rs = arg;
  if (rs->n >= 8) return;
  rs->code[rs->n] = r->code;
  rs->num_outputs[rs->n] = r->num_outputs;
  for (int i = 0; i < r->num_outputs && i < 2; i++)
    rs->out[rs->n][i] = r->outputs[i];
  rs->n++;
}

static void test_call_stream(void **state) {
  NEED_ENGINE();
  env *e = *state;
  upload_inputs(e, e->s, 200, 3);
  replies rs = {0};
  pd_stream_options so = PD_STREAM_OPTIONS_INITIALIZER;
  so.on_reply = on_reply;
  so.on_reply_arg = &rs;
  pd_stream *t = pd_stream_new(e->s, &so, e->st);
  assert_non_null(t);
  pd_function *f = affine_fn("affine_s", "Relu");
  /* The register item, then two calls at once: no wait in between. */
  OK(e, pd_stream_register_function(t, f, e->st));
  uint64_t in[3] = {200, 201, 202}, o1[2] = {210, 211}, o2[2] = {212, 213};
  OK(e, pd_stream_execute(t, "affine_s", in, 3, NULL, o1, 2, NULL, e->st));
  OK(e, pd_stream_execute(t, "affine_s", in, 3, NULL, o2, 2, NULL, e->st));
  OK(e, pd_stream_close(t, 30000, e->st));
  pd_stream_delete(t);
  pd_function_delete(f);
  assert_int_equal(rs.n, 3);
  assert_int_equal(rs.code[0], PD_OK);
  assert_int_equal(rs.num_outputs[0], 0);
  int64_t d[2] = {3, 2};
  for (int k = 1; k < 3; k++) {
    assert_int_equal(rs.code[k], PD_OK);
    assert_int_equal(rs.num_outputs[k], 2);
    for (int i = 0; i < 2; i++) {
      assert_int_equal(rs.out[k][i].dtype, PD_FLOAT32);
      pdt_assert_shape(&rs.out[k][i], 2, d);
    }
  }
  check_outputs(e, e->s, 210, 211, 3);
  check_outputs(e, e->s, 212, 213, 3);
}

/* --- ENGINE: registration -------------------------------------------------------- */

/* Registers a one-node function `name` whose node is (node, op, inputs) and
 * expects INVALID_ARGUMENT naming `needle`. */
static void expect_bad(env *e, const char *name, const char *node,
                       const char *op, const char *const *in, int n,
                       const char *needle) {
  pd_function *f = pd_function_new(name);
  pd_function_add_arg(f, "x", PD_FLOAT32);
  OK(e, pd_function_add_node(f, node, op, in, n, NULL, e->st));
  OK(e, pd_function_add_output(f, "y", node, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_register_function(e->s, f, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, needle);
  pd_function_delete(f);
}

static void test_registration_errors(void **state) {
  NEED_ENGINE();
  env *e = *state;
  const char *x1[] = {"x"}, *x2[] = {"x", "x"}, *dangling[] = {"nope"};
  expect_bad(e, "bad_op", "n_unknown", "NoSuchOp", x1, 1, "n_unknown");
  expect_bad(e, "bad_dangling", "n_dangling", "Relu", dangling, 1,
             "n_dangling");
  expect_bad(e, "bad_arity", "n_arity", "Relu", x2, 2, "n_arity");
  expect_bad(e, "bad_ref", "n_ref", "Relu", (const char *[]){"x:3"}, 1,
             "n_ref");
  /* A cycle: c1 <- c2 <- c1. */
  pd_function *f = pd_function_new("bad_cycle");
  pd_function_add_arg(f, "x", PD_FLOAT32);
  const char *a_in[] = {"cyc_b"}, *b_in[] = {"cyc_a"};
  OK(e, pd_function_add_node(f, "cyc_a", "Relu", a_in, 1, NULL, e->st));
  OK(e, pd_function_add_node(f, "cyc_b", "Relu", b_in, 1, NULL, e->st));
  OK(e, pd_function_add_output(f, "y", "cyc_a", e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_register_function(e->s, f, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "cyc_");
  pd_function_delete(f);
  /* Two nodes of one name. */
  f = pd_function_new("bad_dup");
  pd_function_add_arg(f, "x", PD_FLOAT32);
  OK(e, pd_function_add_node(f, "n_dup", "Relu", x1, 1, NULL, e->st));
  OK(e, pd_function_add_node(f, "n_dup", "Neg", x1, 1, NULL, e->st));
  OK(e, pd_function_add_output(f, "y", "n_dup", e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_register_function(e->s, f, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "n_dup");
  pd_function_delete(f);
  /* An attribute the op does not have. */
  f = pd_function_new("bad_attr");
  pd_function_add_arg(f, "x", PD_FLOAT32);
  pd_attrs *at = pd_attrs_new();
  pd_attrs_set_int(at, "no_such_attr", 3);
  OK(e, pd_function_add_node(f, "n_attr", "Relu", x1, 1, at, e->st));
  OK(e, pd_function_add_output(f, "y", "n_attr", e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_register_function(e->s, f, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "n_attr");
  pd_attrs_delete(at);
  pd_function_delete(f);
  /* None of them was kept: calling one is an unknown op. */
  uint64_t in[1] = {100}, out[1] = {0};
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_execute(e->s, "bad_op", in, 1, NULL, out, 1, NULL, NULL, e->st));
}

static void test_reregister(void **state) {
  NEED_ENGINE();
  env *e = *state;
  pd_function *same = affine_fn("affine", "Relu");
  bool existed = false;
  OK(e, pd_register_function(e->s, same, &existed, NULL, e->st));
  assert_true(existed);
  pd_function *other = affine_fn("affine", "Sigmoid");
  EXPECT_CODE(e, PD_ALREADY_EXISTS,
              pd_register_function(e->s, other, &existed, NULL, e->st));
  ASSERT_MSG_HAS(e, "affine");
  pd_function_delete(same);
  pd_function_delete(other);
}

static void test_wrong_dtype(void **state) {
  NEED_ENGINE();
  env *e = *state;
  int32_t xi[6] = {1, 2, 3, 4, 5, 6};
  int64_t xd[2] = {2, 3};
  OK(e, pd_upload(e->s, 300, PD_INT32, xd, 2, xi, sizeof xi,
                  pd_layout_mirrored(), NULL, NULL, e->st));
  upload_inputs(e, e->s, 301, 2); /* 301 x, 302 w, 303 b */
  uint64_t in[3] = {300, 302, 303}, out[2] = {0, 0};
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_execute(e->s, "affine", in, 3, NULL, out, 2, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "affine");
}

static void test_describe_miss(void **state) {
  NEED_ENGINE();
  env *e = *state;
  upload_inputs(e, e->s, 400, 5);
  upload_inputs(e, e->s, 410, 6);
  uint64_t a[3] = {400, 401, 402}, b[3] = {410, 411, 412};
  uint64_t oa[2] = {0, 0}, ob[2] = {0, 0};
  OK(e, pd_execute(e->s, "affine", a, 3, NULL, oa, 2, NULL, NULL, e->st));
  OK(e, pd_execute(e->s, "affine", b, 3, NULL, ob, 2, NULL, NULL, e->st));
  check_outputs(e, e->s, ob[0], ob[1], 6);
  char *json = NULL;
  OK(e, pd_describe_function(e->s, "affine", &json, NULL, e->st));
  /* The call with x [6,3] missed the cache of x [5,3]: the reason names
   * input 0's shape. */
  if (!strstr(json, "\"cache_misses\":[") || !strstr(json, "input 0") ||
      !strstr(json, "[6,3]"))
    fail_msg("DescribeFunction: no miss reason for input 0 [6,3]: %s", json);
  /* The daemon's [functions] fusion = off is in force; the rest on. */
  if (!strstr(json, "\"pass\":\"fusion\",\"enabled\":false") ||
      !strstr(json, "\"pass\":\"cse\",\"enabled\":true"))
    fail_msg("DescribeFunction: passes in force: %s", json);
  if (!strstr(json, "\"max_instantiations\":5"))
    fail_msg("DescribeFunction: max_instantiations 5: %s", json);
  /* The registered definition comes back with its nodes. */
  if (!strstr(json, "\"name\":\"mm\"") || !strstr(json, "\"op\":\"BiasAdd\""))
    fail_msg("DescribeFunction: the definition: %s", json);
  free(json);
}

static void test_per_session_and_freed(void **state) {
  NEED_ENGINE();
  env *e = *state;
  pd_session *other = new_session(e, "other");
  upload_inputs(e, other, 500, 2);
  uint64_t in[3] = {500, 501, 502}, out[2] = {0, 0};
  /* Another session's function is not this one's: an unknown op. */
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_execute(other, "affine", in, 3, NULL, out, 2, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "affine");
  char *json = NULL;
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_describe_function(other, "affine", &json, NULL, e->st));
  /* A function goes with its session. */
  pd_function *f = affine_fn("short_lived", "Relu");
  OK(e, pd_register_function(other, f, NULL, NULL, e->st));
  OK(e,
     pd_execute(other, "short_lived", in, 3, NULL, out, 2, NULL, NULL, e->st));
  check_outputs(e, other, out[0], out[1], 2);
  OK(e, pd_session_close(other, NULL, e->st));
  pd_session_delete(other);
  pd_session *later = new_session(e, "later");
  upload_inputs(e, later, 600, 2);
  uint64_t in2[3] = {600, 601, 602}, out2[2] = {0, 0};
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute(later, "short_lived", in2, 3, NULL, out2, 2, NULL,
                         NULL, e->st));
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_describe_function(later, "short_lived", &json, NULL, e->st));
  /* The name is free again in the new session, with another body. */
  pd_function *g = affine_fn("short_lived", "Sigmoid");
  bool existed = true;
  OK(e, pd_register_function(later, g, &existed, NULL, e->st));
  assert_false(existed);
  OK(e, pd_session_close(later, NULL, e->st));
  pd_session_delete(later);
  pd_function_delete(f);
  pd_function_delete(g);
}

/* DEV_FN_MAX_PER_LIB (256) functions per session; the next one is
 * RESOURCE_EXHAUSTED naming the limit, and counts toward nothing else: the
 * session still runs ops. */
static void test_function_limit(void **state) {
  NEED_ENGINE();
  env *e = *state;
  pd_session *s = new_session(e, "many");
  const char *in[] = {"x"};
  char name[32];
  for (int i = 0; i <= 256; i++) {
    snprintf(name, sizeof name, "neg_%d", i);
    pd_function *f = pd_function_new(name);
    pd_function_add_arg(f, "x", PD_FLOAT32);
    OK(e, pd_function_add_node(f, "n", "Neg", in, 1, NULL, e->st));
    OK(e, pd_function_add_output(f, "y", "n", e->st));
    if (i < 256) {
      OK(e, pd_register_function(s, f, NULL, NULL, e->st));
    } else {
      EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
                  pd_register_function(s, f, NULL, NULL, e->st));
      ASSERT_MSG_HAS(e, "the most one session may register (256)");
    }
    pd_function_delete(f);
  }
  /* An identical re-registration is still a no-op at the limit. */
  pd_function *f = pd_function_new("neg_0");
  pd_function_add_arg(f, "x", PD_FLOAT32);
  OK(e, pd_function_add_node(f, "n", "Neg", in, 1, NULL, e->st));
  OK(e, pd_function_add_output(f, "y", "n", e->st));
  bool existed = false;
  OK(e, pd_register_function(s, f, &existed, NULL, e->st));
  assert_true(existed);
  pd_function_delete(f);
  float v[2] = {1.5f, -2};
  int64_t d[1] = {2};
  OK(e, pd_upload(s, 1, PD_FLOAT32, d, 1, v, sizeof v, pd_layout_mirrored(),
                  NULL, NULL, e->st));
  uint64_t ins[1] = {1}, out[1] = {2};
  OK(e, pd_execute(s, "neg_255", ins, 1, NULL, out, 1, NULL, NULL, e->st));
  float got[2];
  OK(e, pd_download(s, 2, pd_layout_mirrored(), got, sizeof got, NULL, NULL,
                    NULL, e->st));
  assert_true(got[0] == -1.5f && got[1] == 2.0f);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

/* --- wire only (no engine needed) -------------------------------------------------- */

static void test_server_info_functions(void **state) {
  env *e = *state;
  Paradev__V1__GetServerInfoRequest req =
      PARADEV__V1__GET_SERVER_INFO_REQUEST__INIT;
  ProtobufCMessage *m = NULL;
  OK(e, pdc_unary(e->c, PDC_M_GetServerInfo, &req.base,
                  &paradev__v1__get_server_info_response__descriptor, &m, NULL,
                  e->st));
  const Paradev__V1__GetServerInfoResponse *r = (const void *)m;
  assert_non_null(r->functions);
  const Paradev__V1__FunctionsInfo *fi = r->functions;
  static const char *const names[7] = {"pruning",          "cse",
                                       "constant_folding", "arithmetic",
                                       "fusion",           "buffer_planning",
                                       "cuda_graph"};
  assert_int_equal(fi->n_passes, 7);
  for (int p = 0; p < 7; p++) {
    assert_string_equal(fi->passes[p]->pass, names[p]);
    assert_int_equal(fi->passes[p]->enabled, p != 4); /* fusion = off */
  }
  assert_int_equal(fi->max_instantiations, 5);
  assert_int_equal(fi->n_optimizer_plugins, 0);
  assert_int_equal(fi->constant_folding_max_bytes, 4096);
  assert_int_equal(fi->constant_folding_max_ms, 50);
  protobuf_c_message_free_unpacked(m, NULL);
}

/* Bounds the server checks before the engine sees anything: each is
 * INVALID_ARGUMENT naming what was wrong, whatever the engine. */
static void test_wire_bounds(void **state) {
  env *e = *state;
  /* An argument of no dtype. */
  pd_function *f = pd_function_new("w_dtype");
  pd_function_add_arg(f, "x", (pd_dtype)99);
  OK(e, pd_function_add_output(f, "y", "x", e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_register_function(e->s, f, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "arg 0 ('x')");
  pd_function_delete(f);
  /* A node of more inputs than any op takes. */
  const char *many[65];
  for (int i = 0; i < 65; i++) many[i] = "x";
  f = pd_function_new("w_inputs");
  pd_function_add_arg(f, "x", PD_FLOAT32);
  OK(e, pd_function_add_node(f, "n_wide", "Concat", many, 65, NULL, e->st));
  OK(e, pd_function_add_output(f, "y", "n_wide", e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_register_function(e->s, f, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "n_wide");
  ASSERT_MSG_HAS(e, "65 inputs");
  pd_function_delete(f);
  /* A name over DEV_FN_NAME_MAX (128 bytes). */
  char longname[200];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  f = pd_function_new(longname);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_register_function(e->s, f, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "199 bytes");
  pd_function_delete(f);
  /* An attribute without a value, decoded as Execute's attrs are. */
  Paradev__V1__Attr at = PARADEV__V1__ATTR__INIT, *ats[1] = {&at};
  at.name = "axis";
  Paradev__V1__FunctionArg arg = PARADEV__V1__FUNCTION_ARG__INIT,
                           *args[1] = {&arg};
  arg.name = "x";
  arg.dtype = PARADEV__V1__DTYPE__DTYPE_FLOAT32;
  char *ins[1] = {"x"};
  Paradev__V1__FunctionNode nd = PARADEV__V1__FUNCTION_NODE__INIT,
                            *nds[1] = {&nd};
  nd.name = "n_noval";
  nd.op = "Sum";
  nd.n_inputs = 1;
  nd.inputs = ins;
  nd.n_attrs = 1;
  nd.attrs = ats;
  Paradev__V1__FunctionOptions opt = PARADEV__V1__FUNCTION_OPTIONS__INIT;
  Paradev__V1__FunctionDef def = PARADEV__V1__FUNCTION_DEF__INIT;
  def.name = "w_raw";
  def.n_args = 1;
  def.args = args;
  def.n_nodes = 1;
  def.nodes = nds;
  def.options = &opt;
  Paradev__V1__RegisterFunctionRequest req =
      PARADEV__V1__REGISTER_FUNCTION_REQUEST__INIT;
  req.session_token.data = e->s->token;
  req.session_token.len = e->s->token_len;
  req.function = &def;
  ProtobufCMessage *m = NULL;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pdc_unary(e->c, PDC_M_RegisterFunction, &req.base,
                        &paradev__v1__register_function_response__descriptor,
                        &m, NULL, e->st));
  ASSERT_MSG_HAS(e, "node 0 (n_noval): attr axis has no value");
  /* A tri-state outside DEFAULT/OFF/ON. */
  nd.n_attrs = 0;
  opt.fusion = (Paradev__V1__TriState)7;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pdc_unary(e->c, PDC_M_RegisterFunction, &req.base,
                        &paradev__v1__register_function_response__descriptor,
                        &m, NULL, e->st));
  ASSERT_MSG_HAS(e, "options.fusion is 7");
  /* A cap over DEV_FN_MAX_INST_CAP. */
  opt.fusion = PARADEV__V1__TRI_STATE__TRI_STATE_OFF;
  opt.max_instantiations = 65;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pdc_unary(e->c, PDC_M_RegisterFunction, &req.base,
                        &paradev__v1__register_function_response__descriptor,
                        &m, NULL, e->st));
  ASSERT_MSG_HAS(e, "max_instantiations is 65");
  /* No function at all. */
  req.function = NULL;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pdc_unary(e->c, PDC_M_RegisterFunction, &req.base,
                        &paradev__v1__register_function_response__descriptor,
                        &m, NULL, e->st));
  /* Describing what the session never registered. */
  char *json = NULL;
  EXPECT_CODE(
      e, PD_NOT_FOUND,
      pd_describe_function(e->s, "never_registered", &json, NULL, e->st));
  ASSERT_MSG_HAS(e, "never_registered");
}

/* A register item the server refuses is that item's error; the stream goes
 * on (a later execute item succeeds). */
static void test_stream_item_error(void **state) {
  env *e = *state;
  replies rs = {0};
  pd_stream_options so = PD_STREAM_OPTIONS_INITIALIZER;
  so.on_reply = on_reply;
  so.on_reply_arg = &rs;
  pd_stream *t = pd_stream_new(e->s, &so, e->st);
  assert_non_null(t);
  pd_function *f = pd_function_new("s_bad");
  pd_function_add_arg(f, "x", (pd_dtype)42);
  OK(e, pd_stream_register_function(t, f, e->st));
  pd_attrs *a = pd_attrs_new();
  int64_t dims[1] = {3};
  pd_attrs_set_dtype(a, "dtype", PD_FLOAT32);
  pd_attrs_set_shape(a, "shape", dims, 1);
  pd_attrs_set_float(a, "value", 2.5);
  uint64_t out[1] = {700};
  OK(e, pd_stream_execute(t, "Fill", NULL, 0, a, out, 1, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT, pd_stream_close(t, 30000, e->st));
  ASSERT_MSG_HAS(e, "item 0");
  ASSERT_MSG_HAS(e, "s_bad");
  pd_stream_delete(t);
  pd_attrs_delete(a);
  pd_function_delete(f);
  assert_int_equal(rs.n, 2);
  assert_int_equal(rs.code[0], PD_INVALID_ARGUMENT);
  assert_int_equal(rs.code[1], PD_OK);
  float v[3];
  OK(e, pd_download(e->s, 700, pd_layout_mirrored(), v, sizeof v, NULL, NULL,
                    NULL, e->st));
  for (int i = 0; i < 3; i++) assert_true(v[i] == 2.5f);
}

/* Runs `cmd` (stdout and stderr together) into buf; returns the exit
 * status. */
static int run_cmd(const char *cmd, char *buf, size_t len) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(buf, 1, len - 1, p);
  buf[n] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_bad_config(void **state) {
  (void)state;
  char path[] = "/tmp/pdfn-conf-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char text[] = "[functions]\ncse = on\nfusion = maybe\n";
  assert_int_equal(write(fd, text, sizeof text - 1),
                   (ssize_t)(sizeof text - 1));
  close(fd);
  char cmd[512], out[4096], want[96];
  snprintf(cmd, sizeof cmd,
           "%s --config %s --listen unix:/tmp/pdfn-never.sock "
           "--admin-socket '' 2>&1",
           paradevd_path, path);
  int rc = run_cmd(cmd, out, sizeof out);
  snprintf(want, sizeof want, "%s:3", path);
  if (rc == 0 || !strstr(out, want) || !strstr(out, "on, off or default"))
    fail_msg("exit %d, expected a refusal naming %s: %s", rc, want, out);
  /* --check-config shows the section. */
  const char good[] = "[functions]\nfusion = off\nmax_instantiations = 5\n";
  FILE *f = fopen(path, "w");
  fputs(good, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s --config %s --check-config 2>&1", paradevd_path,
           path);
  rc = run_cmd(cmd, out, sizeof out);
  if (rc != 0 || !strstr(out, "functions: passes") ||
      !strstr(out, "fusion off") || !strstr(out, "max_instantiations 5"))
    fail_msg("--check-config: exit %d: %s", rc, out);
  unlink(path);
}

/* `paradev function check FILE.json`: ok (ENGINE), or the daemon's error. */
static void test_cli_check(void **state) {
  (void)state;
  char path[] = "/tmp/pdfn-def-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char bad[] =
      "{\"name\": \"c\", \"args\": [{\"name\": \"x\", \"dtype\": 99}],"
      " \"outputs\": [{\"name\": \"y\", \"source\": \"x\"}]}";
  assert_int_equal(write(fd, bad, sizeof bad - 1), (ssize_t)(sizeof bad - 1));
  close(fd);
  char cmd[512], out[4096];
  snprintf(cmd, sizeof cmd, "%s --target %s function check %s 2>&1", cli_path,
           D.unix_target, path);
  int rc = run_cmd(cmd, out, sizeof out);
  if (rc != 1 || !strstr(out, "INVALID_ARGUMENT") || !strstr(out, "arg 0"))
    fail_msg("function check (bad dtype): exit %d: %s", rc, out);
  if (engine_present) {
    const char good[] =
        "{\"name\": \"c\", \"args\": [{\"name\": \"x\", \"dtype\": "
        "\"DTYPE_FLOAT32\"}], \"nodes\": [{\"name\": \"n\", \"op\": \"Neg\", "
        "\"inputs\": [\"x\"]}], \"outputs\": [{\"name\": \"y\", \"source\": "
        "\"n\"}], \"options\": {\"cse\": \"TRI_STATE_OFF\"}}";
    FILE *f = fopen(path, "w");
    fputs(good, f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s --target %s function check %s --describe 2>&1", cli_path,
             D.unix_target, path);
    rc = run_cmd(cmd, out, sizeof out);
    if (rc != 0 || strncmp(out, "ok\n", 3) != 0 ||
        !strstr(out, "\"op\":\"Neg\""))
      fail_msg("function check: exit %d: %s", rc, out);
  }
  unlink(path);
}

/* `paradev function check` on files of the wrong JSON types: every one
 * exits 2 (a bad file, as a usage error) with the JSON path and what was
 * expected, before any call; unknown members are refused. The trial's
 * `"args": 5` aborted the CLI in json-c (rc 134). */
static void test_cli_check_bad_json(void **state) {
  (void)state;
#define FN_HEAD "\"name\": \"c\", \"args\": [{\"name\": \"x\", \"dtype\": 1}], "
#define FN_OUT "\"outputs\": [{\"name\": \"y\", \"source\": \"n\"}]"
#define FN_NODE(extra)                                                         \
  "{" FN_HEAD                                                                  \
  "\"nodes\": [{\"name\": \"n\", \"op\": \"Neg\", "                            \
  "\"inputs\": [\"x\"]" extra "}], " FN_OUT "}"
#define FN_ATTR(value)                                                         \
  FN_NODE(", \"attrs\": [{\"name\": \"a\", \"value\": " value "}]")
  static const struct {
    const char *json, *want;
  } cases[] = {
      {"{\"name\": \"x\", \"args\": 5, \"nodes\": \"no\", " FN_OUT "}",
       "args: expected an array of objects, got a number"},
      {"{" FN_HEAD "\"outputs\": 5}",
       "outputs: expected an array of objects, got a number"},
      {"{" FN_HEAD "\"nodes\": {}, " FN_OUT "}",
       "nodes: expected an array of objects, got an object"},
      {"{" FN_HEAD "\"nodes\": [5], " FN_OUT "}",
       "nodes[0]: expected an object {name, op, inputs, attrs}, got a number"},
      {"{" FN_HEAD "\"nodes\": [{\"name\": \"n\", \"op\": \"Neg\", "
       "\"inputs\": \"x\"}], " FN_OUT "}",
       "nodes[0].inputs: expected an array of strings, got a string"},
      {"{" FN_HEAD "\"nodes\": [{\"name\": \"n\", \"op\": \"Neg\", "
       "\"inputs\": [{}]}], " FN_OUT "}",
       "nodes[0].inputs[0]: expected a string, got an object"},
      {"{" FN_HEAD "\"nodes\": [{\"name\": \"n\", \"op\": 3}], " FN_OUT "}",
       "nodes[0].op: expected a string, got a number"},
      {"{" FN_HEAD "\"nodes\": [{\"op\": \"Neg\"}], " FN_OUT "}",
       "nodes[0].name: expected a string, missing"},
      {FN_NODE(", \"input\": [\"x\"]"), "nodes[0].input: unknown field"},
      {FN_NODE(", \"attrs\": {\"a\": 1}"),
       "nodes[0].attrs: expected an array of objects, got an object"},
      {FN_NODE(", \"attrs\": [{\"name\": \"a\"}]"),
       "nodes[0].attrs[0].value: expected an object, missing"},
      {FN_ATTR("{\"i\": \"x1\"}"),
       "nodes[0].attrs[0].value.i: expected an integer, got a string"},
      {FN_ATTR("{\"f\": true}"),
       "nodes[0].attrs[0].value.f: expected a number, got a boolean"},
      {FN_ATTR("{\"b\": 1}"),
       "nodes[0].attrs[0].value.b: expected a boolean, got a number"},
      {FN_ATTR("{\"s\": []}"),
       "nodes[0].attrs[0].value.s: expected a string, got an array"},
      {FN_ATTR("{\"i\": 1, \"f\": 2}"),
       "nodes[0].attrs[0].value: expected exactly one of"},
      {FN_ATTR("{\"q\": 1}"), "nodes[0].attrs[0].value.q: unknown field"},
      {FN_ATTR("{\"shape\": {\"dims\": \"3\"}}"),
       "nodes[0].attrs[0].value.shape.dims: expected an array of integers, "
       "got a string"},
      {FN_ATTR("{\"intList\": {\"values\": [1, \"a\"]}}"),
       "nodes[0].attrs[0].value.intList.values[1]: expected an integer, got "
       "a string"},
      {FN_ATTR("{\"float_list\": [1.5]}"),
       "nodes[0].attrs[0].value.float_list: expected an object {values: "
       "[...]}, got an array"},
      {FN_ATTR("{\"dtype\": \"float99\"}"),
       "nodes[0].attrs[0].value.dtype: unknown dtype \"float99\""},
      {"{\"name\": 5}", "name: expected a string, got a number"},
      {"{\"name\": \"c\", \"bogus\": 1}", "bogus: unknown field"},
      {"{\"name\": \"c\", \"args\": [{\"name\": \"x\"}]}",
       "args[0].dtype: expected a dtype, missing"},
      {"{\"name\": \"c\", \"args\": [{\"name\": \"x\", \"dtype\": []}]}",
       "args[0].dtype: expected a dtype"},
      {"{\"name\": \"c\", \"args\": [{\"name\": \"x\", \"dtype\": 1, "
       "\"shape\": 1}]}",
       "args[0].shape: unknown field"},
      {"{" FN_HEAD "\"outputs\": [{\"name\": \"y\", \"source\": 3}]}",
       "outputs[0].source: expected a string, got a number"},
      {"{" FN_HEAD "\"outputs\": [\"x\"]}",
       "outputs[0]: expected an object {name, source}, got a string"},
      {"{\"name\": \"c\", \"options\": 5}",
       "options: expected an object, got a number"},
      {"{\"name\": \"c\", \"options\": {\"cse\": 7}}",
       "options.cse: expected TRI_STATE_DEFAULT"},
      {"{\"name\": \"c\", \"options\": {\"cse\": true}}",
       "options.cse: expected TRI_STATE_DEFAULT"},
      {"{\"name\": \"c\", \"options\": {\"maxInstantiations\": \"a\"}}",
       "options.max_instantiations: expected an integer, got a string"},
      {"{\"name\": \"c\", \"options\": {\"fuse\": \"ON\"}}",
       "options.fuse: unknown field"},
  };
#undef FN_ATTR
#undef FN_NODE
#undef FN_OUT
#undef FN_HEAD
  char path[] = "/tmp/pdfn-bad-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  char cmd[512], out[4096];
  snprintf(cmd, sizeof cmd, "%s --target %s function check %s 2>&1", cli_path,
           D.unix_target, path);
  int failures = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(cases[i].json, f);
    fclose(f);
    int rc = run_cmd(cmd, out, sizeof out);
    char want[512];
    snprintf(want, sizeof want, "%s: %s", path, cases[i].want);
    if (rc != 2 || !strstr(out, want)) {
      print_message("case %zu (%s): exit %d, expected 2 and \"%s\": %s\n", i,
                    cases[i].json, rc, want, out);
      failures++;
    }
  }
  /* The lowerCamel spellings protobuf's JSON mapping writes are taken. */
  if (engine_present) {
    FILE *f = fopen(path, "w");
    fputs(
        "{"
        "\"name\": \"camel\", \"args\": [{\"name\": \"x\", \"dtype\": "
        "\"float32\"}], \"nodes\": [{\"name\": \"n\", \"op\": \"Neg\", "
        "\"inputs\": [\"x\"], \"attrs\": []}], \"outputs\": "
        "[{\"name\": \"y\", \"source\": \"n\"}], \"options\": "
        "{\"constantFolding\": \"OFF\", \"bufferPlanning\": 2, "
        "\"maxInstantiations\": \"3\"}}",
        f);
    fclose(f);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc != 0 || strncmp(out, "ok\n", 3) != 0) {
      print_message("camelCase file: exit %d: %s\n", rc, out);
      failures++;
    }
  }
  unlink(path);
  assert_int_equal(failures, 0);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s PARADEVD PARADEV_CLI\n", argv[0]);
    return 2;
  }
  paradevd_path = argv[1];
  cli_path = argv[2];
  snprintf(conf_path, sizeof conf_path, "/tmp/pdfn-daemon-%d.conf",
           (int)getpid());
  FILE *f = fopen(conf_path, "w");
  if (!f) return 1;
  fputs(
      "[functions]\nfusion = off\nmax_instantiations = 5\n"
      "constant_folding_max_bytes = 4096\n",
      f);
  fclose(f);
  char ndev[8];
  snprintf(ndev, sizeof ndev, "%d", NDEV);
  const char *extra[] = {
      "--config",  conf_path, "--devices", ndev, "--default-memory-quota",
      "unlimited", NULL};
  pdt_daemon_start(&D, paradevd_path, "pdfn", false, extra);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_server_info_functions),
      cmocka_unit_test(test_wire_bounds),
      cmocka_unit_test(test_stream_item_error),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_cli_check),
      cmocka_unit_test(test_call_execute),
      cmocka_unit_test(test_cli_check_bad_json),
      cmocka_unit_test(test_call_stream),
      cmocka_unit_test(test_registration_errors),
      cmocka_unit_test(test_reregister),
      cmocka_unit_test(test_wrong_dtype),
      cmocka_unit_test(test_describe_miss),
      cmocka_unit_test(test_per_session_and_freed),
      cmocka_unit_test(test_function_limit),
  };
  int failed = cmocka_run_group_tests(tests, setup, teardown);
  int rc = pdt_daemon_stop(&D);
  unlink(conf_path);
  if (rc != 0) {
    fprintf(stderr, "paradevd exited with %d; its log:\n%s\n", rc, D.log);
    failed++;
  }
  free(D.log);
  return failed ? 1 : 0;
}
