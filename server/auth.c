/* Who is calling (auth.h): the identity of a call, from its client
 * certificate, its bearer token or its Unix peer; the tables of tenants and
 * operators in force (swapped whole on SIGHUP, the old ones kept until the
 * daemon stops so that a call or a session may still point into them);
 * refusals' log lines and counters.
 *
 * Bearer tokens are read from the call's metadata here, once per call, not
 * by an auth-metadata processor: gRPC runs none on insecure credentials
 * (the Unix socket, plaintext TCP), and one code path for every listener
 * is simpler to reason about (NOTES.md). */
#define SRV_LOG_SUB SRV_SUB_RPC
#include "auth.h"
#include "ratelimit.h"

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "check.h"
#include "log.h"
#include "tokens.h"

/* One tenant of a table: its section and its storage roots. */
typedef struct srv_auth_tenant {
  srv_tenant_conf conf;
  stg_roots *roots; /* NULL: every [storage] root */
} srv_auth_tenant;

typedef struct srv_auth_table {
  struct srv_auth_table *older; /* tables retired before this one */
  int require;                  /* an srv_require */
  char operators[SRV_AUTH_LIST_MAX];
  srv_tokens *tokens; /* NULL: no tokens file */
  int n;
  srv_auth_tenant t[SRV_MAX_TENANTS];
} srv_auth_table;

struct srv_auth {
  pthread_mutex_t mu;  /* guards cur */
  srv_auth_table *cur; /* in force; its older ones are kept */
  _Atomic uint64_t refusals[SRV_REFUSE_COUNT];
  srv_rate log_rate; /* the refusal lines' (ratelimit.h) */
};

static const char *const srv_refusal_names[SRV_REFUSE_COUNT] = {
    "no_identity",  "bad_token",    "no_tenant", "other_tenant",
    "tenant_limit", "not_operator", "job_token",
};

const char *srv_refusal_name(srv_refusal r) {
  return r >= 0 && r < SRV_REFUSE_COUNT ? srv_refusal_names[r] : "unknown";
}

/* --- tables ---------------------------------------------------------------- */

static void srv_table_free(srv_auth_table *t) {
  while (t) {
    srv_auth_table *older = t->older;
    for (int i = 0; i < t->n; i++) stg_roots_destroy(t->t[i].roots);
    srv_tokens_free(t->tokens);
    free(t);
    t = older;
  }
}

/* The roots of a tenant's list ("a,b"), or NULL with roots_set false. */
static pd_code srv_tenant_roots(const srv_tenant_conf *c, stg_roots **out,
                                dev_status *st) {
  *out = NULL;
  if (!c->roots_set) return PD_OK;
  char buf[SRV_AUTH_LIST_MAX];
  const char *entries[SRV_MAX_ROOTS];
  int n = 0;
  snprintf(buf, sizeof(buf), "%s", c->storage_roots);
  for (char *p = buf; *p && n < SRV_MAX_ROOTS;) {
    entries[n++] = p;
    char *comma = strchr(p, ',');
    if (!comma) break;
    *comma = '\0';
    p = comma + 1;
  }
  return stg_roots_create(entries, n, out, st);
}

/* A new table from `o`; NULL after logging why. */
static srv_auth_table *srv_table_new(const srv_options *o) {
  srv_auth_table *t = calloc(1, sizeof(*t));
  if (!t) {
    SRV_ERROR("identities: out of host memory");
    return NULL;
  }
  t->require = o->auth_require;
  snprintf(t->operators, sizeof(t->operators), "%s", o->auth_operators);
  dev_status st = DEV_STATUS_INIT;
  if (o->auth_tokens_file[0] &&
      srv_tokens_open(o->auth_tokens_file, &t->tokens, &st) != PD_OK) {
    SRV_ERROR("[auth] tokens_file: %s", st.msg);
    goto fail;
  }
  for (int i = 0; i < o->num_tenants; i++, t->n++) {
    t->t[i].conf = o->tenants[i];
    if (srv_tenant_roots(&o->tenants[i], &t->t[i].roots, &st) != PD_OK) {
      SRV_ERROR("[tenant %s] storage_roots: %s", o->tenants[i].name, st.msg);
      goto fail;
    }
  }
  return t;
fail:
  srv_table_free(t);
  return NULL;
}

