/* Calls of other functions inlined (fn_inline_calls, fn_int.h): each
 * FN_NODE_CALL node is replaced, in place, by a copy of the callee's nodes
 * renamed "call/node", the callee's arguments bound to the call's inputs,
 * its constants appended to the caller's and its outputs standing for the
 * call's. Inlining repeats level by level up to DEV_FN_MAX_CALL_DEPTH
 * (a library cannot hold recursion: a function may call only functions
 * registered before it). Source: TensorFlow's function inlining
 * (tensorflow/core/common_runtime/function_utils.cc, InlineFunctionBody). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fn_call.h"

static void node_free_fields(fn_node *n) {
  free(n->name);
  free(n->call);
  free(n->in);
  for (int k = 0; k < DEV_MAX_ATTRS; k++) free(n->attr_names[k]);
  free(n->attr_arena);
  free(n->out_shape);
  for (int k = 0; k < n->n_origins; k++) free(n->origins[k]);
  free(n->origins);
}

/* The caller's reference for a callee reference r (call node at i, callee
 * constants from cbase). */
static fn_ref map_callee_ref(const fn_node *call, int i, int cbase, fn_ref r) {
  if (r.kind == FN_REF_ARG) return call->in[r.idx];
  if (r.kind == FN_REF_CONST) return fn_const_ref(cbase + r.idx);
  return fn_node_ref(i + r.idx, r.out);
}

/* The caller's reference for r after node i was replaced by m nodes. */
static fn_ref map_after(fn_ref r, int i, int m, const fn_ref *outmap) {
  if (r.kind != FN_REF_NODE || r.idx < i) return r;
  if (r.idx == i) return outmap[r.out];
  r.idx += m - 1;
  return r;
}

static pd_code inline_one(fn_graph *g, int i, const fn_graph *callee,
                          dev_status *st) {
  const int n = g->n_nodes;
  if (n - 1 + callee->n_nodes > DEV_FN_MAX_NODES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': inlining '%s' (node '%s') makes more "
                     "than %d nodes",
                     g->fn_name, callee->fn_name, g->nodes[i].name,
                     DEV_FN_MAX_NODES);
  fn_graph *c = fn_graph_clone(callee);
  const int m = c ? c->n_nodes : 0;
  fn_node *nn = c ? calloc((size_t)(n - 1 + m + 1), sizeof *nn) : NULL;
  char **names = c ? calloc((size_t)(m + 1), sizeof *names) : NULL;
  bool ok = c && nn && names;
  const fn_node *call = &g->nodes[i];
  for (int j = 0; ok && j < m; j++) {
    size_t len = strlen(call->name) + strlen(c->nodes[j].name) + 2;
    if (!(names[j] = malloc(len)))
      ok = false;
    else
      snprintf(names[j], len, "%s/%s", call->name, c->nodes[j].name);
  }
  const int cbase = g->n_consts;
  for (int k = 0; ok && k < c->n_consts; k++)
    ok = fn_graph_add_const(g, c->consts[k].dtype, &c->consts[k].shape,
                            c->consts[k].data, c->consts[k].bytes, NULL,
                            st) == PD_OK;
  if (!ok) {
    for (int j = 0; names && j < m; j++) free(names[j]);
    free(names);
    free(nn);
    fn_graph_free(c);
    g->n_consts = cbase; /* data of any added: leaked only on OOM paths */
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  fn_ref outmap[FN_MAX_NODE_OUTPUTS];
  for (int k = 0; k < c->n_outputs && k < FN_MAX_NODE_OUTPUTS; k++)
    outmap[k] = map_callee_ref(call, i, cbase, c->outputs[k]);
  memcpy(nn, g->nodes, sizeof *nn * (size_t)i);
  for (int j = 0; j < m; j++) {
    fn_node *t = &nn[i + j];
    *t = c->nodes[j];
    free(t->name);
    t->name = names[j];
    for (int q = 0; q < t->n_in; q++)
      t->in[q] = map_callee_ref(call, i, cbase, t->in[q]);
  }
  for (int j = i + 1; j < n; j++) {
    fn_node *t = &nn[j + m - 1];
    *t = g->nodes[j];
    for (int q = 0; q < t->n_in; q++)
      t->in[q] = map_after(t->in[q], i, m, outmap);
  }
  for (int o = 0; o < g->n_outputs; o++)
    g->outputs[o] = map_after(g->outputs[o], i, m, outmap);
  node_free_fields(&g->nodes[i]);
  free(g->nodes);
  free(names);
  g->nodes = nn;
  g->n_nodes = n - 1 + m;
  g->cap_nodes = n + m;
  c->n_nodes = 0; /* its nodes moved into g */
  fn_graph_free(c);
  return PD_OK;
}

pd_code fn_inline_call_at(fn_graph *g, int i, const fn_graph *callee,
                          dev_status *st) {
  if (callee->n_args != g->nodes[i].n_in)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s': function '%s' takes %d "
                     "inputs; got %d",
                     g->fn_name, g->nodes[i].name, callee->fn_name,
                     callee->n_args, g->nodes[i].n_in);
  return inline_one(g, i, callee, st);
}

