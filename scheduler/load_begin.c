/* The entry points of a load's begin (scheduler.h, "Checkpoints"):
 * sched_load_begin runs it on the caller's thread; sched_load_begin_async
 * queues it on an open worker (workers.c), so a source that stalls holds
 * neither an RPC thread nor a load worker, and calls back there. Both use
 * sched_load_new / sched_load_run (loads.c); the pending handle is the
 * load's record (a sched_io reference). */
#include <stdlib.h>

#include "sched_int.h"

pd_code sched_load_begin(sched_session *ss, const sched_load_request *req,
                         sched_load_result **out, dev_status *st) {
  sched_io *io = NULL;
  PD_TRY(sched_load_new(ss, req, 0, &io, st));
  pd_code c = sched_load_run(io, out, st);
  sched_io_unref(io); /* ours */
  return c;
}

/* The open of one async load: its own allocation, freed by its run. */
typedef struct load_open_job {
  sched_work work; /* first */
  sched_io *io;    /* a reference */
  sched_load_done_fn done;
  void *arg;
} load_open_job;

static void load_open_run(sched_work *w) {
  load_open_job *j = (load_open_job *)w;
  sched_session *ss = w->ss;
  dev_status st = DEV_STATUS_INIT;
  sched_load_result *r = NULL;
  pd_code c = sched_load_run(j->io, &r, &st);
  j->done(j->arg, c, &st, c == PD_OK ? r : NULL);
  sched_io_unref(j->io);
  sched_session_put(ss);
  free(j);
}

pd_code sched_load_begin_async(sched_session *ss, const sched_load_request *req,
                               double deadline_s, sched_load_done_fn done,
                               void *arg, sched_load_pending **out,
                               dev_status *st) {
  if (!done || !out)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_load_begin_async: done and out are required");
  load_open_job *j = calloc(1, sizeof(*j));
  if (!j) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  sched_io *io = NULL;
  pd_code c = sched_load_new(ss, req, deadline_s, &io, st);
  if (c != PD_OK) {
    free(j);
    return c;
  }
  j->work.run = load_open_run;
  j->work.ss = ss;
  j->io = io; /* the caller's reference becomes the job's */
  j->done = done;
  j->arg = arg;
  sched_io_ref(io); /* the caller's */
  sched_session_ref(ss);
  *out = (sched_load_pending *)(void *)io;
  sched_open_queue(ss->owner, &j->work);
  return PD_OK;
}

void sched_load_pending_cancel(sched_load_pending *p) {
  if (p) sched_load_abandon((sched_io *)(void *)p);
}

void sched_load_pending_put(sched_load_pending *p) {
  sched_io_unref((sched_io *)(void *)p);
}

void sched_load_result_free(sched_load_result *r) {
  if (!r) return;
  free(r->tensors);
  free(r);
}
