/* The HTTP fetcher (storage/fetch_http.c) against tests/storage/
 * http_server.py on loopback: a server that honours Range, one that ignores
 * it (200, whole body), one whose ETag changes between requests, one that
 * fails once then succeeds (retries), one that is down, one too slow (the
 * timeout), one whose Content-Range lies, and a redirect. The bytes read are
 * compared with the file the server serves. Every wait is bounded. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

#include "stgtest.h"
#include "storage_int.h"

#define FILE_N (5 * 4096 + 123)

static char *dir;
static unsigned char *data;
static pid_t server = -1;
static int port;
static stg_roots *roots;

static int start_server(void **state) {
  (void)state;
  const char *src = getenv("PARADEV_STORAGE_TEST_DIR");
  const char *py = getenv("PARADEV_PYTHON3");
  if (!py) py = "/usr/bin/python3";
  if (!src || access(py, X_OK) != 0) return 0; /* each test skips */
  dir = st_mkdtemp();
  data = st_bytes(FILE_N, 42);
  char *p = st_join(dir, "f.bin");
  st_write_file(p, data, FILE_N);
  free(p);
  p = st_join(dir, "empty.bin");
  st_write_file(p, "", 0);
  free(p);
  char script[4096];
  snprintf(script, sizeof script, "%s/http_server.py", src);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  server = fork();
  if (server == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    execl(py, py, script, dir, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char line[64] = "";
  size_t n = 0;
  struct pollfd pf = {fds[0], POLLIN, 0};
  while (n < sizeof line - 1 && !strchr(line, '\n')) {
    if (poll(&pf, 1, 20000) <= 0) break;
    ssize_t k = read(fds[0], line + n, sizeof line - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
    line[n] = '\0';
  }
  close(fds[0]);
  if (sscanf(line, "PORT %d", &port) != 1) {
    print_error("the test server did not start (read '%s')\n", line);
    return -1;
  }
  char root[128];
  snprintf(root, sizeof root, "http://127.0.0.1:%d/", port);
  const char *e[] = {root};
  dev_status st = DEV_STATUS_INIT;
  if (stg_roots_create(e, 1, &roots, &st) != PD_OK) return -1;
  stg__http_set_backoff(0.01);
  st_log_capture();
  return 0;
}

static int stop_server(void **state) {
  (void)state;
  if (server > 0) {
    kill(server, SIGTERM);
    int status;
    for (int i = 0; i < 200 && waitpid(server, &status, WNOHANG) == 0; i++)
      usleep(10000);
    kill(server, SIGKILL);
    waitpid(server, &status, WNOHANG);
  }
  stg_roots_destroy(roots);
  if (dir) st_rmtree(dir);
  free(dir);
  free(data);
  return 0;
}

#define NEED_SERVER()                                                          \
  do {                                                                         \
    if (port == 0) skip();                                                     \
  } while (0)

static char *url_of(const char *mode) {
  static _Thread_local char u[256]; /* readers run it in threads */
  snprintf(u, sizeof u, "http://127.0.0.1:%d/%s/f.bin", port, mode);
  return u;
}

static stg_cache *mk_cache(double timeout_s, int retries) {
  stg_cache_config cfg = {
      STG_CACHE_CONFIG_STRUCT_SIZE, 4096, 1 << 20, 0, timeout_s, retries};
  stg_cache *c = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_cache_create(&cfg, &c, &st), PD_OK, &st);
  return c;
}

static stg_fetch_stats hstats(void) {
  stg_fetch_stats s;
  stg__fetcher_http.stats(&stg__fetcher_http, &s);
  return s;
}

static void read_all(stg_file *f) {
  unsigned char *buf = malloc(FILE_N + 1);
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_file_pread(f, 0, buf + 1, FILE_N, &st), PD_OK, &st);
  assert_memory_equal(buf + 1, data, FILE_N);
  st_assert_code(stg_file_pread(f, 4000, buf, 5000, &st), PD_OK, &st);
  assert_memory_equal(buf, data + 4000, 5000);
  free(buf);
}

static void test_range(void **state) {
  (void)state;
  NEED_SERVER();
  stg_cache *c = mk_cache(10, 2);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  uint64_t req0 = hstats().requests;
  st_assert_code(stg_file_open(c, roots, url_of("range"), &f, &st), PD_OK, &st);
  assert_int_equal(stg_file_size(f), FILE_N);
  assert_string_equal(stg_file_name(f), url_of("range"));
  read_all(f);
  read_all(f); /* all cached now */
  stg_cache_stats s;
  stg_cache_get_stats(c, &s);
  assert_int_equal(s.fetches, 6);
  assert_int_equal(s.bytes_fetched, FILE_N);
  assert_int_equal(hstats().requests - req0, 1 + 6); /* the open and 6 GETs */
  stg_file_close(f);
  /* an empty object: bytes=0-0 is 416, the size 0 */
  char empty[256];
  snprintf(empty, sizeof empty, "http://127.0.0.1:%d/range/empty.bin", port);
  st_assert_code(stg_file_open(c, roots, empty, &f, &st), PD_OK, &st);
  assert_int_equal(stg_file_size(f), 0);
  unsigned char b[1];
  st_assert_code(stg_file_pread(f, 0, b, 0, &st), PD_OK, &st);
  st_assert_code(stg_file_pread(f, 0, b, 1, &st), PD_OUT_OF_RANGE, &st);
  stg_file_close(f);
  stg_cache_destroy(c);
}

