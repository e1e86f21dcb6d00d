/* Atomic writes (storage/out.c): the bytes appear under the target's name
 * only at commit; overwrite is refused unless asked for; abort and a failed
 * commit leave no temporary file; writes obey the roots as reads do. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <time.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stgtest.h"
#include "storage_int.h"

typedef struct fx {
  char *top, *root;
  stg_roots *roots;
} fx;

static int fx_setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  f->top = st_mkdtemp();
  f->root = st_join(f->top, "root");
  assert_int_equal(mkdir(f->root, 0755), 0);
  const char *e[] = {f->root};
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_roots_create(e, 1, &f->roots, &st), PD_OK, &st);
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  fx *f = *state;
  stg_roots_destroy(f->roots);
  st_rmtree(f->top);
  free(f->top);
  free(f->root);
  free(f);
  return 0;
}

/* How many entries of `dir` begin with ".". */
static int hidden_entries(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] == '.' && strcmp(e->d_name, ".") &&
        strcmp(e->d_name, ".."))
      n++;
  closedir(d);
  return n;
}

static void write_all(stg_out *o, const unsigned char *p, size_t n) {
  dev_status st = DEV_STATUS_INIT;
  /* in uneven pieces, as a writer streaming tensors does */
  for (size_t off = 0, k = 1; off < n; k = k * 3 + 1) {
    size_t len = k < n - off ? k : n - off;
    st_assert_code(stg_out_write(o, p + off, len, &st), PD_OK, &st);
    off += len;
  }
}

static void test_commit(void **state) {
  fx *f = *state;
  char *path = st_join(f->root, "ckpt.safetensors");
  unsigned char *data = st_bytes(100000, 3);
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_out_create(f->roots, path, false, &o, &st), PD_OK, &st);
  write_all(o, data, 100000);
  size_t n = 0;
  assert_null(st_read_file(path, &n)); /* not there before commit */
  assert_int_equal(hidden_entries(f->root), 1);
  st_assert_code(stg_out_commit(o, &st), PD_OK, &st);
  unsigned char *got = st_read_file(path, &n);
  assert_non_null(got);
  assert_int_equal(n, 100000);
  assert_memory_equal(got, data, n);
  assert_int_equal(hidden_entries(f->root), 0);
  free(got);
  /* exists: refused without overwrite, at create */
  st_assert_code(stg_out_create(f->roots, path, false, &o, &st),
                 PD_ALREADY_EXISTS, &st);
  assert_non_null(strstr(st.msg, "already exists"));
  /* replaced with overwrite */
  st_assert_code(stg_out_create(f->roots, "ckpt.safetensors", true, &o, &st),
                 PD_OK, &st);
  write_all(o, (const unsigned char *)"new", 3);
  st_assert_code(stg_out_commit(o, &st), PD_OK, &st);
  got = st_read_file(path, &n);
  assert_int_equal(n, 3);
  assert_memory_equal(got, "new", 3);
  free(got);
  free(data);
  free(path);
}

static void test_abort(void **state) {
  fx *f = *state;
  char *path = st_join(f->root, "a.npy");
  st_write_file(path, "old", 3);
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_out_create(f->roots, path, true, &o, &st), PD_OK, &st);
  write_all(o, (const unsigned char *)"half-written", 12);
  assert_int_equal(hidden_entries(f->root), 1);
  stg_out_abort(o);
  assert_int_equal(hidden_entries(f->root), 0);
  size_t n = 0;
  unsigned char *got = st_read_file(path, &n);
  assert_int_equal(n, 3);
  assert_memory_equal(got, "old", 3);
  free(got);
  stg_out_abort(NULL);
  free(path);
}

/* Writes `name` in dir with an mtime `age_s` seconds ago. */
static char *aged_file(const char *dir, const char *name, long age_s) {
  char *p = st_join(dir, name);
  st_write_file(p, "orphan", 6);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  struct timespec t[2] = {{now.tv_sec - age_s, 0}, {now.tv_sec - age_s, 0}};
  assert_int_equal(utimensat(AT_FDCWD, p, t, 0), 0);
  return p;
}

/* A save removes the orphaned temporary files of its own target (a writer
 * killed mid-save: old, and nobody holds their lock), and nothing else: a
 * fresh one, one whose writer still holds its lock, another target's, and
 * names that only look alike stay. */
