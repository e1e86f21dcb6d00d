#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "paradev/paradev.h"
#include "harness.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void shape_str(int rank, const int64_t *dims, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < rank && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "",
                          (long long)dims[i]);
  if (n < len) snprintf(buf + n, len - n, "]");
}

void pdt_assert_shape(const pd_tensor_info *t, int rank, const int64_t *dims) {
  bool ok = t->rank == rank;
  for (int i = 0; ok && i < rank; i++) ok = t->dims[i] == dims[i];
  if (!ok) {
    char got[160], want[160];
    shape_str(t->rank < 0 || t->rank > PD_MAX_RANK ? 0 : t->rank, t->dims, got,
              sizeof got);
    shape_str(rank, dims, want, sizeof want);
    fail_msg("shape %s (rank %d), want %s (rank %d)", got, t->rank, want, rank);
  }
}

void pdt_assert_bytes(const void *got, const void *want, size_t n,
                      const char *what) {
  const uint8_t *g = got, *w = want;
  for (size_t i = 0; i < n; i++)
    if (g[i] != w[i])
      fail_msg("%s: byte %zu is 0x%02x, expected 0x%02x", what, i, g[i], w[i]);
}

void pdt_assert_close_f32(const float *got, const double *want, size_t n,
                          double tol) {
  for (size_t i = 0; i < n; i++)
    if (fabs((double)got[i] - want[i]) > tol * (1.0 + fabs(want[i])))
      fail_msg("element %zu: got %.9g, expected %.9g", i, (double)got[i],
               want[i]);
}

double pdt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void log_append(pdt_daemon *d, const char *buf, size_t n) {
  pthread_mutex_lock(&d->mu);
  if (d->log_len + n + 1 > d->log_cap) {
    size_t cap = (d->log_cap ? d->log_cap * 2 : 65536) + n;
    char *p = realloc(d->log, cap);
    if (!p) abort();
    d->log = p;
    d->log_cap = cap;
  }
  memcpy(d->log + d->log_len, buf, n);
  d->log_len += n;
  d->log[d->log_len] = '\0';
  pthread_mutex_unlock(&d->mu);
}

/* Drains the daemon's stderr so it never blocks on a full pipe. */
static void *log_reader(void *arg) {
  pdt_daemon *d = arg;
  char buf[4096];
  for (;;) {
    ssize_t n = read(d->err_fd, buf, sizeof(buf));
    if (n > 0) {
      log_append(d, buf, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  return NULL;
}

bool pdt_log_has(pdt_daemon *d, const char *needle) {
  pthread_mutex_lock(&d->mu);
  bool r = d->log && strstr(d->log, needle) != NULL;
  pthread_mutex_unlock(&d->mu);
  return r;
}

static void give_up(pdt_daemon *d, const char *why) {
  pthread_mutex_lock(&d->mu);
  fprintf(stderr, "%s; log:\n%s\n", why, d->log ? d->log : "");
  pthread_mutex_unlock(&d->mu);
  kill(d->pid, SIGKILL);
  exit(1);
}

void pdt_daemon_start(pdt_daemon *d, const char *paradevd, const char *prefix,
                      bool tcp, const char *const *extra) {
  memset(d, 0, sizeof(*d));
  pthread_mutex_init(&d->mu, NULL);
  snprintf(d->dir, sizeof(d->dir), "/tmp/%s-XXXXXX", prefix);
  if (!mkdtemp(d->dir)) {
    perror("mkdtemp");
    exit(1);
  }
  snprintf(d->unix_target, sizeof(d->unix_target), "unix:%s/pd.sock", d->dir);
  const char *argv[48];
  int argc = 0;
  const char *fixed[] = {paradevd, "--config", "/dev/null",   "--admin-socket",
                         "",       "--listen", d->unix_target};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
    argv[argc++] = fixed[i];
  if (tcp) {
    argv[argc++] = "--listen";
    argv[argc++] = "127.0.0.1:0";
  }
  for (int i = 0; extra && extra[i] && argc < 47; i++) argv[argc++] = extra[i];
  argv[argc] = NULL;
  int p[2];
  if (pipe(p) != 0) exit(1);
  d->pid = fork();
  if (d->pid == 0) {
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    execv(paradevd, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  d->err_fd = p[0];
  pthread_create(&d->reader, NULL, log_reader, d);
  for (int i = 0; i < 400 && !pdt_log_has(d, "ready:"); i++) usleep(50000);
  if (!pdt_log_has(d, "ready:")) give_up(d, "paradevd not ready in 20 s");
  if (!tcp) return;
  pthread_mutex_lock(&d->mu);
  const char *at = strstr(d->log, "listening on 127.0.0.1:");
  int port = at ? atoi(at + strlen("listening on 127.0.0.1:")) : 0;
  pthread_mutex_unlock(&d->mu);
  if (port <= 0) give_up(d, "no bound TCP port in the daemon's log");
  snprintf(d->tcp_target, sizeof(d->tcp_target), "127.0.0.1:%d", port);
}

int pdt_daemon_stop(pdt_daemon *d) {
  kill(d->pid, SIGTERM);
  int status = 0;
  waitpid(d->pid, &status, 0);
  pthread_join(d->reader, NULL);
  close(d->err_fd);
  char sock[200];
  snprintf(sock, sizeof(sock), "%s/pd.sock", d->dir);
  unlink(sock);
  rmdir(d->dir);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
