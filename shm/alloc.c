/*
 * The multi-process allocator.
 *
 * Design (see docs/shm.md):
 * - Small requests (<= 8 KiB) use 32 size classes (16-byte steps to 128, then four steps
 *   per power of two). Blocks live in slabs, 64 KiB page runs of one class, each block
 *   with a 16-byte in-band header {tag, next}; the tag holds the state (FREE, CACHED,
 *   ALLOC), the class, the owner's holder slot and that slot's tenancy generation.
 * - Per-thread caches are process-local arrays of block pointers per class (no shared
 *   writes on the fast path except the block's own tag). They refill and flush in batches
 *   from per-class central lists under the heap's robust mutex. A cached block is tagged
 *   CACHED with its owner, so a dead process's caches are found by scanning tags: they need
 *   not live in shared memory.
 * - Larger requests and cxr_heap_alloc_pages take page runs: first fit over a list of free
 *   runs, coalesced on free with boundary tags in the page map. No in-band header, so
 *   page allocations are pure pages that can be sealed (mprotect).
 * - Under the mutex every change commits with one final 8-byte store; when a lock holder
 *   dies (EOWNERDEAD) or a holder is reaped, cxr__heap_rebuild recomputes free runs and
 *   central lists from page-map heads and tags. Tag transitions that can race with a
 *   reclaim (a live process freeing a block a dead one owned) use compare-and-swap.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shm/internal.h"

#define TC_CAP 64u    /* blocks per class in a thread cache */
#define TC_BATCH 32u  /* blocks moved per refill / flush */
#define TC_HEAPS 8u   /* heaps with a cache per thread; more heaps go to the central lists */

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

/* ---------------- page runs (heap lock held) ---------------- */

/* Is pg the head of a well-formed free run (links inside the map)? Shared metadata is
 * checked before it is followed: a damaged map must not make us write out of bounds. */
static bool run_ok(const cxr__geo *g, uint32_t pg) {
  if (pg >= g->npages) return false;
  uint64_t w0 = LD(g->pm[pg].w0), w1 = LD(g->pm[pg].w1);
  uint32_t rn = cxr__pm_npages(w0);
  return cxr__pm_kind(w0) == CXR_PM_FREE && rn >= 1 && rn <= g->npages - pg &&
         (w1 >> 32) <= g->npages && (uint32_t)w1 <= g->npages;
}

static void run_unlink(const cxr__geo *g, uint32_t pg) {
  cxr__hdr *hdr = g->hdr;
  cxr__pme *pm = pmap(g);
  uint64_t w1 = LD(pm[pg].w1);
  uint32_t next = (uint32_t)(w1 >> 32), prev = (uint32_t)w1;
  if (next > g->npages) next = 0;
  if (prev > g->npages) prev = 0;
  if (prev) {
    uint64_t p1 = LD(pm[prev - 1].w1);
    ST(pm[prev - 1].w1, (uint64_t)next << 32 | (uint32_t)p1);
  } else {
    hdr->free_runs = next;
  }
  if (next) {
    uint64_t n1 = LD(pm[next - 1].w1);
    ST(pm[next - 1].w1, (n1 & 0xFFFFFFFF00000000ull) | prev);
  }
}

static void run_link(const cxr__geo *g, uint32_t pg) {
  cxr__hdr *hdr = g->hdr;
  cxr__pme *pm = pmap(g);
  uint32_t head = hdr->free_runs;
  if (head > g->npages) head = 0; /* damaged: the next rebuild finds the lost runs */
  ST(pm[pg].w1, (uint64_t)head << 32);
  if (head) {
    uint64_t h1 = LD(pm[head - 1].w1);
    ST(pm[head - 1].w1, (h1 & 0xFFFFFFFF00000000ull) | (pg + 1));
  }
  hdr->free_runs = pg + 1;
}

/* Writes a free run [pg, pg + n): head, tail, list. */
static void run_make_free(const cxr__geo *g, uint32_t pg, uint32_t n) {
  cxr__pme *pm = pmap(g);
  if (n > 1) {
    ST(pm[pg + n - 1].w1, pg);
    ST(pm[pg + n - 1].w0, cxr__pm_w0(CXR_PM_FTAIL, 0, 0, 0));
  }
  ST(pm[pg].w0, cxr__pm_w0(CXR_PM_FREE, 0, 0, n));
  run_link(g, pg);
}

/* Takes n pages (first fit). The caller writes CONT entries, then commits the head.
 * A damaged free-run list (bad entry, cycle) is rebuilt from the page map once. */
