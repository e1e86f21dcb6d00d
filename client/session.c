/* libparadev: the session lifecycle: CreateSession, CloseSession, the
 * keep-alive thread that renews the lease, the accessors (the allowed
 * device set among them) and fresh ids. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "client_int.h"

int64_t pdc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

pd_code pdc_session_check(pd_session *s, pd_status *st) {
  if (!s) return pdc_error(st, PD_INVALID_ARGUMENT, "session is NULL");
  if (atomic_load(&s->closed))
    return pdc_error(
        st, PD_FAILED_PRECONDITION,
        "the session was closed (pd_session_close); open a new one");
  return PD_OK;
}

void pdc_session_touch(pd_session *s) {
  atomic_store(&s->last_call_ms, pdc_now_ms());
}

pd_code pdc_check_devices(const int32_t *devices, int n, const char *what,
                          pd_status *st) {
  if (n < 0 || n > PD_MAX_DEVICES)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s: n_devices is %d; expected 0 (the session's default "
                     "placement) to %d device indices",
                     what, n, PD_MAX_DEVICES);
  if (n > 0 && !devices)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s: devices is NULL with n_devices %d; expected an array "
                     "of %d device indices",
                     what, n, n);
  return PD_OK;
}

/* --- keep-alive ------------------------------------------------------------- */

/* How often an idle session renews its lease: a third of the lease, so two
 * renewals may be lost before it ends. */
static int64_t pdc_ka_period_ms(const pd_session *s) {
  int64_t p = (int64_t)s->lease_s * 1000 / 3;
  return p < 100 ? 100 : p;
}

static pd_code pdc_keep_alive_rpc(pd_session *s, const pd_call_options *call,
                                  pd_status *st) {
  Paradev__V1__KeepAliveRequest req = PARADEV__V1__KEEP_ALIVE_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  Paradev__V1__KeepAliveResponse *resp = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_KeepAlive, &req.base,
                   &paradev__v1__keep_alive_response__descriptor,
                   (ProtobufCMessage **)&resp, call, st));
  pd_code rc = PD_OK;
  if (resp->incarnation != s->incarnation)
    rc = pdc_error(st, PD_NOT_FOUND,
                   "the daemon restarted (incarnation %016" PRIx64
                   ", the session's was %016" PRIx64
                   "): the session and its tensors are gone",
                   resp->incarnation, s->incarnation);
  else
    pdc_session_touch(s);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

static void *pdc_ka_main(void *arg) {
  pd_session *s = arg;
  pd_cancel *cancel = s->ka_cancel;
  pd_status st;
  pthread_mutex_lock(&s->ka_mu);
  while (!s->ka_stop) {
    int64_t period = pdc_ka_period_ms(s);
    int64_t due = atomic_load(&s->last_call_ms) + period;
    int64_t now = pdc_now_ms();
    if (now < due) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      int64_t wait = due - now;
      ts.tv_sec += wait / 1000;
      ts.tv_nsec += (long)(wait % 1000) * 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&s->ka_cv, &s->ka_mu, &ts);
      continue;
    }
    pthread_mutex_unlock(&s->ka_mu);
    pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
    o.timeout_ms = period < 10000 ? period : 10000;
    o.cancel = cancel;
    pd_code rc = pdc_keep_alive_rpc(s, &o, &st);
    pthread_mutex_lock(&s->ka_mu);
    if (s->ka_stop) break;
    if (rc != PD_OK) {
      s->ka_code = rc;
      memcpy(s->ka_msg, st.msg, sizeof(s->ka_msg));
      /* A session the daemon lost stays lost: stop asking. */
      if (rc == PD_NOT_FOUND || rc == PD_UNAUTHENTICATED) break;
      pdc_session_touch(s); /* retry after a period, not at once */
    } else {
      s->ka_code = PD_OK;
      s->ka_msg[0] = '\0';
    }
  }
  pthread_mutex_unlock(&s->ka_mu);
  return NULL;
}

