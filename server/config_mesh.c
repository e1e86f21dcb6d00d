/* [mesh] (issue #16): the values a launcher's environment gives when the
 * flags and the file do not (Slurm, Kubernetes), where each came from, and
 * the checks between the mesh's keys. See config.h. */
#define SRV_LOG_SUB SRV_SUB_CONFIG
#include "config_int.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SRV_SRC_WS 0
#define SRV_SRC_RANK 1
#define SRV_SRC_COORD 2

void srv_mesh_note_source(srv_options *o, const srv_key *k, const char *src) {
  int i = k->off == offsetof(srv_options, mesh_world_size) ? SRV_SRC_WS
          : k->off == offsetof(srv_options, mesh_rank)     ? SRV_SRC_RANK
          : k->off == offsetof(srv_options, mesh_coordinator)
              ? SRV_SRC_COORD
              : -1;
  if (i >= 0) snprintf(o->mesh_src[i], sizeof o->mesh_src[i], "%s", src);
}

int srv_slurm_port(uint64_t job_id) {
  /* JAX's SlurmCluster.get_coordinator_address: a port in the ephemeral
   * range [65535 - 2^12 + 1, 65535] from the job id, so that every task of
   * the job derives the same one without talking. */
  return (int)(job_id % 4096u) + (65535 - 4096 + 1);
}

bool srv_slurm_first_host(const char *nodelist, char *out, size_t len) {
  /* "node[01-04,07],gpu3": the first name is a prefix, then optionally a
   * bracketed range list whose first entry's low end completes it (its
   * zero padding kept), then perhaps a suffix up to the next ','. */
  if (!nodelist || !*nodelist || len == 0) return false;
  const char *p = nodelist;
  while (*p == ' ') p++;
  size_t n = 0;
  while (*p && *p != ',' && *p != '[') {
    if (n + 1 >= len) return false;
    out[n++] = *p++;
  }
  if (*p == '[') {
    p++;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') {
      if (n + 1 >= len) return false;
      out[n++] = *p++;
    }
    if (*p != '-' && *p != ',' && *p != ']') return false;
    const char *close = strchr(p, ']');
    if (!close) return false;
    p = close + 1;
    while (*p && *p != ',' && *p != '[') { /* a suffix: "n[1-2]-ib" */
      if (n + 1 >= len) return false;
      out[n++] = *p++;
    }
    if (*p == '[') return false; /* a second range in one name: not read */
  }
  out[n] = '\0';
  return n > 0;
}

static bool srv_env_uint(const char *v, uint64_t max, uint64_t *out) {
  if (!v || *v < '0' || *v > '9') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end || x > max) return false;
  *out = x;
  return true;
}

static int srv_env_error(srv_config_report_fn report, const char *name,
                         const char *value, const char *expected) {
  char msg[512];
  snprintf(msg, sizeof msg, "environment %s='%.64s': %s", name, value,
           expected);
  report(true, msg);
  return 1;
}

/* An integer from the first variable of `names` that is set. */
static int srv_env_int(srv_getenv_fn env, const char *const *names,
                       uint64_t max, int *field, char *src, size_t srclen,
                       srv_config_report_fn report) {
  for (; *names; names++) {
    const char *v = env(*names);
    if (!v || !*v) continue;
    uint64_t x = 0;
    if (!srv_env_uint(v, max, &x)) {
      char exp[96];
      snprintf(exp, sizeof exp, "expected an integer from 0 to %llu",
               (unsigned long long)max);
      return srv_env_error(report, *names, v, exp);
    }
    *field = (int)x;
    snprintf(src, srclen, "%s", *names);
    return 0;
  }
  return 0;
}

