/* The engine: one executor thread per device, each running its queue of ops
 * in the one global submission order (a CUDA stream's semantics), plus op
 * validation, attribute resolution and shape inference at preparation.
 *
 * Completion. On the CPU backend an op is done when the executor's kernel
 * call returns, and the executor publishes it (done_seq, waiters, notify
 * callbacks). A backend with fences (CUDA) only queues the work: there the
 * executor records a fence behind each op it issued and hands it to the
 * device's completion thread, which waits for the fences in order and only
 * then publishes, as TensorFlow's GPU EventMgr does. The executor goes on
 * issuing meanwhile, so the device's queue never drains between ops; stream
 * order protects dependencies on one device. An op's error that the device
 * reports late (an illegal address inside a kernel) lands on that op's
 * outputs on that device, and on the outputs of later ops of that device
 * that consumed them and were already issued (the executor records which
 * in-flight ops each op read from; the completion thread keeps the late
 * failures until no op issued before them is in flight). An op's inputs are
 * released once every device has issued it, so buffers are freed
 * stream-ordered as early as on the CPU, not when the device catches up;
 * its outputs are held until every device has finished it. */
#include <errno.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_int.h"
#include "dev_cuda.h"

/* A dev_tensor_notify registration: one group per call, with one waiter per
 * device that had not finished when it was made. Each waiter leaves its
 * executor's list before it counts down, so the last count frees it all. */
typedef struct notify_group notify_group;

typedef struct dev_waiter {
  uint64_t seq;
  notify_group *g;
  struct dev_waiter *next;
} dev_waiter;

struct notify_group {
  atomic_int remaining;
  dev_tensor *t;
  dev_ready_fn fn;
  void *arg;
  dev_waiter w[];
};

typedef struct dev_exec {
  dev_engine *engine;
  int device;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;
  pthread_cond_t done_cv;
  dev_op **ring;
  size_t cap, head, count;
  bool stop;
  bool sleeping; /* waiting on work_cv: only then does a push signal it */
  _Atomic uint64_t done_seq;
  atomic_int waiters;
  /* Under mu, ascending by seq: ops finish in seq order, so waiters are only
   * ever taken from the head (a pipelining client can have an op's worth of
   * waiters for every op it queued ahead, so walking them all per op would
   * be quadratic). */
  dev_waiter *notify, *notify_tail;
  atomic_int notify_count;
  _Atomic uint64_t busy_ns; /* dev_engine_busy_seconds */
  /* Backends with fences only. Under mu: fring holds the ops issued on the
   * device whose fence the completion thread has not yet taken, in issue
   * order; `outstanding` counts the ops pushed to this device that are not
   * yet taken by the completion thread, so that submission keeps room in
   * fring for every one of them (the executor never allocates there);
   * `pushed` counts the ops ever put in fring. */
  bool fenced;
  bool completer_started;
  pthread_t completer;
  pthread_cond_t fence_cv;
  struct dev_inflight *fring;
  size_t fcap, fhead, fcount, outstanding;
  uint64_t pushed;
  bool fstop, fsleeping;
  /* Completion thread only: ops whose outputs failed late (after ops that
   * consume them may have been issued), kept until every op issued before
   * the failure was published has completed; and how many ops completed. */
  struct dev_late *late;
  int nlate, late_cap;
  uint64_t completed;
  uint64_t last_done_ns; /* when the previous op finished (busy time) */
} dev_exec;

/* Inputs of an issued op that were still in flight on the device when it was
 * issued, as the seqs of the ops producing them. */
#define DEV_INLINE_DEPS 4

/* One op issued on a fenced device, waiting for the device to finish it. */
typedef struct dev_inflight {
  dev_op *op;
  void *fence;      /* NULL: the op issued no work (it failed, or aliases) */
  uint64_t t_issue; /* when the executor began issuing it (ns) */
  int ndeps;
  uint64_t dep[DEV_INLINE_DEPS];
  uint64_t *more_deps; /* all ndeps of them when ndeps > DEV_INLINE_DEPS */
} dev_inflight;

/* An op whose outputs on a device failed after it was issued. */
typedef struct dev_late {
  uint64_t seq;
  uint64_t horizon; /* ops pushed before this one may consume its outputs */
  pd_code code;
  char *msg;
} dev_late;

struct dev_engine {
  dev_backend *backend;
  int n;
  pthread_mutex_t submit_mu;
  uint64_t seq;
  dev_exec *execs;
};

int dev_engine_num_devices(const dev_engine *e) { return e->n; }
dev_backend *dev_engine_backend(dev_engine *e) { return e->backend; }

const char *dev_engine_backend_name(dev_engine *e) {
  return e->backend->name ? e->backend->name : "";
}

const char *dev_engine_device_name(dev_engine *e, int device) {
  dev_backend *b = e->backend;
  if (device < 0 || device >= e->n || !b->device_name) return "";
  const char *name = b->device_name(b, device);
  return name ? name : "";
}

bool dev_engine_device_healthy(dev_engine *e, int device) {
  dev_backend *b = e->backend;
  if (device < 0 || device >= e->n) return false;
  bool has = b->struct_size >= offsetof(dev_backend, healthy) + sizeof b->healthy && b->healthy;
  return !has || b->healthy(b, device);
}

uint64_t dev_exec_done(dev_engine *e, int device) {
  return atomic_load(&e->execs[device].done_seq);
}

void dev_exec_wait(dev_engine *e, int device, uint64_t seq) {
  (void)dev_exec_wait_until(e, device, seq, 0);
}

