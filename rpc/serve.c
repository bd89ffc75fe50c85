/* Server workers: each polls every active connection of the channel (the request rings
 * are multi-consumer), validates what it pops, runs the handler and pushes the response.
 * Idle policy: spin for an adaptive window after the last call, then yield, then sleep on
 * the channel doorbell; clients ring it only when a worker sleeps, so a busy server never
 * pays for wake-ups and an idle one uses no CPU. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/server.h"
#include "shm/log.h"

#define BATCH 16

#if defined(__SANITIZE_THREAD__)
/* Blocks a handler wrote (its result graph, or any block it allocated) go to the client
 * process, which may free them and hand them back as a later call's arguments, read by
 * another of our workers; the allocator may also give them to another worker's handler.
 * TSan cannot see that path through another process: each call releases its connection
 * (the server's record of it, a token) after its handler ran, and the next call acquires it
 * before its handler runs, so what earlier handlers wrote in that heap is ordered before
 * what later ones read or write there. (Per block it is not enough: a released root is not
 * the block a later call reuses, which may be any block of the graph.) */
void __tsan_release(void *addr);
void __tsan_acquire(void *addr);
#define RELEASE_TO_PEER(sc) __tsan_release(sc)
#define ACQUIRE_FROM_PEER(sc) __tsan_acquire(sc)
#else
#define RELEASE_TO_PEER(sc) ((void)(sc))
#define ACQUIRE_FROM_PEER(sc) ((void)(sc))
#endif

/* Server counters: with one worker it is their only writer (calls from other racks are
 * counted elsewhere), so a plain load and store does; several workers add atomically. */
static inline void ctr_add(const cxr_channel *ch, uint64_t *p, uint64_t v) {
  if (ch->o.workers == 1) CXR__STX(p, CXR__LDX(p) + v);
  else CXR__ADD(p, v);
}

static void push_response(cxr_channel *ch, cxr__sconn *sc, cxr__desc *r) {
  /* A client has at most ring_slots calls in flight (its pending table has as many entries,
   * each held until its answer is taken off the ring), so its answer ring has room for
   * every answer we owe it. Full means it pushed requests past its table (a raw or hostile
   * client): the answer is dropped at once. Until 2026-11-28 the worker first waited
   * peer_timeout for room, once per tenancy: with one worker, a client that reconnected and
   * refilled its ring every 110 ms held the worker in that wait most of the time, and every
   * other connection with it (found by a review). */
  bool single = ch->o.workers == 1; /* then this worker is the ring's only producer */
  if ((single ? cxr__ring_push_single(&sc->resp, r) : cxr__ring_push(&sc->resp, r)) != 0) {
    if (!__atomic_exchange_n(&sc->resp_stalled, 1, __ATOMIC_RELAXED)) {
      uint64_t n = __atomic_add_fetch(&ch->overfilled_seen, 1, __ATOMIC_RELAXED);
      if (cxr__log_due(n)) /* (a client reconnecting to do it again cannot flood the log) */
        CXR_WARN("channel %s: connection %u: the client sent more requests than it can take "
                 "answers for; dropping answers (%llu such connections so far)", ch->name,
                 sc->index, (unsigned long long)n);
    }
    CXR_DEBUG("channel %s: connection %u: response ring full, dropping a response", ch->name,
              sc->index);
    cxr__sconn_free_result(sc, r->ptr);
    ctr_add(ch, &sc->slot->srv.errors, 1);
    return;
  }
  if (single) cxr__bell_ring(&sc->blk->resp.futex, &sc->blk->resp.sleepers);
  else cxr__bell_after_push(&sc->blk->resp.futex, &sc->blk->resp.sleepers);
}

/* This worker's idea of the time, for the "expired in the queue" check: read after each
 * answer and while polling idle (at most one handler run or ~16 polls old, and never
 * ahead), so no clock read sits between a request and its answer. */
static __thread int64_t tl_now;

