/*
 * Heaps: files under the pod root (or an explicit file / DAX device) mapped through
 * libpmem2 at the address recorded in their header (every header field checked first),
 * create / open / close / unlink, and the accessors. Leases are in lease.c, removal of
 * heaps nobody holds in sweep.c.
 *
 * Lock order: runtime mutex -> registry flock -> heap lock.
 */
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
#include "shm/reg_deadline.h"
#include "shm/registry.h"

unsigned cxr__rt_pod(void);

/* Bounded copy that always terminates (names and paths were length-checked before). */
void cxr__copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

void cxr_heap_opts_init(cxr_heap_opts *o) {
  if (o == NULL) return;
  memset(o, 0, sizeof *o);
  o->mode = 0600;
}

static int check_name(const char *name) {
  if (name == NULL || *name == '\0') return CXR_EINVAL;
  size_t n = strnlen(name, CXR_NAME_MAX + 1);
  if (n > CXR_NAME_MAX) return CXR_ENAMETOOLONG;
  if (strchr(name, '/') || name[0] == '.') return CXR_EINVAL;
  return 0;
}

/* ---------------- header checks ---------------- */

int cxr__file_size(int fd, uint64_t *size) {
  struct pmem2_source *src;
  size_t s = 0;
  if (pmem2_source_from_fd(&src, fd) != 0) return CXR_EIO;
  int prc = pmem2_source_size(src, &s);
  pmem2_source_delete(&src);
  if (prc != 0) return CXR_EIO;
  *size = s;
  return 0;
}

/* Every field of the header, before anything is mapped at the address it names. */
int cxr__check_header(int fd, const cxr__reg_entry *e, cxr__hdr *out) {
  uint64_t fsize;
  int rc = cxr__file_size(fd, &fsize);
  if (rc) return rc;
  if (fsize < sizeof(cxr__hdr)) return CXR_ETRUNCATED;
  if (pread(fd, out, sizeof *out, 0) != (ssize_t)sizeof *out) return CXR_ETRUNCATED;
  if (out->magic != CXR_HEAP_MAGIC) return CXR_EBADMAGIC;
  if (out->version != CXR_HEAP_VERSION || out->hdr_size != sizeof(cxr__hdr) ||
      (out->flags & ~(uint32_t)(CXR_HF_KEEP_ORPHANS | CXR_HF_REMOVE_ON_CLOSE)) != 0)
    return CXR_EVERSION;
  if (fsize < out->size) return CXR_ETRUNCATED;
  if (out->size < CXR_HEAP_MIN || out->size % CXR_PAGE || out->addr % CXR_PAGE ||
      !cxr__rt_in_window(out->addr, out->size))
    return CXR_ERANGE;
  if (memchr(out->name, '\0', sizeof out->name) == NULL) return CXR_ECORRUPT;
  uint64_t mo, dof, np;
  cxr__geometry(out->size, &mo, &dof, &np);
  if (mo != out->map_off || dof != out->data_off || np != out->npages) return CXR_ECORRUPT;
  /* The size too: a holder can grow the file and write a larger size with a geometry to
   * match, and the mapping would then cover the heaps after this one's range. */
  if (e && (e->addr != out->addr || e->size != out->size || e->generation != out->generation ||
            strncmp(e->name, out->name, sizeof e->name) != 0)) {
    CXR_ERR("heap %s: header disagrees with the registry (addr %#lx/%#lx, size %lu/%lu, "
            "gen %lu/%lu)", e->name, (unsigned long)out->addr, (unsigned long)e->addr,
            (unsigned long)out->size, (unsigned long)e->size, (unsigned long)out->generation,
            (unsigned long)e->generation);
    return CXR_ECORRUPT;
  }
  return 0;
}

/* Whether the file the entry names is that entry's heap (a regular file whose header
 * matches it). Opened without blocking: the path may name a FIFO. */
