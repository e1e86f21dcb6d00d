/* libFuzzer target: the checkpoint readers of storage/ on hostile files:
 * the safetensors header (JSON, offsets, tiling), the .npy header dict,
 * and the .npz zip (end of central directory, zip64, members, deflate,
 * CRC), through the path a LoadTensors takes (stg_file_open beneath a
 * storage root, stg_index_read, then stg_entry_read of each tensor's
 * value, inflating and transposing), plus stg__npy_parse on bytes alone.
 *
 * Input: the first byte picks the format and the file's name (0 auto by
 * magic as "x.bin", 1 safetensors "x.safetensors", 2 .npy "x.npy", 3 .npz
 * "x.npz"; 4 the .npy header parser on the bytes, no file); the rest is the
 * file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>

#include "format_int.h"
#include "storage.h"

#define FZ_READ_MAX ((uint64_t)1 << 20) /* whole values up to this size */

static char fz_dir[64] = "/tmp/paradev-fuzz-ckpt.XXXXXX";
static stg_roots *fz_roots;
static stg_cache *fz_cache;

static void fz_init(void) {
  if (!mkdtemp(fz_dir)) abort();
  const char *root = fz_dir;
  dev_status st = DEV_STATUS_INIT;
  /* No cache: the same file is rewritten at every run, within the mtime's
   * granularity, so cached blocks could outlive their bytes. */
  stg_cache_config cfg = {STG_CACHE_CONFIG_STRUCT_SIZE, 1 << 16, 0, 0, 5, 0};
  if (stg_cache_create(&cfg, &fz_cache, &st) != PD_OK ||
      stg_roots_create(&root, 1, &fz_roots, &st) != PD_OK) {
    fprintf(stderr, "fuzz_checkpoint: %s\n", st.msg);
    abort();
  }
}

static void fz_npy(const uint8_t *data, size_t size) {
  stg_npy_header h;
  uint64_t need = 0;
  dev_status st = DEV_STATUS_INIT;
  pd_code rc = stg__npy_parse(data, size, "x.npy", &h, &need, &st);
  if (rc == PD_OUT_OF_RANGE && need <= size) abort(); /* asks for more */
  if (rc != PD_OK && rc != PD_OUT_OF_RANGE && !st.msg[0]) abort();
  if (rc == PD_OK && h.header_bytes > size) abort();
}

/* Reads what a load would of each entry: whole values up to FZ_READ_MAX,
 * the last 4 KiB of a random-access one beyond; each into a buffer of
 * exactly that size, so that ASan sees a byte written past it. */
static void fz_read_entries(stg_file *f, const stg_index *ix) {
  for (int i = 0; i < ix->n && i < 64; i++) {
    const stg_entry *e = &ix->entries[i];
    dev_status st = DEV_STATUS_INIT;
    uint64_t off = 0, len = e->bytes;
    if (len > FZ_READ_MAX) {
      if (!stg_entry_random_access(e)) continue;
      off = len - 4096;
      len = 4096;
    }
    uint8_t *buf = malloc(len ? (size_t)len : 1);
    if (!buf) abort();
    stg_entry_read(f, e, off, buf, (size_t)len, &st);
    free(buf);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const names[] = {"x.bin", "x.safetensors", "x.npy",
                                      "x.npz"};
  static const stg_format formats[] = {STG_FORMAT_AUTO, STG_FORMAT_SAFETENSORS,
                                       STG_FORMAT_NPY, STG_FORMAT_NPZ};
  if (size < 1) return 0;
  unsigned mode = data[0] % 5;
  data++;
  size--;
  if (mode == 4) {
    fz_npy(data, size);
    return 0;
  }
  if (!fz_roots) fz_init();
  char path[128];
  snprintf(path, sizeof path, "%s/%s", fz_dir, names[mode]);
  /* Rewritten in place and cut to size, never truncated to 0 first: ext4
   * flushes a file truncated to 0 when it is closed (auto_da_alloc), which
   * would make every run wait for the disk. */
  int fd = open(path, O_WRONLY | O_CREAT, 0600);
  if (fd < 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size) ||
      ftruncate(fd, (off_t)size) != 0)
    abort();
  close(fd);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (stg_file_open(fz_cache, fz_roots, path, &f, &st) != PD_OK) abort();
  stg_index *ix = NULL;
  pd_code rc = stg_index_read(f, formats[mode], &ix, &st);
  if (rc == PD_OK) {
    fz_read_entries(f, ix);
  } else {
    /* Every refusal names the file. */
    if (ix || !strstr(st.msg, names[mode])) abort();
  }
  stg_index_free(ix);
  stg_file_close(f);
  return 0;
}
