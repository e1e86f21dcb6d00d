/* The CUDA backend's checks that need no GPU, run everywhere it is built:
 * mesh and config validation, kernel registration, and the error a machine
 * without a GPU gets from dev_engine_create("cuda"). Where a GPU is present,
 * the last check becomes "creation works and the device is healthy". */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "dev_backend.h"
#include "dev_cuda.h"

/* Why no GPU can be used here, or NULL when one can. */
static const char *no_gpu_reason(void) {
  static char why[256];
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(why, sizeof why, "%s", cudaGetErrorString(e));
    return why;
  }
  if (n == 0) return "no CUDA-capable device is detected";
  return NULL;
}

static void expect_create_fails(const char *mesh, pd_code code,
                                const char *needle) {
  dev_cuda_config cfg = DEV_CUDA_CONFIG_INITIALIZER;
  cfg.mesh = mesh;
  dev_backend *b = NULL;
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = dev_cuda_backend_create(&cfg, &b, &st);
  if (rc != code || !strstr(st.msg, needle))
    fail_msg("mesh \"%s\": got %s \"%s\"; expected %s containing \"%s\"",
             mesh ? mesh : "(NULL)", pd_code_name(rc), st.msg,
             pd_code_name(code), needle);
  assert_null(b);
}

/* Malformed meshes are INVALID_ARGUMENT before any GPU is looked for. */
static void test_mesh_syntax(void **state) {
  (void)state;
  expect_create_fails("gpu:0", PD_INVALID_ARGUMENT,
                      "entry 0 \"gpu:0\" is not a CUDA device");
  expect_create_fails("cuda:0,cuda:x", PD_INVALID_ARGUMENT,
                      "entry 1 \"cuda:x\"");
  expect_create_fails("cuda:", PD_INVALID_ARGUMENT,
                      "expected cuda:N or cuda:all");
  expect_create_fails("cuda:0,", PD_INVALID_ARGUMENT, "entry 1");
  expect_create_fails("cuda:all,cuda:0", PD_INVALID_ARGUMENT,
                      "cuda:all must be the only entry");
  expect_create_fails("cuda:0,cuda:all", PD_INVALID_ARGUMENT,
                      "cuda:all must be the only entry");
  char big[PD_MAX_DEVICES * 8 + 16] = "";
  for (int i = 0; i <= PD_MAX_DEVICES; i++)
    strcat(big, i ? ",cuda:0" : "cuda:0");
  expect_create_fails(big, PD_INVALID_ARGUMENT, "more than 64 entries");
  expect_create_fails("cuda:0,,cuda:1", PD_INVALID_ARGUMENT,
                      "entry 1 \"\" is not a CUDA device");
  expect_create_fails("cuda:-1", PD_INVALID_ARGUMENT, "entry 0 \"cuda:-1\"");
  expect_create_fails("cuda: 0", PD_INVALID_ARGUMENT, "entry 0 \"cuda: 0\"");
  expect_create_fails("cuda:99999999999", PD_INVALID_ARGUMENT,
                      "entry 0 \"cuda:99999999999\"");
  expect_create_fails("cuda:0;cuda:1", PD_INVALID_ARGUMENT,
                      "entry 0 \"cuda:0;cuda:1\"");
  expect_create_fails("CUDA:0", PD_INVALID_ARGUMENT, "is not a CUDA device");
}

/* Well-formed meshes get past parsing: without a GPU they fail only for want
 * of one (UNAVAILABLE), never as malformed. */
static void test_mesh_accepted(void **state) {
  (void)state;
  if (!no_gpu_reason())
    skip(); /* with a GPU, creation would succeed or fail on the GPU count */
  static const char *const ok[] = {NULL,
                                   "",
                                   "cuda:all",
                                   " cuda:0 , cuda:0 ",
                                   "cuda:0,cuda:1,cuda:0",
                                   "cuda:007",
                                   " cuda:all "};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    expect_create_fails(ok[i], PD_UNAVAILABLE, "no CUDA GPU found");
}

static void test_config_validation(void **state) {
  (void)state;
  dev_cuda_config cfg = DEV_CUDA_CONFIG_INITIALIZER;
  dev_backend *b = NULL;
  dev_status st = DEV_STATUS_INIT;
  cfg.struct_size = sizeof cfg - 1;
  assert_int_equal(dev_cuda_backend_create(&cfg, &b, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "struct_size"));
  cfg.struct_size = sizeof cfg;
  cfg.collectives = (dev_cuda_collectives)7;
  assert_int_equal(dev_cuda_backend_create(&cfg, &b, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "collectives"));
  assert_null(b);
  /* The environment's choice is checked before any GPU is looked for. */
  cfg.collectives = DEV_CUDA_COLL_AUTO;
  setenv("PARADEV_CUDA_COLLECTIVES", "ring", 1);
  pd_code rc = dev_cuda_backend_create(&cfg, &b, &st);
  unsetenv("PARADEV_CUDA_COLLECTIVES");
  assert_int_equal(rc, PD_INVALID_ARGUMENT);
  assert_string_equal(
      st.msg, "PARADEV_CUDA_COLLECTIVES=ring; expected auto, nccl or copy");
  assert_null(b);
}

