/*
 * Private to rpc/ (tests may include it): the shared-memory layouts of a channel and a
 * connection, and the internal functions the rpc files share.
 *
 *   control heap "ch.<name>"          root = cxr__chan_block: server identity, doorbells,
 *                                     the active bitmap and the connection slots (with
 *                                     their counters, so cxrpcctl reads one heap)
 *   connection heap "cc.<name>.<pid>.<k>.<g>"
 *                                     root = cxr__conn_block: two rings of descriptors;
 *                                     the rest of the heap holds arguments and results
 *
 * Plain integer fields accessed with __atomic builtins (not _Atomic) so that C++ tests can
 * include this header. Everything a peer can write is re-validated by the reader: each side
 * keeps its own private copy of the geometry (ring size, addresses) and never trusts the
 * shared copy after connect.
 */
#ifndef CXRPC_RPC_INTERNAL_H
#define CXRPC_RPC_INTERNAL_H

#include <cxrpc/rpc.h>
#include <stddef.h>
#include <stdint.h>

#include "shm/sync.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CXR__LD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define CXR__LDX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define CXR__ST(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define CXR__STX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define CXR__ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define CXR__CAS(p, expp, v) \
  __atomic_compare_exchange_n((p), (expp), (v), false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)

#define CXR__CHAN_MAGIC 0x314e414843525843ull /* "CXRCHAN1" */
#define CXR__CONN_MAGIC 0x314e4e4f43525843ull /* "CXRCONN1" */
#define CXR__VERSION 4u      /* 4: a request and an answer share each slot's first line */
#define CXR__INLINE_MAX 64u     /* bytes of arguments a descriptor carries inline */
#define CXR__MAX_CONNS 1024u
#define CXR__CHAN_NAME_MAX 32u  /* heap names add prefix, pid, slot and generation */
#define CXR__MAX_RING 65536u

/* ---- descriptors and rings ---- */

/* A descriptor as each side handles it: a private copy, never shared memory (the rings
 * pack it into slots, below). */
typedef struct cxr__desc {
  uint64_t call_id;   /* generation << 32 | index in the caller's pending table */
  uint32_t method;
  uint32_t flags;     /* CXR_CALL_* as sent (16 bits travel) */
  int32_t status;     /* response: the handler's code (16 bits travel) */
  uint32_t seal;      /* seal index (cxrpc/sandbox.h); 0 = not sealed */
  uint64_t ptr;       /* argument (request) or result (response: 48 bits travel) address */
  uint64_t len;       /* argument bytes (inline: bytes in data; 48 bits travel) */
  int64_t deadline;   /* absolute CLOCK_MONOTONIC ns; 0 = none */
  unsigned char data[CXR__INLINE_MAX] __attribute__((aligned(8)));
} cxr__desc;

/* One slot of a connection, shared by its two rings: request position i and answer
 * position i both use slot i. The first line holds a request (written by the client's
 * producers, bytes 0-43) and an answer (the server's, bytes 44-63); the second, a
 * request's inline bytes. When calls go one at a time, answer positions keep pace with
 * request positions, so a request and its answer travel in one cache line, as a single
 * word bounced between two processes does: on the development VM that bounce is 20-30 %
 * faster than a request line and an answer line (two words 64 or 128 bytes apart), which
 * is what separate descriptor arrays cost (docs/rpc.md). The sequence numbers are 32 bits:
 * positions compare modulo 2^32, exact while a ring has fewer than 2^31 slots. */
typedef struct cxr__slot {
  uint32_t seq;          /* request ring: position + 1 once published (Vyukov) */
  uint32_t method;
  uint64_t call_id;
  uint64_t ptr;
  int64_t deadline;
  uint64_t len_flags;    /* argument bytes << 16 | CXR_CALL_* flags */
  uint32_t seal;
  uint32_t rseq;         /* answer ring: position + 1 once published */
  uint64_t rcall_id;
  uint64_t rptr_status;  /* result address << 16 | status (16-bit two's complement) */
  unsigned char data[CXR__INLINE_MAX];
} __attribute__((aligned(64))) cxr__slot;
#ifndef __cplusplus
_Static_assert(sizeof(cxr__slot) == 128 && offsetof(cxr__slot, rseq) == 44 &&
                   offsetof(cxr__slot, data) == 64,
               "a request and an answer in the first line, inline bytes in the second");
