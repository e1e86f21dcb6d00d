/* Checkpoints on the wire: LoadTensors, GetLoadProgress and SaveTensors
 * (paradev.proto, "Checkpoints"), and the daemon's storage: the roots and
 * the block cache (storage/storage.h) that the scheduler borrows.
 *
 * None of the three blocks a completion-queue thread (server.h):
 *  - LoadTensors hands the load to the scheduler (sched_load_begin_async),
 *    whose open worker opens and indexes the files (every fetch bounded by
 *    the call's deadline, aborted when the call is cancelled or the session
 *    ends), publishes the handles, starts the reads on the load workers and
 *    calls srv_load_done, which wakes the call to reply from on_wake, as
 *    SaveTensors does.
 *  - GetLoadProgress with wait_ms lists its call with the progress thread
 *    here, which looks at every listed load each SRV_PROGRESS_TICK_MS and
 *    wakes the call (srv_call_wake) once bytes_done changed, the load ended
 *    or the wait is over; on_wake then answers on the call's thread.
 *  - SaveTensors hands the save to the scheduler (sched_save_begin), whose
 *    save worker calls srv_save_done when the file is in place; that only
 *    wakes the call, which replies from on_wake. The callback may outlive
 *    the call (a client that gave up), so it holds a small job object with
 *    its own references, as srv_wait does for tensors.
 * Conversions and the request-shape limits are convert.c's. Locks: the
 * progress list's `mu` is taken before the scheduler's (inside
 * sched_load_get_progress); nothing here is called with it held. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_STORAGE
#include "log.h"
#include "server.h"

#define SRV_PROGRESS_TICK_MS 50
#define SRV_PROGRESS_MAX_WAIT_MS 60000

/* --- the daemon's storage ----------------------------------------------------- */

/* A GetLoadProgress that waits: listed (holding a call reference) until the
 * progress thread or a cancellation takes it off. */
typedef struct srv_pwait {
  struct srv_pwait *prev, *next;
  bool listed;
  srv_call *c;
  sched_session *ss; /* the call state's; alive while the call is */
  uint64_t load_id, since;
  gpr_timespec until; /* GPR_CLOCK_MONOTONIC */
} srv_pwait;

struct srv_storage {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  srv_pwait *head;
  bool stop;
  pthread_t thread;
};

static void srv_stg_log(int level, const char *msg) {
  srv_log_level lv = level <= 3   ? SRV_LOG_ERROR
                     : level == 4 ? SRV_LOG_WARN
                     : level <= 6 ? SRV_LOG_INFO
                                  : SRV_LOG_DEBUG;
  SRV_LOG(lv, "%s", msg);
}

static void srv_pwait_unlink(srv_storage *g, srv_pwait *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    g->head = w->next;
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->listed = false;
}

/* Whether a listed wait is over: the progress moved, the load ended (or
 * is gone), or its time is up. Called with g->mu held. */
static bool srv_pwait_over(srv_pwait *w, gpr_timespec now) {
  sched_load_progress p;
  dev_status st = DEV_STATUS_INIT;
  if (sched_load_get_progress(w->ss, w->load_id, &p, &st) != PD_OK) return true;
  return p.done || p.bytes_done != w->since || gpr_time_cmp(now, w->until) >= 0;
}

