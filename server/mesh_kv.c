/* The mesh's key-value store on the coordinator (issue #16): Mesh.KvSet and
 * Mesh.KvGet for the other ranks, and the same store read and written
 * directly by the coordinator's own collective transport (the rendezvous
 * of Gloo's contexts: dev_gloo.h dev_mesh_kv). A KvGet whose key is not
 * there yet waits without holding a queue thread: the call is listed, a
 * KvSet of its key wakes it (srv_call_wake), the coordinator's timer thread
 * wakes it once its timeout passed (srv_mesh_kv_tick), and on_wake answers
 * on the call's own thread. Set overwrites. Keys and values live until
 * the daemon stops (one epoch's rendezvous is a few keys per rank).
 *
 * Source: torch.distributed's TCPStore (set, get that waits), Gloo's
 * rendezvous::Store. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SRV_LOG_SUB SRV_SUB_CORE
#include "log.h"
#include "mesh_int.h"
#include "paradev/v1/mesh.pb-c.h"

typedef struct srv_kv_entry {
  char *key;
  uint8_t *val;
  size_t len;
  struct srv_kv_entry *next;
} srv_kv_entry;

/* A waiting KvGet (the call's user state). */
typedef struct srv_kv_wait {
  srv_mesh_kv *kv;
  srv_call *c;
  double deadline;
  bool listed; /* in kv->waiters, holding a call reference */
  struct srv_kv_wait *next;
} srv_kv_wait;

struct srv_mesh_kv {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a key was set, or the store closed */
  srv_kv_entry *head;
  srv_kv_wait *waiters;
  bool closed;
  size_t bytes;
};

#define SRV_KV_MAX_BYTES ((size_t)64 << 20) /* keys and values, all together */

srv_mesh_kv *srv_mesh_kv_new(srv *s) {
  (void)s;
  srv_mesh_kv *kv = calloc(1, sizeof *kv);
  if (!kv) return NULL;
  pthread_mutex_init(&kv->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&kv->cv, &ca);
  pthread_condattr_destroy(&ca);
  return kv;
}

void srv_mesh_kv_free(srv_mesh_kv *kv) {
  if (!kv) return;
  for (srv_kv_entry *e = kv->head, *n; e; e = n) {
    n = e->next;
    free(e->key);
    free(e->val);
    free(e);
  }
  pthread_mutex_destroy(&kv->mu);
  pthread_cond_destroy(&kv->cv);
  free(kv);
}

static srv_kv_entry *srv_kv_find(srv_mesh_kv *kv, const char *key) {
  for (srv_kv_entry *e = kv->head; e; e = e->next)
    if (strcmp(e->key, key) == 0) return e;
  return NULL;
}

/* Unlists and wakes the waiters that match (`key` NULL: those whose
 * deadline passed at `now`, or all when the store closed). mu held. */
static void srv_kv_wake(srv_mesh_kv *kv, const char *key, double now) {
  srv_kv_wait **pp = &kv->waiters;
  while (*pp) {
    srv_kv_wait *w = *pp;
    const Paradev__V1__KvGetRequest *r = (const void *)w->c->req;
    bool hit = key ? strcmp(r->key, key) == 0
                   : kv->closed || now >= w->deadline;
    if (!hit) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    w->listed = false;
    srv_call_wake(w->c);
    srv_call_unref(w->c);
  }
}

