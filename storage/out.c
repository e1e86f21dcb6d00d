/* Atomic output files (issue #13, SaveTensors): the bytes go to a
 * temporary file `.NAME.tmp-XXXXXX` in the target's directory (opened
 * beneath a root, as reads are), which is fsynced and renamed into place
 * with renameat2(RENAME_NOREPLACE) unless overwriting is asked for, then the
 * directory is fsynced. A crash leaves the old file or the new one, never a
 * torn one.
 *
 * Orphans: a writer killed mid-save (SIGKILL, a crash, power loss) leaves
 * its temporary file behind. While it writes, a writer holds flock(LOCK_EX)
 * on its temporary file through a second descriptor (until it is renamed
 * or removed); the kernel drops the lock with the process. So the next
 * stg_out_create of the same target removes a `.NAME.tmp-XXXXXX` beside it
 * (exactly that pattern, a regular file) that is older than
 * STG_OUT_STALE_S by mtime and whose lock it can take: its creator is gone.
 * It is logged (stg_set_log, info). Other names and directories are never
 * touched; there is no sweep of the roots.
 *
 * Why not O_TMPFILE: linking an unnamed file into place needs
 * linkat(AT_EMPTY_PATH) (CAP_DAC_READ_SEARCH) or /proc/self/fd, and an
 * overwrite needs a name to rename from anyway.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "storage_int.h"

/* An unlocked temporary file older than this (by mtime) is an orphan. */
#define STG_OUT_STALE_S 300

struct stg_out {
  int dir_fd;  /* the target's directory, O_RDONLY (fsync-able) */
  int fd;      /* the temporary file */
  char *path;  /* as given, for messages */
  char *name;  /* the final component */
  char *root;  /* the root's entry, for messages */
  char *abs;   /* the root's entry + the path beneath it (stg_out_path) */
  char *tmp;   /* the temporary file's name in dir_fd */
  int lock_fd; /* the temporary file again, holding its flock */
  bool overwrite;
  bool failed; /* a write failed: commit refuses */
};

/* Where the directory was found: the root and the part beneath it. */
typedef struct stg_found {
  const char *name; /* the final component (pass 1 looks for it) */
  int root_index;
  char *rel; /* malloc'd */
} stg_found;

static int stg_found_set(stg_found *f, const stg__local_target *t, int fd) {
  char *rel = strdup(t->rel);
  if (!rel) {
    close(fd);
    return -ENOMEM;
  }
  free(f->rel);
  f->rel = rel;
  f->root_index = t->root_index;
  return fd;
}

/* Pass 2 (and absolute paths): the first root where the directory exists. */
static int stg_try_dir(void *arg, const stg__local_target *t) {
  int fd = stg__open_beneath(t->root_fd, t->rel, STG__OPEN_DIR_RDONLY);
  return fd < 0 ? fd : stg_found_set(arg, t, fd);
}

/* Pass 1 of a relative path: the first root that already holds the file
 * (anything by that name: stg_check_target then refuses what is not a
 * regular file), as a load would find it; -ENOENT where it does not. */
static int stg_try_existing(void *arg, const stg__local_target *t) {
  stg_found *f = arg;
  int fd = stg__open_beneath(t->root_fd, t->rel, STG__OPEN_DIR_RDONLY);
  if (fd < 0) return fd;
  struct stat s;
  if (fstatat(fd, f->name, &s, AT_SYMLINK_NOFOLLOW) != 0) {
    int e = errno;
    close(fd);
    return e == ENOENT ? -ENOENT : -e;
  }
  return stg_found_set(f, t, fd);
}

static void stg_out_free(stg_out *o) {
  if (o->fd >= 0) close(o->fd);
  if (o->lock_fd >= 0) close(o->lock_fd);
  if (o->dir_fd >= 0) close(o->dir_fd);
  free(o->path);
  free(o->name);
  free(o->root);
  free(o->abs);
  free(o->tmp);
  free(o);
}

/* Splits `path` into its directory (malloc'd into *dir) and final name. */
static pd_code stg_split(const char *path, char **dir, const char **name,
                         dev_status *st) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "'%s' does not name a file (expected a path ending in a "
                     "file name)",
                     path);
  size_t dlen = slash ? (size_t)(slash - path) : 0;
  if (slash && dlen == 0) dlen = 1; /* "/name" */
  *dir = strndup(path, dlen);
  if (!*dir) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  *name = base;
  return PD_OK;
}

