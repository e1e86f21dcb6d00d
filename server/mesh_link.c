/* A rank's link to its mesh's coordinator (issue #16; mesh.h): a gRPC
 * client channel with its own completion queue and thread, which holds the
 * Attach stream (RankHello; the welcome; MeshFormed -> the collective
 * transport of the epoch, transport_ready; commands -> the data plane,
 * srv_mesh_apply_commands; MeshState; heartbeats every lease / 4 both
 * ways), the queue of RankMessages the data plane sends
 * (srv_mesh_send_to_coordinator; one write in flight, the rest queued), the
 * coordinator's loss (stream error, or silence for a lease: every tensor
 * dropped, srv_mesh_apply_drop_all, the transport dropped, logged; then
 * attach again with backoff, or exit with [mesh] on_coordinator_loss =
 * exit), and the store's KvSet / KvGet as blocking unary calls with
 * deadlines (their own queues, so the transport's rendezvous may run on any
 * thread, the link's included).
 *
 * Threads: the link thread alone drives the stream's queue; any thread may
 * queue a message (mu); KvSet / KvGet block their caller only. */
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SRV_LOG_SUB SRV_SUB_CORE
#include "log.h"
#include "mesh_int.h"

#define SRV_LINK_ATTACH "/paradev.v1.Mesh/Attach"
#define SRV_LINK_KVSET "/paradev.v1.Mesh/KvSet"
#define SRV_LINK_KVGET "/paradev.v1.Mesh/KvGet"

struct srv_mesh_link {
  srv_mesh *m;
  grpc_channel *ch;
  grpc_completion_queue *cq;
  pthread_t thread;
  bool thread_started;
  atomic_bool stop;

  pthread_mutex_t mu; /* the send queue, call, attached */
  grpc_call *call;    /* the Attach stream being driven */
  grpc_byte_buffer **q;
  size_t q_head, q_len, q_cap;
  grpc_byte_buffer *in_flight;
  bool sending;
  bool attached; /* welcomed on the current stream */
  double last_sent;

  /* the link thread's */
  char t_md, t_recv, t_send, t_status; /* tags: their addresses */
  grpc_byte_buffer *rbuf;
  grpc_metadata_array md_in, trailing;
  grpc_status_code code;
  grpc_slice details;
  double last_heard;
  uint64_t coord_incarnation;
  bool ever_formed;
  bool join_done; /* srv_mesh_link_start stopped waiting */
  /* The last MeshFormed built, and its coordinator's incarnation. */
  uint64_t formed_epoch, formed_inc;
};

/* --- sending --------------------------------------------------------------- */

/* Starts the next queued write (mu held). */
static void srv_link_pump(srv_mesh_link *L) {
  if (!L->call || L->sending || L->q_len == 0) return;
  L->in_flight = L->q[L->q_head];
  L->q_head = (L->q_head + 1) % L->q_cap;
  L->q_len--;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = L->in_flight;
  if (grpc_call_start_batch(L->call, &op, 1, &L->t_send, NULL) != GRPC_CALL_OK) {
    grpc_byte_buffer_destroy(L->in_flight);
    L->in_flight = NULL;
    return;
  }
  L->sending = true;
  L->last_sent = srv_mesh_now();
}

static void srv_link_queue_clear(srv_mesh_link *L) {
  while (L->q_len) {
    grpc_byte_buffer_destroy(L->q[L->q_head]);
    L->q_head = (L->q_head + 1) % L->q_cap;
    L->q_len--;
  }
}

/* Queues one packed message (mu held); `any`: also before the welcome. */
static bool srv_link_queue(srv_mesh_link *L, const uint8_t *data, size_t len,
                           bool any) {
  if (!L->call || (!any && !L->attached)) return false;
  if (L->q_len == L->q_cap) {
    size_t ncap = L->q_cap ? L->q_cap * 2 : 16;
    grpc_byte_buffer **n = malloc(ncap * sizeof *n);
    if (!n) return false;
    for (size_t i = 0; i < L->q_len; i++)
      n[i] = L->q[(L->q_head + i) % L->q_cap];
    free(L->q);
    L->q = n;
    L->q_cap = ncap;
    L->q_head = 0;
  }
  grpc_slice sl = grpc_slice_from_copied_buffer((const char *)data, len);
  L->q[(L->q_head + L->q_len++) % L->q_cap] = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  srv_link_pump(L);
  return true;
}

