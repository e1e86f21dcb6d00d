/* The configuration's keys (config_int.h): the table, the defaults, and
 * parsing and setting one key's value, for the file and the flags alike. */
#define SRV_LOG_SUB SRV_SUB_CONFIG
#include "config_int.h"

#include <errno.h>
#include <grp.h>
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

#include "common.h"
#include "device.h"
#include "paradev/types.h"

#define OFF(f) offsetof(srv_options, f)
#define LIM(f) (offsetof(srv_options, limits) + offsetof(srv_limits, f))

const srv_key srv_keys[] = {
    {"daemon", "listen", "--listen", SRV_K_LISTEN, OFF(listen), 0, 0, false},
    {"daemon", "admin_socket", "--admin-socket", SRV_K_PATH, OFF(admin_socket),
     0, 0, false},
    {"daemon", "admin_socket_mode", NULL, SRV_K_MODE, OFF(admin_socket_mode), 0,
     0777, false},
    {"daemon", "admin_socket_group", NULL, SRV_K_GROUP, OFF(admin_socket_group),
     0, 0, false},
    {"daemon", "metrics_listen", "--metrics-listen", SRV_K_HOSTPORT,
     OFF(metrics_listen), 0, 0, false},
    {"daemon", "threads", "--threads", SRV_K_INT, OFF(num_threads), 1,
     SRV_MAX_THREADS, false},
    {"daemon", "shutdown_grace_ms", "--grace-ms", SRV_K_INT, OFF(grace_ms), 0,
     600000, false},
    {"daemon", "drain_timeout_seconds", "--drain-timeout", SRV_K_U32,
     OFF(drain_timeout_s), 0, 86400, true},
    {"daemon", "stall_timeout_seconds", NULL, SRV_K_U32, OFF(stall_timeout_s),
     1, 86400, true},
    {"daemon", "kernel_timeout_seconds", NULL, SRV_K_U32, OFF(kernel_timeout_s),
     0, 31536000, true},
    {"daemon", "metrics_max_connections", NULL, SRV_K_INT,
     OFF(metrics_max_connections), 1, 65536, false},
    {"daemon", "metrics_max_connections_per_ip", NULL, SRV_K_INT,
     OFF(metrics_max_connections_per_ip), 0, 65536, false},
    {"daemon", "metrics_idle_timeout_seconds", NULL, SRV_K_U32,
     OFF(metrics_idle_timeout_s), 1, 3600, false},
    {"devices", "backend", "--backend", SRV_K_BACKEND, OFF(backend), 0, 0,
     false},
    {"devices", "devices", "--devices", SRV_K_INT, OFF(num_devices), 1,
     PD_MAX_DEVICES, false},
    {"devices", "mesh", "--mesh", SRV_K_MESH, OFF(mesh), 0, 0, false},
    {"devices", "memory_limit", "--memory-limit", SRV_K_SIZE, OFF(memory_limit),
     0, UINT64_MAX, false},
    {"devices", "memory_reserve", "--memory-reserve", SRV_K_SIZE,
     OFF(memory_reserve), 0, UINT64_MAX, false},
    {"devices", "blas_threads", NULL, SRV_K_INT, OFF(blas_threads), 0, 1024,
     false},
    {"cuda", "allow_tf32", "--allow-tf32", SRV_K_BOOL, OFF(cuda_allow_tf32), 0,
     0, false},
    {"cuda", "collectives", "--collectives", SRV_K_COLLECTIVES,
     OFF(cuda_collectives), 0, 0, false},
    {"cuda", "collective_timeout_ms", NULL, SRV_K_INT,
     OFF(cuda_collective_timeout_ms), 1000, 86400000, false},
    {"cuda", "pool_release_threshold", NULL, SRV_K_SIZE_ALL,
     OFF(cuda_pool_release_threshold), 0, UINT64_MAX, false},
    {"limits", "max_message_bytes", "--max-message-bytes", SRV_K_SIZE,
     LIM(max_message_bytes), 4096, INT_MAX, false},
    {"limits", "max_tensor_bytes", NULL, SRV_K_SIZE, LIM(max_tensor_bytes), 1,
     UINT64_MAX, true},
    {"limits", "max_ops_per_request", NULL, SRV_K_INT, LIM(max_ops_per_request),
     1, 1000000, true},
    {"limits", "max_handles_per_session", NULL, SRV_K_INT,
     LIM(max_handles_per_session), 1, 100000000, true},
    {"limits", "max_sessions", NULL, SRV_K_INT, LIM(max_sessions), 1, 1000000,
     true},
    {"limits", "max_ids_per_request", NULL, SRV_K_INT, LIM(max_ids_per_request),
     1, 10000000, true},
    {"limits", "max_queued_ops", NULL, SRV_K_INT, LIM(max_queued_ops), 1,
     100000000, true},
    {"limits", "max_queued_device_ms", NULL, SRV_K_U32,
     LIM(max_queued_device_ms), 0, 86400000, true},
    {"scheduler", "fair_share", NULL, SRV_K_BOOL, OFF(sched_fair_share), 0, 0,
     false},
    {"scheduler", "dispatch_ahead_us", NULL, SRV_K_INT, OFF(dispatch_ahead_us),
     0, 60000000, true},
    {"sessions", "default_lease_seconds", NULL, SRV_K_U32, LIM(default_lease_s),
     1, 315360000, true},
    {"sessions", "max_lease_seconds", NULL, SRV_K_U32, LIM(max_lease_s), 1,
     315360000, true},
    {"sessions", "default_memory_quota", "--default-memory-quota",
     SRV_K_SIZE_ALL, LIM(default_memory_quota), 0, UINT64_MAX, true},
    {"sessions", "default_memory_quota_percent", NULL, SRV_K_INT,
     LIM(default_memory_quota_percent), 1, 100, true},
    {"sessions", "max_memory_quota", NULL, SRV_K_SIZE, LIM(max_memory_quota), 0,
     UINT64_MAX, true},
    {"storage", "roots", "--storage-root", SRV_K_ROOTS, OFF(storage_roots), 0,
     0, false},
    {"storage", "block_size", NULL, SRV_K_SIZE, OFF(storage_block_size), 4096,
     (uint64_t)1 << 30, false},
    {"storage", "cache_bytes", NULL, SRV_K_SIZE, OFF(storage_cache_bytes), 0,
     UINT64_MAX, false},
    {"storage", "max_staleness_s", NULL, SRV_K_U32,
     OFF(storage_max_staleness_s), 0, 315360000, false},
    {"storage", "fetch_timeout_s", NULL, SRV_K_U32,
     OFF(storage_fetch_timeout_s), 1, 3600, false},
    {"storage", "fetch_retries", NULL, SRV_K_INT, OFF(storage_fetch_retries), 0,
     100, false},
    {"storage", "load_workers", NULL, SRV_K_INT, OFF(storage_load_workers), 1,
     64, false},
    {"auth", "tokens_file", "--tokens-file", SRV_K_FILE, OFF(auth_tokens_file),
     0, SRV_ROOT_MAX, true},
    {"auth", "require_identity", "--require-identity", SRV_K_REQUIRE,
     OFF(auth_require), 0, 0, true},
    {"auth", "operators", NULL, SRV_K_IDLIST, OFF(auth_operators), 0,
     SRV_AUTH_LIST_MAX, true},
    {"tls", "cert_file", "--tls-cert", SRV_K_FILE, OFF(tls_cert_file), 0,
     SRV_FILE_MAX, false},
    {"tls", "key_file", "--tls-key", SRV_K_FILE, OFF(tls_key_file), 0,
     SRV_FILE_MAX, false},
    {"tls", "client_ca_file", "--tls-client-ca", SRV_K_FILE,
     OFF(tls_client_ca_file), 0, SRV_FILE_MAX, false},
    {"tls", "require_client_cert", NULL, SRV_K_BOOL,
     OFF(tls_require_client_cert), 0, 0, false},
    {"tls", "allow_insecure_tcp", NULL, SRV_K_BOOL, OFF(tls_allow_insecure_tcp),
     0, 0, false},
    {"log", "level", "--log", SRV_K_LOG, OFF(log_levels), 0, 0, true},
    {"auth", "require_job_token", NULL, SRV_K_BOOL, OFF(require_job_token), 0,
     0, true},
    {"auth", "job_token_lifetime_seconds", NULL, SRV_K_U32,
     OFF(job_token_lifetime_s), 60, 2592000, true},
    {"auth", "max_job_tokens", NULL, SRV_K_INT, OFF(max_job_tokens), 1, 1000000,
     false},
    {"auth", "job_tokens_file", NULL, SRV_K_FILE, OFF(job_tokens_file), 0,
     SRV_ROOT_MAX, false},
    /* [functions]: the passes in dev_fn_pass order (dev_fn_pass_name). */
    {"functions", "pruning", NULL, SRV_K_TRISTATE, OFF(fn_passes[0]), 0, 0,
     false},
    {"functions", "cse", NULL, SRV_K_TRISTATE, OFF(fn_passes[1]), 0, 0, false},
    {"functions", "constant_folding", NULL, SRV_K_TRISTATE, OFF(fn_passes[2]),
     0, 0, false},
    {"functions", "arithmetic", NULL, SRV_K_TRISTATE, OFF(fn_passes[3]), 0, 0,
     false},
    {"functions", "fusion", NULL, SRV_K_TRISTATE, OFF(fn_passes[4]), 0, 0,
     false},
    {"functions", "buffer_planning", NULL, SRV_K_TRISTATE, OFF(fn_passes[5]), 0,
     0, false},
    {"functions", "cuda_graph", NULL, SRV_K_TRISTATE, OFF(fn_passes[6]), 0, 0,
     false},
    {"functions", "max_instantiations", NULL, SRV_K_INT,
     OFF(fn_max_instantiations), 1, DEV_FN_MAX_INST_CAP, false},
    {"functions", "constant_folding_max_bytes", NULL, SRV_K_SIZE,
     OFF(fn_fold_max_bytes), 1, (uint64_t)1 << 30, false},
    {"functions", "constant_folding_max_ms", NULL, SRV_K_INT,
     OFF(fn_fold_max_ms), 1, 60000, false},
    {"functions", "instantiation_max_ms", NULL, SRV_K_INT, OFF(fn_inst_max_ms),
     1, 600000, false},
    {"functions", "optimizer_plugins", NULL, SRV_K_PLUGINS, OFF(fn_plugins), 0,
     SRV_AUTH_LIST_MAX, false},
    /* [mesh] (issue #16). The first three keys' sources are logged
     * (srv_options.mesh_src, in this order). */
    {"mesh", "world_size", "--world-size", SRV_K_OPTINT, OFF(mesh_world_size),
     1, SRV_MESH_MAX_RANKS, false},
    {"mesh", "rank", "--rank", SRV_K_OPTINT, OFF(mesh_rank), 0,
     SRV_MESH_MAX_RANKS - 1, false},
    {"mesh", "coordinator", "--coordinator", SRV_K_HOSTPORT,
     OFF(mesh_coordinator), 0, 0, false},
    {"mesh", "join_timeout_s", NULL, SRV_K_U32, OFF(mesh_join_timeout_s), 1,
     86400, false},
    {"mesh", "lease_s", NULL, SRV_K_U32, OFF(mesh_lease_s), 1, 3600, false},
    {"mesh", "collective_timeout_s", NULL, SRV_K_U32,
     OFF(mesh_collective_timeout_s), 1, 86400, false},
    {"mesh", "on_coordinator_loss", NULL, SRV_K_ONLOSS, OFF(mesh_on_loss), 0,
     0, false},
    {"mesh", "transport_host", NULL, SRV_K_HOST, OFF(mesh_transport_host), 0,
     0, false},
    {"mesh", "secret_file", NULL, SRV_K_FILE, OFF(mesh_secret_file), 0,
     SRV_FILE_MAX, false},
};
const size_t srv_num_keys = sizeof(srv_keys) / sizeof(srv_keys[0]);
_Static_assert(sizeof(srv_keys) / sizeof(srv_keys[0]) <= SRV_MAX_KEYS,
               "SRV_MAX_KEYS");

