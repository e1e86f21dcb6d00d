/* Graph functions' conversions (issue #11), the one path between the
 * engine's dev_fn_def and the wire's paradev.v1.FunctionDef: for
 * RegisterFunction (views into the message, every string and count bounded
 * before the engine sees it), for DescribeFunction (its answer from
 * dev_fn_info), and for the optimizer plugins (server/optimizer.c), which
 * read and write the same message serialized, outputs_info and origins
 * included. Depends on nothing else in server/ but convert.c's helpers. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "convert.h"
#include "log.h"

/* "node:k": a name, ':' and an output index. */
#define SRV_FN_REF_MAX (DEV_FN_NAME_MAX + 12)

/* --- FunctionDef -> dev_fn_def ---------------------------------------------- */

/* Which function the messages name. */
typedef struct srv_fn_ctx {
  const srv_req_limits *l;
  const char *fn;
  srv_arena *a;
} srv_fn_ctx;

/* `s` of 1..max bytes, or an error naming `what` (printf-style). */
static pd_code srv_fn_check_str(const srv_fn_ctx *x, const char *s, size_t max,
                                const char *what, int index, const char *owner,
                                dev_status *st) {
  size_t n = s ? strlen(s) : 0;
  if (n >= 1 && n <= max) return PD_OK;
  if (owner)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%.128s': node %d ('%.128s'): %s is %zu bytes; "
                     "expected 1 to %zu",
                     x->fn, index, owner, what, n, max);
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "function '%.128s': %s %d is %zu bytes; expected 1 to %zu",
                   x->fn, what, index, n, max);
}

static pd_code srv_fn_count(const srv_fn_ctx *x, size_t n, size_t max,
                            const char *what, dev_status *st) {
  if (n <= max) return PD_OK;
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "function '%.128s': %zu %s; the limit is %zu", x->fn, n,
                   what, max);
}

static pd_code srv_fn_args_from_pb(const srv_fn_ctx *x,
                                   const Paradev__V1__FunctionDef *pb,
                                   dev_fn_def *def, dev_status *st) {
  PD_TRY(srv_fn_count(x, pb->n_args, DEV_FN_MAX_ARGS, "arguments", st));
  dev_fn_arg *args = srv_arena_alloc(x->a, (pb->n_args + 1) * sizeof(*args));
  if (!args) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t i = 0; i < pb->n_args; i++) {
    const Paradev__V1__FunctionArg *ar = pb->args[i];
    PD_TRY(srv_fn_check_str(x, ar->name, DEV_FN_NAME_MAX, "the name of arg",
                            (int)i, NULL, st));
    dev_status inner = DEV_STATUS_INIT;
    if (srv_dtype_from_pb((int)ar->dtype, "dtype", &args[i].dtype, &inner) !=
        PD_OK)
      return dev_error(st, inner.code,
                       "function '%.128s': arg %zu ('%.128s'): %s", x->fn, i,
                       ar->name, inner.msg);
    args[i].name = ar->name;
  }
  def->args = args;
  def->num_args = (int)pb->n_args;
  return PD_OK;
}

/* A node's outputs_info (what inference found; a plugin reads them, the
 * engine ignores them on input): at most DEV_MAX_OUTPUTS, each of dtype 0
 * (unknown) to PD_DTYPE_COUNT - 1 and a shape of rank up to PD_MAX_RANK,
 * dims >= -1 (-1: the components differ). */
static pd_code srv_fn_infos_from_pb(const srv_fn_ctx *x, int i,
                                    const Paradev__V1__FunctionNode *nb,
                                    dev_fn_node *out, dev_status *st) {
  size_t n = nb->n_outputs_info;
  if (n > DEV_MAX_OUTPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%.128s': node %d ('%.128s'): %zu outputs_info; "
                     "no op has more than %d outputs",
                     x->fn, i, nb->name, n, DEV_MAX_OUTPUTS);
  if (n == 0) return PD_OK;
  dev_fn_value_info *vi = srv_arena_alloc(x->a, n * sizeof(*vi));
  if (!vi) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t k = 0; k < n; k++) {
    const Paradev__V1__ValueInfo *q = nb->outputs_info[k];
    size_t rank = q->shape ? q->shape->n_dims : 0;
    bool ok = (int)q->dtype >= 0 && (int)q->dtype < PD_DTYPE_COUNT &&
              rank <= PD_MAX_RANK;
    for (size_t d = 0; ok && d < rank; d++) ok = q->shape->dims[d] >= -1;
    if (!ok)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%.128s': node %d ('%.128s'): outputs_info "
                       "%zu has dtype %d and a shape of rank %zu; expected a "
                       "dtype 0 to %d, a rank up to %d and dims >= -1",
                       x->fn, i, nb->name, k, (int)q->dtype, rank,
                       PD_DTYPE_COUNT - 1, PD_MAX_RANK);
    vi[k].dtype = (pd_dtype)q->dtype;
    vi[k].shape = (dev_shape){(int)rank, {0}};
    for (size_t d = 0; d < rank; d++) vi[k].shape.dims[d] = q->shape->dims[d];
  }
  out->outputs_info = vi;
  out->num_outputs_info = (int)n;
  return PD_OK;
}

