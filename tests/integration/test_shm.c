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
 * it in the daemon (read from /proc/PID/maps).
 *
 * Usage: test_shm PARADEVD
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
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
  const char *extra[] = {"--devices", ndev, "--memory-limit", mem, "--grace-ms", "2000", NULL};
  pdt_daemon_start(d, paradevd_path, prefix, false, extra);
}

static pd_session *new_session(env *e, uint32_t lease, bool keep_alive, uint64_t quota) {
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
    case PD_FLOAT32: { float x = (float)v * 0.25f - 9.5f; memcpy(p, &x, 4); break; }
    case PD_FLOAT64: { double x = (double)v * 0.125 - 1e6; memcpy(p, &x, 8); break; }
    case PD_FLOAT16: { uint16_t x = (uint16_t)(0x3C00 + (v & 0x3ff)); memcpy(p, &x, 2); break; }
    case PD_BFLOAT16: { uint16_t x = (uint16_t)(0x3F80 + (v & 0x7f)); memcpy(p, &x, 2); break; }
    case PD_INT32: { int32_t x = (int32_t)(v * 1000 - 123456); memcpy(p, &x, 4); break; }
    case PD_INT64: { int64_t x = (int64_t)v * 10000000000LL - 7; memcpy(p, &x, 8); break; }
    case PD_UINT8: { uint8_t x = (uint8_t)(v * 13); memcpy(p, &x, 1); break; }
    case PD_BOOL: { uint8_t x = (uint8_t)(v % 3 == 0); memcpy(p, &x, 1); break; }
    default: fail_msg("dtype %d", (int)dt);
  }
}

static void fill(pd_dtype dt, void *buf, size_t n, int seed) {
  size_t es = pd_dtype_size(dt);
  for (size_t i = 0; i < n; i++) put_elem(dt, (char *)buf + i * es, i, seed);
}

static void assert_bytes(const void *got, const void *want, size_t n, const char *what) {
  const uint8_t *g = got, *w = want;
  for (size_t i = 0; i < n; i++)
    if (g[i] != w[i])
      fail_msg("%s: byte %zu is 0x%02x, expected 0x%02x", what, i, g[i], w[i]);
}

static void assert_shape(const pd_tensor_info *t, int rank, const int64_t *dims) {
  assert_int_equal(t->rank, rank);
  for (int i = 0; i < rank; i++) assert_int_equal(t->dims[i], dims[i]);
}

/* Rows [r0, r0+nr) and columns [c0, c0+nc) of a row-major rows x cols value. */
static void block(const uint8_t *src, size_t es, int64_t cols, int64_t r0, int64_t nr,
                  int64_t c0, int64_t nc, uint8_t *dst) {
  for (int64_t r = 0; r < nr; r++)
    memcpy(dst + (size_t)(r * nc) * es, src + (size_t)((r0 + r) * cols + c0) * es,
           (size_t)nc * es);
}

/* --- round trips --------------------------------------------------------------- */

