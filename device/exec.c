/* The executor of one device: a thread that takes the device's ops in the
 * one global submission order (a CUDA stream's semantics) and runs (CPU) or
 * issues (CUDA) each: reads its inputs' components, allocates or aliases its
 * outputs, and calls the kernel or the device's part of a collective. On the
 * CPU backend an op is then done and the executor publishes it (ready.c);
 * on a backend with fences it hands the op to the completion thread
 * (complete.c), which publishes once the device has finished it. Submission
 * (engine.c) reserves room and pushes ops here. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec_int.h"
#include "mesh/mesh_int.h"

/* The arguments of one device's part of an op, as its kernel sees them. */
typedef struct run_args {
  pd_dtype in_dtype[DEV_MAX_INPUTS];
  dev_shape in_shape[DEV_MAX_INPUTS];
  const void *in_data[DEV_MAX_INPUTS];
  pd_dtype out_dtype[DEV_MAX_OUTPUTS];
  dev_shape out_shape[DEV_MAX_OUTPUTS];
  void *out_data[DEV_MAX_OUTPUTS];
  int out_alias[DEV_MAX_OUTPUTS];
} run_args;

/* Reads device x's components of op's inputs into `a`; false (with the
 * first input's error in *st) when an input failed. With fences an input
 * may be in flight, its code still set by the completion thread (its buf is
 * left in place), so the codes are read under x->mu; deps[0..*ndeps)
 * receive the distinct seqs of the ops producing inputs still in flight. An
 * input in flight whose code reads OK here may still fail: the completion
 * thread checks the recorded producer against its late failures. */
static bool read_inputs(dev_exec *x, dev_op *op, run_args *a, uint64_t *deps,
                        int *ndeps, dev_status *st) {
  const int d = x->device;
  bool failed = false;
  if (x->fenced) pthread_mutex_lock(&x->mu);
  const uint64_t done = x->fenced ? atomic_load(&x->ready.done_seq) : 0;
  for (int i = 0; i < op->num_inputs; i++) {
    a->in_dtype[i] = op->inputs[i]->dtype;
    const int ci = dev__slot(op->inputs[i], d);
    if (ci < 0) { /* a placement op's input without a component here */
      memset(&a->in_shape[i], 0, sizeof a->in_shape[i]);
      a->in_data[i] = NULL;
      continue;
    }
    dev_component *c = &op->inputs[i]->comps[ci];
    a->in_shape[i] = c->shape;
    a->in_data[i] = c->buf ? c->buf->data : NULL;
    if (!failed && c->code != PD_OK) {
      failed = true;
      dev_error(st, c->code, "%s", c->msg ? c->msg : "");
    }
    uint64_t rs;
    if (x->fenced && (rs = atomic_load(&c->ready_seq)) > done) {
      int k = 0;
      while (k < *ndeps && deps[k] != rs) k++;
      if (k == *ndeps) deps[(*ndeps)++] = rs;
    }
  }
  if (x->fenced) pthread_mutex_unlock(&x->mu);
  return !failed;
}

/* Allocates device d's components of op's outputs (or aliases output 0 to
 * input 0 for DEV_OP_ALIASES_INPUT) into `a`; `failed`: an input failed, so
 * nothing is allocated. Returns false (error in *st) when one cannot be. */
static bool alloc_outputs(dev_backend *b, int d, dev_op *op, run_args *a,
                          bool failed, dev_status *st) {
  const dev_op_def *def = op->def;
  for (int i = 0; i < op->num_outputs; i++) {
    a->out_dtype[i] = op->outputs[i]->dtype;
    a->out_alias[i] = -1;
    a->out_data[i] = NULL;
    const int ci = dev__slot(op->outputs[i], d);
    if (ci < 0) { /* a placement op's output without a component here */
      memset(&a->out_shape[i], 0, sizeof a->out_shape[i]);
      continue;
    }
    dev_component *c = &op->outputs[i]->comps[ci];
    a->out_shape[i] = c->shape;
    if (failed) continue;
    /* Ordinary ops: every input and output is on the op's set, so input
     * 0's component here has the same index. */
    const dev_component *in0 =
        op->num_inputs > 0 ? &op->inputs[0]->comps[ci] : NULL;
    if (def->flags & DEV_OP_PLACEMENT) {
      continue; /* place.c aliases or allocates */
    } else if (i == 0 && (def->flags & DEV_OP_ALIASES_INPUT) && in0 &&
               in0->buf && in0->bytes == c->bytes) {
      dev__buffer_retain(in0->buf);
      c->buf = in0->buf;
      a->out_alias[i] = 0;
    } else {
      dev_status ast = DEV_STATUS_INIT;
      if (dev__buffer_alloc(b, d, c->bytes, &c->buf, &ast) != PD_OK) {
        failed = true;
        dev_error(st, ast.code, "%s: %s", def->name, ast.msg);
        continue;
      }
    }
    a->out_data[i] = c->buf->data;
  }
  return !failed;
}