static bool srv_link_send_msg(srv_mesh_link *L,
                              const Paradev__V1__RankMessage *msg, bool any) {
  size_t n = protobuf_c_message_get_packed_size(&msg->base);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return false;
  protobuf_c_message_pack(&msg->base, buf);
  pthread_mutex_lock(&L->mu);
  bool ok = srv_link_queue(L, buf, n, any);
  pthread_mutex_unlock(&L->mu);
  free(buf);
  return ok;
}

static bool srv_link_send_up(srv_mesh *m, const uint8_t *packed, size_t len) {
  srv_mesh_link *L = m->link;
  if (!L) return false;
  pthread_mutex_lock(&L->mu);
  bool ok = srv_link_queue(L, packed, len, false);
  pthread_mutex_unlock(&L->mu);
  return ok;
}

/* --- the store over the channel -------------------------------------------- */

static pd_code srv_link_unary(srv_mesh *m, const char *method,
                              const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *rd,
                              double timeout_s, ProtobufCMessage **resp,
                              dev_status *st) {
  srv_mesh_link *L = m->link;
  if (!L || !L->ch)
    return dev_error(st, PD_UNAVAILABLE, "the rank has no link to the "
                                         "coordinator");
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  gpr_timespec deadline =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                   gpr_time_from_millis((int64_t)(timeout_s * 1000),
                                        GPR_TIMESPAN));
  grpc_call *call = grpc_channel_create_call(
      L->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
      grpc_slice_from_static_string(method), NULL, deadline, NULL);
  size_t n = protobuf_c_message_get_packed_size(req);
  uint8_t *buf = malloc(n ? n : 1);
  pd_code rc = PD_OK;
  if (!buf) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto done;
  }
  protobuf_c_message_pack(req, buf);
  grpc_slice sl = grpc_slice_from_copied_buffer((const char *)buf, n);
  free(buf);
  grpc_byte_buffer *out = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  grpc_byte_buffer *in = NULL;
  grpc_metadata_array md, tr;
  grpc_metadata_array_init(&md);
  grpc_metadata_array_init(&tr);
  grpc_status_code code = GRPC_STATUS_OK;
  grpc_slice details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  grpc_metadata sec;
  memset(&sec, 0, sizeof sec);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].flags = GRPC_INITIAL_METADATA_WAIT_FOR_READY;
  if (m->has_secret) { /* the store checks it, as the hello's */
    sec.key = grpc_slice_from_static_string(SRV_MESH_SECRET_MD);
    sec.value = grpc_slice_from_copied_buffer((const char *)m->secret,
                                              m->secret_len);
    ops[0].data.send_initial_metadata.count = 1;
    ops[0].data.send_initial_metadata.metadata = &sec;
  }
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = out;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &in;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &tr;
  ops[5].data.recv_status_on_client.status = &code;
  ops[5].data.recv_status_on_client.status_details = &details;
  int tag;
  if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) {
    rc = dev_error(st, PD_INTERNAL, "%s: cannot start the call", method);
  } else {
    grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME),
                                NULL);
    if (code != GRPC_STATUS_OK) {
      char *d = grpc_slice_to_c_string(details);
      rc = dev_error(st, code <= 16 ? (pd_code)code : PD_UNKNOWN,
                     "%s to the coordinator %s: %s", method, m->coordinator,
                     d);
      gpr_free(d);
    } else if (resp) {
      grpc_byte_buffer_reader r;
      if (in && grpc_byte_buffer_reader_init(&r, in)) {
        grpc_slice all = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
        *resp = protobuf_c_message_unpack(rd, NULL, GRPC_SLICE_LENGTH(all),
                                          GRPC_SLICE_START_PTR(all));
        grpc_slice_unref(all);
      }
      if (!*resp)
        rc = dev_error(st, PD_INTERNAL, "%s: an unreadable answer", method);
    }
  }
  grpc_byte_buffer_destroy(out);
  if (in) grpc_byte_buffer_destroy(in);
  grpc_metadata_array_destroy(&md);
  grpc_metadata_array_destroy(&tr);
  grpc_slice_unref(details);
  if (m->has_secret) grpc_slice_unref(sec.value);
