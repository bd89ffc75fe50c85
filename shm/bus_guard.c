/* The SIGBUS guard: see bus_guard.h. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cxrpc/shm.h>

#include "shm/bus_guard.h"
#include "shm/log.h"
#include "shm/sigchain.h"

/* Heaps start on 2 MiB boundaries (the registry hands out 2 MiB-aligned ranges): one bit
 * per 2 MiB of the window says whether the heap there is watched. */
#define UNIT_SHIFT 21

static struct sigaction old_bus;
static uintptr_t wbase;
static size_t wsize, page;
static _Atomic uint64_t *watched; /* (wsize >> UNIT_SHIFT) bits, untouched pages read 0 */
static _Atomic uint64_t repairs;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_rc;

static void on_bus(int sig, siginfo_t *info, void *uc) {
  uintptr_t a = (uintptr_t)info->si_addr & ~(uintptr_t)(page - 1);
  uint64_t u = (a - wbase) >> UNIT_SHIFT;
  if (info->si_code == BUS_ADRERR && a >= wbase && a - wbase < wsize &&
      (atomic_load_explicit(&watched[u / 64], memory_order_relaxed) >> (u % 64) & 1)) {
    /* The raw system call: a library's mmap wrapper (UCX's memory hooks, a sanitizer's)
     * may take locks, which a signal handler must not. */
    long p = syscall(SYS_mmap, a, page, PROT_READ | PROT_WRITE,
                     MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == (long)a) {
      atomic_fetch_add_explicit(&repairs, 1, memory_order_relaxed);
      return; /* the access is made again, on the zero page */
    }
  }
  cxr__sig_chain(&old_bus, sig, info, uc);
}

static void install(void) {
  long ps = sysconf(_SC_PAGESIZE);
  page = ps > 0 ? (size_t)ps : 4096;
  if (cxr_window(&wbase, &wsize) != 0) {
    install_rc = CXR_EIO;
    return;
  }
  size_t words = ((wsize >> UNIT_SHIFT) + 63) / 64;
  void *m = mmap(NULL, words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    install_rc = CXR_ENOMEM;
    return;
  }
  watched = m;
  if (cxr__sig_install(SIGBUS, on_bus, &old_bus) != 0) install_rc = CXR_EIO;
}

int cxr__bus_guard_install(void) {
  pthread_once(&once, install);
  return install_rc;
}

void cxr__bus_guard_watch(const void *base, size_t size, bool on) {
  uintptr_t a = (uintptr_t)base;
  if (watched == NULL || size == 0 || a < wbase || a - wbase >= wsize) return;
  uint64_t end = a - wbase + size - 1;
  if (end >= wsize) end = wsize - 1;
  for (uint64_t u = (a - wbase) >> UNIT_SHIFT; u <= end >> UNIT_SHIFT; u++) {
    uint64_t bit = 1ull << (u % 64);
    if (on) atomic_fetch_or(&watched[u / 64], bit);
    else atomic_fetch_and(&watched[u / 64], ~bit);
  }
}

uint64_t cxr__bus_repairs(void) { return atomic_load_explicit(&repairs, memory_order_relaxed); }

int cxr__bus_damaged(const uintptr_t *base, const size_t *size, size_t n, bool *damaged) {
  for (size_t i = 0; i < n; i++) damaged[i] = false;
  FILE *f = fopen("/proc/self/maps", "re");
  if (f == NULL) return CXR_EIO;
  char *line = NULL; /* whole lines, however long a mapping's path */
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    uintptr_t lo, hi;
    char perms[8];
    unsigned long long off, inode;
    char dev[16];
    /* A repaired page: private, writable, no file (the window itself is PROT_NONE, heaps
     * are shared file mappings). */
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %llx %15s %llu", &lo, &hi, perms, &off, dev,
               &inode) != 6 || strcmp(perms, "rw-p") != 0 || inode != 0)
      continue;
    if (hi <= wbase || lo >= wbase + wsize) continue;
    for (size_t i = 0; i < n; i++)
      if (lo < base[i] + size[i] && hi > base[i]) damaged[i] = true;
  }
  free(line);
  fclose(f);
  return 0;
}
