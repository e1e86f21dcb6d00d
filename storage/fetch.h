/* The fetchers: a table of ways to read bytes of a file, after the
 * plug-in tables of TensorFlow's stream_executor.h (a struct that begins
 * with `size_t struct_size`, so fields are only ever added at the end and a
 * caller checks struct_size before using a newer one).
 *
 * Two are built in: stg__fetcher_local (pread on a file descriptor that
 * the roots opened) and stg__fetcher_http (http:// and https:// range reads
 * through libcurl). Tests add their own through stg__file_open_with
 * (storage_int.h).
 *
 * Thread safety: open, read, close and stats may be called from any
 * thread; read may be called on one handle from several threads at once.
 */
#ifndef PARADEV_STORAGE_FETCH_H
#define PARADEV_STORAGE_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "storage.h"

/* What identifies a version of a file: the cache drops a file's blocks when
 * it changes. `text` is compared as a string. */
#define STG_SIGNATURE_MAX 320
typedef struct stg_signature {
  uint64_t size;                /* bytes */
  char text[STG_SIGNATURE_MAX]; /* local: "dev:ino:size:mtime_ns:ctime_ns";
                                   HTTP:
                                   "etag:<ETag>" or "lm:<Last-Modified>" */
} stg_signature;

/* What open is given. */
typedef struct stg_fetch_open_args {
  size_t struct_size;
  const char *name; /* as the caller gave it, for messages */
  const char *url;  /* HTTP: the normalised URL; else NULL */
  int fd;           /* local: an fd the fetcher takes over; else -1 */
  double timeout_s; /* per request (HTTP) */
  int retries;      /* after the first try (HTTP) */
  /* The file's bounds (storage.h), alive as long as the handle; NULL: none.
   * Read at each request, so stg_file_set_deadline reaches later reads. */
  const stg_io_ctl *ctl;
} stg_fetch_open_args;
#define STG_FETCH_OPEN_ARGS_STRUCT_SIZE sizeof(stg_fetch_open_args)

/* Counters of one fetcher, since the process started. */
typedef struct stg_fetch_stats {
  uint64_t opens;
  uint64_t reads;      /* read calls */
  uint64_t bytes_read; /* bytes delivered by read */
  uint64_t requests;   /* HTTP requests (including retries and opens) */
  uint64_t retries;
  uint64_t errors; /* read calls that failed */
} stg_fetch_stats;

typedef struct stg_fetcher stg_fetcher;
struct stg_fetcher {
  size_t struct_size;
  const char *name; /* "local", "http" */
  void *ctx;        /* the fetcher's own state (tests) */
  /* Opens a file: *handle, its signature (size included) and the identity
   * under which the cache keys its blocks (written into identity, cap
   * bytes: local "local:<dev>:<ino>", HTTP the normalised URL). Takes over
   * args->fd whatever it returns. NOT_FOUND, PERMISSION_DENIED,
   * UNAVAILABLE, DEADLINE_EXCEEDED, each naming the file. */
  pd_code (*open)(const stg_fetcher *f, const stg_fetch_open_args *args,
                  void **handle, stg_signature *sig, char *identity, size_t cap,
                  dev_status *st);
  /* Reads exactly len bytes at offset (within the size open gave).
   * DATA_LOSS when the file changed since open (signature, short read),
   * UNAVAILABLE / DEADLINE_EXCEEDED for a fetch that failed after retries. */
  pd_code (*read)(const stg_fetcher *f, void *handle, uint64_t offset,
                  void *buf, size_t len, dev_status *st);
  void (*close)(const stg_fetcher *f, void *handle);
  void (*stats)(const stg_fetcher *f, stg_fetch_stats *out);
};
#define STG_FETCHER_STRUCT_SIZE sizeof(stg_fetcher)

extern const stg_fetcher stg__fetcher_local;
extern const stg_fetcher stg__fetcher_http;

#endif /* PARADEV_STORAGE_FETCH_H */