const char *const srv_sections[] = {
    "daemon",  "devices", "cuda", "limits", "scheduler", "sessions",
    "storage", "auth",    "tls",  "log",    "functions", "mesh"};

const char *const srv_collectives[] = {"auto", "nccl", "copy"};
const size_t srv_num_collectives = 3;
const size_t srv_num_sections = sizeof(srv_sections) / sizeof(srv_sections[0]);

void srv_defaults(srv_options *o) {
  memset(o, 0, sizeof(*o));
  o->admin_socket_mode = 0660;
  o->num_threads = 4;
  o->grace_ms = 5000;
  o->drain_timeout_s = 30;
  o->stall_timeout_s = 60;
  o->kernel_timeout_s = 3600;
  o->metrics_max_connections = 64;
  o->metrics_max_connections_per_ip = 8;
  o->metrics_idle_timeout_s = 10;
  snprintf(o->backend, sizeof(o->backend), "cpu");
  o->num_devices = 4;
  o->memory_reserve = UINT64_MAX; /* DEV_MEMORY_RESERVE_DEFAULT */
  o->cuda_pool_release_threshold = UINT64_MAX;
  o->cuda_collective_timeout_ms = 300000;
  o->limits = (srv_limits){
      .max_message_bytes = 64u << 20,
      .max_tensor_bytes = (uint64_t)4 << 30,
      .max_ops_per_request = 4096,
      .max_handles_per_session = 1000000,
      .max_sessions = 1024,
      .max_string_bytes = 256,
      .max_ids_per_request = 65536,
      .max_queued_ops = 1 << 20,
      .max_queued_device_ms = 600000,
      .default_lease_s = 60,
      .max_lease_s = 86400,
      .default_memory_quota_percent = 50,
  };
  o->sched_fair_share = true;
  o->dispatch_ahead_us = 2000;
  o->storage_block_size = 16u << 20;
  o->storage_cache_bytes = 1u << 30;
  o->storage_fetch_timeout_s = 30;
  o->storage_fetch_retries = 3;
  o->storage_load_workers = 2;
  o->auth_require = SRV_REQUIRE_REMOTE;
  o->job_token_lifetime_s = 7 * 86400;
  o->max_job_tokens = 4096;
  o->fn_max_instantiations = DEV_FN_DEFAULT_INST_CAP;
  o->fn_fold_max_bytes = 65536;
  o->fn_fold_max_ms = 50;
  o->fn_inst_max_ms = DEV_FN_DEFAULT_INST_MAX_MS;
  for (int i = 0; i < SRV_SUB_COUNT; i++) o->log_levels[i] = SRV_LOG_INFO;
  snprintf(o->config_path, sizeof(o->config_path), "%s", SRV_DEFAULT_CONFIG);
  o->mesh_world_size = 0; /* not given (srv_mesh_options_from_env) */
  o->mesh_rank = -1;
  o->mesh_join_timeout_s = 60;
  o->mesh_lease_s = 10;
  o->mesh_collective_timeout_s = 30;
  o->mesh_on_loss = SRV_MESH_LOSS_WAIT;
}

