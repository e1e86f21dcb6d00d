/* Checkpoint loads and saves through the scheduler (scheduler.h,
 * "Checkpoints") on an in-process CPU engine of 3 devices: files written
 * here byte by byte (safetensors and .npy, by their specifications) load
 * mirrored, sharded along axis 0 and 1 and per component, each component
 * compared with the slice of the known bytes worked out by hand; an op on a
 * tensor still loading waits (the load is held at a gate, the test hook of
 * sched_int.h, not by a sleep) while another session goes on; a read error
 * fails that tensor alone; the call's errors; a session closed mid-load;
 * saves read back bit for bit in each layout, refusing to overwrite, and the
 * save of a failed tensor. */
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sched_int.h"
#include "testutil.h"

#define INC 0x0102030405060708ULL
#define NDEV 3

static dev_engine *g_engine;
static char g_dir[256];
static stg_roots *g_roots;

/* --- files ----------------------------------------------------------------- */

static char *path_in(const char *name) {
  static char buf[4][512];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 512, "%s/%s", g_dir, name);
  return p;
}

static void write_file(const char *name, const void *data, size_t n) {
  FILE *f = fopen(path_in(name), "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

typedef struct st_entry {
  const char *name, *dtype, *shape; /* shape as JSON: "[5,4]" */
  const void *data;
  size_t bytes;
} st_entry;

/* A safetensors file: u64 LE header length, the JSON header padded with
 * spaces to 8 bytes, the data back to back in entry order. */
static void write_safetensors(const char *name, const st_entry *e, int n) {
  char hdr[4096];
  size_t off = 0, len = 0;
  len += (size_t)snprintf(hdr + len, sizeof hdr - len, "{");
  for (int i = 0; i < n; i++) {
    len += (size_t)snprintf(hdr + len, sizeof hdr - len,
                            "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,"
                            "\"data_offsets\":[%zu,%zu]}",
                            i ? "," : "", e[i].name, e[i].dtype, e[i].shape,
                            off, off + e[i].bytes);
    off += e[i].bytes;
  }
  len += (size_t)snprintf(hdr + len, sizeof hdr - len, "}");
  while (len % 8) hdr[len++] = ' ';
  size_t total = 8 + len + off;
  unsigned char *buf = malloc(total);
  for (int i = 0; i < 8; i++)
    buf[i] = (unsigned char)((uint64_t)len >> (8 * i));
  memcpy(buf + 8, hdr, len);
  size_t at = 8 + len;
  for (int i = 0; i < n; i++) {
    memcpy(buf + at, e[i].data, e[i].bytes);
    at += e[i].bytes;
  }
  write_file(name, buf, total);
  free(buf);
}

/* A .npy version 1.0 file: `descr` ('<f4', '>f4'), Fortran order or C. */
static void write_npy(const char *name, const char *descr, bool fortran,
                      const char *shape, const void *data, size_t bytes) {
  char dict[256];
  int dl = snprintf(dict, sizeof dict,
                    "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }",
                    descr, fortran ? "True" : "False", shape);
  size_t hl = (size_t)dl + 1;
  while ((10 + hl) % 64) hl++;
  unsigned char *buf = malloc(10 + hl + bytes);
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (unsigned char)(hl & 0xff);
  buf[9] = (unsigned char)(hl >> 8);
  memset(buf + 10, ' ', hl);
  memcpy(buf + 10, dict, (size_t)dl);
  buf[10 + hl - 1] = '\n';
  memcpy(buf + 10 + hl, data, bytes);
  write_file(name, buf, 10 + hl + bytes);
  free(buf);
}

static void write_npy_f32(const char *name, const char *shape, const float *v,
                          size_t count) {
  write_npy(name, "<f4", false, shape, v, count * 4);
}

/* The test checkpoint: a float32 [5,4] = 0..19, b int32 [2,5] = 100..109,
 * c:0 [1], c:1 [2], c:2 [3] float32 (a per-component tensor). */
static float A[20];
static int32_t B[10];
static const float C0[1] = {1.5f}, C1[2] = {2.5f, 3.5f},
                   C2[3] = {4.5f, 5.5f, 6.5f};

static void write_model(const char *name) {
  for (int i = 0; i < 20; i++) A[i] = (float)i;
  for (int i = 0; i < 10; i++) B[i] = 100 + i;
  const st_entry e[] = {
      {"a", "F32", "[5,4]", A, sizeof A},
      {"b", "I32", "[2,5]", B, sizeof B},
      {"c:0", "F32", "[1]", C0, sizeof C0},
      {"c:1", "F32", "[2]", C1, sizeof C1},
      {"c:2", "F32", "[3]", C2, sizeof C2},
  };
  write_safetensors(name, e, 5);
}

/* --- the load hook: a gate and injected read errors ------------------------ */

typedef struct hook {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool closed;           /* chunks of gate_name wait while closed */
  const char *gate_name; /* NULL: every tensor */
  int waiting;           /* workers at the gate */
  const char *fail_name; /* inject fail_code for chunks at >= fail_off */
  uint64_t fail_off;
  pd_code fail_code;
} hook;

static hook g_hook = {.mu = PTHREAD_MUTEX_INITIALIZER,
                      .cv = PTHREAD_COND_INITIALIZER};

static pd_code hook_fn(void *arg, const char *name, int comp, uint64_t off,
                       dev_status *st) {
  (void)comp;
  hook *h = arg;
  pthread_mutex_lock(&h->mu);
  if (!h->gate_name || strcmp(h->gate_name, name) == 0) {
    h->waiting++;
    pthread_cond_broadcast(&h->cv);
    while (h->closed) pthread_cond_wait(&h->cv, &h->mu);
    h->waiting--;
  }
  pd_code c = PD_OK;
  if (h->fail_name && strcmp(h->fail_name, name) == 0 && off >= h->fail_off)
    c = dev_error(st, h->fail_code, "injected read error at byte %llu",
                  (unsigned long long)off);
  pthread_mutex_unlock(&h->mu);
  return c;
}

static void hook_reset(void) {
  pthread_mutex_lock(&g_hook.mu);
  g_hook.closed = false;
  g_hook.gate_name = NULL;
  g_hook.fail_name = NULL;
  pthread_cond_broadcast(&g_hook.cv);
  pthread_mutex_unlock(&g_hook.mu);
}

static void gate(const char *name, bool closed) {
  pthread_mutex_lock(&g_hook.mu);
  g_hook.gate_name = name;
  g_hook.closed = closed;
  pthread_cond_broadcast(&g_hook.cv);
  pthread_mutex_unlock(&g_hook.mu);
}

/* Waits until a worker stands at the gate. */
static void gate_reached(void) {
  pthread_mutex_lock(&g_hook.mu);
  while (g_hook.waiting == 0) pthread_cond_wait(&g_hook.cv, &g_hook.mu);
  pthread_mutex_unlock(&g_hook.mu);
}

/* --- scheduler, sessions, reads --------------------------------------------- */

static sched *new_sched(const stg_roots *roots) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = INC;
  cfg.max_handles_per_session = 100;
  cfg.storage_roots = roots;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  hook_reset();
  sched_set_load_hook(s, hook_fn, &g_hook, 8); /* 8-byte chunks */
  return s;
}

static sched_session *open_new(sched *s, uint64_t quota,
                               sched_session_info *info) {
  sched_session_params p = {"t", "job", 0, quota, NULL, 0, 0, 0, NULL, NULL};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_create(s, &p, info, &st), PD_OK);
  sched_session *ss = NULL;
  assert_int_equal(
      sched_session_open(s, info->token, SCHED_TOKEN_BYTES, &ss, &st), PD_OK);
  return ss;
}

