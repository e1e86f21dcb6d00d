/* paradev.v1.Admin: the operators' service. Every method first asks for an
 * operator (srv_admin_operator): a call on the admin Unix socket is one
 * (the socket's group and mode decide who reaches it); on the client
 * listeners, where rpc.c serves Admin too, only an identity listed as an
 * operator is. Job tokens (CreateJobToken, KillJob) are jobs.c's. */
#define SRV_LOG_SUB SRV_SUB_ADMIN
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "jobs.h"
#include "log.h"
#include "ratelimit.h"
#include "paradev/v1/admin.pb-c.h"
#include "server.h"

/* --- who may call ------------------------------------------------------------ */

/* True when the caller of `method` is an operator; otherwise the call is
 * finished (PERMISSION_DENIED naming the method and the identity, or the
 * identity's own error) and the refusal logged. */
static bool srv_admin_operator(srv_call *c, const char *method) {
  const srv_identity *id = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (srv_call_identity(c, &id, &st) != PD_OK) {
    SRV_WARN("refused Admin.%s: %s", method, st.msg);
    srv_call_fail(c, &st);
    return false;
  }
  if (id->is_operator) return true;
  char who[SRV_LOG_QUOTED(96)], tenant[SRV_LOG_QUOTED(64)];
  srv_log_quote(id->name[0] ? id->name : "(none)", who, sizeof who);
  srv_log_quote(id->tenant[0] ? id->tenant : "(none)", tenant, sizeof tenant);
  dev_error(&st, PD_PERMISSION_DENIED,
            "Admin.%s needs an operator: identity \"%s\" (tenant \"%s\") is "
            "not one (use the admin socket as a member of its group, or an "
            "identity listed in [auth] operators)",
            method, who, tenant);
  srv_auth_refused(c, SRV_REFUSE_NOT_OPERATOR, &st); /* logged, counted */
  srv_call_fail(c, &st);
  return false;
}

/* --- ListSessions ---------------------------------------------------------- */