done:
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL,
                                     gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return rc;
}

pd_code srv_mesh_link_kv_set(void *arg, const char *key, const void *value,
                             size_t len, dev_status *st) {
  srv_mesh *m = arg;
  Paradev__V1__KvSetRequest req = PARADEV__V1__KV_SET_REQUEST__INIT;
  req.key = (char *)key;
  req.value.data = (uint8_t *)value;
  req.value.len = len;
  ProtobufCMessage *resp = NULL;
  pd_code rc = srv_link_unary(m, SRV_LINK_KVSET, &req.base,
                              &paradev__v1__kv_set_response__descriptor,
                              m->coll_timeout_s, &resp, st);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

pd_code srv_mesh_link_kv_get(void *arg, const char *key, double timeout_s,
                             void **value, size_t *len, dev_status *st) {
  srv_mesh *m = arg;
  Paradev__V1__KvGetRequest req = PARADEV__V1__KV_GET_REQUEST__INIT;
  req.key = (char *)key;
  double t = timeout_s > 0 ? timeout_s : 0;
  req.timeout_ms = t * 1000 > UINT32_MAX ? UINT32_MAX : (uint32_t)(t * 1000);
  ProtobufCMessage *resp = NULL;
  pd_code rc = srv_link_unary(m, SRV_LINK_KVGET, &req.base,
                              &paradev__v1__kv_get_response__descriptor,
                              t + 5, &resp, st);
  if (rc == PD_OK) {
    const Paradev__V1__KvGetResponse *r = (const void *)resp;
    *value = malloc(r->value.len ? r->value.len : 1);
    if (!*value) {
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    } else {
      if (r->value.len) memcpy(*value, r->value.data, r->value.len);
      *len = r->value.len;
    }
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  return rc;
}

/* --- the stream ----------------------------------------------------------- */

static void srv_link_hello(srv_mesh_link *L) {
  srv_mesh *m = L->m;
  srv *s = m->s;
  Paradev__V1__RankMessage msg = PARADEV__V1__RANK_MESSAGE__INIT;
  Paradev__V1__RankHello h = PARADEV__V1__RANK_HELLO__INIT;
  h.rank = (uint32_t)m->rank;
  h.world_size = (uint32_t)m->world;
  h.incarnation = s->incarnation;
  h.backend = (char *)dev_engine_backend_name(s->engine);
  h.version = m->version;
  h.num_devices = (uint32_t)m->per_rank;
  int first = 0, count = 0;
  dev_engine_local_devices(s->engine, &first, &count);
  char *names[PD_MAX_DEVICES];
  uint64_t limits[PD_MAX_DEVICES], totals[PD_MAX_DEVICES];
  for (int i = 0; i < count && i < PD_MAX_DEVICES; i++) {
    names[h.n_device_names++] =
        (char *)dev_engine_device_name(s->engine, first + i);
    dev_memory_stats ms = {.struct_size = sizeof ms};
    if (dev_engine_memory_stats(s->engine, first + i, &ms, NULL) != PD_OK)
      ms.bytes_limit = ms.bytes_total = 0; /* unknown */
    limits[h.n_device_memory_limits++] = ms.bytes_limit;
    totals[h.n_device_memory_totals++] = ms.bytes_total;
  }
  h.device_names = names;
  h.device_memory_limits = limits;
  h.device_memory_totals = totals;
  h.last_seq = dev_engine_last_seq(s->engine);
  h.host = m->transport_host;
  if (m->has_secret) {
    h.secret.data = m->secret;
    h.secret.len = m->secret_len;
  }
  msg.hello = &h;
  srv_link_send_msg(L, &msg, true);
}

static void srv_link_formed(srv_mesh_link *L, const Paradev__V1__MeshFormed *f) {
  srv_mesh *m = L->m;
  if (L->formed_inc == L->coord_incarnation && f->epoch <= L->formed_epoch) {
    /* A coordinator's epochs only grow: an old one never replaces the
     * transport of a newer one. */
    SRV_WARN("mesh: the coordinator sent epoch %" PRIu64 " after epoch "
             "%" PRIu64 ": ignored",
             f->epoch, L->formed_epoch);
    return;
  }
  L->formed_epoch = f->epoch;
  L->formed_inc = L->coord_incarnation;
  SRV_INFO("mesh: the coordinator formed epoch %" PRIu64
           " (%zu ranks): building this rank's collective transport",
           f->epoch, f->n_ranks);
  char err[512] = "";
  bool ok = srv_mesh_build_transport(m, f->epoch, err, sizeof err);
  Paradev__V1__RankMessage msg = PARADEV__V1__RANK_MESSAGE__INIT;
  Paradev__V1__Status es = PARADEV__V1__STATUS__INIT;
  msg.transport_ready = f->epoch;
  if (!ok) {
    es.code = PD_UNAVAILABLE;
    es.message = err;
    msg.transport_error = &es;
  }
  srv_link_send_msg(L, &msg, false);
  pthread_mutex_lock(&m->mu);
  m->epoch = f->epoch;
  m->formed = true;
  m->degraded = false;
  m->ever_formed = true;
  m->reason[0] = '\0';
  srv_mesh_publish(m);
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  L->ever_formed = true;
  SRV_NOTICE("mesh: joined: rank %d of %d, epoch %" PRIu64 "%s", m->rank,
             m->world, f->epoch,
             ok ? "" : " (without a collective transport)");
  srv_health_update(m->s);
}

static void srv_link_state(srv_mesh_link *L, const Paradev__V1__MeshState *st) {
  srv_mesh *m = L->m;
  pthread_mutex_lock(&m->mu);
  bool changed = m->degraded != st->degraded;
  m->degraded = st->degraded;
  snprintf(m->reason, sizeof m->reason, "%s", st->reason ? st->reason : "");
  srv_mesh_publish(m);
  pthread_mutex_unlock(&m->mu);
  if (changed && st->degraded)
    SRV_WARN("mesh: the coordinator says the mesh is degraded: %s",
             st->reason ? st->reason : "");
  else if (changed)
    SRV_INFO("mesh: the coordinator says the mesh is whole again");
  if (changed) srv_health_update(m->s);
}

static void srv_link_message(srv_mesh_link *L) {
  srv_mesh *m = L->m;
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, L->rbuf)) return;
  grpc_slice all = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  Paradev__V1__CoordinatorMessage *msg =
      paradev__v1__coordinator_message__unpack(NULL, GRPC_SLICE_LENGTH(all),
                                               GRPC_SLICE_START_PTR(all));
  grpc_slice_unref(all);
  if (!msg) {
    SRV_WARN("mesh: an unreadable message from the coordinator (ignored)");
    return;
  }
  L->last_heard = srv_mesh_now();
  if (msg->welcome) {
    pthread_mutex_lock(&L->mu);
    L->attached = true;
    pthread_mutex_unlock(&L->mu);
    bool other = L->coord_incarnation &&
                 L->coord_incarnation != msg->welcome->coordinator_incarnation;
    L->coord_incarnation = msg->welcome->coordinator_incarnation;
    SRV_INFO("mesh: attached to the coordinator at %s%s (incarnation "
             "%016" PRIx64 ", %u ranks of %u devices)",
             m->coordinator, other ? " (a new one)" : "",
             msg->welcome->coordinator_incarnation, msg->welcome->world_size,
             msg->welcome->devices_per_rank);
  }
  if (msg->formed) srv_link_formed(L, msg->formed);
  if (msg->state) srv_link_state(L, msg->state);
  if (msg->n_commands) srv_mesh_apply_commands(m, msg->commands, msg->n_commands);
  paradev__v1__coordinator_message__free_unpacked(msg, NULL);
}

