/* paradevd's configuration: built-in defaults, then the INI file
 * (/etc/paradev/paradevd.conf or --config FILE, parsed with inih), then
 * PARADEV_LOG for the log levels, then the command line. Every key, its
 * default and its flag are in one table (config.c); deploy/paradevd.conf
 * documents them for operators.
 *
 * Errors name the file, the line, the key, the value and what was expected:
 *   /etc/paradev/paradevd.conf:12: [limits] max_sessions = 'lots': expected
 *   an integer from 1 to 1000000
 * srv_config_load reports each through a callback and fails after reading
 * everything, so one run shows every mistake.
 */
#ifndef PARADEV_SERVER_CONFIG_H
#define PARADEV_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "log.h"
#include "paradev/types.h" /* PD_MAX_DEVICES */

#define SRV_VERSION "0.1.0"
#define SRV_MAX_LISTEN 16
#define SRV_MAX_THREADS 16
#define SRV_ADDR_MAX 256
#define SRV_MAX_ROOTS 16  /* [storage] roots and --storage-root */
#define SRV_ROOT_MAX 1024 /* bytes of one root, NUL included */
#define SRV_FILE_MAX 1024 /* bytes of a [tls] file's path, NUL included */
/* server/CMakeLists.txt sets it to the installed configuration
 * (CMAKE_INSTALL_FULL_SYSCONFDIR/paradev/paradevd.conf). */
#ifndef SRV_DEFAULT_CONFIG
#define SRV_DEFAULT_CONFIG "/etc/paradev/paradevd.conf"
#endif

/* What a client controls is bounded by these (reported by GetServerInfo). */
typedef struct srv_limits {
  uint64_t max_message_bytes; /* gRPC receive and send limit */
  uint64_t max_tensor_bytes;  /* host bytes of one upload */
  int max_ops_per_request;
  int max_handles_per_session;
  int max_sessions;
  int max_string_bytes;
  int max_ids_per_request;
  int max_queued_ops; /* per session */
  uint32_t default_lease_s;
  uint32_t max_lease_s;
  /* bytes; 0: default_memory_quota_percent of the mesh's memory (the sum of
   * the devices' limits); UINT64_MAX ("unlimited"): none */
  uint64_t default_memory_quota;
  int default_memory_quota_percent; /* 1..100 */
  uint64_t max_memory_quota;        /* bytes, 0: no cap */
  uint64_t max_chunk_bytes;         /* Upload chunk / Download chunk_bytes */
  uint64_t default_chunk_bytes;     /* Download when the client says 0 */
  uint32_t max_queued_device_ms;    /* per session, estimated; 0: no bound */
} srv_limits;

/* [auth] require_identity: which callers must present an identity (a
 * client certificate, a bearer token or a Unix peer's uid, auth.h). */
typedef enum srv_require {
  SRV_REQUIRE_NONE = 0,   /* nobody: identities are used when presented */
  SRV_REQUIRE_REMOTE = 1, /* TCP peers not on a loopback address (default) */
  SRV_REQUIRE_TCP = 2,    /* every TCP peer, loopback included */
  SRV_REQUIRE_ALL = 3,    /* TCP and Unix socket peers alike */
} srv_require;

#define SRV_MAX_TENANTS 32
#define SRV_TENANT_NAME_MAX 64    /* bytes of a tenant's name: [A-Za-z0-9._-] */
#define SRV_AUTH_LIST_MAX 2048    /* bytes of an identities or roots list */
#define SRV_IDENTITY_NAME_MAX 512 /* bytes of one identity (auth.h) */
#define SRV_FN_PASSES 7           /* DEV_PASS_COUNT (checked in config.c) */
#define SRV_MAX_PLUGINS 16        /* [functions] optimizer_plugins */

/* One [tenant NAME] section (issue #14): who belongs to it and what all its
 * sessions together may hold. */
