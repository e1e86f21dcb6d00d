/* See tls.h. The PEM set in force (checked with libcrypto), the files'
 * signatures it was read with, and one slot per TCP listener that tells
 * gRPC's fetcher whether its connector already has the set in force.
 * Lock: `mu` guards everything but the immutable paths; it nests nothing
 * (gRPC holds its connector's lock around srv_tls_fetch, and never calls
 * into it from inside our lock). */
#define SRV_LOG_SUB SRV_SUB_RPC
#include "tls.h"

#include <errno.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "secfile.h"

#define SRV_TLS_FILE_LIMIT (1u << 20) /* bytes of one PEM file */

enum { SRV_TLS_CERT, SRV_TLS_KEY, SRV_TLS_CA, SRV_TLS_NFILES };

/* What a stat says of a file: a change of any field means "read it". */
typedef struct srv_tls_sig {
  bool ok; /* the stat succeeded */
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime, ctime;
} srv_tls_sig;

/* One PEM set, read and checked. */
typedef struct srv_tls_pem {
  char *pem[SRV_TLS_NFILES]; /* NUL-terminated; CA NULL without one */
  char about[512];           /* subject, serial, expiry, for the logs */
} srv_tls_pem;

typedef struct srv_tls_slot {
  srv_tls *t;
  uint64_t served; /* the generation this listener's connector has */
} srv_tls_slot;

struct srv_tls {
  char path[SRV_TLS_NFILES][SRV_FILE_MAX]; /* "" for no CA */
  grpc_ssl_client_certificate_request_type request;
  bool require;
  pthread_mutex_t mu;
  srv_tls_sig sig[SRV_TLS_NFILES]; /* as last read, good or bad */
  srv_tls_pem cur;                 /* in force */
  uint64_t generation;             /* of `cur`, from 1 */
  srv_tls_slot slots[SRV_MAX_LISTEN];
  int num_slots;
};

static const char *const srv_tls_key_names[SRV_TLS_NFILES] = {
    "cert_file", "key_file", "client_ca_file"};

/* --- reading and checking ------------------------------------------------ */

static void srv_tls_stat(const char *path, srv_tls_sig *sig) {
  struct stat sb;
  memset(sig, 0, sizeof(*sig));
  if (!path[0] || stat(path, &sb) != 0) return;
  sig->ok = true;
  sig->dev = sb.st_dev;
  sig->ino = sb.st_ino;
  sig->size = sb.st_size;
  sig->mtime = sb.st_mtim;
  sig->ctime = sb.st_ctim;
}

static bool srv_tls_sig_same(const srv_tls_sig *a, const srv_tls_sig *b) {
  return a->ok == b->ok && a->dev == b->dev && a->ino == b->ino &&
         a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
         a->mtime.tv_nsec == b->mtime.tv_nsec &&
         a->ctime.tv_sec == b->ctime.tv_sec &&
         a->ctime.tv_nsec == b->ctime.tv_nsec;
}

/* The whole file, NUL-terminated, in *out; false with the reason. */
static bool srv_tls_read(const char *key, const char *path, char **out,
                         char *err, size_t errlen) {
  /* Never blocks on a FIFO or a device (secfile.h). */
  srv_file_rules rules = {key, false, false, NULL};
  int fd = -1;
  struct stat sb;
  dev_status st = DEV_STATUS_INIT;
  FILE *f = NULL;
  if (srv_file_open(path, &rules, &fd, &sb, &st) == PD_OK &&
      !(f = fdopen(fd, "rb")))
    close(fd);
  if (!f) {
    snprintf(err, errlen, "%s", st.msg[0] ? st.msg : "out of memory");
    return false;
  }
  char *buf = malloc(SRV_TLS_FILE_LIMIT + 1);
  size_t n = buf ? fread(buf, 1, SRV_TLS_FILE_LIMIT + 1, f) : 0;
  bool bad = !buf || ferror(f);
  fclose(f);
  if (bad || n > SRV_TLS_FILE_LIMIT || n == 0) {
    snprintf(err, errlen, "%s %s %s", key, path,
             !buf  ? "cannot be read: out of memory"
             : bad ? "cannot be read"
             : n   ? "is over 1 MiB: expected a PEM file"
                   : "is empty: expected a PEM file");
    free(buf);
    return false;
  }
  buf[n] = '\0';
  *out = buf;
  return true;
}

/* The first certificate of a PEM text, or NULL. */
static X509 *srv_tls_x509(const char *pem) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  BIO_free(b);
  return x;
}

