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
 *   from per-class central lists under the heap's lock. A cached block is tagged
 *   CACHED with its owner, so a dead process's caches are found by scanning tags: they need
 *   not live in shared memory.
 * - Larger requests and cxr_heap_alloc_pages take page runs: first fit over a list of free
 *   runs, coalesced on free with boundary tags in the page map. No in-band header, so
 *   page allocations are pure pages that can be sealed (mprotect).
 * - Under the lock every change commits with one final 8-byte store; when a lock holder
 *   dies (its lock taken over) or a holder is reaped, cxr__heap_rebuild recomputes free
 *   runs and central lists from page-map heads and tags. Tag transitions that can race with a
 *   reclaim (a live process freeing a block a dead one owned) use compare-and-swap.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shm/meta.h"

#if defined(__SANITIZE_THREAD__)
/* A block may have been freed by another process (a client freeing a server's result),
 * which TSan cannot see: to it the block's last writer and its next one are two unordered
 * threads of this process (rpc_peer under TSan, proc_test: two workers' handlers writing
 * results into one block, reported as a race while a third call's acquire came first). An
 * allocation is new memory, its past accesses forgotten, as TSan's own malloc does. */
void AnnotateNewMemory(const char *file, int line, const volatile void *mem, size_t size);
#define NEW_MEMORY(p, n) AnnotateNewMemory(__FILE__, __LINE__, (p), (n))
#else
#define NEW_MEMORY(p, n) ((void)0)
#endif

#define TC_CAP 64u    /* blocks per class in a thread cache */
#define TC_BATCH 32u  /* blocks moved per refill / flush */
#define TC_HEAPS 8u   /* heaps with a cache per thread; more heaps go to the central lists */

/* ---------------- central lists (heap lock held) ---------------- */

