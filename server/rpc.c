/* The transport of paradevd (gRPC C core): the servers and their listeners,
 * the completion queues and their threads, registering and arming every
 * method of the table (methods.c), the generic UNIMPLEMENTED answer, and
 * shutdown. A call's own state machine is call.c's. See server.h for the
 * threading model and NOTES.md for the C-core facts this relies on. */
#include <errno.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "auth.h"
#include "log.h"
#include "mesh.h"
#include "server.h"
#include "tls.h"

static pthread_t srv_threads[SRV_MAX_THREADS + SRV_MESH_THREADS];
static int srv_num_threads; /* started and not yet joined */

static void srv_on_request(srv_call *c, bool ok);
static void srv_on_generic(srv_call *c, bool ok);

/* --- arming --------------------------------------------------------------- */

static void srv_arm(srv *s, const srv_method *m, grpc_server *gs, int cqi) {
  srv_call *c =
      srv__call_new(s, m, gs, cqi, m ? srv_on_request : srv_on_generic);
  if (!c) {
    SRV_ERROR("out of memory arming %s", m ? m->path : "(generic)");
    return;
  }
  grpc_call_error e;
  if (m) {
    void *handle = gs == m->server ? m->registered : m->registered_main;
    e = grpc_server_request_registered_call(
        gs, handle, &c->call, &c->deadline, &c->md,
        (m->kind == SRV_UNARY || m->kind == SRV_SERVER_STREAM) ? &c->payload
                                                               : NULL,
        s->cqs[cqi], s->cqs[cqi], &c->t_req);
  } else {
    grpc_call_details *d = calloc(1, sizeof(*d));
    if (!d) {
      srv_call_unref(c);
      return;
    }
    grpc_call_details_init(d);
    c->user = d;
    e = grpc_server_request_call(gs, &c->call, d, &c->md, s->cqs[cqi],
                                 s->cqs[cqi], &c->t_req);
  }
  if (e != GRPC_CALL_OK) {
    SRV_ERROR("internal: request_call failed (%d) for %s", (int)e,
              m ? m->path : "(generic)");
    srv_call_unref(c);
  }
}

static void srv_on_generic(srv_call *c, bool ok) {
  srv *s = c->s;
  if (!ok) { /* shutting down */
    srv_call_unref(c);
    return;
  }
  if (!atomic_load(&s->shutting_down)) srv_arm(s, NULL, c->gs, c->cq_index);
  atomic_fetch_add(&s->unknown_method_calls, 1);
  grpc_call_details *d = c->user;
  char method[256];
  size_t len = GRPC_SLICE_LENGTH(d->method);
  if (len >= sizeof(method)) len = sizeof(method) - 1;
  memcpy(method, GRPC_SLICE_START_PTR(d->method), len);
  method[len] = '\0';
  for (size_t i = 0; i < len; i++)
    if (method[i] < 0x20 || method[i] > 0x7e) method[i] = '?';
  SRV_DEBUG("unknown method %s: UNIMPLEMENTED", method);
  c->finishing = true;
  c->md_sent = true;
  c->status_sent = true;
  char msg[400];
  snprintf(msg, sizeof(msg),
           "method %s is not implemented by paradevd %s (see "
           "paradev/v1/paradev.proto for the service)",
           method, SRV_VERSION);
  grpc_slice details = grpc_slice_from_copied_string(msg);
  grpc_op ops[3];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[1].data.send_status_from_server.status = GRPC_STATUS_UNIMPLEMENTED;
  ops[1].data.send_status_from_server.status_details = &details;
  ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[2].data.recv_close_on_server.cancelled = &c->close_cancelled;
  srv__call_batch(c, ops, 3, &c->t_final);
  grpc_slice_unref(details);
  srv_call_unref(c);
}

