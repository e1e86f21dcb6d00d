/* The HTTP fetcher: http:// and https:// range reads through libcurl's easy
 * API (issue #13, "Fetchers").
 *
 *   open   a GET of `Range: bytes=0-0`: 206 gives the size from
 *          Content-Range; a server that ignores Range answers 200, whose
 *          Content-Length gives the size (the body is not read). The ETag
 *          (else Last-Modified) is the signature.
 *   read   a GET of `Range: bytes=a-b` with `If-Range: <ETag>` (a strong
 *          ETag, else Last-Modified). 206 must carry exactly
 *          `Content-Range: bytes a-b/size` and b - a + 1 body bytes. 200 is
 *          the whole object: if its ETag (or Last-Modified) differs, the
 *          object changed (DATA_LOSS); else the server ignores Range, and
 *          bytes [a, b] are taken from the body, which is then dropped.
 *   errors 5xx, 408, 429, timeouts and connection failures are retried with
 *          exponential backoff (0.2 s, doubling, at most 5 s), up to
 *          fetch_retries times, each retry logged; then UNAVAILABLE (or
 *          DEADLINE_EXCEEDED for a timeout). 404/410 NOT_FOUND, 401/403
 *          PERMISSION_DENIED, 412/416 DATA_LOSS, 3xx FAILED_PRECONDITION
 *          (redirects are not followed: they could leave the URL root). Each
 *          message names the URL (its query, a presigned signature, cut) and
 *          the HTTP status.
 *   bounds a file opened with an stg_io_ctl (storage.h): each request's
 *          timeout is min(fetch_timeout_s, time to the deadline), no attempt
 *          starts past it (DEADLINE_EXCEEDED) and the backoff stops at it;
 *          a cancellable request runs through the thread's multi handle,
 *          polled every STG_CANCEL_POLL_MS (and the progress callback), so
 *          once the cancel flag is set the transfer in progress aborts
 *          within about 50 ms and the request is CANCELLED.
 *
 * Threads: curl_global_init runs once (pthread_once); each thread has its
 * own easy handle (a pthread key, cleaned up at thread exit), reset before
 * each request, so no handle is ever used by two threads and each thread
 * keeps its connections alive between blocks.
 */
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "storage_int.h"

typedef struct stg_http {
  char *url;
  char shown[512]; /* for messages */
  uint64_t size;
  char etag[256];
  char lastmod[128];
  bool weak; /* a weak ETag: If-Range needs a strong validator */
  atomic_bool ranges;
  double timeout_s;
  int retries;
  const stg_io_ctl *ctl; /* the file's bounds (fetch.h), or NULL */
} stg_http;

static atomic_uint_fast64_t stg_h_opens, stg_h_reads, stg_h_bytes, stg_h_req,
    stg_h_retries, stg_h_errors;
static _Atomic double stg_backoff_first = 0.2;

void stg__http_set_backoff(double first_s) {
  atomic_store(&stg_backoff_first, first_s);
}

static pthread_once_t stg_curl_once = PTHREAD_ONCE_INIT;
static pthread_key_t stg_curl_key, stg_multi_key;
static CURLcode stg_curl_init_rc;

static void stg_curl_free(void *h) { curl_easy_cleanup(h); }
static void stg_multi_free(void *m) { curl_multi_cleanup(m); }

static void stg_curl_global(void) {
  stg_curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  pthread_key_create(&stg_curl_key, stg_curl_free);
  pthread_key_create(&stg_multi_key, stg_multi_free);
}

/* This thread's multi handle (its connections kept between requests), for
 * requests that may be cancelled; NULL when it cannot be made. */
static CURLM *stg_multi(void) {
  CURLM *m = pthread_getspecific(stg_multi_key);
  if (!m && (m = curl_multi_init()) &&
      pthread_setspecific(stg_multi_key, m) != 0) {
    curl_multi_cleanup(m);
    m = NULL;
  }
  return m;
}

