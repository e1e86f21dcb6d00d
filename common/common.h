/* What the engine, the daemon and libparadev share beyond the public enums
 * (include/paradev/types.h): private helpers of common/types.c. Not part of
 * libparadev's API (the pd_* names are; these are not exported). */
#ifndef PARADEV_COMMON_H
#define PARADEV_COMMON_H

#include <stddef.h>

/* Writes the NumPy names of every valid dtype, in enum order, separated by
 * ", " ("float32, float64, ..., bool") into buf (len bytes, truncated and
 * NUL-terminated when short; 128 bytes always suffice), for messages that
 * say which dtypes were expected. Returns buf. Thread-safe. */
const char *pdcom_dtype_list(char *buf, size_t len);

#endif /* PARADEV_COMMON_H */
