/* gRPC C-core plumbing of paradevd: completion queues and their threads,
 * registered methods, per-call state machines, the generic UNIMPLEMENTED
 * answer, and shutdown. See server.h for the threading model and NOTES.md for
 * the C-core facts this relies on. */
#include <errno.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "log.h"
#include "server.h"

/* A bidi stream stops reading while this many replies wait to be sent, and
 * resumes below half of it (backpressure instead of unbounded memory). */
#define SRV_WQ_HIGH 64

static pthread_t srv_threads[SRV_MAX_THREADS];

/* The calls in progress (started, not yet destroyed), so that srv_stop can
 * end the ones still open after the grace period with a status that says
 * why; and set then, so that their wake-ups end them. */
static pthread_mutex_t srv_live_mu = PTHREAD_MUTEX_INITIALIZER;
static srv_call *srv_live; /* linked through live_prev/live_next */
static size_t srv_live_n;
static atomic_bool srv_ending_calls;
/* Started calls not yet destroyed (srv_calls_in_progress). */
static atomic_int srv_started_calls;

static void srv_on_request(srv_call *c, bool ok);
static void srv_on_generic(srv_call *c, bool ok);
static void srv_on_recv(srv_call *c, bool ok);
static void srv_on_send(srv_call *c, bool ok);
static void srv_on_close(srv_call *c, bool ok);
static void srv_on_final(srv_call *c, bool ok);
static void srv_on_wake(srv_call *c, bool ok);
static void srv_pump(srv_call *c);

static bool srv_unary_like(const srv_call *c) {
  return c->m && (c->m->kind == SRV_UNARY || c->m->kind == SRV_SERVER_STREAM);
}

static srv_call *srv_call_new(srv *s, const srv_method *m, grpc_server *gs,
                              int cqi) {
  srv_call *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->s = s;
  c->m = m;
  c->gs = gs;
  c->cq_index = cqi;
  atomic_init(&c->refs, 1);
  atomic_init(&c->cancelled, false);
  grpc_metadata_array_init(&c->md);
  c->t_req = (struct srv_tag){m ? srv_on_request : srv_on_generic, c};
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
  if (c->live_prev) c->live_prev->live_next = c->live_next;
  else srv_live = c->live_next;
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
  if (c->m && c->m->on_destroy) c->m->on_destroy(c);
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
  atomic_fetch_sub(&c->s->active_calls, 1);
  free(c);
}

void srv_call_ref(srv_call *c) { atomic_fetch_add(&c->refs, 1); }

void srv_call_unref(srv_call *c) {
  if (atomic_fetch_sub(&c->refs, 1) == 1) srv_call_destroy(c);
}

/* Starts a batch holding a reference for it. */
static bool srv_batch(srv_call *c, const grpc_op *ops, size_t n,
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

/* --- arming --------------------------------------------------------------- */

static void srv_arm(srv *s, const srv_method *m, grpc_server *gs, int cqi) {
  srv_call *c = srv_call_new(s, m, gs, cqi);
  if (!c) {
    SRV_ERROR("out of memory arming %s", m ? m->path : "(generic)");
    return;
  }
  grpc_call_error e;
  if (m) {
    e = grpc_server_request_registered_call(
        gs, m->registered, &c->call, &c->deadline, &c->md,
        srv_unary_like(c) ? &c->payload : NULL, s->cqs[cqi], s->cqs[cqi],
        &c->t_req);
  } else {
    grpc_call_details *d = calloc(1, sizeof(*d));
    if (!d) {
      srv_call_destroy(c);
      return;
    }
    grpc_call_details_init(d);
    c->user = d;
    e = grpc_server_request_call(gs, &c->call, d, &c->md, s->cqs[cqi],
                                 s->cqs[cqi], &c->t_req);
  }
  if (e != GRPC_CALL_OK) {
    SRV_ERROR("internal: request_call failed (%d) for %s", (int)e,
              m ? m->path : "(generic)");
    srv_call_destroy(c);
  }
}

static void srv_on_generic(srv_call *c, bool ok) {
  srv *s = c->s;
  if (!ok) { /* shutting down */
    srv_call_unref(c);
    return;
  }
  if (!atomic_load(&s->shutting_down)) srv_arm(s, NULL, c->gs, c->cq_index);
  atomic_fetch_add(&s->unknown_method_calls, 1);
  grpc_call_details *d = c->user;
  char method[256];
  size_t len = GRPC_SLICE_LENGTH(d->method);
  if (len >= sizeof(method)) len = sizeof(method) - 1;
  memcpy(method, GRPC_SLICE_START_PTR(d->method), len);
  method[len] = '\0';
  for (size_t i = 0; i < len; i++)
    if (method[i] < 0x20 || method[i] > 0x7e) method[i] = '?';
  SRV_DEBUG("unknown method %s: UNIMPLEMENTED", method);
  c->finishing = true;
  c->md_sent = true;
  c->status_sent = true;
  char msg[400];
  snprintf(msg, sizeof(msg),
           "method %s is not implemented by paradevd %s (see "
           "paradev/v1/paradev.proto for the service)",
           method, SRV_VERSION);
  grpc_slice details = grpc_slice_from_copied_string(msg);
  grpc_op ops[3];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[1].data.send_status_from_server.status = GRPC_STATUS_UNIMPLEMENTED;
  ops[1].data.send_status_from_server.status_details = &details;
  ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[2].data.recv_close_on_server.cancelled = &c->close_cancelled;
  srv_batch(c, ops, 3, &c->t_final);
  grpc_slice_unref(details);
  srv_call_unref(c);
}

/* --- per-call events ------------------------------------------------------- */

static void srv_start_close(srv_call *c) {
  c->close_started = true;
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  srv_batch(c, &op, 1, &c->t_close);
}

static void srv_read(srv_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof(op));
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->payload;
  c->reading = true;
  if (!srv_batch(c, &op, 1, &c->t_recv)) c->reading = false;
}

