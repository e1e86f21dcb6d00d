/* libparadev: graph functions (include/paradev/function.h). The pd_function
 * builder keeps a FunctionDef message whose strings and arrays it owns;
 * registering packs it as RegisterFunction or as an Enqueue item.
 * DescribeFunction's answer is turned into JSON (protobuf's JSON mapping,
 * fields by their proto names) by a walk over the message's descriptor,
 * with json-c. */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

typedef struct pdc_fn_node {
  Paradev__V1__FunctionNode pb; /* strings and inputs owned here */
  pd_attrs *attrs;              /* a copy; NULL: none */
} pdc_fn_node;

struct pd_function {
  char *name;
  Paradev__V1__FunctionArg **args;
  size_t n_args, cap_args;
  pdc_fn_node **nodes;
  size_t n_nodes, cap_nodes;
  Paradev__V1__FunctionOutput **outputs;
  size_t n_outputs, cap_outputs;
  Paradev__V1__FunctionOptions options;
  pd_code err; /* the first error a void or index-returning call met */
  char err_msg[256];
};

static const char *const pdc_pass_names[PD_PASS_COUNT] = {
    "pruning",         "cse",       "constant_folding", "arithmetic", "fusion",
    "buffer_planning", "cuda_graph"};

const char *pd_pass_name(pd_pass p) {
  return (int)p >= 0 && (int)p < PD_PASS_COUNT ? pdc_pass_names[p] : NULL;
}

pd_function *pd_function_new(const char *name) {
  pd_function *f = calloc(1, sizeof(*f));
  if (!f) return NULL;
  f->name = strdup(name ? name : "");
  if (!f->name) {
    free(f);
    return NULL;
  }
  paradev__v1__function_options__init(&f->options);
  return f;
}

static void pdc_fn_node_free(pdc_fn_node *n) {
  if (!n) return;
  free(n->pb.name);
  free(n->pb.op);
  for (size_t i = 0; i < n->pb.n_inputs; i++) free(n->pb.inputs[i]);
  free(n->pb.inputs);
  pd_attrs_delete(n->attrs);
  free(n);
}

void pd_function_delete(pd_function *f) {
  if (!f) return;
  for (size_t i = 0; i < f->n_args; i++) {
    free(f->args[i]->name);
    free(f->args[i]);
  }
  for (size_t i = 0; i < f->n_nodes; i++) pdc_fn_node_free(f->nodes[i]);
  for (size_t i = 0; i < f->n_outputs; i++) {
    free(f->outputs[i]->name);
    free(f->outputs[i]->source);
    free(f->outputs[i]);
  }
  free(f->args);
  free(f->nodes);
  free(f->outputs);
  free(f->name);
  free(f);
}

/* Remembers the first error (the registration reports it). */
static void pdc_fn_fail(pd_function *f, pd_code code, const char *msg) {
  if (f->err != PD_OK) return;
  f->err = code;
  snprintf(f->err_msg, sizeof(f->err_msg), "%s", msg);
}

/* Room for one more pointer in *arr (n used of *cap). */
static bool pdc_grow(void *arr, size_t n, size_t *cap) {
  void ***a = arr;
  if (n < *cap) return true;
  size_t nc = *cap ? *cap * 2 : 8;
  void **p = realloc(*a, nc * sizeof(*p));
  if (!p) return false;
  *a = p;
  *cap = nc;
  return true;
}

