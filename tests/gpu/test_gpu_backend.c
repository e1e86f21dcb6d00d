/* The CUDA backend's checks that need no GPU, run everywhere it is built:
 * mesh and config validation, kernel registration, and the error a machine
 * without a GPU gets from dev_engine_create("cuda"). Where a GPU is present,
 * the last check becomes "creation works and the device is healthy". */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mesh_syntax),
      cmocka_unit_test(test_mesh_accepted),
      cmocka_unit_test(test_config_validation),
      cmocka_unit_test(test_kernel_registration),
      cmocka_unit_test(test_engine_without_gpu),
      cmocka_unit_test(test_cpu_backend_has_no_health_hook),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
