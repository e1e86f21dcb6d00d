/* Integration test of libparadev's placement calls (issue #17) against the
 * real daemon on 4 simulated devices.
 *
 * A session narrowed with pd_session_options.devices and what
 * pd_session_devices says of it; uploads with pd_upload_on on [2] and on
 * [1, 3] (mirrored, sharded, per component) read back by component and
 * sharded, with each info's devices; pd_execute_on Fill and DeviceId on
 * [3, 1] (DeviceId: 0 and 1, the index within the set), through a batch
 * and a stream too; inputs on different sets refused with the daemon's
 * message; ParallelPack, ParallelUnpack and CopyToDevices through pd_execute
 * with values; Describe's devices; placement outside a narrowed session
 * refused; a gradient's results and a stream's replies on the inputs' set;
 * a checkpoint load (per spec and default_devices) and
 * shared-memory uploads on sets; and the library's own checks of a
 * device list.
 *
 * The CLI: `paradev load --devices` (indices and names as `paradev info`
 * shows them), `--session-devices`, and info's GPU column.
 *
 * Values are computed here by hand.
 * And examples/placement.c, run against the daemon.
 * Usage: test_placement PARADEVD PARADEV_CLI PLACEMENT_EXAMPLE [FILTER]
 * (FILTER: a cmocka test name pattern, to run some of them).
 */
#include <setjmp.h>
#include <signal.h>
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

#define NDEV 4

static const char *paradevd_path;
static const char *cli_path;
static const char *example_path;
static char root[64]; /* the daemon's storage root */
static pdt_daemon D;

typedef struct env {
  pd_client *c;
  pd_session *s; /* on the whole mesh */
  pd_status *st;
} env;

static int setup(void **state) {
  env *e = calloc(1, sizeof(*e));
  e->st = pd_status_new();
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.default_timeout_ms = 30000;
  e->c = pd_client_new(D.unix_target, &co, e->st);
  if (!e->c) return -1;
  e->s = pd_session_new(e->c, NULL, NULL, e->st);
  if (!e->s) {
    fprintf(stderr, "pd_session_new: %s\n", pd_status_message(e->st));
    return -1;
  }
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env *e = *state;
  pd_session_delete(e->s);
  pd_client_delete(e->c);
  pd_status_delete(e->st);
  free(e);
  return 0;
}

/* Asserts that t's device set is want[0..n). */
static void assert_devices(const pd_tensor_info *t, const int32_t *want,
                           int n) {
  char got[128] = "", exp[128] = "";
  size_t a = 0, b = 0;
  for (int i = 0; i < t->num_devices && a < sizeof(got) - 8; i++)
    a += (size_t)snprintf(got + a, sizeof(got) - a, " %d", t->devices[i]);
  for (int i = 0; i < n && b < sizeof(exp) - 8; i++)
    b += (size_t)snprintf(exp + b, sizeof(exp) - b, " %d", want[i]);
  if (t->num_devices != n) fail_msg("devices [%s ] ; expected [%s ]", got, exp);
  for (int i = 0; i < n; i++)
    if (t->devices[i] != want[i])
      fail_msg("devices [%s ] ; expected [%s ]", got, exp);
}

static void upload_on(env *e, const int32_t *devs, int n, uint64_t id,
                      const int64_t *dims, int rank, const float *v,
                      size_t bytes, pd_layout l, pd_tensor_info *ti) {
  OK(e, pd_upload_on(e->s, devs, n, id, PD_FLOAT32, dims, rank, v, bytes, l, ti,
                     NULL, e->st));
}

static void download_f32(env *e, uint64_t id, pd_layout l, float *out,
                         size_t n) {
  size_t got = 0;
  OK(e,
     pd_download(e->s, id, l, out, n * sizeof(float), NULL, &got, NULL, e->st));
  assert_int_equal(got, n * sizeof(float));
}

static void assert_f32(const float *got, const float *want, size_t n) {
  pdt_assert_bytes(got, want, n * sizeof(float), "float32 values");
}

/* --- the library's own checks (need no placement in the daemon) --------- */