static const pd_dtype all_dtypes[] = {PD_FLOAT32, PD_FLOAT64, PD_FLOAT16, PD_BFLOAT16,
                                      PD_INT32,   PD_INT64,   PD_UINT8,   PD_BOOL};

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
    const uint64_t in_off = 1 + k, out_off = 4096 + 3 * k; /* unaligned on purpose */
    char what[96];

    /* MIRRORED [5, 3]: the same value on every component. */
    int64_t md[2] = {5, 3};
    fill(dt, want, 15, (int)k);
    memcpy(data + in_off, want, 15 * es);
    pd_tensor_info ti;
    uint64_t mid = id++;
    OK(e, pd_upload_from_shared_memory(s, mid, dt, md, 2, r, in_off, pd_layout_mirrored(), &ti,
                                       NULL, e->st));
    assert_int_equal(ti.dtype, dt);
    assert_shape(&ti, 2, md);
    /* Independently, through gRPC's Download. */
    OK(e, pd_download(s, mid, pd_layout_mirrored(), got, sizeof got, NULL, NULL, NULL, e->st));
    snprintf(what, sizeof what, "%s mirrored, gRPC download", pd_dtype_name(dt));
    assert_bytes(got, want, 15 * es, what);
    for (int c = 0; c < NDEV; c++) {
      memset(data + out_off, 0xAB, 15 * es + 1);
      size_t nb = 0;
      OK(e, pd_download_to_shared_memory(s, mid, pd_layout_component(c), r, out_off, &ti, &nb,
                                         NULL, e->st));
      assert_int_equal(nb, 15 * es);
      assert_shape(&ti, 2, md);
      snprintf(what, sizeof what, "%s mirrored, component %d", pd_dtype_name(dt), c);
      assert_bytes(data + out_off, want, 15 * es, what);
      assert_int_equal(data[out_off + 15 * es], 0xAB); /* nothing past the value */
    }

    /* SHARDED along axis 0, [7, 3] on 4 devices: rows 2, 2, 2, 1. */
    int64_t sd[2] = {7, 3};
    const int64_t rows[NDEV] = {2, 2, 2, 1}, row0[NDEV] = {0, 2, 4, 6};
    fill(dt, want, 21, (int)k + 50);
    memcpy(data + in_off, want, 21 * es);
    uint64_t sid = id++;
    OK(e, pd_upload_from_shared_memory(s, sid, dt, sd, 2, r, in_off, pd_layout_sharded(0), &ti,
                                       NULL, e->st));
    assert_shape(&ti, 2, (int64_t[]){-1, 3});
    for (int c = 0; c < NDEV; c++) {
      OK(e, pd_download_to_shared_memory(s, sid, pd_layout_component(c), r, out_off, &ti, NULL,
                                         NULL, e->st));
      assert_shape(&ti, 2, (int64_t[]){rows[c], 3});
      block(want, es, 3, row0[c], rows[c], 0, 3, part);
      snprintf(what, sizeof what, "%s sharded axis 0, component %d", pd_dtype_name(dt), c);
      assert_bytes(data + out_off, part, (size_t)rows[c] * 3 * es, what);
    }
    size_t nb = 0;
    OK(e, pd_download_to_shared_memory(s, sid, pd_layout_sharded(0), r, out_off, &ti, &nb, NULL,
                                       e->st));
    assert_int_equal(nb, 21 * es);
    assert_shape(&ti, 2, sd);
    snprintf(what, sizeof what, "%s sharded axis 0, concatenated", pd_dtype_name(dt));
    assert_bytes(data + out_off, want, 21 * es, what);

    /* SHARDED along axis 1, [2, 5]: columns 2, 1, 1, 1. */
    int64_t cd[2] = {2, 5};
    const int64_t cols[NDEV] = {2, 1, 1, 1}, col0[NDEV] = {0, 2, 3, 4};
    fill(dt, want, 10, (int)k + 90);
    memcpy(data + in_off, want, 10 * es);
    uint64_t cid = id++;
    OK(e, pd_upload_from_shared_memory(s, cid, dt, cd, 2, r, in_off, pd_layout_sharded(1), NULL,
                                       NULL, e->st));
    for (int c = 0; c < NDEV; c++) {
      OK(e, pd_download_to_shared_memory(s, cid, pd_layout_component(c), r, out_off, &ti, NULL,
                                         NULL, e->st));
      assert_shape(&ti, 2, (int64_t[]){2, cols[c]});
      block(want, es, 5, 0, 2, col0[c], cols[c], part);
      snprintf(what, sizeof what, "%s sharded axis 1, component %d", pd_dtype_name(dt), c);
      assert_bytes(data + out_off, part, (size_t)(2 * cols[c]) * es, what);
    }
    OK(e, pd_download_to_shared_memory(s, cid, pd_layout_sharded(1), r, out_off, NULL, NULL,
                                       NULL, e->st));
    snprintf(what, sizeof what, "%s sharded axis 1, concatenated", pd_dtype_name(dt));
    assert_bytes(data + out_off, want, 10 * es, what);

    /* PER_COMPONENT [1, 3], [2, 3], [0, 3], [3, 3]: one after another. */
    int64_t d0[2] = {1, 3}, d1[2] = {2, 3}, d2[2] = {0, 3}, d3[2] = {3, 3};
    const int64_t *pd[NDEV] = {d0, d1, d2, d3};
    const int ranks[NDEV] = {2, 2, 2, 2};
    const size_t n_el[NDEV] = {3, 6, 0, 9};
    fill(dt, want, 18, (int)k + 130);
    memcpy(data + in_off, want, 18 * es);
    uint64_t pid_ = id++;
    OK(e, pd_upload_components_from_shared_memory(s, pid_, dt, NDEV, pd, ranks, r, in_off, &ti,
                                                  NULL, e->st));
    assert_shape(&ti, 2, (int64_t[]){-1, 3});
    pd_tensor_info infos[NDEV];
    nb = 0;
    memset(data + out_off, 0, 18 * es);
    OK(e, pd_download_components_to_shared_memory(s, pid_, NDEV, r, out_off, infos, &nb, NULL,
                                                  e->st));
    assert_int_equal(nb, 18 * es);
    snprintf(what, sizeof what, "%s per component", pd_dtype_name(dt));
    assert_bytes(data + out_off, want, 18 * es, what);
    /* And each component through gRPC. */
    uint8_t c0[64], c1[64], c2[8], c3[128];
    void *const bufs[NDEV] = {c0, c1, c2, c3};
    const size_t caps[NDEV] = {sizeof c0, sizeof c1, sizeof c2, sizeof c3};
    OK(e, pd_download_components(s, pid_, NDEV, bufs, caps, NULL, NULL, e->st));
    size_t at = 0;
    for (int c = 0; c < NDEV; c++) {
      assert_shape(&infos[c], 2, pd[c]);
      snprintf(what, sizeof what, "%s per component, gRPC component %d", pd_dtype_name(dt), c);
      assert_bytes(bufs[c], want + at, n_el[c] * es, what);
      at += n_el[c] * es;
    }

    /* gRPC's Upload, then a download into the region. */
    fill(dt, want, 15, (int)k + 170);
    uint64_t gid = id++;
    OK(e, pd_upload(s, gid, dt, md, 2, want, 15 * es, pd_layout_mirrored(), NULL, NULL, e->st));
    OK(e, pd_download_to_shared_memory(s, gid, pd_layout_mirrored(), r, out_off, NULL, NULL,
                                       NULL, e->st));
    snprintf(what, sizeof what, "%s gRPC upload, region download", pd_dtype_name(dt));
    assert_bytes(data + out_off, want, 15 * es, what);
  }

  /* A value through an op: 2 * x computed by Add on every device. */
  float x[6] = {1.5f, -2.25f, 3.0f, 0.0f, 1e6f, -7.125f}, want2[6];
  for (int i = 0; i < 6; i++) want2[i] = 2.0f * x[i];
  memcpy(data, x, sizeof x);
  int64_t xd[1] = {6};
  OK(e, pd_upload_from_shared_memory(s, 1, PD_FLOAT32, xd, 1, r, 0, pd_layout_mirrored(), NULL,
                                     NULL, e->st));
  uint64_t in[2] = {1, 1}, out = 2;
  OK(e, pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, e->st));
  for (int c = 0; c < NDEV; c++) {
    OK(e, pd_download_to_shared_memory(s, 2, pd_layout_component(c), r, 100, NULL, NULL, NULL,
                                       e->st));
    float y[6];
    memcpy(y, data + 100, sizeof y);
    for (int i = 0; i < 6; i++)
      if (y[i] != want2[i]) fail_msg("component %d element %d: %g, expected %g", c, i,
                                     (double)y[i], (double)want2[i]);
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
  OK(e, pd_upload_from_shared_memory(s, 1, PD_UINT8, n16, 1, r, D_ - 16, pd_layout_mirrored(),
                                     NULL, NULL, e->st));
  uint8_t got[16];
  OK(e, pd_download(s, 1, pd_layout_component(3), got, sizeof got, NULL, NULL, NULL, e->st));
  for (int i = 0; i < 16; i++) assert_int_equal(got[i], 200 + i);
  /* One byte past the end. */
  EXPECT_CODE(e, PD_OUT_OF_RANGE,
              pd_upload_from_shared_memory(s, 2, PD_UINT8, n16, 1, r, D_ - 15,
                                           pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "16 bytes at data offset 3985");
  ASSERT_MSG_HAS(e, "holds 4000 bytes of data");
  /* No tensor was made under id 2. */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download(s, 2, pd_layout_mirrored(), got, sizeof got, NULL, NULL, NULL, e->st));
  /* Downloads: the exact end works, a byte past it writes nothing. */
  memset(data + D_ - 16, 0, 16);
  OK(e, pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, D_ - 16, NULL, NULL, NULL,
                                     e->st));
  for (int i = 0; i < 16; i++) assert_int_equal(data[D_ - 16 + (size_t)i], 200 + i);
  memset(data + D_ - 16, 0x5A, 16);
  EXPECT_CODE(e, PD_OUT_OF_RANGE,
              pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, D_ - 15, NULL, NULL,
                                           NULL, e->st));
  ASSERT_MSG_HAS(e, "16 bytes at data offset 3985");
  for (int i = 0; i < 16; i++) assert_int_equal(data[D_ - 16 + (size_t)i], 0x5A);
  /* Offsets whose sum with the size overflows. */
  EXPECT_CODE(e, PD_OUT_OF_RANGE,
              pd_upload_from_shared_memory(s, 2, PD_UINT8, n16, 1, r, UINT64_MAX - 7,
                                           pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "18446744073709551608");
  EXPECT_CODE(e, PD_OUT_OF_RANGE,
              pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, UINT64_MAX, NULL,
                                           NULL, NULL, e->st));
  /* An empty value at the very end is in range. */
  int64_t n0[1] = {0};
  OK(e, pd_upload_from_shared_memory(s, 3, PD_UINT8, n0, 1, r, D_, pd_layout_mirrored(), NULL,
                                     NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){1, 3}, 2, NULL, e->st));
  OK(e, pd_shared_memory_destroy(r, NULL, e->st));
}

