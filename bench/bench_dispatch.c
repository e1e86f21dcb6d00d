/* Per-op overhead of the engine: a tiny op (Add of two float32 scalars) on a
 * 4-device CPU mesh, beside the same Add kernel called directly (the floor:
 * what the arithmetic itself costs).
 *
 *  latency    dev_execute + dev_tensor_wait + release of one op, one at a time
 *  pipelined  10,000 independent ops submitted back to back, then one sync:
 *             wall time per op (what a client streaming ops sees)
 *  batched    the same ops handed over 64 at a time with dev_op_submit_batch
 *             (what the scheduler's dispatcher does each turn): one lock and
 *             at most one wake-up per device per batch
 *
 * Usage: bench_dispatch [--quick]. Results: a table and JSON lines (see
 * benchutil.h). Exit status 1 if an op failed. */
#include <stdio.h>
#include <stdlib.h>

#include "benchutil.h"
#include "dev_backend.h"

#define DEVICES 4

typedef struct arg {
  dev_engine *e;
  dev_tensor *in[2];
  int failed;
  /* direct kernel call */
  dev_kernel_fn fn;
  dev_kernel_ctx ctx;
  int pipeline;
} arg;

static void one_op(void *p) {
  arg *a = p;
  dev_tensor *out;
  int n = 1;
  dev_status st = DEV_STATUS_INIT;
  if (dev_execute(a->e, "Add", a->in, 2, NULL, 0, &out, &n, &st) != PD_OK ||
      dev_tensor_wait(out, &st) != PD_OK) {
    fprintf(stderr, "bench_dispatch: %s\n", st.msg);
    a->failed = 1;
    return;
  }
  dev_tensor_release(out);
}

static void pipelined(void *p) {
  arg *a = p;
  dev_status st = DEV_STATUS_INIT;
  for (int i = 0; i < a->pipeline; i++) {
    dev_tensor *out;
    int n = 1;
    if (dev_execute(a->e, "Add", a->in, 2, NULL, 0, &out, &n, &st) != PD_OK) {
      a->failed = 1;
      return;
    }
    dev_tensor_release(out);
  }
  dev_engine_sync(a->e, &st);
}

static void batched(void *p) {
  arg *a = p;
  dev_status st = DEV_STATUS_INIT;
  dev_op *ops[DEV_SUBMIT_BATCH_MAX];
  for (int i = 0; i < a->pipeline; i += DEV_SUBMIT_BATCH_MAX) {
    int k = 0;
    for (; k < DEV_SUBMIT_BATCH_MAX && i + k < a->pipeline; k++)
      if (dev_op_prepare(a->e, "Add", a->in, 2, NULL, 0, &ops[k], &st) !=
          PD_OK) {
        a->failed = 1;
        return;
      }
    dev_op_submit_batch(a->e, ops, k);
  }
  dev_engine_sync(a->e, &st);
}

static void direct(void *p) {
  arg *a = p;
  dev_status st = DEV_STATUS_INIT;
  for (int i = 0; i < 1000; i++) a->fn(&a->ctx, &st);
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  double min_time = quick ? 0.2 : 1.0;
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.num_devices = DEVICES;
  arg a = {0};
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_create(&cfg, &a.e, &st) != PD_OK) {
    fprintf(stderr, "bench_dispatch: %s\n", st.msg);
    return 1;
  }
  float one = 1.0f;
  dev_shape scalar = {0, {0}};
  dev_layout mirrored = {DEV_LAYOUT_MIRRORED, 0, 0};
  if (dev_tensor_from_host(a.e, PD_FLOAT32, &mirrored, &scalar, &one, &a.in[0],
                           &st) != PD_OK) {
    fprintf(stderr, "bench_dispatch: %s\n", st.msg);
    return 1;
  }
  a.in[1] = a.in[0];

  /* the floor: the CPU Add kernel called directly on host scalars */
  const dev_op_def *def = dev_op_lookup("Add");
  float x = 1.0f, y = 2.0f, z = 0.0f;
  const void *in_data[2] = {&x, &y};
  void *out_data[1] = {&z};
  pd_dtype dts[2] = {PD_FLOAT32, PD_FLOAT32};
  dev_shape shapes[2] = {scalar, scalar};
  int alias[1] = {-1};
  a.fn = def->kernels[DEV_BACKEND_CPU];
  a.ctx = (dev_kernel_ctx){.op = def,
                           .device = 0,
                           .num_devices = 1,
                           .num_inputs = 2,
                           .in_dtype = dts,
                           .in_shape = shapes,
                           .in_data = in_data,
                           .num_outputs = 1,
                           .out_dtype = dts,
                           .out_shape = shapes,
                           .out_data = out_data,
                           .out_alias = alias};
  bu_timing td = bu_measure(direct, &a, min_time, 5);
  double direct_us = td.median_s / 1000 * 1e6;

  bu_timing tl = bu_measure(one_op, &a, min_time, 50);
  a.pipeline = quick ? 2000 : 10000;
  bu_timing tp = bu_measure(pipelined, &a, min_time, 3);
  bu_timing tb = bu_measure(batched, &a, min_time, 3);
  double lat_us = tl.median_s * 1e6, pipe_us = tp.median_s / a.pipeline * 1e6;
  double batch_us = tb.median_s / a.pipeline * 1e6;
  printf("dispatch: Add of float32 scalars on %d devices\n", DEVICES);
  printf("  direct kernel call  %8.3f us\n", direct_us);
  printf("  latency (one op)    %8.1f us\n", lat_us);
  printf("  pipelined, per op   %8.2f us\n", pipe_us);
  printf("  batched (64), per op %7.2f us\n", batch_us);
  char params[96];
  snprintf(
      params, sizeof params,
      "\"devices\": %d, \"op\": \"Add\", \"dtype\": \"float32\", \"shape\": []",
      DEVICES);
  bu_record("dispatch", params, "latency_us", lat_us, "direct_kernel_us",
            direct_us);
  bu_record("dispatch", params, "pipelined_us_per_op", pipe_us,
            "direct_kernel_us", direct_us);
  bu_record("dispatch", params, "batched_us_per_op", batch_us,
            "pipelined_us_per_op", pipe_us);
  dev_tensor_release(a.in[0]);
  dev_engine_destroy(a.e);
  int rc = bu_print_table();
  return a.failed ? 1 : rc;
}
