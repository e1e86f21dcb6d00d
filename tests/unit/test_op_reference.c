/* The op reference kept beside each op's definition (device/ops/): every
 * registered op carries a one-line summary and declares the dtypes of its
 * arguments; defaults, allowed values and bounds agree with one another;
 * has_gradient is the VJP table's; and the values ListOps reports for a few
 * ops are the ones their files declare (read there by hand). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dev_backend.h"
#include "testutil.h"

static void test_every_op_has_a_summary(void **state) {
  (void)state;
  int n = dev_op_count();
  assert_true(n >= 50);
  for (int i = 0; i < n; i++) {
    const dev_op_def *d = dev_op_at(i);
    const char *s = dev_op_def_summary(d);
    if (!s[0]) fail_msg("op %s has no summary (dev_op_def.summary)", d->name);
    if (strchr(s, '\n'))
      fail_msg("op %s: the summary is one line; put more in notes", d->name);
  }
}

static void test_every_arg_declares_dtypes(void **state) {
  (void)state;
  for (int i = 0; i < dev_op_count(); i++) {
    const dev_op_def *d = dev_op_at(i);
    dev_op_arg_info a;
    for (int j = 0; dev_op_def_input(d, j, &a); j++)
      if (!a.dtypes)
        fail_msg("op %s: input %s declares no dtypes", d->name, a.name);
    for (int j = 0; dev_op_def_output(d, j, &a); j++)
      if (!a.dtypes)
        fail_msg("op %s: output %s declares no dtypes", d->name, a.name);
  }
}

/* A default is of the attribute's own type, inside its bounds, and among
 * its allowed values. */
static void test_defaults_agree(void **state) {
  (void)state;
  for (int i = 0; i < dev_op_count(); i++) {
    const dev_op_def *d = dev_op_at(i);
    dev_op_attr_info a;
    for (int j = 0; dev_op_def_attr(d, j, &a); j++) {
      if (!a.has_default) continue;
      if (a.default_value.type != a.type)
        fail_msg("op %s: attr %s: default of another type", d->name, a.name);
      if (a.type == DEV_ATTR_INT && a.has_min &&
          (double)a.default_value.u.i < a.min)
        fail_msg("op %s: attr %s: default under the minimum", d->name, a.name);
      if (a.allowed) {
        bool found = false;
        for (int k = 0; a.allowed[k]; k++)
          found |= strlen(a.allowed[k]) == a.default_value.u.s.len &&
                   memcmp(a.allowed[k], a.default_value.u.s.ptr,
                          a.default_value.u.s.len) == 0;
        if (!found)
          fail_msg("op %s: attr %s: default not allowed", d->name, a.name);
      }
    }
  }
}

static void test_values_of_some_ops(void **state) {
  (void)state;
  const dev_op_def *mm = dev_op_lookup("MatMul");
  assert_int_equal(dev_op_def_num_attrs(mm), 2);
  dev_op_attr_info a;
  assert_true(dev_op_def_attr(mm, 0, &a));
  assert_string_equal(a.name, "transpose_a");
  assert_int_equal(a.type, DEV_ATTR_BOOL);
  assert_true(a.has_default);
  assert_false(a.default_value.u.b);
  assert_true(dev_op_def_attr(mm, 1, &a));
  assert_string_equal(a.name, "transpose_b");
  assert_true(dev_op_def_has_gradient(mm));
  assert_false(dev_op_def_is_collective(mm));
  /* The element-wise gradient ops have VJPs (gradients of gradients in
   * functions); SliceGrad has none; collectives are flagged. */
  assert_true(dev_op_def_has_gradient(dev_op_lookup("ReluGrad")));
  assert_false(dev_op_def_has_gradient(dev_op_lookup("SliceGrad")));
  assert_true(dev_op_def_is_collective(dev_op_lookup("AllReduce")));
  assert_true(dev_op_def_has_gradient(dev_op_lookup("AllReduce")));
  /* Every op whose definition differs from tf.raw_ops in kind says so. */
  const char *differs[] = {"Sum",       "Mean", "Max",   "Min",    "Reshape",
                           "Transpose", "Fill", "Slice", "OneHot", "ArgMax"};
  for (size_t i = 0; i < sizeof differs / sizeof differs[0]; i++) {
    const char *notes = dev_op_def_notes(dev_op_lookup(differs[i]));
    if (!strstr(notes, "Differs from tf.raw_ops."))
      fail_msg("op %s: notes do not say how it differs from TF", differs[i]);
  }
  assert_string_equal(dev_attr_type_name(DEV_ATTR_INT_LIST), "list(int)");
}

/* The declared dtypes are the ones shape inference accepts: for every op
 * whose inputs all take one dtype (the first input's, the others "same
 * as" it) and that has no required attribute, each dtype is tried on inputs
 * of a shape the op takes; the op must prepare exactly when the dtype is in
 * the first input's mask, and the output's dtype must be in its mask. */
