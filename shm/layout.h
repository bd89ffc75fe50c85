/*
 * Private: the on-file layout of a heap, shared by every process that maps it.
 *
 *   [header pages: struct cxr__hdr with the holders' lock, holder slots, central lists]
 *   [page map: one struct cxr__pme (16 bytes) per data page]
 *   [data pages]
 *
 * Everything inside the file is addressed by offsets from the heap base, never by
 * pointers, so that a tool can read a heap mapped at any address (cxrpcctl) and a
 * corrupted offset is checked before use.
 *
 * Crash-consistency rule: under the heap lock, every change commits with one final
 * 8-byte store (the page-map head word, or a block's tag word). The only structures
 * that may be half-updated when a holder dies are the central lists and the free-run
 * list; they are rebuilt from page-map heads and block tags (cxr__heap_rebuild).
 */
#ifndef CXRPC_SHM_LAYOUT_H
#define CXRPC_SHM_LAYOUT_H

#include <stdint.h>

/* C++ (white-box tests) sees the same layout through std::atomic. */
#ifdef __cplusplus
#include <atomic>
#define CXR_ATOMIC(T) std::atomic<T>
#else
#include <stdatomic.h>
#define CXR_ATOMIC(T) _Atomic T
#endif

#include <cxrpc/base.h>

#include "shm/sync.h"

#define CXR_HEAP_MAGIC 0x0050414548525843ull /* "CXRHEAP\0" little-endian */
#define CXR_HEAP_VERSION 2u /* 2: cxr__plock instead of a robust pthread mutex */
#define CXR_PAGE 4096u
#define CXR_SLAB_PAGES 16u       /* a slab is a 64 KiB run of blocks of one class */
#define CXR_NCLASS 32u
#define CXR_SMALL_MAX 8192u      /* larger requests are page runs without in-band header */
#define CXR_MAX_HOLDERS 128u     /* < CXR_NO_OWNER: the owner slot is 8 bits in tags */
#define CXR_NO_OWNER 0xFFu       /* owner slot of blocks whose holder closed cleanly */
#define CXR_HEAP_MIN (128u * 1024u)

/* Heap flags (header and registry). */
#define CXR_HF_KEEP_ORPHANS 1u
#define CXR_HF_REMOVE_ON_CLOSE 2u

/* ---- blocks: 16-byte in-band header before every small allocation ---- */
enum { CXR_BLK_FREE = 0xF5, CXR_BLK_CACHED = 0xCA, CXR_BLK_ALLOC = 0xA1 };

typedef struct cxr__blk {
  CXR_ATOMIC(uint64_t) tag;   /* state:8 | class:8 | owner slot:8 | 0:8 | owner slot gen:32 */
  CXR_ATOMIC(uint64_t) next;  /* central free list: offset of the next FREE block, 0 = end */
} cxr__blk;

static inline uint64_t cxr__tag(unsigned state, unsigned cls, unsigned slot, uint32_t gen) {
  return (uint64_t)state << 56 | (uint64_t)cls << 48 | (uint64_t)slot << 40 | gen;
}
static inline unsigned cxr__tag_state(uint64_t t) { return (unsigned)(t >> 56); }
static inline unsigned cxr__tag_class(uint64_t t) { return (unsigned)(t >> 48) & 0xFF; }
static inline unsigned cxr__tag_slot(uint64_t t) { return (unsigned)(t >> 40) & 0xFF; }
static inline uint32_t cxr__tag_gen(uint64_t t) { return (uint32_t)t; }

/* ---- page map: one entry per data page ---- */
enum {
  CXR_PM_NONE = 0,   /* never written (inside a free run) */
  CXR_PM_FREE = 1,   /* head of a free run: w0.npages, w1 = next:32 | prev:32 (page + 1) */
  CXR_PM_SLAB = 2,   /* head of a slab: w0.class */
  CXR_PM_LARGE = 3,  /* head of a page-run allocation: w0.slot, w1.gen */
  CXR_PM_CONT = 4,   /* inside an allocated run: w1.back = head page */
  CXR_PM_FTAIL = 5,  /* last page of a free run of 2+ pages: w1.back = head page */
};