static void srv_on_request(srv_call *c, bool ok) {
  srv *s = c->s;
  if (!ok) { /* the server is shutting down: the slot was never used */
    srv_call_unref(c);
    return;
  }
  if (!atomic_load(&s->shutting_down)) srv_arm(s, c->m, c->gs, c->cq_index);
  srv__call_begin(c);
  srv_call_unref(c);
}

/* --- threads, start, stop -------------------------------------------------- */

/* Lending a busy queue. A handler should never block its queue thread, but
 * a function's first call instantiates it inside Execute (bounded by
 * [functions] instantiation_max_ms, and an optimizer plugin cannot be
 * interrupted): meanwhile gRPC keeps handing new calls (Echo,
 * CreateSession, other sessions' calls) to the slots armed on that queue.
 * So a watcher thread lends a queue whose thread has run one event for more
 * than SRV_LEND_AFTER_S to a helper thread, which drives it until the owner
 * takes it back (a call's own events stay one at a time: srv_call.run_mu). */
#define SRV_LEND_AFTER_S 0.05
#define SRV_LEND_POLL_NS 20000000L
typedef struct srv_cq_state {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* lent went false */
  grpc_completion_queue *cq;
  bool busy;    /* its owner runs an event */
  double since; /* when it began (srv_mono_s) */
  bool lent;    /* a helper drives the queue */
  bool stop;    /* the owner wants it back */
} srv_cq_state;

static srv_cq_state srv_cq_states[SRV_MAX_THREADS + SRV_MESH_THREADS];
static pthread_t srv_lender;
static bool srv_lender_started;
static atomic_bool srv_lender_stop;

static double srv_mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs one event of q's queue, waiting until `deadline`; false once the
 * queue is shut down. */
static bool srv_cq_step(srv_cq_state *q, gpr_timespec deadline, bool owner) {
  grpc_event ev = grpc_completion_queue_next(q->cq, deadline, NULL);
  if (ev.type == GRPC_QUEUE_SHUTDOWN) return false;
  if (ev.type != GRPC_OP_COMPLETE) return true;
  if (owner) {
    pthread_mutex_lock(&q->mu);
    q->busy = true;
    q->since = srv_mono_s();
    pthread_mutex_unlock(&q->mu);
  }
  struct srv_tag *t = ev.tag;
  srv_call *c = t->c;
  /* One event of a call at a time, even on a lent queue (trial B10); the
   * reference keeps the lock alive when the event drops the last one. */
  srv_call_ref(c);
  pthread_mutex_lock(&c->run_mu);
  t->fn(c, ev.success != 0);
  pthread_mutex_unlock(&c->run_mu);
  srv_call_unref(c);
  if (owner) { /* take the queue back before driving it again */
    pthread_mutex_lock(&q->mu);
    q->busy = false;
    while (q->lent) {
      q->stop = true;
      pthread_cond_wait(&q->cv, &q->mu);
    }
    pthread_mutex_unlock(&q->mu);
  }
  return true;
}

static void *srv_cq_helper(void *arg) {
  srv_cq_state *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->mu);
    bool stop = q->stop;
    pthread_mutex_unlock(&q->mu);
    if (stop) break;
    gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_millis(10, GPR_TIMESPAN));
    if (!srv_cq_step(q, dl, false)) break;
  }
  pthread_mutex_lock(&q->mu);
  q->lent = false;
  q->stop = false;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

static void *srv_lender_main(void *arg) {
  srv *s = arg;
  struct timespec tick = {0, SRV_LEND_POLL_NS};
  while (!atomic_load(&srv_lender_stop)) {
    nanosleep(&tick, NULL);
    double now = srv_mono_s();
    for (int i = 0; i < s->num_cqs; i++) {
      srv_cq_state *q = &srv_cq_states[i];
      pthread_mutex_lock(&q->mu);
      if (q->busy && !q->lent && now - q->since > SRV_LEND_AFTER_S) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        q->lent = pthread_create(&th, &at, srv_cq_helper, q) == 0;
        pthread_attr_destroy(&at);
        if (q->lent)
          SRV_DEBUG("queue %d busy for %.3f s: lent to a helper thread", i,
                    now - q->since);
      }
      pthread_mutex_unlock(&q->mu);
    }
  }
  return NULL;
}

