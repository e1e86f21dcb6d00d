/* bench_gpu_rpc: the CUDA backend measured through a running paradevd, each
 * figure beside a baseline measured by this process, in the same run, on the
 * same GPU (issue 5's GPU benchmark; bench_gpu measures the engine
 * in-process, this one adds the daemon's RPC path):
 *
 *  matmul    MatMul A[m,k] B[k,n] through Execute: A and B (random, never
 *            zeros) uploaded once; each product timed on the host clock from
 *            the Execute request until pd_sync on its output returns (Sync
 *            answers once the op is complete on the device), output deleted
 *            untimed; median after warm-up. Also "pipelined": PIPELINE
 *            Executes back to back and one Sync of all their outputs, per
 *            product. Baseline: the same cublasGemmEx call the daemon makes
 *            (device/cuda/matmul.c) on cudaMalloc'd buffers in this process,
 *            timed with CUDA events, median. 8192x8192x8192 bfloat16 (float32
 *            accumulation) and 4096^3 float32 (CUBLAS_COMPUTE_32F: no TF32).
 *            TFLOP/s = 2mnk/t. Aim: ratio >= 0.95. Checked: rows of the
 *            daemon's product (Slice, Download), of the direct call's and of
 *            a float64 reference computed here agree to the dtype's
 *            precision (relative norm: bfloat16 1e-2, float32 1e-5).
 *  upload    256 MiB float32 through Upload (gRPC stream, CHUNK-byte chunks,
 *  download  pageable host memory), timed until pd_sync says it is on the
 *            device, and back through Download: GB/s of host bytes, beside
 *            cudaMemcpy from / to pinned memory (cudaMallocHost) of the same
 *            size. Aim: upload >= 0.7. Then the same through a shared memory
 *            region (pd_upload_from_shared_memory, pd_download_to_shared_
 *            memory: the daemon DMAs from its page-locked mapping), when a
 *            region can be made. Each download is compared with the upload.
 *
 * The daemon must run the cuda backend on a one-device mesh (run.sh starts
 * it with --mesh cuda:0): otherwise the comparison with one direct call means
 * nothing, and the benchmark refuses (exit 2).
 *
 * Usage: bench_gpu_rpc [--target ADDR] [--quick] [--no-baseline]
 *   --target       the daemon (unix:/path or host:port); default
 *                  $PARADEV_TARGET, else 127.0.0.1:7478
 *   --quick        smaller sizes (or PARADEV_BENCH_QUICK=1)
 *   --no-baseline  no CUDA call at all: only the daemon side, at small sizes,
 *                  against any daemon (a CPU one too) and any mesh; each
 *                  device of a mirrored mesh computes the whole product, so
 *                  the figures are per device. Tests the RPC logic without
 *                  a GPU.
 * Exit status: 0; 1 when a call fails or a result is wrong; 2 for bad usage
 * or a daemon this benchmark cannot compare (mesh, backend); 77 when this
 * process sees no GPU (without --no-baseline).
 * Results: a table and JSON lines (benchutil.h). Built from
 * client/CMakeLists.txt when the CUDA backend is on (it needs libparadev,
 * cudart and cuBLAS); named *_bench.c so the root glob of bench_*.c, which
 * links against the engine, leaves it alone. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <paradev/paradev.h>

#include "benchutil.h"

#define CHUNK ((size_t)4 << 20) /* Upload/Download chunk bytes */
#define PIPELINE 8              /* Executes in flight in the pipelined figure */
#define CHECK_ROWS 4            /* rows checked at each end of a product */

/* Handle ids of this program (below PD_FIRST_LIBRARY_ID). */
enum {
  ID_A = 1,
  ID_B = 2,
  ID_OUT = 3,
  ID_CHECK = 4,
  ID_SLICE0 = 5,
  ID_SLICE1 = 6,
  ID_X = 7,
  ID_PIPE = 100, /* .. ID_PIPE + PIPELINE - 1 */
};

/* The daemon's backend (and "no baseline" under --no-baseline), for params. */
static char g_backend[48] = "unknown";

static pd_status *st;
static pd_session *sess;
static bool baseline = true;
static int mesh_devices;
static uint64_t rng;

static void die(const char *what) {
  fprintf(stderr, "bench_gpu_rpc: %s: %s: %s\n", what,
          pd_code_name(pd_status_code(st)), pd_status_message(st));
  exit(1);
}

