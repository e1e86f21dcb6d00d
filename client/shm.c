/* libparadev: system shared memory regions (paradev.proto, "Shared memory";
 * NVIDIA Triton's system shared memory extension and its client utilities,
 * tritonclient.utils.shared_memory). A region is a POSIX shared memory object
 * mapped both here and in the daemon: uploads read a host value from it and
 * downloads write one into it, with no tensor bytes on the gRPC channel.
 *
 * The object starts with a 64-byte header that proves it belongs to the
 * session (magic "PDSHM", version, the session token); the data area the
 * program sees begins after it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "check.h"
#include "client_int.h"

#define PDC_SHM_VERSION 1

struct pd_shared_memory {
  pd_session *s;
  char *name;    /* registered under this name in the session */
  char *key;     /* the POSIX shm name */
  uint8_t *base; /* our mapping of the object: map_bytes bytes */
  size_t map_bytes;
  bool owned; /* created here: unlinked by pd_shared_memory_destroy */
};

pd_code pd_shared_memory_write_header(const pd_session *s, void *header,
                                      size_t len, pd_status *st) {
  if (!s || !header)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_shared_memory_write_header: %s is NULL",
                     s ? "header" : "session");
  if (len < PD_SHARED_MEMORY_HEADER_BYTES)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_shared_memory_write_header: %zu bytes; the header "
                     "takes %d",
                     len, PD_SHARED_MEMORY_HEADER_BYTES);
  if (s->token_len > PD_SHARED_MEMORY_HEADER_BYTES - 8)
    return pdc_error(st, PD_INTERNAL,
                     "the session token (%zu bytes) does not fit the header",
                     s->token_len);
  uint8_t h[PD_SHARED_MEMORY_HEADER_BYTES];
  memset(h, 0, sizeof(h));
  memcpy(h, "PDSHM", 5);
  h[5] = PDC_SHM_VERSION;
  h[6] = (uint8_t)(s->token_len & 0xff);
  h[7] = (uint8_t)(s->token_len >> 8);
  memcpy(h + 8, s->token, s->token_len);
  memcpy(header, h, sizeof(h));
  pdc_ok(st);
  return PD_OK;
}

void *pd_shared_memory_data(const pd_shared_memory *r) {
  return r ? r->base + PD_SHARED_MEMORY_HEADER_BYTES : NULL;
}

size_t pd_shared_memory_size(const pd_shared_memory *r) {
  return r ? r->map_bytes - PD_SHARED_MEMORY_HEADER_BYTES : 0;
}

const char *pd_shared_memory_name(const pd_shared_memory *r) {
  return r ? r->name : NULL;
}

const char *pd_shared_memory_key(const pd_shared_memory *r) {
  return r ? r->key : NULL;
}

static void pdc_shm_free(pd_shared_memory *r) {
  if (!r) return;
  if (r->base) munmap(r->base, r->map_bytes);
  if (r->owned && r->key) shm_unlink(r->key);
  free(r->name);
  free(r->key);
  free(r);
}

static pd_code pdc_shm_errno(int e, const char *what, const char *key,
                             pd_status *st) {
  pd_code code = e == ENOENT                 ? PD_NOT_FOUND
                 : e == EACCES || e == EPERM ? PD_PERMISSION_DENIED
                 : e == EEXIST               ? PD_ALREADY_EXISTS
                 : e == ENOMEM || e == ENOSPC || e == EMFILE || e == ENFILE
                     ? PD_RESOURCE_EXHAUSTED
                     : PD_INVALID_ARGUMENT;
  return pdc_error(st, code, "%s of shared memory object %s: %s", what, key,
                   strerror(e));
}

/* Reserves bytes [0, len) of the object open on fd (posix_fallocate), so
 * that touching them never raises SIGBUS for want of room in /dev/shm: tmpfs
 * allocates a sparse object's pages only when first touched, and a full one
 * then kills the program (Docker gives containers 64 MiB by default). */
