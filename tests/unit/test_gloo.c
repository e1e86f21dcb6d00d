/* The Gloo transport of collectives across ranks (device/mesh/gloo.cc,
 * dev_gloo.h; issue #16), without an engine or a daemon:
 *  - two processes (fork), each a rank with its own transport, rendezvous
 *    through a file-backed key-value store: all_reduce across them, then a
 *    stalled peer (DEADLINE_EXCEEDED after the 3 s timeout) and a peer that
 *    exited (UNAVAILABLE or DEADLINE_EXCEEDED), both bounded;
 *  - four threads of one process as participants 0..3 of set [0, 1, 2, 3]
 *    over an in-memory store: all_reduce of every dtype and reduction
 *    against hand-computed values, a large float32 sum, broadcast from root
 *    2, all_gather of unequal sizes, and a second set [2, 0] whose groups
 *    are cached and reused beside the first's;
 *  - a participant whose peer never joins (DEADLINE_EXCEEDED), and
 *    transport creation's argument errors.
 * Skipped when the build has no Gloo (dev_gloo_available). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dev_backend.h"
#include "dev_gloo.h"
#include "dev_mesh.h"
#include "testutil.h"

#define NPART 4

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- An in-memory key-value store: a list under a mutex and a condvar ------ */

typedef struct kv_entry {
  char *key;
  void *value;
  size_t len;
  struct kv_entry *next;
} kv_entry;

typedef struct mem_kv {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  kv_entry *head;
} mem_kv;

static kv_entry *mem_find(mem_kv *m, const char *key) {
  for (kv_entry *e = m->head; e; e = e->next)
    if (strcmp(e->key, key) == 0) return e;
  return NULL;
}

static pd_code mem_set(void *arg, const char *key, const void *value,
                       size_t len, dev_status *st) {
  mem_kv *m = arg;
  pthread_mutex_lock(&m->mu);
  kv_entry *e = mem_find(m, key);
  if (!e) {
    e = calloc(1, sizeof *e);
    e->key = strdup(key);
    e->next = m->head;
    m->head = e;
  }
  free(e->value);
  e->value = malloc(len ? len : 1);
  memcpy(e->value, value, len);
  e->len = len;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  return PD_OK;
}

static pd_code mem_get(void *arg, const char *key, double timeout_s,
                       void **value, size_t *len, dev_status *st) {
  mem_kv *m = arg;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  double t = (double)dl.tv_sec + (double)dl.tv_nsec * 1e-9 + timeout_s;
  dl.tv_sec = (time_t)t;
  dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
  pthread_mutex_lock(&m->mu);
  kv_entry *e;
  while (!(e = mem_find(m, key))) {
    if (pthread_cond_timedwait(&m->cv, &m->mu, &dl) == ETIMEDOUT &&
        !(e = mem_find(m, key)))
      break;
  }
  if (!e) {
    pthread_mutex_unlock(&m->mu);
    return dev_error(st, PD_NOT_FOUND, "key '%s' not set within %g s", key,
                     timeout_s);
  }
  *value = malloc(e->len ? e->len : 1);
  memcpy(*value, e->value, e->len);
  *len = e->len;
  pthread_mutex_unlock(&m->mu);
  return PD_OK;
}

static void mem_init(mem_kv *m) {
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  m->head = NULL;
}

static void mem_free(mem_kv *m) {
  while (m->head) {
    kv_entry *e = m->head;
    m->head = e->next;
    free(e->key);
    free(e->value);
    free(e);
  }
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
}

/* --- A file-backed key-value store: one file per key in a directory ------- */

static void file_path(const char *dir, const char *key, char *out, size_t cap) {
  int n = snprintf(out, cap, "%s/", dir);
  for (const char *k = key; *k && n + 2 < (int)cap; k++)
    out[n++] = *k == '/' ? '!' : *k;
  out[n] = 0;
}

