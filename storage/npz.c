/* The .npz reader: a zip archive (PKWARE APPNOTE.TXT) of .npy members, as
 * np.savez (stored) and np.savez_compressed (deflated) write them. The end
 * of central directory record (and its zip64 form, which NumPy's
 * force_zip64 members may need) gives the central directory; each member
 * "name.npy" becomes the entry "name", its .npy header read from the
 * member's first bytes (inflated, for a deflated member). Members that are
 * not .npy files (and directories) are skipped, as np.load leaves them
 * bytes. Stored members are random-access; deflated ones are inflated whole
 * (zlib, raw deflate) with their size and CRC-32 checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "format_int.h"

#define ZIP_EOCD_SIZE 22
#define ZIP_MAX_COMMENT 65535
#define ZIP_CHUNK ((size_t)1 << 20)

static uint16_t le16(const unsigned char *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}
static uint64_t le64(const unsigned char *p) {
  return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static const char *zip_method_name(unsigned m) {
  switch (m) {
    case 1: return "shrunk";
    case 6: return "imploded";
    case 9: return "deflate64";
    case 12: return "bzip2";
    case 14: return "LZMA";
    case 93: return "zstd";
    case 95: return "xz";
    case 98: return "PPMd";
    case 99: return "AES-encrypted";
    default: return "unknown";
  }
}

/* Where the central directory lies and how many members it lists. */
typedef struct zip_dir {
  uint64_t offset, size, entries, end; /* end: where the EOCD records begin */
} zip_dir;

static pd_code zip_zip64_eocd(stg_file *f, uint64_t eocd_at, zip_dir *d,
                              dev_status *st) {
  const char *fname = stg_file_name(f);
  unsigned char loc[20], rec[56];
  if (eocd_at < 20)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: zip: the end record asks for zip64 but there is no "
                     "zip64 locator",
                     fname);
  PD_TRY(stg__read_at(f, eocd_at - 20, loc, 20, "the zip64 locator", st));
  if (le32(loc) != 0x07064b50)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: zip: the end record asks for zip64 but there is no "
                     "zip64 locator",
                     fname);
  uint64_t at = le64(loc + 8);
  if (at > eocd_at - 20)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: zip: the zip64 end record offset %llu is past the "
                     "locator",
                     fname, (unsigned long long)at);
  PD_TRY(stg__read_at(f, at, rec, 56, "the zip64 end record", st));
  if (le32(rec) != 0x06064b50)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: zip: no zip64 end record at %llu", fname,
                     (unsigned long long)at);
  d->entries = le64(rec + 32);
  d->size = le64(rec + 40);
  d->offset = le64(rec + 48);
  d->end = at;
  return PD_OK;
}

static pd_code zip_find_dir(stg_file *f, zip_dir *d, dev_status *st) {
  const char *fname = stg_file_name(f);
  uint64_t size = stg_file_size(f);
  size_t tail = size < ZIP_EOCD_SIZE + ZIP_MAX_COMMENT
                    ? (size_t)size
                    : ZIP_EOCD_SIZE + ZIP_MAX_COMMENT;
  if (tail < ZIP_EOCD_SIZE)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: truncated: %llu bytes is too short for a zip", fname,
                     (unsigned long long)size);
  unsigned char *buf = malloc(tail);
  if (!buf) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  pd_code rc;
  PD_TRY_GOTO(stg__read_at(f, size - tail, buf, tail, "the zip end", st), rc,
              out);
  size_t i = tail - ZIP_EOCD_SIZE + 1;
  const unsigned char *e = NULL;
  while (i-- > 0)
    if (le32(buf + i) == 0x06054b50 &&
        i + ZIP_EOCD_SIZE + le16(buf + i + 20) <= tail) {
      e = buf + i;
      break;
    }
  if (!e) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: zip: no end of central directory record (not a zip, "
                   "or truncated)",
                   fname);
    goto out;
  }
  uint64_t eocd_at = size - tail + (uint64_t)(e - buf);
  if (le16(e + 4) != 0 || le16(e + 6) != 0) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: zip: a multi-disk archive; expected one file", fname);
    goto out;
  }
  d->entries = le16(e + 10);
  d->size = le32(e + 12);
  d->offset = le32(e + 16);
  d->end = eocd_at;
  if (d->entries == 0xFFFF || d->size == 0xFFFFFFFF || d->offset == 0xFFFFFFFF)
    PD_TRY_GOTO(zip_zip64_eocd(f, eocd_at, d, st), rc, out);
  if (d->offset > d->end || d->size > d->end - d->offset) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: zip: the central directory [%llu, +%llu) passes its "
                   "end record at %llu",
                   fname, (unsigned long long)d->offset,
                   (unsigned long long)d->size, (unsigned long long)d->end);
    goto out;
  }
  if (d->entries > d->size / 46) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: zip: %llu members cannot fit in a %llu-byte central "
                   "directory",
                   fname, (unsigned long long)d->entries,
                   (unsigned long long)d->size);
    goto out;
  }
  rc = PD_OK;
