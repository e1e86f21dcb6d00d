/* Graphs and definitions: a dev_fn_def (as the server decodes a
 * FunctionDef, or as an external pass writes one) validated and built into
 * an fn_graph in topological order (fn_graph_from_def), an fn_graph handed
 * out as one allocated dev_fn_def (fn_graph_to_def: describe, external
 * passes). The canonical text of a registration is canon.c's; the name
 * rule and the check of a node's other strings names.c's.
 *
 * Constants of a graph travel through a definition as nodes of op "_Const"
 * with an int attribute "index" (the graph's constant) and outputs_info; an
 * external pass keeps them as they are, and only its result may hold them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fn_call.h"

#define FN_CONST_OP "_Const"

/* --- names ----------------------------------------------------------------- */

/* A name table: open addressing over the args (first) and nodes. */
typedef struct name_tab {
  int cap;
  int *slot; /* -1 empty; else 0..n_args-1 args, n_args+i node i */
} name_tab;

static unsigned hash_str(const char *s, size_t len) {
  unsigned h = 2166136261u;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

static const char *entry_name(const dev_fn_def *d, int e) {
  return e < d->num_args ? d->args[e].name : d->nodes[e - d->num_args].name;
}

/* The entry named s[0..len), or -1. */
static int tab_find(const name_tab *t, const dev_fn_def *d, const char *s,
                    size_t len) {
  unsigned h = hash_str(s, len) & (unsigned)(t->cap - 1);
  for (;;) {
    int e = t->slot[h];
    if (e < 0) return -1;
    const char *n = entry_name(d, e);
    if (strlen(n) == len && memcmp(n, s, len) == 0) return e;
    h = (h + 1) & (unsigned)(t->cap - 1);
  }
}

/* Checks a name (fn_name_is_valid). `what` names it ("argument", "node",
 * "output"; with i < 0 the function itself). The message shows the name
 * with every byte outside the rule as \xNN, so it stays printable. */
static pd_code check_name(const char *fn, const char *what, int i,
                          const char *s, dev_status *st) {
  size_t at;
  if (fn_name_is_valid(s, &at)) return PD_OK;
  char shown[4 * 140 + 1], where[64] = "";
  fn_name_printable(s ? s : "(null)", shown, sizeof shown);
  size_t len = s ? strlen(s) : 0;
  if (at != (size_t)-1)
    snprintf(where, sizeof where, " (byte %zu, 0x%02X, is not allowed)", at,
             (unsigned)(unsigned char)s[at]);
  char exp[160];
  snprintf(exp, sizeof exp,
           "1 to %d bytes of UTF-8 text without ':', spaces or control "
           "characters",
           DEV_FN_NAME_MAX);
  if (i < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "the function's name '%.300s' (%zu bytes)%s is not "
                     "valid; expected %s",
                     shown, len, where, exp);
  char fshown[4 * 140 + 1];
  fn_name_printable(fn ? fn : "", fshown, sizeof fshown);
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "function '%.200s': %s %d has name '%.300s' (%zu bytes)%s; "
                   "expected %s",
                   fshown, what, i, shown, len, where, exp);
}

static pd_code oom(dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
}

/* --- building ------------------------------------------------------------ */

/* What a node of the definition resolves to. */
typedef struct res_node {
  fn_node_kind kind;
  const dev_op_def *def;
  const fn_graph *callee;
  int n_out;     /* outputs an input may name ("node:k", k < n_out) */
  bool list_out; /* the op has list outputs: k checked at inference */
  int const_idx; /* "_Const" nodes: base's constant, else -1 */
  int *in_entry; /* [num_inputs]: table entries */
  int *in_out;   /* [num_inputs]: output k */
} res_node;

typedef struct build {
  const dev_fn_def *d;
  const fn_graph *base;
  fn_lookup_fn lookup;
  void *arg;
  name_tab tab;
  res_node *rn;
  int *order; /* topological order of node indices */
  int *pos;   /* node index -> position in order */
} build;

