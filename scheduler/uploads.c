/* Uploads: a tensor created for a new handle, filled chunk by chunk, then
 * published under its id (or dropped). The upload holds a reference on its
 * session; the id is checked when it begins and again when it commits. */
#include <stdlib.h>

#include "sched_int.h"

struct sched_upload {
  sched_session *ss;
  uint64_t id;
  dev_tensor *t;
  dev_layout layout;
};

/* The session is open, `id` free, and `bytes` more fit (ss->mu held). */
static pd_code sched_upload_check_locked(sched_session *ss, uint64_t id,
                                         uint64_t bytes, dev_status *st) {
  if (ss->closed) return sched_closed_error(ss, st);
  if (sched_htab_find(&ss->handles, id))
    return dev_error(st, PD_ALREADY_EXISTS,
                     "handle %llu is already live in this session",
                     (unsigned long long)id);
  return sched_check_room_locked(ss, 1, bytes, st);
}

pd_code sched_upload_begin(sched_session *ss, uint64_t id, pd_dtype dtype,
                           const dev_layout *layout,
                           const dev_shape *host_shape,
                           const dev_shape *component_shapes,
                           sched_upload **out, dev_status *st) {
  return sched_upload_begin_on(ss, id, NULL, dtype, layout, host_shape,
                               component_shapes, out, st);
}

pd_code sched_upload_begin_on(sched_session *ss, uint64_t id,
                              const dev_devset *devices, pd_dtype dtype,
                              const dev_layout *layout,
                              const dev_shape *host_shape,
                              const dev_shape *component_shapes,
                              sched_upload **out, dev_status *st) {
  if (id == 0)
    return dev_error(st, PD_INVALID_ARGUMENT, "handle id 0 is reserved");
  /* Where (issue #17): the session's default, else a checked set within
   * its allowed one, decided before the engine sees it. */
  dev_devset set;
  PD_TRY(sched_place(ss, devices, &set, st));
  pthread_mutex_lock(&ss->mu);
  pd_code c = sched_upload_check_locked(ss, id, 0, st);
  pthread_mutex_unlock(&ss->mu);
  if (c != PD_OK) return c;

  dev_tensor *t = NULL;
  PD_TRY(dev_tensor_create_for_layout_on(ss->owner->engine, &set, dtype, layout,
                                         host_shape, component_shapes, &t, st));
  pthread_mutex_lock(&ss->mu);
  c = sched_check_room_locked(ss, 1, dev_tensor_bytes(t), st);
  pthread_mutex_unlock(&ss->mu);
  if (c != PD_OK) {
    dev_tensor_release(t);
    return c;
  }
  sched_upload *u = calloc(1, sizeof(*u));
  if (!u) {
    dev_tensor_release(t);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  sched_session_ref(ss);
  u->ss = ss;
  u->id = id;
  u->t = t;
  u->layout = *layout;
  *out = u;
  return PD_OK;
}

uint64_t sched_upload_expected(const sched_upload *u, int component) {
  uint64_t bytes = 0;
  if (dev_tensor_host_size(u->t, &u->layout, component, NULL, &bytes, NULL) !=
      PD_OK)
    return 0;
  return bytes;
}

pd_code sched_upload_write(sched_upload *u, int component, uint64_t offset,
                           const void *data, size_t len, dev_status *st) {
  return dev_tensor_write(u->t, &u->layout, component, offset, data, len, st);
}

const dev_tensor *sched_upload_tensor(const sched_upload *u) { return u->t; }

pd_code sched_upload_commit(sched_upload *u, dev_status *st) {
  sched_session *ss = u->ss;
  uint64_t bytes = dev_tensor_bytes(u->t);
  pthread_mutex_lock(&ss->mu);
  pd_code c = sched_upload_check_locked(ss, u->id, bytes, st);
  if (c == PD_OK) {
    if (sched_htab_insert(&ss->handles, u->id, u->t, bytes, NULL)) {
      sched_charge_tensor_locked(ss, u->t, bytes, true);
      u->t = NULL; /* the table owns it now */
    } else {
      c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    }
  }
  pthread_mutex_unlock(&ss->mu);
  sched_upload_abort(u);
  return c;
}

void sched_upload_abort(sched_upload *u) {
  if (!u) return;
  dev_tensor_release(u->t);
  sched_session_put(u->ss);
  free(u);
}
