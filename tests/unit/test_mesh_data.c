/* The mesh's data plane without a network (issue #16): server/mesh_fwd.c on
 * a coordinator engine and server/mesh_apply.c on rank engines (CPU, 2
 * devices each), joined by the control plane's test double
 * (mesh_ctl_fake.c: the packed commands and rank messages go through
 * per-rank threads). Values are worked out in the test (float64 references,
 * hand calculations). Every wait is bounded (deadlines on the engine's
 * waits, fake_world_quiet, polls with a count). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dev_backend.h"
#include "device.h"
#include "log.h"
#include "mesh.h"
#include "mesh_ctl_fake.h"

#define W_MAX 3
#define PER 2
#define MiB ((uint64_t)1 << 20)

typedef struct mesh {
  int world;
  fake_world *w;
  dev_engine *e[W_MAX];
  dev_mesh_config mc[W_MAX];
} mesh;

/* `world` ranks of PER devices; the last rank's devices hold `last_limit`
 * bytes each (0: 64 MiB like the others). */
static void mesh_up(mesh *t, int world, uint64_t last_limit) {
  memset(t, 0, sizeof *t);
  t->world = world;
  t->w = fake_world_create(world, PER);
  assert_non_null(t->w);
  for (int r = 0; r < world; r++) {
    srv_mesh *m = fake_world_mesh(t->w, r);
    dev_mesh_config mc = DEV_MESH_CONFIG_INITIALIZER;
    mc.rank = r;
    mc.world_size = world;
    if (r == 0) {
      assert_int_equal(srv_mesh_fwd_create(m), 0);
      srv_mesh_fwd_hooks(m, &mc);
    } else {
      assert_int_equal(srv_mesh_apply_create(m), 0);
      srv_mesh_apply_hooks(m, &mc);
    }
    t->mc[r] = mc;
    dev_engine_config ec = DEV_ENGINE_CONFIG_INITIALIZER;
    ec.num_devices = PER;
    ec.memory_limit = r == world - 1 && last_limit ? last_limit : 64 * MiB;
    ec.blas_threads = 1;
    ec.mesh_config = &t->mc[r];
    dev_status st = DEV_STATUS_INIT;
    assert_int_equal(dev_engine_create(&ec, &t->e[r], &st), PD_OK);
    assert_int_equal(dev_engine_num_devices(t->e[r]), world * PER);
    fake_world_set_engine(t->w, r, t->e[r]);
  }
}

/* Every coordinator tensor must be released. Ranks drop what is left (a
 * lost rank's), then everything stops in the daemon's order. */
static void mesh_down(mesh *t) {
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_engine_sync(t->e[0], &st), PD_OK);
  fake_world_quiet(t->w, 10);
  for (int r = 1; r < t->world; r++) {
    srv_mesh *m = fake_world_mesh(t->w, r);
    dev_engine_sync(t->e[r], &st);
    srv_mesh_apply_drop_all(m, "the test ends");
  }
  fake_world_quiet(t->w, 10);
  fake_world_stop(t->w); /* no command reaches a rank from here on */
  for (int r = 1; r < t->world; r++) {
    dev_engine_destroy(t->e[r]);
    srv_mesh_apply_destroy(fake_world_mesh(t->w, r));
  }
  dev_engine_destroy(t->e[0]);
  srv_mesh_fwd_destroy(fake_world_mesh(t->w, 0));
  fake_world_destroy(t->w);
}

/* Waits (bounded) until rank `r` holds `n` tensors. */
static size_t wait_tensors(mesh *t, int r, size_t n) {
  size_t have = 0;
  for (int i = 0; i < 1000; i++) {
    fake_world_quiet(t->w, 5);
    have = srv_mesh_apply_tensors(fake_world_mesh(t->w, r));
    if (have == n) break;
    usleep(5000);
  }
  return have;
}

static dev_tensor *run1(mesh *t, const dev_devset *set, const char *op,
                        dev_tensor *a, dev_tensor *b, const dev_attr *attrs,
                        int na) {
  dev_tensor *ins[2] = {a, b}, *out = NULL;
  int nout = 1;
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = dev_execute_on(t->e[0], set, op, ins, a ? (b ? 2 : 1) : 0, attrs,
                              na, &out, &nout, &st);
  if (rc != PD_OK) fail_msg("%s: %s", op, st.msg);
  return out;
}

static pd_code wait_for(dev_tensor *x, dev_status *st) {
  return dev_tensor_wait_until(x, dev_monotonic_now() + 30, st);
}

static dev_tensor *upload(mesh *t, const dev_layout *lay, int rank,
                          const int64_t *dims, const float *data) {
  dev_shape sh;
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(dev_shape_make(rank, dims, &sh, &st), PD_OK);
  dev_tensor *x = NULL;
  if (dev_tensor_from_host(t->e[0], PD_FLOAT32, lay, &sh, data, &x, &st))
    fail_msg("upload: %s", st.msg);
  return x;
}

/* x sharded over 6 devices of 3 ranks, z = x*x + x, downloaded SHARDED
 * (components read from the ranks) and one component alone; then every
 * release reaches the ranks. */
