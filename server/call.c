/* The call machinery of paradevd, which knows no method: a call's state and
 * lifetime (references, destruction, the calls in progress), its gRPC
 * batches and events (reads, writes, close, wake-ups), the replies and
 * statuses a method sends, one-shot waits for an engine callback, and the
 * wait for a tensor that wakes the call once it is computed. rpc.c (the
 * transport) creates calls and hands each one here once its request
 * arrived; the method files use the rest. See server.h for the threading
 * model. */
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "auth.h"
#include "log.h"
#include "mesh.h"
#include "server.h"

/* A bidi stream stops reading while this many replies wait to be sent, and
 * resumes below half of it (backpressure instead of unbounded memory). */
#define SRV_WQ_HIGH 64

/* The calls in progress (started, not yet destroyed), so that srv_rpc_stop can
 * end the ones still open after the grace period with a status that says
 * why; and set then, so that their wake-ups end them. */
static pthread_mutex_t srv_live_mu = PTHREAD_MUTEX_INITIALIZER;
static srv_call *srv_live; /* linked through live_prev/live_next */
static size_t srv_live_n;
static atomic_bool srv_ending_calls;
/* Started calls not yet destroyed (srv_calls_in_progress). */
static atomic_int srv_started_calls;
static void srv_on_recv(srv_call *c, bool ok);
static void srv_on_send(srv_call *c, bool ok);
static void srv_on_close(srv_call *c, bool ok);
static void srv_on_final(srv_call *c, bool ok);
static void srv_on_wake(srv_call *c, bool ok);
static void srv_pump(srv_call *c);

static bool srv_unary_like(const srv_call *c) {
  return c->m && (c->m->kind == SRV_UNARY || c->m->kind == SRV_SERVER_STREAM);
}

srv_call *srv__call_new(srv *s, const srv_method *m, grpc_server *gs, int cqi,
                        void (*on_request)(srv_call *c, bool ok)) {
  srv_call *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->s = s;
  c->m = m;
  c->gs = gs;
  c->cq_index = cqi;
  atomic_init(&c->refs, 1);
  atomic_init(&c->cancelled, false);
  pthread_mutex_init(&c->run_mu, NULL);
  grpc_metadata_array_init(&c->md);
  c->t_req = (struct srv_tag){on_request, c};
  c->t_recv = (struct srv_tag){srv_on_recv, c};
  c->t_send = (struct srv_tag){srv_on_send, c};
  c->t_close = (struct srv_tag){srv_on_close, c};
  c->t_final = (struct srv_tag){srv_on_final, c};
  c->t_wake = (struct srv_tag){srv_on_wake, c};
  atomic_fetch_add(&s->active_calls, 1);
  return c;
}

static void srv_wq_clear(srv_call *c) {
  while (c->wq_len) {
    grpc_byte_buffer_destroy(c->wq[c->wq_head]);
    c->wq_head = (c->wq_head + 1) % c->wq_cap;
    c->wq_len--;
  }
}

/* Counts a finished call under its status (metrics). */
static void srv_count(srv_call *c) {
  if (!c->started || !c->m) return;
  grpc_status_code code = c->fin_code;
  if (!c->status_sent) {
    bool late = gpr_time_cmp(gpr_now(c->deadline.clock_type), c->deadline) >= 0;
    code = late ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_CANCELLED;
  }
  unsigned k = (unsigned)code < SRV_NUM_CODES ? (unsigned)code : 2u;
  atomic_fetch_add_explicit(&((srv_method *)c->m)->codes[k], 1,
                            memory_order_relaxed);
}

/* Adds a started call to srv_live (O(1): every RPC passes here). */
static void srv_live_add(srv_call *c) {
  pthread_mutex_lock(&srv_live_mu);
  c->live_prev = NULL;
  c->live_next = srv_live;
  if (srv_live) srv_live->live_prev = c;
  srv_live = c;
  srv_live_n++;
  pthread_mutex_unlock(&srv_live_mu);
}

