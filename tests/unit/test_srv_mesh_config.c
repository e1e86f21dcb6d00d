/* [mesh]'s options (issue #16, server/config_mesh.c): the first host of a
 * Slurm node list, the port JAX's SlurmCluster derives from the job id, the
 * launcher's environment (Slurm, Kubernetes) filling what the flags and the
 * file left unset, the precedence flags > file > environment with each
 * value's source, and --check-config's refusals. Expected values are worked
 * out by hand in the comments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config_int.h"

static char reported[4096];
static char empty_conf[] = "/tmp/test_srv_mesh_empty_XXXXXX"; /* main makes it */
static int n_errors;

static void report(bool error, const char *msg) {
  if (error) n_errors++;
  size_t n = strlen(reported);
  snprintf(reported + n, sizeof reported - n, "%s\n", msg);
}

static void reset(void) {
  reported[0] = '\0';
  n_errors = 0;
}

/* A fake environment: NAME=VALUE pairs. */
static const char *const *fake_env;
static const char *fake_getenv(const char *name) {
  for (const char *const *p = fake_env; p && *p; p += 2)
    if (strcmp(p[0], name) == 0) return p[1];
  return NULL;
}

static void test_first_host(void **state) {
  (void)state;
  char h[64];
  assert_true(srv_slurm_first_host("node01", h, sizeof h));
  assert_string_equal(h, "node01");
  assert_true(srv_slurm_first_host("node01,node02", h, sizeof h));
  assert_string_equal(h, "node01");
  /* the low end of the first range, zero padding kept */
  assert_true(srv_slurm_first_host("node[01-04,07]", h, sizeof h));
  assert_string_equal(h, "node01");
  assert_true(srv_slurm_first_host("gpu[007,010-015],cpu3", h, sizeof h));
  assert_string_equal(h, "gpu007");
  assert_true(srv_slurm_first_host("n[3-4]-ib,x", h, sizeof h));
  assert_string_equal(h, "n3-ib");
  assert_true(srv_slurm_first_host("a[12]", h, sizeof h));
  assert_string_equal(h, "a12");
  assert_false(srv_slurm_first_host("", h, sizeof h));
  assert_false(srv_slurm_first_host("node[", h, sizeof h));
  assert_false(srv_slurm_first_host("node[x-2]", h, sizeof h));
  assert_false(srv_slurm_first_host("node[1-2", h, sizeof h));
  assert_false(srv_slurm_first_host("averyveryverylongname", h, 8));
}

static void test_port(void **state) {
  (void)state;
  /* id % 4096 + 61440: 12345 = 3 * 4096 + 57 */
  assert_int_equal(srv_slurm_port(12345), 61440 + 57);
  assert_int_equal(srv_slurm_port(0), 61440);
  assert_int_equal(srv_slurm_port(4095), 65535);
  assert_int_equal(srv_slurm_port(4096), 61440);
}

static srv_options fresh(void) {
  srv_options o;
  srv_defaults(&o);
  return o;
}

static void test_slurm_env(void **state) {
  (void)state;
  static const char *const env[] = {
      "SLURM_PROCID", "3", "SLURM_NTASKS", "4", "SLURM_JOB_ID", "12345",
      "SLURM_STEP_NODELIST", "node[01-04,07]", "SLURM_JOB_NODELIST",
      "other[1-9]", NULL};
  fake_env = env;
  reset();
  srv_options o = fresh();
  assert_int_equal(srv_mesh_options_from_env(&o, fake_getenv, report), 0);
  assert_int_equal(o.mesh_world_size, 4);
  assert_int_equal(o.mesh_rank, 3);
  assert_string_equal(o.mesh_coordinator, "node01:61497");
  assert_string_equal(o.mesh_src[0], "SLURM_NTASKS");
  assert_string_equal(o.mesh_src[1], "SLURM_PROCID");
  assert_string_equal(o.mesh_src[2], "SLURM_STEP_NODELIST and SLURM_JOB_ID");
  /* without a step's list, the job's */
  static const char *const env2[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "2",
                                     "SLURM_JOB_ID", "4097",
                                     "SLURM_JOB_NODELIST", "c[5-6]", NULL};
  fake_env = env2;
  o = fresh();
  assert_int_equal(srv_mesh_options_from_env(&o, fake_getenv, report), 0);
  assert_string_equal(o.mesh_coordinator, "c5:61441");
}

static void test_k8s_env(void **state) {
  (void)state;
  static const char *const env[] = {
      "JOB_COMPLETION_INDEX", "2", "PARADEV_MESH_WORLD_SIZE", "3",
      "PARADEV_MESH_COORDINATOR", "paradev-0.paradev:7479",
      /* Kubernetes' win over a Slurm environment around it */
      "SLURM_PROCID", "1", "SLURM_NTASKS", "8", NULL};
  fake_env = env;
  reset();
  srv_options o = fresh();
  assert_int_equal(srv_mesh_options_from_env(&o, fake_getenv, report), 0);
  assert_int_equal(o.mesh_world_size, 3);
  assert_int_equal(o.mesh_rank, 2);
  assert_string_equal(o.mesh_coordinator, "paradev-0.paradev:7479");
  assert_string_equal(o.mesh_src[1], "JOB_COMPLETION_INDEX");
  static const char *const bad[] = {"PARADEV_MESH_WORLD_SIZE", "2",
                                    "PARADEV_MESH_COORDINATOR", "host-only",
                                    NULL};
  fake_env = bad;
  reset();
  o = fresh();
  assert_int_equal(srv_mesh_options_from_env(&o, fake_getenv, report), 1);
  assert_non_null(strstr(reported, "PARADEV_MESH_COORDINATOR='host-only'"));
  static const char *const bad2[] = {"SLURM_NTASKS", "four", NULL};
  fake_env = bad2;
  reset();
  o = fresh();
  assert_int_equal(srv_mesh_options_from_env(&o, fake_getenv, report), 1);
  assert_non_null(strstr(reported, "SLURM_NTASKS='four'"));
}