static int64_t run_take(const cxr__geo *g, uint32_t n) {
  cxr__hdr *hdr = g->hdr;
  cxr__pme *pm = pmap(g);
  for (int attempt = 0; attempt < 2; attempt++) {
    bool damaged = false;
    uint64_t guard = 0;
    for (uint32_t r = hdr->free_runs; r != 0; guard++) {
      uint32_t pg = r - 1;
      if (guard > g->npages || !run_ok(g, pg)) {
        damaged = true;
        break;
      }
      uint32_t rn = cxr__pm_npages(LD(pm[pg].w0));
      uint32_t next = (uint32_t)(LD(pm[pg].w1) >> 32);
      if (rn >= n) {
        run_unlink(g, pg);
        /* The remainder becomes its own run; pg's head still covers it until the caller's
         * final store, so a crash here leaves one consistent free run. */
        if (rn > n) run_make_free(g, pg + n, rn - n);
        return pg;
      }
      r = next;
    }
    if (!damaged) return -1;
    CXR_ERR("heap %s: free-run list damaged; rebuilding", hdr->name);
    cxr__heap_rebuild(g, NULL);
  }
  return -1;
}

static void run_commit(const cxr__geo *g, uint32_t pg, uint32_t n, uint64_t w0, uint64_t w1) {
  cxr__pme *pm = pmap(g);
  for (uint32_t i = 1; i < n; i++) {
    ST(pm[pg + i].w1, pg);
    ST(pm[pg + i].w0, cxr__pm_w0(CXR_PM_CONT, 0, 0, 0));
  }
  ST(pm[pg].w1, w1);
  ST(pm[pg].w0, w0); /* commit */
}

/* Frees the run headed at pg: commits FREE first, then coalesces with its neighbours. */
static void run_release(const cxr__geo *g, uint32_t pg) {
  cxr__pme *pm = pmap(g);
  uint32_t n = cxr__pm_npages(LD(pm[pg].w0));
  ST(pm[pg].w1, 0);
  ST(pm[pg].w0, cxr__pm_w0(CXR_PM_FREE, 0, 0, n));
  uint32_t next = pg + n;
  if (next < g->npages && run_ok(g, next)) {
    run_unlink(g, next);
    n += cxr__pm_npages(LD(pm[next].w0));
  }
  if (pg > 0) {
    uint64_t pw = LD(pm[pg - 1].w0);
    uint32_t p = UINT32_MAX;
    if (cxr__pm_kind(pw) == CXR_PM_FREE) p = pg - 1;
    else if (cxr__pm_kind(pw) == CXR_PM_FTAIL) p = (uint32_t)LD(pm[pg - 1].w1);
    if (p < pg && run_ok(g, p)) {
      uint64_t hw = LD(pm[p].w0);
      if (p + cxr__pm_npages(hw) == pg) {
        run_unlink(g, p);
        n += cxr__pm_npages(hw);
        pg = p;
      }
    }
  }
  run_make_free(g, pg, n);
}

/* ---------------- format, lock, rebuild ---------------- */

void cxr__geo_init(cxr__geo *g, void *base, const cxr__hdr *valid) {
  g->hdr = base;
  g->base = base;
  g->pm = (cxr__pme *)((char *)base + valid->map_off);
  g->npages = valid->npages;
  g->data_off = valid->data_off;
  g->size = valid->size;
}

void cxr__heap_format(const cxr__geo *g) {
  cxr__hdr *hdr = g->hdr;
  for (unsigned c = 0; c < CXR_NCLASS; c++) hdr->central[c] = 0;
  hdr->free_runs = 0;
  if (g->npages > 0) run_make_free(g, 0, (uint32_t)g->npages);
}

_Thread_local int cxr__lock_reaped;

int cxr__heap_lock(cxr_heap *h) {
  int rc = pthread_mutex_lock(&h->hdr->lock);
  if (rc == 0) return 0;
  if (rc == EOWNERDEAD) {
    /* A holder died inside an allocator operation: lists may be half-updated. */
    CXR_WARN("heap %s: a lock holder died; rebuilding free lists", h->hdr->name);
    cxr__heap_rebuild(&h->g, NULL);
    cxr__lock_reaped += cxr__heap_reap_locked(h);
    pthread_mutex_consistent(&h->hdr->lock);
    return 0;
  }
  CXR_ERR("heap %s: lock failed: %d", h->hdr->name, rc);
  return rc == ENOTRECOVERABLE ? CXR_ECORRUPT : CXR_EIO;
}

