/* The graph of a function as the passes see it (fn_int.h): creation, deep
 * copies, appending and inserting nodes, constants, inference of a node,
 * uses, redirection of uses, compaction and the invariant check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fn_int.h"

static pd_code oom(dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
}

char *fn_graph_strdup(const char *s) { return s ? strdup(s) : NULL; }

fn_graph *fn_graph_new(const char *fn_name, int n_dev) {
  fn_graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->fn_name = fn_graph_strdup(fn_name ? fn_name : "");
  g->n_dev = n_dev;
  if (!g->fn_name) {
    free(g);
    return NULL;
  }
  return g;
}

static void node_clear(fn_node *n) {
  free(n->name);
  free(n->call);
  free(n->in);
  for (int i = 0; i < DEV_MAX_ATTRS; i++) free(n->attr_names[i]);
  free(n->attr_arena);
  free(n->out_shape);
  for (int i = 0; i < n->n_origins; i++) free(n->origins[i]);
  free(n->origins);
  memset(n, 0, sizeof *n);
}

void fn_graph_free(fn_graph *g) {
  if (!g) return;
  for (int i = 0; i < g->n_nodes; i++) node_clear(&g->nodes[i]);
  free(g->nodes);
  for (int i = 0; i < g->n_args; i++) free(g->arg_names[i]);
  free(g->arg_names);
  free(g->arg_dtype);
  free(g->arg_shape);
  free(g->arg_not_mirrored);
  for (int i = 0; i < g->n_outputs; i++) free(g->out_names[i]);
  free(g->out_names);
  free(g->outputs);
  for (int i = 0; i < g->n_consts; i++) free(g->consts[i].data);
  free(g->consts);
  free(g->fn_name);
  free(g);
}

/* Bytes of the deep-copied strings and lists of attrs[0..n) (as
 * dev__resolve_attrs lays them out). */
static size_t attrs_arena_bytes(const dev_attr_value *v, int n) {
  size_t b = 0;
  for (int i = 0; i < n; i++) {
    if (v[i].type == DEV_ATTR_STRING) b += v[i].u.s.len + 1;
    if (v[i].type == DEV_ATTR_INT_LIST) b += (size_t)v[i].u.ilist.n * 8;
    if (v[i].type == DEV_ATTR_FLOAT_LIST) b += (size_t)v[i].u.flist.n * 8;
  }
  return b;
}

/* Copies attrs[0..n) into dst with their strings and lists in a new arena. */
static bool copy_attr_values(const dev_attr_value *src, int n,
                             dev_attr_value *dst, void **arena) {
  size_t b = attrs_arena_bytes(src, n);
  char *p = NULL;
  *arena = NULL;
  if (b) {
    p = malloc(b);
    if (!p) return false;
    *arena = p;
  }
  for (int i = 0; i < n; i++) {
    dst[i] = src[i];
    if (src[i].type == DEV_ATTR_STRING) {
      if (src[i].u.s.len) memcpy(p, src[i].u.s.ptr, src[i].u.s.len);
      p[src[i].u.s.len] = '\0';
      dst[i].u.s.ptr = p;
      p += src[i].u.s.len + 1;
    } else if (src[i].type == DEV_ATTR_INT_LIST && src[i].u.ilist.n) {
      memcpy(p, src[i].u.ilist.v, (size_t)src[i].u.ilist.n * 8);
      dst[i].u.ilist.v = (const int64_t *)(void *)p;
      p += (size_t)src[i].u.ilist.n * 8;
    } else if (src[i].type == DEV_ATTR_FLOAT_LIST && src[i].u.flist.n) {
      memcpy(p, src[i].u.flist.v, (size_t)src[i].u.flist.n * 8);
      dst[i].u.flist.v = (const double *)(void *)p;
      p += (size_t)src[i].u.flist.n * 8;
    }
  }
  return true;
}

