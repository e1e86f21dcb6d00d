/* libparadev: the client: checking a target, opening the channel and
 * registering every method on it (pdc_method_paths, methods.c). */
#include <grpc/grpc_security.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

#define PDC_DEFAULT_MAX_MESSAGE ((uint64_t)64 << 20)
#define PDC_DEFAULT_TIMEOUT_MS 60000
#define PDC_DEFAULT_CHUNK ((uint64_t)1 << 20)
#define PDC_TARGET_MAX 4096

/* Checks a port's digits: gRPC reads a port past 65535 modulo 65536
 * (127.0.0.1:99999 dials port 34463) and cannot dial port 0: refuse both,
 * and an empty port. Names that are not digits are left to gRPC. */
static pd_code pdc_check_port(const char *target, const char *port,
                              pd_status *st) {
  size_t n = strlen(port);
  if (n == 0)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "target \"%s\": the port is empty; expected host:port "
                     "(port 1 to 65535), host (port %d) or unix:/path",
                     target, PD_DEFAULT_PORT);
  if (strspn(port, "0123456789") != n) return PD_OK;
  unsigned long v = n > 9 ? 0 : strtoul(port, NULL, 10);
  if (v >= 1 && v <= 65535) return PD_OK;
  return pdc_error(st, PD_INVALID_ARGUMENT,
                   "target \"%s\": port %s is out of range; a port must be 1 "
                   "to 65535",
                   target, port);
}

/* The address gRPC dials for `target` (a new string in *out):
 *  - "unix:..." and "unix-abstract:..." as they are;
 *  - a path, "/..." or "./..." or "../...", is a Unix socket: "unix:PATH";
 *  - "host:port", "[v6]:port" and "scheme:///host:port" as they are, once
 *    the port is checked;
 *  - "host", "[v6]" and "scheme:///host" get paradevd's port,
 *    PD_DEFAULT_PORT (gRPC's own default would be 443);
 * anything else (a bare IPv6 address, other schemes) is left to gRPC. */
static pd_code pdc_target(const char *target, char **out, pd_status *st) {
  const char *prefix = "", *a = target;
  char port[16] = "";
  if (strncmp(target, "unix:", 5) == 0 ||
      strncmp(target, "unix-abstract:", 14) == 0) {
    if (target[5] == '\0')
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "target \"unix:\" has no path; expected \"unix:/path\"");
  } else if (target[0] == '/' || strncmp(target, "./", 2) == 0 ||
             strncmp(target, "../", 3) == 0) {
    prefix = "unix:";
  } else {
    const char *slashes = strstr(a, "///");
    if (slashes) a = slashes + 3;
    const char *colon = NULL;
    if (a[0] == '[') {
      const char *rb = strchr(a, ']');
      if (rb && rb[1] == ':')
        colon = rb + 1;
      else if (rb && rb[1] == '\0')
        snprintf(port, sizeof(port), ":%d", PD_DEFAULT_PORT);
    } else if (!(colon = strchr(a, ':'))) {
      snprintf(port, sizeof(port), ":%d", PD_DEFAULT_PORT);
    } else if (strchr(colon + 1, ':')) {
      colon = NULL; /* a bare IPv6 address, or a scheme of gRPC's */
    }
    if (colon) PD_TRY(pdc_check_port(target, colon + 1, st));
  }
  size_t n = strlen(prefix) + strlen(target) + strlen(port) + 1;
  if (!(*out = malloc(n)))
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  snprintf(*out, n, "%s%s%s", prefix, target, port);
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
                                pd_status *st) {
  grpc_arg args[3];
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
  grpc_channel_args chargs = {nargs, args};
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  c->channel = grpc_channel_create(c->target, creds, &chargs);
  grpc_channel_credentials_release(creds);
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
  if (pdc_target(target, &c->target, st) != PD_OK) goto fail_target;
  c->max_message_bytes =
      o.max_message_bytes ? o.max_message_bytes : PDC_DEFAULT_MAX_MESSAGE;
  c->default_timeout_ms =
      o.default_timeout_ms ? o.default_timeout_ms : PDC_DEFAULT_TIMEOUT_MS;
  c->chunk_bytes_opt = o.chunk_bytes ? o.chunk_bytes : PDC_DEFAULT_CHUNK;
  pthread_mutex_init(&c->mu, NULL);
  grpc_init();
  if (pdc_channel_open(c, &o, st) != PD_OK) goto fail_channel;
  pdc_ok(st);
  return c;

fail_channel:
  if (c->channel) grpc_channel_destroy(c->channel);
  grpc_shutdown();
  pthread_mutex_destroy(&c->mu);
  free(c->target);
fail_target:
  free(c);
  return NULL;
}

void pd_client_delete(pd_client *c) {
  if (!c) return;
  grpc_channel_destroy(c->channel);
  grpc_shutdown();
  pthread_mutex_destroy(&c->mu);
  free(c->target);
  free(c);
}

const char *pd_client_target(const pd_client *c) { return c ? c->target : ""; }
