/* Sessions and their tokens: creating, finding (by token), opening, closing
 * and the end every session comes to (close, expiry, kill, stop), and the
 * references that keep a session's memory alive past its end. The table is
 * under sched.mu; a session's own state under its mu (sched_int.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "sched_int.h"

/* Constant-time comparison: a token must not leak through timing. */
static bool sched_token_eq(const uint8_t *a, const uint8_t *b) {
  unsigned d = 0;
  for (int i = 0; i < SCHED_TOKEN_BYTES; i++) d |= (unsigned)(a[i] ^ b[i]);
  return d == 0;
}

static void sched_put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t sched_get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The incarnation, then 128 random bits. */
static pd_code sched_make_token(sched *s, uint8_t *token, dev_status *st) {
  sched_put_le64(token, s->cfg.incarnation);
  size_t got = 0;
  while (got < 16) {
    ssize_t r = getrandom(token + 8 + got, 16 - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return dev_error(st, PD_INTERNAL, "getrandom failed: %s",
                       strerror(errno));
    got += (size_t)r;
  }
  return PD_OK;
}

static pd_code sched_copy_name(char *dst, const char *src, const char *what,
                               dev_status *st) {
  size_t len = src ? strlen(src) : 0;
  if (len > SCHED_NAME_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s is %zu bytes; the limit (max_string_bytes) is %d",
                     what, len, SCHED_NAME_MAX);
  if (len) memcpy(dst, src, len);
  dst[len] = '\0';
  return PD_OK;
}

/* The lease and quota a session asking `p` gets, checked against the
 * limits. */
static pd_code sched_session_terms(sched *s, const sched_session_params *p,
                                   uint32_t *lease_out, uint64_t *quota_out,
                                   dev_status *st) {
  uint32_t max_lease = SCHED_LIM(s, max_lease_s);
  uint32_t lease = p->lease_s ? p->lease_s : SCHED_LIM(s, default_lease_s);
  if (lease > max_lease)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "lease_seconds %u is over the limit max_lease_seconds = %u", lease,
        max_lease);
  uint64_t max_quota = SCHED_LIM(s, max_quota);
  uint64_t quota =
      p->memory_quota ? p->memory_quota : SCHED_LIM(s, default_quota);
  if (max_quota && quota > max_quota)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "memory_quota_bytes %llu is over the limit "
                     "max_memory_quota = %llu bytes",
                     (unsigned long long)quota, (unsigned long long)max_quota);
  if (max_quota && quota == 0) quota = max_quota;
  *lease_out = lease;
  *quota_out = quota;
  return PD_OK;
}

/* Puts a new session in the table, numbering it and counting it in its
 * tenant's account; RESOURCE_EXHAUSTED at max_sessions or at the tenant's. */
static pd_code sched_insert(sched *s, sched_session *ss, dev_status *st) {
  pthread_mutex_lock(&s->mu);
  int max_sessions = SCHED_LIM(s, max_sessions);
  if (s->num_sessions >= max_sessions) {
    pthread_mutex_unlock(&s->mu);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the daemon holds max_sessions = %d sessions; close one "
                     "or wait for a lease to end",
                     max_sessions);
  }
  if (ss->tenant[0]) {
    pd_code c = sched_tenant_join_locked(s, ss, st);
    if (c != PD_OK) {
      pthread_mutex_unlock(&s->mu);
      return c;
    }
  }
  if (!ss->tn) ss->roots = s->cfg.storage_roots;
  ss->seq = s->next_seq++;
  ss->next = s->sessions;
  s->sessions = ss;
  s->num_sessions++;
  pthread_mutex_unlock(&s->mu);
  return PD_OK;
}

pd_code sched_session_create(sched *s, const sched_session_params *p,
                             sched_session_info *out, dev_status *st) {
  return sched_session_create_from(s, p, NULL, out, st);
}

