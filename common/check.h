/* Error-propagation macros for functions that return a pd_code, after NCCL's
 * src/include/checks.h (NCCLCHECK, NCCLCHECKGOTO): a failed step returns (or
 * jumps to the unwinding label) with its code, and leaves a trail, one line
 * per frame it passes through, so the log of a failure deep in the daemon
 * reads like a stack:
 *
 *     paradevd: trail: scheduler/sessions.c:212 sched_session_create -> RESOURCE_EXHAUSTED
 *     paradevd: trail: server/session.c:88 srv_create_session -> RESOURCE_EXHAUSTED
 *
 * Library code never logs (systemd's rule; libparadev is a library): the
 * trail goes to a hook that only the daemon sets (pdcom_set_trail), at its
 * debug level, and costs one relaxed atomic load per failure otherwise. The
 * status message itself (dev_status, pd_status) is written once, by the
 * function that found the error; the macros never rewrite it.
 *
 *   PD_TRY(call)                     return call's code if it is not PD_OK
 *   PD_TRY_GOTO(call, rc, label)     rc = call; on failure goto label
 *   PD_TRAIL(code)                   note the current frame for a code
 *                                    already in hand (returns nothing)
 *
 * `call` is evaluated exactly once. Thread-safe. Not part of libparadev's API.
 */
#ifndef PARADEV_COMMON_CHECK_H
#define PARADEV_COMMON_CHECK_H

#include "paradev/types.h"

/* Receives one frame of a failure's trail: the file, line and function the
 * failure passed through and its code. Must be thread-safe and must not call
 * back into code that uses these macros. */
typedef void (*pdcom_trail_fn)(const char *file, int line, const char *func,
                               pd_code code);

/* Installs the trail hook (NULL: none, the default). Thread-safe. */
void pdcom_set_trail(pdcom_trail_fn fn);

/* Reports one frame to the hook, if any (what the macros call). */
void pdcom_trail(const char *file, int line, const char *func, pd_code code);

#define PD_TRAIL(code) pdcom_trail(__FILE__, __LINE__, __func__, (code))

#define PD_TRY(call)                                                           \
  do {                                                                         \
    pd_code pd__rc = (call);                                                   \
    if (pd__rc != PD_OK) {                                                     \
      PD_TRAIL(pd__rc);                                                        \
      return pd__rc;                                                           \
    }                                                                          \
  } while (0)

#define PD_TRY_GOTO(call, rc, label)                                           \
  do {                                                                         \
    (rc) = (call);                                                             \
    if ((rc) != PD_OK) {                                                       \
      PD_TRAIL(rc);                                                            \
      goto label;                                                              \
    }                                                                          \
  } while (0)

#endif /* PARADEV_COMMON_CHECK_H */