#endif
/* Results travel as 48-bit addresses: every heap lies in the address window, which
 * cxr_init keeps below 2^47 (shm/runtime.c); the server refuses anything else. */
#define CXR__RESULT_ADDR_LIMIT (1ull << 48)

/* A descriptor to send, its first line set field by field (inline bytes are the caller's):
 * clearing all 128 bytes with memset compiles to `rep stos`, whose start-up cost (~30
 * cycles on the development machine's AMD CPU) showed in the round trip. */
static inline void cxr__desc_set(cxr__desc *d, uint64_t call_id, uint32_t method, uint32_t flags) {
  d->call_id = call_id;
  d->method = method;
  d->flags = flags;
  d->status = 0;
  d->seal = 0;
  d->ptr = 0;
  d->len = 0;
  d->deadline = 0;
}

/* head (written by consumers), tail (producers) and the futex word sit 128 bytes apart:
 * CPUs fetch lines in adjacent pairs, and the two processes write head and tail on every
 * call, so 64 bytes apart they could still steal each other's line. (Padding, not 128-byte
 * alignment: the heap aligns the block to 64.) */
typedef struct cxr__ring {
  uint64_t head __attribute__((aligned(64)));  /* next position to pop */
  char pad0_[120];
  uint64_t tail;                               /* next position to push */
  char pad1_[120];
  uint32_t futex;                              /* bumped when a sleeper must wake */
  uint32_t sleepers;                           /* threads asleep (or about to) on futex */
  char pad2_[120];
} cxr__ring;
#ifndef __cplusplus
_Static_assert(offsetof(cxr__ring, tail) == 128 && offsetof(cxr__ring, futex) == 256,
               "ring words 128 bytes apart");
#endif

/* A private view of a ring: geometry copied at setup, never re-read from shared memory. */
typedef struct cxr__rview {
  cxr__ring *r;
  cxr__slot *s;
  uint32_t mask;
  bool answers;        /* the answer ring (rseq, rcall_id, rptr_status), else requests */
  uint64_t head_seen;  /* producers: the consumers' head as last read (atomic; it is only
                          re-read when this says the ring may be full) */
} cxr__rview;

/* Empties the ring (its shared words) and the view's memory of it. */
void cxr__ring_init(cxr__rview *v);
/* 0, or CXR_EFULL. `in` is copied except for seq. */
int cxr__ring_push(cxr__rview *v, const cxr__desc *in);
/* The same when this thread is the ring's only producer: no locked instruction before the
 * slot is published; the tail moves after it. Follow it with cxr__bell_ring (a locked
 * instruction, but after the answer is on its way), not cxr__bell_after_push. */
int cxr__ring_push_single(cxr__rview *v, const cxr__desc *in);
/* 0, or CXR_EAGAIN when empty. Any number of consumers; the descriptor is copied out before
 * its slot is handed back (one CAS on the head). */
int cxr__ring_pop(cxr__rview *v, cxr__desc *out);
/* The same when this thread is the ring's only consumer: no locked instruction. */
int cxr__ring_pop_single(cxr__rview *v, cxr__desc *out);
bool cxr__ring_nonempty(const cxr__rview *v);
/* Pushed or being pushed and not yet popped (seq_cst loads of tail and head): what a
 * sleeper checks after announcing itself, see cxr__bell_after_push. */
bool cxr__ring_busy(const cxr__rview *v);

/* ---- the waiting toolkit (wait.c) ---- */

