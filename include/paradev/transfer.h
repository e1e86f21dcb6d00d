/* libparadev: moving host values into and out of parallel tensors over the
 * wire (Upload and Download, chunked under the message limit).
 *
 * Part of the API of <paradev/paradev.h>, which includes this header: include
 * that one. Its conventions (statuses, options, ownership, thread safety)
 * hold here; pd_layout and pd_tensor_info are declared there.
 */
#ifndef PARADEV_TRANSFER_H
#define PARADEV_TRANSFER_H

#include "paradev/paradev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Tensors: upload and download */

/* Uploads the host value `data` (`bytes` bytes: the product of dims times
 * pd_dtype_size(dtype)) as the new handle `id`, mirrored or sharded along an
 * axis, on the session's default device set (pd_upload_on chooses one).
 * The value travels in chunks under the message limit. *info (may be
 * NULL) gets the tensor's dtype, overall shape and device set.
 * Errors:   PD_INVALID_ARGUMENT (rank over PD_MAX_RANK, negative dim, `bytes`
 *           that does not match the shape, id 0, layout PER_COMPONENT or
 *           COMPONENT, a sharded axis out of range), PD_ALREADY_EXISTS (a
 *           live id), PD_RESOURCE_EXHAUSTED (max_tensor_bytes, device memory
 *           or the session's quota), PD_NOT_FOUND (session gone), transport
 *           errors.
 * Thread safety: thread-safe; `data` must not change during the call.
 * Source: paradev.v1.ParallelDevice/Upload; TensorFlow's parallel device's
 *         mirrored and sharded tensors. */
pd_code pd_upload(pd_session *s, uint64_t id, pd_dtype dtype,
                  const int64_t *dims, int rank, const void *data, size_t bytes,
                  pd_layout layout, pd_tensor_info *info,
                  const pd_call_options *call, pd_status *st);

/* Uploads one host value per component (layout PER_COMPONENT), on the
 * session's default device set: num_components must be
 * pd_session_num_devices(s); component i has shape
 * dims[i][0..ranks[i]) and `bytes[i]` bytes at data[i]. Shapes may differ
 * (the overall shape then has -1 on those axes).
 * Errors:   as pd_upload, plus PD_INVALID_ARGUMENT for a wrong count.
 * Source: paradev.v1.ParallelDevice/Upload (PER_COMPONENT);
 *         TensorFlow's ParallelTensor::FromTensorHandles. */
pd_code pd_upload_components(pd_session *s, uint64_t id, pd_dtype dtype,
                             int num_components, const int64_t *const *dims,
                             const int *ranks, const void *const *data,
                             const size_t *bytes, pd_tensor_info *info,
                             const pd_call_options *call, pd_status *st);

/* pd_upload and pd_upload_components on a chosen device set (issue #17):
 * devices[0..n_devices) are daemon device indices in component order
 * (component i is placed on devices[i]; NULL / 0: the session's default,
 * pd_session_devices). SHARDED splits over n_devices; PER_COMPONENT takes
 * num_components == n_devices values (n_devices 0: the session's count).
 * *info's devices give the set the daemon placed the tensor on.
 * The library checks only the list itself (n_devices within
 * 0..PD_MAX_DEVICES, devices given when n_devices > 0); which devices are
 * valid is the daemon's to say.
 * Errors:   as pd_upload / pd_upload_components, plus PD_INVALID_ARGUMENT
 *           (n_devices out of 0..PD_MAX_DEVICES, devices NULL with
 *           n_devices > 0, a device out of the daemon's range or named
 *           twice, a component count that is not the set's size),
 *           PD_PERMISSION_DENIED (a device outside the session's allowed
 *           set: the message names the devices), PD_UNIMPLEMENTED (a daemon
 *           that places tensors only on its whole mesh).
 * Thread safety: thread-safe; the arrays must not change during the call.
 * Source: UploadHeader.devices of paradev.v1; TensorFlow's parallel device
 *         built over a chosen list of underlying devices. */
pd_code pd_upload_on(pd_session *s, const int32_t *devices, int n_devices,
                     uint64_t id, pd_dtype dtype, const int64_t *dims, int rank,
                     const void *data, size_t bytes, pd_layout layout,
                     pd_tensor_info *info, const pd_call_options *call,
                     pd_status *st);
pd_code pd_upload_components_on(pd_session *s, const int32_t *devices,
                                int n_devices, uint64_t id, pd_dtype dtype,
                                int num_components, const int64_t *const *dims,
                                const int *ranks, const void *const *data,
                                const size_t *bytes, pd_tensor_info *info,
                                const pd_call_options *call, pd_status *st);

/* Downloads handle `id` into `data` (capacity `capacity` bytes), waiting until
 * it is computed. Layout MIRRORED gives component 0 (for a tensor that is
 * the same on every device), COMPONENT the chosen
 * component, SHARDED the concatenation of all components along `axis`.
 * *info (may be NULL) gets the dtype and host shape of what was written;
 * *bytes_out (may be NULL) its size.
 * Errors:   PD_OUT_OF_RANGE (`capacity` is smaller than the value: the message
 *           gives the size needed), PD_INVALID_ARGUMENT (layout
 *           PER_COMPONENT: use pd_download_components; PD_LAYOUT_UNSPECIFIED,
 *           a zeroed pd_layout: the daemon never guesses; MIRRORED of a
 *           tensor uploaded SHARDED or PER_COMPONENT, computed from one
 *           (short of an AllReduce, Broadcast or AllGather), or whose
 *           components differ in shape; a component out of range; components that
 *           cannot be concatenated), PD_NOT_FOUND
 *           (unknown id), the error stored on a tensor whose op failed (e.g.
 *           PD_RESOURCE_EXHAUSTED), transport errors.
 * Thread safety: thread-safe.
 * Source: paradev.v1.ParallelDevice/Download. */
pd_code pd_download(pd_session *s, uint64_t id, pd_layout layout, void *data,
                    size_t capacity, pd_tensor_info *info, size_t *bytes_out,
                    const pd_call_options *call, pd_status *st);

/* Downloads every component: num_components must be the tensor's number of
 * components, the size of its device set (pd_session_num_devices(s) for a
 * tensor on the session's default; 1..PD_MAX_DEVICES); component i goes to
 * data[i] (capacity capacity[i]); infos (may be NULL; num_components
 * entries) get each component's host shape.
 * Errors:   as pd_download, plus PD_INVALID_ARGUMENT (num_components out of
 *           1..PD_MAX_DEVICES, or not the tensor's component count: the
 *           message gives it; nothing was written).
 * Source: paradev.v1.ParallelDevice/Download (PER_COMPONENT). */
pd_code pd_download_components(pd_session *s, uint64_t id, int num_components,
                               void *const *data, const size_t *capacity,
                               pd_tensor_info *infos,
                               const pd_call_options *call, pd_status *st);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_TRANSFER_H */
