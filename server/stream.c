/* paradevd's streaming methods: Upload (client stream), Download (server
 * stream), Enqueue and EchoStream (bidirectional). All run on their call's
 * completion-queue thread (see server.h); Download waits for its tensor with
 * a wake-up, never a blocked thread. */
#include <stdlib.h>
#include <string.h>

#define SRV_LOG_SUB SRV_SUB_RPC
#include "log.h"
#include "server.h"
#include "srv_int.h"

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

pd_code srv_upload_spec_from_pb(srv *s, int dtype,
                                const Paradev__V1__Shape *shape,
                                const Paradev__V1__Layout *layout,
                                size_t n_component_shapes,
                                Paradev__V1__Shape *const *component_shapes,
                                srv_upload_spec *out, dev_status *st) {
  int ndev = dev_engine_num_devices(s->engine);
  srv_upload_spec *u = out;
  u->host = (dev_shape){0, {0}};
  u->layout = (dev_layout){DEV_LAYOUT_MIRRORED, 0, 0};
  u->total = 0;
  pd_code rc = srv_dtype_from_pb(dtype, "header", &u->dtype, st);
  if (rc != PD_OK) return rc;
  if (layout) {
    switch ((int)layout->kind) {
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_MIRRORED:
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_SHARDED:
        u->layout.kind = DEV_LAYOUT_SHARDED;
        u->layout.axis = layout->axis;
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_PER_COMPONENT:
        u->layout.kind = DEV_LAYOUT_PER_COMPONENT;
        break;
      default:
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "upload layout kind %d; expected MIRRORED (0), "
                         "SHARDED (1) or PER_COMPONENT (2)",
                         (int)layout->kind);
    }
  }
  if (u->layout.kind == DEV_LAYOUT_PER_COMPONENT) {
    if (n_component_shapes != (size_t)ndev)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "a PER_COMPONENT upload needs %d component_shapes (one "
                       "per device); got %zu",
                       ndev, n_component_shapes);
    for (int i = 0; i < ndev; i++) {
      size_t b = 0;
      if ((rc = srv_shape_from_pb(component_shapes[i], "component shape",
                                  &u->comps[i], st)) != PD_OK ||
          (rc = dev_shape_byte_size(u->dtype, &u->comps[i], &b, st)) != PD_OK)
        return rc;
      if (u->total + b < u->total)
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "the component shapes' bytes add up past 2^64");
      u->total += b;
    }
  } else {
    size_t b = 0;
    if ((rc = srv_shape_from_pb(shape, "shape", &u->host, st)) != PD_OK ||
        (rc = dev_shape_byte_size(u->dtype, &u->host, &b, st)) != PD_OK)
      return rc;
    u->total = b;
  }
  uint64_t max_tensor = SRV_RT(s, max_tensor_bytes);
  if (u->total > max_tensor)
    return dev_error(st, PD_RESOURCE_EXHAUSTED,
                     "the upload holds %llu bytes; the limit max_tensor_bytes "
                     "is %llu",
                     (unsigned long long)u->total,
                     (unsigned long long)max_tensor);
  return PD_OK;
}

static void srv_upload_header(srv_call *c, srv_upload_state *u,
                              const Paradev__V1__UploadHeader *h) {
  srv *s = c->s;
  dev_status st = DEV_STATUS_INIT;
  u->ss = srv_open_session(c, h->session_token);
  if (!u->ss) return;
  int ndev = dev_engine_num_devices(s->engine);
  srv_upload_spec sp;
  if (srv_upload_spec_from_pb(s, (int)h->dtype, h->shape, h->layout,
                              h->n_component_shapes, h->component_shapes, &sp,
                              &st) != PD_OK)
    goto fail;
  if (sched_upload_begin(u->ss, h->id, sp.dtype, &sp.layout, &sp.host,
                         sp.layout.kind == DEV_LAYOUT_PER_COMPONENT ? sp.comps
                                                                    : NULL,
                         &u->up, &st) != PD_OK)
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

static void srv_upload_msg(srv_call *c, const ProtobufCMessage *m) {
  srv_upload_state *u = c->user;
  if (!u) {
    u = c->user = calloc(1, sizeof(*u));
    if (!u) {
      srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
      return;
    }
  }
  if (!m) { /* the client closed its side: the value must be complete */
    if (!u->up) {
      srv_call_finish(c, PD_INVALID_ARGUMENT,
                      "Upload: the stream ended without a header");
      return;
    }
    /* Skip components of zero bytes at the end. */
    while (u->per_component && u->offset == u->expected &&
           u->component + 1 < u->num_components) {
      u->component++;
      u->offset = 0;
      u->expected = sched_upload_expected(u->up, u->component);
    }
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
        srv_info_to_pb(&a, u->id, dev_tensor_dtype(t), dev_tensor_shape(t));
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
    return;
  }
  if (req->item_case != PARADEV__V1__UPLOAD_REQUEST__ITEM_CHUNK) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: a message with neither header nor chunk");
    return;
  }
  if (!u->up) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: a chunk before the header; send the header first");
    return;
  }
  const Paradev__V1__UploadChunk *ch = req->chunk;
  sched_session_touch(u->ss);
  /* A PER_COMPONENT upload moves to the next component once one is full. */
  while (u->per_component && ch->component > u->component &&
         u->offset == u->expected && u->component + 1 < u->num_components) {
    u->component++;
    u->offset = 0;
    u->expected = sched_upload_expected(u->up, u->component);
  }
  if (ch->component != u->component || ch->offset != u->offset) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: chunk for component %d at offset %llu; expected "
                    "component %d at offset %llu (chunks go in order, each "
                    "where the previous one ended)",
                    ch->component, (unsigned long long)ch->offset,
                    u->component, (unsigned long long)u->offset);
    return;
  }
  if (ch->data.len > c->s->opt.limits.max_chunk_bytes ||
      ch->data.len > u->expected - u->offset) {
    srv_call_finish(c, PD_INVALID_ARGUMENT,
                    "Upload: a chunk of %zu bytes at offset %llu; the value "
                    "holds %llu bytes and the limit max_chunk_bytes is %llu",
                    ch->data.len, (unsigned long long)u->offset,
                    (unsigned long long)u->expected,
                    (unsigned long long)c->s->opt.limits.max_chunk_bytes);
    return;
  }
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