static bool node_copy(const fn_graph *g, const fn_node *s, fn_node *d) {
  memset(d, 0, sizeof *d);
  d->kind = s->kind;
  d->def = s->def;
  d->n_in = s->n_in;
  d->n_attrs = s->n_attrs;
  d->n_out = s->n_out;
  d->inferred = s->inferred;
  d->dead = s->dead;
  memcpy(d->out_dtype, s->out_dtype, sizeof d->out_dtype);
  memcpy(d->out_not_mirrored, s->out_not_mirrored, sizeof d->out_not_mirrored);
  d->name = fn_graph_strdup(s->name);
  if (!d->name) return false;
  if (s->call && !(d->call = fn_graph_strdup(s->call))) return false;
  if (s->n_in) {
    d->in = malloc(sizeof *d->in * (size_t)s->n_in);
    if (!d->in) return false;
    memcpy(d->in, s->in, sizeof *d->in * (size_t)s->n_in);
  }
  int na = s->kind == FN_NODE_OP ? s->def->num_attrs : s->n_attrs;
  if (!copy_attr_values(s->attrs, na, d->attrs, &d->attr_arena)) return false;
  for (int i = 0; i < DEV_MAX_ATTRS; i++)
    if (s->attr_names[i] &&
        !(d->attr_names[i] = fn_graph_strdup(s->attr_names[i])))
      return false;
  if (s->out_shape && g->n_dev > 0 && s->n_out > 0) {
    size_t b = sizeof(dev_shape) * (size_t)s->n_out * (size_t)g->n_dev;
    if (!(d->out_shape = malloc(b))) return false;
    memcpy(d->out_shape, s->out_shape, b);
  }
  if (s->n_origins) {
    d->origins = calloc((size_t)s->n_origins, sizeof *d->origins);
    if (!d->origins) return false;
    d->n_origins = s->n_origins;
    for (int i = 0; i < s->n_origins; i++)
      if (!(d->origins[i] = fn_graph_strdup(s->origins[i]))) return false;
  }
  return true;
}

static void *dup_mem(const void *p, size_t b) {
  if (!b) return NULL;
  void *q = malloc(b);
  if (q) memcpy(q, p, b);
  return q;
}

fn_graph *fn_graph_clone(const fn_graph *s) {
  fn_graph *g = fn_graph_new(s->fn_name, s->n_dev);
  if (!g) return NULL;
  size_t na = (size_t)s->n_args, nd = (size_t)(s->n_dev ? s->n_dev : 1);
  if (na) {
    g->arg_names = calloc(na, sizeof *g->arg_names);
    g->arg_dtype = dup_mem(s->arg_dtype, na * sizeof *s->arg_dtype);
    if (!g->arg_names || !g->arg_dtype) goto fail;
    g->n_args = s->n_args;
    for (size_t i = 0; i < na; i++)
      if (!(g->arg_names[i] = fn_graph_strdup(s->arg_names[i]))) goto fail;
    if (s->arg_shape &&
        !(g->arg_shape = dup_mem(s->arg_shape, na * nd * sizeof(dev_shape))))
      goto fail;
    if (s->arg_not_mirrored &&
        !(g->arg_not_mirrored = dup_mem(s->arg_not_mirrored, na)))
      goto fail;
  }
  if (s->n_nodes) {
    g->nodes = calloc((size_t)s->n_nodes, sizeof *g->nodes);
    if (!g->nodes) goto fail;
    g->cap_nodes = s->n_nodes;
    for (int i = 0; i < s->n_nodes; i++) {
      g->n_nodes = i + 1;
      if (!node_copy(s, &s->nodes[i], &g->nodes[i])) goto fail;
    }
  }
  if (s->n_outputs) {
    g->out_names = calloc((size_t)s->n_outputs, sizeof *g->out_names);
    g->outputs = dup_mem(s->outputs, sizeof *s->outputs * (size_t)s->n_outputs);
    if (!g->out_names || !g->outputs) goto fail;
    g->n_outputs = s->n_outputs;
    for (int i = 0; i < s->n_outputs; i++)
      if (!(g->out_names[i] = fn_graph_strdup(s->out_names[i]))) goto fail;
  }
  if (s->n_consts) {
    g->consts = calloc((size_t)s->n_consts, sizeof *g->consts);
    if (!g->consts) goto fail;
    g->cap_consts = s->n_consts;
    for (int i = 0; i < s->n_consts; i++) {
      g->consts[i] = s->consts[i];
      g->consts[i].data = NULL;
      g->n_consts = i + 1;
      if (s->consts[i].bytes &&
          !(g->consts[i].data = dup_mem(s->consts[i].data, s->consts[i].bytes)))
        goto fail;
    }
  }
  return g;
fail:
  fn_graph_free(g);
  return NULL;
}

