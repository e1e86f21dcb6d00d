/* Op preparation: looks an op up, checks its arity and attributes (known
 * names, types, required ones; strings and lists deep-copied), runs shape
 * inference for every component and creates its outputs (not yet
 * allocated), so a caller knows every output's dtype and shape before the
 * devices run it. Also a prepared op's accessors, abandoning it, and freeing
 * it (dev__op_free, which the executor files call when the devices are done
 * with it) into the engine's free list of ops (dev__op_alloc takes from it:
 * no malloc of a dev_op per op). Submission is engine.c's. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_int.h"

/* --- the op free list (issue #15: no malloc per op) ------------------------ */

dev_op *dev__op_alloc(dev_engine *e) {
  pthread_mutex_lock(&e->op_mu);
  dev_op *op = e->op_free;
  if (op) {
    e->op_free = op->next_free;
    e->op_nfree--;
  }
  pthread_mutex_unlock(&e->op_mu);
  if (!op) return calloc(1, sizeof *op);
  /* All but inputs[] and outputs[], which are written before read */
  memset(op, 0, offsetof(dev_op, inputs));
  const size_t tail = offsetof(dev_op, outputs) + sizeof op->outputs;
  memset((char *)op + tail, 0, sizeof *op - tail);
  return op;
}

void dev__op_recycle(dev_op *op) {
  dev_engine *e = op->engine;
  pthread_mutex_lock(&e->op_mu);
  if (e->op_nfree < DEV_OP_POOL) {
    op->next_free = e->op_free;
    e->op_free = op;
    e->op_nfree++;
    op = NULL;
  }
  pthread_mutex_unlock(&e->op_mu);
  free(op);
}

void dev__op_pool_free(dev_engine *e) {
  while (e->op_free) {
    dev_op *op = e->op_free;
    e->op_free = op->next_free;
    free(op);
  }
  pthread_mutex_destroy(&e->op_mu);
}

void dev__op_free(dev_op *op) {
  dev_backend *b = op->engine->backend;
  if (op->collective && b->collective_release)
    b->collective_release(b, op->collective);
  void (*rel)(dev_tensor *) =
      op->per_device_release ? dev__tensor_unref : dev_tensor_release;
  for (int i = 0; i < op->num_inputs; i++) rel(op->inputs[i]);
  for (int i = 0; i < op->num_outputs; i++) rel(op->outputs[i]);
  free(op->attr_arena);
  /* A function call's state (its def lives in the instantiation the state
   * holds, so this goes last). */
  if (op->fn_call) ((dev__fn_call *)op->fn_call)->free(op->fn_call);
  dev__op_recycle(op);
}

int dev__op_max_outputs(const dev_op_def *def) {
  for (int i = 0; i < def->num_outputs; i++)
    if (def->outputs[i].is_list) return DEV_MAX_OUTPUTS;
  return def->num_outputs;
}

