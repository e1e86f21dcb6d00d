/* libparadev: Upload (client streaming) and Download (server streaming) of
 * host values in chunks under the message limit.
 *
 * Upload packs each chunk while the previous one is being sent. Download
 * decodes chunk messages itself, straight from gRPC's slices into the
 * caller's buffer (one copy; protobuf-c would copy the bytes twice more). */
#include <grpc/byte_buffer_reader.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_int.h"
#include "common.h"

/* Bytes of a dense value of `rank` dims, or false on a negative dim or
 * overflow. */
static bool pdc_value_bytes(pd_dtype dt, const int64_t *dims, int rank,
                            uint64_t *out) {
  uint64_t n = pd_dtype_size(dt);
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 0) return false;
    if (__builtin_mul_overflow(n, (uint64_t)dims[i], &n)) return false;
  }
  *out = n;
  return true;
}

static pd_code pdc_check_shape(pd_dtype dtype, const int64_t *dims, int rank,
                               size_t bytes, const char *what, pd_status *st) {
  if (pd_dtype_size(dtype) == 0) {
    char names[128];
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s: dtype %d is not a valid dtype; expected one of %s",
                     what, (int)dtype, pdcom_dtype_list(names, sizeof(names)));
  }
  if (rank < 0 || rank > PD_MAX_RANK || (rank > 0 && !dims))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s: rank %d; expected 0 to %d with its dims", what, rank,
                     PD_MAX_RANK);
  uint64_t need;
  if (!pdc_value_bytes(dtype, dims, rank, &need))
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "%s: a negative dim, or an element count that overflows",
                     what);
  if (need != bytes)
    return pdc_error(
        st, PD_INVALID_ARGUMENT,
        "%s: %zu bytes given; a %s value of this shape holds %" PRIu64 " bytes",
        what, bytes, pd_dtype_name(dtype), need);
  return PD_OK;
}

/* --- Upload --------------------------------------------------------------------- */

static grpc_byte_buffer *pdc_pack_chunk(int component, uint64_t offset,
                                        const void *data, size_t len) {
  Paradev__V1__UploadChunk ch = PARADEV__V1__UPLOAD_CHUNK__INIT;
  ch.component = component;
  ch.offset = offset;
  ch.data.data = (uint8_t *)data;
  ch.data.len = len;
  Paradev__V1__UploadRequest r = PARADEV__V1__UPLOAD_REQUEST__INIT;
  r.item_case = PARADEV__V1__UPLOAD_REQUEST__ITEM_CHUNK;
  r.chunk = &ch;
  return pdc_pack(&r.base);
}

/* One Upload call in flight: the value, where the chunks have got to, the
 * messages being sent (out) and packed (next), and the batches pending. */
typedef struct pdc_up {
  pdc_call k;
  int ncomp;
  const void *const *data;
  const size_t *bytes;
  size_t chunk;
  int comp;     /* the component the next chunk comes from */
  uint64_t off; /* and its offset there */
  grpc_byte_buffer *out, *next, *recv;
  char t_status, t_send, t_final;
  int pending;
  bool status_done, send_ok, final_started;
} pdc_up;

/* The status batch, then the header. Initial metadata is asked for now,
 * with the status: gRPC delivers a trailers-only answer (an early refusal)
 * only once it was. */
static pd_code pdc_up_begin(pdc_up *u, Paradev__V1__UploadHeader *h,
                            pd_status *st) {
  grpc_op ops[2];
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &u->k.md_trailing;
  ops[0].data.recv_status_on_client.status = &u->k.status;
  ops[0].data.recv_status_on_client.status_details = &u->k.details;
  ops[0].data.recv_status_on_client.error_string = &u->k.error_string;
  ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[1].data.recv_initial_metadata.recv_initial_metadata = &u->k.md_initial;
  if (grpc_call_start_batch(u->k.call, ops, 2, &u->t_status, NULL) !=
      GRPC_CALL_OK)
    return pdc_error(st, PD_INTERNAL, "gRPC refused to start Upload");
  u->pending++;
  Paradev__V1__UploadRequest r = PARADEV__V1__UPLOAD_REQUEST__INIT;
  r.item_case = PARADEV__V1__UPLOAD_REQUEST__ITEM_HEADER;
  r.header = h;
  u->out = pdc_pack(&r.base);
  memset(ops, 0, sizeof(ops));
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  pdc_security_md(u->k.c, &ops[0]);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = u->out;
  if (grpc_call_start_batch(u->k.call, ops, 2, &u->t_send, NULL) ==
      GRPC_CALL_OK)
    u->pending++;
  else
    u->send_ok = false;
  return PD_OK;
}