/* --- registration errors -------------------------------------------------------------- */

/* A fresh object of `bytes` bytes (mode 0600), closed; its key in key. */
static void make_object(char *key, size_t keylen, const char *tag, size_t bytes, mode_t mode) {
  static int n;
  snprintf(key, keylen, "/pdtest-shm-%d-%s-%d", (int)getpid(), tag, n++);
  shm_unlink(key);
  int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) fail_msg("shm_open %s: %s", key, strerror(errno));
  if (ftruncate(fd, (off_t)bytes) != 0) fail_msg("ftruncate: %s", strerror(errno));
  if (fchmod(fd, mode) != 0) fail_msg("fchmod: %s", strerror(errno));
  close(fd);
}

static void test_register_errors(void **state) {
  env *e = *state;
  pd_session *s = new_session(e, 0, true, 0);
  pd_shared_memory *r = NULL;
  /* No object under the key. */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_shared_memory_register(s, "/pdtest-shm-missing-xyz", NULL, 4096, false, &r,
                                        NULL, e->st));
  ASSERT_MSG_HAS(e, "/pdtest-shm-missing-xyz");
  /* Keys that are no POSIX shm name. */
  const char *bad_keys[] = {"pdtest-noslash", "/", "/..", "/a/b", "/a b", "/x\xc3\xa9"};
  for (size_t i = 0; i < sizeof bad_keys / sizeof bad_keys[0]; i++) {
    EXPECT_CODE(e, PD_INVALID_ARGUMENT,
                pd_shared_memory_register(s, bad_keys[i], "k", 4096, false, &r, NULL, e->st));
    ASSERT_MSG_HAS(e, "followed by 1 to 200 of A-Z a-z 0-9 . _ -");
  }
  char longkey[260];
  longkey[0] = '/';
  memset(longkey + 1, 'a', 201);
  longkey[202] = '\0';
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(s, longkey, "k", 4096, false, &r, NULL, e->st));
  char key[128];
  make_object(key, sizeof key, "small", 4096, 0600);
  /* byte_size must leave room for data past the header. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(s, key, NULL, 64, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "byte_size 64");
  /* An object smaller than byte_size. */
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(s, key, NULL, 8192, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "holds 4096 bytes; byte_size is 8192");
  /* No header (zeros) and a header with another token. */
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_shared_memory_register(s, key, NULL, 4096, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "does not carry this session's header");
  int fd = shm_open(key, O_RDWR, 0);
  uint8_t *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(m != MAP_FAILED);
  OK(e, pd_shared_memory_write_header(s, m, 4096, e->st));
  m[8 + 23] ^= 1; /* the token's last byte */
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_shared_memory_register(s, key, NULL, 4096, false, &r, NULL, e->st));
  ASSERT_MSG_HAS(e, "does not carry this session's header");
  m[8 + 23] ^= 1;
  m[40] = 1; /* the rest of the header must be zero */
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_shared_memory_register(s, key, NULL, 4096, false, &r, NULL, e->st));
  m[40] = 0;
  /* Now the header is right: a program-managed object registers. */
  OK(e, pd_shared_memory_register(s, key, "mine", 4096, false, &r, NULL, e->st));
  assert_string_equal(pd_shared_memory_name(r), "mine");
  assert_int_equal(pd_shared_memory_size(r), 4096 - HDR);
  /* Names: unique, printable, not empty, not too long. */
  pd_shared_memory *r2 = NULL;
  EXPECT_CODE(e, PD_ALREADY_EXISTS,
              pd_shared_memory_register(s, key, "mine", 4096, false, &r2, NULL, e->st));
  ASSERT_MSG_HAS(e, "\"mine\" is already registered");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(s, key, "bad\x01name", 4096, false, &r2, NULL, e->st));
  ASSERT_MSG_HAS(e, "printable ASCII");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(s, key, "", 4096, false, &r2, NULL, e->st));
  char longname[300];
  memset(longname, 'n', 299);
  longname[299] = '\0';
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_shared_memory_register(s, key, longname, 4096, false, &r2, NULL, e->st));
  ASSERT_MSG_HAS(e, "max_string_bytes = 256");
  /* 64 regions per session: "mine" and 63 more, then one too many. */
  pd_shared_memory *many[64] = {NULL};
  for (int i = 1; i < 64; i++) {
    char nm[16];
    snprintf(nm, sizeof nm, "r%d", i);
    OK(e, pd_shared_memory_register(s, key, nm, 4096, false, &many[i], NULL, e->st));
  }
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_shared_memory_register(s, key, "r64", 4096, false, &r2, NULL, e->st));
  ASSERT_MSG_HAS(e, "the limit is 64 per session");
  for (int i = 1; i < 64; i++) OK(e, pd_shared_memory_destroy(many[i], NULL, e->st));
  /* Two names on one object are two regions: dropping one leaves the
   * other working. */
  OK(e, pd_shared_memory_register(s, key, "again", 4096, false, &r2, NULL, e->st));
  pd_shared_memory *alias = NULL;
  OK(e, pd_shared_memory_register(s, key, "alias", 4096, false, &alias, NULL, e->st));
  OK(e, pd_shared_memory_destroy(r2, NULL, e->st));
  int64_t d4[1] = {4};
  OK(e, pd_upload_from_shared_memory(s, 1, PD_UINT8, d4, 1, alias, 0, pd_layout_mirrored(),
                                     NULL, NULL, e->st));
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
  OK(e, pd_upload_from_shared_memory(a, 1, PD_UINT8, d64, 1, ra, 0, pd_layout_mirrored(), NULL,
                                     NULL, e->st));
  /* B names A's region: not B's. */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_upload_from_shared_memory(b, 1, PD_UINT8, d64, 1, ra, 0, pd_layout_mirrored(),
                                           NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "no shared memory region named");
  /* B may not read A's tensors into A's region either (neither is B's). */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download_to_shared_memory(b, 1, pd_layout_mirrored(), ra, 0, NULL, NULL, NULL,
                                           e->st));
  /* B registers A's key: the header holds A's token, not B's. */
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
              pd_shared_memory_register(b, pd_shared_memory_key(ra), "stolen", 8192 + HDR, false,
                                        &rb, NULL, e->st));
  ASSERT_MSG_HAS(e, "does not carry this session's header");
  /* The same name in another session is another region. */
  OK(e, pd_shared_memory_create(b, 4096, 0, &rb, NULL, e->st));
  OK(e, pd_shared_memory_destroy(rb, NULL, e->st));
  /* A's region still works. */
  OK(e, pd_download_to_shared_memory(a, 1, pd_layout_component(2), ra, 100, NULL, NULL, NULL,
                                     e->st));
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
  /* Quota of 16 KiB: a mirrored float32 [1024] is 4 KiB on each of 4 devices. */
  pd_session *s = new_session(e, 0, true, 16384);
  pd_shared_memory *r = NULL;
  OK(e, pd_shared_memory_create(s, 1 << 16, 0, &r, NULL, e->st));
  float *f = pd_shared_memory_data(r);
  for (int i = 0; i < 1024; i++) f[i] = (float)i;
  int64_t d1024[1] = {1024}, d1025[1] = {1025};
  OK(e, pd_upload_from_shared_memory(s, 1, PD_FLOAT32, d1024, 1, r, 0, pd_layout_mirrored(), NULL,
                                     NULL, e->st));
  /* Over the quota: refused like Upload. */
  EXPECT_CODE(e, PD_RESOURCE_EXHAUSTED,
              pd_upload_from_shared_memory(s, 2, PD_FLOAT32, d1024, 1, r, 0, pd_layout_mirrored(),
                                           NULL, NULL, e->st));
  OK(e, pd_delete(s, (uint64_t[]){1}, 1, NULL, e->st));
  OK(e, pd_upload_from_shared_memory(s, 2, PD_FLOAT32, d1024, 1, r, 0, pd_layout_sharded(0), NULL,
                                     NULL, e->st));
  /* A live id, id 0, a bad dtype, a bad axis, a wrong component count. */
  EXPECT_CODE(e, PD_ALREADY_EXISTS,
              pd_upload_from_shared_memory(s, 2, PD_FLOAT32, d1024, 1, r, 0, pd_layout_mirrored(),
                                           NULL, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload_from_shared_memory(s, 0, PD_FLOAT32, d1024, 1, r, 0, pd_layout_mirrored(),
                                           NULL, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload_from_shared_memory(s, 3, (pd_dtype)99, d1024, 1, r, 0,
                                           pd_layout_mirrored(), NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "dtype 99");
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload_from_shared_memory(s, 3, PD_FLOAT32, d1025, 1, r, 0, pd_layout_sharded(1),
                                           NULL, NULL, e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_upload_components_from_shared_memory(s, 3, PD_FLOAT32, 3, NULL, NULL, r, 0, NULL,
                                                      NULL, e->st));
  /* Downloads: an unknown id, a component out of range. */
  EXPECT_CODE(e, PD_NOT_FOUND,
              pd_download_to_shared_memory(s, 77, pd_layout_mirrored(), r, 0, NULL, NULL, NULL,
                                           e->st));
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download_to_shared_memory(s, 2, pd_layout_component(NDEV), r, 0, NULL, NULL,
                                           NULL, e->st));
  ASSERT_MSG_HAS(e, "components 0..3");
  /* A tensor whose op failed on the devices: its error, nothing written. */
  int32_t *idx = (int32_t *)((char *)pd_shared_memory_data(r) + 8192);
  idx[0] = 1;
  idx[1] = 5000; /* params have 256 rows per shard */
  int64_t d2[1] = {2};
  OK(e, pd_upload_from_shared_memory(s, 4, PD_INT32, d2, 1, r, 8192, pd_layout_mirrored(), NULL,
                                     NULL, e->st));
  pd_attrs *at = pd_attrs_new();
  pd_attrs_set_int(at, "axis", 0);
  uint64_t in[2] = {2, 4}, out = 5;
  OK(e, pd_execute(s, "Gather", in, 2, at, &out, 1, NULL, NULL, e->st));
  pd_attrs_delete(at);
  uint8_t *dst = (uint8_t *)pd_shared_memory_data(r) + 16384;
  memset(dst, 0xEE, 64);
  EXPECT_CODE(e, PD_INVALID_ARGUMENT,
              pd_download_to_shared_memory(s, 5, pd_layout_mirrored(), r, 16384, NULL, NULL, NULL,
                                           e->st));
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
  OK(e, pd_upload_from_shared_memory(s, 1, PD_UINT8, big, 1, r, 0, pd_layout_mirrored(), NULL,
                                     NULL, e->st));
  int fd = shm_open(pd_shared_memory_key(r), O_RDWR, 0);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  close(fd);
  /* (The test never touches its own mapping past 4096 bytes now.) */
  EXPECT_CODE(e, PD_FAILED_PRECONDITION,
              pd_upload_from_shared_memory(s, 2, PD_UINT8, big, 1, r, 0, pd_layout_mirrored(),
                                           NULL, NULL, e->st));
  ASSERT_MSG_HAS(e, "was truncated");
  EXPECT_CODE(e, PD_FAILED_PRECONDITION,
              pd_download_to_shared_memory(s, 1, pd_layout_mirrored(), r, 0, NULL, NULL, NULL,
                                           e->st));
  ASSERT_MSG_HAS(e, "was truncated");
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
      print_message("SKIP part: cannot drop CAP_DAC_OVERRIDE (%s); running as root, the "
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
  EXPECT_CODE(e, PD_PERMISSION_DENIED,
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
    if (rc != 0) fail_msg("second paradevd exited with %d; log:\n%s", rc, d2.log);
    bool san = d2.log && (strstr(d2.log, "AddressSanitizer") || strstr(d2.log, "runtime error"));
    if (san) fail_msg("sanitizer report in the second daemon's log:\n%s", d2.log);
    free(d2.log);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PARADEVD\n", argv[0]);
    return 2;
  }
  paradevd_path = argv[1];
  signal(SIGPIPE, SIG_IGN);
  daemon_start(&D, "pdshm");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trips),        cmocka_unit_test(test_region_end),
      cmocka_unit_test(test_register_errors),    cmocka_unit_test(test_second_session),
      cmocka_unit_test(test_tensor_errors),      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_session_end_unmaps), cmocka_unit_test(test_daemon_cannot_open),
  };
  int failed = cmocka_run_group_tests_name("shared memory transfers", tests, setup, teardown);
  int rc = pdt_daemon_stop(&D);
  if (rc != 0) {
    fprintf(stderr, "paradevd exited with %d after SIGTERM; log:\n%s\n", rc, D.log ? D.log : "");
    failed++;
  }
  if (D.log && (strstr(D.log, "AddressSanitizer") || strstr(D.log, "runtime error"))) {
    fprintf(stderr, "sanitizer report in the daemon's log:\n%s\n", D.log);
    failed++;
  }
  free(D.log);
  return failed ? 1 : 0;
}
