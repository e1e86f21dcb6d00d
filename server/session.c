/* Sessions on the wire: CreateSession, KeepAlive and CloseSession. The
 * scheduler owns sessions, tokens and leases (scheduler.h); what a session's
 * end frees in the server (shared memory regions) hears of it through the
 * scheduler's end-of-session event, and so does the log (daemon.c). */
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "auth.h"
#include "log.h"
#include "server.h"

/* A tenant's session: its tenant, band and weight, and its lease and quota
 * capped at the tenant's (a larger or default ask gets the tenant's
 * maximum; CreateSession's reply says what was granted). */
static void srv_tenant_session_terms(srv *s, const char *tenant,
                                     const srv_tenant_terms *tt,
                                     sched_session_params *p) {
  p->tenant = tenant;
  p->priority = tt->priority;
  p->weight = tt->weight;
  uint32_t lease = p->lease_s ? p->lease_s : SRV_RT(s, default_lease_s);
  if (tt->max_lease_s && lease > tt->max_lease_s) p->lease_s = tt->max_lease_s;
  uint64_t quota =
      p->memory_quota ? p->memory_quota : SRV_RT(s, default_memory_quota);
  if (tt->memory_quota && (quota == 0 || quota > tt->memory_quota))
    p->memory_quota = tt->memory_quota;
}

static void srv_create_session(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__CreateSessionRequest *req = (const void *)m;
  dev_status ck = DEV_STATUS_INIT;
  if (srv_check_accepting(c->s, "CreateSession", &ck) != PD_OK) {
    srv_call_fail(c, &ck);
    return;
  }
  srv_req_limits l = srv_call_limits(c);
  if (srv_check_string(&l, req->client_name, "client_name", &ck) != PD_OK ||
      srv_check_string(&l, req->job_id, "job_id", &ck) != PD_OK) {
    srv_call_fail(c, &ck);
    return;
  }
  sched_session_params p = {req->client_name, req->job_id, req->lease_seconds,
                            req->memory_quota_bytes, NULL, 0, 0, 0};
  p.op_timeout_ms = req->op_timeout_ms; /* issue #15: deadlines */
  dev_status st = DEV_STATUS_INIT;
  const srv_identity *id = NULL;
  if (srv_call_identity(c, &id, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  srv_tenant_terms tt;
  if (id->tenant[0] && srv_auth_tenant_terms(c->s, id->tenant, &tt))
    srv_tenant_session_terms(c->s, id->tenant, &tt, &p);
  sched_session_info info;
  if (sched_session_create(c->s->sched, &p, &info, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  char cn[SRV_LOG_QUOTED(64)], job[SRV_LOG_QUOTED(64)];
  SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_INFO,
             "session %llu opened: client \"%s\" job \"%s\" lease %u s "
             "quota %llu bytes%s%s%s",
             (unsigned long long)info.seq,
             srv_log_quote(req->client_name, cn, sizeof cn),
             srv_log_quote(req->job_id, job, sizeof job), info.lease_s,
             (unsigned long long)info.memory_quota,
             p.tenant ? " tenant \"" : "", p.tenant ? p.tenant : "",
             p.tenant ? "\"" : "");
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
  /* Only the session's own tenant may close it (NOT_FOUND otherwise). */
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  sched_session_put(ss);
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
