/* bench_train: data-parallel training through the daemon (the main job of
 * examples/train_digits, with its model dp_mlp.c on the digits set), and how
 * much of a step's wall time the devices account for.
 *
 * For each configuration (mesh size x batch) it starts paradevd on a Unix
 * socket (CPU backend), trains one warm-up epoch, then times `epochs` more
 * while reading each device's busy seconds from GetServerInfo before and
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
 * function_steps_per_s against eager_steps_per_s gives their ratio.
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

/* --- the daemon --------------------------------------------------------------- */

static pid_t daemon_pid;
static char daemon_dir[64];

static void stop_daemon(void) {
  if (daemon_pid <= 0) return;
  kill(daemon_pid, SIGTERM);
  int status;
  waitpid(daemon_pid, &status, 0);
  daemon_pid = 0;
  char p[128];
  snprintf(p, sizeof(p), "%s/pd.sock", daemon_dir);
  unlink(p);
  snprintf(p, sizeof(p), "%s/admin.sock", daemon_dir);
  unlink(p);
  rmdir(daemon_dir);
}

/* Starts paradevd with `devices` CPU devices and connects when it serves. */
static pd_client *start_daemon(const char *path, int devices) {
  snprintf(daemon_dir, sizeof(daemon_dir), "/tmp/bench-train-XXXXXX");
  if (!mkdtemp(daemon_dir)) {
    perror("mkdtemp");
    exit(1);
  }
  char target[128], admin[128], ndev[16];
  snprintf(target, sizeof(target), "unix:%s/pd.sock", daemon_dir);
  snprintf(admin, sizeof(admin), "%s/admin.sock", daemon_dir);
  snprintf(ndev, sizeof(ndev), "%d", devices);
  daemon_pid = fork();
  if (daemon_pid == 0) {
    execl(path, path, "--config", "/dev/null", "--listen", target,
          "--admin-socket", admin, "--devices", ndev, "--log", "warn",
          (char *)NULL);
    fprintf(stderr, "bench_train: cannot run %s\n", path);
    _exit(127);
  }
  /* Connect once the socket exists: a first attempt that fails would leave
   * gRPC's channel in its reconnect backoff (a second or more). */
  for (int i = 0; i < 400 && access(target + 5, F_OK) != 0; i++) usleep(25000);
  pd_client *c = pd_client_new(target, NULL, st);
  if (!c) die("connect");
  pd_serving_status ss = PD_SERVING_UNKNOWN;
  for (int i = 0; i < 200; i++) {
    pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
    o.timeout_ms = 1000;
    if (pd_client_health(c, "", &ss, &o, st) == PD_OK && ss == PD_SERVING)
      break;
    usleep(50000);
  }
  if (ss != PD_SERVING) die("the daemon did not become ready");
  return c;
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

/* Trains `epochs` timed epochs after a warm-up one in `mode`; returns the
 * steps per second, or 0 when function mode is refused (a daemon without
 * graph functions: the rows are skipped, saying why). */
static double bench_config(const char *path, const digits_set *train,
                           int devices, int batch, int epochs,
                           dp_mlp_mode mode) {
  const char *mname = mode == DP_MLP_FUNCTION ? "function" : "eager";
  pd_client *c = start_daemon(path, devices);
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_train";
  pd_session *s = pd_session_new(c, &so, NULL, st);
  if (!s) die("CreateSession");
  dp_mlp_config mc = {
      DIGITS_FEATURES, 128, DIGITS_CLASSES, DP_MLP_ADAM, 0.003, 42, mode};
  dp_mlp *m = dp_mlp_new(s, &mc, st);
  if (!m && mode == DP_MLP_FUNCTION) {
    printf("train: %s mode skipped: %s: %s\n", mname,
           pd_code_name(pd_status_code(st)), pd_status_message(st));
    pd_session_delete(s);
    pd_client_delete(c);
    stop_daemon();
    return 0;
  }
  if (!m) die("model");
  epoch(m, train, batch); /* warm-up: first allocations, caches */
  long steps0 = dp_mlp_steps(m);
  double b0 = busy_sum(c), t0 = bu_now();
  for (int e = 0; e < epochs; e++) epoch(m, train, batch);
  double wall = bu_now() - t0, busy = (busy_sum(c) - b0) / devices;
  long steps = dp_mlp_steps(m) - steps0;
  dp_mlp_delete(m);
  pd_session_delete(s);
  pd_client_delete(c);
  stop_daemon();

  char params[200];
  snprintf(params, sizeof(params),
           "\"mode\": \"%s\", \"devices\": %d, \"batch\": %d, \"model\": "
           "\"mlp 64-128-10 adam\", \"steps\": %ld",
           mname, devices, batch, steps);
  double sps = (double)steps / wall;
  double bound = busy > 0 ? (double)steps / busy : 0;
  bu_record("train", params, "steps_per_s", sps,
            bound > 0 ? "device_bound_steps_per_s" : NULL, bound);
  bu_record("train", params, "outside_share", 1 - busy / wall, NULL, 0);
  printf(
      "train: %-8s %d devices, batch %3d: %7.1f steps/s, %.2f ms per step, "
      "of which the devices %.2f ms (%.0f%% outside them)\n",
      mname, devices, batch, sps, 1e3 * wall / (double)steps,
      1e3 * busy / (double)steps, 100 * (1 - busy / wall));
  return sps;
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
  atexit(stop_daemon);
  st = pd_status_new();
  char err[256];
  digits_set all, train, test;
  if (digits_load(DIGITS_PATH, &all, err, sizeof(err)) != 0) {
    fprintf(stderr, "bench_train: %s\n", err);
    return 1;
  }
  if (digits_split(&all, 0.2, 42, &train, &test) != 0) return 1;
  digits_free(&all);
  /* Eager and function mode side by side, 4 devices, batch 32 and 256;
   * the ratio is function mode's steps per second over eager mode's. */
  const int batches[2] = {32, 256};
  int epochs = quick ? 2 : 6;
  for (int k = 0; k < 2; k++) {
    double e = bench_config(path, &train, 4, batches[k], epochs, DP_MLP_EAGER);
    double f =
        bench_config(path, &train, 4, batches[k], epochs, DP_MLP_FUNCTION);
    if (f > 0 && e > 0) {
      char params[96];
      snprintf(params, sizeof(params),
               "\"devices\": 4, \"batch\": %d, \"model\": \"mlp 64-128-10 "
               "adam\"",
               batches[k]);
      bu_record("train", params, "function_steps_per_s", f, "eager_steps_per_s",
                e);
      printf("train: batch %3d: function mode %.2fx eager mode's steps/s\n",
             batches[k], f / e);
    }
  }
  if (!quick) bench_config(path, &train, 1, 32, epochs, DP_MLP_EAGER);
  digits_free(&train);
  digits_free(&test);
  pd_status_delete(st);
  return bu_print_table();
}