static void close_session(sched *s, sched_session *ss,
                          const sched_session_info *info) {
  assert_int_equal(
      sched_session_close(s, info->token, SCHED_TOKEN_BYTES, NULL, NULL),
      PD_OK);
  sched_session_put(ss);
}

/* Component k of handle id as raw bytes; returns the tensor's code. */
static pd_code read_comp(sched_session *ss, uint64_t id, int k, void *out,
                         size_t cap, dev_status *st) {
  dev_tensor *t = NULL;
  assert_int_equal(sched_handle_get(ss, id, &t, st), PD_OK);
  pd_code c = sched_tensor_wait(ss, t, st);
  if (c == PD_OK) {
    dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, k};
    c = dev_tensor_to_host(t, &lay, 0, out, cap, st);
  }
  dev_tensor_release(t);
  return c;
}

static void expect_comp(sched_session *ss, uint64_t id, int k, const void *want,
                        size_t bytes) {
  unsigned char got[256];
  dev_status st = DEV_STATUS_INIT;
  pd_code c = read_comp(ss, id, k, got, sizeof got, &st);
  if (c != PD_OK)
    print_error("handle %llu: %s\n", (unsigned long long)id, st.msg);
  assert_int_equal(c, PD_OK);
  assert_memory_equal(got, want, bytes);
}

static sched_load_tensor lt(const char *name, uint64_t id, dev_layout lay) {
  sched_load_tensor t = {name, id, lay, NULL, 0, NULL};
  return t;
}

static const dev_layout MIR = {DEV_LAYOUT_MIRRORED, 0, 0};
static const dev_layout SH0 = {DEV_LAYOUT_SHARDED, 0, 0};
static const dev_layout SH1 = {DEV_LAYOUT_SHARDED, 1, 0};
static const dev_layout PER = {DEV_LAYOUT_PER_COMPONENT, 0, 0};

static pd_code load(sched_session *ss, const char *file,
                    const sched_load_tensor *t, int n, sched_load_result **r,
                    dev_status *st) {
  sched_load_request req = {file, STG_FORMAT_AUTO, t, n, 0, MIR, NULL};
  return sched_load_begin(ss, &req, r, st);
}

/* Waits until the load ended (polling its progress; the worker's progress
 * only moves forward, so this ends). */
static sched_load_progress wait_load(sched_session *ss, uint64_t id) {
  sched_load_progress p;
  for (;;) {
    assert_int_equal(sched_load_get_progress(ss, id, &p, NULL), PD_OK);
    if (p.done) return p;
    sched_sync(ss, NULL, 0, NULL, NULL, NULL);
    usleep(1000);
  }
}

/* --- loads ------------------------------------------------------------------ */

