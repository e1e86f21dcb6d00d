/* The [tenant NAME] sections (issue #14): who belongs to a tenant and what
 * its sessions together may hold, and the checks between tenants and the
 * other keys. The file reader (config_file.c) hands every key of a section
 * "tenant NAME" here; [auth] operators uses the same identity lists. */
#define SRV_LOG_SUB SRV_SUB_CONFIG
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "config_int.h"

/* The keys of a tenant, in the order deploy/paradevd.conf shows them (their
 * index is their bit in srv_tenant_conf.set). */
static const char *const srv_tenant_keys[] = {
    "identities", "memory_quota", "max_sessions",  "max_lease_seconds",
    "priority",   "weight",       "storage_roots", "devices",
};
#define SRV_TENANT_NKEYS (sizeof(srv_tenant_keys) / sizeof(srv_tenant_keys[0]))

const char *srv_tenant_section(const char *section) {
  if (strncmp(section, "tenant", 6) != 0) return NULL;
  if (section[6] != ' ' && section[6] != '\t' && section[6] != '\0')
    return NULL;
  const char *p = section + 6;
  while (*p == ' ' || *p == '\t') p++;
  return p;
}

static bool srv_tenant_name_ok(const char *n) {
  size_t len = strlen(n);
  if (len == 0 || len > SRV_TENANT_NAME_MAX) return false;
  for (const char *p = n; *p; p++) {
    char ch = *p;
    bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
              (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

bool srv_idlist_parse(const char *value, char *out, size_t cap, char *err,
                      size_t errlen) {
  size_t used = 0;
  out[0] = '\0';
  const char *p = value;
  while (*p) {
    size_t n = strcspn(p, ",");
    const char *b = p, *e = p + n;
    while (b < e && (*b == ' ' || *b == '\t')) b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
    size_t len = (size_t)(e - b);
    for (const char *q = b; q < e; q++)
      if ((unsigned char)*q < 0x20 || *q == 0x7f) {
        snprintf(err, errlen,
                 "an identity holds a control byte; expected printable "
                 "names separated by commas");
        return false;
      }
    if (len) {
      if (len > SRV_IDENTITY_NAME_MAX) {
        snprintf(err, errlen, "an identity of %zu bytes; at most %d", len,
                 SRV_IDENTITY_NAME_MAX);
        return false;
      }
      if (used + len + 2 > cap) {
        snprintf(err, errlen, "the list is over %zu bytes", cap - 1);
        return false;
      }
      if (used) out[used++] = ',';
      memcpy(out + used, b, len);
      used += len;
      out[used] = '\0';
    }
    p += n;
    if (*p == ',') p++;
  }
  return true;
}

/* The tenant `name`, added at its first key; NULL with err when the name is
 * bad or there are too many. */
static srv_tenant_conf *srv_tenant_get(srv_options *o, const char *name,
                                       int line, char *err, size_t errlen) {
  for (int i = 0; i < o->num_tenants; i++)
    if (strcmp(o->tenants[i].name, name) == 0) return &o->tenants[i];
  if (!srv_tenant_name_ok(name)) {
    snprintf(err, errlen,
             "'%.80s' is not a tenant name: expected [tenant NAME] with NAME "
             "of 1 to %d letters, digits, '.', '_' or '-'",
             name, SRV_TENANT_NAME_MAX);
    return NULL;
  }
  if (o->num_tenants == SRV_MAX_TENANTS) {
    snprintf(err, errlen, "more than %d [tenant] sections", SRV_MAX_TENANTS);
    return NULL;
  }
  srv_tenant_conf *t = &o->tenants[o->num_tenants++];
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->line = line;
  t->weight = 1;
  return t;
}

static bool srv_tenant_uint(const char *value, uint64_t max, uint64_t *out,
                            char *err, size_t errlen) {
  char *end = NULL;
  if (*value < '0' || *value > '9') goto bad;
  unsigned long long v = strtoull(value, &end, 10);
  if (*end || v > max) goto bad;
  *out = v;
  return true;
bad:
  snprintf(err, errlen, "expected an integer from 0 to %llu",
           (unsigned long long)max);
  return false;
}

/* devices = 0, 1 (issue #17): distinct daemon device indices, in order. */
static bool srv_tenant_devices(srv_tenant_conf *t, const char *value, char *err,
                               size_t errlen) {
  t->num_devices = 0;
  const char *p = value;
  bool seen[PD_MAX_DEVICES] = {false};
  while (*p) {
    while (*p == ' ' || *p == '\t') p++;
    char *end = NULL;
    unsigned long d = *p >= '0' && *p <= '9' ? strtoul(p, &end, 10) : 0;
    if (!end || d >= PD_MAX_DEVICES) {
      snprintf(err, errlen,
               "expected daemon device indices 0 to %d separated by commas, "
               "such as 0, 1 (the devices the tenant's sessions may use)",
               PD_MAX_DEVICES - 1);
      return false;
    }
    if (seen[d]) {
      snprintf(err, errlen, "device %lu is listed twice; list each once", d);
      return false;
    }
    seen[d] = true;
    t->devices[t->num_devices++] = (uint8_t)d;
    p = end;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == ',') {
      p++;
      while (*p == ' ' || *p == '\t') p++;
      if (!*p) break; /* a trailing comma: caught below */
    } else if (*p) {
      t->num_devices = 0;
      snprintf(err, errlen,
               "expected daemon device indices separated by commas, such as "
               "0, 1");
      return false;
    }
  }
  if (t->num_devices == 0 || p[-1] == ',') {
    t->num_devices = 0;
    snprintf(err, errlen,
             "expected daemon device indices separated by commas, such as 0, "
             "1 (leave the key out for every device)");
    return false;
  }
  return true;
}

/* Sets one key of `t` (index i in srv_tenant_keys). */
static bool srv_tenant_set(srv_tenant_conf *t, size_t i, const char *value,
                           char *err, size_t errlen) {
  uint64_t v = 0;
  switch (i) {
    case 0:
      return srv_idlist_parse(value, t->identities, sizeof(t->identities), err,
                              errlen);
    case 1:
      if (strcmp(value, "unlimited") == 0) {
        t->memory_quota = 0;
        return true;
      }
      if (!pdcom_parse_size(value, &v)) {
        snprintf(err, errlen,
                 "expected a byte count such as 512M or 16G for all the "
                 "tenant's sessions together, or unlimited");
        return false;
      }
      t->memory_quota = v;
      return true;
    case 2:
      if (!srv_tenant_uint(value, 1000000, &v, err, errlen)) return false;
      t->max_sessions = (int)v; /* 0: none */
      return true;
    case 3:
      if (!srv_tenant_uint(value, 315360000, &v, err, errlen)) return false;
      t->max_lease_s = (uint32_t)v; /* 0: the daemon's */
      return true;
    case 4: {
      char *end = NULL;
      long p = strtol(value, &end, 10);
      if (!*value || *end || p < -8 || p > 8) {
        snprintf(err, errlen,
                 "expected a priority band from -8 to 8 (higher is served "
                 "first; 0 the default)");
        return false;
      }
      t->priority = (int)p;
      return true;
    }
    case 5:
      if (!srv_tenant_uint(value, 10000, &v, err, errlen) || v == 0) {
        snprintf(err, errlen,
                 "expected a weight from 1 to 10000 (its share of device "
                 "time inside its band)");
        return false;
      }
      t->weight = (uint32_t)v;
      return true;
    case 6:
      t->roots_set = true;
      return srv_idlist_parse(value, t->storage_roots, sizeof(t->storage_roots),
                              err, errlen);
    case 7: return srv_tenant_devices(t, value, err, errlen);
  }
  snprintf(err, errlen, "internal: unknown tenant key");
  return false;
}

bool srv_tenant_key_set(srv_options *o, const char *tenant, const char *name,
                        const char *value, int line, char *err, size_t errlen) {
  srv_tenant_conf *t = srv_tenant_get(o, tenant, line, err, errlen);
  if (!t) return false;
  for (size_t i = 0; i < SRV_TENANT_NKEYS; i++) {
    if (strcmp(name, srv_tenant_keys[i]) != 0) continue;
    if (t->set & (1u << i)) {
      snprintf(err, errlen, "set twice for tenant %s", t->name);
      return false;
    }
    t->set |= 1u << i;
    return srv_tenant_set(t, i, value, err, errlen);
  }
  snprintf(err, errlen,
           "unknown key of a tenant: expected identities, memory_quota, "
           "max_sessions, max_lease_seconds, priority, weight, "
           "storage_roots or devices");
  return false;
}

/* True when the comma list `list` holds `item`. */
static bool srv_list_has(const char *list, const char *item) {
  size_t n = strlen(item);
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && strncmp(p, item, n) == 0) return true;
    p += len;
    if (*p == ',') p++;
  }
  return false;
}

