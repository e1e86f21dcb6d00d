/* Benchmark helpers; see benchutil.h. */
#include "benchutil.h"

#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BU_MAX_REPS 1000
#define BU_MAX_RECORDS 256

typedef struct bu_record_entry {
  char bench[48];
  char params[256];
  char metric[48];
  double value;
  char baseline[48];
  double baseline_value;
  bool has_baseline;
} bu_record_entry;

static bu_record_entry records[BU_MAX_RECORDS];
static int num_records;
static bool write_failed;
static char results_path[PATH_MAX];

double bu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static bu_timing bu_summarize(double *times, int n) {
  qsort(times, (size_t)n, sizeof times[0], cmp_double);
  bu_timing t;
  t.reps = n;
  t.min_s = times[0];
  t.median_s = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  return t;
}

bu_timing bu_measure(bu_fn fn, void *arg, double min_time_s, int min_reps) {
  static double times[BU_MAX_REPS];
  if (min_reps < 1) min_reps = 1;
  if (min_reps > BU_MAX_REPS) min_reps = BU_MAX_REPS;
  fn(arg); /* warm-up: page faults, lazy allocation, thread start */
  int n = 0;
  double start = bu_now();
  while (n < BU_MAX_REPS && (n < min_reps || bu_now() - start < min_time_s)) {
    double t0 = bu_now();
    fn(arg);
    times[n++] = bu_now() - t0;
  }
  return bu_summarize(times, n);
}

bu_timing bu_measure_reported(bu_timed_fn fn, void *arg, int warmup,
                              int min_reps, double min_time_s) {
  static double times[BU_MAX_REPS];
  if (min_reps < 1) min_reps = 1;
  if (min_reps > BU_MAX_REPS) min_reps = BU_MAX_REPS;
  for (int i = 0; i < warmup; i++) fn(arg);
  int n = 0;
  double start = bu_now();
  while (n < BU_MAX_REPS && (n < min_reps || bu_now() - start < min_time_s))
    times[n++] = fn(arg);
  return bu_summarize(times, n);
}

bool bu_memcpy_buf_init(bu_memcpy_buf *m, size_t bytes) {
  m->bytes = bytes;
  m->src = malloc(bytes);
  m->dst = malloc(bytes);
  if (!m->src || !m->dst) {
    bu_memcpy_buf_free(m);
    return false;
  }
  /* Touch every page of both buffers first, so page faults are not timed. */
  for (size_t i = 0; i < bytes; i++) m->src[i] = (unsigned char)(i * 131u);
  memset(m->dst, 1, bytes);
  return true;
}

void bu_memcpy_buf_free(bu_memcpy_buf *m) {
  free(m->src);
  free(m->dst);
  m->src = m->dst = NULL;
}

void bu_memcpy_run(void *p) {
  bu_memcpy_buf *m = p;
  memcpy(m->dst, m->src, m->bytes);
  /* Keep the copy observable so it cannot be optimized away. */
  __asm__ __volatile__("" : : "r"(m->dst) : "memory");
}

double bu_memcpy_gbps(size_t bytes, double min_time_s) {
  bu_memcpy_buf m;
  if (bytes == 0 || !bu_memcpy_buf_init(&m, bytes)) return 0;
  bu_timing t = bu_measure(bu_memcpy_run, &m, min_time_s, 3);
  bu_memcpy_buf_free(&m);
  return (double)bytes / t.median_s / 1e9;
}

bool bu_quick(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--quick")) return true;
  const char *q = getenv("PARADEV_BENCH_QUICK");
  return q && *q && strcmp(q, "0") != 0;
}

char *bu_size_str(size_t bytes, char *buf, size_t len) {
  if (bytes >= (1u << 30) && bytes % (1u << 30) == 0)
    snprintf(buf, len, "%zu GiB", bytes >> 30);
  else if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    snprintf(buf, len, "%zu MiB", bytes >> 20);
  else if (bytes >= (1u << 10) && bytes % (1u << 10) == 0)
    snprintf(buf, len, "%zu KiB", bytes >> 10);
  else
    snprintf(buf, len, "%zu B", bytes);
  return buf;
}

static const char *path_of_results(void) {
  if (results_path[0]) return results_path;
  const char *env = getenv("PARADEV_BENCH_RESULTS");
  if (env && *env) {
    snprintf(results_path, sizeof results_path, "%s", env);
    return results_path;
  }
  char exe[PATH_MAX - 32]; /* leaves room for the file name */
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = '\0';
      snprintf(results_path, sizeof results_path, "%s/bench-results.jsonl",
               exe);
      return results_path;
    }
  }
  snprintf(results_path, sizeof results_path, "bench-results.jsonl");
  return results_path;
}

/* A JSON number as "%.6g" writes it (json-c keeps that spelling), or null
 * for NaN/inf, which JSON cannot represent. */
static json_object *json_number(double v) {
  if (!isfinite(v)) return NULL;
  char buf[32];
  snprintf(buf, sizeof buf, "%.6g", v);
  return json_object_new_double_s(v, buf);
}

