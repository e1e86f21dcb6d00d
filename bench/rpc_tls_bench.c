/* bench_rpc's TLS rows (issue #14): the same Execute round trip and Enqueue
 * stream against two daemons started here on loopback TCP, one plaintext
 * and one with [tls] (an ECDSA P-256 certificate made with `openssl`),
 * measured in turns (plaintext, TLS, TLS, plaintext, ...) so that the
 * machine's drift falls on both; each figure is the median of the turns.
 *
 *  tls_execute_p50_us / p99   beside tcp_execute_p50_us / p99 (aim <= 1.2)
 *  tls_enqueue_ops_per_s      beside tcp_enqueue_ops_per_s (aim >= 0.8)
 *
 * The handshake is not timed: each client connects (one call) before the
 * turns begin, as a long-lived client would. Without `openssl` the rows are
 * skipped with a note. The token rows (bench_rpc_token) come last. See
 * rpc_tls_bench.h. */
#include "rpc_tls_bench.h"

#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchutil.h"
#include "paradev/paradev.h"

#define TLS_DEVICES 4
#define TLS_MAX_TURNS 9

static pd_status *tst;
static pid_t tls_pids[2];
static char tls_dir[64];

static void tls_die(const char *what) {
  fprintf(stderr, "bench_rpc (tls): %s: %s: %s\n", what,
          pd_code_name(pd_status_code(tst)), pd_status_message(tst));
  exit(1);
}

static void tls_stop(void) {
  for (int i = 0; i < 2; i++) {
    if (tls_pids[i] <= 0) continue;
    kill(tls_pids[i], SIGTERM);
    waitpid(tls_pids[i], NULL, 0);
    tls_pids[i] = 0;
  }
  if (tls_dir[0]) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tls_dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_rpc (tls): cannot remove\n");
    tls_dir[0] = '\0';
  }
}

/* A free loopback port (the kernel's pick, released for the daemon). */
static int tls_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* paradevd on 127.0.0.1:port, with the certificate when `crt` is given, or
 * the config file `conf` (the token rows) when `key` is NULL. */
