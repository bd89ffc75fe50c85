/*
 * The runtime: the one documented global object of cxrpc. It holds the pod root, the
 * address window reserved at start (PROT_NONE through a pmem2_vm_reservation, so nothing
 * else lands there), the pod's slice of it, and this process's mappings and handles.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shm/env.h"
#include "shm/internal.h"
#include "shm/reg_deadline.h"

_Static_assert(CXR__WINDOW_ALIGN == CXR_RANGE_ALIGN, "the window is cut into registry ranges");

#define DEFAULT_ROOT "/dev/shm/cxrpc"
#define DEFAULT_WINDOW_BASE 0x600000000000ull
#define DEFAULT_WINDOW_SIZE 0x100000000000ull
#define DEFAULT_SLICES 16u

static pthread_mutex_t rt_mu = PTHREAD_MUTEX_INITIALIZER;
static bool rt_inited;
static char rt_root[PATH_MAX];
static uintptr_t rt_wbase;
static size_t rt_wsize;
static unsigned rt_pod, rt_slices;
static struct pmem2_vm_reservation *rt_rsv;
static _Atomic uint64_t rt_serial;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

_Atomic unsigned cxr__fork_epoch = 1;
cxr__map *cxr__maps;
cxr_heap *cxr__heaps;

void cxr__rt_lock(void) { pthread_mutex_lock(&rt_mu); }
void cxr__rt_unlock(void) { pthread_mutex_unlock(&rt_mu); }

int cxr__rt_lock_by(int64_t until) { return cxr__mutex_lock_by(&rt_mu, until); }

/* pthread_mutex_timedlock for at most wait_ns from now: 0 or its error (ETIMEDOUT, ...). */
static int mutex_lock_within(pthread_mutex_t *m, int64_t wait_ns) {
  int64_t at = cxr__realtime_ns() + wait_ns; /* pthread_mutex_timedlock's clock */
  struct timespec ts = {.tv_sec = (time_t)(at / 1000000000), .tv_nsec = at % 1000000000};
  return pthread_mutex_timedlock(m, &ts);
}

int cxr__mutex_lock_by(pthread_mutex_t *m, int64_t until) {
  if (until == 0) {
    pthread_mutex_lock(m);
    return 0;
  }
  if (pthread_mutex_trylock(m) == 0) return 0;
  int64_t left = until - cxr_now_ns();
  return mutex_lock_within(m, left > 0 ? left : 0) == 0 ? 0 : CXR_ETIMEDOUT;
}

uint64_t cxr__rt_lock_id(void) {
  static _Atomic uint64_t id;
  static _Atomic unsigned id_epoch; /* the fork epoch id was read in; 0: not yet */
  unsigned e = atomic_load_explicit(&cxr__fork_epoch, memory_order_relaxed);
  if (atomic_load_explicit(&id_epoch, memory_order_acquire) == e)
    return atomic_load_explicit(&id, memory_order_relaxed);
  uint64_t v = cxr__plock_self_id();
  if (v == 0) return 0;
  atomic_store_explicit(&id, v, memory_order_relaxed);
  atomic_store_explicit(&id_epoch, e, memory_order_release);
  return v;
}

uint64_t cxr__rt_next_serial(void) { return atomic_fetch_add(&rt_serial, 1) + 1; }

int64_t cxr__realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t cxr__lease_ns(void) {
  static _Atomic int64_t lease; /* read once; racing first readers compute the same value */
  int64_t l = atomic_load_explicit(&lease, memory_order_relaxed);
  if (l == 0) {
    uint64_t ms; /* at most a day: a bound, and no overflow in ns */
    cxr__env_u64("CXRPC_LEASE_MS", 10000, 1, 86400000, &ms);
    l = (int64_t)ms * 1000000;
    atomic_store_explicit(&lease, l, memory_order_relaxed);
  }
  return l;
}

/* The forking thread holds rt_mu across fork so the child inherits consistent lists; the
 * child bumps the epoch so inherited handles take their own lease on first use. */
static void at_prepare(void) { pthread_mutex_lock(&rt_mu); }
static void at_parent(void) { pthread_mutex_unlock(&rt_mu); }
static void at_child(void) {
  pthread_mutex_unlock(&rt_mu);
  atomic_fetch_add(&cxr__fork_epoch, 1);
  cxr__tcache_after_fork();
}
static void exit_release(void);
static void register_atfork(void) {
  pthread_atfork(at_prepare, at_parent, at_child);
  atexit(exit_release);
}

void cxr_init_opts_init(cxr_init_opts *o) {
  if (o == NULL) return;
  memset(o, 0, sizeof *o);
  o->pod = CXR_POD_DEFAULT;
}

/* Root: must exist (the default one is created), be a folder, and take a new file. As root,
 * access(W_OK) says yes even on a read-only mount, so we really create a file. */
