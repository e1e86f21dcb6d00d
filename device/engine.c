/* The engine: creating it over a backend (cpu, or cuda through dev_cuda.h)
 * with one executor thread per device, plus a completion thread per device
 * on a backend with fences; submitting prepared ops to every device in the
 * one global order; synchronizing; and the engine's accessors.
 *
 * Where the rest lives: preparation (validation, attributes, inference) in
 * prepare.c, the executor thread in exec.c, completion behind fences in
 * complete.c, readiness (waits, notify callbacks) in ready.c, tensors in
 * tensor.c and transfer.c. One op: dev_op_prepare (prepare.c) ->
 * dev_op_submit (here) -> dev__exec_main/run_op (exec.c) -> kernel ->
 * dev__ready_publish (ready.c), via dev__complete_main (complete.c) on CUDA. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_cuda.h"
#include "exec_int.h"
#include "mesh/mesh_int.h"

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
  bool has =
      b->struct_size >= offsetof(dev_backend, healthy) + sizeof b->healthy &&
      b->healthy;
  return !has || b->healthy(b, device);
}

static pd_code engine_create(dev_backend *b, dev__mesh *mesh, dev_engine **out,
                             dev_status *st);

pd_code dev_engine_create(const dev_engine_config *cfg, dev_engine **out,
                          dev_status *st) {
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
    if (cfg->struct_size >=
        offsetof(dev_engine_config, blas_threads) + sizeof cfg->blas_threads) {
      cc.memory_reserve = cfg->memory_reserve;
      cc.blas_threads = cfg->blas_threads;
    }
    rc = dev_cpu_backend_create(&cc, &b, st);
  } else if (strcmp(name, "cuda") == 0) {
#ifdef PARADEV_HAVE_CUDA
    dev_cuda_config cc = DEV_CUDA_CONFIG_INITIALIZER;
    if (cfg->struct_size >=
        offsetof(dev_engine_config, mesh) + sizeof cfg->mesh)
      cc.mesh = cfg->mesh;
    cc.memory_limit = cfg->memory_limit;
    if (cfg->struct_size >= offsetof(dev_engine_config, cuda_collectives) +
                                sizeof cfg->cuda_collectives) {
      if (cfg->cuda_collective_timeout_ms < 0)
        return dev_error(
            st, PD_INVALID_ARGUMENT,
            "cuda collective timeout is %d ms; expected a positive number of "
            "milliseconds, or 0 for the default (300000)",
            cfg->cuda_collective_timeout_ms);
      cc.allow_tf32 = cfg->cuda_allow_tf32;
      cc.pool_release_threshold = cfg->cuda_pool_release_threshold;
      cc.collective_timeout_ms = cfg->cuda_collective_timeout_ms;
      cc.collectives = cfg->cuda_collectives;
    }
    if (cfg->struct_size >= offsetof(dev_engine_config, memory_reserve) +
                                sizeof cfg->memory_reserve)
      cc.memory_reserve = cfg->memory_reserve;
    rc = dev_cuda_backend_create(&cc, &b, st);
#else
    rc = dev_error(st, PD_UNAVAILABLE,
                   "the cuda backend is not built into this engine; run with "
                   "--backend=cpu");
#endif
  } else {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "unknown backend '%s'; expected cpu or cuda", name);
  }
  if (rc != PD_OK) return rc;
  const dev_mesh_config *mc =
      cfg->struct_size >= offsetof(dev_engine_config, mesh_config) +
                              sizeof cfg->mesh_config
          ? cfg->mesh_config
          : NULL;
  if (mc && mc->world_size > 1) { /* issue #16: a mesh across machines */
    dev_backend *w;
    dev__mesh *m;
    rc = dev__mesh_backend_create(b, mc, &w, &m, st);
    if (rc != PD_OK) {
      b->destroy(b);
      return rc;
    }
    return engine_create(w, m, out, st);
  }
  return engine_create(b, NULL, out, st);
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
    if (e->execs[i].completer_started)
      pthread_join(e->execs[i].completer, NULL);
}

/* Frees what dev_engine_create_with_backend set up for one device. */
static void exec_free(dev_exec *x) {
  pthread_mutex_destroy(&x->mu);
  pthread_cond_destroy(&x->work_cv);
  dev__ready_destroy(&x->ready);
  if (x->fenced) pthread_cond_destroy(&x->fence_cv);
  free(x->ring);
  free(x->fring);
  for (int i = 0; i < x->nlate; i++) free(x->late[i].msg);
  free(x->late);
}