static void build_free(build *b) {
  if (b->rn)
    for (int i = 0; i < b->d->num_nodes; i++) {
      free(b->rn[i].in_entry);
      free(b->rn[i].in_out);
    }
  free(b->rn);
  free(b->tab.slot);
  free(b->order);
  free(b->pos);
}

static pd_code check_header(const dev_fn_def *d, dev_status *st) {
  if (!d || d->struct_size < offsetof(dev_fn_def, num_outputs) + sizeof(int))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function definition is NULL or its struct_size is too "
                     "small (use DEV_FN_DEF_INITIALIZER)");
  PD_TRY(check_name(d->name, "the function", -1, d->name, st));
  const char *fn = d->name;
  if (d->num_args < 0 || d->num_args > DEV_FN_MAX_ARGS ||
      (d->num_args && !d->args))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': %d arguments; expected 0 to %d", fn,
                     d->num_args, DEV_FN_MAX_ARGS);
  if (d->num_nodes < 0 || d->num_nodes > DEV_FN_MAX_NODES ||
      (d->num_nodes && !d->nodes))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': %d nodes; expected 0 to %d", fn,
                     d->num_nodes, DEV_FN_MAX_NODES);
  if (d->num_outputs < 1 || d->num_outputs > DEV_MAX_OUTPUTS || !d->outputs)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': %d outputs; expected 1 to %d", fn,
                     d->num_outputs, DEV_MAX_OUTPUTS);
  return PD_OK;
}

/* Fills the name table, refusing bad and duplicate names. */
static pd_code build_names(build *b, dev_status *st) {
  const dev_fn_def *d = b->d;
  int n = d->num_args + d->num_nodes, cap = 16;
  while (cap < 2 * n) cap *= 2;
  b->tab.cap = cap;
  b->tab.slot = malloc(sizeof(int) * (size_t)cap);
  if (!b->tab.slot) return oom(st);
  memset(b->tab.slot, 0xff, sizeof(int) * (size_t)cap);
  for (int e = 0; e < n; e++) {
    bool is_arg = e < d->num_args;
    int i = is_arg ? e : e - d->num_args;
    const char *s = entry_name(d, e);
    PD_TRY(check_name(d->name, is_arg ? "argument" : "node", i, s, st));
    if (tab_find(&b->tab, d, s, strlen(s)) >= 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s': %s '%s' has the name of an earlier "
                       "argument or node; names must be unique",
                       d->name, is_arg ? "argument" : "node", s);
    unsigned h = hash_str(s, strlen(s)) & (unsigned)(cap - 1);
    while (b->tab.slot[h] >= 0) h = (h + 1) & (unsigned)(cap - 1);
    b->tab.slot[h] = e;
    if (is_arg && !dev_dtype_is_valid(d->args[i].dtype))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s': argument '%s' has dtype %d; expected a "
                       "valid dtype",
                       d->name, s, (int)d->args[i].dtype);
  }
  return PD_OK;
}

static const dev_attr *find_attr(const dev_fn_node *n, const char *name) {
  for (int j = 0; j < n->num_attrs; j++)
    if (n->attrs[j].name && strcmp(n->attrs[j].name, name) == 0)
      return &n->attrs[j];
  return NULL;
}