void srv_tmp_socket_dir(char *out, size_t len) {
  snprintf(out, len, "/tmp/paradevd-%u", (unsigned)getuid());
}

bool srv_private_dir_prepare(const char *dir, char *err, size_t errlen) {
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "cannot create the directory %s: %s", dir,
             strerror(errno));
    return false;
  }
  struct stat sb;
  if (lstat(dir, &sb) != 0) {
    snprintf(err, errlen, "cannot inspect %s: %s", dir, strerror(errno));
    return false;
  }
  if (!S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
    snprintf(err, errlen,
             "%s is %s owned by uid %u with mode %04o; expected a directory "
             "of uid %u with mode 0700 (another user may have created it to "
             "take the socket): remove it, or set XDG_RUNTIME_DIR or "
             "--listen and --admin-socket",
             dir,
             S_ISLNK(sb.st_mode)   ? "a symbolic link"
             : S_ISDIR(sb.st_mode) ? "a directory"
                                   : "not a directory",
             (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777),
             (unsigned)geteuid());
    return false;
  }
  return true;
}

static bool srv_parse_uint(const char *s, uint64_t *out) {
  if (!s || !*s || *s < '0' || *s > '9') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

/* host:port with port 0..65535; [v6]:port; host not empty. */
static bool srv_valid_hostport(const char *a) {
  const char *colon = strrchr(a, ':');
  if (!colon || colon == a || !colon[1]) return false;
  if (a[0] == '[' && colon[-1] != ']') return false;
  uint64_t port = 0;
  if (!srv_parse_uint(colon + 1, &port) || port > 65535) return false;
  for (const char *p = a; p < colon; p++)
    if (*p == ' ' || *p == '/' || (unsigned char)*p < 0x21) return false;
  return true;
}

static bool srv_valid_socket_path(const char *p) {
  return p[0] == '/' && strlen(p) < sizeof(((struct sockaddr_un *)0)->sun_path);
}

static bool srv_valid_mesh(const char *m) {
  if (!*m || strcmp(m, "cuda:all") == 0) return true;
  const char *p = m;
  while (*p) {
    if (strncmp(p, "cuda:", 5) != 0) return false;
    p += 5;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') p++;
    if (*p == ',') {
      p++;
      if (!*p) return false;
    } else if (*p) {
      return false;
    }
  }
  return true;
}

/* Appends listen addresses from a comma-separated value. */
static bool srv_add_listen(srv_options *o, const char *value, char *err,
                           size_t errlen) {
  const char *p = value;
  bool any = false;
  while (*p) {
    size_t n = strcspn(p, ",");
    const char *b = p, *e = p + n;
    while (b < e && (*b == ' ' || *b == '\t')) b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
    if (e > b) {
      char a[SRV_ADDR_MAX];
      if ((size_t)(e - b) >= sizeof(a)) {
        snprintf(err, errlen, "an address of %zu bytes; at most %d",
                 (size_t)(e - b), SRV_ADDR_MAX - 1);
        return false;
      }
      memcpy(a, b, (size_t)(e - b));
      a[e - b] = '\0';
      bool ok = strncmp(a, "unix:", 5) == 0 ? srv_valid_socket_path(a + 5)
                                            : srv_valid_hostport(a);
      if (!ok) {
        snprintf(err, errlen,
                 "'%s' is not an address: expected unix:/absolute/path or "
                 "host:port (port 0..65535; 0 picks a free one)",
                 a);
        return false;
      }
      if (o->num_listen == SRV_MAX_LISTEN) {
        snprintf(err, errlen, "more than %d listen addresses", SRV_MAX_LISTEN);
        return false;
      }
      memcpy(o->listen[o->num_listen++], a, (size_t)(e - b) + 1);
      any = true;
    }
    p += n;
    if (*p == ',') p++;
  }
  if (!any) {
    snprintf(err, errlen,
             "no address: expected unix:/absolute/path or host:port, "
             "several separated by commas");
    return false;
  }
  return true;
}

/* Appends storage roots from a comma-separated value: each an absolute
 * directory or an http:// / https:// URL prefix (whether a directory exists
 * is stg_roots_create's check, at start). */
static bool srv_add_roots(srv_options *o, const char *value, char *err,
                          size_t errlen) {
  const char *p = value;
  bool any = false;
  while (*p) {
    size_t n = strcspn(p, ",");
    const char *b = p, *e = p + n;
    while (b < e && (*b == ' ' || *b == '\t')) b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
    size_t len = (size_t)(e - b);
    if (len) {
      bool url = (len > 7 && strncmp(b, "http://", 7) == 0) ||
                 (len > 8 && strncmp(b, "https://", 8) == 0);
      if (len >= SRV_ROOT_MAX || (!url && b[0] != '/')) {
        snprintf(err, errlen,
                 "'%.*s' is not a storage root: expected an absolute "
                 "directory or an http:// or https:// URL prefix of at most "
                 "%d bytes",
                 (int)(len > 200 ? 200 : len), b, SRV_ROOT_MAX - 1);
        return false;
      }
      if (o->num_storage_roots == SRV_MAX_ROOTS) {
        snprintf(err, errlen, "more than %d storage roots", SRV_MAX_ROOTS);
        return false;
      }
      memcpy(o->storage_roots[o->num_storage_roots], b, len);
      o->storage_roots[o->num_storage_roots++][len] = '\0';
      any = true;
    }
    p += n;
    if (*p == ',') p++;
  }
  if (!any && *value) {
    snprintf(err, errlen,
             "no root: expected absolute directories or URL prefixes "
             "separated by commas");
    return false;
  }
  return true;
}

static bool srv_parse_bool(const char *s, bool *out) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
    if (strcasecmp(s, yes[i]) == 0 || strcasecmp(s, no[i]) == 0) {
      *out = strcasecmp(s, yes[i]) == 0;
      return true;
    }
  }
  return false;
}

