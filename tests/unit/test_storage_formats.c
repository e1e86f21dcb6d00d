/* storage/'s formats on files built byte by byte here: every rejection of
 * the reference readers (a table: the file, the code, a piece of the
 * message), the transforms of stg_entry_read (byte swap, Fortran order,
 * inflate, CRC), and the writers' exact bytes. The bit-exact interop with
 * NumPy and the safetensors package is storage_formats_interop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <cmocka.h>

#include "storage.h"

static char tmpdir[] = "/tmp/paradev-formats-XXXXXX";
static stg_cache *cache;
static stg_roots *roots;

/* --- building files ---------------------------------------------------------- */

typedef struct buf {
  unsigned char *p;
  size_t n, cap;
} buf;

static void put(buf *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    assert_non_null(b->p);
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}
static void put_s(buf *b, const char *s) { put(b, s, strlen(s)); }
static void put_le(buf *b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) {
    unsigned char c = (unsigned char)(v >> (8 * i));
    put(b, &c, 1);
  }
}
static void put_zeros(buf *b, size_t n) {
  for (size_t i = 0; i < n; i++) put(b, "", 1);
}

/* A safetensors file: the header text as given, then `data` zero bytes. */
static buf st_file(const char *header, size_t data) {
  buf b = {0};
  put_le(&b, strlen(header), 8);
  put_s(&b, header);
  put_zeros(&b, data);
  return b;
}

/* A .npy file: version major.0, the dict as given (no padding), data. */
static buf npy_file(int major, const char *dict, const void *data, size_t n) {
  buf b = {0};
  put(&b, "\x93NUMPY", 6);
  unsigned char v[2] = {(unsigned char)major, 0};
  put(&b, v, 2);
  put_le(&b, strlen(dict), major == 1 ? 2 : 4);
  put_s(&b, dict);
  if (n) put(&b, data, n);
  return b;
}

/* A zip of members (name, bytes, method, flags); deflated members are
 * compressed here with zlib (raw deflate). crc_xor spoils the CRC. */
typedef struct member {
  const char *name;
  buf data;
  int method;
  unsigned flags;
  uint32_t crc_xor;
} member;

static buf zip_file(member *m, int n) {
  buf z = {0}, cd = {0};
  for (int i = 0; i < n; i++) {
    uint32_t crc =
        (uint32_t)crc32(0, m[i].data.p, (uInt)m[i].data.n) ^ m[i].crc_xor;
    buf comp = {0};
    if (m[i].method == 8) {
      z_stream zs;
      memset(&zs, 0, sizeof zs);
      assert_int_equal(
          deflateInit2(&zs, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
          Z_OK);
      comp.cap = deflateBound(&zs, m[i].data.n);
      comp.p = malloc(comp.cap);
      zs.next_in = m[i].data.p;
      zs.avail_in = (uInt)m[i].data.n;
      zs.next_out = comp.p;
      zs.avail_out = (uInt)comp.cap;
      assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
      comp.n = zs.total_out;
      deflateEnd(&zs);
    } else {
      put(&comp, m[i].data.p, m[i].data.n);
    }
    size_t at = z.n, nl = strlen(m[i].name);
    put_le(&z, 0x04034b50, 4);
    put_le(&z, 20, 2);
    put_le(&z, m[i].flags, 2);
    put_le(&z, (uint64_t)m[i].method, 2);
    put_le(&z, 0, 4);
    put_le(&z, crc, 4);
    put_le(&z, comp.n, 4);
    put_le(&z, m[i].data.n, 4);
    put_le(&z, nl, 2);
    put_le(&z, 0, 2);
    put_s(&z, m[i].name);
    put(&z, comp.p, comp.n);
    put_le(&cd, 0x02014b50, 4);
    put_le(&cd, 20, 2);
    put_le(&cd, 20, 2);
    put_le(&cd, m[i].flags, 2);
    put_le(&cd, (uint64_t)m[i].method, 2);
    put_le(&cd, 0, 4);
    put_le(&cd, crc, 4);
    put_le(&cd, comp.n, 4);
    put_le(&cd, m[i].data.n, 4);
    put_le(&cd, nl, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 4);
    put_le(&cd, at, 4);
    put_s(&cd, m[i].name);
    free(comp.p);
  }
  size_t cd_at = z.n;
  put(&z, cd.p, cd.n);
  put_le(&z, 0x06054b50, 4);
  put_le(&z, 0, 4);
  put_le(&z, (uint64_t)n, 2);
  put_le(&z, (uint64_t)n, 2);
  put_le(&z, cd.n, 4);
  put_le(&z, cd_at, 4);
  put_le(&z, 0, 2);
  free(cd.p);
  return z;
}

static const char *write_tmp(const char *name, const buf *b) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  if (b->n) assert_int_equal(fwrite(b->p, 1, b->n, fp), b->n);
  fclose(fp);
  return path;
}

