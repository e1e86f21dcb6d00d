/* See log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common.h"

_Atomic int srv_log_levels[SRV_SUB_COUNT] = {
    SRV_LOG_INFO, SRV_LOG_INFO, SRV_LOG_INFO, SRV_LOG_INFO,
    SRV_LOG_INFO, SRV_LOG_INFO, SRV_LOG_INFO, SRV_LOG_INFO};

static const char *const srv_sub_names[SRV_SUB_COUNT] = {
    "core", "config", "rpc", "sched", "health", "http", "admin", "storage"};

static const char *srv_level_name(int level) {
  switch (level) {
    case SRV_LOG_ERROR: return "error";
    case SRV_LOG_WARN: return "warn";
    case SRV_LOG_INFO: return "info";
    default: return "debug";
  }
}

bool srv_log_parse(const char *name, srv_log_level *out) {
  static const struct {
    const char *name;
    srv_log_level level;
  } names[] = {{"error", SRV_LOG_ERROR},
               {"warn", SRV_LOG_WARN},
               {"warning", SRV_LOG_WARN},
               {"info", SRV_LOG_INFO},
               {"debug", SRV_LOG_DEBUG}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    if (strcasecmp(name, names[i].name) == 0) {
      *out = names[i].level;
      return true;
    }
  }
  return false;
}

bool srv_log_parse_spec(const char *spec, int levels[SRV_SUB_COUNT], char *err,
                        size_t errlen) {
  int tmp[SRV_SUB_COUNT];
  memcpy(tmp, levels, sizeof(tmp));
  const char *p = spec ? spec : "";
  bool any = false;
  while (*p) {
    size_t n = strcspn(p, ",");
    char item[64];
    /* Trim spaces around the item. */
    const char *b = p, *e = p + n;
    while (b < e && (*b == ' ' || *b == '\t')) b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
    if (e > b) {
      if ((size_t)(e - b) >= sizeof(item)) {
        snprintf(err, errlen, "'%.40s...' is too long to be a log item", b);
        return false;
      }
      memcpy(item, b, (size_t)(e - b));
      item[e - b] = '\0';
      char *eq = strchr(item, '=');
      const char *lvname = eq ? eq + 1 : item;
      srv_log_level lv;
      if (!srv_log_parse(lvname, &lv)) {
        /* Name the value once: the caller quotes the whole spec, so a spec
         * of one bare item needs no more than what is wrong with it. */
        bool whole = p == spec && p[n] == '\0'; /* the only item */
        const char *expect = "is not one of error, warn, info, debug";
        if (eq)
          snprintf(err, errlen, "'%s': level '%s' %s", item, lvname, expect);
        else if (whole)
          snprintf(err, errlen,
                   "the level %s (optionally with subsystem=level items: "
                   "'info,sched=debug')",
                   expect);
        else
          snprintf(err, errlen, "level '%s' %s", item, expect);
        return false;
      }
      if (eq) {
        *eq = '\0';
        int sub = -1;
        for (int i = 0; i < SRV_SUB_COUNT; i++)
          if (strcasecmp(item, srv_sub_names[i]) == 0) sub = i;
        if (sub < 0) {
          snprintf(err, errlen,
                   "'%s=%s': unknown subsystem '%s' (expected core, config, "
                   "rpc, sched, health, http or admin)",
                   item, lvname, item);
          return false;
        }
        tmp[sub] = (int)lv;
      } else {
        for (int i = 0; i < SRV_SUB_COUNT; i++) tmp[i] = (int)lv;
      }
      any = true;
    }
    p += n;
    if (*p == ',') p++;
  }
  if (!any) {
    snprintf(err, errlen,
             "empty log spec (expected a level such as 'info', optionally "
             "with subsystem=level items: 'info,sched=debug')");
    return false;
  }
  memcpy(levels, tmp, sizeof(tmp));
  return true;
}

void srv_log_get(int levels[SRV_SUB_COUNT]) {
  for (int i = 0; i < SRV_SUB_COUNT; i++)
    levels[i] = atomic_load(&srv_log_levels[i]);
}

void srv_log_set(const int levels[SRV_SUB_COUNT]) {
  for (int i = 0; i < SRV_SUB_COUNT; i++)
    atomic_store(&srv_log_levels[i], levels[i]);
}