typedef struct rd {
  stg_cache *c;
  pd_code rc;
  unsigned char buf[1000];
} rd;

static void *rd_main(void *arg) {
  rd *r = arg;
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  r->rc = stg_file_open(r->c, roots, url_of("range"), &f, &st);
  if (r->rc == PD_OK)
    r->rc = stg_file_pread(f, 8192 + 10, r->buf, sizeof r->buf, &st);
  stg_file_close(f);
  return NULL;
}

/* Eight readers of one block, each with its own open file (and its own
 * thread's curl handle): one GET of the block. */
static void test_eight_readers(void **state) {
  (void)state;
  NEED_SERVER();
  stg_cache *c = mk_cache(10, 2);
  rd rs[8];
  pthread_t th[8];
  for (int i = 0; i < 8; i++) {
    rs[i].c = c;
    pthread_create(&th[i], NULL, rd_main, &rs[i]);
  }
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(rs[i].rc, PD_OK);
    assert_memory_equal(rs[i].buf, data + 8192 + 10, sizeof rs[i].buf);
  }
  stg_cache_stats s;
  stg_cache_get_stats(c, &s);
  assert_int_equal(s.fetches, 1);
  assert_int_equal(s.bytes_fetched, 4096);
  stg_cache_destroy(c);
}

static void test_ignore_range(void **state) {
  (void)state;
  NEED_SERVER();
  stg_cache *c = mk_cache(10, 2);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_log_reset();
  st_assert_code(stg_file_open(c, roots, url_of("ignore"), &f, &st), PD_OK,
                 &st);
  assert_non_null(strstr(st_log_last(NULL), "whole object"));
  assert_int_equal(stg_file_size(f), FILE_N);
  read_all(f);
  stg_file_close(f);
  stg_cache_destroy(c);
  /* and without the cache: the exact slice of the body */
  st_assert_code(stg_file_open(NULL, roots, url_of("ignore"), &f, &st), PD_OK,
                 &st);
  unsigned char b[77];
  st_assert_code(stg_file_pread(f, FILE_N - 77, b, 77, &st), PD_OK, &st);
  assert_memory_equal(b, data + FILE_N - 77, 77);
  stg_file_close(f);
}

static void test_changed(void **state) {
  (void)state;
  NEED_SERVER();
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_file_open(NULL, roots, url_of("change"), &f, &st), PD_OK,
                 &st);
  unsigned char b[100];
  st_assert_code(stg_file_pread(f, 0, b, 100, &st), PD_DATA_LOSS, &st);
  assert_non_null(strstr(st.msg, "changed since it was opened"));
  stg_file_close(f);
}

static void test_retry(void **state) {
  (void)state;
  NEED_SERVER();
  stg_cache *c = mk_cache(10, 3);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  uint64_t r0 = hstats().retries;
  st_assert_code(stg_file_open(c, roots, url_of("flaky"), &f, &st), PD_OK, &st);
  unsigned char b[100];
  st_assert_code(stg_file_pread(f, 10, b, 100, &st), PD_OK, &st);
  assert_memory_equal(b, data + 10, 100);
  assert_int_equal(hstats().retries - r0, 2); /* the open's and the block's */
  assert_non_null(strstr(st_log_last(NULL), "HTTP 500; retry 1 of 3"));
  stg_file_close(f);
  stg_cache_destroy(c);
}

static void test_failures(void **state) {
  (void)state;
  NEED_SERVER();
  stg_cache *c = mk_cache(10, 2);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  char u[320];
  snprintf(u, sizeof u, "%.250s?sig=SECRET", url_of("down"));
  st_assert_code(stg_file_open(c, roots, u, &f, &st), PD_UNAVAILABLE, &st);
  assert_non_null(strstr(st.msg, "HTTP 503"));
  assert_non_null(strstr(st.msg, "(after 3 attempts)"));
  assert_non_null(strstr(st.msg, "/down/f.bin"));
  assert_null(strstr(st.msg, "SECRET"));
  st_assert_code(stg_file_open(c, roots, url_of("redirect"), &f, &st),
                 PD_FAILED_PRECONDITION, &st);
  assert_non_null(strstr(st.msg, "HTTP 302"));
  char missing[256];
  snprintf(missing, sizeof missing, "http://127.0.0.1:%d/range/nope", port);
  st_assert_code(stg_file_open(c, roots, missing, &f, &st), PD_NOT_FOUND, &st);
  assert_non_null(strstr(st.msg, "HTTP 404"));
  st_assert_code(stg_file_open(c, roots, "http://127.0.0.2:1/x", &f, &st),
                 PD_PERMISSION_DENIED, &st);
  /* a Content-Range other than the one asked is never taken as data */
  st_assert_code(stg_file_open(c, roots, url_of("liar"), &f, &st), PD_OK, &st);
  unsigned char b[100];
  st_assert_code(stg_file_pread(f, 4096, b, 100, &st), PD_DATA_LOSS, &st);
  assert_non_null(strstr(st.msg, "Content-Range"));
  stg_file_close(f);
  stg_cache_destroy(c);
}