int pd_function_add_arg(pd_function *f, const char *name, pd_dtype dtype) {
  if (!f) return -1;
  if (!name || !*name) {
    pdc_fn_fail(f, PD_INVALID_ARGUMENT,
                "pd_function_add_arg: an argument with a NULL or empty name");
    return -1;
  }
  Paradev__V1__FunctionArg *a = calloc(1, sizeof(*a));
  char *nm = strdup(name);
  if (!a || !nm || !pdc_grow(&f->args, f->n_args, &f->cap_args)) {
    free(a);
    free(nm);
    pdc_fn_fail(f, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return -1;
  }
  paradev__v1__function_arg__init(a);
  a->name = nm;
  a->dtype = (Paradev__V1__DType)dtype;
  f->args[f->n_args] = a;
  return (int)f->n_args++;
}

static pd_code pdc_fn_node_fill(pdc_fn_node *n, const char *name,
                                const char *op, const char *const *inputs,
                                int n_inputs, const pd_attrs *attrs) {
  paradev__v1__function_node__init(&n->pb);
  n->pb.name = strdup(name);
  n->pb.op = strdup(op);
  n->pb.inputs = calloc((size_t)n_inputs + 1, sizeof(char *));
  if (!n->pb.name || !n->pb.op || !n->pb.inputs) return PD_RESOURCE_EXHAUSTED;
  for (int i = 0; i < n_inputs; i++) {
    if (!(n->pb.inputs[i] = strdup(inputs[i] ? inputs[i] : "")))
      return PD_RESOURCE_EXHAUSTED;
    n->pb.n_inputs = (size_t)i + 1;
  }
  if (attrs) {
    if (!(n->attrs = pd_attrs_new()) || !pdc_attrs_copy(n->attrs, attrs))
      return PD_RESOURCE_EXHAUSTED;
  }
  return PD_OK;
}

pd_code pd_function_add_node(pd_function *f, const char *name, const char *op,
                             const char *const *inputs, int n_inputs,
                             const pd_attrs *attrs, pd_status *st) {
  if (!f) return pdc_error(st, PD_INVALID_ARGUMENT, "function is NULL");
  if (!name || !*name || !op || !*op || n_inputs < 0 ||
      (n_inputs > 0 && !inputs))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_function_add_node: name '%s', op '%s', %d inputs "
                     "(%s); expected a name, an op and n_inputs >= 0 inputs",
                     name ? name : "(null)", op ? op : "(null)", n_inputs,
                     inputs ? "given" : "NULL");
  pdc_fn_node *n = calloc(1, sizeof(*n));
  if (!n || pdc_fn_node_fill(n, name, op, inputs, n_inputs, attrs) != PD_OK ||
      !pdc_grow(&f->nodes, f->n_nodes, &f->cap_nodes)) {
    pdc_fn_node_free(n);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  f->nodes[f->n_nodes++] = n;
  return PD_OK;
}

pd_code pd_function_add_output(pd_function *f, const char *name,
                               const char *source, pd_status *st) {
  if (!f) return pdc_error(st, PD_INVALID_ARGUMENT, "function is NULL");
  if (!name || !*name || !source || !*source)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_function_add_output: name '%s', source '%s'; "
                     "expected both",
                     name ? name : "(null)", source ? source : "(null)");
  Paradev__V1__FunctionOutput *o = calloc(1, sizeof(*o));
  char *nm = strdup(name), *src = strdup(source);
  if (!o || !nm || !src ||
      !pdc_grow(&f->outputs, f->n_outputs, &f->cap_outputs)) {
    free(o);
    free(nm);
    free(src);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  paradev__v1__function_output__init(o);
  o->name = nm;
  o->source = src;
  f->outputs[f->n_outputs++] = o;
  return PD_OK;
}

void pd_function_set_pass(pd_function *f, pd_pass pass, pd_tristate v) {
  if (!f) return;
  if ((int)pass < 0 || (int)pass >= PD_PASS_COUNT || (int)v < 0 || (int)v > 2) {
    pdc_fn_fail(f, PD_INVALID_ARGUMENT,
                "pd_function_set_pass: a pass outside pd_pass or a value "
                "outside pd_tristate");
    return;
  }
  Paradev__V1__TriState t = (Paradev__V1__TriState)v;
  Paradev__V1__FunctionOptions *o = &f->options;
  Paradev__V1__TriState *slot[PD_PASS_COUNT] = {
      &o->pruning,    &o->cse,    &o->constant_folding,
      &o->arithmetic, &o->fusion, &o->buffer_planning,
      &o->cuda_graph};
  *slot[pass] = t;
}

void pd_function_set_max_instantiations(pd_function *f, int n) {
  if (!f) return;
  if (n < 0) {
    pdc_fn_fail(f, PD_INVALID_ARGUMENT,
                "pd_function_set_max_instantiations: a negative count");
    return;
  }
  f->options.max_instantiations = (uint32_t)n;
}

/* The FunctionDef of `f` in `pb`, pointing into `f`; *nodes (free it) holds
 * the node pointers. */
static pd_code pdc_fn_message(const pd_function *f,
                              Paradev__V1__FunctionDef *pb,
                              Paradev__V1__FunctionNode ***nodes,
                              pd_status *st) {
  if (f->err != PD_OK) return pdc_error(st, f->err, "%s", f->err_msg);
  *nodes = calloc(f->n_nodes + 1, sizeof(**nodes));
  if (!*nodes)
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t i = 0; i < f->n_nodes; i++) {
    pdc_fn_node *n = f->nodes[i];
    n->pb.n_attrs = 0;
    n->pb.attrs = NULL;
    const char *err = NULL;
    if (n->attrs && pdc_attrs_encoded(n->attrs, &n->pb.attrs, &n->pb.n_attrs,
                                      &err) != PD_OK) {
      free(*nodes);
      return pdc_error(st, PD_INVALID_ARGUMENT, "node '%s': %s", n->pb.name,
                       err ? err : "a bad attribute");
    }
    (*nodes)[i] = &n->pb;
  }
  paradev__v1__function_def__init(pb);
  pb->name = f->name;
  pb->n_args = f->n_args;
  pb->args = f->args;
  pb->n_nodes = f->n_nodes;
  pb->nodes = *nodes;
  pb->n_outputs = f->n_outputs;
  pb->outputs = f->outputs;
  pb->options = (Paradev__V1__FunctionOptions *)&f->options;
  return PD_OK;
}

