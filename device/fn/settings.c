/* What the files of device/fn/ share about a library and its settings, so
 * that the library (library.c), instantiation (instance.c) and the pipeline
 * (pipeline.c) call down into one file: the pass names, the merge of the
 * tri-state pass settings, the config's log, and finding a function by
 * name. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fn_call.h"

static const char *const pass_names[DEV_PASS_COUNT] = {
    "pruning",         "cse",       "constant_folding", "arithmetic", "fusion",
    "buffer_planning", "cuda_graph"};

const char *dev_fn_pass_name(dev_fn_pass p) {
  return (unsigned)p < DEV_PASS_COUNT ? pass_names[p] : NULL;
}

int dev_fn_pass_from_name(const char *name) {
  for (int p = 0; name && p < DEV_PASS_COUNT; p++)
    if (strcmp(name, pass_names[p]) == 0) return p;
  return -1;
}

dev_tristate fn_pass_in_force(const dev_fn_options *o, const dev_fn_config *c,
                              dev_fn_pass p) {
  if (o && o->passes[p] != DEV_TRI_DEFAULT) return o->passes[p];
  if (c && c->passes[p] != DEV_TRI_DEFAULT) return c->passes[p];
  return DEV_TRI_ON;
}

void fn_log(const dev_fn_config *c, dev_fn_log_level level, const char *fn,
            const char *fmt, ...) {
  if (!c->log) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  c->log(c->log_arg, level, fn, buf);
}

fn_func *fn_lib_find(const dev_fn_lib *lib, const char *name) {
  for (int i = 0; name && i < lib->n; i++)
    if (strcmp(lib->fns[i]->name, name) == 0) return lib->fns[i];
  return NULL;
}

const fn_graph *fn_lib_lookup(void *arg, const char *name) {
  fn_func *f = fn_lib_find(arg, name);
  return f ? f->g : NULL;
}