static int srv_env_coordinator(srv_options *o, srv_getenv_fn env,
                               srv_config_report_fn report) {
  char *src = o->mesh_src[SRV_SRC_COORD];
  const char *k8s = env("PARADEV_MESH_COORDINATOR");
  if (k8s && *k8s) {
    const char *colon = strrchr(k8s, ':');
    uint64_t port = 0;
    if (!colon || colon == k8s || !srv_env_uint(colon + 1, 65535, &port) ||
        port == 0 || strlen(k8s) >= sizeof o->mesh_coordinator)
      return srv_env_error(report, "PARADEV_MESH_COORDINATOR", k8s,
                           "expected HOST:PORT with a port from 1 to 65535 "
                           "(the headless service's name and the mesh port)");
    snprintf(o->mesh_coordinator, sizeof o->mesh_coordinator, "%s", k8s);
    snprintf(src, sizeof o->mesh_src[0], "PARADEV_MESH_COORDINATOR");
    return 0;
  }
  const char *job = env("SLURM_JOB_ID");
  const char *list_name = "SLURM_STEP_NODELIST";
  const char *list = env(list_name);
  if (!list || !*list) list = env(list_name = "SLURM_JOB_NODELIST");
  if (!job || !*job || !list || !*list) return 0;
  uint64_t id = 0;
  if (!srv_env_uint(job, UINT64_MAX, &id))
    return srv_env_error(report, "SLURM_JOB_ID", job, "expected a job number");
  char host[SRV_ADDR_MAX - 8];
  if (!srv_slurm_first_host(list, host, sizeof host))
    return srv_env_error(report, list_name, list,
                         "cannot read its first host (expected a node list "
                         "such as node01,node02 or node[01-04,07])");
  snprintf(o->mesh_coordinator, sizeof o->mesh_coordinator, "%s:%d", host,
           srv_slurm_port(id));
  snprintf(src, sizeof o->mesh_src[0], "%s and SLURM_JOB_ID", list_name);
  return 0;
}

int srv_mesh_options_from_env(srv_options *o, srv_getenv_fn env,
                              srv_config_report_fn report) {
  int errors = 0;
  if (o->mesh_world_size == 0) {
    static const char *const ws[] = {"PARADEV_MESH_WORLD_SIZE", "SLURM_NTASKS",
                                     NULL};
    errors += srv_env_int(env, ws, SRV_MESH_MAX_RANKS, &o->mesh_world_size,
                          o->mesh_src[SRV_SRC_WS], sizeof o->mesh_src[0],
                          report);
    if (o->mesh_world_size == 0 && !errors) {
      o->mesh_world_size = 1;
      snprintf(o->mesh_src[SRV_SRC_WS], sizeof o->mesh_src[0], "default");
    }
  }
  if (o->mesh_rank < 0) {
    static const char *const rk[] = {"JOB_COMPLETION_INDEX", "SLURM_PROCID",
                                     NULL};
    errors += srv_env_int(env, rk, SRV_MESH_MAX_RANKS - 1, &o->mesh_rank,
                          o->mesh_src[SRV_SRC_RANK], sizeof o->mesh_src[0],
                          report);
    if (o->mesh_rank < 0 && !errors) {
      o->mesh_rank = 0;
      snprintf(o->mesh_src[SRV_SRC_RANK], sizeof o->mesh_src[0], "default");
    }
  }
  /* The launcher's coordinator only for a mesh: a lone daemon started by
   * srun must not start listening on a port it was never given. */
  if (!o->mesh_coordinator[0] && o->mesh_world_size > 1)
    errors += srv_env_coordinator(o, env, report);
  if (!o->mesh_coordinator[0])
    snprintf(o->mesh_src[SRV_SRC_COORD], sizeof o->mesh_src[0], "none");
  return errors;
}

/* The prefix of a message about the values from sources a and b
 * (SRV_SRC_*): "<config file>: [mesh] " when one came from the file, else
 * "" (the sources in parentheses say where: "--rank", "SLURM_PROCID"). */
static void srv_mesh_where(const srv_options *o, int a, int b, char *buf,
                           size_t len) {
  bool file = o->config_loaded &&
              (o->mesh_src[a][0] == '[' || o->mesh_src[b][0] == '[');
  snprintf(buf, len, "%s%s", file ? o->config_path : "",
           file ? ": [mesh] " : "");
}