/* This thread's easy handle, reset; NULL when curl cannot start. */
static CURL *stg_curl(void) {
  pthread_once(&stg_curl_once, stg_curl_global);
  if (stg_curl_init_rc != CURLE_OK) return NULL;
  CURL *h = pthread_getspecific(stg_curl_key);
  if (!h) {
    h = curl_easy_init();
    if (!h || pthread_setspecific(stg_curl_key, h) != 0) {
      curl_easy_cleanup(h);
      return NULL;
    }
  } else {
    curl_easy_reset(h);
  }
  return h;
}

/* --- one request -------------------------------------------------------- */

typedef struct stg_req {
  /* in */
  const stg_http *h;
  uint64_t offset, len; /* the bytes wanted (len 0: none, open) */
  bool ranged;          /* a Range header was sent */
  bool check;           /* a 200 must be the version opened */
  unsigned char *buf;
  /* out */
  long status;
  char etag[256], lastmod[128], crange[128];
  int64_t clen;
  uint64_t total;  /* open: the size the answer gives */
  uint64_t pos;    /* body bytes seen */
  uint64_t copied; /* bytes put into buf */
  bool stopped;    /* we ended the transfer: all wanted bytes are in */
  bool changed;    /* a 200 of another version */
  bool overflow;   /* a 206 body longer than asked */
} stg_req;

static void stg_hcopy(char *dst, size_t cap, const char *v, size_t n) {
  while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
    n--;
  while (n > 0 && *v == ' ') v++, n--;
  if (n >= cap) n = cap - 1;
  memcpy(dst, v, n);
  dst[n] = '\0';
}

static size_t stg_on_header(char *p, size_t sz, size_t n, void *arg) {
  stg_req *r = arg;
  size_t len = sz * n;
  if (len > 5 && !strncmp(p, "HTTP/", 5)) { /* a new response (1xx first) */
    const char *sp = memchr(p, ' ', len);
    r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    r->etag[0] = r->lastmod[0] = r->crange[0] = '\0';
    r->clen = -1;
    return len;
  }
  const char *colon = memchr(p, ':', len);
  if (!colon) return len;
  size_t k = (size_t)(colon - p);
  const char *v = colon + 1;
  size_t vn = len - k - 1;
  if (k == 4 && !strncasecmp(p, "etag", 4))
    stg_hcopy(r->etag, sizeof r->etag, v, vn);
  else if (k == 13 && !strncasecmp(p, "last-modified", 13))
    stg_hcopy(r->lastmod, sizeof r->lastmod, v, vn);
  else if (k == 13 && !strncasecmp(p, "content-range", 13))
    stg_hcopy(r->crange, sizeof r->crange, v, vn);
  else if (k == 14 && !strncasecmp(p, "content-length", 14)) {
    char num[32];
    stg_hcopy(num, sizeof num, v, vn);
    r->clen = strtoll(num, NULL, 10);
  }
  return len;
}

/* True when a 200's validators say it is another version of the object. */
static bool stg_other_version(const stg_req *r) {
  const stg_http *h = r->h;
  if (h->etag[0]) return strcmp(r->etag, h->etag) != 0;
  if (h->lastmod[0]) return strcmp(r->lastmod, h->lastmod) != 0;
  return r->clen >= 0 && (uint64_t)r->clen != h->size;
}

static size_t stg_on_body(char *p, size_t sz, size_t n, void *arg) {
  stg_req *r = arg;
  size_t len = sz * n;
  /* the body's byte 0 is the file's byte `offset` (206) or byte 0 (200) */
  uint64_t from = r->status == 206 ? 0 : r->offset;
  if (r->status == 200 && r->check && stg_other_version(r)) {
    r->changed = true;
    return 0;
  }
  if (r->status == 206 && r->pos + len > r->len) {
    r->overflow = true;
    return 0;
  }
  if (r->status == 200 || r->status == 206) {
    uint64_t a = r->pos, b = r->pos + len;
    uint64_t lo = a > from ? a : from,
             hi = b < from + r->len ? b : from + r->len;
    if (lo < hi && r->buf) {
      memcpy(r->buf + (lo - from), p + (lo - a), (size_t)(hi - lo));
      r->copied += hi - lo;
    }
  }
  r->pos += len;
  if (r->status == 200 && r->pos >= from + r->len) {
    r->stopped = true; /* the rest of a 200 body is not needed */
    return 0;
  }
  return len;
}

