/* A plain-file stand-in for storage/'s core (roots, cache, files, atomic
 * outputs), linked only into the formats' tests while the core is not built
 * (storage/CMakeLists.txt picks it). Same signatures as storage.h; no root
 * checks and no cache: stg_file_open opens `name` with open(2),
 * stg_file_pread is pread(2), stg_out_* write "<path>.tmp" and rename it.
 * OUT_OF_RANGE past the end, as the real stg_file_pread. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage.h"

struct stg_roots {
  int n;
};
struct stg_cache {
  int unused;
};
struct stg_file {
  int fd;
  uint64_t size;
  char *name;
};
struct stg_out {
  int fd;
  char *path, *tmp;
};

void stg_set_log(stg_log_fn fn) { (void)fn; }

pd_code stg_roots_create(const char *const *entries, int n, stg_roots **out,
                         dev_status *st) {
  (void)entries;
  stg_roots *r = calloc(1, sizeof *r);
  if (!r) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  r->n = n;
  *out = r;
  return PD_OK;
}
void stg_roots_destroy(stg_roots *r) { free(r); }

pd_code stg_cache_create(const stg_cache_config *cfg, stg_cache **out,
                         dev_status *st) {
  (void)cfg;
  stg_cache *c = calloc(1, sizeof *c);
  if (!c) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  *out = c;
  return PD_OK;
}
void stg_cache_destroy(stg_cache *c) { free(c); }

pd_code stg_file_open(stg_cache *c, const stg_roots *roots, const char *name,
                      stg_file **out, dev_status *st) {
  (void)c, (void)roots;
  int fd = open(name, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return dev_error(st, errno == ENOENT ? PD_NOT_FOUND : PD_PERMISSION_DENIED,
                     "%s: %s", name, strerror(errno));
  struct stat sb;
  stg_file *f = calloc(1, sizeof *f);
  if (!f || fstat(fd, &sb) != 0 || !(f->name = strdup(name))) {
    free(f);
    close(fd);
    return dev_error(st, PD_INTERNAL, "%s: cannot open", name);
  }
  f->fd = fd;
  f->size = (uint64_t)sb.st_size;
  *out = f;
  return PD_OK;
}

uint64_t stg_file_size(const stg_file *f) { return f->size; }
const char *stg_file_name(const stg_file *f) { return f->name; }

pd_code stg_file_pread(stg_file *f, uint64_t offset, void *buf, size_t len,
                       dev_status *st) {
  if (offset > f->size || len > f->size - offset)
    return dev_error(st, PD_OUT_OF_RANGE, "%s: [%llu, +%zu) past %llu bytes",
                     f->name, (unsigned long long)offset, len,
                     (unsigned long long)f->size);
  size_t done = 0;
  while (done < len) {
    ssize_t n =
        pread(f->fd, (char *)buf + done, len - done, (off_t)(offset + done));
    if (n <= 0) return dev_error(st, PD_DATA_LOSS, "%s: short read", f->name);
    done += (size_t)n;
  }
  return PD_OK;
}

void stg_file_close(stg_file *f) {
  if (!f) return;
  close(f->fd);
  free(f->name);
  free(f);
}

pd_code stg_out_create(const stg_roots *r, const char *path, bool overwrite,
                       stg_out **out, dev_status *st) {
  (void)r;
  if (!overwrite && access(path, F_OK) == 0)
    return dev_error(st, PD_ALREADY_EXISTS, "%s exists", path);
  stg_out *o = calloc(1, sizeof *o);
  if (!o) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  o->fd = -1;
  o->path = strdup(path);
  o->tmp = malloc(strlen(path) + 5);
  if (!o->path || !o->tmp) {
    stg_out_abort(o);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  }
  sprintf(o->tmp, "%s.tmp", path);
  o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (o->fd < 0) {
    pd_code rc = dev_error(st, PD_NOT_FOUND, "%s: %s", o->tmp, strerror(errno));
    free(o->path);
    free(o->tmp);
    free(o);
    return rc;
  }
  *out = o;
  return PD_OK;
}

pd_code stg_out_write(stg_out *o, const void *data, size_t len,
                      dev_status *st) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = write(o->fd, (const char *)data + done, len - done);
    if (n <= 0)
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "%s: %s", o->tmp,
                       strerror(errno));
    done += (size_t)n;
  }
  return PD_OK;
}

pd_code stg_out_commit(stg_out *o, dev_status *st) {
  pd_code rc = PD_OK;
  if (fsync(o->fd) != 0 || close(o->fd) != 0 || rename(o->tmp, o->path) != 0)
    rc = dev_error(st, PD_INTERNAL, "%s: %s", o->path, strerror(errno));
  o->fd = -1;
  free(o->path);
  free(o->tmp);
  free(o);
  return rc;
}

void stg_out_abort(stg_out *o) {
  if (!o) return;
  if (o->fd >= 0) {
    close(o->fd);
    unlink(o->tmp);
  }
  free(o->path);
  free(o->tmp);
  free(o);
}