#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "bench_gpu_rpc: %s: %s\n", #call,                        \
              cudaGetErrorString(e_));                                         \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CKB(call)                                                              \
  do {                                                                         \
    cublasStatus_t s_ = (call);                                                \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                         \
      fprintf(stderr, "bench_gpu_rpc: %s: %s\n", #call,                        \
              cublasGetStatusString(s_));                                      \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* --- helpers ------------------------------------------------------------------ */

/* Uniform in [-1, 1), xorshift64. */
static double rand_unit(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) * 0x1p-53 * 2 - 1;
}

/* --- MatMul through the daemon --------------------------------------------------- */

static double run_mm_rpc(void *arg) {
  (void)arg;
  uint64_t in[2] = {ID_A, ID_B}, out = ID_OUT;
  double t0 = bu_now();
  if (pd_execute(sess, "MatMul", in, 2, NULL, &out, 1, NULL, NULL, st) != PD_OK)
    die("Execute MatMul");
  if (pd_sync(sess, &out, 1, NULL, NULL, st) != PD_OK) die("Sync MatMul");
  double t = bu_now() - t0;
  if (pd_delete(sess, &out, 1, NULL, st) != PD_OK) die("Delete");
  return t;
}

static double run_mm_rpc_pipelined(void *arg) {
  (void)arg;
  uint64_t in[2] = {ID_A, ID_B}, out[PIPELINE];
  double t0 = bu_now();
  for (int i = 0; i < PIPELINE; i++) {
    out[i] = ID_PIPE + (uint64_t)i;
    if (pd_execute(sess, "MatMul", in, 2, NULL, &out[i], 1, NULL, NULL, st) !=
        PD_OK)
      die("Execute MatMul");
  }
  if (pd_sync(sess, out, PIPELINE, NULL, NULL, st) != PD_OK) die("Sync MatMul");
  double t = bu_now() - t0;
  if (pd_delete(sess, out, PIPELINE, NULL, st) != PD_OK) die("Delete");
  return t / PIPELINE;
}

/* Rows [row, row + CHECK_ROWS) of the daemon's product ID_CHECK, through a
 * Slice on the device (so only those rows cross the wire), into `dst`. */
static void download_rows(uint64_t slice_id, int row, int n, pd_dtype dt,
                          void *dst) {
  size_t bytes = (size_t)CHECK_ROWS * (size_t)n * pd_dtype_size(dt);
  pd_attrs *a = pd_attrs_new();
  if (!a) {
    fprintf(stderr, "bench_gpu_rpc: out of memory\n");
    exit(1);
  }
  const int64_t begin[2] = {row, 0}, size[2] = {CHECK_ROWS, n};
  pd_attrs_set_int_list(a, "begin", begin, 2);
  pd_attrs_set_int_list(a, "size", size, 2);
  uint64_t in = ID_CHECK, out = slice_id;
  if (pd_execute(sess, "Slice", &in, 1, a, &out, 1, NULL, NULL, st) != PD_OK)
    die("Execute Slice");
  pd_attrs_delete(a);
  memset(dst, 0xff, bytes); /* NaN in both dtypes: unwritten shows */
  size_t got = 0;
  if (pd_download(sess, slice_id, pd_layout_mirrored(), dst, bytes, NULL, &got,
                  NULL, st) != PD_OK)
    die("Download");
  if (got != bytes) {
    fprintf(stderr,
            "bench_gpu_rpc: Download of rows gave %zu bytes, expected %zu\n",
            got, bytes);
    exit(1);
  }
}

/* --- the direct cuBLAS call ------------------------------------------------------ */

typedef struct gemm_arg {
  cublasHandle_t h;
  cudaStream_t s;
  cudaEvent_t e0, e1;
  cudaDataType_t type;
  int m, n, k;
  void *a, *b, *c;
} gemm_arg;

/* Row-major C[m,n] = A[m,k] B[k,n] as device/cuda/matmul.c calls it:
 * C^T = B^T A^T in cuBLAS's column-major terms. */
static void gemm(gemm_arg *g) {
  const float one = 1.0f, zero = 0.0f;
  CKB(cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->m, g->k, &one, g->b,
                   g->type, g->n, g->a, g->type, g->k, &zero, g->c, g->type,
                   g->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static double run_gemm(void *arg) {
  gemm_arg *g = arg;
  CK(cudaEventRecord(g->e0, g->s));
  gemm(g);
  CK(cudaEventRecord(g->e1, g->s));
  CK(cudaEventSynchronize(g->e1));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, g->e0, g->e1));
  return ms * 1e-3;
}

