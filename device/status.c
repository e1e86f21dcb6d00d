/* Status codes, dtype names and status messages. */
#include <stdio.h>
#include <string.h>

#include "device.h"

pd_code dev_error(dev_status *st, pd_code code, const char *fmt, ...) {
  if (st) {
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

void dev_status_clear(dev_status *st) {
  if (!st) return;
  st->code = PD_OK;
  st->msg[0] = '\0';
}

const char *pd_code_name(pd_code code) {
  static const char *const names[] = {
      "OK",                "CANCELLED",          "UNKNOWN",
      "INVALID_ARGUMENT",  "DEADLINE_EXCEEDED",  "NOT_FOUND",
      "ALREADY_EXISTS",    "PERMISSION_DENIED",  "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "ABORTED",          "OUT_OF_RANGE",
      "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS",         "UNAUTHENTICATED",
  };
  if ((unsigned)code < sizeof names / sizeof names[0]) return names[code];
  return "UNKNOWN_CODE";
}