/* Validates one request (already copied out of the ring) and answers it. */
static void handle(cxr_channel *ch, cxr__sconn *sc, const cxr__desc *d) {
  cxr__srv_ctr *ctr = &sc->slot->srv;
  cxr__desc r;
  cxr__desc_set(&r, d->call_id, d->method, 0);
  unsigned char inl[CXR__INLINE_MAX] __attribute__((aligned(16)));
  void *result = NULL;
  int st = 0;
  const cxr__method *m = NULL;
  cxr_call call = {.ch = ch, .sc = sc, .call_id = d->call_id, .method = d->method,
                   .flags = d->flags, .seal = d->seal, .deadline = d->deadline};
  uint32_t idx = (uint32_t)d->call_id, gen = (uint32_t)(d->call_id >> 32);
  if ((d->flags & ~(uint32_t)(CXR_CALL_SEAL | CXR_CALL_INLINE)) != 0 || gen == 0 ||
      idx >= ch->o.ring_slots) {
    st = CXR_EPROTO;
  } else if ((m = cxr__method_find(ch, d->method)) == NULL) {
    st = CXR_ENOMETHOD;
  } else if (d->flags & CXR_CALL_INLINE) {
    if (d->len > CXR__INLINE_MAX || d->ptr != 0) {
      st = CXR_EPROTO;
    } else {
      memcpy(inl, d->data, d->len);
      call.args = inl;
      call.arg_len = d->len;
    }
  } else if (d->ptr != 0) {
    if (d->len > cxr_heap_size(sc->heap) ||
        !cxr_heap_contains(sc->heap, (const void *)(uintptr_t)d->ptr, d->len ? d->len : 1)) {
      st = CXR_EBADPTR;
    } else {
      call.args = (const void *)(uintptr_t)d->ptr;
      call.arg_len = d->len;
    }
  } else if (d->len != 0) {
    st = CXR_EBADPTR;
  }
  if (st == 0 && d->deadline != 0 && tl_now > d->deadline) {
    st = CXR_ETIMEDOUT; /* the caller has given up: do not run it */
    ctr_add(ch, &ctr->expired, 1);
  } else if (st == 0 && CXR__LDX(&sc->cancel[idx]) == d->call_id) { /* idx < ring_slots */
    st = CXR_ECANCELED; /* cancelled (or timed out) while it waited in the queue */
    ctr_add(ch, &ctr->cancelled, 1);
  } else if (st == 0) {
    call.cancel = &sc->cancel[idx];
    ACQUIRE_FROM_PEER(sc);
    st = cxr__dispatch(&call, m->fn, m->user, &result);
    RELEASE_TO_PEER(sc);
    if (result != NULL && (!cxr_heap_contains(sc->heap, result, 1) ||
                           (uintptr_t)result >= CXR__RESULT_ADDR_LIMIT)) {
      CXR_WARN("channel %s: handler for method %u returned a pointer outside the connection heap",
               ch->name, d->method);
      st = CXR_EBADPTR;
      result = NULL;
    }
    if (st > 0 || st < CXR_ERRNO_MIN) st = CXR_EIO;
  } else {
    ctr_add(ch, &ctr->malformed, 1);
  }
  size_t out_len = result != NULL ? cxr_heap_usable_size(sc->heap, result) : 0; /* before the
                                                          client may free it */
  r.status = st;
  r.ptr = (uint64_t)(uintptr_t)result;
  push_response(ch, sc, &r);
  tl_now = cxr__coarse_ns();
  /* Counters once the answer is on its way: off the round trip's critical path. */
  ctr_add(ch, &ctr->calls, 1);
  if (call.arg_len) ctr_add(ch, &ctr->bytes_in, call.arg_len);
  if (st != 0) ctr_add(ch, &ctr->errors, 1);
  if (out_len) ctr_add(ch, &ctr->bytes_out, out_len);
}

/* Starts a poll pass: bumps this worker's pass counter (release) before it reads `members`,
 * `live` or any ring (see cxr__wpass). Only its worker writes it. */
