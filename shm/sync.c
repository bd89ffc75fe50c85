/* Futex waits on shared words and the heap holders' lock (see sync.h). */
#include "shm/sync.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cxrpc/base.h>

#include "shm/proc.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the futex is the word's low half");

/* The kernel's largest pid (PID_MAX_LIMIT on 64-bit) fits the pid field. */
#define PID_LIMIT 4194304
/* A waiter spins this many times before it sleeps (sections under the lock take
 * microseconds), then looks at the holder after 1 ms and every 5 ms after. */
#define SPINS 64
#define FIRST_CHECK_NS 1000000ll
#define CHECK_EVERY_NS 5000000ll

void cxr__futex_wait(uint32_t *w, uint32_t val, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  struct timespec ts = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
  syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0);
}

void cxr__futex_wake(uint32_t *w, int n) { syscall(SYS_futex, w, FUTEX_WAKE, n, NULL, NULL, 0); }

uint64_t cxr__plock_id(int32_t pid, uint64_t start_time) {
  return ((uint64_t)(uint32_t)start_time << 32) | ((uint64_t)(uint32_t)pid & CXR_PLOCK_PID_MASK);
}

uint64_t cxr__plock_self_id(void) {
  cxr__proc_id me;
  return cxr__proc_self_id(&me) == 0 ? cxr__plock_id(me.pid, me.start_time) : 0;
}

bool cxr__plock_holder_dead(uint64_t word) {
  int32_t pid = (int32_t)(word & CXR_PLOCK_PID_MASK);
  if (pid <= 0 || pid > PID_LIMIT) return true;
  uint64_t st;
  int rc = cxr__proc_start_time(pid, &st);
  if (rc != 0) return rc == CXR_ENOENT; /* a thread that cannot tell waits, takes nothing */
  return (uint32_t)st != (uint32_t)(word >> 32);
}

static uint32_t *futex_of(cxr__plock *l) { return (uint32_t *)&l->word; }

int cxr__plock_try(cxr__plock *l, uint64_t me) {
  uint64_t w = 0;
  return __atomic_compare_exchange_n(&l->word, &w, me, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED)
             ? 0
             : CXR_EBUSY;
}

int cxr__plock_lock(cxr__plock *l, uint64_t me, int64_t wait_ns) {
  for (int i = 0; i < SPINS; i++) {
    if (__atomic_load_n(&l->word, __ATOMIC_RELAXED) == 0 && cxr__plock_try(l, me) == 0) return 0;
    cxr__cpu_relax();
  }
  int64_t start = cxr_now_ns();
  int64_t until = start + wait_ns, check = start + FIRST_CHECK_NS;
  for (;;) {
    /* Every pass reads the clock (a waiter's path): a peer rewriting the word as fast as it
     * can makes the compare-and-swaps below fail, and must not keep us past `until`. */
    int64_t now = cxr_now_ns();
    if (now >= until) return CXR_ETIMEDOUT;
    uint64_t w = __atomic_load_n(&l->word, __ATOMIC_RELAXED);
    if (w == 0) {
      /* Taken with the waiters bit: others may still sleep, and our unlock must wake one. */
      if (__atomic_compare_exchange_n(&l->word, &w, me | CXR_PLOCK_WAITERS, false,
                                      __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return 0;
      continue;
    }
    if (!(w & CXR_PLOCK_WAITERS)) {
      if (!__atomic_compare_exchange_n(&l->word, &w, w | CXR_PLOCK_WAITERS, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        continue;
      w |= CXR_PLOCK_WAITERS;
    }
    if (now >= check) {
      check = now + CHECK_EVERY_NS;
      if ((w & ~CXR_PLOCK_WAITERS) != me && cxr__plock_holder_dead(w)) {
        if (__atomic_compare_exchange_n(&l->word, &w, me | CXR_PLOCK_WAITERS, false,
                                        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
          return CXR_PLOCK_TAKEN_OVER;
        continue; /* it changed: look again */
      }
    }
    int64_t nap = (until < check ? until : check) - now;
    cxr__futex_wait(futex_of(l), (uint32_t)w, nap);
  }
}

void cxr__plock_unlock(cxr__plock *l, uint64_t me) {
  uint64_t w = __atomic_load_n(&l->word, __ATOMIC_RELAXED);
  do {
    if ((w & ~CXR_PLOCK_WAITERS) != me) return; /* rewritten by a peer: not ours to clear */
  } while (!__atomic_compare_exchange_n(&l->word, &w, 0, false, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED));
  if (w & CXR_PLOCK_WAITERS) cxr__futex_wake(futex_of(l), 1);
}