/* CURLOPT_XFERINFOFUNCTION: a non-zero answer aborts the transfer
 * (CURLE_ABORTED_BY_CALLBACK) once the file's cancel flag is set. */
static int stg_on_progress(void *arg, curl_off_t dt, curl_off_t dn,
                           curl_off_t ut, curl_off_t un) {
  (void)dt, (void)dn, (void)ut, (void)un;
  const stg_io_ctl *ctl = arg;
  return ctl && ctl->cancel && atomic_load(ctl->cancel) ? 1 : 0;
}

/* curl_easy_perform, but through this thread's multi handle, polling at
 * most STG_CANCEL_POLL_MS at a time, so a set cancel flag aborts the
 * transfer within about that long whatever it is doing (libcurl calls the
 * progress callback only about once a second while nothing arrives). */
#define STG_CANCEL_POLL_MS 50
static CURLcode stg_perform_cancellable(CURL *c, const stg_io_ctl *ctl) {
  CURLM *m = stg_multi();
  if (!m || curl_multi_add_handle(m, c) != CURLM_OK)
    return curl_easy_perform(c);
  CURLcode rc = CURLE_OK;
  for (;;) {
    int running = 0;
    if (curl_multi_perform(m, &running) != CURLM_OK) {
      rc = CURLE_FAILED_INIT;
      break;
    }
    bool done = false;
    int left = 0;
    for (CURLMsg *msg; (msg = curl_multi_info_read(m, &left));)
      if (msg->msg == CURLMSG_DONE && msg->easy_handle == c) {
        rc = msg->data.result;
        done = true;
      }
    if (done || running == 0) break;
    if (atomic_load(ctl->cancel)) {
      rc = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
    curl_multi_poll(m, NULL, 0, STG_CANCEL_POLL_MS, NULL);
  }
  curl_multi_remove_handle(m, c);
  return rc;
}

/* Performs one GET; the curl code (CURLE_WRITE_ERROR when we stopped). */
static CURLcode stg_perform(stg_req *r, const char *url, double timeout_s,
                            const stg_io_ctl *ctl) {
  CURL *c = stg_curl();
  if (!c) return CURLE_FAILED_INIT;
  atomic_fetch_add(&stg_h_req, 1);
  char range[64];
  struct curl_slist *hdrs = NULL;
  char ifr[300];
  const stg_http *h = r->h;
  if (r->ranged) {
    snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, r->offset,
             r->offset + (r->len ? r->len : 1) - 1);
    curl_easy_setopt(c, CURLOPT_RANGE, range);
    const char *v = h && h->etag[0] && !h->weak ? h->etag
                    : h && h->lastmod[0]        ? h->lastmod
                                                : NULL;
    if (v && r->check) {
      snprintf(ifr, sizeof ifr, "If-Range: %s", v);
      hdrs = curl_slist_append(hdrs, ifr);
    }
  }
  long ms = (long)(timeout_s * 1000);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ms > 0 ? ms : 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ms < 10000 ? ms : 10000L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "paradevd");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, stg_on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, stg_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, ctl && ctl->cancel ? 0L : 1L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, stg_on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, (void *)ctl);
  CURLcode rc = ctl && ctl->cancel ? stg_perform_cancellable(c, ctl)
                                   : curl_easy_perform(c);
  curl_slist_free_all(hdrs);
  return rc;
}

/* --- judging an answer ---------------------------------------------------- */

typedef pd_code (*stg_judge_fn)(stg_req *r, const char *shown, bool *retry,
                                dev_status *st);

