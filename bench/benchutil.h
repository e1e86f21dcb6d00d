/* Helpers shared by the benchmarks (bench/bench_*.c): a monotonic clock,
 * repeat-until-min-time measurement, a memcpy baseline, and the result writer.
 *
 * Every measurement is appended as one JSON object per line to
 * bench-results.jsonl (the project's benchmark format; README, "Benchmarks"):
 *   {"bench": "allreduce", "params": {...}, "metric": "busbw_GBps",
 *    "value": 3.1, "baseline": "memcpy_GBps", "baseline_value": 8.2,
 *    "ratio": 0.38}
 * and a short human table of all measurements is printed at the end. Ratios
 * against a baseline measured in the same run are what we track; absolute
 * numbers on shared machines are noise.
 *
 * Where the file goes: $PARADEV_BENCH_RESULTS if set, else
 * bench-results.jsonl beside the running executable (the build directory).
 * Not thread-safe: call from the benchmark's main thread. */
#ifndef PARADEV_BENCHUTIL_H
#define PARADEV_BENCHUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "paradev/types.h"

/* Seconds on CLOCK_MONOTONIC. */
double bu_now(void);

/* Result of bu_measure: per-call times in seconds. */
typedef struct bu_timing {
  double median_s;
  double min_s;
  int reps;
} bu_timing;

typedef void (*bu_fn)(void *arg);

/* Calls fn(arg) once untimed (warm-up), then repeatedly until at least
 * `min_time_s` seconds have passed and at least `min_reps` calls were timed
 * (at most 1000 calls). Returns the median and minimum per-call time. */
bu_timing bu_measure(bu_fn fn, void *arg, double min_time_s, int min_reps);

/* A call that times itself (e.g. with CUDA events around the part that
 * counts) and returns its seconds. */
typedef double (*bu_timed_fn)(void *arg);

/* Calls fn `warmup` times untimed, then at least `min_reps` times and until
 * `min_time_s` has passed (at most 1000 calls); returns the median and
 * minimum of the seconds fn reported. */
bu_timing bu_measure_reported(bu_timed_fn fn, void *arg, int warmup,
                              int min_reps, double min_time_s);

/* Single-thread memcpy bandwidth in GB/s (1e9 bytes/s) for copies of `bytes`
 * between two buffers touched beforehand, median of repeats over at least
 * `min_time_s`. Returns 0 if the buffers cannot be allocated. */
double bu_memcpy_gbps(size_t bytes, double min_time_s);

/* The buffers of that measurement, for a caller that times the memcpy
 * itself (interleaved with its subject, bench_engine's allreduce): init
 * allocates and touches both (false when out of memory), bu_memcpy_run is
 * one copy (a bu_fn), free releases them. */
typedef struct bu_memcpy_buf {
  unsigned char *src, *dst;
  size_t bytes;
} bu_memcpy_buf;
bool bu_memcpy_buf_init(bu_memcpy_buf *m, size_t bytes);
void bu_memcpy_run(void *m);
void bu_memcpy_buf_free(bu_memcpy_buf *m);

/* True when quick mode was asked for: PARADEV_BENCH_QUICK set to a non-empty
 * value other than "0", or "--quick" among argv. */
bool bu_quick(int argc, char **argv);

/* Records one measurement: appends its JSON line to bench-results.jsonl and
 * keeps it for bu_print_table. `params_json` is the inside of the params
 * object, e.g. "\"devices\": 4, \"bytes\": 1048576" (may be empty).
 * `baseline` may be NULL (no baseline): then baseline_value and ratio are
 * written as null. ratio = value / baseline_value. */
void bu_record(const char *bench, const char *params_json, const char *metric,
               double value, const char *baseline, double baseline_value);

/* Prints the table of everything recorded so far and where the JSON lines
 * went; returns 0, or 1 if the results file could not be written. */
int bu_print_table(void);

/* "4 KiB", "16 MiB": writes a short size into buf; returns buf. */
char *bu_size_str(size_t bytes, char *buf, size_t len);

/* malloc that exits the benchmark with a message when memory runs out. */
void *bu_xmalloc(size_t bytes);

/* float32 -> bfloat16, rounding to nearest even (finite inputs). */
uint16_t bu_bf16_from_f32(float f);

/* Element i of a float32 or bfloat16 (dt) array, as a double / stored from
 * a double (bfloat16 rounded to nearest even). */
double bu_value_load(pd_dtype dt, const void *p, size_t i);
void bu_value_store(pd_dtype dt, void *p, size_t i, double v);

/* sqrt(sum (x - ref)^2) / sqrt(sum ref^2) over n elements of x (float32 or
 * bfloat16) against a float64 reference; NaN when x holds a NaN. */
double bu_rel_err(pd_dtype dt, const void *x, const double *ref, size_t n);

#endif /* PARADEV_BENCHUTIL_H */
