/* libparadev: the attribute builder (pd_attrs): each attribute kept with
 * the wire messages that encode it, so encoding an op only points at them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

/* One attribute with the wire messages that encode it, so encoding an op
 * only points at them (a set may be read by concurrent calls). */
typedef struct pdc_attr {
  Paradev__V1__Attr attr;
  Paradev__V1__AttrValue value;
  Paradev__V1__Shape shape;
  Paradev__V1__IntList ilist;
  Paradev__V1__FloatList flist;
  char *s;
  int64_t *ints;
  double *floats;
} pdc_attr;

struct pd_attrs {
  pdc_attr **e;
  Paradev__V1__Attr **ptrs; /* e[i]->attr, in order */
  int n, cap;
  pd_code err;
  char err_msg[256];
};

pd_attrs *pd_attrs_new(void) { return calloc(1, sizeof(pd_attrs)); }

static void pdc_attr_free(pdc_attr *a) {
  if (!a) return;
  free(a->attr.name);
  free(a->s);
  free(a->ints);
  free(a->floats);
  free(a);
}

void pd_attrs_clear(pd_attrs *a) {
  if (!a) return;
  for (int i = 0; i < a->n; i++) pdc_attr_free(a->e[i]);
  a->n = 0;
  a->err = PD_OK;
  a->err_msg[0] = '\0';
}

void pd_attrs_delete(pd_attrs *a) {
  if (!a) return;
  pd_attrs_clear(a);
  free(a->e);
  free(a->ptrs);
  free(a);
}

int pd_attrs_count(const pd_attrs *a) { return a ? a->n : 0; }

static void pdc_attrs_fail(pd_attrs *a, pd_code code, const char *name,
                           const char *why) {
  if (a->err != PD_OK) return; /* keep the first */
  a->err = code;
  pd_status tmp;
  if (name)
    pdc_error(&tmp, code, "attr \"%.64s\": %s", name, why);
  else
    pdc_error(&tmp, code, "%s", why);
  memcpy(a->err_msg, tmp.msg, sizeof(a->err_msg) - 1);
  a->err_msg[sizeof(a->err_msg) - 1] = '\0';
}

/* Returns the entry for `name`, emptied, or NULL after recording an error. */
static pdc_attr *pdc_attrs_slot(pd_attrs *a, const char *name) {
  if (!a) return NULL;
  if (!name) {
    pdc_attrs_fail(a, PD_INVALID_ARGUMENT, NULL,
                   "attribute name is NULL; expected the attribute's name, "
                   "such as \"transpose_a\"");
    return NULL;
  }
  if (!*name) {
    pdc_attrs_fail(a, PD_INVALID_ARGUMENT, name, "the name is empty");
    return NULL;
  }
  for (int i = 0; i < a->n; i++) {
    pdc_attr *e = a->e[i];
    if (strcmp(e->attr.name, name) == 0) {
      free(e->s);
      free(e->ints);
      free(e->floats);
      e->s = NULL;
      e->ints = NULL;
      e->floats = NULL;
      paradev__v1__attr_value__init(&e->value);
      return e;
    }
  }
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 8;
    pdc_attr **ne = realloc(a->e, (size_t)cap * sizeof(*ne));
    if (ne) a->e = ne;
    Paradev__V1__Attr **np =
        ne ? realloc(a->ptrs, (size_t)cap * sizeof(*np)) : NULL;
    if (np) a->ptrs = np;
    if (!ne || !np) {
      pdc_attrs_fail(a, PD_RESOURCE_EXHAUSTED, name, "out of host memory");
      return NULL;
    }
    a->cap = cap;
  }
  pdc_attr *e = calloc(1, sizeof(*e));
  char *nm = e ? strdup(name) : NULL;
  if (!nm) {
    free(e);
    pdc_attrs_fail(a, PD_RESOURCE_EXHAUSTED, name, "out of host memory");
    return NULL;
  }
  paradev__v1__attr__init(&e->attr);
  paradev__v1__attr_value__init(&e->value);
  e->attr.name = nm;
  e->attr.value = &e->value;
  a->e[a->n] = e;
  a->ptrs[a->n] = &e->attr;
  a->n++;
  return e;
}

void pd_attrs_set_int(pd_attrs *a, const char *name, int64_t v) {
  pdc_attr *e = pdc_attrs_slot(a, name);
  if (!e) return;
  e->value.value_case = PARADEV__V1__ATTR_VALUE__VALUE_I;
  e->value.i = v;
}

void pd_attrs_set_float(pd_attrs *a, const char *name, double v) {
  pdc_attr *e = pdc_attrs_slot(a, name);
  if (!e) return;
  e->value.value_case = PARADEV__V1__ATTR_VALUE__VALUE_F;
  e->value.f = v;
}

void pd_attrs_set_bool(pd_attrs *a, const char *name, bool v) {
  pdc_attr *e = pdc_attrs_slot(a, name);
  if (!e) return;
  e->value.value_case = PARADEV__V1__ATTR_VALUE__VALUE_B;
  e->value.b = v;
}

void pd_attrs_set_string(pd_attrs *a, const char *name, const char *v) {
  pdc_attr *e = pdc_attrs_slot(a, name);
  if (!e) return;
  e->s = strdup(v ? v : "");
  if (!e->s) {
    pdc_attrs_fail(a, PD_RESOURCE_EXHAUSTED, name, "out of host memory");
    return;
  }
  e->value.value_case = PARADEV__V1__ATTR_VALUE__VALUE_S;
  e->value.s = e->s;
}

