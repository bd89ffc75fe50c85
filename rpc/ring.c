/* Bounded MPMC rings of call descriptors in shared memory: any thread of either process may
 * push or pop; no locks, so a process that dies holds nothing. A producer killed between
 * claiming a slot and publishing it stalls that ring, which is acceptable: only a dead peer
 * does that, and its connection ends.
 *
 * Who writes what (this is what the round trip pays for): the request ring and the answer
 * ring share their slots (rpc/internal.h, cxr__slot), each ring its own half of the first
 * line. A ring's half is written only by its producers (body, then its sequence word =
 * position + 1 to publish); the consumers' only shared
 * write is `head`, on its own line. A producer knows a slot is free from the consumers'
 * head, which it re-reads only when the last head it saw (kept in its private view) says
 * the ring might be full: once per lap, not per call. So a request moves the slot's line to
 * the server once and its answer moves it back once, as a single word bounced between two
 * processes would (Vyukov's ring writes `seq` from both sides to hand a slot over).
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

_Static_assert(CXR__INLINE_MAX % sizeof(uint64_t) == 0, "inline bytes copy in whole words");

#define LDX32(p) __atomic_load_n((p), __ATOMIC_RELAXED)

static inline void copy_words(void *dst, const void *src, size_t n) {
  uint64_t *o = dst;
  const uint64_t *i = src;
  for (size_t k = 0; k < n; k++)
    __atomic_store_n(&o[k], __atomic_load_n(&i[k], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

static inline cxr__slot *slot_at(const cxr__rview *v, uint64_t pos) {
  return &v->s[pos & v->mask];
}

/* The sequence word of this ring in the slot of position pos. */
static inline uint32_t *seq_at(const cxr__rview *v, uint64_t pos) {
  cxr__slot *s = slot_at(v, pos);
  return v->answers ? &s->rseq : &s->seq;
}

static inline bool inline_ok(uint32_t flags, uint64_t len) {
  return (flags & CXR_CALL_INLINE) && len > 0 && len <= CXR__INLINE_MAX;
}

/* Writes this ring's half of a slot (not its sequence word). A request's inline bytes go
 * in whole words (the caller zeroed the tail of the last one). */
static inline void put(const cxr__rview *v, cxr__slot *s, const cxr__desc *in) {
  if (v->answers) {
    CXR__STX(&s->rcall_id, in->call_id);
    CXR__STX(&s->rptr_status, in->ptr << 16 | (uint16_t)in->status);
    return;
  }
  CXR__STX(&s->method, in->method);
  CXR__STX(&s->call_id, in->call_id);
  CXR__STX(&s->ptr, in->ptr);
  CXR__STX(&s->deadline, in->deadline);
  CXR__STX(&s->len_flags, in->len << 16 | (in->flags & 0xffff));
  CXR__STX(&s->seal, in->seal);
  if (inline_ok(in->flags, in->len)) copy_words(s->data, in->data, (size_t)(in->len + 7) / 8);
}

/* Copies this ring's half of a slot out (relaxed loads: a consumer that loses the race for
 * the slot discards its copy, which a producer of the next lap may have been overwriting).
 * The inline bytes are bounded by CXR__INLINE_MAX whatever a peer wrote: flags and length
 * come from the private copy. */
static inline void get(const cxr__rview *v, const cxr__slot *s, cxr__desc *out) {
  if (v->answers) {
    uint64_t w = CXR__LDX(&s->rptr_status);
    cxr__desc_set(out, CXR__LDX(&s->rcall_id), 0, 0);
    out->ptr = w >> 16;
    out->status = (int16_t)(uint16_t)w;
    return;
  }
  uint64_t lf = CXR__LDX(&s->len_flags);
  out->call_id = CXR__LDX(&s->call_id);
  out->method = LDX32(&s->method);
  out->flags = (uint32_t)(lf & 0xffff);
  out->status = 0;
  out->seal = LDX32(&s->seal);
  out->ptr = CXR__LDX(&s->ptr);
  out->len = lf >> 16;
  out->deadline = CXR__LDX(&s->deadline);
  if (inline_ok(out->flags, out->len)) copy_words(out->data, s->data, (size_t)(out->len + 7) / 8);
}

