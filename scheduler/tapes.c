/* A session's gradient tapes (scheduler.h, "Gradient tapes"): starting,
 * watching, deleting, and computing a gradient, whose ops the tape's
 * executor here prepares and appends to the session's queue behind the
 * forward ops they differentiate. Under the session's mu throughout. */
#include <stdlib.h>

#include "sched_int.h"

/* The tape of `id` (ss->mu held), or NULL after a NOT_FOUND. */
static sched_tape_ent *sched_tape_find_locked(sched_session *ss, uint64_t id,
                                              dev_status *st) {
  for (int i = 0; i < ss->num_tapes; i++)
    if (ss->tapes[i].id == id) return &ss->tapes[i];
  dev_error(st, PD_NOT_FOUND,
            "gradient tape %llu not found in this session (never started, "
            "or deleted)",
            (unsigned long long)id);
  return NULL;
}

/* Room in ss->tapes for one more tape `tape_id` (ss->mu held). */
static pd_code sched_tape_room_locked(sched_session *ss, uint64_t tape_id,
                                      dev_status *st) {
  if (ss->closed) return sched_closed_error(ss, st);
  for (int i = 0; i < ss->num_tapes; i++)
    if (ss->tapes[i].id == tape_id)
      return dev_error(st, PD_ALREADY_EXISTS,
                       "gradient tape %llu already exists in this session "
                       "(delete it first, or choose another id)",
                       (unsigned long long)tape_id);
  if (ss->num_tapes >= SCHED_MAX_TAPES)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the session holds %d gradient tapes, the limit "
                     "(delete tapes it no longer needs)",
                     SCHED_MAX_TAPES);
  if (ss->num_tapes == ss->cap_tapes) {
    int cap = ss->cap_tapes ? ss->cap_tapes * 2 : 4;
    sched_tape_ent *nt = realloc(ss->tapes, sizeof(*nt) * (size_t)cap);
    if (!nt) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    ss->tapes = nt;
    ss->cap_tapes = cap;
  }
  return PD_OK;
}

pd_code sched_tape_start(sched_session *ss, uint64_t tape_id, bool persistent,
                         dev_status *st) {
  if (tape_id == 0)
    return dev_error(st, PD_INVALID_ARGUMENT, "tape id 0 is reserved");
  pthread_mutex_lock(&ss->mu);
  dev_tape *tape = NULL;
  pd_code c = sched_tape_room_locked(ss, tape_id, st);
  if (c == PD_OK) c = dev_tape_create(ss->owner->engine, persistent, &tape, st);
  if (c == PD_OK) ss->tapes[ss->num_tapes++] = (sched_tape_ent){tape_id, tape};
  pthread_mutex_unlock(&ss->mu);
  return c;
}

/* All or nothing: every id must be live before any is watched. */
static pd_code sched_tape_watch_locked(sched_session *ss, sched_tape_ent *te,
                                       const uint64_t *ids, int n,
                                       dev_status *st) {
  for (int i = 0; i < n; i++)
    if (!sched_htab_find(&ss->handles, ids[i]))
      return sched_not_found(ids[i], st);
  pd_code c = PD_OK;
  for (int i = 0; c == PD_OK && i < n; i++) {
    dev_status inner = DEV_STATUS_INIT;
    if (dev_tape_watch(te->tape, sched_htab_find(&ss->handles, ids[i])->t,
                       &inner) != PD_OK)
      c = dev_error(st, inner.code, "gradient tape %llu: handle %llu: %s",
                    (unsigned long long)te->id, (unsigned long long)ids[i],
                    inner.msg);
  }
  return c;
}

pd_code sched_tape_watch(sched_session *ss, uint64_t tape_id,
                         const uint64_t *ids, int n, dev_status *st) {
  if (n < 0 || (n > 0 && !ids))
    return dev_error(st, PD_INVALID_ARGUMENT, "%d ids to watch", n);
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  sched_tape_ent *te = NULL;
  if (ss->closed)
    c = sched_closed_error(ss, st);
  else if ((te = sched_tape_find_locked(ss, tape_id, st)) == NULL)
    c = PD_NOT_FOUND;
  else
    c = sched_tape_watch_locked(ss, te, ids, n, st);
  pthread_mutex_unlock(&ss->mu);
  return c;
}

