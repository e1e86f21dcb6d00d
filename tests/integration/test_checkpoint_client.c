/* libparadev's checkpoint calls (include/paradev/checkpoint.h) against the
 * real daemon on a temporary Unix socket with a storage root:
 *  - pd_load_tensors of a .npy written here byte by byte (values i * 0.25,
 *    worked out here), with no specs (every tensor, fresh library ids) and
 *    with a sharded spec: handles, dtypes, the components' and the file's
 *    shapes, the bytes downloaded;
 *  - pd_load_progress until done, with and without a wait;
 *  - pd_save_tensors of an uploaded tensor with metadata: the file read back
 *    here (header length, JSON keys, data bytes), overwrite refused and
 *    allowed;
 *  - errors: bad options, NULL arguments, a path out of the root, an
 *    unknown load id, a wait over the limit, a layout a load cannot take.
 *
 * Usage: test_checkpoint_client PARADEVD
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "paradev/paradev.h"
#include "harness.h"

#define NDEV 3
#define ROWS 7
#define COLS 4

static const char *paradevd_path;
static pdt_daemon D;
static char root[64];

typedef struct env {
  pd_client *c;
  pd_session *s;
  pd_status *st;
} env;

/* A float32 C-order .npy version 1.0 of shape (ROWS, COLS), values i / 4. */
static void write_npy(const char *path) {
  char dict[128];
  int n = snprintf(dict, sizeof(dict),
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, "
                   "%d), }",
                   ROWS, COLS);
  int total = 10 + n + 1;
  int pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  unsigned short hl = (unsigned short)(n + pad + 1);
  fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  fputc(hl & 0xff, f);
  fputc(hl >> 8, f);
  fwrite(dict, 1, (size_t)n, f);
  for (int i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  for (int i = 0; i < ROWS * COLS; i++) {
    float v = (float)i * 0.25f;
    fwrite(&v, sizeof(v), 1, f);
  }
  fclose(f);
}

static void expected(float *v) {
  for (int i = 0; i < ROWS * COLS; i++) v[i] = (float)i * 0.25f;
}

static int setup(void **state) {
  env *e = calloc(1, sizeof(*e));
  e->st = pd_status_new();
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.default_timeout_ms = 30000;
  e->c = pd_client_new(D.unix_target, &co, e->st);
  if (!e->c) return -1;
  e->s = pd_session_new(e->c, NULL, NULL, e->st);
  if (!e->s) return -1;
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

static void wait_done(env *e, const pd_load *l) {
  pd_load_progress_info p;
  for (int i = 0; i < 600; i++) {
    OK(e, pd_load_progress(e->s, pd_load_id(l), 1000, &p, NULL, e->st));
    assert_true(p.bytes_done <= p.bytes_total);
    if (p.done) break;
  }
  assert_true(p.done);
  assert_int_equal(p.code, PD_OK);
  assert_int_equal(p.tensors_failed, 0);
  assert_int_equal(p.bytes_done, pd_load_total_bytes(l));
}

static void test_load_all(void **state) {
  env *e = *state;
  pd_load *l = NULL;
  OK(e, pd_load_tensors(e->s, "m.npy", NULL, 0, NULL, &l, NULL, e->st));
  assert_int_equal(pd_load_num_tensors(l), 1);
  assert_string_equal(pd_load_tensor_name(l, 0), "");
  assert_null(pd_load_tensor_name(l, 1));
  assert_int_equal(pd_load_total_bytes(l), ROWS * COLS * sizeof(float));
  pd_tensor_info ti;
  assert_true(pd_load_tensor_info(l, 0, &ti));
  assert_true(ti.id >= PD_FIRST_LIBRARY_ID);
  assert_int_equal(ti.dtype, PD_FLOAT32);
  int64_t dims[2] = {ROWS, COLS};
  pdt_assert_shape(&ti, 2, dims);
  wait_done(e, l);
  float got[ROWS * COLS], want[ROWS * COLS];
  expected(want);
  OK(e, pd_download(e->s, ti.id, pd_layout_mirrored(), got, sizeof(got), NULL,
                    NULL, NULL, e->st));
  pdt_assert_bytes(got, want, sizeof(got), "m.npy mirrored");
  /* A finished load answers at once, with or without a wait. */
  pd_load_progress_info p;
  OK(e, pd_load_progress(e->s, pd_load_id(l), 0, &p, NULL, e->st));
  assert_true(p.done);
  assert_int_equal(p.tensors_done, 1);
  pd_load_delete(l);
}

static void test_load_sharded(void **state) {
  env *e = *state;
  pd_load_spec spec = {"", 0, pd_layout_sharded(0), NULL, 0, NULL, 0};
  pd_load *l = NULL;
  OK(e, pd_load_tensors(e->s, "m.npy", &spec, 1, NULL, &l, NULL, e->st));
  pd_tensor_info ti;
  assert_true(pd_load_tensor_info(l, 0, &ti));
  int64_t comp[2] = {-1, COLS}; /* 7 rows on 3 devices: 3, 2, 2 */
  pdt_assert_shape(&ti, 2, comp);
  int rank = 0;
  int64_t host[PD_MAX_RANK];
  assert_true(pd_load_tensor_host_shape(l, 0, &rank, host));
  assert_int_equal(rank, 2);
  assert_int_equal(host[0], ROWS);
  assert_int_equal(host[1], COLS);
  wait_done(e, l);
  float got[ROWS * COLS], want[ROWS * COLS];
  expected(want);
  OK(e, pd_download(e->s, ti.id, pd_layout_sharded(0), got, sizeof(got), NULL,
                    NULL, NULL, e->st));
  pdt_assert_bytes(got, want, sizeof(got), "m.npy sharded");
  pd_load_delete(l);
}

/* Reads a safetensors file: its header text and its data section. */
static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  rewind(f);
  char *b = malloc(*len + 1);
  assert_int_equal(fread(b, 1, *len, f), *len);
  b[*len] = '\0';
  fclose(f);
  return b;
}

static void test_save(void **state) {
  env *e = *state;
  float v[6] = {1, -2, 3.5f, 0.125f, -0.0f, 1e30f};
  int64_t dims[2] = {2, 3};
  OK(e, pd_upload(e->s, 77, PD_FLOAT32, dims, 2, v, sizeof(v),
                  pd_layout_mirrored(), NULL, NULL, e->st));
  pd_save_spec spec = {"weights", 77, pd_layout_mirrored()};
  const char *keys[] = {"step"}, *vals[] = {"12"};
  pd_save_options so = PD_SAVE_OPTIONS_INITIALIZER;
  so.meta_keys = keys;
  so.meta_values = vals;
  so.n_meta = 1;
  uint64_t written = 0;
  OK(e, pd_save_tensors(e->s, "out.safetensors", &spec, 1, &so, &written, NULL,
                        e->st));
  assert_int_equal(written, sizeof(v));
  char path[128];
  snprintf(path, sizeof(path), "%s/out.safetensors", root);
  size_t len = 0;
  char *b = read_file(path, &len);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)b[i];
  assert_int_equal(8 + hl + sizeof(v), len);
  char *hdr = strndup(b + 8, hl);
  assert_non_null(strstr(hdr, "\"weights\""));
  assert_non_null(strstr(hdr, "\"F32\""));
  assert_non_null(strstr(hdr, "\"step\""));
  pdt_assert_bytes(b + 8 + hl, v, sizeof(v), "saved data");
  free(hdr);
  free(b);
  EXPECT_CODE(e, PD_ALREADY_EXISTS,
              pd_save_tensors(e->s, "out.safetensors", &spec, 1, NULL, NULL,
                              NULL, e->st));
  so.overwrite = true;
  so.n_meta = 0;
  /* path_out: the absolute path the daemon wrote, not the relative one. */
  char where[256] = "";
  so.path_out = where;
  so.path_cap = sizeof where;
  OK(e, pd_save_tensors(e->s, "out.safetensors", &spec, 1, &so, NULL, NULL,
                        e->st));
  assert_string_equal(where, path);
  /* An older caller's struct (ending at n_meta) is still accepted. */
  so.struct_size = offsetof(pd_save_options, path_out);
  where[0] = '\0';
  OK(e, pd_save_tensors(e->s, "out.safetensors", &spec, 1, &so, NULL, NULL,
                        e->st));
  assert_string_equal(where, ""); /* not written: the fields are not its */
}