static void srv_live_remove(srv_call *c) {
  pthread_mutex_lock(&srv_live_mu);
  if (c->live_prev)
    c->live_prev->live_next = c->live_next;
  else
    srv_live = c->live_next;
  if (c->live_next) c->live_next->live_prev = c->live_prev;
  c->live_prev = c->live_next = NULL;
  srv_live_n--;
  pthread_mutex_unlock(&srv_live_mu);
}

static void srv_call_destroy(srv_call *c) {
  if (c->started) {
    srv_live_remove(c);
    atomic_fetch_sub(&srv_started_calls, 1);
  }
  srv_count(c);
  if (c->m && c->m->h->on_destroy) c->m->h->on_destroy(c);
  if (c->req) protobuf_c_message_free_unpacked(c->req, &c->budget.alloc);
  if (!c->m && c->user) {
    grpc_call_details_destroy(c->user);
    free(c->user);
  }
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (c->in_flight) grpc_byte_buffer_destroy(c->in_flight);
  srv_wq_clear(c);
  free(c->wq);
  grpc_metadata_array_destroy(&c->md);
  if (c->call) grpc_call_unref(c->call);
  free(c->fin_msg);
  free(c->identity);
  pthread_mutex_destroy(&c->run_mu);
  atomic_fetch_sub(&c->s->active_calls, 1);
  free(c);
}

void srv_call_ref(srv_call *c) { atomic_fetch_add(&c->refs, 1); }

void srv_call_unref(srv_call *c) {
  if (atomic_fetch_sub(&c->refs, 1) == 1) srv_call_destroy(c);
}

/* Starts a batch holding a reference for it. */
bool srv__call_batch(srv_call *c, const grpc_op *ops, size_t n,
                     struct srv_tag *tag) {
  atomic_fetch_add(&c->refs, 1);
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
  if (e != GRPC_CALL_OK) {
    SRV_ERROR("internal: grpc_call_start_batch failed (%d) on %s", (int)e,
              c->m ? c->m->path : "(generic)");
    atomic_fetch_sub(&c->refs, 1); /* the caller still holds one */
    return false;
  }
  return true;
}

/* --- per-call events ------------------------------------------------------- */

static void srv_start_close(srv_call *c) {
  c->close_started = true;
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  srv__call_batch(c, &op, 1, &c->t_close);
}

static void srv_read(srv_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->payload;
  c->reading = true;
  if (!srv__call_batch(c, &op, 1, &c->t_recv)) c->reading = false;
}

static size_t srv_budget_for(grpc_byte_buffer *bb) {
  return srv_budget_bytes(grpc_byte_buffer_length(bb));
}

void srv__call_begin(srv_call *c) {
  const srv_method *m = c->m;
  c->started = true;
  atomic_fetch_add(&srv_started_calls, 1);
  srv_live_add(c);
  SRV_DEBUG("call %s", m->path);
  /* Who is calling, before anything of the request is looked at. */
  const srv_identity *id = NULL;
  dev_status ast = DEV_STATUS_INIT;
  /* Health probes need no identity (an orchestrator's kubelet has none),
   * nor do the other ranks' daemons on the coordinator's mesh port (issue
   * #16: [mesh] secret_file is their proof, checked in their hello). */
  if (strncmp(m->path, "/grpc.health.v1.", 16) != 0 &&
      strncmp(m->path, "/paradev.v1.Mesh/", 17) != 0 &&
      srv_call_identity(c, &id, &ast) != PD_OK) {
    if (!srv_unary_like(c) || m->kind == SRV_SERVER_STREAM || m->h->early_close)
      srv_start_close(c);
    srv_call_fail(c, &ast);
    return;
  }
  /* A mesh's ranks other than 0 serve no client (issue #16). */
  if (srv_mesh_check_client(c->s->mesh, m->path, &ast) != PD_OK) {
    if (!srv_unary_like(c) || m->kind == SRV_SERVER_STREAM || m->h->early_close)
      srv_start_close(c);
    srv_call_fail(c, &ast);
    return;
  }
  if (srv_unary_like(c)) {
    if (m->kind == SRV_SERVER_STREAM || m->h->early_close) srv_start_close(c);
    if (!c->payload) {
      srv_call_finish(c, PD_INVALID_ARGUMENT,
                      "%s: the call carried no request message", m->path);
    } else {
      dev_status st = DEV_STATUS_INIT;
      srv_budget_init(&c->budget, srv_budget_for(c->payload));
      c->req = srv_unpack(m->request, c->payload, &c->budget, &st);
      grpc_byte_buffer_destroy(c->payload);
      c->payload = NULL;
      if (!c->req)
        srv_call_fail(c, &st);
      else
        m->h->on_request(c, c->req);
    }
  } else {
    srv_start_close(c);
    srv_read(c);
  }
}

