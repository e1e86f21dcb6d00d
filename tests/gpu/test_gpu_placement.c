/* Placement on the CUDA backend (issue #17), for the lent GPU machine
 * (tests/gpu/run.sh, step test_gpu_placement): collectives over subsets of
 * the mesh with their values, CopyToDevices between devices and between
 * GPUs, a ParallelPack / ParallelUnpack round trip sharing buffers, and a
 * timing of NCCL communicator creation per device set beside the first
 * collective on it (reported as bench rows, no threshold).
 *
 * Meshes: logical devices on GPU 0 ("cuda:0,cuda:0,cuda:0": the copy path),
 * and, when the machine has two GPUs or more, distinct GPUs (NCCL; the
 * cases that need two print SKIP with one). The expected values are
 * computed here on the host, in float64, from the uploaded inputs.
 *
 * Each case prints "NAME: PASS", "NAME: SKIP: why" or "NAME: FAIL: why".
 * A case whose engine answers UNIMPLEMENTED ("placement on a subset of the
 * mesh is not built yet") or does not know a placement op skips, naming
 * it: before the engine's placement is merged only the whole-mesh parts
 * run. Usage: test_gpu_placement [CASE...] (default: all). Exit status: 1
 * when a case failed, 77 when every case chosen skipped (no GPU, one GPU
 * for cases that need two, no placement in the engine), else 0. PARADEV_GPU_TEST_BACKEND=cpu runs every case on the CPU
 * backend (simulated devices), which checks the harness and the engine's
 * placement without a GPU. PARADEV_BENCH_RESULTS=FILE: the timing rows are
 * appended there as JSON lines (tests/gpu/run.sh's table). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "dev_backend.h"
#include "dev_cuda.h"

typedef enum { R_PASS, R_SKIP, R_FAIL } result;

static const char *g_backend = "cuda";
static int g_gpus;
static char g_why[1024];

#define FAIL(...)                                                              \
  do {                                                                         \
    snprintf(g_why, sizeof g_why, __VA_ARGS__);                                \
    rc_ = R_FAIL;                                                              \
    goto out;                                                                  \
  } while (0)
#define SKIP(...)                                                              \
  do {                                                                         \
    snprintf(g_why, sizeof g_why, __VA_ARGS__);                                \
    rc_ = R_SKIP;                                                              \
    goto out;                                                                  \
  } while (0)

/* The engine's placement is not merged yet (or an op is missing). */
static bool not_built(const dev_status *st) {
  return st->code == PD_UNIMPLEMENTED ||
         (st->code == PD_INVALID_ARGUMENT && strstr(st->msg, "unknown op")) ||
         st->code == PD_NOT_FOUND;
}

/* A status that failed: SKIP when the engine lacks placement, else FAIL. */
#define CHECK_ST(RC, WHAT)                                                     \
  do {                                                                         \
    if ((RC) != PD_OK) {                                                       \
      if (not_built(&st))                                                      \
        SKIP("%s: %s (waits on the engine's placement)", (WHAT), st.msg);      \
      FAIL("%s: %s: %s", (WHAT), pd_code_name(st.code), st.msg);               \
    }                                                                          \
  } while (0)

static dev_engine *engine(const char *mesh, int n, dev_cuda_collectives coll,
                          dev_status *st) {
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.backend = g_backend;
  cfg.num_devices = n;
  cfg.mesh = mesh;
  cfg.cuda_collectives = coll;
  cfg.cuda_collective_timeout_ms = 60000; /* every wait here is bounded */
  dev_engine *e = NULL;
  if (dev_engine_create(&cfg, &e, st) != PD_OK) return NULL;
  return e;
}

/* "cuda:0,cuda:0,..." (n entries on GPU 0) or "cuda:0,cuda:1,..." */
static void mesh_str(int n, bool distinct, char *buf, size_t len) {
  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    size_t l = strlen(buf);
    snprintf(buf + l, len - l, "%scuda:%d", i ? "," : "", distinct ? i : 0);
  }
}

static pd_code make_set(dev_engine *e, const int64_t *devs, int n,
                        dev_devset *s, dev_status *st) {
  return dev_devset_make(e, devs, n, s, st);
}