static void *srv_cq_main(void *arg) {
  srv_cq_state *q = arg;
  while (srv_cq_step(q, gpr_inf_future(GPR_CLOCK_REALTIME), true)) {
  }
  return NULL;
}

/* "127.0.0.1:0" bound to port 41234 -> "127.0.0.1:41234". */
static void srv_bound_name(const char *addr, int port, char *out, size_t len) {
  const char *colon = strrchr(addr, ':');
  if (strncmp(addr, "unix:", 5) == 0 || !colon) {
    snprintf(out, len, "%s", addr);
    return;
  }
  snprintf(out, len, "%.*s:%d", (int)(colon - addr), addr, port);
}

/* Destroys a server that was never started: gRPC wants a shutdown first
 * once it has listeners. */
static void srv_server_abandon(grpc_server *gs) {
  if (!gs) return;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  int tag;
  grpc_server_shutdown_and_notify(gs, cq, &tag);
  grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_MONOTONIC),
                              NULL);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL,
                                     gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  grpc_server_destroy(gs);
}

/* True when something accepts connections on the Unix socket `path`. gRPC
 * unlinks a socket file before it binds, so without this check a second
 * daemon would silently take a live daemon's socket away from it; a stale
 * file (nothing listening) may go. */
static bool unix_socket_live(const char *path) {
  struct sockaddr_un sa;
  if (strlen(path) >= sizeof(sa.sun_path)) return false;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  bool live = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  close(fd);
  return live;
}

/* Refuses an address another live process serves (see unix_socket_live). */
static bool addr_taken(const char *addr) {
  if (strncmp(addr, "unix:", 5) != 0 || !unix_socket_live(addr + 5))
    return false;
  SRV_ERROR(
      "cannot listen on %s: another process is serving on this socket "
      "(stop it first, or choose another path)",
      addr);
  return true;
}

/* A socket in /tmp/paradevd-UID (the default without a runtime directory)
 * is bound only once that directory is this user's alone
 * (srv_private_dir_prepare); false with the reason in `err` otherwise. */
static bool srv_socket_dir_ready(const char *path, char *err, size_t errlen) {
  char dir[SRV_ADDR_MAX];
  srv_tmp_socket_dir(dir, sizeof(dir));
  size_t n = strlen(dir);
  if (strncmp(path, dir, n) != 0 || path[n] != '/') return true;
  return srv_private_dir_prepare(dir, err, errlen);
}

/* The channel arguments both servers share: the message limit, and no
 * SO_REUSEPORT (gRPC's default: a second daemon on the same port would then
 * split the connections with the first). The admin server takes only the
 * last. */
static void srv_server_args(const srv *s, grpc_arg args[3]) {
  int maxmsg = s->opt.limits.max_message_bytes > INT_MAX
                   ? INT_MAX
                   : (int)s->opt.limits.max_message_bytes;
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = maxmsg;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = maxmsg;
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
  args[2].value.integer = 0;
}

/* Step 1: the servers (the admin one only with an admin socket) and the
 * completion queues, each registered with both; none of this fails. */
static void srv_servers_create(srv *s) {
  grpc_arg args[3];
  srv_server_args(s, args);
  grpc_channel_args chargs = {3, args};
  grpc_channel_args admin_args = {1, &args[2]};
  s->server = grpc_server_create(&chargs, NULL);
  if (s->opt.admin_socket[0])
    s->admin_server = grpc_server_create(&admin_args, NULL);
  /* The coordinator's mesh port (issue #16): paradev.v1.Mesh only. */
  if (s->mesh && srv_mesh_rank(s->mesh) == 0)
    s->mesh_server = grpc_server_create(&chargs, NULL);
  s->mesh_cq_first = s->opt.num_threads;
  s->num_cqs = s->mesh_cq_first + (s->mesh_server ? SRV_MESH_THREADS : 0);
  for (int i = 0; i < s->num_cqs; i++) {
    s->cqs[i] = grpc_completion_queue_create_for_next(NULL);
    if (i >= s->mesh_cq_first) { /* the mesh port's own queues */
      grpc_server_register_completion_queue(s->mesh_server, s->cqs[i], NULL);
      continue;
    }
    grpc_server_register_completion_queue(s->server, s->cqs[i], NULL);
    if (s->admin_server)
      grpc_server_register_completion_queue(s->admin_server, s->cqs[i], NULL);
  }
}

