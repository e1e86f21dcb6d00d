/* The RAM block cache, after TensorFlow's RamFileBlockCache
 * (tensorflow/c/experimental/filesystem/plugins/gcs/ram_file_block_cache.cc):
 *
 *   - blocks keyed by (file record, block index); a file record is one
 *     version of one file: its identity (local dev:ino, or the URL) and its
 *     signature. Attaching a file whose signature changed drops the old
 *     record's blocks (TF's ValidateAndUpdateFileSignature + RemoveFile).
 *   - a block is counted by the bytes allocated for it; blocks are kept in
 *     LRU order and evicted from the tail until the total is within
 *     cache_bytes, after each insertion, so it is never above the budget.
 *   - the first reader of a missing block fetches it, outside the lock;
 *     readers of the same block meanwhile wait (bounded) on the cache's
 *     condition variable for that one fetch (TF's per-block state
 *     CREATED -> FETCHING -> FINISHED). A failed fetch is not cached: the
 *     block leaves the map, the readers that waited for it get its error
 *     (but for CANCELLED, its reader's own: they fetch it again themselves),
 *     and the next reader fetches again (TF sets the state back to CREATED).
 *   - with max_staleness_s > 0, a lookup that finds a block older than that
 *     drops every block of its file (TF's staleness check in Lookup).
 *   - reads larger than the budget (or every read with cache_bytes 0) bypass
 *     the cache: fetched straight into the caller's buffer. A budget below
 *     one block is refused at create.
 *
 * Lock order: c->mu is a leaf; no fetcher is ever called under it. Data of a
 * READY block is immutable, so it is copied out without the lock, under a
 * reference (refs) that keeps an evicted block alive until its readers are
 * done.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "storage_int.h"

enum { STG_FETCHING, STG_READY, STG_FAILED };

typedef struct stg_block stg_block;
struct stg_block {
  stg__cfile *file;
  uint64_t index;
  int state;
  int refs;
  bool in_map;
  unsigned char *data;
  size_t len;
  double fetched_at; /* monotonic seconds */
  dev_status err;    /* STG_FAILED */
  stg_block *hnext;
  stg_block *prev, *next; /* LRU, READY blocks in the map only */
};

struct stg__cfile {
  char *identity;
  stg_signature sig;
  int refs;         /* open stg_files */
  bool live;        /* in c->files (false once replaced by a new version) */
  uint64_t nblocks; /* blocks of it in the map */
  stg__cfile *next;
};

struct stg_cache {
  stg_cache_config cfg;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast when any fetch ends */
  stg_block **buckets;
  size_t nbuckets, nblocks;
  stg_block lru; /* sentinel: lru.next most recent, lru.prev the victim */
  stg__cfile *files;
  stg_cache_stats stats;
  double wait_bound_s;
  /* Freed block memory kept for the next miss (full blocks of the mapped
   * kind only), linked through its first bytes; pool_bytes + bytes_cached
   * stays within cache_bytes. */
  void *pool;
  uint64_t pool_bytes;
};

static double stg_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void stg_defaults(stg_cache_config *c) {
  memset(c, 0, sizeof *c);
  c->struct_size = STG_CACHE_CONFIG_STRUCT_SIZE;
  c->block_size = 16u << 20;
  c->cache_bytes = 1u << 30;
  c->max_staleness_s = 0;
  c->fetch_timeout_s = 30;
  c->fetch_retries = 3;
}

void stg__cache_config_get(const stg_cache *c, stg_cache_config *out) {
  if (c)
    *out = c->cfg;
  else
    stg_defaults(out);
}