static pd_code srv_fn_node_from_pb(const srv_fn_ctx *x, int i,
                                   const Paradev__V1__FunctionNode *nb,
                                   dev_fn_node *out, dev_status *st) {
  PD_TRY(srv_fn_check_str(x, nb->name, DEV_FN_NAME_MAX, "the name of node", i,
                          NULL, st));
  PD_TRY(srv_fn_check_str(x, nb->op, DEV_FN_NAME_MAX, "its op name", i,
                          nb->name, st));
  if (nb->n_inputs > DEV_MAX_INPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%.128s': node %d ('%.128s'): %zu inputs; the "
                     "limit max_inputs_per_op is %d",
                     x->fn, i, nb->name, nb->n_inputs, DEV_MAX_INPUTS);
  for (size_t j = 0; j < nb->n_inputs; j++)
    PD_TRY(srv_fn_check_str(x, nb->inputs[j], SRV_FN_REF_MAX, "an input", i,
                            nb->name, st));
  if (nb->n_origins > DEV_FN_MAX_NODES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%.128s': node %d ('%.128s'): %zu origins; the "
                     "limit is %d",
                     x->fn, i, nb->name, nb->n_origins, DEV_FN_MAX_NODES);
  for (size_t j = 0; j < nb->n_origins; j++)
    PD_TRY(srv_fn_check_str(x, nb->origins[j], DEV_FN_NAME_MAX, "an origin", i,
                            nb->name, st));
  dev_attr *attrs = NULL;
  if (nb->n_attrs) {
    attrs = srv_arena_alloc(x->a, DEV_MAX_ATTRS * sizeof(*attrs));
    if (!attrs)
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    dev_status inner = DEV_STATUS_INIT;
    if (srv_attrs_from_pb(x->l, "node", i, nb->name, nb->attrs, nb->n_attrs,
                          attrs, &inner) != PD_OK)
      return dev_error(st, inner.code, "function '%.128s': %s", x->fn,
                       inner.msg);
  }
  *out = (dev_fn_node){.name = nb->name,
                       .op = nb->op,
                       .inputs = (const char *const *)nb->inputs,
                       .num_inputs = (int)nb->n_inputs,
                       .attrs = attrs,
                       .num_attrs = (int)nb->n_attrs,
                       .origins = (const char *const *)nb->origins,
                       .num_origins = (int)nb->n_origins};
  return srv_fn_infos_from_pb(x, i, nb, out, st);
}

static pd_code srv_fn_outputs_from_pb(const srv_fn_ctx *x,
                                      const Paradev__V1__FunctionDef *pb,
                                      dev_fn_def *def, dev_status *st) {
  PD_TRY(srv_fn_count(x, pb->n_outputs, DEV_FN_MAX_ARGS, "outputs", st));
  dev_fn_output *outs =
      srv_arena_alloc(x->a, (pb->n_outputs + 1) * sizeof(*outs));
  if (!outs) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t i = 0; i < pb->n_outputs; i++) {
    const Paradev__V1__FunctionOutput *o = pb->outputs[i];
    PD_TRY(srv_fn_check_str(x, o->name, DEV_FN_NAME_MAX, "the name of output",
                            (int)i, NULL, st));
    PD_TRY(srv_fn_check_str(x, o->source, SRV_FN_REF_MAX,
                            "the source of output", (int)i, NULL, st));
    outs[i] = (dev_fn_output){o->name, o->source};
  }
  def->outputs = outs;
  def->num_outputs = (int)pb->n_outputs;
  return PD_OK;
}

