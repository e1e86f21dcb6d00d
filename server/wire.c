/* Wire helpers: a byte-budget allocator for protobuf-c (which has no limit of
 * its own on what untrusted input makes it allocate), unpacking from and
 * packing into gRPC byte buffers, and the refusal of NUL bytes in strings
 * (protobuf-c would silently cut such a string at its first NUL: a path
 * "a.npy\0../x" would reach the storage roots as "a.npy"). */
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* Each block carries its size in front so that free can give it back. */
typedef union srv_block_hdr {
  size_t size;
  max_align_t align;
} srv_block_hdr;

static void *srv_budget_alloc(void *data, size_t size) {
  srv_budget *b = data;
  size_t need = size + sizeof(srv_block_hdr);
  if (need < size || need > b->left) {
    b->exceeded = true;
    return NULL;
  }
  srv_block_hdr *h = malloc(need);
  if (!h) {
    b->exceeded = true;
    return NULL;
  }
  h->size = need;
  b->left -= need;
  return h + 1;
}

static void srv_budget_free(void *data, void *ptr) {
  if (!ptr) return;
  srv_budget *b = data;
  srv_block_hdr *h = (srv_block_hdr *)ptr - 1;
  b->left += h->size;
  free(h);
}

void srv_budget_init(srv_budget *b, size_t bytes) {
  b->alloc.alloc = srv_budget_alloc;
  b->alloc.free = srv_budget_free;
  b->alloc.allocator_data = b;
  b->left = bytes;
  b->exceeded = false;
}

/* Reads a varint at *p (below end); false past the end or over 10 bytes. */
static bool srv_wire_varint(const uint8_t **p, const uint8_t *end,
                            uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

/* The name of the first string field of message `d` (at any depth up to 16)
 * whose wire bytes hold a NUL, or NULL. The bytes decoded already, so a
 * malformed tail only ends the walk. */
static const char *srv_wire_nul(const ProtobufCMessageDescriptor *d,
                                const uint8_t *p, const uint8_t *end,
                                int depth) {
  while (p < end) {
    uint64_t key = 0, len = 0;
    if (!srv_wire_varint(&p, end, &key)) return NULL;
    switch (key & 7) {
      case 0:
        if (!srv_wire_varint(&p, end, &len)) return NULL;
        continue;
      case 1:
        if (end - p < 8) return NULL;
        p += 8;
        continue;
      case 5:
        if (end - p < 4) return NULL;
        p += 4;
        continue;
      case 2: break;
      default: return NULL; /* groups: not in proto3 */
    }
    if (!srv_wire_varint(&p, end, &len) || len > (uint64_t)(end - p))
      return NULL;
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
    if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, len))
      return f->name;
    if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 16) {
      const char *bad = srv_wire_nul(f->descriptor, p, p + len, depth + 1);
      if (bad) return bad;
    }
    p += len;
  }
  return NULL;
}

size_t srv_budget_bytes(size_t len) {
  size_t extra = len > SIZE_MAX / 15 ? SIZE_MAX : len * 15;
  if (extra > ((size_t)256 << 20)) extra = (size_t)256 << 20;
  return len + extra + ((size_t)1 << 20);
}

ProtobufCMessage *srv_unpack_bytes(const ProtobufCMessageDescriptor *d,
                                   const uint8_t *data, size_t len,
                                   srv_budget *b, dev_status *st) {
  size_t budget = b->left;
  ProtobufCMessage *m = protobuf_c_message_unpack(d, &b->alloc, len, data);
  const char *nul = m ? srv_wire_nul(d, data, data + len, 0) : NULL;
  if (nul) {
    protobuf_c_message_free_unpacked(m, &b->alloc);
    dev_error(st, PD_INVALID_ARGUMENT,
              "%s: the string field '%s' holds a NUL byte; strings must not "
              "contain NUL",
              d->name, nul);
    return NULL;
  }
  if (!m) {
    if (b->exceeded)
      dev_error(st, PD_RESOURCE_EXHAUSTED,
                "a %s of %zu bytes needs more than its decoding budget of "
                "%zu bytes (too many repeated elements?)",
                d->name, len, budget);
    else
      dev_error(st, PD_INVALID_ARGUMENT,
                "malformed %s: %zu bytes that do not decode as "
                "paradev/v1/paradev.proto says",
                d->name, len);
  }
  return m;
}

ProtobufCMessage *srv_unpack(const ProtobufCMessageDescriptor *d,
                             grpc_byte_buffer *bb, srv_budget *b,
                             dev_status *st) {
  grpc_byte_buffer_reader rd;
  if (!grpc_byte_buffer_reader_init(&rd, bb)) {
    dev_error(st, PD_INVALID_ARGUMENT,
              "cannot read the request bytes (compressed with an unknown "
              "algorithm?)");
    return NULL;
  }
  grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
  grpc_byte_buffer_reader_destroy(&rd);
  ProtobufCMessage *m = srv_unpack_bytes(d, GRPC_SLICE_START_PTR(all),
                                         GRPC_SLICE_LENGTH(all), b, st);
  grpc_slice_unref(all);
  return m;
}

grpc_byte_buffer *srv_pack(const ProtobufCMessage *m) {
  size_t len = protobuf_c_message_get_packed_size(m);
  grpc_slice sl = grpc_slice_malloc(len);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}
