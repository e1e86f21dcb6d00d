/* The block cache (storage/cache.c) over a test fetcher that counts its
 * reads, fails on demand and holds a fetch at a gate until the test opens
 * it (so "8 readers, 1 fetch" is shown without any timing), and over real
 * local files (a rewritten file is read anew). Every wait is bounded. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stgtest.h"
#include "storage_int.h"

/* --- the test fetcher ----------------------------------------------------- */

typedef struct tf {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned char *data;
  size_t size;
  int version;
  int reads;         /* read calls */
  int fail_next;     /* fail this many reads */
  bool gate_shut;    /* reads wait until it opens */
  pd_code fail_code; /* of the injected failures; 0: UNAVAILABLE */
  int at_gate;       /* reads waiting at the gate */
} tf;

static void tf_init(tf *t, size_t size, uint64_t seed) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  t->data = st_bytes(size, seed);
  t->size = size;
}

static void tf_free(tf *t) {
  free(t->data);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
}

static void deadline_in(struct timespec *ts, int s) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += s;
}

static pd_code tf_open(const stg_fetcher *f, const stg_fetch_open_args *a,
                       void **handle, stg_signature *sig, char *identity,
                       size_t cap, dev_status *st) {
  (void)st;
  tf *t = f->ctx;
  pthread_mutex_lock(&t->mu);
  sig->size = t->size;
  snprintf(sig->text, sizeof sig->text, "v%d", t->version);
  pthread_mutex_unlock(&t->mu);
  snprintf(identity, cap, "test:%s", a->name);
  *handle = t;
  return PD_OK;
}

static pd_code tf_read(const stg_fetcher *f, void *handle, uint64_t off,
                       void *buf, size_t len, dev_status *st) {
  (void)f;
  tf *t = handle;
  pthread_mutex_lock(&t->mu);
  t->reads++;
  struct timespec ts;
  deadline_in(&ts, 20);
  t->at_gate++;
  pthread_cond_broadcast(&t->cv);
  while (t->gate_shut)
    if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT)
      break; /* the test failed to open it; fail the read below */
  t->at_gate--;
  bool fail = t->gate_shut || t->fail_next > 0;
  if (t->fail_next > 0) t->fail_next--;
  if (!fail) memcpy(buf, t->data + off, len);
  pthread_mutex_unlock(&t->mu);
  pd_code code = t->fail_code ? t->fail_code : PD_UNAVAILABLE;
  return fail ? dev_error(st, code, "injected failure at %ju", (uintmax_t)off)
              : PD_OK;
}

static void tf_close(const stg_fetcher *f, void *h) { (void)f, (void)h; }
static void tf_stats(const stg_fetcher *f, stg_fetch_stats *o) {
  (void)f;
  memset(o, 0, sizeof *o);
}

static stg_fetcher tf_table(tf *t) {
  stg_fetcher f = {
      STG_FETCHER_STRUCT_SIZE, "test", t, tf_open, tf_read, tf_close, tf_stats};
  return f;
}

/* Waits (bounded) until `n` reads sit at the gate. */
static void tf_wait_at_gate(tf *t, int n) {
  struct timespec ts;
  deadline_in(&ts, 20);
  pthread_mutex_lock(&t->mu);
  while (t->at_gate < n)
    if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) break;
  int got = t->at_gate;
  pthread_mutex_unlock(&t->mu);
  assert_int_equal(got, n);
}

static void tf_gate(tf *t, bool shut) {
  pthread_mutex_lock(&t->mu);
  t->gate_shut = shut;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

static int tf_reads(tf *t) {
  pthread_mutex_lock(&t->mu);
  int n = t->reads;
  pthread_mutex_unlock(&t->mu);
  return n;
}

static stg_cache *mk_cache(uint64_t block, uint64_t budget, double stale) {
  stg_cache_config cfg = {
      STG_CACHE_CONFIG_STRUCT_SIZE, block, budget, stale, 30, 3};
  stg_cache *c = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_cache_create(&cfg, &c, &st), PD_OK, &st);
  return c;
}

static stg_cache_stats stats(stg_cache *c) {
  stg_cache_stats s;
  stg_cache_get_stats(c, &s);
  return s;
}

