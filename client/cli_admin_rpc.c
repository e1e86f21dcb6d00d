/* `paradev admin`'s unary Admin call (C core, one blocking call per
 * command: libparadev exports the pd_* API only, and Admin is not part of
 * it), on the admin socket or, for a remote operator, on a client listener
 * with TLS and a bearer token (--target); and what its commands share:
 * usage errors, flag values, byte counts, and printing a reply as JSON or
 * one member of it (cli_admin.h). */
#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_admin.h"
#include "paradev/types.h" /* pd_code_name: gRPC's codes are pd_code's */
#include "paradev/v1/admin.pb-c.h"

int cli_admin_bad(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "paradev admin: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nTry 'paradev admin --help'.\n");
  va_end(ap);
  return 2;
}

/* --- a remote operator: --target with TLS and a token --------------------- */

#define CLI_ADMIN_PEM_LIMIT (1u << 20)
#define CLI_ADMIN_TOKEN_MAX 4096

/* The remote settings in force (one command per process). */
static struct {
  bool on;
  bool tls;
  char target[512]; /* as dialed, without "tls://" */
  char server_name[256];
  char *pem[3]; /* CA, certificate, key; NULL when not given */
  char auth[CLI_ADMIN_TOKEN_MAX + 8]; /* "Bearer ..."; "" without a token */
} cli_remote;

/* A setting: the flag, else the variable (named in *from for messages). */
static const char *cli_admin_setting(const char *flag, const char *flag_name,
                                     const char *env, char *from, size_t len) {
  if (flag && *flag) {
    snprintf(from, len, "%s", flag_name);
    return flag;
  }
  const char *v = getenv(env);
  if (v && *v) {
    snprintf(from, len, "$%s", env);
    return v;
  }
  return NULL;
}

/* The whole file (NUL-terminated) in *out; 2 after printing why. */
static int cli_admin_slurp(const char *path, const char *from, char **out) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return cli_admin_bad("%s %s cannot be read: %s", from, path,
                         strerror(errno));
  char *buf = malloc(CLI_ADMIN_PEM_LIMIT + 1);
  size_t n = buf ? fread(buf, 1, CLI_ADMIN_PEM_LIMIT + 1, f) : 0;
  fclose(f);
  if (!buf || n == 0 || n > CLI_ADMIN_PEM_LIMIT) {
    free(buf);
    return cli_admin_bad("%s %s %s", from, path,
                         !buf ? "cannot be read: out of memory"
                         : n  ? "is over 1 MiB"
                              : "is empty");
  }
  buf[n] = '\0';
  *out = buf;
  return 0;
}

/* The bearer token into cli_remote.auth: --token-file, $PARADEV_TOKEN,
 * $PARADEV_TOKEN_FILE (its first line), as libparadev reads them. */
static int cli_admin_token(const char *token_file) {
  char from[64], text_from[96];
  const char *file = token_file && *token_file ? token_file : NULL;
  const char *tok = file ? NULL : getenv("PARADEV_TOKEN");
  char *buf = NULL;
  if (file) {
    snprintf(from, sizeof from, "--token-file");
  } else if (tok && *tok) {
    snprintf(text_from, sizeof text_from, "$PARADEV_TOKEN");
  } else {
    file = cli_admin_setting(NULL, "", "PARADEV_TOKEN_FILE", from, sizeof from);
    if (!file) return 0;
  }
  if (file) {
    int rc = cli_admin_slurp(file, from, &buf);
    if (rc) return rc;
    buf[strcspn(buf, "\r\n")] = '\0';
    tok = buf;
    snprintf(text_from, sizeof text_from, "the first line of %s %s", from,
             file);
  }
  while (*tok == ' ' || *tok == '\t') tok++;
  size_t n = strlen(tok);
  while (n && (tok[n - 1] == ' ' || tok[n - 1] == '\t')) n--;
  int rc = 0;
  if (n == 0 || n > CLI_ADMIN_TOKEN_MAX)
    rc =
        cli_admin_bad("%s: the token is %s; expected 1 to %d characters",
                      text_from, n ? "too long" : "empty", CLI_ADMIN_TOKEN_MAX);
  for (size_t i = 0; !rc && i < n; i++)
    if (tok[i] < 0x21 || tok[i] > 0x7e)
      rc = cli_admin_bad(
          "%s: the token has a byte 0x%02x at %zu; expected "
          "printable ASCII without spaces",
          text_from, (unsigned)(unsigned char)tok[i], i);
  if (!rc)
    snprintf(cli_remote.auth, sizeof cli_remote.auth, "Bearer %.*s", (int)n,
             tok);
  free(buf);
  return rc;
}

