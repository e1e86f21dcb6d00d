/* The safetensors reader (huggingface/safetensors, safetensors/src/tensor.rs):
 *
 *   8 bytes     N, the header's length, little-endian u64
 *   N bytes     a UTF-8 JSON object: {"__metadata__": {str: str},
 *               "name": {"dtype": "F32", "shape": [2, 3],
 *                        "data_offsets": [begin, end]}, ...}
 *               (offsets relative to the data section; may end in spaces)
 *   the rest    the data section, tiled exactly by the tensors' ranges
 *
 * Every check of the reference reader's SafeTensors::read_metadata and
 * Metadata::validate is made (HeaderTooLarge, InvalidHeaderLength,
 * InvalidHeaderStart, InvalidHeaderDeserialization, InvalidOffset,
 * TensorInvalidInfo, ValidationOverflow, MetadataIncompleteBuffer), plus
 * duplicate names, unknown keys, paradev's rank limit and header strings
 * json-c would change (a \u0000 escape: json-c's keys end at the NUL; a
 * lone surrogate escape: it puts U+FFFD); each is
 * INVALID_ARGUMENT naming the file. A dtype safetensors has and paradev
 * lacks is UNIMPLEMENTED naming it and the tensor, after the whole header
 * has been checked. The JSON is parsed by json-c. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "format_int.h"

typedef struct st_dtype {
  const char *name;
  pd_dtype dtype; /* PD_DTYPE_INVALID: not in paradev */
  unsigned bits;  /* per element */
  int rank;       /* the reference's Dtype enum order */
} st_dtype;

static const st_dtype st_dtypes[] = {
    {"BOOL", PD_BOOL, 8, 0},
    {"F4", PD_DTYPE_INVALID, 4, 1},
    {"F6_E2M3", PD_DTYPE_INVALID, 6, 2},
    {"F6_E3M2", PD_DTYPE_INVALID, 6, 3},
    {"U8", PD_UINT8, 8, 4},
    {"I8", PD_DTYPE_INVALID, 8, 5},
    {"F8_E5M2", PD_DTYPE_INVALID, 8, 6},
    {"F8_E4M3", PD_DTYPE_INVALID, 8, 7},
    {"F8_E8M0", PD_DTYPE_INVALID, 8, 8},
    {"I16", PD_DTYPE_INVALID, 16, 9},
    {"U16", PD_DTYPE_INVALID, 16, 10},
    {"F16", PD_FLOAT16, 16, 11},
    {"BF16", PD_BFLOAT16, 16, 12},
    {"I32", PD_INT32, 32, 13},
    {"U32", PD_DTYPE_INVALID, 32, 14},
    {"F32", PD_FLOAT32, 32, 15},
    {"C64", PD_DTYPE_INVALID, 64, 16},
    {"F64", PD_FLOAT64, 64, 17},
    {"I64", PD_INT64, 64, 18},
    {"U64", PD_DTYPE_INVALID, 64, 19},
};
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

pd_dtype stg__safetensors_dtype(const char *name, bool *known,
                                uint64_t *elem_bits) {
  for (int i = 0; i < ST_NDTYPES; i++)
    if (strcmp(st_dtypes[i].name, name) == 0) {
      *known = true;
      *elem_bits = st_dtypes[i].bits;
      return st_dtypes[i].dtype;
    }
  *known = false;
  *elem_bits = 0;
  return PD_DTYPE_INVALID;
}

const char *stg_safetensors_dtype_name(pd_dtype dt) {
  for (int i = 0; i < ST_NDTYPES; i++)
    if (dt != PD_DTYPE_INVALID && st_dtypes[i].dtype == dt)
      return st_dtypes[i].name;
  return NULL;
}

int stg__safetensors_dtype_rank(pd_dtype dt) {
  for (int i = 0; i < ST_NDTYPES; i++)
    if (dt != PD_DTYPE_INVALID && st_dtypes[i].dtype == dt)
      return st_dtypes[i].rank;
  return -1;
}

/* --- duplicate keys: json-c keeps the last of two equal keys, so count the
 * top-level keys in the text and compare with the object's length. ------ */

