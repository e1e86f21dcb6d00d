/* Private header of the configuration (config.h): the table of keys that
 * the file (config_file.c) and the command line (config_cli.c) both set,
 * through one setter (config_keys.c); config.c loads, checks and compares
 * configurations. */
#ifndef PARADEV_SERVER_CONFIG_INT_H
#define PARADEV_SERVER_CONFIG_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef enum srv_key_type {
  SRV_K_LISTEN,   /* address list */
  SRV_K_PATH,     /* absolute path of a Unix socket, or empty */
  SRV_K_HOSTPORT, /* host:port, or empty */
  SRV_K_BACKEND,
  SRV_K_MESH,
  SRV_K_INT,         /* int within [min, max] */
  SRV_K_U32,         /* uint32_t within [min, max] */
  SRV_K_SIZE,        /* uint64_t bytes with K/M/G/T, within [min, max] */
  SRV_K_MODE,        /* octal file mode */
  SRV_K_LOG,         /* log spec */
  SRV_K_BOOL,        /* true|false (also yes|no, on|off, 1|0) */
  SRV_K_SIZE_ALL,    /* like SRV_K_SIZE, or "unlimited" for UINT64_MAX */
  SRV_K_COLLECTIVES, /* auto|nccl|copy, as dev_cuda_collectives */
  SRV_K_ROOTS,       /* storage roots: a list of directories and URLs */
  SRV_K_GROUP,       /* a group name or number, or empty */
  SRV_K_FILE,        /* an absolute file path of fewer than k->max bytes,
                        or empty */
  SRV_K_REQUIRE,     /* none|remote|tcp|all, as srv_require */
  SRV_K_IDLIST,      /* a comma list of identities (SRV_AUTH_LIST_MAX) */
  SRV_K_TRISTATE,    /* on|off|default, as dev_tristate (an int) */
  SRV_K_PLUGINS,     /* a comma list of absolute paths (SRV_AUTH_LIST_MAX) */
  SRV_K_ONLOSS,      /* wait|exit, as SRV_MESH_LOSS_* */
  SRV_K_HOST,        /* a host name or address (no port), or empty */
  SRV_K_OPTINT,      /* like SRV_K_INT, or empty: not given (the default
                        stays, for the environment to fill) */
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

/* Every key, in the order the file documents them (config_keys.c). */
extern const srv_key srv_keys[];
extern const size_t srv_num_keys;
#define SRV_MAX_KEYS 96 /* at least srv_num_keys (checked at start) */
/* The file's sections, and the names of the collectives' paths. */
extern const char *const srv_sections[];
extern const size_t srv_num_sections;
extern const char *const srv_collectives[];
extern const size_t srv_num_collectives;

/* --- [tenant NAME] sections (config_tenants.c) --------------------------- */

/* The tenant's name when `section` is "tenant NAME" (NAME points into it),
 * else NULL. */
const char *srv_tenant_section(const char *section);
/* Sets key `name` of tenant `tenant` (made at its first key) from `value`;
 * false with the reason (what was expected) in err. `line`: where. */
bool srv_tenant_key_set(srv_options *o, const char *tenant, const char *name,
                        const char *value, int line, char *err, size_t errlen);
/* Checks between tenants and against the other keys: an identity in two
 * tenants, a tenant root that is not a [storage] root, a max_lease over
 * [sessions] max_lease_seconds. Returns the errors (reported). */
int srv_check_tenants(const srv_options *o, srv_config_report_fn report);
/* Parses a comma list of identities into `out` ("a,b", blanks trimmed);
 * false with what was expected in err. */
bool srv_idlist_parse(const char *value, char *out, size_t cap, char *err,
                      size_t errlen);

/* The built-in defaults. */
void srv_defaults(srv_options *o);
/* Parses `value` for key `k` into `o`; false with the reason in `err`. */
bool srv_key_set(const srv_key *k, srv_options *o, const char *value, char *err,
                 size_t errlen);
/* Reads the file of o->config_path into `o` (config_file.c). Returns the
 * number of errors (reported). */
int srv_config_read_file(srv_options *o, srv_config_report_fn report);
/* Applies the command line's flags to `o` (config_cli.c). Returns the
 * number of errors (reported). */
int srv_apply_flags(int argc, char **argv, srv_options *o,
                    srv_config_report_fn report);
/* Reports a command-line error. */
void srv_report_flag(srv_config_report_fn report, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Splits "--name=value" (into buf); *val is NULL when there is no '='. */
const char *srv_flag_name(const char *a, char *buf, size_t len,
                          const char **val);

/* [mesh]: records that key `k` (world_size, rank or coordinator; others
 * are ignored) was set by `src` (config_mesh.c). */
void srv_mesh_note_source(srv_options *o, const srv_key *k, const char *src);

#endif /* PARADEV_SERVER_CONFIG_INT_H */
