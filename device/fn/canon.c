/* The canonical text of a registration (fn_def_canonical, fn_call.h): a
 * definition and its options written with every string length-prefixed,
 * so two registrations are identical exactly when their texts are equal
 * (dev_fn_register's no-op re-registration). */
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

char *fn_def_canonical(const dev_fn_def *d, const dev_fn_options *o,
                       size_t *len) {
  text t = {0};
  tstr(&t, d->name);
  for (int a = 0; a < d->num_args; a++) {
    tstr(&t, d->args[a].name);
    tput(&t, &d->args[a].dtype, sizeof d->args[a].dtype);
  }
  for (int i = 0; i < d->num_nodes; i++) {
    const dev_fn_node *n = &d->nodes[i];
    tstr(&t, "N");
    tstr(&t, n->name);
    tstr(&t, n->op);
    for (int j = 0; j < n->num_inputs; j++) tstr(&t, n->inputs[j]);
    tstr(&t, "A");
    for (int j = 0; j < n->num_attrs; j++) {
      tstr(&t, n->attrs[j].name);
      tval(&t, &n->attrs[j].value);
    }
  }
  for (int k = 0; k < d->num_outputs; k++) {
    tstr(&t, d->outputs[k].name);
    tstr(&t, d->outputs[k].source);
  }
  tput(&t, o->passes, sizeof o->passes);
  tput(&t, &o->max_instantiations, sizeof o->max_instantiations);
  if (t.oom) {
    free(t.p);
    return NULL;
  }
  *len = t.len;
  return t.p;
}
