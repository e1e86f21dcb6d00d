/* Text the engine, the daemon and the paradev command parse alike
 * (common.h): numbers of the configuration, UTF-8 characters of names and
 * log lines. */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.h"

bool pdcom_parse_size(const char *s, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k')
    shift = 10, end++;
  else if (*end == 'M' || *end == 'm')
    shift = 20, end++;
  else if (*end == 'G' || *end == 'g')
    shift = 30, end++;
  else if (*end == 'T' || *end == 't')
    shift = 40, end++;
  if (shift && (*end == 'i' || *end == 'B')) end += *end == 'i' ? 1 : 0;
  if (shift && *end == 'B') end++;
  if (*end) return false;
  if (shift && v > (ULLONG_MAX >> shift)) return false;
  *out = (uint64_t)v << shift;
  return true;
}

size_t pdcom_utf8_len(const unsigned char *s) {
  unsigned c = s[0];
  size_t n;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4;
  else
    return 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0) ||
      (c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90))
    return 0;
  return n;
}
