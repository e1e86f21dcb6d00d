/* Storage: checkpoints read and written by the daemon itself (issue #13).
 *
 * This is the one header other layers (scheduler/, server/, tests) include.
 * It speaks device.h's types (pd_code, dev_status, dev_shape, pd_dtype) and
 * never includes a gRPC header. Conventions as device.h: functions that can
 * fail return a pd_code and take a `dev_status *` last (may be NULL);
 * out-parameters are written only on success; nothing here logs (refusals
 * reach the daemon through stg_set_log, which only the daemon sets).
 *
 * Four parts, one file group each (see storage/README.md):
 *   roots    where the daemon may read and write: configured local roots and
 *            URL prefixes; paths resolved beneath a root without following
 *            symlinks or `..` out of it (openat2 RESOLVE_BENEATH, else an
 *            equivalent walk); only regular files; PERMISSION_DENIED naming
 *            the root rule otherwise. Writes are atomic (temp file in the same
 *            directory, fsync, rename, fsync of the directory).
 *   fetchers a table of ways to read bytes (starting with struct_size):
 *            local files (pread) and http:// / https:// range reads (libcurl).
 *            Each open file has a signature (device, inode, size, mtime and
 *            ctime ns; ETag or Last-Modified) checked on open.
 *   cache    one RAM block cache per daemon, after TensorFlow's
 *            RamFileBlockCache: blocks keyed by (file signature, aligned
 *            offset), LRU to a byte budget, one fetch per block however many
 *            readers wait, failed fetches not cached, optional staleness,
 *            reads larger than the budget bypass it.
 *   formats  safetensors, .npy (1.0, 2.0, 3.0) and .npz (stored or deflated
 *            members): an index of a file's tensors, reads of a tensor's
 *            bytes as a C-order little-endian host value, and writers.
 *
 * Thread safety: every function may be called from any thread; one stg_file
 * may be read from several threads at once.
 */
#ifndef PARADEV_STORAGE_H
#define PARADEV_STORAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where refusals are reported (PERMISSION_DENIED by the root rule, and
 * every fetch retry): the daemon sets it once at start, before any other
 * call; NULL (the default) drops them. level: 3 error, 4 warning, 6 info, as
 * syslog. Must be thread-safe. */
typedef void (*stg_log_fn)(int level, const char *msg);
void stg_set_log(stg_log_fn fn);

/* --- roots ----------------------------------------------------------------- */

typedef struct stg_roots stg_roots;

/* Builds the allowed roots from `n` entries: an absolute local directory
 * ("/srv/models"), or a URL prefix ("https://bucket.example/models/").
 * INVALID_ARGUMENT naming the entry for a relative path, a directory that
 * does not exist, or a URL prefix without scheme and host. n == 0 is valid:
 * nothing is readable or writable. */
pd_code stg_roots_create(const char *const *entries, int n, stg_roots **out,
                         dev_status *st);
void stg_roots_destroy(stg_roots *r);
/* How many entries; entry i as configured (for GetServerInfo and logs). */
int stg_roots_count(const stg_roots *r);
const char *stg_roots_entry(const stg_roots *r, int i);

/* An atomic output file: created as a temporary file in the target's
 * directory (beneath a root), renamed into place by stg_out_commit. */
typedef struct stg_out stg_out;

/* PERMISSION_DENIED (not beneath a root, a symlink out of it, not a regular
 * file), ALREADY_EXISTS (the target exists and !overwrite), NOT_FOUND (the
 * directory does not exist), RESOURCE_EXHAUSTED (disk full, quota). */
pd_code stg_out_create(const stg_roots *r, const char *path, bool overwrite,
                       stg_out **out, dev_status *st);
pd_code stg_out_write(stg_out *o, const void *data, size_t len, dev_status *st);
/* The absolute path the file gets: the root's entry as configured, the
 * directory beneath it and the name ("/a/sub/x.npy"). A relative path goes
 * to the first root that already holds that file, else to the first root
 * where its directory exists (storage/README.md, "Where a save goes").
 * Valid until commit or abort. */
const char *stg_out_path(const stg_out *o);
/* fsync, rename into place (refusing to replace unless overwrite), fsync of
 * the directory; frees `o` whatever it returns. */
pd_code stg_out_commit(stg_out *o, dev_status *st);
/* Removes the temporary file; frees `o`. Accepts NULL. */
void stg_out_abort(stg_out *o);

/* --- cache and files --------------------------------------------------------- */

typedef struct stg_cache_config {
  size_t struct_size;
  uint64_t block_size;    /* bytes; default 16 MiB */
  uint64_t cache_bytes;   /* budget; default 1 GiB; 0 disables caching */
  double max_staleness_s; /* 0: only the signature decides */
  double fetch_timeout_s; /* per HTTP request; default 30 */
  int fetch_retries;      /* HTTP retries with backoff; default 3 */
} stg_cache_config;
#define STG_CACHE_CONFIG_STRUCT_SIZE sizeof(stg_cache_config)