static bool srv_link_recv(srv_mesh_link *L) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &L->rbuf;
  return grpc_call_start_batch(L->call, &op, 1, &L->t_recv, NULL) ==
         GRPC_CALL_OK;
}

/* One Attach stream, from the hello to its status. True when it was
 * welcomed; the status in L->code / L->details. */
static bool srv_link_attempt(srv_mesh_link *L) {
  srv_mesh *m = L->m;
  grpc_call *call = grpc_channel_create_call(
      L->ch, NULL, GRPC_PROPAGATE_DEFAULTS, L->cq,
      grpc_slice_from_static_string(SRV_LINK_ATTACH), NULL,
      gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  grpc_metadata_array_init(&L->md_in);
  grpc_metadata_array_init(&L->trailing);
  L->details = grpc_empty_slice();
  L->code = GRPC_STATUS_OK;
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[1].data.recv_initial_metadata.recv_initial_metadata = &L->md_in;
  bool md_pending = grpc_call_start_batch(call, ops, 2, &L->t_md, NULL) ==
                    GRPC_CALL_OK;
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &L->trailing;
  ops[0].data.recv_status_on_client.status = &L->code;
  ops[0].data.recv_status_on_client.status_details = &L->details;
  bool status_pending =
      grpc_call_start_batch(call, ops, 1, &L->t_status, NULL) == GRPC_CALL_OK;
  pthread_mutex_lock(&L->mu);
  L->call = call;
  L->attached = false;
  pthread_mutex_unlock(&L->mu);
  srv_link_hello(L);
  bool recv_pending = srv_link_recv(L), cancelled = false, welcomed = false;
  L->last_heard = srv_mesh_now();
  const double hb = m->lease_s / 4;
  const double stall = hb > 0.25 ? hb : 0.25;
  double prev = L->last_heard; /* when the queue last answered */
  for (;;) {
    pthread_mutex_lock(&L->mu);
    bool sending = L->sending;
    bool attached = L->attached;
    double last_sent = L->last_sent;
    pthread_mutex_unlock(&L->mu);
    welcomed |= attached;
    if (!md_pending && !recv_pending && !status_pending && !sending) break;
    grpc_event ev = grpc_completion_queue_next(
        L->cq,
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                     gpr_time_from_millis(50, GPR_TIMESPAN)),
        NULL);
    double now = srv_mesh_now();
    /* This thread did not run for longer than a heartbeat's period (the
     * daemon was stopped, or it built a transport): the silence over that
     * gap is this rank's own, not the coordinator's; its clock restarts. */
    if (now - prev > stall && !cancelled) L->last_heard = now;
    prev = now;
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      if (cancelled || status_pending == false) continue;
      if (atomic_load(&L->stop)) {
        grpc_call_cancel_with_status(call, GRPC_STATUS_CANCELLED,
                                     "the rank is stopping", NULL);
        cancelled = true;
      } else if (attached && now - L->last_heard > m->lease_s) {
        char why[160];
        snprintf(why, sizeof why,
                 "nothing heard from the coordinator for %.0f s ([mesh] "
                 "lease_s)",
                 m->lease_s);
        grpc_call_cancel_with_status(call, GRPC_STATUS_UNAVAILABLE, why, NULL);
        cancelled = true;
      } else if (attached && now - last_sent >= hb) {
        Paradev__V1__RankMessage beat = PARADEV__V1__RANK_MESSAGE__INIT;
        beat.heartbeat = true;
        srv_link_send_msg(L, &beat, false);
      }
      continue;
    }
    if (ev.type != GRPC_OP_COMPLETE) break; /* the queue shut down */
    if (ev.tag == &L->t_md) {
      md_pending = false;
    } else if (ev.tag == &L->t_recv) {
      recv_pending = false;
      if (ev.success && L->rbuf) {
        srv_link_message(L);
        grpc_byte_buffer_destroy(L->rbuf);
        L->rbuf = NULL;
        recv_pending = srv_link_recv(L);
      }
    } else if (ev.tag == &L->t_send) {
      pthread_mutex_lock(&L->mu);
      L->sending = false;
      if (L->in_flight) grpc_byte_buffer_destroy(L->in_flight);
      L->in_flight = NULL;
      if (ev.success)
        srv_link_pump(L);
      else
        srv_link_queue_clear(L);
      pthread_mutex_unlock(&L->mu);
    } else if (ev.tag == &L->t_status) {
      status_pending = false;
      pthread_mutex_lock(&L->mu);
      L->attached = false; /* no more writes from other threads */
      pthread_mutex_unlock(&L->mu);
    }
  }
  pthread_mutex_lock(&L->mu);
  L->call = NULL;
  L->attached = false;
  srv_link_queue_clear(L);
  pthread_mutex_unlock(&L->mu);
  grpc_call_unref(call);
  grpc_metadata_array_destroy(&L->md_in);
  grpc_metadata_array_destroy(&L->trailing);
  return welcomed;
}

