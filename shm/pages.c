/*
 * The heap's shared page structures: page runs (first fit, boundary-tag coalescing), the
 * heap lock (over shm/sync.h), and the rebuild that recomputes every free list from
 * page-map heads and block tags after a crash or when holders are reaped (see alloc.c and
 * docs/shm.md).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shm/meta.h"
#include "shm/reg_deadline.h"
#include "shm/registry.h"

/* ---------------- page runs (heap lock held) ---------------- */

/* Is pg the head of a well-formed free run (links inside the map)? Shared metadata is
 * checked before it is followed: a damaged map must not make us write out of bounds. The
 * length checked is handed back in *len: any holder can write the map, also while we hold
 * the lock, so a second read could return another length than the one checked. */
static bool run_ok(const cxr__geo *g, uint32_t pg, uint32_t *len) {
  if (pg >= g->npages) return false;
  uint64_t w0 = LD(g->pm[pg].w0), w1 = LD(g->pm[pg].w1);
  uint32_t rn = cxr__pm_npages(w0);
  *len = rn;
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
int64_t cxr__run_take(const cxr__geo *g, uint32_t n) {
  cxr__hdr *hdr = g->hdr;
  cxr__pme *pm = pmap(g);
  for (int attempt = 0; attempt < 2; attempt++) {
    bool damaged = false;
    uint64_t guard = 0;
    for (uint32_t r = hdr->free_runs; r != 0; guard++) {
      uint32_t pg = r - 1, rn;
      if (guard > g->npages || !run_ok(g, pg, &rn)) {
        damaged = true;
        break;
      }
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
    CXR_ERR("heap %.*s: free-run list damaged; rebuilding", CXR__HDR_NAME(hdr));
    cxr__heap_rebuild(g, NULL);
  }
  return -1;
}

void cxr__run_commit(const cxr__geo *g, uint32_t pg, uint32_t n, uint64_t w0, uint64_t w1) {
  cxr__pme *pm = pmap(g);
  for (uint32_t i = 1; i < n; i++) {
    ST(pm[pg + i].w1, pg);
    ST(pm[pg + i].w0, cxr__pm_w0(CXR_PM_CONT, 0, 0, 0));
  }
  ST(pm[pg].w1, w1);
  ST(pm[pg].w0, w0); /* commit */
}

/* Frees the run of n pages headed at pg: commits FREE first, then coalesces with its
 * neighbours. n is the length the caller read from the head once; it is checked here, before
 * anything is written: a holder may have rewritten it (while we waited for the lock, say),
 * and the tail tag at pg + n - 1 would then land outside the map. CXR_ECORRUPT: untouched. */
int cxr__run_release(const cxr__geo *g, uint32_t pg, uint32_t n) {
  if (pg >= g->npages || n == 0 || n > g->npages - pg) return CXR_ECORRUPT;
  cxr__pme *pm = pmap(g);
  ST(pm[pg].w1, 0);
  ST(pm[pg].w0, cxr__pm_w0(CXR_PM_FREE, 0, 0, n));
  uint32_t next = pg + n, nn;
  if (next < g->npages && run_ok(g, next, &nn)) {
    run_unlink(g, next);
    n += nn;
  }
  if (pg > 0) {
    uint64_t pw = LD(pm[pg - 1].w0);
    uint32_t p = UINT32_MAX, pn;
    if (cxr__pm_kind(pw) == CXR_PM_FREE) p = pg - 1;
    else if (cxr__pm_kind(pw) == CXR_PM_FTAIL) p = (uint32_t)LD(pm[pg - 1].w1);
    if (p < pg && run_ok(g, p, &pn) && pn == pg - p) {
      run_unlink(g, p);
      n += pn;
      pg = p;
    }
  }
  run_make_free(g, pg, n);
  return 0;
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

/* How long a thread waits for a heap's lock. Allocator sections hold it for microseconds and
 * a rebuild after a dead holder for milliseconds, but a word nobody will release must cost an
 * error, not a hang: any client can write its connection heap and every client a channel's
 * control heap, and a scribbled word names a holder that never unlocks (a server's close once
 * hung on one). After one such wait the handle waits only briefly until the lock is free. */
#define LOCK_WAIT_NS 2000000000ll
#define LOCK_WAIT_STUCK_NS 10000000ll

void cxr__heap_lock_cap(struct cxr_heap *h, int64_t ns, cxr__lock_budget *b) {
  if (h == NULL) return;
  h->lock_cap = ns > 0 ? ns : 0;
  h->lock_budget = b;
}

/* Bounded: a child forked while another thread held it inherits it held for good (a review);
 * there the budget is not applied (each wait keeps its cap), where unbounded it hung. */
static bool budget_hold(cxr__lock_budget *b) {
  for (unsigned i = 0; __atomic_exchange_n(&b->busy, 1, __ATOMIC_ACQUIRE); i++) {
    if (i == 1u << 16) return false; /* ~2 ms of pauses; held for nanoseconds otherwise */
    cxr__cpu_relax();
  }
  return true;
}
static void budget_drop(cxr__lock_budget *b) { __atomic_store_n(&b->busy, 0, __ATOMIC_RELEASE); }

/* The second's account, begun anew once it is over (under busy). */
static void budget_roll(cxr__lock_budget *b, int64_t now) {
  if (b->since == 0 || now - b->since >= 1000000000) {
    b->since = now;
    b->spent = 0;
  }
}

/* How much of `wait` ns the budget's current second still allows (0 when spent). Nothing is
 * reserved: a review found two 50 ms waits under way (each got its lock) left a third none,
 * so an honest handler's allocation failed with nobody jamming. */
static int64_t budget_left(cxr__lock_budget *b, int64_t wait) {
  if (!budget_hold(b)) return wait;
  budget_roll(b, cxr_now_ns());
  int64_t left = b->per_s_ns - b->spent;
  budget_drop(b);
  return left <= 0 ? 0 : left < wait ? left : wait;
}

/* A wait of ns that ended without the lock. */
static void budget_spend(cxr__lock_budget *b, int64_t ns) {
  if (!budget_hold(b)) return;
  budget_roll(b, cxr_now_ns());
  b->spent += ns;
  budget_drop(b);
}

/* Capped handles that gave up on their heap's lock: logged at the 1st, 2nd, 4th... only (a
 * client jamming the lock of each new heap it gets would otherwise write a line per heap). */
static uint64_t capped_gave_up;

/* This process as the lock's holder, or 0 (logged). */
static uint64_t lock_id(const cxr_heap *h) {
  uint64_t me = cxr__rt_lock_id();
  if (me == 0)
    CXR_ERR("heap %.*s: cannot read this process's identity from /proc", CXR__HDR_NAME(h->hdr));
  return me;
}

/* The lock was had (rc: how, from cxr__plock_*): the handle is no longer stuck, and a dead
 * holder's half-done work is repaired. Returns 0. */
static int lock_had(cxr_heap *h, int rc) {
  /* Written only when set: every thread of the process locks through this mapping. */
  if (__atomic_load_n(&h->m->lock_stuck, __ATOMIC_RELAXED))
    __atomic_store_n(&h->m->lock_stuck, 0, __ATOMIC_RELAXED);
  if (rc == CXR_PLOCK_TAKEN_OVER) {
    /* A holder died inside an allocator operation: lists may be half-updated. */
    CXR_WARN("heap %.*s: a lock holder died; rebuilding free lists", CXR__HDR_NAME(h->hdr));
    cxr__heap_rebuild(&h->g, NULL);
    cxr__lock_reaped += cxr__heap_reap_locked(h);
  }
  return 0;
}

int cxr__heap_lock(cxr_heap *h) {
  uint64_t me = lock_id(h);
  if (me == 0) return CXR_EIO;
  int rc = cxr__plock_try(&h->hdr->lock, me); /* no clock read when it is free */
  if (rc == CXR_EBUSY) {
    bool stuck = __atomic_load_n(&h->m->lock_stuck, __ATOMIC_RELAXED);
    int64_t wait = stuck ? LOCK_WAIT_STUCK_NS : LOCK_WAIT_NS;
    if (h->lock_cap > 0 && wait > h->lock_cap) wait = h->lock_cap;
    /* A caller with a deadline of its own (a connect opening heaps, shm/reg_deadline.h) is
     * not kept past it: it may hold the pod registry's lock meanwhile. (The clock is read
     * only for such a caller.) */
    bool callers = cxr__reg_deadline_get() != 0 && cxr__reg_deadline_clip(cxr_now_ns(), &wait);
    if (h->lock_budget != NULL) wait = budget_left(h->lock_budget, wait);
    rc = cxr__plock_lock(&h->hdr->lock, me, wait);
    if (rc == CXR_ETIMEDOUT && h->lock_budget != NULL) budget_spend(h->lock_budget, wait);
    if (rc == CXR_ETIMEDOUT && callers) return CXR_ETIMEDOUT;
    if (rc == CXR_ETIMEDOUT) {
      if (!stuck && (h->lock_cap == 0 ||
                     cxr__log_due(__atomic_add_fetch(&capped_gave_up, 1, __ATOMIC_RELAXED))))
        CXR_ERR("heap %.*s: its lock was not released within %lld ms (a holder is stopped, "
                "or the word was overwritten); its allocations fail until it is",
                CXR__HDR_NAME(h->hdr), (long long)(wait / 1000000));
      __atomic_store_n(&h->m->lock_stuck, 1, __ATOMIC_RELAXED);
      return CXR_ETIMEDOUT;
    }
  }
  return lock_had(h, rc);
}

int cxr__heap_lock_now(cxr_heap *h) {
  uint64_t me = lock_id(h);
  if (me == 0) return CXR_EIO;
  int rc = cxr__plock_lock(&h->hdr->lock, me, 0); /* its spins only, no wait */
  return rc == CXR_ETIMEDOUT ? CXR_EBUSY : lock_had(h, rc);
}

void cxr__heap_unlock(cxr_heap *h) { cxr__plock_unlock(&h->hdr->lock, cxr__rt_lock_id()); }

/* A rebuild logs the first few damaged entries it finds and then how many more, and at most
 * one rebuild a second logs them at all: a holder that keeps scribbling over a heap (any
 * client can write its connection heap) would otherwise flood the log, each rebuild walking
 * the same damage again. */
#define DAMAGE_LOG_MAX 8
static _Thread_local unsigned damage_seen, damage_budget;
static _Atomic int64_t damage_quiet_until;

/* Whether to log this damaged entry; the first of a rebuild decides for the rest of it. */
static bool damage_log(void) {
  if (damage_seen++ == 0) {
    int64_t now = cxr_now_ns(), until = atomic_load(&damage_quiet_until);
    bool turn = now >= until &&
                atomic_compare_exchange_strong(&damage_quiet_until, &until, now + 1000000000);
    damage_budget = turn ? DAMAGE_LOG_MAX : 0;
  }
  return damage_seen <= damage_budget;
}

static void damage_begin(void) { damage_seen = damage_budget = 0; }

static void damage_end(const cxr__hdr *hdr) {
  if (damage_budget && damage_seen > damage_budget)
    CXR_ERR("heap %.*s: %u more damaged entries (not logged; at most %d a second)",
            CXR__HDR_NAME(hdr), damage_seen - damage_budget, DAMAGE_LOG_MAX);
}

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
      if (damage_log())
        CXR_ERR("heap %.*s: block %p has a bad tag %#lx; keeping it out of use", CXR__HDR_NAME(hdr),
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
  damage_begin();
  uint32_t fstart = 0, flen = 0; /* the free run being grown */
  for (uint32_t pg = 0; pg < npages;) {
    uint64_t w0 = LD(pm[pg].w0);
    unsigned kind = cxr__pm_kind(w0);
    uint32_t n = cxr__pm_npages(w0);
    if ((kind != CXR_PM_FREE && kind != CXR_PM_SLAB && kind != CXR_PM_LARGE) || n == 0 ||
        n > npages - pg || (kind == CXR_PM_SLAB && (cxr__pm_class(w0) >= CXR_NCLASS || n != CXR_SLAB_PAGES))) {
      if (damage_log())
        CXR_ERR("heap %.*s: page %u has a bad map entry %#lx; leaking the page",
                CXR__HDR_NAME(hdr), pg, (unsigned long)w0);
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
  damage_end(hdr);
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

/* Is `off` the header of a block of class c inside a slab of class c? */
bool cxr__blk_valid(const cxr__geo *g, uint64_t off, unsigned c) {
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

