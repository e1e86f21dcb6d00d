/* dev_fn_def <-> serialized paradev.v1.FunctionDef for optimizer plugins
 * (optimizer_convert.h). Packing builds the proto in a srv_arena and packs
 * it; unpacking lays the def out in one block: a first walk over the
 * parsed proto counts the bytes, a second fills them. */
#include "optimizer_convert.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "convert.h"
#include "paradev/v1/paradev.pb-c.h"

/* --- packing ------------------------------------------------------------------ */

static char *pk_str(srv_arena *a, const char *s, size_t n) {
  char *c = srv_arena_alloc(a, n + 1);
  if (c && n) memcpy(c, s, n);
  return c;
}

static Paradev__V1__Shape *pk_shape(srv_arena *a, const dev_shape *s) {
  Paradev__V1__Shape *p = srv_arena_alloc(a, sizeof *p);
  int64_t *d = srv_arena_alloc(a, sizeof(int64_t) * (size_t)(s->rank + 1));
  if (!p || !d) return NULL;
  paradev__v1__shape__init(p);
  memcpy(d, s->dims, sizeof(int64_t) * (size_t)s->rank);
  p->n_dims = (size_t)s->rank;
  p->dims = d;
  return p;
}

static pd_code pk_attr_value(srv_arena *a, const dev_attr *at,
                             Paradev__V1__AttrValue *v, dev_status *st) {
  const dev_attr_value *x = &at->value;
  switch (x->type) {
    case DEV_ATTR_INT:
      v->value_case = PARADEV__V1__ATTR_VALUE__VALUE_I, v->i = x->u.i;
      return PD_OK;
    case DEV_ATTR_FLOAT:
      v->value_case = PARADEV__V1__ATTR_VALUE__VALUE_F, v->f = x->u.f;
      return PD_OK;
    case DEV_ATTR_BOOL:
      v->value_case = PARADEV__V1__ATTR_VALUE__VALUE_B, v->b = x->u.b;
      return PD_OK;
    case DEV_ATTR_STRING:
      v->value_case = PARADEV__V1__ATTR_VALUE__VALUE_S;
      v->s = pk_str(a, x->u.s.ptr, x->u.s.ptr ? x->u.s.len : 0);
      return v->s ? PD_OK : PD_RESOURCE_EXHAUSTED;
    case DEV_ATTR_DTYPE:
      v->value_case = PARADEV__V1__ATTR_VALUE__VALUE_DTYPE;
      v->dtype = (Paradev__V1__DType)x->u.dtype;
      return PD_OK;
    case DEV_ATTR_SHAPE:
      if (x->u.shape.rank < 0 || x->u.shape.rank > PD_MAX_RANK) break;
      v->value_case = PARADEV__V1__ATTR_VALUE__VALUE_SHAPE;
      v->shape = pk_shape(a, &x->u.shape);
      return v->shape ? PD_OK : PD_RESOURCE_EXHAUSTED;
    case DEV_ATTR_INT_LIST: {
      Paradev__V1__IntList *l = srv_arena_alloc(a, sizeof *l);
      if (!l) return PD_RESOURCE_EXHAUSTED;
      paradev__v1__int_list__init(l);
      l->n_values = x->u.ilist.n > 0 ? (size_t)x->u.ilist.n : 0;
      l->values = (int64_t *)x->u.ilist.v;
      v->value_case = PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST, v->int_list = l;
      return PD_OK;
    }
    case DEV_ATTR_FLOAT_LIST: {
      Paradev__V1__FloatList *l = srv_arena_alloc(a, sizeof *l);
      if (!l) return PD_RESOURCE_EXHAUSTED;
      paradev__v1__float_list__init(l);
      l->n_values = x->u.flist.n > 0 ? (size_t)x->u.flist.n : 0;
      l->values = (double *)x->u.flist.v;
      v->value_case = PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST;
      v->float_list = l;
      return PD_OK;
    }
    default: break;
  }
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "attr %.64s: type %d or its value is outside what a "
                   "FunctionDef carries",
                   at->name ? at->name : "", (int)x->type);
}

