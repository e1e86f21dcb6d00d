/* PLACEHOLDER (issue #17 contract): the scheduler's placement entry points
 * over the whole mesh only. The scheduler helper deletes this file (and its
 * line in CMakeLists.txt). */
#include "sched_int.h"

const dev_devset *sched_session_devices(const sched_session *ss) {
  static _Thread_local dev_devset all;
  dev_devset_all(ss->owner->engine, &all);
  return &all;
}

pd_code sched_upload_begin_on(sched_session *ss, uint64_t id,
                              const dev_devset *devices, pd_dtype dtype,
                              const dev_layout *layout,
                              const dev_shape *host_shape,
                              const dev_shape *component_shapes,
                              sched_upload **out, dev_status *st) {
  if (devices && !dev_devset_is_all(ss->owner->engine, devices))
    return dev_error(st, PD_UNIMPLEMENTED,
                     "placement on a subset of the mesh is not built yet");
  return sched_upload_begin(ss, id, dtype, layout, host_shape, component_shapes,
                            out, st);
}
