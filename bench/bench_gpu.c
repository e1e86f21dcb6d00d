/* GPU benchmarks of the CUDA backend, each beside a baseline measured in the
 * same run on the same GPU (cuda:0):
 *
 *  matmul     MatMul through the engine (execute + dev_tensor_wait, output
 *             allocation included) vs the same cublasGemmEx call made
 *             directly on buffers of our own (+ cudaStreamSynchronize):
 *             8192x8192x8192 bfloat16 (tensor cores, float32 accumulation)
 *             and 4096^3 float32 (exact float32, no TF32). TFLOP/s = 2mnk/t.
 *             Aim: ratio >= 0.95. The engine's result is checked against the
 *             direct call's.
 *  allreduce  AllReduce(sum, float32) on 2 and 4 logical devices of one GPU
 *             (the copy path), mirrored input of 1 MiB .. 256 MiB per device.
 *             busbw = bytes / t * 2(n-1)/n (NCCL's definition). Baseline:
 *             cudaMemcpy device-to-device of the same size (GB/s).
 *  upload     dev_tensor_from_host of 256 MiB (float32, one device) from
 *             pageable and from pinned host memory, and dev_tensor_to_host
 *             back, vs cudaMemcpy from / to pinned memory. Aim: upload from
 *             pinned memory >= 0.7 of cudaMemcpy.
 *
 * Usage: bench_gpu [--quick]   (or PARADEV_BENCH_QUICK=1: smaller sizes).
 * Without a GPU it says so and exits 77. Results: a table on stdout, JSON
 * lines in bench-results.jsonl (see benchutil.h). Exit status 1 if an op
 * failed or a result differs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "benchutil.h"
#include "device.h"

#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "bench_gpu: %s: %s\n", #call, cudaGetErrorString(e_));   \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static dev_engine *make_engine(const char *mesh) {
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.backend = "cuda";
  cfg.mesh = mesh;
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_create(&cfg, &e, &st) != PD_OK) {
    fprintf(stderr, "bench_gpu: cuda engine \"%s\": %s: %s\n", mesh,
            pd_code_name(st.code), st.msg);
    return NULL;
  }
  return e;
}

/* ------------------------------------------------------------------------ */
/* MatMul                                                                    */

typedef struct op_arg {
  dev_engine *e;
  const char *op;
  dev_tensor *in[2];
  int n_in;
  dev_attr attrs[2];
  int n_attrs;
  pd_code code;
  dev_status st;
} op_arg;

static void run_op(void *p) {
  op_arg *a = p;
  if (a->code != PD_OK) return;
  dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
  int n_out = DEV_MAX_OUTPUTS;
  if (dev_execute(a->e, a->op, a->in, a->n_in, a->attrs, a->n_attrs, outs,
                  &n_out, &a->st) != PD_OK) {
    a->code = a->st.code;
    return;
  }
  if (dev_tensor_wait(outs[0], &a->st) != PD_OK) a->code = a->st.code;
  for (int i = 0; i < n_out; i++) dev_tensor_release(outs[i]);
}

typedef struct gemm_arg {
  cublasHandle_t h;
  cudaStream_t s;
  cudaDataType_t type;
  cublasComputeType_t compute;
  int m, n, k;
  void *a, *b, *c;
  cublasStatus_t status;
} gemm_arg;

/* Row-major C[m,n] = A[m,k] B[k,n], as the engine calls it. */
static void run_gemm(void *p) {
  gemm_arg *g = p;
  const float one = 1.0f, zero = 0.0f;
  g->status =
      cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->m, g->k, &one, g->b,
                   g->type, g->n, g->a, g->type, g->k, &zero, g->c, g->type,
                   g->n, g->compute, CUBLAS_GEMM_DEFAULT);
  cudaStreamSynchronize(g->s);
}