static const char *attr_type_name(dev_attr_type t) {
  static const char *const names[] = {"none",  "int",      "float",
                                      "bool",  "string",   "dtype",
                                      "shape", "int list", "float list"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

static void list_attr_names(const dev_op_def *def, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  if (def->num_attrs == 0) {
    snprintf(buf, len, "no attributes");
    return;
  }
  for (int i = 0; i < def->num_attrs && off < len; i++) {
    int n = snprintf(buf + off, len - off, "%s%s", i ? ", " : "one of ",
                     def->attrs[i].name);
    if (n < 0) break;
    off += (size_t)n;
  }
}

static void list_input_names(const dev_op_def *def, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = 0; i < def->num_inputs && off < len; i++) {
    int n = snprintf(buf + off, len - off, "%s%s%s", i ? ", " : "",
                     def->inputs[i].name, def->inputs[i].is_list ? "..." : "");
    if (n < 0) break;
    off += (size_t)n;
  }
}

/* Checks one attribute value already known to have its declared type:
 * limits on strings and lists, valid dtypes and shapes; adds the bytes its
 * deep copy needs to *arena. */
static pd_code check_value(const dev_op_def *def, const dev_attr *a,
                           size_t *arena, dev_status *st) {
  const dev_attr_value *v = &a->value;
  const dev_attr_type want = v->type;
  switch (want) {
    case DEV_ATTR_STRING:
      if (v->u.s.len > DEV_ATTR_STRING_MAX || (v->u.s.len && !v->u.s.ptr))
        return dev_error(
            st, PD_INVALID_ARGUMENT,
            "%s: attribute '%s' is a string of %zu bytes; the limit is %d",
            def->name, a->name, v->u.s.len, DEV_ATTR_STRING_MAX);
      *arena += v->u.s.len + 1;
      break;
    case DEV_ATTR_INT_LIST:
    case DEV_ATTR_FLOAT_LIST: {
      int n = want == DEV_ATTR_INT_LIST ? v->u.ilist.n : v->u.flist.n;
      const void *p = want == DEV_ATTR_INT_LIST ? (const void *)v->u.ilist.v
                                                : (const void *)v->u.flist.v;
      if (n < 0 || n > DEV_ATTR_LIST_MAX || (n && !p))
        return dev_error(
            st, PD_INVALID_ARGUMENT,
            "%s: attribute '%s' is a list of %d values; expected 0 to %d",
            def->name, a->name, n, DEV_ATTR_LIST_MAX);
      *arena += (size_t)n * 8;
      break;
    }
    case DEV_ATTR_DTYPE:
      if (!dev_dtype_is_valid(v->u.dtype))
        return dev_error(
            st, PD_INVALID_ARGUMENT,
            "%s: attribute '%s' is dtype %d; expected a valid dtype", def->name,
            a->name, (int)v->u.dtype);
      break;
    case DEV_ATTR_SHAPE: {
      dev_shape tmp;
      dev_status sst = DEV_STATUS_INIT;
      if (dev_shape_make(v->u.shape.rank, v->u.shape.dims, &tmp, &sst) != PD_OK)
        return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute '%s': %s",
                         def->name, a->name, sst.msg);
      break;
    }
    case DEV_ATTR_FLOAT:
    case DEV_ATTR_INT:
    case DEV_ATTR_BOOL:
    case DEV_ATTR_NONE: break;
  }
  return PD_OK;
}

/* Copies the given attributes into vals[], strings and lists into `arena`
 * (sized by check_value). */
static void copy_attrs(const dev_op_def *def, const dev_attr *attrs,
                       int num_attrs, dev_attr_value *vals, char *p) {
  for (int k = 0; k < num_attrs; k++) {
    int idx = dev_op_attr_index(def, attrs[k].name);
    dev_attr_value v = attrs[k].value;
    if (v.type == DEV_ATTR_STRING) {
      if (v.u.s.len) memcpy(p, v.u.s.ptr, v.u.s.len);
      p[v.u.s.len] = '\0';
      v.u.s.ptr = p;
      p += v.u.s.len + 1;
    } else if (v.type == DEV_ATTR_INT_LIST && v.u.ilist.n) {
      memcpy(p, v.u.ilist.v, (size_t)v.u.ilist.n * 8);
      v.u.ilist.v = (const int64_t *)(void *)p;
      p += (size_t)v.u.ilist.n * 8;
    } else if (v.type == DEV_ATTR_FLOAT_LIST && v.u.flist.n) {
      memcpy(p, v.u.flist.v, (size_t)v.u.flist.n * 8);
      v.u.flist.v = (const double *)(void *)p;
      p += (size_t)v.u.flist.n * 8;
    }
    vals[idx] = v;
  }
}

pd_code dev__resolve_attrs(const dev_op_def *def, const dev_attr *attrs,
                           int num_attrs, dev_attr_value *vals,
                           void **arena_out, dev_status *st) {
  if (num_attrs < 0 || (num_attrs > 0 && !attrs))
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: malformed attribute list",
                     def->name);
  bool seen[DEV_MAX_ATTRS] = {0};
  size_t arena = 0;
  for (int i = 0; i < def->num_attrs; i++)
    vals[i] = def->attrs[i].default_value;
  for (int k = 0; k < num_attrs; k++) {
    const dev_attr *a = &attrs[k];
    if (!a->name)
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: attribute %d has no name",
                       def->name, k);
    int idx = dev_op_attr_index(def, a->name);
    if (idx < 0) {
      char names[256];
      list_attr_names(def, names, sizeof names);
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: unknown attribute '%.64s'; expected %s", def->name,
                       a->name, names);
    }
    if (seen[idx])
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: attribute '%s' is given twice", def->name, a->name);
    seen[idx] = true;
    dev_attr_type want = def->attrs[idx].type;
    if (a->value.type != want)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: attribute '%s' has type %s; expected %s", def->name,
                       a->name, attr_type_name(a->value.type),
                       attr_type_name(want));
    PD_TRY(check_value(def, a, &arena, st));
  }
  for (int i = 0; i < def->num_attrs; i++)
    if (!seen[i] && def->attrs[i].default_value.type == DEV_ATTR_NONE)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: attribute '%s' (%s) is required", def->name,
                       def->attrs[i].name, attr_type_name(def->attrs[i].type));
  char *p = NULL;
  if (arena) {
    p = malloc(arena);
    if (!p) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  copy_attrs(def, attrs, num_attrs, vals, p);
  *arena_out = p;
  return PD_OK;
}

