/* A log line's rate limit: at most `per_s` lines a second from one place,
 * the rest counted and reported with the next line that passes. Refusals
 * that any caller can provoke (an Admin call from a client, a bad job
 * token) are logged through it, so that a client cannot flood the journal.
 * Lock-free; any thread. */
#ifndef PARADEV_SERVER_RATELIMIT_H
#define PARADEV_SERVER_RATELIMIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

typedef struct srv_rate {
  _Atomic int64_t second; /* CLOCK_MONOTONIC second of the count */
  atomic_int n;           /* lines asked for in that second */
  _Atomic uint64_t dropped;
} srv_rate;

#define SRV_REFUSALS_LOGGED_PER_S 20

/* True when this line may be written; *skipped: lines dropped since the
 * last one that was. */
static inline bool srv_rate_ok(srv_rate *r, int per_s, uint64_t *skipped) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t now = (int64_t)ts.tv_sec, sec = atomic_load(&r->second);
  if (sec != now && atomic_compare_exchange_strong(&r->second, &sec, now))
    atomic_store(&r->n, 0);
  if (atomic_fetch_add(&r->n, 1) < per_s) {
    *skipped = atomic_exchange(&r->dropped, 0);
    return true;
  }
  atomic_fetch_add(&r->dropped, 1);
  return false;
}

#endif /* PARADEV_SERVER_RATELIMIT_H */
