/* The server side of a channel: opening it (control heap + a pool of ready connection
 * heaps), the method table, start/stop/close, and the manager thread that refills the
 * pool, recycles closed connections and reclaims those whose client died. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc/remote.h"
#include "rpc/seal_glue.h"
#include "rpc/server.h"
#include "shm/bus_guard.h"
#include "shm/log.h"
#include "shm/reg_deadline.h"

void cxr_channel_opts_init(cxr_channel_opts *o) {
  if (o == NULL) return;
  memset(o, 0, sizeof *o);
  o->mode = 0600;
  o->conn_heap_size = 64u << 20;
  o->pool = 4;
  o->max_conns = 64;
  o->workers = 1;
  o->ring_slots = 256;
  o->peer_timeout_ns = 100000000;
}

static bool valid_name(const char *name) {
  size_t n = strnlen(name, CXR__CHAN_NAME_MAX + 1);
  if (n == 0 || n > CXR__CHAN_NAME_MAX) return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!(c == '-' || c == '_' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
          (c >= 'A' && c <= 'Z')))
      return false;
  }
  return true;
}

/* ---- method table ---- */

static unsigned method_hash(uint32_t id) { return (id * 2654435761u) % CXR__METHOD_SLOTS; }

const cxr__method *cxr__method_find(const cxr_channel *ch, uint32_t id) {
  unsigned h = method_hash(id);
  for (unsigned i = 0; i < CXR__METHOD_SLOTS; i++) {
    const cxr__method *m = &ch->methods[(h + i) % CXR__METHOD_SLOTS];
    if (!m->used) return NULL;
    if (m->id == id) return m;
  }
  return NULL;
}

int cxr_channel_on(cxr_channel *ch, uint32_t method, cxr_handler fn, void *user) {
  if (ch == NULL || fn == NULL) return CXR_EINVAL;
  if (cxr__fork_inherited(ch->fork_epoch)) return CXR_ECLOSED;
  if (__atomic_load_n(&ch->running, __ATOMIC_ACQUIRE)) return CXR_EBUSY;
  unsigned h = method_hash(method);
  for (unsigned i = 0; i < CXR__METHOD_SLOTS; i++) {
    cxr__method *m = &ch->methods[(h + i) % CXR__METHOD_SLOTS];
    if (m->used && m->id == method) {
      m->fn = fn;
      m->user = user;
      return 0;
    }
    if (!m->used) {
      if (ch->nmethods >= CXR__METHOD_SLOTS / 2) return CXR_EFULL;
      m->id = method;
      m->fn = fn;
      m->user = user;
      m->used = true;
      ch->nmethods++;
      return 0;
    }
  }
  return CXR_EFULL;
}

/* ---- connection heaps ---- */

static void active_clear(cxr_channel *ch, unsigned k) {
  __atomic_fetch_and(&ch->cb->active[k / 64], ~(1ull << (k % 64)), __ATOMIC_SEQ_CST);
  __atomic_fetch_and(&ch->claimed[k / 64], ~(1ull << (k % 64)), __ATOMIC_SEQ_CST);
}

void cxr__sconn_free_result(cxr__sconn *sc, uint64_t ptr) {
  void *p = (void *)(uintptr_t)ptr;
  /* Never the block the rings live in: answers left on the ring are the client's to write
   * too, and one naming that block would free the rings under the next client. */
  if (p == NULL || p == (void *)sc->blk || !cxr_heap_contains(sc->heap, p, 1)) return;
  cxr_heap_free(sc->heap, p);
}

/* The connection block is still the heap's root and still allocated: the client may have
 * freed it (any holder can free any block) or moved the root before it closed. */
static bool rings_intact(const cxr_channel *ch, const cxr__sconn *sc) {
  return cxr_heap_get_root(sc->heap) == (void *)sc->blk &&
         cxr_heap_usable_size(sc->heap, sc->blk) >= cxr__conn_block_size(ch->o.ring_slots);
}

/* Closes a heap the SIGBUS guard watches, and stops watching it once it is unmapped: the
 * close of a shrunk heap touches pages past its end too. Every such heap is unlinked next
 * and its lock word is the clients' to write: the close does not wait for the lock (one
 * left "held" cost 50 ms per connection heap, 2 s for the control heap, some of it with the
 * pod registry's lock held; shm/reg_deadline.h). */
static void close_watched(cxr_heap *h) {
  void *base = cxr_heap_base(h);
  size_t size = cxr_heap_size(h);
  cxr__heap_close_nowait(h);
  cxr__bus_guard_watch(base, size, false);
}

static void sconn_destroy(cxr_channel *ch, cxr__sconn *sc) {
  if (sc->heap == NULL) return;
  char name[CXR_NAME_MAX + 1];
  snprintf(name, sizeof name, "%s", cxr_heap_name(sc->heap));
  __atomic_store_n(&sc->live, 0, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&ch->members, 1, __ATOMIC_SEQ_CST);
  close_watched(sc->heap);
  sc->damaged = false;
  int rc = cxr_heap_unlink(name);
  if (rc != 0 && rc != CXR_ENOENT) CXR_WARN("channel %s: unlink %s: %s", ch->name, name, cxr_strerror(rc));
  sc->heap = NULL;
  sc->blk = NULL;
}