/* Calls the op's kernel for one component (an op whose outputs all alias
 * its inputs runs nothing). True when work was issued; false with the error
 * in *st. */
static bool run_kernel(dev_backend *b, dev_op *op, dev_kernel_ctx *ctx,
                       dev_status *st) {
  const dev_op_def *def = op->def;
  const int d = ctx->device, ci = ctx->index;
  bool all_aliased = op->num_outputs > 0;
  for (int i = 0; i < op->num_outputs; i++)
    all_aliased &= ctx->out_alias[i] >= 0;
  dev_kernel_fn fn = def->kernels[b->kind];
  if (all_aliased && (def->flags & DEV_OP_ALIASES_INPUT)) {
    return false; /* the output shares the input's bytes: nothing to run */
  } else if (!fn && (def->flags & DEV_OP_ALIASES_INPUT)) {
    /* Aliasing op whose sizes differ cannot happen (infer keeps bytes). */
    dev_error(st, PD_INTERNAL,
              "%s: cannot alias input of %zu bytes to output of %zu bytes",
              def->name, op->inputs[0]->comps[ci].bytes,
              op->outputs[0]->comps[ci].bytes);
  } else if (!fn) {
    dev_error(st, PD_UNIMPLEMENTED, "%s has no kernel for the %s backend",
              def->name, b->name);
  } else {
    dev_status kst = DEV_STATUS_INIT;
    if (b->run_kernel(b, fn, ctx, &kst) == PD_OK) return true;
    if (strncmp(kst.msg, def->name, strlen(def->name)) == 0)
      dev_error(st, kst.code, "%s (on %s)", kst.msg, b->device_name(b, d));
    else
      dev_error(st, kst.code, "%s on %s: %s", def->name, b->device_name(b, d),
                kst.msg);
  }
  return false;
}

/* Runs (CPU) or issues (CUDA) device x's part of `op`. Returns true when
 * work was issued that a fence must cover: the kernel or the collective ran
 * without error. With fences, deps[0..*ndeps) receive the distinct seqs of
 * the ops producing inputs that were still in flight (room for
 * DEV_MAX_INPUTS). */
static bool run_op(dev_exec *x, dev_op *op, uint64_t *deps, int *ndeps) {
  const int d = x->device;
  dev_engine *e = x->engine;
  dev_backend *b = e->backend;
  dev_status st = DEV_STATUS_INIT;
  run_args a;
  bool failed = !read_inputs(x, op, &a, deps, ndeps, &st);
  if (!alloc_outputs(b, d, op, &a, failed, &st)) {
    if (!failed) atomic_store(&op->issue_failed, true); /* out of memory */
    failed = true;
  }

  dev_kernel_ctx ctx = {
      .op = op->def,
      .attrs = op->attrs,
      .device = d,
      .num_devices = op->set.n,
      .backend = b,
      .op_seq = op->seq,
      .num_inputs = op->num_inputs,
      .in_dtype = a.in_dtype,
      .in_shape = a.in_shape,
      .in_data = a.in_data,
      .num_outputs = op->num_outputs,
      .out_dtype = a.out_dtype,
      .out_shape = a.out_shape,
      .out_data = a.out_data,
      .out_alias = a.out_alias,
      .collective = op->collective,
      .heartbeat = &x->beats,
      .index = op->index[d],
      .devset = &op->set,
  };

  bool issued = false;
  if (op->def->flags & DEV_OP_PLACEMENT) {
    /* ParallelPack / ParallelUnpack / CopyToDevices (place.c) */
    if (!failed) {
      issued = dev__place_run(op, d, &st);
      failed = st.code != PD_OK;
    }
  } else if (op->def->flags & DEV_OP_FUNCTION) {
    /* A graph function's body (device/fn/run.c), collectives included. */
    const dev__fn_call *fc = op->fn_call;
    issued = fc->run(op, d, a.in_data, a.out_data, failed, &x->beats, &st);
    failed = st.code != PD_OK;
  } else if (op->def->flags & DEV_OP_COLLECTIVE) {
    /* Every device takes part, failed or not, so no peer waits forever. */
    dev_status cst = DEV_STATUS_INIT;
    if (b->collective_run(b, &ctx, failed ? &st : NULL, &cst) != PD_OK) {
      failed = true;
      st = cst;
    } else {
      issued = !failed;
    }
  } else if (!failed) {
    issued = run_kernel(b, op, &ctx, &st);
    failed = !issued && st.code != PD_OK;
  }

  if (failed)
    for (int i = 0; i < op->num_outputs; i++) {
      const int ci = dev__slot(op->outputs[i], d);
      if (ci >= 0)
        dev__component_set_error(&op->outputs[i]->comps[ci], st.code, st.msg);
    }
  return issued && !failed;
}

