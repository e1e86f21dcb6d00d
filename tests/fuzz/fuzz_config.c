/* libFuzzer target: paradevd's configuration file (server/config_file.c on
 * inih, every key's setter in config_keys.c, the checks between keys in
 * config.c), loaded as the daemon loads it: srv_config_load with
 * `--config FILE`, the input being the file's bytes. Every message the
 * loader reports must come out printable after the daemon's reporter's
 * escaping (server/main.c: srv_log_printable), and a configuration that
 * loads must compare with itself without a key to restart for. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

static int fz_fd = -1;
static char fz_path[64];

static void fz_report(bool error, const char *msg) {
  (void)error;
  if (!msg || !msg[0]) abort(); /* every report says something */
  char clean[SRV_LOG_QUOTED(2048)];
  srv_log_printable(msg, clean, sizeof clean);
  /* What the reporter writes is clean text (no control byte reaches a
   * terminal or the journal), and escaping it again changes nothing. */
  if (srv_log_text_check(clean, false, NULL) >= 0) abort();
  char again[sizeof clean];
  srv_log_printable(clean, again, sizeof again);
  if (strlen(clean) + 8 < sizeof clean && strcmp(clean, again) != 0) abort();
}

static void fz_quiet(bool error, const char *msg) {
  (void)error;
  (void)msg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (fz_fd < 0) {
    fz_fd = memfd_create("paradevd.conf", 0);
    if (fz_fd < 0) abort();
    snprintf(fz_path, sizeof fz_path, "/proc/self/fd/%d", fz_fd);
    /* Where the defaults' sockets would go: not the user's own. */
    setenv("XDG_RUNTIME_DIR", "/nonexistent-paradev-fuzz", 1);
    unsetenv("RUNTIME_DIRECTORY");
    unsetenv("PARADEV_LOG");
  }
  if (ftruncate(fz_fd, 0) != 0 ||
      (size && pwrite(fz_fd, data, size, 0) != (ssize_t)size))
    abort();
  char *argv[] = {"paradevd", "--config", fz_path, NULL};
  srv_options o;
  bool check = false;
  srv_config_action a = srv_config_load(3, argv, &o, &check, fz_report);
  if (a == SRV_CONFIG_RUN) {
    if (srv_config_restart_keys(&o, &o, fz_quiet) != 0) abort();
    char devs[512];
    srv_config_describe_devices(&o, devs, sizeof devs);
  }
  return 0;
}