static void pass_begin(cxr__wpass *ws) {
  __atomic_store_n(&ws->v, __atomic_load_n(&ws->v, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
}

/* Word w of the connections to poll: the shared active map (a client sets its bit when it
 * connects, so it is served at once) and the slots the manager saw claimed (any client can
 * clear another's shared bit). */
static uint64_t serving_bits(cxr_channel *ch, unsigned w) {
  return CXR__LD(&ch->cb->active[w]) | __atomic_load_n(&ch->claimed[w], __ATOMIC_RELAXED);
}

/* The next connection of active-map word w (its bit taken out of *bits) that is live and
 * not retiring, or NULL when the word has no more. `live` is read before anything else of
 * the connection (see cxr__wpass). */
static cxr__sconn *next_serving(cxr_channel *ch, unsigned w, uint64_t *bits) {
  while (*bits) {
    unsigned k = w * 64 + (unsigned)__builtin_ctzll(*bits);
    *bits &= *bits - 1;
    if (k >= ch->o.max_conns) return NULL;
    cxr__sconn *sc = &ch->conns[k];
    if (__atomic_load_n(&sc->live, __ATOMIC_ACQUIRE) &&
        !__atomic_load_n(&sc->retiring, __ATOMIC_RELAXED))
      return sc;
  }
  return NULL;
}

/* A single worker's private list of the connections it serves (live, not retiring, and
 * claimed: their bit in the shared `active` map), each with the request slot it pops next.
 * A pass then costs an idle connection two words of one array and the line of its watched
 * slot, instead of the bitmap walk and the connection's own fields: the list is rebuilt only
 * when `members` (the manager's changes to live and retiring) or the active map moved.
 * Safe as the walk over `live` is (see cxr__wpass): a pass reads `members` after bumping its
 * pass counter, so a pass that starts after the manager retired a connection rebuilds
 * without it, and the manager waits for the passes that started before. */
typedef struct watch {
  const uint32_t *seq;
  uint32_t want;
  cxr__sconn *sc;
} watch;

typedef struct watch_list {
  watch *w;
  unsigned n;
  unsigned members;
  uint64_t active[CXR__MAX_CONNS / 64];
} watch_list;

static void watch_rebuild(cxr_channel *ch, watch_list *wl) {
  wl->n = 0;
  unsigned words = (ch->o.max_conns + 63) / 64;
  for (unsigned w = 0; w < words; w++) {
    uint64_t bits = wl->active[w];
    for (cxr__sconn *sc; (sc = next_serving(ch, w, &bits)) != NULL;)
      wl->w[wl->n++] = (watch){sc->next_seq, sc->next_want, sc};
  }
}

/* One pass of a single worker. Returns how many calls it handled. */
static unsigned poll_watched(cxr_channel *ch, cxr__wpass *ws, watch_list *wl) {
  pass_begin(ws);
  unsigned members = __atomic_load_n(&ch->members, __ATOMIC_ACQUIRE), n = 0;
  bool changed = members != wl->members;
  for (unsigned w = 0, words = (ch->o.max_conns + 63) / 64; w < words; w++) {
    uint64_t bits = serving_bits(ch, w);
    if (bits != wl->active[w]) {
      wl->active[w] = bits;
      changed = true;
    }
  }
  if (changed) {
    wl->members = members;
    watch_rebuild(ch, wl);
  }
  for (unsigned i = 0; i < wl->n; i++) {
    watch *e = &wl->w[i];
    if (CXR__LD(e->seq) != e->want) continue;
    /* It is the request ring's only consumer: no locked instruction. */
    cxr__sconn *sc = e->sc;
    cxr__desc d;
    for (int b = 0; b < BATCH && cxr__ring_pop_single(&sc->req, &d) == 0; b++) {
      handle(ch, sc, &d);
      n++;
    }
    cxr__sconn_watch(sc);
    e->seq = sc->next_seq;
    e->want = sc->next_want;
  }
  return n;
}

/* One pass over the active connections (several workers). Returns how many calls it
 * handled. */
static unsigned poll_once(cxr_channel *ch, cxr__wpass *ws) {
  pass_begin(ws);
  unsigned words = (ch->o.max_conns + 63) / 64, n = 0;
  for (unsigned w = 0; w < words; w++) {
    uint64_t bits = serving_bits(ch, w);
    for (cxr__sconn *sc; (sc = next_serving(ch, w, &bits)) != NULL;) {
      cxr__desc d;
      if (!cxr__ring_nonempty(&sc->req)) continue;
      for (int i = 0; i < BATCH && cxr__ring_pop(&sc->req, &d) == 0; i++) {
        handle(ch, sc, &d);
        n++;
      }
    }
  }
  return n;
}

/* Whether a request ring is busy; *mark: its busy rings and their tails mixed (cxr__busy:
 * a plain sum could stay the same as one ring left and another came), or ~0 when a busy
 * ring's next slot is published: a request to take now, never a reason to sleep. */
static bool any_request(cxr_channel *ch, cxr__wpass *ws, uint64_t *mark) {
  unsigned words = (ch->o.max_conns + 63) / 64;
  bool busy = false;
  *mark = 0;
  pass_begin(ws);
  for (unsigned w = 0; w < words; w++) {
    uint64_t bits = serving_bits(ch, w);
    for (cxr__sconn *sc; (sc = next_serving(ch, w, &bits)) != NULL;) {
      if (!cxr__ring_busy(&sc->req)) continue;
      if (cxr__ring_nonempty(&sc->req)) {
        *mark = ~0ull;
        return true;
      }
      busy = true;
      *mark = (*mark ^ (uint64_t)(uintptr_t)sc) * 0x9E3779B97F4A7C15ull +
              CXR__LDX(&sc->req.r->tail);
    }
  }
  return busy;
}

/* Sleeps until a client rings or a second passes (stop is also rung). A request ring whose
 * tail is ahead of any published slot keeps any_request true: a client between its tail
 * CAS and its publish, or one stopped or hostile there. Before, the sleep was then refused
 * each time and an idle worker spun at full CPU for as long as that ring stayed so; now a
 * refusal with the busy rings' tails unmoved since the last one sleeps cxr__busy_sleep_ns
 * (refused->n zeroed by the caller when it handles a call). */
static void worker_sleep(cxr_channel *ch, cxr__wpass *ws, cxr__busy *refused) {
  cxr__chan_block *cb = ch->cb;
  uint32_t v = __atomic_load_n(&cb->doorbell, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&cb->srv_sleepers, 1, __ATOMIC_SEQ_CST);
  int64_t t = 1000000000;
  uint64_t mark;
  /* A published request (counted as a sleeper first: a producer that published while we
   * were not counted rang nobody) is taken at once; only a tail with nothing published
   * behind it backs off. Without that look a request published in the gap between a
   * refusal and the next could wait out a backoff step (a review). */
  if (any_request(ch, ws, &mark)) {
    if (mark == ~0ull) refused->n = 0, t = 0;
    else t = cxr__busy_sleep_ns(refused, mark);
  } else {
    refused->n = 0;
  }
  if (t > 0 && !__atomic_load_n(&ch->stop, __ATOMIC_ACQUIRE))
    cxr__futex_wait(&cb->doorbell, v, t);
  __atomic_fetch_sub(&cb->srv_sleepers, 1, __ATOMIC_SEQ_CST);
}

void *cxr__worker_main(void *arg) {
  cxr_channel *ch = arg;
  unsigned id = __atomic_fetch_add(&ch->wnext, 1, __ATOMIC_ACQ_REL);
  if (id >= CXR__MAX_WORKERS) return NULL;
  cxr__wpass *ws = &ch->wpass[id];
  /* One worker polls its watch list; several walk the active map (their rings have
   * several consumers, so the next slot is not theirs to know). */
  watch_list wl = {.members = __atomic_load_n(&ch->members, __ATOMIC_ACQUIRE) - 1};
  if (ch->o.workers == 1 && (wl.w = calloc(ch->o.max_conns, sizeof *wl.w)) == NULL)
    CXR_WARN("channel %s: no memory for the watch list; walking the connections", ch->name);
  cxr__waitpol pol = {0};
  int64_t base_spin, yield_ns;
  cxr__wait_windows(&pol, cxr_now_ns(), &base_spin, &yield_ns);
  int64_t spin = base_spin, last = cxr_now_ns();
  tl_now = last;
  unsigned empty = 0;
  cxr__busy refused = {0};
  bool checked = false;
  while (!__atomic_load_n(&ch->stop, __ATOMIC_ACQUIRE)) {
    if ((wl.w ? poll_watched(ch, ws, &wl) : poll_once(ch, ws)) != 0) {
      empty = 0;
      refused.n = 0;
      continue;
    }
    /* One pause per empty poll (a pause is ~40 ns or more): the delay before we see a new
     * call is what the round trip pays. The clock is read every 16 empty polls. */
    if ((++empty & 15) != 1) {
      cxr__cpu_relax();
      continue;
    }
    if (empty == 1) {
      last = cxr_now_ns();
      checked = false;
      cxr__wait_spin_start(&pol, last);
    }
    int64_t now = cxr_now_ns(), idle = now - last;
    tl_now = now;
    if (idle < spin) {
      cxr__wait_tick(&pol, now);
      cxr__cpu_relax();
      continue;
    }
    if (!checked && spin > 0) { /* the window ran out: spinning off the CPU? then block */
      checked = true;
      if (cxr__wait_contended(&pol, now)) yield_ns = 0;
    }
    if (idle < spin + yield_ns) {
      sched_yield();
      continue;
    }
    int64_t slept = cxr_now_ns();
    worker_sleep(ch, ws, &refused);
    last = tl_now = cxr_now_ns();
    empty = 0;
    /* Windows for the next idle period: none while blocking after contention. Otherwise
     * adapt: woken soon after falling asleep means calls come at a pace the spin window
     * just missed, so widen it (up to 1 ms); a long sleep shrinks it back. */
    int64_t want_spin;
    cxr__wait_windows(&pol, last, &want_spin, &yield_ns);
    if (want_spin == 0) {
      spin = 0;
    } else if (spin == 0) {
      spin = base_spin;
    } else if (last - slept < 4 * spin) {
      if (spin < 1000000) spin *= 2;
    } else if (spin > base_spin) {
      spin /= 2;
    }
  }
  free(wl.w);
  return NULL;
}