/* The transport and the status class; PD_OK for a 200 or 206 to look at. */
static pd_code stg_judge_common(stg_req *r, CURLcode cc, const char *shown,
                                double timeout_s, bool *retry, dev_status *st) {
  if (cc == CURLE_WRITE_ERROR && (r->stopped || r->changed || r->overflow))
    cc = CURLE_OK;
  if (cc == CURLE_ABORTED_BY_CALLBACK)
    return dev_error(st, PD_CANCELLED, "GET '%s': cancelled", shown);
  if (cc == CURLE_OPERATION_TIMEDOUT) {
    *retry = true;
    return dev_error(st, PD_DEADLINE_EXCEEDED,
                     "GET '%s': no complete answer within %.1f s", shown,
                     timeout_s);
  }
  if (cc != CURLE_OK) {
    *retry = cc != CURLE_FAILED_INIT && cc != CURLE_UNSUPPORTED_PROTOCOL &&
             cc != CURLE_URL_MALFORMAT;
    return dev_error(st, PD_UNAVAILABLE, "GET '%s': %s", shown,
                     curl_easy_strerror(cc));
  }
  long s = r->status;
  if (s == 200 || s == 206) return PD_OK;
  size_t cl = strlen(r->crange);
  if (s == 416 && !r->check && cl >= 2 && !strcmp(r->crange + cl - 2, "/0"))
    return PD_OK; /* open of an empty object: bytes=0-0 is unsatisfiable */
  if (s == 404 || s == 410)
    return dev_error(st, PD_NOT_FOUND, "GET '%s': HTTP %ld (no such object)",
                     shown, s);
  if (s == 401 || s == 403)
    return dev_error(st, PD_PERMISSION_DENIED,
                     "GET '%s': HTTP %ld (the server refuses access; a "
                     "presigned URL may have expired)",
                     shown, s);
  if (s == 412 || s == 416)
    return dev_error(st, PD_DATA_LOSS,
                     "GET '%s' bytes %" PRIu64 "-%" PRIu64
                     ": HTTP %ld: the object changed since it was opened",
                     shown, r->offset, r->offset + r->len - 1, s);
  if (s >= 300 && s < 400)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "GET '%s': HTTP %ld: redirects are not followed (they "
                     "could leave the storage root); use the final URL",
                     shown, s);
  if (s == 408 || s == 429 || s >= 500) {
    *retry = true;
    return dev_error(st, PD_UNAVAILABLE, "GET '%s': HTTP %ld", shown, s);
  }
  return dev_error(st, PD_FAILED_PRECONDITION,
                   "GET '%s': HTTP %ld (expected 200 or 206)", shown, s);
}

static pd_code stg_judge_open(stg_req *r, const char *shown, bool *retry,
                              dev_status *st) {
  (void)retry;
  if (r->status == 416) {
    r->total = 0;
    return PD_OK;
  }
  if (r->status == 206) {
    const char *slash = strrchr(r->crange, '/');
    char *end = NULL;
    unsigned long long total = slash ? strtoull(slash + 1, &end, 10) : 0;
    if (!slash || strncmp(r->crange, "bytes 0-0/", 10) != 0 || !end ||
        *end != '\0')
      return dev_error(st, PD_FAILED_PRECONDITION,
                       "GET '%s' bytes 0-0: HTTP 206 with Content-Range '%s' "
                       "(expected 'bytes 0-0/SIZE')",
                       shown, r->crange);
    r->total = total;
    return PD_OK;
  }
  if (r->clen < 0)
    return dev_error(st, PD_FAILED_PRECONDITION,
                     "GET '%s': the server ignores Range and sends no "
                     "Content-Length: its size is unknown",
                     shown);
  r->total = (uint64_t)r->clen;
  return PD_OK;
}