/* The ops whose CUDA kernels this backend provides (the training path and
 * the rest of the engine's op set). Registration must have put each in
 * place; it aborts the process on a name the registry does not know. */
static const char *const k_cuda_ops[] = {
    "Neg",
    "Abs",
    "Square",
    "Relu",
    "Exp",
    "Log",
    "Sqrt",
    "Rsqrt",
    "Tanh",
    "Sigmoid",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Maximum",
    "Minimum",
    "Equal",
    "Greater",
    "Less",
    "Cast",
    "Fill",
    "ZerosLike",
    "OnesLike",
    "MatMul",
    "BatchMatMul",
    "BiasAdd",
    "Sum",
    "Mean",
    "Max",
    "Min",
    "ArgMax",
    "Softmax",
    "LogSoftmax",
    "SparseSoftmaxCrossEntropyWithLogits",
    "Transpose",
    "Concat",
    "Split",
    "SplitV",
    "Unpack",
    "Pack",
    "Slice",
    "Gather",
    "OneHot",
    "RandomUniform",
    "RandomNormal",
    "DeviceId",
    "ReluGrad",
    "SqrtGrad",
    "RsqrtGrad",
    "TanhGrad",
    "SigmoidGrad",
    "BroadcastToLike",
    "SumToLike",
    "SliceGrad",
    "ConcatGrad",
    "GatherGrad",
    "_FusedMatMul",
    "_FusedElementwise",
};

static void test_kernel_registration(void **state) {
  (void)state;
  dev_register_cuda_kernels();
  dev_register_cuda_kernels(); /* once only */
  for (size_t i = 0; i < sizeof k_cuda_ops / sizeof k_cuda_ops[0]; i++) {
    const dev_op_def *def = dev_op_lookup(k_cuda_ops[i]);
    if (!def) fail_msg("op %s is not registered", k_cuda_ops[i]);
    if (!def->kernels[DEV_BACKEND_CUDA])
      fail_msg("op %s has no CUDA kernel", k_cuda_ops[i]);
  }
  /* Say which ops would fail with UNIMPLEMENTED on the cuda backend (ops that
   * alias their input or run through the collectives need no kernel). */
  char missing[1024] = "";
  int nmiss = 0;
  for (int i = 0; i < dev_op_count(); i++) {
    const dev_op_def *def = dev_op_at(i);
    if (def->kernels[DEV_BACKEND_CUDA] ||
        (def->flags & (DEV_OP_ALIASES_INPUT | DEV_OP_COLLECTIVE)))
      continue;
    if (!def->kernels[DEV_BACKEND_CPU]) continue;
    size_t len = strlen(missing);
    snprintf(missing + len, sizeof missing - len, "%s%s", nmiss++ ? ", " : "",
             def->name);
  }
  printf("ops with a CPU kernel but no CUDA kernel yet (%d): %s\n", nmiss,
         nmiss ? missing : "none");
  /* Every op runs on the cuda backend: none may fail with UNIMPLEMENTED. */
  if (nmiss)
    fail_msg("%d op(s) have a CPU kernel but no CUDA kernel: %s", nmiss,
             missing);
}

/* dev_engine_create("cuda"): on a machine without a GPU, UNAVAILABLE with a
 * message that says so and how to run on the CPU, and no crash. */
static void test_engine_without_gpu(void **state) {
  (void)state;
  const char *why = no_gpu_reason();
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.backend = "cuda";
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = dev_engine_create(&cfg, &e, &st);
  if (why) {
    char want[512];
    snprintf(
        want, sizeof want,
        "no CUDA GPU found (cudaGetDeviceCount: %s); run with --backend=cpu",
        why);
    printf("no GPU here: dev_engine_create(cuda) says: %s\n", st.msg);
    assert_int_equal(rc, PD_UNAVAILABLE);
    assert_string_equal(st.msg, want);
    assert_null(e);
    /* Again, to show nothing was left half-initialized. */
    assert_int_equal(dev_engine_create(&cfg, &e, &st), PD_UNAVAILABLE);
    return;
  }
  if (rc != PD_OK)
    fail_msg("a GPU is present but the cuda engine failed: %s", st.msg);
  dev_backend *b = dev_engine_backend(e);
  assert_string_equal(b->name, "cuda");
  assert_true(b->struct_size >=
              offsetof(dev_backend, healthy) + sizeof b->healthy);
  for (int d = 0; d < dev_engine_num_devices(e); d++) {
    assert_true(b->healthy(b, d));
    dev_memory_stats ms;
    assert_int_equal(dev_engine_memory_stats(e, d, &ms, &st), PD_OK);
    assert_true(ms.bytes_total > 0);
    printf("device %d: %s, %llu MiB\n", d, b->device_name(b, d),
           (unsigned long long)(ms.bytes_total >> 20));
  }
  dev_engine_destroy(e);
}