/* cxr__futex_wait and cxr__futex_wake are in shm/sync.h. */
/* After publishing work: wake sleepers of (futex, sleepers) only if there are any. */
void cxr__bell_ring(uint32_t *futex, uint32_t *sleepers);
/* The same right after cxr__ring_push: the push's seq_cst CAS on the tail orders it, so a
 * plain load of the sleeper count suffices (no locked instruction on the call path). */
void cxr__bell_after_push(uint32_t *futex, uint32_t *sleepers);
/* The same after cxr__ring_push_single when the sleepers word is the channel's, which every
 * client reads on every call: a fence, not cxr__bell_ring's read-modify-write, so the line
 * is not taken from the other clients (the RMW under TSan, which models no fences). */
void cxr__bell_after_store(uint32_t *futex, uint32_t *sleepers);
/* A full memory barrier on every running thread of this process (rpc/wait.c). */
void cxr__process_barrier(void);
bool cxr__process_barrier_ready(void);

/* Per-thread waiting policy (CXRPC_WAIT=adaptive|spin|block, default adaptive). Spinning
 * pays while the peer has a CPU. With "adaptive", a thread that spent a quarter or more of
 * its recent spinning off the CPU (more runnable threads than CPUs: spinning and yielding
 * only delay the peer) sleeps at once for the next 50 ms, then probes spinning again. The
 * signal comes from the clock reads the spin loops make anyway (every 16 polls, ~0.5 us
 * apart): a gap above 20 us and 16 usual ones between two of them is time the thread did
 * not run. It is judged when a spin window runs out, never on the fast path. (Before
 * 2026-11-23 any involuntary context switch since the last check counted: on a VM whose
 * spinning threads are preempted ~100 times a second by light background work, that kept
 * a kv client asleep most of the time, at a third of the calls/s of spinning.) "block"
 * always sleeps at once. */
typedef struct cxr__waitpol {
  int64_t block_until;   /* 0: spinning allowed */
  int64_t last;          /* clock at the last tick of the current spin; 0: not spinning */
  int64_t spun, off;     /* recent spinning seen between ticks, and the gaps in it (ns) */
  int64_t tick;          /* the usual time between two ticks (ns) */
} cxr__waitpol;
/* The spin and yield windows for a wait starting now. */
void cxr__wait_windows(cxr__waitpol *p, int64_t now, int64_t *spin, int64_t *yield);
/* A spin starts (now: a clock read), and each later clock read while it lasts. */
static inline void cxr__wait_spin_start(cxr__waitpol *p, int64_t now) { p->last = now; }
void cxr__wait_tick(cxr__waitpol *p, int64_t now);
/* Called when the spin window ran out (it ends the spin): true (and block from now on, for
 * a while) if the thread's recent spinning was off the CPU a quarter of the time or more. */
bool cxr__wait_contended(cxr__waitpol *p, int64_t now);
/* CLOCK_MONOTONIC_COARSE: a few ns instead of ~25, at most one tick (1-4 ms) behind
 * cxr_now_ns(). "coarse > deadline" therefore still means the deadline passed. */
int64_t cxr__coarse_ns(void);
/* now + rel for rel >= 0, INT64_MAX where that overflows: timeouts up to INT64_MAX mean "no
 * practical limit", never a time in the past (and signed overflow is undefined: a check
 * after the addition can be compiled away). */
static inline int64_t cxr__after(int64_t now, int64_t rel) {
  return rel > INT64_MAX - now ? INT64_MAX : now + rel;
}
/* How long (ns) a waiter sleeps when the ring it waits on refused its sleep for being busy
 * (its tail ahead of its head, with no slot published there yet: a producer between its
 * tail CAS and its publish, or one stopped or hostile there). The first refusal sleeps not
 * at all; a refusal whose mark (the busy rings' tails) equals the last one's, nothing having
 * moved between, sleeps 20 us, doubling up to 10 ms. Only such a ring is stuck: a moved tail
 * may be a producer that saw no sleeper counted yet, publishing now without ringing (so
 * the old code never slept on a busy ring). The caller zeroes n when it made progress or
 * slept unrefused. Before 2026-11-28 every refusal meant spinning on, at full CPU for as
 * long as the ring stayed so. */