/* --- MatMul: daemon beside direct ------------------------------------------------ */

static int bench_matmul(pd_dtype dt, int size, double min_time) {
  const int m = size, n = size, k = size;
  const size_t es = pd_dtype_size(dt);
  const size_t elems = (size_t)size * (size_t)size;
  const size_t bytes = elems * es;
  const double tol = dt == PD_BFLOAT16 ? 1e-2 : 1e-5;
  int rc = 0;

  void *ha = bu_xmalloc(bytes), *hb = bu_xmalloc(bytes);
  for (size_t i = 0; i < elems; i++) bu_value_store(dt, ha, i, rand_unit());
  for (size_t i = 0; i < elems; i++) bu_value_store(dt, hb, i, rand_unit());
  const int64_t dims[2] = {size, size};
  if (pd_upload(sess, ID_A, dt, dims, 2, ha, bytes, pd_layout_mirrored(), NULL,
                NULL, st) != PD_OK ||
      pd_upload(sess, ID_B, dt, dims, 2, hb, bytes, pd_layout_mirrored(), NULL,
                NULL, st) != PD_OK)
    die("Upload");
  const uint64_t ab[2] = {ID_A, ID_B};
  if (pd_sync(sess, ab, 2, NULL, NULL, st) != PD_OK) die("Sync");

  double t_rpc =
      bu_measure_reported(run_mm_rpc, NULL, 3, 10, min_time).median_s;
  double t_pipe =
      bu_measure_reported(run_mm_rpc_pipelined, NULL, 1, 3, min_time).median_s;

  /* The rows to check: the first and the last CHECK_ROWS, the daemon's and a
   * float64 reference's from the same (rounded) inputs. */
  const size_t row_elems = (size_t)CHECK_ROWS * (size_t)n;
  const int rows_at[2] = {0, m - CHECK_ROWS};
  void *got[2], *want[2] = {NULL, NULL};
  double *ref[2];
  uint64_t in[2] = {ID_A, ID_B}, out = ID_CHECK;
  if (pd_execute(sess, "MatMul", in, 2, NULL, &out, 1, NULL, NULL, st) != PD_OK)
    die("Execute MatMul");
  for (int h = 0; h < 2; h++) {
    got[h] = bu_xmalloc(row_elems * es);
    download_rows(h ? ID_SLICE1 : ID_SLICE0, rows_at[h], n, dt, got[h]);
    ref[h] = calloc(row_elems, sizeof(double));
    if (!ref[h]) {
      fprintf(stderr, "bench_gpu_rpc: out of host memory\n");
      exit(1);
    }
  }
  const uint64_t done[3] = {ID_CHECK, ID_SLICE0, ID_SLICE1};
  if (pd_delete(sess, done, 3, NULL, st) != PD_OK) die("Delete");
  double *brow = bu_xmalloc(sizeof(double) * (size_t)n);
  for (int kk = 0; kk < k; kk++) {
    for (int j = 0; j < n; j++)
      brow[j] = bu_value_load(dt, hb, (size_t)kk * n + j);
    for (int h = 0; h < 2; h++)
      for (int r = 0; r < CHECK_ROWS; r++) {
        double a = bu_value_load(dt, ha, (size_t)(rows_at[h] + r) * k + kk);
        double *acc = ref[h] + (size_t)r * n;
        for (int j = 0; j < n; j++) acc[j] += a * brow[j];
      }
  }
  free(brow);

  double tf_direct = 0;
  if (baseline) {
    gemm_arg g = {.type = dt == PD_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F,
                  .m = m,
                  .n = n,
                  .k = k};
    CK(cudaStreamCreateWithFlags(&g.s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&g.e0));
    CK(cudaEventCreate(&g.e1));
    CKB(cublasCreate(&g.h));
    CKB(cublasSetStream(g.h, g.s));
    CK(cudaMalloc(&g.a, bytes));
    CK(cudaMalloc(&g.b, bytes));
    CK(cudaMalloc(&g.c, bytes));
    CK(cudaMemcpy(g.a, ha, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g.b, hb, bytes, cudaMemcpyHostToDevice));
    /* g.s does not wait for the legacy stream's copies: settle them. */
    CK(cudaDeviceSynchronize());
    double t_direct =
        bu_measure_reported(run_gemm, &g, 3, 10, min_time).median_s;
    tf_direct = 2.0 * m * n * (double)k / t_direct * 1e-12;
    /* The direct call's rows, from a poisoned output. */
    CK(cudaMemsetAsync(g.c, 0xff, bytes, g.s));
    gemm(&g);
    CK(cudaStreamSynchronize(g.s));
    for (int h = 0; h < 2; h++) {
      want[h] = bu_xmalloc(row_elems * es);
      CK(cudaMemcpy(want[h], (char *)g.c + (size_t)rows_at[h] * n * es,
                    row_elems * es, cudaMemcpyDeviceToHost));
    }
    cublasDestroy(g.h);
    cudaEventDestroy(g.e0);
    cudaEventDestroy(g.e1);
    cudaStreamDestroy(g.s);
    cudaFree(g.a);
    cudaFree(g.b);
    cudaFree(g.c);
  }

  /* Errors: daemon vs float64, direct vs float64, daemon vs direct. */
  double e_daemon = 0, e_direct = 0, e_between = 0;
  for (int h = 0; h < 2; h++) {
    double e = bu_rel_err(dt, got[h], ref[h], row_elems);
    e_daemon = isnan(e) || e > e_daemon ? e : e_daemon;
    if (!want[h]) continue;
    e = bu_rel_err(dt, want[h], ref[h], row_elems);
    e_direct = isnan(e) || e > e_direct ? e : e_direct;
    for (size_t i = 0; i < row_elems; i++)
      ref[h][i] = bu_value_load(dt, want[h], i);
    e = bu_rel_err(dt, got[h], ref[h], row_elems);
    e_between = isnan(e) || e > e_between ? e : e_between;
  }
  if (!(e_daemon <= tol)) {
    fprintf(stderr,
            "bench_gpu_rpc: MatMul %s %d^3: the daemon's rows differ from a "
            "float64 reference by %.3g (relative norm; expected <= %g%s)\n",
            pd_dtype_name(dt), size, e_daemon, tol,
            dt == PD_FLOAT32 ? ": does the daemon allow TF32?" : "");
    rc = 1;
  }
  if (baseline && !(e_direct <= tol)) {
    fprintf(stderr,
            "bench_gpu_rpc: MatMul %s %d^3: cublasGemmEx's rows differ from a "
            "float64 reference by %.3g (expected <= %g)\n",
            pd_dtype_name(dt), size, e_direct, tol);
    rc = 1;
  }
  if (baseline && !(e_between <= tol)) {
    fprintf(stderr,
            "bench_gpu_rpc: MatMul %s %d^3: the daemon's rows differ from "
            "cublasGemmEx's by %.3g (expected <= %g)\n",
            pd_dtype_name(dt), size, e_between, tol);
    rc = 1;
  }

  const double flops = 2.0 * m * n * (double)k;
  const double tf_rpc = flops / t_rpc * 1e-12, tf_pipe = flops / t_pipe * 1e-12;
  char params[256];
  snprintf(
      params, sizeof params,
      "\"dtype\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"devices\": %d%s, "
      "\"backend\": \"%s\"",
      pd_dtype_name(dt), m, n, k, mesh_devices,
      mesh_devices > 1 ? ", \"per_device\": true" : "", g_backend);
  printf(
      "  MatMul %s %dx%dx%d: daemon %.4g TFLOP/s (%.3f ms), pipelined x%d "
      "%.4g TFLOP/s",
      pd_dtype_name(dt), m, n, k, tf_rpc, t_rpc * 1e3, PIPELINE, tf_pipe);
  if (baseline)
    printf(", cublasGemmEx %.4g TFLOP/s, ratio %.3f / %.3f\n", tf_direct,
           tf_rpc / tf_direct, tf_pipe / tf_direct);
  else
    printf("\n");
  if (baseline)
    printf(
        "    check: relative error vs float64: daemon %.2g, direct %.2g; "
        "daemon vs direct %.2g (tolerance %g)\n",
        e_daemon, e_direct, e_between, tol);
  else
    printf("    check: relative error vs float64: daemon %.2g (tolerance %g)\n",
           e_daemon, tol);
  const char *bname = baseline ? "cublasGemmEx_TFLOPs" : NULL;
  bu_record("matmul_gpu_rpc", params, "TFLOPs", tf_rpc, bname, tf_direct);
  bu_record("matmul_gpu_rpc", params, "TFLOPs_pipelined", tf_pipe, bname,
            tf_direct);

  if (pd_delete(sess, ab, 2, NULL, st) != PD_OK) die("Delete");
  for (int h = 0; h < 2; h++) {
    free(got[h]);
    free(want[h]);
    free(ref[h]);
  }
  free(ha);
  free(hb);
  return rc;
}