static char **pk_strs(srv_arena *a, const char *const *s, int n) {
  char **p = srv_arena_alloc(a, sizeof(char *) * (size_t)(n + 1));
  for (int i = 0; p && i < n; i++) {
    const char *x = s[i] ? s[i] : "";
    if (!(p[i] = pk_str(a, x, strlen(x)))) return NULL;
  }
  return p;
}

static pd_code pk_node(srv_arena *a, const dev_fn_node *nd,
                       Paradev__V1__FunctionNode **out, dev_status *st) {
  Paradev__V1__FunctionNode *p = srv_arena_alloc(a, sizeof *p);
  if (!p) return PD_RESOURCE_EXHAUSTED;
  paradev__v1__function_node__init(p);
  p->name = (char *)(nd->name ? nd->name : "");
  p->op = (char *)(nd->op ? nd->op : "");
  p->n_inputs = (size_t)nd->num_inputs;
  p->n_origins = (size_t)nd->num_origins;
  p->inputs = pk_strs(a, nd->inputs, nd->num_inputs);
  p->origins = pk_strs(a, nd->origins, nd->num_origins);
  p->attrs = srv_arena_alloc(a, sizeof(void *) * (size_t)(nd->num_attrs + 1));
  p->outputs_info =
      srv_arena_alloc(a, sizeof(void *) * (size_t)(nd->num_outputs_info + 1));
  if (!p->inputs || !p->origins || !p->attrs || !p->outputs_info)
    return PD_RESOURCE_EXHAUSTED;
  for (int i = 0; i < nd->num_attrs; i++) {
    if (nd->attrs[i].value.type == DEV_ATTR_NONE) continue; /* absent */
    Paradev__V1__Attr *at = srv_arena_alloc(a, sizeof *at);
    Paradev__V1__AttrValue *v = srv_arena_alloc(a, sizeof *v);
    if (!at || !v) return PD_RESOURCE_EXHAUSTED;
    paradev__v1__attr__init(at);
    paradev__v1__attr_value__init(v);
    at->name = (char *)(nd->attrs[i].name ? nd->attrs[i].name : "");
    at->value = v;
    pd_code rc = pk_attr_value(a, &nd->attrs[i], v, st);
    if (rc == PD_RESOURCE_EXHAUSTED) return rc;
    if (rc != PD_OK)
      return dev_error(st, rc, "node %.128s: %s", p->name, st ? st->msg : "");
    p->attrs[p->n_attrs++] = at;
  }
  for (int i = 0; i < nd->num_outputs_info; i++) {
    const dev_fn_value_info *vi = &nd->outputs_info[i];
    Paradev__V1__ValueInfo *q = srv_arena_alloc(a, sizeof *q);
    if (!q) return PD_RESOURCE_EXHAUSTED;
    paradev__v1__value_info__init(q);
    q->dtype = (Paradev__V1__DType)vi->dtype;
    if (vi->shape.rank < 0 || vi->shape.rank > PD_MAX_RANK)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "node %.128s: output %d has rank %d; at most %d",
                       p->name, i, vi->shape.rank, PD_MAX_RANK);
    if (!(q->shape = pk_shape(a, &vi->shape))) return PD_RESOURCE_EXHAUSTED;
    p->outputs_info[p->n_outputs_info++] = q;
  }
  *out = p;
  return PD_OK;
}

