/* Shared memory regions and their registry (see shm_int.h: lifetime,
 * limits): references, retirement against running copies, lookups, the
 * room a new region may take, the end of a session, and start and stop. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "check.h"
#include "log.h"
#include "shm_int.h"

/* --- regions ----------------------------------------------------------------- */

/* Unpins and unmaps the mapping and closes the object. Only when no copy
 * can run: retired with none running, or the last reference gone. */
static void srv_shm_region_release(srv_shm_region *r) {
  if (r->pinned) dev_engine_host_unregister(r->engine, r->base);
  r->pinned = false;
  if (r->base) munmap(r->base, r->size);
  r->base = NULL;
  if (r->fd >= 0) close(r->fd);
  r->fd = -1;
}

void srv_shm_region_unref(srv_shm_region *r) {
  if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
  srv_shm_region_release(r);
  pthread_cond_destroy(&r->cv);
  pthread_mutex_destroy(&r->mu);
  free(r->name);
  free(r->key);
  free(r);
}

/* Retires a region that has left the registry: no copy starts on it any
 * more, the ones running finish first, then it is unmapped. Transfers that
 * still hold it keep only the struct. Blocks for as long as a copy runs. */
void srv_shm_retire(srv_shm_region *r, bool session_ended) {
  pthread_mutex_lock(&r->mu);
  r->retired = true;
  r->session_ended = session_ended;
  while (r->copying > 0) pthread_cond_wait(&r->cv, &r->mu);
  srv_shm_region_release(r);
  pthread_mutex_unlock(&r->mu);
}

/* Admits one copy: CANCELLED once the region is retired (the transfer found
 * it registered, but it was unregistered before the copy began). */
static pd_code srv_shm_copy_begin(srv_shm_region *r, bool reading,
                                  dev_status *st) {
  pthread_mutex_lock(&r->mu);
  bool retired = r->retired, ended = r->session_ended;
  if (!retired) r->copying++;
  pthread_mutex_unlock(&r->mu);
  if (!retired) return PD_OK;
  return dev_error(st, PD_CANCELLED,
                   "shared memory region \"%.128s\" was unregistered%s "
                   "before the %s could %s it; nothing was %s",
                   r->name, ended ? " (its session ended)" : "",
                   reading ? "upload" : "download", reading ? "read" : "write",
                   reading ? "read" : "written");
}

static void srv_shm_copy_end(srv_shm_region *r) {
  pthread_mutex_lock(&r->mu);
  if (--r->copying == 0 && r->retired) pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* The regions one session registered: the state the registry attaches to
 * the session (sched_session_attach) and gets back when it ends. Read and
 * written under srv_shm.mu, which also keeps it alive against on_end. */
typedef struct srv_shm_sess {
  srv_shm_region *head; /* linked through next */
  int count;
  uint64_t bytes;
} srv_shm_sess;

/* The session's state (NULL: none yet, or the session ended); h->mu held. */
static srv_shm_sess *srv_shm_sess_of(srv_shm *h, sched_session *ss) {
  return sched_session_attached(ss, h->key);
}

/* The scheduler's end-of-session event: every region of the session is
 * retired (unmapped once the copies running now are done) and the state
 * freed, whatever the reason (close, expiry, kill, daemon stop). */
static void srv_shm_on_end(void *arg, const sched_end_info *info, void *state) {
  srv_shm *h = arg;
  srv_shm_sess *x = state;
  if (!x) return;
  pthread_mutex_lock(&h->mu); /* no call still uses x after this */
  srv_shm_region *gone = x->head;
  h->count -= (uint64_t)x->count;
  h->bytes -= x->bytes;
  pthread_mutex_unlock(&h->mu);
  free(x);
  while (gone) {
    srv_shm_region *r = gone;
    gone = r->next;
    char name[129];
    SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_DEBUG,
               "session %" PRIu64
               " %s: shared memory region \"%s\" (%s) "
               "unregistered",
               info->session_seq, sched_end_reason_name(info->why),
               srv_log_quote(r->name, name, sizeof name), r->key);
    srv_shm_retire(r, true);
    srv_shm_region_unref(r);
  }
}