/* Step 2: every method of a table on its server, so that srv_arm can ask
 * for its calls; `also`: the Admin table on the main server as well (its
 * handle in registered_main). 0, or -1 (logged). */
static int srv_methods_register(grpc_server *gs, srv_method *const *table,
                                bool also) {
  for (int i = 0; gs && table[i]; i++) {
    srv_method *m = table[i];
    grpc_server_register_method_payload_handling ph =
        (m->kind == SRV_UNARY || m->kind == SRV_SERVER_STREAM)
            ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER
            : GRPC_SRM_PAYLOAD_NONE;
    void *h = grpc_server_register_method(gs, m->path, NULL, ph, 0);
    if (also) {
      m->registered_main = h;
    } else {
      m->server = gs;
      m->registered = h;
    }
    if (!h) {
      SRV_ERROR("internal: cannot register %s", m->path);
      return -1;
    }
  }
  return 0;
}

/* The directory of a socket's path exists, is a directory, and this user
 * may create the socket in it; false with what is wrong in `err` (gRPC
 * would only log its raw error, and we could only guess). */
static bool srv_socket_dir_usable(const char *path, char *err, size_t errlen) {
  char dir[SRV_ADDR_MAX];
  const char *slash = strrchr(path, '/');
  size_t n = slash ? (size_t)(slash - path) : 0;
  if (n >= sizeof(dir)) n = sizeof(dir) - 1;
  memcpy(dir, path, n);
  dir[n] = '\0';
  if (n == 0) snprintf(dir, sizeof(dir), "/");
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    snprintf(err, errlen,
             "its directory %s %s (the directory must exist: create it, or "
             "choose another path)",
             dir, errno == ENOENT ? "does not exist" : strerror(errno));
    return false;
  }
  if (!S_ISDIR(sb.st_mode)) {
    snprintf(err, errlen, "%s is not a directory (choose another path)", dir);
    return false;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    snprintf(err, errlen,
             "its directory %s is not writable by this user (uid %u): %s", dir,
             (unsigned)geteuid(), strerror(errno));
    return false;
  }
  return true;
}

/* Step 3, one address of the main server: a private socket directory that
 * exists and takes the socket, no live socket taken over, then the port;
 * 0, or -1 (logged). */
static int srv_listen_one(srv *s, const char *addr) {
  char why[768];
  if (strncmp(addr, "unix:", 5) == 0 &&
      (!srv_socket_dir_ready(addr + 5, why, sizeof(why)) ||
       !srv_socket_dir_usable(addr + 5, why, sizeof(why)))) {
    SRV_ERROR("cannot listen on %s: %s", addr, why);
    return -1;
  }
  if (addr_taken(addr)) return -1;
  if (strncmp(addr, "unix:", 5) == 0) {
    /* Accepted by the daemon itself, for the peer's uid (peercred.c). */
    if (srv_unix_listen(s->server, addr + 5, 0) != 0) return -1;
    SRV_NOTICE("listening on %s", addr);
    return 0;
  }
  bool tls = s->tls != NULL; /* TCP only: Unix sockets returned above */
  grpc_server_credentials *creds =
      tls ? srv_tls_server_credentials(s->tls)
          : grpc_insecure_server_credentials_create();
  if (!creds) {
    SRV_ERROR("cannot listen on %s: gRPC refused the TLS credentials", addr);
    return -1;
  }
  int port = grpc_server_add_http2_port(s->server, addr, creds);
  grpc_server_credentials_release(creds);
  if (port == 0) {
    SRV_ERROR(
        "cannot listen on %s (address in use, bad address, or no "
        "permission; run with GRPC_VERBOSITY=DEBUG for gRPC's reason)",
        addr);
    return -1;
  }
  char name[512];
  srv_bound_name(addr, port, name, sizeof(name));
  SRV_NOTICE("listening on %s%s%s%s", name, tls ? " (" : "",
             tls ? srv_tls_mode_name(s->tls) : "", tls ? ")" : "");
  return 0;
}