typedef struct cxr__busy {
  unsigned n;     /* refusals in a row with the same mark */
  uint64_t mark;
} cxr__busy;
int64_t cxr__busy_sleep_ns(cxr__busy *b, uint64_t mark);
/* Tunables read once from the environment (CXRPC_SPIN_NS, CXRPC_YIELD_NS). */
int64_t cxr__spin_ns(void);
int64_t cxr__yield_ns(void);

/* ---- the channel's control block ---- */

enum {
  CXR__SLOT_FREE = 0,      /* no heap yet (or retired): the server will create one */
  CXR__SLOT_READY = 1,     /* a fresh heap with empty rings waits for a client */
  CXR__SLOT_CLAIMED = 2,   /* a client owns it */
  CXR__SLOT_CLOSING = 3,   /* the client closed it; the server recycles it */
  CXR__SLOT_RECLAIM = 4,   /* the client died; the server drains and retires it */
  CXR__SLOT_BUSY = 5,      /* the server is working on it */
};

/* owner word: pid:32 | state:8 | generation:24 (one CAS claims a slot) */
static inline uint64_t cxr__owner(uint32_t pid, unsigned state, uint32_t gen) {
  return (uint64_t)pid << 32 | (uint64_t)(state & 0xff) << 24 | (gen & 0xffffff);
}
static inline uint32_t cxr__owner_pid(uint64_t o) { return (uint32_t)(o >> 32); }
static inline unsigned cxr__owner_state(uint64_t o) { return (unsigned)(o >> 24) & 0xff; }
static inline uint32_t cxr__owner_gen(uint64_t o) { return (uint32_t)o & 0xffffff; }

/* Counters written by the server side of a connection. */
typedef struct cxr__srv_ctr {
  uint64_t calls, errors, bytes_in, bytes_out, malformed, expired;
  uint64_t cancelled;        /* requests the client cancelled before they ran: not run */
  uint64_t dropped;          /* replies dropped: a remote client that does not read them
                                (rpc/remote_server.c, REPLIES_OUT_MAX) */
} __attribute__((aligned(64))) cxr__srv_ctr;

/* Counters written by the client side of a connection. */
typedef struct cxr__cli_ctr {
  uint64_t calls, errors, timeouts, cancels, peer_dead, late, stray;
} __attribute__((aligned(64))) cxr__cli_ctr;

typedef struct cxr__cslot {
  uint64_t owner;            /* cxr__owner() */
  uint64_t client_start;     /* the client's start time (0 until written) */
  uint32_t client_uid;
  uint32_t seal_fd;          /* the server's fd of this slot's seal table + 1; 0: none
                                (rpc/seal_glue.c) */
  int64_t since_ns;          /* CLOCK_MONOTONIC when claimed */
  uint64_t conn_block;       /* address of the cxr__conn_block (same in every process) */
  char heap[CXR_NAME_MAX + 1];
  cxr__srv_ctr srv;
  char pad_[64];             /* both sides write their counters on every call: 128 bytes
                                apart, never in one adjacent pair of lines */
  cxr__cli_ctr cli;
} __attribute__((aligned(64))) cxr__cslot;

enum { CXR__CHAN_OPEN = 1, CXR__CHAN_CLOSED = 2 };

/* A block's address read from shared memory (a heap's root, a slot's word): true if it lies
 * in h and is aligned for its type, checked before any field of it is read (a hostile or
 * damaged heap's root may point at any byte of its data). */
static inline bool cxr__block_ok(const cxr_heap *h, const void *p, size_t size, size_t align) {
  return p != NULL && (uintptr_t)p % align == 0 && cxr_heap_contains(h, p, size);
}