/* Checks the arity of a call of `def` (list inputs per TFE_OpGetInputLength)
 * and that every input is there and belongs to engine `e`. */
pd_code dev__check_inputs(const dev_op_def *def, const dev_engine *e,
                          dev_tensor *const *inputs, int num_inputs,
                          dev_status *st) {
  if (num_inputs < 0 || num_inputs > DEV_MAX_INPUTS)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: %d inputs; the limit is %d",
                     def->name, num_inputs, DEV_MAX_INPUTS);
  if (def->num_inputs == 0 ? num_inputs != 0
                           : dev_op_input_length(def, 0, num_inputs) < 0) {
    char names[200];
    list_input_names(def, names, sizeof names);
    int list_arg = -1, fixed = def->num_inputs;
    for (int i = 0; i < def->num_inputs; i++)
      if (def->inputs[i].is_list) list_arg = i;
    if (list_arg >= 0)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "%s: got %d inputs; expected at least %d (%s, with '%s' a list of at "
          "least %d)",
          def->name, num_inputs, fixed - 1 + def->inputs[list_arg].min_len,
          names, def->inputs[list_arg].name, def->inputs[list_arg].min_len);
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: got %d inputs; expected %d (%s)", def->name,
                     num_inputs, fixed, fixed ? names : "none");
  }
  for (int i = 0; i < num_inputs; i++) {
    if (!inputs[i])
      return dev_error(st, PD_INVALID_ARGUMENT, "%s: input %d is missing",
                       def->name, i);
    if (inputs[i]->engine != e)
      return dev_error(st, PD_FAILED_PRECONDITION,
                       "%s: input %d belongs to another engine", def->name, i);
  }
  return PD_OK;
}

pd_code dev__infer_op(const dev_op_def *def, const dev_attr_value *attrs,
                      const dev_devset *set, int n, int num_inputs,
                      const pd_dtype *in_dtype, const dev_shape *in_shapes,
                      int *num_outputs, pd_dtype *out_dtype,
                      dev_shape *out_shapes, dev_status *st) {
  const size_t nin = (size_t)(num_inputs ? num_inputs : 1);
  const dev_shape *all_local[DEV_MAX_INPUTS];
  dev_shape in_local[16];
  dev_shape *in_shape = nin <= 16 ? in_local : malloc(sizeof(dev_shape) * nin);
  if (!in_shape)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  const dev_shape **all = NULL;
  if (def->flags & DEV_OP_MESH_INFER) {
    for (int i = 0; i < num_inputs; i++) all_local[i] = &in_shapes[i * n];
    all = all_local;
  }
  pd_code rc = PD_OK;
  int nout = def->num_outputs;
  const int cap = dev__op_max_outputs(def);
  for (int d = 0; d < n && rc == PD_OK; d++) {
    for (int i = 0; i < num_inputs; i++) in_shape[i] = in_shapes[i * n + d];
    /* Not zero-initialized as a whole: the output arrays hold
     * DEV_MAX_OUTPUTS entries, of which only the op's own are cleared (no
     * 64 outputs' worth of stores per op on the hot path). */
    dev_infer_ctx ic;
    memset(&ic, 0, offsetof(dev_infer_ctx, out_dtype)); /* any field added */
    const size_t tail =
        offsetof(dev_infer_ctx, out_shape) + sizeof ic.out_shape;
    memset((char *)&ic + tail, 0, sizeof ic - tail);
    ic.op = def;
    ic.device = d;
    ic.num_devices = n;
    ic.devset = set;
    ic.num_inputs = num_inputs;
    ic.in_dtype = in_dtype;
    ic.in_shape = in_shape;
    ic.all_in_shape = all;
    ic.attrs = attrs;
    ic.num_outputs = def->num_outputs;
    memset(ic.out_dtype, 0, sizeof ic.out_dtype[0] * (size_t)cap);
    memset(ic.out_shape, 0, sizeof ic.out_shape[0] * (size_t)cap);
    rc = def->infer(&ic, st);
    if (rc != PD_OK) break;
    if (d == 0) {
      nout = ic.num_outputs;
      if (nout < 0 || nout > cap) {
        rc = dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: %d outputs; the limit is %d", def->name, nout, cap);
        break;
      }
    } else if (ic.num_outputs != nout) {
      rc = dev_error(st, PD_INTERNAL,
                     "%s: inferred output counts differ between devices",
                     def->name);
      break;
    }
    for (int o = 0; o < nout && rc == PD_OK; o++) {
      if (d == 0)
        out_dtype[o] = ic.out_dtype[o];
      else if (out_dtype[o] != ic.out_dtype[o])
        rc = dev_error(st, PD_INTERNAL,
                       "%s: inferred dtypes differ between devices", def->name);
      out_shapes[o * n + d] = ic.out_shape[o];
    }
  }
  if (in_shape != in_local) free(in_shape);
  if (rc == PD_OK) *num_outputs = nout;
  return rc;
}