pd_code fn_graph_add_arg(fn_graph *g, const char *name, pd_dtype dt,
                         dev_status *st) {
  size_t n = (size_t)g->n_args + 1;
  char **names = realloc(g->arg_names, n * sizeof *names);
  if (!names) return oom(st);
  g->arg_names = names;
  pd_dtype *dts = realloc(g->arg_dtype, n * sizeof *dts);
  if (!dts) return oom(st);
  g->arg_dtype = dts;
  if (!(names[n - 1] = fn_graph_strdup(name))) return oom(st);
  dts[n - 1] = dt;
  g->n_args = (int)n;
  return PD_OK;
}

/* Notes one name of g against `base`: *taken when it is base, *top the
 * largest K of a name "base_K" (K decimal digits). */
static void name_note(const char *name, const char *base, size_t blen,
                      bool *taken, unsigned long *top) {
  if (!name || strncmp(name, base, blen) != 0) return;
  if (!name[blen]) {
    *taken = true;
    return;
  }
  if (name[blen] != '_' || !name[blen + 1]) return;
  unsigned long k = 0;
  for (const char *p = name + blen + 1; *p; p++) {
    if (*p < '0' || *p > '9' || k > 100000000ul) return;
    k = k * 10 + (unsigned long)(*p - '0');
  }
  if (k > *top) *top = k;
}

/* A name not yet used in g: `base`, else "base_K" past the largest K in
 * use. One scan of the names (a scan per candidate suffix made a gradient
 * expansion, thousands of "g/Mul_K", cubic in the nodes). */
static char *unique_name(const fn_graph *g, const char *base) {
  const size_t blen = strlen(base);
  bool taken = false;
  unsigned long top = 0;
  for (int i = 0; i < g->n_nodes; i++)
    name_note(g->nodes[i].name, base, blen, &taken, &top);
  for (int i = 0; i < g->n_args; i++)
    name_note(g->arg_names[i], base, blen, &taken, &top);
  if (!taken) return fn_graph_strdup(base);
  size_t len = blen + 24;
  char *s = malloc(len);
  if (s) snprintf(s, len, "%s_%lu", base, top + 1);
  return s;
}

/* Shifts references to nodes >= pos by `by` (an insertion at pos). */
static void shift_refs(fn_graph *g, int pos, int by) {
  for (int i = 0; i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++)
      if (g->nodes[i].in[j].kind == FN_REF_NODE && g->nodes[i].in[j].idx >= pos)
        g->nodes[i].in[j].idx += by;
  for (int i = 0; i < g->n_outputs; i++)
    if (g->outputs[i].kind == FN_REF_NODE && g->outputs[i].idx >= pos)
      g->outputs[i].idx += by;
}

pd_code fn_graph_insert_op(fn_graph *g, int pos, const char *name,
                           const dev_op_def *def, const fn_ref *in, int n_in,
                           const dev_attr *attrs, int n_attrs, int *idx,
                           dev_status *st) {
  if (pos < 0 || pos > g->n_nodes) pos = g->n_nodes;
  if (g->n_nodes >= DEV_FN_MAX_NODES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': more than %d nodes", g->fn_name,
                     DEV_FN_MAX_NODES);
  if (n_in < 0 || n_in > DEV_MAX_INPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: %d inputs; the limit is %d",
                     def->name, n_in, DEV_MAX_INPUTS);
  fn_node nd;
  memset(&nd, 0, sizeof nd);
  nd.kind = FN_NODE_OP;
  nd.def = def;
  pd_code rc =
      dev__resolve_attrs(def, attrs, n_attrs, nd.attrs, &nd.attr_arena, st);
  if (rc != PD_OK) return rc;
  nd.name = unique_name(g, name && name[0] ? name : def->name);
  if (!nd.name) goto nomem;
  if (n_in) {
    nd.in = malloc(sizeof *nd.in * (size_t)n_in);
    if (!nd.in) goto nomem;
    memcpy(nd.in, in, sizeof *nd.in * (size_t)n_in);
  }
  nd.n_in = n_in;
  nd.n_out = def->num_outputs;
  if (g->n_nodes == g->cap_nodes) {
    int cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
    fn_node *nn = realloc(g->nodes, sizeof *nn * (size_t)cap);
    if (!nn) goto nomem;
    g->nodes = nn;
    g->cap_nodes = cap;
  }
  if (pos < g->n_nodes) {
    shift_refs(g, pos, 1);
    memmove(&g->nodes[pos + 1], &g->nodes[pos],
            sizeof *g->nodes * (size_t)(g->n_nodes - pos));
  }
  g->nodes[pos] = nd;
  g->n_nodes++;
  if (g->n_dev > 0) {
    rc = fn_graph_infer_node(g, pos, st);
    if (rc != PD_OK) {
      g->nodes[pos].dead = true; /* left for compaction; no uses yet */
      return rc;
    }
  }
  if (idx) *idx = pos;
  return PD_OK;
nomem:
  node_clear(&nd);
  return oom(st);
}