double dev_monotonic_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool dev_exec_wait_until(dev_engine *e, int device, uint64_t seq, double deadline) {
  dev_exec *x = &e->execs[device];
  if (atomic_load(&x->done_seq) >= seq) return true;
  struct timespec ts;
  if (deadline > 0) {
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
  }
  bool done = true;
  pthread_mutex_lock(&x->mu);
  atomic_fetch_add(&x->waiters, 1);
  while (atomic_load(&x->done_seq) < seq) {
    if (deadline > 0) {
      if (pthread_cond_timedwait(&x->done_cv, &x->mu, &ts) == ETIMEDOUT &&
          atomic_load(&x->done_seq) < seq) {
        done = false;
        break;
      }
    } else {
      pthread_cond_wait(&x->done_cv, &x->mu);
    }
  }
  atomic_fetch_sub(&x->waiters, 1);
  pthread_mutex_unlock(&x->mu);
  return done;
}

static void notify_fire(notify_group *g) {
  pd_code code = PD_OK;
  for (int d = 0; d < g->t->n && code == PD_OK; d++) code = g->t->comps[d].code;
  g->fn(g->arg, g->t, code);
  dev_tensor_release(g->t);
  free(g);
}

/* Inserts w into x's notify list in seq order (x->mu held). Registrations
 * come mostly in submission order and append at the tail; one for an older
 * op walks from the head. */
static void notify_insert_locked(dev_exec *x, dev_waiter *w) {
  if (!x->notify_tail || x->notify_tail->seq <= w->seq) {
    w->next = NULL;
    if (x->notify_tail)
      x->notify_tail->next = w;
    else
      x->notify = w;
    x->notify_tail = w;
    return;
  }
  dev_waiter **pp = &x->notify;
  while ((*pp)->seq <= w->seq) pp = &(*pp)->next;
  w->next = *pp;
  *pp = w;
}

pd_code dev_tensor_notify(dev_tensor *t, dev_ready_fn fn, void *arg, dev_status *st) {
  dev_engine *e = t->engine;
  for (int d = 0; d < t->n; d++)
    if (atomic_load(&t->comps[d].ready_seq) == UINT64_MAX)
      return dev_error(st, PD_FAILED_PRECONDITION, "tensor's op was prepared but never submitted");
  notify_group *g = malloc(sizeof *g + sizeof(dev_waiter) * (size_t)t->n);
  if (!g) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  dev_tensor_retain(t);
  g->t = t;
  g->fn = fn;
  g->arg = arg;
  /* One extra count held by this function, so the group cannot fire while
   * waiters are still being added. */
  atomic_init(&g->remaining, 1);
  int used = 0;
  for (int d = 0; d < t->n; d++) {
    dev_exec *x = &e->execs[d];
    uint64_t seq = atomic_load(&t->comps[d].ready_seq);
    pthread_mutex_lock(&x->mu);
    /* Count first, then look at done_seq: the publisher stores done_seq,
     * then looks at the count, so one of the two sees the other (a waiter
     * added after the publisher looked would wait for the next op). */
    atomic_fetch_add(&x->notify_count, 1);
    if (atomic_load(&x->done_seq) < seq) {
      dev_waiter *w = &g->w[used++];
      w->seq = seq;
      w->g = g;
      notify_insert_locked(x, w);
      atomic_fetch_add(&g->remaining, 1);
    } else {
      atomic_fetch_sub(&x->notify_count, 1);
    }
    pthread_mutex_unlock(&x->mu);
  }
  if (atomic_fetch_sub(&g->remaining, 1) == 1) notify_fire(g);
  return PD_OK;
}

/* --- op lifetime ---------------------------------------------------------- */

static void op_free(dev_op *op) {
  dev_backend *b = op->engine->backend;
  if (op->collective && b->collective_release) b->collective_release(b, op->collective);
  for (int i = 0; i < op->num_inputs; i++) dev_tensor_release(op->inputs[i]);
  for (int i = 0; i < op->num_outputs; i++) dev_tensor_release(op->outputs[i]);
  free(op->attr_arena);
  free(op);
}

/* --- executor ------------------------------------------------------------- */

/* Runs (CPU) or issues (CUDA) device x's part of `op`. Returns true when
 * work was issued that a fence must cover: the kernel or the collective ran
 * without error. With fences, deps[0..*ndeps) receive the distinct seqs of
 * the ops producing inputs that were still in flight (room for
 * DEV_MAX_INPUTS). */
