/* Status messages of the engine (code names: common/types.c). */
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
