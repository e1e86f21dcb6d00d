/* bench_mesh: a mesh across machines (issue #16) on one host, against Gloo.
 *
 *  gloo      the baseline: Gloo's own all-reduce (device/mesh/gloo.cc, the
 *            transport the daemons use) between 2 processes over loopback
 *            (forked at the start, before any gRPC thread, and kept),
 *            float32 buffers of 16, 64 and 256 MiB; busbw_GBps =
 *            2 (n-1)/n * bytes / time with n = 2, median of 3.
 *  allreduce the subject: 2 daemons x 2 CPU devices (paradevd --world-size
 *            2 --rank R --coordinator 127.0.0.1:PORT --devices 2), a client
 *            AllReduce (sum) through libparadev over a mirrored 4-component
 *            float32 tensor of the same per-device sizes, timed to its Sync;
 *            busbw with n = 4, median of 3. Subject and baseline are
 *            measured in 7 pairs, interleaved (alternating which goes
 *            first) so noise on a shared machine moves both; the row is the
 *            median pair by ratio, with the ratio's range.
 *            The warm-up's result is checked on components 0 (rank 0) and
 *            3 (rank 1): 4 times the input.
 *  tiny_add  the per-op cost of an Add of two float32 scalars on the
 *            2-daemon mesh (2,000 ops pipelined on one stream, then one
 *            sync) beside one daemon with 4 devices; ratio mesh / single.
 *
 * Without Gloo, or when the daemons do not form a mesh (a paradevd without
 * the mesh flags), the subject's rows are skipped with a "skipped: ..."
 * line and the bench still exits 0, so `make bench` never fails for it.
 *
 * Usage: bench_mesh [--quick] [--paradevd PATH]
 * Results: a table and JSON lines (benchutil.h). Exit status 1 when a call
 * failed after the mesh formed. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchdaemon.h"
#include "benchutil.h"
#include "dev_backend.h"
#include "dev_gloo.h"
#include "dev_mesh.h"
#include "paradev/paradev.h"

#ifndef PARADEVD_PATH
#define PARADEVD_PATH "paradevd"
#endif

#define REPS 3
#define PAIRS 7
#define MIB (1024.0 * 1024.0)

static const size_t k_sizes[3] = {16u << 20, 64u << 20, 256u << 20};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* --- The baseline: Gloo between 2 processes over a file store ------------ */

static void kv_path(const char *dir, const char *key, char *out, size_t cap) {
  int n = snprintf(out, cap, "%s/", dir);
  for (const char *k = key; *k && n + 2 < (int)cap; k++)
    out[n++] = *k == '/' ? '!' : *k;
  out[n] = 0;
}

static pd_code kv_set(void *arg, const char *key, const void *value, size_t len,
                      dev_status *st) {
  char path[512], tmp[600];
  kv_path(arg, key, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f || fwrite(value, 1, len, f) != len || fclose(f) != 0 ||
      rename(tmp, path) != 0)
    return dev_error(st, PD_UNAVAILABLE, "cannot write %s", path);
  return PD_OK;
}

static pd_code kv_get(void *arg, const char *key, double timeout_s,
                      void **value, size_t *len, dev_status *st) {
  char path[512];
  kv_path(arg, key, path, sizeof path);
  double deadline = bu_now() + timeout_s;
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      fseek(f, 0, SEEK_END);
      long n = ftell(f);
      fseek(f, 0, SEEK_SET);
      void *buf = malloc(n > 0 ? (size_t)n : 1);
      size_t r = buf ? fread(buf, 1, (size_t)n, f) : 0;
      fclose(f);
      if (!buf || r != (size_t)n) {
        free(buf);
        return dev_error(st, PD_UNAVAILABLE, "short read of %s", path);
      }
      *value = buf;
      *len = (size_t)n;
      return PD_OK;
    }
    if (bu_now() >= deadline)
      return dev_error(st, PD_NOT_FOUND, "key '%s' not set in time", key);
    usleep(2000);
  }
}