pd_code pd_register_function(pd_session *s, const pd_function *f,
                             bool *already_registered,
                             const pd_call_options *call, pd_status *st) {
  if (!f) return pdc_error(st, PD_INVALID_ARGUMENT, "function is NULL");
  PD_TRY(pdc_session_check(s, st));
  Paradev__V1__FunctionDef def;
  Paradev__V1__FunctionNode **nodes = NULL;
  PD_TRY(pdc_fn_message(f, &def, &nodes, st));
  Paradev__V1__RegisterFunctionRequest req =
      PARADEV__V1__REGISTER_FUNCTION_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.function = &def;
  ProtobufCMessage *resp = NULL;
  pd_code c = pdc_unary(s->c, PDC_M_RegisterFunction, &req.base,
                        &paradev__v1__register_function_response__descriptor,
                        &resp, call, st);
  free(nodes);
  if (c != PD_OK) return c;
  pdc_session_touch(s);
  const Paradev__V1__RegisterFunctionResponse *r = (const void *)resp;
  if (already_registered) *already_registered = r->already_registered;
  protobuf_c_message_free_unpacked(resp, NULL);
  return PD_OK;
}

pd_code pd_stream_register_function(pd_stream *t, const pd_function *f,
                                    pd_status *st) {
  if (!t) return pdc_error(st, PD_INVALID_ARGUMENT, "stream is NULL");
  if (!f) return pdc_error(st, PD_INVALID_ARGUMENT, "function is NULL");
  Paradev__V1__FunctionDef def;
  Paradev__V1__FunctionNode **nodes = NULL;
  PD_TRY(pdc_fn_message(f, &def, &nodes, st));
  Paradev__V1__RegisterFunctionRequest item =
      PARADEV__V1__REGISTER_FUNCTION_REQUEST__INIT;
  item.function = &def;
  Paradev__V1__EnqueueRequest r = PARADEV__V1__ENQUEUE_REQUEST__INIT;
  r.item_case = PARADEV__V1__ENQUEUE_REQUEST__ITEM_REGISTER_FUNCTION;
  r.register_function = &item;
  pd_code c = pdc_stream_send(t, &r, NULL, st);
  free(nodes);
  return c;
}

/* --- DescribeFunction as JSON ---------------------------------------------------- */

static json_object *pdc_msg_json(const ProtobufCMessage *m);