static pd_code file_set(void *arg, const char *key, const void *value,
                        size_t len, dev_status *st) {
  const char *dir = arg;
  char path[512], tmp[600];
  file_path(dir, key, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return dev_error(st, PD_UNAVAILABLE, "cannot write %s: %s", tmp,
                     strerror(errno));
  size_t w = fwrite(value, 1, len, f);
  if (fclose(f) != 0 || w != len)
    return dev_error(st, PD_UNAVAILABLE, "short write to %s", tmp);
  if (rename(tmp, path) != 0)
    return dev_error(st, PD_UNAVAILABLE, "rename %s: %s", tmp, strerror(errno));
  return PD_OK;
}

static pd_code file_get(void *arg, const char *key, double timeout_s,
                        void **value, size_t *len, dev_status *st) {
  const char *dir = arg;
  char path[512];
  file_path(dir, key, path, sizeof path);
  double deadline = now_s() + timeout_s;
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      fseek(f, 0, SEEK_END);
      long n = ftell(f);
      fseek(f, 0, SEEK_SET);
      void *buf = malloc(n > 0 ? (size_t)n : 1);
      size_t r = fread(buf, 1, (size_t)n, f);
      fclose(f);
      if (r != (size_t)n) {
        free(buf);
        return dev_error(st, PD_UNAVAILABLE, "short read of %s", path);
      }
      *value = buf;
      *len = (size_t)n;
      return PD_OK;
    }
    if (now_s() >= deadline)
      return dev_error(st, PD_NOT_FOUND, "key '%s' not set within %g s", key,
                       timeout_s);
    usleep(2000);
  }
}

/* --- Values and references ------------------------------------------------- */

/* Participant i's element j for dtype dt: small integers, so float16 and
 * bfloat16 hold them, every partial product too (at most 6*7*8*9). */
static double value_of(pd_dtype dt, int i, int j) {
  if (dt == PD_BOOL) return j == 5 ? 0 : (i != j);
  double v = i + 1 + j;
  if (dt != PD_UINT8 && (j & 1)) v = -v;
  return v;
}

static double reference(pd_dtype dt, int red, int n, int j) {
  double r = value_of(dt, 0, j);
  for (int i = 1; i < n; i++) {
    double v = value_of(dt, i, j);
    if (dt == PD_BOOL)
      r = (red == DEV_RED_SUM || red == DEV_RED_MAX) ? (r || v) : (r && v);
    else if (red == DEV_RED_SUM)
      r += v;
    else if (red == DEV_RED_PROD)
      r *= v;
    else if (red == DEV_RED_MAX)
      r = v > r ? v : r;
    else
      r = v < r ? v : r;
  }
  if (dt == PD_UINT8) r = fmod(r, 256.0); /* uint8 wraps (the products) */
  return r;
}

static const pd_dtype k_dtypes[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                                    PD_BFLOAT16, PD_INT32,   PD_INT64,
                                    PD_UINT8,    PD_BOOL};
static const int k_reds[] = {DEV_RED_SUM, DEV_RED_PROD, DEV_RED_MAX,
                             DEV_RED_MIN};
#define NELEM 6

/* --- Four participants in one process -------------------------------------- */

typedef struct part {
  dev_mesh_transport *t;
  int device;
  char fail[DEV_STATUS_MSG_MAX + 128]; /* first failure; empty when none */
  int checks;                          /* values compared */
} part;

#define PFAIL(p, ...)                                                          \
  do {                                                                         \
    if (!(p)->fail[0]) snprintf((p)->fail, sizeof(p)->fail, __VA_ARGS__);      \
  } while (0)

