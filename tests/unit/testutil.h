/* Helpers shared by the unit tests (cmocka). Each assertion prints the values
 * it compared. */
#ifndef PARADEV_TESTUTIL_H
#define PARADEV_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "device.h"

/* A CPU engine of n simulated devices (memory_limit 0: none). */
dev_engine *tu_engine(int n, uint64_t memory_limit);

/* Uploads a mirrored tensor of `dtype` whose elements are `vals` (converted
 * from double as a C cast would, half/bfloat16 rounded to nearest even). */
dev_tensor *tu_mirrored(dev_engine *e, pd_dtype dtype, int rank,
                        const int64_t *dims, const double *vals);
/* Uploads a sharded tensor (split along `axis`). */
dev_tensor *tu_sharded(dev_engine *e, pd_dtype dtype, int rank,
                       const int64_t *dims, int axis, const double *vals);

/* Waits for `t`, asserts it succeeded, downloads component `c` as doubles
 * into out (capacity n elements); returns the element count. */
int64_t tu_read(dev_tensor *t, int c, double *out, int64_t n);

/* Runs op and asserts success; returns output `which` (a new reference) and
 * releases the other outputs. */
dev_tensor *tu_exec(dev_engine *e, const char *op, dev_tensor *const *in,
                    int n_in, const dev_attr *attrs, int n_attrs, int which);

/* Runs op expecting it to fail at validation with `code`; asserts that the
 * message contains `needle` (when not NULL). */
void tu_exec_fails(dev_engine *e, const char *op, dev_tensor *const *in,
                   int n_in, const dev_attr *attrs, int n_attrs, pd_code code,
                   const char *needle);

/* Asserts |got-want| <= atol + rtol*|want| elementwise (NaN equals NaN),
 * printing the first mismatch with both values. */
#define tu_assert_close(got, want, n, rtol, atol) \
  tu_assert_close_impl((got), (want), (n), (rtol), (atol), __FILE__, __LINE__)
void tu_assert_close_impl(const double *got, const double *want, int64_t n,
                          double rtol, double atol, const char *file, int line);

/* Asserts that shape `s` equals dims[rank]. */
#define tu_assert_shape(s, rank, ...) \
  tu_assert_shape_impl((s), (rank), (const int64_t[]){__VA_ARGS__}, __FILE__, __LINE__)
void tu_assert_shape_impl(const dev_shape *s, int rank, const int64_t *dims,
                          const char *file, int line);

/* Deterministic pseudo-random doubles in [lo, hi) (xorshift, seeded). */
void tu_fill_random(double *out, int64_t n, double lo, double hi,
                    uint64_t seed);

#endif