typedef struct stg_cache stg_cache;

typedef struct stg_cache_stats {
  uint64_t hits, misses;  /* block lookups */
  uint64_t waits;         /* lookups that waited for another reader's fetch */
  uint64_t evictions;     /* blocks dropped for the budget or staleness */
  uint64_t bytes_cached;  /* now, as allocated */
  uint64_t blocks_cached; /* now */
  uint64_t bytes_fetched; /* from storage, all fetchers */
  uint64_t fetches;       /* fetcher calls */
  uint64_t fetch_errors;
  uint64_t bypass_reads; /* reads larger than the budget */
} stg_cache_stats;

/* cfg NULL: the defaults. INVALID_ARGUMENT for a struct_size this build does
 * not know, block_size 0, 0 < cache_bytes < block_size, a negative staleness
 * or retry count, fetch_timeout_s <= 0. Destroy only after every file of the
 * cache is closed. */
pd_code stg_cache_create(const stg_cache_config *cfg, stg_cache **out,
                         dev_status *st);
void stg_cache_destroy(stg_cache *c);
void stg_cache_get_stats(stg_cache *c, stg_cache_stats *out);

typedef struct stg_file stg_file;

/* Opens a local path or URL allowed by `roots` and checks its signature
 * against what the cache holds (a changed file's blocks are dropped).
 * PERMISSION_DENIED (the root rule, named), NOT_FOUND, UNAVAILABLE (HTTP
 * unreachable after retries), DEADLINE_EXCEEDED. */
pd_code stg_file_open(stg_cache *c, const stg_roots *roots, const char *name,
                      stg_file **out, dev_status *st);
/* What bounds the fetches of one open file (issue #13: a stalled source
 * must not hold a daemon thread past its caller). deadline_s: seconds on
 * stg_now_s's clock, 0 for none; each HTTP request's timeout is then
 * min(fetch_timeout_s, time left), no retry starts after it, and a fetch
 * past it fails DEADLINE_EXCEEDED. cancel: NULL, or a flag that, once set,
 * makes every fetch of the file stop with CANCELLED (a transfer in progress
 * aborts through libcurl's progress callback, within about a second at
 * worst; the backoff between retries within 50 ms). The flag must outlive
 * the file. */
typedef struct stg_io_ctl {
  double deadline_s;
  const atomic_bool *cancel;
} stg_io_ctl;

/* CLOCK_MONOTONIC, in seconds. */
double stg_now_s(void);

/* stg_file_open, its fetches (the open, and every later read of the file)
 * bounded by *ctl (copied; NULL: none). CANCELLED once ctl->cancel is set;
 * DEADLINE_EXCEEDED past ctl->deadline_s; else as stg_file_open. */
pd_code stg_file_open_ctl(stg_cache *c, const stg_roots *roots,
                          const char *name, const stg_io_ctl *ctl,
                          stg_file **out, dev_status *st);
/* Replaces the file's deadline (0: none) for its later reads, e.g. once
 * the call that opened it has answered. Not while another thread reads f. */
void stg_file_set_deadline(stg_file *f, double deadline_s);
uint64_t stg_file_size(const stg_file *f);
const char *stg_file_name(const stg_file *f); /* as given, for messages */
/* Reads exactly `len` bytes at `offset` through the cache. OUT_OF_RANGE past
 * the end (naming the file, offset and size); DATA_LOSS when the file changed
 * under the reader (signature or short read); UNAVAILABLE for a fetch that
 * failed after retries. Thread-safe. */
pd_code stg_file_pread(stg_file *f, uint64_t offset, void *buf, size_t len,
                       dev_status *st);
/* Receives one span of stg_file_read_spans or stg_entry_read_spans: the `len` bytes that lie
 * `done` bytes after the start of the range read. `data` is valid only
 * during the call (it may point into a cache block); a code other than
 * PD_OK stops the read and is its result. */
typedef pd_code (*stg_span_fn)(void *arg, uint64_t done, const void *data,
                               size_t len, dev_status *st);

/* The bytes stg_file_pread would read, handed to `fn` in order as spans
 * that cover the range exactly (none for len 0): slices of the cached
 * blocks, read-only, kept alive for the call; a read that bypasses the cache
 * goes through a temporary buffer of at most one block. Errors: those of
 * stg_file_pread, and fn's. Thread-safe; fn runs on the calling thread with
 * no storage lock held. */
pd_code stg_file_read_spans(stg_file *f, uint64_t offset, size_t len,
                            stg_span_fn fn, void *arg, dev_status *st);
void stg_file_close(stg_file *f); /* accepts NULL */

/* --- formats ----------------------------------------------------------------- */

