/* See tokens.h: the tokens file, its reloads, and checking a token. */
#define SRV_LOG_SUB SRV_SUB_CONFIG
#include "tokens.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "log.h"
#include "secfile.h"

/* What identifies one version of the file. */
typedef struct srv_file_sig {
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime, ctime;
} srv_file_sig;

struct srv_tokens {
  pthread_mutex_t mu; /* guards everything below */
  char path[SRV_ROOT_MAX];
  srv_token_ent *v;
  int n;
  srv_file_sig sig; /* of the version last looked at */
  bool have_sig;    /* false: missing or unreadable last time */
  uint64_t reloads, refused;
  uint64_t generation; /* + 1 at each change of v (a reload, emptied) */
  int64_t stat_ms;     /* CLOCK_MONOTONIC of the last look at the file */
};

/* How often an open stream's re-check looks at the file (a stat), at
 * most: a new call always looks. */
#define SRV_TOKENS_RESTAT_MS 1000

static int64_t srv_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool srv_hash(const void *data, size_t len, uint8_t out[32]) {
  unsigned int n = 0;
  return EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32;
}

bool srv_token_hash_hex(const void *token, size_t len, char *out) {
  uint8_t h[32];
  if (!srv_hash(token, len, h)) return false;
  memcpy(out, "sha256:", 7);
  for (int i = 0; i < 32; i++) snprintf(out + 7 + 2 * i, 3, "%02x", h[i]);
  return true;
}

static int srv_hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* One line "NAME sha256:HEX" (without its newline) into `e`. */
static pd_code srv_parse_line(const char *p, size_t len, int line,
                              srv_token_ent *e, dev_status *st) {
  const char *end = p + len;
  const char *name = p;
  while (p < end && *p != ' ' && *p != '\t') p++;
  size_t nlen = (size_t)(p - name);
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  const char *hash = p;
  while (p < end && *p != ' ' && *p != '\t') p++;
  size_t hlen = (size_t)(p - hash);
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  if (!nlen || !hlen || p != end)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "line %d: expected 'NAME sha256:HEX' (two fields; make "
                     "the hash with paradevd --hash-token)",
                     line);
  if (nlen > SRV_IDENTITY_NAME_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "line %d: a name of %zu bytes; at most %d", line, nlen,
                     SRV_IDENTITY_NAME_MAX);
  for (size_t i = 0; i < nlen; i++)
    if ((unsigned char)name[i] < 0x21 || name[i] == 0x7f || name[i] == ',')
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "line %d: the name holds a control byte or a comma; "
                       "expected printable bytes",
                       line);
  if (hlen != SRV_TOKEN_HASH_HEX || strncmp(hash, "sha256:", 7) != 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "line %d: expected the hash as sha256: and 64 hex "
                     "digits (%zu bytes given), as paradevd --hash-token "
                     "prints it; never the token itself",
                     line, hlen);
  for (int i = 0; i < 32; i++) {
    int hi = srv_hexval(hash[7 + 2 * i]), lo = srv_hexval(hash[8 + 2 * i]);
    if (hi < 0 || lo < 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "line %d: the hash has a byte that is not a hex digit",
                       line);
    e->hash[i] = (uint8_t)(hi << 4 | lo);
  }
  memcpy(e->name, name, nlen);
  e->name[nlen] = '\0';
  return PD_OK;
}

/* The entry that repeats an earlier one's name or hash, or -1. */
static int srv_find_dup(const srv_token_ent *v, int n, const srv_token_ent *e,
                        bool *by_name) {
  for (int i = 0; i < n; i++) {
    *by_name = strcmp(v[i].name, e->name) == 0;
    if (*by_name || memcmp(v[i].hash, e->hash, 32) == 0) return i;
  }
  return -1;
}

