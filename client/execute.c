/* libparadev: execution: pd_execute / pd_execute_on (one op, with its
 * placement) and pd_batch (many ops in one Execute request). Encoding is encode.c's; the call is call.c's. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

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
  PD_TRY(pdc_unary(s->c, PDC_M_Execute, &req.base,
                   &paradev__v1__execute_response__descriptor,
                   (ProtobufCMessage **)&resp, call, st));
  pd_code rc = PD_OK;
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
      rc =
          pdc_error(st, PD_INTERNAL, "Execute: op %zu has %zu outputs; %zu ids",
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

pd_code pd_execute_on(pd_session *s, const int32_t *devices, int n_devices,
                      const char *op, const uint64_t *inputs, int n_inputs,
                      const pd_attrs *attrs, uint64_t *output_ids,
                      int n_outputs, pd_tensor_info *outputs,
                      const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  Paradev__V1__Operation o;
  PD_TRY(pdc_op_build(&o, s, op, inputs, n_inputs, attrs, output_ids, n_outputs,
                      st));
  PD_TRY(pdc_op_place(&o, devices, n_devices, st));
  Paradev__V1__Operation *ops[1] = {&o};
  return pdc_execute_ops(s, ops, 1, outputs, call, st);
}

pd_code pd_execute(pd_session *s, const char *op, const uint64_t *inputs,
                   int n_inputs, const pd_attrs *attrs, uint64_t *output_ids,
                   int n_outputs, pd_tensor_info *outputs,
                   const pd_call_options *call, pd_status *st) {
  return pd_execute_on(s, NULL, 0, op, inputs, n_inputs, attrs, output_ids,
                       n_outputs, outputs, call, st);
}

/* --- batches ---------------------------------------------------------------------- */

typedef struct pdc_batch_op {
  char *name;
  uint64_t *inputs;
  int n_inputs;
  pd_attrs *attrs;
  uint64_t *outputs;
  int n_outputs;
  int32_t *devices; /* the placement, or NULL */
  int n_devices;
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
    free(b->ops[i].devices);
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
                     const pd_attrs *attrs, uint64_t *output_ids, int n_outputs,
                     pd_status *st) {
  return pd_batch_add_on(b, s, NULL, 0, op, inputs, n_inputs, attrs, output_ids,
                         n_outputs, st);
}

pd_code pd_batch_add_on(pd_batch *b, pd_session *s, const int32_t *devices,
                        int n_devices, const char *op, const uint64_t *inputs,
                        int n_inputs, const pd_attrs *attrs,
                        uint64_t *output_ids, int n_outputs, pd_status *st) {
  if (!b || !s)
    return pdc_error(st, PD_INVALID_ARGUMENT, "batch or session is NULL");
  Paradev__V1__Operation probe;
  PD_TRY(pdc_op_build(&probe, s, op, inputs, n_inputs, attrs, output_ids,
                      n_outputs, st));
  PD_TRY(pdc_op_place(&probe, devices, n_devices, st));
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
  e->devices = n_devices ? malloc(sizeof(int32_t) * (size_t)n_devices) : NULL;
  bool ok = e->name && e->inputs && e->outputs && e->attrs &&
            (e->devices || !n_devices);
  if (ok && attrs) ok = pdc_attrs_copy(e->attrs, attrs);
  if (!ok) {
    free(e->name);
    free(e->inputs);
    free(e->outputs);
    free(e->devices);
    pd_attrs_delete(e->attrs);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  if (n_devices)
    memcpy(e->devices, devices, sizeof(int32_t) * (size_t)n_devices);
  e->n_devices = n_devices;
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
  PD_TRY(pdc_session_check(s, st));
  pd_code rc = PD_OK;
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
    pdc_op_place(&ops[i], e->devices, e->n_devices, NULL);
    ptrs[i] = &ops[i];
  }
  rc = pdc_execute_ops(s, ptrs, (size_t)b->n, outputs, call, st);
  free(ops);
  free(ptrs);
  return rc;
}
