/* libparadev: statuses (pd_status, pdc_error) and the library's version.
 * The first file of the client: it calls no other. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "client_int.h"

const char *pd_version(void) { return "0.1.0"; }

/* --- status ---------------------------------------------------------------- */

pd_status *pd_status_new(void) { return calloc(1, sizeof(pd_status)); }

void pd_status_delete(pd_status *s) { free(s); }

pd_code pd_status_code(const pd_status *s) { return s ? s->code : PD_OK; }

const char *pd_status_message(const pd_status *s) { return s ? s->msg : ""; }

void pd_status_set(pd_status *s, pd_code code, const char *msg) {
  if (!s) return;
  s->code = code;
  snprintf(s->msg, sizeof(s->msg), "%s", msg ? msg : "");
}

pd_code pdc_error(pd_status *st, pd_code code, const char *fmt, ...) {
  if (st) {
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof(st->msg), fmt, ap);
    va_end(ap);
  }
  return code;
}

void pdc_ok(pd_status *st) {
  if (st) {
    st->code = PD_OK;
    st->msg[0] = '\0';
  }
}

const char *pd_status_str(pd_code code) {
  switch (code) {
    case PD_OK: return "success";
    case PD_CANCELLED:
      return "the call was cancelled; retry if it is still wanted";
    case PD_UNKNOWN: return "unknown error; see the daemon's log";
    case PD_INVALID_ARGUMENT: return "fix the request as the message says";
    case PD_DEADLINE_EXCEEDED:
      return "the deadline passed; raise the timeout or check the daemon's "
             "load";
    case PD_NOT_FOUND:
      return "the session or handle does not exist (closed, expired, deleted, "
             "or "
             "the daemon restarted); open a new session";
    case PD_ALREADY_EXISTS: return "pick an id that is not in use";
    case PD_PERMISSION_DENIED: return "not allowed; check permissions";
    case PD_RESOURCE_EXHAUSTED:
      return "a limit or memory ran out; free handles or ask for less";
    case PD_FAILED_PRECONDITION:
      return "the object is not in a state for this call";
    case PD_ABORTED: return "aborted; retry";
    case PD_OUT_OF_RANGE:
      return "a value or buffer is out of range; see the message";
    case PD_UNIMPLEMENTED:
      return "the daemon does not implement this; upgrade it";
    case PD_INTERNAL:
      return "a bug in paradev; please report it with the daemon's log";
    case PD_UNAVAILABLE:
      return "check that paradevd runs and listens on this address, then retry";
    case PD_DATA_LOSS: return "data was lost or corrupted in transit; retry";
    case PD_UNAUTHENTICATED:
      return "the daemon did not accept the caller's identity or token: see "
             "the message";
  }
  return "unknown status code";
}

/* The daemon's UNAUTHENTICATED refusals (server/auth.c, tokens.c, jobs.c,
 * scheduler/sessions.c) are about three things: who the caller is (no
 * identity where one is required, a bearer token refused or not taken), a
 * job token, or a session token. The message tells which. */
static const char *pdc_unauthenticated_hint(const char *msg) {
  if (strstr(msg, "session token"))
    return "the session token is malformed; open a new session";
  if (strstr(msg, "job token") || strstr(msg, "job_token"))
    return "present the job's current token ($PARADEV_JOB_TOKEN or "
           "job_token: the Slurm prolog's file), or open the session without "
           "one";
  if (strstr(msg, "takes no bearer tokens"))
    return "this daemon takes no bearer token: drop --token-file, or unset "
           "$PARADEV_TOKEN_FILE and $PARADEV_TOKEN for it";
  return "identify with a bearer token (--token-file or $PARADEV_TOKEN_FILE) "
         "or a client certificate and its key (--tls-cert and --tls-key, or "
         "$PARADEV_TLS_CERT and $PARADEV_TLS_KEY)";
}

/* Whether an UNAVAILABLE message is about reaching the daemon: libparadev
 * frames every transport failure "cannot reach TARGET: ..." (client/call.c)
 * and a TLS failure "TLS handshake with TARGET failed: ..."; a message set
 * by hand (pd_status_set) may be gRPC's own words ("connection refused") or
 * none. The daemon's own UNAVAILABLE (it was reached) reads otherwise. */
static bool pdc_unavailable_is_transport(const char *msg) {
  static const char *const starts[] = {
      "connection refused", "failed to connect", "socket closed",
      "connection reset",   "no such file",      "unavailable",
      "broken pipe"};
  if (!msg[0] || strstr(msg, "cannot reach ") || strstr(msg, "TLS handshake"))
    return true;
  for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++)
    if (strncasecmp(msg, starts[i], strlen(starts[i])) == 0) return true;
  return false;
}

const char *pd_status_hint(const pd_status *s) {
  pd_code code = pd_status_code(s);
  const char *msg = s ? s->msg : "";
  if (code == PD_UNAUTHENTICATED) return pdc_unauthenticated_hint(msg);
  if (code == PD_UNAVAILABLE && strstr(msg, "paradevd is draining"))
    return "paradevd takes no new work while it drains: see the message";
  if (code == PD_UNAVAILABLE && !pdc_unavailable_is_transport(msg)) {
    if (strstr(msg, "the mesh "))
      return "the daemon's mesh across machines is not whole: open a new "
             "session once every rank has attached again (paradev info "
             "lists the missing ranks)";
    return "the daemon answered that it cannot do this now: see the message, "
           "then retry";
  }
  return pd_status_str(code);
}

/* pd_code_name, pd_dtype_* (paradev/types.h) are defined in types.c. */

pd_code pdc_code_from_wire(int64_t code) {
  return code >= 0 && code <= PD_UNAUTHENTICATED ? (pd_code)code : PD_UNKNOWN;
}
