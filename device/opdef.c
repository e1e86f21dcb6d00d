/* Queries on one op definition that need no registry: its name, whether it
 * is a collective, an attribute's index, how many tensors a list argument
 * takes or yields (TFE_OpGetInputLength, TFE_OpGetOutputLength), and the op reference's view of it (summary,
 * notes, arguments, attributes; has_gradient is vjp.c's). */
#include <stdio.h>
#include <string.h>

#include "device_int.h"

const char *dev_op_def_name(const dev_op_def *def) { return def->name; }

bool dev_op_def_is_collective(const dev_op_def *def) {
  return (def->flags & DEV_OP_COLLECTIVE) != 0;
}

int dev_op_attr_index(const dev_op_def *def, const char *name) {
  for (int i = 0; i < def->num_attrs; i++)
    if (strcmp(def->attrs[i].name, name) == 0) return i;
  return -1;
}

int dev_op_input_length(const dev_op_def *def, int arg, int num_inputs) {
  if (arg < 0 || arg >= def->num_inputs) return -1;
  int list_arg = -1;
  for (int i = 0; i < def->num_inputs; i++)
    if (def->inputs[i].is_list) list_arg = i;
  if (list_arg < 0) return num_inputs == def->num_inputs ? 1 : -1;
  int list_len = num_inputs - (def->num_inputs - 1);
  if (list_len < def->inputs[list_arg].min_len) return -1;
  return arg == list_arg ? list_len : 1;
}

int dev_op_output_length(const dev_op_def *def, int arg, int num_outputs) {
  if (arg < 0 || arg >= def->num_outputs) return -1;
  int list_arg = -1;
  for (int i = 0; i < def->num_outputs; i++)
    if (def->outputs[i].is_list) list_arg = i;
  if (list_arg < 0) return num_outputs == def->num_outputs ? 1 : -1;
  int list_len = num_outputs - (def->num_outputs - 1);
  if (list_len < def->outputs[list_arg].min_len || list_len < 0) return -1;
  return arg == list_arg ? list_len : 1;
}

const char *dev__output_name(const dev_op_def *def, int num_outputs, int o,
                             char *buf, size_t len) {
  for (int a = 0, first = 0; a < def->num_outputs; a++) {
    int n = dev_op_output_length(def, a, num_outputs);
    if (n < 0) break;
    if (o < first + n) {
      if (def->outputs[a].is_list)
        snprintf(buf, len, "'%s[%d]'", def->outputs[a].name, o - first);
      else
        snprintf(buf, len, "'%s'", def->outputs[a].name);
      return buf;
    }
    first += n;
  }
  snprintf(buf, len, "%d", o);
  return buf;
}

const char *dev_op_def_summary(const dev_op_def *def) {
  return def->summary ? def->summary : "";
}

const char *dev_op_def_notes(const dev_op_def *def) {
  return def->notes ? def->notes : "";
}

int dev_op_def_num_inputs(const dev_op_def *def) { return def->num_inputs; }
int dev_op_def_num_outputs(const dev_op_def *def) { return def->num_outputs; }
int dev_op_def_num_attrs(const dev_op_def *def) { return def->num_attrs; }

static void arg_info(const dev_arg_def *a, dev_op_arg_info *out) {
  out->name = a->name;
  out->is_list = a->is_list;
  out->min_len = a->is_list ? (a->min_len > 0 ? a->min_len : 0) : 1;
  out->dtypes = a->dtypes;
  out->dtype_rule = a->dtype_rule ? a->dtype_rule : "";
  out->doc = a->doc ? a->doc : "";
  out->length_attr = a->length_attr ? a->length_attr : "";
}

bool dev_op_def_input(const dev_op_def *def, int i, dev_op_arg_info *out) {
  if (i < 0 || i >= def->num_inputs) return false;
  arg_info(&def->inputs[i], out);
  return true;
}

bool dev_op_def_output(const dev_op_def *def, int i, dev_op_arg_info *out) {
  if (i < 0 || i >= def->num_outputs) return false;
  arg_info(&def->outputs[i], out);
  return true;
}

bool dev_op_def_attr(const dev_op_def *def, int i, dev_op_attr_info *out) {
  if (i < 0 || i >= def->num_attrs) return false;
  const dev_attr_def *a = &def->attrs[i];
  out->name = a->name;
  out->type = a->type;
  out->has_default = a->default_value.type != DEV_ATTR_NONE;
  out->default_value = a->default_value;
  out->has_min = a->has_min;
  out->has_max = a->has_max;
  out->min = a->min;
  out->max = a->max;
  out->allowed = a->allowed;
  out->doc = a->doc ? a->doc : "";
  return true;
}

const char *dev_attr_type_name(dev_attr_type t) {
  switch (t) {
    case DEV_ATTR_INT: return "int";
    case DEV_ATTR_FLOAT: return "float";
    case DEV_ATTR_BOOL: return "bool";
    case DEV_ATTR_STRING: return "string";
    case DEV_ATTR_DTYPE: return "dtype";
    case DEV_ATTR_SHAPE: return "shape";
    case DEV_ATTR_INT_LIST: return "list(int)";
    case DEV_ATTR_FLOAT_LIST: return "list(float)";
    case DEV_ATTR_NONE: break;
  }
  return "invalid";
}
