/* The rule for names of functions, arguments, nodes, outputs and origins
 * (fn_name_is_valid, fn_call.h), their rendering in messages
 * (fn_name_printable), and the check of a node's other strings
 * (fn_check_node_strings): every string a graph holds is well-formed UTF-8
 * (proto3 strings are; Python's protobuf will not parse a reply carrying
 * other bytes), names without ':', spaces or control characters, so a name
 * in any language is kept and shown exactly as given and none can forge a
 * terminal's or a log's text. Source: RFC 3629 (well-formed UTF-8). */
#include <stdio.h>
#include <string.h>

#include "../../common/common.h"
#include "fn_call.h"

/* The code point of the n-byte character at s. */
static unsigned utf8_cp(const unsigned char *s, size_t n) {
  if (n == 1) return s[0];
  unsigned cp = s[0] & (0x7F >> n);
  for (size_t i = 1; i < n; i++) cp = (cp << 6) | (s[i] & 0x3F);
  return cp;
}

/* Characters a name must not hold: controls (C0, DEL, C1), spaces and the
 * invisible format characters (so two names never look alike), ':'. */
static bool name_char_bad(unsigned cp) {
  return cp <= 0x20 || cp == ':' || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F) ||
         cp == 0x3000 || cp == 0xFEFF;
}

bool fn_name_is_valid(const char *s, size_t *bad_at) {
  size_t len = s ? strlen(s) : 0;
  if (bad_at) *bad_at = (size_t)-1;
  if (len == 0 || len > DEV_FN_NAME_MAX) return false;
  const unsigned char *p = (const unsigned char *)s;
  for (size_t k = 0; k < len;) {
    size_t n = pdcom_utf8_len(p + k);
    if (!n || name_char_bad(utf8_cp(p + k, n))) {
      if (bad_at) *bad_at = k;
      return false;
    }
    k += n;
  }
  return true;
}

char *fn_name_printable(const char *in, char *out, size_t len) {
  if (!len) return out;
  const unsigned char *p = (const unsigned char *)(in ? in : "");
  size_t j = 0;
  while (*p) {
    size_t n = pdcom_utf8_len(p);
    unsigned cp = n ? utf8_cp(p, n) : 0;
    bool keep = n && cp >= 0x20 && !(cp >= 0x7F && cp < 0xA0);
    char esc[5];
    const char *src = keep ? (const char *)p : esc;
    size_t w = keep ? n : 4;
    if (!keep) snprintf(esc, sizeof esc, "\\x%02X", *p);
    if (j + w >= len) break;
    memcpy(out + j, src, w);
    j += w;
    p += keep ? n : 1;
  }
  out[j] = '\0';
  return out;
}

/* Text of a string attribute: well-formed UTF-8 without control
 * characters (proto3 strings are UTF-8), or the offset of the first bad
 * byte. */
static long text_bad_at(const char *s, size_t len) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t k = 0; k < len;) {
    size_t n = k < len ? pdcom_utf8_len(p + k) : 0;
    unsigned cp = n && k + n <= len ? utf8_cp(p + k, n) : 0;
    if (!n || k + n > len || cp < 0x20 || (cp >= 0x7F && cp < 0xA0))
      return (long)k;
    k += n;
  }
  return -1;
}

/* Node i's origins (names of registered nodes: the name rule) and, in an
 * external pass's result, its string attributes (UTF-8 text): so that
 * every string a described graph carries can be sent and parsed. */
pd_code fn_check_node_strings(const dev_fn_def *d, int i, bool external,
                              dev_status *st) {
  const dev_fn_node *n = &d->nodes[i];
  char shown[4 * 140 + 1];
  if (n->num_origins < 0 || (n->num_origins && !n->origins))
    return dev_error(st, PD_INVALID_ARGUMENT,
                     "function '%s', node '%s': %d origins without a list",
                     d->name, n->name, n->num_origins);
  for (int k = 0; k < n->num_origins; k++)
    if (!fn_name_is_valid(n->origins[k], NULL))
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "function '%s', node '%s': origin %d '%s' is not a node name; "
          "expected 1 to %d bytes of UTF-8 text without ':', spaces or "
          "control characters",
          d->name, n->name, k,
          fn_name_printable(n->origins[k] ? n->origins[k] : "(null)", shown,
                            sizeof shown),
          DEV_FN_NAME_MAX);
  for (int j = 0; external && j < n->num_attrs; j++) {
    const dev_attr *a = &n->attrs[j];
    if (!a->name || !fn_name_is_valid(a->name, NULL))
      return dev_error(
          st, PD_INVALID_ARGUMENT,
          "function '%s', node '%s': attribute %d has name '%s'; "
          "expected an attribute of op '%.128s'",
          d->name, n->name, j,
          fn_name_printable(a->name ? a->name : "(null)", shown, sizeof shown),
          n->op ? n->op : "");
    if (a->value.type != DEV_ATTR_STRING) continue;
    long at = a->value.u.s.len && !a->value.u.s.ptr
                  ? 0
                  : text_bad_at(a->value.u.s.ptr, a->value.u.s.len);
    if (at >= 0)
      return dev_error(st, PD_INVALID_ARGUMENT,
                       "function '%s', node '%s': string attribute '%s': "
                       "byte %ld (0x%02X) is not UTF-8 text without control "
                       "characters",
                       d->name, n->name, a->name, at,
                       a->value.u.s.ptr
                           ? (unsigned)(unsigned char)a->value.u.s.ptr[at]
                           : 0u);
  }
  return PD_OK;
}
