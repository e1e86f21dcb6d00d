/* The formats' public entry points: stg_index_read picks the format (by
 * magic bytes, then by extension) and hands the file to its reader;
 * stg_entry_read turns an entry's stored bytes into the C-order
 * little-endian host value (direct reads, inflate, byte swap, transpose).
 * See storage/README.md, "Formats". */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "check.h"
#include "format_int.h"

/* The extension of a path or URL (query and fragment dropped), or "". */
static const char *fmt_extension(const char *name, char *buf, size_t cap) {
  size_t n = strcspn(name, "?#");
  if (n >= cap) n = cap - 1;
  memcpy(buf, name, n);
  buf[n] = 0;
  char *slash = strrchr(buf, '/'), *dot = strrchr(buf, '.');
  return dot && (!slash || dot > slash) ? dot : "";
}

static pd_code fmt_detect(stg_file *f, stg_format *out, dev_status *st) {
  unsigned char head[9] = {0};
  uint64_t size = stg_file_size(f);
  size_t n = size < sizeof head ? (size_t)size : sizeof head;
  PD_TRY(stg__read_at(f, 0, head, n, "the first bytes", st));
  if (n >= 6 && memcmp(head, "\x93NUMPY", 6) == 0) {
    *out = STG_FORMAT_NPY;
    return PD_OK;
  }
  if (n >= 4 && (memcmp(head, "PK\x03\x04", 4) == 0 ||
                 memcmp(head, "PK\x05\x06", 4) == 0)) {
    *out = STG_FORMAT_NPZ;
    return PD_OK;
  }
  if (n == 9 && head[8] == '{') {
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | head[i];
    if (hl <= STG_SAFETENSORS_MAX_HEADER && hl <= size - 8) {
      *out = STG_FORMAT_SAFETENSORS;
      return PD_OK;
    }
  }
  char buf[1024];
  const char *ext = fmt_extension(stg_file_name(f), buf, sizeof buf);
  if (strcasecmp(ext, ".safetensors") == 0)
    *out = STG_FORMAT_SAFETENSORS;
  else if (strcasecmp(ext, ".npy") == 0)
    *out = STG_FORMAT_NPY;
  else if (strcasecmp(ext, ".npz") == 0)
    *out = STG_FORMAT_NPZ;
  else
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: cannot tell the format: neither the first bytes "
                     "(\"\\x93NUMPY\", \"PK\\x03\\x04\", or a safetensors "
                     "header length and '{') nor the extension "
                     "(.safetensors, .npy, .npz) say",
                     stg_file_name(f));
  return PD_OK;
}

pd_code stg_index_read(stg_file *f, stg_format format, stg_index **out,
                       dev_status *st) {
  if (format == STG_FORMAT_AUTO) PD_TRY(fmt_detect(f, &format, st));
  if (format != STG_FORMAT_SAFETENSORS && format != STG_FORMAT_NPY &&
      format != STG_FORMAT_NPZ)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "format %d is not one of stg_format's", (int)format);
  stg_index *ix = stg__index_new(format);
  if (!ix) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  pd_code rc = format == STG_FORMAT_SAFETENSORS
                   ? stg__safetensors_index(f, ix, st)
               : format == STG_FORMAT_NPY ? stg__npy_index(f, ix, st)
                                          : stg__npz_index(f, ix, st);
  if (rc != PD_OK) {
    PD_TRAIL(rc);
    stg_index_free(ix);
    return rc;
  }
  *out = ix;
  return PD_OK;
}

bool stg_entry_random_access(const stg_entry *e) {
  return e->compression == 0 && !e->byteswap && !e->fortran_order;
}

pd_code stg_entry_read(stg_file *f, const stg_entry *e, uint64_t offset,
                       void *buf, size_t len, dev_status *st) {
  const char *fname = stg_file_name(f);
  if (offset > e->bytes || len > e->bytes - offset)
    return dev_error(st, PD_OUT_OF_RANGE,
                     "%s: tensor \"%s\": bytes [%llu, %llu) are past its %llu "
                     "bytes",
                     fname, e->name, (unsigned long long)offset,
                     (unsigned long long)(offset + len),
                     (unsigned long long)e->bytes);
  bool whole = offset == 0 && len == e->bytes;
  if (!whole && !stg_entry_random_access(e))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: tensor \"%s\" is %s, so it must be read whole "
                     "(bytes [0, %llu)), not [%llu, %llu)",
                     fname, e->name,
                     e->compression     ? "deflated"
                     : e->fortran_order ? "stored in Fortran order"
                                        : "big-endian",
                     (unsigned long long)e->bytes, (unsigned long long)offset,
                     (unsigned long long)(offset + len));
  if (len == 0) return PD_OK;
  size_t esize = pd_dtype_size(e->dtype);
  /* Fortran order needs the stored bytes beside the C-order result. */
  void *raw = buf;
  if (e->fortran_order && !(raw = malloc(len)))
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of host memory to transpose %zu bytes", len);
  pd_code rc;
  if (e->compression == 8) {
    PD_TRY_GOTO(stg__npz_inflate(f, e, raw, st), rc, out);
  } else {
    PD_TRY_GOTO(stg__read_at(f, e->file_offset + offset, raw, len,
                             "a tensor's data", st),
                rc, out);
    if (whole && e->member_bytes) /* a stored npz member read whole */
      PD_TRY_GOTO(stg__npz_check_stored(f, e, raw, st), rc, out);
  }
  if (e->byteswap) stg__byteswap(raw, len / esize, esize);
  if (e->fortran_order) stg__fortran_to_c(raw, buf, &e->shape, esize);
  rc = PD_OK;
out:
  if (raw != buf) free(raw);
  return rc;
}

pd_code stg_entry_read_spans(stg_file *f, const stg_entry *e, uint64_t offset,
                             size_t len, stg_span_fn fn, void *arg,
                             dev_status *st) {
  if (!f || !e || !fn)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "stg_entry_read_spans: a file, an entry and a function "
                     "are required");
  if (offset > e->bytes || len > e->bytes - offset) /* its range error */
    return stg_entry_read(f, e, offset, NULL, len, st);
  bool whole = offset == 0 && len == e->bytes;
  /* A stored npz member read whole is checked against its CRC: that needs
   * the bytes together, as does every entry that is not random-access. */
  if (stg_entry_random_access(e) && !(whole && e->member_bytes))
    return len ? stg_file_read_spans(f, e->file_offset + offset, len, fn, arg,
                                     st)
               : PD_OK;
  void *buf = malloc(len ? len : 1);
  if (!buf)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of host memory for %zu bytes of tensor \"%s\"", len,
                     e->name);
  pd_code rc = stg_entry_read(f, e, offset, buf, len, st);
  if (rc == PD_OK && len) rc = fn(arg, 0, buf, len, st);
  free(buf);
  return rc;
}