typedef struct cxr__pme {
  CXR_ATOMIC(uint64_t) w0;  /* kind:8 | class:8 | slot:8 | 0:8 | npages:32 */
  CXR_ATOMIC(uint64_t) w1;  /* gen:32 | back:32, or next:32 | prev:32 for free heads */
} cxr__pme;

static inline uint64_t cxr__pm_w0(unsigned kind, unsigned cls, unsigned slot, uint32_t n) {
  return (uint64_t)kind << 56 | (uint64_t)cls << 48 | (uint64_t)slot << 40 | n;
}
static inline unsigned cxr__pm_kind(uint64_t w) { return (unsigned)(w >> 56); }
static inline unsigned cxr__pm_class(uint64_t w) { return (unsigned)(w >> 48) & 0xFF; }
static inline unsigned cxr__pm_slot(uint64_t w) { return (unsigned)(w >> 40) & 0xFF; }
static inline uint32_t cxr__pm_npages(uint64_t w) { return (uint32_t)w; }

/* ---- holder slots (leases) ---- */
/* CLOSED: its holder closed but could not take the lock to release it (a lock word nobody
 * releases); the next reaper releases it as a clean close, and no sweep counts it. */
enum { CXR_SLOT_FREE = 0, CXR_SLOT_LIVE = 1, CXR_SLOT_CLOSED = 2 };

typedef struct cxr__slot {
  CXR_ATOMIC(uint32_t) state;     /* written last when taken, first when released */
  uint32_t gen;               /* identifies this tenancy in block tags */
  int32_t pid;
  uint32_t pad0;
  uint64_t start_time;        /* /proc/pid/stat field 22: pid reuse is not liveness */
  uint64_t host;              /* boot id hash: pids mean nothing on another host */
  CXR_ATOMIC(int64_t) lease_ns;   /* CLOCK_REALTIME of the last renewal */
  CXR_ATOMIC(uint64_t) allocs, frees;
  char pad[64];
} __attribute__((aligned(64))) cxr__slot;

typedef struct cxr__hdr {
  /* Checked on every open. */
  uint64_t magic;
  uint32_t version;
  uint32_t hdr_size;          /* bytes of this struct (layout fingerprint) */
  uint64_t size;              /* bytes of the heap file */
  uint64_t addr;              /* the address every process maps it at */
  uint64_t generation;        /* same as the registry entry's */
  char name[CXR_NAME_MAX + 1];
  uint32_t flags;             /* CXR_HF_* */
  int32_t owner_pid;          /* creator, informational */
  uint64_t npages;            /* data pages */
  uint64_t map_off;           /* offset of the page map */
  uint64_t data_off;          /* offset of the first data page */

  cxr__plock lock;            /* the holders' lock (shm/sync.h); all zero is unlocked */
  CXR_ATOMIC(uint64_t) root_off;  /* cxr_heap_set_root; 0 = NULL */
  uint32_t slot_gen_next;
  uint32_t free_runs;         /* first free run (page + 1), 0 = none */
  uint64_t retired_allocs, retired_frees; /* counters of released slots */
  uint64_t central[CXR_NCLASS];          /* offset of the first FREE block per class */
  uint64_t rebuilds;                     /* how often lists were rebuilt (diagnostics) */
  cxr__slot slots[CXR_MAX_HOLDERS];
} cxr__hdr;

/* Pages taken by the header, then by the map, for a file of `size` bytes. */
static inline void cxr__geometry(uint64_t size, uint64_t *map_off, uint64_t *data_off,
                                 uint64_t *npages) {
  uint64_t hdr_pages = (sizeof(cxr__hdr) + CXR_PAGE - 1) / CXR_PAGE;
  uint64_t total = size / CXR_PAGE;
  uint64_t rest = total > hdr_pages ? total - hdr_pages : 0;
  /* n data pages need ceil(16 n / 4096) map pages: n + ceil(n / 256) <= rest. */
  uint64_t n = rest * 256 / 257;
  while (n > 0 && n + (n * sizeof(cxr__pme) + CXR_PAGE - 1) / CXR_PAGE > rest) n--;
  uint64_t map_pages = (n * sizeof(cxr__pme) + CXR_PAGE - 1) / CXR_PAGE;
  *map_off = hdr_pages * CXR_PAGE;
  *data_off = (hdr_pages + map_pages) * CXR_PAGE;
  *npages = n;
}

#endif
