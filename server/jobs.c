/* Job tokens (jobs.h): a small table of SHA-256 hashes under one mutex.
 * Lookups scan every live entry and compare each hash in constant time
 * (CRYPTO_memcmp), so the time a check takes says nothing about which
 * entry, or which byte, matched. The table is small (max_job_tokens) and
 * touched only by CreateSession with a token and by the Admin methods.
 *
 * With a file ([auth] job_tokens_file) every mint and revocation rewrites
 * it whole (a temporary file, fsync, rename: a crash leaves the old or the
 * new one), under the table's mutex so that writes keep their order; a
 * start reads it back. Lines: "v1 SHA256HEX EXPIRES_UNIX_MS UID JOB", or
 * for a token bound to devices (issue #17) "v2 SHA256HEX EXPIRES_UNIX_MS
 * UID DEVICES JOB" with DEVICES as "1,3" (an unbound token keeps the v1
 * line, which an older paradevd reads too). */
#include "jobs.h"

#include "check.h"
#include "secfile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct srv_job_entry {
  bool used;
  char job[SRV_JOB_ID_MAX + 1];
  uint8_t hash[SHA256_DIGEST_LENGTH];
  int64_t uid;
  int64_t expires_ms; /* CLOCK_MONOTONIC */
  dev_devset devices; /* n == 0: none */
} srv_job_entry;

struct srv_jobs {
  pthread_mutex_t mu;
  int capacity;
  srv_job_entry *e;
  int64_t (*now_ms)(void);
  char *path; /* the file the table is kept in; NULL: memory only */
};

static int64_t srv_jobs_monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

srv_jobs *srv_jobs_new(int capacity) {
  if (capacity < 1) return NULL;
  srv_jobs *j = calloc(1, sizeof(*j));
  if (!j) return NULL;
  j->e = calloc((size_t)capacity, sizeof(*j->e));
  if (!j->e) {
    free(j);
    return NULL;
  }
  j->capacity = capacity;
  j->now_ms = srv_jobs_monotonic_ms;
  pthread_mutex_init(&j->mu, NULL);
  return j;
}

void srv_jobs_set_clock(srv_jobs *j, int64_t (*now_ms)(void)) {
  j->now_ms = now_ms ? now_ms : srv_jobs_monotonic_ms;
}

void srv_jobs_free(srv_jobs *j) {
  if (!j) return;
  OPENSSL_cleanse(j->e, sizeof(*j->e) * (size_t)j->capacity);
  free(j->e);
  free(j->path);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

/* Drops expired entries (j->mu held). */
static void srv_jobs_expire_locked(srv_jobs *j, int64_t now) {
  for (int i = 0; i < j->capacity; i++)
    if (j->e[i].used && j->e[i].expires_ms <= now)
      memset(&j->e[i], 0, sizeof(j->e[i]));
}

static int64_t srv_jobs_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Rewrites the file from the table (j->mu held); PD_OK without a file.
 * Errors: UNAVAILABLE naming the file and the system's reason. */
static pd_code srv_jobs_save_locked(srv_jobs *j, dev_status *st) {
  if (!j->path) return PD_OK;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", j->path);
  int fd =
      open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    int e = errno;
    if (fd >= 0) close(fd);
    return dev_error(st, PD_UNAVAILABLE,
                     "cannot write the job tokens file %s: %s", tmp,
                     strerror(e));
  }
  int64_t mono = j->now_ms(), unix_ms = srv_jobs_unix_ms();
  fprintf(f,
          "# paradevd job tokens: SHA-256 of each token, never a token. "
          "Written by paradevd; do not edit.\n");
  for (int i = 0; i < j->capacity; i++) {
    const srv_job_entry *e = &j->e[i];
    if (!e->used || e->expires_ms <= mono) continue;
    fprintf(f, e->devices.n ? "v2 " : "v1 ");
    for (int b = 0; b < SHA256_DIGEST_LENGTH; b++)
      fprintf(f, "%02x", e->hash[b]);
    fprintf(f, " %" PRId64 " %" PRId64 " ", unix_ms + (e->expires_ms - mono),
            e->uid);
    for (int d = 0; d < e->devices.n; d++)
      fprintf(f, "%s%d%s", d ? "," : "", e->devices.dev[d],
              d + 1 == e->devices.n ? " " : "");
    fprintf(f, "%s\n", e->job);
  }
  bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
  int e = errno;
  ok = fclose(f) == 0 && ok;
  if (ok && rename(tmp, j->path) != 0) {
    e = errno;
    ok = false;
  }
  if (!ok) {
    unlink(tmp);
    return dev_error(st, PD_UNAVAILABLE,
                     "cannot write the job tokens file %s: %s", j->path,
                     strerror(e));
  }
  return PD_OK;
}

