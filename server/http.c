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
 * closes the ones over either at once), closes a connection idle for
 * metrics_idle_timeout_seconds (libmicrohttpd: the idle time restarts
 * with every byte), and (the request deadline, here) closes one that has
 * not delivered a whole request's headers metrics_idle_timeout_seconds
 * after it opened or after its last request, however slowly it trickles
 * bytes (a slowloris client). The deadline: MHD_OPTION_NOTIFY_CONNECTION
 * lists every connection with its deadline (srv_http_conn), the access
 * handler moves it on at each request, and a thread of ours shuts down
 * (shutdown(2)) the sockets past theirs; libmicrohttpd then sees the end
 * of the stream and closes the connection itself. libmicrohttpd 0.9.75
 * runs the NOTIFY_CLOSED callback before it closes the socket, and the
 * callback unlists it under the guard's lock, so the thread never shuts
 * down a closed (or reused) descriptor.
 *
 * When the listener is full (libmicrohttpd then accepts no more), each new
 * connection shuts down the listed one whose deadline is nearest (it has
 * waited longest for a request: srv_http_evict), so a probe queued behind
 * held connections is taken at once. Clients of many addresses opening
 * connections faster than a probe sends its request could still crowd it
 * out; the shipped DaemonSet's probes therefore do not use this port (exec
 * probes over a Unix socket of the pod alone:
 * deploy/kubernetes/daemonset.yaml). */
#define SRV_LOG_SUB SRV_SUB_HTTP
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "log.h"
#include "mesh.h"
#include "server.h"

/* --- the request deadline ---------------------------------------------- */

typedef struct srv_http_conn {
  struct srv_http_conn *prev, *next;
  int fd;
  int64_t deadline_ms; /* CLOCK_MONOTONIC */
  bool cut;            /* shut down by the guard */
} srv_http_conn;

typedef struct srv_http_guard {
  pthread_mutex_t mu; /* guards the list, stop */
  pthread_cond_t cv;
  srv_http_conn head; /* the list's sentinel */
  bool stop;
  int64_t limit_ms; /* metrics_idle_timeout_seconds */
  int live;         /* listed and not cut */
  int max_live;     /* metrics_max_connections */
  pthread_t thread;
} srv_http_guard;

static int64_t srv_http_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Log lines about refused or cut connections, once a minute at most each,
 * with how many there were: a client opening connections in a loop must
 * not flood the log. */
#define SRV_HTTP_QUIET_LOG_S 60
typedef struct srv_http_quiet {
  _Atomic int64_t at; /* s, CLOCK_MONOTONIC; -1: never */
  _Atomic uint64_t quiet;
} srv_http_quiet;

static srv_http_quiet srv_http_refused = {-1, 0}, srv_http_cut = {-1, 0},
                      srv_http_evicted = {-1, 0};

/* Counts n events; true when a line may be logged now, then *events is
 * the number since the last line (these n included). Any thread. */
static bool srv_http_may_log(srv_http_quiet *q, uint64_t n, uint64_t *events) {
  atomic_fetch_add(&q->quiet, n);
  int64_t now = srv_http_now_ms() / 1000;
  int64_t last = atomic_load(&q->at);
  if (last >= 0 && now - last < SRV_HTTP_QUIET_LOG_S) return false;
  if (!atomic_compare_exchange_strong(&q->at, &last, now)) return false;
  *events = atomic_exchange(&q->quiet, 0);
  return true;
}

/* The listener is full (libmicrohttpd accepts no more until one closes):
 * shuts down the listed connection, other than `fresh`, whose deadline is
 * nearest (the one that has waited longest for a request), so that a new
 * connection (a probe queued behind others) is taken soon, and clients
 * that hold connections open only delay it. True when one was cut. With
 * the guard's lock. */
