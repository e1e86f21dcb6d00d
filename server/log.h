/* paradevd's log: one line per event on stderr, each starting with its syslog
 * priority ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug) so that
 * journald files it under the right level.
 *
 * Each subsystem has its own threshold, set from the config file's [log]
 * level, then PARADEV_LOG, then --log, at run time by SIGHUP and the Admin
 * service's SetLogLevel. All take one syntax, NCCL's: a default level and
 * per-subsystem overrides, "info,sched=debug,rpc=warn".
 *
 * The macros test the level before evaluating or formatting anything (as
 * NCCL's INFO/WARN do), so a debug line costs one relaxed load and a compare
 * when debug is off. A file picks its subsystem by defining SRV_LOG_SUB before
 * including this header (default: core). Thread-safe: each line is written
 * with one write(2).
 */
#ifndef PARADEV_SERVER_LOG_H
#define PARADEV_SERVER_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum srv_log_level {
  SRV_LOG_ERROR = 3, /* syslog LOG_ERR */
  SRV_LOG_WARN = 4,  /* LOG_WARNING */
  SRV_LOG_INFO = 6,  /* LOG_INFO */
  SRV_LOG_DEBUG = 7, /* LOG_DEBUG */
} srv_log_level;

typedef enum srv_log_sub {
  SRV_SUB_CORE = 0, /* start-up, signals, shutdown, drain, systemd */
  SRV_SUB_CONFIG,   /* configuration and reloads */
  SRV_SUB_RPC,      /* gRPC calls */
  SRV_SUB_SCHED,    /* sessions, leases, queueing */
  SRV_SUB_HEALTH,   /* health, watchdog, devices */
  SRV_SUB_HTTP,     /* /metrics, /healthz, /readyz */
  SRV_SUB_ADMIN,    /* the Admin service */
  SRV_SUB_STORAGE,  /* checkpoints: storage roots, fetches, the block cache */
  SRV_SUB_COUNT
} srv_log_sub;

/* Threshold per subsystem: lines above it are skipped. */
extern _Atomic int srv_log_levels[SRV_SUB_COUNT];

/* Parses "error|warn|warning|info|debug" (case-insensitive). */
bool srv_log_parse(const char *name, srv_log_level *out);

/* Applies a spec ("info,sched=debug") to levels[SRV_SUB_COUNT]: an item
 * without '=' sets every subsystem, later items win. On error returns false
 * with a message in err (naming the item and what was expected; a spec of
 * one bare item is not repeated, as the caller quotes the spec) and leaves
 * `levels` as it was. */
bool srv_log_parse_spec(const char *spec, int levels[SRV_SUB_COUNT], char *err,
                        size_t errlen);

/* Current thresholds / replaces them all. */
void srv_log_get(int levels[SRV_SUB_COUNT]);
void srv_log_set(const int levels[SRV_SUB_COUNT]);
/* The shortest spec that gives `levels` ("info,sched=debug"). */
void srv_log_spec(const int levels[SRV_SUB_COUNT], char *out, size_t len);

/* Copies client-controlled text for a log line or a reply's string field
 * (which proto3 wants UTF-8): bytes outside printable ASCII become '?', and
 * it is cut to fit `out` (always NUL-terminated). Returns out. */
char *srv_log_clean(const char *in, char *out, size_t len);

/* The same for a reply's string field that may carry any language (a
 * client name in ListSessions): valid UTF-8 is kept as it is; control
 * characters and bytes that are not UTF-8 become '?'. Cut to fit `out`
 * between characters, never inside one. Returns out. */
char *srv_log_utf8(const char *in, char *out, size_t len);

/* Where text `s` (NULL: empty) stops being clean: the offset of the first
 * byte that does not begin a well-formed UTF-8 character (RFC 3629: no
 * overlong forms, surrogates or code points past U+10FFFF), or, unless
 * `controls`, that begins a control character (C0, DEL, C1); -1 when there
 * is none. *why (may be NULL) gets "is not UTF-8" or "is a control
 * character". What CreateSession checks client names and job ids with
 * (convert.h srv_check_label), so that they come out of logs, metrics and
 * admin replies exactly as given. */
long srv_log_text_check(const char *s, bool controls, const char **why);

/* Client-controlled text for a log line, between double quotes: valid
 * UTF-8 is kept as it is; '"' and '\' are escaped with a backslash, \n \t
 * \r as such, other control characters and bytes that are not UTF-8 as
 * \xNN. So a line names the bytes exactly and cannot be forged. Cut to fit
 * `out` (SRV_LOG_QUOTED(n) bytes hold n bytes of input whole) between
 * characters or escapes, never inside one. Returns out. */
#define SRV_LOG_QUOTED(n) (4 * (n) + 1)
char *srv_log_quote(const char *in, char *out, size_t len);

/* Text of unknown bytes in a message that quotes it as it is (a config
 * error's value, key or line): valid UTF-8 is kept, control characters and
 * bytes that are not UTF-8 become \xNN; nothing else is escaped, so the
 * result passes through again unchanged. Cut like srv_log_quote (same
 * SRV_LOG_QUOTED). Returns out. */
char *srv_log_printable(const char *in, char *out, size_t len);

/* Formats and writes one line; use the macros. */
void srv_log_write(srv_log_sub sub, srv_log_level level, const char *file,
                   int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#ifndef SRV_LOG_SUB
#define SRV_LOG_SUB SRV_SUB_CORE
#endif

#define SRV_LOG_AT(sub, level, ...)                                            \
  do {                                                                         \
    if ((int)(level) <=                                                        \
        atomic_load_explicit(&srv_log_levels[(sub)], memory_order_relaxed))    \
      srv_log_write((sub), (level), __FILE__, __LINE__, __VA_ARGS__);          \
  } while (0)

#define SRV_LOG(level, ...) SRV_LOG_AT(SRV_LOG_SUB, level, __VA_ARGS__)
#define SRV_ERROR(...) SRV_LOG(SRV_LOG_ERROR, __VA_ARGS__)
#define SRV_WARN(...) SRV_LOG(SRV_LOG_WARN, __VA_ARGS__)
#define SRV_INFO(...) SRV_LOG(SRV_LOG_INFO, __VA_ARGS__)
#define SRV_DEBUG(...) SRV_LOG(SRV_LOG_DEBUG, __VA_ARGS__)
/* An info line written at every level: what an operator needs whatever the
 * threshold (the addresses the daemon listens on, such as the port it
 * picked for 127.0.0.1:0). */
#define SRV_NOTICE(...)                                                        \
  srv_log_write(SRV_LOG_SUB, SRV_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)

#endif /* PARADEV_SERVER_LOG_H */
