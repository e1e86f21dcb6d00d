/* The load workers: a small pool of threads (sched_config.load_workers,
 * default 2) that run the pieces of checkpoint loads (loads.c) and the
 * writes of saves (saves.c) from one FIFO, and the records of a session's
 * loads and saves (sched_io), which the session's end cancels.
 *
 * Work runs through its own function pointer, so this file calls no other
 * scheduler file. A session's end marks its records cancelled and runs the
 * work of it still queued on the ending thread, where it sees the
 * cancellation and ends at once (pending tensors complete with CANCELLED);
 * work already running stops at its next chunk. sched_destroy waits for
 * every load and save to end before stopping the threads (sched_io_begin /
 * sched_io_end count them).
 *
 * The open workers (SCHED_OPEN_WORKERS threads, their own FIFO) run the
 * opens and indexes of loads begun with sched_load_begin_async: storage
 * I/O that may stall on a source until its call's deadline, kept off the
 * RPC threads and off the load workers, so a stalled source delays neither
 * the daemon nor the reads of other loads. A session's end does not run
 * them (they see their record's `cancelled`, and the storage's fetches
 * abort on it). Lock: sched.io_mu (sched_int.h, 3b) for both FIFOs. */
#include <stdlib.h>

#include "sched_int.h"

/* One FIFO's worker loop (io_mu guards both FIFOs). */
static void sched_worker_loop(sched *s, sched_work **head, sched_work **tail,
                              pthread_cond_t *cv) {
  pthread_mutex_lock(&s->io_mu);
  for (;;) {
    while (!*head && !s->io_stop) pthread_cond_wait(cv, &s->io_mu);
    if (!*head) break; /* stopping, and nothing left */
    sched_work *w = *head;
    *head = w->next;
    if (!*head) *tail = NULL;
    w->next = NULL;
    pthread_mutex_unlock(&s->io_mu);
    w->run(w);
    pthread_mutex_lock(&s->io_mu);
  }
  pthread_mutex_unlock(&s->io_mu);
}

static void *sched_worker_main(void *arg) {
  sched *s = arg;
  sched_worker_loop(s, &s->io_head, &s->io_tail, &s->io_cv);
  return NULL;
}

static void *sched_open_main(void *arg) {
  sched *s = arg;
  sched_worker_loop(s, &s->open_head, &s->open_tail, &s->open_cv);
  return NULL;
}

static void sched_workers_join(sched *s, int n, int n_open) {
  pthread_mutex_lock(&s->io_mu);
  s->io_stop = true;
  pthread_cond_broadcast(&s->io_cv);
  pthread_cond_broadcast(&s->open_cv);
  pthread_mutex_unlock(&s->io_mu);
  for (int i = 0; i < n; i++) pthread_join(s->io_threads[i], NULL);
  for (int i = 0; i < n_open; i++) pthread_join(s->open_threads[i], NULL);
  free(s->io_threads);
  free(s->open_threads);
  s->io_threads = s->open_threads = NULL;
  s->n_io_threads = s->n_open_threads = 0;
  pthread_cond_destroy(&s->open_cv);
}

bool sched_workers_start(sched *s, int n) {
  pthread_cond_init(&s->open_cv, NULL);
  s->io_threads = calloc((size_t)n, sizeof(*s->io_threads));
  s->open_threads = calloc(SCHED_OPEN_WORKERS, sizeof(*s->open_threads));
  if (!s->io_threads || !s->open_threads) {
    sched_workers_join(s, 0, 0);
    return false;
  }
  if (!s->load_chunk) s->load_chunk = SCHED_LOAD_CHUNK;
  for (int i = 0; i < n; i++) {
    if (pthread_create(&s->io_threads[i], NULL, sched_worker_main, s) != 0) {
      sched_workers_join(s, i, 0);
      return false;
    }
  }
  for (int i = 0; i < SCHED_OPEN_WORKERS; i++) {
    if (pthread_create(&s->open_threads[i], NULL, sched_open_main, s) != 0) {
      sched_workers_join(s, n, i);
      return false;
    }
  }
  s->n_io_threads = n;
  s->n_open_threads = SCHED_OPEN_WORKERS;
  return true;
}

