/* Where the daemon may read and write (issue #13, "Where the daemon may
 * read and write"): the configured roots, local directories and URL
 * prefixes, and the rule that maps a requested name to one of them.
 *
 *   - An absolute path must begin with a root's directory, as configured or
 *     as its real path (a root configured through a symlink matches both);
 *     the rest is opened beneath that root's directory fd (resolve.c).
 *   - A relative path is tried under each local root in order; the first
 *     under which it exists wins (NOT_FOUND only when it exists under none).
 *   - A URL is normalised (scheme and host lowercased, default port
 *     dropped) and refused with userinfo, a fragment, or a `.`/`..` segment
 *     (also percent-encoded, and encoded slashes); it must then begin with a
 *     URL root at a segment boundary.
 * Every refusal is PERMISSION_DENIED naming the rule and is logged.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "storage_int.h"

typedef struct stg_root {
  char *entry; /* as configured */
  char *dir;   /* local: normalised, no trailing '/'; "" for "/" */
  char *real;  /* local: realpath, same form */
  int fd;      /* local: O_PATH | O_DIRECTORY */
  char *url;   /* URL: the normalised prefix */
} stg_root;

struct stg_roots {
  int n;
  stg_root *v;
};

bool stg__is_url(const char *name) {
  const char *p = name;
  if (!isalpha((unsigned char)*p)) return false;
  while (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.') p++;
  return strncmp(p, "://", 3) == 0;
}

const char *stg__url_for_msg(const char *url, char *buf, size_t cap) {
  size_t n = strcspn(url, "?");
  snprintf(buf, cap, "%.*s%s", (int)n, url, url[n] ? "?..." : "");
  return buf;
}

/* "/a//b/./c/" -> "/a/b/c"; "/" -> "". `..` is kept: the kernel decides it
 * beneath the root. */
static char *stg_norm_abs(const char *p) {
  size_t n = strlen(p);
  char *out = malloc(n + 2);
  if (!out) return NULL;
  size_t o = 0;
  while (*p) {
    while (*p == '/') p++;
    size_t len = strcspn(p, "/");
    if (len == 0) break;
    if (!(len == 1 && p[0] == '.')) {
      out[o++] = '/';
      memcpy(out + o, p, len);
      o += len;
    }
    p += len;
  }
  out[o] = '\0';
  return out;
}

/* --- URLs ---------------------------------------------------------------- */

static bool stg_dot_segment(const char *s, size_t len) {
  char d[8];
  size_t o = 0;
  for (size_t i = 0; i < len && o < sizeof d - 1; i++) {
    if (s[i] == '%' && i + 2 < len + 0 && (s[i + 1] == '2') &&
        (s[i + 2] == 'e' || s[i + 2] == 'E')) {
      d[o++] = '.';
      i += 2;
    } else {
      d[o++] = s[i];
    }
    if (d[o - 1] != '.') return false;
  }
  d[o] = '\0';
  return len > 0 && (strcmp(d, ".") == 0 || strcmp(d, "..") == 0);
}

/* Normalises `url`; NULL and a reason in *why when it breaks a rule. When
 * `path_only`, the query is dropped (for prefix matching). */
static char *stg_norm_url(const char *url, const char **why, bool path_only) {
  const char *p = url;
  const char *colon = strstr(p, "://");
  if (!colon || !stg__is_url(url))
    return *why = "not a URL (expected scheme://host/path)", NULL;
  const char *auth = colon + 3;
  size_t alen = strcspn(auth, "/?#");
  if (alen == 0) return *why = "a URL without a host", NULL;
  if (memchr(auth, '@', alen))
    return *why = "a URL with userinfo (user:password@) is refused", NULL;
  if (strchr(url, '#'))
    return *why = "a URL with a fragment ('#') is refused", NULL;
  const char *path = auth + alen;
  size_t plen = strcspn(path, "?");
  const char *query = path + plen;
  if (strchr(url, '\\') || strcasestr(url, "%2f") || strcasestr(url, "%5c"))
    return *why = "a URL with a backslash or an encoded slash is refused", NULL;
  for (const char *s = path; s < path + plen;) {
    s += *s == '/';
    size_t len = strcspn(s, "/?");
    if (stg_dot_segment(s, len))
      return *why = "a URL with a '.' or '..' segment is refused", NULL;
    s += len;
  }
  size_t slen = (size_t)(colon - url);
  size_t hlen = alen;
  const char *port = NULL;
  const char *pc = memchr(auth, ':', alen);
  if (pc && auth[0] != '[') {
    hlen = (size_t)(pc - auth);
    port = pc + 1;
  }
  char *out = malloc(strlen(url) + 2);
  if (!out) return *why = "out of memory", NULL;
  size_t o = 0;
  for (size_t i = 0; i < slen; i++)
    out[o++] = (char)tolower((unsigned char)url[i]);
  memcpy(out + o, "://", 3);
  o += 3;
  for (size_t i = 0; i < hlen; i++)
    out[o++] = (char)tolower((unsigned char)auth[i]);
  size_t portlen = port ? alen - hlen - 1 : 0;
  bool dflt =
      port &&
      ((portlen == 2 && !strncmp(port, "80", 2) && !strncmp(out, "http:", 5)) ||
       (portlen == 3 && !strncmp(port, "443", 3) &&
        !strncmp(out, "https:", 6)));
  if (port && portlen > 0 && !dflt) {
    out[o++] = ':';
    memcpy(out + o, port, portlen);
    o += portlen;
  }
  if (plen == 0) out[o++] = '/';
  memcpy(out + o, path, plen);
  o += plen;
  if (!path_only) {
    memcpy(out + o, query, strlen(query));
    o += strlen(query);
  }
  out[o] = '\0';
  if (strncmp(out, "http://", 7) != 0 && strncmp(out, "https://", 8) != 0) {
    free(out);
    return *why = "only http:// and https:// URLs are supported", NULL;
  }
  return out;
}

pd_code stg__roots_url(const stg_roots *r, const char *url, char **norm,
                       dev_status *st) {
  char shown[512];
  stg__url_for_msg(url, shown, sizeof shown);
  const char *why = NULL;
  char *full = stg_norm_url(url, &why, false);
  if (!full)
    return stg__refuse(st, PD_PERMISSION_DENIED, 4, "'%s': %s", shown, why);
  char *bare = stg_norm_url(url, &why, true);
  bool ok = false;
  for (int i = 0; bare && i < r->n && !ok; i++) {
    const char *pre = r->v[i].url;
    if (!pre) continue;
    size_t n = strlen(pre);
    ok = strncmp(bare, pre, n) == 0 &&
         (pre[n - 1] == '/' || bare[n] == '/' || bare[n] == '\0');
  }
  free(bare);
  if (!ok) {
    free(full);
    char list[256] = "";
    for (int i = 0, o = 0; i < r->n && o < (int)sizeof list - 2; i++)
      if (r->v[i].url)
        o += snprintf(list + o, sizeof list - (size_t)o, "%s%s", o ? ", " : "",
                      r->v[i].url);
    return stg__refuse(st, PD_PERMISSION_DENIED, 4,
                       "'%s' is not beneath any storage root URL (URL roots: "
                       "%s)",
                       shown, list[0] ? list : "none");
  }
  *norm = full;
  return PD_OK;
}

/* --- roots ---------------------------------------------------------------- */

static pd_code stg_root_init(stg_root *rt, const char *e, dev_status *st) {
  memset(rt, 0, sizeof *rt);
  rt->fd = -1;
  rt->entry = strdup(e);
  if (!rt->entry) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  if (stg__is_url(e)) {
    const char *why = NULL;
    rt->url = stg_norm_url(e, &why, true);
    if (!rt->url)
      return dev_error(st, PD_INVALID_ARGUMENT, "storage root '%s': %s", e,
                       why);
    if (strchr(e, '?'))
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "storage root '%s': a URL root has no query string", e);
    return PD_OK;
  }
  if (e[0] != '/')
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "storage root '%s' is relative: expected an absolute "
                     "directory or an http(s):// URL prefix",
                     e);
  rt->fd = open(e, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rt->fd < 0)
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "storage root '%s' is not a directory one can open: %s", e,
                     strerror(errno));
  char real[PATH_MAX];
  rt->dir = stg_norm_abs(e);
  rt->real = realpath(e, real) ? stg_norm_abs(real) : strdup(rt->dir);
  if (!rt->dir || !rt->real)
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  return PD_OK;
}

