/* Private header of the gradient tape (device/tape.c, gradient.c, vjp.c,
 * pmap.c): the recorded ops, the tape's state, the pointer map that tells
 * tracked tensors, and the context of one vector-Jacobian product.
 *
 * Files: tape.c records (create, watch, record, destroy), gradient.c walks
 * the records backwards (dev_tape_gradient), vjp.c holds one VJP per op
 * and the table, vjp_more.c the VJPs added for issue #11 (Abs, Max/Min,
 * the collectives, the gradient ops' own), vjp_lists.c those of Split,
 * SplitV, Unpack and Pack, pmap.c the pointer map. tape.c calls pmap.c;
 * vjp.c, vjp_more.c and vjp_lists.c call tape.c (dev__tape_exec); vjp.c's
 * table names the other two's VJPs; gradient.c calls pmap.c, tape.c, vjp.c. */
#ifndef PARADEV_TAPE_INT_H
#define PARADEV_TAPE_INT_H

#include "device_int.h"

/* --- pointer map (pmap.c) ------------------------------------------------ */

typedef struct pmap {
  const void **keys; /* NULL: empty slot */
  void **vals;
  size_t cap; /* 0 or a power of two */
  size_t n;
} pmap;

/* Looks k up; true (and *val, if val is not NULL) when present. */
bool dev__pmap_get(const pmap *m, const void *k, void **val);
/* Makes room for `extra` more keys; false when out of memory (unchanged). */
bool dev__pmap_reserve(pmap *m, size_t extra);
/* Sets k's value, inserting k; room must have been reserved. */
void dev__pmap_put(pmap *m, const void *k, void *v);
/* Frees the map's storage (not the values) and empties it. */
void dev__pmap_free(pmap *m);

/* --- the tape (tape.c) --------------------------------------------------- */

/* One recorded op. Inputs and outputs are references the record owns. */
typedef struct tape_rec {
  const dev_op_def *def;
  int n_in, n_out;
  uint64_t tracked; /* bit i: input i was tracked when the op was recorded */
  dev_tensor **out; /* [n_out], behind in[] (sized by the real count) */
  dev_attr_value *attrs; /* [def->num_attrs]; lists and strings copied behind */
  dev_tensor *in[];      /* [n_in], then out's n_out */
} tape_rec;

struct dev_tape {
  dev_engine *engine;
  dev_execute_fn exec; /* how gradient ops run: dev_execute unless set */
  void *exec_arg;
  bool persistent;
  bool used; /* a one-shot tape after its gradient */
  /* tracked tensor -> index of the record that produced it + 1 (0: watched) */
  pmap tracked;
  dev_tensor **watched; /* references */
  size_t n_watched, cap_watched;
  tape_rec **recs;
  size_t n_recs, cap_recs;
  /* While dev_tape_gradient runs a record's VJP: its index + 1 (0: none),
   * so an executor can tell which recorded op a gradient op is for
   * (device/fn/gradients.c gives backward nodes their forward origins). */
  size_t cur_rec;
};

/* Runs one gradient op through the tape's executor (dev_execute unless
 * dev_tape_set_executor chose another). */
pd_code dev__tape_exec(const dev_tape *tp, const char *op,
                       dev_tensor *const *in, int n, const dev_attr *attrs,
                       int n_attrs, dev_tensor **outs, int *n_out,
                       dev_status *st);

/* Drops every record and watched tensor (a one-shot tape after its use). */
void dev__tape_clear(dev_tape *tp);

static inline bool dev__is_float(const dev_tensor *t) {
  return dev_dtype_is_floating(t->dtype);
}

/* True when a and b have equal shapes on every component. */
static inline bool dev__same_shapes(const dev_tensor *a, const dev_tensor *b) {
  for (int d = 0; d < a->n; d++)
    if (!dev_shape_equal(&a->comps[d].shape, &b->comps[d].shape)) return false;
  return true;
}

/* --- vector-Jacobian products (vjp.c) ------------------------------------ */

#define VJP_TEMPS 160