/* The CPU backend keeps `healthy` NULL: always healthy. */
static void test_cpu_backend_has_no_health_hook(void **state) {
  (void)state;
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_create(NULL, &e, &st), PD_OK);
  assert_null(dev_engine_backend(e)->healthy);
  dev_engine_destroy(e);
}

/* ------------------------------------------------------------------------ */
/* CUDA graphs through the backend's hooks (device/cuda/graph.c)            */

/* Runs op `name` (CUDA kernel) on device 0 of `b` directly: float32 inputs
 * and one output of n elements each (same shapes). */
static pd_code run_direct(dev_backend *b, const char *name, void *const *in,
                          int n_in, void *out, int64_t n, dev_status *st) {
  const dev_op_def *def = dev_op_lookup(name);
  assert_non_null(def);
  assert_non_null(def->kernels[DEV_BACKEND_CUDA]);
  dev_shape s;
  assert_int_equal(dev_shape_make(1, &n, &s, NULL), PD_OK);
  pd_dtype dts[2] = {PD_FLOAT32, PD_FLOAT32};
  dev_shape shapes[2] = {s, s};
  const void *ins[2] = {in[0], n_in > 1 ? in[1] : NULL};
  void *outs[1] = {out};
  int alias[1] = {-1};
  dev_attr_value attrs[DEV_MAX_ATTRS];
  for (int i = 0; i < def->num_attrs; i++)
    attrs[i] = def->attrs[i].default_value;
  dev_kernel_ctx ctx = {.op = def,
                        .attrs = attrs,
                        .device = 0,
                        .num_devices = 1,
                        .backend = b,
                        .num_inputs = n_in,
                        .in_dtype = dts,
                        .in_shape = shapes,
                        .in_data = ins,
                        .num_outputs = 1,
                        .out_dtype = dts,
                        .out_shape = shapes,
                        .out_data = outs,
                        .out_alias = alias};
  return b->run_kernel(b, def->kernels[DEV_BACKEND_CUDA], &ctx, st);
}

static void put(dev_backend *b, void *dst, const float *v, int64_t n) {
  dev_status st = DEV_STATUS_INIT;
  if (b->copy_h2d(b, 0, dst, v, (size_t)n * sizeof *v, &st) != PD_OK)
    fail_msg("copy_h2d: %s", st.msg);
}

static void get(dev_backend *b, float *v, const void *src, int64_t n) {
  dev_status st = DEV_STATUS_INIT;
  if (b->copy_d2h(b, 0, v, src, (size_t)n * sizeof *v, &st) != PD_OK)
    fail_msg("copy_d2h: %s", st.msg);
}

/* Captures out = sqrt((x + y) * y) with the intermediate allocated and freed
 * inside the capture (graph memory nodes), checks that nothing ran, replays
 * it twice with new x between (values checked by hand); then a capture that
 * synchronizes (integer Div reads its check word back) fails at capture_end,
 * and the stream works normally afterwards. */
