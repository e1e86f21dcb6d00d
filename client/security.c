/* libparadev: the channel's security (client_int.h, pdc_security_*): TLS
 * credentials from the options or the environment, the bearer token sent
 * as per-call metadata (gRPC does not deliver call credentials on an
 * insecure channel, and a token must work there too), and the words for a
 * failed handshake, which gRPC reports as UNAVAILABLE with a terse
 * "Ssl handshake failed: ..." or "Socket closed". */
#include <ctype.h>
#include <errno.h>
#include <grpc/grpc_security.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"

#define PDC_PEM_LIMIT (1u << 20) /* bytes of one PEM or token file */
#define PDC_TOKEN_MAX 4096

/* One setting: the option, else (unless ignored) the variable. *from says
 * which, for messages: "tls_ca_file" or "$PARADEV_TLS_CA". */
static const char *pdc_setting(const char *opt, const char *opt_name,
                               const char *env, const pd_client_options *o,
                               char *from, size_t len) {
  const char *v = opt;
  if (v && *v) {
    snprintf(from, len, "%s", opt_name);
    return v;
  }
  v = o->ignore_environment ? NULL : getenv(env);
  if (v && *v) {
    snprintf(from, len, "$%s", env);
    return v;
  }
  return NULL;
}

/* The whole file in *out (NUL-terminated; free it); PD_INVALID_ARGUMENT
 * naming the file and where its name came from. */
static pd_code pdc_read_file(const char *path, const char *from, char **out,
                             size_t *n_out, pd_status *st) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return pdc_error(st, PD_INVALID_ARGUMENT, "%s %s cannot be read: %s", from,
                     path, strerror(errno));
  char *buf = malloc(PDC_PEM_LIMIT + 1);
  size_t n = buf ? fread(buf, 1, PDC_PEM_LIMIT + 1, f) : 0;
  bool bad = !buf || ferror(f);
  fclose(f);
  if (!buf) return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  if (bad || n == 0 || n > PDC_PEM_LIMIT) {
    free(buf);
    return pdc_error(st, PD_INVALID_ARGUMENT, "%s %s %s", from, path,
                     bad     ? "cannot be read"
                     : n > 0 ? "is over 1 MiB"
                             : "is empty");
  }
  buf[n] = '\0';
  *out = buf;
  if (n_out) *n_out = n;
  return PD_OK;
}

/* A PEM file (certificates or a key): read, and at least one PEM block. */
static pd_code pdc_read_pem(const char *path, const char *from,
                            const char *what, char **out, pd_status *st) {
  PD_TRY(pdc_read_file(path, from, out, NULL, st));
  if (strstr(*out, "-----BEGIN ")) return PD_OK;
  free(*out);
  *out = NULL;
  return pdc_error(st, PD_INVALID_ARGUMENT,
                   "%s %s holds no PEM block; expected %s (-----BEGIN ...)",
                   from, path, what);
}

/* The token: `token`, $PARADEV_TOKEN, the first line of `token_file` or of
 * $PARADEV_TOKEN_FILE; spaces around it are dropped. Printable ASCII
 * without spaces (an HTTP/2 header value); "" when none is given. */
static pd_code pdc_token(const pd_client_options *o, char *out, size_t len,
                         pd_status *st) {
  char from[96], ffrom[64];
  const char *t =
      pdc_setting(o->token, "token", "PARADEV_TOKEN", o, from, sizeof(from));
  const char *file =
      t ? NULL
        : pdc_setting(o->token_file, "token_file", "PARADEV_TOKEN_FILE", o,
                      ffrom, sizeof(ffrom));
  char *buf = NULL;
  out[0] = '\0';
  if (!t && !file) return PD_OK;
  if (file) {
    PD_TRY(pdc_read_file(file, ffrom, &buf, NULL, st));
    buf[strcspn(buf, "\r\n")] = '\0';
    t = buf;
    snprintf(from, sizeof(from), "the first line of %s", ffrom);
  }
  while (*t == ' ' || *t == '\t') t++;
  size_t n = strlen(t);
  while (n && (t[n - 1] == ' ' || t[n - 1] == '\t')) n--;
  pd_code code = PD_OK;
  if (n == 0 || n >= len || n > PDC_TOKEN_MAX)
    code = pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s: the token is %s; expected 1 to %d characters", from,
                     n ? "too long" : "empty", PDC_TOKEN_MAX);
  for (size_t i = 0; code == PD_OK && i < n; i++)
    if (t[i] < 0x21 || t[i] > 0x7e)
      code = pdc_error(st, PD_INVALID_ARGUMENT,
                       "%s: the token has a byte 0x%02x at %zu; expected "
                       "printable ASCII without spaces",
                       from, (unsigned)(unsigned char)t[i], i);
  if (code == PD_OK) snprintf(out, len, "%.*s", (int)n, t);
  free(buf);
  return code;
}

