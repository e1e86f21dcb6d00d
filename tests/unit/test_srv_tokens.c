/* The tokens file (server/tokens.c) and identity lists (config_tenants.c):
 * hashing against the FIPS 180-2 test vectors, parsing (comments, blanks,
 * CRLF; each malformed line named), checking a token, and reloading when
 * the file changes: a new token works and a removed one is refused at once,
 * a broken edit keeps the old table, a deleted file refuses every token.
 * The shared check of files that grant rights (server/secfile.c, trial
 * findings 6 and 9): a tokens file that group or others may write, or
 * owned by another user, is refused at open and on reload; a FIFO, a
 * directory or a device is refused at once instead of blocking the open;
 * the job tokens file gets the same check; the table's generation moves
 * at each change and only then (finding 7). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config_int.h"
#include "jobs.h"
#include "tokens.h"

/* SHA-256("abc") and SHA-256("") (FIPS 180-2, appendix B.1; and the
 * well-known empty-input digest). */
#define ABC_HASH                                                               \
  "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define EMPTY_HASH                                                             \
  "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static void test_hash_vectors(void **state) {
  (void)state;
  char hex[SRV_TOKEN_HASH_HEX + 1];
  assert_true(srv_token_hash_hex("abc", 3, hex));
  assert_string_equal(hex, ABC_HASH);
  assert_true(srv_token_hash_hex("", 0, hex));
  assert_string_equal(hex, EMPTY_HASH);
}

static void test_parse_good(void **state) {
  (void)state;
  const char *text = "# tokens\n\n  alice " ABC_HASH
                     "  \r\nspiffe://x/bob\t" EMPTY_HASH "\n# end";
  srv_token_ent *v = NULL;
  int n = 0;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_tokens_parse(text, strlen(text), &v, &n, &st), PD_OK);
  assert_int_equal(n, 2);
  assert_string_equal(v[0].name, "alice");
  assert_string_equal(v[1].name, "spiffe://x/bob");
  assert_int_equal(v[0].hash[0], 0xba);
  assert_int_equal(v[0].hash[31], 0xad);
  assert_int_equal(v[1].hash[0], 0xe3);
  free(v);
}

static void expect_parse_error(const char *text, size_t len, const char *want) {
  srv_token_ent *v = NULL;
  int n = 0;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_tokens_parse(text, len, &v, &n, &st),
                   PD_INVALID_ARGUMENT);
  if (!strstr(st.msg, want)) fail_msg("message '%s' lacks '%s'", st.msg, want);
  assert_null(v);
}

static void test_parse_errors(void **state) {
  (void)state;
  const char *t1 = "alice\n";
  expect_parse_error(t1, strlen(t1), "line 1: expected 'NAME sha256:HEX'");
  const char *t2 = "# c\nalice plaintext-token\n";
  expect_parse_error(t2, strlen(t2), "line 2: expected the hash as sha256:");
  const char *t3 = "alice sha256:abcd\n";
  expect_parse_error(t3, strlen(t3), "(11 bytes given)");
  const char *t4 =
      "a sha256:zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015a"
      "d\n";
  expect_parse_error(t4, strlen(t4), "not a hex digit");
  const char *t5 = "a " ABC_HASH "\na " EMPTY_HASH "\n";
  expect_parse_error(t5, strlen(t5), "line 2: the same name as an earlier");
  const char *t6 = "a " ABC_HASH "\nb " ABC_HASH "\n";
  expect_parse_error(t6, strlen(t6), "line 2: the same hash as an earlier");
  const char *t7 = "a " ABC_HASH " extra\n";
  expect_parse_error(t7, strlen(t7), "line 1: expected 'NAME sha256:HEX'");
  const char t8[] = "a \0 x\n";
  expect_parse_error(t8, sizeof(t8) - 1, "NUL byte");
}