srv_method srv_m_upload = {.path = "/paradev.v1.ParallelDevice/Upload",
                           .kind = SRV_CLIENT_STREAM,
                           .request = &paradev__v1__upload_request__descriptor,
                           .on_message = srv_upload_msg,
                           .on_destroy = srv_upload_destroy};

/* --- Download ------------------------------------------------------------------ */

static size_t srv_varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *srv_put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

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
  srv_wait_cancel(d->w);
  srv_wait_put(d->w, false);
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
    /* Encoded by hand so that the tensor's bytes are read straight into the
     * outgoing slice (one copy): DownloadResponse{chunk (2): DownloadChunk{
     * component (1), offset (2), data (3)}}, defaults omitted as proto3 does. */
    uint64_t ucomp = (uint64_t)d->component;
    size_t inner = 1 + srv_varint_len(len) + len;
    if (ucomp) inner += 1 + srv_varint_len(ucomp);
    if (d->offset) inner += 1 + srv_varint_len(d->offset);
    grpc_slice sl = grpc_slice_malloc(1 + srv_varint_len(inner) + inner);
    uint8_t *p = GRPC_SLICE_START_PTR(sl);
    *p++ = 0x12;
    p = srv_put_varint(p, inner);
    if (ucomp) {
      *p++ = 0x08;
      p = srv_put_varint(p, ucomp);
    }
    if (d->offset) {
      *p++ = 0x10;
      p = srv_put_varint(p, d->offset);
    }
    *p++ = 0x1a;
    p = srv_put_varint(p, len);
    dev_status st = DEV_STATUS_INIT;
    if (len && dev_tensor_read(d->t, &d->layout, comp, d->offset, p, len, &st) !=
                   PD_OK) {
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
  if (d->w) { /* woken: that wait is over */
    srv_wait_put(d->w, false);
    d->w = NULL;
  }
  dev_status st = DEV_STATUS_INIT;
  if (dev_tensor_wait(d->t, &st) != PD_OK) { /* ready: returns at once */
    srv_call_fail(c, &st);
    return;
  }
  srv_arena a = {NULL};
  Paradev__V1__Shape **shapes =
      srv_arena_alloc(&a, sizeof(*shapes) * (size_t)d->num_components);
  uint64_t total = 0;
  for (int i = 0; shapes && i < d->num_components; i++) {
    shapes[i] = srv_shape_to_pb(&a, &d->shape[i]);
    if (!shapes[i]) shapes = NULL;
    total += d->size[i];
  }
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

pd_code srv_download_layout_from_pb(const Paradev__V1__Layout *pb, int ndev,
                                    dev_layout *out, int *num_parts,
                                    dev_status *st) {
  dev_layout l = {DEV_LAYOUT_MIRRORED, 0, 0};
  int parts = 1;
  if (pb) {
    switch ((int)pb->kind) {
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_MIRRORED:
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_SHARDED:
        l.kind = DEV_LAYOUT_SHARDED;
        l.axis = pb->axis;
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_PER_COMPONENT:
        l.kind = DEV_LAYOUT_PER_COMPONENT;
        parts = ndev;
        break;
      case PARADEV__V1__LAYOUT_KIND__LAYOUT_COMPONENT:
        l.kind = DEV_LAYOUT_COMPONENT;
        l.component = pb->component;
        if (pb->component < 0 || pb->component >= ndev)
          return dev_error(st, PD_INVALID_ARGUMENT,
                           "component %d; the mesh has components 0..%d",
                           pb->component, ndev - 1);
        break;
      default:
        return dev_error(st, PD_INVALID_ARGUMENT,
                         "download layout kind %d; expected 0..3",
                         (int)pb->kind);
    }
  }
  *out = l;
  *num_parts = parts;
  return PD_OK;
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
  d->ss = srv_open_session(c, req->session_token);
  if (!d->ss) return;
  dev_status st = DEV_STATUS_INIT;
  if (sched_handle_get(d->ss, req->id, &d->t, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  if (srv_download_layout_from_pb(req->layout,
                                  dev_tensor_num_components(d->t), &d->layout,
                                  &d->num_components, &st) != PD_OK) {
    srv_call_fail(c, &st);
    return;
  }
  for (int i = 0; i < d->num_components; i++) {
    int comp = d->layout.kind == DEV_LAYOUT_PER_COMPONENT ? i
                                                          : d->layout.component;
    if (dev_tensor_host_size(d->t, &d->layout, comp, &d->shape[i], &d->size[i],
                             &st) != PD_OK) {
      srv_call_fail(c, &st);
      return;
    }
  }
  if (dev_tensor_is_ready(d->t)) {
    srv_download_begin(c);
    return;
  }
  srv_wait *w = srv_wait_new(c);
  if (!w) {
    srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  if (sched_tensor_notify(d->ss, d->t, srv_wait_ready, w, &st) != PD_OK) {
    srv_wait_cancel(w);
    srv_wait_put(w, true);
    srv_call_fail(c, &st);
    return;
  }
  d->w = w; /* srv_download_begin runs when it is computed */
}

static void srv_download_cancel(srv_call *c) {
  srv_download_state *d = c->user;
  if (d && d->w) {
    srv_wait_cancel(d->w);
    srv_wait_put(d->w, false);
    d->w = NULL;
    srv_call_finish_cancelled(c, "Download");
  }
}

srv_method srv_m_download = {
    .path = "/paradev.v1.ParallelDevice/Download",
    .kind = SRV_SERVER_STREAM,
    .request = &paradev__v1__download_request__descriptor,
    .on_request = srv_download,
    .on_drained = srv_download_more,
    .on_destroy = srv_download_destroy,
    .on_wake = srv_download_begin,
    .on_cancel = srv_download_cancel};

/* --- Enqueue ------------------------------------------------------------------- */

typedef struct srv_enqueue_state {
  sched_session *ss;
  uint8_t token[SCHED_TOKEN_BYTES];
  uint64_t index;
  uint64_t tag; /* marks this stream's queued ops */
} srv_enqueue_state;

static void srv_enqueue_destroy(srv_call *c) {
  srv_enqueue_state *e = c->user;
  if (!e) return;
  /* A stream the client abandoned takes its not-yet-started ops with it. */
  if (e->ss && atomic_load(&c->cancelled)) {
    int n = sched_cancel(e->ss, e->tag);
    if (n) SRV_INFO("Enqueue stream cancelled: %d queued ops dropped", n);
  }
  sched_session_put(e->ss);
  free(e);
  c->user = NULL;
}

static void srv_enqueue_reply(srv_call *c, uint64_t index, const dev_status *st,
                              Paradev__V1__TensorInfo **outs, size_t n_outs) {
  Paradev__V1__Status ps = PARADEV__V1__STATUS__INIT;
  char msg[DEV_STATUS_MSG_MAX];
  ps.code = (int32_t)st->code;
  ps.message = srv_log_clean(st->msg, msg, sizeof msg); /* proto3: UTF-8 */
  Paradev__V1__EnqueueResponse resp = PARADEV__V1__ENQUEUE_RESPONSE__INIT;
  resp.index = index;
  resp.status = &ps;
  if (st->code == PD_OK && outs) {
    resp.n_outputs = n_outs;
    resp.outputs = outs;
  }
  srv_call_write(c, &resp.base);
}

static void srv_enqueue_msg(srv_call *c, const ProtobufCMessage *m) {
  srv_enqueue_state *e = c->user;
  if (!m) {
    srv_call_finish(c, PD_OK, "%s", "");
    return;
  }
  const Paradev__V1__EnqueueRequest *req = (const void *)m;
  if (!e) {
    e = c->user = calloc(1, sizeof(*e));
    if (!e) {
      srv_call_finish(c, PD_RESOURCE_EXHAUSTED, "out of host memory");
      return;
    }
    e->ss = srv_open_session(c, req->session_token);
    if (!e->ss) return; /* the stream ends with the session's error */
    memcpy(e->token, req->session_token.data, SCHED_TOKEN_BYTES);
    e->tag = sched_new_tag(c->s->sched);
  } else {
    sched_session_touch(e->ss);
  }
  uint64_t index = e->index++;
  dev_status st = DEV_STATUS_INIT;
  if (req->session_token.len != 0 &&
      (req->session_token.len != SCHED_TOKEN_BYTES ||
       memcmp(req->session_token.data, e->token, SCHED_TOKEN_BYTES) != 0)) {
    dev_error(&st, PD_INVALID_ARGUMENT,
              "item %llu names another session than the stream's first item",
              (unsigned long long)index);
    srv_enqueue_reply(c, index, &st, NULL, 0);
    return;
  }
  if (req->item_case == PARADEV__V1__ENQUEUE_REQUEST__ITEM_EXECUTE) {
    dev_attr attrs[DEV_MAX_ATTRS];
    sched_op op;
    sched_op_result res;
    int failed = 0;
    /* The reply of one op, built here rather than in an arena: this is the
     * path of every streamed op, and allocation shows in its profile. */
    Paradev__V1__TensorInfo info[DEV_MAX_OUTPUTS], *outs[DEV_MAX_OUTPUTS];
    Paradev__V1__Shape shape[DEV_MAX_OUTPUTS];
    int64_t dims[DEV_MAX_OUTPUTS][PD_MAX_RANK];
    size_t n_outs = 0;
    if (srv_op_from_pb(req->execute, 0, attrs, &op, &st) == PD_OK &&
        sched_execute(e->ss, &op, 1, e->tag, &res, &failed, &st) == PD_OK) {
      for (int j = 0; j < res.num_outputs; j++) {
        paradev__v1__shape__init(&shape[j]);
        shape[j].n_dims = (size_t)res.shape[j].rank;
        shape[j].dims = dims[j];
        for (int k = 0; k < res.shape[j].rank; k++)
          dims[j][k] = res.shape[j].dims[k];
        paradev__v1__tensor_info__init(&info[j]);
        info[j].id = op.output_ids[j];
        info[j].dtype = (Paradev__V1__DType)res.dtype[j];
        info[j].shape = &shape[j];
        outs[j] = &info[j];
      }
      n_outs = (size_t)res.num_outputs;
    }
    srv_enqueue_reply(c, index, &st, outs, n_outs);
  } else if (req->item_case == PARADEV__V1__ENQUEUE_REQUEST__ITEM_DELETE) {
    const Paradev__V1__DeleteItem *di = req->delete_;
    int max_ids = SRV_RT(c->s, max_ids_per_request);
    if (di->n_ids > (size_t)max_ids)
      dev_error(&st, PD_INVALID_ARGUMENT,
                "%zu ids in one delete item; the limit max_ids_per_request "
                "is %d",
                di->n_ids, max_ids);
    else
      sched_handle_delete(e->ss, di->ids, (int)di->n_ids, &st);
    srv_enqueue_reply(c, index, &st, NULL, 0);
  } else {
    srv_arena a = {NULL};
    Paradev__V1__TensorInfo **outs = NULL;
    size_t n_outs = 0;
    if (!srv_tape_item(c, e->ss, e->tag, req, &a, &outs, &n_outs, &st))
      dev_error(&st, PD_INVALID_ARGUMENT,
                "item %llu has no item (execute, delete, start_tape, "
                "watch_tape, gradient or delete_tape)",
                (unsigned long long)index);
    srv_enqueue_reply(c, index, &st, outs, n_outs);
    srv_arena_free(&a);
  }
}

srv_method srv_m_enqueue = {.path = "/paradev.v1.ParallelDevice/Enqueue",
                            .kind = SRV_BIDI,
                            .request = &paradev__v1__enqueue_request__descriptor,
                            .on_message = srv_enqueue_msg,
                            .on_destroy = srv_enqueue_destroy};

/* --- EchoStream ---------------------------------------------------------------- */

static void srv_echo_stream_msg(srv_call *c, const ProtobufCMessage *m) {
  if (!m) {
    srv_call_finish(c, PD_OK, "%s", "");
    return;
  }
  const Paradev__V1__EchoRequest *req = (const void *)m;
  Paradev__V1__EchoResponse resp = PARADEV__V1__ECHO_RESPONSE__INIT;
  resp.payload = req->payload;
  srv_call_write(c, &resp.base);
}

srv_method srv_m_echo_stream = {
    .path = "/paradev.v1.ParallelDevice/EchoStream",
    .kind = SRV_BIDI,
    .request = &paradev__v1__echo_request__descriptor,
    .on_message = srv_echo_stream_msg};
