/* The VJPs of the ops with a list of outputs or inputs along one axis
 * (device/ops/split_pack.c), following TensorFlow's array_grad.py: Split
 * and SplitV join their outputs' gradients back with Concat (ZerosLike of
 * a forward output that got none), Unpack stacks them back with Pack, and
 * Pack unstacks its one with Unpack. vjp.c's table names these functions;
 * like vjp.c's they are straight-line code with sticky errors (vjp_ctx). */
#include <stdio.h>

#include "tape_int.h"

/* Runs `op` through the tape's executor; its outputs become temporaries of
 * the VJP (released after it) and land in outs[0..*n_out). False once an
 * error is set (then nothing runs). */
static bool run_all(vjp_ctx *c, const char *op, dev_tensor *const *in, int n,
                    const dev_attr *attrs, int n_attrs, dev_tensor **outs,
                    int *n_out) {
  if (c->rc != PD_OK) return false;
  dev_tensor *tmp[DEV_MAX_OUTPUTS] = {0};
  int cnt = DEV_MAX_OUTPUTS;
  dev_status s = DEV_STATUS_INIT;
  if (dev__tape_exec(c->tp, op, in, n, attrs, n_attrs, tmp, &cnt, &s) !=
      PD_OK) {
    c->rc =
        dev_error(c->st, s.code, "gradient of %s: %s", c->r->def->name, s.msg);
    return false;
  }
  for (int i = 0; i < cnt; i++) {
    if (c->n_temps == VJP_TEMPS) {
      for (int k = i; k < cnt; k++) dev_tensor_release(tmp[k]);
      c->rc = dev_error(c->st, PD_INTERNAL,
                        "gradient of %s: more than %d temporaries",
                        c->r->def->name, VJP_TEMPS);
      return false;
    }
    c->temps[c->n_temps++] = tmp[i];
    if (i < *n_out) outs[i] = tmp[i];
  }
  *n_out = cnt < *n_out ? cnt : *n_out;
  return true;
}

static void keep_dx(vjp_ctx *c, int j, dev_tensor *t) {
  if (c->rc != PD_OK || !t) return;
  dev_tensor_retain(t);
  c->dx[j] = t;
}

static int64_t attr_int(vjp_ctx *c, const char *name) {
  int i = dev_op_attr_index(c->r->def, name);
  if (i >= 0) return c->r->attrs[i].u.i;
  if (c->rc == PD_OK)
    c->rc = dev_error(c->st, PD_INTERNAL, "gradient of %s: no attribute '%s'",
                      c->r->def->name, name);
  return 0;
}

/* The gradient of every output: dy[o], or ZerosLike of the forward output
 * where none reached it (TF's array_grad fills those with zeros too). */
static bool output_grads(vjp_ctx *c, dev_tensor **g) {
  for (int o = 0; o < c->r->n_out && c->rc == PD_OK; o++) {
    g[o] = c->dy[o];
    if (g[o]) continue;
    int one = 1;
    run_all(c, "ZerosLike", &c->r->out[o], 1, NULL, 0, &g[o], &one);
  }
  return c->rc == PD_OK;
}

/* Split, SplitV: dx = Concat(dy[0..n), axis). */
void dev__vjp_split(vjp_ctx *c) {
  if (!c->need[0]) return;
  dev_tensor *g[DEV_MAX_OUTPUTS];
  if (!output_grads(c, g)) return;
  dev_attr a = dev_attr_int("axis", attr_int(c, "axis"));
  dev_tensor *dx = NULL;
  int one = 1;
  if (run_all(c, "Concat", g, c->r->n_out, &a, 1, &dx, &one)) keep_dx(c, 0, dx);
}

/* Unpack: dx = Pack(dy[0..num), axis). */
void dev__vjp_unpack(vjp_ctx *c) {
  if (!c->need[0]) return;
  dev_tensor *g[DEV_MAX_OUTPUTS];
  if (!output_grads(c, g)) return;
  dev_attr a = dev_attr_int("axis", attr_int(c, "axis"));
  dev_tensor *dx = NULL;
  int one = 1;
  if (run_all(c, "Pack", g, c->r->n_out, &a, 1, &dx, &one)) keep_dx(c, 0, dx);
}