/* Runs `def`'s inference for every component of op's inputs (see
 * dev__infer_op): out_dtype[o] and out_shapes[o * n + d]. */
static pd_code infer_outputs(const dev_devset *set, const dev_op_def *def,
                             const dev_op *op, dev_tensor *const *inputs,
                             int num_inputs, int *num_outputs,
                             pd_dtype *out_dtype, dev_shape *out_shapes,
                             dev_status *st) {
  const int n = set->n;
  const size_t cnt = (size_t)num_inputs * (size_t)n;
  pd_dtype in_dtype[DEV_MAX_INPUTS];
  dev_shape local[32];
  dev_shape *in_shapes =
      cnt <= 32 ? local : malloc(sizeof(dev_shape) * (cnt ? cnt : 1));
  if (!in_shapes)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  for (int i = 0; i < num_inputs; i++) {
    in_dtype[i] = inputs[i]->dtype;
    for (int d = 0; d < n; d++)
      in_shapes[i * n + d] = inputs[i]->comps[d].shape;
  }
  pd_code rc = dev__infer_op(def, op->attrs, set, n, num_inputs, in_dtype,
                             in_shapes, num_outputs, out_dtype, out_shapes, st);
  if (in_shapes != local) free(in_shapes);
  return rc;
}

/* Creates op's outputs (not yet allocated, not yet submitted) and, for a
 * collective, its rendezvous. */
static pd_code make_outputs(dev_engine *e, const dev_devset *set,
                            const dev_op_def *def, dev_op *op, int nout,
                            const pd_dtype *out_dtype,
                            const dev_shape *out_shapes, dev_status *st) {
  const int n = set->n;
  for (int o = 0; o < nout; o++) {
    pd_code rc = dev__tensor_new(e, set, out_dtype[o], &out_shapes[o * n],
                                 &op->outputs[o], st);
    if (rc != PD_OK) {
      char msg[DEV_STATUS_MSG_MAX], nm[80];
      snprintf(msg, sizeof msg, "%s", st ? st->msg : "");
      return dev_error(st, rc, "%s: output %s: %s", def->name,
                       dev__output_name(def, nout, o, nm, sizeof nm), msg);
    }
    op->num_outputs = o + 1;
    for (int d = 0; d < n; d++)
      atomic_store(&op->outputs[o]->comps[d].ready_seq, UINT64_MAX);
  }
  if (def->flags & DEV_OP_COLLECTIVE) {
    op->collective = e->backend->collective_create(
        e->backend, (dev_collective_kind)def->collective, set);
    if (!op->collective)
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  }
  return PD_OK;
}

/* Whether op's outputs are known not to be mirrored (dev_tensor
 * .not_mirrored, which refuses a MIRRORED download): AllReduce, Broadcast
 * and AllGather leave the same value on every device; ReduceScatter,
 * DeviceId and per-device random streams do not; any other op passes on
 * its inputs' mark. */
bool dev__outputs_not_mirrored(const dev_op_def *def,
                               const dev_attr_value *attrs,
                               bool input_not_mirrored) {
  if (def->flags & DEV_OP_COLLECTIVE)
    return def->collective == DEV_COLL_REDUCE_SCATTER;
  if (strcmp(def->name, "DeviceId") == 0) return true;
  int pd = dev_op_attr_index(def, "per_device");
  if (pd >= 0 && attrs[pd].type == DEV_ATTR_BOOL && attrs[pd].u.b) return true;
  return input_not_mirrored;
}