static void test_sharded(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 0);
  float x[36], out[36];
  for (int i = 0; i < 36; i++) x[i] = (float)(i - 11) * 0.5f;
  dev_layout sh0 = {DEV_LAYOUT_SHARDED, 0, 0};
  int64_t dims[2] = {12, 3};
  dev_tensor *xt = upload(&t, &sh0, 2, dims, x);
  dev_tensor *y = run1(&t, NULL, "Mul", xt, xt, NULL, 0);
  dev_tensor *z = run1(&t, NULL, "Add", y, xt, NULL, 0);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(wait_for(z, &st), PD_OK);
  assert_int_equal(dev_tensor_to_host(z, &sh0, 0, out, sizeof out, &st), PD_OK);
  for (int i = 0; i < 36; i++) {
    double v = (double)x[i];
    assert_float_equal(out[i], v * v + v, 1e-6);
  }
  /* Component 5 (device 5, rank 2): rows 10 and 11. */
  float c5[6];
  dev_layout comp = {DEV_LAYOUT_COMPONENT, 0, 5};
  assert_int_equal(dev_tensor_to_host(z, &comp, 5, c5, sizeof c5, &st), PD_OK);
  for (int i = 0; i < 6; i++) {
    double v = (double)x[30 + i];
    assert_float_equal(c5[i], v * v + v, 1e-6);
  }
  assert_int_equal(wait_tensors(&t, 1, 3), 3);
  assert_int_equal(wait_tensors(&t, 2, 3), 3);
  dev_tensor_release(xt);
  dev_tensor_release(y);
  dev_tensor_release(z);
  assert_int_equal(wait_tensors(&t, 1, 0), 0);
  assert_int_equal(wait_tensors(&t, 2, 0), 0);
  mesh_down(&t);
}

/* A mirrored upload squared on every device; read back from the
 * coordinator's component, a rank's component, and MIRRORED. Fill's
 * attributes (shape, float, dtype) reach the ranks. */
static void test_mirrored_and_attrs(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 0);
  float x[5] = {1.5f, -2.0f, 3.0f, 0.25f, 10.0f}, out[5];
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  int64_t d5 = 5;
  dev_tensor *xt = upload(&t, &mir, 1, &d5, x);
  dev_tensor *y = run1(&t, NULL, "Mul", xt, xt, NULL, 0);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(wait_for(y, &st), PD_OK);
  int comps[3] = {0, 3, 5};
  for (int k = 0; k < 3; k++) {
    dev_layout c = {DEV_LAYOUT_COMPONENT, 0, comps[k]};
    assert_int_equal(dev_tensor_to_host(y, &c, comps[k], out, sizeof out, &st),
                     PD_OK);
    for (int i = 0; i < 5; i++)
      assert_float_equal(out[i], (double)x[i] * x[i], 1e-6);
  }
  assert_int_equal(dev_tensor_to_host(y, &mir, 0, out, sizeof out, &st), PD_OK);
  for (int i = 0; i < 5; i++)
    assert_float_equal(out[i], (double)x[i] * x[i], 1e-6);

  /* Fill on devices [1, 3, 5]: a float64 [3, 2] of 2.5 everywhere. */
  int64_t set_devs[3] = {1, 3, 5}, fdims[2] = {3, 2};
  dev_devset set;
  assert_int_equal(dev_devset_make(t.e[0], set_devs, 3, &set, &st), PD_OK);
  dev_attr fa[3] = {dev_attr_shape("shape", 2, fdims),
                    dev_attr_float("value", 2.5),
                    dev_attr_dtype("dtype", PD_FLOAT64)};
  dev_tensor *f = run1(&t, &set, "Fill", NULL, NULL, fa, 3);
  assert_int_equal(wait_for(f, &st), PD_OK);
  for (int k = 0; k < 3; k++) {
    double fv[6];
    dev_layout c = {DEV_LAYOUT_COMPONENT, 0, k};
    assert_int_equal(dev_tensor_to_host(f, &c, k, fv, sizeof fv, &st), PD_OK);
    for (int i = 0; i < 6; i++) assert_float_equal(fv[i], 2.5, 0);
  }
  dev_tensor_release(f);
  dev_tensor_release(y);
  dev_tensor_release(xt);
  mesh_down(&t);
}

/* DeviceId: the index within the set, on every device and on [5, 2, 0]. */
static void test_device_id(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 0);
  dev_status st = DEV_STATUS_INIT;
  dev_tensor *id = run1(&t, NULL, "DeviceId", NULL, NULL, NULL, 0);
  assert_int_equal(wait_for(id, &st), PD_OK);
  for (int k = 0; k < 3 * PER; k++) {
    int32_t v = -1;
    dev_layout c = {DEV_LAYOUT_COMPONENT, 0, k};
    assert_int_equal(dev_tensor_to_host(id, &c, k, &v, sizeof v, &st), PD_OK);
    assert_int_equal(v, k);
  }
  int64_t devs[3] = {5, 2, 0};
  dev_devset set;
  assert_int_equal(dev_devset_make(t.e[0], devs, 3, &set, &st), PD_OK);
  dev_tensor *id2 = run1(&t, &set, "DeviceId", NULL, NULL, NULL, 0);
  assert_int_equal(wait_for(id2, &st), PD_OK);
  for (int k = 0; k < 3; k++) {
    int32_t v = -1;
    dev_layout c = {DEV_LAYOUT_COMPONENT, 0, k};
    assert_int_equal(dev_tensor_to_host(id2, &c, k, &v, sizeof v, &st), PD_OK);
    assert_int_equal(v, k);
  }
  dev_tensor_release(id);
  dev_tensor_release(id2);
  mesh_down(&t);
}

