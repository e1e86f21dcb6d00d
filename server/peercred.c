/* Unix socket peers' uids (auth.h, "Unix socket peers"): the daemon's own
 * accept loop on its Unix listen sockets. gRPC C core 1.51 gives a server
 * no SO_PEERCRED, so each socket gets a thread that accepts, reads the
 * peer's credentials, notes the uid under the connection's fd number, and
 * hands the fd to gRPC (grpc_server_add_channel_from_fd, insecure
 * credentials, which is all that function takes), whose calls on it carry
 * the peer string "fd:N".
 *
 * An fd number is reused once gRPC closes a connection; the entry is
 * overwritten by the next accept of that number before gRPC sees the new
 * connection, so a call always reads the uid of the connection it came on
 * (its transport, and so its fd, lives at least as long as the call's
 * reading of the peer at its start). */
#define SRV_LOG_SUB SRV_SUB_RPC
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "log.h"

#define SRV_UNIX_MAX 8        /* listen sockets with an accept loop */
#define SRV_UNIX_FD_MAX 65536 /* fds whose peer is noted; beyond: no uid */

typedef struct srv_unix_sock {
  grpc_server *gs;
  int fd;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  pthread_t thread;
  bool started;
} srv_unix_sock;

static srv_unix_sock srv_unix_socks[SRV_UNIX_MAX];
static int srv_unix_n;
static int srv_unix_stop_pipe[2] = {-1, -1};
/* uid + 1 of the peer of each accepted fd (0: not one of ours). */
static _Atomic unsigned srv_unix_uids[SRV_UNIX_FD_MAX];

int srv_unix_listen(grpc_server *gs, const char *path, unsigned mode) {
  if (srv_unix_n == SRV_UNIX_MAX) {
    SRV_ERROR("cannot listen on unix:%s: more than %d Unix listen sockets",
              path, SRV_UNIX_MAX);
    return -1;
  }
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof(sa.sun_path)) {
    SRV_ERROR("cannot listen on unix:%s: the path is too long", path);
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  struct stat sb;
  if (lstat(path, &sb) == 0 && S_ISSOCK(sb.st_mode)) unlink(path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
      (mode && chmod(path, (mode_t)mode) != 0) || listen(fd, 128) != 0) {
    SRV_ERROR("cannot listen on unix:%s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  srv_unix_sock *u = &srv_unix_socks[srv_unix_n++];
  u->gs = gs;
  u->fd = fd;
  snprintf(u->path, sizeof(u->path), "%s", path);
  return 0;
}

/* Accepts one connection of `u` and hands it to gRPC. */
static void srv_unix_accept(srv_unix_sock *u) {
  int fd = accept4(u->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
      SRV_WARN("accept on unix:%s: %s", u->path, strerror(errno));
    if (errno == EMFILE || errno == ENFILE) usleep(100 * 1000);
    return;
  }
  struct ucred cr;
  socklen_t len = sizeof(cr);
  unsigned v = 0;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 &&
      len == sizeof(cr))
    v = (unsigned)cr.uid + 1;
  if (fd < SRV_UNIX_FD_MAX) atomic_store(&srv_unix_uids[fd], v);
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  grpc_server_add_channel_from_fd(u->gs, fd, creds);
  grpc_server_credentials_release(creds);
}

static void *srv_unix_main(void *arg) {
  srv_unix_sock *u = arg;
  for (;;) {
    struct pollfd p[2] = {{u->fd, POLLIN, 0},
                          {srv_unix_stop_pipe[0], POLLIN, 0}};
    int r = poll(p, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || p[1].revents) break;
    if (p[0].revents & POLLIN) srv_unix_accept(u);
  }
  return NULL;
}

int srv_unix_serve(void) {
  if (srv_unix_n == 0) return 0;
  if (srv_unix_stop_pipe[0] < 0 && pipe2(srv_unix_stop_pipe, O_CLOEXEC) != 0) {
    SRV_ERROR("cannot make a pipe for the Unix accept threads: %s",
              strerror(errno));
    return -1;
  }
  for (int i = 0; i < srv_unix_n; i++) {
    int e = pthread_create(&srv_unix_socks[i].thread, NULL, srv_unix_main,
                           &srv_unix_socks[i]);
    if (e != 0) {
      SRV_ERROR("cannot start the accept thread of unix:%s: %s",
                srv_unix_socks[i].path, strerror(e));
      return -1;
    }
    srv_unix_socks[i].started = true;
  }
  return 0;
}

void srv_unix_stop(void) {
  if (srv_unix_stop_pipe[1] >= 0) {
    ssize_t w = write(srv_unix_stop_pipe[1], "x", 1);
    (void)w;
  }
  for (int i = 0; i < srv_unix_n; i++) {
    srv_unix_sock *u = &srv_unix_socks[i];
    if (u->started) pthread_join(u->thread, NULL);
    close(u->fd);
    unlink(u->path);
  }
  srv_unix_n = 0;
  for (int i = 0; i < 2; i++)
    if (srv_unix_stop_pipe[i] >= 0) {
      close(srv_unix_stop_pipe[i]);
      srv_unix_stop_pipe[i] = -1;
    }
}

bool srv_unix_peer_uid(const char *peer, unsigned *uid) {
  if (!peer || strncmp(peer, "fd:", 3) != 0) return false;
  char *end = NULL;
  long fd = strtol(peer + 3, &end, 10);
  if (end == peer + 3 || fd < 0 || fd >= SRV_UNIX_FD_MAX) return false;
  unsigned v = atomic_load(&srv_unix_uids[fd]);
  if (!v) return false;
  *uid = v - 1;
  return true;
}