static void test_timeout(void **state) {
  (void)state;
  NEED_SERVER();
  stg_cache *c = mk_cache(0.3, 1);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_file_open(c, roots, url_of("slow"), &f, &st),
                 PD_DEADLINE_EXCEEDED, &st);
  assert_non_null(strstr(st.msg, "within 0.3 s (after 2 attempts)"));
  stg_cache_destroy(c);
}

/* A deadline cuts each request's timeout and stops the retries: with 30 s
 * per request and 3 retries, a source that answers after 5 s fails
 * DEADLINE_EXCEEDED once the 0.3 s deadline passes (well before the first
 * answer could arrive). */
static void test_deadline(void **state) {
  (void)state;
  NEED_SERVER();
  stg_cache *c = mk_cache(30, 3);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  double t0 = stg_now_s();
  stg_io_ctl ctl = {.deadline_s = t0 + 0.3, .cancel = NULL};
  st_assert_code(stg_file_open_ctl(c, roots, url_of("slow"), &ctl, &f, &st),
                 PD_DEADLINE_EXCEEDED, &st);
  assert_true(stg_now_s() - t0 < 4.5); /* the server sleeps 5 s */
  /* past the deadline already: no request at all */
  uint64_t req = hstats().requests;
  st_assert_code(stg_file_open_ctl(c, roots, url_of("range"), &ctl, &f, &st),
                 PD_DEADLINE_EXCEEDED, &st);
  assert_int_equal(hstats().requests, req);
  /* a deadline far off: the file opens and reads; later reads without one */
  ctl.deadline_s = stg_now_s() + 60;
  st_assert_code(stg_file_open_ctl(c, roots, url_of("range"), &ctl, &f, &st),
                 PD_OK, &st);
  stg_file_set_deadline(f, 0);
  read_all(f);
  stg_file_close(f);
  stg_cache_destroy(c);
}

typedef struct canceller {
  atomic_bool *flag;
  double after_s;
} canceller;

static void *cancel_main(void *arg) {
  canceller *k = arg;
  struct timespec ts = {0, (long)(k->after_s * 1e9)};
  nanosleep(&ts, NULL);
  atomic_store(k->flag, true);
  return NULL;
}

/* The cancel flag aborts a transfer in progress (the server sleeps 5 s
 * before answering) and any later fetch of the file. */
static void test_cancel(void **state) {
  (void)state;
  NEED_SERVER();
  stg_cache *c = mk_cache(30, 3);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  atomic_bool flag;
  atomic_init(&flag, false);
  stg_io_ctl ctl = {.deadline_s = 0, .cancel = &flag};
  canceller k = {&flag, 0.2};
  pthread_t t;
  double t0 = stg_now_s();
  assert_int_equal(pthread_create(&t, NULL, cancel_main, &k), 0);
  st_assert_code(stg_file_open_ctl(c, roots, url_of("slow"), &ctl, &f, &st),
                 PD_CANCELLED, &st);
  assert_true(stg_now_s() - t0 < 4.5); /* the server sleeps 5 s */
  pthread_join(t, NULL);
  /* a file opened before the flag is set: its reads stop once it is */
  atomic_store(&flag, false);
  st_assert_code(stg_file_open_ctl(c, roots, url_of("range"), &ctl, &f, &st),
                 PD_OK, &st);
  atomic_store(&flag, true);
  unsigned char b[100];
  st_assert_code(stg_file_pread(f, 4096, b, 100, &st), PD_CANCELLED, &st);
  stg_file_close(f);
  stg_cache_destroy(c);
}

/* A closed port: connection refused, retried, UNAVAILABLE. */
static void test_unreachable(void **state) {
  (void)state;
  NEED_SERVER();
  const char *e[] = {"http://127.0.0.1:1/"};
  stg_roots *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_roots_create(e, 1, &r, &st), PD_OK, &st);
  stg_cache *c = mk_cache(5, 1);
  stg_file *f = NULL;
  st_assert_code(stg_file_open(c, r, "http://127.0.0.1:1/x", &f, &st),
                 PD_UNAVAILABLE, &st);
  assert_non_null(strstr(st.msg, "127.0.0.1:1/x"));
  stg_cache_destroy(c);
  stg_roots_destroy(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_range),        cmocka_unit_test(test_eight_readers),
      cmocka_unit_test(test_ignore_range), cmocka_unit_test(test_changed),
      cmocka_unit_test(test_retry),        cmocka_unit_test(test_failures),
      cmocka_unit_test(test_timeout),      cmocka_unit_test(test_unreachable),
      cmocka_unit_test(test_deadline),     cmocka_unit_test(test_cancel),
  };
  return cmocka_run_group_tests(tests, start_server, stop_server);
}
