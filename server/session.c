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
#include "mesh.h"
#include "ratelimit.h"
#include "server.h"

/* A tenant's session: its tenant, band and weight, and its lease and quota
 * capped at the tenant's (a larger or default ask gets the tenant's
 * maximum; CreateSession's reply says what was granted). */
static uint64_t srv_device_bytes(dev_engine *e, int d) {
  dev_memory_stats ms = {.struct_size = sizeof ms};
  if (dev_engine_memory_stats(e, d, &ms, NULL) != PD_OK) return 0;
  return ms.bytes_limit ? ms.bytes_limit : ms.bytes_total;
}

uint64_t srv_mesh_bytes(dev_engine *e) {
  uint64_t mesh = 0;
  int n = e ? dev_engine_num_devices(e) : 0;
  for (int i = 0; i < n; i++) mesh += srv_device_bytes(e, i);
  return mesh;
}

uint64_t srv_set_bytes(dev_engine *e, const dev_devset *set) {
  uint64_t b = 0;
  for (int i = 0; e && i < set->n; i++) b += srv_device_bytes(e, set->dev[i]);
  return b;
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
                               dev_devset *bound, dev_status *st) {
  const char *tok = req->job_token ? req->job_token : "";
  const char *given = req->job_id ? req->job_id : "";
  *claimed = false;
  *job = given;
  memset(bound, 0, sizeof(*bound));
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
  *bound = p.devices; /* issue #17: the job's GPUs, n == 0 for none */
  return PD_OK;
}

/* --- placement (issue #17) ---------------------------------------------------- */

/* `n` device indices of a job token or a tenant (`whose`, for the
 * messages) as a set of this daemon's mesh; FAILED_PRECONDITION for an
 * index the mesh does not have (a token minted, or a config written, for
 * another mesh). */
static pd_code srv_bound_set(const srv_req_limits *l, const uint8_t *devs,
                             int n, const char *whose, dev_devset *out,
                             dev_status *st) {
  memset(out, 0, sizeof(*out));
  for (int i = 0; i < n; i++) {
    if (devs[i] >= l->num_devices)
      return dev_error(st, PD_FAILED_PRECONDITION,
                       "%s is bound to device %d, which this paradevd does "
                       "not have (devices 0..%d)",
                       whose, devs[i], l->num_devices - 1);
    out->dev[out->n++] = devs[i];
  }
  return PD_OK;
}

/* What the session may never pass (sched_session_params.bound): its job
 * token's devices, its tenant's (`[tenant NAME] devices`), both together
 * (the devices of the job that the tenant has too: never more than
 * either), or none (*out = NULL). `who` receives the bound's source for
 * the refusals. Errors: FAILED_PRECONDITION (a bound the mesh does not
 * have, a job and tenant that share no device). */
