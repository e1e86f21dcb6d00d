/* paradev.v1.Admin: the operators' service, registered only on the admin
 * Unix socket's server (see rpc.c), so the socket's file mode decides who
 * may use it. */
#define SRV_LOG_SUB SRV_SUB_ADMIN
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "paradev/v1/admin.pb-c.h"
#include "server.h"

/* --- ListSessions ---------------------------------------------------------- */

static void srv_admin_list(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__ListSessionsRequest *req = (const void *)m;
  srv *s = c->s;
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
  char *names =
      n >= 0 ? srv_arena_alloc(&a, (size_t)(n + 1) * 2 * (SCHED_NAME_MAX + 1))
             : NULL;
  if (!list || !e || !names) {
    free(v);
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  for (int i = 0; i < n; i++) {
    paradev__v1__session_summary__init(&e[i]);
    char *cn = names + (size_t)i * 2 * (SCHED_NAME_MAX + 1);
    char *job = cn + SCHED_NAME_MAX + 1;
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
    list[i] = &e[i];
  }
  Paradev__V1__ListSessionsResponse resp =
      PARADEV__V1__LIST_SESSIONS_RESPONSE__INIT;
  resp.n_sessions = (size_t)n;
  resp.sessions = list;
  resp.incarnation = s->incarnation;
  resp.draining = atomic_load(&s->draining);
  resp.device_memory_used_bytes = srv_device_memory_used(s);
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
  free(v);
}

/* --- KillSession ------------------------------------------------------------- */

typedef struct srv_kill_state {
  sched_kill_result r;
  srv_wait *w; /* the fence: the devices ran what was submitted before */
} srv_kill_state;

static void srv_admin_kill_destroy(srv_call *c) {
  srv_kill_state *k = c->user;
  if (!k) return;
  srv_wait_cancel(k->w);
  srv_wait_put(k->w, false);
  free(k);
  c->user = NULL;
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
        "KillSession: the devices could not confirm the memory is free "
        "(%s); reporting what is known",
        pd_code_name(fence));
  Paradev__V1__KillSessionResponse resp =
      PARADEV__V1__KILL_SESSION_RESPONSE__INIT;
  resp.sessions_killed = (uint32_t)k->r.sessions;
  resp.handles_freed = k->r.handles;
  resp.bytes_freed = k->r.bytes;
  resp.sessions_remaining = (uint32_t)sched_num_sessions(c->s->sched);
  resp.device_memory_used_bytes = srv_device_memory_used(c->s);
  srv_call_reply(c, &resp.base);
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

static void srv_admin_kill(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__KillSessionRequest *req = (const void *)m;
  srv *s = c->s;
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
  c->user = k;
  dev_status st = DEV_STATUS_INIT;
  if (sched_kill(s->sched, &t, &k->r, &st) != PD_OK) {
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

/* --- Drain ------------------------------------------------------------------- */

static void srv_admin_drain(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DrainRequest *req = (const void *)m;
  srv *s = c->s;
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