/* float32 [set->n * k] split along axis 0: component i holds
 * vals[i*k .. i*k+k). */
static pd_code upload_on(dev_engine *e, const dev_devset *set,
                         const float *vals, int64_t k, dev_tensor **out,
                         dev_status *st) {
  dev_shape host = {.rank = 1, .dims = {k * set->n}};
  dev_layout lay = {set->n == 1 ? DEV_LAYOUT_MIRRORED : DEV_LAYOUT_SHARDED, 0,
                    0};
  return dev_tensor_from_host_on(e, set, PD_FLOAT32, &lay, &host, vals, out,
                                 st);
}

/* Component c of t (float32, k elements) into out. */
static pd_code read_comp(dev_tensor *t, int c, float *out, int64_t k,
                         dev_status *st) {
  dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, c};
  return dev_tensor_to_host(t, &lay, c, out, (size_t)k * sizeof(float), st);
}

/* Index of the first element of got[k] that is not want[k] (within a
 * float32 sum's rounding), -1 when all match. */
static int64_t mismatch(const float *got, const double *want, int64_t k) {
  for (int64_t i = 0; i < k; i++)
    if (fabs((double)got[i] - want[i]) > 1e-5 * (1 + fabs(want[i]))) return i;
  return -1;
}

static const char *set_s(const dev_devset *s) {
  static char buf[4][DEV_DEVSET_STR_MAX];
  static int next;
  char *b = buf[next++ % 4];
  return dev_devset_str(s, b, DEV_DEVSET_STR_MAX);
}