/* Pops up to `want` blocks of class c, tagging them CACHED for h's slot. */
static unsigned central_pop(cxr_heap *h, unsigned c, cxr__blk **out, unsigned want) {
  const cxr__geo *g = &h->g;
  cxr__hdr *hdr = g->hdr;
  unsigned got = 0;
  for (int round = 0; round < 2 && got < want; round++) {
    while (got < want && hdr->central[c] != 0) {
      uint64_t off = hdr->central[c];
      if (!cxr__blk_valid(g, off, c)) {
        CXR_ERR("heap %.*s: corrupt free list (class %u); rebuilding", CXR__HDR_NAME(hdr), c);
        cxr__heap_rebuild(g, NULL);
        break;
      }
      cxr__blk *b = blk_at(g, off);
      if (LD(b->tag) != cxr__tag(CXR_BLK_FREE, c, 0, 0)) {
        /* A free list must only hold FREE blocks of its class: never hand out a block
         * that is in use because shared metadata was damaged. */
        CXR_ERR("heap %.*s: free list of class %u holds a block in use; rebuilding",
                CXR__HDR_NAME(hdr), c);
        cxr__heap_rebuild(g, NULL);
        break;
      }
      ST(b->tag, cxr__tag(CXR_BLK_CACHED, c, h->slot, h->gen));
      hdr->central[c] = LD(b->next);
      out[got++] = b;
    }
    if (got == want || round == 1) break;
    /* Make a slab: block headers first, the page-map head last. */
    int64_t pg = cxr__run_take(g, CXR_SLAB_PAGES);
    if (pg < 0) break;
    char *s = page_addr(g, (uint64_t)pg);
    uint32_t nb = blocks_per_slab(c), stride = stride_of(c);
    for (uint32_t i = 0; i < nb; i++) {
      cxr__blk *b = (cxr__blk *)(s + (size_t)i * stride);
      ST(b->next, i + 1 < nb ? off_of(g, s + (size_t)(i + 1) * stride) : hdr->central[c]);
      ST(b->tag, cxr__tag(CXR_BLK_FREE, c, 0, 0));
    }
    cxr__run_commit(g, (uint32_t)pg, CXR_SLAB_PAGES, cxr__pm_w0(CXR_PM_SLAB, c, 0, CXR_SLAB_PAGES), 0);
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

/* The lock for a flush at thread exit, under the runtime mutex: not waited for through a
 * capped handle, whose lock word others write (an rpc server's worker or manager exiting
 * waited 50 ms per jammed connection heap, every heap call of the process held meanwhile).
 * The blocks left cached stay tagged with the handle's slot and go back when it closes. */
static int tc_exit_lock(cxr_heap *h) {
  return h->lock_cap > 0 ? cxr__heap_lock_now(h) : cxr__heap_lock(h);
}

/* Whether t holds nothing to give back (no block, no count). */
static bool tc_empty(const tcache *t) {
  for (unsigned c = 0; c < CXR_NCLASS; c++)
    if (t->n[c] != 0) return false;
  return t->allocs == 0 && t->frees == 0;
}

/* Thread exit: give cached blocks back to heaps that are still open. An empty cache takes
 * no lock: the thread that opened a channel has one for the control heap, whose lock every
 * client can jam, and its exit waited 2 s on it with the runtime mutex held (a review). */
static void tc_destroy(void *unused) {
  (void)unused;
  cxr__rt_lock();
  for (unsigned i = 0; i < TC_HEAPS; i++) {
    tcache *t = tcs[i];
    if (t == NULL) continue;
    tcs[i] = NULL;
    if (!tc_empty(t) && t->epoch == cxr__fork_epoch && handle_open(t->h, t->serial) &&
        t->h->epoch == t->epoch && tc_exit_lock(t->h) == 0) {
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

void cxr__tcache_flush(cxr_heap *h, bool drop, bool wait) {
  for (unsigned i = 0; i < TC_HEAPS; i++) {
    tcache *t = tcs[i];
    if (t == NULL || t->h != h || t->serial != h->serial) continue;
    if (t->epoch == h->epoch && (wait ? cxr__heap_lock(h) : cxr__heap_lock_now(h)) == 0) {
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
  /* Rounded up without size + CXR_PAGE - 1, which wraps to a few pages near SIZE_MAX. */
  uint64_t n64 = size / CXR_PAGE + (size % CXR_PAGE != 0);
  if (size == 0) n64 = 1;
  if (n64 > h->npages) return cxr__fail_null(CXR_ENOMEM);
  uint32_t n = (uint32_t)n64;
  tcache *t = tc_get(h); /* outside the heap lock: tc_get may take the runtime lock */
  for (int attempt = 0; attempt < 2; attempt++) {
    int rc = cxr__heap_lock(h);
    if (rc) return cxr__fail_null(rc);
    int64_t pg = cxr__run_take(&h->g, n);
    if (pg >= 0) {
      cxr__run_commit(&h->g, (uint32_t)pg, n, cxr__pm_w0(CXR_PM_LARGE, 0, h->slot, n),
                 (uint64_t)h->gen << 32);
      atomic_fetch_add_explicit(&h->hdr->slots[h->slot].allocs, 1, memory_order_relaxed);
      cxr__slot_renew(h);
      cxr__heap_unlock(h);
      void *p = page_addr(&h->g, (uint64_t)pg);
      NEW_MEMORY(p, (size_t)n * CXR_PAGE);
      return p;
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
  NEW_MEMORY(b + 1, size ? size : 1);
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
  uint32_t npages;   /* for page runs: the length checked against the map, read once */
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
    f->npages = n;
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

/* Bad frees logged: the 1st, 2nd, 4th... only. A graph a peer rewrote, freed by a walk that
 * cannot tell (an rpc handler's result left in a connection heap), may name the same blocks
 * a million times. */
static uint64_t bad_frees;
#define BAD_FREE(...)                                                                        \
  do {                                                                                       \
    if (cxr__log_due(__atomic_add_fetch(&bad_frees, 1, __ATOMIC_RELAXED))) CXR_ERR(__VA_ARGS__); \
  } while (0)

/* shared: p may have been freed already through another reference (cxr__heap_free_shared):
 * then a p inside the heap that is no allocated block is left without a log or an error. */
static void heap_free(cxr_heap *h, void *p, bool shared) {
  if (p == NULL) return;
  int rc = cxr__heap_ready(h);
  if (rc) {
    cxr__set_error(rc);
    return;
  }
  found f;
  if (find_ptr(h, p, &f) != 0) {
    if (shared && cxr_heap_contains(h, p, 1)) return;
    BAD_FREE("heap %.*s: free of %p, not an allocation of this heap", CXR__HDR_NAME(h->hdr), p);
    cxr__set_error(CXR_EBADPTR);
    return;
  }
  if (f.kind == CXR_PM_LARGE) {
    if ((rc = cxr__heap_lock(h)) != 0) {
      cxr__set_error(rc);
      return;
    }
    /* Recheck under the lock: a concurrent double free finds a FREE head. The head is read
     * once: its length, checked by cxr__run_release, is the one the run is freed with. */
    uint64_t w0 = LD(h->pm[f.head].w0);
    if (cxr__pm_kind(w0) == CXR_PM_LARGE) {
      if (cxr__run_release(&h->g, f.head, cxr__pm_npages(w0)) == 0) {
        atomic_fetch_add_explicit(&h->hdr->slots[h->slot].frees, 1, memory_order_relaxed);
      } else {
        CXR_ERR("heap %.*s: free of %p: its page run's length (%u pages) is damaged; leaving "
                "the run as it is", CXR__HDR_NAME(h->hdr), p, cxr__pm_npages(w0));
        cxr__set_error(CXR_ECORRUPT);
      }
    } else if (!shared) {
      BAD_FREE("heap %.*s: double free of pages at %p", CXR__HDR_NAME(h->hdr), p);
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
      if (shared) return;
      BAD_FREE("heap %.*s: free of %p: not allocated (double free?)", CXR__HDR_NAME(h->hdr), p);
      cxr__set_error(CXR_EINVAL);
      return;
    }
    if (atomic_compare_exchange_weak_explicit(&f.blk->tag, &t, nt, memory_order_acq_rel,
                                              memory_order_acquire))
      break;
  }
  tcache *tc = tc_get(h);
  if (tc == NULL || tc->n[c] == TC_CAP) {
    if ((rc = cxr__heap_lock(h)) != 0) {
      cxr__set_error(rc); /* the block stays cached by this holder until its lease ends */
      return;
    }
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

void cxr_heap_free(cxr_heap *h, void *p) { heap_free(h, p, false); }

void cxr__heap_free_shared(cxr_heap *h, void *p) { heap_free(h, p, true); }

size_t cxr_heap_usable_size(const cxr_heap *h, const void *p) {
  if (cxr__heap_check(h) != 0 || p == NULL) return 0;
  found f;
  if (find_ptr(h, p, &f) != 0) return 0;
  /* The length find_ptr checked, not a second read: realloc copies this many bytes. */
  if (f.kind == CXR_PM_LARGE) return (size_t)f.npages * CXR_PAGE;
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
