/* PLACEHOLDER (issue #17 contract): libparadev's placement entry points,
 * until the client helper builds them. Deleted then. */
#include "client_int.h"

static pd_code later(pd_status *st) {
  return pdc_error(st, PD_UNIMPLEMENTED, "placement is not built yet");
}

int pd_session_devices(const pd_session *s, int32_t *out, int cap) {
  (void)s, (void)out, (void)cap;
  return 0;
}

pd_code pd_execute_on(pd_session *s, const int32_t *devices, int n_devices,
                      const char *op, const uint64_t *inputs, int n_inputs,
                      const pd_attrs *attrs, uint64_t *output_ids,
                      int n_outputs, pd_tensor_info *outputs,
                      const pd_call_options *call, pd_status *st) {
  if (!devices || n_devices == 0)
    return pd_execute(s, op, inputs, n_inputs, attrs, output_ids, n_outputs,
                      outputs, call, st);
  return later(st);
}

pd_code pd_batch_add_on(pd_batch *b, pd_session *s, const int32_t *devices,
                        int n_devices, const char *op, const uint64_t *inputs,
                        int n_inputs, const pd_attrs *attrs,
                        uint64_t *output_ids, int n_outputs, pd_status *st) {
  if (!devices || n_devices == 0)
    return pd_batch_add(b, s, op, inputs, n_inputs, attrs, output_ids,
                        n_outputs, st);
  return later(st);
}

int pd_description_devices(const pd_description *d, int i, int32_t *out,
                           int cap) {
  (void)d, (void)i, (void)out, (void)cap;
  return 0;
}

pd_code pd_upload_on(pd_session *s, const int32_t *devices, int n_devices,
                     uint64_t id, pd_dtype dtype, const int64_t *dims, int rank,
                     const void *data, size_t bytes, pd_layout layout,
                     pd_tensor_info *info, const pd_call_options *call,
                     pd_status *st) {
  if (!devices || n_devices == 0)
    return pd_upload(s, id, dtype, dims, rank, data, bytes, layout, info, call,
                     st);
  return later(st);
}

pd_code pd_upload_components_on(pd_session *s, const int32_t *devices,
                                int n_devices, uint64_t id, pd_dtype dtype,
                                int num_components, const int64_t *const *dims,
                                const int *ranks, const void *const *data,
                                const size_t *bytes, pd_tensor_info *info,
                                const pd_call_options *call, pd_status *st) {
  if (!devices || n_devices == 0)
    return pd_upload_components(s, id, dtype, num_components, dims, ranks, data,
                                bytes, info, call, st);
  return later(st);
}