pd_code fn_inline_calls(fn_graph *g, fn_lookup_fn lookup, void *arg,
                        dev_status *st) {
  for (int depth = 0;; depth++) {
    bool any = false;
    for (int i = 0; i < g->n_nodes && !any; i++)
      any = g->nodes[i].kind == FN_NODE_CALL && !g->nodes[i].dead;
    if (!any) return PD_OK;
    if (depth == DEV_FN_MAX_CALL_DEPTH)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s': calls nest deeper than %d levels",
                       g->fn_name, DEV_FN_MAX_CALL_DEPTH);
    /* One level: every call present now (back to front, so the indices of
     * the calls still to inline stay valid). */
    for (int i = g->n_nodes - 1; i >= 0; i--) {
      if (g->nodes[i].kind != FN_NODE_CALL || g->nodes[i].dead) continue;
      const fn_graph *callee = lookup ? lookup(arg, g->nodes[i].call) : NULL;
      if (!callee)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "function '%s', node '%s': function '%s' is not in "
                         "the library",
                         g->fn_name, g->nodes[i].name, g->nodes[i].call);
      if (callee->n_args != g->nodes[i].n_in)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "function '%s', node '%s': function '%s' takes %d "
                         "inputs; got %d",
                         g->fn_name, g->nodes[i].name, callee->fn_name,
                         callee->n_args, g->nodes[i].n_in);
      PD_TRY(inline_one(g, i, callee, st));
    }
  }
}

/* --- one pass, front to back (fn_inline_all) ------------------------------ */

/* Where one source node's outputs went: a node of g, or (a call) the refs
 * its callee's outputs became. */
typedef struct inl_map {
  int idx;      /* node of g; -1 for a call */
  fn_ref *outs; /* a call's outputs (owned) */
} inl_map;

/* One level being emitted: its nodes (owned: moved into g one by one), what
 * its args and constants stand for, its name prefix. */
typedef struct inl_level {
  const char *fn_name;  /* the function these nodes are of */
  const fn_ref *argmap; /* NULL: the root's args */
  int cbase;            /* its constants' first index in g */
  const char *prefix;   /* "" or "call/.../" */
  int depth;
} inl_level;

static fn_ref inl_ref(const inl_level *lv, const inl_map *map, fn_ref r) {
  if (r.kind == FN_REF_ARG) return lv->argmap ? lv->argmap[r.idx] : r;
  if (r.kind == FN_REF_CONST) return fn_const_ref(lv->cbase + r.idx);
  if (map[r.idx].idx >= 0) return fn_node_ref(map[r.idx].idx, r.out);
  return map[r.idx].outs[r.out];
}

static pd_code inl_append(fn_graph *g, fn_node *n, dev_status *st) {
  if (g->n_nodes == g->cap_nodes) {
    int cap = g->cap_nodes ? 2 * g->cap_nodes : 16;
    fn_node *nn = realloc(g->nodes, sizeof *nn * (size_t)cap);
    if (!nn) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    g->nodes = nn;
    g->cap_nodes = cap;
  }
  g->nodes[g->n_nodes++] = *n;
  memset(n, 0, sizeof *n); /* moved */
  return PD_OK;
}

static pd_code inl_nodes(fn_graph *g, const fn_inline_ctx *x, fn_node *src,
                         int n_src, const inl_level *lv, inl_map *map,
                         dev_status *st);

/* Emits the callee of call node `call` (its inputs mapped), filling the
 * call's map entry with where its outputs went. */