typedef enum stg_format {
  STG_FORMAT_AUTO = 0, /* by magic bytes, then by extension */
  STG_FORMAT_SAFETENSORS = 1,
  STG_FORMAT_NPY = 2,
  STG_FORMAT_NPZ = 3,
} stg_format;

typedef struct stg_entry {
  char *name; /* safetensors key; npz member without ".npy"; "" for .npy */
  pd_dtype dtype;
  dev_shape shape; /* the C-order host shape */
  uint64_t bytes;  /* dtype size x elements */
  /* How the bytes lie in the file (readers need not look). */
  uint64_t file_offset; /* of the data (npz: of the member's data) */
  uint64_t file_bytes;  /* stored bytes (deflated: compressed size) */
  bool byteswap;        /* big-endian data */
  bool fortran_order;   /* stored transposed */
  int compression;      /* 0 stored, 8 deflate (npz) */
  /* npy/npz: bytes of the .npy header before the data; npz: the member's
   * uncompressed size and CRC-32 (checked on whole-value reads). */
  uint64_t header_bytes;
  uint64_t member_bytes;
  uint32_t crc32;
} stg_entry;

typedef struct stg_index {
  stg_format format;
  int n;
  stg_entry *entries;
  int n_meta; /* safetensors __metadata__ */
  char **meta_keys, **meta_values;
} stg_index;

/* Reads and validates a file's header(s) into an index. INVALID_ARGUMENT
 * naming the file and what is wrong (every rejection of the reference
 * readers: header length, JSON, offsets that overlap or leave holes, byte
 * sizes that do not match, overflow, trailing bytes, npy header dict, zip
 * structure); UNIMPLEMENTED naming the dtype and the tensor for a dtype
 * paradev lacks or a zip compression method other than stored/deflate. */
pd_code stg_index_read(stg_file *f, stg_format format, stg_index **out,
                       dev_status *st);
void stg_index_free(stg_index *ix);
/* The entry named `name`, or NULL. */
const stg_entry *stg_index_find(const stg_index *ix, const char *name);

/* True when any byte range of the entry can be read alone (stored, native
 * order, C order); else stg_entry_read must be given the whole value. */
bool stg_entry_random_access(const stg_entry *e);

/* Reads bytes [offset, offset + len) of the entry's host value as C-order,
 * little-endian bytes into `buf` (byte-swapping, transposing a Fortran-order
 * array, inflating a deflated member). INVALID_ARGUMENT for a partial range
 * of an entry that is not random-access; DATA_LOSS for a deflate stream that
 * is corrupt or inflates to another size; errors of stg_file_pread. */
pd_code stg_entry_read(stg_file *f, const stg_entry *e, uint64_t offset,
                       void *buf, size_t len, dev_status *st);

/* The bytes stg_entry_read would give, handed to `fn` in order as spans
 * that cover [offset, offset + len) exactly (none for len 0), without a copy
 * into a caller's buffer where the entry is random-access: each span is a
 * slice of a cached block (read-only, kept alive for the call). Other
 * entries (and a cache bypass) go through a temporary buffer. Errors: those
 * of stg_entry_read, and fn's. Thread-safe; fn runs on the calling thread,
 * with no storage lock held. Added for loads that write each span straight
 * to device memory (issue #13, Benchmark). */
pd_code stg_entry_read_spans(stg_file *f, const stg_entry *e, uint64_t offset,
                             size_t len, stg_span_fn fn, void *arg,
                             dev_status *st);

/* A writer pulls each tensor's bytes through `read` (C order, little-endian),
 * so a saved tensor is never held twice in host memory. */
typedef struct stg_save_tensor {
  const char *name;
  pd_dtype dtype;
  dev_shape shape;
  uint64_t bytes;
} stg_save_tensor;
typedef pd_code (*stg_read_fn)(void *arg, int tensor, uint64_t offset,
                               void *buf, size_t len, dev_status *st);

/* Writes a safetensors file (header keys sorted as the reference writer
 * does, data 8-byte aligned) to `o`; `n_meta` string pairs go to
 * __metadata__. Does not commit `o`. INVALID_ARGUMENT for a duplicate or
 * empty name. */
pd_code stg_write_safetensors(stg_out *o, const stg_save_tensor *tensors, int n,
                              stg_read_fn read, void *arg,
                              const char *const *meta_keys,
                              const char *const *meta_values, int n_meta,
                              dev_status *st);
/* Writes one tensor as .npy version 1.0 (2.0 when the header needs it). */
pd_code stg_write_npy(stg_out *o, const stg_save_tensor *tensor,
                      stg_read_fn read, void *arg, dev_status *st);

/* Name of a dtype as safetensors writes it ("F32"), or NULL. */
const char *stg_safetensors_dtype_name(pd_dtype dt);

#ifdef __cplusplus
}
#endif

#endif /* PARADEV_STORAGE_H */
