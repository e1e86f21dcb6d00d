/* Every method of the services paradevd serves, written once.
 *
 * The daemon's method table (server/) and libparadev's call paths (client/)
 * are both expanded from these lists, and tests/unit/test_methods.c checks
 * them against protobuf-c's service descriptors in both directions, so a
 * method added to a .proto and forgotten here, or listed here and served by
 * no one, fails a test.
 *
 * Each entry is X(SERVICE, METHOD, KIND, REQUEST, RESPONSE) where
 *   SERVICE  the service's C prefix in the generated code: PD_SVC_* below;
 *   METHOD   the method's name as in the .proto (CamelCase);
 *   KIND     UNARY, CLIENT_STREAM, SERVER_STREAM or BIDI;
 *   REQUEST, RESPONSE  the message types' generated C prefixes (lower case,
 *            e.g. paradev__v1__echo_request), so `REQUEST##__descriptor`
 *            names the message descriptor.
 *
 * Use PD_METHOD_PATH(SERVICE, METHOD) for the HTTP/2 path,
 * "/paradev.v1.ParallelDevice/Echo".
 */
#ifndef PARADEV_PROTO_METHODS_H
#define PARADEV_PROTO_METHODS_H

/* Full service names, as the .proto files declare them. */
#define PD_SVC_PARALLEL_DEVICE "paradev.v1.ParallelDevice"
#define PD_SVC_ADMIN "paradev.v1.Admin"
#define PD_SVC_HEALTH "grpc.health.v1.Health"
#define PD_SVC_MESH "paradev.v1.Mesh"

/* "/<service>/<method>": the path a call carries. */
#define PD_METHOD_PATH(SERVICE, METHOD) "/" SERVICE "/" #METHOD

#define PD_PARALLEL_DEVICE_METHODS(X)                                          \
  X(PD_SVC_PARALLEL_DEVICE, GetServerInfo, UNARY,                              \
    paradev__v1__get_server_info_request,                                      \
    paradev__v1__get_server_info_response)                                     \
  X(PD_SVC_PARALLEL_DEVICE, ListOps, UNARY, paradev__v1__list_ops_request,     \
    paradev__v1__list_ops_response)                                            \
  X(PD_SVC_PARALLEL_DEVICE, CreateSession, UNARY,                              \
    paradev__v1__create_session_request, paradev__v1__create_session_response) \
  X(PD_SVC_PARALLEL_DEVICE, KeepAlive, UNARY, paradev__v1__keep_alive_request, \
    paradev__v1__keep_alive_response)                                          \
  X(PD_SVC_PARALLEL_DEVICE, CloseSession, UNARY,                               \
    paradev__v1__close_session_request, paradev__v1__close_session_response)   \
  X(PD_SVC_PARALLEL_DEVICE, Upload, CLIENT_STREAM,                             \
    paradev__v1__upload_request, paradev__v1__upload_response)                 \
  X(PD_SVC_PARALLEL_DEVICE, Download, SERVER_STREAM,                           \
    paradev__v1__download_request, paradev__v1__download_response)             \
  X(PD_SVC_PARALLEL_DEVICE, Execute, UNARY, paradev__v1__execute_request,      \
    paradev__v1__execute_response)                                             \
  X(PD_SVC_PARALLEL_DEVICE, Enqueue, BIDI, paradev__v1__enqueue_request,       \
    paradev__v1__enqueue_response)                                             \
  X(PD_SVC_PARALLEL_DEVICE, StartTape, UNARY, paradev__v1__start_tape_request, \
    paradev__v1__start_tape_response)                                          \
  X(PD_SVC_PARALLEL_DEVICE, WatchTape, UNARY, paradev__v1__watch_tape_request, \
    paradev__v1__watch_tape_response)                                          \
  X(PD_SVC_PARALLEL_DEVICE, Gradient, UNARY, paradev__v1__gradient_request,    \
    paradev__v1__gradient_response)                                            \
  X(PD_SVC_PARALLEL_DEVICE, DeleteTape, UNARY,                                 \
    paradev__v1__delete_tape_request, paradev__v1__delete_tape_response)       \
  X(PD_SVC_PARALLEL_DEVICE, Sync, UNARY, paradev__v1__sync_request,            \
    paradev__v1__sync_response)                                                \
  X(PD_SVC_PARALLEL_DEVICE, Describe, UNARY, paradev__v1__describe_request,    \
    paradev__v1__describe_response)                                            \
  X(PD_SVC_PARALLEL_DEVICE, Delete, UNARY, paradev__v1__delete_request,        \
    paradev__v1__delete_response)                                              \
  X(PD_SVC_PARALLEL_DEVICE, RegisterSharedMemory, UNARY,                       \
    paradev__v1__register_shared_memory_request,                               \
    paradev__v1__register_shared_memory_response)                              \
  X(PD_SVC_PARALLEL_DEVICE, UnregisterSharedMemory, UNARY,                     \
    paradev__v1__unregister_shared_memory_request,                             \
    paradev__v1__unregister_shared_memory_response)                            \
  X(PD_SVC_PARALLEL_DEVICE, UploadFromSharedMemory, UNARY,                     \
    paradev__v1__upload_from_shared_memory_request,                            \
    paradev__v1__upload_response)                                              \
  X(PD_SVC_PARALLEL_DEVICE, DownloadToSharedMemory, UNARY,                     \
    paradev__v1__download_to_shared_memory_request,                            \
    paradev__v1__download_to_shared_memory_response)                           \
  X(PD_SVC_PARALLEL_DEVICE, LoadTensors, UNARY,                                \
    paradev__v1__load_tensors_request, paradev__v1__load_tensors_response)     \
  X(PD_SVC_PARALLEL_DEVICE, GetLoadProgress, UNARY,                            \
    paradev__v1__get_load_progress_request,                                    \
    paradev__v1__get_load_progress_response)                                   \
  X(PD_SVC_PARALLEL_DEVICE, SaveTensors, UNARY,                                \
    paradev__v1__save_tensors_request, paradev__v1__save_tensors_response)     \
  X(PD_SVC_PARALLEL_DEVICE, RegisterFunction, UNARY,                           \
    paradev__v1__register_function_request,                                    \
    paradev__v1__register_function_response)                                   \
  X(PD_SVC_PARALLEL_DEVICE, DescribeFunction, UNARY,                           \
    paradev__v1__describe_function_request,                                    \
    paradev__v1__describe_function_response)                                   \
  X(PD_SVC_PARALLEL_DEVICE, Echo, UNARY, paradev__v1__echo_request,            \
    paradev__v1__echo_response)                                                \
  X(PD_SVC_PARALLEL_DEVICE, EchoStream, BIDI, paradev__v1__echo_request,       \
    paradev__v1__echo_response)

