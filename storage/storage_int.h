/* Private header of storage/ (after SQLite's btreeInt.h beside btree.h):
 * what the files of this folder share and what its tests reach. Nothing
 * outside storage/ and tests/storage/ includes it.
 *
 * Internal non-static names carry `stg__` (libuv's `uv__`). Lock order and
 * the path of a read are in storage/README.md.
 */
#ifndef PARADEV_STORAGE_INT_H
#define PARADEV_STORAGE_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "fetch.h"
#include "storage.h"

/* --- log.c --------------------------------------------------------------- */

/* Formats and hands one line to the stg_set_log hook (nothing when none is
 * set). level as syslog: 3 error, 4 warning, 6 info. Thread-safe. */
void stg__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* dev_error and the same message logged at `level` (a refusal the operator
 * should see: the root rule, a fetch that failed for good). */
pd_code stg__refuse(dev_status *st, pd_code code, int level, const char *fmt,
                    ...) __attribute__((format(printf, 4, 5)));

/* --- resolve.c: opening a path beneath one directory ---------------------- */

enum {
  STG__OPEN_READ = 0,   /* a regular file, O_RDONLY */
  STG__OPEN_DIR_RDONLY, /* a directory, O_RDONLY (fsync-able, a base fd) */
};

/* Opens `rel` (relative, no leading '/') beneath the directory `root_fd`
 * without following a symlink or `..` out of it and without magic links:
 * openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) where it works (probed
 * once: ENOSYS or EPERM mean no), else stg__walk_beneath. Absolute symlink
 * targets are refused even when they point inside (as RESOLVE_BENEATH
 * does). For STG__OPEN_READ the file is first opened O_PATH and checked
 * regular by fstat, then opened
 * O_RDONLY | O_NONBLOCK and checked to be the same inode, so a device is
 * never opened for reading and a FIFO never blocks.
 * Returns the fd (O_CLOEXEC) or -errno: -EXDEV (leaves the root), -ELOOP
 * (a symlink loop or a magic link), -ENOENT, -ENOTDIR, -EACCES, and
 * -STG__EFTYPE (exists but not a regular file / directory). */
#define STG__EFTYPE 100000
int stg__open_beneath(int root_fd, const char *rel, int kind);

/* The fallback walk, exposed so the tests run it on kernels that have
 * openat2 too. Same contract as stg__open_beneath. */
int stg__walk_beneath(int root_fd, const char *rel, int kind);

/* Test hook: force the fallback walk (true) or use openat2 when available
 * (false, the default). */
void stg__force_walk(bool on);

/* --- roots.c -------------------------------------------------------------- */

/* Which root a local path resolved under, and the part beneath it. */
typedef struct stg__local_target {
  int root_index;
  int root_fd; /* owned by the roots; valid while they live */
  char *rel;   /* malloc'd; "" for the root itself */
} stg__local_target;

/* Finds the root(s) for a local path: an absolute path must begin with a
 * root's directory (as configured or as its real path), a relative one is
 * tried under each root in order. Calls `try(arg, target)` for each
 * candidate until one returns something else than -ENOENT; the rule's
 * refusals (not beneath any root) come back as PERMISSION_DENIED naming the
 * roots, logged. `try` returns >= 0 (success, its value returned through
 * *result) or -errno. Errors of try map by stg__errno_code. */
typedef int (*stg__try_fn)(void *arg, const stg__local_target *t);
pd_code stg__roots_local(const stg_roots *r, const char *path, const char *what,
                         stg__try_fn try, void *arg, int *result,
                         dev_status *st);

/* Checks a URL against the URL roots: normalised (scheme and host
 * lowercased, default port dropped), no userinfo, no `.`/`..` segments
 * (percent-encoded ones too), no fragment, then a prefix of a root at a
 * segment boundary. On success *norm is the normalised URL (malloc'd). */
pd_code stg__roots_url(const stg_roots *r, const char *url, char **norm,
                       dev_status *st);

/* True when `name` looks like a URL (scheme "://"). */
bool stg__is_url(const char *name);

/* The status code of a resolution errno, with a message naming `path`,
 * the root and `what` ("read", "write"); refusals are logged. */
pd_code stg__errno_code(int neg_errno, const char *path, const char *root,
                        const char *what, dev_status *st);

/* A URL for messages: the query string (a presigned URL's signature) cut,
 * written into buf. */
const char *stg__url_for_msg(const char *url, char *buf, size_t cap);

/* --- cache.c -------------------------------------------------------------- */

/* One open file as the cache sees it: the fetcher and its handle, and the
 * cache's record of the file (blocks, signature). Created by file.c. */
typedef struct stg__cfile stg__cfile;

/* Attaches a file of `identity` and `sig` (size included) to the cache:
 * returns its record, dropping a record of the same identity whose
 * signature differs (its blocks are evicted; readers still holding them
 * finish). The record is reference-counted; release with stg__cache_detach.
 * c may be NULL (no caching). */
stg__cfile *stg__cache_attach(stg_cache *c, const char *identity,
                              const stg_signature *sig);
void stg__cache_detach(stg_cache *c, stg__cfile *cf);

/* Reads [offset, offset + len) of the file through the cache, fetching
 * missing blocks with `fetch(fctx, ...)`. The range is within the file. */
typedef pd_code (*stg__fetch_fn)(void *fctx, uint64_t offset, void *buf,
                                 size_t len, dev_status *st);
pd_code stg__cache_read(stg_cache *c, stg__cfile *cf, const char *name,
                        stg__fetch_fn fetch, void *fctx, uint64_t offset,
                        void *buf, size_t len, dev_status *st);
/* The same range handed to fn span by span (stg_entry_read_spans): slices
 * of the cached blocks under a reference, or for a bypass, pieces fetched
 * into a temporary buffer. */
pd_code stg__cache_read_spans(stg_cache *c, stg__cfile *cf, const char *name,
                              stg__fetch_fn fetch, void *fctx, uint64_t offset,
                              size_t len, stg_span_fn fn, void *arg,
                              dev_status *st);

/* The cache's configuration with defaults filled in (NULL: the defaults). */
void stg__cache_config_get(const stg_cache *c, stg_cache_config *out);

/* Test hook: the bound on a wait for another reader's fetch, in seconds
 * (default max(60, fetch_timeout_s * (fetch_retries + 2))). */
void stg__cache_set_wait_bound(stg_cache *c, double seconds);

/* --- file.c: the test hook ------------------------------------------------ */

/* Opens `name` through `fetcher` (a test's table) without the roots: the
 * way the tests count fetches, inject failures and slow a fetch. */
pd_code stg__file_open_with(stg_cache *c, const stg_fetcher *fetcher,
                            const char *name, stg_file **out, dev_status *st);

/* --- fetch_http.c --------------------------------------------------------- */

/* Test hook: the first retry's backoff in seconds (default 0.2; doubles on
 * each retry). */
void stg__http_set_backoff(double first_s);

#endif /* PARADEV_STORAGE_INT_H */