/* One setter per kind of key (srv_key_set picks it): each writes the value
 * into `field` (the key's place in `o`), or what was expected into err. */

static bool srv_set_path(srv_options *o, char *field, const char *value,
                         char *err, size_t errlen) {
  if (*value && !srv_valid_socket_path(value)) {
    snprintf(err, errlen,
             "expected an absolute path of at most %zu bytes, or nothing "
             "to turn it off",
             sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    return false;
  }
  snprintf(field, SRV_ADDR_MAX, "%s", value);
  o->admin_socket_set = true; /* the one path key */
  return true;
}

static bool srv_set_hostport(char *field, const char *value, char *err,
                             size_t errlen) {
  if (*value && !srv_valid_hostport(value)) {
    snprintf(err, errlen,
             "expected host:port (such as 127.0.0.1:9478 or [::1]:9478; "
             "port 0 picks a free one), or nothing to turn it off");
    return false;
  }
  if (strlen(value) >= SRV_ADDR_MAX) {
    snprintf(err, errlen, "at most %d bytes", SRV_ADDR_MAX - 1);
    return false;
  }
  snprintf(field, SRV_ADDR_MAX, "%s", value);
  return true;
}

static bool srv_set_backend(srv_options *o, char *field, const char *value,
                            char *err, size_t errlen) {
  if (strcmp(value, "cpu") != 0 && strcmp(value, "cuda") != 0) {
    snprintf(err, errlen, "expected cpu or cuda");
    return false;
  }
  snprintf(field, sizeof(o->backend), "%s", value);
  return true;
}

static bool srv_set_mesh(char *field, const char *value, char *err,
                         size_t errlen) {
  if (!srv_valid_mesh(value) || strlen(value) >= SRV_ADDR_MAX) {
    snprintf(err, errlen,
             "expected cuda:all or a list such as cuda:0,cuda:1 (an "
             "ordinal may repeat)");
    return false;
  }
  snprintf(field, SRV_ADDR_MAX, "%s", value);
  return true;
}

/* SRV_K_INT (an int) and SRV_K_U32 (a uint32_t), within [min, max]. */
static bool srv_set_int(const srv_key *k, char *field, const char *value,
                        char *err, size_t errlen) {
  uint64_t v = 0;
  if (!srv_parse_uint(value, &v) || v < k->min || v > k->max) {
    snprintf(err, errlen, "expected an integer from %llu to %llu",
             (unsigned long long)k->min, (unsigned long long)k->max);
    return false;
  }
  if (k->type == SRV_K_INT || k->type == SRV_K_OPTINT)
    *(int *)(void *)field = (int)v;
  else
    *(uint32_t *)(void *)field = (uint32_t)v;
  return true;
}

static bool srv_set_size(const srv_key *k, char *field, const char *value,
                         char *err, size_t errlen) {
  uint64_t v = 0;
  if (!pdcom_parse_size(value, &v) || v < k->min || v > k->max) {
    if (k->max == UINT64_MAX)
      snprintf(err, errlen,
               "expected a byte count of at least %llu, such as 4096, "
               "512K, 64M or 4G",
               (unsigned long long)k->min);
    else
      snprintf(err, errlen,
               "expected a byte count from %llu to %llu, such as 4096, "
               "512K, 64M or 1G",
               (unsigned long long)k->min, (unsigned long long)k->max);
    return false;
  }
  *(uint64_t *)(void *)field = v;
  return true;
}

/* A byte count, or "unlimited" (UINT64_MAX). */
static bool srv_set_size_all(char *field, const char *value, char *err,
                             size_t errlen) {
  uint64_t v = 0;
  if (strcasecmp(value, "unlimited") == 0) {
    *(uint64_t *)(void *)field = UINT64_MAX;
    return true;
  }
  if (!pdcom_parse_size(value, &v)) {
    snprintf(err, errlen,
             "expected a byte count such as 0, 512M or 4G, or unlimited");
    return false;
  }
  *(uint64_t *)(void *)field = v;
  return true;
}

static bool srv_set_mode(const srv_key *k, char *field, const char *value,
                         char *err, size_t errlen) {
  char *end = NULL;
  errno = 0;
  unsigned long m = strtoul(value, &end, 8);
  if (!*value || errno || *end || m > k->max) {
    snprintf(err, errlen, "expected an octal file mode such as 0660");
    return false;
  }
  if (m & 0002) {
    /* The one mode key is the admin socket's: whoever may write to it may
     * kill sessions, drain the daemon and change its log levels. */
    snprintf(err, errlen,
             "gives others write (o+w): any local user could use the Admin "
             "service and kill sessions; expected a mode without it, such "
             "as 0660 or 0600");
    return false;
  }
  *(unsigned *)(void *)field = (unsigned)m;
  return true;
}

/* A group: a name (as useradd accepts: letters, digits, '_', '-', '.',
 * not starting with '-') or a number; empty for the daemon's own. Whether
 * it exists is checked when the admin socket is bound (rpc.c), so that a
 * file can be checked on a machine without the group. */
static bool srv_set_group(char *field, const char *value, char *err,
                          size_t errlen) {
  size_t n = strlen(value);
  bool ok = n < 64 && value[0] != '-';
  for (size_t i = 0; ok && i < n; i++)
    ok = (value[i] >= 'a' && value[i] <= 'z') ||
         (value[i] >= 'A' && value[i] <= 'Z') ||
         (value[i] >= '0' && value[i] <= '9') || value[i] == '_' ||
         value[i] == '-' || value[i] == '.';
  if (!ok) {
    snprintf(err, errlen,
             "expected a group name (letters, digits, '_', '-', '.', at most "
             "63 bytes) or number, such as paradev-admin, or nothing for "
             "the daemon's own group");
    return false;
  }
  snprintf(field, SRV_ADDR_MAX, "%s", value);
  return true;
}

bool srv_group_lookup(const char *name, gid_t *gid) {
  uint64_t n = 0;
  if (srv_parse_uint(name, &n) && n < UINT32_MAX) {
    if (gid) *gid = (gid_t)n;
    return true;
  }
  struct group gr, *res = NULL;
  char buf[16384];
  if (getgrnam_r(name, &gr, buf, sizeof buf, &res) != 0 || !res) return false;
  if (gid) *gid = res->gr_gid;
  return true;
}

static bool srv_set_bool(char *field, const char *value, char *err,
                         size_t errlen) {
  if (!srv_parse_bool(value, (bool *)(void *)field)) {
    snprintf(err, errlen, "expected true or false");
    return false;
  }
  return true;
}

/* The index of the name in srv_collectives. */
static bool srv_set_collectives(char *field, const char *value, char *err,
                                size_t errlen) {
  for (size_t i = 0; i < srv_num_collectives; i++)
    if (strcmp(value, srv_collectives[i]) == 0) {
      *(int *)(void *)field = (int)i;
      return true;
    }
  snprintf(err, errlen, "expected auto, nccl or copy");
  return false;
}

/* An absolute path of fewer than k->max bytes, or "" for none. */
static bool srv_set_file(const srv_key *k, char *field, const char *value,
                         char *err, size_t errlen) {
  if (*value && (value[0] != '/' || strlen(value) >= k->max)) {
    snprintf(err, errlen,
             "expected the absolute path of a file (at most %llu bytes), or "
             "nothing for none",
             (unsigned long long)k->max - 1);
    return false;
  }
  snprintf(field, k->max, "%s", value);
  return true;
}

static bool srv_set_require(char *field, const char *value, char *err,
                            size_t errlen) {
  static const char *const names[] = {"none", "remote", "tcp", "all"};
  for (int i = 0; i < 4; i++)
    if (strcmp(value, names[i]) == 0) {
      *(int *)(void *)field = i;
      return true;
    }
  snprintf(err, errlen,
           "expected none, remote (TCP peers off loopback), tcp (every TCP "
           "peer) or all (TCP and Unix socket peers)");
  return false;
}

static bool srv_set_tristate(char *field, const char *value, char *err,
                             size_t errlen) {
  static const char *const names[] = {"default", "off", "on"};
  for (int i = 0; i < 3; i++)
    if (strcasecmp(value, names[i]) == 0) {
      *(int *)(void *)field = i; /* DEV_TRI_DEFAULT, _OFF, _ON */
      return true;
    }
  snprintf(err, errlen, "expected on, off or default");
  return false;
}

/* A comma list of at most SRV_MAX_PLUGINS absolute paths of shared objects
 * ("" for none), kept as written with blanks around the commas removed. */
static bool srv_set_plugins(const srv_key *k, char *field, const char *value,
                            char *err, size_t errlen) {
  /* The key may repeat (or continue on indented lines, which inih hands
   * over as repeats): each occurrence appends, since a config line holds at
   * most 197 bytes (inih's INI_MAX_LINE) and plugin paths are long. */
  char out[SRV_AUTH_LIST_MAX];
  size_t n = strlen(field);
  int count = 0;
  memcpy(out, field, n);
  for (size_t i = 0; i < n; i++) count += out[i] == ',';
  if (n) count++;
  const char *p = value;
  while (*p) {
    while (*p == ' ' || *p == '\t') p++;
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    if (len == 0 || p[0] != '/' || ++count > SRV_MAX_PLUGINS ||
        n + len + 2 > k->max) {
      snprintf(err, errlen,
               "expected a comma-separated list of at most %d absolute paths "
               "of optimizer plugins (shared objects; at most %llu bytes in "
               "all), or nothing for none",
               SRV_MAX_PLUGINS, (unsigned long long)k->max - 1);
      return false;
    }
    if (n) out[n++] = ',';
    memcpy(out + n, p, len);
    n += len;
    if (!e) break;
    p = e + 1;
    if (!*p) {
      snprintf(err, errlen, "a trailing comma: expected another path");
      return false;
    }
  }
  out[n] = '\0';
  memcpy(field, out, n + 1);
  return true;
}

static bool srv_set_onloss(char *field, const char *value, char *err,
                           size_t errlen) {
  if (strcmp(value, "wait") == 0 || strcmp(value, "exit") == 0) {
    *(int *)(void *)field =
        value[0] == 'w' ? SRV_MESH_LOSS_WAIT : SRV_MESH_LOSS_EXIT;
    return true;
  }
  snprintf(err, errlen,
           "expected wait (drop the coordinator's tensors and attach again "
           "when it is back) or exit");
  return false;
}

/* A host name or IP address the other ranks can reach (no port). */
static bool srv_set_host(char *field, const char *value, char *err,
                         size_t errlen) {
  size_t n = strlen(value);
  bool ok = n < 254;
  for (size_t i = 0; ok && i < n; i++) {
    unsigned char ch = (unsigned char)value[i];
    ok = ch > 0x20 && ch < 0x7f && ch != '/' && ch != ',';
  }
  if (!ok || (n && strchr(value, ':') && value[0] != '[' &&
              strchr(value, ':') == strrchr(value, ':'))) {
    snprintf(err, errlen,
             "expected a host name or IP address without a port (such as "
             "node01 or 10.0.0.5), or nothing for the default");
    return false;
  }
  snprintf(field, SRV_ADDR_MAX, "%s", value);
  return true;
}

/* Sets key `k` from text. On error writes what was expected into err. */
bool srv_key_set(const srv_key *k, srv_options *o, const char *value, char *err,
                 size_t errlen) {
  char *field = (char *)o + k->off;
  switch (k->type) {
    case SRV_K_LISTEN: return srv_add_listen(o, value, err, errlen);
    case SRV_K_PATH: return srv_set_path(o, field, value, err, errlen);
    case SRV_K_HOSTPORT: return srv_set_hostport(field, value, err, errlen);
    case SRV_K_BACKEND: return srv_set_backend(o, field, value, err, errlen);
    case SRV_K_MESH: return srv_set_mesh(field, value, err, errlen);
    case SRV_K_INT:
    case SRV_K_U32: return srv_set_int(k, field, value, err, errlen);
    case SRV_K_SIZE: return srv_set_size(k, field, value, err, errlen);
    case SRV_K_MODE: return srv_set_mode(k, field, value, err, errlen);
    case SRV_K_LOG:
      return srv_log_parse_spec(value, o->log_levels, err, errlen);
    case SRV_K_BOOL: return srv_set_bool(field, value, err, errlen);
    case SRV_K_SIZE_ALL: return srv_set_size_all(field, value, err, errlen);
    case SRV_K_COLLECTIVES:
      return srv_set_collectives(field, value, err, errlen);
    case SRV_K_ROOTS: return srv_add_roots(o, value, err, errlen);
    case SRV_K_GROUP: return srv_set_group(field, value, err, errlen);
    case SRV_K_FILE: return srv_set_file(k, field, value, err, errlen);
    case SRV_K_REQUIRE: return srv_set_require(field, value, err, errlen);
    case SRV_K_IDLIST:
      return srv_idlist_parse(value, field, k->max, err, errlen);
    case SRV_K_TRISTATE: return srv_set_tristate(field, value, err, errlen);
    case SRV_K_PLUGINS: return srv_set_plugins(k, field, value, err, errlen);
    case SRV_K_ONLOSS: return srv_set_onloss(field, value, err, errlen);
    case SRV_K_HOST: return srv_set_host(field, value, err, errlen);
    case SRV_K_OPTINT:
      if (!*value) return true; /* not given: the environment may say */
      return srv_set_int(k, field, value, err, errlen);
  }
  snprintf(err, errlen, "internal: unknown key type");
  return false;
}
