/* ListOps: the op reference, read from the engine's registry (every op in
 * name order, or the one named). Needs no session; the reply's strings and
 * defaults point at the registry's static data (convert.c builds it). */
#include <string.h>

#include "server.h"

static void srv_list_ops(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__ListOpsRequest *req = (const void *)m;
  const char *name = req->name ? req->name : "";
  srv_arena a = {NULL};
  int n = name[0] ? 1 : dev_op_count();
  const dev_op_def *one = name[0] ? dev_op_lookup(name) : NULL;
  if (name[0] && !one) {
    srv_call_finish(c, PD_NOT_FOUND,
                    "no op named '%.128s'; `paradev ops` lists the %d "
                    "registered ops (names are TensorFlow's raw-op spelling, "
                    "e.g. MatMul)",
                    name, dev_op_count());
    return;
  }
  Paradev__V1__OpDef **ops = srv_arena_alloc(&a, sizeof *ops * (size_t)n);
  bool ok = ops != NULL;
  for (int i = 0; ok && i < n; i++)
    ok = (ops[i] = srv_op_def_to_pb(one ? one : dev_op_at(i), &a)) != NULL;
  if (!ok) {
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  Paradev__V1__ListOpsResponse resp = PARADEV__V1__LIST_OPS_RESPONSE__INIT;
  resp.n_ops = (size_t)n;
  resp.ops = ops;
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
}

const srv_handlers srv_h_ListOps = {.on_request = srv_list_ops};