/* Child `me` of the baseline: joins the 2-process group, then for each
 * size index read from `cmd` (-1: exit) all-reduces that size REPS times
 * (after one warm-up the first time and a 1-element barrier before each)
 * and writes the median seconds, or a negative value and a message. */
static void gloo_child(int me, const char *dir, int cmd, int fd) {
  dev_mesh_kv kv = {(void *)dir, kv_set, kv_get};
  dev_mesh_transport *t = NULL;
  dev_status st = DEV_STATUS_INIT;
  dev_devset set = {2, {0, 1}};
  void *g = NULL;
  float *buf = NULL;
  int have = -1;
  if (dev_gloo_transport_create(&kv, "bench/", "127.0.0.1", 60.0, &t, &st) ||
      t->group_get(t, &set, me, &g, &st))
    goto fail;
  for (;;) {
    int s;
    if (read(cmd, &s, sizeof s) != (ssize_t)sizeof s || s < 0 || s > 2) break;
    size_t n = k_sizes[s] / sizeof(float);
    bool warm = s != have;
    if (warm) {
      free(buf);
      buf = malloc(k_sizes[s]);
      if (!buf) {
        dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
      }
      for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 13);
      have = s;
    }
    double times[REPS];
    for (int r = warm ? -1 : 0; r < REPS; r++) {
      float bar = 0;
      if (t->all_reduce(t, g, &bar, 1, PD_FLOAT32, DEV_RED_SUM, &st)) goto fail;
      double t0 = bu_now();
      if (t->all_reduce(t, g, buf, n, PD_FLOAT32, DEV_RED_SUM, &st)) goto fail;
      if (r >= 0) times[r] = bu_now() - t0;
    }
    double m = median(times, REPS);
    if (write(fd, &m, sizeof m) != (ssize_t)sizeof m) _exit(3);
  }
  free(buf);
  t->release(t);
  _exit(0);
fail : {
  double bad = -1;
  if (write(fd, &bad, sizeof bad) < 0 || write(fd, st.msg, strlen(st.msg)) < 0)
    _exit(3);
  _exit(1);
}
}

/* The baseline's two processes: their command pipes, result pipes, pids. */
static int g_cmd[2] = {-1, -1}, g_res[2] = {-1, -1};
static pid_t g_pid[2];
static char g_dir[] = "/tmp/bench-mesh-kv-XXXXXX";
static bool g_dir_made;

static void gloo_stop(void) {
  for (int me = 0; me < 2; me++) {
    if (g_pid[me] <= 0) continue;
    int stop = -1, status;
    if (write(g_cmd[me], &stop, sizeof stop) < 0) kill(g_pid[me], SIGKILL);
    close(g_cmd[me]);
    close(g_res[me]);
    for (int i = 0; i < 100 && waitpid(g_pid[me], &status, WNOHANG) == 0; i++)
      usleep(50000);
    if (waitpid(g_pid[me], &status, WNOHANG) == 0) {
      kill(g_pid[me], SIGKILL);
      waitpid(g_pid[me], &status, 0);
    }
    g_pid[me] = 0;
  }
  if (g_dir_made) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
      fprintf(stderr, "bench_mesh: could not remove %s\n", g_dir);
    g_dir_made = false;
  }
}

/* Forks the baseline's 2 processes; false (and a message) on failure. */
static bool gloo_start(char *why, size_t cap) {
  if (!mkdtemp(g_dir)) {
    snprintf(why, cap, "mkdtemp: %s", strerror(errno));
    return false;
  }
  g_dir_made = true;
  for (int me = 0; me < 2; me++) {
    int c[2], r[2];
    if (pipe(c) != 0 || pipe(r) != 0) {
      snprintf(why, cap, "pipe: %s", strerror(errno));
      return false;
    }
    g_pid[me] = fork();
    if (g_pid[me] == 0) {
      alarm(1800);
      close(c[1]);
      close(r[0]);
      if (me == 1) {
        close(g_cmd[0]);
        close(g_res[0]);
      }
      gloo_child(me, g_dir, c[0], r[1]);
    }
    close(c[0]);
    close(r[1]);
    g_cmd[me] = c[1];
    g_res[me] = r[0];
  }
  return true;
}

