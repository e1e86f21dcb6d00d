/* Private header of the `paradev` command (cli.c, cli_admin.c,
 * cli_checkpoint.c); what needs libparadev's header is cli_cmd.h's. */
#ifndef PARADEV_CLI_INT_H
#define PARADEV_CLI_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Longest --timeout either command takes: 24 h, in milliseconds. */
#define CLI_TIMEOUT_MAX_MS 86400000

/* What --timeout says when it cannot read a time (both commands). */
#define CLI_TIMEOUT_EXPECTED                                                   \
  "expected a time from 1ms to 24h, such as 500ms, 2s or 1m (a number "        \
  "needs a unit: ms, s, m or h)"

/* Parses a duration for --timeout, the same for `paradev` and `paradev
 * admin`: a non-negative decimal (fractions allowed) and a unit, ms, s, m or
 * h. A bare number is refused: it meant milliseconds at the top level and
 * seconds under admin, so a unit is the only reading both agree on. The
 * result is rounded to whole milliseconds and must be 1 ms to 24 h. Returns
 * false on anything else.
 * Source: the unit suffixes of systemd.time(7) and Go's time.ParseDuration. */
static inline bool cli_parse_duration_ms(const char *s, int64_t *out) {
  if (!s) return false;
  char *end = NULL;
  double v = strtod(s, &end);
  /* Digits and a point only: no sign, exponent, hex, inf or nan. */
  if (end == s || strspn(s, "0123456789.") != (size_t)(end - s)) return false;
  double unit;
  if (strcmp(end, "ms") == 0)
    unit = 1;
  else if (strcmp(end, "s") == 0)
    unit = 1e3;
  else if (strcmp(end, "m") == 0)
    unit = 60e3;
  else if (strcmp(end, "h") == 0)
    unit = 3600e3;
  else
    return false;
  double ms = v * unit + 0.5; /* rounded below; no libm */
  if (!(ms >= 1 && ms < CLI_TIMEOUT_MAX_MS + 1.0)) return false;
  *out = (int64_t)ms;
  return true;
}

/* Writes paradevd's directory for default sockets when the user has no
 * runtime directory, /tmp/paradevd-UID. */
static inline void cli_tmp_socket_dir(char *out, size_t len) {
  snprintf(out, len, "/tmp/paradevd-%u", (unsigned)getuid());
}

/* True when `dir` is a directory (not a link) of the calling user that
 * nobody else may enter: paradevd creates /tmp/paradevd-UID so, and refuses
 * it otherwise. A socket in anything else under /tmp could be another
 * user's, listening to what we send. */
static inline bool cli_private_dir_ok(const char *dir) {
  struct stat sb;
  return lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == getuid() &&
         (sb.st_mode & 077) == 0;
}

#endif /* PARADEV_CLI_INT_H */