/* Packs the next chunk, in order, while the current one goes. */
static void pdc_up_pack_next(pdc_up *u) {
  if (!u->send_ok || u->next) return;
  while (u->comp < u->ncomp && u->off >= u->bytes[u->comp]) {
    u->comp++;
    u->off = 0;
  }
  if (u->comp >= u->ncomp) return;
  size_t left = (size_t)(u->bytes[u->comp] - u->off);
  size_t len = left < u->chunk ? left : u->chunk;
  u->next = pdc_pack_chunk(u->comp, u->off,
                           (const char *)u->data[u->comp] + u->off, len);
  u->off += len;
}

/* A send completed: send the packed chunk, or once there is none close the
 * client's side and ask for the reply. A failed send means the call is
 * ending: its status will come. */
static void pdc_up_sent(pdc_up *u, bool success) {
  grpc_byte_buffer_destroy(u->out);
  u->out = NULL;
  if (!success || u->status_done) u->send_ok = false;
  grpc_op ops[2];
  memset(ops, 0, sizeof(ops));
  if (u->send_ok && u->next) {
    u->out = u->next;
    u->next = NULL;
    ops[0].op = GRPC_OP_SEND_MESSAGE;
    ops[0].data.send_message.send_message = u->out;
    if (grpc_call_start_batch(u->k.call, ops, 1, &u->t_send, NULL) ==
        GRPC_CALL_OK) {
      u->pending++;
    } else {
      u->send_ok = false;
      grpc_call_cancel(u->k.call, NULL);
    }
  } else if (u->send_ok && !u->final_started) {
    u->final_started = true;
    ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &u->recv;
    if (grpc_call_start_batch(u->k.call, ops, 2, &u->t_final, NULL) ==
        GRPC_CALL_OK)
      u->pending++;
  }
}

/* Drives the call's queue until no batch is pending. The status may come
 * first (an early refusal): then what is still pending is cancelled. */
static void pdc_up_pump(pdc_up *u) {
  for (;;) {
    pdc_up_pack_next(u);
    if (u->pending == 0) break;
    grpc_event ev = grpc_completion_queue_next(
        u->k.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) break;
    u->pending--;
    if (ev.tag == &u->t_status) {
      u->status_done = true;
      if (u->pending > 0) grpc_call_cancel(u->k.call, NULL);
    } else if (ev.tag == &u->t_send) {
      pdc_up_sent(u, ev.success != 0);
    }
  }
}

/* The call's status, then the reply's tensor info into *info (if given). */
static pd_code pdc_up_result(pd_session *s, pdc_up *u, pd_tensor_info *info,
                             pd_status *st) {
  if (!u->status_done)
    return pdc_error(st, PD_INTERNAL,
                     "Upload: the call ended without a status");
  PD_TRY(pdc_call_status(&u->k, st));
  pdc_session_touch(s);
  Paradev__V1__UploadResponse *resp =
      u->recv ? (Paradev__V1__UploadResponse *)pdc_unpack(
                    &paradev__v1__upload_response__descriptor, u->recv)
              : NULL;
  pd_code rc = PD_OK;
  pd_tensor_info ti;
  if (!resp || !pdc_info_from_pb(resp->tensor, &ti)) {
    rc = pdc_error(st, PD_INTERNAL, "Upload: the reply cannot be decoded");
  } else if (info) {
    *info = ti;
  }
  if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
  return rc;
}