/* --- Upload and Download --------------------------------------------------------- */

typedef struct xfer_arg {
  void *host;
  size_t bytes;
} xfer_arg;

static double run_upload(void *arg) {
  xfer_arg *x = arg;
  const int64_t dims[2] = {(int64_t)(x->bytes / 4096), 1024};
  uint64_t id = ID_X;
  double t0 = bu_now();
  if (pd_upload(sess, id, PD_FLOAT32, dims, 2, x->host, x->bytes,
                pd_layout_mirrored(), NULL, NULL, st) != PD_OK)
    die("Upload");
  if (pd_sync(sess, &id, 1, NULL, NULL, st) != PD_OK) die("Sync");
  double t = bu_now() - t0;
  if (pd_delete(sess, &id, 1, NULL, st) != PD_OK) die("Delete");
  return t;
}

static double run_download(void *arg) {
  xfer_arg *x = arg;
  double t0 = bu_now();
  if (pd_download(sess, ID_X, pd_layout_mirrored(), x->host, x->bytes, NULL,
                  NULL, NULL, st) != PD_OK)
    die("Download");
  return bu_now() - t0;
}

typedef struct memcpy_arg {
  void *dst;
  const void *src;
  size_t bytes;
  enum cudaMemcpyKind kind;
} memcpy_arg;

