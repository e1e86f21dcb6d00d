/* Tenants' accounts in the scheduler (scheduler/tenants.c, issue #14): a
 * tenant's session count against its max_sessions, the bytes of all its
 * sessions against its memory quota (uploads into two sessions, released by
 * delete and by close), limits changed by sched_tenant_configure for the
 * next session, and sessions of no tenant untouched. Byte counts are worked
 * out by hand: a mirrored float32 tensor of n elements on 2 devices holds
 * 2 * 4 * n bytes. Every end of a session gives its tenant's slot back:
 * close, lease expiry, kill by number and kill by job (trial finding 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler.h"
#include "testutil.h"

static dev_engine *g_engine;

static sched *new_sched(void) {
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = 0x55;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  return s;
}

/* The token of each session opened, by its seq (for close_session). */
static uint8_t g_tokens[64][SCHED_TOKEN_BYTES];

static pd_code open_in(sched *s, const char *tenant, sched_session **out,
                       dev_status *st) {
  sched_session_params p = {"c", "j", 0, 0, tenant, 0, 0, 0, NULL, NULL};
  sched_session_info info;
  pd_code c = sched_session_create(s, &p, &info, st);
  if (c != PD_OK) return c;
  memcpy(g_tokens[info.seq % 64], info.token, SCHED_TOKEN_BYTES);
  return sched_session_open(s, info.token, SCHED_TOKEN_BYTES, out, st);
}

static pd_code upload(sched_session *ss, uint64_t id, int n, dev_status *st) {
  dev_shape shape = {1, {n}};
  dev_layout lay = {DEV_LAYOUT_MIRRORED, 0, 0};
  float *v = calloc((size_t)n, sizeof(float));
  sched_upload *u = NULL;
  pd_code c =
      sched_upload_begin(ss, id, PD_FLOAT32, &lay, &shape, NULL, &u, st);
  if (c == PD_OK) c = sched_upload_write(u, 0, 0, v, (size_t)n * 4, st);
  if (c == PD_OK) c = sched_upload_commit(u, st);
  free(v);
  return c;
}

static void close_session(sched *s, sched_session *ss) {
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_session_close(s, g_tokens[sched_session_seq(ss) % 64],
                                       SCHED_TOKEN_BYTES, NULL, &st),
                   PD_OK);
  sched_session_put(ss);
}

static void test_sessions_limit(void **state) {
  (void)state;
  sched *s = new_sched();
  sched_tenant_limits lim = {2, 0, NULL};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_tenant_configure(s, "alice", &lim, &st), PD_OK);
  sched_session *a1 = NULL, *a2 = NULL, *a3 = NULL, *b = NULL, *none = NULL;
  assert_int_equal(open_in(s, "alice", &a1, &st), PD_OK);
  assert_int_equal(open_in(s, "alice", &a2, &st), PD_OK);
  assert_int_equal(open_in(s, "alice", &a3, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg,
                         "tenant \"alice\" holds 2 sessions; its "
                         "limit max_sessions is 2"));
  /* Other tenants and sessions of none are not counted against alice. */
  assert_int_equal(open_in(s, "bob", &b, &st), PD_OK);
  assert_int_equal(open_in(s, NULL, &none, &st), PD_OK);
  assert_string_equal(sched_session_tenant(a1), "alice");
  assert_string_equal(sched_session_tenant(none), "");
  int n = 0;
  sched_tenant_usage(s, "alice", &n, NULL);
  assert_int_equal(n, 2);
  /* One ends: room for one more. */
  close_session(s, a1);
  sched_tenant_usage(s, "alice", &n, NULL);
  assert_int_equal(n, 1);
  assert_int_equal(open_in(s, "alice", &a3, &st), PD_OK);
  /* A higher limit applies to the next session. */
  lim.max_sessions = 3;
  assert_int_equal(sched_tenant_configure(s, "alice", &lim, &st), PD_OK);
  assert_int_equal(open_in(s, "alice", &a1, &st), PD_OK);
  sched_tenant_usage(s, "alice", &n, NULL);
  assert_int_equal(n, 3);
  sched_tenant_usage(s, "nobody", &n, NULL);
  assert_int_equal(n, 0);
  sched_session_put(a1);
  sched_session_put(a2);
  sched_session_put(a3);
  sched_session_put(b);
  sched_session_put(none);
  sched_destroy(s);
}

/* A session of `tenant` with job id `job` and a lease of lease_s seconds,
 * not opened (no reference held: only the table's). */
static pd_code create_in(sched *s, const char *tenant, const char *job,
                         uint32_t lease_s, uint64_t *seq, dev_status *st) {
  sched_session_params p = {"c", job, lease_s, 0, tenant, 0, 0, 0, NULL, NULL};
  sched_session_info info;
  pd_code c = sched_session_create(s, &p, &info, st);
  if (c == PD_OK && seq) *seq = info.seq;
  return c;
}

/* Waits (up to 60 s, polling every 10 ms) for `tenant` to hold `want`
 * sessions: the lease thread's pace is not what is tested. The slot comes
 * back at the end of sched_end_session, after the table's count dropped
 * and the session's bytes went back, so this waits for the whole end. */
