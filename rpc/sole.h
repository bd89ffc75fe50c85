/* Private to rpc/: a connection's sole user (call.c).
 *
 * Most connections are used by one thread. While that holds, the thread that made the first
 * call pushes requests and pops answers with the rings' single-thread operations, which take
 * no locked instruction: the multi-thread push and pop each take one, on the round trip's
 * critical path (7-21 ns of a 0.15-0.47 µs round trip on the development VM, docs/rpc.md).
 *
 * The first other thread to push or pop turns the connection shared, for good: under the
 * connection's lock it writes CXR__SOLE_TURNING, makes every CPU running a thread of this
 * process pass a full memory barrier (cxr__process_barrier: membarrier(2)), waits until the
 * sole user is outside its ring operation, and only then writes CXR__SOLE_SHARED. Any other
 * thread that sees TURNING waits for the lock: were SHARED written first, a third thread
 * could run a multi-thread operation while the sole user was still inside its own (a
 * request lost, or the tail moved back and the ring wedged).
 *
 * The sole user marks itself busy and then re-reads the owner word with no fence of its own:
 * either its busy mark was visible before the barrier completed (the turning thread waits
 * for it to clear), or the barrier came before its re-read, which then sees the connection
 * turning. Where membarrier is refused (or the kernel is too old) no
 * connection gets a sole user, and every call takes the multi-thread path. */
#ifndef CXRPC_RPC_SOLE_H
#define CXRPC_RPC_SOLE_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc/client.h"

#define CXR__SOLE_SHARED ((uintptr_t)1)
#define CXR__SOLE_TURNING ((uintptr_t)2)
/* The turn gave up waiting for the sole user (2 s): nobody touches the rings again and the
 * connection is dead (CXR_EIO). */
#define CXR__SOLE_GONE ((uintptr_t)3)

/* Names the calling thread: the address of a thread-local byte, unique among live threads
 * (a thread that reuses a dead one's address inherits nothing it could race with). */
extern __thread char cxr__sole_me;

/* The slow path of cxr__sole_begin: the connection's first user claims it, another thread
 * turns it shared (and waits as described above), a thread that finds it turning waits for
 * the turn to end. Serialised by c->lock. */
void cxr__sole_settle(cxr_conn *c, uintptr_t me);

/* Whether the calling thread may use the single-thread ring operations on c now. When it
 * returns true the caller is marked busy and must call cxr__sole_end after the operation. */
static inline bool cxr__sole_begin(cxr_conn *c) {
  const uintptr_t me = (uintptr_t)&cxr__sole_me;
  /* acquire: SHARED is written after the sole user's last operation was seen to end */
  uintptr_t o = __atomic_load_n(&c->sole, __ATOMIC_ACQUIRE);
  if (__builtin_expect(o != me, 0)) {
    if (o == CXR__SOLE_SHARED || o == CXR__SOLE_GONE) return false;
    cxr__sole_settle(c, me);
    if (__atomic_load_n(&c->sole, __ATOMIC_RELAXED) != me) return false;
  }
  __atomic_store_n(&c->sole_busy, 1, __ATOMIC_RELAXED);
  /* Only the compiler is kept from reordering here: the thread turning c shared supplies
   * the CPU's barrier (membarrier). */
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(&c->sole, __ATOMIC_RELAXED) == me) return true;
  __atomic_store_n(&c->sole_busy, 0, __ATOMIC_RELEASE);
  return false;
}

/* After cxr__sole_begin said no: whether the rings are off limits for good (CXR__SOLE_GONE). */
static inline bool cxr__sole_gone(cxr_conn *c) {
  return __atomic_load_n(&c->sole, __ATOMIC_ACQUIRE) == CXR__SOLE_GONE;
}

/* Ends the sole user's ring operation: its writes are visible to whoever sees it idle. */
static inline void cxr__sole_end(cxr_conn *c) {
  __atomic_store_n(&c->sole_busy, 0, __ATOMIC_RELEASE);
}

#endif
