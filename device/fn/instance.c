/* Instantiation and calls of graph functions (dev_fn_prepare_call): the
 * signature of a call's inputs, the per-function cache of instantiations
 * (least recently used evicted), the reasons of a miss, the pipeline
 * (inline, infer, gradients, the built-in passes each on a backup so a
 * failure rolls back, the external passes, buffer planning), the captured
 * constants, and the prepared op a call is (its def the instantiation's,
 * its state fn_call_state with one rendezvous per collective node).
 * Source: TensorFlow's FunctionLibraryRuntime::Instantiate (one
 * instantiation per signature) and Grappler's meta optimizer (passes in a
 * fixed order, a failing one skipped); JAX's explain_cache_misses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fn_call.h"

static pd_code oom(dev_status *st) {
  return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
}

/* --- instantiations ----------------------------------------------------- */

void fn_inst_unref(fn_inst *inst) {
  if (!inst || atomic_fetch_sub(&inst->refs, 1) != 1) return;
  dev_backend *b = inst->engine->backend;
  for (int d = 0; inst->cg && d < inst->set.n; d++) {
    const int dev = inst->set.dev[d]; /* cg[] by component */
    if (inst->cg[d].graph) b->graph_destroy(b, dev, inst->cg[d].graph);
    if (inst->cg[d].mem)
      b->deallocate(b, dev, inst->cg[d].mem, inst->cg[d].mem_bytes);
    free(inst->cg[d].off);
  }
  free(inst->cg);
  for (int c = 0; inst->consts && c < inst->g->n_consts; c++)
    dev_tensor_release(inst->consts[c]);
  free(inst->consts);
  if (inst->planned) fn_buffer_plan_free(&inst->plan);
  fn_graph_free(inst->g);
  free(inst->key);
  free(inst->arg_dtype);
  free(inst->arg_shape);
  free(inst->arg_not_mirrored);
  free(inst->coll_nodes);
  free(inst);
}

/* "[32,64]" (no spaces, as the miss reasons print shapes). */
static char *shape_txt(const dev_shape *s, char *buf, size_t len) {
  int off = snprintf(buf, len, "[");
  for (int k = 0; k < s->rank && off > 0 && (size_t)off < len; k++)
    off += snprintf(buf + off, len - (size_t)off, "%s%lld", k ? "," : "",
                    (long long)s->dims[k]);
  if (off > 0 && (size_t)off < len) snprintf(buf + off, len - (size_t)off, "]");
  return buf;
}

/* The signature key: the call's device set (issue #17: consts, arenas and
 * collectives are per set), then every input's dtype, not-mirrored mark and
 * component shapes. */
static unsigned char *sig_key(const dev_devset *set, dev_tensor *const *in,
                              int n_in, int n_dev, size_t *len) {
  size_t per = sizeof(pd_dtype) + 1 + sizeof(dev_shape) * (size_t)n_dev;
  const size_t head = 1 + (size_t)set->n;
  unsigned char *k = calloc(1, head + per * (size_t)(n_in ? n_in : 1));
  if (!k) return NULL;
  unsigned char *p = k;
  *p++ = (unsigned char)set->n;
  memcpy(p, set->dev, (size_t)set->n);
  p += set->n;
  for (int i = 0; i < n_in; i++) {
    memcpy(p, &in[i]->dtype, sizeof(pd_dtype));
    p += sizeof(pd_dtype);
    *p++ = in[i]->not_mirrored;
    for (int d = 0; d < n_dev; d++) {
      dev_shape s;
      memset(&s, 0, sizeof s); /* padding of unused dims compares equal */
      s.rank = in[i]->comps[d].shape.rank;
      memcpy(s.dims, in[i]->comps[d].shape.dims,
             sizeof(int64_t) * (size_t)s.rank);
      memcpy(p, &s, sizeof s);
      p += sizeof s;
    }
  }
  *len = head + per * (size_t)n_in;
  return k;
}

/* What changed between the inputs and instantiation `c` ("input 0 shape
 * [32,64], cached [31,64]"; several joined by "; "). */
