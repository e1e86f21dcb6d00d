/* See secfile.h: the one open of the files that hold secrets. */
#include "secfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static const char *srv_file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

pd_code srv_file_open(const char *path, const srv_file_rules *r, int *fd,
                      struct stat *sb, dev_status *st) {
  int flags =
      O_RDONLY | O_NONBLOCK | O_CLOEXEC | (r->nofollow ? O_NOFOLLOW : 0);
  int f = open(path, flags);
  if (f < 0) {
    int e = errno;
    return dev_error(st, e == ENOENT ? PD_NOT_FOUND : PD_FAILED_PRECONDITION,
                     "%s %s cannot be read: %s%s", r->what, path, strerror(e),
                     e == ELOOP && r->nofollow
                         ? " (a symbolic link: expected the file itself)"
                         : "");
  }
  struct stat s;
  if (fstat(f, &s) != 0) {
    int e = errno;
    close(f);
    return dev_error(st, PD_FAILED_PRECONDITION, "%s %s cannot be read: %s",
                     r->what, path, strerror(e));
  }
  if (!S_ISREG(s.st_mode)) {
    close(f);
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "%s %s is %s; expected a regular file", r->what, path,
                     srv_file_kind(s.st_mode));
  }
  uid_t me = geteuid();
  if (r->private_file &&
      ((s.st_uid != 0 && s.st_uid != me) || (s.st_mode & 022))) {
    close(f);
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "%s %s is owned by uid %u with mode %04o; expected a "
                     "file of root or of uid %u (the daemon's user) that no "
                     "one else may write (mode 0600 or 0640): %s",
                     r->what, path, (unsigned)s.st_uid,
                     (unsigned)(s.st_mode & 07777), (unsigned)me,
                     r->risk ? r->risk : "another user could change it");
  }
  *fd = f;
  *sb = s;
  return PD_OK;
}
