/* What both halves of calls across racks use: spare heaps, replicas, target parsing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rpc/remote_int.h"

bool cxr__rem_inside(uint64_t a, uint64_t len, uintptr_t base, size_t size) {
  return a >= base && len <= size && a - base <= size - len;
}

/* ---- spare heaps (only heaps with no live allocation are kept) ---- */

cxr_heap *cxr__rem_spare_take(spares *s, size_t size) {
  cxr_heap *h = NULL;
  pthread_mutex_lock(&s->lock);
  for (unsigned i = 0; i < s->n && h == NULL; i++)
    if (cxr_heap_size(s->h[i]) == size) {
      h = s->h[i];
      s->h[i] = s->h[--s->n];
    }
  pthread_mutex_unlock(&s->lock);
  return h;
}

void cxr__rem_spare_give(spares *s, cxr_heap *h) {
  if (h == NULL) return;
  cxr_heap_stats st;
  bool keep = cxr_heap_stats(h, &st) == 0 && st.used == 0;
  pthread_mutex_lock(&s->lock);
  if (keep && s->n < sizeof s->h / sizeof s->h[0]) {
    s->h[s->n++] = h;
    h = NULL;
  }
  pthread_mutex_unlock(&s->lock);
  if (h) cxr_heap_close(h);
}

void cxr__rem_spares_drop(spares *s) {
  pthread_mutex_lock(&s->lock);
  while (s->n) cxr_heap_close(s->h[--s->n]);
  pthread_mutex_unlock(&s->lock);
}

/* Creates a heap whose name goes at once (the file goes with the last mapping). */
int cxr__rem_heap_new(cxr_heap **h, const char *prefix, const char *chan, size_t size) {
  static _Atomic unsigned seq;
  char name[CXR_NAME_MAX + 1];
  snprintf(name, sizeof name, "%s.%.32s.%d.%u", prefix, chan, (int)getpid(), seq++);
  int rc = cxr_heap_create(h, name, size, NULL);
  if (rc == 0) cxr_heap_unlink(name);
  return rc;
}

/* ---- replicas: plain memory at a peer's heap address, inside our window ---- */

static pthread_mutex_t rep_lock = PTHREAD_MUTEX_INITIALIZER;

/* Is [a, a + len) only our PROT_NONE window reservation (no heap, no other replica)? */
static int range_free(uintptr_t a, size_t len) {
  uintptr_t wb;
  size_t ws;
  int rc = cxr_window(&wb, &ws);
  if (rc) return rc;
  if (!cxr__rem_inside(a, len, wb, ws) || a % 4096 || len % 4096 || len == 0) return CXR_ERANGE;
  FILE *f = fopen("/proc/self/maps", "re");
  if (f == NULL) return CXR_EIO;
  char line[512];
  uintptr_t covered = a;
  rc = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (hi <= a || lo >= a + len) continue;
    if (strcmp(perms, "---p") != 0) {
      rc = CXR_EADDRINUSE;
      break;
    }
    if (lo <= covered && hi > covered) covered = hi;
  }
  fclose(f);
  if (rc == 0 && covered < a + len) rc = CXR_EADDRINUSE;
  return rc;
}

int cxr__rem_replica_map(uintptr_t a, size_t len) {
  pthread_mutex_lock(&rep_lock);
  int rc = range_free(a, len);
  if (rc == 0) {
    void *p = mmap((void *)a, len, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) rc = cxr__from_errno(errno);
  }
  pthread_mutex_unlock(&rep_lock);
  if (rc) CXR_WARN("remote: cannot place a replica at %#lx (+%zu): %s", (unsigned long)a, len,
                   cxr_strerror(rc));
  return rc;
}

/* Gives the range back to the window reservation. */
void cxr__rem_replica_unmap(uintptr_t a, size_t len) {
  pthread_mutex_lock(&rep_lock);
  mmap((void *)a, len, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
       0);
  pthread_mutex_unlock(&rep_lock);
}

/* "ucx://HOST:PORT/name" -> "HOST:PORT", "name" */
int cxr__rem_parse_target(const char *t, char *host, size_t hlen, char *name, size_t nlen) {
  if (strncmp(t, "ucx://", 6) != 0) return CXR_EINVAL;
  t += 6;
  const char *slash = strchr(t, '/');
  if (slash == NULL || slash == t || slash[1] == '\0') return CXR_EINVAL;
  if ((size_t)(slash - t) >= hlen) return CXR_ENAMETOOLONG;
  if (strlen(slash + 1) > CXR__CHAN_NAME_MAX || strlen(slash + 1) >= nlen) return CXR_ENAMETOOLONG;
  memcpy(host, t, (size_t)(slash - t));
  host[slash - t] = '\0';
  snprintf(name, nlen, "%s", slash + 1);
  return 0;
}
