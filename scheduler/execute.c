/* Op preparation and queueing (sched_execute): a request's ops are checked,
 * resolved against the session's handles, prepared by the engine (shape
 * inference), charged against the session's limits, offered to its tapes,
 * and then, all or nothing, published as handles and appended to its queue
 * for the dispatcher. Everything runs under the session's mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

/* An output of the request, before it is published. */
typedef struct sched_pending {
  uint64_t id;
  dev_tensor *t;     /* borrowed from its prepared op */
  uint64_t bytes;    /* what it alone is charged: its size, 0 with ch */
  sched_charge **ch; /* NULL, or its components' shared charges (issue #17) */
} sched_pending;

/* The work of one sched_execute call. */
typedef struct sched_exec {
  sched_session *ss;
  const sched_op *ops;
  int n;
  dev_op **prepared;   /* n; NULL once queued or abandoned */
  sched_pending *pend; /* every output, in order */
  int npend;
  uint64_t new_bytes;
  sched_qop *chain; /* the n queue entries, once allocated */
  bool kick;        /* an op lowered the earliest deadline: wake the timer */
  /* A call of one op (every streamed op) needs no allocation. */
  dev_op *prepared1[1];
  sched_pending pend1[DEV_MAX_OUTPUTS];
} sched_exec;

static pd_code exec_init(sched_exec *x, sched_session *ss, const sched_op *ops,
                         int n, dev_status *st) {
  x->ss = ss;
  x->ops = ops;
  x->n = n;
  x->npend = 0;
  x->new_bytes = 0;
  x->chain = NULL;
  x->kick = false;
  x->prepared1[0] = NULL;
  x->prepared = x->prepared1;
  x->pend = x->pend1;
  if (n > 1) {
    /* Room for every output id the request names (sized by the real
     * counts: a 4096-op request does not pay DEV_MAX_OUTPUTS per op); an
     * op naming more than DEV_MAX_OUTPUTS is refused before it adds any. */
    size_t nout = 0;
    for (int i = 0; i < n; i++)
      if (ops[i].num_outputs > 0)
        nout +=
            (size_t)(ops[i].num_outputs < DEV_MAX_OUTPUTS ? ops[i].num_outputs
                                                          : DEV_MAX_OUTPUTS);
    x->prepared = calloc((size_t)n, sizeof(*x->prepared));
    x->pend = calloc(nout ? nout : 1, sizeof(*x->pend));
    if (!x->prepared || !x->pend) {
      free(x->prepared);
      free(x->pend);
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    }
  }
  return PD_OK;
}

/* Drops the charges that outputs never published joined (ss->mu held):
 * none of them was counted but those of live handles, which still hold
 * them. */
static void exec_put_charges_locked(sched_exec *x) {
  for (int k = 0; k < x->npend; k++) {
    sched_charges_put_locked(x->ss, x->pend[k].t, x->pend[k].ch);
    x->pend[k].ch = NULL;
  }
}

/* Frees what was not queued: entries, and prepared ops (abandoned). */
static void exec_free(sched_exec *x) {
  while (x->chain) {
    sched_qop *q = x->chain;
    x->chain = q->next;
    sched_qop_free(x->ss->owner, q);
  }
  for (int i = 0; i < x->n; i++)
    if (x->prepared[i])
      dev_op_abandon(x->prepared[i], PD_CANCELLED,
                     "another op of the same request was rejected");
  if (x->n > 1) {
    free(x->prepared);
    free(x->pend);
  }
}

/* Prefixes an error message with the op's index and name. */
static pd_code sched_op_error(dev_status *st, int i, const char *name,
                              const dev_status *inner) {
  if (!st) return inner->code;
  dev_status tmp = *inner;
  return dev_error(st, tmp.code, "op %d (%.64s): %s", i, name ? name : "",
                   tmp.msg);
}

/* The counts fit the arrays below (the server checks them first; a direct
 * caller may not). */
