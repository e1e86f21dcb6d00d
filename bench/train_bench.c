/* bench_train: data-parallel training through the daemon (the main job of
 * examples/train_digits, with its model dp_mlp.c on the digits set), and how
 * much of a step's wall time the devices account for.
 *
 * For each configuration (mesh size x batch x mode) it starts paradevd on a
 * Unix socket (CPU backend), trains one warm-up epoch, then times whole
 * epochs until at least 270 steps (90 with --quick) while reading each device's busy seconds from GetServerInfo before and
 * after (dev_engine_busy_seconds: the time the device's executor spent
 * running ops). Reported, per configuration:
 *
 *  steps_per_s    training steps per second (each waits for nothing but
 *                 its batch's upload; an epoch ends with one wait), beside
 *                 device_bound_steps_per_s = steps / mean busy seconds of a
 *                 device, the rate if a step cost only its time on the
 *                 devices: the ratio is the devices' utilisation
 *  outside_share  the share of a step's wall time the devices were idle,
 *                 i.e. spent outside them (RPC, queueing, the client):
 *                 1 - busy / wall, from the daemon's own timers
 *
 * On the CPU backend the simulated devices share the machine's cores with
 * the daemon and the client, so busy time includes time a device thread
 * waited for a core; the share outside is then a lower bound.
 *
 * Both modes of dp_mlp (DP_MLP_EAGER: one stream item per op;
 * DP_MLP_FUNCTION: one call of the step's graph function per step) are
 * measured on 4 devices with batches of 32 and 256 (params "mode"), and
 * function_steps_per_s against eager_steps_per_s gives their ratio. Each
 * mode runs 3 times, alternating with the other, and the median run is
 * reported (the machine's load changes between runs).
 *
 * Usage: bench_train [--quick] [--paradevd PATH]
 * Results: a table and JSON lines (benchutil.h). Exit status 1 on a failed
 * call. Built from client/CMakeLists.txt (it needs libparadev). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchdaemon.h"
#include "benchutil.h"
#include "digits_data.h"
#include "dp_mlp.h"
#include "paradev/paradev.h"

#ifndef PARADEVD_PATH
#define PARADEVD_PATH "paradevd"
#endif
#ifndef DIGITS_PATH
#define DIGITS_PATH "examples/data/digits.csv.gz"
#endif

static pd_status *st;

static void die(const char *what) {
  fprintf(stderr, "bench_train: %s: %s: %s\n", what,
          pd_code_name(pd_status_code(st)), pd_status_message(st));
  exit(1);
}

/* Busy seconds of every device, summed. */
static double busy_sum(pd_client *c) {
  pd_server_info *info = pd_client_get_server_info(c, NULL, st);
  if (!info) die("GetServerInfo");
  double sum = 0;
  for (int i = 0; i < pd_server_info_num_devices(info); i++)
    sum += pd_server_info_device(info, i)->busy_seconds;
  pd_server_info_delete(info);
  return sum;
}

/* One pass over the training rows in order, batch by batch. */
static void epoch(dp_mlp *m, const digits_set *d, int batch) {
  for (int b = 0; b < d->n; b += batch) {
    int rows = d->n - b < batch ? d->n - b : batch;
    if (dp_mlp_step(m, d->x + (size_t)b * DIGITS_FEATURES, d->y + b, rows,
                    st) != PD_OK)
      die("step");
  }
  double loss = 0, correct = 0;
  if (dp_mlp_epoch_end(m, &loss, &correct, st) != PD_OK) die("epoch end");
}

/* One timed run: steps, wall seconds, mean busy seconds of a device. */
typedef struct train_run {
  long steps;
  double wall, busy;
} train_run;

/* Trains epochs until at least `min_steps` timed steps, after a warm-up
 * epoch, in `mode`; false when function mode is refused (a daemon without
 * graph functions: said why, the rows are skipped). */
static bool train_once(const char *path, const digits_set *train, int devices,
                       int batch, long min_steps, dp_mlp_mode mode,
                       train_run *out) {
  pd_client *c = bench_daemon_start(path, devices, "bench_train", st);
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_train";
  pd_session *s = pd_session_new(c, &so, NULL, st);
  if (!s) die("CreateSession");
  dp_mlp_config mc = {
      DIGITS_FEATURES, 128, DIGITS_CLASSES, DP_MLP_ADAM, 0.003, 42, mode};
  dp_mlp *m = dp_mlp_new(s, &mc, st);
  if (!m && mode == DP_MLP_FUNCTION) {
    printf("train: function mode skipped: %s: %s\n",
           pd_code_name(pd_status_code(st)), pd_status_message(st));
    pd_session_delete(s);
    pd_client_delete(c);
    bench_daemon_stop();
    return false;
  }
  if (!m) die("model");
  epoch(m, train, batch); /* warm-up: first allocations, caches */
  long steps0 = dp_mlp_steps(m);
  double b0 = busy_sum(c), t0 = bu_now();
  while (dp_mlp_steps(m) - steps0 < min_steps) epoch(m, train, batch);
  out->wall = bu_now() - t0;
  out->busy = (busy_sum(c) - b0) / devices;
  out->steps = dp_mlp_steps(m) - steps0;
  dp_mlp_delete(m);
  pd_session_delete(s);
  pd_client_delete(c);
  bench_daemon_stop();
  return true;
}