static void pdc_ka_stop(pd_session *s) {
  if (!s->ka_running) return;
  pthread_mutex_lock(&s->ka_mu);
  s->ka_stop = true;
  pthread_cond_signal(&s->ka_cv);
  pthread_mutex_unlock(&s->ka_mu);
  pd_cancel_trigger(s->ka_cancel); /* a renewal in flight ends now */
  pthread_join(s->ka_thread, NULL);
  s->ka_running = false;
}

/* --- sessions ------------------------------------------------------------------ */

/* The allowed device set from the reply; a daemon older than issue #17 sends
 * only num_devices, and its sessions span the whole mesh [0..n). */
static void pdc_session_set_devices(
    pd_session *s, const Paradev__V1__CreateSessionResponse *r) {
  if (r->n_devices > 0) {
    s->num_devices = (int)r->n_devices;
    for (size_t i = 0; i < r->n_devices; i++) s->devices[i] = r->devices[i];
  } else {
    s->num_devices = r->num_devices;
    for (int i = 0; i < r->num_devices; i++) s->devices[i] = i;
  }
}

pd_session *pd_session_new(pd_client *c, const pd_session_options *opts,
                           const pd_call_options *call, pd_status *st) {
  pd_session_options o = PD_SESSION_OPTIONS_INITIALIZER;
  if (!c) {
    pdc_error(st, PD_INVALID_ARGUMENT, "client is NULL");
    return NULL;
  }
  if (opts) {
    if (opts->struct_size < offsetof(pd_session_options, keep_alive) ||
        opts->struct_size > sizeof(o)) {
      pdc_error(st, PD_INVALID_ARGUMENT,
                "pd_session_options.struct_size is %zu; start from "
                "PD_SESSION_OPTIONS_INITIALIZER",
                opts->struct_size);
      return NULL;
    }
    memcpy(&o, opts, opts->struct_size);
  }
  if (pdc_check_devices(o.devices, o.num_devices, "pd_session_options.devices",
                        st) != PD_OK)
    return NULL;
  Paradev__V1__CreateSessionRequest req =
      PARADEV__V1__CREATE_SESSION_REQUEST__INIT;
  req.client_name = (char *)(o.client_name ? o.client_name : "libparadev");
  /* Under Slurm, sessions carry the job's token (the prolog minted it, the
   * TaskProlog exported it) so that the epilog's KillJob ends them. A job
   * id without one is only a claim, a label, which a daemon with [auth]
   * require_job_token refuses: so only the caller's own job_id is sent,
   * never $SLURM_JOB_ID, which would make every session of a shell inside
   * a job fail there although the user gave no job id. */
  const char *token = o.job_token ? o.job_token : getenv("PARADEV_JOB_TOKEN");
  if (token && !*token) token = NULL;
  const char *job = o.job_id;
  req.job_id = (char *)(job ? job : "");
  req.job_token = (char *)(token ? token : "");
  req.lease_seconds = o.lease_seconds;
  req.memory_quota_bytes = o.memory_quota_bytes;
  req.op_timeout_ms = o.op_timeout_ms;
  req.priority = o.priority; /* zero from the initializer for older callers */
  req.weight = o.weight;
  req.n_devices = (size_t)o.num_devices;
  req.devices = o.num_devices ? (int32_t *)o.devices : NULL;
  Paradev__V1__CreateSessionResponse *resp = NULL;
  if (pdc_unary(c, PDC_M_CreateSession, &req.base,
                &paradev__v1__create_session_response__descriptor,
                (ProtobufCMessage **)&resp, call, st) != PD_OK)
    return NULL;
  if (resp->n_devices > PD_MAX_DEVICES ||
      (resp->n_devices == 0 &&
       (resp->num_devices < 0 || resp->num_devices > PD_MAX_DEVICES))) {
    pdc_error(st, PD_INTERNAL,
              "CreateSession: the daemon gave the session %zu devices "
              "(num_devices %d); this library holds at most %d",
              resp->n_devices, resp->num_devices, PD_MAX_DEVICES);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return NULL;
  }
  pd_session *s = calloc(1, sizeof(*s));
  if (!s || resp->session_token.len == 0 ||
      !(s->token = malloc(resp->session_token.len))) {
    if (s && resp->session_token.len == 0)
      pdc_error(st, PD_INTERNAL, "CreateSession: the daemon sent no token");
    else
      pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    free(s);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return NULL;
  }
  s->c = c;
  s->token_len = resp->session_token.len;
  memcpy(s->token, resp->session_token.data, s->token_len);
  s->lease_s = resp->lease_seconds;
  s->incarnation = resp->incarnation;
  s->memory_quota = resp->memory_quota_bytes;
  pdc_session_set_devices(s, resp);
  protobuf_c_message_free_unpacked(&resp->base, NULL);
  atomic_init(&s->closed, false);
  atomic_init(&s->next_id, PD_FIRST_LIBRARY_ID);
  atomic_init(&s->last_call_ms, pdc_now_ms());
  s->ka_code = PD_OK;
  pthread_mutex_init(&s->ka_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->ka_cv, &ca);
  pthread_condattr_destroy(&ca);
  if (o.keep_alive && s->lease_s > 0) {
    s->ka_cancel = pd_cancel_new();
    int e = s->ka_cancel ? pthread_create(&s->ka_thread, NULL, pdc_ka_main, s)
                         : ENOMEM;
    if (e != 0) {
      pdc_error(st, PD_RESOURCE_EXHAUSTED,
                "cannot start the keep-alive thread: %s", strerror(e));
      pd_session_delete(s);
      return NULL;
    }
    s->ka_running = true;
  }
  pdc_ok(st);
  return s;
}