static void test_library_checks(void **state) {
  env *e = *state;
  int32_t devs[PD_MAX_DEVICES + 1] = {0};
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.num_devices = 2; /* devices NULL */
  assert_null(pd_session_new(e->c, &so, NULL, e->st));
  assert_int_equal(pd_status_code(e->st), PD_INVALID_ARGUMENT);
  ASSERT_MSG_HAS(e, "pd_session_options.devices");
  so.devices = devs;
  so.num_devices = PD_MAX_DEVICES + 1;
  assert_null(pd_session_new(e->c, &so, NULL, e->st));
  ASSERT_MSG_HAS(e, "n_devices is 65");

  uint64_t out = 0;
  pd_attrs *a = pd_attrs_new();
  int64_t shape[1] = {2};
  pd_attrs_set_shape(a, "shape", shape, 1);
  pd_attrs_set_float(a, "value", 1.0);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute_on(e->s, NULL, 1, "Fill", NULL, 0, a, &out, 1, NULL,
                            NULL, e->st));
  ASSERT_MSG_HAS(e, "Fill: devices is NULL");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute_on(e->s, devs, -1, "Fill", NULL, 0, a, &out, 1, NULL,
                            NULL, e->st));
  ASSERT_MSG_HAS(e, "n_devices is -1");
  pd_batch *b = pd_batch_new();
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_batch_add_on(b, e->s, devs, PD_MAX_DEVICES + 1, "Fill", NULL,
                              0, a, &out, 1, e->st));
  assert_int_equal(pd_batch_num_ops(b), 0);
  pd_batch_delete(b);
  float v[2] = {1, 2};
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload_on(e->s, NULL, 2, 0, PD_FLOAT32, shape, 1, v, sizeof(v),
                           pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "pd_upload: devices is NULL");
  /* PER_COMPONENT takes one value per device of the set named. */
  const int64_t *dims[1] = {shape};
  int ranks[1] = {1};
  const void *data[1] = {v};
  size_t bytes[1] = {sizeof(v)};
  int32_t two[2] = {1, 3};
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload_components_on(e->s, two, 2, 0, PD_FLOAT32, 1, dims,
                                      ranks, data, bytes, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "has 2 devices");
  pd_stream *t = pd_stream_new(e->s, NULL, e->st);
  assert_non_null(t);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_stream_execute_on(t, NULL, 3, "Fill", NULL, 0, a, &out, 1,
                                   NULL, e->st));
  assert_int_equal(pd_stream_num_items(t), 0);
  OK(e, pd_stream_close(t, 10000, e->st));
  pd_stream_delete(t);
  pd_load_spec spec = {.name = "w", .n_devices = 1};
  pd_load *l = NULL;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_load_tensors(e->s, "x.npy", &spec, 1, NULL, &l, NULL, e->st));
  ASSERT_MSG_HAS(e, "spec 0: devices is NULL");
  assert_null(l);
  pd_attrs_delete(a);
}

/* The whole mesh: the default set, named or not. */
static void test_whole_mesh(void **state) {
  env *e = *state;
  int32_t got[PD_MAX_DEVICES];
  assert_int_equal(pd_session_devices(e->s, got, PD_MAX_DEVICES), NDEV);
  assert_int_equal(pd_session_num_devices(e->s), NDEV);
  for (int i = 0; i < NDEV; i++) assert_int_equal(got[i], i);
  assert_int_equal(pd_session_devices(e->s, NULL, 0), NDEV);
  float v[4] = {1, 2, 3, 4}, back[4];
  int64_t dims[1] = {4};
  pd_tensor_info ti;
  upload_on(e, NULL, 0, 100, dims, 1, v, sizeof(v), pd_layout_sharded(0), &ti);
  download_f32(e, 100, pd_layout_sharded(0), back, 4);
  assert_f32(back, v, 4);
  const int32_t all[NDEV] = {0, 1, 2, 3};
  assert_devices(&ti, all, NDEV);
  OK(e, pd_delete(e->s, (uint64_t[]){100}, 1, NULL, e->st));
}

/* --- placement on subsets (the engine's placement) ---------------------- */

/* A session narrowed to [1, 3]: its set, its default placement, and a
 * device outside it refused. */