static void engine_free_execs(dev_engine *e, int n) {
  for (int i = 0; i < n; i++) exec_free(&e->execs[i]);
}

pd_code dev_engine_create_with_backend(dev_backend *b, dev_engine **out,
                                       dev_status *st) {
  return engine_create(b, NULL, out, st);
}

/* dev_engine_create_with_backend, with the mesh state of a wrapper backend
 * (mesh/backend.c) or NULL, set before the threads start. */
static pd_code engine_create(dev_backend *b, dev__mesh *mesh, dev_engine **out,
                             dev_status *st) {
  dev_registry_init();
  bool fenced = b->struct_size >= offsetof(dev_backend, fence_release) +
                                      sizeof b->fence_release &&
                b->fence_record && b->fence_wait && b->fence_release;
  dev_engine *e = calloc(1, sizeof *e);
  if (!e) goto fail_backend;
  e->backend = b;
  e->mesh = mesh;
  e->n = b->num_devices;
  dev_devset_all(e, &e->all);
  e->fenced = fenced;
  e->execs = calloc((size_t)e->n, sizeof *e->execs);
  if (!e->execs) goto fail_engine;
  pthread_mutex_init(&e->submit_mu, NULL);
  pthread_mutex_init(&e->op_mu, NULL);
  int started = 0;
  for (; started < e->n; started++) {
    dev_exec *x = &e->execs[started];
    x->engine = e;
    x->device = started;
    x->fenced = fenced;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->work_cv, NULL);
    dev__ready_init(&x->ready, &x->mu);
    if (fenced) pthread_cond_init(&x->fence_cv, NULL);
    atomic_init(&x->busy_ns, 0);
    atomic_init(&x->run_seq, 0);
    atomic_init(&x->beats, 0);
    if (pthread_create(&x->thread, NULL, dev__exec_main, x) != 0) {
      exec_free(x);
      goto fail_threads;
    }
    if (fenced) {
      if (pthread_create(&x->completer, NULL, dev__complete_main, x) != 0) {
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
  pthread_mutex_destroy(&e->op_mu);
  free(e->execs);
fail_engine:
  free(e);
fail_backend:
  b->destroy(b);
  return dev_error(st, PD_RESOURCE_EXHAUSTED,
                   "could not start the engine's threads");
}

void dev_engine_destroy(dev_engine *e) {
  if (!e) return;
  engine_stop_threads(e, e->n);
  engine_free_execs(e, e->n);
  pthread_mutex_destroy(&e->submit_mu);
  dev__op_pool_free(e);
  e->backend->destroy(e->backend);
  free(e->execs);
  free(e);
}

pd_code dev_engine_sync(dev_engine *e, dev_status *st) {
  /* Each device waits for the last op pushed to IT: an op on a subset never
   * reaches the other devices, whose done_seq stops below e->seq. */
  uint64_t seq[PD_MAX_DEVICES];
  pthread_mutex_lock(&e->submit_mu);
  for (int d = 0; d < e->n; d++)
    seq[d] =
        atomic_load_explicit(&e->execs[d].pushed_seq, memory_order_relaxed);
  pthread_mutex_unlock(&e->submit_mu);
  for (int d = 0; d < e->n; d++) {
    dev_exec_wait(e, d, seq[d]);
    PD_TRY(e->backend->synchronize(e->backend, d, st));
  }
  return PD_OK;
}

double dev_engine_busy_seconds(dev_engine *e, int device) {
  if (!e || device < 0 || device >= e->n) return 0;
  return (double)atomic_load_explicit(&e->execs[device].busy_ns,
                                      memory_order_relaxed) *
         1e-9;
}

pd_code dev_engine_host_register(dev_engine *e, void *ptr, size_t bytes,
                                 dev_status *st) {
  if (!ptr || bytes == 0)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "host memory to register is %s; expected a non-empty range",
        ptr ? "empty (0 bytes)" : "NULL");
  dev_backend *b = e->backend;
  if (b->struct_size <
          offsetof(dev_backend, host_unregister) + sizeof b->host_unregister ||
      !b->host_register)
    return PD_OK;
  return b->host_register(b, ptr, bytes, st);
}

void dev_engine_host_unregister(dev_engine *e, void *ptr) {
  dev_backend *b = e->backend;
  if (!ptr ||
      b->struct_size <
          offsetof(dev_backend, host_unregister) + sizeof b->host_unregister ||
      !b->host_unregister)
    return;
  b->host_unregister(b, ptr);
}

pd_code dev_engine_memory_stats(dev_engine *e, int device,
                                dev_memory_stats *out, dev_status *st) {
  if (device < 0 || device >= e->n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "device %d is out of range; expected 0 to %d", device,
                     e->n - 1);
  return e->backend->memory_stats(e->backend, device, out, st);
}

/* Refuses an op with an input still loading: a caller's bug (device.h:
 * hold such ops until the input completes); running it would read a
 * half-loaded buffer. True when refused (the op is abandoned). */
static bool dev__refuse_pending(dev_op *op) {
  if (!dev_op_has_pending_input(op, NULL)) return false;
  dev_op_abandon(op, PD_FAILED_PRECONDITION,
                 "an input of the op is still loading (a pending tensor); "
                 "hold the op until dev_tensor_complete");
  return true;
}

/* One op is a batch of one: one path hands out op numbers, publishes the
 * last one for the progress watch and pushes to the executors. */
void dev_op_submit(dev_engine *e, dev_op *op) {
  dev_op_submit_batch(e, &op, 1);
}

/* --- batch submission (issue #15) ---------------------------------------- */

/* dev_op_submit_batch; with `seq` (not 0) the batch is one op given that
 * seq (dev_op_submit_seq): refused with INVALID_ARGUMENT when it is not
 * above the last one. */
static pd_code submit_batch(dev_engine *e, dev_op *const *ops, int n,
                            uint64_t seq, dev_status *st);

void dev_op_submit_batch(dev_engine *e, dev_op *const *ops, int n) {
  submit_batch(e, ops, n, 0, NULL);
}

pd_code dev_op_submit_seq(dev_engine *e, dev_op *op, uint64_t seq,
                          dev_status *st) {
  if (seq == 0) {
    dev_op_abandon(op, PD_INVALID_ARGUMENT, "op seq 0; expected 1 or more");
    return dev_error(st, PD_INVALID_ARGUMENT, "op seq 0; expected 1 or more");
  }
  if (dev_op_has_pending_input(op, NULL)) { /* abandoned, as submit does */
    dev__refuse_pending(op);
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "an input of the op is still loading (a pending "
                     "tensor); complete it before the op");
  }
  return submit_batch(e, &op, 1, seq, st);
}

