/* Integration test of libparadev and the `paradev` command against the real
 * daemon.
 *
 * Starts paradevd (the built binary) on a temporary Unix socket and on
 * 127.0.0.1:0 (the bound port is read from the daemon's log), then goes
 * through every RPC with libparadev over each of the two transports, checking
 * values computed here by hand: upload -> Add/MatMul -> download, sharded
 * upload + AllReduce, per-component tensors, chunked transfers over the
 * message limit, 10,000 ops through one Enqueue stream, Describe before Sync,
 * Delete, the error of an op that fails on the devices, batches, deadlines
 * and cancellation, leases with and without the library's keep-alive, two
 * clients at once, and the CLI's info/health/ping.
 *
 * The Python test (test_daemon.py) covers the wire itself with a second gRPC
 * implementation, bad requests and shutdown; this one covers the C client.
 *
 * Usage: test_client PARADEVD PARADEV_CLI
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
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
/* White-box, for one thing only: test_deadline_and_cancel waits until its
 * Sync is registered with the cancel token (struct pd_cancel) before it
 * triggers it, so it tests the cancel of a call in flight every time. */
#include "client_int.h"

#define NDEV 4
#define MEM_LIMIT (64u << 20) /* per device */
#define MAX_MSG (1u << 20)    /* the daemon's message limit here */

static const char *paradevd_path;
static const char *cli_path;
static pdt_daemon D;

static void daemon_start(pdt_daemon *d) {
  char mem[32], msg[32], ndev[8];
  snprintf(mem, sizeof(mem), "%u", MEM_LIMIT);
  snprintf(msg, sizeof(msg), "%u", MAX_MSG);
  snprintf(ndev, sizeof(ndev), "%d", NDEV);
  /* No default session quota: these tests fill the small devices from one
   * session (test_memory.py tests the default quota). */
  const char *extra[] = {"--devices",
                         ndev,
                         "--memory-limit",
                         mem,
                         "--default-memory-quota",
                         "unlimited",
                         "--max-message-bytes",
                         msg,
                         "--grace-ms",
                         "2000",
                         NULL};
  pdt_daemon_start(d, paradevd_path, "pdclient", true, extra);
}

/* --- helpers ------------------------------------------------------------------ */

typedef struct env {
  const char *target;
  pd_client *c;
  pd_session *s;
  pd_status *st;
} env;

static pd_session *new_session(env *e, const char *name) {
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = name;
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

static void assert_floats(const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i])
      fail_msg("element %zu: got %.9g, expected %.9g", i, (double)got[i],
               (double)want[i]);
}

static void assert_shape(const pd_tensor_info *t, int rank,
                         const int64_t *dims) {
  assert_int_equal(t->rank, rank);
  for (int i = 0; i < rank; i++) assert_int_equal(t->dims[i], dims[i]);
}

/* --- group setup ----------------------------------------------------------------- */

static int group_setup(void **state, const char *target) {
  env *e = calloc(1, sizeof(*e));
  e->target = target;
  e->st = pd_status_new();
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.default_timeout_ms = 30000;
  e->c = pd_client_new(target, &co, e->st);
  if (!e->c) {
    fprintf(stderr, "pd_client_new(%s): %s\n", target,
            pd_status_message(e->st));
    return -1;
  }
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "test_client";
  so.job_id = "job-1";
  e->s = pd_session_new(e->c, &so, NULL, e->st);
  if (!e->s) {
    fprintf(stderr, "pd_session_new(%s): %s\n", target,
            pd_status_message(e->st));
    return -1;
  }
  *state = e;
  return 0;
}

static int setup_unix(void **state) {
  return group_setup(state, D.unix_target);
}
static int setup_tcp(void **state) { return group_setup(state, D.tcp_target); }

static int group_teardown(void **state) {
  env *e = *state;
  if (!e) return 0;
  if (e->s) {
    pd_code rc = pd_session_close(e->s, NULL, e->st);
    pd_session_delete(e->s);
    if (rc != PD_OK) {
      fprintf(stderr, "pd_session_close: %s\n", pd_status_message(e->st));
      return -1;
    }
  }
  pd_client_delete(e->c);
  pd_status_delete(e->st);
  free(e);
  return 0;
}

/* --- tests -------------------------------------------------------------------------- */

static void test_server_info(void **state) {
  env *e = *state;
  pd_server_info *info = pd_client_get_server_info(e->c, NULL, e->st);
  if (!info) fail_msg("GetServerInfo: %s", pd_status_message(e->st));
  assert_string_equal(pd_server_info_version(info), "0.1.0");
  assert_string_equal(pd_server_info_backend(info), "cpu");
  assert_int_equal(pd_server_info_num_devices(info), NDEV);
  assert_true(pd_server_info_incarnation(info) == pd_session_incarnation(e->s));
  assert_true(pd_server_info_start_time_ms(info) > 1600000000000LL);
  for (int i = 0; i < NDEV; i++) {
    const pd_device_info *d = pd_server_info_device(info, i);
    assert_non_null(d);
    assert_int_equal(d->index, i);
    assert_string_equal(d->kind, "cpu");
    assert_true(strlen(d->name) > 0);
    assert_int_equal(d->memory_limit_bytes, MEM_LIMIT);
    assert_true(d->memory_free_bytes + d->memory_used_bytes == MEM_LIMIT);
  }
  assert_null(pd_server_info_device(info, NDEV));
  const pd_limits *l = pd_server_info_limits(info);
  assert_int_equal(l->max_message_bytes, MAX_MSG);
  assert_int_equal(l->max_rank, PD_MAX_RANK);
  assert_true(l->max_chunk_bytes > 0 && l->max_chunk_bytes < MAX_MSG);
  assert_int_equal(l->default_lease_seconds, 60);
  assert_int_equal(pd_session_lease_seconds(e->s), 60);
  assert_int_equal(pd_session_num_devices(e->s), NDEV);
  /* A daemon of its own: no mesh (issue #16), the accessors say so. */
  assert_int_equal(pd_server_info_has_mesh(info), 0);
  assert_int_equal(pd_server_info_mesh_world_size(info), 1);
  assert_int_equal(pd_server_info_mesh_rank(info), 0);
  assert_int_equal(pd_server_info_mesh_devices_per_rank(info), NDEV);
  assert_int_equal(pd_server_info_mesh_formed(info), 0);
  assert_int_equal(pd_server_info_mesh_degraded(info), 0);
  assert_int_equal(pd_server_info_mesh_num_missing_ranks(info), 0);
  assert_int_equal(pd_server_info_mesh_missing_rank(info, 0), -1);
  assert_true(pd_server_info_mesh_epoch(info) == 0);
  assert_string_equal(pd_server_info_mesh_coordinator(info), "");
  assert_string_equal(pd_server_info_mesh_reason(info), "");
  assert_int_equal(pd_server_info_mesh_num_ranks(info), 0);
  assert_null(pd_server_info_mesh_rank_info(info, 0));
  pd_server_info_delete(info);
  assert_int_equal(pd_server_info_has_mesh(NULL), 0);
  assert_int_equal(pd_server_info_mesh_missing_rank(NULL, 0), -1);
}

static void test_health_and_echo(void **state) {
  env *e = *state;
  pd_serving_status s = PD_SERVING_UNKNOWN;
  OK(e, pd_client_health(e->c, "", &s, NULL, e->st));
  assert_int_equal(s, PD_SERVING);
  OK(e, pd_client_health(e->c, "paradev.v1.ParallelDevice", &s, NULL, e->st));
  assert_int_equal(s, PD_SERVING);
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_client_health(e->c, "no.Such", &s, NULL, e->st));

  size_t sizes[] = {0, 1, 1000, 700000};
  unsigned char *buf = malloc(700000), *back = malloc(700000);
  for (size_t i = 0; i < 700000; i++) buf[i] = (unsigned char)(i * 7 + 3);
  for (size_t k = 0; k < 4; k++) {
    size_t got = 12345;
    memset(back, 0, 700000);
    OK(e, pd_client_echo(e->c, buf, sizes[k], back, 700000, &got, NULL, e->st));
    assert_int_equal(got, sizes[k]);
    if (sizes[k]) assert_memory_equal(back, buf, sizes[k]);
  }
  /* Over the daemon's 1 MiB message limit. */
  unsigned char *big = calloc(2, MAX_MSG);
  EXPECT_CODE(
      e, PD_RESOURCE_EXHAUSTED,
      pd_client_echo(e->c, big, 2 * MAX_MSG, NULL, 0, NULL, NULL, e->st));
  free(big);
  free(buf);
  free(back);
}