/* Checks component c of t against want[k] (k <= EXPECT_MAX). */
#define EXPECT_MAX 4096
#define EXPECT_COMP(T, C, WANT, K, WHAT)                                       \
  do {                                                                         \
    static float got_[EXPECT_MAX];                                             \
    if ((K) > EXPECT_MAX) FAIL("%s: %d elements to check", (WHAT), (int)(K));  \
    CHECK_ST(read_comp((T), (C), got_, (K), &st), (WHAT));                     \
    int64_t bad_ = mismatch(got_, (WANT), (K));                                \
    if (bad_ >= 0)                                                             \
      FAIL("%s: component %d element %lld is %.9g, expected %.9g", (WHAT),     \
           (C), (long long)bad_, (double)got_[bad_], (WANT)[bad_]);            \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Collectives on subsets                                                    */

/* AllReduce over `set` of a tensor uploaded there; checks every component
 * against the host sum. */
static result allreduce_on(dev_engine *e, const int64_t *devs, int n,
                           const char *what) {
  enum { K = 5 };
  result rc_ = R_PASS;
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *x = NULL, *y = NULL;
  dev_devset set;
  float vals[PD_MAX_DEVICES * K];
  double want[K] = {0};
  CHECK_ST(make_set(e, devs, n, &set, &st), what);
  for (int i = 0; i < n * K; i++) {
    vals[i] = (float)(i * 0.25 + devs[i / K] * 10 + 1);
    want[i % K] += vals[i];
  }
  CHECK_ST(upload_on(e, &set, vals, K, &x, &st), what);
  dev_attr red = dev_attr_string("reduction", "sum");
  int no = 1;
  CHECK_ST(dev_execute_on(e, NULL, "AllReduce", &x, 1, &red, 1, &y, &no, &st),
           what);
  for (int c = 0; c < n; c++) EXPECT_COMP(y, c, want, K, what);
out:
  dev_tensor_release(x);
  dev_tensor_release(y);
  return rc_;
}

/* Logical devices on GPU 0 (copy path): AllReduce on [0, 2], AllGather on
 * [2, 1] (rank order, not mesh order), Broadcast from rank 1 on [0, 1],
 * DeviceId on [2, 0] (the index within the set), the whole mesh between
 * them, all on one engine so the subsets overlap in the one order. */
static result test_subset_collectives(void) {
  result rc_ = R_PASS;
  dev_status st = DEV_STATUS_INIT;
  char mesh[64];
  mesh_str(3, false, mesh, sizeof mesh);
  dev_engine *e = engine(mesh, 3, DEV_CUDA_COLL_AUTO, &st);
  dev_tensor *x = NULL, *y = NULL;
  if (!e) FAIL("engine \"%s\": %s", mesh, st.msg);
  const int64_t all[] = {0, 1, 2}, s02[] = {0, 2}, s21[] = {2, 1},
                s01[] = {0, 1}, s20[] = {2, 0};
  if ((rc_ = allreduce_on(e, all, 3, "AllReduce on the whole mesh")) != R_PASS)
    goto out;
  if ((rc_ = allreduce_on(e, s02, 2, "AllReduce on [0, 2]")) != R_PASS)
    goto out;
  {
    enum { K = 3 };
    dev_devset set;
    float v[2 * K] = {1, 2, 3, 4, 5, 6};
    double want[2 * K] = {1, 2, 3, 4, 5, 6};
    CHECK_ST(make_set(e, s21, 2, &set, &st), "AllGather on [2, 1]");
    CHECK_ST(upload_on(e, &set, v, K, &x, &st), "upload on [2, 1]");
    dev_attr ax = dev_attr_int("axis", 0);
    int no = 1;
    CHECK_ST(dev_execute_on(e, NULL, "AllGather", &x, 1, &ax, 1, &y, &no, &st),
             "AllGather on [2, 1]");
    for (int c = 0; c < 2; c++)
      EXPECT_COMP(y, c, want, 2 * K, "AllGather on [2, 1]");
    dev_tensor_release(x);
    dev_tensor_release(y);
    x = y = NULL;
  }
  if ((rc_ = allreduce_on(e, all, 3, "AllReduce on the whole mesh, again")) !=
      R_PASS)
    goto out;
  {
    enum { K = 4 };
    dev_devset set;
    float v[2 * K] = {1, 2, 3, 4, -1, -2, -3, -4};
    double want[K] = {-1, -2, -3, -4};
    CHECK_ST(make_set(e, s01, 2, &set, &st), "Broadcast on [0, 1]");
    CHECK_ST(upload_on(e, &set, v, K, &x, &st), "upload on [0, 1]");
    dev_attr root = dev_attr_int("root", 1);
    int no = 1;
    CHECK_ST(
        dev_execute_on(e, NULL, "Broadcast", &x, 1, &root, 1, &y, &no, &st),
        "Broadcast on [0, 1]");
    for (int c = 0; c < 2; c++)
      EXPECT_COMP(y, c, want, K, "Broadcast from rank 1 on [0, 1]");
    dev_tensor_release(x);
    dev_tensor_release(y);
    x = y = NULL;
  }
  {
    dev_devset set;
    CHECK_ST(make_set(e, s20, 2, &set, &st), "DeviceId on [2, 0]");
    int no = 1;
    CHECK_ST(
        dev_execute_on(e, &set, "DeviceId", NULL, 0, NULL, 0, &y, &no, &st),
        "DeviceId on [2, 0]");
    for (int c = 0; c < 2; c++) {
      int32_t id = -1;
      dev_layout lay = {DEV_LAYOUT_COMPONENT, 0, c};
      CHECK_ST(dev_tensor_to_host(y, &lay, c, &id, sizeof id, &st),
               "DeviceId on [2, 0]");
      if (id != c)
        FAIL("DeviceId on [2, 0]: component %d holds %d, expected %d", c,
             (int)id, c);
    }
  }
out:
  dev_tensor_release(x);
  dev_tensor_release(y);
  dev_engine_destroy(e);
  return rc_;
}

/* Distinct GPUs (NCCL): AllReduce on every two-GPU subset in both orders
 * and on single GPUs, interleaved with the whole mesh. */
static result test_subset_collectives_nccl(void) {
  result rc_ = R_PASS;
  dev_status st = DEV_STATUS_INIT;
  dev_engine *e = NULL;
  if (!strcmp(g_backend, "cpu")) SKIP("no NCCL on the CPU backend");
  if (g_gpus < 2) SKIP("needs two GPUs, this machine has %d", g_gpus);
  int n = g_gpus < 4 ? g_gpus : 4;
  char mesh[64];
  mesh_str(n, true, mesh, sizeof mesh);
  if (!(e = engine(mesh, n, DEV_CUDA_COLL_AUTO, &st)))
    FAIL("engine \"%s\": %s", mesh, st.msg);
  const int64_t all[] = {0, 1, 2, 3};
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      int64_t s[2] = {a, b};
      char what[64];
      snprintf(what, sizeof what, "AllReduce on [%d, %d] (NCCL)", a, b);
      if ((rc_ = allreduce_on(e, s, a == b ? 1 : 2, what)) != R_PASS) goto out;
      if ((rc_ = allreduce_on(e, all, n, "AllReduce on the whole mesh")) !=
          R_PASS)
        goto out;
    }
out:
  dev_engine_destroy(e);
  return rc_;
}