out:
  free(buf);
  return rc;
}

/* Inflates up to `want` bytes of the raw deflate stream at [at, at+clen)
 * into out; *got is what came out (less at the stream's end). */
static pd_code zip_inflate_prefix(stg_file *f, uint64_t at, uint64_t clen,
                                  unsigned char *out, size_t want, size_t *got,
                                  const char *what, dev_status *st) {
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "zlib: inflateInit2 failed");
  unsigned char *in = malloc(65536);
  pd_code rc = PD_OK;
  if (!in) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto out;
  }
  uint64_t pos = 0;
  zs.next_out = out;
  zs.avail_out = (uInt)want;
  while (zs.avail_out > 0) {
    if (zs.avail_in == 0) {
      if (pos == clen) break;
      size_t n = clen - pos < 65536 ? (size_t)(clen - pos) : 65536;
      PD_TRY_GOTO(stg__read_at(f, at + pos, in, n, what, st), rc, out);
      pos += n;
      zs.next_in = in;
      zs.avail_in = (uInt)n;
    }
    int zr = inflate(&zs, Z_NO_FLUSH);
    if (zr == Z_STREAM_END) break;
    if (zr != Z_OK && zr != Z_BUF_ERROR) {
      rc = dev_error(st, PD_DATA_LOSS, "%s: corrupt deflate stream: %s", what,
                     zs.msg ? zs.msg : "zlib error");
      goto out;
    }
  }
  *got = want - zs.avail_out;
out:
  inflateEnd(&zs);
  free(in);
  return rc;
}

/* Reads the .npy header at the start of a member into e. */
static pd_code zip_member_npy(stg_file *f, stg_entry *e, uint64_t data,
                              uint64_t clen, const char *what, dev_status *st) {
  uint64_t need = e->member_bytes < 4096 ? e->member_bytes : 4096;
  unsigned char *buf = NULL;
  pd_code rc;
  stg_npy_header h;
  for (int pass = 0; pass < 2; pass++) {
    unsigned char *nb = realloc(buf, need ? (size_t)need : 1);
    if (!nb) {
      rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
      goto out;
    }
    buf = nb;
    size_t got = (size_t)need;
    if (e->compression == 0)
      PD_TRY_GOTO(stg__read_at(f, data, buf, got, what, st), rc, out);
    else
      PD_TRY_GOTO(
          zip_inflate_prefix(f, data, clen, buf, (size_t)need, &got, what, st),
          rc, out);
    uint64_t more = 0;
    rc = stg__npy_parse(buf, got, what, &h, &more, st);
    if (rc != PD_OUT_OF_RANGE) break;
    if (more > e->member_bytes || got < need) {
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: truncated: the .npy header needs %llu bytes but "
                     "the member has %llu",
                     what, (unsigned long long)more,
                     (unsigned long long)e->member_bytes);
      goto out;
    }
    need = more;
  }
  if (rc != PD_OK) goto out;
  if (h.bytes > e->member_bytes - h.header_bytes) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "%s: truncated: the .npy data needs %llu bytes after the "
                   "header but the member holds %llu",
                   what, (unsigned long long)h.bytes,
                   (unsigned long long)(e->member_bytes - h.header_bytes));
    goto out;
  }
  stg__npy_fill_entry(&h, e);
  e->file_offset = e->compression == 0 ? data + h.header_bytes : data;
  e->file_bytes = e->compression == 0 ? h.bytes : clen;
out:
  free(buf);
  return rc;
}

/* The zip64 extra field (id 1) replaces saturated sizes and the offset. */
static void zip_extra64(const unsigned char *x, size_t n, uint64_t *usize,
                        uint64_t *csize, uint64_t *loc) {
  size_t i = 0;
  while (i + 4 <= n) {
    unsigned id = le16(x + i), len = le16(x + i + 2);
    const unsigned char *p = x + i + 4, *end = p + len;
    if (i + 4 + len > n) return;
    if (id == 1) {
      if (*usize == 0xFFFFFFFF && p + 8 <= end) *usize = le64(p), p += 8;
      if (*csize == 0xFFFFFFFF && p + 8 <= end) *csize = le64(p), p += 8;
      if (*loc == 0xFFFFFFFF && p + 8 <= end) *loc = le64(p);
      return;
    }
    i += 4 + len;
  }
}

/* One central directory entry at cd[0..left): adds an entry for a .npy
 * member; *used is the record's length. */