pd_code srv_tokens_parse(const char *text, size_t len, srv_token_ent **out,
                         int *n, dev_status *st) {
  if (memchr(text, '\0', len))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "the file holds a NUL byte; expected text");
  int cap = 0, k = 0, line = 0;
  srv_token_ent *v = NULL;
  pd_code c = PD_OK;
  for (const char *p = text, *end = text + len; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end;
    line++;
    const char *b = p, *e = le;
    while (b < e && (*b == ' ' || *b == '\t')) b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) e--;
    p = nl ? nl + 1 : end;
    if (b == e || *b == '#') continue;
    if (k == cap) {
      cap = cap ? 2 * cap : 8;
      srv_token_ent *nv = realloc(v, sizeof(*v) * (size_t)cap);
      if (!nv) {
        c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
        goto fail;
      }
      v = nv;
    }
    PD_TRY_GOTO(srv_parse_line(b, (size_t)(e - b), line, &v[k], st), c, fail);
    bool by_name = false;
    int d = srv_find_dup(v, k, &v[k], &by_name);
    if (d >= 0) {
      c = dev_error(st, PD_INVALID_ARGUMENT,
                    "line %d: %s as an earlier line (%s); expected each "
                    "token once, under one name",
                    line, by_name ? "the same name" : "the same hash",
                    v[d].name);
      goto fail;
    }
    k++;
  }
  *out = v;
  *n = k;
  return PD_OK;
fail:
  free(v);
  return c;
}

/* Reads and parses the whole file at `path`; *sig gets what was read. */
static pd_code srv_tokens_read(const char *path, srv_token_ent **v, int *n,
                               srv_file_sig *sig, dev_status *st) {
  /* Whoever may write it may mint an identity (an operator's too). */
  static const srv_file_rules rules = {
      "the tokens file", true, false,
      "another user could add a token and take any identity, an operator's "
      "included"};
  int fd = -1;
  struct stat sb;
  PD_TRY(srv_file_open(path, &rules, &fd, &sb, st));
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  char *buf = NULL;
  pd_code c = PD_OK;
  if (sb.st_size > (16 << 20)) {
    c = dev_error(st, PD_INVALID_ARGUMENT,
                  "%s: the tokens file is %lld bytes; expected at most 16 MiB",
                  path, (long long)sb.st_size);
    goto out;
  }
  *sig =
      (srv_file_sig){sb.st_dev, sb.st_ino, sb.st_size, sb.st_mtim, sb.st_ctim};
  buf = malloc((size_t)sb.st_size + 1);
  if (!buf) {
    c = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto out;
  }
  size_t got = fread(buf, 1, (size_t)sb.st_size, f);
  if (ferror(f)) {
    c = dev_error(st, PD_INVALID_ARGUMENT, "%s: read error", path);
    goto out;
  }
  c = srv_tokens_parse(buf, got, v, n, st);
  if (c != PD_OK) {
    char msg[sizeof(st->msg)];
    snprintf(msg, sizeof(msg), "%s", st->msg);
    dev_error(st, c, "%s: %s", path, msg);
  }
out:
  free(buf);
  fclose(f);
  return c;
}

pd_code srv_tokens_open(const char *path, srv_tokens **out, dev_status *st) {
  srv_tokens *t = calloc(1, sizeof(*t));
  if (!t) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  snprintf(t->path, sizeof(t->path), "%s", path);
  pd_code c = srv_tokens_read(path, &t->v, &t->n, &t->sig, st);
  if (c != PD_OK) {
    free(t);
    return c;
  }
  t->have_sig = true;
  t->generation = 1;
  t->stat_ms = srv_mono_ms();
  pthread_mutex_init(&t->mu, NULL);
  *out = t;
  return PD_OK;
}

void srv_tokens_free(srv_tokens *t) {
  if (!t) return;
  pthread_mutex_destroy(&t->mu);
  free(t->v);
  free(t);
}

const char *srv_tokens_path(const srv_tokens *t) { return t->path; }

static bool srv_sig_eq(const srv_file_sig *a, const struct stat *b) {
  return a->dev == b->st_dev && a->ino == b->st_ino && a->size == b->st_size &&
         a->mtime.tv_sec == b->st_mtim.tv_sec &&
         a->mtime.tv_nsec == b->st_mtim.tv_nsec &&
         a->ctime.tv_sec == b->st_ctim.tv_sec &&
         a->ctime.tv_nsec == b->st_ctim.tv_nsec;
}

