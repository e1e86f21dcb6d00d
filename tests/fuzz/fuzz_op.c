/* libFuzzer target: one Operation of an Execute or Enqueue, from its bytes
 * to a prepared op, as far as it goes before anything runs: server/wire.c
 * srv_unpack_bytes (the call's budget), convert.c srv_op_from_pb (the
 * request-shape limits), then the engine's validation, device/
 * dev_op_prepare: the op's lookup in the registry, arity, attributes
 * (names, kinds, ranges, required ones) and shape inference on every
 * component, on inputs of every dtype and of shapes mirrored and sharded
 * unevenly over 4 CPU devices. The prepared op is abandoned, never run
 * (its outputs are not allocated: a RandomNormal of 2^40 elements costs
 * nothing here, and quotas are the scheduler's).
 *
 * Input: an Operation message (paradev.proto); an input id picks one of the
 * tensors below by id modulo their number. Seeds: make_seeds.py writes the
 * ops the tests run. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "paradev/v1/paradev.pb-c.h"
#include "server.h"

#define FZ_NDEV 4
#define FZ_NT 16

static dev_engine *fz_engine;
static dev_tensor *fz_inputs[FZ_NT];

static dev_tensor *fz_tensor(pd_dtype dt, int rank, const int64_t *dims,
                             dev_layout_kind kind, int axis) {
  dev_shape s;
  dev_status st = DEV_STATUS_INIT;
  if (dev_shape_make(rank, dims, &s, &st) != PD_OK) abort();
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  void *buf = calloc((size_t)(n ? n : 1), pd_dtype_size(dt));
  dev_layout lay = {kind, axis, 0};
  dev_tensor *t = NULL;
  if (!buf ||
      dev_tensor_from_host(fz_engine, dt, &lay, &s, buf, &t, &st) != PD_OK ||
      dev_tensor_wait(t, &st) != PD_OK) {
    fprintf(stderr, "fuzz_op: input: %s\n", st.msg);
    abort();
  }
  free(buf);
  return t;
}

static void fz_init(void) {
  dev_engine_config cfg = DEV_ENGINE_CONFIG_INITIALIZER;
  cfg.num_devices = FZ_NDEV;
  cfg.memory_limit = 64 << 20;
  dev_status st = DEV_STATUS_INIT;
  if (dev_engine_create(&cfg, &fz_engine, &st) != PD_OK) {
    fprintf(stderr, "fuzz_op: engine: %s\n", st.msg);
    abort();
  }
  static const int64_t d23[] = {2, 3}, d3[] = {3}, d413[] = {4, 1, 3},
                       d02[] = {0, 2}, d5[] = {5}, d32[] = {3, 2},
                       d2222[] = {2, 2, 2, 2}, d61[] = {6, 1};
  const dev_layout_kind M = DEV_LAYOUT_MIRRORED, S = DEV_LAYOUT_SHARDED;
  int k = 0;
  fz_inputs[k++] = fz_tensor(PD_FLOAT32, 2, d23, M, 0);
  fz_inputs[k++] = fz_tensor(PD_FLOAT32, 0, NULL, M, 0);
  fz_inputs[k++] = fz_tensor(PD_FLOAT32, 1, d3, M, 0);
  fz_inputs[k++] = fz_tensor(PD_FLOAT32, 2, d32, M, 0);
  fz_inputs[k++] = fz_tensor(PD_INT32, 1, d3, M, 0);
  fz_inputs[k++] = fz_tensor(PD_INT64, 2, d23, M, 0);
  fz_inputs[k++] = fz_tensor(PD_BOOL, 1, d3, M, 0);
  fz_inputs[k++] = fz_tensor(PD_UINT8, 3, d413, M, 0);
  fz_inputs[k++] = fz_tensor(PD_FLOAT64, 2, d02, M, 0);
  fz_inputs[k++] = fz_tensor(PD_FLOAT16, 1, d5, S, 0); /* 2,1,1,1 */
  fz_inputs[k++] = fz_tensor(PD_BFLOAT16, 2, d61, S, 0);
  fz_inputs[k++] = fz_tensor(PD_FLOAT32, 2, d61, S, 0); /* uneven: -1 */
  fz_inputs[k++] = fz_tensor(PD_FLOAT32, 4, d2222, M, 0);
  fz_inputs[k++] = fz_tensor(PD_INT32, 0, NULL, M, 0);
  fz_inputs[k++] = fz_tensor(PD_INT64, 1, d5, S, 0);
  fz_inputs[k++] = fz_tensor(PD_FLOAT32, 2, d32, S, 1);
}