/* Resolves node i's op, its output count and checks its attributes. */
static pd_code resolve_op(build *b, int i, dev_status *st) {
  const dev_fn_def *d = b->d;
  const dev_fn_node *n = &d->nodes[i];
  res_node *r = &b->rn[i];
  r->const_idx = -1;
  const char *op = n->op ? n->op : "";
  if (n->num_attrs < 0 || (n->num_attrs && !n->attrs) || n->num_inputs < 0 ||
      n->num_inputs > DEV_MAX_INPUTS || (n->num_inputs && !n->inputs))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s': malformed inputs or attributes "
                     "(at most %d inputs)",
                     d->name, n->name, DEV_MAX_INPUTS);
  if (b->base && strcmp(op, FN_CONST_OP) == 0) {
    const dev_attr *a = find_attr(n, "index");
    if (!a || a->value.type != DEV_ATTR_INT || a->value.u.i < 0 ||
        a->value.u.i >= b->base->n_consts || n->num_inputs != 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', node '%s': a %s node needs an int attr "
                       "'index' below %d and no inputs",
                       d->name, n->name, FN_CONST_OP, b->base->n_consts);
    r->const_idx = (int)a->value.u.i;
    r->n_out = 1;
    return PD_OK;
  }
  if (strcmp(op, DEV_FN_GRADIENTS_OP) == 0) {
    if (b->base)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', node '%s': a %s node is not allowed "
                       "after instantiation",
                       d->name, n->name, op);
    r->kind = FN_NODE_GRADIENTS;
    bool has_gy = false;
    for (int j = 0; j < n->num_attrs; j++) {
      const dev_attr *a = &n->attrs[j];
      if (!a->name || strcmp(a->name, "has_grad_y") != 0)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "function '%s', node '%s': %s takes one bool "
                         "attribute 'has_grad_y'; got an attribute named "
                         "'%.64s'",
                         d->name, n->name, op, a->name ? a->name : "(null)");
      if (a->value.type != DEV_ATTR_BOOL)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "function '%s', node '%s': %s attribute 'has_grad_y' "
                         "is %s; expected a bool",
                         d->name, n->name, op,
                         dev_attr_type_name(a->value.type));
      has_gy = a->value.u.b;
    }
    int k = n->num_inputs - 1 - (has_gy ? 1 : 0);
    if (k < 1 || k > FN_MAX_NODE_OUTPUTS)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', node '%s': %s got %d inputs; expected "
                       "y, 1 to %d sources%s",
                       d->name, n->name, op, n->num_inputs, FN_MAX_NODE_OUTPUTS,
                       has_gy ? " and grad_y" : "");
    r->n_out = k;
    return PD_OK;
  }
  const dev_op_def *def = dev_op_lookup(op);
  if (def && (def->flags & DEV_OP_PLACEMENT))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s': %s moves a value between "
                     "device sets and cannot be a node of a graph function; "
                     "call it outside the function",
                     d->name, n->name, def->name);
  if (def) {
    r->kind = FN_NODE_OP;
    r->def = def;
    bool arity = def->num_inputs == 0
                     ? n->num_inputs == 0
                     : dev_op_input_length(def, 0, n->num_inputs) >= 0;
    if (!arity) {
      char names[200] = "";
      size_t off = 0;
      bool list = false;
      for (int k = 0; k < def->num_inputs && off < sizeof names; k++) {
        list |= def->inputs[k].is_list;
        int w =
            snprintf(names + off, sizeof names - off, "%s%s%s", k ? ", " : "",
                     def->inputs[k].name, def->inputs[k].is_list ? "..." : "");
        if (w < 0) break;
        off += (size_t)w;
      }
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', node '%s': %s got %d inputs; expected "
                       "%s%d (%s)",
                       d->name, n->name, def->name, n->num_inputs,
                       list ? "at least " : "", def->num_inputs,
                       def->num_inputs ? names : "none");
    }
    dev_attr_value vals[DEV_MAX_ATTRS];
    void *arena = NULL;
    dev_status ast = DEV_STATUS_INIT;
    if (dev__resolve_attrs(def, n->attrs, n->num_attrs, vals, &arena, &ast) !=
        PD_OK)
      return dev_error(st, ast.code, "function '%s', node '%s': %s", d->name,
                       n->name, ast.msg);
    free(arena);
    r->n_out = def->num_outputs;
    for (int k = 0; k < def->num_outputs; k++)
      r->list_out |= def->outputs[k].is_list;
    return PD_OK;
  }
  const fn_graph *callee = b->lookup && !b->base ? b->lookup(b->arg, op) : NULL;
  if (!callee)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s': unknown op '%.128s'; expected "
                     "a registered op, a function registered before this one, "
                     "or %s",
                     d->name, n->name, op, DEV_FN_GRADIENTS_OP);
  if (n->num_attrs)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s': a call of function '%s' takes "
                     "no attributes; got %d",
                     d->name, n->name, op, n->num_attrs);
  if (n->num_inputs != callee->n_args)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s': function '%s' got %d inputs; "
                     "expected %d (its arguments)",
                     d->name, n->name, op, n->num_inputs, callee->n_args);
  r->kind = FN_NODE_CALL;
  r->callee = callee;
  r->n_out = callee->n_outputs;
  return PD_OK;
}

