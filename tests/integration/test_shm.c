/* Integration test of shared memory transfers (UploadFromSharedMemory,
 * DownloadToSharedMemory and the region RPCs) against the real daemon.
 *
 * Round trips of every dtype and layout (MIRRORED, SHARDED unevenly along
 * either axis, PER_COMPONENT with an empty component; downloads of single
 * COMPONENTs), each value compared with what the test wrote and with the
 * gRPC Upload/Download path; one value also through an op (Add) against a
 * hand-computed result. Then the edges and every error: the exact end of a
 * region and one byte past it, offset overflow, keys, names, sizes, headers,
 * duplicate names, the per-session limit, a second session that tries the
 * first's region and key, the daemon's user unable to open an object, a
 * truncated object, a failed tensor, the session's quota; and the lifetime:
 * closing a session, letting its lease expire and destroying a region unmap
 * it in the daemon (read from /proc/PID/maps). Then threads at once: round
 * trips while regions come and go, truncation and a session close under
 * transfers in flight. Then the hardening: the limits on registered bytes
 * (a session's quota, half the physical memory per session and per daemon,
 * with sparse objects); a download waiting for its tensor when its region is
 * unregistered or its session closed (CANCELLED, nothing written, unmapped
 * at once); a close under running copies (nothing written after it
 * returned); and, in a private mount namespace with a 4 MiB /dev/shm (SKIP
 * where none can be made), regions that do not fit and a sparse region on a
 * full /dev/shm.
 *
 * Usage: test_shm PARADEVD
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "paradev/paradev.h"
#include "harness.h"

#define NDEV 4
#define MEM_LIMIT (64u << 20) /* per device */
#define HDR PD_SHARED_MEMORY_HEADER_BYTES

static const char *paradevd_path;
static pdt_daemon D;

typedef struct env {
  pd_client *c;
  pd_session *s;
  pd_status *st;
} env;

static void daemon_start(pdt_daemon *d, const char *prefix) {
  char mem[32], ndev[8];
  snprintf(mem, sizeof(mem), "%u", MEM_LIMIT);
  snprintf(ndev, sizeof(ndev), "%d", NDEV);
  /* No default session quota (test_memory.py tests it). */
  const char *extra[] = {"--devices",
                         ndev,
                         "--memory-limit",
                         mem,
                         "--default-memory-quota",
                         "unlimited",
                         "--grace-ms",
                         "2000",
                         NULL};
  pdt_daemon_start(d, paradevd_path, prefix, false, extra);
}

static pd_session *new_session(env *e, uint32_t lease, bool keep_alive,
                               uint64_t quota) {
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "test_shm";
  so.lease_seconds = lease;
  so.keep_alive = keep_alive;
  so.memory_quota_bytes = quota;
  pd_session *s = pd_session_new(e->c, &so, NULL, e->st);
  if (!s) fail_msg("pd_session_new: %s", pd_status_message(e->st));
  return s;
}

static int setup(void **state) {
  env *e = calloc(1, sizeof(*e));
  e->st = pd_status_new();
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.default_timeout_ms = 30000;
  e->c = pd_client_new(D.unix_target, &co, e->st);
  if (!e->c) return -1;
  e->s = new_session(e, 0, true, 0);
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

/* True when the daemon (pid) has `key` mapped (/dev/shm/NAME in its maps). */
static bool daemon_maps(pid_t pid, const char *key) {
  char path[64], want[256], line[1024];
  snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
  snprintf(want, sizeof(want), "/dev/shm%s", key);
  FILE *f = fopen(path, "r");
  if (!f) fail_msg("cannot read %s: %s", path, strerror(errno));
  bool found = false;
  while (!found && fgets(line, sizeof(line), f)) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    size_t wl = strlen(want);
    /* The path ends the line ("(deleted)" follows an unlinked object). */
    char *at = strstr(line, want);
    found = at && (at[wl] == '\0' || at[wl] == ' ');
  }
  fclose(f);
  return found;
}

/* Element i of a test value of dtype dt, written at p (values every dtype
 * represents exactly; bool 0/1). */
static void put_elem(pd_dtype dt, void *p, size_t i, int seed) {
  long v = (long)i * 7 + seed;
  switch (dt) {
    case PD_FLOAT32: {
      float x = (float)v * 0.25f - 9.5f;
      memcpy(p, &x, 4);
      break;
    }
    case PD_FLOAT64: {
      double x = (double)v * 0.125 - 1e6;
      memcpy(p, &x, 8);
      break;
    }
    case PD_FLOAT16: {
      uint16_t x = (uint16_t)(0x3C00 + (v & 0x3ff));
      memcpy(p, &x, 2);
      break;
    }
    case PD_BFLOAT16: {
      uint16_t x = (uint16_t)(0x3F80 + (v & 0x7f));
      memcpy(p, &x, 2);
      break;
    }
    case PD_INT32: {
      int32_t x = (int32_t)(v * 1000 - 123456);
      memcpy(p, &x, 4);
      break;
    }
    case PD_INT64: {
      int64_t x = (int64_t)v * 10000000000LL - 7;
      memcpy(p, &x, 8);
      break;
    }
    case PD_UINT8: {
      uint8_t x = (uint8_t)(v * 13);
      memcpy(p, &x, 1);
      break;
    }
    case PD_BOOL: {
      uint8_t x = (uint8_t)(v % 3 == 0);
      memcpy(p, &x, 1);
      break;
    }
    default: fail_msg("dtype %d", (int)dt);
  }
}

static void fill(pd_dtype dt, void *buf, size_t n, int seed) {
  size_t es = pd_dtype_size(dt);
  for (size_t i = 0; i < n; i++) put_elem(dt, (char *)buf + i * es, i, seed);
}

/* Rows [r0, r0+nr) and columns [c0, c0+nc) of a row-major rows x cols value. */
static void block(const uint8_t *src, size_t es, int64_t cols, int64_t r0,
                  int64_t nr, int64_t c0, int64_t nc, uint8_t *dst) {
  for (int64_t r = 0; r < nr; r++)
    memcpy(dst + (size_t)(r * nc) * es,
           src + (size_t)((r0 + r) * cols + c0) * es, (size_t)nc * es);
}

/* --- round trips --------------------------------------------------------------- */

static const pd_dtype all_dtypes[] = {PD_FLOAT32,  PD_FLOAT64, PD_FLOAT16,
                                      PD_BFLOAT16, PD_INT32,   PD_INT64,
                                      PD_UINT8,    PD_BOOL};

