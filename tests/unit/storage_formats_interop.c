/* The C half of unit.storage_formats_interop (storage_formats_interop.py
 * runs it): reads every reference file that NumPy and the safetensors
 * package wrote into DIR, as DIR/manifest.tsv lists them, through
 * stg_index_read / stg_entry_read, and compares each value bit-exactly
 * with the C-order little-endian bytes NumPy reported (DIR/<n>.bin); then
 * writes every value back with stg_write_safetensors (DIR/out/all.safetensors,
 * tensors t0, t1, ... in manifest order, metadata writer=paradev) and
 * stg_write_npy (DIR/out/t<i>.npy; not bfloat16, which NumPy lacks), for
 * the script to read back with the reference tools.
 *
 * manifest.tsv lines:  FILE \t ENTRY \t DTYPE \t D0,D1,... \t BIN
 *                      #count \t FILE \t N   (the file's index has N entries)
 * usage: storage_formats_interop DIR */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "storage.h"

#define MAX_ITEMS 512

typedef struct item {
  char file[512], entry[256], bin[512];
  pd_dtype dtype;
  dev_shape shape;
  unsigned char *value; /* as read */
  uint64_t bytes;
} item;

static const char *dir;
static item items[MAX_ITEMS];
static int n_items;
static stg_cache *cache;
static stg_roots *roots;

static unsigned char *slurp(const char *path, uint64_t *n) {
  FILE *fp = fopen(path, "rb");
  if (!fp) fail_msg("cannot open %s", path);
  fseek(fp, 0, SEEK_END);
  long len = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)len, fp), (size_t)len);
  fclose(fp);
  *n = (uint64_t)len;
  return b;
}

static stg_file *open_in_dir(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  stg_file *f = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (stg_file_open(cache, roots, path, &f, &st) != PD_OK)
    fail_msg("stg_file_open %s: %s", path, st.msg);
  return f;
}

static void check_count(const char *file, int want) {
  stg_file *f = open_in_dir(file);
  stg_index *ix = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (stg_index_read(f, STG_FORMAT_AUTO, &ix, &st) != PD_OK)
    fail_msg("%s: %s", file, st.msg);
  if (ix->n != want)
    fail_msg("%s: %d entries in the index; NumPy/safetensors wrote %d", file,
             ix->n, want);
  stg_index_free(ix);
  stg_file_close(f);
}

/* Reads item `it`'s value whole, and in three uneven parts when the entry
 * is random-access, and compares both with the .bin NumPy wrote. */
static void check_item(item *it) {
  stg_file *f = open_in_dir(it->file);
  stg_index *ix = NULL;
  dev_status st = DEV_STATUS_INIT;
  if (stg_index_read(f, STG_FORMAT_AUTO, &ix, &st) != PD_OK)
    fail_msg("%s: %s", it->file, st.msg);
  const stg_entry *e = stg_index_find(ix, it->entry);
  if (!e) fail_msg("%s: no entry \"%s\"", it->file, it->entry);
  char a[160], b[160];
  if (e->dtype != it->dtype || !dev_shape_equal(&e->shape, &it->shape))
    fail_msg("%s \"%s\": %s %s; NumPy says %s %s", it->file, it->entry,
             pd_dtype_name(e->dtype), dev_shape_str(&e->shape, a, sizeof a),
             pd_dtype_name(it->dtype), dev_shape_str(&it->shape, b, sizeof b));
  char bin[1024];
  snprintf(bin, sizeof bin, "%s/%s", dir, it->bin);
  uint64_t n;
  unsigned char *want = slurp(bin, &n);
  if (n != e->bytes)
    fail_msg("%s \"%s\": %llu bytes; NumPy's value has %llu", it->file,
             it->entry, (unsigned long long)e->bytes, (unsigned long long)n);
  unsigned char *got = malloc(n ? n : 1);
  assert_non_null(got);
  if (stg_entry_read(f, e, 0, got, n, &st) != PD_OK)
    fail_msg("%s \"%s\": %s", it->file, it->entry, st.msg);
  if (n && memcmp(got, want, n) != 0)
    fail_msg("%s \"%s\": the bytes differ from NumPy's", it->file, it->entry);
  if (stg_entry_random_access(e) && n >= 3) {
    memset(got, 0xAA, n);
    uint64_t cut1 = n / 3 + 1, cut2 = n - n / 5;
    uint64_t at[4] = {0, cut1, cut2, n};
    for (int p = 0; p < 3; p++)
      if (stg_entry_read(f, e, at[p], got + at[p], at[p + 1] - at[p], &st) !=
          PD_OK)
        fail_msg("%s \"%s\" part %d: %s", it->file, it->entry, p, st.msg);
    if (memcmp(got, want, n) != 0)
      fail_msg("%s \"%s\": the bytes read in parts differ", it->file,
               it->entry);
  }
  it->value = got;
  it->bytes = n;
  free(want);
  stg_index_free(ix);
  stg_file_close(f);
}

