/* libparadev: the op reference (pd_list_ops, ListOps). The reply is copied
 * into plain pd_op_info structs that own their strings and arrays, so that
 * the protobuf message can be freed at once and bindings (the Python
 * package) can read the structs directly. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

const char *pd_attr_kind_name(pd_attr_kind kind) {
  switch (kind) {
    case PD_ATTR_KIND_INT: return "int";
    case PD_ATTR_KIND_FLOAT: return "float";
    case PD_ATTR_KIND_BOOL: return "bool";
    case PD_ATTR_KIND_STRING: return "string";
    case PD_ATTR_KIND_DTYPE: return "dtype";
    case PD_ATTR_KIND_SHAPE: return "shape";
    case PD_ATTR_KIND_INT_LIST: return "list(int)";
    case PD_ATTR_KIND_FLOAT_LIST: return "list(float)";
    case PD_ATTR_KIND_INVALID: break;
  }
  return "invalid";
}

/* Copies of the reply's strings; false when out of memory. */
static bool pdc_dup(const char **dst, const char *src) {
  *dst = strdup(src ? src : "");
  return *dst != NULL;
}

static void pdc_arg_free(pd_op_arg *a) {
  free((char *)a->name);
  free((char *)a->dtype_rule);
  free((char *)a->doc);
  free((char *)a->length_attr);
}

static bool pdc_arg_from_pb(pd_op_arg *a, const Paradev__V1__ArgDef *pb) {
  a->is_list = pb->is_list;
  a->min_length = pb->min_length;
  for (size_t i = 0; i < pb->n_dtypes; i++)
    if ((int)pb->dtypes[i] > 0 && (int)pb->dtypes[i] < PD_DTYPE_COUNT)
      a->dtypes |= PD_DTYPE_BIT(pb->dtypes[i]);
  return pdc_dup(&a->name, pb->name) &&
         pdc_dup(&a->dtype_rule, pb->dtype_rule) && pdc_dup(&a->doc, pb->doc) &&
         pdc_dup(&a->length_attr, pb->length_attr);
}

static void pdc_attr_free(pd_op_attr *a) {
  free((char *)a->name);
  free((char *)a->doc);
  free((char *)a->default_value.s);
  free((void *)a->default_value.ints);
  free((void *)a->default_value.floats);
  for (int i = 0; i < a->num_allowed_values; i++)
    free((char *)a->allowed_values[i]);
  free((void *)a->allowed_values);
}

/* The default value; false when out of memory. */
static bool pdc_value_from_pb(pd_attr_value *v,
                              const Paradev__V1__AttrValue *pb) {
  const int64_t *ints = NULL;
  const double *floats = NULL;
  size_t n = 0;
  switch (pb->value_case) {
    case PARADEV__V1__ATTR_VALUE__VALUE_I: v->i = pb->i; break;
    case PARADEV__V1__ATTR_VALUE__VALUE_F: v->f = pb->f; break;
    case PARADEV__V1__ATTR_VALUE__VALUE_B: v->b = pb->b; break;
    case PARADEV__V1__ATTR_VALUE__VALUE_S: return pdc_dup(&v->s, pb->s);
    case PARADEV__V1__ATTR_VALUE__VALUE_DTYPE:
      v->dtype = (pd_dtype)pb->dtype;
      break;
    case PARADEV__V1__ATTR_VALUE__VALUE_SHAPE:
      if (pb->shape) ints = pb->shape->dims, n = pb->shape->n_dims;
      break;
    case PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST:
      if (pb->int_list) ints = pb->int_list->values, n = pb->int_list->n_values;
      break;
    case PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST:
      if (pb->float_list)
        floats = pb->float_list->values, n = pb->float_list->n_values;
      break;
    default: break;
  }
  v->n = (int)n;
  if (n && ints) {
    int64_t *p = malloc(n * sizeof *p);
    if (!p) return false;
    memcpy(p, ints, n * sizeof *p);
    v->ints = p;
  }
  if (n && floats) {
    double *p = malloc(n * sizeof *p);
    if (!p) return false;
    memcpy(p, floats, n * sizeof *p);
    v->floats = p;
  }
  return true;
}

