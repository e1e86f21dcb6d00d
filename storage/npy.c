/* The .npy reader (numpy/lib/format.py, format versions 1.0, 2.0, 3.0):
 *
 *   "\x93NUMPY" major minor   6 + 2 bytes
 *   header length             2 bytes LE (1.0) or 4 bytes LE (2.0, 3.0)
 *   header                    a Python dict literal, latin-1 (1.0, 2.0) or
 *                             UTF-8 (3.0): {'descr': '<f4',
 *                             'fortran_order': False, 'shape': (3, 4), }
 *                             padded with spaces and a newline
 *   data                      prod(shape) elements as descr says
 *
 * NumPy reads the dict with ast.literal_eval; json-c cannot, so this file
 * holds a strict parser of exactly that subset (strings without escapes,
 * True/False, tuples of non-negative integers). The declared header length
 * is checked against STG_NPY_MAX_HEADER before anything is allocated. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "format_int.h"

typedef struct npy_descr {
  char code[3]; /* type char + size, as in "f4" */
  pd_dtype dtype;
} npy_descr;

static const npy_descr npy_descrs[] = {
    {"f4", PD_FLOAT32}, {"f8", PD_FLOAT64}, {"f2", PD_FLOAT16},
    {"i4", PD_INT32},   {"i8", PD_INT64},   {"u1", PD_UINT8},
    {"b1", PD_BOOL},
};
#define NPY_NDESCRS ((int)(sizeof npy_descrs / sizeof npy_descrs[0]))

const char *stg__npy_descr(pd_dtype dt) {
  switch (dt) {
    case PD_FLOAT32: return "<f4";
    case PD_FLOAT64: return "<f8";
    case PD_FLOAT16: return "<f2";
    case PD_INT32: return "<i4";
    case PD_INT64: return "<i8";
    case PD_UINT8: return "|u1";
    case PD_BOOL: return "|b1";
    default: return NULL;
  }
}

/* --- the dict literal ------------------------------------------------------ */

typedef struct npy_lex {
  const char *p, *end;
  const char *what;
  dev_status *st;
} npy_lex;

static void lex_ws(npy_lex *l) {
  while (l->p < l->end &&
         (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
    l->p++;
}

static pd_code lex_fail(npy_lex *l, const char *expected) {
  size_t left = (size_t)(l->end - l->p);
  return dev_error(l->st, PD_INVALID_ARGUMENT,
                   "%s: .npy header dict: expected %s at \"%.*s\"", l->what,
                   expected, (int)(left > 24 ? 24 : left), l->p);
}

static pd_code lex_char(npy_lex *l, char c, const char *expected) {
  lex_ws(l);
  if (l->p >= l->end || *l->p != c) return lex_fail(l, expected);
  l->p++;
  return PD_OK;
}

/* A quoted string without escapes into buf (NUL-terminated). */
static pd_code lex_string(npy_lex *l, char *buf, size_t cap) {
  lex_ws(l);
  if (l->p >= l->end || (*l->p != '\'' && *l->p != '"'))
    return lex_fail(l, "a quoted string");
  char q = *l->p++;
  const char *s = l->p;
  while (l->p < l->end && *l->p != q && *l->p != '\\') l->p++;
  if (l->p >= l->end || *l->p != q)
    return lex_fail(l, "the end of a string (without escapes)");
  size_t n = (size_t)(l->p - s);
  l->p++;
  if (n >= cap)
    return dev_error(l->st, PD_INVALID_ARGUMENT,
                     "%s: .npy header dict: string \"%.*s...\" is too long",
                     l->what, 24, s);
  memcpy(buf, s, n);
  buf[n] = 0;
  return PD_OK;
}

static pd_code lex_bool(npy_lex *l, bool *out) {
  lex_ws(l);
  size_t left = (size_t)(l->end - l->p);
  if (left >= 4 && memcmp(l->p, "True", 4) == 0) {
    l->p += 4, *out = true;
    return PD_OK;
  }
  if (left >= 5 && memcmp(l->p, "False", 5) == 0) {
    l->p += 5, *out = false;
    return PD_OK;
  }
  return lex_fail(l, "True or False for fortran_order");
}

/* (d0, d1, ...) of non-negative integers; "()" is rank 0. */
static pd_code lex_shape(npy_lex *l, dev_shape *out) {
  PD_TRY(lex_char(l, '(', "a tuple for shape"));
  out->rank = 0;
  for (;;) {
    lex_ws(l);
    if (l->p < l->end && *l->p == ')') {
      l->p++;
      break;
    }
    if (l->p >= l->end || *l->p < '0' || *l->p > '9')
      return lex_fail(l, "a non-negative integer dim in shape");
    uint64_t v = 0;
    while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
      uint64_t d = (uint64_t)(*l->p++ - '0');
      if (v > ((uint64_t)INT64_MAX - d) / 10)
        return dev_error(l->st, PD_INVALID_ARGUMENT,
                         "%s: .npy header dict: a dim of shape overflows "
                         "int64",
                         l->what);
      v = v * 10 + d;
    }
    if (out->rank == PD_MAX_RANK)
      return dev_error(l->st, PD_INVALID_ARGUMENT,
                       "%s: .npy shape has more than %d dims, paradev's "
                       "largest rank",
                       l->what, PD_MAX_RANK);
    out->dims[out->rank++] = (int64_t)v;
    lex_ws(l);
    if (l->p < l->end && *l->p == ',') {
      l->p++;
    } else if (l->p < l->end && *l->p == ')') {
      /* "(3)" is an int in Python, not a tuple. */
      if (out->rank == 1)
        return lex_fail(l, "a comma after the only dim, as in (3,)");
    } else {
      return lex_fail(l, "',' or ')' in shape");
    }
  }
  return PD_OK;
}

/* Maps a descr ("<f4", ">i8", "|b1") to a dtype and byte order. */
static pd_code npy_descr_parse(const char *what, const char *descr,
                               stg_npy_header *h, dev_status *st) {
  const char *p = descr;
  char order = '=';
  if (*p == '<' || *p == '>' || *p == '|' || *p == '=') order = *p++;
  const char *code = strcmp(p, "?") == 0 ? "b1" : p;
  for (int i = 0; i < NPY_NDESCRS; i++)
    if (strcmp(code, npy_descrs[i].code) == 0) {
      h->dtype = npy_descrs[i].dtype;
      h->big_endian = order == '>';
      return PD_OK;
    }
  /* A dtype NumPy has and paradev lacks, or not a dtype at all. */
  if (strchr("biufcmMOSUVa", *p) && *p)
    return dev_error(st, PD_UNIMPLEMENTED,
                     "%s: .npy dtype '%s', which paradev does not have (it "
                     "has float32, float64, float16, int32, int64, uint8, "
                     "bool)",
                     what, descr);
  return dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: .npy header dict: descr '%s' is not a NumPy dtype",
                   what, descr);
}