static pid_t tls_daemon(const char *path, int port, const char *crt,
                        const char *key) {
  char listen[64];
  snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(1);
    if (crt && key)
      execl(path, path, "--listen", listen, "--admin-socket", "", "--devices",
            "4", "--log", "warn", "--tls-cert", crt, "--tls-key", key,
            (char *)NULL);
    else if (crt)
      execl(path, path, "--config", crt, "--listen", listen, "--admin-socket",
            "", "--devices", "4", "--log", "warn", (char *)NULL);
    else
      execl(path, path, "--listen", listen, "--admin-socket", "", "--devices",
            "4", "--log", "warn", (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* A client of the daemon at `target` once it serves, and a session; with
 * `token`, every call presents it (authorization: Bearer). */
static pd_client *tls_connect_as(const char *target, const char *ca,
                                 const char *token, pd_session **s) {
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.ignore_environment = 1;
  co.tls = ca ? PD_TLS_ON : PD_TLS_OFF;
  co.tls_ca_file = ca;
  co.token = token;
  pd_client *c = pd_client_new(target, &co, tst);
  if (!c) tls_die("connect");
  pd_serving_status ss = PD_SERVING_UNKNOWN;
  for (int i = 0; i < 200 && ss != PD_SERVING; i++) {
    pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
    o.timeout_ms = 1000;
    if (pd_client_health(c, "", &ss, &o, tst) != PD_OK || ss != PD_SERVING)
      usleep(50000);
  }
  if (ss != PD_SERVING) tls_die(ca ? "the TLS daemon" : "the TCP daemon");
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_rpc_tls";
  *s = pd_session_new(c, &so, NULL, tst);
  if (!*s) tls_die("CreateSession");
  const float one[1] = {1};
  const int64_t d1[1] = {1};
  if (pd_upload(*s, 1, PD_FLOAT32, d1, 1, one, sizeof(one),
                pd_layout_mirrored(), NULL, NULL, tst) != PD_OK)
    tls_die("Upload");
  return c;
}

static pd_client *tls_connect(const char *target, const char *ca,
                              pd_session **s) {
  return tls_connect_as(target, ca, NULL, s);
}

static int tls_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double tls_pct(double *v, int n, double p) {
  qsort(v, (size_t)n, sizeof(double), tls_cmp);
  int rank = (int)ceil(p / 100.0 * n);
  return v[rank < 1 ? 0 : rank > n ? n - 1 : rank - 1];
}

/* `n` Execute round trips (Add of two float32 [1]): p50 and p99 in s. */
static void tls_execute(pd_session *s, int n, double *p50, double *p99) {
  double *t = malloc(sizeof(double) * (size_t)n);
  uint64_t in[2] = {1, 1}, ids[500];
  int nid = 0;
  for (int i = -n / 10; i < n; i++) { /* the first tenth warms up */
    uint64_t out = 0;
    double t0 = bu_now();
    if (pd_execute(s, "Add", in, 2, NULL, &out, 1, NULL, NULL, tst) != PD_OK)
      tls_die("Execute");
    if (i >= 0) t[i] = bu_now() - t0;
    ids[nid++] = out;
    if (nid == 500) { /* untimed: keep the handle table small */
      if (pd_delete(s, ids, nid, NULL, tst) != PD_OK) tls_die("Delete");
      nid = 0;
    }
  }
  if (nid && pd_delete(s, ids, nid, NULL, tst) != PD_OK) tls_die("Delete");
  *p50 = tls_pct(t, n, 50);
  *p99 = tls_pct(t, n, 99);
  free(t);
}

/* `n` Adds through one Enqueue stream, replies awaited at the end: ops/s.
 * The outputs go with a fresh session afterwards (untimed). */
static double tls_enqueue(pd_client *c, pd_session **s, int n) {
  pd_stream *t = pd_stream_new(*s, NULL, tst);
  if (!t) tls_die("Enqueue");
  uint64_t in[2] = {1, 1};
  double t0 = bu_now();
  for (int i = 0; i < n; i++) {
    uint64_t out = 0;
    if (pd_stream_execute(t, "Add", in, 2, NULL, &out, 1, NULL, tst) != PD_OK)
      tls_die("Enqueue write");
  }
  if (pd_stream_wait(t, PD_TIMEOUT_NONE, tst) != PD_OK) tls_die("Enqueue");
  double secs = bu_now() - t0;
  if (pd_stream_close(t, PD_TIMEOUT_NONE, tst) != PD_OK)
    tls_die("Enqueue close");
  pd_stream_delete(t);
  pd_session_delete(*s);
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "bench_rpc_tls";
  if (!(*s = pd_session_new(c, &so, NULL, tst))) tls_die("CreateSession");
  const float one[1] = {1};
  const int64_t d1[1] = {1};
  if (pd_upload(*s, 1, PD_FLOAT32, d1, 1, one, sizeof(one),
                pd_layout_mirrored(), NULL, NULL, tst) != PD_OK)
    tls_die("Upload");
  return n / secs;
}

/* A self-signed certificate for 127.0.0.1 in tls_dir; false without
 * openssl. */
static bool tls_make_cert(char *crt, char *key, size_t len) {
  snprintf(tls_dir, sizeof(tls_dir), "/tmp/bench-tls-XXXXXX");
  if (!mkdtemp(tls_dir)) {
    tls_dir[0] = '\0';
    return false;
  }
  snprintf(crt, len, "%s/server.crt", tls_dir);
  snprintf(key, len, "%s/server.key", tls_dir);
  char cmd[1024];
  snprintf(cmd, sizeof(cmd),
           "openssl req -x509 -newkey ec -pkeyopt "
           "ec_paramgen_curve:prime256v1 -nodes -keyout '%s' -out '%s' "
           "-days 1 -subj /CN=localhost -addext "
           "subjectAltName=IP:127.0.0.1,DNS:localhost >/dev/null 2>&1",
           key, crt);
  return system(cmd) == 0;
}

static double tls_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), tls_cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void bench_rpc_tls(const char *paradevd, bool quick) {
  char crt[128], key[128];
  tst = pd_status_new();
  if (!tls_make_cert(crt, key, sizeof(crt))) {
    fprintf(stderr, "bench_rpc: note: no openssl; TLS rows skipped\n");
    tls_stop();
    pd_status_delete(tst);
    return;
  }
  atexit(tls_stop);
  int port[2] = {tls_free_port(), tls_free_port()};
  tls_pids[0] = tls_daemon(paradevd, port[0], NULL, NULL);
  tls_pids[1] = tls_daemon(paradevd, port[1], crt, key);
  pd_client *c[2];
  pd_session *s[2];
  for (int k = 0; k < 2; k++) {
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", port[k]);
    c[k] = tls_connect(target, k ? crt : NULL, &s[k]);
  }
  int turns = quick ? 3 : 7, calls = quick ? 300 : 2000;
  int ops = quick ? 2000 : 20000;
  double p50[2][TLS_MAX_TURNS], p99[2][TLS_MAX_TURNS], qps[2][TLS_MAX_TURNS];
  for (int r = 0; r < turns; r++)
    for (int j = 0; j < 2; j++) {
      int k = (r + j) % 2; /* plaintext first on even turns */
      tls_execute(s[k], calls, &p50[k][r], &p99[k][r]);
      qps[k][r] = tls_enqueue(c[k], &s[k], ops);
    }
  double m50[2], m99[2], mq[2];
  for (int k = 0; k < 2; k++) {
    m50[k] = tls_median(p50[k], turns);
    m99[k] = tls_median(p99[k], turns);
    mq[k] = tls_median(qps[k], turns);
  }
  char params[320];
  snprintf(params, sizeof(params),
           "\"op\": \"Add\", \"shape\": [1], \"devices\": %d, \"transport\": "
           "\"loopback TCP, TLS 1.3 ECDSA P-256 vs plaintext\", \"calls\": "
           "%d, \"turns\": %d, \"statistic\": \"median of turns\"",
           TLS_DEVICES, calls, turns);
  bu_record("rpc_tls", params, "tls_execute_p50_us", m50[1] * 1e6,
            "tcp_execute_p50_us", m50[0] * 1e6);
  bu_record("rpc_tls", params, "tls_execute_p99_us", m99[1] * 1e6,
            "tcp_execute_p99_us", m99[0] * 1e6);
  snprintf(params, sizeof(params),
           "\"op\": \"Add\", \"shape\": [1], \"devices\": %d, \"transport\": "
           "\"loopback TCP, TLS 1.3 ECDSA P-256 vs plaintext\", \"ops\": %d, "
           "\"turns\": %d, \"statistic\": \"median of turns\"",
           TLS_DEVICES, ops, turns);
  bu_record("rpc_tls", params, "tls_enqueue_ops_per_s", mq[1],
            "tcp_enqueue_ops_per_s", mq[0]);
  for (int k = 0; k < 2; k++) {
    pd_session_delete(s[k]);
    pd_client_delete(c[k]);
  }
  tls_stop();
  pd_status_delete(tst);
}

/* --- the token check per call --------------------------------------------- */

#define TOKEN_FILLERS 63 /* other clients' entries, scanned on every check */

/* tokens and paradevd.conf in tls_dir: 63 other entries and ours last
 * (hashed by `paradevd --hash-token`); false when one cannot be made. */
static bool token_files(const char *paradevd, const char *token, char *conf,
                        size_t len) {
  snprintf(tls_dir, sizeof(tls_dir), "/tmp/bench-token-XXXXXX");
  if (!mkdtemp(tls_dir)) {
    tls_dir[0] = '\0';
    return false;
  }
  char cmd[512], hash[128] = "", tokens[128];
  snprintf(cmd, sizeof(cmd), "echo '%s' | '%s' --hash-token", token, paradevd);
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  bool got = fgets(hash, sizeof(hash), p) != NULL;
  if (pclose(p) != 0 || !got || strncmp(hash, "sha256:", 7) != 0) return false;
  hash[strcspn(hash, "\n")] = '\0';
  snprintf(tokens, sizeof(tokens), "%s/tokens", tls_dir);
  snprintf(conf, len, "%s/paradevd.conf", tls_dir);
  FILE *f = fopen(tokens, "w");
  if (!f) return false;
  for (int i = 0; i < TOKEN_FILLERS; i++)
    fprintf(f, "client-%02d sha256:%064x\n", i, i + 1);
  fprintf(f, "bench %s\n", hash);
  bool ok = fclose(f) == 0;
  f = ok ? fopen(conf, "w") : NULL;
  if (!f) return false;
  fprintf(f, "[auth]\ntokens_file = %s\n", tokens);
  return fclose(f) == 0;
}

void bench_rpc_token(const char *paradevd, bool quick) {
  const char *token = "bench-token-0123456789abcdef0123456789abcdef";
  char conf[128];
  tst = pd_status_new();
  if (!token_files(paradevd, token, conf, sizeof(conf))) {
    fprintf(stderr,
            "bench_rpc: note: cannot write the tokens file; token "
            "rows skipped\n");
    tls_stop();
    pd_status_delete(tst);
    return;
  }
  atexit(tls_stop);
  int port = tls_free_port();
  tls_pids[0] = tls_daemon(paradevd, port, conf, NULL);
  char target[64];
  snprintf(target, sizeof(target), "127.0.0.1:%d", port);
  /* One daemon, two clients: [auth] require_identity is "remote" by
   * default, so the loopback client without a token is let in too. */
  pd_client *c[2];
  pd_session *s[2];
  for (int k = 0; k < 2; k++)
    c[k] = tls_connect_as(target, NULL, k ? token : NULL, &s[k]);
  int turns = quick ? 3 : 7, calls = quick ? 300 : 2000;
  double p50[2][TLS_MAX_TURNS], p99[2][TLS_MAX_TURNS];
  for (int r = 0; r < turns; r++)
    for (int j = 0; j < 2; j++) {
      int k = (r + j) % 2; /* without the token first on even turns */
      tls_execute(s[k], calls, &p50[k][r], &p99[k][r]);
    }
  double m50[2], m99[2];
  for (int k = 0; k < 2; k++) {
    m50[k] = tls_median(p50[k], turns);
    m99[k] = tls_median(p99[k], turns);
  }
  char params[320];
  snprintf(params, sizeof(params),
           "\"op\": \"Add\", \"shape\": [1], \"devices\": %d, "
           "\"transport\": \"loopback TCP, one daemon\", \"tokens\": %d, "
           "\"calls\": %d, \"turns\": %d, \"statistic\": \"median of "
           "turns\"",
           TLS_DEVICES, TOKEN_FILLERS + 1, calls, turns);
  bu_record("rpc_token", params, "token_execute_p50_us", m50[1] * 1e6,
            "no_token_execute_p50_us", m50[0] * 1e6);
  bu_record("rpc_token", params, "token_execute_p99_us", m99[1] * 1e6,
            "no_token_execute_p99_us", m99[0] * 1e6);
  for (int k = 0; k < 2; k++) {
    pd_session_delete(s[k]);
    pd_client_delete(c[k]);
  }
  tls_stop();
  pd_status_delete(tst);
}