static stg_file *open_tmp(const char *name, const buf *b) {
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  const char *path = write_tmp(name, b);
  assert_int_equal(stg_file_open(cache, roots, path, &f, &st), PD_OK);
  return f;
}

/* Reads the index of file `name` holding b, expecting `code` and `needle`. */
static void expect_index_as(const char *name, buf b, stg_format format,
                            pd_code code, const char *needle) {
  stg_file *f = open_tmp(name, &b);
  stg_index *ix = NULL;
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = stg_index_read(f, format, &ix, &st);
  if (rc != code || (needle && !strstr(st.msg, needle)))
    fail_msg("%s: got %s \"%s\"; expected %s with \"%s\"", name,
             pd_code_name(rc), st.msg, pd_code_name(code),
             needle ? needle : "");
  if (code != PD_OK) {
    assert_null(ix);
    assert_non_null(strstr(st.msg, name)); /* every message names the file */
  }
  stg_index_free(ix);
  stg_file_close(f);
  free(b.p);
}

static void expect_index(const char *name, buf b, pd_code code,
                         const char *needle) {
  expect_index_as(name, b, STG_FORMAT_AUTO, code, needle);
}

/* --- the table of malformed files --------------------------------------------- */

static void test_safetensors_rejections(void **state) {
  (void)state;
  buf b = {0};
  put_le(&b, 200000000, 8);
  put_s(&b, "{}");
  expect_index("big.safetensors", b, PD_INVALID_ARGUMENT,
               "over the limit of 100000000");
  b = (buf){0};
  put_le(&b, 100, 8);
  put_s(&b, "{\"a\":1}");
  expect_index("past.safetensors", b, PD_INVALID_ARGUMENT,
               "passes the end of the file");
  b = (buf){0};
  put_s(&b, "abc");
  expect_index("short.safetensors", b, PD_INVALID_ARGUMENT, "truncated");
  /* An .npz or .npy read as safetensors: its magic is named, not a huge
   * header length ("PK\3\4" reads as 85966670672 in 8 bytes). */
  b = (buf){0};
  put(&b, "PK\x03\x04\x14\x00\x00\x00", 8);
  put_s(&b, "zip member data");
  expect_index_as("zip.npz", b, STG_FORMAT_SAFETENSORS, PD_INVALID_ARGUMENT,
                  "not a safetensors file: its first bytes are a zip "
                  "archive's (an .npz); load it with format npz");
  b = (buf){0};
  put(&b, "\x93NUMPY\x01\x00", 8);
  put_s(&b, "{'descr': '<f4'}");
  expect_index_as("magic.npy", b, STG_FORMAT_SAFETENSORS, PD_INVALID_ARGUMENT,
                  "its first bytes are the .npy magic; load it with format "
                  "npy");
  expect_index("utf8.safetensors", st_file("{\"a\xff\":{}}", 0),
               PD_INVALID_ARGUMENT, "not valid UTF-8");
  expect_index("json.safetensors", st_file("{\"a\": [1, }", 0),
               PD_INVALID_ARGUMENT, "not valid JSON");
  expect_index("array.safetensors", st_file("[1, 2]", 0), PD_INVALID_ARGUMENT,
               "does not start with '{'");
  expect_index("missing.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4),
               PD_INVALID_ARGUMENT, "lacks \"data_offsets\"");
  expect_index("extra.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                       "\"data_offsets\":[0,4],\"x\":1}}",
                       4),
               PD_INVALID_ARGUMENT, "unknown key \"x\"");
  expect_index("overlap.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                       "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\","
                       "\"shape\":[2],\"data_offsets\":[4,12]}}",
                       12),
               PD_INVALID_ARGUMENT, "overlaps tensor \"a\"");
  expect_index("hole.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                       "\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\","
                       "\"shape\":[1],\"data_offsets\":[8,12]}}",
                       12),
               PD_INVALID_ARGUMENT, "a hole: bytes [4, 8)");
  expect_index("size.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                       "\"data_offsets\":[0,4]}}",
                       4),
               PD_INVALID_ARGUMENT, "hold 4 bytes but F32 of shape [2] is 8");
  expect_index("overflow.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":"
                       "[4611686018427387904,4],\"data_offsets\":[0,4]}}",
                       4),
               PD_INVALID_ARGUMENT, "overflows");
  expect_index("trailing.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                       "\"data_offsets\":[0,4]}}",
                       6),
               PD_INVALID_ARGUMENT, "2 trailing bytes");
  expect_index("cut.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                       "\"data_offsets\":[0,8]}}",
                       5),
               PD_INVALID_ARGUMENT, "truncated");
  expect_index("negative.safetensors",
               st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],"
                       "\"data_offsets\":[0,0]}}",
                       0),
               PD_INVALID_ARGUMENT, "dims must be non-negative");
  expect_index("rank.safetensors",
               st_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                       "\"data_offsets\":[0,1]}}",
                       1),
               PD_INVALID_ARGUMENT, "rank 9");
  expect_index("dup.safetensors",
               st_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
                       "\"data_offsets\":[0,1]},\"a\":{\"dtype\":\"U8\","
                       "\"shape\":[1],\"data_offsets\":[1,2]}}",
                       2),
               PD_INVALID_ARGUMENT, "\"a\" appears more than once");
  /* json-c would cut these names at the NUL (two keys "a" then, and a
   * misleading duplicate "") or put U+FFFD for the lone surrogate. */
  expect_index(
      "nul.safetensors",
      st_file("{\"a\\u0000x\":{\"dtype\":\"U8\",\"shape\":[1],"
              "\"data_offsets\":[0,1]},\"a\\u0000y\":{\"dtype\":\"U8\","
              "\"shape\":[1],\"data_offsets\":[1,2]}}",
              2),
      PD_INVALID_ARGUMENT,
      "nul.safetensors: safetensors header: the name "
      "\"a\\u0000x\" holds a NUL byte");
  expect_index("surrogate.safetensors",
               st_file("{\"a\\udc80\":{\"dtype\":\"U8\",\"shape\":[1],"
                       "\"data_offsets\":[0,1]}}",
                       1),
               PD_INVALID_ARGUMENT, "unpaired UTF-16 surrogate (\\udc80)");
  expect_index(
      "metanul.safetensors",
      st_file("{\"__metadata__\":{\"k\":\"v\\u0000w\"},\"a\":{"
              "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
              1),
      PD_INVALID_ARGUMENT, "the string \"v\\u0000w\" holds a NUL");
  expect_index("unknown.safetensors",
               st_file("{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],"
                       "\"data_offsets\":[0,1]}}",
                       1),
               PD_INVALID_ARGUMENT, "unknown dtype \"Q7\"");
  expect_index("i8.safetensors",
               st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],"
                       "\"data_offsets\":[0,1]},\"q\":{\"dtype\":\"I8\","
                       "\"shape\":[2],\"data_offsets\":[1,3]}}",
                       3),
               PD_UNIMPLEMENTED, "tensor \"q\" has dtype I8");
  expect_index("f8.safetensors",
               st_file("{\"f\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],"
                       "\"data_offsets\":[0,2]}}",
                       2),
               PD_UNIMPLEMENTED, "F8_E4M3");
  expect_index("meta.safetensors", st_file("{\"__metadata__\":{\"k\":1}}", 0),
               PD_INVALID_ARGUMENT, "metadata values must be strings");
  expect_index("garbage.safetensors",
               st_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
                       "\"data_offsets\":[0,1]}} xy",
                       1),
               PD_INVALID_ARGUMENT, "safetensors header");
  /* A header that says it is shorter than its JSON: the JSON is cut. */
  const char *h =
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  b = (buf){0};
  put_le(&b, 20, 8);
  put_s(&b, h);
  put_zeros(&b, 1);
  expect_index("lies.safetensors", b, PD_INVALID_ARGUMENT, "not valid JSON");
  /* ... and one that says it is longer: the data becomes header. */
  b = (buf){0};
  put_le(&b, strlen(h) + 1, 8);
  put_s(&b, h);
  put(&b, "\x07", 1);
  expect_index("lies2.safetensors", b, PD_INVALID_ARGUMENT,
               "safetensors header");
}

