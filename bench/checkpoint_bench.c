/* bench_checkpoint: LoadTensors through the daemon's RAM block cache, each
 * figure beside a baseline measured in the same run, on one safetensors file
 * of 256 MiB (64 MiB with --quick) that this program writes into a
 * temporary directory, the daemon's only storage root (CPU backend, 4
 * devices, started here on a Unix socket):
 *
 *  cold     a load whose blocks are not cached (the file's mtime is bumped
 *           before each, so its signature changes and the cache drops it),
 *           from LoadTensors to the end of a Sync of the tensor, in file
 *           bytes per second, beside a plain sequential pread of the same
 *           file into one buffer (both read the page cache: what is
 *           measured is the daemon's path, not the disk) (aim >= 0.8)
 *  warm     the same load again, every block cached, beside one memcpy of
 *           the file's size (aim >= 0.5)
 *  layout   SHARDED along axis 0 (each device reads and writes only its
 *           quarter) and MIRRORED (every device gets the whole value: four
 *           copies into device memory), both cold and warm; the sharded
 *           figure's baseline is the mirrored one of the same pass
 *  sessions 8 sessions loading the file at once (sharded, cold) beside one
 *           session alone: wall time, and the bytes the fetchers read from
 *           storage (from /metrics), which must be the same
 *
 * Each pass measures every subject and its baseline back to back; the
 * figures are the median over the passes (5; 2 with --quick).
 *
 * Usage: bench_checkpoint [--quick] [--paradevd PATH]
 * Results: a table and JSON lines (benchutil.h), rows of bench
 * "checkpoint". Exit status 1 on a failed call. Built from
 * client/CMakeLists.txt (it needs libparadev). */
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchutil.h"
#include "paradev/paradev.h"

#ifndef PARADEVD_PATH
#define PARADEVD_PATH "paradevd"
#endif

#define DEVICES 4
#define COLS 1024
#define SESSIONS 8

static pd_status *st;
static char dir[64], file[128], target[128];
static int metrics_port;

static void die(const char *what) {
  fprintf(stderr, "bench_checkpoint: %s: %s: %s\n", what,
          pd_code_name(pd_status_code(st)), pd_status_message(st));
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* --- the file ------------------------------------------------------------------ */

/* A safetensors file of one float32 tensor "w" [rows, COLS]: the header's
 * JSON padded with spaces to a multiple of 8, as the reference writer does. */
static void write_file(size_t bytes) {
  size_t rows = bytes / (COLS * sizeof(float));
  char json[256];
  int n = snprintf(json, sizeof json,
                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[%zu,%d],"
                   "\"data_offsets\":[0,%zu]}}",
                   rows, COLS, bytes);
  while (n % 8) json[n++] = ' ';
  uint64_t hlen = (uint64_t)n; /* little-endian on every machine we build on */
  FILE *f = fopen(file, "wb");
  if (!f || fwrite(&hlen, 8, 1, f) != 1 || fwrite(json, (size_t)n, 1, f) != 1) {
    perror(file);
    exit(1);
  }
  size_t chunk = (size_t)4 << 20;
  float *buf = bu_xmalloc(chunk);
  for (size_t off = 0; off < bytes; off += chunk) {
    for (size_t i = 0; i < chunk / sizeof(float); i++)
      buf[i] = (float)((off / sizeof(float) + i) % 65521) * 0.5f;
    if (fwrite(buf, chunk, 1, f) != 1) {
      perror(file);
      exit(1);
    }
  }
  free(buf);
  if (fclose(f) != 0) {
    perror(file);
    exit(1);
  }
}

/* A new mtime, so the daemon's cache sees another version of the file. */
static void touch_file(void) {
  static long tick;
  struct timespec ts[2];
  clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_nsec = (ts[0].tv_nsec + ++tick) % 1000000000L;
  ts[1] = ts[0];
  if (utimensat(AT_FDCWD, file, ts, 0) != 0) {
    perror("utimensat");
    exit(1);
  }
}

/* Sequential pread of the whole file in 4 MiB pieces into one buffer. */
static double pread_seconds(void *dst, size_t bytes) {
  int fd = open(file, O_RDONLY);
  if (fd < 0) {
    perror(file);
    exit(1);
  }
  double t0 = bu_now();
  size_t chunk = (size_t)4 << 20, done = 0;
  while (done < bytes) {
    size_t want = bytes - done < chunk ? bytes - done : chunk;
    ssize_t got = pread(fd, (char *)dst + done, want, (off_t)done);
    if (got <= 0) {
      perror("pread");
      exit(1);
    }
    done += (size_t)got;
  }
  double t = bu_now() - t0;
  close(fd);
  return t;
}

static double memcpy_seconds(void *dst, const void *src, size_t bytes) {
  double t0 = bu_now();
  memcpy(dst, src, bytes);
  double t = bu_now() - t0;
  /* Keep the copy from being optimised away. */
  if (((volatile const char *)dst)[bytes / 2] == 42) fputs("", stderr);
  return t;
}

/* --- the daemon ------------------------------------------------------------------ */

static pid_t daemon_pid;

static void stop_daemon(void) {
  if (daemon_pid > 0) {
    kill(daemon_pid, SIGTERM);
    int status;
    waitpid(daemon_pid, &status, 0);
    daemon_pid = 0;
  }
  char p[160];
  snprintf(p, sizeof p, "%s/pd.sock", dir);
  unlink(p);
  unlink(file);
  rmdir(dir);
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    perror("socket");
    exit(1);
  }
  close(fd);
  return ntohs(a.sin_port);
}

