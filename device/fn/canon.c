/* The canonical text of a registration (fn_graph_canonical, fn_call.h):
 * the graph built from a definition (attributes resolved, defaults filled,
 * in the op's declared order; inputs as references, so "a" and "a:0" are
 * one input) with its nodes sorted by name, and the options as they take
 * effect, every string length-prefixed. Two registrations are identical
 * exactly when their texts are equal (dev_fn_register's no-op
 * re-registration), so re-registering what dev_fn_describe returns, or the
 * same definition written another way, is a no-op. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fn_call.h"

/* --- canonical text ------------------------------------------------------ */

typedef struct text {
  char *p;
  size_t len, cap;
  bool oom;
} text;

static void tput(text *t, const void *s, size_t n) {
  if (t->oom) return;
  if (t->len + n + 1 > t->cap) {
    size_t c = t->cap ? t->cap * 2 : 1024;
    while (c < t->len + n + 1) c *= 2;
    char *q = realloc(t->p, c);
    if (!q) {
      t->oom = true;
      return;
    }
    t->p = q;
    t->cap = c;
  }
  memcpy(t->p + t->len, s, n);
  t->len += n;
  t->p[t->len] = '\0';
}

/* A string with its length, so no two texts collide. */
static void tstr(text *t, const char *s) {
  char buf[24];
  size_t n = s ? strlen(s) : 0;
  snprintf(buf, sizeof buf, "%zu:", n);
  tput(t, buf, strlen(buf));
  tput(t, s ? s : "", n);
}

static void tval(text *t, const dev_attr_value *v) {
  char buf[64];
  snprintf(buf, sizeof buf, "t%d ", (int)v->type);
  tput(t, buf, strlen(buf));
  switch (v->type) {
    case DEV_ATTR_STRING:
      if (v->u.s.ptr) tput(t, v->u.s.ptr, v->u.s.len);
      break;
    case DEV_ATTR_INT_LIST:
      tput(t, &v->u.ilist.n, sizeof v->u.ilist.n);
      if (v->u.ilist.v) tput(t, v->u.ilist.v, (size_t)v->u.ilist.n * 8);
      break;
    case DEV_ATTR_FLOAT_LIST:
      tput(t, &v->u.flist.n, sizeof v->u.flist.n);
      if (v->u.flist.v) tput(t, v->u.flist.v, (size_t)v->u.flist.n * 8);
      break;
    case DEV_ATTR_SHAPE:
      tput(t, &v->u.shape.rank, sizeof v->u.shape.rank);
      tput(t, v->u.shape.dims, sizeof(int64_t) * (size_t)v->u.shape.rank);
      break;
    case DEV_ATTR_INT: tput(t, &v->u.i, sizeof v->u.i); break;
    case DEV_ATTR_FLOAT: tput(t, &v->u.f, sizeof v->u.f); break;
    case DEV_ATTR_BOOL: tput(t, v->u.b ? "1" : "0", 1); break;
    case DEV_ATTR_DTYPE: tput(t, &v->u.dtype, sizeof v->u.dtype); break;
    case DEV_ATTR_NONE: break;
  }
}

/* A reference by name: where it points does not depend on node order, and
 * "a" and "a:0" are one reference. */
static void tref(text *t, const fn_graph *g, fn_ref r) {
  char buf[24];
  switch (r.kind) {
    case FN_REF_ARG:
      tstr(t, "a");
      tstr(t, g->arg_names[r.idx]);
      return;
    case FN_REF_NODE:
      tstr(t, "n");
      tstr(t, g->nodes[r.idx].name);
      snprintf(buf, sizeof buf, "%d", r.out);
      tstr(t, buf);
      return;
    case FN_REF_CONST:
      snprintf(buf, sizeof buf, "c%d", r.idx);
      tstr(t, buf);
      return;
  }
}

static int by_name(const void *a, const void *b) {
  const fn_node *x = *(const fn_node *const *)a;
  const fn_node *y = *(const fn_node *const *)b;
  return strcmp(x->name, y->name);
}

static void tnode(text *t, const fn_graph *g, const fn_node *n) {
  tstr(t, "N");
  tstr(t, n->name);
  tstr(t, n->kind == FN_NODE_OP     ? n->def->name
          : n->kind == FN_NODE_CALL ? n->call
                                    : DEV_FN_GRADIENTS_OP);
  for (int j = 0; j < n->n_in; j++) tref(t, g, n->in[j]);
  tstr(t, "A");
  if (n->kind == FN_NODE_OP) {
    /* Resolved: the op's declared order, defaults filled. */
    for (int j = 0; j < n->def->num_attrs; j++) {
      tstr(t, n->def->attrs[j].name);
      tval(t, &n->attrs[j]);
    }
  } else if (n->kind == FN_NODE_GRADIENTS) {
    bool gy = false; /* absent has_grad_y is false */
    for (int j = 0; j < n->n_attrs; j++)
      if (n->attr_names[j] && strcmp(n->attr_names[j], "has_grad_y") == 0)
        gy = n->attrs[j].type == DEV_ATTR_BOOL && n->attrs[j].u.b;
    tstr(t, gy ? "has_grad_y=1" : "has_grad_y=0");
  }
  tstr(t, "O");
  for (int k = 0; k < n->n_origins; k++) tstr(t, n->origins[k]);
}

char *fn_graph_canonical(const fn_graph *g, const dev_fn_options *o,
                         const dev_fn_config *c, size_t *len) {
  text t = {0};
  tstr(&t, g->fn_name);
  for (int a = 0; a < g->n_args; a++) {
    tstr(&t, g->arg_names[a]);
    tput(&t, &g->arg_dtype[a], sizeof g->arg_dtype[a]);
  }
  const fn_node **ord = malloc(sizeof *ord * (size_t)(g->n_nodes + 1));
  if (!ord) {
    free(t.p);
    return NULL;
  }
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (!g->nodes[i].dead) ord[n++] = &g->nodes[i];
  qsort(ord, (size_t)n, sizeof *ord, by_name);
  for (int i = 0; i < n; i++) tnode(&t, g, ord[i]);
  free(ord);
  tstr(&t, "R");
  for (int k = 0; k < g->n_outputs; k++) {
    tstr(&t, g->out_names[k]);
    tref(&t, g, g->outputs[k]);
  }
  /* Options as they take effect: DEFAULT and the setting it stands for are
   * one registration, as are max_instantiations 0 and the cap it means. */
  for (int p = 0; p < DEV_PASS_COUNT; p++) {
    char v = fn_pass_in_force(o, c, (dev_fn_pass)p) == DEV_TRI_ON ? '1' : '0';
    tput(&t, &v, 1);
  }
  int cap = o->max_instantiations   ? o->max_instantiations
            : c->max_instantiations ? c->max_instantiations
                                    : DEV_FN_DEFAULT_INST_CAP;
  tput(&t, &cap, sizeof cap);
  if (t.oom) {
    free(t.p);
    return NULL;
  }
  *len = t.len;
  return t.p;
}