static bool run_op(dev_exec *x, dev_op *op, uint64_t *deps, int *ndeps) {
  const int d = x->device;
  dev_engine *e = x->engine;
  dev_backend *b = e->backend;
  const dev_op_def *def = op->def;
  dev_status st = DEV_STATUS_INIT;
  bool failed = false;

  pd_dtype in_dtype[DEV_MAX_INPUTS];
  dev_shape in_shape[DEV_MAX_INPUTS];
  const void *in_data[DEV_MAX_INPUTS];
  /* With fences an input may be in flight, its code still set by the
   * completion thread (its buf is left in place). An input in flight whose
   * code reads OK here may still fail: the completion thread checks the
   * recorded producer against its late failures. */
  if (x->fenced) pthread_mutex_lock(&x->mu);
  const uint64_t done = x->fenced ? atomic_load(&x->done_seq) : 0;
  for (int i = 0; i < op->num_inputs; i++) {
    dev_component *c = &op->inputs[i]->comps[d];
    in_dtype[i] = op->inputs[i]->dtype;
    in_shape[i] = c->shape;
    in_data[i] = c->buf ? c->buf->data : NULL;
    if (!failed && c->code != PD_OK) {
      failed = true;
      dev_error(&st, c->code, "%s", c->msg ? c->msg : "");
    }
    uint64_t rs;
    if (x->fenced && (rs = atomic_load(&c->ready_seq)) > done) {
      int k = 0;
      while (k < *ndeps && deps[k] != rs) k++;
      if (k == *ndeps) deps[(*ndeps)++] = rs;
    }
  }
  if (x->fenced) pthread_mutex_unlock(&x->mu);

  pd_dtype out_dtype[DEV_MAX_OUTPUTS];
  dev_shape out_shape[DEV_MAX_OUTPUTS];
  void *out_data[DEV_MAX_OUTPUTS] = {0};
  int out_alias[DEV_MAX_OUTPUTS];
  for (int i = 0; i < op->num_outputs; i++) {
    dev_component *c = &op->outputs[i]->comps[d];
    out_dtype[i] = op->outputs[i]->dtype;
    out_shape[i] = c->shape;
    out_alias[i] = -1;
    if (failed) continue;
    if (i == 0 && (def->flags & DEV_OP_ALIASES_INPUT) && op->num_inputs > 0 &&
        op->inputs[0]->comps[d].buf && op->inputs[0]->comps[d].bytes == c->bytes) {
      dev_buffer_retain(op->inputs[0]->comps[d].buf);
      c->buf = op->inputs[0]->comps[d].buf;
      out_alias[i] = 0;
    } else {
      dev_status ast = DEV_STATUS_INIT;
      if (dev_buffer_alloc(b, d, c->bytes, &c->buf, &ast) != PD_OK) {
        failed = true;
        dev_error(&st, ast.code, "%s: %s", def->name, ast.msg);
        continue;
      }
    }
    out_data[i] = c->buf->data;
  }

  dev_kernel_ctx ctx = {
      .op = def, .attrs = op->attrs, .device = d, .num_devices = e->n, .backend = b,
      .op_seq = op->seq, .num_inputs = op->num_inputs, .in_dtype = in_dtype,
      .in_shape = in_shape, .in_data = in_data, .num_outputs = op->num_outputs,
      .out_dtype = out_dtype, .out_shape = out_shape, .out_data = out_data,
      .out_alias = out_alias, .collective = op->collective,
  };

  bool issued = false;
  if (def->flags & DEV_OP_COLLECTIVE) {
    /* Every device takes part, failed or not, so no peer waits forever. */
    dev_status cst = DEV_STATUS_INIT;
    if (b->collective_run(b, &ctx, failed ? &st : NULL, &cst) != PD_OK) {
      failed = true;
      st = cst;
    } else {
      issued = !failed;
    }
  } else if (!failed) {
    bool all_aliased = op->num_outputs > 0;
    for (int i = 0; i < op->num_outputs; i++) all_aliased &= out_alias[i] >= 0;
    dev_kernel_fn fn = def->kernels[b->kind];
    if (all_aliased && (def->flags & DEV_OP_ALIASES_INPUT)) {
      /* The output shares the input's bytes: nothing to run. */
    } else if (!fn && (def->flags & DEV_OP_ALIASES_INPUT)) {
      /* Aliasing op whose sizes differ cannot happen (infer keeps bytes). */
      failed = true;
      dev_error(&st, PD_INTERNAL, "%s: cannot alias input of %zu bytes to output of %zu bytes",
                def->name, op->inputs[0]->comps[d].bytes, op->outputs[0]->comps[d].bytes);
    } else if (!fn) {
      failed = true;
      dev_error(&st, PD_UNIMPLEMENTED, "%s has no kernel for the %s backend", def->name, b->name);
    } else {
      dev_status kst = DEV_STATUS_INIT;
      if (b->run_kernel(b, fn, &ctx, &kst) != PD_OK) {
        failed = true;
        if (strncmp(kst.msg, def->name, strlen(def->name)) == 0)
          dev_error(&st, kst.code, "%s (on %s)", kst.msg, b->device_name(b, d));
        else
          dev_error(&st, kst.code, "%s on %s: %s", def->name, b->device_name(b, d), kst.msg);
      } else {
        issued = true;
      }
    }
  }

  if (failed)
    for (int i = 0; i < op->num_outputs; i++)
      dev_component_set_error(&op->outputs[i]->comps[d], st.code, st.msg);
  return issued && !failed;
}

/* Fires the notify waiters of `x` whose op has finished. */
static void exec_fire_notify(dev_exec *x, uint64_t done) {
  dev_waiter *ready = NULL;
  pthread_mutex_lock(&x->mu);
  while (x->notify && x->notify->seq <= done) {
    dev_waiter *w = x->notify;
    x->notify = w->next;
    w->next = ready;
    ready = w;
    atomic_fetch_sub(&x->notify_count, 1);
  }
  if (!x->notify) x->notify_tail = NULL;
  pthread_mutex_unlock(&x->mu);
  while (ready) {
    dev_waiter *w = ready;
    ready = w->next;
    notify_group *g = w->g;
    if (atomic_fetch_sub(&g->remaining, 1) == 1) notify_fire(g);
  }
}

static uint64_t exec_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Publishes that device x has finished op `seq` (after dropping its hold on
 * the op): advances done_seq, wakes waiters and fires notify callbacks. */
static void exec_publish(dev_exec *x, uint64_t seq) {
  atomic_store(&x->done_seq, seq);
  if (atomic_load(&x->waiters) > 0) {
    pthread_mutex_lock(&x->mu);
    pthread_cond_broadcast(&x->done_cv);
    pthread_mutex_unlock(&x->mu);
  }
  if (atomic_load(&x->notify_count) > 0) exec_fire_notify(x, seq);
}

static void exec_queue_fence(dev_exec *x, dev_op *op, bool issued, uint64_t t0,
                             const uint64_t *deps, int ndeps);

