/* Conversions between paradev.proto messages and engine/scheduler types, and
 * the one checker of a request's shape against the limits (ops per request,
 * inputs, outputs and attrs per op, attribute sizes, name lengths, ids per
 * request, rank). Every limit has one message, written here.
 *
 * Depends on nothing else in server/ but log.h (srv_log_clean, to keep
 * statuses printable): the method files call it, it calls no one. Replies
 * are built in an arena (srv_arena) that the method frees once it packed
 * them. Thread-safe: no state. */
#ifndef PARADEV_SERVER_CONVERT_H
#define PARADEV_SERVER_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "paradev/v1/paradev.pb-c.h"
#include "scheduler.h"

/* --- the reply arena --------------------------------------------------------- */

/* Blocks freed together once a reply is packed. */
typedef struct srv_arena {
  struct srv_arena_block {
    struct srv_arena_block *next;
    max_align_t align[];
  } * head;
} srv_arena;

/* Zeroed memory that lives until srv_arena_free; NULL when out of memory. */
void *srv_arena_alloc(srv_arena *a, size_t bytes);
void srv_arena_free(srv_arena *a);

/* --- request limits ---------------------------------------------------------- */

/* The request-shape limits in force for one call (a SIGHUP may change them
 * between calls); the values GetServerInfo reports. max_ops_per_request is
 * the scheduler's (sched_check_ops). */
typedef struct srv_req_limits {
  int max_ids_per_request;
  int max_string_bytes; /* op names, attr names and string values */
  /* The mesh's devices (issue #17): a request's device indices are
   * 0..num_devices-1. */
  int num_devices;
} srv_req_limits;

/* INVALID_ARGUMENT when `n` ids (`what`: "ids", "ids to watch", ...) pass
 * max_ids_per_request. */
pd_code srv_check_ids(const srv_req_limits *l, size_t n, const char *what,
                      dev_status *st);
/* INVALID_ARGUMENT naming `what` unless `s` is 1 to max_string_bytes bytes
 * (`printable`: of printable ASCII too; else of UTF-8, naming the first byte
 * that is not). */
pd_code srv_check_name(const srv_req_limits *l, const char *s, bool printable,
                       const char *what, dev_status *st);

/* INVALID_ARGUMENT naming `what` when `s` (NULL: empty) passes
 * max_string_bytes or is not UTF-8 (naming the byte offset: proto3 strings
 * are UTF-8, and a reply or a file carrying such bytes would not parse in
 * other readers); empty is allowed (a metadata value). */
pd_code srv_check_string(const srv_req_limits *l, const char *s,
                         const char *what, dev_status *st);
/* srv_check_string, and no control characters (C0, DEL, C1: a newline, an
 * escape sequence), naming the byte offset: client names and job ids, which
 * logs, /metrics labels and `paradev admin` then show exactly as given. */
pd_code srv_check_label(const srv_req_limits *l, const char *s,
                        const char *what, dev_status *st);

/* --- shapes, dtypes, tensors -------------------------------------------------- */

/* Proto Shape (NULL: a scalar) -> dev_shape: INVALID_ARGUMENT (naming `what`)
 * for rank over PD_MAX_RANK or a negative dim. */
pd_code srv_shape_from_pb(const Paradev__V1__Shape *pb, const char *what,
                          dev_shape *out, dev_status *st);
Paradev__V1__Shape *srv_shape_to_pb(srv_arena *a, const dev_shape *s);
/* Wire dtype -> pd_dtype: INVALID_ARGUMENT outside 1..PD_DTYPE_COUNT-1. */
pd_code srv_dtype_from_pb(int v, const char *what, pd_dtype *out,
                          dev_status *st);
/* `devices` (NULL: none sent) is the tensor's device set (TensorInfo.devices,
 * copied into `a`). */
Paradev__V1__TensorInfo *srv_info_to_pb(srv_arena *a, uint64_t id, pd_dtype dt,
                                        const dev_shape *shape,
                                        const dev_devset *devices);
/* `n` shapes as a proto array in `a`; NULL when out of memory. */
Paradev__V1__Shape **srv_shapes_to_pb(srv_arena *a, const dev_shape *shapes,
                                      int n);
/* A dev_status as a proto Status; `msg` (DEV_STATUS_MSG_MAX bytes) holds its
 * printable text (proto3 strings are UTF-8). */
void srv_status_to_pb(const dev_status *st, char *msg,
                      Paradev__V1__Status *out);