pd_code fn_graph_add_op(fn_graph *g, const char *name, const dev_op_def *def,
                        const fn_ref *in, int n_in, const dev_attr *attrs,
                        int n_attrs, int *idx, dev_status *st) {
  return fn_graph_insert_op(g, g->n_nodes, name, def, in, n_in, attrs, n_attrs,
                            idx, st);
}

pd_code fn_node_merge_origins(fn_graph *g, int i, const int *from, int n,
                              dev_status *st) {
  int total = 0;
  for (int k = 0; k < n; k++) {
    const fn_node *f = &g->nodes[from[k]];
    total += f->n_origins ? f->n_origins : 1;
  }
  char **o = calloc((size_t)(total ? total : 1), sizeof *o);
  if (!o) return oom(st);
  int m = 0;
  for (int k = 0; k < n; k++) {
    const fn_node *f = &g->nodes[from[k]];
    int cnt = f->n_origins ? f->n_origins : 1;
    for (int j = 0; j < cnt; j++) {
      const char *s = f->n_origins ? f->origins[j] : f->name;
      bool dup = false;
      for (int q = 0; q < m && !dup; q++) dup = strcmp(o[q], s) == 0;
      if (dup) continue;
      if (!(o[m] = fn_graph_strdup(s))) {
        for (int q = 0; q < m; q++) free(o[q]);
        free(o);
        return oom(st);
      }
      m++;
    }
  }
  fn_node *t = &g->nodes[i];
  for (int q = 0; q < t->n_origins; q++) free(t->origins[q]);
  free(t->origins);
  t->origins = o;
  t->n_origins = m;
  return PD_OK;
}

pd_code fn_graph_add_const(fn_graph *g, pd_dtype dt, const dev_shape *shape,
                           const void *data, size_t bytes, int *idx,
                           dev_status *st) {
  if (g->n_consts == g->cap_consts) {
    int cap = g->cap_consts ? g->cap_consts * 2 : 8;
    fn_const *nc = realloc(g->consts, sizeof *nc * (size_t)cap);
    if (!nc) return oom(st);
    g->consts = nc;
    g->cap_consts = cap;
  }
  fn_const c = {dt, *shape, NULL, bytes};
  if (bytes && !(c.data = dup_mem(data, bytes))) return oom(st);
  g->consts[g->n_consts] = c;
  if (idx) *idx = g->n_consts;
  g->n_consts++;
  return PD_OK;
}

pd_dtype fn_ref_dtype(const fn_graph *g, fn_ref r) {
  switch (r.kind) {
    case FN_REF_ARG: return g->arg_dtype[r.idx];
    case FN_REF_NODE: return g->nodes[r.idx].out_dtype[r.out];
    case FN_REF_CONST: return g->consts[r.idx].dtype;
  }
  return PD_DTYPE_INVALID;
}

const dev_shape *fn_ref_shape(const fn_graph *g, fn_ref r, int d) {
  switch (r.kind) {
    case FN_REF_ARG: return &g->arg_shape[r.idx * g->n_dev + d];
    case FN_REF_NODE: return &g->nodes[r.idx].out_shape[r.out * g->n_dev + d];
    case FN_REF_CONST: return &g->consts[r.idx].shape;
  }
  return NULL;
}

