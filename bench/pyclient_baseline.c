/* pyclient_baseline: the C client's figures that bench/python_bench.py sets
 * the Python package's beside, measured the same way against the same
 * daemon in the same run (libparadev's public API only):
 *
 *   execute_p50_us      a tiny op's Execute round trip (Add of two float32
 *                       [1]), median of `n_rt` calls
 *   pipelined_us_per_op the same op written to one Enqueue stream `n_pipe`
 *                       times (outputs deleted 64 at a time by stream items,
 *                       as the package does), wall time / n_pipe including
 *                       the final wait; and the process's CPU time per op
 *                       (pipelined_cpu_us_per_op: the client's own cost,
 *                       whatever the daemon's speed)
 *   upload_GBps ...     pd_upload / pd_download of `bytes` bytes of float32,
 *                       sharded over the mesh (best of 5), through gRPC and
 *                       through a shared memory region
 *
 * Usage: pyclient_baseline TARGET N_RT N_PIPE BYTES
 * Prints one JSON object on stdout; exit status 1 on a failed call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "paradev/paradev.h"

static pd_status *st;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check(pd_code rc, const char *what) {
  if (rc == PD_OK) return;
  fprintf(stderr, "pyclient_baseline: %s: %s: %s\n", what, pd_code_name(rc),
          pd_status_message(st));
  exit(1);
}

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double execute_p50(pd_session *s, uint64_t one, int n) {
  double *t = malloc(sizeof(double) * (size_t)n);
  uint64_t in[2] = {one, one};
  if (!t) exit(1);
  for (int i = -n / 10; i < n; i++) {
    uint64_t out = 0;
    double t0 = now_s();
    check(pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, st),
          "Execute");
    double dt = now_s() - t0;
    check(pd_delete(s, &out, 1, NULL, st), "Delete");
    if (i >= 0) t[i] = dt;
  }
  qsort(t, (size_t)n, sizeof(double), cmp_double);
  double p50 = t[n / 2];
  free(t);
  return p50;
}

/* Wall seconds per op; *cpu gets this process's CPU seconds per op (the
 * caller's thread and the stream's together). */
static double pipelined(pd_session *s, uint64_t one, int n, double *cpu) {
  pd_stream *t = pd_stream_new(s, NULL, st);
  if (!t) check(pd_status_code(st), "pd_stream_new");
  uint64_t in[2] = {one, one}, dead[64];
  int ndead = 0;
  double t0 = 0, c0 = 0;
  for (int i = -n / 10; i < n; i++) { /* the first tenth warms up */
    if (i == 0) {
      check(pd_stream_wait(t, PD_TIMEOUT_NONE, st), "warm-up");
      t0 = now_s();
      c0 = cpu_s();
    }
    uint64_t out = 0;
    check(pd_stream_execute(t, "Add", in, 2, NULL, &out, 1, NULL, st),
          "pd_stream_execute");
    dead[ndead++] = out;
    if (ndead == 64) {
      check(pd_stream_delete_ids(t, dead, ndead, NULL, st), "delete item");
      ndead = 0;
    }
  }
  check(pd_stream_wait(t, PD_TIMEOUT_NONE, st), "pd_stream_wait");
  double per_op = (now_s() - t0) / n;
  *cpu = (cpu_s() - c0) / n;
  if (ndead) check(pd_stream_delete_ids(t, dead, ndead, NULL, st), "delete");
  check(pd_stream_close(t, PD_TIMEOUT_NONE, st), "pd_stream_close");
  pd_stream_delete(t);
  return per_op;
}

/* Best upload and download seconds of `bytes` bytes, sharded, through gRPC
 * (region NULL) or the region. */