static void read_check(stg_file *f, tf *t, uint64_t off, size_t len,
                       pd_code want) {
  unsigned char *buf = malloc(len + 1);
  dev_status st = DEV_STATUS_INIT;
  /* an unaligned destination: callers' buffers need not be aligned */
  st_assert_code(stg_file_pread(f, off, buf + 1, len, &st), want, &st);
  if (want == PD_OK) assert_memory_equal(buf + 1, t->data + off, len);
  free(buf);
}

/* --- eight readers, one fetch --------------------------------------------- */

typedef struct reader {
  stg_cache *c;
  const stg_fetcher *fx;
  tf *t;
  uint64_t off;
  size_t len;
  pd_code rc;
  unsigned char buf[4096];
} reader;

static void *reader_main(void *arg) {
  reader *r = arg;
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  r->rc = stg__file_open_with(r->c, r->fx, "one", &f, &st);
  if (r->rc == PD_OK) r->rc = stg_file_pread(f, r->off, r->buf, r->len, &st);
  stg_file_close(f);
  return NULL;
}

static void run_readers(stg_cache *c, const stg_fetcher *fx, tf *t, int n,
                        reader *rs, pthread_t *th) {
  for (int i = 0; i < n; i++) {
    rs[i] = (reader){c, fx, t, (uint64_t)i * 100, 1000, PD_UNKNOWN, {0}};
    assert_int_equal(pthread_create(&th[i], NULL, reader_main, &rs[i]), 0);
  }
}

/* The caller waits until n - 1 readers wait for the one fetch. */
static void wait_waits(stg_cache *c, uint64_t n) {
  for (int i = 0; i < 20000 && stats(c).waits < n; i++) usleep(1000);
  assert_int_equal(stats(c).waits, n);
}

static void test_one_fetch(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 3 * 4096, 1);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 1 << 20, 0);
  tf_gate(&t, true);
  reader rs[8];
  pthread_t th[8];
  run_readers(c, &fx, &t, 8, rs, th);
  tf_wait_at_gate(&t, 1);
  wait_waits(c, 7);
  tf_gate(&t, false);
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(rs[i].rc, PD_OK);
    assert_memory_equal(rs[i].buf, t.data + rs[i].off, rs[i].len);
  }
  stg_cache_stats s = stats(c);
  assert_int_equal(tf_reads(&t), 1);
  assert_int_equal(s.fetches, 1);
  assert_int_equal(s.misses, 1);
  assert_int_equal(s.waits, 7);
  assert_int_equal(s.bytes_fetched, 4096);
  assert_int_equal(s.blocks_cached, 1);
  assert_int_equal(s.bytes_cached, 4096);
  stg_cache_destroy(c);
  tf_free(&t);
}

/* A failed fetch is not cached: its waiters get its error, the next reader
 * fetches again. */
static void test_failed_fetch(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 3 * 4096, 2);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 1 << 20, 0);
  t.fail_next = 1;
  tf_gate(&t, true);
  reader rs[3];
  pthread_t th[3];
  run_readers(c, &fx, &t, 3, rs, th);
  tf_wait_at_gate(&t, 1);
  wait_waits(c, 2);
  tf_gate(&t, false);
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(rs[i].rc, PD_UNAVAILABLE);
  }
  stg_cache_stats s = stats(c);
  assert_int_equal(s.fetch_errors, 1);
  assert_int_equal(s.blocks_cached, 0);
  assert_int_equal(s.bytes_cached, 0);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "one", &f, &st), PD_OK, &st);
  read_check(f, &t, 10, 100, PD_OK);
  assert_int_equal(tf_reads(&t), 2);
  assert_int_equal(stats(c).blocks_cached, 1);
  read_check(f, &t, 20, 100, PD_OK); /* now a hit */
  assert_int_equal(tf_reads(&t), 2);
  stg_file_close(f);
  stg_cache_destroy(c);
  tf_free(&t);
}

/* A fetch cancelled by its own reader (its session ended: stg_io_ctl) is
 * not the error of the readers that waited for it: they fetch the block
 * themselves. */
