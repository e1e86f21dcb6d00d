/* Helpers shared by the engine's tests (tests/unit, tests/gpu,
 * tests/examples; cmocka): engines and uploads, the tolerance tables by
 * dtype, element counts, and assertions that print the values they compared
 * (both sides, and the first mismatch). */
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

/* --- tolerances: one table per kind of reference, by dtype -----------------
 * Each is a relative tolerance for a result of dtype `dt` compared with a
 * float64 reference; integer and bool results compare exactly (0) unless
 * the entry says otherwise. The values are the ones the tests used before
 * they shared them: changing one loosens or tightens every test that uses
 * it.
 *
 * tu_rtol_rounded: the reference is exact and the result rounded once to dt
 *   (float16 2^-10, bfloat16 2^-7, float32 1e-6, float64 1e-13). */
double tu_rtol_rounded(pd_dtype dt);
/* tu_rtol_f64_op: one elementwise op, computed in float64 and rounded to dt:
 * a few units in the last place (float16 1.5e-3 for 2^-11 per rounding,
 * bfloat16 1.2e-2 for 2^-8, float32 1e-6, float64 1e-14); tu_atol_f64_op is
 * the absolute slack for results among float16's subnormals (2^-24). */
double tu_rtol_f64_op(pd_dtype dt);
double tu_atol_f64_op(pd_dtype dt);
/* tu_rtol_f32_op: an op computed in float32 and rounded to dt (the gradient
 * kernels): float16 2e-3, bfloat16 1.6e-2, float32 2e-6, others 1e-14. */
double tu_rtol_f32_op(pd_dtype dt);
/* tu_rtol_backends: one backend against another (tests/gpu: CUDA against
 * the CPU), relative to max(|want|, rms of want): float16 2e-3, bfloat16
 * 1e-2, float32 1e-5, float64 1e-12. */
double tu_rtol_backends(pd_dtype dt);

/* Elements of a shape: the product of dims[rank] (1 for rank 0). */
int64_t tu_count(int rank, const int64_t *dims);
int64_t tu_numel(const dev_shape *s);

/* Asserts |got-want| <= atol + rtol*|want| elementwise (NaN equals NaN),
 * printing the first mismatch with both values. */
#define tu_assert_close(got, want, n, rtol, atol)                              \
  tu_assert_close_impl((got), (want), (n), (rtol), (atol), __FILE__, __LINE__)
void tu_assert_close_impl(const double *got, const double *want, int64_t n,
                          double rtol, double atol, const char *file, int line);

/* Waits for `t`, downloads component `c` and asserts that it has exactly n
 * elements (printing both counts) that tu_assert_close accepts. */
#define tu_assert_tensor_close(t, c, want, n, rtol, atol)                      \
  tu_assert_tensor_close_impl((t), (c), (want), (n), (rtol), (atol), __FILE__, \
                              __LINE__)
void tu_assert_tensor_close_impl(dev_tensor *t, int c, const double *want,
                                 int64_t n, double rtol, double atol,
                                 const char *file, int line);
/* The same for every component of `t` (a mirrored value). */
#define tu_assert_components_close(t, want, n, rtol, atol)                     \
  do {                                                                         \
    for (int tu_c_ = 0; tu_c_ < dev_tensor_num_components(t); tu_c_++)         \
      tu_assert_tensor_close_impl((t), tu_c_, (want), (n), (rtol), (atol),     \
                                  __FILE__, __LINE__);                         \
  } while (0)

/* Asserts that shape `s` equals dims[rank]; a failure prints both shapes. */
#define tu_assert_shape(s, rank, ...)                                          \
  tu_assert_shape_impl((s), (rank), (const int64_t[]){__VA_ARGS__}, __FILE__,  \
                       __LINE__)
void tu_assert_shape_impl(const dev_shape *s, int rank, const int64_t *dims,
                          const char *file, int line);

/* Deterministic pseudo-random doubles in [lo, hi) (xorshift, seeded). */
void tu_fill_random(double *out, int64_t n, double lo, double hi,
                    uint64_t seed);

#endif