/* A v2 line's DEVICES ("1,3": distinct indices below PD_MAX_DEVICES) into
 * *out; false when it is not that. */
static bool srv_jobs_parse_devices(const char *v, dev_devset *out) {
  memset(out, 0, sizeof(*out));
  bool seen[PD_MAX_DEVICES] = {false};
  while (*v) {
    char *end = NULL;
    if (*v < '0' || *v > '9') return false;
    unsigned long d = strtoul(v, &end, 10);
    if (d >= PD_MAX_DEVICES || seen[d] || out->n == PD_MAX_DEVICES)
      return false;
    seen[d] = true;
    out->dev[out->n++] = (uint8_t)d;
    v = end;
    if (*v == ',' && v[1])
      v++;
    else if (*v)
      return false;
  }
  return out->n > 0;
}

/* One line of the file into *e (0), or -1 with what is wrong in `why`. */
static int srv_jobs_parse_line(const char *line, int64_t mono, int64_t unix_ms,
                               srv_job_entry *e, const char **why) {
  char hex[65], job[SRV_JOB_ID_MAX + 2], devs[PD_MAX_DEVICES * 3 + 2] = "";
  long long exp = 0, uid = 0;
  int used = 0;
  bool v2 = strncmp(line, "v2 ", 3) == 0;
  int got = v2 ? sscanf(line, "v2 %64[0-9a-f] %lld %lld %193[0-9,] %65s%n", hex,
                        &exp, &uid, devs, job, &used)
               : sscanf(line, "v1 %64[0-9a-f] %lld %lld %65s%n", hex, &exp,
                        &uid, job, &used);
  if (got != (v2 ? 5 : 4) || strlen(hex) != 64 || line[used] != '\n') {
    *why =
        "expected \"v1 SHA256HEX EXPIRES_UNIX_MS UID JOB\" or \"v2 "
        "SHA256HEX EXPIRES_UNIX_MS UID DEVICES JOB\"";
    return -1;
  }
  dev_devset bound = {0, {0}};
  if (v2 && !srv_jobs_parse_devices(devs, &bound)) {
    *why = "a device list that is not distinct device indices (\"1,3\")";
    return -1;
  }
  dev_status ck = DEV_STATUS_INIT;
  if (srv_jobs_check_id(job, &ck) != PD_OK || uid < -1 ||
      uid >= (long long)UINT32_MAX) {
    *why = "a job id or uid that no token may carry";
    return -1;
  }
  memset(e, 0, sizeof(*e));
  for (int b = 0; b < SHA256_DIGEST_LENGTH; b++) {
    unsigned v;
    sscanf(hex + 2 * b, "%2x", &v);
    e->hash[b] = (uint8_t)v;
  }
  e->used = true;
  e->uid = uid;
  e->devices = bound;
  e->expires_ms = mono + ((int64_t)exp - unix_ms);
  memcpy(e->job, job, strlen(job) + 1); /* checked: at most SRV_JOB_ID_MAX */
  return 0;
}