int srv_calls_in_progress(void) { return atomic_load(&srv_started_calls); }

static void srv_on_recv(srv_call *c, bool ok) {
  c->reading = false;
  if (!ok || atomic_load(&c->cancelled)) {
    if (c->payload) grpc_byte_buffer_destroy(c->payload);
    c->payload = NULL;
    c->eof = true;
    srv_call_unref(c);
    return;
  }
  if (!c->payload) { /* the client closed its side */
    c->eof = true;
    if (!c->finishing) c->m->h->on_message(c, NULL);
    srv_call_unref(c);
    return;
  }
  dev_status st = DEV_STATUS_INIT;
  srv_budget b;
  srv_budget_init(&b, srv_budget_for(c->payload));
  ProtobufCMessage *msg = srv_unpack(c->m->request, c->payload, &b, &st);
  grpc_byte_buffer_destroy(c->payload);
  c->payload = NULL;
  if (!msg) {
    srv_call_fail(c, &st);
  } else if (!c->finishing && srv_call_recheck(c, &st) != PD_OK) {
    /* A revoked token ends its open streams at their next item. */
    srv_auth_refused(c, SRV_REFUSE_BAD_TOKEN, &st);
    srv_call_fail(c, &st);
    protobuf_c_message_free_unpacked(msg, &b.alloc);
  } else {
    if (!c->finishing) c->m->h->on_message(c, msg);
    protobuf_c_message_free_unpacked(msg, &b.alloc);
  }
  if (!c->finishing && !c->eof) {
    if (c->wq_len < SRV_WQ_HIGH)
      srv_read(c);
    else
      c->read_paused = true;
  }
  srv_call_unref(c);
}

static void srv_on_send(srv_call *c, bool ok) {
  c->writing = false;
  if (c->in_flight) grpc_byte_buffer_destroy(c->in_flight);
  c->in_flight = NULL;
  if (!ok) { /* the call is gone: nothing more will be sent */
    atomic_store(&c->cancelled, true);
    srv_wq_clear(c);
    srv_call_unref(c);
    return;
  }
  if (c->read_paused && c->wq_len < SRV_WQ_HIGH / 2 && !c->finishing) {
    c->read_paused = false;
    srv_read(c);
  }
  if (c->wq_len == 0 && !c->finishing && c->m->h->on_drained &&
      !atomic_load(&c->cancelled))
    c->m->h->on_drained(c);
  srv_pump(c);
  srv_call_unref(c);
}

static void srv_on_close(srv_call *c, bool ok) {
  if (c->close_cancelled) {
    atomic_store(&c->cancelled, true);
    if (!c->finishing && !c->status_sent && c->m && c->m->h->on_cancel)
      c->m->h->on_cancel(c);
  }
  srv_call_unref(c);
}

static void srv_on_final(srv_call *c, bool ok) { srv_call_unref(c); }

static void srv_on_wake(srv_call *c, bool ok) {
  if (atomic_load(&srv_ending_calls) && c->m && !c->finishing &&
      !c->status_sent) {
    /* srv_rpc_stop: the grace period is over. UNAVAILABLE is gRPC's code for a
     * server going away (retry elsewhere). Then on_cancel undoes the
     * method's waits, as for a client that went away (its own status comes
     * too late to replace this one). */
    const char *method = strrchr(c->m->path, '/');
    srv_call_finish(c, PD_UNAVAILABLE,
                    "paradevd is draining (shutting down): %s was still in "
                    "progress when the %d ms grace period for calls ended; "
                    "its session is gone with the daemon, retry on a daemon "
                    "that is serving",
                    method ? method + 1 : c->m->path, c->s->opt.grace_ms);
    if (c->m->h->on_cancel) c->m->h->on_cancel(c);
  }
  if (!c->finishing && !c->status_sent && c->m && c->m->h->on_wake)
    c->m->h->on_wake(c);
  srv_call_unref(c);
}