static int check_root(const char *root, bool is_default) {
  struct stat st;
  if (stat(root, &st) != 0) {
    if (errno == ENOENT && is_default) {
      /* 01777 as documented (every user of the pod creates files here, none removes
       * another's), whatever our umask: under 022 it was 01755, and only its maker could
       * use it. A chmod of a folder we just made in a sticky /dev/shm (no one else can
       * move it); one another process made first (EEXIST) is left as it is. */
      if (mkdir(root, 01777) == 0) {
        if (chmod(root, 01777) != 0) return cxr__from_errno(errno);
      } else if (errno != EEXIST) {
        return cxr__from_errno(errno);
      }
      if (stat(root, &st) != 0) return cxr__from_errno(errno);
    } else {
      return errno == ENOENT || errno == ENOTDIR ? CXR_ENOENT : cxr__from_errno(errno);
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    CXR_ERR("root %s is not a folder", root);
    return CXR_EACCES;
  }
  int fd = open(root, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    char probe[PATH_MAX];
    snprintf(probe, sizeof probe, "%s/.probe.XXXXXX", root);
    fd = mkstemp(probe);
    if (fd >= 0) unlink(probe);
  }
  if (fd < 0) {
    int e = errno;
    CXR_ERR("root %s is not writable: %s", root, strerror(e));
    return e == EROFS || e == EACCES || e == EPERM ? CXR_EACCES : cxr__from_errno(e);
  }
  close(fd);
  return 0;
}

int cxr_init(const cxr_init_opts *o) {
  pthread_once(&atfork_once, register_atfork);
  /* Without options a set-up runtime is simply accepted (below, under the mutex, too): no
   * mutex here, which another thread may hold while it waits for the registry's lock. */
  if (o == NULL && __atomic_load_n(&rt_inited, __ATOMIC_ACQUIRE)) return 0;
  cxr_init_opts d;
  cxr_init_opts_init(&d);
  const char *root = o && o->root ? o->root : getenv("CXRPC_ROOT");
  bool is_default = root == NULL || *root == '\0';
  if (is_default) root = DEFAULT_ROOT;
  uintptr_t wbase = DEFAULT_WINDOW_BASE;
  size_t wsize = DEFAULT_WINDOW_SIZE;
  const char *w = getenv("CXRPC_WINDOW");
  if (o && o->window_base) {
    wbase = o->window_base;
    if (o->window_size) wsize = o->window_size;
  } else if (w && *w) {
    if (cxr__parse_window(w, &wbase, &wsize) != 0) {
      CXR_ERR("CXRPC_WINDOW=%s: expected 0xLO-0xHI, 2 MiB aligned, below 0x800000000000", w);
      return CXR_EINVAL;
    }
  }
  unsigned slices = o && o->pod_slices ? o->pod_slices : DEFAULT_SLICES;
  unsigned pod = 0;
  const char *ps = getenv("CXRPC_POD");
  if (o && o->pod != CXR_POD_DEFAULT) {
    pod = o->pod; /* 0 included: a process may name pod 0 whatever the environment says */
  } else if (ps && *ps) {
    uint64_t v; /* refused, not defaulted: pod 0 by mistake would share another's slice */
    if (cxr__parse_u64(ps, false, &v) != 0 || v >= CXR_POD_DEFAULT) {
      CXR_ERR("CXRPC_POD=%s: expected a slice number", ps);
      return CXR_EINVAL;
    }
    pod = (unsigned)v;
  }
  if (strlen(root) >= sizeof rt_root - 80) return CXR_ENAMETOOLONG;
  if (!cxr__window_ok(wbase, wsize)) return CXR_EINVAL;
  if (slices == 0 || pod >= slices || wsize / slices < CXR_RANGE_ALIGN) return CXR_EINVAL;

  pthread_mutex_lock(&rt_mu);
  int rc = 0;
  if (rt_inited) {
    if (o != NULL && (strcmp(root, rt_root) != 0 || wbase != rt_wbase || wsize != rt_wsize ||
                      pod != rt_pod || slices != rt_slices))
      rc = CXR_EBUSY;
    pthread_mutex_unlock(&rt_mu);
    return rc;
  }
  rc = check_root(root, is_default);
  if (rc == 0) {
    int prc = pmem2_vm_reservation_new(&rt_rsv, (void *)wbase, wsize);
    if (prc != 0) {
      CXR_ERR("cannot reserve window %#lx-%#lx: %s", (unsigned long)wbase,
              (unsigned long)(wbase + wsize), pmem2_errormsg());
      rc = prc == PMEM2_E_MAPPING_EXISTS ? CXR_EADDRINUSE : CXR_ENOMEM;
      rt_rsv = NULL;
    }
  }
  if (rc == 0) {
    snprintf(rt_root, sizeof rt_root, "%s", root);
    rt_wbase = wbase;
    rt_wsize = wsize;
    rt_pod = pod;
    rt_slices = slices;
    __atomic_store_n(&rt_inited, true, __ATOMIC_RELEASE); /* read without the lock */
    CXR_INFO("window %#lx-%#lx, pod %u/%u, root %s", (unsigned long)wbase,
             (unsigned long)(wbase + wsize), pod, slices, rt_root);
  }
  pthread_mutex_unlock(&rt_mu);
  return rc;
}

int cxr__rt_ensure(void) {
  if (__atomic_load_n(&rt_inited, __ATOMIC_ACQUIRE)) return 0;
  return cxr_init(NULL);
}

const char *cxr_root(void) {
  int rc = cxr__rt_ensure();
  if (rc != 0) return cxr__fail_null(rc); /* why the runtime could not start, not ENOENT */
  return rt_root;
}

int cxr_window(uintptr_t *base, size_t *size) {
  int rc = cxr__rt_ensure();
  if (rc) return rc;
  if (base) *base = rt_wbase;
  if (size) *size = rt_wsize;
  return 0;
}

int cxr_pod_slice(unsigned pod, uintptr_t *base, size_t *size) {
  int rc = cxr__rt_ensure();
  if (rc) return rc;
  if (pod >= rt_slices) return CXR_EINVAL;
  size_t s = (rt_wsize / rt_slices) & ~(size_t)(CXR_RANGE_ALIGN - 1);
  if (base) *base = rt_wbase + (uintptr_t)pod * s;
  if (size) *size = s;
  return 0;
}

unsigned cxr__rt_pod(void);
unsigned cxr__rt_pod(void) { return rt_pod; }

bool cxr__rt_in_window(uint64_t addr, uint64_t size) {
  return addr >= rt_wbase && size <= rt_wsize && addr - rt_wbase <= rt_wsize - size;
}

/* Is [addr, addr + size) only our PROT_NONE reservation? Anything else mapped there
 * (another library's mmap with MAP_FIXED, a heap of another generation) makes it taken. */
static int range_is_reserved(uintptr_t addr, size_t size) {
  FILE *f = fopen("/proc/self/maps", "re");
  if (f == NULL) return 0; /* cannot check: rely on libpmem2's own bookkeeping */
  char line[512];
  int rc = 0;
  uintptr_t end = addr + size;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi, off, inode;
    char perms[8];
    unsigned dmaj, dmin;
    if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &dmaj, &dmin, &inode) != 7)
      continue;
    if (hi <= addr || lo >= end) continue;
    if (strcmp(perms, "---p") != 0 || inode != 0) {
      CXR_WARN("window range %#lx-%#lx overlaps a mapping: %s", (unsigned long)addr,
               (unsigned long)end, line);
      rc = CXR_EADDRINUSE;
      break;
    }
  }
  fclose(f);
  return rc;
}