static pd_code stg_check_target(stg_out *o, dev_status *st) {
  struct stat s;
  if (fstatat(o->dir_fd, o->name, &s, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return PD_OK;
    return stg__errno_code(-errno, o->path, o->root, "write", st);
  }
  if (!S_ISREG(s.st_mode))
    return stg__refuse(st, PD_PERMISSION_DENIED, 4,
                       "'%s' exists and is not a regular file (a symlink, "
                       "directory, device, FIFO or socket is never replaced)",
                       o->path);
  if (!o->overwrite)
    return dev_error(st, PD_ALREADY_EXISTS,
                     "'%s' already exists (ask for overwrite to replace it)",
                     o->path);
  return PD_OK;
}

static pd_code stg_open_tmp(stg_out *o, dev_status *st) {
  size_t cap = strlen(o->name) + 32;
  o->tmp = malloc(cap);
  if (!o->tmp) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  for (int attempt = 0; attempt < 64; attempt++) {
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd)
      rnd = (uint32_t)getpid() * 2654435761u + (uint32_t)attempt;
    snprintf(o->tmp, cap, ".%.200s.tmp-%06x", o->name, rnd & 0xffffff);
    o->fd = openat(o->dir_fd, o->tmp,
                   O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (o->fd >= 0) {
      /* held until the file is renamed or removed (see Orphans above) */
      o->lock_fd = openat(o->dir_fd, o->tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (o->lock_fd >= 0) flock(o->lock_fd, LOCK_EX | LOCK_NB);
      return PD_OK;
    }
    if (errno != EEXIST)
      return stg__errno_code(-errno, o->path, o->root, "write", st);
  }
  return dev_error(st, PD_ABORTED,
                   "could not pick a free temporary name beside '%s'", o->path);
}

/* Joins the root's entry, the directory beneath it and the name. */
static pd_code stg_set_abs(stg_out *o, const char *entry, const char *rel,
                           dev_status *st) {
  size_t el = strlen(entry);
  while (el > 1 && entry[el - 1] == '/') el--;
  while (rel[0] == '.' && (rel[1] == '/' || rel[1] == '\0'))
    rel += rel[1] ? 2 : 1;
  while (*rel == '/') rel++;
  size_t rl = strlen(rel);
  while (rl > 0 && rel[rl - 1] == '/') rl--;
  size_t cap = el + rl + strlen(o->name) + 3;
  if (!(o->abs = malloc(cap)))
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  const char *sep = el == 1 && entry[0] == '/' ? "" : "/";
  if (rl)
    snprintf(o->abs, cap, "%.*s%s%.*s/%s", (int)el, entry, sep, (int)rl, rel,
             o->name);
  else
    snprintf(o->abs, cap, "%.*s%s%s", (int)el, entry, sep, o->name);
  return PD_OK;
}

/* The directory of a new file (storage/README.md, "Where a save goes"): an
 * absolute path under the root it names; a relative one under the first
 * root that already holds the file (as a load finds it), else under the
 * first root where its directory exists. */
static pd_code stg_find_dir(const stg_roots *r, stg_out *o, const char *dir,
                            dev_status *st) {
  stg_found f = {o->name, -1, NULL};
  const char *d = dir[0] ? dir : ".";
  pd_code rc = PD_NOT_FOUND;
  if (o->path[0] != '/') {
    rc = stg__roots_local(r, d, "write", stg_try_existing, &f, &o->dir_fd, st);
    if (rc == PD_NOT_FOUND) dev_status_clear(st);
  }
  if (rc == PD_NOT_FOUND)
    rc = stg__roots_local(r, d, "write", stg_try_dir, &f, &o->dir_fd, st);
  if (rc == PD_OK) {
    const char *entry = stg_roots_entry(r, f.root_index);
    if (!(o->root = strdup(entry ? entry : "?")))
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
    else
      rc = stg_set_abs(o, o->root, f.rel ? f.rel : "", st);
  }
  free(f.rel);
  return rc;
}

const char *stg_out_path(const stg_out *o) { return o ? o->abs : NULL; }

/* True for `.NAME.tmp-` followed by six hex digits. */
static bool stg_is_tmp_of(const char *entry, const char *name) {
  size_t n = strlen(name);
  if (entry[0] != '.' || strncmp(entry + 1, name, n) != 0 ||
      strncmp(entry + 1 + n, ".tmp-", 5) != 0)
    return false;
  const char *x = entry + 1 + n + 5;
  for (int i = 0; i < 6; i++)
    if (!((x[i] >= '0' && x[i] <= '9') || (x[i] >= 'a' && x[i] <= 'f')))
      return false;
  return x[6] == '\0';
}

/* Removes the orphan `entry` if it is one (see Orphans above). */
static void stg_remove_orphan(stg_out *o, const char *entry) {
  int fd =
      openat(o->dir_fd, entry, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  struct stat s, now_s;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  if (fstat(fd, &s) == 0 && S_ISREG(s.st_mode) &&
      now.tv_sec - s.st_mtim.tv_sec > STG_OUT_STALE_S &&
      flock(fd, LOCK_EX | LOCK_NB) == 0 &&
      fstatat(o->dir_fd, entry, &now_s, AT_SYMLINK_NOFOLLOW) == 0 &&
      now_s.st_ino == s.st_ino && now_s.st_dev == s.st_dev &&
      unlinkat(o->dir_fd, entry, 0) == 0)
    stg__log(6,
             "storage: removed '%s' beside '%s': the temporary file of a "
             "save whose writer is gone (killed mid-save), %jd s old",
             entry, o->path, (intmax_t)(now.tv_sec - s.st_mtim.tv_sec));
  close(fd);
}

/* The orphans of the target's name in its directory. */
static void stg_sweep_orphans(stg_out *o) {
  int dfd = openat(o->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    return;
  }
  for (struct dirent *e; (e = readdir(d));)
    if (stg_is_tmp_of(e->d_name, o->name)) stg_remove_orphan(o, e->d_name);
  closedir(d);
}

pd_code stg_out_create(const stg_roots *r, const char *path, bool overwrite,
                       stg_out **out, dev_status *st) {
  if (!r || !path || !out)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "stg_out_create: roots, path and out are required");
  stg_out *o = calloc(1, sizeof *o);
  if (!o) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  o->fd = o->dir_fd = o->lock_fd = -1;
  o->overwrite = overwrite;
  char *dir = NULL;
  const char *name = NULL;
  pd_code rc = PD_OK;
  o->path = strdup(path);
  if (!o->path) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
    goto fail;
  }
  PD_TRY_GOTO(stg_split(path, &dir, &name, st), rc, fail);
  if (!(o->name = strdup(name))) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
    goto fail;
  }
  if (stg__is_url(path)) {
    rc = dev_error(st, PD_UNIMPLEMENTED,
                   "cannot write to a URL ('%s'): saves go to a local path "
                   "beneath a storage root",
                   path);
    goto fail;
  }
  PD_TRY_GOTO(stg_find_dir(r, o, dir, st), rc, fail);
  PD_TRY_GOTO(stg_check_target(o, st), rc, fail);
  stg_sweep_orphans(o);
  PD_TRY_GOTO(stg_open_tmp(o, st), rc, fail);
  free(dir);
  *out = o;
  return PD_OK;
fail:
  free(dir);
  stg_out_free(o);
  return rc;
}

