/* The pod registry (see registry.h). */
#include "shm/registry.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shm/internal.h"
#include "shm/reg_deadline.h"

#define REG_MAGIC 0x0047455252584300ull /* "\0CXRREG" */
#define REG_VERSION 1u

unsigned cxr__rt_pod(void);

int64_t cxr__reg_wait_ns = 10000000000ll;
#define REG_WAIT_STUCK_NS 10000000ll

/* Set when a wait timed out: later ones are brief until the lock is had again, so a
 * process closing many heaps does not wait the full bound for each. */
static int reg_stuck;

static _Thread_local int64_t reg_until; /* the caller's deadline (reg_deadline.h), or 0 */

int64_t cxr__reg_deadline_get(void) { return reg_until; }

bool cxr__reg_deadline_clip(int64_t now, int64_t *bound) {
  if (reg_until == 0 || reg_until - now >= *bound) return false;
  *bound = reg_until > now ? reg_until - now : 0;
  return true;
}

int64_t cxr__reg_deadline_set(int64_t until_ns) {
  int64_t prev = reg_until;
  reg_until = until_ns;
  return prev;
}

/* Takes the flock within cxr__reg_wait_ns (or by this thread's deadline, if sooner). flock
 * has no timeout, so a busy lock is polled: yielding for the first 200 us (sections last
 * microseconds; on a small machine the holder may need our CPU to finish), then sleeping
 * 50 us, doubling to 1 ms, between tries. */
static int lock_bounded(int fd) {
  int64_t start = 0, bound = cxr__reg_wait_ns;
  bool callers = false; /* the bound is the caller's deadline: no sign of a stuck lock */
  long nap_ns = 50000;
  for (;;) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      if (__atomic_load_n(&reg_stuck, __ATOMIC_RELAXED))
        __atomic_store_n(&reg_stuck, 0, __ATOMIC_RELAXED);
      return 0;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) return cxr__from_errno(errno);
    int64_t now = cxr_now_ns();
    if (start == 0) {
      start = now;
      if (__atomic_load_n(&reg_stuck, __ATOMIC_RELAXED)) bound = REG_WAIT_STUCK_NS;
      callers = cxr__reg_deadline_clip(now, &bound);
    }
    int64_t spent = now - start;
    if (spent >= bound && callers) return CXR_ETIMEDOUT;
    if (spent >= bound) {
      if (bound != REG_WAIT_STUCK_NS)
        CXR_ERR("%s/registry: its lock was not released within %lld ms (a process of the pod "
                "holds it and does not let go); heaps cannot be created, opened or removed "
                "until it does", cxr_root(), (long long)(bound / 1000000));
      __atomic_store_n(&reg_stuck, 1, __ATOMIC_RELAXED);
      return CXR_ETIMEDOUT;
    }
    if (spent < 200000) {
      sched_yield();
    } else {
      struct timespec ts = {0, nap_ns};
      nanosleep(&ts, NULL);
      if (nap_ns < 1000000) nap_ns *= 2;
    }
  }
}

