/* The check validators and handlers make before following a peer's pointer. */
#include "sandbox/internal.h"

int cxr_range_check(const cxr_range *r, const void *p, size_t len, size_t align) {
  if (!r || !r->p || !p) return CXR_EBADPTR;
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)r->p;
  if (lo + r->len < lo || a + len < a) return CXR_EBADPTR; /* wraps */
  if (a < lo || a + len > lo + r->len) return CXR_EBADPTR;
  if (align > 1 && (a % align)) return CXR_EBADPTR;
  return 0;
}