static void test_narrowed_session(void **state) {
  env *e = *state;
  const int32_t want[2] = {1, 3};
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.devices = want;
  so.num_devices = 2;
  pd_session *s = pd_session_new(e->c, &so, NULL, e->st);
  if (!s) fail_msg("pd_session_new on [1, 3]: %s", pd_status_message(e->st));
  int32_t got[4] = {-1, -1, -1, -1};
  assert_int_equal(pd_session_devices(s, got, 1), 2); /* cap 1: one written */
  assert_int_equal(got[0], 1);
  assert_int_equal(got[1], -1);
  assert_int_equal(pd_session_devices(s, got, 4), 2);
  assert_int_equal(got[1], 3);
  assert_int_equal(pd_session_num_devices(s), 2);
  /* Sharded over the default set: 2 components of 2 rows. */
  float v[4] = {10, 20, 30, 40}, back[2];
  int64_t dims[1] = {4};
  pd_tensor_info ti;
  OK(e, pd_upload(s, 1, PD_FLOAT32, dims, 1, v, sizeof(v), pd_layout_sharded(0),
                  &ti, NULL, e->st));
  assert_devices(&ti, want, 2);
  assert_int_equal(ti.dims[0], 2); /* each component's: 4 rows over 2 */
  OK(e, pd_download(s, 1, pd_layout_component(1), back, sizeof(back), NULL,
                    NULL, NULL, e->st));
  assert_f32(back, (float[]){30, 40}, 2);
  /* Outside the allowed set. */
  const int32_t zero[1] = {0};
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_upload_on(s, zero, 1, 2, PD_FLOAT32, dims, 1, v, sizeof(v),
                           pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "0");
  pd_attrs *a = pd_attrs_new();
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_execute_on(s, zero, 1, "DeviceId", NULL, 0, a, (uint64_t[]){3},
                            1, NULL, NULL, e->st));
  pd_attrs_delete(a);
  pd_session_delete(s);
}

/* pd_upload_on [2] and [1, 3], read back by component and sharded. */
static void test_upload_on(void **state) {
  env *e = *state;
  const int32_t d2[1] = {2}, d13[2] = {1, 3};
  float m[6] = {1, 2, 3, 4, 5, 6}, back[6];
  int64_t dm[2] = {2, 3};
  pd_tensor_info ti;
  upload_on(e, d2, 1, 10, dm, 2, m, sizeof(m), pd_layout_mirrored(), &ti);
  assert_devices(&ti, d2, 1);
  pdt_assert_shape(&ti, 2, dm);
  download_f32(e, 10, pd_layout_mirrored(), back, 6);
  assert_f32(back, m, 6);
  download_f32(e, 10, pd_layout_component(0), back, 6);
  assert_f32(back, m, 6);
  /* A set of one device has one component. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download(e->s, 10, pd_layout_component(1), back, sizeof(back),
                          NULL, NULL, NULL, e->st));

  /* Sharded over [1, 3]: rows 0-1 on device 1, rows 2-3 on device 3. */
  float sh[8] = {1, 2, 3, 4, 5, 6, 7, 8}, all[8];
  int64_t ds[2] = {4, 2};
  upload_on(e, d13, 2, 11, ds, 2, sh, sizeof(sh), pd_layout_sharded(0), &ti);
  assert_devices(&ti, d13, 2);
  download_f32(e, 11, pd_layout_component(0), back, 4);
  assert_f32(back, sh, 4);
  download_f32(e, 11, pd_layout_component(1), back, 4);
  assert_f32(back, sh + 4, 4);
  download_f32(e, 11, pd_layout_sharded(0), all, 8);
  assert_f32(all, sh, 8);
  float c0[4], c1[4];
  void *const bufs[2] = {c0, c1};
  const size_t caps[2] = {sizeof(c0), sizeof(c1)};
  pd_tensor_info infos[2];
  OK(e, pd_download_components(e->s, 11, 2, bufs, caps, infos, NULL, e->st));
  assert_f32(c0, sh, 4);
  assert_f32(c1, sh + 4, 4);
  /* The tensor has 2 components, not the session's 4. */
  void *const four[4] = {c0, c1, all, all + 4};
  const size_t caps4[4] = {16, 16, 16, 16};
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_download_components(e->s, 11, 4, four, caps4, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "has 2 components");

  /* One value per device of [1, 3], of different shapes. */
  float p0[2] = {7, 8}, p1[3] = {9, 10, 11};
  const int64_t s0[1] = {2}, s1[1] = {3};
  const int64_t *dims[2] = {s0, s1};
  const int ranks[2] = {1, 1};
  const void *data[2] = {p0, p1};
  const size_t bytes[2] = {sizeof(p0), sizeof(p1)};
  OK(e, pd_upload_components_on(e->s, d13, 2, 12, PD_FLOAT32, 2, dims, ranks,
                                data, bytes, &ti, NULL, e->st));
  assert_devices(&ti, d13, 2);
  download_f32(e, 12, pd_layout_component(1), back, 3);
  assert_f32(back, p1, 3);
  download_f32(e, 12, pd_layout_sharded(0), back, 5);
  assert_f32(back, (float[]){7, 8, 9, 10, 11}, 5);

  /* Describe: the set, and each component's own device. */
  pd_description *d = pd_describe(e->s, (uint64_t[]){10, 11}, 2, NULL, e->st);
  assert_non_null(d);
  int32_t got[4];
  assert_int_equal(pd_description_devices(d, 0, got, 4), 1);
  assert_int_equal(got[0], 2);
  assert_int_equal(pd_description_devices(d, 1, got, 4), 2);
  assert_int_equal(got[0], 1);
  assert_int_equal(got[1], 3);
  assert_int_equal(pd_description_devices(d, 2, got, 4), 0);
  OK(e, pd_description_info(d, 1, &ti) ? PD_OK : PD_INTERNAL);
  assert_devices(&ti, d13, 2);
  assert_int_equal(pd_description_num_components(d, 1), 2);
  OK(e, pd_description_component(d, 1, 1, &ti) ? PD_OK : PD_INTERNAL);
  assert_devices(&ti, (int32_t[]){3}, 1);
  pd_description_delete(d);
  OK(e, pd_delete(e->s, (uint64_t[]){10, 11, 12}, 3, NULL, e->st));
}

