/* Helpers of storage's tests (tests/storage, cmocka): a scratch directory,
 * files with known bytes, and a log hook that keeps the last refusal. */
#ifndef PARADEV_STGTEST_H
#define PARADEV_STGTEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "storage.h"

/* A fresh directory under $TMPDIR (or /tmp); removed by st_rmtree. */
char *st_mkdtemp(void);
void st_rmtree(const char *dir);
/* dir + "/" + name, malloc'd. */
char *st_join(const char *dir, const char *name);
/* Writes `n` bytes; aborts the test on failure. */
void st_write_file(const char *path, const void *data, size_t n);
/* n pseudo-random bytes from `seed` (xorshift64*), malloc'd. */
unsigned char *st_bytes(size_t n, uint64_t seed);
/* Reads a whole file (malloc'd; *n its size); NULL when it does not exist. */
unsigned char *st_read_file(const char *path, size_t *n);

/* Installs a log hook that keeps the last line and its level. */
void st_log_capture(void);
const char *st_log_last(int *level);
void st_log_reset(void);

/* assert_int_equal on codes, printing the status message on mismatch. */
#define st_assert_code(rc, want, st)                                           \
  do {                                                                         \
    int st__rc = (int)(rc);                                                    \
    if (st__rc != (int)(want)) print_error("status: %s\n", (st)->msg);         \
    assert_int_equal(st__rc, (int)(want));                                     \
  } while (0)

#endif