static bool entry_file_is_heap(const cxr__reg_entry *e) {
  int fd = open(e->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st;
  cxr__hdr hdr;
  bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && cxr__check_header(fd, e, &hdr) == 0;
  close(fd);
  return ok;
}

/* ---------------- mappings and handles ---------------- */

cxr__map *cxr__map_find(const char *name, uint64_t generation) {
  for (cxr__map *m = cxr__maps; m; m = m->next)
    if (m->generation == generation && strcmp(m->name, name) == 0) return m;
  return NULL;
}

static void map_put(cxr__map *m) {
  if (--m->refs > 0) return;
  for (cxr__map **pp = &cxr__maps; *pp; pp = &(*pp)->next)
    if (*pp == m) {
      *pp = m->next;
      break;
    }
  cxr__rt_unmap(&m->pm);
  free(m);
}

static int map_new(int fd, const cxr__hdr *hdr, const char *name, cxr__map **out) {
  cxr__map *m = calloc(1, sizeof *m);
  if (m == NULL) return CXR_ENOMEM;
  int rc = cxr__rt_map(fd, hdr->addr, hdr->size, &m->pm);
  if (rc) {
    free(m);
    return rc;
  }
  cxr__copy_str(m->name, sizeof m->name, name);
  m->generation = hdr->generation;
  m->addr = hdr->addr;
  m->size = hdr->size;
  m->persist = pmem2_get_persist_fn(m->pm);
  cxr__geo_init(&m->g, (void *)hdr->addr, hdr);
  m->refs = 1;
  m->next = cxr__maps;
  cxr__maps = m;
  *out = m;
  return 0;
}

static int handle_new(cxr__map *m, cxr_heap **out) {
  cxr_heap *h = calloc(1, sizeof *h);
  if (h == NULL) return CXR_ENOMEM;
  h->magic = CXR_HANDLE_MAGIC;
  h->m = m;
  h->base = (char *)m->addr;
  h->hdr = (cxr__hdr *)m->addr;
  h->g = m->g;
  h->pm = m->g.pm;
  h->npages = m->g.npages;
  h->data_off = m->g.data_off;
  h->size = m->g.size;
  h->serial = cxr__rt_next_serial();
  h->epoch = cxr__fork_epoch;
  int rc = cxr__heap_lock(h);
  if (rc == 0) {
    cxr__heap_reap_locked(h); /* dead holders are recovered whenever someone joins */
    rc = cxr__slot_take(h);
    cxr__heap_unlock(h);
  }
  if (rc) {
    free(h);
    return rc;
  }
  m->refs++;
  h->next = cxr__heaps;
  cxr__heaps = h;
  *out = h;
  return 0;
}

/* ---------------- create / open / close / unlink ---------------- */

static void format(cxr__hdr *hdr, const char *name, uint64_t size, uint64_t addr,
                   uint64_t generation, uint32_t flags) {
  memset(hdr, 0, sizeof *hdr);
  hdr->version = CXR_HEAP_VERSION;
  hdr->hdr_size = sizeof(cxr__hdr);
  hdr->size = size;
  hdr->addr = addr;
  hdr->generation = generation;
  cxr__copy_str(hdr->name, sizeof hdr->name, name);
  hdr->flags = flags;
  hdr->owner_pid = (int32_t)getpid();
  cxr__geometry(size, &hdr->map_off, &hdr->data_off, &hdr->npages);
  /* The lock is all zero (unlocked) after the memset. */
  cxr__geo g;
  cxr__geo_init(&g, hdr, hdr); /* not shared yet: its own fields are trusted */
  cxr__heap_format(&g);
}

int cxr_heap_create(cxr_heap **out, const char *name, size_t size, const cxr_heap_opts *o) {
  if (out == NULL) return CXR_EINVAL;
  *out = NULL;
  int rc = check_name(name);
  if (rc) return rc;
  cxr_heap_opts d;
  cxr_heap_opts_init(&d);
  if (o == NULL) o = &d;
  if (size < CXR_HEAP_MIN || size > (1ull << 44)) return CXR_EINVAL;
  size = (size + CXR_PAGE - 1) & ~(size_t)(CXR_PAGE - 1);
  if (o->addr % CXR_PAGE) return CXR_EINVAL;
  rc = cxr__rt_ensure();
  if (rc) return rc;
  char path[PATH_MAX];
  if (o->path) {
    if (strlen(o->path) >= sizeof((cxr__reg_entry *)0)->path) return CXR_ENAMETOOLONG;
    cxr__copy_str(path, sizeof path, o->path);
  } else {
    int n = snprintf(path, sizeof path, "%s/%s.heap", cxr_root(), name);
    if (n < 0 || (size_t)n >= sizeof((cxr__reg_entry *)0)->path) return CXR_ENAMETOOLONG;
  }
  uint32_t flags = (o->keep_orphans ? CXR_HF_KEEP_ORPHANS : 0) |
                   (o->remove_on_last_close ? CXR_HF_REMOVE_ON_CLOSE : 0);

  /* By this thread's deadline: another thread may hold the mutex while it waits for the
   * registry's lock. */
  if ((rc = cxr__rt_lock_by(cxr__reg_deadline_get())) != 0) return rc;
  cxr__reg r;
  rc = cxr__reg_lock(&r, true);
  if (rc) {
    cxr__rt_unlock();
    return rc;
  }
  cxr__sweep(&r, NULL);
  int fd = -1;
  cxr__map *m = NULL;
  cxr__reg_entry *e = NULL;
  uint64_t addr = 0;
  bool created_file = false;
  if (cxr__reg_find(&r, name)) {
    rc = CXR_EEXIST;
    goto out;
  }
  for (unsigned i = 0; i < CXR_REG_ENTRIES; i++)
    if (r.f->e[i].used && strcmp(r.f->e[i].path, path) == 0) {
      rc = CXR_EEXIST; /* an explicit path (device) already holds another heap */
      goto out;
    }
  if ((e = cxr__reg_slot(&r)) == NULL) {
    rc = CXR_EFULL;
    goto out;
  }
  rc = cxr__reg_range(&r, size, o->addr, &addr);
  if (rc) goto out;
  if (o->path) {
    /* A file (or device) already there is the caller's: used, but never removed if the
     * create fails below. Only a file made here is. */
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, o->mode ? o->mode : 0600);
    if (fd >= 0) created_file = true;
    else if (errno == EEXIST) fd = open(path, O_RDWR | O_CLOEXEC);
  } else {
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, o->mode ? o->mode : 0600);
    if (fd < 0 && errno == EEXIST) {
      /* Not in the registry: left by a creator that died before registering it. */
      CXR_WARN("removing stale heap file %s", path);
      unlink(path);
      fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, o->mode ? o->mode : 0600);
    }
  }
  if (fd < 0) {
    rc = cxr__from_errno(errno);
    goto out;
  }
  if (!o->path) created_file = true;
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    if (fchmod(fd, o->mode ? o->mode : 0600) != 0 || ftruncate(fd, (off_t)size) != 0) {
      rc = cxr__from_errno(errno);
      goto out;
    }
  } else {
    uint64_t dsize;
    if ((rc = cxr__file_size(fd, &dsize)) != 0) goto out;
    if (dsize < size) {
      rc = CXR_ENOMEM;
      goto out;
    }
  }
  cxr__hdr tmp;
  memset(&tmp, 0, sizeof tmp);
  tmp.addr = addr;
  tmp.size = size;
  tmp.generation = cxr__reg_next_generation(&r);
  cxr__geometry(size, &tmp.map_off, &tmp.data_off, &tmp.npages);
  rc = map_new(fd, &tmp, name, &m);
  if (rc) goto out;
  cxr__hdr *hdr = (cxr__hdr *)addr;
  format(hdr, name, size, addr, tmp.generation, flags);
  m->persist(hdr, hdr->data_off);
  hdr->magic = CXR_HEAP_MAGIC; /* commit: a heap without magic was never finished */
  m->persist(&hdr->magic, sizeof hdr->magic);
  m->refs = 0;
  cxr_heap *h = NULL;
  rc = handle_new(m, &h);
  if (rc) {
    m->refs = 1;
    goto out;
  }
  /* Register last: until then nobody can find it. */
  cxr__copy_str(e->name, sizeof e->name, name);
  memcpy(e->path, path, strlen(path) + 1); /* length checked above */
  e->addr = addr;
  e->size = size;
  e->generation = tmp.generation;
  e->flags = flags;
  e->pod = cxr__rt_pod();
  e->used = 1;
  *out = h;
  m = NULL;
  CXR_INFO("created heap %s at %#lx, %zu bytes, %s", name, (unsigned long)addr, size, path);