int cli_admin_set_remote(const cli_admin_remote *r) {
  const char *t = r->target;
  bool scheme = strncmp(t, "tls://", 6) == 0;
  if (scheme) t += 6;
  bool unix_target = strncmp(t, "unix:", 5) == 0;
  if (!*t || strlen(t) >= sizeof cli_remote.target ||
      (!unix_target && !strchr(t, ':')))
    return cli_admin_bad(
        "--target '%s': expected host:port, tls://host:port or unix:/path",
        r->target);
  snprintf(cli_remote.target, sizeof cli_remote.target, "%s", t);
  static const char *const flags[3] = {"--tls-ca", "--tls-cert", "--tls-key"};
  static const char *const envs[3] = {"PARADEV_TLS_CA", "PARADEV_TLS_CERT",
                                      "PARADEV_TLS_KEY"};
  const char *given[3] = {r->tls_ca, r->tls_cert, r->tls_key};
  char from[3][32];
  const char *path[3];
  for (int i = 0; i < 3; i++)
    path[i] = unix_target ? given[i]
                          : cli_admin_setting(given[i], flags[i], envs[i],
                                              from[i], sizeof from[i]);
  if (unix_target && (scheme || path[0] || path[1] || path[2]))
    return cli_admin_bad(
        "--target %s is a Unix socket: TLS is for TCP targets (drop "
        "tls:// and the --tls-* options)",
        t);
  if (!path[1] != !path[2])
    return cli_admin_bad(
        "%s is given without %s: a client certificate needs its private key",
        path[1] ? from[1] : from[2], path[1] ? "--tls-key" : "--tls-cert");
  cli_remote.tls = !unix_target && (scheme || path[0] || path[1]);
  for (int i = 0; i < 3; i++)
    if (cli_remote.tls && path[i]) {
      int rc = cli_admin_slurp(path[i], from[i], &cli_remote.pem[i]);
      if (rc) return rc;
    }
  char nfrom[32];
  const char *name =
      cli_admin_setting(r->tls_server_name, "--tls-server-name",
                        "PARADEV_TLS_SERVER_NAME", nfrom, sizeof nfrom);
  if (cli_remote.tls && name)
    snprintf(cli_remote.server_name, sizeof cli_remote.server_name, "%s", name);
  int rc = cli_admin_token(r->token_file);
  if (rc) return rc;
  cli_remote.on = true;
  return 0;
}

const char *cli_admin_remote_target(void) {
  return cli_remote.on ? cli_remote.target : NULL;
}

/* The channel of the call: the admin socket's, or the remote target's. */
static grpc_channel *cli_admin_channel(const char *socket_path) {
  char target[4200];
  grpc_channel_credentials *creds = NULL;
  grpc_arg arg;
  grpc_channel_args args = {0, &arg};
  if (!cli_remote.on) {
    snprintf(target, sizeof(target), "unix:%s", socket_path);
    creds = grpc_insecure_credentials_create();
  } else {
    snprintf(target, sizeof(target), "%s", cli_remote.target);
    if (cli_remote.tls) {
      grpc_ssl_pem_key_cert_pair pair = {cli_remote.pem[2], cli_remote.pem[1]};
      creds = grpc_ssl_credentials_create(
          cli_remote.pem[0], cli_remote.pem[1] ? &pair : NULL, NULL, NULL);
    } else {
      creds = grpc_insecure_credentials_create();
    }
    if (cli_remote.server_name[0]) {
      arg.type = GRPC_ARG_STRING;
      arg.key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
      arg.value.string = cli_remote.server_name;
      args.num_args = 1;
    }
  }
  grpc_channel *ch =
      grpc_channel_create(target, creds, args.num_args ? &args : NULL);
  grpc_channel_credentials_release(creds);
  return ch;
}

/* One unary Admin call: its channel, queue and call, the messages, and
 * what comes back. */
typedef struct cli_admin_rpc {
  grpc_channel *ch;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_byte_buffer *send, *recv;
  grpc_metadata_array md_initial, md_trailing;
  grpc_status_code status;
  grpc_slice details;
} cli_admin_rpc;

/* The channel to the admin socket and the call to "/paradev.v1.Admin/METHOD"
 * (the service's name from its descriptor), with the request packed. */
