/* TLS on paradevd's TCP listeners (issue #14): the [tls] certificate and
 * key, the clients' CA for mutual TLS, and their reload without a restart.
 *
 * gRPC C core asks a certificate-config fetcher (srv_tls_fetch) for the
 * certificate at every new connection, under its own lock: the fetcher
 * stats the three files and re-reads them only when one changed (inode,
 * size or mtime); SIGHUP re-reads them at once (srv_tls_reload). A new set
 * is checked with OpenSSL's libcrypto first (each file parses, the key
 * matches the certificate): one that fails is logged with the reason and
 * the previous certificate goes on serving. Connections already open keep
 * the certificate they were made with; new ones get the new one.
 *
 * Unix-socket listeners never use TLS. */
#ifndef PARADEV_SERVER_TLS_H
#define PARADEV_SERVER_TLS_H

#include <grpc/grpc_security.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct srv_tls srv_tls;

/* Reads and checks the files of [tls] in `o` (o->tls_cert_file set) and
 * returns the state every TCP listener's credentials share; NULL with the
 * reason in `err` (a file that cannot be read, holds no PEM certificate or
 * key, or a key that does not belong to the certificate). Main thread. */
srv_tls *srv_tls_new(const srv_options *o, char *err, size_t errlen);

/* Frees the state; NULL is a no-op. Only once no server that took its
 * credentials accepts connections any more (after grpc_server_destroy). */
void srv_tls_free(srv_tls *t);

/* New SSL server credentials for one TCP listener (each listener has its
 * own: gRPC's fetcher hands a new certificate to each connector once);
 * the caller releases them after grpc_server_add_http2_port. NULL when
 * every one of SRV_MAX_LISTEN slots is taken. Main thread. */
grpc_server_credentials *srv_tls_server_credentials(srv_tls *t);

/* SIGHUP: re-reads the files now, whether they changed or not; logs the
 * new certificate's subject, serial and expiry, or why the old one stays.
 * Returns true when the new set was taken. Any thread. */
bool srv_tls_reload(srv_tls *t);

/* One line for the start-up log: "TLS (client certificates required)",
 * "TLS (client certificates verified when given)" or "TLS". */
const char *srv_tls_mode_name(const srv_tls *t);

/* True when a client certificate is required (mTLS). */
bool srv_tls_requires_client_cert(const srv_tls *t);

/* --check-config: reads and checks the files as srv_tls_new would; false
 * with the reason in `err`. On success `about` (may be NULL) gets the
 * certificate's subject, serial and expiry. */
bool srv_tls_check_files(const srv_options *o, char *about, size_t about_len,
                         char *err, size_t errlen);

#endif /* PARADEV_SERVER_TLS_H */
