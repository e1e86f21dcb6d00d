/* Job tokens (server/jobs.c): a minted token proves its job and uid until
 * it expires or is revoked; a job has one token (a new one replaces it);
 * the table is bounded; bad job ids, uids, lifetimes and tokens are refused
 * with the codes jobs.h names. Time is a fake clock, so expiry is exact. */
#include <openssl/evp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "jobs.h"

static int64_t fake_now = 1000000;
static int64_t fake_clock(void) { return fake_now; }

static srv_jobs *new_jobs(int cap) {
  srv_jobs *j = srv_jobs_new(cap);
  assert_non_null(j);
  srv_jobs_set_clock(j, fake_clock);
  return j;
}

static void mint_ok(srv_jobs *j, const char *job, int64_t uid, uint32_t life,
                    char tok[SRV_JOB_TOKEN_CHARS + 1], bool want_replaced) {
  dev_status st = DEV_STATUS_INIT;
  bool replaced = !want_replaced;
  assert_int_equal(srv_jobs_mint(j, job, uid, NULL, life, tok, &replaced, &st),
                   PD_OK);
  assert_int_equal(replaced, want_replaced);
}

static void test_mint_and_check(void **state) {
  (void)state;
  srv_jobs *j = new_jobs(8);
  char tok[SRV_JOB_TOKEN_CHARS + 1], tok2[SRV_JOB_TOKEN_CHARS + 1];
  mint_ok(j, "1234", 1000, 3600, tok, false);
  /* "pdjob1_" and 64 lower-case hex digits. */
  assert_int_equal(strlen(tok), 7 + 64);
  assert_memory_equal(tok, "pdjob1_", 7);
  assert_int_equal(strspn(tok + 7, "0123456789abcdef"), 64);
  mint_ok(j, "1235", -1, 60, tok2, false);
  assert_string_not_equal(tok, tok2);
  srv_job_proof p;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_jobs_check(j, tok, strlen(tok), &p, &st), PD_OK);
  assert_string_equal(p.job, "1234");
  assert_int_equal(p.uid, 1000);
  assert_int_equal(p.left_s, 3600);
  assert_int_equal(srv_jobs_check(j, tok2, strlen(tok2), &p, &st), PD_OK);
  assert_string_equal(p.job, "1235");
  assert_int_equal(p.uid, -1);
  assert_int_equal(srv_jobs_count(j), 2);
  /* One hex digit off, the wrong length, another prefix: refused. */
  char bad[SRV_JOB_TOKEN_CHARS + 1];
  memcpy(bad, tok, sizeof bad);
  bad[20] = bad[20] == '0' ? '1' : '0';
  assert_int_equal(srv_jobs_check(j, bad, strlen(bad), &p, &st),
                   PD_UNAUTHENTICATED);
  assert_non_null(strstr(st.msg, "unknown"));
  assert_null(strstr(st.msg, bad + 7)); /* never echoes a token */
  assert_int_equal(srv_jobs_check(j, tok, strlen(tok) - 1, &p, &st),
                   PD_UNAUTHENTICATED);
  assert_non_null(strstr(st.msg, "not a job token"));
  memcpy(bad, tok, sizeof bad);
  bad[0] = 'x';
  assert_int_equal(srv_jobs_check(j, bad, strlen(bad), &p, &st),
                   PD_UNAUTHENTICATED);
  assert_int_equal(srv_jobs_check(j, "", 0, &p, &st), PD_UNAUTHENTICATED);
  srv_jobs_free(j);
}

static void test_replace_and_revoke(void **state) {
  (void)state;
  srv_jobs *j = new_jobs(8);
  char old[SRV_JOB_TOKEN_CHARS + 1], cur[SRV_JOB_TOKEN_CHARS + 1];
  srv_job_proof p;
  dev_status st = DEV_STATUS_INIT;
  mint_ok(j, "77", 5, 3600, old, false);
  mint_ok(j, "77", 5, 3600, cur, true); /* a requeued job: a new token */
  assert_int_equal(srv_jobs_count(j), 1);
  assert_int_equal(srv_jobs_check(j, old, strlen(old), &p, &st),
                   PD_UNAUTHENTICATED);
  assert_int_equal(srv_jobs_check(j, cur, strlen(cur), &p, &st), PD_OK);
  assert_false(srv_jobs_revoke(j, "78", &st)); /* another job: nothing */
  assert_int_equal(srv_jobs_check(j, cur, strlen(cur), &p, &st), PD_OK);
  assert_true(srv_jobs_revoke(j, "77", &st));
  assert_false(srv_jobs_revoke(j, "77", &st)); /* twice: nothing left */
  assert_int_equal(srv_jobs_check(j, cur, strlen(cur), &p, &st),
                   PD_UNAUTHENTICATED);
  assert_non_null(strstr(st.msg, "revoked"));
  assert_int_equal(srv_jobs_count(j), 0);
  srv_jobs_free(j);
}