/* Hands every tenant's limits to the scheduler. */
static int srv_table_configure(srv *s, const srv_auth_table *t) {
  int ndev = dev_engine_num_devices(s->engine);
  for (int i = 0; i < t->n; i++) {
    const srv_auth_tenant *a = &t->t[i];
    /* Issue #17: a tenant's devices must be this mesh's (a cuda mesh's size
     * is known only once the engine runs). */
    for (int k = 0; k < a->conf.num_devices; k++)
      if (a->conf.devices[k] >= ndev) {
        SRV_ERROR(
            "[tenant %s] devices: device %d is not in the mesh, which "
            "has devices 0..%d",
            a->conf.name, a->conf.devices[k], ndev - 1);
        return -1;
      }
    sched_tenant_limits lim = {a->conf.max_sessions, a->conf.memory_quota,
                               a->roots};
    dev_status st = DEV_STATUS_INIT;
    if (sched_tenant_configure(s->sched, a->conf.name, &lim, &st) != PD_OK) {
      SRV_ERROR("[tenant %s]: %s", a->conf.name, st.msg);
      return -1;
    }
  }
  return 0;
}

static void srv_table_describe(const srv_auth_table *t) {
  static const char *const req[] = {"none", "remote", "tcp", "all"};
  SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_INFO,
             "identities: required from %s peers, %d tenant%s, tokens %s, "
             "operators %s",
             req[t->require & 3], t->n, t->n == 1 ? "" : "s",
             t->tokens ? srv_tokens_path(t->tokens) : "(none)",
             t->operators[0] ? t->operators : "(the admin socket's group)");
}

int srv_auth_init(srv *s) {
  struct srv_auth *a = calloc(1, sizeof(*a));
  if (!a) {
    SRV_ERROR("identities: out of host memory");
    return -1;
  }
  a->cur = srv_table_new(&s->opt);
  if (!a->cur || srv_table_configure(s, a->cur) != 0) {
    srv_table_free(a->cur);
    free(a);
    return -1;
  }
  pthread_mutex_init(&a->mu, NULL);
  for (int i = 0; i < SRV_REFUSE_COUNT; i++) atomic_init(&a->refusals[i], 0);
  s->auth = a;
  srv_table_describe(a->cur);
  return 0;
}

int srv_auth_reload(srv *s, const srv_options *o) {
  struct srv_auth *a = s->auth;
  if (!a) return -1;
  srv_auth_table *t = srv_table_new(o);
  if (!t || srv_table_configure(s, t) != 0) {
    srv_table_free(t);
    SRV_LOG_AT(SRV_SUB_CONFIG, SRV_LOG_ERROR,
               "reload: identities and tenants unchanged");
    return -1;
  }
  pthread_mutex_lock(&a->mu);
  t->older = a->cur;
  a->cur = t;
  pthread_mutex_unlock(&a->mu);
  srv_table_describe(t);
  return 0;
}

void srv_auth_destroy(srv *s) {
  struct srv_auth *a = s->auth;
  if (!a) return;
  srv_table_free(a->cur);
  pthread_mutex_destroy(&a->mu);
  free(a);
  s->auth = NULL;
}

/* The table in force. Tables are freed only by srv_auth_destroy, so the
 * pointer stays good for the call. */
static srv_auth_table *srv_table(srv *s) {
  pthread_mutex_lock(&s->auth->mu);
  srv_auth_table *t = s->auth->cur;
  pthread_mutex_unlock(&s->auth->mu);
  return t;
}

static bool srv_list_has(const char *list, const char *item) {
  size_t n = strlen(item);
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && strncmp(p, item, n) == 0) return true;
    p += len;
    if (*p == ',') p++;
  }
  return false;
}

