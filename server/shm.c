/* paradevd's system shared memory regions (paradev.proto, "Shared memory"):
 * RegisterSharedMemory, UnregisterSharedMemory, UploadFromSharedMemory and
 * DownloadToSharedMemory. The model is NVIDIA Triton's system shared memory
 * extension (docs/protocol/extension_shared_memory.md): a client on this
 * machine names a POSIX shared memory object, the daemon maps it once, and
 * transfers copy straight between the mapping and the devices
 * (dev_tensor_write / dev_tensor_read), with no intermediate buffer.
 *
 * Ownership. The daemon may run as another user (root, or a service user
 * with access to many clients' objects), so a client's word is not enough to
 * map an object: the object's first 64 bytes must hold the header of the
 * session that registers it (magic, version, the secret session token), which
 * only a process that can write to the object and holds the token can write.
 * It is checked once, at registration, in constant time.
 *
 * Lifetime. A region belongs to one session (by its number, seq) and is
 * reference-counted: the registry holds one reference, and every transfer
 * holds one from its lookup to its reply (a download also while it waits for
 * its tensor). Unregistering it, or the end of its session, retires it: it
 * leaves the registry, is marked retired, waits for the copies already
 * running (they are short: waiting for a tensor comes before its copy), and
 * unmaps it at once; a transfer that reaches its copy later fails with
 * CANCELLED. So once UnregisterSharedMemory or CloseSession has returned, the
 * daemon never touches the client's memory again. A session ends in the
 * scheduler (close, lease expiry, kill); CloseSession and KillSession sweep
 * the registry at once, and a thread sweeps it every SRV_SHM_SWEEP_MS for
 * leases that ran out (the scheduler has no end-of-session hook).
 *
 * Limits. Mappings cost address space, and page-locked ones (CUDA) physical
 * memory: a sparse object of terabytes maps for free and would then starve
 * the daemon's allocations. So registered bytes (byte_size, header included)
 * are capped per daemon at half the machine's physical memory, and per
 * session at the same, or at the session's memory quota when it has one.
 *
 * Truncation. A client may shrink its object while it is mapped; touching a
 * page past the new end raises SIGBUS. Copies from and into a mapping run
 * under a guard (a thread-local sigjmp_buf that a SIGBUS handler jumps to
 * when the fault lies in the region being copied), so that the call fails
 * with FAILED_PRECONDITION instead of the daemon dying. A SIGBUS while the
 * object still has its registered size means that tmpfs could not allocate
 * the page touched (/dev/shm is full; the object is sparse): that is
 * RESOURCE_EXHAUSTED, and the message says so. A SIGBUS anywhere else goes
 * to the previous disposition. */
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
#include "log.h"
#include "server.h"
#include "srv_int.h"

#define SRV_SHM_HEADER_BYTES 64
#define SRV_SHM_VERSION 1
#define SRV_SHM_KEY_MAX 200          /* characters after the '/' */
#define SRV_SHM_MAX_PER_SESSION 64   /* RESOURCE_EXHAUSTED beyond */
#define SRV_SHM_MAX_REGIONS 4096     /* per daemon: mappings are a resource */
#define SRV_SHM_SWEEP_MS 500         /* how often ended sessions are swept */
/* Registered bytes (byte_size, header included) are limited per daemon and
 * per session to half the machine's physical memory (srv_shm_max_bytes), and
 * for a session with a memory quota to its quota: RESOURCE_EXHAUSTED beyond.
 * This is the limit where physical memory cannot be learned. */
#define SRV_SHM_MAX_BYTES_FALLBACK ((uint64_t)64 << 30)

typedef struct srv_shm_region {
  struct srv_shm_region *next; /* in the registry (under srv_shm.mu) */
  atomic_int refs;             /* the registry's, plus one per transfer */
  uint64_t seq;                /* the session's number */
  dev_engine *engine;
  uint8_t *base;               /* the mapping: byte_size bytes; NULL once retired */
  size_t size;
  bool pinned;                 /* dev_engine_host_register accepted it */
  int fd;                      /* the object, kept open to notice truncation */
  char *name;                  /* the client's name for it */
  char *key;                   /* the POSIX shm name */
  /* Copies against retirement (srv_shm_copy_begin, srv_shm_retire). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int copying;                 /* copies running now */
  bool retired;                /* unregistered: no copy may start */
  bool session_ended;          /* retired because its session ended */
} srv_shm_region;

struct srv_shm {
  pthread_mutex_t mu;
  srv_shm_region *head;
  uint64_t count, bytes; /* registered regions and their mapped bytes */
  uint64_t max_bytes;    /* srv_shm_max_bytes(): per daemon and per session */
  /* the sweeper */
  pthread_mutex_t tmu;
  pthread_cond_t tcv;
  bool stop, thread_started;
  pthread_t thread;
};

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

