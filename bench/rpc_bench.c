/* bench_rpc: what the daemon adds to gRPC's own cost, measured in one run
 * against one daemon (started here on a Unix socket, CPU backend, 4 devices)
 * with libparadev, each figure beside an Echo baseline of the same size
 * through the same client machinery:
 *
 *  execute   a tiny op's Execute round trip (Add of two float32 [1]) beside
 *            a unary Echo whose payload is the Execute request's size, call
 *            by call interleaved: p50 and p99 latency, ratio Execute/Echo
 *            (aim <= 1.15); the median over 7 repetitions (3 with --quick)
 *  enqueue   ops per second streamed through one Enqueue call (each op's
 *            reply awaited only at the end) beside EchoStream messages per
 *            second of the Enqueue item's size (aim >= 0.8); and items the
 *            daemon refuses at validation, which isolates the stream path
 *            from the scheduler's and engine's per-op cost; EchoStream, Add
 *            and Nop alternate, and each figure is the median over the
 *            repetitions
 *  (every repeated row gives the ratios' range across its repetitions,
 *  ratio_min and ratio_max: how much the shared machine moved them)
 *  upload    Upload bytes per second (sharded, so each byte lands on one
 *  download  device once) beside EchoStream bytes per second at the same
 *            chunk size, counting the bytes that cross the transport (each
 *            echoed byte twice: there and back) (aim >= 0.7)
 *  shm       UploadFromSharedMemory / DownloadToSharedMemory of 16 MiB and
 *            256 MiB (sharded float32) beside one memcpy of the same size
 *            (on the CPU backend a shared memory transfer is one copy per
 *            component, plus the call and the first touch of the tensor's
 *            fresh memory) and beside gRPC's Upload / Download of the same
 *            value in the same run
 *  tls       Execute p50/p99 and Enqueue ops/s over TLS beside plaintext
 *            loopback TCP, two daemons of their own (rpc_tls_bench.c)
 *  token     Execute p50/p99 of a client that presents a bearer token
 *            (checked against a tokens file of 64 on every call) beside
 *            one without, on one daemon (rpc_tls_bench.c)
 *
 * Usage: bench_rpc [--quick] [--paradevd PATH] [--target ADDR]
 *   --target uses a running daemon instead of starting one.
 * Results: a table and JSON lines (benchutil.h). Exit status 1 on a failed
 * call. Built from client/CMakeLists.txt (it needs libparadev; bench_*.c are
 * linked against the engine only). */
#include <grpc/byte_buffer_reader.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchutil.h"
#include "client_int.h"
#include "rpc_tls_bench.h"

#ifndef PARADEVD_PATH
#define PARADEVD_PATH "paradevd"
#endif

#define DEVICES 4
#define CHUNK ((size_t)1 << 20)

static pd_status *st;