static pd_code zip_member(stg_file *f, const zip_dir *d, const unsigned char *c,
                          size_t left, size_t *used, stg_index *ix,
                          dev_status *st) {
  const char *fname = stg_file_name(f);
  if (left < 46 || le32(c) != 0x02014b50)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: zip: a central directory record is malformed", fname);
  unsigned flags = le16(c + 8), method = le16(c + 10);
  size_t nlen = le16(c + 28), xlen = le16(c + 30), clen_ = le16(c + 32);
  if (46 + nlen + xlen + clen_ > left)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: zip: a central directory record passes the "
                     "directory's end",
                     fname);
  *used = 46 + nlen + xlen + clen_;
  uint64_t csize = le32(c + 20), usize = le32(c + 24), loc = le32(c + 42);
  zip_extra64(c + 46 + nlen, xlen, &usize, &csize, &loc);
  char name[512];
  if (nlen == 0 || nlen >= sizeof name || memchr(c + 46, 0, nlen))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: zip: a member name is empty, too long or holds a "
                     "NUL",
                     fname);
  memcpy(name, c + 46, nlen);
  name[nlen] = 0;
  if (nlen < 4 || strcmp(name + nlen - 4, ".npy") != 0)
    return PD_OK; /* not an array (or a directory): np.load leaves it bytes */
  if (!stg__utf8_valid(name, nlen))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: zip: a member name (%zu bytes) is not valid UTF-8; "
                     "tensor names are UTF-8 (NumPy's savez writes them so)",
                     fname, nlen);
  char what[600];
  snprintf(what, sizeof what, "%s: member '%s'", fname, name);
  if (flags & 1)
    return dev_error(st, PD_UNIMPLEMENTED, "%s is encrypted", what);
  if (method != 0 && method != 8)
    return dev_error(st, PD_UNIMPLEMENTED,
                     "%s is compressed with method %u (%s); paradev reads "
                     "stored (0) and deflated (8) members",
                     what, method, zip_method_name(method));
  if (method == 0 && csize != usize)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: stored but its sizes differ (%llu compressed, %llu "
                     "not)",
                     what, (unsigned long long)csize,
                     (unsigned long long)usize);
  /* Deflate expands at most 1032:1 (zlib's FAQ): a larger claim is a lie
   * that would make a reader allocate for nothing. */
  if (method == 8 && usize / 1032 > csize + 1)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s claims %llu bytes from %llu deflated ones; deflate "
                     "cannot expand more than 1032:1",
                     what, (unsigned long long)usize,
                     (unsigned long long)csize);
  unsigned char lh[30];
  if (loc > d->offset)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: its local header offset %llu is past the central "
                     "directory",
                     what, (unsigned long long)loc);
  PD_TRY(stg__read_at(f, loc, lh, 30, "a zip local header", st));
  if (le32(lh) != 0x04034b50)
    return dev_error(st, PD_INVALID_ARGUMENT, "%s: no local header at %llu",
                     what, (unsigned long long)loc);
  uint64_t data = loc + 30 + le16(lh + 26) + le16(lh + 28);
  if (data > d->offset || csize > d->offset - data)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "%s: truncated: its data [%llu, +%llu) passes the "
                     "central directory at %llu",
                     what, (unsigned long long)data, (unsigned long long)csize,
                     (unsigned long long)d->offset);
  name[nlen - 4] = 0;
  if (stg_index_find(ix, name))
    return dev_error(st, PD_INVALID_ARGUMENT, "%s appears more than once",
                     what);
  stg_entry *e;
  PD_TRY(stg__index_add(ix, name, &e, st));
  e->compression = (int)method;
  e->member_bytes = usize;
  e->crc32 = le32(c + 16);
  return zip_member_npy(f, e, data, csize, what, st);
}

pd_code stg__npz_index(stg_file *f, stg_index *ix, dev_status *st) {
  zip_dir d;
  PD_TRY(zip_find_dir(f, &d, st));
  unsigned char *cd = malloc(d.size ? (size_t)d.size : 1);
  if (!cd)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "out of host memory for a %llu-byte zip directory",
                     (unsigned long long)d.size);
  pd_code rc;
  PD_TRY_GOTO(stg__read_at(f, d.offset, cd, (size_t)d.size,
                           "the zip central directory", st),
              rc, out);
  size_t at = 0;
  for (uint64_t i = 0; i < d.entries; i++) {
    size_t used = 0;
    PD_TRY_GOTO(zip_member(f, &d, cd + at, (size_t)d.size - at, &used, ix, st),
                rc, out);
    at += used;
  }
  rc = PD_OK;
out:
  free(cd);
  return rc;
}