/* Seconds of one Gloo all-reduce of size index s between the 2 processes
 * (process 0's median of REPS); negative (and a message) on failure. */
static double gloo_measure(int s, char *why, size_t cap) {
  for (int me = 0; me < 2; me++)
    if (write(g_cmd[me], &s, sizeof s) != (ssize_t)sizeof s) {
      snprintf(why, cap, "the Gloo process %d is gone", me);
      return -1;
    }
  double t[2] = {-1, -1};
  for (int me = 0; me < 2; me++) {
    struct pollfd pf = {g_res[me], POLLIN, 0};
    if (poll(&pf, 1, 600000) != 1 ||
        read(g_res[me], &t[me], sizeof t[me]) != (ssize_t)sizeof t[me]) {
      snprintf(why, cap, "the Gloo process %d did not report", me);
      return -1;
    }
    if (t[me] < 0) {
      ssize_t n = read(g_res[me], why, cap - 1);
      why[n > 0 ? n : 0] = 0;
      return -1;
    }
  }
  return t[0];
}

/* --- The subject: daemons ---------------------------------------------------- */

static pd_status *st;
static pid_t mesh_pid[2];
static char mesh_dir[64];

static void mesh_stop(void) {
  for (int r = 1; r >= 0; r--) {
    if (mesh_pid[r] <= 0) continue;
    kill(mesh_pid[r], SIGTERM);
    int status;
    for (int i = 0; i < 200 && waitpid(mesh_pid[r], &status, WNOHANG) == 0; i++)
      usleep(50000);
    if (waitpid(mesh_pid[r], &status, WNOHANG) == 0) {
      kill(mesh_pid[r], SIGKILL);
      waitpid(mesh_pid[r], &status, 0);
    }
    mesh_pid[r] = 0;
  }
  if (mesh_dir[0]) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", mesh_dir);
    if (system(cmd) != 0)
      fprintf(stderr, "bench_mesh: could not remove %s\n", mesh_dir);
    mesh_dir[0] = 0;
  }
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* Starts the 2-rank mesh and connects to its coordinator once it serves 4
 * devices; NULL with `why` when it does not form within 60 s. */
static pd_client *mesh_start(const char *paradevd, char *why, size_t cap) {
  snprintf(mesh_dir, sizeof mesh_dir, "/tmp/bench-mesh-XXXXXX");
  if (!mkdtemp(mesh_dir)) {
    mesh_dir[0] = 0;
    snprintf(why, cap, "mkdtemp: %s", strerror(errno));
    return NULL;
  }
  int port = free_port();
  char coord[64], listen[2][128], admin[2][128], rank[2][8];
  snprintf(coord, sizeof coord, "127.0.0.1:%d", port);
  for (int r = 0; r < 2; r++) {
    snprintf(listen[r], sizeof listen[r], "unix:%s/pd%d.sock", mesh_dir, r);
    snprintf(admin[r], sizeof admin[r], "%s/admin%d.sock", mesh_dir, r);
    snprintf(rank[r], sizeof rank[r], "%d", r);
    mesh_pid[r] = fork();
    if (mesh_pid[r] == 0) {
      char log[160];
      snprintf(log, sizeof log, "%s/rank%d.log", mesh_dir, r);
      FILE *f = freopen(log, "w", stderr);
      (void)f;
      execl(paradevd, paradevd, "--config", "/dev/null", "--listen", listen[r],
            "--admin-socket", admin[r], "--devices", "2", "--world-size", "2",
            "--rank", rank[r], "--coordinator", coord, "--log", "warn",
            (char *)NULL);
      _exit(127);
    }
  }
  double deadline = bu_now() + 60.0;
  pd_client *c = NULL;
  while (bu_now() < deadline) {
    for (int r = 0; r < 2; r++) {
      int status;
      if (waitpid(mesh_pid[r], &status, WNOHANG) == mesh_pid[r]) {
        mesh_pid[r] = 0;
        char log[160], line[200] = "";
        snprintf(log, sizeof log, "%s/rank%d.log", mesh_dir, r);
        FILE *f = fopen(log, "r");
        if (f) {
          if (!fgets(line, sizeof line, f)) line[0] = 0;
          fclose(f);
        }
        line[strcspn(line, "\n")] = 0;
        snprintf(why, cap, "paradevd rank %d exited (%s)%s%s", r,
                 WIFEXITED(status) ? "status" : "signal", line[0] ? ": " : "",
                 line);
        if (c) pd_client_delete(c);
        return NULL;
      }
    }
    if (!c && access(listen[0] + 5, F_OK) == 0)
      c = pd_client_new(listen[0], NULL, st);
    if (c) {
      pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
      o.timeout_ms = 1000;
      pd_serving_status ss = PD_SERVING_UNKNOWN;
      if (pd_client_health(c, "", &ss, &o, st) == PD_OK && ss == PD_SERVING) {
        pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
        pd_session *s = pd_session_new(c, &so, NULL, st);
        int n = s ? pd_session_devices(s, NULL, 0) : 0;
        if (s) pd_session_delete(s);
        if (n == 4) return c;
      }
    }
    usleep(100000);
  }
  snprintf(why, cap,
           "the 2 daemons did not serve a mesh of 4 devices within 60 s");
  if (c) pd_client_delete(c);
  return NULL;
}

