/* Memory charges of shared buffers (issue #17, trial T1): an output that
 * shares an input's buffer (Identity / Reshape output 0, every output of
 * ParallelPack and ParallelUnpack) keeps the buffer's bytes charged to the
 * session -- its total, its tenant's and each device's -- until the last
 * handle holding it is deleted, and they are refunded once. Over a CPU
 * engine of 4 devices; every expected figure is worked out by hand from
 * the tensors' sizes (float32: 4 bytes an element). Also: CopyToDevices to
 * a device that does not exist is INVALID_ARGUMENT (trial T3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"
#include "sched_testutil.h"
#include "testutil.h"

#define NDEV 4

static dev_engine *g_engine;

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

static sched *new_sched(void) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = 0x17;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  return s;
}

static sched_session *open_with(sched *s, uint64_t quota, const char *tenant,
                                sched_session_info *info) {
  sched_session_params p = {.client_name = "c",
                            .job_id = "j",
                            .memory_quota = quota,
                            .tenant = tenant};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_create(s, &p, info, &st), PD_OK);
  sched_session *ss = NULL;
  assert_int_equal(
      sched_session_open(s, info->token, SCHED_TOKEN_BYTES, &ss, &st), PD_OK);
  return ss;
}

static void upload_ok(sched_session *ss, uint64_t id, const dev_devset *devices,
                      dev_layout_kind kind, int n) {
  dev_status st = DEV_STATUS_INIT;
  pd_code c = tu_sched_upload_on(ss, id, devices, kind, n, &st);
  if (c != PD_OK)
    print_error("upload %llu: %s\n", (unsigned long long)id, st.msg);
  assert_int_equal(c, PD_OK);
}

static sched_op op_of(const char *name, const uint64_t *in, int nin,
                      const uint64_t *out, int nout, const dev_attr *attrs,
                      int nattrs) {
  return (sched_op){.op_name = name,
                    .inputs = in,
                    .num_inputs = nin,
                    .attrs = attrs,
                    .num_attrs = nattrs,
                    .output_ids = out,
                    .num_outputs = nout};
}

static pd_code exec_ops(sched_session *ss, const sched_op *ops, int n,
                        dev_status *st) {
  sched_op_result res[8];
  int failed = -1;
  return sched_execute(ss, ops, n, 0, res, &failed, st);
}

static void exec_ok(sched_session *ss, const sched_op *ops, int n) {
  dev_status st = DEV_STATUS_INIT;
  pd_code c = exec_ops(ss, ops, n, &st);
  if (c != PD_OK) print_error("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
}

static void pack_ok(sched_session *ss, const uint64_t *in, int n,
                    uint64_t out) {
  sched_op o = op_of("ParallelPack", in, n, &out, 1, NULL, 0);
  exec_ok(ss, &o, 1);
}

static void unpack_ok(sched_session *ss, uint64_t in, const uint64_t *out,
                      int n) {
  sched_op o = op_of("ParallelUnpack", &in, 1, out, n, NULL, 0);
  exec_ok(ss, &o, 1);
}

static void del(sched_session *ss, uint64_t id) {
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_handle_delete(ss, &id, 1, &st), PD_OK);
}

static void sync_all(sched_session *ss) {
  dev_status st = DEV_STATUS_INIT, terr = DEV_STATUS_INIT;
  uint64_t failed = 0;
  assert_int_equal(sched_sync(ss, NULL, 0, &terr, &failed, &st), PD_OK);
  assert_int_equal(terr.code, PD_OK);
}

/* The listing's per-device bytes of `ss` are want[], its total their sum
 * (and sched_session_usage's). */
static void expect_bytes(sched *s, sched_session *ss, const uint64_t *want) {
  sched_session_view *v = NULL;
  int n = sched_list_sessions(s, NULL, &v);
  assert_true(n >= 0);
  bool found = false;
  uint64_t total = 0;
  for (int d = 0; d < NDEV; d++) total += want[d];
  for (int i = 0; i < n; i++) {
    if (v[i].seq != sched_session_seq(ss)) continue;
    found = true;
    for (int d = 0; d < NDEV; d++)
      if (v[i].device_bytes[d] != want[d])
        fail_msg("device %d: %llu bytes, expected %llu", d,
                 (unsigned long long)v[i].device_bytes[d],
                 (unsigned long long)want[d]);
    assert_int_equal(v[i].bytes, total);
  }
  free(v);
  assert_true(found);
  uint64_t bytes = 0;
  sched_session_usage(ss, NULL, &bytes);
  assert_int_equal(bytes, total);
}