typedef struct srv_tenant_conf {
  char name[SRV_TENANT_NAME_MAX + 1];
  int line;                              /* of its first section header */
  unsigned set;                          /* keys set (duplicates) */
  char identities[SRV_AUTH_LIST_MAX];    /* "a,b,c": certificate SAN/CN,
                                            token names, "uid:N" */
  uint64_t memory_quota;                 /* bytes over its sessions; 0: none */
  int max_sessions;                      /* 0: none */
  uint32_t max_lease_s;                  /* 0: [sessions] max_lease_seconds */
  int priority;                          /* band, -8..8 */
  uint32_t weight;                       /* 1..10000 */
  bool roots_set;                        /* storage_roots given */
  char storage_roots[SRV_AUTH_LIST_MAX]; /* "r1,r2": some [storage] roots */
  /* devices = 0,1 (issue #17): the daemon devices its sessions may use, in
   * order (the sessions' default placement); 0 of them: every device. */
  int num_devices;
  uint8_t devices[PD_MAX_DEVICES];
} srv_tenant_conf;

/* The daemon's options. Plain data: copied by value (reload compares old
 * and new). */
typedef struct srv_options {
  /* [daemon] */
  char listen[SRV_MAX_LISTEN][SRV_ADDR_MAX];
  int num_listen;
  char admin_socket[SRV_ADDR_MAX]; /* a path; "" disables the Admin service */
  bool admin_socket_set;           /* by the file or a flag, not the default */
  unsigned admin_socket_mode;
  /* [daemon] admin_socket_group: a group name or number; "": the daemon's
   * own group. Operators join it; clients join the daemon's group. */
  char admin_socket_group[SRV_ADDR_MAX];
  char metrics_listen[SRV_ADDR_MAX]; /* host:port; "" disables HTTP */
  int num_threads;
  int grace_ms;
  uint32_t drain_timeout_s;
  uint32_t stall_timeout_s;  /* no progress while work is runnable */
  uint32_t kernel_timeout_s; /* one op's kernel without progress; 0: none */
  /* The HTTP listener's connections (libmicrohttpd): at most this many at
   * once, per client IP address (0: no per-address limit), and the seconds
   * one may stay idle. */
  int metrics_max_connections;
  int metrics_max_connections_per_ip;
  uint32_t metrics_idle_timeout_s;
  /* [devices] */
  char backend[8];
  int num_devices;
  char mesh[SRV_ADDR_MAX];
  uint64_t memory_limit;   /* per device; 0: the backend's default */
  uint64_t memory_reserve; /* DEV_MEMORY_RESERVE_DEFAULT: the backend's */
  int blas_threads;        /* 0: the cores divided by the devices */
  /* [cuda]: passed to the CUDA backend (dev_engine_config.cuda_*) */
  bool cuda_allow_tf32;
  uint64_t cuda_pool_release_threshold; /* bytes; UINT64_MAX: keep all */
  int cuda_collective_timeout_ms;
  int cuda_collectives; /* a dev_cuda_collectives */
  /* [limits], [sessions] */
  srv_limits limits;
  /* [scheduler] (issue #15): sched_config.policy and dispatch_ahead_ns */
  bool sched_fair_share; /* false: the old round-robin (a baseline) */
  int dispatch_ahead_us; /* estimated device time ahead; 0: no bound */
  /* [storage]: checkpoints (storage/storage.h). Roots are absolute
   * directories or http(s):// URL prefixes; none: loads and saves are
   * refused. */
  char storage_roots[SRV_MAX_ROOTS][SRV_ROOT_MAX];
  int num_storage_roots;
  uint64_t storage_block_size;      /* bytes */
  uint64_t storage_cache_bytes;     /* bytes; 0 disables the cache */
  uint32_t storage_max_staleness_s; /* 0: only a file's signature decides */
  uint32_t storage_fetch_timeout_s; /* per HTTP request */
  int storage_fetch_retries;        /* HTTP retries with backoff */
  int storage_load_workers;         /* threads reading loads, writing saves */
  /* [auth] and [tenant NAME] (issue #14; auth.h): all reloadable. */
  char auth_tokens_file[SRV_ROOT_MAX];    /* "": no bearer tokens */
  int auth_require;                       /* an srv_require */
  char auth_operators[SRV_AUTH_LIST_MAX]; /* identities with operator rights */
  srv_tenant_conf tenants[SRV_MAX_TENANTS];
  int num_tenants;
  /* [tls]: the TCP listeners' certificate (tls.c); empty cert_file: no TLS.
   * The files are re-read when they change and on SIGHUP; their paths take
   * effect at a restart. */
  char tls_cert_file[SRV_FILE_MAX];      /* PEM chain, the leaf first */
  char tls_key_file[SRV_FILE_MAX];       /* PEM private key of the leaf */
  char tls_client_ca_file[SRV_FILE_MAX]; /* PEM CAs of client certificates */
  bool tls_require_client_cert;          /* mTLS: refuse clients without */
  bool tls_allow_insecure_tcp; /* plaintext on a non-loopback address */
  /* [log] */
  int log_levels[SRV_SUB_COUNT];
  /* Where the file came from: SRV_DEFAULT_CONFIG or --config. */
  char config_path[SRV_ADDR_MAX];
  /* [auth], job tokens (jobs.h): refuse job ids given without a token;
   * a token's default lifetime (s); how many may be live at once. */
  bool require_job_token;
  uint32_t job_token_lifetime_s;
  int max_job_tokens;
  char job_tokens_file[SRV_ROOT_MAX]; /* "": tokens in memory only */
  /* [functions] (issue #11): the graph functions' settings (the engine's
   * dev_fn_config); a restart applies a change. */
  int fn_passes[SRV_FN_PASSES]; /* dev_tristate per dev_fn_pass */
  int fn_max_instantiations;    /* 1..DEV_FN_MAX_INST_CAP, default 8 */
  uint64_t fn_fold_max_bytes;   /* constant folding: a value's bytes */
  int fn_fold_max_ms;           /* constant folding: ms per instantiation */
  int fn_inst_max_ms;           /* inlining + gradients: ms per instantiation */
  char fn_plugins[SRV_AUTH_LIST_MAX]; /* "/a.so,/b.so": optimizer plugins */
  bool config_explicit; /* --config given: a missing file is an error */
  bool config_loaded;   /* a file was read */
  /* [mesh] (issue #16): one mesh of daemons across machines. world_size 1
   * (the default): no mesh. mesh_world_size 0 and mesh_rank -1 mean "not
   * given" until srv_config_load applies the environment and defaults. */
  int mesh_world_size;
  int mesh_rank;
  char mesh_coordinator[SRV_ADDR_MAX]; /* host:port of the mesh port */
  uint32_t mesh_join_timeout_s;
  uint32_t mesh_lease_s;
  uint32_t mesh_collective_timeout_s;
  int mesh_on_loss; /* SRV_MESH_LOSS_WAIT or _EXIT */
  char mesh_transport_host[SRV_ADDR_MAX]; /* "": derived at start */
  char mesh_secret_file[SRV_FILE_MAX];    /* "": no shared secret */
  /* Where world_size, rank and coordinator came from ("--rank",
   * "[mesh] rank", "SLURM_PROCID", "default"), for the start-up log. */
  char mesh_src[3][64];
} srv_options;