static void *participant(void *arg) {
  part *p = arg;
  dev_mesh_transport *t = p->t;
  dev_status st = DEV_STATUS_INIT;
  dev_devset all = {NPART, {0, 1, 2, 3}};
  dev_devset pair = {2, {2, 0}};
  int me = p->device; /* index in `all` */
  void *g = NULL, *g_again = NULL;
  if (t->group_get(t, &all, me, &g, &st) != PD_OK) {
    PFAIL(p, "group_get: %s", st.msg);
    return NULL;
  }
  /* Every dtype and reduction. */
  for (size_t d = 0; d < sizeof k_dtypes / sizeof k_dtypes[0]; d++)
    for (size_t r = 0; r < 4; r++) {
      pd_dtype dt = k_dtypes[d];
      uint8_t buf[NELEM * 8];
      for (int j = 0; j < NELEM; j++)
        dev_store_f64(dt, buf, j, value_of(dt, me, j));
      if (t->all_reduce(t, g, buf, NELEM, dt, k_reds[r], &st) != PD_OK) {
        PFAIL(p, "all_reduce dtype %d red %d: %s", (int)dt, k_reds[r], st.msg);
        return NULL;
      }
      for (int j = 0; j < NELEM; j++) {
        double got = dev_load_f64(dt, buf, j);
        double want = reference(dt, k_reds[r], NPART, j);
        p->checks++;
        if (got != want)
          PFAIL(p, "all_reduce dtype %d red %d element %d: got %g, want %g",
                (int)dt, k_reds[r], j, got, want);
      }
    }
  /* NaN propagates through max and min (float32, float64, float16), as
   * in the engine's own collectives: participant 2 holds NaN at element 0;
   * element 1 holds 10 * (participant + 1) everywhere. So max is NaN, 40
   * and min NaN, 10, whichever participant's value a comparison meets
   * first (trial finding B9: std::max kept 0 or a neighbour's value). */
  {
    const pd_dtype fdt[] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16, PD_BFLOAT16};
    for (size_t d = 0; d < 4; d++)
      for (int mx = 0; mx < 2; mx++) {
        uint8_t nb[2 * 8];
        dev_store_f64(fdt[d], nb, 0, me == 2 ? NAN : (double)me);
        dev_store_f64(fdt[d], nb, 1, 10.0 * (me + 1));
        int red = mx ? DEV_RED_MAX : DEV_RED_MIN;
        if (t->all_reduce(t, g, nb, 2, fdt[d], red, &st) != PD_OK) {
          PFAIL(p, "NaN all_reduce dtype %d: %s", (int)fdt[d], st.msg);
          break;
        }
        double e0 = dev_load_f64(fdt[d], nb, 0), e1 = dev_load_f64(fdt[d], nb, 1);
        p->checks += 2;
        if (!isnan(e0) || e1 != (mx ? 40.0 : 10.0))
          PFAIL(p, "NaN %s dtype %d: got %g, %g; want nan, %g",
                mx ? "max" : "min", (int)fdt[d], e0, e1, mx ? 40.0 : 10.0);
      }
  }
  /* A large float32 sum: many of Gloo's segments. */
  size_t big = 300001;
  float *fb = malloc(big * sizeof *fb);
  for (size_t j = 0; j < big; j++) fb[j] = (float)((j % 1000) * (me + 1));
  if (t->all_reduce(t, g, fb, big, PD_FLOAT32, DEV_RED_SUM, &st) != PD_OK)
    PFAIL(p, "large all_reduce: %s", st.msg);
  for (size_t j = 0; j < big; j++) {
    p->checks++;
    if (fb[j] != (float)((j % 1000) * 10)) { /* 1+2+3+4 */
      PFAIL(p, "large all_reduce element %zu: got %g, want %g", j, fb[j],
            (double)((j % 1000) * 10));
      break;
    }
  }
  free(fb);
  /* Broadcast from participant 2. */
  uint8_t bc[1000];
  for (int j = 0; j < 1000; j++) bc[j] = me == 2 ? (uint8_t)(j * 7 + 3) : 0;
  if (t->broadcast(t, g, bc, sizeof bc, 2, &st) != PD_OK)
    PFAIL(p, "broadcast: %s", st.msg);
  for (int j = 0; j < 1000; j++) {
    p->checks++;
    if (bc[j] != (uint8_t)(j * 7 + 3)) {
      PFAIL(p, "broadcast byte %d: got %d, want %d", j, bc[j],
            (uint8_t)(j * 7 + 3));
      break;
    }
  }
  /* All-gather of unequal sizes (one empty): participant i sends
   * sizes[i] bytes of value 10*i + k. */
  size_t sizes[NPART] = {3, 0, 5, 1};
  uint8_t in[8], out[9];
  for (size_t k = 0; k < sizes[me]; k++) in[k] = (uint8_t)(10 * me + k);
  memset(out, 0xee, sizeof out);
  if (t->all_gather(t, g, in, sizes, out, &st) != PD_OK)
    PFAIL(p, "all_gather: %s", st.msg);
  const uint8_t want_ag[9] = {0, 1, 2, 20, 21, 22, 23, 24, 30};
  for (int k = 0; k < 9; k++) {
    p->checks++;
    if (out[k] != want_ag[k])
      PFAIL(p, "all_gather byte %d: got %d, want %d", k, out[k], want_ag[k]);
  }
  /* A second set, [2, 0], beside the first; both cached. */
  if (me == 0 || me == 2) {
    int idx = me == 2 ? 0 : 1;
    void *h = NULL, *h_again = NULL;
    if (t->group_get(t, &pair, idx, &h, &st) != PD_OK) {
      PFAIL(p, "group_get [2, 0]: %s", st.msg);
      return NULL;
    }
    if (t->group_get(t, &pair, idx, &h_again, &st) != PD_OK || h_again != h)
      PFAIL(p, "group_get [2, 0] again: another group (%p, %p)", h, h_again);
    if (h == g) PFAIL(p, "sets [0, 1, 2, 3] and [2, 0] share a group");
    int64_t v = idx == 0 ? 40 : 2;
    if (t->all_reduce(t, h, &v, 1, PD_INT64, DEV_RED_SUM, &st) != PD_OK)
      PFAIL(p, "all_reduce on [2, 0]: %s", st.msg);
    p->checks++;
    if (v != 42)
      PFAIL(p, "all_reduce on [2, 0]: got %lld, want 42", (long long)v);
  }
  if (t->group_get(t, &all, me, &g_again, &st) != PD_OK || g_again != g)
    PFAIL(p, "group_get [0, 1, 2, 3] again: another group");
  double m = me;
  if (t->all_reduce(t, g_again, &m, 1, PD_FLOAT64, DEV_RED_MAX, &st) != PD_OK)
    PFAIL(p, "reused all_reduce: %s", st.msg);
  p->checks++;
  if (m != 3.0) PFAIL(p, "reused all_reduce: got %g, want 3", m);
  return NULL;
}

