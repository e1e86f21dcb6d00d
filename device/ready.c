/* Tensor readiness, in one place: when a component counts as computed (its
 * device has published the op's seq), its failed state, waiting for it
 * (with or without a deadline), the callbacks that fire when a tensor
 * becomes ready, and pending tensors (checkpoint loads), which are not ready
 * until dev_tensor_complete whatever their components' seqs say.
 *
 * Each component carries the seq of the op that computes it (ready_seq: 0
 * for an upload, UINT64_MAX while its op is prepared but not submitted);
 * each device publishes the largest seq it has finished (dev__ready). The
 * executor publishes when its kernel returns (CPU); on a backend with fences
 * the device's completion thread publishes once the device has finished the
 * op (complete.c), so "ready" always means finished on the device. A
 * component's error is written before its seq is published, or, for an
 * error the device reports late, by the completion thread under the
 * device's mutex (dev__component_set_late_error).
 *
 * It also answers dev_engine_watch, a device's progress for the daemon's
 * liveness, from the same counters.
 *
 * Calls down only (tensor.c for references and buffers); the executor files
 * call in. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "exec_int.h"
#include "mesh/mesh_int.h"

/* A dev_tensor_notify registration: one group per call, with one waiter per
 * device that had not finished when it was made. Each waiter leaves its
 * device's list before it counts down, so the last count frees it all. */
typedef struct notify_group notify_group;

struct dev__waiter {
  uint64_t seq;
  notify_group *g;
  struct dev__waiter *next;
};

struct notify_group {
  atomic_int remaining;
  dev_tensor *t;
  dev_ready_fn fn;
  void *arg;
  dev__waiter w[];
};

/* --- failed state --------------------------------------------------------- */

void dev__component_set_error(dev_component *c, pd_code code, const char *msg) {
  dev__buffer_release(c->buf);
  c->buf = NULL;
  free(c->msg);
  c->msg = strdup(msg ? msg : "");
  c->code = code;
}

void dev__component_set_late_error(dev_component *c, pd_code code,
                                   const char *msg) {
  if (c->code != PD_OK) return;
  char *m = strdup(msg);
  free(c->msg);
  c->msg = m; /* NULL on host OOM: readers print "" */
  c->code = code;
}

/* --- one device's progress ------------------------------------------------ */

void dev__ready_init(dev__ready *r, pthread_mutex_t *mu) {
  r->mu = mu;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca,
                            CLOCK_MONOTONIC); /* for dev__exec_wait_until */
  pthread_cond_init(&r->done_cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&r->done_seq, 0);
  atomic_init(&r->waiters, 0);
  atomic_init(&r->notify_count, 0);
  r->notify = r->notify_tail = NULL;
}

void dev__ready_destroy(dev__ready *r) { pthread_cond_destroy(&r->done_cv); }

uint64_t dev__exec_done(dev_engine *e, int device) {
  return atomic_load(&e->execs[device].ready.done_seq);
}

void dev_exec_wait(dev_engine *e, int device, uint64_t seq) {
  (void)dev__exec_wait_until(e, device, seq, 0);
}

double dev_monotonic_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool dev__exec_wait_until(dev_engine *e, int device, uint64_t seq,
                          double deadline) {
  dev__ready *r = &e->execs[device].ready;
  if (atomic_load(&r->done_seq) >= seq) return true;
  struct timespec ts;
  if (deadline > 0) {
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
  }
  bool done = true;
  pthread_mutex_lock(r->mu);
  atomic_fetch_add(&r->waiters, 1);
  while (atomic_load(&r->done_seq) < seq) {
    if (deadline > 0) {
      if (pthread_cond_timedwait(&r->done_cv, r->mu, &ts) == ETIMEDOUT &&
          atomic_load(&r->done_seq) < seq) {
        done = false;
        break;
      }
    } else {
      pthread_cond_wait(&r->done_cv, r->mu);
    }
  }
  atomic_fetch_sub(&r->waiters, 1);
  pthread_mutex_unlock(r->mu);
  return done;
}

/* --- watching progress (dev_engine_watch) --------------------------------- */

/* Only atomics are read here (done_seq, run_seq, beats, the engine's
 * last_seq), never under a lock: the watcher must answer while an executor
 * is stuck holding its mutex. A sample that races an op's start or end
 * reads as a change, which is progress anyway. */
double dev_engine_watch(dev_engine *e, int device, dev_progress *p,
                        double now) {
  if (!e || device < 0 || device >= e->n) {
    p->state = DEV_PROGRESS_IDLE;
    return 0;
  }
  dev_exec *x = &e->execs[device];
  /* The last op pushed to THIS device: ops on other devices' sets never
   * reach it (issue #17). */
  uint64_t last = atomic_load_explicit(&x->pushed_seq, memory_order_relaxed);
  uint64_t done = atomic_load(&x->ready.done_seq);
  uint64_t run = atomic_load_explicit(&x->run_seq, memory_order_relaxed);
  uint64_t beats = atomic_load_explicit(&x->beats, memory_order_relaxed);
  dev_progress_state state = done >= last ? DEV_PROGRESS_IDLE
                             : run > done ? DEV_PROGRESS_RUNNING
                                          : DEV_PROGRESS_WAITING;
  bool moved = done != p->done || run != p->run || beats != p->beats;
  if (state == DEV_PROGRESS_IDLE || p->state == DEV_PROGRESS_IDLE || moved)
    p->since = now; /* idle, work that just came, or progress */
  p->done = done;
  p->run = run;
  p->beats = beats;
  p->state = state;
  return state == DEV_PROGRESS_IDLE || now < p->since ? 0 : now - p->since;
}

