/* Engine benchmarks, each beside a baseline measured in the same run:
 *
 *  allreduce  AllReduce(reduction=sum, float32) on a CPU engine of 4 simulated
 *             devices, mirrored input of 4 KiB .. 256 MiB per device. Time is
 *             submit + dev_tensor_wait on the output (output allocation
 *             included, as every real op pays it). Bus bandwidth as NCCL
 *             defines it: busbw = bytes / time * 2(n-1)/n. Baseline:
 *             single-thread memcpy of the same size, measured in 7 pairs
 *             interleaved with the AllReduce (alternating which goes
 *             first), so both see the same machine; the row is the median
 *             pair by ratio, with the ratio's range (issue #16: the
 *             baseline alone swung from 8 to 19 GB/s between sizes).
 *  matmul     MatMul 1024x1024x1024 float32 through a 1-device engine vs
 *             cblas_sgemm called directly on the same data (GFLOP/s, 2mnk
 *             flops). The engine's result is checked against cblas's.
 *  fused_matmul  _FusedMatMul(activation=relu) against MatMul + BiasAdd +
 *             Relu as three ops, float32, 1-device engine (calls/s; each
 *             call waits for its last output). Sizes 256^3 and 64x512x64.
 *  fused_elementwise  _FusedElementwise of a 4-op chain (relu(x * y + 0.5)
 *             - y) against the four ops (Mul, Add, Relu, Sub), float32, x
 *             [1024, 1024], y [1024] broadcast (calls/s). Both results are
 *             checked equal first.
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

/* Pairs of AllReduce and memcpy measurements per size (bench_allreduce). */
#define AR_PAIRS 7

