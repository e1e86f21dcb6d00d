/* Completion on a backend with fences (CUDA), whose run_kernel and
 * collective_run return once the work is queued on the device rather than
 * done. The executor records a fence behind each op it issued and queues it
 * here; the device's completion thread waits for the fences in order and
 * only then publishes the op (ready.c), as TensorFlow's GPU EventMgr does.
 * The executor goes on issuing meanwhile, so the device's queue never
 * drains between ops; stream order protects dependencies on one device.
 *
 * An op's error that the device reports late (an illegal address inside a
 * kernel) lands on that op's outputs on that device, and on the outputs of
 * later ops of that device that consumed them and were already issued (the
 * executor records which in-flight ops each op read from; the completion
 * thread keeps the late failures until no op issued before them is in
 * flight). An op's inputs are released once every device has issued it, so
 * buffers are freed stream-ordered as early as on the CPU, not when the
 * device catches up; its outputs are held until every device has finished
 * it. Source: tensorflow/core/common_runtime/device/device_event_mgr.h. */
#include <stdlib.h>
#include <string.h>

#include "exec_int.h"
#include "mesh/mesh_int.h"

/* Drops one of a fenced op's `inflight` holds; frees it at zero. */
static void op_unhold(dev_op *op) {
  if (atomic_fetch_sub(&op->inflight, 1) == 1) dev__op_free(op);
}

/* Records the fence of an op the executor has just issued and queues it for
 * the completion thread. A fence that cannot be recorded fails the op here.
 * Once every device has issued the op, its inputs are released: every use of
 * their buffers is queued on the devices' streams, which order a
 * stream-ordered free after it. */
void dev__complete_queue(dev_exec *x, dev_op *op, bool issued, uint64_t t0,
                         const uint64_t *deps, int ndeps) {
  dev_backend *b = x->engine->backend;
  const int d = x->device;
  dev_inflight f = {.op = op, .t_issue = t0};
  if (issued) {
    dev_status fst = DEV_STATUS_INIT;
    if (b->fence_record(b, d, &f.fence, &fst) != PD_OK) {
      f.fence = NULL;
      dev_status est = DEV_STATUS_INIT;
      dev_error(&est, fst.code, "%s on %s: %s", op->def->name,
                b->device_name(b, d), fst.msg);
      /* The completion thread has not seen this op: no lock needed. */
      for (int i = 0; i < op->num_outputs; i++)
        if (dev__slot(op->outputs[i], d) >= 0)
          dev__component_set_error(
              &op->outputs[i]->comps[dev__slot(op->outputs[i], d)], est.code,
              est.msg);
    }
  }
  /* An op that failed here carries its error already. */
  bool ok = true;
  for (int i = 0; i < op->num_outputs && ok; i++)
    ok = dev__slot(op->outputs[i], d) < 0 ||
         op->outputs[i]->comps[dev__slot(op->outputs[i], d)].code == PD_OK;
  if (ok && ndeps > 0) {
    f.ndeps = ndeps;
    if (ndeps <= DEV_INLINE_DEPS) {
      memcpy(f.dep, deps, sizeof *deps * (size_t)ndeps);
    } else if ((f.more_deps = malloc(sizeof *deps * (size_t)ndeps))) {
      memcpy(f.more_deps, deps, sizeof *deps * (size_t)ndeps);
    } else {
      /* Cannot record what it depends on: wait for them (rare). */
      f.ndeps = 0;
      uint64_t last = 0;
      for (int i = 0; i < ndeps; i++) last = deps[i] > last ? deps[i] : last;
      dev_exec_wait(x->engine, d, last);
      pthread_mutex_lock(&x->mu);
      for (int i = 0; i < op->num_inputs && ok; i++) {
        if (dev__slot(op->inputs[i], d) < 0) continue;
        const dev_component *c =
            &op->inputs[i]->comps[dev__slot(op->inputs[i], d)];
        if (c->code != PD_OK) {
          ok = false;
          for (int o = 0; o < op->num_outputs; o++)
            if (dev__slot(op->outputs[o], d) >= 0)
              dev__component_set_error(
                  &op->outputs[o]->comps[dev__slot(op->outputs[o], d)], c->code,
                  c->msg);
        }
      }
      pthread_mutex_unlock(&x->mu);
    }
  }
  pthread_mutex_lock(&x->mu);
  x->fring[(x->fhead + x->fcount) % x->fcap] = f;
  x->fcount++;
  x->pushed++;
  if (x->fsleeping) pthread_cond_signal(&x->fence_cv);
  pthread_mutex_unlock(&x->mu);
  if (atomic_fetch_sub(&op->pending, 1) == 1) {
    if (atomic_load(&op->issue_failed)) dev__exec_release_failed(x->engine, op);
    /* A placement op (a peer copy reads a source on another device's
     * memory, outside this stream's order) keeps its inputs until freed. */
    if (!(op->def->flags & DEV_OP_PLACEMENT)) {
      void (*rel)(dev_tensor *) =
          op->per_device_release ? dev__tensor_unref : dev_tensor_release;
      for (int i = 0; i < op->num_inputs; i++) rel(op->inputs[i]);
      op->num_inputs = 0;
    }
    op_unhold(op);
  }
}