typedef struct raw_key {
  const char *s;
  size_t len;
} raw_key;

static int raw_key_cmp(const void *a, const void *b) {
  const raw_key *x = a, *y = b;
  size_t n = x->len < y->len ? x->len : y->len;
  int c = memcmp(x->s, y->s, n);
  return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Scans valid JSON text `s` (an object); returns the count of its top-level
 * keys and, when `keys` is not NULL, their raw (still escaped) spellings. */
static size_t st_top_keys(const char *s, size_t len, raw_key *keys) {
  size_t count = 0;
  int depth = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      depth--;
    } else if (c == '"') {
      size_t start = ++i;
      while (i < len && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
      size_t end = i, j = i + 1;
      while (j < len &&
             (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r'))
        j++;
      if (depth == 1 && j < len && s[j] == ':') {
        if (keys) keys[count] = (raw_key){s + start, end - start};
        count++;
      }
    }
  }
  return count;
}

static pd_code st_check_duplicates(const char *fname, const char *text,
                                   size_t len, size_t distinct,
                                   dev_status *st) {
  size_t n = st_top_keys(text, len, NULL);
  if (n == distinct) return PD_OK;
  raw_key *keys = malloc(n * sizeof *keys);
  if (!keys) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  st_top_keys(text, len, keys);
  qsort(keys, n, sizeof *keys, raw_key_cmp);
  int shown = 0;
  const char *dup = "";
  for (size_t i = 1; i < n; i++)
    if (raw_key_cmp(&keys[i - 1], &keys[i]) == 0) {
      shown = keys[i].len > 200 ? 200 : (int)keys[i].len;
      dup = keys[i].s;
      break;
    }
  pd_code rc = dev_error(st, PD_INVALID_ARGUMENT,
                         "%s: safetensors header: the name \"%.*s\" appears "
                         "more than once (%zu keys, %zu distinct); each "
                         "tensor name must be unique",
                         fname, shown, dup, n, distinct);
  free(keys);
  return rc;
}

/* The code point of the 4 hex digits at s (s has them: valid JSON). */
static unsigned st_hex4(const char *s) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    v = v * 16 + (unsigned)(c <= '9'   ? c - '0'
                            : c <= 'F' ? c - 'A' + 10
                                       : c - 'a' + 10);
  }
  return v;
}

/* What is wrong with the raw (still escaped) JSON string s[0..len): "a NUL
 * (\\u0000)", "an unpaired surrogate (\\uXXXX)" or NULL. json-c would cut a
 * name at the NUL and put U+FFFD for a lone surrogate: another name than the
 * file's. */
static const char *st_bad_escape(const char *s, size_t len, char *buf,
                                 size_t cap) {
  for (size_t i = 0; i + 1 < len; i++) {
    if (s[i] != '\\') continue;
    if (s[i + 1] != 'u' || i + 6 > len) {
      i++;
      continue;
    }
    unsigned cp = st_hex4(s + i + 2);
    if (cp == 0) return "a NUL byte (\\u0000)";
    if (cp >= 0xD800 && cp <= 0xDBFF && i + 12 <= len && s[i + 6] == '\\' &&
        s[i + 7] == 'u') {
      unsigned lo = st_hex4(s + i + 8);
      if (lo >= 0xDC00 && lo <= 0xDFFF) {
        i += 11;
        continue;
      }
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) {
      snprintf(buf, cap, "an unpaired UTF-16 surrogate (\\u%.4s)", s + i + 2);
      return buf;
    }
    i += 5;
  }
  return NULL;
}

/* Refuses a header string (a tensor name, a metadata key or value) that
 * holds a NUL or an unpaired surrogate escape; `s` is valid JSON text. */
static pd_code st_check_strings(const char *fname, const char *s, size_t len,
                                dev_status *st) {
  int depth = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      depth--;
    } else if (c == '"') {
      size_t start = ++i;
      while (i < len && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
      char buf[64];
      const char *bad = st_bad_escape(s + start, i - start, buf, sizeof buf);
      if (bad) {
        int shown = i - start > 200 ? 200 : (int)(i - start);
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "%s: safetensors header: the %s \"%.*s\" holds %s; "
                         "names and metadata must be UTF-8 without NUL bytes",
                         fname, depth == 1 ? "name" : "string", shown,
                         s + start, bad);
      }
    }
  }
  return PD_OK;
}

