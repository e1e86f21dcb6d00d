/* train_digits: data-parallel training of a digits classifier through
 * paradevd, the main example.
 *
 * The optical-digits set (1,797 images of 8x8 pixels, examples/data/) is
 * split 80/20 with a fixed seed and scaled to [0, 1]. A multilayer
 * perceptron 64 -> 128 (ReLU) -> 10 with softmax cross-entropy lives on the
 * daemon, its weights mirrored on every device of the mesh; every step
 * uploads a batch sharded across the mesh, runs forward and loss under a
 * gradient tape, averages the gradients with AllReduce(mean) and applies the
 * same Adam (or SGD with momentum) update on every device -- all as daemon
 * ops, pipelined through one Enqueue stream (dp_mlp.c). The client waits for
 * the devices once per epoch, for the epoch's numbers.
 *
 * Prints one line per epoch (loss, train accuracy, steps per second), then
 * the test accuracy, whether the weights are bitwise identical on every
 * device, and how busy the devices were (the daemon's own timers). With
 * --plot FILE.png, gnuplot draws the loss and accuracy curves.
 *
 * Links libparadev only (and the data set's loader). Exit status: 0 done
 * (1 when --min-accuracy is given and not reached, or the replicas differ),
 * 1 a failed call, 2 a bad command line. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "digits_data.h"
#include "dp_mlp.h"
#include "paradev/paradev.h"

#ifndef DIGITS_DEFAULT_PATH
#define DIGITS_DEFAULT_PATH "examples/data/digits.csv.gz"
#endif

/* The default --mode: the faster one in bench_train (README, "Graph
 * functions": 3.1x eager's steps per second at batch 32). Without --mode,
 * a daemon that has no graph functions (UNIMPLEMENTED) gets eager mode. */
#define DEFAULT_MODE DP_MLP_FUNCTION
#define DEFAULT_MODE_NAME "function"

static const char usage[] =
    "Usage: train_digits [OPTIONS]\n"
    "Train a 64-128-10 perceptron on the digits set, data-parallel on the\n"
    "devices of a paradevd daemon.\n"
    "\n"
    "  --target ADDR     the daemon: unix:/path or host:port (default:\n"
    "                    $PARADEV_TARGET, else 127.0.0.1:7478)\n"
    "  --epochs N        passes over the training set (default 10)\n"
    "  --batch N         rows per step, split across the mesh (default 32)\n"
    "  --lr X            learning rate (default 0.003 for adam, 0.05 for sgd)\n"
    "  --optimizer NAME  adam (default) or sgd (momentum 0.9)\n"
    "  --mode MODE       eager: every op of a step is its own stream item;\n"
    "                    function: the whole step (forward, loss, gradients,\n"
    "                    all-reduce, update) is one graph function called\n"
    "                    once per step (default: " DEFAULT_MODE_NAME
    ")\n"
    "  --seed N          seeds the split, the weights, the shuffles (default "
    "42)\n"
    "  --plot FILE.png   draw loss and accuracy per epoch with gnuplot\n"
    "  --data PATH       the data set (default: the copy in the source tree)\n"
    "  --min-accuracy P  exit 1 when the test accuracy is below P percent\n"
    "  --save PATH       at the end, have the daemon save the weights as a\n"
    "                    safetensors file at PATH beneath one of its storage\n"
    "                    roots (replacing an older one)\n"
    "  --evaluate PATH   train nothing: load the weights of PATH (as --save\n"
    "                    writes them) on the daemon and report their test\n"
    "                    accuracy in a fresh session (give the same --seed:\n"
    "                    it chooses the test images; --epochs, --batch and\n"
    "                    --plot are then ignored)\n"
    "  --quiet           no per-epoch lines, only the summary\n"
    "  --help            this text\n";