static void miss_reason(const fn_inst *c, const dev_devset *set,
                        dev_tensor *const *in, int n_in, int n_dev, char *buf,
                        size_t len) {
  int off = 0;
  buf[0] = '\0';
  if (!dev_devset_equal(set, &c->set)) {
    char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
    snprintf(buf, len, "devices %s, cached %s",
             dev_devset_str(set, a, sizeof a),
             dev_devset_str(&c->set, b, sizeof b));
    return;
  }
  for (int i = 0; i < n_in && (size_t)off < len; i++) {
    char what[200] = "";
    if (in[i]->dtype != c->arg_dtype[i]) {
      snprintf(what, sizeof what, "input %d dtype %s, cached %s", i,
               pd_dtype_name(in[i]->dtype), pd_dtype_name(c->arg_dtype[i]));
    } else if (in[i]->not_mirrored != c->arg_not_mirrored[i]) {
      snprintf(what, sizeof what, "input %d is %s, cached %s", i,
               in[i]->not_mirrored ? "sharded (not mirrored)" : "mirrored",
               c->arg_not_mirrored[i] ? "sharded (not mirrored)" : "mirrored");
    } else {
      int first = -1;
      bool all = true;
      for (int d = 0; d < n_dev; d++) {
        bool eq = dev_shape_equal(&in[i]->comps[d].shape,
                                  &c->arg_shape[i * n_dev + d]);
        if (!eq && first < 0) first = d;
        all &= !eq;
      }
      if (first >= 0) {
        char a[96], b[96], dev[32] = "";
        if (!all) snprintf(dev, sizeof dev, " on device %d", first);
        snprintf(what, sizeof what, "input %d shape %s%s, cached %s", i,
                 shape_txt(&in[i]->comps[first].shape, a, sizeof a), dev,
                 shape_txt(&c->arg_shape[i * n_dev + first], b, sizeof b));
      }
    }
    if (what[0])
      off +=
          snprintf(buf + off, len - (size_t)off, "%s%s", off ? "; " : "", what);
  }
  if (!buf[0]) snprintf(buf, len, "a signature not cached");
}

/* "(float32[32,784], float32[-1,5] sharded as [3,5],[2,5],[2,5],[2,5])":
 * each input's dtype and shape (-1 where components differ), and its
 * component shapes when they differ, so two instantiations never read the
 * same (truncated to len). */
static void signature_txt(dev_tensor *const *in, int n_in, int n_dev, char *buf,
                          size_t len) {
  int off = snprintf(buf, len, "(");
  for (int i = 0; i < n_in && off > 0 && (size_t)off < len; i++) {
    char s[96];
    off += snprintf(buf + off, len - (size_t)off, "%s%s%s%s", i ? ", " : "",
                    pd_dtype_name(in[i]->dtype),
                    shape_txt(&in[i]->shape, s, sizeof s),
                    in[i]->not_mirrored ? " sharded" : "");
    bool differ = false;
    for (int d = 1; d < n_dev; d++)
      differ |=
          !dev_shape_equal(&in[i]->comps[d].shape, &in[i]->comps[0].shape);
    for (int d = 0; differ && d < n_dev && off > 0 && (size_t)off < len; d++)
      off += snprintf(buf + off, len - (size_t)off, "%s%s", d ? "," : " as ",
                      shape_txt(&in[i]->comps[d].shape, s, sizeof s));
  }
  if (off > 0 && (size_t)off < len) snprintf(buf + off, len - (size_t)off, ")");
}

/* Sets a Gradients node's outputs from its sources x_i (before
 * expansion). */
static pd_code infer_gradients_node(fn_graph *g, fn_node *n, dev_status *st) {
  free(n->out_shape);
  n->out_shape = malloc(sizeof(dev_shape) * (size_t)(n->n_out * g->n_dev));
  if (!n->out_shape) return oom(st);
  for (int k = 0; k < n->n_out; k++) {
    fn_ref x = n->in[1 + k];
    n->out_dtype[k] = fn_ref_dtype(g, x);
    n->out_not_mirrored[k] = fn_ref_not_mirrored(g, x);
    for (int d = 0; d < g->n_dev; d++)
      n->out_shape[k * g->n_dev + d] = *fn_ref_shape(g, x, d);
  }
  n->inferred = true;
  return PD_OK;
}