static void die(const char *what) {
  fprintf(stderr, "bench_rpc: %s: %s: %s\n", what,
          pd_code_name(pd_status_code(st)), pd_status_message(st));
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double pct(const double *sorted, int n, double p) {
  int rank = (int)ceil(p / 100.0 * n);
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return sorted[rank - 1];
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
  rmdir(daemon_dir);
}

static const char *start_daemon(const char *path, char *target, size_t len) {
  snprintf(daemon_dir, sizeof(daemon_dir), "/tmp/bench-rpc-XXXXXX");
  if (!mkdtemp(daemon_dir)) {
    perror("mkdtemp");
    exit(1);
  }
  snprintf(target, len, "unix:%s/pd.sock", daemon_dir);
  pid_t parent = getpid();
  daemon_pid = fork();
  if (daemon_pid == 0) {
    /* The daemon stops with us even when we die without running atexit
     * (a signal, a crash): SIGTERM when this process ends. */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(1);
    execl(path, path, "--listen", target, "--devices", "4", "--log", "warn",
          "--max-message-bytes", "67108864", (char *)NULL);
    fprintf(stderr, "bench_rpc: cannot run %s\n", path);
    _exit(127);
  }
  atexit(stop_daemon);
  return target;
}

/* --- Execute beside Echo --------------------------------------------------------- */

/* The median of v[0..n) (sorts v). */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void minmax(const double *v, int n, double *lo, double *hi) {
  *lo = *hi = v[0];
  for (int i = 1; i < n; i++) {
    if (v[i] < *lo) *lo = v[i];
    if (v[i] > *hi) *hi = v[i];
  }
}

/* Execute of a tiny op beside a unary Echo of the request's size, call by
 * call interleaved (Echo, Execute, Echo, ...), in `reps` repetitions of n
 * calls each: each repetition gives p50 and p99 of both; the figures are
 * the medians over the repetitions, and the ratios' range across them says
 * how noisy the machine was. */
static void bench_execute(pd_client *c, pd_session *s, int n, int reps) {
  const float one[1] = {1};
  const int64_t d1[1] = {1};
  if (pd_upload(s, 1, PD_FLOAT32, d1, 1, one, sizeof(one), pd_layout_mirrored(),
                NULL, NULL, st) != PD_OK)
    die("Upload");
  /* The Echo payload: as many bytes as the Execute request. */
  uint64_t in[2] = {1, 1}, out = 1000;
  Paradev__V1__Operation op;
  pdc_op_build(&op, s, "Add", in, 2, NULL, &out, 1, NULL);
  Paradev__V1__Operation *ops[1] = {&op};
  Paradev__V1__ExecuteRequest req = PARADEV__V1__EXECUTE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.n_ops = 1;
  req.ops = ops;
  size_t req_bytes = protobuf_c_message_get_packed_size(&req.base);
  Paradev__V1__EchoRequest ereq = PARADEV__V1__ECHO_REQUEST__INIT;
  ereq.payload.len = 1;
  size_t payload =
      req_bytes - (protobuf_c_message_get_packed_size(&ereq.base) - 1);
  char *buf = calloc(1, payload + 1);

  double *te = malloc(sizeof(double) * (size_t)n);
  double *tx = malloc(sizeof(double) * (size_t)n);
  double e50[16], x50[16], e99[16], x99[16], r50[16], r99[16];
  if (reps > 16) reps = 16;
  uint64_t ids[1000];
  int nid = 0;
  for (int rep = 0; rep < reps; rep++) {
    int warm = rep == 0 ? n / 10 : 0; /* the first tenth warms up */
    for (int i = -warm; i < n; i++) {
      double t0 = bu_now();
      if (pd_client_echo(c, buf, payload, NULL, 0, NULL, NULL, st) != PD_OK)
        die("Echo");
      double t1 = bu_now();
      out = 0;
      if (pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, st) != PD_OK)
        die("Execute");
      double t2 = bu_now();
      if (i >= 0) {
        te[i] = t1 - t0;
        tx[i] = t2 - t1;
      }
      ids[nid++] = out;
      if (nid == 1000) { /* untimed: keep the handle table small */
        if (pd_delete(s, ids, nid, NULL, st) != PD_OK) die("Delete");
        nid = 0;
      }
    }
    qsort(te, (size_t)n, sizeof(double), cmp_double);
    qsort(tx, (size_t)n, sizeof(double), cmp_double);
    e50[rep] = pct(te, n, 50) * 1e6;
    x50[rep] = pct(tx, n, 50) * 1e6;
    e99[rep] = pct(te, n, 99) * 1e6;
    x99[rep] = pct(tx, n, 99) * 1e6;
    r50[rep] = x50[rep] / e50[rep];
    r99[rep] = x99[rep] / e99[rep];
  }
  if (nid && pd_delete(s, ids, nid, NULL, st) != PD_OK) die("Delete");
  double lo50, hi50, lo99, hi99;
  minmax(r50, reps, &lo50, &hi50);
  minmax(r99, reps, &lo99, &hi99);
  char params[384];
  snprintf(params, sizeof(params),
           "\"op\": \"Add\", \"dtype\": \"float32\", \"shape\": [1], "
           "\"devices\": %d, \"request_bytes\": %zu, \"calls\": %d, "
           "\"reps\": %d, \"statistic\": \"median over reps\", "
           "\"ratio_min\": %.3f, \"ratio_max\": %.3f",
           DEVICES, req_bytes, n, reps, lo50, hi50);
  bu_record("rpc", params, "execute_p50_us", median(x50, reps), "echo_p50_us",
            median(e50, reps));
  snprintf(params, sizeof(params),
           "\"op\": \"Add\", \"dtype\": \"float32\", \"shape\": [1], "
           "\"devices\": %d, \"request_bytes\": %zu, \"calls\": %d, "
           "\"reps\": %d, \"statistic\": \"median over reps\", "
           "\"ratio_min\": %.3f, \"ratio_max\": %.3f",
           DEVICES, req_bytes, n, reps, lo99, hi99);
  bu_record("rpc", params, "execute_p99_us", median(x99, reps), "echo_p99_us",
            median(e99, reps));
  free(te);
  free(tx);
  free(buf);
  uint64_t one_id = 1;
  pd_delete(s, &one_id, 1, NULL, st);
}