static pd_code pdc_shm_reserve(int fd, const char *key, size_t len,
                               const char *what, pd_status *st) {
  int e;
  do e = posix_fallocate(fd, 0, (off_t)len);
  while (e == EINTR);
  if (e == 0) return PD_OK;
  if (e != ENOSPC) return pdc_shm_errno(e, "posix_fallocate", key, st);
  struct statvfs v;
  if (statvfs("/dev/shm", &v) != 0)
    return pdc_error(st, PD_RESOURCE_EXHAUSTED,
                     "no room in /dev/shm for %s: shared memory object %s "
                     "needs %zu bytes; free some or make /dev/shm larger "
                     "(Docker: --shm-size)",
                     what, key, len);
  return pdc_error(st, PD_RESOURCE_EXHAUSTED,
                   "no room in /dev/shm for %s: shared memory object %s needs "
                   "%zu bytes and /dev/shm (tmpfs) has %llu of its %llu bytes "
                   "free; free some or make /dev/shm larger (Docker: "
                   "--shm-size)",
                   what, key, len, (unsigned long long)v.f_bavail * v.f_frsize,
                   (unsigned long long)v.f_blocks * v.f_frsize);
}

/* Sends RegisterSharedMemory for r (name, key, map_bytes). */
static pd_code pdc_shm_register_rpc(pd_shared_memory *r,
                                    const pd_call_options *call,
                                    pd_status *st) {
  Paradev__V1__RegisterSharedMemoryRequest req =
      PARADEV__V1__REGISTER_SHARED_MEMORY_REQUEST__INIT;
  req.session_token.data = r->s->token;
  req.session_token.len = r->s->token_len;
  req.name = r->name;
  req.key = r->key;
  req.byte_size = r->map_bytes;
  ProtobufCMessage *resp = NULL;
  PD_TRY(pdc_unary(r->s->c, PDC_M_RegisterSharedMemory, &req.base,
                   &paradev__v1__register_shared_memory_response__descriptor,
                   &resp, call, st));
  pdc_session_touch(r->s);
  protobuf_c_message_free_unpacked(resp, NULL);
  return PD_OK;
}

/* Maps `bytes` bytes of the object open on fd (read and write). */
static pd_code pdc_shm_map(pd_shared_memory *r, int fd, size_t bytes,
                           pd_status *st) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return pdc_shm_errno(errno, "mmap", r->key, st);
  r->base = p;
  r->map_bytes = bytes;
  return PD_OK;
}

pd_code pd_shared_memory_create(pd_session *s, size_t bytes, unsigned mode,
                                pd_shared_memory **out,
                                const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  pd_code rc = PD_OK;
  if (!out)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_shared_memory_create: out is NULL");
  if (bytes == 0 || bytes > SIZE_MAX / 2)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_shared_memory_create: %zu bytes of data; expected 1 "
                     "to %zu",
                     bytes, SIZE_MAX / 2);
  if (mode & ~0777u)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_shared_memory_create: mode %o; expected permission "
                     "bits only (0 for 0600)",
                     mode);
  if (mode == 0) mode = 0600;
  pd_shared_memory *r = calloc(1, sizeof(*r));
  if (!r) return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  r->s = s;
  r->key = malloc(64);
  if (!r->key) {
    free(r);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  /* An unguessable name, so no other process can create it first. */
  uint8_t rnd[12];
  if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
    pdc_shm_free(r);
    return pdc_error(st, PD_INTERNAL, "getrandom failed: %s", strerror(errno));
  }
  int n = snprintf(r->key, 64, "/paradev-%ld-", (long)getpid());
  for (size_t i = 0; i < sizeof(rnd) && n > 0; i++)
    n += snprintf(r->key + n, 64 - (size_t)n, "%02x", rnd[i]);
  r->name = strdup(r->key + 1);
  if (!r->name) {
    pdc_shm_free(r);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  int fd =
      shm_open(r->key, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
  if (fd < 0) {
    rc = pdc_shm_errno(errno, "shm_open", r->key, st);
    free(r->key); /* not ours to unlink: never created */
    r->key = NULL;
    pdc_shm_free(r);
    return rc;
  }
  r->owned = true;
  size_t total = bytes + PD_SHARED_MEMORY_HEADER_BYTES;
  /* Exactly `mode`, whatever the umask took away; then every page reserved
   * (it also sets the size), so no write into the region can fault. */
  char what[96];
  snprintf(what, sizeof what,
           "a region of %zu bytes of data and the %d-byte header", bytes,
           PD_SHARED_MEMORY_HEADER_BYTES);
  if (fchmod(fd, (mode_t)mode) != 0)
    rc = pdc_shm_errno(errno, "fchmod", r->key, st);
  else if ((rc = pdc_shm_reserve(fd, r->key, total, what, st)) == PD_OK)
    rc = pdc_shm_map(r, fd, total, st);
  close(fd);
  if (rc == PD_OK) rc = pd_shared_memory_write_header(s, r->base, total, st);
  if (rc == PD_OK) rc = pdc_shm_register_rpc(r, call, st);
  if (rc != PD_OK) {
    pdc_shm_free(r);
    return rc;
  }
  *out = r;
  return PD_OK;
}

/* Opens the program's object `key` for us to map it (*fd), learns its size
 * when *byte_size is 0, and checks that size: past the object's end,
 * writing the header would raise SIGBUS here, so refuse it as the daemon
 * would. On failure *fd may be open: the caller closes it. */
static pd_code pdc_shm_open_sized(const char *key, size_t *byte_size, int *fd,
                                  pd_status *st) {
  *fd = shm_open(key, O_RDWR | O_CLOEXEC, 0);
  if (*fd < 0) return pdc_shm_errno(errno, "shm_open", key, st);
  struct stat sb;
  if (fstat(*fd, &sb) != 0) return pdc_shm_errno(errno, "fstat", key, st);
  if (*byte_size == 0) *byte_size = (size_t)sb.st_size;
  if (*byte_size > PD_SHARED_MEMORY_HEADER_BYTES &&
      (uint64_t)sb.st_size < *byte_size)
    return pdc_error(
        st, PD_INVALID_ARGUMENT,
        "shared memory object %s holds %lld bytes; byte_size is %zu "
        "(ftruncate it to at least byte_size first)",
        key, (long long)sb.st_size, *byte_size);
  if (*byte_size <= PD_SHARED_MEMORY_HEADER_BYTES)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "shared memory object %s: %zu bytes; a region holds the "
                     "%d-byte header and at least one byte of data",
                     key, *byte_size, PD_SHARED_MEMORY_HEADER_BYTES);
  return PD_OK;
}