/* Index of the median of v[0..n) (n odd). */
static int median_index(const double *v, int n) {
  for (int i = 0; i < n; i++) {
    int below = 0, equal = 0;
    for (int j = 0; j < n; j++) {
      below += v[j] < v[i];
      equal += v[j] == v[i];
    }
    if (below <= n / 2 && below + equal > n / 2) return i;
  }
  return 0;
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
    /* Subject and baseline interleaved (issue #16): AR_PAIRS pairs of one
     * AllReduce measurement and one memcpy measurement of the same size,
     * back to back and in alternating order, so both see the same machine;
     * the row is the median pair (by ratio), with the ratio's range. The
     * memcpy buffers are allocated and touched once per size. */
    double min_time = bytes >= (64u << 20) ? 0.25 : 0.15;
    bu_memcpy_buf mb;
    if (!bu_memcpy_buf_init(&mb, bytes)) {
      dev_tensor_release(in);
      fprintf(stderr, "allreduce: cannot allocate 2 x %zu bytes\n", bytes);
      rc = 1;
      break;
    }
    double ratio[AR_PAIRS], bw[AR_PAIRS], mcs[AR_PAIRS], us[AR_PAIRS];
    for (int p = 0; p < AR_PAIRS && a.code == PD_OK; p++) {
      bu_timing t, m;
      if (p % 2 == 0) {
        t = bu_measure(run_op, &a, min_time, 3);
        m = bu_measure(bu_memcpy_run, &mb, min_time, 3);
      } else {
        m = bu_measure(bu_memcpy_run, &mb, min_time, 3);
        t = bu_measure(run_op, &a, min_time, 3);
      }
      bw[p] = (double)bytes / t.median_s * 2.0 * (n - 1) / n / 1e9;
      mcs[p] = (double)bytes / m.median_s / 1e9;
      us[p] = t.median_s * 1e6;
      ratio[p] = bw[p] / mcs[p];
    }
    bu_memcpy_buf_free(&mb);
    dev_tensor_release(in);
    if (a.code != PD_OK) {
      fprintf(stderr, "allreduce: %s: %s\n", pd_code_name(a.code), a.st.msg);
      rc = 1;
      break;
    }
    int mid = median_index(ratio, AR_PAIRS);
    double lo = ratio[0], hi = ratio[0];
    for (int p = 1; p < AR_PAIRS; p++) {
      lo = ratio[p] < lo ? ratio[p] : lo;
      hi = ratio[p] > hi ? ratio[p] : hi;
    }
    char sz[32], params[256];
    bu_size_str(bytes, sz, sizeof sz);
    printf("  %-8s %12.1f %12.3f %12.3f %8.3f  (pairs %d, ratio %.3f-%.3f)\n",
           sz, us[mid], bw[mid], mcs[mid], ratio[mid], AR_PAIRS, lo, hi);
    fflush(stdout);
    snprintf(params, sizeof params,
             "\"devices\": %d, \"bytes\": %zu, \"dtype\": \"float32\", "
             "\"reduction\": \"sum\", \"pairs\": %d, \"statistic\": "
             "\"median pair, interleaved\", \"ratio_min\": %.4f, "
             "\"ratio_max\": %.4f",
             n, bytes, AR_PAIRS, lo, hi);
    bu_record("allreduce", params, "busbw_GBps", bw[mid], "memcpy_GBps",
              mcs[mid]);
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

/* ------------------------------------------------------------------------ */
/* Fused ops against the ops they replace                                    */

/* A chain of ops, each reading earlier results: step i runs op[i] on
 * inputs named by in[i][k] (>= 0: tensor base[k]; < 0: result -1 - j). */
#define CHAIN_MAX 6
typedef struct chain_arg {
  dev_engine *e;
  int n;
  const char *op[CHAIN_MAX];
  int n_in[CHAIN_MAX];
  int in[CHAIN_MAX][3];
  dev_attr attrs[CHAIN_MAX][3];
  int n_attrs[CHAIN_MAX];
  dev_tensor *base[4];
  dev_tensor *last; /* kept by chain_once when keep */
  bool keep;
  pd_code code;
  dev_status st;
} chain_arg;

static void chain_once(void *p) {
  chain_arg *a = p;
  if (a->code != PD_OK) return;
  dev_tensor *res[CHAIN_MAX] = {0};
  for (int i = 0; i < a->n && a->code == PD_OK; i++) {
    dev_tensor *in[3];
    for (int k = 0; k < a->n_in[i]; k++)
      in[k] = a->in[i][k] >= 0 ? a->base[a->in[i][k]] : res[-1 - a->in[i][k]];
    int no = 1;
    if (dev_execute(a->e, a->op[i], in, a->n_in[i], a->attrs[i], a->n_attrs[i],
                    &res[i], &no, &a->st) != PD_OK)
      a->code = a->st.code;
  }
  if (a->code == PD_OK && dev_tensor_wait(res[a->n - 1], &a->st) != PD_OK)
    a->code = a->st.code;
  for (int i = 0; i < a->n; i++) {
    if (a->keep && i == a->n - 1 && res[i]) {
      a->last = res[i];
      continue;
    }
    dev_tensor_release(res[i]);
  }
}

static dev_tensor *bench_upload(dev_engine *e, int rank, const int64_t *dims,
                                uint64_t seed) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  float *v = bu_xmalloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    v[i] = (float)((double)(seed >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
  }
  dev_shape s;
  dev_status st = DEV_STATUS_INIT;
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *t = NULL;
  if (dev_shape_make(rank, dims, &s, &st) != PD_OK ||
      dev_tensor_from_host(e, PD_FLOAT32, &lay, &s, v, &t, &st) != PD_OK)
    fprintf(stderr, "fused: upload: %s\n", st.msg);
  free(v);
  return t;
}

/* Runs both chains once keeping their results and compares them (max abs
 * difference, float32), then times each; records fused/unfused calls/s. */
static int bench_pair(const char *bench, const char *params, chain_arg *fused,
                      chain_arg *unfused, double tol) {
  fused->keep = unfused->keep = true;
  chain_once(fused);
  chain_once(unfused);
  fused->keep = unfused->keep = false;
  if (fused->code != PD_OK || unfused->code != PD_OK) {
    fprintf(stderr, "%s: %s\n", bench,
            fused->code != PD_OK ? fused->st.msg : unfused->st.msg);
    return 1;
  }
  size_t n = (size_t)(dev_tensor_bytes(fused->last) / sizeof(float));
  float *x = bu_xmalloc(n * sizeof *x), *y = bu_xmalloc(n * sizeof *y);
  dev_layout c0 = {DEV_LAYOUT_COMPONENT, 0, 0};
  dev_status st = DEV_STATUS_INIT;
  int rc = 0;
  if (dev_tensor_to_host(fused->last, &c0, 0, x, n * sizeof *x, &st) != PD_OK ||
      dev_tensor_to_host(unfused->last, &c0, 0, y, n * sizeof *y, &st) !=
          PD_OK) {
    fprintf(stderr, "%s: download: %s\n", bench, st.msg);
    rc = 1;
  }
  double worst = 0;
  for (size_t i = 0; rc == 0 && i < n; i++)
    if (fabs((double)x[i] - (double)y[i]) > worst)
      worst = fabs((double)x[i] - (double)y[i]);
  if (worst > tol) {
    fprintf(stderr, "%s: fused and unfused differ by %g\n", bench, worst);
    rc = 1;
  }
  free(x);
  free(y);
  dev_tensor_release(fused->last);
  dev_tensor_release(unfused->last);
  if (rc) return rc;
  bu_timing tf = bu_measure(chain_once, fused, 0.5, 5);
  bu_timing tu = bu_measure(chain_once, unfused, 0.5, 5);
  if (fused->code != PD_OK || unfused->code != PD_OK) return 1;
  printf("  %-18s %-34s fused %9.1f us, unfused %9.1f us, speed-up %.2f\n",
         bench, params, tf.median_s * 1e6, tu.median_s * 1e6,
         tu.median_s / tf.median_s);
  bu_record(bench, params, "calls_per_s", 1.0 / tf.median_s,
            "unfused_calls_per_s", 1.0 / tu.median_s);
  return 0;
}

static int bench_fused(void) {
  dev_engine *e = make_engine(1);
  if (!e) return 1;
  int rc = 0;
  printf("\nfused ops against the ops they replace (float32, 1 device)\n");
  static const int mkn[][3] = {{256, 256, 256}, {64, 512, 64}};
  for (int s = 0; s < 2 && rc == 0; s++) {
    int64_t m = mkn[s][0], k = mkn[s][1], n = mkn[s][2];
    chain_arg f = {.e = e, .n = 1, .code = PD_OK};
    f.base[0] = bench_upload(e, 2, (int64_t[]){m, k}, 1);
    f.base[1] = bench_upload(e, 2, (int64_t[]){k, n}, 2);
    f.base[2] = bench_upload(e, 1, (int64_t[]){n}, 3);
    f.op[0] = "_FusedMatMul";
    f.n_in[0] = 3;
    f.in[0][0] = 0, f.in[0][1] = 1, f.in[0][2] = 2;
    f.attrs[0][0] = dev_attr_string("activation", "relu");
    f.n_attrs[0] = 1;
    chain_arg u = {.e = e, .n = 3, .code = PD_OK};
    memcpy(u.base, f.base, sizeof u.base);
    u.op[0] = "MatMul", u.n_in[0] = 2, u.in[0][0] = 0, u.in[0][1] = 1;
    u.op[1] = "BiasAdd", u.n_in[1] = 2, u.in[1][0] = -1, u.in[1][1] = 2;
    u.op[2] = "Relu", u.n_in[2] = 1, u.in[2][0] = -2;
    char params[160];
    snprintf(params, sizeof params,
             "\"m\": %lld, \"k\": %lld, \"n\": %lld, \"activation\": "
             "\"relu\", \"dtype\": \"float32\"",
             (long long)m, (long long)k, (long long)n);
    rc |= bench_pair("fused_matmul", params, &f, &u, 0);
    for (int i = 0; i < 3; i++) dev_tensor_release(f.base[i]);
  }
  if (rc == 0) {
    static const int64_t prog[] = {3,  0,   1,  1, 100, 1000,
                                   40, 101, -1, 2, 102, 1};
    static const double half = 0.5;
    chain_arg f = {.e = e, .n = 1, .code = PD_OK};
    f.base[0] = bench_upload(e, 2, (int64_t[]){1024, 1024}, 4);
    f.base[1] = bench_upload(e, 1, (int64_t[]){1024}, 5);
    float hv = 0.5f;
    dev_shape scalar = {.rank = 0};
    dev_status st = DEV_STATUS_INIT;
    dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
    if (dev_tensor_from_host(e, PD_FLOAT32, &lay, &scalar, &hv, &f.base[2],
                             &st) != PD_OK)
      fprintf(stderr, "fused: upload: %s\n", st.msg);
    f.op[0] = "_FusedElementwise";
    f.n_in[0] = 2;
    f.in[0][0] = 0, f.in[0][1] = 1;
    f.attrs[0][0] = dev_attr_int_list("program", prog, 12);
    f.attrs[0][1] = dev_attr_float_list("constants", &half, 1);
    f.n_attrs[0] = 2;
    chain_arg u = {.e = e, .n = 4, .code = PD_OK};
    memcpy(u.base, f.base, sizeof u.base);
    u.op[0] = "Mul", u.n_in[0] = 2, u.in[0][0] = 0, u.in[0][1] = 1;
    u.op[1] = "Add", u.n_in[1] = 2, u.in[1][0] = -1, u.in[1][1] = 2;
    u.op[2] = "Relu", u.n_in[2] = 1, u.in[2][0] = -2;
    u.op[3] = "Sub", u.n_in[3] = 2, u.in[3][0] = -3, u.in[3][1] = 1;
    rc |= bench_pair("fused_elementwise",
                     "\"ops\": 4, \"shape\": [1024, 1024], \"broadcast\": "
                     "[1024], \"dtype\": \"float32\"",
                     &f, &u, 0);
    for (int i = 0; i < 3; i++) dev_tensor_release(f.base[i]);
  }
  dev_engine_destroy(e);
  return rc;
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  double t0 = bu_now();
  int rc = bench_allreduce(quick);
  rc |= bench_matmul();
  rc |= bench_fused();
  rc |= bu_print_table();
  printf("bench_engine: %.1f s\n", bu_now() - t0);
  return rc;
}
