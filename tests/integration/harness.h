/* What the C integration tests share: a real paradevd started on a temporary
 * Unix socket (and optionally 127.0.0.1:0), its stderr collected into a log,
 * and assertion macros for libparadev calls that print the call, the code and
 * the status message. Include after <cmocka.h> and "paradev/paradev.h". */
#ifndef PARADEV_TESTS_HARNESS_H
#define PARADEV_TESTS_HARNESS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct pdt_daemon {
  pid_t pid;
  int err_fd;
  char dir[64];
  char unix_target[128];
  char tcp_target[64]; /* "" unless started with tcp */
  pthread_t reader;
  pthread_mutex_t mu;
  char *log; /* everything the daemon wrote to stderr, NUL-terminated */
  size_t log_len, log_cap;
} pdt_daemon;

/* Starts `paradevd` with --config /dev/null, no admin socket (other tests'
 * daemons may run at once), --listen on a Unix socket in a new directory
 * /tmp/PREFIX-XXXXXX (and on 127.0.0.1:0 when `tcp`, whose bound port goes
 * into tcp_target), then the NULL-terminated `extra` flags; waits up to 20 s
 * for "ready:". Exits the test program (status 1, log on stderr) on failure. */
void pdt_daemon_start(pdt_daemon *d, const char *paradevd, const char *prefix,
                      bool tcp, const char *const *extra);

/* True when the daemon's log holds `needle`. Thread-safe. */
bool pdt_log_has(pdt_daemon *d, const char *needle);

/* SIGTERM, wait, remove the directory; returns the exit status (-1 when the
 * daemon did not exit normally). The log stays for the caller to read and
 * free. */
int pdt_daemon_stop(pdt_daemon *d);

/* Seconds on CLOCK_MONOTONIC. */
double pdt_now(void);

/* Comparisons shared by the C integration tests; each failure prints both
 * sides. */
/* Asserts that t has rank `rank` and dims[rank]. */
void pdt_assert_shape(const pd_tensor_info *t, int rank, const int64_t *dims);
/* Asserts that n bytes are equal; a failure names `what`, the first byte
 * that differs and both values. */
void pdt_assert_bytes(const void *got, const void *want, size_t n,
                      const char *what);
/* Asserts |got[i] - want[i]| <= tol * (1 + |want[i]|): float32 results of the
 * devices against a float64 reference. */
void pdt_assert_close_f32(const float *got, const double *want, size_t n,
                          double tol);

/* Each expects an `e` with a `pd_status *st` member. */
#define OK(e, call)                                                            \
  do {                                                                         \
    pd_code rc_ = (call);                                                      \
    if (rc_ != PD_OK)                                                          \
      fail_msg("%s\n  -> %s: %s", #call, pd_code_name(rc_),                    \
               pd_status_message((e)->st));                                    \
  } while (0)

#define EXPECT_CODE(e, code, call)                                             \
  do {                                                                         \
    pd_code rc_ = (call);                                                      \
    if (rc_ != (code))                                                         \
      fail_msg("%s\n  -> expected %s, got %s: %s", #call, pd_code_name(code),  \
               pd_code_name(rc_), pd_status_message((e)->st));                 \
  } while (0)

#define ASSERT_MSG_HAS(e, needle)                                              \
  do {                                                                         \
    if (!strstr(pd_status_message((e)->st), (needle)))                         \
      fail_msg("message \"%s\" does not contain \"%s\"",                       \
               pd_status_message((e)->st), (needle));                          \
  } while (0)

#endif