/* Runs the Upload call on a `next` queue, so the daemon's status is seen even
 * while a send waits: a daemon that refuses the upload early (bad header,
 * quota) stops reading, and a send blocked on flow control would otherwise
 * wait for the deadline. */
static pd_code pdc_upload(pd_session *s, Paradev__V1__UploadHeader *h,
                          int ncomp, const void *const *data,
                          const size_t *bytes, pd_tensor_info *info,
                          const pd_call_options *call, pd_status *st) {
  size_t chunk = 0;
  PD_TRY(pdc_chunk_bytes(s->c, call, &chunk, st));
  h->session_token.data = s->token;
  h->session_token.len = s->token_len;
  int64_t timeout;
  pd_cancel *cancel;
  PD_TRY(pdc_call_opts(s->c, call, &timeout, &cancel, st));
  pdc_up u = {.ncomp = ncomp,
              .data = data,
              .bytes = bytes,
              .chunk = chunk,
              .send_ok = true};
  pd_code rc =
      pdc_call_start(&u.k, s->c, PDC_M_Upload, timeout, cancel, true, st);
  if (rc == PD_OK) rc = pdc_up_begin(&u, h, st);
  if (rc == PD_OK) {
    pdc_up_pump(&u);
    rc = pdc_up_result(s, &u, info, st);
  }
  if (u.out) grpc_byte_buffer_destroy(u.out);
  if (u.next) grpc_byte_buffer_destroy(u.next);
  if (u.recv) grpc_byte_buffer_destroy(u.recv);
  pdc_call_destroy(&u.k);
  return rc;
}

pd_code pd_upload_on(pd_session *s, const int32_t *devices, int n_devices,
                     uint64_t id, pd_dtype dtype, const int64_t *dims, int rank,
                     const void *data, size_t bytes, pd_layout layout,
                     pd_tensor_info *info, const pd_call_options *call,
                     pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  PD_TRY(pdc_check_devices(devices, n_devices, "pd_upload", st));
  if (layout.kind != PD_LAYOUT_UNSPECIFIED &&
      layout.kind != PD_LAYOUT_MIRRORED && layout.kind != PD_LAYOUT_SHARDED)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_upload takes layout MIRRORED or SHARDED; got kind %d "
                     "(PER_COMPONENT: use pd_upload_components)",
                     (int)layout.kind);
  PD_TRY(pdc_check_shape(dtype, dims, rank, bytes, "pd_upload", st));
  if (bytes && !data)
    return pdc_error(st, PD_INVALID_ARGUMENT, "pd_upload: data is NULL");
  Paradev__V1__Shape shape = PARADEV__V1__SHAPE__INIT;
  shape.n_dims = (size_t)rank;
  shape.dims = (int64_t *)dims;
  Paradev__V1__Layout lay = PARADEV__V1__LAYOUT__INIT;
  lay.kind = (Paradev__V1__LayoutKind)layout.kind;
  lay.axis = layout.axis;
  Paradev__V1__UploadHeader h = PARADEV__V1__UPLOAD_HEADER__INIT;
  h.id = id;
  h.dtype = (Paradev__V1__DType)dtype;
  h.shape = &shape;
  h.layout = &lay;
  h.n_devices = (size_t)n_devices;
  h.devices = n_devices ? (int32_t *)devices : NULL;
  return pdc_upload(s, &h, 1, &data, &bytes, info, call, st);
}

pd_code pd_upload(pd_session *s, uint64_t id, pd_dtype dtype,
                  const int64_t *dims, int rank, const void *data, size_t bytes,
                  pd_layout layout, pd_tensor_info *info,
                  const pd_call_options *call, pd_status *st) {
  return pd_upload_on(s, NULL, 0, id, dtype, dims, rank, data, bytes, layout,
                      info, call, st);
}

