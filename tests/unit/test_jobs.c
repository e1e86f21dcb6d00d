/* Job tokens (server/jobs.c): a minted token proves its job and uid until
 * it expires or is revoked; a job has one token (a new one replaces it);
 * the table is bounded; bad job ids, uids, lifetimes and tokens are refused
 * with the codes jobs.h names. Time is a fake clock, so expiry is exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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
  assert_int_equal(srv_jobs_mint(j, job, uid, life, tok, &replaced, &st),
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
  assert_false(srv_jobs_revoke(j, "78")); /* another job: nothing */
  assert_int_equal(srv_jobs_check(j, cur, strlen(cur), &p, &st), PD_OK);
  assert_true(srv_jobs_revoke(j, "77"));
  assert_false(srv_jobs_revoke(j, "77")); /* twice: nothing left */
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
  assert_false(srv_jobs_revoke(j, "9"));
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
  assert_int_equal(srv_jobs_mint(j, "3", -1, 60, tok, &r, &st),
                   PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg, "2 job tokens are live"));
  assert_non_null(strstr(st.msg, "max_job_tokens"));
  mint_ok(j, "2", -1, 60, tok, true); /* replacing needs no new slot */
  assert_true(srv_jobs_revoke(j, "1"));
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
    assert_int_equal(srv_jobs_mint(j, bad_ids[i], -1, 60, tok, &r, &st),
                     PD_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "job_id"));
  }
  assert_int_equal(
      srv_jobs_check_id("0123456789012345678901234567890123456789012345678901"
                        "234567890123",
                        &st),
      PD_OK); /* 64 bytes */
  assert_int_equal(srv_jobs_mint(j, "x", -2, 60, tok, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "uid -2"));
  assert_int_equal(srv_jobs_mint(j, "x", (int64_t)UINT32_MAX, 60, tok, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(srv_jobs_mint(j, "x", -1, 0, tok, &r, &st),
                   PD_INVALID_ARGUMENT);
  assert_int_equal(
      srv_jobs_mint(j, "x", -1, SRV_JOB_LIFETIME_MAX + 1, tok, &r, &st),
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mint_and_check),
      cmocka_unit_test(test_replace_and_revoke),
      cmocka_unit_test(test_expiry),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_text_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
