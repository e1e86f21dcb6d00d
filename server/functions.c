/* Graph functions on the wire (issue #11): RegisterFunction and
 * DescribeFunction, and the Enqueue item that registers. The server only
 * converts (convert_fn.c): the definitions live in the session's function
 * library (scheduler/functions.c), which the engine owns (device/fn/). A
 * call of a function is an ordinary Execute / Enqueue op (exec.c). */
#include <stdlib.h>

#include "convert.h"
#include "mesh.h"
#include "paradev/v1/paradev.pb-c.h"
#include "srv_int.h"

pd_code srv_register_function_item(
    const srv_req_limits *l, sched_session *ss,
    const Paradev__V1__RegisterFunctionRequest *r, bool *existed,
    dev_status *st) {
  if (!r)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "no register_function item: set its function");
  srv_arena a = {NULL};
  srv_fn_decoded d;
  pd_code c = srv_fn_def_from_pb(l, r->function, &a, &d, st);
  if (c == PD_OK) c = sched_register_function(ss, &d.def, &d.opts, existed, st);
  srv_arena_free(&a);
  return c;
}

static void srv_register_function(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__RegisterFunctionRequest *req = (const void *)m;
  dev_status st = DEV_STATUS_INIT;
  if (srv_mesh_check_functions(c->s->mesh, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  srv_req_limits l = srv_call_limits(c);
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  bool existed = false;
  if (srv_register_function_item(&l, ss, req, &existed, &st) != PD_OK) {
    srv_call_fail(c, &st);
  } else {
    Paradev__V1__RegisterFunctionResponse resp =
        PARADEV__V1__REGISTER_FUNCTION_RESPONSE__INIT;
    resp.already_registered = existed;
    resp.incarnation = c->s->incarnation;
    srv_call_reply(c, &resp.base);
  }
  sched_session_put(ss);
}

static void srv_describe_function(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DescribeFunctionRequest *req = (const void *)m;
  srv_req_limits l = srv_call_limits(c);
  dev_status st = DEV_STATUS_INIT;
  const char *name = req->name ? req->name : "";
  if (srv_check_name(&l, name, true, "the function's name", &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  dev_fn_info *info = calloc(1, sizeof(*info)); /* ~40 KiB: not the stack */
  srv_arena a = {NULL};
  pd_code rc =
      info ? PD_OK
           : dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  if (rc == PD_OK) {
    info->struct_size = sizeof(*info);
    rc = sched_describe_function(ss, name, info, &st);
  }
  Paradev__V1__DescribeFunctionResponse resp =
      PARADEV__V1__DESCRIBE_FUNCTION_RESPONSE__INIT;
  bool described = rc == PD_OK;
  if (rc == PD_OK) rc = srv_fn_info_to_pb(info, &a, &resp, &st);
  if (rc == PD_OK) {
    resp.incarnation = c->s->incarnation;
    srv_call_reply(c, &resp.base);
  } else {
    srv_call_fail(c, &st);
  }
  srv_arena_free(&a);
  if (described) {
    dev_fn_def_free(info->def);
    dev_fn_def_free(info->optimized);
  }
  free(info);
  sched_session_put(ss);
}

const srv_handlers srv_h_RegisterFunction = {.on_request =
                                                 srv_register_function};
const srv_handlers srv_h_DescribeFunction = {.on_request =
                                                 srv_describe_function};