/* Ends every call in progress from its own thread (srv_on_wake); returns
 * how many were asked to end. */
int srv__calls_end_live(void) {
  atomic_store(&srv_ending_calls, true);
  pthread_mutex_lock(&srv_live_mu);
  size_t n = 0;
  srv_call **calls = srv_live_n ? malloc(srv_live_n * sizeof(*calls)) : NULL;
  for (srv_call *c = calls ? srv_live : NULL; c; c = c->live_next) {
    /* A reference unless the call is already being destroyed (its count
     * reached 0 and it waits for this lock to leave the list). */
    int r = atomic_load(&c->refs);
    while (r > 0 && !atomic_compare_exchange_weak(&c->refs, &r, r + 1)) {
    }
    if (r > 0) calls[n++] = c;
  }
  pthread_mutex_unlock(&srv_live_mu);
  for (size_t i = 0; i < n; i++) {
    srv_call_wake(calls[i]);
    srv_call_unref(calls[i]);
  }
  free(calls);
  return (int)n;
}

bool srv_call_wake(srv_call *c) {
  /* A batch of no operations completes at once on the call's queue: the
   * way to run code on the call's thread. */
  return srv__call_batch(c, NULL, 0, &c->t_wake);
}

void srv_call_finish_cancelled(srv_call *c, const char *what) {
  bool late = gpr_time_cmp(gpr_now(c->deadline.clock_type), c->deadline) >= 0;
  if (late)
    srv_call_finish(c, PD_DEADLINE_EXCEEDED,
                    "%s: the deadline passed first (the work goes on; call "
                    "again with a longer deadline to wait for it)",
                    what);
  else
    srv_call_finish(c, PD_CANCELLED, "%s: cancelled by the client", what);
}

/* Sends the next queued message, or the status once the queue is empty. */
static void srv_pump(srv_call *c) {
  if (c->writing || c->status_sent) return;
  grpc_op ops[4];
  memset(ops, 0, sizeof(ops));
  size_t n = 0;
  if (!c->md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  }
  if (c->wq_len) {
    c->in_flight = c->wq[c->wq_head];
    c->wq_head = (c->wq_head + 1) % c->wq_cap;
    c->wq_len--;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->in_flight;
    c->writing = true;
    c->md_sent = true;
    if (!srv__call_batch(c, ops, n, &c->t_send)) {
      c->writing = false;
      grpc_byte_buffer_destroy(c->in_flight);
      c->in_flight = NULL;
    }
    return;
  }
  if (!c->finishing) return;
  grpc_slice details =
      grpc_slice_from_copied_string(c->fin_msg ? c->fin_msg : "");
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = c->fin_code;
  ops[n++].data.send_status_from_server.status_details = &details;
  if (srv_unary_like(c) && c->m->kind == SRV_UNARY && !c->close_started) {
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->close_cancelled;
    c->close_started = true;
  }
  c->md_sent = true;
  c->status_sent = true;
  srv__call_batch(c, ops, n, &c->t_final);
  grpc_slice_unref(details);
}

/* --- the handlers' API ------------------------------------------------------ */

void srv_call_reply(srv_call *c, const ProtobufCMessage *resp) {
  if (c->finishing || c->status_sent) return;
  grpc_byte_buffer *bb = srv_pack(resp);
  grpc_op ops[4];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = bb;
  ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
  size_t n = 3;
  if (c->m->kind == SRV_UNARY && !c->close_started) {
    ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[3].data.recv_close_on_server.cancelled = &c->close_cancelled;
    c->close_started = true;
    n = 4;
  }
  c->finishing = c->status_sent = c->md_sent = true;
  c->fin_code = GRPC_STATUS_OK;
  c->in_flight = bb; /* freed when the call is destroyed */
  srv__call_batch(c, ops, n, &c->t_final);
}