static bool outputs_not_mirrored(const dev_op_def *def, const dev_op *op) {
  bool in = false;
  for (int i = 0; i < op->num_inputs && !in; i++)
    in = op->inputs[i]->not_mirrored;
  return dev__outputs_not_mirrored(def, op->attrs, in);
}

/* The set an op runs on: its inputs' one set (INVALID_ARGUMENT naming the
 * op, both inputs and both sets when two differ, or when `set` is given and
 * is not theirs), else `set`, else the whole mesh. */
static pd_code resolve_set(const dev_engine *e, const dev_op_def *def,
                           const dev_devset *set, dev_tensor *const *inputs,
                           int num_inputs, dev_devset *out, dev_status *st) {
  char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
  static const char how[] =
      "move a value with CopyToDevices, or ParallelPack / ParallelUnpack";
  for (int i = 1; i < num_inputs; i++)
    if (!dev_devset_equal(&inputs[i]->set, &inputs[0]->set))
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "%s: input 0 is on devices %s but input %d is on devices %s; an op "
          "runs on one device set: %s",
          def->name, dev_devset_str(&inputs[0]->set, a, sizeof a), i,
          dev_devset_str(&inputs[i]->set, b, sizeof b), how);
  if (num_inputs > 0) {
    if (set && !dev_devset_equal(set, &inputs[0]->set))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: placed on devices %s, but its inputs (input 0 "
                       "and the rest) are on devices %s; an op runs on its "
                       "inputs' device set: %s",
                       def->name, dev_devset_str(set, a, sizeof a),
                       dev_devset_str(&inputs[0]->set, b, sizeof b), how);
    *out = inputs[0]->set;
    return PD_OK;
  }
  if (!set) set = dev__tape_place; /* a VJP's Fill: its record's set */
  dev_status sst = DEV_STATUS_INIT;
  if (dev__devset_check(e, set, out, &sst) != PD_OK)
    return dev_error(st, sst.code, "%s: %s", def->name, sst.msg);
  return PD_OK;
}

pd_code dev__op_prepare_plain(dev_engine *e, const dev_op_def *def,
                              const dev_devset *placement,
                              dev_tensor *const *inputs, int num_inputs,
                              const dev_attr *attrs, int num_attrs,
                              dev_op **out, dev_status *st) {
  PD_TRY(dev__check_inputs(def, e, inputs, num_inputs, st));
  dev_devset set;
  PD_TRY(resolve_set(e, def, placement, inputs, num_inputs, &set, st));

  dev_op *op = dev__op_alloc(e); /* zeroed, from the engine's free list */
  if (!op) return dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
  op->def = def;
  op->engine = e;
  pd_dtype out_dtype[DEV_MAX_OUTPUTS];
  /* Output shapes: on the stack while they fit 64 (8 outputs on 8 devices:
   * no malloc per op on the hot path), else on the heap (meshes over 8
   * devices, list outputs), sized by the op's own bound on outputs. */
  dev_shape shapes_local[64];
  const size_t nshapes = (size_t)set.n * (size_t)dev__op_max_outputs(def);
  dev_shape *out_shapes = NULL;
  pd_code rc;
  PD_TRY_GOTO(
      dev__resolve_attrs(def, attrs, num_attrs, op->attrs, &op->attr_arena, st),
      rc, fail);
  out_shapes =
      nshapes <= 64 ? shapes_local : malloc(sizeof(dev_shape) * nshapes);
  if (!out_shapes) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "host out of memory");
    goto fail;
  }
  int nout = 0;
  PD_TRY_GOTO(infer_outputs(&set, def, op, inputs, num_inputs, &nout, out_dtype,
                            out_shapes, st),
              rc, fail);
  op->num_inputs = num_inputs;
  for (int i = 0; i < num_inputs; i++) {
    dev_tensor_retain(inputs[i]);
    op->inputs[i] = inputs[i];
  }
  PD_TRY_GOTO(make_outputs(e, &set, def, op, nout, out_dtype, out_shapes, st),
              rc, fail);
  bool not_mirrored = outputs_not_mirrored(def, op);
  for (int o = 0; o < op->num_outputs; o++)
    op->outputs[o]->not_mirrored = not_mirrored;
  dev__op_set_devset(op, &set);
  if (out_shapes != shapes_local) free(out_shapes);
  *out = op;
  return PD_OK;