/* fn_inline_all's emit: infers each node as it is made. */
static pd_code infer_emitted(void *arg, fn_graph *g, int i, dev_status *st) {
  (void)arg;
  if (g->nodes[i].kind == FN_NODE_GRADIENTS)
    return infer_gradients_node(g, &g->nodes[i], st);
  return fn_graph_infer_node(g, i, st);
}

/* fn_inline_all's check: a call's inputs (inferred) have its callee's
 * argument dtypes. */
static pd_code check_call(void *arg, fn_graph *g, const fn_node *n,
                          const fn_graph *callee, dev_status *st) {
  (void)arg;
  for (int j = 0; j < n->n_in && j < callee->n_args; j++)
    if (fn_ref_dtype(g, n->in[j]) != callee->arg_dtype[j])
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', node '%s': input %d is %s; argument "
                       "'%s' of function '%s' is %s",
                       g->fn_name, n->name, j,
                       pd_dtype_name(fn_ref_dtype(g, n->in[j])),
                       callee->arg_names[j], callee->fn_name,
                       pd_dtype_name(callee->arg_dtype[j]));
  return PD_OK;
}

/* Inlines calls and infers, front to back in one pass (fn_inline_all): a
 * call's inputs are inferred when it is reached, so their dtypes are
 * checked against the callee's arguments; its nodes then take its place and
 * are inferred in turn. A Gradients node's outputs are its sources' (until
 * expansion). */
static pd_code inline_and_infer(dev_fn_lib *lib, fn_graph *g, double deadline,
                                int budget_ms, dev_status *st) {
  fn_inline_ctx x = {fn_lib_lookup, lib,      infer_emitted, check_call,
                     NULL,          deadline, budget_ms};
  return fn_inline_all(g, &x, st);
}

/* Bytes of value r on device d. */
static uint64_t value_bytes(const fn_graph *g, fn_ref r, int d) {
  return (uint64_t)pd_dtype_size(fn_ref_dtype(g, r)) *
         (uint64_t)dev_num_elems(fn_ref_shape(g, r, d));
}

static pd_code upload_consts(dev_engine *e, fn_inst *inst, dev_status *st) {
  const fn_graph *g = inst->g;
  if (!g->n_consts) return PD_OK;
  inst->consts = calloc((size_t)g->n_consts, sizeof *inst->consts);
  if (!inst->consts) return oom(st);
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  for (int c = 0; c < g->n_consts; c++) {
    dev_status ust = DEV_STATUS_INIT;
    if (dev_tensor_from_host_on(e, &inst->set, g->consts[c].dtype, &lay,
                                &g->consts[c].shape, g->consts[c].data,
                                &inst->consts[c], &ust) != PD_OK)
      return dev_error(st, ust.code, "function '%s': constant %d: %s",
                       g->fn_name, c, ust.msg);
  }
  return PD_OK;
}

static pd_code record_args(fn_inst *inst, dev_tensor *const *in, int n_in,
                           int n_dev, dev_status *st) {
  inst->n_args = n_in;
  size_t m = (size_t)(n_in ? n_in : 1);
  inst->arg_dtype = malloc(sizeof(pd_dtype) * m);
  inst->arg_shape = malloc(sizeof(dev_shape) * m * (size_t)n_dev);
  inst->arg_not_mirrored = malloc(m);
  if (!inst->arg_dtype || !inst->arg_shape || !inst->arg_not_mirrored)
    return oom(st);
  for (int i = 0; i < n_in; i++) {
    inst->arg_dtype[i] = in[i]->dtype;
    inst->arg_not_mirrored[i] = in[i]->not_mirrored;
    for (int d = 0; d < n_dev; d++)
      inst->arg_shape[i * n_dev + d] = in[i]->comps[d].shape;
  }
  return PD_OK;
}

/* The registered graph for these inputs: args' shapes set, calls inlined,
 * inferred, gradients expanded and inferred. */