static void *exec_main(void *arg) {
  dev_exec *x = arg;
  enum { BATCH = 32 };
  dev_op *batch[BATCH];
  for (;;) {
    /* Take every queued op (up to BATCH) under one lock. */
    pthread_mutex_lock(&x->mu);
    while (x->count == 0 && !x->stop) {
      x->sleeping = true;
      pthread_cond_wait(&x->work_cv, &x->mu);
      x->sleeping = false;
    }
    if (x->count == 0 && x->stop) {
      pthread_mutex_unlock(&x->mu);
      return NULL;
    }
    int n = 0;
    while (x->count > 0 && n < BATCH) {
      batch[n++] = x->ring[x->head];
      x->head = (x->head + 1) % x->cap;
      x->count--;
    }
    pthread_mutex_unlock(&x->mu);

    for (int b = 0; b < n; b++) {
      dev_op *op = batch[b];
      uint64_t t0 = exec_now_ns();
      uint64_t deps[DEV_MAX_INPUTS];
      int ndeps = 0;
      bool issued = run_op(x, op, deps, &ndeps);
      if (x->fenced) {
        exec_queue_fence(x, op, issued, t0, deps, ndeps);
        continue;
      }
      atomic_fetch_add_explicit(&x->busy_ns, exec_now_ns() - t0, memory_order_relaxed);
      uint64_t seq = op->seq;
      if (atomic_fetch_sub(&op->pending, 1) == 1) op_free(op);
      exec_publish(x, seq);
    }
  }
}

/* --- completion (backends with fences) ------------------------------------ */

/* Drops one of a fenced op's `inflight` holds; frees it at zero. */
static void op_unhold(dev_op *op) {
  if (atomic_fetch_sub(&op->inflight, 1) == 1) op_free(op);
}

/* Records the fence of an op the executor has just issued and queues it for
 * the completion thread. A fence that cannot be recorded fails the op here.
 * Once every device has issued the op, its inputs are released: every use of
 * their buffers is queued on the devices' streams, which order a
 * stream-ordered free after it. */
static void exec_queue_fence(dev_exec *x, dev_op *op, bool issued, uint64_t t0,
                             const uint64_t *deps, int ndeps) {
  dev_backend *b = x->engine->backend;
  const int d = x->device;
  dev_inflight f = {.op = op, .t_issue = t0};
  if (issued) {
    dev_status fst = DEV_STATUS_INIT;
    if (b->fence_record(b, d, &f.fence, &fst) != PD_OK) {
      f.fence = NULL;
      dev_status est = DEV_STATUS_INIT;
      dev_error(&est, fst.code, "%s on %s: %s", op->def->name, b->device_name(b, d), fst.msg);
      /* The completion thread has not seen this op: no lock needed. */
      for (int i = 0; i < op->num_outputs; i++)
        dev_component_set_error(&op->outputs[i]->comps[d], est.code, est.msg);
    }
  }
  /* An op that failed here carries its error already. */
  bool ok = true;
  for (int i = 0; i < op->num_outputs && ok; i++) ok = op->outputs[i]->comps[d].code == PD_OK;
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
        const dev_component *c = &op->inputs[i]->comps[d];
        if (c->code != PD_OK) {
          ok = false;
          for (int o = 0; o < op->num_outputs; o++)
            dev_component_set_error(&op->outputs[o]->comps[d], c->code, c->msg);
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
    for (int i = 0; i < op->num_inputs; i++) dev_tensor_release(op->inputs[i]);
    op->num_inputs = 0;
    op_unhold(op);
  }
}

/* Puts an error the device reported late on device x's component of each
 * output of `op` that has none yet (x->mu held). The buffer stays: a later
 * op already issued may still read it. */