/* Whether to use TLS: the mode, "tls://", the CA or certificate given. */
static pd_code pdc_want_tls(const pd_client_options *o, bool tls_scheme,
                            bool unix_target, bool material, bool *tls,
                            pd_status *st) {
  if (o->tls != PD_TLS_AUTO && o->tls != PD_TLS_ON && o->tls != PD_TLS_OFF)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_client_options.tls is %d; expected PD_TLS_AUTO (0), "
                     "PD_TLS_ON (1) or PD_TLS_OFF (2)",
                     (int)o->tls);
  if (tls_scheme && o->tls == PD_TLS_OFF)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "target \"tls://...\" with pd_client_options.tls = "
                     "PD_TLS_OFF; drop one of the two");
  if (unix_target && o->tls == PD_TLS_ON)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "TLS is for TCP targets; a Unix socket is local and "
                     "plaintext (use host:port, or leave TLS at its default: "
                     "PD_TLS_AUTO in C, tls=None in Python)");
  *tls = !unix_target && o->tls != PD_TLS_OFF &&
         (o->tls == PD_TLS_ON || tls_scheme || material);
  return PD_OK;
}

/* The client certificate (the first of `cert_pem`) and its key, checked
 * with libcrypto before gRPC sees them: gRPC logs "Invalid private key"
 * and the channel then fails as "empty address list", and a certificate
 * the daemon refuses for its use alone reads as one of an unknown CA.
 * PD_INVALID_ARGUMENT naming the files: not a certificate or key, a key
 * that is not the certificate's, an extendedKeyUsage without clientAuth. */
static pd_code pdc_check_pair(const char *cert_pem, const char *key_pem,
                              const char *certf, const char *cert,
                              const char *keyf, const char *key,
                              pd_status *st) {
  BIO *cb = BIO_new_mem_buf(cert_pem, -1), *kb = BIO_new_mem_buf(key_pem, -1);
  X509 *x = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  pd_code code = PD_OK;
  if (!x)
    code = pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s %s holds no X.509 certificate that can be read; "
                     "expected the client certificate in PEM "
                     "(-----BEGIN CERTIFICATE-----)",
                     certf, cert);
  else if (!k)
    code = pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s %s holds no private key that can be read; expected "
                     "an unencrypted PEM key (-----BEGIN PRIVATE KEY-----)",
                     keyf, key);
  else if (X509_check_private_key(x, k) != 1)
    code = pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s %s is not the private key of the client certificate "
                     "%s %s: give the key made with that certificate",
                     keyf, key, certf, cert);
  else if ((X509_get_extension_flags(x) & EXFLAG_XKUSAGE) &&
           !(X509_get_extended_key_usage(x) & XKU_SSL_CLIENT))
    code = pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s %s is not a client certificate: its "
                     "extendedKeyUsage lacks clientAuth (a server's "
                     "certificate?); the daemon refuses it. Use one made with "
                     "extendedKeyUsage=clientAuth",
                     certf, cert);
  EVP_PKEY_free(k);
  X509_free(x);
  BIO_free(kb);
  BIO_free(cb);
  return code;
}