static void cli_admin_open(cli_admin_rpc *r, const char *socket_path,
                           double timeout_s, const char *method,
                           const ProtobufCMessage *req) {
  char path[256];
  snprintf(path, sizeof(path), "/%s/%s", paradev__v1__admin__descriptor.name,
           method);
  r->ch = cli_admin_channel(socket_path);
  r->cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice mslice = grpc_slice_from_copied_string(path);
  gpr_timespec deadline = gpr_time_add(
      gpr_now(GPR_CLOCK_REALTIME),
      gpr_time_from_millis((int64_t)(timeout_s * 1000 + 0.5), GPR_TIMESPAN));
  r->call = grpc_channel_create_call(r->ch, NULL, GRPC_PROPAGATE_DEFAULTS,
                                     r->cq, mslice, NULL, deadline, NULL);
  grpc_slice_unref(mslice);
  size_t len = protobuf_c_message_get_packed_size(req);
  grpc_slice out = grpc_slice_malloc(len);
  protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(out));
  r->send = grpc_raw_byte_buffer_create(&out, 1);
  grpc_slice_unref(out);
  grpc_metadata_array_init(&r->md_initial);
  grpc_metadata_array_init(&r->md_trailing);
  r->status = GRPC_STATUS_UNKNOWN;
  r->details = grpc_empty_slice();
}

/* The whole call as one batch, waited for; false if it could not start. */
static bool cli_admin_run(cli_admin_rpc *r) {
  grpc_op ops[6];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  grpc_metadata md;
  if (cli_remote.on && cli_remote.auth[0]) {
    md.key = grpc_slice_from_static_string("authorization");
    md.value = grpc_slice_from_static_string(cli_remote.auth);
    ops[0].data.send_initial_metadata.count = 1;
    ops[0].data.send_initial_metadata.metadata = &md;
  }
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = r->send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &r->md_initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &r->recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &r->md_trailing;
  ops[5].data.recv_status_on_client.status = &r->status;
  ops[5].data.recv_status_on_client.status_details = &r->details;
  int tag = 0;
  if (grpc_call_start_batch(r->call, ops, 6, &tag, NULL) != GRPC_CALL_OK)
    return false;
  grpc_completion_queue_pluck(r->cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME),
                              NULL);
  return true;
}