/* Keeps the first output of a stream's replies (on the stream's thread). */
static void on_reply_keep(void *arg, const pd_stream_reply *r) {
  if (r->num_outputs > 0) *(pd_tensor_info *)arg = r->outputs[0];
}

/* Fill and DeviceId on [3, 1], directly, in a batch and in a stream. */
static void test_execute_on(void **state) {
  env *e = *state;
  const int32_t d31[2] = {3, 1};
  pd_attrs *fa = pd_attrs_new();
  int64_t shape[1] = {3};
  pd_attrs_set_shape(fa, "shape", shape, 1);
  pd_attrs_set_float(fa, "value", 2.5);
  pd_attrs *none = pd_attrs_new();
  uint64_t fill = 20, ids = 21;
  pd_tensor_info ti[2];
  OK(e, pd_execute_on(e->s, d31, 2, "Fill", NULL, 0, fa, &fill, 1, &ti[0], NULL,
                      e->st));
  assert_devices(&ti[0], d31, 2);
  OK(e, pd_execute_on(e->s, d31, 2, "DeviceId", NULL, 0, none, &ids, 1, &ti[1],
                      NULL, e->st));
  assert_devices(&ti[1], d31, 2);
  float f[3];
  download_f32(e, fill, pd_layout_component(1), f, 3);
  assert_f32(f, (float[]){2.5f, 2.5f, 2.5f}, 3);
  int32_t id0 = -1, id1 = -1;
  OK(e, pd_download(e->s, ids, pd_layout_component(0), &id0, 4, NULL, NULL,
                    NULL, e->st));
  OK(e, pd_download(e->s, ids, pd_layout_component(1), &id1, 4, NULL, NULL,
                    NULL, e->st));
  assert_int_equal(id0, 0); /* the index within the set, not device 3 */
  assert_int_equal(id1, 1);
  /* An op with inputs runs on their set. */
  uint64_t sum = 22;
  OK(e, pd_execute(e->s, "Add", (uint64_t[]){fill, fill}, 2, none, &sum, 1,
                   &ti[0], NULL, e->st));
  assert_devices(&ti[0], d31, 2);
  download_f32(e, sum, pd_layout_component(0), f, 3);
  assert_f32(f, (float[]){5, 5, 5}, 3);

  /* A batch: DeviceId on [2, 0]. */
  const int32_t d20[2] = {2, 0};
  pd_batch *b = pd_batch_new();
  uint64_t bid = 23;
  OK(e, pd_batch_add_on(b, e->s, d20, 2, "DeviceId", NULL, 0, none, &bid, 1,
                        e->st));
  OK(e, pd_execute_batch(e->s, b, ti, NULL, e->st));
  assert_devices(&ti[0], d20, 2);
  pd_batch_delete(b);
  OK(e, pd_download(e->s, bid, pd_layout_component(1), &id1, 4, NULL, NULL,
                    NULL, e->st));
  assert_int_equal(id1, 1);
  /* A stream: DeviceId on [1]. */
  pd_stream *t = pd_stream_new(e->s, NULL, e->st);
  assert_non_null(t);
  uint64_t sid = 24;
  OK(e, pd_stream_execute_on(t, (int32_t[]){1}, 1, "DeviceId", NULL, 0, none,
                             &sid, 1, NULL, e->st));
  OK(e, pd_stream_close(t, 20000, e->st));
  pd_stream_delete(t);
  pd_description *d = pd_describe(e->s, &sid, 1, NULL, e->st);
  assert_non_null(d);
  int32_t got[2];
  assert_int_equal(pd_description_devices(d, 0, got, 2), 1);
  assert_int_equal(got[0], 1);
  pd_description_delete(d);
  OK(e,
     pd_delete(e->s, (uint64_t[]){fill, ids, sum, bid, sid}, 5, NULL, e->st));
  pd_attrs_delete(fa);
  pd_attrs_delete(none);
}