static void test_npy_rejections(void **state) {
  (void)state;
  float four[4] = {1, 2, 3, 4};
  buf b = npy_file(
      1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four, 16);
  b.p[5] = 'X';
  expect_index("magic.npy", b, PD_INVALID_ARGUMENT, "not a .npy file");
  b = npy_file(4, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
               four, 16);
  expect_index("version.npy", b, PD_INVALID_ARGUMENT, "format version 4.0");
  b = (buf){0};
  put(&b, "\x93NUMPY\x02\x00", 8);
  put_le(&b, 0x7fffffff, 4);
  put_s(&b, "{'descr'");
  expect_index("hugeheader.npy", b, PD_INVALID_ARGUMENT,
               "header length 2147483647 is over the limit");
  b = (buf){0};
  put(&b, "\x93NUMPY\x01\x00", 8);
  put_le(&b, 1000, 2);
  put_s(&b, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }");
  expect_index("lies.npy", b, PD_INVALID_ARGUMENT,
               "truncated: the .npy header needs 1010 bytes");
  expect_index("nokey.npy",
               npy_file(1, "{'descr': '<f4', 'shape': (4,), }", four, 16),
               PD_INVALID_ARGUMENT, "lacks 'fortran_order'");
  expect_index("extrakey.npy",
               npy_file(1,
                        "{'descr': '<f4', 'fortran_order': False, 'shape': "
                        "(4,), 'x': 1}",
                        four, 16),
               PD_INVALID_ARGUMENT, "unknown key 'x'");
  expect_index(
      "descr.npy",
      npy_file(1, "{'descr': 'xyz', 'fortran_order': False, 'shape': (4,)}",
               four, 16),
      PD_INVALID_ARGUMENT, "not a NumPy dtype");
  expect_index(
      "int16.npy",
      npy_file(1, "{'descr': '<i2', 'fortran_order': False, 'shape': (8,)}",
               four, 16),
      PD_UNIMPLEMENTED, "'<i2'");
  expect_index(
      "object.npy",
      npy_file(1, "{'descr': '|O', 'fortran_order': False, 'shape': (2,)}",
               four, 16),
      PD_UNIMPLEMENTED, "'|O'");
  expect_index("struct.npy",
               npy_file(1,
                        "{'descr': [('a', '<f4')], 'fortran_order': False, "
                        "'shape': (4,)}",
                        four, 16),
               PD_UNIMPLEMENTED, "structured");
  expect_index(
      "data.npy",
      npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (10,)}",
               four, 16),
      PD_INVALID_ARGUMENT, "truncated: the .npy data needs 40 bytes");
  expect_index(
      "tuple.npy",
      npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4)}",
               four, 16),
      PD_INVALID_ARGUMENT, "a comma after the only dim");
  expect_index(
      "negdim.npy",
      npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-4,)}",
               four, 16),
      PD_INVALID_ARGUMENT, "non-negative integer dim");
  expect_index(
      "fortran.npy",
      npy_file(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (4,)}", four,
               16),
      PD_INVALID_ARGUMENT, "True or False");
  expect_index("repeat.npy",
               npy_file(1,
                        "{'descr': '<f4', 'descr': '<f4', 'fortran_order': "
                        "False, 'shape': (4,)}",
                        four, 16),
               PD_INVALID_ARGUMENT, "repeats the key 'descr'");
  b = (buf){0};
  put_s(&b, "hello");
  expect_index("what.bin", b, PD_INVALID_ARGUMENT, "cannot tell the format");
}