void srv_call_write(srv_call *c, const ProtobufCMessage *msg) {
  if (c->finishing || c->status_sent || atomic_load(&c->cancelled)) return;
  srv_call_write_buffer(c, srv_pack(msg));
}

void srv_call_write_buffer(srv_call *c, grpc_byte_buffer *bb) {
  if (c->finishing || c->status_sent || atomic_load(&c->cancelled)) {
    grpc_byte_buffer_destroy(bb);
    return;
  }
  if (c->wq_len == c->wq_cap) {
    size_t ncap = c->wq_cap ? c->wq_cap * 2 : 8;
    grpc_byte_buffer **nq = malloc(ncap * sizeof(*nq));
    if (!nq) {
      grpc_byte_buffer_destroy(bb);
      srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
      return;
    }
    for (size_t i = 0; i < c->wq_len; i++)
      nq[i] = c->wq[(c->wq_head + i) % c->wq_cap];
    free(c->wq);
    c->wq = nq;
    c->wq_cap = ncap;
    c->wq_head = 0;
  }
  c->wq[(c->wq_head + c->wq_len) % c->wq_cap] = bb;
  c->wq_len++;
  srv_pump(c);
}

size_t srv_call_queued(const srv_call *c) { return c->wq_len; }

void srv_call_finish(srv_call *c, pd_code code, const char *fmt, ...) {
  if (c->finishing || c->status_sent) return;
  c->finishing = true;
  c->fin_code = (grpc_status_code)code;
  char buf[DEV_STATUS_MSG_MAX + 128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  /* Messages quote what the client sent (op names, ids): valid UTF-8 is
   * kept (a function named in any language is named as given; gRPC
   * percent-encodes the status), control characters and bytes that are
   * not UTF-8 become '?'. */
  char clean[sizeof(buf)];
  c->fin_msg = strdup(srv_log_utf8(buf, clean, sizeof(clean)));
  if (code != PD_OK) {
    srv_wq_clear(c);
    SRV_DEBUG("%s -> %s: %s", c->m ? c->m->path : "?", pd_code_name(code),
              clean);
  }
  srv_pump(c);
}

void srv_call_fail(srv_call *c, const dev_status *st) {
  pd_code code = st->code == PD_OK ? PD_INTERNAL : st->code;
  /* The scheduler's refusals by a tenant's limit (scheduler/tenants.c)
   * all begin so: counted and logged as refusals. */
  if (code == PD_RESOURCE_EXHAUSTED && strncmp(st->msg, "tenant \"", 8) == 0)
    srv_auth_refused(c, SRV_REFUSE_TENANT_LIMIT, st);
  srv_call_finish(c, code, "%s", st->msg[0] ? st->msg : pd_code_name(code));
}

/* --- one-shot waits ---------------------------------------------------------- */

struct srv_wait {
  atomic_int refs; /* the call's side and the callback's side */
  pthread_mutex_t mu;
  srv_call *c; /* set while the call waits; holds a call reference */
  pd_code code;
};

srv_wait *srv_wait_new(srv_call *c) {
  srv_wait *w = calloc(1, sizeof(*w));
  if (!w) return NULL;
  atomic_init(&w->refs, 2);
  pthread_mutex_init(&w->mu, NULL);
  srv_call_ref(c);
  w->c = c;
  return w;
}

void srv_wait_put(srv_wait *w, bool both) {
  if (!w) return;
  int n = both ? 2 : 1;
  if (atomic_fetch_sub(&w->refs, n) == n) {
    pthread_mutex_destroy(&w->mu);
    free(w);
  }
}

void srv_wait_ready(void *arg, dev_tensor *t, pd_code code) {
  (void)t;
  srv_wait *w = arg;
  pthread_mutex_lock(&w->mu);
  srv_call *c = w->c;
  w->c = NULL;
  w->code = code;
  pthread_mutex_unlock(&w->mu);
  if (c) {
    srv_call_wake(c);
    srv_call_unref(c); /* the wake-up holds its own */
  }
  srv_wait_put(w, false);
}

pd_code srv_wait_code(const srv_wait *w) {
  pthread_mutex_lock((pthread_mutex_t *)&w->mu);
  pd_code code = w->code;
  pthread_mutex_unlock((pthread_mutex_t *)&w->mu);
  return code;
}

void srv_wait_cancel(srv_wait *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  srv_call *c = w->c;
  w->c = NULL;
  pthread_mutex_unlock(&w->mu);
  if (c) srv_call_unref(c);
}

/* --- waiting for a tensor ----------------------------------------------------- */

bool srv_call_await(srv_call *c, sched_session *ss, dev_tensor *t,
                    srv_wait **slot) {
  if (dev_tensor_is_ready(t)) return true;
  srv_wait *w = srv_wait_new(c);
  if (!w) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return false;
  }
  dev_status st = DEV_STATUS_INIT;
  if (sched_tensor_notify(ss, t, srv_wait_ready, w, &st) != PD_OK) {
    srv_wait_cancel(w);
    srv_wait_put(w, true);
    srv_call_fail(c, &st);
    return false;
  }
  *slot = w; /* the method's on_wake runs when it is computed */
  return false;
}

