/* bench_rpc's TLS rows (rpc_tls_bench.c): Execute round trip p50/p99 and
 * Enqueue ops/s over TLS beside plaintext loopback TCP, in the same run;
 * and the token rows: Execute with a bearer token beside one without. */
#ifndef PARADEV_BENCH_RPC_TLS_H
#define PARADEV_BENCH_RPC_TLS_H

#include <stdbool.h>

/* Starts two daemons from `paradevd` (plaintext and TLS, on free loopback
 * ports), records the rows (bu_record, bench "rpc_tls") and stops them.
 * Skips the rows with a note when `openssl` cannot make a certificate;
 * exits 1 on a failed call. */
void bench_rpc_tls(const char *paradevd, bool quick);

/* The token check's cost per call over RPC: one daemon started from
 * `paradevd` with [auth] tokens_file (64 entries, the client's last), two
 * clients of it on loopback TCP, one presenting a bearer token on every
 * call and one none; Execute round trips in turns, p50/p99 of each (bench
 * "rpc_token", token_execute_* beside no_token_execute_*). Skips with a
 * note when the files cannot be made; exits 1 on a failed call. */
void bench_rpc_token(const char *paradevd, bool quick);

#endif /* PARADEV_BENCH_RPC_TLS_H */