static void test_expiry(void **state) {
  (void)state;
  srv_jobs *j = new_jobs(2);
  char tok[SRV_JOB_TOKEN_CHARS + 1], t2[SRV_JOB_TOKEN_CHARS + 1];
  srv_job_proof p;
  dev_status st = DEV_STATUS_INIT;
  mint_ok(j, "9", -1, 10, tok, false);
  fake_now += 9999; /* 1 ms before the end */
  assert_int_equal(srv_jobs_check(j, tok, strlen(tok), &p, &st), PD_OK);
  assert_int_equal(p.left_s, 0);
  fake_now += 1; /* exactly 10 s: expired */
  assert_int_equal(srv_jobs_check(j, tok, strlen(tok), &p, &st),
                   PD_UNAUTHENTICATED);
  assert_non_null(strstr(st.msg, "expired"));
  assert_non_null(strstr(st.msg, "\"9\""));
  /* The expired entry is gone: unknown now, and its slot is free. */
  assert_int_equal(srv_jobs_check(j, tok, strlen(tok), &p, &st),
                   PD_UNAUTHENTICATED);
  assert_non_null(strstr(st.msg, "unknown"));
  assert_int_equal(srv_jobs_count(j), 0);
  assert_false(srv_jobs_revoke(j, "9", &st));
  /* A full table of expired tokens makes room for new ones. */
  mint_ok(j, "a", -1, 1, tok, false);
  mint_ok(j, "b", -1, 1, t2, false);
  fake_now += 1000;
  mint_ok(j, "c", -1, 1, tok, false);
  mint_ok(j, "d", -1, 1, t2, false);
  srv_jobs_free(j);
}

static void test_bounds(void **state) {
  (void)state;
  srv_jobs *j = new_jobs(2);
  char tok[SRV_JOB_TOKEN_CHARS + 1];
  dev_status st = DEV_STATUS_INIT;
  bool r;
  mint_ok(j, "1", -1, 60, tok, false);
  mint_ok(j, "2", -1, 60, tok, false);
  assert_int_equal(srv_jobs_mint(j, "3", -1, NULL, 60, tok, &r, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "2 job tokens are live"));
  assert_non_null(strstr(st.msg, "max_job_tokens"));
  mint_ok(j, "2", -1, 60, tok, true); /* replacing needs no new slot */
  assert_true(srv_jobs_revoke(j, "1", &st));
  mint_ok(j, "3", -1, 60, tok, false);
  /* Bad input, each named. */
  const char *bad_ids[] = {"",
                           "a b",
                           "tab\t",
                           "\x7f",
                           "é",
                           "01234567890123456789012345678901234567890123456789"
                           "012345678901234"}; /* 65 bytes */
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    assert_int_equal(srv_jobs_mint(j, bad_ids[i], -1, NULL, 60, tok, &r, &st),
                     PD_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "job_id"));
  }
  assert_int_equal(
      srv_jobs_check_id("0123456789012345678901234567890123456789012345678901"
                        "234567890123",
                        &st),
      PD_OK); /* 64 bytes */
  assert_int_equal(srv_jobs_mint(j, "x", -2, NULL, 60, tok, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "uid -2"));
  assert_int_equal(
      srv_jobs_mint(j, "x", (int64_t)UINT32_MAX, NULL, 60, tok, &r, &st),
      PD_INVALID_ARGUMENT);
  assert_int_equal(srv_jobs_mint(j, "x", -1, NULL, 0, tok, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(
      srv_jobs_mint(j, "x", -1, NULL, SRV_JOB_LIFETIME_MAX + 1, tok, &r, &st),
      PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "30 days"));
  assert_null(srv_jobs_new(0));
  srv_jobs_free(NULL);
  srv_jobs_free(j);
}