/* Rank 2's devices hold 1 MiB each: a Fill of 2 MiB per component fails
 * there, and the coordinator's wait gets RESOURCE_EXHAUSTED naming rank 2;
 * the mesh goes on. */
static void test_rank_out_of_memory(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 1 * MiB);
  dev_status st = DEV_STATUS_INIT;
  int64_t dims[2] = {512, 1024};
  dev_attr fa[2] = {dev_attr_shape("shape", 2, dims),
                    dev_attr_float("value", 1.0)};
  dev_tensor *big = run1(&t, NULL, "Fill", NULL, NULL, fa, 2);
  assert_int_equal(wait_for(big, &st), PD_RESOURCE_EXHAUSTED);
  printf("# the coordinator's error: %s\n", st.msg);
  assert_non_null(strstr(st.msg, "rank 2"));
  assert_true(strstr(st.msg, "device 4") || strstr(st.msg, "device 5"));
  assert_non_null(strstr(st.msg, "out of memory"));
  /* A consumer fails the same way; a small op is fine. */
  dev_tensor *sq = run1(&t, NULL, "Mul", big, big, NULL, 0);
  assert_int_equal(wait_for(sq, &st), PD_RESOURCE_EXHAUSTED);
  dev_tensor_release(sq);
  dev_tensor_release(big);
  float x[2] = {3, 4}, out[2];
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  int64_t d2 = 2;
  dev_tensor *xt = upload(&t, &mir, 1, &d2, x);
  dev_tensor *y = run1(&t, NULL, "Mul", xt, xt, NULL, 0);
  dev_layout c5 = {DEV_LAYOUT_COMPONENT, 0, 5};
  assert_int_equal(dev_tensor_to_host(y, &c5, 5, out, sizeof out, &st), PD_OK);
  assert_float_equal(out[0], 9.0, 0);
  assert_float_equal(out[1], 16.0, 0);
  dev_tensor_release(y);
  dev_tensor_release(xt);
  mesh_down(&t);
}

/* A stalled rank 1 (its commands held) is marked lost: the coordinator's
 * pending op fails UNAVAILABLE naming it, at once (within the bound), so
 * do later ops and reads on its devices; the others go on. */
static void test_rank_lost(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 0);
  dev_status st = DEV_STATUS_INIT;
  float x[3] = {1, 2, 3}, out[3];
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  int64_t d3 = 3;
  dev_tensor *xt = upload(&t, &mir, 1, &d3, x);
  fake_world_quiet(t.w, 10);
  fake_world_pause(t.w, 1, true);
  dev_tensor *y = run1(&t, NULL, "Mul", xt, xt, NULL, 0);
  assert_int_equal(dev_tensor_wait_until(y, dev_monotonic_now() + 0.2, &st),
                   PD_DEADLINE_EXCEEDED);
  fake_world_detach(t.w, 1);
  srv_mesh_fwd_rank_lost(fake_world_mesh(t.w, 0), 1,
                         "the mesh lost rank 1 (fake-host): its stream ended");
  assert_int_equal(wait_for(y, &st), PD_UNAVAILABLE);
  assert_non_null(strstr(st.msg, "rank 1"));
  dev_tensor *z = run1(&t, NULL, "Mul", xt, xt, NULL, 0);
  assert_int_equal(wait_for(z, &st), PD_UNAVAILABLE);
  assert_non_null(strstr(st.msg, "rank 1"));
  dev_layout c2 = {DEV_LAYOUT_COMPONENT, 0, 2};
  assert_int_equal(dev_tensor_to_host(xt, &c2, 2, out, sizeof out, &st),
                   PD_UNAVAILABLE);
  assert_non_null(strstr(st.msg, "rank 1"));
  /* Devices [0, 4] (the coordinator's and rank 2's) still work. */
  int64_t devs[2] = {0, 4}, fd = 2;
  dev_devset set;
  assert_int_equal(dev_devset_make(t.e[0], devs, 2, &set, &st), PD_OK);
  dev_attr fa[2] = {dev_attr_shape("shape", 1, &fd),
                    dev_attr_float("value", -7.0)};
  dev_tensor *f = run1(&t, &set, "Fill", NULL, NULL, fa, 2);
  dev_layout c1 = {DEV_LAYOUT_COMPONENT, 0, 1};
  float fv[2];
  assert_int_equal(dev_tensor_to_host(f, &c1, 1, fv, sizeof fv, &st), PD_OK);
  assert_float_equal(fv[0], -7.0, 0);
  assert_float_equal(fv[1], -7.0, 0);
  /* Rank 1 attaches again (its engine's last seq): new ops run there,
   * the ones from before the loss stay failed. */
  fake_world_reattach(t.w, 1);
  srv_mesh_fwd_rank_attached(fake_world_mesh(t.w, 0), 1, 2,
                             dev_engine_last_seq(t.e[1]));
  float x2[3] = {-1, 0.5f, 4}, o2[3];
  dev_tensor *xt2 = upload(&t, &mir, 1, &d3, x2);
  dev_tensor *y2 = run1(&t, NULL, "Mul", xt2, xt2, NULL, 0);
  assert_int_equal(dev_tensor_to_host(y2, &c2, 2, o2, sizeof o2, &st), PD_OK);
  for (int i = 0; i < 3; i++)
    assert_float_equal(o2[i], (double)x2[i] * x2[i], 0);
  assert_int_equal(wait_for(y, &st), PD_UNAVAILABLE);
  dev_tensor_release(y2);
  dev_tensor_release(xt2);
  dev_tensor_release(f);
  dev_tensor_release(z);
  dev_tensor_release(y);
  dev_tensor_release(xt);
  assert_int_equal(wait_tensors(&t, 2, 0), 0);
  mesh_down(&t);
}

