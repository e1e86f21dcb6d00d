/* Graph functions on the wire (issue #11): RegisterFunction and
 * DescribeFunction, and the Enqueue item that registers. The server only
 * converts: the definitions live in the session's function library
 * (scheduler), which the engine owns (device/fn/). */
#include "paradev/v1/paradev.pb-c.h"
#include "srv_int.h"

static void srv_register_function(srv_call *c, const ProtobufCMessage *m) {
  (void)m;
  dev_status st = DEV_STATUS_INIT;
  dev_error(&st, PD_UNIMPLEMENTED, "RegisterFunction is not implemented yet");
  srv_call_fail(c, &st);
}

static void srv_describe_function(srv_call *c, const ProtobufCMessage *m) {
  (void)m;
  dev_status st = DEV_STATUS_INIT;
  dev_error(&st, PD_UNIMPLEMENTED, "DescribeFunction is not implemented yet");
  srv_call_fail(c, &st);
}

const srv_handlers srv_h_RegisterFunction = {.on_request =
                                                 srv_register_function};
const srv_handlers srv_h_DescribeFunction = {.on_request =
                                                 srv_describe_function};
