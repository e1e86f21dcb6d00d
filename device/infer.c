/* Checks that shape-inference functions share (dev_backend.h): dtype and rank
 * of an input, two inputs of one dtype, an axis attribute in range; each
 * failure is INVALID_ARGUMENT naming the op, the input or attribute, what it
 * got and what was expected. */
#include <stdio.h>
#include <string.h>

#include "device_int.h"

static void mask_names(unsigned mask, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  for (int dt = 1; dt < PD_DTYPE_COUNT; dt++) {
    if (!(mask & DEV_DTYPE_BIT(dt))) continue;
    int n = snprintf(buf + off, len - off, "%s%s", off ? ", " : "",
                     pd_dtype_name((pd_dtype)dt));
    if (n < 0 || (size_t)n >= len - off) break;
    off += (size_t)n;
  }
}

static const char *input_name(const dev_infer_ctx *c, int input, char *buf,
                              size_t len) {
  /* Map a flattened input index back to its arg name (list args get [k]). */
  const dev_op_def *d = c->op;
  int idx = 0;
  for (int a = 0; a < d->num_inputs; a++) {
    int n = dev_op_input_length(d, a, c->num_inputs);
    if (n < 0) n = 1;
    if (input < idx + n) {
      if (d->inputs[a].is_list)
        snprintf(buf, len, "%s[%d]", d->inputs[a].name, input - idx);
      else
        snprintf(buf, len, "%s", d->inputs[a].name);
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
  if (!expected) {
    mask_names(mask, names, sizeof names);
    expected = names;
  }
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: input '%s' has dtype %s; expected %s", c->op->name,
                   input_name(c, input, in, sizeof in), pd_dtype_name(dt),
                   expected);
}

pd_code dev_check_same_dtype(const dev_infer_ctx *c, int a, int b,
                             dev_status *st) {
  if (c->in_dtype[a] == c->in_dtype[b]) return PD_OK;
  char na[64], nb[64];
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: input '%s' has dtype %s but input '%s' has dtype %s; "
                   "expected the same dtype",
                   c->op->name, input_name(c, a, na, sizeof na),
                   pd_dtype_name(c->in_dtype[a]),
                   input_name(c, b, nb, sizeof nb),
                   pd_dtype_name(c->in_dtype[b]));
}

pd_code dev_check_rank(const dev_infer_ctx *c, int input, int min_rank,
                       int max_rank, dev_status *st) {
  int r = c->in_shape[input].rank;
  if (r >= min_rank && r <= max_rank) return PD_OK;
  char in[64], sb[160];
  if (min_rank == max_rank)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: input '%s' has shape %s (rank %d); expected rank %d",
                     c->op->name, input_name(c, input, in, sizeof in),
                     dev_shape_str(&c->in_shape[input], sb, sizeof sb), r,
                     min_rank);
  return dev_error(
      st, PD_INVALID_ARGUMENT,
      "%s: input '%s' has shape %s (rank %d); expected rank %d to %d",
      c->op->name, input_name(c, input, in, sizeof in),
      dev_shape_str(&c->in_shape[input], sb, sizeof sb), r, min_rank, max_rank);
}

pd_code dev_normalize_axis(const dev_infer_ctx *c, const char *attr,
                           int64_t axis, int rank, int *out, dev_status *st) {
  if (axis < -(int64_t)rank || axis >= rank || rank == 0)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "%s: attribute '%s' is %lld; expected %d to %d for rank %d",
        c->op->name, attr, (long long)axis, -rank, rank - 1, rank);
  *out = (int)(axis < 0 ? axis + rank : axis);
  return PD_OK;
}

pd_code dev_check_out_size(const dev_infer_ctx *c, pd_dtype dt,
                           const dev_shape *s, dev_status *st) {
  size_t bytes;
  dev_status tmp = DEV_STATUS_INIT;
  if (dev_shape_byte_size(dt, s, &bytes, &tmp) != PD_OK) {
    char sb[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: output shape %s of dtype %s is too large (%s)",
                     c->op->name, dev_shape_str(s, sb, sizeof sb),
                     pd_dtype_name(dt), tmp.msg);
  }
  return PD_OK;
}