/* Unpack budget. Small nested messages (an Operation with its attrs) grow
 * about tenfold when unpacked, bytes fields not at all; so allow 16x, but at
 * most 256 MiB beyond the message itself, whatever its shape. */
static size_t srv_budget_for(grpc_byte_buffer *bb) {
  size_t len = grpc_byte_buffer_length(bb);
  size_t extra = len * 15;
  if (extra > ((size_t)256 << 20)) extra = (size_t)256 << 20;
  return len + extra + ((size_t)1 << 20);
}

static void srv_on_request(srv_call *c, bool ok) {
  srv *s = c->s;
  if (!ok) { /* the server is shutting down: the slot was never used */
    srv_call_unref(c);
    return;
  }
  if (!atomic_load(&s->shutting_down)) srv_arm(s, c->m, c->gs, c->cq_index);
  const srv_method *m = c->m;
  c->started = true;
  atomic_fetch_add(&srv_started_calls, 1);
  srv_live_add(c);
  SRV_DEBUG("call %s", m->path);
  if (srv_unary_like(c)) {
    if (m->kind == SRV_SERVER_STREAM || m->early_close) srv_start_close(c);
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
        m->on_request(c, c->req);
    }
  } else {
    srv_start_close(c);
    srv_read(c);
  }
  srv_call_unref(c);
}

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
    if (!c->finishing) c->m->on_message(c, NULL);
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
  } else {
    if (!c->finishing) c->m->on_message(c, msg);
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
  if (c->wq_len == 0 && !c->finishing && c->m->on_drained &&
      !atomic_load(&c->cancelled))
    c->m->on_drained(c);
  srv_pump(c);
  srv_call_unref(c);
}

static void srv_on_close(srv_call *c, bool ok) {
  if (c->close_cancelled) {
    atomic_store(&c->cancelled, true);
    if (!c->finishing && !c->status_sent && c->m && c->m->on_cancel)
      c->m->on_cancel(c);
  }
  srv_call_unref(c);
}

static void srv_on_final(srv_call *c, bool ok) { srv_call_unref(c); }