static buf npy_member(void) {
  int32_t v[3] = {7, -8, 9};
  return npy_file(1,
                  "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
                  v, sizeof v);
}

static void test_npz_rejections(void **state) {
  (void)state;
  member m = {"a.npy", npy_member(), 12, 0, 0};
  expect_index("bzip2.npz", zip_file(&m, 1), PD_UNIMPLEMENTED,
               "member 'a.npy' is compressed with method 12 (bzip2)");
  free(m.data.p);
  m = (member){"a.npy", npy_member(), 0, 1, 0};
  expect_index("crypt.npz", zip_file(&m, 1), PD_UNIMPLEMENTED, "encrypted");
  free(m.data.p);
  m = (member){"a.npy", npy_member(), 0, 0, 0};
  buf z = zip_file(&m, 1);
  z.n -= 10; /* the end record cut off */
  expect_index("cut.npz", z, PD_INVALID_ARGUMENT,
               "no end of central directory record");
  free(m.data.p);
  m = (member){"\xff\xfe.npy", npy_member(), 0, 0, 0};
  expect_index("latin.npz", zip_file(&m, 1), PD_INVALID_ARGUMENT,
               "a member name (6 bytes) is not valid UTF-8");
  free(m.data.p);
  member two[2] = {{"a.npy", npy_member(), 0, 0, 0},
                   {"a.npy", npy_member(), 8, 0, 0}};
  expect_index("twice.npz", zip_file(two, 2), PD_INVALID_ARGUMENT,
               "appears more than once");
  free(two[0].data.p);
  free(two[1].data.p);
  m = (member){"a.npy", npy_member(), 8, 0, 0};
  z = zip_file(&m, 1);
  size_t cd_at = z.n - 22 - (46 + strlen("a.npy"));
  z.p[cd_at + 24 + 3] = 0x70; /* the uncompressed size: ~1.9 GB */
  expect_index("bomb.npz", z, PD_INVALID_ARGUMENT, "cannot expand more than");
  free(m.data.p);
  buf short_npy = npy_member();
  short_npy.n -= 4; /* the member's value is one element short */
  m = (member){"s.npy", short_npy, 8, 0, 0};
  expect_index("shortmember.npz", zip_file(&m, 1), PD_INVALID_ARGUMENT,
               "truncated: the .npy data needs 12 bytes");
  free(m.data.p);
}

/* One stored member in a zip whose every size and offset is in zip64 form:
 * the central directory's sizes and offset saturated with a zip64 extra
 * field, the end record saturated, a zip64 end record and its locator. */