static void test_add_matmul(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  const float a[6] = {1, 2, 3, 4, 5, 6};    /* 2x3 */
  const float b[6] = {7, 8, 9, 10, 11, 12}; /* 3x2 */
  const int64_t da[2] = {2, 3}, db[2] = {3, 2};
  pd_tensor_info ti;
  OK(e, pd_upload(s, 1, PD_FLOAT32, da, 2, a, sizeof(a), pd_layout_mirrored(),
                  &ti, NULL, e->st));
  assert_int_equal(ti.id, 1);
  assert_int_equal(ti.dtype, PD_FLOAT32);
  assert_shape(&ti, 2, da);
  upload_f32(e, s, 2, db, 2, b, pd_layout_mirrored());

  /* Add with a client-chosen id, MatMul with one the library picks. */
  uint64_t in_aa[2] = {1, 1}, in_ab[2] = {1, 2};
  uint64_t sum_id = 10, mm_id = 0, mmt_id = 0;
  pd_tensor_info out;
  OK(e, pd_execute(s, "Add", in_aa, 2, NULL, &sum_id, 1, &out, NULL, e->st));
  assert_int_equal(sum_id, 10);
  assert_shape(&out, 2, da);
  OK(e, pd_execute(s, "MatMul", in_ab, 2, NULL, &mm_id, 1, &out, NULL, e->st));
  assert_true(mm_id >= PD_FIRST_LIBRARY_ID);
  assert_int_equal(out.id, mm_id);
  const int64_t d22[2] = {2, 2};
  assert_shape(&out, 2, d22);
  /* A x A^T through the attribute builder. */
  pd_attrs *at = pd_attrs_new();
  pd_attrs_set_bool(at, "transpose_b", true);
  pd_attrs_set_bool(at, "transpose_a", false);
  pd_attrs_set_bool(at, "transpose_b", true); /* replaces, does not add */
  assert_int_equal(pd_attrs_count(at), 2);
  OK(e, pd_execute(s, "MatMul", in_aa, 2, at, &mmt_id, 1, &out, NULL, e->st));
  assert_shape(&out, 2, d22);
  pd_attrs_delete(at);

  float got[6];
  size_t nbytes = 0;
  OK(e, pd_download(s, sum_id, pd_layout_mirrored(), got, sizeof(got), &ti,
                    &nbytes, NULL, e->st));
  assert_int_equal(nbytes, sizeof(got));
  assert_shape(&ti, 2, da);
  const float want_sum[6] = {2, 4, 6, 8, 10, 12};
  assert_floats(got, want_sum, 6);
  /* [[1,2,3],[4,5,6]] x [[7,8],[9,10],[11,12]] */
  const float want_mm[4] = {58, 64, 139, 154};
  OK(e, pd_download(s, mm_id, pd_layout_component(3), got, sizeof(got), NULL,
                    NULL, NULL, e->st));
  assert_floats(got, want_mm, 4);
  const float want_mmt[4] = {14, 32, 32, 77};
  OK(e, pd_download(s, mmt_id, pd_layout_mirrored(), got, sizeof(got), NULL,
                    NULL, NULL, e->st));
  assert_floats(got, want_mmt, 4);
  /* A dtype that is none of pd_dtype's values: named, with the valid ones. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload(s, 3, (pd_dtype)99, da, 2, a, sizeof(a),
                        pd_layout_mirrored(), NULL, NULL, e->st));
  assert_string_equal(pd_status_message(e->st),
                      "pd_upload: dtype 99 is not a valid dtype; expected one "
                      "of float32, float64, float16, bfloat16, int32, int64, "
                      "uint8, bool");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload(s, 3, PD_DTYPE_INVALID, da, 2, a, sizeof(a),
                        pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "dtype 0 is not a valid dtype");
  /* A buffer too small says how much is needed. */
  EXPECT_CODE(e, PD_OUT_OF_RANGE,
              pd_download(s, mm_id, pd_layout_mirrored(), got, 8, NULL, NULL,
                          NULL, e->st));
  ASSERT_MSG_HAS(e, "16 bytes");
  OK(e, pd_delete(s, (uint64_t[]){1, 2, 10}, 3, NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){mm_id, mmt_id}, 2, NULL, e->st));
}

static void test_attrs_kinds(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  /* Fill: shape, float and dtype attributes. */
  pd_attrs *at = pd_attrs_new();
  const int64_t shp[2] = {2, 3};
  pd_attrs_set_shape(at, "shape", shp, 2);
  pd_attrs_set_float(at, "value", 2.5);
  pd_attrs_set_dtype(at, "dtype", PD_FLOAT64);
  uint64_t f = 0;
  pd_tensor_info ti;
  OK(e, pd_execute(s, "Fill", NULL, 0, at, &f, 1, &ti, NULL, e->st));
  assert_int_equal(ti.dtype, PD_FLOAT64);
  assert_shape(&ti, 2, shp);
  /* Transpose: int list. */
  pd_attrs_clear(at);
  const int64_t perm[2] = {1, 0};
  pd_attrs_set_int_list(at, "perm", perm, 2);
  uint64_t tr = 0;
  OK(e, pd_execute(s, "Transpose", &f, 1, at, &tr, 1, &ti, NULL, e->st));
  const int64_t shp_t[2] = {3, 2};
  assert_shape(&ti, 2, shp_t);
  /* Sum over axis 1 with keep_dims: int list and bool. */
  pd_attrs_clear(at);
  const int64_t axis1[1] = {1};
  pd_attrs_set_int_list(at, "axis", axis1, 1);
  pd_attrs_set_bool(at, "keep_dims", true);
  uint64_t sum = 0;
  OK(e, pd_execute(s, "Sum", &tr, 1, at, &sum, 1, &ti, NULL, e->st));
  const int64_t shp_s[2] = {3, 1};
  assert_shape(&ti, 2, shp_s);
  double dv[3];
  OK(e, pd_download(s, sum, pd_layout_mirrored(), dv, sizeof(dv), &ti, NULL,
                    NULL, e->st));
  assert_int_equal(ti.dtype, PD_FLOAT64);
  for (int i = 0; i < 3; i++) assert_true(dv[i] == 5.0);
  /* Cast to int32 (dtype), ArgMax (int + dtype). */
  pd_attrs_clear(at);
  pd_attrs_set_dtype(at, "DstT", PD_INT32);
  uint64_t ci = 0;
  OK(e, pd_execute(s, "Cast", &sum, 1, at, &ci, 1, &ti, NULL, e->st));
  assert_int_equal(ti.dtype, PD_INT32);
  int32_t iv[3];
  OK(e, pd_download(s, ci, pd_layout_mirrored(), iv, sizeof(iv), NULL, NULL,
                    NULL, e->st));
  for (int i = 0; i < 3; i++) assert_int_equal(iv[i], 5);
  pd_attrs_clear(at);
  pd_attrs_set_int(at, "axis", 0);
  pd_attrs_set_dtype(at, "output_type", PD_INT32);
  uint64_t am = 0;
  OK(e, pd_execute(s, "ArgMax", &ci, 1, at, &am, 1, &ti, NULL, e->st));
  assert_int_equal(ti.dtype, PD_INT32);
  /* A float list where an int list belongs: the daemon names the attr. */
  pd_attrs_clear(at);
  const double fl[2] = {1.0, 0.0};
  pd_attrs_set_float_list(at, "perm", fl, 2);
  uint64_t bad = 0;
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_execute(s, "Transpose", &f, 1, at, &bad, 1, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "perm");
  /* A bad value in the builder is reported by the call that uses it. */
  pd_attrs_clear(at);
  pd_attrs_set_shape(at, "shape", shp, PD_MAX_RANK + 1);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute(s, "Fill", NULL, 0, at, &bad, 1, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "shape");
  /* The whole rule, not a sentence cut short. */
  ASSERT_MSG_HAS(e,
                 "rank 9; a shape needs rank 0 to 8 and, for rank > 0, a "
                 "dims array of that many sizes");
  /* A string attribute of the wrong kind for its op. */
  pd_attrs_clear(at);
  pd_attrs_set_string(at, "reduction", "median");
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_execute(s, "AllReduce", &f, 1, at, &bad, 1, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "median");
  /* A NULL attribute name is named as such, not printed as "(null)". */
  pd_attrs_clear(at);
  pd_attrs_set_int(at, NULL, 1);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute(s, "Fill", NULL, 0, at, &bad, 1, NULL, NULL, e->st));
  assert_string_equal(pd_status_message(e->st),
                      "op Fill: attribute name is NULL; expected the "
                      "attribute's name, such as \"transpose_a\"");
  pd_attrs_delete(at);
  OK(e, pd_delete(s, (uint64_t[]){f, tr, sum, ci, am}, 5, NULL, e->st));
}

static void test_sharded_allreduce(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  /* x: 8x3 sharded on axis 0: component d holds rows 2d, 2d+1. */
  float x[24];
  for (int i = 0; i < 24; i++) x[i] = (float)(i * i % 17) - 3.0f;
  const int64_t dx[2] = {8, 3};
  pd_tensor_info ti;
  OK(e, pd_upload(s, 100, PD_FLOAT32, dx, 2, x, sizeof(x), pd_layout_sharded(0),
                  &ti, NULL, e->st));
  const int64_t dc[2] = {2, 3};
  assert_shape(&ti, 2, dc); /* every component is 2x3 */
  /* Per-component download gives the shards. */
  float parts[NDEV][6];
  void *bufs[NDEV];
  size_t caps[NDEV];
  pd_tensor_info infos[NDEV];
  for (int d = 0; d < NDEV; d++) {
    bufs[d] = parts[d];
    caps[d] = sizeof(parts[d]);
  }
  OK(e, pd_download_components(s, 100, NDEV, bufs, caps, infos, NULL, e->st));
  for (int d = 0; d < NDEV; d++) {
    assert_shape(&infos[d], 2, dc);
    assert_floats(parts[d], x + 6 * d, 6);
  }
  /* AllReduce sum and max, by hand. */
  float want_sum[6] = {0}, want_max[6];
  for (int k = 0; k < 6; k++) {
    want_max[k] = -1e30f;
    for (int d = 0; d < NDEV; d++) {
      want_sum[k] += x[6 * d + k];
      if (x[6 * d + k] > want_max[k]) want_max[k] = x[6 * d + k];
    }
  }
  pd_attrs *at = pd_attrs_new();
  pd_attrs_set_string(at, "reduction", "sum");
  uint64_t in = 100, sum_id = 101, max_id = 102;
  OK(e, pd_execute(s, "AllReduce", &in, 1, at, &sum_id, 1, &ti, NULL, e->st));
  assert_shape(&ti, 2, dc);
  pd_attrs_set_string(at, "reduction", "max");
  OK(e, pd_execute(s, "AllReduce", &in, 1, at, &max_id, 1, NULL, NULL, e->st));
  pd_attrs_delete(at);
  float got[24];
  for (int d = 0; d < NDEV; d++) {
    OK(e, pd_download(s, sum_id, pd_layout_component(d), got, sizeof(got), NULL,
                      NULL, NULL, e->st));
    assert_floats(got, want_sum, 6);
  }
  /* The concatenation along axis 0 is the sum four times. */
  size_t n = 0;
  OK(e, pd_download(s, max_id, pd_layout_sharded(0), got, sizeof(got), &ti, &n,
                    NULL, e->st));
  assert_int_equal(n, sizeof(got));
  assert_shape(&ti, 2, dx);
  for (int d = 0; d < NDEV; d++) assert_floats(got + 6 * d, want_max, 6);

  /* Uneven shards (10 rows on 4 devices: 3, 3, 2, 2): -1 in the shape. */
  float y[30];
  for (int i = 0; i < 30; i++) y[i] = (float)i;
  const int64_t dy[2] = {10, 3};
  OK(e, pd_upload(s, 103, PD_FLOAT32, dy, 2, y, sizeof(y), pd_layout_sharded(0),
                  &ti, NULL, e->st));
  assert_int_equal(ti.dims[0], -1);
  assert_int_equal(ti.dims[1], 3);
  pd_description *desc = pd_describe(s, (uint64_t[]){103}, 1, NULL, e->st);
  if (!desc) fail_msg("Describe: %s", pd_status_message(e->st));
  assert_int_equal(pd_description_num_components(desc, 0), NDEV);
  const int64_t rows[NDEV] = {3, 3, 2, 2};
  for (int d = 0; d < NDEV; d++) {
    pd_tensor_info ci;
    assert_true(pd_description_component(desc, 0, d, &ci));
    assert_int_equal(ci.dims[0], rows[d]);
    assert_int_equal(ci.dims[1], 3);
  }
  assert_int_equal(pd_description_bytes(desc, 0), sizeof(y));
  pd_description_delete(desc);
  float yb[30];
  OK(e, pd_download(s, 103, pd_layout_sharded(0), yb, sizeof(yb), &ti, NULL,
                    NULL, e->st));
  assert_shape(&ti, 2, dy);
  assert_floats(yb, y, 30);
  /* Sharded along axis 1 (3 columns on 4 devices: 1, 1, 1, 0). */
  OK(e, pd_upload(s, 104, PD_FLOAT32, dy, 2, y, sizeof(y), pd_layout_sharded(1),
                  NULL, NULL, e->st));
  float col[10];
  OK(e, pd_download(s, 104, pd_layout_component(1), col, sizeof(col), &ti, NULL,
                    NULL, e->st));
  for (int r = 0; r < 10; r++) assert_true(col[r] == y[r * 3 + 1]);
  OK(e, pd_download(s, 104, pd_layout_sharded(1), yb, sizeof(yb), NULL, NULL,
                    NULL, e->st));
  assert_floats(yb, y, 30);
  OK(e, pd_delete(s, (uint64_t[]){100, 101, 102, 103, 104}, 5, NULL, e->st));
}

