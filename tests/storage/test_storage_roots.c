/* Roots (storage/roots.c, resolve.c): what may be opened for reading, run
 * twice, once through openat2 and once through the fallback walk. The
 * expected codes are the rules: PERMISSION_DENIED for `..` out of a
 * root, absolute paths outside, symlinks out of a root, FIFOs, sockets,
 * devices, directories and /proc's magic links; a symlink inside that stays
 * inside is followed. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "stgtest.h"
#include "storage_int.h"

typedef struct fx {
  char *top;  /* scratch */
  char *root; /* top/root: the storage root */
  unsigned char *data;
  stg_roots *roots;
} fx;

#define DATA_N 1000

static int fx_setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  f->top = st_mkdtemp();
  f->root = st_join(f->top, "root");
  assert_int_equal(mkdir(f->root, 0755), 0);
  char *p = st_join(f->root, "sub");
  assert_int_equal(mkdir(p, 0755), 0);
  free(p);
  char *out = st_join(f->top, "outside");
  assert_int_equal(mkdir(out, 0755), 0);
  f->data = st_bytes(DATA_N, 7);
  char *fp = st_join(f->root, "sub/w.bin");
  st_write_file(fp, f->data, DATA_N);
  free(fp);
  fp = st_join(out, "secret");
  st_write_file(fp, "secret", 6);
  free(fp);
  free(out);
  const char *e[] = {f->root};
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_roots_create(e, 1, &f->roots, &st), PD_OK, &st);
  st_log_capture();
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  fx *f = *state;
  stg_roots_destroy(f->roots);
  st_rmtree(f->top);
  free(f->top);
  free(f->root);
  free(f->data);
  free(f);
  stg__force_walk(false);
  return 0;
}

/* Opens `name` and expects `want`; on success checks the bytes. Returns
 * the status message. */
static const char *expect_open(fx *f, const char *name, pd_code want) {
  static dev_status st;
  dev_status_clear(&st);
  stg_file *file = NULL;
  pd_code rc = stg_file_open(NULL, f->roots, name, &file, &st);
  if ((int)rc != (int)want) print_error("'%s': %s\n", name, st.msg);
  assert_int_equal(rc, want);
  if (rc == PD_OK) {
    assert_int_equal(stg_file_size(file), DATA_N);
    unsigned char buf[DATA_N];
    st_assert_code(stg_file_pread(file, 0, buf, DATA_N, &st), PD_OK, &st);
    assert_memory_equal(buf, f->data, DATA_N);
    stg_file_close(file);
  } else {
    assert_null(file);
  }
  return st.msg;
}

static void both_ways(void **state, void (*body)(fx *)) {
  for (int walk = 0; walk < 2; walk++) {
    stg__force_walk(walk);
    body(*state);
  }
}

static void body_inside(fx *f) {
  char *abs = st_join(f->root, "sub/w.bin");
  expect_open(f, abs, PD_OK);
  free(abs);
  expect_open(f, "sub/w.bin", PD_OK);
  expect_open(f, "./sub//w.bin", PD_OK);
  expect_open(f, "sub/../sub/w.bin", PD_OK); /* `..` that stays inside */
  expect_open(f, "sub/missing", PD_NOT_FOUND);
  expect_open(f, "sub/w.bin/x", PD_NOT_FOUND);
  expect_open(f, "sub/w.bin/", PD_NOT_FOUND); /* ENOTDIR both ways */
}
static void test_inside(void **state) { both_ways(state, body_inside); }

static void body_dotdot(fx *f) {
  const char *m = expect_open(f, "../outside/secret", PD_PERMISSION_DENIED);
  assert_non_null(strstr(m, "leaves storage root"));
  char *abs = st_join(f->root, "../outside/secret");
  expect_open(f, abs, PD_PERMISSION_DENIED);
  free(abs);
  expect_open(f, "sub/../../outside/secret", PD_PERMISSION_DENIED);
  int level = 0;
  assert_non_null(strstr(st_log_last(&level), "leaves storage root"));
  assert_int_equal(level, 4);
}
static void test_dotdot(void **state) { both_ways(state, body_dotdot); }

static void body_outside(fx *f) {
  char want[512];
  snprintf(want, sizeof want,
           "'/etc/passwd' is not beneath any storage root (roots: %s)",
           f->root);
  st_log_reset();
  const char *m = expect_open(f, "/etc/passwd", PD_PERMISSION_DENIED);
  assert_string_equal(m, want);
  assert_non_null(strstr(st_log_last(NULL), want));
  expect_open(f, "/etc/shadow", PD_PERMISSION_DENIED);
  /* a sibling whose name begins with the root's */
  char *sib = malloc(strlen(f->root) + 8);
  sprintf(sib, "%s2/x", f->root);
  expect_open(f, sib, PD_PERMISSION_DENIED);
  free(sib);
  expect_open(f, "/proc/self/environ", PD_PERMISSION_DENIED);
}
static void test_outside(void **state) { both_ways(state, body_outside); }