static void test_cancelled_fetch(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 3 * 4096, 4);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 1 << 20, 0);
  t.fail_next = 1;
  t.fail_code = PD_CANCELLED;
  tf_gate(&t, true);
  reader rs[3];
  pthread_t th[3];
  run_readers(c, &fx, &t, 3, rs, th);
  tf_wait_at_gate(&t, 1);
  wait_waits(c, 2);
  tf_gate(&t, false);
  int cancelled = 0;
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    if (rs[i].rc == PD_CANCELLED) {
      cancelled++;
      continue;
    }
    assert_int_equal(rs[i].rc, PD_OK);
    assert_memory_equal(rs[i].buf, t.data + rs[i].off, rs[i].len);
  }
  assert_int_equal(cancelled, 1); /* the fetching reader alone */
  assert_int_equal(tf_reads(&t), 2);
  assert_int_equal(stats(c).blocks_cached, 1);
  stg_cache_destroy(c);
  tf_free(&t);
}

/* A reader waiting for a fetch that does not end gives up at the bound. */
static void test_bounded_wait(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 4096, 3);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 1 << 20, 0);
  stg__cache_set_wait_bound(c, 0.05);
  tf_gate(&t, true);
  reader r;
  pthread_t th;
  run_readers(c, &fx, &t, 1, &r, &th);
  tf_wait_at_gate(&t, 1);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "one", &f, &st), PD_OK, &st);
  unsigned char b[10];
  st_assert_code(stg_file_pread(f, 0, b, 10, &st), PD_DEADLINE_EXCEEDED, &st);
  assert_non_null(strstr(st.msg, "another reader's fetch of block 0 of 'one'"));
  tf_gate(&t, false);
  pthread_join(th, NULL);
  assert_int_equal(r.rc, PD_OK);
  stg_file_close(f);
  stg_cache_destroy(c);
  tf_free(&t);
}

/* --- LRU and budget ------------------------------------------------------- */

static void test_lru(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 16 * 4096 - 100, 4); /* the last block is short */
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 4 * 4096, 0);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "lru", &f, &st), PD_OK, &st);
  for (int i = 0; i < 16; i++) {
    read_check(f, &t, (uint64_t)i * 4096, i == 15 ? 3996 : 4096, PD_OK);
    stg_cache_stats s = stats(c);
    assert_true(s.bytes_cached <= 4 * 4096);
    assert_int_equal(s.blocks_cached, i < 4 ? i + 1 : 4);
  }
  stg_cache_stats s = stats(c);
  assert_int_equal(s.evictions, 12);
  assert_int_equal(s.bytes_cached, 3 * 4096 + 3996); /* as allocated */
  assert_int_equal(tf_reads(&t), 16);
  /* cached: 12 13 14 15 (15 most recent). 12 again: a hit, now most recent */
  read_check(f, &t, 12 * 4096, 10, PD_OK);
  assert_int_equal(tf_reads(&t), 16);
  read_check(f, &t, 0, 10, PD_OK); /* evicts 13, the least recent */
  assert_int_equal(tf_reads(&t), 17);
  read_check(f, &t, 12 * 4096 + 5, 10, PD_OK);
  read_check(f, &t, 14 * 4096, 10, PD_OK);
  assert_int_equal(tf_reads(&t), 17);
  read_check(f, &t, 13 * 4096, 10, PD_OK);
  assert_int_equal(tf_reads(&t), 18);
  /* a read across two blocks at odd offsets */
  read_check(f, &t, 4000, 5000, PD_OK);
  /* past the end */
  read_check(f, &t, 16 * 4096 - 100 - 5, 6, PD_OUT_OF_RANGE);
  read_check(f, &t, UINT64_MAX, 1, PD_OUT_OF_RANGE);
  read_check(f, &t, 16 * 4096 - 100, 0, PD_OK);
  assert_true(stats(c).bytes_cached <= 4 * 4096);
  stg_file_close(f);
  stg_cache_destroy(c);
  tf_free(&t);
}

