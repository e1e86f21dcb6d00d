/* paradev shared enums: status codes and dtypes.
 *
 * Conventions (shared by libparadev and the daemon's layers):
 *  - Status codes carry the numbers of gRPC's status codes, so a code crosses
 *    the wire unchanged. Codes are only ever added, never renumbered.
 *  - dtypes are named as NumPy names them. Their numbers are part of the wire
 *    format and never change.
 *  - Tensors are dense, row-major and little-endian.
 */
#ifndef PARADEV_TYPES_H
#define PARADEV_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes; the values are gRPC's (grpc/impl/codegen/status.h). */
typedef enum pd_code {
  PD_OK = 0,
  PD_CANCELLED = 1,
  PD_UNKNOWN = 2,
  PD_INVALID_ARGUMENT = 3,
  PD_DEADLINE_EXCEEDED = 4,
  PD_NOT_FOUND = 5,
  PD_ALREADY_EXISTS = 6,
  PD_PERMISSION_DENIED = 7,
  PD_RESOURCE_EXHAUSTED = 8,
  PD_FAILED_PRECONDITION = 9,
  PD_ABORTED = 10,
  PD_OUT_OF_RANGE = 11,
  PD_UNIMPLEMENTED = 12,
  PD_INTERNAL = 13,
  PD_UNAVAILABLE = 14,
  PD_DATA_LOSS = 15,
  PD_UNAUTHENTICATED = 16,
} pd_code;

/* Element types. float16 and bfloat16 are stored as 16-bit patterns and
 * computed in float32, rounding to nearest even on the way back. */
typedef enum pd_dtype {
  PD_DTYPE_INVALID = 0,
  PD_FLOAT32 = 1,
  PD_FLOAT64 = 2,
  PD_FLOAT16 = 3,
  PD_BFLOAT16 = 4,
  PD_INT32 = 5,
  PD_INT64 = 6,
  PD_UINT8 = 7,
  PD_BOOL = 8,
} pd_dtype;

#define PD_DTYPE_COUNT 9 /* one past the largest pd_dtype value */

/* Largest tensor rank accepted anywhere in paradev. */
#define PD_MAX_RANK 8

/* Largest mesh (number of devices) a daemon can present. */
#define PD_MAX_DEVICES 64

/* Returns the canonical name of `code` ("INVALID_ARGUMENT", ...), or
 * "UNKNOWN_CODE" for a value outside the enum. Thread-safe; static storage. */
const char *pd_code_name(pd_code code);

/* Returns the NumPy name of `dtype` ("float32", "bfloat16", ...) or "invalid"
 * for a value outside the enum. Thread-safe; static storage. */
const char *pd_dtype_name(pd_dtype dtype);

/* Parses a NumPy dtype name; returns PD_DTYPE_INVALID when unknown.
 * Thread-safe. */
pd_dtype pd_dtype_from_name(const char *name);

/* Returns the size of one element of `dtype` in bytes (bool is 1 byte), or 0
 * for an invalid dtype. Thread-safe. */
size_t pd_dtype_size(pd_dtype dtype);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_TYPES_H */