static void test_load_layouts(void **state) {
  write_model("model.safetensors");
  const float n0[2] = {10, 11}, n1[3] = {12, 13, 14}, n2[1] = {15};
  write_npy_f32("p0.npy", "(2,)", n0, 2);
  write_npy_f32("p1.npy", "(3,)", n1, 3);
  write_npy_f32("p2.npy", "(1,)", n2, 1);
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  const char *srcs[NDEV] = {path_in("p0.npy"), path_in("p1.npy"),
                            path_in("p2.npy")};
  sched_load_tensor t[5] = {lt("a", 1, MIR), lt("a", 2, SH0), lt("b", 3, SH1),
                            lt("c", 4, PER), lt("", 5, PER)};
  t[4].component_sources = srcs;
  t[4].n_component_sources = NDEV;
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  pd_code c = load(ss, path_in("model.safetensors"), t, 5, &r, &st);
  if (c != PD_OK) print_error("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
  /* Dtypes and shapes at once: a [5,4], its shards [-1,4], b [2,-1],
   * c [-1], p [-1]. */
  assert_int_equal(r->n, 5);
  assert_string_equal(r->tensors[0].name, "a");
  assert_int_equal(r->tensors[0].dtype, PD_FLOAT32);
  assert_int_equal(r->tensors[0].shape.dims[0], 5);
  assert_int_equal(r->tensors[1].shape.dims[0], -1); /* shards 2, 2, 1 */
  assert_int_equal(r->tensors[1].shape.dims[1], 4);
  assert_int_equal(r->tensors[2].dtype, PD_INT32);
  assert_int_equal(r->tensors[2].shape.dims[1], -1);
  assert_int_equal(r->tensors[3].shape.dims[0], -1);
  /* Read from storage: 80 (a once mirrored) + 80 + 40 + 24 + 24. */
  assert_int_equal(r->total_bytes, 248);
  sched_load_progress p = wait_load(ss, r->load_id);
  assert_int_equal(p.code, PD_OK);
  assert_int_equal(p.bytes_done, 248);
  assert_int_equal(p.bytes_total, 248);
  assert_int_equal(p.tensors_done, 5);
  assert_int_equal(p.tensors_total, 5);
  assert_int_equal(p.tensors_failed, 0);
  for (int k = 0; k < NDEV; k++) expect_comp(ss, 1, k, A, sizeof A);
  /* a along axis 0 over 3: rows 2, 2, 1 = values 0..7, 8..15, 16..19. */
  expect_comp(ss, 2, 0, A, 32);
  expect_comp(ss, 2, 1, A + 8, 32);
  expect_comp(ss, 2, 2, A + 16, 16);
  /* b [2,5] along axis 1: columns 2, 2, 1. */
  expect_comp(ss, 3, 0, (int32_t[]){100, 101, 105, 106}, 16);
  expect_comp(ss, 3, 1, (int32_t[]){102, 103, 107, 108}, 16);
  expect_comp(ss, 3, 2, (int32_t[]){104, 109}, 8);
  expect_comp(ss, 4, 0, C0, sizeof C0);
  expect_comp(ss, 4, 1, C1, sizeof C1);
  expect_comp(ss, 4, 2, C2, sizeof C2);
  expect_comp(ss, 5, 0, n0, sizeof n0);
  expect_comp(ss, 5, 1, n1, sizeof n1);
  expect_comp(ss, 5, 2, n2, sizeof n2);
  int handles = 0;
  uint64_t bytes = 0;
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(handles, 5);
  assert_int_equal(bytes, 80 * 3 + 80 + 40 + 24 + 24); /* device bytes */
  sched_load_result_free(r);
  /* Every tensor of the file, ids 10.., sharded along axis 0: a, b, and the
   * c:k entries as tensors of their own. */
  sched_load_request all = {
      path_in("model.safetensors"), STG_FORMAT_AUTO, NULL, 0, 10, SH0, NULL};
  assert_int_equal(sched_load_begin(ss, &all, &r, &st), PD_OK);
  assert_int_equal(r->n, 5);
  assert_int_equal(r->tensors[1].id, 11);
  wait_load(ss, r->load_id);
  expect_comp(ss, 11, 1, B + 5, 20); /* b's second row */
  sched_load_result_free(r);
  /* Per component, every tensor: c alone (from c:0, c:1, c:2). */
  sched_load_request per = {
      path_in("model.safetensors"), STG_FORMAT_AUTO, NULL, 0, 20, PER, NULL};
  assert_int_equal(sched_load_begin(ss, &per, &r, &st), PD_OK);
  assert_int_equal(r->n, 1);
  assert_string_equal(r->tensors[0].name, "c");
  wait_load(ss, r->load_id);
  expect_comp(ss, 20, 2, C2, sizeof C2);
  sched_load_result_free(r);
  close_session(s, ss, &info);
  sched_destroy(s);
}

static sched_op op1(const char *name, const uint64_t *in, int nin,
                    const uint64_t *out) {
  sched_op o = {name, in, nin, NULL, 0, out, 1, 0, 0, NULL};
  return o;
}

static void exec_tag(sched_session *ss, const char *op, uint64_t in,
                     uint64_t out, uint64_t tag) {
  sched_op o = op1(op, &in, 1, &out);
  sched_op_result res;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_execute(ss, &o, 1, tag, &res, NULL, &st), PD_OK);
}

static void exec1(sched_session *ss, const char *op, uint64_t in,
                  uint64_t out) {
  exec_tag(ss, op, in, out, 0);
}

static void upload_f32(sched_session *ss, uint64_t id, const float *v, int n) {
  dev_shape shape = {1, {n}};
  sched_upload *u = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      sched_upload_begin(ss, id, PD_FLOAT32, &MIR, &shape, NULL, &u, &st),
      PD_OK);
  assert_int_equal(sched_upload_write(u, 0, 0, v, (size_t)n * 4, &st), PD_OK);
  assert_int_equal(sched_upload_commit(u, &st), PD_OK);
}

/* Waits until the dispatcher holds the session on a loading tensor (its
 * private state, sched_int.h). */
static void wait_held(sched_session *ss) {
  for (;;) {
    pthread_mutex_lock(&ss->owner->qmu);
    bool held = ss->held_on != NULL;
    pthread_mutex_unlock(&ss->owner->qmu);
    if (held) return;
    usleep(1000);
  }
}

static void test_ops_wait_for_pending(void **state) {
  write_model("model.safetensors");
  sched *s = new_sched(g_roots);
  sched_session_info ia, ib;
  sched_session *a = open_new(s, 0, &ia);
  sched_session *b = open_new(s, 0, &ib);
  gate("a", true);
  sched_load_tensor t[1] = {lt("a", 1, SH0)};
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(load(a, path_in("model.safetensors"), t, 1, &r, &st), PD_OK);
  gate_reached();
  dev_tensor *ta = NULL;
  assert_int_equal(sched_handle_get(a, 1, &ta, &st), PD_OK);
  assert_false(dev_tensor_is_ready(ta));
  /* Session a: Neg of the loading tensor, then an op on a ready upload that
   * must stay behind it in a's order. */
  exec1(a, "Neg", 1, 2);
  const float x[2] = {1, 2};
  upload_f32(a, 10, x, 2);
  exec1(a, "Neg", 10, 11);
  wait_held(a);
  /* Session b goes on meanwhile: -[1, 2] computed while a is held. */
  upload_f32(b, 10, x, 2);
  exec1(b, "Neg", 10, 11);
  expect_comp(b, 11, 0, ((float[]){-1, -2}), 8);
  dev_tensor *t11 = NULL;
  assert_int_equal(sched_handle_get(a, 11, &t11, &st), PD_OK);
  assert_false(dev_tensor_is_ready(t11)); /* queued behind the held op */
  sched_session_view *views = NULL;
  int nv = sched_list_sessions(s, NULL, &views);
  uint64_t queued = 0;
  for (int i = 0; i < nv; i++)
    if (views[i].seq == ia.seq) queued = views[i].queued_ops;
  free(views);
  assert_int_equal(queued, 2);
  gate(NULL, false);
  expect_comp(a, 2, 0, ((float[]){-0., -1, -2, -3, -4, -5, -6, -7}), 32);
  expect_comp(a, 2, 2, ((float[]){-16, -17, -18, -19}), 16);
  expect_comp(a, 11, 1, ((float[]){-1, -2}), 8);
  dev_tensor_release(t11);
  dev_tensor_release(ta);
  sched_load_result_free(r);
  close_session(s, a, &ia);
  close_session(s, b, &ib);
  sched_destroy(s);
}

/* Cancelling the held op (its call's tag) lifts the hold: the session's
 * later ops run while the load is still at the gate. */
