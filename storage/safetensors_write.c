/* The safetensors writer, after the reference's serialize
 * (safetensors/src/tensor.rs, prepare + serialize_to_file): tensors sorted
 * by dtype (the Dtype enum's order, largest first) then by name, data
 * offsets packed in that order, __metadata__ first, compact JSON written by
 * json-c, padded with spaces to a multiple of 8 bytes so that the data
 * section starts 8-byte aligned. */
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "format_int.h"

/* A sort key that carries what it compares (qsort has no context). */
typedef struct st_key {
  int rank;
  const char *name;
  int index;
} st_key;

static int st_key_cmp(const void *a, const void *b) {
  const st_key *x = a, *y = b;
  if (x->rank != y->rank) return y->rank - x->rank;
  return strcmp(x->name, y->name);
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Rejects empty or repeated names among n strings. */
static pd_code st_unique(const char *const *names, int n, const char *what,
                         dev_status *st) {
  const char **s = malloc((size_t)(n ? n : 1) * sizeof *s);
  if (!s) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  memcpy(s, names, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, name_cmp);
  pd_code rc = PD_OK;
  for (int i = 1; i < n && rc == PD_OK; i++)
    if (strcmp(s[i - 1], s[i]) == 0)
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "%s \"%s\" appears more than once; names must be unique",
                     what, s[i]);
  free(s);
  return rc;
}

static pd_code st_check(const stg_save_tensor *t, int n, const char *const *mk,
                        const char *const *mv, int n_meta, dev_status *st) {
  const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
  if (!names) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  pd_code rc = PD_OK;
  for (int i = 0; i < n && rc == PD_OK; i++) {
    rc = stg__check_save(&t[i], st);
    if (rc == PD_OK && strcmp(t[i].name, "__metadata__") == 0)
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "a tensor may not be named __metadata__ (safetensors "
                     "keeps that key for the metadata)");
    names[i] = t[i].name;
  }
  if (rc == PD_OK) rc = st_unique(names, n, "tensor name", st);
  free(names);
  for (int i = 0; i < n_meta && rc == PD_OK; i++)
    if (!mk[i] || !mv[i] || !stg__utf8_valid(mk[i], strlen(mk[i])) ||
        !stg__utf8_valid(mv[i], strlen(mv[i])))
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "metadata pair %d is missing or not UTF-8", i);
  if (rc == PD_OK) rc = st_unique(mk, n_meta, "metadata key", st);
  return rc;
}

/* The header JSON of tensors in `order`, with their data offsets. */
static json_object *st_header(const stg_save_tensor *t, const int *order, int n,
                              const char *const *mk, const char *const *mv,
                              int n_meta) {
  json_object *root = json_object_new_object();
  if (!root) return NULL;
  bool ok = true;
  if (n_meta > 0) {
    json_object *meta = json_object_new_object();
    ok = meta && json_object_object_add(root, "__metadata__", meta) == 0;
    for (int i = 0; ok && i < n_meta; i++)
      ok = json_object_object_add(meta, mk[i], json_object_new_string(mv[i])) ==
           0;
  }
  uint64_t at = 0;
  for (int k = 0; ok && k < n; k++) {
    const stg_save_tensor *x = &t[order[k]];
    json_object *info = json_object_new_object();
    json_object *shape = json_object_new_array();
    json_object *offs = json_object_new_array();
    ok = info && shape && offs &&
         json_object_object_add(root, x->name, info) == 0;
    if (!ok) {
      json_object_put(shape);
      json_object_put(offs);
      break;
    }
    json_object_object_add(
        info, "dtype",
        json_object_new_string(stg_safetensors_dtype_name(x->dtype)));
    for (int d = 0; d < x->shape.rank; d++)
      json_object_array_add(shape, json_object_new_int64(x->shape.dims[d]));
    json_object_object_add(info, "shape", shape);
    json_object_array_add(offs, json_object_new_int64((int64_t)at));
    json_object_array_add(offs,
                          json_object_new_int64((int64_t)(at + x->bytes)));
    json_object_object_add(info, "data_offsets", offs);
    at += x->bytes;
  }
  if (!ok) {
    json_object_put(root);
    return NULL;
  }
  return root;
}

pd_code stg_write_safetensors(stg_out *o, const stg_save_tensor *tensors, int n,
                              stg_read_fn read, void *arg,
                              const char *const *meta_keys,
                              const char *const *meta_values, int n_meta,
                              dev_status *st) {
  if (n < 0 || n_meta < 0 || (n > 0 && (!tensors || !read)) ||
      (n_meta > 0 && (!meta_keys || !meta_values)))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "stg_write_safetensors: bad arguments (n %d, n_meta %d)",
                     n, n_meta);
  PD_TRY(st_check(tensors, n, meta_keys, meta_values, n_meta, st));
  int *order = malloc((size_t)(n ? n : 1) * sizeof *order);
  st_key *keys = malloc((size_t)(n ? n : 1) * sizeof *keys);
  if (!order || !keys) {
    free(order);
    free(keys);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  for (int i = 0; i < n; i++)
    keys[i] = (st_key){stg__safetensors_dtype_rank(tensors[i].dtype),
                       tensors[i].name, i};
  qsort(keys, (size_t)n, sizeof *keys, st_key_cmp);
  for (int i = 0; i < n; i++) order[i] = keys[i].index;
  free(keys);
  pd_code rc;
  json_object *root =
      st_header(tensors, order, n, meta_keys, meta_values, n_meta);
  if (!root) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED,
                   "out of host memory for a safetensors header");
    goto out;
  }
  size_t len;
  const char *text = json_object_to_json_string_length(
      root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
  size_t padded = len + (8 - len % 8) % 8;
  unsigned char prefix[8];
  for (int i = 0; i < 8; i++)
    prefix[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  static const char spaces[8] = "        ";
  PD_TRY_GOTO(stg_out_write(o, prefix, 8, st), rc, out);
  PD_TRY_GOTO(stg_out_write(o, text, len, st), rc, out);
  PD_TRY_GOTO(stg_out_write(o, spaces, padded - len, st), rc, out);
  for (int k = 0; k < n; k++)
    PD_TRY_GOTO(stg__pump(o, read, arg, order[k], tensors[order[k]].bytes, st),
                rc, out);
  rc = PD_OK;
out:
  json_object_put(root);
  free(order);
  return rc;
}