#define PD_ADMIN_METHODS(X)                                                    \
  X(PD_SVC_ADMIN, ListSessions, UNARY, paradev__v1__list_sessions_request,     \
    paradev__v1__list_sessions_response)                                       \
  X(PD_SVC_ADMIN, KillSession, UNARY, paradev__v1__kill_session_request,       \
    paradev__v1__kill_session_response)                                        \
  X(PD_SVC_ADMIN, Drain, UNARY, paradev__v1__drain_request,                    \
    paradev__v1__drain_response)                                               \
  X(PD_SVC_ADMIN, SetLogLevel, UNARY, paradev__v1__set_log_level_request,      \
    paradev__v1__set_log_level_response)                                       \
  X(PD_SVC_ADMIN, CreateJobToken, UNARY,                                       \
    paradev__v1__create_job_token_request,                                     \
    paradev__v1__create_job_token_response)                                    \
  X(PD_SVC_ADMIN, KillJob, UNARY, paradev__v1__kill_job_request,               \
    paradev__v1__kill_job_response)

#define PD_HEALTH_METHODS(X)                                                   \
  X(PD_SVC_HEALTH, Check, UNARY, grpc__health__v1__health_check_request,       \
    grpc__health__v1__health_check_response)                                   \
  X(PD_SVC_HEALTH, Watch, SERVER_STREAM,                                       \
    grpc__health__v1__health_check_request,                                    \
    grpc__health__v1__health_check_response)

/* The daemon-to-daemon service of a mesh across machines (issue #16,
 * mesh.proto): served by the coordinator on its mesh port only. */
#define PD_MESH_METHODS(X)                                                     \
  X(PD_SVC_MESH, Attach, BIDI, paradev__v1__rank_message,                      \
    paradev__v1__coordinator_message)                                          \
  X(PD_SVC_MESH, KvSet, UNARY, paradev__v1__kv_set_request,                    \
    paradev__v1__kv_set_response)                                              \
  X(PD_SVC_MESH, KvGet, UNARY, paradev__v1__kv_get_request,                    \
    paradev__v1__kv_get_response)

/* Every method of every service. */
#define PD_ALL_METHODS(X)                                                      \
  PD_PARALLEL_DEVICE_METHODS(X) PD_ADMIN_METHODS(X) PD_HEALTH_METHODS(X)      \
      PD_MESH_METHODS(X)

#endif /* PARADEV_PROTO_METHODS_H */
