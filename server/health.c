/* grpc.health.v1.Health for "" and "paradev.v1.ParallelDevice" (both say
 * the same: whether this daemon takes new work), the drain state, and the
 * devices' health.
 *
 * Watch streams stay open: each is on a list that holds a reference on its
 * call, and a change of status wakes every one (srv_call_wake) so that the
 * new status is written from the call's own thread. */
#define SRV_LOG_SUB SRV_SUB_HEALTH
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"
#include "paradev/v1/methods.h"
#include "server.h"

struct srv_health {
  pthread_mutex_t mu; /* guards everything below */
  bool serving;       /* as last announced */
  bool closing;
  srv_call **watch;
  size_t n, cap;
  bool dev_ok[PD_MAX_DEVICES];
};

#define SRV_SERVICE PD_SVC_PARALLEL_DEVICE
#define H_SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define H_NOT_SERVING \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
#define H_UNKNOWN \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

int srv_health_init(srv *s) {
  srv_health *h = calloc(1, sizeof(*h));
  if (!h) return -1;
  pthread_mutex_init(&h->mu, NULL);
  for (int i = 0; i < PD_MAX_DEVICES; i++) h->dev_ok[i] = true;
  s->health = h;
  atomic_store(&s->devices_ok, true);
  return 0;
}

void srv_health_destroy(srv *s) {
  srv_health *h = s->health;
  if (!h) return;
  free(h->watch);
  pthread_mutex_destroy(&h->mu);
  free(h);
  s->health = NULL;
}

bool srv_serving(srv *s) {
  return atomic_load(&s->ready) && !atomic_load(&s->draining) &&
         atomic_load(&s->devices_ok) && !atomic_load(&s->stalled);
}

static const char *srv_why_not(srv *s) {
  if (!atomic_load(&s->ready)) return "not ready";
  if (atomic_load(&s->draining))
    return atomic_load(&s->exiting) ? "draining to exit" : "draining";
  if (!atomic_load(&s->devices_ok)) return "a device is unhealthy";
  return "the devices make no progress";
}

void srv_health_update(srv *s) {
  srv_health *h = s->health;
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  bool now = srv_serving(s);
  if (now != h->serving) {
    h->serving = now;
    if (now)
      SRV_INFO("SERVING");
    else
      SRV_INFO("NOT_SERVING: %s", srv_why_not(s));
    for (size_t i = 0; i < h->n; i++) srv_call_wake(h->watch[i]);
  }
  pthread_mutex_unlock(&h->mu);
}

void srv_health_close(srv *s) {
  srv_health *h = s->health;
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  h->closing = true;
  for (size_t i = 0; i < h->n; i++) srv_call_wake(h->watch[i]);
  pthread_mutex_unlock(&h->mu);
}

bool srv_devices_healthy(srv *s) {
  dev_backend *b = dev_engine_backend(s->engine);
  int n = dev_engine_num_devices(s->engine);
  bool all = true;
  bool has = b && b->struct_size >= offsetof(dev_backend, healthy) +
                                        sizeof(b->healthy) &&
             b->healthy;
  srv_health *h = s->health;
  for (int i = 0; i < n && i < PD_MAX_DEVICES; i++) {
    bool ok = !has || b->healthy(b, i);
    all &= ok;
    if (h && ok != h->dev_ok[i]) {
      h->dev_ok[i] = ok;
      if (ok)
        SRV_INFO("device %d (%s) is healthy again", i,
                 b->device_name ? b->device_name(b, i) : "?");
      else
        SRV_ERROR("device %d (%s) is unhealthy: its ops fail until paradevd "
                  "restarts",
                  i, b->device_name ? b->device_name(b, i) : "?");
    }
  }
  return all;
}

uint64_t srv_device_memory_used(srv *s) {
  uint64_t sum = 0;
  int n = dev_engine_num_devices(s->engine);
  for (int i = 0; i < n; i++) {
    dev_memory_stats ms = {sizeof(ms), 0, 0, 0, 0, 0};
    if (dev_engine_memory_stats(s->engine, i, &ms, NULL) == PD_OK)
      sum += ms.bytes_in_use;
  }
  return sum;
}

bool srv_drain(srv *s, bool exit) {
  bool was = atomic_exchange(&s->draining, true);
  if (exit) atomic_store(&s->exiting, true);
  srv_health_update(s);
  return !was;
}

bool srv_resume(srv *s) {
  if (atomic_load(&s->exiting) || !atomic_load(&s->draining)) return false;
  atomic_store(&s->draining, false);
  srv_health_update(s);
  return true;
}

/* --- Check -------------------------------------------------------------------- */

static bool srv_known_service(const char *svc) {
  return svc[0] == '\0' || strcmp(svc, SRV_SERVICE) == 0;
}

static void srv_health_check(srv_call *c, const ProtobufCMessage *m) {
  const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
  const char *svc = req->service ? req->service : "";
  if (!srv_known_service(svc)) {
    char clean[201];
    srv_call_finish(c, PD_NOT_FOUND,
                    "unknown service \"%s\"; this server has \"\" and "
                    "\"" SRV_SERVICE "\"",
                    srv_log_clean(svc, clean, sizeof clean));
    return;
  }
  Grpc__Health__V1__HealthCheckResponse resp =
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = srv_serving(c->s) ? H_SERVING : H_NOT_SERVING;
  srv_call_reply(c, &resp.base);
}

const srv_handlers srv_h_Check = {.on_request = srv_health_check};

/* --- Watch ---------------------------------------------------------------------- */

typedef struct srv_watch_state {
  bool known;
  bool listed;
  int last; /* the status last written, -1: none */
} srv_watch_state;

static void srv_watch_unlist(srv_call *c) {
  srv_watch_state *w = c->user;
  srv_health *h = c->s->health;
  if (!w || !w->listed) return;
  pthread_mutex_lock(&h->mu);
  for (size_t i = 0; i < h->n; i++)
    if (h->watch[i] == c) {
      h->watch[i] = h->watch[--h->n];
      break;
    }
  pthread_mutex_unlock(&h->mu);
  w->listed = false;
  srv_call_unref(c); /* the list's; the running handler holds another */
}

static void srv_watch_send(srv_call *c) {
  srv_watch_state *w = c->user;
  int now = w->known ? (srv_serving(c->s) ? H_SERVING : H_NOT_SERVING)
                     : H_UNKNOWN;
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
  srv_health *h = c->s->health;
  if (!w) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->user = w;
  w->known = srv_known_service(svc);
  w->last = -1;
  pthread_mutex_lock(&h->mu);
  bool closing = h->closing;
  if (!closing && h->n == h->cap) {
    size_t ncap = h->cap ? h->cap * 2 : 8;
    srv_call **nw = realloc(h->watch, ncap * sizeof(*nw));
    if (nw) {
      h->watch = nw;
      h->cap = ncap;
    }
  }
  if (!closing && h->n < h->cap) {
    srv_call_ref(c);
    h->watch[h->n++] = c;
    w->listed = true;
  }
  pthread_mutex_unlock(&h->mu);
  srv_watch_send(c);
  if (closing)
    srv_call_finish(c, PD_OK, "%s", "");
  else if (!w->listed)
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
}

/* A change, or the server closing: on the call's thread. */
static void srv_health_watch_wake(srv_call *c) {
  srv_health *h = c->s->health;
  pthread_mutex_lock(&h->mu);
  bool closing = h->closing;
  pthread_mutex_unlock(&h->mu);
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