static double run_memcpy(void *arg) {
  memcpy_arg *c = arg;
  double t0 = bu_now();
  CK(cudaMemcpy(c->dst, c->src, c->bytes, c->kind));
  return bu_now() - t0;
}

/* The same through a shared memory region (pd_shared_memory_create): the
 * value is already in the region (a program that produces its data there
 * pays no copy), the daemon reads it from its page-locked mapping. Creating
 * and registering the region is not timed. A region that cannot be made
 * (a remote daemon, a small /dev/shm, a daemon without the feature) is
 * reported and skipped; a transfer that fails or differs is a failure. */
typedef struct shm_arg {
  pd_shared_memory *region;
  size_t bytes;
} shm_arg;

static double run_shm_upload(void *arg) {
  shm_arg *x = arg;
  const int64_t dims[2] = {(int64_t)(x->bytes / 4096), 1024};
  uint64_t id = ID_X;
  double t0 = bu_now();
  if (pd_upload_from_shared_memory(sess, id, PD_FLOAT32, dims, 2, x->region, 0,
                                   pd_layout_mirrored(), NULL, NULL,
                                   st) != PD_OK)
    die("UploadFromSharedMemory");
  if (pd_sync(sess, &id, 1, NULL, NULL, st) != PD_OK) die("Sync");
  double t = bu_now() - t0;
  if (pd_delete(sess, &id, 1, NULL, st) != PD_OK) die("Delete");
  return t;
}

static double run_shm_download(void *arg) {
  shm_arg *x = arg;
  size_t got = 0;
  double t0 = bu_now();
  if (pd_download_to_shared_memory(sess, ID_X, pd_layout_mirrored(), x->region,
                                   0, NULL, &got, NULL, st) != PD_OK)
    die("DownloadToSharedMemory");
  double t = bu_now() - t0;
  if (got != x->bytes) {
    fprintf(stderr,
            "bench_gpu_rpc: DownloadToSharedMemory wrote %zu bytes, expected "
            "%zu\n",
            got, x->bytes);
    exit(1);
  }
  return t;
}