pd_code stg_cache_create(const stg_cache_config *cfg, stg_cache **out,
                         dev_status *st) {
  stg_cache_config k;
  stg_defaults(&k);
  if (cfg) {
    if (cfg->struct_size < sizeof(size_t) ||
        cfg->struct_size > STG_CACHE_CONFIG_STRUCT_SIZE)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "stg_cache_config.struct_size %zu (expected %zu)",
                       cfg->struct_size, STG_CACHE_CONFIG_STRUCT_SIZE);
    memcpy(&k, cfg, cfg->struct_size);
    k.struct_size = STG_CACHE_CONFIG_STRUCT_SIZE;
  }
  if (k.block_size == 0 || k.max_staleness_s < 0 || k.fetch_timeout_s <= 0 ||
      k.fetch_retries < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "storage cache: block_size %" PRIu64
                     " (expected > 0), max_staleness_s %g (>= 0), "
                     "fetch_timeout_s %g (> 0), fetch_retries %d (>= 0)",
                     k.block_size, k.max_staleness_s, k.fetch_timeout_s,
                     k.fetch_retries);
  if (k.cache_bytes > 0 && k.cache_bytes < k.block_size)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "storage cache: cache_bytes %" PRIu64
                     " is smaller than one block (block_size %" PRIu64
                     "): expected 0 (no cache) or at least one block",
                     k.cache_bytes, k.block_size);
  stg_cache *c = calloc(1, sizeof *c);
  if (!c) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  c->cfg = k;
  c->nbuckets = 64;
  c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
  if (!c->buckets) {
    free(c);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  }
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  c->lru.next = c->lru.prev = &c->lru;
  double b = k.fetch_timeout_s * (k.fetch_retries + 2);
  c->wait_bound_s = b > 60 ? b : 60;
  *out = c;
  return PD_OK;
}

void stg__cache_set_wait_bound(stg_cache *c, double seconds) {
  pthread_mutex_lock(&c->mu);
  c->wait_bound_s = seconds;
  pthread_mutex_unlock(&c->mu);
}

static void stg_cfile_free(stg__cfile *f);

/* Block memory: blocks of 1 MiB and more are mapped anonymously with
 * transparent huge pages asked for (MADV_HUGEPAGE), so the first touch of a
 * 16 MiB block costs a few faults instead of 4096. Mapping the file itself
 * (no copy) was rejected: a truncated file would raise SIGBUS in the daemon
 * and a rewritten one would change cached bytes under readers.
 *
 * The memory of a full mapped block that leaves the cache (evicted, its file
 * changed, a failed fetch) goes to c->pool while pool_bytes + bytes_cached
 * stays within cache_bytes, and the next miss takes it from there: faulting
 * and zeroing fresh pages cost as much as the fetch itself (perf on
 * bench_checkpoint: clear_page 29% of a cold load's samples), so the cache
 * pays them once up to its budget, not on every load of a new version. The
 * pool never holds more than the budget allows the cache to hold anyway. */
#define STG_MAP_MIN (1u << 20)

static bool stg_pooled(const stg_cache *c, size_t len) {
  return len >= STG_MAP_MIN && len == c->cfg.block_size;
}

static unsigned char *stg_map(size_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) return NULL;
  madvise(p, len, MADV_HUGEPAGE);
  return p;
}

/* A block's memory: from the pool when one is there (c->mu held). */
static unsigned char *stg_pool_take(stg_cache *c, size_t len) {
  if (!stg_pooled(c, len) || !c->pool) return NULL;
  void *p = c->pool;
  memcpy(&c->pool, p, sizeof c->pool);
  c->pool_bytes -= len;
  return p;
}

static unsigned char *stg_data_alloc(size_t len) {
  if (len < STG_MAP_MIN) return malloc(len ? len : 1);
  return stg_map(len);
}

/* Frees block memory, or keeps it in the pool (c->mu held, or c NULL). */
static void stg_data_free(stg_cache *c, unsigned char *p, size_t len) {
  if (!p) return;
  if (len < STG_MAP_MIN) {
    free(p);
  } else if (c && stg_pooled(c, len) &&
             c->pool_bytes + c->stats.bytes_cached + len <=
                 c->cfg.cache_bytes) {
    memcpy(p, &c->pool, sizeof c->pool);
    c->pool = p;
    c->pool_bytes += len;
  } else {
    munmap(p, len);
  }
}

/* Unmaps pooled memory until the pool and the cached blocks fit the budget
 * (c->mu held). */
static void stg_pool_trim(stg_cache *c) {
  while (c->pool &&
         c->pool_bytes + c->stats.bytes_cached > c->cfg.cache_bytes) {
    size_t len = (size_t)c->cfg.block_size;
    unsigned char *p = stg_pool_take(c, len);
    munmap(p, len);
  }
}

