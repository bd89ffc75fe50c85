/* Connections and channels inherited over fork(2). A child gets the parent's rings, its
 * pending-call ids and its channel state, but none of its threads: a call from the child
 * would pop answers meant for the parent (and the parent's for it), a cancel would name the
 * parent's call, a close would give the parent's slot back or close its channel for every
 * client. So each connection and channel records the process's fork generation when it is
 * made, an atfork hook bumps the generation in every child, and in a child an inherited
 * object refuses calls with CXR_ECLOSED and a close only forgets it. */
#include <pthread.h>

#include "rpc/internal.h"

uint32_t cxr__fork_gen;

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void at_child(void) {
  __atomic_store_n(&cxr__fork_gen, __atomic_load_n(&cxr__fork_gen, __ATOMIC_RELAXED) + 1,
                   __ATOMIC_RELAXED);
}

static void install(void) { pthread_atfork(NULL, NULL, at_child); }

uint32_t cxr__fork_gen_now(void) {
  pthread_once(&once, install);
  return __atomic_load_n(&cxr__fork_gen, __ATOMIC_RELAXED);
}