static void test_bypass(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 8 * 4096, 5);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 2 * 4096, 0);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "big", &f, &st), PD_OK, &st);
  read_check(f, &t, 100, 3 * 4096, PD_OK); /* larger than the budget */
  stg_cache_stats s = stats(c);
  assert_int_equal(s.bypass_reads, 1);
  assert_int_equal(s.fetches, 1);
  assert_int_equal(s.bytes_fetched, 3 * 4096);
  assert_int_equal(s.blocks_cached, 0);
  stg_file_close(f);
  stg_cache_destroy(c);
  /* cache_bytes 0: every read goes to the fetcher */
  c = mk_cache(4096, 0, 0);
  st_assert_code(stg__file_open_with(c, &fx, "big", &f, &st), PD_OK, &st);
  int before = tf_reads(&t);
  read_check(f, &t, 0, 10, PD_OK);
  read_check(f, &t, 0, 10, PD_OK);
  assert_int_equal(tf_reads(&t), before + 2);
  assert_int_equal(stats(c).bypass_reads, 2);
  assert_int_equal(stats(c).bytes_cached, 0);
  stg_file_close(f);
  stg_cache_destroy(c);
  /* no cache at all */
  st_assert_code(stg__file_open_with(NULL, &fx, "big", &f, &st), PD_OK, &st);
  read_check(f, &t, 7, 9000, PD_OK);
  stg_file_close(f);
  tf_free(&t);
}

static void test_staleness(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 2 * 4096, 6);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 1 << 20, 0.02);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "s", &f, &st), PD_OK, &st);
  read_check(f, &t, 0, 8192, PD_OK);
  assert_int_equal(tf_reads(&t), 2);
  usleep(100 * 1000); /* older than 0.02 s, whatever the machine's speed */
  read_check(f, &t, 0, 10, PD_OK);
  assert_int_equal(tf_reads(&t), 3);
  stg_cache_stats s = stats(c);
  assert_int_equal(s.evictions, 2); /* both blocks of the file dropped */
  assert_int_equal(s.blocks_cached, 1);
  stg_file_close(f);
  stg_cache_destroy(c);
  /* a long bound: blocks are served from the cache */
  c = mk_cache(4096, 1 << 20, 3600);
  st_assert_code(stg__file_open_with(c, &fx, "s", &f, &st), PD_OK, &st);
  read_check(f, &t, 0, 10, PD_OK);
  read_check(f, &t, 0, 10, PD_OK);
  assert_int_equal(tf_reads(&t), 4);
  stg_file_close(f);
  stg_cache_destroy(c);
  tf_free(&t);
}

/* A new signature on open drops the old version's blocks. */
static void test_new_version(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 2 * 4096, 7);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 1 << 20, 0);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "v", &f, &st), PD_OK, &st);
  read_check(f, &t, 0, 8192, PD_OK);
  stg_file_close(f);
  pthread_mutex_lock(&t.mu);
  free(t.data);
  t.data = st_bytes(2 * 4096, 77);
  t.version++;
  pthread_mutex_unlock(&t.mu);
  st_assert_code(stg__file_open_with(c, &fx, "v", &f, &st), PD_OK, &st);
  assert_int_equal(stats(c).blocks_cached, 0);
  read_check(f, &t, 0, 8192, PD_OK);
  assert_int_equal(tf_reads(&t), 4);
  stg_file_close(f);
  stg_cache_destroy(c);
  tf_free(&t);
}

/* Local files: a rewritten file is read anew; a reader holding the old
 * version gets DATA_LOSS instead of mixed bytes. */
static void test_local_rewrite(void **state) {
  (void)state;
  char *dir = st_mkdtemp();
  char *path = st_join(dir, "w.bin");
  unsigned char *a = st_bytes(10000, 8), *b = st_bytes(12000, 9);
  st_write_file(path, a, 10000);
  const char *e[] = {dir};
  stg_roots *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_roots_create(e, 1, &r, &st), PD_OK, &st);
  stg_cache *c = mk_cache(4096, 1 << 20, 0);
  stg_file *f = NULL, *g = NULL;
  st_assert_code(stg_file_open(c, r, "w.bin", &f, &st), PD_OK, &st);
  unsigned char buf[12000];
  st_assert_code(stg_file_pread(f, 0, buf, 4096, &st), PD_OK, &st);
  assert_memory_equal(buf, a, 4096);
  st_write_file(path, b, 12000); /* in place: same inode, new size, mtime */
  st_assert_code(stg_file_pread(f, 5000, buf, 100, &st), PD_DATA_LOSS, &st);
  assert_non_null(strstr(st.msg, "modified since it was opened"));
  st_assert_code(stg_file_open(c, r, "w.bin", &g, &st), PD_OK, &st);
  assert_int_equal(stg_file_size(g), 12000);
  st_assert_code(stg_file_pread(g, 0, buf, 12000, &st), PD_OK, &st);
  assert_memory_equal(buf, b, 12000);
  stg_fetch_stats ls;
  stg__fetcher_local.stats(&stg__fetcher_local, &ls);
  assert_true(ls.bytes_read >= 4096 + 12000);
  stg_file_close(f);
  stg_file_close(g);
  stg_cache_destroy(c);
  stg_roots_destroy(r);
  st_rmtree(dir);
  free(a), free(b), free(path), free(dir);
}

