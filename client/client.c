/* libparadev: the client: checking a target, opening the channel and
 * registering every method on it (pdc_method_paths, methods.c). */
#include <arpa/inet.h>
#include <grpc/grpc_security.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "check.h"
#include "client_int.h"

#define PDC_DEFAULT_MAX_MESSAGE ((uint64_t)64 << 20)
#define PDC_DEFAULT_TIMEOUT_MS 60000
#define PDC_DEFAULT_CHUNK ((uint64_t)1 << 20)
#define PDC_TARGET_MAX 4096

/* Checks a port: 1 to 65535 in decimal digits. gRPC reads a port past 65535
 * modulo 65536 (127.0.0.1:99999 dials port 34463), "-1" and "+65535" as
 * 65535 and "abc" as port 0, which it cannot dial: refuse all of them, and
 * an empty port. */
static pd_code pdc_check_port(const char *target, const char *port,
                              pd_status *st) {
  size_t n = strlen(port);
  if (n == 0)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "target \"%s\": the port is empty; expected host:port "
                     "(port 1 to 65535), host (port %d) or unix:/path",
                     target, PD_DEFAULT_PORT);
  if (strspn(port, "0123456789") != n)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "target \"%s\": port \"%s\" is not a number; a port must "
                     "be 1 to 65535 in decimal digits",
                     target, port);
  unsigned long v = n > 9 ? 0 : strtoul(port, NULL, 10);
  if (v >= 1 && v <= 65535) return PD_OK;
  return pdc_error(st, PD_INVALID_ARGUMENT,
                   "target \"%s\": port %s is out of range; a port must be 1 "
                   "to 65535",
                   target, port);
}

/* Checks a Unix socket's path (or abstract name): the kernel takes at most
 * sizeof(sun_path) - 1 bytes (107 on Linux), and gRPC says little more than
 * CANCELLED for a longer one. */
static pd_code pdc_check_unix(const char *target, const char *path,
                              pd_status *st) {
  const size_t max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
  size_t n = strlen(path);
  if (n <= max) return PD_OK;
  return pdc_error(st, PD_INVALID_ARGUMENT,
                   "target \"%.160s%s\": the socket path is %zu bytes; at "
                   "most %zu",
                   target, strlen(target) > 160 ? "..." : "", n, max);
}

/* Checks "host:port" or "[v6]:port" at `a` (after any "scheme:///") and
 * says what to add: *bracket when `a` is a bare IPv6 address, *port when it
 * has no port. Several colons that are not an IPv6 address are left to gRPC
 * (its other schemes, "ipv4:1.2.3.4:80"). */
static pd_code pdc_check_host(const char *target, const char *a, bool *bracket,
                              bool *port, pd_status *st) {
  const char *colon = NULL;
  if (a[0] == '[') {
    const char *rb = strchr(a, ']');
    if (!rb || rb == a + 1 || (rb[1] != ':' && rb[1] != '\0'))
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "target \"%s\": expected [v6]:port or [v6] for an "
                       "IPv6 address",
                       target);
    colon = rb[1] == ':' ? rb + 1 : NULL;
    *port = !colon;
  } else if (a[0] == '\0') {
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "target \"%s\": no host; expected host:port, host "
                     "(port %d) or unix:/path",
                     target, PD_DEFAULT_PORT);
  } else if (!(colon = strchr(a, ':'))) {
    *port = true;
  } else if (strchr(colon + 1, ':')) {
    struct in6_addr v6;
    *bracket = *port = inet_pton(AF_INET6, a, &v6) == 1;
    return PD_OK;
  } else if (colon == a) {
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "target \"%s\": no host before the colon; expected "
                     "host:port (port 1 to 65535)",
                     target);
  }
  return colon ? pdc_check_port(target, colon + 1, st) : PD_OK;
}

