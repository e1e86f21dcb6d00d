/* The optical-digits data set (examples/data/digits.csv.gz): loading, a
 * fixed-seed train/test split and scaling to [0, 1]. Shared by the digits
 * trainer and its tests; no paradev dependency. */
#ifndef PARADEV_EXAMPLES_DIGITS_DATA_H
#define PARADEV_EXAMPLES_DIGITS_DATA_H

#include <stddef.h>
#include <stdint.h>

#define DIGITS_FEATURES 64
#define DIGITS_CLASSES 10

typedef struct digits_set {
  int n;      /* rows */
  float *x;   /* [n, 64], scaled to [0, 1] (pixel counts / 16) */
  int32_t *y; /* [n], labels 0..9 */
} digits_set;

/* Reads a gzip'd (or plain) CSV of rows of 64 integers in 0..16 and a label
 * 0..9. On error returns -1 and writes a message naming the file, the line
 * and what was expected into err; out is untouched. */
int digits_load(const char *path, digits_set *out, char *err, size_t errlen);

/* Splits `all` into train and test with a fixed-seed shuffle (xorshift64,
 * `seed`): the first round(test_fraction * n) shuffled rows go to test.
 * Returns -1 when out of memory. */
int digits_split(const digits_set *all, double test_fraction, uint64_t seed,
                 digits_set *train, digits_set *test);

void digits_free(digits_set *s);

#endif
