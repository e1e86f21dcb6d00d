/* Tenants' accounts (issue #14): the sessions and bytes of every session of
 * one tenant together, checked against the tenant's limits. An account is
 * made at its tenant's first session and kept until sched_destroy (tenants
 * are few and named by the configuration), so a session may point at it
 * without a reference count. The list, `sessions` and `max_sessions` are
 * under sched.mu; `bytes` and `quota` are atomics, updated under the
 * session's mu that changes them (several sessions of one tenant update
 * the sum at once; two of them passing the check at the same moment may
 * overshoot the quota by one op's bytes, as the check and the charge are
 * not one step across sessions). Calls no other scheduler file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

static sched_tenant *sched_tenant_find_locked(sched *s, const char *name) {
  for (sched_tenant *tn = s->tenants; tn; tn = tn->next)
    if (strcmp(tn->name, name) == 0) return tn;
  return NULL;
}

/* The account of `name`, made when missing (sched.mu held). */
static pd_code sched_tenant_get_locked(sched *s, const char *name,
                                       sched_tenant **out, dev_status *st) {
  sched_tenant *tn = sched_tenant_find_locked(s, name);
  if (!tn) {
    size_t len = strlen(name);
    if (len == 0 || len > SCHED_NAME_MAX)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "tenant name is %zu bytes; expected 1 to %d", len,
                       SCHED_NAME_MAX);
    tn = calloc(1, sizeof(*tn));
    if (!tn) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    memcpy(tn->name, name, len + 1);
    atomic_init(&tn->bytes, 0);
    atomic_init(&tn->quota, 0);
    tn->roots = s->cfg.storage_roots;
    tn->next = s->tenants;
    s->tenants = tn;
  }
  *out = tn;
  return PD_OK;
}

pd_code sched_tenant_configure(sched *s, const char *tenant,
                               const sched_tenant_limits *lim, dev_status *st) {
  pthread_mutex_lock(&s->mu);
  sched_tenant *tn = NULL;
  pd_code c = sched_tenant_get_locked(s, tenant ? tenant : "", &tn, st);
  if (c == PD_OK) {
    tn->max_sessions = lim->max_sessions;
    atomic_store(&tn->quota, lim->memory_quota);
    tn->roots = lim->storage_roots ? lim->storage_roots : s->cfg.storage_roots;
  }
  pthread_mutex_unlock(&s->mu);
  return c;
}

pd_code sched_tenant_join_locked(sched *s, sched_session *ss, dev_status *st) {
  sched_tenant *tn = NULL;
  PD_TRY(sched_tenant_get_locked(s, ss->tenant, &tn, st));
  if (tn->max_sessions > 0 && tn->sessions >= tn->max_sessions)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "tenant \"%s\" holds %d sessions; its limit "
                     "max_sessions is %d: close one or wait for a lease to "
                     "end",
                     tn->name, tn->sessions, tn->max_sessions);
  tn->sessions++;
  ss->tn = tn;
  ss->in_tenant = true;
  ss->roots = tn->roots;
  return PD_OK;
}

pd_code sched_tenant_roots_note(const sched *s, const sched_session *ss,
                                pd_code c, dev_status *st) {
  const sched_tenant *tn = ss->tn;
  if (c != PD_PERMISSION_DENIED || !tn || ss->roots == s->cfg.storage_roots)
    return c;
  size_t n = strlen(st->msg);
  snprintf(st->msg + n, sizeof(st->msg) - n,
           "; tenant \"%s\" may use only its own roots ([tenant %s] "
           "storage_roots), not every [storage] root",
           tn->name, tn->name);
  return c;
}

void sched_tenant_leave_locked(sched_tenant *tn) {
  if (tn && tn->sessions > 0) tn->sessions--;
}

pd_code sched_tenant_room(const sched_tenant *tn, uint64_t extra_bytes,
                          dev_status *st) {
  uint64_t quota = atomic_load(&tn->quota);
  uint64_t held = atomic_load(&tn->bytes);
  if (quota && (extra_bytes > quota || held > quota - extra_bytes))
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "tenant \"%s\" memory quota exceeded: %llu bytes held "
                     "by its sessions + %llu new > memory_quota %llu bytes",
                     tn->name, (unsigned long long)held,
                     (unsigned long long)extra_bytes,
                     (unsigned long long)quota);
  return PD_OK;
}

void sched_tenant_charge(sched_tenant *tn, uint64_t add, uint64_t sub) {
  if (!tn) return;
  if (add) atomic_fetch_add(&tn->bytes, add);
  if (sub) atomic_fetch_sub(&tn->bytes, sub);
}

void sched_tenants_free(sched *s) {
  sched_tenant *tn = s->tenants;
  while (tn) {
    sched_tenant *next = tn->next;
    free(tn);
    tn = next;
  }
  s->tenants = NULL;
}

void sched_tenant_usage(sched *s, const char *tenant, int *sessions,
                        uint64_t *bytes) {
  pthread_mutex_lock(&s->mu);
  sched_tenant *tn = tenant ? sched_tenant_find_locked(s, tenant) : NULL;
  if (sessions) *sessions = tn ? tn->sessions : 0;
  if (bytes) *bytes = tn ? atomic_load(&tn->bytes) : 0;
  pthread_mutex_unlock(&s->mu);
}