static pd_code srv_fn_options_from_pb(const srv_fn_ctx *x,
                                      const Paradev__V1__FunctionOptions *pb,
                                      dev_fn_options *out, dev_status *st) {
  *out = (dev_fn_options)DEV_FN_OPTIONS_INITIALIZER;
  if (!pb) return PD_OK;
  const int v[DEV_PASS_COUNT] = {pb->pruning,          pb->cse,
                                 pb->constant_folding, pb->arithmetic,
                                 pb->fusion,           pb->buffer_planning,
                                 pb->cuda_graph};
  for (int p = 0; p < DEV_PASS_COUNT; p++) {
    if (v[p] < DEV_TRI_DEFAULT || v[p] > DEV_TRI_ON)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%.128s': options.%s is %d; expected 0 "
                       "(DEFAULT), 1 (OFF) or 2 (ON)",
                       x->fn, dev_fn_pass_name((dev_fn_pass)p), v[p]);
    out->passes[p] = (dev_tristate)v[p];
  }
  if (pb->max_instantiations > DEV_FN_MAX_INST_CAP)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%.128s': options.max_instantiations is %u; "
                     "expected 0 (the daemon's) to %d",
                     x->fn, pb->max_instantiations, DEV_FN_MAX_INST_CAP);
  out->max_instantiations = (int)pb->max_instantiations;
  return PD_OK;
}

pd_code srv_fn_def_from_pb(const srv_req_limits *l,
                           const Paradev__V1__FunctionDef *pb, srv_arena *a,
                           srv_fn_decoded *out, dev_status *st) {
  if (!pb)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "no function: set RegisterFunctionRequest.function");
  srv_fn_ctx x = {l, pb->name ? pb->name : "", a};
  size_t nl = strlen(x.fn);
  if (nl == 0 || nl > DEV_FN_NAME_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "the function's name is %zu bytes; expected 1 to %d", nl,
                     DEV_FN_NAME_MAX);
  dev_fn_def *def = &out->def;
  *def = (dev_fn_def)DEV_FN_DEF_INITIALIZER;
  def->name = x.fn;
  PD_TRY(srv_fn_args_from_pb(&x, pb, def, st));
  PD_TRY(srv_fn_count(&x, pb->n_nodes, DEV_FN_MAX_NODES, "nodes", st));
  dev_fn_node *nodes = srv_arena_alloc(a, (pb->n_nodes + 1) * sizeof(*nodes));
  if (!nodes) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  for (size_t i = 0; i < pb->n_nodes; i++)
    PD_TRY(srv_fn_node_from_pb(&x, (int)i, pb->nodes[i], &nodes[i], st));
  def->nodes = nodes;
  def->num_nodes = (int)pb->n_nodes;
  PD_TRY(srv_fn_outputs_from_pb(&x, pb, def, st));
  return srv_fn_options_from_pb(&x, pb->options, &out->opts, st);
}

/* --- dev_fn_def -> FunctionDef ---------------------------------------------- */

/* protobuf-c's fields are not const; packing only reads them. */
static char *srv_fn_str(const char *s) { return (char *)(s ? s : ""); }

static pd_code srv_fn_oom(dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
}

/* A string for a proto3 `string` field, which must be UTF-8 (Python's
 * protobuf refuses a whole reply holding one that is not): `s` itself when
 * it is valid UTF-8 (NULL: ""), else a copy in `a` whose bytes that are
 * not UTF-8 (and control characters) are '?'. The engine's and the
 * registration's checks keep such bytes out of every graph; this is the
 * last line of defence (a plugin's origins, a bug), so that DescribeFunction
 * and a plugin's input always parse. */
static char *srv_fn_text(srv_arena *a, const char *s) {
  if (!s) return (char *)"";
  if (srv_log_text_check(s, true, NULL) < 0) return (char *)s;
  size_t n = strlen(s) + 1;
  char *c = srv_arena_alloc(a, n);
  return c ? srv_log_utf8(s, c, n) : (char *)"?";
}

/* The first `max` bytes at most of `s` as srv_fn_text, always a copy. */
static char *srv_fn_textn(srv_arena *a, const char *s, size_t max) {
  size_t n = strnlen(s, max);
  char *c = srv_arena_alloc(a, n + 1);
  if (!c) return NULL;
  memcpy(c, s, n);
  c[n] = '\0';
  return srv_fn_text(a, c);
}