pd_code sched_tape_delete(sched_session *ss, uint64_t tape_id, dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  sched_tape_ent *te = NULL;
  if (ss->closed) {
    c = sched_closed_error(ss, st);
  } else if ((te = sched_tape_find_locked(ss, tape_id, st)) == NULL) {
    c = PD_NOT_FOUND;
  } else {
    dev_tape_destroy(te->tape);
    *te = ss->tapes[--ss->num_tapes];
  }
  pthread_mutex_unlock(&ss->mu);
  return c;
}

/* The state of one sched_tape_gradient call, for its executor. */
typedef struct sched_grad_ctx {
  sched_session *ss;
  uint64_t tag;
  uint64_t new_bytes;    /* what the gradient's ops allocate, so far */
  int ops;               /* gradient ops queued so far */
  const dev_devset *set; /* the target's set: where an op without inputs
                            (a seed's Fill) goes (issue #17) */
} sched_grad_ctx;

/* A gradient op of `nb` new bytes fits the quota and its outputs the
 * caller's room; allocates its queue entry. */
static pd_code sched_grad_admit(sched_grad_ctx *g, const char *op_name,
                                int nout, int room, uint64_t nb, sched_qop **q,
                                dev_status *st) {
  sched_session *ss = g->ss;
  if (nout > room)
    return dev_error(st, PD_INTERNAL, "%s has %d outputs; room for %d", op_name,
                     nout, room);
  if (ss->quota && (nb > ss->quota || g->new_bytes > ss->quota - nb ||
                    ss->bytes > ss->quota - nb - g->new_bytes))
    return dev_error(
        st, PD_RESOURCE_EXHAUSTED,
        "session memory quota exceeded by the gradient's ops: %llu "
        "bytes held + %llu bytes of gradient ops so far + %llu new "
        "(%s) > quota %llu bytes",
        (unsigned long long)ss->bytes, (unsigned long long)g->new_bytes,
        (unsigned long long)nb, op_name, (unsigned long long)ss->quota);
  if ((*q = sched_qop_new(ss->owner)) == NULL)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  return PD_OK;
}

/* Appends one gradient op's entry to the queue, within max_queued_ops, and
 * retains its outputs for the caller. */
static pd_code sched_grad_enqueue(sched_grad_ctx *g, const char *op_name,
                                  sched_qop *q, dev_tensor **outputs, int nout,
                                  dev_status *st) {
  sched_session *ss = g->ss;
  sched *s = ss->owner;
  pthread_mutex_lock(&s->qmu);
  int max_queued = SCHED_LIM(s, max_queued);
  if (ss->qlen + 1 > max_queued) {
    int ql = ss->qlen;
    pthread_mutex_unlock(&s->qmu);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the session has %d ops queued; the gradient's op %s "
                     "would pass the limit max_queued_ops = %d (Sync before "
                     "asking for gradients, or raise the limit)",
                     ql, op_name, max_queued);
  }
  /* The caller's references, taken before the dispatcher may own the op. */
  for (int j = 0; j < nout; j++) {
    outputs[j] = dev_op_output(q->op, j);
    dev_tensor_retain(outputs[j]);
  }
  q->seq = ++ss->enqueued;
  q->t_enq_ns = sched_now_ns();
  sched_queue_append_locked(ss, q, q, 1);
  pthread_mutex_unlock(&s->qmu);
  return PD_OK;
}

/* The tape's executor (dev_execute_fn): prepares one gradient op and appends
 * it to the session's queue behind everything the session queued before
 * (the forward ops it differentiates may not have reached the devices yet).
 * Runs under ss->mu, inside sched_tape_gradient. Gradient ops are counted
 * against the session's queue limit and its memory quota like any op; as
 * their outputs are not handles, the quota check is conservative: every
 * byte a gradient's ops allocate counts until the call returns. */