static void test_per_component(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  int32_t v[NDEV][4];
  int64_t dims_store[NDEV][1];
  const int64_t *dims[NDEV];
  int ranks[NDEV];
  const void *data[NDEV];
  size_t bytes[NDEV];
  for (int d = 0; d < NDEV; d++) {
    for (int i = 0; i <= d; i++) v[d][i] = 100 * d + i;
    dims_store[d][0] = d + 1;
    dims[d] = dims_store[d];
    ranks[d] = 1;
    data[d] = v[d];
    bytes[d] = sizeof(int32_t) * (size_t)(d + 1);
  }
  pd_tensor_info ti;
  OK(e, pd_upload_components(s, 200, PD_INT32, NDEV, dims, ranks, data, bytes,
                             &ti, NULL, e->st));
  assert_int_equal(ti.rank, 1);
  assert_int_equal(ti.dims[0], -1);
  /* Add to itself: per-component shapes carry through. */
  uint64_t in[2] = {200, 200}, out = 201;
  OK(e, pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, e->st));
  int32_t got[NDEV][4];
  void *bufs[NDEV];
  size_t caps[NDEV];
  pd_tensor_info infos[NDEV];
  for (int d = 0; d < NDEV; d++) {
    bufs[d] = got[d];
    caps[d] = sizeof(got[d]);
  }
  OK(e, pd_download_components(s, 201, NDEV, bufs, caps, infos, NULL, e->st));
  for (int d = 0; d < NDEV; d++) {
    assert_int_equal(infos[d].dims[0], d + 1);
    for (int i = 0; i <= d; i++) assert_int_equal(got[d][i], 2 * v[d][i]);
  }
  /* Concatenated: 1 + 2 + 3 + 4 values in component order. */
  int32_t cat[10];
  OK(e, pd_download(s, 200, pd_layout_sharded(0), cat, sizeof(cat), &ti, NULL,
                    NULL, e->st));
  assert_int_equal(ti.dims[0], 10);
  int k = 0;
  for (int d = 0; d < NDEV; d++)
    for (int i = 0; i <= d; i++) assert_int_equal(cat[k++], v[d][i]);
  /* A wrong component count is refused before anything is sent. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload_components(s, 202, PD_INT32, NDEV - 1, dims, ranks,
                                   data, bytes, NULL, NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){200, 201}, 2, NULL, e->st));
}

static void test_chunked_transfer(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  /* 3 MiB + 12 bytes: over the 1 MiB message limit, not a chunk multiple. */
  size_t n = (3u << 20) / 4 + 3;
  float *x = malloc(n * 4), *y = malloc(n * 4);
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 1000003) * 0.5f;
  const int64_t dims[1] = {(int64_t)n};
  upload_f32(e, s, 300, dims, 1, x, pd_layout_mirrored());
  memset(y, 0, n * 4);
  OK(e, pd_download(s, 300, pd_layout_component(2), y, n * 4, NULL, NULL, NULL,
                    e->st));
  assert_memory_equal(x, y, n * 4);
  /* Through an op: x + x, downloaded whole. */
  uint64_t in[2] = {300, 300}, out = 301;
  OK(e, pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, e->st));
  OK(e, pd_download(s, 301, pd_layout_mirrored(), y, n * 4, NULL, NULL, NULL,
                    e->st));
  for (size_t i = 0; i < n; i++)
    if (y[i] != 2 * x[i])
      fail_msg("element %zu: %g != %g", i, (double)y[i], 2.0 * x[i]);
  /* A byte count that does not match the shape is refused locally. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload(s, 302, PD_FLOAT32, dims, 1, x, n * 4 - 1,
                        pd_layout_mirrored(), NULL, NULL, e->st));
  /* A live id is ALREADY_EXISTS. */
  EXPECT_CODE(e, PD_ALREADY_EXISTS,
              pd_upload(s, 300, PD_FLOAT32, dims, 1, x, n * 4,
                        pd_layout_mirrored(), NULL, NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){300, 301}, 2, NULL, e->st));
  free(x);
  free(y);
}

typedef struct replies {
  uint64_t count;
  uint64_t out_of_order;
  uint64_t failed;
  uint64_t last_failed_index;
  pd_code last_failed_code;
  uint64_t checked_outputs;
  int64_t expect_dim;
} replies;

static void on_reply(void *arg, const pd_stream_reply *r) {
  replies *p = arg;
  if (r->index != p->count) p->out_of_order++;
  p->count++;
  if (r->code != PD_OK) {
    p->failed++;
    p->last_failed_index = r->index;
    p->last_failed_code = r->code;
  } else if (r->num_outputs == 1) {
    if (r->outputs[0].rank == 1 && r->outputs[0].dims[0] == p->expect_dim &&
        r->outputs[0].dtype == PD_FLOAT32)
      p->checked_outputs++;
  }
}

static void test_enqueue_10000(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  replies rep = {0};
  rep.expect_dim = 4;
  pd_stream_options so = PD_STREAM_OPTIONS_INITIALIZER;
  so.on_reply = on_reply;
  so.on_reply_arg = &rep;
  so.max_in_flight = 512;
  pd_stream *t = pd_stream_new(s, &so, e->st);
  if (!t) fail_msg("pd_stream_new: %s", pd_status_message(e->st));
  /* one = 1.0 [4]; x_0 = one; x_i = x_{i-1} + one, deleting x_{i-1}. */
  pd_attrs *fill = pd_attrs_new();
  const int64_t d4[1] = {4};
  pd_attrs_set_shape(fill, "shape", d4, 1);
  pd_attrs_set_float(fill, "value", 1.0);
  uint64_t one = 0;
  OK(e, pd_stream_execute(t, "Fill", NULL, 0, fill, &one, 1, NULL, e->st));
  uint64_t prev = one;
  const int N = 10000;
  double t0 = pdt_now();
  for (int i = 1; i <= N; i++) {
    uint64_t in[2] = {prev, one}, out = 0, idx = 0;
    OK(e, pd_stream_execute(t, "Add", in, 2, NULL, &out, 1, &idx, e->st));
    if (prev != one) OK(e, pd_stream_delete_ids(t, &prev, 1, NULL, e->st));
    prev = out;
  }
  double queued = pdt_now() - t0;
  OK(e, pd_stream_wait(t, 60000, e->st));
  double answered = pdt_now() - t0;
  print_message(
      "  10,000 Adds (+ deletes) queued in %.3f s, all answered in "
      "%.3f s\n",
      queued, answered);
  uint64_t items = pd_stream_num_items(t);
  assert_int_equal(items, 1 + N + (N - 1));
  assert_int_equal(pd_stream_num_replies(t), items);
  assert_int_equal(rep.count, items);
  assert_int_equal(rep.out_of_order, 0);
  assert_int_equal(rep.failed, 0);
  assert_int_equal(rep.checked_outputs, 1 + N); /* every execute's [4] */
  float got[4];
  OK(e, pd_download(s, prev, pd_layout_component(1), got, sizeof(got), NULL,
                    NULL, NULL, e->st));
  for (int i = 0; i < 4; i++) assert_true(got[i] == (float)(N + 1));

  /* A failed item is reported with its index; the stream goes on. */
  uint64_t bad_out = 0, bad_idx = 0;
  OK(e, pd_stream_execute(t, "NoSuchOp", NULL, 0, NULL, &bad_out, 1, &bad_idx,
                          e->st));
  uint64_t in2[2] = {prev, one}, out2 = 0;
  OK(e, pd_stream_execute(t, "Add", in2, 2, NULL, &out2, 1, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT, pd_stream_wait(t, 30000, e->st));
  char want[64];
  snprintf(want, sizeof(want), "item %" PRIu64 ":", bad_idx);
  ASSERT_MSG_HAS(e, want);
  assert_int_equal(rep.last_failed_index, bad_idx);
  assert_int_equal(pd_stream_num_failed(t), 1);
  OK(e, pd_stream_wait(t, 30000, e->st)); /* reported once */
  OK(e, pd_stream_close(t, 30000, e->st));
  EXPECT_CODE(e, PD_FAILED_PRECONDITION,
              pd_stream_execute(t, "Add", in2, 2, NULL, &out2, 1, NULL, e->st));
  pd_stream_delete(t);
  OK(e, pd_download(s, out2, pd_layout_mirrored(), got, sizeof(got), NULL, NULL,
                    NULL, e->st));
  for (int i = 0; i < 4; i++) assert_true(got[i] == (float)(N + 2));
  OK(e, pd_delete(s, (uint64_t[]){one, prev, out2}, 3, NULL, e->st));
  pd_attrs_delete(fill);
}

static void test_stream_bad_session(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "stream-closed");
  pd_stream *t = pd_stream_new(s, NULL, e->st);
  if (!t) fail_msg("pd_stream_new: %s", pd_status_message(e->st));
  /* Close the session under the stream (another handle's view): the
   * daemon ends the stream with the session's error. */
  OK(e, pd_session_close(s, NULL, e->st));
  uint64_t out = 0;
  pd_code rc =
      pd_stream_execute(t, "ZerosLike", NULL, 0, NULL, &out, 1, NULL, e->st);
  if (rc == PD_OK) rc = pd_stream_wait(t, 10000, e->st);
  assert_int_equal(rc, PD_NOT_FOUND);
  pd_stream_delete(t);
  pd_session_delete(s);
  /* A stream deleted without pd_stream_close is cancelled, at once. */
  t = pd_stream_new(e->s, NULL, e->st);
  assert_non_null(t);
  pd_attrs *at = pd_attrs_new();
  const int64_t d2[1] = {2};
  pd_attrs_set_shape(at, "shape", d2, 1);
  pd_attrs_set_float(at, "value", 0.0);
  uint64_t ids[200];
  for (int i = 0; i < 200; i++) {
    ids[i] = 0;
    OK(e, pd_stream_execute(t, "Fill", NULL, 0, at, &ids[i], 1, NULL, e->st));
  }
  pd_attrs_delete(at);
  double t0 = pdt_now();
  pd_stream_delete(t);
  assert_true(pdt_now() - t0 < 5.0);
  /* Ops the daemon had not started fail with CANCELLED; the rest ran. */
  uint64_t failed = 0;
  pd_code rc2 = pd_sync(e->s, NULL, 0, &failed, NULL, e->st);
  if (rc2 != PD_OK) {
    assert_int_equal(rc2, PD_CANCELLED);
    ASSERT_MSG_HAS(e, "cancelled");
  }
  /* The ids that reached the daemon are handles; drop them. */
  pd_description *d = NULL;
  for (int i = 0; i < 200; i++) {
    d = pd_describe(e->s, &ids[i], 1, NULL, e->st);
    if (d) {
      pd_description_delete(d);
      OK(e, pd_delete(e->s, &ids[i], 1, NULL, e->st));
    } else {
      assert_int_equal(pd_status_code(e->st), PD_NOT_FOUND);
    }
  }
}