static buf zip64_file(const char *name, const buf *data) {
  buf z = {0};
  uint32_t crc = (uint32_t)crc32(0, data->p, (uInt)data->n);
  size_t nl = strlen(name);
  put_le(&z, 0x04034b50, 4);
  put_le(&z, 45, 2);
  put_le(&z, 0, 2);
  put_le(&z, 0, 2);
  put_le(&z, 0, 4);
  put_le(&z, crc, 4);
  put_le(&z, 0xFFFFFFFF, 4);
  put_le(&z, 0xFFFFFFFF, 4);
  put_le(&z, nl, 2);
  put_le(&z, 20, 2);
  put_s(&z, name);
  put_le(&z, 1, 2); /* local zip64 extra: sizes */
  put_le(&z, 16, 2);
  put_le(&z, data->n, 8);
  put_le(&z, data->n, 8);
  put(&z, data->p, data->n);
  size_t cd_at = z.n;
  put_le(&z, 0x02014b50, 4);
  put_le(&z, 45, 2);
  put_le(&z, 45, 2);
  put_le(&z, 0, 2);
  put_le(&z, 0, 2);
  put_le(&z, 0, 4);
  put_le(&z, crc, 4);
  put_le(&z, 0xFFFFFFFF, 4);
  put_le(&z, 0xFFFFFFFF, 4);
  put_le(&z, nl, 2);
  put_le(&z, 28, 2);
  put_le(&z, 0, 2);
  put_le(&z, 0, 2);
  put_le(&z, 0, 2);
  put_le(&z, 0, 4);
  put_le(&z, 0xFFFFFFFF, 4);
  put_s(&z, name);
  put_le(&z, 1, 2); /* zip64 extra: uncompressed, compressed, offset */
  put_le(&z, 24, 2);
  put_le(&z, data->n, 8);
  put_le(&z, data->n, 8);
  put_le(&z, 0, 8);
  size_t cd_size = z.n - cd_at, eocd64_at = z.n;
  put_le(&z, 0x06064b50, 4);
  put_le(&z, 44, 8);
  put_le(&z, 45, 2);
  put_le(&z, 45, 2);
  put_le(&z, 0, 4);
  put_le(&z, 0, 4);
  put_le(&z, 1, 8);
  put_le(&z, 1, 8);
  put_le(&z, cd_size, 8);
  put_le(&z, cd_at, 8);
  put_le(&z, 0x07064b50, 4);
  put_le(&z, 0, 4);
  put_le(&z, eocd64_at, 8);
  put_le(&z, 1, 4);
  put_le(&z, 0x06054b50, 4);
  put_le(&z, 0, 4);
  put_le(&z, 0xFFFF, 2);
  put_le(&z, 0xFFFF, 2);
  put_le(&z, 0xFFFFFFFF, 4);
  put_le(&z, 0xFFFFFFFF, 4);
  put_le(&z, 0, 2);
  return z;
}

static void test_npz_zip64(void **state) {
  (void)state;
  buf one = npy_member();
  buf z = zip64_file("k.npy", &one);
  stg_file *f = open_tmp("zip64.npz", &z);
  stg_index *ix = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (stg_index_read(f, STG_FORMAT_AUTO, &ix, &st) != PD_OK)
    fail_msg("zip64: %s", st.msg);
  assert_int_equal(ix->n, 1);
  const stg_entry *e = stg_index_find(ix, "k");
  assert_non_null(e);
  assert_true(stg_entry_random_access(e));
  int32_t got[3];
  const int32_t want[3] = {7, -8, 9};
  assert_int_equal(stg_entry_read(f, e, 0, got, sizeof got, &st), PD_OK);
  assert_memory_equal(got, want, sizeof want);
  stg_index_free(ix);
  stg_file_close(f);
  /* Without its locator the saturated end record is a lie. */
  size_t loc_at = z.n - 22 - 20;
  z.p[loc_at] ^= 0xFF;
  expect_index("zip64bad.npz", z, PD_INVALID_ARGUMENT, "zip64 locator");
  free(one.p);
}

/* A CRC that does not match fails the whole-value read, stored or not. */
static void test_npz_crc(void **state) {
  (void)state;
  for (int method = 0; method <= 8; method += 8) {
    member m = {"a.npy", npy_member(), method, 0, 0x10};
    buf z = zip_file(&m, 1);
    stg_file *f = open_tmp("crc.npz", &z);
    stg_index *ix = NULL;
    dev_status st = DEV_STATUS_INIT;
    assert_int_equal(stg_index_read(f, STG_FORMAT_AUTO, &ix, &st), PD_OK);
    const stg_entry *e = stg_index_find(ix, "a");
    assert_non_null(e);
    int32_t got[3];
    assert_int_equal(stg_entry_read(f, e, 0, got, 12, &st), PD_DATA_LOSS);
    assert_non_null(strstr(st.msg, "CRC-32"));
    if (method == 0) /* a part of a stored member is read without a CRC */
      assert_int_equal(stg_entry_read(f, e, 4, got, 4, &st), PD_OK);
    stg_index_free(ix);
    stg_file_close(f);
    free(z.p);
    free(m.data.p);
  }
}