void srv_log_spec(const int levels[SRV_SUB_COUNT], char *out, size_t len) {
  /* The default is the level most subsystems have. */
  int best = levels[0], best_n = 0;
  for (int i = 0; i < SRV_SUB_COUNT; i++) {
    int n = 0;
    for (int j = 0; j < SRV_SUB_COUNT; j++) n += levels[j] == levels[i];
    if (n > best_n) best = levels[i], best_n = n;
  }
  size_t used = (size_t)snprintf(out, len, "%s", srv_level_name(best));
  for (int i = 0; i < SRV_SUB_COUNT && used < len; i++)
    if (levels[i] != best)
      used += (size_t)snprintf(out + used, len - used, ",%s=%s",
                               srv_sub_names[i], srv_level_name(levels[i]));
}

/* A control character: C0, DEL, or C1 (U+0080..U+009F, C2 80..C2 9F). */
static bool srv_utf8_control(const unsigned char *s, size_t n) {
  return (n == 1 && (s[0] < 0x20 || s[0] == 0x7f)) ||
         (n == 2 && s[0] == 0xC2 && s[1] < 0xA0);
}

long srv_log_text_check(const char *s, bool controls, const char **why) {
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  for (const unsigned char *q = p; *q;) {
    size_t n = pdcom_utf8_len(q);
    if (!n) {
      if (why) *why = "is not UTF-8";
      return (long)(q - p);
    }
    if (!controls && srv_utf8_control(q, n)) {
      if (why) *why = "is a control character";
      return (long)(q - p);
    }
    q += n;
  }
  return -1;
}

char *srv_log_utf8(const char *in, char *out, size_t len) {
  if (!len) return out;
  const unsigned char *p = (const unsigned char *)(in ? in : "");
  size_t j = 0;
  while (*p) {
    size_t n = pdcom_utf8_len(p);
    bool keep = n && !srv_utf8_control(p, n);
    size_t w = keep ? n : 1;
    if (j + w >= len) break; /* whole characters only */
    if (keep)
      memcpy(out + j, p, n);
    else
      out[j] = '?';
    j += w;
    p += keep ? n : 1;
  }
  out[j] = '\0';
  return out;
}

/* srv_log_quote (`quoted`) and srv_log_printable (not): valid UTF-8 kept,
 * the rest as escapes, cut between characters or escapes. */
static char *srv_log_escape(const char *in, bool quoted, char *out,
                            size_t len) {
  if (!len) return out;
  const unsigned char *p = (const unsigned char *)(in ? in : "");
  size_t j = 0;
  while (*p) {
    char esc[5];
    const char *src = esc;
    size_t n = pdcom_utf8_len(p), w, step = 1;
    bool special = quoted && (*p == '"' || *p == '\\');
    if (n && !srv_utf8_control(p, n) && !special) {
      src = (const char *)p;
      w = step = n;
    } else if (quoted && (special || *p == '\n' || *p == '\t' || *p == '\r')) {
      esc[0] = '\\';
      esc[1] = *p == '\n'   ? 'n'
               : *p == '\t' ? 't'
               : *p == '\r' ? 'r'
                            : (char)*p;
      w = 2;
    } else { /* a control byte, or one that is not UTF-8 */
      snprintf(esc, sizeof esc, "\\x%02X", *p);
      w = 4;
    }
    if (j + w >= len) break; /* whole characters and escapes only */
    memcpy(out + j, src, w);
    j += w;
    p += step;
  }
  out[j] = '\0';
  return out;
}

char *srv_log_quote(const char *in, char *out, size_t len) {
  return srv_log_escape(in, true, out, len);
}

char *srv_log_printable(const char *in, char *out, size_t len) {
  return srv_log_escape(in, false, out, len);
}

char *srv_log_clean(const char *in, char *out, size_t len) {
  size_t i = 0;
  for (; in && in[i] && i + 1 < len; i++)
    out[i] = (in[i] >= 0x20 && in[i] < 0x7f) ? in[i] : '?';
  if (len) out[i < len ? i : len - 1] = '\0';
  return out;
}

void srv_log_write(srv_log_sub sub, srv_log_level level, const char *file,
                   int line, const char *fmt, ...) {
  char buf[1024];
  int n;
  if (sub == SRV_SUB_CORE)
    n = snprintf(buf, sizeof(buf), "<%d>paradevd: ", (int)level);
  else
    n = snprintf(buf, sizeof(buf), "<%d>paradevd: %s: ", (int)level,
                 srv_sub_names[sub]);
  if (level == SRV_LOG_DEBUG) {
    const char *base = strrchr(file, '/');
    n += snprintf(buf + n, sizeof(buf) - (size_t)n,
                  "%s:%d: ", base ? base + 1 : file, line);
  }
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
  if (len > sizeof(buf) - 2) len = sizeof(buf) - 2;
  buf[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, len);
  (void)w;
}
