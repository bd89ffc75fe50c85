/*
 * Private (usable by other layers as "shm/proc.h"): process identity and liveness.
 * A pid alone is not an identity (pids are reused), so a process is (pid, start time,
 * host): start time is field 22 of /proc/PID/stat, host a hash of the kernel boot id.
 */
#ifndef CXRPC_SHM_PROC_H
#define CXRPC_SHM_PROC_H

#include <stdbool.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdatomic.h>
#endif
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cxr__proc_id {
  int32_t pid;
  uint32_t pad;
  uint64_t start_time;  /* clock ticks since boot */
  uint64_t host;        /* cxr__host_id() of the machine it runs on */
} cxr__proc_id;

/* This process. 0 or CXR_EIO. */
int cxr__proc_self_id(cxr__proc_id *out);
/* Start time of `pid`: 0, CXR_ENOENT if no such process or it is a zombie (a zombie leader
 * whose other threads still run counts as running), or CXR_EIO if this thread cannot tell
 * (it may not open /proc: a sandbox worker, no descriptors left; /proc hides the process). */
int cxr__proc_start_time(pid_t pid, uint64_t *start_time);
/* True while the process runs (not a zombie) with the same start time. A process on
 * another host cannot be checked here: returns true (callers use leases for those); so
 * does a thread that cannot tell (CXR_EIO above). */
bool cxr__proc_alive(const cxr__proc_id *id);
/* A hash of /proc/sys/kernel/random/boot_id, never 0. */
uint64_t cxr__host_id(void);

#ifndef __cplusplus
/* This process's fork epoch (shm/runtime.c): 1, bumped in every child made by fork(2) by the
 * atfork hook that cxr_init installs. An object records it when made; in a child it sees a
 * newer one and knows it was inherited (heap handles, rpc's connections and channels). */
extern _Atomic unsigned cxr__fork_epoch;
/* True in a child of the process that made an object recorded under `made`. */
static inline bool cxr__fork_inherited(unsigned made) {
  return made != atomic_load_explicit(&cxr__fork_epoch, memory_order_relaxed);
}
#endif

#ifdef __cplusplus
}
#endif
#endif