pd_code srv_jobs_open_file(srv_jobs *j, const char *path, int *loaded,
                           int *dropped, dev_status *st) {
  *loaded = *dropped = 0;
  if (!(j->path = strdup(path)))
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  /* Whoever may write it could add a token of their own: the daemon's
   * (or root's) file alone, and never a FIFO that would block the start. */
  static const srv_file_rules rules = {"the job tokens file", true, true,
                                       "another user could add tokens"};
  int fd = -1;
  struct stat sb;
  pd_code oc = srv_file_open(path, &rules, &fd, &sb, st);
  if (oc == PD_NOT_FOUND) { /* the first start */
    *st = (dev_status)DEV_STATUS_INIT;
    return PD_OK;
  }
  if (oc != PD_OK) return oc;
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  char line[512];
  int n = 0, slot = 0;
  pd_code c = PD_OK;
  int64_t mono = j->now_ms(), unix_ms = srv_jobs_unix_ms();
  while (c == PD_OK && fgets(line, sizeof line, f)) {
    n++;
    if (line[0] == '#') continue;
    srv_job_entry e;
    const char *why = NULL;
    if (srv_jobs_parse_line(line, mono, unix_ms, &e, &why) != 0) {
      c = dev_error(st, PD_FAILED_PRECONDITION,
                    "the job tokens file %s:%d: %s (paradevd writes this "
                    "file; remove it to forget every token)",
                    path, n, why);
    } else if (e.expires_ms <= mono) {
      continue;
    } else if (slot == j->capacity) {
      (*dropped)++;
    } else {
      j->e[slot++] = e;
    }
  }
  fclose(f);
  if (c != PD_OK) memset(j->e, 0, sizeof(*j->e) * (size_t)j->capacity);
  *loaded = c == PD_OK ? slot : 0;
  return c;
}

pd_code srv_jobs_check_id(const char *job, dev_status *st) {
  size_t n = job ? strlen(job) : 0;
  if (n == 0 || n > SRV_JOB_ID_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "job_id is %zu bytes: expected 1 to %d bytes (such as "
                     "$SLURM_JOB_ID)",
                     n, SRV_JOB_ID_MAX);
  for (size_t i = 0; i < n; i++)
    if (job[i] <= 0x20 || job[i] >= 0x7f)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "job_id has byte 0x%02x at offset %zu: expected "
                       "printable ASCII without spaces (such as 1234 or "
                       "1234_7)",
                       (unsigned char)job[i], i);
  return PD_OK;
}

pd_code srv_jobs_mint(srv_jobs *j, const char *job, int64_t uid,
                      const dev_devset *devices, uint32_t lifetime_s,
                      char token[SRV_JOB_TOKEN_CHARS + 1], bool *replaced,
                      dev_status *st) {
  PD_TRY(srv_jobs_check_id(job, st));
  if (uid < -1 || uid > (int64_t)UINT32_MAX - 1)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "uid %lld: expected the job user's uid (0 to %u), or -1 "
                     "for a token bound to no uid",
                     (long long)uid, UINT32_MAX - 1);
  if (lifetime_s < 1 || lifetime_s > SRV_JOB_LIFETIME_MAX)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "lifetime %u s: expected 1 to %u seconds (30 days)",
                     lifetime_s, SRV_JOB_LIFETIME_MAX);
  uint8_t raw[32];
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
    return dev_error(st, PD_INTERNAL, "getrandom failed for a job token");
  int n = snprintf(token, SRV_JOB_TOKEN_CHARS + 1, "%s", SRV_JOB_TOKEN_PREFIX);
  for (size_t i = 0; i < sizeof raw; i++)
    n += snprintf(token + n, SRV_JOB_TOKEN_CHARS + 1 - (size_t)n, "%02x",
                  raw[i]);
  OPENSSL_cleanse(raw, sizeof raw);
  srv_job_entry e = {.used = true, .uid = uid};
  if (devices && devices->n > 0) e.devices = *devices;
  snprintf(e.job, sizeof e.job, "%s", job);
  SHA256((const unsigned char *)token, SRV_JOB_TOKEN_CHARS, e.hash);
  pthread_mutex_lock(&j->mu);
  int64_t now = j->now_ms();
  e.expires_ms = now + (int64_t)lifetime_s * 1000;
  srv_jobs_expire_locked(j, now);
  int slot = -1;
  *replaced = false;
  for (int i = 0; i < j->capacity; i++) {
    if (j->e[i].used && strcmp(j->e[i].job, job) == 0) {
      slot = i;
      *replaced = true;
      break;
    }
    if (!j->e[i].used && slot < 0) slot = i;
  }
  pd_code saved = PD_OK;
  if (slot >= 0) {
    srv_job_entry before = j->e[slot];
    j->e[slot] = e;
    saved = srv_jobs_save_locked(j, st);
    if (saved != PD_OK) j->e[slot] = before; /* not made: kept as it was */
  }
  pthread_mutex_unlock(&j->mu);
  if (saved != PD_OK) {
    OPENSSL_cleanse(token, SRV_JOB_TOKEN_CHARS + 1);
    return saved;
  }
  if (slot < 0) {
    OPENSSL_cleanse(token, SRV_JOB_TOKEN_CHARS + 1);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "%d job tokens are live, the limit ([auth] "
                     "max_job_tokens): end finished jobs (KillJob, the "
                     "epilog) or raise the limit",
                     j->capacity);
  }
  return PD_OK;
}

