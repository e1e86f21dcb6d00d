/* PLACEHOLDER -- THE LEAD DELETES THIS FILE AT MERGE.
 *
 * The wire branch (issue #11: functions in sessions, on the wire, in
 * libparadev) links paradevd against device/dev_function.h before the
 * engine's implementation (the core branch) is merged. These definitions
 * store nothing: a library is an empty token, registration and calls answer
 * UNIMPLEMENTED, no name is a function. */
#include <stdlib.h>
#include <string.h>

#include "device.h"

struct dev_fn_lib {
  int unused;
};

#define FN_PLACEHOLDER_MSG "graph functions: engine not merged yet"

static const char *const fn_pass_names[DEV_PASS_COUNT] = {
    "pruning",         "cse",       "constant_folding", "arithmetic", "fusion",
    "buffer_planning", "cuda_graph"};

const char *dev_fn_pass_name(dev_fn_pass p) {
  return (int)p >= 0 && p < DEV_PASS_COUNT ? fn_pass_names[p] : NULL;
}

int dev_fn_pass_from_name(const char *name) {
  for (int i = 0; name && i < DEV_PASS_COUNT; i++)
    if (strcmp(name, fn_pass_names[i]) == 0) return i;
  return -1;
}

void dev_fn_def_free(dev_fn_def *def) { free(def); }

pd_code dev_fn_lib_create(dev_engine *e, const dev_fn_config *cfg,
                          dev_fn_lib **out, dev_status *st) {
  (void)e;
  (void)cfg;
  *out = calloc(1, sizeof(**out));
  if (!*out) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  return PD_OK;
}

void dev_fn_lib_destroy(dev_fn_lib *lib) { free(lib); }

pd_code dev_fn_register(dev_fn_lib *lib, const dev_fn_def *def,
                        const dev_fn_options *opts, bool *existed,
                        dev_status *st) {
  (void)lib;
  (void)def;
  (void)opts;
  (void)existed;
  return dev_error(st, PD_UNIMPLEMENTED, FN_PLACEHOLDER_MSG);
}

bool dev_fn_lib_has(const dev_fn_lib *lib, const char *name) {
  (void)lib;
  (void)name;
  return false;
}

pd_code dev_fn_prepare_call(dev_fn_lib *lib, const char *name,
                            dev_tensor *const *inputs, int num_inputs,
                            dev_op **out, dev_status *st) {
  (void)lib;
  (void)name;
  (void)inputs;
  (void)num_inputs;
  (void)out;
  return dev_error(st, PD_UNIMPLEMENTED, FN_PLACEHOLDER_MSG);
}

pd_code dev_fn_describe(dev_fn_lib *lib, const char *name, dev_fn_info *out,
                        dev_status *st) {
  (void)lib;
  (void)out;
  return dev_error(st, PD_NOT_FOUND, "no function '%.128s' (%s)", name,
                   FN_PLACEHOLDER_MSG);
}

int dev_fn_lib_count(const dev_fn_lib *lib) {
  (void)lib;
  return 0;
}

const char *dev_fn_lib_name_at(const dev_fn_lib *lib, int i) {
  (void)lib;
  (void)i;
  return NULL;
}

bool dev_op_is_function_call(const dev_op *op) {
  (void)op;
  return false;
}