/* A deflate stream that is corrupt is DATA_LOSS, not a crash. */
static void test_npz_corrupt_deflate(void **state) {
  (void)state;
  float big[4096];
  for (int i = 0; i < 4096; i++) big[i] = (float)i;
  member m = {
      "b.npy",
      npy_file(1,
               "{'descr': '<f4', 'fortran_order': False, 'shape': (4096,), }",
               big, sizeof big),
      8, 0, 0};
  buf z = zip_file(&m, 1);
  /* Spoil bytes near the end of the compressed data (so that the header
   * still inflates): it ends where the central directory begins. */
  size_t cd_at = z.n - 22 - (46 + strlen("b.npy"));
  for (size_t i = cd_at - 100; i < cd_at - 80; i++) z.p[i] ^= 0x5a;
  stg_file *f = open_tmp("corrupt.npz", &z);
  stg_index *ix = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(stg_index_read(f, STG_FORMAT_AUTO, &ix, &st), PD_OK);
  float *got = malloc(sizeof big);
  assert_int_equal(stg_entry_read(f, &ix->entries[0], 0, got, sizeof big, &st),
                   PD_DATA_LOSS);
  free(got);
  stg_index_free(ix);
  stg_file_close(f);
  free(z.p);
  free(m.data.p);
}

/* --- what stg_entry_read turns the stored bytes into -------------------------- */

/* A big-endian Fortran-order (2, 3) int32 array: values 10*i + j. */
static void test_npy_fortran_big_endian(void **state) {
  (void)state;
  unsigned char raw[24];
  int k = 0;
  for (int j = 0; j < 3; j++) /* column-major: i fastest */
    for (int i = 0; i < 2; i++) {
      uint32_t v = (uint32_t)(10 * i + j);
      raw[k++] = (unsigned char)(v >> 24);
      raw[k++] = (unsigned char)(v >> 16);
      raw[k++] = (unsigned char)(v >> 8);
      raw[k++] = (unsigned char)v;
    }
  buf b =
      npy_file(1, "{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }",
               raw, sizeof raw);
  stg_file *f = open_tmp("fortran.npy", &b);
  stg_index *ix = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(stg_index_read(f, STG_FORMAT_AUTO, &ix, &st), PD_OK);
  assert_int_equal(ix->format, STG_FORMAT_NPY);
  assert_int_equal(ix->n, 1);
  const stg_entry *e = stg_index_find(ix, "");
  assert_non_null(e);
  assert_int_equal(e->dtype, PD_INT32);
  assert_int_equal(e->shape.rank, 2);
  assert_int_equal(e->shape.dims[0], 2);
  assert_int_equal(e->shape.dims[1], 3);
  assert_true(e->byteswap && e->fortran_order);
  assert_false(stg_entry_random_access(e));
  int32_t got[6];
  assert_int_equal(stg_entry_read(f, e, 4, got, 8, &st), PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "must be read whole"));
  assert_int_equal(stg_entry_read(f, e, 0, got, sizeof got, &st), PD_OK);
  const int32_t want[6] = {0, 1, 2, 10, 11, 12};
  assert_memory_equal(got, want, sizeof want);
  assert_int_equal(stg_entry_read(f, e, 0, got, 28, &st), PD_OUT_OF_RANGE);
  stg_index_free(ix);
  stg_file_close(f);
  free(b.p);
}

/* Unaligned safetensors data (a 1-byte tensor first), metadata, find. */
static void test_safetensors_read(void **state) {
  (void)state;
  const char *h =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"b\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[1,17]},"
      "\"a\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[0,1]},"
      "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[17,17]}}";
  buf b = {0};
  put_le(&b, strlen(h), 8);
  put_s(&b, h);
  put(&b, "\x01", 1);
  double d[2] = {1.5, -2.25};
  put(&b, d, sizeof d);
  stg_file *f = open_tmp("noext", &b); /* found by its first bytes */
  stg_index *ix = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(stg_index_read(f, STG_FORMAT_AUTO, &ix, &st), PD_OK);
  assert_int_equal(ix->format, STG_FORMAT_SAFETENSORS);
  assert_int_equal(ix->n, 3);
  assert_int_equal(ix->n_meta, 1);
  assert_string_equal(ix->meta_keys[0], "format");
  assert_string_equal(ix->meta_values[0], "pt");
  const stg_entry *e = stg_index_find(ix, "b");
  assert_non_null(e);
  assert_int_equal(e->dtype, PD_FLOAT64);
  assert_int_equal(e->file_offset, 8 + strlen(h) + 1);
  assert_true(stg_entry_random_access(e));
  double got[2];
  assert_int_equal(stg_entry_read(f, e, 0, got, 16, &st), PD_OK);
  assert_memory_equal(got, d, 16);
  assert_int_equal(stg_entry_read(f, e, 8, got, 8, &st), PD_OK);
  assert_memory_equal(got, &d[1], 8);
  e = stg_index_find(ix, "a");
  assert_int_equal(e->dtype, PD_BOOL);
  assert_int_equal(e->shape.rank, 0);
  assert_int_equal(stg_index_find(ix, "z")->bytes, 0);
  assert_null(stg_index_find(ix, "nope"));
  stg_index_free(ix);
  stg_file_close(f);
  free(b.p);
}