/* --- streams ----------------------------------------------------------------------- */

static void on_echo(void *arg, grpc_byte_buffer *bb) {
  /* Decode as a client of Echo would (Enqueue replies are decoded too). */
  ProtobufCMessage *m = pdc_unpack(&paradev__v1__echo_response__descriptor, bb);
  if (!m)
    (*(int *)arg)++;
  else
    protobuf_c_message_free_unpacked(m, NULL);
}

/* EchoStream of `n` messages of `payload` bytes; returns seconds. */
static double echo_stream(pd_client *c, int n, size_t payload) {
  int bad = 0;
  pdc_bidi *b = pdc_bidi_new(c, PDC_M_EchoStream, -1, 4096, on_echo, &bad, st);
  if (!b) die("EchoStream");
  char *buf = calloc(1, payload + 1);
  Paradev__V1__EchoRequest r = PARADEV__V1__ECHO_REQUEST__INIT;
  r.payload.data = (uint8_t *)buf;
  r.payload.len = payload;
  double t0 = bu_now();
  for (int i = 0; i < n; i++)
    if (pdc_bidi_write(b, pdc_pack(&r.base), st) != PD_OK)
      die("EchoStream write");
  if (pdc_bidi_wait(b, (uint64_t)n, -1, st) != PD_OK) die("EchoStream wait");
  double t = bu_now() - t0;
  if (pdc_bidi_close(b, -1, st) != PD_OK) die("EchoStream close");
  pdc_bidi_delete(b);
  free(buf);
  if (bad) {
    fprintf(stderr, "bench_rpc: %d EchoStream replies did not decode\n", bad);
    exit(1);
  }
  return t;
}

static void bench_enqueue(pd_session *s, int n, int reps) {
  const float one[1] = {1};
  const int64_t d1[1] = {1};
  if (pd_upload(s, 2, PD_FLOAT32, d1, 1, one, sizeof(one), pd_layout_mirrored(),
                NULL, NULL, st) != PD_OK)
    die("Upload");
  /* An Enqueue item's size (after the first, which carries the token). */
  uint64_t in[2] = {2, 2}, out = PD_FIRST_LIBRARY_ID + 123456;
  Paradev__V1__Operation op;
  pdc_op_build(&op, s, "Add", in, 2, NULL, &out, 1, NULL);
  Paradev__V1__EnqueueRequest item = PARADEV__V1__ENQUEUE_REQUEST__INIT;
  item.item_case = PARADEV__V1__ENQUEUE_REQUEST__ITEM_EXECUTE;
  item.execute = &op;
  size_t item_bytes = protobuf_c_message_get_packed_size(&item.base);
  Paradev__V1__EchoRequest ereq = PARADEV__V1__ECHO_REQUEST__INIT;
  ereq.payload.len = 1;
  size_t payload =
      item_bytes - (protobuf_c_message_get_packed_size(&ereq.base) - 1);

  /* Add runs on the devices; "Nop" (no such op) is refused at validation,
   * which measures the stream path without the scheduler and engine. Each
   * repetition runs EchoStream, Add, Nop back to back (A B C A B C ...); the
   * figures are medians over the repetitions, with the ratios' range. */
  const char *names[2] = {"Add", "Nop"};
  double q[2][16], e[16], r[2][16];
  if (reps > 16) reps = 16;
  for (int rep = 0; rep < reps; rep++) {
    e[rep] = n / echo_stream(s->c, n, payload);
    for (int k = 0; k < 2; k++) {
      pd_stream *t = pd_stream_new(s, NULL, st);
      if (!t) die("Enqueue");
      double t0 = bu_now();
      for (int i = 0; i < n; i++) {
        out = 0;
        if (pd_stream_execute(t, names[k], in, 2, NULL, &out, 1, NULL, st) !=
            PD_OK)
          die("Enqueue write");
      }
      pd_code rc = pd_stream_wait(t, PD_TIMEOUT_NONE, st);
      if (rc != (k == 0 ? PD_OK : PD_INVALID_ARGUMENT)) die("Enqueue wait");
      q[k][rep] = n / (bu_now() - t0);
      r[k][rep] = q[k][rep] / e[rep];
      if (pd_stream_close(t, PD_TIMEOUT_NONE, st) != PD_OK)
        die("Enqueue close");
      pd_stream_delete(t);
    }
    if (pd_sync(s, NULL, 0, NULL, NULL, st) != PD_OK) die("Sync");
  }
  double lo[2], hi[2];
  for (int k = 0; k < 2; k++) minmax(r[k], reps, &lo[k], &hi[k]);
  double echo_med = median(e, reps);
  char params[384];
  snprintf(params, sizeof(params),
           "\"op\": \"Add\", \"shape\": [1], \"devices\": %d, \"ops\": %d, "
           "\"item_bytes\": %zu, \"reps\": %d, \"statistic\": \"median over "
           "reps\", \"ratio_min\": %.3f, \"ratio_max\": %.3f",
           DEVICES, n, item_bytes, reps, lo[0], hi[0]);
  bu_record("rpc", params, "enqueue_ops_per_s", median(q[0], reps),
            "echo_stream_msgs_per_s", echo_med);
  snprintf(params, sizeof(params),
           "\"op\": \"Nop (refused at validation)\", \"ops\": %d, "
           "\"item_bytes\": %zu, \"reps\": %d, \"statistic\": \"median over "
           "reps\", \"ratio_min\": %.3f, \"ratio_max\": %.3f",
           n, item_bytes, reps, lo[1], hi[1]);
  bu_record("rpc", params, "enqueue_refused_ops_per_s", median(q[1], reps),
            "echo_stream_msgs_per_s", echo_med);
}