static pd_code submit_batch(dev_engine *e, dev_op *const *ops, int n,
                            uint64_t seq, dev_status *st) {
  /* Ops with a pending input are refused one by one (dev__refuse_pending);
   * the rest go out in one reservation and one push per device. Up to
   * DEV_SUBMIT_BATCH_MAX at a time (the arrays below). */
  while (n > 0) {
    dev_op *go[DEV_SUBMIT_BATCH_MAX];
    int k = 0, used = 0;
    for (; used < n && k < DEV_SUBMIT_BATCH_MAX; used++)
      if (!dev__refuse_pending(ops[used])) go[k++] = ops[used];
    ops += used;
    n -= used;
    if (k == 0) continue;
    /* Each device's ops of the batch, in batch order (their indices in
     * go[]): only the devices of an op's set run it (issue #17). Every
     * list is made here, before the first push: once an op is pushed to
     * the last of its devices it may run there, finish on all of them and
     * go back to the free list (dev__op_recycle), where another thread's
     * prepare may take it and give it another set. Reading its set after
     * a push would then hand a device an op that is not its own, out of
     * order: a collective whose peers wait in another op. */
    uint8_t mine_i[PD_MAX_DEVICES][DEV_SUBMIT_BATCH_MAX];
    size_t m[PD_MAX_DEVICES] = {0};
    for (int i = 0; i < k; i++)
      for (int j = 0; j < go[i]->set.n; j++) {
        const int d = go[i]->set.dev[j];
        mine_i[d][m[d]++] = (uint8_t)i;
      }
    pthread_mutex_lock(&e->submit_mu);
    if (seq && seq <= e->seq) { /* a rank's replay: the seq must go up */
      const uint64_t last = e->seq;
      pthread_mutex_unlock(&e->submit_mu);
      char msg[160];
      snprintf(msg, sizeof msg,
               "op seq %llu is not above the engine's last seq %llu; "
               "expected the coordinator's seqs in increasing order",
               (unsigned long long)seq, (unsigned long long)last);
      dev_op_abandon(go[0], PD_INVALID_ARGUMENT, msg);
      return dev_error(st, PD_INVALID_ARGUMENT, "%s", msg);
    }
    if (seq) e->seq = seq - 1;
    bool room = true;
    for (int d = 0; d < e->n && room; d++)
      if (m[d]) room = dev__exec_reserve_n(&e->execs[d], m[d]);
    if (!room) {
      pthread_mutex_unlock(&e->submit_mu);
      for (int i = 0; i < k; i++)
        dev_op_abandon(go[i], PD_RESOURCE_EXHAUSTED,
                       "host out of memory while queueing the op");
      if (seq)
        return dev_error(st, PD_RESOURCE_EXHAUSTED,
                         "host out of memory while queueing the op");
      continue;
    }
    for (int i = 0; i < k; i++) {
      dev_op *op = go[i];
      op->seq = ++e->seq;
      /* A collective's holds (and those of a function call holding one)
       * stay with the op: peers read each other's components. */
      op->per_device_release =
          !(op->def->flags & (DEV_OP_COLLECTIVE | DEV_OP_PLACEMENT)) &&
          !(op->fn_call && ((const dev__fn_call *)op->fn_call)->collectives);
      for (int o = 0; o < op->num_outputs; o++)
        for (int d = 0; d < op->outputs[o]->n; d++)
          atomic_store(&op->outputs[o]->comps[d].ready_seq, op->seq);
      /* The coordinator's hook, in seq order, before any push. */
      if (e->mesh) dev__mesh_op_submitted(e, op);
    }
    atomic_store_explicit(&e->last_seq, e->seq, memory_order_relaxed);
    /* The one-order rule: seqs were handed out above in batch order under
     * submit_mu, and each device receives its ops of the batch in that
     * order, so any two ops that share devices reach every shared device
     * in the same relative order (the lists above). */
    uint64_t last[PD_MAX_DEVICES];
    for (int d = 0; d < e->n; d++)
      last[d] = m[d] ? go[mine_i[d][m[d] - 1]]->seq : 0;
    for (int d = 0; d < e->n; d++) {
      if (!m[d]) continue;
      dev_op *mine[DEV_SUBMIT_BATCH_MAX];
      for (size_t x = 0; x < m[d]; x++) mine[x] = go[mine_i[d][x]];
      atomic_store_explicit(&e->execs[d].pushed_seq, last[d],
                            memory_order_relaxed);
      dev__exec_push_n(&e->execs[d], mine, m[d]);
    }
    pthread_mutex_unlock(&e->submit_mu);
  }
  return PD_OK;
}