pd_code sched_session_create_from(sched *s, const sched_session_params *p,
                                  const sched_session_origin *origin,
                                  sched_session_info *out, dev_status *st) {
  sched_session_origin none = {NULL, false};
  if (!origin) origin = &none;
  uint32_t lease = 0;
  uint64_t quota = 0;
  PD_TRY(sched_session_terms(s, p, &lease, &quota, st));
  dev_devset allowed;
  PD_TRY(sched_session_allowed(s, p, &allowed, st));
  sched_session *ss = calloc(1, sizeof(*ss));
  if (!ss) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  ss->devices = allowed;
  pd_code c;
  PD_TRY_GOTO(sched_copy_name(ss->client, p->client_name, "client_name", st), c,
              fail);
  PD_TRY_GOTO(sched_copy_name(ss->job, p->job_id, "job_id", st), c, fail);
  PD_TRY_GOTO(sched_copy_name(ss->tenant, p->tenant, "tenant", st), c, fail);
  size_t idlen = origin->identity ? strlen(origin->identity) : 0;
  if (idlen > SCHED_IDENTITY_MAX) {
    c = dev_error(st, PD_INVALID_ARGUMENT,
                  "identity is %zu bytes; the limit is %d", idlen,
                  SCHED_IDENTITY_MAX);
    goto fail;
  }
  if (idlen) memcpy(ss->identity, origin->identity, idlen);
  ss->job_claimed = origin->job_claimed && ss->job[0];
  if (p->priority < SCHED_PRIORITY_MIN || p->priority > SCHED_PRIORITY_MAX) {
    c = dev_error(st, PD_INVALID_ARGUMENT,
                  "priority %d out of range: expected %d to %d", p->priority,
                  SCHED_PRIORITY_MIN, SCHED_PRIORITY_MAX);
    goto fail;
  }
  if (p->weight > SCHED_WEIGHT_MAX) {
    c = dev_error(st, PD_INVALID_ARGUMENT,
                  "weight %u out of range: expected 1 to %d (0: 1)", p->weight,
                  SCHED_WEIGHT_MAX);
    goto fail;
  }
  ss->priority = p->priority;
  ss->weight = p->weight ? p->weight : 1;
  if (!sched_policy_session_init(ss)) {
    c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto fail;
  }
  PD_TRY_GOTO(sched_make_token(s, ss->token, st), c, fail);
  atomic_init(&ss->refs, 1); /* the table's */
  ss->owner = s;
  ss->lease_s = lease;
  ss->op_timeout_ms = p->op_timeout_ms;
  ss->quota = quota;
  ss->created_ms = sched_now_ms();
  atomic_init(&ss->expires_ms, ss->created_ms + (int64_t)lease * 1000);
  pthread_mutex_init(&ss->mu, NULL);
  c = sched_insert(s, ss, st);
  if (c != PD_OK) {
    pthread_mutex_destroy(&ss->mu);
    goto fail;
  }
  atomic_fetch_add(&s->n_created, 1);
  memcpy(out->token, ss->token, SCHED_TOKEN_BYTES);
  out->seq = ss->seq;
  out->lease_s = lease;
  out->memory_quota = ss->quota;
  out->devices = ss->devices;
  return PD_OK;

fail:
  sched_policy_session_fini(ss); /* accepts one never set up */
  free(ss);
  return c;
}

pd_code sched_find_locked(sched *s, const void *token, size_t len,
                          sched_session **out, dev_status *st) {
  if (len != SCHED_TOKEN_BYTES)
    return dev_error(st, PD_UNAUTHENTICATED,
                     "malformed session token: %zu bytes, expected %d (the "
                     "session_token CreateSession returned)",
                     len, SCHED_TOKEN_BYTES);
  /* Nothing persists across restarts, so a real earlier run's token and a
   * forged one look alike: the message names both possibilities. */
  if (sched_get_le64(token) != s->cfg.incarnation)
    return dev_error(st, PD_NOT_FOUND,
                     "session token is not from this run of paradevd (token "
                     "incarnation %016" PRIx64 ", this daemon %016" PRIx64
                     "): the daemon restarted since the session was created, "
                     "or the token was not issued by it; create a new session",
                     sched_get_le64(token), s->cfg.incarnation);
  for (sched_session *ss = s->sessions; ss; ss = ss->next) {
    if (sched_token_eq(ss->token, token)) {
      *out = ss;
      return PD_OK;
    }
  }
  /* Ended by the daemon (sched_kill_because): say why, newest first. */
  uint64_t kept = s->n_ended < SCHED_ENDED_KEPT ? s->n_ended : SCHED_ENDED_KEPT;
  for (uint64_t i = 0; i < kept; i++) {
    uint64_t k = (s->n_ended - 1 - i) % SCHED_ENDED_KEPT;
    uint64_t r = s->ended[k].reason;
    if (!sched_token_eq(s->ended[k].token, token)) continue;
    if (s->n_reasons - r > SCHED_REASONS_KEPT) break; /* forgotten */
    r %= SCHED_REASONS_KEPT;
    return dev_error(st, s->reasons[r].code,
                     "session not found: it was ended: %s",
                     s->reasons[r].why);
  }
  return dev_error(st, PD_NOT_FOUND,
                   "session not found: closed, lease expired, or never "
                   "created");
}

