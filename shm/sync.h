/*
 * Private (usable by other layers as "shm/sync.h"): waiting on words in shared memory, and
 * the lock a heap's holders share.
 *
 * Why not a process-shared robust pthread mutex: glibc keeps a robust mutex's links to the
 * owning thread's robust list inside the mutex and follows them when it unlocks, so in a
 * heap every holder can write, another holder that rewrote them while we held the lock made
 * our unlock store where it chose. This lock keeps nothing but one word in shared memory:
 * the holder's identity (pid and the low 32 bits of its start time) and a waiters bit.
 * Unlock writes only that word, and only if it still names us. A holder that died is found
 * by its identity (no such process, a zombie, or another start time) by a waiter, which
 * takes the lock over and tells its caller to repair what the dead one may have left half
 * done. Identities are of this host's processes in this pid namespace, as heap leases are.
 */
#ifndef CXRPC_SHM_SYNC_H
#define CXRPC_SHM_SYNC_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* FUTEX_WAIT on a shared word while *w == val, at most timeout_ns (<= 0: no wait). */
void cxr__futex_wait(uint32_t *w, uint32_t val, int64_t timeout_ns);
void cxr__futex_wake(uint32_t *w, int n);

/* One step of a spin-wait (pause on x86). */
static inline void cxr__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

/* Lives in shared memory; all zero is unlocked. Read and written only with atomics. The
 * futex is its low 32 bits (pid and waiters bit) on this little-endian machine. */
typedef struct cxr__plock {
  uint64_t word;
} cxr__plock;

#define CXR_PLOCK_PID_MASK 0x3fffffffull
#define CXR_PLOCK_WAITERS (1ull << 31)
/* cxr__plock_lock took the lock over from a holder that died: repair, then go on. */
#define CXR_PLOCK_TAKEN_OVER 1

/* The word that names process (pid, start_time) as holder. */
uint64_t cxr__plock_id(int32_t pid, uint64_t start_time);
/* True if the holder a lock word names is not running (also for words no process could
 * have written: pid 0, beyond the kernel's limit). False when this thread cannot tell (it
 * may not open /proc): it then waits like for a live holder. */
bool cxr__plock_holder_dead(uint64_t word);
/* 0, or CXR_EBUSY. No system call, no clock read. */
int cxr__plock_try(cxr__plock *l, uint64_t me);
/* Waits for the lock at most wait_ns: 0, CXR_PLOCK_TAKEN_OVER, or CXR_ETIMEDOUT (a holder
 * that lives and does not unlock, or a word a peer keeps naming a live process with). */
int cxr__plock_lock(cxr__plock *l, uint64_t me, int64_t wait_ns);
/* Releases the lock if its word still names `me` (else a peer rewrote it: left as is). */
void cxr__plock_unlock(cxr__plock *l, uint64_t me);
/* The word naming this process (read from /proc, not cached: shm's runtime keeps it per
 * process), or 0 if /proc cannot tell. */
uint64_t cxr__plock_self_id(void);

#ifdef __cplusplus
}
#endif
#endif