static int bench_matmul(pd_dtype dt, int size, double min_time) {
  const int m = size, n = size, k = size;
  const size_t es = pd_dtype_size(dt);
  const size_t elems = (size_t)size * (size_t)size;
  dev_engine *e = make_engine("cuda:0");
  if (!e) return 1;
  int rc = 0;
  /* Random inputs, uploaded to the engine and copied to our own buffers. */
  unsigned char *host = malloc(elems * es);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < elems; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    dev_store_f64(dt, host, (int64_t)i, (double)(x >> 11) * 0x1p-53 * 2 - 1);
  }
  dev_shape s = {2, {size, size}};
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_status st = DEV_STATUS_INIT;
  op_arg a = {.e = e, .op = "MatMul", .n_in = 2, .code = PD_OK};
  if (dev_tensor_from_host(e, dt, &lay, &s, host, &a.in[0], &st) != PD_OK ||
      dev_tensor_from_host(e, dt, &lay, &s, host, &a.in[1], &st) != PD_OK) {
    fprintf(stderr, "bench_gpu: upload: %s\n", st.msg);
    return 1;
  }
  bu_timing te = bu_measure(run_op, &a, min_time, 5);
  if (a.code != PD_OK) {
    fprintf(stderr, "bench_gpu: MatMul failed: %s\n", a.st.msg);
    rc = 1;
  }

  gemm_arg g = {.type = dt == PD_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F,
                .compute = CUBLAS_COMPUTE_32F,
                .m = m,
                .n = n,
                .k = k};
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&g.s, cudaStreamNonBlocking));
  if (cublasCreate(&g.h) != CUBLAS_STATUS_SUCCESS ||
      cublasSetStream(g.h, g.s) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "bench_gpu: cublasCreate failed\n");
    exit(1);
  }
  CK(cudaMalloc(&g.a, elems * es));
  CK(cudaMalloc(&g.b, elems * es));
  CK(cudaMalloc(&g.c, elems * es));
  CK(cudaMemcpy(g.a, host, elems * es, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(g.b, host, elems * es, cudaMemcpyHostToDevice));
  bu_timing td = bu_measure(run_gemm, &g, min_time, 5);
  if (g.status != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "bench_gpu: cublasGemmEx: %s\n",
            cublasGetStatusString(g.status));
    rc = 1;
  }

  /* The engine's product equals the direct call's (same library, same
   * arguments: bit for bit in practice; checked to the dtype's precision). */
  dev_tensor *out = NULL;
  int n_out = 1;
  if (rc == 0 &&
      dev_execute(e, "MatMul", a.in, 2, NULL, 0, &out, &n_out, &st) == PD_OK) {
    unsigned char *got = malloc(elems * es), *want = malloc(elems * es);
    CK(cudaMemcpy(want, g.c, elems * es, cudaMemcpyDeviceToHost));
    if (dev_tensor_to_host(out, &lay, 0, got, elems * es, &st) != PD_OK) {
      fprintf(stderr, "bench_gpu: download: %s\n", st.msg);
      rc = 1;
    }
    double tol = dt == PD_BFLOAT16 ? 1e-2 : 1e-5, worst = 0;
    for (size_t i = 0; i < elems && rc == 0; i += 997) {
      double w = dev_load_f64(dt, want, (int64_t)i),
             v = dev_load_f64(dt, got, (int64_t)i);
      double err = fabs(v - w) / fmax(fabs(w), 1.0);
      if (err > worst) worst = err;
    }
    if (worst > tol) {
      fprintf(stderr,
              "bench_gpu: MatMul result differs from cublasGemmEx (%g)\n",
              worst);
      rc = 1;
    }
    free(got);
    free(want);
    dev_tensor_release(out);
  }
  double flops = 2.0 * m * n * (double)k;
  double tf_e = flops / te.median_s * 1e-12, tf_d = flops / td.median_s * 1e-12;
  char params[160];
  snprintf(params, sizeof params,
           "\"dtype\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d",
           pd_dtype_name(dt), m, n, k);
  printf(
      "  MatMul %s %dx%dx%d: engine %.1f TFLOP/s, cublasGemmEx %.1f TFLOP/s, "
      "ratio %.3f\n",
      pd_dtype_name(dt), m, n, k, tf_e, tf_d, tf_e / tf_d);
  bu_record("matmul_gpu", params, "TFLOPs", tf_e, "cublasGemmEx_TFLOPs", tf_d);
  cudaFree(g.a);
  cudaFree(g.b);
  cudaFree(g.c);
  cublasDestroy(g.h);
  cudaStreamDestroy(g.s);
  dev_tensor_release(a.in[0]);
  dev_tensor_release(a.in[1]);
  dev_engine_destroy(e);
  free(host);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* AllReduce on logical devices                                              */

typedef struct copy_arg {
  void *dst, *src;
  size_t bytes;
  cudaStream_t s;
} copy_arg;

static void run_d2d(void *p) {
  copy_arg *c = p;
  cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, c->s);
  cudaStreamSynchronize(c->s);
}