typedef struct opts {
  const char *target;
  int epochs, batch;
  double lr;
  dp_mlp_optimizer optimizer;
  dp_mlp_mode mode;
  bool mode_given; /* --mode on the command line */
  uint64_t seed;
  const char *plot;
  const char *data;
  double min_accuracy;
  bool quiet;
  const char *save;     /* checkpoint to write after training */
  const char *evaluate; /* checkpoint to evaluate instead of training */
} opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bad_usage(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static int bad_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "train_digits: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n%s", usage);
  return 2;
}

static bool parse_int(const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < lo || v > hi) return false;
  *out = (int)v;
  return true;
}

static int parse_args(int argc, char **argv, opts *o) {
  const char *env = getenv("PARADEV_TARGET");
  *o = (opts){env && *env ? env : "127.0.0.1:7478",
              10,
              32,
              0,
              DP_MLP_ADAM,
              DEFAULT_MODE,
              false,
              42,
              NULL,
              DIGITS_DEFAULT_PATH,
              -1,
              false,
              NULL,
              NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0) {
      fputs(usage, stdout);
      exit(0);
    } else if (strcmp(a, "--quiet") == 0) {
      o->quiet = true;
      continue;
    }
    static const char *const with_value[] = {
        "--target",    "--epochs",       "--batch", "--lr",
        "--optimizer", "--seed",         "--plot",  "--data",
        "--mode",      "--min-accuracy", "--save",  "--evaluate"};
    bool known = false;
    for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++)
      known |= strcmp(a, with_value[k]) == 0;
    if (!known) return bad_usage("unknown option %s", a);
    if (!v) return bad_usage("%s needs a value", a);
    i++;
    char *end;
    if (strcmp(a, "--target") == 0) {
      o->target = v;
    } else if (strcmp(a, "--epochs") == 0) {
      if (!parse_int(v, 1, 100000, &o->epochs))
        return bad_usage("--epochs %s: expected 1 to 100000", v);
    } else if (strcmp(a, "--batch") == 0) {
      if (!parse_int(v, 1, 1000000, &o->batch))
        return bad_usage("--batch %s: expected 1 to 1000000", v);
    } else if (strcmp(a, "--lr") == 0) {
      o->lr = strtod(v, &end);
      if (*end || end == v || !(o->lr > 0) || !isfinite(o->lr))
        return bad_usage("--lr %s: expected a positive number", v);
    } else if (strcmp(a, "--optimizer") == 0) {
      if (strcmp(v, "adam") == 0)
        o->optimizer = DP_MLP_ADAM;
      else if (strcmp(v, "sgd") == 0)
        o->optimizer = DP_MLP_SGD;
      else
        return bad_usage("--optimizer %s: expected adam or sgd", v);
    } else if (strcmp(a, "--mode") == 0) {
      o->mode_given = true;
      if (strcmp(v, "eager") == 0)
        o->mode = DP_MLP_EAGER;
      else if (strcmp(v, "function") == 0)
        o->mode = DP_MLP_FUNCTION;
      else
        return bad_usage("--mode %s: expected eager or function", v);
    } else if (strcmp(a, "--seed") == 0) {
      errno = 0;
      o->seed = strtoull(v, &end, 10);
      if (errno || *end || end == v || v[0] == '-')
        return bad_usage("--seed %s: expected a non-negative integer", v);
    } else if (strcmp(a, "--plot") == 0) {
      o->plot = v;
    } else if (strcmp(a, "--data") == 0) {
      o->data = v;
    } else if (strcmp(a, "--save") == 0) {
      o->save = v;
    } else if (strcmp(a, "--evaluate") == 0) {
      o->evaluate = v;
    } else if (strcmp(a, "--min-accuracy") == 0) {
      o->min_accuracy = strtod(v, &end);
      if (*end || end == v || !(o->min_accuracy >= 0 && o->min_accuracy <= 100))
        return bad_usage("--min-accuracy %s: expected 0 to 100", v);
    }
  }
  if (o->lr == 0) o->lr = o->optimizer == DP_MLP_ADAM ? 0.003 : 0.05;
  if (o->save && o->evaluate)
    return bad_usage("--save and --evaluate: one or the other");
  return 0;
}