static pd_code inl_call(fn_graph *g, const fn_inline_ctx *x, fn_node *call,
                        const inl_level *lv, inl_map *m, dev_status *st) {
  if (lv->depth >= DEV_FN_MAX_CALL_DEPTH)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s%s': calls nest deeper than %d "
                     "levels",
                     g->fn_name, lv->prefix, call->name, DEV_FN_MAX_CALL_DEPTH);
  const fn_graph *callee =
      x->lookup ? x->lookup(x->lookup_arg, call->call) : NULL;
  if (!callee)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s%s': function '%s' is not in "
                     "the library",
                     g->fn_name, lv->prefix, call->name, call->call);
  if (callee->n_args != call->n_in)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s%s': function '%s' takes %d "
                     "inputs; got %d",
                     g->fn_name, lv->prefix, call->name, callee->fn_name,
                     callee->n_args, call->n_in);
  if (x->check) PD_TRY(x->check(x->arg, g, call, callee, st));
  size_t plen = strlen(lv->prefix) + strlen(call->name) + 2;
  char *prefix = malloc(plen);
  fn_graph *c = fn_graph_clone(callee);
  inl_map *cmap = calloc((size_t)(callee->n_nodes + 1), sizeof *cmap);
  m->outs = calloc((size_t)(callee->n_outputs + 1), sizeof *m->outs);
  pd_code rc = PD_OK;
  if (!prefix || !c || !cmap || !m->outs) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    goto out;
  }
  snprintf(prefix, plen, "%s%s/", lv->prefix, call->name);
  inl_level sub = {callee->fn_name, call->in, g->n_consts, prefix,
                   lv->depth + 1};
  for (int k = 0; rc == PD_OK && k < c->n_consts; k++)
    rc = fn_graph_add_const(g, c->consts[k].dtype, &c->consts[k].shape,
                            c->consts[k].data, c->consts[k].bytes, NULL, st);
  if (rc == PD_OK) rc = inl_nodes(g, x, c->nodes, c->n_nodes, &sub, cmap, st);
  for (int o = 0; rc == PD_OK && o < c->n_outputs; o++)
    m->outs[o] = inl_ref(&sub, cmap, c->outputs[o]);
out:
  for (int j = 0; cmap && j < callee->n_nodes; j++) free(cmap[j].outs);
  free(cmap);
  fn_graph_free(c); /* its nodes were moved out (zeroed) or are freed here */
  free(prefix);
  return rc;
}

/* Emits src[0..n_src) (owned; each moved into g or freed), filling map. */
static pd_code inl_nodes(fn_graph *g, const fn_inline_ctx *x, fn_node *src,
                         int n_src, const inl_level *lv, inl_map *map,
                         dev_status *st) {
  for (int j = 0; j < n_src; j++) {
    fn_node *n = &src[j];
    if (x->deadline > 0 && dev_monotonic_now() > x->deadline)
      return dev_error(st, PD_RESOURCE_EXHAUSTED,
                       "function '%s': instantiation took more than "
                       "instantiation_max_ms = %d ms while inlining calls "
                       "(%d nodes made, at node '%s%s'); raise [functions] "
                       "instantiation_max_ms or register a smaller function",
                       g->fn_name, x->budget_ms, g->n_nodes, lv->prefix,
                       n->name);
    for (int q = 0; q < n->n_in; q++) n->in[q] = inl_ref(lv, map, n->in[q]);
    if (n->kind == FN_NODE_CALL) {
      map[j].idx = -1;
      PD_TRY(inl_call(g, x, n, lv, &map[j], st));
      continue;
    }
    if (g->n_nodes >= DEV_FN_MAX_NODES)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s': inlining '%s' (node '%.*s') makes more "
                       "than %d nodes",
                       g->fn_name, lv->fn_name,
                       lv->prefix[0] ? (int)strlen(lv->prefix) - 1 : 0,
                       lv->prefix, DEV_FN_MAX_NODES);
    if (lv->prefix[0]) {
      size_t len = strlen(lv->prefix) + strlen(n->name) + 1;
      char *name = malloc(len);
      if (!name)
        return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
      snprintf(name, len, "%s%s", lv->prefix, n->name);
      free(n->name);
      n->name = name;
    }
    map[j].idx = g->n_nodes;
    PD_TRY(inl_append(g, n, st));
    if (x->emit) PD_TRY(x->emit(x->arg, g, g->n_nodes - 1, st));
  }
  return PD_OK;
}

pd_code fn_inline_all(fn_graph *g, const fn_inline_ctx *x, dev_status *st) {
  fn_node *src = g->nodes;
  const int n_src = g->n_nodes;
  inl_map *map = calloc((size_t)(n_src + 1), sizeof *map);
  fn_node *nn = calloc((size_t)(n_src + 16), sizeof *nn);
  if (!map || !nn) {
    free(map);
    free(nn);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  g->nodes = nn;
  g->n_nodes = 0;
  g->cap_nodes = n_src + 16;
  inl_level root = {g->fn_name, NULL, 0, "", 0};
  pd_code rc = inl_nodes(g, x, src, n_src, &root, map, st);
  for (int o = 0; rc == PD_OK && o < g->n_outputs; o++)
    g->outputs[o] = inl_ref(&root, map, g->outputs[o]);
  for (int j = 0; j < n_src; j++) {
    node_free_fields(&src[j]); /* those not moved */
    free(map[j].outs);
  }
  free(src);
  free(map);
  return rc;
}