void sched_workers_stop(sched *s) {
  pthread_mutex_lock(&s->io_mu);
  while (s->io_live > 0) pthread_cond_wait(&s->io_idle_cv, &s->io_mu);
  pthread_mutex_unlock(&s->io_mu);
  sched_workers_join(s, s->n_io_threads, s->n_open_threads);
}

void sched_io_begin(sched *s) {
  pthread_mutex_lock(&s->io_mu);
  s->io_live++;
  pthread_mutex_unlock(&s->io_mu);
}

void sched_io_end(sched *s) {
  pthread_mutex_lock(&s->io_mu);
  if (--s->io_live == 0) pthread_cond_broadcast(&s->io_idle_cv);
  pthread_mutex_unlock(&s->io_mu);
}

void sched_work_queue(sched *s, sched_work *w) {
  w->next = NULL;
  pthread_mutex_lock(&s->io_mu);
  if (s->io_tail)
    s->io_tail->next = w;
  else
    s->io_head = w;
  s->io_tail = w;
  pthread_cond_signal(&s->io_cv);
  pthread_mutex_unlock(&s->io_mu);
}

void sched_open_queue(sched *s, sched_work *w) {
  w->next = NULL;
  pthread_mutex_lock(&s->io_mu);
  if (s->open_tail)
    s->open_tail->next = w;
  else
    s->open_head = w;
  s->open_tail = w;
  pthread_cond_signal(&s->open_cv);
  pthread_mutex_unlock(&s->io_mu);
}

/* Unlinks the queued work of `ss` (io_mu held), in queue order. */
static sched_work *sched_unqueue_session_locked(sched *s, sched_session *ss) {
  sched_work *mine = NULL, **tail = &mine, *last = NULL;
  for (sched_work **pp = &s->io_head; *pp;) {
    sched_work *w = *pp;
    if (w->ss == ss) {
      *pp = w->next;
      w->next = NULL;
      *tail = w;
      tail = &w->next;
    } else {
      last = w;
      pp = &w->next;
    }
  }
  s->io_tail = last;
  return mine;
}

void sched_io_cancel_session(sched_session *ss) {
  sched *s = ss->owner;
  pthread_mutex_lock(&ss->mu); /* a failed begin may leave the list */
  bool any = ss->io != NULL;
  for (sched_io *io = ss->io; io; io = io->next)
    atomic_store(&io->cancelled, true);
  pthread_mutex_unlock(&ss->mu);
  if (!any) return;
  pthread_mutex_lock(&s->io_mu);
  sched_work *w = sched_unqueue_session_locked(s, ss);
  pthread_mutex_unlock(&s->io_mu);
  while (w) {
    sched_work *next = w->next;
    w->run(w); /* sees `cancelled`; may free w */
    w = next;
  }
}

void sched_io_ref(sched_io *io) { atomic_fetch_add(&io->refs, 1); }

void sched_io_unref(sched_io *io) {
  if (io && atomic_fetch_sub(&io->refs, 1) == 1) io->free(io);
}

void sched_io_add_locked(sched_session *ss, sched_io *io) {
  io->next = ss->io;
  ss->io = io;
  int kept = 0;
  for (sched_io **pp = &ss->io; *pp;) {
    sched_io *r = *pp;
    bool done = atomic_load(&r->finished);
    if (done && (!r->is_load || ++kept > SCHED_LOADS_KEPT)) {
      *pp = r->next;
      sched_io_unref(r);
    } else {
      pp = &r->next;
    }
  }
}

void sched_io_remove(sched_session *ss, sched_io *io) {
  bool found = false;
  pthread_mutex_lock(&ss->mu);
  for (sched_io **pp = &ss->io; *pp; pp = &(*pp)->next) {
    if (*pp == io) {
      *pp = io->next;
      io->next = NULL;
      found = true;
      break;
    }
  }
  pthread_mutex_unlock(&ss->mu);
  if (found) sched_io_unref(io);
}

void sched_io_release_all(sched_session *ss) {
  while (ss->io) {
    sched_io *r = ss->io;
    ss->io = r->next;
    sched_io_unref(r);
  }
}

void sched_set_load_hook(sched *s, sched_load_hook_fn fn, void *arg,
                         size_t chunk_bytes) {
  s->hook = fn;
  s->hook_arg = arg;
  s->load_chunk = chunk_bytes ? chunk_bytes : SCHED_LOAD_CHUNK;
}