fail:
  if (out_shapes != shapes_local) free(out_shapes);
  dev__op_free(op);
  return rc;
}

int dev_op_num_outputs(const dev_op *op) { return op->num_outputs; }
const dev_devset *dev_op_devset(const dev_op *op) { return &op->set; }

uint64_t dev_op_device_new_bytes(const dev_op *op, int device) {
  if (device < 0 || device >= PD_MAX_DEVICES || op->index[device] < 0) return 0;
  uint64_t s = 0;
  for (int i = 0; i < op->num_outputs; i++)
    s += dev_tensor_device_bytes(op->outputs[i], device);
  if (op->def->flags & DEV_OP_PLACEMENT) { /* pack / unpack alias */
    if (op->def->placement != DEV_PLACE_COPY) return 0;
    /* a copy's output on a device that also holds its source is new too */
    return s;
  }
  if (op->fn_call)
    s += ((const dev__fn_call *)op->fn_call)->transient_bytes / op->set.n;
  if ((op->def->flags & DEV_OP_ALIASES_INPUT) && op->num_outputs > 0 &&
      op->num_inputs > 0 && op->outputs[0]->bytes == op->inputs[0]->bytes)
    s -= dev_tensor_device_bytes(op->outputs[0], device);
  return s;
}
dev_tensor *dev_op_output(const dev_op *op, int i) {
  return i >= 0 && i < op->num_outputs ? op->outputs[i] : NULL;
}
uint64_t dev_op_output_bytes(const dev_op *op) {
  uint64_t s = 0;
  for (int i = 0; i < op->num_outputs; i++) s += op->outputs[i]->bytes;
  return s;
}

uint64_t dev_op_new_bytes(const dev_op *op) {
  if ((op->def->flags & DEV_OP_PLACEMENT) &&
      op->def->placement != DEV_PLACE_COPY)
    return 0; /* ParallelPack / ParallelUnpack share their inputs' buffers */
  uint64_t s = dev_op_output_bytes(op);
  /* A function call also holds its buffer arena while it runs (the
   * largest device's). */
  if (op->fn_call) s += ((const dev__fn_call *)op->fn_call)->transient_bytes;
  if ((op->def->flags & DEV_OP_ALIASES_INPUT) && op->num_outputs > 0 &&
      op->num_inputs > 0 && op->outputs[0]->bytes == op->inputs[0]->bytes)
    s -= op->outputs[0]->bytes;
  return s;
}

bool dev_op_output_shares(const dev_op *op, int out, int comp, int *in,
                          int *in_comp) {
  if (!op || out < 0 || out >= op->num_outputs || comp < 0 ||
      comp >= op->outputs[out]->n || op->num_inputs < 1 || op->fn_call)
    return false;
  const dev_op_def *def = op->def;
  int i = 0, c = 0;
  if (def->flags & DEV_OP_PLACEMENT) {
    if (def->placement == DEV_PLACE_PACK && out == 0 && comp < op->num_inputs)
      i = comp; /* input i is on one device: its component 0 */
    else if (def->placement == DEV_PLACE_UNPACK && comp == 0 &&
             out < op->inputs[0]->n)
      c = out;
    else
      return false;
  } else if (!(def->flags & DEV_OP_ALIASES_INPUT) || out != 0 ||
             comp >= op->inputs[0]->n ||
             op->inputs[0]->comps[comp].bytes !=
                 op->outputs[0]->comps[comp].bytes) {
    return false;
  } else {
    c = comp; /* exec.c alloc_outputs: output 0 aliases input 0 */
  }
  if (in) *in = i;
  if (in_comp) *in_comp = c;
  return true;
}

bool dev_op_has_pending_input(const dev_op *op, dev_tensor **pending) {
  for (int i = 0; i < op->num_inputs; i++)
    if (atomic_load_explicit(&op->inputs[i]->pending, memory_order_acquire)) {
      if (pending) *pending = op->inputs[i];
      return true;
    }
  return false;
}

void dev_op_abandon(dev_op *op, pd_code code, const char *msg) {
  for (int o = 0; o < op->num_outputs; o++)
    for (int d = 0; d < op->outputs[o]->n; d++) {
      dev__component_set_error(&op->outputs[o]->comps[d], code, msg);
      atomic_store(&op->outputs[o]->comps[d].ready_seq, 0);
    }
  dev__op_free(op);
}
