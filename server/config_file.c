/* The configuration file (INI, read with inih): sections, keys, duplicate
 * keys and unknown ones, each error with its line. */
#define SRV_LOG_SUB SRV_SUB_CONFIG
#include "config_int.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "paradev/types.h"

typedef struct srv_ini {
  FILE *f;
  const char *path;
  char *buf;
  size_t cap;
  int line;
  srv_options *o;
  srv_config_report_fn report;
  int errors;
  int key_line[SRV_MAX_KEYS]; /* where each key was set (duplicates) */
  char bad_section[64];       /* the unknown section reported last */
} srv_ini;

static void srv_ini_error(srv_ini *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void srv_ini_error(srv_ini *c, const char *fmt, ...) {
  char msg[768], line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  snprintf(line, sizeof(line), "%s:%d: %s", c->path, c->line, msg);
  c->report(true, line);
  c->errors++;
}

/* inih's reader: one physical line per call, so inih's line numbers and
 * ours agree. Leading blanks are dropped (inih would read an indented line
 * as the continuation of the previous value). Lines inih would reject are
 * reported here, with their number, and handed on as comments. */
static char *srv_ini_read(char *str, int num, void *stream) {
  srv_ini *c = stream;
  ssize_t n = getline(&c->buf, &c->cap, c->f);
  if (n < 0) return NULL;
  c->line++;
  const char *nul = memchr(c->buf, '\0', (size_t)n);
  if (nul) {
    /* A text file has none; inih would silently end the line there. */
    srv_ini_error(c,
                  "line %d contains a NUL byte (byte %zu of the line); "
                  "expected a text file",
                  c->line, (size_t)(nul - c->buf) + 1);
    snprintf(str, (size_t)num, ";\n");
    return str;
  }
  char *p = c->buf;
  /* A UTF-8 byte order mark, as some editors write: skipped. inih would
   * skip it too (ini_allow_bom), but this reader checks the line first. */
  if (c->line == 1 && n >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;
  while (*p == ' ' || *p == '\t') p++;
  size_t len = strlen(p);
  while (len && (p[len - 1] == '\n' || p[len - 1] == '\r')) p[--len] = '\0';
  const char *why = NULL;
  if (len + 3 > (size_t)num) {
    why = "line too long";
  } else if (len && p[0] != ';' && p[0] != '#') {
    if (p[0] == '[') {
      if (!strchr(p, ']')) why = "a section header without ']'";
    } else if (!strchr(p, '=') && !strchr(p, ':')) {
      why = "not 'key = value'";
    } else if (p[0] == '=' || p[0] == ':') {
      why = "a value without a key";
    }
  }
  if (why) {
    if (len + 3 > (size_t)num)
      srv_ini_error(c, "%s (%zu bytes; at most %d)", why, len, num - 3);
    else
      srv_ini_error(c,
                    "syntax error: %s (expected '[section]', 'key = value' "
                    "or a comment starting with ; or #)",
                    why);
    snprintf(str, (size_t)num, ";\n");
    return str;
  }
  snprintf(str, (size_t)num, "%s\n", p);
  return str;
}

static int srv_ini_handler(void *user, const char *section, const char *name,
                           const char *value) {
  srv_ini *c = user;
  if (!name) return 1;          /* a section start, when inih reports those */
  char cv[SRV_LOG_QUOTED(100)]; /* the value as typed, bytes escaped */
  srv_log_printable(value, cv, sizeof(cv));
  if (!section || !*section) {
    srv_ini_error(c,
                  "key '%s' before any section (put it under one of [daemon], "
                  "[devices], [cuda], [limits], [sessions], [storage], "
                  "[auth], [tenant NAME], [log])",
                  name);
    return 1;
  }
  const char *tenant = srv_tenant_section(section);
  if (tenant) {
    char err[512];
    if (!srv_tenant_key_set(c->o, tenant, name, value, c->line, err,
                            sizeof(err)))
      srv_ini_error(c, "[%s] %s = '%s': %s", section, name, cv, err);
    return 1;
  }
  bool known_section = false;
  for (size_t i = 0; i < srv_num_sections; i++)
    known_section |= strcmp(section, srv_sections[i]) == 0;
  if (!known_section) {
    if (strcmp(c->bad_section, section) != 0) {
      snprintf(c->bad_section, sizeof(c->bad_section), "%s", section);
      srv_ini_error(c,
                    "unknown section [%s] (key '%s'); expected [daemon], "
                    "[devices], [cuda], [limits], [sessions], [storage], "
                    "[auth], [tenant NAME], [log] or [functions]",
                    section, name);
    }
    return 1;
  }
  const srv_key *k = NULL;
  size_t ki = 0;
  for (size_t i = 0; i < srv_num_keys; i++)
    if (strcmp(srv_keys[i].section, section) == 0 &&
        strcmp(srv_keys[i].name, name) == 0) {
      k = &srv_keys[i];
      ki = i;
    }
  if (!k) {
    char keys[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < srv_num_keys && used < sizeof(keys); i++)
      if (strcmp(srv_keys[i].section, section) == 0)
        used += (size_t)snprintf(keys + used, sizeof(keys) - used, "%s%s",
                                 used ? ", " : "", srv_keys[i].name);
    const char *elsewhere = NULL;
    for (size_t i = 0; i < srv_num_keys; i++)
      if (strcmp(srv_keys[i].name, name) == 0) elsewhere = srv_keys[i].section;
    if (elsewhere)
      srv_ini_error(c, "[%s] has no key '%s'; it belongs in [%s]", section,
                    name, elsewhere);
    else
      srv_ini_error(c, "unknown key '%s' in [%s] (expected one of: %s)", name,
                    section, keys);
    return 1;
  }
  if (c->key_line[ki] && k->type != SRV_K_LISTEN && k->type != SRV_K_PLUGINS) {
    srv_ini_error(c, "[%s] %s is set twice (first on line %d)", section, name,
                  c->key_line[ki]);
    return 1;
  }
  c->key_line[ki] = c->line;
  char err[512];
  if (!srv_key_set(k, c->o, value, err, sizeof(err)))
    srv_ini_error(c, "[%s] %s = '%s': %s", section, name, cv, err);
  return 1;
}

/* Reads the file into `o`. Returns the number of errors (reported). */
int srv_config_read_file(srv_options *o, srv_config_report_fn report) {
  char msg[SRV_ADDR_MAX + 128];
  FILE *f = fopen(o->config_path, "r");
  if (!f) {
    if (errno == ENOENT && !o->config_explicit) return 0; /* defaults */
    snprintf(msg, sizeof(msg), "%s: cannot read the configuration file: %s",
             o->config_path, strerror(errno));
    report(true, msg);
    return 1;
  }
  srv_ini c;
  memset(&c, 0, sizeof(c));
  c.f = f;
  c.path = o->config_path;
  c.o = o;
  c.report = report;
  int rc = ini_parse_stream(srv_ini_read, &c, srv_ini_handler, &c);
  if (ferror(f)) {
    snprintf(msg, sizeof(msg), "%s: read error: %s", o->config_path,
             strerror(errno));
    report(true, msg);
    c.errors++;
  } else if (rc > 0 && c.errors == 0) {
    c.line = rc;
    srv_ini_error(&c, "syntax error");
  } else if (rc < 0) {
    snprintf(msg, sizeof(msg), "%s: cannot parse (out of memory)",
             o->config_path);
    report(true, msg);
    c.errors++;
  }
  free(c.buf);
  fclose(f);
  o->config_loaded = true;
  return c.errors;
}