/* Zeroes n words that other threads or processes may read meanwhile. */
static void zero_words(uint64_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) CXR__STX(&p[i], 0);
}

/* Makes slot k READY: creates its heap if it has none, (re)initialises the rings and
 * publishes the slot with a new generation. Only the manager (or open) calls it. */
static int sconn_make_ready(cxr_channel *ch, cxr__sconn *sc) {
  cxr__cslot *s = sc->slot;
  uint32_t ring = ch->o.ring_slots;
  if (sc->heap == NULL) {
    char name[CXR_NAME_MAX + 1];
    int n = snprintf(name, sizeof name, "cc.%s.%d.%u.%u", ch->name, (int)ch->self.pid, sc->index,
                     ch->heap_seq++);
    if (n < 0 || n > CXR_NAME_MAX) return CXR_ENAMETOOLONG;
    cxr_heap_opts ho;
    cxr_heap_opts_init(&ho);
    ho.mode = ch->o.mode;
    cxr_heap *h;
    int rc = cxr_heap_create(&h, name, ch->o.conn_heap_size, &ho);
    if (rc == CXR_EEXIST) { /* left by a crashed server with our pid: replace it */
      cxr_heap_unlink(name);
      rc = cxr_heap_create(&h, name, ch->o.conn_heap_size, &ho);
    }
    if (rc != 0) return rc;
    /* The client can jam its lock: waits capped, and together budgeted per channel. */
    cxr__heap_lock_cap(h, CXR__SERVER_HEAP_LOCK_CAP_NS, &ch->lock_budget);
    cxr__conn_block *b = cxr_heap_alloc_aligned(h, 64, cxr__conn_block_size(ring));
    if (b == NULL) {
      rc = cxr_last_error();
      cxr_heap_close(h);
      cxr_heap_unlink(name);
      return rc ? rc : CXR_ENOMEM;
    }
    memset(b, 0, sizeof *b);
    b->magic = CXR__CONN_MAGIC;
    b->version = CXR__VERSION;
    b->ring_slots = ring;
    b->slot = sc->index;
    b->slots = (uint64_t)(uintptr_t)cxr__conn_slots(b, sc->index);
    rc = cxr_heap_set_root(h, b);
    if (rc != 0) {
      cxr_heap_close(h);
      cxr_heap_unlink(name);
      return rc;
    }
    sc->heap = h;
    sc->blk = b;
    cxr__bus_guard_watch(cxr_heap_base(h), cxr_heap_size(h), true); /* a client may shrink it */
    cxr__conn_views(b, ring, sc->index, &sc->req, &sc->resp);
    sc->cancel = cxr__conn_cancels(b, ring, sc->index);
    cxr_heap_stats st;
    sc->baseline_used = cxr_heap_stats(h, &st) == 0 ? st.used : 0;
    snprintf(s->heap, sizeof s->heap, "%s", name);
    s->conn_block = (uint64_t)(uintptr_t)b;
    CXR__ADD(&ch->cb->created, 1);
  }
  cxr__ring_init(&sc->req);
  cxr__ring_init(&sc->resp);
  cxr__sconn_watch(sc);
  /* A new tenant's call ids start again: no cancel word of the last one may match them. */
  memset(sc->cancel, 0, ring * sizeof *sc->cancel);
  uint32_t gen = (cxr__owner_gen(CXR__LDX(&s->owner)) + 1) & 0xffffff;
  if (gen == 0) gen = 1;
  sc->gen = gen;
  sc->blk->gen = gen;
  /* Other processes, and cxr_channel_inspect in this one, read these at any time: atomic
   * stores (a memset and plain stores raced with an inspect, as TSan saw in call_test). */
  zero_words((uint64_t *)&s->srv, sizeof s->srv / sizeof(uint64_t));
  zero_words((uint64_t *)&s->cli, sizeof s->cli / sizeof(uint64_t));
  CXR__STX(&s->client_start, 0);
  CXR__STX(&s->client_uid, 0);
  CXR__STX(&s->since_ns, 0);
  memset(&sc->client, 0, sizeof sc->client);
  sc->readied = true;
  sc->ours = false;
  sc->unstarted = 0;
  __atomic_store_n(&sc->retiring, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&sc->resp_stalled, 0, __ATOMIC_RELAXED);
  cxr__seal_slot_ready(ch, sc);
  __atomic_store_n(&sc->live, 1, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&ch->members, 1, __ATOMIC_SEQ_CST);
  CXR__ST(&s->owner, cxr__owner(0, CXR__SLOT_READY, gen));
  return 0;
}

/* Marks the connections whose heap file another process shrank (the guard repaired our
 * accesses past its end with private pages): this process no longer sees that heap as the
 * client does, so manage_once takes them back and they get fresh heaps. Only after a repair
 * in this process (the counter moved), which is rare: one read of /proc/self/maps. */