out:
  if (m) map_put(m);
  if (rc && created_file && fd >= 0) unlink(path);
  if (fd >= 0) close(fd);
  cxr__reg_unlock(&r);
  cxr__rt_unlock();
  return rc;
}

int cxr_heap_open(cxr_heap **out, const char *name) {
  if (out == NULL) return CXR_EINVAL;
  *out = NULL;
  int rc = check_name(name);
  if (rc) return rc;
  rc = cxr__rt_ensure();
  if (rc) return rc;
  if ((rc = cxr__rt_lock_by(cxr__reg_deadline_get())) != 0) return rc; /* as in create */
  cxr__reg r;
  rc = cxr__reg_lock(&r, false);
  if (rc) {
    cxr__rt_unlock();
    return rc;
  }
  int fd = -1;
  cxr__reg_entry *e = cxr__reg_find(&r, name);
  if (e == NULL) {
    rc = CXR_ENOENT;
    goto out;
  }
  cxr__map *m = cxr__map_find(name, e->generation);
  if (m == NULL) {
    fd = open(e->path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      rc = cxr__from_errno(errno);
      goto out;
    }
    cxr__hdr hdr;
    rc = cxr__check_header(fd, e, &hdr);
    if (rc) {
      CXR_ERR("heap %s (%s): %s", name, e->path, cxr_strerror(rc));
      goto out;
    }
    rc = map_new(fd, &hdr, name, &m);
    if (rc) goto out;
    /* The header may have changed between pread and map: check the mapped copy. */
    cxr__hdr *mh = (cxr__hdr *)m->addr;
    if (mh->magic != CXR_HEAP_MAGIC || mh->size != hdr.size || mh->addr != hdr.addr ||
        mh->generation != hdr.generation) {
      map_put(m);
      rc = CXR_ECORRUPT;
      goto out;
    }
    m->refs = 0;
  }
  rc = handle_new(m, out);
  if (rc && m->refs == 0) {
    m->refs = 1;
    map_put(m);
  }
out:
  if (fd >= 0) close(fd);
  cxr__reg_unlock(&r);
  cxr__rt_unlock();
  return rc;
}

