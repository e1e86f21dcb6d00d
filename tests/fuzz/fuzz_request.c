/* libFuzzer target: every request message paradevd decodes, through the
 * path a call's bytes take in the daemon (server/call.c srv__call_begin and
 * srv_on_recv): server/wire.c srv_unpack_bytes with the call's byte budget
 * (srv_budget_bytes), then the checks and conversions of server/convert.c,
 * convert_ckpt.c and convert_fn.c (function definitions) that the method runs before it needs a session, and
 * the escaping of the strings it would log or reply with (server/log.c).
 *
 * Input: the first byte picks the method (modulo the number of methods of
 * proto/paradev/v1/methods.h, every service); the rest is the message. The
 * seed corpus (make_seeds.py) writes each file that way. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "grpc/health/v1/health.pb-c.h"
#include "log.h"
#include "paradev/v1/admin.pb-c.h"
#include "paradev/v1/mesh.pb-c.h"
#include "paradev/v1/methods.h"
#include "paradev/v1/paradev.pb-c.h"
#include "server.h"
#include "shm_int.h"

typedef struct fz_method {
  const char *name;
  const ProtobufCMessageDescriptor *request;
} fz_method;

#define FZ_ENTRY(SVC, METHOD, KIND, REQ, RESP) {#METHOD, &REQ##__descriptor},
static const fz_method fz_methods[] = {PD_ALL_METHODS(FZ_ENTRY)};
#undef FZ_ENTRY
#define FZ_NUM_METHODS (sizeof fz_methods / sizeof fz_methods[0])

/* The daemon's defaults (server/config_keys.c) on 4 devices. */
static const srv_req_limits fz_limits = {65536, 256, 4};
_Static_assert(DEV_ATTR_STRING_MAX >= 256,
               "fz_limits' strings fit the plugins' bound (fz_function)");
#define FZ_NDEV 4
#define FZ_MAX_TENSOR_BYTES ((uint64_t)4 << 30)

/* What a log line, a metric label and a reply would make of a client's
 * string: every escaper, each into a buffer cut short and one that fits. */
static void fz_escape(const char *s) {
  char small[9], big[SRV_LOG_QUOTED(SCHED_NAME_MAX) + 1];
  srv_log_quote(s, small, sizeof small);
  srv_log_quote(s, big, sizeof big);
  srv_log_printable(s, small, sizeof small);
  srv_log_printable(s, big, sizeof big);
  srv_log_utf8(s, small, sizeof small);
  srv_log_utf8(s, big, sizeof big);
  srv_log_clean(s, small, sizeof small);
  srv_log_clean(s, big, sizeof big);
}

/* One op as exec.c srv_execute_item converts it. */
static void fz_op(const Paradev__V1__Operation *op, int index) {
  dev_attr attrs[DEV_MAX_ATTRS];
  dev_devset set;
  sched_op out;
  dev_status st = DEV_STATUS_INIT;
  if (op) {
    srv_op_from_pb(&fz_limits, op, index, attrs, &set, &out, &st);
    fz_escape(op->op);
  }
}

static void fz_upload(int dtype, const Paradev__V1__Shape *shape,
                      const Paradev__V1__Layout *layout, size_t n,
                      Paradev__V1__Shape *const *comps) {
  srv_upload_spec sp;
  dev_status st = DEV_STATUS_INIT;
  srv_upload_spec_from_pb(FZ_NDEV, FZ_MAX_TENSOR_BYTES, dtype, shape, layout, n,
                          comps, &sp, &st);
}

static void fz_download(const Paradev__V1__Layout *layout) {
  dev_layout l;
  int parts = 0;
  dev_status st = DEV_STATUS_INIT;
  srv_download_layout_from_pb(layout, FZ_NDEV, &l, &parts, &st);
}

static void fz_tape(const Paradev__V1__TapeWatch *w,
                    const Paradev__V1__TapeGradient *g) {
  dev_status st = DEV_STATUS_INIT;
  if (w) srv_check_ids(&fz_limits, w->n_ids, "ids to watch", &st);
  if (g) srv_check_ids(&fz_limits, g->n_sources, "sources", &st);
}

/* A function definition as functions.c converts it (convert_fn.c), then
 * back to the wire as DescribeFunction and the plugins would see it, and
 * through the plugins' serialized form. */