pd_code pd_upload_components_on(pd_session *s, const int32_t *devices,
                                int n_devices, uint64_t id, pd_dtype dtype,
                                int num_components, const int64_t *const *dims,
                                const int *ranks, const void *const *data,
                                const size_t *bytes, pd_tensor_info *info,
                                const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  PD_TRY(pdc_check_devices(devices, n_devices, "pd_upload_components", st));
  int want = n_devices ? n_devices : s->num_devices;
  if (num_components != want || !dims || !ranks || !data || !bytes)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_upload_components: %d components; the tensor's "
                     "device set (%s) has %d devices (and dims, ranks, data, "
                     "bytes must be arrays of that many)",
                     num_components,
                     n_devices ? "n_devices" : "the session's default", want);
  Paradev__V1__Shape shapes[PD_MAX_DEVICES];
  Paradev__V1__Shape *sp[PD_MAX_DEVICES];
  for (int i = 0; i < num_components; i++) {
    char what[64];
    snprintf(what, sizeof(what), "pd_upload_components: component %d", i);
    PD_TRY(pdc_check_shape(dtype, dims[i], ranks[i], bytes[i], what, st));
    if (bytes[i] && !data[i])
      return pdc_error(st, PD_INVALID_ARGUMENT, "%s: data is NULL", what);
    paradev__v1__shape__init(&shapes[i]);
    shapes[i].n_dims = (size_t)ranks[i];
    shapes[i].dims = (int64_t *)dims[i];
    sp[i] = &shapes[i];
  }
  Paradev__V1__Layout lay = PARADEV__V1__LAYOUT__INIT;
  lay.kind = PARADEV__V1__LAYOUT_KIND__LAYOUT_PER_COMPONENT;
  Paradev__V1__UploadHeader h = PARADEV__V1__UPLOAD_HEADER__INIT;
  h.id = id;
  h.dtype = (Paradev__V1__DType)dtype;
  h.layout = &lay;
  h.n_component_shapes = (size_t)num_components;
  h.component_shapes = sp;
  h.n_devices = (size_t)n_devices;
  h.devices = n_devices ? (int32_t *)devices : NULL;
  return pdc_upload(s, &h, num_components, data, bytes, info, call, st);
}

pd_code pd_upload_components(pd_session *s, uint64_t id, pd_dtype dtype,
                             int num_components, const int64_t *const *dims,
                             const int *ranks, const void *const *data,
                             const size_t *bytes, pd_tensor_info *info,
                             const pd_call_options *call, pd_status *st) {
  return pd_upload_components_on(s, NULL, 0, id, dtype, num_components, dims,
                                 ranks, data, bytes, info, call, st);
}

/* --- Download ---------------------------------------------------------------------- */

/* A reader over the slices of a received message. */
typedef struct pdc_rd {
  const grpc_slice *sl;
  size_t n, i, off;
  uint64_t pos; /* bytes consumed */
} pdc_rd;

static bool pdc_rd_byte(pdc_rd *r, uint8_t *b) {
  while (r->i < r->n && r->off == GRPC_SLICE_LENGTH(r->sl[r->i])) {
    r->i++;
    r->off = 0;
  }
  if (r->i == r->n) return false;
  *b = GRPC_SLICE_START_PTR(r->sl[r->i])[r->off++];
  r->pos++;
  return true;
}

static bool pdc_rd_varint(pdc_rd *r, uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b;
    if (!pdc_rd_byte(r, &b)) return false;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return true;
    }
  }
  return false;
}

/* Copies (dst != NULL) or skips n bytes. */
static bool pdc_rd_take(pdc_rd *r, void *dst, uint64_t n) {
  char *d = dst;
  while (n > 0) {
    if (r->i == r->n) return false;
    size_t avail = GRPC_SLICE_LENGTH(r->sl[r->i]) - r->off;
    if (avail == 0) {
      r->i++;
      r->off = 0;
      continue;
    }
    size_t k = n < avail ? (size_t)n : avail;
    if (d) {
      memcpy(d, GRPC_SLICE_START_PTR(r->sl[r->i]) + r->off, k);
      d += k;
    }
    r->off += k;
    r->pos += k;
    n -= k;
  }
  return true;
}