/* The params object from its inside ("\"devices\": 4, ..."); a fragment
 * that is not JSON (a bug in the benchmark) is kept as a string under
 * "unparsed", with a warning, rather than written as broken JSON. */
static json_object *json_params(const char *bench, const char *inside) {
  size_t n = strlen(inside);
  char *text = malloc(n + 3);
  json_object *o = NULL;
  if (text) {
    snprintf(text, n + 3, "{%s}", inside);
    o = json_tokener_parse(text);
    free(text);
  }
  if (o && json_object_is_type(o, json_type_object)) return o;
  json_object_put(o);
  fprintf(stderr, "bench: %s: params {%s} are not a JSON object's inside\n",
          bench, inside);
  o = json_object_new_object();
  json_object_object_add(o, "unparsed", json_object_new_string(inside));
  return o;
}

void bu_record(const char *bench, const char *params_json, const char *metric,
               double value, const char *baseline, double baseline_value) {
  if (num_records < BU_MAX_RECORDS) {
    bu_record_entry *r = &records[num_records++];
    snprintf(r->bench, sizeof r->bench, "%s", bench);
    snprintf(r->params, sizeof r->params, "%s", params_json ? params_json : "");
    snprintf(r->metric, sizeof r->metric, "%s", metric);
    r->value = value;
    r->has_baseline = baseline != NULL;
    snprintf(r->baseline, sizeof r->baseline, "%s", baseline ? baseline : "");
    r->baseline_value = baseline_value;
  }
  const char *path = path_of_results();
  FILE *f = fopen(path, "a");
  if (!f) {
    if (!write_failed)
      fprintf(stderr, "bench: cannot append to %s: %s\n", path,
              strerror(errno));
    write_failed = true;
    return;
  }
  /* One row, its keys in the order DESIGN.md gives them. */
  json_object *row = json_object_new_object();
  json_object_object_add(row, "bench", json_object_new_string(bench));
  json_object_object_add(row, "params",
                         json_params(bench, params_json ? params_json : ""));
  json_object_object_add(row, "metric", json_object_new_string(metric));
  json_object_object_add(row, "value", json_number(value));
  json_object_object_add(row, "baseline",
                         baseline ? json_object_new_string(baseline) : NULL);
  json_object_object_add(row, "baseline_value",
                         baseline ? json_number(baseline_value) : NULL);
  json_object_object_add(
      row, "ratio",
      baseline ? json_number(baseline_value != 0 ? value / baseline_value : NAN)
               : NULL);
  fprintf(f, "%s\n",
          json_object_to_json_string_ext(
              row, JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE));
  json_object_put(row);
  if (fclose(f) != 0) write_failed = true;
}

/* params without quotes, for reading. */
static void plain_params(const char *in, char *out, size_t len) {
  size_t k = 0;
  for (const char *s = in; *s && k + 1 < len; s++)
    if (*s != '"') out[k++] = *s;
  out[k] = '\0';
}

int bu_print_table(void) {
  int pw = 6; /* width of the params column */
  for (int i = 0; i < num_records; i++) {
    char p[sizeof records[i].params];
    plain_params(records[i].params, p, sizeof p);
    if ((int)strlen(p) > pw) pw = (int)strlen(p);
  }
  printf("\n%-10s %-*s %-12s %10s %-20s %10s %8s\n", "bench", pw, "params",
         "metric", "value", "baseline", "base", "ratio");
  for (int i = 0; i < num_records; i++) {
    const bu_record_entry *r = &records[i];
    char p[sizeof r->params];
    plain_params(r->params, p, sizeof p);
    printf("%-10s %-*s %-12s %10.3f", r->bench, pw, p, r->metric, r->value);
    if (r->has_baseline)
      printf(" %-20s %10.3f %8.4f\n", r->baseline, r->baseline_value,
             r->baseline_value != 0 ? r->value / r->baseline_value : NAN);
    else
      printf(" %-20s %10s %8s\n", "-", "-", "-");
  }
  printf("\n%d measurement(s) appended to %s\n", num_records,
         path_of_results());
  return write_failed ? 1 : 0;
}

void *bu_xmalloc(size_t bytes) {
  void *p = malloc(bytes);
  if (!p) {
    fprintf(stderr, "bench: out of host memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

uint16_t bu_bf16_from_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

double bu_value_load(pd_dtype dt, const void *p, size_t i) {
  if (dt == PD_BFLOAT16) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  return ((const float *)p)[i];
}

void bu_value_store(pd_dtype dt, void *p, size_t i, double v) {
  if (dt == PD_BFLOAT16)
    ((uint16_t *)p)[i] = bu_bf16_from_f32((float)v);
  else
    ((float *)p)[i] = (float)v;
}

double bu_rel_err(pd_dtype dt, const void *x, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = bu_value_load(dt, x, i) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return sqrt(num) / sqrt(den > 0 ? den : 1);
}