int cxr__rt_map(int fd, uintptr_t addr, size_t size, struct pmem2_map **out) {
  if (!cxr__rt_in_window(addr, size)) return CXR_ERANGE;
  int rc = range_is_reserved(addr, size);
  if (rc) return rc;
  struct pmem2_source *src = NULL;
  struct pmem2_config *cfg = NULL;
  int prc = pmem2_source_from_fd(&src, fd);
  if (prc == 0) prc = pmem2_config_new(&cfg);
  if (prc == 0) prc = pmem2_config_set_required_store_granularity(cfg, PMEM2_GRANULARITY_PAGE);
  if (prc == 0) prc = pmem2_config_set_length(cfg, size);
  if (prc == 0) prc = pmem2_config_set_vm_reservation(cfg, rt_rsv, addr - rt_wbase);
  if (prc == 0) prc = pmem2_map_new(out, cfg, src);
  if (prc != 0) {
    CXR_ERR("libpmem2 cannot map %zu bytes at %#lx: %s", size, (unsigned long)addr,
            pmem2_errormsg());
    rc = prc == PMEM2_E_MAPPING_EXISTS ? CXR_EADDRINUSE
         : prc == -ENOMEM              ? CXR_ENOMEM
         : prc == PMEM2_E_LENGTH_UNALIGNED || prc == PMEM2_E_OFFSET_UNALIGNED ? CXR_EINVAL
                                                                              : CXR_EIO;
    *out = NULL;
  } else if (pmem2_map_get_address(*out) != (void *)addr) {
    pmem2_map_delete(out);
    rc = CXR_EADDRINUSE;
  }
  if (cfg) pmem2_config_delete(&cfg);
  if (src) pmem2_source_delete(&src);
  return rc;
}

void cxr__rt_unmap(struct pmem2_map **pm) {
  if (*pm && pmem2_map_delete(pm) != 0) CXR_WARN("pmem2_map_delete: %s", pmem2_errormsg());
}

/* At exit, give up the leases this process still holds (its own, not inherited ones) so
 * heaps marked for removal go with their last holder. Memory stays mapped: other threads
 * may still run. */
void cxr__heaps_release_all(void);
static void exit_release(void) { cxr__heaps_release_all(); }
