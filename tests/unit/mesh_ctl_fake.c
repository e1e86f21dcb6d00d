/* The control plane's test double: see mesh_ctl_fake.h. */
#include "mesh_ctl_fake.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server.h"

#define FAKE_BATCH 64

typedef struct fake_msg {
  struct fake_msg *next;
  int rank; /* the sender (to the coordinator) */
  size_t len;
  uint8_t data[];
} fake_msg;

typedef struct fake_queue {
  fake_msg *head, *tail;
  bool busy; /* a batch is being delivered */
} fake_queue;

struct srv_mesh {
  fake_world *w;
  int rank;
  void *data;
  srv s;
};

struct fake_world {
  int world, per_rank;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* any change: work queued, delivered, stop */
  bool stop;
  srv_mesh **m;
  fake_queue *q; /* [world]: q[0] is the coordinator's inbound queue */
  bool *paused, *detached;
  unsigned long *sent;
  pthread_t *threads;
  int nthreads;
};

typedef struct fake_thread_arg {
  fake_world *w;
  int rank;
} fake_thread_arg;

static fake_msg *fake_msg_new(int rank, const uint8_t *p, size_t len) {
  fake_msg *m = malloc(sizeof *m + (len ? len : 1));
  if (!m) return NULL;
  m->next = NULL;
  m->rank = rank;
  m->len = len;
  if (len) memcpy(m->data, p, len);
  return m;
}

static void fake_push(fake_world *w, int q, fake_msg *m) {
  if (w->q[q].tail)
    w->q[q].tail->next = m;
  else
    w->q[q].head = m;
  w->q[q].tail = m;
  pthread_cond_broadcast(&w->cv);
}

static void fake_free_list(fake_msg *m) {
  while (m) {
    fake_msg *n = m->next;
    free(m);
    m = n;
  }
}

/* Rank r's thread: batches of queued commands to srv_mesh_apply_commands;
 * rank 0's: each RankMessage to srv_mesh_fwd_on_message. */
static void *fake_main(void *arg) {
  fake_thread_arg *ta = arg;
  fake_world *w = ta->w;
  int r = ta->rank;
  free(ta);
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->stop && (!w->q[r].head || (r > 0 && w->paused[r])))
      pthread_cond_wait(&w->cv, &w->mu);
    if (w->stop) break;
    fake_msg *list = w->q[r].head;
    w->q[r].head = w->q[r].tail = NULL;
    w->q[r].busy = true;
    pthread_mutex_unlock(&w->mu);
    if (r > 0) {
      ProtobufCBinaryData cmds[FAKE_BATCH];
      fake_msg *m = list;
      while (m) {
        size_t n = 0;
        for (fake_msg *k = m; k && n < FAKE_BATCH; k = k->next, n++)
          cmds[n] = (ProtobufCBinaryData){k->len, k->data};
        srv_mesh_apply_commands(w->m[r], cmds, n);
        while (n--) m = m->next;
      }
    } else {
      for (fake_msg *m = list; m; m = m->next) {
        Paradev__V1__RankMessage *rm =
            paradev__v1__rank_message__unpack(NULL, m->len, m->data);
        if (!rm) continue;
        srv_mesh_fwd_on_message(w->m[0], m->rank, rm);
        paradev__v1__rank_message__free_unpacked(rm, NULL);
      }
    }
    fake_free_list(list);
    pthread_mutex_lock(&w->mu);
    w->q[r].busy = false;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

fake_world *fake_world_create(int world, int per_rank) {
  fake_world *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->world = world;
  w->per_rank = per_rank;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->m = calloc((size_t)world, sizeof *w->m);
  w->q = calloc((size_t)world, sizeof *w->q);
  w->paused = calloc((size_t)world, sizeof *w->paused);
  w->detached = calloc((size_t)world, sizeof *w->detached);
  w->sent = calloc((size_t)world, sizeof *w->sent);
  w->threads = calloc((size_t)world, sizeof *w->threads);
  if (!w->m || !w->q || !w->paused || !w->detached || !w->sent || !w->threads)
    abort();
  for (int r = 0; r < world; r++) {
    if (!(w->m[r] = calloc(1, sizeof *w->m[r]))) abort();
    w->m[r]->w = w;
    w->m[r]->rank = r;
  }
  for (int r = 0; r < world; r++) {
    fake_thread_arg *ta = malloc(sizeof *ta);
    if (!ta) abort();
    *ta = (fake_thread_arg){w, r};
    if (pthread_create(&w->threads[r], NULL, fake_main, ta) != 0) abort();
    w->nthreads++;
  }
  return w;
}