static void test_describe_before_sync(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  const int64_t d[2] = {384, 384};
  pd_attrs *at = pd_attrs_new();
  pd_attrs_set_shape(at, "shape", d, 2);
  pd_attrs_set_float(at, "value", 1.0 / 384);
  uint64_t m = 400;
  OK(e, pd_execute(s, "Fill", NULL, 0, at, &m, 1, NULL, NULL, e->st));
  pd_attrs_delete(at);
  /* 12 chained products: ~0.5 GFLOP per device in all. */
  uint64_t prev = m;
  for (int i = 0; i < 12; i++) {
    uint64_t in[2] = {prev, m}, out = 401 + (uint64_t)i;
    OK(e, pd_execute(s, "MatMul", in, 2, NULL, &out, 1, NULL, NULL, e->st));
    prev = out;
  }
  double t0 = pdt_now();
  pd_description *desc = pd_describe(s, &prev, 1, NULL, e->st);
  double took = pdt_now() - t0;
  if (!desc) fail_msg("Describe: %s", pd_status_message(e->st));
  pd_tensor_info ti;
  assert_true(pd_description_info(desc, 0, &ti));
  assert_int_equal(ti.id, prev);
  assert_int_equal(ti.dtype, PD_FLOAT32);
  assert_shape(&ti, 2, d);
  assert_int_equal(pd_description_bytes(desc, 0), 384u * 384u * 4u * NDEV);
  print_message("  Describe answered in %.2f ms; ready: %s\n", took * 1e3,
                pd_description_ready(desc, 0) ? "yes" : "not yet");
  pd_description_delete(desc);
  uint64_t failed = 99;
  OK(e, pd_sync(s, &prev, 1, &failed, NULL, e->st));
  assert_int_equal(failed, 0);
  desc = pd_describe(s, &prev, 1, NULL, e->st);
  assert_non_null(desc);
  assert_true(pd_description_ready(desc, 0));
  const char *msg = NULL;
  assert_int_equal(pd_description_status(desc, 0, &msg), PD_OK);
  assert_string_equal(msg, "");
  pd_description_delete(desc);
  /* (1/384 * ones)^13 = 1/384 * ones exactly in float32? Powers of the
   * all-1/384 matrix stay 1/384 (each entry is 384 * (1/384)^2). */
  float row[384];
  float *full = malloc(384 * 384 * 4);
  OK(e, pd_download(s, prev, pd_layout_mirrored(), full, 384 * 384 * 4, NULL,
                    NULL, NULL, e->st));
  memcpy(row, full, sizeof(row));
  for (int i = 0; i < 384; i++)
    if (fabsf(row[i] - 1.0f / 384) > 1e-6f)
      fail_msg("element %d: %g, expected %g", i, (double)row[i], 1.0 / 384);
  free(full);
  uint64_t ids[13];
  ids[0] = m;
  for (int i = 0; i < 12; i++) ids[i + 1] = 401 + (uint64_t)i;
  OK(e, pd_delete(s, ids, 13, NULL, e->st));
}

static void test_delete(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  const float v[2] = {1, 2};
  const int64_t d[1] = {2};
  upload_f32(e, s, 500, d, 1, v, pd_layout_mirrored());
  upload_f32(e, s, 501, d, 1, v, pd_layout_mirrored());
  upload_f32(e, s, 502, d, 1, v, pd_layout_mirrored());
  OK(e, pd_delete(s, (uint64_t[]){500, 501}, 2, NULL, e->st));
  uint64_t id = 500;
  pd_description *desc = pd_describe(s, &id, 1, NULL, e->st);
  assert_null(desc);
  assert_int_equal(pd_status_code(e->st), PD_NOT_FOUND);
  /* All or nothing: 502 stays when 999 is unknown. */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_delete(s, (uint64_t[]){502, 999}, 2, NULL, e->st));
  id = 502;
  desc = pd_describe(s, &id, 1, NULL, e->st);
  assert_non_null(desc);
  pd_description_delete(desc);
  /* A deleted id may be used again. */
  upload_f32(e, s, 500, d, 1, v, pd_layout_mirrored());
  float got[2];
  OK(e, pd_download(s, 500, pd_layout_mirrored(), got, sizeof(got), NULL, NULL,
                    NULL, e->st));
  assert_floats(got, v, 2);
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download(s, 501, pd_layout_mirrored(), got, sizeof(got), NULL,
                          NULL, NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){500, 502}, 2, NULL, e->st));
}

static void test_sync_error(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "oom");
  /* Two of these do not fit one device's 64 MiB. */
  int64_t n = MEM_LIMIT / 4 / 2 + 1;
  pd_attrs *at = pd_attrs_new();
  pd_attrs_set_shape(at, "shape", &n, 1);
  pd_attrs_set_float(at, "value", 1.0);
  pd_batch *b = pd_batch_new();
  uint64_t o1 = 1, o2 = 2;
  OK(e, pd_batch_add(b, s, "Fill", NULL, 0, at, &o1, 1, e->st));
  OK(e, pd_batch_add(b, s, "Fill", NULL, 0, at, &o2, 1, e->st));
  pd_code rc = pd_execute_batch(s, b, NULL, NULL, e->st);
  pd_batch_delete(b);
  pd_attrs_delete(at);
  if (rc == PD_RESOURCE_EXHAUSTED) { /* refused at submission: also fine */
    pd_session_delete(s);
    return;
  }
  OK(e, rc);
  /* A consumer of the failed tensor fails with its error. */
  uint64_t c_in[2] = {1, 2}, c_out = 3;
  OK(e, pd_execute(s, "Add", c_in, 2, NULL, &c_out, 1, NULL, NULL, e->st));
  uint64_t failed = 0;
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_sync(s, NULL, 0, &failed, NULL, e->st));
  assert_true(failed >= 1 && failed <= 3);
  char want[32];
  snprintf(want, sizeof(want), "handle %" PRIu64, failed);
  ASSERT_MSG_HAS(e, want);
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_sync(s, &c_out, 1, &failed, NULL, e->st));
  assert_int_equal(failed, 3);
  float f;
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_download(s, 3, pd_layout_mirrored(), &f, sizeof(f), NULL, NULL,
                          NULL, e->st));
  pd_description *desc = pd_describe(s, &c_out, 1, NULL, e->st);
  assert_non_null(desc);
  assert_true(pd_description_ready(desc, 0));
  const char *msg = NULL;
  assert_int_equal(pd_description_status(desc, 0, &msg), PD_RESOURCE_EXHAUSTED);
  assert_true(strlen(msg) > 0);
  pd_description_delete(desc);
  /* The session goes on. */
  OK(e, pd_delete(s, (uint64_t[]){1, 2, 3}, 3, NULL, e->st));
  const float v[1] = {21};
  const int64_t d[1] = {1};
  upload_f32(e, s, 4, d, 1, v, pd_layout_mirrored());
  uint64_t in[2] = {4, 4}, out = 5;
  OK(e, pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, e->st));
  OK(e, pd_sync(s, NULL, 0, &failed, NULL, e->st));
  OK(e, pd_download(s, 5, pd_layout_mirrored(), &f, sizeof(f), NULL, NULL, NULL,
                    e->st));
  assert_true(f == 42.0f);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

