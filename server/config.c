/* See config.h. Loading a configuration: the defaults, then the file
 * (config_file.c), then the flags (config_cli.c), then the checks that hold
 * between keys; and what a reload may not change. The keys themselves are
 * config_keys.c's. */
#define SRV_LOG_SUB SRV_SUB_CONFIG
#include "config_int.h"

#include <arpa/inet.h>
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

#include "jobs.h"
#include "device.h"
#include "paradev/types.h"
#include "tls.h"
#include "tokens.h"

/* The directory for default sockets: systemd's RuntimeDirectory, else the
 * user's runtime directory, else a private directory in /tmp (created by
 * srv_rpc_start; a socket straight in /tmp could be pre-created by anyone). */
static void srv_default_paths(srv_options *o) {
  const char *rd = getenv("RUNTIME_DIRECTORY"); /* may list several: a:b */
  char dir[SRV_ADDR_MAX] = "";
  const char *sock = "paradevd.sock", *admin = "paradevd-admin.sock";
  if (rd && *rd) {
    snprintf(dir, sizeof(dir), "%.*s", (int)strcspn(rd, ":"), rd);
    admin = "admin.sock";
  } else if ((rd = getenv("XDG_RUNTIME_DIR")) && *rd) {
    snprintf(dir, sizeof(dir), "%s", rd);
  }
  char unix_addr[2 * SRV_ADDR_MAX], admin_path[2 * SRV_ADDR_MAX];
  if (dir[0]) {
    snprintf(unix_addr, sizeof(unix_addr), "unix:%s/%s", dir, sock);
    snprintf(admin_path, sizeof(admin_path), "%s/%s", dir, admin);
  } else {
    srv_tmp_socket_dir(dir, sizeof(dir));
    snprintf(unix_addr, sizeof(unix_addr), "unix:%s/%s", dir, sock);
    snprintf(admin_path, sizeof(admin_path), "%s/%s", dir, admin);
  }
  if (o->num_listen == 0) {
    snprintf(o->listen[0], SRV_ADDR_MAX, "127.0.0.1:7478");
    snprintf(o->listen[1], SRV_ADDR_MAX, "%.*s", SRV_ADDR_MAX - 1, unix_addr);
    o->num_listen = 2;
  }
  if (!o->admin_socket_set)
    snprintf(o->admin_socket, SRV_ADDR_MAX, "%.*s", SRV_ADDR_MAX - 1,
             admin_path);
}

/* Where a root would expose the system: "/" itself, or a root that holds
 * or lies in /etc, /proc, /sys, /dev, /boot or /root. NULL when fine. */
static const char *srv_root_danger(const char *root) {
  static const char *const sys[] = {"/etc", "/proc", "/sys",
                                    "/dev", "/boot", "/root"};
  char real[PATH_MAX];
  const char *r = realpath(root, real) ? real : root;
  if (strcmp(r, "/") == 0) return "/";
  for (size_t i = 0; i < sizeof(sys) / sizeof(sys[0]); i++) {
    size_t n = strlen(sys[i]);
    if (strncmp(r, sys[i], n) == 0 && (r[n] == '\0' || r[n] == '/'))
      return sys[i];
  }
  return NULL;
}

/* The [storage] roots: a loud warning for a root that exposes the system
 * (the daemon then reads and writes there as its user; allowed, as a
 * deliberate choice, but never silently), and with `check` (--check-config)
 * an error for a local root that is not an existing directory, which a
 * real start refuses (stg_roots_create). */
static int srv_check_roots(const srv_options *o, bool check,
                           srv_config_report_fn report) {
  int errors = 0;
  char msg[1536]; /* a root is at most 1023 bytes (config_keys.c) */
  for (int i = 0; i < o->num_storage_roots; i++) {
    const char *r = o->storage_roots[i];
    if (r[0] != '/') continue; /* a URL prefix */
    struct stat sb;
    int src = stat(r, &sb), e = errno;
    if (check && (src != 0 || !S_ISDIR(sb.st_mode))) {
      snprintf(msg, sizeof(msg),
               "[storage] roots: '%.1023s' is not an existing directory (%s); "
               "a start refuses it",
               r, src != 0 ? strerror(e) : "not a directory");
      report(true, msg);
      errors++;
      continue;
    }
    const char *d = srv_root_danger(r);
    if (d) {
      snprintf(msg, sizeof(msg),
               "[storage] roots: '%.1023s' %s %s: every client may read "
               "and write files there as the daemon's user; give a directory "
               "of checkpoints instead",
               r, strcmp(d, "/") == 0 ? "is the root file system" : "exposes",
               strcmp(d, "/") == 0 ? "(/)" : d);
      report(false, msg);
    }
  }
  return errors;
}

