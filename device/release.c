/* Freeing what a failed op left on the other devices: when one device's
 * component of an output failed (an allocation over its limit, a kernel
 * error), the components its peers computed are of no use (every consumer
 * fails on the failed device, and a download reads every component), so
 * each peer's executor frees its own between ops and marks it failed with
 * the same code and message. Also the executor hold the tests use to let one device
 * run far ahead of another. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec_int.h"

/* The first failed component of `t`, or -1. Reads the codes the executors
 * wrote before they dropped their op's `pending` hold (acquire order there). */
static int first_failed(const dev_tensor *t) {
  for (int d = 0; d < t->n; d++)
    if (t->comps[d].code != PD_OK) return d;
  return -1;
}

void dev__exec_release_failed(dev_engine *e, dev_op *op) {
  if (e->n < 2) return;
  for (int i = 0; i < op->num_outputs; i++) {
    dev_tensor *t = op->outputs[i];
    int f = first_failed(t);
    if (f < 0) continue;
    for (int d = 0; d < t->n; d++) {
      if (d == f || t->comps[d].code != PD_OK) continue;
      dev__released *r = malloc(sizeof *r);
      if (!r) return; /* freed with the tensor instead */
      dev_tensor_retain(t);
      r->t = t;
      r->code = t->comps[f].code;
      dev_exec *x = &e->execs[dev__comp_device(t, d)];
      pthread_mutex_lock(&x->mu);
      r->next = x->released;
      x->released = r;
      if (x->sleeping) pthread_cond_signal(&x->work_cv);
      pthread_mutex_unlock(&x->mu);
    }
  }
}

void dev__exec_drain_released(dev_exec *x) {
  dev__released *r = x->released;
  x->released = NULL;
  if (!r) return;
  pthread_mutex_unlock(&x->mu);
  while (r) {
    dev__released *next = r->next;
    dev_tensor *t = r->t;
    const int d = dev__slot(t, x->device); /* the component on this device */
    int f = first_failed(t);
    char msg[DEV_STATUS_MSG_MAX];
    snprintf(msg, sizeof msg, "%s",
             f >= 0 && t->comps[f].msg ? t->comps[f].msg : "");
    if (x->fenced) pthread_mutex_lock(&x->mu);
    if (t->comps[d].code == PD_OK)
      dev__component_set_error(&t->comps[d], r->code, msg);
    if (x->fenced) pthread_mutex_unlock(&x->mu);
    dev_tensor_release(t);
    free(r);
    r = next;
  }
  pthread_mutex_lock(&x->mu);
}

void dev__exec_hold(dev_engine *e, int device, bool hold) {
  dev_exec *x = &e->execs[device];
  pthread_mutex_lock(&x->mu);
  x->held = hold;
  if (!hold) pthread_cond_signal(&x->work_cv);
  pthread_mutex_unlock(&x->mu);
}

void dev_engine_test_hold(dev_engine *e, int device, bool hold) {
  if (e && device >= 0 && device < e->n) dev__exec_hold(e, device, hold);
}
