/* Engine benchmarks, each beside a baseline measured in the same run:
 *
 *  allreduce  AllReduce(reduction=sum, float32) on a CPU engine of 4 simulated
 *             devices, mirrored input of 4 KiB .. 256 MiB per device. Time is
 *             submit + dev_tensor_wait on the output (output allocation
 *             included, as every real op pays it). Bus bandwidth as NCCL
 *             defines it: busbw = bytes / time * 2(n-1)/n. Baseline:
 *             single-thread memcpy of the same size.
 *  matmul     MatMul 1024x1024x1024 float32 through a 1-device engine vs
 *             cblas_sgemm called directly on the same data (GFLOP/s, 2mnk
 *             flops). The engine's result is checked against cblas's.
 *
 * Usage: bench_engine [--quick]   (or PARADEV_BENCH_QUICK=1: sizes stop at
 * 16 MiB). Results: a table on stdout, JSON lines in bench-results.jsonl
 * (see benchutil.h). Exit status 1 if an op failed or results differ. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "benchutil.h"
#include "device.h"

#define AR_DEVICES 4
#define MM_SIZE 1024

static dev_engine *make_engine(int n) {
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.backend = "cpu";
  cfg.num_devices = n;
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_create(&cfg, &e, &st) != PD_OK) {
    fprintf(stderr, "bench_engine: engine of %d devices: %s: %s\n", n,
            pd_code_name(st.code), st.msg);
    return NULL;
  }
  return e;
}

/* One op through the engine: execute, wait for output 0, release. */
typedef struct op_arg {
  dev_engine *e;
  const char *op;
  dev_tensor *in[2];
  int n_in;
  dev_attr attrs[2];
  int n_attrs;
  pd_code code; /* first failure seen */
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

static int bench_allreduce(bool quick) {
  static const size_t sizes[] = {4u << 10,  64u << 10, 1u << 20,
                                 16u << 20, 64u << 20, 256u << 20};
  const int n = AR_DEVICES;
  dev_engine *e = make_engine(n);
  if (!e) return 1;
  int rc = 0;
  printf(
      "allreduce: AllReduce(sum, float32), %d simulated devices, mirrored "
      "input%s\n",
      n, quick ? " (quick mode)" : "");
  printf("  %-8s %12s %12s %12s %8s\n", "size", "time_us", "busbw_GBps",
         "memcpy_GBps", "ratio");
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t bytes = sizes[k];
    if (quick && bytes > (16u << 20)) break;
    int64_t count = (int64_t)(bytes / sizeof(float));
    float *host = malloc(bytes);
    if (!host) {
      fprintf(stderr, "allreduce: cannot allocate %zu bytes\n", bytes);
      rc = 1;
      break;
    }
    for (int64_t i = 0; i < count; i++) host[i] = (float)(i % 1000) * 0.001f;
    dev_shape shape;
    dev_status st = DEV_STATUS_INIT;
    dev_layout mirrored = {DEV_LAYOUT_MIRRORED, 0, 0};
    dev_tensor *in = NULL;
    if (dev_shape_make(1, &count, &shape, &st) != PD_OK ||
        dev_tensor_from_host(e, PD_FLOAT32, &mirrored, &shape, host, &in,
                             &st) != PD_OK) {
      fprintf(stderr, "allreduce: upload of %zu bytes: %s\n", bytes, st.msg);
      free(host);
      rc = 1;
      break;
    }
    free(host);

    op_arg a = {.e = e,
                .op = "AllReduce",
                .in = {in},
                .n_in = 1,
                .n_attrs = 1,
                .code = PD_OK};
    a.attrs[0] = dev_attr_string("reduction", "sum");
    /* Large sizes take long per call: fewer, but at least 3, repeats. */
    double min_time = bytes >= (64u << 20) ? 0.5 : 0.3;
    bu_timing t = bu_measure(run_op, &a, min_time, 3);
    dev_tensor_release(in);
    if (a.code != PD_OK) {
      fprintf(stderr, "allreduce: %s: %s\n", pd_code_name(a.code), a.st.msg);
      rc = 1;
      break;
    }
    double busbw = (double)bytes / t.median_s * 2.0 * (n - 1) / n / 1e9;
    double mc = bu_memcpy_gbps(bytes, min_time);
    char sz[32], params[160];
    bu_size_str(bytes, sz, sizeof sz);
    printf("  %-8s %12.1f %12.3f %12.3f %8.3f\n", sz, t.median_s * 1e6, busbw,
           mc, mc > 0 ? busbw / mc : NAN);
    fflush(stdout);
    snprintf(params, sizeof params,
             "\"devices\": %d, \"bytes\": %zu, \"dtype\": \"float32\", "
             "\"reduction\": \"sum\"",
             n, bytes);
    bu_record("allreduce", params, "busbw_GBps", busbw, "memcpy_GBps", mc);
  }
  dev_engine_destroy(e);
  return rc;
}

typedef struct gemm_arg {
  const float *a, *b;
  float *c;
  int m, n, k;
} gemm_arg;

