/* See log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int srv_log_threshold = SRV_LOG_INFO;

bool srv_log_parse(const char *name, srv_log_level *out) {
  static const struct {
    const char *name;
    srv_log_level level;
  } names[] = {{"error", SRV_LOG_ERROR}, {"warn", SRV_LOG_WARN},
               {"warning", SRV_LOG_WARN}, {"info", SRV_LOG_INFO},
               {"debug", SRV_LOG_DEBUG}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    if (strcasecmp(name, names[i].name) == 0) {
      *out = names[i].level;
      return true;
    }
  }
  return false;
}

char *srv_log_clean(const char *in, char *out, size_t len) {
  size_t i = 0;
  for (; in && in[i] && i + 1 < len; i++)
    out[i] = (in[i] >= 0x20 && in[i] < 0x7f) ? in[i] : '?';
  if (len) out[i < len ? i : len - 1] = '\0';
  return out;
}

void srv_log_write(srv_log_level level, const char *file, int line,
                   const char *fmt, ...) {
  char buf[1024];
  int n = snprintf(buf, sizeof(buf), "<%d>paradevd: ", (int)level);
  if (level == SRV_LOG_DEBUG) {
    const char *base = strrchr(file, '/');
    n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s:%d: ",
                  base ? base + 1 : file, line);
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
