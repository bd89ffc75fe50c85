/*
 * Private: what the allocator's files share: size classes, addressing inside a mapping by
 * validated geometry, and the page-run operations (pages.c) used by the allocator (alloc.c).
 */
#ifndef CXRPC_SHM_META_H
#define CXRPC_SHM_META_H

#include "shm/internal.h"

static const uint32_t class_size[CXR_NCLASS] = {
    16,   32,   48,   64,   80,   96,   112,  128,  160,  192,  224,
    256,  320,  384,  448,  512,  640,  768,  896,  1024, 1280, 1536,
    1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192};

static inline unsigned size_class(size_t size) {
  if (size <= 128) return size == 0 ? 0 : (unsigned)((size + 15) / 16 - 1);
  size_t s = size - 1;
  unsigned b = 63u - (unsigned)__builtin_clzll(s);
  return 8u + (b - 7u) * 4u + (unsigned)((s >> (b - 2u)) & 3u);
}
static inline uint32_t stride_of(unsigned c) { return class_size[c] + (uint32_t)sizeof(cxr__blk); }
static inline uint32_t blocks_per_slab(unsigned c) { return CXR_SLAB_PAGES * CXR_PAGE / stride_of(c); }

/* Geometry comes from the handle's copy validated at open, never from the shared header,
 * which any holder can write: indices read from shared memory are checked against it. */
static inline cxr__pme *pmap(const cxr__geo *g) { return g->pm; }
static inline char *page_addr(const cxr__geo *g, uint64_t pg) {
  return g->base + g->data_off + pg * CXR_PAGE;
}
static inline cxr__blk *blk_at(const cxr__geo *g, uint64_t off) { return (cxr__blk *)(g->base + off); }
static inline uint64_t off_of(const cxr__geo *g, const void *p) {
  return (uint64_t)((const char *)p - g->base);
}

#define LD(x) atomic_load_explicit(&(x), memory_order_acquire)
#define ST(x, v) atomic_store_explicit(&(x), (v), memory_order_release)

/* ---- pages.c (heap lock held) ---- */
/* Takes n pages (first fit); the caller writes CONT entries and commits the head with
 * cxr__run_commit. -1 when no run is large enough. */
int64_t cxr__run_take(const cxr__geo *g, uint32_t n);
void cxr__run_commit(const cxr__geo *g, uint32_t pg, uint32_t n, uint64_t w0, uint64_t w1);
/* Frees the run of n pages headed at pg (commits FREE first, then coalesces); n as read
 * from the head once. CXR_ECORRUPT, and nothing written, when n does not fit the map. */
int cxr__run_release(const cxr__geo *g, uint32_t pg, uint32_t n);
/* Is `off` the header of a block of class c inside a slab of class c? */
bool cxr__blk_valid(const cxr__geo *g, uint64_t off, unsigned c);

#endif
