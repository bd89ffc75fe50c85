/*
 * Private to cxrpc's layers (not a public header): this thread's bounds on waits for locks
 * other processes can hold. The pod registry's lock is awaited at most 10 s
 * (shm/registry.c); a caller with a shorter deadline of its own (a connect and its connect
 * timeout) sets it here around the heap calls it makes, so that they give up by then too.
 * A heap's lock is awaited at most 2 s (shm/pages.c), less through a handle capped here,
 * and not at all by a close that need not wait.
 */
#ifndef CXRPC_SHM_REG_DEADLINE_H
#define CXRPC_SHM_REG_DEADLINE_H

#include <pthread.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sets this thread's deadline (a cxr_now_ns() time; 0: none) and returns the one it
 * replaces, for the caller to put back. */
int64_t cxr__reg_deadline_set(int64_t until_ns);

/* Lock waits that end without the lock, shared by a set of handles: about per_s_ns of them
 * each second (a window from the first such wait), after which the handles' waits are a few
 * spins only until the second is over. A wait may last what is left of the second; only one
 * that times out spends it (nothing is reserved: waits under way at once may overshoot by a
 * cap each, once a second). Zero but for per_s_ns; since and spent under `busy`. */
typedef struct cxr__lock_budget {
  int64_t per_s_ns;
  int busy;      /* a spin lock: taken only after the heap's lock was found held */
  int64_t since; /* cxr_now_ns() when the current second began, or 0 */
  int64_t spent; /* ns of timed-out waits in it */
} cxr__lock_budget;

/* Caps how long this handle's users wait for its heap's lock (ns; 0: no cap beyond the
 * lock's own 2 s bound), and, with b (may be NULL; it must outlive the handle), how long
 * they and the other handles of b wait together. An rpc server caps its handles of
 * connection heaps: their lock word is writable by the client, and one left "held" stopped
 * a worker (and every connection it serves) for the whole bound, once per heap; a client
 * reconnecting to jam each fresh heap still cost the worker the cap once per connect. */
void cxr__heap_lock_cap(struct cxr_heap *h, int64_t ns, cxr__lock_budget *b);

/* cxr_heap_close without waiting for the heap's lock (a few spins at most): when it is held,
 * what the close does under it (the handle's cached blocks and holder slot given back) is
 * left to the heap's next locker, as after a close whose wait timed out. For a heap about
 * to be unlinked whose lock word others can write: an rpc server's close of a channel
 * waited for each jammed connection heap in turn (50 ms each, 2 s for the control heap),
 * some of it holding this process's heap mutex and the pod registry's lock. */
void cxr__heap_close_nowait(struct cxr_heap *h);

/* Locks m, giving up with CXR_ETIMEDOUT at until_ns (a cxr_now_ns() time; 0: never): for
 * mutexes another thread may hold while it waits for the registry's lock (the runtime's,
 * rpc's channel mappings). A free mutex costs a trylock, no clock read. */
int cxr__mutex_lock_by(pthread_mutex_t *m, int64_t until_ns);

#ifdef __cplusplus
}
#endif

#endif