#define SRV_MESH_LOSS_WAIT 0
#define SRV_MESH_LOSS_EXIT 1
#define SRV_MESH_MAX_RANKS PD_MAX_DEVICES



/* Receives one error or warning line (without a trailing newline). */
typedef void (*srv_config_report_fn)(bool error, const char *msg);

/* Reads a getenv-like source (tests pass their own). */
typedef const char *(*srv_getenv_fn)(const char *name);

/* The mesh's values the flags and the file left unset (world size, rank,
 * coordinator), from the launcher's environment through `env`: Slurm
 * (SLURM_PROCID, SLURM_NTASKS, the first host of SLURM_STEP_NODELIST else
 * SLURM_JOB_NODELIST, port SLURM_JOB_ID % 4096 + 61440 as JAX's
 * SlurmCluster), Kubernetes (JOB_COMPLETION_INDEX, PARADEV_MESH_WORLD_SIZE,
 * PARADEV_MESH_COORDINATOR); then the defaults (1, 0, none). Records each
 * value's source in o->mesh_src. Returns the errors reported (a variable
 * that is not a number, a node list it cannot read). config_mesh.c. */
int srv_mesh_options_from_env(srv_options *o, srv_getenv_fn env,
                              srv_config_report_fn report);
/* The first host of a Slurm node list ("node[01-04,07],gpu3" -> "node01");
 * false when it cannot be read or does not fit `len`. */
bool srv_slurm_first_host(const char *nodelist, char *out, size_t len);
/* The mesh port of a Slurm job (JAX's rule): id % 4096 + 61440. */
int srv_slurm_port(uint64_t job_id);
/* The checks of [mesh] between keys (rank in range, a coordinator with a
 * port for world_size > 1, the devices of the whole mesh within
 * PD_MAX_DEVICES; with `check`, the secret file readable). Returns the
 * errors reported. */
