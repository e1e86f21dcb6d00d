/* libparadev: the daemon's op reference (ListOps).
 *
 * Every op the daemon's registry holds, described as the registry describes
 * it: its inputs and outputs (list or not, the dtypes each accepts), its
 * attributes (kind, default, range, allowed values), whether it has a
 * gradient on a tape, whether it is a collective, and the one-line summary
 * and notes kept beside the op's definition (device/ops/). The `paradev ops`
 * command, docs/ops.md and the Python package's generated wrappers are all
 * made from this same data.
 *
 * Part of the API of <paradev/paradev.h>, which includes this header: include
 * that one. Its conventions hold here.
 *
 * The structs below are plain data and part of the ABI: fields are only
 * ever added at the end, and arrays of them are only handed out by the
 * library (index them, never allocate them). Every pointer in them belongs
 * to the array pd_list_ops returned and lives until pd_ops_free. Strings are
 * NUL-terminated UTF-8 and never NULL ("" when empty).
 *
 * Source: TensorFlow's OpDef (tensorflow/core/framework/op_def.proto:
 * ArgDef, AttrDef with default_value, has_minimum/minimum, allowed_values)
 * and its op registry's listing (tf.raw_ops).
 */
#ifndef PARADEV_OPS_H
#define PARADEV_OPS_H

#include "paradev/paradev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Op reference */

/* The kind of an attribute's value; the numbers are the wire's
 * (paradev.v1.AttrKind) and never change. */
typedef enum pd_attr_kind {
  PD_ATTR_KIND_INVALID = 0,
  PD_ATTR_KIND_INT = 1,        /* int64: pd_attrs_set_int */
  PD_ATTR_KIND_FLOAT = 2,      /* double: pd_attrs_set_float */
  PD_ATTR_KIND_BOOL = 3,       /* pd_attrs_set_bool */
  PD_ATTR_KIND_STRING = 4,     /* pd_attrs_set_string */
  PD_ATTR_KIND_DTYPE = 5,      /* a pd_dtype: pd_attrs_set_dtype */
  PD_ATTR_KIND_SHAPE = 6,      /* dims: pd_attrs_set_shape */
  PD_ATTR_KIND_INT_LIST = 7,   /* pd_attrs_set_int_list */
  PD_ATTR_KIND_FLOAT_LIST = 8, /* pd_attrs_set_float_list */
} pd_attr_kind;

#define PD_ATTR_KIND_COUNT 9 /* one past the largest pd_attr_kind value */

/* The name of a kind as the reference prints it: "int", "float", "bool",
 * "string", "dtype", "shape", "list(int)", "list(float)"; "invalid" outside
 * the enum. Thread-safe; static storage. */
const char *pd_attr_kind_name(pd_attr_kind kind);

/* One attribute value (an attribute's default). Only the fields of `kind`
 * mean anything:
 *   INT: i;  FLOAT: f;  BOOL: b;  DTYPE: dtype;  STRING: s;
 *   SHAPE: n dims in ints (n = rank, 0 for a scalar shape);
 *   INT_LIST: n values in ints;  FLOAT_LIST: n values in floats.
 * ints / floats may be NULL when n is 0. */
typedef struct pd_attr_value {
  pd_attr_kind kind;
  int64_t i;
  double f;
  bool b;
  pd_dtype dtype;
  const char *s;
  int n;
  const int64_t *ints;
  const double *floats;
} pd_attr_value;

/* The bit of dtype `dt` in pd_op_arg.dtypes. */
#define PD_DTYPE_BIT(dt) (UINT32_C(1) << (unsigned)(dt))