/* Records run r (the median of its repetitions); returns its steps/s. */
static double report(const train_run *r, int devices, int batch,
                     dp_mlp_mode mode) {
  const char *mname = mode == DP_MLP_FUNCTION ? "function" : "eager";
  char params[200];
  snprintf(params, sizeof(params),
           "\"mode\": \"%s\", \"devices\": %d, \"batch\": %d, \"model\": "
           "\"mlp 64-128-10 adam\", \"steps\": %ld",
           mname, devices, batch, r->steps);
  double sps = (double)r->steps / r->wall;
  double bound = r->busy > 0 ? (double)r->steps / r->busy : 0;
  bu_record("train", params, "steps_per_s", sps,
            bound > 0 ? "device_bound_steps_per_s" : NULL, bound);
  bu_record("train", params, "outside_share", 1 - r->busy / r->wall, NULL, 0);
  printf(
      "train: %-8s %d devices, batch %3d: %7.1f steps/s, %.2f ms per step, "
      "of which the devices %.2f ms (%.0f%% outside them)\n",
      mname, devices, batch, sps, 1e3 * r->wall / (double)r->steps,
      1e3 * r->busy / (double)r->steps, 100 * (1 - r->busy / r->wall));
  return sps;
}

static int by_rate(const void *a, const void *b) {
  const train_run *x = a, *y = b;
  double rx = (double)x->steps / x->wall, ry = (double)y->steps / y->wall;
  return rx < ry ? -1 : rx > ry;
}

#define REPS 5

/* Eager and function mode on `devices` devices, `reps` runs of each,
 * alternating (so a change in the machine's load hits both); the median
 * run of each mode is recorded, and their ratio. */
static void compare_modes(const char *path, const digits_set *train,
                          int devices, int batch, long min_steps, int reps) {
  train_run e[REPS], f[REPS];
  int nf = 0;
  for (int r = 0; r < reps; r++) {
    train_once(path, train, devices, batch, min_steps, DP_MLP_EAGER, &e[r]);
    if (train_once(path, train, devices, batch, min_steps, DP_MLP_FUNCTION,
                   &f[nf]))
      nf++;
  }
  qsort(e, (size_t)reps, sizeof(*e), by_rate);
  double es = report(&e[reps / 2], devices, batch, DP_MLP_EAGER);
  if (nf == 0) return;
  qsort(f, (size_t)nf, sizeof(*f), by_rate);
  double fs = report(&f[nf / 2], devices, batch, DP_MLP_FUNCTION);
  char params[96];
  snprintf(params, sizeof(params),
           "\"devices\": %d, \"batch\": %d, \"model\": \"mlp 64-128-10 "
           "adam\", \"repetitions\": %d",
           devices, batch, reps);
  bu_record("train", params, "function_steps_per_s", fs, "eager_steps_per_s",
            es);
  printf(
      "train: batch %3d: function mode %.2fx eager mode's steps/s (median "
      "of %d runs each)\n",
      batch, fs / es, reps);
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  const char *path = getenv("PARADEVD") ? getenv("PARADEVD") : PARADEVD_PATH;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--paradevd") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else if (strcmp(argv[i], "--quick") != 0) {
      fprintf(stderr, "usage: bench_train [--quick] [--paradevd PATH]\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  atexit(bench_daemon_stop);
  st = pd_status_new();
  char err[256];
  digits_set all, train, test;
  if (digits_load(DIGITS_PATH, &all, err, sizeof(err)) != 0) {
    fprintf(stderr, "bench_train: %s\n", err);
    return 1;
  }
  if (digits_split(&all, 0.2, 42, &train, &test) != 0) return 1;
  digits_free(&all);
  /* Eager and function mode side by side, 4 devices, batch 32 and 256
   * (at least 270 timed steps each: 6 epochs of batch 32, 45 of 256). */
  long min_steps = quick ? 90 : 270;
  int reps = quick ? 1 : REPS;
  compare_modes(path, &train, 4, 32, min_steps, reps);
  compare_modes(path, &train, 4, 256, min_steps, reps);
  if (!quick) {
    train_run r;
    train_once(path, &train, 1, 32, min_steps, DP_MLP_EAGER, &r);
    report(&r, 1, 32, DP_MLP_EAGER);
  }
  digits_free(&train);
  digits_free(&test);
  pd_status_delete(st);
  return bu_print_table();
}