static void start_daemon(const char *path) {
  snprintf(target, sizeof target, "unix:%s/pd.sock", dir);
  metrics_port = free_port();
  char metrics[32];
  snprintf(metrics, sizeof metrics, "127.0.0.1:%d", metrics_port);
  pid_t parent = getpid();
  daemon_pid = fork();
  if (daemon_pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(1);
    execl(path, path, "--config", "/dev/null", "--listen", target, "--devices",
          "4", "--log", "warn", "--storage-root", dir, "--metrics-listen",
          metrics, (char *)NULL);
    fprintf(stderr, "bench_checkpoint: cannot run %s\n", path);
    _exit(127);
  }
}

static pd_client *connect_daemon(void) {
  pd_client *c = pd_client_new(target, NULL, st);
  if (!c) die("client");
  pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
  o.timeout_ms = 1000;
  for (int i = 0; i < 200; i++) {
    pd_serving_status ss;
    if (pd_client_health(c, "", &ss, &o, st) == PD_OK && ss == PD_SERVING)
      return c;
    usleep(50 * 1000);
  }
  die("the daemon did not become SERVING in 10 s");
  return NULL;
}

/* --- /metrics: the bytes the fetchers read from storage ---------------------------- */

typedef struct body {
  char *p;
  size_t n;
} body;

static size_t on_body(char *data, size_t size, size_t n, void *arg) {
  body *b = arg;
  char *p = realloc(b->p, b->n + size * n + 1);
  if (!p) return 0;
  memcpy(p + b->n, data, size * n);
  b->p = p;
  b->n += size * n;
  b->p[b->n] = 0;
  return size * n;
}

static double bytes_fetched(void) {
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", metrics_port);
  CURL *h = curl_easy_init();
  body b = {NULL, 0};
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
  CURLcode rc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  const char *key = "\nparadev_storage_bytes_fetched_total ";
  const char *at = rc == CURLE_OK && b.p ? strstr(b.p, key) : NULL;
  if (!at) {
    fprintf(stderr, "bench_checkpoint: %s: no %s (%s)\n", url, key + 1,
            curl_easy_strerror(rc));
    exit(1);
  }
  double v = strtod(at + strlen(key), NULL);
  free(b.p);
  return v;
}

/* --- loads --------------------------------------------------------------------------- */

/* Loads "w" by `layout` and waits for it; returns the seconds it took. */
static double load_seconds(pd_session *s, pd_layout layout, pd_status *err) {
  pd_load_spec spec = {"w", 0, layout, NULL, 0, NULL, 0};
  pd_call_options co = PD_CALL_OPTIONS_INITIALIZER;
  co.timeout_ms = 120000;
  double t0 = bu_now();
  pd_load *l = NULL;
  if (pd_load_tensors(s, file, &spec, 1, NULL, &l, &co, err) != PD_OK)
    return -1;
  pd_tensor_info info;
  pd_load_tensor_info(l, 0, &info);
  pd_code rc = pd_sync(s, &info.id, 1, NULL, &co, err);
  double t = bu_now() - t0;
  pd_load_delete(l);
  if (rc != PD_OK) return -1;
  if (pd_delete(s, &info.id, 1, &co, err) != PD_OK) return -1;
  return t;
}

typedef struct worker {
  pd_client *c;
  pthread_barrier_t *go;
  double seconds;
  pd_status *err;
} worker;

static void *run_worker(void *arg) {
  worker *w = arg;
  pd_session *s = pd_session_new(w->c, NULL, NULL, w->err);
  pthread_barrier_wait(w->go);
  w->seconds = s ? load_seconds(s, pd_layout_sharded(0), w->err) : -1;
  if (s) pd_session_close(s, NULL, NULL);
  pd_session_delete(s);
  return NULL;
}

/* n sessions load the (cold) file at once; wall time and bytes fetched. */
static void concurrent(pd_client *c, int n, double *wall, double *fetched) {
  touch_file();
  double f0 = bytes_fetched();
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)n + 1);
  worker w[SESSIONS];
  pthread_t th[SESSIONS];
  for (int i = 0; i < n; i++) {
    w[i] = (worker){c, &go, 0, pd_status_new()};
    pthread_create(&th[i], NULL, run_worker, &w[i]);
  }
  pthread_barrier_wait(&go);
  double t0 = bu_now();
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  *wall = bu_now() - t0;
  for (int i = 0; i < n; i++) {
    if (w[i].seconds < 0) {
      pd_status_set(st, pd_status_code(w[i].err), pd_status_message(w[i].err));
      die("a concurrent load");
    }
    pd_status_delete(w[i].err);
  }
  pthread_barrier_destroy(&go);
  *fetched = bytes_fetched() - f0;
}