static void late_error_locked(dev_exec *x, dev_op *op, pd_code code, const char *msg) {
  for (int i = 0; i < op->num_outputs; i++) {
    dev_component *c = &op->outputs[i]->comps[x->device];
    if (c->code != PD_OK) continue;
    char *m = strdup(msg);
    free(c->msg);
    c->msg = m; /* NULL on host OOM: readers print "" */
    c->code = code;
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
      dev_error(&err, fst.code, "%s on %s: %s", op->def->name, b->device_name(b, d), fst.msg);
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
  uint64_t now = exec_now_ns();
  uint64_t from = f->t_issue > x->last_done_ns ? f->t_issue : x->last_done_ns;
  if (now > from) atomic_fetch_add_explicit(&x->busy_ns, now - from, memory_order_relaxed);
  x->last_done_ns = now;
  op_unhold(op);
  exec_publish(x, seq);
}

static void *complete_main(void *arg) {
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

/* Makes room for one more op; called under the engine's submit lock, so the
 * room stays (the executor only removes ops). */
static bool exec_reserve(dev_exec *x) {
  bool ok = true;
  pthread_mutex_lock(&x->mu);
  if (x->count == x->cap) {
    size_t ncap = x->cap ? x->cap * 2 : 256;
    dev_op **nr = malloc(ncap * sizeof *nr);
    if (nr) {
      for (size_t i = 0; i < x->count; i++) nr[i] = x->ring[(x->head + i) % x->cap];
      free(x->ring);
      x->ring = nr;
      x->cap = ncap;
      x->head = 0;
    } else {
      ok = false;
    }
  }
  if (ok && x->fenced && x->outstanding == x->fcap) {
    /* Room in fring for every op that may reach it. */
    size_t ncap = x->fcap ? x->fcap * 2 : 256;
    dev_inflight *nf = malloc(ncap * sizeof *nf);
    if (nf) {
      for (size_t i = 0; i < x->fcount; i++) nf[i] = x->fring[(x->fhead + i) % x->fcap];
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

static void exec_push(dev_exec *x, dev_op *op) {
  pthread_mutex_lock(&x->mu);
  x->ring[(x->head + x->count) % x->cap] = op;
  x->count++;
  if (x->fenced) x->outstanding++;
  if (x->sleeping) pthread_cond_signal(&x->work_cv); /* no syscall when awake */
  pthread_mutex_unlock(&x->mu);
}

/* --- engine lifetime ------------------------------------------------------ */

pd_code dev_engine_create(const dev_engine_config *cfg, dev_engine **out, dev_status *st) {
  dev_engine_config def = DEV_ENGINE_CONFIG_INITIALIZER;
  if (!cfg) cfg = &def;
  dev_registry_init(); /* before a backend registers its kernels */
  const char *name = cfg->backend ? cfg->backend : "cpu";
  dev_backend *b = NULL;
  pd_code rc;
  if (strcmp(name, "cpu") == 0) {
    dev_cpu_config cc = DEV_CPU_CONFIG_INITIALIZER;
    cc.num_devices = cfg->num_devices;
    cc.memory_limit = cfg->memory_limit;
    rc = dev_cpu_backend_create(&cc, &b, st);
  } else if (strcmp(name, "cuda") == 0) {
#ifdef PARADEV_HAVE_CUDA
    dev_cuda_config cc = DEV_CUDA_CONFIG_INITIALIZER;
    if (cfg->struct_size >= offsetof(dev_engine_config, mesh) + sizeof cfg->mesh)
      cc.mesh = cfg->mesh;
    cc.memory_limit = cfg->memory_limit;
    if (cfg->struct_size >= offsetof(dev_engine_config, cuda_collectives) +
                                sizeof cfg->cuda_collectives) {
      if (cfg->cuda_collective_timeout_ms < 0)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "cuda collective timeout is %d ms; expected a positive number of "
                         "milliseconds, or 0 for the default (300000)",
                         cfg->cuda_collective_timeout_ms);
      cc.allow_tf32 = cfg->cuda_allow_tf32;
      cc.pool_release_threshold = cfg->cuda_pool_release_threshold;
      cc.collective_timeout_ms = cfg->cuda_collective_timeout_ms;
      cc.collectives = cfg->cuda_collectives;
    }
    rc = dev_cuda_backend_create(&cc, &b, st);
#else
    rc = dev_error(st, PD_UNAVAILABLE,
                   "the cuda backend is not built into this engine; run with --backend=cpu");
#endif
  } else {
    rc = dev_error(st, PD_INVALID_ARGUMENT, "unknown backend '%s'; expected cpu or cuda", name);
  }
  if (rc != PD_OK) return rc;
  return dev_engine_create_with_backend(b, out, st);
}

/* Stops and joins the threads of execs[0..n) (executors first, so that the
 * completion threads see every issued op before they are told to stop). */
static void engine_stop_threads(dev_engine *e, int n) {
  for (int i = 0; i < n; i++) {
    dev_exec *x = &e->execs[i];
    pthread_mutex_lock(&x->mu);
    x->stop = true;
    pthread_cond_signal(&x->work_cv);
    pthread_mutex_unlock(&x->mu);
  }
  for (int i = 0; i < n; i++) pthread_join(e->execs[i].thread, NULL);
  for (int i = 0; i < n; i++) {
    dev_exec *x = &e->execs[i];
    if (!x->completer_started) continue;
    pthread_mutex_lock(&x->mu);
    x->fstop = true;
    pthread_cond_signal(&x->fence_cv);
    pthread_mutex_unlock(&x->mu);
  }
  for (int i = 0; i < n; i++)
    if (e->execs[i].completer_started) pthread_join(e->execs[i].completer, NULL);
}

/* Frees what dev_engine_create_with_backend set up for one device. */
static void exec_free(dev_exec *x) {
  pthread_mutex_destroy(&x->mu);
  pthread_cond_destroy(&x->work_cv);
  pthread_cond_destroy(&x->done_cv);
  if (x->fenced) pthread_cond_destroy(&x->fence_cv);
  free(x->ring);
  free(x->fring);
  for (int i = 0; i < x->nlate; i++) free(x->late[i].msg);
  free(x->late);
}

static void engine_free_execs(dev_engine *e, int n) {
  for (int i = 0; i < n; i++) exec_free(&e->execs[i]);
}

pd_code dev_engine_create_with_backend(dev_backend *b, dev_engine **out, dev_status *st) {
  dev_registry_init();
  bool fenced = b->struct_size >= offsetof(dev_backend, fence_release) + sizeof b->fence_release &&
                b->fence_record && b->fence_wait && b->fence_release;
  dev_engine *e = calloc(1, sizeof *e);
  if (!e) goto fail_backend;
  e->backend = b;
  e->n = b->num_devices;
  e->execs = calloc((size_t)e->n, sizeof *e->execs);
  if (!e->execs) goto fail_engine;
  pthread_mutex_init(&e->submit_mu, NULL);
  int started = 0;
  for (; started < e->n; started++) {
    dev_exec *x = &e->execs[started];
    x->engine = e;
    x->device = started;
    x->fenced = fenced;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->work_cv, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* for dev_exec_wait_until */
    pthread_cond_init(&x->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (fenced) pthread_cond_init(&x->fence_cv, NULL);
    atomic_init(&x->done_seq, 0);
    atomic_init(&x->waiters, 0);
    atomic_init(&x->busy_ns, 0);
    if (pthread_create(&x->thread, NULL, exec_main, x) != 0) {
      exec_free(x);
      goto fail_threads;
    }
    if (fenced) {
      if (pthread_create(&x->completer, NULL, complete_main, x) != 0) {
        started++; /* its executor runs: stop it with the others */
        goto fail_threads;
      }
      x->completer_started = true;
    }
  }
  *out = e;
  return PD_OK;

fail_threads:
  engine_stop_threads(e, started);
  engine_free_execs(e, started);
  pthread_mutex_destroy(&e->submit_mu);
  free(e->execs);
fail_engine:
  free(e);
fail_backend:
  b->destroy(b);
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "could not start the engine's threads");
}

void dev_engine_destroy(dev_engine *e) {
  if (!e) return;
  engine_stop_threads(e, e->n);
  engine_free_execs(e, e->n);
  pthread_mutex_destroy(&e->submit_mu);
  e->backend->destroy(e->backend);
  free(e->execs);
  free(e);
}

pd_code dev_engine_sync(dev_engine *e, dev_status *st) {
  pthread_mutex_lock(&e->submit_mu);
  uint64_t seq = e->seq;
  pthread_mutex_unlock(&e->submit_mu);
  for (int d = 0; d < e->n; d++) {
    dev_exec_wait(e, d, seq);
    pd_code rc = e->backend->synchronize(e->backend, d, st);
    if (rc != PD_OK) return rc;
  }
  return PD_OK;
}

double dev_engine_busy_seconds(dev_engine *e, int device) {
  if (!e || device < 0 || device >= e->n) return 0;
  return (double)atomic_load_explicit(&e->execs[device].busy_ns, memory_order_relaxed) * 1e-9;
}

pd_code dev_engine_host_register(dev_engine *e, void *ptr, size_t bytes, dev_status *st) {
  if (!ptr || bytes == 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "host memory to register is %s; expected a non-empty range",
                     ptr ? "empty (0 bytes)" : "NULL");
  dev_backend *b = e->backend;
  if (b->struct_size < offsetof(dev_backend, host_unregister) + sizeof b->host_unregister ||
      !b->host_register)
    return PD_OK;
  return b->host_register(b, ptr, bytes, st);
}

void dev_engine_host_unregister(dev_engine *e, void *ptr) {
  dev_backend *b = e->backend;
  if (!ptr || b->struct_size < offsetof(dev_backend, host_unregister) + sizeof b->host_unregister ||
      !b->host_unregister)
    return;
  b->host_unregister(b, ptr);
}

pd_code dev_engine_memory_stats(dev_engine *e, int device, dev_memory_stats *out, dev_status *st) {
  if (device < 0 || device >= e->n)
    return dev_error(st, PD_INVALID_ARGUMENT, "device %d is out of range; expected 0 to %d", device,
                     e->n - 1);
  return e->backend->memory_stats(e->backend, device, out, st);
}

/* --- preparation ---------------------------------------------------------- */

static const char *attr_type_name(dev_attr_type t) {
  static const char *const names[] = {"none",   "int",   "float", "bool",     "string",
                                      "dtype",  "shape", "int list", "float list"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

static void list_attr_names(const dev_op_def *def, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  if (def->num_attrs == 0) {
    snprintf(buf, len, "no attributes");
    return;
  }
  for (int i = 0; i < def->num_attrs && off < len; i++) {
    int n = snprintf(buf + off, len - off, "%s%s", i ? ", " : "one of ", def->attrs[i].name);
    if (n < 0) break;
    off += (size_t)n;
  }
}

static void list_input_names(const dev_op_def *def, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = 0; i < def->num_inputs && off < len; i++) {
    int n = snprintf(buf + off, len - off, "%s%s%s", i ? ", " : "", def->inputs[i].name,
                     def->inputs[i].is_list ? "..." : "");
    if (n < 0) break;
    off += (size_t)n;
  }
}

/* Checks and resolves attributes into op->attrs (defaults filled), deep
 * copying strings and lists into one arena. */
static pd_code resolve_attrs(const dev_op_def *def, const dev_attr *attrs, int num_attrs,
                             dev_op *op, dev_status *st) {
  if (num_attrs < 0 || (num_attrs > 0 && !attrs))
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: malformed attribute list", def->name);
  bool seen[DEV_MAX_ATTRS] = {0};
  size_t arena = 0;
  for (int i = 0; i < def->num_attrs; i++) op->attrs[i] = def->attrs[i].default_value;
  for (int k = 0; k < num_attrs; k++) {
    const dev_attr *a = &attrs[k];
    if (!a->name)
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute %d has no name", def->name, k);
    int idx = dev_op_attr_index(def, a->name);
    if (idx < 0) {
      char names[256];
      list_attr_names(def, names, sizeof names);
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: unknown attribute '%.64s'; expected %s",
                       def->name, a->name, names);
    }
    if (seen[idx])
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute '%s' is given twice", def->name,
                       a->name);
    seen[idx] = true;
    dev_attr_type want = def->attrs[idx].type;
    if (a->value.type != want)
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute '%s' has type %s; expected %s",
                       def->name, a->name, attr_type_name(a->value.type), attr_type_name(want));
    const dev_attr_value *v = &a->value;
    switch (want) {
      case DEV_ATTR_STRING:
        if (v->u.s.len > DEV_ATTR_STRING_MAX || (v->u.s.len && !v->u.s.ptr))
          return dev_error(st, PD_INVALID_ARGUMENT,
                           "%s: attribute '%s' is a string of %zu bytes; the limit is %d",
                           def->name, a->name, v->u.s.len, DEV_ATTR_STRING_MAX);
        arena += v->u.s.len + 1;
        break;
      case DEV_ATTR_INT_LIST:
      case DEV_ATTR_FLOAT_LIST: {
        int n = want == DEV_ATTR_INT_LIST ? v->u.ilist.n : v->u.flist.n;
        const void *p = want == DEV_ATTR_INT_LIST ? (const void *)v->u.ilist.v : (const void *)v->u.flist.v;
        if (n < 0 || n > DEV_ATTR_LIST_MAX || (n && !p))
          return dev_error(st, PD_INVALID_ARGUMENT,
                           "%s: attribute '%s' is a list of %d values; expected 0 to %d",
                           def->name, a->name, n, DEV_ATTR_LIST_MAX);
        arena += (size_t)n * 8;
        break;
      }
      case DEV_ATTR_DTYPE:
        if (!dev_dtype_is_valid(v->u.dtype))
          return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute '%s' is dtype %d; expected a valid dtype",
                           def->name, a->name, (int)v->u.dtype);
        break;
      case DEV_ATTR_SHAPE: {
        dev_shape tmp;
        dev_status sst = DEV_STATUS_INIT;
        if (dev_shape_make(v->u.shape.rank, v->u.shape.dims, &tmp, &sst) != PD_OK)
          return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute '%s': %s", def->name, a->name,
                           sst.msg);
        break;
      }
      case DEV_ATTR_FLOAT:
      case DEV_ATTR_INT:
      case DEV_ATTR_BOOL:
      case DEV_ATTR_NONE:
        break;
    }
  }
  for (int i = 0; i < def->num_attrs; i++)
    if (!seen[i] && def->attrs[i].default_value.type == DEV_ATTR_NONE)
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute '%s' (%s) is required", def->name,
                       def->attrs[i].name, attr_type_name(def->attrs[i].type));
  if (arena) {
    op->attr_arena = malloc(arena);
    if (!op->attr_arena) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  char *p = op->attr_arena;
  for (int k = 0; k < num_attrs; k++) {
    int idx = dev_op_attr_index(def, attrs[k].name);
    dev_attr_value v = attrs[k].value;
    if (v.type == DEV_ATTR_STRING) {
      if (v.u.s.len) memcpy(p, v.u.s.ptr, v.u.s.len);
      p[v.u.s.len] = '\0';
      v.u.s.ptr = p;
      p += v.u.s.len + 1;
    } else if (v.type == DEV_ATTR_INT_LIST && v.u.ilist.n) {
      memcpy(p, v.u.ilist.v, (size_t)v.u.ilist.n * 8);
      v.u.ilist.v = (const int64_t *)(void *)p;
      p += (size_t)v.u.ilist.n * 8;
    } else if (v.type == DEV_ATTR_FLOAT_LIST && v.u.flist.n) {
      memcpy(p, v.u.flist.v, (size_t)v.u.flist.n * 8);
      v.u.flist.v = (const double *)(void *)p;
      p += (size_t)v.u.flist.n * 8;
    }
    op->attrs[idx] = v;
  }
  return PD_OK;
}

