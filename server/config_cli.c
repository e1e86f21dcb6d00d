/* The command line: paradevd's usage text and its flags, each setting the
 * key of the file it overrides (config_keys.c). */
#define SRV_LOG_SUB SRV_SUB_CONFIG
#include "config_int.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "paradev/types.h"

const char srv_usage[] =
    "Usage: paradevd [OPTIONS]\n"
    "Serve this machine's devices as one parallel device over gRPC\n"
    "(services paradev.v1.ParallelDevice, grpc.health.v1.Health, and\n"
    "paradev.v1.Admin, for operators: the admin socket, or identities\n"
    "listed in [auth] operators).\n"
    "\n"
    "  --config FILE          INI configuration (default " SRV_DEFAULT_CONFIG
    ",\n"
    "                         read when it exists); flags override it\n"
    "  --check-config         check the configuration, print the result, exit\n"
    "  --listen ADDR          unix:/path or host:port; repeat for several.\n"
    "                         127.0.0.1:0 picks a free port (logged).\n"
    "                         Default: 127.0.0.1:7478 and a Unix socket in\n"
    "                         $RUNTIME_DIRECTORY or $XDG_RUNTIME_DIR, else in\n"
    "                         /tmp/paradevd-UID/ (made mode 0700)\n"
    "  --admin-socket PATH    Unix socket of the Admin service ('' : none)\n"
    "  --metrics-listen ADDR  host:port of the HTTP listener for /metrics,\n"
    "                         /healthz, /readyz (default: none)\n"
    "  --backend cpu|cuda     device backend (default cpu)\n"
    "  --devices N            devices of a cpu mesh, 1..64 (default 4)\n"
    "  --mesh LIST            cuda mesh: cuda:0,cuda:1 or cuda:all (default)\n"
    "  --memory-limit BYTES   per-device memory limit (0: the default, the\n"
    "                         device's share less the reserve)\n"
    "  --memory-reserve BYTES memory kept back from the default limits\n"
    "                         (default: cpu 1G, cuda 512M a GPU)\n"
    "  --default-memory-quota BYTES  quota of a session that asks none\n"
    "                         (0: half the mesh's memory; unlimited: none)\n"
    "  --allow-tf32 BOOL      cuda: float32 products may use TF32 tensor\n"
    "                         cores (default false)\n"
    "  --collectives PATH     cuda: auto (default), nccl or copy\n"
    "  --storage-root ROOT    a directory or http(s):// URL prefix that\n"
    "                         LoadTensors and SaveTensors may use; repeat\n"
    "                         for several (replaces [storage] roots;\n"
    "                         default: none, checkpoints refused)\n"
    "  --tokens-file PATH     bearer tokens' hashes ([auth] tokens_file)\n"
    "  --require-identity R   none, remote (default: TCP peers off\n"
    "                         loopback), tcp or all: who must identify\n"
    "  --hash-token           read a token on stdin, print the line's hash\n"
    "                         for the tokens file (sha256:HEX), exit\n"
    "  --tls-cert FILE        PEM certificate chain: TCP listeners serve TLS\n"
    "  --tls-key FILE         PEM private key of --tls-cert\n"
    "  --tls-client-ca FILE   PEM CAs that sign clients' certificates (mTLS;\n"
    "                         [tls] require_client_cert to require one)\n"
    "  --max-message-bytes N  gRPC message limit, both ways (default 64M)\n"
    "  --threads N            completion-queue threads, 1..16 (default 4)\n"
    "  --grace-ms N           shutdown grace period for calls (default 5000)\n"
    "  --drain-timeout S      seconds queued work may take after SIGTERM\n"
    "                         (default 30)\n"
    "  --world-size W         ranks of a mesh across machines ([mesh];\n"
    "                         default 1: no mesh; also SLURM_NTASKS,\n"
    "                         PARADEV_MESH_WORLD_SIZE)\n"
    "  --rank R               this daemon's rank, 0..W-1 (0: the\n"
    "                         coordinator; also SLURM_PROCID,\n"
    "                         JOB_COMPLETION_INDEX)\n"
    "  --coordinator HOST:PORT  rank 0's mesh port (rank 0 listens there)\n"
    "  --log SPEC             log levels: error|warn|info|debug, optionally\n"
    "                         per subsystem: info,sched=debug (also\n"
    "                         PARADEV_LOG; subsystems: core config rpc sched\n"
    "                         health http admin storage)\n"
    "  --help                 this text\n"
    "  --version              print the version\n"
    "\n"
    "Every key of the file, with its default: deploy/paradevd.conf.\n"
    "Signals: SIGTERM/SIGINT drain then exit (a second one exits at once);\n"
    "SIGHUP reloads the log levels, limits and quotas, and the TLS files.\n";

void srv_report_flag(srv_config_report_fn report, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  report(true, msg);
}

/* Splits "--name=value"; *val is NULL when there is no '='. */
const char *srv_flag_name(const char *a, char *buf, size_t len,
                          const char **val) {
  const char *eq = strchr(a, '=');
  *val = NULL;
  if (strncmp(a, "--", 2) == 0 && eq && (size_t)(eq - a) < len) {
    memcpy(buf, a, (size_t)(eq - a));
    buf[eq - a] = '\0';
    *val = eq + 1;
    return buf;
  }
  return a;
}

int srv_apply_flags(int argc, char **argv, srv_options *o,
                    srv_config_report_fn report) {
  int errors = 0;
  bool listen_from_flags = false, roots_from_flags = false;
  for (int i = 1; i < argc; i++) {
    char name[64];
    const char *val = NULL;
    const char *a = srv_flag_name(argv[i], name, sizeof(name), &val);
    if (strcmp(a, "--check-config") == 0) continue;
    bool is_config = strcmp(a, "--config") == 0;
    const srv_key *k = NULL;
    for (size_t j = 0; j < srv_num_keys && !is_config; j++)
      if (srv_keys[j].flag && strcmp(srv_keys[j].flag, a) == 0)
        k = &srv_keys[j];
    if (!k && !is_config) {
      srv_report_flag(report, "unknown option '%s' (see paradevd --help)",
                      argv[i]);
      errors++;
      continue;
    }
    if (!val) {
      if (i + 1 >= argc) {
        srv_report_flag(report, "%s needs a value", a);
        errors++;
        continue;
      }
      val = argv[++i];
    }
    if (is_config) continue; /* read before the file */
    if (k->type == SRV_K_LISTEN && !listen_from_flags) {
      o->num_listen = 0; /* --listen replaces the file's addresses */
      listen_from_flags = true;
    }
    if (k->type == SRV_K_ROOTS && !roots_from_flags) {
      o->num_storage_roots = 0; /* --storage-root replaces the file's roots */
      roots_from_flags = true;
    }
    char err[512], cv[SRV_LOG_QUOTED(100)];
    if (!srv_key_set(k, o, val, err, sizeof(err))) {
      srv_report_flag(report, "%s '%s': %s", a,
                      srv_log_printable(val, cv, sizeof cv), err);
      errors++;
    } else {
      srv_mesh_note_source(o, k, a);
    }
  }
  return errors;
}