static void find_shrunk_heaps(cxr_channel *ch) {
  uint64_t n = cxr__bus_repairs();
  if (n == ch->repairs_seen) return;
  unsigned m = ch->o.max_conns;
  uintptr_t *base = calloc(m + 1, sizeof *base);
  size_t *size = calloc(m + 1, sizeof *size);
  bool *hit = calloc(m + 1, sizeof *hit);
  if (base && size && hit) {
    for (unsigned k = 0; k < m; k++)
      if (ch->conns[k].heap) {
        base[k] = (uintptr_t)cxr_heap_base(ch->conns[k].heap);
        size[k] = cxr_heap_size(ch->conns[k].heap);
      }
    base[m] = (uintptr_t)cxr_heap_base(ch->ctl);
    size[m] = cxr_heap_size(ch->ctl);
    int rc = cxr__bus_damaged(base, size, m + 1, hit);
    if (rc) {
      if (cxr__log_due(++ch->shrunk_unread)) /* it tries again each pass */
        CXR_WARN("channel %s: cannot tell which heaps were shrunk (%s): not taken back",
                 ch->name, cxr_strerror(rc));
    } else {
      ch->shrunk_unread = 0;
      ch->repairs_seen = n;
      for (unsigned k = 0; k < m; k++)
        if (hit[k] && ch->conns[k].heap) ch->conns[k].damaged = true;
      if (hit[m] && !ch->ctl_damaged) {
        ch->ctl_damaged = true;
        CXR_ERR("channel %s: another process shrank the control heap's file: this server "
                "no longer sees what its clients see (connects may hang or crash the "
                "client); reopen the channel", ch->name);
      }
    }
  }
  free(base);
  free(size);
  free(hit);
}

/* Takes back a slot the client closed (CLOSING) or left by dying (RECLAIM). Returns false
 * if a worker is still inside it (try again on the next tick). */
static bool sconn_recycle(cxr_channel *ch, cxr__sconn *sc, bool dead) {
  cxr__cslot *s = sc->slot;
  /* (A slot with no heap was never handed out: a close marked on it is a forged state,
   * which manage_once puts back as FREE before a recycle could begin.) */
  if (sc->snap == NULL) {
    /* Stop workers from entering, make that visible to every thread of ours, then note
     * where each worker is: once each has begun a later pass, none is inside (a handler
     * still running for it keeps its worker in the old pass). */
    active_clear(ch, sc->index);
    __atomic_store_n(&sc->retiring, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&sc->live, 0, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&ch->members, 1, __ATOMIC_SEQ_CST);
    cxr__process_barrier();
    unsigned n = __atomic_load_n(&ch->wnext, __ATOMIC_ACQUIRE);
    if (n > CXR__MAX_WORKERS) n = CXR__MAX_WORKERS;
    sc->snap = calloc(n + 1, sizeof *sc->snap);
    if (sc->snap == NULL) return false;
    sc->nsnap = n;
    sc->snap_at = cxr_now_ns();
    for (unsigned i = 0; i < n; i++) sc->snap[i] = __atomic_load_n(&ch->wpass[i].v, __ATOMIC_ACQUIRE);
  }
  for (unsigned i = 0; i < sc->nsnap; i++) {
    if (__atomic_load_n(&ch->wpass[i].v, __ATOMIC_ACQUIRE) == sc->snap[i]) {
      /* A sleeping worker makes no passes: wake it. */
      __atomic_fetch_add(&ch->cb->doorbell, 1, __ATOMIC_SEQ_CST);
      cxr__futex_wake(&ch->cb->doorbell, INT_MAX);
      if (__atomic_load_n(&ch->running, __ATOMIC_ACQUIRE)) return false;
    }
  }
  free(sc->snap);
  sc->snap = NULL;
  /* Nobody serves it now. Drop queued requests; after a clean close, free the results the
   * client never took, since the heap may serve the next client. Not after a death or a
   * take-back: that heap goes whole, and a client we took it back from may be alive and
   * still popping its answers, with the single-consumer pop of a sole user (rpc/sole.h),
   * which a second consumer would make pop some twice. (Nothing at all in a heap whose file
   * was shrunk: what we see of it is zero pages.) */
  cxr__desc d;
  int reaped = 0;
  if (!sc->damaged) {
    for (uint32_t i = 0; i <= sc->req.mask && cxr__ring_pop(&sc->req, &d) == 0; i++) {
    }
    for (uint32_t i = 0; !dead && i <= sc->resp.mask && cxr__ring_pop(&sc->resp, &d) == 0; i++)
      cxr__sconn_free_result(sc, d.ptr);
    reaped = cxr_heap_reap(sc->heap);
  }
  CXR__ADD(dead ? &ch->cb->reclaimed : &ch->cb->disconnects, 1);
  CXR_DEBUG("channel %s: slot %u %s (reaped %d holders)", ch->name, sc->index,
            dead ? "reclaimed from a dead client" : "closed", reaped);
  /* A client that closed cleanly but left many blocks behind gets a fresh heap. (Not
   * measured when the client is this very process, which may still be closing its handle:
   * the heap's statistics are not safe against a concurrent close in one process. Which
   * process it was is what this process knows, not what the slot says: a client that wrote
   * the server's pid there skipped the check and passed its full heap on.) */
  bool ours = sc->ours || cxr__conn_closed_here(sc->blk, sc->gen);
  cxr_heap_stats st;
  bool bloated = !ours && (cxr_heap_stats(sc->heap, &st) != 0 ||
                           st.used > sc->baseline_used + ch->o.conn_heap_size / 8);
  /* A dead client may have left blocks and half-pushed descriptors: start from a fresh
   * heap. A clean close with a tidy heap reuses it (no file operations: a reconnect costs
   * microseconds), unless the client freed the block the rings live in: the next client's
   * blocks would land on them. (The last tenant may still map a reused heap: docs/rpc.md.) */
  find_shrunk_heaps(ch); /* the drain above may have been the first to touch a shrunk page */
  if (dead || sc->damaged || bloated || !rings_intact(ch, sc)) sconn_destroy(ch, sc);
  sc->readied = false;
  uint64_t o = CXR__LDX(&s->owner);
  CXR__ST(&s->owner, cxr__owner(0, CXR__SLOT_FREE, cxr__owner_gen(o)));
  CXR__ADD(&ch->cb->recycled, 1);
  return true;
}