/* --- quotas ----------------------------------------------------------------- */

/* The trial's loop: {16 bytes on [0], 16 on [1], ParallelPack, delete the
 * parts} under a 40-byte quota. The packed tensor holds both buffers (32
 * bytes), so the next iteration's first upload (32 + 16 > 40) is refused;
 * before, the parts' delete refunded their bytes and the loop never met the
 * quota. */
static void test_pack_loop_meets_quota(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  sched_session *ss = open_with(s, 40, NULL, &info);
  dev_devset d0 = SET(0), d1 = SET(1);
  upload_ok(ss, 1, &d0, DEV_LAYOUT_MIRRORED, 4);
  upload_ok(ss, 2, &d1, DEV_LAYOUT_MIRRORED, 4);
  pack_ok(ss, (uint64_t[]){1, 2}, 2, 3);
  del(ss, 1);
  del(ss, 2);
  expect_bytes(s, ss, (uint64_t[NDEV]){16, 16, 0, 0});
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(tu_sched_upload_on(ss, 4, &d0, DEV_LAYOUT_MIRRORED, 4, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_contains(st.msg,
                  "session memory quota exceeded: 32 bytes held + 16 "
                  "new > quota 40 bytes");
  /* The packed tensor's delete gives the room back. */
  del(ss, 3);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 0, 0, 0});
  upload_ok(ss, 4, &d0, DEV_LAYOUT_MIRRORED, 4);
  sync_all(ss);
  sched_session_put(ss);
  sched_destroy(s);
}

/* The same with Reshape: {upload 16 bytes mirrored on [2], Reshape,
 * delete the original} under a 40-byte quota holds 16, then 32 bytes;
 * the third upload is refused. */
static void test_reshape_loop_meets_quota(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  sched_session *ss = open_with(s, 40, NULL, &info);
  dev_devset d2 = SET(2);
  const int64_t shape[2] = {2, 2};
  dev_attr ra = dev_attr_int_list("shape", shape, 2);
  for (uint64_t it = 0; it < 2; it++) {
    uint64_t in = 10 * it + 1, out = 10 * it + 2;
    upload_ok(ss, in, &d2, DEV_LAYOUT_MIRRORED, 4);
    sched_op o = op_of("Reshape", &in, 1, &out, 1, &ra, 1);
    exec_ok(ss, &o, 1);
    del(ss, in);
    expect_bytes(s, ss, (uint64_t[NDEV]){0, 0, 16 * (it + 1), 0});
  }
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(tu_sched_upload_on(ss, 21, &d2, DEV_LAYOUT_MIRRORED, 4, &st),
                   PD_RESOURCE_EXHAUSTED);
  sync_all(ss);
  sched_session_put(ss);
  sched_destroy(s);
}

/* --- bytes per device in every order of deletes ---------------------------- */

/* Bit k of `alive`: handle ids[k] still live. */
typedef uint64_t (*held_fn)(unsigned alive, int d);

/* Deletes ids[order[0]], ids[order[1]], ... checking after each delete that
 * every device holds held(alive, d) bytes. */
static void delete_in_order(sched *s, sched_session *ss, const uint64_t *ids,
                            const int *order, int n, held_fn held) {
  unsigned alive = (1u << n) - 1;
  for (int i = 0; i < n; i++) {
    del(ss, ids[order[i]]);
    alive &= ~(1u << order[i]);
    uint64_t want[NDEV];
    for (int d = 0; d < NDEV; d++) want[d] = held(alive, d);
    expect_bytes(s, ss, want);
  }
}

/* Every permutation of 0..n-1 (n <= 4), Heap's algorithm unrolled by
 * recursion; calls fn for each. */