static int bench_allreduce(int n, bool quick) {
  static const size_t sizes[] = {1u << 20, 16u << 20, 64u << 20, 256u << 20};
  char mesh[128] = "";
  for (int i = 0; i < n; i++) strcat(mesh, i ? ",cuda:0" : "cuda:0");
  dev_engine *e = make_engine(mesh);
  if (!e) return 1;
  int rc = 0;
  CK(cudaSetDevice(0));
  copy_arg c = {0};
  CK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
    size_t bytes = sizes[z];
    if (quick && bytes > (16u << 20)) break;
    int64_t elems = (int64_t)(bytes / 4);
    dev_attr attr = dev_attr_string("reduction", "sum");
    op_arg a = {
        .e = e, .op = "AllReduce", .n_in = 1, .n_attrs = 1, .code = PD_OK};
    a.attrs[0] = attr;
    dev_attr fill[3] = {dev_attr_shape("shape", 1, &elems),
                        dev_attr_float("value", 1),
                        dev_attr_dtype("dtype", PD_FLOAT32)};
    int one = 1;
    if (dev_execute(e, "Fill", NULL, 0, fill, 3, &a.in[0], &one, &a.st) !=
        PD_OK) {
      fprintf(stderr, "bench_gpu: Fill: %s\n", a.st.msg);
      rc = 1;
      break;
    }
    bu_timing t = bu_measure(run_op, &a, 0.5, 5);
    if (a.code != PD_OK) {
      fprintf(stderr, "bench_gpu: AllReduce: %s\n", a.st.msg);
      rc = 1;
    }
    dev_tensor_release(a.in[0]);
    c.bytes = bytes;
    CK(cudaMalloc(&c.src, bytes));
    CK(cudaMalloc(&c.dst, bytes));
    bu_timing tc = bu_measure(run_d2d, &c, 0.3, 5);
    cudaFree(c.src);
    cudaFree(c.dst);
    double busbw = (double)bytes / t.median_s * 2.0 * (n - 1) / n * 1e-9;
    double memcpy_bw = (double)bytes / tc.median_s * 1e-9;
    char params[128], sb[32];
    snprintf(params, sizeof params,
             "\"devices\": %d, \"logical\": true, \"bytes\": %zu", n, bytes);
    printf(
        "  AllReduce %d logical devices %s: busbw %.1f GB/s, cudaMemcpy d2d "
        "%.1f GB/s\n",
        n, bu_size_str(bytes, sb, sizeof sb), busbw, memcpy_bw);
    bu_record("allreduce_gpu", params, "busbw_GBps", busbw,
              "cudaMemcpy_d2d_GBps", memcpy_bw);
  }
  cudaStreamDestroy(c.s);
  dev_engine_destroy(e);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Uploads and downloads                                                     */

typedef struct xfer_arg {
  dev_engine *e;
  void *host;
  size_t bytes;
  dev_tensor *t; /* for downloads */
  int code;
  dev_status st;
} xfer_arg;

static void run_upload(void *p) {
  xfer_arg *x = p;
  dev_shape s = {1, {(int64_t)(x->bytes / 4)}};
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *t = NULL;
  if (dev_tensor_from_host(x->e, PD_FLOAT32, &lay, &s, x->host, &t, &x->st) !=
      PD_OK)
    x->code = 1;
  else if (dev_tensor_wait(t, &x->st) != PD_OK)
    x->code = 1;
  dev_tensor_release(t);
}

static void run_download(void *p) {
  xfer_arg *x = p;
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  if (dev_tensor_to_host(x->t, &lay, 0, x->host, x->bytes, &x->st) != PD_OK)
    x->code = 1;
}

typedef struct memcpy_arg {
  void *dst;
  const void *src;
  size_t bytes;
  enum cudaMemcpyKind kind;
} memcpy_arg;

static void run_memcpy(void *p) {
  memcpy_arg *m = p;
  cudaMemcpy(m->dst, m->src, m->bytes, m->kind);
}