/* A file rewritten in place with the same size and its mtime restored
 * (os.utime) is still a new version: ctime, which utime cannot set back, is
 * in the signature: the cache serves the new bytes, not its blocks of the
 * old ones. */
static void test_local_rewrite_same_mtime(void **state) {
  (void)state;
  char *dir = st_mkdtemp();
  char *path = st_join(dir, "m.bin");
  unsigned char *a = st_bytes(10000, 21), *b = st_bytes(10000, 22);
  st_write_file(path, a, 10000);
  struct stat before;
  assert_int_equal(stat(path, &before), 0);
  const char *e[] = {dir};
  stg_roots *r = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_roots_create(e, 1, &r, &st), PD_OK, &st);
  stg_cache *c = mk_cache(4096, 1 << 20, 0);
  stg_file *f = NULL, *g = NULL;
  unsigned char buf[10000];
  st_assert_code(stg_file_open(c, r, "m.bin", &f, &st), PD_OK, &st);
  st_assert_code(stg_file_pread(f, 0, buf, 10000, &st), PD_OK, &st);
  assert_memory_equal(buf, a, 10000);
  /* ctime has nanoseconds on the test file systems, but make sure it moves */
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  st_write_file(path, b, 10000); /* same inode, same size */
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
  struct stat after;
  assert_int_equal(stat(path, &after), 0);
  assert_int_equal(after.st_ino, before.st_ino);
  assert_int_equal(after.st_size, before.st_size);
  assert_int_equal(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
  assert_int_equal(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  stg_file_close(f);
  st_assert_code(stg_file_open(c, r, "m.bin", &g, &st), PD_OK, &st);
  st_assert_code(stg_file_pread(g, 0, buf, 10000, &st), PD_OK, &st);
  assert_memory_equal(buf, b, 10000);
  stg_file_close(g);
  stg_cache_destroy(c);
  stg_roots_destroy(r);
  st_rmtree(dir);
  free(a), free(b), free(path), free(dir);
}

/* Many readers, random ranges, a small cache: every byte right, the budget
 * kept. */
typedef struct rnd {
  stg_file *f;
  tf *t;
  unsigned seed;
  int bad;
} rnd;

static void *rnd_main(void *arg) {
  rnd *r = arg;
  unsigned char buf[10000];
  for (int i = 0; i < 300; i++) {
    uint64_t off = (uint64_t)rand_r(&r->seed) % (r->t->size - 1);
    size_t len = 1 + (size_t)rand_r(&r->seed) % 9999;
    if (len > r->t->size - off) len = r->t->size - off;
    dev_status st = DEV_STATUS_INIT;
    if (stg_file_pread(r->f, off, buf, len, &st) != PD_OK ||
        memcmp(buf, r->t->data + off, len) != 0)
      r->bad++;
  }
  return NULL;
}

static void test_stress(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 64 * 1024 + 17, 10);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(1024, 8 * 1024, 0);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "r", &f, &st), PD_OK, &st);
  rnd rs[8];
  pthread_t th[8];
  for (int i = 0; i < 8; i++) {
    rs[i] = (rnd){f, &t, (unsigned)i + 1, 0};
    pthread_create(&th[i], NULL, rnd_main, &rs[i]);
  }
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(rs[i].bad, 0);
  }
  stg_cache_stats s = stats(c);
  assert_true(s.bytes_cached <= 8 * 1024);
  assert_int_equal(s.fetch_errors, 0);
  stg_file_close(f);
  stg_cache_destroy(c);
  tf_free(&t);
}

