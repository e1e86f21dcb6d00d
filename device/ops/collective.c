/* Collective ops across a device set: AllReduce, Broadcast, AllGather and
 * ReduceScatter, with NCCL's semantics (ncclAllReduce, ncclBroadcast,
 * ncclAllGather, ncclReduceScatter). They take one input per device of the
 * input's set (the parallel tensor's components; issue #17: the group is
 * that set, not the mesh) and run through the backend's collective
 * functions; every device takes them in the one global order.
 *
 * The first attribute of each op is the one the backends read by position
 * (see device/cpu/collective.c). */
#include <stdio.h>
#include <string.h>

#include "device_int.h"

#define COLL_DTYPES DEV_MASK_ALL

static pd_code check_reduction(const dev_infer_ctx *c, const dev_attr_value *v,
                               bool scatter, dev_status *st) {
  int red = dev_reduction_from_name(v->u.s.ptr, v->u.s.len);
  if (red < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: attribute 'reduction' is '%.*s'; expected sum, mean, "
                     "max, min or prod",
                     c->op->name, (int)(v->u.s.len > 64 ? 64 : v->u.s.len),
                     v->u.s.ptr);
  if (c->in_dtype[0] == PD_BOOL && (red == DEV_RED_MEAN))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: reduction 'mean' is not defined for bool; expected "
                     "sum, max, min or prod",
                     c->op->name);
  (void)scatter;
  return PD_OK;
}

/* All components must share one shape (NCCL requires equal counts). */
static pd_code check_same_shapes(const dev_infer_ctx *c, dev_status *st) {
  const dev_shape *s0 = &c->all_in_shape[0][0];
  for (int d = 1; d < c->num_devices; d++)
    if (!dev_shape_equal(s0, &c->all_in_shape[0][d])) {
      char a[160], b[160];
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: component 0 has shape %s but component %d has "
                       "shape %s; expected the same shape on every device",
                       c->op->name, dev_shape_str(s0, a, sizeof a), d,
                       dev_shape_str(&c->all_in_shape[0][d], b, sizeof b));
    }
  return PD_OK;
}

static pd_code all_reduce_infer(dev_infer_ctx *c, dev_status *st) {
  PD_TRY(dev_check_dtype_in(c, 0, COLL_DTYPES, NULL, st));
  PD_TRY(check_reduction(c, &c->attrs[0], false, st));
  PD_TRY(check_same_shapes(c, st));
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->in_shape[0];
  return PD_OK;
}

/* root is a position within the input's device set (component `root`), not
 * an engine device: the message names the set where it is known. */
static pd_code broadcast_infer(dev_infer_ctx *c, dev_status *st) {
  int64_t root = c->attrs[0].u.i;
  if (root < 0 || root >= c->num_devices) {
    char sb[DEV_DEVSET_STR_MAX + 1] = "";
    if (c->devset) {
      sb[0] = ' ';
      dev_devset_str(c->devset, sb + 1, sizeof sb - 1);
    }
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "Broadcast: attribute 'root' is %lld; expected an index "
                     "within the input's device set%s (0 to %d)",
                     (long long)root, sb, c->num_devices - 1);
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = c->all_in_shape[0][root];
  return PD_OK;
}

static pd_code all_gather_infer(dev_infer_ctx *c, dev_status *st) {
  const dev_shape *s0 = &c->all_in_shape[0][0];
  PD_TRY(dev_check_rank(c, 0, 1, PD_MAX_RANK, st));
  int axis;
  PD_TRY(dev_normalize_axis(c, "axis", c->attrs[0].u.i, s0->rank, &axis, st));
  dev_shape out = *s0;
  out.dims[axis] = 0;
  for (int d = 0; d < c->num_devices; d++) {
    const dev_shape *s = &c->all_in_shape[0][d];
    for (int i = 0; i < s0->rank; i++)
      if (i != axis && s->dims[i] != s0->dims[i]) {
        char a[160], b[160];
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "AllGather: component 0 has shape %s but component %d "
                         "has shape %s; "
                         "expected equal dims except on axis %d",
                         dev_shape_str(s0, a, sizeof a), d,
                         dev_shape_str(s, b, sizeof b), axis);
      }
    if (__builtin_add_overflow(out.dims[axis], s->dims[axis], &out.dims[axis]))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "AllGather: gathered axis %d overflows", axis);
  }
  c->out_dtype[0] = c->in_dtype[0];
  c->out_shape[0] = out;
  return PD_OK;
}

static pd_code reduce_scatter_infer(dev_infer_ctx *c, dev_status *st) {
  PD_TRY(dev_check_dtype_in(c, 0, COLL_DTYPES, NULL, st));
  PD_TRY(check_reduction(c, &c->attrs[0], true, st));
  PD_TRY(dev_check_rank(c, 0, 1, PD_MAX_RANK, st));
  PD_TRY(check_same_shapes(c, st));
  c->out_dtype[0] = c->in_dtype[0];
  dev_shard_shape(&c->in_shape[0], 0, c->num_devices, c->device,
                  &c->out_shape[0]);
  return PD_OK;
}