/* We write the header (or learn the size) first: open and map the object
 * ourselves, then register it with the daemon. */
static pd_code pdc_shm_attach_first(pd_shared_memory *r, const char *key,
                                    size_t byte_size, bool write_header,
                                    const pd_call_options *call,
                                    pd_status *st) {
  int fd = -1;
  pd_code rc = pdc_shm_open_sized(key, &byte_size, &fd, st);
  /* The header's page, so that writing it cannot fault (the rest of the
   * object is the program's to reserve). */
  if (rc == PD_OK && write_header)
    rc = pdc_shm_reserve(fd, key, PD_SHARED_MEMORY_HEADER_BYTES,
                         "the region's header", st);
  if (rc == PD_OK) rc = pdc_shm_map(r, fd, byte_size, st);
  if (rc == PD_OK && write_header)
    rc = pd_shared_memory_write_header(r->s, r->base, byte_size, st);
  if (fd >= 0) close(fd);
  if (rc == PD_OK) rc = pdc_shm_register_rpc(r, call, st);
  return rc;
}

/* Takes back a registration the caller cannot use; its own errors are
 * not the caller's. */
static void pdc_shm_unregister_quiet(pd_shared_memory *r,
                                     const pd_call_options *call) {
  pd_session *s = r->s;
  pd_status *ignored = pd_status_new();
  Paradev__V1__UnregisterSharedMemoryRequest ur =
      PARADEV__V1__UNREGISTER_SHARED_MEMORY_REQUEST__INIT;
  ur.session_token.data = s->token;
  ur.session_token.len = s->token_len;
  ur.name = r->name;
  ProtobufCMessage *resp = NULL;
  if (pdc_unary(s->c, PDC_M_UnregisterSharedMemory, &ur.base,
                &paradev__v1__unregister_shared_memory_response__descriptor,
                &resp, call, ignored) == PD_OK)
    protobuf_c_message_free_unpacked(resp, NULL);
  pd_status_delete(ignored);
}

/* The header is the program's: the daemon's checks come first (its errors
 * name what is wrong), then our own mapping; a mapping that fails takes
 * the registration back. */