static pd_code exec_check_arity(const sched_op *op, dev_status *inner) {
  if (op->num_inputs < 0 || op->num_inputs > DEV_MAX_INPUTS)
    return dev_error(inner, PD_INVALID_ARGUMENT,
                     "%d inputs; the limit max_inputs_per_op is %d",
                     op->num_inputs, DEV_MAX_INPUTS);
  if (op->num_outputs < 0 || op->num_outputs > DEV_MAX_OUTPUTS)
    return dev_error(inner, PD_INVALID_ARGUMENT,
                     "%d output ids; no op has more than %d outputs",
                     op->num_outputs, DEV_MAX_OUTPUTS);
  return PD_OK;
}

/* Live handles first, then outputs of earlier ops of this request (the
 * latest one wins; ids are unique anyway). */
static pd_code exec_resolve_inputs(sched_exec *x, const sched_op *op,
                                   dev_tensor **inputs, dev_status *inner) {
  for (int j = 0; j < op->num_inputs; j++) {
    uint64_t id = op->inputs[j];
    sched_slot *sl = sched_htab_find(&x->ss->handles, id);
    dev_tensor *t = sl ? sl->t : NULL;
    for (int k = x->npend - 1; !t && k >= 0; k--)
      if (x->pend[k].id == id) t = x->pend[k].t;
    if (!t)
      return dev_error(inner, PD_NOT_FOUND,
                       "input %d: handle %llu not found in this session "
                       "(never created, deleted, or another session's)",
                       j, (unsigned long long)id);
    inputs[j] = t;
  }
  return PD_OK;
}

/* Output ids: not 0, not live, not named before in this request. */
static pd_code exec_check_outputs(sched_exec *x, const sched_op *op,
                                  dev_status *inner) {
  for (int j = 0; j < op->num_outputs; j++) {
    uint64_t id = op->output_ids[j];
    if (id == 0)
      return dev_error(inner, PD_INVALID_ARGUMENT,
                       "output %d: handle id 0 is reserved", j);
    bool dup = sched_htab_find(&x->ss->handles, id) != NULL;
    for (int k = 0; !dup && k < x->npend; k++) dup = x->pend[k].id == id;
    for (int k = 0; !dup && k < j; k++) dup = op->output_ids[k] == id;
    if (dup)
      return dev_error(inner, PD_ALREADY_EXISTS,
                       "output %d: handle %llu is already live in this "
                       "session (or named twice in this request)",
                       j, (unsigned long long)id);
  }
  return PD_OK;
}

/* The shared charges of input handle `id` (a live handle first, then the
 * latest output of this request, as exec_resolve_inputs), made shared
 * records first when they are not (sched_slot_share_locked). NULL on
 * ENOMEM. */
static sched_charge **exec_input_charges(sched_exec *x, uint64_t id) {
  sched_slot *sl = sched_htab_find(&x->ss->handles, id);
  if (sl) return sched_slot_share_locked(sl) ? sl->ch : NULL;
  for (int k = x->npend - 1; k >= 0; k--) {
    sched_pending *pd = &x->pend[k];
    if (pd->id != id) continue;
    if (!pd->ch && (pd->ch = sched_charges_new(pd->t, false)) != NULL)
      pd->bytes = 0; /* counted at publish, through its records */
    return pd->ch;
  }
  return NULL; /* resolved before: cannot happen */
}

/* The charge follows the buffer (issue #17): output `pd` (output j of p,
 * op `op`) joins the charges of the input components it shares
 * (dev_op_output_shares), so its bytes stay counted, once, until the last
 * handle holding the buffer goes; its other components get records of
 * their own. Nothing for an output that shares nothing (no allocation). */
static pd_code exec_share_output(sched_exec *x, const sched_op *op, dev_op *p,
                                 int j, sched_pending *pd, dev_status *inner) {
  int n = dev_tensor_num_components(pd->t), in = 0, ic = 0;
  for (int c = 0; c < n; c++) {
    if (!dev_op_output_shares(p, j, c, &in, &ic)) continue;
    if (!pd->ch && !(pd->ch = calloc((size_t)n, sizeof(*pd->ch))))
      return dev_error(inner, PD_RESOURCE_EXHAUSTED, "out of host memory");
    pd->bytes = 0;
    sched_charge **src = exec_input_charges(x, op->inputs[in]);
    if (!src)
      return dev_error(inner, PD_RESOURCE_EXHAUSTED, "out of host memory");
    pd->ch[c] = src[ic];
    pd->ch[c]->refs++;
  }
  for (int c = 0; pd->ch && c < n; c++)
    if (!pd->ch[c] && !(pd->ch[c] = sched_charge_new(pd->t, c, false)))
      return dev_error(inner, PD_RESOURCE_EXHAUSTED, "out of host memory");
  return PD_OK;
}