static int bench_shm(const float *up, size_t bytes, double min_time,
                     double base_h2d, double base_d2h) {
  pd_shared_memory *region = NULL;
  if (pd_shared_memory_create(sess, bytes, 0, &region, NULL, st) != PD_OK) {
    printf(
        "  shared memory: not measured: a region of %zu bytes could not be "
        "made: %s: %s\n",
        bytes, pd_code_name(pd_status_code(st)), pd_status_message(st));
    return 0;
  }
  int rc = 0;
  void *data = pd_shared_memory_data(region);
  memcpy(data, up, bytes);
  shm_arg x = {region, bytes};
  double t_up =
      bu_measure_reported(run_shm_upload, &x, 1, 5, min_time).median_s;
  const int64_t dims[2] = {(int64_t)(bytes / 4096), 1024};
  if (pd_upload_from_shared_memory(sess, ID_X, PD_FLOAT32, dims, 2, region, 0,
                                   pd_layout_mirrored(), NULL, NULL,
                                   st) != PD_OK)
    die("UploadFromSharedMemory");
  memset(data, 0xff, bytes); /* what comes back is the upload, not leftovers */
  double t_down =
      bu_measure_reported(run_shm_download, &x, 1, 5, min_time).median_s;
  if (memcmp(up, data, bytes) != 0) {
    fprintf(stderr,
            "bench_gpu_rpc: the shared memory download differs from "
            "the upload\n");
    rc = 1;
  }
  uint64_t id = ID_X;
  if (pd_delete(sess, &id, 1, NULL, st) != PD_OK) die("Delete");
  if (pd_shared_memory_destroy(region, NULL, st) != PD_OK)
    die("UnregisterSharedMemory");

  char params[256], sb[32];
  bu_size_str(bytes, sb, sizeof sb);
  snprintf(
      params, sizeof params,
      "\"bytes\": %zu, \"path\": \"shm\", \"devices\": %d, \"backend\": \"%s\"",
      bytes, mesh_devices, g_backend);
  double g_up = (double)bytes / t_up * 1e-9,
         g_down = (double)bytes / t_down * 1e-9;
  if (baseline) {
    printf("  upload %s from shared memory: %.2f GB/s (ratio %.3f)\n", sb, g_up,
           g_up / base_h2d);
    printf("  download %s to shared memory: %.2f GB/s (ratio %.3f)\n", sb,
           g_down, g_down / base_d2h);
  } else {
    printf("  upload %s from shared memory: %.2f GB/s\n", sb, g_up);
    printf("  download %s to shared memory: %.2f GB/s\n", sb, g_down);
  }
  bu_record("upload_gpu_rpc", params, "GBps", g_up,
            baseline ? "cudaMemcpy_h2d_pinned_GBps" : NULL, base_h2d);
  bu_record("download_gpu_rpc", params, "GBps", g_down,
            baseline ? "cudaMemcpy_d2h_pinned_GBps" : NULL, base_d2h);
  return rc;
}