/* Re-reads the file when it changed since last looked at (t->mu held). */
static void srv_tokens_refresh_locked(srv_tokens *t) {
  struct stat sb;
  t->stat_ms = srv_mono_ms();
  if (stat(t->path, &sb) != 0) {
    if (t->have_sig || t->n) {
      t->generation++;
      SRV_ERROR(
          "tokens file %s: %s; every bearer token is refused until it "
          "is back",
          t->path, strerror(errno));
      free(t->v);
      t->v = NULL;
      t->n = 0;
      t->refused++;
    }
    t->have_sig = false;
    return;
  }
  if (t->have_sig && srv_sig_eq(&t->sig, &sb)) return;
  srv_token_ent *v = NULL;
  int n = 0;
  srv_file_sig sig;
  dev_status st = DEV_STATUS_INIT;
  pd_code c = srv_tokens_read(t->path, &v, &n, &sig, &st);
  t->have_sig = true;
  if (c != PD_OK) {
    /* Looked at: the next change is read again, not this one. */
    t->sig = (srv_file_sig){sb.st_dev, sb.st_ino, sb.st_size, sb.st_mtim,
                            sb.st_ctim};
    t->refused++;
    SRV_ERROR(
        "tokens file changed but is refused: %s; keeping the %d "
        "token%s read before",
        st.msg, t->n, t->n == 1 ? "" : "s");
    return;
  }
  free(t->v);
  t->v = v;
  t->n = n;
  t->sig = sig;
  t->reloads++;
  t->generation++;
  SRV_INFO("tokens file %s reloaded: %d token%s", t->path, n,
           n == 1 ? "" : "s");
}

pd_code srv_tokens_check(srv_tokens *t, const void *token, size_t len,
                         char *name, size_t cap, dev_status *st) {
  uint8_t h[32];
  if (!srv_hash(token, len, h))
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "cannot hash the token (libcrypto failed)");
  pthread_mutex_lock(&t->mu);
  srv_tokens_refresh_locked(t);
  int found = -1;
  for (int i = 0; i < t->n; i++)
    if (CRYPTO_memcmp(t->v[i].hash, h, 32) == 0) found = i;
  if (found >= 0) snprintf(name, cap, "%s", t->v[found].name);
  pthread_mutex_unlock(&t->mu);
  if (found < 0)
    return dev_error(st, PD_UNAUTHENTICATED,
                     "the bearer token is not valid: unknown or revoked; ask "
                     "the operator for a token");
  return PD_OK;
}

uint64_t srv_tokens_generation(srv_tokens *t) {
  pthread_mutex_lock(&t->mu);
  if (srv_mono_ms() - t->stat_ms >= SRV_TOKENS_RESTAT_MS)
    srv_tokens_refresh_locked(t);
  uint64_t g = t->generation;
  pthread_mutex_unlock(&t->mu);
  return g;
}

void srv_tokens_stats(srv_tokens *t, int *entries, uint64_t *reloads,
                      uint64_t *refused) {
  pthread_mutex_lock(&t->mu);
  if (entries) *entries = t->n;
  if (reloads) *reloads = t->reloads;
  if (refused) *refused = t->refused;
  pthread_mutex_unlock(&t->mu);
}

int srv_tokens_hash_main(void) {
  char buf[SRV_TOKEN_MAX + 2];
  if (!fgets(buf, sizeof(buf), stdin)) {
    fprintf(stderr, "paradevd --hash-token: expected a token on stdin\n");
    return 2;
  }
  size_t len = strcspn(buf, "\r\n");
  bool whole = buf[len] == '\n' || buf[len] == '\r' || feof(stdin);
  buf[len] = '\0';
  if (!whole || len == 0 || len > SRV_TOKEN_MAX) {
    fprintf(stderr,
            "paradevd --hash-token: expected a token of 1 to %d bytes on "
            "the first line of stdin\n",
            SRV_TOKEN_MAX);
    return 2;
  }
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)buf[i] < 0x21 || buf[i] == 0x7f) {
      fprintf(stderr,
              "paradevd --hash-token: the token holds a blank or control "
              "byte (byte %zu); expected printable ASCII, such as the output "
              "of openssl rand -hex 32\n",
              i + 1);
      return 2;
    }
  char hex[SRV_TOKEN_HASH_HEX + 1];
  if (!srv_token_hash_hex(buf, len, hex)) {
    fprintf(stderr, "paradevd --hash-token: libcrypto failed\n");
    return 2;
  }
  printf("%s\n", hex);
  return 0;
}
