/* Where storage's refusals and retries go: one hook the daemon sets at
 * start (stg_set_log); library code never prints (systemd's rule). */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "storage_int.h"

static _Atomic(stg_log_fn) stg_log_hook;

void stg_set_log(stg_log_fn fn) { atomic_store(&stg_log_hook, fn); }

static void stg_vlog(int level, const char *fmt, va_list ap) {
  stg_log_fn fn = atomic_load(&stg_log_hook);
  if (!fn) return;
  char line[DEV_STATUS_MSG_MAX + 64];
  vsnprintf(line, sizeof line, fmt, ap);
  /* The daemon's log names the subsystem itself ("storage: ..."): a line
   * that says it again (fetch_http.c's) loses the second one. */
  const char *p = strncmp(line, "storage: ", 9) == 0 ? line + 9 : line;
  fn(level, p);
}

void stg__log(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  stg_vlog(level, fmt, ap);
  va_end(ap);
}

pd_code stg__refuse(dev_status *st, pd_code code, int level, const char *fmt,
                    ...) {
  char msg[DEV_STATUS_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  stg__log(level, "%s", msg);
  return dev_error(st, code, "%s", msg);
}