/* Prepares op i and notes its outputs (dtypes and shapes into *res). */
static pd_code exec_prepare_op(sched_exec *x, int i, sched_op_result *res,
                               dev_status *inner) {
  const sched_op *op = &x->ops[i];
  dev_tensor *inputs[DEV_MAX_INPUTS];
  PD_TRY(exec_check_arity(op, inner));
  PD_TRY(exec_resolve_inputs(x, op, inputs, inner));
  PD_TRY(exec_check_outputs(x, op, inner));
  PD_TRY(sched_prepare_named_locked(x->ss, op->op_name, op->devices, inputs,
                                    op->num_inputs, op->attrs, op->num_attrs,
                                    &x->prepared[i], inner));
  dev_op *p = x->prepared[i];
  int nout = dev_op_num_outputs(p);
  if (nout != op->num_outputs) {
    /* a list output: say which attribute sets the count */
    const dev_op_def *def = dev_op_lookup(op->op_name);
    dev_op_arg_info ai = {0};
    for (int a = 0; def && dev_op_def_output(def, a, &ai) && !ai.is_list;) a++;
    return dev_error(
        inner, PD_INVALID_ARGUMENT,
        "the op has %d outputs; the request names %d output ids%s%s%s", nout,
        op->num_outputs,
        ai.is_list ? " (its list output's length is attribute '" : "",
        ai.is_list ? ai.length_attr : "", ai.is_list ? "')" : "");
  }
  if (nout > SCHED_RESULT_INLINE && (!res->more_dtype || !res->more_shape))
    return dev_error(inner, PD_INVALID_ARGUMENT,
                     "%d outputs but the caller's result has room for %d "
                     "(sched_op_result.more_dtype / more_shape not set)",
                     nout, SCHED_RESULT_INLINE);
  res->num_outputs = nout;
  /* The room check counts dev_op_new_bytes (an output sharing an input's
   * buffer counts 0; a function call adds what it holds while it runs);
   * each output's charge is its size, or, where it shares an input's
   * buffer, that input's charge records (exec_share_output). */
  for (int j = 0; j < nout; j++) {
    dev_tensor *t = dev_op_output(p, j);
    if (j < SCHED_RESULT_INLINE) {
      res->dtype[j] = dev_tensor_dtype(t);
      res->shape[j] = *dev_tensor_shape(t);
    } else {
      res->more_dtype[j - SCHED_RESULT_INLINE] = dev_tensor_dtype(t);
      res->more_shape[j - SCHED_RESULT_INLINE] = *dev_tensor_shape(t);
    }
    sched_pending *pd = &x->pend[x->npend++];
    *pd = (sched_pending){op->output_ids[j], t, dev_tensor_bytes(t), NULL};
    PD_TRY(exec_share_output(x, op, p, j, pd, inner));
  }
  x->new_bytes += dev_op_new_bytes(p);
  return PD_OK;
}

/* Admission by device time: the session's queued ops and the request's
 * together within max_queued_device_ns (estimates, sched_estimate_ns). One
 * op alone on an empty queue is always admitted, so an op larger than the
 * bound still runs; a request of several is refused and should be split. */
static pd_code exec_check_device_time(sched *s, int ql, uint64_t qns, int n,
                                      uint64_t est, dev_status *st) {
  uint64_t bound = SCHED_LIM(s, max_queued_device_ns);
  if (bound == 0 || qns + est <= bound || (ql == 0 && n == 1)) return PD_OK;
  return dev_error(
      st, PD_RESOURCE_EXHAUSTED,
      "the session has %d ops queued, an estimated %.3f ms of device time; "
      "with %d more (%.3f ms) it would pass the limit max_queued_device_ms "
      "= %.3f ms (Sync or wait for the queue to drain, then send again)",
      ql, (double)qns * 1e-6, n, (double)est * 1e-6, (double)bound * 1e-6);
}