static pd_code pdc_shm_attach_registered(pd_shared_memory *r, const char *key,
                                         size_t byte_size,
                                         const pd_call_options *call,
                                         pd_status *st) {
  r->map_bytes = byte_size;
  PD_TRY(pdc_shm_register_rpc(r, call, st));
  int fd = shm_open(key, O_RDWR | O_CLOEXEC, 0);
  pd_code rc = fd < 0 ? pdc_shm_errno(errno, "shm_open", key, st)
                      : pdc_shm_map(r, fd, byte_size, st);
  if (rc != PD_OK) pdc_shm_unregister_quiet(r, call);
  if (fd >= 0) close(fd);
  return rc;
}

pd_code pd_shared_memory_register(pd_session *s, const char *key,
                                  const char *name, size_t byte_size,
                                  bool write_header, pd_shared_memory **out,
                                  const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  if (!out || !key)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_shared_memory_register: %s is NULL",
                     key ? "out" : "key");
  pd_shared_memory *r = calloc(1, sizeof(*r));
  if (!r) return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  r->s = s;
  r->key = strdup(key);
  r->name = strdup(name ? name : (key[0] == '/' ? key + 1 : key));
  if (!r->key || !r->name) {
    pdc_shm_free(r);
    return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  pd_code rc =
      write_header || byte_size == 0
          ? pdc_shm_attach_first(r, key, byte_size, write_header, call, st)
          : pdc_shm_attach_registered(r, key, byte_size, call, st);
  if (rc != PD_OK) {
    pdc_shm_free(r);
    return rc;
  }
  *out = r;
  return PD_OK;
}

pd_code pd_shared_memory_destroy(pd_shared_memory *r,
                                 const pd_call_options *call, pd_status *st) {
  if (!r) {
    pdc_ok(st);
    return PD_OK;
  }
  pd_code rc = PD_OK;
  if (!atomic_load(&r->s->closed)) {
    Paradev__V1__UnregisterSharedMemoryRequest req =
        PARADEV__V1__UNREGISTER_SHARED_MEMORY_REQUEST__INIT;
    req.session_token.data = r->s->token;
    req.session_token.len = r->s->token_len;
    req.name = r->name;
    ProtobufCMessage *resp = NULL;
    rc = pdc_unary(r->s->c, PDC_M_UnregisterSharedMemory, &req.base,
                   &paradev__v1__unregister_shared_memory_response__descriptor,
                   &resp, call, st);
    if (rc == PD_OK) {
      pdc_session_touch(r->s);
      protobuf_c_message_free_unpacked(resp, NULL);
    } else if (rc == PD_NOT_FOUND) {
      rc = PD_OK; /* the session (and so the region) ended on the daemon */
    }
  }
  pdc_shm_free(r);
  if (rc == PD_OK) pdc_ok(st);
  return rc;
}

/* --- transfers ------------------------------------------------------------------ */

static pd_code pdc_check_dims(const int64_t *dims, int rank, const char *what,
                              pd_status *st) {
  if (rank < 0 || rank > PD_MAX_RANK || (rank > 0 && !dims))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s: rank %d; expected 0 to %d with its dims", what, rank,
                     PD_MAX_RANK);
  return PD_OK;
}

static pd_code pdc_upload_shm(pd_session *s,
                              Paradev__V1__UploadFromSharedMemoryRequest *req,
                              pd_shared_memory *region, uint64_t offset,
                              pd_tensor_info *info, const pd_call_options *call,
                              pd_status *st) {
  req->session_token.data = s->token;
  req->session_token.len = s->token_len;
  req->region = region->name;
  req->offset = offset;
  ProtobufCMessage *m = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_UploadFromSharedMemory, &req->base,
                   &paradev__v1__upload_response__descriptor, &m, call, st));
  pd_code rc = PD_OK;
  pdc_session_touch(s);
  Paradev__V1__UploadResponse *resp = (Paradev__V1__UploadResponse *)m;
  pd_tensor_info ti;
  if (!pdc_info_from_pb(resp->tensor, &ti))
    rc = pdc_error(st, PD_INTERNAL,
                   "UploadFromSharedMemory: the reply cannot be decoded");
  else if (info)
    *info = ti;
  protobuf_c_message_free_unpacked(m, NULL);
  if (rc == PD_OK) pdc_ok(st);
  return rc;
}

