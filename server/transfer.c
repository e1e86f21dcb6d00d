/* Transfers on the wire: Upload (a client stream of a header and chunks)
 * and Download (a server stream of a header and chunks). Both run on their
 * call's completion-queue thread (see server.h); Download waits for its
 * tensor with srv_call_await, never a blocked thread. The header's checks
 * and the chunks' encoding are convert.c's; the tensors are the
 * scheduler's (sched_upload_*) and the engine's (dev_tensor_read). Shared
 * memory transfers are shm.c's. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "log.h"
#include "server.h"

/* --- Upload ------------------------------------------------------------------ */

typedef struct srv_upload_state {
  sched_session *ss;
  sched_upload *up;
  uint64_t id;
  bool per_component;
  int num_components; /* components the chunks cover: 1 or num_devices */
  int component;      /* current one */
  uint64_t offset;    /* next expected offset within it */
  uint64_t expected;  /* bytes of the current component's value */
  uint64_t received;
} srv_upload_state;

static void srv_upload_destroy(srv_call *c) {
  srv_upload_state *u = c->user;
  if (!u) return;
  sched_upload_abort(u->up);
  sched_session_put(u->ss);
  free(u);
  c->user = NULL;
}

static void srv_upload_header(srv_call *c, srv_upload_state *u,
                              const Paradev__V1__UploadHeader *h) {
  srv *s = c->s;
  dev_status st = DEV_STATUS_INIT;
  if (srv_check_accepting(s, "Upload", &st) != PD_OK) goto fail;
  u->ss = srv_call_session(c, h->session_token);
  if (!u->ss) return;
  /* Where it goes (issue #17): the header's devices, else the session's
   * default; a PER_COMPONENT value has a component per device of the set. */
  srv_req_limits l = srv_call_limits(c);
  dev_devset room;
  const dev_devset *set = NULL;
  if (srv_devset_from_pb(&l, h->devices, h->n_devices, "UploadHeader.devices",
                         &room, &set, &st) != PD_OK)
    goto fail;
  int ndev = set ? set->n : sched_session_devices(u->ss)->n;
  srv_upload_spec sp;
  if (srv_upload_spec_from_pb(ndev, SRV_RT(s, max_tensor_bytes), (int)h->dtype,
                              h->shape, h->layout, h->n_component_shapes,
                              h->component_shapes, &sp, &st) != PD_OK)
    goto fail;
  if (sched_upload_begin_on(
          u->ss, h->id, set, sp.dtype, &sp.layout, &sp.host,
          sp.layout.kind == DEV_LAYOUT_PER_COMPONENT ? sp.comps : NULL, &u->up,
          &st) != PD_OK)
    goto fail;
  u->id = h->id;
  u->per_component = sp.layout.kind == DEV_LAYOUT_PER_COMPONENT;
  u->num_components = u->per_component ? ndev : 1;
  u->component = 0;
  u->offset = 0;
  u->expected = sched_upload_expected(u->up, 0);
  return;
fail:
  srv_call_fail(c, &st);
}

/* Moves to the next component while the current one is full, up to (not
 * past) `before` and the last one: a PER_COMPONENT upload's chunks skip the
 * components of zero bytes. */
static void srv_upload_advance(srv_upload_state *u, int before) {
  while (u->per_component && before > u->component &&
         u->offset == u->expected && u->component + 1 < u->num_components) {
    u->component++;
    u->offset = 0;
    u->expected = sched_upload_expected(u->up, u->component);
  }
}

/* The client closed its side: the value must be complete; then commit and
 * answer with the tensor's info. */
static void srv_upload_end(srv_call *c, srv_upload_state *u) {
  if (!u->up) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: the stream ended without a header");
    return;
  }
  /* Skip components of zero bytes at the end. */
  srv_upload_advance(u, INT_MAX);
  if (u->component + 1 != u->num_components || u->offset != u->expected) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload of handle %llu incomplete: the stream ended at "
                    "component %d offset %llu; that component holds %llu "
                    "bytes (of %d components)",
                    (unsigned long long)u->id, u->component,
                    (unsigned long long)u->offset,
                    (unsigned long long)u->expected, u->num_components);
    return;
  }
  srv_arena a = {NULL};
  const dev_tensor *t = sched_upload_tensor(u->up);
  Paradev__V1__TensorInfo *ti =
      srv_info_to_pb(&a, u->id, dev_tensor_dtype(t), dev_tensor_shape(t),
                     dev_tensor_devset(t));
  dev_status st = DEV_STATUS_INIT;
  sched_upload *up = u->up;
  u->up = NULL;
  if (!ti) {
    sched_upload_abort(up);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
  } else if (sched_upload_commit(up, &st) != PD_OK) {
    srv_call_fail(c, &st);
  } else {
    Paradev__V1__UploadResponse resp = PARADEV__V1__UPLOAD_RESPONSE__INIT;
    resp.tensor = ti;
    resp.bytes_received = u->received;
    resp.incarnation = c->s->incarnation;
    srv_call_reply(c, &resp.base);
  }
  srv_arena_free(&a);
}

