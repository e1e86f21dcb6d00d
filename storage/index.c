/* The index's memory and the byte-level helpers every format shares: entry
 * and metadata arrays, overflow-checked sizes, bounded reads, UTF-8 checks,
 * byte swaps and the Fortran-to-C transpose. See format_int.h. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "format_int.h"

stg_index *stg__index_new(stg_format format) {
  stg_index *ix = calloc(1, sizeof *ix);
  if (ix) ix->format = format;
  return ix;
}

pd_code stg__index_add(stg_index *ix, const char *name, stg_entry **out,
                       dev_status *st) {
  /* Capacity 4, then doubled whenever n reaches a power of two. */
  if (ix->n == 0 || (ix->n >= 4 && (ix->n & (ix->n - 1)) == 0)) {
    size_t cap = ix->n ? (size_t)ix->n * 2 : 4;
    stg_entry *ne = realloc(ix->entries, cap * sizeof *ne);
    if (!ne)
      return dev_error(st, PD_RESOURCE_EXHAUSTED,
                       "out of host memory for an index");
    ix->entries = ne;
  }
  char *copy = strdup(name);
  if (!copy)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of host memory for an index");
  stg_entry *e = &ix->entries[ix->n++];
  memset(e, 0, sizeof *e);
  e->name = copy;
  *out = e;
  return PD_OK;
}

pd_code stg__index_add_meta(stg_index *ix, const char *key, const char *value,
                            dev_status *st) {
  char **k = realloc(ix->meta_keys, (size_t)(ix->n_meta + 1) * sizeof *k);
  if (k) ix->meta_keys = k;
  char **v = realloc(ix->meta_values, (size_t)(ix->n_meta + 1) * sizeof *v);
  if (v) ix->meta_values = v;
  char *kc = k && v ? strdup(key) : NULL;
  char *vc = kc ? strdup(value) : NULL;
  if (!vc) {
    free(kc);
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of host memory for the metadata");
  }
  ix->meta_keys[ix->n_meta] = kc;
  ix->meta_values[ix->n_meta] = vc;
  ix->n_meta++;
  return PD_OK;
}

void stg_index_free(stg_index *ix) {
  if (!ix) return;
  for (int i = 0; i < ix->n; i++) free(ix->entries[i].name);
  for (int i = 0; i < ix->n_meta; i++) {
    free(ix->meta_keys[i]);
    free(ix->meta_values[i]);
  }
  free(ix->entries);
  free(ix->meta_keys);
  free(ix->meta_values);
  free(ix);
}

const stg_entry *stg_index_find(const stg_index *ix, const char *name) {
  if (!ix || !name) return NULL;
  for (int i = 0; i < ix->n; i++)
    if (strcmp(ix->entries[i].name, name) == 0) return &ix->entries[i];
  return NULL;
}

bool stg__shape_bytes(const dev_shape *shape, uint64_t elem_size,
                      uint64_t *elems, uint64_t *bytes) {
  uint64_t n = 1;
  for (int i = 0; i < shape->rank; i++) {
    uint64_t d = (uint64_t)shape->dims[i];
    if (d != 0 && n > UINT64_MAX / d) return false;
    n *= d;
  }
  if (elem_size != 0 && n > UINT64_MAX / elem_size) return false;
  /* paradev's shapes are int64: keep both below INT64_MAX. */
  if (n > (uint64_t)INT64_MAX || n * elem_size > (uint64_t)INT64_MAX)
    return false;
  *elems = n;
  *bytes = n * elem_size;
  return true;
}

pd_code stg__read_at(stg_file *f, uint64_t offset, void *buf, size_t len,
                     const char *what, dev_status *st) {
  uint64_t size = stg_file_size(f);
  if (offset > size || len > size - offset)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: truncated: %s needs bytes [%llu, %llu) but the "
                     "file has %llu bytes",
                     stg_file_name(f), what, (unsigned long long)offset,
                     (unsigned long long)(offset + len),
                     (unsigned long long)size);
  if (len == 0) return PD_OK;
  return stg_file_pread(f, offset, buf, len, st);
}