typedef struct cxr__chan_block {
  uint64_t magic;
  uint32_t version;
  uint32_t max_conns;
  uint32_t ring_slots;
  uint32_t pool;
  uint32_t mode;
  int32_t server_pid;
  uint64_t server_start;
  uint64_t server_host;
  int64_t peer_timeout_ns;
  uint64_t conn_heap_size;
  uint32_t state;            /* CXR__CHAN_* */
  uint32_t workers;
  int64_t opened_ns;
  char name[CXR__CHAN_NAME_MAX + 1];
  /* The server workers sleep here; clients ring it after a push. */
  uint32_t doorbell __attribute__((aligned(64)));
  uint32_t srv_sleepers;
  /* The manager sleeps here; clients ring it after connect and close. */
  uint32_t mgr_bell __attribute__((aligned(64)));
  uint32_t mgr_sleepers;
  /* Clients waiting for a ready slot sleep here; the manager rings it after a refill. */
  uint32_t pool_bell __attribute__((aligned(64)));
  uint32_t pool_sleepers;
  uint64_t connects, disconnects, reclaimed, recycled, created;
  uint64_t active[CXR__MAX_CONNS / 64] __attribute__((aligned(64)));
  cxr__cslot slots[];        /* max_conns of them */
} cxr__chan_block;

typedef struct cxr__conn_block {
  uint64_t magic;
  uint32_t version;
  uint32_t ring_slots;
  uint32_t slot;             /* index in the channel's slot table */
  uint32_t gen;              /* slot generation it was made for */
  uint64_t slots;            /* address of the slots (both rings') */
  cxr__ring req, resp;
  /* the slots follow, after a colour (cxr__conn_slots), then the cancel words */
} cxr__conn_block;

static inline size_t cxr__chan_block_size(unsigned max_conns) {
  return sizeof(cxr__chan_block) + (size_t)max_conns * sizeof(cxr__cslot);
}
/* Where a connection's slots start: after the block, shifted by a "colour" of 128 bytes
 * times its slot index (mod 64). Every connection heap has the same layout and heaps start
 * at addresses with equal low bits, so without it the slot a worker watches on each idle
 * connection sat at one page offset in all of them: one L1 and L2 set, 8 ways, and with 32
 * idle connections every poll pass missed to L3 (the busy connection's round trip went
 * from ~1.5x to ~2.3x the floor, bench/rpc_bench). 64 colours spread 512 connections over
 * L2 without a conflict. Both sides compute it from the slot index. */
#define CXR__CONN_COLORS 64u
static inline size_t cxr__conn_color(unsigned slot_index) {
  return (size_t)(slot_index % CXR__CONN_COLORS) * 128;
}
static inline size_t cxr__conn_block_size(unsigned ring_slots) {
  return sizeof(cxr__conn_block) + (size_t)(CXR__CONN_COLORS - 1) * 128 +
         (size_t)ring_slots * sizeof(cxr__slot) + (size_t)ring_slots * sizeof(uint64_t);
}
static inline cxr__slot *cxr__conn_slots(cxr__conn_block *b, unsigned slot_index) {
  return (cxr__slot *)((char *)(b + 1) + cxr__conn_color(slot_index));
}
/* The cancel words follow the slots. Word i holds the call id of the last
 * call with pending-table index i that the client cancelled or gave up on: the server does
 * not run such a request, and a running handler can ask (cxr_call_cancelled). Written by
 * the client only when it gives up on a call, so the call path only reads a line that stays
 * in the server's cache. */
static inline uint64_t *cxr__conn_cancels(cxr__conn_block *b, unsigned ring_slots,
                                          unsigned slot_index) {
  return (uint64_t *)(cxr__conn_slots(b, slot_index) + ring_slots);
}
/* A side's private views of a connection block's two rings (over its slots), computed from
 * its own copy of the geometry and the slot index. */
