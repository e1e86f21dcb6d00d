/* Open files: a name resolved by the roots (a local path, or a URL), read
 * by its fetcher, through the cache. A read passes
 *   stg_file_pread -> stg__cache_read (cache.c: split into blocks, hits
 *   copied out, misses fetched once) -> stg_file_fetch -> fetcher->read
 *   (fetch_local.c: pread; fetch_http.c: a ranged GET).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "storage_int.h"

struct stg_file {
  stg_cache *cache;
  const stg_fetcher *fetcher;
  void *handle;
  stg__cfile *cf;
  uint64_t size;
  char *name;
  stg_io_ctl ctl; /* the fetcher's args point here */
};

double stg_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CANCELLED once the flag is set, DEADLINE_EXCEEDED past the deadline. */
static pd_code stg_ctl_check(const stg_io_ctl *ctl, const char *name,
                             dev_status *st) {
  if (ctl->cancel && atomic_load(ctl->cancel))
    return dev_error(st, PD_CANCELLED, "reading '%s': cancelled", name);
  if (ctl->deadline_s > 0 && stg_now_s() >= ctl->deadline_s)
    return dev_error(st, PD_DEADLINE_EXCEEDED,
                     "reading '%s': the call's deadline passed", name);
  return PD_OK;
}

static pd_code stg_file_fetch(void *fctx, uint64_t offset, void *buf,
                              size_t len, dev_status *st) {
  stg_file *f = fctx;
  PD_TRY(stg_ctl_check(&f->ctl, f->name, st));
  return f->fetcher->read(f->fetcher, f->handle, offset, buf, len, st);
}

/* Opens through `fetcher`; takes over args->fd. */
static pd_code stg_file_open_args(stg_cache *c, const stg_fetcher *fetcher,
                                  const stg_fetch_open_args *given,
                                  const stg_io_ctl *ctl, stg_file **out,
                                  dev_status *st) {
  stg_fetch_open_args a = *given, *args = &a;
  if (!fetcher || fetcher->struct_size < STG_FETCHER_STRUCT_SIZE) {
    if (args->fd >= 0) close(args->fd);
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "fetcher table for '%s' is too old (struct_size %zu, "
                     "expected %zu)",
                     args->name, fetcher ? fetcher->struct_size : 0,
                     STG_FETCHER_STRUCT_SIZE);
  }
  stg_file *f = calloc(1, sizeof *f);
  if (!f || !(f->name = strdup(args->name))) {
    free(f);
    if (args->fd >= 0) close(args->fd);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  }
  f->cache = c;
  f->fetcher = fetcher;
  if (ctl) f->ctl = *ctl;
  a.ctl = &f->ctl;
  pd_code cc = stg_ctl_check(&f->ctl, f->name, st);
  if (cc != PD_OK) {
    free(f->name);
    free(f);
    if (args->fd >= 0) close(args->fd);
    return cc;
  }
  stg_signature sig;
  memset(&sig, 0, sizeof sig);
  char identity[4096];
  pd_code rc = fetcher->open(fetcher, args, &f->handle, &sig, identity,
                             sizeof identity, st);
  if (rc != PD_OK) {
    free(f->name);
    free(f);
    return rc;
  }
  f->size = sig.size;
  f->cf = stg__cache_attach(c, identity, &sig);
  if (!f->cf) {
    stg_file_close(f);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  }
  *out = f;
  return PD_OK;
}

static void stg_open_args_init(stg_cache *c, const char *name,
                               stg_fetch_open_args *a) {
  stg_cache_config cfg;
  stg__cache_config_get(c, &cfg);
  memset(a, 0, sizeof *a);
  a->struct_size = STG_FETCH_OPEN_ARGS_STRUCT_SIZE;
  a->name = name;
  a->fd = -1;
  a->timeout_s = cfg.fetch_timeout_s;
  a->retries = cfg.fetch_retries;
}

pd_code stg__file_open_with(stg_cache *c, const stg_fetcher *fetcher,
                            const char *name, stg_file **out, dev_status *st) {
  stg_fetch_open_args a;
  stg_open_args_init(c, name, &a);
  return stg_file_open_args(c, fetcher, &a, NULL, out, st);
}

static int stg_try_read(void *arg, const stg__local_target *t) {
  (void)arg;
  return stg__open_beneath(t->root_fd, t->rel, STG__OPEN_READ);
}

pd_code stg_file_open(stg_cache *c, const stg_roots *roots, const char *name,
                      stg_file **out, dev_status *st) {
  return stg_file_open_ctl(c, roots, name, NULL, out, st);
}

void stg_file_set_deadline(stg_file *f, double deadline_s) {
  if (f) f->ctl.deadline_s = deadline_s;
}

pd_code stg_file_open_ctl(stg_cache *c, const stg_roots *roots,
                          const char *name, const stg_io_ctl *ctl,
                          stg_file **out, dev_status *st) {
  if (!roots || !name || !out)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "stg_file_open: roots, name and out are required");
  stg_fetch_open_args a;
  stg_open_args_init(c, name, &a);
  if (stg__is_url(name)) {
    char *url = NULL;
    PD_TRY(stg__roots_url(roots, name, &url, st));
    a.url = url;
    pd_code rc = stg_file_open_args(c, &stg__fetcher_http, &a, ctl, out, st);
    free(url);
    return rc;
  }
  PD_TRY(stg__roots_local(roots, name, "read", stg_try_read, NULL, &a.fd, st));
  return stg_file_open_args(c, &stg__fetcher_local, &a, ctl, out, st);
}

uint64_t stg_file_size(const stg_file *f) { return f ? f->size : 0; }

const char *stg_file_name(const stg_file *f) { return f ? f->name : ""; }

pd_code stg_file_pread(stg_file *f, uint64_t offset, void *buf, size_t len,
                       dev_status *st) {
  if (!f || (!buf && len > 0))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "stg_file_pread: a file and a buffer are required");
  if (offset > f->size || len > f->size - offset)
    return dev_error(st, PD_OUT_OF_RANGE,
                     "reading %zu bytes at offset %" PRIu64
                     " of '%s' goes past its end (%" PRIu64 " bytes)",
                     len, offset, f->name, f->size);
  return stg__cache_read(f->cache, f->cf, f->name, stg_file_fetch, f, offset,
                         buf, len, st);
}

pd_code stg_file_read_spans(stg_file *f, uint64_t offset, size_t len,
                            stg_span_fn fn, void *arg, dev_status *st) {
  if (offset > f->size || len > f->size - offset)
    return dev_error(st, PD_OUT_OF_RANGE,
                     "reading %zu bytes at offset %" PRIu64
                     " of '%s' goes past its end (%" PRIu64 " bytes)",
                     len, offset, f->name, f->size);
  return stg__cache_read_spans(f->cache, f->cf, f->name, stg_file_fetch, f,
                               offset, len, fn, arg, st);
}

void stg_file_close(stg_file *f) {
  if (!f) return;
  stg__cache_detach(f->cache, f->cf);
  f->fetcher->close(f->fetcher, f->handle);
  free(f->name);
  free(f);
}