static void *srv_progress_main(void *arg) {
  srv_storage *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->stop) {
    if (!g->head) {
      pthread_cond_wait(&g->cv, &g->mu);
      continue;
    }
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    srv_pwait *fired = NULL;
    for (srv_pwait *w = g->head, *nx; w; w = nx) {
      nx = w->next;
      if (!srv_pwait_over(w, now)) continue;
      srv_pwait_unlink(g, w);
      w->next = fired; /* the list of fired ones reuses `next` */
      fired = w;
    }
    pthread_mutex_unlock(&g->mu);
    while (fired) {
      srv_pwait *w = fired;
      fired = w->next;
      w->next = NULL;
      srv_call *c = w->c;
      srv_call_wake(c);
      srv_call_unref(c); /* the list's; the wake-up holds its own */
    }
    pthread_mutex_lock(&g->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += SRV_PROGRESS_TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    if (!g->stop) pthread_cond_timedwait(&g->cv, &g->mu, &ts);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

/* The roots of the options; -1 after logging why. */
static int srv_storage_roots(srv *s) {
  const srv_options *o = &s->opt;
  const char *entries[SRV_MAX_ROOTS];
  for (int i = 0; i < o->num_storage_roots; i++)
    entries[i] = o->storage_roots[i];
  dev_status st = DEV_STATUS_INIT;
  if (stg_roots_create(entries, o->num_storage_roots, &s->storage_roots, &st) !=
      PD_OK) {
    SRV_ERROR("[storage] roots: %s", st.msg);
    return -1;
  }
  for (int i = 0; i < o->num_storage_roots; i++)
    SRV_INFO("storage root %d: %s", i, o->storage_roots[i]);
  if (o->num_storage_roots > 0)
    SRV_INFO(
        "a save killed mid-write (SIGKILL, crash) leaves its target "
        "intact and an orphan .NAME.tmp-XXXXXX beside it; the next save of "
        "NAME removes it once it is over 5 minutes old and its writer is "
        "gone; nothing else is swept");
  if (o->num_storage_roots == 0)
    SRV_INFO(
        "no storage root: LoadTensors and SaveTensors are refused "
        "(set [storage] roots or --storage-root)");
  return 0;
}

int srv_storage_init(srv *s) {
  const srv_options *o = &s->opt;
  stg_set_log(srv_stg_log);
  if (srv_storage_roots(s) != 0) return -1;
  stg_cache_config cc = {.struct_size = STG_CACHE_CONFIG_STRUCT_SIZE,
                         .block_size = o->storage_block_size,
                         .cache_bytes = o->storage_cache_bytes,
                         .max_staleness_s = o->storage_max_staleness_s,
                         .fetch_timeout_s = o->storage_fetch_timeout_s,
                         .fetch_retries = o->storage_fetch_retries};
  dev_status st = DEV_STATUS_INIT;
  if (stg_cache_create(&cc, &s->storage_cache, &st) != PD_OK) {
    SRV_ERROR("[storage] cache: %s", st.msg);
    goto fail_roots;
  }
  srv_storage *g = calloc(1, sizeof(*g));
  if (!g) {
    SRV_ERROR("out of memory");
    goto fail_cache;
  }
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  if (pthread_create(&g->thread, NULL, srv_progress_main, g) != 0) {
    SRV_ERROR("cannot start the load progress thread");
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
    goto fail_cache;
  }
  s->storage = g;
  return 0;

fail_cache:
  stg_cache_destroy(s->storage_cache);
  s->storage_cache = NULL;
fail_roots:
  stg_roots_destroy(s->storage_roots);
  s->storage_roots = NULL;
  return -1;
}

void srv_storage_destroy(srv *s) {
  srv_storage *g = s->storage;
  if (g) {
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
    s->storage = NULL;
  }
  stg_cache_destroy(s->storage_cache);
  s->storage_cache = NULL;
  stg_roots_destroy(s->storage_roots);
  s->storage_roots = NULL;
}

/* --- LoadTensors ---------------------------------------------------------------- */

/* Each reply tensor's devices (its device set) and host_shape: the value's
 * shape in the file, as a download by the load's layout would give it
 * (none for PER_COMPONENT). A handle deleted meanwhile just gets neither. */
static bool srv_load_host_shapes(sched_session *ss,
                                 const sched_load_request *lr,
                                 Paradev__V1__LoadTensorsResponse *resp,
                                 srv_arena *a) {
  for (size_t i = 0; i < resp->n_tensors; i++) {
    dev_layout l = lr->n ? lr->tensors[i].layout : lr->default_layout;
    dev_tensor *t = NULL;
    dev_status st = DEV_STATUS_INIT;
    Paradev__V1__TensorInfo *ti = resp->tensors[i]->tensor;
    if (sched_handle_get(ss, ti->id, &t, &st) != PD_OK) continue;
    /* Where it was placed (issue #17). */
    if (!srv_devset_to_arena(a, dev_tensor_devset(t), &ti->n_devices,
                             &ti->devices)) {
      dev_tensor_release(t);
      return false;
    }
    if (l.kind == DEV_LAYOUT_PER_COMPONENT) {
      dev_tensor_release(t);
      continue;
    }
    dev_shape host;
    uint64_t bytes = 0;
    pd_code rc = dev_tensor_host_size(t, &l, 0, &host, &bytes, &st);
    dev_tensor_release(t);
    if (rc != PD_OK) continue;
    if (!(resp->tensors[i]->host_shape = srv_shape_to_pb(a, &host)))
      return false;
  }
  return true;
}

/* A LoadTensors in flight, as srv_save_job: the call's reference and the
 * callback's; `c` is set, with a call reference, while the call waits. It
 * owns the request (the scheduler reads it until the callback) and a
 * session reference (for the reply's host shapes and the pending load). */
typedef struct srv_load_job {
  atomic_int refs;
  pthread_mutex_t mu;
  srv_call *c;
  sched_session *ss;
  sched_load_request lr; /* its strings copied into `owned` */
  void **owned;
  int n_owned;
  sched_load_pending *pending;
  pd_code code;
  dev_status st;
  sched_load_result *r;
} srv_load_job;

static void srv_load_job_put(srv_load_job *j) {
  if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
  sched_load_pending_put(j->pending);
  sched_load_result_free(j->r);
  srv_load_request_free(&j->lr);
  for (int i = 0; i < j->n_owned; i++) free(j->owned[i]);
  free(j->owned);
  sched_session_put(j->ss);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

static void srv_load_job_detach(srv_load_job *j) {
  pthread_mutex_lock(&j->mu);
  srv_call *c = j->c;
  j->c = NULL;
  pthread_mutex_unlock(&j->mu);
  if (c) srv_call_unref(c);
}

static const char *srv_load_own(srv_load_job *j, const char *v) {
  if (!v) return NULL;
  char *d = strdup(v);
  if (d) j->owned[j->n_owned++] = d;
  return d;
}

/* Copies the request's strings (borrowed from the request message, which
 * goes with the call) into the job, which may outlive the call. */
static bool srv_load_job_own(srv_load_job *j) {
  sched_load_request *lr = &j->lr;
  size_t n = 1;
  for (int i = 0; i < lr->n; i++)
    n += 2 + (size_t)lr->tensors[i].n_component_sources;
  if (!(j->owned = calloc(n, sizeof(*j->owned)))) return false;
  if (lr->source && !(lr->source = srv_load_own(j, lr->source))) return false;
  sched_load_tensor *t = (sched_load_tensor *)lr->tensors;
  for (int i = 0; i < lr->n; i++) {
    if (t[i].name && !(t[i].name = srv_load_own(j, t[i].name))) return false;
    int k = t[i].n_component_sources;
    if (k == 0) continue;
    const char **cs = calloc((size_t)k, sizeof(*cs));
    if (!cs) return false;
    j->owned[j->n_owned++] = (void *)cs;
    for (int q = 0; q < k; q++)
      if (!(cs[q] = srv_load_own(j, t[i].component_sources[q]))) return false;
    t[i].component_sources = cs;
  }
  return true;
}

/* sched_load_done_fn, on an open worker: keeps the outcome, wakes the
 * call (which replies from on_wake). */
static void srv_load_done(void *arg, pd_code code, const dev_status *st,
                          sched_load_result *r) {
  srv_load_job *j = arg;
  pthread_mutex_lock(&j->mu);
  j->code = code;
  if (st) j->st = *st;
  j->r = r;
  srv_call *c = j->c;
  j->c = NULL;
  pthread_mutex_unlock(&j->mu);
  if (c) {
    srv_call_wake(c);
    srv_call_unref(c);
  }
  srv_load_job_put(j);
}

static void srv_load_destroy(srv_call *c) {
  srv_load_job *j = c->user;
  if (!j) return;
  srv_load_job_detach(j);
  srv_load_job_put(j);
  c->user = NULL;
}

/* on_wake: the files are open and the handles published, or the begin
 * failed. */
static void srv_load_reply(srv_call *c) {
  srv_load_job *j = c->user;
  pthread_mutex_lock(&j->mu);
  pd_code code = j->code;
  dev_status st = j->st;
  sched_load_result *r = j->r;
  pthread_mutex_unlock(&j->mu);
  if (code != PD_OK || !r) {
    st.code = code != PD_OK ? code : PD_INTERNAL;
    srv_call_fail(c, &st);
    return;
  }
  srv_arena a = {NULL};
  Paradev__V1__LoadTensorsResponse resp =
      PARADEV__V1__LOAD_TENSORS_RESPONSE__INIT;
  if (!srv_loaded_to_pb(&a, r, &resp) ||
      !srv_load_host_shapes(j->ss, &j->lr, &resp, &a)) {
    /* The handles exist and load on; the client can Describe them. */
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED,
                    "out of host memory building the reply of load %llu",
                    (unsigned long long)r->load_id);
  } else {
    resp.incarnation = c->s->incarnation;
    srv_call_reply(c, &resp.base);
  }
  srv_arena_free(&a);
}

/* The call's deadline on stg_now_s's clock; 0 for none. */
static double srv_load_deadline(srv_call *c) {
  if (gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) == 0)
    return 0;
  gpr_timespec dl = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
  gpr_timespec left = gpr_time_sub(dl, gpr_now(GPR_CLOCK_MONOTONIC));
  double s = (double)left.tv_sec + (double)left.tv_nsec * 1e-9;
  return stg_now_s() + (s > 0.001 ? s : 0.001);
}

static void srv_load_tensors(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__LoadTensorsRequest *req = (const void *)m;
  srv *s = c->s;
  srv_req_limits l = srv_call_limits(c);
  dev_status dst = DEV_STATUS_INIT;
  if (srv_check_accepting(s, "LoadTensors", &dst) != PD_OK) {
    srv_call_fail(c, &dst);
    return;
  }
  srv_load_job *j = calloc(1, sizeof(*j));
  if (!j) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  atomic_init(&j->refs, 1); /* the call's */
  pthread_mutex_init(&j->mu, NULL);
  c->user = j;
  dev_status st = DEV_STATUS_INIT;
  /* The session first: a tensor placed by default has a component per
   * device of its default set (issue #17), which PER_COMPONENT sources
   * are counted against. */
  if (!(j->ss = srv_call_session(c, req->session_token))) return;
  if (srv_load_from_pb(&l, sched_session_devices(j->ss)->n, req, &j->lr, &st) !=
      PD_OK) {
    memset(&j->lr, 0, sizeof j->lr); /* nothing to free */
    srv_call_fail(c, &st);
    return;
  }
  if (!srv_load_job_own(j)) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  atomic_fetch_add(&j->refs, 1); /* the callback's */
  srv_call_ref(c);
  j->c = c;
  /* The open and index run on an open worker, bounded by the deadline
   * (issue #13: never storage I/O on a completion-queue thread). */
  if (sched_load_begin_async(j->ss, &j->lr, srv_load_deadline(c), srv_load_done,
                             j, &j->pending, &st) != PD_OK) {
    srv_load_job_detach(j);
    srv_load_job_put(j); /* the callback's: it never comes */
    srv_call_fail(c, &st);
  }
  /* else srv_load_reply runs when the handles are published */
}

/* The client gave up (deadline, cancel): the open stops at once, nothing is
 * published unless it already was. */
static void srv_load_cancel(srv_call *c) {
  srv_load_job *j = c->user;
  if (j) {
    sched_load_pending_cancel(j->pending);
    srv_load_job_detach(j);
  }
  srv_call_finish_cancelled(c, "LoadTensors");
}

const srv_handlers srv_h_LoadTensors = {.on_request = srv_load_tensors,
                                        .on_destroy = srv_load_destroy,
                                        .on_wake = srv_load_reply,
                                        .on_cancel = srv_load_cancel,
                                        .early_close = true};

/* --- GetLoadProgress -------------------------------------------------------------- */

typedef struct srv_progress_state {
  sched_session *ss;
  srv_pwait w;
} srv_progress_state;

/* Takes the call off the progress list if it is still there (dropping the
 * list's reference). Call's thread. */
static void srv_progress_unlist(srv_call *c, srv_progress_state *p) {
  srv_storage *g = c->s->storage;
  pthread_mutex_lock(&g->mu);
  bool was = p->w.listed;
  if (was) srv_pwait_unlink(g, &p->w);
  pthread_mutex_unlock(&g->mu);
  if (was) srv_call_unref(c);
}

static void srv_progress_destroy(srv_call *c) {
  srv_progress_state *p = c->user;
  if (!p) return;
  sched_session_put(p->ss);
  free(p);
  c->user = NULL;
}

/* Answers with the progress as it is now. */
static void srv_progress_reply(srv_call *c) {
  srv_progress_state *p = c->user;
  sched_load_progress pr;
  dev_status st = DEV_STATUS_INIT;
  if (sched_load_get_progress(p->ss, p->w.load_id, &pr, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  char msg[DEV_STATUS_MSG_MAX];
  Paradev__V1__Status status;
  Paradev__V1__GetLoadProgressResponse resp;
  srv_progress_to_pb(&pr, msg, &status, &resp);
  srv_call_reply(c, &resp.base);
}

/* How long the call may wait: wait_ms, cut to end 100 ms before the call's
 * deadline so the answer still arrives. */
static gpr_timespec srv_progress_until(srv_call *c, uint32_t wait_ms) {
  gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
  gpr_timespec until =
      gpr_time_add(now, gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
  gpr_timespec dl = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
  dl = gpr_time_sub(dl, gpr_time_from_millis(100, GPR_TIMESPAN));
  return gpr_time_cmp(dl, until) < 0 ? dl : until;
}

static void srv_get_load_progress(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__GetLoadProgressRequest *req = (const void *)m;
  if (req->wait_ms > SRV_PROGRESS_MAX_WAIT_MS) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "wait_ms %u; expected 0 to %d (milliseconds)", req->wait_ms,
                    SRV_PROGRESS_MAX_WAIT_MS);
    return;
  }
  srv_progress_state *p = calloc(1, sizeof(*p));
  if (!p) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->user = p;
  p->ss = srv_call_session(c, req->session_token);
  if (!p->ss) return;
  sched_load_progress pr;
  dev_status st = DEV_STATUS_INIT;
  if (sched_load_get_progress(p->ss, req->load_id, &pr, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  p->w.load_id = req->load_id;
  if (req->wait_ms == 0 || pr.done) {
    srv_progress_reply(c);
    return;
  }
  p->w.c = c;
  p->w.ss = p->ss;
  p->w.since = pr.bytes_done;
  p->w.until = srv_progress_until(c, req->wait_ms);
  srv_storage *g = c->s->storage;
  srv_call_ref(c); /* the list's */
  pthread_mutex_lock(&g->mu);
  p->w.next = g->head;
  if (g->head) g->head->prev = &p->w;
  g->head = &p->w;
  p->w.listed = true;
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
  /* on_wake answers */
}

static void srv_progress_cancel(srv_call *c) {
  srv_progress_state *p = c->user;
  if (p) srv_progress_unlist(c, p);
  srv_call_finish_cancelled(c, "GetLoadProgress");
}

const srv_handlers srv_h_GetLoadProgress = {.on_request = srv_get_load_progress,
                                            .on_destroy = srv_progress_destroy,
                                            .on_wake = srv_progress_reply,
                                            .on_cancel = srv_progress_cancel,
                                            .early_close = true};

/* --- SaveTensors ------------------------------------------------------------------ */

/* What the save worker hands to the call: two references (the call's side
 * and the callback's); `c` is set, with a call reference, while the call
 * waits. */
typedef struct srv_save_job {
  atomic_int refs;
  pthread_mutex_t mu;
  srv_call *c;
  bool done;
  pd_code code;
  dev_status st;
  sched_save_result res;
} srv_save_job;

static void srv_save_job_put(srv_save_job *j) {
  if (j && atomic_fetch_sub(&j->refs, 1) == 1) {
    pthread_mutex_destroy(&j->mu);
    free(j);
  }
}

/* The call no longer waits: drops its reference on the call. */
static void srv_save_job_detach(srv_save_job *j) {
  pthread_mutex_lock(&j->mu);
  srv_call *c = j->c;
  j->c = NULL;
  pthread_mutex_unlock(&j->mu);
  if (c) srv_call_unref(c);
}

/* sched_save_done_fn, on a save worker: keeps the outcome, wakes the call. */
static void srv_save_done(void *arg, pd_code code, const dev_status *st,
                          const sched_save_result *res) {
  srv_save_job *j = arg;
  pthread_mutex_lock(&j->mu);
  j->done = true;
  j->code = code;
  if (st) j->st = *st;
  if (res && code == PD_OK) j->res = *res;
  srv_call *c = j->c;
  j->c = NULL;
  pthread_mutex_unlock(&j->mu);
  if (c) {
    srv_call_wake(c);
    srv_call_unref(c); /* the wake-up holds its own */
  }
  srv_save_job_put(j);
}

static void srv_save_destroy(srv_call *c) {
  srv_save_job *j = c->user;
  if (!j) return;
  srv_save_job_detach(j);
  srv_save_job_put(j);
  c->user = NULL;
}

/* on_wake: the file is in place, or the save failed. */
static void srv_save_reply(srv_call *c) {
  srv_save_job *j = c->user;
  pthread_mutex_lock(&j->mu);
  pd_code code = j->code;
  dev_status st = j->st;
  sched_save_result res = j->res;
  pthread_mutex_unlock(&j->mu);
  if (code != PD_OK) {
    st.code = code;
    srv_call_fail(c, &st);
    return;
  }
  char path[SRV_LOG_QUOTED(0) + sizeof(res.path)];
  Paradev__V1__SaveTensorsResponse resp =
      PARADEV__V1__SAVE_TENSORS_RESPONSE__INIT;
  resp.bytes_written = res.bytes_written;
  resp.path = srv_log_utf8(res.path, path, sizeof(path));
  resp.incarnation = c->s->incarnation;
  srv_call_reply(c, &resp.base);
}

static void srv_save_tensors(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__SaveTensorsRequest *req = (const void *)m;
  srv_req_limits l = srv_call_limits(c);
  sched_save_request sr;
  dev_status st = DEV_STATUS_INIT;
  sched_session *ss = NULL;
  if (srv_save_from_pb(&l, req, &sr, &st) != PD_OK) {
    srv_call_fail(c, &st);
    goto out;
  }
  if (!(ss = srv_call_session(c, req->session_token))) goto out;
  srv_save_job *j = calloc(1, sizeof(*j));
  if (!j) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto out;
  }
  atomic_init(&j->refs, 2);
  pthread_mutex_init(&j->mu, NULL);
  srv_call_ref(c);
  j->c = c;
  c->user = j;
  if (sched_save_begin(ss, &sr, srv_save_done, j, &st) != PD_OK) {
    srv_save_job_detach(j);
    srv_save_job_put(j); /* the callback's: it never comes */
    srv_call_fail(c, &st);
  }
  /* else srv_save_reply runs when the file is in place */
out:
  sched_session_put(ss);
  srv_save_request_free(&sr);
}

static void srv_save_cancel(srv_call *c) {
  srv_save_job *j = c->user;
  if (j) srv_save_job_detach(j);
  srv_call_finish_cancelled(c, "SaveTensors");
}

const srv_handlers srv_h_SaveTensors = {.on_request = srv_save_tensors,
                                        .on_destroy = srv_save_destroy,
                                        .on_wake = srv_save_reply,
                                        .on_cancel = srv_save_cancel,
                                        .early_close = true};
