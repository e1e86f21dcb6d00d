/* Helpers the scheduler's unit tests share (sched_testutil.h). */
#include "sched_testutil.h"

#include <stdlib.h>

pd_code tu_sched_upload_on(sched_session *ss, uint64_t id,
                           const dev_devset *devices, dev_layout_kind kind,
                           int n, dev_status *st) {
  dev_shape shape = {1, {n}};
  dev_layout lay = {kind, 0, 0};
  float *v = calloc((size_t)n, sizeof *v);
  if (!v) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  for (int i = 0; i < n; i++) v[i] = (float)i;
  sched_upload *u = NULL;
  pd_code c = sched_upload_begin_on(ss, id, devices, PD_FLOAT32, &lay, &shape,
                                    NULL, &u, st);
  if (c == PD_OK) c = sched_upload_write(u, 0, 0, v, (size_t)n * 4, st);
  if (c == PD_OK)
    c = sched_upload_commit(u, st);
  else
    sched_upload_abort(u);
  free(v);
  return c;
}
