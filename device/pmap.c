/* A pointer map for the tape (tape_int.h): open addressing, linear probing,
 * load <= 1/2, no deletion. Keys are tensor addresses, which the tape keeps
 * alive while it may look them up. */
#include <stdlib.h>
#include <string.h>

#include "tape_int.h"

static size_t pmap_hash(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x;
}

static size_t pmap_slot(const pmap *m, const void *k) {
  size_t mask = m->cap - 1, i = pmap_hash(k) & mask;
  while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
  return i;
}

bool dev__pmap_get(const pmap *m, const void *k, void **val) {
  if (!m->cap) return false;
  size_t i = pmap_slot(m, k);
  if (!m->keys[i]) return false;
  if (val) *val = m->vals[i];
  return true;
}

/* Makes room for `extra` more keys; false when out of memory (unchanged). */
bool dev__pmap_reserve(pmap *m, size_t extra) {
  size_t need = m->n + extra;
  if (need * 2 <= m->cap) return true;
  size_t cap = m->cap ? m->cap : 16;
  while (need * 2 > cap) cap *= 2;
  pmap nm = {calloc(cap, sizeof(void *)), calloc(cap, sizeof(void *)), cap,
             m->n};
  if (!nm.keys || !nm.vals) {
    free(nm.keys);
    free(nm.vals);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i]) {
      size_t j = pmap_slot(&nm, m->keys[i]);
      nm.keys[j] = m->keys[i];
      nm.vals[j] = m->vals[i];
    }
  free(m->keys);
  free(m->vals);
  *m = nm;
  return true;
}

/* Sets k's value, inserting k; room must have been reserved. */
void dev__pmap_put(pmap *m, const void *k, void *v) {
  size_t i = pmap_slot(m, k);
  if (!m->keys[i]) {
    m->keys[i] = k;
    m->n++;
  }
  m->vals[i] = v;
}

void dev__pmap_free(pmap *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}