/* The address gRPC dials for `target` (a new string in *out):
 *  - "unix:PATH" and "unix-abstract:NAME" as they are, once the path or
 *    name is checked (not empty, at most 107 bytes);
 *  - a path, "/..." or "./..." or "../...", is a Unix socket: "unix:PATH";
 *  - "host:port", "[v6]:port" and "scheme:///host:port" as they are, once
 *    the host (not empty) and the port (1 to 65535, digits) are checked;
 *  - "host", "[v6]" and "scheme:///host" get paradevd's port,
 *    PD_DEFAULT_PORT (gRPC's own default would be 443);
 *  - a bare IPv6 address gets brackets and the port: "::1" is
 *    "[::1]:7478" (so "::1:80" is an address too: write "[::1]:80");
 * anything else (other schemes) is left to gRPC. */
static pd_code pdc_target(const char *target, char **out, pd_status *st) {
  const char *prefix = "", *a = target;
  bool bracket = false, port = false;
  if (strncmp(target, "unix:", 5) == 0) {
    if (target[5] == '\0')
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "target \"unix:\" has no path; expected \"unix:/path\"");
    PD_TRY(pdc_check_unix(
        target, strncmp(target, "unix://", 7) == 0 ? target + 7 : target + 5,
        st));
  } else if (strncmp(target, "unix-abstract:", 14) == 0) {
    if (target[14] == '\0')
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "target \"unix-abstract:\" has no name; expected "
                       "\"unix-abstract:NAME\" (a name that is not empty)");
    PD_TRY(pdc_check_unix(target, target + 14, st));
  } else if (target[0] == '/' || strncmp(target, "./", 2) == 0 ||
             strncmp(target, "../", 3) == 0) {
    prefix = "unix:";
    PD_TRY(pdc_check_unix(target, target, st));
  } else {
    const char *slashes = strstr(a, "///");
    if (slashes) a = slashes + 3;
    PD_TRY(pdc_check_host(target, a, &bracket, &port, st));
  }
  char dport[16] = "";
  if (port) snprintf(dport, sizeof(dport), ":%d", PD_DEFAULT_PORT);
  size_t n = strlen(prefix) + strlen(target) + 2 + strlen(dport) + 1;
  if (!(*out = malloc(n)))
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  snprintf(*out, n, "%s%.*s%s%s%s%s", prefix, (int)(a - target), target,
           bracket ? "[" : "", a, bracket ? "]" : "", dport);
  return PD_OK;
}

/* Copies the caller's options over the defaults into *o and checks them and
 * the target's length. */
static pd_code pdc_client_options(const char *target,
                                  const pd_client_options *opts,
                                  pd_client_options *o, pd_status *st) {
  if (opts) {
    if (opts->struct_size < offsetof(pd_client_options, user_agent) ||
        opts->struct_size > sizeof(*o))
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "pd_client_options.struct_size is %zu; start from "
                       "PD_CLIENT_OPTIONS_INITIALIZER",
                       opts->struct_size);
    memcpy(o, opts, opts->struct_size);
  }
  size_t tlen = target ? strlen(target) : 0;
  if (tlen == 0 || tlen > PDC_TARGET_MAX)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "target is %zu bytes; expected \"unix:/path\" or "
                     "\"host:port\" (1 to %d bytes)",
                     tlen, PDC_TARGET_MAX);
  if (o->max_message_bytes > INT_MAX)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "max_message_bytes %llu is over gRPC's limit of %d",
                     (unsigned long long)o->max_message_bytes, INT_MAX);
  if (o->max_message_bytes && o->max_message_bytes < 4096)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "max_message_bytes %llu is under the minimum of 4096",
                     (unsigned long long)o->max_message_bytes);
  if (o->default_timeout_ms < 0)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "default_timeout_ms is %lld; expected 0 (60 s) or more",
                     (long long)o->default_timeout_ms);
  return PD_OK;
}

/* The channel to c->target, with the message limit and the user agent,
 * and every method registered on it. On failure c->channel is what was
 * created (NULL or the channel), for the caller to destroy. */