static void test_cancel_held_op(void **state) {
  write_model("model.safetensors");
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  gate("a", true);
  sched_load_tensor t[1] = {lt("a", 1, MIR)};
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(load(ss, path_in("model.safetensors"), t, 1, &r, &st),
                   PD_OK);
  gate_reached();
  uint64_t tag = sched_new_tag(s);
  exec_tag(ss, "Neg", 1, 2, tag);
  const float x[2] = {5, 6};
  upload_f32(ss, 10, x, 2);
  exec1(ss, "Neg", 10, 11);
  wait_held(ss);
  assert_int_equal(sched_cancel(ss, tag), 1);
  expect_comp(ss, 11, 2, ((float[]){-5, -6}), 8); /* the gate is still shut */
  unsigned char buf[80];
  assert_int_equal(read_comp(ss, 2, 0, buf, sizeof buf, &st), PD_CANCELLED);
  gate(NULL, false);
  expect_comp(ss, 1, 1, A, sizeof A);
  sched_load_result_free(r);
  close_session(s, ss, &info);
  sched_destroy(s);
}

static void test_read_error_fails_one_tensor(void **state) {
  write_model("model.safetensors");
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  pthread_mutex_lock(&g_hook.mu);
  g_hook.fail_name = "a";
  g_hook.fail_off = 40; /* half way: component 1 of 3 and beyond fail */
  g_hook.fail_code = PD_DATA_LOSS;
  pthread_mutex_unlock(&g_hook.mu);
  sched_load_tensor t[2] = {lt("a", 1, SH0), lt("b", 2, SH0)};
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(load(ss, path_in("model.safetensors"), t, 2, &r, &st),
                   PD_OK);
  exec1(ss, "Neg", 1, 3);
  sched_load_progress p = wait_load(ss, r->load_id);
  assert_int_equal(p.tensors_done, 2);
  assert_int_equal(p.tensors_failed, 1);
  assert_int_equal(p.code, PD_DATA_LOSS);
  assert_non_null(strstr(p.message, "tensor 'a'"));
  unsigned char buf[64];
  assert_int_equal(read_comp(ss, 1, 0, buf, sizeof buf, &st), PD_DATA_LOSS);
  assert_non_null(strstr(st.msg, "injected read error"));
  assert_int_equal(read_comp(ss, 3, 0, buf, sizeof buf, &st), PD_DATA_LOSS);
  expect_comp(ss, 2, 0, B, 20);
  expect_comp(ss, 2, 1, B + 5, 20);
  dev_tensor *tb = NULL;
  uint64_t ids[2] = {1, 2}, failed = 0;
  dev_status terr = DEV_STATUS_INIT;
  assert_int_equal(sched_sync(ss, ids, 2, &terr, &failed, &st), PD_OK);
  assert_int_equal(terr.code, PD_DATA_LOSS);
  assert_int_equal(failed, 1);
  (void)tb;
  sched_load_result_free(r);
  close_session(s, ss, &info);
  sched_destroy(s);
}