pd_code sched_session_open(sched *s, const void *token, size_t len,
                           sched_session **out, dev_status *st) {
  pthread_mutex_lock(&s->mu);
  sched_session *ss = NULL;
  pd_code c = sched_find_locked(s, token, len, &ss, st);
  if (c == PD_OK) {
    sched_session_ref(ss);
    sched_session_touch(ss);
    *out = ss;
  }
  pthread_mutex_unlock(&s->mu);
  return c;
}

void sched_unlink_locked(sched *s, sched_session *ss) {
  for (sched_session **pp = &s->sessions; *pp; pp = &(*pp)->next) {
    if (*pp == ss) {
      *pp = ss->next;
      ss->next = NULL;
      s->num_sessions--;
      return;
    }
  }
}

uint64_t sched_end_session(sched_session *ss, sched_end_reason why,
                           pd_code code, const char *msg, uint64_t *bytes) {
  void *states[SCHED_MAX_OBSERVERS];
  pthread_mutex_lock(&ss->mu);
  if (bytes) *bytes = ss->bytes;
  uint64_t n = ss->closed ? 0 : sched_release_all_locked(ss);
  memcpy(states, ss->attached, sizeof(states));
  memset(ss->attached, 0, sizeof(ss->attached));
  dev_fn_lib *fns = sched_take_functions_locked(ss);
  pthread_mutex_unlock(&ss->mu);
  /* Its functions go with it; calls already queued hold what they need. */
  dev_fn_lib_destroy(fns);
  sched_io_cancel_session(ss); /* its loads and saves: CANCELLED */
  sched_drop_queue(ss, code, msg);
  sched_wait_dispatched(ss);
  /* Every end (close, expiry, kill by token, number or job, stop) passes
   * here once: the tenant's slot is given back here and nowhere else, after
   * the session's memory went back to the tenant's account. */
  sched *s = ss->owner;
  pthread_mutex_lock(&s->mu);
  if (ss->in_tenant) sched_tenant_leave_locked(ss->tn);
  ss->in_tenant = false;
  pthread_mutex_unlock(&s->mu);
  sched_notify_end(ss, why, msg, n, states);
  return n;
}

pd_code sched_session_close(sched *s, const void *token, size_t len,
                            uint64_t *handles_freed, dev_status *st) {
  pthread_mutex_lock(&s->mu);
  sched_session *ss = NULL;
  pd_code c = sched_find_locked(s, token, len, &ss, st);
  if (c == PD_OK) sched_unlink_locked(s, ss);
  pthread_mutex_unlock(&s->mu);
  if (c != PD_OK) return c;
  uint64_t n = sched_end_session(
      ss, SCHED_END_CLOSED, PD_CANCELLED, "the session was closed before the op ran", NULL);
  atomic_fetch_add(&s->n_closed, 1);
  sched_session_put(ss);
  if (handles_freed) *handles_freed = n;
  return PD_OK;
}

static void sched_session_free(sched_session *ss) {
  pthread_mutex_lock(&ss->mu);
  if (!ss->closed) sched_release_all_locked(ss);
  dev_fn_lib *fns = sched_take_functions_locked(ss);
  pthread_mutex_unlock(&ss->mu);
  dev_fn_lib_destroy(fns); /* a session that never ended (NULL otherwise) */
  /* Registrations wait only on queued ops, and queued ops hold a reference:
   * none can be left, but never strand a caller. */
  sched_fire_waiters(ss->dwait);
  sched_io_release_all(ss);
  sched_policy_session_fini(ss);
  pthread_mutex_destroy(&ss->mu);
  free(ss);
}

void sched_session_put(sched_session *ss) {
  if (ss && atomic_fetch_sub(&ss->refs, 1) == 1) sched_session_free(ss);
}

void sched_session_touch(sched_session *ss) {
  atomic_store(&ss->expires_ms, sched_now_ms() + (int64_t)ss->lease_s * 1000);
}

uint64_t sched_session_seq(const sched_session *ss) { return ss->seq; }
uint32_t sched_session_lease_s(const sched_session *ss) { return ss->lease_s; }
uint32_t sched_session_op_timeout_ms(const sched_session *ss) {
  return ss->op_timeout_ms;
}
const char *sched_session_tenant(const sched_session *ss) { return ss->tenant; }
const char *sched_session_identity(const sched_session *ss) {
  return ss->identity;
}
int sched_session_priority(const sched_session *ss) { return ss->priority; }
uint32_t sched_session_weight(const sched_session *ss) { return ss->weight; }

int sched_num_sessions(sched *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->num_sessions;
  pthread_mutex_unlock(&s->mu);
  return n;
}