static pd_code sched_grad_exec(void *arg, const char *op_name,
                               dev_tensor *const *inputs, int num_inputs,
                               const dev_attr *attrs, int num_attrs,
                               dev_tensor **outputs, int *num_outputs,
                               dev_status *st) {
  sched_grad_ctx *g = arg;
  sched *s = g->ss->owner;
  dev_op *op = NULL;
  /* Gradient ops follow their inputs; one without inputs goes on the
   * target's set, which is the session's own. */
  PD_TRY(dev_op_prepare_on(s->engine, num_inputs ? NULL : g->set, op_name,
                           inputs, num_inputs, attrs, num_attrs, &op, st));
  int nout = dev_op_num_outputs(op);
  uint64_t nb = dev_op_new_bytes(op);
  sched_qop *q = NULL;
  pd_code c = sched_grad_admit(g, op_name, nout, *num_outputs, nb, &q, st);
  if (c == PD_OK) {
    q->tag = g->tag;
    q->owner = s;
    q->op_index = sched_op_index(s, op_name);
    q->op = op;
    q->est_ns = sched_estimate_ns(s, op, q->op_index, &q->model_ns);
    q->devs = sched_devmask(dev_op_devset(op));
    c = sched_grad_enqueue(g, op_name, q, outputs, nout, st);
    if (c != PD_OK) sched_qop_free(s, q);
  }
  if (c != PD_OK) {
    dev_op_abandon(op, PD_CANCELLED, "the gradient was not computed");
    return c;
  }
  *num_outputs = nout;
  g->new_bytes += nb;
  g->ops++;
  return PD_OK;
}

/* The request's own shape: counts, result ids not 0 and distinct. */
static pd_code sched_grad_check(const sched_gradient *g, dev_status *st) {
  int n = g->num_sources;
  if (n < 0 || n > SCHED_MAX_GRAD_SOURCES ||
      (n > 0 && (!g->sources || !g->result_ids)))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%d sources; expected 0 to %d, each with a result id", n,
                     SCHED_MAX_GRAD_SOURCES);
  if (g->num_results != n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%d sources but %d result ids; expected one result id "
                     "per source",
                     n, g->num_results);
  for (int i = 0; i < n; i++) {
    if (g->result_ids[i] == 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "result %d: handle id 0 is reserved", i);
    for (int j = 0; j < i; j++)
      if (g->result_ids[j] == g->result_ids[i])
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "result ids %d and %d are both %llu; expected "
                         "distinct ids",
                         j, i, (unsigned long long)g->result_ids[i]);
  }
  return PD_OK;
}

/* The tensor of handle `id` (ss->mu held), or NULL after a NOT_FOUND naming
 * `what` (and index i when i >= 0). */
static dev_tensor *sched_grad_lookup(sched_session *ss, uint64_t id,
                                     const char *what, int i, dev_status *st) {
  sched_slot *sl = sched_htab_find(&ss->handles, id);
  if (sl) return sl->t;
  if (i >= 0)
    dev_error(st, PD_NOT_FOUND,
              "%s %d: handle %llu not found in this session (never "
              "created, deleted, or another session's)",
              what, i, (unsigned long long)id);
  else
    dev_error(st, PD_NOT_FOUND,
              "%s: handle %llu not found in this session (never "
              "created, deleted, or another session's)",
              what, (unsigned long long)id);
  return NULL;
}

/* What one gradient call resolved, under ss->mu. */
typedef struct sched_grad_args {
  sched_tape_ent *te;
  dev_tensor *target, *og; /* og: NULL for ones like the target */
  dev_tensor **srcs;
} sched_grad_args;

