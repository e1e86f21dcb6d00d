/* The op registry: op definitions by name (registered once, by the op files
 * in device/ops/, which the registry in turn calls: the one circle by
 * design), their kernels per backend, and lookups. The checks that infer
 * functions share are in infer.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"

#define MAX_OPS 256

static dev_op_def *g_ops[MAX_OPS];
static int g_num_ops;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int cmp_def(const void *a, const void *b) {
  const dev_op_def *x = *(dev_op_def *const *)a, *y = *(dev_op_def *const *)b;
  return strcmp(x->name, y->name);
}

static dev_op_def *find(const char *name) {
  int lo = 0, hi = g_num_ops - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    int c = strcmp(name, g_ops[mid]->name);
    if (c == 0) return g_ops[mid];
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

pd_code dev_op_register(dev_op_def *def, dev_status *st) {
  for (int i = 0; i < g_num_ops; i++)
    if (strcmp(g_ops[i]->name, def->name) == 0)
      return dev_error(st, PD_ALREADY_EXISTS, "op %s is already registered",
                       def->name);
  if (g_num_ops == MAX_OPS)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "op registry full (%d ops)",
                     MAX_OPS);
  int lists = 0;
  int out_lists = 0;
  for (int i = 0; i < def->num_inputs; i++) lists += def->inputs[i].is_list;
  for (int i = 0; i < def->num_outputs && i < DEV_MAX_ARGS; i++)
    out_lists += def->outputs[i].is_list;
  if (lists > 1 || out_lists > 1 || def->num_outputs > DEV_MAX_ARGS ||
      def->num_inputs > DEV_MAX_ARGS || def->num_outputs > DEV_MAX_OUTPUTS ||
      def->num_attrs > DEV_MAX_ATTRS || !def->infer)
    return dev_error(st, PD_INVALID_ARGUMENT, "op %s: malformed definition",
                     def->name);
  for (int i = 0; i < def->num_outputs; i++) {
    const dev_arg_def *o = &def->outputs[i];
    int a = o->length_attr ? dev_op_attr_index(def, o->length_attr) : -1;
    if (o->is_list && (a < 0 || (def->attrs[a].type != DEV_ATTR_INT &&
                                 def->attrs[a].type != DEV_ATTR_INT_LIST)))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "op %s: list output '%s' names no int or int-list "
                       "attribute as its length (dev_arg_def.length_attr)",
                       def->name, o->name);
  }
  if (!def->summary || !def->summary[0])
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "op %s: no summary; every op carries a one-line "
                     "description for the op reference (dev_op_def.summary)",
                     def->name);
  g_ops[g_num_ops++] = def;
  qsort(g_ops, (size_t)g_num_ops, sizeof g_ops[0], cmp_def);
  return PD_OK;
}

pd_code dev_kernel_register(dev_backend_kind kind, const char *op_name,
                            dev_kernel_fn fn, dev_status *st) {
  dev_op_def *d = find(op_name);
  if (!d) return dev_error(st, PD_NOT_FOUND, "no op named %s", op_name);
  if ((unsigned)kind >= DEV_BACKEND_KINDS)
    return dev_error(st, PD_INVALID_ARGUMENT, "backend kind %d out of range",
                     (int)kind);
  d->kernels[kind] = fn;
  return PD_OK;
}

void dev__register_or_die(dev_op_def *def) {
  dev_status st = DEV_STATUS_INIT;
  if (dev_op_register(def, &st) != PD_OK) {
    fprintf(stderr, "paradev: op registration failed: %s\n", st.msg);
    abort();
  }
}

static void registry_init_once(void) {
  dev_register_elementwise_ops();
  dev_register_binary_ops();
  dev_register_fill_cast_ops();
  dev_register_linalg_ops();
  dev_register_reduce_ops();
  dev_register_softmax_ops();
  dev_register_array_ops();
  dev_register_slicing_ops();
  dev_register_split_pack_ops();
  dev_register_random_ops();
  dev_register_collective_ops();
  dev_register_grad_ops();
  dev_register_grad_parts_ops();
  dev_register_fused_ops();
  dev_register_placement_ops();
}

void dev_registry_init(void) { pthread_once(&g_once, registry_init_once); }

const dev_op_def *dev_op_lookup(const char *name) {
  dev_registry_init();
  return name ? find(name) : NULL;
}

int dev_op_count(void) {
  dev_registry_init();
  return g_num_ops;
}

const dev_op_def *dev_op_at(int i) {
  dev_registry_init();
  return i >= 0 && i < g_num_ops ? g_ops[i] : NULL;
}
