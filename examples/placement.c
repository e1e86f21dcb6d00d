/* Placement with libparadev (issue #17): tensors on chosen devices.
 *
 * Against a running paradevd with at least 2 devices:
 *   1. two sessions, each narrowed to one half of the mesh
 *      (pd_session_options.devices), as two jobs sharing a node would be;
 *   2. in the first, a value sharded over its half (pd_upload), and DeviceId
 *      on the half reversed (pd_execute_on): the index within the set;
 *   3. two single-device values packed into one parallel tensor
 *      (ParallelPack, no copy), unpacked again (ParallelUnpack), and copied
 *      onto the other devices of the half (CopyToDevices).
 * Each step prints what it got, with the devices every tensor lives on.
 *
 * Usage: placement [TARGET]   (default: $PARADEV_TARGET)
 * Exit status: 0 done, 1 a call failed (the message says which), 2 no
 * target.
 */
#include <stdio.h>
#include <stdlib.h>

#include "paradev/paradev.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    if ((call) != PD_OK) {                                                     \
      fprintf(stderr, "placement: %s\n  -> %s: %s\n", #call,                   \
              pd_code_name(pd_status_code(st)), pd_status_message(st));        \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static pd_status *st;

static void show(const char *what, const pd_tensor_info *t) {
  printf("  %-28s on [", what);
  for (int i = 0; i < t->num_devices; i++)
    printf("%s%d", i ? ", " : "", t->devices[i]);
  printf("]\n");
}

static pd_session *session_on(pd_client *c, const int32_t *devs, int n) {
  pd_session_options so = PD_SESSION_OPTIONS_INITIALIZER;
  so.client_name = "placement example";
  so.devices = devs;
  so.num_devices = n;
  pd_session *s = pd_session_new(c, &so, NULL, st);
  if (!s) {
    fprintf(stderr, "placement: pd_session_new: %s: %s\n",
            pd_code_name(pd_status_code(st)), pd_status_message(st));
    exit(1);
  }
  int32_t got[PD_MAX_DEVICES];
  int k = pd_session_devices(s, got, PD_MAX_DEVICES);
  printf("session on [");
  for (int i = 0; i < k; i++) printf("%s%d", i ? ", " : "", got[i]);
  printf("]\n");
  return s;
}

int main(int argc, char **argv) {
  st = pd_status_new();
  const char *target = argc > 1 ? argv[1] : getenv("PARADEV_TARGET");
  if (!target) {
    fprintf(stderr, "usage: placement TARGET (or set PARADEV_TARGET)\n");
    return 2;
  }
  pd_client *c = pd_client_new(target, NULL, st);
  if (!c) {
    fprintf(stderr, "placement: %s\n", pd_status_message(st));
    return 1;
  }
  pd_server_info *info = pd_client_get_server_info(c, NULL, st);
  if (!info) {
    fprintf(stderr, "placement: %s\n", pd_status_message(st));
    return 1;
  }
  int n = pd_server_info_num_devices(info);
  pd_server_info_delete(info);
  if (n < 2) {
    fprintf(stderr, "placement: the daemon has %d device(s); 2 or more\n", n);
    return 1;
  }
  int h = n / 2;
  int32_t lo[PD_MAX_DEVICES], hi[PD_MAX_DEVICES];
  for (int i = 0; i < h; i++) lo[i] = i;
  for (int i = h; i < n; i++) hi[i - h] = i;
  pd_session *a = session_on(c, lo, h);
  pd_session *b = session_on(c, hi, n - h);

  /* 2. Sharded over the first half; DeviceId on it reversed. */
  float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t dims[1] = {8};
  pd_tensor_info ti;
  uint64_t x = pd_session_new_id(a);
  if (8 % h == 0) {
    CHECK(pd_upload(a, x, PD_FLOAT32, dims, 1, v, sizeof(v),
                    pd_layout_sharded(0), &ti, NULL, st));
    show("x = 1..8, sharded", &ti);
  }
  int32_t rev[PD_MAX_DEVICES];
  for (int i = 0; i < h; i++) rev[i] = lo[h - 1 - i];
  uint64_t id = 0;
  pd_attrs *none = pd_attrs_new();
  CHECK(pd_execute_on(a, rev, h, "DeviceId", NULL, 0, none, &id, 1, &ti, NULL,
                      st));
  show("DeviceId, half reversed", &ti);
  for (int i = 0; i < h; i++) {
    int32_t k = -1;
    CHECK(pd_download(a, id, pd_layout_component(i), &k, sizeof(k), NULL, NULL,
                      NULL, st));
    printf("    component %d (device %d): DeviceId %d\n", i, ti.devices[i], k);
  }

  /* 3. Pack, unpack, copy (in the second session, with 2 devices or more). */
  if (n - h >= 2) {
    float p[2] = {10, 20}, q[2] = {30, 40};
    int64_t d2[1] = {2};
    uint64_t parts[2] = {pd_session_new_id(b), pd_session_new_id(b)};
    CHECK(pd_upload_on(b, &hi[0], 1, parts[0], PD_FLOAT32, d2, 1, p, sizeof(p),
                       pd_layout_mirrored(), &ti, NULL, st));
    show("p = [10, 20]", &ti);
    CHECK(pd_upload_on(b, &hi[1], 1, parts[1], PD_FLOAT32, d2, 1, q, sizeof(q),
                       pd_layout_mirrored(), &ti, NULL, st));
    show("q = [30, 40]", &ti);
    uint64_t packed = 0;
    CHECK(pd_execute(b, "ParallelPack", parts, 2, none, &packed, 1, &ti, NULL,
                     st));
    show("ParallelPack(p, q)", &ti);
    uint64_t back[2] = {0, 0};
    pd_tensor_info bi[2];
    CHECK(pd_execute(b, "ParallelUnpack", &packed, 1, none, back, 2, bi, NULL,
                     st));
    show("ParallelUnpack -> 0", &bi[0]);
    show("ParallelUnpack -> 1", &bi[1]);
    pd_attrs *to = pd_attrs_new();
    int64_t dst[PD_MAX_DEVICES];
    int nd = n - h;
    for (int i = 0; i < nd; i++) dst[i] = hi[nd - 1 - i];
    pd_attrs_set_int_list(to, "devices", dst, nd);
    uint64_t copied = 0;
    CHECK(pd_execute(b, "CopyToDevices", &parts[0], 1, to, &copied, 1, &ti,
                     NULL, st));
    show("CopyToDevices(p)", &ti);
    float got[2];
    CHECK(pd_download(b, copied, pd_layout_mirrored(), got, sizeof(got), NULL,
                      NULL, NULL, st));
    printf("    every device holds [%g, %g]\n", got[0], got[1]);
    pd_attrs_delete(to);
  }
  pd_attrs_delete(none);
  pd_session_delete(a);
  pd_session_delete(b);
  pd_client_delete(c);
  pd_status_delete(st);
  return 0;
}
