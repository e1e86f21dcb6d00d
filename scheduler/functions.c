/* Graph functions in sessions (issue #11): each session owns one function
 * library of the engine (dev_fn_lib), made at its first registration with
 * the daemon's settings (sched_config.functions) and destroyed when the
 * session ends. A call of a function is an ordinary op of sched_execute:
 * only its preparation differs (dev_fn_prepare_call instead of
 * dev_op_prepare); quotas, estimates, deadlines and tapes treat it as any
 * op. Everything here runs under the session's mu. */
#include <string.h>

#include "sched_int.h"

/* The session's library, made on first use. Under ss->mu. */
static pd_code fns_get_locked(sched_session *ss, dev_fn_lib **out,
                              dev_status *st) {
  if (!ss->fns) {
    const dev_fn_config *cfg = &ss->owner->cfg.functions;
    PD_TRY(dev_fn_lib_create(ss->owner->engine, cfg->struct_size ? cfg : NULL,
                             &ss->fns, st));
  }
  *out = ss->fns;
  return PD_OK;
}

pd_code sched_register_function(sched_session *ss, const dev_fn_def *def,
                                const dev_fn_options *opts, bool *existed,
                                dev_status *st) {
  if (!ss || !def)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_register_function: NULL argument");
  bool ex = false;
  pthread_mutex_lock(&ss->mu);
  dev_fn_lib *lib = NULL;
  pd_code c =
      ss->closed ? sched_closed_error(ss, st) : fns_get_locked(ss, &lib, st);
  /* The engine bounds it too; the message here names the limit whatever
   * the engine's words. A name already there is the engine's to judge
   * (identical: a no-op; else ALREADY_EXISTS). */
  if (c == PD_OK && dev_fn_lib_count(lib) >= DEV_FN_MAX_PER_LIB &&
      !(def->name && dev_fn_lib_has(lib, def->name)))
    c = dev_error(st, PD_RESOURCE_EXHAUSTED,
                  "the session holds %d functions, the most one session "
                  "may register (%d); '%.128s' was not registered",
                  dev_fn_lib_count(lib), DEV_FN_MAX_PER_LIB,
                  def->name ? def->name : "");
  if (c == PD_OK) c = dev_fn_register(lib, def, opts, &ex, st);
  pthread_mutex_unlock(&ss->mu);
  if (c == PD_OK && existed) *existed = ex;
  return c;
}

pd_code sched_describe_function(sched_session *ss, const char *name,
                                dev_fn_info *out, dev_status *st) {
  if (!ss || !name || !out)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "sched_describe_function: NULL argument");
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  if (ss->closed)
    c = sched_closed_error(ss, st);
  else if (!ss->fns || !dev_fn_lib_has(ss->fns, name))
    c = dev_error(st, PD_NOT_FOUND,
                  "no function '%.128s' in this session (RegisterFunction "
                  "first; functions belong to the session that registered "
                  "them)",
                  name);
  else
    c = dev_fn_describe(ss->fns, name, out, st);
  pthread_mutex_unlock(&ss->mu);
  return c;
}

/* CopyToDevices' target (attr `devices`) within the allowed set, checked
 * here so the refusal is PERMISSION_DENIED whatever the engine says of the
 * rest. A list that is no device set of the mesh (a device that does not
 * exist, one twice, none) is INVALID_ARGUMENT first, in the engine's words
 * (dev_devset_make, as prepare_copy says it): PERMISSION_DENIED is only
 * for devices that exist but are not allowed. */
static pd_code sched_check_copy_target(sched_session *ss, const char *name,
                                       const dev_attr *attrs, int num_attrs,
                                       dev_status *st) {
  if (!name || strcmp(name, "CopyToDevices") != 0) return PD_OK;
  for (int a = 0; a < num_attrs; a++) {
    const dev_attr *at = &attrs[a];
    if (!at->name || strcmp(at->name, "devices") != 0 ||
        at->value.type != DEV_ATTR_INT_LIST)
      continue;
    dev_devset set = {0};
    dev_status inner = DEV_STATUS_INIT;
    if (dev_devset_make(ss->owner->engine, at->value.u.ilist.v,
                        at->value.u.ilist.n, &set, &inner) != PD_OK)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "CopyToDevices: attribute 'devices': %s", inner.msg);
    if (sched_placement_check(ss, &set, &inner) != PD_OK)
      return dev_error(st, inner.code, "CopyToDevices target: %s", inner.msg);
  }
  return PD_OK;
}

pd_code sched_prepare_named_locked(sched_session *ss, const char *name,
                                   const dev_devset *devices,
                                   dev_tensor *const *inputs, int num_inputs,
                                   const dev_attr *attrs, int num_attrs,
                                   dev_op **out, dev_status *st) {
  /* Placement (issue #17): a set named is checked and within the allowed
   * set; an op without inputs and without a set runs on the session's
   * default; with inputs, on theirs (the engine checks they agree). */
  dev_devset set;
  const dev_devset *on = NULL;
  if (devices || num_inputs == 0) {
    PD_TRY(sched_place(ss, devices, &set, st));
    on = &set;
  }
  PD_TRY(sched_check_copy_target(ss, name, attrs, num_attrs, st));
  pd_code c;
  if (ss->fns && name && dev_fn_lib_has(ss->fns, name)) {
    if (num_attrs > 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "'%.128s' is a function of this session: a call "
                       "takes no attributes (%d given)",
                       name, num_attrs);
    c = dev_fn_prepare_call_on(ss->fns, on, name, inputs, num_inputs, out, st);
  } else {
    c = dev_op_prepare_on(ss->owner->engine, on, name, inputs, num_inputs,
                          attrs, num_attrs, out, st);
  }
  if (c != PD_OK) return c;
  /* Whatever the op touches (its inputs' and outputs' sets) is allowed:
   * inputs are the session's own, so this is a guard, not a rule. */
  c = sched_placement_check(ss, dev_op_devset(*out), st);
  if (c != PD_OK) {
    dev_op_abandon(*out, PD_PERMISSION_DENIED, "placed outside the session");
    *out = NULL;
  }
  return c;
}

dev_fn_lib *sched_take_functions_locked(sched_session *ss) {
  dev_fn_lib *lib = ss->fns;
  ss->fns = NULL;
  return lib;
}