static pd_code stg_judge_read(stg_req *r, const char *shown, bool *retry,
                              dev_status *st) {
  const stg_http *h = r->h;
  uint64_t last = r->offset + r->len - 1;
  if (r->changed || (r->status == 206 && h->etag[0] && r->etag[0] &&
                     strcmp(r->etag, h->etag) != 0))
    return dev_error(st, PD_DATA_LOSS,
                     "'%s' changed since it was opened (ETag %s, now %s; "
                     "Last-Modified %s, now %s): open it again",
                     shown, h->etag[0] ? h->etag : "none",
                     r->etag[0] ? r->etag : "none",
                     h->lastmod[0] ? h->lastmod : "none",
                     r->lastmod[0] ? r->lastmod : "none");
  if (r->status == 206) {
    char want[128];
    snprintf(want, sizeof want, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64,
             r->offset, last, h->size);
    if (r->overflow || strcmp(r->crange, want) != 0)
      return dev_error(st, PD_DATA_LOSS,
                       "GET '%s': HTTP 206 with Content-Range '%s'%s, "
                       "expected '%s'",
                       shown, r->crange,
                       r->overflow ? " and a longer body" : "", want);
  } else if (r->clen >= 0 && (uint64_t)r->clen != h->size) {
    return dev_error(st, PD_DATA_LOSS,
                     "GET '%s': HTTP 200 of %" PRId64
                     " bytes, but it had %" PRIu64 " when opened",
                     shown, r->clen, h->size);
  }
  if (r->copied != r->len) {
    *retry = true;
    return dev_error(st, PD_UNAVAILABLE,
                     "GET '%s' bytes %" PRIu64 "-%" PRIu64
                     ": the answer ended after %" PRIu64 " of them",
                     shown, r->offset, last, r->copied);
  }
  return PD_OK;
}

/* The time one request may take: fetch_timeout_s cut to the deadline;
 * 0 when the deadline passed or the file was cancelled (with *stop set). */
static double stg_time_left(const stg_http *h, pd_code *stop) {
  const stg_io_ctl *ctl = h->ctl;
  *stop = PD_OK;
  if (!ctl) return h->timeout_s;
  if (ctl->cancel && atomic_load(ctl->cancel)) {
    *stop = PD_CANCELLED;
    return 0;
  }
  if (ctl->deadline_s <= 0) return h->timeout_s;
  double left = ctl->deadline_s - stg_now_s();
  if (left <= 0.001) {
    *stop = PD_DEADLINE_EXCEEDED;
    return 0;
  }
  return left < h->timeout_s ? left : h->timeout_s;
}

/* Sleeps `wait` seconds in 50 ms steps, stopping early once the file is
 * cancelled or its deadline passed. */