/* ------------------------------------------------------------------------ */
/* CopyToDevices                                                             */

/* x on `from` -> CopyToDevices(devices = to) -> every component checked:
 * component i of x on device i of `to` (same size), or x's one component
 * everywhere (from one device). */
static result copy_case(dev_engine *e, const int64_t *from, int nf,
                        const int64_t *to, int nt, int64_t k,
                        const char *what) {
  result rc_ = R_PASS;
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *x = NULL, *y = NULL;
  float *v = malloc((size_t)(nf * k) * sizeof *v);
  float *got = malloc((size_t)k * sizeof *got);
  if (!v || !got) FAIL("%s: host out of memory", what);
  dev_devset sf;
  CHECK_ST(make_set(e, from, nf, &sf, &st), what);
  for (int64_t i = 0; i < nf * k; i++)
    v[i] = (float)((i % 100003) * 0.5 - i / k);
  CHECK_ST(upload_on(e, &sf, v, k, &x, &st), what);
  dev_attr devs = dev_attr_int_list("devices", to, nt);
  int no = 1;
  CHECK_ST(
      dev_execute_on(e, NULL, "CopyToDevices", &x, 1, &devs, 1, &y, &no, &st),
      what);
  const dev_devset *ys = dev_tensor_devset(y);
  if (ys->n != nt) FAIL("%s: the copy is on %s", what, set_s(ys));
  for (int i = 0; i < nt; i++)
    if (ys->dev[i] != to[i]) FAIL("%s: the copy is on %s", what, set_s(ys));
  for (int c = 0; c < nt; c++) {
    CHECK_ST(read_comp(y, c, got, k, &st), what);
    const float *want = v + (nf == 1 ? 0 : c) * k;
    for (int64_t i = 0; i < k; i++)
      if (got[i] != want[i])
        FAIL("%s: component %d element %lld is %.9g, expected %.9g", what, c,
             (long long)i, (double)got[i], (double)want[i]);
  }
out:
  free(v);
  free(got);
  dev_tensor_release(x);
  dev_tensor_release(y);
  return rc_;
}

static result test_copy_logical(void) {
  result rc_ = R_PASS;
  dev_status st = DEV_STATUS_INIT;
  char mesh[64];
  mesh_str(3, false, mesh, sizeof mesh);
  dev_engine *e = engine(mesh, 3, DEV_CUDA_COLL_AUTO, &st);
  if (!e) FAIL("engine \"%s\": %s", mesh, st.msg);
  const int64_t d0[] = {0}, d12[] = {1, 2}, d01[] = {0, 1}, d20[] = {2, 0};
  if ((rc_ = copy_case(e, d0, 1, d12, 2, 1000, "[0] -> [1, 2] on one GPU")))
    goto out;
  if ((rc_ = copy_case(e, d01, 2, d20, 2, 777, "[0, 1] -> [2, 0] on one GPU")))
    goto out;
out:
  dev_engine_destroy(e);
  return rc_;
}

/* Between GPUs, large enough to cross the staging chunks (4 MiB): peer
 * copies, then (PARADEV_CUDA_STAGED_COPIES=1, a fresh engine) staged. */
