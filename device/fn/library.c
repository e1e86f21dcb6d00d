/* A session's library of graph functions (dev_function.h): creation and
 * destruction, registration (validated and sorted by convert.c; identical
 * re-registration is a no-op), lookups, describe. Instantiation and calls
 * are instance.c's; pass names, settings and the log settings.c's. One
 * mutex per library guards its functions and their caches. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fn_call.h"

pd_code dev_fn_lib_create(dev_engine *e, const dev_fn_config *cfg,
                          dev_fn_lib **out, dev_status *st) {
  dev_fn_config c = DEV_FN_CONFIG_INITIALIZER;
  if (cfg) {
    size_t n = cfg->struct_size < sizeof c ? cfg->struct_size : sizeof c;
    memcpy(&c, cfg, n);
    c.struct_size = sizeof c;
  }
  if (c.max_instantiations < 0 || c.max_instantiations > DEV_FN_MAX_INST_CAP)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "functions: max_instantiations is %d; expected 0 (the "
                     "default, %d) to %d",
                     c.max_instantiations, DEV_FN_DEFAULT_INST_CAP,
                     DEV_FN_MAX_INST_CAP);
  for (int p = 0; p < DEV_PASS_COUNT; p++)
    if ((unsigned)c.passes[p] > DEV_TRI_ON)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "functions: pass '%s' has setting %d; expected "
                       "default (0), off (1) or on (2)",
                       dev_fn_pass_name(p), (int)c.passes[p]);
  if (c.num_external < 0 || (c.num_external && !c.external))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "functions: %d external passes without a list",
                     c.num_external);
  dev_fn_lib *lib = calloc(1, sizeof *lib);
  if (!lib) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  lib->engine = e;
  lib->cfg = c;
  pthread_mutex_init(&lib->mu, NULL);
  *out = lib;
  return PD_OK;
}

static void func_free(fn_func *f) {
  for (int i = 0; i < f->n_insts; i++) fn_inst_unref(f->insts[i]);
  fn_inst_unref(f->last_used);
  fn_graph_free(f->g);
  free(f->canon);
  free(f->name);
  free(f);
}

void dev_fn_lib_destroy(dev_fn_lib *lib) {
  if (!lib) return;
  for (int i = 0; i < lib->n; i++) func_free(lib->fns[i]);
  pthread_mutex_destroy(&lib->mu);
  free(lib);
}

static pd_code check_options(const char *fn, const dev_fn_options *o,
                             dev_status *st) {
  if (o->struct_size <
      offsetof(dev_fn_options, max_instantiations) + sizeof(int))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': options' struct_size %zu is too small "
                     "(use DEV_FN_OPTIONS_INITIALIZER)",
                     fn, o->struct_size);
  for (int p = 0; p < DEV_PASS_COUNT; p++)
    if ((unsigned)o->passes[p] > DEV_TRI_ON)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s': pass '%s' has setting %d; expected "
                       "default (0), off (1) or on (2)",
                       fn, dev_fn_pass_name(p), (int)o->passes[p]);
  if (o->max_instantiations < 0 || o->max_instantiations > DEV_FN_MAX_INST_CAP)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': max_instantiations is %d; expected 0 "
                     "(the library's) to %d",
                     fn, o->max_instantiations, DEV_FN_MAX_INST_CAP);
  return PD_OK;
}

pd_code dev_fn_register(dev_fn_lib *lib, const dev_fn_def *def,
                        const dev_fn_options *opts, bool *existed,
                        dev_status *st) {
  dev_fn_options o = DEV_FN_OPTIONS_INITIALIZER;
  if (opts) {
    size_t n = opts->struct_size < sizeof o ? opts->struct_size : sizeof o;
    if (opts->struct_size < sizeof(size_t)) n = sizeof o; /* refused below */
    memcpy(&o, opts, n);
  }
  if (existed) *existed = false;
  if (def && def->name && dev_op_lookup(def->name))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%.128s': the name is a registered op; choose "
                     "another name",
                     def->name);
  /* Inside functions the name means the pseudo-op: a function of that
   * name could be called by Execute but never from another function. */
  if (def && def->name && strcmp(def->name, DEV_FN_GRADIENTS_OP) == 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s': the name is the %s pseudo-op of "
                     "function bodies; choose another name",
                     def->name, DEV_FN_GRADIENTS_OP);
  if (opts) PD_TRY(check_options(def && def->name ? def->name : "?", &o, st));
  o.struct_size = sizeof o;
  pthread_mutex_lock(&lib->mu);
  fn_graph *g = NULL;
  pd_code rc = fn_graph_from_def(def, NULL, fn_lib_lookup, lib, &g, st);
  if (rc != PD_OK) goto out;
  size_t clen = 0;
  char *canon = fn_graph_canonical(g, &o, &lib->cfg, &clen);
  if (!canon) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    goto out;
  }
  fn_func *old = fn_lib_find(lib, def->name);
  if (old) {
    bool same = old->canon_len == clen && memcmp(old->canon, canon, clen) == 0;
    free(canon);
    if (same) {
      if (existed) *existed = true;
    } else {
      rc = dev_error(st, PD_ALREADY_EXISTS,
                     "function '%s' is already registered with another body "
                     "or options; register it under a new name",
                     def->name);
    }
    goto out;
  }
  if (lib->n >= DEV_FN_MAX_PER_LIB) {
    free(canon);
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED,
                   "function '%s': the session holds %d functions, the most "
                   "one session may register; it was not registered",
                   def->name, DEV_FN_MAX_PER_LIB);
    goto out;
  }
  fn_func *f = calloc(1, sizeof *f);
  if (!f || !(f->name = fn_graph_strdup(def->name))) {
    free(f);
    free(canon);
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    goto out;
  }
  f->g = g;
  g = NULL;
  f->canon = canon;
  f->canon_len = clen;
  f->opts = o;
  lib->fns[lib->n++] = f;
