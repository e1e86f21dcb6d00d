/* What one method file offers another: the tape items of an Enqueue stream
 * (tape.c, called by exec.c) and its register_function item (functions.c),
 * as Execute and an execute item share one
 * function in exec.c. */
#ifndef PARADEV_SERVER_SRV_INT_H
#define PARADEV_SERVER_SRV_INT_H

#include "paradev/v1/paradev.pb-c.h"
#include "server.h"

/* Runs a tape item of an Enqueue stream (start_tape, watch_tape, gradient,
 * delete_tape) with the stream's tag; its outcome goes to *st and a
 * gradient's results to *out / *n_out (in `a`). False when `req` holds no
 * tape item. */
bool srv_tape_item(srv_call *c, sched_session *ss, uint64_t tag,
                   const Paradev__V1__EnqueueRequest *req, srv_arena *a,
                   Paradev__V1__TensorInfo ***out, size_t *n_out,
                   dev_status *st);

/* Registers the function of a RegisterFunction request or Enqueue item
 * (functions.c, called by exec.c) in session `ss`; *existed: an identical
 * definition was there. Errors as RegisterFunction's. */
pd_code srv_register_function_item(
    const srv_req_limits *l, sched_session *ss,
    const Paradev__V1__RegisterFunctionRequest *r, bool *existed,
    dev_status *st);

#endif /* PARADEV_SERVER_SRV_INT_H */
