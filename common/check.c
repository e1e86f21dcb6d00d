/* The trail hook of common/check.h. */
#include "check.h"

#include <stdatomic.h>

static _Atomic(pdcom_trail_fn) pdcom_trail_hook;

void pdcom_set_trail(pdcom_trail_fn fn) { atomic_store(&pdcom_trail_hook, fn); }

void pdcom_trail(const char *file, int line, const char *func, pd_code code) {
  pdcom_trail_fn fn =
      atomic_load_explicit(&pdcom_trail_hook, memory_order_relaxed);
  if (fn) fn(file, line, func, code);
}
