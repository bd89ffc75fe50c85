/* A connection's sole user: claiming it, and turning it shared (rpc/sole.h says why). */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>

#include "rpc/internal.h"
#include "rpc/sole.h"

__thread char cxr__sole_me;

void cxr__sole_settle(cxr_conn *c, uintptr_t me) {
  pthread_mutex_lock(&c->lock);
  uintptr_t o = __atomic_load_n(&c->sole, __ATOMIC_RELAXED);
  if (o == 0) {
    o = cxr__process_barrier_ready() ? me : CXR__SOLE_SHARED; 
    __atomic_store_n(&c->sole, o, __ATOMIC_RELAXED);
  } else if (o != me && o != CXR__SOLE_SHARED) {
    __atomic_store_n(&c->sole, CXR__SOLE_SHARED, __ATOMIC_SEQ_CST);
    cxr__process_barrier();
    /* The sole user holds the mark for one ring operation: a few instructions, unless it
     * was preempted inside it. */
    for (unsigned i = 0; __atomic_load_n(&c->sole_busy, __ATOMIC_ACQUIRE) != 0; i++)
      if (i >= 64) sched_yield();
  }
  pthread_mutex_unlock(&c->lock);
}