/* Drops h's lease; the caller holds the runtime mutex. Removes the heap when it was the
 * last holder of a heap marked for removal. With !wait the heap's lock is not waited for (the
 * slot is then closed as after a timed-out wait). */
static void release(cxr_heap *h, bool unmap, bool wait) {
  cxr__reg r;
  bool reg = cxr__reg_lock(&r, false) == 0;
  if ((wait ? cxr__heap_lock(h) : cxr__heap_lock_now(h)) == 0) {
    if (h->epoch == cxr__fork_epoch) {
      cxr__reclaim rc;
      memset(&rc, 0, sizeof rc);
      rc.gen[h->slot] = h->gen;
      rc.clean[h->slot] = true;
      if (h->hdr->slots[h->slot].gen == h->gen) cxr__slots_release(&h->g, &rc);
    }
    cxr__heap_reap_locked(h);
    cxr__heap_unlock(h);
  } else if (h->epoch == cxr__fork_epoch) {
    /* The lock stays taken (a stopped holder, an overwritten word). Left live, our slot
     * would name a living pid and nothing would come back to it (the handle leaves the list
     * the exit hook walks): a heap marked for removal would keep its file and registry
     * entry. Closed, it is no holder for the sweep below, and a reaper releases it. */
    cxr__slot *s = &h->hdr->slots[h->slot];
    uint32_t live = CXR_SLOT_LIVE;
    if (s->gen == h->gen) atomic_compare_exchange_strong(&s->state, &live, CXR_SLOT_CLOSED);
  }
  cxr__map *m = h->m;
  for (cxr_heap **pp = &cxr__heaps; *pp; pp = &(*pp)->next)
    if (*pp == h) {
      *pp = h->next;
      break;
    }
  h->magic = 0;
  char name[CXR_NAME_MAX + 1];
  cxr__copy_str(name, sizeof name, m->name);
  uint64_t gen = m->generation;
  if (unmap) map_put(m);
  else m->refs--;
  if (reg) {
    for (unsigned i = 0; i < CXR_REG_ENTRIES; i++) {
      cxr__reg_entry *e = &r.f->e[i];
      if (e->used && e->generation == gen && strcmp(e->name, name) == 0) cxr__sweep(&r, e);
    }
    cxr__reg_unlock(&r);
  }
}

static void close_handle(cxr_heap *h, bool wait) {
  if (cxr__heap_check(h) != 0) return;
  cxr__tcache_flush(h, true, wait);
  cxr__rt_lock();
  release(h, true, wait);
  cxr__rt_unlock();
  free(h);
}

void cxr_heap_close(cxr_heap *h) { close_handle(h, true); }

void cxr__heap_close_nowait(cxr_heap *h) { close_handle(h, false); }

/* At exit: give up this process's own leases (not those inherited over fork), keep the
 * memory mapped for threads that still run. */
void cxr__heaps_release_all(void);
static cxr_heap *retired; /* handles released at exit stay reachable (threads may run) */
void cxr__heaps_release_all(void) {
  cxr__rt_lock();
  while (cxr__heaps) {
    cxr_heap *h = cxr__heaps;
    if (h->epoch == cxr__fork_epoch) release(h, false, true);
    else cxr__heaps = h->next;
    h->next = retired;
    retired = h;
  }
  cxr__rt_unlock();
}