bool stg__utf8_valid(const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < len) {
    unsigned c = p[i];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (len - i <= n) return false;
    for (size_t k = 1; k <= n; k++) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n + 1;
  }
  return true;
}

void stg__byteswap(void *buf, uint64_t n, size_t elem_size) {
  unsigned char *p = buf;
  for (uint64_t i = 0; i < n; i++, p += elem_size)
    for (size_t a = 0, b = elem_size - 1; a < b; a++, b--) {
      unsigned char t = p[a];
      p[a] = p[b];
      p[b] = t;
    }
}

void stg__fortran_to_c(const void *src, void *dst, const dev_shape *shape,
                       size_t elem_size) {
  /* Walk the destination in C order; the source offset of index (i0..ik)
   * is sum i_j * fstride_j with fstride_0 = 1, fstride_j = prod dims[<j]. */
  int r = shape->rank;
  int64_t fstride[PD_MAX_RANK], idx[PD_MAX_RANK] = {0};
  int64_t total = 1;
  for (int j = 0; j < r; j++) {
    fstride[j] = total;
    total *= shape->dims[j];
  }
  if (total == 0) return;
  const unsigned char *s = src;
  unsigned char *d = dst;
  int64_t off = 0; /* source element offset of idx */
  for (int64_t n = 0; n < total; n++) {
    memcpy(d + (size_t)n * elem_size, s + (size_t)off * elem_size, elem_size);
    for (int j = r - 1; j >= 0; j--) { /* odometer, last axis fastest */
      if (++idx[j] < shape->dims[j]) {
        off += fstride[j];
        break;
      }
      off -= fstride[j] * (shape->dims[j] - 1);
      idx[j] = 0;
    }
  }
}

#define STG_PUMP_CHUNK ((size_t)4 << 20)

pd_code stg__pump(stg_out *o, stg_read_fn read, void *arg, int tensor,
                  uint64_t bytes, dev_status *st) {
  if (bytes == 0) return PD_OK;
  size_t cap = bytes < STG_PUMP_CHUNK ? (size_t)bytes : STG_PUMP_CHUNK;
  unsigned char *buf = malloc(cap);
  if (!buf)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of host memory for a %zu-byte write buffer", cap);
  pd_code rc = PD_OK;
  for (uint64_t done = 0; done < bytes;) {
    size_t n = bytes - done < cap ? (size_t)(bytes - done) : cap;
    PD_TRY_GOTO(read(arg, tensor, done, buf, n, st), rc, out);
    PD_TRY_GOTO(stg_out_write(o, buf, n, st), rc, out);
    done += n;
  }
out:
  free(buf);
  return rc;
}

pd_code stg__check_save(const stg_save_tensor *t, dev_status *st) {
  const char *name = t->name ? t->name : "";
  if (!*name)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a tensor to save has an empty name; every tensor needs "
                     "one");
  if (!stg__utf8_valid(name, strlen(name)))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor name \"%.60s\" is not valid UTF-8", name);
  if (!dev_dtype_is_valid(t->dtype))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor \"%s\": dtype %d is not a paradev dtype", name,
                     (int)t->dtype);
  if (t->shape.rank < 0 || t->shape.rank > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "tensor \"%s\": rank %d; expected 0 to %d", name,
                     t->shape.rank, PD_MAX_RANK);
  for (int i = 0; i < t->shape.rank; i++)
    if (t->shape.dims[i] < 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "tensor \"%s\": dim %d is %lld; expected >= 0", name, i,
                       (long long)t->shape.dims[i]);
  uint64_t elems = 0, bytes = 0;
  char sb[160];
  if (!stg__shape_bytes(&t->shape, pd_dtype_size(t->dtype), &elems, &bytes) ||
      bytes != t->bytes)
    return dev_error(
        st, PD_INVALID_ARGUMENT,
        "tensor \"%s\": %llu bytes given but %s of shape %s "
        "needs %llu",
        name, (unsigned long long)t->bytes, pd_dtype_name(t->dtype),
        dev_shape_str(&t->shape, sb, sizeof sb), (unsigned long long)bytes);
  return PD_OK;
}