static pd_code stg_io_error(stg_out *o, const char *op, dev_status *st) {
  int e = errno;
  o->failed = true;
  pd_code code = e == ENOSPC || e == EDQUOT || e == EFBIG
                     ? PD_RESOURCE_EXHAUSTED
                     : PD_UNAVAILABLE;
  return dev_error(st, code, "%s of '%s' failed: %s", op, o->path, strerror(e));
}

pd_code stg_out_write(stg_out *o, const void *data, size_t len,
                      dev_status *st) {
  if (!o) return dev_error(st, PD_INVALID_ARGUMENT, "stg_out_write: no output");
  if (o->failed)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "an earlier write of '%s' failed", o->path);
  const char *p = data;
  while (len > 0) {
    ssize_t n = write(o->fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return stg_io_error(o, "writing", st);
    }
    p += n;
    len -= (size_t)n;
  }
  return PD_OK;
}

/* renameat2(NOREPLACE), or link + unlink where the file system lacks it. */
static int stg_rename(stg_out *o) {
  if (o->overwrite) return renameat(o->dir_fd, o->tmp, o->dir_fd, o->name);
  if (renameat2(o->dir_fd, o->tmp, o->dir_fd, o->name, RENAME_NOREPLACE) == 0)
    return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  if (linkat(o->dir_fd, o->tmp, o->dir_fd, o->name, 0) != 0) return -1;
  unlinkat(o->dir_fd, o->tmp, 0);
  return 0;
}

pd_code stg_out_commit(stg_out *o, dev_status *st) {
  if (!o)
    return dev_error(st, PD_INVALID_ARGUMENT, "stg_out_commit: no output");
  pd_code rc = PD_OK;
  if (o->failed) {
    rc = dev_error(st, PD_FAILED_PRECONDITION,
                   "an earlier write of '%s' failed: not committed", o->path);
    goto fail;
  }
  if (fsync(o->fd) != 0) {
    rc = stg_io_error(o, "fsync", st);
    goto fail;
  }
  int fd = o->fd;
  o->fd = -1;
  if (close(fd) != 0) {
    rc = stg_io_error(o, "closing", st);
    goto fail;
  }
  if (stg_rename(o) != 0) {
    if (errno == EEXIST)
      rc = dev_error(st, PD_ALREADY_EXISTS,
                     "'%s' appeared while it was being written (ask for "
                     "overwrite to replace it)",
                     o->path);
    else
      rc = stg__errno_code(-errno, o->path, o->root, "write", st);
    goto fail;
  }
  if (fsync(o->dir_fd) != 0 && errno != EINVAL) {
    rc = stg_io_error(o, "fsync of the directory", st);
    stg_out_free(o);
    return rc;
  }
  stg_out_free(o);
  return PD_OK;
fail:
  stg_out_abort(o);
  return rc;
}

void stg_out_abort(stg_out *o) {
  if (!o) return;
  if (o->tmp && o->dir_fd >= 0) unlinkat(o->dir_fd, o->tmp, 0);
  stg_out_free(o);
}
