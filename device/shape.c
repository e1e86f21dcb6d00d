/* Shapes: construction, element counts and byte sizes with overflow checks,
 * NumPy broadcasting. */
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "../common/check.h"

pd_code dev_shape_make(int rank, const int64_t *dims, dev_shape *out,
                       dev_status *st) {
  if (rank < 0 || rank > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "rank %d is out of range; expected 0 to %d", rank,
                     PD_MAX_RANK);
  dev_shape s;
  memset(&s, 0, sizeof s);
  s.rank = rank;
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "dim %d is %lld; expected a size >= 0", i,
                       (long long)dims[i]);
    s.dims[i] = dims[i];
  }
  *out = s;
  return PD_OK;
}

pd_code dev_shape_num_elements(const dev_shape *s, int64_t *out,
                               dev_status *st) {
  if (s->rank < 0 || s->rank > PD_MAX_RANK)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "rank %d is out of range; expected 0 to %d", s->rank,
                     PD_MAX_RANK);
  int64_t n = 1;
  bool zero = false;
  for (int i = 0; i < s->rank; i++) {
    if (s->dims[i] < 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "dim %d is %lld; expected a size >= 0", i,
                       (long long)s->dims[i]);
    if (s->dims[i] == 0) zero = true;
  }
  if (zero) {
    *out = 0;
    return PD_OK;
  }
  for (int i = 0; i < s->rank; i++) {
    int64_t r;
    if (__builtin_mul_overflow(n, s->dims[i], &r)) {
      char buf[160];
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "shape %s has more than 2^63-1 elements",
                       dev_shape_str(s, buf, sizeof buf));
    }
    n = r;
  }
  *out = n;
  return PD_OK;
}

pd_code dev_shape_byte_size(pd_dtype dt, const dev_shape *s, size_t *out,
                            dev_status *st) {
  size_t es = pd_dtype_size(dt);
  if (es == 0)
    return dev_error(st, PD_INVALID_ARGUMENT, "invalid dtype %d", (int)dt);
  int64_t n;
  PD_TRY(dev_shape_num_elements(s, &n, st));
  size_t bytes;
  if ((uint64_t)n > SIZE_MAX || __builtin_mul_overflow((size_t)n, es, &bytes) ||
      bytes > (size_t)INT64_MAX) {
    char buf[160];
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "shape %s of %s overflows a byte size",
                     dev_shape_str(s, buf, sizeof buf), pd_dtype_name(dt));
  }
  *out = bytes;
  return PD_OK;
}

bool dev_shape_equal(const dev_shape *a, const dev_shape *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

char *dev_shape_str(const dev_shape *s, char *buf, size_t len) {
  if (!len) return buf;
  size_t off = 0;
  int n = snprintf(buf, len, "[");
  off = n > 0 ? (size_t)n : 0;
  int rank = s->rank < 0 ? 0 : (s->rank > PD_MAX_RANK ? PD_MAX_RANK : s->rank);
  for (int i = 0; i < rank && off < len; i++) {
    n = snprintf(buf + off, len - off, i ? ", %lld" : "%lld",
                 (long long)s->dims[i]);
    if (n < 0) break;
    off += (size_t)n;
  }
  if (off < len) snprintf(buf + off, len - off, "]");
  buf[len - 1] = '\0';
  return buf;
}

pd_code dev_shape_broadcast(const dev_shape *a, const dev_shape *b,
                            dev_shape *out, dev_status *st) {
  dev_shape r;
  memset(&r, 0, sizeof r);
  r.rank = a->rank > b->rank ? a->rank : b->rank;
  for (int i = 0; i < r.rank; i++) {
    int ia = a->rank - r.rank + i, ib = b->rank - r.rank + i;
    int64_t da = ia >= 0 ? a->dims[ia] : 1;
    int64_t db = ib >= 0 ? b->dims[ib] : 1;
    if (da == db || db == 1)
      r.dims[i] = da;
    else if (da == 1)
      r.dims[i] = db;
    else {
      char sa[160], sb[160];
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "shapes %s and %s do not broadcast: axis %d has %lld and %lld; "
          "expected equal sizes or 1",
          dev_shape_str(a, sa, sizeof sa), dev_shape_str(b, sb, sizeof sb), i,
          (long long)da, (long long)db);
    }
  }
  *out = r;
  return PD_OK;
}

void dev_shard_shape(const dev_shape *host, int axis, int n, int i,
                     dev_shape *out) {
  *out = *host;
  int64_t d = host->dims[axis];
  out->dims[axis] = d / n + (i < d % n ? 1 : 0);
}
