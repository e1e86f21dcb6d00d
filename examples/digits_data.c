/* Loader for the optical-digits CSV (see digits_data.h). zlib's gz* reads
 * both gzip'd and plain files. */
#include "digits_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static int grow(digits_set *s, int *cap) {
  int ncap = *cap ? *cap * 2 : 2048;
  float *x = realloc(s->x, sizeof(float) * (size_t)ncap * DIGITS_FEATURES);
  if (!x) return -1;
  s->x = x;
  int32_t *y = realloc(s->y, sizeof(int32_t) * (size_t)ncap);
  if (!y) return -1;
  s->y = y;
  *cap = ncap;
  return 0;
}

int digits_load(const char *path, digits_set *out, char *err, size_t errlen) {
  gzFile f = gzopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path,
             strerror(errno ? errno : ENOENT));
    return -1;
  }
  digits_set s = {0, NULL, NULL};
  int cap = 0, line = 0;
  char buf[1024];
  while (gzgets(f, buf, sizeof buf)) {
    line++;
    if (!strchr(buf, '\n') && !gzeof(f)) {
      snprintf(err, errlen, "%s:%d: line longer than %zu bytes", path, line,
               sizeof buf - 1);
      goto fail;
    }
    if (buf[0] == '\n' || buf[0] == '\0') continue;
    if (s.n == cap && grow(&s, &cap) != 0) {
      snprintf(err, errlen, "%s: out of memory", path);
      goto fail;
    }
    char *p = buf;
    for (int k = 0; k <= DIGITS_FEATURES; k++) {
      char *end;
      errno = 0;
      long v = strtol(p, &end, 10);
      long hi = k < DIGITS_FEATURES ? 16 : 9;
      if (end == p || errno || v < 0 || v > hi) {
        snprintf(err, errlen, "%s:%d: field %d: expected an integer 0..%ld",
                 path, line, k + 1, hi);
        goto fail;
      }
      char want = k < DIGITS_FEATURES ? ',' : '\n';
      if (*end != want &&
          !(k == DIGITS_FEATURES && (*end == '\0' || *end == '\r'))) {
        snprintf(
            err, errlen,
            "%s:%d: expected %d comma-separated fields (64 pixels and a label)",
            path, line, DIGITS_FEATURES + 1);
        goto fail;
      }
      if (k < DIGITS_FEATURES)
        s.x[(size_t)s.n * DIGITS_FEATURES + (size_t)k] = (float)v / 16.0f;
      else
        s.y[s.n] = (int32_t)v;
      p = end + 1;
    }
    s.n++;
  }
  int zerr;
  const char *zmsg = gzerror(f, &zerr);
  if (zerr != Z_OK && zerr != Z_STREAM_END) {
    snprintf(err, errlen, "%s: read error: %s", path, zmsg);
    goto fail;
  }
  gzclose(f);
  if (s.n == 0) {
    snprintf(err, errlen, "%s: no rows", path);
    digits_free(&s);
    return -1;
  }
  *out = s;
  return 0;
fail:
  gzclose(f);
  digits_free(&s);
  return -1;
}

int digits_split(const digits_set *all, double test_fraction, uint64_t seed,
                 digits_set *train, digits_set *test) {
  int n = all->n;
  int *perm = malloc(sizeof(int) * (size_t)n);
  if (!perm) return -1;
  for (int i = 0; i < n; i++) perm[i] = i;
  uint64_t s = seed ? seed : 0x9E3779B97F4A7C15ull;
  for (int i = n - 1; i > 0; i--) { /* Fisher-Yates with xorshift64 */
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    int j = (int)(s % (uint64_t)(i + 1));
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  int n_test = (int)(test_fraction * n + 0.5);
  digits_set parts[2];
  int sizes[2] = {n - n_test, n_test};
  for (int p = 0; p < 2; p++) {
    parts[p].n = sizes[p];
    parts[p].x = malloc(sizeof(float) * (size_t)(sizes[p] ? sizes[p] : 1) *
                        DIGITS_FEATURES);
    parts[p].y = malloc(sizeof(int32_t) * (size_t)(sizes[p] ? sizes[p] : 1));
  }
  if (!parts[0].x || !parts[0].y || !parts[1].x || !parts[1].y) {
    for (int p = 0; p < 2; p++) digits_free(&parts[p]);
    free(perm);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    int src = perm[i];
    digits_set *d = i < n_test ? &parts[1] : &parts[0];
    int row = i < n_test ? i : i - n_test;
    memcpy(d->x + (size_t)row * DIGITS_FEATURES,
           all->x + (size_t)src * DIGITS_FEATURES,
           sizeof(float) * DIGITS_FEATURES);
    d->y[row] = all->y[src];
  }
  free(perm);
  *train = parts[0];
  *test = parts[1];
  return 0;
}

void digits_free(digits_set *s) {
  if (!s) return;
  free(s->x);
  free(s->y);
  s->x = NULL;
  s->y = NULL;
  s->n = 0;
}
