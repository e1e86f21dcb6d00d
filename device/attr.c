/* Attribute constructors and reduction names. */
#include <string.h>

#include "dev_backend.h"
#include "device.h"

dev_attr dev_attr_int(const char *name, int64_t v) {
  dev_attr a = {name, {DEV_ATTR_INT, {.i = v}}};
  return a;
}
dev_attr dev_attr_float(const char *name, double v) {
  dev_attr a = {name, {DEV_ATTR_FLOAT, {.f = v}}};
  return a;
}
dev_attr dev_attr_bool(const char *name, bool v) {
  dev_attr a = {name, {DEV_ATTR_BOOL, {.b = v}}};
  return a;
}
dev_attr dev_attr_string(const char *name, const char *s) {
  dev_attr a = {name, {DEV_ATTR_STRING, {.s = {s, s ? strlen(s) : 0}}}};
  return a;
}
dev_attr dev_attr_dtype(const char *name, pd_dtype v) {
  dev_attr a = {name, {DEV_ATTR_DTYPE, {.dtype = v}}};
  return a;
}
dev_attr dev_attr_shape(const char *name, int rank, const int64_t *dims) {
  dev_attr a;
  memset(&a, 0, sizeof a);
  a.name = name;
  a.value.type = DEV_ATTR_SHAPE;
  a.value.u.shape.rank = rank;
  for (int i = 0; i < rank && i < PD_MAX_RANK; i++)
    a.value.u.shape.dims[i] = dims[i];
  return a;
}
dev_attr dev_attr_int_list(const char *name, const int64_t *v, int n) {
  dev_attr a = {name, {DEV_ATTR_INT_LIST, {.ilist = {v, n}}}};
  return a;
}
dev_attr dev_attr_float_list(const char *name, const double *v, int n) {
  dev_attr a = {name, {DEV_ATTR_FLOAT_LIST, {.flist = {v, n}}}};
  return a;
}

int dev_reduction_from_name(const char *s, size_t len) {
  static const char *const names[] = {"sum", "prod", "max", "min", "mean"};
  for (int i = 0; i < 5; i++)
    if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0) return i;
  return -1;
}