pd_code dev_execute(dev_engine *e, const char *op_name,
                    dev_tensor *const *inputs, int num_inputs,
                    const dev_attr *attrs, int num_attrs, dev_tensor **outputs,
                    int *num_outputs, dev_status *st) {
  return dev_execute_on(e, NULL, op_name, inputs, num_inputs, attrs, num_attrs,
                        outputs, num_outputs, st);
}

pd_code dev_execute_on(dev_engine *e, const dev_devset *set,
                       const char *op_name, dev_tensor *const *inputs,
                       int num_inputs, const dev_attr *attrs, int num_attrs,
                       dev_tensor **outputs, int *num_outputs, dev_status *st) {
  const dev_op_def *def = dev_op_lookup(op_name);
  if (def && *num_outputs < def->num_outputs)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s has %d outputs; room was given for %d", def->name,
                     def->num_outputs, *num_outputs);
  dev_op *op;
  PD_TRY(dev_op_prepare_on(e, set, op_name, inputs, num_inputs, attrs,
                           num_attrs, &op, st));
  int n = op->num_outputs;
  if (n > *num_outputs) { /* a list output longer than the room given */
    dev_op_abandon(op, PD_CANCELLED, "not submitted");
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s yields %d outputs here; room was given for %d",
                     def->name, n, *num_outputs);
  }
  for (int i = 0; i < n; i++) {
    dev_tensor_retain(op->outputs[i]);
    outputs[i] = op->outputs[i];
  }
  dev_op_submit(e, op);
  *num_outputs = n;
  return PD_OK;
}