/* "subject CN=..., serial 1A2B..., expires ..." of the leaf. */
static void srv_tls_describe(X509 *x, char *out, size_t len) {
  char subject[256] = "?", serial[80] = "?", expiry[64] = "?";
  X509_NAME_oneline(X509_get_subject_name(x), subject, sizeof(subject));
  BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
  char *hex = bn ? BN_bn2hex(bn) : NULL;
  if (hex) snprintf(serial, sizeof(serial), "%s", hex);
  OPENSSL_free(hex);
  BN_free(bn);
  BIO *b = BIO_new(BIO_s_mem());
  if (b && ASN1_TIME_print(b, X509_get0_notAfter(x)) > 0) {
    int n = BIO_read(b, expiry, (int)sizeof(expiry) - 1);
    expiry[n > 0 ? n : 0] = '\0';
  }
  BIO_free(b);
  snprintf(out, len, "subject %s, serial %s, expires %s", subject, serial,
           expiry);
}

/* Parses the certificate, the key and the CA bundle and checks that the
 * key is the certificate's (gRPC would otherwise fail every handshake
 * with nothing in the log). */
static bool srv_tls_check_pem(const char *const path[], srv_tls_pem *p,
                              char *err, size_t errlen) {
  bool ok = false;
  X509 *x = srv_tls_x509(p->pem[SRV_TLS_CERT]);
  BIO *kb = BIO_new_mem_buf(p->pem[SRV_TLS_KEY], -1);
  EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  X509 *ca = p->pem[SRV_TLS_CA] ? srv_tls_x509(p->pem[SRV_TLS_CA]) : NULL;
  if (!x)
    snprintf(err, errlen,
             "cert_file %s holds no PEM certificate (expected -----BEGIN "
             "CERTIFICATE-----)",
             path[SRV_TLS_CERT]);
  else if (!k)
    snprintf(err, errlen,
             "key_file %s holds no PEM private key (expected an "
             "unencrypted -----BEGIN PRIVATE KEY-----)",
             path[SRV_TLS_KEY]);
  else if (X509_check_private_key(x, k) != 1)
    snprintf(err, errlen,
             "key_file %s is not the private key of the certificate in "
             "cert_file %s (install a certificate together with the key it "
             "was issued for)",
             path[SRV_TLS_KEY], path[SRV_TLS_CERT]);
  else if (X509_cmp_current_time(X509_get0_notAfter(x)) <= 0)
    snprintf(err, errlen,
             "the certificate in cert_file %s has expired: every client "
             "would refuse it; renew it",
             path[SRV_TLS_CERT]);
  else if (p->pem[SRV_TLS_CA] && !ca)
    snprintf(err, errlen,
             "client_ca_file %s holds no PEM certificate (expected the CA "
             "bundle that signs the clients' certificates)",
             path[SRV_TLS_CA]);
  else
    ok = true;
  if (ok) srv_tls_describe(x, p->about, sizeof(p->about));
  X509_free(ca);
  EVP_PKEY_free(k);
  BIO_free(kb);
  X509_free(x);
  ERR_clear_error();
  return ok;
}

static void srv_tls_pem_free(srv_tls_pem *p) {
  for (int i = 0; i < SRV_TLS_NFILES; i++) {
    free(p->pem[i]);
    p->pem[i] = NULL;
  }
}

/* Reads the files into *p and checks them; false with the reason (and *p
 * freed). */
static bool srv_tls_load(const char *const path[], srv_tls_pem *p, char *err,
                         size_t errlen) {
  memset(p, 0, sizeof(*p));
  for (int i = 0; i < SRV_TLS_NFILES; i++) {
    if (!path[i][0]) continue;
    if (!srv_tls_read(srv_tls_key_names[i], path[i], &p->pem[i], err, errlen))
      goto fail;
  }
  if (srv_tls_check_pem(path, p, err, errlen)) return true;
fail:
  srv_tls_pem_free(p);
  return false;
}

static void srv_tls_paths(const srv_options *o,
                          char path[SRV_TLS_NFILES][SRV_FILE_MAX]) {
  snprintf(path[SRV_TLS_CERT], SRV_FILE_MAX, "%s", o->tls_cert_file);
  snprintf(path[SRV_TLS_KEY], SRV_FILE_MAX, "%s", o->tls_key_file);
  snprintf(path[SRV_TLS_CA], SRV_FILE_MAX, "%s", o->tls_client_ca_file);
}

bool srv_tls_check_files(const srv_options *o, char *about, size_t about_len,
                         char *err, size_t errlen) {
  char path[SRV_TLS_NFILES][SRV_FILE_MAX];
  srv_tls_paths(o, path);
  const char *p[SRV_TLS_NFILES] = {path[0], path[1], path[2]};
  srv_tls_pem pem;
  if (!srv_tls_load(p, &pem, err, errlen)) return false;
  if (about) snprintf(about, about_len, "%s", pem.about);
  srv_tls_pem_free(&pem);
  return true;
}

/* --- reloading ------------------------------------------------------------ */

/* Reads the files again into the set in force, with `mu` held; the
 * signatures are recorded whatever the outcome, so a bad set is tried again
 * only when a file changes again (or on SIGHUP). */