static result test_copy_gpus(void) {
  result rc_ = R_PASS;
  dev_status st = DEV_STATUS_INIT;
  dev_engine *e = NULL;
  if (!strcmp(g_backend, "cpu")) SKIP("the CPU backend has no GPUs");
  if (g_gpus < 2) SKIP("needs two GPUs, this machine has %d", g_gpus);
  const int64_t d0[] = {0}, d1[] = {1}, d01[] = {0, 1}, d10[] = {1, 0};
  const int64_t k = (9 << 20) / 4 + 3; /* 9 MiB and 12 bytes */
  for (int staged = 0; staged < 2; staged++) {
    if (staged) setenv("PARADEV_CUDA_STAGED_COPIES", "1", 1);
    if (!(e = engine("cuda:0,cuda:1", 2, DEV_CUDA_COLL_AUTO, &st)))
      FAIL("engine \"cuda:0,cuda:1\": %s", st.msg);
    if ((rc_ = copy_case(e, d0, 1, d1, 1, k,
                         staged ? "[0] -> [1] staged" : "[0] -> [1] peer")))
      goto out;
    if ((rc_ = copy_case(
             e, d01, 2, d10, 2, k / 3,
             staged ? "[0, 1] -> [1, 0] staged" : "[0, 1] -> [1, 0] peer")))
      goto out;
    dev_engine_destroy(e);
    e = NULL;
  }
out:
  unsetenv("PARADEV_CUDA_STAGED_COPIES");
  dev_engine_destroy(e);
  return rc_;
}

/* ------------------------------------------------------------------------ */
/* ParallelPack / ParallelUnpack                                             */

static uint64_t in_use(dev_engine *e, int d) {
  dev_memory_stats m = {.struct_size = sizeof m};
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_memory_stats(e, d, &m, &st) != PD_OK) return UINT64_MAX;
  return m.bytes_in_use;
}

/* t0 on [0], t1 on [2] -> ParallelPack -> [0, 2], no new device memory ->
 * ParallelUnpack -> two tensors on [0] and [2] with the values. */
static result test_pack_unpack(void) {
  enum { K = 1024 };
  result rc_ = R_PASS;
  dev_status st = DEV_STATUS_INIT;
  char mesh[64];
  mesh_str(3, false, mesh, sizeof mesh);
  dev_engine *e = engine(mesh, 3, DEV_CUDA_COLL_AUTO, &st);
  dev_tensor *t[2] = {NULL, NULL}, *p = NULL, *u[2] = {NULL, NULL};
  if (!e) FAIL("engine \"%s\": %s", mesh, st.msg);
  static float v[2][K];
  double want[2][K];
  const int64_t devs[2] = {0, 2};
  for (int c = 0; c < 2; c++) {
    dev_devset s;
    CHECK_ST(make_set(e, &devs[c], 1, &s, &st), "a set of one");
    for (int i = 0; i < K; i++) want[c][i] = v[c][i] = (float)(c * 1000 + i);
    CHECK_ST(upload_on(e, &s, v[c], K, &t[c], &st), "upload on one device");
    CHECK_ST(dev_tensor_wait(t[c], &st), "upload on one device");
  }
  uint64_t before[3];
  for (int d = 0; d < 3; d++) before[d] = in_use(e, d);
  int no = 1;
  CHECK_ST(dev_execute_on(e, NULL, "ParallelPack", t, 2, NULL, 0, &p, &no, &st),
           "ParallelPack");
  CHECK_ST(dev_tensor_wait(p, &st), "ParallelPack");
  const dev_devset *ps = dev_tensor_devset(p);
  if (ps->n != 2 || ps->dev[0] != 0 || ps->dev[1] != 2)
    FAIL("ParallelPack of [0] and [2] is on %s, expected [0, 2]", set_s(ps));
  for (int d = 0; d < 3; d++)
    if (in_use(e, d) != before[d])
      FAIL(
          "ParallelPack allocated on device %d: %llu bytes in use, %llu "
          "before (the components' buffers should be shared)",
          d, (unsigned long long)in_use(e, d), (unsigned long long)before[d]);
  for (int c = 0; c < 2; c++) EXPECT_COMP(p, c, want[c], K, "ParallelPack");
  no = 2;
  CHECK_ST(
      dev_execute_on(e, NULL, "ParallelUnpack", &p, 1, NULL, 0, u, &no, &st),
      "ParallelUnpack");
  if (no != 2) FAIL("ParallelUnpack gave %d outputs, expected 2", no);
  for (int c = 0; c < 2; c++) {
    const dev_devset *us = dev_tensor_devset(u[c]);
    if (us->n != 1 || us->dev[0] != devs[c])
      FAIL("ParallelUnpack output %d is on %s, expected [%d]", c, set_s(us),
           (int)devs[c]);
    EXPECT_COMP(u[c], 0, want[c], K, "ParallelUnpack");
  }
  for (int d = 0; d < 3; d++)
    if (in_use(e, d) != before[d])
      FAIL(
          "ParallelUnpack allocated on device %d: %llu bytes in use, %llu "
          "before",
          d, (unsigned long long)in_use(e, d), (unsigned long long)before[d]);
out:
  for (int c = 0; c < 2; c++) {
    dev_tensor_release(t[c]);
    dev_tensor_release(u[c]);
  }
  dev_tensor_release(p);
  dev_engine_destroy(e);
  return rc_;
}

