/* The service's state, which health reports and every part may change:
 * ready, draining (and exiting), the devices' health and memory, the
 * SERVING / NOT_SERVING status as last announced, and the list of open
 * health Watch streams that a change wakes (srv_call_wake), so that the new
 * status is written from each call's own thread (health.c). */
#define SRV_LOG_SUB SRV_SUB_HEALTH
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"

struct srv_health {
  pthread_mutex_t mu; /* guards everything below */
  bool serving;       /* as last announced */
  bool closing;
  srv_call **watch;
  size_t n, cap;
  bool dev_ok[PD_MAX_DEVICES];
};

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
  int n = dev_engine_num_devices(s->engine);
  bool all = true;
  srv_health *h = s->health;
  for (int i = 0; i < n && i < PD_MAX_DEVICES; i++) {
    bool ok = dev_engine_device_healthy(s->engine, i);
    all &= ok;
    if (h && ok != h->dev_ok[i]) {
      h->dev_ok[i] = ok;
      if (ok)
        SRV_INFO("device %d (%s) is healthy again", i,
                 dev_engine_device_name(s->engine, i));
      else
        SRV_ERROR(
            "device %d (%s) is unhealthy: its ops fail until paradevd "
            "restarts",
            i, dev_engine_device_name(s->engine, i));
    }
  }
  return all;
}

uint64_t srv_device_memory_used(srv *s) {
  uint64_t sum = 0;
  int n = dev_engine_num_devices(s->engine);
  for (int i = 0; i < n; i++) {
    dev_memory_stats ms = {.struct_size = sizeof(ms)};
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

bool srv_health_watch_add(srv *s, srv_call *c, bool *listed) {
  srv_health *h = s->health;
  *listed = false;
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
    *listed = true;
  }
  pthread_mutex_unlock(&h->mu);
  return !closing;
}

void srv_health_watch_remove(srv *s, srv_call *c) {
  srv_health *h = s->health;
  pthread_mutex_lock(&h->mu);
  for (size_t i = 0; i < h->n; i++)
    if (h->watch[i] == c) {
      h->watch[i] = h->watch[--h->n];
      break;
    }
  pthread_mutex_unlock(&h->mu);
  srv_call_unref(c); /* the list's */
}

bool srv_health_closing(srv *s) {
  srv_health *h = s->health;
  pthread_mutex_lock(&h->mu);
  bool closing = h->closing;
  pthread_mutex_unlock(&h->mu);
  return closing;
}