static bool srv_tls_reload_locked(srv_tls *t, const char *why) {
  for (int i = 0; i < SRV_TLS_NFILES; i++) srv_tls_stat(t->path[i], &t->sig[i]);
  const char *p[SRV_TLS_NFILES] = {t->path[0], t->path[1], t->path[2]};
  srv_tls_pem pem;
  char err[2 * SRV_FILE_MAX + 256];
  if (!srv_tls_load(p, &pem, err, sizeof(err))) {
    SRV_ERROR(
        "TLS reload (%s) failed: %s; new connections keep the certificate "
        "in force (%s)",
        why, err, t->cur.about);
    return false;
  }
  srv_tls_pem_free(&t->cur);
  t->cur = pem;
  t->generation++;
  SRV_NOTICE("TLS reload (%s): new connections get %s", why, t->cur.about);
  return true;
}

bool srv_tls_reload(srv_tls *t) {
  if (!t) return false;
  pthread_mutex_lock(&t->mu);
  bool ok = srv_tls_reload_locked(t, "SIGHUP");
  pthread_mutex_unlock(&t->mu);
  return ok;
}

/* A changed file since the last read: a stat of each, nothing more (this
 * runs for every new connection). */
static bool srv_tls_changed_locked(srv_tls *t) {
  for (int i = 0; i < SRV_TLS_NFILES; i++) {
    if (!t->path[i][0]) continue;
    srv_tls_sig now;
    srv_tls_stat(t->path[i], &now);
    if (!srv_tls_sig_same(&now, &t->sig[i])) return true;
  }
  return false;
}

/* gRPC's fetcher (grpc_ssl_server_certificate_config_callback): NEW with a
 * config of the set in force when this listener's connector has an older
 * one, else UNCHANGED. A reload that failed leaves the set in force, so it
 * answers UNCHANGED rather than FAIL (gRPC would log FAIL at every
 * connection). */
static grpc_ssl_certificate_config_reload_status srv_tls_fetch(
    void *user, grpc_ssl_server_certificate_config **config) {
  srv_tls_slot *slot = user;
  srv_tls *t = slot->t;
  grpc_ssl_certificate_config_reload_status r =
      GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  pthread_mutex_lock(&t->mu);
  if (srv_tls_changed_locked(t)) srv_tls_reload_locked(t, "a file changed");
  if (slot->served != t->generation) {
    grpc_ssl_pem_key_cert_pair pair = {t->cur.pem[SRV_TLS_KEY],
                                       t->cur.pem[SRV_TLS_CERT]};
    /* gRPC 1.51 asserts a root bundle in every fetched config, even when
     * it requests no client certificate: then the server's own chain
     * stands in (it is never used). */
    const char *roots = t->cur.pem[SRV_TLS_CA] ? t->cur.pem[SRV_TLS_CA]
                                               : t->cur.pem[SRV_TLS_CERT];
    *config = grpc_ssl_server_certificate_config_create(roots, &pair, 1);
    if (*config) {
      slot->served = t->generation;
      r = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
    } else {
      r = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    }
  }
  pthread_mutex_unlock(&t->mu);
  return r;
}

/* --- the state ------------------------------------------------------------ */

srv_tls *srv_tls_new(const srv_options *o, char *err, size_t errlen) {
  srv_tls *t = calloc(1, sizeof(*t));
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  srv_tls_paths(o, t->path);
  t->require = o->tls_require_client_cert;
  t->request = o->tls_require_client_cert
                   ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : o->tls_client_ca_file[0]
                   ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  for (int i = 0; i < SRV_TLS_NFILES; i++) srv_tls_stat(t->path[i], &t->sig[i]);
  const char *p[SRV_TLS_NFILES] = {t->path[0], t->path[1], t->path[2]};
  if (!srv_tls_load(p, &t->cur, err, errlen)) {
    free(t);
    return NULL;
  }
  t->generation = 1;
  pthread_mutex_init(&t->mu, NULL);
  SRV_INFO("TLS certificate: %s", t->cur.about);
  return t;
}

void srv_tls_free(srv_tls *t) {
  if (!t) return;
  srv_tls_pem_free(&t->cur);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

grpc_server_credentials *srv_tls_server_credentials(srv_tls *t) {
  if (t->num_slots == SRV_MAX_LISTEN) return NULL;
  srv_tls_slot *slot = &t->slots[t->num_slots++];
  slot->t = t;
  slot->served = 0;
  grpc_ssl_server_credentials_options *opts =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          t->request, srv_tls_fetch, slot);
  if (!opts) return NULL;
  /* Takes the options. */
  return grpc_ssl_server_credentials_create_with_options(opts);
}

const char *srv_tls_mode_name(const srv_tls *t) {
  switch (t->request) {
    case GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY:
      return "TLS, client certificates required";
    case GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY:
      return "TLS, client certificates verified when given";
    default: return "TLS";
  }
}

bool srv_tls_requires_client_cert(const srv_tls *t) { return t && t->require; }