void cxr__heap_unlock(cxr_heap *h) { pthread_mutex_unlock(&h->hdr->lock); }

static bool reclaims(const cxr__reclaim *r, unsigned slot, uint32_t gen) {
  return r && slot < CXR_MAX_HOLDERS && gen != 0 && r->gen[slot] == gen;
}

/* One slab: reclaims tags of dead owners, links FREE blocks into the central list.
 * Returns true when every block is FREE (the slab can go back to the page pool). */
static bool rebuild_slab(const cxr__geo *g, uint32_t pg, unsigned c, const cxr__reclaim *r,
                         uint64_t *heads) {
  cxr__hdr *hdr = g->hdr;
  char *s = page_addr(g, pg);
  uint32_t nb = blocks_per_slab(c), stride = stride_of(c), nfree = 0;
  uint64_t first = 0, last = 0;
  for (uint32_t i = 0; i < nb; i++) {
    cxr__blk *b = (cxr__blk *)(s + (size_t)i * stride);
    uint64_t t = LD(b->tag);
    unsigned st = cxr__tag_state(t);
    if ((st == CXR_BLK_CACHED || st == CXR_BLK_ALLOC) &&
        reclaims(r, cxr__tag_slot(t), cxr__tag_gen(t))) {
      unsigned slot = cxr__tag_slot(t);
      bool keep = st == CXR_BLK_ALLOC && (r->clean[slot] || (hdr->flags & CXR_HF_KEEP_ORPHANS));
      uint64_t nt = keep ? cxr__tag(CXR_BLK_ALLOC, c, CXR_NO_OWNER, 0) : cxr__tag(CXR_BLK_FREE, c, 0, 0);
      /* CAS: a live process may be freeing this block at the same moment. */
      if (atomic_compare_exchange_strong(&b->tag, &t, nt)) t = nt;
      st = cxr__tag_state(t);
    } else if (st != CXR_BLK_FREE && st != CXR_BLK_CACHED && st != CXR_BLK_ALLOC) {
      CXR_ERR("heap %s: block %p has a bad tag %#lx; keeping it out of use", hdr->name,
              (void *)b, (unsigned long)t);
      continue;
    }
    if (st != CXR_BLK_FREE) continue;
    nfree++;
    ST(b->next, 0);
    uint64_t off = off_of(g, b);
    if (last) ST(blk_at(g, last)->next, off);
    else first = off;
    last = off;
  }
  if (nfree == nb) return true;
  if (first) {
    ST(blk_at(g, last)->next, heads[c]);
    heads[c] = first;
  }
  return false;
}

void cxr__heap_rebuild(const cxr__geo *g, const cxr__reclaim *r) {
  cxr__hdr *hdr = g->hdr;
  cxr__pme *pm = pmap(g);
  uint64_t heads[CXR_NCLASS] = {0};
  uint32_t npages = (uint32_t)g->npages;
  hdr->free_runs = 0;
  uint32_t fstart = 0, flen = 0; /* the free run being grown */
  for (uint32_t pg = 0; pg < npages;) {
    uint64_t w0 = LD(pm[pg].w0);
    unsigned kind = cxr__pm_kind(w0);
    uint32_t n = cxr__pm_npages(w0);
    if ((kind != CXR_PM_FREE && kind != CXR_PM_SLAB && kind != CXR_PM_LARGE) || n == 0 ||
        n > npages - pg || (kind == CXR_PM_SLAB && (cxr__pm_class(w0) >= CXR_NCLASS || n != CXR_SLAB_PAGES))) {
      CXR_ERR("heap %s: page %u has a bad map entry %#lx; leaking the page", hdr->name, pg,
              (unsigned long)w0);
      if (flen) run_make_free(g, fstart, flen);
      flen = 0;
      pg++;
      continue;
    }
    bool is_free = kind == CXR_PM_FREE;
    if (kind == CXR_PM_LARGE) {
      unsigned slot = cxr__pm_slot(w0);
      uint32_t gen = (uint32_t)(LD(pm[pg].w1) >> 32);
      if (reclaims(r, slot, gen)) {
        if (r->clean[slot] || (hdr->flags & CXR_HF_KEEP_ORPHANS)) {
          ST(pm[pg].w1, 0);
          ST(pm[pg].w0, cxr__pm_w0(CXR_PM_LARGE, 0, CXR_NO_OWNER, n));
        } else {
          is_free = true;
        }
      }
    } else if (kind == CXR_PM_SLAB) {
      is_free = rebuild_slab(g, pg, cxr__pm_class(w0), r, heads);
    }
    if (is_free) {
      if (flen == 0) fstart = pg;
      flen += n;
      /* Commit the page as free now: a slab or run swallowed into a larger run. */
      ST(pm[pg].w0, cxr__pm_w0(CXR_PM_FREE, 0, 0, n));
    } else if (flen) {
      run_make_free(g, fstart, flen);
      flen = 0;
    }
    pg += n;
  }
  if (flen) run_make_free(g, fstart, flen);
  for (unsigned c = 0; c < CXR_NCLASS; c++) hdr->central[c] = heads[c];
  hdr->rebuilds++;
}