/* `n` strings as a message's array in `a`, NULL ones as "", each as
 * srv_fn_text (the array is copied, valid strings are not). */
static char **srv_fn_strs(srv_arena *a, const char *const *s, int n) {
  char **p = srv_arena_alloc(a, ((size_t)n + 1) * sizeof(*p));
  for (int i = 0; p && i < n; i++) p[i] = srv_fn_text(a, s[i]);
  return p;
}

/* What a FunctionDef cannot carry (NULL: nothing): a type outside
 * dev_attr_type, a rank outside 0..PD_MAX_RANK (the dims' room), a length
 * below 0 or without its values. The engine's graphs hold none; a def
 * built by hand or a bug might. */
static const char *srv_fn_value_unfit(const dev_attr_value *v) {
  switch (v->type) {
    case DEV_ATTR_INT:
    case DEV_ATTR_FLOAT:
    case DEV_ATTR_BOOL:
    case DEV_ATTR_DTYPE: return NULL;
    case DEV_ATTR_STRING:
      return v->u.s.len && !v->u.s.ptr ? "a string without its bytes" : NULL;
    case DEV_ATTR_SHAPE:
      return v->u.shape.rank < 0 || v->u.shape.rank > PD_MAX_RANK
                 ? "a shape of rank outside 0..PD_MAX_RANK"
                 : NULL;
    case DEV_ATTR_INT_LIST:
      return v->u.ilist.n < 0 || (v->u.ilist.n && !v->u.ilist.v)
                 ? "a list of length below 0 or without its values"
                 : NULL;
    case DEV_ATTR_FLOAT_LIST:
      return v->u.flist.n < 0 || (v->u.flist.n && !v->u.flist.v)
                 ? "a list of length below 0 or without its values"
                 : NULL;
    default: return "a type outside dev_attr_type";
  }
}

/* The node's attrs; absent ones (DEV_ATTR_NONE) are left out. */
static pd_code srv_fn_attrs_to_pb(const char *fn, const dev_fn_node *n,
                                  srv_arena *a, Paradev__V1__FunctionNode *pb,
                                  dev_status *st) {
  pb->attrs =
      srv_arena_alloc(a, ((size_t)n->num_attrs + 1) * sizeof(*pb->attrs));
  if (!pb->attrs) return srv_fn_oom(st);
  for (int k = 0; k < n->num_attrs; k++) {
    const dev_attr *at = &n->attrs[k];
    if (at->value.type == DEV_ATTR_NONE) continue;
    const char *why = srv_fn_value_unfit(&at->value);
    if (why)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%.128s': node '%.128s': attr '%.64s' (type "
                       "%d) holds %s; a FunctionDef cannot carry it",
                       fn, pb->name, srv_fn_str(at->name), (int)at->value.type,
                       why);
    Paradev__V1__Attr *q = srv_arena_alloc(a, sizeof(*q));
    if (!q) return srv_fn_oom(st);
    paradev__v1__attr__init(q);
    q->name = srv_fn_text(a, at->name);
    if (!(q->value = srv_attr_value_to_pb(&at->value, a)))
      return srv_fn_oom(st);
    if (q->value->value_case == PARADEV__V1__ATTR_VALUE__VALUE_S)
      q->value->s = srv_fn_text(a, q->value->s);
    pb->attrs[pb->n_attrs++] = q;
  }
  return PD_OK;
}

static pd_code srv_fn_infos_to_pb(const char *fn, const dev_fn_node *n,
                                  srv_arena *a, Paradev__V1__FunctionNode *pb,
                                  dev_status *st) {
  size_t m = (size_t)n->num_outputs_info;
  if (m == 0) return PD_OK;
  pb->outputs_info = srv_arena_alloc(a, m * sizeof(*pb->outputs_info));
  if (!pb->outputs_info) return srv_fn_oom(st);
  for (size_t k = 0; k < m; k++) {
    const dev_fn_value_info *v = &n->outputs_info[k];
    if (v->shape.rank < 0 || v->shape.rank > PD_MAX_RANK)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%.128s': node '%.128s': output %zu has rank "
                       "%d; expected 0 to %d",
                       fn, pb->name, k, v->shape.rank, PD_MAX_RANK);
    Paradev__V1__ValueInfo *vi = srv_arena_alloc(a, sizeof(*vi));
    if (!vi) return srv_fn_oom(st);
    paradev__v1__value_info__init(vi);
    vi->dtype = (Paradev__V1__DType)v->dtype;
    if (!(vi->shape = srv_shape_to_pb(a, &v->shape))) return srv_fn_oom(st);
    pb->outputs_info[k] = vi;
  }
  pb->n_outputs_info = m;
  return PD_OK;
}