void fake_world_stop(fake_world *w) {
  pthread_mutex_lock(&w->mu);
  w->stop = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  for (int i = 0; i < w->nthreads; i++) pthread_join(w->threads[i], NULL);
  w->nthreads = 0;
}

void fake_world_destroy(fake_world *w) {
  if (!w) return;
  fake_world_stop(w);
  for (int r = 0; r < w->world; r++) {
    fake_free_list(w->q[r].head);
    free(w->m[r]);
  }
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w->m);
  free(w->q);
  free(w->paused);
  free(w->detached);
  free(w->sent);
  free(w->threads);
  free(w);
}

srv_mesh *fake_world_mesh(fake_world *w, int rank) { return w->m[rank]; }

void fake_world_set_engine(fake_world *w, int rank, dev_engine *e) {
  w->m[rank]->s.engine = e;
}

void fake_world_pause(fake_world *w, int rank, bool paused) {
  pthread_mutex_lock(&w->mu);
  w->paused[rank] = paused;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void fake_world_detach(fake_world *w, int rank) {
  pthread_mutex_lock(&w->mu);
  w->detached[rank] = true;
  fake_free_list(w->q[rank].head);
  w->q[rank].head = w->q[rank].tail = NULL;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void fake_world_reattach(fake_world *w, int rank) {
  pthread_mutex_lock(&w->mu);
  w->detached[rank] = false;
  w->paused[rank] = false;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

bool fake_world_quiet(fake_world *w, double timeout_s) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += (time_t)timeout_s;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    bool quiet = true;
    for (int r = 0; r < w->world; r++)
      if ((w->q[r].head && !(r > 0 && w->paused[r])) || w->q[r].busy)
        quiet = false;
    if (quiet) break;
    if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) != 0) {
      pthread_mutex_unlock(&w->mu);
      return false;
    }
  }
  pthread_mutex_unlock(&w->mu);
  return true;
}

unsigned long fake_world_commands(fake_world *w, int rank) {
  pthread_mutex_lock(&w->mu);
  unsigned long n = w->sent[rank];
  pthread_mutex_unlock(&w->mu);
  return n;
}

/* --- the control plane's functions the data plane calls --------------------- */

srv *srv_mesh_server(srv_mesh *m) { return &m->s; }
void *srv_mesh_data(srv_mesh *m) { return m->data; }
void srv_mesh_set_data(srv_mesh *m, void *data) { m->data = data; }
int srv_mesh_rank(const srv_mesh *m) { return m->rank; }
int srv_mesh_world_size(const srv_mesh *m) { return m->w->world; }
int srv_mesh_devices_per_rank(const srv_mesh *m) { return m->w->per_rank; }
int srv_mesh_device_rank(const srv_mesh *m, int device) {
  return device / m->w->per_rank;
}
bool srv_mesh_formed(const srv_mesh *m) { return true; }
bool srv_mesh_degraded(const srv_mesh *m) { return false; }

bool srv_mesh_send_command(srv_mesh *m, int rank, const uint8_t *packed,
                           size_t len) {
  fake_world *w = m->w;
  if (rank <= 0 || rank >= w->world) return false;
  fake_msg *msg = fake_msg_new(0, packed, len);
  if (!msg) return false;
  pthread_mutex_lock(&w->mu);
  bool ok = !w->detached[rank];
  if (ok) {
    w->sent[rank]++;
    fake_push(w, rank, msg);
  }
  pthread_mutex_unlock(&w->mu);
  if (!ok) free(msg);
  return ok;
}

bool srv_mesh_send_to_coordinator(srv_mesh *m, const uint8_t *packed,
                                  size_t len) {
  fake_world *w = m->w;
  fake_msg *msg = fake_msg_new(m->rank, packed, len);
  if (!msg) return false;
  pthread_mutex_lock(&w->mu);
  bool ok = !w->detached[m->rank];
  if (ok) fake_push(w, 0, msg);
  pthread_mutex_unlock(&w->mu);
  if (!ok) free(msg);
  return ok;
}