int main(int argc, char **argv) {
  bool quick = bu_quick(argc, argv);
  const char *paradevd = PARADEVD_PATH;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--paradevd") == 0 && i + 1 < argc)
      paradevd = argv[++i];
    else if (strcmp(argv[i], "--quick") != 0) {
      fprintf(stderr, "usage: bench_checkpoint [--quick] [--paradevd PATH]\n");
      return 2;
    }
  }
  st = pd_status_new();
  curl_global_init(CURL_GLOBAL_DEFAULT);
  size_t bytes = (size_t)(quick ? 64 : 256) << 20;
  int passes = quick ? 2 : 5;
  snprintf(dir, sizeof dir, "/tmp/bench-ckpt-XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(file, sizeof file, "%s/w.safetensors", dir);
  atexit(stop_daemon);
  write_file(bytes);
  start_daemon(paradevd);
  pd_client *c = connect_daemon();
  pd_session *s = pd_session_new(c, NULL, NULL, st);
  if (!s) die("session");

  void *a = bu_xmalloc(bytes), *b = bu_xmalloc(bytes);
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  pread_seconds(a, bytes); /* the file in the page cache for both sides */

  double t_pread[8], t_memcpy[8], t_cold[2][8], t_warm[2][8];
  const pd_layout layouts[2] = {pd_layout_mirrored(), pd_layout_sharded(0)};
  for (int p = 0; p < passes; p++) {
    t_pread[p] = pread_seconds(a, bytes);
    t_memcpy[p] = memcpy_seconds(b, a, bytes);
    for (int l = 0; l < 2; l++) {
      touch_file();
      if ((t_cold[l][p] = load_seconds(s, layouts[l], st)) < 0) die("load");
      if ((t_warm[l][p] = load_seconds(s, layouts[l], st)) < 0) die("load");
    }
  }
  double gb = (double)bytes / 1e9;
  double pread_gbps = gb / median(t_pread, passes);
  double memcpy_gbps = gb / median(t_memcpy, passes);
  const char *names[2] = {"mirrored", "sharded"};
  double cold[2], warm[2];
  char params[128];
  for (int l = 0; l < 2; l++) {
    cold[l] = gb / median(t_cold[l], passes);
    warm[l] = gb / median(t_warm[l], passes);
    snprintf(params, sizeof params,
             "\"cache\":\"cold\",\"layout\":\"%s\",\"mib\":%zu", names[l],
             bytes >> 20);
    bu_record("checkpoint", params, "load_GBps", cold[l], "pread_GBps",
              pread_gbps);
    snprintf(params, sizeof params,
             "\"cache\":\"warm\",\"layout\":\"%s\",\"mib\":%zu", names[l],
             bytes >> 20);
    bu_record("checkpoint", params, "load_GBps", warm[l], "memcpy_GBps",
              memcpy_gbps);
  }
  snprintf(params, sizeof params, "\"cache\":\"cold\",\"mib\":%zu",
           bytes >> 20);
  bu_record("checkpoint", params, "sharded_load_GBps", cold[1],
            "mirrored_load_GBps", cold[0]);
  snprintf(params, sizeof params, "\"cache\":\"warm\",\"mib\":%zu",
           bytes >> 20);
  bu_record("checkpoint", params, "sharded_load_GBps", warm[1],
            "mirrored_load_GBps", warm[0]);

  double wall1, fetched1, wall8, fetched8;
  concurrent(c, 1, &wall1, &fetched1);
  concurrent(c, SESSIONS, &wall8, &fetched8);
  snprintf(params, sizeof params,
           "\"sessions\":%d,\"layout\":\"sharded\",\"mib\":%zu", SESSIONS,
           bytes >> 20);
  bu_record("checkpoint", params, "wall_s", wall8, "one_session_wall_s", wall1);
  bu_record("checkpoint", params, "storage_bytes_read", fetched8,
            "one_session_storage_bytes_read", fetched1);
  printf("checkpoint: %zu MiB file, %d devices, median of %d passes\n",
         bytes >> 20, DEVICES, passes);
  printf("  cold  mirrored %.2f GB/s  sharded %.2f GB/s  (pread %.2f GB/s)\n",
         cold[0], cold[1], pread_gbps);
  printf("  warm  mirrored %.2f GB/s  sharded %.2f GB/s  (memcpy %.2f GB/s)\n",
         warm[0], warm[1], memcpy_gbps);
  printf(
      "  %d sessions at once: %.2f s, %.0f bytes read from storage; one "
      "session: %.2f s, %.0f bytes\n",
      SESSIONS, wall8, fetched8, wall1, fetched1);
  free(a);
  free(b);
  pd_session_close(s, NULL, NULL);
  pd_session_delete(s);
  pd_client_delete(c);
  curl_global_cleanup();
  pd_status_delete(st);
  return bu_print_table();
}