static inline void cxr__conn_views(cxr__conn_block *b, unsigned ring_slots, unsigned slot_index,
                                   cxr__rview *req, cxr__rview *resp) {
  cxr__slot *s = cxr__conn_slots(b, slot_index);
  *req = (cxr__rview){.r = &b->req, .s = s, .mask = ring_slots - 1, .answers = false};
  *resp = (cxr__rview){.r = &b->resp, .s = s, .mask = ring_slots - 1, .answers = true};
}

/* ---- seams for other layers ---- */

/* Transport choice for cxr_connect (conn.c): in-pod shared memory, or "ucx://" (rdma). */
enum { CXR__TRANSPORT_POD = 1, CXR__TRANSPORT_UCX = 2 };
int cxr__transport_for(const char *target);

/* Client side, for CXR_CALL_SEAL: seal [args, args+len) and give the seal index
 * (sandbox layer). Returns CXR_ENOSYS until sealing is available. */
int cxr__call_seal(cxr_conn *c, const void *args, size_t len, uint32_t *seal);
void cxr__call_release(cxr_conn *c, uint32_t seal);

/* ---- pieces shared by channel.c, serve.c, dispatch.c ---- */

struct cxr_call {
  cxr_channel *ch;
  struct cxr__sconn *sc;
  uint64_t call_id;
  uint32_t method;
  uint32_t flags;
  uint32_t seal;
  int64_t deadline;
  const void *args;
  size_t arg_len;
  const uint64_t *cancel;     /* this call's cancel word (pod calls), or NULL */
  struct cxr__rcall *remote;  /* set for calls from another rack (rpc/remote.c) */
};

/* Runs the handler for a validated call (the one place a sandbox wrapper goes). */
int cxr__dispatch(cxr_call *call, cxr_handler fn, void *user, void **result);

/* True when this process holds, as a client, the connection whose block is at blk in
 * tenancy gen (conn.c; a server in the same process asks, cxr_call_peer). */
bool cxr__conn_held_here(const void *blk, uint32_t gen);
/* True (once) when this process closed that connection lately as a client (conn.c). */
bool cxr__conn_closed_here(const void *blk, uint32_t gen);

/* ---- internal test hooks: raw ring access on a client connection ---- */
int cxr__conn_push_raw(cxr_conn *c, const cxr__desc *d);
int cxr__conn_pop_raw(cxr_conn *c, cxr__desc *out, int64_t timeout_ns);
/* Pushes d as a call (counted in cli.calls); when this thread is the connection's sole user
 * (rpc/sole.h), it stays stall_ns inside its ring operation, between reading and writing
 * the calls counter: for tests of the turn to shared. */
int cxr__conn_push_stalled(cxr_conn *c, const cxr__desc *d, int64_t stall_ns);
/* One try, with the ring operation a call's wait would use (no clock read): 0 or CXR_EAGAIN. */
int cxr__conn_pop_once(cxr_conn *c, cxr__desc *out);
/* Whether a second thread has used the connection's rings (rpc/sole.h): then every thread
 * takes the multi-thread ring operations. */
bool cxr__conn_shared(cxr_conn *c);
uint32_t cxr__conn_table_size(cxr_conn *c);
/* Entries on the table's shared free list (not counting those threads keep as spares). */
uint32_t cxr__conn_table_free(cxr_conn *c);
/* From now on this thread pauses ns after each call outcome it makes final (an answer it
 * delivers, an expiry), before it fires the callback or writes the cancel word: for tests
 * of what the owner may do meanwhile. 0 ends it. */
void cxr__test_pause_after_outcome(int64_t ns);
/* The connection's rings as mapped here (tests corrupt them on purpose). */
int cxr__conn_rings(cxr_conn *c, cxr__rview *req, cxr__rview *resp);
/* Marks the connection dead with err and fails nothing: the state another thread's
 * liveness check leaves for a call that went out just after that check failed the pending
 * ones. */
void cxr__conn_mark_dead(cxr_conn *c, int err);

#ifdef __cplusplus
}
#endif
#endif