pd_code pd_upload_from_shared_memory_on(
    pd_session *s, const int32_t *devices, int n_devices, uint64_t id,
    pd_dtype dtype, const int64_t *dims, int rank, pd_shared_memory *region,
    uint64_t offset, pd_layout layout, pd_tensor_info *info,
    const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  PD_TRY(pdc_check_devices(devices, n_devices, "pd_upload_from_shared_memory",
                           st));
  if (!region)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_upload_from_shared_memory: region is NULL");
  if (layout.kind != PD_LAYOUT_UNSPECIFIED &&
      layout.kind != PD_LAYOUT_MIRRORED && layout.kind != PD_LAYOUT_SHARDED)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_upload_from_shared_memory takes layout MIRRORED or "
                     "SHARDED; got kind %d (PER_COMPONENT: use "
                     "pd_upload_components_from_shared_memory)",
                     (int)layout.kind);
  PD_TRY(pdc_check_dims(dims, rank, "pd_upload_from_shared_memory", st));
  Paradev__V1__Shape shape = PARADEV__V1__SHAPE__INIT;
  shape.n_dims = (size_t)rank;
  shape.dims = (int64_t *)dims;
  Paradev__V1__Layout lay = PARADEV__V1__LAYOUT__INIT;
  lay.kind = (Paradev__V1__LayoutKind)layout.kind;
  lay.axis = layout.axis;
  Paradev__V1__UploadFromSharedMemoryRequest req =
      PARADEV__V1__UPLOAD_FROM_SHARED_MEMORY_REQUEST__INIT;
  req.id = id;
  req.dtype = (Paradev__V1__DType)dtype;
  req.shape = &shape;
  req.layout = &lay;
  req.n_devices = (size_t)n_devices;
  req.devices = n_devices ? (int32_t *)devices : NULL;
  return pdc_upload_shm(s, &req, region, offset, info, call, st);
}

pd_code pd_upload_from_shared_memory(pd_session *s, uint64_t id, pd_dtype dtype,
                                     const int64_t *dims, int rank,
                                     pd_shared_memory *region, uint64_t offset,
                                     pd_layout layout, pd_tensor_info *info,
                                     const pd_call_options *call,
                                     pd_status *st) {
  return pd_upload_from_shared_memory_on(s, NULL, 0, id, dtype, dims, rank,
                                         region, offset, layout, info, call,
                                         st);
}

pd_code pd_upload_components_from_shared_memory_on(
    pd_session *s, const int32_t *devices, int n_devices, uint64_t id,
    pd_dtype dtype, int num_components, const int64_t *const *dims,
    const int *ranks, pd_shared_memory *region, uint64_t offset,
    pd_tensor_info *info, const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  PD_TRY(pdc_check_devices(devices, n_devices,
                           "pd_upload_components_from_shared_memory", st));
  if (!region)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_upload_components_from_shared_memory: region is "
                     "NULL");
  int want = n_devices ? n_devices : s->num_devices;
  if (num_components != want || !dims || !ranks)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_upload_components_from_shared_memory: %d "
                     "components; the tensor's device set (%s) has %d "
                     "devices (and dims and ranks must be arrays of that "
                     "many)",
                     num_components,
                     n_devices ? "n_devices" : "the session's default", want);
  Paradev__V1__Shape shapes[PD_MAX_DEVICES];
  Paradev__V1__Shape *sp[PD_MAX_DEVICES];
  for (int i = 0; i < num_components; i++) {
    char what[80];
    snprintf(what, sizeof(what),
             "pd_upload_components_from_shared_memory: component %d", i);
    PD_TRY(pdc_check_dims(dims[i], ranks[i], what, st));
    paradev__v1__shape__init(&shapes[i]);
    shapes[i].n_dims = (size_t)ranks[i];
    shapes[i].dims = (int64_t *)dims[i];
    sp[i] = &shapes[i];
  }
  Paradev__V1__Layout lay = PARADEV__V1__LAYOUT__INIT;
  lay.kind = PARADEV__V1__LAYOUT_KIND__LAYOUT_PER_COMPONENT;
  Paradev__V1__UploadFromSharedMemoryRequest req =
      PARADEV__V1__UPLOAD_FROM_SHARED_MEMORY_REQUEST__INIT;
  req.id = id;
  req.dtype = (Paradev__V1__DType)dtype;
  req.layout = &lay;
  req.n_component_shapes = (size_t)num_components;
  req.component_shapes = sp;
  req.n_devices = (size_t)n_devices;
  req.devices = n_devices ? (int32_t *)devices : NULL;
  return pdc_upload_shm(s, &req, region, offset, info, call, st);
}

