/* `cxrpcctl heaps` (see heaps.h). Reads the registry and each heap's header from outside,
 * without joining the heap, except with --reap. */
#include "tools/heaps.h"

#include <stdlib.h>
#include <string.h>

#include <cxrpc/shm.h>

#define MAX_HEAPS 256

static void human(char *buf, size_t n, unsigned long long v) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  double d = (double)v;
  while (d >= 1024 && i < 4) {
    d /= 1024;
    i++;
  }
  snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", d, u[i]);
}

static const char *lease_state(const cxr_heap_info *h, char *buf, size_t n) {
  if (h->dead_holders) snprintf(buf, n, "dead:%u", h->dead_holders);
  else if (h->holders == 0) snprintf(buf, n, "unheld");
  else snprintf(buf, n, "ok %.1fs", (double)h->lease_age_ns / 1e9);
  return buf;
}

int cxr__ctl_heaps(int argc, char **argv, FILE *out) {
  int reap = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reap")) reap = 1;
    else {
      fprintf(stderr, "usage: cxrpcctl heaps [--reap]\n");
      return 2;
    }
  }
  cxr_heap_info *info = calloc(MAX_HEAPS, sizeof *info);
  if (!info) return 1;
  size_t n = 0;
  int rc = cxr_registry_list(info, MAX_HEAPS, &n);
  if (rc) {
    fprintf(stderr, "cxrpcctl heaps: %s (root %s)\n", cxr_strerror(rc), cxr_root() ? cxr_root() : "?");
    free(info);
    return 1;
  }
  if (reap) {
    /* Joining a heap recovers its dead holders (and cxr_heap_reap any left). */
    for (size_t i = 0; i < n && i < MAX_HEAPS; i++) {
      if (info[i].dead_holders == 0 || !info[i].name[0]) continue;
      cxr_heap *h;
      rc = cxr_heap_open(&h, info[i].name);
      if (rc) {
        fprintf(out, "cannot reap %s: %s\n", info[i].name, cxr_strerror(rc));
        continue;
      }
      cxr_heap_reap(h);
      cxr_heap_close(h);
      fprintf(out, "reaped %u dead holder(s) of %s\n", info[i].dead_holders, info[i].name);
    }
    rc = cxr_registry_list(info, MAX_HEAPS, &n);
    if (rc) n = 0;
  }
  fprintf(out, "root: %s\n", cxr_root());
  fprintf(out, "%-24s %-16s %10s %10s %5s %7s %-12s %s\n", "NAME", "ADDRESS", "SIZE", "USED", "USE%",
          "HOLDERS", "LEASE", "PATH");
  for (size_t i = 0; i < n && i < MAX_HEAPS; i++) {
    const cxr_heap_info *h = &info[i];
    char sz[32], us[32], ls[32];
    human(sz, sizeof sz, h->size);
    human(us, sizeof us, h->used);
    fprintf(out, "%-24s %#-16lx %10s %10s %4.1f%% %7u %-12s %s\n", h->name[0] ? h->name : "(unlinked)",
            (unsigned long)h->addr, sz, us, h->size ? 100.0 * (double)h->used / (double)h->size : 0.0,
            h->holders, lease_state(h, ls, sizeof ls), h->path);
  }
  fprintf(out, "%zu heap(s)\n", n);
  free(info);
  return 0;
}