static void stg_backoff(const stg_http *h, double wait) {
  double until = stg_now_s() + wait;
  for (;;) {
    pd_code stop;
    stg_time_left(h, &stop);
    double left = until - stg_now_s();
    if (stop != PD_OK || left <= 0) return;
    double step = left < 0.05 ? left : 0.05;
    struct timespec ts = {0, (long)(step * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
      ;
  }
}

/* One request and its retries; on success *io holds the answer. */
static pd_code stg_request(const stg_http *h, stg_req *io, stg_judge_fn judge,
                           dev_status *st) {
  double wait = atomic_load(&stg_backoff_first);
  for (int attempt = 0;; attempt++) {
    pd_code stop;
    double tmo = stg_time_left(h, &stop);
    if (stop == PD_CANCELLED)
      return dev_error(st, stop, "GET '%s': cancelled", h->shown);
    if (stop != PD_OK)
      return dev_error(st, stop,
                       "GET '%s': the call's deadline passed (after %d "
                       "attempts)",
                       h->shown, attempt);
    stg_req r = *io;
    CURLcode cc = stg_perform(&r, h->url, tmo, h->ctl);
    bool retry = false;
    dev_status e = DEV_STATUS_INIT;
    pd_code rc = stg_judge_common(&r, cc, h->shown, tmo, &retry, &e);
    if (rc == PD_OK) rc = judge(&r, h->shown, &retry, &e);
    if (rc == PD_OK) {
      *io = r;
      return PD_OK;
    }
    if (!retry || attempt >= h->retries) {
      if (retry)
        return stg__refuse(st, rc, 3, "%s (after %d attempts)", e.msg,
                           attempt + 1);
      if (st) *st = e;
      return rc;
    }
    atomic_fetch_add(&stg_h_retries, 1);
    stg__log(4, "storage: %s; retry %d of %d in %.2f s", e.msg, attempt + 1,
             h->retries, wait);
    stg_backoff(h, wait);
    wait = wait * 2 < 5 ? wait * 2 : 5;
  }
}

/* --- the table ------------------------------------------------------------ */

static void stg_http_free(stg_http *h) {
  if (h) {
    free(h->url);
    free(h);
  }
}

static pd_code stg_http_open(const stg_fetcher *f, const stg_fetch_open_args *a,
                             void **handle, stg_signature *sig, char *identity,
                             size_t cap, dev_status *st) {
  (void)f;
  stg_http *h = calloc(1, sizeof *h);
  if (!h || !a->url || !(h->url = strdup(a->url))) {
    stg_http_free(h);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  }
  stg__url_for_msg(h->url, h->shown, sizeof h->shown);
  h->timeout_s = a->timeout_s > 0 ? a->timeout_s : 30;
  h->retries = a->retries >= 0 ? a->retries : 0;
  if (a->struct_size >= STG_FETCH_OPEN_ARGS_STRUCT_SIZE) h->ctl = a->ctl;
  unsigned char one;
  stg_req r = {.h = h, .offset = 0, .len = 1, .ranged = true, .buf = &one};
  atomic_fetch_add(&stg_h_opens, 1);
  pd_code rc = stg_request(h, &r, stg_judge_open, st);
  if (rc != PD_OK) {
    stg_http_free(h);
    return rc;
  }
  h->size = r.total;
  memcpy(h->etag, r.etag, sizeof h->etag);
  memcpy(h->lastmod, r.lastmod, sizeof h->lastmod);
  h->weak = !strncmp(h->etag, "W/", 2);
  atomic_store(&h->ranges, r.status == 206);
  if (r.status != 206)
    stg__log(4,
             "storage: '%s' answers Range with the whole object (HTTP 200): "
             "each block is cut from a full GET",
             h->shown);
  sig->size = h->size;
  if (h->etag[0])
    snprintf(sig->text, sizeof sig->text, "etag:%s", h->etag);
  else if (h->lastmod[0])
    snprintf(sig->text, sizeof sig->text, "lm:%s", h->lastmod);
  else {
    snprintf(sig->text, sizeof sig->text, "size:%" PRIu64, h->size);
    stg__log(4,
             "storage: '%s' has neither ETag nor Last-Modified: a rewrite "
             "of the same size goes unnoticed",
             h->shown);
  }
  snprintf(identity, cap, "%s", h->url);
  *handle = h;
  return PD_OK;
}

static pd_code stg_http_read(const stg_fetcher *f, void *handle,
                             uint64_t offset, void *buf, size_t len,
                             dev_status *st) {
  (void)f;
  stg_http *h = handle;
  atomic_fetch_add(&stg_h_reads, 1);
  stg_req r = {.h = h,
               .offset = offset,
               .len = len,
               .ranged = atomic_load(&h->ranges),
               .check = true,
               .buf = buf};
  pd_code rc = stg_request(h, &r, stg_judge_read, st);
  if (rc != PD_OK) {
    atomic_fetch_add(&stg_h_errors, 1);
    return rc;
  }
  atomic_fetch_add(&stg_h_bytes, len);
  return PD_OK;
}

static void stg_http_close(const stg_fetcher *f, void *handle) {
  (void)f;
  stg_http_free(handle);
}

static void stg_http_stats(const stg_fetcher *f, stg_fetch_stats *out) {
  (void)f;
  memset(out, 0, sizeof *out);
  out->opens = atomic_load(&stg_h_opens);
  out->reads = atomic_load(&stg_h_reads);
  out->bytes_read = atomic_load(&stg_h_bytes);
  out->requests = atomic_load(&stg_h_req);
  out->retries = atomic_load(&stg_h_retries);
  out->errors = atomic_load(&stg_h_errors);
}

const stg_fetcher stg__fetcher_http = {
    .struct_size = STG_FETCHER_STRUCT_SIZE,
    .name = "http",
    .ctx = NULL,
    .open = stg_http_open,
    .read = stg_http_read,
    .close = stg_http_close,
    .stats = stg_http_stats,
};
