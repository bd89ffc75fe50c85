/*
 * Memory domains with protection keys (x86 PKU). Private memory put in the domain by
 * cxr_domain_protect is readable and writable normally, and neither inside cxr_sandbox_run:
 * entering writes PKRU (a user-mode instruction, ~20 ns), so a handler that follows a bad
 * pointer into it faults, and the fault is contained. Detected at run time; on CPUs
 * without pkeys (as on the development machines) protect returns CXR_ENOSYS and entering
 * is a no-op.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/domain.h"
#include "sandbox/internal.h"
#include "shm/log.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int private_key = -1;
static _Atomic bool in_use;

static void probe(void) {
  long k = syscall(SYS_pkey_alloc, 0, 0);
  private_key = k >= 0 ? (int)k : -1;
}

bool cxr_domain_supported(void) {
  pthread_once(&once, probe);
  return private_key >= 0;
}

#if defined(__x86_64__)
static inline uint32_t rdpkru(void) {
  uint32_t eax, edx, ecx = 0;
  __asm__ volatile(".byte 0x0f,0x01,0xee" : "=a"(eax), "=d"(edx) : "c"(ecx));
  return eax;
}
static inline void wrpkru(uint32_t v) {
  uint32_t ecx = 0, edx = 0;
  __asm__ volatile(".byte 0x0f,0x01,0xef" : : "a"(v), "c"(ecx), "d"(edx) : "memory");
}
#endif

int cxr_domain_protect(void *p, size_t len) {
  if (!p || len == 0 || ((uintptr_t)p % CXR__PAGE)) return CXR_EINVAL;
  if (!cxr_domain_supported()) return CXR_ENOSYS;
  if (syscall(SYS_pkey_mprotect, p, len, PROT_READ | PROT_WRITE, private_key) != 0)
    return cxr__from_errno(errno);
  atomic_store(&in_use, true);
  return 0;
}

uint32_t cxr__domain_enter(void) {
#if defined(__x86_64__)
  if (!atomic_load_explicit(&in_use, memory_order_relaxed)) return 0;
  uint32_t old = rdpkru();
  wrpkru(old | (3u << (2 * private_key))); /* access-disable and write-disable */
  return old;
#else
  return 0;
#endif
}

void cxr__domain_leave(uint32_t saved) {
#if defined(__x86_64__)
  if (atomic_load_explicit(&in_use, memory_order_relaxed)) wrpkru(saved);
#else
  (void)saved;
#endif
}