/* Each root of `t` must be one of [storage] roots, as written there. */
static int srv_check_tenant_roots(const srv_options *o,
                                  const srv_tenant_conf *t, const char *where,
                                  srv_config_report_fn report) {
  int errors = 0;
  char msg[SRV_ROOT_MAX + 256];
  for (const char *p = t->storage_roots; *p;) {
    size_t len = strcspn(p, ",");
    bool found = false;
    for (int i = 0; i < o->num_storage_roots && !found; i++)
      found = strlen(o->storage_roots[i]) == len &&
              strncmp(o->storage_roots[i], p, len) == 0;
    if (!found) {
      snprintf(msg, sizeof(msg),
               "%s: [tenant %s] storage_roots: '%.*s' is not one of [storage] "
               "roots; a tenant may use only roots the daemon has",
               where, t->name, (int)(len > 512 ? 512 : len), p);
      report(true, msg);
      errors++;
    }
    p += len;
    if (*p == ',') p++;
  }
  return errors;
}

int srv_check_tenants(const srv_options *o, srv_config_report_fn report) {
  int errors = 0;
  char msg[1024];
  const char *where = o->config_loaded ? o->config_path : "configuration";
  for (int i = 0; i < o->num_tenants; i++) {
    const srv_tenant_conf *t = &o->tenants[i];
    if (!t->identities[0]) {
      snprintf(msg, sizeof(msg),
               "%s:%d: [tenant %s] has no identities: nobody could use it "
               "(expected identities = a, b, ...)",
               where, t->line, t->name);
      report(false, msg);
    }
    if (t->max_lease_s > o->limits.max_lease_s) {
      snprintf(msg, sizeof(msg),
               "%s:%d: [tenant %s] max_lease_seconds %u is over [sessions] "
               "max_lease_seconds %u; expected at most that",
               where, t->line, t->name, t->max_lease_s, o->limits.max_lease_s);
      report(true, msg);
      errors++;
    }
    errors += srv_check_tenant_roots(o, t, where, report);
    /* A cpu mesh's size is known here; a cuda mesh's once it starts
     * (auth.c checks again against the engine). */
    for (int k = 0; k < t->num_devices && strcmp(o->backend, "cpu") == 0; k++)
      if (t->devices[k] >= o->num_devices) {
        snprintf(msg, sizeof(msg),
                 "%s:%d: [tenant %s] devices: device %d is not in the mesh, "
                 "which has devices 0..%d ([devices] devices = %d)",
                 where, t->line, t->name, t->devices[k], o->num_devices - 1,
                 o->num_devices);
        report(true, msg);
        errors++;
      }
    /* An identity in two tenants would make its sessions' tenant depend on
     * the order of the file. */
    for (const char *p = t->identities; *p;) {
      size_t len = strcspn(p, ",");
      char id[SRV_IDENTITY_NAME_MAX + 1];
      snprintf(id, sizeof(id), "%.*s", (int)len, p);
      for (int j = 0; j < i; j++)
        if (srv_list_has(o->tenants[j].identities, id)) {
          snprintf(msg, sizeof(msg),
                   "%s:%d: identity '%.512s' is in [tenant %s] and [tenant "
                   "%s]; expected one tenant per identity",
                   where, t->line, id, o->tenants[j].name, t->name);
          report(true, msg);
          errors++;
        }
      p += len;
      if (*p == ',') p++;
    }
  }
  return errors;
}