static void parse_shape(const char *s, dev_shape *out) {
  out->rank = 0;
  while (*s) {
    out->dims[out->rank++] = strtoll(s, (char **)&s, 10);
    if (*s == ',') s++;
  }
}

static void test_read_reference_files(void **state) {
  (void)state;
  char path[1024], line[2048];
  snprintf(path, sizeof path, "%s/manifest.tsv", dir);
  FILE *fp = fopen(path, "r");
  if (!fp) fail_msg("no %s", path);
  int counted = 0;
  while (fgets(line, sizeof line, fp)) {
    line[strcspn(line, "\n")] = 0;
    char *fields[5] = {0};
    char *save = NULL, *p = line;
    int nf = 0;
    /* strtok would merge the empty fields (a .npy entry, a scalar shape) */
    for (; nf < 5; nf++) {
      fields[nf] = p;
      char *tab = strchr(p, '\t');
      if (!tab) {
        nf++;
        break;
      }
      *tab = 0;
      p = tab + 1;
    }
    (void)save;
    if (strcmp(fields[0], "#count") == 0) {
      assert_int_equal(nf, 3);
      check_count(fields[1], atoi(fields[2]));
      counted++;
      continue;
    }
    assert_int_equal(nf, 5);
    assert_true(n_items < MAX_ITEMS);
    item *it = &items[n_items++];
    snprintf(it->file, sizeof it->file, "%s", fields[0]);
    snprintf(it->entry, sizeof it->entry, "%s", fields[1]);
    it->dtype = pd_dtype_from_name(fields[2]);
    assert_int_not_equal(it->dtype, PD_DTYPE_INVALID);
    parse_shape(fields[3], &it->shape);
    snprintf(it->bin, sizeof it->bin, "%s", fields[4]);
    check_item(it);
  }
  fclose(fp);
  printf("read %d reference values bit-exactly (%d files counted)\n", n_items,
         counted);
  assert_true(n_items > 0);
}

static pd_code read_item(void *arg, int tensor, uint64_t offset, void *buf,
                         size_t len, dev_status *st) {
  (void)st;
  item *base = arg;
  memcpy(buf, base[tensor].value + offset, len);
  return PD_OK;
}

static void test_write_files(void **state) {
  (void)state;
  char path[1024];
  snprintf(path, sizeof path, "%s/out", dir);
  assert_int_equal(mkdir(path, 0755), 0);
  stg_save_tensor *t = calloc((size_t)n_items, sizeof *t);
  char(*names)[16] = calloc((size_t)n_items, sizeof *names);
  assert_true(t && names);
  for (int i = 0; i < n_items; i++) {
    snprintf(names[i], sizeof names[i], "t%d", i);
    t[i] = (stg_save_tensor){names[i], items[i].dtype, items[i].shape,
                             items[i].bytes};
  }
  const char *mk[] = {"writer"}, *mv[] = {"paradev"};
  stg_out *o = NULL;
  dev_status st = DEV_STATUS_INIT;
  snprintf(path, sizeof path, "%s/out/all.safetensors", dir);
  assert_int_equal(stg_out_create(roots, path, false, &o, &st), PD_OK);
  if (stg_write_safetensors(o, t, n_items, read_item, items, mk, mv, 1, &st) !=
      PD_OK)
    fail_msg("stg_write_safetensors: %s", st.msg);
  assert_int_equal(stg_out_commit(o, &st), PD_OK);
  int npy = 0;
  for (int i = 0; i < n_items; i++) {
    if (items[i].dtype == PD_BFLOAT16) continue;
    snprintf(path, sizeof path, "%s/out/t%d.npy", dir, i);
    assert_int_equal(stg_out_create(roots, path, false, &o, &st), PD_OK);
    if (stg_write_npy(o, &t[i], read_item, &items[i], &st) != PD_OK)
      fail_msg("stg_write_npy t%d: %s", i, st.msg);
    assert_int_equal(stg_out_commit(o, &st), PD_OK);
    npy++;
  }
  printf("wrote out/all.safetensors (%d tensors) and %d .npy files\n", n_items,
         npy);
  free(t);
  free(names);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR (storage_formats_interop.py runs it)\n",
            argv[0]);
    return 2;
  }
  dir = argv[1];
  dev_status st = DEV_STATUS_INIT;
  stg_cache_config cfg = {
      STG_CACHE_CONFIG_STRUCT_SIZE, 1 << 20, 64 << 20, 0, 5, 0};
  if (stg_cache_create(&cfg, &cache, &st) != PD_OK ||
      stg_roots_create(&dir, 1, &roots, &st) != PD_OK) {
    fprintf(stderr, "storage_formats_interop: %s\n", st.msg);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_reference_files),
      cmocka_unit_test(test_write_files),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  for (int i = 0; i < n_items; i++) free(items[i].value);
  stg_roots_destroy(roots);
  stg_cache_destroy(cache);
  return rc;
}