/* How long a recycle may wait for the workers and still count as a slot ready soon. */
#define RECYCLE_SOON_NS 20000000

static unsigned count_ready(cxr_channel *ch) {
  unsigned n = 0;
  for (unsigned k = 0; k < ch->o.max_conns; k++)
    if (cxr__owner_state(CXR__LD(&ch->cb->slots[k].owner)) == CXR__SLOT_READY) n++;
  return n;
}

/* Refills the pool up to o.pool ready slots. Returns how many were made ready. */
/* Makes slots ready up to the pool size. Returns how many it made; *err (if not NULL) gets
 * the error that stopped it, or 0. */
static unsigned refill(cxr_channel *ch, int *err) {
  if (err) *err = 0;
  unsigned ready = count_ready(ch), made = 0, soon = 0;
  /* Slots being recycled will be ready shortly: do not make new heap files for them. Not
   * when a recycle has waited over RECYCLE_SOON_NS for the workers: a worker stays in its
   * pass while a handler runs, of any connection, so the recycle waits as long as the
   * longest handler (until 2026-11-28 a 4 s handler on one connection stopped every connect
   * once two clients had closed meanwhile: a review). */
  int64_t now = cxr_now_ns();
  for (unsigned k = 0; k < ch->o.max_conns; k++) {
    const cxr__sconn *sc = &ch->conns[k];
    unsigned st = cxr__owner_state(CXR__LD(&sc->slot->owner));
    bool held_up = sc->snap != NULL && now - sc->snap_at > RECYCLE_SOON_NS;
    if (sc->heap != NULL && (st == CXR__SLOT_CLOSING || st == CXR__SLOT_BUSY) && !held_up)
      soon++;
  }
  /* First reuse slots that still have a heap (no file operation), then create heaps. */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1 && ready + soon >= ch->o.pool) break;
    for (unsigned k = 0; k < ch->o.max_conns && ready < ch->o.pool; k++) {
      cxr__sconn *sc = &ch->conns[k];
      uint64_t o = CXR__LD(&sc->slot->owner);
      if (cxr__owner_state(o) != CXR__SLOT_FREE || (pass == 0) != (sc->heap != NULL)) continue;
      /* FREE while its recycle still waits for a worker to leave it: written by a client
       * (any can write the control block), not by us. Readied now, the slot would go to a
       * new client whose heap the recycle then unmaps under its calls. */
      if (sc->pending || sc->readied) continue;
      int rc = sconn_make_ready(ch, sc);
      if (rc != 0) {
        CXR_WARN("channel %s: cannot prepare connection %u: %s", ch->name, k, cxr_strerror(rc));
        if (err) *err = rc;
        pass = 2;
        break;
      }
      ready++;
      made++;
    }
  }
  if (made) cxr__bell_ring(&ch->cb->pool_bell, &ch->cb->pool_sleepers);
  return made;
}

/* A slot state the manager did not lead this slot into (any client can write the control
 * block): anything but FREE on a slot not handed out; FREE or BUSY on a slot handed out and
 * not taken back (before, a forged FREE made the manager ready a live client's heap for the
 * next client, and a forged BUSY stopped the pool's refill for good), a state no version
 * writes, or a claimed slot naming another process than the one seen claiming it. */
static bool state_forged(const cxr__sconn *sc, uint64_t o) {
  unsigned st = cxr__owner_state(o);
  if (sc->pending) return false;
  if (!sc->readied) return st != CXR__SLOT_FREE;
  if (st == CXR__SLOT_FREE || st >= CXR__SLOT_BUSY) return true;
  return st == CXR__SLOT_CLAIMED && sc->client.pid != 0 &&
         (uint32_t)sc->client.pid != cxr__owner_pid(o);
}