/* MeshDropAll (a command) and srv_mesh_apply_drop_all empty a rank. */
static void test_drop_all(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 0);
  float x[4] = {1, 2, 3, 4};
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  int64_t d4 = 4;
  dev_tensor *a = upload(&t, &mir, 1, &d4, x);
  dev_tensor *b = upload(&t, &mir, 1, &d4, x);
  assert_int_equal(wait_tensors(&t, 1, 2), 2);
  assert_int_equal(wait_tensors(&t, 2, 2), 2);
  Paradev__V1__MeshDropAll da = PARADEV__V1__MESH_DROP_ALL__INIT;
  da.reason = "a new coordinator";
  Paradev__V1__MeshCommand cmd = PARADEV__V1__MESH_COMMAND__INIT;
  cmd.kind_case = PARADEV__V1__MESH_COMMAND__KIND_DROP_ALL;
  cmd.drop_all = &da;
  uint8_t buf[64];
  ProtobufCBinaryData one = {paradev__v1__mesh_command__pack(&cmd, buf), buf};
  srv_mesh_apply_commands(fake_world_mesh(t.w, 2), &one, 1);
  assert_int_equal(srv_mesh_apply_tensors(fake_world_mesh(t.w, 2)), 0);
  srv_mesh_apply_drop_all(fake_world_mesh(t.w, 1), "the coordinator is gone");
  assert_int_equal(srv_mesh_apply_tensors(fake_world_mesh(t.w, 1)), 0);
  /* Releases of ids the ranks no longer hold are harmless. */
  dev_tensor_release(a);
  dev_tensor_release(b);
  mesh_down(&t);
}

typedef struct waiter {
  dev_mesh_config *mc;
  int device;
  uint64_t seq;
  dev_status st;
  volatile int done;
} waiter;

