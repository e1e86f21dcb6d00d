/* Opening a path beneath one directory without leaving it: openat2 with
 * RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS where the kernel has it (Linux
 * 5.6+), else an equivalent walk, one component at a time, on file
 * descriptors (O_PATH | O_NOFOLLOW), so no check can be raced by a rename:
 * `..` pops a level and is refused at the root, a relative symlink's target
 * is spliced into the rest of the path and walked the same way, an absolute
 * one is refused (as RESOLVE_BENEATH refuses it), and the kernel never
 * follows a link itself, so /proc's magic links are never followed.
 *
 * Regular files are opened in two steps: O_PATH first, fstat says it is a
 * regular file, then O_RDONLY | O_NONBLOCK and a second fstat says it is the
 * same inode. A device node is never opened for I/O and a FIFO never blocks.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "storage_int.h"

#define STG_MAX_DEPTH 256
#define STG_MAX_LINKS 40

static atomic_bool stg_walk_forced;
static atomic_int stg_openat2_state_v;

void stg__force_walk(bool on) { atomic_store(&stg_walk_forced, on); }

static int stg_openat2(int dirfd, const char *path, int flags) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = (uint64_t)(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
  return fd < 0 ? -errno : (int)fd;
}

static bool stg_same_inode(int a, int b) {
  struct stat sa, sb;
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

/* The type check shared by both paths: 0 or -STG__EFTYPE / -ENOTDIR. */
static int stg_check_type(int path_fd, int kind) {
  struct stat s;
  if (fstat(path_fd, &s) != 0) return -errno;
  if (kind == STG__OPEN_DIR_RDONLY) return S_ISDIR(s.st_mode) ? 0 : -ENOTDIR;
  return S_ISREG(s.st_mode) ? 0 : -STG__EFTYPE;
}

static int stg_kind_flags(int kind) {
  return kind == STG__OPEN_DIR_RDONLY ? O_RDONLY | O_DIRECTORY
                                      : O_RDONLY | O_NONBLOCK | O_NOCTTY;
}

/* openat2 twice (O_PATH, then for I/O); -ENOSYS when the kernel lacks it. */
static int stg_open_kernel(int root_fd, const char *rel, int kind) {
  int pfd = stg_openat2(root_fd, rel, O_PATH);
  if (pfd < 0) return pfd;
  int rc = stg_check_type(pfd, kind);
  if (rc == 0) {
    rc = stg_openat2(root_fd, rel, stg_kind_flags(kind));
    if (rc >= 0 && !stg_same_inode(pfd, rc)) {
      close(rc);
      rc = -ESTALE;
    }
  }
  close(pfd);
  return rc;
}

/* Whether openat2 works here: 0 not known yet, 1 yes, 2 no. ENOSYS (an old
 * kernel) and EPERM (a seccomp filter of an older container runtime) on a
 * probe of the root itself mean no, once for the process. */
static int stg_openat2_state(int root_fd) {
  int s = atomic_load(&stg_openat2_state_v);
  if (s != 0) return s;
  int fd = stg_openat2(root_fd, ".", O_PATH);
  s = fd >= 0 || (fd != -ENOSYS && fd != -EPERM) ? 1 : 2;
  if (fd >= 0) close(fd);
  atomic_store(&stg_openat2_state_v, s);
  return s;
}

int stg__open_beneath(int root_fd, const char *rel, int kind) {
  const char *p = *rel ? rel : ".";
  if (!atomic_load(&stg_walk_forced) && stg_openat2_state(root_fd) == 1) {
    int rc = stg_open_kernel(root_fd, p, kind);
    if (rc != -ENOSYS) return rc;
    atomic_store(&stg_openat2_state_v, 2);
  }
  return stg__walk_beneath(root_fd, rel, kind);
}

/* --- the walk ----------------------------------------------------------- */

typedef struct stg_walk {
  int fds[STG_MAX_DEPTH]; /* fds[0] a dup of the root; fds[depth] current */
  int depth;
  char *path; /* what is left to walk, from `pos` */
  size_t pos;
  int links;
} stg_walk;