static void srv_on_wake(srv_call *c, bool ok) {
  if (atomic_load(&srv_ending_calls) && c->m && !c->finishing &&
      !c->status_sent) {
    /* srv_stop: the grace period is over. UNAVAILABLE is gRPC's code for a
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
    if (c->m->on_cancel) c->m->on_cancel(c);
  }
  if (!c->finishing && !c->status_sent && c->m && c->m->on_wake)
    c->m->on_wake(c);
  srv_call_unref(c);
}

/* Ends every call in progress from its own thread (srv_on_wake); returns
 * how many were asked to end. */
static int srv_end_live_calls(void) {
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
  return srv_batch(c, NULL, 0, &c->t_wake);
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
    if (!srv_batch(c, ops, n, &c->t_send)) {
      c->writing = false;
      grpc_byte_buffer_destroy(c->in_flight);
      c->in_flight = NULL;
    }
    return;
  }
  if (!c->finishing) return;
  grpc_slice details = grpc_slice_from_copied_string(c->fin_msg ? c->fin_msg : "");
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
  srv_batch(c, ops, n, &c->t_final);
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
  srv_batch(c, ops, n, &c->t_final);
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
  /* Messages quote what the client sent (op names, ids); keep the status
   * printable ASCII whatever those bytes were. */
  char clean[sizeof(buf)];
  c->fin_msg = strdup(srv_log_clean(buf, clean, sizeof(clean)));
  if (code != PD_OK) {
    srv_wq_clear(c);
    SRV_DEBUG("%s -> %s: %s", c->m ? c->m->path : "?", pd_code_name(code),
              clean);
  }
  srv_pump(c);
}

void srv_call_fail(srv_call *c, const dev_status *st) {
  pd_code code = st->code == PD_OK ? PD_INTERNAL : st->code;
  srv_call_finish(c, code, "%s", st->msg[0] ? st->msg : pd_code_name(code));
}

/* --- threads, start, stop -------------------------------------------------- */

static void *srv_cq_main(void *arg) {
  grpc_completion_queue *cq = arg;
  for (;;) {
    grpc_event ev =
        grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    struct srv_tag *t = ev.tag;
    t->fn(t->c, ev.success != 0);
  }
  return NULL;
}

/* "127.0.0.1:0" bound to port 41234 -> "127.0.0.1:41234". */
static void srv_bound_name(const char *addr, int port, char *out, size_t len) {
  const char *colon = strrchr(addr, ':');
  if (strncmp(addr, "unix:", 5) == 0 || !colon) {
    snprintf(out, len, "%s", addr);
    return;
  }
  snprintf(out, len, "%.*s:%d", (int)(colon - addr), addr, port);
}

/* Destroys a server that was never started: gRPC wants a shutdown first
 * once it has listeners. */
static void srv_server_abandon(grpc_server *gs) {
  if (!gs) return;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  int tag;
  grpc_server_shutdown_and_notify(gs, cq, &tag);
  grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                              NULL);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                     NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  grpc_server_destroy(gs);
}

/* True when something accepts connections on the Unix socket `path`. gRPC
 * unlinks a socket file before it binds, so without this check a second
 * daemon would silently take a live daemon's socket away from it; a stale
 * file (nothing listening) may go. */
static bool unix_socket_live(const char *path) {
  struct sockaddr_un sa;
  if (strlen(path) >= sizeof(sa.sun_path)) return false;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  bool live = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  close(fd);
  return live;
}

/* Refuses an address another live process serves (see unix_socket_live). */
static bool addr_taken(const char *addr) {
  if (strncmp(addr, "unix:", 5) != 0 || !unix_socket_live(addr + 5)) return false;
  SRV_ERROR("cannot listen on %s: another process is serving on this socket "
            "(stop it first, or choose another path)", addr);
  return true;
}

/* A socket in /tmp/paradevd-UID (the default without a runtime directory)
 * is bound only once that directory is this user's alone
 * (srv_private_dir_prepare); false with the reason in `err` otherwise. */
static bool srv_socket_dir_ready(const char *path, char *err, size_t errlen) {
  char dir[SRV_ADDR_MAX];
  srv_tmp_socket_dir(dir, sizeof(dir));
  size_t n = strlen(dir);
  if (strncmp(path, dir, n) != 0 || path[n] != '/') return true;
  return srv_private_dir_prepare(dir, err, errlen);
}

