/*
 * Private: the pod registry, <root>/registry. A fixed table of heaps (name, file, address
 * range, generation, flags) under an exclusive flock, so creators in different processes
 * are serialized and a holder that dies releases it. It is the only place that hands out
 * address ranges. The file is removed when its last entry goes; a process that locked a
 * file just removed sees it (st_nlink == 0) and opens the new one.
 */
#ifndef CXRPC_SHM_REGISTRY_H
#define CXRPC_SHM_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include <cxrpc/base.h>

#define CXR_REG_ENTRIES 256u
#define CXR_REG_UNLINKED 0x100u  /* name removed: the file goes with its last holder */

typedef struct cxr__reg_entry {
  uint32_t used;        /* written last when added, first when removed */
  uint32_t flags;       /* CXR_HF_* | CXR_REG_UNLINKED */
  char name[CXR_NAME_MAX + 1];
  char path[256];
  uint64_t addr, size, generation;
  uint32_t pod, pad;
} cxr__reg_entry;

typedef struct cxr__reg_file {
  uint64_t magic;
  uint32_t version, nentries;
  uint64_t last_generation;
  cxr__reg_entry e[CXR_REG_ENTRIES];
} cxr__reg_file;

typedef struct cxr__reg {
  int fd;
  cxr__reg_file *f;
} cxr__reg;

/* Locks (and with `create`, creates) the registry of the current root. CXR_ENOENT when it
 * does not exist and !create; CXR_ETIMEDOUT when its flock stays taken for
 * cxr__reg_wait_ns (any process that can open the file can hold it; 10 s, tests lower it). */
extern int64_t cxr__reg_wait_ns;
/* This thread's deadline (shm/reg_deadline.h), or 0. */
int64_t cxr__reg_deadline_get(void);
/* Shortens *bound (ns from `now`) to this thread's deadline when that comes first: true
 * then (the wait's end is the caller's, not a sign of a stuck lock). */
bool cxr__reg_deadline_clip(int64_t now, int64_t *bound);
int cxr__reg_lock(cxr__reg *r, bool create);
/* Unlocks; removes the file when it has no entry left. */
void cxr__reg_unlock(cxr__reg *r);
cxr__reg_entry *cxr__reg_find(cxr__reg *r, const char *name);
/* Picks a free 2 MiB-aligned range in this pod's slice (or checks `fixed`). */
int cxr__reg_range(cxr__reg *r, uint64_t size, uint64_t fixed, uint64_t *addr);
cxr__reg_entry *cxr__reg_slot(cxr__reg *r);
uint64_t cxr__reg_next_generation(cxr__reg *r);
void cxr__reg_remove(cxr__reg *r, cxr__reg_entry *e);

#endif
