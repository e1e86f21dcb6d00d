/* The shared enums' functions (paradev/types.h), in one object of their own
 * (the paradev_common object library) that both the engine (device/) and
 * libparadev (client/) take in, so the two layers share this code and
 * nothing else, and a program linking both still has one definition. */
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "paradev/types.h"

static const char *const pdc_dtype_names[PD_DTYPE_COUNT] = {
    "invalid", "float32", "float64", "float16", "bfloat16",
    "int32",   "int64",   "uint8",   "bool",
};

const char *pd_code_name(pd_code code) {
  static const char *const names[] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED",
  };
  if ((unsigned)code < sizeof names / sizeof names[0]) return names[code];
  return "UNKNOWN_CODE";
}

const char *pd_dtype_name(pd_dtype dt) {
  if ((unsigned)dt < PD_DTYPE_COUNT) return pdc_dtype_names[dt];
  return "invalid";
}

pd_dtype pd_dtype_from_name(const char *name) {
  if (!name) return PD_DTYPE_INVALID;
  for (int i = 1; i < PD_DTYPE_COUNT; i++)
    if (strcmp(name, pdc_dtype_names[i]) == 0) return (pd_dtype)i;
  return PD_DTYPE_INVALID;
}

size_t pd_dtype_size(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT32:
    case PD_INT32: return 4;
    case PD_FLOAT64:
    case PD_INT64: return 8;
    case PD_FLOAT16:
    case PD_BFLOAT16: return 2;
    case PD_UINT8:
    case PD_BOOL: return 1;
    default: return 0;
  }
}

const char *pdcom_dtype_list(char *buf, size_t len) {
  size_t used = 0;
  if (len) buf[0] = '\0';
  for (int d = 1; d < PD_DTYPE_COUNT && used < len; d++)
    used += (size_t)snprintf(buf + used, len - used, "%s%s", d > 1 ? ", " : "",
                             pdc_dtype_names[d]);
  return buf;
}