/* Parses "name" or "name:k" into a table entry and an output; `what` names
 * where it is written ("node 'x' input 1", "output 'y'"). */
static pd_code parse_ref(build *b, const char *s, const char *what, int *entry,
                         int *out, dev_status *st) {
  const dev_fn_def *d = b->d;
  const char *colon = s ? strrchr(s, ':') : NULL;
  size_t len = s ? (colon ? (size_t)(colon - s) : strlen(s)) : 0;
  long k = 0;
  if (colon) {
    /* TensorFlow's "node:k": k in decimal digits only, no sign, spaces or
     * leading zeros, so one output has one spelling. */
    const char *q = colon + 1;
    size_t nd = strspn(q, "0123456789");
    if (nd == 0 || q[nd] || nd > 9)
      len = 0;
    else if (q[0] == '0' && nd > 1)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', %s: '%.140s' has a leading zero in its "
                       "output index; expected \"node:k\" with k in decimal "
                       "without leading zeros (\"%.*s:%ld\")",
                       d->name, what, s, (int)(colon - s), s,
                       strtol(q, NULL, 10));
    else
      k = strtol(q, NULL, 10);
  }
  int e = s && len ? tab_find(&b->tab, d, s, len) : -1;
  if (e < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', %s: '%.140s' names no argument or node; "
                     "expected \"arg\", \"node\" or \"node:k\"",
                     d->name, what, s ? s : "(null)");
  if (e < d->num_args) {
    if (colon)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', %s: '%s': argument '%s' has one value; "
                       "write it without ':k'",
                       d->name, what, s, d->args[e].name);
  } else {
    const res_node *r = &b->rn[e - d->num_args];
    int lim = r->list_out ? FN_MAX_NODE_OUTPUTS : r->n_out;
    if (k >= lim)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', %s: '%s': node '%s' has %d outputs",
                       d->name, what, s, d->nodes[e - d->num_args].name, lim);
  }
  *entry = e;
  *out = (int)k;
  return PD_OK;
}

static pd_code resolve_inputs(build *b, dev_status *st) {
  const dev_fn_def *d = b->d;
  for (int i = 0; i < d->num_nodes; i++) {
    const dev_fn_node *n = &d->nodes[i];
    res_node *r = &b->rn[i];
    int m = n->num_inputs ? n->num_inputs : 1;
    r->in_entry = malloc(sizeof(int) * (size_t)m);
    r->in_out = malloc(sizeof(int) * (size_t)m);
    if (!r->in_entry || !r->in_out) return oom(st);
    for (int j = 0; j < n->num_inputs; j++) {
      char what[200];
      snprintf(what, sizeof what, "node '%s' input %d", n->name, j);
      PD_TRY(
          parse_ref(b, n->inputs[j], what, &r->in_entry[j], &r->in_out[j], st));
      if (r->in_entry[j] == d->num_args + i)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "function '%s', node '%s' reads its own output: a "
                         "cycle",
                         d->name, n->name);
    }
  }
  return PD_OK;
}