bool srv_auth_tenant_terms(srv *s, const char *tenant, srv_tenant_terms *out) {
  if (!s->auth || !tenant || !tenant[0]) return false;
  const srv_auth_table *t = srv_table(s);
  for (int i = 0; i < t->n; i++) {
    const srv_tenant_conf *c = &t->t[i].conf;
    if (strcmp(c->name, tenant) != 0) continue;
    *out = (srv_tenant_terms){c->memory_quota,
                              c->max_sessions,
                              c->max_lease_s,
                              c->priority,
                              c->weight,
                              c->num_devices,
                              {0}};
    memcpy(out->devices, c->devices, sizeof out->devices);
    return true;
  }
  return false;
}

/* --- refusals -------------------------------------------------------------- */

uint64_t srv_auth_refusals(srv *s, srv_refusal why) {
  if (!s->auth || why < 0 || why >= SRV_REFUSE_COUNT) return 0;
  return atomic_load(&s->auth->refusals[why]);
}

void srv_auth_refused(srv_call *c, srv_refusal why, const dev_status *st) {
  struct srv_auth *a = c->s->auth;
  if (!a) return;
  atomic_fetch_add(&a->refusals[why], 1);
  uint64_t skipped = 0;
  if (!srv_rate_ok(&a->log_rate, SRV_REFUSAL_LOG_PER_S, &skipped)) return;
  const srv_identity *id = c->identity;
  char name[SRV_LOG_QUOTED(128)], more[64] = "";
  if (skipped)
    snprintf(more, sizeof(more), " (%" PRIu64 " earlier refusals not logged)",
             skipped);
  SRV_WARN("refused %s (%s): identity \"%s\" tenant \"%s\": %s%s",
           c->m ? c->m->path : "(unknown method)", srv_refusal_name(why),
           id ? srv_log_quote(id->name, name, sizeof(name)) : "",
           id ? id->tenant : "", st ? st->msg : "", more);
}

/* --- the identity of a call ------------------------------------------------ */

typedef enum srv_peer_kind {
  SRV_PEER_UNIX = 0,
  SRV_PEER_LOOPBACK = 1,
  SRV_PEER_REMOTE = 2,
} srv_peer_kind;

/* gRPC's peer string: "unix:...", "fd:N" (a Unix connection the daemon
 * accepted itself, peercred.c), "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000". */
static srv_peer_kind srv_peer_classify(const char *peer) {
  if (!peer || strncmp(peer, "unix:", 5) == 0 || strncmp(peer, "fd:", 3) == 0)
    return SRV_PEER_UNIX;
  if (strncmp(peer, "ipv4:127.", 9) == 0 ||
      strncmp(peer, "ipv6:[::1]:", 11) == 0 ||
      strncmp(peer, "ipv6:[::ffff:127.", 17) == 0)
    return SRV_PEER_LOOPBACK;
  return SRV_PEER_REMOTE;
}

static bool srv_required(int require, srv_peer_kind k) {
  switch (require) {
    case SRV_REQUIRE_NONE: return false;
    case SRV_REQUIRE_REMOTE: return k == SRV_PEER_REMOTE;
    case SRV_REQUIRE_TCP: return k != SRV_PEER_UNIX;
    default: return true;
  }
}

/* The first value of `it` into out[cap]; false when none fits. */
static bool srv_auth_first(grpc_auth_property_iterator it, char *out,
                           size_t cap) {
  const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
  if (!p || !p->value || p->value_length == 0 || p->value_length >= cap ||
      memchr(p->value, '\0', p->value_length))
    return false;
  memcpy(out, p->value, p->value_length);
  out[p->value_length] = '\0';
  return true;
}

bool srv_auth_cert_identity(grpc_call *call, char *out, size_t cap) {
  grpc_auth_context *ctx = grpc_call_auth_context(call);
  if (!ctx) return false;
  bool found = false;
  /* The peer identity is every SAN in the certificate's order (DNS names,
   * URIs, ...): a certificate with "DNS:host, URI:spiffe://..." would be
   * named by its DNS name. The spiffe ID, which gRPC sets when the
   * certificate has exactly one, names the workload: it goes first. */
  if (grpc_auth_context_peer_is_authenticated(ctx))
    found = srv_auth_first(grpc_auth_context_find_properties_by_name(
                               ctx, GRPC_PEER_SPIFFE_ID_PROPERTY_NAME),
                           out, cap) ||
            srv_auth_first(grpc_auth_context_peer_identity(ctx), out, cap);
  grpc_auth_context_release(ctx);
  return found;
}

