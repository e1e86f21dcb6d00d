/* Sessions on the wire: CreateSession, KeepAlive and CloseSession. The
 * scheduler owns sessions, tokens and leases (scheduler.h); what a session's
 * end frees in the server (shared memory regions) hears of it through the
 * scheduler's end-of-session event, and so does the log (daemon.c). */
#include <grpc/support/alloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "auth.h"
#include "check.h"
#include "jobs.h"
#include "log.h"
#include "ratelimit.h"
#include "server.h"

/* A tenant's session: its tenant, band and weight, and its lease and quota
 * capped at the tenant's (a larger or default ask gets the tenant's
 * maximum; CreateSession's reply says what was granted). */
uint64_t srv_mesh_bytes(dev_engine *e) {
  uint64_t mesh = 0;
  int n = e ? dev_engine_num_devices(e) : 0;
  for (int i = 0; i < n; i++) {
    dev_memory_stats ms = {.struct_size = sizeof ms};
    if (dev_engine_memory_stats(e, i, &ms, NULL) == PD_OK)
      mesh += ms.bytes_limit ? ms.bytes_limit : ms.bytes_total;
  }
  return mesh;
}

static void srv_tenant_session_terms(srv *s, const char *tenant,
                                     const srv_tenant_terms *tt,
                                     sched_session_params *p) {
  p->tenant = tenant;
  /* The session may ask for less than its tenant's band and weight, never
   * more; asking nothing (0) gets the tenant's. */
  if (p->priority == 0 || p->priority > tt->priority)
    p->priority = tt->priority;
  if (p->weight == 0 || p->weight > tt->weight) p->weight = tt->weight;
  uint32_t lease = p->lease_s ? p->lease_s : SRV_RT(s, default_lease_s);
  if (tt->max_lease_s && lease > tt->max_lease_s) p->lease_s = tt->max_lease_s;
  uint64_t quota =
      p->memory_quota ? p->memory_quota : SRV_RT(s, default_memory_quota);
  if (tt->memory_quota && (quota == 0 || quota > tt->memory_quota))
    p->memory_quota = tt->memory_quota;
}

/* The job a new session belongs to (issue #14): the job of a valid
 * job_token (which a job_id, if given too, must name), or the client's
 * claim of job_id, refused under [auth] require_job_token and otherwise
 * kept as a label (*claimed) that kills by job never match. On Unix
 * sockets a token bound to a uid works only for a peer of that uid
 * (SO_PEERCRED, whatever identity the call presents). `job` receives
 * SRV_JOB_ID_MAX + 1 bytes, or points at req->job_id for a claim. */
static pd_code srv_session_job(srv_call *c,
                               const Paradev__V1__CreateSessionRequest *req,
                               const char **job,
                               char proven[SRV_JOB_ID_MAX + 1], bool *claimed,
                               dev_status *st) {
  const char *tok = req->job_token ? req->job_token : "";
  const char *given = req->job_id ? req->job_id : "";
  *claimed = false;
  *job = given;
  if (!*tok) {
    if (!*given) return PD_OK;
    if (SRV_RT(c->s, require_job_token))
      return dev_error(st, PD_PERMISSION_DENIED,
                       "job_id given without a job token: this paradevd "
                       "takes only proven job ids ([auth] require_job_token "
                       "= true); present the job's token (job_token, "
                       "$PARADEV_JOB_TOKEN, set by the Slurm TaskProlog), "
                       "or give no job id");
    *claimed = true;
    return PD_OK;
  }
  srv_job_proof p;
  PD_TRY(srv_jobs_check(c->s->jobs, tok, strlen(tok), &p, st));
  if (*given && strcmp(given, p.job) != 0) {
    char q[SRV_LOG_QUOTED(64)];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "job_id \"%s\" is not the job of the job token (job "
                     "\"%s\"): give the token alone, or the same job id",
                     srv_log_quote(given, q, sizeof q), p.job);
  }
  /* The peer's uid, not the identity: a bearer token presented on the
   * Unix socket names the caller but does not make it the job's user. */
  unsigned peer_uid = 0;
  char *peer = p.uid >= 0 ? grpc_call_get_peer(c->call) : NULL;
  bool unix_peer = peer && srv_unix_peer_uid(peer, &peer_uid);
  gpr_free(peer);
  if (unix_peer && (long long)peer_uid != (long long)p.uid)
    return dev_error(st, PD_PERMISSION_DENIED,
                     "the job token of job \"%s\" belongs to uid:%lld; this "
                     "caller is uid:%u",
                     p.job, (long long)p.uid, peer_uid);
  memcpy(proven, p.job, sizeof p.job);
  *job = proven;
  return PD_OK;
}