/* The TLS state of the TCP listeners, when [tls] names a certificate; 0, or
 * -1 (logged: which file, and why). */
static int srv_tls_start(srv *s) {
  if (!s->opt.tls_cert_file[0]) return 0;
  char err[2 * SRV_FILE_MAX + 256];
  s->tls = srv_tls_new(&s->opt, err, sizeof(err));
  if (!s->tls) {
    SRV_ERROR("cannot serve TLS: [tls] %s", err);
    return -1;
  }
  return 0;
}

/* The coordinator's mesh port: [mesh] coordinator's port on every address
 * (0.0.0.0), or on its host when that is an IP address or localhost. The
 * other ranks' daemons alone call it; it serves paradev.v1.Mesh only, in
 * plaintext ([mesh] secret_file: a shared secret in every RankHello). 0,
 * or -1 (logged). */
static int srv_mesh_listen(srv *s) {
  if (!s->mesh_server) return 0;
  const char *coord = s->opt.mesh_coordinator;
  const char *colon = strrchr(coord, ':');
  char host[SRV_ADDR_MAX], addr[SRV_ADDR_MAX + 16];
  snprintf(host, sizeof host, "%.*s", (int)(colon - coord), coord);
  bool literal = strcmp(host, "localhost") == 0 || host[0] == '[';
  if (!literal) {
    literal = host[0] != '\0';
    for (const char *p = host; *p; p++)
      if (!((*p >= '0' && *p <= '9') || *p == '.')) literal = false;
  }
  snprintf(addr, sizeof addr, "%s:%s", literal ? host : "0.0.0.0", colon + 1);
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(s->mesh_server, addr, creds);
  grpc_server_credentials_release(creds);
  if (port == 0) {
    SRV_ERROR(
        "mesh: cannot listen on the mesh port %s ([mesh] coordinator %s): "
        "address in use, bad address, or no permission",
        addr, coord);
    return -1;
  }
  SRV_NOTICE("mesh: the mesh port listens on %s (paradev.v1.Mesh, for the "
             "other ranks)%s",
             addr,
             s->opt.mesh_secret_file[0]
                 ? ""
                 : "; no [mesh] secret_file: any host that reaches the port "
                   "may attach as a rank");
  return 0;
}

/* The default admin socket could not be had: serve without the Admin
 * service rather than not start at all. */
static void srv_admin_drop(srv *s) {
  srv_server_abandon(s->admin_server);
  s->admin_server = NULL;
}

/* Gives the bound admin socket to [daemon] admin_socket_group, the
 * operators' group (distinct from the clients', the daemon's own): the
 * daemon must be a member (systemd: SupplementaryGroups=). 0, or -1
 * (logged: a socket left in the clients' group would let any client in). */
static int srv_admin_group(srv *s) {
  const char *g = s->opt.admin_socket_group;
  gid_t gid;
  if (!g[0]) return 0;
  if (!srv_group_lookup(g, &gid)) {
    SRV_ERROR(
        "cannot give the admin socket %s to group '%s': no such group "
        "(create it: systemd-sysusers, or groupadd --system %s; or set "
        "[daemon] admin_socket_group to an existing one)",
        s->opt.admin_socket, g, g);
    return -1;
  }
  if (chown(s->opt.admin_socket, (uid_t)-1, gid) != 0) {
    SRV_ERROR(
        "cannot give the admin socket %s to group '%s' (gid %u): %s (the "
        "daemon's user must be a member: SupplementaryGroups=%s in the "
        "unit, or usermod -aG %s USER)",
        s->opt.admin_socket, g, (unsigned)gid, strerror(errno), g, g);
    return -1;
  }
  return 0;
}

