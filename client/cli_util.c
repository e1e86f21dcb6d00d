/* What the `paradev` commands share (cli_cmd.h): usage errors, failed
 * calls' reports, the channel, byte counts for people, device lists
 * (--devices 0,2 or cpu:0,cpu:2, names mapped through GetServerInfo). Calls
 * no other file of the command. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli_cmd.h"

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  fprintf(stderr, "paradev%s%s: ", cmd ? " " : "", cmd ? cmd : "");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry 'paradev %s%s--help'.\n", cmd ? cmd : "",
          cmd ? " " : "");
  return 2;
}

char *cli_size(uint64_t bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%" PRIu64 " B", bytes);
  else
    snprintf(buf, len, "%.1f %s", v, units[u]);
  return buf;
}

/* The advice for `code` after command `cmd` where the caller gives none:
 * load, save and ops read files and names, not sessions or handles, so
 * NOT_FOUND and UNIMPLEMENTED there get their own words (or none: the
 * message says it); the others get pd_status_hint (its code's advice, or
 * the message's: an identity refused, a draining daemon). NULL: no hint. */
static const char *cli_default_hint(const char *cmd, const pd_status *st) {
  pd_code code = pd_status_code(st);
  const char *msg = pd_status_message(st);
  bool ckpt = !strcmp(cmd, "load") || !strcmp(cmd, "save");
  if (ckpt && code == PD_NOT_FOUND)
    return "check the path, the names and the storage roots ('paradev "
           "info' lists them)";
  if (ckpt && code == PD_UNIMPLEMENTED)
    return "not supported by this daemon: see the message";
  if (!strcmp(cmd, "ops") && code == PD_NOT_FOUND)
    return "'paradev ops' lists the ops";
  if (code == PD_UNAVAILABLE && strstr(msg, "TLS handshake"))
    return "the connection's TLS settings: see above";
  if ((ckpt || !strcmp(cmd, "ops")) &&
      (code == PD_NOT_FOUND || code == PD_UNIMPLEMENTED))
    return NULL;
  return pd_status_hint(st);
}

/* Reports a failed call on stderr with `hint` (NULL: the command's default,
 * cli_default_hint); returns 1. */
int cli_fail_hint(const char *cmd, const pd_status *st, const char *hint) {
  pd_code code = pd_status_code(st);
  if (!hint) hint = cli_default_hint(cmd, st);
  if (!hint) {
    fprintf(stderr, "paradev %s: %s\n", cmd, pd_status_message(st));
    fprintf(stderr, "paradev %s: %s\n", cmd, pd_code_name(code));
    return 1;
  }
  fprintf(stderr, "paradev %s: %s\n", cmd, pd_status_message(st));
  fprintf(stderr, "paradev %s: %s (%s)\n", cmd, pd_code_name(code), hint);
  return 1;
}

int cli_fail(const char *cmd, const pd_status *st) {
  return cli_fail_hint(cmd, st, NULL);
}

/* Opens the channel; NULL after reporting why, with *rc set: 2 when the
 * target itself is wrong (a usage error: pd_client_new says
 * INVALID_ARGUMENT only for the target, the options here being fixed; the
 * message says when the target came from $PARADEV_TARGET), else 1. */
pd_client *cli_connect(const cli_opts *o, const char *cmd, pd_status *st,
                       int *rc) {
  pd_client_options co = PD_CLIENT_OPTIONS_INITIALIZER;
  co.default_timeout_ms = o->timeout_ms;
  co.user_agent = "paradev-cli";
  co.tls_ca_file = o->tls_ca;
  co.tls_cert_file = o->tls_cert;
  co.tls_key_file = o->tls_key;
  co.tls_server_name = o->tls_server_name;
  co.token_file = o->token_file;
  pd_client *c = pd_client_new(o->target, &co, st);
  if (c) return c;
  if (pd_status_code(st) == PD_INVALID_ARGUMENT)
    *rc = cli_usage_error(
        NULL, "%s%s", pd_status_message(st),
        o->target_from_env ? " (the target came from $PARADEV_TARGET)" : "");
  else
    *rc = cli_fail(cmd, st);
  return NULL;
}

/* --- device lists (issue #17) ------------------------------------------------ */

/* True when `tok` (len bytes) names device d: its whole name, or the part
 * before " (" ("cpu:2" of "cpu:2 (simulated)"), ignoring case. */
static bool cli_device_name_is(const pd_device_info *d, const char *tok,
                               size_t len) {
  const char *name = d->name ? d->name : "";
  const char *paren = strstr(name, " (");
  size_t short_len = paren ? (size_t)(paren - name) : strlen(name);
  return (len == strlen(name) && strncasecmp(name, tok, len) == 0) ||
         (len == short_len && strncasecmp(name, tok, len) == 0);
}

/* Device `tok` (len bytes) by name through `info` (fetched on first use into
 * *info); the index, -1 after reporting (*rc set). */
static int cli_device_by_name(pd_client *c, const char *cmd, const char *opt,
                              const char *tok, size_t len,
                              pd_server_info **info, pd_status *st, int *rc) {
  if (!*info && !(*info = pd_client_get_server_info(c, NULL, st))) {
    *rc = cli_fail(cmd, st);
    return -1;
  }
  int n = pd_server_info_num_devices(*info);
  for (int i = 0; i < n; i++) {
    const pd_device_info *d = pd_server_info_device(*info, i);
    if (cli_device_name_is(d, tok, len)) return d->index;
  }
  char names[512] = "";
  size_t at = 0;
  for (int i = 0; i < n && at < sizeof(names) - 40; i++) {
    const pd_device_info *d = pd_server_info_device(*info, i);
    const char *paren = strstr(d->name, " (");
    int sl = paren ? (int)(paren - d->name) : (int)strlen(d->name);
    at += (size_t)snprintf(names + at, sizeof(names) - at, "%s%d or %.*s",
                           i ? ", " : "", d->index, sl, d->name);
  }
  *rc = cli_usage_error(cmd, "%s: no device '%.*s'; the daemon has %s", opt,
                        (int)len, tok, n ? names : "none");
  return -1;
}

int cli_parse_devices(pd_client *c, const char *cmd, const char *opt,
                      const char *spec, int32_t *out, int *n, pd_status *st) {
  pd_server_info *info = NULL;
  int rc = 0, k = 0;
  const char *p = spec;
  while (rc == 0) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char *num_end = NULL;
    long v = len ? strtol(p, &num_end, 10) : -1;
    if (len == 0 || k == PD_MAX_DEVICES) {
      rc = cli_usage_error(cmd,
                           "%s '%s': expected device indices or names as "
                           "'paradev info' shows them (0,2 or cpu:0,cpu:2), "
                           "separated by commas, at most %d",
                           opt, spec, PD_MAX_DEVICES);
    } else if (num_end == p + len && v >= 0 && v <= INT32_MAX) {
      out[k++] = (int32_t)v;
    } else if (num_end == p + len) {
      rc = cli_usage_error(cmd, "%s: device %ld is negative", opt, v);
    } else {
      int idx = cli_device_by_name(c, cmd, opt, p, len, &info, st, &rc);
      if (idx >= 0) out[k++] = idx;
    }
    if (!end) break;
    p = end + 1;
  }
  pd_server_info_delete(info);
  *n = k;
  return rc;
}

char *cli_devices_str(const int32_t *devices, int n, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < n && at < len; i++)
    at +=
        (size_t)snprintf(buf + at, len - at, "%s%d", i ? ", " : "", devices[i]);
  if (at < len) snprintf(buf + at, len - at, "]");
  return buf;
}