static void test_load_errors(void **state) {
  write_model("model.safetensors");
  write_file("bad.safetensors", "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":", 13);
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 100, &info); /* a quota of 100 bytes */
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  const char *model = path_in("model.safetensors");
  sched_load_tensor t[2] = {lt("b", 1, SH0), lt("nope", 2, MIR)};
  assert_int_equal(load(ss, model, t, 2, &r, &st), PD_NOT_FOUND);
  assert_non_null(strstr(st.msg, "'nope'"));
  /* a mirrored on 3 devices needs 240 bytes: over the quota. */
  t[1] = lt("a", 2, MIR);
  assert_int_equal(load(ss, model, t, 2, &r, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "quota"));
  t[1] = lt("a", 2, (dev_layout){DEV_LAYOUT_SHARDED, 2, 0});
  assert_int_equal(load(ss, model, t, 2, &r, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "axis 2"));
  t[1] = lt("a", 1, SH0);
  assert_int_equal(load(ss, model, t, 2, &r, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "twice"));
  assert_int_equal(load(ss, path_in("bad.safetensors"), t, 1, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(load(ss, "/etc/passwd", t, 1, &r, &st),
                   PD_PERMISSION_DENIED);
  assert_int_equal(load(ss, path_in("missing.safetensors"), t, 1, &r, &st),
                   PD_NOT_FOUND);
  t[0] = lt("c", 1, PER);
  const char *one[1] = {model};
  t[0].component_sources = one;
  t[0].n_component_sources = 1;
  assert_int_equal(load(ss, model, t, 1, &r, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "component sources"));
  /* Nothing was published by any of them. */
  int handles = -1;
  uint64_t bytes = 1;
  sched_session_usage(ss, &handles, &bytes);
  assert_int_equal(handles, 0);
  assert_int_equal(bytes, 0);
  /* An id in use. */
  upload_f32(ss, 7, (float[]){1}, 1);
  t[0] = lt("b", 7, SH0);
  assert_int_equal(load(ss, model, t, 1, &r, &st), PD_ALREADY_EXISTS);
  sched_load_progress p;
  assert_int_equal(sched_load_get_progress(ss, 99, &p, &st), PD_NOT_FOUND);
  close_session(s, ss, &info);
  sched_destroy(s);
  /* Without storage roots nothing loads or saves. */
  s = new_sched(NULL);
  ss = open_new(s, 0, &info);
  assert_int_equal(load(ss, model, t, 1, &r, &st), PD_FAILED_PRECONDITION);
  close_session(s, ss, &info);
  sched_destroy(s);
}

/* A session keeps the progress of its last SCHED_LOADS_KEPT finished loads. */
static void test_progress_kept(void **state) {
  write_model("model.safetensors");
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  sched_load_tensor t[1] = {lt("c:1", 1, MIR)};
  uint64_t first = 0, last = 0;
  dev_status st = DEV_STATUS_INIT;
  for (int i = 0; i < SCHED_LOADS_KEPT + 2; i++) {
    sched_load_result *r = NULL;
    assert_int_equal(load(ss, path_in("model.safetensors"), t, 1, &r, &st),
                     PD_OK);
    wait_load(ss, r->load_id);
    if (i == 0) first = r->load_id;
    last = r->load_id;
    sched_load_result_free(r);
    assert_int_equal(sched_handle_delete(ss, (uint64_t[]){1}, 1, &st), PD_OK);
  }
  assert_int_equal(last, first + SCHED_LOADS_KEPT + 1);
  sched_load_progress p;
  assert_int_equal(sched_load_get_progress(ss, first, &p, &st), PD_NOT_FOUND);
  assert_int_equal(sched_load_get_progress(ss, first + 1, &p, &st), PD_OK);
  assert_true(p.done);
  assert_int_equal(p.bytes_done, 8);
  assert_int_equal(sched_load_get_progress(ss, last, &p, &st), PD_OK);
  close_session(s, ss, &info);
  sched_destroy(s);
}

static void on_ready(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  *(_Atomic pd_code *)arg = code;
}

static void test_session_closed_mid_load(void **state) {
  write_model("model.safetensors");
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  gate(NULL, true);
  sched_load_tensor t[3] = {lt("a", 1, SH0), lt("b", 2, MIR), lt("c", 3, PER)};
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(load(ss, path_in("model.safetensors"), t, 3, &r, &st),
                   PD_OK);
  gate_reached(); /* a worker holds a piece of the load */
  exec1(ss, "Neg", 1, 4);
  dev_tensor *ta = NULL, *tc = NULL, *t4 = NULL;
  assert_int_equal(sched_handle_get(ss, 1, &ta, &st), PD_OK);
  assert_int_equal(sched_handle_get(ss, 3, &tc, &st), PD_OK);
  assert_int_equal(sched_handle_get(ss, 4, &t4, &st), PD_OK);
  _Atomic pd_code seen = PD_UNKNOWN;
  assert_int_equal(sched_tensor_notify(ss, tc, on_ready, &seen, &st), PD_OK);
  close_session(s, ss, &info);
  gate(NULL, false); /* the worker goes on, sees the end, stops */
  assert_int_equal(dev_tensor_wait(ta, &st), PD_CANCELLED);
  assert_int_equal(dev_tensor_wait(tc, &st), PD_CANCELLED);
  assert_int_equal(atomic_load(&seen), PD_CANCELLED);
  assert_int_equal(dev_tensor_wait(t4, &st), PD_CANCELLED);
  dev_tensor_release(ta);
  dev_tensor_release(tc);
  dev_tensor_release(t4);
  sched_load_result_free(r);
  sched_destroy(s); /* waits for the load's end; ASan checks for leaks */
  dev_memory_stats ms;
  for (int d = 0; d < NDEV; d++) {
    assert_int_equal(dev_engine_memory_stats(g_engine, d, &ms, &st), PD_OK);
    assert_int_equal(ms.bytes_in_use, 0);
  }
}

/* --- sched_load_begin_async ------------------------------------------------ */

typedef struct done_box {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool called;
  int calls;
  pd_code code;
  char msg[DEV_STATUS_MSG_MAX];
  sched_load_result *r;
} done_box;

static void on_done(void *arg, pd_code code, const dev_status *st,
                    sched_load_result *r) {
  done_box *b = arg;
  pthread_mutex_lock(&b->mu);
  b->called = true;
  b->calls++;
  b->code = code;
  snprintf(b->msg, sizeof b->msg, "%s", st ? st->msg : "");
  b->r = r;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

/* Begins an async load of `file` and waits (bounded) for its callback. */
static pd_code load_async(sched_session *ss, const char *file,
                          const sched_load_tensor *t, int n, double deadline_s,
                          bool cancel, done_box *b) {
  memset(b, 0, sizeof *b);
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  sched_load_request req = {file, STG_FORMAT_AUTO, t, n, 0, MIR, NULL};
  sched_load_pending *p = NULL;
  dev_status st = DEV_STATUS_INIT;
  pd_code c = sched_load_begin_async(ss, &req, deadline_s, on_done, b, &p, &st);
  assert_int_equal(c, PD_OK);
  if (cancel) sched_load_pending_cancel(p);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 20;
  pthread_mutex_lock(&b->mu);
  while (!b->called)
    if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) != 0) break;
  bool called = b->called;
  pthread_mutex_unlock(&b->mu);
  assert_true(called);
  sched_load_pending_put(p);
  return b->code;
}

static bool handle_live(sched_session *ss, uint64_t id) {
  dev_tensor *t = NULL;
  if (sched_handle_get(ss, id, &t, NULL) != PD_OK) return false;
  dev_tensor_release(t);
  return true;
}

/* The open runs on an open worker and calls back once: the result on
 * success (then the reads go on as for sched_load_begin); a missing file,
 * a deadline already past, or a cancel before publishing fail it with
 * nothing published and the load off the session's list. */
static void test_load_async(void **state) {
  (void)state;
  write_model("model.safetensors");
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  sched_load_tensor t[2] = {lt("a", 1, MIR), lt("b", 2, SH0)};
  done_box b;
  assert_int_equal(
      load_async(ss, path_in("model.safetensors"), t, 2, 0, false, &b), PD_OK);
  assert_int_equal(b.calls, 1);
  assert_non_null(b.r);
  assert_int_equal(b.r->n, 2);
  assert_int_equal(b.r->tensors[0].dtype, PD_FLOAT32);
  sched_load_progress p = wait_load(ss, b.r->load_id);
  assert_int_equal(p.code, PD_OK);
  for (int k = 0; k < NDEV; k++) expect_comp(ss, 1, k, A, sizeof A);
  sched_load_result_free(b.r);
  /* a missing file: NOT_FOUND, the record gone */
  sched_load_tensor t3[1] = {lt("a", 3, MIR)};
  assert_int_equal(
      load_async(ss, path_in("missing.safetensors"), t3, 1, 0, false, &b),
      PD_NOT_FOUND);
  assert_null(b.r);
  assert_false(handle_live(ss, 3));
  uint64_t last = 0;
  pthread_mutex_lock(&ss->mu);
  last = ss->last_load_id;
  pthread_mutex_unlock(&ss->mu);
  assert_int_equal(sched_load_get_progress(ss, last, &p, NULL), PD_NOT_FOUND);
  /* a deadline already past: even a local open is refused */
  assert_int_equal(load_async(ss, path_in("model.safetensors"), t3, 1,
                              stg_now_s() - 1, false, &b),
                   PD_DEADLINE_EXCEEDED);
  assert_false(handle_live(ss, 3));
  /* a cancel right after the begin: CANCELLED with nothing published, or
   * (the open was quicker) published and loading */
  pd_code c = load_async(ss, path_in("model.safetensors"), t3, 1, 0, true, &b);
  if (c == PD_OK) {
    assert_true(handle_live(ss, 3));
    wait_load(ss, b.r->load_id);
    sched_load_result_free(b.r);
  } else {
    assert_int_equal(c, PD_CANCELLED);
    assert_false(handle_live(ss, 3));
  }
  close_session(s, ss, &info);
  /* a closed session: refused at once */
  ss = open_new(s, 0, &info);
  sched_session *keep = ss;
  sched_session_ref(keep);
  close_session(s, ss, &info);
  sched_load_request req = {
      path_in("model.safetensors"), STG_FORMAT_AUTO, t3, 1, 0, MIR, NULL};
  sched_load_pending *pp = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_load_begin_async(keep, &req, 0, on_done, &b, &pp, &st),
                   PD_NOT_FOUND);
  sched_session_put(keep);
  sched_destroy(s);
}