/* Binds the admin socket. Its mode decides who may use the Admin service:
 * create it with no more than admin_socket_mode, then set exactly that.
 * 0 (bound, or dropped for the default path), or -1 (logged). */
static int srv_admin_bind(srv *s, const char *addr) {
  mode_t old = umask((mode_t)(~s->opt.admin_socket_mode & 0777));
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  int port = grpc_server_add_http2_port(s->admin_server, addr, creds);
  grpc_server_credentials_release(creds);
  umask(old);
  if (port == 0 && !s->opt.admin_socket_set) {
    /* Only the default path failed (no runtime directory, say). */
    SRV_WARN(
        "no admin service: cannot listen on the default admin socket "
        "%s (set [daemon] admin_socket or --admin-socket)",
        s->opt.admin_socket);
    srv_admin_drop(s);
  } else if (port == 0) {
    SRV_ERROR(
        "cannot listen on the admin socket %s (its directory must "
        "exist and be writable; set [daemon] admin_socket or "
        "--admin-socket, or '' to turn the Admin service off)",
        s->opt.admin_socket);
    return -1;
  } else if (chmod(s->opt.admin_socket, (mode_t)s->opt.admin_socket_mode) !=
             0) {
    SRV_ERROR("cannot set mode %04o on the admin socket %s: %s",
              s->opt.admin_socket_mode, s->opt.admin_socket, strerror(errno));
    return -1;
  } else if (srv_admin_group(s) != 0) {
    return -1;
  } else {
    SRV_NOTICE("admin service on unix:%s (mode %04o, group %s)",
               s->opt.admin_socket, s->opt.admin_socket_mode,
               s->opt.admin_socket_group[0] ? s->opt.admin_socket_group
                                            : "the daemon's own");
  }
  return 0;
}

/* Step 4: the admin socket, when there is an admin server. A path the user
 * set must work; the default one may be dropped (srv_admin_drop). 0, or -1
 * (logged). */
static int srv_admin_listen(srv *s) {
  if (!s->admin_server) return 0;
  char addr[SRV_ADDR_MAX + 8], why[768];
  snprintf(addr, sizeof(addr), "unix:%s", s->opt.admin_socket);
  if (!srv_socket_dir_ready(s->opt.admin_socket, why, sizeof(why))) {
    if (s->opt.admin_socket_set) {
      SRV_ERROR("cannot listen on the admin socket %s: %s", s->opt.admin_socket,
                why);
      return -1;
    }
    SRV_WARN("no admin service on the default admin socket %s: %s",
             s->opt.admin_socket, why);
    srv_admin_drop(s);
    return 0;
  }
  bool taken = !s->opt.admin_socket_set ? unix_socket_live(s->opt.admin_socket)
                                        : addr_taken(addr);
  if (taken && s->opt.admin_socket_set) return -1;
  if (taken) {
    /* The default path is another daemon's: do not take it away. */
    SRV_WARN(
        "no admin service: another process serves the default admin "
        "socket %s (set [daemon] admin_socket or --admin-socket)",
        s->opt.admin_socket);
    srv_admin_drop(s);
    return 0;
  }
  return srv_admin_bind(s, addr);
}

/* Step 5: one thread per queue. The threads come before the servers start:
 * a queue no thread drives cannot be shut down. srv_num_threads counts the
 * ones that started, for srv_queues_end. 0, or -1 (logged). */
