/* What the engine, the daemon and libparadev share beyond the public enums
 * (include/paradev/types.h): private helpers of common/types.c. Not part of
 * libparadev's API (the pd_* names are; these are not exported). */
#ifndef PARADEV_COMMON_H
#define PARADEV_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Writes the NumPy names of every valid dtype, in enum order, separated by
 * ", " ("float32, float64, ..., bool") into buf (len bytes, truncated and
 * NUL-terminated when short; 128 bytes always suffice), for messages that
 * say which dtypes were expected. Returns buf. Thread-safe. */
const char *pdcom_dtype_list(char *buf, size_t len);

/* Parses a byte count or count: decimal digits with an optional binary
 * suffix K, M, G or T (powers of 1024; also written KiB / KB, any case of the
 * letter), e.g. "4096", "64M", "1GiB". No sign, space or other suffix. On
 * success writes *out and returns true; false for anything else, including a
 * value past 2^64 - 1 (out is then not written). Thread-safe. */
bool pdcom_parse_size(const char *s, uint64_t *out);

/* The length (1 to 4) of the well-formed UTF-8 character at s, or 0 where
 * s does not start one (RFC 3629: no overlong forms, no surrogates, nothing
 * past U+10FFFF). Reads at most up to the first byte that breaks the
 * sequence, so a NUL-terminated s is never read past its end. Thread-safe. */
size_t pdcom_utf8_len(const unsigned char *s);

#endif /* PARADEV_COMMON_H */