static json_object *pdc_bytes_json(const ProtobufCBinaryData *b) {
  static const char tab[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t n = b->len, o = 0;
  char *out = malloc(4 * ((n + 2) / 3) + 1);
  if (!out) return NULL;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)b->data[i] << 16;
    if (i + 1 < n) v |= (uint32_t)b->data[i + 1] << 8;
    if (i + 2 < n) v |= b->data[i + 2];
    out[o++] = tab[(v >> 18) & 63];
    out[o++] = tab[(v >> 12) & 63];
    out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
    out[o++] = i + 2 < n ? tab[v & 63] : '=';
  }
  out[o] = '\0';
  json_object *j = json_object_new_string(out);
  free(out);
  return j;
}

/* One value of field `f` at `p`. 64-bit integers as strings and enums by
 * name, as protobuf's JSON mapping writes them. */
static json_object *pdc_value_json(const ProtobufCFieldDescriptor *f,
                                   const void *p) {
  char buf[32];
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
      return json_object_new_int(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
      return json_object_new_int64(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
      snprintf(buf, sizeof buf, "%" PRId64, *(const int64_t *)p);
      return json_object_new_string(buf);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
      snprintf(buf, sizeof buf, "%" PRIu64, *(const uint64_t *)p);
      return json_object_new_string(buf);
    case PROTOBUF_C_TYPE_FLOAT:
      return json_object_new_double(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
      return json_object_new_double(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
      return json_object_new_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
      int v = *(const int *)p;
      const ProtobufCEnumValue *ev =
          protobuf_c_enum_descriptor_get_value(f->descriptor, v);
      return ev ? json_object_new_string(ev->name) : json_object_new_int(v);
    }
    case PROTOBUF_C_TYPE_STRING: {
      const char *s = *(char *const *)p;
      return json_object_new_string(s ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES:
      return pdc_bytes_json((const ProtobufCBinaryData *)p);
    case PROTOBUF_C_TYPE_MESSAGE:
      return pdc_msg_json(*(ProtobufCMessage *const *)p);
  }
  return NULL;
}

static size_t pdc_value_size(const ProtobufCFieldDescriptor *f) {
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: return 8;
    case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    default: return 4;
  }
}

/* Every field by its proto name: repeated ones as arrays, scalars always
 * (defaults included, so readers need no defaults of their own), unset
 * messages and oneof members left out. */
static json_object *pdc_msg_json(const ProtobufCMessage *m) {
  if (!m) return NULL;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  json_object *o = json_object_new_object();
  if (!o) return NULL;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *base = (const char *)m;
    const void *p = base + f->offset;
    json_object *v = NULL;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(const void *)(base + f->quantifier_offset);
      const char *arr = *(const char *const *)p;
      v = json_object_new_array();
      for (size_t k = 0; v && k < n; k++)
        json_object_array_add(v,
                              pdc_value_json(f, arr + k * pdc_value_size(f)));
    } else {
      if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
          *(const uint32_t *)(const void *)(base + f->quantifier_offset) !=
              f->id)
        continue;
      if (f->type == PROTOBUF_C_TYPE_MESSAGE && !*(void *const *)p) continue;
      v = pdc_value_json(f, p);
    }
    if (v) json_object_object_add(o, f->name, v);
  }
  return o;
}

pd_code pd_describe_function(pd_session *s, const char *name, char **json,
                             const pd_call_options *call, pd_status *st) {
  if (!name || !*name || !json)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_describe_function: expected a function name and a "
                     "place for the JSON");
  PD_TRY(pdc_session_check(s, st));
  Paradev__V1__DescribeFunctionRequest req =
      PARADEV__V1__DESCRIBE_FUNCTION_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.name = (char *)name;
  ProtobufCMessage *resp = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_DescribeFunction, &req.base,
                   &paradev__v1__describe_function_response__descriptor, &resp,
                   call, st));
  pdc_session_touch(s);
  json_object *o = pdc_msg_json(resp);
  protobuf_c_message_free_unpacked(resp, NULL);
  const char *text =
      o ? json_object_to_json_string_ext(
              o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)
        : NULL;
  char *copy = text ? strdup(text) : NULL;
  json_object_put(o);
  if (!copy) return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  *json = copy;
  return PD_OK;
}