static bool pdc_attr_from_pb(pd_op_attr *a, const Paradev__V1__AttrDef *pb) {
  a->kind = (pd_attr_kind)pb->kind;
  a->default_value.kind = a->kind;
  a->has_minimum = pb->has_minimum;
  a->minimum = pb->minimum;
  a->has_maximum = pb->has_maximum;
  a->maximum = pb->maximum;
  if (!pdc_dup(&a->name, pb->name) || !pdc_dup(&a->doc, pb->doc)) return false;
  if (pb->default_value) {
    a->has_default = true;
    if (!pdc_value_from_pb(&a->default_value, pb->default_value)) return false;
  }
  if (pb->n_allowed_values) {
    const char **v = calloc(pb->n_allowed_values, sizeof *v);
    if (!v) return false;
    a->allowed_values = v;
    for (size_t i = 0; i < pb->n_allowed_values; i++, a->num_allowed_values++)
      if (!pdc_dup(&v[i], pb->allowed_values[i])) return false;
  }
  return true;
}

static void pdc_op_free(pd_op_info *o) {
  free((char *)o->name);
  free((char *)o->summary);
  free((char *)o->notes);
  for (int i = 0; i < o->num_inputs; i++)
    pdc_arg_free((pd_op_arg *)&o->inputs[i]);
  for (int i = 0; i < o->num_outputs; i++)
    pdc_arg_free((pd_op_arg *)&o->outputs[i]);
  for (int i = 0; i < o->num_attrs; i++)
    pdc_attr_free((pd_op_attr *)&o->attrs[i]);
  free((void *)o->inputs);
  free((void *)o->outputs);
  free((void *)o->attrs);
}

/* Fills `o` (zeroed) from `pb`; on false `o` holds what was copied so far
 * (pdc_op_free frees it). */
static bool pdc_op_from_pb(pd_op_info *o, const Paradev__V1__OpDef *pb) {
  o->has_gradient = pb->has_gradient;
  o->is_collective = pb->is_collective;
  if (!pdc_dup(&o->name, pb->name) || !pdc_dup(&o->summary, pb->summary) ||
      !pdc_dup(&o->notes, pb->notes))
    return false;
  pd_op_arg *in = calloc(pb->n_inputs + 1, sizeof *in);
  pd_op_arg *out = calloc(pb->n_outputs + 1, sizeof *out);
  pd_op_attr *at = calloc(pb->n_attrs + 1, sizeof *at);
  o->inputs = in;
  o->outputs = out;
  o->attrs = at;
  if (!in || !out || !at) return false;
  for (size_t i = 0; i < pb->n_inputs; i++, o->num_inputs++)
    if (!pdc_arg_from_pb(&in[i], pb->inputs[i])) return false;
  for (size_t i = 0; i < pb->n_outputs; i++, o->num_outputs++)
    if (!pdc_arg_from_pb(&out[i], pb->outputs[i])) return false;
  for (size_t i = 0; i < pb->n_attrs; i++, o->num_attrs++)
    if (!pdc_attr_from_pb(&at[i], pb->attrs[i])) return false;
  return true;
}

pd_code pd_list_ops(pd_client *c, const char *name, pd_op_info **ops,
                    int *n_ops, const pd_call_options *call, pd_status *st) {
  if (!c) return pdc_error(st, PD_INVALID_ARGUMENT, "client is NULL");
  if (!ops || !n_ops)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_list_ops: ops and n_ops must not be NULL");
  Paradev__V1__ListOpsRequest req = PARADEV__V1__LIST_OPS_REQUEST__INIT;
  req.name = (char *)(name ? name : "");
  Paradev__V1__ListOpsResponse *resp = NULL;
  PD_TRY(pdc_unary(c, PDC_M_ListOps, &req.base,
                   &paradev__v1__list_ops_response__descriptor,
                   (ProtobufCMessage **)&resp, call, st));
  size_t n = resp->n_ops;
  pd_op_info *arr = calloc(n + 1, sizeof *arr);
  bool ok = arr != NULL;
  for (size_t i = 0; ok && i < n; i++)
    ok = pdc_op_from_pb(&arr[i], resp->ops[i]);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  if (!ok) {
    pd_ops_free(arr, arr ? (int)n : 0);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of memory copying the op reference");
  }
  *ops = arr;
  *n_ops = (int)n;
  return PD_OK;
}

void pd_ops_free(pd_op_info *ops, int n_ops) {
  if (!ops) return;
  for (int i = 0; i < n_ops; i++) pdc_op_free(&ops[i]);
  free(ops);
}

const pd_op_info *pd_ops_find(const pd_op_info *ops, int n_ops,
                              const char *name) {
  for (int i = 0; ops && name && i < n_ops; i++)
    if (strcmp(ops[i].name, name) == 0) return &ops[i];
  return NULL;
}

const pd_op_attr *pd_op_info_attr(const pd_op_info *op, const char *name) {
  for (int i = 0; op && name && i < op->num_attrs; i++)
    if (strcmp(op->attrs[i].name, name) == 0) return &op->attrs[i];
  return NULL;
}