static void srv_shm_region_unref(srv_shm_region *r) {
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
static void srv_shm_retire(srv_shm_region *r, bool session_ended) {
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

static int srv_u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Drops every region of a session that is not open any more (all of them
 * when `all`). Takes the snapshot of open sessions under the registry's
 * lock, so a region registered meanwhile is never taken for an ended one. */
static void srv_shm_sweep_impl(srv *s, bool all) {
  srv_shm *h = s->shm;
  if (!h) return;
  srv_shm_region *gone = NULL;
  pthread_mutex_lock(&h->mu);
  if (!h->head) {
    pthread_mutex_unlock(&h->mu);
    return;
  }
  sched_session_view *v = NULL;
  int n = all ? 0 : sched_list_sessions(s->sched, NULL, &v);
  uint64_t *seqs = n > 0 ? malloc(sizeof(*seqs) * (size_t)n) : NULL;
  if (n < 0 || (n > 0 && !seqs)) { /* out of host memory: next time */
    pthread_mutex_unlock(&h->mu);
    free(v);
    return;
  }
  for (int i = 0; i < n; i++) seqs[i] = v[i].seq;
  free(v);
  if (n > 1) qsort(seqs, (size_t)n, sizeof(*seqs), srv_u64_cmp);
  for (srv_shm_region **pp = &h->head; *pp;) {
    srv_shm_region *r = *pp;
    bool open = n > 0 && bsearch(&r->seq, seqs, (size_t)n, sizeof(*seqs),
                                 srv_u64_cmp) != NULL;
    if (open) {
      pp = &r->next;
      continue;
    }
    *pp = r->next;
    h->count--;
    h->bytes -= r->size;
    r->next = gone;
    gone = r;
  }
  pthread_mutex_unlock(&h->mu);
  free(seqs);
  while (gone) {
    srv_shm_region *r = gone;
    gone = r->next;
    char name[129];
    SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_DEBUG,
               "session %" PRIu64 " ended: shared memory region \"%s\" (%s) "
               "unregistered",
               r->seq, srv_log_clean(r->name, name, sizeof name), r->key);
    srv_shm_retire(r, true);
    srv_shm_region_unref(r);
  }
}

void srv_shm_sweep(srv *s) { srv_shm_sweep_impl(s, false); }

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

/* Retains region `name` of session `seq`: NOT_FOUND when there is none. */
static pd_code srv_shm_get(srv *s, uint64_t seq, const char *name,
                           srv_shm_region **out, dev_status *st) {
  srv_shm *h = s->shm;
  pthread_mutex_lock(&h->mu);
  srv_shm_region *r = h->head;
  while (r && !(r->seq == seq && strcmp(r->name, name) == 0)) r = r->next;
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

/* --- the SIGBUS guard ---------------------------------------------------------- */

typedef struct srv_bus_guard {
  sigjmp_buf jb;
  const uint8_t *lo, *hi; /* the mapping being copied */
} srv_bus_guard;

static _Thread_local srv_bus_guard *srv_bus_current;
static struct sigaction srv_bus_old;
static bool srv_bus_installed;

static void srv_bus_handler(int sig, siginfo_t *si, void *uc) {
  (void)sig;
  (void)uc;
  srv_bus_guard *g = srv_bus_current;
  const uint8_t *a = si ? (const uint8_t *)si->si_addr : NULL;
  if (g && a >= g->lo && a < g->hi) siglongjmp(g->jb, 1);
  /* Not a region's: the previous disposition takes the fault when the
   * instruction runs again. */
  sigaction(SIGBUS, &srv_bus_old, NULL);
}

typedef pd_code (*srv_copy_fn)(void *arg, dev_status *st);

/* The SIGBUS branch: the object's size tells truncation from a full tmpfs. */
static pd_code srv_shm_bus_error(const srv_shm_region *r, bool reading,
                                 dev_status *st) {
  struct stat sb;
  if (r->fd >= 0 && fstat(r->fd, &sb) == 0 && (uint64_t)sb.st_size >= r->size)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "shared memory region \"%.128s\" (%s) could not be %s: "
                     "/dev/shm (tmpfs) is out of space, so the pages of the "
                     "object (%zu bytes, its registered size) that the daemon "
                     "touched could not be allocated; free /dev/shm or make "
                     "it larger (Docker: --shm-size), and reserve the "
                     "object's pages when creating it (posix_fallocate; "
                     "pd_shared_memory_create does)",
                     r->name, r->key, reading ? "read" : "written", r->size);
  return dev_error(st, PD_FAILED_PRECONDITION,
                   "shared memory region \"%.128s\" (%s) was truncated "
                   "below the %zu bytes it was registered with while the "
                   "daemon copied; keep the object at least byte_size "
                   "bytes while it is registered",
                   r->name, r->key, r->size);
}

/* Runs fn(arg) (a copy from or into `r`) under the SIGBUS guard. */
static pd_code srv_shm_guarded_copy(const srv_shm_region *r, bool reading,
                                    srv_copy_fn fn, void *arg,
                                    dev_status *st) {
  srv_bus_guard g;
  g.lo = r->base;
  g.hi = r->base + r->size;
  if (sigsetjmp(g.jb, 1)) {
    srv_bus_current = NULL;
    atomic_signal_fence(memory_order_seq_cst);
    return srv_shm_bus_error(r, reading, st);
  }
  srv_bus_current = &g;
  atomic_signal_fence(memory_order_seq_cst);
  pd_code rc = fn(arg, st);
  atomic_signal_fence(memory_order_seq_cst);
  srv_bus_current = NULL;
  /* Page-locked (CUDA) mappings never fault: the copy went through pages the
   * object no longer has, so look at the object's size instead. */
  struct stat sb;
  if (rc == PD_OK && r->fd >= 0 && fstat(r->fd, &sb) == 0 && (uint64_t)sb.st_size < r->size)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "shared memory region \"%.128s\" (%s) was truncated "
                     "to %lld of the %zu bytes it was registered with; keep "
                     "the object at least byte_size bytes while it is "
                     "registered",
                     r->name, r->key, (long long)sb.st_size, r->size);
  return rc;
}

