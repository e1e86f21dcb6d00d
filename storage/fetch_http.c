/* The HTTP fetcher (placeholder of the first commit; replaced next). */
#include "storage_int.h"

static pd_code stg_http_open(const stg_fetcher *f, const stg_fetch_open_args *a,
                             void **handle, stg_signature *sig, char *identity,
                             size_t cap, dev_status *st) {
  (void)f, (void)handle, (void)sig, (void)identity, (void)cap;
  return dev_error(st, PD_UNIMPLEMENTED, "HTTP reads of '%s' are not yet built",
                   a->name);
}
static pd_code stg_http_read(const stg_fetcher *f, void *h, uint64_t off,
                             void *buf, size_t len, dev_status *st) {
  (void)f, (void)h, (void)off, (void)buf, (void)len;
  return dev_error(st, PD_UNIMPLEMENTED, "HTTP reads are not yet built");
}
static void stg_http_close(const stg_fetcher *f, void *h) { (void)f, (void)h; }
static void stg_http_stats(const stg_fetcher *f, stg_fetch_stats *out) {
  (void)f;
  *out = (stg_fetch_stats){0};
}
void stg__http_set_backoff(double first_s) { (void)first_s; }
const stg_fetcher stg__fetcher_http = {.struct_size = STG_FETCHER_STRUCT_SIZE,
                                       .name = "http",
                                       .ctx = NULL,
                                       .open = stg_http_open,
                                       .read = stg_http_read,
                                       .close = stg_http_close,
                                       .stats = stg_http_stats};
