/* paradevd's shared memory methods: RegisterSharedMemory,
 * UnregisterSharedMemory, UploadFromSharedMemory and DownloadToSharedMemory
 * (see shm_int.h for the model, ownership and lifetime). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "check.h"
#include "log.h"
#include "shm_int.h"

/* --- RegisterSharedMemory ------------------------------------------------------- */

typedef struct srv_hdr_copy {
  const uint8_t *src;
  uint8_t *dst;
} srv_hdr_copy;

static pd_code srv_hdr_copy_fn(void *arg, dev_status *st) {
  (void)st;
  srv_hdr_copy *h = arg;
  memcpy(h->dst, h->src, SRV_SHM_HEADER_BYTES);
  return PD_OK;
}

/* Opens `key` and checks that it is a regular object of at least byte_size
 * bytes: its descriptor, or an error naming the key. Before any limit is
 * checked, so that a byte_size the object does not have is blamed on the
 * object, not on a limit. */
static pd_code srv_shm_open(const char *key, uint64_t byte_size, int *fd_out,
                            dev_status *st) {
  int fd = shm_open(key, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0) {
    int e = errno;
    switch (e) {
      case ENOENT:
        return dev_error(st, PD_NOT_FOUND,
                         "no shared memory object %s (create it with "
                         "shm_open before registering it)",
                         key);
      case EACCES:
      case EPERM:
        return dev_error(st, PD_PERMISSION_DENIED,
                         "paradevd (uid %u) could not open shared memory "
                         "object %s for reading and writing: %s; the region "
                         "must be readable and writable by the daemon's user "
                         "(for a daemon run as a service user, give the "
                         "object a group it is in and mode 0660)",
                         (unsigned)geteuid(), key, strerror(e));
      case EMFILE:
      case ENFILE:
        return dev_error(st, PD_RESOURCE_EXHAUSTED,
                         "paradevd cannot open shared memory object %s: %s",
                         key, strerror(e));
      default:
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "paradevd cannot open shared memory object %s: %s",
                         key, strerror(e));
    }
  }
  struct stat sb;
  pd_code rc = PD_OK;
  if (fstat(fd, &sb) != 0) {
    rc = dev_error(st, PD_INTERNAL, "fstat of shared memory object %s: %s", key,
                   strerror(errno));
  } else if (!S_ISREG(sb.st_mode)) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "shared memory object %s is not a regular object (mode "
                   "%o); expected one made by shm_open",
                   key, (unsigned)sb.st_mode);
  } else if ((uint64_t)sb.st_size < byte_size) {
    rc = dev_error(st, PD_INVALID_ARGUMENT,
                   "shared memory object %s holds %lld bytes; byte_size is "
                   "%" PRIu64 " (ftruncate it to at least byte_size first)",
                   key, (long long)sb.st_size, byte_size);
  }
  if (rc != PD_OK) {
    close(fd);
    return rc;
  }
  *fd_out = fd;
  return PD_OK;
}

/* Maps the object `fd` (srv_shm_open) and checks its header against
 * `token`: a new region with one reference that owns `fd`, or an error
 * naming the key (`fd` closed). */
