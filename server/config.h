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

#include "log.h"

#define SRV_VERSION "0.1.0"
#define SRV_MAX_LISTEN 16
#define SRV_MAX_THREADS 16
#define SRV_ADDR_MAX 256
#define SRV_MAX_ROOTS 16  /* [storage] roots and --storage-root */
#define SRV_ROOT_MAX 1024 /* bytes of one root, NUL included */
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

/* The daemon's options. Plain data: copied by value (reload compares old
 * and new). */
typedef struct srv_options {
  /* [daemon] */
  char listen[SRV_MAX_LISTEN][SRV_ADDR_MAX];
  int num_listen;
  char admin_socket[SRV_ADDR_MAX]; /* a path; "" disables the Admin service */
  bool admin_socket_set;           /* by the file or a flag, not the default */
  unsigned admin_socket_mode;
  char metrics_listen[SRV_ADDR_MAX]; /* host:port; "" disables HTTP */
  int num_threads;
  int grace_ms;
  uint32_t drain_timeout_s;
  uint32_t stall_timeout_s;
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
  /* [log] */
  int log_levels[SRV_SUB_COUNT];
  /* Where the file came from: SRV_DEFAULT_CONFIG or --config. */
  char config_path[SRV_ADDR_MAX];
  bool config_explicit; /* --config given: a missing file is an error */
  bool config_loaded;   /* a file was read */
} srv_options;

/* Receives one error or warning line (without a trailing newline). */
typedef void (*srv_config_report_fn)(bool error, const char *msg);

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

/* The usage text (--help). */
extern const char srv_usage[];

#endif /* PARADEV_SERVER_CONFIG_H */