static int bench_transfers(bool quick) {
  const size_t bytes = quick ? (size_t)32 << 20 : (size_t)256 << 20;
  dev_engine *e = make_engine("cuda:0");
  if (!e) return 1;
  int rc = 0;
  CK(cudaSetDevice(0));
  void *pinned, *dev;
  CK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dev, bytes));
  void *pageable = malloc(bytes);
  memset(pageable, 1, bytes);
  memset(pinned, 1, bytes);
  memcpy_arg h2d = {dev, pinned, bytes, cudaMemcpyHostToDevice};
  memcpy_arg d2h = {pinned, dev, bytes, cudaMemcpyDeviceToHost};
  bu_timing th = bu_measure(run_memcpy, &h2d, 0.5, 5);
  bu_timing tdh = bu_measure(run_memcpy, &d2h, 0.5, 5);
  double base_h2d = (double)bytes / th.median_s * 1e-9,
         base_d2h = (double)bytes / tdh.median_s * 1e-9;

  xfer_arg up_pageable = {e, pageable, bytes, NULL, 0, DEV_STATUS_INIT};
  xfer_arg up_pinned = {e, pinned, bytes, NULL, 0, DEV_STATUS_INIT};
  bu_timing tu1 = bu_measure(run_upload, &up_pageable, 0.5, 5);
  bu_timing tu2 = bu_measure(run_upload, &up_pinned, 0.5, 5);
  dev_shape s = {1, {(int64_t)(bytes / 4)}};
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  xfer_arg down_pageable = {e, pageable, bytes, NULL, 0, DEV_STATUS_INIT};
  if (dev_tensor_from_host(e, PD_FLOAT32, &lay, &s, pageable, &down_pageable.t,
                           &down_pageable.st) != PD_OK) {
    fprintf(stderr, "bench_gpu: upload: %s\n", down_pageable.st.msg);
    return 1;
  }
  xfer_arg down_pinned = down_pageable;
  down_pinned.host = pinned;
  bu_timing td1 = bu_measure(run_download, &down_pageable, 0.5, 5);
  bu_timing td2 = bu_measure(run_download, &down_pinned, 0.5, 5);
  if (up_pageable.code || up_pinned.code || down_pageable.code ||
      down_pinned.code) {
    fprintf(stderr, "bench_gpu: a transfer failed\n");
    rc = 1;
  }
  dev_tensor_release(down_pageable.t);
  char params[128], sb[32];
  bu_size_str(bytes, sb, sizeof sb);
  struct {
    const char *what, *src;
    bu_timing t;
    double base;
    const char *bname;
  } rows[] = {
      {"upload", "pageable", tu1, base_h2d, "cudaMemcpy_h2d_pinned_GBps"},
      {"upload", "pinned", tu2, base_h2d, "cudaMemcpy_h2d_pinned_GBps"},
      {"download", "pageable", td1, base_d2h, "cudaMemcpy_d2h_pinned_GBps"},
      {"download", "pinned", td2, base_d2h, "cudaMemcpy_d2h_pinned_GBps"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    double gbps = (double)bytes / rows[i].t.median_s * 1e-9;
    snprintf(params, sizeof params, "\"bytes\": %zu, \"host_memory\": \"%s\"",
             bytes, rows[i].src);
    printf("  %s %s from %s memory: %.1f GB/s (cudaMemcpy pinned %.1f GB/s)\n",
           rows[i].what, sb, rows[i].src, gbps, rows[i].base);
    bu_record(i < 2 ? "upload_gpu" : "download_gpu", params, "GBps", gbps,
              rows[i].bname, rows[i].base);
  }
  cudaFreeHost(pinned);
  cudaFree(dev);
  free(pageable);
  dev_engine_destroy(e);
  return rc;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a killed run still shows where it was */
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || count == 0) {
    printf("bench_gpu: SKIP: no CUDA GPU (%s)\n",
           ce != cudaSuccess ? cudaGetErrorString(ce)
                             : "no CUDA-capable device is detected");
    return 77;
  }
  bool quick = bu_quick(argc, argv);
  double t0 = bu_now();
  int rc = 0;
  printf("matmul: through the engine vs cublasGemmEx directly (cuda:0)%s\n",
         quick ? " (quick)" : "");
  rc |= bench_matmul(PD_BFLOAT16, quick ? 4096 : 8192, quick ? 0.3 : 1.0);
  rc |= bench_matmul(PD_FLOAT32, quick ? 2048 : 4096, quick ? 0.3 : 1.0);
  printf(
      "allreduce: copy path on logical devices of cuda:0 vs cudaMemcpy d2d\n");
  rc |= bench_allreduce(2, quick);
  rc |= bench_allreduce(4, quick);
  printf(
      "upload/download: through the engine vs cudaMemcpy from/to pinned "
      "memory\n");
  rc |= bench_transfers(quick);
  rc |= bu_print_table();
  printf("bench_gpu: %.1f s\n", bu_now() - t0);
  return rc;
}