static bool pdc_rd_skip_field(pdc_rd *r, uint64_t key) {
  uint64_t v;
  switch (key & 7) {
    case 0: return pdc_rd_varint(r, &v);
    case 1: return pdc_rd_take(r, NULL, 8);
    case 2: return pdc_rd_varint(r, &v) && pdc_rd_take(r, NULL, v);
    case 5: return pdc_rd_take(r, NULL, 4);
    default: return false;
  }
}

typedef struct pdc_dl {
  int ncomp;
  void *const *data;
  const size_t *cap;
  bool have_header;
  uint64_t expected[PD_MAX_DEVICES];
  uint64_t received[PD_MAX_DEVICES];
  pd_dtype dtype;
  pd_tensor_info shapes[PD_MAX_DEVICES];
} pdc_dl;

static pd_code pdc_dl_header(pdc_dl *d, grpc_byte_buffer *bb, pd_status *st) {
  Paradev__V1__DownloadResponse *m =
      (Paradev__V1__DownloadResponse *)pdc_unpack(
          &paradev__v1__download_response__descriptor, bb);
  pd_code rc = PD_OK;
  if (!m || m->item_case != PARADEV__V1__DOWNLOAD_RESPONSE__ITEM_HEADER) {
    rc = pdc_error(st, PD_INTERNAL,
                   "Download: the first message is not a header");
    goto out;
  }
  const Paradev__V1__DownloadHeader *h = m->header;
  if (h->n_host_shapes != (size_t)d->ncomp) {
    if (d->ncomp > 1 || h->n_host_shapes > 1)
      rc = pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_download_components: the tensor has %zu components "
                     "(one per device of its set); %d buffers were given",
                     h->n_host_shapes, d->ncomp);
    else
      rc = pdc_error(st, PD_INTERNAL, "Download: %zu host shapes; expected %d",
                     h->n_host_shapes, d->ncomp);
    goto out;
  }
  d->dtype = (pd_dtype)h->dtype;
  for (int i = 0; i < d->ncomp; i++) {
    pd_tensor_info *t = &d->shapes[i];
    if (!pdc_shape_from_pb(h->host_shapes[i], t) ||
        !pdc_value_bytes(d->dtype, t->dims, t->rank, &d->expected[i]) ||
        pd_dtype_size(d->dtype) == 0) {
      rc = pdc_error(st, PD_INTERNAL,
                     "Download: the header has an invalid shape or dtype");
      goto out;
    }
    t->dtype = d->dtype;
    if (d->expected[i] > d->cap[i]) {
      char dims[200];
      size_t n = 0;
      dims[0] = '\0';
      for (int k = 0; k < t->rank && n < sizeof(dims) - 24; k++)
        n += (size_t)snprintf(dims + n, sizeof(dims) - n, "%s%" PRId64,
                              k ? ", " : "", t->dims[k]);
      rc = pdc_error(st, PD_OUT_OF_RANGE,
                     "Download: %s[%s] needs %" PRIu64
                     " bytes; the buffer%s holds %zu",
                     pd_dtype_name(d->dtype), dims, d->expected[i],
                     d->ncomp > 1 ? " of that component" : "", d->cap[i]);
      goto out;
    }
  }
  d->have_header = true;
out:
  if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
  return rc;
}

/* Decodes a chunk message (DownloadResponse.chunk = field 2) into the
 * caller's buffers. */