bool fn_ref_not_mirrored(const fn_graph *g, fn_ref r) {
  switch (r.kind) {
    case FN_REF_ARG: return g->arg_not_mirrored && g->arg_not_mirrored[r.idx];
    case FN_REF_NODE: return g->nodes[r.idx].out_not_mirrored[r.out];
    case FN_REF_CONST: return false;
  }
  return false;
}

char *fn_node_describe(const fn_graph *g, int i, char *buf, size_t len) {
  const fn_node *n = &g->nodes[i];
  int off = snprintf(buf, len, "function '%s', node '%s'", g->fn_name,
                     n->name ? n->name : "?");
  if (n->n_origins > 0 && off > 0 && (size_t)off < len) {
    bool self = n->n_origins == 1 && strcmp(n->origins[0], n->name) == 0;
    if (!self) {
      /* "fused from" for a node the fusion pass made; a node made by
       * gradient expansion or another rewrite is "from" what it stands for. */
      bool fused = n->kind == FN_NODE_OP && n->def &&
                   strncmp(n->def->name, "_Fused", 6) == 0;
      off += snprintf(buf + off, len - (size_t)off, " (%s ",
                      fused ? "fused from" : "from");
      for (int k = 0; k < n->n_origins && off > 0 && (size_t)off < len; k++)
        off += snprintf(buf + off, len - (size_t)off, "%s%s", k ? ", " : "",
                        n->origins[k]);
      if (off > 0 && (size_t)off < len)
        snprintf(buf + off, len - (size_t)off, ")");
    }
  }
  return buf;
}

/* A Gradients node's outputs: the sources' dtypes, shapes and marks. */
static pd_code infer_gradients(fn_graph *g, int i, dev_status *st) {
  fn_node *n = &g->nodes[i];
  const int nd = g->n_dev;
  int k = n->n_out;
  dev_shape *out = malloc(sizeof(dev_shape) * (size_t)(k ? k : 1) * (size_t)nd);
  if (!out) return oom(st);
  for (int s = 0; s < k; s++) {
    fn_ref x = n->in[1 + s];
    n->out_dtype[s] = fn_ref_dtype(g, x);
    n->out_not_mirrored[s] = fn_ref_not_mirrored(g, x);
    for (int d = 0; d < nd; d++) out[s * nd + d] = *fn_ref_shape(g, x, d);
  }
  free(n->out_shape);
  n->out_shape = out;
  n->inferred = true;
  return PD_OK;
}

pd_code fn_graph_add_gradients(fn_graph *g, const char *name, const fn_ref *in,
                               int n_in, bool has_grad_y, int *idx,
                               dev_status *st) {
  int k = n_in - 1 - (has_grad_y ? 1 : 0);
  if (k < 0 || k > FN_MAX_NODE_OUTPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': %s node '%s' has %d inputs; expected y, "
                     "0 to %d sources%s",
                     g->fn_name, DEV_FN_GRADIENTS_OP, name ? name : "", n_in,
                     FN_MAX_NODE_OUTPUTS, has_grad_y ? " and grad_y" : "");
  if (g->n_nodes >= DEV_FN_MAX_NODES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': more than %d nodes", g->fn_name,
                     DEV_FN_MAX_NODES);
  if (g->n_nodes == g->cap_nodes) {
    int cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
    fn_node *nn = realloc(g->nodes, sizeof *nn * (size_t)cap);
    if (!nn) return oom(st);
    g->nodes = nn;
    g->cap_nodes = cap;
  }
  fn_node nd;
  memset(&nd, 0, sizeof nd);
  nd.kind = FN_NODE_GRADIENTS;
  nd.name = unique_name(g, name && name[0] ? name : DEV_FN_GRADIENTS_OP);
  nd.in = malloc(sizeof *nd.in * (size_t)n_in);
  nd.attr_names[0] = fn_graph_strdup("has_grad_y");
  if (!nd.name || !nd.in || !nd.attr_names[0]) {
    node_clear(&nd);
    return oom(st);
  }
  memcpy(nd.in, in, sizeof *nd.in * (size_t)n_in);
  nd.n_in = n_in;
  nd.n_attrs = 1;
  nd.attrs[0] = (dev_attr_value){.type = DEV_ATTR_BOOL, .u.b = has_grad_y};
  nd.n_out = k;
  int pos = g->n_nodes;
  g->nodes[pos] = nd;
  g->n_nodes++;
  if (g->n_dev > 0) {
    pd_code rc = infer_gradients(g, pos, st);
    if (rc != PD_OK) {
      g->nodes[pos].dead = true;
      return rc;
    }
  }
  if (idx) *idx = pos;
  return PD_OK;
}