pd_code dev_op_prepare(dev_engine *e, const char *op_name, dev_tensor *const *inputs,
                       int num_inputs, const dev_attr *attrs, int num_attrs, dev_op **out,
                       dev_status *st) {
  const dev_op_def *def = dev_op_lookup(op_name);
  if (!def)
    return dev_error(st, PD_INVALID_ARGUMENT, "unknown op '%.64s'; expected a registered op name",
                     op_name ? op_name : "(null)");
  if (num_inputs < 0 || num_inputs > DEV_MAX_INPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: %d inputs; the limit is %d", def->name,
                     num_inputs, DEV_MAX_INPUTS);
  if (def->num_inputs == 0 ? num_inputs != 0 : dev_op_input_length(def, 0, num_inputs) < 0) {
    char names[200];
    list_input_names(def, names, sizeof names);
    int list_arg = -1, fixed = def->num_inputs;
    for (int i = 0; i < def->num_inputs; i++)
      if (def->inputs[i].is_list) list_arg = i;
    if (list_arg >= 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: got %d inputs; expected at least %d (%s, with '%s' a list of at least %d)",
                       def->name, num_inputs, fixed - 1 + def->inputs[list_arg].min_len, names,
                       def->inputs[list_arg].name, def->inputs[list_arg].min_len);
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: got %d inputs; expected %d (%s)", def->name,
                     num_inputs, fixed, fixed ? names : "none");
  }
  for (int i = 0; i < num_inputs; i++) {
    if (!inputs[i])
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: input %d is missing", def->name, i);
    if (inputs[i]->engine != e)
      return dev_error(st, PD_FAILED_PRECONDITION, "%s: input %d belongs to another engine",
                       def->name, i);
  }

  dev_op *op = calloc(1, sizeof *op);
  if (!op) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  op->def = def;
  op->engine = e;
  pd_code rc = resolve_attrs(def, attrs, num_attrs, op, st);
  if (rc != PD_OK) goto fail;

  const int n = e->n;
  pd_dtype in_dtype[DEV_MAX_INPUTS];
  for (int i = 0; i < num_inputs; i++) in_dtype[i] = inputs[i]->dtype;
  dev_shape *in_shape = malloc(sizeof(dev_shape) * (size_t)(num_inputs ? num_inputs : 1));
  dev_shape *out_shapes = malloc(sizeof(dev_shape) * (size_t)n * DEV_MAX_OUTPUTS);
  const dev_shape **all = NULL;
  dev_shape *all_store = NULL;
  pd_dtype out_dtype[DEV_MAX_OUTPUTS];
  if (!in_shape || !out_shapes) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    goto fail_infer;
  }
  if (def->flags & DEV_OP_MESH_INFER) {
    all = malloc(sizeof *all * (size_t)(num_inputs ? num_inputs : 1));
    all_store = malloc(sizeof(dev_shape) * (size_t)n * (size_t)(num_inputs ? num_inputs : 1));
    if (!all || !all_store) {
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
      goto fail_infer;
    }
    for (int i = 0; i < num_inputs; i++) {
      for (int d = 0; d < n; d++) all_store[i * n + d] = inputs[i]->comps[d].shape;
      all[i] = &all_store[i * n];
    }
  }
  for (int d = 0; d < n; d++) {
    for (int i = 0; i < num_inputs; i++) in_shape[i] = inputs[i]->comps[d].shape;
    dev_infer_ctx ic = {
        .op = def, .device = d, .num_devices = n, .num_inputs = num_inputs,
        .in_dtype = in_dtype, .in_shape = in_shape, .all_in_shape = all,
        .attrs = op->attrs, .num_outputs = def->num_outputs,
    };
    rc = def->infer(&ic, st);
    if (rc != PD_OK) {
      /* Name the component only when components differ. */
      goto fail_infer;
    }
    for (int o = 0; o < def->num_outputs; o++) {
      if (d == 0) out_dtype[o] = ic.out_dtype[o];
      else if (out_dtype[o] != ic.out_dtype[o]) {
        rc = dev_error(st, PD_INTERNAL, "%s: inferred dtypes differ between devices", def->name);
        goto fail_infer;
      }
      out_shapes[o * n + d] = ic.out_shape[o];
    }
  }
  op->num_inputs = num_inputs;
  for (int i = 0; i < num_inputs; i++) {
    dev_tensor_retain(inputs[i]);
    op->inputs[i] = inputs[i];
  }
  for (int o = 0; o < def->num_outputs; o++) {
    rc = dev_tensor_new(e, out_dtype[o], &out_shapes[o * n], &op->outputs[o], st);
    if (rc != PD_OK) {
      char msg[DEV_STATUS_MSG_MAX];
      snprintf(msg, sizeof msg, "%s", st ? st->msg : "");
      rc = dev_error(st, rc, "%s: output '%s': %s", def->name, def->outputs[o].name, msg);
      goto fail_infer;
    }
    op->num_outputs = o + 1;
    for (int d = 0; d < n; d++) atomic_store(&op->outputs[o]->comps[d].ready_seq, UINT64_MAX);
  }
  if (def->flags & DEV_OP_COLLECTIVE) {
    op->collective = e->backend->collective_create(e->backend, (dev_collective_kind)def->collective, n);
    if (!op->collective) {
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
      goto fail_infer;
    }
  }
  atomic_init(&op->pending, n);
  atomic_init(&op->inflight, n + 1);
  free(in_shape);
  free(out_shapes);
  free(all);
  free(all_store);
  *out = op;
  return PD_OK;

