/* Private header of paradevd's system shared memory regions (paradev.proto,
 * "Shared memory"): shm.c holds the four methods (RegisterSharedMemory,
 * UnregisterSharedMemory, UploadFromSharedMemory, DownloadToSharedMemory),
 * shm_region.c the regions and their registry, shm_guard.c the SIGBUS guard.
 * Lock order: the registry's mu before a region's mu, never the reverse.
 * The model is NVIDIA Triton's system shared memory
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
 * scheduler (close, lease expiry, kill, the daemon's stop), which tells the
 * registry (a sched_observer): a session's regions are the state it attached
 * to the session, and they are retired in on_end, on the thread that ended
 * the session, before CloseSession or KillSession answers.
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
#ifndef PARADEV_SERVER_SHM_INT_H
#define PARADEV_SERVER_SHM_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "server.h"

#define SRV_SHM_HEADER_BYTES 64
#define SRV_SHM_VERSION 1
#define SRV_SHM_KEY_MAX 200        /* characters after the '/' */
#define SRV_SHM_MAX_PER_SESSION 64 /* RESOURCE_EXHAUSTED beyond */
#define SRV_SHM_MAX_REGIONS 4096   /* per daemon: mappings are a resource */
/* Registered bytes (byte_size, header included) are limited per daemon and
 * per session to half the machine's physical memory (srv_shm_max_bytes), and
 * for a session with a memory quota to its quota: RESOURCE_EXHAUSTED beyond.
 * This is the limit where physical memory cannot be learned. */
#define SRV_SHM_MAX_BYTES_FALLBACK ((uint64_t)64 << 30)

typedef struct srv_shm_region {
  struct srv_shm_region *next; /* in its session's list (under srv_shm.mu) */
  atomic_int refs;             /* the registry's, plus one per transfer */
  uint64_t seq;                /* the session's number */
  dev_engine *engine;
  uint8_t *base; /* the mapping: byte_size bytes; NULL once retired */
  size_t size;
  bool pinned; /* dev_engine_host_register accepted it */
  int fd;      /* the object, kept open to notice truncation */
  char *name;  /* the client's name for it */
  char *key;   /* the POSIX shm name */
  /* Copies against retirement (srv_shm_copy_begin, srv_shm_retire). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int copying;        /* copies running now */
  bool retired;       /* unregistered: no copy may start */
  bool session_ended; /* retired because its session ended */
} srv_shm_region;

struct srv_shm {
  pthread_mutex_t mu;    /* guards the sessions' region lists and the counts */
  int key;               /* the scheduler observer's (sessions' state) */
  uint64_t count, bytes; /* registered regions and their mapped bytes */
  uint64_t max_bytes;    /* srv_shm_max_bytes(): per daemon and per session */
};

/* --- shm_region.c: regions and the registry ------------------------------------- */

/* Drops a reference; the last one unmaps and frees. Accepts NULL. */
void srv_shm_region_unref(srv_shm_region *r);
/* Retires a region that has left the registry (see "Lifetime"). Blocks for
 * as long as a copy runs. */
void srv_shm_retire(srv_shm_region *r, bool session_ended);
/* Retains region `name` of session `ss`: NOT_FOUND when there is none. */
pd_code srv_shm_get(srv_shm *h, sched_session *ss, const char *name,
                    srv_shm_region **out, dev_status *st);
/* The name's uniqueness in the session and the limits, for a region of
 * `want` bytes in a session with memory quota `quota` (0: none). */
pd_code srv_shm_room(srv_shm *h, sched_session *ss, const char *name,
                     uint64_t want, uint64_t quota, dev_status *st);
/* Lists `r` in session `ss` after checking the room again under the
 * registry's lock (another call of the session may have raced this one);
 * the session owns `r` on success (FAILED_PRECONDITION: it has ended). */
pd_code srv_shm_add(srv_shm *h, sched_session *ss, srv_shm_region *r,
                    uint64_t quota, dev_status *st);
/* Takes region `name` of session `ss` out of the registry; NULL if none. */
srv_shm_region *srv_shm_take(srv_shm *h, sched_session *ss, const char *name);
/* The memory quota of session `seq` (0: none) into *quota. */
pd_code srv_shm_session_quota(srv *s, uint64_t seq, uint64_t *quota,
                              dev_status *st);

/* One copy between `r` and a tensor or buffer: admitted unless `r` was
 * retired (CANCELLED), run under the SIGBUS guard, and counted so that
 * retiring `r` waits for it. `reading`: the copy reads the region. */
typedef pd_code (*srv_copy_fn)(void *arg, dev_status *st);
pd_code srv_shm_guarded(srv_shm_region *r, bool reading, srv_copy_fn fn,
                        void *arg, dev_status *st);

/* --- shm_header.c: the checks of a client's bytes -------------------------------- */

/* The longest token a header holds: what follows magic, version, length. */
#define SRV_SHM_TOKEN_MAX (SRV_SHM_HEADER_BYTES - 8)
/* True when `key` is "/" followed by 1 to SRV_SHM_KEY_MAX of [A-Za-z0-9._-],
 * and not "/." or "/..": a POSIX shm_open name with no path in it. */
bool srv_shm_key_ok(const char *key);
/* True when the first 64 bytes of a region, `got`, are the header of the
 * session whose token is token[0..len): "PDSHM", version SRV_SHM_VERSION,
 * len as 16 bits little-endian, the token, zeros. Compared in constant
 * time. False for a token longer than SRV_SHM_TOKEN_MAX. */
bool srv_shm_header_ok(const uint8_t got[SRV_SHM_HEADER_BYTES],
                       const uint8_t *token, size_t len);
/* OUT_OF_RANGE (naming region `name`) unless `bytes` at data offset
 * `offset` fit the data of a region of `size` bytes (the header's 64 bytes
 * excluded; a region no larger than its header holds none). */
pd_code srv_shm_check_range(size_t size, const char *name, uint64_t offset,
                            uint64_t bytes, dev_status *st);

/* --- shm_guard.c: the SIGBUS guard ------------------------------------------------ */

/* Runs fn(arg), a copy from or into r's mapping, so that a SIGBUS in the
 * mapping fails it (FAILED_PRECONDITION: truncated; RESOURCE_EXHAUSTED:
 * tmpfs full) instead of killing the daemon. */
pd_code srv_shm_guarded_copy(const srv_shm_region *r, bool reading,
                             srv_copy_fn fn, void *arg, dev_status *st);
/* Installs / removes the SIGBUS handler (srv_shm_init, srv_shm_destroy). */
void srv_shm_guard_install(void);
void srv_shm_guard_remove(void);

#endif /* PARADEV_SERVER_SHM_INT_H */
