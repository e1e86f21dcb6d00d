/* See benchdaemon.h. */
#include "benchdaemon.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t daemon_pid;
static char daemon_dir[64];

static void fail(const char *prog, const char *what, pd_status *st) {
  fprintf(stderr, "%s: %s: %s: %s\n", prog, what,
          pd_code_name(pd_status_code(st)), pd_status_message(st));
  exit(1);
}

void bench_daemon_stop(void) {
  if (daemon_pid <= 0) return;
  kill(daemon_pid, SIGTERM);
  int status;
  waitpid(daemon_pid, &status, 0);
  daemon_pid = 0;
  char p[128];
  snprintf(p, sizeof(p), "%s/pd.sock", daemon_dir);
  unlink(p);
  snprintf(p, sizeof(p), "%s/admin.sock", daemon_dir);
  unlink(p);
  rmdir(daemon_dir);
}

pd_client *bench_daemon_start(const char *paradevd, int devices,
                              const char *prog, pd_status *st) {
  snprintf(daemon_dir, sizeof(daemon_dir), "/tmp/bench-daemon-XXXXXX");
  if (!mkdtemp(daemon_dir)) {
    perror("mkdtemp");
    exit(1);
  }
  char target[128], admin[128], ndev[16];
  snprintf(target, sizeof(target), "unix:%s/pd.sock", daemon_dir);
  snprintf(admin, sizeof(admin), "%s/admin.sock", daemon_dir);
  snprintf(ndev, sizeof(ndev), "%d", devices);
  daemon_pid = fork();
  if (daemon_pid == 0) {
    execl(paradevd, paradevd, "--config", "/dev/null", "--listen", target,
          "--admin-socket", admin, "--devices", ndev, "--log", "warn",
          (char *)NULL);
    fprintf(stderr, "%s: cannot run %s\n", prog, paradevd);
    _exit(127);
  }
  /* Connect once the socket exists: a first attempt that fails would leave
   * gRPC's channel in its reconnect backoff (a second or more). */
  for (int i = 0; i < 400 && access(target + 5, F_OK) != 0; i++) usleep(25000);
  pd_client *c = pd_client_new(target, NULL, st);
  if (!c) fail(prog, "connect", st);
  pd_serving_status ss = PD_SERVING_UNKNOWN;
  for (int i = 0; i < 200; i++) {
    pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
    o.timeout_ms = 1000;
    if (pd_client_health(c, "", &ss, &o, st) == PD_OK && ss == PD_SERVING)
      break;
    usleep(50000);
  }
  if (ss != PD_SERVING) fail(prog, "the daemon did not become ready", st);
  return c;
}