/* Inputs on different sets: refused, both sets named, the way out said. */
static void test_mixed_sets_refused(void **state) {
  env *e = *state;
  float v[2] = {1, 2};
  int64_t dims[1] = {2};
  upload_on(e, (int32_t[]){2}, 1, 30, dims, 1, v, sizeof(v),
            pd_layout_mirrored(), NULL);
  upload_on(e, (int32_t[]){1, 3}, 2, 31, dims, 1, v, sizeof(v),
            pd_layout_mirrored(), NULL);
  pd_attrs *none = pd_attrs_new();
  uint64_t out = 32;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute(e->s, "Add", (uint64_t[]){30, 31}, 2, none, &out, 1,
                         NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "[2]");
  ASSERT_MSG_HAS(e, "[1, 3]");
  ASSERT_MSG_HAS(e, "CopyToDevices");
  /* A placement that differs from the inputs' set. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute_on(e->s, (int32_t[]){0}, 1, "Neg", (uint64_t[]){30}, 1,
                            none, &out, 1, NULL, NULL, e->st));
  /* Nothing was made. */
  EXPECT_CODE(e, PD_NOT_FOUND, pd_sync(e->s, &out, 1, NULL, NULL, e->st));
  OK(e, pd_delete(e->s, (uint64_t[]){30, 31}, 2, NULL, e->st));
  pd_attrs_delete(none);
}

/* ParallelPack, ParallelUnpack and CopyToDevices through pd_execute. */
static void test_pack_unpack_copy(void **state) {
  env *e = *state;
  float a[3] = {1, 2, 3}, b[3] = {4, 5, 6}, got[3];
  int64_t dims[1] = {3};
  upload_on(e, (int32_t[]){1}, 1, 40, dims, 1, a, sizeof(a),
            pd_layout_mirrored(), NULL);
  upload_on(e, (int32_t[]){3}, 1, 41, dims, 1, b, sizeof(b),
            pd_layout_mirrored(), NULL);
  pd_attrs *none = pd_attrs_new();
  uint64_t packed = 42;
  pd_tensor_info ti[2];
  OK(e, pd_execute(e->s, "ParallelPack", (uint64_t[]){40, 41}, 2, none, &packed,
                   1, ti, NULL, e->st));
  const int32_t d13[2] = {1, 3};
  assert_devices(&ti[0], d13, 2);
  download_f32(e, packed, pd_layout_component(0), got, 3);
  assert_f32(got, a, 3);
  download_f32(e, packed, pd_layout_component(1), got, 3);
  assert_f32(got, b, 3);
  /* A packed tensor is not mirrored. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download(e->s, packed, pd_layout_mirrored(), got, sizeof(got),
                          NULL, NULL, NULL, e->st));

  uint64_t parts[2] = {43, 44};
  OK(e, pd_execute(e->s, "ParallelUnpack", &packed, 1, none, parts, 2, ti, NULL,
                   e->st));
  assert_devices(&ti[0], (int32_t[]){1}, 1);
  assert_devices(&ti[1], (int32_t[]){3}, 1);
  download_f32(e, parts[1], pd_layout_mirrored(), got, 3);
  assert_f32(got, b, 3);

  /* Same size: component i to device i of the new set. */
  pd_attrs *ca = pd_attrs_new();
  pd_attrs_set_int_list(ca, "devices", (int64_t[]){0, 2}, 2);
  uint64_t moved = 45;
  OK(e, pd_execute(e->s, "CopyToDevices", &packed, 1, ca, &moved, 1, ti, NULL,
                   e->st));
  assert_devices(&ti[0], (int32_t[]){0, 2}, 2);
  download_f32(e, moved, pd_layout_component(1), got, 3);
  assert_f32(got, b, 3);
  /* One device to three: replicated, so mirrored. */
  pd_attrs *cb = pd_attrs_new();
  pd_attrs_set_int_list(cb, "devices", (int64_t[]){0, 1, 2}, 3);
  uint64_t rep = 46;
  OK(e, pd_execute(e->s, "CopyToDevices", (uint64_t[]){40}, 1, cb, &rep, 1, ti,
                   NULL, e->st));
  assert_devices(&ti[0], (int32_t[]){0, 1, 2}, 3);
  download_f32(e, rep, pd_layout_component(2), got, 3);
  assert_f32(got, a, 3);
  download_f32(e, rep, pd_layout_mirrored(), got, 3);
  assert_f32(got, a, 3);
  /* Two components onto three devices: neither rule fits. */
  uint64_t bad = 47;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_execute(e->s, "CopyToDevices", &packed, 1, cb, &bad, 1, NULL,
                         NULL, e->st));
  OK(e,
     pd_delete(e->s, (uint64_t[]){40, 41, 42, 43, 44, 45, 46}, 7, NULL, e->st));
  pd_attrs_delete(none);
  pd_attrs_delete(ca);
  pd_attrs_delete(cb);
}