/* Everything that can fail before publishing: the session's room for the
 * outputs, the table's room, the queue entries (with their estimated
 * device time), the queue limits in ops and device time. */
/* A refusal for memory of a request with a function call names the first
 * call that holds intermediates while it runs (counted in its new bytes by
 * dev_op_new_bytes, buffer planning on or off). */
static pd_code exec_name_transients(const sched_exec *x, pd_code c,
                                    dev_status *st) {
  if (!st || c != PD_RESOURCE_EXHAUSTED) return c;
  for (int i = 0; i < x->n; i++) {
    const dev_op *p = x->prepared[i];
    if (!p || !dev_op_is_function_call(p)) continue;
    uint64_t nb = dev_op_new_bytes(p), ob = dev_op_output_bytes(p);
    if (nb <= ob) continue;
    size_t len = strlen(st->msg);
    snprintf(st->msg + len, sizeof st->msg - len,
             " (op %d calls function '%.64s', which holds %llu bytes of "
             "intermediates while it runs)",
             i, x->ops[i].op_name, (unsigned long long)(nb - ob));
    break;
  }
  return c;
}

static pd_code exec_reserve_locked(sched_exec *x, uint64_t tag,
                                   dev_status *st) {
  sched_session *ss = x->ss;
  sched *s = ss->owner;
  PD_TRY(exec_name_transients(
      x, sched_check_room_locked(ss, x->npend, x->new_bytes, st), st));
  if (!sched_htab_reserve(&ss->handles, (size_t)x->npend))
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  uint64_t est = 0;
  for (int i = x->n - 1; i >= 0; i--) { /* the queue entries, in order */
    sched_qop *q = sched_qop_new(s);
    if (!q) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    q->tag = tag;
    q->owner = s;
    q->op_index = sched_op_index(s, x->ops[i].op_name);
    q->est_ns = sched_estimate_ns(s, x->prepared[i], q->op_index, &q->model_ns);
    q->devs = sched_devmask(dev_op_devset(x->prepared[i]));
    est += q->est_ns;
    q->next = x->chain;
    x->chain = q;
  }
  /* Only this session's calls add to its queue, and they hold ss->mu: the
   * queue can only shrink between this check and the append. */
  pthread_mutex_lock(&s->qmu);
  int ql = ss->qlen;
  uint64_t qns = ss->q_est_ns;
  pthread_mutex_unlock(&s->qmu);
  int max_queued = SCHED_LIM(s, max_queued);
  if (ql + x->n > max_queued)
    return dev_error(
        st, PD_RESOURCE_EXHAUSTED,
        "the session has %d ops queued; with %d more it would pass "
        "the limit max_queued_ops = %d (Sync, or send fewer at once)",
        ql, x->n, max_queued);
  return exec_check_device_time(s, ql, qns, x->n, est, st);
}

/* Every op will run: offers each, in order, to the session's tapes (between
 * preparation and queueing, as dev_tape_record asks). A tape that runs out
 * of host memory fails the request before anything is published (records
 * of earlier ops of this request may stay on a tape; their outputs are
 * cancelled, so a gradient through them fails rather than being wrong).
 * *bad gets the op that failed. */
static pd_code exec_record_locked(sched_exec *x, int *bad, dev_status *inner) {
  sched_session *ss = x->ss;
  for (int i = 0; i < x->n && ss->num_tapes > 0; i++) {
    for (int k = 0; k < ss->num_tapes; k++) {
      if (dev_tape_record(ss->tapes[k].tape, x->prepared[i], inner) != PD_OK) {
        *bad = i;
        return dev_error(inner, inner->code, "gradient tape %llu: %s",
                         (unsigned long long)ss->tapes[k].id, inner->msg);
      }
    }
  }
  return PD_OK;
}

/* The deadline of a queued op: the earlier of the call's and of its
 * timeout (its own, else the session's) from queueing. */
