/* A paradevd for the client benchmarks (bench_train, bench_fn_call): one at
 * a time, started on a private Unix socket and stopped with SIGTERM. */
#ifndef PARADEV_BENCHDAEMON_H
#define PARADEV_BENCHDAEMON_H

#include "paradev/paradev.h"

/* Starts `paradevd` (CPU backend, `devices` simulated devices, no config
 * file) in a new /tmp directory and connects once its health check says
 * SERVING. On any failure prints "<prog>: ..." (with st's code and message
 * when a call failed) and exits 1. Not thread-safe. */
pd_client *bench_daemon_start(const char *paradevd, int devices,
                              const char *prog, pd_status *st);

/* Stops the daemon started last (SIGTERM, waits) and removes its directory;
 * nothing when none runs. Usable with atexit. */
void bench_daemon_stop(void);

#endif /* PARADEV_BENCHDAEMON_H */