/* Fisher-Yates with xorshift64: the order of the training rows for one
 * epoch, the same whatever the mesh. */
static void shuffle(int *idx, int n, uint64_t *state) {
  for (int i = n - 1; i > 0; i--) {
    uint64_t s = *state;
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    *state = s;
    int j = (int)(s % (uint64_t)(i + 1));
    int t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
  }
}

/* Devices' busy seconds summed over the mesh (GetServerInfo). */
static double busy_total(pd_client *c, int *ndev) {
  pd_server_info *info = pd_client_get_server_info(c, NULL, NULL);
  if (!info) return -1;
  double sum = 0;
  int n = pd_server_info_num_devices(info);
  for (int i = 0; i < n; i++)
    sum += pd_server_info_device(info, i)->busy_seconds;
  pd_server_info_delete(info);
  if (ndev) *ndev = n;
  return sum;
}

/* Writes the per-epoch numbers and a gnuplot script beside each other in a
 * temporary directory and runs gnuplot. Returns 0, or -1 after saying why
 * (the training itself is not affected). */
static int plot(const char *png, const double *loss, const double *acc,
                int epochs, double test_acc) {
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fprintf(stderr,
            "train_digits: gnuplot not found, no plot written (apt-get install "
            "gnuplot-nox; scripts/setup.sh does)\n");
    return -1;
  }
  char dir[] = "/tmp/train-digits-XXXXXX";
  if (!mkdtemp(dir)) {
    fprintf(stderr, "train_digits: mkdtemp: %s; no plot written\n",
            strerror(errno));
    return -1;
  }
  char dat[64], gp[64];
  snprintf(dat, sizeof dat, "%s/epochs.dat", dir);
  snprintf(gp, sizeof gp, "%s/plot.gp", dir);
  FILE *f = fopen(dat, "w");
  FILE *g = f ? fopen(gp, "w") : NULL;
  int rc = -1;
  if (f && g) {
    for (int e = 0; e < epochs; e++)
      fprintf(f, "%d %.6f %.4f\n", e + 1, loss[e], 100 * acc[e]);
    fclose(f);
    f = NULL;
    /* The PNG's name goes through gnuplot's quoting: single quotes, with a
     * quote doubled. */
    /* pngcairo where gnuplot has it (Debian's gnuplot-nox does), else the
     * libgd png terminal. */
    fprintf(g,
            "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
            "  set terminal pngcairo size 900,500 noenhanced\n"
            "} else {\n"
            "  set terminal png size 900,500 noenhanced\n"
            "}\n"
            "set output '");
    for (const char *p = png; *p; p++) {
      if (*p == '\'') fputc('\'', g);
      fputc(*p, g);
    }
    fprintf(g,
            "'\n"
            "set title 'train_digits: 64-128-10 MLP, data-parallel on paradevd "
            "(test accuracy %.2f%%)'\n"
            "set xlabel 'epoch'\n"
            "set ylabel 'loss (mean cross-entropy)'\n"
            "set y2label 'train accuracy (%%)'\n"
            "set ytics nomirror\nset y2tics\nset grid\nset key center right\n"
            "%sset xrange [0.5:%d.5]\n"
            "set yrange [0:*]\nset y2range [*:100]\n"
            "plot '%s' using 1:2 axes x1y1 with linespoints title 'loss', \\\n"
            "     '%s' using 1:3 axes x1y2 with linespoints title 'train "
            "accuracy'\n",
            100 * test_acc, epochs <= 20 ? "set xtics 1\n" : "", epochs, dat,
            dat);
    fclose(g);
    g = NULL;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "gnuplot %s", gp);
    rc = system(cmd) == 0 ? 0 : -1;
    if (rc != 0)
      fprintf(stderr, "train_digits: gnuplot failed; no plot written\n");
  } else {
    fprintf(stderr, "train_digits: cannot write in %s; no plot written\n", dir);
  }
  if (f) fclose(f);
  if (g) fclose(g);
  unlink(dat);
  unlink(gp);
  rmdir(dir);
  return rc;
}