/* --- the CLI ------------------------------------------------------------ */

/* Writes a float32 .npy of shape [n] (format 1.0) under the root. */
static void write_npy(const char *name, const float *v, int n) {
  char path[128], dict[128];
  snprintf(path, sizeof(path), "%s/%s", root, name);
  int dl =
      snprintf(dict, sizeof(dict),
               "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }", n);
  int total = 10 + dl + 1, pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint16_t hl = (uint16_t)(dl + pad + 1);
  fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  fputc(hl & 0xff, f);
  fputc(hl >> 8, f);
  fwrite(dict, 1, (size_t)dl, f);
  for (int i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  fwrite(v, sizeof(float), (size_t)n, f);
  fclose(f);
}

typedef struct cli_out {
  int rc;
  char out[8192], err[4096];
} cli_out;

static void read_all(const char *path, char *buf, size_t len) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = '\0';
  fclose(f);
  unlink(path);
}

static void run_cli(cli_out *o, const char *args) {
  char cmd[1024], outp[128], errp[128];
  snprintf(outp, sizeof(outp), "%s/cli.out", D.dir);
  snprintf(errp, sizeof(errp), "%s/cli.err", D.dir);
  snprintf(cmd, sizeof(cmd), "%s --target %s --timeout 20s %s >%s 2>%s",
           cli_path, D.unix_target, args, outp, errp);
  int status = system(cmd);
  o->rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  read_all(outp, o->out, sizeof(o->out));
  read_all(errp, o->err, sizeof(o->err));
}

#define ASSERT_HAS(o, hay, needle)                                             \
  do {                                                                         \
    if (!strstr((hay), (needle)))                                              \
      fail_msg("output does not contain \"%s\" (rc %d):\n%s\n%s", (needle),    \
               (o)->rc, (o)->out, (o)->err);                                   \
  } while (0)

/* What the CLI decides itself: names it cannot map, a malformed list, the
 * GPU column. */
static void test_cli_checks(void **state) {
  (void)state;
  cli_out *o = calloc(1, sizeof(*o));
  write_npy("w.npy", (float[]){1, 2, 3, 4}, 4);
  run_cli(o, "load w.npy --devices cpu:9 --quiet");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o, o->err,
             "--devices: no device 'cpu:9'; the daemon has 0 or "
             "cpu:0, 1 or cpu:1");
  run_cli(o, "load w.npy --devices 1,,3 --quiet");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o, o->err, "expected device indices or names");
  run_cli(o, "save --from w.npy w2.npy --session-devices=-1 --quiet");
  assert_int_equal(o->rc, 2);
  ASSERT_HAS(o, o->err, "--session-devices: device -1 is negative");
  run_cli(o, "info");
  assert_int_equal(o->rc, 0);
  ASSERT_HAS(o, o->out, "KIND  GPU");
  run_cli(o, "load --help");
  ASSERT_HAS(o, o->out, "--session-devices D");
  free(o);
}