static void die(const char *what) {
  fprintf(stderr, "bench_mesh: %s: %s: %s\n", what,
          pd_code_name(pd_status_code(st)), pd_status_message(st));
  exit(1);
}

/* Value i of the bench's input (exact in float32, and 4 times it too). */
static float input_at(size_t i) { return (float)(i % 13); }

/* The AllReduce's output `out` (n elements) on component c is 4 times the
 * input everywhere; exits 1 naming the first wrong element. */
static void check_sum(pd_session *s, uint64_t out, size_t n, int c) {
  float *got = bu_xmalloc(n * sizeof(float));
  if (pd_download(s, out, pd_layout_component(c), got, n * sizeof(float), NULL,
                  NULL, NULL, st) != PD_OK)
    die("Download");
  for (size_t i = 0; i < n; i++)
    if (got[i] != 4.0f * input_at(i)) {
      fprintf(stderr,
              "bench_mesh: AllReduce component %d element %zu is %g; "
              "expected %g (4 devices x %g)\n",
              c, i, got[i], 4.0 * input_at(i), (double)input_at(i));
      exit(1);
    }
  free(got);
}

/* Seconds of one AllReduce (sum) of `x` (n elements per device), to its
 * Sync, median of REPS; with `warm`, after one warm-up whose result is
 * checked on a device of each rank (components 0 and 3). */
static double allreduce_s(pd_session *s, uint64_t x, size_t n, bool warm) {
  pd_attrs *a = pd_attrs_new();
  pd_attrs_set_string(a, "reduction", "sum");
  double t[REPS];
  for (int r = warm ? -1 : 0; r < REPS; r++) {
    uint64_t out = 0;
    double t0 = bu_now();
    if (pd_execute(s, "AllReduce", &x, 1, a, &out, 1, NULL, NULL, st) != PD_OK)
      die("AllReduce");
    if (pd_sync(s, &out, 1, NULL, NULL, st) != PD_OK) die("Sync");
    if (r >= 0) t[r] = bu_now() - t0;
    if (r < 0) {
      check_sum(s, out, n, 0);
      check_sum(s, out, n, 3);
    }
    if (pd_delete(s, &out, 1, NULL, st) != PD_OK) die("Delete");
  }
  pd_attrs_delete(a);
  return median(t, REPS);
}

/* Microseconds per Add of two float32 scalars, `ops` pipelined on one
 * stream then one sync, median of 3 rounds after a warm-up round. */