static void stg_block_free(stg_cache *c, stg_block *b) {
  stg_data_free(c, b->data, b->len);
  free(b);
}

void stg_cache_destroy(stg_cache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->nbuckets; i++)
    for (stg_block *b = c->buckets[i], *n; b; b = n) {
      n = b->hnext;
      stg__cfile *f = b->file; /* a replaced version is not in c->files */
      if (!f->live && --f->nblocks == 0 && f->refs == 0) stg_cfile_free(f);
      stg_block_free(NULL, b);
    }
  for (stg__cfile *f = c->files, *n; f; f = n) {
    n = f->next;
    free(f->identity);
    free(f);
  }
  while (c->pool)
    munmap(stg_pool_take(c, (size_t)c->cfg.block_size),
           (size_t)c->cfg.block_size);
  free(c->buckets);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void stg_cache_get_stats(stg_cache *c, stg_cache_stats *out) {
  if (!c) {
    memset(out, 0, sizeof *out);
    return;
  }
  pthread_mutex_lock(&c->mu);
  *out = c->stats;
  pthread_mutex_unlock(&c->mu);
}

/* --- the map and the LRU (c->mu held) ------------------------------------- */

static size_t stg_hash(const stg_cache *c, const stg__cfile *f, uint64_t i) {
  uint64_t h = (uint64_t)(uintptr_t)f * 0x9E3779B97F4A7C15ull ^
               (i + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
  return (size_t)(h ^ (h >> 29)) & (c->nbuckets - 1);
}

static stg_block *stg_lookup(stg_cache *c, stg__cfile *f, uint64_t i) {
  for (stg_block *b = c->buckets[stg_hash(c, f, i)]; b; b = b->hnext)
    if (b->file == f && b->index == i) return b;
  return NULL;
}

static void stg_grow(stg_cache *c) {
  size_t n = c->nbuckets * 2;
  stg_block **nb = calloc(n, sizeof *nb);
  if (!nb) return; /* longer chains, still correct */
  stg_block **old = c->buckets;
  size_t on = c->nbuckets;
  c->buckets = nb;
  c->nbuckets = n;
  for (size_t i = 0; i < on; i++)
    for (stg_block *b = old[i], *nx; b; b = nx) {
      nx = b->hnext;
      size_t h = stg_hash(c, b->file, b->index);
      b->hnext = nb[h];
      nb[h] = b;
    }
  free(old);
}

static void stg_insert(stg_cache *c, stg_block *b) {
  if (c->nblocks + 1 > c->nbuckets) stg_grow(c);
  size_t h = stg_hash(c, b->file, b->index);
  b->hnext = c->buckets[h];
  c->buckets[h] = b;
  b->in_map = true;
  c->nblocks++;
  b->file->nblocks++;
}

static void stg_lru_unlink(stg_block *b) {
  if (b->prev) {
    b->prev->next = b->next;
    b->next->prev = b->prev;
    b->prev = b->next = NULL;
  }
}

static void stg_lru_front(stg_cache *c, stg_block *b) {
  stg_lru_unlink(b);
  b->next = c->lru.next;
  b->prev = &c->lru;
  c->lru.next->prev = b;
  c->lru.next = b;
}

static void stg_cfile_free(stg__cfile *f) {
  free(f->identity);
  free(f);
}

static void stg_cfile_unlink(stg_cache *c, stg__cfile *f) {
  for (stg__cfile **p = &c->files; *p; p = &(*p)->next)
    if (*p == f) {
      *p = f->next;
      break;
    }
  f->live = false;
}

/* Takes b out of the map (and the LRU and the budget); frees it when no
 * reader holds it; frees its file record when that was its last block and
 * no stg_file holds the record. */
static void stg_remove(stg_cache *c, stg_block *b, bool evicted) {
  stg_block **p = &c->buckets[stg_hash(c, b->file, b->index)];
  while (*p != b) p = &(*p)->hnext;
  *p = b->hnext;
  b->in_map = false;
  c->nblocks--;
  stg__cfile *f = b->file;
  f->nblocks--;
  if (b->state == STG_READY) {
    stg_lru_unlink(b);
    c->stats.bytes_cached -= b->len;
    c->stats.blocks_cached--;
    if (evicted) c->stats.evictions++;
  }
  if (b->refs == 0) stg_block_free(c, b);
  if (f->nblocks == 0 && f->refs == 0) {
    if (f->live) stg_cfile_unlink(c, f);
    stg_cfile_free(f);
  }
}

/* Drops every block of `f` (a changed or stale file). Blocks being fetched
 * leave the map too; their fetch completes into a detached block. */
static void stg_drop_file(stg_cache *c, stg__cfile *f) {
  f->refs++; /* keep f alive through the removals */
  for (size_t i = 0; i < c->nbuckets && f->nblocks > 0; i++)
    for (stg_block *b = c->buckets[i], *n; b; b = n) {
      n = b->hnext;
      if (b->file == f) stg_remove(c, b, true);
    }
  f->refs--;
}

static void stg_evict_to_budget(stg_cache *c) {
  while (c->stats.bytes_cached > c->cfg.cache_bytes && c->lru.prev != &c->lru)
    stg_remove(c, c->lru.prev, true);
}

/* --- files --------------------------------------------------------------- */

stg__cfile *stg__cache_attach(stg_cache *c, const char *identity,
                              const stg_signature *sig) {
  if (c) {
    pthread_mutex_lock(&c->mu);
    for (stg__cfile *f = c->files; f; f = f->next) {
      if (strcmp(f->identity, identity) != 0) continue;
      if (f->sig.size == sig->size && !strcmp(f->sig.text, sig->text)) {
        f->refs++;
        pthread_mutex_unlock(&c->mu);
        return f;
      }
      stg_cfile_unlink(c, f); /* a new version: the old one's blocks go */
      f->refs++;
      stg_drop_file(c, f);
      if (--f->refs == 0) stg_cfile_free(f);
      break;
    }
  }
  stg__cfile *f = calloc(1, sizeof *f);
  if (f && !(f->identity = strdup(identity))) {
    free(f);
    f = NULL;
  }
  if (f) {
    f->sig = *sig;
    f->refs = 1;
    if (c) {
      f->live = true;
      f->next = c->files;
      c->files = f;
    }
  }
  if (c) pthread_mutex_unlock(&c->mu);
  return f;
}

void stg__cache_detach(stg_cache *c, stg__cfile *f) {
  if (!f) return;
  if (!c) {
    stg_cfile_free(f);
    return;
  }
  pthread_mutex_lock(&c->mu);
  if (--f->refs == 0 && f->nblocks == 0) {
    if (f->live) stg_cfile_unlink(c, f);
    stg_cfile_free(f);
  }
  pthread_mutex_unlock(&c->mu);
}

/* --- reads ---------------------------------------------------------------- */

static void stg_release(stg_cache *c, stg_block *b) {
  pthread_mutex_lock(&c->mu);
  if (--b->refs == 0 && !b->in_map) stg_block_free(c, b);
  pthread_mutex_unlock(&c->mu);
}

/* Fetches a block this reader created (called without the lock) into
 * `data` (memory from the pool) or, NULL, fresh memory. */
static pd_code stg_fetch_block(stg_cache *c, stg_block *b, size_t len,
                               unsigned char *data, stg__fetch_fn fetch,
                               void *fctx, dev_status *st) {
  dev_status fst = DEV_STATUS_INIT;
  if (!data) data = stg_data_alloc(len);
  pd_code rc =
      data ? fetch(fctx, b->index * c->cfg.block_size, data, len, &fst)
           : dev_error(&fst, PD_RESOURCE_EXHAUSTED,
                       "out of memory for a cache block of %zu bytes", len);
  pthread_mutex_lock(&c->mu);
  c->stats.fetches += data != NULL;
  if (rc == PD_OK) {
    c->stats.bytes_fetched += len;
    b->data = data;
    b->len = len;
    b->state = STG_READY;
    b->fetched_at = stg_now();
    if (b->in_map) {
      c->stats.bytes_cached += len;
      c->stats.blocks_cached++;
      stg_lru_front(c, b);
      stg_evict_to_budget(c);
      stg_pool_trim(c);
    }
  } else {
    stg_data_free(c, data, len);
    c->stats.fetch_errors++;
    b->state = STG_FAILED;
    b->err = fst;
    if (b->in_map) stg_remove(c, b, false); /* refs > 0: stays allocated */
  }
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (rc != PD_OK && st) *st = fst;
  return rc;
}

static bool stg_stale(const stg_cache *c, const stg_block *b) {
  return c->cfg.max_staleness_s > 0 && b->state == STG_READY &&
         stg_now() - b->fetched_at > c->cfg.max_staleness_s;
}

/* Waits (c->mu held) for another reader's fetch of b. */
static pd_code stg_wait(stg_cache *c, stg_block *b, const char *name,
                        dev_status *st) {
  double until = stg_now() + c->wait_bound_s;
  struct timespec ts = {(time_t)until,
                        (long)((until - (double)(time_t)until) * 1e9)};
  while (b->state == STG_FETCHING) {
    int e = pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    if (e == ETIMEDOUT && b->state == STG_FETCHING)
      return dev_error(
          st, PD_DEADLINE_EXCEEDED,
          "waited %.0f s for another reader's fetch of block %" PRIu64
          " of '%s'",
          c->wait_bound_s, b->index, name);
  }
  if (b->state == STG_FAILED) {
    if (st) *st = b->err;
    return b->err.code;
  }
  return PD_OK;
}

/* Returns block `i` READY with a reference held, fetching it if missing;
 * *waited: it waited for another reader's fetch. */
static pd_code stg_get_block_once(stg_cache *c, stg__cfile *f, uint64_t i,
                                  size_t len, const char *name,
                                  stg__fetch_fn fetch, void *fctx,
                                  stg_block **out, bool *waited,
                                  dev_status *st) {
  pthread_mutex_lock(&c->mu);
  stg_block *b = stg_lookup(c, f, i);
  if (b && stg_stale(c, b)) {
    stg_drop_file(c, f);
    b = NULL;
  }
  if (b && b->state == STG_READY) {
    c->stats.hits++;
    b->refs++;
    stg_lru_front(c, b);
    pthread_mutex_unlock(&c->mu);
    *out = b;
    return PD_OK;
  }
  if (b) { /* FETCHING by another reader */
    *waited = true;
    c->stats.waits++;
    b->refs++;
    pd_code rc = stg_wait(c, b, name, st);
    pthread_mutex_unlock(&c->mu);
    if (rc != PD_OK) {
      stg_release(c, b);
      return rc;
    }
    *out = b;
    return PD_OK;
  }
  b = calloc(1, sizeof *b);
  if (!b) {
    pthread_mutex_unlock(&c->mu);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  }
  b->file = f;
  b->index = i;
  b->state = STG_FETCHING;
  b->refs = 1;
  stg_insert(c, b);
  c->stats.misses++;
  unsigned char *data = stg_pool_take(c, len);
  pthread_mutex_unlock(&c->mu);
  pd_code rc = stg_fetch_block(c, b, len, data, fetch, fctx, st);
  if (rc != PD_OK) {
    stg_release(c, b);
    return rc;
  }
  *out = b;
  return PD_OK;
}

/* stg_get_block_once; a wait for another reader's fetch that its reader
 * cancelled (its session ended, its call gave up: stg_io_ctl) is no error
 * of this reader, which then fetches the block itself (a few times at
 * most). */
static pd_code stg_get_block(stg_cache *c, stg__cfile *f, uint64_t i,
                             size_t len, const char *name, stg__fetch_fn fetch,
                             void *fctx, stg_block **out, dev_status *st) {
  for (int tries = 0;; tries++) {
    bool waited = false;
    pd_code rc =
        stg_get_block_once(c, f, i, len, name, fetch, fctx, out, &waited, st);
    if (rc != PD_CANCELLED || !waited || tries >= 3) return rc;
  }
}

static pd_code stg_bypass(stg_cache *c, stg__fetch_fn fetch, void *fctx,
                          uint64_t offset, void *buf, size_t len,
                          dev_status *st) {
  pd_code rc = fetch(fctx, offset, buf, len, st);
  if (c) {
    pthread_mutex_lock(&c->mu);
    c->stats.bypass_reads++;
    c->stats.fetches++;
    if (rc == PD_OK)
      c->stats.bytes_fetched += len;
    else
      c->stats.fetch_errors++;
    pthread_mutex_unlock(&c->mu);
  }
  return rc;
}

/* A bypassed range, in pieces of at most one block through a buffer. */
static pd_code stg_bypass_spans(stg_cache *c, stg__fetch_fn fetch, void *fctx,
                                uint64_t offset, size_t len, stg_span_fn fn,
                                void *arg, dev_status *st) {
  stg_cache_config cfg;
  stg__cache_config_get(c, &cfg);
  size_t cap = len < cfg.block_size ? len : (size_t)cfg.block_size;
  unsigned char *buf = stg_data_alloc(cap);
  if (!buf)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of memory for a read buffer of %zu bytes", cap);
  pd_code rc = PD_OK;
  for (size_t done = 0; rc == PD_OK && done < len;) {
    size_t n = len - done < cap ? len - done : cap;
    rc = stg_bypass(c, fetch, fctx, offset + done, buf, n, st);
    if (rc == PD_OK) rc = fn(arg, done, buf, n, st);
    done += n;
  }
  stg_data_free(NULL, buf, cap);
  return rc;
}

pd_code stg__cache_read_spans(stg_cache *c, stg__cfile *f, const char *name,
                              stg__fetch_fn fetch, void *fctx, uint64_t offset,
                              size_t len, stg_span_fn fn, void *arg,
                              dev_status *st) {
  if (len == 0) return PD_OK;
  if (!c || c->cfg.cache_bytes == 0 || len > c->cfg.cache_bytes)
    return stg_bypass_spans(c, fetch, fctx, offset, len, fn, arg, st);
  uint64_t bs = c->cfg.block_size;
  uint64_t size = f->sig.size;
  uint64_t end = offset + len;
  for (uint64_t i = offset / bs; i * bs < end; i++) {
    uint64_t bstart = i * bs;
    size_t blen = (size_t)(size - bstart < bs ? size - bstart : bs);
    stg_block *b = NULL;
    pd_code rc = stg_get_block(c, f, i, blen, name, fetch, fctx, &b, st);
    if (rc != PD_OK) return rc;
    uint64_t from = offset > bstart ? offset : bstart;
    uint64_t to = end < bstart + blen ? end : bstart + blen;
    rc = fn(arg, from - offset, b->data + (from - bstart), (size_t)(to - from),
            st);
    stg_release(c, b);
    if (rc != PD_OK) return rc;
  }
  return PD_OK;
}

pd_code stg__cache_read(stg_cache *c, stg__cfile *f, const char *name,
                        stg__fetch_fn fetch, void *fctx, uint64_t offset,
                        void *buf, size_t len, dev_status *st) {
  if (len == 0) return PD_OK;
  if (!c || c->cfg.cache_bytes == 0 || len > c->cfg.cache_bytes)
    return stg_bypass(c, fetch, fctx, offset, buf, len, st);
  uint64_t bs = c->cfg.block_size;
  uint64_t size = f->sig.size;
  unsigned char *dst = buf;
  uint64_t end = offset + len;
  for (uint64_t i = offset / bs; i * bs < end; i++) {
    uint64_t bstart = i * bs;
    size_t blen = (size_t)(size - bstart < bs ? size - bstart : bs);
    stg_block *b = NULL;
    pd_code rc = stg_get_block(c, f, i, blen, name, fetch, fctx, &b, st);
    if (rc != PD_OK) return rc;
    uint64_t from = offset > bstart ? offset : bstart;
    uint64_t to = end < bstart + blen ? end : bstart + blen;
    memcpy(dst + (from - offset), b->data + (from - bstart),
           (size_t)(to - from));
    stg_release(c, b);
  }
  return PD_OK;
}