/* Puts an error the device reported late on device x's component of each
 * output of `op` that has none yet (x->mu held). The buffer stays: a later
 * op already issued may still read it. */
static void late_error_locked(dev_exec *x, dev_op *op, pd_code code,
                              const char *msg) {
  for (int i = 0; i < op->num_outputs; i++) {
    const int ci = dev__slot(op->outputs[i], x->device);
    if (ci >= 0)
      dev__component_set_late_error(&op->outputs[i]->comps[ci], code, msg);
  }
}

/* The late failure of op `seq` on device x, or NULL. */
static const dev_late *late_find(const dev_exec *x, uint64_t seq) {
  for (int i = 0; i < x->nlate; i++)
    if (x->late[i].seq == seq) return &x->late[i];
  return NULL;
}

/* Waits for the device to finish one issued op, then publishes it. */
static void exec_complete(dev_exec *x, dev_inflight *f) {
  dev_backend *b = x->engine->backend;
  const int d = x->device;
  dev_op *op = f->op;
  const uint64_t seq = op->seq;
  dev_status err = DEV_STATUS_INIT;
  if (f->fence) {
    dev_status fst = DEV_STATUS_INIT;
    if (b->fence_wait(b, d, f->fence, &fst) != PD_OK)
      dev_error(&err, fst.code, "%s on %s: %s", op->def->name,
                b->device_name(b, d), fst.msg);
    b->fence_release(b, d, f->fence);
  }
  if (err.code == PD_OK && x->nlate > 0) {
    /* An input whose op failed on the device after this op was issued:
     * this op computed from garbage, so it fails with the input's error. */
    const uint64_t *deps = f->ndeps > DEV_INLINE_DEPS ? f->more_deps : f->dep;
    for (int i = 0; i < f->ndeps && err.code == PD_OK; i++) {
      const dev_late *l = late_find(x, deps[i]);
      if (l) dev_error(&err, l->code, "%s", l->msg ? l->msg : "");
    }
  }
  free(f->more_deps);
  if (err.code != PD_OK) {
    pthread_mutex_lock(&x->mu);
    late_error_locked(x, op, err.code, err.msg);
    uint64_t horizon = x->pushed + 1; /* + the op the executor may be issuing */
    pthread_mutex_unlock(&x->mu);
    if (x->nlate == x->late_cap) {
      int ncap = x->late_cap ? 2 * x->late_cap : 8;
      dev_late *nl = realloc(x->late, sizeof *nl * (size_t)ncap);
      if (nl) {
        x->late = nl;
        x->late_cap = ncap;
      }
    }
    /* Without room (host OOM) its consumers already issued go unmarked. */
    if (x->nlate < x->late_cap)
      x->late[x->nlate++] = (dev_late){seq, horizon, err.code, strdup(err.msg)};
  }
  x->completed++;
  for (int i = 0; i < x->nlate;) { /* forget failures no op in flight can see */
    if (x->late[i].horizon <= x->completed) {
      free(x->late[i].msg);
      x->late[i] = x->late[--x->nlate];
    } else {
      i++;
    }
  }
  uint64_t now = dev__now_ns();
  uint64_t from = f->t_issue > x->last_done_ns ? f->t_issue : x->last_done_ns;
  if (now > from) {
    atomic_fetch_add_explicit(&x->busy_ns, now - from, memory_order_relaxed);
    uint64_t *sink = dev__op_time_sink(op, d); /* dev_op_set_time_sink */
    if (sink) __atomic_fetch_add(sink, now - from, __ATOMIC_RELAXED);
  }
  x->last_done_ns = now;
  /* A rank's report (issue #16), read before the op may be freed. */
  const bool report = x->engine->mesh && dev__mesh_reports(x->engine, d);
  char dmsg[DEV_STATUS_MSG_MAX];
  pd_code dcode = report ? dev__mesh_done_info(op, d, dmsg, sizeof dmsg) : PD_OK;
  op_unhold(op);
  dev__ready_publish(&x->ready, seq);
  if (report) dev__mesh_local_done(x->engine, d, seq, dcode, dmsg);
}

void *dev__complete_main(void *arg) {
  dev_exec *x = arg;
  for (;;) {
    pthread_mutex_lock(&x->mu);
    while (x->fcount == 0 && !x->fstop) {
      x->fsleeping = true;
      pthread_cond_wait(&x->fence_cv, &x->mu);
      x->fsleeping = false;
    }
    if (x->fcount == 0) { /* stopped, and every issued op is published */
      pthread_mutex_unlock(&x->mu);
      return NULL;
    }
    dev_inflight f = x->fring[x->fhead];
    x->fhead = (x->fhead + 1) % x->fcap;
    x->fcount--;
    x->outstanding--;
    pthread_mutex_unlock(&x->mu);
    exec_complete(x, &f);
  }
}