void cxr__heap_usage(const cxr__geo *g, size_t *used, size_t *cached) {
  const cxr__pme *pm = pmap(g);
  size_t u = 0, ca = 0;
  uint32_t npages = (uint32_t)g->npages;
  for (uint32_t pg = 0; pg < npages;) {
    uint64_t w0 = atomic_load_explicit(&pm[pg].w0, memory_order_acquire);
    uint32_t n = cxr__pm_npages(w0);
    unsigned kind = cxr__pm_kind(w0);
    if (n == 0 || n > npages - pg) n = 1;
    if (kind == CXR_PM_LARGE) {
      u += (size_t)n * CXR_PAGE;
    } else if (kind == CXR_PM_SLAB && cxr__pm_class(w0) < CXR_NCLASS && n == CXR_SLAB_PAGES) {
      unsigned c = cxr__pm_class(w0);
      const char *s = page_addr(g, pg);
      for (uint32_t i = 0, nb = blocks_per_slab(c); i < nb; i++) {
        cxr__blk *b = (cxr__blk *)(s + (size_t)i * stride_of(c));
        unsigned st = cxr__tag_state(atomic_load_explicit(&b->tag, memory_order_relaxed));
        if (st == CXR_BLK_ALLOC) u += class_size[c];
        else if (st == CXR_BLK_CACHED) ca += class_size[c];
      }
    }
    pg += n;
  }
  *used = u;
  *cached = ca;
}

/* ---------------- central lists (heap lock held) ---------------- */

/* Is `off` the header of a block of class c inside a slab of class c? */
static bool blk_valid(const cxr__geo *g, uint64_t off, unsigned c) {
  if (off < g->data_off || off >= g->size) return false;
  uint64_t pg = (off - g->data_off) / CXR_PAGE;
  uint64_t w0 = LD(g->pm[pg].w0);
  if (cxr__pm_kind(w0) == CXR_PM_CONT) {
    pg = (uint32_t)LD(g->pm[pg].w1);
    if (pg >= g->npages) return false;
    w0 = LD(g->pm[pg].w0);
  }
  if (cxr__pm_kind(w0) != CXR_PM_SLAB || cxr__pm_class(w0) != c ||
      cxr__pm_npages(w0) != CXR_SLAB_PAGES || pg + CXR_SLAB_PAGES > g->npages)
    return false;
  uint64_t rel = off - (g->data_off + pg * CXR_PAGE);
  return rel % stride_of(c) == 0 && rel / stride_of(c) < blocks_per_slab(c);
}

/* Pops up to `want` blocks of class c, tagging them CACHED for h's slot. */
static unsigned central_pop(cxr_heap *h, unsigned c, cxr__blk **out, unsigned want) {
  const cxr__geo *g = &h->g;
  cxr__hdr *hdr = g->hdr;
  unsigned got = 0;
  for (int round = 0; round < 2 && got < want; round++) {
    while (got < want && hdr->central[c] != 0) {
      uint64_t off = hdr->central[c];
      if (!blk_valid(g, off, c)) {
        CXR_ERR("heap %s: corrupt free list (class %u); rebuilding", hdr->name, c);
        cxr__heap_rebuild(g, NULL);
        break;
      }
      cxr__blk *b = blk_at(g, off);
      if (LD(b->tag) != cxr__tag(CXR_BLK_FREE, c, 0, 0)) {
        /* A free list must only hold FREE blocks of its class: never hand out a block
         * that is in use because shared metadata was damaged. */
        CXR_ERR("heap %s: free list of class %u holds a block in use; rebuilding", hdr->name, c);
        cxr__heap_rebuild(g, NULL);
        break;
      }
      ST(b->tag, cxr__tag(CXR_BLK_CACHED, c, h->slot, h->gen));
      hdr->central[c] = LD(b->next);
      out[got++] = b;
    }
    if (got == want || round == 1) break;
    /* Make a slab: block headers first, the page-map head last. */
    int64_t pg = run_take(g, CXR_SLAB_PAGES);
    if (pg < 0) break;
    char *s = page_addr(g, (uint64_t)pg);
    uint32_t nb = blocks_per_slab(c), stride = stride_of(c);
    for (uint32_t i = 0; i < nb; i++) {
      cxr__blk *b = (cxr__blk *)(s + (size_t)i * stride);
      ST(b->next, i + 1 < nb ? off_of(g, s + (size_t)(i + 1) * stride) : hdr->central[c]);
      ST(b->tag, cxr__tag(CXR_BLK_FREE, c, 0, 0));
    }
    run_commit(g, (uint32_t)pg, CXR_SLAB_PAGES, cxr__pm_w0(CXR_PM_SLAB, c, 0, CXR_SLAB_PAGES), 0);
    hdr->central[c] = off_of(g, s);
  }
  return got;
}