/* One pass over the slots. Returns true if work is left over (come back soon). */
static bool manage_once(cxr_channel *ch, bool check_liveness) {
  bool again = false;
  find_shrunk_heaps(ch);
  for (unsigned k = 0; k < ch->o.max_conns; k++) {
    cxr__sconn *sc = &ch->conns[k];
    cxr__cslot *s = sc->slot;
    uint64_t o = CXR__LD(&s->owner);
    unsigned st = cxr__owner_state(o);
    bool shrunk = sc->damaged && !sc->pending;
    if (shrunk || state_forged(sc, o)) {
      /* A client can forge states, or shrink heaps, as fast as the manager looks. */
      uint64_t n = shrunk ? ++ch->shrunk_seen : ++ch->forged_seen;
      if (cxr__log_due(n) && shrunk)
        CXR_WARN("channel %s: connection %u: its heap file was shrunk by someone else; taking "
                 "it back (%llu such heaps so far)", ch->name, k, (unsigned long long)n);
      else if (cxr__log_due(n))
        CXR_WARN("channel %s: connection %u was put in state %u by someone else; taking it "
                 "back (%llu such states so far)", ch->name, k, st, (unsigned long long)n);
      if (!sc->readied) { /* not handed out: its heap goes (the writer may map it), FREE */
        sconn_destroy(ch, sc);
        CXR__CAS(&s->owner, &o, cxr__owner(0, CXR__SLOT_FREE, cxr__owner_gen(o)));
        again = true;
        continue;
      }
      /* Handed out: taken back as from a dead client (drained, a fresh heap). */
      uint64_t want = cxr__owner(cxr__owner_pid(o), CXR__SLOT_RECLAIM, cxr__owner_gen(o));
      if (CXR__CAS(&s->owner, &o, want)) {
        o = want;
        st = CXR__SLOT_RECLAIM;
      } else {
        again = true;
      }
    }
    if (st == CXR__SLOT_CLAIMED && !(__atomic_load_n(&ch->claimed[k / 64], __ATOMIC_RELAXED) &
                                     (1ull << (k % 64))))
      __atomic_fetch_or(&ch->claimed[k / 64], 1ull << (k % 64), __ATOMIC_SEQ_CST);
    if (st == CXR__SLOT_CLAIMED && check_liveness) {
      if (sc->client.pid == 0 || (uint32_t)sc->client.pid != cxr__owner_pid(o)) {
        sc->client.pid = (int32_t)cxr__owner_pid(o);
        sc->client.start_time = CXR__LD(&s->client_start);
        sc->client.host = ch->self.host;
      }
      if (sc->client.start_time == 0) sc->client.start_time = CXR__LD(&s->client_start);
      if (!sc->ours) sc->ours = cxr__conn_held_here(sc->blk, sc->gen);
      cxr__proc_id id = sc->client;
      bool alive;
      if (id.start_time != 0) {
        alive = cxr__proc_alive(&id);
      } else { /* claimed but start time not yet written: the pid must at least exist, and
                * a client writes it right after its claim, so not for long (a client that
                * wrote pid 1 and never a start time kept its slot for good) */
        uint64_t t;
        alive = cxr__proc_start_time(id.pid, &t) != CXR_ENOENT && ++sc->unstarted < 3;
      }
      if (!alive) {
        uint64_t want = cxr__owner(cxr__owner_pid(o), CXR__SLOT_RECLAIM, cxr__owner_gen(o));
        if (CXR__CAS(&s->owner, &o, want)) {
          CXR_INFO("channel %s: client %d of connection %u died; reclaiming", ch->name, id.pid, k);
          o = want;
          st = CXR__SLOT_RECLAIM;
        }
      }
    }
    if (st == CXR__SLOT_CLOSING || st == CXR__SLOT_RECLAIM) {
      uint64_t busy = cxr__owner(cxr__owner_pid(o), CXR__SLOT_BUSY, cxr__owner_gen(o));
      if (CXR__CAS(&s->owner, &o, busy)) {
        sc->pending = true;
        sc->pending_dead = st == CXR__SLOT_RECLAIM;
      } else {
        again = true;
      }
    }
    if (sc->pending) {
      if (sconn_recycle(ch, sc, sc->pending_dead)) sc->pending = false;
      else again = true;
    }
  }
  refill(ch, NULL);
  return again;
}

