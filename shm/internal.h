/*
 * Private: the process-local side of shm/ (runtime, mappings, handles, thread caches)
 * and the functions the files of shm/ share. Not for other layers.
 */
#ifndef CXRPC_SHM_INTERNAL_H
#define CXRPC_SHM_INTERNAL_H

#include <libpmem2.h>
#include <stdatomic.h>

#include <cxrpc/shm.h>

#include "shm/layout.h"
#include "shm/log.h"
#include "shm/proc.h"

#define CXR_HANDLE_MAGIC 0x48434852u /* "RHCH" */
#define CXR_RANGE_ALIGN (2u << 20)  /* the registry hands out 2 MiB-aligned ranges */

/* A heap's geometry as validated when it was mapped: code indexes shared metadata with
 * these copies, never with the header's fields, which every holder can write. */
typedef struct cxr__geo {
  cxr__hdr *hdr;
  cxr__pme *pm;
  char *base;
  uint64_t npages, data_off, size;
} cxr__geo;

/* One mapping of one heap generation in this process, shared by its handles. */
typedef struct cxr__map {
  struct cxr__map *next;
  char name[CXR_NAME_MAX + 1];
  uint64_t generation;
  uintptr_t addr;
  size_t size;
  struct pmem2_map *pm;
  pmem2_persist_fn persist;
  int refs;
  cxr__geo g;                /* validated geometry */
  int lock_stuck;            /* the last wait for the heap's lock timed out (pages.c; atomic):
                              * on the mapping, so a new handle (a connect's open of a control
                              * heap whose word a client jammed) does not wait the full bound */
} cxr__map;

/* A handle: one lease (holder slot) on one mapping. */
struct cxr_heap {
  uint32_t magic;
  unsigned slot;
  uint32_t gen;              /* the slot's tenancy */
  unsigned epoch;            /* fork epoch the slot was taken in */
  uint64_t serial;           /* unique per handle in this process (thread caches key) */
  cxr__map *m;
  cxr__hdr *hdr;
  char *base;
  cxr__pme *pm;
  uint64_t npages, data_off, size;
  cxr__geo g;                /* the same, for the allocator's internals */
  int64_t lock_cap;          /* cxr__heap_lock_cap (shm/reg_deadline.h), or 0 */
  struct cxr__lock_budget *lock_budget; /* the same, or NULL */
  struct cxr_heap *next;     /* open handles of this process */
};

/* ---- runtime.c ---- */
int cxr__rt_ensure(void);
void cxr__rt_lock(void);
void cxr__rt_unlock(void);
/* cxr__rt_lock, giving up with CXR_ETIMEDOUT at `until` (a cxr_now_ns() time; 0: never):
 * another thread may hold the mutex while it waits for the registry's lock. */
int cxr__rt_lock_by(int64_t until);
/* A header's name in a log line ("heap %.*s"): at most CXR_NAME_MAX bytes are read, so a
 * holder that overwrote the name's terminator (any holder can write the header) cannot make
 * the logger read on into unmapped memory. The handle's private copy is h->m->name. */
#define CXR__HDR_NAME(hdr) (int)CXR_NAME_MAX, (hdr)->name
uint64_t cxr__rt_next_serial(void);
/* This process as a heap lock's holder (cxr__plock_id of its pid and start time), read from
 * /proc once per process and again in a fork's child; 0 if /proc cannot tell. */
uint64_t cxr__rt_lock_id(void);
/* Maps fd at addr inside the reserved window (libpmem2, MAP_FIXED over our own reservation
 * after checking that nothing else sits there). */
int cxr__rt_map(int fd, uintptr_t addr, size_t size, struct pmem2_map **out);
void cxr__rt_unmap(struct pmem2_map **pm);
bool cxr__rt_in_window(uint64_t addr, uint64_t size);
int64_t cxr__realtime_ns(void);
int64_t cxr__lease_ns(void);   /* CXRPC_LEASE_MS, default 10 s */
/* Process-local lists (under cxr__rt_lock). */
extern cxr__map *cxr__maps;
extern cxr_heap *cxr__heaps;

/* ---- alloc.c ---- */
/* What a rebuild reclaims: blocks owned by slot s in tenancy gen[s] (0 = none). */
typedef struct cxr__reclaim {
  uint32_t gen[CXR_MAX_HOLDERS];
  bool clean[CXR_MAX_HOLDERS];  /* closed cleanly: allocated blocks stay (no owner) */
} cxr__reclaim;
void cxr__heap_format(const cxr__geo *g);
int cxr__heap_lock(cxr_heap *h);
/* The lock if it is free or freed within a few spins, else CXR_EBUSY at once (not logged,
 * the handle not marked stuck): for a close that can leave its locked work to the heap's
 * next locker (heap.c). */
int cxr__heap_lock_now(cxr_heap *h);
extern _Thread_local int cxr__lock_reaped; /* holders reaped while recovering the lock */
void cxr__heap_unlock(cxr_heap *h);
/* Rebuilds free runs and central lists from page-map heads and block tags, reclaiming
 * what `r` names (may be NULL). Heap lock held. */
void cxr__heap_rebuild(const cxr__geo *g, const cxr__reclaim *r);
/* Bytes in ALLOC and CACHED state; works on a mapping at any address. */
void cxr__heap_usage(const cxr__geo *g, size_t *used, size_t *cached);
/* The geometry of a mapping at `base` whose header copy `hdr` was validated. */
void cxr__geo_init(cxr__geo *g, void *base, const cxr__hdr *valid);
/* This thread's cache for h: flush everything back (heap lock taken inside; with !wait only
 * if it is free at once, else the cached blocks stay tagged with h's slot, and go back when
 * the slot is released). */
void cxr__tcache_flush(cxr_heap *h, bool drop, bool wait);
void cxr__tcache_after_fork(void);
void cxr__tcache_counters(cxr_heap *h, uint64_t *allocs, uint64_t *frees);

/* ---- heap.c ---- */
/* Finds dead holders and reclaims them. Heap lock held. Returns how many. */
int cxr__heap_reap_locked(cxr_heap *h);
/* Re-attaches a handle inherited over fork (new lease for this process). */
int cxr__heap_reattach(cxr_heap *h);
static inline int cxr__heap_check(const cxr_heap *h) {
  if (h == NULL || h->magic != CXR_HANDLE_MAGIC) return CXR_EINVAL;
  return 0;
}
static inline int cxr__heap_ready(cxr_heap *h) {
  if (cxr__heap_check(h) != 0) return CXR_EINVAL;
  if (__builtin_expect(cxr__fork_inherited(h->epoch), 0))
    return cxr__heap_reattach(h);
  return 0;
}
void cxr__slot_renew(cxr_heap *h);

/* ---- lease.c ---- */
int cxr__slot_take(cxr_heap *h);                    /* heap lock held */
bool cxr__slot_dead(const cxr__slot *s, int64_t now);
void cxr__slots_release(const cxr__geo *g, const cxr__reclaim *r);

/* ---- heap.c ---- */
struct cxr__reg_entry;
struct cxr__reg;
int cxr__file_size(int fd, uint64_t *size);
int cxr__check_header(int fd, const struct cxr__reg_entry *e, cxr__hdr *out);
cxr__map *cxr__map_find(const char *name, uint64_t generation);
void cxr__copy_str(char *dst, size_t cap, const char *src);

/* ---- sweep.c ---- */
bool cxr__is_device(const char *path);
/* Removes heaps marked for removal that no live process holds (only `only` if not NULL),
 * and stray heap files. Registry locked. */
void cxr__sweep(struct cxr__reg *r, struct cxr__reg_entry *only);

#endif