static pd_code specialize(dev_fn_lib *lib, fn_func *f, const dev_devset *set,
                          dev_tensor *const *in, double deadline, int budget_ms,
                          fn_graph **out, dev_status *st) {
  const int n = set->n;
  fn_graph *g = fn_graph_clone(f->g);
  if (!g) return oom(st);
  pd_code rc = PD_OK;
  g->n_dev = n;
  g->arg_shape = malloc(sizeof(dev_shape) * (size_t)(g->n_args * n + 1));
  g->arg_not_mirrored = malloc((size_t)g->n_args + 1);
  if (!g->arg_shape || !g->arg_not_mirrored) {
    rc = oom(st);
    goto fail;
  }
  for (int a = 0; a < g->n_args; a++) {
    g->arg_not_mirrored[a] = in[a]->not_mirrored;
    for (int d = 0; d < n; d++) g->arg_shape[a * n + d] = in[a]->comps[d].shape;
  }
  PD_TRY_GOTO(inline_and_infer(lib, g, deadline, budget_ms, st), rc, fail);
  PD_TRY_GOTO(fn_expand_gradients(g, lib->engine, st), rc, fail);
  if (dev_monotonic_now() > deadline) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED,
                   "function '%s': instantiation took more than "
                   "instantiation_max_ms = %d ms expanding Gradients nodes "
                   "(%d nodes); raise [functions] instantiation_max_ms or "
                   "register a smaller function",
                   g->fn_name, budget_ms, g->n_nodes);
    goto fail;
  }
  fn_graph_compact(g);
  PD_TRY_GOTO(fn_graph_infer(g, st), rc, fail);
  *out = g;
  return PD_OK;
fail:
  fn_graph_free(g);
  return rc;
}

static const dev_op_def fn_call_def = {
    .name = "function",
    .flags = DEV_OP_FUNCTION,
    .summary = "the call of a graph function (device/fn/)",
};

/* CUDA graphs: in force for the function, a fenced backend with the
 * capture hooks, and a body without collectives (a rendezvous per call
 * cannot be replayed). */
static bool cuda_graph_possible(const dev_fn_lib *lib, const fn_func *f,
                                const fn_inst *inst) {
  const dev_backend *b = lib->engine->backend;
  return fn_pass_in_force(&f->opts, &lib->cfg, DEV_PASS_CUDA_GRAPH) ==
             DEV_TRI_ON &&
         lib->engine->fenced && inst->n_coll == 0 &&
         b->struct_size >=
             offsetof(dev_backend, graph_destroy) + sizeof b->graph_destroy &&
         b->capture_begin && b->capture_end && b->graph_launch &&
         b->graph_destroy;
}

static pd_code instantiate(dev_fn_lib *lib, fn_func *f, const dev_devset *set,
                           dev_tensor *const *in, int n_in, fn_inst **out,
                           dev_status *st) {
  dev_engine *e = lib->engine;
  fn_inst *inst = calloc(1, sizeof *inst);
  if (!inst) return oom(st);
  atomic_init(&inst->refs, 1);
  atomic_init(&inst->calls, 0);
  inst->engine = e;
  inst->set = *set;
  const int n_dev = set->n;
  pd_code rc = PD_OK;
  PD_TRY_GOTO(record_args(inst, in, n_in, n_dev, st), rc, fail);
  if (!(inst->key = sig_key(set, in, n_in, n_dev, &inst->key_len))) {
    rc = oom(st);
    goto fail;
  }
  signature_txt(in, n_in, n_dev, inst->info.signature,
                sizeof inst->info.signature);
  if (!dev_devset_is_all(e, set)) { /* two sets never read the same */
    char ds[DEV_DEVSET_STR_MAX];
    size_t used = strlen(inst->info.signature);
    snprintf(inst->info.signature + used, sizeof inst->info.signature - used,
             " on devices %s", dev_devset_str(set, ds, sizeof ds));
  }
  /* The bound on this instantiation's inlining, gradients, passes and
   * plugins: it runs under the session's lock. */
  const int budget_ms = lib->cfg.instantiation_max_ms > 0
                            ? lib->cfg.instantiation_max_ms
                            : DEV_FN_DEFAULT_INST_MAX_MS;
  const double deadline = dev_monotonic_now() + budget_ms / 1000.0;
  rc = specialize(lib, f, set, in, deadline, budget_ms, &inst->g, st);
  if (rc == PD_OK) {
    inst->info.nodes_in = inst->g->n_nodes;
    rc = fn_pipeline(lib, f, &inst->g, &inst->info, deadline, budget_ms, st);
  }
  if (rc != PD_OK && rc == PD_RESOURCE_EXHAUSTED) {
    /* Over the time budget or out of host memory: it depends on the load,
     * not on the definition, so the next call tries again. */
    fn_graph_free(inst->g);
    inst->g = NULL;
    fn_inst_unref(inst);
    return rc;
  }
  if (rc != PD_OK) {
    /* What the definition makes of this signature (not a transient
     * failure): kept as a negative entry so a retry fails at once. */
    inst->failed = rc;
    snprintf(inst->info.error, sizeof inst->info.error, "%s",
             st && st->msg[0] ? st->msg : pd_code_name(rc));
    fn_graph_free(inst->g);
    inst->g = NULL;
    *out = inst;
    return rc;
  }
  fn_graph_compact(inst->g);
  inst->info.nodes_out = inst->g->n_nodes;
  inst->info.unplanned_bytes = fn_unplanned_bytes(inst->g);
  fn_plan_for(lib, f, inst);
  inst->transient_bytes = fn_transient_bytes(inst);
  PD_TRY_GOTO(upload_consts(e, inst, st), rc, fail);
  inst->coll_nodes = malloc(sizeof(int) * (size_t)(inst->g->n_nodes + 1));
  if (!inst->coll_nodes) {
    rc = oom(st);
    goto fail;
  }
  for (int i = 0; i < inst->g->n_nodes; i++)
    if (inst->g->nodes[i].def->flags & DEV_OP_COLLECTIVE)
      inst->coll_nodes[inst->n_coll++] = i;
  if (cuda_graph_possible(lib, f, inst) &&
      !(inst->cg = calloc((size_t)n_dev, sizeof *inst->cg))) {
    rc = oom(st);
    goto fail;
  }
  inst->def = fn_call_def;
  inst->def.name = inst->g->fn_name;
  *out = inst;
  return PD_OK;
fail:
  fn_inst_unref(inst);
  return rc;
}