static void fz_function(const Paradev__V1__FunctionDef *pb) {
  srv_arena a = {NULL};
  srv_fn_decoded d;
  dev_status st = DEV_STATUS_INIT;
  if (srv_fn_def_from_pb(&fz_limits, pb, &a, &d, &st) == PD_OK) {
    Paradev__V1__FunctionDef *back = NULL;
    pd_code c = srv_fn_def_to_pb(&d.def, &d.opts, &a, &back, &st);
    if (c == PD_INVALID_ARGUMENT) abort(); /* what was decoded can go back */
    if (c == PD_OK) {
      size_t len = paradev__v1__function_def__get_packed_size(back);
      uint8_t *buf = malloc(len ? len : 1);
      if (!buf) abort();
      paradev__v1__function_def__pack(back, buf);
      free(buf);
    }
    uint8_t *bytes = NULL;
    size_t n = 0;
    if (srv_fn_def_to_proto(&d.def, &bytes, &n, &st) == PD_OK) {
      dev_fn_def *again = NULL;
      /* What was accepted once is accepted again (the plugins' bounds
       * are the engine's: DEV_ATTR_STRING_MAX = fz_limits' strings). */
      if (srv_fn_def_from_proto(bytes, n, &again, &st) != PD_OK) abort();
      if (again->num_nodes != d.def.num_nodes) abort();
      srv_fn_def_proto_free(again);
      free(bytes);
    }
  } else if (st.code == PD_OK || !st.msg[0]) {
    abort();
  }
  srv_arena_free(&a);
}

/* convert_fn.c's names of the passes; the engine's table is not linked. */
const char *dev_fn_pass_name(dev_fn_pass p) {
  static const char *const names[DEV_PASS_COUNT] = {
      "pruning",    "cse",    "constant_folding",
      "arithmetic", "fusion", "buffer_planning",
      "cuda_graph"};
  return (int)p >= 0 && p < DEV_PASS_COUNT ? names[p] : NULL;
}

static void fz_enqueue(const Paradev__V1__EnqueueRequest *r) {
  dev_status st = DEV_STATUS_INIT;
  switch (r->item_case) {
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_EXECUTE:
      fz_op(r->execute, 0);
      break;
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_DELETE:
      if (r->delete_) srv_check_ids(&fz_limits, r->delete_->n_ids, "ids", &st);
      break;
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_WATCH_TAPE:
      fz_tape(r->watch_tape, NULL);
      break;
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_GRADIENT:
      fz_tape(NULL, r->gradient);
      break;
    case PARADEV__V1__ENQUEUE_REQUEST__ITEM_REGISTER_FUNCTION:
      if (r->register_function) fz_function(r->register_function->function);
      break;
    default: break;
  }
}

static void fz_checkpoint(const ProtobufCMessage *m) {
  dev_status st = DEV_STATUS_INIT;
  if (m->descriptor == &paradev__v1__load_tensors_request__descriptor) {
    sched_load_request lr;
    if (srv_load_from_pb(&fz_limits, FZ_NDEV, (const void *)m, &lr, &st) ==
        PD_OK)
      srv_load_request_free(&lr);
  } else {
    sched_save_request sr;
    srv_save_from_pb(&fz_limits, (const void *)m, &sr, &st);
    srv_save_request_free(&sr);
  }
}

static void fz_session(const Paradev__V1__CreateSessionRequest *r) {
  dev_status st = DEV_STATUS_INIT;
  srv_check_label(&fz_limits, r->client_name, "client_name", &st);
  srv_check_label(&fz_limits, r->job_id, "job_id", &st);
  fz_escape(r->client_name);
  fz_escape(r->job_id);
}

static void fz_shm(const ProtobufCMessage *m) {
  dev_status st = DEV_STATUS_INIT;
  if (m->descriptor ==
      &paradev__v1__register_shared_memory_request__descriptor) {
    const Paradev__V1__RegisterSharedMemoryRequest *r = (const void *)m;
    srv_check_name(&fz_limits, r->name ? r->name : "", true,
                   "a shared memory region name", &st);
    srv_shm_key_ok(r->key);
    fz_escape(r->key);
  } else if (m->descriptor ==
             &paradev__v1__upload_from_shared_memory_request__descriptor) {
    const Paradev__V1__UploadFromSharedMemoryRequest *r = (const void *)m;
    fz_upload((int)r->dtype, r->shape, r->layout, r->n_component_shapes,
              r->component_shapes);
    srv_shm_check_range(4096, r->region, r->offset, 1, &st);
  } else if (m->descriptor ==
             &paradev__v1__download_to_shared_memory_request__descriptor) {
    const Paradev__V1__DownloadToSharedMemoryRequest *r = (const void *)m;
    fz_download(r->layout);
    srv_shm_check_range(4096, r->region, r->offset, 1, &st);
  }
}