static void srv_admin_list(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__ListSessionsRequest *req = (const void *)m;
  srv *s = c->s;
  if (!srv_admin_operator(c, "ListSessions")) return;
  sched_session_view *v = NULL;
  int n = sched_list_sessions(s->sched, req->job_id, &v);
  srv_arena a = {NULL};
  Paradev__V1__SessionSummary **list =
      n >= 0 ? srv_arena_alloc(&a, sizeof(*list) * (size_t)(n + 1)) : NULL;
  Paradev__V1__SessionSummary *e =
      n >= 0 ? srv_arena_alloc(&a, sizeof(*e) * (size_t)(n + 1)) : NULL;
  /* Client names and job ids are the clients' bytes: proto3 strings must
   * be UTF-8, so they go out as valid UTF-8 (any language kept; control
   * characters and other bytes as '?'). */
  size_t per = 3 * (SCHED_NAME_MAX + 1) + SCHED_IDENTITY_MAX + 1;
  char *names = n >= 0 ? srv_arena_alloc(&a, (size_t)(n + 1) * per) : NULL;
  if (!list || !e || !names) {
    free(v);
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  for (int i = 0; i < n; i++) {
    paradev__v1__session_summary__init(&e[i]);
    char *cn = names + (size_t)i * per;
    char *job = cn + SCHED_NAME_MAX + 1;
    char *tenant = job + SCHED_NAME_MAX + 1;
    char *ident = tenant + SCHED_NAME_MAX + 1;
    e[i].session_id = v[i].seq;
    e[i].client_name = srv_log_utf8(v[i].client, cn, SCHED_NAME_MAX + 1);
    e[i].job_id = srv_log_utf8(v[i].job, job, SCHED_NAME_MAX + 1);
    e[i].memory_bytes = v[i].bytes;
    e[i].handles = v[i].handles;
    e[i].age_seconds = v[i].age_s;
    e[i].idle_seconds = v[i].idle_s;
    e[i].lease_seconds = v[i].lease_s;
    e[i].memory_quota_bytes = v[i].memory_quota;
    e[i].queued_ops = v[i].queued_ops;
    e[i].tenant = srv_log_utf8(v[i].tenant, tenant, SCHED_NAME_MAX + 1);
    e[i].identity = srv_log_utf8(v[i].identity, ident, SCHED_IDENTITY_MAX + 1);
    e[i].job_proven = v[i].job[0] && !v[i].job_claimed;
    list[i] = &e[i];
  }
  Paradev__V1__ListSessionsResponse resp =
      PARADEV__V1__LIST_SESSIONS_RESPONSE__INIT;
  resp.n_sessions = (size_t)n;
  resp.sessions = list;
  resp.incarnation = s->incarnation;
  resp.draining = atomic_load(&s->draining);
  resp.device_memory_used_bytes = srv_device_memory_used(s);
  resp.exiting = atomic_load(&s->exiting);
  resp.job_tokens = (uint32_t)srv_jobs_count(s->jobs);
  resp.require_job_token = SRV_RT(s, require_job_token);
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
  free(v);
}

/* --- KillSession, KillJob ----------------------------------------------------- */

typedef struct srv_kill_state {
  sched_kill_result r;
  srv_wait *w;  /* the fence: the devices ran what was submitted before */
  bool job;     /* KillJob: its reply */
  bool revoked; /* KillJob: the job had a live token */
  char job_id[SRV_JOB_ID_MAX + 1];
} srv_kill_state;

static void srv_admin_kill_destroy(srv_call *c) {
  srv_kill_state *k = c->user;
  if (!k) return;
  srv_wait_cancel(k->w);
  srv_wait_put(k->w, false);
  free(k);
  c->user = NULL;
}

/* Sessions still bound to `job` (not those that only claim it). */
static uint32_t srv_admin_job_sessions(srv *s, const char *job) {
  sched_session_view *v = NULL;
  int n = sched_list_sessions(s->sched, job, &v);
  uint32_t bound = 0;
  for (int i = 0; i < n; i++) bound += !v[i].job_claimed;
  free(v);
  return bound;
}

static void srv_admin_kill_reply(srv_call *c, srv_kill_state *k) {
  srv *s = c->s;
  if (!k->job) {
    Paradev__V1__KillSessionResponse resp =
        PARADEV__V1__KILL_SESSION_RESPONSE__INIT;
    resp.sessions_killed = (uint32_t)k->r.sessions;
    resp.handles_freed = k->r.handles;
    resp.bytes_freed = k->r.bytes;
    resp.sessions_remaining = (uint32_t)sched_num_sessions(s->sched);
    resp.device_memory_used_bytes = srv_device_memory_used(s);
    srv_call_reply(c, &resp.base);
    return;
  }
  Paradev__V1__KillJobResponse resp = PARADEV__V1__KILL_JOB_RESPONSE__INIT;
  resp.job_id = k->job_id;
  resp.token_revoked = k->revoked;
  resp.sessions_killed = (uint32_t)k->r.sessions;
  resp.handles_freed = k->r.handles;
  resp.bytes_freed = k->r.bytes;
  resp.job_sessions_remaining = srv_admin_job_sessions(s, k->job_id);
  resp.sessions_remaining = (uint32_t)sched_num_sessions(s->sched);
  resp.device_memory_used_bytes = srv_device_memory_used(s);
  srv_call_reply(c, &resp.base);
}

/* The fence passed: the memory of the killed sessions is free. */
static void srv_admin_kill_done(srv_call *c) {
  srv_kill_state *k = c->user;
  pd_code fence = PD_OK;
  if (k->w) {
    fence = srv_wait_code(k->w);
    srv_wait_put(k->w, false);
    k->w = NULL;
  }
  if (fence != PD_OK)
    SRV_WARN(
        "%s: the devices could not confirm the memory is free "
        "(%s); reporting what is known",
        k->job ? "KillJob" : "KillSession", pd_code_name(fence));
  srv_admin_kill_reply(c, k);
}

static void srv_admin_kill_cancel(srv_call *c) {
  srv_kill_state *k = c->user;
  if (k && k->w) {
    srv_wait_cancel(k->w);
    srv_wait_put(k->w, false);
    k->w = NULL;
  }
  srv_call_finish_cancelled(c, "KillSession (the sessions are gone already)");
}

/* Kills the target's sessions, then answers once the devices caught up
 * (srv_admin_kill_done). `k` becomes the call's. */
static void srv_admin_kill_run(srv_call *c, srv_kill_state *k,
                               const sched_kill_target *t, const char *what) {
  srv *s = c->s;
  c->user = k;
  dev_status st = DEV_STATUS_INIT;
  if (sched_kill(s->sched, t, &k->r, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  SRV_INFO("killed %s: %d session%s, %llu handles, %llu bytes", what,
           k->r.sessions, k->r.sessions == 1 ? "" : "s",
           (unsigned long long)k->r.handles, (unsigned long long)k->r.bytes);
  srv_wait *w = srv_wait_new(c);
  if (!w) {
    srv_admin_kill_done(c);
    return;
  }
  k->w = w;
  if (sched_fence(s->sched, srv_wait_ready, w, &st) != PD_OK) {
    srv_wait_cancel(w);
    srv_wait_put(w, true);
    k->w = NULL;
    srv_admin_kill_done(c);
  }
}

static void srv_admin_kill(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__KillSessionRequest *req = (const void *)m;
  if (!srv_admin_operator(c, "KillSession")) return;
  sched_kill_target t = {NULL, 0, NULL, 0};
  char what[SRV_LOG_QUOTED(64) + 64]; /* for the log line */
  switch (req->target_case) {
    case PARADEV__V1__KILL_SESSION_REQUEST__TARGET_SESSION_TOKEN:
      t.token = req->session_token.data ? req->session_token.data : (void *)"";
      t.token_len = req->session_token.len;
      snprintf(what, sizeof(what), "the session of a token");
      break;
    case PARADEV__V1__KILL_SESSION_REQUEST__TARGET_JOB_ID: {
      char job[SRV_LOG_QUOTED(64)];
      t.job = req->job_id ? req->job_id : "";
      snprintf(what, sizeof(what), "the sessions of job \"%s\"",
               srv_log_quote(t.job, job, sizeof job));
      break;
    }
    case PARADEV__V1__KILL_SESSION_REQUEST__TARGET_SESSION_ID:
      t.seq = req->session_id;
      if (t.seq == 0) {
        srv_call_finish(c, PD_INVALID_ARGUMENT,
                        "session_id 0 names no session (they count from 1)");
        return;
      }
      snprintf(what, sizeof(what), "session %llu", (unsigned long long)t.seq);
      break;
    default:
      srv_call_finish(c, PD_INVALID_ARGUMENT,
                      "KillSession needs a target: session_token, job_id or "
                      "session_id");
      return;
  }
  srv_kill_state *k = calloc(1, sizeof(*k));
  if (!k) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  srv_admin_kill_run(c, k, &t, what);
}

/* KillJob: the token goes first, so that no session can be bound to the
 * job between the kill and the reply. */
static void srv_admin_kill_job(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__KillJobRequest *req = (const void *)m;
  if (!srv_admin_operator(c, "KillJob")) return;
  const char *job = req->job_id ? req->job_id : "";
  size_t n = strlen(job);
  dev_status st = DEV_STATUS_INIT;
  if (srv_jobs_check_id(job, &st) != PD_OK) { /* no token could name it */
    srv_call_fail(c, &st);
    return;
  }
  srv_kill_state *k = calloc(1, sizeof(*k));
  if (!k) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  k->job = true;
  memcpy(k->job_id, job, n + 1);
  k->revoked = srv_jobs_revoke(c->s->jobs, job, &st);
  if (st.code != PD_OK)
    SRV_ERROR("KillJob: job \"%s\"'s token is revoked, but %s", job, st.msg);
  char q[SRV_LOG_QUOTED(64)], what[SRV_LOG_QUOTED(64) + 64];
  snprintf(what, sizeof what, "job \"%s\" (token %s)",
           srv_log_quote(job, q, sizeof q),
           k->revoked ? "revoked" : "none live");
  sched_kill_target t = {NULL, 0, k->job_id, 0};
  srv_admin_kill_run(c, k, &t, what);
}

/* --- CreateJobToken ------------------------------------------------------------ */

static void srv_admin_job_token(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__CreateJobTokenRequest *req = (const void *)m;
  srv *s = c->s;
  if (!srv_admin_operator(c, "CreateJobToken")) return;
  uint32_t life = req->lifetime_seconds ? req->lifetime_seconds
                                        : SRV_RT(s, job_token_lifetime_s);
  char token[SRV_JOB_TOKEN_CHARS + 1];
  bool replaced = false;
  dev_status st = DEV_STATUS_INIT;
  if (srv_jobs_mint(s->jobs, req->job_id, req->uid, life, token, &replaced,
                    &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  char uid[32] = "any uid";
  if (req->uid >= 0) snprintf(uid, sizeof uid, "uid %lld", (long long)req->uid);
  SRV_INFO("job token for job \"%s\" (%s, %u s)%s", req->job_id, uid, life,
           replaced ? "; the job's older token no longer works" : "");
  Paradev__V1__CreateJobTokenResponse resp =
      PARADEV__V1__CREATE_JOB_TOKEN_RESPONSE__INIT;
  resp.token = token;
  resp.job_id = req->job_id;
  resp.lifetime_seconds = life;
  resp.replaced = replaced;
  srv_call_reply(c, &resp.base);
  OPENSSL_cleanse(token, sizeof token);
}

/* --- Drain ------------------------------------------------------------------- */

static void srv_admin_drain(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DrainRequest *req = (const void *)m;
  srv *s = c->s;
  if (!srv_admin_operator(c, "Drain")) return;
  if (req->resume && req->exit_when_drained) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "resume and exit_when_drained contradict each other");
    return;
  }
  if (req->resume) {
    if (atomic_load(&s->exiting)) {
      srv_call_finish(c, PD_FAILED_PRECONDITION,
                      "paradevd is draining to exit (SIGTERM or a drain "
                      "with exit_when_drained); it cannot resume");
      return;
    }
    if (srv_resume(s)) SRV_INFO("back in service (Drain with resume)");
  } else {
    bool started = srv_drain(s, req->exit_when_drained);
    if (started || req->exit_when_drained)
      SRV_INFO(
          "draining on an operator's request%s",
          req->exit_when_drained ? "; exiting when queued work is done" : "");
  }
  sched_stats ss = {.struct_size = sizeof(ss)};
  sched_get_stats(s->sched, &ss);
  Paradev__V1__DrainResponse resp = PARADEV__V1__DRAIN_RESPONSE__INIT;
  resp.draining = atomic_load(&s->draining);
  resp.exiting = atomic_load(&s->exiting);
  resp.sessions = (uint32_t)ss.sessions;
  resp.ops_outstanding = ss.ops_queued + ss.ops_in_flight;
  srv_call_reply(c, &resp.base);
}

/* --- SetLogLevel --------------------------------------------------------------- */

static void srv_admin_log(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__SetLogLevelRequest *req = (const void *)m;
  if (!srv_admin_operator(c, "SetLogLevel")) return;
  int levels[SRV_SUB_COUNT], before[SRV_SUB_COUNT];
  srv_log_get(levels);
  memcpy(before, levels, sizeof(before));
  char err[512];
  if (!srv_log_parse_spec(req->spec, levels, err, sizeof(err))) {
    char cs[128];
    srv_call_finish(c, PD_INVALID_ARGUMENT, "log spec '%s': %s",
                    srv_log_clean(req->spec, cs, sizeof cs), err);
    return;
  }
  char prev[256], cur[256];
  srv_log_spec(before, prev, sizeof(prev));
  srv_log_spec(levels, cur, sizeof(cur));
  srv_log_set(levels);
  SRV_LOG_AT(SRV_SUB_ADMIN, SRV_LOG_WARN, "log levels: %s (were %s)", cur,
             prev);
  Paradev__V1__SetLogLevelResponse resp =
      PARADEV__V1__SET_LOG_LEVEL_RESPONSE__INIT;
  resp.previous = prev;
  resp.current = cur;
  srv_call_reply(c, &resp.base);
}

const srv_handlers srv_h_ListSessions = {.on_request = srv_admin_list};
const srv_handlers srv_h_KillSession = {.on_request = srv_admin_kill,
                                        .on_destroy = srv_admin_kill_destroy,
                                        .on_wake = srv_admin_kill_done,
                                        .on_cancel = srv_admin_kill_cancel,
                                        .early_close = true};
const srv_handlers srv_h_Drain = {.on_request = srv_admin_drain};
const srv_handlers srv_h_SetLogLevel = {.on_request = srv_admin_log};
const srv_handlers srv_h_CreateJobToken = {.on_request = srv_admin_job_token};
const srv_handlers srv_h_KillJob = {.on_request = srv_admin_kill_job,
                                    .on_destroy = srv_admin_kill_destroy,
                                    .on_wake = srv_admin_kill_done,
                                    .on_cancel = srv_admin_kill_cancel,
                                    .early_close = true};