/* One copy between `r` and a tensor: admitted unless `r` was retired, run
 * under the guard, and counted so that retiring `r` waits for it. `reading`:
 * the copy reads the region (an upload, the header check). */
static pd_code srv_shm_guarded(srv_shm_region *r, bool reading,
                               srv_copy_fn fn, void *arg, dev_status *st) {
  pd_code rc = srv_shm_copy_begin(r, reading, st);
  if (rc != PD_OK) return rc;
  rc = srv_shm_guarded_copy(r, reading, fn, arg, st);
  srv_shm_copy_end(r);
  return rc;
}

/* --- start and stop -------------------------------------------------------------- */

static void *srv_shm_sweeper(void *arg) {
  srv *s = arg;
  srv_shm *h = s->shm;
  pthread_mutex_lock(&h->tmu);
  while (!h->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)SRV_SHM_SWEEP_MS * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&h->tcv, &h->tmu, &ts);
    if (h->stop) break;
    pthread_mutex_unlock(&h->tmu);
    srv_shm_sweep(s);
    pthread_mutex_lock(&h->tmu);
  }
  pthread_mutex_unlock(&h->tmu);
  return NULL;
}

/* Half the machine's physical memory: the most bytes of shared memory the
 * daemon maps (and, on CUDA, page-locks) for all sessions together, and for
 * any one session. */
static uint64_t srv_shm_max_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) {
    SRV_WARN("cannot learn the machine's physical memory (sysconf: %s); "
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
  SRV_DEBUG("shared memory: at most %" PRIu64 " bytes registered per daemon "
            "and per session (half the physical memory)",
            h->max_bytes);
  pthread_mutex_init(&h->mu, NULL);
  pthread_mutex_init(&h->tmu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->tcv, &ca);
  pthread_condattr_destroy(&ca);
  s->shm = h;
  if (pthread_create(&h->thread, NULL, srv_shm_sweeper, s) != 0) {
    SRV_ERROR("cannot start the shared memory sweeper thread");
    srv_shm_destroy(s);
    return -1;
  }
  h->thread_started = true;
  if (!srv_bus_installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = srv_bus_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &srv_bus_old) == 0) srv_bus_installed = true;
    else SRV_WARN("cannot install the SIGBUS handler (%s): a client that "
                  "truncates a registered region can crash the daemon",
                  strerror(errno));
  }
  return 0;
}

void srv_shm_destroy(srv *s) {
  srv_shm *h = s->shm;
  if (!h) return;
  if (h->thread_started) {
    pthread_mutex_lock(&h->tmu);
    h->stop = true;
    pthread_cond_signal(&h->tcv);
    pthread_mutex_unlock(&h->tmu);
    pthread_join(h->thread, NULL);
  }
  srv_shm_sweep_impl(s, true);
  if (srv_bus_installed) {
    sigaction(SIGBUS, &srv_bus_old, NULL);
    srv_bus_installed = false;
  }
  pthread_cond_destroy(&h->tcv);
  pthread_mutex_destroy(&h->tmu);
  pthread_mutex_destroy(&h->mu);
  free(h);
  s->shm = NULL;
}

/* --- RegisterSharedMemory ------------------------------------------------------- */