static void *waiter_main(void *arg) {
  waiter *w = arg;
  w->mc->remote_wait(w->mc->arg, w->device, w->seq, &w->st);
  __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* The coordinator's remote_wait for (device, seq), bounded. */
static pd_code remote_wait_bounded(mesh *t, int device, uint64_t seq,
                                   dev_status *st) {
  waiter w = {&t->mc[0], device, seq, DEV_STATUS_INIT, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
  for (int i = 0; i < 2000 && !__atomic_load_n(&w.done, __ATOMIC_SEQ_CST); i++)
    usleep(5000);
  if (!__atomic_load_n(&w.done, __ATOMIC_SEQ_CST))
    srv_mesh_fwd_rank_lost(fake_world_mesh(t->w, 0), device / PER,
                           "the test gave up waiting");
  pthread_join(th, NULL);
  *st = w.st;
  return w.st.code;
}

/* A command the rank cannot apply (an input it never saw) is reported as a
 * failure of that seq on each local device of the op's set, and its output
 * fails the next op that reads it the same way. */
static void test_refused_command(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 2, 0);
  uint64_t seq = dev_engine_last_seq(t.e[0]) + 10;
  dev_engine_advance_seq(t.e[0], seq + 3);
  uint64_t in_id = 999999, out_id = 999998, out2 = 999997;
  uint32_t devs[2] = {2, 3};
  Paradev__V1__MeshOp op = PARADEV__V1__MESH_OP__INIT;
  op.seq = seq;
  op.op = "Mul";
  uint64_t ins[2] = {in_id, in_id};
  op.n_inputs = 2;
  op.inputs = ins;
  op.n_outputs = 1;
  op.outputs = &out_id;
  op.n_devices = 2;
  op.devices = devs;
  Paradev__V1__MeshCommand cmd = PARADEV__V1__MESH_COMMAND__INIT;
  cmd.kind_case = PARADEV__V1__MESH_COMMAND__KIND_OP;
  cmd.op = &op;
  uint8_t b1[256], b2[256];
  ProtobufCBinaryData two[2];
  two[0] = (ProtobufCBinaryData){paradev__v1__mesh_command__pack(&cmd, b1), b1};
  uint64_t ins2[2] = {out_id, out_id};
  op.seq = seq + 1;
  op.inputs = ins2;
  op.outputs = &out2;
  two[1] = (ProtobufCBinaryData){paradev__v1__mesh_command__pack(&cmd, b2), b2};
  srv_mesh_apply_commands(fake_world_mesh(t.w, 1), two, 2);
  dev_status st = DEV_STATUS_INIT;
  for (int d = 2; d < 4; d++) {
    assert_int_equal(remote_wait_bounded(&t, d, seq, &st), PD_INTERNAL);
    assert_non_null(strstr(st.msg, "rank 1"));
    assert_non_null(strstr(st.msg, "999999"));
    assert_int_equal(remote_wait_bounded(&t, d, seq + 1, &st), PD_INTERNAL);
    assert_non_null(strstr(st.msg, "999999"));
  }
  /* An op whose input is still pending on the rank (a load not completed)
   * is refused by the rank's engine: reported as that seq's failure. */
  dev_shape pc[4];
  int64_t d1 = 1;
  for (int k = 0; k < 4; k++) dev_shape_make(1, &d1, &pc[k], &st);
  dev_layout per = {DEV_LAYOUT_PER_COMPONENT, 0, 0};
  dev_tensor *p = NULL;
  assert_int_equal(dev_tensor_create_pending_on(t.e[0], NULL, PD_FLOAT32, &per,
                                                NULL, pc, &p, &st),
                   PD_OK);
  fake_world_quiet(t.w, 10);
  uint64_t pid = dev_tensor_id(p), out3 = 999996;
  uint64_t ins3[2] = {pid, pid};
  op.seq = seq + 2;
  op.inputs = ins3;
  op.outputs = &out3;
  uint32_t all4[4] = {0, 1, 2, 3};
  op.devices = all4;
  op.n_devices = 4;
  ProtobufCBinaryData three = {paradev__v1__mesh_command__pack(&cmd, b1), b1};
  srv_mesh_apply_commands(fake_world_mesh(t.w, 1), &three, 1);
  for (int d = 2; d < 4; d++) {
    assert_int_equal(remote_wait_bounded(&t, d, seq + 2, &st),
                     PD_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "rank 1"));
  }
  dev_tensor_complete(p, PD_CANCELLED, "the test is done with it");
  dev_tensor_release(p);

  /* The mesh goes on: an op after them runs. */
  float x[2] = {5, -1}, out[2];
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  int64_t d2 = 2;
  dev_tensor *xt = upload(&t, &mir, 1, &d2, x);
  dev_tensor *y = run1(&t, NULL, "Mul", xt, xt, NULL, 0);
  dev_layout c3 = {DEV_LAYOUT_COMPONENT, 0, 3};
  assert_int_equal(dev_tensor_to_host(y, &c3, 3, out, sizeof out, &st), PD_OK);
  assert_float_equal(out[0], 25.0, 0);
  assert_float_equal(out[1], 1.0, 0);
  dev_tensor_release(y);
  dev_tensor_release(xt);
  /* The failed ids stay recorded (not tensors); the one tensor left is the
   * refused op's output (abandoned by the engine), whose id the injected
   * command made up, so no release will come for it. */
  assert_int_equal(wait_tensors(&t, 1, 1), 1);
  mesh_down(&t);
}

/* A large sharded round trip: writes and reads split into 4 MiB messages. */
static void test_large_transfer(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 2, 0);
  int64_t total = 4 * (3 << 20); /* 4 components of 3 Mi floats (12 MiB) */
  float *h = malloc(sizeof(float) * (size_t)total);
  float *o = malloc(sizeof(float) * (size_t)total);
  assert_non_null(h);
  assert_non_null(o);
  for (int64_t i = 0; i < total; i++) h[i] = (float)(i % 1000) - 500.0f;
  dev_layout sh0 = {DEV_LAYOUT_SHARDED, 0, 0};
  dev_tensor *xt = upload(&t, &sh0, 1, &total, h);
  dev_tensor *y = run1(&t, NULL, "Add", xt, xt, NULL, 0);
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(
      dev_tensor_to_host(y, &sh0, 0, o, sizeof(float) * (size_t)total, &st),
      PD_OK);
  for (int64_t i = 0; i < total; i++)
    if (o[i] != 2 * h[i]) fail_msg("element %lld", (long long)i);
  free(h);
  free(o);
  dev_tensor_release(y);
  dev_tensor_release(xt);
  mesh_down(&t);
}

/* The per-op cost: N small ops over 3 ranks (no timing assertion; the
 * data planes log their own per-op figures when they stop). */