/* ------------------------------------------------------------------------ */
/* NCCL communicator creation per device set                                 */

static void bench_row(const char *set, int gpus, double build_ms,
                      double first_ms, double second_ms) {
  char line[512];
  snprintf(line, sizeof line,
           "{\"bench\": \"nccl_comm\", \"params\": {\"set\": \"%s\", "
           "\"gpus\": %d, \"second_ms\": %.3f}, \"metric\": "
           "\"comm_build_ms\", \"value\": %.3f, \"baseline\": "
           "\"first_collective_ms\", \"baseline_value\": %.3f, \"ratio\": "
           "%.4f}",
           set, gpus, second_ms, build_ms, first_ms,
           first_ms > 0 ? build_ms / first_ms : 0.0);
  printf("   %s\n", line);
  const char *path = getenv("PARADEV_BENCH_RESULTS");
  FILE *f = path && *path ? fopen(path, "a") : NULL;
  if (f) {
    fprintf(f, "%s\n", line);
    fclose(f);
  }
}

/* One AllReduce on `set`, submitted to done, in ms; -1 on failure. */
static double timed_allreduce(dev_engine *e, const dev_devset *set,
                              dev_status *st) {
  float v[PD_MAX_DEVICES * 256];
  for (int i = 0; i < set->n * 256; i++) v[i] = (float)i;
  dev_tensor *x = NULL, *y = NULL;
  if (upload_on(e, set, v, 256, &x, st) != PD_OK) return -1;
  if (dev_tensor_wait(x, st) != PD_OK) {
    dev_tensor_release(x);
    return -1;
  }
  dev_attr red = dev_attr_string("reduction", "sum");
  int no = 1;
  double t0 = dev_monotonic_now();
  pd_code rc =
      dev_execute_on(e, NULL, "AllReduce", &x, 1, &red, 1, &y, &no, st);
  if (rc == PD_OK) rc = dev_tensor_wait(y, st);
  double ms = (dev_monotonic_now() - t0) * 1e3;
  dev_tensor_release(x);
  dev_tensor_release(y);
  return rc == PD_OK ? ms : -1;
}

/* Distinct GPUs, NCCL forced (also a mesh of one): for each set, the first
 * AllReduce on it (which waits for its communicators, built in the
 * background from its collective_create on) and a second one, beside the
 * build time the backend measured (dev_cuda_comm_stats). */