static int bench_transfers(size_t bytes, double min_time) {
  int rc = 0;
  float *up = bu_xmalloc(bytes), *down = bu_xmalloc(bytes);
  for (size_t i = 0; i < bytes / 4; i++) up[i] = (float)rand_unit();
  xfer_arg xu = {up, bytes}, xd = {down, bytes};
  double t_up = bu_measure_reported(run_upload, &xu, 1, 5, min_time).median_s;
  const int64_t dims[2] = {(int64_t)(bytes / 4096), 1024};
  if (pd_upload(sess, ID_X, PD_FLOAT32, dims, 2, up, bytes,
                pd_layout_mirrored(), NULL, NULL, st) != PD_OK)
    die("Upload");
  double t_down =
      bu_measure_reported(run_download, &xd, 1, 5, min_time).median_s;
  memset(down, 0xff, bytes);
  run_download(&xd);
  if (memcmp(up, down, bytes) != 0) {
    fprintf(stderr, "bench_gpu_rpc: the download differs from the upload\n");
    rc = 1;
  }
  uint64_t id = ID_X;
  if (pd_delete(sess, &id, 1, NULL, st) != PD_OK) die("Delete");

  double base_h2d = 0, base_d2h = 0;
  if (baseline) {
    void *pinned, *dev;
    CK(cudaMallocHost(&pinned, bytes));
    CK(cudaMalloc(&dev, bytes));
    memcpy(pinned, up, bytes);
    memcpy_arg h2d = {dev, pinned, bytes, cudaMemcpyHostToDevice};
    memcpy_arg d2h = {pinned, dev, bytes, cudaMemcpyDeviceToHost};
    base_h2d = (double)bytes /
               bu_measure_reported(run_memcpy, &h2d, 1, 5, min_time).median_s *
               1e-9;
    base_d2h = (double)bytes /
               bu_measure_reported(run_memcpy, &d2h, 1, 5, min_time).median_s *
               1e-9;
    cudaFreeHost(pinned);
    cudaFree(dev);
  }

  char params[256], sb[32];
  bu_size_str(bytes, sb, sizeof sb);
  snprintf(
      params, sizeof params,
      "\"bytes\": %zu, \"path\": \"grpc\", \"chunk_bytes\": %zu, "
      "\"host_memory\": \"pageable\", \"devices\": %d, \"backend\": \"%s\"",
      bytes, CHUNK, mesh_devices, g_backend);
  double g_up = (double)bytes / t_up * 1e-9,
         g_down = (double)bytes / t_down * 1e-9;
  if (baseline) {
    printf(
        "  upload %s through Upload: %.2f GB/s (cudaMemcpy from pinned %.1f "
        "GB/s, ratio %.3f)\n",
        sb, g_up, base_h2d, g_up / base_h2d);
    printf(
        "  download %s through Download: %.2f GB/s (cudaMemcpy to pinned "
        "%.1f GB/s, ratio %.3f)\n",
        sb, g_down, base_d2h, g_down / base_d2h);
  } else {
    printf("  upload %s through Upload: %.2f GB/s\n", sb, g_up);
    printf("  download %s through Download: %.2f GB/s\n", sb, g_down);
  }
  bu_record("upload_gpu_rpc", params, "GBps", g_up,
            baseline ? "cudaMemcpy_h2d_pinned_GBps" : NULL, base_h2d);
  bu_record("download_gpu_rpc", params, "GBps", g_down,
            baseline ? "cudaMemcpy_d2h_pinned_GBps" : NULL, base_d2h);

  rc |= bench_shm(up, bytes, min_time, base_h2d, base_d2h);
  free(up);
  free(down);
  return rc;
}

/* --- main ------------------------------------------------------------------------ */

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_gpu_rpc [--target ADDR] [--quick] [--no-baseline]\n"
          "  MatMul, Upload and Download through a running paradevd (cuda "
          "backend,\n"
          "  one-device mesh) beside cuBLAS and cudaMemcpy in this process.\n"
          "  --target ADDR  unix:/path or host:port (default $PARADEV_TARGET,\n"
          "                 else 127.0.0.1:7478)\n"
          "  --quick        smaller sizes (also PARADEV_BENCH_QUICK=1)\n"
          "  --no-baseline  no CUDA calls: the daemon side only, small sizes,\n"
          "                 any daemon and mesh\n");
}