static void test_graph_capture(void **state) {
  (void)state;
  if (no_gpu_reason()) {
    printf("SKIP: no CUDA GPU (%s)\n", no_gpu_reason());
    skip();
  }
  dev_cuda_config cfg = DEV_CUDA_CONFIG_INITIALIZER;
  cfg.mesh = "cuda:0";
  dev_backend *b = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_cuda_backend_create(&cfg, &b, &st) != PD_OK)
    fail_msg("cuda backend: %s", st.msg);
  assert_true(b->struct_size >=
              offsetof(dev_backend, graph_destroy) + sizeof b->graph_destroy);
  assert_non_null(b->capture_begin);
  enum { N = 1000 };
  size_t bytes = N * sizeof(float);
  void *x, *y, *out, *tmp;
  assert_int_equal(b->allocate(b, 0, bytes, &x, &st), PD_OK);
  assert_int_equal(b->allocate(b, 0, bytes, &y, &st), PD_OK);
  assert_int_equal(b->allocate(b, 0, bytes, &out, &st), PD_OK);
  float hx[N], hy[N], ho[N], zero[N] = {0};
  for (int i = 0; i < N; i++) hx[i] = (float)i, hy[i] = 2.0f;
  put(b, x, hx, N);
  put(b, y, hy, N);
  put(b, out, zero, N);
  assert_int_equal(b->capture_begin(b, 0, &st), PD_OK);
  assert_int_equal(b->capture_begin(b, 0, &st), PD_FAILED_PRECONDITION);
  assert_int_equal(b->allocate(b, 0, bytes, &tmp, &st), PD_OK);
  void *in1[2] = {x, y}, *in2[2] = {tmp, y}, *in3[1] = {out};
  if (run_direct(b, "Add", in1, 2, tmp, N, &st) != PD_OK ||
      run_direct(b, "Mul", in2, 2, out, N, &st) != PD_OK ||
      run_direct(b, "Sqrt", in3, 1, out, N, &st) != PD_OK)
    fail_msg("kernel under capture: %s", st.msg);
  b->deallocate(b, 0, tmp, bytes);
  void *graph = NULL;
  if (b->capture_end(b, 0, &graph, &st) != PD_OK)
    fail_msg("capture_end: %s", st.msg);
  assert_non_null(graph);
  get(b, ho, out, N);
  for (int i = 0; i < N; i++) assert_true(ho[i] == 0.0f); /* nothing ran */
  for (int rep = 0; rep < 2; rep++) {
    if (rep) {
      for (int i = 0; i < N; i++) hx[i] = (float)(3 * i + 1);
      put(b, x, hx, N);
    }
    if (b->graph_launch(b, 0, graph, &st) != PD_OK)
      fail_msg("graph_launch: %s", st.msg);
    get(b, ho, out, N);
    for (int i = 0; i < N; i++) {
      float want = sqrtf((hx[i] + 2.0f) * 2.0f);
      if (ho[i] != want)
        fail_msg("replay %d element %d: %g, expected %g", rep, i, ho[i], want);
    }
  }
  b->graph_destroy(b, 0, graph);
  /* A synchronizing kernel cannot be captured: capture_end fails. */
  void *ia, *ib, *ic;
  assert_int_equal(b->allocate(b, 0, 4 * sizeof(int32_t), &ia, &st), PD_OK);
  assert_int_equal(b->allocate(b, 0, 4 * sizeof(int32_t), &ib, &st), PD_OK);
  assert_int_equal(b->allocate(b, 0, 4 * sizeof(int32_t), &ic, &st), PD_OK);
  assert_int_equal(b->capture_begin(b, 0, &st), PD_OK);
  {
    const dev_op_def *def = dev_op_lookup("Div");
    int64_t four = 4;
    dev_shape s;
    assert_int_equal(dev_shape_make(1, &four, &s, NULL), PD_OK);
    pd_dtype dts[2] = {PD_INT32, PD_INT32};
    dev_shape shapes[2] = {s, s};
    const void *ins[2] = {ia, ib};
    void *outs[1] = {ic};
    int alias[1] = {-1};
    dev_kernel_ctx ctx = {.op = def,
                          .device = 0,
                          .num_devices = 1,
                          .backend = b,
                          .num_inputs = 2,
                          .in_dtype = dts,
                          .in_shape = shapes,
                          .in_data = ins,
                          .num_outputs = 1,
                          .out_dtype = dts,
                          .out_shape = shapes,
                          .out_data = outs,
                          .out_alias = alias};
    dev_status ks = DEV_STATUS_INIT;
    pd_code krc = b->run_kernel(b, def->kernels[DEV_BACKEND_CUDA], &ctx, &ks);
    printf("integer Div under capture: %s %s\n", pd_code_name(krc), ks.msg);
  }
  void *bad = NULL;
  pd_code rc = b->capture_end(b, 0, &bad, &st);
  printf("capture_end after a synchronizing kernel: %s: %s\n", pd_code_name(rc),
         st.msg);
  assert_int_not_equal(rc, PD_OK);
  assert_null(bad);
  assert_true(b->healthy(b, 0));
  /* The stream runs work again, uncaptured. */
  for (int i = 0; i < N; i++) hx[i] = (float)i;
  put(b, x, hx, N);
  if (run_direct(b, "Add", in1, 2, out, N, &st) != PD_OK)
    fail_msg("after a failed capture: %s", st.msg);
  get(b, ho, out, N);
  for (int i = 0; i < N; i++) assert_true(ho[i] == hx[i] + 2.0f);
  void *bufs[] = {x, y, out};
  for (int i = 0; i < 3; i++) b->deallocate(b, 0, bufs[i], bytes);
  b->deallocate(b, 0, ia, 16);
  b->deallocate(b, 0, ib, 16);
  b->deallocate(b, 0, ic, 16);
  b->destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mesh_syntax),
      cmocka_unit_test(test_mesh_accepted),
      cmocka_unit_test(test_config_validation),
      cmocka_unit_test(test_kernel_registration),
      cmocka_unit_test(test_engine_without_gpu),
      cmocka_unit_test(test_cpu_backend_has_no_health_hook),
      cmocka_unit_test(test_graph_capture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