/* Finds the tape and every handle the call names (ss->mu held). */
static pd_code sched_grad_resolve_locked(sched_session *ss,
                                         const sched_gradient *g,
                                         sched_grad_args *a, dev_status *st) {
  int n = g->num_sources;
  if (ss->closed) return sched_closed_error(ss, st);
  if ((a->te = sched_tape_find_locked(ss, g->tape_id, st)) == NULL)
    return PD_NOT_FOUND;
  for (int i = 0; i < n; i++)
    if (sched_htab_find(&ss->handles, g->result_ids[i]))
      return dev_error(st, PD_ALREADY_EXISTS,
                       "result %d: handle %llu is already live in this session",
                       i, (unsigned long long)g->result_ids[i]);
  PD_TRY(sched_check_room_locked(ss, n, 0, st));
  if (!(a->target = sched_grad_lookup(ss, g->target, "target", -1, st)))
    return PD_NOT_FOUND;
  if (g->output_gradient &&
      !(a->og = sched_grad_lookup(ss, g->output_gradient, "output gradient", -1,
                                  st)))
    return PD_NOT_FOUND;
  for (int i = 0; i < n; i++)
    if (!(a->srcs[i] = sched_grad_lookup(ss, g->sources[i], "source", i, st)))
      return PD_NOT_FOUND;
  return PD_OK;
}

/* Publishes the gradient's results outs[0..n) (ss->mu held); the table owns
 * those it took (NULL in outs). */
static pd_code sched_grad_publish_locked(sched_session *ss,
                                         const sched_gradient *g,
                                         dev_tensor **outs, pd_dtype *dtypes,
                                         dev_shape *shapes, dev_status *st) {
  int n = g->num_sources;
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) bytes += dev_tensor_bytes(outs[i]);
  PD_TRY(sched_check_room_locked(ss, n, bytes, st));
  if (!sched_htab_reserve(&ss->handles, (size_t)n))
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (int i = 0; i < n; i++) {
    uint64_t b = dev_tensor_bytes(outs[i]);
    sched_htab_insert(&ss->handles, g->result_ids[i], outs[i], b, NULL);
    sched_charge_tensor_locked(ss, outs[i], b, true);
    dtypes[i] = dev_tensor_dtype(outs[i]);
    shapes[i] = *dev_tensor_shape(outs[i]);
    outs[i] = NULL; /* the table's now */
  }
  return PD_OK;
}

/* Runs the tape's gradient with this file's executor (ss->mu held). */
static pd_code sched_grad_run_locked(sched_session *ss, const sched_gradient *g,
                                     uint64_t tag, sched_grad_args *a,
                                     dev_tensor **outs, dev_status *st) {
  sched_grad_ctx ctx = {ss, tag, 0, 0, dev_tensor_devset(a->target)};
  dev_status inner = DEV_STATUS_INIT;
  dev_tape_set_executor(a->te->tape, sched_grad_exec, &ctx);
  pd_code c = dev_tape_gradient(a->te->tape, a->target, a->srcs, g->num_sources,
                                a->og ? &a->og : NULL, outs, &inner);
  dev_tape_set_executor(a->te->tape, NULL, NULL);
  /* Gradient ops queued before a failure still run; nothing holds their
   * outputs, so they are freed once they have. */
  if (c != PD_OK)
    dev_error(st, c, "gradient tape %llu: %s", (unsigned long long)g->tape_id,
              inner.msg);
  return c;
}

pd_code sched_tape_gradient(sched_session *ss, const sched_gradient *g,
                            uint64_t tag, pd_dtype *dtypes, dev_shape *shapes,
                            dev_status *st) {
  PD_TRY(sched_grad_check(g, st));
  int n = g->num_sources;
  sched_grad_args a = {NULL, NULL, NULL, NULL};
  a.srcs = calloc((size_t)(n ? n : 1), sizeof(*a.srcs));
  dev_tensor **outs = calloc((size_t)(n ? n : 1), sizeof(*outs));
  if (!a.srcs || !outs) {
    free(a.srcs);
    free(outs);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  bool computed = false;
  pthread_mutex_lock(&ss->mu);
  pd_code c = sched_grad_resolve_locked(ss, g, &a, st);
  if (c == PD_OK) c = sched_grad_run_locked(ss, g, tag, &a, outs, st);
  if (c == PD_OK) {
    computed = true;
    c = sched_grad_publish_locked(ss, g, outs, dtypes, shapes, st);
  }
  pthread_mutex_unlock(&ss->mu);
  if (computed)
    for (int i = 0; i < n; i++) dev_tensor_release(outs[i]);
  free(a.srcs);
  free(outs);
  return c;
}