/* --- the cache ------------------------------------------------------------ */

static int inst_cap(const dev_fn_lib *lib, const fn_func *f) {
  if (f->opts.max_instantiations) return f->opts.max_instantiations;
  if (lib->cfg.max_instantiations) return lib->cfg.max_instantiations;
  return DEV_FN_DEFAULT_INST_CAP;
}

static void add_miss_reason(fn_func *f, const char *why) {
  memmove(&f->miss[1], &f->miss[0],
          sizeof f->miss[0] * (DEV_FN_MISS_REASONS - 1));
  snprintf(f->miss[0], sizeof f->miss[0], "%s", why);
  if (f->n_miss < DEV_FN_MISS_REASONS) f->n_miss++;
}

/* Adds one to the daemon-wide count `field` (dev_fn_config.counters). */
#define fn_count(lib, field)                                                   \
  do {                                                                         \
    if ((lib)->cfg.counters)                                                   \
      atomic_fetch_add_explicit(&(lib)->cfg.counters->field, 1,                \
                                memory_order_relaxed);                         \
  } while (0)

/* The instantiation for these inputs (a reference), from the cache or new. */
static pd_code find_or_instantiate(dev_fn_lib *lib, fn_func *f,
                                   const dev_devset *set, dev_tensor *const *in,
                                   int n_in, fn_inst **out, dev_status *st) {
  const int n = set->n;
  size_t klen = 0;
  unsigned char *key = sig_key(set, in, n_in, n, &klen);
  if (!key) return oom(st);
  int hit = -1;
  for (int i = 0; i < f->n_insts && hit < 0; i++)
    if (f->insts[i]->key_len == klen &&
        memcmp(f->insts[i]->key, key, klen) == 0)
      hit = i;
  free(key);
  fn_inst *inst = NULL;
  if (hit >= 0) {
    f->hits++;
    fn_count(lib, hits);
    inst = f->insts[hit];
    memmove(&f->insts[1], &f->insts[0], sizeof(fn_inst *) * (size_t)hit);
    f->insts[0] = inst;
    if (inst->failed) /* a negative entry: the same error, at once */
      return dev_error(st, inst->failed,
                       "%s (cached: this signature failed "
                       "to instantiate before)",
                       inst->info.error);
  } else {
    char why[256];
    if (f->n_insts == 0 && f->misses == 0)
      snprintf(why, sizeof why, "first call");
    else if (f->n_insts == 0)
      snprintf(why, sizeof why, "no instantiation cached");
    else
      miss_reason(f->insts[0], set, in, n_in, n, why, sizeof why);
    f->misses++;
    fn_count(lib, misses);
    add_miss_reason(f, why);
    fn_log(&lib->cfg, DEV_FN_LOG_INFO, f->name, "cache miss: %s", why);
    pd_code rc = instantiate(lib, f, set, in, n_in, &inst, st);
    if (rc != PD_OK && !inst) return rc;
    if (rc == PD_OK) fn_count(lib, instantiations);
    int cap = inst_cap(lib, f);
    while (f->n_insts >= cap) {
      fn_inst_unref(f->insts[--f->n_insts]);
      f->evictions++;
      fn_count(lib, evictions);
    }
    memmove(&f->insts[1], &f->insts[0], sizeof(fn_inst *) * (size_t)f->n_insts);
    f->insts[0] = inst;
    f->n_insts++;
    if (rc != PD_OK) return rc; /* cached as a negative entry */
  }
  if (f->last_used != inst) {
    fn_inst_unref(f->last_used);
    atomic_fetch_add(&inst->refs, 1);
    f->last_used = inst;
  }
  atomic_fetch_add(&inst->refs, 1);
  *out = inst;
  return PD_OK;
}