static void body_symlinks(fx *f) {
  expect_open(f, "ln_out", PD_PERMISSION_DENIED);
  expect_open(f, "ln_abs", PD_PERMISSION_DENIED);
  expect_open(f, "ln_in", PD_OK);
  expect_open(f, "sub/ln_up", PD_OK); /* ../sub/w.bin from sub/ */
  expect_open(f, "ln_dir/w.bin", PD_OK);
  expect_open(f, "ln_loop", PD_PERMISSION_DENIED);
}
static void test_symlinks(void **state) {
  fx *f = *state;
  const char *links[][2] = {{"ln_out", "../outside/secret"},
                            {"ln_abs", "/etc/passwd"},
                            {"ln_in", "sub/w.bin"},
                            {"sub/ln_up", "../sub/w.bin"},
                            {"ln_dir", "sub"},
                            {"ln_loop", "ln_loop"}};
  for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
    char *p = st_join(f->root, links[i][0]);
    assert_int_equal(symlink(links[i][1], p), 0);
    free(p);
  }
  both_ways(state, body_symlinks);
}

static void body_types(fx *f) {
  const char *m = expect_open(f, "fifo", PD_PERMISSION_DENIED);
  assert_non_null(strstr(m, "not a regular file"));
  expect_open(f, "sock", PD_PERMISSION_DENIED);
  expect_open(f, "sub", PD_PERMISSION_DENIED);
  char *abs = strdup(f->root);
  expect_open(f, abs, PD_PERMISSION_DENIED); /* the root itself */
  free(abs);
}
static void test_types(void **state) {
  fx *f = *state;
  char *p = st_join(f->root, "fifo");
  assert_int_equal(mkfifo(p, 0644), 0); /* no writer: a blocking open hangs */
  free(p);
  p = st_join(f->root, "sock");
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", p);
  assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  free(p);
  both_ways(state, body_types);
  close(s);
}

/* Roots on /dev and /proc: devices and magic links are still refused. */
static void test_dev_proc(void **state) {
  (void)state;
  const char *e[] = {"/dev", "/proc"};
  stg_roots *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_roots_create(e, 2, &r, &st), PD_OK, &st);
  int fd = open("/etc/passwd", O_RDONLY);
  assert_true(fd >= 0);
  char magic[64];
  snprintf(magic, sizeof magic, "/proc/self/fd/%d", fd);
  for (int walk = 0; walk < 2; walk++) {
    stg__force_walk(walk);
    stg_file *file = NULL;
    st_assert_code(stg_file_open(NULL, r, "/dev/null", &file, &st),
                   PD_PERMISSION_DENIED, &st);
    st_assert_code(stg_file_open(NULL, r, "/dev/zero", &file, &st),
                   PD_PERMISSION_DENIED, &st);
    st_assert_code(stg_file_open(NULL, r, magic, &file, &st),
                   PD_PERMISSION_DENIED, &st);
    st_assert_code(
        stg_file_open(NULL, r, "/proc/self/root/etc/passwd", &file, &st),
        PD_PERMISSION_DENIED, &st);
    assert_null(file);
  }
  stg__force_walk(false);
  close(fd);
  stg_roots_destroy(r);
}

