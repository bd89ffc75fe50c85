/* The address window as the sandbox sees it: the same $CXRPC_WINDOW and defaults as shm's
 * cxr_init, read without reserving anything (the launcher needs it before exec). */
#include <stdlib.h>

#include "sandbox/internal.h"

#define DEFAULT_BASE 0x600000000000ull
#define DEFAULT_SIZE 0x100000000000ull

int cxr__sbx_parse_window(const char *s, uintptr_t *base, size_t *size) {
  if (!s || !base || !size) return CXR_EINVAL;
  char *end = NULL;
  unsigned long long lo = strtoull(s, &end, 0);
  if (!end || *end != '-') return CXR_EINVAL;
  unsigned long long hi = strtoull(end + 1, &end, 0);
  if (!end || *end != '\0' || hi <= lo || (lo % CXR__PAGE) || (hi % CXR__PAGE)) return CXR_EINVAL;
  *base = (uintptr_t)lo;
  *size = (size_t)(hi - lo);
  return 0;
}

int cxr__sbx_window(uintptr_t *base, size_t *size) {
  if (!base || !size) return CXR_EINVAL;
  const char *w = getenv("CXRPC_WINDOW");
  if (w && *w && cxr__sbx_parse_window(w, base, size) == 0) return 0;
  *base = DEFAULT_BASE;
  *size = DEFAULT_SIZE;
  return 0;
}
