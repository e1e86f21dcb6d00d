/* libparadev: cancellation tokens (pd_cancel) and the registry of the calls
 * in flight with each, which pd_cancel_trigger cancels. */
#include <stdlib.h>

#include "client_int.h"

/* --- cancellation ------------------------------------------------------------ */

pd_cancel *pd_cancel_new(void) {
  pd_cancel *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->triggered, false);
  return c;
}

void pd_cancel_trigger(pd_cancel *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  atomic_store(&c->triggered, true);
  for (size_t i = 0; i < c->n; i++) grpc_call_cancel(c->calls[i], NULL);
  pthread_mutex_unlock(&c->mu);
}

bool pd_cancel_is_triggered(const pd_cancel *c) {
  return c && atomic_load(&((pd_cancel *)c)->triggered);
}

void pd_cancel_delete(pd_cancel *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  free(c->calls);
  free(c);
}

/* Registers a call with a token: PD_CANCELLED when the token was already
 * triggered, PD_RESOURCE_EXHAUSTED when out of memory. */
pd_code pdc_cancel_add(pd_cancel *c, grpc_call *call, pd_status *st) {
  pthread_mutex_lock(&c->mu);
  if (atomic_load(&c->triggered)) {
    pthread_mutex_unlock(&c->mu);
    return pdc_error(st, PD_CANCELLED, "cancelled by the caller (pd_cancel)");
  }
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 8;
    grpc_call **n = realloc(c->calls, cap * sizeof(*n));
    if (!n) {
      pthread_mutex_unlock(&c->mu);
      return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    }
    c->calls = n;
    c->cap = cap;
  }
  c->calls[c->n++] = call;
  pthread_mutex_unlock(&c->mu);
  return PD_OK;
}

void pdc_cancel_remove(pd_cancel *c, grpc_call *call) {
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < c->n; i++)
    if (c->calls[i] == call) {
      c->calls[i] = c->calls[--c->n];
      break;
    }
  pthread_mutex_unlock(&c->mu);
}
