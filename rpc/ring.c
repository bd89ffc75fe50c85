/* Bounded MPMC rings of call descriptors in shared memory (Vyukov's per-slot sequence
 * numbers): any thread of either process may push or pop; no locks, so a process that
 * dies holds nothing. A producer killed between claiming a slot and publishing it stalls
 * that ring, which is acceptable: only a dead peer does that, and its connection ends.
 * Positions read from shared memory are never used as array indices without the mask from
 * the private view, so a corrupt head or tail cannot send us outside the ring. */
#include <stddef.h>
#include <string.h>

#include "rpc/internal.h"

/* Bound on retries when positions race (or a hostile peer scribbles on them). */
#define RETRIES 1024

void cxr__ring_init(cxr__ring *r, cxr__desc *d, uint32_t slots) {
  for (uint32_t i = 0; i < slots; i++) {
    memset(&d[i], 0, sizeof d[i]);
    CXR__STX(&d[i].seq, (uint64_t)i);
  }
  CXR__STX(&r->head, 0);
  CXR__STX(&r->tail, 0);
  CXR__STX(&r->futex, 0);
  CXR__STX(&r->sleepers, 0);
}

int cxr__ring_push(const cxr__rview *v, const cxr__desc *in) {
  uint64_t pos = CXR__LDX(&v->r->tail);
  for (int i = 0; i < RETRIES; i++) {
    cxr__desc *d = &v->d[pos & v->mask];
    uint64_t seq = CXR__LD(&d->seq);
    int64_t dif = (int64_t)(seq - pos);
    if (dif == 0) {
      /* seq_cst: sleepers check the tail after announcing themselves (cxr__ring_busy), so
       * the producer may look at their count with a plain load afterwards. */
      if (__atomic_compare_exchange_n(&v->r->tail, &pos, pos + 1, true, __ATOMIC_SEQ_CST,
                                      __ATOMIC_RELAXED)) {
        /* The slot is ours: copy the body (the first cache line, plus inline bytes if
         * any: a descriptor without them costs one line), then publish. */
        size_t extra = (in->flags & CXR_CALL_INLINE) && in->len <= CXR__INLINE_MAX ? in->len : 0;
        memcpy((char *)d + sizeof d->seq, (const char *)in + sizeof in->seq,
               offsetof(cxr__desc, data) - sizeof d->seq + extra);
        CXR__ST(&d->seq, pos + 1);
        /* No prefetch of the next slot for writing: the consumer polls exactly that slot
         * while it waits, so the line would only bounce once more (measured no better). */
        return 0;
      }
    } else if (dif < 0) {
      return CXR_EFULL;
    } else {
      pos = CXR__LDX(&v->r->tail);
    }
  }
  return CXR_EFULL;
}

int cxr__ring_take(const cxr__rview *v, cxr__desc *out, uint64_t *pos_out) {
  uint64_t pos = CXR__LDX(&v->r->head);
  for (int i = 0; i < RETRIES; i++) {
    cxr__desc *d = &v->d[pos & v->mask];
    uint64_t seq = CXR__LD(&d->seq);
    int64_t dif = (int64_t)(seq - (pos + 1));
    if (dif == 0) {
      if (__atomic_compare_exchange_n(&v->r->head, &pos, pos + 1, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
        memcpy(out, d, offsetof(cxr__desc, data));
        /* flags and len are re-read from our copy: bounded whatever the peer wrote. */
        if ((out->flags & CXR_CALL_INLINE) && out->len <= CXR__INLINE_MAX)
          memcpy(out->data, d->data, out->len);
        *pos_out = pos;
        return 0;
      }
    } else if (dif < 0) {
      return CXR_EAGAIN;
    } else {
      pos = CXR__LDX(&v->r->head);
    }
  }
  return CXR_EAGAIN;
}

int cxr__ring_pop(const cxr__rview *v, cxr__desc *out) {
  uint64_t pos;
  int rc = cxr__ring_take(v, out, &pos);
  if (rc == 0) cxr__ring_release(v, pos);
  return rc;
}

int cxr__ring_take_single(const cxr__rview *v, cxr__desc *out, uint64_t *pos_out) {
  uint64_t pos = CXR__LDX(&v->r->head);
  cxr__desc *d = &v->d[pos & v->mask];
  if (CXR__LD(&d->seq) != pos + 1) return CXR_EAGAIN;
  memcpy(out, d, offsetof(cxr__desc, data));
  if ((out->flags & CXR_CALL_INLINE) && out->len <= CXR__INLINE_MAX)
    memcpy(out->data, d->data, out->len);
  CXR__ST(&v->r->head, pos + 1);
  *pos_out = pos;
  return 0;
}

void cxr__ring_release(const cxr__rview *v, uint64_t pos) {
  CXR__ST(&v->d[pos & v->mask].seq, pos + (uint64_t)v->mask + 1);
}

int cxr__ring_pop_single(const cxr__rview *v, cxr__desc *out) {
  uint64_t pos;
  int rc = cxr__ring_take_single(v, out, &pos);
  if (rc == 0) cxr__ring_release(v, pos);
  return rc;
}

bool cxr__ring_nonempty(const cxr__rview *v) {
  uint64_t pos = CXR__LDX(&v->r->head);
  return CXR__LD(&v->d[pos & v->mask].seq) == pos + 1;
}

bool cxr__ring_busy(const cxr__rview *v) {
  return __atomic_load_n(&v->r->tail, __ATOMIC_SEQ_CST) != __atomic_load_n(&v->r->head, __ATOMIC_SEQ_CST);
}