/* A remote device's part of `op` (issue #16, mesh/mesh_int.h): no kernel,
 * no memory. Its output components get placeholders (the wrapper backend
 * counts their bytes; aliasing and ParallelPack / ParallelUnpack share them
 * as buffers), and on the coordinator the outcome of the op on the rank
 * owning the device (remote_wait), so readiness, waits and errors follow
 * that rank's progress. On other ranks nothing waits: each runs its own
 * components. Never issues work. */
static bool run_remote(dev_exec *x, dev_op *op) {
  const int d = x->device;
  dev_engine *e = x->engine;
  dev_status st = DEV_STATUS_INIT;
  run_args a;
  uint64_t deps[DEV_MAX_INPUTS];
  int ndeps = 0;
  bool failed = !read_inputs(x, op, &a, deps, &ndeps, &st);
  if (!(op->def->flags & DEV_OP_PLACEMENT)) {
    alloc_outputs(e->backend, d, op, &a, failed, &st); /* placeholders */
  } else if (!failed && op->def->placement != DEV_PLACE_COPY) {
    dev__place_run(op, d, &st); /* shares the placeholders */
  } else if (!failed) { /* CopyToDevices within the remote rank */
    const int j = dev__slot(op->outputs[0], d);
    if (j >= 0)
      dev__buffer_alloc(e->backend, d, op->outputs[0]->comps[j].bytes,
                        &op->outputs[0]->comps[j].buf, &st);
  }
  dev_status rst = DEV_STATUS_INIT;
  if (dev__mesh_remote_wait(e, d, op->seq, &rst) != PD_OK) {
    failed = true;
    st = rst; /* the rank's outcome is the component's */
  }
  if (failed)
    for (int i = 0; i < op->num_outputs; i++) {
      const int ci = dev__slot(op->outputs[i], d);
      if (ci >= 0)
        dev__component_set_error(&op->outputs[i]->comps[ci], st.code, st.msg);
    }
  return false;
}

/* Device d is done with op: its hold on its component of every input and
 * output goes (a collective's peers may read each other's components until
 * all are done, so its holds go with the op). */
static void drop_holds(dev_op *op, int d) {
  if (!op->per_device_release) return;
  /* By component: device d's component of each tensor (every tensor of
   * an op that releases per device is on the op's set). */
  for (int i = 0; i < op->num_inputs; i++)
    dev__tensor_drop_component(op->inputs[i], dev__slot(op->inputs[i], d));
  for (int i = 0; i < op->num_outputs; i++)
    dev__tensor_drop_component(op->outputs[i], dev__slot(op->outputs[i], d));
}

/* Waits (x->mu held) for work, a release to do or stop. Once the device
 * has been idle DEV_IDLE_TRIM_MS after running something, the backend's
 * trim gives its cached memory back. */
static void wait_work(dev_exec *x, bool *trim_due) {
  dev_backend *b = x->engine->backend;
  bool can_trim =
      b->struct_size >= offsetof(dev_backend, trim) + sizeof b->trim && b->trim;
  while ((x->count == 0 || x->held) && !x->stop && !x->released) {
    x->sleeping = true;
    if (*trim_due && can_trim) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts); /* work_cv's clock */
      ts.tv_sec += DEV_IDLE_TRIM_MS / 1000;
      ts.tv_nsec += (long)(DEV_IDLE_TRIM_MS % 1000) * 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      if (pthread_cond_timedwait(&x->work_cv, &x->mu, &ts) == ETIMEDOUT &&
          x->count == 0) {
        *trim_due = false;
        pthread_mutex_unlock(&x->mu);
        b->trim(b, x->device);
        pthread_mutex_lock(&x->mu);
      }
    } else {
      pthread_cond_wait(&x->work_cv, &x->mu);
    }
    x->sleeping = false;
  }
}

