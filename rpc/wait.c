/* The waiting toolkit: futexes on shared words (not FUTEX_PRIVATE: the waker is another
 * process) and the spin budgets. Protocol for every sleeper/waker pair:
 *   sleeper: v = futex; sleepers++ (seq_cst RMW); re-check the condition; wait(futex, v); sleepers--
 *   waker:   publish; if (sleepers RMW +0) { futex++; wake }
 * Either the sleeper sees the work on its re-check, or the waker sees the sleeper and the
 * futex value changes, so FUTEX_WAIT returns at once. A busy peer never pays a syscall. */
#include <errno.h>
#include <limits.h>
#include <linux/membarrier.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "rpc/internal.h"
#include "shm/env.h"

void cxr__bell_ring(uint32_t *futex, uint32_t *sleepers) {
  /* A read-modify-write of the sleepers word (not a fence, which TSan cannot model) orders
   * our publication before the read: it joins the RMW chain the sleepers' increments are in. */
  if (__atomic_fetch_add(sleepers, 0, __ATOMIC_SEQ_CST) != 0) {
    __atomic_fetch_add(futex, 1, __ATOMIC_SEQ_CST);
    cxr__futex_wake(futex, INT_MAX);
  }
}

void cxr__bell_after_store(uint32_t *futex, uint32_t *sleepers) {
#if defined(__SANITIZE_THREAD__)
  uint32_t n = __atomic_fetch_add(sleepers, 0, __ATOMIC_SEQ_CST);
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  uint32_t n = __atomic_load_n(sleepers, __ATOMIC_SEQ_CST);
#endif
  if (n != 0) {
    __atomic_fetch_add(futex, 1, __ATOMIC_SEQ_CST);
    cxr__futex_wake(futex, INT_MAX);
  }
}

void cxr__bell_after_push(uint32_t *futex, uint32_t *sleepers) {
  if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST) != 0) {
    __atomic_fetch_add(futex, 1, __ATOMIC_SEQ_CST);
    cxr__futex_wake(futex, INT_MAX);
  }
}

/* A tunable read once (the first caller reads the environment; racing first callers read
 * the same value). */
static int64_t env_ns_once(int64_t *cache, const char *name, int64_t dflt, int64_t max) {
  int64_t x = __atomic_load_n(cache, __ATOMIC_RELAXED);
  if (x < 0) {
    uint64_t v;
    cxr__env_u64(name, (uint64_t)dflt, 0, (uint64_t)max, &v);
    x = (int64_t)v;
    __atomic_store_n(cache, x, __ATOMIC_RELAXED);
  }
  return x;
}

int64_t cxr__spin_ns(void) {
  static int64_t v = -1;
  return env_ns_once(&v, "CXRPC_SPIN_NS", 50000, 100000000);
}

int64_t cxr__yield_ns(void) {
  static int64_t v = -1;
  return env_ns_once(&v, "CXRPC_YIELD_NS", 200000, 100000000);
}

int64_t cxr__coarse_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whether membarrier's private expedited barrier works in this process (registered on the
 * first ask; the registration carries over fork). */
bool cxr__process_barrier_ready(void) {
  static int state; /* 0 unknown, 1 registered, -1 unavailable */
  int st = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
  if (st == 0) {
    st = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 ? 1 : -1;
    __atomic_store_n(&state, st, __ATOMIC_RELEASE);
  }
  return st > 0;
}

/* A full memory barrier on every running thread of this process (membarrier), so a store
 * made before it is seen by any load those threads make after it. Where membarrier is
 * missing, a 10 ms pause (store buffers drain in microseconds). */
void cxr__process_barrier(void) {
  if (!cxr__process_barrier_ready() ||
      syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
}

#define BLOCK_NS 50000000 /* how long a thread blocks at once after seeing contention */
#define GAP_NS 20000      /* a gap between two spin ticks this long (and 16 typical ones) */
#define JUDGE_NS 10000000 /* spinning seen before a verdict */
#define WINDOW_NS 200000000 /* the sums halve past this: recent spinning weighs most */

void cxr__wait_tick(cxr__waitpol *p, int64_t now) {
  if (p->last == 0) return;
  int64_t d = now - p->last;
  p->last = now;
  if (d <= 0) return;
  p->spun += d;
  /* Off the CPU: far longer than the usual tick (~0.5 us here; slower builds such as TSan's
   * and slower machines tick slower, which is no gap). The usual tick is a running average
   * of the ticks that were not gaps. */
  if (p->tick == 0) p->tick = d < GAP_NS ? d : GAP_NS;
  if (d > GAP_NS && d > 16 * p->tick) {
    p->off += d;
  } else {
    p->tick += (d - p->tick) / 16;
    if (p->tick <= 0) p->tick = 1;
  }
  if (p->spun > WINDOW_NS) {
    p->spun /= 2;
    p->off /= 2;
  }
}

/* CXRPC_WAIT: "adaptive" (default: spin, yield, then sleep; but after being preempted
 * during a spin window, sleep at once for a while), "spin" (never give up spinning early),
 * "block" (always sleep at once, like a socket). Read once. */
enum { WAIT_SPIN = 1, WAIT_ADAPTIVE = 2, WAIT_BLOCK = 3 };
static int wait_mode(void) {
  static int mode;
  int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
  if (m == 0) {
    const char *s = getenv("CXRPC_WAIT");
    m = s && !strcmp(s, "spin") ? WAIT_SPIN : s && !strcmp(s, "block") ? WAIT_BLOCK : WAIT_ADAPTIVE;
    __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
  }
  return m;
}

enum { BUSY_SLEEP_MIN_NS = 20000, BUSY_SLEEP_MAX_NS = 10000000 };

int64_t cxr__busy_sleep_ns(cxr__busy *b, uint64_t mark) {
  if (mark != b->mark) { /* something moved: maybe a producer publishing right now */
    b->mark = mark;
    b->n = 0;
  }
  unsigned n = b->n;
  if (n < 16) b->n = n + 1; /* (enough to reach the cap, never to wrap) */
  if (n == 0) return 0;
  int64_t t = (int64_t)BUSY_SLEEP_MIN_NS << (n - 1);
  return t < BUSY_SLEEP_MAX_NS ? t : BUSY_SLEEP_MAX_NS;
}

void cxr__wait_windows(cxr__waitpol *p, int64_t now, int64_t *spin, int64_t *yield) {
  if (wait_mode() == WAIT_BLOCK) {
    *spin = *yield = 0;
    return;
  }
  if (p->block_until != 0) {
    if (now < p->block_until) {
      *spin = *yield = 0;
      return;
    }
    p->block_until = 0; /* probe: spin again; the halved sums decide after a few ms of it */
  }
  *spin = cxr__spin_ns();
  *yield = cxr__yield_ns();
}

bool cxr__wait_contended(cxr__waitpol *p, int64_t now) {
  p->last = 0;
  if (wait_mode() != WAIT_ADAPTIVE) return false;
  if (cxr__spin_ns() == 0 || p->block_until != 0) return p->block_until != 0;
  bool contended = p->spun >= JUDGE_NS && p->off * 4 >= p->spun;
  if (contended) {
    p->block_until = now + BLOCK_NS;
    p->spun /= 2; /* the probe after the block needs less new evidence to change the verdict */
    p->off /= 2;
  }
  return contended;
}
