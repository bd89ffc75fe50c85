/* A connection's sole user: claiming it, and turning it shared (rpc/sole.h says why). */
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <stdio.h>

#include "rpc/internal.h"
#include "rpc/sole.h"
#include "shm/log.h"

__thread char cxr__sole_me;

/* Waits until the sole user is outside its ring operation: a few instructions, unless it
 * was preempted inside one (or a sandbox's fault containment jumped out of one). Bounded:
 * after 2 s the connection is given up (CXR_EIO) rather than hang every thread of ours
 * that waits for c->lock. */
static void wait_idle(cxr_conn *c) {
  int64_t until = 0;
  for (unsigned i = 0; __atomic_load_n(&c->sole_busy, __ATOMIC_ACQUIRE) != 0; i++) {
    if (i < 64) {
      cxr__cpu_relax();
    } else if (i < 128) {
      sched_yield();
    } else {
      int64_t now = cxr_now_ns();
      if (until == 0) until = now + 2000000000;
      if (now > until) {
        CXR_WARN("rpc: a connection's only calling thread stayed inside a ring operation for "
                 "2 s; giving the connection up");
        cxr__conn_mark_dead(c, CXR_EIO);
        return;
      }
      /* (a sleep, not a yield: a thread of higher priority would never let it run) */
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
  }
}

void cxr__sole_settle(cxr_conn *c, uintptr_t me) {
  pthread_mutex_lock(&c->lock);
  uintptr_t o = __atomic_load_n(&c->sole, __ATOMIC_RELAXED);
  if (o == 0) {
    o = cxr__process_barrier_ready() ? me : CXR__SOLE_SHARED;
    __atomic_store_n(&c->sole, o, __ATOMIC_RELAXED);
  } else if (o != me && o != CXR__SOLE_SHARED) {
    __atomic_store_n(&c->sole, CXR__SOLE_TURNING, __ATOMIC_SEQ_CST);
    cxr__process_barrier();
    wait_idle(c);
    __atomic_store_n(&c->sole, CXR__SOLE_SHARED, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&c->lock);
}