int srv_check_mesh(const srv_options *o, bool check,
                   srv_config_report_fn report);
/* "world size 2 (--world-size), rank 1 (SLURM_PROCID), coordinator
 * node01:61442 ([mesh] coordinator)" for the log and --check-config. */
void srv_config_describe_mesh(const srv_options *o, char *buf, size_t len);

typedef enum srv_config_action {
  SRV_CONFIG_RUN = 0,  /* options loaded: start the daemon */
  SRV_CONFIG_EXIT_OK,  /* --help, --version or a good --check-config */
  SRV_CONFIG_EXIT_BAD, /* an error was reported: exit 2 */
} srv_config_action;

/* Builds the options from defaults, the file, PARADEV_LOG and argv.
 * *check is set when --check-config was given (then the action is EXIT_OK or
 * EXIT_BAD and a summary was printed). Also used on SIGHUP with the same
 * argv: the file is read again and flags still win. */
srv_config_action srv_config_load(int argc, char **argv, srv_options *out,
                                  bool *check, srv_config_report_fn report);

/* Reports (as warnings) the keys whose change needs a restart, and returns
 * how many differ. */
int srv_config_restart_keys(const srv_options *old, const srv_options *now,
                            srv_config_report_fn report);

/* One line describing the device settings ("backend cuda, mesh cuda:all,
 * ...; allow_tf32 false, collectives auto, ...") for --check-config and the
 * start-up log. Always NUL-terminated. */
void srv_config_describe_devices(const srv_options *o, char *buf, size_t len);

/* One line describing [functions] ("passes pruning on, cse off, ...;
 * max_instantiations 8; constant folding up to 65536 bytes, 50 ms;
 * optimizer plugins none") for --check-config and the start-up log. */
void srv_config_describe_functions(const srv_options *o, char *buf, size_t len);

/* --check-config's check of [functions] optimizer_plugins: loads and
 * unloads every plugin as a start does (srv_optimizer_load: the same
 * refusals, duplicates included) and reports each error; returns how many.
 * main.c sets it to daemon.c's srv_functions_check; NULL (fuzz_config links
 * no engine): the plugins are not checked. */
typedef int (*srv_config_plugin_check_fn)(const srv_options *o,
                                          srv_config_report_fn report);
extern srv_config_plugin_check_fn srv_config_plugin_check;

/* Splits [functions] optimizer_plugins into at most SRV_MAX_PLUGINS paths
 * (pointers into `buf`, a copy of the list); returns how many. */
int srv_config_plugin_paths(const srv_options *o, char *buf, size_t len,
                            const char **paths);

/* Writes /tmp/paradevd-UID: the directory of the default sockets when the
 * environment names no runtime directory. */
void srv_tmp_socket_dir(char *out, size_t len);

/* Makes `dir` ready to hold sockets only this user can reach: creates it
 * mode 0700 when it is missing, and accepts an existing one only when it is
 * a directory (not a link) of the effective user with no access for group
 * or others. Otherwise returns false with the reason and the way out in
 * `err`: in a world-writable /tmp another user could have created the name
 * first, to serve in the daemon's place or read what clients send. */
bool srv_private_dir_prepare(const char *dir, char *err, size_t errlen);

/* How many TCP listen addresses of `o` are not loopback and serve
 * plaintext (no [tls] cert_file); the first one's address in `first` (may
 * be NULL). Such a configuration starts only with [tls] allow_insecure_tcp
 * = true (srv_config_load refuses it otherwise). */
int srv_config_insecure_tcp(const srv_options *o, char *first, size_t len);

/* The warning for srv_config_insecure_tcp's listeners ("" when none): for
 * the start-up log, --check-config and GetServerInfo's warnings. */
void srv_config_insecure_warning(const srv_options *o, char *buf, size_t len);

/* A group named `name` (or numbered: digits) exists on this machine; its
 * gid into *gid (may be NULL). A number is taken as it is (a container may
 * have no group database). Thread-safe (getgrnam_r). */
bool srv_group_lookup(const char *name, gid_t *gid);

/* The usage text (--help). */
extern const char srv_usage[];

#endif /* PARADEV_SERVER_CONFIG_H */