static void central_push(const cxr__geo *g, unsigned c, cxr__blk *b) {
  cxr__hdr *hdr = g->hdr;
  ST(b->tag, cxr__tag(CXR_BLK_FREE, c, 0, 0));
  ST(b->next, hdr->central[c]);
  hdr->central[c] = off_of(g, b);
}

/* ---------------- thread caches (process-local) ---------------- */

typedef struct tcache {
  cxr_heap *h;
  uint64_t serial;
  unsigned epoch;
  uint64_t allocs, frees; /* not yet added to the slot's counters */
  uint32_t n[CXR_NCLASS];
  cxr__blk *b[CXR_NCLASS][TC_CAP];
} tcache;

static _Thread_local tcache *tcs[TC_HEAPS];
static pthread_key_t tc_key;
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;

static bool handle_open(cxr_heap *h, uint64_t serial) {
  for (cxr_heap *x = cxr__heaps; x; x = x->next)
    if (x == h && x->serial == serial) return true;
  return false;
}

static void tc_flush_locked(cxr_heap *h, tcache *t, unsigned keep) {
  for (unsigned c = 0; c < CXR_NCLASS; c++)
    while (t->n[c] > keep) central_push(&h->g, c, t->b[c][--t->n[c]]);
  cxr__slot *s = &h->hdr->slots[h->slot];
  atomic_fetch_add_explicit(&s->allocs, t->allocs, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->frees, t->frees, memory_order_relaxed);
  t->allocs = t->frees = 0;
}

/* Thread exit: give cached blocks back to heaps that are still open. */
static void tc_destroy(void *unused) {
  (void)unused;
  cxr__rt_lock();
  for (unsigned i = 0; i < TC_HEAPS; i++) {
    tcache *t = tcs[i];
    if (t == NULL) continue;
    tcs[i] = NULL;
    if (t->epoch == cxr__fork_epoch && handle_open(t->h, t->serial) &&
        t->h->epoch == t->epoch && cxr__heap_lock(t->h) == 0) {
      tc_flush_locked(t->h, t, 0);
      cxr__heap_unlock(t->h);
    }
    free(t);
  }
  cxr__rt_unlock();
}
static void tc_key_init(void) { pthread_key_create(&tc_key, tc_destroy); }

static tcache *tc_get(cxr_heap *h) {
  tcache *t = tcs[0];
  if (__builtin_expect(t != NULL && t->h == h && t->serial == h->serial, 1)) return t;
  unsigned free_i = TC_HEAPS;
  for (unsigned i = 0; i < TC_HEAPS; i++) {
    t = tcs[i];
    if (t == NULL) {
      if (free_i == TC_HEAPS) free_i = i;
      continue;
    }
    if (t->h == h && t->serial == h->serial && t->epoch == h->epoch) {
      tcs[i] = tcs[0]; /* most recently used first */
      tcs[0] = t;
      return t;
    }
  }
  if (free_i == TC_HEAPS) {
    /* Drop caches of handles closed since (their blocks were reclaimed at close) or
     * inherited over fork (their blocks belong to the parent). */
    cxr__rt_lock();
    for (unsigned i = 0; i < TC_HEAPS; i++) {
      t = tcs[i];
      if (t->epoch != cxr__fork_epoch || !handle_open(t->h, t->serial)) {
        free(t);
        tcs[i] = NULL;
        if (free_i == TC_HEAPS) free_i = i;
      }
    }
    cxr__rt_unlock();
    if (free_i == TC_HEAPS) return NULL;
  }
  pthread_once(&tc_once, tc_key_init);
  t = calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  t->h = h;
  t->serial = h->serial;
  t->epoch = h->epoch;
  tcs[free_i] = tcs[0];
  tcs[0] = t;
  pthread_setspecific(tc_key, (void *)1);
  return t;
}