static pd_code pdc_dl_chunk(pdc_dl *d, grpc_byte_buffer *bb, pd_status *st) {
  grpc_slice flat = grpc_empty_slice();
  pdc_rd r = {NULL, 0, 0, 0, 0};
  if (bb->type == GRPC_BB_RAW &&
      bb->data.raw.compression == GRPC_COMPRESS_NONE) {
    r.sl = bb->data.raw.slice_buffer.slices;
    r.n = bb->data.raw.slice_buffer.count;
  } else {
    grpc_byte_buffer_reader br;
    if (!grpc_byte_buffer_reader_init(&br, bb))
      return pdc_error(st, PD_INTERNAL, "Download: cannot read a message");
    flat = grpc_byte_buffer_reader_readall(&br);
    grpc_byte_buffer_reader_destroy(&br);
    r.sl = &flat;
    r.n = 1;
  }
  pd_code rc = PD_OK;
  bool seen = false;
  uint64_t key, len;
  while (pdc_rd_varint(&r, &key)) {
    if (key != ((2 << 3) | 2)) {
      if (key == ((1 << 3) | 2)) {
        rc = pdc_error(st, PD_INTERNAL, "Download: a second header");
        goto out;
      }
      if (!pdc_rd_skip_field(&r, key)) goto bad;
      continue;
    }
    if (!pdc_rd_varint(&r, &len)) goto bad;
    /* Inside the chunk: component (1), offset (2), data (3) in any order. */
    uint64_t component = 0, offset = 0, dlen = 0;
    pdc_rd data_at = r, end = r;
    bool have_data = false;
    if (!pdc_rd_take(&end, NULL, len)) goto bad;
    uint64_t start = r.pos;
    while (r.pos - start < len) {
      uint64_t k, v;
      if (!pdc_rd_varint(&r, &k)) goto bad;
      if (k == ((1 << 3) | 0) || k == ((2 << 3) | 0)) {
        if (!pdc_rd_varint(&r, &v)) goto bad;
        if (k >> 3 == 1)
          component = v;
        else
          offset = v;
      } else if (k == ((3 << 3) | 2)) {
        if (!pdc_rd_varint(&r, &dlen)) goto bad;
        data_at = r;
        have_data = true;
        if (!pdc_rd_take(&r, NULL, dlen)) goto bad;
      } else if (!pdc_rd_skip_field(&r, k)) {
        goto bad;
      }
    }
    if (r.pos - start != len) goto bad;
    if (component >= (uint64_t)d->ncomp || offset != d->received[component] ||
        dlen > d->expected[component] - offset) {
      rc = pdc_error(st, PD_INTERNAL,
                     "Download: a chunk for component %" PRIu64
                     " at offset %" PRIu64 " of %" PRIu64
                     " bytes does not follow the previous one",
                     component, offset, dlen);
      goto out;
    }
    if (have_data && dlen &&
        !pdc_rd_take(&data_at, (char *)d->data[component] + offset, dlen))
      goto bad;
    d->received[component] += dlen;
    seen = true;
    r = end;
  }
  if (!seen) goto bad;
  goto out;
bad:
  rc = pdc_error(st, PD_INTERNAL, "Download: a malformed chunk message");
out:
  grpc_slice_unref(flat);
  return rc;
}

