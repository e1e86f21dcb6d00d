/* libparadev: sessions and their keep-alive thread, Execute (single ops and
 * batches), Sync, Describe and Delete. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_int.h"

int64_t pdc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

pd_code pdc_session_check(pd_session *s, pd_status *st) {
  if (!s) return pdc_error(st, PD_INVALID_ARGUMENT, "session is NULL");
  if (atomic_load(&s->closed))
    return pdc_error(st, PD_FAILED_PRECONDITION,
                     "the session was closed (pd_session_close); open a new one");
  return PD_OK;
}

void pdc_session_touch(pd_session *s) {
  atomic_store(&s->last_call_ms, pdc_now_ms());
}

/* --- keep-alive ------------------------------------------------------------- */

/* How often an idle session renews its lease: a third of the lease, so two
 * renewals may be lost before it ends. */
static int64_t pdc_ka_period_ms(const pd_session *s) {
  int64_t p = (int64_t)s->lease_s * 1000 / 3;
  return p < 100 ? 100 : p;
}

static pd_code pdc_keep_alive_rpc(pd_session *s, const pd_call_options *call,
                                  pd_status *st) {
  Paradev__V1__KeepAliveRequest req = PARADEV__V1__KEEP_ALIVE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  Paradev__V1__KeepAliveResponse *resp = NULL;
  pd_code rc = pdc_unary(s->c, PDC_KEEP_ALIVE, &req.base,
                         &paradev__v1__keep_alive_response__descriptor,
                         (ProtobufCMessage **)&resp, call, st);
  if (rc != PD_OK) return rc;
  if (resp->incarnation != s->incarnation)
    rc = pdc_error(st, PD_NOT_FOUND,
                   "the daemon restarted (incarnation %016" PRIx64
                   ", the session's was %016" PRIx64
                   "): the session and its tensors are gone",
                   resp->incarnation, s->incarnation);
  else
    pdc_session_touch(s);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

static void *pdc_ka_main(void *arg) {
  pd_session *s = arg;
  pd_cancel *cancel = s->ka_cancel;
  pd_status st;
  pthread_mutex_lock(&s->ka_mu);
  while (!s->ka_stop) {
    int64_t period = pdc_ka_period_ms(s);
    int64_t due = atomic_load(&s->last_call_ms) + period;
    int64_t now = pdc_now_ms();
    if (now < due) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      int64_t wait = due - now;
      ts.tv_sec += wait / 1000;
      ts.tv_nsec += (long)(wait % 1000) * 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&s->ka_cv, &s->ka_mu, &ts);
      continue;
    }
    pthread_mutex_unlock(&s->ka_mu);
    pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
    o.timeout_ms = period < 10000 ? period : 10000;
    o.cancel = cancel;
    pd_code rc = pdc_keep_alive_rpc(s, &o, &st);
    pthread_mutex_lock(&s->ka_mu);
    if (s->ka_stop) break;
    if (rc != PD_OK) {
      s->ka_code = rc;
      memcpy(s->ka_msg, st.msg, sizeof(s->ka_msg));
      /* A session the daemon lost stays lost: stop asking. */
      if (rc == PD_NOT_FOUND || rc == PD_UNAUTHENTICATED) break;
      pdc_session_touch(s); /* retry after a period, not at once */
    } else {
      s->ka_code = PD_OK;
      s->ka_msg[0] = '\0';
    }
  }
  pthread_mutex_unlock(&s->ka_mu);
  return NULL;
}

static void pdc_ka_stop(pd_session *s) {
  if (!s->ka_running) return;
  pthread_mutex_lock(&s->ka_mu);
  s->ka_stop = true;
  pthread_cond_signal(&s->ka_cv);
  pthread_mutex_unlock(&s->ka_mu);
  pd_cancel_trigger(s->ka_cancel); /* a renewal in flight ends now */
  pthread_join(s->ka_thread, NULL);
  s->ka_running = false;
}

/* --- sessions ------------------------------------------------------------------ */