/* Whether a chunk goes where the previous one ended, within the value and
 * the chunk limit; false once the call is finished with the reason. */
static bool srv_upload_chunk_ok(srv_call *c, const srv_upload_state *u,
                                const Paradev__V1__UploadChunk *ch) {
  if (ch->component != u->component || ch->offset != u->offset) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: chunk for component %d at offset %llu; expected "
                    "component %d at offset %llu (chunks go in order, each "
                    "where the previous one ended)",
                    ch->component, (unsigned long long)ch->offset, u->component,
                    (unsigned long long)u->offset);
    return false;
  }
  if (ch->data.len > u->expected - u->offset) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: a chunk of %zu bytes at offset %llu runs past the "
                    "end of the value, which holds %llu bytes (%llu left)",
                    ch->data.len, (unsigned long long)u->offset,
                    (unsigned long long)u->expected,
                    (unsigned long long)(u->expected - u->offset));
    return false;
  }
  if (ch->data.len > c->s->opt.limits.max_chunk_bytes) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: a chunk of %zu bytes; the limit max_chunk_bytes "
                    "is %llu (split the value into smaller chunks)",
                    ch->data.len,
                    (unsigned long long)c->s->opt.limits.max_chunk_bytes);
    return false;
  }
  return true;
}

/* One chunk after the header: checked, then written into the upload. */
static void srv_upload_chunk(srv_call *c, srv_upload_state *u,
                             const Paradev__V1__UploadChunk *ch) {
  if (!u->up) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: a chunk before the header; send the header first");
    return;
  }
  sched_session_touch(u->ss);
  /* A PER_COMPONENT upload moves to the next component once one is full. */
  srv_upload_advance(u, ch->component);
  if (!srv_upload_chunk_ok(c, u, ch)) return;
  dev_status st = DEV_STATUS_INIT;
  if (ch->data.len &&
      sched_upload_write(u->up, u->component, u->offset, ch->data.data,
                         ch->data.len, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  u->offset += ch->data.len;
  u->received += ch->data.len;
  atomic_fetch_add_explicit(&c->s->upload_bytes, ch->data.len,
                            memory_order_relaxed);
}

/* Each message of the stream (NULL once the client closed its side): one
 * header, then chunks in order. */
static void srv_upload_msg(srv_call *c, const ProtobufCMessage *m) {
  srv_upload_state *u = c->user;
  if (!u) {
    u = c->user = calloc(1, sizeof(*u));
    if (!u) {
      srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
      return;
    }
  }
  if (!m) {
    srv_upload_end(c, u);
    return;
  }
  const Paradev__V1__UploadRequest *req = (const void *)m;
  if (req->item_case == PARADEV__V1__UPLOAD_REQUEST__ITEM_HEADER) {
    if (u->up || u->ss) {
      srv_call_finish(c, PD_INVALID_ARGUMENT,
                      "Upload: a second header; an upload has one header "
                      "followed by chunks");
      return;
    }
    srv_upload_header(c, u, req->header);
  } else if (req->item_case == PARADEV__V1__UPLOAD_REQUEST__ITEM_CHUNK) {
    srv_upload_chunk(c, u, req->chunk);
  } else {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: a message with neither header nor chunk");
  }
}

/* --- Download ------------------------------------------------------------------ */

typedef struct srv_download_state {
  sched_session *ss;
  dev_tensor *t;
  dev_layout layout;
  int num_components; /* parts streamed: 1, or num_devices (PER_COMPONENT) */
  int component;
  uint64_t offset;
  uint64_t size[PD_MAX_DEVICES];
  dev_shape shape[PD_MAX_DEVICES];
  uint64_t chunk;
  bool started;
  srv_wait *w; /* waiting for the tensor to be computed */
} srv_download_state;

static void srv_download_destroy(srv_call *c) {
  srv_download_state *d = c->user;
  if (!d) return;
  srv_call_await_cancel(&d->w);
  dev_tensor_release(d->t);
  sched_session_put(d->ss);
  free(d);
  c->user = NULL;
}

/* Queues the next chunks (two, so one is always ready to go). */
static void srv_download_more(srv_call *c) {
  srv_download_state *d = c->user;
  if (!d || !d->started) return;
  while (srv_call_queued(c) < 2) {
    while (d->component < d->num_components &&
           d->offset == d->size[d->component]) {
      d->component++;
      d->offset = 0;
    }
    if (d->component >= d->num_components) {
      srv_call_finish(c, PD_OK, "%s", "");
      return;
    }
    uint64_t left = d->size[d->component] - d->offset;
    size_t len = (size_t)(left < d->chunk ? left : d->chunk);
    int comp = d->layout.kind == DEV_LAYOUT_PER_COMPONENT ? d->component
                                                          : d->layout.component;
    /* The tensor's bytes are read straight into the outgoing slice. */
    size_t hl = srv_chunk_header_len(d->component, d->offset, len);
    grpc_slice sl = grpc_slice_malloc(hl + len);
    uint8_t *p = srv_chunk_header(GRPC_SLICE_START_PTR(sl), d->component,
                                  d->offset, len);
    dev_status st = DEV_STATUS_INIT;
    if (len && dev_tensor_read(d->t, &d->layout, comp, d->offset, p, len,
                               &st) != PD_OK) {
      grpc_slice_unref(sl);
      srv_call_fail(c, &st);
      return;
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    srv_call_write_buffer(c, bb);
    d->offset += len;
    atomic_fetch_add_explicit(&c->s->download_bytes, len, memory_order_relaxed);
  }
}

/* Sends the header once the tensor is computed, or its stored error. Runs
 * on the call's thread: at once, or as on_wake when the tensor is ready. */
static void srv_download_begin(srv_call *c) {
  srv_download_state *d = c->user;
  if (d->w) srv_call_await_woken(&d->w);
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_wait(d->t, &st) != PD_OK) { /* ready: returns at once */
    srv_call_fail(c, &st);
    return;
  }
  srv_arena a = {NULL};
  Paradev__V1__Shape **shapes =
      srv_shapes_to_pb(&a, d->shape, d->num_components);
  uint64_t total = 0;
  for (int i = 0; i < d->num_components; i++) total += d->size[i];
  if (!shapes) {
    srv_arena_free(&a);
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  Paradev__V1__DownloadHeader h = PARADEV__V1__DOWNLOAD_HEADER__INIT;
  h.dtype = (Paradev__V1__DType)dev_tensor_dtype(d->t);
  h.n_host_shapes = (size_t)d->num_components;
  h.host_shapes = shapes;
  h.total_bytes = total;
  Paradev__V1__DownloadResponse resp = PARADEV__V1__DOWNLOAD_RESPONSE__INIT;
  resp.item_case = PARADEV__V1__DOWNLOAD_RESPONSE__ITEM_HEADER;
  resp.header = &h;
  /* Chunks follow from on_drained. */
  d->started = true;
  srv_call_write(c, &resp.base);
  srv_arena_free(&a);
}

static void srv_download(srv_call *c, const ProtobufCMessage *m) {
  const Paradev__V1__DownloadRequest *req = (const void *)m;
  srv *s = c->s;
  const srv_limits *l = &s->opt.limits;
  if (req->chunk_bytes > l->max_chunk_bytes) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "chunk_bytes %llu is over the limit max_chunk_bytes = %llu",
                    (unsigned long long)req->chunk_bytes,
                    (unsigned long long)l->max_chunk_bytes);
    return;
  }
  srv_download_state *d = calloc(1, sizeof(*d));
  if (!d) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  c->user = d;
  d->chunk = req->chunk_bytes ? req->chunk_bytes : l->default_chunk_bytes;
  d->ss = srv_call_session(c, req->session_token);
  if (!d->ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (sched_handle_get(d->ss, req->id, &d->t, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  if (srv_download_layout_from_pb(req->layout, dev_tensor_num_components(d->t),
                                  &d->layout, &d->num_components,
                                  &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  for (int i = 0; i < d->num_components; i++) {
    int comp =
        d->layout.kind == DEV_LAYOUT_PER_COMPONENT ? i : d->layout.component;
    if (dev_tensor_host_size(d->t, &d->layout, comp, &d->shape[i], &d->size[i],
                             &st) != PD_OK) {
      srv_call_fail(c, &st);
      return;
    }
  }
  if (srv_call_await(c, d->ss, d->t, &d->w)) srv_download_begin(c);
  /* else srv_download_begin runs when it is computed */
}

static void srv_download_cancel(srv_call *c) {
  srv_download_state *d = c->user;
  if (d && d->w) {
    srv_call_await_cancel(&d->w);
    srv_call_finish_cancelled(c, "Download");
  }
}

const srv_handlers srv_h_Upload = {.on_message = srv_upload_msg,
                                   .on_destroy = srv_upload_destroy};
const srv_handlers srv_h_Download = {.on_request = srv_download,
                                     .on_drained = srv_download_more,
                                     .on_destroy = srv_download_destroy,
                                     .on_wake = srv_download_begin,
                                     .on_cancel = srv_download_cancel};