pd_code srv_jobs_check(srv_jobs *j, const char *token, size_t len,
                       srv_job_proof *out, dev_status *st) {
  size_t plen = sizeof(SRV_JOB_TOKEN_PREFIX) - 1;
  if (len != SRV_JOB_TOKEN_CHARS || memcmp(token, SRV_JOB_TOKEN_PREFIX, plen))
    return dev_error(st, PD_UNAUTHENTICATED,
                     "job_token is not a job token: expected \"%s\" and 64 "
                     "hex digits (%zu bytes), as Admin.CreateJobToken makes "
                     "(the Slurm prolog puts it in $PARADEV_JOB_TOKEN)",
                     SRV_JOB_TOKEN_PREFIX, (size_t)SRV_JOB_TOKEN_CHARS);
  uint8_t h[SHA256_DIGEST_LENGTH];
  SHA256((const unsigned char *)token, len, h);
  pthread_mutex_lock(&j->mu);
  int64_t now = j->now_ms();
  int found = -1;
  for (int i = 0; i < j->capacity; i++) {
    /* Every entry is compared, used or not, matched or not. */
    int differ = CRYPTO_memcmp(j->e[i].hash, h, sizeof h);
    if (!differ && j->e[i].used && found < 0) found = i;
  }
  srv_job_entry e = {0};
  if (found >= 0) e = j->e[found];
  if (found >= 0 && e.expires_ms <= now) memset(&j->e[found], 0, sizeof e);
  pthread_mutex_unlock(&j->mu);
  if (found < 0)
    return dev_error(st, PD_UNAUTHENTICATED,
                     "job_token is unknown to this paradevd: revoked (the "
                     "job ended: KillJob, the epilog), minted by another "
                     "daemon or before a restart, or mistyped");
  if (e.expires_ms <= now)
    return dev_error(st, PD_UNAUTHENTICATED,
                     "the job token of job \"%s\" expired %lld s ago (its "
                     "lifetime is set by CreateJobToken, default [auth] "
                     "job_token_lifetime_seconds)",
                     e.job, (long long)((now - e.expires_ms) / 1000));
  snprintf(out->job, sizeof out->job, "%s", e.job);
  out->uid = e.uid;
  out->devices = e.devices;
  out->left_s = (e.expires_ms - now) / 1000;
  return PD_OK;
}

bool srv_jobs_revoke(srv_jobs *j, const char *job, dev_status *st) {
  bool live = false, found = false;
  pthread_mutex_lock(&j->mu);
  int64_t now = j->now_ms();
  for (int i = 0; i < j->capacity; i++)
    if (j->e[i].used && strcmp(j->e[i].job, job) == 0) {
      live = j->e[i].expires_ms > now;
      found = true;
      memset(&j->e[i], 0, sizeof(j->e[i]));
    }
  if (found) srv_jobs_save_locked(j, st);
  pthread_mutex_unlock(&j->mu);
  return live;
}

int srv_jobs_count(srv_jobs *j) {
  int n = 0;
  pthread_mutex_lock(&j->mu);
  srv_jobs_expire_locked(j, j->now_ms());
  for (int i = 0; i < j->capacity; i++) n += j->e[i].used;
  pthread_mutex_unlock(&j->mu);
  return n;
}
