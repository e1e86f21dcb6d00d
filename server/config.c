/* See config.h. One table holds every key: its section, its flag, its type
 * and range, whether SIGHUP applies it, and its default. */
#define SRV_LOG_SUB SRV_SUB_CONFIG
#include "config.h"

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
    "paradev.v1.Admin on the admin socket).\n"
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
    "  --memory-limit BYTES   per-device memory limit (0: none)\n"
    "  --allow-tf32 BOOL      cuda: float32 products may use TF32 tensor\n"
    "                         cores (default false)\n"
    "  --collectives PATH     cuda: auto (default), nccl or copy\n"
    "  --max-message-bytes N  gRPC message limit, both ways (default 64M)\n"
    "  --threads N            completion-queue threads, 1..16 (default 4)\n"
    "  --grace-ms N           shutdown grace period for calls (default 5000)\n"
    "  --drain-timeout S      seconds queued work may take after SIGTERM\n"
    "                         (default 30)\n"
    "  --log SPEC             log levels: error|warn|info|debug, optionally\n"
    "                         per subsystem: info,sched=debug (also\n"
    "                         PARADEV_LOG; subsystems: core config rpc sched\n"
    "                         health http admin)\n"
    "  --help                 this text\n"
    "  --version              print the version\n"
    "\n"
    "Every key of the file, with its default: deploy/paradevd.conf.\n"
    "Signals: SIGTERM/SIGINT drain then exit (a second one exits at once);\n"
    "SIGHUP reloads the log levels, limits and quotas.\n";

typedef enum srv_key_type {
  SRV_K_LISTEN,   /* address list */
  SRV_K_PATH,     /* absolute path of a Unix socket, or empty */
  SRV_K_HOSTPORT, /* host:port, or empty */
  SRV_K_BACKEND,
  SRV_K_MESH,
  SRV_K_INT,      /* int within [min, max] */
  SRV_K_U32,      /* uint32_t within [min, max] */
  SRV_K_SIZE,     /* uint64_t bytes with K/M/G/T, within [min, max] */
  SRV_K_MODE,     /* octal file mode */
  SRV_K_LOG,      /* log spec */
  SRV_K_BOOL,     /* true|false (also yes|no, on|off, 1|0) */
  SRV_K_SIZE_ALL, /* like SRV_K_SIZE, or "unlimited" for UINT64_MAX */
  SRV_K_COLLECTIVES, /* auto|nccl|copy, as dev_cuda_collectives */
} srv_key_type;

typedef struct srv_key {
  const char *section;
  const char *name;
  const char *flag; /* NULL: file only */
  srv_key_type type;
  size_t off;
  uint64_t min, max;
  bool reload;
} srv_key;

#define OFF(f) offsetof(srv_options, f)
#define LIM(f) (offsetof(srv_options, limits) + offsetof(srv_limits, f))

static const srv_key srv_keys[] = {
    {"daemon", "listen", "--listen", SRV_K_LISTEN, OFF(listen), 0, 0, false},
    {"daemon", "admin_socket", "--admin-socket", SRV_K_PATH, OFF(admin_socket),
     0, 0, false},
    {"daemon", "admin_socket_mode", NULL, SRV_K_MODE, OFF(admin_socket_mode), 0,
     0777, false},
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
    {"devices", "backend", "--backend", SRV_K_BACKEND, OFF(backend), 0, 0,
     false},
    {"devices", "devices", "--devices", SRV_K_INT, OFF(num_devices), 1,
     PD_MAX_DEVICES, false},
    {"devices", "mesh", "--mesh", SRV_K_MESH, OFF(mesh), 0, 0, false},
    {"devices", "memory_limit", "--memory-limit", SRV_K_SIZE, OFF(memory_limit),
     0, UINT64_MAX, false},
    {"cuda", "allow_tf32", "--allow-tf32", SRV_K_BOOL, OFF(cuda_allow_tf32), 0, 0,
     false},
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
    {"sessions", "default_lease_seconds", NULL, SRV_K_U32, LIM(default_lease_s),
     1, 315360000, true},
    {"sessions", "max_lease_seconds", NULL, SRV_K_U32, LIM(max_lease_s), 1,
     315360000, true},
    {"sessions", "default_memory_quota", NULL, SRV_K_SIZE,
     LIM(default_memory_quota), 0, UINT64_MAX, true},
    {"sessions", "max_memory_quota", NULL, SRV_K_SIZE, LIM(max_memory_quota), 0,
     UINT64_MAX, true},
    {"log", "level", "--log", SRV_K_LOG, OFF(log_levels), 0, 0, true},
};
#define SRV_NUM_KEYS (sizeof(srv_keys) / sizeof(srv_keys[0]))