out:
  pthread_mutex_unlock(&lib->mu);
  fn_graph_free(g);
  return rc;
}

bool dev_fn_lib_has(const dev_fn_lib *lib, const char *name) {
  if (!lib) return false;
  dev_fn_lib *l = (dev_fn_lib *)lib;
  pthread_mutex_lock(&l->mu);
  bool has = fn_lib_find(l, name) != NULL;
  pthread_mutex_unlock(&l->mu);
  return has;
}

int dev_fn_lib_count(const dev_fn_lib *lib) {
  dev_fn_lib *l = (dev_fn_lib *)lib;
  pthread_mutex_lock(&l->mu);
  int n = l->n;
  pthread_mutex_unlock(&l->mu);
  return n;
}

const char *dev_fn_lib_name_at(const dev_fn_lib *lib, int i) {
  dev_fn_lib *l = (dev_fn_lib *)lib;
  pthread_mutex_lock(&l->mu);
  const char *s = i >= 0 && i < l->n ? l->fns[i]->name : NULL;
  pthread_mutex_unlock(&l->mu);
  return s;
}

pd_code dev_fn_prepare_call(dev_fn_lib *lib, const char *name,
                            dev_tensor *const *inputs, int num_inputs,
                            dev_op **out, dev_status *st) {
  return dev_fn_prepare_call_on(lib, NULL, name, inputs, num_inputs, out, st);
}

/* The set a call runs on (issue #17): its inputs' one set, or `set` (NULL:
 * the whole mesh) for a function without inputs. */
static pd_code call_set(const dev_fn_lib *lib, const dev_devset *set,
                        const char *name, dev_tensor *const *in, int n_in,
                        dev_devset *out, dev_status *st) {
  char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
  static const char how[] =
      "move a value with CopyToDevices, or ParallelPack / ParallelUnpack";
  const char *fn = name ? name : "(null)";
  for (int i = 0; i < n_in; i++)
    if (!in || !in[i]) n_in = 0; /* check_call_inputs names it */
  for (int i = 1; i < n_in; i++)
    if (!dev_devset_equal(dev_tensor_devset(in[i]), dev_tensor_devset(in[0])))
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "function '%.128s': input 0 is on devices %s but input %d is on "
          "devices %s; a call runs on one device set: %s",
          fn, dev_devset_str(dev_tensor_devset(in[0]), a, sizeof a), i,
          dev_devset_str(dev_tensor_devset(in[i]), b, sizeof b), how);
  if (n_in > 0) {
    if (set && !dev_devset_equal(set, dev_tensor_devset(in[0])))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%.128s': placed on devices %s, but its "
                       "inputs are on devices %s; a call runs on its "
                       "inputs' device set: %s",
                       fn, dev_devset_str(set, a, sizeof a),
                       dev_devset_str(dev_tensor_devset(in[0]), b, sizeof b),
                       how);
    *out = *dev_tensor_devset(in[0]);
    return PD_OK;
  }
  dev_status sst = DEV_STATUS_INIT;
  if (dev__devset_check(lib->engine, set, out, &sst) != PD_OK)
    return dev_error(st, sst.code, "function '%.128s': %s", fn, sst.msg);
  return PD_OK;
}

