/* The handler the cancellation tests run, shared by the pod peers (tests/rpc) and the
 * cross-rack peer (tests/netns). */
#ifndef CXRPC_TESTS_RPC_SPIN_H
#define CXRPC_TESTS_RPC_SPIN_H

#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cxrpc/rpc.h>

/* What spin handlers of one process saw: runs started, and runs that stopped because the
 * caller gave up. Updated atomically; tests read them in process or through a call. */
typedef struct spin_counts {
  int64_t started, stopped;
} spin_counts;

/* Works in 1 ms steps until the caller gives up (cxr_call_cancelled: a cancel or a passed
 * deadline) or `ms` (an int64_t at args, 0-60000) pass. user: the spin_counts to update. */
static inline int spin_handler(cxr_call *c, const void *args, void **result, void *user) {
  (void)result;
  spin_counts *k = (spin_counts *)user;
  int64_t ms;
  if (args == NULL) return CXR_EINVAL;
  memcpy(&ms, args, sizeof ms);
  if (ms < 0 || ms > 60000) return CXR_EINVAL;
  __atomic_fetch_add(&k->started, 1, __ATOMIC_SEQ_CST);
  for (int64_t i = 0; i < ms; i++) {
    if (cxr_call_cancelled(c)) {
      __atomic_fetch_add(&k->stopped, 1, __ATOMIC_SEQ_CST);
      return CXR_ECANCELED;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

#endif