/* The SSL credentials: CA, client certificate and key, read now. */
static pd_code pdc_tls_creds(pd_client *c, const pd_client_options *o,
                             grpc_channel_credentials **creds, pd_status *st) {
  char caf[64] = "", certf[64] = "", keyf[64] = "";
  const char *ca = pdc_setting(o->tls_ca_file, "tls_ca_file", "PARADEV_TLS_CA",
                               o, caf, sizeof(caf));
  const char *cert = pdc_setting(o->tls_cert_file, "tls_cert_file",
                                 "PARADEV_TLS_CERT", o, certf, sizeof(certf));
  const char *key = pdc_setting(o->tls_key_file, "tls_key_file",
                                "PARADEV_TLS_KEY", o, keyf, sizeof(keyf));
  if (!cert != !key)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s is given without %s: a client certificate needs its "
                     "private key (tls_cert_file and tls_key_file, or "
                     "PARADEV_TLS_CERT and PARADEV_TLS_KEY)",
                     cert ? certf : keyf, cert ? "a key" : "a certificate");
  char *ca_pem = NULL, *cert_pem = NULL, *key_pem = NULL;
  pd_code code = PD_OK;
  if (ca) code = pdc_read_pem(ca, caf, "CA certificates", &ca_pem, st);
  if (code == PD_OK && cert)
    code = pdc_read_pem(cert, certf, "a certificate", &cert_pem, st);
  if (code == PD_OK && key)
    code = pdc_read_pem(key, keyf, "a private key", &key_pem, st);
  if (code == PD_OK && cert)
    code = pdc_check_pair(cert_pem, key_pem, certf, cert, keyf, key, st);
  if (code == PD_OK) {
    grpc_ssl_pem_key_cert_pair pair = {key_pem, cert_pem};
    *creds =
        grpc_ssl_credentials_create(ca_pem, cert ? &pair : NULL, NULL, NULL);
    if (!*creds)
      code = pdc_error(st, PD_INTERNAL, "gRPC refused the TLS credentials");
  }
  if (ca) snprintf(c->sec.ca_from, sizeof(c->sec.ca_from), "%s %s", caf, ca);
  if (cert)
    snprintf(c->sec.cert_from, sizeof(c->sec.cert_from), "%s %s", certf, cert);
  c->sec.client_cert = cert != NULL;
  free(ca_pem);
  free(cert_pem);
  free(key_pem);
  return code;
}

pd_code pdc_security_init(pd_client *c, const pd_client_options *o,
                          bool tls_scheme, bool unix_target,
                          grpc_channel_credentials **creds, pd_status *st) {
  char from[64];
  bool material = pdc_setting(o->tls_ca_file, "", "PARADEV_TLS_CA", o, from,
                              sizeof(from)) ||
                  pdc_setting(o->tls_cert_file, "", "PARADEV_TLS_CERT", o, from,
                              sizeof(from));
  PD_TRY(pdc_want_tls(o, tls_scheme, unix_target, material, &c->sec.tls, st));
  char token[PDC_TOKEN_MAX + 1];
  PD_TRY(pdc_token(o, token, sizeof(token), st));
  const char *name =
      pdc_setting(o->tls_server_name, "tls_server_name",
                  "PARADEV_TLS_SERVER_NAME", o, from, sizeof(from));
  if (name && strlen(name) >= sizeof(c->sec.server_name))
    return pdc_error(st, PD_INVALID_ARGUMENT, "%s is over %zu bytes", from,
                     sizeof(c->sec.server_name) - 1);
  if (c->sec.tls && name)
    snprintf(c->sec.server_name, sizeof(c->sec.server_name), "%s", name);
  if (c->sec.tls)
    PD_TRY(pdc_tls_creds(c, o, creds, st));
  else
    *creds = grpc_insecure_credentials_create();
  if (token[0]) {
    char value[PDC_TOKEN_MAX + 16];
    snprintf(value, sizeof(value), "Bearer %s", token);
    c->sec.md.key = grpc_slice_from_static_string("authorization");
    c->sec.md.value = grpc_slice_from_copied_string(value);
    c->sec.token = true;
  }
  return PD_OK;
}

void pdc_security_free(pd_client *c) {
  if (c->sec.token) grpc_slice_unref(c->sec.md.value);
  c->sec.token = false;
}

void pdc_security_md(const pd_client *c, grpc_op *op) {
  if (!c->sec.token) return;
  op->data.send_initial_metadata.count = 1;
  op->data.send_initial_metadata.metadata = (grpc_metadata *)&c->sec.md;
}

/* --- a failed handshake, in words ----------------------------------------- */