static void test_threads_one_process(void **state) {
  if (!dev_gloo_available()) skip();
  mem_kv kv;
  mem_init(&kv);
  dev_mesh_kv mk = {&kv, mem_set, mem_get};
  dev_mesh_transport *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      dev_gloo_transport_create(&mk, "epoch/1/", "127.0.0.1", 20.0, &t, &st),
      PD_OK);
  assert_non_null(t);
  assert_int_equal(t->struct_size, DEV_MESH_TRANSPORT_STRUCT_SIZE);
  part parts[NPART];
  pthread_t th[NPART];
  for (int i = 0; i < NPART; i++) {
    memset(&parts[i], 0, sizeof parts[i]);
    parts[i].t = t;
    parts[i].device = i;
    assert_int_equal(pthread_create(&th[i], NULL, participant, &parts[i]), 0);
  }
  for (int i = 0; i < NPART; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < NPART; i++) {
    if (parts[i].fail[0]) fail_msg("participant %d: %s", i, parts[i].fail);
    /* 8 dtypes x 4 reductions x 6 + 4 floating dtypes x max, min x 2 (NaN)
     * + 300001 + 1000 + 9 + 1 (+ 1 on [2, 0]) */
    assert_int_equal(parts[i].checks, 8 * 4 * NELEM + 4 * 2 * 2 + 300001 +
                                          1000 + 9 + 1 + (i == 0 || i == 2));
  }
  /* The keys live under the prefix and the set. */
  pthread_mutex_lock(&kv.mu);
  int under = 0, total = 0;
  for (kv_entry *e = kv.head; e; e = e->next, total++)
    under += strncmp(e->key, "epoch/1/set/0,1,2,3", 19) == 0 ||
             strncmp(e->key, "epoch/1/set/2,0", 15) == 0;
  pthread_mutex_unlock(&kv.mu);
  assert_true(total > 0);
  assert_int_equal(under, total);
  t->retain(t);
  t->release(t);
  t->release(t); /* the last: frees the groups */
  mem_free(&kv);
}

