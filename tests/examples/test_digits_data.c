/* The digits loader: the shipped file's row count, label counts and first
 * row (read from the file by hand), split sizes, and errors naming the line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "digits_data.h"

#ifndef DIGITS_PATH
#error "DIGITS_PATH must point at examples/data/digits.csv.gz"
#endif

static void test_load_shipped_file(void **state) {
  digits_set s;
  char err[256];
  if (digits_load(DIGITS_PATH, &s, err, sizeof err) != 0) fail_msg("%s", err);
  assert_int_equal(s.n, 1797);
  /* first row: 0,0,5,13,9,1,0,0,... label 0 */
  assert_true(s.x[2] == 5.0f / 16.0f && s.x[3] == 13.0f / 16.0f);
  assert_int_equal(s.y[0], 0);
  int counts[10] = {0};
  for (int i = 0; i < s.n; i++) {
    assert_true(s.y[i] >= 0 && s.y[i] <= 9);
    counts[s.y[i]]++;
  }
  /* scikit-learn's digits: 178 182 177 183 181 182 181 179 174 180 */
  const int want[10] = {178, 182, 177, 183, 181, 182, 181, 179, 174, 180};
  for (int k = 0; k < 10; k++) assert_int_equal(counts[k], want[k]);
  digits_set tr, te;
  assert_int_equal(digits_split(&s, 0.2, 42, &tr, &te), 0);
  assert_int_equal(te.n, 359); /* round(0.2 * 1797) */
  assert_int_equal(tr.n, 1438);
  /* the split is a permutation: label counts add up */
  int c2[10] = {0};
  for (int i = 0; i < tr.n; i++) c2[tr.y[i]]++;
  for (int i = 0; i < te.n; i++) c2[te.y[i]]++;
  for (int k = 0; k < 10; k++) assert_int_equal(c2[k], want[k]);
  digits_set tr2, te2;
  assert_int_equal(digits_split(&s, 0.2, 42, &tr2, &te2), 0);
  assert_memory_equal(te.y, te2.y, sizeof(int32_t) * (size_t)te.n);
  digits_free(&tr2);
  digits_free(&te2);
  digits_free(&tr);
  digits_free(&te);
  digits_free(&s);
}

static void expect_error(const char *content, const char *needle) {
  char path[] = "/tmp/paradev-digits-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, content, strlen(content)),
                   (ssize_t)strlen(content));
  close(fd);
  digits_set s;
  char err[256] = "";
  assert_int_equal(digits_load(path, &s, err, sizeof err), -1);
  unlink(path);
  if (!strstr(err, needle)) fail_msg("error \"%s\" lacks \"%s\"", err, needle);
}

static void test_errors(void **state) {
  char row[400] = "";
  for (int i = 0; i < 64; i++) strcat(row, "1,");
  char good_then_bad[900];
  snprintf(good_then_bad, sizeof good_then_bad, "%s3\n%s17\n", row, row);
  expect_error(good_then_bad, ":2: field 65: expected an integer 0..9");
  expect_error("1,2,3\n", ":1: expected 65 comma-separated fields");
  expect_error("", "no rows");
  digits_set s;
  char err[256];
  assert_int_equal(
      digits_load("/nonexistent/digits.csv.gz", &s, err, sizeof err), -1);
  assert_non_null(strstr(err, "cannot open"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_shipped_file),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests_name("digits_data", tests, NULL, NULL);
}
