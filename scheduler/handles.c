/* A session's handles: lookup, deletion, usage, the room checks against the
 * handle limit and the memory quota, collecting references (Sync, Download)
 * and releasing everything a session holds when it ends. The table itself
 * is htab.c; every function here runs under the session's mu. */
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

pd_code sched_closed_error(const sched_session *ss, dev_status *st) {
  if (ss->end_code != PD_OK) /* the daemon ended it: say why */
    return dev_error(st, ss->end_code, "session not found: it was ended: %s",
                     ss->end_msg);
  return dev_error(st, PD_NOT_FOUND,
                   "session not found: closed or lease expired during the "
                   "call");
}

pd_code sched_not_found(uint64_t id, dev_status *st) {
  return dev_error(st, PD_NOT_FOUND,
                   "handle %llu not found in this session (never created, "
                   "deleted, or another session's)",
                   (unsigned long long)id);
}

pd_code sched_handle_get(sched_session *ss, uint64_t id, dev_tensor **out,
                         dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  pd_code c = PD_OK;
  sched_slot *sl = NULL;
  if (ss->closed) {
    c = sched_closed_error(ss, st);
  } else if ((sl = sched_htab_find(&ss->handles, id)) == NULL) {
    c = sched_not_found(id, st);
  } else {
    dev_tensor_retain(sl->t);
    *out = sl->t;
  }
  pthread_mutex_unlock(&ss->mu);
  return c;
}

/* Every id live and none twice (ss->mu held). */
static pd_code sched_check_delete_locked(sched_session *ss, const uint64_t *ids,
                                         int n, dev_status *st) {
  if (ss->closed) return sched_closed_error(ss, st);
  for (int i = 0; i < n; i++) {
    if (!sched_htab_find(&ss->handles, ids[i]))
      return sched_not_found(ids[i], st);
    for (int j = 0; j < i; j++)
      if (ids[j] == ids[i])
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "handle %llu is listed twice (positions %d and %d)",
                         (unsigned long long)ids[i], j, i);
  }
  return PD_OK;
}

pd_code sched_handle_delete(sched_session *ss, const uint64_t *ids, int n,
                            dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  pd_code c = sched_check_delete_locked(ss, ids, n, st);
  for (int i = 0; c == PD_OK && i < n; i++) {
    sched_slot *sl = sched_htab_find(&ss->handles, ids[i]);
    dev_tensor *t = sl->t;
    if (sl->ch) /* shared: refunded by the last holder (issue #17) */
      sched_charges_put_locked(ss, t, sl->ch);
    else
      sched_charge_tensor_locked(ss, t, sl->bytes, false);
    sched_htab_remove(&ss->handles, sl);
    dev_tensor_release(t);
  }
  pthread_mutex_unlock(&ss->mu);
  return c;
}

void sched_session_usage(sched_session *ss, int *handles, uint64_t *bytes) {
  pthread_mutex_lock(&ss->mu);
  if (handles) *handles = (int)ss->handles.live;
  if (bytes) *bytes = ss->bytes;
  pthread_mutex_unlock(&ss->mu);
}

pd_code sched_check_room_locked(sched_session *ss, int extra_handles,
                                uint64_t extra_bytes, dev_status *st) {
  sched *s = ss->owner;
  int max_handles = SCHED_LIM(s, max_handles);
  if (ss->handles.live + (size_t)extra_handles > (size_t)max_handles)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the session would hold %zu handles; the limit "
                     "max_handles_per_session is %d (delete some)",
                     ss->handles.live + (size_t)extra_handles, max_handles);
  if (ss->quota &&
      (extra_bytes > ss->quota || ss->bytes > ss->quota - extra_bytes))
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "session memory quota exceeded: %llu bytes held + %llu "
                     "new > quota %llu bytes",
                     (unsigned long long)ss->bytes,
                     (unsigned long long)extra_bytes,
                     (unsigned long long)ss->quota);
  if (ss->tn) return sched_tenant_room(ss->tn, extra_bytes, st);
  return PD_OK;
}

void sched_charge_locked(sched_session *ss, uint64_t add, uint64_t sub) {
  ss->bytes += add;
  ss->bytes -= sub;
  sched_tenant_charge(ss->tn, add, sub);
}

void sched_charge_tensor_locked(sched_session *ss, const dev_tensor *t,
                                uint64_t bytes, bool add) {
  sched_charge_locked(ss, add ? bytes : 0, add ? 0 : bytes);
  const dev_devset *set = dev_tensor_devset(t);
  for (int i = 0; i < set->n; i++) {
    uint64_t b = dev_tensor_device_bytes(t, set->dev[i]);
    if (add)
      atomic_fetch_add_explicit(&ss->dev_bytes[set->dev[i]], b,
                                memory_order_relaxed);
    else
      atomic_fetch_sub_explicit(&ss->dev_bytes[set->dev[i]], b,
                                memory_order_relaxed);
  }
}

/* --- shared charges (issue #17: the charge follows the buffer) ----------- */

sched_charge *sched_charge_new(const dev_tensor *t, int comp, bool charged) {
  sched_charge *r = malloc(sizeof(*r));
  if (!r) return NULL;
  int dev = dev_tensor_devset(t)->dev[comp];
  *r = (sched_charge){1, dev, charged, dev_tensor_device_bytes(t, dev)};
  return r;
}