int cxr_heap_unlink(const char *name) {
  int rc = check_name(name);
  if (rc) return rc;
  rc = cxr__rt_ensure();
  if (rc) return rc;
  cxr__rt_lock();
  cxr__reg r;
  rc = cxr__reg_lock(&r, false);
  if (rc == 0) {
    cxr__reg_entry *e = cxr__reg_find(&r, name);
    if (e == NULL) {
      rc = CXR_ENOENT;
    } else {
      /* Move the file aside so the name can be used again at once: only this entry's heap
       * file (another process may have written any path into the registry). */
      if (!cxr__is_device(e->path) && entry_file_is_heap(e)) {
        char hidden[PATH_MAX];
        snprintf(hidden, sizeof hidden, "%s/.%s.%lu.unlinked", cxr_root(), name,
                 (unsigned long)e->generation);
        if (strlen(hidden) < sizeof e->path && rename(e->path, hidden) == 0)
          cxr__copy_str(e->path, sizeof e->path, hidden);
      }
      e->flags |= CXR_REG_UNLINKED;
      cxr__sweep(&r, e);
    }
    cxr__reg_unlock(&r);
  }
  cxr__rt_unlock();
  return rc;
}

/* ---------------- accessors ---------------- */

bool cxr_heap_contains(const cxr_heap *h, const void *p, size_t len) {
  if (cxr__heap_check(h) != 0) {
    cxr__set_error(CXR_EINVAL);
    return false;
  }
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)h->base + h->data_off,
            hi = (uintptr_t)h->base + h->size;
  return a >= lo && a <= hi && len <= hi - a;
}

void *cxr_heap_base(const cxr_heap *h) {
  if (cxr__heap_check(h) != 0) return cxr__fail_null(CXR_EINVAL);
  return h->base;
}

size_t cxr_heap_size(const cxr_heap *h) { return cxr__heap_check(h) == 0 ? h->size : 0; }

const char *cxr_heap_name(const cxr_heap *h) {
  if (cxr__heap_check(h) != 0) return cxr__fail_null(CXR_EINVAL);
  return h->m->name; /* our copy, checked at open: any holder can write the header's */
}

int cxr_heap_set_root(cxr_heap *h, void *p) {
  if (cxr__heap_check(h) != 0) return CXR_EINVAL;
  if (p != NULL && !cxr_heap_contains(h, p, 1)) return CXR_EBADPTR;
  atomic_store(&h->hdr->root_off, p ? (uint64_t)((char *)p - h->base) : 0);
  return 0;
}

void *cxr_heap_get_root(const cxr_heap *h) {
  if (cxr__heap_check(h) != 0) return cxr__fail_null(CXR_EINVAL);
  uint64_t off = atomic_load(&h->hdr->root_off);
  if (off == 0) return cxr__fail_null(CXR_ENOENT);
  if (off < h->data_off || off >= h->size) return cxr__fail_null(CXR_ECORRUPT);
  return h->base + off;
}

int cxr_heap_persist(cxr_heap *h, const void *p, size_t len) {
  if (cxr__heap_check(h) != 0) return CXR_EINVAL;
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)h->base, hi = lo + h->size;
  if (p == NULL || a < lo || a > hi || len > hi - a) return CXR_EBADPTR;
  if (len) h->m->persist(p, len);
  return 0;
}

int cxr_heap_get_stats(const cxr_heap *h, cxr_heap_stats *out) {
  if (cxr__heap_check(h) != 0 || out == NULL) return CXR_EINVAL;
  memset(out, 0, sizeof *out);
  const cxr__hdr *hdr = h->hdr;
  out->size = h->size;
  out->capacity = h->npages * CXR_PAGE;
  cxr__heap_usage(&h->g, &out->used, &out->cached);
  uint64_t a, f;
  cxr__tcache_counters((cxr_heap *)h, &a, &f);
  /* Written under the heap lock by a closing holder; read here without it (stats never
   * block), so both sides use relaxed atomics. */
  out->allocs = __atomic_load_n(&hdr->retired_allocs, __ATOMIC_RELAXED) + a;
  out->frees = __atomic_load_n(&hdr->retired_frees, __ATOMIC_RELAXED) + f;
  for (unsigned i = 0; i < CXR_MAX_HOLDERS; i++) {
    const cxr__slot *s = &hdr->slots[i];
    if (atomic_load(&s->state) != CXR_SLOT_LIVE) continue;
    out->holders++;
    out->allocs += atomic_load(&s->allocs);
    out->frees += atomic_load(&s->frees);
  }
  out->generation = hdr->generation;
  out->addr = hdr->addr;
  return 0;
}