static bool pdc_has(const char *d, int dlen, const char *what) {
  size_t n = strlen(what);
  for (int i = 0; i + (int)n <= dlen; i++)
    if (memcmp(d + i, what, n) == 0) return true;
  return false;
}

/* The host the certificate must name: the override, else the target's. */
static void pdc_cert_host(const pd_client *c, char *out, size_t len) {
  if (c->sec.server_name[0]) {
    snprintf(out, len, "%s", c->sec.server_name);
    return;
  }
  const char *t = c->target;
  const char *colon = strrchr(t, ':');
  size_t n = colon ? (size_t)(colon - t) : strlen(t);
  if (n >= 2 && t[0] == '[' && t[n - 1] == ']') {
    t++;
    n -= 2;
  }
  snprintf(out, len, "%.*s", (int)n, t);
}

bool pdc_security_explain(const pd_client *c, const char *d, int dlen,
                          char *out, size_t len) {
  char host[256];
  pdc_cert_host(c, host, sizeof(host));
  const char *ca = c->sec.ca_from[0] ? c->sec.ca_from : "gRPC's default roots";
  if (!c->sec.tls) {
    if (!pdc_has(d, dlen, "Socket closed") &&
        !pdc_has(d, dlen, "Connection reset"))
      return false;
    /* TLS never applies to a Unix socket (and "tls://unix:" is no
     * target): no TLS hint there. */
    if (strncmp(c->target, "unix:", 5) == 0 ||
        strncmp(c->target, "unix-abstract:", 14) == 0) {
      snprintf(out, len,
               "cannot reach %s: the daemon closed the connection (%.*s)",
               c->target, dlen, d);
      return true;
    }
    snprintf(out, len,
             "cannot reach %s: the daemon closed the connection (%.*s); if "
             "it serves TLS, connect with tls://%s or give its CA (--tls-ca, "
             "PARADEV_TLS_CA)",
             c->target, dlen, d, c->target);
    return true;
  }
  if (pdc_has(d, dlen, "certificate verify failed")) {
    snprintf(out, len,
             "TLS handshake with %s failed: the daemon's certificate is not "
             "trusted (unknown CA: it is not signed by a CA of %s, or it "
             "expired); give the CA that signed it with --tls-ca, "
             "PARADEV_TLS_CA or tls_ca_file",
             c->target, ca);
  } else if (pdc_has(d, dlen, "is not in peer certificate")) {
    snprintf(out, len,
             "TLS handshake with %s failed: name mismatch: the daemon's "
             "certificate does not name \"%s\"; connect with a name its "
             "subjectAltName lists, or set that name with --tls-server-name, "
             "PARADEV_TLS_SERVER_NAME or tls_server_name",
             c->target, host);
  } else if (pdc_has(d, dlen, "Socket closed") ||
             pdc_has(d, dlen, "Connection reset")) {
    if (c->sec.client_cert)
      snprintf(out, len,
               "TLS handshake with %s failed: the daemon closed the "
               "connection: it refused the client certificate (%s): it "
               "must be signed by a CA of the daemon's [tls] client_ca_file "
               "and be valid now",
               c->target, c->sec.cert_from);
    else
      snprintf(out, len,
               "TLS handshake with %s failed: the daemon closed the "
               "connection: it requires a client certificate (mutual TLS); "
               "give one and its key with --tls-cert and --tls-key, "
               "PARADEV_TLS_CERT and PARADEV_TLS_KEY, or tls_cert_file and "
               "tls_key_file",
               c->target);
  } else if (pdc_has(d, dlen, "wrong version number") ||
             pdc_has(d, dlen, "packet length too long") ||
             pdc_has(d, dlen, "record layer failure") ||
             pdc_has(d, dlen, "Handshake read failed")) {
    snprintf(out, len,
             "TLS handshake with %s failed: the daemon does not speak TLS "
             "there (%.*s); connect without tls:// and without a CA, or "
             "set [tls] on the daemon",
             c->target, dlen, d);
  } else if (pdc_has(d, dlen, "Ssl handshake failed") ||
             pdc_has(d, dlen, "Handshake failed")) {
    snprintf(out, len, "TLS handshake with %s failed: %.*s", c->target, dlen,
             d);
  } else {
    return false;
  }
  return true;
}