static bool srv_http_evict(srv_http_guard *g, const srv_http_conn *fresh) {
  srv_http_conn *oldest = NULL;
  /* From the oldest (the list's tail): of equal deadlines, the first. */
  for (srv_http_conn *c = g->head.prev; c != &g->head; c = c->prev)
    if (c != fresh && !c->cut &&
        (!oldest || c->deadline_ms < oldest->deadline_ms))
      oldest = c;
  if (!oldest) return false;
  shutdown(oldest->fd, SHUT_RDWR);
  oldest->cut = true;
  g->live--;
  return true;
}

static void srv_http_notify(void *cls, struct MHD_Connection *conn,
                            void **socket_context,
                            enum MHD_ConnectionNotificationCode code) {
  srv_http_guard *g = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    srv_http_conn *c = ci ? calloc(1, sizeof(*c)) : NULL;
    *socket_context = c;
    if (!c) return; /* out of memory: only the idle timeout applies */
    c->fd = ci->connect_fd;
    pthread_mutex_lock(&g->mu);
    c->deadline_ms = srv_http_now_ms() + g->limit_ms;
    c->next = g->head.next;
    c->prev = &g->head;
    g->head.next->prev = c;
    g->head.next = c;
    bool evicted = ++g->live >= g->max_live && srv_http_evict(g, c);
    pthread_mutex_unlock(&g->mu);
    uint64_t events = 0;
    if (evicted && srv_http_may_log(&srv_http_evicted, 1, &events))
      SRV_WARN(
          "the metrics port is full (metrics_max_connections %d): closed "
          "%llu connection%s that had waited longest for a request, to make "
          "room for new ones (logged once a minute at most)",
          g->max_live, (unsigned long long)events, events == 1 ? "" : "s");
    return;
  }
  srv_http_conn *c = *socket_context;
  if (!c) return;
  pthread_mutex_lock(&g->mu);
  if (!c->cut) g->live--;
  c->prev->next = c->next;
  c->next->prev = c->prev;
  pthread_mutex_unlock(&g->mu);
  free(c);
  *socket_context = NULL;
}

/* A request's headers arrived whole: the next one has until now + the
 * limit. libmicrohttpd's thread. */
static void srv_http_request_arrived(srv *s, struct MHD_Connection *conn) {
  srv_http_guard *g = s->http_guard;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  srv_http_conn *c = ci ? ci->socket_context : NULL;
  if (!g || !c) return;
  pthread_mutex_lock(&g->mu);
  c->deadline_ms = srv_http_now_ms() + g->limit_ms;
  pthread_mutex_unlock(&g->mu);
}

/* Shuts down every listed connection past its deadline; how many. */
static unsigned srv_http_cut_late(srv_http_guard *g, int64_t now) {
  unsigned n = 0;
  for (srv_http_conn *c = g->head.next; c != &g->head; c = c->next)
    if (!c->cut && c->deadline_ms <= now) {
      shutdown(c->fd, SHUT_RDWR);
      c->cut = true;
      g->live--;
      n++;
    }
  return n;
}

