/* The address window as the sandbox sees it: the same $CXRPC_WINDOW, parser and defaults as
 * shm's cxr_init, read without reserving anything (the launcher needs it before exec). */
#include <stdlib.h>

#include "sandbox/internal.h"
#include "shm/env.h"
#include "shm/log.h"

#define DEFAULT_BASE 0x600000000000ull
#define DEFAULT_SIZE 0x100000000000ull

int cxr__sbx_window(uintptr_t *base, size_t *size) {
  if (!base || !size) return CXR_EINVAL;
  const char *w = getenv("CXRPC_WINDOW");
  if (w && *w) {
    if (cxr__parse_window(w, base, size) == 0) return 0;
    /* cxr_init refuses it; the launcher goes on with the default to say so in the child */
    CXR_WARN("CXRPC_WINDOW=%s: expected 0xLO-0xHI, 2 MiB aligned; using the default", w);
  }
  *base = DEFAULT_BASE;
  *size = DEFAULT_SIZE;
  return 0;
}
