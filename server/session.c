/* Sessions on the wire: CreateSession, KeepAlive and CloseSession. The
 * scheduler owns sessions, tokens and leases (scheduler.h); what a session's
 * end frees in the server (shared memory regions) hears of it through the
 * scheduler's end-of-session event, and so does the log (daemon.c). */
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "log.h"
#include "server.h"

static void srv_create_session(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__CreateSessionRequest *req = (const void *)m;
  if (atomic_load(&c->s->draining)) {
    srv_call_finish(
        c, PD_UNAVAILABLE,
        "paradevd is draining (%s): it takes no new sessions; "
        "open one on another daemon or retry later",
        atomic_load(&c->s->exiting) ? "shutting down" : "out of service");
    return;
  }
  srv_req_limits l = srv_call_limits(c);
  dev_status ck = DEV_STATUS_INIT;
  if (srv_check_label(&l, req->client_name, "client_name", &ck) != PD_OK ||
      srv_check_label(&l, req->job_id, "job_id", &ck) != PD_OK) {
    srv_call_fail(c, &ck);
    return;
  }
  sched_session_params p = {req->client_name, req->job_id, req->lease_seconds,
                            req->memory_quota_bytes, NULL, 0, 0};
  sched_session_info info;
  dev_status st = DEV_STATUS_INIT;
  if (sched_session_create(c->s->sched, &p, &info, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  char cn[SRV_LOG_QUOTED(64)], job[SRV_LOG_QUOTED(64)];
  SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_INFO,
             "session %llu opened: client \"%s\" job \"%s\" lease %u s "
             "quota %llu bytes",
             (unsigned long long)info.seq,
             srv_log_quote(req->client_name, cn, sizeof cn),
             srv_log_quote(req->job_id, job, sizeof job), info.lease_s,
             (unsigned long long)info.memory_quota);
  Paradev__V1__CreateSessionResponse resp =
      PARADEV__V1__CREATE_SESSION_RESPONSE__INIT;
  resp.session_token.data = info.token;
  resp.session_token.len = SCHED_TOKEN_BYTES;
  resp.lease_seconds = info.lease_s;
  resp.incarnation = c->s->incarnation;
  resp.memory_quota_bytes = info.memory_quota;
  resp.num_devices = dev_engine_num_devices(c->s->engine);
  srv_call_reply(c, &resp.base);
}

static void srv_keep_alive(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__KeepAliveRequest *req = (const void *)m;
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  Paradev__V1__KeepAliveResponse resp = PARADEV__V1__KEEP_ALIVE_RESPONSE__INIT;
  resp.incarnation = c->s->incarnation;
  resp.lease_seconds = sched_session_lease_s(ss);
  sched_session_put(ss);
  srv_call_reply(c, &resp.base);
}

static void srv_close_session(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__CloseSessionRequest *req = (const void *)m;
  uint64_t freed = 0;
  dev_status st = DEV_STATUS_INIT;
  if (sched_session_close(c->s->sched, req->session_token.data,
                          req->session_token.len, &freed, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  /* Its end was logged, and its shared memory regions released, by the
   * scheduler's observers (daemon.c, shm_region.c) before this returned. */
  Paradev__V1__CloseSessionResponse resp =
      PARADEV__V1__CLOSE_SESSION_RESPONSE__INIT;
  resp.incarnation = c->s->incarnation;
  resp.handles_freed = freed;
  srv_call_reply(c, &resp.base);
}

const srv_handlers srv_h_CreateSession = {.on_request = srv_create_session};
const srv_handlers srv_h_KeepAlive = {.on_request = srv_keep_alive};
const srv_handlers srv_h_CloseSession = {.on_request = srv_close_session};
