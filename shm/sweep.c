/*
 * Heaps seen from outside (without joining them): holders and usage read from a read-only
 * mapping anywhere, removal of heaps marked for removal that nobody holds, stray files,
 * and cxr_registry_list for cxrpcctl.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/internal.h"
#include "shm/proc.h"
#include "shm/registry.h"

unsigned cxr__rt_pod(void);

/* ---------------- removal of heaps nobody holds ---------------- */

typedef struct peek {
  unsigned live, dead;
  int64_t oldest_lease;
  size_t used;
  bool ok;
} peek;

/* Reads the holders and usage of the heap file at `path` without joining it (mapped
 * anywhere, read-only); pk->ok when its header is a heap's (and entry e's, given e). */
static void peek_path(const char *path, const cxr__reg_entry *e, peek *pk) {
  memset(pk, 0, sizeof *pk);
  /* Any process of the pod can write the registry, path included: a FIFO named there
   * blocked this open (no O_NONBLOCK) for good, with the registry lock held (a review,
   * 2026-11-28). Only a regular file or a device is looked at. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return;
  struct stat st;
  cxr__hdr hdr;
  if (fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)) &&
      cxr__check_header(fd, e, &hdr) == 0) {
    void *p = mmap(NULL, hdr.size, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      const cxr__hdr *h = p;
      cxr__geo g;
      cxr__geo_init(&g, p, &hdr);
      int64_t now = cxr__realtime_ns();
      for (unsigned i = 0; i < CXR_MAX_HOLDERS; i++) {
        const cxr__slot *s = &h->slots[i];
        if (atomic_load(&s->state) != CXR_SLOT_LIVE) continue;
        if (cxr__slot_dead(s, now)) pk->dead++;
        else pk->live++;
        int64_t l = atomic_load(&s->lease_ns);
        if (pk->oldest_lease == 0 || l < pk->oldest_lease) pk->oldest_lease = l;
      }
      size_t cached;
      cxr__heap_usage(&g, &pk->used, &cached);
      pk->ok = true;
      munmap(p, hdr.size);
    }
  }
  close(fd);
}

static void peek_heap(const cxr__reg_entry *e, peek *pk) { peek_path(e->path, e, pk); }

bool cxr__is_device(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && !S_ISREG(st.st_mode);
}

/* Whether a regular file no entry names may go: one whose header is not a heap's (a
 * creator died before writing it), or a heap no live process holds. Any process of the pod
 * can rewrite an entry's path, which made a live channel's heap a "stray" that the next
 * listing (cxrpcctl channels) removed (a review, 2026-11-28). */
static bool stray_unused(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  peek pk;
  peek_path(path, NULL, &pk);
  return !pk.ok || pk.live == 0;
}

/* Heap files in the root that no entry names: left by a creator that died between
 * creating the file and registering it, or by a process that died holding a heap it had
 * unlinked. Safe under the registry lock (creation holds it). */
static void sweep_strays(cxr__reg *r) {
  const char *root = cxr_root();
  DIR *d = root ? opendir(root) : NULL;
  if (d == NULL) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    size_t len = strlen(de->d_name);
    bool heap = len > 5 && strcmp(de->d_name + len - 5, ".heap") == 0;
    bool unl = len > 9 && de->d_name[0] == '.' && strcmp(de->d_name + len - 9, ".unlinked") == 0;
    if (!heap && !unl) continue;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", root, de->d_name);
    bool named = false;
    for (unsigned i = 0; i < CXR_REG_ENTRIES && !named; i++)
      named = r->f->e[i].used && strcmp(r->f->e[i].path, path) == 0;
    if (!named && stray_unused(path)) {
      CXR_INFO("removing stray heap file %s", path);
      unlink(path);
    }
  }
  closedir(d);
}

/* Removes entries (and files) of heaps marked for removal that no live process holds. */
void cxr__sweep(cxr__reg *r, cxr__reg_entry *only) {
  if (only == NULL) sweep_strays(r);
  for (unsigned i = 0; i < CXR_REG_ENTRIES; i++) {
    cxr__reg_entry *e = &r->f->e[i];
    if (!e->used || (only && e != only)) continue;
    if (!(e->flags & (CXR_REG_UNLINKED | CXR_HF_REMOVE_ON_CLOSE))) continue;
    cxr__map *m = cxr__map_find(e->name, e->generation);
    if (m != NULL && m->refs > 0) continue; /* held by this process */
    peek pk;
    peek_heap(e, &pk);
    if (pk.ok && pk.live > 0) continue;
    if (!pk.ok && access(e->path, F_OK) == 0 && !(e->flags & CXR_REG_UNLINKED)) continue;
    CXR_INFO("removing heap %s (%s): no live holder", e->name, e->path);
    /* The file goes only when it is this entry's heap (its header says so): a path written
     * into the registry by another process named any file the sweeper may remove (a
     * review, 2026-11-28). A heap whose header was damaged leaves its file behind. */
    if (pk.ok && !cxr__is_device(e->path)) unlink(e->path);
    cxr__reg_remove(r, e);
  }
}

/* ---------------- the registry from outside ---------------- */

int cxr_registry_list(cxr_heap_info *out, size_t max, size_t *n) {
  if (n == NULL || (out == NULL && max > 0)) return CXR_EINVAL;
  *n = 0;
  int rc = cxr__rt_ensure();
  if (rc) return rc;
  cxr__rt_lock();
  cxr__reg r;
  rc = cxr__reg_lock(&r, false);
  if (rc == CXR_ENOENT) {
    cxr__rt_unlock();
    return 0;
  }
  if (rc) {
    cxr__rt_unlock();
    return rc;
  }
  cxr__sweep(&r, NULL);
  size_t k = 0;
  int64_t now = cxr__realtime_ns();
  for (unsigned i = 0; i < CXR_REG_ENTRIES; i++) {
    cxr__reg_entry *e = &r.f->e[i];
    if (!e->used) continue;
    if (k < max) {
      cxr_heap_info *hi = &out[k];
      memset(hi, 0, sizeof *hi);
      cxr__copy_str(hi->name, sizeof hi->name, e->name);
      cxr__copy_str(hi->path, sizeof hi->path, e->path);
      hi->addr = e->addr;
      hi->size = e->size;
      hi->generation = e->generation;
      peek pk;
      peek_heap(e, &pk);
      hi->used = pk.used;
      hi->holders = pk.live;
      hi->dead_holders = pk.dead;
      hi->lease_age_ns = pk.oldest_lease ? now - pk.oldest_lease : -1;
    }
    k++;
  }
  *n = k;
  cxr__reg_unlock(&r);
  cxr__rt_unlock();
  return 0;
}
