/* Placement (issue #17): the per-op cost of an op on a subset of a 4-device
 * CPU mesh (1 and 2 devices) beside the same op on the whole mesh.
 *
 *  tiny   Add of two float32 scalars, 2,000 ops back to back then one sync:
 *         wall time per op (the dispatch cost: an op on k devices is pushed
 *         to k executors only)
 *  1MiB   Add of two float32 tensors of 1 MiB per device, the same way
 *
 * The aim (issue #17): an op on a subset costs no more than the subset's
 * share of the whole mesh's work plus a constant, so subset/whole <= k/4 +
 * c. The ratio and the share are printed; there are no thresholds (times
 * on a shared machine are noise; the ratio is what is tracked).
 *
 * Usage: bench_placement [--quick]. Results: a table and JSON lines (see
 * benchutil.h). Exit status 1 if an op failed. */
#include <stdio.h>
#include <stdlib.h>

#include "benchutil.h"
#include "device.h"

#define DEVICES 4

typedef struct arg {
  dev_engine *e;
  dev_tensor *in[2];
  int ops;
  int failed;
} arg;

static void run_ops(void *p) {
  arg *a = p;
  dev_status st = DEV_STATUS_INIT;
  for (int i = 0; i < a->ops && !a->failed; i++) {
    dev_tensor *out;
    int n = 1;
    if (dev_execute(a->e, "Add", a->in, 2, NULL, 0, &out, &n, &st) != PD_OK) {
      fprintf(stderr, "bench_placement: %s\n", st.msg);
      a->failed = 1;
      return;
    }
    dev_tensor_release(out);
  }
  if (dev_engine_sync(a->e, &st) != PD_OK) a->failed = 1;
}

/* Seconds per op of `ops` Adds of float32 [elems] on the first k devices. */
static double per_op(dev_engine *e, int k, int64_t elems, int ops,
                     double min_time, int *failed) {
  dev_devset set = {.n = k};
  for (int i = 0; i < k; i++) set.dev[i] = (uint8_t)i;
  float *host = bu_xmalloc(sizeof(float) * (size_t)(elems ? elems : 1));
  for (int64_t i = 0; i < elems; i++) host[i] = (float)(i % 7);
  dev_shape s = {elems ? 1 : 0, {elems}};
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  arg a = {.e = e, .ops = ops};
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_from_host_on(e, &set, PD_FLOAT32, &mir, &s, host, &a.in[0],
                              &st) != PD_OK) {
    fprintf(stderr, "bench_placement: %s\n", st.msg);
    free(host);
    *failed = 1;
    return 0;
  }
  free(host);
  a.in[1] = a.in[0];
  bu_timing t = bu_measure(run_ops, &a, min_time, 3);
  dev_tensor_release(a.in[0]);
  *failed |= a.failed;
  return t.median_s / ops;
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  double min_time = quick ? 0.2 : 1.0;
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.num_devices = DEVICES;
  dev_engine *e = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_create(&cfg, &e, &st) != PD_OK) {
    fprintf(stderr, "bench_placement: %s\n", st.msg);
    return 1;
  }
  int failed = 0;
  const struct {
    const char *name;
    int64_t elems;
    int ops;
  } cases[] = {{"tiny", 0, quick ? 500 : 2000},
               {"1MiB", (1 << 20) / 4, quick ? 10 : 40}};
  printf("placement: Add of float32 on k of %d devices, per op\n", DEVICES);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    double whole =
        per_op(e, DEVICES, cases[c].elems, cases[c].ops, min_time, &failed);
    printf("  %-5s whole mesh (%d)  %10.2f us\n", cases[c].name, DEVICES,
           whole * 1e6);
    for (int k = 1; k <= 2; k++) {
      double sub =
          per_op(e, k, cases[c].elems, cases[c].ops, min_time, &failed);
      double share = (double)k / DEVICES;
      printf("  %-5s subset of %d      %10.2f us  ratio %.2f (share %.2f)\n",
             cases[c].name, k, sub * 1e6, whole > 0 ? sub / whole : 0, share);
      char params[160];
      snprintf(params, sizeof params,
               "\"devices\": %d, \"subset\": %d, \"op\": \"Add\", "
               "\"case\": \"%s\", \"share\": %.2f",
               DEVICES, k, cases[c].name, share);
      bu_record("placement", params, "subset_us_per_op", sub * 1e6,
                "whole_mesh_us_per_op", whole * 1e6);
    }
  }
  dev_engine_destroy(e);
  int rc = bu_print_table();
  return failed ? 1 : rc;
}