/* --- device sets (issue #17: placement) ------------------------------------- */

/* A request's `devices` field (`n` daemon device indices, in order; `what`
 * names the field, "UploadHeader.devices") -> a device set in `room`, *out
 * pointing at it; n == 0: *out = NULL (the session's default). The one
 * check of every `devices` field: INVALID_ARGUMENT naming the field and the
 * entry for more than PD_MAX_DEVICES or l->num_devices entries, an index
 * outside 0..num_devices-1 ("UploadHeader.devices[1] = 7: the mesh has
 * devices 0..3"), or an index given twice. Whether the session may use the
 * devices is the scheduler's (PERMISSION_DENIED). */
pd_code srv_devset_from_pb(const srv_req_limits *l, const int32_t *devs,
                           size_t n, const char *what, dev_devset *room,
                           const dev_devset **out, dev_status *st);
/* The set's devices into out[0..s->n) (PD_MAX_DEVICES room); returns s->n. */
size_t srv_devset_to_pb(const dev_devset *s, int32_t *out);
/* `s` as a repeated int32 field in `a`: *n and *devs; false when out of
 * memory. */
bool srv_devset_to_arena(srv_arena *a, const dev_devset *s, size_t *n,
                         int32_t **devs);

/* --- operations --------------------------------------------------------------- */

/* Proto Operation -> sched_op, checking the per-op limits and its
 * placement (Operation.devices, srv_devset_from_pb: out->devices NULL when
 * empty). `attrs` holds DEV_MAX_ATTRS entries, `set` one device set; the
 * result points into `pb`, `attrs` and `set`. */
pd_code srv_op_from_pb(const srv_req_limits *l,
                       const Paradev__V1__Operation *pb, int index,
                       dev_attr *attrs, dev_devset *set, sched_op *out,
                       dev_status *st);
/* attrs[0..n) of op or node `index` named `name` (`kind`: "op", "node",
 * for the messages) -> dev_attr, as srv_op_from_pb decodes an op's: names
 * and strings within max_string_bytes, lists within DEV_ATTR_LIST_MAX, at
 * most DEV_MAX_ATTRS (out holds that many). The result points into
 * `attrs`. Errors: INVALID_ARGUMENT naming the op and the attr. */
pd_code srv_attrs_from_pb(const srv_req_limits *l, const char *kind, int index,
                          const char *name, Paradev__V1__Attr *const *attrs,
                          size_t n, dev_attr *out, dev_status *st);
/* An attribute's value as an AttrValue in `a` (lists and shapes point at
 * `v`'s storage); NULL when out of memory. */
Paradev__V1__AttrValue *srv_attr_value_to_pb(const dev_attr_value *v,
                                             srv_arena *a);
/* An op's outputs as an OpResult in `a` (devices left empty: the method
 * reads them from the published handles, server.h srv_call_infos_devices).
 * NULL when out of memory. */
Paradev__V1__OpResult *srv_result_to_pb(srv_arena *a, const sched_op *op,
                                        const sched_op_result *r);

/* One op's outputs as TensorInfos in caller storage (no allocation: the path
 * of every streamed op), for up to SCHED_RESULT_INLINE outputs; an op with
 * more (a list output) gets them from arena `a` (srv_result_to_pb). `devs`
 * is room for the inline outputs' device sets (filled by the method, as
 * srv_result_to_pb's). `ptrs` and `n` are the reply's. False when the arena
 * is out of memory. */
typedef struct srv_op_infos {
  Paradev__V1__TensorInfo info[SCHED_RESULT_INLINE];
  Paradev__V1__TensorInfo *local[SCHED_RESULT_INLINE], **ptrs;
  Paradev__V1__Shape shape[SCHED_RESULT_INLINE];
  int64_t dims[SCHED_RESULT_INLINE][PD_MAX_RANK];
  int32_t devs[SCHED_RESULT_INLINE][PD_MAX_DEVICES];
  size_t n;
} srv_op_infos;
bool srv_op_infos_fill(srv_op_infos *o, srv_arena *a, const sched_op *op,
                       const sched_op_result *r);

/* --- transfers ------------------------------------------------------------------ */

/* What an upload's header says (Upload, UploadFromSharedMemory). */
typedef struct srv_upload_spec {
  pd_dtype dtype;
  dev_layout layout;               /* MIRRORED, SHARDED or PER_COMPONENT */
  dev_shape host;                  /* MIRRORED, SHARDED */
  dev_shape comps[PD_MAX_DEVICES]; /* PER_COMPONENT: one per device */
  uint64_t total;                  /* host bytes, all components together */
} srv_upload_spec;

