/* A session's handle table: client-chosen 64-bit ids to tensors, open
 * addressing on the mixed id, linear probing, tombstones, grows at 1/2 load.
 * No locking of its own: its session's mu guards it (sched_int.h). */
#include <stdlib.h>

#include "sched_int.h"

static uint64_t sched_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

sched_slot *sched_htab_find(sched_htab *h, uint64_t id) {
  if (h->cap == 0) return NULL;
  size_t mask = h->cap - 1;
  for (size_t i = sched_mix(id) & mask;; i = (i + 1) & mask) {
    sched_slot *sl = &h->slots[i];
    if (sl->id == 0) return NULL;
    if (sl->id == id && sl->t != NULL) return sl;
  }
}

bool sched_htab_grow(sched_htab *h) {
  size_t ncap = h->cap ? h->cap * 2 : 64;
  while (h->live * 2 >= ncap) ncap *= 2;
  sched_slot *ns = calloc(ncap, sizeof(*ns));
  if (!ns) return false;
  for (size_t i = 0; i < h->cap; i++) {
    sched_slot *sl = &h->slots[i];
    if (sl->id == 0 || sl->t == NULL) continue;
    size_t j = sched_mix(sl->id) & (ncap - 1);
    while (ns[j].id != 0) j = (j + 1) & (ncap - 1);
    ns[j] = *sl;
  }
  free(h->slots);
  h->slots = ns;
  h->cap = ncap;
  h->used = h->live;
  return true;
}

bool sched_htab_reserve(sched_htab *h, size_t extra) {
  while ((h->used + extra + 1) * 2 > h->cap)
    if (!sched_htab_grow(h)) return false;
  return true;
}

bool sched_htab_insert(sched_htab *h, uint64_t id, dev_tensor *t,
                       uint64_t bytes, sched_charge **ch) {
  if ((h->used + 1) * 2 > h->cap && !sched_htab_grow(h)) return false;
  size_t mask = h->cap - 1;
  size_t i = sched_mix(id) & mask;
  while (h->slots[i].id != 0 && h->slots[i].t != NULL) i = (i + 1) & mask;
  if (h->slots[i].id == 0) h->used++;
  h->slots[i] = (sched_slot){id, t, bytes, ch};
  h->live++;
  return true;
}

void sched_htab_remove(sched_htab *h, sched_slot *sl) {
  sl->t = NULL; /* tombstone: id stays so probing continues */
  sl->bytes = 0;
  sl->ch = NULL; /* the caller put its charges */
  h->live--;
}