static pd_code srv_session_bound(const srv_req_limits *l, const char *job,
                                 const dev_devset *job_devs, const char *tenant,
                                 const srv_tenant_terms *tt, dev_devset *room,
                                 const dev_devset **out, char *who,
                                 size_t who_len, dev_status *st) {
  *out = NULL;
  char jw[SRV_JOB_ID_MAX + 32], tw[SCHED_NAME_MAX + 32];
  snprintf(jw, sizeof jw, "job \"%s\"", job);
  snprintf(tw, sizeof tw, "tenant \"%s\"", tenant ? tenant : "");
  dev_devset js, ts;
  PD_TRY(srv_bound_set(l, job_devs->dev, job_devs->n, jw, &js, st));
  PD_TRY(srv_bound_set(l, tt ? tt->devices : NULL, tt ? tt->num_devices : 0, tw,
                       &ts, st));
  if (!js.n && !ts.n) return PD_OK;
  if (js.n && ts.n) {
    dev_devset both;
    memset(&both, 0, sizeof both);
    for (int i = 0; i < js.n; i++)
      if (dev_devset_index(&ts, js.dev[i]) >= 0) both.dev[both.n++] = js.dev[i];
    char a[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
    if (!both.n)
      return dev_error(st, PD_FAILED_PRECONDITION,
                       "%s was allocated devices %s and %s devices %s: they "
                       "share none, so no session of both could use any",
                       jw, dev_devset_str(&js, a, sizeof a), tw,
                       dev_devset_str(&ts, b, sizeof b));
    *room = both;
    snprintf(who, who_len, "%s (devices %s) of %s (devices %s)", jw,
             dev_devset_str(&js, a, sizeof a), tw,
             dev_devset_str(&ts, b, sizeof b));
  } else {
    *room = js.n ? js : ts;
    snprintf(who, who_len, "%s", js.n ? jw : tw);
  }
  *out = room;
  return PD_OK;
}

/* The session's allowed set as the client asked (`asked`, NULL: all of the
 * bound) within `bound` (NULL: none): PERMISSION_DENIED naming the devices
 * outside it and whose bound it is. The scheduler checks the same
 * (sched_session_create); here the message can say whose allocation. */
static pd_code srv_session_narrow(const dev_devset *asked,
                                  const dev_devset *bound, const char *who,
                                  dev_status *st) {
  if (!asked || !bound || dev_devset_is_subset(asked, bound)) return PD_OK;
  dev_devset out;
  memset(&out, 0, sizeof out);
  for (int i = 0; i < asked->n; i++)
    if (dev_devset_index(bound, asked->dev[i]) < 0)
      out.dev[out.n++] = asked->dev[i];
  char o[DEV_DEVSET_STR_MAX], b[DEV_DEVSET_STR_MAX];
  return dev_error(st, PD_PERMISSION_DENIED,
                   "CreateSessionRequest.devices: device%s %s %s not "
                   "allocated to this session: %s may use devices %s only",
                   out.n == 1 ? "" : "s", dev_devset_str(&out, o, sizeof o),
                   out.n == 1 ? "is" : "are", who,
                   dev_devset_str(bound, b, sizeof b));
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
  if (srv_check_accepting(c->s, "CreateSession", &ck) != PD_OK ||
      srv_mesh_check_whole(c->s->mesh, &ck) != PD_OK) {
    srv_call_fail(c, &ck);
    return;
  }
  srv_req_limits l = srv_call_limits(c);
  const srv_identity *id = NULL;
  const char *job = NULL;
  char proven[SRV_JOB_ID_MAX + 1];
  bool claimed = false;
  dev_devset job_devs, asked_room;
  const dev_devset *asked = NULL;
  if (srv_check_label(&l, req->client_name, "client_name", &ck) != PD_OK ||
      srv_check_label(&l, req->job_id, "job_id", &ck) != PD_OK ||
      srv_check_string(&l, req->job_token, "job_token", &ck) != PD_OK ||
      srv_devset_from_pb(&l, req->devices, req->n_devices,
                         "CreateSessionRequest.devices", &asked_room, &asked,
                         &ck) != PD_OK ||
      srv_call_identity(c, &id, &ck) != PD_OK) {
    srv_call_fail(c, &ck);
    return;
  }
  if (srv_session_job(c, req, &job, proven, &claimed, &job_devs, &ck) !=
      PD_OK) {
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
  bool tenant = id->tenant[0] && srv_auth_tenant_terms(c->s, id->tenant, &tt);
  if (tenant) srv_tenant_session_terms(c->s, id->tenant, &tt, &p);
  /* Placement (issue #17): the job's and the tenant's devices bound the
   * session; the client may narrow it within them. */
  dev_devset bound_room;
  char who[SRV_JOB_ID_MAX + SCHED_NAME_MAX + 2 * DEV_DEVSET_STR_MAX + 64];
  if (srv_session_bound(&l, job, &job_devs, id->tenant, tenant ? &tt : NULL,
                        &bound_room, &p.bound, who, sizeof who, &ck) != PD_OK ||
      srv_session_narrow(asked, p.bound, who, &ck) != PD_OK) {
    srv_call_fail(c, &ck);
    return;
  }
  p.devices = asked;
  /* Without [sessions] max_memory_quota a session may ask at most the
   * mesh's memory: more is capped there (the reply says what it got), so a
   * quota always means bytes the devices have (trial finding 11). */
  uint64_t mesh =
      SRV_RT(c->s, max_memory_quota) ? 0 : srv_mesh_bytes(c->s->engine);
  /* A session allowed fewer devices than the mesh (issue #17): the default
   * quota, when it is a share of the mesh's memory, is that share of its
   * own devices' memory, and the cap is their memory. */
  const dev_devset *allowed = asked ? asked : p.bound;
  if (allowed && !dev_devset_is_all(c->s->engine, allowed)) {
    uint64_t all = srv_mesh_bytes(c->s->engine);
    uint64_t own = srv_set_bytes(c->s->engine, allowed);
    uint64_t dq = SRV_RT(c->s, default_memory_quota);
    if (p.memory_quota == 0 && dq && all &&
        SRV_RT(c->s, default_quota_is_share))
      p.memory_quota = (uint64_t)((double)dq * ((double)own / (double)all));
    if (mesh) mesh = own;
  }
  if (mesh && p.memory_quota > mesh) p.memory_quota = mesh;
  sched_session_origin origin = {id->name, claimed};
  sched_session_info info;
  memset(&info, 0, sizeof info);
  dev_status st = DEV_STATUS_INIT;
  if (sched_session_create_from(c->s->sched, &p, &origin, &info, &st) !=
      PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  if (srv_session_recheck(c, req, job, claimed, &info) != PD_OK) return;
  /* The allowed set granted; a scheduler that leaves it unset grants what
   * the semantics say (the ask, else the bound, else the whole mesh). */
  if (info.devices.n <= 0) {
    if (asked || p.bound)
      info.devices = asked ? *asked : *p.bound;
    else
      dev_devset_all(c->s->engine, &info.devices);
  }
  char cn[SRV_LOG_QUOTED(64)], jq[SRV_LOG_QUOTED(64)];
  char ds[DEV_DEVSET_STR_MAX];
  SRV_LOG_AT(SRV_SUB_SCHED, SRV_LOG_INFO,
             "session %llu opened: client \"%s\" job \"%s\" lease %u s "
             "quota %llu bytes devices %s%s%s%s%s",
             (unsigned long long)info.seq,
             srv_log_quote(req->client_name, cn, sizeof cn),
             srv_log_quote(job, jq, sizeof jq), info.lease_s,
             (unsigned long long)info.memory_quota,
             dev_devset_str(&info.devices, ds, sizeof ds),
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
  int32_t devs[PD_MAX_DEVICES];
  resp.n_devices = srv_devset_to_pb(&info.devices, devs);
  resp.devices = devs;
  resp.num_devices = info.devices.n; /* components of a default tensor */
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