/* The token's text counts, not where it lives: a copy is accepted, a copy
 * with its last bit flipped is not. */
static void test_text_counts(void **state) {
  (void)state;
  srv_jobs *j = new_jobs(4);
  char tok[SRV_JOB_TOKEN_CHARS + 1];
  mint_ok(j, "h", -1, 60, tok, false);
  /* The same text, copied: accepted (the hash, not the pointer, counts). */
  char copy[SRV_JOB_TOKEN_CHARS + 1];
  memcpy(copy, tok, sizeof copy);
  srv_job_proof p;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_jobs_check(j, copy, strlen(copy), &p, &st), PD_OK);
  copy[SRV_JOB_TOKEN_CHARS - 1] ^= 1;
  assert_int_equal(srv_jobs_check(j, copy, strlen(copy), &p, &st),
                   PD_UNAUTHENTICATED);
  srv_jobs_free(j);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* The file: what a restart reads back. It holds each live token's SHA-256
 * (checked against EVP's, computed here) and never a token; a revoked
 * token stays revoked across the restart; a file others may write, or one
 * with a line that is not paradevd's, is refused; a file that cannot be
 * written makes no token. */
static void test_file(void **state) {
  (void)state;
  char dir[] = "/tmp/test_jobs_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256], tmp[300];
  snprintf(path, sizeof path, "%s/job-tokens", dir);
  srv_jobs *j = new_jobs(8);
  int loaded = -1, dropped = -1;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_jobs_open_file(j, path, &loaded, &dropped, &st), PD_OK);
  assert_int_equal(loaded, 0); /* no file yet */
  char a[SRV_JOB_TOKEN_CHARS + 1], b[SRV_JOB_TOKEN_CHARS + 1];
  mint_ok(j, "500", 1234, 3600, a, false);
  mint_ok(j, "501", -1, 3600, b, false);
  assert_false(srv_jobs_revoke(j, "nothing", &st));
  assert_true(srv_jobs_revoke(j, "501", &st));
  assert_int_equal(st.code, PD_OK);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
  const char *text = slurp(path);
  assert_null(strstr(text, a + 7)); /* no token, only hashes */
  assert_null(strstr(text, b + 7));
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  assert_int_equal(EVP_Digest(a, strlen(a), md, &n, EVP_sha256(), NULL), 1);
  char hex[65];
  for (unsigned i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
  char want[100];
  snprintf(want, sizeof want, "v1 %s ", hex);
  assert_non_null(strstr(text, want));
  assert_non_null(strstr(text, " 1234 500\n"));
  assert_null(strstr(text, " 501\n")); /* revoked: gone from the file */
  srv_jobs_free(j);

  /* The restart. */
  j = new_jobs(8);
  assert_int_equal(srv_jobs_open_file(j, path, &loaded, &dropped, &st), PD_OK);
  assert_int_equal(loaded, 1);
  assert_int_equal(dropped, 0);
  srv_job_proof p;
  assert_int_equal(srv_jobs_check(j, a, strlen(a), &p, &st), PD_OK);
  assert_string_equal(p.job, "500");
  assert_int_equal(p.uid, 1234);
  assert_true(p.left_s >= 3598 && p.left_s <= 3600);
  assert_int_equal(srv_jobs_check(j, b, strlen(b), &p, &st),
                   PD_UNAUTHENTICATED);
  mint_ok(j, "502", -1, 60, b, false);
  srv_jobs_free(j);
  /* A smaller table keeps what fits and counts the rest. */
  j = new_jobs(1);
  assert_int_equal(srv_jobs_open_file(j, path, &loaded, &dropped, &st), PD_OK);
  assert_int_equal(loaded, 1);
  assert_int_equal(dropped, 1);
  srv_jobs_free(j);

  /* Others may write it: refused. */
  assert_int_equal(chmod(path, 0620), 0);
  j = new_jobs(8);
  assert_int_equal(srv_jobs_open_file(j, path, &loaded, &dropped, &st),
                   PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "mode 0620"));
  srv_jobs_free(j);
  assert_int_equal(chmod(path, 0600), 0);
  /* Not paradevd's lines. */
  FILE *f = fopen(path, "a");
  fputs("v1 nothex 1 2 x\n", f);
  fclose(f);
  j = new_jobs(8);
  assert_int_equal(srv_jobs_open_file(j, path, &loaded, &dropped, &st),
                   PD_FAILED_PRECONDITION);
  assert_non_null(strstr(st.msg, "job-tokens:4:"));
  assert_int_equal(srv_jobs_count(j), 0);
  srv_jobs_free(j);
  /* A file that cannot be written: no token. */
  snprintf(tmp, sizeof tmp, "%s/no-such-dir/job-tokens", dir);
  j = new_jobs(8);
  assert_int_equal(srv_jobs_open_file(j, tmp, &loaded, &dropped, &st), PD_OK);
  bool r;
  assert_int_equal(srv_jobs_mint(j, "503", -1, NULL, 60, a, &r, &st),
                   PD_UNAVAILABLE);
  assert_non_null(strstr(st.msg, "cannot write the job tokens file"));
  assert_int_equal(srv_jobs_count(j), 0);
  srv_jobs_free(j);
  unlink(path);
  rmdir(dir);
}