/* The coordinator went away after this rank attached. */
static void srv_link_lost(srv_mesh_link *L, const char *why) {
  srv_mesh *m = L->m;
  pthread_mutex_lock(&m->mu);
  m->formed = false;
  snprintf(m->reason, sizeof m->reason, "the coordinator is gone: %.400s",
           why);
  srv_mesh_publish(m);
  pthread_mutex_unlock(&m->mu);
  size_t held = srv_mesh_apply_tensors(m);
  srv_mesh_apply_drop_all(m, why);
  srv_mesh_drop_transport(m);
  bool quit = m->s->opt.mesh_on_loss == SRV_MESH_LOSS_EXIT;
  SRV_ERROR("mesh: lost the coordinator at %s (%s): dropping state: %zu "
            "tensors released and the collective transport dropped; %s",
            m->coordinator, why, held,
            quit ? "exiting ([mesh] on_coordinator_loss = exit)"
                 : "waiting for a coordinator to attach to again");
  srv_health_update(m->s);
  if (quit) {
    fflush(NULL);
    _exit(1);
  }
}

static void *srv_link_main(void *arg) {
  srv_mesh_link *L = arg;
  srv_mesh *m = L->m;
  double backoff = 0.2;
  const double join_deadline = srv_mesh_now() + m->join_timeout_s;
  while (!atomic_load(&L->stop)) {
    bool welcomed = srv_link_attempt(L);
    char *d = grpc_slice_to_c_string(L->details);
    grpc_slice_unref(L->details);
    L->details = grpc_empty_slice();
    char why[400];
    snprintf(why, sizeof why, "%s: %.300s", pd_code_name((pd_code)L->code), d);
    gpr_free(d);
    if (atomic_load(&L->stop)) break;
    if (welcomed) {
      backoff = 0.2;
      srv_link_lost(L, why);
    } else if (L->code == GRPC_STATUS_FAILED_PRECONDITION) {
      /* A mismatch this rank cannot fix by waiting (world size, version,
       * backend, devices, a duplicate rank, the secret). */
      SRV_ERROR("mesh: the coordinator at %s refused this rank: %s",
                m->coordinator, why);
      pthread_mutex_lock(&m->mu);
      snprintf(m->join_error, sizeof m->join_error,
               "the coordinator at %.200s refused this rank: %s", m->coordinator,
               why);
      m->join_fatal = true;
      pthread_cond_broadcast(&m->cv);
      bool waited = !L->join_done;
      pthread_mutex_unlock(&m->mu);
      if (!waited) {
        fflush(NULL);
        _exit(1);
      }
      break;
    } else {
      pthread_mutex_lock(&m->mu);
      snprintf(m->join_error, sizeof m->join_error,
               "cannot attach to the coordinator at %.200s: %s", m->coordinator,
               why);
      pthread_mutex_unlock(&m->mu);
      SRV_DEBUG("mesh: %s; again in %.1f s", m->join_error, backoff);
    }
    for (double t = 0; t < backoff && !atomic_load(&L->stop); t += 0.05) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    backoff = backoff * 2 > 2.0 ? 2.0 : backoff * 2;
    if (!L->ever_formed && srv_mesh_now() > join_deadline) break;
  }
  return NULL;
}

