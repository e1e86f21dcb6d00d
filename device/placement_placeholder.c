/* PLACEHOLDER (issue #17 contract): the placement entry points over the
 * whole mesh only, until the engine's tensors and ops carry their sets.
 * The engine helper deletes this file. */
#include "device_int.h"

static pd_code not_yet(dev_engine *e, const dev_devset *set, dev_status *st) {
  if (!set || dev_devset_is_all(e, set)) return PD_OK;
  return dev_error(st, PD_UNIMPLEMENTED,
                   "placement on a subset of the mesh is not built yet");
}

const dev_devset *dev_tensor_devset(const dev_tensor *t) {
  return &t->engine->all;
}

uint64_t dev_tensor_device_bytes(const dev_tensor *t, int device) {
  return device >= 0 && device < t->n ? t->comps[device].bytes : 0;
}

pd_code dev_tensor_create_on(dev_engine *e, const dev_devset *set,
                             pd_dtype dtype, const dev_shape *component_shapes,
                             dev_tensor **out, dev_status *st) {
  PD_TRY(not_yet(e, set, st));
  return dev_tensor_create(e, dtype, component_shapes, out, st);
}

pd_code dev_tensor_create_for_layout_on(dev_engine *e, const dev_devset *set,
                                        pd_dtype dtype,
                                        const dev_layout *layout,
                                        const dev_shape *host_shape,
                                        const dev_shape *component_shapes,
                                        dev_tensor **out, dev_status *st) {
  PD_TRY(not_yet(e, set, st));
  return dev_tensor_create_for_layout(e, dtype, layout, host_shape,
                                      component_shapes, out, st);
}

pd_code dev_tensor_create_pending_on(dev_engine *e, const dev_devset *set,
                                     pd_dtype dtype, const dev_layout *layout,
                                     const dev_shape *host_shape,
                                     const dev_shape *component_shapes,
                                     dev_tensor **out, dev_status *st) {
  PD_TRY(not_yet(e, set, st));
  return dev_tensor_create_pending(e, dtype, layout, host_shape,
                                   component_shapes, out, st);
}

pd_code dev_tensor_from_host_on(dev_engine *e, const dev_devset *set,
                                pd_dtype dtype, const dev_layout *layout,
                                const dev_shape *host_shape, const void *data,
                                dev_tensor **out, dev_status *st) {
  PD_TRY(not_yet(e, set, st));
  return dev_tensor_from_host(e, dtype, layout, host_shape, data, out, st);
}

pd_code dev_op_prepare_on(dev_engine *e, const dev_devset *set,
                          const char *op_name, dev_tensor *const *inputs,
                          int num_inputs, const dev_attr *attrs, int num_attrs,
                          dev_op **out, dev_status *st) {
  PD_TRY(not_yet(e, set, st));
  return dev_op_prepare(e, op_name, inputs, num_inputs, attrs, num_attrs, out,
                        st);
}

const dev_devset *dev_op_devset(const dev_op *op) { return &op->engine->all; }

uint64_t dev_op_device_new_bytes(const dev_op *op, int device) {
  (void)device;
  return op->engine->n ? dev_op_new_bytes(op) / (uint64_t)op->engine->n : 0;
}

pd_code dev_execute_on(dev_engine *e, const dev_devset *set,
                       const char *op_name, dev_tensor *const *inputs,
                       int num_inputs, const dev_attr *attrs, int num_attrs,
                       dev_tensor **outputs, int *num_outputs, dev_status *st) {
  PD_TRY(not_yet(e, set, st));
  return dev_execute(e, op_name, inputs, num_inputs, attrs, num_attrs, outputs,
                     num_outputs, st);
}

pd_code dev_fn_prepare_call_on(dev_fn_lib *lib, const dev_devset *set,
                               const char *name, dev_tensor *const *inputs,
                               int num_inputs, dev_op **out, dev_status *st) {
  if (set && set->n < 1)
    return dev_error(st, PD_INVALID_ARGUMENT, "empty device set");
  if (set && num_inputs > 0 &&
      !dev_devset_equal(set, dev_tensor_devset(inputs[0])))
    return dev_error(st, PD_UNIMPLEMENTED,
                     "placement on a subset of the mesh is not built yet");
  return dev_fn_prepare_call(lib, name, inputs, num_inputs, out, st);
}
