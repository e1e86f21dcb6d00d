/* libparadev: encoding shared by Execute, batches and streams (an op into
 * its wire Operation and its placement, the checks of a list of ids and of
 * a device list) and decoding wire TensorInfo (with its device set) and
 * Shape. */
#include "check.h"
#include "client_int.h"

/* --- op encoding ------------------------------------------------------------ */

pd_code pdc_op_build(Paradev__V1__Operation *op, pd_session *s,
                     const char *name, const uint64_t *inputs, int n_inputs,
                     const pd_attrs *attrs, uint64_t *output_ids, int n_outputs,
                     pd_status *st) {
  paradev__v1__operation__init(op);
  if (!name || !*name)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "the op name is empty; expected a raw-op name such as "
                     "\"Add\"");
  if (n_inputs < 0 || (n_inputs > 0 && !inputs))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "op %.64s: %d inputs (with inputs %s); expected n_inputs "
                     ">= 0 and the ids",
                     name, n_inputs, inputs ? "given" : "NULL");
  if (n_outputs < 0 || (n_outputs > 0 && !output_ids))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "op %.64s: %d outputs (with output_ids %s); expected "
                     "n_outputs >= 0 and an array for the ids",
                     name, n_outputs, output_ids ? "given" : "NULL");
  Paradev__V1__Attr **wire = NULL;
  size_t n_attrs = 0;
  const char *attrs_err = "";
  pd_code bad =
      attrs ? pdc_attrs_encoded(attrs, &wire, &n_attrs, &attrs_err) : PD_OK;
  if (bad != PD_OK) return pdc_error(st, bad, "op %.64s: %s", name, attrs_err);
  for (int i = 0; i < n_outputs; i++)
    if (output_ids[i] == 0) output_ids[i] = pd_session_new_id(s);
  op->op = (char *)name;
  op->n_inputs = (size_t)n_inputs;
  op->inputs = (uint64_t *)inputs;
  op->n_output_ids = (size_t)n_outputs;
  op->output_ids = output_ids;
  if (n_attrs) {
    op->n_attrs = n_attrs;
    op->attrs = wire;
  }
  return PD_OK;
}

bool pdc_shape_from_pb(const Paradev__V1__Shape *sh, pd_tensor_info *out) {
  size_t rank = sh ? sh->n_dims : 0;
  if (rank > PD_MAX_RANK) return false;
  out->rank = (int)rank;
  for (size_t i = 0; i < rank; i++) out->dims[i] = sh->dims[i];
  for (size_t i = rank; i < PD_MAX_RANK; i++) out->dims[i] = 0;
  return true;
}

bool pdc_devices_from_pb(const int32_t *devices, size_t n,
                         pd_tensor_info *out) {
  if (n > PD_MAX_DEVICES) return false;
  out->num_devices = (int)n;
  for (size_t i = 0; i < n; i++) out->devices[i] = devices[i];
  for (size_t i = n; i < PD_MAX_DEVICES; i++) out->devices[i] = 0;
  return true;
}

bool pdc_info_from_pb(const Paradev__V1__TensorInfo *ti, pd_tensor_info *out) {
  if (!ti) return false;
  pd_tensor_info t;
  t.id = ti->id;
  t.dtype = (pd_dtype)ti->dtype;
  if (!pdc_shape_from_pb(ti->shape, &t)) return false;
  if (!pdc_devices_from_pb(ti->devices, ti->n_devices, &t)) return false;
  *out = t;
  return true;
}

pd_code pdc_op_place(Paradev__V1__Operation *op, const int32_t *devices,
                     int n_devices, pd_status *st) {
  PD_TRY(pdc_check_devices(devices, n_devices, op->op ? op->op : "op", st));
  op->n_devices = (size_t)n_devices;
  op->devices = n_devices ? (int32_t *)devices : NULL;
  return PD_OK;
}

pd_code pdc_check_ids(const uint64_t *ids, int n, pd_status *st) {
  if (n < 0 || (n > 0 && !ids))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%d ids (ids %s); expected n >= 0 and the ids", n,
                     ids ? "given" : "NULL");
  return PD_OK;
}