static int srv_threads_start(srv *s) {
  for (int i = 0; i < s->num_cqs; i++) {
    srv_cq_state *q = &srv_cq_states[i];
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->cq = s->cqs[i];
    q->busy = q->lent = q->stop = false;
  }
  atomic_store(&srv_lender_stop, false);
  srv_lender_started =
      pthread_create(&srv_lender, NULL, srv_lender_main, s) == 0;
  if (!srv_lender_started)
    SRV_WARN("cannot start the queue watcher: a slow call blocks its queue");
  for (int i = 0; i < s->num_cqs; i++) {
    int e =
        pthread_create(&srv_threads[i], NULL, srv_cq_main, &srv_cq_states[i]);
    if (e != 0) {
      SRV_ERROR("cannot start completion-queue thread %d of %d: %s", i + 1,
                s->num_cqs, strerror(e));
      return -1;
    }
    srv_num_threads = i + 1;
  }
  return 0;
}

/* Step 6: start serving, with one armed slot per method (and one for the
 * unknown ones) per queue and server. */
static void srv_servers_serve(srv *s) {
  grpc_server_start(s->server);
  if (s->admin_server) grpc_server_start(s->admin_server);
  if (s->mesh_server) grpc_server_start(s->mesh_server);
  for (int i = s->mesh_cq_first; i < s->num_cqs; i++) {
    for (int j = 0; srv_mesh_methods[j]; j++)
      srv_arm(s, srv_mesh_methods[j], s->mesh_server, i);
    srv_arm(s, NULL, s->mesh_server, i);
  }
  for (int i = 0; i < s->mesh_cq_first; i++) {
    for (int j = 0; srv_methods[j]; j++)
      srv_arm(s, srv_methods[j], s->server, i);
    for (int j = 0; srv_admin_methods[j]; j++) /* operators' identities */
      srv_arm(s, srv_admin_methods[j], s->server, i);
    srv_arm(s, NULL, s->server, i);
    if (s->admin_server) {
      for (int j = 0; srv_admin_methods[j]; j++)
        srv_arm(s, srv_admin_methods[j], s->admin_server, i);
      srv_arm(s, NULL, s->admin_server, i);
    }
  }
}

/* Undoes step 5 together with the queues of step 1: a thread ends only when
 * its queue shuts down, so the started ones are joined (each drains its
 * queue) and the others' queues are drained here; then all are destroyed. */
