/* Bounded MPMC rings of call descriptors in shared memory: any thread of either process may
 * push or pop; no locks, so a process that dies holds nothing. A producer killed between
 * claiming a slot and publishing it stalls that ring, which is acceptable: only a dead peer
 * does that, and its connection ends.
 *
 * Who writes what (this is what the round trip pays for): a slot's lines are written only
 * by producers (body, then `seq` = position + 1 to publish); the consumers' only shared
 * write is `head`, on its own line. A producer knows a slot is free from the consumers'
 * head, which it re-reads only when the last head it saw (kept in its private view) says
 * the ring might be full: once per lap, not per call. So a call moves the slot's line to the
 * consumer once, as a flag bounced between two processes would, instead of bouncing it
 * back and forth to hand it over (Vyukov's ring writes `seq` from both sides).
 *
 * Consumers copy a slot out before they advance `head` (several consumers: copy, then CAS;
 * a loser discards its copy, which a producer of the next lap may have been overwriting).
 * Copies go word by word with relaxed atomics, so that discarded overlap is not a data race.
 * Positions read from shared memory are never used as array indices without the mask from
 * the private view, so a corrupt head or tail cannot send us outside the ring. */
#include <stddef.h>
#include <string.h>

#include "rpc/internal.h"

/* Bound on retries when positions race (or a hostile peer scribbles on them). */
#define RETRIES 1024
#define BODY_WORDS ((offsetof(cxr__desc, data) - sizeof(uint64_t)) / sizeof(uint64_t))

_Static_assert(offsetof(cxr__desc, data) % sizeof(uint64_t) == 0 &&
                   CXR__INLINE_MAX % sizeof(uint64_t) == 0,
               "descriptors copy in whole words");

static inline void copy_words(void *dst, const void *src, size_t n) {
  uint64_t *o = dst;
  const uint64_t *i = src;
  for (size_t k = 0; k < n; k++)
    __atomic_store_n(&o[k], __atomic_load_n(&i[k], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* Everything after seq: the first line, then the inline bytes if any (whole words; bounded
 * by CXR__INLINE_MAX whatever a peer wrote: flags and len are read from the private copy,
 * which the first step already filled). A descriptor without inline bytes is one line. */
static inline void copy_desc(cxr__desc *dst, const cxr__desc *src, const cxr__desc *private_copy) {
  copy_words(&dst->call_id, &src->call_id, BODY_WORDS);
  uint64_t len = private_copy->len;
  if ((private_copy->flags & CXR_CALL_INLINE) && len > 0 && len <= CXR__INLINE_MAX)
    copy_words(dst->data, src->data, (size_t)(len + 7) / 8);
}

void cxr__ring_init(cxr__rview *v) {
  for (uint32_t i = 0; i <= v->mask; i++) {
    memset(&v->d[i], 0, sizeof v->d[i]);
    CXR__STX(&v->d[i].seq, (uint64_t)i); /* position i waits for i + 1 */
  }
  CXR__STX(&v->r->head, 0);
  CXR__STX(&v->r->tail, 0);
  CXR__STX(&v->r->futex, 0);
  CXR__STX(&v->r->sleepers, 0);
  CXR__ST(&v->head_seen, 0);
}

int cxr__ring_push(cxr__rview *v, const cxr__desc *in) {
  const uint64_t size = (uint64_t)v->mask + 1;
  uint64_t pos = CXR__LDX(&v->r->tail);
  for (int i = 0; i < RETRIES; i++) {
    if (pos - CXR__LD(&v->head_seen) >= size) {
      /* Looks full (or the tail moved on since): ask the consumers. Acquire: their copies
       * of the slot we are about to reuse are complete. */
      uint64_t head = CXR__LD(&v->r->head);
      if (pos - head >= size) {
        uint64_t now = CXR__LDX(&v->r->tail);
        if (now == pos) return CXR_EFULL;
        pos = now;
        continue;
      }
      CXR__ST(&v->head_seen, head);
    }
    /* seq_cst: sleepers check the tail after announcing themselves (cxr__ring_busy), so
     * the producer may look at their count with a plain load afterwards. */
    if (__atomic_compare_exchange_n(&v->r->tail, &pos, pos + 1, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED)) {
      cxr__desc *d = &v->d[pos & v->mask];
      copy_desc(d, in, in);
      CXR__ST(&d->seq, pos + 1);
      return 0;
    }
  }
  return CXR_EFULL;
}

int cxr__ring_pop(cxr__rview *v, cxr__desc *out) {
  uint64_t pos = CXR__LDX(&v->r->head);
  for (int i = 0; i < RETRIES; i++) {
    cxr__desc *d = &v->d[pos & v->mask];
    int64_t dif = (int64_t)(CXR__LD(&d->seq) - (pos + 1));
    if (dif < 0) return CXR_EAGAIN;
    if (dif > 0) { /* others moved on */
      pos = CXR__LDX(&v->r->head);
      continue;
    }
    copy_desc(out, d, out);
    if (__atomic_compare_exchange_n(&v->r->head, &pos, pos + 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED))
      return 0;
  }
  return CXR_EAGAIN;
}

int cxr__ring_pop_single(cxr__rview *v, cxr__desc *out) {
  uint64_t pos = CXR__LDX(&v->r->head);
  cxr__desc *d = &v->d[pos & v->mask];
  if (CXR__LD(&d->seq) != pos + 1) return CXR_EAGAIN;
  copy_desc(out, d, out);
  CXR__ST(&v->r->head, pos + 1);
  return 0;
}

bool cxr__ring_nonempty(const cxr__rview *v) {
  uint64_t pos = CXR__LDX(&v->r->head);
  return CXR__LD(&v->d[pos & v->mask].seq) == pos + 1;
}

bool cxr__ring_busy(const cxr__rview *v) {
  return __atomic_load_n(&v->r->tail, __ATOMIC_SEQ_CST) != __atomic_load_n(&v->r->head, __ATOMIC_SEQ_CST);
}