/* --- notify callbacks ----------------------------------------------------- */

static void notify_fire(notify_group *g) {
  pd_code code = PD_OK;
  for (int d = 0; d < g->t->n && code == PD_OK; d++) code = g->t->comps[d].code;
  g->fn(g->arg, g->t, code);
  dev_tensor_release(g->t);
  free(g);
}

/* Inserts w into r's notify list in seq order (*r->mu held). Registrations
 * come mostly in submission order and append at the tail; one for an older
 * op walks from the head. */
static void notify_insert_locked(dev__ready *r, dev__waiter *w) {
  if (!r->notify_tail || r->notify_tail->seq <= w->seq) {
    w->next = NULL;
    if (r->notify_tail)
      r->notify_tail->next = w;
    else
      r->notify = w;
    r->notify_tail = w;
    return;
  }
  dev__waiter **pp = &r->notify;
  while ((*pp)->seq <= w->seq) pp = &(*pp)->next;
  w->next = *pp;
  *pp = w;
}

/* Adds g's waiter for device r (next free slot *used) unless the device has
 * finished `seq` already. */
static void notify_add(dev__ready *r, notify_group *g, int *used,
                       uint64_t seq) {
  pthread_mutex_lock(r->mu);
  /* Count first, then look at done_seq: the publisher stores done_seq,
   * then looks at the count, so one of the two sees the other (a waiter
   * added after the publisher looked would wait for the next op). */
  atomic_fetch_add(&r->notify_count, 1);
  if (atomic_load(&r->done_seq) < seq) {
    dev__waiter *w = &g->w[(*used)++];
    w->seq = seq;
    w->g = g;
    notify_insert_locked(r, w);
    atomic_fetch_add(&g->remaining, 1);
  } else {
    atomic_fetch_sub(&r->notify_count, 1);
  }
  pthread_mutex_unlock(r->mu);
}

/* Defers a registration on a pending tensor until dev_tensor_complete.
 * False when the tensor is not pending (any more): register as usual. */
static bool pending_defer(dev_tensor *t, dev__pending_reg *r) {
  dev__pending *p = t->pend;
  pthread_mutex_lock(&p->mu);
  bool deferred = atomic_load_explicit(&t->pending, memory_order_relaxed);
  if (deferred) {
    r->next = NULL;
    if (p->regs_tail)
      p->regs_tail->next = r;
    else
      p->regs = r;
    p->regs_tail = r;
    dev_tensor_retain(t);
  }
  pthread_mutex_unlock(&p->mu);
  return deferred;
}

pd_code dev_tensor_notify(dev_tensor *t, dev_ready_fn fn, void *arg,
                          dev_status *st) {
  dev_engine *e = t->engine;
  if (atomic_load_explicit(&t->pending, memory_order_acquire)) {
    dev__pending_reg *r = malloc(sizeof *r);
    if (!r) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    r->fn = fn;
    r->arg = arg;
    if (pending_defer(t, r)) return PD_OK;
    free(r); /* completed meanwhile: its components are ready (seq 0) */
  }
  for (int d = 0; d < t->n; d++)
    if (atomic_load(&t->comps[d].ready_seq) == UINT64_MAX)
      return dev_error(st, PD_FAILED_PRECONDITION,
                       "tensor's op was prepared but never submitted");
  notify_group *g = malloc(sizeof *g + sizeof(dev__waiter) * (size_t)t->n);
  if (!g) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  dev_tensor_retain(t);
  g->t = t;
  g->fn = fn;
  g->arg = arg;
  /* One extra count held by this function, so the group cannot fire while
   * waiters are still being added. */
  atomic_init(&g->remaining, 1);
  int used = 0;
  for (int d = 0; d < t->n; d++) /* component d waits on its own device */
    notify_add(&e->execs[dev__comp_device(t, d)].ready, g, &used,
               atomic_load(&t->comps[d].ready_seq));
  if (atomic_fetch_sub(&g->remaining, 1) == 1) notify_fire(g);
  return PD_OK;
}

/* Fires the notify waiters of r whose op has finished. */
static void fire_notify(dev__ready *r, uint64_t done) {
  dev__waiter *ready = NULL;
  pthread_mutex_lock(r->mu);
  while (r->notify && r->notify->seq <= done) {
    dev__waiter *w = r->notify;
    r->notify = w->next;
    w->next = ready;
    ready = w;
    atomic_fetch_sub(&r->notify_count, 1);
  }
  if (!r->notify) r->notify_tail = NULL;
  pthread_mutex_unlock(r->mu);
  while (ready) {
    dev__waiter *w = ready;
    ready = w->next;
    notify_group *g = w->g;
    if (atomic_fetch_sub(&g->remaining, 1) == 1) notify_fire(g);
  }
}

