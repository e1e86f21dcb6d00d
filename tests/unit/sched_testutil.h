/* Helpers the scheduler's unit tests share (linked into those only: they
 * call the scheduler, which the engine's tests do not link). */
#ifndef PARADEV_SCHED_TESTUTIL_H
#define PARADEV_SCHED_TESTUTIL_H

#include "scheduler.h"

/* Uploads float32 [n] with values 0..n-1 by layout `kind` (axis 0) on
 * `devices` (NULL: the session's default) under handle `id`: begin, one
 * write, commit (abort on a failed write). Returns the first error. */
pd_code tu_sched_upload_on(sched_session *ss, uint64_t id,
                           const dev_devset *devices, dev_layout_kind kind,
                           int n, dev_status *st);

#endif /* PARADEV_SCHED_TESTUTIL_H */