void pd_attrs_set_dtype(pd_attrs *a, const char *name, pd_dtype v) {
  pdc_attr *e = pdc_attrs_slot(a, name);
  if (!e) return;
  e->value.value_case = PARADEV__V1__ATTR_VALUE__VALUE_DTYPE;
  e->value.dtype = (Paradev__V1__DType)v;
}

/* A heap copy of n values of `size` bytes for attr `name` (one slot when n
 * is 0, so the pointer is never NULL); NULL, with `a` failed, when out of
 * memory. */
static void *pdc_attrs_copy_values(pd_attrs *a, const char *name, const void *v,
                                   int n, size_t size) {
  void *p = malloc(size * (size_t)(n ? n : 1));
  if (!p) {
    pdc_attrs_fail(a, PD_RESOURCE_EXHAUSTED, name, "out of host memory");
    return NULL;
  }
  if (n) memcpy(p, v, size * (size_t)n);
  return p;
}

void pd_attrs_set_shape(pd_attrs *a, const char *name, const int64_t *dims,
                        int rank) {
  pdc_attr *e = pdc_attrs_slot(a, name);
  if (!e) return;
  if (rank < 0 || rank > PD_MAX_RANK || (rank > 0 && !dims)) {
    char why[160];
    snprintf(why, sizeof why,
             "rank %d%s; a shape needs rank 0 to %d and, for rank > 0, a "
             "dims array of that many sizes",
             rank, rank > 0 && !dims ? " without dims" : "", PD_MAX_RANK);
    pdc_attrs_fail(a, PD_INVALID_ARGUMENT, name, why);
    return;
  }
  if (!(e->ints = pdc_attrs_copy_values(a, name, dims, rank, sizeof(int64_t))))
    return;
  paradev__v1__shape__init(&e->shape);
  e->shape.n_dims = (size_t)rank;
  e->shape.dims = e->ints;
  e->value.value_case = PARADEV__V1__ATTR_VALUE__VALUE_SHAPE;
  e->value.shape = &e->shape;
}

void pd_attrs_set_int_list(pd_attrs *a, const char *name, const int64_t *v,
                           int n) {
  pdc_attr *e = pdc_attrs_slot(a, name);
  if (!e) return;
  if (n < 0 || (n > 0 && !v)) {
    pdc_attrs_fail(a, PD_INVALID_ARGUMENT, name, "a list needs n >= 0 values");
    return;
  }
  if (!(e->ints = pdc_attrs_copy_values(a, name, v, n, sizeof(int64_t))))
    return;
  paradev__v1__int_list__init(&e->ilist);
  e->ilist.n_values = (size_t)n;
  e->ilist.values = e->ints;
  e->value.value_case = PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST;
  e->value.int_list = &e->ilist;
}

void pd_attrs_set_float_list(pd_attrs *a, const char *name, const double *v,
                             int n) {
  pdc_attr *e = pdc_attrs_slot(a, name);
  if (!e) return;
  if (n < 0 || (n > 0 && !v)) {
    pdc_attrs_fail(a, PD_INVALID_ARGUMENT, name, "a list needs n >= 0 values");
    return;
  }
  if (!(e->floats = pdc_attrs_copy_values(a, name, v, n, sizeof(double))))
    return;
  paradev__v1__float_list__init(&e->flist);
  e->flist.n_values = (size_t)n;
  e->flist.values = e->floats;
  e->value.value_case = PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST;
  e->value.float_list = &e->flist;
}

bool pdc_attrs_copy(pd_attrs *dst, const pd_attrs *src) {
  for (int i = 0; i < src->n; i++) {
    const pdc_attr *e = src->e[i];
    const char *nm = e->attr.name;
    const Paradev__V1__AttrValue *v = &e->value;
    switch (v->value_case) {
      case PARADEV__V1__ATTR_VALUE__VALUE_I:
        pd_attrs_set_int(dst, nm, v->i);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_F:
        pd_attrs_set_float(dst, nm, v->f);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_B:
        pd_attrs_set_bool(dst, nm, v->b);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_S:
        pd_attrs_set_string(dst, nm, v->s);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_DTYPE:
        pd_attrs_set_dtype(dst, nm, (pd_dtype)v->dtype);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_SHAPE:
        pd_attrs_set_shape(dst, nm, v->shape->dims, (int)v->shape->n_dims);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_INT_LIST:
        pd_attrs_set_int_list(dst, nm, v->int_list->values,
                              (int)v->int_list->n_values);
        break;
      case PARADEV__V1__ATTR_VALUE__VALUE_FLOAT_LIST:
        pd_attrs_set_float_list(dst, nm, v->float_list->values,
                                (int)v->float_list->n_values);
        break;
      default: break;
    }
  }
  if (src->err != PD_OK && dst->err == PD_OK) {
    dst->err = src->err;
    memcpy(dst->err_msg, src->err_msg, sizeof(dst->err_msg));
  }
  return dst->err != PD_RESOURCE_EXHAUSTED;
}

pd_code pdc_attrs_encoded(const pd_attrs *a, Paradev__V1__Attr ***attrs,
                          size_t *n, const char **err_msg) {
  if (a->err != PD_OK) {
    *err_msg = a->err_msg;
    return a->err;
  }
  *attrs = a->ptrs;
  *n = (size_t)a->n;
  return PD_OK;
}
