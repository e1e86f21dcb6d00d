/* paradevd's log: one line per event on stderr, each starting with its syslog
 * priority ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug) so that
 * journald files it under the right level.
 *
 * The macros test the level before evaluating or formatting anything (as
 * NCCL's INFO/WARN do), so a debug line costs one load and one compare when
 * debug is off. Thread-safe: each line is written with one write(2).
 */
#ifndef PARADEV_SERVER_LOG_H
#define PARADEV_SERVER_LOG_H

#include <stdbool.h>
#include <stddef.h>

typedef enum srv_log_level {
  SRV_LOG_ERROR = 3, /* syslog LOG_ERR */
  SRV_LOG_WARN = 4,  /* LOG_WARNING */
  SRV_LOG_INFO = 6,  /* LOG_INFO */
  SRV_LOG_DEBUG = 7, /* LOG_DEBUG */
} srv_log_level;

/* The current threshold: lines above it are skipped. Written at start-up only. */
extern int srv_log_threshold;

/* Parses "error|warn|info|debug" (case-insensitive); false when unknown. */
bool srv_log_parse(const char *name, srv_log_level *out);

/* Copies client-controlled text for a log line or a reply's string field
 * (which proto3 wants UTF-8): bytes outside printable ASCII become '?', and
 * it is cut to fit `out` (always NUL-terminated). Returns out. */
char *srv_log_clean(const char *in, char *out, size_t len);

/* Formats and writes one line; use the macros. */
void srv_log_write(srv_log_level level, const char *file, int line,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define SRV_LOG(level, ...)                                           \
  do {                                                                \
    if ((int)(level) <= srv_log_threshold)                            \
      srv_log_write((level), __FILE__, __LINE__, __VA_ARGS__);        \
  } while (0)

#define SRV_ERROR(...) SRV_LOG(SRV_LOG_ERROR, __VA_ARGS__)
#define SRV_WARN(...) SRV_LOG(SRV_LOG_WARN, __VA_ARGS__)
#define SRV_INFO(...) SRV_LOG(SRV_LOG_INFO, __VA_ARGS__)
#define SRV_DEBUG(...) SRV_LOG(SRV_LOG_DEBUG, __VA_ARGS__)

#endif /* PARADEV_SERVER_LOG_H */