static pd_code srv_kv_put(srv_mesh_kv *kv, const char *key, const void *value,
                          size_t len, dev_status *st) {
  pthread_mutex_lock(&kv->mu);
  srv_kv_entry *e = srv_kv_find(kv, key);
  size_t old = e ? e->len : 0;
  if (kv->bytes - old + len + strlen(key) > SRV_KV_MAX_BYTES) {
    pthread_mutex_unlock(&kv->mu);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the mesh's key-value store holds at most %zu bytes",
                     SRV_KV_MAX_BYTES);
  }
  uint8_t *v = malloc(len ? len : 1);
  if (!v || (!e && !(e = calloc(1, sizeof *e)))) {
    free(v);
    pthread_mutex_unlock(&kv->mu);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  if (!e->key) {
    if (!(e->key = strdup(key))) {
      free(v);
      free(e);
      pthread_mutex_unlock(&kv->mu);
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    }
    e->next = kv->head;
    kv->head = e;
    kv->bytes += strlen(key);
  }
  if (len) memcpy(v, value, len);
  free(e->val);
  e->val = v;
  kv->bytes = kv->bytes - old + len;
  e->len = len;
  srv_kv_wake(kv, key, 0);
  pthread_cond_broadcast(&kv->cv);
  pthread_mutex_unlock(&kv->mu);
  return PD_OK;
}

pd_code srv_mesh_kv_local_set(void *arg, const char *key, const void *value,
                              size_t len, dev_status *st) {
  return srv_kv_put(arg, key, value, len, st);
}