static pd_code npy_dict(npy_lex *l, stg_npy_header *h) {
  bool seen[3] = {false, false, false};
  PD_TRY(lex_char(l, '{', "'{' opening the header dict"));
  for (;;) {
    lex_ws(l);
    if (l->p < l->end && *l->p == '}') {
      l->p++;
      break;
    }
    char key[32];
    PD_TRY(lex_string(l, key, sizeof key));
    PD_TRY(lex_char(l, ':', "':' after a key"));
    int k = strcmp(key, "descr") == 0           ? 0
            : strcmp(key, "fortran_order") == 0 ? 1
            : strcmp(key, "shape") == 0         ? 2
                                                : -1;
    if (k < 0)
      return dev_error(l->st, PD_INVALID_ARGUMENT,
                       "%s: .npy header dict has an unknown key '%s'; "
                       "expected descr, fortran_order and shape",
                       l->what, key);
    if (seen[k])
      return dev_error(l->st, PD_INVALID_ARGUMENT,
                       "%s: .npy header dict repeats the key '%s'", l->what,
                       key);
    seen[k] = true;
    if (k == 0) {
      lex_ws(l);
      if (l->p < l->end && *l->p == '[')
        return dev_error(l->st, PD_UNIMPLEMENTED,
                         "%s: .npy structured dtype (a descr list); paradev "
                         "reads plain arrays only",
                         l->what);
      char descr[32];
      PD_TRY(lex_string(l, descr, sizeof descr));
      PD_TRY(npy_descr_parse(l->what, descr, h, l->st));
    } else if (k == 1) {
      PD_TRY(lex_bool(l, &h->fortran_order));
    } else {
      PD_TRY(lex_shape(l, &h->shape));
    }
    lex_ws(l);
    if (l->p < l->end && *l->p == ',')
      l->p++;
    else if (l->p >= l->end || *l->p != '}')
      return lex_fail(l, "',' or '}' after a value");
  }
  lex_ws(l);
  if (l->p != l->end) return lex_fail(l, "only spaces after the header dict");
  for (int k = 0; k < 3; k++)
    if (!seen[k])
      return dev_error(l->st, PD_INVALID_ARGUMENT,
                       "%s: .npy header dict lacks '%s'", l->what,
                       k == 0   ? "descr"
                       : k == 1 ? "fortran_order"
                                : "shape");
  return PD_OK;
}

