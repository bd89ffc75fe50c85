/* Numbers from the environment: one parser, one range check, one warning (shm/env.h). */
#include "shm/env.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "shm/log.h"

#define WINDOW_TOP 0x800000000000ull /* the end of user space on x86-64 */

static int digit(char c, unsigned base) {
  unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
               : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
               : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                      : 99u;
  return d < base ? (int)d : -1;
}

/* The digits at *sp (at least one), leaving *sp after them. Hand-written rather than
 * strtoull, which takes a sign ("-1" is 2^64 - 1), leading spaces and octal. */
static int parse_digits(const char **sp, uint64_t *out) {
  const char *s = *sp;
  unsigned base = 10;
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) base = 16, s += 2;
  uint64_t v = 0;
  const char *first = s;
  for (int d; (d = digit(*s, base)) >= 0; s++) {
    if (v > (UINT64_MAX - (uint64_t)d) / base) return CXR_EINVAL; /* overflow */
    v = v * base + (uint64_t)d;
  }
  if (s == first) return CXR_EINVAL;
  *sp = s;
  *out = v;
  return 0;
}

static unsigned unit_shift(char c) {
  return c == 'k' || c == 'K' ? 10 : c == 'm' || c == 'M' ? 20 : c == 'g' || c == 'G' ? 30 : 0;
}

int cxr__parse_u64(const char *s, bool units, uint64_t *out) {
  uint64_t v;
  if (s == NULL || out == NULL || parse_digits(&s, &v) != 0) return CXR_EINVAL;
  unsigned sh = units ? unit_shift(*s) : 0;
  if (sh) {
    if (v > UINT64_MAX >> sh) return CXR_EINVAL;
    v <<= sh, s++;
  }
  if (*s != '\0') return CXR_EINVAL;
  *out = v;
  return 0;
}

/* Whether "name=value" has not been warned about yet (and is now marked). A small table:
 * past 32 distinct bad settings every one is warned about again, which is still bounded
 * by what the environment holds. */
static bool first_warning(const char *name, const char *value) {
  static _Atomic uint64_t seen[32];
  uint64_t h = 1469598103934665603ull; /* FNV-1a over name '=' value */
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  h = (h ^ '=') * 1099511628211ull;
  for (const char *p = value; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  if (h == 0) h = 1;
  for (size_t i = 0; i < sizeof seen / sizeof *seen; i++) {
    uint64_t cur = atomic_load(&seen[i]);
    if (cur == h) return false;
    if (cur == 0 && atomic_compare_exchange_strong(&seen[i], &cur, h)) return true;
    if (cur == h) return false; /* another thread marked it first */
  }
  return true;
}

static int env_read(const char *name, bool units, uint64_t dflt, uint64_t min, uint64_t max,
                    uint64_t *out) {
  const char *s = getenv(name);
  uint64_t v;
  *out = dflt;
  if (s == NULL || *s == '\0') return 0;
  if (cxr__parse_u64(s, units, &v) == 0 && v >= min && v <= max) {
    *out = v;
    return 0;
  }
  if (first_warning(name, s))
    CXR_WARN("%s=%s: not a number from %llu to %llu%s; using the default, %llu", name, s,
             (unsigned long long)min, (unsigned long long)max, units ? " (k/M/G allowed)" : "",
             (unsigned long long)dflt);
  return CXR_EINVAL;
}

int cxr__env_u64(const char *name, uint64_t dflt, uint64_t min, uint64_t max, uint64_t *out) {
  return env_read(name, false, dflt, min, max, out);
}

int cxr__env_bytes(const char *name, uint64_t dflt, uint64_t min, uint64_t max,
                   uint64_t *out) {
  return env_read(name, true, dflt, min, max, out);
}

bool cxr__window_ok(uint64_t base, uint64_t size) {
  return size != 0 && base % CXR__WINDOW_ALIGN == 0 && size % CXR__WINDOW_ALIGN == 0 &&
         base + size > base && base + size <= WINDOW_TOP;
}

int cxr__parse_window(const char *s, uintptr_t *base, size_t *size) {
  uint64_t lo, hi;
  if (s == NULL || base == NULL || size == NULL || parse_digits(&s, &lo) != 0 || *s++ != '-' ||
      parse_digits(&s, &hi) != 0 || *s != '\0')
    return CXR_EINVAL;
  if (hi <= lo || !cxr__window_ok(lo, hi - lo)) return CXR_EINVAL;
  *base = (uintptr_t)lo;
  *size = (size_t)(hi - lo);
  return 0;
}
