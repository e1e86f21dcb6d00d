/* The SIGBUS guard of copies from and into shared memory mappings (see
 * shm_int.h, "Truncation"). */
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
#include "shm_int.h"

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
pd_code srv_shm_guarded_copy(const srv_shm_region *r, bool reading,
                             srv_copy_fn fn, void *arg, dev_status *st) {
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
  if (rc == PD_OK && r->fd >= 0 && fstat(r->fd, &sb) == 0 &&
      (uint64_t)sb.st_size < r->size)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "shared memory region \"%.128s\" (%s) was truncated "
                     "to %lld of the %zu bytes it was registered with; keep "
                     "the object at least byte_size bytes while it is "
                     "registered",
                     r->name, r->key, (long long)sb.st_size, r->size);
  return rc;
}

void srv_shm_guard_install(void) {
  if (srv_bus_installed) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = srv_bus_handler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGBUS, &sa, &srv_bus_old) == 0)
    srv_bus_installed = true;
  else
    SRV_WARN(
        "cannot install the SIGBUS handler (%s): a client that "
        "truncates a registered region can crash the daemon",
        strerror(errno));
}

void srv_shm_guard_remove(void) {
  if (!srv_bus_installed) return;
  sigaction(SIGBUS, &srv_bus_old, NULL);
  srv_bus_installed = false;
}