int srv_start(srv *s) {
  atomic_store(&srv_ending_calls, false);
  if (srv_shm_init(s) != 0) return -1;
  grpc_init();
  grpc_arg args[3];
  int maxmsg = s->opt.limits.max_message_bytes > INT_MAX
                   ? INT_MAX
                   : (int)s->opt.limits.max_message_bytes;
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = maxmsg;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = maxmsg;
  /* gRPC sets SO_REUSEPORT by default: a second daemon on the same port
   * would then split the connections with the first. */
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
  args[2].value.integer = 0;
  grpc_channel_args chargs = {3, args};
  grpc_channel_args admin_args = {1, &args[2]};
  s->server = grpc_server_create(&chargs, NULL);
  if (s->opt.admin_socket[0]) s->admin_server = grpc_server_create(&admin_args, NULL);
  s->num_cqs = s->opt.num_threads;
  for (int i = 0; i < s->num_cqs; i++) {
    s->cqs[i] = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cqs[i], NULL);
    if (s->admin_server)
      grpc_server_register_completion_queue(s->admin_server, s->cqs[i], NULL);
  }
  for (int k = 0; k < 2; k++) {
    grpc_server *gs = k == 0 ? s->server : s->admin_server;
    srv_method *const *table = k == 0 ? srv_methods : srv_admin_methods;
    for (int i = 0; gs && table[i]; i++) {
      srv_method *m = table[i];
      grpc_server_register_method_payload_handling ph =
          (m->kind == SRV_UNARY || m->kind == SRV_SERVER_STREAM)
              ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER
              : GRPC_SRM_PAYLOAD_NONE;
      m->server = gs;
      m->registered = grpc_server_register_method(gs, m->path, NULL, ph, 0);
      if (!m->registered) {
        SRV_ERROR("internal: cannot register %s", m->path);
        goto fail;
      }
    }
  }
  for (int i = 0; i < s->opt.num_listen; i++) {
    const char *addr = s->opt.listen[i];
    char why[768];
    if (strncmp(addr, "unix:", 5) == 0 &&
        !srv_socket_dir_ready(addr + 5, why, sizeof(why))) {
      SRV_ERROR("cannot listen on %s: %s", addr, why);
      goto fail;
    }
    if (addr_taken(addr)) goto fail;
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(s->server, addr, creds);
    grpc_server_credentials_release(creds);
    if (port == 0) {
      SRV_ERROR("cannot listen on %s (address in use, bad address, or no "
                "permission; run with GRPC_VERBOSITY=DEBUG for gRPC's reason)",
                addr);
      goto fail;
    }
    char name[512];
    srv_bound_name(addr, port, name, sizeof(name));
    SRV_INFO("listening on %s", name);
  }
  if (s->admin_server) {
    /* The socket's mode decides who may use the Admin service: create it
     * with no more than admin_socket_mode, then set exactly that. */
    char addr[SRV_ADDR_MAX + 8], why[768];
    snprintf(addr, sizeof(addr), "unix:%s", s->opt.admin_socket);
    if (!srv_socket_dir_ready(s->opt.admin_socket, why, sizeof(why))) {
      if (s->opt.admin_socket_set) {
        SRV_ERROR("cannot listen on the admin socket %s: %s",
                  s->opt.admin_socket, why);
        goto fail;
      }
      SRV_WARN("no admin service on the default admin socket %s: %s",
               s->opt.admin_socket, why);
      srv_server_abandon(s->admin_server);
      s->admin_server = NULL;
      goto admin_done;
    }
    bool taken = !s->opt.admin_socket_set ? unix_socket_live(s->opt.admin_socket)
                                          : addr_taken(addr);
    if (taken && s->opt.admin_socket_set) goto fail;
    if (taken) {
      /* The default path is another daemon's: serve without the Admin
       * service rather than take it away or not start at all. */
      SRV_WARN("no admin service: another process serves the default admin "
               "socket %s (set [daemon] admin_socket or --admin-socket)",
               s->opt.admin_socket);
      srv_server_abandon(s->admin_server);
      s->admin_server = NULL;
      goto admin_done;
    }
    mode_t old = umask((mode_t)(~s->opt.admin_socket_mode & 0777));
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(s->admin_server, addr, creds);
    grpc_server_credentials_release(creds);
    umask(old);
    if (port == 0 && !s->opt.admin_socket_set) {
      /* Only the default path failed (no runtime directory, say): go on
       * without the Admin service rather than not start at all. */
      SRV_WARN("no admin service: cannot listen on the default admin socket "
               "%s (set [daemon] admin_socket or --admin-socket)",
               s->opt.admin_socket);
      srv_server_abandon(s->admin_server);
      s->admin_server = NULL;
    } else if (port == 0) {
      SRV_ERROR("cannot listen on the admin socket %s (its directory must "
                "exist and be writable; set [daemon] admin_socket or "
                "--admin-socket, or '' to turn the Admin service off)",
                s->opt.admin_socket);
      goto fail;
    } else if (chmod(s->opt.admin_socket, (mode_t)s->opt.admin_socket_mode) !=
               0) {
      SRV_ERROR("cannot set mode %04o on the admin socket %s: %s",
                s->opt.admin_socket_mode, s->opt.admin_socket, strerror(errno));
      goto fail;
    } else {
      SRV_INFO("admin service on unix:%s (mode %04o)", s->opt.admin_socket,
               s->opt.admin_socket_mode);
    }
  }
