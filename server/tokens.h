/* Bearer tokens (issue #14): the tokens file, which holds only the SHA-256
 * of each token, and the check of a presented token against it.
 *
 * The file: one token a line, `NAME sha256:HEX` (64 hex digits, the
 * SHA-256 of the token's bytes as the client sends them); blank lines and
 * lines starting with '#' are comments. NAME (printable, no blanks, at most
 * SRV_IDENTITY_NAME_MAX bytes) is the identity a call presenting the token
 * gets (auth.h, SRV_IDENTITY_TOKEN); names and hashes are unique. An
 * operator makes a line with `paradevd --hash-token` (the token on stdin).
 *
 * Reloading: every check stats the file (one stat a call that presents a
 * token); when its signature (inode, size, mtime, ctime) changed, the file
 * is read again. A new file that does not parse keeps the old table and is
 * logged, with its line and what was expected; a file that is gone or
 * unreadable empties the table (every token refused: deleting the file
 * revokes every token) and is logged. Either is logged once per change.
 * Each good reload increments the table's generation (srv_tokens_generation),
 * by which open streams notice that a token they were let in with must be
 * checked again (auth.c srv_call_recheck).
 *
 * Thread safety: every function may be called from any thread. */
#ifndef PARADEV_SERVER_TOKENS_H
#define PARADEV_SERVER_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "device.h"

#define SRV_TOKEN_HASH_HEX 71 /* "sha256:" + 64 hex digits */
#define SRV_TOKEN_MAX 4096    /* bytes of a presented token */

typedef struct srv_tokens srv_tokens;

/* One entry of a parsed file. */
typedef struct srv_token_ent {
  char name[SRV_IDENTITY_NAME_MAX + 1];
  uint8_t hash[32];
} srv_token_ent;

/* Parses a tokens file's text (`len` bytes) into a new array *out (free()
 * it) of *n entries. INVALID_ARGUMENT naming the line and what was expected
 * (a line that is not NAME sha256:HEX, a bad name, a hash of the wrong
 * length, a name or hash listed twice, a NUL byte); RESOURCE_EXHAUSTED when
 * out of memory. */
pd_code srv_tokens_parse(const char *text, size_t len, srv_token_ent **out,
                         int *n, dev_status *st);

/* Writes "sha256:HEX" of `len` bytes of `token` (OpenSSL's EVP SHA-256)
 * into out[SRV_TOKEN_HASH_HEX + 1]. False when libcrypto failed. */
bool srv_token_hash_hex(const void *token, size_t len, char *out);

/* Opens the tokens file at `path` (absolute): reads it now. A file that
 * cannot be read or parsed is an error at start (INVALID_ARGUMENT naming
 * the file, the line and what was expected; NOT_FOUND when missing;
 * FAILED_PRECONDITION when it is not a regular file, or one that group or
 * others may write or that is owned by neither root nor the daemon's user:
 * secfile.h, the same check as the job tokens file's); RESOURCE_EXHAUSTED
 * when out of memory. A reload applies the same checks: a refused file
 * keeps the table in force. */
pd_code srv_tokens_open(const char *path, srv_tokens **out, dev_status *st);
void srv_tokens_free(srv_tokens *t);
const char *srv_tokens_path(const srv_tokens *t);

/* Checks `len` bytes of a presented token: re-reads the file first when it
 * changed (see above). On PD_OK, name[cap] gets the token's NAME. Errors:
 * UNAUTHENTICATED (no entry has its hash: wrong, revoked, or the table is
 * empty), RESOURCE_EXHAUSTED (libcrypto out of memory). Each entry is
 * compared with CRYPTO_memcmp and every entry is looked at, so the time
 * does not depend on which entry matched or how much of a hash did. */
pd_code srv_tokens_check(srv_tokens *t, const void *token, size_t len,
                         char *name, size_t cap, dev_status *st);

/* The table's generation: 1 when opened, + 1 at each change of the table
 * (a good reload, or the file gone). Looks at the file first (a stat, and
 * a reload when it changed) when it was last looked at over a second ago,
 * so an open stream that asks at each item learns of a revocation within
 * about a second, at the cost of one stat a second. Any thread. */
uint64_t srv_tokens_generation(srv_tokens *t);

/* Entries in the table now, and reloads (good and refused) so far. */
void srv_tokens_stats(srv_tokens *t, int *entries, uint64_t *reloads,
                      uint64_t *refused);

/* `paradevd --hash-token`: reads one token from stdin (the first line,
 * without its newline; blanks around it are part of it and refused),
 * prints its "sha256:HEX" to stdout. Returns the exit status (0, or 2 with
 * the reason on stderr). */
int srv_tokens_hash_main(void);

#endif /* PARADEV_SERVER_TOKENS_H */
