/* The op registry: op definitions by name, their kernels per backend, and the
 * checks infer functions share. */
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
    if (c < 0) hi = mid - 1; else lo = mid + 1;
  }
  return NULL;
}

pd_code dev_op_register(dev_op_def *def, dev_status *st) {
  for (int i = 0; i < g_num_ops; i++)
    if (strcmp(g_ops[i]->name, def->name) == 0)
      return dev_error(st, PD_ALREADY_EXISTS, "op %s is already registered", def->name);
  if (g_num_ops == MAX_OPS)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "op registry full (%d ops)", MAX_OPS);
  int lists = 0;
  for (int i = 0; i < def->num_inputs; i++) lists += def->inputs[i].is_list;
  if (lists > 1 || def->num_inputs > DEV_MAX_ARGS || def->num_outputs > DEV_MAX_OUTPUTS ||
      def->num_attrs > DEV_MAX_ATTRS || !def->infer)
    return dev_error(st, PD_INVALID_ARGUMENT, "op %s: malformed definition", def->name);
  g_ops[g_num_ops++] = def;
  qsort(g_ops, (size_t)g_num_ops, sizeof g_ops[0], cmp_def);
  return PD_OK;
}

pd_code dev_kernel_register(dev_backend_kind kind, const char *op_name, dev_kernel_fn fn,
                            dev_status *st) {
  dev_op_def *d = find(op_name);
  if (!d) return dev_error(st, PD_NOT_FOUND, "no op named %s", op_name);
  if ((unsigned)kind >= DEV_BACKEND_KINDS)
    return dev_error(st, PD_INVALID_ARGUMENT, "backend kind %d out of range", (int)kind);
  d->kernels[kind] = fn;
  return PD_OK;
}

void dev_register_or_die(dev_op_def *def) {
  dev_status st = DEV_STATUS_INIT;
  if (dev_op_register(def, &st) != PD_OK) {
    fprintf(stderr, "paradev: op registration failed: %s\n", st.msg);
    abort();
  }
}

static void registry_init_once(void) {
  dev_register_elementwise_ops();
  dev_register_linalg_ops();
  dev_register_reduce_ops();
  dev_register_array_ops();
  dev_register_random_ops();
  dev_register_collective_ops();
  dev_register_grad_ops();
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

const char *dev_op_def_name(const dev_op_def *def) { return def->name; }

bool dev_op_def_is_collective(const dev_op_def *def) {
  return (def->flags & DEV_OP_COLLECTIVE) != 0;
}

int dev_op_attr_index(const dev_op_def *def, const char *name) {
  for (int i = 0; i < def->num_attrs; i++)
    if (strcmp(def->attrs[i].name, name) == 0) return i;
  return -1;
}

int dev_op_input_length(const dev_op_def *def, int arg, int num_inputs) {
  if (arg < 0 || arg >= def->num_inputs) return -1;
  int list_arg = -1;
  for (int i = 0; i < def->num_inputs; i++)
    if (def->inputs[i].is_list) list_arg = i;
  if (list_arg < 0) return num_inputs == def->num_inputs ? 1 : -1;
  int list_len = num_inputs - (def->num_inputs - 1);
  if (list_len < def->inputs[list_arg].min_len) return -1;
  return arg == list_arg ? list_len : 1;
}

/* --- checks shared by infer functions ---------------------------------- */

static void mask_names(unsigned mask, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  for (int dt = 1; dt < PD_DTYPE_COUNT; dt++) {
    if (!(mask & DEV_DTYPE_BIT(dt))) continue;
    int n = snprintf(buf + off, len - off, "%s%s", off ? ", " : "", pd_dtype_name((pd_dtype)dt));
    if (n < 0 || (size_t)n >= len - off) break;
    off += (size_t)n;
  }
}

static const char *input_name(const dev_infer_ctx *c, int input, char *buf, size_t len) {
  /* Map a flattened input index back to its arg name (list args get [k]). */
  const dev_op_def *d = c->op;
  int idx = 0;
  for (int a = 0; a < d->num_inputs; a++) {
    int n = dev_op_input_length(d, a, c->num_inputs);
    if (n < 0) n = 1;
    if (input < idx + n) {
      if (d->inputs[a].is_list) snprintf(buf, len, "%s[%d]", d->inputs[a].name, input - idx);
      else snprintf(buf, len, "%s", d->inputs[a].name);
      return buf;
    }
    idx += n;
  }
  snprintf(buf, len, "#%d", input);
  return buf;
}

pd_code dev_check_dtype_in(const dev_infer_ctx *c, int input, unsigned mask,
                           const char *expected, dev_status *st) {
  pd_dtype dt = c->in_dtype[input];
  if (mask & DEV_DTYPE_BIT(dt)) return PD_OK;
  char names[200], in[64];
  if (!expected) { mask_names(mask, names, sizeof names); expected = names; }
  return dev_error(st, PD_INVALID_ARGUMENT, "%s: input '%s' has dtype %s; expected %s",
                   c->op->name, input_name(c, input, in, sizeof in), pd_dtype_name(dt), expected);
}

pd_code dev_check_same_dtype(const dev_infer_ctx *c, int a, int b, dev_status *st) {
  if (c->in_dtype[a] == c->in_dtype[b]) return PD_OK;
  char na[64], nb[64];
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: input '%s' has dtype %s but input '%s' has dtype %s; expected the same dtype",
                   c->op->name, input_name(c, a, na, sizeof na), pd_dtype_name(c->in_dtype[a]),
                   input_name(c, b, nb, sizeof nb), pd_dtype_name(c->in_dtype[b]));
}

pd_code dev_check_rank(const dev_infer_ctx *c, int input, int min_rank, int max_rank,
                       dev_status *st) {
  int r = c->in_shape[input].rank;
  if (r >= min_rank && r <= max_rank) return PD_OK;
  char in[64], sb[160];
  if (min_rank == max_rank)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: input '%s' has shape %s (rank %d); expected rank %d",
                     c->op->name, input_name(c, input, in, sizeof in),
                     dev_shape_str(&c->in_shape[input], sb, sizeof sb), r, min_rank);
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: input '%s' has shape %s (rank %d); expected rank %d to %d",
                   c->op->name, input_name(c, input, in, sizeof in),
                   dev_shape_str(&c->in_shape[input], sb, sizeof sb), r, min_rank, max_rank);
}

pd_code dev_normalize_axis(const dev_infer_ctx *c, const char *attr, int64_t axis, int rank,
                           int *out, dev_status *st) {
  if (axis < -(int64_t)rank || axis >= rank || rank == 0)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute '%s' is %lld; expected %d to %d for rank %d",
                     c->op->name, attr, (long long)axis, -rank, rank - 1, rank);
  *out = (int)(axis < 0 ? axis + rank : axis);
  return PD_OK;
}