/* One VJP call. A VJP reads dy (the gradients that reached the op's outputs;
 * NULL where none did) and writes dx[j] for the inputs with need[j]. Ops run
 * through run(), whose outputs are temporaries released after the call;
 * set_dx() keeps a reference to a result. Errors are sticky: after the first
 * failure run() returns NULL and does nothing, so VJPs are straight-line
 * code and the caller checks rc once. */
typedef struct vjp_ctx {
  dev_engine *e;
  const dev_tape *tp;
  const tape_rec *r;
  dev_tensor *dy[DEV_MAX_OUTPUTS];
  bool need[DEV_MAX_INPUTS];
  dev_tensor *dx[DEV_MAX_INPUTS];
  dev_tensor *temps[VJP_TEMPS];
  int n_temps;
  dev_status *st;
  pd_code rc;
} vjp_ctx;

typedef void (*vjp_fn)(vjp_ctx *c);

/* The VJPs of vjp_more.c (the table is vjp.c's; vjp_more.c calls tape.c
 * only, so the files do not call each other in a circle). */
void dev__vjp_abs(vjp_ctx *c);
void dev__vjp_max(vjp_ctx *c);
void dev__vjp_min(vjp_ctx *c);
void dev__vjp_broadcast(vjp_ctx *c);
void dev__vjp_all_gather(vjp_ctx *c);
void dev__vjp_reduce_scatter(vjp_ctx *c);
void dev__vjp_relu_grad(vjp_ctx *c);
void dev__vjp_tanh_grad(vjp_ctx *c);
void dev__vjp_sigmoid_grad(vjp_ctx *c);
void dev__vjp_sqrt_grad(vjp_ctx *c);
void dev__vjp_rsqrt_grad(vjp_ctx *c);
void dev__vjp_sum_to_like(vjp_ctx *c);
void dev__vjp_broadcast_to_like(vjp_ctx *c);
void dev__vjp_reshape_like(vjp_ctx *c);
/* The VJPs of Split and SplitV, Unpack, Pack (vjp_lists.c). */
void dev__vjp_split(vjp_ctx *c);
void dev__vjp_unpack(vjp_ctx *c);
void dev__vjp_pack(vjp_ctx *c);
/* The placement ops' VJPs (vjp_lists.c, issue #17). */
void dev__vjp_parallel_pack(vjp_ctx *c);
void dev__vjp_parallel_unpack(vjp_ctx *c);
void dev__vjp_copy_to_devices(vjp_ctx *c);

/* The helpers of VJPs (vjp_util.c). dev__vjp_run runs `op` through the
 * tape's executor and returns its output 0, a temporary released after the
 * VJP (NULL, doing nothing, once c->rc holds an error: errors are sticky);
 * run1/run2 for one or two inputs; set_dx keeps a reference to t as input
 * j's gradient; scalar is a mirrored scalar of dt; attr is the recorded
 * op's attribute `name` (INTERNAL when it has none); attr_is compares a
 * string attribute. */
dev_tensor *dev__vjp_run(vjp_ctx *c, const char *op, dev_tensor *const *in,
                         int n, const dev_attr *attrs, int n_attrs);
dev_tensor *dev__vjp_run1(vjp_ctx *c, const char *op, dev_tensor *a,
                          const dev_attr *attrs, int n_attrs);
dev_tensor *dev__vjp_run2(vjp_ctx *c, const char *op, dev_tensor *a,
                          dev_tensor *b, const dev_attr *attrs, int n_attrs);
void dev__vjp_set_dx(vjp_ctx *c, int j, dev_tensor *t);
dev_tensor *dev__vjp_scalar(vjp_ctx *c, double v, pd_dtype dt);
const dev_attr_value *dev__vjp_attr(vjp_ctx *c, const char *name);
bool dev__vjp_attr_is(const dev_attr_value *v, const char *s);

/* The VJP of `def`, or NULL when the op has no gradient. */
vjp_fn dev__vjp_for(const dev_op_def *def);

#endif /* PARADEV_TAPE_INT_H */