/* --- the writers' bytes --------------------------------------------------------- */

static const unsigned char wdata[2][16] = {
    {1, 2, 3, 4, 5, 6, 7, 8},
    {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40}, /* 1.0f, 2.0f */
};

static pd_code wread(void *arg, int tensor, uint64_t offset, void *b,
                     size_t len, dev_status *st) {
  (void)arg, (void)st;
  memcpy(b, wdata[tensor] + offset, len);
  return PD_OK;
}

static buf slurp(const char *path) {
  buf b = {0};
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  unsigned char tmp[4096];
  size_t n;
  while ((n = fread(tmp, 1, sizeof tmp, fp)) > 0) put(&b, tmp, n);
  fclose(fp);
  return b;
}

static void test_write_safetensors(void **state) {
  (void)state;
  stg_save_tensor t[2] = {{"b", PD_FLOAT32, {1, {2}}, 8},
                          {"a", PD_INT64, {1, {1}}, 8}};
  const char *mk[] = {"k"}, *mv[] = {"v"};
  char path[512];
  snprintf(path, sizeof path, "%s/w.safetensors", tmpdir);
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(stg_out_create(roots, path, true, &o, &st), PD_OK);
  /* The reference writer: __metadata__ first, then I64 before F32. */
  assert_int_equal(stg_write_safetensors(o, t, 2, wread, NULL, mk, mv, 1, &st),
                   PD_OK);
  assert_int_equal(stg_out_commit(o, &st), PD_OK);
  const char *want =
      "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"I64\",\"shape\":[1],"
      "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
      "\"data_offsets\":[8,16]}}";
  size_t hl = strlen(want), padded = (hl + 7) / 8 * 8;
  buf b = slurp(path);
  assert_int_equal(b.n, 8 + padded + 16);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | b.p[i];
  assert_int_equal(n, padded);
  assert_memory_equal(b.p + 8, want, hl);
  for (size_t i = hl; i < padded; i++) assert_int_equal(b.p[8 + i], ' ');
  assert_memory_equal(b.p + 8 + padded, wdata[1], 8); /* a */
  assert_memory_equal(b.p + 8 + padded + 8, wdata[0], 8);
  free(b.p);
  /* Refusals: a duplicate name, an empty one, a wrong byte count. */
  stg_save_tensor dup[2] = {{"x", PD_UINT8, {1, {1}}, 1},
                            {"x", PD_UINT8, {1, {1}}, 1}};
  assert_int_equal(stg_out_create(roots, path, true, &o, &st), PD_OK);
  assert_int_equal(
      stg_write_safetensors(o, dup, 2, wread, NULL, NULL, NULL, 0, &st),
      PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "\"x\" appears more than once"));
  dup[1].name = "";
  assert_int_equal(
      stg_write_safetensors(o, dup, 2, wread, NULL, NULL, NULL, 0, &st),
      PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "empty name"));
  dup[1] = (stg_save_tensor){"y", PD_FLOAT32, {1, {3}}, 8};
  assert_int_equal(
      stg_write_safetensors(o, dup, 2, wread, NULL, NULL, NULL, 0, &st),
      PD_INVALID_ARGUMENT);
  assert_non_null(strstr(st.msg, "needs 12"));
  stg_out_abort(o);
}

/* np.save(f, np.array([1.0, 2.0], dtype='<f4')) writes exactly these 128
 * bytes (NumPy 1.24: a 118-byte dict with 20 spaces of growth padding). */
static void test_write_npy(void **state) {
  (void)state;
  stg_save_tensor t = {"", PD_FLOAT32, {1, {2}}, 8};
  char path[512];
  snprintf(path, sizeof path, "%s/w.npy", tmpdir);
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(stg_out_create(roots, path, true, &o, &st), PD_OK);
  assert_int_equal(stg_write_npy(o, &t, wread, (void *)1, &st), PD_OK);
  assert_int_equal(stg_out_commit(o, &st), PD_OK);
  buf b = slurp(path);
  /* tensor 0 of wread is bytes 1..8: 8 data bytes after a 128-byte header */
  assert_int_equal(b.n, 128 + 8);
  assert_memory_equal(b.p, "\x93NUMPY\x01\x00\x76\x00", 10);
  const char *dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  assert_memory_equal(b.p + 10, dict, strlen(dict));
  for (size_t i = 10 + strlen(dict); i < 127; i++)
    assert_int_equal(b.p[i], ' ');
  assert_int_equal(b.p[127], '\n');
  free(b.p);
  t.dtype = PD_BFLOAT16;
  t.bytes = 4;
  assert_int_equal(stg_out_create(roots, path, true, &o, &st), PD_OK);
  assert_int_equal(stg_write_npy(o, &t, wread, NULL, &st), PD_UNIMPLEMENTED);
  assert_non_null(strstr(st.msg, "bfloat16"));
  stg_out_abort(o);
}