pd_session *pd_session_new(pd_client *c, const pd_session_options *opts,
                           const pd_call_options *call, pd_status *st) {
  pd_session_options o = PD_SESSION_OPTIONS_INITIALIZER;
  if (!c) {
    pdc_error(st, PD_INVALID_ARGUMENT, "client is NULL");
    return NULL;
  }
  if (opts) {
    if (opts->struct_size < offsetof(pd_session_options, keep_alive) ||
        opts->struct_size > sizeof(o)) {
      pdc_error(st, PD_INVALID_ARGUMENT,
                "pd_session_options.struct_size is %zu; start from "
                "PD_SESSION_OPTIONS_INITIALIZER",
                opts->struct_size);
      return NULL;
    }
    memcpy(&o, opts, opts->struct_size);
  }
  Paradev__V1__CreateSessionRequest req =
      PARADEV__V1__CREATE_SESSION_REQUEST__INIT;
  req.client_name = (char *)(o.client_name ? o.client_name : "libparadev");
  /* Under Slurm, sessions carry the job id so the epilog can kill them. */
  const char *job = o.job_id ? o.job_id : getenv("SLURM_JOB_ID");
  req.job_id = (char *)(job ? job : "");
  req.lease_seconds = o.lease_seconds;
  req.memory_quota_bytes = o.memory_quota_bytes;
  Paradev__V1__CreateSessionResponse *resp = NULL;
  if (pdc_unary(c, PDC_CREATE_SESSION, &req.base,
                &paradev__v1__create_session_response__descriptor,
                (ProtobufCMessage **)&resp, call, st) != PD_OK)
    return NULL;
  pd_session *s = calloc(1, sizeof(*s));
  if (!s || resp->session_token.len == 0 ||
      !(s->token = malloc(resp->session_token.len))) {
    if (s && resp->session_token.len == 0)
      pdc_error(st, PD_INTERNAL, "CreateSession: the daemon sent no token");
    else
      pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    free(s);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return NULL;
  }
  s->c = c;
  s->token_len = resp->session_token.len;
  memcpy(s->token, resp->session_token.data, s->token_len);
  s->lease_s = resp->lease_seconds;
  s->incarnation = resp->incarnation;
  s->memory_quota = resp->memory_quota_bytes;
  s->num_devices = resp->num_devices;
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  atomic_init(&s->closed, false);
  atomic_init(&s->next_id, PD_FIRST_LIBRARY_ID);
  atomic_init(&s->last_call_ms, pdc_now_ms());
  s->ka_code = PD_OK;
  pthread_mutex_init(&s->ka_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->ka_cv, &ca);
  pthread_condattr_destroy(&ca);
  if (o.keep_alive && s->lease_s > 0) {
    s->ka_cancel = pd_cancel_new();
    int e = s->ka_cancel ? pthread_create(&s->ka_thread, NULL, pdc_ka_main, s)
                         : ENOMEM;
    if (e != 0) {
      pdc_error(st, PD_RESOURCE_EXHAUSTED,
                "cannot start the keep-alive thread: %s", strerror(e));
      pd_session_delete(s);
      return NULL;
    }
    s->ka_running = true;
  }
  pdc_ok(st);
  return s;
}