pd_code dev_fn_prepare_call_on(dev_fn_lib *lib, const dev_devset *set,
                               const char *name, dev_tensor *const *inputs,
                               int num_inputs, dev_op **out, dev_status *st) {
  if (dev_engine_mesh_world_size(lib->engine) > 1) /* issue #16 */
    return dev_error(st, PD_UNIMPLEMENTED,
                     "graph functions are not available on a mesh across "
                     "machines yet; run the ops eagerly");
  dev_devset cs;
  PD_TRY(call_set(lib, set, name, inputs, num_inputs, &cs, st));
  pthread_mutex_lock(&lib->mu);
  fn_func *f = fn_lib_find(lib, name);
  pd_code rc =
      f ? fn_prepare_call_locked(lib, f, &cs, inputs, num_inputs, out, st)
        : dev_error(st, PD_NOT_FOUND,
                    "function '%.128s' is not registered in this session",
                    name ? name : "(null)");
  pthread_mutex_unlock(&lib->mu);
  return rc;
}

static void describe_locked(const dev_fn_lib *lib, const fn_func *f,
                            dev_fn_info *i) {
  i->options = f->opts;
  for (int p = 0; p < DEV_PASS_COUNT; p++)
    i->passes_in_force[p] = fn_pass_in_force(&f->opts, &lib->cfg, p);
  int cap = f->opts.max_instantiations    ? f->opts.max_instantiations
            : lib->cfg.max_instantiations ? lib->cfg.max_instantiations
                                          : DEV_FN_DEFAULT_INST_CAP;
  i->max_instantiations = cap;
  i->num_instantiations = f->n_insts;
  for (int k = 0; k < f->n_insts; k++) {
    i->insts[k] = f->insts[k]->info;
    i->insts[k].calls = atomic_load(&f->insts[k]->calls);
    i->insts[k].cuda_graph = atomic_load(&f->insts[k]->cg_captured);
  }
  i->hits = f->hits;
  i->misses = f->misses;
  i->evictions = f->evictions;
  i->num_miss_reasons = f->n_miss;
  memcpy(i->miss_reasons, f->miss, sizeof i->miss_reasons);
}

pd_code dev_fn_describe(dev_fn_lib *lib, const char *name, dev_fn_info *out,
                        dev_status *st) {
  if (!out || out->struct_size < sizeof *out)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "dev_fn_describe: out is NULL or its struct_size is "
                     "below %zu",
                     sizeof *out);
  pthread_mutex_lock(&lib->mu);
  fn_func *f = fn_lib_find(lib, name);
  if (!f) {
    pthread_mutex_unlock(&lib->mu);
    return dev_error(st, PD_NOT_FOUND,
                     "function '%.128s' is not registered in this session",
                     name ? name : "(null)");
  }
  dev_fn_info i;
  memset(&i, 0, sizeof i);
  i.struct_size = sizeof i;
  describe_locked(lib, f, &i);
  i.def = fn_graph_to_def(f->g);
  if (f->last_used) i.optimized = fn_graph_to_def(f->last_used->g);
  bool failed = !i.def || (f->last_used && !i.optimized);
  pthread_mutex_unlock(&lib->mu);
  if (failed) {
    dev_fn_def_free(i.def);
    dev_fn_def_free(i.optimized);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  *out = i;
  return PD_OK;
}

bool dev_op_is_function_call(const dev_op *op) {
  return op && (op->def->flags & DEV_OP_FUNCTION) != 0;
}
