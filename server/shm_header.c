/* The checks of a shared memory region's client-written bytes that need no
 * daemon (shm_int.h): the key's form, the header a session's region
 * carries, and a transfer's range against the region. Pure functions, so
 * tests/fuzz/fuzz_shm.c drives them on hostile bytes. */
#include <inttypes.h>
#include <string.h>

#include "shm_int.h"

bool srv_shm_key_ok(const char *key) {
  if (!key || key[0] != '/') return false;
  size_t n = strlen(key + 1);
  if (n == 0 || n > SRV_SHM_KEY_MAX) return false;
  if (strcmp(key, "/.") == 0 || strcmp(key, "/..") == 0) return false;
  for (size_t i = 1; key[i]; i++) {
    char ch = key[i];
    bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
              (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

bool srv_shm_header_ok(const uint8_t got[SRV_SHM_HEADER_BYTES],
                       const uint8_t *token, size_t len) {
  /* A token that does not fit after the 8 bytes of magic, version and
   * length has no header (tokens are far shorter: the scheduler's). */
  if (len > SRV_SHM_TOKEN_MAX || (len && !token)) return false;
  uint8_t want[SRV_SHM_HEADER_BYTES];
  memset(want, 0, sizeof want);
  memcpy(want, "PDSHM", 5);
  want[5] = SRV_SHM_VERSION;
  want[6] = (uint8_t)(len & 0xff);
  want[7] = (uint8_t)(len >> 8);
  if (len) memcpy(want + 8, token, len);
  /* Every byte compared, whatever differs first. */
  volatile uint8_t d = 0;
  for (size_t i = 0; i < SRV_SHM_HEADER_BYTES; i++)
    d |= (uint8_t)(got[i] ^ want[i]);
  return d == 0;
}

pd_code srv_shm_check_range(size_t size, const char *name, uint64_t offset,
                            uint64_t bytes, dev_status *st) {
  uint64_t data = size > SRV_SHM_HEADER_BYTES ? size - SRV_SHM_HEADER_BYTES : 0;
  if (offset > data || bytes > data - offset)
    return dev_error(st, PD_OUT_OF_RANGE,
                     "%" PRIu64 " bytes at data offset %" PRIu64
                     " run past the end of shared memory region \"%.128s\", "
                     "which holds %" PRIu64
                     " bytes of data (byte_size %zu less the %d-byte header)",
                     bytes, offset, name ? name : "", data, size,
                     SRV_SHM_HEADER_BYTES);
  return PD_OK;
}