int srv_check_mesh(const srv_options *o, bool check,
                   srv_config_report_fn report) {
  int errors = 0;
  char msg[2 * SRV_FILE_MAX + 512], at[SRV_FILE_MAX + 16];
  const char *where = o->config_loaded ? o->config_path : "configuration";
  const int w = o->mesh_world_size, r = o->mesh_rank;
  if (w <= 1) {
    if (r > 0) {
      srv_mesh_where(o, SRV_SRC_RANK, SRV_SRC_WS, at, sizeof at);
      snprintf(msg, sizeof msg,
               "%srank %d (%s) without a mesh: world_size is 1 "
               "(%s); expected rank 0, or world_size > %d",
               at, r, o->mesh_src[SRV_SRC_RANK], o->mesh_src[SRV_SRC_WS],
               r);
      report(true, msg);
      errors++;
    }
    return errors;
  }
  if (r < 0 || r >= w) {
    srv_mesh_where(o, SRV_SRC_RANK, SRV_SRC_WS, at, sizeof at);
    snprintf(msg, sizeof msg,
             "%srank %d (%s) is out of range for a mesh of %d ranks "
             "(%s): expected 0 to %d",
             at, r, o->mesh_src[SRV_SRC_RANK], w, o->mesh_src[SRV_SRC_WS],
             w - 1);
    report(true, msg);
    errors++;
  }
  if (!o->mesh_coordinator[0]) {
    srv_mesh_where(o, SRV_SRC_WS, SRV_SRC_WS, at, sizeof at);
    snprintf(msg, sizeof msg,
             "%sworld_size %d (%s) needs a coordinator: set [mesh] "
             "coordinator or --coordinator HOST:PORT (rank 0's host and its "
             "mesh port), or run under Slurm or a Kubernetes Job that sets "
             "PARADEV_MESH_COORDINATOR",
             at, w, o->mesh_src[SRV_SRC_WS]);
    report(true, msg);
    errors++;
  } else {
    const char *colon = strrchr(o->mesh_coordinator, ':');
    if (!colon || strcmp(colon, ":0") == 0) {
      srv_mesh_where(o, SRV_SRC_COORD, SRV_SRC_COORD, at, sizeof at);
      snprintf(msg, sizeof msg,
               "%scoordinator %s (%s): expected HOST:PORT with a "
               "port from 1 to 65535 (every rank must know it in advance)",
               at, o->mesh_coordinator, o->mesh_src[SRV_SRC_COORD]);
      report(true, msg);
      errors++;
    }
  }
  if ((long)w * o->num_devices > PD_MAX_DEVICES) {
    snprintf(msg, sizeof msg,
             "%s: a mesh of %d ranks with %d devices each has %d devices; "
             "at most %d: fewer ranks or fewer [devices] devices",
             where, w, o->num_devices, w * o->num_devices, PD_MAX_DEVICES);
    report(true, msg);
    errors++;
  }
  if (o->mesh_lease_s < 2) {
    snprintf(msg, sizeof msg,
             "%s: [mesh] lease_s %u: heartbeats go every lease / 4; "
             "expected at least 2",
             where, o->mesh_lease_s);
    report(true, msg);
    errors++;
  }
  if (check && o->mesh_secret_file[0] &&
      access(o->mesh_secret_file, R_OK) != 0) {
    snprintf(msg, sizeof msg, "%s: [mesh] secret_file %s: %s", where,
             o->mesh_secret_file, strerror(errno));
    report(true, msg);
    errors++;
  }
  return errors;
}

void srv_config_describe_mesh(const srv_options *o, char *buf, size_t len) {
  if (o->mesh_world_size <= 1) {
    snprintf(buf, len, "none (world size 1, %s)", o->mesh_src[SRV_SRC_WS]);
    return;
  }
  snprintf(buf, len,
           "world size %d (%s), rank %d (%s), coordinator %s (%s); "
           "join_timeout_s %u, lease_s %u, collective_timeout_s %u, "
           "on_coordinator_loss %s, transport_host %s, secret %s",
           o->mesh_world_size, o->mesh_src[SRV_SRC_WS], o->mesh_rank,
           o->mesh_src[SRV_SRC_RANK], o->mesh_coordinator,
           o->mesh_src[SRV_SRC_COORD], o->mesh_join_timeout_s, o->mesh_lease_s,
           o->mesh_collective_timeout_s,
           o->mesh_on_loss == SRV_MESH_LOSS_EXIT ? "exit" : "wait",
           o->mesh_transport_host[0] ? o->mesh_transport_host : "(derived)",
           o->mesh_secret_file[0] ? o->mesh_secret_file : "none");
}