/* --- the call ------------------------------------------------------------- */

static void call_free(void *p) {
  fn_call_state *cs = p;
  dev_backend *b = cs->inst->engine->backend;
  /* Every device is done with the call (dev__op_free): what their runs
   * left here (a body with collectives) goes now. */
  for (int d = 0; cs->mem && d < cs->inst->set.n; d++)
    fn_run_release(cs->inst, d, &cs->mem[d]);
  free(cs->mem);
  for (int c = 0; c < cs->n_coll; c++)
    if (cs->colls[c] && b->collective_release)
      b->collective_release(b, cs->colls[c]);
  free(cs->colls);
  fn_inst_unref(cs->inst);
  free(cs);
}

static void call_estimate(const dev_op *op, double *flops, double *bytes,
                          double *ns) {
  const fn_call_state *cs = op->fn_call;
  const fn_graph *g = cs->inst->g;
  dev_backend_kind kind = op->engine->backend->kind;
  double worst = -1;
  for (int d = 0; d < g->n_dev; d++) {
    double f = 0, b = 0, t = 0;
    for (int i = 0; i < g->n_nodes; i++) {
      const fn_node *n = &g->nodes[i];
      dev_shape in_s[DEV_MAX_INPUTS], out_s[FN_MAX_NODE_OUTPUTS];
      size_t in_b[DEV_MAX_INPUTS], out_b[FN_MAX_NODE_OUTPUTS];
      for (int j = 0; j < n->n_in; j++) {
        in_s[j] = *fn_ref_shape(g, n->in[j], d);
        in_b[j] = (size_t)value_bytes(g, n->in[j], d);
      }
      for (int k = 0; k < n->n_out; k++) {
        out_s[k] = n->out_shape[k * g->n_dev + d];
        out_b[k] = (size_t)value_bytes(g, fn_node_ref(i, k), d);
      }
      double nf = 0, nb = 0;
      t += dev__cost_node(kind, n->def, n->attrs, n->n_in, in_s, in_b, n->n_out,
                          out_s, out_b, &nf, &nb);
      f += nf;
      b += nb;
    }
    if (t > worst) {
      worst = t;
      *flops = f;
      *bytes = b;
      *ns = t;
    }
    if (!cs->inst->g->n_dev) break;
  }
}

/* Checks a call's inputs against the function's arguments. */
static pd_code check_call_inputs(const dev_fn_lib *lib, const fn_func *f,
                                 dev_tensor *const *in, int n_in,
                                 dev_status *st) {
  const fn_graph *g = f->g;
  if (n_in != g->n_args || (n_in && !in))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': got %d inputs; expected %d (its "
                     "arguments)",
                     f->name, n_in, g->n_args);
  for (int i = 0; i < n_in; i++) {
    if (!in[i])
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s': input %d is missing", f->name, i);
    if (in[i]->engine != lib->engine)
      return dev_error(st, PD_FAILED_PRECONDITION,
                       "function '%s': input %d belongs to another engine",
                       f->name, i);
    if (in[i]->dtype != g->arg_dtype[i])
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s': input %d is %s; argument '%s' is %s",
                       f->name, i, pd_dtype_name(in[i]->dtype), g->arg_names[i],
                       pd_dtype_name(g->arg_dtype[i]));
  }
  return PD_OK;
}