/* --- one tensor's header entry ------------------------------------------- */

/* A non-negative JSON integer; false for anything else. */
static bool st_uint(json_object *o, uint64_t *out) {
  if (!o || !json_object_is_type(o, json_type_int)) return false;
  int64_t v = json_object_get_int64(o);
  if (v < 0 || v == INT64_MAX) /* json-c clamps larger values to INT64_MAX */
    return false;
  *out = (uint64_t)v;
  return true;
}

typedef struct st_range {
  uint64_t begin, end;
  int entry;
} st_range;

static int st_range_cmp(const void *a, const void *b) {
  const st_range *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* Parses {"dtype", "shape", "data_offsets"} of tensor `name` into e and
 * *range; *unimpl gets the dtype name when paradev lacks it. */
static pd_code st_tensor(const char *fname, const char *name, json_object *v,
                         stg_entry *e, st_range *range, const char **unimpl,
                         dev_status *st) {
  if (!json_object_is_type(v, json_type_object))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\" is a JSON %s; "
                     "expected an object with dtype, shape and data_offsets",
                     fname, name, json_type_to_name(json_object_get_type(v)));
  json_object_object_foreach(v, key, val) {
    (void)val;
    if (strcmp(key, "dtype") && strcmp(key, "shape") &&
        strcmp(key, "data_offsets"))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: safetensors header: tensor \"%s\" has an unknown "
                       "key \"%s\"; expected only dtype, shape and "
                       "data_offsets",
                       fname, name, key);
  }
  static const char *const need[] = {"dtype", "shape", "data_offsets"};
  json_object *f[3];
  for (int i = 0; i < 3; i++)
    if (!json_object_object_get_ex(v, need[i], &f[i]))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: safetensors header: tensor \"%s\" lacks \"%s\"",
                       fname, name, need[i]);
  if (!json_object_is_type(f[0], json_type_string))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\": dtype is not a "
                     "string",
                     fname, name);
  const char *dname = json_object_get_string(f[0]);
  bool known;
  uint64_t bits;
  e->dtype = stg__safetensors_dtype(dname, &known, &bits);
  if (!known)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\" has an unknown "
                     "dtype \"%.40s\"",
                     fname, name, dname);
  if (e->dtype == PD_DTYPE_INVALID && !*unimpl) *unimpl = dname;
  if (!json_object_is_type(f[1], json_type_array))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\": shape is not a "
                     "list of integers",
                     fname, name);
  size_t rank = json_object_array_length(f[1]);
  if (rank > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\" has rank %zu; "
                     "paradev allows at most %d",
                     fname, name, rank, PD_MAX_RANK);
  e->shape.rank = (int)rank;
  for (size_t i = 0; i < rank; i++) {
    uint64_t d;
    if (!st_uint(json_object_array_get_idx(f[1], i), &d))
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "%s: safetensors header: tensor \"%s\": shape dim %zu "
          "is %s; dims must be non-negative integers",
          fname, name, i,
          json_object_to_json_string(json_object_array_get_idx(f[1], i)));
    e->shape.dims[i] = (int64_t)d;
  }
  if (!json_object_is_type(f[2], json_type_array) ||
      json_object_array_length(f[2]) != 2 ||
      !st_uint(json_object_array_get_idx(f[2], 0), &range->begin) ||
      !st_uint(json_object_array_get_idx(f[2], 1), &range->end))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\": data_offsets "
                     "must be [begin, end] of non-negative integers",
                     fname, name);
  if (range->end < range->begin)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\": data_offsets "
                     "[%llu, %llu] end before they begin",
                     fname, name, (unsigned long long)range->begin,
                     (unsigned long long)range->end);
  uint64_t elems, nbits;
  char sbuf[160];
  if (!stg__shape_bytes(&e->shape, bits, &elems, &nbits))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\": the size of "
                     "shape %s of %s overflows",
                     fname, name, dev_shape_str(&e->shape, sbuf, sizeof sbuf),
                     dname);
  uint64_t nbytes = (nbits + 7) / 8;
  if (range->end - range->begin != nbytes)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: tensor \"%s\": data_offsets "
                     "[%llu, %llu] hold %llu bytes but %s of shape %s is "
                     "%llu bytes",
                     fname, name, (unsigned long long)range->begin,
                     (unsigned long long)range->end,
                     (unsigned long long)(range->end - range->begin), dname,
                     dev_shape_str(&e->shape, sbuf, sizeof sbuf),
                     (unsigned long long)nbytes);
  e->bytes = nbytes;
  e->file_bytes = nbytes;
  return PD_OK;
}

