/* A tour of the parallel device on the engine's CPU backend: a batch sharded
 * across 4 simulated devices, mirrored weights, a matrix product on every
 * device at once, and an all-reduce that averages the per-device results, as
 * a data-parallel training step does with its gradients. Every result is
 * checked against the same computation done here on the host in float64.
 *
 * Usage: mesh_tour [--devices N]      (exit status 0 when every check passes)
 *
 * It drives the engine in-process; the daemon's client programs
 * (examples/train_digits) do the same through paradevd. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

static dev_tensor *run1(dev_engine *e, const char *op, dev_tensor **in,
                        int n_in, const dev_attr *attrs, int n_attrs) {
  dev_tensor *out[DEV_MAX_OUTPUTS];
  int n_out = DEV_MAX_OUTPUTS;
  dev_status st = DEV_STATUS_INIT;
  if (dev_execute(e, op, in, n_in, attrs, n_attrs, out, &n_out, &st) != PD_OK) {
    fprintf(stderr, "mesh_tour: %s: %s: %s\n", op, pd_code_name(st.code),
            st.msg);
    exit(1);
  }
  for (int i = 1; i < n_out; i++) dev_tensor_release(out[i]);
  return out[0];
}

int main(int argc, char **argv) {
  int n = 4;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--devices") && i + 1 < argc)
      n = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: mesh_tour [--devices N]\n");
      return 2;
    }
  }
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.num_devices = n;
  dev_engine *e;
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_create(&cfg, &e, &st) != PD_OK) {
    fprintf(stderr, "mesh_tour: %s\n", st.msg);
    return 1;
  }
  printf("mesh: %d simulated devices on the cpu backend\n", n);

  /* x: a batch of 10 rows of 3 features, sharded by rows; w: 3x2, mirrored. */
  enum { B = 10, F = 3, O = 2 };
  float x[B * F], w[F * O];
  for (int i = 0; i < B * F; i++) x[i] = (float)((i * 7) % 11) / 4.0f - 1.0f;
  for (int i = 0; i < F * O; i++) w[i] = (float)(i + 1) / 8.0f;
  dev_shape xs = {2, {B, F}}, ws = {2, {F, O}};
  dev_layout sharded = {DEV_LAYOUT_SHARDED, 0, 0},
             mirrored = {DEV_LAYOUT_MIRRORED, 0, 0};
  dev_tensor *tx, *tw;
  if (dev_tensor_from_host(e, PD_FLOAT32, &sharded, &xs, x, &tx, &st) !=
          PD_OK ||
      dev_tensor_from_host(e, PD_FLOAT32, &mirrored, &ws, w, &tw, &st) !=
          PD_OK) {
    fprintf(stderr, "mesh_tour: upload: %s\n", st.msg);
    return 1;
  }
  char sb[64];
  printf("x: batch [%d, %d] sharded by rows -> shape %s\n", B, F,
         dev_shape_str(dev_tensor_shape(tx), sb, sizeof sb));

  /* y = x @ w on every device; s = column sums of each shard; g = mean of s
   * across the devices (AllReduce mean), the shape of a gradient average. */
  dev_tensor *in2[2] = {tx, tw};
  dev_tensor *y = run1(e, "MatMul", in2, 2, NULL, 0);
  int64_t axis0[1] = {0};
  dev_attr sum_attrs[1] = {dev_attr_int_list("axis", axis0, 1)};
  dev_tensor *s = run1(e, "Sum", &y, 1, sum_attrs, 1);
  dev_attr mean = dev_attr_string("reduction", "mean");
  dev_tensor *g = run1(e, "AllReduce", &s, 1, &mean, 1);
  dev_tensor *id = run1(e, "DeviceId", NULL, 0, NULL, 0);

  /* host reference in float64 */
  double want[O] = {0};
  int row = 0, failures = 0;
  for (int d = 0; d < n; d++) {
    int rows = B / n + (d < B % n ? 1 : 0);
    for (int r = row; r < row + rows; r++)
      for (int o = 0; o < O; o++) {
        double acc = 0;
        for (int f = 0; f < F; f++)
          acc += (double)x[r * F + f] * (double)w[f * O + o];
        want[o] += acc / n;
      }
    row += rows;
  }
  for (int d = 0; d < n; d++) {
    float got[O];
    int32_t dev_id;
    dev_layout comp = {DEV_LAYOUT_COMPONENT, 0, d};
    if (dev_tensor_to_host(g, &comp, 0, got, sizeof got, &st) != PD_OK ||
        dev_tensor_to_host(id, &comp, 0, &dev_id, sizeof dev_id, &st) !=
            PD_OK) {
      fprintf(stderr, "mesh_tour: download: %s\n", st.msg);
      return 1;
    }
    int ok = dev_id == d;
    for (int o = 0; o < O; o++)
      ok &= fabs(got[o] - want[o]) <= 1e-5 * (1 + fabs(want[o]));
    printf(
        "device %d (DeviceId %d): mean of per-device column sums = [%.6f, "
        "%.6f]  %s\n",
        d, dev_id, got[0], got[1], ok ? "ok" : "MISMATCH");
    failures += !ok;
  }
  printf("host float64 reference:                            [%.6f, %.6f]\n",
         want[0], want[1]);
  dev_tensor *ts[] = {tx, tw, y, s, g, id};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    dev_tensor_release(ts[i]);
  dev_engine_destroy(e);
  printf(failures ? "mesh_tour: FAILED\n"
                  : "mesh_tour: every device agrees with the reference\n");
  return failures ? 1 : 0;
}