static pd_code srv_fn_node_to_pb(const char *fn, const dev_fn_node *n,
                                 srv_arena *a, Paradev__V1__FunctionNode **out,
                                 dev_status *st) {
  Paradev__V1__FunctionNode *pb = srv_arena_alloc(a, sizeof(*pb));
  if (!pb) return srv_fn_oom(st);
  paradev__v1__function_node__init(pb);
  pb->name = srv_fn_text(a, n->name);
  pb->op = srv_fn_text(a, n->op);
  if (n->num_inputs < 0 || n->num_attrs < 0 || n->num_origins < 0 ||
      n->num_outputs_info < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%.128s': node '%.128s': a count below 0 (%d "
                     "inputs, %d attrs, %d origins, %d outputs_info)",
                     fn, pb->name, n->num_inputs, n->num_attrs, n->num_origins,
                     n->num_outputs_info);
  pb->inputs = srv_fn_strs(a, n->inputs, n->num_inputs);
  pb->origins = srv_fn_strs(a, n->origins, n->num_origins);
  if (!pb->inputs || !pb->origins) return srv_fn_oom(st);
  pb->n_inputs = (size_t)n->num_inputs;
  pb->n_origins = (size_t)n->num_origins;
  PD_TRY(srv_fn_attrs_to_pb(fn, n, a, pb, st));
  PD_TRY(srv_fn_infos_to_pb(fn, n, a, pb, st));
  *out = pb;
  return PD_OK;
}

static Paradev__V1__FunctionOptions *srv_fn_options_to_pb(
    const dev_fn_options *o, srv_arena *a) {
  Paradev__V1__FunctionOptions *pb = srv_arena_alloc(a, sizeof(*pb));
  if (!pb) return NULL;
  paradev__v1__function_options__init(pb);
  pb->pruning = (Paradev__V1__TriState)o->passes[DEV_PASS_PRUNING];
  pb->cse = (Paradev__V1__TriState)o->passes[DEV_PASS_CSE];
  pb->constant_folding =
      (Paradev__V1__TriState)o->passes[DEV_PASS_CONSTANT_FOLDING];
  pb->arithmetic = (Paradev__V1__TriState)o->passes[DEV_PASS_ARITHMETIC];
  pb->fusion = (Paradev__V1__TriState)o->passes[DEV_PASS_FUSION];
  pb->buffer_planning =
      (Paradev__V1__TriState)o->passes[DEV_PASS_BUFFER_PLANNING];
  pb->cuda_graph = (Paradev__V1__TriState)o->passes[DEV_PASS_CUDA_GRAPH];
  pb->max_instantiations = (uint32_t)o->max_instantiations;
  return pb;
}

/* The def's args and outputs. */
static pd_code srv_fn_ends_to_pb(const dev_fn_def *def, srv_arena *a,
                                 Paradev__V1__FunctionDef *pb, dev_status *st) {
  size_t na = (size_t)def->num_args, no = (size_t)def->num_outputs;
  pb->args = srv_arena_alloc(a, (na + 1) * sizeof(*pb->args));
  pb->outputs = srv_arena_alloc(a, (no + 1) * sizeof(*pb->outputs));
  if (!pb->args || !pb->outputs) return srv_fn_oom(st);
  for (size_t i = 0; i < na; i++) {
    Paradev__V1__FunctionArg *ar = srv_arena_alloc(a, sizeof(*ar));
    if (!ar) return srv_fn_oom(st);
    paradev__v1__function_arg__init(ar);
    ar->name = srv_fn_text(a, def->args[i].name);
    ar->dtype = (Paradev__V1__DType)def->args[i].dtype;
    pb->args[i] = ar;
  }
  for (size_t i = 0; i < no; i++) {
    Paradev__V1__FunctionOutput *o = srv_arena_alloc(a, sizeof(*o));
    if (!o) return srv_fn_oom(st);
    paradev__v1__function_output__init(o);
    o->name = srv_fn_text(a, def->outputs[i].name);
    o->source = srv_fn_text(a, def->outputs[i].source);
    pb->outputs[i] = o;
  }
  pb->n_args = na;
  pb->n_outputs = no;
  return PD_OK;
}