static void bench_transfer(pd_session *s, size_t bytes, int reps) {
  size_t n = bytes / sizeof(float);
  float *x = malloc(bytes), *y = malloc(bytes);
  for (size_t i = 0; i < n; i++) x[i] = (float)i;
  const int64_t dims[2] = {(int64_t)(n / 256), 256};
  int msgs = (int)(bytes / CHUNK);
  double best_up = 1e30, best_down = 1e30, best_echo = 1e30;
  for (int rep = 0; rep < reps; rep++) {
    double te = echo_stream(s->c, msgs, CHUNK);
    if (te < best_echo) best_echo = te;
    double t0 = bu_now();
    if (pd_upload(s, 10, PD_FLOAT32, dims, 2, x, bytes, pd_layout_sharded(0),
                  NULL, NULL, st) != PD_OK)
      die("Upload");
    double t1 = bu_now();
    if (pd_download(s, 10, pd_layout_sharded(0), y, bytes, NULL, NULL, NULL,
                    st) != PD_OK)
      die("Download");
    double t2 = bu_now();
    if (memcmp(x, y, bytes) != 0) {
      fprintf(stderr, "bench_rpc: the download differs from the upload\n");
      exit(1);
    }
    uint64_t id = 10;
    if (pd_delete(s, &id, 1, NULL, st) != PD_OK) die("Delete");
    if (t1 - t0 < best_up) best_up = t1 - t0;
    if (t2 - t1 < best_down) best_down = t2 - t1;
  }
  char params[256];
  snprintf(params, sizeof(params),
           "\"bytes\": %zu, \"chunk_bytes\": %zu, \"layout\": \"sharded\", "
           "\"devices\": %d, \"echo\": \"EchoStream, bytes both ways\"",
           bytes, CHUNK, DEVICES);
  double echo_bps = 2.0 * (double)msgs * CHUNK / best_echo / 1e9;
  bu_record("rpc", params, "upload_GBps", bytes / best_up / 1e9,
            "echo_stream_GBps", echo_bps);
  bu_record("rpc", params, "download_GBps", bytes / best_down / 1e9,
            "echo_stream_GBps", echo_bps);
  free(x);
  free(y);
}

/* --- shared memory beside memcpy and gRPC --------------------------------------- */