static void test_batch(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  const float v[3] = {1, 2, 3};
  const int64_t d[1] = {3};
  upload_f32(e, s, 600, d, 1, v, pd_layout_mirrored());
  pd_batch *b = pd_batch_new();
  uint64_t sq = 0, sum = 0;
  uint64_t in1[2] = {600, 600};
  OK(e, pd_batch_add(b, s, "Mul", in1, 2, NULL, &sq, 1, e->st));
  assert_true(sq >= PD_FIRST_LIBRARY_ID); /* picked now, usable below */
  uint64_t in2[2] = {sq, 600};
  OK(e, pd_batch_add(b, s, "Add", in2, 2, NULL, &sum, 1, e->st));
  assert_int_equal(pd_batch_num_ops(b), 2);
  assert_int_equal(pd_batch_num_outputs(b), 2);
  pd_tensor_info outs[2];
  OK(e, pd_execute_batch(s, b, outs, NULL, e->st));
  assert_int_equal(outs[0].id, sq);
  assert_int_equal(outs[1].id, sum);
  float got[3];
  OK(e, pd_download(s, sum, pd_layout_mirrored(), got, sizeof(got), NULL, NULL,
                    NULL, e->st));
  const float want[3] = {2, 6, 12};
  assert_floats(got, want, 3);
  /* All or nothing: op 1 is bad, so op 0's output does not exist. */
  pd_batch_clear(b);
  uint64_t ok_out = 0, bad_out = 0;
  OK(e, pd_batch_add(b, s, "Neg", &in1[0], 1, NULL, &ok_out, 1, e->st));
  OK(e, pd_batch_add(b, s, "MatMul", &in1[0], 1, NULL, &bad_out, 1, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute_batch(s, b, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "op 1");
  assert_null(pd_describe(s, &ok_out, 1, NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_NOT_FOUND);
  pd_batch_clear(b);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute_batch(s, b, NULL, NULL, e->st));
  pd_batch_delete(b);
  OK(e, pd_delete(s, (uint64_t[]){600, sq, sum}, 3, NULL, e->st));
}

/* Queues ~4 GFLOP per device of chained products on `s`; returns the last
 * id. */
static uint64_t queue_heavy(env *e, pd_session *s, uint64_t base) {
  const int64_t d[2] = {512, 512};
  pd_attrs *at = pd_attrs_new();
  pd_attrs_set_shape(at, "shape", d, 2);
  pd_attrs_set_float(at, "value", 1.0 / 512);
  uint64_t m = base;
  OK(e, pd_execute(s, "Fill", NULL, 0, at, &m, 1, NULL, NULL, e->st));
  pd_attrs_delete(at);
  pd_batch *b = pd_batch_new();
  uint64_t prev = m;
  for (int i = 1; i <= 16; i++) {
    uint64_t in[2] = {prev, m}, out = base + (uint64_t)i;
    OK(e, pd_batch_add(b, s, "MatMul", in, 2, NULL, &out, 1, e->st));
    prev = out;
  }
  OK(e, pd_execute_batch(s, b, NULL, NULL, e->st));
  pd_batch_delete(b);
  return prev;
}

/* Triggers the token once a call is in flight with it (registered by
 * pdc_call_start, under the token's mutex): no sleeping, no guessing. */
static void *cancel_when_in_flight(void *arg) {
  pd_cancel *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    if (n > 0) break;
    sched_yield();
  }
  pd_cancel_trigger(c);
  return NULL;
}

static void test_deadline_and_cancel(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "deadline");
  uint64_t last = queue_heavy(e, s, 1000);
  /* A Sync with a 1 ms deadline on work that takes far longer. */
  pd_call_options co = PD_CALL_OPTIONS_INITIALIZER;
  co.timeout_ms = 1;
  double t0 = pdt_now();
  EXPECT_CODE(e, PD_DEADLINE_EXCEEDED, pd_sync(s, &last, 1, NULL, &co, e->st));
  ASSERT_MSG_HAS(e, "deadline of 1 ms");
  assert_true(pdt_now() - t0 < 5.0);
  /* A waiting Sync cancelled from another thread. The daemon is stopped
   * (SIGSTOP) before the Sync is sent, so no reply can come before the
   * cancel however fast the work runs, and the token is triggered only once
   * the Sync is in flight with it: the cancel of a waiting call, every time.
   * The daemon learns of it when it runs again (SIGCONT). */
  OK(e, pd_sync(s, &last, 1, NULL, NULL, e->st));
  last = queue_heavy(e, s, 2000);
  pd_call_options cc = PD_CALL_OPTIONS_INITIALIZER;
  cc.cancel = pd_cancel_new();
  assert_non_null(cc.cancel);
  assert_int_equal(kill(D.pid, SIGSTOP), 0);
  int wst = 0;
  assert_int_equal(waitpid(D.pid, &wst, WUNTRACED), D.pid);
  assert_true(WIFSTOPPED(wst));
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, cancel_when_in_flight, cc.cancel),
                   0);
  pd_code rc = pd_sync(s, &last, 1, NULL, &cc, e->st);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(kill(D.pid, SIGCONT), 0);
  assert_int_equal(rc, PD_CANCELLED);
  ASSERT_MSG_HAS(e, "Sync: cancelled by the caller (pd_cancel)");
  assert_true(pd_cancel_is_triggered(cc.cancel));
  /* A triggered token fails new calls at once. */
  float f;
  EXPECT_CODE(e, PD_CANCELLED,
              pd_download(s, last, pd_layout_mirrored(), &f, sizeof(f), NULL,
                          NULL, &cc, e->st));
  EXPECT_CODE(e, PD_CANCELLED,
              pd_client_echo(e->c, "x", 1, NULL, 0, NULL, &cc, e->st));
  pd_cancel_delete(cc.cancel);
  /* The session is fine: the work completes and is right. */
  uint64_t failed = 1;
  OK(e, pd_sync(s, NULL, 0, &failed, NULL, e->st));
  assert_int_equal(failed, 0);
  float row[512];
  float *full = malloc(512 * 512 * 4);
  OK(e, pd_download(s, last, pd_layout_component(0), full, 512 * 512 * 4, NULL,
                    NULL, NULL, e->st));
  memcpy(row, full, sizeof(row));
  free(full);
  for (int i = 0; i < 512; i++) assert_true(fabsf(row[i] - 1.0f / 512) < 1e-6f);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

static void test_sessions(void **state) {
  env *e = *state;
  pd_session *a = new_session(e, "a");
  pd_session *b = new_session(e, "b");
  const float v[1] = {7};
  const int64_t d[1] = {1};
  upload_f32(e, a, 1, d, 1, v, pd_layout_mirrored());
  /* b does not see a's handle: NOT_FOUND as for an id that never existed. */
  float f;
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download(b, 1, pd_layout_mirrored(), &f, sizeof(f), NULL, NULL,
                          NULL, e->st));
  OK(e, pd_session_keep_alive(a, NULL, e->st));
  OK(e, pd_session_keep_alive_status(a, e->st));
  OK(e, pd_session_close(a, NULL, e->st));
  /* A closed session refuses calls locally. */
  EXPECT_CODE(e, PD_FAILED_PRECONDITION,
              pd_download(a, 1, pd_layout_mirrored(), &f, sizeof(f), NULL, NULL,
                          NULL, e->st));
  EXPECT_CODE(e, PD_FAILED_PRECONDITION, pd_session_close(a, NULL, e->st));
  pd_session_delete(a);
  pd_session_delete(b); /* closes it */
}

/* Leases: 1 s; idle for 2.5 s. With the library's keep-alive the session
 * lives on; without it, it is gone. */
static void test_lease_keep_alive(void **state) {
  env *e = *state;
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.lease_seconds = 1;
  so.client_name = "kept";
  pd_session *kept = pd_session_new(e->c, &so, NULL, e->st);
  assert_non_null(kept);
  so.keep_alive = false;
  so.client_name = "dropped";
  pd_session *dropped = pd_session_new(e->c, &so, NULL, e->st);
  assert_non_null(dropped);
  assert_int_equal(pd_session_lease_seconds(kept), 1);
  const float v[1] = {3};
  const int64_t d[1] = {1};
  upload_f32(e, kept, 1, d, 1, v, pd_layout_mirrored());
  upload_f32(e, dropped, 1, d, 1, v, pd_layout_mirrored());
  usleep(2500 * 1000);
  float f = 0;
  OK(e, pd_download(kept, 1, pd_layout_mirrored(), &f, sizeof(f), NULL, NULL,
                    NULL, e->st));
  assert_true(f == 3.0f);
  OK(e, pd_session_keep_alive_status(kept, e->st));
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download(dropped, 1, pd_layout_mirrored(), &f, sizeof(f), NULL,
                          NULL, NULL, e->st));
  EXPECT_CODE(e, PD_NOT_FOUND, pd_session_close(dropped, NULL, e->st));
  pd_session_delete(dropped);
  OK(e, pd_session_close(kept, NULL, e->st));
  pd_session_delete(kept);
}

typedef struct worker {
  const char *target;
  int k;
  char error[512];
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  pd_status *st = pd_status_new();
  pd_client *c = pd_client_new(w->target, NULL, st);
  pd_session *s = c ? pd_session_new(c, NULL, NULL, st) : NULL;
  for (int i = 0; s && i < 30 && !w->error[0]; i++) {
    float v[16], got[16];
    for (int j = 0; j < 16; j++) v[j] = (float)(w->k * 1000 + i * 16 + j);
    const int64_t d[1] = {16};
    uint64_t in[2] = {1, 1}, out = 2;
    /* Both workers use ids 1 and 2: sessions are separate namespaces. */
    if (pd_upload(s, 1, PD_FLOAT32, d, 1, v, sizeof(v), pd_layout_mirrored(),
                  NULL, NULL, st) != PD_OK ||
        pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, st) != PD_OK ||
        pd_download(s, 2, pd_layout_component(i % NDEV), got, sizeof(got), NULL,
                    NULL, NULL, st) != PD_OK ||
        pd_delete(s, (uint64_t[]){1, 2}, 2, NULL, st) != PD_OK) {
      snprintf(w->error, sizeof(w->error), "worker %d step %d: %s", w->k, i,
               pd_status_message(st));
      break;
    }
    for (int j = 0; j < 16; j++)
      if (got[j] != 2 * v[j]) {
        snprintf(w->error, sizeof(w->error), "worker %d step %d: %g != %g",
                 w->k, i, (double)got[j], 2.0 * v[j]);
        break;
      }
  }
  if (!s && !w->error[0])
    snprintf(w->error, sizeof(w->error), "worker %d: %s", w->k,
             pd_status_message(st));
  pd_session_delete(s);
  pd_client_delete(c);
  pd_status_delete(st);
  return NULL;
}