static void test_round_trips(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  pd_shared_memory *r = NULL;
  OK(e, pd_shared_memory_create(s, 1 << 20, 0, &r, NULL, e->st));
  assert_int_equal(pd_shared_memory_size(r), 1 << 20);
  uint8_t *data = pd_shared_memory_data(r);
  assert_true(daemon_maps(D.pid, pd_shared_memory_key(r)));
  /* The header the library wrote: "PDSHM", version 1, the token's length. */
  const uint8_t *hdr = data - HDR;
  assert_memory_equal(hdr, "PDSHM\x01", 6);
  assert_int_equal(hdr[6] | hdr[7] << 8, 24);
  uint64_t id = 100;
  for (size_t k = 0; k < sizeof all_dtypes / sizeof all_dtypes[0]; k++) {
    pd_dtype dt = all_dtypes[k];
    size_t es = pd_dtype_size(dt);
    uint8_t want[64 * 8], got[64 * 8], part[64 * 8];
    const uint64_t in_off = 1 + k,
                   out_off = 4096 + 3 * k; /* unaligned on purpose */
    char what[96];

    /* MIRRORED [5, 3]: the same value on every component. */
    int64_t md[2] = {5, 3};
    fill(dt, want, 15, (int)k);
    memcpy(data + in_off, want, 15 * es);
    pd_tensor_info ti;
    uint64_t mid = id++;
    OK(e, pd_upload_from_shared_memory(s, mid, dt, md, 2, r, in_off,
                                       pd_layout_mirrored(), &ti, NULL, e->st));
    assert_int_equal(ti.dtype, dt);
    pdt_assert_shape(&ti, 2, md);
    /* Independently, through gRPC's Download. */
    OK(e, pd_download(s, mid, pd_layout_mirrored(), got, sizeof got, NULL, NULL,
                      NULL, e->st));
    snprintf(what, sizeof what, "%s mirrored, gRPC download",
             pd_dtype_name(dt));
    pdt_assert_bytes(got, want, 15 * es, what);
    for (int c = 0; c < NDEV; c++) {
      memset(data + out_off, 0xAB, 15 * es + 1);
      size_t nb = 0;
      OK(e, pd_download_to_shared_memory(s, mid, pd_layout_component(c), r,
                                         out_off, &ti, &nb, NULL, e->st));
      assert_int_equal(nb, 15 * es);
      pdt_assert_shape(&ti, 2, md);
      snprintf(what, sizeof what, "%s mirrored, component %d",
               pd_dtype_name(dt), c);
      pdt_assert_bytes(data + out_off, want, 15 * es, what);
      assert_int_equal(data[out_off + 15 * es],
                       0xAB); /* nothing past the value */
    }

    /* SHARDED along axis 0, [7, 3] on 4 devices: rows 2, 2, 2, 1. */
    int64_t sd[2] = {7, 3};
    const int64_t rows[NDEV] = {2, 2, 2, 1}, row0[NDEV] = {0, 2, 4, 6};
    fill(dt, want, 21, (int)k + 50);
    memcpy(data + in_off, want, 21 * es);
    uint64_t sid = id++;
    OK(e, pd_upload_from_shared_memory(s, sid, dt, sd, 2, r, in_off,
                                       pd_layout_sharded(0), &ti, NULL, e->st));
    pdt_assert_shape(&ti, 2, (int64_t[]){-1, 3});
    for (int c = 0; c < NDEV; c++) {
      OK(e, pd_download_to_shared_memory(s, sid, pd_layout_component(c), r,
                                         out_off, &ti, NULL, NULL, e->st));
      pdt_assert_shape(&ti, 2, (int64_t[]){rows[c], 3});
      block(want, es, 3, row0[c], rows[c], 0, 3, part);
      snprintf(what, sizeof what, "%s sharded axis 0, component %d",
               pd_dtype_name(dt), c);
      pdt_assert_bytes(data + out_off, part, (size_t)rows[c] * 3 * es, what);
    }
    size_t nb = 0;
    OK(e, pd_download_to_shared_memory(s, sid, pd_layout_sharded(0), r, out_off,
                                       &ti, &nb, NULL, e->st));
    assert_int_equal(nb, 21 * es);
    pdt_assert_shape(&ti, 2, sd);
    snprintf(what, sizeof what, "%s sharded axis 0, concatenated",
             pd_dtype_name(dt));
    pdt_assert_bytes(data + out_off, want, 21 * es, what);

    /* SHARDED along axis 1, [2, 5]: columns 2, 1, 1, 1. */
    int64_t cd[2] = {2, 5};
    const int64_t cols[NDEV] = {2, 1, 1, 1}, col0[NDEV] = {0, 2, 3, 4};
    fill(dt, want, 10, (int)k + 90);
    memcpy(data + in_off, want, 10 * es);
    uint64_t cid = id++;
    OK(e,
       pd_upload_from_shared_memory(s, cid, dt, cd, 2, r, in_off,
                                    pd_layout_sharded(1), NULL, NULL, e->st));
    for (int c = 0; c < NDEV; c++) {
      OK(e, pd_download_to_shared_memory(s, cid, pd_layout_component(c), r,
                                         out_off, &ti, NULL, NULL, e->st));
      pdt_assert_shape(&ti, 2, (int64_t[]){2, cols[c]});
      block(want, es, 5, 0, 2, col0[c], cols[c], part);
      snprintf(what, sizeof what, "%s sharded axis 1, component %d",
               pd_dtype_name(dt), c);
      pdt_assert_bytes(data + out_off, part, (size_t)(2 * cols[c]) * es, what);
    }
    OK(e, pd_download_to_shared_memory(s, cid, pd_layout_sharded(1), r, out_off,
                                       NULL, NULL, NULL, e->st));
    snprintf(what, sizeof what, "%s sharded axis 1, concatenated",
             pd_dtype_name(dt));
    pdt_assert_bytes(data + out_off, want, 10 * es, what);

    /* PER_COMPONENT [1, 3], [2, 3], [0, 3], [3, 3]: one after another. */
    int64_t d0[2] = {1, 3}, d1[2] = {2, 3}, d2[2] = {0, 3}, d3[2] = {3, 3};
    const int64_t *pd[NDEV] = {d0, d1, d2, d3};
    const int ranks[NDEV] = {2, 2, 2, 2};
    const size_t n_el[NDEV] = {3, 6, 0, 9};
    fill(dt, want, 18, (int)k + 130);
    memcpy(data + in_off, want, 18 * es);
    uint64_t pid_ = id++;
    OK(e, pd_upload_components_from_shared_memory(s, pid_, dt, NDEV, pd, ranks,
                                                  r, in_off, &ti, NULL, e->st));
    pdt_assert_shape(&ti, 2, (int64_t[]){-1, 3});
    pd_tensor_info infos[NDEV];
    nb = 0;
    memset(data + out_off, 0, 18 * es);
    OK(e, pd_download_components_to_shared_memory(s, pid_, NDEV, r, out_off,
                                                  infos, &nb, NULL, e->st));
    assert_int_equal(nb, 18 * es);
    snprintf(what, sizeof what, "%s per component", pd_dtype_name(dt));
    pdt_assert_bytes(data + out_off, want, 18 * es, what);
    /* And each component through gRPC. */
    uint8_t c0[64], c1[64], c2[8], c3[128];
    void *const bufs[NDEV] = {c0, c1, c2, c3};
    const size_t caps[NDEV] = {sizeof c0, sizeof c1, sizeof c2, sizeof c3};
    OK(e, pd_download_components(s, pid_, NDEV, bufs, caps, NULL, NULL, e->st));
    size_t at = 0;
    for (int c = 0; c < NDEV; c++) {
      pdt_assert_shape(&infos[c], 2, pd[c]);
      snprintf(what, sizeof what, "%s per component, gRPC component %d",
               pd_dtype_name(dt), c);
      pdt_assert_bytes(bufs[c], want + at, n_el[c] * es, what);
      at += n_el[c] * es;
    }

    /* gRPC's Upload, then a download into the region. */
    fill(dt, want, 15, (int)k + 170);
    uint64_t gid = id++;
    OK(e, pd_upload(s, gid, dt, md, 2, want, 15 * es, pd_layout_mirrored(),
                    NULL, NULL, e->st));
    OK(e, pd_download_to_shared_memory(s, gid, pd_layout_mirrored(), r, out_off,
                                       NULL, NULL, NULL, e->st));
    snprintf(what, sizeof what, "%s gRPC upload, region download",
             pd_dtype_name(dt));
    pdt_assert_bytes(data + out_off, want, 15 * es, what);
  }

  /* A value through an op: 2 * x computed by Add on every device. */
  float x[6] = {1.5f, -2.25f, 3.0f, 0.0f, 1e6f, -7.125f}, want2[6];
  for (int i = 0; i < 6; i++) want2[i] = 2.0f * x[i];
  memcpy(data, x, sizeof x);
  int64_t xd[1] = {6};
  OK(e, pd_upload_from_shared_memory(s, 1, PD_FLOAT32, xd, 1, r, 0,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  uint64_t in[2] = {1, 1}, out = 2;
  OK(e, pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, e->st));
  for (int c = 0; c < NDEV; c++) {
    OK(e, pd_download_to_shared_memory(s, 2, pd_layout_component(c), r, 100,
                                       NULL, NULL, NULL, e->st));
    float y[6];
    memcpy(y, data + 100, sizeof y);
    for (int i = 0; i < 6; i++)
      if (y[i] != want2[i])
        fail_msg("component %d element %d: %g, expected %g", c, i, (double)y[i],
                 (double)want2[i]);
  }
  OK(e, pd_delete(s, (uint64_t[]){1, 2}, 2, NULL, e->st));
  const char *key = pd_shared_memory_key(r);
  char key_copy[128];
  snprintf(key_copy, sizeof key_copy, "%s", key);
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  /* Unregistered and unmapped in the daemon; unlinked here. */
  assert_false(daemon_maps(D.pid, key_copy));
  int fd = shm_open(key_copy, O_RDONLY, 0);
  assert_int_equal(fd, -1);
  assert_int_equal(errno, ENOENT);
}

/* --- the end of a region ---------------------------------------------------------- */

static void test_region_end(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  pd_shared_memory *r = NULL;
  OK(e, pd_shared_memory_create(s, 4000, 0, &r, NULL, e->st));
  uint8_t *data = pd_shared_memory_data(r);
  const size_t D_ = pd_shared_memory_size(r);
  assert_int_equal(D_, 4000);
  int64_t n16[1] = {16};
  for (int i = 0; i < 16; i++) data[D_ - 16 + (size_t)i] = (uint8_t)(200 + i);
  /* The last 16 bytes exactly. */
  OK(e, pd_upload_from_shared_memory(s, 1, PD_UINT8, n16, 1, r, D_ - 16,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  uint8_t got[16];
  OK(e, pd_download(s, 1, pd_layout_component(3), got, sizeof got, NULL, NULL,
                    NULL, e->st));
  for (int i = 0; i < 16; i++) assert_int_equal(got[i], 200 + i);
  /* One byte past the end. */
  EXPECT_CODE(
      e, PD_OUT_OF_RANGE,
      pd_upload_from_shared_memory(s, 2, PD_UINT8, n16, 1, r, D_ - 15,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "16 bytes at data offset 3985");
  ASSERT_MSG_HAS(e, "holds 4000 bytes of data");
  /* No tensor was made under id 2. */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download(s, 2, pd_layout_mirrored(), got, sizeof got, NULL,
                          NULL, NULL, e->st));
  /* Downloads: the exact end works, a byte past it writes nothing. */
  memset(data + D_ - 16, 0, 16);
  OK(e, pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, D_ - 16,
                                     NULL, NULL, NULL, e->st));
  for (int i = 0; i < 16; i++)
    assert_int_equal(data[D_ - 16 + (size_t)i], 200 + i);
  memset(data + D_ - 16, 0x5A, 16);
  EXPECT_CODE(e, PD_OUT_OF_RANGE,
              pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r,
                                           D_ - 15, NULL, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "16 bytes at data offset 3985");
  for (int i = 0; i < 16; i++)
    assert_int_equal(data[D_ - 16 + (size_t)i], 0x5A);
  /* Offsets whose sum with the size overflows. */
  EXPECT_CODE(
      e, PD_OUT_OF_RANGE,
      pd_upload_from_shared_memory(s, 2, PD_UINT8, n16, 1, r, UINT64_MAX - 7,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "18446744073709551608");
  EXPECT_CODE(
      e, PD_OUT_OF_RANGE,
      pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, UINT64_MAX,
                                   NULL, NULL, NULL, e->st));
  /* An empty value at the very end is in range. */
  int64_t n0[1] = {0};
  OK(e, pd_upload_from_shared_memory(s, 3, PD_UINT8, n0, 1, r, D_,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){1, 3}, 2, NULL, e->st));
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
}

/* --- registration errors -------------------------------------------------------------- */

/* A fresh object of `bytes` bytes (mode 0600), closed; its key in key. */
static void make_object(char *key, size_t keylen, const char *tag, size_t bytes,
                        mode_t mode) {
  static int n;
  snprintf(key, keylen, "/pdtest-shm-%d-%s-%d", (int)getpid(), tag, n++);
  shm_unlink(key);
  int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) fail_msg("shm_open %s: %s", key, strerror(errno));
  if (ftruncate(fd, (off_t)bytes) != 0)
    fail_msg("ftruncate: %s", strerror(errno));
  if (fchmod(fd, mode) != 0) fail_msg("fchmod: %s", strerror(errno));
  close(fd);
}

