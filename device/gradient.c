/* The tape's backward walk (dev_tape_gradient): finds the recorded ops on a
 * path from the sources to the target, then visits them in reverse recording
 * order with their VJPs (vjp.c), summing the gradients that reach each
 * tensor. Recording order is execution order, so every consumer of a tensor
 * comes after its producer, and by the time an op is visited every gradient
 * that reaches its outputs has been summed. Only inputs that were tracked
 * when the op was recorded and from which a source can be reached get a
 * gradient (TensorFlow's skip_input_indices). Source: GradientTape.gradient
 * and imperative_grad (TensorFlow eager). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tape_int.h"

/* Adds g (consumed) to the gradient of `key` in `grads`. */
static pd_code accumulate(const dev_tape *tp, pmap *grads, dev_tensor *key,
                          dev_tensor *g, const char *op_name, dev_status *st) {
  void *old;
  if (!dev__pmap_get(grads, key, &old)) {
    if (!dev__pmap_reserve(grads, 1)) {
      dev_tensor_release(g);
      return dev_error(st, PD_RESOURCE_EXHAUSTED,
                       "host out of memory computing a gradient");
    }
    dev__pmap_put(grads, key, g);
    return PD_OK;
  }
  dev_tensor *in[2] = {old, g}, *sum = NULL;
  int n_out = 1;
  dev_status s = DEV_STATUS_INIT;
  pd_code rc = dev__tape_exec(tp, "Add", in, 2, NULL, 0, &sum, &n_out, &s);
  dev_tensor_release(g);
  if (rc != PD_OK)
    return dev_error(st, rc, "gradient of %s: summing gradients: %s", op_name,
                     s.msg);
  dev_tensor_release(old);
  dev__pmap_put(grads, key, sum);
  return PD_OK;
}

static void release_map_values(pmap *m) {
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) dev_tensor_release(m->vals[i]);
}

/* Checks one tensor argument of dev_tape_gradient. */
static pd_code check_arg(const dev_tape *tp, const dev_tensor *t,
                         const char *what, int i, dev_status *st) {
  char name[32];
  if (i >= 0)
    snprintf(name, sizeof name, "%s %d", what, i);
  else
    snprintf(name, sizeof name, "%s", what);
  if (!t)
    return dev_error(st, PD_INVALID_ARGUMENT, "dev_tape_gradient: %s is NULL",
                     name);
  if (t->engine != tp->engine)
    return dev_error(
        st, PD_FAILED_PRECONDITION,
        "dev_tape_gradient: %s belongs to another engine than the tape", name);
  return PD_OK;
}

/* Checks the arguments of dev_tape_gradient (see device.h for each error). */
static pd_code check_args(const dev_tape *tp, dev_tensor *target,
                          dev_tensor *const *sources, int n_sources,
                          const dev_tensor *og, dev_tensor **out_grads,
                          dev_status *st) {
  if (!tp)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_tape_gradient: the tape is NULL");
  if (tp->used)
    return dev_error(
        st, PD_FAILED_PRECONDITION,
        "this one-shot gradient tape has already computed its gradient; use a "
        "persistent tape to compute gradients more than once");
  PD_TRY(check_arg(tp, target, "the target", -1, st));
  if (n_sources < 0 || (n_sources > 0 && (!sources || !out_grads)))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "dev_tape_gradient: %d sources%s; expected 0 or more sources and room "
        "for "
        "their gradients",
        n_sources,
        n_sources > 0 ? " but no source array or no output array" : "");
  for (int i = 0; i < n_sources; i++)
    PD_TRY(check_arg(tp, sources[i], "source", i, st));
  if (!dev_dtype_is_floating(target->dtype))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "dev_tape_gradient: the target has dtype %s; expected a floating dtype "
        "(integer and bool values carry no gradient)",
        pd_dtype_name(target->dtype));
  if (!og) return PD_OK;
  PD_TRY(check_arg(tp, og, "the output gradient", -1, st));
  /* Before the shapes (a set of another size has other component shapes):
   * the seed must be on the target's set, or the first VJP would refuse it
   * naming an op the caller never ran (issue #17). */
  if (!dev_devset_equal(&og->set, &target->set)) {
    char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_tape_gradient: output_gradient is on devices %s but "
                     "the target on %s; expected the target's devices: move "
                     "it with CopyToDevices",
                     dev_devset_str(&og->set, a, sizeof a),
                     dev_devset_str(&target->set, b, sizeof b));
  }
  if (og->dtype != target->dtype || !dev__same_shapes(og, target)) {
    char a[160], b[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_tape_gradient: the output gradient has dtype %s and "
                     "shape %s but the "
                     "target has dtype %s and shape %s; expected the target's "
                     "dtype and shape "
                     "on every component",
                     pd_dtype_name(og->dtype),
                     dev_shape_str(&og->shape, a, sizeof a),
                     pd_dtype_name(target->dtype),
                     dev_shape_str(&target->shape, b, sizeof b));
  }
  return PD_OK;
}

