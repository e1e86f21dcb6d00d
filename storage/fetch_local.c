/* The local fetcher: pread on a file descriptor that the roots opened
 * (resolve.c). Signature: device, inode, size, mtime and ctime in ns
 * (ctime because a user can restore an mtime with utime(2) after
 * rewriting a file in place with the same size, but cannot set ctime); each
 * read checks by fstat that size, mtime and ctime still match, so a file
 * rewritten in place under an open reader is DATA_LOSS, never mixed bytes
 * served as good. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage_int.h"

typedef struct stg_local {
  int fd;
  uint64_t size;
  int64_t mtime_ns, ctime_ns;
  char name[];
} stg_local;

static atomic_uint_fast64_t stg_local_opens, stg_local_reads, stg_local_bytes,
    stg_local_errors;

static int64_t stg_mtime_ns(const struct stat *s) {
  return (int64_t)s->st_mtim.tv_sec * 1000000000 + s->st_mtim.tv_nsec;
}

static int64_t stg_ctime_ns(const struct stat *s) {
  return (int64_t)s->st_ctim.tv_sec * 1000000000 + s->st_ctim.tv_nsec;
}

static pd_code stg_local_open(const stg_fetcher *f,
                              const stg_fetch_open_args *a, void **handle,
                              stg_signature *sig, char *identity, size_t cap,
                              dev_status *st) {
  (void)f;
  struct stat s;
  if (a->fd < 0 || fstat(a->fd, &s) != 0) {
    int e = errno;
    if (a->fd >= 0) close(a->fd);
    return dev_error(st, PD_INTERNAL, "local fetcher: no file for '%s' (%s)",
                     a->name, strerror(e));
  }
  size_t nlen = strlen(a->name);
  stg_local *l = malloc(sizeof *l + nlen + 1);
  if (!l) {
    close(a->fd);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  }
  l->fd = a->fd;
  l->size = (uint64_t)s.st_size;
  l->mtime_ns = stg_mtime_ns(&s);
  l->ctime_ns = stg_ctime_ns(&s);
  memcpy(l->name, a->name, nlen + 1);
  sig->size = l->size;
  snprintf(sig->text, sizeof sig->text,
           "%ju:%ju:%" PRIu64 ":%" PRId64 ":%" PRId64, (uintmax_t)s.st_dev,
           (uintmax_t)s.st_ino, l->size, l->mtime_ns, l->ctime_ns);
  snprintf(identity, cap, "local:%ju:%ju", (uintmax_t)s.st_dev,
           (uintmax_t)s.st_ino);
  atomic_fetch_add(&stg_local_opens, 1);
  *handle = l;
  return PD_OK;
}

static pd_code stg_local_read(const stg_fetcher *f, void *handle,
                              uint64_t offset, void *buf, size_t len,
                              dev_status *st) {
  (void)f;
  stg_local *l = handle;
  char *p = buf;
  size_t done = 0;
  atomic_fetch_add(&stg_local_reads, 1);
  while (done < len) {
    ssize_t n = pread(l->fd, p + done, len - done, (off_t)(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      atomic_fetch_add(&stg_local_errors, 1);
      return dev_error(st, PD_UNAVAILABLE,
                       "reading %zu bytes at offset %" PRIu64 " of '%s': %s",
                       len, offset, l->name, strerror(errno));
    }
    if (n == 0) {
      atomic_fetch_add(&stg_local_errors, 1);
      return dev_error(st, PD_DATA_LOSS,
                       "'%s' ended at %" PRIu64 " bytes, short of %" PRIu64
                       ": it changed since it was opened",
                       l->name, offset + done, offset + len);
    }
    done += (size_t)n;
  }
  struct stat s;
  if (fstat(l->fd, &s) == 0 &&
      ((uint64_t)s.st_size != l->size || stg_mtime_ns(&s) != l->mtime_ns ||
       stg_ctime_ns(&s) != l->ctime_ns)) {
    atomic_fetch_add(&stg_local_errors, 1);
    return dev_error(st, PD_DATA_LOSS,
                     "'%s' was modified since it was opened (size %" PRIu64
                     " -> %jd, or a new mtime or ctime): open it again",
                     l->name, l->size, (intmax_t)s.st_size);
  }
  atomic_fetch_add(&stg_local_bytes, len);
  return PD_OK;
}

static void stg_local_close(const stg_fetcher *f, void *handle) {
  (void)f;
  stg_local *l = handle;
  if (!l) return;
  close(l->fd);
  free(l);
}

static void stg_local_stats(const stg_fetcher *f, stg_fetch_stats *out) {
  (void)f;
  memset(out, 0, sizeof *out);
  out->opens = atomic_load(&stg_local_opens);
  out->reads = atomic_load(&stg_local_reads);
  out->bytes_read = atomic_load(&stg_local_bytes);
  out->errors = atomic_load(&stg_local_errors);
}

const stg_fetcher stg__fetcher_local = {
    .struct_size = STG_FETCHER_STRUCT_SIZE,
    .name = "local",
    .ctx = NULL,
    .open = stg_local_open,
    .read = stg_local_read,
    .close = stg_local_close,
    .stats = stg_local_stats,
};
