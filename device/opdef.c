/* Queries on one op definition that need no registry: its name, whether it
 * is a collective, an attribute's index, and how many tensors a list
 * argument takes (TFE_OpGetInputLength). */
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