void srv_shm_stats(srv *s, uint64_t *regions, uint64_t *bytes) {
  srv_shm *h = s->shm;
  uint64_t n = 0, b = 0;
  if (h) {
    pthread_mutex_lock(&h->mu);
    n = h->count;
    b = h->bytes;
    pthread_mutex_unlock(&h->mu);
  }
  if (regions) *regions = n;
  if (bytes) *bytes = b;
}

pd_code srv_shm_get(srv_shm *h, sched_session *ss, const char *name,
                    srv_shm_region **out, dev_status *st) {
  pthread_mutex_lock(&h->mu);
  srv_shm_sess *x = srv_shm_sess_of(h, ss);
  srv_shm_region *r = x ? x->head : NULL;
  while (r && strcmp(r->name, name) != 0) r = r->next;
  if (r) atomic_fetch_add(&r->refs, 1);
  pthread_mutex_unlock(&h->mu);
  if (!r) {
    char clean[129];
    return dev_error(st, PD_NOT_FOUND,
                     "no shared memory region named \"%s\" in this session "
                     "(never registered, unregistered, or another session's); "
                     "register it first",
                     srv_log_clean(name, clean, sizeof clean));
  }
  *out = r;
  return PD_OK;
}

/* The name's uniqueness in the session and the limits, for a region of
 * `want` bytes in a session with memory quota `quota` (0: none); the caller
 * holds h->mu. */
static pd_code srv_shm_room_locked(srv_shm *h, const srv_shm_sess *x,
                                   const char *name, uint64_t want,
                                   uint64_t quota, dev_status *st) {
  int mine = x ? x->count : 0;
  bool dup = false;
  uint64_t mine_bytes = x ? x->bytes : 0;
  for (srv_shm_region *r = x ? x->head : NULL; r; r = r->next)
    if (strcmp(r->name, name) == 0) dup = true;
  char clean[129];
  if (dup)
    return dev_error(st, PD_ALREADY_EXISTS,
                     "a shared memory region named \"%s\" is already "
                     "registered in this session; unregister it first or "
                     "choose another name",
                     srv_log_clean(name, clean, sizeof clean));
  if (mine >= SRV_SHM_MAX_PER_SESSION)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the session has %d shared memory regions; the limit is "
                     "%d per session (unregister one first)",
                     mine, SRV_SHM_MAX_PER_SESSION);
  if (h->count >= SRV_SHM_MAX_REGIONS)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "paradevd has %" PRIu64
                     " shared memory regions "
                     "registered; the limit is %d per daemon",
                     h->count, SRV_SHM_MAX_REGIONS);
  bool by_quota = quota != 0 && quota < h->max_bytes;
  uint64_t limit = by_quota ? quota : h->max_bytes;
  if (want > limit || mine_bytes > limit - want)
    return dev_error(
        st, PD_RESOURCE_EXHAUSTED,
        "registering %" PRIu64
        " more bytes of shared memory "
        "would exceed the session's limit of %" PRIu64
        " bytes "
        "(%s): the session has %" PRIu64
        " bytes in %d "
        "region%s registered (unregister some first, or "
        "register less)",
        want, limit,
        by_quota ? "its memory quota" : "half the machine's physical memory",
        mine_bytes, mine, mine == 1 ? "" : "s");
  if (want > h->max_bytes || h->bytes > h->max_bytes - want)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "registering %" PRIu64
                     " more bytes of shared memory "
                     "would exceed paradevd's limit of %" PRIu64
                     " bytes for "
                     "all sessions together (half the machine's physical "
                     "memory): %" PRIu64 " bytes in %" PRIu64
                     " region%s "
                     "%s registered",
                     want, h->max_bytes, h->bytes, h->count,
                     h->count == 1 ? "" : "s", h->count == 1 ? "is" : "are");
  return PD_OK;
}

pd_code srv_shm_room(srv_shm *h, sched_session *ss, const char *name,
                     uint64_t want, uint64_t quota, dev_status *st) {
  pthread_mutex_lock(&h->mu);
  pd_code rc =
      srv_shm_room_locked(h, srv_shm_sess_of(h, ss), name, want, quota, st);
  pthread_mutex_unlock(&h->mu);
  return rc;
}