/* The local CUDA device matching the daemon's device 0 ("cuda:N (name)"). */
static int local_device(const pd_device_info *d, int count) {
  int idx = 0;
  if (d && d->name && sscanf(d->name, "cuda:%d", &idx) != 1) idx = 0;
  if (idx < 0 || idx >= count) {
    printf(
        "bench_gpu_rpc: note: the daemon's device is %s; this process sees "
        "%d GPU(s): using cuda:0\n",
        d && d->name ? d->name : "?", count);
    idx = 0;
  }
  return idx;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a killed run still shows where it was */
  const char *target = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--target") == 0 && i + 1 < argc)
      target = argv[++i];
    else if (strcmp(argv[i], "--no-baseline") == 0)
      baseline = false;
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--quick") != 0) {
      fprintf(stderr, "bench_gpu_rpc: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!target || !*target) target = getenv("PARADEV_TARGET");
  if (!target || !*target) target = "127.0.0.1:7478";
  bool quick = bu_quick(argc, argv);
  signal(SIGPIPE, SIG_IGN);

  int gpus = 0;
  char gpu_name[300] = "none";
  if (baseline) {
    cudaError_t ce = cudaGetDeviceCount(&gpus);
    if (ce != cudaSuccess || gpus == 0) {
      printf(
          "bench_gpu_rpc: SKIP: no CUDA GPU in this process (%s); "
          "--no-baseline measures the daemon side alone\n",
          ce != cudaSuccess ? cudaGetErrorString(ce)
                            : "no CUDA-capable device is detected");
      return 77;
    }
  }

  st = pd_status_new();
  if (!st) return 1;
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.chunk_bytes = CHUNK;
  co.user_agent = "bench_gpu_rpc";
  pd_client *c = pd_client_new(target, &co, st);
  if (!c) die("connect");
  pd_serving_status ss = PD_SERVING_UNKNOWN;
  for (int i = 0; i < 100; i++) { /* up to ~10 s for a daemon just started */
    pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
    o.timeout_ms = 1000;
    if (pd_client_health(c, "", &ss, &o, st) == PD_OK && ss == PD_SERVING)
      break;
    usleep(100000);
  }
  if (ss != PD_SERVING) die("the daemon is not SERVING");
  pd_server_info *info = pd_client_get_server_info(c, NULL, st);
  if (!info) die("GetServerInfo");
  mesh_devices = pd_server_info_num_devices(info);
  char backend[32];
  snprintf(backend, sizeof backend, "%s", pd_server_info_backend(info));
  /* Recorded in every result, so rows of a --no-baseline run against a CPU
   * daemon are never mistaken for GPU figures. */
  snprintf(g_backend, sizeof g_backend, "%s%s", backend,
           baseline ? "" : ", no baseline");
  const pd_device_info *d0 = pd_server_info_device(info, 0);
  char dev_name[256];
  snprintf(dev_name, sizeof dev_name, "%s", d0 && d0->name ? d0->name : "?");

  int rc = 0;
  if (baseline) {
    if (strcmp(backend, "cuda") != 0 || mesh_devices != 1) {
      fprintf(stderr,
              "bench_gpu_rpc: the daemon at %s runs the %s backend with %d "
              "device(s) (first: %s); this benchmark compares one CUDA device "
              "with one direct cuBLAS call: start paradevd with --backend cuda "
              "--mesh cuda:0, or pass --no-baseline\n",
              target, backend, mesh_devices, dev_name);
      pd_server_info_delete(info);
      pd_client_delete(c);
      pd_status_delete(st);
      return 2;
    }
    int dev = local_device(d0, gpus);
    CK(cudaSetDevice(dev));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    snprintf(gpu_name, sizeof gpu_name, "cuda:%d (%s)", dev, prop.name);
    if (!strstr(dev_name, prop.name))
      printf(
          "bench_gpu_rpc: note: the daemon's device is %s, the baseline's "
          "%s: they may not be the same GPU\n",
          dev_name, gpu_name);
  }
  pd_server_info_delete(info);

  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_gpu_rpc";
  sess = pd_session_new(c, &so, NULL, st);
  if (!sess) die("CreateSession");
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  rng = ((uint64_t)now.tv_sec * 1000000007u) ^ (uint64_t)now.tv_nsec ^
        ((uint64_t)getpid() << 32);
  if (!rng) rng = 88172645463325252ull;

  double t0 = bu_now();
  printf(
      "bench_gpu_rpc: daemon %s (%s backend, %d device(s), first %s); "
      "baseline %s%s\n",
      target, backend, mesh_devices, dev_name,
      baseline ? gpu_name : "none (--no-baseline)", quick ? "; quick" : "");
  /* Sizes: the on a GPU; small ones for --no-baseline, which is
   * meant for any daemon (a CPU one on a small machine too). */
  int mm_bf16 = baseline ? (quick ? 4096 : 8192) : (quick ? 64 : 256);
  int mm_f32 = baseline ? (quick ? 2048 : 4096) : (quick ? 64 : 256);
  size_t xfer = baseline ? (quick ? (size_t)32 << 20 : (size_t)256 << 20)
                         : (quick ? (size_t)4 << 20 : (size_t)16 << 20);
  double min_time = baseline ? (quick ? 0.3 : 1.0) : (quick ? 0.05 : 0.2);
  printf("matmul: Execute + Sync through the daemon%s\n",
         baseline ? " vs cublasGemmEx in this process" : "");
  rc |= bench_matmul(PD_BFLOAT16, mm_bf16, min_time);
  rc |= bench_matmul(PD_FLOAT32, mm_f32, min_time);
  printf("upload/download: through the daemon%s\n",
         baseline ? " vs cudaMemcpy from/to pinned memory" : "");
  rc |= bench_transfers(xfer, min_time);

  if (pd_session_close(sess, NULL, st) != PD_OK) die("CloseSession");
  pd_session_delete(sess);
  pd_client_delete(c);
  pd_status_delete(st);
  rc |= bu_print_table();
  printf("bench_gpu_rpc: %.1f s\n", bu_now() - t0);
  return rc;
}