/* --- A peer that never joins; argument errors ------------------------------ */

static void test_rendezvous_timeout_and_arguments(void **state) {
  if (!dev_gloo_available()) skip();
  mem_kv kv;
  mem_init(&kv);
  dev_mesh_kv mk = {&kv, mem_set, mem_get};
  dev_mesh_transport *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      dev_gloo_transport_create(&mk, "e/", "127.0.0.1", 0, &t, &st),
      PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "timeout"));
  assert_int_equal(dev_gloo_transport_create(&mk, "e/", "", 1.0, &t, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "hostname"));
  /* TEST-NET-1 (RFC 5737): no interface of this machine has it. */
  assert_int_equal(
      dev_gloo_transport_create(&mk, "e/", "192.0.2.1", 1.0, &t, &st),
      PD_UNAVAILABLE);
  assert_non_null(strstr(st.msg, "192.0.2.1"));
  assert_null(t);

  assert_int_equal(
      dev_gloo_transport_create(&mk, "e/", "127.0.0.1", 1.0, &t, &st), PD_OK);
  dev_devset s = {2, {0, 1}};
  void *g = NULL;
  assert_int_equal(t->group_get(t, &s, 2, &g, &st), PD_INVALID_ARGUMENT);
  double t0 = now_s();
  assert_int_equal(t->group_get(t, &s, 0, &g, &st), PD_DEADLINE_EXCEEDED);
  double took = now_s() - t0;
  assert_true(took < 30.0); /* bounded (the timeout is 1 s) */
  assert_non_null(strstr(st.msg, "participant 0 (device 0) of set [0, 1]"));
  assert_null(g);
  /* A set of one needs no peer. */
  dev_devset one = {1, {1}};
  assert_int_equal(t->group_get(t, &one, 0, &g, &st), PD_OK);
  float x = 2.5f;
  assert_int_equal(t->all_reduce(t, g, &x, 1, PD_FLOAT32, DEV_RED_SUM, &st),
                   PD_OK);
  assert_true(x == 2.5f);
  assert_int_equal(t->all_reduce(t, g, &x, 1, PD_FLOAT32, DEV_RED_MEAN, &st),
                   PD_INVALID_ARGUMENT);
  t->release(t);
  mem_free(&kv);
}

/* --- Two processes over a file store --------------------------------------- */

/* What child `me` (0 or 1, device `me`) reports on its pipe. */
typedef struct proc_report {
  int ok_sum;         /* the first all_reduce on each set was right */
  pd_code stall_code; /* participant 0: all_reduce while 1 stalls */
  pd_code dead_code;  /* participant 0: all_reduce after 1 exited */
  double stall_s, dead_s;
  char msg[DEV_STATUS_MSG_MAX + 16];
  char stall_msg[DEV_STATUS_MSG_MAX];
} proc_report;

static int wait_byte(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  char c;
  return poll(&p, 1, ms) == 1 && read(fd, &c, 1) == 1 ? 0 : -1;
}