fail_infer:
  free(in_shape);
  free(out_shapes);
  free(all);
  free(all_store);
fail:
  op_free(op);
  return rc;
}

int dev_op_num_outputs(const dev_op *op) { return op->num_outputs; }
dev_tensor *dev_op_output(const dev_op *op, int i) {
  return i >= 0 && i < op->num_outputs ? op->outputs[i] : NULL;
}
uint64_t dev_op_output_bytes(const dev_op *op) {
  uint64_t s = 0;
  for (int i = 0; i < op->num_outputs; i++) s += op->outputs[i]->bytes;
  return s;
}

uint64_t dev_op_new_bytes(const dev_op *op) {
  uint64_t s = dev_op_output_bytes(op);
  if ((op->def->flags & DEV_OP_ALIASES_INPUT) && op->num_outputs > 0 && op->num_inputs > 0 &&
      op->outputs[0]->bytes == op->inputs[0]->bytes)
    s -= op->outputs[0]->bytes;
  return s;
}

void dev_op_submit(dev_engine *e, dev_op *op) {
  pthread_mutex_lock(&e->submit_mu);
  for (int d = 0; d < e->n; d++) {
    if (!exec_reserve(&e->execs[d])) {
      pthread_mutex_unlock(&e->submit_mu);
      dev_op_abandon(op, PD_RESOURCE_EXHAUSTED, "host out of memory while queueing the op");
      return;
    }
  }
  op->seq = ++e->seq;
  for (int o = 0; o < op->num_outputs; o++)
    for (int d = 0; d < e->n; d++) atomic_store(&op->outputs[o]->comps[d].ready_seq, op->seq);
  for (int d = 0; d < e->n; d++) exec_push(&e->execs[d], op);
  pthread_mutex_unlock(&e->submit_mu);
}

