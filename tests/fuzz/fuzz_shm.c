/* libFuzzer target: the checks paradevd makes of a shared memory region's
 * client-written bytes (server/shm_header.c): the 64-byte header against a
 * session's token, a transfer's data offset and size against the region,
 * and the key's form. Each is compared with a reference written here from
 * the format's definition (server/shm_int.h, README "Shared-memory
 * transfers"), so a check that passes what it should refuse is a finding
 * as much as a crash is.
 *
 * Input: 64 header bytes, 1 byte of token length, 8 bytes each of region
 * size, offset and size to transfer (little-endian), then the key's bytes;
 * the token is the header's bytes 8.. for odd lengths (a header that should
 * match, unless the rest differs) and the key's bytes for even ones. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shm_int.h"

static uint64_t fz_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static bool fz_header_ref(const uint8_t *h, const uint8_t *tok, size_t len) {
  if (len > SRV_SHM_HEADER_BYTES - 8) return false;
  if (memcmp(h, "PDSHM", 5) != 0 || h[5] != SRV_SHM_VERSION) return false;
  if ((size_t)(h[6] | h[7] << 8) != len) return false;
  if (len && memcmp(h + 8, tok, len) != 0) return false;
  for (size_t i = 8 + len; i < SRV_SHM_HEADER_BYTES; i++)
    if (h[i]) return false;
  return true;
}

static bool fz_key_ref(const char *k) {
  size_t n = strlen(k);
  if (n < 2 || n > 1 + SRV_SHM_KEY_MAX || k[0] != '/') return false;
  if (strcmp(k, "/.") == 0 || strcmp(k, "/..") == 0) return false;
  for (size_t i = 1; i < n; i++)
    if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                "0123456789._-",
                k[i]))
      return false;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < SRV_SHM_HEADER_BYTES + 1 + 24) return 0;
  uint8_t hdr[SRV_SHM_HEADER_BYTES];
  memcpy(hdr, data, sizeof hdr);
  size_t len = data[SRV_SHM_HEADER_BYTES];
  const uint8_t *p = data + SRV_SHM_HEADER_BYTES + 1;
  uint64_t region = fz_le64(p), offset = fz_le64(p + 8),
           bytes = fz_le64(p + 16);
  const uint8_t *rest = p + 24;
  size_t nrest = size - (size_t)(rest - data);
  /* The token: from the header itself (odd) or from the rest (even). */
  uint8_t tok[256];
  if (len & 1) {
    size_t n = len < SRV_SHM_HEADER_BYTES - 8 ? len : SRV_SHM_HEADER_BYTES - 8;
    memset(tok, 0, sizeof tok);
    memcpy(tok, hdr + 8, n);
  } else {
    for (size_t i = 0; i < len; i++) tok[i] = nrest ? rest[i % nrest] : 0;
  }
  if (srv_shm_header_ok(hdr, tok, len) != fz_header_ref(hdr, tok, len)) abort();
  /* The range: in bounds exactly when it fits the data (unsigned 128-bit
   * arithmetic, no wrap). */
  dev_status st = DEV_STATUS_INIT;
  size_t rsize = (size_t)region;
  pd_code rc = srv_shm_check_range(rsize, "r", offset, bytes, &st);
  unsigned __int128 data_bytes =
      rsize > SRV_SHM_HEADER_BYTES ? rsize - SRV_SHM_HEADER_BYTES : 0;
  bool fits = (unsigned __int128)offset + bytes <= data_bytes;
  if ((rc == PD_OK) != fits) abort();
  if (rc != PD_OK && (rc != PD_OUT_OF_RANGE || !st.msg[0])) abort();
  /* The key, as a C string (protobuf-c's strings end at a NUL, which
   * srv_unpack refuses before any check runs). */
  char key[512];
  size_t kn = nrest < sizeof key - 1 ? nrest : sizeof key - 1;
  memcpy(key, rest, kn);
  key[kn] = '\0';
  if (srv_shm_key_ok(key) != fz_key_ref(key)) abort();
  return 0;
}