/* Blocks of 1 MiB and more are mapped, not malloc'd: the same contract. */
static void test_big_blocks(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 3 * (1 << 20) + 5000, 11);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(1 << 20, 2 << 20, 0);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "big", &f, &st), PD_OK, &st);
  for (int rep = 0; rep < 2; rep++)
    for (uint64_t off = 0; off < t.size; off += 300000)
      read_check(f, &t, off, off + 300000 < t.size ? 300000 : t.size - off,
                 PD_OK);
  stg_cache_stats s = stats(c);
  assert_true(s.bytes_cached <= 2 << 20);
  assert_int_equal(s.blocks_cached, 2);
  assert_int_equal(s.bytes_cached, (1 << 20) + 5000); /* blocks 2 and 3 */
  t.fail_next = 1; /* a failed fetch of a mapped block */
  read_check(f, &t, 0, 10, PD_UNAVAILABLE);
  read_check(f, &t, 0, 10, PD_OK);
  stg_file_close(f);
  stg_cache_destroy(c);
  tf_free(&t);
}

/* --- spans (stg_file_read_spans) ------------------------------------------ */

typedef struct spans {
  unsigned char *buf;
  uint64_t next; /* the `done` the next span must have */
  int calls, fail_at;
} spans;

static pd_code span_take(void *arg, uint64_t done, const void *data, size_t len,
                         dev_status *st) {
  spans *sp = arg;
  assert_int_equal(done, sp->next); /* in order, no gap, no overlap */
  assert_true(len > 0);
  if (++sp->calls == sp->fail_at)
    return dev_error(st, PD_ABORTED, "the span function refused span %d",
                     sp->calls);
  memcpy(sp->buf + done, data, len);
  sp->next = done + len;
  return PD_OK;
}

/* Reads [off, off + len) by spans; checks the bytes against the fetcher's. */
static int spans_check(stg_file *f, tf *t, uint64_t off, size_t len) {
  spans sp = {malloc(len ? len : 1), 0, 0, 0};
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_file_read_spans(f, off, len, span_take, &sp, &st), PD_OK,
                 &st);
  assert_int_equal(sp.next, len);
  assert_memory_equal(sp.buf, t->data + off, len);
  free(sp.buf);
  return sp.calls;
}

static void test_spans(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 5 * 4096 + 100, 13);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(4096, 1 << 20, 0);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg__file_open_with(c, &fx, "s", &f, &st), PD_OK, &st);
  /* [1000, 13788) touches blocks 0 to 3: one span each, one fetch each */
  assert_int_equal(spans_check(f, &t, 1000, 3 * 4096 + 500), 4);
  assert_int_equal(tf_reads(&t), 4);
  assert_int_equal(spans_check(f, &t, 1000, 3 * 4096 + 500), 4);
  assert_int_equal(tf_reads(&t), 4);                      /* hits */
  assert_int_equal(spans_check(f, &t, 5 * 4096, 100), 1); /* the last block */
  assert_int_equal(spans_check(f, &t, 0, 0), 0);
  /* the function's error stops the read and is its result */
  unsigned char buf[3 * 4096];
  spans sp = {buf, 0, 0, 2};
  st_assert_code(stg_file_read_spans(f, 0, sizeof buf, span_take, &sp, &st),
                 PD_ABORTED, &st);
  assert_int_equal(sp.calls, 2);
  /* past the end: OUT_OF_RANGE, no span */
  sp = (spans){buf, 0, 0, 0};
  st_assert_code(stg_file_read_spans(f, 5 * 4096, 200, span_take, &sp, &st),
                 PD_OUT_OF_RANGE, &st);
  assert_int_equal(sp.calls, 0);
  /* a fetch error is the read's */
  stg_file_close(f);
  stg_cache_destroy(c);
  c = mk_cache(4096, 1 << 20, 0);
  st_assert_code(stg__file_open_with(c, &fx, "s", &f, &st), PD_OK, &st);
  t.fail_next = 1;
  sp = (spans){buf, 0, 0, 0};
  st_assert_code(stg_file_read_spans(f, 0, 10, span_take, &sp, &st),
                 PD_UNAVAILABLE, &st);
  assert_int_equal(sp.calls, 0);
  stg_file_close(f);
  stg_cache_destroy(c);
  /* larger than the budget: bypassed, in pieces of at most one block */
  c = mk_cache(4096, 2 * 4096, 0);
  st_assert_code(stg__file_open_with(c, &fx, "s", &f, &st), PD_OK, &st);
  assert_int_equal(spans_check(f, &t, 7, 3 * 4096), 3);
  assert_int_equal(stats(c).bypass_reads, 3);
  assert_int_equal(stats(c).blocks_cached, 0);
  stg_file_close(f);
  stg_cache_destroy(c);
  /* no cache */
  st_assert_code(stg__file_open_with(NULL, &fx, "s", &f, &st), PD_OK, &st);
  assert_true(spans_check(f, &t, 3, 5 * 4096) >= 1);
  stg_file_close(f);
  tf_free(&t);
}