void dev_op_abandon(dev_op *op, pd_code code, const char *msg) {
  for (int o = 0; o < op->num_outputs; o++)
    for (int d = 0; d < op->outputs[o]->n; d++) {
      dev_component_set_error(&op->outputs[o]->comps[d], code, msg);
      atomic_store(&op->outputs[o]->comps[d].ready_seq, 0);
    }
  op_free(op);
}

pd_code dev_execute(dev_engine *e, const char *op_name, dev_tensor *const *inputs,
                    int num_inputs, const dev_attr *attrs, int num_attrs, dev_tensor **outputs,
                    int *num_outputs, dev_status *st) {
  const dev_op_def *def = dev_op_lookup(op_name);
  if (def && *num_outputs < def->num_outputs)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s has %d outputs; room was given for %d",
                     def->name, def->num_outputs, *num_outputs);
  dev_op *op;
  pd_code rc = dev_op_prepare(e, op_name, inputs, num_inputs, attrs, num_attrs, &op, st);
  if (rc != PD_OK) return rc;
  int n = op->num_outputs;
  for (int i = 0; i < n; i++) {
    dev_tensor_retain(op->outputs[i]);
    outputs[i] = op->outputs[i];
  }
  dev_op_submit(e, op);
  *num_outputs = n;
  return PD_OK;
}