pd_code fn_graph_infer_node(fn_graph *g, int i, dev_status *st) {
  fn_node *n = &g->nodes[i];
  if (n->kind == FN_NODE_GRADIENTS) return infer_gradients(g, i, st);
  if (n->kind != FN_NODE_OP)
    return dev_error(st, PD_INTERNAL, "function '%s': node '%s' is a %s",
                     g->fn_name, n->name, "call not inlined");
  const int nd = g->n_dev;
  const size_t cnt = (size_t)(n->n_in ? n->n_in : 1) * (size_t)nd;
  pd_dtype in_dtype[DEV_MAX_INPUTS];
  dev_shape *in_shapes = malloc(sizeof(dev_shape) * cnt);
  dev_shape *out =
      malloc(sizeof(dev_shape) * (size_t)DEV_MAX_OUTPUTS * (size_t)nd);
  if (!in_shapes || !out) {
    free(in_shapes);
    free(out);
    return oom(st);
  }
  bool in_nm = false;
  for (int j = 0; j < n->n_in; j++) {
    in_dtype[j] = fn_ref_dtype(g, n->in[j]);
    in_nm |= fn_ref_not_mirrored(g, n->in[j]);
    for (int d = 0; d < nd; d++)
      in_shapes[j * nd + d] = *fn_ref_shape(g, n->in[j], d);
  }
  int nout = 0;
  dev_status ist = DEV_STATUS_INIT;
  pd_code rc = dev__infer_op(n->def, n->attrs, NULL, nd, n->n_in, in_dtype,
                             in_shapes, &nout, n->out_dtype, out, &ist);
  free(in_shapes);
  if (rc != PD_OK) {
    free(out);
    char where[300];
    return dev_error(st, rc, "%s: %s",
                     fn_node_describe(g, i, where, sizeof where), ist.msg);
  }
  free(n->out_shape);
  n->out_shape = out;
  n->n_out = nout;
  bool nm = dev__outputs_not_mirrored(n->def, n->attrs, in_nm);
  for (int k = 0; k < nout; k++) n->out_not_mirrored[k] = nm;
  n->inferred = true;
  return PD_OK;
}

pd_code fn_graph_infer(fn_graph *g, dev_status *st) {
  for (int i = 0; i < g->n_nodes; i++)
    if (!g->nodes[i].dead) PD_TRY(fn_graph_infer_node(g, i, st));
  return PD_OK;
}

int *fn_graph_use_counts(const fn_graph *g) {
  int *c = calloc((size_t)(g->n_nodes ? g->n_nodes : 1) * FN_MAX_NODE_OUTPUTS,
                  sizeof *c);
  if (!c) return NULL;
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].dead) continue;
    for (int j = 0; j < g->nodes[i].n_in; j++) {
      fn_ref r = g->nodes[i].in[j];
      if (r.kind == FN_REF_NODE) c[r.idx * FN_MAX_NODE_OUTPUTS + r.out]++;
    }
  }
  for (int i = 0; i < g->n_outputs; i++) {
    fn_ref r = g->outputs[i];
    if (r.kind == FN_REF_NODE)
      c[r.idx * FN_MAX_NODE_OUTPUTS + r.out] += FN_USE_OUTPUT;
  }
  return c;
}

void fn_graph_replace_uses(fn_graph *g, fn_ref from, fn_ref to, int first) {
  for (int i = first < 0 ? 0 : first; i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++)
      if (fn_ref_eq(g->nodes[i].in[j], from)) g->nodes[i].in[j] = to;
  for (int i = 0; i < g->n_outputs; i++)
    if (fn_ref_eq(g->outputs[i], from)) g->outputs[i] = to;
}