void *dev__exec_main(void *arg) {
  dev_exec *x = arg;
  enum { BATCH = 32 };
  dev_op *batch[BATCH];
  bool trim_due = false;
  for (;;) {
    /* Take every queued op (up to BATCH) under one lock. */
    pthread_mutex_lock(&x->mu);
    for (;;) {
      wait_work(x, &trim_due);
      if (!x->released) break;
      dev__exec_drain_released(x);
    }
    if (x->count == 0 && x->stop) {
      pthread_mutex_unlock(&x->mu);
      return NULL;
    }
    int n = 0;
    while (x->count > 0 && n < BATCH && (!x->held || x->stop)) {
      batch[n++] = x->ring[x->head];
      x->head = (x->head + 1) % x->cap;
      x->count--;
    }
    pthread_mutex_unlock(&x->mu);
    trim_due = trim_due || n > 0;

    for (int b = 0; b < n; b++) {
      dev_op *op = batch[b];
      uint64_t t0 = dev__now_ns();
      atomic_store_explicit(&x->run_seq, op->seq, memory_order_relaxed);
      uint64_t deps[DEV_MAX_INPUTS];
      int ndeps = 0;
      bool issued = dev__mesh_remote(x->engine->mesh, x->device)
                        ? run_remote(x, op)
                        : run_op(x, op, deps, &ndeps);
      drop_holds(op, x->device);
      if (x->fenced) {
        dev__complete_queue(x, op, issued, t0, deps, ndeps);
        continue;
      }
      uint64_t ran_ns = dev__now_ns() - t0;
      atomic_fetch_add_explicit(&x->busy_ns, ran_ns, memory_order_relaxed);
      uint64_t *sink = dev__op_time_sink(op, x->device); /* before the free */
      if (sink) __atomic_fetch_add(sink, ran_ns, __ATOMIC_RELAXED);
      uint64_t seq = op->seq;
      /* A rank's report (issue #16), read before the op may be freed. */
      const bool report = x->engine->mesh && dev__mesh_reports(x->engine, x->device);
      char dmsg[DEV_STATUS_MSG_MAX];
      pd_code dcode =
          report ? dev__mesh_done_info(op, x->device, dmsg, sizeof dmsg) : PD_OK;
      if (atomic_fetch_sub(&op->pending, 1) == 1) {
        dev__exec_release_failed(x->engine, op);
        dev__op_free(op);
      }
      dev__ready_publish(&x->ready, seq);
      if (report) dev__mesh_local_done(x->engine, x->device, seq, dcode, dmsg);
    }
  }
}

bool dev__exec_reserve_n(dev_exec *x, size_t n) {
  bool ok = true;
  pthread_mutex_lock(&x->mu);
  if (x->count + n > x->cap) {
    size_t ncap = x->cap ? x->cap * 2 : 256;
    while (ncap < x->count + n) ncap *= 2;
    dev_op **nr = malloc(ncap * sizeof *nr);
    if (nr) {
      for (size_t i = 0; i < x->count; i++)
        nr[i] = x->ring[(x->head + i) % x->cap];
      free(x->ring);
      x->ring = nr;
      x->cap = ncap;
      x->head = 0;
    } else {
      ok = false;
    }
  }
  if (ok && x->fenced && x->outstanding + n > x->fcap) {
    /* Room in fring for every op that may reach it. */
    size_t ncap = x->fcap ? x->fcap * 2 : 256;
    while (ncap < x->outstanding + n) ncap *= 2;
    dev_inflight *nf = malloc(ncap * sizeof *nf);
    if (nf) {
      for (size_t i = 0; i < x->fcount; i++)
        nf[i] = x->fring[(x->fhead + i) % x->fcap];
      free(x->fring);
      x->fring = nf;
      x->fcap = ncap;
      x->fhead = 0;
    } else {
      ok = false;
    }
  }
  pthread_mutex_unlock(&x->mu);
  return ok;
}

/* --- batch submission (issue #15: a dispatcher as fast as the wire) -------
 * Pushes ops[0..n) (room reserved) under one lock with at most one wake-up:
 * a dispatcher batch costs each executor one lock and one signal, not one
 * per op, and an executor that is running is never signalled. */
void dev__exec_push_n(dev_exec *x, dev_op *const *ops, size_t n) {
  pthread_mutex_lock(&x->mu);
  for (size_t i = 0; i < n; i++)
    x->ring[(x->head + x->count + i) % x->cap] = ops[i];
  x->count += n;
  if (x->fenced) x->outstanding += n;
  if (x->sleeping) pthread_cond_signal(&x->work_cv); /* no syscall when awake */
  pthread_mutex_unlock(&x->mu);
}