static pd_code srv_shm_map(srv *s, const char *name, const char *key, int fd,
                           uint64_t byte_size, ProtobufCBinaryData token,
                           srv_shm_region **out, dev_status *st) {
  pd_code rc = PD_OK;
  void *p =
      mmap(NULL, (size_t)byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  if (p == MAP_FAILED) {
    close(fd);
    return dev_error(st,
                     e == ENOMEM ? PD_RESOURCE_EXHAUSTED : PD_INVALID_ARGUMENT,
                     "paradevd cannot map %" PRIu64
                     " bytes of shared "
                     "memory object %s: %s",
                     byte_size, key, strerror(e));
  }
  srv_shm_region *r = calloc(1, sizeof(*r));
  if (!r) {
    munmap(p, (size_t)byte_size);
    close(fd);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  atomic_init(&r->refs, 1);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->engine = s->engine;
  r->fd = fd;
  r->base = p;
  r->size = (size_t)byte_size;
  r->name = strdup(name);
  r->key = strdup(key);
  if (!r->name || !r->key) {
    srv_shm_region_unref(r);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  }
  /* The header: the session's, compared in constant time. */
  uint8_t got[SRV_SHM_HEADER_BYTES];
  srv_hdr_copy hc = {r->base, got};
  rc = srv_shm_guarded(r, true, srv_hdr_copy_fn, &hc, st);
  if (rc == PD_OK) {
    if (!srv_shm_header_ok(got, token.data, token.len))
      rc = dev_error(st, PD_PERMISSION_DENIED,
                     "shared memory object %s does not carry this session's "
                     "header (its first 64 bytes must be \"PDSHM\", version "
                     "%d, the token's length and the session token, then "
                     "zeros; libparadev writes it)",
                     key, SRV_SHM_VERSION);
  }
  if (rc != PD_OK) {
    srv_shm_region_unref(r);
    return rc;
  }
  *out = r;
  return PD_OK;
}

static void srv_register_shm(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__RegisterSharedMemoryRequest *req = (const void *)m;
  srv *s = c->s;
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  dev_status st = DEV_STATUS_INIT;
  srv_shm_region *r = NULL;
  const char *name = req->name ? req->name : "";
  const char *key = req->key ? req->key : "";
  uint64_t seq = sched_session_seq(ss);
  char ck[SRV_SHM_KEY_MAX + 8];
  int fd = -1;
  srv_req_limits l = srv_call_limits(c);
  if (srv_check_name(&l, name, true, "a shared memory region name", &st) !=
      PD_OK)
    goto fail;
  if (!srv_shm_key_ok(key)) {
    dev_error(&st, PD_INVALID_ARGUMENT,
              "shared memory key \"%s\": expected \"/\" followed by 1 to %d "
              "of A-Z a-z 0-9 . _ - (a POSIX shm_open name), and not \"/.\" "
              "or \"/..\"",
              srv_log_clean(key, ck, sizeof ck), SRV_SHM_KEY_MAX);
    goto fail;
  }
  if (req->byte_size <= SRV_SHM_HEADER_BYTES || req->byte_size > SIZE_MAX / 2) {
    dev_error(&st, PD_INVALID_ARGUMENT,
              "byte_size %" PRIu64
              " of shared memory object %s: a region "
              "holds the %d-byte header and at least one byte of data "
              "(expected %d to %zu)",
              req->byte_size, key, SRV_SHM_HEADER_BYTES,
              SRV_SHM_HEADER_BYTES + 1, SIZE_MAX / 2);
    goto fail;
  }
  srv_shm *h = s->shm;
  uint64_t quota = 0;
  if (srv_shm_open(key, req->byte_size, &fd, &st) != PD_OK) goto fail;
  if (srv_shm_session_quota(s, seq, &quota, &st) != PD_OK ||
      srv_shm_room(h, ss, name, req->byte_size, quota, &st) != PD_OK) {
    close(fd);
    goto fail;
  }
  if (srv_shm_map(s, name, key, fd, req->byte_size, req->session_token, &r,
                  &st) != PD_OK)
    goto fail;
  /* Page-locks the mapping so copies to and from the devices run as DMA
   * (a no-op on the CPU backend). */
  if (dev_engine_host_register(s->engine, r->base, r->size, &st) != PD_OK)
    goto fail_region;
  r->pinned = true;
  r->seq = seq;
  size_t size = r->size; /* once listed, the registry owns `r` */
  if (srv_shm_add(h, ss, r, quota, &st) != PD_OK) goto fail_region;
  char cn[129];
  SRV_INFO("session %" PRIu64
           ": shared memory region \"%s\" registered "
           "(%s, %zu bytes)",
           seq, srv_log_quote(name, cn, sizeof cn), key, size);
  Paradev__V1__SharedMemoryRegion info =
      PARADEV__V1__SHARED_MEMORY_REGION__INIT;
  info.name = (char *)name;
  info.key = (char *)key;
  info.byte_size = size;
  info.data_bytes = size - SRV_SHM_HEADER_BYTES;
  Paradev__V1__RegisterSharedMemoryResponse resp =
      PARADEV__V1__REGISTER_SHARED_MEMORY_RESPONSE__INIT;
  resp.region = &info;
  resp.incarnation = s->incarnation;
  srv_call_reply(c, &resp.base);
  sched_session_put(ss);
  return;
fail_region:
  srv_shm_region_unref(r);
fail:
  srv_call_fail(c, &st);
  sched_session_put(ss);
}

/* --- UnregisterSharedMemory --------------------------------------------------- */

static void srv_unregister_shm(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__UnregisterSharedMemoryRequest *req = (const void *)m;
  srv *s = c->s;
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  const char *name = req->name ? req->name : "";
  uint64_t seq = sched_session_seq(ss);
  srv_shm_region *r = srv_shm_take(s->shm, ss, name);
  sched_session_put(ss);
  if (!r) {
    char clean[129];
    srv_call_finish(c, PD_NOT_FOUND,
                    "no shared memory region named \"%s\" in this session "
                    "(never registered, unregistered, or another session's)",
                    srv_log_clean(name, clean, sizeof clean));
    return;
  }
  /* Waits for the copies running now; later ones fail with CANCELLED. Once
   * the reply goes, the daemon never touches the mapping again. */
  srv_shm_retire(r, false);
  char cn[129];
  SRV_INFO("session %" PRIu64 ": shared memory region \"%s\" unregistered", seq,
           srv_log_quote(r->name, cn, sizeof cn));
  srv_shm_region_unref(
      r); /* unmapped already; freed once no transfer holds it */
  Paradev__V1__UnregisterSharedMemoryResponse resp =
      PARADEV__V1__UNREGISTER_SHARED_MEMORY_RESPONSE__INIT;
  srv_call_reply(c, &resp.base);
}

/* --- transfers ------------------------------------------------------------------ */

/* One transfer's copies between the tensor and the mapping, run under the
 * SIGBUS guard: parts[0..n) in turn, each sizes[i] bytes, from data offset
 * `offset` on. */
typedef struct srv_shm_copy {
  bool upload;
  sched_upload *up; /* upload */
  dev_tensor *t;    /* download */
  dev_layout layout;
  int n;
  const uint64_t *sizes;
  const srv_shm_region *r;
  uint64_t offset; /* the first part's data offset (checked in range) */
} srv_shm_copy;

static pd_code srv_shm_copy_fn(void *arg, dev_status *st) {
  srv_shm_copy *k = arg;
  /* The mapping's address is read only now, inside the copy's admission:
   * a retired region has none. */
  uint8_t *p = k->r->base + SRV_SHM_HEADER_BYTES + k->offset;
  for (int i = 0; i < k->n; i++) {
    size_t len = (size_t)k->sizes[i];
    if (len) {
      int comp =
          k->layout.kind == DEV_LAYOUT_PER_COMPONENT ? i : k->layout.component;
      PD_TRY(k->upload
                 ? sched_upload_write(k->up, i, 0, p, len, st)
                 : dev_tensor_read(k->t, &k->layout, comp, 0, p, len, st));
    }
    p += len;
  }
  return PD_OK;
}

/* --- UploadFromSharedMemory -------------------------------------------------------- */

static void srv_upload_shm(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__UploadFromSharedMemoryRequest *req = (const void *)m;
  srv *s = c->s;
  dev_status st = DEV_STATUS_INIT;
  if (srv_check_accepting(s, "UploadFromSharedMemory", &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  sched_session *ss = srv_call_session(c, req->session_token);
  if (!ss) return;
  srv_shm_region *r = NULL;
  sched_upload *up = NULL;
  srv_arena a = {NULL};
  srv_upload_spec *sp = malloc(sizeof(*sp));
  if (!sp) {
    dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto fail;
  }
  /* Where it goes (issue #17), as Upload's header says it. */
  srv_req_limits l = srv_call_limits(c);
  dev_devset room;
  const dev_devset *set = NULL;
  if (srv_devset_from_pb(&l, req->devices, req->n_devices,
                         "UploadFromSharedMemoryRequest.devices", &room, &set,
                         &st) != PD_OK)
    goto fail;
  int ndev = set ? set->n : sched_session_devices(ss)->n;
  if (srv_upload_spec_from_pb(ndev, SRV_RT(s, max_tensor_bytes),
                              (int)req->dtype, req->shape, req->layout,
                              req->n_component_shapes, req->component_shapes,
                              sp, &st) != PD_OK ||
      srv_shm_get(s->shm, ss, req->region ? req->region : "", &r, &st) !=
          PD_OK ||
      srv_shm_check_range(r->size, r->name, req->offset, sp->total, &st) !=
          PD_OK)
    goto fail;
  bool per_comp = sp->layout.kind == DEV_LAYOUT_PER_COMPONENT;
  if (sched_upload_begin_on(ss, req->id, set, sp->dtype, &sp->layout, &sp->host,
                            per_comp ? sp->comps : NULL, &up, &st) != PD_OK)
    goto fail;
  int parts = per_comp ? ndev : 1;
  uint64_t sizes[PD_MAX_DEVICES];
  for (int i = 0; i < parts; i++) sizes[i] = sched_upload_expected(up, i);
  srv_shm_copy k = {true, up, NULL, sp->layout, parts, sizes, r, req->offset};
  if (srv_shm_guarded(r, true, srv_shm_copy_fn, &k, &st) != PD_OK) goto fail;
  const dev_tensor *t = sched_upload_tensor(up);
  Paradev__V1__TensorInfo *ti =
      srv_info_to_pb(&a, req->id, dev_tensor_dtype(t), dev_tensor_shape(t),
                     dev_tensor_devset(t));
  if (!ti) {
    dev_error(&st, PD_RESOURCE_EXHAUSTED, "out of host memory");
    goto fail;
  }
  sched_upload *committing = up;
  up = NULL;
  if (sched_upload_commit(committing, &st) != PD_OK) goto fail;
  atomic_fetch_add_explicit(&s->shm_upload_bytes, sp->total,
                            memory_order_relaxed);
  Paradev__V1__UploadResponse resp = PARADEV__V1__UPLOAD_RESPONSE__INIT;
  resp.tensor = ti;
  resp.bytes_received = sp->total;
  resp.incarnation = s->incarnation;
  srv_call_reply(c, &resp.base);
  goto out;
fail:
  srv_call_fail(c, &st);
out:
  sched_upload_abort(up);
  srv_shm_region_unref(r);
  srv_arena_free(&a);
  free(sp);
  sched_session_put(ss);
}

/* --- DownloadToSharedMemory ---------------------------------------------------------- */

/* Waits for its tensor as Download does (a wake-up, never a blocked thread),
 * holding the region so it stays mapped. */
typedef struct srv_dl_shm_state {
  sched_session *ss;
  dev_tensor *t;
  srv_shm_region *r;
  dev_layout layout;
  int parts;
  uint64_t offset, total;
  uint64_t size[PD_MAX_DEVICES];
  dev_shape shape[PD_MAX_DEVICES];
  srv_wait *w;
} srv_dl_shm_state;

static void srv_download_shm_destroy(srv_call *c) {
  srv_dl_shm_state *d = c->user;
  if (!d) return;
  srv_call_await_cancel(&d->w);
  dev_tensor_release(d->t);
  srv_shm_region_unref(d->r);
  sched_session_put(d->ss);
  free(d);
  c->user = NULL;
}

/* The tensor is computed: copy it into the region, or end with its error. */
static void srv_download_shm_finish(srv_call *c) {
  srv_dl_shm_state *d = c->user;
  if (d->w) srv_call_await_woken(&d->w);
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_wait(d->t, &st) != PD_OK) { /* ready: returns at once */
    srv_call_fail(c, &st);
    return;
  }
  srv_shm_copy k = {false,    NULL,    d->t, d->layout,
                    d->parts, d->size, d->r, d->offset};
  if (srv_shm_guarded(d->r, false, srv_shm_copy_fn, &k, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  atomic_fetch_add_explicit(&c->s->shm_download_bytes, d->total,
                            memory_order_relaxed);
  srv_arena a = {NULL};
  Paradev__V1__Shape **shapes = srv_shapes_to_pb(&a, d->shape, d->parts);
  if (!shapes) {
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  Paradev__V1__DownloadToSharedMemoryResponse resp =
      PARADEV__V1__DOWNLOAD_TO_SHARED_MEMORY_RESPONSE__INIT;
  resp.dtype = (Paradev__V1__DType)dev_tensor_dtype(d->t);
  resp.n_host_shapes = (size_t)d->parts;
  resp.host_shapes = shapes;
  resp.bytes_written = d->total;
  resp.incarnation = c->s->incarnation;
  srv_call_reply(c, &resp.base);
  srv_arena_free(&a);
}

static void srv_download_shm(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DownloadToSharedMemoryRequest *req = (const void *)m;
  srv *s = c->s;
  srv_dl_shm_state *d = calloc(1, sizeof(*d));
  if (!d) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->user = d;
  d->ss = srv_call_session(c, req->session_token);
  if (!d->ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (srv_shm_get(s->shm, d->ss, req->region ? req->region : "", &d->r, &st) !=
          PD_OK ||
      sched_handle_get(d->ss, req->id, &d->t, &st) != PD_OK ||
      srv_download_layout_from_pb(req->layout, dev_tensor_num_components(d->t),
                                  &d->layout, &d->parts, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  for (int i = 0; i < d->parts; i++) {
    int comp =
        d->layout.kind == DEV_LAYOUT_PER_COMPONENT ? i : d->layout.component;
    if (dev_tensor_host_size(d->t, &d->layout, comp, &d->shape[i], &d->size[i],
                             &st) != PD_OK) {
      srv_call_fail(c, &st);
      return;
    }
    d->total += d->size[i];
  }
  d->offset = req->offset;
  /* Before waiting: a value that does not fit is refused at once. */
  if (srv_shm_check_range(d->r->size, d->r->name, d->offset, d->total, &st) !=
      PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  if (dev_tensor_is_ready(d->t)) {
    srv_download_shm_finish(c);
    return;
  }
  char cn[129];
  SRV_DEBUG("session %" PRIu64 ": DownloadToSharedMemory of tensor %" PRIu64
            " into region \"%s\" waits for the tensor",
            sched_session_seq(d->ss), req->id,
            srv_log_quote(d->r->name, cn, sizeof cn));
  srv_call_await(c, d->ss, d->t, &d->w); /* then srv_download_shm_finish */
}

static void srv_download_shm_cancel(srv_call *c) {
  srv_dl_shm_state *d = c->user;
  if (d) srv_call_await_cancel(&d->w);
  srv_call_finish_cancelled(c, "DownloadToSharedMemory");
}

/* --- the methods ------------------------------------------------------------------ */

const srv_handlers srv_h_RegisterSharedMemory = {.on_request =
                                                     srv_register_shm};
const srv_handlers srv_h_UnregisterSharedMemory = {.on_request =
                                                       srv_unregister_shm};
const srv_handlers srv_h_UploadFromSharedMemory = {.on_request =
                                                       srv_upload_shm};
const srv_handlers srv_h_DownloadToSharedMemory = {
    .on_request = srv_download_shm,
    .on_destroy = srv_download_shm_destroy,
    .on_wake = srv_download_shm_finish,
    .on_cancel = srv_download_shm_cancel,
    .early_close = true};