/* Entries that are not random-access are read whole, then scattered:
 * big-endian data (byte-swapped) and Fortran order (transposed). */
static void test_load_whole_entries(void **state) {
  /* [[0,1,2],[3,4,5]] stored column by column: 0 3 1 4 2 5. */
  const float fort[6] = {0, 3, 1, 4, 2, 5};
  write_npy("fortran.npy", "<f4", true, "(2, 3)", fort, sizeof fort);
  /* 1, 2, 3, 4 as big-endian float32 (0x3f800000 ...). */
  const unsigned char be[16] = {0x3f, 0x80, 0, 0, 0x40, 0,    0, 0,
                                0x40, 0x40, 0, 0, 0x40, 0x80, 0, 0};
  write_npy("big.npy", ">f4", false, "(4,)", be, sizeof be);
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  sched_load_tensor t[1] = {lt("", 1, SH1)};
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  pd_code c = load(ss, path_in("fortran.npy"), t, 1, &r, &st);
  if (c != PD_OK) print_error("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
  wait_load(ss, r->load_id);
  sched_load_result_free(r);
  for (int k = 0; k < NDEV; k++) /* column k: [k, 3 + k] */
    expect_comp(ss, 1, k, ((float[]){(float)k, (float)(3 + k)}), 8);
  t[0] = lt("", 2, SH0);
  assert_int_equal(load(ss, path_in("big.npy"), t, 1, &r, &st), PD_OK);
  sched_load_progress p = wait_load(ss, r->load_id);
  assert_int_equal(p.bytes_done, 16);
  sched_load_result_free(r);
  expect_comp(ss, 2, 0, ((float[]){1, 2}), 8); /* shards of 2, 1, 1 */
  expect_comp(ss, 2, 1, ((float[]){3}), 4);
  expect_comp(ss, 2, 2, ((float[]){4}), 4);
  /* Two rows over three devices: the last shard is empty. */
  const float e4[4] = {1, 2, 3, 4};
  const st_entry e[1] = {{"e", "F32", "[2,2]", e4, sizeof e4}};
  write_safetensors("small.safetensors", e, 1);
  t[0] = lt("e", 3, SH0);
  assert_int_equal(load(ss, path_in("small.safetensors"), t, 1, &r, &st),
                   PD_OK);
  p = wait_load(ss, r->load_id);
  assert_int_equal(p.code, PD_OK);
  sched_load_result_free(r);
  expect_comp(ss, 3, 1, ((float[]){3, 4}), 8);
  dev_tensor *t3 = NULL;
  assert_int_equal(sched_handle_get(ss, 3, &t3, &st), PD_OK);
  assert_int_equal(dev_tensor_component_shape(t3, 2)->dims[0], 0);
  assert_int_equal(dev_tensor_wait(t3, &st), PD_OK);
  dev_tensor_release(t3);
  close_session(s, ss, &info);
  sched_destroy(s);
}

/* --- saves ------------------------------------------------------------------ */

typedef struct saved {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  pd_code code;
  char msg[DEV_STATUS_MSG_MAX];
  uint64_t bytes;
} saved;

static void on_saved(void *arg, pd_code code, const dev_status *st,
                     const sched_save_result *res) {
  saved *v = arg;
  pthread_mutex_lock(&v->mu);
  v->done = true;
  v->code = code;
  snprintf(v->msg, sizeof v->msg, "%s", st ? st->msg : "");
  v->bytes = res ? res->bytes_written : 0;
  pthread_cond_broadcast(&v->cv);
  pthread_mutex_unlock(&v->mu);
}

/* Saves and waits for `done`; returns its code (or the call's error). */
static pd_code save(sched_session *ss, const char *file,
                    const sched_save_tensor *t, int n, bool overwrite, saved *v,
                    dev_status *st) {
  memset(v, 0, sizeof *v);
  pthread_mutex_init(&v->mu, NULL);
  pthread_cond_init(&v->cv, NULL);
  const char *keys[1] = {"format"}, *vals[1] = {"pt"};
  bool npy = strstr(file, ".npy") != NULL;
  sched_save_request req = {file, STG_FORMAT_AUTO, t,        n, keys,
                            vals, npy ? 0 : 1,     overwrite};
  pd_code c = sched_save_begin(ss, &req, on_saved, v, st);
  if (c == PD_OK) {
    pthread_mutex_lock(&v->mu);
    while (!v->done) pthread_cond_wait(&v->cv, &v->mu);
    pthread_mutex_unlock(&v->mu);
    c = v->code;
    if (st) snprintf(st->msg, sizeof st->msg, "%s", v->msg);
  }
  pthread_cond_destroy(&v->cv);
  pthread_mutex_destroy(&v->mu);
  return c;
}

static void test_save_round_trip(void **state) {
  write_model("model.safetensors");
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  sched_load_tensor t[4] = {lt("a", 1, MIR), lt("a", 2, SH0), lt("b", 3, SH1),
                            lt("c", 4, PER)};
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(load(ss, path_in("model.safetensors"), t, 4, &r, &st),
                   PD_OK);
  sched_load_result_free(r);
  /* Saved right away: the save waits for the load, then for Neg. */
  exec1(ss, "Neg", 2, 5);
  sched_save_tensor sv[5] = {{"m", 1, MIR},
                             {"s0", 2, SH0},
                             {"s1", 3, SH1},
                             {"pc", 4, PER},
                             {"neg", 5, SH0}};
  saved v;
  pd_code c = save(ss, path_in("out.safetensors"), sv, 5, false, &v, &st);
  if (c != PD_OK) print_error("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
  assert_int_equal(v.bytes, 80 + 80 + 40 + 24 + 80);
  /* Load it back: every layout gives the same bytes. */
  sched_load_tensor back[5] = {lt("m", 11, MIR), lt("s0", 12, SH0),
                               lt("s1", 13, SH1), lt("pc", 14, PER),
                               lt("neg", 15, MIR)};
  assert_int_equal(load(ss, path_in("out.safetensors"), back, 5, &r, &st),
                   PD_OK);
  wait_load(ss, r->load_id);
  sched_load_result_free(r);
  expect_comp(ss, 11, 2, A, sizeof A);
  expect_comp(ss, 12, 1, A + 8, 32);
  expect_comp(ss, 13, 0, (int32_t[]){100, 101, 105, 106}, 16);
  expect_comp(ss, 13, 2, (int32_t[]){104, 109}, 8);
  expect_comp(ss, 14, 1, C1, sizeof C1);
  float neg[20];
  for (int i = 0; i < 20; i++) neg[i] = -A[i];
  expect_comp(ss, 15, 0, neg, sizeof neg);
  /* The same file without overwrite is refused at once; with it, fine. */
  assert_int_equal(
      sched_save_begin(
          ss,
          &(sched_save_request){path_in("out.safetensors"), STG_FORMAT_AUTO, sv,
                                1, NULL, NULL, 0, false},
          on_saved, &v, &st),
      PD_ALREADY_EXISTS);
  assert_int_equal(save(ss, path_in("out.safetensors"), sv, 1, true, &v, &st),
                   PD_OK);
  /* One tensor as .npy, read back. */
  assert_int_equal(save(ss, path_in("a.npy"), sv + 1, 1, false, &v, &st),
                   PD_OK);
  sched_load_tensor npy[1] = {lt("", 21, SH0)};
  assert_int_equal(load(ss, path_in("a.npy"), npy, 1, &r, &st), PD_OK);
  wait_load(ss, r->load_id);
  sched_load_result_free(r);
  expect_comp(ss, 21, 2, A + 16, 16);
  /* Errors at once: two tensors in a .npy, a name twice, an empty name, an
   * unknown id, a path outside the roots. */
  assert_int_equal(save(ss, path_in("two.npy"), sv, 2, false, &v, &st),
                   PD_INVALID_ARGUMENT);
  sched_save_tensor dup[2] = {{"x", 1, MIR}, {"x", 2, SH0}};
  assert_int_equal(save(ss, path_in("d.safetensors"), dup, 2, false, &v, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "'x'"));
  dup[1].name = "";
  assert_int_equal(save(ss, path_in("d.safetensors"), dup, 2, false, &v, &st),
                   PD_INVALID_ARGUMENT);
  dup[1] = (sched_save_tensor){"y", 999, MIR};
  assert_int_equal(save(ss, path_in("d.safetensors"), dup, 2, false, &v, &st),
                   PD_NOT_FOUND);
  assert_int_equal(
      save(ss, "/etc/paradev-test.safetensors", sv, 1, false, &v, &st),
      PD_PERMISSION_DENIED);
  assert_int_equal(access(path_in("d.safetensors"), F_OK), -1);
  close_session(s, ss, &info);
  sched_destroy(s);
}

static void test_save_failed_tensor(void **state) {
  write_model("model.safetensors");
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  pthread_mutex_lock(&g_hook.mu);
  g_hook.fail_name = "b";
  g_hook.fail_off = 0;
  g_hook.fail_code = PD_UNAVAILABLE;
  pthread_mutex_unlock(&g_hook.mu);
  sched_load_tensor t[2] = {lt("a", 1, MIR), lt("b", 2, MIR)};
  sched_load_result *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(load(ss, path_in("model.safetensors"), t, 2, &r, &st),
                   PD_OK);
  sched_load_result_free(r);
  sched_save_tensor sv[2] = {{"a", 1, MIR}, {"b", 2, MIR}};
  saved v;
  assert_int_equal(save(ss, path_in("f.safetensors"), sv, 2, false, &v, &st),
                   PD_UNAVAILABLE);
  assert_non_null(strstr(st.msg, "'b'"));
  assert_int_equal(access(path_in("f.safetensors"), F_OK), -1);
  /* A save cancelled with its session: the loads are held at the gate. */
  hook_reset();
  gate(NULL, true);
  t[0] = lt("a", 3, MIR);
  assert_int_equal(load(ss, path_in("model.safetensors"), t, 1, &r, &st),
                   PD_OK);
  sched_load_result_free(r);
  gate_reached();
  sched_save_tensor one[1] = {{"a", 3, MIR}};
  memset(&v, 0, sizeof v);
  pthread_mutex_init(&v.mu, NULL);
  pthread_cond_init(&v.cv, NULL);
  sched_save_request req = {
      path_in("g.safetensors"), STG_FORMAT_AUTO, one, 1, NULL, NULL, 0, false};
  assert_int_equal(sched_save_begin(ss, &req, on_saved, &v, &st), PD_OK);
  close_session(s, ss, &info);
  gate(NULL, false);
  pthread_mutex_lock(&v.mu);
  while (!v.done) pthread_cond_wait(&v.cv, &v.mu);
  pthread_mutex_unlock(&v.mu);
  assert_int_equal(v.code, PD_CANCELLED);
  assert_int_equal(access(path_in("g.safetensors"), F_OK), -1);
  pthread_cond_destroy(&v.cv);
  pthread_mutex_destroy(&v.mu);
  sched_destroy(s);
}

/* --- per-component saves and loads on a device set (issue #17) --------- */

static void assert_contains(const char *msg, const char *needle) {
  if (!strstr(msg, needle))
    fail_msg("\"%s\" does not contain \"%s\"", msg, needle);
}

/* Per-component float32 [2] on `set` (NULL: the session's default), its
 * component k filled with k. */
static void upload_per(sched_session *ss, uint64_t id, const dev_devset *set,
                       int n) {
  dev_shape shapes[PD_MAX_DEVICES];
  for (int k = 0; k < n; k++) shapes[k] = (dev_shape){1, {2}};
  sched_upload *u = NULL;
  dev_status st = DEV_STATUS_INIT;
  pd_code c = sched_upload_begin_on(ss, id, set, PD_FLOAT32, &PER, &shapes[0],
                                    shapes, &u, &st);
  if (c != PD_OK) print_error("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
  for (int k = 0; k < n; k++) {
    const float v[2] = {(float)k, (float)k};
    assert_int_equal(sched_upload_write(u, k, 0, v, sizeof v, &st), PD_OK);
  }
  assert_int_equal(sched_upload_commit(u, &st), PD_OK);
}

static sched_session *open_on(sched *s, const dev_devset *devices,
                              sched_session_info *info) {
  sched_session_params p = {
      .client_name = "t", .job_id = "job", .devices = devices};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_create(s, &p, info, &st), PD_OK);
  sched_session *ss = NULL;
  assert_int_equal(
      sched_session_open(s, info->token, SCHED_TOKEN_BYTES, &ss, &st), PD_OK);
  return ss;
}

/* Trial 2 P3: a per-component save has one entry per component of the
 * tensor's own set (it planned one per device of the mesh: "component 2
 * is out of range"), on a subset and in a narrowed session; loaded back
 * on a set of that size, each component is k. */
static void test_save_per_component_on_subset(void **state) {
  (void)state;
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  dev_devset two = {.n = 2, .dev = {2, 0}};
  upload_per(ss, 1, &two, 2);
  sched_save_tensor sv[1] = {{"pc", 1, PER}};
  saved v;
  dev_status st = DEV_STATUS_INIT;
  pd_code c = save(ss, path_in("pc2.safetensors"), sv, 1, true, &v, &st);
  if (c != PD_OK) print_error("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
  assert_int_equal(v.bytes, 16);
  sched_load_tensor back = lt("pc", 2, PER);
  dev_devset other = {.n = 2, .dev = {1, 2}};
  back.devices = &other;
  sched_load_result *r = NULL;
  assert_int_equal(load(ss, path_in("pc2.safetensors"), &back, 1, &r, &st),
                   PD_OK);
  wait_load(ss, r->load_id);
  sched_load_result_free(r);
  expect_comp(ss, 2, 0, (float[]){0, 0}, 8);
  expect_comp(ss, 2, 1, (float[]){1, 1}, 8);
  close_session(s, ss, &info);
  /* A session narrowed to [0, 1]: its default set has 2 devices. */
  dev_devset nar = {.n = 2, .dev = {0, 1}};
  ss = open_on(s, &nar, &info);
  upload_per(ss, 1, NULL, 2);
  st = (dev_status)DEV_STATUS_INIT;
  c = save(ss, path_in("pc2n.safetensors"), sv, 1, true, &v, &st);
  if (c != PD_OK) print_error("%s\n", st.msg);
  assert_int_equal(c, PD_OK);
  back = lt("pc", 2, PER); /* the session's default set */
  assert_int_equal(load(ss, path_in("pc2n.safetensors"), &back, 1, &r, &st),
                   PD_OK);
  wait_load(ss, r->load_id);
  sched_load_result_free(r);
  expect_comp(ss, 2, 1, (float[]){1, 1}, 8);
  close_session(s, ss, &info);
  sched_destroy(s);
}

/* Trial 2 P4: a per-component file of K components loaded onto a set of N
 * != K devices is INVALID_ARGUMENT naming the tensor, K and the set (it
 * dropped components for N < K, and was NOT_FOUND for N > K); K comes from
 * the save's metadata, else from the entries "<name>:<k>" present. */
static void test_load_per_component_count(void **state) {
  (void)state;
  sched *s = new_sched(g_roots);
  sched_session_info info;
  sched_session *ss = open_new(s, 0, &info);
  upload_per(ss, 1, NULL, NDEV); /* the whole mesh: 3 components */
  sched_save_tensor sv[1] = {{"pc", 1, PER}};
  saved v;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(save(ss, path_in("pc3.safetensors"), sv, 1, true, &v, &st),
                   PD_OK);
  sched_load_tensor t = lt("pc", 2, PER);
  dev_devset fewer = {.n = 2, .dev = {1, 2}};
  t.devices = &fewer;
  sched_load_result *r = NULL;
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(load(ss, path_in("pc3.safetensors"), &t, 1, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_contains(st.msg, "'pc' was saved with 3 components in ");
  assert_contains(st.msg, "; the device set [1, 2] has 2 (");
  assert_false(handle_live(ss, 2));
  /* More devices than components: the 2-component file onto the mesh. */
  dev_devset two = {.n = 2, .dev = {0, 2}};
  upload_per(ss, 3, &two, 2);
  sv[0].id = 3;
  assert_int_equal(save(ss, path_in("pc2m.safetensors"), sv, 1, true, &v, &st),
                   PD_OK);
  t = lt("pc", 2, PER);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(load(ss, path_in("pc2m.safetensors"), &t, 1, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_contains(st.msg, "'pc' was saved with 2 components in ");
  assert_contains(st.msg, "; the device set [0, 1, 2] has 3 (");
  /* Without metadata: the entries x:0..x:3 count. */
  const float z[2] = {0, 0};
  st_entry e[4] = {{"x:0", "F32", "[2]", z, 8},
                   {"x:1", "F32", "[2]", z, 8},
                   {"x:2", "F32", "[2]", z, 8},
                   {"x:3", "F32", "[2]", z, 8}};
  write_safetensors("x4.safetensors", e, 4);
  t = lt("x", 2, PER);
  st = (dev_status)DEV_STATUS_INIT;
  assert_int_equal(load(ss, path_in("x4.safetensors"), &t, 1, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_contains(st.msg, "'x' was saved with 4 components in ");
  assert_contains(st.msg, "; the device set [0, 1, 2] has 3 (");
  /* The matching count still loads. */
  t = lt("pc", 2, PER);
  t.devices = &fewer;
  assert_int_equal(load(ss, path_in("pc2m.safetensors"), &t, 1, &r, &st),
                   PD_OK);
  wait_load(ss, r->load_id);
  sched_load_result_free(r);
  expect_comp(ss, 2, 1, (float[]){1, 1}, 8);
  close_session(s, ss, &info);
  sched_destroy(s);
}

static int rm_one(const char *p, const struct stat *sb, int flag,
                  struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

int main(void) {
  g_engine = tu_engine(NDEV, 0);
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/paradev-load-XXXXXX", tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) return 1;
  const char *roots[1] = {g_dir};
  if (stg_roots_create(roots, 1, &g_roots, NULL) != PD_OK) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_layouts),
      cmocka_unit_test(test_ops_wait_for_pending),
      cmocka_unit_test(test_cancel_held_op),
      cmocka_unit_test(test_read_error_fails_one_tensor),
      cmocka_unit_test(test_load_errors),
      cmocka_unit_test(test_load_whole_entries),
      cmocka_unit_test(test_progress_kept),
      cmocka_unit_test(test_session_closed_mid_load),
      cmocka_unit_test(test_load_async),
      cmocka_unit_test(test_save_round_trip),
      cmocka_unit_test(test_save_failed_tensor),
      cmocka_unit_test(test_save_per_component_on_subset),
      cmocka_unit_test(test_load_per_component_count),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  stg_roots_destroy(g_roots);
  nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  dev_engine_destroy(g_engine);
  return rc;
}
