/* A connection's sole user: claiming it, and turning it shared (rpc/sole.h says why). */
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "rpc/internal.h"
#include "rpc/sole.h"
#include "shm/log.h"

__thread char cxr__sole_me;

/* How long the turn waits before it gives up. Each sleep counts at most 10 ms toward it, so a
 * process stopped meanwhile (SIGSTOP, a debugger) does not give up as it wakes. */
#define GIVE_UP_NS 2000000000
#define STEP_MAX_NS 10000000

/* Waits until the sole user is outside its ring operation: a few instructions, unless it
 * was preempted inside one (or a sandbox's fault containment jumped out of one). Returns
 * false when it gave up: the caller then ends the connection rather than hang every thread
 * of ours that waits for c->lock. */
static bool wait_idle(cxr_conn *c) {
  int64_t waited = 0, last = 0;
  for (unsigned i = 0; __atomic_load_n(&c->sole_busy, __ATOMIC_ACQUIRE) != 0; i++) {
    if (i < 64) {
      cxr__cpu_relax();
      continue;
    }
    if (i < 128) {
      sched_yield();
      continue;
    }
    int64_t now = cxr_now_ns();
    if (last != 0) waited += now - last < STEP_MAX_NS ? now - last : STEP_MAX_NS;
    last = now;
    if (waited >= GIVE_UP_NS) return false;
    /* (a sleep, not a yield: a thread of higher priority would never let it run) */
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return true;
}

void cxr__sole_settle(cxr_conn *c, uintptr_t me) {
  /* A thread cancelled in here would leave c->lock held and the connection turning. */
  int cancel_state;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
  pthread_mutex_lock(&c->lock);
  uintptr_t o = __atomic_load_n(&c->sole, __ATOMIC_RELAXED);
  if (o == 0) {
    o = cxr__process_barrier_ready() ? me : CXR__SOLE_SHARED;
    __atomic_store_n(&c->sole, o, __ATOMIC_RELAXED);
  } else if (o != me && o != CXR__SOLE_SHARED && o != CXR__SOLE_GONE) {
    __atomic_store_n(&c->sole, CXR__SOLE_TURNING, __ATOMIC_SEQ_CST);
    cxr__process_barrier();
    if (wait_idle(c)) {
      __atomic_store_n(&c->sole, CXR__SOLE_SHARED, __ATOMIC_RELEASE);
    } else {
      /* The sole user may still finish its operation some day: nobody else may touch the
       * rings again, so the connection ends. */
      cxr__conn_mark_dead(c, CXR_EIO);
      __atomic_store_n(&c->sole, CXR__SOLE_GONE, __ATOMIC_RELEASE);
      CXR_WARN("rpc: a connection's only calling thread stayed inside a ring operation for "
               "over 2 s; the connection ends (CXR_EIO)");
    }
  }
  pthread_mutex_unlock(&c->lock);
  pthread_setcancelstate(cancel_state, NULL);
}