sched_charge **sched_charges_new(const dev_tensor *t, bool charged) {
  int n = dev_tensor_num_components(t);
  sched_charge **ch = calloc((size_t)n, sizeof(*ch));
  for (int c = 0; ch && c < n; c++) {
    if ((ch[c] = sched_charge_new(t, c, charged)) != NULL) continue;
    while (c-- > 0) free(ch[c]);
    free(ch);
    return NULL;
  }
  return ch;
}

/* Counts (add) or refunds one record in the session, its tenant and its
 * device. */
static void sched_charge_rec_locked(sched_session *ss, const sched_charge *r,
                                    bool add) {
  sched_charge_locked(ss, add ? r->bytes : 0, add ? 0 : r->bytes);
  if (add)
    atomic_fetch_add_explicit(&ss->dev_bytes[r->dev], r->bytes,
                              memory_order_relaxed);
  else
    atomic_fetch_sub_explicit(&ss->dev_bytes[r->dev], r->bytes,
                              memory_order_relaxed);
}

void sched_charges_charge_locked(sched_session *ss, const dev_tensor *t,
                                 sched_charge **ch) {
  int n = dev_tensor_num_components(t);
  for (int c = 0; c < n; c++)
    if (!ch[c]->charged) {
      ch[c]->charged = true;
      sched_charge_rec_locked(ss, ch[c], true);
    }
}

void sched_charges_put_locked(sched_session *ss, const dev_tensor *t,
                              sched_charge **ch) {
  if (!ch) return;
  int n = dev_tensor_num_components(t);
  for (int c = 0; c < n; c++) {
    sched_charge *r = ch[c];
    if (!r || --r->refs > 0) continue;
    if (r->charged) sched_charge_rec_locked(ss, r, false);
    free(r);
  }
  free(ch);
}

bool sched_slot_share_locked(sched_slot *sl) {
  if (sl->ch) return true;
  if (!(sl->ch = sched_charges_new(sl->t, true))) return false;
  sl->bytes = 0; /* the records hold the same bytes now */
  return true;
}

uint64_t sched_release_all_locked(sched_session *ss) {
  uint64_t n = 0;
  for (size_t i = 0; i < ss->handles.cap; i++) {
    sched_slot *sl = &ss->handles.slots[i];
    if (sl->id != 0 && sl->t != NULL) {
      sched_charges_put_locked(ss, sl->t, sl->ch);
      dev_tensor_release(sl->t);
      n++;
    }
  }
  free(ss->handles.slots);
  memset(&ss->handles, 0, sizeof(ss->handles));
  sched_charge_locked(ss, 0, ss->bytes);
  for (int d = 0; d < PD_MAX_DEVICES; d++) atomic_store(&ss->dev_bytes[d], 0);
  /* Tapes hold references to what they recorded: release them too. */
  for (int i = 0; i < ss->num_tapes; i++) dev_tape_destroy(ss->tapes[i].tape);
  free(ss->tapes);
  ss->tapes = NULL;
  ss->num_tapes = ss->cap_tapes = 0;
  ss->closed = true;
  return n;
}

/* Fills list[] with ids[0..n) (n == 0: every live handle), borrowed
 * (ss->mu held); *k gets the number. */
static pd_code sched_collect_locked(sched_session *ss, const uint64_t *ids,
                                    int n, sched_ref *list, size_t *k,
                                    dev_status *st) {
  *k = 0;
  if (n > 0) {
    for (int i = 0; i < n; i++) {
      sched_slot *sl = sched_htab_find(&ss->handles, ids[i]);
      if (!sl) return sched_not_found(ids[i], st);
      list[(*k)++] = (sched_ref){ids[i], sl->t};
    }
    return PD_OK;
  }
  for (size_t i = 0; i < ss->handles.cap; i++) {
    sched_slot *sl = &ss->handles.slots[i];
    if (sl->id != 0 && sl->t != NULL) list[(*k)++] = (sched_ref){sl->id, sl->t};
  }
  return PD_OK;
}

pd_code sched_collect(sched_session *ss, const uint64_t *ids, int n,
                      sched_ref **out, size_t *count, dev_status *st) {
  pthread_mutex_lock(&ss->mu);
  if (ss->closed) {
    pthread_mutex_unlock(&ss->mu);
    return sched_closed_error(ss, st);
  }
  size_t cnt = n > 0 ? (size_t)n : ss->handles.live;
  sched_ref *list = calloc(cnt ? cnt : 1, sizeof(*list));
  if (!list) {
    pthread_mutex_unlock(&ss->mu);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  size_t k = 0;
  pd_code c = sched_collect_locked(ss, ids, n, list, &k, st);
  if (c == PD_OK)
    for (size_t i = 0; i < k; i++) dev_tensor_retain(list[i].t);
  pthread_mutex_unlock(&ss->mu);
  if (c != PD_OK) {
    free(list);
    return c;
  }
  *out = list;
  *count = k;
  return PD_OK;
}

void sched_refs_release(sched_ref *refs, size_t count) {
  for (size_t i = 0; refs && i < count; i++) dev_tensor_release(refs[i].t);
  free(refs);
}