static void test_defaults_and_precedence(void **state) {
  (void)state;
  fake_env = NULL;
  reset();
  srv_options o = fresh();
  assert_int_equal(srv_mesh_options_from_env(&o, fake_getenv, report), 0);
  assert_int_equal(o.mesh_world_size, 1); /* no mesh */
  assert_int_equal(o.mesh_rank, 0);
  assert_string_equal(o.mesh_src[0], "default");
  /* A lone daemon under srun takes no coordinator from Slurm. */
  static const char *const lone[] = {"SLURM_NTASKS", "1", "SLURM_JOB_ID", "7",
                                     "SLURM_JOB_NODELIST", "n1", NULL};
  fake_env = lone;
  o = fresh();
  assert_int_equal(srv_mesh_options_from_env(&o, fake_getenv, report), 0);
  assert_string_equal(o.mesh_coordinator, "");

  /* Through srv_config_load: the flags over the environment. */
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_JOB_ID", "12345", 1);
  setenv("SLURM_STEP_NODELIST", "node[01-04]", 1);
  char *argv[] = {"paradevd", "--config", empty_conf,
                  "--rank", "1", "--devices", "2", NULL};
  bool check = false;
  reset();
  assert_int_equal(srv_config_load(7, argv, &o, &check, report),
                   SRV_CONFIG_RUN);
  assert_int_equal(o.mesh_rank, 1);
  assert_string_equal(o.mesh_src[1], "--rank");
  assert_int_equal(o.mesh_world_size, 4);
  assert_string_equal(o.mesh_src[0], "SLURM_NTASKS");
  assert_string_equal(o.mesh_coordinator, "node01:61497");
  char about[1024];
  srv_config_describe_mesh(&o, about, sizeof about);
  assert_non_null(strstr(about, "rank 1 (--rank)"));

  /* The file over the environment, the flags over the file. */
  char path[] = "/tmp/test_mesh_config_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *text =
      "[mesh]\nworld_size = 3\nrank = 2\ncoordinator = head:7479\n"
      "lease_s = 6\non_coordinator_loss = exit\n";
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  char *argv2[] = {"paradevd", "--config", path, "--world-size", "5",
                   "--devices", "2", NULL};
  reset();
  assert_int_equal(srv_config_load(7, argv2, &o, &check, report),
                   SRV_CONFIG_RUN);
  assert_int_equal(o.mesh_world_size, 5);
  assert_string_equal(o.mesh_src[0], "--world-size");
  assert_int_equal(o.mesh_rank, 2);
  assert_string_equal(o.mesh_src[1], "[mesh] rank");
  assert_string_equal(o.mesh_coordinator, "head:7479");
  assert_string_equal(o.mesh_src[2], "[mesh] coordinator");
  assert_int_equal(o.mesh_lease_s, 6);
  assert_int_equal(o.mesh_on_loss, SRV_MESH_LOSS_EXIT);
  unlink(path);
  unsetenv("SLURM_PROCID");
  unsetenv("SLURM_NTASKS");
  unsetenv("SLURM_JOB_ID");
  unsetenv("SLURM_STEP_NODELIST");
}

static void expect_refused(char **argv, int argc, const char *needle) {
  srv_options o;
  bool check = false;
  reset();
  assert_int_equal(srv_config_load(argc, argv, &o, &check, report),
                   SRV_CONFIG_EXIT_BAD);
  if (!strstr(reported, needle))
    fail_msg("expected '%s' in: %s", needle, reported);
}

static void test_refusals(void **state) {
  (void)state;
  char *a1[] = {"paradevd", "--config", empty_conf, "--world-size",
                "2", "--rank", "2", "--coordinator", "h:7479", NULL};
  expect_refused(a1, 9, "rank 2 (--rank) is out of range for a mesh of 2");
  /* Both values came from flags: the (empty) file is not blamed (A3). */
  if (strstr(reported, empty_conf))
    fail_msg("the file is blamed for flags' values: %s", reported);
  char *a2[] = {"paradevd", "--config", empty_conf, "--world-size",
                "2", NULL};
  expect_refused(a2, 5, "needs a coordinator");
  char *a3[] = {"paradevd", "--config", empty_conf, "--world-size",
                "2", "--coordinator", "head", NULL};
  expect_refused(a3, 7, "--coordinator 'head'");
  char *a4[] = {"paradevd", "--config", empty_conf, "--world-size",
                "2", "--coordinator", "head:0", NULL};
  expect_refused(a4, 7, "expected HOST:PORT with a port from 1 to 65535");
  char *a5[] = {"paradevd", "--config", empty_conf, "--world-size",
                "40", "--devices", "2", "--coordinator", "h:1", NULL};
  expect_refused(a5, 9, "a mesh of 40 ranks with 2 devices each has 80");
  char *a6[] = {"paradevd", "--config", empty_conf, "--rank", "1",
                NULL};
  expect_refused(a6, 5, "without a mesh");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_host),
      cmocka_unit_test(test_port),
      cmocka_unit_test(test_slurm_env),
      cmocka_unit_test(test_k8s_env),
      cmocka_unit_test(test_defaults_and_precedence),
      cmocka_unit_test(test_refusals),
  };
  int fd = mkstemp(empty_conf);
  if (fd < 0) return 1;
  close(fd);
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(empty_conf);
  return rc;
}
