/* Private header of the `paradev` commands that speak libparadev (cli.c,
 * cli_checkpoint.c, cli_function.c, cli_util.c): the top level's options and the helpers
 * they share (cli_util.c).
 * (cli_admin.c speaks the Admin service itself and uses cli_int.h only.) */
#ifndef PARADEV_CLI_CMD_H
#define PARADEV_CLI_CMD_H

#include "cli_int.h"
#include "paradev/paradev.h"

/* The top level's options, for every command but admin. */
typedef struct cli_opts {
  const char *target;
  bool target_from_env; /* target is $PARADEV_TARGET's: errors say so */
  int64_t timeout_ms;
  /* TLS and the token (NULL: libparadev's environment variables) */
  const char *tls_ca, *tls_cert, *tls_key, *tls_server_name, *token_file;
} cli_opts;

/* cli_util.c: a usage error of `cmd` (NULL: the top level) on stderr; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* cli_util.c: a failed call on stderr, with `hint` (NULL: the command's default, pd_status_hint's);
 * returns 1. */
int cli_fail_hint(const char *cmd, const pd_status *st, const char *hint);
int cli_fail(const char *cmd, const pd_status *st);
/* cli_util.c: opens the channel, or NULL after reporting why with *rc set (2 for
 * a bad target, else 1). */
pd_client *cli_connect(const cli_opts *o, const char *cmd, pd_status *st,
                       int *rc);
/* cli_util.c: "12.3 MiB". */
char *cli_size(uint64_t bytes, char *buf, size_t len);

/* cli_util.c: a device list given to option `opt` (issue #17): comma-
 * separated daemon device indices or names as `paradev info` shows them
 * ("cpu:2", "cuda:2", or the whole name; matched ignoring case, through one
 * GetServerInfo when a name is given) into out[0..*n) (PD_MAX_DEVICES
 * entries). Returns 0, or the exit status after reporting (2 for a bad list
 * or an unknown name, which lists the daemon's; 1 for a failed call). */
int cli_parse_devices(pd_client *c, const char *cmd, const char *opt,
                      const char *spec, int32_t *out, int *n, pd_status *st);
/* cli_util.c: "[1, 3]". */
char *cli_devices_str(const int32_t *devices, int n, char *buf, size_t len);

/* cli_checkpoint.c: `paradev load ...`, `paradev save ...` (argv after the
 * command). */
int cli_load(const cli_opts *o, int argc, char **argv);
int cli_save(const cli_opts *o, int argc, char **argv);

/* cli_function.c: `paradev function check FILE.json [--describe]`. */
int cli_function(const cli_opts *o, int argc, char **argv);

#endif /* PARADEV_CLI_CMD_H */