static void test_per_op_cost(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 0);
  float x[4] = {1, 1, 1, 1};
  dev_layout mir = {DEV_LAYOUT_MIRRORED, 0, 0};
  int64_t d4 = 4;
  dev_tensor *xt = upload(&t, &mir, 1, &d4, x);
  enum { N = 3000 };
  double t0 = dev_monotonic_now();
  dev_tensor *last = NULL;
  for (int i = 0; i < N; i++) {
    dev_tensor *y = run1(&t, NULL, "Mul", xt, xt, NULL, 0);
    dev_tensor_release(last);
    last = y;
  }
  double t1 = dev_monotonic_now();
  dev_status st = DEV_STATUS_INIT;
  assert_int_equal(wait_for(last, &st), PD_OK);
  double t2 = dev_monotonic_now();
  printf(
      "# %d ops over 3 ranks x %d devices: %.2f us per op to submit "
      "(hooks included), %.2f us per op until the last was done\n",
      N, PER, (t1 - t0) / N * 1e6, (t2 - t0) / N * 1e6);
  dev_tensor_release(last);
  dev_tensor_release(xt);
  mesh_down(&t);

  /* The same on one engine of 6 devices (no mesh), for comparison. */
  dev_engine_config ec = DEV_ENGINE_CONFIG_INITIALIZER;
  ec.num_devices = 3 * PER;
  ec.memory_limit = 64 * MiB;
  ec.blas_threads = 1;
  dev_engine *e = NULL;
  assert_int_equal(dev_engine_create(&ec, &e, &st), PD_OK);
  dev_shape sh;
  dev_shape_make(1, &d4, &sh, &st);
  assert_int_equal(dev_tensor_from_host(e, PD_FLOAT32, &mir, &sh, x, &xt, &st),
                   PD_OK);
  last = NULL;
  t0 = dev_monotonic_now();
  for (int i = 0; i < N; i++) {
    dev_tensor *ins[2] = {xt, xt}, *y = NULL;
    int nout = 1;
    assert_int_equal(dev_execute(e, "Mul", ins, 2, NULL, 0, &y, &nout, &st),
                     PD_OK);
    dev_tensor_release(last);
    last = y;
  }
  t1 = dev_monotonic_now();
  assert_int_equal(wait_for(last, &st), PD_OK);
  t2 = dev_monotonic_now();
  printf(
      "# the same on one engine of %d devices: %.2f us per op to submit, "
      "%.2f us per op until the last was done\n",
      3 * PER, (t1 - t0) / N * 1e6, (t2 - t0) / N * 1e6);
  dev_tensor_release(last);
  dev_tensor_release(xt);
  dev_engine_destroy(e);
}

/* Attributes of every kind reach the ranks: AllReduce's string (a
 * collective within rank 1's devices and within rank 2's, run there by the
 * backend), Transpose's int list, Cast's dtype and bool. */
static void test_attr_kinds(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 0);
  dev_status st = DEV_STATUS_INIT;
  for (int r = 1; r < 3; r++) {
    int64_t devs[2] = {2 * r, 2 * r + 1};
    dev_devset set;
    assert_int_equal(dev_devset_make(t.e[0], devs, 2, &set, &st), PD_OK);
    /* Components [[1, 2, 3], [4, 5, 6]] * (r) and * (10 r). */
    float c0[6], c1[6];
    for (int i = 0; i < 6; i++) {
      c0[i] = (float)((i + 1) * r);
      c1[i] = (float)((i % 2 ? -10 : 10) * (i + 1) * r);
    }
    dev_shape shp[2];
    int64_t d23[2] = {2, 3};
    dev_shape_make(2, d23, &shp[0], &st);
    shp[1] = shp[0];
    const void *datas[2] = {c0, c1};
    dev_tensor *x = NULL;
    assert_int_equal(dev_tensor_from_components_on(t.e[0], &set, PD_FLOAT32,
                                                   shp, datas, &x, &st),
                     PD_OK);
    dev_attr red = dev_attr_string("reduction", "max");
    dev_tensor *mx = run1(&t, NULL, "AllReduce", x, NULL, &red, 1);
    int64_t perm[2] = {1, 0};
    dev_attr pa = dev_attr_int_list("perm", perm, 2);
    dev_tensor *tr = run1(&t, NULL, "Transpose", mx, NULL, &pa, 1);
    dev_attr ca[2] = {dev_attr_dtype("DstT", PD_FLOAT64),
                      dev_attr_bool("Truncate", true)};
    dev_tensor *cd = run1(&t, NULL, "Cast", tr, NULL, ca, 2);
    assert_int_equal(wait_for(cd, &st), PD_OK);
    for (int k = 0; k < 2; k++) {
      double out[6];
      dev_layout c = {DEV_LAYOUT_COMPONENT, 0, k};
      assert_int_equal(dev_tensor_to_host(cd, &c, k, out, sizeof out, &st),
                       PD_OK);
      /* out[j][i] = max(c0[i][j], c1[i][j]), shape [3, 2]. */
      for (int j = 0; j < 3; j++)
        for (int i = 0; i < 2; i++) {
          double a = c0[i * 3 + j], b = c1[i * 3 + j];
          assert_float_equal(out[j * 2 + i], a > b ? a : b, 0);
        }
    }
    dev_tensor_release(cd);
    dev_tensor_release(tr);
    dev_tensor_release(mx);
    dev_tensor_release(x);
  }
  mesh_down(&t);
}

/* A pending tensor (a checkpoint load's): created, written per component,
 * completed; an op on it afterwards. A failed completion fails its
 * readers. */