void cxr__ring_init(cxr__rview *v) {
  for (uint32_t i = 0; i <= v->mask; i++) {
    cxr__slot *s = &v->s[i];
    put(v, s, &(cxr__desc){0});
    CXR__STX(seq_at(v, i), i); /* position i waits for i + 1 */
  }
  CXR__STX(&v->r->head, 0);
  CXR__STX(&v->r->tail, 0);
  CXR__STX(&v->r->futex, 0);
  CXR__STX(&v->r->sleepers, 0);
  CXR__ST(&v->head_seen, 0);
}

/* Whether position pos has a free slot. The consumers' head as last seen (in the private
 * view) says so, or, when it says the ring may be full, the head read again (acquire: their
 * copies of the slot we are about to reuse are complete), which is then remembered: so the
 * shared head is read once per lap, not per push. */
static inline bool room_at(cxr__rview *v, uint64_t pos) {
  const uint64_t size = (uint64_t)v->mask + 1;
  if (pos - CXR__LD(&v->head_seen) < size) return true;
  uint64_t head = CXR__LD(&v->r->head);
  if (pos - head >= size) return false;
  CXR__ST(&v->head_seen, head);
  return true;
}

/* Fills this ring's half of position pos's slot, then publishes it. */
static inline void publish(cxr__rview *v, uint64_t pos, const cxr__desc *in) {
  put(v, slot_at(v, pos), in);
  CXR__ST(seq_at(v, pos), (uint32_t)(pos + 1));
}

int cxr__ring_push(cxr__rview *v, const cxr__desc *in) {
  uint64_t pos = CXR__LDX(&v->r->tail);
  for (int i = 0; i < RETRIES; i++) {
    if (!room_at(v, pos)) { /* full, unless the tail moved on since */
      uint64_t now = CXR__LDX(&v->r->tail);
      if (now == pos) return CXR_EFULL;
      pos = now;
      continue;
    }
    /* seq_cst: sleepers check the tail after announcing themselves (cxr__ring_busy), so
     * the producer may look at their count with a plain load afterwards. */
    if (__atomic_compare_exchange_n(&v->r->tail, &pos, pos + 1, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED)) {
      publish(v, pos, in);
      return 0;
    }
  }
  return CXR_EFULL;
}

int cxr__ring_push_single(cxr__rview *v, const cxr__desc *in) {
  uint64_t pos = CXR__LDX(&v->r->tail);
  if (!room_at(v, pos)) return CXR_EFULL;
  publish(v, pos, in);
  /* After the slot: nothing reads the tail on the way to the answer; sleepers compare it
   * with the head after announcing themselves, and the caller's cxr__bell_ring then orders
   * this store before its look at their count. */
  CXR__ST(&v->r->tail, pos + 1);
  return 0;
}

int cxr__ring_pop(cxr__rview *v, cxr__desc *out) {
  uint64_t pos = CXR__LDX(&v->r->head);
  for (int i = 0; i < RETRIES; i++) {
    int32_t dif = (int32_t)(CXR__LD(seq_at(v, pos)) - (uint32_t)(pos + 1));
    if (dif < 0) return CXR_EAGAIN;
    if (dif > 0) { /* others moved on */
      pos = CXR__LDX(&v->r->head);
      continue;
    }
    get(v, slot_at(v, pos), out);
    if (__atomic_compare_exchange_n(&v->r->head, &pos, pos + 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED))
      return 0;
  }
  return CXR_EAGAIN;
}

int cxr__ring_pop_single(cxr__rview *v, cxr__desc *out) {
  uint64_t pos = CXR__LDX(&v->r->head);
  if (CXR__LD(seq_at(v, pos)) != (uint32_t)(pos + 1)) return CXR_EAGAIN;
  get(v, slot_at(v, pos), out);
  CXR__ST(&v->r->head, pos + 1);
  return 0;
}

bool cxr__ring_nonempty(const cxr__rview *v) {
  uint64_t pos = CXR__LDX(&v->r->head);
  return CXR__LD(seq_at(v, pos)) == (uint32_t)(pos + 1);
}

bool cxr__ring_busy(const cxr__rview *v) {
  return __atomic_load_n(&v->r->tail, __ATOMIC_SEQ_CST) != __atomic_load_n(&v->r->head, __ATOMIC_SEQ_CST);
}