static void test_errors(void **state) {
  env *e = *state;
  pd_load *l = NULL;
  pd_load_options lo = PD_LOAD_OPTIONS_INITIALIZER;
  lo.struct_size = 3;
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_load_tensors(e->s, "m.npy", NULL, 0, &lo, &l, NULL, e->st));
  ASSERT_MSG_HAS(e, "struct_size");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_load_tensors(e->s, NULL, NULL, 0, NULL, &l, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_load_tensors(e->s, "m.npy", NULL, 1, NULL, &l, NULL, e->st));
  EXPECT_CODE(
      e, PD_PERMISSION_DENIED,
      pd_load_tensors(e->s, "../m.npy", NULL, 0, NULL, &l, NULL, e->st));
  EXPECT_CODE(
      e, PD_PERMISSION_DENIED,
      pd_load_tensors(e->s, "/etc/passwd", NULL, 0, NULL, &l, NULL, e->st));
  EXPECT_CODE(
      e, PD_NOT_FOUND,
      pd_load_tensors(e->s, "none.npy", NULL, 0, NULL, &l, NULL, e->st));
  pd_load_spec bad = {"", 5, pd_layout_component(1), NULL, 0, NULL, 0};
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_load_tensors(e->s, "m.npy", &bad, 1, NULL, &l, NULL, e->st));
  assert_null(l);
  pd_load_progress_info p;
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_load_progress(e->s, 424242, 0, &p, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_load_progress(e->s, 1, 60001, &p, NULL, e->st));
  pd_save_spec sp = {"x", 123456, pd_layout_mirrored()};
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_save_tensors(e->s, "x.safetensors", &sp, 0, NULL, NULL, NULL, e->st));
  EXPECT_CODE(
      e, PD_NOT_FOUND,
      pd_save_tensors(e->s, "x.safetensors", &sp, 1, NULL, NULL, NULL, e->st));
  float one = 1;
  OK(e, pd_upload(e->s, 9, PD_FLOAT32, NULL, 0, &one, sizeof(one),
                  pd_layout_mirrored(), NULL, NULL, e->st));
  sp.id = 9;
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_save_tensors(e->s, "/tmp/x.safetensors", &sp, 1, NULL, NULL,
                              NULL, e->st));
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_save_tensors(e->s, "../x.safetensors", &sp, 1, NULL, NULL,
                              NULL, e->st));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PARADEVD\n", argv[0]);
    return 2;
  }
  paradevd_path = argv[1];
  signal(SIGPIPE, SIG_IGN);
  snprintf(root, sizeof(root), "/tmp/pdckpt-root-XXXXXX");
  if (!mkdtemp(root)) return 1;
  char npy[128];
  snprintf(npy, sizeof(npy), "%s/m.npy", root);
  write_npy(npy);
  char ndev[8];
  snprintf(ndev, sizeof(ndev), "%d", NDEV);
  const char *extra[] = {"--devices", ndev, "--storage-root", root, NULL};
  pdt_daemon_start(&D, paradevd_path, "pdckpt", false, extra);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_load_all, setup, teardown),
      cmocka_unit_test_setup_teardown(test_load_sharded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_save, setup, teardown),
      cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
  };
  int failed =
      cmocka_run_group_tests_name("libparadev checkpoints", tests, NULL, NULL);
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
  char cmd[160];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", root);
  return failed ? 1 : 0;
}