int main(int argc, char **argv) {
  opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc;

  char err[256];
  digits_set all, train, test;
  if (digits_load(o.data, &all, err, sizeof err) != 0) {
    fprintf(stderr, "train_digits: %s\n", err);
    return 1;
  }
  if (digits_split(&all, 0.2, o.seed, &train, &test) != 0) {
    fprintf(stderr, "train_digits: out of memory\n");
    return 1;
  }
  digits_free(&all);

  pd_status *st = pd_status_new();
  pd_client *c = NULL;
  pd_session *s = NULL;
  dp_mlp *m = NULL;
  double *curve = calloc((size_t)o.epochs * 2, sizeof(double));
  float *bx = malloc(sizeof(float) * (size_t)o.batch * DIGITS_FEATURES);
  int32_t *by = malloc(sizeof(int32_t) * (size_t)o.batch);
  int *order = malloc(sizeof(int) * (size_t)train.n);
  rc = 1;
  if (!st || !curve || !bx || !by || !order) {
    fprintf(stderr, "train_digits: out of memory\n");
    goto out;
  }
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.user_agent = "train_digits";
  if (!(c = pd_client_new(o.target, &co, st))) goto fail;
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "train_digits";
  if (!(s = pd_session_new(c, &so, NULL, st))) goto fail;
  int ndev = pd_session_num_devices(s);
  const char *opt_name = o.optimizer == DP_MLP_ADAM ? "adam" : "sgd";
  if (o.evaluate)
    printf(
        "train_digits: %d test images, MLP 64-128-10 with the weights of "
        "%s, over %d device%s of %s\n",
        test.n, o.evaluate, ndev, ndev == 1 ? "" : "s", o.target);
  else
    printf(
        "train_digits: %d train / %d test images, MLP 64-128-10, batch %d "
        "sharded over %d device%s of %s, %s lr %g, %d epochs\n",
        train.n, test.n, o.batch, ndev, ndev == 1 ? "" : "s", o.target,
        opt_name, o.lr, o.epochs);

  dp_mlp_config mc = {DIGITS_FEATURES,
                      128,
                      DIGITS_CLASSES,
                      o.optimizer,
                      o.lr,
                      o.seed,
                      o.evaluate ? DP_MLP_EAGER : o.mode};
  m = dp_mlp_new(s, &mc, st);
  if (!m && mc.mode == DP_MLP_FUNCTION && !o.mode_given &&
      pd_status_code(st) == PD_UNIMPLEMENTED) {
    printf("the daemon has no graph functions (%s): eager mode\n",
           pd_status_message(st));
    mc.mode = DP_MLP_EAGER;
    m = dp_mlp_new(s, &mc, st);
  }
  if (!m) goto fail;
  if (!o.evaluate)
    printf("mode: %s\n", mc.mode == DP_MLP_FUNCTION
                             ? "function (one call per step)"
                             : "eager (one stream item per op)");
  if (o.evaluate) {
    double t0 = now_s();
    if (dp_mlp_load(m, o.evaluate, st) != PD_OK) goto fail;
    printf("weights loaded by the daemon from %s in %.3f s\n", o.evaluate,
           now_s() - t0);
    o.epochs = 0;
  }
  for (int i = 0; i < train.n; i++) order[i] = i;
  uint64_t rng = o.seed * 0x9E3779B97F4A7C15ull + 1;
  double *loss_curve = curve, *acc_curve = curve + o.epochs;
  double busy0 = busy_total(c, NULL), t_train = 0;
  long steps0 = 0;
  for (int e = 0; e < o.epochs; e++) {
    double t0 = now_s();
    shuffle(order, train.n, &rng);
    for (int b = 0; b < train.n; b += o.batch) {
      int rows = train.n - b < o.batch ? train.n - b : o.batch;
      for (int r = 0; r < rows; r++) {
        int src = order[b + r];
        memcpy(bx + (size_t)r * DIGITS_FEATURES,
               train.x + (size_t)src * DIGITS_FEATURES,
               sizeof(float) * DIGITS_FEATURES);
        by[r] = train.y[src];
      }
      if (dp_mlp_step(m, bx, by, rows, st) != PD_OK) goto fail;
    }
    double loss_sum = 0, correct = 0;
    if (dp_mlp_epoch_end(m, &loss_sum, &correct, st) != PD_OK) goto fail;
    double dt = now_s() - t0;
    t_train += dt;
    long steps = dp_mlp_steps(m) - steps0;
    steps0 = dp_mlp_steps(m);
    loss_curve[e] = loss_sum / train.n;
    acc_curve[e] = correct / train.n;
    if (!o.quiet)
      printf("epoch %2d/%d  loss %.4f  train accuracy %6.2f%%  %7.1f steps/s\n",
             e + 1, o.epochs, loss_curve[e], 100 * acc_curve[e],
             (double)steps / dt);
    fflush(stdout);
  }
  double busy1 = busy_total(c, NULL);
  if (o.save) {
    uint64_t saved = 0;
    if (dp_mlp_save(m, o.save, true, &saved, st) != PD_OK) goto fail;
    printf("weights saved by the daemon to %s (%" PRIu64 " bytes of tensors)\n",
           o.save, saved);
  }

  double test_correct = 0;
  if (dp_mlp_evaluate(m, test.x, test.y, test.n, &test_correct, st) != PD_OK)
    goto fail;
  double test_acc = test_correct / test.n;
  printf("test accuracy %.2f%% (%d of %d images)\n", 100 * test_acc,
         (int)test_correct, test.n);
  bool same = false;
  uint64_t wbytes = 0;
  if (dp_mlp_check_replicas(m, &same, &wbytes, st) != PD_OK) goto fail;
  if (same)
    printf("weights bitwise identical on all %d device%s (%" PRIu64
           " bytes per replica)\n",
           ndev, ndev == 1 ? "" : "s", wbytes);
  else
    printf("weights DIFFER between devices\n");
  if (!o.evaluate && busy0 >= 0 && busy1 >= 0 && t_train > 0) {
    double share = (busy1 - busy0) / ndev / t_train;
    printf(
        "%ld steps in %.2f s: the devices were busy %.0f%% of the time "
        "(the daemon's timers), the rest went to RPC and queueing\n",
        dp_mlp_steps(m), t_train, 100 * share);
  }
  if (o.plot && !o.evaluate &&
      plot(o.plot, loss_curve, acc_curve, o.epochs, test_acc) == 0)
    printf("plot written to %s\n", o.plot);
  rc = 0;
  if (!same) rc = 1;
  if (o.min_accuracy >= 0 && 100 * test_acc < o.min_accuracy) {
    fprintf(stderr, "train_digits: test accuracy %.2f%% is below %.2f%%\n",
            100 * test_acc, o.min_accuracy);
    rc = 1;
  }
  goto out;

fail:
  fprintf(stderr, "train_digits: %s: %s\n", pd_code_name(pd_status_code(st)),
          pd_status_message(st));
  if (pd_status_code(st) == PD_UNAVAILABLE)
    fprintf(stderr, "train_digits: %s\n", pd_status_str(PD_UNAVAILABLE));
  rc = 1;
out:
  dp_mlp_delete(m);
  if (s) pd_session_close(s, NULL, NULL);
  pd_session_delete(s);
  pd_client_delete(c);
  pd_status_delete(st);
  free(curve);
  free(bx);
  free(by);
  free(order);
  digits_free(&train);
  digits_free(&test);
  return rc;
}
