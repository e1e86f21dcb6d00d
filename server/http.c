/* The HTTP listener (libmicrohttpd, its own thread, its own address from
 * [daemon] metrics_listen): GET /metrics (Prometheus), /healthz (liveness,
 * srv_alive: the process is alive, its devices healthy and runnable work
 * making progress; a drain leaves it 200: for liveness probes) and /readyz
 * (readiness, srv_serving: it takes new sessions and new work: for
 * readiness probes and load balancers).
 *
 * Probes must answer even while other clients hold connections open: the
 * listener takes at most metrics_max_connections at once, at most
 * metrics_max_connections_per_ip from one client address (libmicrohttpd
 * closes the ones over either at once), and closes a connection idle for
 * metrics_idle_timeout_seconds. */
#define SRV_LOG_SUB SRV_SUB_HTTP
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "log.h"
#include "server.h"

static enum MHD_Result srv_http_send(struct MHD_Connection *conn,
                                     unsigned status, const char *type,
                                     char *body, size_t len) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  enum MHD_Result ret = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result srv_http_text(struct MHD_Connection *conn,
                                     unsigned status, const char *text) {
  char *body = strdup(text);
  if (!body) return MHD_NO;
  return srv_http_send(conn, status, "text/plain; charset=utf-8", body,
                       strlen(body));
}

static enum MHD_Result srv_http_handler(void *cls, struct MHD_Connection *conn,
                                        const char *url, const char *method,
                                        const char *version,
                                        const char *upload_data,
                                        size_t *upload_data_size,
                                        void **con_cls) {
  (void)version;
  (void)upload_data;
  srv *s = cls;
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    if (*upload_data_size) { /* swallow a body: it is refused anyway */
      *upload_data_size = 0;
      return MHD_YES;
    }
    if (!*con_cls) {
      *con_cls = (void *)1;
      return MHD_YES;
    }
    return srv_http_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                         "only GET and HEAD\n");
  }
  if (strcmp(url, "/metrics") == 0) {
    size_t len = 0;
    char *body = srv_metrics_render(s, &len);
    if (!body)
      return srv_http_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                           "out of memory\n");
    return srv_http_send(conn, MHD_HTTP_OK,
                         "text/plain; version=0.0.4; charset=utf-8", body, len);
  }
  if (strcmp(url, "/healthz") == 0) {
    if (!atomic_load(&s->devices_ok))
      return srv_http_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                           "unhealthy: a device failed\n");
    if (!srv_alive(s))
      return srv_http_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                           "stalled: runnable work makes no progress\n");
    return srv_http_text(conn, MHD_HTTP_OK, "ok\n");
  }
  if (strcmp(url, "/readyz") == 0) {
    if (srv_serving(s)) return srv_http_text(conn, MHD_HTTP_OK, "ready\n");
    char msg[128];
    snprintf(msg, sizeof(msg), "not ready: %s\n",
             !atomic_load(&s->devices_ok) ? "a device failed"
             : !srv_alive(s)              ? "stalled"
             : !atomic_load(&s->ready)    ? "starting"
                                          : "draining");
    return srv_http_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
  }
  return srv_http_text(conn, MHD_HTTP_NOT_FOUND,
                       "not found: paradevd serves /metrics, /healthz and "
                       "/readyz\n");
}

/* Refused connections (over a limit) are logged once a minute at most,
 * with how many there were: a client opening connections in a loop must
 * not flood the log. */
#define SRV_HTTP_REFUSED_LOG_S 60
static _Atomic int64_t srv_http_refused_at = -1; /* s, CLOCK_MONOTONIC */
static _Atomic uint64_t srv_http_refused_quiet;

static bool srv_http_log_refused(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t last = atomic_load(&srv_http_refused_at);
  if (last >= 0 && ts.tv_sec - last < SRV_HTTP_REFUSED_LOG_S) {
    atomic_fetch_add(&srv_http_refused_quiet, 1);
    return false;
  }
  return atomic_compare_exchange_strong(&srv_http_refused_at, &last,
                                        (int64_t)ts.tv_sec);
}

static void srv_http_log(void *cls, const char *fmt, va_list ap) {
  const srv *s = cls;
  char msg[512];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') msg[--n] = '\0';
  if (strstr(msg, "connection limit") || strstr(msg, "per-IP")) {
    if (!srv_http_log_refused()) return;
    uint64_t quiet = atomic_exchange(&srv_http_refused_quiet, 0);
    char more[96] = "";
    if (quiet)
      snprintf(more, sizeof more, "; %llu more refused in the last %d s",
               (unsigned long long)quiet, SRV_HTTP_REFUSED_LOG_S);
    SRV_WARN(
        "libmicrohttpd: %s (metrics_max_connections %d, "
        "metrics_max_connections_per_ip %d%s; logged once a minute at "
        "most)",
        msg, s->opt.metrics_max_connections,
        s->opt.metrics_max_connections_per_ip, more);
    return;
  }
  SRV_WARN("libmicrohttpd: %s", msg);
}

int srv_http_start(srv *s) {
  const char *addr = s->opt.metrics_listen;
  if (!addr[0]) return 0;
  char host[SRV_ADDR_MAX];
  const char *colon = strrchr(addr, ':');
  snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
  char *h = host;
  if (h[0] == '[') { /* [::1] */
    h++;
    h[strlen(h) - 1] = '\0';
  }
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int rc = getaddrinfo(h, colon + 1, &hints, &res);
  if (rc != 0 || !res) {
    SRV_ERROR("metrics_listen %s: cannot resolve '%s': %s", addr, h,
              gai_strerror(rc));
    return -1;
  }
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (res->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, 0, NULL, NULL, srv_http_handler, s, MHD_OPTION_EXTERNAL_LOGGER,
      srv_http_log, (void *)s, MHD_OPTION_SOCK_ADDR, res->ai_addr,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->opt.metrics_max_connections,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)s->opt.metrics_max_connections_per_ip,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opt.metrics_idle_timeout_s,
      MHD_OPTION_END);
  freeaddrinfo(res);
  if (!d) {
    SRV_ERROR(
        "cannot listen on %s for /metrics (address in use or not "
        "local?); set [daemon] metrics_listen or --metrics-listen",
        addr);
    return -1;
  }
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  s->http_port = info ? info->port : 0;
  s->http = d;
  /* At every log level, as the gRPC addresses (a port picked for :0). */
  srv_log_write(SRV_SUB_CORE, SRV_LOG_INFO, __FILE__, __LINE__,
                "metrics on http://%.*s:%d/metrics (also /healthz, /readyz)",
                (int)(colon - addr), addr, s->http_port);
  return 0;
}

void srv_http_stop(srv *s) {
  if (s->http) MHD_stop_daemon(s->http);
  s->http = NULL;
}