/* Placement through the CLI: the tensors' devices shown. */
static void test_cli_placement(void **state) {
  (void)state;
  cli_out *o = calloc(1, sizeof(*o));
  write_npy("w.npy", (float[]){1, 2, 3, 4}, 4);
  run_cli(o, "load w.npy --devices 1,3 --layout sharded:0 --quiet");
  assert_int_equal(o->rc, 0);
  ASSERT_HAS(o, o->out, "float32   [4]  on [1, 3]");
  run_cli(o, "load w.npy --devices CPU:2,cpu:0 --quiet");
  assert_int_equal(o->rc, 0);
  ASSERT_HAS(o, o->out, "on [2, 0]");
  run_cli(o, "load w.npy --session-devices cpu:3 --quiet");
  assert_int_equal(o->rc, 0);
  ASSERT_HAS(o, o->out, "on [3]");
  run_cli(o, "load w.npy --session-devices 1 --devices 0 --quiet");
  assert_int_equal(o->rc, 1);
  ASSERT_HAS(o, o->err, "PERMISSION_DENIED");
  run_cli(o, "info");
  /* The CPU backend's device k stands for GPU k. */
  ASSERT_HAS(o, o->out, "  3   cpu:3                        cpu   3   ");
  run_cli(o, "save --from w.npy w3.npy --devices 2 --quiet");
  assert_int_equal(o->rc, 0);
  free(o);
}

/* A gradient of ops on [1, 3]: its results live on the inputs' set, and a
 * stream's replies carry the outputs' devices. */
static void test_gradient_on(void **state) {
  env *e = *state;
  const int32_t d13[2] = {1, 3};
  float x[3] = {1, 2, 3}, g[3];
  int64_t dims[1] = {3};
  upload_on(e, d13, 2, 60, dims, 1, x, sizeof(x), pd_layout_mirrored(), NULL);
  OK(e, pd_tape_start(e->s, 7, false, NULL, e->st));
  OK(e, pd_tape_watch(e->s, 7, (uint64_t[]){60}, 1, NULL, e->st));
  pd_attrs *none = pd_attrs_new();
  uint64_t y = 61, grad = 62;
  OK(e, pd_execute(e->s, "Mul", (uint64_t[]){60, 60}, 2, none, &y, 1, NULL,
                   NULL, e->st));
  pd_tensor_info ti;
  OK(e, pd_tape_gradient(e->s, 7, y, (uint64_t[]){60}, 1, 0, &grad, &ti, NULL,
                         e->st));
  assert_devices(&ti, d13, 2);
  download_f32(e, grad, pd_layout_component(1), g, 3);
  assert_f32(g, (float[]){2, 4, 6}, 3); /* d(x*x)/dx = 2x */
  /* A stream's replies: the outputs' devices. */
  pd_tensor_info seen = {0};
  pd_stream_options so = PD_STREAM_OPTIONS_INITIALIZER;
  so.on_reply = on_reply_keep;
  so.on_reply_arg = &seen;
  pd_stream *t = pd_stream_new(e->s, &so, e->st);
  assert_non_null(t);
  uint64_t neg = 63;
  OK(e, pd_stream_execute(t, "Neg", (uint64_t[]){60}, 1, none, &neg, 1, NULL,
                          e->st));
  OK(e, pd_stream_close(t, 20000, e->st));
  pd_stream_delete(t);
  assert_devices(&seen, d13, 2);
  pd_attrs_delete(none);
  OK(e, pd_delete(e->s, (uint64_t[]){60, 61, 62, 63}, 4, NULL, e->st));
}

/* A checkpoint load and a shared-memory upload on chosen sets. */
static void test_load_and_shm_on(void **state) {
  env *e = *state;
  float w[4] = {1, 2, 3, 4}, back[4];
  write_npy("l.npy", w, 4);
  pd_load_spec spec = {.name = "",
                       .id = 50,
                       .layout = pd_layout_mirrored(),
                       .devices = (int32_t[]){2},
                       .n_devices = 1};
  pd_load *l = NULL;
  OK(e, pd_load_tensors(e->s, "l.npy", &spec, 1, NULL, &l, NULL, e->st));
  pd_tensor_info ti;
  assert_true(pd_load_tensor_info(l, 0, &ti));
  assert_devices(&ti, (int32_t[]){2}, 1);
  pd_load_delete(l);
  download_f32(e, 50, pd_layout_component(0), back, 4);
  assert_f32(back, w, 4);
  /* Every tensor of the file, sharded over default_devices [1, 3]. */
  pd_load_options lo = PD_LOAD_OPTIONS_INITIALIZER;
  lo.default_layout = pd_layout_sharded(0);
  lo.first_id = 51;
  lo.default_devices = (int32_t[]){1, 3};
  lo.n_default_devices = 2;
  OK(e, pd_load_tensors(e->s, "l.npy", NULL, 0, &lo, &l, NULL, e->st));
  assert_true(pd_load_tensor_info(l, 0, &ti));
  assert_devices(&ti, (int32_t[]){1, 3}, 2);
  pd_load_delete(l);
  download_f32(e, 51, pd_layout_component(1), back, 2);
  assert_f32(back, w + 2, 2);

  pd_shared_memory *r = NULL;
  OK(e, pd_shared_memory_create(e->s, 4096, 0600, &r, NULL, e->st));
  memcpy(pd_shared_memory_data(r), w, sizeof(w));
  int64_t dims[1] = {4};
  OK(e, pd_upload_from_shared_memory_on(
            e->s, (int32_t[]){3, 0}, 2, 52, PD_FLOAT32, dims, 1, r, 0,
            pd_layout_sharded(0), &ti, NULL, e->st));
  assert_devices(&ti, (int32_t[]){3, 0}, 2);
  download_f32(e, 52, pd_layout_component(0), back, 2);
  assert_f32(back, w, 2);
  const int64_t one[1] = {4};
  const int64_t *cd[1] = {one};
  OK(e, pd_upload_components_from_shared_memory_on(
            e->s, (int32_t[]){1}, 1, 53, PD_FLOAT32, 1, cd, (int[]){1}, r, 0,
            &ti, NULL, e->st));
  assert_devices(&ti, (int32_t[]){1}, 1);
  download_f32(e, 53, pd_layout_component(0), back, 4);
  assert_f32(back, w, 4);
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  OK(e, pd_delete(e->s, (uint64_t[]){50, 51, 52, 53}, 4, NULL, e->st));
}