static const char *const srv_sections[] = {"daemon", "devices", "cuda",
                                           "limits", "sessions", "log"};

static const char *const srv_collectives[] = {"auto", "nccl", "copy"};
#define SRV_NUM_SECTIONS (sizeof(srv_sections) / sizeof(srv_sections[0]))

static void srv_defaults(srv_options *o) {
  memset(o, 0, sizeof(*o));
  o->admin_socket_mode = 0660;
  o->num_threads = 4;
  o->grace_ms = 5000;
  o->drain_timeout_s = 30;
  o->stall_timeout_s = 60;
  snprintf(o->backend, sizeof(o->backend), "cpu");
  o->num_devices = 4;
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
      .default_lease_s = 60,
      .max_lease_s = 86400,
  };
  for (int i = 0; i < SRV_SUB_COUNT; i++) o->log_levels[i] = SRV_LOG_INFO;
  snprintf(o->config_path, sizeof(o->config_path), "%s", SRV_DEFAULT_CONFIG);
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
             dir, S_ISLNK(sb.st_mode) ? "a symbolic link"
                  : S_ISDIR(sb.st_mode) ? "a directory" : "not a directory",
             (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777),
             (unsigned)geteuid());
    return false;
  }
  return true;
}

/* The directory for default sockets: systemd's RuntimeDirectory, else the
 * user's runtime directory, else a private directory in /tmp (created by
 * srv_start; a socket straight in /tmp could be pre-created by anyone). */
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