pd_code stg_roots_create(const char *const *entries, int n, stg_roots **out,
                         dev_status *st) {
  if (n < 0 || (n > 0 && !entries))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "storage roots: %d entries (expected n >= 0)", n);
  stg_roots *r = calloc(1, sizeof *r);
  if (!r || (n > 0 && !(r->v = calloc((size_t)n, sizeof *r->v)))) {
    free(r);
    return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  }
  pd_code rc = PD_OK;
  for (int i = 0; i < n; i++) {
    if (!entries[i] || !entries[i][0]) {
      rc = dev_error(st, PD_INVALID_ARGUMENT,
                     "storage root %d is empty: expected an absolute "
                     "directory or an http(s):// URL prefix",
                     i);
      r->n = i;
      goto fail;
    }
    r->n = i + 1;
    PD_TRY_GOTO(stg_root_init(&r->v[i], entries[i], st), rc, fail);
  }
  *out = r;
  return PD_OK;
fail:
  stg_roots_destroy(r);
  return rc;
}

void stg_roots_destroy(stg_roots *r) {
  if (!r) return;
  for (int i = 0; i < r->n; i++) {
    stg_root *rt = &r->v[i];
    if (rt->fd >= 0) close(rt->fd);
    free(rt->entry);
    free(rt->dir);
    free(rt->real);
    free(rt->url);
  }
  free(r->v);
  free(r);
}