static void test_orphans(void **state) {
  fx *f = *state;
  char *orphan = aged_file(f->root, ".m.safetensors.tmp-0a1b2c", 3600);
  char *fresh = aged_file(f->root, ".m.safetensors.tmp-00ffee", 0);
  char *live = aged_file(f->root, ".m.safetensors.tmp-123456", 3600);
  char *other = aged_file(f->root, ".n.safetensors.tmp-0a1b2c", 3600);
  char *alike = aged_file(f->root, ".m.safetensors.tmp-0a1b2cX", 3600);
  int lfd = open(live, O_RDONLY | O_CLOEXEC);
  assert_true(lfd >= 0);
  assert_int_equal(flock(lfd, LOCK_EX | LOCK_NB), 0); /* a live writer */
  assert_int_equal(hidden_entries(f->root), 5);
  st_log_capture();
  st_log_reset();
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_out_create(f->roots, "m.safetensors", false, &o, &st),
                 PD_OK, &st);
  write_all(o, (const unsigned char *)"abc", 3);
  st_assert_code(stg_out_commit(o, &st), PD_OK, &st);
  size_t n = 0;
  unsigned char *got;
  assert_null(st_read_file(orphan, &n));
  int level = 0;
  const char *msg = st_log_last(&level);
  assert_non_null(msg);
  assert_non_null(strstr(msg, "removed '.m.safetensors.tmp-0a1b2c'"));
  assert_int_equal(level, 6);
  const char *kept[] = {fresh, live, other, alike};
  for (int i = 0; i < 4; i++) {
    assert_non_null(got = st_read_file(kept[i], &n));
    free(got);
  }
  assert_int_equal(hidden_entries(f->root), 4);
  close(lfd);
  free(orphan), free(fresh), free(live), free(other), free(alike);
}

/* A file that appears at the target after create is not replaced. */
static void test_race(void **state) {
  fx *f = *state;
  char *path = st_join(f->root, "b.st");
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_out_create(f->roots, path, false, &o, &st), PD_OK, &st);
  write_all(o, (const unsigned char *)"mine", 4);
  st_write_file(path, "theirs", 6);
  st_assert_code(stg_out_commit(o, &st), PD_ALREADY_EXISTS, &st);
  size_t n = 0;
  unsigned char *got = st_read_file(path, &n);
  assert_int_equal(n, 6);
  assert_memory_equal(got, "theirs", 6);
  free(got);
  assert_int_equal(hidden_entries(f->root), 0);
  free(path);
}

static void test_refusals(void **state) {
  fx *f = *state;
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_out_create(f->roots, "/etc/evil", false, &o, &st),
                 PD_PERMISSION_DENIED, &st);
  assert_non_null(strstr(st.msg, "is not beneath any storage root"));
  st_assert_code(stg_out_create(f->roots, "../x", false, &o, &st),
                 PD_PERMISSION_DENIED, &st);
  st_assert_code(stg_out_create(f->roots, "nodir/x", false, &o, &st),
                 PD_NOT_FOUND, &st);
  st_assert_code(stg_out_create(f->roots, "dir/", false, &o, &st),
                 PD_INVALID_ARGUMENT, &st);
  st_assert_code(stg_out_create(f->roots, "https://h/x", false, &o, &st),
                 PD_UNIMPLEMENTED, &st);
  /* a symlink at the target, even one that points inside, is not replaced */
  char *ln = st_join(f->root, "ln");
  assert_int_equal(symlink("target", ln), 0);
  st_assert_code(stg_out_create(f->roots, ln, true, &o, &st),
                 PD_PERMISSION_DENIED, &st);
  /* a directory symlinked out of the root */
  char *out = st_join(f->root, "out");
  assert_int_equal(symlink(f->top, out), 0);
  st_assert_code(stg_out_create(f->roots, "out/x", false, &o, &st),
                 PD_PERMISSION_DENIED, &st);
  assert_null(o);
  /* a subdirectory inside is fine */
  char *sub = st_join(f->root, "sub");
  assert_int_equal(mkdir(sub, 0755), 0);
  st_assert_code(stg_out_create(f->roots, "sub/x", false, &o, &st), PD_OK, &st);
  st_assert_code(stg_out_commit(o, &st), PD_OK, &st);
  char *x = st_join(sub, "x");
  struct stat s;
  assert_int_equal(stat(x, &s), 0);
  assert_int_equal(s.st_size, 0);
  free(x);
  free(sub);
  free(out);
  free(ln);
}

/* A write past a limit (here RLIMIT_FSIZE: EFBIG, as ENOSPC and EDQUOT)
 * is RESOURCE_EXHAUSTED; commit then refuses and leaves nothing behind. */