void srv_call_await_woken(srv_wait **slot) {
  srv_wait_put(*slot, false);
  *slot = NULL;
}

void srv_call_await_cancel(srv_wait **slot) {
  srv_wait_cancel(*slot);
  srv_wait_put(*slot, false);
  *slot = NULL;
}

/* --- what every method needs ----------------------------------------------------- */

/* A session whose tenant a reload removed or renamed (trial finding 12)
 * stays reachable by the identity that opened it, whatever tenant that
 * identity is in now; everyone else gets NOT_FOUND as for any other
 * tenant's session. Its lease runs as before, and operators can kill it. */
static bool srv_orphan_opener(srv *s, const sched_session *ss,
                              const srv_identity *id) {
  srv_tenant_terms tt;
  const char *tenant = sched_session_tenant(ss);
  return tenant[0] && id->name[0] &&
         strcmp(sched_session_identity(ss), id->name) == 0 &&
         !srv_auth_tenant_terms(s, tenant, &tt);
}

sched_session *srv_call_session(srv_call *c, ProtobufCBinaryData token) {
  sched_session *ss = NULL;
  dev_status st = DEV_STATUS_INIT;
  const srv_identity *id = NULL;
  if (srv_call_identity(c, &id, &st) != PD_OK ||
      sched_session_open(c->s->sched, token.data, token.len, &ss, &st) !=
          PD_OK) {
    srv_call_fail(c, &st);
    return NULL;
  }
  if (strcmp(sched_session_tenant(ss), id->tenant) != 0 &&
      !srv_orphan_opener(c->s, ss, id)) {
    /* Another tenant's session: to this caller it does not exist (the same
     * text as sched_find_locked's, so a token's owner cannot be probed). */
    sched_session_put(ss);
    dev_error(&st, PD_NOT_FOUND,
              "session not found: closed, lease expired, or never created");
    srv_auth_refused(c, SRV_REFUSE_OTHER_TENANT, &st);
    srv_call_fail(c, &st);
    return NULL;
  }
  return ss;
}

bool srv_call_infos_devices(sched_session *ss, srv_arena *a,
                            Paradev__V1__TensorInfo *const *infos, size_t n,
                            int32_t (*room)[PD_MAX_DEVICES]) {
  for (size_t i = 0; i < n; i++) {
    dev_tensor *t = NULL;
    dev_status st = DEV_STATUS_INIT;
    if (sched_handle_get(ss, infos[i]->id, &t, &st) != PD_OK) continue;
    const dev_devset *set = dev_tensor_devset(t);
    bool ok = true;
    if (room) {
      infos[i]->n_devices = srv_devset_to_pb(set, room[i]);
      infos[i]->devices = room[i];
    } else {
      ok =
          srv_devset_to_arena(a, set, &infos[i]->n_devices, &infos[i]->devices);
    }
    dev_tensor_release(t);
    if (!ok) return false;
  }
  return true;
}

srv_req_limits srv_call_limits(const srv_call *c) {
  srv_req_limits l = {SRV_RT(c->s, max_ids_per_request),
                      c->s->opt.limits.max_string_bytes,
                      dev_engine_num_devices(c->s->engine)};
  return l;
}