/* Marks in `reach` the tensors from which a tracked source can be reached,
 * forwards over records [0, end). False on host out of memory. */
static bool mark_reach(const dev_tape *tp, dev_tensor *const *sources,
                       int n_sources, size_t end, pmap *reach) {
  if (!dev__pmap_reserve(reach, (size_t)n_sources)) return false;
  for (int i = 0; i < n_sources; i++)
    if (dev__pmap_get(&tp->tracked, sources[i], NULL))
      dev__pmap_put(reach, sources[i], NULL);
  for (size_t r = 0; r < end && reach->n > 0; r++) {
    const tape_rec *rec = tp->recs[r];
    bool hit = false;
    for (int j = 0; j < rec->n_in && !hit; j++)
      hit = ((rec->tracked >> j) & 1) && dev__pmap_get(reach, rec->in[j], NULL);
    if (!hit) continue;
    if (!dev__pmap_reserve(reach, (size_t)rec->n_out)) return false;
    for (int o = 0; o < rec->n_out; o++)
      if (dev__is_float(rec->out[o])) dev__pmap_put(reach, rec->out[o], NULL);
  }
  return true;
}

/* Puts the upstream gradient of the target into `grads`: a new reference to
 * og, or ones like the target. */
static pd_code seed(const dev_tape *tp, dev_tensor *target, dev_tensor *og,
                    pmap *grads, dev_status *st) {
  dev_tensor *dy = og;
  if (dy) {
    dev_tensor_retain(dy);
  } else {
    int n_out = 1;
    dev_status s = DEV_STATUS_INIT;
    pd_code rc =
        dev__tape_exec(tp, "OnesLike", &target, 1, NULL, 0, &dy, &n_out, &s);
    if (rc != PD_OK)
      return dev_error(st, rc, "gradient: ones like the target: %s", s.msg);
  }
  if (!dev__pmap_reserve(grads, 1)) {
    dev_tensor_release(dy);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "host out of memory computing a gradient");
  }
  dev__pmap_put(grads, target, dy);
  return PD_OK;
}

/* Adds the gradient c->dx[j] of input j of rec (consumed) to `grads`, after
 * checking its dtype and shapes. */
static pd_code add_dx(const dev_tape *tp, const tape_rec *rec, int j,
                      dev_tensor *g, pmap *grads, dev_status *st) {
  if (g->dtype != rec->in[j]->dtype || !dev__same_shapes(g, rec->in[j])) {
    char a[160], b[160];
    pd_code rc = dev_error(
        st, PD_INTERNAL,
        "gradient of %s: input %d's gradient has dtype %s and shape %s; "
        "expected %s and %s",
        rec->def->name, j, pd_dtype_name(g->dtype),
        dev_shape_str(&g->shape, a, sizeof a), pd_dtype_name(rec->in[j]->dtype),
        dev_shape_str(&rec->in[j]->shape, b, sizeof b));
    dev_tensor_release(g);
    return rc;
  }
  return accumulate(tp, grads, rec->in[j], g, rec->def->name, st);
}

/* Runs the VJP of one record when a gradient reached one of its outputs and
 * one of its inputs needs one, and sums the inputs' gradients into `grads`. */