static void transfer(pd_session *s, size_t bytes, pd_shared_memory *region,
                     double *up, double *down) {
  size_t n = bytes / sizeof(float);
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
  if (!x || !y) exit(1);
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 1000);
  int64_t dims[1] = {(int64_t)n};
  *up = *down = 1e30;
  for (int r = 0; r < 5; r++) {
    uint64_t id = pd_session_new_id(s);
    double t0 = now_s();
    if (region) {
      memcpy(pd_shared_memory_data(region), x, n * sizeof(float));
      check(pd_upload_from_shared_memory(s, id, PD_FLOAT32, dims, 1, region, 0,
                                         pd_layout_sharded(0), NULL, NULL, st),
            "UploadFromSharedMemory");
    } else {
      check(pd_upload(s, id, PD_FLOAT32, dims, 1, x, n * sizeof(float),
                      pd_layout_sharded(0), NULL, NULL, st),
            "Upload");
    }
    double t1 = now_s();
    check(pd_sync(s, &id, 1, NULL, NULL, st), "Sync");
    double t2 = now_s();
    if (region) {
      check(pd_download_to_shared_memory(s, id, pd_layout_sharded(0), region, 0,
                                         NULL, NULL, NULL, st),
            "DownloadToSharedMemory");
      memcpy(y, pd_shared_memory_data(region), n * sizeof(float));
    } else {
      check(pd_download(s, id, pd_layout_sharded(0), y, n * sizeof(float), NULL,
                        NULL, NULL, st),
            "Download");
    }
    double t3 = now_s();
    check(pd_delete(s, &id, 1, NULL, st), "Delete");
    if (t1 - t0 < *up) *up = t1 - t0;
    if (t3 - t2 < *down) *down = t3 - t2;
  }
  free(x);
  free(y);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: pyclient_baseline TARGET N_RT N_PIPE BYTES\n");
    return 2;
  }
  int n_rt = atoi(argv[2]), n_pipe = atoi(argv[3]);
  size_t bytes = (size_t)strtoull(argv[4], NULL, 10);
  if (n_rt < 1 || n_pipe < 1 || bytes < 4) {
    fprintf(stderr, "pyclient_baseline: counts and bytes must be positive\n");
    return 2;
  }
  st = pd_status_new();
  pd_client *c = pd_client_new(argv[1], NULL, st);
  if (!c) check(pd_status_code(st), "pd_client_new");
  pd_session *s = pd_session_new(c, NULL, NULL, st);
  if (!s) check(pd_status_code(st), "pd_session_new");
  const float onev[1] = {1};
  const int64_t d1[1] = {1};
  uint64_t one = pd_session_new_id(s);
  check(pd_upload(s, one, PD_FLOAT32, d1, 1, onev, sizeof(onev),
                  pd_layout_mirrored(), NULL, NULL, st),
        "Upload");
  double rt = execute_p50(s, one, n_rt);
  double pipe_cpu = 0;
  double pipe = pipelined(s, one, n_pipe, &pipe_cpu);
  double up, down, sup = 0, sdown = 0;
  transfer(s, bytes, NULL, &up, &down);
  pd_shared_memory *r = NULL;
  bool have_shm = pd_shared_memory_create(s, bytes, 0, &r, NULL, st) == PD_OK;
  if (have_shm) {
    transfer(s, bytes, r, &sup, &sdown);
    pd_shared_memory_destroy(r, NULL, st);
  }
  printf(
      "{\"execute_p50_us\": %.3f, \"pipelined_us_per_op\": %.3f, "
      "\"pipelined_cpu_us_per_op\": %.3f, \"upload_GBps\": %.4f, "
      "\"download_GBps\": %.4f",
      rt * 1e6, pipe * 1e6, pipe_cpu * 1e6, bytes / up / 1e9,
      bytes / down / 1e9);
  if (have_shm)
    printf(", \"shm_upload_GBps\": %.4f, \"shm_download_GBps\": %.4f",
           bytes / sup / 1e9, bytes / sdown / 1e9);
  printf("}\n");
  pd_session_close(s, NULL, NULL);
  pd_session_delete(s);
  pd_client_delete(c);
  pd_status_delete(st);
  return 0;
}