/* Checks an upload header's dtype, shape, layout and component shapes
 * against a tensor of `ndev` components (the size of its device set: the
 * header's devices, else the session's default) and `max_tensor_bytes`:
 * INVALID_ARGUMENT
 * naming what was wrong (a sharded scalar, an axis out of range),
 * RESOURCE_EXHAUSTED over max_tensor_bytes. */
pd_code srv_upload_spec_from_pb(int ndev, uint64_t max_tensor_bytes, int dtype,
                                const Paradev__V1__Shape *shape,
                                const Paradev__V1__Layout *layout,
                                size_t n_component_shapes,
                                Paradev__V1__Shape *const *component_shapes,
                                srv_upload_spec *out, dev_status *st);

/* A download's layout for a tensor of `ndev` components; *num_parts gets
 * the host values it makes (ndev for PER_COMPONENT, else 1).
 * INVALID_ARGUMENT, naming the layouts that exist, for no layout (NULL) or
 * LAYOUT_UNSPECIFIED (never guessed), an unknown kind, or a component out
 * of range. (Whether MIRRORED fits the tensor is the engine's check,
 * dev_tensor_host_size.) */
pd_code srv_download_layout_from_pb(const Paradev__V1__Layout *pb, int ndev,
                                    dev_layout *out, int *num_parts,
                                    dev_status *st);

/* DownloadResponse{chunk: DownloadChunk{component, offset, data}} encoded by
 * hand, so that the tensor's bytes can be read straight into the outgoing
 * buffer: srv_chunk_header_len is the bytes before the data, and
 * srv_chunk_header writes them and returns where the `len` data bytes go. */
size_t srv_chunk_header_len(int component, uint64_t offset, size_t len);
uint8_t *srv_chunk_header(uint8_t *p, int component, uint64_t offset,
                          size_t len);

/* The op reference (ListOps): `def` as an OpDef, every message and array in
 * `a` (strings and default values point at the registry's static data).
 * NULL when out of memory. */
Paradev__V1__OpDef *srv_op_def_to_pb(const dev_op_def *def, srv_arena *a);

/* --- checkpoints ------------------------------------------------------------- */

/* Request-shape limits of LoadTensors and SaveTensors (paradev.proto,
 * "Checkpoints"): tensors per request (the scheduler's), metadata entries,
 * and bytes of a source, path or component source (NUL excluded). */
#define SRV_CKPT_MAX_TENSORS SCHED_LOAD_MAX_TENSORS
#define SRV_CKPT_MAX_META 64
#define SRV_CKPT_PATH_MAX 4095

/* A LoadTensors request -> sched_load_request for a mesh of `ndev` devices,
 * checking the limits above (names up to max_string_bytes, "" allowed for a
 * .npy), the format and each layout (MIRRORED, SHARDED or PER_COMPONENT;
 * component sources only with PER_COMPONENT, none or one per device).
 * INVALID_ARGUMENT naming the tensor and what was wrong. out->tensors is
 * allocated (srv_load_request_free); its strings point into `pb`. */
pd_code srv_load_from_pb(const srv_req_limits *l, int ndev,
                         const Paradev__V1__LoadTensorsRequest *pb,
                         sched_load_request *out, dev_status *st);
void srv_load_request_free(sched_load_request *r);
/* The reply's tensors from a sched_load_result, in `a`; false when out of
 * memory. */
bool srv_loaded_to_pb(srv_arena *a, const sched_load_result *r,
                      Paradev__V1__LoadTensorsResponse *out);
/* A load's progress; `status` and `msg` (DEV_STATUS_MSG_MAX) are caller
 * storage that `out` points to. */
void srv_progress_to_pb(const sched_load_progress *p, char *msg,
                        Paradev__V1__Status *status,
                        Paradev__V1__GetLoadProgressResponse *out);

/* A SaveTensors request -> sched_save_request, checking the same limits,
 * 1 to SRV_CKPT_MAX_TENSORS tensors and SRV_CKPT_MAX_META metadata entries
 * (keys 1 to max_string_bytes, values up to it); format AUTO, SAFETENSORS
 * or NPY. out's arrays are allocated: free them with srv_save_request_free
 * whatever this returns; strings point into `pb`. */