/* "/" followed by 1 to SRV_SHM_KEY_MAX of [A-Za-z0-9._-], not "/." or "/..". */
static bool srv_shm_key_ok(const char *key) {
  if (!key || key[0] != '/') return false;
  size_t n = strlen(key + 1);
  if (n == 0 || n > SRV_SHM_KEY_MAX) return false;
  if (strcmp(key, "/.") == 0 || strcmp(key, "/..") == 0) return false;
  for (size_t i = 1; key[i]; i++) {
    char ch = key[i];
    bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
              (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

/* 1 to max bytes of printable ASCII (names are logged and sent back). */
static bool srv_shm_name_ok(const char *name, size_t max) {
  size_t n = strlen(name);
  if (n == 0 || n > max) return false;
  for (size_t i = 0; i < n; i++)
    if (name[i] < 0x20 || name[i] > 0x7e) return false;
  return true;
}

/* The header a region of the session with `token` carries. */
static void srv_shm_expected_header(const uint8_t *token, size_t len,
                                    uint8_t out[SRV_SHM_HEADER_BYTES]) {
  memset(out, 0, SRV_SHM_HEADER_BYTES);
  memcpy(out, "PDSHM", 5);
  out[5] = SRV_SHM_VERSION;
  out[6] = (uint8_t)(len & 0xff);
  out[7] = (uint8_t)(len >> 8);
  memcpy(out + 8, token, len);
}

typedef struct srv_hdr_copy {
  const uint8_t *src;
  uint8_t *dst;
} srv_hdr_copy;

static pd_code srv_hdr_copy_fn(void *arg, dev_status *st) {
  (void)st;
  srv_hdr_copy *h = arg;
  memcpy(h->dst, h->src, SRV_SHM_HEADER_BYTES);
  return PD_OK;
}

/* Every byte compared, whatever differs first. */
static bool srv_ct_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  volatile uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= (uint8_t)(a[i] ^ b[i]);
  return d == 0;
}

/* The name's uniqueness in the session and the limits, for a region of
 * `want` bytes in a session with memory quota `quota` (0: none); the caller
 * holds h->mu. */
static pd_code srv_shm_room_locked(srv_shm *h, uint64_t seq, const char *name,
                                   uint64_t want, uint64_t quota,
                                   dev_status *st) {
  int mine = 0;
  bool dup = false;
  uint64_t mine_bytes = 0;
  for (srv_shm_region *r = h->head; r; r = r->next) {
    if (r->seq != seq) continue;
    mine++;
    mine_bytes += r->size;
    if (strcmp(r->name, name) == 0) dup = true;
  }
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
                     "paradevd has %" PRIu64 " shared memory regions "
                     "registered; the limit is %d per daemon",
                     h->count, SRV_SHM_MAX_REGIONS);
  bool by_quota = quota != 0 && quota < h->max_bytes;
  uint64_t limit = by_quota ? quota : h->max_bytes;
  if (want > limit || mine_bytes > limit - want)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "registering %" PRIu64 " more bytes of shared memory "
                     "would exceed the session's limit of %" PRIu64 " bytes "
                     "(%s): the session has %" PRIu64 " bytes in %d "
                     "region%s registered (unregister some first, or "
                     "register less)",
                     want, limit,
                     by_quota ? "its memory quota"
                              : "half the machine's physical memory",
                     mine_bytes, mine, mine == 1 ? "" : "s");
  if (want > h->max_bytes || h->bytes > h->max_bytes - want)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "registering %" PRIu64 " more bytes of shared memory "
                     "would exceed paradevd's limit of %" PRIu64 " bytes for "
                     "all sessions together (half the machine's physical "
                     "memory): %" PRIu64 " bytes in %" PRIu64 " region%s "
                     "%s registered",
                     want, h->max_bytes, h->bytes, h->count,
                     h->count == 1 ? "" : "s", h->count == 1 ? "is" : "are");
  return PD_OK;
}

static pd_code srv_shm_room(srv_shm *h, uint64_t seq, const char *name,
                            uint64_t want, uint64_t quota, dev_status *st) {
  pthread_mutex_lock(&h->mu);
  pd_code rc = srv_shm_room_locked(h, seq, name, want, quota, st);
  pthread_mutex_unlock(&h->mu);
  return rc;
}