static void test_create(void **state) {
  fx *f = *state;
  dev_status st = DEV_STATUS_INIT;
  stg_roots *r = NULL;
  const char *rel[] = {"models"};
  st_assert_code(stg_roots_create(rel, 1, &r, &st), PD_INVALID_ARGUMENT, &st);
  assert_non_null(strstr(st.msg, "'models' is relative"));
  char *missing = st_join(f->top, "nope");
  const char *mi[] = {missing};
  st_assert_code(stg_roots_create(mi, 1, &r, &st), PD_INVALID_ARGUMENT, &st);
  free(missing);
  const char *nohost[] = {"https:///x"};
  st_assert_code(stg_roots_create(nohost, 1, &r, &st), PD_INVALID_ARGUMENT,
                 &st);
  const char *ftp[] = {"ftp://host/x"};
  st_assert_code(stg_roots_create(ftp, 1, &r, &st), PD_INVALID_ARGUMENT, &st);
  const char *emp[] = {""};
  st_assert_code(stg_roots_create(emp, 1, &r, &st), PD_INVALID_ARGUMENT, &st);
  assert_null(r);
  /* no roots: nothing is readable */
  st_assert_code(stg_roots_create(NULL, 0, &r, &st), PD_OK, &st);
  assert_int_equal(stg_roots_count(r), 0);
  stg_file *file = NULL;
  char *abs = st_join(f->root, "sub/w.bin");
  st_assert_code(stg_file_open(NULL, r, abs, &file, &st), PD_PERMISSION_DENIED,
                 &st);
  assert_non_null(strstr(st.msg, "(roots: none)"));
  stg_roots_destroy(r);
  /* two roots: relative names are tried in order */
  char *other = st_join(f->top, "outside");
  const char *two[] = {other, f->root, "https://h.example/m/"};
  st_assert_code(stg_roots_create(two, 3, &r, &st), PD_OK, &st);
  assert_int_equal(stg_roots_count(r), 3);
  assert_string_equal(stg_roots_entry(r, 2), "https://h.example/m/");
  assert_null(stg_roots_entry(r, 3));
  st_assert_code(stg_file_open(NULL, r, "sub/w.bin", &file, &st), PD_OK, &st);
  stg_file_close(file);
  st_assert_code(stg_file_open(NULL, r, "secret", &file, &st), PD_OK, &st);
  assert_int_equal(stg_file_size(file), 6);
  stg_file_close(file);
  stg_roots_destroy(r);
  free(other);
  free(abs);
}

static pd_code url(const stg_roots *r, const char *u, char **norm) {
  dev_status st = DEV_STATUS_INIT;
  *norm = NULL;
  pd_code rc = stg__roots_url(r, u, norm, &st);
  if (rc != PD_OK) assert_null(*norm);
  return rc;
}

static void test_urls(void **state) {
  (void)state;
  const char *e[] = {"https://Bucket.Example.com/models/", "http://h:8080/m"};
  stg_roots *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_roots_create(e, 2, &r, &st), PD_OK, &st);
  char *n = NULL;
  assert_int_equal(url(r, "https://bucket.example.com/models/a.st", &n), PD_OK);
  assert_string_equal(n, "https://bucket.example.com/models/a.st");
  free(n);
  assert_int_equal(
      url(r, "HTTPS://BUCKET.example.com:443/models/a?X-Sig=1", &n), PD_OK);
  assert_string_equal(n, "https://bucket.example.com/models/a?X-Sig=1");
  free(n);
  assert_int_equal(url(r, "http://h:8080/m/x", &n), PD_OK);
  free(n);
  assert_int_equal(url(r, "http://h:8080/m", &n), PD_OK);
  free(n);
  assert_int_equal(url(r, "http://h:8080/mx", &n), PD_PERMISSION_DENIED);
  assert_int_equal(url(r, "http://h/m/x", &n), PD_PERMISSION_DENIED);
  assert_int_equal(url(r, "https://bucket.example.com/models2/a", &n),
                   PD_PERMISSION_DENIED);
  assert_int_equal(url(r, "http://bucket.example.com/models/a", &n),
                   PD_PERMISSION_DENIED);
  assert_int_equal(url(r, "https://bucket.example.com/models/../secret", &n),
                   PD_PERMISSION_DENIED);
  assert_int_equal(
      url(r, "https://bucket.example.com/models/%2e%2E/secret", &n),
      PD_PERMISSION_DENIED);
  assert_int_equal(url(r, "https://bucket.example.com/models/a%2f..%2fb", &n),
                   PD_PERMISSION_DENIED);
  assert_int_equal(url(r, "https://u:p@bucket.example.com/models/a", &n),
                   PD_PERMISSION_DENIED);
  assert_int_equal(url(r, "https://bucket.example.com/models/a#frag", &n),
                   PD_PERMISSION_DENIED);
  st_log_reset();
  assert_int_equal(url(r, "https://evil.example/models/a?sig=SECRET", &n),
                   PD_PERMISSION_DENIED);
  const char *logged = st_log_last(NULL);
  assert_non_null(strstr(logged, "not beneath any storage root URL"));
  assert_null(strstr(logged, "SECRET")); /* a query is cut from messages */
  /* a local path is not matched by URL roots, nor a URL by local ones */
  stg_file *file = NULL;
  st_assert_code(stg_file_open(NULL, r, "/etc/passwd", &file, &st),
                 PD_PERMISSION_DENIED, &st);
  stg_roots_destroy(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_inside, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_dotdot, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_outside, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_symlinks, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_types, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_create, fx_setup, fx_teardown),
      cmocka_unit_test(test_dev_proc),
      cmocka_unit_test(test_urls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