static void test_pending(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 2, 0);
  dev_status st = DEV_STATUS_INIT;
  dev_shape comps[4];
  int64_t d3 = 3;
  for (int k = 0; k < 4; k++) dev_shape_make(1, &d3, &comps[k], &st);
  dev_layout per = {DEV_LAYOUT_PER_COMPONENT, 0, 0};
  dev_tensor *p = NULL, *q = NULL;
  assert_int_equal(dev_tensor_create_pending_on(t.e[0], NULL, PD_FLOAT32, &per,
                                                NULL, comps, &p, &st),
                   PD_OK);
  assert_int_equal(dev_tensor_create_pending_on(t.e[0], NULL, PD_FLOAT32, &per,
                                                NULL, comps, &q, &st),
                   PD_OK);
  for (int k = 0; k < 4; k++) {
    float v[3] = {(float)k, (float)(k * k), -1.0f};
    dev_layout pc = {DEV_LAYOUT_PER_COMPONENT, 0, k};
    assert_int_equal(dev_tensor_write(p, &pc, k, 0, v, sizeof v, &st), PD_OK);
  }
  dev_tensor_complete(p, PD_OK, "");
  dev_tensor_complete(q, PD_DATA_LOSS, "the checkpoint is cut short");
  dev_tensor *y = run1(&t, NULL, "Add", p, p, NULL, 0);
  for (int k = 0; k < 4; k++) {
    float out[3];
    dev_layout c = {DEV_LAYOUT_COMPONENT, 0, k};
    assert_int_equal(dev_tensor_to_host(y, &c, k, out, sizeof out, &st), PD_OK);
    assert_float_equal(out[0], 2.0 * k, 0);
    assert_float_equal(out[1], 2.0 * k * k, 0);
    assert_float_equal(out[2], -2.0, 0);
  }
  dev_tensor *z = run1(&t, NULL, "Add", q, q, NULL, 0);
  assert_int_equal(wait_for(z, &st), PD_DATA_LOSS);
  dev_tensor_release(z);
  dev_tensor_release(y);
  dev_tensor_release(q);
  dev_tensor_release(p);
  assert_int_equal(wait_tensors(&t, 1, 0), 0);
  mesh_down(&t);
}

/* --- a transport for collectives across ranks (in-process) -------------------
 * Every engine of the test shares one: a participant per device meets the
 * others of its set at a barrier (bounded), and all_reduce combines their
 * buffers in float64. (A trimmed copy of tests/unit/test_mesh_engine.c's.) */

typedef struct tgroup {
  dev_devset set;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned gen;
  void *ptr[PD_MAX_DEVICES];
  int index[PD_MAX_DEVICES];
  struct tgroup *next;
} tgroup;

typedef struct ttrans {
  dev_mesh_transport t;
  pthread_mutex_t mu;
  tgroup *groups;
  int refs;
} ttrans;

static bool tbarrier(tgroup *g) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 30;
  pthread_mutex_lock(&g->mu);
  unsigned gen = g->gen;
  bool ok = true;
  if (++g->arrived == g->set.n) {
    g->arrived = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
  } else {
    while (gen == g->gen && ok)
      ok = pthread_cond_timedwait(&g->cv, &g->mu, &dl) == 0 || gen != g->gen;
  }
  pthread_mutex_unlock(&g->mu);
  return ok;
}

static pd_code t_group_get(dev_mesh_transport *t, const dev_devset *set,
                           int index, void **group, dev_status *st) {
  ttrans *f = t->impl;
  pthread_mutex_lock(&f->mu);
  tgroup *g = f->groups;
  while (g && !dev_devset_equal(&g->set, set)) g = g->next;
  if (!g && (g = calloc(1, sizeof *g))) {
    g->set = *set;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int i = 0; i < set->n; i++) g->index[i] = i;
    g->next = f->groups;
    f->groups = g;
  }
  pthread_mutex_unlock(&f->mu);
  if (!g) return dev_error(st, PD_RESOURCE_EXHAUSTED, "test transport");
  *group = &g->index[index];
  return PD_OK;
}

static tgroup *t_group_of(int *part) {
  return (tgroup *)((char *)(part - *part) - offsetof(tgroup, index));
}

static pd_code t_all_reduce(dev_mesh_transport *t, void *group, void *buf,
                            size_t count, pd_dtype dt, int red,
                            dev_status *st) {
  int *part = group;
  tgroup *g = t_group_of(part);
  g->ptr[*part] = buf;
  if (!tbarrier(g))
    return dev_error(st, PD_DEADLINE_EXCEEDED, "test transport: timeout");
  double *acc = malloc((count ? count : 1) * sizeof *acc);
  assert_non_null(acc);
  for (size_t i = 0; i < count; i++) {
    double a = dev_load_f64(dt, g->ptr[0], (int64_t)i);
    for (int k = 1; k < g->set.n; k++) {
      double v = dev_load_f64(dt, g->ptr[k], (int64_t)i);
      a = red == DEV_RED_SUM    ? a + v
          : red == DEV_RED_PROD ? a * v
          : red == DEV_RED_MAX  ? (v > a ? v : a)
                                : (v < a ? v : a);
    }
    acc[i] = a;
  }
  bool ok = tbarrier(g); /* every participant has read every buffer */
  for (size_t i = 0; i < count; i++) dev_store_f64(dt, buf, (int64_t)i, acc[i]);
  free(acc);
  (void)t;
  return ok ? PD_OK
            : dev_error(st, PD_DEADLINE_EXCEEDED, "test transport: timeout");
}