/* The call's state: a reference on inst and its collectives' rendezvous. */
static pd_code make_state(dev_engine *e, fn_inst *inst, fn_call_state **out,
                          dev_status *st) {
  fn_call_state *cs = calloc(1, sizeof *cs);
  if (!cs) return oom(st);
  cs->hdr.free = call_free;
  cs->hdr.run = fn_run_call;
  cs->hdr.estimate = call_estimate;
  cs->hdr.transient_bytes = inst->transient_bytes;
  cs->hdr.collectives = inst->n_coll > 0;
  cs->inst = inst;
  atomic_fetch_add(&inst->refs, 1);
  if (inst->n_coll &&
      (!(cs->colls = calloc((size_t)inst->n_coll, sizeof *cs->colls)) ||
       !(cs->mem = calloc((size_t)inst->set.n, sizeof *cs->mem)))) {
    call_free(cs);
    return oom(st);
  }
  for (int c = 0; c < inst->n_coll; c++) {
    const fn_node *n = &inst->g->nodes[inst->coll_nodes[c]];
    cs->n_coll = c + 1;
    cs->colls[c] = e->backend->collective_create(
        e->backend, (dev_collective_kind)n->def->collective, &inst->set);
    if (!cs->colls[c]) {
      call_free(cs);
      return oom(st);
    }
  }
  *out = cs;
  return PD_OK;
}

static pd_code make_call(dev_engine *e, fn_inst *inst, dev_tensor *const *in,
                         int n_in, dev_op **out, dev_status *st) {
  const fn_graph *g = inst->g;
  dev_op *op = dev__op_alloc(e);
  if (!op) return oom(st);
  op->def = &inst->def;
  op->engine = e;
  pd_code rc = PD_OK;
  fn_call_state *cs = NULL;
  PD_TRY_GOTO(make_state(e, inst, &cs, st), rc, fail);
  op->fn_call = cs;
  op->num_inputs = n_in;
  for (int i = 0; i < n_in; i++) {
    dev_tensor_retain(in[i]);
    op->inputs[i] = in[i];
  }
  dev_shape shapes[PD_MAX_DEVICES];
  for (int o = 0; o < g->n_outputs; o++) {
    fn_ref r = g->outputs[o];
    for (int d = 0; d < inst->set.n; d++) shapes[d] = *fn_ref_shape(g, r, d);
    dev_status tst = DEV_STATUS_INIT;
    if (dev__tensor_new(e, &inst->set, fn_ref_dtype(g, r), shapes,
                        &op->outputs[o], &tst) != PD_OK) {
      rc = dev_error(st, tst.code, "function '%s': output '%s': %s", g->fn_name,
                     g->out_names[o], tst.msg);
      goto fail;
    }
    op->num_outputs = o + 1;
    op->outputs[o]->not_mirrored = fn_ref_not_mirrored(g, r);
    for (int d = 0; d < inst->set.n; d++)
      atomic_store(&op->outputs[o]->comps[d].ready_seq, UINT64_MAX);
  }
  dev__op_set_devset(op, &inst->set);
  atomic_fetch_add(&inst->calls, 1);
  *out = op;
  return PD_OK;
fail:
  dev__op_free(op);
  return rc;
}

pd_code fn_prepare_call_locked(dev_fn_lib *lib, fn_func *f,
                               const dev_devset *set, dev_tensor *const *inputs,
                               int num_inputs, dev_op **out, dev_status *st) {
  PD_TRY(check_call_inputs(lib, f, inputs, num_inputs, st));
  fn_inst *inst = NULL;
  PD_TRY(find_or_instantiate(lib, f, set, inputs, num_inputs, &inst, st));
  pd_code rc = make_call(lib->engine, inst, inputs, num_inputs, out, st);
  fn_inst_unref(inst);
  return rc;
}