int fn_graph_live(const fn_graph *g) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += !g->nodes[i].dead;
  return n;
}

void fn_graph_compact(fn_graph *g) {
  int *map = malloc(sizeof *map * (size_t)(g->n_nodes ? g->n_nodes : 1));
  int *cmap = malloc(sizeof *cmap * (size_t)(g->n_consts ? g->n_consts : 1));
  if (!map || !cmap) { /* out of memory: leave the dead nodes in place */
    free(map);
    free(cmap);
    return;
  }
  int m = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].dead) {
      node_clear(&g->nodes[i]);
      map[i] = -1;
      continue;
    }
    map[i] = m;
    if (m != i) g->nodes[m] = g->nodes[i];
    m++;
  }
  g->n_nodes = m;
  /* constants still in use */
  bool *used = calloc((size_t)(g->n_consts ? g->n_consts : 1), 1);
  for (int i = 0; used && i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++)
      if (g->nodes[i].in[j].kind == FN_REF_CONST)
        used[g->nodes[i].in[j].idx] = true;
  for (int i = 0; used && i < g->n_outputs; i++)
    if (g->outputs[i].kind == FN_REF_CONST) used[g->outputs[i].idx] = true;
  int mc = 0;
  for (int c = 0; c < g->n_consts; c++) {
    if (used && !used[c]) {
      free(g->consts[c].data);
      cmap[c] = -1;
      continue;
    }
    cmap[c] = mc;
    if (mc != c) g->consts[mc] = g->consts[c];
    mc++;
  }
  g->n_consts = mc;
  free(used);
  for (int i = 0; i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) {
      fn_ref *r = &g->nodes[i].in[j];
      if (r->kind == FN_REF_NODE) r->idx = map[r->idx];
      if (r->kind == FN_REF_CONST) r->idx = cmap[r->idx];
    }
  for (int i = 0; i < g->n_outputs; i++) {
    fn_ref *r = &g->outputs[i];
    if (r->kind == FN_REF_NODE) r->idx = map[r->idx];
    if (r->kind == FN_REF_CONST) r->idx = cmap[r->idx];
  }
  free(map);
  free(cmap);
}

static pd_code check_ref(const fn_graph *g, fn_ref r, int before,
                         const char *what, dev_status *st) {
  bool ok = false;
  switch (r.kind) {
    case FN_REF_ARG: ok = r.idx >= 0 && r.idx < g->n_args; break;
    case FN_REF_CONST: ok = r.idx >= 0 && r.idx < g->n_consts; break;
    case FN_REF_NODE:
      ok = r.idx >= 0 && r.idx < before && !g->nodes[r.idx].dead &&
           r.out >= 0 && r.out < g->nodes[r.idx].n_out;
      break;
  }
  if (!ok)
    return dev_error(st, PD_INTERNAL,
                     "function '%s': %s refers to a value out of range "
                     "(kind %d, index %d, output %d)",
                     g->fn_name, what, (int)r.kind, r.idx, r.out);
  return PD_OK;
}

pd_code fn_graph_check(const fn_graph *g, dev_status *st) {
  for (int i = 0; i < g->n_nodes; i++) {
    const fn_node *n = &g->nodes[i];
    if (n->dead) continue;
    char what[200];
    snprintf(what, sizeof what, "node '%s'", n->name);
    for (int j = 0; j < n->n_in; j++)
      PD_TRY(check_ref(g, n->in[j], i, what, st));
  }
  for (int i = 0; i < g->n_outputs; i++) {
    char what[200];
    snprintf(what, sizeof what, "output '%s'", g->out_names[i]);
    PD_TRY(check_ref(g, g->outputs[i], g->n_nodes, what, st));
  }
  return PD_OK;
}

const dev_attr_value *fn_node_attr(const fn_node *n, const char *name) {
  if (n->kind != FN_NODE_OP) return NULL;
  int i = dev_op_attr_index(n->def, name);
  return i >= 0 ? &n->attrs[i] : NULL;
}
