/* Placement (issue #17): a session's allowed device set, made at its
 * creation from what the client asked for and what its job or tenant was
 * allocated, and the check that a tensor is placed within it. No scheduler
 * calls (a leaf, as htab.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_int.h"

/* The devices of `set` that are not in `allowed`, as a set (n may be 0). */
static void devset_outside(const dev_devset *set, const dev_devset *allowed,
                           dev_devset *out) {
  out->n = 0;
  for (int i = 0; i < set->n; i++)
    if (dev_devset_index(allowed, set->dev[i]) < 0)
      out->dev[out->n++] = set->dev[i];
}

pd_code sched_devset_within(const dev_devset *set, const dev_devset *allowed,
                            const char *allowed_what, dev_status *st) {
  dev_devset out;
  devset_outside(set, allowed, &out);
  if (out.n == 0) return PD_OK;
  char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
  dev_devset_str(&out, a, sizeof a);
  dev_devset_str(allowed, b, sizeof b);
  return dev_error(st, PD_PERMISSION_DENIED, "%s %s %s outside %s %s",
                   out.n == 1 ? "device" : "devices", a,
                   out.n == 1 ? "is" : "are", allowed_what, b);
}

pd_code sched_devset_check(const sched *s, const dev_devset *set,
                           dev_devset *out, dev_status *st) {
  int64_t devs[PD_MAX_DEVICES];
  int n = set->n;
  if (n < 1 || n > PD_MAX_DEVICES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a device set of %d devices; expected 1 to %d", n,
                     dev_engine_num_devices(s->engine));
  for (int i = 0; i < n; i++) devs[i] = set->dev[i];
  return dev_devset_make(s->engine, devs, n, out, st);
}

pd_code sched_session_allowed(const sched *s, const sched_session_params *p,
                              dev_devset *out, dev_status *st) {
  dev_devset bound;
  if (p->bound)
    PD_TRY(sched_devset_check(s, p->bound, &bound, st));
  else
    dev_devset_all(s->engine, &bound);
  if (!p->devices) {
    *out = bound;
    return PD_OK;
  }
  PD_TRY(sched_devset_check(s, p->devices, out, st));
  if (p->bound)
    return sched_devset_within(out, &bound, "the job's allocation", st);
  return PD_OK;
}

pd_code sched_placement_check(const sched_session *ss, const dev_devset *set,
                              dev_status *st) {
  return sched_devset_within(set, &ss->devices, "the session's allowed devices",
                             st);
}

pd_code sched_place(const sched_session *ss, const dev_devset *want,
                    dev_devset *out, dev_status *st) {
  if (!want) {
    *out = ss->devices;
    return PD_OK;
  }
  PD_TRY(sched_devset_check(ss->owner, want, out, st));
  return sched_placement_check(ss, out, st);
}

const dev_devset *sched_session_devices(const sched_session *ss) {
  return &ss->devices;
}

/* The components a PER_COMPONENT save wrote of `name` in ix: its metadata
 * "paradev.components.<name>", else the entries "<name>:0", "<name>:1",
 * ... present. */
static int saved_components(const stg_index *ix, const char *name) {
  char key[SCHED_NAME_MAX + 32];
  snprintf(key, sizeof key, "paradev.components.%s", name);
  for (int i = 0; i < ix->n_meta; i++) {
    if (strcmp(ix->meta_keys[i], key) != 0) continue;
    char *end = NULL;
    long v = strtol(ix->meta_values[i], &end, 10);
    if (end != ix->meta_values[i] && *end == '\0' && v > 0 && v < 1000000)
      return (int)v;
  }
  int k = 0;
  for (;; k++) {
    snprintf(key, sizeof key, "%s:%d", name, k);
    if (!stg_index_find(ix, key)) return k;
  }
}

pd_code sched_components_check(const stg_index *ix, const char *file,
                               const char *name, const dev_devset *set,
                               dev_status *st) {
  int k = saved_components(ix, name);
  if (k == 0 || k == set->n) return PD_OK; /* none: the entry's NOT_FOUND */
  char sb[DEV_DEVSET_STR_MAX];
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "'%s' was saved with %d components in %s; the device set "
                   "%s has %d (load it per component on a set of %d "
                   "devices, or by another layout)",
                   name, k, file, dev_devset_str(set, sb, sizeof sb), set->n,
                   k);
}