static void bench_shm(pd_session *s, size_t bytes, int reps) {
  size_t n = bytes / sizeof(float);
  const int64_t dims[2] = {(int64_t)(n / 256), 256};
  pd_shared_memory *r = NULL;
  /* Upload from [0, bytes), download into [bytes, 2 bytes). */
  if (pd_shared_memory_create(s, 2 * bytes, 0, &r, NULL, st) != PD_OK)
    die("pd_shared_memory_create");
  float *x = pd_shared_memory_data(r), *y = x + n;
  for (size_t i = 0; i < n; i++) x[i] = (float)i;
  memset(y, 0, bytes);
  float *hy = malloc(bytes);
  if (!hy) die("malloc");
  double memcpy_gbps = bu_memcpy_gbps(bytes, 0.5);
  double up = 1e30, down = 1e30, gup = 1e30, gdown = 1e30;
  for (int rep = 0; rep < reps; rep++) {
    double t0 = bu_now();
    if (pd_upload_from_shared_memory(s, 20, PD_FLOAT32, dims, 2, r, 0,
                                     pd_layout_sharded(0), NULL, NULL,
                                     st) != PD_OK)
      die("UploadFromSharedMemory");
    double t1 = bu_now();
    if (pd_download_to_shared_memory(s, 20, pd_layout_sharded(0), r, bytes,
                                     NULL, NULL, NULL, st) != PD_OK)
      die("DownloadToSharedMemory");
    double t2 = bu_now();
    if (rep == 0 && memcmp(x, y, bytes) != 0) {
      fprintf(stderr, "bench_rpc: the shared memory download differs\n");
      exit(1);
    }
    /* gRPC's Upload and Download of the same value from private memory. */
    double t3 = bu_now();
    if (pd_upload(s, 21, PD_FLOAT32, dims, 2, x, bytes, pd_layout_sharded(0),
                  NULL, NULL, st) != PD_OK)
      die("Upload");
    double t4 = bu_now();
    if (pd_download(s, 21, pd_layout_sharded(0), hy, bytes, NULL, NULL, NULL,
                    st) != PD_OK)
      die("Download");
    double t5 = bu_now();
    uint64_t ids[2] = {20, 21};
    if (pd_delete(s, ids, 2, NULL, st) != PD_OK) die("Delete");
    if (pd_sync(s, NULL, 0, NULL, NULL, st) != PD_OK) die("Sync");
    if (t1 - t0 < up) up = t1 - t0;
    if (t2 - t1 < down) down = t2 - t1;
    if (t4 - t3 < gup) gup = t4 - t3;
    if (t5 - t4 < gdown) gdown = t5 - t4;
  }
  char params[256];
  snprintf(params, sizeof(params),
           "\"bytes\": %zu, \"dtype\": \"float32\", \"layout\": "
           "\"sharded\", \"devices\": %d, \"backend\": \"cpu\"",
           bytes, DEVICES);
  double gb = (double)bytes / 1e9;
  bu_record("rpc", params, "shm_upload_GBps", gb / up, "memcpy_GBps",
            memcpy_gbps);
  bu_record("rpc", params, "shm_download_GBps", gb / down, "memcpy_GBps",
            memcpy_gbps);
  bu_record("rpc", params, "shm_upload_GBps", gb / up, "grpc_upload_GBps",
            gb / gup);
  bu_record("rpc", params, "shm_download_GBps", gb / down, "grpc_download_GBps",
            gb / gdown);
  free(hy);
  if (pd_shared_memory_destroy(r, NULL, st) != PD_OK)
    die("pd_shared_memory_destroy");
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  const char *path = getenv("PARADEVD") ? getenv("PARADEVD") : PARADEVD_PATH;
  const char *target = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--paradevd") == 0 && i + 1 < argc)
      path = argv[++i];
    else if (strcmp(argv[i], "--target") == 0 && i + 1 < argc)
      target = argv[++i];
    else if (strcmp(argv[i], "--quick") != 0) {
      fprintf(stderr,
              "usage: bench_rpc [--quick] [--paradevd PATH] [--target ADDR]\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  char tbuf[128];
  if (!target) target = start_daemon(path, tbuf, sizeof(tbuf));
  st = pd_status_new();
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.chunk_bytes = CHUNK;
  pd_client *c = pd_client_new(target, &co, st);
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
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_rpc";
  pd_session *s = pd_session_new(c, &so, NULL, st);
  if (!s) die("CreateSession");
  if (pd_session_num_devices(s) != DEVICES)
    fprintf(stderr, "bench_rpc: note: the daemon has %d devices\n",
            pd_session_num_devices(s));

  bench_execute(c, s, quick ? 500 : 2000, quick ? 3 : 7);
  bench_enqueue(s, quick ? 2000 : 20000, quick ? 3 : 7);
  pd_session_delete(s);
  s = pd_session_new(c, &so, NULL, st); /* frees the streamed outputs */
  if (!s) die("CreateSession");
  bench_transfer(s, quick ? ((size_t)16 << 20) : ((size_t)64 << 20),
                 quick ? 2 : 4);
  bench_shm(s, (size_t)16 << 20, quick ? 2 : 5);
  if (!quick) bench_shm(s, (size_t)256 << 20, 3);
  pd_session_delete(s);
  pd_client_delete(c);
  pd_status_delete(st);
  stop_daemon();
  bench_rpc_tls(path, quick);
  bench_rpc_token(path, quick);
  return bu_print_table();
}
