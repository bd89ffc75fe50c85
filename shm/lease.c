/*
 * Leases: one holder slot per handle in the heap header (pid, start time, host, lease
 * time, tenancy generation). Dead holders are found by pid + start time on this host and
 * by lease expiry on others, and recovered: their cached blocks, and unless keep_orphans
 * their allocations, go back to the heap.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/internal.h"
#include "shm/proc.h"
#include "shm/registry.h"

/* ---------------- leases ---------------- */

void cxr__slot_renew(cxr_heap *h) {
  atomic_store_explicit(&h->hdr->slots[h->slot].lease_ns, cxr__realtime_ns(),
                        memory_order_relaxed);
}

bool cxr__slot_dead(const cxr__slot *s, int64_t now) {
  cxr__proc_id id = {.pid = s->pid, .start_time = s->start_time, .host = s->host};
  if (s->host == cxr__host_id()) return !cxr__proc_alive(&id);
  /* Another host: only the lease tells. */
  return now - atomic_load(&s->lease_ns) > cxr__lease_ns();
}

int cxr__slot_take(cxr_heap *h) {
  cxr__proc_id me;
  int rc = cxr__proc_self_id(&me);
  if (rc) return rc;
  cxr__hdr *hdr = h->hdr;
  for (int attempt = 0; attempt < 2; attempt++) {
    for (unsigned i = 0; i < CXR_MAX_HOLDERS; i++) {
      cxr__slot *s = &hdr->slots[i];
      if (atomic_load(&s->state) != CXR_SLOT_FREE) continue;
      uint32_t gen = ++hdr->slot_gen_next;
      if (gen == 0) gen = ++hdr->slot_gen_next;
      s->gen = gen;
      s->pid = me.pid;
      s->start_time = me.start_time;
      s->host = me.host;
      atomic_store(&s->allocs, 0);
      atomic_store(&s->frees, 0);
      atomic_store(&s->lease_ns, cxr__realtime_ns());
      atomic_store(&s->state, CXR_SLOT_LIVE); /* commit */
      h->slot = i;
      h->gen = gen;
      h->epoch = cxr__fork_epoch;
      return 0;
    }
    if (cxr__heap_reap_locked(h) <= 0) break;
  }
  return CXR_EFULL;
}

/* Gives slots in `r` back: their blocks per the reclaim rules, counters folded. */
void cxr__slots_release(const cxr__geo *g, const cxr__reclaim *r) {
  cxr__hdr *hdr = g->hdr;
  cxr__heap_rebuild(g, r);
  for (unsigned i = 0; i < CXR_MAX_HOLDERS; i++) {
    if (r->gen[i] == 0) continue;
    cxr__slot *s = &hdr->slots[i];
    __atomic_fetch_add(&hdr->retired_allocs, atomic_load(&s->allocs), __ATOMIC_RELAXED);
    __atomic_fetch_add(&hdr->retired_frees, atomic_load(&s->frees), __ATOMIC_RELAXED);
    atomic_store(&s->allocs, 0);
    atomic_store(&s->frees, 0);
    atomic_store(&s->state, CXR_SLOT_FREE);
  }
}

int cxr__heap_reap_locked(cxr_heap *h) {
  cxr__hdr *hdr = h->hdr;
  cxr__reclaim r;
  memset(&r, 0, sizeof r);
  int n = 0;
  int64_t now = cxr__realtime_ns();
  for (unsigned i = 0; i < CXR_MAX_HOLDERS; i++) {
    cxr__slot *s = &hdr->slots[i];
    uint32_t state = atomic_load(&s->state);
    if (state == CXR_SLOT_CLOSED) {
      CXR_INFO("heap %.*s: releasing slot %u, closed by pid %d without the lock",
               CXR__HDR_NAME(hdr), i, s->pid);
      r.gen[i] = s->gen;
      r.clean[i] = true;
      n++;
      continue;
    }
    if (state != CXR_SLOT_LIVE) continue;
    if (i == h->slot && s->gen == h->gen && h->epoch == cxr__fork_epoch) continue;
    if (!cxr__slot_dead(s, now)) continue;
    CXR_INFO("heap %.*s: holder pid %d (slot %u) is dead; recovering its memory",
             CXR__HDR_NAME(hdr), s->pid, i);
    r.gen[i] = s->gen;
    n++;
  }
  if (n > 0) cxr__slots_release(&h->g, &r);
  return n;
}

int cxr_heap_renew(cxr_heap *h) {
  int rc = cxr__heap_ready(h);
  if (rc) return rc;
  cxr__slot_renew(h);
  return 0;
}

int cxr_heap_reap(cxr_heap *h) {
  int rc = cxr__heap_ready(h);
  if (rc) return rc;
  cxr__lock_reaped = 0;
  rc = cxr__heap_lock(h);
  if (rc) return rc;
  int n = cxr__heap_reap_locked(h) + cxr__lock_reaped;
  cxr__lock_reaped = 0;
  cxr__slot_renew(h);
  cxr__heap_unlock(h);
  return n;
}

int cxr__heap_reattach(cxr_heap *h) {
  cxr__rt_lock();
  int rc = 0;
  if (h->epoch != cxr__fork_epoch) {
    rc = cxr__heap_lock(h);
    if (rc == 0) {
      rc = cxr__slot_take(h);
      cxr__heap_unlock(h);
    }
    if (rc == 0)
      CXR_DEBUG("heap %.*s: inherited over fork, new lease in slot %u", CXR__HDR_NAME(h->hdr),
                h->slot);
  }
  cxr__rt_unlock();
  return rc;
}