static double tiny_add_us(pd_client *c, int ops) {
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_mesh";
  pd_session *s = pd_session_new(c, &so, NULL, st);
  if (!s) die("CreateSession");
  pd_stream *t = pd_stream_new(s, NULL, st);
  if (!t) die("stream");
  float one = 1.0f;
  uint64_t x = pd_session_new_id(s);
  if (pd_upload(s, x, PD_FLOAT32, NULL, 0, &one, sizeof one,
                pd_layout_mirrored(), NULL, NULL, st) != PD_OK)
    die("Upload");
  uint64_t *ids = bu_xmalloc(sizeof(uint64_t) * (size_t)ops);
  double us[3];
  for (int round = -1; round < 3; round++) {
    double t0 = bu_now();
    for (int i = 0; i < ops; i++) {
      const uint64_t in[2] = {x, x};
      ids[i] = 0;
      if (pd_stream_execute(t, "Add", in, 2, NULL, &ids[i], 1, NULL, st) !=
          PD_OK)
        die("Add");
    }
    if (pd_stream_wait(t, PD_TIMEOUT_NONE, st) != PD_OK) die("stream");
    if (pd_sync(s, NULL, 0, NULL, NULL, st) != PD_OK) die("Sync");
    if (round >= 0) us[round] = 1e6 * (bu_now() - t0) / ops;
    if (pd_stream_delete_ids(t, ids, ops, NULL, st) != PD_OK) die("Delete");
    if (pd_stream_wait(t, PD_TIMEOUT_NONE, st) != PD_OK) die("stream");
  }
  free(ids);
  pd_stream_close(t, 30000, NULL);
  pd_stream_delete(t);
  pd_session_close(s, NULL, NULL);
  pd_session_delete(s);
  return median(us, 3);
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  const char *path = getenv("PARADEVD") ? getenv("PARADEVD") : PARADEVD_PATH;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--paradevd") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else if (strcmp(argv[i], "--quick") != 0) {
      fprintf(stderr, "usage: bench_mesh [--quick] [--paradevd PATH]\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  if (!dev_gloo_available()) {
    printf(
        "mesh: skipped: this build has no Gloo (libgloo-dev not found at "
        "configure time): no collectives across machines\n");
    return 0;
  }
  int nsizes = quick ? 1 : 3;
  char why[DEV_STATUS_MSG_MAX + 64] = "";
  /* The baseline's processes first, before this process has any gRPC
   * threads; they stay for the interleaved pairs. */
  atexit(gloo_stop);
  if (!gloo_start(why, sizeof why)) {
    printf("mesh: skipped: the Gloo baseline failed: %s\n", why);
    return 0;
  }

  st = pd_status_new();
  atexit(mesh_stop);
  pd_client *mc = mesh_start(path, why, sizeof why);
  if (!mc) {
    printf(
        "mesh: skipped: the daemons could not form a mesh: %s (needs "
        "paradevd's --world-size/--rank/--coordinator)\n",
        why);
    mesh_stop();
    for (int k = 0; k < nsizes; k++) { /* the baseline alone */
      double t = gloo_measure(k, why, sizeof why);
      if (t < 0) {
        printf("mesh: skipped: the Gloo baseline failed: %s\n", why);
        break;
      }
      char params[96], sz[32];
      snprintf(params, sizeof params, "\"bytes\": %zu, \"processes\": 2",
               k_sizes[k]);
      bu_record("gloo_allreduce", params, "busbw_GBps",
                (double)k_sizes[k] / t / 1e9, NULL, 0);
      printf("mesh: Gloo 2 processes, %-8s float32: busbw %6.2f GB/s\n",
             bu_size_str(k_sizes[k], sz, sizeof sz),
             (double)k_sizes[k] / t / 1e9);
    }
    gloo_stop();
    bu_print_table();
    return 0;
  }
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_mesh";
  pd_session *s = pd_session_new(mc, &so, NULL, st);
  if (!s) die("CreateSession");
  for (int k = 0; k < nsizes; k++) {
    size_t n = k_sizes[k] / sizeof(float);
    float *host = bu_xmalloc(k_sizes[k]);
    for (size_t i = 0; i < n; i++) host[i] = input_at(i);
    const int64_t dims[1] = {(int64_t)n};
    uint64_t x = pd_session_new_id(s);
    if (pd_upload(s, x, PD_FLOAT32, dims, 1, host, k_sizes[k],
                  pd_layout_mirrored(), NULL, NULL, st) != PD_OK)
      die("Upload");
    free(host);
    /* PAIRS pairs of one subject and one baseline measurement, back to
     * back in alternating order; busbw: n = 4 (2 (n-1)/n = 1.5) for the
     * subject, n = 2 (1) for the baseline. */
    double ratio[PAIRS], bw[PAIRS], gb[PAIRS];
    for (int p = 0; p < PAIRS; p++) {
      double ts = 0, tg = 0;
      for (int half = 0; half < 2; half++) {
        if ((half == 0) == (p % 2 == 0)) {
          ts = allreduce_s(s, x, n, p == 0);
        } else if ((tg = gloo_measure(k, why, sizeof why)) < 0) {
          fprintf(stderr, "bench_mesh: the Gloo baseline failed: %s\n", why);
          exit(1);
        }
      }
      bw[p] = 1.5 * (double)k_sizes[k] / ts / 1e9;
      gb[p] = (double)k_sizes[k] / tg / 1e9;
      ratio[p] = bw[p] / gb[p];
    }
    if (pd_delete(s, &x, 1, NULL, st) != PD_OK) die("Delete");
    int mid = 0;
    for (int i = 0; i < PAIRS; i++) { /* the median pair by ratio */
      int below = 0, equal = 0;
      for (int j = 0; j < PAIRS; j++) {
        below += ratio[j] < ratio[i];
        equal += ratio[j] == ratio[i];
      }
      if (below <= PAIRS / 2 && below + equal > PAIRS / 2) {
        mid = i;
        break;
      }
    }
    double lo = ratio[0], hi = ratio[0];
    for (int p = 1; p < PAIRS; p++) {
      lo = ratio[p] < lo ? ratio[p] : lo;
      hi = ratio[p] > hi ? ratio[p] : hi;
    }
    char params[256], sz[32];
    snprintf(params, sizeof params, "\"bytes\": %zu, \"processes\": 2",
             k_sizes[k]);
    bu_record("gloo_allreduce", params, "busbw_GBps", gb[mid], NULL, 0);
    snprintf(params, sizeof params,
             "\"bytes_per_device\": %zu, \"ranks\": 2, \"devices_per_rank\": "
             "2, \"pairs\": %d, \"statistic\": \"median pair, interleaved\", "
             "\"ratio_min\": %.4f, \"ratio_max\": %.4f",
             k_sizes[k], PAIRS, lo, hi);
    bu_record("mesh_allreduce", params, "busbw_GBps", bw[mid],
              "gloo_2proc_busbw_GBps", gb[mid]);
    printf(
        "mesh: AllReduce 2 daemons x 2 devices, %-8s per device: busbw "
        "%6.2f GB/s, Gloo 2 processes %6.2f GB/s: %.2fx (pairs %d, ratio "
        "%.2f-%.2f)\n",
        bu_size_str(k_sizes[k], sz, sizeof sz), bw[mid], gb[mid], ratio[mid],
        PAIRS, lo, hi);
    fflush(stdout);
  }
  gloo_stop();
  pd_session_close(s, NULL, NULL);
  pd_session_delete(s);
  int ops = quick ? 200 : 2000;
  double mesh_us = tiny_add_us(mc, ops);
  pd_client_delete(mc);
  mesh_stop();

  pd_client *one = bench_daemon_start(path, 4, "bench_mesh", st);
  double one_us = tiny_add_us(one, ops);
  pd_client_delete(one);
  bench_daemon_stop();
  char params[96];
  snprintf(params, sizeof params, "\"ops\": %d, \"devices\": 4, \"ranks\": 2",
           ops);
  bu_record("mesh_tiny_add", params, "us_per_op", mesh_us,
            "one_daemon_4dev_us_per_op", one_us);
  printf(
      "mesh: tiny Add on 2 daemons x 2 devices %8.1f us/op, one daemon x 4 "
      "devices %8.1f us/op (%.2fx)\n",
      mesh_us, one_us, mesh_us / one_us);
  pd_status_delete(st);
  return bu_print_table();
}