/* In the child of fork (one thread, the forking one): its caches hold blocks that are
 * still in the parent's caches. Forget them; the parent keeps them. */
void cxr__tcache_after_fork(void) {
  for (unsigned i = 0; i < TC_HEAPS; i++) {
    free(tcs[i]);
    tcs[i] = NULL;
  }
}

void cxr__tcache_flush(cxr_heap *h, bool drop) {
  for (unsigned i = 0; i < TC_HEAPS; i++) {
    tcache *t = tcs[i];
    if (t == NULL || t->h != h || t->serial != h->serial) continue;
    if (t->epoch == h->epoch && cxr__heap_lock(h) == 0) {
      tc_flush_locked(h, t, 0);
      cxr__heap_unlock(h);
    }
    if (drop) {
      free(t);
      tcs[i] = NULL;
    }
  }
}

void cxr__tcache_counters(cxr_heap *h, uint64_t *allocs, uint64_t *frees) {
  *allocs = *frees = 0;
  for (unsigned i = 0; i < TC_HEAPS; i++) {
    tcache *t = tcs[i];
    if (t && t->h == h && t->serial == h->serial && t->epoch == h->epoch) {
      *allocs = t->allocs;
      *frees = t->frees;
    }
  }
}

/* ---------------- public allocation API ---------------- */

/* Out of memory (heap lock held): before giving up, give back this thread's cached blocks,
 * recover dead holders, and return slabs left entirely free to the page pool (a rebuild).
 * True when something may have changed. */
static bool make_room(cxr_heap *h, tcache *t) {
  if (t) tc_flush_locked(h, t, 0);
  if (cxr__heap_reap_locked(h) == 0) cxr__heap_rebuild(&h->g, NULL);
  return true;
}

static void *alloc_run(cxr_heap *h, size_t size) {
  uint64_t n64 = (size + CXR_PAGE - 1) / CXR_PAGE;
  if (size == 0) n64 = 1;
  if (n64 > h->npages) return cxr__fail_null(CXR_ENOMEM);
  uint32_t n = (uint32_t)n64;
  tcache *t = tc_get(h); /* outside the heap lock: tc_get may take the runtime lock */
  for (int attempt = 0; attempt < 2; attempt++) {
    int rc = cxr__heap_lock(h);
    if (rc) return cxr__fail_null(rc);
    int64_t pg = run_take(&h->g, n);
    if (pg >= 0) {
      run_commit(&h->g, (uint32_t)pg, n, cxr__pm_w0(CXR_PM_LARGE, 0, h->slot, n),
                 (uint64_t)h->gen << 32);
      atomic_fetch_add_explicit(&h->hdr->slots[h->slot].allocs, 1, memory_order_relaxed);
      cxr__slot_renew(h);
      cxr__heap_unlock(h);
      return page_addr(&h->g, (uint64_t)pg);
    }
    bool retry = attempt == 0 && make_room(h, t);
    cxr__heap_unlock(h);
    if (!retry) break;
  }
  return cxr__fail_null(CXR_ENOMEM);
}

/* Slow path of a small allocation: refill this thread's cache (or take one block when the
 * thread has no cache slot left). */
static cxr__blk *alloc_small_slow(cxr_heap *h, tcache *t, unsigned c) {
  for (int attempt = 0; attempt < 2; attempt++) {
    int rc = cxr__heap_lock(h);
    if (rc) return cxr__fail_null(rc);
    cxr__blk *one = NULL;
    unsigned got;
    if (t) {
      got = central_pop(h, c, t->b[c], TC_BATCH);
      t->n[c] = got;
      tc_flush_locked(h, t, TC_CAP); /* publish counters */
    } else {
      got = central_pop(h, c, &one, 1);
      atomic_fetch_add_explicit(&h->hdr->slots[h->slot].allocs, 1, memory_order_relaxed);
    }
    cxr__slot_renew(h);
    if (got) {
      cxr__heap_unlock(h);
      return t ? t->b[c][--t->n[c]] : one;
    }
    bool retry = attempt == 0 && make_room(h, t);
    cxr__heap_unlock(h);
    if (!retry) break;
  }
  return cxr__fail_null(CXR_ENOMEM);
}