static void test_register_errors(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, 0, true, 0);
  pd_shared_memory *r = NULL;
  /* No object under the key. */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_shared_memory_register(s, "/pdtest-shm-missing-xyz", NULL,
                                        4096, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "/pdtest-shm-missing-xyz");
  /* Keys that are no POSIX shm name. */
  const char *bad_keys[] = {"pdtest-noslash", "/",    "/..",
                            "/a/b",           "/a b", "/x\xc3\xa9"};
  for (size_t i = 0; i < sizeof bad_keys / sizeof bad_keys[0]; i++) {
    EXPECT_CODE(e, PD_INVALID_ARGUMENT,
                pd_shared_memory_register(s, bad_keys[i], "k", 4096, false, &r,
                                          NULL, e->st));
    ASSERT_MSG_HAS(e, "followed by 1 to 200 of A-Z a-z 0-9 . _ -");
  }
  char longkey[260];
  longkey[0] = '/';
  memset(longkey + 1, 'a', 201);
  longkey[202] = '\0';
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_shared_memory_register(s, longkey, "k", 4096, false, &r, NULL, e->st));
  char key[128];
  make_object(key, sizeof key, "small", 4096, 0600);
  /* byte_size must leave room for data past the header. */
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_shared_memory_register(s, key, NULL, 64, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "byte_size 64");
  /* An object smaller than byte_size. */
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_shared_memory_register(s, key, NULL, 8192, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "holds 4096 bytes; byte_size is 8192");
  /* The same when the library is to write the header: it must not write past
   * the object's end (SIGBUS in the program). */
  char empty[128];
  make_object(empty, sizeof empty, "empty", 0, 0600);
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_shared_memory_register(s, empty, NULL, 4096, true, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "holds 0 bytes; byte_size is 4096");
  shm_unlink(empty);
  /* No header (zeros) and a header with another token. */
  EXPECT_CODE(
      e, PD_PERMISSION_DENIED,
      pd_shared_memory_register(s, key, NULL, 4096, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "does not carry this session's header");
  int fd = shm_open(key, O_RDWR, 0);
  uint8_t *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(m != MAP_FAILED);
  OK(e, pd_shared_memory_write_header(s, m, 4096, e->st));
  m[8 + 23] ^= 1; /* the token's last byte */
  EXPECT_CODE(
      e, PD_PERMISSION_DENIED,
      pd_shared_memory_register(s, key, NULL, 4096, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "does not carry this session's header");
  m[8 + 23] ^= 1;
  m[40] = 1; /* the rest of the header must be zero */
  EXPECT_CODE(
      e, PD_PERMISSION_DENIED,
      pd_shared_memory_register(s, key, NULL, 4096, false, &r, NULL, e->st));
  m[40] = 0;
  /* Now the header is right: a program-managed object registers. */
  OK(e,
     pd_shared_memory_register(s, key, "mine", 4096, false, &r, NULL, e->st));
  assert_string_equal(pd_shared_memory_name(r), "mine");
  assert_int_equal(pd_shared_memory_size(r), 4096 - HDR);
  /* Names: unique, printable, not empty, not too long. */
  pd_shared_memory *r2 = NULL;
  EXPECT_CODE(
      e, PD_ALREADY_EXISTS,
      pd_shared_memory_register(s, key, "mine", 4096, false, &r2, NULL, e->st));
  ASSERT_MSG_HAS(e, "\"mine\" is already registered");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(s, key, "bad\x01name", 4096, false, &r2,
                                        NULL, e->st));
  ASSERT_MSG_HAS(e, "printable ASCII");
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_shared_memory_register(s, key, "", 4096, false, &r2, NULL, e->st));
  char longname[300];
  memset(longname, 'n', 299);
  longname[299] = '\0';
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(s, key, longname, 4096, false, &r2,
                                        NULL, e->st));
  ASSERT_MSG_HAS(e, "max_string_bytes = 256");
  /* 64 regions per session: "mine" and 63 more, then one too many. */
  pd_shared_memory *many[64] = {NULL};
  for (int i = 1; i < 64; i++) {
    char nm[16];
    snprintf(nm, sizeof nm, "r%d", i);
    OK(e, pd_shared_memory_register(s, key, nm, 4096, false, &many[i], NULL,
                                    e->st));
  }
  EXPECT_CODE(
      e, PD_RESOURCE_EXHAUSTED,
      pd_shared_memory_register(s, key, "r64", 4096, false, &r2, NULL, e->st));
  ASSERT_MSG_HAS(e, "the limit is 64 per session");
  for (int i = 1; i < 64; i++)
    OK(e, pd_shared_memory_destroy(many[i], NULL, e->st));
  /* Two names on one object are two regions: dropping one leaves the
   * other working. */
  OK(e,
     pd_shared_memory_register(s, key, "again", 4096, false, &r2, NULL, e->st));
  pd_shared_memory *alias = NULL;
  OK(e, pd_shared_memory_register(s, key, "alias", 4096, false, &alias, NULL,
                                  e->st));
  OK(e, pd_shared_memory_destroy(r2, NULL, e->st));
  int64_t d4[1] = {4};
  OK(e, pd_upload_from_shared_memory(s, 1, PD_UINT8, d4, 1, alias, 0,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  OK(e, pd_shared_memory_destroy(alias, NULL, e->st));
  munmap(m, 4096);
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  /* The object is the program's: destroy did not unlink it. */
  fd = shm_open(key, O_RDONLY, 0);
  assert_true(fd >= 0);
  close(fd);
  shm_unlink(key);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

/* --- a second session ---------------------------------------------------------------------- */

static void test_second_session(void **state) {
  env *e = *state;
  pd_session *a = new_session(e, 0, true, 0), *b = new_session(e, 0, true, 0);
  pd_shared_memory *ra = NULL, *rb = NULL;
  OK(e, pd_shared_memory_create(a, 8192, 0, &ra, NULL, e->st));
  uint8_t *data = pd_shared_memory_data(ra);
  memset(data, 7, 64);
  int64_t d64[1] = {64};
  OK(e, pd_upload_from_shared_memory(a, 1, PD_UINT8, d64, 1, ra, 0,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  /* B names A's region: not B's. */
  EXPECT_CODE(
      e, PD_NOT_FOUND,
      pd_upload_from_shared_memory(b, 1, PD_UINT8, d64, 1, ra, 0,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "no shared memory region named");
  /* B may not read A's tensors into A's region either (neither is B's). */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download_to_shared_memory(b, 1, pd_layout_mirrored(), ra, 0,
                                           NULL, NULL, NULL, e->st));
  /* B registers A's key: the header holds A's token, not B's. */
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_shared_memory_register(b, pd_shared_memory_key(ra), "stolen",
                                        8192 + HDR, false, &rb, NULL, e->st));
  ASSERT_MSG_HAS(e, "does not carry this session's header");
  /* The same name in another session is another region. */
  OK(e, pd_shared_memory_create(b, 4096, 0, &rb, NULL, e->st));
  OK(e, pd_shared_memory_destroy(rb, NULL, e->st));
  /* A's region still works. */
  OK(e, pd_download_to_shared_memory(a, 1, pd_layout_component(2), ra, 100,
                                     NULL, NULL, NULL, e->st));
  for (int i = 0; i < 64; i++) assert_int_equal(data[100 + i], 7);
  OK(e, pd_shared_memory_destroy(ra, NULL, e->st));
  OK(e, pd_session_close(a, NULL, e->st));
  OK(e, pd_session_close(b, NULL, e->st));
  pd_session_delete(a);
  pd_session_delete(b);
}

/* --- tensors: errors, quota, a failed tensor -------------------------------------------------- */

static void test_tensor_errors(void **state) {
  env *e = *state;
  /* Quota of 16 KiB: a mirrored float32 [1024] is 4 KiB on each of 4 devices.
   * The quota also bounds the session's registered bytes: 12 KiB of data. */
  pd_session *s = new_session(e, 0, true, 16384);
  pd_shared_memory *r = NULL;
  OK(e, pd_shared_memory_create(s, 12288, 0, &r, NULL, e->st));
  float *f = pd_shared_memory_data(r);
  for (int i = 0; i < 1024; i++) f[i] = (float)i;
  int64_t d1024[1] = {1024}, d1025[1] = {1025};
  OK(e, pd_upload_from_shared_memory(s, 1, PD_FLOAT32, d1024, 1, r, 0,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  /* Over the quota: refused like Upload. */
  EXPECT_CODE(
      e, PD_RESOURCE_EXHAUSTED,
      pd_upload_from_shared_memory(s, 2, PD_FLOAT32, d1024, 1, r, 0,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){1}, 1, NULL, e->st));
  OK(e, pd_upload_from_shared_memory(s, 2, PD_FLOAT32, d1024, 1, r, 0,
                                     pd_layout_sharded(0), NULL, NULL, e->st));
  /* A live id, id 0, a bad dtype, a bad axis, a wrong component count. */
  EXPECT_CODE(
      e, PD_ALREADY_EXISTS,
      pd_upload_from_shared_memory(s, 2, PD_FLOAT32, d1024, 1, r, 0,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_upload_from_shared_memory(s, 0, PD_FLOAT32, d1024, 1, r, 0,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_upload_from_shared_memory(s, 3, (pd_dtype)99, d1024, 1, r, 0,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "dtype 99");
  EXPECT_CODE(
      e, PD_INVALID_ARGUMENT,
      pd_upload_from_shared_memory(s, 3, PD_FLOAT32, d1025, 1, r, 0,
                                   pd_layout_sharded(1), NULL, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload_components_from_shared_memory(
                  s, 3, PD_FLOAT32, 3, NULL, NULL, r, 0, NULL, NULL, e->st));
  /* Downloads: no layout (never guessed), an unknown id, a component out
   * of range. */
  pd_layout unspecified = {PD_LAYOUT_UNSPECIFIED, 0, 0};
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download_to_shared_memory(s, 2, unspecified, r, 0, NULL, NULL,
                                           NULL, e->st));
  ASSERT_MSG_HAS(e, "layout is unspecified");
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download_to_shared_memory(s, 77, pd_layout_mirrored(), r, 0,
                                           NULL, NULL, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download_to_shared_memory(s, 2, pd_layout_component(NDEV), r,
                                           0, NULL, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "components 0..3");
  /* A tensor whose op failed on the devices: its error, nothing written. */
  int32_t *idx = (int32_t *)((char *)pd_shared_memory_data(r) + 4096);
  idx[0] = 1;
  idx[1] = 5000; /* params have 256 rows per shard */
  int64_t d2[1] = {2};
  OK(e, pd_upload_from_shared_memory(s, 4, PD_INT32, d2, 1, r, 4096,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  pd_attrs *at = pd_attrs_new();
  pd_attrs_set_int(at, "axis", 0);
  uint64_t in[2] = {2, 4}, out = 5;
  OK(e, pd_execute(s, "Gather", in, 2, at, &out, 1, NULL, NULL, e->st));
  pd_attrs_delete(at);
  uint8_t *dst = (uint8_t *)pd_shared_memory_data(r) + 8192;
  memset(dst, 0xEE, 64);
  /* Gathered from shards, the output is not mirrored: MIRRORED is refused
   * (layouts never guess), COMPONENT 0 reports the op's error. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download_to_shared_memory(s, 5, pd_layout_mirrored(), r, 8192,
                                           NULL, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "not mirrored");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download_to_shared_memory(s, 5, pd_layout_component(0), r,
                                           8192, NULL, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "Gather: indices");
  ASSERT_MSG_HAS(e, "5000");
  for (int i = 0; i < 64; i++) assert_int_equal(dst[i], 0xEE);
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

/* A client that truncates its object while it is registered gets an error;
 * the daemon goes on. */
static void test_truncated(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, 0, true, 0);
  pd_shared_memory *r = NULL;
  OK(e, pd_shared_memory_create(s, 1 << 20, 0, &r, NULL, e->st));
  int64_t big[1] = {1 << 19};
  OK(e, pd_upload_from_shared_memory(s, 1, PD_UINT8, big, 1, r, 0,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  int fd = shm_open(pd_shared_memory_key(r), O_RDWR, 0);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  close(fd);
  /* (The test never touches its own mapping past 4096 bytes now.) */
  EXPECT_CODE(
      e, PD_FAILED_PRECONDITION,
      pd_upload_from_shared_memory(s, 2, PD_UINT8, big, 1, r, 0,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "was truncated");
  EXPECT_CODE(e, PD_FAILED_PRECONDITION,
              pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, 0,
                                           NULL, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "was truncated");
  /* A transfer that only touches bytes the object still has fails all the
   * same: on CUDA the mapping is page-locked and never faults, so the daemon
   * checks the object's size after each copy, on every backend. */
  int64_t small[1] = {16};
  EXPECT_CODE(
      e, PD_FAILED_PRECONDITION,
      pd_upload_from_shared_memory(s, 3, PD_UINT8, small, 1, r, 0,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "was truncated to 4096 of the 1048640 bytes");
  /* The daemon is alive and the session usable. */
  pd_server_info *info = pd_client_get_server_info(e->c, NULL, e->st);
  assert_non_null(info);
  pd_server_info_delete(info);
  uint64_t failed = 0;
  OK(e, pd_sync(s, NULL, 0, &failed, NULL, e->st));
  assert_int_equal(failed, 0);
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
}

/* --- lifetime ---------------------------------------------------------------------------------- */

static void test_session_end_unmaps(void **state) {
  env *e = *state;
  /* Closing the session. */
  pd_session *s = new_session(e, 0, true, 0);
  pd_shared_memory *r1 = NULL, *r2 = NULL;
  OK(e, pd_shared_memory_create(s, 4096, 0, &r1, NULL, e->st));
  OK(e, pd_shared_memory_create(s, 4096, 0, &r2, NULL, e->st));
  assert_true(daemon_maps(D.pid, pd_shared_memory_key(r1)));
  assert_true(daemon_maps(D.pid, pd_shared_memory_key(r2)));
  OK(e, pd_session_close(s, NULL, e->st));
  assert_false(daemon_maps(D.pid, pd_shared_memory_key(r1)));
  assert_false(daemon_maps(D.pid, pd_shared_memory_key(r2)));
  /* Destroying after the close: nothing left to unregister. */
  OK(e, pd_shared_memory_destroy(r1, NULL, e->st));
  OK(e, pd_shared_memory_destroy(r2, NULL, e->st));
  pd_session_delete(s);

  /* The lease running out (1 s, no keep-alive): the daemon's sweep unmaps
   * it; wait for it at most 20 s. */
  s = new_session(e, 1, false, 0);
  OK(e, pd_shared_memory_create(s, 4096, 0, &r1, NULL, e->st));
  char key[128];
  snprintf(key, sizeof key, "%s", pd_shared_memory_key(r1));
  assert_true(daemon_maps(D.pid, key));
  double until = pdt_now() + 20;
  while (daemon_maps(D.pid, key) && pdt_now() < until) usleep(50000);
  assert_false(daemon_maps(D.pid, key));
  /* The session is gone on the daemon: destroy still cleans up here. */
  OK(e, pd_shared_memory_destroy(r1, NULL, e->st));
  int fd = shm_open(key, O_RDONLY, 0);
  assert_int_equal(fd, -1);
  pd_session_delete(s);
}

/* --- many threads at once ------------------------------------------------------------------------ */

/* CT_THREADS threads share one session and one region, each round-tripping
 * values through its own slice of it (upload from [0, 4096), download into
 * [4096, 8192)), while another thread creates, uses and destroys regions of
 * the same session (the registry changes under the transfers' lookups). Then
 * the threads go on until the session is closed under them: every call after
 * that fails cleanly, and once they have returned the daemon has unmapped the
 * region (no transfer kept a reference). Then truncation: the threads keep
 * transferring through a second region while it is truncated; each call
 * succeeds or fails with FAILED_PRECONDITION, the SIGBUS guards of several
 * daemon threads at once never crash it, and the session stays usable. */
#define CT_THREADS 4
#define CT_SLICE 8192

typedef struct ct_arg {
  pd_session *s;
  pd_shared_memory *r;
  int t;
  int rounds; /* phase 1: exact rounds; phases 2 and 3: until stopped */
  atomic_int *stop;
  atomic_int done; /* rounds completed */
  bool touch;      /* the thread writes and checks the region's bytes */
  int n_ok, n_fail;
  pd_code fail_code; /* the first unexpected code, PD_OK if none */
  char why[600];
} ct_arg;

/* One round: an int32 value of 300 + round elements, filled with a pattern
 * unique to (thread, round), uploaded mirrored or sharded and downloaded
 * back. Returns the first failing call's code. */
static pd_code ct_round(ct_arg *a, int round, pd_status *st) {
  const size_t base = (size_t)a->t * CT_SLICE;
  uint8_t *data = pd_shared_memory_data(a->r);
  int64_t n = 300 + round % 700;
  int64_t dims[1] = {n};
  if (a->touch) {
    for (int64_t i = 0; i < n; i++) {
      int32_t v = (int32_t)(a->t * 1000003 + round * 7919 + i);
      memcpy(data + base + (size_t)i * 4, &v, 4);
    }
    memset(data + base + 4096, 0, (size_t)n * 4);
  }
  pd_layout lay = round % 2 ? pd_layout_sharded(0) : pd_layout_mirrored();
  uint64_t id = (uint64_t)(a->t + 1) * 1000000u + (uint64_t)round;
  pd_code rc = pd_upload_from_shared_memory(a->s, id, PD_INT32, dims, 1, a->r,
                                            base, lay, NULL, NULL, st);
  if (rc != PD_OK) return rc;
  rc = pd_download_to_shared_memory(a->s, id, lay, a->r, base + 4096, NULL,
                                    NULL, NULL, st);
  pd_code drc = pd_delete(a->s, &id, 1, NULL, rc == PD_OK ? st : NULL);
  if (rc != PD_OK) return rc;
  if (drc != PD_OK) return drc;
  if (a->touch && memcmp(data + base + 4096, data + base, (size_t)n * 4) != 0) {
    snprintf(a->why, sizeof a->why,
             "thread %d round %d: the value came back changed", a->t, round);
    return PD_INTERNAL;
  }
  return PD_OK;
}

static void *ct_main(void *p) {
  ct_arg *a = p;
  pd_status *st = pd_status_new();
  for (int i = 0; a->rounds ? i < a->rounds : !atomic_load(a->stop); i++) {
    pd_code rc = ct_round(a, i, st);
    if (rc == PD_OK) {
      a->n_ok++;
    } else {
      a->n_fail++;
      if (a->fail_code == PD_OK) {
        a->fail_code = rc;
        if (!a->why[0])
          snprintf(a->why, sizeof a->why, "thread %d round %d: %s: %s", a->t, i,
                   pd_code_name(rc), pd_status_message(st));
      }
      if (a->rounds) break; /* phase 1 expects none */
    }
    atomic_fetch_add(&a->done, 1);
  }
  pd_status_delete(st);
  return NULL;
}

typedef struct ct_churn {
  pd_session *s;
  int rounds;
  char why[600];
} ct_churn;

static void *ct_churn_main(void *p) {
  ct_churn *c = p;
  pd_status *st = pd_status_new();
  for (int i = 0; i < c->rounds && !c->why[0]; i++) {
    pd_shared_memory *r = NULL;
    uint64_t id = 9000000u + (uint64_t)i;
    int64_t d[1] = {16};
    pd_code rc = pd_shared_memory_create(c->s, 4096, 0, &r, NULL, st);
    if (rc == PD_OK) {
      memset(pd_shared_memory_data(r), i & 0xff, 16);
      rc = pd_upload_from_shared_memory(c->s, id, PD_UINT8, d, 1, r, 0,
                                        pd_layout_mirrored(), NULL, NULL, st);
      if (rc == PD_OK) rc = pd_delete(c->s, &id, 1, NULL, st);
      pd_code drc = pd_shared_memory_destroy(r, NULL, rc == PD_OK ? st : NULL);
      if (rc == PD_OK) rc = drc;
    }
    if (rc != PD_OK)
      snprintf(c->why, sizeof c->why, "churn round %d: %s: %s", i,
               pd_code_name(rc), pd_status_message(st));
  }
  pd_status_delete(st);
  return NULL;
}

static void ct_run(ct_arg *a, pd_session *s, pd_shared_memory *r, int rounds,
                   atomic_int *stop, bool touch, pthread_t *th) {
  for (int t = 0; t < CT_THREADS; t++) {
    memset(&a[t], 0, sizeof a[t]);
    a[t].s = s;
    a[t].r = r;
    a[t].t = t;
    a[t].rounds = rounds;
    a[t].stop = stop;
    a[t].touch = touch;
    atomic_init(&a[t].done, 0);
    assert_int_equal(pthread_create(&th[t], NULL, ct_main, &a[t]), 0);
  }
}

/* Blocks until every thread has completed at least `n` rounds. */
static void ct_wait_rounds(ct_arg *a, int n) {
  for (int t = 0; t < CT_THREADS; t++)
    while (atomic_load(&a[t].done) < n) usleep(1000);
}

static void test_concurrent(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, 0, true, 0);
  pd_shared_memory *r = NULL;
  OK(e, pd_shared_memory_create(s, CT_THREADS * CT_SLICE, 0, &r, NULL, e->st));
  char key[128];
  snprintf(key, sizeof key, "%s", pd_shared_memory_key(r));
  ct_arg a[CT_THREADS];
  pthread_t th[CT_THREADS], churn_th;
  atomic_int stop;
  atomic_init(&stop, 0);

  /* Phase 1: every round trip exact, with the registry churning. */
  ct_churn churn = {s, 60, ""};
  assert_int_equal(pthread_create(&churn_th, NULL, ct_churn_main, &churn), 0);
  ct_run(a, s, r, 60, &stop, true, th);
  for (int t = 0; t < CT_THREADS; t++) pthread_join(th[t], NULL);
  pthread_join(churn_th, NULL);
  for (int t = 0; t < CT_THREADS; t++)
    if (a[t].n_fail) fail_msg("%s", a[t].why);
  if (churn.why[0]) fail_msg("%s", churn.why);

  /* Phase 2: truncation under the transfers of a second region (the
   * threads no longer touch its bytes: their own mapping faults too). */
  pd_shared_memory *r2 = NULL;
  OK(e, pd_shared_memory_create(s, CT_THREADS * CT_SLICE, 0, &r2, NULL, e->st));
  ct_run(a, s, r2, 0, &stop, false, th);
  ct_wait_rounds(a, 3);
  int fd = shm_open(pd_shared_memory_key(r2), O_RDWR, 0);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  close(fd);
  int seen[CT_THREADS];
  for (int t = 0; t < CT_THREADS; t++) seen[t] = atomic_load(&a[t].done);
  for (int t = 0; t < CT_THREADS; t++) /* rounds begun after the truncation */
    while (atomic_load(&a[t].done) < seen[t] + 3) usleep(1000);
  atomic_store(&stop, 1);
  for (int t = 0; t < CT_THREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < CT_THREADS; t++) {
    if (a[t].fail_code != PD_OK && a[t].fail_code != PD_FAILED_PRECONDITION)
      fail_msg("truncation: %s", a[t].why);
    if (a[t].fail_code == PD_FAILED_PRECONDITION &&
        !strstr(a[t].why, "was truncated"))
      fail_msg("truncation: %s", a[t].why);
    assert_true(a[t].n_ok >= 3);   /* the rounds before the truncation */
    assert_true(a[t].n_fail >= 2); /* the ones begun after it */
  }
  OK(e, pd_shared_memory_destroy(r2, NULL, e->st));
  uint64_t failed = 0;
  OK(e, pd_sync(s, NULL, 0, &failed, NULL, e->st));
  assert_int_equal(failed, 0);

  /* Phase 3: the session closed under the transfers. */
  atomic_store(&stop, 0);
  ct_run(a, s, r, 0, &stop, true, th);
  ct_wait_rounds(a, 3);
  OK(e, pd_session_close(s, NULL, e->st));
  atomic_store(&stop, 1);
  for (int t = 0; t < CT_THREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < CT_THREADS; t++) {
    /* After the close: FAILED_PRECONDITION from the library or the daemon,
     * NOT_FOUND (the session or the region already gone there), or
     * CANCELLED (the region was retired between a transfer's lookup and its
     * copy). */
    if (a[t].n_fail && a[t].fail_code != PD_FAILED_PRECONDITION &&
        a[t].fail_code != PD_NOT_FOUND && a[t].fail_code != PD_CANCELLED)
      fail_msg("close: %s", a[t].why);
    assert_true(a[t].n_ok >= 3);
  }
  /* Every transfer has returned, so nothing holds the mapping any more once
   * the daemon has finished their calls (it replies first): at most 20 s. */
  double until = pdt_now() + 20;
  while (daemon_maps(D.pid, key) && pdt_now() < until) usleep(10000);
  assert_false(daemon_maps(D.pid, key));
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  pd_session_delete(s);
  /* The daemon serves on. */
  pd_server_info *info = pd_client_get_server_info(e->c, NULL, e->st);
  assert_non_null(info);
  pd_server_info_delete(info);
}

/* --- limits on registered bytes ------------------------------------------------------------------ */

/* Half the machine's physical memory: the daemon's limit on registered bytes,
 * per daemon and per session (paradev.proto, "Shared memory"). */
static uint64_t phys_half(void) {
  return (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE) /
         2;
}

/* Registers the sparse object `key` whole (the library writes the header):
 * the code, with the message in e->st. */
static pd_code register_whole(env *e, pd_session *s, const char *key,
                              const char *name, pd_shared_memory **r) {
  return pd_shared_memory_register(s, key, name, 0, true, r, NULL, e->st);
}

static void test_byte_limits(void **state) {
  env *e = *state;
  char msg[600];
  /* A session with a memory quota of 1 MiB may register at most 1 MiB,
   * headers included: 600064 bytes, then exactly the 448512 left. */
  pd_session *q = new_session(e, 0, true, 1 << 20);
  pd_shared_memory *r1 = NULL, *r2 = NULL;
  OK(e, pd_shared_memory_create(q, 600000, 0, &r1, NULL, e->st));
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_shared_memory_create(q, 448449, 0, &r2, NULL, e->st));
  ASSERT_MSG_HAS(
      e,
      "registering 448513 more bytes of shared memory would exceed the "
      "session's limit of 1048576 bytes (its memory quota): the session has "
      "600064 bytes in 1 region registered");
  OK(e, pd_shared_memory_create(q, 448448, 0, &r2, NULL, e->st));
  OK(e, pd_shared_memory_destroy(r2, NULL, e->st));
  OK(e, pd_shared_memory_destroy(r1, NULL, e->st));
  OK(e, pd_session_close(q, NULL, e->st));
  pd_session_delete(q);

  /* Without a quota: half the physical memory per session. Sparse objects
   * map for free, which is what made the limit necessary. */
  const uint64_t half = phys_half();
  pd_session *a = new_session(e, 0, true, 0), *b = new_session(e, 0, true, 0);
  char big[128], fits[128], small[128];
  make_object(big, sizeof big, "big", (size_t)half + 4096, 0600);
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED, register_whole(e, a, big, "big", &r1));
  snprintf(msg, sizeof msg,
           "registering %" PRIu64
           " more bytes of shared memory would exceed the session's "
           "limit of %" PRIu64
           " bytes (half the machine's physical memory): the session has "
           "0 bytes in 0 regions registered",
           half + 4096, half);
  ASSERT_MSG_HAS(e, msg);
  /* Per daemon: one session holds all but 8 KiB of it, so 16 KiB more in
   * another session is refused; once the first region goes, it fits. */
  make_object(fits, sizeof fits, "fits", (size_t)half - 8192, 0600);
  make_object(small, sizeof small, "small16k", 16384, 0600);
  /* A byte_size larger than both the limit and the object: the object's
   * size is what is wrong, not the limit. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(a, small, "toolarge", half + 4096,
                                        false, &r2, NULL, e->st));
  snprintf(msg, sizeof msg, "holds 16384 bytes; byte_size is %" PRIu64,
           half + 4096);
  ASSERT_MSG_HAS(e, msg);
  assert_null(strstr(pd_status_message(e->st), "physical memory"));
  OK(e, register_whole(e, a, fits, "fits", &r1));
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              register_whole(e, b, small, "small", &r2));
  snprintf(
      msg, sizeof msg,
      "registering 16384 more bytes of shared memory would exceed paradevd's "
      "limit of "
      "%" PRIu64
      " bytes for all sessions together (half the machine's physical memory): "
      "%" PRIu64 " bytes in 1 region is registered",
      half, half - 8192);
  ASSERT_MSG_HAS(e, msg);
  OK(e, pd_shared_memory_destroy(r1, NULL, e->st));
  OK(e, register_whole(e, b, small, "small", &r2));
  OK(e, pd_shared_memory_destroy(r2, NULL, e->st));
  /* The daemon is healthy and serves on. */
  pd_serving_status hs = PD_SERVING_UNKNOWN;
  OK(e, pd_client_health(e->c, NULL, &hs, NULL, e->st));
  assert_int_equal(hs, PD_SERVING);
  shm_unlink(big);
  shm_unlink(fits);
  shm_unlink(small);
  OK(e, pd_session_close(a, NULL, e->st));
  OK(e, pd_session_close(b, NULL, e->st));
  pd_session_delete(a);
  pd_session_delete(b);
}

/* --- unregistering under transfers ---------------------------------------------------------------- */

#define BW_SIDE 384 /* busy work: float32 matrices of BW_SIDE x BW_SIDE */

/* Queues about `seconds` of device work in session s: a chain of MatMuls
 * x[i+1] = x[i] W, where W (id first_id) has every entry 1 / BW_SIDE (so the
 * values stay 1 / BW_SIDE), each link deleted once the next is queued. The
 * time per link is measured first, on this daemon. Returns the id of the
 * last link, most likely not computed yet. */
static uint64_t busy_work(env *e, pd_session *s, uint64_t first_id,
                          double seconds) {
  static float w[BW_SIDE * BW_SIDE];
  for (int i = 0; i < BW_SIDE * BW_SIDE; i++) w[i] = 1.0f / BW_SIDE;
  int64_t dims[2] = {BW_SIDE, BW_SIDE};
  OK(e, pd_upload(s, first_id, PD_FLOAT32, dims, 2, w, sizeof w,
                  pd_layout_mirrored(), NULL, NULL, e->st));
  uint64_t prev = first_id, id = first_id;
  double per = 0;
  for (int round = 0; round < 2; round++) {
    int n = round == 0 ? 8 : 1;
    if (round == 1) n = (int)(seconds / per) + 1;
    double t0 = pdt_now();
    for (int i = 0; i < n; i++) {
      uint64_t in[2] = {prev, first_id};
      id++;
      OK(e, pd_execute(s, "MatMul", in, 2, NULL, &id, 1, NULL, NULL, e->st));
      if (prev != first_id) OK(e, pd_delete(s, &prev, 1, NULL, e->st));
      prev = id;
    }
    if (round == 0) {
      OK(e, pd_sync(s, &id, 1, NULL, NULL, e->st));
      per = (pdt_now() - t0) / n;
    }
  }
  return id;
}

typedef struct dl_arg {
  pd_session *s;
  uint64_t id;
  pd_shared_memory *r;
  pd_code rc;
  char msg[600];
  atomic_int done;
} dl_arg;

static void *dl_main(void *p) {
  dl_arg *a = p;
  pd_status *st = pd_status_new();
  a->rc = pd_download_to_shared_memory(a->s, a->id, pd_layout_component(0),
                                       a->r, 0, NULL, NULL, NULL, st);
  snprintf(a->msg, sizeof a->msg, "%s", pd_status_message(st));
  pd_status_delete(st);
  atomic_store(&a->done, 1);
  return NULL;
}

/* A DownloadToSharedMemory waits for a tensor still being computed when its
 * region is unregistered (or its session closed): Unregister returns at once,
 * the daemon has unmapped the object by then, and the download ends with
 * CANCELLED without writing a byte. The daemon logs (rpc=debug) when a
 * download starts to wait; should the tensor be computed before that, the
 * test tries again with twice the work. */
static void unregister_under_waiting_download(env *e, pdt_daemon *dd,
                                              pd_client *c,
                                              bool close_session) {
  const size_t bytes = (size_t)BW_SIDE * BW_SIDE * 4;
  for (int attempt = 0;; attempt++) {
    if (attempt == 5)
      fail_msg("the download never found its tensor still being computed");
    pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
    so.keep_alive = true;
    pd_session *s = pd_session_new(c, &so, NULL, e->st);
    assert_non_null(s);
    char key[128];
    make_object(key, sizeof key, "waiting", HDR + bytes, 0600);
    int fd = shm_open(key, O_RDWR, 0);
    assert_true(fd >= 0);
    uint8_t *m =
        mmap(NULL, HDR + bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(m != MAP_FAILED);
    pd_shared_memory *r = NULL;
    OK(e,
       pd_shared_memory_register(s, key, "waiting", 0, true, &r, NULL, e->st));
    uint64_t first = 1000000u * (uint64_t)(attempt + 1);
    uint64_t last = busy_work(e, s, first, 2.0 * (1 << attempt));
    dl_arg a = {s, last, r, PD_OK, "", 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, dl_main, &a), 0);
    char line[200];
    snprintf(line, sizeof line,
             "DownloadToSharedMemory of tensor %" PRIu64
             " into region \"waiting\" waits",
             last);
    double until = pdt_now() + 120;
    while (!pdt_log_has(dd, line) && !atomic_load(&a.done) && pdt_now() < until)
      usleep(2000);
    bool waited = pdt_log_has(dd, line);
    if (waited) {
      /* The library is done with `r` once the request is sent, so the
       * region may go while the call is in flight. */
      if (close_session)
        OK(e, pd_session_close(s, NULL, e->st));
      else
        OK(e, pd_shared_memory_destroy(r, NULL, e->st));
      /* Unmapped at once, though the download still holds the region. */
      assert_false(daemon_maps(dd->pid, key));
      memset(m + HDR, 0x5A, bytes);
    }
    pthread_join(th, NULL);
    if (close_session || !waited)
      OK(e, pd_shared_memory_destroy(r, NULL, e->st));
    pd_code rc = a.rc;
    bool intact = true;
    for (size_t i = 0; i < bytes && waited; i++)
      intact = intact && m[HDR + i] == 0x5A;
    munmap(m, HDR + bytes);
    shm_unlink(key);
    if (!close_session) OK(e, pd_session_close(s, NULL, e->st));
    pd_session_delete(s);
    /* OK: the tensor was computed and copied before the unregistration
     * (allowed, the copy was running): again, with more work. */
    if (!waited || rc == PD_OK) continue;
    if (rc != PD_CANCELLED)
      fail_msg("the waiting download: expected CANCELLED, got %s: %s",
               pd_code_name(rc), a.msg);
    /* A closed session may also drop the queued links, whose CANCELLED
     * then comes first; either way nothing was written. */
    const char *want =
        close_session
            ? "shared memory region \"waiting\" was unregistered (its session "
              "ended) before the download could write it; nothing was written"
            : "shared memory region \"waiting\" was unregistered before the "
              "download could write it; nothing was written";
    if (!strstr(a.msg, want) && !(close_session && strstr(a.msg, "session")))
      fail_msg("message \"%s\" does not contain \"%s\"", a.msg, want);
    if (!intact)
      fail_msg(
          "the daemon wrote into the object after the region was unregistered");
    return;
  }
}

/* One device: with several, a device that runs far ahead of its peers keeps
 * each link of busy_work's chain until every device has run its consumer
 * (the engine frees a component once the op ran on all devices), and on a
 * loaded 2-core machine ~113 links of drift filled MEM_LIMIT. */
static void daemon_start_debug(pdt_daemon *d, const char *prefix) {
  char mem[32];
  snprintf(mem, sizeof(mem), "%u", MEM_LIMIT);
  const char *extra[] = {"--devices",
                         "1",
                         "--memory-limit",
                         mem,
                         "--default-memory-quota",
                         "unlimited",
                         "--grace-ms",
                         "2000",
                         "--log",
                         "info,rpc=debug",
                         NULL};
  pdt_daemon_start(d, paradevd_path, prefix, false, extra);
}

/* The daemon with rpc=debug: started by the test, stopped by its teardown
 * (which runs also when the test failed half-way). */
static pdt_daemon D_wait;
static bool d_wait_up;

static int stop_d_wait(void **state) {
  (void)state;
  if (!d_wait_up) return 0;
  d_wait_up = false;
  int rc = pdt_daemon_stop(&D_wait);
  bool san = D_wait.log && (strstr(D_wait.log, "AddressSanitizer") ||
                            strstr(D_wait.log, "runtime error"));
  if (rc != 0 || san)
    fprintf(stderr, "paradevd (rpc=debug) exited with %d%s; log:\n%s\n", rc,
            san ? " and a sanitizer report" : "", D_wait.log ? D_wait.log : "");
  free(D_wait.log);
  return rc != 0 || san ? -1 : 0;
}

static void test_unregister_waiting_download(void **state) {
  env *e = *state;
  daemon_start_debug(&D_wait, "pdshm-wait");
  d_wait_up = true;
  pd_client *c = pd_client_new(D_wait.unix_target, NULL, e->st);
  assert_non_null(c);
  unregister_under_waiting_download(e, &D_wait, c, false);
  unregister_under_waiting_download(e, &D_wait, c, true);
  pd_client_delete(c);
}

/* Threads download a 2 MiB value, each into its own slice of a region, over
 * and over, until the session is closed under them. Closing waits for the
 * copies running: once it has returned, the daemon writes nothing more (the
 * test overwrites the region then, and finds it unchanged after the threads
 * have ended). */
#define UC_THREADS 3
#define UC_BYTES ((size_t)2 << 20)

typedef struct uc_arg {
  pd_session *s;
  pd_shared_memory *r;
  int t;
  atomic_int rounds;
  atomic_int *stop;
  pd_code rc;
  char msg[600];
} uc_arg;

static void *uc_main(void *p) {
  uc_arg *a = p;
  pd_status *st = pd_status_new();
  while (!atomic_load(a->stop)) {
    pd_code rc = pd_download_to_shared_memory(
        a->s, 1, pd_layout_component(a->t % NDEV), a->r,
        (uint64_t)a->t * UC_BYTES, NULL, NULL, NULL, st);
    if (rc != PD_OK) {
      a->rc = rc;
      snprintf(a->msg, sizeof a->msg, "%s", pd_status_message(st));
      break;
    }
    atomic_fetch_add(&a->rounds, 1);
  }
  pd_status_delete(st);
  return NULL;
}

static void test_close_under_copies(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, 0, true, 0);
  pd_shared_memory *r = NULL;
  OK(e, pd_shared_memory_create(s, UC_THREADS * UC_BYTES, 0, &r, NULL, e->st));
  uint8_t *data = pd_shared_memory_data(r);
  for (size_t i = 0; i < UC_BYTES; i++) data[i] = (uint8_t)(i * 31 + 7);
  int64_t dims[1] = {(int64_t)UC_BYTES};
  OK(e, pd_upload_from_shared_memory(s, 1, PD_UINT8, dims, 1, r, 0,
                                     pd_layout_mirrored(), NULL, NULL, e->st));
  atomic_int stop;
  atomic_init(&stop, 0);
  uc_arg a[UC_THREADS];
  pthread_t th[UC_THREADS];
  for (int t = 0; t < UC_THREADS; t++) {
    memset(&a[t], 0, sizeof a[t]);
    a[t].s = s;
    a[t].r = r;
    a[t].t = t;
    a[t].stop = &stop;
    atomic_init(&a[t].rounds, 0);
    assert_int_equal(pthread_create(&th[t], NULL, uc_main, &a[t]), 0);
  }
  for (int t = 0; t < UC_THREADS; t++)
    while (atomic_load(&a[t].rounds) < 2 && a[t].rc == PD_OK) usleep(1000);
  for (int t = 0; t < UC_THREADS; t++)
    if (a[t].rc != PD_OK)
      fail_msg("thread %d before the close: %s", t, a[t].msg);
  /* Every round so far wrote the value: check one slice. */
  OK(e, pd_session_close(s, NULL, e->st));
  memset(data, 0x5A, UC_THREADS * UC_BYTES);
  atomic_store(&stop, 1);
  for (int t = 0; t < UC_THREADS; t++) pthread_join(th[t], NULL);
  for (size_t i = 0; i < UC_THREADS * UC_BYTES; i++)
    if (data[i] != 0x5A)
      fail_msg("byte %zu of the region changed after CloseSession had returned",
               i);
  for (int t = 0; t < UC_THREADS; t++)
    if (a[t].rc != PD_OK && a[t].rc != PD_FAILED_PRECONDITION &&
        a[t].rc != PD_NOT_FOUND && a[t].rc != PD_CANCELLED)
      fail_msg("thread %d after the close: %s: %s", t, pd_code_name(a[t].rc),
               a[t].msg);
  assert_false(daemon_maps(D.pid, pd_shared_memory_key(r)));
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  pd_session_delete(s);
}

/* --- a full /dev/shm ----------------------------------------------------------------------------- */

/* In a child: a private mount namespace whose /dev/shm is a tmpfs of
 * FULL_SHM bytes; then this program again, with --full-dev-shm. NULL, or
 * what could not be done. */
#define FULL_SHM ((size_t)4 << 20)

static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY);
  if (fd < 0) return -1;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text) ? 0 : -1;
}

static const char *enter_small_dev_shm(const char *uid_map, const char *gid_map,
                                       bool root) {
  if (root) {
    if (unshare(CLONE_NEWNS) != 0) return "unshare(CLONE_NEWNS)";
  } else {
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
      return "unshare(CLONE_NEWUSER|CLONE_NEWNS)";
    if (write_file("/proc/self/setgroups", "deny") != 0 ||
        write_file("/proc/self/uid_map", uid_map) != 0 ||
        write_file("/proc/self/gid_map", gid_map) != 0)
      return "writing the user namespace's id maps";
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
    return "making / private";
  if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
            "size=4m,mode=1777") != 0)
    return "mounting a 4 MiB tmpfs on /dev/shm";
  return NULL;
}

static void test_full_dev_shm(void **state) {
  (void)state;
  char uid_map[64], gid_map[64];
  snprintf(uid_map, sizeof uid_map, "0 %u 1", (unsigned)geteuid());
  snprintf(gid_map, sizeof gid_map, "0 %u 1", (unsigned)getegid());
  bool root = geteuid() == 0;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    const char *why = enter_small_dev_shm(uid_map, gid_map, root);
    if (why) {
      int err = errno;
      fprintf(stderr, "SKIP test_full_dev_shm: %s: %s\n", why, strerror(err));
      _exit(77);
    }
    execl("/proc/self/exe", "test_shm", "--full-dev-shm", paradevd_path,
          (char *)NULL);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    print_message(
        "SKIP: no private mount namespace here, so no small /dev/shm to "
        "fill\n");
    return;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg(
        "the checks in a private 4 MiB /dev/shm failed (%s %d; their output is "
        "above)",
        WIFEXITED(status) ? "exit status" : "signal",
        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

static int dev_shm_entries(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) fail_msg("opendir /dev/shm: %s", strerror(errno));
  int n = 0;
  for (struct dirent *de; (de = readdir(d));)
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

/* A shm object holding `bytes` reserved bytes (posix_fallocate). */
static void filler(const char *key, size_t bytes) {
  int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) fail_msg("shm_open %s: %s", key, strerror(errno));
  int err = posix_fallocate(fd, 0, (off_t)bytes);
  close(fd);
  if (err)
    fail_msg("posix_fallocate of %zu bytes for %s: %s", bytes, key,
             strerror(err));
}

static uint64_t dev_shm_free(void) {
  struct statvfs v;
  if (statvfs("/dev/shm", &v) != 0)
    fail_msg("statvfs /dev/shm: %s", strerror(errno));
  return (uint64_t)v.f_bavail * v.f_frsize;
}

/* Runs in the child, where /dev/shm is FULL_SHM bytes of tmpfs: creating a
 * region that does not fit fails with RESOURCE_EXHAUSTED naming /dev/shm
 * (never SIGBUS in the program), and leaves no object; a sparse region
 * whose pages cannot be allocated makes the daemon's copies fail with
 * RESOURCE_EXHAUSTED saying /dev/shm is out of space, not that the object
 * was truncated; a truncated one still says truncated. */
static void test_in_full_dev_shm(void **state) {
  env *e = *state;
  pd_session *s = e->s;
  struct statvfs v;
  assert_int_equal(statvfs("/dev/shm", &v), 0);
  assert_int_equal((uint64_t)v.f_blocks * v.f_frsize, FULL_SHM);
  assert_int_equal(dev_shm_entries(), 0);
  pd_shared_memory *r = NULL;
  /* Larger than all of /dev/shm. */
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_shared_memory_create(s, 8 << 20, 0, &r, NULL, e->st));
  ASSERT_MSG_HAS(
      e,
      "no room in /dev/shm for a region of 8388608 bytes of data and the "
      "64-byte header: shared memory object /paradev-");
  ASSERT_MSG_HAS(
      e,
      "needs 8388672 bytes and /dev/shm (tmpfs) has 4194304 of its 4194304 "
      "bytes free");
  assert_int_equal(dev_shm_entries(), 0);
  /* Larger than what is left of it. */
  filler("/pdtest-filler", 3 << 20);
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_shared_memory_create(s, 2 << 20, 0, &r, NULL, e->st));
  ASSERT_MSG_HAS(
      e,
      "needs 2097216 bytes and /dev/shm (tmpfs) has 1048576 of its 4194304 "
      "bytes free");
  assert_int_equal(dev_shm_entries(),
                   1); /* the filler: the object was unlinked */
  /* What fits is reserved whole: writing all of it cannot fault. */
  OK(e, pd_shared_memory_create(s, 512 << 10, 0, &r, NULL, e->st));
  uint8_t *data = pd_shared_memory_data(r);
  memset(data, 0x11, 512 << 10);
  int64_t d16[1] = {16};
  OK(e,
     pd_upload_from_shared_memory(s, 9, PD_UINT8, d16, 1, r, (512 << 10) - 16,
                                  pd_layout_mirrored(), NULL, NULL, e->st));
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  shm_unlink("/pdtest-filler");

  /* A sparse object of 1 MiB of data (only the header's page reserved, by
   * the library), then /dev/shm filled to the last byte. */
  const size_t n = (size_t)1 << 20;
  char key[128], key2[128];
  make_object(key, sizeof key, "sparse", HDR + n, 0600);
  OK(e, pd_shared_memory_register(s, key, "sparse", 0, true, &r, NULL, e->st));
  uint8_t *want = malloc(n);
  for (size_t i = 0; i < n; i++) want[i] = (uint8_t)(i * 13 + 1);
  int64_t dn[1] = {(int64_t)n};
  OK(e, pd_upload(s, 1, PD_UINT8, dn, 1, want, n, pd_layout_mirrored(), NULL,
                  NULL, e->st));
  filler("/pdtest-filler2", dev_shm_free());
  assert_int_equal(dev_shm_free(), 0);
  /* The library reserves the header's page before writing it. */
  make_object(key2, sizeof key2, "sparse2", HDR + 4096, 0600);
  EXPECT_CODE(
      e, PD_RESOURCE_EXHAUSTED,
      pd_shared_memory_register(s, key2, "sparse2", 0, true, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "no room in /dev/shm for the region's header");
  shm_unlink(key2);
  /* The daemon's copies touch pages tmpfs cannot allocate. */
  EXPECT_CODE(
      e, PD_RESOURCE_EXHAUSTED,
      pd_upload_from_shared_memory(s, 2, PD_UINT8, dn, 1, r, 0,
                                   pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "shared memory region \"sparse\" (");
  ASSERT_MSG_HAS(e, ") could not be read: /dev/shm (tmpfs) is out of space");
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, 0,
                                           NULL, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, ") could not be written: /dev/shm (tmpfs) is out of space");
  /* With room again, the same download goes through. */
  shm_unlink("/pdtest-filler2");
  OK(e, pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, 0, NULL,
                                     NULL, NULL, e->st));
  pdt_assert_bytes(pd_shared_memory_data(r), want, n,
                   "the download once /dev/shm had room");
  /* Truncation is still called truncation. */
  int fd = shm_open(key, O_RDWR, 0);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  close(fd);
  EXPECT_CODE(e, PD_FAILED_PRECONDITION,
              pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, 0,
                                           NULL, NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "was truncated");
  pd_server_info *info = pd_client_get_server_info(e->c, NULL, e->st);
  assert_non_null(info);
  pd_server_info_delete(info);
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){1, 9}, 2, NULL, e->st));
  shm_unlink(key);
  free(want);
}

/* --- the daemon's user cannot open the object ---------------------------------------------------- */

static void test_daemon_cannot_open(void **state) {
  env *e = *state;
  pdt_daemon d2;
  pdt_daemon *dd = &D;
  bool second = false;
  if (geteuid() == 0) {
    /* root opens anything: start a daemon without the capabilities that
     * bypass file permissions (dropped from this process's bounding set, so
     * the exec'd daemon never gets them). */
    if (prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0 ||
        prctl(PR_CAPBSET_DROP, CAP_DAC_READ_SEARCH, 0, 0, 0) != 0) {
      print_message(
          "SKIP part: cannot drop CAP_DAC_OVERRIDE (%s); running as root, the "
          "daemon could open any object\n",
          strerror(errno));
      return;
    }
    daemon_start(&d2, "pdshm2");
    dd = &d2;
    second = true;
  }
  pd_client *c = pd_client_new(dd->unix_target, NULL, e->st);
  assert_non_null(c);
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  pd_session *s = pd_session_new(c, &so, NULL, e->st);
  assert_non_null(s);
  char key[128];
  make_object(key, sizeof key, "noaccess", 4096, 0000);
  pd_shared_memory *r = NULL;
  EXPECT_CODE(
      e, PD_PERMISSION_DENIED,
      pd_shared_memory_register(s, key, NULL, 4096, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "could not open shared memory object");
  ASSERT_MSG_HAS(e, key);
  ASSERT_MSG_HAS(e, "must be readable and writable by the daemon's user");
  /* With the mode fixed (and the header written) it registers. */
  int fd = shm_open(key, O_RDWR, 0);
  assert_true(fd >= 0);
  assert_int_equal(fchmod(fd, 0600), 0);
  close(fd);
  OK(e, pd_shared_memory_register(s, key, NULL, 4096, true, &r, NULL, e->st));
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
  shm_unlink(key);
  OK(e, pd_session_close(s, NULL, e->st));
  pd_session_delete(s);
  pd_client_delete(c);
  if (second) {
    int rc = pdt_daemon_stop(&d2);
    if (rc != 0)
      fail_msg("second paradevd exited with %d; log:\n%s", rc, d2.log);
    bool san = d2.log && (strstr(d2.log, "AddressSanitizer") ||
                          strstr(d2.log, "runtime error"));
    if (san)
      fail_msg("sanitizer report in the second daemon's log:\n%s", d2.log);
    free(d2.log);
  }
}

int main(int argc, char **argv) {
  /* --full-dev-shm: the child of test_full_dev_shm, in its own /dev/shm. */
  bool full = argc == 3 && strcmp(argv[1], "--full-dev-shm") == 0;
  if (argc != 2 && !full) {
    fprintf(stderr, "usage: %s PARADEVD\n", argv[0]);
    return 2;
  }
  paradevd_path = argv[argc - 1];
  signal(SIGPIPE, SIG_IGN);
  daemon_start(&D, full ? "pdshm-full" : "pdshm");
  const struct CMUnitTest full_tests[] = {
      cmocka_unit_test(test_in_full_dev_shm)};
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trips),
      cmocka_unit_test(test_region_end),
      cmocka_unit_test(test_register_errors),
      cmocka_unit_test(test_second_session),
      cmocka_unit_test(test_tensor_errors),
      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_session_end_unmaps),
      cmocka_unit_test(test_concurrent),
      cmocka_unit_test(test_byte_limits),
      cmocka_unit_test_teardown(test_unregister_waiting_download, stop_d_wait),
      cmocka_unit_test(test_close_under_copies),
      cmocka_unit_test(test_full_dev_shm),
      cmocka_unit_test(test_daemon_cannot_open),
  };
  int failed =
      full ? cmocka_run_group_tests_name("shared memory in a full /dev/shm",
                                         full_tests, setup, teardown)
           : cmocka_run_group_tests_name("shared memory transfers", tests,
                                         setup, teardown);
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
  return failed ? 1 : 0;
}
