/* libparadev: transfers through POSIX shared memory, for programs on the
 * daemon's machine (RegisterSharedMemory, UploadFromSharedMemory,
 * DownloadToSharedMemory).
 *
 * Part of the API of <paradev/paradev.h>, which includes this header: include
 * that one. Its conventions hold here.
 */
#ifndef PARADEV_SHM_H
#define PARADEV_SHM_H

#include "paradev/paradev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Shared memory transfers (clients on the daemon's machine)
 *
 * A region is a POSIX shared memory object mapped both by the program and by
 * the daemon: pd_upload_from_shared_memory reads a host value from it and
 * pd_download_to_shared_memory writes one into it, and the daemon copies
 * straight between its mapping and the devices (page-locked on CUDA, so the
 * copies are DMA), without the bytes travelling through gRPC. Use it for
 * large tensors when the program runs on the daemon's machine; over the
 * network, use pd_upload / pd_download.
 *
 * The object's first PD_SHARED_MEMORY_HEADER_BYTES bytes are a header that
 * proves it belongs to the session ("PDSHM", version 1, the session token);
 * pd_shared_memory_data points past it, and offsets count from there. The
 * daemon checks the header once, at registration, so it never maps memory of
 * another user on a client's word. The header holds the session token:
 * whoever can read the object can act as the session, so keep the object
 * private (mode 0600; for a daemon that runs as a service user, mode 0660 and
 * a group only the daemon's user is in). A region ends when destroyed, when
 * the session is closed, or when its lease runs out (the daemon unmaps it);
 * tensors uploaded from it count toward the session's quota as pd_upload's.
 * Once pd_shared_memory_destroy or pd_session_close has returned, the daemon
 * never touches the object again: it waited for the copies running, and a
 * transfer still waiting for its tensor then fails with PD_CANCELLED.
 * Limits: 64 regions per session and 4096 per daemon; registered bytes
 * (data and headers) at most half the machine's physical memory per daemon
 * and per session, and at most the session's memory quota when it has one.
 * Source: NVIDIA Triton's system shared memory extension
 * (RegisterSystemSharedMemory; tritonclient.utils.shared_memory);
 * paradev.v1.ParallelDevice/RegisterSharedMemory. */

#define PD_SHARED_MEMORY_HEADER_BYTES 64

typedef struct pd_shared_memory pd_shared_memory;

/* Creates a fresh shared memory object of `bytes` bytes of data (plus the
 * header) under an unguessable key "/paradev-PID-RANDOM" (shm_open with
 * O_CREAT|O_EXCL, then exactly `mode`: 0 means 0600), maps it, writes the
 * session's header and registers it with the daemon under the key's name.
 * *out gets the region; free it with pd_shared_memory_destroy (which also
 * unlinks the object). The data starts zeroed. Every page of the object is
 * reserved at once (posix_fallocate: time and memory in proportion to
 * `bytes`), so a /dev/shm without room fails here instead of killing the
 * program with SIGBUS at its first write (Docker's /dev/shm is 64 MiB unless
 * --shm-size says otherwise).
 * Errors:   PD_INVALID_ARGUMENT (bytes 0, mode with bits beyond 0777),
 *           PD_RESOURCE_EXHAUSTED (no room in /dev/shm: the message gives
 *           the bytes needed and free, and no object is left; no room in the
 *           address space; the limits above: the message names the limit,
 *           what is registered and what was asked), PD_PERMISSION_DENIED
 *           (the daemon's user cannot open the object: see `mode`),
 *           PD_FAILED_PRECONDITION (session closed), transport errors.
 * Thread safety: thread-safe; the region may be used by several threads.
 * Source: tritonclient.utils.shared_memory.create_shared_memory_region +
 *         RegisterSystemSharedMemory. */
pd_code pd_shared_memory_create(pd_session *s, size_t bytes, unsigned mode,
                                pd_shared_memory **out,
                                const pd_call_options *call, pd_status *st);

/* Registers an existing object `key` ("/" + 1 to 200 of [A-Za-z0-9._-]) that
 * the program manages, under `name` (NULL: the key without its '/'; 1 to
 * max_string_bytes printable ASCII bytes, unique among the session's
 * regions). `byte_size` bytes from the object's start are mapped, header
 * included (0: the object's whole size). With `write_header` the library
 * writes the session's header into the object first (it must be writable
 * here); without it, the program wrote it (pd_shared_memory_write_header)
 * and the daemon checks it before the library maps the object. The object
 * is not unlinked by pd_shared_memory_destroy. Reserving its pages is the
 * program's part (posix_fallocate; the library reserves the header's page
 * before writing it): on a full /dev/shm, copies that touch a page never
 * allocated fail with PD_RESOURCE_EXHAUSTED in the daemon, and the
 * program's own first write to one raises SIGBUS.
 * Errors:   PD_INVALID_ARGUMENT (bad key or name, byte_size not over the
 *           header, an object smaller than byte_size or not a regular one),
 *           PD_NOT_FOUND (no such object), PD_PERMISSION_DENIED (the daemon's
 *           user cannot open it for reading and writing, or its header is not
 *           this session's), PD_ALREADY_EXISTS (a live name),
 *           PD_RESOURCE_EXHAUSTED (the region and byte limits above; no room
 *           in /dev/shm for the header), transport errors.
 * Thread safety: thread-safe.
 * Source: RegisterSystemSharedMemory of Triton's extension. */
pd_code pd_shared_memory_register(pd_session *s, const char *key,
                                  const char *name, size_t byte_size,
                                  bool write_header, pd_shared_memory **out,
                                  const pd_call_options *call, pd_status *st);

/* Writes the session's 64-byte header into `header` (at least
 * PD_SHARED_MEMORY_HEADER_BYTES bytes: the start of an object), for programs
 * that register objects with write_header false.
 * Errors:   PD_INVALID_ARGUMENT (NULL, len under the header's size).
 * Thread safety: thread-safe. */
pd_code pd_shared_memory_write_header(const pd_session *s, void *header,
                                      size_t len, pd_status *st);

/* The data area (past the header) and its size in bytes. Valid until
 * pd_shared_memory_destroy. NULL / 0 for a NULL region. */
void *pd_shared_memory_data(const pd_shared_memory *r);
size_t pd_shared_memory_size(const pd_shared_memory *r);
/* The region's name in the session and the object's key. */
const char *pd_shared_memory_name(const pd_shared_memory *r);
const char *pd_shared_memory_key(const pd_shared_memory *r);

/* Unregisters the region (unless the session was closed; a region the daemon
 * already dropped with its session counts as done), unmaps it here, unlinks
 * an object pd_shared_memory_create made, and frees `r` in every case. The
 * session must still exist (pd_session_delete comes after). NULL is a no-op.
 * When it returns, the daemon has unmapped the object and will not touch it
 * again (copies running when the request arrived finished first; a download
 * still waiting for its tensor fails with PD_CANCELLED, writing nothing).
 * Errors:   transport errors of the unregistration (the region is freed
 *           here anyway).
 * Thread safety: no transfer may be using `r`. */
pd_code pd_shared_memory_destroy(pd_shared_memory *r,
                                 const pd_call_options *call, pd_status *st);

/* pd_upload with the host value read by the daemon from `region` at data
 * offset `offset` (bytes past the header): a value of `dtype` and shape
 * dims[0..rank), mirrored or sharded, on the session's default device set
 * (the _on variant below chooses one). The region's bytes must not change
 * during the call; the program may reuse them once it returns.
 * Errors:   as pd_upload, plus PD_NOT_FOUND (the region is not registered in
 *           this session), PD_OUT_OF_RANGE (the value runs past the region's
 *           data: the message gives offset, size and the region's size),
 *           PD_FAILED_PRECONDITION (the object was truncated while mapped),
 *           PD_RESOURCE_EXHAUSTED (also: a page of the object could not be
 *           allocated because /dev/shm is full; the object's pages were not
 *           reserved), PD_CANCELLED (the region was unregistered, or its
 *           session ended, before the daemon began to read it).
 * Thread safety: thread-safe.
 * Source: paradev.v1.ParallelDevice/UploadFromSharedMemory; Triton's
 *         shared_memory_region / shared_memory_offset input parameters. */
pd_code pd_upload_from_shared_memory(pd_session *s, uint64_t id, pd_dtype dtype,
                                     const int64_t *dims, int rank,
                                     pd_shared_memory *region, uint64_t offset,
                                     pd_layout layout, pd_tensor_info *info,
                                     const pd_call_options *call,
                                     pd_status *st);

/* pd_upload_components from a region: component i's value (shape
 * dims[i][0..ranks[i])) follows component i-1's, from data offset `offset`
 * on, with no padding, on the session's default device set: num_components
 * must be pd_session_num_devices(s).
 * Errors:   as pd_upload_from_shared_memory, plus PD_INVALID_ARGUMENT for a
 *           wrong count.
 * Source: paradev.v1.ParallelDevice/UploadFromSharedMemory (PER_COMPONENT). */
pd_code pd_upload_components_from_shared_memory(
    pd_session *s, uint64_t id, pd_dtype dtype, int num_components,
    const int64_t *const *dims, const int *ranks, pd_shared_memory *region,
    uint64_t offset, pd_tensor_info *info, const pd_call_options *call,
    pd_status *st);

/* The two uploads above on a chosen device set (issue #17), as pd_upload_on:
 * devices[0..n_devices) are daemon device indices in component order (NULL /
 * 0: the session's default); SHARDED splits over n_devices; PER_COMPONENT
 * takes num_components == n_devices values (n_devices 0: the session's
 * count). *info's devices give the set the tensor was placed on.
 * Errors:   as the call without _on, plus PD_INVALID_ARGUMENT (n_devices
 *           out of 0..PD_MAX_DEVICES, devices NULL with n_devices > 0,
 *           checked here; a device out of range or named twice, from the
 *           daemon), PD_PERMISSION_DENIED (a device outside the session's
 *           allowed set, named), PD_UNIMPLEMENTED (a daemon that places
 *           tensors only on its whole mesh).
 * Thread safety: thread-safe.
 * Source: UploadFromSharedMemoryRequest.devices of paradev.v1. */
pd_code pd_upload_from_shared_memory_on(
    pd_session *s, const int32_t *devices, int n_devices, uint64_t id,
    pd_dtype dtype, const int64_t *dims, int rank, pd_shared_memory *region,
    uint64_t offset, pd_layout layout, pd_tensor_info *info,
    const pd_call_options *call, pd_status *st);
pd_code pd_upload_components_from_shared_memory_on(
    pd_session *s, const int32_t *devices, int n_devices, uint64_t id,
    pd_dtype dtype, int num_components, const int64_t *const *dims,
    const int *ranks, pd_shared_memory *region, uint64_t offset,
    pd_tensor_info *info, const pd_call_options *call, pd_status *st);

/* pd_download into `region` from data offset `offset` on, waiting until the
 * tensor is computed: layout MIRRORED (component 0), COMPONENT or SHARDED.
 * *info (may be NULL) gets the dtype and host shape written, *bytes_out (may
 * be NULL) its size. Nothing is written when the value would not fit.
 * Errors:   as pd_download (the error stored on a failed tensor included),
 *           plus PD_NOT_FOUND (region not registered in this session),
 *           PD_OUT_OF_RANGE (the value does not fit at `offset`: the message
 *           gives the size needed), PD_FAILED_PRECONDITION (truncated),
 *           PD_RESOURCE_EXHAUSTED (also: /dev/shm full, as for uploads),
 *           PD_CANCELLED (the region was unregistered, or its session
 *           ended, while the call waited for the tensor: nothing written).
 * Thread safety: thread-safe.
 * Source: paradev.v1.ParallelDevice/DownloadToSharedMemory; Triton's
 *         shared memory output parameters. */
pd_code pd_download_to_shared_memory(pd_session *s, uint64_t id,
                                     pd_layout layout, pd_shared_memory *region,
                                     uint64_t offset, pd_tensor_info *info,
                                     size_t *bytes_out,
                                     const pd_call_options *call,
                                     pd_status *st);

/* Every component into `region`, one after another from data offset
 * `offset` on; infos (may be NULL; num_components entries) get each one's
 * host shape, *bytes_out (may be NULL) the total. num_components must be
 * the tensor's component count, its device set's size
 * (pd_session_num_devices(s) for a tensor on the session's default).
 * Errors:   as pd_download_to_shared_memory, plus PD_INVALID_ARGUMENT
 *           (num_components out of 1..PD_MAX_DEVICES, or not the tensor's
 *           count: the message gives it).
 * Source: paradev.v1.ParallelDevice/DownloadToSharedMemory (PER_COMPONENT). */
pd_code pd_download_components_to_shared_memory(
    pd_session *s, uint64_t id, int num_components, pd_shared_memory *region,
    uint64_t offset, pd_tensor_info *infos, size_t *bytes_out,
    const pd_call_options *call, pd_status *st);

#ifdef __cplusplus
}
#endif
#endif /* PARADEV_SHM_H */