void *cxr_heap_alloc(cxr_heap *h, size_t size) {
  int rc = cxr__heap_ready(h);
  if (rc) return cxr__fail_null(rc);
  if (size > CXR_SMALL_MAX) return alloc_run(h, size);
  unsigned c = size_class(size);
  tcache *t = tc_get(h);
  cxr__blk *b;
  if (t && t->n[c] > 0) {
    b = t->b[c][--t->n[c]];
    t->allocs++;
  } else {
    b = alloc_small_slow(h, t, c);
    if (b == NULL) return NULL;
    if (t) t->allocs++;
  }
  ST(b->tag, cxr__tag(CXR_BLK_ALLOC, c, h->slot, h->gen));
  return b + 1;
}

void *cxr_heap_alloc_pages(cxr_heap *h, size_t size) {
  int rc = cxr__heap_ready(h);
  if (rc) return cxr__fail_null(rc);
  if (size == 0) return cxr__fail_null(CXR_EINVAL);
  return alloc_run(h, size);
}

void *cxr_heap_alloc_aligned(cxr_heap *h, size_t align, size_t size) {
  if (align == 0 || (align & (align - 1)) != 0 || align > CXR_PAGE)
    return cxr__fail_null(CXR_EINVAL);
  if (align <= 16) return cxr_heap_alloc(h, size);
  int rc = cxr__heap_ready(h);
  if (rc) return cxr__fail_null(rc);
  return alloc_run(h, size); /* page runs are page-aligned */
}

typedef struct found {
  uint32_t head;     /* head page of the run */
  unsigned kind;     /* CXR_PM_SLAB or CXR_PM_LARGE */
  unsigned cls;
  cxr__blk *blk;     /* for slabs */
} found;

/* Resolves a user pointer to its block or run; CXR_EBADPTR if it is not one. */
static int find_ptr(const cxr_heap *h, const void *p, found *f) {
  uintptr_t a = (uintptr_t)p, base = (uintptr_t)h->base;
  if (a < base + h->data_off || a >= base + h->size) return CXR_EBADPTR;
  uint64_t off = a - base;
  uint64_t pg = (off - h->data_off) / CXR_PAGE;
  uint64_t w0 = LD(h->pm[pg].w0);
  unsigned kind = cxr__pm_kind(w0);
  if (kind == CXR_PM_CONT) {
    pg = (uint32_t)LD(h->pm[pg].w1);
    if (pg >= h->npages) return CXR_EBADPTR;
    w0 = LD(h->pm[pg].w0);
    kind = cxr__pm_kind(w0);
  }
  f->head = (uint32_t)pg;
  f->kind = kind;
  if (kind == CXR_PM_LARGE) {
    uint32_t n = cxr__pm_npages(w0);
    if (off != h->data_off + pg * CXR_PAGE || n == 0 || n > h->npages - pg) return CXR_EBADPTR;
    return 0;
  }
  if (cxr__pm_npages(w0) != CXR_SLAB_PAGES || pg + CXR_SLAB_PAGES > h->npages) return CXR_EBADPTR;
  if (kind != CXR_PM_SLAB) return CXR_EBADPTR;
  unsigned c = cxr__pm_class(w0);
  if (c >= CXR_NCLASS) return CXR_EBADPTR;
  uint64_t sstart = h->data_off + pg * CXR_PAGE;
  uint64_t rel = off - sizeof(cxr__blk) - sstart;
  if (off < sstart + sizeof(cxr__blk) || rel % stride_of(c) != 0 ||
      rel / stride_of(c) >= blocks_per_slab(c))
    return CXR_EBADPTR;
  f->cls = c;
  f->blk = (cxr__blk *)(h->base + sstart + rel);
  return 0;
}