static void permute(int *a, int k, int n, void (*fn)(const int *, void *),
                    void *arg) {
  if (k == n) {
    fn(a, arg);
    return;
  }
  for (int i = k; i < n; i++) {
    int t = a[k];
    a[k] = a[i];
    a[i] = t;
    permute(a, k + 1, n, fn, arg);
    a[i] = a[k];
    a[k] = t;
  }
}

/* Pack: A = float32 [2] on [0] (8 bytes), B = float32 [4] on [1] (16
 * bytes), P = ParallelPack(A, B) on [0, 1]. Device 0 holds 8 bytes while A
 * or P lives, device 1 16 while B or P lives. */
static uint64_t held_pack(unsigned alive, int d) {
  bool a = alive & 1, b = alive & 2, p = alive & 4;
  if (d == 0) return (a || p) ? 8 : 0;
  if (d == 1) return (b || p) ? 16 : 0;
  return 0;
}

/* Unpack then pack: S = float32 [5] sharded over [2, 3] (3 + 2 elements:
 * 12 bytes on 2, 8 on 3), U0, U1 = ParallelUnpack(S) (on [2], [3]),
 * Q = ParallelPack(U1, U0) on [3, 2]. Device 2 holds 12 bytes while S, U0
 * or Q lives; device 3 8 while S, U1 or Q lives. */
static uint64_t held_unpack(unsigned alive, int d) {
  bool sh = alive & 1, u0 = alive & 2, u1 = alive & 4, q = alive & 8;
  if (d == 2) return (sh || u0 || q) ? 12 : 0;
  if (d == 3) return (sh || u1 || q) ? 8 : 0;
  return 0;
}

typedef struct order_ctx {
  sched *s;
  int which; /* 0: pack, 1: unpack + pack */
  int runs;
} order_ctx;

static void run_order(const int *order, void *arg) {
  order_ctx *x = arg;
  sched_session_info info;
  sched_session *ss = open_with(x->s, 0, NULL, &info);
  dev_devset d0 = SET(0), d1 = SET(1), d23 = SET(2, 3);
  if (x->which == 0) {
    upload_ok(ss, 1, &d0, DEV_LAYOUT_MIRRORED, 2);
    upload_ok(ss, 2, &d1, DEV_LAYOUT_MIRRORED, 4);
    pack_ok(ss, (uint64_t[]){1, 2}, 2, 3);
    sync_all(ss);
    expect_bytes(x->s, ss, (uint64_t[NDEV]){8, 16, 0, 0});
    delete_in_order(x->s, ss, (uint64_t[]){1, 2, 3}, order, 3, held_pack);
  } else {
    upload_ok(ss, 1, &d23, DEV_LAYOUT_SHARDED, 5);
    unpack_ok(ss, 1, (uint64_t[]){2, 3}, 2);
    pack_ok(ss, (uint64_t[]){3, 2}, 2, 4);
    sync_all(ss);
    expect_bytes(x->s, ss, (uint64_t[NDEV]){0, 0, 12, 8});
    delete_in_order(x->s, ss, (uint64_t[]){1, 2, 3, 4}, order, 4, held_unpack);
  }
  sched_session_put(ss);
  x->runs++;
}

static void test_device_bytes_every_order(void **state) {
  (void)state;
  sched *s = new_sched();
  order_ctx x = {s, 0, 0};
  int a3[3] = {0, 1, 2}, a4[4] = {0, 1, 2, 3};
  permute(a3, 0, 3, run_order, &x);
  assert_int_equal(x.runs, 6);
  x.which = 1;
  permute(a4, 0, 4, run_order, &x);
  assert_int_equal(x.runs, 6 + 24);
  sched_destroy(s);
}

/* Outputs of earlier ops of the same request: Neg(A) and Neg(B) packed in
 * one request; the Negs' handles deleted, the pack keeps their 8 + 16
 * bytes. A request that fails after a pack joined charges leaves every
 * count as it was. */