static pd_code pk_def(srv_arena *a, const dev_fn_def *def,
                      Paradev__V1__FunctionDef *p, dev_status *st) {
  paradev__v1__function_def__init(p);
  p->name = (char *)(def->name ? def->name : "");
  p->args = srv_arena_alloc(a, sizeof(void *) * (size_t)(def->num_args + 1));
  p->nodes = srv_arena_alloc(a, sizeof(void *) * (size_t)(def->num_nodes + 1));
  p->outputs =
      srv_arena_alloc(a, sizeof(void *) * (size_t)(def->num_outputs + 1));
  if (!p->args || !p->nodes || !p->outputs) return PD_RESOURCE_EXHAUSTED;
  for (int i = 0; i < def->num_args; i++) {
    Paradev__V1__FunctionArg *q = srv_arena_alloc(a, sizeof *q);
    if (!q) return PD_RESOURCE_EXHAUSTED;
    paradev__v1__function_arg__init(q);
    q->name = (char *)(def->args[i].name ? def->args[i].name : "");
    q->dtype = (Paradev__V1__DType)def->args[i].dtype;
    p->args[p->n_args++] = q;
  }
  for (int i = 0; i < def->num_nodes; i++) {
    PD_TRY(pk_node(a, &def->nodes[i], &p->nodes[i], st));
    p->n_nodes++;
  }
  for (int i = 0; i < def->num_outputs; i++) {
    Paradev__V1__FunctionOutput *q = srv_arena_alloc(a, sizeof *q);
    if (!q) return PD_RESOURCE_EXHAUSTED;
    paradev__v1__function_output__init(q);
    q->name = (char *)(def->outputs[i].name ? def->outputs[i].name : "");
    q->source = (char *)(def->outputs[i].source ? def->outputs[i].source : "");
    p->outputs[p->n_outputs++] = q;
  }
  return PD_OK;
}

size_t srv_fn_def_packed(const dev_fn_def *def, uint8_t **out, dev_status *st) {
  srv_arena a = {NULL};
  Paradev__V1__FunctionDef p;
  size_t n = 0;
  uint8_t *buf = NULL;
  pd_code rc = pk_def(&a, def, &p, st);
  if (rc == PD_OK) {
    n = paradev__v1__function_def__get_packed_size(&p);
    if ((buf = malloc(n ? n : 1)))
      paradev__v1__function_def__pack(&p, buf);
    else
      rc = PD_RESOURCE_EXHAUSTED;
  }
  srv_arena_free(&a);
  if (rc != PD_OK) {
    if (rc == PD_RESOURCE_EXHAUSTED)
      dev_error(st, rc, "function %.128s: out of memory serializing it",
                def->name ? def->name : "");
    return 0;
  }
  *out = buf;
  return n;
}

/* --- unpacking ----------------------------------------------------------------- */

/* A bump allocator over one block; with base NULL it only counts. */
typedef struct up_blk {
  char *base;
  size_t off;
} up_blk;

static void *up_take(up_blk *b, size_t n) {
  void *p = b->base ? b->base + b->off : NULL;
  b->off += (n + 15) & ~(size_t)15;
  return p;
}

static const char *up_str(up_blk *b, const char *s) {
  size_t n = s ? strlen(s) : 0;
  char *c = up_take(b, n + 1);
  if (c) memcpy(c, s ? s : "", n + 1);
  return c;
}

static const char *const *up_strs(up_blk *b, char **s, size_t n) {
  const char **p = up_take(b, sizeof(char *) * n);
  for (size_t i = 0; i < n; i++) {
    const char *c = up_str(b, s[i]);
    if (p) p[i] = c;
  }
  return p;
}

static pd_code up_dtype(int v, bool invalid_ok, pd_dtype *out) {
  if (v < (invalid_ok ? 0 : 1) || v >= PD_DTYPE_COUNT)
    return PD_INVALID_ARGUMENT;
  *out = (pd_dtype)v;
  return PD_OK;
}

static pd_code up_shape(const Paradev__V1__Shape *p, dev_shape *out) {
  size_t n = p ? p->n_dims : 0;
  if (n > PD_MAX_RANK) return PD_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  out->rank = (int)n;
  for (size_t i = 0; i < n; i++) out->dims[i] = p->dims[i];
  return PD_OK;
}