static pd_code t_unsupported(dev_status *st) {
  return dev_error(st, PD_UNIMPLEMENTED, "test transport: all_reduce only");
}
static pd_code t_broadcast(dev_mesh_transport *t, void *group, void *buf,
                           size_t bytes, int root, dev_status *st) {
  (void)t, (void)group, (void)buf, (void)bytes, (void)root;
  return t_unsupported(st);
}
static pd_code t_all_gather(dev_mesh_transport *t, void *group, const void *in,
                            const size_t *in_bytes, void *out, dev_status *st) {
  (void)t, (void)group, (void)in, (void)in_bytes, (void)out;
  return t_unsupported(st);
}

static void t_retain(dev_mesh_transport *t) {
  ttrans *f = t->impl;
  __atomic_fetch_add(&f->refs, 1, __ATOMIC_SEQ_CST);
}

static void t_release(dev_mesh_transport *t) {
  ttrans *f = t->impl;
  if (__atomic_fetch_sub(&f->refs, 1, __ATOMIC_SEQ_CST) != 1) return;
  while (f->groups) {
    tgroup *g = f->groups;
    f->groups = g->next;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
  }
  pthread_mutex_destroy(&f->mu);
  free(f);
}

static dev_mesh_transport *ttrans_new(void) {
  ttrans *f = calloc(1, sizeof *f);
  assert_non_null(f);
  pthread_mutex_init(&f->mu, NULL);
  f->refs = 1;
  f->t = (dev_mesh_transport){
      .struct_size = sizeof f->t,
      .impl = f,
      .group_get = t_group_get,
      .all_reduce = t_all_reduce,
      .broadcast = t_broadcast,
      .all_gather = t_all_gather,
      .retain = t_retain,
      .release = t_release,
  };
  return &f->t;
}

/* AllReduce over the 6 devices of 3 ranks (sum and max), forwarded by the
 * data plane, run by every rank's engine for its devices through the
 * transport: every component gets the result. */
static void test_collective_across_ranks(void **state) {
  (void)state;
  mesh t;
  mesh_up(&t, 3, 0);
  dev_mesh_transport *tr = ttrans_new();
  for (int r = 0; r < 3; r++) dev_engine_mesh_set_transport(t.e[r], tr);
  tr->release(tr); /* the engines hold it */
  dev_status st = DEV_STATUS_INIT;
  float c[6][4];
  dev_shape shp[6];
  const void *datas[6];
  int64_t d4 = 4;
  for (int k = 0; k < 6; k++) {
    for (int i = 0; i < 4; i++) c[k][i] = (float)((k + 1) * (i - 1.5) + k * k);
    dev_shape_make(1, &d4, &shp[k], &st);
    datas[k] = c[k];
  }
  dev_tensor *x = NULL;
  assert_int_equal(dev_tensor_from_components_on(t.e[0], NULL, PD_FLOAT32, shp,
                                                 datas, &x, &st),
                   PD_OK);
  dev_attr rsum = dev_attr_string("reduction", "sum");
  dev_attr rmax = dev_attr_string("reduction", "max");
  dev_tensor *s = run1(&t, NULL, "AllReduce", x, NULL, &rsum, 1);
  dev_tensor *m = run1(&t, NULL, "AllReduce", x, NULL, &rmax, 1);
  if (wait_for(s, &st) != PD_OK) fail_msg("AllReduce sum: %s", st.msg);
  assert_int_equal(wait_for(m, &st), PD_OK);
  for (int k = 0; k < 6; k++) {
    float os[4], om[4];
    dev_layout cl = {DEV_LAYOUT_COMPONENT, 0, k};
    assert_int_equal(dev_tensor_to_host(s, &cl, k, os, sizeof os, &st), PD_OK);
    assert_int_equal(dev_tensor_to_host(m, &cl, k, om, sizeof om, &st), PD_OK);
    for (int i = 0; i < 4; i++) {
      double sum = 0, mx = -1e300;
      for (int j = 0; j < 6; j++) {
        sum += c[j][i];
        if (c[j][i] > mx) mx = c[j][i];
      }
      assert_float_equal(os[i], sum, 1e-4);
      assert_float_equal(om[i], mx, 0);
    }
  }
  dev_tensor_release(m);
  dev_tensor_release(s);
  dev_tensor_release(x);
  for (int r = 0; r < 3; r++) dev_engine_mesh_set_transport(t.e[r], NULL);
  mesh_down(&t);
}

int main(void) {
  int levels[SRV_SUB_COUNT];
  for (int i = 0; i < SRV_SUB_COUNT; i++) levels[i] = SRV_LOG_INFO;
  srv_log_set(levels);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sharded),
      cmocka_unit_test(test_mirrored_and_attrs),
      cmocka_unit_test(test_device_id),
      cmocka_unit_test(test_attr_kinds),
      cmocka_unit_test(test_collective_across_ranks),
      cmocka_unit_test(test_pending),
      cmocka_unit_test(test_rank_out_of_memory),
      cmocka_unit_test(test_rank_lost),
      cmocka_unit_test(test_drop_all),
      cmocka_unit_test(test_refused_command),
      cmocka_unit_test(test_large_transfer),
      cmocka_unit_test(test_per_op_cost),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
