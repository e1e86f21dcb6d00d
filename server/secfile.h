/* Opening the files that hold secrets or grant rights (the [auth]
 * tokens_file and job_tokens_file, the [tls] files): one open for all of
 * them, at start, on reload and in --check-config. It never blocks (a FIFO
 * or a device named there would hang the daemon or --check-config: the
 * open is O_NONBLOCK and the file must be regular, by fstat of what was
 * opened), and a file that grants rights must be one no other user could
 * have written: owned by root or by the daemon's user, and not writable by
 * group or others (whoever may write the tokens file may mint an
 * identity, an operator's included). Calls nothing else in server/. */
#ifndef PARADEV_SERVER_SECFILE_H
#define PARADEV_SERVER_SECFILE_H

#include <stdbool.h>
#include <sys/stat.h>

#include "device.h"

typedef struct srv_file_rules {
  const char *what;  /* "the tokens file": names it in every error */
  bool private_file; /* owned by root or the euid, mode & 022 == 0 */
  bool nofollow;     /* refuse a symbolic link (O_NOFOLLOW) */
  const char *risk;  /* what a writable file would allow ("another user
                        could add tokens"), for the private check's error */
} srv_file_rules;

/* Opens `path` read-only (O_NONBLOCK, O_CLOEXEC) and checks it by the
 * rules. On PD_OK *fd is the open descriptor (the caller closes it; reads
 * of a regular file do not see O_NONBLOCK) and *sb its fstat. Errors,
 * each naming the file, what it is and what was expected: NOT_FOUND (no
 * such file), FAILED_PRECONDITION (cannot be opened, not a regular file,
 * wrong owner or mode). Thread safety: any thread. */
pd_code srv_file_open(const char *path, const srv_file_rules *rules, int *fd,
                      struct stat *sb, dev_status *st);

#endif /* PARADEV_SERVER_SECFILE_H */