void cxr_heap_free(cxr_heap *h, void *p) {
  if (p == NULL) return;
  int rc = cxr__heap_ready(h);
  if (rc) {
    cxr__set_error(rc);
    return;
  }
  found f;
  if (find_ptr(h, p, &f) != 0) {
    CXR_ERR("heap %s: free of %p, not an allocation of this heap", h->hdr->name, p);
    cxr__set_error(CXR_EBADPTR);
    return;
  }
  if (f.kind == CXR_PM_LARGE) {
    if (cxr__heap_lock(h) != 0) return;
    /* Recheck under the lock: a concurrent double free finds a FREE head. */
    if (cxr__pm_kind(LD(h->pm[f.head].w0)) == CXR_PM_LARGE) {
      run_release(&h->g, f.head);
      atomic_fetch_add_explicit(&h->hdr->slots[h->slot].frees, 1, memory_order_relaxed);
    } else {
      CXR_ERR("heap %s: double free of pages at %p", h->hdr->name, p);
      cxr__set_error(CXR_EINVAL);
    }
    cxr__heap_unlock(h);
    return;
  }
  unsigned c = f.cls;
  uint64_t t = LD(f.blk->tag);
  uint64_t nt = cxr__tag(CXR_BLK_CACHED, c, h->slot, h->gen);
  for (;;) {
    if (cxr__tag_state(t) != CXR_BLK_ALLOC || cxr__tag_class(t) != c) {
      CXR_ERR("heap %s: free of %p: not allocated (double free?)", h->hdr->name, p);
      cxr__set_error(CXR_EINVAL);
      return;
    }
    if (atomic_compare_exchange_weak_explicit(&f.blk->tag, &t, nt, memory_order_acq_rel,
                                              memory_order_acquire))
      break;
  }
  tcache *tc = tc_get(h);
  if (tc == NULL || tc->n[c] == TC_CAP) {
    if (cxr__heap_lock(h) != 0) return;
    if (tc) {
      tc->frees++;
      tc_flush_locked(h, tc, TC_CAP - TC_BATCH);
    } else {
      atomic_fetch_add_explicit(&h->hdr->slots[h->slot].frees, 1, memory_order_relaxed);
    }
    if (tc == NULL) central_push(&h->g, c, f.blk);
    cxr__slot_renew(h);
    cxr__heap_unlock(h);
    if (tc == NULL) return;
    tc->b[c][tc->n[c]++] = f.blk;
    return;
  }
  tc->b[c][tc->n[c]++] = f.blk;
  tc->frees++;
}

size_t cxr_heap_usable_size(const cxr_heap *h, const void *p) {
  if (cxr__heap_check(h) != 0 || p == NULL) return 0;
  found f;
  if (find_ptr(h, p, &f) != 0) return 0;
  if (f.kind == CXR_PM_LARGE) return (size_t)cxr__pm_npages(LD(h->pm[f.head].w0)) * CXR_PAGE;
  if (cxr__tag_state(LD(f.blk->tag)) != CXR_BLK_ALLOC) return 0;
  return class_size[f.cls];
}

void *cxr_heap_realloc(cxr_heap *h, void *p, size_t size) {
  if (p == NULL) return cxr_heap_alloc(h, size);
  int rc = cxr__heap_ready(h);
  if (rc) return cxr__fail_null(rc);
  size_t old = cxr_heap_usable_size(h, p);
  if (old == 0) return cxr__fail_null(CXR_EBADPTR);
  if (size == 0) {
    cxr_heap_free(h, p);
    return NULL;
  }
  if (size <= old && (old <= CXR_SMALL_MAX ? size_class(size) == size_class(old) : size > old / 2))
    return p;
  void *q = cxr_heap_alloc(h, size);
  if (q == NULL) return NULL;
  memcpy(q, p, old < size ? old : size);
  cxr_heap_free(h, p);
  return q;
}

int cxr_heap_adopt(cxr_heap *h, void *p) {
  int rc = cxr__heap_ready(h);
  if (rc) return rc;
  found f;
  if (p == NULL || find_ptr(h, p, &f) != 0) return CXR_EBADPTR;
  if (f.kind == CXR_PM_LARGE) {
    rc = cxr__heap_lock(h);
    if (rc) return rc;
    uint64_t w0 = LD(h->pm[f.head].w0);
    if (cxr__pm_kind(w0) == CXR_PM_LARGE) {
      ST(h->pm[f.head].w1, (uint64_t)h->gen << 32);
      ST(h->pm[f.head].w0, cxr__pm_w0(CXR_PM_LARGE, 0, h->slot, cxr__pm_npages(w0)));
    } else {
      rc = CXR_EINVAL;
    }
    cxr__heap_unlock(h);
    return rc;
  }
  uint64_t t = LD(f.blk->tag);
  uint64_t nt = cxr__tag(CXR_BLK_ALLOC, f.cls, h->slot, h->gen);
  do {
    if (cxr__tag_state(t) != CXR_BLK_ALLOC) return CXR_EINVAL;
  } while (!atomic_compare_exchange_weak(&f.blk->tag, &t, nt));
  return 0;
}
