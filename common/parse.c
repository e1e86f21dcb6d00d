/* Number parsing that the daemon's configuration and the paradev command
 * share (common.h). */
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