void *cxr__manager_main(void *arg) {
  cxr_channel *ch = arg;
  cxr__chan_block *cb = ch->cb;
  int64_t tick = ch->o.peer_timeout_ns / 2;
  if (tick < 1000000) tick = 1000000;
  int64_t next_check = 0;
  while (!__atomic_load_n(&ch->stop, __ATOMIC_ACQUIRE)) {
    uint32_t v = __atomic_load_n(&cb->mgr_bell, __ATOMIC_SEQ_CST);
    int64_t now = cxr_now_ns();
    bool check = now >= next_check;
    if (check) next_check = now + tick;
    bool again = manage_once(ch, check);
    int64_t wait = next_check - cxr_now_ns();
    if (again && wait > 1000000) wait = 1000000;
    __atomic_fetch_add(&cb->mgr_sleepers, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&ch->stop, __ATOMIC_ACQUIRE)) cxr__futex_wait(&cb->mgr_bell, v, wait);
    __atomic_fetch_sub(&cb->mgr_sleepers, 1, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

/* ---- open and close ---- */

/* A previous server of this name died without closing: remove its heaps. */
static int remove_stale(const char *ctl_name) {
  cxr_heap *h;
  int rc = cxr_heap_open(&h, ctl_name);
  if (rc != 0) {
    /* Not a readable channel: remove the name so we can create it. */
    return cxr_heap_unlink(ctl_name) == 0 ? 0 : rc;
  }
  cxr__chan_block *cb = cxr_heap_get_root(h);
  if (cxr__block_ok(h, cb, sizeof *cb, _Alignof(cxr__chan_block)) && cb->magic == CXR__CHAN_MAGIC) {
    cxr__proc_id id = {.pid = cb->server_pid, .start_time = cb->server_start,
                       .host = cb->server_host};
    if (CXR__LD(&cb->state) == CXR__CHAN_OPEN && cxr__proc_alive(&id)) {
      cxr_heap_close(h);
      return CXR_EEXIST;
    }
    unsigned n = CXR__LDX(&cb->max_conns); /* read once: the old block is anyone's to write */
    if (n > CXR__MAX_CONNS) n = 0;
    if (!cxr_heap_contains(h, cb, cxr__chan_block_size(n))) n = 0;
    /* Only this channel's connection heaps ("cc.NAME." + the old server's pid...): a
     * client could have written any name there, another channel's heaps' say, and had us
     * remove them. */
    char prefix[CXR_NAME_MAX + 2];
    int pn = snprintf(prefix, sizeof prefix, "cc.%s.", ctl_name + 3);
    for (unsigned k = 0; k < n && pn > 0 && (size_t)pn < sizeof prefix; k++) {
      char name[CXR_NAME_MAX + 1];
      memcpy(name, cb->slots[k].heap, sizeof name);
      name[CXR_NAME_MAX] = '\0';
      if (strncmp(name, prefix, (size_t)pn) == 0) cxr_heap_unlink(name);
    }
  }
  cxr_heap_close(h);
  CXR_INFO("removing stale channel %s", ctl_name);
  cxr_heap_unlink(ctl_name);
  return 0;
}

int cxr_channel_open(cxr_channel **out, const char *name, const cxr_channel_opts *opts) {
  if (out == NULL) return CXR_EINVAL;
  *out = NULL;
  if (name == NULL) return CXR_EINVAL;
  if (!valid_name(name)) return strlen(name) > CXR__CHAN_NAME_MAX ? CXR_ENAMETOOLONG : CXR_EINVAL;
  cxr_channel_opts o;
  if (opts) o = *opts; else cxr_channel_opts_init(&o);
  if (o.mode == 0) o.mode = 0600;
  if (o.conn_heap_size == 0) o.conn_heap_size = 64u << 20;
  if (o.ring_slots == 0) o.ring_slots = 256;
  if (o.max_conns == 0) o.max_conns = 64;
  if (o.workers == 0) o.workers = 1;
  if (o.pool == 0) o.pool = o.max_conns < 4 ? o.max_conns : 4;
  if (o.peer_timeout_ns == 0) o.peer_timeout_ns = 100000000;
  if ((o.ring_slots & (o.ring_slots - 1)) != 0 || o.ring_slots < 2 || o.ring_slots > CXR__MAX_RING ||
      o.max_conns > CXR__MAX_CONNS || o.pool > o.max_conns || o.workers > 64 ||
      (o.mode & ~0777u) != 0 || o.peer_timeout_ns < 0 ||
      o.conn_heap_size < 2 * cxr__conn_block_size(o.ring_slots))
    return CXR_EINVAL;
  if (o.listen != NULL && strncmp(o.listen, "ucx://", 6) != 0) return CXR_EINVAL;
  int rc = cxr_init(NULL);
  if (rc != 0 && rc != CXR_EBUSY) return rc;
  /* A client that shrinks its heap's file must not kill us with SIGBUS (shm/bus_guard.h). */
  if (cxr__bus_guard_install() != 0)
    CXR_WARN("channel %s: no SIGBUS guard: a client that shrinks its heap file kills us", name);

  cxr_channel *ch = calloc(1, sizeof *ch);
  if (ch == NULL) return CXR_ENOMEM;
  ch->fork_epoch = cxr__fork_epoch;
  ch->o = o;
  ch->o.listen = NULL;
  snprintf(ch->name, sizeof ch->name, "%s", name);
  pthread_mutex_init(&ch->lock, NULL);
  ch->lock_budget.per_s_ns = CXR__SERVER_HEAP_LOCK_BUDGET_NS;
  if ((rc = cxr__proc_self_id(&ch->self)) != 0) goto fail;

  char ctl_name[CXR_NAME_MAX + 1];
  snprintf(ctl_name, sizeof ctl_name, "ch.%s", name);
  size_t blk = cxr__chan_block_size(o.max_conns);
  size_t ctl_size = (blk + 2 * 65536 + 65535) & ~(size_t)65535;
  cxr_heap_opts ho;
  cxr_heap_opts_init(&ho);
  ho.mode = o.mode;
  rc = cxr_heap_create(&ch->ctl, ctl_name, ctl_size, &ho);
  if (rc == CXR_EEXIST) {
    if ((rc = remove_stale(ctl_name)) != 0) goto fail;
    rc = cxr_heap_create(&ch->ctl, ctl_name, ctl_size, &ho);
  }
  if (rc != 0) goto fail;
  cxr__bus_guard_watch(cxr_heap_base(ch->ctl), cxr_heap_size(ch->ctl), true);
  cxr__chan_block *cb = cxr_heap_alloc_aligned(ch->ctl, 64, blk);
  if (cb == NULL) {
    rc = cxr_last_error() ? cxr_last_error() : CXR_ENOMEM;
    goto fail;
  }
  memset(cb, 0, blk);
  cb->magic = CXR__CHAN_MAGIC;
  cb->version = CXR__VERSION;
  cb->max_conns = o.max_conns;
  cb->ring_slots = o.ring_slots;
  cb->pool = o.pool;
  cb->mode = o.mode;
  cb->server_pid = ch->self.pid;
  cb->server_start = ch->self.start_time;
  cb->server_host = ch->self.host;
  cb->peer_timeout_ns = o.peer_timeout_ns;
  cb->conn_heap_size = o.conn_heap_size;
  cb->workers = o.workers;
  cb->opened_ns = cxr_now_ns();
  snprintf(cb->name, sizeof cb->name, "%s", name);
  ch->cb = cb;
  ch->conns = calloc(o.max_conns, sizeof *ch->conns);
  if (ch->conns == NULL) {
    rc = CXR_ENOMEM;
    goto fail;
  }
  for (unsigned k = 0; k < o.max_conns; k++) {
    ch->conns[k].index = k;
    ch->conns[k].slot = &cb->slots[k];
  }
  /* The pool is filled before anyone can see the channel, so the first connect is fast. A
   * first connection heap that cannot be made (too small for a heap, no space) fails the
   * open: otherwise every connect would time out waiting for it. */
  refill(ch, &rc);
  if (rc != 0) goto fail;
  CXR__ST(&cb->state, CXR__CHAN_OPEN);
  if ((rc = cxr_heap_set_root(ch->ctl, cb)) != 0) goto fail;
  if (opts && opts->listen && cxr__seal_restricts_workers(ch)) {
    /* A restricted worker cannot send a cross-rack reply (the socket write is outside its
     * seccomp policy): UCX failed the endpoint and aborted the server at the first call (a
     * review, 2026-11-28). Handing replies to the engine's thread is not built. */
    CXR_ERR("channel %s: CXRPC_SANDBOX_THREADS=1 with an untrusted channel that listens "
            "across racks is not supported", name);
    rc = CXR_ENOSYS;
    goto fail;
  }
  if (opts && opts->listen && (rc = cxr__remote_listen(ch, opts->listen)) != 0) goto fail;
  *out = ch;
  return 0;
fail:
  cxr_channel_close(ch);
  return rc;
}

static int start_threads(cxr_channel *ch, unsigned workers) {
  __atomic_store_n(&ch->wnext, 0, __ATOMIC_RELEASE);
  for (unsigned i = 0; i < CXR__MAX_WORKERS; i++) __atomic_store_n(&ch->wpass[i].v, 0, __ATOMIC_RELEASE);
  ch->threads = calloc(workers + 1, sizeof *ch->threads);
  if (ch->threads == NULL) return CXR_ENOMEM;
  ch->nthreads = 0;
  if (pthread_create(&ch->threads[0], NULL, cxr__manager_main, ch) != 0) return CXR_EIO;
  ch->nthreads = 1;
  for (unsigned i = 0; i < workers; i++) {
    if (pthread_create(&ch->threads[ch->nthreads], NULL, cxr__worker_main, ch) != 0) return CXR_EIO;
    ch->nthreads++;
  }
  return 0;
}

static void close_rest(cxr_channel *ch);

static void join_threads(cxr_channel *ch) {
  for (unsigned i = 0; i < ch->nthreads; i++) pthread_join(ch->threads[i], NULL);
  free(ch->threads);
  ch->threads = NULL;
  ch->nthreads = 0;
}

static void wake_all(cxr_channel *ch) {
  __atomic_fetch_add(&ch->cb->doorbell, 1, __ATOMIC_SEQ_CST);
  cxr__futex_wake(&ch->cb->doorbell, INT_MAX);
  __atomic_fetch_add(&ch->cb->mgr_bell, 1, __ATOMIC_SEQ_CST);
  cxr__futex_wake(&ch->cb->mgr_bell, INT_MAX);
}

int cxr_channel_start(cxr_channel *ch) {
  if (ch == NULL || ch->cb == NULL) return CXR_EINVAL;
  if (cxr__fork_inherited(ch->fork_epoch)) return CXR_ECLOSED;
  pthread_mutex_lock(&ch->lock);
  int rc = 0;
  if (__atomic_load_n(&ch->running, __ATOMIC_ACQUIRE)) {
    rc = CXR_EBUSY;
  } else {
    __atomic_store_n(&ch->stop, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&ch->running, 1, __ATOMIC_RELEASE);
    rc = start_threads(ch, ch->o.workers);
    ch->background = rc == 0;
    if (rc != 0) {
      __atomic_store_n(&ch->stop, 1, __ATOMIC_RELEASE);
      wake_all(ch);
      join_threads(ch);
      __atomic_store_n(&ch->running, 0, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&ch->lock);
  return rc;
}

/* serve()'s caller while library threads do the work: sleeps until the channel stops
 * (the stop rings the doorbell; clients ringing it only wake us early). */
static void wait_stopped(cxr_channel *ch) {
  for (;;) {
    uint32_t v = __atomic_load_n(&ch->cb->doorbell, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&ch->stop, __ATOMIC_ACQUIRE)) return;
    cxr__futex_wait(&ch->cb->doorbell, v, 1000000000);
  }
}

int cxr_channel_serve(cxr_channel *ch) {
  if (ch == NULL || ch->cb == NULL) return CXR_EINVAL;
  if (cxr__fork_inherited(ch->fork_epoch)) return CXR_ECLOSED;
  pthread_mutex_lock(&ch->lock);
  if (__atomic_load_n(&ch->running, __ATOMIC_ACQUIRE)) {
    pthread_mutex_unlock(&ch->lock);
    return CXR_EBUSY;
  }
  __atomic_store_n(&ch->stop, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&ch->running, 1, __ATOMIC_RELEASE);
  /* The calling thread is one of the workers, unless workers take the seccomp policy: it
   * is for good, and the caller's thread is the application's (main, often), which must
   * still open and unlink files once serve returns (the close's among them). It then
   * only waits for the stop. */
  bool own = !cxr__seal_restricts_workers(ch);
  int rc = start_threads(ch, ch->o.workers - own);
  pthread_mutex_unlock(&ch->lock);
  if (rc == 0 && own) cxr__worker_main(ch);
  if (rc == 0 && !own) wait_stopped(ch);
  __atomic_store_n(&ch->stop, 1, __ATOMIC_RELEASE);
  wake_all(ch);
  pthread_mutex_lock(&ch->lock);
  join_threads(ch);
  __atomic_store_n(&ch->running, 0, __ATOMIC_RELEASE);
  bool finish = ch->finish_on_return;
  pthread_mutex_unlock(&ch->lock);
  if (finish) close_rest(ch); /* ch is gone after this */
  return rc;
}

void cxr_channel_stop(cxr_channel *ch) {
  if (ch == NULL || ch->cb == NULL || cxr__fork_inherited(ch->fork_epoch)) return;
  /* Counted before the stop flag: once it is set, serve() may return on another thread and
   * its caller close the channel while we still wake and lock it (TSan saw the close free
   * it under us); close_rest waits for the count to fall. */
  __atomic_fetch_add(&ch->stoppers, 1, __ATOMIC_SEQ_CST);
  __atomic_store_n(&ch->stop, 1, __ATOMIC_RELEASE);
  wake_all(ch);
  /* Threads started by cxr_channel_start are joined here (unless we are one of them);
   * serve() joins its own when it returns. */
  pthread_mutex_lock(&ch->lock);
  if (ch->background) {
    bool inside = false;
    for (unsigned i = 0; i < ch->nthreads; i++)
      if (pthread_equal(ch->threads[i], pthread_self())) inside = true;
    if (!inside) {
      join_threads(ch);
      ch->background = false;
      __atomic_store_n(&ch->running, 0, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&ch->lock);
  __atomic_fetch_sub(&ch->stoppers, 1, __ATOMIC_RELEASE);
}

void cxr_channel_close(cxr_channel *ch) {
  /* A child's copy of its parent's channel (fork(2)) is left as it is: closing it would stop
   * the parent's service for every client, and its threads and locks are not ours. */
  if (ch == NULL || cxr__fork_inherited(ch->fork_epoch)) return;
  cxr__remote_stop(ch);
  bool handed = false;
  if (ch->cb != NULL) {
    cxr_channel_stop(ch);
    /* Wait for a serve() running on another thread to return (its handlers to end), at most
     * 2 s; then that serve() finishes the close when it returns. (Until 2026-11-23 the close
     * went on after 10 s and freed what the handler still used.) */
    int64_t until = cxr_now_ns() + 2000000000; /* by the clock: sleeps stretch under load */
    while (__atomic_load_n(&ch->running, __ATOMIC_ACQUIRE) && cxr_now_ns() < until) usleep(100);
    pthread_mutex_lock(&ch->lock); /* serve() takes it before it finishes the close */
    handed = __atomic_load_n(&ch->running, __ATOMIC_ACQUIRE) != 0;
    if (handed)
      CXR_WARN("channel %s: a handler still runs; the channel goes when it returns", ch->name);
    CXR__ST(&ch->cb->state, CXR__CHAN_CLOSED);
    __atomic_fetch_add(&ch->cb->pool_bell, 1, __ATOMIC_SEQ_CST);
    cxr__futex_wake(&ch->cb->pool_bell, INT_MAX);
    ch->finish_on_return = handed;
    pthread_mutex_unlock(&ch->lock); /* handed: ch may be gone from here on */
  }
  if (!handed) close_rest(ch);
}

/* The rest of a close, once no thread of the channel runs (the manager included: the
 * connections are its): connections, heaps, the channel itself. */
static void close_rest(cxr_channel *ch) {
  /* Clients asleep on their response rings see the channel closed (the others within
   * their peer check). */
  for (unsigned k = 0; ch->cb != NULL && ch->conns && k < ch->o.max_conns; k++) {
    cxr__sconn *sc = &ch->conns[k];
    if (sc->blk != NULL) {
      __atomic_fetch_add(&sc->blk->resp.futex, 1, __ATOMIC_SEQ_CST);
      cxr__futex_wake(&sc->blk->resp.futex, INT_MAX);
    }
  }
  /* The answers still on the rings stay there: their clients may be popping them right now
   * (a sole user's pop admits no second consumer, rpc/sole.h), and each heap goes whole
   * once its client unmaps it. */
  for (unsigned k = 0; ch->conns && k < ch->o.max_conns; k++) sconn_destroy(ch, &ch->conns[k]);
  cxr__seal_channel_close(ch);
  for (unsigned k = 0; ch->conns && k < ch->o.max_conns; k++) free(ch->conns[k].snap);
  free(ch->conns);
  if (ch->ctl != NULL) {
    char name[CXR_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", cxr_heap_name(ch->ctl));
    close_watched(ch->ctl);
    cxr_heap_unlink(name);
  }
  /* A stop on another thread may still be waking and locking the channel. */
  while (__atomic_load_n(&ch->stoppers, __ATOMIC_ACQUIRE) != 0) usleep(100);
  pthread_mutex_destroy(&ch->lock);
  free(ch);
}