static void test_two_clients(void **state) {
  (void)state;
  worker w[2] = {{D.unix_target, 1, ""}, {D.tcp_target, 2, ""}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker_main, &w[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++)
    if (w[i].error[0]) fail_msg("%s", w[i].error);
}

static void test_unreachable(void **state) {
  env *e = *state;
  pd_client *c = pd_client_new("unix:/nonexistent/paradevd.sock", NULL, e->st);
  assert_non_null(c);
  pd_call_options co = PD_CALL_OPTIONS_INITIALIZER;
  co.timeout_ms = 5000;
  EXPECT_CODE(e, PD_UNAVAILABLE,
              pd_client_echo(c, "x", 1, NULL, 0, NULL, &co, e->st));
  ASSERT_MSG_HAS(e, "cannot reach unix:/nonexistent/paradevd.sock");
  /* A transport failure gets the connectivity hint, and on a Unix socket
   * never a TLS one (trial finding A5). */
  assert_string_equal(
      pd_status_hint(e->st),
      "check that paradevd runs and listens on this address, then retry");
  assert_null(strstr(pd_status_message(e->st), "tls://"));
  pd_client_delete(c);
  /* The daemon's own UNAVAILABLE (it was reached: mesh not whole, a session
   * the mesh ended, a URL it could not fetch) is not about reaching it. */
  pd_status_set(e->st, PD_UNAVAILABLE,
                "the mesh is not whole (degraded: rank 1 missing); open a "
                "session once every rank has attached again");
  assert_non_null(strstr(pd_status_hint(e->st), "mesh across machines"));
  pd_status_set(e->st, PD_UNAVAILABLE, "GET 'http://h/x': Connection refused");
  assert_string_equal(pd_status_hint(e->st),
                      "the daemon answered that it cannot do this now: see "
                      "the message, then retry");
  pd_status_set(e->st, PD_UNAVAILABLE, "failed to connect to all addresses");
  assert_non_null(strstr(pd_status_hint(e->st), "check that paradevd runs"));
  pd_status_set(e->st, PD_UNAVAILABLE, "");
  assert_non_null(strstr(pd_status_hint(e->st), "check that paradevd runs"));
  assert_null(pd_client_new("", NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  assert_null(pd_client_new("unix:", NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  /* Ports outside 1..65535 are refused (gRPC would dial 99999 - 65536). */
  assert_null(pd_client_new("127.0.0.1:99999", NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  assert_string_equal(pd_status_message(e->st),
                      "target \"127.0.0.1:99999\": port 99999 is out of range; "
                      "a port must be 1 to 65535");
  const char *bad[] = {"localhost:0", "[::1]:65536", "dns:///localhost:70000",
                       "127.0.0.1:18446744073709551617"};
  for (int i = 0; i < 4; i++) {
    assert_null(pd_client_new(bad[i], NULL, e->st));
    assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
    ASSERT_MSG_HAS(e, "a port must be 1 to 65535");
  }
  const char *good[] = {"127.0.0.1:1", "[::1]:65535", "dns:///localhost:7478",
                        "localhost", "unix:/tmp/x:99999"};
  for (int i = 0; i < 5; i++) {
    pd_client *ok = pd_client_new(good[i], NULL, e->st);
    if (!ok) fail_msg("%s: %s", good[i], pd_status_message(e->st));
    pd_client_delete(ok);
  }
  /* A path is a Unix socket; a host without a port gets paradevd's 7478
   * (not gRPC's 443). pd_client_target says what is dialed. */
  const char *given[] = {
      "/tmp/d.sock", "./d.sock",         "../d.sock",      "localhost",
      "[::1]",       "dns:///localhost", "127.0.0.1:7000", "unix:/tmp/d.sock"};
  const char *dialed[] = {"unix:/tmp/d.sock", "unix:./d.sock",
                          "unix:../d.sock",   "localhost:7478",
                          "[::1]:7478",       "dns:///localhost:7478",
                          "127.0.0.1:7000",   "unix:/tmp/d.sock"};
  for (int i = 0; i < 8; i++) {
    pd_client *t = pd_client_new(given[i], NULL, e->st);
    if (!t) fail_msg("%s: %s", given[i], pd_status_message(e->st));
    assert_string_equal(pd_client_target(t), dialed[i]);
    pd_client_delete(t);
  }
  assert_int_equal(PD_DEFAULT_PORT, 7478);
  const char *empty_port[] = {"localhost:", "[::1]:", "dns:///localhost:"};
  for (int i = 0; i < 3; i++) {
    assert_null(pd_client_new(empty_port[i], NULL, e->st));
    assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
    ASSERT_MSG_HAS(e,
                   "the port is empty; expected host:port (port 1 to 65535), "
                   "host (port 7478) or unix:/path");
    ASSERT_MSG_HAS(e, empty_port[i]);
  }
  /* A port is 1 to 65535 in decimal digits: gRPC would read "-1" and
   * "+65535" as 65535 and "abc" as port 0. */
  const char *not_digits[] = {"127.0.0.1:-1", "127.0.0.1:+65535",
                              "127.0.0.1:abc", "[::1]:0x50"};
  for (int i = 0; i < 4; i++) {
    assert_null(pd_client_new(not_digits[i], NULL, e->st));
    assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
    ASSERT_MSG_HAS(e, not_digits[i]);
    ASSERT_MSG_HAS(e, "a port must be 1 to 65535 in decimal digits");
  }
  /* An empty host, an unclosed bracket, an empty abstract name. */
  assert_null(pd_client_new(":44075", NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  assert_string_equal(pd_status_message(e->st),
                      "target \":44075\": no host before the colon; expected "
                      "host:port (port 1 to 65535)");
  assert_null(pd_client_new("dns:///", NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "no host");
  assert_null(pd_client_new("[::1", NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "expected [v6]:port or [v6] for an IPv6 address");
  assert_null(pd_client_new("unix-abstract:", NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "expected \"unix-abstract:NAME\"");
  /* A bare IPv6 address gets brackets and paradevd's port. */
  const char *v6[] = {"::1", "dns:///::1", "fe80::1"};
  const char *v6_dialed[] = {"[::1]:7478", "dns:///[::1]:7478",
                             "[fe80::1]:7478"};
  for (int i = 0; i < 3; i++) {
    pd_client *t = pd_client_new(v6[i], NULL, e->st);
    if (!t) fail_msg("%s: %s", v6[i], pd_status_message(e->st));
    assert_string_equal(pd_client_target(t), v6_dialed[i]);
    pd_client_delete(t);
  }
  /* A Unix socket's path is at most sizeof(sun_path) - 1 = 107 bytes. */
  char path[160] = "/";
  memset(path + 1, 'p', 106);
  pd_client *p107 = pd_client_new(path, NULL, e->st);
  if (!p107) fail_msg("107 bytes: %s", pd_status_message(e->st));
  pd_client_delete(p107);
  path[107] = 'p';
  const char *long_forms[] = {"", "unix:", "unix://", "unix-abstract:"};
  for (int i = 0; i < 4; i++) {
    char t[200];
    snprintf(t, sizeof(t), "%s%s", long_forms[i], path);
    assert_null(pd_client_new(t, NULL, e->st));
    assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
    ASSERT_MSG_HAS(e, "the socket path is 108 bytes; at most 107");
  }
  /* The real daemon, by its socket's bare path. */
  assert_true(strncmp(D.unix_target, "unix:", 5) == 0);
  pd_client *bare = pd_client_new(D.unix_target + 5, NULL, e->st);
  assert_non_null(bare);
  assert_string_equal(pd_client_target(bare), D.unix_target);
  OK(e, pd_client_echo(bare, "x", 1, NULL, 0, NULL, NULL, e->st));
  pd_client_delete(bare);
}

/* Options structs: a struct_size that is not the initializer's and
 * out-of-range fields are refused, naming the field and what is expected. */
static void test_options_checked(void **state) {
  env *e = *state;
  pd_call_options co = PD_CALL_OPTIONS_INITIALIZER;
  co.timeout_ms = -5;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_client_echo(e->c, "x", 1, NULL, 0, NULL, &co, e->st));
  ASSERT_MSG_HAS(e,
                 "pd_call_options.timeout_ms is -5; expected a number of "
                 "milliseconds > 0, PD_TIMEOUT_DEFAULT (0) or "
                 "PD_TIMEOUT_NONE (-1)");
  uint64_t id = pd_session_new_id(e->s);
  const float v[2] = {1, 2};
  const int64_t d[1] = {2};
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload(e->s, id, PD_FLOAT32, d, 1, v, sizeof(v),
                        pd_layout_mirrored(), NULL, &co, e->st));
  ASSERT_MSG_HAS(e, "pd_call_options.timeout_ms is -5");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT, pd_sync(e->s, NULL, 0, NULL, &co, e->st));
  ASSERT_MSG_HAS(e, "pd_call_options.timeout_ms is -5");
  co = (pd_call_options)PD_CALL_OPTIONS_INITIALIZER;
  co.struct_size = 0;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_client_echo(e->c, "x", 1, NULL, 0, NULL, &co, e->st));
  ASSERT_MSG_HAS(e, "pd_call_options.struct_size is 0; expected");
  ASSERT_MSG_HAS(e, "PD_CALL_OPTIONS_INITIALIZER");
  co.struct_size = sizeof(co) + 8;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download(e->s, id, pd_layout_mirrored(), NULL, 0, NULL, NULL,
                          &co, e->st));
  ASSERT_MSG_HAS(e, "pd_call_options.struct_size is");
  /* The values that are allowed still are. */
  co = (pd_call_options)PD_CALL_OPTIONS_INITIALIZER;
  co.timeout_ms = PD_TIMEOUT_NONE;
  OK(e, pd_client_echo(e->c, "x", 1, NULL, 0, NULL, &co, e->st));
  co.timeout_ms = 20000;
  OK(e, pd_upload(e->s, id, PD_FLOAT32, d, 1, v, sizeof(v),
                  pd_layout_mirrored(), NULL, &co, e->st));
  OK(e, pd_delete(e->s, &id, 1, &co, e->st));
  /* The other options structs. */
  pd_client_options clo = PD_CLIENT_OPTIONS_INITIALIZER;
  clo.struct_size = 0;
  assert_null(pd_client_new(e->target, &clo, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "pd_client_options.struct_size is 0");
  clo = (pd_client_options)PD_CLIENT_OPTIONS_INITIALIZER;
  clo.default_timeout_ms = -5;
  assert_null(pd_client_new(e->target, &clo, e->st));
  ASSERT_MSG_HAS(e, "default_timeout_ms is -5");
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.struct_size = 0;
  assert_null(pd_session_new(e->c, &so, NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "pd_session_options.struct_size is 0");
  co.timeout_ms = -5;
  assert_null(pd_session_new(e->c, NULL, &co, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "pd_call_options.timeout_ms is -5");
  pd_stream_options to = PD_STREAM_OPTIONS_INITIALIZER;
  to.struct_size = 0;
  assert_null(pd_stream_new(e->s, &to, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "pd_stream_options.struct_size is 0");
  to = (pd_stream_options)PD_STREAM_OPTIONS_INITIALIZER;
  to.timeout_ms = -5;
  assert_null(pd_stream_new(e->s, &to, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "timeout_ms -5 must be >= 0");
}

/* --- the CLI ------------------------------------------------------------------- */

typedef struct cli_out {
  int rc;
  char out[16384];
  char err[4096];
} cli_out;

static void read_file(const char *path, char *buf, size_t len) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* Runs the CLI with `args` (a shell fragment); env_target sets
 * PARADEV_TARGET (NULL: unset). */
static void run_cli(cli_out *o, const char *env_target, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void run_cli(cli_out *o, const char *env_target, const char *fmt, ...) {
  char args[1024], cmd[2048], outp[128], errp[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof(args), fmt, ap);
  va_end(ap);
  snprintf(outp, sizeof(outp), "%s/cli.out", D.dir);
  snprintf(errp, sizeof(errp), "%s/cli.err", D.dir);
  snprintf(cmd, sizeof(cmd), "%s%s %s %s >%s 2>%s",
           env_target ? "PARADEV_TARGET=" : "env -u PARADEV_TARGET",
           env_target ? env_target : "", cli_path, args, outp, errp);
  int status = system(cmd);
  o->rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  read_file(outp, o->out, sizeof(o->out));
  read_file(errp, o->err, sizeof(o->err));
  unlink(outp);
  unlink(errp);
}

#define ASSERT_HAS(hay, needle)                                                \
  do {                                                                         \
    if (!strstr((hay), (needle)))                                              \
      fail_msg("output does not contain \"%s\":\n%s", (needle), (hay));        \
  } while (0)

static void test_cli(void **state) {
  env *e = *state;
  cli_out *o = calloc(1, sizeof(*o));
  run_cli(o, NULL, "--target %s info", e->target);
  if (o->rc != 0) fail_msg("paradev info: rc %d\n%s%s", o->rc, o->out, o->err);
  ASSERT_HAS(o->out, "paradevd 0.1.0 at ");
  ASSERT_HAS(o->out, e->target);
  ASSERT_HAS(o->out, "backend      cpu");
  ASSERT_HAS(o->out, "devices: 4");
  ASSERT_HAS(o->out, "  3   cpu:3");
  ASSERT_HAS(o->out, "KIND  GPU"); /* each device's physical GPU (issue #17) */
  ASSERT_HAS(o->out, "64.0 MiB");  /* the device memory limit */
  ASSERT_HAS(o->out, "max_message_bytes        1048576 (1.0 MiB)");
  ASSERT_HAS(o->out, "lease_seconds            60 default");
  /* PARADEV_TARGET is the default target. */
  run_cli(o, e->target, "health");
  assert_int_equal(o->rc, 0);
  assert_string_equal(o->out, "SERVING\n");
  run_cli(o, NULL, "--target %s health --service paradev.v1.ParallelDevice",
          e->target);
  assert_int_equal(o->rc, 0);
  run_cli(o, NULL, "--target %s health --service no.Such", e->target);
  assert_int_equal(o->rc, 1);
  ASSERT_HAS(o->err, "unknown service \"no.Such\"");
  ASSERT_HAS(o->err, "NOT_FOUND (no such service");
  assert_null(strstr(o->err, "session")); /* not the sessions' advice */
  /* --timeout: a number and a unit, 1ms to 24h; a bare number is refused
   * (it meant milliseconds here and seconds under admin). */
  const char *timeouts[] = {"10000ms", "10s", "1m", "24h", "2.5s", "1500ms"};
  for (int i = 0; i < 6; i++) {
    run_cli(o, NULL, "--target %s --timeout %s health", e->target, timeouts[i]);
    if (o->rc != 0)
      fail_msg("--timeout %s: rc %d\n%s", timeouts[i], o->rc, o->err);
  }
  const char *bad_timeouts[] = {"0",   "0ms", "0.4ms", "86400001ms",
                                "25h", "-1s", "1e3",   "10x",
                                "s",   "inf", "10000", "2.5"};
  for (int i = 0; i < 12; i++) {
    run_cli(o, NULL, "--target %s --timeout %s health", e->target,
            bad_timeouts[i]);
    if (o->rc != 2)
      fail_msg("--timeout %s: rc %d, expected 2\n%s", bad_timeouts[i], o->rc,
               o->err);
    ASSERT_HAS(o->err,
               "expected a time from 1ms to 24h, such as 500ms, 2s or "
               "1m (a number needs a unit: ms, s, m or h)");
  }
  /* A bad target is a usage error (2), named with what is allowed. */
  run_cli(o, NULL, "--target 127.0.0.1:99999 info");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o->err, "port 99999 is out of range; a port must be 1 to 65535");
  ASSERT_HAS(o->err, "Try 'paradev --help'");
  run_cli(o, "127.0.0.1:0", "health");
  assert_int_equal(o->rc, 2);
  run_cli(o, NULL, "--target unix: ping");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o->err, "has no path");
  /* Ports gRPC reads leniently, an empty host or name, a long path. */
  const char *bad_targets[] = {"127.0.0.1:-1",
                               "127.0.0.1:+65535",
                               "127.0.0.1:abc",
                               ":44075",
                               "unix-abstract:",
                               "/tmp/"
                               "ppppppppppppppppppppppppppppppppppppppppppppp"
                               "ppppppppppppppppppppppppppppppppppppppppppppp"
                               "pppppppppppppppppppppppppp"};
  const char *bad_says[] = {
      "in decimal digits", "in decimal digits",
      "in decimal digits", "no host before the colon",
      "has no name",       "the socket path is 121 bytes; at most 107"};
  for (int i = 0; i < 6; i++) {
    run_cli(o, NULL, "--target '%s' health", bad_targets[i]);
    if (o->rc != 2)
      fail_msg("--target %s: rc %d, expected 2\n%s", bad_targets[i], o->rc,
               o->err);
    ASSERT_HAS(o->err, bad_targets[i]);
    ASSERT_HAS(o->err, bad_says[i]);
    assert_null(strstr(o->err, "PARADEV_TARGET"));
  }
  /* A bad $PARADEV_TARGET is named as the target's source. */
  run_cli(o, "127.0.0.1:abc", "health");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o->err, "port \"abc\" is not a number");
  ASSERT_HAS(o->err, "(the target came from $PARADEV_TARGET)");
  /* admin uses its own socket: --target gets a note, not silence. */
  run_cli(o, NULL,
          "--target 127.0.0.1:1 admin --socket /nonexistent/a.sock "
          "--timeout 5s sessions");
  assert_int_equal(o->rc, 1);
  ASSERT_HAS(o->err,
             "paradev: note: --target 127.0.0.1:1 is not used by admin "
             "commands; they talk to the admin socket: 'paradev admin "
             "--socket PATH'");
  /* admin's own --target: a remote operator on a client listener. */
  run_cli(o, NULL, "admin --timeout 5s --target 127.0.0.1:1 sessions");
  assert_int_equal(o->rc, 1);
  ASSERT_HAS(o->err, "is paradevd listening on 127.0.0.1:1 without TLS?");
  run_cli(o, NULL, "admin --tls-ca /nonexistent.pem sessions");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o->err, "--tls-ca needs --target HOST:PORT");
  run_cli(o, NULL, "--target %s ping --count 25 --size 300", e->target);
  if (o->rc != 0) fail_msg("paradev ping: rc %d\n%s%s", o->rc, o->out, o->err);
  ASSERT_HAS(o->out, "300-byte Echo");
  ASSERT_HAS(o->out, "seq=24 time=");
  ASSERT_HAS(o->out, "25 round trips of 300 bytes");
  double p50, p90, p99, mx;
  const char *l = strstr(o->out, "latency p50");
  assert_non_null(l);
  assert_int_equal(
      sscanf(l, "latency p50 %lf ms, p90 %lf ms, p99 %lf ms, max %lf ms", &p50,
             &p90, &p99, &mx),
      4);
  assert_true(p50 > 0 && p50 <= p90 && p90 <= p99 && p99 <= mx);
  run_cli(o, NULL, "--target %s ping -q --count=3 --size=1K", e->target);
  assert_int_equal(o->rc, 0);
  assert_null(strstr(o->out, "seq="));
  ASSERT_HAS(o->out, "3 round trips of 1024 bytes");
  /* Errors: unreachable, bad usage. */
  run_cli(o, NULL, "--target unix:/nonexistent/x.sock --timeout 5s info");
  assert_int_equal(o->rc, 1);
  ASSERT_HAS(o->err, "cannot reach unix:/nonexistent/x.sock");
  run_cli(o, "unix:/nonexistent/x.sock", "health");
  assert_int_equal(o->rc, 1);
  ASSERT_HAS(o->err, "cannot reach unix:/nonexistent/x.sock");
  /* A path without "unix:" is a Unix socket, not a host name for DNS. */
  run_cli(o, NULL, "--target /nonexistent/x.sock --timeout 5s info");
  assert_int_equal(o->rc, 1);
  ASSERT_HAS(o->err, "cannot reach unix:/nonexistent/x.sock");
  run_cli(o, NULL, "--target %s health", D.unix_target + 5);
  if (o->rc != 0)
    fail_msg("--target %s: rc %d\n%s", D.unix_target + 5, o->rc, o->err);
  assert_string_equal(o->out, "SERVING\n");
  /* An empty port is a usage error; a host without one gets 7478. */
  run_cli(o, NULL, "--target localhost: info");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o->err, "target \"localhost:\": the port is empty");
  run_cli(o, NULL, "--target %s frobnicate", e->target);
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o->err, "unknown command 'frobnicate'");
  run_cli(o, NULL, "ping --count 0");
  assert_int_equal(o->rc, 2);
  run_cli(o, NULL, "%s", "");
  assert_int_equal(o->rc, 2);
  /* --help: the top and every command. */
  const char *helps[] = {"--help", "info --help", "health --help",
                         "ping --help", "help"};
  for (int i = 0; i < 5; i++) {
    run_cli(o, NULL, "%s", helps[i]);
    assert_int_equal(o->rc, 0);
    ASSERT_HAS(o->out, "Usage: paradev");
  }
  run_cli(o, NULL, "--help");
  ASSERT_HAS(o->out, "2 a bad command\nline, a bad --target included");
  ASSERT_HAS(o->out, "a number needs a unit (default 10s)");
  ASSERT_HAS(o->out, "starts with / or ./ is a Unix socket too");
  ASSERT_HAS(o->out, "without a port gets paradevd's 7478");
  ASSERT_HAS(o->out, "::1 is [::1]:7478");
  ASSERT_HAS(o->out, "admin commands do not use it");
  run_cli(o, NULL, "admin --help");
  assert_int_equal(o->rc, 0);
  ASSERT_HAS(o->out, "a number needs a unit (default 60s)");
  ASSERT_HAS(o->out, "Exit status: 0 done;");
  run_cli(o, NULL, "admin --timeout 0 sessions");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o->err,
             "--timeout '0': expected a time from 1ms to 24h, such as "
             "500ms, 2s or 1m (a number needs a unit: ms, s, m or h)");
  /* The same reading as the top level's: a bare number is refused. */
  run_cli(o, NULL, "admin --timeout 5 sessions");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o->err,
             "--timeout '5': expected a time from 1ms to 24h, such as "
             "500ms, 2s or 1m (a number needs a unit: ms, s, m or h)");
  run_cli(o, NULL, "--version");
  assert_int_equal(o->rc, 0);
  assert_string_equal(o->out, "paradev 0.1.0\n");
  free(o);
}

/* --- main -------------------------------------------------------------------------- */

/* --- the op reference and layouts that never guess (issue 12) ------------------ */

/* ListOps through pd_list_ops, against what device/ops/linalg.c and
 * reduce.c declare (read there, not from this library), and `paradev ops`. */
static void test_list_ops(void **state) {
  env *e = *state;
  pd_op_info *ops = NULL;
  int n = 0;
  OK(e, pd_list_ops(e->c, NULL, &ops, &n, NULL, e->st));
  assert_true(n >= 50);
  for (int i = 0; i < n; i++) {
    if (!ops[i].summary[0]) fail_msg("op %s has no summary", ops[i].name);
    if (i) assert_true(strcmp(ops[i - 1].name, ops[i].name) < 0);
  }
  const pd_op_info *mm = pd_ops_find(ops, n, "MatMul");
  assert_non_null(mm);
  assert_int_equal(mm->num_inputs, 2);
  assert_string_equal(mm->inputs[0].name, "a");
  assert_string_equal(mm->inputs[1].name, "b");
  assert_false(mm->inputs[0].is_list);
  uint32_t floats = PD_DTYPE_BIT(PD_FLOAT32) | PD_DTYPE_BIT(PD_FLOAT64) |
                    PD_DTYPE_BIT(PD_FLOAT16) | PD_DTYPE_BIT(PD_BFLOAT16);
  assert_int_equal(mm->inputs[0].dtypes, floats);
  assert_int_equal(mm->num_outputs, 1);
  assert_string_equal(mm->outputs[0].name, "product");
  assert_int_equal(mm->num_attrs, 2);
  const char *tnames[] = {"transpose_a", "transpose_b"};
  for (int i = 0; i < 2; i++) {
    const pd_op_attr *a = pd_op_info_attr(mm, tnames[i]);
    assert_non_null(a);
    assert_int_equal(a->kind, PD_ATTR_KIND_BOOL);
    assert_true(a->has_default);
    assert_false(a->default_value.b);
  }
  assert_true(mm->has_gradient);
  assert_false(mm->is_collective);
  /* Sum: an int-list axis defaulting to [] and the TF difference noted. */
  const pd_op_info *sum = pd_ops_find(ops, n, "Sum");
  assert_non_null(sum);
  const pd_op_attr *axis = pd_op_info_attr(sum, "axis");
  assert_int_equal(axis->kind, PD_ATTR_KIND_INT_LIST);
  assert_true(axis->has_default);
  assert_int_equal(axis->default_value.n, 0);
  ASSERT_HAS(sum->notes, "Differs from tf.raw_ops.Sum");
  ASSERT_HAS(sum->notes, "reduction_indices");
  /* Concat: one list input of at least one tensor; a required axis. */
  const pd_op_info *cc = pd_ops_find(ops, n, "Concat");
  assert_true(cc->inputs[0].is_list);
  assert_int_equal(cc->inputs[0].min_length, 1);
  assert_false(pd_op_info_attr(cc, "axis")->has_default);
  /* AllReduce: a collective; reduction a string of five values, "sum". */
  const pd_op_info *ar = pd_ops_find(ops, n, "AllReduce");
  assert_true(ar->is_collective);
  const pd_op_attr *red = pd_op_info_attr(ar, "reduction");
  assert_int_equal(red->kind, PD_ATTR_KIND_STRING);
  assert_string_equal(red->default_value.s, "sum");
  assert_int_equal(red->num_allowed_values, 5);
  /* Fill: shape a SHAPE attribute, no inputs; ArgMax has no gradient. */
  const pd_op_info *fill = pd_ops_find(ops, n, "Fill");
  assert_int_equal(fill->num_inputs, 0);
  assert_int_equal(pd_op_info_attr(fill, "shape")->kind, PD_ATTR_KIND_SHAPE);
  assert_false(pd_ops_find(ops, n, "ArgMax")->has_gradient);
  pd_ops_free(ops, n);

  /* One op by name, and a name no op has. */
  OK(e, pd_list_ops(e->c, "MatMul", &ops, &n, NULL, e->st));
  assert_int_equal(n, 1);
  assert_string_equal(ops[0].name, "MatMul");
  pd_ops_free(ops, n);
  ops = NULL;
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_list_ops(e->c, "NoSuchOp", &ops, &n, NULL, e->st));
  ASSERT_HAS(pd_status_message(e->st), "no op named 'NoSuchOp'");
  assert_null(ops);

  cli_out *o = calloc(1, sizeof(*o));
  run_cli(o, NULL, "--target %s ops MatMul", e->target);
  if (o->rc != 0) fail_msg("paradev ops MatMul: rc %d\n%s", o->rc, o->err);
  ASSERT_HAS(o->out, "MatMul: product = op(a) @ op(b)");
  ASSERT_HAS(o->out, "float32, float64, float16, bfloat16 (same as a)");
  ASSERT_HAS(o->out, "transpose_a            bool        default false");
  ASSERT_HAS(o->out, "Gradient: yes");
  run_cli(o, NULL, "--target %s ops", e->target);
  assert_int_equal(o->rc, 0);
  ASSERT_HAS(o->out, "MatMul ");
  ASSERT_HAS(o->out, "a, b -> product");
  run_cli(o, NULL, "--target %s ops NoSuchOp", e->target);
  assert_int_equal(o->rc, 1);
  ASSERT_HAS(o->err, "no op named 'NoSuchOp'");
  /* One source: the Markdown through the wire is the checked-in
   * docs/ops.md, which tools/gen_ops_md made from the registry directly. */
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%s --target %s ops --markdown > %s/ops.md && cmp %s/ops.md %s",
           cli_path, e->target, D.dir, D.dir, PD_TEST_OPS_MD);
  if (system(cmd) != 0)
    fail_msg("'paradev ops --markdown' differs from %s", PD_TEST_OPS_MD);
  free(o);
}

/* A download never guesses: no layout (UNSPECIFIED) is refused naming the
 * layouts; MIRRORED of a sharded tensor is refused; the session goes on. */
static void test_layouts_never_guess(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, "layouts");
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
  int64_t dims[1] = {8};
  pd_layout unspecified = {PD_LAYOUT_UNSPECIFIED, 0, 0};
  /* An upload with UNSPECIFIED is MIRRORED. */
  upload_f32(e, s, 1, dims, 1, x, unspecified);
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_download(s, 1, unspecified, got, sizeof got, NULL, NULL, NULL, e->st));
  ASSERT_HAS(pd_status_message(e->st), "layout is unspecified");
  ASSERT_HAS(pd_status_message(e->st), "MIRRORED (1");
  ASSERT_HAS(pd_status_message(e->st), "PER_COMPONENT (3");
  OK(e, pd_download(s, 1, pd_layout_mirrored(), got, sizeof got, NULL, NULL,
                    NULL, e->st));
  assert_floats(got, x, 8);
  /* Sharded over 4 devices: two elements each. MIRRORED is refused. */
  upload_f32(e, s, 2, dims, 1, x, pd_layout_sharded(0));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download(s, 2, pd_layout_mirrored(), got, sizeof got, NULL,
                          NULL, NULL, e->st));
  ASSERT_HAS(pd_status_message(e->st), "not mirrored");
  ASSERT_HAS(pd_status_message(e->st), "SHARDED");
  /* Uneven shards (components differ in shape): refused too. */
  int64_t d5[1] = {5};
  upload_f32(e, s, 3, d5, 1, x, pd_layout_sharded(0));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download(s, 3, pd_layout_mirrored(), got, sizeof got, NULL,
                          NULL, NULL, e->st));
  /* The session still works: SHARDED and COMPONENT read the right values. */
  OK(e, pd_download(s, 2, pd_layout_sharded(0), got, sizeof got, NULL, NULL,
                    NULL, e->st));
  assert_floats(got, x, 8);
  OK(e, pd_download(s, 2, pd_layout_component(1), got, sizeof got, NULL, NULL,
                    NULL, e->st));
  assert_floats(got, x + 2, 2);
  /* An AllReduce's output is mirrored: MIRRORED reads it. */
  uint64_t out = 0;
  uint64_t in = 2;
  OK(e, pd_execute(s, "AllReduce", &in, 1, NULL, &out, 1, NULL, NULL, e->st));
  OK(e, pd_download(s, out, pd_layout_mirrored(), got, sizeof got, NULL, NULL,
                    NULL, e->st));
  float want[2] = {1 + 3 + 5 + 7, 2 + 4 + 6 + 8};
  assert_floats(got, want, 2);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

