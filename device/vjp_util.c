/* The straight-line helpers every VJP file uses (vjp.c, vjp_more.c; see
 * tape_int.h): run an op through the tape's executor with sticky errors,
 * keep a result as an input's gradient, a scalar, an attribute of the
 * recorded op. Split out so the VJP files share one copy without calling
 * each other. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tape_int.h"

dev_tensor *dev__vjp_run(vjp_ctx *c, const char *op, dev_tensor *const *in,
                         int n, const dev_attr *attrs, int n_attrs) {
  if (c->rc != PD_OK) return NULL;
  for (int i = 0; i < n; i++)
    if (!in[i]) {
      c->rc = dev_error(c->st, PD_INTERNAL,
                        "gradient of %s: %s is missing input %d",
                        c->r->def->name, op, i);
      return NULL;
    }
  if (c->n_temps == VJP_TEMPS) {
    c->rc = dev_error(c->st, PD_INTERNAL, "gradient of %s: more than %d ops",
                      c->r->def->name, VJP_TEMPS);
    return NULL;
  }
  dev_tensor *outs[DEV_MAX_OUTPUTS] = {0};
  int n_out = DEV_MAX_OUTPUTS;
  dev_status s = DEV_STATUS_INIT;
  if (dev__tape_exec(c->tp, op, in, n, attrs, n_attrs, outs, &n_out, &s) !=
      PD_OK) {
    c->rc =
        dev_error(c->st, s.code, "gradient of %s: %s", c->r->def->name, s.msg);
    return NULL;
  }
  for (int i = 1; i < n_out; i++) dev_tensor_release(outs[i]);
  c->temps[c->n_temps++] = outs[0];
  return outs[0];
}

dev_tensor *dev__vjp_run1(vjp_ctx *c, const char *op, dev_tensor *a,
                          const dev_attr *attrs, int n_attrs) {
  return dev__vjp_run(c, op, &a, 1, attrs, n_attrs);
}

dev_tensor *dev__vjp_run2(vjp_ctx *c, const char *op, dev_tensor *a,
                          dev_tensor *b, const dev_attr *attrs, int n_attrs) {
  dev_tensor *in[2] = {a, b};
  return dev__vjp_run(c, op, in, 2, attrs, n_attrs);
}

void dev__vjp_set_dx(vjp_ctx *c, int j, dev_tensor *t) {
  if (c->rc != PD_OK || !t) return;
  dev_tensor_retain(t);
  c->dx[j] = t;
}

/* A scalar of dtype dt, mirrored. */
dev_tensor *dev__vjp_scalar(vjp_ctx *c, double v, pd_dtype dt) {
  dev_attr a[3] = {dev_attr_shape("shape", 0, NULL), dev_attr_float("value", v),
                   dev_attr_dtype("dtype", dt)};
  return dev__vjp_run(c, "Fill", NULL, 0, a, 3);
}

const dev_attr_value *dev__vjp_attr(vjp_ctx *c, const char *name) {
  static const dev_attr_value none = {.type = DEV_ATTR_NONE};
  int i = dev_op_attr_index(c->r->def, name);
  if (i >= 0) return &c->r->attrs[i];
  if (c->rc == PD_OK)
    c->rc = dev_error(c->st, PD_INTERNAL, "gradient of %s: no attribute '%s'",
                      c->r->def->name, name);
  return &none;
}

bool dev__vjp_attr_is(const dev_attr_value *v, const char *s) {
  size_t n = strlen(s);
  return v->type == DEV_ATTR_STRING && v->u.s.len == n &&
         memcmp(v->u.s.ptr, s, n) == 0;
}
