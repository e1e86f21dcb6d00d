/* The cost of checking a bearer token per call (issue #14): what
 * srv_call_identity adds to a call that presents a token, measured on the
 * daemon's own code (server/tokens.c) in-process: a stat of the tokens file,
 * SHA-256 of the token and a constant-time comparison with every entry of a
 * file of 64 tokens. Its baseline, measured in the same run, is the two
 * system parts alone (one stat plus one SHA-256): the ratio shows what the
 * table's scan and lock add. For scale, NOTES.md measured a unary gRPC round
 * trip on loopback at ~89 us here; the RPC-level rows (an Execute round
 * trip with a token beside one without, same daemon, same run) are
 * bench_rpc's "rpc_token" (bench/rpc_tls_bench.c).
 *
 * Usage: bench_auth [--quick] */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "benchutil.h"
#include "tokens.h"

#define NTOKENS 64
#define BATCH 1000

typedef struct bench_arg {
  srv_tokens *t;
  const char *path;
  char token[80];
} bench_arg;

static void check_batch(void *p) {
  bench_arg *a = p;
  char name[SRV_IDENTITY_NAME_MAX + 1];
  dev_status st = DEV_STATUS_INIT;
  for (int i = 0; i < BATCH; i++)
    if (srv_tokens_check(a->t, a->token, strlen(a->token), name, sizeof(name),
                         &st) != PD_OK) {
      fprintf(stderr, "bench_auth: the token was refused: %s\n", st.msg);
      exit(1);
    }
}

static void baseline_batch(void *p) {
  bench_arg *a = p;
  unsigned char h[32];
  unsigned int n = 0;
  struct stat sb;
  for (int i = 0; i < BATCH; i++) {
    if (stat(a->path, &sb) != 0 ||
        EVP_Digest(a->token, strlen(a->token), h, &n, EVP_sha256(), NULL) != 1)
      exit(1);
  }
}

int main(int argc, char **argv) {
  double t_min = bu_quick(argc, argv) ? 0.2 : 1.0;
  char dir[] = "/tmp/pd-bench-auth-XXXXXX", path[128];
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof(path), "%s/tokens", dir);
  FILE *f = fopen(path, "w");
  if (!f) return 1;
  bench_arg a = {NULL, path, ""};
  for (int i = 0; i < NTOKENS; i++) {
    char tok[80], hex[SRV_TOKEN_HASH_HEX + 1];
    snprintf(tok, sizeof(tok), "token-%02d-%040d", i, i);
    if (!srv_token_hash_hex(tok, strlen(tok), hex)) return 1;
    fprintf(f, "client-%02d %s\n", i, hex);
    if (i == NTOKENS - 1) snprintf(a.token, sizeof(a.token), "%s", tok);
  }
  fclose(f);
  dev_status st = DEV_STATUS_INIT;
  if (srv_tokens_open(path, &a.t, &st) != PD_OK) {
    fprintf(stderr, "bench_auth: %s\n", st.msg);
    return 1;
  }
  bu_timing check = bu_measure(check_batch, &a, t_min, 5);
  bu_timing base = bu_measure(baseline_batch, &a, t_min, 5);
  double us = check.median_s / BATCH * 1e6,
         base_us = base.median_s / BATCH * 1e6;
  char params[64];
  snprintf(params, sizeof(params), "\"tokens\": %d", NTOKENS);
  bu_record("token_check", params, "us_per_call", us, "stat_sha256_us",
            base_us);
  srv_tokens_free(a.t);
  unlink(path);
  rmdir(dir);
  return bu_print_table();
}