/* Mapped blocks of a replaced version are reused for the new one (the
 * pool): the new bytes are read, never the old, and the budget holds. */
static void test_reused_blocks(void **state) {
  (void)state;
  tf t;
  tf_init(&t, 3 * (1 << 20), 17);
  stg_fetcher fx = tf_table(&t);
  stg_cache *c = mk_cache(1 << 20, 2 << 20, 0);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  for (int v = 0; v < 3; v++) {
    st_assert_code(stg__file_open_with(c, &fx, "r", &f, &st), PD_OK, &st);
    read_check(f, &t, 0, t.size, PD_OK); /* larger than the budget: bypass */
    for (uint64_t off = 0; off < t.size; off += 400000)
      read_check(f, &t, off, off + 400000 < t.size ? 400000 : t.size - off,
                 PD_OK);
    assert_int_equal(spans_check(f, &t, 1000, 2 << 20), 3);
    stg_cache_stats s = stats(c);
    assert_true(s.bytes_cached <= 2 << 20);
    stg_file_close(f);
    pthread_mutex_lock(&t.mu);
    free(t.data);
    t.data = st_bytes(t.size, 18 + (uint64_t)v);
    t.version++;
    pthread_mutex_unlock(&t.mu);
  }
  stg_cache_destroy(c);
  tf_free(&t);
}

static void test_config(void **state) {
  (void)state;
  stg_cache *c = NULL;
  dev_status st = DEV_STATUS_INIT;
  st_assert_code(stg_cache_create(NULL, &c, &st), PD_OK, &st);
  stg_cache_config k;
  stg__cache_config_get(c, &k);
  assert_int_equal(k.block_size, 16u << 20);
  assert_int_equal(k.cache_bytes, 1u << 30);
  assert_int_equal(k.fetch_retries, 3);
  stg_cache_destroy(c);
  stg_cache_config bad = {STG_CACHE_CONFIG_STRUCT_SIZE, 0, 1, 0, 30, 3};
  st_assert_code(stg_cache_create(&bad, &c, &st), PD_INVALID_ARGUMENT, &st);
  stg_cache_config small = {STG_CACHE_CONFIG_STRUCT_SIZE, 4096, 4095, 0, 30, 3};
  st_assert_code(stg_cache_create(&small, &c, &st), PD_INVALID_ARGUMENT, &st);
  assert_non_null(strstr(st.msg, "smaller than one block"));
  bad.struct_size = 3;
  st_assert_code(stg_cache_create(&bad, &c, &st), PD_INVALID_ARGUMENT, &st);
  stg_cache_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_fetch),
      cmocka_unit_test(test_failed_fetch),
      cmocka_unit_test(test_bounded_wait),
      cmocka_unit_test(test_lru),
      cmocka_unit_test(test_bypass),
      cmocka_unit_test(test_staleness),
      cmocka_unit_test(test_new_version),
      cmocka_unit_test(test_local_rewrite),
      cmocka_unit_test(test_stress),
      cmocka_unit_test(test_big_blocks),
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_spans),
      cmocka_unit_test(test_reused_blocks),
      cmocka_unit_test(test_local_rewrite_same_mtime),
      cmocka_unit_test(test_cancelled_fetch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