/* The checks a method makes of its request before it opens the session. */
static void fz_convert(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  dev_status st = DEV_STATUS_INIT;
  if (d == &paradev__v1__execute_request__descriptor) {
    const Paradev__V1__ExecuteRequest *r = (const void *)m;
    for (size_t i = 0; i < r->n_ops && i < 64; i++) fz_op(r->ops[i], (int)i);
  } else if (d == &paradev__v1__enqueue_request__descriptor) {
    fz_enqueue((const void *)m);
  } else if (d == &paradev__v1__upload_request__descriptor) {
    const Paradev__V1__UploadRequest *r = (const void *)m;
    if (r->item_case == PARADEV__V1__UPLOAD_REQUEST__ITEM_HEADER && r->header)
      fz_upload((int)r->header->dtype, r->header->shape, r->header->layout,
                r->header->n_component_shapes, r->header->component_shapes);
  } else if (d == &paradev__v1__download_request__descriptor) {
    fz_download(((const Paradev__V1__DownloadRequest *)m)->layout);
  } else if (d == &paradev__v1__load_tensors_request__descriptor ||
             d == &paradev__v1__save_tensors_request__descriptor) {
    fz_checkpoint(m);
  } else if (d == &paradev__v1__create_session_request__descriptor) {
    fz_session((const void *)m);
  } else if (d == &paradev__v1__watch_tape_request__descriptor) {
    fz_tape(((const Paradev__V1__WatchTapeRequest *)m)->watch, NULL);
  } else if (d == &paradev__v1__gradient_request__descriptor) {
    fz_tape(NULL, ((const Paradev__V1__GradientRequest *)m)->gradient);
  } else if (d == &paradev__v1__register_function_request__descriptor) {
    fz_function(((const Paradev__V1__RegisterFunctionRequest *)m)->function);
  } else if (d == &paradev__v1__describe_function_request__descriptor) {
    const char *name = ((const Paradev__V1__DescribeFunctionRequest *)m)->name;
    srv_check_name(&fz_limits, name, true, "the function's name", &st);
    fz_escape(name);
  } else if (d == &paradev__v1__sync_request__descriptor) {
    srv_check_ids(&fz_limits, ((const Paradev__V1__SyncRequest *)m)->n_ids,
                  "ids", &st);
  } else if (d == &paradev__v1__set_log_level_request__descriptor) {
    int levels[SRV_SUB_COUNT] = {0};
    char err[512];
    const char *spec = ((const Paradev__V1__SetLogLevelRequest *)m)->spec;
    srv_log_parse_spec(spec, levels, err, sizeof err);
  } else if (d == &paradev__v1__kill_session_request__descriptor) {
    const Paradev__V1__KillSessionRequest *r = (const void *)m;
    if (r->target_case == PARADEV__V1__KILL_SESSION_REQUEST__TARGET_JOB_ID)
      fz_escape(r->job_id);
  } else if (d == &paradev__v1__list_sessions_request__descriptor) {
    fz_escape(((const Paradev__V1__ListSessionsRequest *)m)->job_id);
  } else if (d == &grpc__health__v1__health_check_request__descriptor) {
    fz_escape(((const Grpc__Health__V1__HealthCheckRequest *)m)->service);
  } else {
    fz_shm(m);
  }
}

/* convert.c's ListOps reply (srv_op_def_to_pb) asks the engine's gradient
 * registry, which this target does not link (it decodes requests; replies
 * are built from the registry, not from client bytes). Never called. */
bool dev_op_def_has_gradient(const dev_op_def *def) {
  (void)def;
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const fz_method *fm = &fz_methods[data[0] % FZ_NUM_METHODS];
  data++;
  size--;
  srv_budget b;
  srv_budget_init(&b, srv_budget_bytes(size));
  size_t budget = b.left;
  dev_status st = DEV_STATUS_INIT;
  ProtobufCMessage *m = srv_unpack_bytes(fm->request, data, size, &b, &st);
  if (!m) {
    /* Every refusal says what was wrong. */
    if (st.code == PD_OK || !st.msg[0]) abort();
    if (b.left != budget) abort(); /* everything given back */
    return 0;
  }
  fz_convert(m);
  /* What decoded packs again (replies are packed the same way). */
  size_t len = protobuf_c_message_get_packed_size(m);
  uint8_t *re = malloc(len ? len : 1);
  if (!re || protobuf_c_message_pack(m, re) != len) abort();
  free(re);
  protobuf_c_message_free_unpacked(m, &b.alloc);
  if (b.left != budget) abort();
  return 0;
}