static void srv_queues_end(srv *s) {
  if (srv_lender_started) { /* no new helpers; those running see shutdown */
    atomic_store(&srv_lender_stop, true);
    pthread_join(srv_lender, NULL);
    srv_lender_started = false;
  }
  for (int i = 0; i < s->num_cqs; i++) {
    grpc_completion_queue_shutdown(s->cqs[i]);
    if (i < srv_num_threads) {
      pthread_join(srv_threads[i], NULL); /* it drains its queue */
      continue;
    }
    while (grpc_completion_queue_next(s->cqs[i],
                                      gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
  }
  for (int i = 0; i < s->num_cqs; i++) grpc_completion_queue_destroy(s->cqs[i]);
  srv_num_threads = 0;
}

/* Undoes steps 1-4: the servers, with their methods and listeners. They go
 * before their queues shut down (gRPC still posts to those). */
static void srv_servers_end(srv *s) {
  srv_server_abandon(s->server);
  s->server = NULL;
  srv_server_abandon(s->admin_server);
  s->admin_server = NULL;
  srv_server_abandon(s->mesh_server);
  s->mesh_server = NULL;
}

int srv_rpc_start(srv *s) {
  if (srv_tls_start(s) != 0) return -1;
  grpc_init();
  srv_servers_create(s);
  /* Admin on the admin socket, and on the main server too, where only
   * identities listed as operators pass admin.c's check. */
  if (srv_methods_register(s->server, srv_methods, false) != 0 ||
      srv_methods_register(s->admin_server, srv_admin_methods, false) != 0 ||
      srv_methods_register(s->server, srv_admin_methods, true) != 0 ||
      srv_methods_register(s->mesh_server, srv_mesh_methods, false) != 0)
    goto fail_servers;
  for (int i = 0; i < s->opt.num_listen; i++)
    if (srv_listen_one(s, s->opt.listen[i]) != 0) goto fail_servers;
  if (srv_admin_listen(s) != 0) goto fail_servers;
  if (srv_mesh_listen(s) != 0) goto fail_servers;
  if (srv_threads_start(s) != 0) goto fail_threads;
  srv_servers_serve(s);
  if (srv_unix_serve() != 0) goto fail_threads;
  return 0;

  /* In reverse. A thread ends only with its queue, and the queues must
   * outlive the servers: srv_queues_end joins the threads that started. */
fail_threads:
fail_servers:
  srv_unix_stop();    /* the Unix sockets' accept threads */
  srv_servers_end(s); /* steps 4-2, and step 1's servers */
  srv_queues_end(s);  /* step 5's threads, and step 1's queues */
  grpc_shutdown();
  srv_tls_free(s->tls);
  s->tls = NULL;
  return -1;
}

bool srv_rpc_stop(srv *s) {
  atomic_store(&s->shutting_down, true);
  srv_unix_stop(); /* no new Unix connections */
  grpc_completion_queue *scq = grpc_completion_queue_create_for_pluck(NULL);
  int tags[3];
  grpc_server *servers[3] = {s->server, s->admin_server, s->mesh_server};
  for (int k = 0; k < 3; k++)
    if (servers[k]) grpc_server_shutdown_and_notify(servers[k], scq, &tags[k]);
  gpr_timespec grace =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                   gpr_time_from_millis(s->opt.grace_ms, GPR_TIMESPAN));
  bool ended = false;
  for (int k = 0; k < 3; k++) {
    if (!servers[k]) continue;
    grpc_event ev = grpc_completion_queue_pluck(scq, &tags[k], grace, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT && !ended) {
      /* End the remaining calls ourselves, saying why (gRPC's own
       * cancellation says only "Cancelling all calls"); then, after a
       * second for those statuses to go out, cancel what is left. */
      ended = true;
      int n = srv__calls_end_live();
      SRV_INFO(
          "grace period of %d ms over: ending the %d remaining calls "
          "with UNAVAILABLE",
          s->opt.grace_ms, n);
      grace = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                           gpr_time_from_millis(1000, GPR_TIMESPAN));
      ev = grpc_completion_queue_pluck(scq, &tags[k], grace, NULL);
    }
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      SRV_INFO("cancelling the calls that are still open");
      grpc_server_cancel_all_calls(servers[k]);
      grpc_completion_queue_pluck(scq, &tags[k],
                                  gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    }
  }
  grpc_completion_queue_shutdown(scq);
  while (grpc_completion_queue_pluck(scq, NULL,
                                     gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(scq);
  /* Calls still end on the queues (their last operations complete there).
   * None waits on the devices (see server.h), so this is quick; a queue
   * must not shut down while a call could still wake on it. */
  for (int waited = 0; atomic_load(&s->active_calls) > 0; waited += 10) {
    if (waited == 30000) {
      SRV_WARN(
          "%d calls still active after 30 s; exiting without "
          "releasing gRPC",
          atomic_load(&s->active_calls));
      return false;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  grpc_server_destroy(s->server);
  s->server = NULL;
  if (s->admin_server) grpc_server_destroy(s->admin_server);
  s->admin_server = NULL;
  if (s->mesh_server) grpc_server_destroy(s->mesh_server);
  s->mesh_server = NULL;
  for (int i = 0; i < s->num_cqs; i++)
    grpc_completion_queue_shutdown(s->cqs[i]);
  for (int i = 0; i < srv_num_threads; i++) pthread_join(srv_threads[i], NULL);
  for (int i = 0; i < s->num_cqs; i++) grpc_completion_queue_destroy(s->cqs[i]);
  srv_num_threads = 0;
  grpc_shutdown();
  srv_tls_free(s->tls); /* no listener asks its fetcher any more */
  s->tls = NULL;
  return true;
}
