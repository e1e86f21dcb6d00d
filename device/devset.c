/* Device sets (issue #17): ordered subsets of an engine's devices, where a
 * parallel tensor's components live. Values only; tensors and ops keep
 * theirs (device_int.h). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "device_int.h"

_Thread_local const dev_devset *dev__tape_place;

void dev_devset_all(const dev_engine *e, dev_devset *out) {
  memset(out, 0, sizeof *out);
  out->n = e->n;
  for (int i = 0; i < e->n; i++) out->dev[i] = (uint8_t)i;
}

pd_code dev_devset_make(const dev_engine *e, const int64_t *devs, int n,
                        dev_devset *out, dev_status *st) {
  if (n < 1)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a device set needs at least one device (the mesh has "
                     "devices 0..%d)",
                     e->n - 1);
  if (n > e->n)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a device set of %d devices: the mesh has %d (0..%d)", n,
                     e->n, e->n - 1);
  dev_devset s;
  memset(&s, 0, sizeof s);
  bool seen[PD_MAX_DEVICES] = {false};
  for (int i = 0; i < n; i++) {
    if (devs[i] < 0 || devs[i] >= e->n)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "device set entry %d is device %lld: the mesh has "
                       "devices 0..%d",
                       i, (long long)devs[i], e->n - 1);
    if (seen[devs[i]])
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "device set entry %d names device %lld again: each "
                       "device may appear once",
                       i, (long long)devs[i]);
    seen[devs[i]] = true;
    s.dev[i] = (uint8_t)devs[i];
  }
  s.n = n;
  *out = s;
  return PD_OK;
}

bool dev_devset_equal(const dev_devset *a, const dev_devset *b) {
  return a->n == b->n && memcmp(a->dev, b->dev, (size_t)a->n) == 0;
}

int dev_devset_index(const dev_devset *s, int device) {
  for (int i = 0; i < s->n; i++)
    if (s->dev[i] == device) return i;
  return -1;
}

bool dev_devset_is_subset(const dev_devset *sub, const dev_devset *super) {
  for (int i = 0; i < sub->n; i++)
    if (dev_devset_index(super, sub->dev[i]) < 0) return false;
  return true;
}

bool dev_devset_overlaps(const dev_devset *a, const dev_devset *b) {
  for (int i = 0; i < a->n; i++)
    if (dev_devset_index(b, a->dev[i]) >= 0) return true;
  return false;
}

bool dev_devset_is_all(const dev_engine *e, const dev_devset *s) {
  if (s->n != e->n) return false;
  for (int i = 0; i < s->n; i++)
    if (s->dev[i] != i) return false;
  return true;
}

char *dev_devset_str(const dev_devset *s, char *buf, size_t len) {
  if (!len) return buf;
  size_t o = 0;
  int w = snprintf(buf, len, "[");
  o = w > 0 ? (size_t)w : 0;
  for (int i = 0; i < s->n && o < len; i++) {
    w = snprintf(buf + o, len - o, "%s%d", i ? ", " : "", s->dev[i]);
    if (w < 0) break;
    o += (size_t)w;
  }
  if (o < len) snprintf(buf + o, len - o, "]");
  buf[len - 1] = '\0';
  return buf;
}

int dev_engine_device_gpu(const dev_engine *e, int device) {
  if (device < 0 || device >= e->n) return -1;
  dev_backend *b = e->backend;
  if (b->struct_size >=
          offsetof(dev_backend, device_gpu) + sizeof b->device_gpu &&
      b->device_gpu)
    return b->device_gpu(b, device);
  return device;
}

pd_code dev__devset_check(const dev_engine *e, const dev_devset *set,
                          dev_devset *out, dev_status *st) {
  if (!set) {
    *out = e->all;
    return PD_OK;
  }
  int64_t devs[PD_MAX_DEVICES] = {0};
  int n = set->n;
  if (n < 1 || n > PD_MAX_DEVICES)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "a device set of %d devices; expected 1 to %d (the mesh "
                     "has devices 0..%d)",
                     n, e->n, e->n - 1);
  for (int i = 0; i < n; i++) devs[i] = set->dev[i];
  return dev_devset_make(e, devs, n, out, st);
}