pd_code pd_session_close(pd_session *s, const pd_call_options *call,
                         pd_status *st) {
  pd_code rc = pdc_session_check(s, st);
  if (rc != PD_OK) return rc;
  atomic_store(&s->closed, true);
  pdc_ka_stop(s);
  Paradev__V1__CloseSessionRequest req = PARADEV__V1__CLOSE_SESSION_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  Paradev__V1__CloseSessionResponse *resp = NULL;
  rc = pdc_unary(s->c, PDC_CLOSE_SESSION, &req.base,
                 &paradev__v1__close_session_response__descriptor,
                 (ProtobufCMessage **)&resp, call, st);
  if (rc == PD_OK) protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

void pd_session_delete(pd_session *s) {
  if (!s) return;
  if (!atomic_load(&s->closed)) {
    pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
    o.timeout_ms = 2000;
    pd_session_close(s, &o, NULL);
  }
  pdc_ka_stop(s);
  pd_cancel_delete(s->ka_cancel);
  pthread_cond_destroy(&s->ka_cv);
  pthread_mutex_destroy(&s->ka_mu);
  free(s->token);
  free(s);
}

pd_code pd_session_keep_alive(pd_session *s, const pd_call_options *call,
                              pd_status *st) {
  pd_code rc = pdc_session_check(s, st);
  if (rc != PD_OK) return rc;
  return pdc_keep_alive_rpc(s, call, st);
}

pd_code pd_session_keep_alive_status(pd_session *s, pd_status *st) {
  if (!s) return pdc_error(st, PD_INVALID_ARGUMENT, "session is NULL");
  pthread_mutex_lock(&s->ka_mu);
  pd_code rc = s->ka_code;
  if (rc == PD_OK)
    pdc_ok(st);
  else
    pdc_error(st, rc, "keep-alive: %s", s->ka_msg);
  pthread_mutex_unlock(&s->ka_mu);
  return rc;
}

int pd_session_num_devices(const pd_session *s) { return s ? s->num_devices : 0; }
uint32_t pd_session_lease_seconds(const pd_session *s) { return s ? s->lease_s : 0; }
uint64_t pd_session_incarnation(const pd_session *s) { return s ? s->incarnation : 0; }
uint64_t pd_session_memory_quota(const pd_session *s) { return s ? s->memory_quota : 0; }
pd_client *pd_session_client(const pd_session *s) { return s ? s->c : NULL; }

uint64_t pd_session_new_id(pd_session *s) {
  return atomic_fetch_add(&s->next_id, 1);
}

/* --- Execute -------------------------------------------------------------------- */

/* Sends ops as one Execute request and copies the outputs' infos. */
static pd_code pdc_execute_ops(pd_session *s, Paradev__V1__Operation **ops,
                               size_t n, pd_tensor_info *outputs,
                               const pd_call_options *call, pd_status *st) {
  Paradev__V1__ExecuteRequest req = PARADEV__V1__EXECUTE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.n_ops = n;
  req.ops = ops;
  Paradev__V1__ExecuteResponse *resp = NULL;
  pd_code rc = pdc_unary(s->c, PDC_EXECUTE, &req.base,
                         &paradev__v1__execute_response__descriptor,
                         (ProtobufCMessage **)&resp, call, st);
  if (rc != PD_OK) return rc;
  pdc_session_touch(s);
  if (resp->n_results != n) {
    rc = pdc_error(st, PD_INTERNAL, "Execute: %zu results for %zu ops",
                   resp->n_results, n);
    goto out;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const Paradev__V1__OpResult *r = resp->results[i];
    if (r->n_outputs != ops[i]->n_output_ids) {
      rc = pdc_error(st, PD_INTERNAL, "Execute: op %zu has %zu outputs; %zu ids",
                     i, r->n_outputs, ops[i]->n_output_ids);
      goto out;
    }
    for (size_t j = 0; j < r->n_outputs; j++, k++) {
      if (outputs && !pdc_info_from_pb(r->outputs[j], &outputs[k])) {
        rc = pdc_error(st, PD_INTERNAL,
                       "Execute: op %zu output %zu has rank over %d", i, j,
                       PD_MAX_RANK);
        goto out;
      }
    }
  }
  pdc_ok(st);
out:
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

pd_code pd_execute(pd_session *s, const char *op, const uint64_t *inputs,
                   int n_inputs, const pd_attrs *attrs, uint64_t *output_ids,
                   int n_outputs, pd_tensor_info *outputs,
                   const pd_call_options *call, pd_status *st) {
  pd_code rc = pdc_session_check(s, st);
  if (rc != PD_OK) return rc;
  Paradev__V1__Operation o;
  rc = pdc_op_build(&o, s, op, inputs, n_inputs, attrs, output_ids, n_outputs,
                    st);
  if (rc != PD_OK) return rc;
  Paradev__V1__Operation *ops[1] = {&o};
  return pdc_execute_ops(s, ops, 1, outputs, call, st);
}

/* --- batches ---------------------------------------------------------------------- */

typedef struct pdc_batch_op {
  char *name;
  uint64_t *inputs;
  int n_inputs;
  pd_attrs *attrs;
  uint64_t *outputs;
  int n_outputs;
} pdc_batch_op;

struct pd_batch {
  pdc_batch_op *ops;
  int n, cap;
  int n_outputs;
};

pd_batch *pd_batch_new(void) { return calloc(1, sizeof(pd_batch)); }

void pd_batch_clear(pd_batch *b) {
  if (!b) return;
  for (int i = 0; i < b->n; i++) {
    free(b->ops[i].name);
    free(b->ops[i].inputs);
    pd_attrs_delete(b->ops[i].attrs);
    free(b->ops[i].outputs);
  }
  b->n = 0;
  b->n_outputs = 0;
}

void pd_batch_delete(pd_batch *b) {
  if (!b) return;
  pd_batch_clear(b);
  free(b->ops);
  free(b);
}

int pd_batch_num_ops(const pd_batch *b) { return b ? b->n : 0; }
int pd_batch_num_outputs(const pd_batch *b) { return b ? b->n_outputs : 0; }

pd_code pd_batch_add(pd_batch *b, pd_session *s, const char *op,
                     const uint64_t *inputs, int n_inputs,
                     const pd_attrs *attrs, uint64_t *output_ids,
                     int n_outputs, pd_status *st) {
  if (!b || !s)
    return pdc_error(st, PD_INVALID_ARGUMENT, "batch or session is NULL");
  Paradev__V1__Operation probe;
  pd_code rc = pdc_op_build(&probe, s, op, inputs, n_inputs, attrs, output_ids,
                            n_outputs, st);
  if (rc != PD_OK) return rc;
  if (b->n == b->cap) {
    int cap = b->cap ? b->cap * 2 : 16;
    pdc_batch_op *n = realloc(b->ops, (size_t)cap * sizeof(*n));
    if (!n) return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    b->ops = n;
    b->cap = cap;
  }
  pdc_batch_op *e = &b->ops[b->n];
  memset(e, 0, sizeof(*e));
  e->name = strdup(op);
  e->inputs = malloc(sizeof(uint64_t) * (size_t)(n_inputs ? n_inputs : 1));
  e->outputs = malloc(sizeof(uint64_t) * (size_t)(n_outputs ? n_outputs : 1));
  e->attrs = pd_attrs_new();
  bool ok = e->name && e->inputs && e->outputs && e->attrs;
  if (ok && attrs) ok = pdc_attrs_copy(e->attrs, attrs);
  if (!ok) {
    free(e->name);
    free(e->inputs);
    free(e->outputs);
    pd_attrs_delete(e->attrs);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  if (n_inputs) memcpy(e->inputs, inputs, sizeof(uint64_t) * (size_t)n_inputs);
  if (n_outputs)
    memcpy(e->outputs, output_ids, sizeof(uint64_t) * (size_t)n_outputs);
  e->n_inputs = n_inputs;
  e->n_outputs = n_outputs;
  b->n++;
  b->n_outputs += n_outputs;
  pdc_ok(st);
  return PD_OK;
}

pd_code pd_execute_batch(pd_session *s, const pd_batch *b,
                         pd_tensor_info *outputs, const pd_call_options *call,
                         pd_status *st) {
  pd_code rc = pdc_session_check(s, st);
  if (rc != PD_OK) return rc;
  if (!b || b->n == 0)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "the batch is empty; add ops with pd_batch_add");
  Paradev__V1__Operation *ops = calloc((size_t)b->n, sizeof(*ops));
  Paradev__V1__Operation **ptrs = calloc((size_t)b->n, sizeof(*ptrs));
  if (!ops || !ptrs) {
    free(ops);
    free(ptrs);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (int i = 0; i < b->n; i++) {
    const pdc_batch_op *e = &b->ops[i];
    pdc_op_build(&ops[i], s, e->name, e->inputs, e->n_inputs, e->attrs,
                 e->outputs, e->n_outputs, NULL);
    ptrs[i] = &ops[i];
  }
  rc = pdc_execute_ops(s, ptrs, (size_t)b->n, outputs, call, st);
  free(ops);
  free(ptrs);
  return rc;
}

/* --- Sync, Describe, Delete ------------------------------------------------------- */

static pd_code pdc_check_ids(const uint64_t *ids, int n, pd_status *st) {
  if (n < 0 || (n > 0 && !ids))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%d ids (ids %s); expected n >= 0 and the ids", n,
                     ids ? "given" : "NULL");
  return PD_OK;
}

pd_code pd_sync(pd_session *s, const uint64_t *ids, int n, uint64_t *failed_id,
                const pd_call_options *call, pd_status *st) {
  pd_code rc = pdc_session_check(s, st);
  if (rc == PD_OK) rc = pdc_check_ids(ids, n, st);
  if (rc != PD_OK) return rc;
  Paradev__V1__SyncRequest req = PARADEV__V1__SYNC_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.n_ids = (size_t)n;
  req.ids = (uint64_t *)ids;
  Paradev__V1__SyncResponse *resp = NULL;
  rc = pdc_unary(s->c, PDC_SYNC, &req.base,
                 &paradev__v1__sync_response__descriptor,
                 (ProtobufCMessage **)&resp, call, st);
  if (rc != PD_OK) {
    if (failed_id) *failed_id = 0;
    return rc;
  }
  pdc_session_touch(s);
  const Paradev__V1__Status *e = resp->error;
  if (e && e->code != 0) {
    pd_code code = (unsigned)e->code <= PD_UNAUTHENTICATED ? (pd_code)e->code
                                                           : PD_UNKNOWN;
    rc = pdc_error(st, code, "handle %" PRIu64 " failed: %s", resp->failed_id,
                   e->message ? e->message : "");
    if (failed_id) *failed_id = resp->failed_id;
  } else {
    pdc_ok(st);
    if (failed_id) *failed_id = 0;
  }
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

struct pd_description {
  Paradev__V1__DescribeResponse *pb;
};

pd_description *pd_describe(pd_session *s, const uint64_t *ids, int n,
                            const pd_call_options *call, pd_status *st) {
  if (pdc_session_check(s, st) != PD_OK || pdc_check_ids(ids, n, st) != PD_OK)
    return NULL;
  Paradev__V1__DescribeRequest req = PARADEV__V1__DESCRIBE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.n_ids = (size_t)n;
  req.ids = (uint64_t *)ids;
  Paradev__V1__DescribeResponse *resp = NULL;
  if (pdc_unary(s->c, PDC_DESCRIBE, &req.base,
                &paradev__v1__describe_response__descriptor,
                (ProtobufCMessage **)&resp, call, st) != PD_OK)
    return NULL;
  pdc_session_touch(s);
  const char *bad = resp->n_tensors != (size_t)n ? "a count" : NULL;
  for (size_t i = 0; !bad && i < resp->n_tensors; i++) {
    const Paradev__V1__TensorDescription *t = resp->tensors[i];
    if (!t->shape || t->shape->n_dims > PD_MAX_RANK) bad = "a shape";
    for (size_t k = 0; !bad && k < t->n_component_shapes; k++)
      if (t->component_shapes[k]->n_dims > PD_MAX_RANK) bad = "a shape";
  }
  pd_description *d = bad ? NULL : malloc(sizeof(*d));
  if (!d) {
    if (bad)
      pdc_error(st, PD_INTERNAL, "Describe: the reply has %s out of range", bad);
    else
      pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return NULL;
  }
  d->pb = resp;
  pdc_ok(st);
  return d;
}

void pd_description_delete(pd_description *d) {
  if (!d) return;
  protobuf_c_message_free_unpacked(&d->pb->base, NULL);
  free(d);
}

int pd_description_count(const pd_description *d) {
  return d ? (int)d->pb->n_tensors : 0;
}

static const Paradev__V1__TensorDescription *pdc_desc(const pd_description *d,
                                                      int i) {
  if (!d || i < 0 || (size_t)i >= d->pb->n_tensors) return NULL;
  return d->pb->tensors[i];
}

bool pd_description_info(const pd_description *d, int i, pd_tensor_info *out) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  if (!t || !out) return false;
  out->id = t->id;
  out->dtype = (pd_dtype)t->dtype;
  return pdc_shape_from_pb(t->shape, out);
}

int pd_description_num_components(const pd_description *d, int i) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  return t ? (int)t->n_component_shapes : 0;
}

bool pd_description_component(const pd_description *d, int i, int component,
                              pd_tensor_info *out) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  if (!t || !out || component < 0 || (size_t)component >= t->n_component_shapes)
    return false;
  out->id = t->id;
  out->dtype = (pd_dtype)t->dtype;
  return pdc_shape_from_pb(t->component_shapes[component], out);
}