static void test_pack_within_request_and_failed_request(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  sched_session *ss = open_with(s, 0, NULL, &info);
  dev_devset d0 = SET(0), d1 = SET(1);
  upload_ok(ss, 1, &d0, DEV_LAYOUT_MIRRORED, 2);
  upload_ok(ss, 2, &d1, DEV_LAYOUT_MIRRORED, 4);
  const uint64_t a = 1, b = 2, na = 3, nb = 4, parts[2] = {3, 4}, p = 5;
  sched_op ops[3] = {op_of("Neg", &a, 1, &na, 1, NULL, 0),
                     op_of("Neg", &b, 1, &nb, 1, NULL, 0),
                     op_of("ParallelPack", parts, 2, &p, 1, NULL, 0)};
  exec_ok(ss, ops, 3);
  expect_bytes(s, ss, (uint64_t[NDEV]){16, 32, 0, 0});
  del(ss, 3);
  del(ss, 4);
  expect_bytes(s, ss, (uint64_t[NDEV]){16, 32, 0, 0});
  /* Pack A and B, then an op on a handle that does not exist: refused,
   * nothing changes; A and B alone hold their bytes after all. */
  const uint64_t ab[2] = {1, 2}, q = 6, ghost = 99, g = 7;
  sched_op bad[2] = {op_of("ParallelPack", ab, 2, &q, 1, NULL, 0),
                     op_of("Neg", &ghost, 1, &g, 1, NULL, 0)};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(exec_ops(ss, bad, 2, &st), PD_NOT_FOUND);
  expect_bytes(s, ss, (uint64_t[NDEV]){16, 32, 0, 0});
  del(ss, 1);
  expect_bytes(s, ss, (uint64_t[NDEV]){8, 32, 0, 0});
  del(ss, 5);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 16, 0, 0});
  del(ss, 2);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 0, 0, 0});
  sync_all(ss);
  sched_session_put(ss);
  sched_destroy(s);
}

/* Reshape aliases its input: deleting the original keeps the charge (32
 * bytes a device: float32 [8] mirrored on the mesh); Identity of the
 * Reshape joins the same buffer; the last delete refunds it. A Reshape of
 * a packed tensor joins the pack's records component by component. */
static void test_reshape_alias_keeps_charge(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  sched_session *ss = open_with(s, 0, NULL, &info);
  upload_ok(ss, 1, NULL, DEV_LAYOUT_MIRRORED, 8);
  const int64_t shape[2] = {2, 4};
  dev_attr ra = dev_attr_int_list("shape", shape, 2);
  const uint64_t x = 1, r = 2, i = 3;
  sched_op ops[2] = {op_of("Reshape", &x, 1, &r, 1, &ra, 1),
                     op_of("Identity", &r, 1, &i, 1, NULL, 0)};
  exec_ok(ss, ops, 2);
  expect_bytes(s, ss, (uint64_t[NDEV]){32, 32, 32, 32});
  del(ss, 1);
  expect_bytes(s, ss, (uint64_t[NDEV]){32, 32, 32, 32});
  del(ss, 3);
  expect_bytes(s, ss, (uint64_t[NDEV]){32, 32, 32, 32});
  del(ss, 2);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 0, 0, 0});
  /* Pack of [1] (4 bytes) and [3] (8 bytes: float32 [2]): ragged; a
   * Reshape of it would need one shape, so Identity stands for the
   * aliasing op: its components join the pack's records. */
  dev_devset d1 = SET(1), d3 = SET(3);
  upload_ok(ss, 4, &d1, DEV_LAYOUT_MIRRORED, 1);
  upload_ok(ss, 5, &d3, DEV_LAYOUT_MIRRORED, 2);
  pack_ok(ss, (uint64_t[]){4, 5}, 2, 6);
  const uint64_t pk = 6, id = 7;
  sched_op o = op_of("Identity", &pk, 1, &id, 1, NULL, 0);
  exec_ok(ss, &o, 1);
  del(ss, 4);
  del(ss, 6);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 4, 0, 8});
  del(ss, 5);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 4, 0, 8});
  del(ss, 7);
  expect_bytes(s, ss, (uint64_t[NDEV]){0, 0, 0, 0});
  sync_all(ss);
  sched_session_put(ss);
  sched_destroy(s);
}