/* One input or output argument of an op. */
typedef struct pd_op_arg {
  const char *name; /* TensorFlow's argument name where TF has the op: "a" */
  /* A list argument takes min_length or more tensors, given as consecutive
   * entries of the op's flattened inputs; how many is the number of inputs
   * passed less the op's other arguments (an op has at most one list input
   * and at most one list output). TFE_OpGetInputLength; for a list output
   * (Split's), length_attr names the attribute that gives its length
   * (TFE_OpGetOutputLength). */
  bool is_list;
  int min_length; /* 1 for a plain argument */
  /* Allowed dtypes, PD_DTYPE_BIT(dt) for each; for an output, the dtypes it
   * can have. Shape inference checks them (and how the inputs' dtypes must
   * agree) and refuses others with INVALID_ARGUMENT. */
  uint32_t dtypes;
  /* How the dtype is chosen, in words, "" when `dtypes` says it all: e.g.
   * "same as x", "the attribute dtype", "int64". */
  const char *dtype_rule;
  const char *doc; /* a few words about the argument; may be "" */
  /* A list output: the attribute whose value (INT) or length (INT_LIST) is
   * the list's length, e.g. "num_split"; name that many output ids. ""
   * otherwise (and from a daemon that predates list outputs). */
  const char *length_attr;
} pd_op_arg;

/* One attribute of an op. */
typedef struct pd_op_attr {
  const char *name;
  pd_attr_kind kind;
  /* false: the attribute is required (Execute refuses the op without it). */
  bool has_default;
  pd_attr_value default_value; /* when has_default */
  /* Inclusive bounds of the value (INT, FLOAT) or of every element (INT_LIST,
   * FLOAT_LIST), when the registry knows them statically. Bounds that depend
   * on the inputs (an axis: -rank..rank-1) are in `doc`. */
  bool has_minimum;
  double minimum;
  bool has_maximum;
  double maximum;
  /* STRING attributes that take one of a fixed set of values: the set.
   * allowed_values is NULL when num_allowed_values is 0 (any string). */
  int num_allowed_values;
  const char *const *allowed_values;
  const char *doc; /* a few words: "axes to reduce; -rank..rank-1" */
} pd_op_attr;

/* One op of the registry. */
typedef struct pd_op_info {
  const char *name;    /* TensorFlow raw-op spelling: "MatMul" */
  const char *summary; /* one line, never "" */
  /* More text, "" when none; it says where the op differs from
   * tf.raw_ops.<name> ("Differs from tf.raw_ops.Sum: ..."). */
  const char *notes;
  int num_inputs;
  const pd_op_arg *inputs; /* [num_inputs] */
  int num_outputs;
  const pd_op_arg *outputs; /* [num_outputs] */
  int num_attrs;
  const pd_op_attr *attrs; /* [num_attrs] */
  /* True when a tape can differentiate through the op (it has a VJP). */
  bool has_gradient;
  /* True for a collective (AllReduce, Broadcast, AllGather, ReduceScatter):
   * every device of the mesh takes part in each run. */
  bool is_collective;
} pd_op_info;

/* Asks the daemon for its op reference: every registered op in name order
 * when `name` is NULL or "", else the one op of that name. *ops gets an
 * array of *n_ops entries (free it with pd_ops_free); both are written only
 * on success.
 * Errors:   PD_NOT_FOUND (no op named `name`; the message names it),
 *           PD_INVALID_ARGUMENT (ops or n_ops NULL, a NULL client),
 *           PD_UNIMPLEMENTED (a daemon older than ListOps),
 *           PD_RESOURCE_EXHAUSTED (out of memory), PD_INTERNAL (a reply
 *           that cannot be decoded), transport errors.
 * Thread safety: thread-safe; needs no session.
 * Source: paradev.v1.ParallelDevice/ListOps; TensorFlow's OpDef. */
pd_code pd_list_ops(pd_client *c, const char *name, pd_op_info **ops,
                    int *n_ops, const pd_call_options *call, pd_status *st);

/* Frees an array from pd_list_ops (every string and array it points to).
 * NULL is a no-op; `n_ops` must be the count pd_list_ops gave. */
void pd_ops_free(pd_op_info *ops, int n_ops);

/* The entry of `ops` named `name`, or NULL. Thread-safe (reads only). */
const pd_op_info *pd_ops_find(const pd_op_info *ops, int n_ops,
                              const char *name);

/* The attribute of `op` named `name`, or NULL. Thread-safe (reads only). */
const pd_op_attr *pd_op_info_attr(const pd_op_info *op, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_OPS_H */
