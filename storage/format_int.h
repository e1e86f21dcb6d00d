/* Private to storage/'s format files (index.c, safetensors*.c, npy*.c,
 * npz.c, format.c); nothing outside storage/ includes it.
 *
 * Files and what each calls (no circles):
 *   index.c             the index's memory, entry helpers, byte swaps and
 *                       the Fortran-to-C transpose, UTF-8 checks, bounded
 *                       reads of a file's bytes
 *   safetensors.c       -> index.c      the safetensors reader, dtype names
 *   safetensors_write.c -> safetensors.c, index.c
 *   npy.c               -> index.c      the .npy header dict and reader
 *   npy_write.c         -> npy.c, index.c
 *   npz.c               -> npy.c, index.c   zip directory, inflate, CRC
 *   format.c            -> all above    the public entry points
 */
#ifndef PARADEV_STORAGE_FORMAT_INT_H
#define PARADEV_STORAGE_FORMAT_INT_H

#include "storage.h"

/* The reference readers' limits. */
#define STG_SAFETENSORS_MAX_HEADER 100000000u /* safetensors' MAX_HEADER_SIZE */
#define STG_NPY_MAX_HEADER (1u << 20)         /* ours; NumPy's default: 10000 */

/* --- index.c ---------------------------------------------------------------- */

/* A fresh, empty index of `format`; NULL when out of memory. */
stg_index *stg__index_new(stg_format format);
/* Appends an entry (copies `name`), zeroed but for the name, into *out (valid
 * until the next add); RESOURCE_EXHAUSTED. */
pd_code stg__index_add(stg_index *ix, const char *name, stg_entry **out,
                       dev_status *st);
/* Appends one __metadata__ pair (copies both). */
pd_code stg__index_add_meta(stg_index *ix, const char *key, const char *value,
                            dev_status *st);

/* Element count and byte size of `shape` for elements of `elem_size` bytes,
 * with overflow checks (false on overflow). */
bool stg__shape_bytes(const dev_shape *shape, uint64_t elem_size,
                      uint64_t *elems, uint64_t *bytes);

/* Reads exactly len bytes at offset; INVALID_ARGUMENT "truncated" (naming
 * the file, `what`, the range and the file's size) when the range passes
 * the end, else stg_file_pread's errors. */
pd_code stg__read_at(stg_file *f, uint64_t offset, void *buf, size_t len,
                     const char *what, dev_status *st);

/* True when s[0..len) is well-formed UTF-8 (no overlongs, surrogates or
 * code points past U+10FFFF). */
bool stg__utf8_valid(const char *s, size_t len);

/* Byte-swaps n elements of elem_size (2, 4 or 8) bytes in place. */
void stg__byteswap(void *buf, uint64_t n, size_t elem_size);
/* Writes the C-order copy of a Fortran-order array `src` (shape as the
 * C-order host shape) into dst; src and dst do not overlap. */
void stg__fortran_to_c(const void *src, void *dst, const dev_shape *shape,
                       size_t elem_size);

/* Copies `bytes` bytes of tensor `tensor` from `read` to `o` in chunks. */
pd_code stg__pump(stg_out *o, stg_read_fn read, void *arg, int tensor,
                  uint64_t bytes, dev_status *st);
/* Checks a tensor to save: a non-empty UTF-8 name, a dtype, a shape and a
 * byte count that agree. */
pd_code stg__check_save(const stg_save_tensor *t, dev_status *st);

/* --- safetensors.c ---------------------------------------------------------- */

pd_code stg__safetensors_index(stg_file *f, stg_index *ix, dev_status *st);
/* The paradev dtype of a safetensors dtype name; PD_DTYPE_INVALID with
 * *known set when the name is a safetensors dtype paradev lacks. */
pd_dtype stg__safetensors_dtype(const char *name, bool *known,
                                uint64_t *elem_bits);
/* The reference writer's order of dtypes (larger first when sorting). */
int stg__safetensors_dtype_rank(pd_dtype dt);

/* --- npy.c ------------------------------------------------------------------ */

/* The fields of one .npy header. */
typedef struct stg_npy_header {
  int major, minor;
  uint64_t header_bytes; /* magic, length and dict: where the data starts */
  pd_dtype dtype;
  bool big_endian;
  bool fortran_order;
  dev_shape shape;
  uint64_t bytes; /* of the data */
} stg_npy_header;

/* Parses a .npy header from the first `len` bytes of a file or member
 * (`what` names it in messages). When `len` is too short for the declared
 * header, sets *need to the bytes needed and returns PD_OUT_OF_RANGE
 * without a message, so the caller can read more; else INVALID_ARGUMENT or
 * UNIMPLEMENTED naming `what`. */
pd_code stg__npy_parse(const unsigned char *buf, size_t len, const char *what,
                       stg_npy_header *out, uint64_t *need, dev_status *st);
/* Fills an entry's dtype, shape, bytes, byteswap and fortran_order. */
void stg__npy_fill_entry(const stg_npy_header *h, stg_entry *e);
pd_code stg__npy_index(stg_file *f, stg_index *ix, dev_status *st);
/* NumPy's descr of a dtype in little-endian order ("<f4", "|b1"), or NULL. */
const char *stg__npy_descr(pd_dtype dt);

/* --- npz.c ------------------------------------------------------------------ */

pd_code stg__npz_index(stg_file *f, stg_index *ix, dev_status *st);
/* Reads a whole deflated member's value (e->bytes into dst, as stored:
 * not yet byte-swapped or transposed), checking its size and CRC. */
pd_code stg__npz_inflate(stg_file *f, const stg_entry *e, void *dst,
                         dev_status *st);
/* Checks the CRC of a stored member whose value `data` was just read. */
pd_code stg__npz_check_stored(stg_file *f, const stg_entry *e, const void *data,
                              dev_status *st);

#endif /* PARADEV_STORAGE_FORMAT_INT_H */
