/* `paradev admin`: the operators' commands, spoken to paradevd's Admin
 * service on its admin socket. The unary call and what the commands share
 * (cli_admin_rpc.c); the session and daemon commands (cli_admin.c); the job
 * commands of the Slurm prolog and epilog (cli_jobs.c). Calls go one way:
 * cli_admin -> cli_jobs -> cli_admin_rpc, cli_admin -> cli_admin_rpc. */
#ifndef PARADEV_CLI_ADMIN_H
#define PARADEV_CLI_ADMIN_H

#include <json-c/json.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Prints "paradev admin: " and the message, and the --help hint, to
 * stderr; returns 2 (a bad command line). */
int cli_admin_bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One unary call of "/paradev.v1.Admin/METHOD" on the admin socket, waited
 * for up to timeout_s. On success *resp is set (free with
 * protobuf_c_message_free_unpacked(resp, NULL)) and 0 returned; else the
 * error was printed and 1 returned. */
int cli_admin_call(const char *socket_path, double timeout_s,
                   const char *method, const ProtobufCMessage *req,
                   const ProtobufCMessageDescriptor *resp_desc,
                   ProtobufCMessage **resp);

/* A remote operator's settings (`paradev admin --target ...`): the
 * daemon's client listener ("host:port", "tls://host:port", "unix:/path"),
 * TLS material and a token file; NULL members fall back to
 * $PARADEV_TLS_CA, $PARADEV_TLS_CERT, $PARADEV_TLS_KEY,
 * $PARADEV_TLS_SERVER_NAME, $PARADEV_TOKEN and $PARADEV_TOKEN_FILE, as
 * libparadev reads them. TLS is on for tls:// or when a CA or certificate
 * is given. */
typedef struct cli_admin_remote {
  const char *target;
  const char *tls_ca, *tls_cert, *tls_key, *tls_server_name, *token_file;
} cli_admin_remote;

/* Makes every later cli_admin_call go to r->target (its socket_path
 * unused), with the token as `authorization: Bearer` metadata. Reads the
 * files now. 0, or 2 after printing the usage error (a bad target, a file
 * that cannot be read, a certificate without its key, a bad token). */
int cli_admin_set_remote(const cli_admin_remote *r);
/* The remote target in force, or NULL (the admin socket). */
const char *cli_admin_remote_target(void);

/* 1536 -> "1.5 KiB" into buf; returns buf. */
const char *cli_admin_bytes(uint64_t b, char *buf, size_t len);

/* The value of the flag at argv[*i], "--flag VALUE" (*i moves past it) or
 * "--flag=VALUE"; NULL when there is none: the flag is last, its value is
 * empty, or what follows is another flag ("--job --json"). */
const char *cli_admin_value(int argc, char **argv, int *i);

/* How a command prints its reply: the human text, the JSON document
 * (--json), or one member of it (--field NAME). */
typedef struct cli_admin_out {
  bool json;
  const char *field; /* NULL: the whole document */
} cli_admin_out;

/* Parses --json and --field NAME at argv[*i] into *o: 1 when argv[*i] was
 * one of them (*i moved past a value), 0 when it is another argument, -1
 * after printing the usage error (`cmd` names the command). */
int cli_admin_out_flag(const char *cmd, int argc, char **argv, int *i,
                       cli_admin_out *o);

/* Prints `doc` (and drops it) as --json or --field asked: the document,
 * spaced and one member per line; or the member's value alone, a string
 * without quotes, true/false, a number. 0, or 2 when the document has no
 * such member (the members it has are named). */
int cli_admin_emit(json_object *doc, const cli_admin_out *o, const char *cmd);

/* cli_jobs.c: `job-token` and `kill-job` (argv[0] is the command). */
int cli_admin_job_token(const char *sock, double timeout, int argc,
                        char **argv);
int cli_admin_kill_job(const char *sock, double timeout, int argc, char **argv);

#endif /* PARADEV_CLI_ADMIN_H */