static void run_child(int me, const char *dir, int report_fd, int go_rd,
                      int go_wr) {
  proc_report rep;
  memset(&rep, 0, sizeof rep);
  dev_mesh_kv mk = {(void *)dir, file_set, file_get};
  dev_mesh_transport *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  dev_devset a = {2, {0, 1}}, b = {2, {1, 0}};
  void *ga = NULL, *gb = NULL;
  if (dev_gloo_transport_create(&mk, "epoch/7/", "127.0.0.1", 3.0, &t, &st) ||
      t->group_get(t, &a, me, &ga, &st) ||
      t->group_get(t, &b, 1 - me, &gb, &st)) {
    snprintf(rep.msg, sizeof rep.msg, "setup: %s", st.msg);
    goto out;
  }
  float va[3] = {1.0f + me, 10.0f * (me + 1), -3.0f};
  int32_t vb[2] = {me ? 5 : 9, me ? 7 : -2};
  if (t->all_reduce(t, ga, va, 3, PD_FLOAT32, DEV_RED_SUM, &st) ||
      t->all_reduce(t, gb, vb, 2, PD_INT32, DEV_RED_MIN, &st)) {
    snprintf(rep.msg, sizeof rep.msg, "all_reduce: %s", st.msg);
    goto out;
  }
  rep.ok_sum = va[0] == 3.0f && va[1] == 30.0f && va[2] == -6.0f &&
               vb[0] == 5 && vb[1] == -2;
  if (me == 1) {
    /* Stall (alive, silent) until participant 0 says go, then die. */
    wait_byte(go_rd, 60000);
    _exit(0);
  }
  double t0 = now_s();
  float x = 1.0f;
  rep.stall_code = t->all_reduce(t, gb, &x, 1, PD_FLOAT32, DEV_RED_SUM, &st);
  rep.stall_s = now_s() - t0;
  snprintf(rep.stall_msg, sizeof rep.stall_msg, "%s", st.msg);
  if (write(go_wr, "g", 1) != 1)
    snprintf(rep.msg, sizeof rep.msg, "cannot signal the peer");
  /* The peer exits; wait until it did (its pipe end closes) so the next
   * collective meets a dead peer, not a stalled one. */
  t0 = now_s();
  rep.dead_code = t->all_reduce(t, ga, &x, 1, PD_FLOAT32, DEV_RED_SUM, &st);
  rep.dead_s = now_s() - t0;
  snprintf(rep.msg, sizeof rep.msg, "%s", st.msg);
out:
  if (write(report_fd, &rep, sizeof rep) != (ssize_t)sizeof rep) _exit(3);
  _exit(0);
}

static void test_two_processes(void **state) {
  if (!dev_gloo_available()) skip();
  char dir[] = "/tmp/paradev_gloo_kv_XXXXXX";
  assert_non_null(mkdtemp(dir));
  int rep[2], go[2];
  assert_int_equal(pipe(rep), 0);
  assert_int_equal(pipe(go), 0);
  pid_t pid[2];
  for (int me = 0; me < 2; me++) {
    pid[me] = fork();
    assert_true(pid[me] >= 0);
    if (pid[me] == 0) {
      alarm(120); /* never outlive a broken test */
      run_child(me, dir, rep[1], go[0], go[1]);
    }
  }
  close(rep[1]);
  proc_report r;
  memset(&r, 0, sizeof r);
  struct pollfd p = {rep[0], POLLIN, 0};
  int got = poll(&p, 1, 90000) == 1 &&
            read(rep[0], &r, sizeof r) == (ssize_t)sizeof r;
  for (int me = 0; me < 2; me++) {
    int status = 0;
    for (int k = 0; k < 600 && waitpid(pid[me], &status, WNOHANG) == 0; k++)
      usleep(100000);
    if (waitpid(pid[me], &status, WNOHANG) == 0) {
      kill(pid[me], SIGKILL);
      waitpid(pid[me], &status, 0);
    }
  }
  close(rep[0]);
  close(go[0]);
  close(go[1]);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) print_message("could not remove %s\n", dir);
  assert_true(got);
  if (!r.ok_sum) fail_msg("the collectives across processes: %s", r.msg);
  print_message("stalled peer: %s after %.2f s: %s\n",
                pd_code_name(r.stall_code), r.stall_s, r.stall_msg);
  print_message("dead peer: %s after %.2f s: %s\n", pd_code_name(r.dead_code),
                r.dead_s, r.msg);
  assert_int_equal(r.stall_code, PD_DEADLINE_EXCEEDED);
  assert_non_null(
      strstr(r.stall_msg, "participant 1 (device 0) of set [1, 0]"));
  assert_true(r.dead_code == PD_UNAVAILABLE ||
              r.dead_code == PD_DEADLINE_EXCEEDED);
  assert_non_null(strstr(r.msg, "of set [0, 1]"));
  /* Bounded: both within a few timeouts (3 s), never a hang. */
  assert_true(r.stall_s < 30.0);
  assert_true(r.dead_s < 30.0);
}

int main(void) {
  if (!dev_gloo_available())
    print_message(
        "SKIP: built without Gloo (libgloo-dev not found at "
        "configure time): no transport to test\n");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_processes),
      cmocka_unit_test(test_threads_one_process),
      cmocka_unit_test(test_rendezvous_timeout_and_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