/* True when the TCP address `a` (host:port, [v6]:port) names a loopback
 * address: localhost, 127.0.0.0/8, ::1 or ::ffff:127.x.y.z. Another name
 * counts as reachable from the network (it may resolve to anything). */
static bool srv_addr_loopback(const char *a) {
  char host[SRV_ADDR_MAX];
  const char *colon = strrchr(a, ':');
  size_t n = colon ? (size_t)(colon - a) : strlen(a);
  if (n >= sizeof(host)) return false;
  memcpy(host, a, n);
  host[n] = '\0';
  char *h = host;
  if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
    h[n - 1] = '\0';
    h++;
  }
  if (strcasecmp(h, "localhost") == 0) return true;
  struct in_addr v4;
  struct in6_addr v6;
  if (inet_pton(AF_INET, h, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, h, &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

int srv_config_insecure_tcp(const srv_options *o, char *first, size_t len) {
  int n = 0;
  if (o->tls_cert_file[0]) return 0;
  for (int i = 0; i < o->num_listen; i++) {
    const char *a = o->listen[i];
    if (strncmp(a, "unix:", 5) == 0 || srv_addr_loopback(a)) continue;
    if (n++ == 0 && first) snprintf(first, len, "%s", a);
  }
  return n;
}

void srv_config_insecure_warning(const srv_options *o, char *buf, size_t len) {
  char first[SRV_ADDR_MAX];
  int n = srv_config_insecure_tcp(o, first, sizeof(first));
  if (n == 0) {
    snprintf(buf, len, "%s", "");
    return;
  }
  snprintf(buf, len,
           "insecure TCP: %s%s serves plaintext on a non-loopback address "
           "([tls] allow_insecure_tcp = true): calls, session tokens and "
           "tensors cross the network unencrypted and unauthenticated; set "
           "[tls] cert_file and key_file",
           first, n > 1 ? " (and others)" : "");
}

/* The [tls] keys: what needs what, and a non-loopback TCP listener without
 * TLS, which needs allow_insecure_tcp (then a warning). With `check`
 * (--check-config) also the files themselves, as a start reads them. */
static int srv_check_tls(const srv_options *o, bool check,
                         srv_config_report_fn report) {
  int errors = 0;
  char msg[3 * SRV_FILE_MAX];
  const char *where = o->config_loaded ? o->config_path : "configuration";
  bool cert = o->tls_cert_file[0], key = o->tls_key_file[0];
  if (cert != key) {
    snprintf(msg, sizeof(msg),
             "%s: [tls] %s is set without %s; TLS needs both the "
             "certificate (cert_file) and its private key (key_file)",
             where, cert ? "cert_file" : "key_file",
             cert ? "key_file" : "cert_file");
    report(true, msg);
    errors++;
  }
  if (!cert && (o->tls_client_ca_file[0] || o->tls_require_client_cert)) {
    snprintf(
        msg, sizeof(msg),
        "%s: [tls] %s needs TLS: set cert_file and key_file too", where,
        o->tls_client_ca_file[0] ? "client_ca_file" : "require_client_cert");
    report(true, msg);
    errors++;
  }
  if (o->tls_require_client_cert && !o->tls_client_ca_file[0]) {
    snprintf(msg, sizeof(msg),
             "%s: [tls] require_client_cert = true needs client_ca_file: "
             "the CA bundle that signs the clients' certificates",
             where);
    report(true, msg);
    errors++;
  }
  char first[SRV_ADDR_MAX];
  if (srv_config_insecure_tcp(o, first, sizeof(first)) > 0) {
    if (!o->tls_allow_insecure_tcp) {
      snprintf(msg, sizeof(msg),
               "%s: [daemon] listen %s is not a loopback address and [tls] "
               "is not set: anyone who reaches it could use the daemon in "
               "plaintext. Set [tls] cert_file and key_file (see "
               "deploy/README.md, TLS), or [tls] allow_insecure_tcp = true "
               "to serve plaintext anyway (for a trusted network only)",
               where, first);
      report(true, msg);
      errors++;
    } else {
      srv_config_insecure_warning(o, msg, sizeof(msg));
      report(false, msg);
    }
  }
  if (check && errors == 0 && cert) {
    char why[2 * SRV_FILE_MAX + 256];
    if (!srv_tls_check_files(o, NULL, 0, why, sizeof(why))) {
      snprintf(msg, sizeof(msg), "%.255s: [tls] %s; a start refuses it", where,
               why);
      report(true, msg);
      errors++;
    }
  }
  return errors;
}

/* A warning (never an error: the operator may add a source by a reload)
 * when a TCP listener requires identities ([auth] require_identity) that
 * no configured source can give: no client certificates ([tls]
 * client_ca_file) and no bearer tokens ([auth] tokens_file), so every
 * caller that must identify there is refused. Unix socket peers always
 * identify (uid:N). */
static void srv_check_identity_sources(const srv_options *o,
                                       srv_config_report_fn report) {
  if (o->auth_require == SRV_REQUIRE_NONE || o->auth_tokens_file[0] ||
      (o->tls_cert_file[0] && o->tls_client_ca_file[0]))
    return;
  for (int i = 0; i < o->num_listen; i++) {
    const char *a = o->listen[i];
    bool loopback = srv_addr_loopback(a);
    if (strncmp(a, "unix:", 5) == 0 ||
        (o->auth_require == SRV_REQUIRE_REMOTE && loopback))
      continue;
    char msg[3 * SRV_FILE_MAX];
    snprintf(msg, sizeof(msg),
             "%s: [daemon] listen %s requires an identity of every %s "
             "caller ([auth] require_identity = %s) but none can give one: "
             "no [tls] client_ca_file (client certificates) and no [auth] "
             "tokens_file (bearer tokens), so each such call is refused "
             "UNAUTHENTICATED. Set one of them (deploy/README.md, Tenants "
             "and tokens), or let those callers use the Unix socket",
             o->config_loaded ? o->config_path : "configuration", a,
             loopback || o->auth_require != SRV_REQUIRE_REMOTE ? "TCP"
                                                               : "off-loopback",
             o->auth_require == SRV_REQUIRE_REMOTE ? "remote"
             : o->auth_require == SRV_REQUIRE_TCP  ? "tcp"
                                                   : "all");
    report(false, msg);
    return; /* one line names the first; the cause is the same */
  }
}

/* --check-config: the [auth] files as a start reads them (the tokens file
 * parsed, both files' owner and mode, secfile.h), so a configuration the
 * start would refuse is not OK. */
static int srv_check_auth_files(const srv_options *o,
                                srv_config_report_fn report) {
  int errors = 0;
  char msg[sizeof(((dev_status *)0)->msg) + 2 * SRV_FILE_MAX];
  const char *where = o->config_loaded ? o->config_path : "configuration";
  dev_status st = DEV_STATUS_INIT;
  if (o->auth_tokens_file[0]) {
    srv_tokens *t = NULL;
    if (srv_tokens_open(o->auth_tokens_file, &t, &st) != PD_OK) {
      snprintf(msg, sizeof(msg),
               "%s: [auth] tokens_file: %s; a start "
               "refuses it",
               where, st.msg);
      report(true, msg);
      errors++;
    }
    srv_tokens_free(t);
  }
  if (o->job_tokens_file[0]) {
    srv_jobs *j = srv_jobs_new(o->max_job_tokens);
    int loaded = 0, dropped = 0;
    st = (dev_status)DEV_STATUS_INIT;
    if (!j || srv_jobs_open_file(j, o->job_tokens_file, &loaded, &dropped,
                                 &st) != PD_OK) {
      snprintf(msg, sizeof(msg),
               "%s: [auth] job_tokens_file: %s; a start "
               "refuses it",
               where, j ? st.msg : "out of host memory");
      report(true, msg);
      errors++;
    }
    srv_jobs_free(j);
  }
  return errors;
}

/* Checks that hold between keys. */
static int srv_check_options(const srv_options *o,
                             srv_config_report_fn report) {
  int errors = 0;
  char msg[768];
  const char *where = o->config_loaded ? o->config_path : "configuration";
  if (o->limits.default_lease_s > o->limits.max_lease_s) {
    snprintf(msg, sizeof(msg),
             "%s: [sessions] default_lease_seconds (%u) is over "
             "max_lease_seconds (%u); expected default <= max",
             where, o->limits.default_lease_s, o->limits.max_lease_s);
    report(true, msg);
    errors++;
  }
  if (o->limits.max_memory_quota &&
      o->limits.default_memory_quota > o->limits.max_memory_quota) {
    snprintf(msg, sizeof(msg),
             "%s: [sessions] default_memory_quota (%llu) is over "
             "max_memory_quota (%llu); expected default <= max",
             where, (unsigned long long)o->limits.default_memory_quota,
             (unsigned long long)o->limits.max_memory_quota);
    report(true, msg);
    errors++;
  }
  for (int i = 0; i < o->num_listen; i++) {
    if (o->admin_socket[0] && strncmp(o->listen[i], "unix:", 5) == 0 &&
        strcmp(o->listen[i] + 5, o->admin_socket) == 0) {
      snprintf(msg, sizeof(msg),
               "%s: [daemon] admin_socket %s is also a listen address; the "
               "Admin service needs a socket of its own",
               where, o->admin_socket);
      report(true, msg);
      errors++;
    }
    for (int j = 0; j < i; j++)
      if (strcmp(o->listen[i], o->listen[j]) == 0 &&
          strcmp(o->listen[i] + strlen(o->listen[i]) - 2, ":0") != 0) {
        snprintf(msg, sizeof(msg), "%s: [daemon] listen: %s is listed twice",
                 where, o->listen[i]);
        report(true, msg);
        errors++;
      }
  }
  if (strcmp(o->backend, "cpu") == 0 && o->mesh[0]) {
    snprintf(msg, sizeof(msg),
             "%s: [devices] mesh '%s' is for the cuda backend; the cpu "
             "backend takes devices = N",
             where, o->mesh);
    report(true, msg);
    errors++;
  }
  if (strcmp(o->backend, "cpu") == 0 &&
      (o->cuda_allow_tf32 || o->cuda_collectives != 0 ||
       o->cuda_collective_timeout_ms != 300000 ||
       o->cuda_pool_release_threshold != UINT64_MAX)) {
    snprintf(msg, sizeof(msg),
             "%s: [cuda] settings other than the defaults apply to the cuda "
             "backend only; the cpu backend ignores them",
             where);
    report(false, msg);
  }
  return errors;
}

srv_config_plugin_check_fn srv_config_plugin_check;

static const char *srv_getenv(const char *name) { return getenv(name); }

srv_config_action srv_config_load(int argc, char **argv, srv_options *out,
                                  bool *check, srv_config_report_fn report) {
  srv_options o;
  srv_defaults(&o);
  *check = false;
  /* First pass: what changes how the rest is read. */
  for (int i = 1; i < argc; i++) {
    char name[64];
    const char *val = NULL;
    const char *a = srv_flag_name(argv[i], name, sizeof(name), &val);
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(srv_usage, stdout);
      return SRV_CONFIG_EXIT_OK;
    }
    if (strcmp(a, "--version") == 0) {
      printf("paradevd %s\n", SRV_VERSION);
      return SRV_CONFIG_EXIT_OK;
    }
    if (strcmp(a, "--check-config") == 0) *check = true;
    if (strcmp(a, "--config") == 0) {
      if (!val && i + 1 < argc) val = argv[++i];
      if (!val) continue; /* reported by srv_apply_flags */
      if (!*val || strlen(val) >= sizeof(o.config_path)) {
        srv_report_flag(report, "--config '%s': expected a file path", val);
        return SRV_CONFIG_EXIT_BAD;
      }
      snprintf(o.config_path, sizeof(o.config_path), "%s", val);
      o.config_explicit = true;
    } else if (!val && i + 1 < argc && strncmp(a, "--", 2) == 0 &&
               strcmp(a, "--check-config") != 0) {
      i++; /* skip a flag's value: it could be "--config" */
    }
  }
  int errors = srv_config_read_file(&o, report);
  if (o.mesh_world_size > 0)
    snprintf(o.mesh_src[0], sizeof o.mesh_src[0], "[mesh] world_size");
  if (o.mesh_rank >= 0)
    snprintf(o.mesh_src[1], sizeof o.mesh_src[1], "[mesh] rank");
  if (o.mesh_coordinator[0])
    snprintf(o.mesh_src[2], sizeof o.mesh_src[2], "[mesh] coordinator");
  const char *env = getenv("PARADEV_LOG");
  if (env && *env) {
    char err[512], msg[700];
    if (!srv_log_parse_spec(env, o.log_levels, err, sizeof(err))) {
      snprintf(msg, sizeof(msg), "PARADEV_LOG='%.64s': %s (ignored)", env, err);
      report(false, msg);
    }
  }
  errors += srv_apply_flags(argc, argv, &o, report);
  srv_default_paths(&o);
  errors += srv_mesh_options_from_env(&o, srv_getenv, report);
  if (errors == 0) errors += srv_check_options(&o, report);
  if (errors == 0) errors += srv_check_mesh(&o, *check, report);
  if (errors == 0) errors += srv_check_roots(&o, *check, report);
  if (errors == 0) errors += srv_check_tenants(&o, report);
  if (errors == 0) errors += srv_check_tls(&o, *check, report);
  if (errors == 0) srv_check_identity_sources(&o, report);
  if (errors == 0 && *check) errors += srv_check_auth_files(&o, report);
  if (errors == 0 && *check && srv_config_plugin_check)
    errors += srv_config_plugin_check(&o, report);
  /* Chunks leave room for the rest of their message under the limit. */
  o.limits.max_chunk_bytes = o.limits.max_message_bytes - 1024;
  o.limits.default_chunk_bytes = 1u << 20;
  if (o.limits.default_chunk_bytes > o.limits.max_chunk_bytes)
    o.limits.default_chunk_bytes = o.limits.max_chunk_bytes;
  if (*check) {
    if (errors) {
      fprintf(stderr, "paradevd: configuration has %d error%s\n", errors,
              errors == 1 ? "" : "s");
      return SRV_CONFIG_EXIT_BAD;
    }
    if (o.config_loaded)
      printf("paradevd: %s: configuration OK\n", o.config_path);
    else
      printf(
          "paradevd: no file at %s; the built-in defaults and flags are "
          "OK\n",
          o.config_path);
    char devs[512];
    srv_config_describe_devices(&o, devs, sizeof(devs));
    printf("paradevd: devices: %s\n", devs);
    char fns[1024];
    srv_config_describe_functions(&o, fns, sizeof(fns));
    printf("paradevd: functions: %s\n", fns);
    char mesh[1024];
    srv_config_describe_mesh(&o, mesh, sizeof mesh);
    printf("paradevd: mesh: %s\n", mesh);
    char about[512], why[2 * SRV_FILE_MAX + 256];
    if (o.tls_cert_file[0] &&
        srv_tls_check_files(&o, about, sizeof(about), why, sizeof(why)))
      printf("paradevd: tls: %s; client certificates %s\n", about,
             o.tls_require_client_cert ? "required"
             : o.tls_client_ca_file[0] ? "verified when given"
                                       : "not asked for");
    return SRV_CONFIG_EXIT_OK;
  }
  if (errors) return SRV_CONFIG_EXIT_BAD;
  *out = o;
  return SRV_CONFIG_RUN;
}

int srv_config_restart_keys(const srv_options *old, const srv_options *now,
                            srv_config_report_fn report) {
  int n = 0;
  char msg[256];
  for (size_t i = 0; i < srv_num_keys; i++) {
    const srv_key *k = &srv_keys[i];
    if (k->reload) continue;
    size_t size = 0;
    switch (k->type) {
      case SRV_K_LISTEN: size = sizeof(old->listen); break;
      case SRV_K_PATH:
      case SRV_K_HOSTPORT:
      case SRV_K_MESH: size = SRV_ADDR_MAX; break;
      case SRV_K_BACKEND: size = sizeof(old->backend); break;
      case SRV_K_INT: size = sizeof(int); break;
      case SRV_K_U32: size = sizeof(uint32_t); break;
      case SRV_K_SIZE: size = sizeof(uint64_t); break;
      case SRV_K_MODE: size = sizeof(unsigned); break;
      case SRV_K_LOG: size = 0; break;
      case SRV_K_BOOL: size = sizeof(bool); break;
      case SRV_K_SIZE_ALL: size = sizeof(uint64_t); break;
      case SRV_K_COLLECTIVES: size = sizeof(int); break;
      case SRV_K_ROOTS: size = sizeof(old->storage_roots); break;
      case SRV_K_GROUP: size = SRV_ADDR_MAX; break;
      case SRV_K_FILE: size = (size_t)k->max; break; /* the field's size */
      case SRV_K_REQUIRE:
      case SRV_K_IDLIST: size = 0; break; /* reloadable */
      case SRV_K_TRISTATE: size = sizeof(int); break;
      case SRV_K_PLUGINS: size = (size_t)k->max; break;
      case SRV_K_ONLOSS:
      case SRV_K_OPTINT: size = sizeof(int); break;
      case SRV_K_HOST: size = SRV_ADDR_MAX; break;
    }
    bool differ = memcmp((const char *)old + k->off, (const char *)now + k->off,
                         size) != 0;
    if (k->type == SRV_K_LISTEN) differ |= old->num_listen != now->num_listen;
    if (k->type == SRV_K_ROOTS)
      differ |= old->num_storage_roots != now->num_storage_roots;
    if (differ) {
      snprintf(msg, sizeof(msg),
               "[%s] %s changed: it takes effect when paradevd restarts",
               k->section, k->name);
      report(false, msg);
      n++;
    }
  }
  return n;
}

void srv_config_describe_devices(const srv_options *o, char *buf, size_t len) {
  char limit[64] = "default", pool[32] = "unlimited";
  if (o->memory_limit)
    snprintf(limit, sizeof(limit), "%llu bytes",
             (unsigned long long)o->memory_limit);
  if (o->cuda_pool_release_threshold != UINT64_MAX)
    snprintf(pool, sizeof(pool), "%llu bytes",
             (unsigned long long)o->cuda_pool_release_threshold);
  int c = o->cuda_collectives;
  const char *coll =
      c >= 0 && c < (int)(srv_num_collectives) ? srv_collectives[c] : "?";
  if (strcmp(o->backend, "cuda") == 0)
    snprintf(buf, len,
             "backend cuda, mesh %s, memory_limit %s; [cuda] allow_tf32 %s, "
             "collectives %s, collective_timeout_ms %d, "
             "pool_release_threshold %s",
             o->mesh[0] ? o->mesh : "cuda:all", limit,
             o->cuda_allow_tf32 ? "true" : "false", coll,
             o->cuda_collective_timeout_ms, pool);
  else
    snprintf(buf, len, "backend %s, %d devices, memory_limit %s", o->backend,
             o->num_devices, limit);
}

_Static_assert(SRV_FN_PASSES == DEV_PASS_COUNT, "SRV_FN_PASSES");

void srv_config_describe_functions(const srv_options *o, char *buf,
                                   size_t len) {
  static const char *const tri[] = {"default (on)", "off", "on"};
  size_t n = (size_t)snprintf(buf, len, "passes");
  bool first = true;
  /* The passes' keys, in dev_fn_pass order (config_keys.c): their names are
   * the passes' (no engine call: fuzz_config links no engine). */
  for (size_t i = 0; i < srv_num_keys && n < len; i++) {
    const srv_key *k = &srv_keys[i];
    if (k->type != SRV_K_TRISTATE) continue;
    int v = *(const int *)(const void *)((const char *)o + k->off);
    n += (size_t)snprintf(buf + n, len - n, "%s %s %s", first ? "" : ",",
                          k->name, v >= 0 && v <= 2 ? tri[v] : "?");
    first = false;
  }
  if (n < len)
    snprintf(buf + n, len - n,
             "; max_instantiations %d; constant folding up to %llu bytes, "
             "%d ms; instantiation up to %d ms; optimizer plugins %s",
             o->fn_max_instantiations, (unsigned long long)o->fn_fold_max_bytes,
             o->fn_fold_max_ms, o->fn_inst_max_ms,
             o->fn_plugins[0] ? o->fn_plugins : "none");
}

int srv_config_plugin_paths(const srv_options *o, char *buf, size_t len,
                            const char **paths) {
  snprintf(buf, len, "%s", o->fn_plugins);
  int n = 0;
  for (char *p = buf; *p && n < SRV_MAX_PLUGINS;) {
    char *e = strchr(p, ',');
    if (e) *e = '\0';
    paths[n++] = p;
    if (!e) break;
    p = e + 1;
  }
  return n;
}