static result test_nccl_comm_timing(void) {
  result rc_ = R_PASS;
  dev_status st = DEV_STATUS_INIT;
  dev_engine *e = NULL;
  if (!strcmp(g_backend, "cpu")) SKIP("no NCCL on the CPU backend");
  int n = g_gpus < 4 ? g_gpus : 4;
  char mesh[64];
  mesh_str(n, true, mesh, sizeof mesh);
  if (!(e = engine(mesh, n, DEV_CUDA_COLL_NCCL, &st))) {
    if (strstr(st.msg, "no NCCL")) SKIP("%s", st.msg);
    FAIL("engine \"%s\" with NCCL: %s", mesh, st.msg);
  }
  /* The whole mesh (built at start), then each GPU alone, then pairs. */
  int64_t sets[16][4];
  int sizes[16], ns = 0;
  for (int i = 0; i < n; i++) sets[ns][i] = i;
  sizes[ns++] = n;
  for (int i = 0; i < n && n > 1; i++) {
    sets[ns][0] = i;
    sizes[ns++] = 1;
  }
  if (n >= 2) {
    sets[ns][0] = 1, sets[ns][1] = 0, sizes[ns++] = 2;
  }
  if (n >= 3) {
    sets[ns][0] = 0, sets[ns][1] = 2, sizes[ns++] = 2;
  }
  dev_backend *b = dev_engine_backend(e);
  for (int s = 0; s < ns; s++) {
    dev_devset set;
    CHECK_ST(make_set(e, sets[s], sizes[s], &set, &st), "a set");
    double first = timed_allreduce(e, &set, &st);
    if (first < 0) CHECK_ST(st.code, "the first AllReduce");
    double second = timed_allreduce(e, &set, &st);
    if (second < 0) CHECK_ST(st.code, "the second AllReduce");
    dev_cuda_comm_info info[32];
    int m = dev_cuda_comm_stats(b, info, 32);
    double build = -1;
    for (int i = 0; i < m && i < 32; i++)
      if (dev_devset_equal(&info[i].set, &set)) build = info[i].build_ms;
    if (build < 0)
      FAIL("no communicators for %s in the cache (%d sets)", set_s(&set), m);
    bench_row(set_s(&set), n, build, first, second);
  }
out:
  dev_engine_destroy(e);
  return rc_;
}

/* ------------------------------------------------------------------------ */

/* Usage: test_gpu_placement [CASE...] (default: every case). */
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *b = getenv("PARADEV_GPU_TEST_BACKEND");
  char no_gpu[256] = "";
  if (b && !strcmp(b, "cpu")) {
    g_backend = "cpu";
    printf("harness mode: the CPU backend stands in for the GPU\n");
  } else {
    cudaError_t e = cudaGetDeviceCount(&g_gpus);
    if (e != cudaSuccess)
      snprintf(no_gpu, sizeof no_gpu, "%s", cudaGetErrorString(e));
    else if (g_gpus == 0)
      snprintf(no_gpu, sizeof no_gpu, "no CUDA-capable device is detected");
    if (e != cudaSuccess) g_gpus = 0;
  }
  static const struct {
    const char *name;
    result (*fn)(void);
  } cases[] = {
      {"subset_collectives", test_subset_collectives},
      {"subset_collectives_nccl", test_subset_collectives_nccl},
      {"copy_logical", test_copy_logical},
      {"copy_gpus", test_copy_gpus},
      {"pack_unpack", test_pack_unpack},
      {"nccl_comm_timing", test_nccl_comm_timing},
  };
  const int n = (int)(sizeof cases / sizeof cases[0]);
  for (int a = 1; a < argc; a++) {
    int i = 0;
    while (i < n && strcmp(argv[a], cases[i].name)) i++;
    if (i == n) {
      fprintf(stderr,
              "test_gpu_placement: unknown case %s; expected one of:", argv[a]);
      for (i = 0; i < n; i++) fprintf(stderr, " %s", cases[i].name);
      fprintf(stderr, "\n");
      return 2;
    }
  }
  if (no_gpu[0]) {
    printf("placement: SKIP: no CUDA GPU (%s)\n", no_gpu);
    return 77;
  }
  int failed = 0, passed = 0, ran = 0;
  for (int i = 0; i < n; i++) {
    bool chosen = argc == 1;
    for (int a = 1; a < argc; a++) chosen |= !strcmp(argv[a], cases[i].name);
    if (!chosen) continue;
    ran++;
    g_why[0] = '\0';
    double t0 = dev_monotonic_now();
    result r = cases[i].fn();
    double s = dev_monotonic_now() - t0;
    if (r == R_PASS) {
      printf("%s: PASS (%.2f s)\n", cases[i].name, s);
      passed++;
    } else if (r == R_SKIP) {
      printf("%s: SKIP: %s\n", cases[i].name, g_why);
    } else {
      printf("%s: FAIL: %s\n", cases[i].name, g_why);
      failed++;
    }
  }
  printf("placement: %d passed, %d failed, %d skipped\n", passed, failed,
         ran - passed - failed);
  return failed ? 1 : passed ? 0 : 77; /* all skipped: 77 */
}