static pd_code st_metadata(const char *fname, json_object *v, stg_index *ix,
                           dev_status *st) {
  if (!json_object_is_type(v, json_type_object))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: __metadata__ is a JSON %s; "
                     "expected an object of strings",
                     fname, json_type_to_name(json_object_get_type(v)));
  json_object_object_foreach(v, key, val) {
    if (!json_object_is_type(val, json_type_string))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: safetensors header: __metadata__ \"%s\" is a "
                       "JSON %s; metadata values must be strings",
                       fname, key,
                       json_type_to_name(json_object_get_type(val)));
    PD_TRY(stg__index_add_meta(ix, key, json_object_get_string(val), st));
  }
  return PD_OK;
}

/* Sorted by begin, the ranges must tile [0, data_bytes) exactly. */
static pd_code st_check_tiling(const char *fname, const stg_index *ix,
                               st_range *r, int n, uint64_t data_bytes,
                               dev_status *st) {
  qsort(r, (size_t)n, sizeof *r, st_range_cmp);
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].begin < at)
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "%s: safetensors header: tensor \"%s\" [%llu, %llu] "
          "overlaps tensor \"%s\", which ends at %llu",
          fname, ix->entries[r[i].entry].name, (unsigned long long)r[i].begin,
          (unsigned long long)r[i].end, ix->entries[r[i - 1].entry].name,
          (unsigned long long)at);
    if (r[i].begin > at)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "%s: safetensors header: a hole: bytes [%llu, %llu) "
                       "of the data section belong to no tensor (next is "
                       "\"%s\")",
                       fname, (unsigned long long)at,
                       (unsigned long long)r[i].begin,
                       ix->entries[r[i].entry].name);
    at = r[i].end;
  }
  if (at > data_bytes)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: truncated: the tensors need %llu bytes of data but "
                     "the file holds %llu after the header",
                     fname, (unsigned long long)at,
                     (unsigned long long)data_bytes);
  if (at < data_bytes)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: %llu trailing bytes after the last tensor (the "
                     "tensors end at %llu of %llu data bytes)",
                     fname, (unsigned long long)(data_bytes - at),
                     (unsigned long long)at, (unsigned long long)data_bytes);
  return PD_OK;
}