#define STR_DEFAULT(str)                                                       \
  {                                                                            \
    DEV_ATTR_STRING, {                                                         \
      .s = { str, sizeof(str) - 1 }                                            \
    }                                                                          \
  }
#define INT_DEFAULT(v)                                                         \
  {                                                                            \
    DEV_ATTR_INT, { .i = v }                                                   \
  }

static const char *const k_reductions[] = {"sum", "mean", "max",
                                           "min", "prod", NULL};

#define COLL_NOTES(TF)                                                         \
  "No tf.raw_ops op of this name: the nearest is tf.raw_ops." TF               \
  ", which takes its group, key and device count as inputs and attributes; "   \
  "here the group is the input's device set (one component per device of "     \
  "it), in the one global order of ops."

static dev_op_def all_reduce_def = {
    .name = "AllReduce",
    .num_inputs = 1,
    .inputs = {{"input", false, 1, COLL_DTYPES}},
    .num_outputs = 1,
    .outputs = {{"output", false, 1, COLL_DTYPES, "same as input"}},
    .num_attrs = 1,
    .attrs = {{"reduction", DEV_ATTR_STRING, STR_DEFAULT("sum"),
               .doc = "how components combine (mean: not for bool)",
               .allowed = k_reductions}},
    .flags = DEV_OP_COLLECTIVE | DEV_OP_MESH_INFER,
    .infer = all_reduce_infer,
    .collective = DEV_COLL_ALL_REDUCE,
    .summary =
        "Every component becomes the reduction (sum, mean, max, min "
        "or prod) of all components (over the input's device set), "
        "which must share one shape.",
    .notes = COLL_NOTES("CollectiveReduceV2 (or NcclAllReduce)"),
};

static dev_op_def broadcast_def = {
    .name = "Broadcast",
    .num_inputs = 1,
    .inputs = {{"input", false, 1, COLL_DTYPES}},
    .num_outputs = 1,
    .outputs = {{"output", false, 1, COLL_DTYPES, "same as input"}},
    .num_attrs = 1,
    .attrs = {{"root", DEV_ATTR_INT, INT_DEFAULT(0),
               .doc = "the index within the input's device set of the "
                      "component copied (0..n-1 for a set of n devices; "
                      "not an engine device index)",
               .has_min = true, .min = 0}},
    .flags = DEV_OP_COLLECTIVE | DEV_OP_MESH_INFER,
    .infer = broadcast_infer,
    .collective = DEV_COLL_BROADCAST,
    .summary = "Every component becomes a copy of component `root`.",
    .notes = COLL_NOTES("CollectiveBcastSendV2 / CollectiveBcastRecvV2 (or "
                        "NcclBroadcast)"),
};

static dev_op_def all_gather_def = {
    .name = "AllGather",
    .num_inputs = 1,
    .inputs = {{"input", false, 1, COLL_DTYPES}},
    .num_outputs = 1,
    .outputs = {{"output", false, 1, COLL_DTYPES, "same as input"}},
    .num_attrs = 1,
    .attrs = {{"axis", DEV_ATTR_INT, INT_DEFAULT(0),
               .doc = "the axis to concatenate along; -rank..rank-1"}},
    .flags = DEV_OP_COLLECTIVE | DEV_OP_MESH_INFER,
    .infer = all_gather_infer,
    .collective = DEV_COLL_ALL_GATHER,
    .summary =
        "Every component becomes the concatenation of all components "
        "along `axis` (their other dims must agree).",
    .notes = COLL_NOTES("CollectiveGatherV2 (which gathers along axis 0 "
                        "only)"),
};

static dev_op_def reduce_scatter_def = {
    .name = "ReduceScatter",
    .num_inputs = 1,
    .inputs = {{"input", false, 1, COLL_DTYPES}},
    .num_outputs = 1,
    .outputs = {{"output", false, 1, COLL_DTYPES, "same as input"}},
    .num_attrs = 1,
    .attrs = {{"reduction", DEV_ATTR_STRING, STR_DEFAULT("sum"),
               .doc = "how components combine (mean: not for bool)",
               .allowed = k_reductions}},
    .flags = DEV_OP_COLLECTIVE | DEV_OP_MESH_INFER,
    .infer = reduce_scatter_infer,
    .collective = DEV_COLL_REDUCE_SCATTER,
    .summary =
        "Reduces all components (one shape) and leaves shard i of the "
        "result, along axis 0 as numpy.array_split, as component i (on "
        "device i of the input's set).",
    .notes = COLL_NOTES("CollectiveReduceScatterV2"),
};

void dev_register_collective_ops(void) {
  dev__register_or_die(&all_reduce_def);
  dev__register_or_die(&broadcast_def);
  dev__register_or_die(&all_gather_def);
  dev__register_or_die(&reduce_scatter_def);
}