/* examples/placement.c against the daemon: every step, with its values. */
static void test_example(void **state) {
  (void)state;
  char cmd[512], outp[128];
  snprintf(outp, sizeof(outp), "%s/example.out", D.dir);
  snprintf(cmd, sizeof(cmd), "%s %s >%s 2>&1", example_path, D.unix_target,
           outp);
  int status = system(cmd);
  cli_out *o = calloc(1, sizeof(*o));
  read_all(outp, o->out, sizeof(o->out));
  o->rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (o->rc != 0) fail_msg("placement example: rc %d\n%s", o->rc, o->out);
  ASSERT_HAS(o, o->out, "session on [0, 1]\nsession on [2, 3]\n");
  ASSERT_HAS(o, o->out, "x = 1..8, sharded            on [0, 1]");
  ASSERT_HAS(o, o->out, "component 0 (device 1): DeviceId 0");
  ASSERT_HAS(o, o->out, "component 1 (device 0): DeviceId 1");
  ASSERT_HAS(o, o->out, "ParallelPack(p, q)           on [2, 3]");
  ASSERT_HAS(o, o->out, "ParallelUnpack -> 1          on [3]");
  ASSERT_HAS(o, o->out, "CopyToDevices(p)             on [3, 2]");
  ASSERT_HAS(o, o->out, "every device holds [10, 20]");
  free(o);
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr,
            "usage: %s PARADEVD PARADEV_CLI PLACEMENT_EXAMPLE [FILTER]\n",
            argv[0]);
    return 2;
  }
  paradevd_path = argv[1];
  cli_path = argv[2];
  example_path = argv[3];
  signal(SIGPIPE, SIG_IGN);
  snprintf(root, sizeof(root), "/tmp/pdplace-root-XXXXXX");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  const char *extra[] = {
      "--devices", "4", "--default-memory-quota", "unlimited", "--storage-root",
      root,        NULL};
  pdt_daemon_start(&D, paradevd_path, "pdplace", false, extra);
  if (argc == 5) cmocka_set_test_filter(argv[4]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_library_checks),
      cmocka_unit_test(test_whole_mesh),
      cmocka_unit_test(test_narrowed_session),
      cmocka_unit_test(test_upload_on),
      cmocka_unit_test(test_execute_on),
      cmocka_unit_test(test_mixed_sets_refused),
      cmocka_unit_test(test_pack_unpack_copy),
      cmocka_unit_test(test_gradient_on),
      cmocka_unit_test(test_load_and_shm_on),
      cmocka_unit_test(test_cli_checks),
      cmocka_unit_test(test_cli_placement),
      cmocka_unit_test(test_example),
  };
  int failed = cmocka_run_group_tests_name("placement", tests, setup, teardown);
  int rc = pdt_daemon_stop(&D);
  if (rc != 0) {
    fprintf(stderr, "paradevd exited with %d after SIGTERM; log:\n%s\n", rc,
            D.log ? D.log : "");
    failed++;
  }
  free(D.log);
  char rm[128];
  snprintf(rm, sizeof(rm), "rm -rf %s", root);
  if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", root);
  return failed ? 1 : 0;
}