static void *srv_http_guard_main(void *arg) {
  srv *s = arg;
  srv_http_guard *g = s->http_guard;
  pthread_mutex_lock(&g->mu);
  while (!g->stop) {
    unsigned n = srv_http_cut_late(g, srv_http_now_ms());
    if (n) {
      pthread_mutex_unlock(&g->mu);
      uint64_t events = 0;
      if (srv_http_may_log(&srv_http_cut, n, &events))
        SRV_WARN(
            "closed %llu connection%s to the metrics port that had not sent "
            "a whole request within metrics_idle_timeout_seconds (%lld s) "
            "of opening or of its last request (logged once a minute at "
            "most)",
            (unsigned long long)events, events == 1 ? "" : "s",
            (long long)(g->limit_ms / 1000));
      pthread_mutex_lock(&g->mu);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 250 * 1000000L; /* the deadline's resolution */
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&g->cv, &g->mu, &until);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static srv_http_guard *srv_http_guard_new(srv *s) {
  srv_http_guard *g = calloc(1, sizeof(*g));
  if (!g) return NULL;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->head.next = g->head.prev = &g->head;
  g->limit_ms = (int64_t)s->opt.metrics_idle_timeout_s * 1000;
  g->max_live = s->opt.metrics_max_connections;
  return g;
}

static void srv_http_guard_free(srv_http_guard *g) {
  if (!g) return;
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

/* --- requests --------------------------------------------------------------- */

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
  if (!*con_cls && !*upload_data_size) srv_http_request_arrived(s, conn);
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
    const char *why = srv_liveness_cause(s);
    if (!why) return srv_http_text(conn, MHD_HTTP_OK, "ok\n");
    char msg[256];
    snprintf(msg, sizeof(msg), "%s\n", why);
    return srv_http_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
  }
  if (strcmp(url, "/readyz") == 0) {
    if (srv_serving(s)) return srv_http_text(conn, MHD_HTTP_OK, "ready\n");
    /* The first word of the liveness cause: "a device failed", "stalled",
     * "wedged", "wedged and stalled". */
    const char *why = srv_liveness_cause(s);
    char cause[64];
    if (why && !atomic_load(&s->devices_ok))
      snprintf(cause, sizeof(cause), "%s", "a device failed");
    else if (why)
      snprintf(cause, sizeof(cause), "%.*s", (int)strcspn(why, ":"), why);
    char msg[128];
    snprintf(msg, sizeof(msg), "not ready: %s\n",
             why                       ? cause
             : !atomic_load(&s->ready) ? "starting"
             : atomic_load(&s->draining) ? "draining"
             : s->mesh && srv_mesh_degraded(s->mesh) ? "mesh degraded"
                                                     : "mesh not formed");
    return srv_http_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
  }
  return srv_http_text(conn, MHD_HTTP_NOT_FOUND,
                       "not found: paradevd serves /metrics, /healthz and "
                       "/readyz\n");
}

static void srv_http_log(void *cls, const char *fmt, va_list ap) {
  const srv *s = cls;
  char msg[512];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') msg[--n] = '\0';
  if (strstr(msg, "connection limit") || strstr(msg, "per-IP")) {
    uint64_t events = 0;
    if (!srv_http_may_log(&srv_http_refused, 1, &events)) return;
    uint64_t quiet = events - 1;
    char more[96] = "";
    if (quiet)
      snprintf(more, sizeof more, "; %llu more refused in the last %d s",
               (unsigned long long)quiet, SRV_HTTP_QUIET_LOG_S);
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
  srv_http_guard *g = srv_http_guard_new(s);
  if (!g) {
    freeaddrinfo(res);
    SRV_ERROR("metrics_listen %s: out of host memory", addr);
    return -1;
  }
  s->http_guard = g;
  /* One internal thread (not a thread per connection): the access handler
   * and the notifications run on it. */
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (res->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, 0, NULL, NULL, srv_http_handler, s, MHD_OPTION_EXTERNAL_LOGGER,
      srv_http_log, (void *)s, MHD_OPTION_SOCK_ADDR, res->ai_addr,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->opt.metrics_max_connections,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)s->opt.metrics_max_connections_per_ip,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opt.metrics_idle_timeout_s,
      MHD_OPTION_NOTIFY_CONNECTION, srv_http_notify, (void *)g, MHD_OPTION_END);
  freeaddrinfo(res);
  if (d && pthread_create(&g->thread, NULL, srv_http_guard_main, s) != 0) {
    MHD_stop_daemon(d);
    d = NULL;
  }
  if (!d) {
    s->http_guard = NULL;
    srv_http_guard_free(g);
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
  if (!s->http) return;
  MHD_stop_daemon(s->http); /* every connection unlisted */
  s->http = NULL;
  srv_http_guard *g = s->http_guard;
  pthread_mutex_lock(&g->mu);
  g->stop = true;
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
  pthread_join(g->thread, NULL);
  s->http_guard = NULL;
  srv_http_guard_free(g);
}
