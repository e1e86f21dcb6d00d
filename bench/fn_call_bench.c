/* bench_fn_call: what a graph function saves per call. A function of N
 * trivial nodes (a chain y_k = Add(y_{k-1}, x) on a float32[4], mirrored)
 * called once, beside the same N ops as N items of one Enqueue stream, for
 * N = 1, 10, 100, on 4 CPU devices. The function is registered with the
 * arithmetic and fusion passes off, so that its N nodes stay N kernels
 * (pruning, CSE and constant folding find nothing to do in the chain:
 * every node is used and distinct, and x is an argument).
 *
 * Each repetition queues the work and a Delete of what it made; the
 * client waits for the stream and the devices every 64 repetitions and at
 * the end, so the figure is throughput: wall seconds per repetition,
 * devices included. Reported per N: function_us_per_call against
 * eager_us_per_n_ops (ratio < 1: the function is cheaper).
 *
 * Usage: bench_fn_call [--quick] [--paradevd PATH]
 * Results: a table and JSON lines (benchutil.h). Exit status 1 on a failed
 * call, 77 when the daemon has no graph functions (UNIMPLEMENTED). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchdaemon.h"
#include "benchutil.h"
#include "paradev/paradev.h"

#ifndef PARADEVD_PATH
#define PARADEVD_PATH "paradevd"
#endif

#define DEVICES 4
#define MAX_N 100

static pd_status *st;
static void die(const char *what) {
  fprintf(stderr, "bench_fn_call: %s: %s: %s\n", what,
          pd_code_name(pd_status_code(st)), pd_status_message(st));
  exit(1);
}

/* Registers "chain<N>": y = x + x + ... (N Adds), passes that would merge
 * the chain switched off. Returns the code (UNIMPLEMENTED: no functions). */
static pd_code register_chain(pd_session *s, int n, char *name, size_t len) {
  snprintf(name, len, "chain%d", n);
  pd_function *f = pd_function_new(name);
  if (!f) return PD_RESOURCE_EXHAUSTED;
  pd_function_add_arg(f, "x", PD_FLOAT32);
  char nm[16], prev[16] = "x";
  pd_code rc = PD_OK;
  for (int k = 0; k < n && rc == PD_OK; k++) {
    snprintf(nm, sizeof nm, "y%d", k);
    const char *in[2] = {prev, "x"};
    rc = pd_function_add_node(f, nm, "Add", in, 2, NULL, st);
    memcpy(prev, nm, sizeof prev);
  }
  if (rc == PD_OK) rc = pd_function_add_output(f, "y", prev, st);
  pd_function_set_pass(f, PD_PASS_ARITHMETIC, PD_TRISTATE_OFF);
  pd_function_set_pass(f, PD_PASS_FUSION, PD_TRISTATE_OFF);
  if (rc == PD_OK) rc = pd_register_function(s, f, NULL, NULL, st);
  pd_function_delete(f);
  return rc;
}

typedef struct run {
  pd_session *s;
  pd_stream *t;
  uint64_t x;
  int n;
  const char *fn; /* NULL: eager */
} run;

/* One repetition: the chain as N items (eager) or one call, then a Delete
 * item for its outputs. */
static void rep(run *r) {
  uint64_t ids[MAX_N];
  int k = 0;
  if (r->fn) {
    ids[0] = 0;
    if (pd_stream_execute(r->t, r->fn, &r->x, 1, NULL, ids, 1, NULL, st) !=
        PD_OK)
      die("call");
    k = 1;
  } else {
    uint64_t prev = r->x;
    for (; k < r->n; k++) {
      const uint64_t in[2] = {prev, r->x};
      ids[k] = 0;
      if (pd_stream_execute(r->t, "Add", in, 2, NULL, &ids[k], 1, NULL, st) !=
          PD_OK)
        die("execute");
      prev = ids[k];
    }
  }
  if (pd_stream_delete_ids(r->t, ids, k, NULL, st) != PD_OK) die("delete");
}

static void drain(run *r) {
  if (pd_stream_wait(r->t, PD_TIMEOUT_NONE, st) != PD_OK) die("stream");
  if (pd_sync(r->s, NULL, 0, NULL, NULL, st) != PD_OK) die("sync");
}

/* Microseconds per repetition over at least min_s seconds. */
static double measure(run *r, double min_s) {
  for (int i = 0; i < 8; i++) rep(r); /* warm-up: instantiation, caches */
  drain(r);
  long reps = 0;
  double t0 = bu_now();
  do {
    rep(r);
    if (++reps % 64 == 0) drain(r);
  } while (bu_now() - t0 < min_s || reps < 16);
  drain(r);
  return 1e6 * (bu_now() - t0) / (double)reps;
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  const char *path = getenv("PARADEVD") ? getenv("PARADEVD") : PARADEVD_PATH;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--paradevd") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else if (strcmp(argv[i], "--quick") != 0) {
      fprintf(stderr, "usage: bench_fn_call [--quick] [--paradevd PATH]\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  atexit(bench_daemon_stop);
  st = pd_status_new();
  pd_client *c = bench_daemon_start(path, DEVICES, "bench_fn_call", st);
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_fn_call";
  pd_session *s = pd_session_new(c, &so, NULL, st);
  if (!s) die("CreateSession");
  run r = {s, pd_stream_new(s, NULL, st), 0, 0, NULL};
  if (!r.t) die("stream");
  pd_attrs *a = pd_attrs_new();
  const int64_t dims[1] = {4};
  pd_attrs_set_shape(a, "shape", dims, 1);
  pd_attrs_set_float(a, "value", 1.0);
  pd_attrs_set_dtype(a, "dtype", PD_FLOAT32);
  pd_tensor_info info;
  if (pd_execute(s, "Fill", NULL, 0, a, &r.x, 1, &info, NULL, st) != PD_OK)
    die("Fill");
  pd_attrs_delete(a);
  const int ns[3] = {1, 10, 100};
  int rc = 0;
  for (int k = 0; k < 3; k++) {
    char name[32];
    pd_code reg = register_chain(s, ns[k], name, sizeof name);
    if (reg == PD_UNIMPLEMENTED) {
      printf("fn_call: skipped: the daemon has no graph functions (%s)\n",
             pd_status_message(st));
      rc = 77;
      break;
    }
    if (reg != PD_OK) die("RegisterFunction");
    double min_s = quick ? 0.2 : 1.0;
    r.n = ns[k];
    r.fn = NULL;
    double eager = measure(&r, min_s);
    r.fn = name;
    double fn = measure(&r, min_s);
    char params[64];
    snprintf(params, sizeof params, "\"nodes\": %d, \"devices\": %d", ns[k],
             DEVICES);
    bu_record("fn_call", params, "function_us_per_call", fn,
              "eager_us_per_n_ops", eager);
    printf(
        "fn_call: N = %3d: one call %8.1f us, %3d eager ops %8.1f us "
        "(%.2fx)\n",
        ns[k], fn, ns[k], eager, eager / fn);
  }
  pd_stream_close(r.t, 30000, NULL);
  pd_stream_delete(r.t);
  pd_session_close(s, NULL, NULL);
  pd_session_delete(s);
  pd_client_delete(c);
  bench_daemon_stop();
  pd_status_delete(st);
  int t = bu_print_table();
  return rc ? rc : t;
}