/* One attribute's value; a message naming `an` on error. */
static pd_code up_attr_value(up_blk *b, const char *node, const char *an,
                             const Paradev__V1__AttrValue *v,
                             dev_attr_value *out, dev_status *st) {
  int vc = v ? (int)v->value_case : 0;
  memset(out, 0, sizeof *out);
  switch (vc) {
    case PARADEV__V1__ATTR_VALUE__VALUE_I:
      out->type = DEV_ATTR_INT, out->u.i = v->i;
      return PD_OK;
    case PARADEV__V1__ATTR_VALUE__VALUE_F:
      out->type = DEV_ATTR_FLOAT, out->u.f = v->f;
      return PD_OK;
    case PARADEV__V1__ATTR_VALUE__VALUE_B:
      out->type = DEV_ATTR_BOOL, out->u.b = v->b != 0;
      return PD_OK;
    case PARADEV__V1__ATTR_VALUE__VALUE_S: {
      size_t n = strlen(v->s);
      if (n > DEV_ATTR_STRING_MAX) break;
      out->type = DEV_ATTR_STRING;
      out->u.s.ptr = up_str(b, v->s), out->u.s.len = n;
      return PD_OK;
    }
    case PARADEV__V1__ATTR_VALUE__VALUE_DTYPE:
      out->type = DEV_ATTR_DTYPE;
      if (up_dtype((int)v->dtype, false, &out->u.dtype) != PD_OK) break;
      return PD_OK;
    case PARADEV__V1__ATTR_VALUE__VALUE_SHAPE:
      out->type = DEV_ATTR_SHAPE;
      if (up_shape(v->shape, &out->u.shape) != PD_OK) break;
      for (int i = 0; i < out->u.shape.rank; i++)
        if (out->u.shape.dims[i] < 0) goto bad;
      return PD_OK;
    case PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST:
    case PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST: {
      bool is_int = vc == PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST;
      size_t n = is_int ? (v->int_list ? v->int_list->n_values : 0)
                        : (v->float_list ? v->float_list->n_values : 0);
      if (n > DEV_ATTR_LIST_MAX) break;
      void *d = up_take(b, 8 * n);
      if (d && n)
        memcpy(d,
               is_int ? (void *)v->int_list->values
                      : (void *)v->float_list->values,
               8 * n);
      if (is_int)
        out->type = DEV_ATTR_INT_LIST, out->u.ilist.v = d,
        out->u.ilist.n = (int)n;
      else
        out->type = DEV_ATTR_FLOAT_LIST, out->u.flist.v = d,
        out->u.flist.n = (int)n;
      return PD_OK;
    }
    default:
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "node %.128s: attr %.64s has no value", node, an);
  }
bad:
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "node %.128s: attr %.64s: a value outside the engine's "
                   "limits (a dtype in range, a shape of rank <= %d with "
                   "dims >= 0, lists <= %d, strings <= %d bytes)",
                   node, an, PD_MAX_RANK, DEV_ATTR_LIST_MAX,
                   DEV_ATTR_STRING_MAX);
}

static pd_code up_node(up_blk *b, const Paradev__V1__FunctionNode *p,
                       dev_fn_node *out, dev_status *st) {
  dev_fn_node nd = {0};
  const char *nm = p->name ? p->name : "";
  nd.name = up_str(b, p->name);
  nd.op = up_str(b, p->op);
  nd.inputs = up_strs(b, p->inputs, p->n_inputs);
  nd.origins = up_strs(b, p->origins, p->n_origins);
  if (p->n_inputs > DEV_MAX_INPUTS || p->n_attrs > DEV_MAX_ATTRS ||
      p->n_origins > DEV_FN_MAX_NODES || p->n_outputs_info > DEV_MAX_OUTPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "node %.128s: %zu inputs, %zu attrs, %zu origins, %zu "
                     "outputs_info; at most %d, %d, %d, %d",
                     nm, p->n_inputs, p->n_attrs, p->n_origins,
                     p->n_outputs_info, DEV_MAX_INPUTS, DEV_MAX_ATTRS,
                     DEV_FN_MAX_NODES, DEV_MAX_OUTPUTS);
  nd.num_inputs = (int)p->n_inputs;
  nd.num_origins = (int)p->n_origins;
  dev_attr *at = up_take(b, sizeof(dev_attr) * p->n_attrs);
  for (size_t i = 0; i < p->n_attrs; i++) {
    const Paradev__V1__Attr *a = p->attrs[i];
    const char *an = up_str(b, a->name);
    dev_attr_value v;
    PD_TRY(up_attr_value(b, nm, a->name ? a->name : "", a->value, &v, st));
    if (at) at[i].name = an, at[i].value = v;
  }
  nd.attrs = at;
  nd.num_attrs = (int)p->n_attrs;
  dev_fn_value_info *vi =
      up_take(b, sizeof(dev_fn_value_info) * p->n_outputs_info);
  for (size_t i = 0; i < p->n_outputs_info; i++) {
    dev_fn_value_info x;
    const Paradev__V1__ValueInfo *q = p->outputs_info[i];
    if (up_dtype((int)q->dtype, true, &x.dtype) != PD_OK ||
        up_shape(q->shape, &x.shape) != PD_OK)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "node %.128s: outputs_info %zu: dtype %d or rank over "
                       "%d",
                       nm, i, (int)q->dtype, PD_MAX_RANK);
    if (vi) vi[i] = x;
  }
  nd.outputs_info = vi;
  nd.num_outputs_info = (int)p->n_outputs_info;
  if (b->base) *out = nd;
  return PD_OK;
}