static pd_code pdc_channel_open(pd_client *c, const pd_client_options *o,
                                grpc_channel_credentials *creds,
                                pd_status *st) {
  grpc_arg args[4];
  size_t nargs = 0;
  args[nargs].type = GRPC_ARG_INTEGER;
  args[nargs].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[nargs++].value.integer = (int)c->max_message_bytes;
  args[nargs].type = GRPC_ARG_INTEGER;
  args[nargs].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[nargs++].value.integer = (int)c->max_message_bytes;
  if (o->user_agent) {
    args[nargs].type = GRPC_ARG_STRING;
    args[nargs].key = (char *)GRPC_ARG_PRIMARY_USER_AGENT_STRING;
    args[nargs++].value.string = (char *)o->user_agent;
  }
  if (c->sec.server_name[0]) {
    args[nargs].type = GRPC_ARG_STRING;
    args[nargs].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    args[nargs++].value.string = c->sec.server_name;
  }
  grpc_channel_args chargs = {nargs, args};
  c->channel = grpc_channel_create(c->target, creds, &chargs);
  if (!c->channel)
    return pdc_error(st, PD_INTERNAL, "gRPC could not create a channel to %s",
                     c->target);
  for (int i = 0; i < PDC_NUM_METHODS; i++) {
    c->reg[i] =
        grpc_channel_register_call(c->channel, pdc_method_paths[i], NULL, NULL);
    if (!c->reg[i])
      return pdc_error(st, PD_INTERNAL, "gRPC could not register %s",
                       pdc_method_paths[i]);
  }
  return PD_OK;
}

pd_client *pd_client_new(const char *target, const pd_client_options *opts,
                         pd_status *st) {
  pd_client_options o = PD_CLIENT_OPTIONS_INITIALIZER;
  if (pdc_client_options(target, opts, &o, st) != PD_OK) return NULL;
  pd_client *c = calloc(1, sizeof(*c));
  if (!c) {
    pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return NULL;
  }
  /* "tls://host:port": TLS to host:port (the rest is checked as any). */
  bool tls_scheme = strncmp(target, "tls://", 6) == 0;
  if (tls_scheme && !target[6]) {
    pdc_error(st, PD_INVALID_ARGUMENT,
              "target \"tls://\" has no address; expected tls://host:port");
    goto fail_target;
  }
  if (pdc_target(tls_scheme ? target + 6 : target, &c->target, st) != PD_OK)
    goto fail_target;
  bool unix_target = strncmp(c->target, "unix", 4) == 0;
  if (tls_scheme && unix_target) {
    pdc_error(st, PD_INVALID_ARGUMENT,
              "target \"%s\": TLS is for TCP; a Unix socket is local and "
              "plaintext (drop tls://)",
              target);
    goto fail_security;
  }
  c->max_message_bytes =
      o.max_message_bytes ? o.max_message_bytes : PDC_DEFAULT_MAX_MESSAGE;
  c->default_timeout_ms =
      o.default_timeout_ms ? o.default_timeout_ms : PDC_DEFAULT_TIMEOUT_MS;
  c->chunk_bytes_opt = o.chunk_bytes ? o.chunk_bytes : PDC_DEFAULT_CHUNK;
  pthread_mutex_init(&c->mu, NULL);
  grpc_init();
  grpc_channel_credentials *creds = NULL;
  if (pdc_security_init(c, &o, tls_scheme, unix_target, &creds, st) != PD_OK)
    goto fail_channel;
  pd_code code = pdc_channel_open(c, &o, creds, st);
  grpc_channel_credentials_release(creds);
  if (code != PD_OK) goto fail_channel;
  pdc_ok(st);
  return c;

fail_channel:
  if (c->channel) grpc_channel_destroy(c->channel);
  pdc_security_free(c);
  grpc_shutdown();
  pthread_mutex_destroy(&c->mu);
fail_security:
  free(c->target);
fail_target:
  free(c);
  return NULL;
}

void pd_client_delete(pd_client *c) {
  if (!c) return;
  grpc_channel_destroy(c->channel);
  pdc_security_free(c);
  grpc_shutdown();
  pthread_mutex_destroy(&c->mu);
  free(c->target);
  free(c);
}

const char *pd_client_target(const pd_client *c) { return c ? c->target : ""; }

int pd_client_tls(const pd_client *c) { return c && c->sec.tls; }