pd_code srv_fn_def_to_pb(const dev_fn_def *def, const dev_fn_options *opts,
                         srv_arena *a, Paradev__V1__FunctionDef **out,
                         dev_status *st) {
  const char *fn = srv_fn_str(def->name);
  if (def->num_args < 0 || def->num_nodes < 0 || def->num_outputs < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%.128s': a count below 0 (%d args, %d nodes, "
                     "%d outputs)",
                     fn, def->num_args, def->num_nodes, def->num_outputs);
  Paradev__V1__FunctionDef *pb = srv_arena_alloc(a, sizeof(*pb));
  if (!pb) return srv_fn_oom(st);
  paradev__v1__function_def__init(pb);
  pb->name = srv_fn_text(a, fn);
  PD_TRY(srv_fn_ends_to_pb(def, a, pb, st));
  size_t nn = (size_t)def->num_nodes;
  pb->nodes = srv_arena_alloc(a, (nn + 1) * sizeof(*pb->nodes));
  if (!pb->nodes) return srv_fn_oom(st);
  for (size_t i = 0; i < nn; i++)
    PD_TRY(srv_fn_node_to_pb(fn, &def->nodes[i], a, &pb->nodes[i], st));
  pb->n_nodes = nn;
  if (opts && !(pb->options = srv_fn_options_to_pb(opts, a)))
    return srv_fn_oom(st);
  *out = pb;
  return PD_OK;
}

/* --- DescribeFunction ---------------------------------------------------------- */

/* One pass's result: `changes` as dev_fn_inst_info.pass_changes (-1: off,
 * -2: failed), or for the passes in force (`tri`: ON or OFF) 0 changes. */
static Paradev__V1__PassResult *srv_pass_to_pb(int p, bool enabled, int changes,
                                               bool failed, srv_arena *a) {
  Paradev__V1__PassResult *pb = srv_arena_alloc(a, sizeof(*pb));
  if (!pb) return NULL;
  paradev__v1__pass_result__init(pb);
  pb->pass = srv_fn_str(dev_fn_pass_name((dev_fn_pass)p));
  pb->enabled = enabled;
  pb->changes = changes > 0 ? changes : 0;
  pb->failed = failed;
  return pb;
}

static Paradev__V1__FunctionInstantiation *srv_inst_to_pb(
    const dev_fn_inst_info *ii, srv_arena *a) {
  Paradev__V1__FunctionInstantiation *pb = srv_arena_alloc(a, sizeof(*pb));
  if (!pb) return NULL;
  paradev__v1__function_instantiation__init(pb);
  char *sig = srv_fn_textn(a, ii->signature, sizeof(ii->signature));
  pb->passes = srv_arena_alloc(a, DEV_PASS_COUNT * sizeof(*pb->passes));
  if (!sig || !pb->passes) return NULL;
  pb->signature = sig;
  pb->nodes_in = ii->nodes_in;
  pb->nodes_out = ii->nodes_out;
  for (int p = 0; p < DEV_PASS_COUNT; p++) {
    int ch = ii->pass_changes[p];
    if (!(pb->passes[p] = srv_pass_to_pb(p, ch != -1, ch, ch == -2, a)))
      return NULL;
  }
  pb->n_passes = DEV_PASS_COUNT;
  pb->external_changed = ii->external_changed;
  pb->arena_bytes = ii->arena_bytes;
  pb->unplanned_bytes = ii->unplanned_bytes;
  pb->calls = ii->calls;
  pb->cuda_graph = ii->cuda_graph;
  if (ii->error[0]) {
    size_t el = strnlen(ii->error, sizeof(ii->error));
    char *err = srv_arena_alloc(a, el + 1);
    if (!err) return NULL;
    memcpy(err, ii->error, el);
    err[el] = 0;
    pb->error = err;
  }
  return pb;
}

