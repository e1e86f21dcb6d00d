#include "stgtest.h"

#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *st_mkdtemp(void) {
  const char *t = getenv("TMPDIR");
  char *d = st_join(t && *t ? t : "/tmp", "paradev-stg-XXXXXX");
  assert_non_null(mkdtemp(d));
  return d;
}

static int st_rm1(const char *p, const struct stat *s, int flag,
                  struct FTW *f) {
  (void)s, (void)flag, (void)f;
  return remove(p);
}

void st_rmtree(const char *dir) {
  if (dir) nftw(dir, st_rm1, 16, FTW_DEPTH | FTW_PHYS);
}

char *st_join(const char *dir, const char *name) {
  char *p = malloc(strlen(dir) + strlen(name) + 2);
  assert_non_null(p);
  sprintf(p, "%s/%s", dir, name);
  return p;
}

void st_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

unsigned char *st_bytes(size_t n, uint64_t seed) {
  unsigned char *b = malloc(n ? n : 1);
  assert_non_null(b);
  uint64_t x = seed * 2654435761u + 88172645463325252ull;
  for (size_t i = 0; i < n; i++) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    b[i] = (unsigned char)((x * 2685821657736338717ull) >> 56);
  }
  return b;
}

unsigned char *st_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

static pthread_mutex_t st_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char st_log_line[1024];
static int st_log_level;

static void st_log_fn(int level, const char *msg) {
  pthread_mutex_lock(&st_log_mu);
  snprintf(st_log_line, sizeof st_log_line, "%s", msg);
  st_log_level = level;
  pthread_mutex_unlock(&st_log_mu);
}

void st_log_capture(void) { stg_set_log(st_log_fn); }

const char *st_log_last(int *level) {
  static char copy[1024];
  pthread_mutex_lock(&st_log_mu);
  memcpy(copy, st_log_line, sizeof copy);
  if (level) *level = st_log_level;
  pthread_mutex_unlock(&st_log_mu);
  return copy;
}

void st_log_reset(void) {
  pthread_mutex_lock(&st_log_mu);
  st_log_line[0] = '\0';
  st_log_level = 0;
  pthread_mutex_unlock(&st_log_mu);
}