bool srv_parse_size(const char *s, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  else if (*end == 'T' || *end == 't') shift = 40, end++;
  if (shift && (*end == 'i' || *end == 'B')) end += *end == 'i' ? 1 : 0;
  if (shift && *end == 'B') end++;
  if (*end) return false;
  if (shift && v > (ULLONG_MAX >> shift)) return false;
  *out = (uint64_t)v << shift;
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

/* Sets key `k` from text. On error writes what was expected into err. */
static bool srv_key_set(const srv_key *k, srv_options *o, const char *value,
                        char *err, size_t errlen) {
  char *field = (char *)o + k->off;
  uint64_t v = 0;
  switch (k->type) {
    case SRV_K_LISTEN:
      return srv_add_listen(o, value, err, errlen);
    case SRV_K_PATH:
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
    case SRV_K_HOSTPORT:
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
    case SRV_K_BACKEND:
      if (strcmp(value, "cpu") != 0 && strcmp(value, "cuda") != 0) {
        snprintf(err, errlen, "expected cpu or cuda");
        return false;
      }
      snprintf(field, sizeof(o->backend), "%s", value);
      return true;
    case SRV_K_MESH:
      if (!srv_valid_mesh(value) || strlen(value) >= SRV_ADDR_MAX) {
        snprintf(err, errlen,
                 "expected cuda:all or a list such as cuda:0,cuda:1 (an "
                 "ordinal may repeat)");
        return false;
      }
      snprintf(field, SRV_ADDR_MAX, "%s", value);
      return true;
    case SRV_K_INT:
    case SRV_K_U32:
      if (!srv_parse_uint(value, &v) || v < k->min || v > k->max) {
        snprintf(err, errlen, "expected an integer from %llu to %llu",
                 (unsigned long long)k->min, (unsigned long long)k->max);
        return false;
      }
      if (k->type == SRV_K_INT)
        *(int *)(void *)field = (int)v;
      else
        *(uint32_t *)(void *)field = (uint32_t)v;
      return true;
    case SRV_K_SIZE:
      if (!srv_parse_size(value, &v) || v < k->min || v > k->max) {
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
    case SRV_K_MODE: {
      char *end = NULL;
      errno = 0;
      unsigned long m = strtoul(value, &end, 8);
      if (!*value || errno || *end || m > k->max) {
        snprintf(err, errlen, "expected an octal file mode such as 0660");
        return false;
      }
      *(unsigned *)(void *)field = (unsigned)m;
      return true;
    }
    case SRV_K_LOG:
      return srv_log_parse_spec(value, o->log_levels, err, errlen);
    case SRV_K_BOOL:
      if (!srv_parse_bool(value, (bool *)(void *)field)) {
        snprintf(err, errlen, "expected true or false");
        return false;
      }
      return true;
    case SRV_K_SIZE_ALL:
      if (strcasecmp(value, "unlimited") == 0) {
        *(uint64_t *)(void *)field = UINT64_MAX;
        return true;
      }
      if (!srv_parse_size(value, &v)) {
        snprintf(err, errlen,
                 "expected a byte count such as 0, 512M or 4G, or unlimited");
        return false;
      }
      *(uint64_t *)(void *)field = v;
      return true;
    case SRV_K_COLLECTIVES:
      for (size_t i = 0; i < sizeof(srv_collectives) / sizeof(srv_collectives[0]); i++)
        if (strcmp(value, srv_collectives[i]) == 0) {
          *(int *)(void *)field = (int)i;
          return true;
        }
      snprintf(err, errlen, "expected auto, nccl or copy");
      return false;
  }
  snprintf(err, errlen, "internal: unknown key type");
  return false;
}

/* --- the file ------------------------------------------------------------- */

typedef struct srv_ini {
  FILE *f;
  const char *path;
  char *buf;
  size_t cap;
  int line;
  srv_options *o;
  srv_config_report_fn report;
  int errors;
  int key_line[SRV_NUM_KEYS]; /* where each key was set (duplicates) */
  char bad_section[64];       /* the unknown section reported last */
} srv_ini;

static void srv_ini_error(srv_ini *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void srv_ini_error(srv_ini *c, const char *fmt, ...) {
  char msg[768], line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  snprintf(line, sizeof(line), "%s:%d: %s", c->path, c->line, msg);
  c->report(true, line);
  c->errors++;
}

/* inih's reader: one physical line per call, so inih's line numbers and
 * ours agree. Leading blanks are dropped (inih would read an indented line
 * as the continuation of the previous value). Lines inih would reject are
 * reported here, with their number, and handed on as comments. */
static char *srv_ini_read(char *str, int num, void *stream) {
  srv_ini *c = stream;
  ssize_t n = getline(&c->buf, &c->cap, c->f);
  if (n < 0) return NULL;
  c->line++;
  const char *nul = memchr(c->buf, '\0', (size_t)n);
  if (nul) {
    /* A text file has none; inih would silently end the line there. */
    srv_ini_error(c,
                  "line %d contains a NUL byte (byte %zu of the line); "
                  "expected a text file",
                  c->line, (size_t)(nul - c->buf) + 1);
    snprintf(str, (size_t)num, ";\n");
    return str;
  }
  char *p = c->buf;
  /* A UTF-8 byte order mark, as some editors write: skipped. inih would
   * skip it too (ini_allow_bom), but this reader checks the line first. */
  if (c->line == 1 && n >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;
  while (*p == ' ' || *p == '\t') p++;
  size_t len = strlen(p);
  while (len && (p[len - 1] == '\n' || p[len - 1] == '\r')) p[--len] = '\0';
  const char *why = NULL;
  if (len + 3 > (size_t)num) {
    why = "line too long";
  } else if (len && p[0] != ';' && p[0] != '#') {
    if (p[0] == '[') {
      if (!strchr(p, ']')) why = "a section header without ']'";
    } else if (!strchr(p, '=') && !strchr(p, ':')) {
      why = "not 'key = value'";
    } else if (p[0] == '=' || p[0] == ':') {
      why = "a value without a key";
    }
  }
  if (why) {
    if (len + 3 > (size_t)num)
      srv_ini_error(c, "%s (%zu bytes; at most %d)", why, len, num - 3);
    else
      srv_ini_error(c,
                    "syntax error: %s (expected '[section]', 'key = value' "
                    "or a comment starting with ; or #)",
                    why);
    snprintf(str, (size_t)num, ";\n");
    return str;
  }
  snprintf(str, (size_t)num, "%s\n", p);
  return str;
}

static int srv_ini_handler(void *user, const char *section, const char *name,
                           const char *value) {
  srv_ini *c = user;
  if (!name) return 1; /* a section start, when inih reports those */
  char cv[128];
  srv_log_clean(value, cv, sizeof(cv));
  if (!section || !*section) {
    srv_ini_error(c,
                  "key '%s' before any section (put it under one of [daemon], "
                  "[devices], [cuda], [limits], [sessions], [log])",
                  name);
    return 1;
  }
  bool known_section = false;
  for (size_t i = 0; i < SRV_NUM_SECTIONS; i++)
    known_section |= strcmp(section, srv_sections[i]) == 0;
  if (!known_section) {
    if (strcmp(c->bad_section, section) != 0) {
      snprintf(c->bad_section, sizeof(c->bad_section), "%s", section);
      srv_ini_error(c,
                    "unknown section [%s] (key '%s'); expected [daemon], "
                    "[devices], [cuda], [limits], [sessions] or [log]",
                    section, name);
    }
    return 1;
  }
  const srv_key *k = NULL;
  size_t ki = 0;
  for (size_t i = 0; i < SRV_NUM_KEYS; i++)
    if (strcmp(srv_keys[i].section, section) == 0 &&
        strcmp(srv_keys[i].name, name) == 0) {
      k = &srv_keys[i];
      ki = i;
    }
  if (!k) {
    char keys[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < SRV_NUM_KEYS && used < sizeof(keys); i++)
      if (strcmp(srv_keys[i].section, section) == 0)
        used += (size_t)snprintf(keys + used, sizeof(keys) - used, "%s%s",
                                 used ? ", " : "", srv_keys[i].name);
    const char *elsewhere = NULL;
    for (size_t i = 0; i < SRV_NUM_KEYS; i++)
      if (strcmp(srv_keys[i].name, name) == 0) elsewhere = srv_keys[i].section;
    if (elsewhere)
      srv_ini_error(c, "[%s] has no key '%s'; it belongs in [%s]", section,
                    name, elsewhere);
    else
      srv_ini_error(c, "unknown key '%s' in [%s] (expected one of: %s)", name,
                    section, keys);
    return 1;
  }
  if (c->key_line[ki] && k->type != SRV_K_LISTEN) {
    srv_ini_error(c, "[%s] %s is set twice (first on line %d)", section, name,
                  c->key_line[ki]);
    return 1;
  }
  c->key_line[ki] = c->line;
  char err[512];
  if (!srv_key_set(k, c->o, value, err, sizeof(err)))
    srv_ini_error(c, "[%s] %s = '%s': %s", section, name, cv, err);
  return 1;
}

/* Reads the file into `o`. Returns the number of errors (reported). */
static int srv_config_read_file(srv_options *o, srv_config_report_fn report) {
  char msg[SRV_ADDR_MAX + 128];
  FILE *f = fopen(o->config_path, "r");
  if (!f) {
    if (errno == ENOENT && !o->config_explicit) return 0; /* defaults */
    snprintf(msg, sizeof(msg), "%s: cannot read the configuration file: %s",
             o->config_path, strerror(errno));
    report(true, msg);
    return 1;
  }
  srv_ini c;
  memset(&c, 0, sizeof(c));
  c.f = f;
  c.path = o->config_path;
  c.o = o;
  c.report = report;
  int rc = ini_parse_stream(srv_ini_read, &c, srv_ini_handler, &c);
  if (ferror(f)) {
    snprintf(msg, sizeof(msg), "%s: read error: %s", o->config_path,
             strerror(errno));
    report(true, msg);
    c.errors++;
  } else if (rc > 0 && c.errors == 0) {
    c.line = rc;
    srv_ini_error(&c, "syntax error");
  } else if (rc < 0) {
    snprintf(msg, sizeof(msg), "%s: cannot parse (out of memory)",
             o->config_path);
    report(true, msg);
    c.errors++;
  }
  free(c.buf);
  fclose(f);
  o->config_loaded = true;
  return c.errors;
}

/* --- the command line ------------------------------------------------------ */

static void srv_report_flag(srv_config_report_fn report, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void srv_report_flag(srv_config_report_fn report, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  report(true, msg);
}

/* Splits "--name=value"; *val is NULL when there is no '='. */
static const char *srv_flag_name(const char *a, char *buf, size_t len,
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

static int srv_apply_flags(int argc, char **argv, srv_options *o,
                           srv_config_report_fn report) {
  int errors = 0;
  bool listen_from_flags = false;
  for (int i = 1; i < argc; i++) {
    char name[64];
    const char *val = NULL;
    const char *a = srv_flag_name(argv[i], name, sizeof(name), &val);
    if (strcmp(a, "--check-config") == 0) continue;
    bool is_config = strcmp(a, "--config") == 0;
    const srv_key *k = NULL;
    for (size_t j = 0; j < SRV_NUM_KEYS && !is_config; j++)
      if (srv_keys[j].flag && strcmp(srv_keys[j].flag, a) == 0) k = &srv_keys[j];
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
    char err[512], cv[128];
    if (!srv_key_set(k, o, val, err, sizeof(err))) {
      srv_report_flag(report, "%s '%s': %s", a, srv_log_clean(val, cv, sizeof cv),
                      err);
      errors++;
    }
  }
  return errors;
}

/* Checks that hold between keys. */
static int srv_check_options(const srv_options *o, srv_config_report_fn report) {
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
  if (errors == 0) errors += srv_check_options(&o, report);
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
      printf("paradevd: no file at %s; the built-in defaults and flags are "
             "OK\n",
             o.config_path);
    char devs[512];
    srv_config_describe_devices(&o, devs, sizeof(devs));
    printf("paradevd: devices: %s\n", devs);
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
  for (size_t i = 0; i < SRV_NUM_KEYS; i++) {
    const srv_key *k = &srv_keys[i];
    if (k->reload) continue;
    size_t size = 0;
    switch (k->type) {
      case SRV_K_LISTEN: size = sizeof(old->listen); break;
      case SRV_K_PATH: case SRV_K_HOSTPORT: case SRV_K_MESH:
        size = SRV_ADDR_MAX; break;
      case SRV_K_BACKEND: size = sizeof(old->backend); break;
      case SRV_K_INT: size = sizeof(int); break;
      case SRV_K_U32: size = sizeof(uint32_t); break;
      case SRV_K_SIZE: size = sizeof(uint64_t); break;
      case SRV_K_MODE: size = sizeof(unsigned); break;
      case SRV_K_LOG: size = 0; break;
      case SRV_K_BOOL: size = sizeof(bool); break;
      case SRV_K_SIZE_ALL: size = sizeof(uint64_t); break;
      case SRV_K_COLLECTIVES: size = sizeof(int); break;
    }
    bool differ = memcmp((const char *)old + k->off, (const char *)now + k->off,
                         size) != 0;
    if (k->type == SRV_K_LISTEN) differ |= old->num_listen != now->num_listen;
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
  char limit[32] = "none", pool[32] = "unlimited";
  if (o->memory_limit)
    snprintf(limit, sizeof(limit), "%llu bytes",
             (unsigned long long)o->memory_limit);
  if (o->cuda_pool_release_threshold != UINT64_MAX)
    snprintf(pool, sizeof(pool), "%llu bytes",
             (unsigned long long)o->cuda_pool_release_threshold);
  int c = o->cuda_collectives;
  const char *coll =
      c >= 0 && c < (int)(sizeof(srv_collectives) / sizeof(srv_collectives[0]))
          ? srv_collectives[c]
          : "?";
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