/* Kahn's algorithm, ties broken by the given order. */
static pd_code topo_sort(build *b, dev_status *st) {
  const dev_fn_def *d = b->d;
  const int nn = d->num_nodes, na = d->num_args;
  size_t m = nn > 0 && nn <= DEV_FN_MAX_NODES ? (size_t)nn : 1;
  int *indeg = calloc(m, sizeof(int)), *start = calloc(m + 1, sizeof(int));
  b->order = malloc(sizeof(int) * m);
  b->pos = malloc(sizeof(int) * m);
  int total = 0;
  for (int i = 0; i < nn; i++) total += d->nodes[i].num_inputs;
  int *adj = malloc(sizeof(int) * (size_t)(total ? total : 1));
  int *fill = calloc(m + 1, sizeof(int));
  pd_code rc = PD_OK;
  if (!indeg || !start || !b->order || !b->pos || !adj || !fill) {
    rc = oom(st);
    goto out;
  }
  for (int i = 0; i < nn; i++)
    for (int j = 0; j < d->nodes[i].num_inputs; j++)
      if (b->rn[i].in_entry[j] >= na) {
        start[b->rn[i].in_entry[j] - na + 1]++;
        indeg[i]++;
      }
  for (int i = 0; i < nn; i++) start[i + 1] += start[i];
  for (int i = 0; i < nn; i++)
    for (int j = 0; j < d->nodes[i].num_inputs; j++)
      if (b->rn[i].in_entry[j] >= na) {
        int p = b->rn[i].in_entry[j] - na;
        adj[start[p] + fill[p]++] = i;
      }
  int head = 0, tail = 0;
  for (int i = 0; i < nn; i++)
    if (indeg[i] == 0) b->order[tail++] = i;
  while (head < tail) {
    int p = b->order[head++];
    for (int q = start[p]; q < start[p + 1]; q++)
      if (--indeg[adj[q]] == 0) b->order[tail++] = adj[q];
  }
  if (tail < nn) {
    int bad = 0;
    while (indeg[bad] == 0) bad++;
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "function '%s': node '%s' is on a cycle (its inputs lead "
                   "back to it)",
                   d->name, d->nodes[bad].name);
    goto out;
  }
  for (int k = 0; k < nn; k++) b->pos[b->order[k]] = k;
out:
  free(indeg);
  free(start);
  free(adj);
  free(fill);
  return rc;
}

/* The graph's reference for table entry e, output k. */
static fn_ref entry_ref(const build *b, const int *node_pos, int e, int k) {
  const int na = b->d->num_args;
  if (e < na) return fn_arg_ref(e);
  const res_node *r = &b->rn[e - na];
  if (r->const_idx >= 0) return fn_const_ref(node_pos[e - na]);
  return fn_node_ref(node_pos[e - na], k);
}

static pd_code fill_node(build *b, fn_graph *g, const int *node_pos, int i,
                         fn_node *t, dev_status *st) {
  const dev_fn_node *n = &b->d->nodes[i];
  const res_node *r = &b->rn[i];
  t->kind = r->kind;
  t->def = r->def;
  t->n_out = r->n_out;
  if (!(t->name = fn_graph_strdup(n->name))) return oom(st);
  if (r->kind == FN_NODE_CALL && !(t->call = fn_graph_strdup(n->op)))
    return oom(st);
  if (n->num_inputs &&
      !(t->in = malloc(sizeof(fn_ref) * (size_t)n->num_inputs)))
    return oom(st);
  t->n_in = n->num_inputs;
  for (int j = 0; j < n->num_inputs; j++)
    t->in[j] = entry_ref(b, node_pos, r->in_entry[j], r->in_out[j]);
  if (r->kind == FN_NODE_OP) {
    PD_TRY(dev__resolve_attrs(r->def, n->attrs, n->num_attrs, t->attrs,
                              &t->attr_arena, st));
  } else if (r->kind == FN_NODE_GRADIENTS && n->num_attrs) {
    t->n_attrs = 1;
    t->attrs[0] = find_attr(n, "has_grad_y")->value;
    if (!(t->attr_names[0] = fn_graph_strdup("has_grad_y"))) return oom(st);
  }
  if (n->num_origins > 0 && n->origins) {
    if (!(t->origins = calloc((size_t)n->num_origins, sizeof(char *))))
      return oom(st);
    for (int k = 0; k < n->num_origins; k++) {
      if (!(t->origins[k] =
                fn_graph_strdup(n->origins[k] ? n->origins[k] : "?")))
        return oom(st);
      t->n_origins = k + 1;
    }
  }
  (void)g;
  return PD_OK;
}