/* The bearer token of the call's metadata: 1 found (*tok, *len point into
 * the call's metadata), 0 none, -1 an authorization entry that is not
 * "Bearer <token>" (st says what was expected). */
static int srv_bearer(const srv_call *c, const char **tok, size_t *len,
                      dev_status *st) {
  for (size_t i = 0; i < c->md.count; i++) {
    const grpc_slice *k = &c->md.metadata[i].key;
    if (GRPC_SLICE_LENGTH(*k) != 13 ||
        memcmp(GRPC_SLICE_START_PTR(*k), "authorization", 13) != 0)
      continue;
    const grpc_slice *v = &c->md.metadata[i].value;
    const char *p = (const char *)GRPC_SLICE_START_PTR(*v);
    size_t n = GRPC_SLICE_LENGTH(*v);
    if (n <= 7 || strncasecmp(p, "Bearer ", 7) != 0 || n - 7 > SRV_TOKEN_MAX) {
      dev_error(st, PD_UNAUTHENTICATED,
                "the authorization metadata is not 'Bearer <token>' with a "
                "token of 1 to %d bytes",
                SRV_TOKEN_MAX);
      return -1;
    }
    *tok = p + 7;
    *len = n - 7;
    return 1;
  }
  return 0;
}

/* The presented identity (token, else certificate, else Unix peer) into
 * `id`; UNAUTHENTICATED for a bad token. */
static pd_code srv_presented(srv_call *c, srv_auth_table *t, const char *peer,
                             srv_identity *id, dev_status *st) {
  const char *tok = NULL;
  size_t len = 0;
  int b = srv_bearer(c, &tok, &len, st);
  if (b < 0) return PD_UNAUTHENTICATED;
  if (b > 0 && !t->tokens) {
    /* No tokens file: a token is ignored, and the caller is whoever else
     * it is (certificate, uid, or anonymous where the listener allows
     * it), so a client with a token for another daemon still reaches this
     * one (trial finding 8). Said once, at debug. */
    static atomic_bool said;
    if (!atomic_exchange(&said, true))
      SRV_DEBUG(
          "a call presented a bearer token, but [auth] tokens_file is "
          "not set: tokens are ignored (said once)");
    b = 0;
  }
  if (b > 0) {
    /* Read before the check: a reload in between makes the next
     * srv_call_recheck look again, never miss one. */
    uint64_t gen = srv_tokens_generation(t->tokens);
    PD_TRY(
        srv_tokens_check(t->tokens, tok, len, id->name, sizeof(id->name), st));
    id->kind = SRV_IDENTITY_TOKEN;
    c->auth_tokens = t->tokens;
    c->auth_gen = gen;
    return PD_OK;
  }
  if (srv_auth_cert_identity(c->call, id->name, sizeof(id->name))) {
    id->kind = SRV_IDENTITY_CERT;
    return PD_OK;
  }
  unsigned uid = 0;
  if (peer && srv_unix_peer_uid(peer, &uid)) {
    snprintf(id->name, sizeof(id->name), "uid:%u", uid);
    id->kind = SRV_IDENTITY_UNIX;
  }
  return PD_OK;
}