pd_code pd_session_close(pd_session *s, const pd_call_options *call,
                         pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  pd_code rc = PD_OK;
  atomic_store(&s->closed, true);
  pdc_ka_stop(s);
  Paradev__V1__CloseSessionRequest req =
      PARADEV__V1__CLOSE_SESSION_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  Paradev__V1__CloseSessionResponse *resp = NULL;
  rc = pdc_unary(s->c, PDC_M_CloseSession, &req.base,
                 &paradev__v1__close_session_response__descriptor,
                 (ProtobufCMessage **)&resp, call, st);
  if (rc == PD_OK) protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

void pd_session_delete(pd_session *s) {
  if (!s) return;
  if (!atomic_load(&s->closed)) {
    pd_call_options o = PD_CALL_OPTIONS_INITIALIZER;
    o.timeout_ms = 2000;
    pd_session_close(s, &o, NULL);
  }
  pdc_ka_stop(s);
  pd_cancel_delete(s->ka_cancel);
  pthread_cond_destroy(&s->ka_cv);
  pthread_mutex_destroy(&s->ka_mu);
  free(s->token);
  free(s);
}

pd_code pd_session_keep_alive(pd_session *s, const pd_call_options *call,
                              pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  return pdc_keep_alive_rpc(s, call, st);
}

pd_code pd_session_keep_alive_status(pd_session *s, pd_status *st) {
  if (!s) return pdc_error(st, PD_INVALID_ARGUMENT, "session is NULL");
  pthread_mutex_lock(&s->ka_mu);
  pd_code rc = s->ka_code;
  if (rc == PD_OK)
    pdc_ok(st);
  else
    pdc_error(st, rc, "keep-alive: %s", s->ka_msg);
  pthread_mutex_unlock(&s->ka_mu);
  return rc;
}

int pd_session_num_devices(const pd_session *s) {
  return s ? s->num_devices : 0;
}
int pd_session_devices(const pd_session *s, int32_t *out, int cap) {
  if (!s) return 0;
  for (int i = 0; out && i < cap && i < s->num_devices; i++)
    out[i] = s->devices[i];
  return s->num_devices;
}
uint32_t pd_session_lease_seconds(const pd_session *s) {
  return s ? s->lease_s : 0;
}
uint64_t pd_session_incarnation(const pd_session *s) {
  return s ? s->incarnation : 0;
}
uint64_t pd_session_memory_quota(const pd_session *s) {
  return s ? s->memory_quota : 0;
}
pd_client *pd_session_client(const pd_session *s) { return s ? s->c : NULL; }

uint64_t pd_session_new_id(pd_session *s) {
  return atomic_fetch_add(&s->next_id, 1);
}