pd_code stg__npy_parse(const unsigned char *buf, size_t len, const char *what,
                       stg_npy_header *out, uint64_t *need, dev_status *st) {
  if (len < 10) {
    *need = 10;
    return PD_OUT_OF_RANGE;
  }
  if (memcmp(buf, "\x93NUMPY", 6) != 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: not a .npy file: it does not start with "
                     "\"\\x93NUMPY\"",
                     what);
  stg_npy_header h;
  memset(&h, 0, sizeof h);
  h.major = buf[6];
  h.minor = buf[7];
  if (h.major < 1 || h.major > 3 || h.minor != 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: .npy format version %d.%d; expected 1.0, 2.0 or 3.0",
                     what, h.major, h.minor);
  size_t start = h.major == 1 ? 10 : 12;
  if (len < start) {
    *need = start;
    return PD_OUT_OF_RANGE;
  }
  uint64_t hl = (uint64_t)buf[8] | (uint64_t)buf[9] << 8;
  if (h.major > 1) hl |= (uint64_t)buf[10] << 16 | (uint64_t)buf[11] << 24;
  if (hl > STG_NPY_MAX_HEADER)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: .npy header length %llu is over the limit of %u "
                     "bytes",
                     what, (unsigned long long)hl, STG_NPY_MAX_HEADER);
  if (len < start + hl) {
    *need = start + hl;
    return PD_OUT_OF_RANGE;
  }
  const char *text = (const char *)buf + start;
  if (memchr(text, 0, hl) ||
      (h.major == 3 && !stg__utf8_valid(text, (size_t)hl)))
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: .npy header is not %s text",
                     what, h.major == 3 ? "UTF-8" : "latin-1");
  npy_lex l = {text, text + hl, what, st};
  PD_TRY(npy_dict(&l, &h));
  uint64_t elems;
  size_t esize = pd_dtype_size(h.dtype);
  if (!stg__shape_bytes(&h.shape, esize, &elems, &h.bytes)) {
    char sb[160];
    return dev_error(
        st, PD_INVALID_ARGUMENT, "%s: .npy shape %s of %s overflows", what,
        dev_shape_str(&h.shape, sb, sizeof sb), pd_dtype_name(h.dtype));
  }
  h.header_bytes = start + hl;
  *out = h;
  return PD_OK;
}

void stg__npy_fill_entry(const stg_npy_header *h, stg_entry *e) {
  e->dtype = h->dtype;
  e->shape = h->shape;
  e->bytes = h->bytes;
  e->byteswap = h->big_endian && pd_dtype_size(h->dtype) > 1;
  e->fortran_order = h->fortran_order && h->shape.rank > 1;
  e->header_bytes = h->header_bytes;
}

pd_code stg__npy_index(stg_file *f, stg_index *ix, dev_status *st) {
  const char *fname = stg_file_name(f);
  uint64_t size = stg_file_size(f);
  size_t have = size < 4096 ? (size_t)size : 4096;
  unsigned char *buf = malloc(have ? have : 1);
  if (!buf) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  pd_code rc;
  stg_npy_header h;
  uint64_t need = 0;
  PD_TRY_GOTO(stg__read_at(f, 0, buf, have, "the .npy header", st), rc, out);
  rc = stg__npy_parse(buf, have, fname, &h, &need, st);
  if (rc == PD_OUT_OF_RANGE) { /* a header longer than the first read */
    if (need > size) {
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: truncated: the .npy header needs %llu bytes but "
                     "the file has %llu",
                     fname, (unsigned long long)need, (unsigned long long)size);
      goto out;
    }
    unsigned char *nb = realloc(buf, (size_t)need);
    if (!nb) {
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      goto out;
    }
    buf = nb;
    PD_TRY_GOTO(stg__read_at(f, 0, buf, (size_t)need, "the .npy header", st),
                rc, out);
    rc = stg__npy_parse(buf, (size_t)need, fname, &h, &need, st);
  }
  if (rc != PD_OK) goto out;
  if (h.bytes > size - h.header_bytes) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: truncated: the .npy data needs %llu bytes after the "
                   "%llu-byte header but the file has %llu",
                   fname, (unsigned long long)h.bytes,
                   (unsigned long long)h.header_bytes,
                   (unsigned long long)(size - h.header_bytes));
    goto out;
  }
  stg_entry *e;
  PD_TRY_GOTO(stg__index_add(ix, "", &e, st), rc, out);
  stg__npy_fill_entry(&h, e);
  e->file_offset = h.header_bytes;
  e->file_bytes = h.bytes;
out:
  free(buf);
  return rc;
}