static pd_code build_graph(build *b, fn_graph **out, dev_status *st) {
  const dev_fn_def *d = b->d;
  fn_graph *g = fn_graph_new(d->name, 0);
  int *node_pos = malloc(sizeof(int) * (size_t)(d->num_nodes + 1));
  pd_code rc = PD_OK;
  if (!g || !node_pos) {
    rc = oom(st);
    goto fail;
  }
  for (int a = 0; a < d->num_args; a++)
    PD_TRY_GOTO(fn_graph_add_arg(g, d->args[a].name, d->args[a].dtype, st), rc,
                fail);
  /* Positions: constants first (in base's order of use), then nodes. */
  int nn = 0;
  for (int k = 0; k < d->num_nodes; k++) {
    int i = b->order[k];
    const res_node *r = &b->rn[i];
    if (r->const_idx >= 0) {
      const fn_const *c = &b->base->consts[r->const_idx];
      PD_TRY_GOTO(fn_graph_add_const(g, c->dtype, &c->shape, c->data, c->bytes,
                                     &node_pos[i], st),
                  rc, fail);
    } else {
      node_pos[i] = nn++;
    }
  }
  if (nn && !(g->nodes = calloc((size_t)nn, sizeof(fn_node)))) {
    rc = oom(st);
    goto fail;
  }
  g->cap_nodes = nn;
  for (int k = 0; k < d->num_nodes; k++) {
    int i = b->order[k];
    if (b->rn[i].const_idx >= 0) continue;
    g->n_nodes = node_pos[i] + 1;
    PD_TRY_GOTO(fill_node(b, g, node_pos, i, &g->nodes[node_pos[i]], st), rc,
                fail);
  }
  g->out_names = calloc((size_t)d->num_outputs, sizeof(char *));
  g->outputs = calloc((size_t)d->num_outputs, sizeof(fn_ref));
  if (!g->out_names || !g->outputs) {
    rc = oom(st);
    goto fail;
  }
  for (int o = 0; o < d->num_outputs; o++) {
    const dev_fn_output *u = &d->outputs[o];
    PD_TRY_GOTO(check_name(d->name, "output", o, u->name, st), rc, fail);
    for (int p = 0; p < o; p++)
      if (strcmp(d->outputs[p].name, u->name) == 0) {
        rc = dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s': output '%s' is named twice; output "
                       "names must be unique",
                       d->name, u->name);
        goto fail;
      }
    char what[200];
    snprintf(what, sizeof what, "output '%s'", u->name);
    int e, k;
    PD_TRY_GOTO(parse_ref(b, u->source, what, &e, &k, st), rc, fail);
    g->outputs[o] = entry_ref(b, node_pos, e, k);
    if (!(g->out_names[o] = fn_graph_strdup(u->name))) {
      rc = oom(st);
      goto fail;
    }
    g->n_outputs = o + 1;
  }
  free(node_pos);
  *out = g;
  return PD_OK;
fail:
  free(node_pos);
  fn_graph_free(g);
  return rc;
}

pd_code fn_graph_from_def(const dev_fn_def *def, const fn_graph *base,
                          fn_lookup_fn lookup, void *arg, fn_graph **out,
                          dev_status *st) {
  PD_TRY(check_header(def, st));
  build b = {.d = def, .base = base, .lookup = lookup, .arg = arg};
  pd_code rc = PD_OK;
  b.rn = calloc((size_t)(def->num_nodes ? def->num_nodes : 1), sizeof *b.rn);
  if (!b.rn) return oom(st);
  PD_TRY_GOTO(build_names(&b, st), rc, done);
  for (int i = 0; i < def->num_nodes; i++) {
    PD_TRY_GOTO(fn_check_node_strings(def, i, base != NULL, st), rc, done);
    PD_TRY_GOTO(resolve_op(&b, i, st), rc, done);
  }
  PD_TRY_GOTO(resolve_inputs(&b, st), rc, done);
  PD_TRY_GOTO(topo_sort(&b, st), rc, done);
  rc = build_graph(&b, out, st);
done:
  build_free(&b);
  return rc;
}