static void exec_set_deadline(sched_qop *q, const sched_op *op,
                              const sched_session *ss) {
  q->deadline_ns = op->deadline_ns;
  q->dl_src = op->deadline_ns ? SCHED_DL_CALL : 0;
  uint32_t ms = op->timeout_ms ? op->timeout_ms : ss->op_timeout_ms;
  if (!ms) return;
  uint64_t d = q->t_enq_ns + (uint64_t)ms * 1000000u;
  if (!q->deadline_ns || d < q->deadline_ns) {
    q->deadline_ns = d;
    q->dl_src = op->timeout_ms ? SCHED_DL_OP : SCHED_DL_SESSION;
  }
}

/* Publishes the outputs and queues the ops (cannot fail). */
static void exec_publish_locked(sched_exec *x) {
  sched_session *ss = x->ss;
  sched *s = ss->owner;
  uint64_t t_enq = sched_now_ns();
  pthread_mutex_lock(&s->qmu);
  int k = 0;
  sched_qop *q = x->chain, *last = NULL;
  for (int i = 0; i < x->n; i++, last = q, q = q->next) {
    int nout = dev_op_num_outputs(x->prepared[i]);
    for (int j = 0; j < nout; j++, k++) {
      dev_tensor *t = x->pend[k].t;
      dev_tensor_retain(t);
      sched_pending *pd = &x->pend[k];
      sched_htab_insert(&ss->handles, pd->id, t, pd->bytes, pd->ch);
      if (pd->ch)
        sched_charges_charge_locked(ss, t, pd->ch);
      else
        sched_charge_tensor_locked(ss, t, pd->bytes, true);
      pd->ch = NULL; /* the table's now */
    }
    q->op = x->prepared[i];
    q->seq = ++ss->enqueued;
    q->t_enq_ns = t_enq;
    exec_set_deadline(q, &x->ops[i], ss);
    if (q->deadline_ns && sched_deadline_note_locked(s, q->deadline_ns))
      x->kick = true;
    x->prepared[i] = NULL;
  }
  sched_queue_append_locked(ss, x->chain, last, x->n);
  x->chain = NULL;
  pthread_mutex_unlock(&s->qmu);
}

pd_code sched_check_ops(sched *s, long n, dev_status *st) {
  int max_ops = SCHED_LIM(s, max_ops);
  if (n <= 0 || n > max_ops)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a request holds %ld ops; expected 1 to "
                     "max_ops_per_request = %d",
                     n, max_ops);
  return PD_OK;
}

pd_code sched_execute(sched_session *ss, const sched_op *ops, int n,
                      uint64_t tag, sched_op_result *results, int *failed_op,
                      dev_status *st) {
  if (sched_check_ops(ss->owner, n, st) != PD_OK) {
    if (failed_op) *failed_op = n > 0 ? SCHED_LIM(ss->owner, max_ops) : 0;
    return st ? st->code : PD_INVALID_ARGUMENT;
  }
  sched_exec x;
  PD_TRY(exec_init(&x, ss, ops, n, st));
  dev_status inner = DEV_STATUS_INIT;
  int bad = -1; /* the op an error names; -1: the request's error, in st */
  pthread_mutex_lock(&ss->mu);
  pd_code c = ss->closed ? sched_closed_error(ss, st) : PD_OK;
  for (int i = 0; c == PD_OK && i < n; i++)
    if ((c = exec_prepare_op(&x, i, &results[i], &inner)) != PD_OK) bad = i;
  if (c == PD_OK) c = exec_reserve_locked(&x, tag, st);
  if (c == PD_OK) c = exec_record_locked(&x, &bad, &inner);
  if (c == PD_OK) exec_publish_locked(&x);
  exec_put_charges_locked(&x);
  pthread_mutex_unlock(&ss->mu);
  if (x.kick) sched_deadline_kick(ss->owner);
  if (c != PD_OK && bad >= 0) sched_op_error(st, bad, ops[bad].op_name, &inner);
  exec_free(&x);
  if (c != PD_OK && failed_op) *failed_op = bad < 0 ? 0 : bad;
  return c;
}