pd_code srv_mesh_kv_local_get(void *arg, const char *key, double timeout_s,
                              void **value, size_t *len, dev_status *st) {
  srv_mesh_kv *kv = arg;
  double deadline = srv_mesh_now() + (timeout_s > 0 ? timeout_s : 0);
  struct timespec ts = {(time_t)deadline,
                        (long)((deadline - (double)(time_t)deadline) * 1e9)};
  pthread_mutex_lock(&kv->mu);
  srv_kv_entry *e;
  while (!(e = srv_kv_find(kv, key)) && !kv->closed &&
         srv_mesh_now() < deadline)
    pthread_cond_timedwait(&kv->cv, &kv->mu, &ts);
  if (!e) {
    bool closed = kv->closed;
    pthread_mutex_unlock(&kv->mu);
    if (closed)
      return dev_error(st, PD_UNAVAILABLE,
                       "the mesh's key-value store is closing (the "
                       "coordinator stops)");
    return dev_error(st, PD_NOT_FOUND,
                     "mesh key-value store: key '%s' did not appear within "
                     "%.1f s",
                     key, timeout_s);
  }
  *value = malloc(e->len ? e->len : 1);
  if (!*value) {
    pthread_mutex_unlock(&kv->mu);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  memcpy(*value, e->val, e->len);
  *len = e->len;
  pthread_mutex_unlock(&kv->mu);
  return PD_OK;
}

void srv_mesh_kv_tick(srv_mesh_kv *kv, double now) {
  if (!kv) return;
  pthread_mutex_lock(&kv->mu);
  if (kv->waiters) srv_kv_wake(kv, NULL, now);
  pthread_mutex_unlock(&kv->mu);
}

void srv_mesh_kv_close(srv_mesh_kv *kv) {
  if (!kv) return;
  pthread_mutex_lock(&kv->mu);
  kv->closed = true;
  srv_kv_wake(kv, NULL, 0);
  pthread_cond_broadcast(&kv->cv);
  pthread_mutex_unlock(&kv->mu);
}

/* --- the methods --------------------------------------------------------------- */

/* The store, for a call that carries the mesh's secret (when it has one);
 * NULL after ending the call. */
static srv_mesh_kv *srv_kv_of(srv_call *c) {
  srv_mesh *m = c->s->mesh;
  if (!m || !m->kv) {
    srv_call_finish(c, PD_FAILED_PRECONDITION,
                    "this daemon is not a mesh's coordinator");
    return NULL;
  }
  if (!srv_mesh_call_secret_ok(m, &c->md)) {
    SRV_WARN("mesh: refused a key-value call without the mesh's secret");
    srv_call_finish(c, PD_PERMISSION_DENIED,
                    "the mesh's key-value store needs the mesh's shared "
                    "secret ([mesh] secret_file)");
    return NULL;
  }
  return m->kv;
}

static void srv_kvset(srv_call *c, const ProtobufCMessage *msg) {
  const Paradev__V1__KvSetRequest *r = (const void *)msg;
  srv_mesh_kv *kv = srv_kv_of(c);
  dev_status st = DEV_STATUS_INIT;
  if (!kv) return;
  if (!r->key || !r->key[0]) {
    srv_call_finish(c, PD_INVALID_ARGUMENT, "KvSet: the key is empty");
    return;
  }
  if (srv_kv_put(kv, r->key, r->value.data, r->value.len, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  Paradev__V1__KvSetResponse resp = PARADEV__V1__KV_SET_RESPONSE__INIT;
  srv_call_reply(c, &resp.base);
}

/* Answers from the store, or lists the call (mu held). True when done. */
static bool srv_kvget_try(srv_call *c, srv_kv_wait *w) {
  const Paradev__V1__KvGetRequest *r = (const void *)c->req;
  srv_mesh_kv *kv = w->kv;
  pthread_mutex_lock(&kv->mu);
  srv_kv_entry *e = srv_kv_find(kv, r->key);
  if (e) {
    Paradev__V1__KvGetResponse resp = PARADEV__V1__KV_GET_RESPONSE__INIT;
    resp.value.data = e->val;
    resp.value.len = e->len;
    srv_call_reply(c, &resp.base); /* packed now, under the lock */
    pthread_mutex_unlock(&kv->mu);
    return true;
  }
  if (kv->closed || srv_mesh_now() >= w->deadline) {
    bool closed = kv->closed;
    pthread_mutex_unlock(&kv->mu);
    if (closed)
      srv_call_finish(c, PD_UNAVAILABLE,
                      "the coordinator is stopping: its key-value store is "
                      "closed");
    else
      srv_call_finish(c, PD_NOT_FOUND,
                      "mesh key-value store: key '%s' did not appear within "
                      "%u ms",
                      r->key, r->timeout_ms);
    return true;
  }
  srv_call_ref(c);
  w->listed = true;
  w->next = kv->waiters;
  kv->waiters = w;
  pthread_mutex_unlock(&kv->mu);
  return false;
}

static void srv_kvget(srv_call *c, const ProtobufCMessage *msg) {
  const Paradev__V1__KvGetRequest *r = (const void *)msg;
  srv_mesh_kv *kv = srv_kv_of(c);
  if (!kv) return;
  if (!r->key || !r->key[0]) {
    srv_call_finish(c, PD_INVALID_ARGUMENT, "KvGet: the key is empty");
    return;
  }
  srv_kv_wait *w = calloc(1, sizeof *w);
  if (!w) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  w->kv = kv;
  w->c = c;
  w->deadline = srv_mesh_now() + r->timeout_ms / 1000.0;
  c->user = w;
  srv_kvget_try(c, w);
}

static void srv_kvget_wake(srv_call *c) {
  srv_kv_wait *w = c->user;
  if (w && !w->listed) srv_kvget_try(c, w);
}

static void srv_kvget_cancel(srv_call *c) {
  srv_kv_wait *w = c->user;
  if (!w) return;
  pthread_mutex_lock(&w->kv->mu);
  bool drop = false;
  if (w->listed) {
    for (srv_kv_wait **pp = &w->kv->waiters; *pp; pp = &(*pp)->next)
      if (*pp == w) {
        *pp = w->next;
        break;
      }
    w->listed = false;
    drop = true;
  }
  pthread_mutex_unlock(&w->kv->mu);
  srv_call_finish_cancelled(c, "KvGet");
  if (drop) srv_call_unref(c);
}

static void srv_kv_destroy(srv_call *c) {
  free(c->user);
  c->user = NULL;
}

const srv_handlers srv_h_KvSet = {.on_request = srv_kvset};
const srv_handlers srv_h_KvGet = {.on_request = srv_kvget,
                                  .on_wake = srv_kvget_wake,
                                  .on_cancel = srv_kvget_cancel,
                                  .on_destroy = srv_kv_destroy,
                                  .early_close = true};