admin_done:
  grpc_server_start(s->server);
  if (s->admin_server) grpc_server_start(s->admin_server);
  for (int i = 0; i < s->num_cqs; i++) {
    for (int j = 0; srv_methods[j]; j++) srv_arm(s, srv_methods[j], s->server, i);
    srv_arm(s, NULL, s->server, i);
    if (s->admin_server) {
      for (int j = 0; srv_admin_methods[j]; j++)
        srv_arm(s, srv_admin_methods[j], s->admin_server, i);
      srv_arm(s, NULL, s->admin_server, i);
    }
  }
  for (int i = 0; i < s->num_cqs; i++)
    pthread_create(&srv_threads[i], NULL, srv_cq_main, s->cqs[i]);
  return 0;

fail:
  srv_server_abandon(s->server);
  s->server = NULL;
  srv_server_abandon(s->admin_server);
  s->admin_server = NULL;
  for (int i = 0; i < s->num_cqs; i++) {
    grpc_completion_queue_shutdown(s->cqs[i]);
    while (grpc_completion_queue_next(s->cqs[i],
                                      gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cqs[i]);
  }
  grpc_shutdown();
  srv_shm_destroy(s);
  return -1;
}

int srv_calls_in_progress(void) { return atomic_load(&srv_started_calls); }

void srv_stop(srv *s) {
  atomic_store(&s->shutting_down, true);
  grpc_completion_queue *scq = grpc_completion_queue_create_for_pluck(NULL);
  int tags[2];
  grpc_server *servers[2] = {s->server, s->admin_server};
  for (int k = 0; k < 2; k++)
    if (servers[k]) grpc_server_shutdown_and_notify(servers[k], scq, &tags[k]);
  gpr_timespec grace = gpr_time_add(
      gpr_now(GPR_CLOCK_MONOTONIC),
      gpr_time_from_millis(s->opt.grace_ms, GPR_TIMESPAN));
  bool ended = false;
  for (int k = 0; k < 2; k++) {
    if (!servers[k]) continue;
    grpc_event ev = grpc_completion_queue_pluck(scq, &tags[k], grace, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT && !ended) {
      /* End the remaining calls ourselves, saying why (gRPC's own
       * cancellation says only "Cancelling all calls"); then, after a
       * second for those statuses to go out, cancel what is left. */
      ended = true;
      int n = srv_end_live_calls();
      SRV_INFO("grace period of %d ms over: ending the %d remaining calls "
               "with UNAVAILABLE",
               s->opt.grace_ms, n);
      grace = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                           gpr_time_from_millis(1000, GPR_TIMESPAN));
      ev = grpc_completion_queue_pluck(scq, &tags[k], grace, NULL);
    }
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      SRV_INFO("cancelling the calls that are still open");
      grpc_server_cancel_all_calls(servers[k]);
      grpc_completion_queue_pluck(scq, &tags[k],
                                  gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    }
  }
  grpc_completion_queue_shutdown(scq);
  while (grpc_completion_queue_pluck(scq, NULL,
                                     gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(scq);
  /* Calls still end on the queues (their last operations complete there).
   * None waits on the devices (see server.h), so this is quick; a queue
   * must not shut down while a call could still wake on it. */
  for (int waited = 0; atomic_load(&s->active_calls) > 0; waited += 10) {
    if (waited == 30000) {
      SRV_WARN("%d calls still active after 30 s; exiting without "
               "releasing gRPC",
               atomic_load(&s->active_calls));
      /* Not srv_shm_destroy: a call still copying may be using a region,
       * and the process is about to exit anyway. */
      return;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  grpc_server_destroy(s->server);
  s->server = NULL;
  if (s->admin_server) grpc_server_destroy(s->admin_server);
  s->admin_server = NULL;
  for (int i = 0; i < s->num_cqs; i++) grpc_completion_queue_shutdown(s->cqs[i]);
  for (int i = 0; i < s->num_cqs; i++) pthread_join(srv_threads[i], NULL);
  for (int i = 0; i < s->num_cqs; i++) grpc_completion_queue_destroy(s->cqs[i]);
  grpc_shutdown();
  srv_shm_destroy(s);
}

/* --- one-shot waits ---------------------------------------------------------- */

struct srv_wait {
  atomic_int refs; /* the call's side and the callback's side */
  pthread_mutex_t mu;
  srv_call *c;     /* set while the call waits; holds a call reference */
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