/* The status, then the reply decoded into *resp: 0, or 1 (printed). */
static int cli_admin_reply(const cli_admin_rpc *r, const char *socket_path,
                           const char *method,
                           const ProtobufCMessageDescriptor *resp_desc,
                           ProtobufCMessage **resp) {
  if (r->status != GRPC_STATUS_OK) {
    size_t dl = GRPC_SLICE_LENGTH(r->details);
    fprintf(stderr, "paradev admin: %s: %.*s (%s)\n", method, (int)dl,
            (const char *)GRPC_SLICE_START_PTR(r->details),
            pd_code_name((pd_code)r->status));
    if (r->status == GRPC_STATUS_UNAVAILABLE && !cli_remote.on)
      fprintf(stderr,
              "paradev admin: is paradevd running, and is %s its admin "
              "socket? (--socket, $PARADEV_ADMIN_SOCKET)\n",
              socket_path);
    else if (r->status == GRPC_STATUS_UNAVAILABLE)
      fprintf(stderr,
              "paradev admin: is paradevd listening on %s%s? A TLS "
              "listener needs its CA (--tls-ca) and, for mutual TLS, a "
              "client certificate (--tls-cert, --tls-key); a plaintext one "
              "neither\n",
              cli_remote.target, cli_remote.tls ? " with TLS" : " without TLS");
    else if (cli_remote.on && r->status == GRPC_STATUS_UNAUTHENTICATED)
      fprintf(stderr,
              "paradev admin: UNAUTHENTICATED: %s did not accept the "
              "credentials: check the token (--token-file, $PARADEV_TOKEN, "
              "$PARADEV_TOKEN_FILE) or the client certificate (--tls-cert)\n",
              cli_remote.target);
    else if (cli_remote.on && r->status == GRPC_STATUS_PERMISSION_DENIED)
      fprintf(stderr,
              "paradev admin: PERMISSION_DENIED: the Admin service needs an "
              "operator: an identity listed in the daemon's [auth] "
              "operators (a client certificate or a bearer token), or the "
              "admin socket\n");
    return 1;
  }
  if (!r->recv) {
    fprintf(stderr, "paradev admin: %s: the reply carried no message\n",
            method);
    return 1;
  }
  grpc_byte_buffer_reader rd;
  if (grpc_byte_buffer_reader_init(&rd, r->recv)) {
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    *resp = protobuf_c_message_unpack(resp_desc, NULL, GRPC_SLICE_LENGTH(all),
                                      GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
  }
  if (*resp) return 0;
  fprintf(stderr, "paradev admin: %s: the reply does not decode\n", method);
  return 1;
}

/* Undoes cli_admin_open, the queue drained before it is destroyed. */
static void cli_admin_close(cli_admin_rpc *r) {
  if (r->recv) grpc_byte_buffer_destroy(r->recv);
  grpc_byte_buffer_destroy(r->send);
  grpc_slice_unref(r->details);
  grpc_metadata_array_destroy(&r->md_initial);
  grpc_metadata_array_destroy(&r->md_trailing);
  grpc_call_unref(r->call);
  grpc_completion_queue_shutdown(r->cq);
  while (grpc_completion_queue_pluck(r->cq, NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(r->cq);
  grpc_channel_destroy(r->ch);
}

/* One unary call. On success *resp is set (free with
 * protobuf_c_message_free_unpacked(resp, NULL)) and 0 returned; else the
 * error was printed and 1 returned. */
int cli_admin_call(const char *socket_path, double timeout_s,
                   const char *method, const ProtobufCMessage *req,
                   const ProtobufCMessageDescriptor *resp_desc,
                   ProtobufCMessage **resp) {
  cli_admin_rpc r = {NULL};
  cli_admin_open(&r, socket_path, timeout_s, method, req);
  int rc = 1;
  if (!cli_admin_run(&r))
    fprintf(stderr, "paradev admin: internal: cannot start the call\n");
  else
    rc = cli_admin_reply(&r, socket_path, method, resp_desc, resp);
  cli_admin_close(&r);
  return rc;
}

/* 1536 -> "1.5 KiB". */
const char *cli_admin_bytes(uint64_t b, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%" PRIu64 " B", b);
  else
    snprintf(buf, len, "%.1f %s", v, units[u]);
  return buf;
}

/* The value of the flag at argv[*i], "--flag VALUE" (*i moves past it) or
 * "--flag=VALUE"; NULL when there is none: the flag is last, its value is
 * empty, or what follows is another flag ("--job --json"). */
const char *cli_admin_value(int argc, char **argv, int *i) {
  const char *eq = strchr(argv[*i], '=');
  const char *v = eq ? eq + 1 : (*i + 1 < argc ? argv[*i + 1] : NULL);
  if (!v || !*v || (!eq && strncmp(v, "--", 2) == 0)) return NULL;
  if (!eq) (*i)++;
  return v;
}

int cli_admin_out_flag(const char *cmd, int argc, char **argv, int *i,
                       cli_admin_out *o) {
  const char *a = argv[*i];
  if (strcmp(a, "--json") == 0) {
    o->json = true;
    return 1;
  }
  if (strcmp(a, "--field") != 0 && strncmp(a, "--field=", 8) != 0) return 0;
  const char *v = cli_admin_value(argc, argv, i);
  if (!v) {
    cli_admin_bad("%s: --field needs a value (a member of --json's document)",
                  cmd);
    return -1;
  }
  o->json = true;
  o->field = v;
  return 1;
}

int cli_admin_emit(json_object *doc, const cli_admin_out *o, const char *cmd) {
  int rc = 0;
  if (!o->field) {
    puts(json_object_to_json_string_ext(
        doc, JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_PRETTY |
                 JSON_C_TO_STRING_NOSLASHESCAPE));
  } else {
    json_object *v = NULL;
    if (!json_object_object_get_ex(doc, o->field, &v)) {
      char names[1024] = "";
      size_t n = 0;
      json_object_object_foreach(doc, key, val) {
        (void)val;
        int w =
            snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", key);
        if (w < 0 || (size_t)w >= sizeof names - n) break;
        n += (size_t)w;
      }
      rc = cli_admin_bad(
          "%s: --field '%s': no such member (expected one of: "
          "%s)",
          cmd, o->field, names);
    } else if (json_object_is_type(v, json_type_string)) {
      puts(json_object_get_string(v));
    } else {
      puts(json_object_to_json_string_ext(
          v, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
    }
  }
  json_object_put(doc);
  return rc;
}