/* Issue #17: a token bound to devices proves them too, and the binding
 * survives the file (a "v2 ... 1,3 JOB" line; unbound ones stay v1); a v2
 * line whose devices are not distinct indices is refused. */
static void test_devices(void **state) {
  (void)state;
  char dir[] = "/tmp/test_jobs_dev_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/job-tokens", dir);
  srv_jobs *j = new_jobs(8);
  int loaded = -1, dropped = -1;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(srv_jobs_open_file(j, path, &loaded, &dropped, &st), PD_OK);
  char a[SRV_JOB_TOKEN_CHARS + 1], b[SRV_JOB_TOKEN_CHARS + 1];
  dev_devset set = {2, {3, 1}};
  bool r = true;
  assert_int_equal(srv_jobs_mint(j, "600", 77, &set, 3600, a, &r, &st), PD_OK);
  assert_false(r);
  dev_devset none = {0, {0}};
  assert_int_equal(srv_jobs_mint(j, "601", -1, &none, 3600, b, &r, &st), PD_OK);
  srv_job_proof p;
  assert_int_equal(srv_jobs_check(j, a, strlen(a), &p, &st), PD_OK);
  assert_int_equal(p.devices.n, 2);
  assert_int_equal(p.devices.dev[0], 3);
  assert_int_equal(p.devices.dev[1], 1);
  assert_int_equal(srv_jobs_check(j, b, strlen(b), &p, &st), PD_OK);
  assert_int_equal(p.devices.n, 0);
  const char *text = slurp(path);
  assert_non_null(strstr(text, " 77 3,1 600\n"));
  assert_non_null(strstr(text, " -1 601\n"));
  assert_non_null(strstr(text, "\nv2 ")); /* the bound one */
  assert_non_null(strstr(text, "\nv1 ")); /* the unbound one: as before */
  srv_jobs_free(j);
  j = new_jobs(8);
  assert_int_equal(srv_jobs_open_file(j, path, &loaded, &dropped, &st), PD_OK);
  assert_int_equal(loaded, 2);
  assert_int_equal(srv_jobs_check(j, a, strlen(a), &p, &st), PD_OK);
  assert_string_equal(p.job, "600");
  assert_int_equal(p.uid, 77);
  assert_int_equal(p.devices.n, 2);
  assert_int_equal(p.devices.dev[0], 3);
  assert_int_equal(p.devices.dev[1], 1);
  /* Revoked: the binding goes with the token. */
  assert_true(srv_jobs_revoke(j, "600", &st));
  assert_int_equal(srv_jobs_check(j, a, strlen(a), &p, &st),
                   PD_UNAUTHENTICATED);
  srv_jobs_free(j);
  static const char *const bad[] = {"1,1", "1,", "64", ",2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    FILE *f = fopen(path, "w");
    fprintf(f, "v2 %064d 99999999999999 -1 %s 602\n", 0, bad[i]);
    fclose(f);
    j = new_jobs(8);
    assert_int_equal(srv_jobs_open_file(j, path, &loaded, &dropped, &st),
                     PD_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "job-tokens:1:"));
    srv_jobs_free(j);
  }
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_devices),
      cmocka_unit_test(test_mint_and_check),
      cmocka_unit_test(test_replace_and_revoke),
      cmocka_unit_test(test_expiry),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_text_counts),
      cmocka_unit_test(test_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
