/* bench_rpc's TLS rows (rpc_tls_bench.c): Execute round trip p50/p99 and
 * Enqueue ops/s over TLS beside plaintext loopback TCP, in the same run. */
#ifndef PARADEV_BENCH_RPC_TLS_H
#define PARADEV_BENCH_RPC_TLS_H

#include <stdbool.h>

/* Starts two daemons from `paradevd` (plaintext and TLS, on free loopback
 * ports), records the rows (bu_record, bench "rpc_tls") and stops them.
 * Skips the rows with a note when `openssl` cannot make a certificate;
 * exits 1 on a failed call. */
void bench_rpc_tls(const char *paradevd, bool quick);

#endif /* PARADEV_BENCH_RPC_TLS_H */