/* The reply's TensorInfos, both ways the daemon builds them (Execute:
 * srv_result_to_pb in an arena; Enqueue: srv_op_infos_fill), packed. */
static void fz_reply(const sched_op *op, const dev_op *p) {
  sched_op_result r;
  pd_dtype more_dtype[DEV_MAX_OUTPUTS];
  dev_shape more_shape[DEV_MAX_OUTPUTS];
  memset(&r, 0, sizeof r);
  r.more_dtype = more_dtype;
  r.more_shape = more_shape;
  r.num_outputs = dev_op_num_outputs(p);
  for (int i = 0; i < r.num_outputs && i < DEV_MAX_OUTPUTS; i++) {
    pd_dtype *dt = i < SCHED_RESULT_INLINE
                       ? &r.dtype[i]
                       : &more_dtype[i - SCHED_RESULT_INLINE];
    dev_shape *sh = i < SCHED_RESULT_INLINE
                        ? &r.shape[i]
                        : &more_shape[i - SCHED_RESULT_INLINE];
    *dt = dev_tensor_dtype(dev_op_output(p, i));
    *sh = *dev_tensor_shape(dev_op_output(p, i));
  }
  srv_arena a = {NULL};
  Paradev__V1__OpResult *pr = srv_result_to_pb(&a, op, &r);
  if (pr) {
    uint8_t *out = malloc(protobuf_c_message_get_packed_size(&pr->base) + 1);
    if (!out) abort();
    protobuf_c_message_pack(&pr->base, out);
    free(out);
  }
  srv_op_infos infos;
  srv_op_infos_fill(&infos, &a, op, &r);
  srv_arena_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!fz_engine) fz_init();
  srv_budget b;
  srv_budget_init(&b, srv_budget_bytes(size));
  dev_status st = DEV_STATUS_INIT;
  ProtobufCMessage *m = srv_unpack_bytes(&paradev__v1__operation__descriptor,
                                         data, size, &b, &st);
  if (!m) return 0;
  const srv_req_limits limits = {65536, 256, 4};
  dev_attr attrs[DEV_MAX_ATTRS];
  dev_devset set;
  sched_op op;
  if (srv_op_from_pb(&limits, (const void *)m, 0, attrs, &set, &op, &st) ==
      PD_OK) {
    dev_tensor *in[DEV_MAX_INPUTS];
    for (int i = 0; i < op.num_inputs; i++)
      in[i] = fz_inputs[op.inputs[i] % FZ_NT];
    dev_op *p = NULL;
    pd_code rc = dev_op_prepare(fz_engine, op.op_name, in, op.num_inputs,
                                op.attrs, op.num_attrs, &p, &st);
    if (rc == PD_OK) {
      /* Every output has a dtype and a known shape per component. */
      for (int i = 0; i < dev_op_num_outputs(p); i++) {
        dev_tensor *t = dev_op_output(p, i);
        if (!dev_dtype_is_valid(dev_tensor_dtype(t))) abort();
        const dev_shape *s = dev_tensor_shape(t);
        if (s->rank < 0 || s->rank > PD_MAX_RANK) abort();
        for (int c = 0; c < dev_tensor_num_components(t); c++) {
          const dev_shape *cs = dev_tensor_component_shape(t, c);
          for (int a = 0; a < cs->rank; a++)
            if (cs->dims[a] < 0) abort(); /* a component's shape is known */
        }
      }
      /* Only for an op that names one id per output, as the scheduler
       * requires before any reply is built (scheduler/execute.c). */
      if (op.num_outputs == dev_op_num_outputs(p)) fz_reply(&op, p);
      dev_op_new_bytes(p);
      dev_op_abandon(p, PD_CANCELLED, "fuzz: not run");
    } else if (!st.msg[0]) {
      abort(); /* a refusal says why */
    }
  }
  protobuf_c_message_free_unpacked(m, &b.alloc);
  return 0;
}
