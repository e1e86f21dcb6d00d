/* The .npy writer, as NumPy's format.write_array writes a C-order array:
 * the header dict's keys sorted, the growth-axis padding NumPy adds, the
 * whole header (magic, length, dict, spaces, '\n') a multiple of 64 bytes;
 * version 1.0, or 2.0 when the header passes 65535 bytes. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "format_int.h"

#define NPY_ALIGN 64
#define NPY_GROWTH_AXIS_MAX_DIGITS 21 /* numpy/lib/format.py */

pd_code stg_write_npy(stg_out *o, const stg_save_tensor *t, stg_read_fn read,
                      void *arg, dev_status *st) {
  if (!t || !read)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "stg_write_npy: no tensor or no read function");
  stg_save_tensor named = *t;
  if (!named.name || !*named.name)
    named.name = "(the .npy tensor)"; /* a .npy file holds no name */
  PD_TRY(stg__check_save(&named, st));
  const char *descr = stg__npy_descr(t->dtype);
  if (!descr)
    return dev_error(st, PD_UNIMPLEMENTED,
                     "tensor \"%s\": NumPy has no %s dtype, so it cannot be "
                     "saved as .npy; save it as safetensors",
                     named.name, pd_dtype_name(t->dtype));
  char dict[512];
  int n = snprintf(dict, sizeof dict,
                   "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < t->shape.rank; i++)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s%lld", i ? ", " : "",
                  (long long)t->shape.dims[i]);
  n += snprintf(dict + n, sizeof dict - (size_t)n, "%s), }",
                t->shape.rank == 1 ? "," : "");
  if (t->shape.rank > 0) { /* room for the first axis to grow in place */
    int digits = snprintf(NULL, 0, "%lld", (long long)t->shape.dims[0]);
    for (int i = digits; i < NPY_GROWTH_AXIS_MAX_DIGITS; i++) dict[n++] = ' ';
    dict[n] = 0;
  }
  size_t hlen = (size_t)n + 1; /* with the final '\n' */
  int major = 1;
  size_t prefix = 10;
  size_t pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
  if (hlen + pad > 65535) { /* never for paradev's ranks; as NumPy does */
    major = 2, prefix = 12;
    pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
  }
  unsigned char head[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major,
                            0};
  size_t total = hlen + pad;
  for (size_t i = 0; i < prefix - 8; i++)
    head[8 + i] = (unsigned char)(total >> (8 * i));
  char tail[NPY_ALIGN + 1];
  memset(tail, ' ', pad);
  tail[pad] = '\n';
  PD_TRY(stg_out_write(o, head, prefix, st));
  PD_TRY(stg_out_write(o, dict, (size_t)n, st));
  PD_TRY(stg_out_write(o, tail, pad + 1, st));
  return stg__pump(o, read, arg, 0, t->bytes, st);
}