pd_code srv_save_from_pb(const srv_req_limits *l,
                         const Paradev__V1__SaveTensorsRequest *pb,
                         sched_save_request *out, dev_status *st);
void srv_save_request_free(sched_save_request *r);

/* --- graph functions (convert_fn.c) -------------------------------------------- */

/* The one path between dev_fn_def and paradev.v1.FunctionDef: for
 * RegisterFunction and DescribeFunction as proto structs, for the optimizer
 * plugins (server/optimizer.c; include/paradev/optimizer.h hands them the
 * wire's own message) as serialized bytes. Every field goes both ways,
 * origins and each node's outputs_info (the engine's inference) included;
 * absent attrs (DEV_ATTR_NONE) are left out. Thread-safe: no state. */

/* A FunctionDef decoded for the engine: views into the message and an arena. */
typedef struct srv_fn_decoded {
  dev_fn_def def;
  dev_fn_options opts;
} srv_fn_decoded;

/* FunctionDef -> dev_fn_def and dev_fn_options, pointing into `pb` and into
 * arrays allocated in `a` (freed by the caller after the registration).
 * Bounds every name (1..DEV_FN_NAME_MAX bytes), input ("node:k"), count
 * (DEV_FN_MAX_ARGS args and outputs, DEV_FN_MAX_NODES nodes and origins,
 * DEV_MAX_INPUTS inputs and DEV_MAX_OUTPUTS outputs_info per node),
 * attribute (as srv_attrs_from_pb: one value each, lists within
 * DEV_ATTR_LIST_MAX, strings within max_string_bytes), value info (dtype 0
 * to PD_DTYPE_COUNT-1, rank up to PD_MAX_RANK, dims >= -1) and option; the
 * graph itself is the engine's to check (dev_fn_register, which ignores
 * outputs_info). Errors: INVALID_ARGUMENT naming the function and the node,
 * arg, attr or output; RESOURCE_EXHAUSTED. */
pd_code srv_fn_def_from_pb(const srv_req_limits *l,
                           const Paradev__V1__FunctionDef *pb, srv_arena *a,
                           srv_fn_decoded *out, dev_status *st);
/* dev_fn_def (and its options, NULL: none) -> *out in `a`: strings and
 * value arrays point into `def`, which must outlive the message. Errors:
 * INVALID_ARGUMENT for what the message cannot carry (a count below 0, an
 * attr type outside dev_attr_type, a rank outside 0..PD_MAX_RANK, a list
 * or string without its values), naming the function, node and attr;
 * RESOURCE_EXHAUSTED. */
pd_code srv_fn_def_to_pb(const dev_fn_def *def, const dev_fn_options *opts,
                         srv_arena *a, Paradev__V1__FunctionDef **out,
                         dev_status *st);
/* dev_fn_describe's answer -> DescribeFunctionResponse (its incarnation
 * left to the caller); points into `info`. Errors: srv_fn_def_to_pb's. */
pd_code srv_fn_info_to_pb(const dev_fn_info *info, srv_arena *a,
                          Paradev__V1__DescribeFunctionResponse *out,
                          dev_status *st);

/* For the optimizer plugins: `def` as serialized FunctionDef bytes in
 * *bytes (malloc'd, at least 1 byte even when *len is 0: the caller frees
 * them with free()), *len bytes; no options. Errors: INVALID_ARGUMENT
 * (NULL, or srv_fn_def_to_pb's), RESOURCE_EXHAUSTED. */
pd_code srv_fn_def_to_proto(const dev_fn_def *def, uint8_t **bytes, size_t *len,
                            dev_status *st);
/* Serialized FunctionDef bytes (a plugin's output) -> a definition in one
 * block (*out; free it with srv_fn_def_proto_free, not dev_fn_def_free),
 * checked as srv_fn_def_from_pb checks a request's, strings up to
 * DEV_ATTR_STRING_MAX bytes; options checked, then dropped. Errors:
 * INVALID_ARGUMENT ("N bytes that do not parse as a paradev.v1.FunctionDef",
 * or naming the node, arg or attr that passes a bound),
 * RESOURCE_EXHAUSTED. */
pd_code srv_fn_def_from_proto(const uint8_t *bytes, size_t len,
                              dev_fn_def **out, dev_status *st);
/* Accepts NULL. */
void srv_fn_def_proto_free(dev_fn_def *def);

#endif /* PARADEV_SERVER_CONVERT_H */