uint64_t pd_description_bytes(const pd_description *d, int i) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  return t ? t->bytes : 0;
}

bool pd_description_ready(const pd_description *d, int i) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  return t && t->ready;
}

pd_code pd_description_status(const pd_description *d, int i,
                              const char **message) {
  const Paradev__V1__TensorDescription *t = pdc_desc(d, i);
  if (!t || !t->status || t->status->code == 0) {
    if (message) *message = "";
    return PD_OK;
  }
  if (message) *message = t->status->message ? t->status->message : "";
  return (unsigned)t->status->code <= PD_UNAUTHENTICATED
             ? (pd_code)t->status->code
             : PD_UNKNOWN;
}

pd_code pd_delete(pd_session *s, const uint64_t *ids, int n,
                  const pd_call_options *call, pd_status *st) {
  pd_code rc = pdc_session_check(s, st);
  if (rc == PD_OK) rc = pdc_check_ids(ids, n, st);
  if (rc != PD_OK) return rc;
  Paradev__V1__DeleteRequest req = PARADEV__V1__DELETE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.n_ids = (size_t)n;
  req.ids = (uint64_t *)ids;
  Paradev__V1__DeleteResponse *resp = NULL;
  rc = pdc_unary(s->c, PDC_DELETE, &req.base,
                 &paradev__v1__delete_response__descriptor,
                 (ProtobufCMessage **)&resp, call, st);
  if (rc != PD_OK) return rc;
  pdc_session_touch(s);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return PD_OK;
}