/* Closing a session refunds everything once: its tenant holds what the
 * other session of the tenant holds, no more, no less (a shared record
 * refunded twice would take the other session's bytes off the tenant). */
static void test_close_refunds_once(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info ia, ib;
  sched_session *a = open_with(s, 0, "acme", &ia);
  sched_session *b = open_with(s, 0, "acme", &ib);
  upload_ok(b, 1, NULL, DEV_LAYOUT_MIRRORED, 4); /* 64 bytes */
  dev_devset d0 = SET(0), d1 = SET(1);
  upload_ok(a, 1, &d0, DEV_LAYOUT_MIRRORED, 2);
  upload_ok(a, 2, &d1, DEV_LAYOUT_MIRRORED, 4);
  pack_ok(a, (uint64_t[]){1, 2}, 2, 3);
  unpack_ok(a, 3, (uint64_t[]){4, 5}, 2);
  del(a, 1);
  sync_all(a);
  int sessions = 0;
  uint64_t bytes = 0;
  sched_tenant_usage(s, "acme", &sessions, &bytes);
  assert_int_equal(sessions, 2);
  assert_int_equal(bytes, 64 + 8 + 16);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      sched_session_close(s, ia.token, SCHED_TOKEN_BYTES, NULL, &st), PD_OK);
  sched_session_put(a);
  sched_tenant_usage(s, "acme", &sessions, &bytes);
  assert_int_equal(sessions, 1);
  assert_int_equal(bytes, 64);
  expect_bytes(s, b, (uint64_t[NDEV]){16, 16, 16, 16});
  sched_session_put(b);
  sched_destroy(s);
}

/* --- CopyToDevices to a device that does not exist (trial T3) -------------- */

static void test_copy_target_outside_mesh(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_session_info info;
  sched_session *ss = open_with(s, 0, NULL, &info);
  upload_ok(ss, 1, NULL, DEV_LAYOUT_MIRRORED, 4);
  const int64_t to[2] = {5, -1};
  const dev_attr attrs[1] = {dev_attr_int_list("devices", to, 2)};
  const uint64_t in = 1, out = 2;
  sched_op o = op_of("CopyToDevices", &in, 1, &out, 1, attrs, 1);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(exec_ops(ss, &o, 1, &st), PD_INVALID_ARGUMENT);
  assert_contains(st.msg,
                  "op 0 (CopyToDevices): CopyToDevices: attribute "
                  "'devices': device set entry 0 is device 5: the "
                  "mesh has devices 0..3");
  /* A device that exists but is not allowed stays PERMISSION_DENIED. */
  sched_session_put(ss);
  dev_devset half = SET(0, 1);
  sched_session_params p = {.client_name = "c", .devices = &half};
  assert_int_equal(sched_session_create(s, &p, &info, &st), PD_OK);
  assert_int_equal(
      sched_session_open(s, info.token, SCHED_TOKEN_BYTES, &ss, &st), PD_OK);
  upload_ok(ss, 1, NULL, DEV_LAYOUT_MIRRORED, 4);
  const int64_t far[2] = {1, 2};
  const dev_attr fa[1] = {dev_attr_int_list("devices", far, 2)};
  o = op_of("CopyToDevices", &in, 1, &out, 1, fa, 1);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(exec_ops(ss, &o, 1, &st), PD_PERMISSION_DENIED);
  assert_contains(st.msg,
                  "device [2] is outside the session's allowed "
                  "devices [0, 1]");
  sync_all(ss);
  sched_session_put(ss);
  sched_destroy(s);
}

int main(void) {
  g_engine = tu_engine(NDEV, 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pack_loop_meets_quota),
      cmocka_unit_test(test_reshape_loop_meets_quota),
      cmocka_unit_test(test_device_bytes_every_order),
      cmocka_unit_test(test_pack_within_request_and_failed_request),
      cmocka_unit_test(test_reshape_alias_keeps_charge),
      cmocka_unit_test(test_close_refunds_once),
      cmocka_unit_test(test_copy_target_outside_mesh),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  dev_engine_destroy(g_engine);
  return rc;
}