static pd_code pdc_download(pd_session *s, uint64_t id, pd_layout layout,
                            int ncomp, void *const *data, const size_t *cap,
                            pd_tensor_info *infos, size_t *total,
                            const pd_call_options *call, pd_status *st) {
  size_t chunk = 0;
  PD_TRY(pdc_chunk_bytes(s->c, call, &chunk, st));
  pd_code rc = PD_OK;
  Paradev__V1__Layout lay = PARADEV__V1__LAYOUT__INIT;
  lay.kind = (Paradev__V1__LayoutKind)layout.kind;
  lay.axis = layout.axis;
  lay.component = layout.component;
  Paradev__V1__DownloadRequest req = PARADEV__V1__DOWNLOAD_REQUEST__INIT;
  req.session_token.data = s->token;
  req.session_token.len = s->token_len;
  req.id = id;
  req.layout = &lay;
  req.chunk_bytes = chunk;
  int64_t timeout;
  pd_cancel *cancel;
  PD_TRY(pdc_call_opts(s->c, call, &timeout, &cancel, st));
  pdc_dl *d = calloc(1, sizeof(*d));
  if (!d) return pdc_error(st, PD_RESOURCE_EXHAUSTED, "out of host memory");
  d->ncomp = ncomp;
  d->data = data;
  d->cap = cap;
  pdc_call k;
  grpc_byte_buffer *send = NULL, *recv = NULL;
  rc = pdc_call_start(&k, s->c, PDC_M_Download, timeout, cancel, false, st);
  if (rc != PD_OK) goto done;
  send = pdc_pack(&req.base);
  bool alive = pdc_call_request(&k, send, NULL);
  grpc_op ops[1];
  pd_code local = PD_OK;
  pd_status lst;
  while (alive) {
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_RECV_MESSAGE;
    ops[0].data.recv_message.recv_message = &recv;
    if (!pdc_call_batch(&k, ops, 1, &k.md_initial) || !recv) break;
    local = d->have_header ? pdc_dl_chunk(d, recv, &lst)
                           : pdc_dl_header(d, recv, &lst);
    grpc_byte_buffer_destroy(recv);
    recv = NULL;
    if (local != PD_OK) {
      grpc_call_cancel(k.call, NULL);
      break;
    }
  }
  rc = pdc_call_finish(&k, st);
  if (local != PD_OK) {
    /* Our own reason beats the CANCELLED it caused. */
    rc = pdc_error(st, local, "%s", lst.msg);
    goto done;
  }
  if (rc != PD_OK) goto done;
  pdc_session_touch(s);
  uint64_t sum = 0;
  for (int i = 0; i < ncomp; i++) {
    if (!d->have_header || d->received[i] != d->expected[i]) {
      rc = pdc_error(st, PD_DATA_LOSS,
                     "Download: the stream ended after %" PRIu64 " of %" PRIu64
                     " bytes of component %d",
                     d->received[i], d->expected[i], i);
      goto done;
    }
    sum += d->received[i];
  }
  for (int i = 0; infos && i < ncomp; i++) {
    infos[i] = d->shapes[i];
    infos[i].id = id;
  }
  if (total) *total = (size_t)sum;
  pdc_ok(st);
done:
  if (send) grpc_byte_buffer_destroy(send);
  if (recv) grpc_byte_buffer_destroy(recv);
  pdc_call_destroy(&k);
  free(d);
  return rc;
}

pd_code pd_download(pd_session *s, uint64_t id, pd_layout layout, void *data,
                    size_t capacity, pd_tensor_info *info, size_t *bytes_out,
                    const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  if (layout.kind == PD_LAYOUT_PER_COMPONENT)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_download takes one host value; for layout "
                     "PER_COMPONENT use pd_download_components");
  if (capacity && !data)
    return pdc_error(st, PD_INVALID_ARGUMENT, "pd_download: data is NULL");
  void *const bufs[1] = {data};
  return pdc_download(s, id, layout, 1, bufs, &capacity, info, bytes_out, call,
                      st);
}

pd_code pd_download_components(pd_session *s, uint64_t id, int num_components,
                               void *const *data, const size_t *capacity,
                               pd_tensor_info *infos,
                               const pd_call_options *call, pd_status *st) {
  PD_TRY(pdc_session_check(s, st));
  /* The tensor's component count is its device set's size, which the
   * daemon's header gives: pdc_dl_header refuses a count that differs. */
  if (num_components < 1 || num_components > PD_MAX_DEVICES || !data ||
      !capacity)
    return pdc_error(st, PD_INVALID_ARGUMENT,
                     "pd_download_components: %d components; expected the "
                     "tensor's component count (its device set's size, 1 to "
                     "%d; the session's default set has %d), with data and "
                     "capacity arrays of that many",
                     num_components, PD_MAX_DEVICES, s->num_devices);
  for (int i = 0; i < num_components; i++)
    if (capacity[i] && !data[i])
      return pdc_error(st, PD_INVALID_ARGUMENT,
                       "pd_download_components: data[%d] is NULL", i);
  pd_layout l = {PD_LAYOUT_PER_COMPONENT, 0, 0};
  return pdc_download(s, id, l, num_components, data, capacity, infos, NULL,
                      call, st);
}