static void run_gemm(void *p) {
  gemm_arg *g = p;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->m, g->n, g->k, 1.0f,
              g->a, g->k, g->b, g->n, 0.0f, g->c, g->n);
}

static int bench_matmul(void) {
  const int m = MM_SIZE, n = MM_SIZE, k = MM_SIZE;
  dev_engine *e = make_engine(1);
  if (!e) return 1;
  int rc = 0;
  size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
  float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b);
  float *c = malloc(nc * sizeof *c), *got = malloc(nc * sizeof *got);
  dev_tensor *ta = NULL, *tb = NULL;
  if (!a || !b || !c || !got) {
    fprintf(stderr, "matmul: out of memory\n");
    rc = 1;
    goto out;
  }
  uint64_t x = 88172645463325252ull; /* xorshift64 */
  for (size_t i = 0; i < na + nb; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float v = (float)((double)(x >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
    if (i < na)
      a[i] = v;
    else
      b[i - na] = v;
  }
  dev_status st = DEV_STATUS_INIT;
  dev_layout mirrored = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_shape sa, sb;
  int64_t da[2] = {m, k}, db[2] = {k, n};
  if (dev_shape_make(2, da, &sa, &st) != PD_OK ||
      dev_shape_make(2, db, &sb, &st) != PD_OK ||
      dev_tensor_from_host(e, PD_FLOAT32, &mirrored, &sa, a, &ta, &st) !=
          PD_OK ||
      dev_tensor_from_host(e, PD_FLOAT32, &mirrored, &sb, b, &tb, &st) !=
          PD_OK) {
    fprintf(stderr, "matmul: upload: %s\n", st.msg);
    rc = 1;
    goto out;
  }

  /* Correctness first: the engine's product against cblas's. */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b,
              n, 0.0f, c, n);
  {
    dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
    int n_out = DEV_MAX_OUTPUTS;
    dev_tensor *ins[2] = {ta, tb};
    dev_layout comp0 = {DEV_LAYOUT_COMPONENT, 0, 0};
    if (dev_execute(e, "MatMul", ins, 2, NULL, 0, outs, &n_out, &st) != PD_OK ||
        dev_tensor_to_host(outs[0], &comp0, 0, got, nc * sizeof *got, &st) !=
            PD_OK) {
      fprintf(stderr, "matmul: %s: %s\n", pd_code_name(st.code), st.msg);
      for (int i = 0; i < n_out; i++) dev_tensor_release(outs[i]);
      rc = 1;
      goto out;
    }
    for (int i = 0; i < n_out; i++) dev_tensor_release(outs[i]);
    double worst = 0;
    for (size_t i = 0; i < nc; i++) {
      double d = fabs((double)got[i] - (double)c[i]);
      if (d > worst) worst = d;
    }
    /* Entries are sums of 1024 products in [-1, 1]: |c| <= 1024. */
    if (worst > 1e-2) {
      fprintf(stderr, "matmul: engine result differs from cblas_sgemm by %g\n",
              worst);
      rc = 1;
    }
  }

  op_arg arg = {.e = e,
                .op = "MatMul",
                .in = {ta, tb},
                .n_in = 2,
                .n_attrs = 0,
                .code = PD_OK};
  bu_timing te = bu_measure(run_op, &arg, 1.0, 5);
  if (arg.code != PD_OK) {
    fprintf(stderr, "matmul: %s: %s\n", pd_code_name(arg.code), arg.st.msg);
    rc = 1;
    goto out;
  }
  /* cblas directly on the same data, timed the same way. */
  gemm_arg g = {a, b, c, m, n, k};
  bu_timing tc = bu_measure(run_gemm, &g, 1.0, 5);
  double flops = 2.0 * m * n * k;
  double ge = flops / te.median_s / 1e9, gc = flops / tc.median_s / 1e9;
  printf("\nmatmul: %dx%dx%d float32, 1-device engine vs cblas_sgemm\n", m, k,
         n);
  printf(
      "  engine %.2f ms (%.1f GFLOP/s), cblas_sgemm %.2f ms (%.1f GFLOP/s), "
      "ratio %.3f\n",
      te.median_s * 1e3, ge, tc.median_s * 1e3, gc, ge / gc);
  char params[160];
  snprintf(params, sizeof params,
           "\"m\": %d, \"n\": %d, \"k\": %d, \"dtype\": \"float32\", "
           "\"devices\": 1",
           m, n, k);
  bu_record("matmul", params, "GFLOPs", ge, "cblas_sgemm_GFLOPs", gc);
out:
  dev_tensor_release(ta);
  dev_tensor_release(tb);
  dev_engine_destroy(e);
  free(a);
  free(b);
  free(c);
  free(got);
  return rc;
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  double t0 = bu_now();
  int rc = bench_allreduce(quick);
  rc |= bench_matmul();
  rc |= bu_print_table();
  printf("bench_engine: %.1f s\n", bu_now() - t0);
  return rc;
}
