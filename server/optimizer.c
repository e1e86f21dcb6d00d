/* Optimizer plugins: placeholder until the loader lands (issue #11). It
 * loads nothing: a configured plugin is refused, naming it. */
#include "optimizer.h"

static const dev_fn_external_pass *const none[1] = {NULL};

pd_code srv_optimizer_load(const char *const *paths, int n,
                           const dev_tristate *daemon_passes,
                           const dev_fn_external_pass *const **passes,
                           int *n_passes, dev_tristate *merged,
                           dev_status *st) {
  if (n > 0)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "optimizer plugin %s: plugins are not supported yet",
                     paths[0]);
  for (int i = 0; i < DEV_PASS_COUNT; i++) merged[i] = daemon_passes[i];
  *passes = none;
  *n_passes = 0;
  return PD_OK;
}

void srv_optimizer_unload(void) {}