static pd_code st_parse_header(stg_file *f, const char *text, size_t n,
                               uint64_t data_start, stg_index *ix,
                               dev_status *st) {
  const char *fname = stg_file_name(f);
  json_tokener *tok = json_tokener_new();
  if (!tok) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
  json_object *root = json_tokener_parse_ex(tok, text, (int)n);
  enum json_tokener_error jerr = json_tokener_get_error(tok);
  size_t end = json_tokener_get_parse_end(tok);
  json_tokener_free(tok);
  pd_code rc = PD_OK;
  st_range *ranges = NULL;
  if (!root || jerr != json_tokener_success) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: safetensors header is not valid JSON: %s (near byte "
                   "%zu of %zu)",
                   fname,
                   jerr == json_tokener_continue
                       ? "it ends before the object closes"
                       : json_tokener_error_desc(jerr),
                   end, n);
    goto out;
  }
  for (size_t i = end; i < n; i++)
    if (text[i] != ' ' && text[i] != '\t' && text[i] != '\n' &&
        text[i] != '\r') {
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header: bytes after the JSON object "
                     "(at %zu of %zu) are not spaces",
                     fname, i, n);
      goto out;
    }
  if (!json_object_is_type(root, json_type_object)) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: safetensors header is a JSON %s; expected an object",
                   fname, json_type_to_name(json_object_get_type(root)));
    goto out;
  }
  PD_TRY_GOTO(st_check_strings(fname, text, n, st), rc, out);
  size_t keys = (size_t)json_object_object_length(root);
  PD_TRY_GOTO(st_check_duplicates(fname, text, n, keys, st), rc, out);
  ranges = malloc((keys ? keys : 1) * sizeof *ranges);
  if (!ranges) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto out;
  }
  const char *unimpl = NULL, *unimpl_tensor = NULL;
  int nr = 0;
  json_object_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      PD_TRY_GOTO(st_metadata(fname, val, ix, st), rc, out);
      continue;
    }
    stg_entry *e;
    PD_TRY_GOTO(stg__index_add(ix, key, &e, st), rc, out);
    const char *before = unimpl;
    PD_TRY_GOTO(st_tensor(fname, key, val, e, &ranges[nr], &unimpl, st), rc,
                out);
    if (!before && unimpl) unimpl_tensor = e->name;
    e->file_offset = data_start + ranges[nr].begin;
    ranges[nr].entry = ix->n - 1;
    nr++;
  }
  PD_TRY_GOTO(
      st_check_tiling(fname, ix, ranges, nr, stg_file_size(f) - data_start, st),
      rc, out);
  if (unimpl)
    rc = dev_error(st, PD_UNIMPLEMENTED,
                   "%s: tensor \"%s\" has dtype %s, which paradev does not "
                   "have (it has F32, F64, F16, BF16, I32, I64, U8, BOOL)",
                   fname, unimpl_tensor, unimpl);
out:
  free(ranges);
  json_object_put(root);
  return rc;
}

/* What the first 8 bytes say a file is when it is not safetensors: "a zip
 * archive's (an .npz)" or "the .npy magic"; NULL otherwise. */
static const char *stg_st_other_format(const unsigned char b[8]) {
  if (b[0] == 'P' && b[1] == 'K' &&
      ((b[2] == 3 && b[3] == 4) || (b[2] == 5 && b[3] == 6)))
    return "a zip archive's (an .npz)";
  if (memcmp(b, "\x93NUMPY", 6) == 0) return "the .npy magic";
  return NULL;
}

pd_code stg__safetensors_index(stg_file *f, stg_index *ix, dev_status *st) {
  const char *fname = stg_file_name(f);
  uint64_t size = stg_file_size(f);
  if (size < 8)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: truncated: %llu bytes is shorter than a safetensors "
                     "header length (8 bytes)",
                     fname, (unsigned long long)size);
  unsigned char len8[8];
  PD_TRY(stg__read_at(f, 0, len8, 8, "the header length", st));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  const char *other = stg_st_other_format(len8);
  if (other)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: not a safetensors file: its first bytes are %s; "
                     "load it with format %s (or auto)",
                     fname, other,
                     other[0] == 'a' && other[1] == ' ' ? "npz" : "npy");
  if (n > STG_SAFETENSORS_MAX_HEADER)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: not a safetensors file, or a damaged one: its "
                     "header length %llu (the first 8 bytes, little-endian) "
                     "is over the limit of %u bytes",
                     fname, (unsigned long long)n, STG_SAFETENSORS_MAX_HEADER);
  if (n > size - 8)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: safetensors header length %llu passes the end of "
                     "the file (%llu bytes)",
                     fname, (unsigned long long)n, (unsigned long long)size);
  char *text = malloc((size_t)n + 1);
  if (!text)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of host memory for a %llu-byte header",
                     (unsigned long long)n);
  pd_code rc;
  PD_TRY_GOTO(stg__read_at(f, 8, text, (size_t)n, "the header", st), rc, out);
  text[n] = 0;
  if (n == 0 || text[0] != '{') {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: safetensors header does not start with '{'", fname);
    goto out;
  }
  if (memchr(text, 0, (size_t)n) || !stg__utf8_valid(text, (size_t)n)) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: safetensors header is not valid UTF-8 text", fname);
    goto out;
  }
  rc = st_parse_header(f, text, (size_t)n, 8 + n, ix, st);
out:
  free(text);
  return rc;
}