static void wait_tenant_sessions(sched *s, const char *tenant, int want) {
  int n = -1;
  for (int i = 0; i < 6000; i++) {
    sched_tenant_usage(s, tenant, &n, NULL);
    if (n == want) break;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(n, want);
}

static void test_every_end_frees_the_slot(void **state) {
  (void)state;
  sched_config cfg = SCHED_CONFIG_INITIALIZER;
  cfg.incarnation = 0x56;
  cfg.lease_check_ms = 10;
  sched *s = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_create(g_engine, &cfg, &s, &st), PD_OK);
  sched_tenant_limits lim = {2, 0, NULL};
  assert_int_equal(sched_tenant_configure(s, "carol", &lim, &st), PD_OK);
  int n = -1;

  /* Lease expiry: a 3-second session holding 800 bytes and a 1-second
   * one, that no one renews. */
  sched_session_params p = {"c", "J1", 3, 0, "carol", 0, 0, 0, NULL, NULL};
  sched_session_info info;
  assert_int_equal(sched_session_create(s, &p, &info, &st), PD_OK);
  sched_session *held = NULL;
  assert_int_equal(
      sched_session_open(s, info.token, SCHED_TOKEN_BYTES, &held, &st), PD_OK);
  assert_int_equal(upload(held, 1, 100, &st), PD_OK); /* 800 bytes */
  sched_session_put(held);
  assert_int_equal(create_in(s, "carol", "J1", 1, NULL, &st), PD_OK);
  wait_tenant_sessions(s, "carol", 0); /* both expired */
  assert_int_equal(sched_num_sessions(s), 0);
  uint64_t bytes = 1;
  sched_tenant_usage(s, "carol", &n, &bytes);
  assert_int_equal(n, 0);
  assert_int_equal(bytes, 0);

  /* Kill by job (the Slurm epilog) and by number. */
  uint64_t seq = 0;
  assert_int_equal(create_in(s, "carol", "J2", 0, NULL, &st), PD_OK);
  assert_int_equal(create_in(s, "carol", "J3", 0, &seq, &st), PD_OK);
  assert_int_equal(create_in(s, "carol", "J2", 0, NULL, &st),
                   PD_RESOURCE_EXHAUSTED);
  sched_kill_target by_job = {NULL, 0, "J2", 0};
  sched_kill_result r = {0, 0, 0};
  assert_int_equal(sched_kill(s, &by_job, &r, &st), PD_OK);
  assert_int_equal(r.sessions, 1);
  sched_tenant_usage(s, "carol", &n, NULL);
  assert_int_equal(n, 1);
  sched_kill_target by_seq = {NULL, 0, NULL, seq};
  assert_int_equal(sched_kill(s, &by_seq, &r, &st), PD_OK);
  assert_int_equal(r.sessions, 1);
  sched_tenant_usage(s, "carol", &n, NULL);
  assert_int_equal(n, 0);
  /* The whole limit is free again. */
  assert_int_equal(create_in(s, "carol", "J4", 0, NULL, &st), PD_OK);
  assert_int_equal(create_in(s, "carol", "J4", 0, NULL, &st), PD_OK);
  sched_tenant_usage(s, "carol", &n, NULL);
  assert_int_equal(n, 2);
  sched_destroy(s);
}

static void test_memory_across_sessions(void **state) {
  (void)state;
  sched *s = new_sched();
  /* 10000 bytes for alice's sessions together. */
  sched_tenant_limits lim = {0, 10000, NULL};
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(sched_tenant_configure(s, "alice", &lim, &st), PD_OK);
  sched_session *a1 = NULL, *a2 = NULL, *b = NULL;
  assert_int_equal(open_in(s, "alice", &a1, &st), PD_OK);
  assert_int_equal(open_in(s, "alice", &a2, &st), PD_OK);
  assert_int_equal(open_in(s, "bob", &b, &st), PD_OK);
  /* 600 floats mirrored on 2 devices: 4800 bytes. */
  assert_int_equal(upload(a1, 1, 600, &st), PD_OK);
  assert_int_equal(upload(a2, 1, 600, &st), PD_OK); /* 9600 */
  uint64_t bytes = 0;
  sched_tenant_usage(s, "alice", NULL, &bytes);
  assert_int_equal(bytes, 9600);
  assert_int_equal(upload(a2, 2, 100, &st), PD_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.msg,
                         "tenant \"alice\" memory quota exceeded: "
                         "9600 bytes held by its sessions + 800 new "
                         "> memory_quota 10000 bytes"));
  /* 50 floats (400 bytes) still fit: 10000 exactly. */
  assert_int_equal(upload(a1, 2, 50, &st), PD_OK);
  sched_tenant_usage(s, "alice", NULL, &bytes);
  assert_int_equal(bytes, 10000);
  /* Bob is not alice. */
  assert_int_equal(upload(b, 1, 2000, &st), PD_OK);
  /* Deleting and closing give bytes back. */
  uint64_t id = 1;
  assert_int_equal(sched_handle_delete(a1, &id, 1, &st), PD_OK);
  sched_tenant_usage(s, "alice", NULL, &bytes);
  assert_int_equal(bytes, 5200);
  close_session(s, a2);
  sched_tenant_usage(s, "alice", NULL, &bytes);
  assert_int_equal(bytes, 400);
  assert_int_equal(upload(a1, 3, 1200, &st), PD_OK); /* 400 + 9600 */
  sched_session_put(a1);
  sched_session_put(b);
  sched_destroy(s);
}

int main(void) {
  g_engine = tu_engine(2, 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sessions_limit),
      cmocka_unit_test(test_memory_across_sessions),
      cmocka_unit_test(test_every_end_frees_the_slot),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  dev_engine_destroy(g_engine);
  return rc;
}