static void test_full(void **state) {
  fx *f = *state;
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  lim = old;
  lim.rlim_cur = 4096;
  signal(SIGXFSZ, SIG_IGN);
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_out_create(f->roots, "full.st", false, &o, &st), PD_OK,
                 &st);
  unsigned char *data = st_bytes(10000, 5);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  pd_code rc = stg_out_write(o, data, 10000, &st);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  st_assert_code(rc, PD_RESOURCE_EXHAUSTED, &st);
  assert_non_null(strstr(st.msg, "full.st"));
  st_assert_code(stg_out_write(o, data, 1, &st), PD_FAILED_PRECONDITION, &st);
  st_assert_code(stg_out_commit(o, &st), PD_FAILED_PRECONDITION, &st);
  assert_int_equal(hidden_entries(f->root), 0);
  char *path = st_join(f->root, "full.st");
  size_t n = 0;
  assert_null(st_read_file(path, &n));
  free(path);
  free(data);
  signal(SIGXFSZ, SIG_DFL);
}

/* Where a relative path goes with several roots (storage/README.md, "Where
 * a save goes"): the first root that holds the file, else the first where
 * its directory exists; stg_out_path says the absolute path. An absolute
 * path goes where it says. */
static void test_roots_rule(void **state) {
  fx *f = *state;
  char *dirs[3];
  const char *e[3];
  for (int i = 0; i < 3; i++) {
    char name[8];
    snprintf(name, sizeof name, "r%d", i);
    dirs[i] = st_join(f->top, name);
    assert_int_equal(mkdir(dirs[i], 0755), 0);
    e[i] = dirs[i];
  }
  char *held = st_join(dirs[2], "held.st"), *sub = st_join(dirs[1], "sub");
  st_write_file(held, "old", 3);
  assert_int_equal(mkdir(sub, 0755), 0);
  stg_roots *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_roots_create(e, 3, &r, &st), PD_OK, &st);
  struct {
    const char *path;
    bool overwrite;
    pd_code code;
    int root; /* where it goes, -1: refused */
    const char *rel;
  } cases[] = {
      {"new.st", false, PD_OK, 0, "new.st"},
      {"./new.st", false, PD_OK, 0, "new.st"},
      {"held.st", false, PD_ALREADY_EXISTS, -1, NULL}, /* c's, not a new a/ */
      {"held.st", true, PD_OK, 2, "held.st"},
      {"sub/x.st", false, PD_OK, 1, "sub/x.st"},
      {"nodir/x.st", false, PD_NOT_FOUND, -1, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    stg_out *o = NULL;
    dev_status_clear(&st);
    st_assert_code(
        stg_out_create(r, cases[i].path, cases[i].overwrite, &o, &st),
        cases[i].code, &st);
    if (cases[i].code != PD_OK) {
      assert_null(o);
      continue;
    }
    char *want = st_join(dirs[cases[i].root], cases[i].rel);
    assert_string_equal(stg_out_path(o), want);
    st_assert_code(stg_out_commit(o, &st), PD_OK, &st);
    size_t n = 0;
    unsigned char *back = st_read_file(want, &n);
    assert_non_null(back);
    assert_int_equal(n, 0);
    free(back);
    unlink(want);
    free(want);
  }
  /* An absolute path: under the root it names, whoever else holds it. */
  char *abs = st_join(dirs[1], "held.st");
  stg_out *o = NULL;
  st_assert_code(stg_out_create(r, abs, false, &o, &st), PD_OK, &st);
  assert_string_equal(stg_out_path(o), abs);
  stg_out_abort(o);
  /* A refusal is logged once, without a second "storage: " (the daemon's
   * log adds the subsystem). */
  st_log_capture();
  st_assert_code(stg_out_create(r, "/etc/evil", false, &o, &st),
                 PD_PERMISSION_DENIED, &st);
  int level = 0;
  const char *line = st_log_last(&level);
  assert_non_null(line);
  assert_non_null(strstr(line, "is not beneath any storage root"));
  assert_int_not_equal(strncmp(line, "storage: ", 9), 0);
  st_log_reset();
  stg_roots_destroy(r);
  free(abs);
  free(held);
  free(sub);
  for (int i = 0; i < 3; i++) free(dirs[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_commit, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_abort, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_race, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_refusals, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_full, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_roots_rule, fx_setup, fx_teardown),
      cmocka_unit_test_setup_teardown(test_orphans, fx_setup, fx_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