pd_code pd_upload_components_from_shared_memory(
    pd_session *s, uint64_t id, pd_dtype dtype, int num_components,
    const int64_t *const *dims, const int *ranks, pd_shared_memory *region,
    uint64_t offset, pd_tensor_info *info, const pd_call_options *call,
    pd_status *st) {
  return pd_upload_components_from_shared_memory_on(
      s, NULL, 0, id, dtype, num_components, dims, ranks, region, offset, info,
      call, st);
}

static pd_code pdc_download_shm(pd_session *s, uint64_t id, pd_layout layout,
                                int nparts, pd_shared_memory *region,
                                uint64_t offset, pd_tensor_info *infos,
                                size_t *bytes_out, const pd_call_options *call,
                                pd_status *st) {
  Paradev__V1__Layout lay = PARADEV__V1__LAYOUT__INIT;
  lay.kind = (Paradev__V1__LayoutKind)layout.kind;
  lay.axis = layout.axis;
  lay.component = layout.component;
  Paradev__V1__DownloadToSharedMemoryRequest req =
      PARADEV__V1__DOWNLOAD_TO_SHARED_MEMORY_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.id = id;
  req.layout = &lay;
  req.region = region->name;
  req.offset = offset;
  ProtobufCMessage *m = NULL;
  PD_TRY(pdc_unary(s->c, PDC_M_DownloadToSharedMemory, &req.base,
                   &paradev__v1__download_to_shared_memory_response__descriptor,
                   &m, call, st));
  pd_code rc = PD_OK;
  pdc_session_touch(s);
  Paradev__V1__DownloadToSharedMemoryResponse *resp = (void *)m;
  pd_tensor_info got[PD_MAX_DEVICES];
  memset(got, 0, sizeof(got));
  if (resp->n_host_shapes != (size_t)nparts) {
    /* A count the caller chose that is not the tensor's (its device set's
     * size); the daemon checks it before writing. */
    rc = pdc_error(st, nparts > 1 ? PD_INVALID_ARGUMENT : PD_INTERNAL,
                   "DownloadToSharedMemory: the tensor has %zu components; "
                   "%d expected",
                   resp->n_host_shapes, nparts);
  } else {
    for (int i = 0; i < nparts && rc == PD_OK; i++) {
      got[i].id = id;
      got[i].dtype = (pd_dtype)resp->dtype;
      if (!pdc_shape_from_pb(resp->host_shapes[i], &got[i]))
        rc = pdc_error(st, PD_INTERNAL,
                       "DownloadToSharedMemory: the reply cannot be decoded");
    }
  }
  if (rc == PD_OK) {
    for (int i = 0; infos && i < nparts; i++) infos[i] = got[i];
    if (bytes_out) *bytes_out = (size_t)resp->bytes_written;
    pdc_ok(st);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return rc;
}

pd_code pd_download_to_shared_memory(pd_session *s, uint64_t id,
                                     pd_layout layout, pd_shared_memory *region,
                                     uint64_t offset, pd_tensor_info *info,
                                     size_t *bytes_out,
                                     const pd_call_options *call,
                                     pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  if (!region)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_download_to_shared_memory: region is NULL");
  if (layout.kind == PD_LAYOUT_PER_COMPONENT)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_download_to_shared_memory takes one host value; for "
                     "layout PER_COMPONENT use "
                     "pd_download_components_to_shared_memory");
  return pdc_download_shm(s, id, layout, 1, region, offset, info, bytes_out,
                          call, st);
}

pd_code pd_download_components_to_shared_memory(
    pd_session *s, uint64_t id, int num_components, pd_shared_memory *region,
    uint64_t offset, pd_tensor_info *infos, size_t *bytes_out,
    const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  if (!region)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_download_components_to_shared_memory: region is "
                     "NULL");
  if (num_components < 1 || num_components > PD_MAX_DEVICES)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_download_components_to_shared_memory: %d "
                     "components; expected the tensor's count (its device "
                     "set's size, 1 to %d; the session's default set has %d)",
                     num_components, PD_MAX_DEVICES, s->num_devices);
  pd_layout l = {PD_LAYOUT_PER_COMPONENT, 0, 0};
  return pdc_download_shm(s, id, l, num_components, region, offset, infos,
                          bytes_out, call, st);
}