#define RPC_TESTS                                                              \
  cmocka_unit_test(test_server_info), cmocka_unit_test(test_health_and_echo),  \
      cmocka_unit_test(test_add_matmul), cmocka_unit_test(test_attrs_kinds),   \
      cmocka_unit_test(test_sharded_allreduce),                                \
      cmocka_unit_test(test_per_component),                                    \
      cmocka_unit_test(test_chunked_transfer),                                 \
      cmocka_unit_test(test_enqueue_10000),                                    \
      cmocka_unit_test(test_stream_bad_session),                               \
      cmocka_unit_test(test_describe_before_sync),                             \
      cmocka_unit_test(test_delete), cmocka_unit_test(test_sync_error),        \
      cmocka_unit_test(test_batch),                                            \
      cmocka_unit_test(test_deadline_and_cancel),                              \
      cmocka_unit_test(test_options_checked), cmocka_unit_test(test_sessions), \
      cmocka_unit_test(test_cli), cmocka_unit_test(test_list_ops),             \
      cmocka_unit_test(test_layouts_never_guess)

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s PARADEVD PARADEV_CLI\n", argv[0]);
    return 2;
  }
  paradevd_path = argv[1];
  cli_path = argv[2];
  signal(SIGPIPE, SIG_IGN);
  daemon_start(&D);
  const struct CMUnitTest unix_tests[] = {RPC_TESTS};
  const struct CMUnitTest tcp_tests[] = {RPC_TESTS};
  const struct CMUnitTest other_tests[] = {
      cmocka_unit_test(test_two_clients),
      cmocka_unit_test(test_lease_keep_alive),
      cmocka_unit_test(test_unreachable),
  };
  int failed = 0;
  failed += cmocka_run_group_tests_name("libparadev over unix", unix_tests,
                                        setup_unix, group_teardown);
  failed += cmocka_run_group_tests_name("libparadev over tcp", tcp_tests,
                                        setup_tcp, group_teardown);
  failed += cmocka_run_group_tests_name("libparadev sessions and clients",
                                        other_tests, setup_tcp, group_teardown);
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
