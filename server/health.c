/* grpc.health.v1.Health's methods, Check and Watch, for four services
 * (service.c holds the state they report):
 *
 *   "paradev.liveness"   the process is alive and not wedged: every device
 *                        healthy, runnable work making progress. A drain
 *                        leaves it SERVING. For liveness probes, which
 *                        restart the daemon when it fails.
 *   "paradev.readiness"  live, and it takes new sessions and new work (not
 *                        draining, started). For readiness probes and load
 *                        balancers.
 *   "", "paradev.v1.ParallelDevice"
 *                        the same as paradev.readiness: what a client of
 *                        the ParallelDevice service wants to know (and what
 *                        a probe that names no service gets). Never point a
 *                        liveness probe at these: a drain turns them
 *                        NOT_SERVING.
 *
 * Watch streams stay open: each is on service.c's list, which holds a
 * reference on its call, and a change of either status wakes every one
 * (srv_call_wake) so that the new status is written from the call's own
 * thread (each writes only when its own service's status changed). */
#define SRV_LOG_SUB SRV_SUB_HEALTH
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"
#include "paradev/v1/methods.h"
#include "server.h"

#define SRV_SERVICE PD_SVC_PARALLEL_DEVICE
#define SRV_LIVENESS "paradev.liveness"
#define SRV_READINESS "paradev.readiness"
#define H_SERVING                                                              \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define H_NOT_SERVING                                                          \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
#define H_UNKNOWN                                                              \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

/* --- Check -------------------------------------------------------------------- */

/* What a service name asks about. */
typedef enum { SRV_SVC_UNKNOWN = 0, SRV_SVC_READY, SRV_SVC_LIVE } srv_svc;

static srv_svc srv_service_of(const char *svc) {
  if (svc[0] == '\0' || strcmp(svc, SRV_SERVICE) == 0 ||
      strcmp(svc, SRV_READINESS) == 0)
    return SRV_SVC_READY;
  if (strcmp(svc, SRV_LIVENESS) == 0) return SRV_SVC_LIVE;
  return SRV_SVC_UNKNOWN;
}

static int srv_status_of(srv *s, srv_svc svc) {
  switch (svc) {
    case SRV_SVC_READY: return srv_serving(s) ? H_SERVING : H_NOT_SERVING;
    case SRV_SVC_LIVE: return srv_alive(s) ? H_SERVING : H_NOT_SERVING;
    default: return H_UNKNOWN;
  }
}

static void srv_health_check(srv_call *c, const ProtobufCMessage *m) {
  const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
  const char *svc = req->service ? req->service : "";
  srv_svc which = srv_service_of(svc);
  if (which == SRV_SVC_UNKNOWN) {
    char clean[201];
    srv_call_finish(c, PD_NOT_FOUND,
                    "unknown service \"%s\"; this server has "
                    "\"" SRV_LIVENESS
                    "\" (alive, not wedged), "
                    "\"" SRV_READINESS
                    "\" (takes new work), and \"\" and "
                    "\"" SRV_SERVICE "\" (both the same as readiness)",
                    srv_log_clean(svc, clean, sizeof clean));
    return;
  }
  Grpc__Health__V1__HealthCheckResponse resp =
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status =
      (Grpc__Health__V1__HealthCheckResponse__ServingStatus)srv_status_of(
          c->s, which);
  srv_call_reply(c, &resp.base);
}

const srv_handlers srv_h_Check = {.on_request = srv_health_check};

/* --- Watch ---------------------------------------------------------------------- */

typedef struct srv_watch_state {
  srv_svc svc;
  bool listed;
  int last; /* the status last written, -1: none */
} srv_watch_state;

static void srv_watch_unlist(srv_call *c) {
  srv_watch_state *w = c->user;
  if (!w || !w->listed) return;
  w->listed = false;
  srv_health_watch_remove(c->s, c); /* the running handler holds another */
}

static void srv_watch_send(srv_call *c) {
  srv_watch_state *w = c->user;
  int now = srv_status_of(c->s, w->svc);
  if (now == w->last) return;
  w->last = now;
  Grpc__Health__V1__HealthCheckResponse resp =
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)now;
  srv_call_write(c, &resp.base);
}

static void srv_health_watch(srv_call *c, const ProtobufCMessage *m) {
  const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
  const char *svc = req->service ? req->service : "";
  srv_watch_state *w = calloc(1, sizeof(*w));
  if (!w) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->user = w;
  w->svc = srv_service_of(svc);
  w->last = -1;
  bool closing = !srv_health_watch_add(c->s, c, &w->listed);
  srv_watch_send(c);
  if (closing)
    srv_call_finish(c, PD_OK, "%s", "");
  else if (!w->listed)
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
}

/* A change, or the server closing: on the call's thread. */
static void srv_health_watch_wake(srv_call *c) {
  bool closing = srv_health_closing(c->s);
  srv_watch_send(c);
  if (closing) {
    srv_watch_unlist(c);
    srv_call_finish(c, PD_OK, "%s", "");
  }
}

static void srv_health_watch_cancel(srv_call *c) {
  srv_watch_unlist(c);
  srv_call_finish_cancelled(c, "Watch");
}

static void srv_health_watch_destroy(srv_call *c) {
  free(c->user);
  c->user = NULL;
}

const srv_handlers srv_h_Watch = {.on_request = srv_health_watch,
                                  .on_destroy = srv_health_watch_destroy,
                                  .on_wake = srv_health_watch_wake,
                                  .on_cancel = srv_health_watch_cancel};
