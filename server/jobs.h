/* Job tokens: proof of a session's job id (issue #14).
 *
 * An operator (the Slurm prolog, as root, on the admin socket) mints a
 * token for a job with Admin.CreateJobToken and hands it to the job; the
 * job's clients present it at CreateSession, and the session's job id then
 * comes from the token, so a job id cannot be claimed by anyone else. The
 * epilog's Admin.KillJob revokes the token and ends the sessions bound to
 * the job. Only the SHA-256 of each token is kept (OpenSSL libcrypto), and
 * compared in constant time; the table is bounded ([auth] max_job_tokens)
 * and every token expires. With [auth] job_tokens_file the hashes outlive
 * a restart (srv_jobs_open_file); without, a restart forgets every token.
 * A token may also bind the job to daemon devices (issue #17: the GPUs
 * Slurm gave it, CreateJobToken.gpus): kept with its hash, revoked with it. */
#ifndef PARADEV_SERVER_JOBS_H
#define PARADEV_SERVER_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h" /* dev_status, pd_code */

#define SRV_JOB_TOKEN_PREFIX "pdjob1_"
/* "pdjob1_" and 64 hex digits (32 random bytes), and its NUL. */
#define SRV_JOB_TOKEN_CHARS (sizeof(SRV_JOB_TOKEN_PREFIX) - 1 + 64)
#define SRV_JOB_ID_MAX 64 /* bytes of a job id that a token may carry */
#define SRV_JOB_LIFETIME_MAX (30u * 86400u) /* seconds */

typedef struct srv_jobs srv_jobs;

/* A table of at most `capacity` live tokens (>= 1). NULL when out of
 * memory. */
srv_jobs *srv_jobs_new(int capacity);
/* Accepts NULL. */
void srv_jobs_free(srv_jobs *j);
/* Keeps the table in the file at `path` from now on, after loading the
 * live entries it holds (*loaded; *dropped: those beyond the capacity).
 * No file yet is fine. Call once, before the table is shared. Errors:
 * FAILED_PRECONDITION (unreadable; not a regular file of root or this
 * user that no one else may write, secfile.h; a line that is not paradevd's, naming it: the table
 * is then left empty), RESOURCE_EXHAUSTED. */
pd_code srv_jobs_open_file(srv_jobs *j, const char *path, int *loaded,
                           int *dropped, dev_status *st);

/* Tests: the clock expiry reads (milliseconds, monotonic); NULL: the real
 * CLOCK_MONOTONIC. Call before the table is shared. */
void srv_jobs_set_clock(srv_jobs *j, int64_t (*now_ms)(void));

/* A job id a token may carry: 1..SRV_JOB_ID_MAX bytes of printable ASCII
 * without spaces. Errors: INVALID_ARGUMENT naming the length or the first
 * bad byte and what is expected. */
pd_code srv_jobs_check_id(const char *job, dev_status *st);

/* Mints a token for `job` (1..SRV_JOB_ID_MAX bytes of printable ASCII, no
 * space) bound to `uid` (-1: to no uid) and to the daemon devices
 * `devices` (issue #17: the job's GPUs as daemon devices, whose sessions may
 * use no others; NULL or n == 0: no device binding; indices as given, the
 * caller checks them against the mesh), valid `lifetime_s` seconds
 * (1..SRV_JOB_LIFETIME_MAX). A job has at most one token: an older one is
 * dropped (*replaced true). Expired entries are dropped first; a full table
 * of live tokens is RESOURCE_EXHAUSTED naming the limit. `token` receives
 * the token's text (SRV_JOB_TOKEN_CHARS + 1 bytes). With a file, the token
 * exists only once the file holds it. Errors: INVALID_ARGUMENT (the job id,
 * uid or lifetime, naming what is expected), RESOURCE_EXHAUSTED, UNAVAILABLE
 * (the file could not be written: no token was made), INTERNAL (no
 * randomness). Thread-safe. */
pd_code srv_jobs_mint(srv_jobs *j, const char *job, int64_t uid,
                      const dev_devset *devices, uint32_t lifetime_s,
                      char token[SRV_JOB_TOKEN_CHARS + 1], bool *replaced,
                      dev_status *st);

/* What a presented token proves: its job, the uid and the devices it is
 * bound to. */
typedef struct srv_job_proof {
  char job[SRV_JOB_ID_MAX + 1];
  int64_t uid;        /* -1: not bound */
  int64_t left_s;     /* seconds of validity left */
  dev_devset devices; /* n == 0: bound to no devices (the whole mesh) */
} srv_job_proof;

/* Checks a presented token (len bytes): its SHA-256 is compared in
 * constant time with every live entry's. Errors: UNAUTHENTICATED (not a
 * job token's shape, unknown or revoked, or expired: the message says
 * which, never echoing the token). Thread-safe. */
pd_code srv_jobs_check(srv_jobs *j, const char *token, size_t len,
                       srv_job_proof *out, dev_status *st);

/* Drops the token of `job`; true when it had a live one. It is gone from
 * memory at once; when the file cannot be rewritten, *st says why (the
 * file still holds it: a restart would bring it back until it expires).
 * Thread-safe. */
bool srv_jobs_revoke(srv_jobs *j, const char *job, dev_status *st);

/* Live (unexpired) tokens now. Thread-safe. */
int srv_jobs_count(srv_jobs *j);

#endif /* PARADEV_SERVER_JOBS_H */
