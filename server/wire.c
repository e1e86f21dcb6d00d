/* Wire helpers: a byte-budget allocator for protobuf-c (which has no limit of
 * its own on what untrusted input makes it allocate), unpacking from and
 * packing into gRPC byte buffers. */
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdlib.h>

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
  size_t budget = b->left;
  ProtobufCMessage *m = protobuf_c_message_unpack(
      d, &b->alloc, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
  size_t len = GRPC_SLICE_LENGTH(all);
  grpc_slice_unref(all);
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

grpc_byte_buffer *srv_pack(const ProtobufCMessage *m) {
  size_t len = protobuf_c_message_get_packed_size(m);
  grpc_slice sl = grpc_slice_malloc(len);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}