static void write_file(const char *path, const char *text) {
  char tmp[600];
  snprintf(tmp, sizeof(tmp), "%s.new", path);
  FILE *f = fopen(tmp, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(rename(tmp, path), 0);
}

static pd_code check(srv_tokens *t, const char *tok, char *name) {
  dev_status st = DEV_STATUS_INIT;
  return srv_tokens_check(t, tok, strlen(tok), name, SRV_IDENTITY_NAME_MAX + 1,
                          &st);
}

static void test_check_and_reload(void **state) {
  (void)state;
  char dir[] = "/tmp/pd-tokens-XXXXXX", path[600];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/tokens", dir);
  dev_status st = DEV_STATUS_INIT;
  srv_tokens *t = NULL;
  assert_int_equal(srv_tokens_open(path, &t, &st), PD_NOT_FOUND);
  write_file(path, "alice " ABC_HASH "\n");
  assert_int_equal(srv_tokens_open(path, &t, &st), PD_OK);
  char name[SRV_IDENTITY_NAME_MAX + 1] = "";
  assert_int_equal(check(t, "abc", name), PD_OK);
  assert_string_equal(name, "alice");
  assert_int_equal(check(t, "abd", name), PD_UNAUTHENTICATED);
  assert_int_equal(check(t, "", name), PD_UNAUTHENTICATED);
  /* Revoke alice, add bob (the token ""). */
  write_file(path, "bob " EMPTY_HASH "\n");
  assert_int_equal(check(t, "abc", name), PD_UNAUTHENTICATED);
  assert_int_equal(check(t, "", name), PD_OK);
  assert_string_equal(name, "bob");
  /* A broken edit keeps bob. */
  write_file(path, "alice " ABC_HASH "\nbroken\n");
  assert_int_equal(check(t, "", name), PD_OK);
  assert_int_equal(check(t, "abc", name), PD_UNAUTHENTICATED);
  int entries = 0;
  uint64_t reloads = 0, refused = 0;
  srv_tokens_stats(t, &entries, &reloads, &refused);
  assert_int_equal(entries, 1);
  assert_int_equal(reloads, 1);
  assert_int_equal(refused, 1);
  /* Gone: every token refused; back: read again. */
  assert_int_equal(unlink(path), 0);
  assert_int_equal(check(t, "", name), PD_UNAUTHENTICATED);
  write_file(path, "alice " ABC_HASH "\n");
  assert_int_equal(check(t, "abc", name), PD_OK);
  srv_tokens_free(t);
  unlink(path);
  rmdir(dir);
}

static void test_file_rules(void **state) {
  (void)state;
  char dir[] = "/tmp/pd-tokens-XXXXXX", path[600], fifo[600], want[1400];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/tokens", dir);
  snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
  write_file(path, "alice " ABC_HASH "\n");
  dev_status st = DEV_STATUS_INIT;
  srv_tokens *t = NULL;
  /* Anyone may write it: anyone could mint alice (or an operator). */
  assert_int_equal(chmod(path, 0666), 0);
  assert_int_equal(srv_tokens_open(path, &t, &st), PD_FAILED_PRECONDITION);
  snprintf(want, sizeof(want),
           "the tokens file %s is owned by uid %u with mode 0666; expected a "
           "file of root or of uid %u (the daemon's user) that no one else "
           "may write (mode 0600 or 0640)",
           path, (unsigned)geteuid(), (unsigned)geteuid());
  assert_non_null(strstr(st.msg, want));
  assert_int_equal(chmod(path, 0620), 0); /* the group may write */
  assert_int_equal(srv_tokens_open(path, &t, &st), PD_FAILED_PRECONDITION);
  if (geteuid() == 0) { /* another owner: only root can make one */
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(chown(path, 12345, 0), 0);
    assert_int_equal(srv_tokens_open(path, &t, &st), PD_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "is owned by uid 12345 with mode 0600"));
    assert_int_equal(chown(path, 0, 0), 0);
  }
  /* Readable by the group is fine. */
  assert_int_equal(chmod(path, 0640), 0);
  assert_int_equal(srv_tokens_open(path, &t, &st), PD_OK);
  uint64_t g1 = srv_tokens_generation(t);
  assert_int_equal(g1, 1);
  char name[SRV_IDENTITY_NAME_MAX + 1] = "";
  assert_int_equal(check(t, "abc", name), PD_OK);
  assert_int_equal(srv_tokens_generation(t), g1); /* unchanged file */
  /* A reload that turns writable is refused: the table read before stays,
   * and its generation with it. */
  write_file(path, "bob " EMPTY_HASH "\n");
  assert_int_equal(chmod(path, 0646), 0);
  assert_int_equal(check(t, "", name), PD_UNAUTHENTICATED);
  assert_int_equal(check(t, "abc", name), PD_OK);
  assert_int_equal(srv_tokens_generation(t), g1);
  /* Fixed: read, and the generation moves once. */
  assert_int_equal(chmod(path, 0600), 0);
  assert_int_equal(check(t, "", name), PD_OK);
  assert_string_equal(name, "bob");
  assert_int_equal(srv_tokens_generation(t), g1 + 1);
  /* Gone: every token refused, another generation. */
  assert_int_equal(unlink(path), 0);
  assert_int_equal(check(t, "", name), PD_UNAUTHENTICATED);
  assert_int_equal(srv_tokens_generation(t), g1 + 2);
  srv_tokens_free(t);
  /* A FIFO, a directory, a device: refused at once (an open without
   * O_NONBLOCK would wait for a writer forever). */
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(srv_tokens_open(fifo, &t, &st), PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "is a FIFO; expected a regular file"));
  assert_int_equal(srv_tokens_open(dir, &t, &st), PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "is a directory; expected a regular file"));
  assert_int_equal(srv_tokens_open("/dev/null", &t, &st),
                   PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "is a device; expected a regular file"));
  /* The job tokens file: the same check. */
  srv_jobs *j = srv_jobs_new(4);
  assert_non_null(j);
  int loaded = -1, dropped = -1;
  assert_int_equal(srv_jobs_open_file(j, fifo, &loaded, &dropped, &st),
                   PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "the job tokens file"));
  assert_non_null(strstr(st.msg, "is a FIFO; expected a regular file"));
  srv_jobs_free(j);
  unlink(fifo);
  rmdir(dir);
}

static void test_idlist(void **state) {
  (void)state;
  char out[64], err[256];
  assert_true(srv_idlist_parse(" a , spiffe://x/b,,\tuid:1000 ", out,
                               sizeof(out), err, sizeof(err)));
  assert_string_equal(out, "a,spiffe://x/b,uid:1000");
  assert_true(srv_idlist_parse("", out, sizeof(out), err, sizeof(err)));
  assert_string_equal(out, "");
  assert_false(srv_idlist_parse("a\x01b", out, sizeof(out), err, sizeof(err)));
  assert_non_null(strstr(err, "control byte"));
  assert_false(srv_idlist_parse(
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa,bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
      out, sizeof(out), err, sizeof(err)));
  assert_non_null(strstr(err, "the list is over 63 bytes"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hash_vectors),
      cmocka_unit_test(test_parse_good),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_check_and_reload),
      cmocka_unit_test(test_file_rules),
      cmocka_unit_test(test_idlist),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