void dev__ready_publish(dev__ready *r, uint64_t seq) {
  atomic_store(&r->done_seq, seq);
  if (atomic_load(&r->waiters) > 0) {
    pthread_mutex_lock(r->mu);
    pthread_cond_broadcast(&r->done_cv);
    pthread_mutex_unlock(r->mu);
  }
  if (atomic_load(&r->notify_count) > 0) fire_notify(r, seq);
}

/* --- tensors -------------------------------------------------------------- */

bool dev_tensor_is_ready(const dev_tensor *t) {
  if (atomic_load_explicit(&((dev_tensor *)t)->pending, memory_order_acquire))
    return false;
  for (int d = 0; d < t->n; d++)
    if (dev__exec_done(t->engine, dev__comp_device(t, d)) <
        atomic_load(&((dev_tensor *)t)->comps[d].ready_seq))
      return false;
  return true;
}

pd_code dev_tensor_wait(dev_tensor *t, dev_status *st) {
  return dev_tensor_wait_until(t, 0, st);
}

/* Blocks while `t` is pending; false when the deadline (<= 0: none) passed
 * first. */
static bool pending_wait(dev_tensor *t, double deadline) {
  dev__pending *p = t->pend;
  struct timespec ts;
  if (deadline > 0) {
    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
  }
  bool done = true;
  pthread_mutex_lock(&p->mu);
  while (atomic_load_explicit(&t->pending, memory_order_relaxed)) {
    if (deadline <= 0) {
      pthread_cond_wait(&p->cv, &p->mu);
    } else if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT &&
               atomic_load_explicit(&t->pending, memory_order_relaxed)) {
      done = false;
      break;
    }
  }
  pthread_mutex_unlock(&p->mu);
  return done;
}

pd_code dev_tensor_wait_until(dev_tensor *t, double deadline, dev_status *st) {
  dev_backend *b = t->engine->backend;
  if (atomic_load_explicit(&t->pending, memory_order_acquire) &&
      !pending_wait(t, deadline))
    return dev_error(st, PD_DEADLINE_EXCEEDED,
                     "deadline passed before the tensor was loaded (its "
                     "checkpoint load goes on)");
  for (int d = 0; d < t->n; d++) {
    uint64_t seq = atomic_load(&t->comps[d].ready_seq);
    if (seq == UINT64_MAX)
      return dev_error(st, PD_FAILED_PRECONDITION,
                       "tensor's op was prepared but never submitted");
    if (!dev__exec_wait_until(t->engine, dev__comp_device(t, d), seq, deadline))
      return dev_error(
          st, PD_DEADLINE_EXCEEDED,
          "deadline passed before the tensor was computed (waiting on %s)",
          b->device_name(b, dev__comp_device(t, d)));
  }
  for (int d = 0; d < t->n; d++)
    if (t->comps[d].code != PD_OK)
      return dev_error(st, t->comps[d].code, "%s",
                       t->comps[d].msg ? t->comps[d].msg : "");
  /* A backend with completion fences (CUDA) marks a component ready only
   * once its device finished it, so there is nothing left to wait for;
   * synchronizing would also wait for every op queued after this tensor's. */
  if (t->engine->fenced) return PD_OK;
  for (int d = 0; d < t->n; d++)
    PD_TRY(b->synchronize(b, dev__comp_device(t, d), st));
  return PD_OK;
}

/* --- pending tensors (checkpoint loads) ------------------------------------ */

bool dev_tensor_is_pending(const dev_tensor *t) {
  return atomic_load_explicit(&((dev_tensor *)t)->pending,
                              memory_order_acquire);
}

void dev_tensor_complete(dev_tensor *t, pd_code code, const char *msg) {
  dev__pending *p = t->pend;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  if (!atomic_load_explicit(&t->pending, memory_order_relaxed)) {
    pthread_mutex_unlock(&p->mu);
    return;
  }
  if (code != PD_OK)
    for (int d = 0; d < t->n; d++)
      dev__component_set_error(&t->comps[d], code, msg);
  /* The coordinator's hook before anyone can see it complete: an op
   * reading it (submitted once pending reads false) reaches the ranks after
   * the completion. */
  if (t->engine->mesh) dev__mesh_tensor_completed(t, code, msg);
  /* Release order: whoever sees pending false sees the codes above. */
  atomic_store_explicit(&t->pending, false, memory_order_release);
  dev__pending_reg *r = p->regs;
  p->regs = p->regs_tail = NULL;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  while (r) { /* the components are ready now (seq 0): fire as notify_fire */
    dev__pending_reg *next = r->next;
    r->fn(r->arg, t, code);
    dev_tensor_release(t);
    free(r);
    r = next;
  }
}