/* The memory quota of session `seq` (0: none) into *quota. */
static pd_code srv_shm_session_quota(srv *s, uint64_t seq, uint64_t *quota,
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

/* Opens and maps `key`, checks its header against `token`: a new region
 * with one reference, or an error naming the key. */
static pd_code srv_shm_map(srv *s, const char *name, const char *key,
                           uint64_t byte_size, ProtobufCBinaryData token,
                           srv_shm_region **out, dev_status *st) {
  int fd = shm_open(key, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0) {
    int e = errno;
    switch (e) {
      case ENOENT:
        return dev_error(st, PD_NOT_FOUND,
                         "no shared memory object %s (create it with "
                         "shm_open before registering it)",
                         key);
      case EACCES:
      case EPERM:
        return dev_error(st, PD_PERMISSION_DENIED,
                         "paradevd (uid %u) could not open shared memory "
                         "object %s for reading and writing: %s; the region "
                         "must be readable and writable by the daemon's user "
                         "(for a daemon run as a service user, give the "
                         "object a group it is in and mode 0660)",
                         (unsigned)geteuid(), key, strerror(e));
      case EMFILE:
      case ENFILE:
        return dev_error(st, PD_RESOURCE_EXHAUSTED,
                         "paradevd cannot open shared memory object %s: %s",
                         key, strerror(e));
      default:
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "paradevd cannot open shared memory object %s: %s",
                         key, strerror(e));
    }
  }
  struct stat sb;
  pd_code rc = PD_OK;
  if (fstat(fd, &sb) != 0) {
    rc = dev_error(st, PD_INTERNAL, "fstat of shared memory object %s: %s",
                   key, strerror(errno));
  } else if (!S_ISREG(sb.st_mode)) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "shared memory object %s is not a regular object (mode "
                   "%o); expected one made by shm_open",
                   key, (unsigned)sb.st_mode);
  } else if ((uint64_t)sb.st_size < byte_size) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "shared memory object %s holds %lld bytes; byte_size is "
                   "%" PRIu64 " (ftruncate it to at least byte_size first)",
                   key, (long long)sb.st_size, byte_size);
  }
  if (rc != PD_OK) {
    close(fd);
    return rc;
  }
  void *p = mmap(NULL, (size_t)byte_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                 fd, 0);
  int e = errno;
  if (p == MAP_FAILED) {
    close(fd);
    return dev_error(st, e == ENOMEM ? PD_RESOURCE_EXHAUSTED
                                     : PD_INVALID_ARGUMENT,
                     "paradevd cannot map %" PRIu64 " bytes of shared "
                     "memory object %s: %s",
                     byte_size, key, strerror(e));
  }
  srv_shm_region *r = calloc(1, sizeof(*r));
  if (!r) {
    munmap(p, (size_t)byte_size);
    close(fd);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  atomic_init(&r->refs, 1);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->engine = s->engine;
  r->fd = fd;
  r->base = p;
  r->size = (size_t)byte_size;
  r->name = strdup(name);
  r->key = strdup(key);
  if (!r->name || !r->key) {
    srv_shm_region_unref(r);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  /* The header: the session's, compared in constant time. */
  uint8_t got[SRV_SHM_HEADER_BYTES], want[SRV_SHM_HEADER_BYTES];
  srv_hdr_copy hc = {r->base, got};
  rc = srv_shm_guarded(r, true, srv_hdr_copy_fn, &hc, st);
  if (rc == PD_OK) {
    srv_shm_expected_header(token.data, token.len, want);
    if (!srv_ct_equal(got, want, SRV_SHM_HEADER_BYTES))
      rc = dev_error(st, PD_PERMISSION_DENIED,
                     "shared memory object %s does not carry this session's "
                     "header (its first 64 bytes must be \"PDSHM\", version "
                     "%d, the token's length and the session token, then "
                     "zeros; libparadev writes it)",
                     key, SRV_SHM_VERSION);
  }
  if (rc != PD_OK) {
    srv_shm_region_unref(r);
    return rc;
  }
  *out = r;
  return PD_OK;
}

static void srv_register_shm(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__RegisterSharedMemoryRequest *req = (const void *)m;
  srv *s = c->s;
  sched_session *ss = srv_open_session(c, req->session_token);
  if (!ss) return;
  dev_status st = DEV_STATUS_INIT;
  srv_shm_region *r = NULL;
  const char *name = req->name ? req->name : "";
  const char *key = req->key ? req->key : "";
  size_t nlen = strlen(name);
  size_t max_name = (size_t)s->opt.limits.max_string_bytes;
  uint64_t seq = sched_session_seq(ss);
  char ck[SRV_SHM_KEY_MAX + 8];
  if (!srv_shm_name_ok(name, max_name)) {
    dev_error(&st, PD_INVALID_ARGUMENT,
              "a shared memory region name of %zu bytes%s; expected 1 to "
              "max_string_bytes = %zu bytes of printable ASCII",
              nlen, nlen && nlen <= max_name ? " with unprintable bytes" : "",
              max_name);
    goto fail;
  }
  if (!srv_shm_key_ok(key)) {
    dev_error(&st, PD_INVALID_ARGUMENT,
              "shared memory key \"%s\": expected \"/\" followed by 1 to %d "
              "of A-Z a-z 0-9 . _ - (a POSIX shm_open name), and not \"/.\" "
              "or \"/..\"",
              srv_log_clean(key, ck, sizeof ck), SRV_SHM_KEY_MAX);
    goto fail;
  }
  if (req->byte_size <= SRV_SHM_HEADER_BYTES || req->byte_size > SIZE_MAX / 2) {
    dev_error(&st, PD_INVALID_ARGUMENT,
              "byte_size %" PRIu64 " of shared memory object %s: a region "
              "holds the %d-byte header and at least one byte of data "
              "(expected %d to %zu)",
              req->byte_size, key, SRV_SHM_HEADER_BYTES,
              SRV_SHM_HEADER_BYTES + 1, SIZE_MAX / 2);
    goto fail;
  }
  srv_shm *h = s->shm;
  uint64_t quota = 0;
  if (srv_shm_session_quota(s, seq, &quota, &st) != PD_OK ||
      srv_shm_room(h, seq, name, req->byte_size, quota, &st) != PD_OK)
    goto fail;
  if (srv_shm_map(s, name, key, req->byte_size, req->session_token, &r,
                  &st) != PD_OK)
    goto fail;
  /* Page-locks the mapping so copies to and from the devices run as DMA
   * (a no-op on the CPU backend). */
  if (dev_engine_host_register(s->engine, r->base, r->size, &st) != PD_OK)
    goto fail_region;
  r->pinned = true;
  r->seq = seq;
  size_t size = r->size; /* once listed, the registry owns `r` */
  /* Checked again: another call of the session may have raced this one. */
  pthread_mutex_lock(&h->mu);
  pd_code room = srv_shm_room_locked(h, seq, name, size, quota, &st);
  if (room == PD_OK) {
    r->next = h->head;
    h->head = r;
    h->count++;
    h->bytes += r->size;
  }
  pthread_mutex_unlock(&h->mu);
  if (room != PD_OK) goto fail_region;
  char cn[129];
  SRV_INFO("session %" PRIu64 ": shared memory region \"%s\" registered "
           "(%s, %zu bytes)",
           seq, srv_log_clean(name, cn, sizeof cn), key, size);
  Paradev__V1__SharedMemoryRegion info = PARADEV__V1__SHARED_MEMORY_REGION__INIT;
  info.name = (char *)name;
  info.key = (char *)key;
  info.byte_size = size;
  info.data_bytes = size - SRV_SHM_HEADER_BYTES;
  Paradev__V1__RegisterSharedMemoryResponse resp =
      PARADEV__V1__REGISTER_SHARED_MEMORY_RESPONSE__INIT;
  resp.region = &info;
  resp.incarnation = s->incarnation;
  srv_call_reply(c, &resp.base);
  sched_session_put(ss);
  return;
fail_region:
  srv_shm_region_unref(r);
fail:
  srv_call_fail(c, &st);
  sched_session_put(ss);
}

/* --- UnregisterSharedMemory --------------------------------------------------- */

static void srv_unregister_shm(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__UnregisterSharedMemoryRequest *req = (const void *)m;
  srv *s = c->s;
  sched_session *ss = srv_open_session(c, req->session_token);
  if (!ss) return;
  const char *name = req->name ? req->name : "";
  uint64_t seq = sched_session_seq(ss);
  sched_session_put(ss);
  srv_shm *h = s->shm;
  srv_shm_region *r = NULL;
  pthread_mutex_lock(&h->mu);
  for (srv_shm_region **pp = &h->head; *pp; pp = &(*pp)->next) {
    if ((*pp)->seq == seq && strcmp((*pp)->name, name) == 0) {
      r = *pp;
      *pp = r->next;
      h->count--;
      h->bytes -= r->size;
      break;
    }
  }
  pthread_mutex_unlock(&h->mu);
  if (!r) {
    char clean[129];
    srv_call_finish(c, PD_NOT_FOUND,
                    "no shared memory region named \"%s\" in this session "
                    "(never registered, unregistered, or another session's)",
                    srv_log_clean(name, clean, sizeof clean));
    return;
  }
  /* Waits for the copies running now; later ones fail with CANCELLED. Once
   * the reply goes, the daemon never touches the mapping again. */
  srv_shm_retire(r, false);
  char cn[129];
  SRV_INFO("session %" PRIu64 ": shared memory region \"%s\" unregistered",
           seq, srv_log_clean(r->name, cn, sizeof cn));
  srv_shm_region_unref(r); /* unmapped already; freed once no transfer holds it */
  Paradev__V1__UnregisterSharedMemoryResponse resp =
      PARADEV__V1__UNREGISTER_SHARED_MEMORY_RESPONSE__INIT;
  srv_call_reply(c, &resp.base);
}

/* --- transfers ------------------------------------------------------------------ */

/* OUT_OF_RANGE unless `bytes` at data offset `offset` fit the region. */
static pd_code srv_shm_check_range(const srv_shm_region *r, uint64_t offset,
                                   uint64_t bytes, dev_status *st) {
  uint64_t data = r->size - SRV_SHM_HEADER_BYTES;
  if (offset > data || bytes > data - offset)
    return dev_error(st, PD_OUT_OF_RANGE,
                     "%" PRIu64 " bytes at data offset %" PRIu64 " run past "
                     "the end of shared memory region \"%.128s\", which "
                     "holds %" PRIu64 " bytes of data (byte_size %zu less the "
                     "%d-byte header)",
                     bytes, offset, r->name, data, r->size,
                     SRV_SHM_HEADER_BYTES);
  return PD_OK;
}

/* One transfer's copies between the tensor and the mapping, run under the
 * SIGBUS guard: parts[0..n) in turn, each sizes[i] bytes, from data offset
 * `offset` on. */
typedef struct srv_shm_copy {
  bool upload;
  sched_upload *up;   /* upload */
  dev_tensor *t;      /* download */
  dev_layout layout;
  int n;
  const uint64_t *sizes;
  const srv_shm_region *r;
  uint64_t offset;    /* the first part's data offset (checked in range) */
} srv_shm_copy;

static pd_code srv_shm_copy_fn(void *arg, dev_status *st) {
  srv_shm_copy *k = arg;
  /* The mapping's address is read only now, inside the copy's admission:
   * a retired region has none. */
  uint8_t *p = k->r->base + SRV_SHM_HEADER_BYTES + k->offset;
  for (int i = 0; i < k->n; i++) {
    size_t len = (size_t)k->sizes[i];
    if (len) {
      int comp = k->layout.kind == DEV_LAYOUT_PER_COMPONENT ? i
                                                             : k->layout.component;
      pd_code rc = k->upload
                       ? sched_upload_write(k->up, i, 0, p, len, st)
                       : dev_tensor_read(k->t, &k->layout, comp, 0, p, len, st);
      if (rc != PD_OK) return rc;
    }
    p += len;
  }
  return PD_OK;
}

/* --- UploadFromSharedMemory -------------------------------------------------------- */

static void srv_upload_shm(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__UploadFromSharedMemoryRequest *req = (const void *)m;
  srv *s = c->s;
  sched_session *ss = srv_open_session(c, req->session_token);
  if (!ss) return;
  dev_status st = DEV_STATUS_INIT;
  srv_shm_region *r = NULL;
  sched_upload *up = NULL;
  srv_arena a = {NULL};
  srv_upload_spec *sp = malloc(sizeof(*sp));
  if (!sp) {
    dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto fail;
  }
  if (srv_upload_spec_from_pb(s, (int)req->dtype, req->shape, req->layout,
                              req->n_component_shapes, req->component_shapes,
                              sp, &st) != PD_OK ||
      srv_shm_get(s, sched_session_seq(ss), req->region ? req->region : "", &r,
                  &st) != PD_OK ||
      srv_shm_check_range(r, req->offset, sp->total, &st) != PD_OK)
    goto fail;
  bool per_comp = sp->layout.kind == DEV_LAYOUT_PER_COMPONENT;
  if (sched_upload_begin(ss, req->id, sp->dtype, &sp->layout, &sp->host,
                         per_comp ? sp->comps : NULL, &up, &st) != PD_OK)
    goto fail;
  int parts = per_comp ? dev_engine_num_devices(s->engine) : 1;
  uint64_t sizes[PD_MAX_DEVICES];
  for (int i = 0; i < parts; i++) sizes[i] = sched_upload_expected(up, i);
  srv_shm_copy k = {true, up, NULL, sp->layout, parts, sizes, r, req->offset};
  if (srv_shm_guarded(r, true, srv_shm_copy_fn, &k, &st) != PD_OK) goto fail;
  const dev_tensor *t = sched_upload_tensor(up);
  Paradev__V1__TensorInfo *ti =
      srv_info_to_pb(&a, req->id, dev_tensor_dtype(t), dev_tensor_shape(t));
  if (!ti) {
    dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto fail;
  }
  sched_upload *committing = up;
  up = NULL;
  if (sched_upload_commit(committing, &st) != PD_OK) goto fail;
  atomic_fetch_add_explicit(&s->shm_upload_bytes, sp->total,
                            memory_order_relaxed);
  Paradev__V1__UploadResponse resp = PARADEV__V1__UPLOAD_RESPONSE__INIT;
  resp.tensor = ti;
  resp.bytes_received = sp->total;
  resp.incarnation = s->incarnation;
  srv_call_reply(c, &resp.base);
  goto out;
fail:
  srv_call_fail(c, &st);
out:
  sched_upload_abort(up);
  srv_shm_region_unref(r);
  srv_arena_free(&a);
  free(sp);
  sched_session_put(ss);
}

/* --- DownloadToSharedMemory ---------------------------------------------------------- */

/* Waits for its tensor as Download does (a wake-up, never a blocked thread),
 * holding the region so it stays mapped. */
typedef struct srv_dl_shm_state {
  sched_session *ss;
  dev_tensor *t;
  srv_shm_region *r;
  dev_layout layout;
  int parts;
  uint64_t offset, total;
  uint64_t size[PD_MAX_DEVICES];
  dev_shape shape[PD_MAX_DEVICES];
  srv_wait *w;
} srv_dl_shm_state;

static void srv_download_shm_destroy(srv_call *c) {
  srv_dl_shm_state *d = c->user;
  if (!d) return;
  srv_wait_cancel(d->w);
  srv_wait_put(d->w, false);
  dev_tensor_release(d->t);
  srv_shm_region_unref(d->r);
  sched_session_put(d->ss);
  free(d);
  c->user = NULL;
}

/* The tensor is computed: copy it into the region, or end with its error. */
static void srv_download_shm_finish(srv_call *c) {
  srv_dl_shm_state *d = c->user;
  if (d->w) { /* woken: that wait is over */
    srv_wait_put(d->w, false);
    d->w = NULL;
  }
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_wait(d->t, &st) != PD_OK) { /* ready: returns at once */
    srv_call_fail(c, &st);
    return;
  }
  srv_shm_copy k = {false, NULL, d->t, d->layout, d->parts, d->size, d->r,
                    d->offset};
  if (srv_shm_guarded(d->r, false, srv_shm_copy_fn, &k, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  atomic_fetch_add_explicit(&c->s->shm_download_bytes, d->total,
                            memory_order_relaxed);
  srv_arena a = {NULL};
  Paradev__V1__Shape **shapes =
      srv_arena_alloc(&a, sizeof(*shapes) * (size_t)d->parts);
  for (int i = 0; shapes && i < d->parts; i++) {
    shapes[i] = srv_shape_to_pb(&a, &d->shape[i]);
    if (!shapes[i]) shapes = NULL;
  }
  if (!shapes) {
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  Paradev__V1__DownloadToSharedMemoryResponse resp =
      PARADEV__V1__DOWNLOAD_TO_SHARED_MEMORY_RESPONSE__INIT;
  resp.dtype = (Paradev__V1__DType)dev_tensor_dtype(d->t);
  resp.n_host_shapes = (size_t)d->parts;
  resp.host_shapes = shapes;
  resp.bytes_written = d->total;
  resp.incarnation = c->s->incarnation;
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
}

static void srv_download_shm(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DownloadToSharedMemoryRequest *req = (const void *)m;
  srv *s = c->s;
  srv_dl_shm_state *d = calloc(1, sizeof(*d));
  if (!d) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->user = d;
  d->ss = srv_open_session(c, req->session_token);
  if (!d->ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (srv_shm_get(s, sched_session_seq(d->ss), req->region ? req->region : "",
                  &d->r, &st) != PD_OK ||
      sched_handle_get(d->ss, req->id, &d->t, &st) != PD_OK ||
      srv_download_layout_from_pb(req->layout, dev_tensor_num_components(d->t),
                                  &d->layout, &d->parts, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  for (int i = 0; i < d->parts; i++) {
    int comp = d->layout.kind == DEV_LAYOUT_PER_COMPONENT ? i
                                                          : d->layout.component;
    if (dev_tensor_host_size(d->t, &d->layout, comp, &d->shape[i], &d->size[i],
                             &st) != PD_OK) {
      srv_call_fail(c, &st);
      return;
    }
    d->total += d->size[i];
  }
  d->offset = req->offset;
  /* Before waiting: a value that does not fit is refused at once. */
  if (srv_shm_check_range(d->r, d->offset, d->total, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  if (dev_tensor_is_ready(d->t)) {
    srv_download_shm_finish(c);
    return;
  }
  srv_wait *w = srv_wait_new(c);
  if (!w) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  char cn[129];
  SRV_DEBUG("session %" PRIu64 ": DownloadToSharedMemory of tensor %" PRIu64
            " into region \"%s\" waits for the tensor",
            sched_session_seq(d->ss), req->id,
            srv_log_clean(d->r->name, cn, sizeof cn));
  if (sched_tensor_notify(d->ss, d->t, srv_wait_ready, w, &st) != PD_OK) {
    srv_wait_cancel(w);
    srv_wait_put(w, true);
    srv_call_fail(c, &st);
    return;
  }
  d->w = w; /* srv_download_shm_finish runs when it is computed */
}

static void srv_download_shm_cancel(srv_call *c) {
  srv_dl_shm_state *d = c->user;
  if (d && d->w) {
    srv_wait_cancel(d->w);
    srv_wait_put(d->w, false);
    d->w = NULL;
  }
  srv_call_finish_cancelled(c, "DownloadToSharedMemory");
}

/* --- the methods ------------------------------------------------------------------ */

#define SRV_PD "/paradev.v1.ParallelDevice/"

srv_method srv_m_register_shm = {
    .path = SRV_PD "RegisterSharedMemory",
    .kind = SRV_UNARY,
    .request = &paradev__v1__register_shared_memory_request__descriptor,
    .on_request = srv_register_shm};
srv_method srv_m_unregister_shm = {
    .path = SRV_PD "UnregisterSharedMemory",
    .kind = SRV_UNARY,
    .request = &paradev__v1__unregister_shared_memory_request__descriptor,
    .on_request = srv_unregister_shm};
srv_method srv_m_upload_shm = {
    .path = SRV_PD "UploadFromSharedMemory",
    .kind = SRV_UNARY,
    .request = &paradev__v1__upload_from_shared_memory_request__descriptor,
    .on_request = srv_upload_shm};
srv_method srv_m_download_shm = {
    .path = SRV_PD "DownloadToSharedMemory",
    .kind = SRV_UNARY,
    .request = &paradev__v1__download_to_shared_memory_request__descriptor,
    .on_request = srv_download_shm,
    .on_destroy = srv_download_shm_destroy,
    .on_wake = srv_download_shm_finish,
    .on_cancel = srv_download_shm_cancel,
    .early_close = true};