static void test_dtypes_are_what_infer_accepts(void **state) {
  (void)state;
  dev_engine *e = tu_engine(2, 0);
  int checked = 0;
  for (int i = 0; i < dev_op_count(); i++) {
    const dev_op_def *d = dev_op_at(i);
    if (d->num_inputs == 0 || d->inputs[0].is_list) continue;
    bool simple = true;
    for (int j = 1; j < d->num_inputs; j++)
      simple &= d->inputs[j].dtype_rule &&
                strncmp(d->inputs[j].dtype_rule, "same as ", 8) == 0;
    for (int j = 0; j < d->num_attrs; j++)
      simple &= d->attrs[j].default_value.type != DEV_ATTR_NONE;
    if (!simple) continue;
    int accepted = 0;
    for (int dt = 1; dt < PD_DTYPE_COUNT; dt++) {
      dev_tensor *in[DEV_MAX_ARGS];
      for (int j = 0; j < d->num_inputs; j++) {
        /* [2, 2] fits them all but a bias (BiasAdd's, _FusedMatMul's),
         * which is [2]. */
        int64_t dims[2] = {2, 2};
        double zeros[4] = {0, 0, 0, 0};
        int rank = strcmp(d->inputs[j].name, "bias") == 0 ? 1 : 2;
        in[j] = tu_mirrored(e, (pd_dtype)dt, rank, dims, zeros);
      }
      dev_op *op = NULL;
      dev_status st = DEV_STATUS_INIT;
      pd_code rc =
          dev_op_prepare(e, d->name, in, d->num_inputs, NULL, 0, &op, &st);
      bool want = (d->inputs[0].dtypes >> dt) & 1u;
      if ((rc == PD_OK) != want)
        fail_msg("op %s with %s inputs: %s, but its inputs declare %s", d->name,
                 pd_dtype_name((pd_dtype)dt), rc == PD_OK ? "prepared" : st.msg,
                 want ? "that dtype" : "no such dtype");
      if (rc == PD_OK) {
        accepted++;
        /* Flattened output o belongs to declared output arg `arg` (a list
         * output, such as ParallelUnpack's, holds several). */
        const int nout = dev_op_num_outputs(op);
        for (int o = 0, arg = 0, left = dev_op_output_length(d, 0, nout);
             o < nout; o++) {
          while (left == 0 && arg + 1 < d->num_outputs)
            left = dev_op_output_length(d, ++arg, nout);
          left--;
          pd_dtype odt = dev_tensor_dtype(dev_op_output(op, o));
          if (!((d->outputs[arg].dtypes >> odt) & 1u))
            fail_msg("op %s: output %s of dtype %s is outside its mask",
                     d->name, d->outputs[arg].name, pd_dtype_name(odt));
        }
        dev_op_abandon(op, PD_CANCELLED, "test");
      }
      for (int j = 0; j < d->num_inputs; j++) dev_tensor_release(in[j]);
    }
    assert_true(accepted > 0);
    checked++;
  }
  /* Elementwise, binary, reductions, linalg, softmax, collectives, ... */
  assert_true(checked >= 35);
  dev_engine_destroy(e);
}

/* List outputs: the reference shows is_list and the attribute that gives
 * the length (an int or an int list of the op); Split, SplitV and Unpack
 * have one, plain ops none. */
static void test_list_outputs(void **state) {
  (void)state;
  int lists = 0;
  for (int i = 0; i < dev_op_count(); i++) {
    const dev_op_def *d = dev_op_at(i);
    dev_op_arg_info a;
    for (int j = 0; dev_op_def_output(d, j, &a); j++) {
      if (!a.is_list) {
        assert_string_equal(a.length_attr, "");
        assert_int_equal(a.min_len, 1);
        continue;
      }
      lists++;
      int k = dev_op_attr_index(d, a.length_attr);
      if (k < 0)
        fail_msg("op %s: list output %s: no attribute '%s'", d->name, a.name,
                 a.length_attr);
      dev_op_attr_info t;
      assert_true(dev_op_def_attr(d, k, &t));
      assert_true(t.type == DEV_ATTR_INT || t.type == DEV_ATTR_INT_LIST);
    }
  }
  assert_true(lists >= 3);
  const char *names[3] = {"Split", "SplitV", "Unpack"};
  const char *len[3] = {"num_split", "size_splits", "num"};
  for (int i = 0; i < 3; i++) {
    dev_op_arg_info a;
    assert_true(dev_op_def_output(dev_op_lookup(names[i]), 0, &a));
    assert_true(a.is_list);
    assert_string_equal(a.name, "output");
    assert_string_equal(a.length_attr, len[i]);
    assert_int_equal(a.min_len, 1);
  }
}

int main(void) {
  dev_registry_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_op_has_a_summary),
      cmocka_unit_test(test_every_arg_declares_dtypes),
      cmocka_unit_test(test_defaults_agree),
      cmocka_unit_test(test_values_of_some_ops),
      cmocka_unit_test(test_dtypes_are_what_infer_accepts),
      cmocka_unit_test(test_list_outputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