/* Lays out the whole def (a counting walk when b->base is NULL). */
static pd_code up_def(up_blk *b, const Paradev__V1__FunctionDef *p,
                      dev_fn_def **out, dev_status *st) {
  if (p->n_nodes > DEV_FN_MAX_NODES || p->n_args > DEV_FN_MAX_ARGS ||
      p->n_outputs > DEV_FN_MAX_NODES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function %.128s: %zu nodes, %zu args, %zu outputs; at "
                     "most %d, %d, %d",
                     p->name, p->n_nodes, p->n_args, p->n_outputs,
                     DEV_FN_MAX_NODES, DEV_FN_MAX_ARGS, DEV_FN_MAX_NODES);
  dev_fn_def *d = up_take(b, sizeof *d);
  dev_fn_def x = DEV_FN_DEF_INITIALIZER;
  x.name = up_str(b, p->name);
  dev_fn_arg *args = up_take(b, sizeof(dev_fn_arg) * p->n_args);
  for (size_t i = 0; i < p->n_args; i++) {
    dev_fn_arg a = {up_str(b, p->args[i]->name), PD_DTYPE_INVALID};
    if (up_dtype((int)p->args[i]->dtype, false, &a.dtype) != PD_OK)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function %.128s: argument %zu (%.128s) has dtype %d; "
                       "expected 1 to %d",
                       p->name, i, p->args[i]->name, (int)p->args[i]->dtype,
                       PD_DTYPE_COUNT - 1);
    if (args) args[i] = a;
  }
  dev_fn_node *nodes = up_take(b, sizeof(dev_fn_node) * p->n_nodes);
  for (size_t i = 0; i < p->n_nodes; i++)
    PD_TRY(up_node(b, p->nodes[i], nodes ? &nodes[i] : NULL, st));
  dev_fn_output *outs = up_take(b, sizeof(dev_fn_output) * p->n_outputs);
  for (size_t i = 0; i < p->n_outputs; i++) {
    dev_fn_output o = {up_str(b, p->outputs[i]->name),
                       up_str(b, p->outputs[i]->source)};
    if (outs) outs[i] = o;
  }
  x.args = args, x.num_args = (int)p->n_args;
  x.nodes = nodes, x.num_nodes = (int)p->n_nodes;
  x.outputs = outs, x.num_outputs = (int)p->n_outputs;
  if (d) *d = x, *out = d;
  return PD_OK;
}

pd_code srv_fn_def_unpack(const uint8_t *data, size_t len, dev_fn_def **out,
                          dev_status *st) {
  Paradev__V1__FunctionDef *p =
      paradev__v1__function_def__unpack(NULL, len, data);
  if (!p)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%zu bytes that do not parse as a paradev.v1.FunctionDef",
                     len);
  up_blk b = {NULL, 0};
  pd_code rc = up_def(&b, p, out, st);
  if (rc == PD_OK) {
    size_t need = b.off;
    b.base = malloc(need);
    b.off = 0;
    if (!b.base)
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "function %.128s: out of memory (%zu bytes)", p->name,
                     need);
    else
      rc = up_def(&b, p, out, st);
  }
  paradev__v1__function_def__free_unpacked(p, NULL);
  return rc;
}

void srv_fn_def_unpacked_free(dev_fn_def *def) { free(def); }