/* KillJob revokes the token, then kills the job's sessions; a session made
 * from the token while that ran could escape both. So the token is asked
 * again once the session exists: still valid, the session was made before
 * the revocation, and the kill (which comes after it) finds it; revoked,
 * the session is closed here. The call is finished on failure. */
static pd_code srv_session_recheck(srv_call *c,
                                   const Paradev__V1__CreateSessionRequest *req,
                                   const char *job, bool claimed,
                                   const sched_session_info *info) {
  if (claimed || !job[0] || !req->job_token || !req->job_token[0]) return PD_OK;
  srv_job_proof p;
  dev_status st = DEV_STATUS_INIT;
  if (srv_jobs_check(c->s->jobs, req->job_token, strlen(req->job_token), &p,
                     &st) == PD_OK &&
      strcmp(p.job, job) == 0)
    return PD_OK;
  sched_session_close(c->s->sched, info->token, SCHED_TOKEN_BYTES, NULL, NULL);
  srv_call_finish(c, PD_UNAUTHENTICATED,
                  "the job token of job \"%s\" was revoked (KillJob: the "
                  "job ended) while the session was being opened",
                  job);
  return PD_UNAUTHENTICATED;
}

static void srv_create_session(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__CreateSessionRequest *req = (const void *)m;
  dev_status ck = DEV_STATUS_INIT;
  if (srv_check_accepting(c->s, "CreateSession", &ck) != PD_OK) {
    srv_call_fail(c, &ck);
    return;
  }
  srv_req_limits l = srv_call_limits(c);
  const srv_identity *id = NULL;
  const char *job = NULL;
  char proven[SRV_JOB_ID_MAX + 1];
  bool claimed = false;
  if (srv_check_label(&l, req->client_name, "client_name", &ck) != PD_OK ||
      srv_check_label(&l, req->job_id, "job_id", &ck) != PD_OK ||
      srv_check_string(&l, req->job_token, "job_token", &ck) != PD_OK ||
      srv_call_identity(c, &id, &ck) != PD_OK) {
    srv_call_fail(c, &ck);
    return;
  }
  if (srv_session_job(c, req, &job, proven, &claimed, &ck) != PD_OK) {
    srv_auth_refused(c, SRV_REFUSE_JOB_TOKEN, &ck); /* logged, counted */
    srv_call_fail(c, &ck);
    return;
  }
  sched_session_params p = {req->client_name,
                            job,
                            req->lease_seconds,
                            req->memory_quota_bytes,
                            NULL,
                            0,
                            0,
                            0,
                            NULL,
                            NULL};
  p.op_timeout_ms = req->op_timeout_ms; /* issue #15: deadlines */
  /* Band and weight (issue #15), checked by sched_session_create; a
   * tenant's are the most its sessions get. */
  p.priority = req->priority;
  p.weight = req->weight;
  srv_tenant_terms tt;
  if (id->tenant[0] && srv_auth_tenant_terms(c->s, id->tenant, &tt))
    srv_tenant_session_terms(c->s, id->tenant, &tt, &p);
  /* Without [sessions] max_memory_quota a session may ask at most the
   * mesh's memory: more is capped there (the reply says what it got), so a
   * quota always means bytes the devices have (trial finding 11). */
  uint64_t mesh =
      SRV_RT(c->s, max_memory_quota) ? 0 : srv_mesh_bytes(c->s->engine);
  if (mesh && p.memory_quota > mesh) p.memory_quota = mesh;
  sched_session_origin origin = {id->name, claimed};
  sched_session_info info;
  dev_status st = DEV_STATUS_INIT;
  if (sched_session_create_from(c->s->sched, &p, &origin, &info, &st) !=
      PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  if (srv_session_recheck(c, req, job, claimed, &info) != PD_OK) return;
  char cn[SRV_LOG_QUOTED(64)], jq[SRV_LOG_QUOTED(64)];
  SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_INFO,
             "session %llu opened: client \"%s\" job \"%s\" lease %u s "
             "quota %llu bytes%s%s%s%s",
             (unsigned long long)info.seq,
             srv_log_quote(req->client_name, cn, sizeof cn),
             srv_log_quote(job, jq, sizeof jq), info.lease_s,
             (unsigned long long)info.memory_quota,
             p.tenant ? " tenant \"" : "", p.tenant ? p.tenant : "",
             p.tenant ? "\"" : "",
             claimed ? " (job id claimed without a job token: a label)" : "");
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