/* Resolves the identity into `id`; the refusal's reason in *why. */
static pd_code srv_resolve(srv_call *c, srv_identity *id, srv_refusal *why,
                           dev_status *st) {
  srv_auth_table *t = srv_table(c->s);
  char *peer = grpc_call_get_peer(c->call);
  srv_peer_kind pk = srv_peer_classify(peer);
  pd_code code = srv_presented(c, t, peer, id, st);
  gpr_free(peer);
  if (code != PD_OK) {
    *why = SRV_REFUSE_BAD_TOKEN;
    return code;
  }
  bool admin = c->s->admin_server && c->gs == c->s->admin_server;
  id->is_operator = admin || (id->kind != SRV_IDENTITY_NONE &&
                              srv_list_has(t->operators, id->name));
  if (admin) return PD_OK; /* the admin socket's group decides */
  if (id->kind == SRV_IDENTITY_NONE) {
    if (!srv_required(t->require, pk)) return PD_OK;
    *why = SRV_REFUSE_NO_IDENTITY;
    return dev_error(st, PD_UNAUTHENTICATED,
                     "this listener requires an identity ([auth] "
                     "require_identity): a client certificate (mTLS) or a "
                     "bearer token (metadata authorization: Bearer <token>)");
  }
  for (int i = 0; i < t->n; i++)
    if (srv_list_has(t->t[i].conf.identities, id->name)) {
      snprintf(id->tenant, sizeof(id->tenant), "%s", t->t[i].conf.name);
      return PD_OK;
    }
  if (t->n > 0 && !id->is_operator) {
    *why = SRV_REFUSE_NO_TENANT;
    char name[SRV_LOG_QUOTED(128)];
    return dev_error(st, PD_PERMISSION_DENIED,
                     "identity \"%s\" belongs to no tenant of this daemon; "
                     "ask the operator to list it in a [tenant] section's "
                     "identities",
                     srv_log_quote(id->name, name, sizeof(name)));
  }
  return PD_OK;
}

pd_code srv_call_identity(srv_call *c, const srv_identity **out,
                          dev_status *st) {
  if (c->identity) {
    *out = c->identity;
    return PD_OK;
  }
  srv_identity *id = calloc(1, sizeof(*id));
  if (!id) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  id->kind = SRV_IDENTITY_NONE;
  if (!c->s->auth) { /* tests that run methods without a daemon */
    id->is_operator = c->s->admin_server && c->gs == c->s->admin_server;
    *out = c->identity = id;
    return PD_OK;
  }
  srv_refusal why = SRV_REFUSE_NO_IDENTITY;
  pd_code code = srv_resolve(c, id, &why, st);
  c->identity = id; /* for the refusal's log line; cleared below */
  if (code != PD_OK) {
    srv_auth_refused(c, why, st);
    c->identity = NULL;
    free(id);
    return code;
  }
  *out = id;
  return PD_OK;
}

/* --- an open call's token, again (trial finding 7) ---------------------- */

pd_code srv_call_recheck(srv_call *c, dev_status *st) {
  const srv_identity *id = c->identity;
  if (!id || id->kind != SRV_IDENTITY_TOKEN || !c->s->auth) return PD_OK;
  srv_auth_table *t = srv_table(c->s);
  uint64_t gen = t->tokens ? srv_tokens_generation(t->tokens) : 0;
  if (t->tokens && t->tokens == c->auth_tokens && gen == c->auth_gen)
    return PD_OK; /* the table this call was let in by, unchanged */
  const char *tok = NULL;
  size_t len = 0;
  char name[SRV_IDENTITY_MAX + 1] = "";
  if (!t->tokens)
    return dev_error(st, PD_UNAUTHENTICATED,
                     "the bearer token this call was let in with is no longer "
                     "taken: [auth] tokens_file was unset by a reload; open "
                     "a new call");
  if (srv_bearer(c, &tok, &len, st) != 1 ||
      srv_tokens_check(t->tokens, tok, len, name, sizeof(name), st) != PD_OK)
    return dev_error(st, PD_UNAUTHENTICATED,
                     "the bearer token this call was let in with is no longer "
                     "valid (revoked since the call began); ask the operator "
                     "for a token");
  if (strcmp(name, id->name) != 0)
    return dev_error(st, PD_UNAUTHENTICATED,
                     "the bearer token this call was let in with now names "
                     "another identity in the tokens file; open a new call");
  c->auth_tokens = t->tokens;
  c->auth_gen = gen;
  return PD_OK;
}