pd_code srv_fn_info_to_pb(const dev_fn_info *info, srv_arena *a,
                          Paradev__V1__DescribeFunctionResponse *out,
                          dev_status *st) {
  if (info->def)
    PD_TRY(srv_fn_def_to_pb(info->def, &info->options, a, &out->function, st));
  if (info->optimized)
    PD_TRY(srv_fn_def_to_pb(info->optimized, NULL, a, &out->optimized, st));
  int ni = info->num_instantiations;
  if (ni < 0) ni = 0;
  if (ni > DEV_FN_MAX_INST_CAP) ni = DEV_FN_MAX_INST_CAP;
  out->instantiations =
      srv_arena_alloc(a, ((size_t)ni + 1) * sizeof(*out->instantiations));
  out->passes_in_force =
      srv_arena_alloc(a, DEV_PASS_COUNT * sizeof(*out->passes_in_force));
  int nm = info->num_miss_reasons;
  if (nm < 0) nm = 0;
  if (nm > DEV_FN_MISS_REASONS) nm = DEV_FN_MISS_REASONS;
  out->cache_misses =
      srv_arena_alloc(a, ((size_t)nm + 1) * sizeof(*out->cache_misses));
  if (!out->instantiations || !out->passes_in_force || !out->cache_misses)
    goto oom;
  for (int i = 0; i < ni; i++)
    if (!(out->instantiations[i] = srv_inst_to_pb(&info->insts[i], a)))
      goto oom;
  out->n_instantiations = (size_t)ni;
  for (int p = 0; p < DEV_PASS_COUNT; p++)
    if (!(out->passes_in_force[p] = srv_pass_to_pb(
              p, info->passes_in_force[p] == DEV_TRI_ON, 0, false, a)))
      goto oom;
  out->n_passes_in_force = DEV_PASS_COUNT;
  for (int i = 0; i < nm; i++) {
    char *s =
        srv_fn_textn(a, info->miss_reasons[i], sizeof(info->miss_reasons[i]));
    if (!s) goto oom;
    out->cache_misses[i] = s;
  }
  out->n_cache_misses = (size_t)nm;
  out->hits = info->hits;
  out->misses = info->misses;
  out->evictions = info->evictions;
  out->max_instantiations = (uint32_t)info->max_instantiations;
  return PD_OK;
oom:
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
}

/* --- serialized FunctionDef (optimizer plugins) --------------------------------- */

pd_code srv_fn_def_to_proto(const dev_fn_def *def, uint8_t **bytes, size_t *len,
                            dev_status *st) {
  if (!def)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "srv_fn_def_to_proto: NULL definition");
  srv_arena a = {NULL};
  Paradev__V1__FunctionDef *pb = NULL;
  pd_code c = srv_fn_def_to_pb(def, NULL, &a, &pb, st);
  size_t n = c == PD_OK ? paradev__v1__function_def__get_packed_size(pb) : 0;
  uint8_t *buf = c == PD_OK ? malloc(n ? n : 1) : NULL;
  if (c == PD_OK && !buf) c = srv_fn_oom(st);
  if (c == PD_OK) {
    paradev__v1__function_def__pack(pb, buf);
    *bytes = buf;
    *len = n;
  }
  srv_arena_free(&a);
  return c;
}

/* The block srv_fn_def_from_proto hands out: the definition first, so that
 * its address is the block's. */
typedef struct srv_fn_holder {
  dev_fn_def def;
  Paradev__V1__FunctionDef *pb;
  srv_arena arena;
} srv_fn_holder;

pd_code srv_fn_def_from_proto(const uint8_t *bytes, size_t len,
                              dev_fn_def **out, dev_status *st) {
  srv_fn_holder *h = calloc(1, sizeof(*h));
  if (!h) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  h->pb = paradev__v1__function_def__unpack(NULL, len, bytes);
  if (!h->pb) {
    free(h);
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%zu bytes that do not parse as a paradev.v1.FunctionDef",
                     len);
  }
  /* No request's limits apply: strings (attr names and values) as long as
   * the engine takes (DEV_ATTR_STRING_MAX). */
  srv_req_limits l = {0, DEV_ATTR_STRING_MAX, PD_MAX_DEVICES};
  srv_fn_decoded d;
  pd_code c = srv_fn_def_from_pb(&l, h->pb, &h->arena, &d, st);
  if (c != PD_OK) {
    srv_fn_def_proto_free(&h->def);
    return c;
  }
  h->def = d.def;
  *out = &h->def;
  return PD_OK;
}

void srv_fn_def_proto_free(dev_fn_def *def) {
  if (!def) return;
  srv_fn_holder *h = (srv_fn_holder *)(void *)def;
  srv_arena_free(&h->arena);
  paradev__v1__function_def__free_unpacked(h->pb, NULL);
  free(h);
}