int stg_roots_count(const stg_roots *r) { return r ? r->n : 0; }

const char *stg_roots_entry(const stg_roots *r, int i) {
  return r && i >= 0 && i < r->n ? r->v[i].entry : NULL;
}

/* --- local paths ---------------------------------------------------------- */

pd_code stg__errno_code(int e, const char *path, const char *root,
                        const char *what, dev_status *st) {
  e = -e;
  switch (e) {
    case EXDEV:
      return stg__refuse(st, PD_PERMISSION_DENIED, 4,
                         "'%s' leaves storage root '%s' (a '..', an absolute "
                         "symlink or a symlink out of the root): refused to %s",
                         path, root, what);
    case ELOOP:
      return stg__refuse(
          st, PD_PERMISSION_DENIED, 4,
          "'%s' under storage root '%s' passes a symlink loop or "
          "a /proc magic link: refused to %s",
          path, root, what);
    case STG__EFTYPE:
      return stg__refuse(st, PD_PERMISSION_DENIED, 4,
                         "'%s' under storage root '%s' is not a regular file "
                         "(directories, devices, FIFOs and sockets are "
                         "refused): refused to %s",
                         path, root, what);
    case EACCES:
    case EPERM:
    case EROFS:
      return stg__refuse(
          st, PD_PERMISSION_DENIED, 4,
          "the daemon may not %s '%s' under storage root '%s': %s", what, path,
          root, strerror(e));
    case ENOENT:
      return dev_error(st, PD_NOT_FOUND,
                       "'%s' does not exist under storage "
                       "root '%s'",
                       path, root);
    case ENOTDIR:
      return dev_error(st, PD_NOT_FOUND,
                       "'%s' under storage root '%s': a component is not a "
                       "directory",
                       path, root);
    case EEXIST:
      return dev_error(st, PD_ALREADY_EXISTS, "'%s' already exists", path);
    case ENOSPC:
    case EDQUOT:
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "cannot %s '%s': %s", what,
                       path, strerror(e));
    case ENAMETOOLONG:
      return dev_error(st, PD_INVALID_ARGUMENT, "'%s': %s", path, strerror(e));
    case ESTALE:
      return dev_error(st, PD_ABORTED,
                       "'%s' changed while it was being opened; try again",
                       path);
    case ENOMEM:
      return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory opening '%s'",
                       path);
    default:
      return dev_error(st, PD_UNAVAILABLE, "cannot %s '%s' under root '%s': %s",
                       what, path, root, strerror(e));
  }
}

static void stg_roots_list(const stg_roots *r, char *buf, size_t cap) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < r->n && o + 2 < cap; i++)
    if (r->v[i].dir)
      o += (size_t)snprintf(buf + o, cap - o, "%s%s", o ? ", " : "",
                            r->v[i].entry);
  if (!buf[0]) snprintf(buf, cap, "none");
}

/* The part of absolute `norm` beneath `dir`, or NULL. */
static const char *stg_beneath(const char *norm, const char *dir) {
  size_t n = strlen(dir);
  if (strncmp(norm, dir, n) != 0 || (norm[n] != '/' && norm[n] != '\0'))
    return NULL;
  return norm[n] == '/' ? norm + n + 1 : norm + n;
}

pd_code stg__roots_local(const stg_roots *r, const char *path, const char *what,
                         stg__try_fn try, void *arg, int *result,
                         dev_status *st) {
  if (!path || !path[0])
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "an empty path: expected a file beneath a storage root");
  bool abs = path[0] == '/';
  char *norm = abs ? stg_norm_abs(path) : strdup(path);
  if (!norm) return dev_error(st, PD_RESOURCE_EXHAUSTED, "out of memory");
  int matched = -1;
  pd_code rc = PD_OK;
  for (int i = 0; i < r->n; i++) {
    const stg_root *rt = &r->v[i];
    if (!rt->dir) continue;
    const char *rel = norm;
    if (abs && !(rel = stg_beneath(norm, rt->dir)) &&
        !(rel = stg_beneath(norm, rt->real)))
      continue;
    stg__local_target t = {i, rt->fd, (char *)rel};
    int v = try(arg, &t);
    if (v >= 0) {
      *result = v;
      goto out;
    }
    if (v != -ENOENT) {
      rc = stg__errno_code(v, path, rt->entry, what, st);
      goto out;
    }
    if (matched < 0) matched = i;
  }
  char list[256];
  stg_roots_list(r, list, sizeof list);
  if (matched >= 0)
    rc = dev_error(st, PD_NOT_FOUND, "'%s' does not exist under %s (roots: %s)",
                   path, abs ? r->v[matched].entry : "any storage root", list);
  else
    rc = stg__refuse(st, PD_PERMISSION_DENIED, 4,
                     "'%s' is not beneath any storage root (roots: %s)", path,
                     list);
out:
  free(norm);
  return rc;
}