/* --- graph -> definition ------------------------------------------------- */

/* A bump allocator over one block; `need` counts when base is NULL. */
typedef struct bump {
  char *base;
  size_t off;
} bump;

static void *take(bump *m, size_t bytes) {
  size_t at = (m->off + 7) & ~(size_t)7;
  m->off = at + bytes;
  return m->base ? m->base + at : NULL;
}

static const char *put_str(bump *m, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = take(m, n);
  if (p) memcpy(p, s, n);
  return p;
}

static const char *put_ref(bump *m, const fn_graph *g, fn_ref r) {
  char buf[DEV_FN_NAME_MAX + 32];
  if (r.kind == FN_REF_ARG)
    snprintf(buf, sizeof buf, "%s", g->arg_names[r.idx]);
  else if (r.kind == FN_REF_CONST)
    snprintf(buf, sizeof buf, "_fnconst%d", r.idx);
  else if (r.out == 0)
    snprintf(buf, sizeof buf, "%s", g->nodes[r.idx].name);
  else
    snprintf(buf, sizeof buf, "%s:%d", g->nodes[r.idx].name, r.out);
  return put_str(m, buf);
}

static void put_value(bump *m, dev_attr_value *v) {
  if (v->type == DEV_ATTR_STRING) {
    char *p = take(m, v->u.s.len + 1);
    if (p) {
      if (v->u.s.len) memcpy(p, v->u.s.ptr, v->u.s.len);
      p[v->u.s.len] = '\0';
      v->u.s.ptr = p;
    }
  } else if (v->type == DEV_ATTR_INT_LIST && v->u.ilist.n) {
    int64_t *p = take(m, (size_t)v->u.ilist.n * 8);
    if (p) {
      memcpy(p, v->u.ilist.v, (size_t)v->u.ilist.n * 8);
      v->u.ilist.v = p;
    }
  } else if (v->type == DEV_ATTR_FLOAT_LIST && v->u.flist.n) {
    double *p = take(m, (size_t)v->u.flist.n * 8);
    if (p) {
      memcpy(p, v->u.flist.v, (size_t)v->u.flist.n * 8);
      v->u.flist.v = p;
    }
  }
}

/* The common shape of a value: -1 where components differ. */
static dev_shape common_shape(const fn_graph *g, fn_ref r) {
  dev_shape s = *fn_ref_shape(g, r, 0);
  for (int d = 1; d < g->n_dev; d++) {
    const dev_shape *o = fn_ref_shape(g, r, d);
    for (int k = 0; k < s.rank && k < o->rank; k++)
      if (o->dims[k] != s.dims[k]) s.dims[k] = -1;
  }
  return s;
}

static void put_node(bump *m, const fn_graph *g, const fn_node *n,
                     dev_fn_node *t) {
  t->name = put_str(m, n->name);
  t->op = put_str(m, n->kind == FN_NODE_OP     ? n->def->name
                     : n->kind == FN_NODE_CALL ? n->call
                                               : DEV_FN_GRADIENTS_OP);
  const char **in = take(m, sizeof(char *) * (size_t)n->n_in);
  for (int j = 0; j < n->n_in; j++) {
    const char *s = put_ref(m, g, n->in[j]);
    if (in) in[j] = s;
  }
  t->inputs = in;
  t->num_inputs = n->n_in;
  int na = n->kind == FN_NODE_OP ? n->def->num_attrs : n->n_attrs;
  dev_attr *at = take(m, sizeof(dev_attr) * (size_t)na);
  int k = 0;
  for (int j = 0; j < na; j++) {
    if (n->attrs[j].type == DEV_ATTR_NONE) continue;
    dev_attr a = {NULL, n->attrs[j]};
    a.name = put_str(
        m, n->kind == FN_NODE_OP ? n->def->attrs[j].name : n->attr_names[j]);
    put_value(m, &a.value);
    if (at) at[k] = a;
    k++;
  }
  t->attrs = at;
  t->num_attrs = k;
  const char **org = take(m, sizeof(char *) * (size_t)n->n_origins);
  for (int j = 0; j < n->n_origins; j++) {
    const char *s = put_str(m, n->origins[j]);
    if (org) org[j] = s;
  }
  t->origins = org;
  t->num_origins = n->n_origins;
  t->num_outputs_info = 0;
  t->outputs_info = NULL;
  if (g->n_dev > 0 && n->inferred) {
    dev_fn_value_info *vi = take(m, sizeof *vi * (size_t)n->n_out);
    for (int o = 0; vi && o < n->n_out; o++) {
      vi[o].dtype = n->out_dtype[o];
      vi[o].shape = common_shape(g, fn_node_ref((int)(n - g->nodes), o));
    }
    t->outputs_info = vi;
    t->num_outputs_info = n->n_out;
  }
}