static void stg_walk_free(stg_walk *w) {
  for (int i = 0; i <= w->depth; i++)
    if (w->fds[i] >= 0) close(w->fds[i]);
  free(w->path);
}

/* Replaces the walked component by the link's target: path = target +
 * the rest after the component (which is empty or begins with '/'). */
static int stg_walk_splice(stg_walk *w, int link_fd, size_t rest) {
  char target[4096];
  ssize_t n = readlinkat(link_fd, "", target, sizeof target - 1);
  if (n < 0) return -errno;
  target[n] = '\0';
  if (target[0] == '/' || n == 0) return -EXDEV;
  if (++w->links > STG_MAX_LINKS) return -ELOOP;
  size_t tail = strlen(w->path + rest);
  char *np = malloc((size_t)n + tail + 1);
  if (!np) return -ENOMEM;
  memcpy(np, target, (size_t)n);
  memcpy(np + n, w->path + rest, tail + 1);
  free(w->path);
  w->path = np;
  w->pos = 0;
  return 0;
}

/* The last component, not a directory: a regular file to open for reading. */
static int stg_walk_final(stg_walk *w, int path_fd, const char *comp,
                          int kind) {
  int rc = stg_check_type(path_fd, kind);
  if (rc != 0) return rc;
  int fd = openat(w->fds[w->depth], comp,
                  stg_kind_flags(kind) | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  if (!stg_same_inode(path_fd, fd)) {
    close(fd);
    return -ESTALE;
  }
  return fd;
}

/* One component: >= 0 the final fd, 1 << 30 to go on, or -errno. */
#define STG_WALK_ON (1 << 30)
static int stg_walk_step(stg_walk *w, int kind) {
  char *s = w->path + w->pos;
  while (*s == '/') s++;
  if (*s == '\0') { /* the current directory is the target */
    if (kind != STG__OPEN_DIR_RDONLY) return -STG__EFTYPE;
    int fd = openat(w->fds[w->depth], ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
  }
  size_t len = strcspn(s, "/");
  char comp[NAME_MAX + 2];
  if (len > NAME_MAX) return -ENAMETOOLONG;
  memcpy(comp, s, len);
  comp[len] = '\0';
  size_t rest = (size_t)(s - w->path) + len;
  w->pos = rest;
  const char *after = w->path + rest;
  while (*after == '/') after++;
  bool last = *after == '\0';
  if (strcmp(comp, ".") == 0) return STG_WALK_ON;
  if (strcmp(comp, "..") == 0) {
    if (w->depth == 0) return -EXDEV;
    close(w->fds[w->depth--]);
    return STG_WALK_ON;
  }
  int fd = openat(w->fds[w->depth], comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat s_;
  if (fstat(fd, &s_) != 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  int rc = STG_WALK_ON;
  if (S_ISLNK(s_.st_mode)) {
    rc = stg_walk_splice(w, fd, rest);
    close(fd);
    return rc < 0 ? rc : STG_WALK_ON;
  }
  if (S_ISDIR(s_.st_mode)) {
    if (w->depth + 1 >= STG_MAX_DEPTH) {
      close(fd);
      return -ENAMETOOLONG;
    }
    w->fds[++w->depth] = fd;
    return STG_WALK_ON;
  }
  /* "file/" is ENOTDIR, as the kernel answers it */
  rc = last && w->path[rest] != '/' ? stg_walk_final(w, fd, comp, kind)
                                    : -ENOTDIR;
  close(fd);
  return rc;
}

int stg__walk_beneath(int root_fd, const char *rel, int kind) {
  stg_walk w;
  w.depth = 0;
  w.pos = 0;
  w.links = 0;
  w.fds[0] = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
  if (w.fds[0] < 0) return -errno;
  w.path = strdup(rel);
  if (!w.path) {
    close(w.fds[0]);
    return -ENOMEM;
  }
  int rc;
  do rc = stg_walk_step(&w, kind);
  while (rc == STG_WALK_ON);
  stg_walk_free(&w);
  return rc;
}