static void test_dtype_names(void **state) {
  (void)state;
  static const struct {
    pd_dtype dt;
    const char *name;
  } want[] = {{PD_FLOAT32, "F32"},   {PD_FLOAT64, "F64"}, {PD_FLOAT16, "F16"},
              {PD_BFLOAT16, "BF16"}, {PD_INT32, "I32"},   {PD_INT64, "I64"},
              {PD_UINT8, "U8"},      {PD_BOOL, "BOOL"}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    assert_string_equal(stg_safetensors_dtype_name(want[i].dt), want[i].name);
  assert_null(stg_safetensors_dtype_name(PD_DTYPE_INVALID));
}

/* --- mutations: damaged files give a status, never a crash ------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) { /* xorshift64*, fixed seed: reproducible */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

/* Reads every entry of a damaged file whole; every code must be one a bad
 * file may give (the sanitizer build catches what a bad read would do). */
static void mutate_and_read(const char *name, const buf *orig, int rounds) {
  for (int r = 0; r < rounds; r++) {
    buf b = {0};
    put(&b, orig->p, orig->n);
    int flips = 1 + (int)(rng_next() % 4);
    for (int k = 0; k < flips; k++)
      b.p[rng_next() % b.n] = (unsigned char)rng_next();
    if (rng_next() % 4 == 0) b.n = (size_t)(rng_next() % b.n);
    stg_file *f = open_tmp(name, &b);
    stg_index *ix = NULL;
    dev_status st = DEV_STATUS_INIT;
    pd_code rc = stg_index_read(f, STG_FORMAT_AUTO, &ix, &st);
    if (rc != PD_OK && rc != PD_INVALID_ARGUMENT && rc != PD_UNIMPLEMENTED &&
        rc != PD_DATA_LOSS)
      fail_msg("%s round %d: index %s \"%s\"", name, r, pd_code_name(rc),
               st.msg);
    for (int i = 0; ix && i < ix->n; i++) {
      const stg_entry *e = &ix->entries[i];
      void *v = malloc(e->bytes ? e->bytes : 1);
      assert_non_null(v);
      rc = stg_entry_read(f, e, 0, v, e->bytes, &st);
      if (rc != PD_OK && rc != PD_DATA_LOSS)
        fail_msg("%s round %d: read %s \"%s\"", name, r, pd_code_name(rc),
                 st.msg);
      free(v);
    }
    stg_index_free(ix);
    stg_file_close(f);
    free(b.p);
  }
}

static void test_mutations(void **state) {
  (void)state;
  buf st = st_file(
      "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\","
      "\"shape\":[2,2],\"data_offsets\":[0,16]},\"b\":{\"dtype\":"
      "\"BOOL\",\"shape\":[3],\"data_offsets\":[16,19]}}",
      19);
  mutate_and_read("m.safetensors", &st, 400);
  int32_t v[12];
  for (int i = 0; i < 12; i++) v[i] = i * 1000 - 7;
  buf npy =
      npy_file(1, "{'descr': '>i4', 'fortran_order': True, 'shape': (3, 4), }",
               v, sizeof v);
  mutate_and_read("m.npy", &npy, 400);
  member m[2] = {
      {"x.npy",
       npy_file(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (12,), }",
                v, sizeof v),
       0, 0, 0},
      {"y.npy",
       npy_file(1, "{'descr': '>i4', 'fortran_order': True, 'shape': (3, 4), }",
                v, sizeof v),
       8, 0, 0}};
  buf z = zip_file(m, 2);
  mutate_and_read("m.npz", &z, 800);
  free(st.p);
  free(npy.p);
  free(z.p);
  free(m[0].data.p);
  free(m[1].data.p);
}

static int setup(void **state) {
  (void)state;
  if (!mkdtemp(tmpdir)) return -1;
  dev_status st = DEV_STATUS_INIT;
  const char *root = tmpdir;
  stg_cache_config cfg = {
      STG_CACHE_CONFIG_STRUCT_SIZE, 1 << 16, 1 << 22, 0, 5, 0};
  if (stg_cache_create(&cfg, &cache, &st) != PD_OK ||
      stg_roots_create(&root, 1, &roots, &st) != PD_OK) {
    fprintf(stderr, "setup: %s\n", st.msg);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  stg_roots_destroy(roots);
  stg_cache_destroy(cache);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_safetensors_rejections),
      cmocka_unit_test(test_npy_rejections),
      cmocka_unit_test(test_npz_rejections),
      cmocka_unit_test(test_npz_zip64),
      cmocka_unit_test(test_npz_crc),
      cmocka_unit_test(test_npz_corrupt_deflate),
      cmocka_unit_test(test_npy_fortran_big_endian),
      cmocka_unit_test(test_safetensors_read),
      cmocka_unit_test(test_write_safetensors),
      cmocka_unit_test(test_write_npy),
      cmocka_unit_test(test_dtype_names),
      cmocka_unit_test(test_mutations),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