/* --- start and stop --------------------------------------------------------- */

int srv_mesh_link_start(srv_mesh *m) {
  srv_mesh_link *L = calloc(1, sizeof *L);
  if (!L) {
    SRV_ERROR("mesh: out of memory");
    return -1;
  }
  L->m = m;
  pthread_mutex_init(&L->mu, NULL);
  L->details = grpc_empty_slice();
  const srv_options *o = &m->s->opt;
  int maxmsg = o->limits.max_message_bytes > INT_MAX
                   ? INT_MAX
                   : (int)o->limits.max_message_bytes;
  grpc_arg args[5];
  memset(args, 0, sizeof args);
  const char *keys[5] = {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                         GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
                         GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                         GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
                         GRPC_ARG_MAX_RECONNECT_BACKOFF_MS};
  int vals[5] = {maxmsg, maxmsg, 200, 200, 2000};
  for (int i = 0; i < 5; i++) {
    args[i].type = GRPC_ARG_INTEGER;
    args[i].key = (char *)keys[i];
    args[i].value.integer = vals[i];
  }
  grpc_channel_args ca = {5, args};
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  L->ch = grpc_channel_create(m->coordinator, creds, &ca);
  grpc_channel_credentials_release(creds);
  L->cq = grpc_completion_queue_create_for_next(NULL);
  m->link = L;
  atomic_store(&m->send_up, srv_link_send_up);
  if (pthread_create(&L->thread, NULL, srv_link_main, L) != 0) {
    SRV_ERROR("mesh: cannot start the link thread");
    srv_mesh_link_stop(m);
    return -1;
  }
  L->thread_started = true;
  SRV_INFO("mesh: attaching to the coordinator at %s (up to %.0f s)",
           m->coordinator, m->join_timeout_s);
  double deadline = srv_mesh_now() + m->join_timeout_s;
  struct timespec ts = {(time_t)deadline,
                        (long)((deadline - (double)(time_t)deadline) * 1e9)};
  pthread_mutex_lock(&m->mu);
  while (!m->formed && !m->join_fatal && !m->interrupted &&
         srv_mesh_now() < deadline)
    pthread_cond_timedwait(&m->cv, &m->mu, &ts);
  bool formed = m->formed, interrupted = m->interrupted;
  L->join_done = true;
  char err[sizeof m->join_error];
  snprintf(err, sizeof err, "%s", m->join_error);
  bool fatal = m->join_fatal;
  pthread_mutex_unlock(&m->mu);
  if (formed) return 0;
  if (interrupted)
    SRV_ERROR("mesh: stopped (a signal) while joining the mesh%s%s",
              err[0] ? ": " : "", err);
  else if (!fatal)
    SRV_ERROR("mesh: could not join the mesh within [mesh] join_timeout_s "
              "(%.0f s): %s",
              m->join_timeout_s,
              err[0] ? err
                     : "attached, but the mesh did not form (other ranks "
                       "missing; see the coordinator's log)");
  srv_mesh_link_stop(m);
  return -1;
}

void srv_mesh_link_stop(srv_mesh *m) {
  srv_mesh_link *L = m->link;
  if (!L) return;
  atomic_store(&L->stop, true);
  atomic_store(&m->send_up, NULL);
  if (L->thread_started) pthread_join(L->thread, NULL);
  L->thread_started = false;
  if (L->cq) {
    grpc_completion_queue_shutdown(L->cq);
    while (grpc_completion_queue_next(L->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                      NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(L->cq);
    L->cq = NULL;
  }
  if (L->ch) grpc_channel_destroy(L->ch);
  L->ch = NULL;
  m->link = NULL;
  free(L->q);
  grpc_slice_unref(L->details);
  pthread_mutex_destroy(&L->mu);
  free(L);
}