static void put_const(bump *m, const fn_graph *g, int c, dev_fn_node *t) {
  char name[32];
  snprintf(name, sizeof name, "_fnconst%d", c);
  memset(t, 0, sizeof *t);
  t->name = put_str(m, name);
  t->op = put_str(m, FN_CONST_OP);
  dev_attr *at = take(m, sizeof(dev_attr));
  if (at)
    *at = dev_attr_int(put_str(m, "index"), c);
  else
    put_str(m, "index");
  t->attrs = at;
  t->num_attrs = 1;
  dev_fn_value_info *vi = take(m, sizeof *vi);
  if (vi) {
    vi->dtype = g->consts[c].dtype;
    vi->shape = g->consts[c].shape;
  }
  t->outputs_info = vi;
  t->num_outputs_info = 1;
}

/* Lays g out into m (sizes only when m->base is NULL). */
static void put_graph(bump *m, const fn_graph *g) {
  dev_fn_def *d = take(m, sizeof *d);
  dev_fn_def tmp = DEV_FN_DEF_INITIALIZER;
  tmp.name = put_str(m, g->fn_name);
  dev_fn_arg *args = take(m, sizeof *args * (size_t)g->n_args);
  for (int a = 0; a < g->n_args; a++) {
    const char *s = put_str(m, g->arg_names[a]);
    if (args) args[a] = (dev_fn_arg){s, g->arg_dtype[a]};
  }
  int live = 0;
  for (int i = 0; i < g->n_nodes; i++) live += !g->nodes[i].dead;
  int total = live + g->n_consts;
  dev_fn_node *nodes = take(m, sizeof *nodes * (size_t)total);
  dev_fn_node scratch;
  int k = 0;
  for (int c = 0; c < g->n_consts; c++, k++)
    put_const(m, g, c, nodes ? &nodes[k] : &scratch);
  for (int i = 0; i < g->n_nodes; i++)
    if (!g->nodes[i].dead) {
      put_node(m, g, &g->nodes[i], nodes ? &nodes[k] : &scratch);
      k++;
    }
  dev_fn_output *outs = take(m, sizeof *outs * (size_t)g->n_outputs);
  for (int o = 0; o < g->n_outputs; o++) {
    const char *n = put_str(m, g->out_names[o]);
    const char *s = put_ref(m, g, g->outputs[o]);
    if (outs) outs[o] = (dev_fn_output){n, s};
  }
  tmp.args = args;
  tmp.num_args = g->n_args;
  tmp.nodes = nodes;
  tmp.num_nodes = total;
  tmp.outputs = outs;
  tmp.num_outputs = g->n_outputs;
  if (d) *d = tmp;
}

dev_fn_def *fn_graph_to_def(const fn_graph *g) {
  bump m = {NULL, 0};
  put_graph(&m, g);
  m.base = calloc(1, m.off + 8);
  if (!m.base) return NULL;
  m.off = 0;
  put_graph(&m, g);
  return (dev_fn_def *)(void *)m.base;
}

void dev_fn_def_free(dev_fn_def *def) { free(def); }