static pd_code backward_one(const dev_tape *tp, const tape_rec *rec,
                            const pmap *reach, pmap *grads, dev_status *st) {
  vjp_ctx c;
  memset(&c, 0, offsetof(vjp_ctx, temps)); /* dy, need, dx; temps are counted */
  c.n_temps = 0;
  bool any_dy = false, any_need = false;
  for (int o = 0; o < rec->n_out; o++) {
    void *g = NULL;
    c.dy[o] = dev__pmap_get(grads, rec->out[o], &g) ? g : NULL;
    any_dy |= c.dy[o] != NULL;
  }
  if (!any_dy) return PD_OK;
  for (int j = 0; j < rec->n_in; j++) {
    c.need[j] = ((rec->tracked >> j) & 1) && dev__is_float(rec->in[j]) &&
                dev__pmap_get(reach, rec->in[j], NULL);
    any_need |= c.need[j];
  }
  if (!any_need) return PD_OK;
  vjp_fn fn = dev__vjp_for(rec->def);
  if (!fn && (rec->def->flags & DEV_OP_FUNCTION))
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "op %s is a call of a graph function, and the target depends on a "
        "source through it: function calls are not differentiable on a "
        "tape; put a Gradients node inside the function and return the "
        "gradients as its outputs",
        rec->def->name);
  if (!fn)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "op %s has no gradient, but the target depends on a source through it; "
        "expected only ops with a gradient between the target and the sources",
        rec->def->name);
  c.e = tp->engine;
  c.tp = tp;
  c.r = rec;
  c.st = st;
  c.rc = PD_OK;
  fn(&c);
  for (int k = 0; k < c.n_temps; k++) dev_tensor_release(c.temps[k]);
  pd_code rc = c.rc;
  for (int j = 0; j < rec->n_in; j++) {
    dev_tensor *g = c.dx[j];
    if (!g) continue;
    if (rc != PD_OK || !c.need[j]) {
      dev_tensor_release(g);
      continue;
    }
    rc = add_dx(tp, rec, j, g, grads, st);
  }
  return rc;
}

/* One gradient per source into results[0..n_sources) (new references);
 * zeros where none arrived. On failure the caller releases what was set. */
static pd_code collect(const dev_tape *tp, dev_tensor *const *sources,
                       int n_sources, const pmap *grads, dev_tensor **results,
                       dev_status *st) {
  for (int i = 0; i < n_sources; i++) {
    void *g;
    if (dev__pmap_get(grads, sources[i], &g)) {
      dev_tensor_retain(g);
      results[i] = g;
      continue;
    }
    int n_out = 1;
    dev_status s = DEV_STATUS_INIT;
    pd_code rc = dev__tape_exec(tp, "ZerosLike", &sources[i], 1, NULL, 0,
                                &results[i], &n_out, &s);
    if (rc != PD_OK)
      return dev_error(st, rc, "gradient: zeros like source %d: %s", i, s.msg);
  }
  return PD_OK;
}

pd_code dev_tape_gradient(dev_tape *tp, dev_tensor *target,
                          dev_tensor *const *sources, int n_sources,
                          dev_tensor *const *output_gradients,
                          dev_tensor **out_grads, dev_status *st) {
  dev_tensor *og = output_gradients ? output_gradients[0] : NULL;
  PD_TRY(check_args(tp, target, sources, n_sources, og, out_grads, st));

  pmap reach = {0}, grads = {0};
  dev_tensor **results = NULL;
  pd_code rc = PD_OK;

  /* Records after the target's producer cannot lead to it. */
  size_t end = 0;
  void *v = NULL;
  if (dev__pmap_get(&tp->tracked, target, &v)) end = (size_t)(uintptr_t)v;

  bool target_is_source = false;
  for (int i = 0; i < n_sources; i++) target_is_source |= sources[i] == target;

  if (!mark_reach(tp, sources, n_sources, end, &reach)) goto oom;
  if ((end > 0 && reach.n > 0) || target_is_source)
    PD_TRY_GOTO(seed(tp, target, og, &grads, st), rc, fail);
  for (size_t r = reach.n > 0 ? end : 0; r-- > 0;) {
    tp->cur_rec = r + 1;
    rc = backward_one(tp, tp->recs[r], &reach, &grads, st);
    tp->cur_rec = 0;
    if (rc != PD_OK) goto fail;
  }

  if (n_sources > 0) {
    results = calloc((size_t)n_sources, sizeof *results);
    if (!results) goto oom;
  }
  PD_TRY_GOTO(collect(tp, sources, n_sources, &grads, results, st), rc, fail);
  for (int i = 0; i < n_sources; i++) out_grads[i] = results[i];
  free(results);
  release_map_values(&grads);
  dev__pmap_free(&grads);
  dev__pmap_free(&reach);
  if (!tp->persistent) {
    dev__tape_clear(tp);
    tp->used = true;
  }
  return PD_OK;

oom:
  rc = dev_error(st, PD_RESOURCE_EXHAUSTED,
                 "host out of memory computing a gradient");
fail:
  if (results)
    for (int i = 0; i < n_sources; i++) dev_tensor_release(results[i]);
  free(results);
  release_map_values(&grads);
  dev__pmap_free(&grads);
  dev__pmap_free(&reach);
  return rc;
}