int cxr__reg_lock(cxr__reg *r, bool create) {
  r->fd = -1;
  r->f = NULL;
  const char *root = cxr_root();
  if (root == NULL) return cxr_last_error();
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/registry", root);
  for (int attempt = 0; attempt < 100; attempt++) {
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
    if (fd < 0) return cxr__from_errno(errno);
    int rc = lock_bounded(fd);
    if (rc != 0) {
      close(fd);
      return rc;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_nlink == 0) { /* removed while we waited: retry */
      close(fd);
      if (!create) return CXR_ENOENT;
      continue;
    }
    if ((size_t)st.st_size < sizeof(cxr__reg_file)) {
      /* New (or left half-made by a creator that died holding the lock). */
      if (!create) {
        close(fd);
        return CXR_ENOENT;
      }
      if (ftruncate(fd, sizeof(cxr__reg_file)) != 0) {
        int e = errno;
        close(fd);
        return cxr__from_errno(e);
      }
    }
    void *p = mmap(NULL, sizeof(cxr__reg_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      return cxr__from_errno(e);
    }
    cxr__reg_file *f = p;
    if (f->magic == 0) {
      f->version = REG_VERSION;
      f->nentries = CXR_REG_ENTRIES;
      f->magic = REG_MAGIC;
    } else if (f->magic != REG_MAGIC || f->version != REG_VERSION ||
               f->nentries != CXR_REG_ENTRIES) {
      CXR_ERR("%s is not a cxrpc registry of this version", path);
      munmap(p, sizeof(cxr__reg_file));
      close(fd);
      return CXR_EVERSION;
    }
    /* Entries are read as C strings: keep them terminated whatever was written there. */
    for (unsigned i = 0; i < CXR_REG_ENTRIES; i++) {
      f->e[i].name[sizeof f->e[i].name - 1] = '\0';
      f->e[i].path[sizeof f->e[i].path - 1] = '\0';
    }
    r->fd = fd;
    r->f = f;
    return 0;
  }
  return CXR_EBUSY;
}

void cxr__reg_unlock(cxr__reg *r) {
  if (r->f == NULL) return;
  bool empty = true;
  for (unsigned i = 0; i < CXR_REG_ENTRIES; i++)
    if (r->f->e[i].used) empty = false;
  if (empty) {
    /* Unlink while still locked: waiters see st_nlink == 0 and start over. */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/registry", cxr_root());
    unlink(path);
  }
  munmap(r->f, sizeof(cxr__reg_file));
  close(r->fd); /* drops the flock */
  r->f = NULL;
  r->fd = -1;
}

cxr__reg_entry *cxr__reg_find(cxr__reg *r, const char *name) {
  for (unsigned i = 0; i < CXR_REG_ENTRIES; i++) {
    cxr__reg_entry *e = &r->f->e[i];
    if (e->used && !(e->flags & CXR_REG_UNLINKED) &&
        strncmp(e->name, name, sizeof e->name) == 0)
      return e;
  }
  return NULL;
}

cxr__reg_entry *cxr__reg_slot(cxr__reg *r) {
  for (unsigned i = 0; i < CXR_REG_ENTRIES; i++)
    if (!r->f->e[i].used) return &r->f->e[i];
  return NULL;
}

uint64_t cxr__reg_next_generation(cxr__reg *r) {
  /* Unique across registry re-creation too: never below the wall clock. */
  uint64_t g = (uint64_t)cxr__realtime_ns();
  if (g <= r->f->last_generation) g = r->f->last_generation + 1;
  r->f->last_generation = g;
  return g;
}

void cxr__reg_remove(cxr__reg *r, cxr__reg_entry *e) {
  (void)r;
  e->used = 0;
  memset(e, 0, sizeof *e);
}

static bool overlaps(cxr__reg *r, uint64_t a, uint64_t size) {
  for (unsigned i = 0; i < CXR_REG_ENTRIES; i++) {
    cxr__reg_entry *e = &r->f->e[i];
    if (!e->used) continue;
    uint64_t es = (e->size + CXR_RANGE_ALIGN - 1) & ~(uint64_t)(CXR_RANGE_ALIGN - 1);
    if (a < e->addr + es && e->addr < a + size) return true;
  }
  return false;
}

int cxr__reg_range(cxr__reg *r, uint64_t size, uint64_t fixed, uint64_t *addr) {
  uintptr_t sbase;
  size_t ssize;
  int rc = cxr_pod_slice(cxr__rt_pod(), &sbase, &ssize);
  if (rc) return rc;
  uint64_t rs = (size + CXR_RANGE_ALIGN - 1) & ~(uint64_t)(CXR_RANGE_ALIGN - 1);
  if (fixed) {
    if (fixed < sbase || rs > ssize || fixed - sbase > ssize - rs) return CXR_ERANGE;
    if (overlaps(r, fixed, rs)) return CXR_EADDRINUSE;
    *addr = fixed;
    return 0;
  }
  /* First fit: candidates are the slice start and the end of every entry. */
  uint64_t best = UINT64_MAX;
  for (int i = -1; i < (int)CXR_REG_ENTRIES; i++) {
    uint64_t a = sbase;
    if (i >= 0) {
      cxr__reg_entry *e = &r->f->e[i];
      if (!e->used) continue;
      a = e->addr + ((e->size + CXR_RANGE_ALIGN - 1) & ~(uint64_t)(CXR_RANGE_ALIGN - 1));
    }
    if (a < sbase || rs > ssize || a - sbase > ssize - rs) continue;
    if (a < best && !overlaps(r, a, rs)) best = a;
  }
  if (best == UINT64_MAX) return CXR_ENOMEM;
  *addr = best;
  return 0;
}