/* Pack: dx[0..N) = Unpack(dy, num = N, axis). */
void dev__vjp_pack(vjp_ctx *c) {
  if (!c->dy[0]) return;
  int n = c->r->n_in;
  bool any = false;
  for (int j = 0; j < n; j++) any |= c->need[j];
  if (!any) return;
  dev_attr a[2] = {dev_attr_int("num", n),
                   dev_attr_int("axis", attr_int(c, "axis"))};
  dev_tensor *dx[DEV_MAX_INPUTS] = {0};
  int cnt = n;
  if (!run_all(c, "Unpack", &c->dy[0], 1, a, 2, dx, &cnt)) return;
  for (int j = 0; j < cnt; j++)
    if (c->need[j]) keep_dx(c, j, dx[j]);
}

/* --- the placement ops (issue #17) ----------------------------------------
 * ParallelPack and ParallelUnpack are each other's VJP; CopyToDevices copies
 * its gradient back to the input's set, summing over the destinations
 * where one source component fed several. */

/* ParallelPack: dx[0..N) = ParallelUnpack(dy). */
void dev__vjp_parallel_pack(vjp_ctx *c) {
  if (!c->dy[0]) return;
  const int n = c->r->n_in;
  dev_tensor *dx[DEV_MAX_INPUTS] = {0};
  int cnt = n;
  if (!run_all(c, "ParallelUnpack", &c->dy[0], 1, NULL, 0, dx, &cnt)) return;
  for (int j = 0; j < cnt; j++)
    if (c->need[j]) keep_dx(c, j, dx[j]);
}

/* ParallelUnpack: dx = ParallelPack(dy[0..N)), ZerosLike where none. */
void dev__vjp_parallel_unpack(vjp_ctx *c) {
  if (!c->need[0]) return;
  dev_tensor *g[DEV_MAX_OUTPUTS];
  if (!output_grads(c, g)) return;
  dev_tensor *dx = NULL;
  int one = 1;
  if (run_all(c, "ParallelPack", g, c->r->n_out, NULL, 0, &dx, &one))
    keep_dx(c, 0, dx);
}

/* CopyToDevices onto `set` (a temporary, NULL after an error). */
static dev_tensor *copy_to(vjp_ctx *c, dev_tensor *t, const dev_devset *set) {
  int64_t devs[PD_MAX_DEVICES];
  for (int i = 0; i < set->n; i++) devs[i] = set->dev[i];
  dev_attr a = dev_attr_int_list("devices", devs, set->n);
  dev_tensor *out = NULL;
  int one = 1;
  return run_all(c, "CopyToDevices", &t, 1, &a, 1, &out, &one) ? out : NULL;
}

/* CopyToDevices: the same count copies back; an input on one device (or a
 * mirrored one, whose component 0 fed every destination) gets the sum of
 * every destination's gradient on its component 0, and zeros elsewhere. */
void dev__vjp_copy_to_devices(vjp_ctx *c) {
  if (!c->need[0] || !c->dy[0]) return;
  dev_tensor *x = c->r->in[0], *dy = c->dy[0];
  if (x->n == dy->n) {
    keep_dx(c, 0, copy_to(c, dy, &x->set));
    return;
  }
  dev_tensor *parts[DEV_MAX_OUTPUTS] = {0};
  int cnt = dy->n;
  if (!run_all(c, "ParallelUnpack", &dy, 1, NULL, 0, parts, &cnt)) return;
  dev_devset first = {.n = 1};
  first.dev[0] = x->set.dev[0];
  dev_tensor *sum = copy_to(c, parts[0], &first);
  for (int j = 1; j < cnt && sum; j++) {
    dev_tensor *in[2] = {sum, copy_to(c, parts[j], &first)};
    int one = 1;
    if (!in[1] || !run_all(c, "Add", in, 2, NULL, 0, &sum, &one)) return;
  }
  if (!sum || x->n == 1) {
    keep_dx(c, 0, sum);
    return;
  }
  dev_tensor *xs[DEV_MAX_OUTPUTS] = {0}, *g[DEV_MAX_INPUTS] = {0};
  int nx = x->n;
  if (!run_all(c, "ParallelUnpack", &x, 1, NULL, 0, xs, &nx)) return;
  g[0] = sum;
  for (int i = 1; i < nx; i++) {
    int one = 1;
    if (!run_all(c, "ZerosLike", &xs[i], 1, NULL, 0, &g[i], &one)) return;
  }
  dev_tensor *dx = NULL;
  int one = 1;
  if (run_all(c, "ParallelPack", g, nx, NULL, 0, &dx, &one)) keep_dx(c, 0, dx);
}