pd_code srv_shm_add(srv_shm *h, sched_session *ss, srv_shm_region *r,
                    uint64_t quota, dev_status *st) {
  pthread_mutex_lock(&h->mu);
  srv_shm_sess *x = srv_shm_sess_of(h, ss);
  pd_code rc = srv_shm_room_locked(h, x, r->name, r->size, quota, st);
  if (rc == PD_OK && !x) { /* the session's first region */
    x = calloc(1, sizeof(*x));
    if (!x)
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    else if ((rc = sched_session_attach(ss, h->key, x, st)) != PD_OK)
      free(x); /* the session ended meanwhile */
  }
  if (rc == PD_OK) {
    r->next = x->head;
    x->head = r;
    x->count++;
    x->bytes += r->size;
    h->count++;
    h->bytes += r->size;
  }
  pthread_mutex_unlock(&h->mu);
  return rc;
}

srv_shm_region *srv_shm_take(srv_shm *h, sched_session *ss, const char *name) {
  srv_shm_region *r = NULL;
  pthread_mutex_lock(&h->mu);
  srv_shm_sess *x = srv_shm_sess_of(h, ss);
  for (srv_shm_region **pp = x ? &x->head : NULL; pp && *pp;
       pp = &(*pp)->next) {
    if (strcmp((*pp)->name, name) == 0) {
      r = *pp;
      *pp = r->next;
      x->count--;
      x->bytes -= r->size;
      h->count--;
      h->bytes -= r->size;
      break;
    }
  }
  pthread_mutex_unlock(&h->mu);
  return r;
}

/* The memory quota of session `seq` (0: none) into *quota. */
pd_code srv_shm_session_quota(srv *s, uint64_t seq, uint64_t *quota,
                              dev_status *st) {
  sched_session_view *v = NULL;
  int n = sched_list_sessions(s->sched, NULL, &v);
  if (n < 0) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  *quota = 0;
  for (int i = 0; i < n; i++)
    if (v[i].seq == seq) *quota = v[i].memory_quota;
  free(v);
  return PD_OK;
}

/* One copy: admitted unless `r` was retired, run under the guard, counted. */
pd_code srv_shm_guarded(srv_shm_region *r, bool reading, srv_copy_fn fn,
                        void *arg, dev_status *st) {
  PD_TRY(srv_shm_copy_begin(r, reading, st));
  pd_code rc = srv_shm_guarded_copy(r, reading, fn, arg, st);
  srv_shm_copy_end(r);
  return rc;
}

/* --- start and stop -------------------------------------------------------------- */

/* Half the machine's physical memory: the most bytes of shared memory the
 * daemon maps (and, on CUDA, page-locks) for all sessions together, and for
 * any one session. */
static uint64_t srv_shm_max_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) {
    SRV_WARN(
        "cannot learn the machine's physical memory (sysconf: %s); "
        "shared memory regions are limited to %" PRIu64 " bytes",
        strerror(errno), SRV_SHM_MAX_BYTES_FALLBACK);
    return SRV_SHM_MAX_BYTES_FALLBACK;
  }
  return (uint64_t)pages * (uint64_t)page / 2;
}

int srv_shm_init(srv *s) {
  srv_shm *h = calloc(1, sizeof(*h));
  if (!h) {
    SRV_ERROR("out of memory");
    return -1;
  }
  h->max_bytes = srv_shm_max_bytes();
  SRV_DEBUG("shared memory: at most %" PRIu64
            " bytes registered per daemon "
            "and per session (half the physical memory)",
            h->max_bytes);
  pthread_mutex_init(&h->mu, NULL);
  sched_observer obs = {"shm", srv_shm_on_end, h};
  h->key = sched_observer_add(s->sched, &obs);
  if (h->key < 0) {
    SRV_ERROR(
        "internal: no observer slot left in the scheduler for shared "
        "memory regions");
    pthread_mutex_destroy(&h->mu);
    free(h);
    return -1;
  }
  s->shm = h;
  srv_shm_guard_install();
  return 0;
}

void srv_shm_destroy(srv *s) {
  srv_shm *h = s->shm;
  if (!h) return;
  /* Every session ended before (sched_destroy): no region is left. */
  if (h->count)
    SRV_WARN("internal: %" PRIu64
             " shared memory regions still registered "
             "at shutdown",
             h->count);
  srv_shm_guard_remove();
  pthread_mutex_destroy(&h->mu);
  free(h);
  s->shm = NULL;
}