pd_code stg__npz_check_stored(stg_file *f, const stg_entry *e, const void *data,
                              dev_status *st) {
  uint64_t rest = e->member_bytes - e->header_bytes - e->bytes;
  size_t n = (size_t)(e->header_bytes > rest ? e->header_bytes : rest);
  unsigned char *buf = malloc(n ? n : 1);
  if (!buf) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  pd_code rc;
  uLong crc = crc32(0L, Z_NULL, 0);
  PD_TRY_GOTO(stg__read_at(f, e->file_offset - e->header_bytes, buf,
                           (size_t)e->header_bytes, "a member's header", st),
              rc, out);
  crc = crc32(crc, buf, (uInt)e->header_bytes);
  for (uint64_t done = 0; done < e->bytes;) { /* crc32 takes uInt lengths */
    uint64_t k = e->bytes - done < ZIP_CHUNK ? e->bytes - done : ZIP_CHUNK;
    crc = crc32(crc, (const Bytef *)data + done, (uInt)k);
    done += k;
  }
  PD_TRY_GOTO(stg__read_at(f, e->file_offset + e->bytes, buf, (size_t)rest,
                           "a member's tail", st),
              rc, out);
  crc = crc32(crc, buf, (uInt)rest);
  rc = (uint32_t)crc == e->crc32
           ? PD_OK
           : dev_error(st, PD_DATA_LOSS,
                       "%s: member '%s.npy': CRC-32 %08x does not match the "
                       "archive's %08x",
                       stg_file_name(f), e->name, (unsigned)crc,
                       (unsigned)e->crc32);
out:
  free(buf);
  return rc;
}

/* The output of the inflate loop: the member's .npy header and anything
 * after the value go to a scratch buffer, the value to dst. */
static void zip_out_window(z_stream *zs, const stg_entry *e, uint64_t done,
                           unsigned char *dst, unsigned char *scratch) {
  uint64_t hb = e->header_bytes, vend = hb + e->bytes, n;
  if (done < hb || done >= vend) {
    n = done < hb ? hb - done : ZIP_CHUNK;
    zs->next_out = scratch;
  } else {
    n = vend - done;
    zs->next_out = dst + (done - hb);
  }
  zs->avail_out = (uInt)(n < ZIP_CHUNK ? n : ZIP_CHUNK);
}

pd_code stg__npz_inflate(stg_file *f, const stg_entry *e, void *dst,
                         dev_status *st) {
  const char *fname = stg_file_name(f);
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "zlib: inflateInit2 failed");
  unsigned char *in = malloc(ZIP_CHUNK), *scratch = malloc(ZIP_CHUNK);
  pd_code rc = PD_OK;
  if (!in || !scratch) {
    rc = dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto out;
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t pos = 0, done = 0;
  for (;;) {
    if (zs.avail_in == 0 && pos < e->file_bytes) {
      uint64_t left = e->file_bytes - pos;
      size_t n = left < ZIP_CHUNK ? (size_t)left : ZIP_CHUNK;
      PD_TRY_GOTO(
          stg__read_at(f, e->file_offset + pos, in, n, "a deflated member", st),
          rc, out);
      pos += n;
      zs.next_in = in;
      zs.avail_in = (uInt)n;
    }
    zip_out_window(&zs, e, done, dst, scratch);
    unsigned char *start = zs.next_out;
    uInt room = zs.avail_out;
    int zr = inflate(&zs, Z_NO_FLUSH);
    crc = crc32(crc, start, room - zs.avail_out);
    done += room - zs.avail_out;
    if (zr == Z_STREAM_END) break;
    if ((zr != Z_OK && zr != Z_BUF_ERROR) ||
        (zr == Z_BUF_ERROR && pos == e->file_bytes && zs.avail_in == 0) ||
        done > e->member_bytes) {
      rc =
          dev_error(st, PD_DATA_LOSS, "%s: member '%s.npy': %s", fname, e->name,
                    done > e->member_bytes
                        ? "inflates to more bytes than the archive says"
                    : zr == Z_BUF_ERROR ? "the deflate stream is cut short"
                                        : (zs.msg ? zs.msg : "corrupt data"));
      goto out;
    }
  }
  if (done != e->member_bytes)
    rc = dev_error(st, PD_DATA_LOSS,
                   "%s: member '%s.npy' inflates to %llu bytes; the archive "
                   "says %llu",
                   fname, e->name, (unsigned long long)done,
                   (unsigned long long)e->member_bytes);
  else if ((uint32_t)crc != e->crc32)
    rc = dev_error(st, PD_DATA_LOSS,
                   "%s: member '%s.npy': CRC-32 %08x does not match the "
                   "archive's %08x",
                   fname, e->name, (unsigned)crc, (unsigned)e->crc32);
out:
  inflateEnd(&zs);
  free(in);
  free(scratch);
  return rc;
}
