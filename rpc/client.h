/* Private to rpc/: the client's process-local view of a connection (conn.c, call.c). */
#ifndef CXRPC_RPC_CLIENT_H
#define CXRPC_RPC_CLIENT_H

#include <pthread.h>

#include "rpc/internal.h"
#include "shm/proc.h"

/* States of a pending-table entry (the future). */
enum {
  CXR__F_FREE = 0,
  CXR__F_PENDING = 1,    /* sent, no outcome yet */
  CXR__F_BUSY = 2,       /* one thread is writing the outcome */
  CXR__F_DONE = 3,       /* outcome final and no response is due any more */
  CXR__F_ORPHAN = 4,     /* outcome final (timeout, cancel, dead peer), response still due */
  CXR__F_ABANDONED = 5,  /* the user freed it while its response is still due */
  CXR__F_REPLIED = 6,    /* the server's answer is in rerr/rresult; no response is due */
};
enum { CXR__CB_NONE = 0, CXR__CB_ARMED = 1, CXR__CB_FIRED = 2 };

struct cxr_future {
  uint32_t state;        /* atomic CXR__F_* */
  uint32_t gen;          /* atomic: high half of the call id */
  uint32_t index;
  uint64_t cb_state;     /* atomic: the generation << 32 | CXR__CB_* (cxr__cb_fire says why) */
  int err;
  bool taken;            /* the result was handed to the user */
  int rerr;              /* the answer (state REPLIED), written only by the deliverer */
  void *rresult;
  void *result;
  int64_t deadline;
  uint32_t seal;
  cxr_conn *c;
  void (*cb)(int err, void *result, void *user);
  void *cb_user;
  struct cxr_future *qnext;
};

/* A process keeps one mapping of a channel's control heap however many connections it has
 * to that channel (conn.c). */
#define CXR__SPARE_MAX 8
typedef struct cxr__ctl_ref {
  struct cxr__ctl_ref *next;
  char name[CXR_NAME_MAX + 1];
  cxr_heap *heap;
  cxr__chan_block *cb;
  /* The block's geometry as checked when it was mapped. Any user of the channel can write
   * the block, so loops and sizes use these copies, never the shared fields again. */
  uint32_t max_conns, ring_slots;
  unsigned refs;
  int64_t checked_ns;               /* when the server was last seen alive */
  cxr_heap *spare[CXR__SPARE_MAX];  /* connection heaps kept mapped for reconnects */
  unsigned nspare;
} cxr__ctl_ref;

struct cxr_conn {
  int transport;
  /* cxr__fork_epoch when made. A child made by fork(2) shares the parent's rings, call ids
   * and slot but none of its threads: there the connection refuses calls (CXR_ECLOSED) and
   * a close only forgets the child's copy. */
  unsigned fork_epoch;
  cxr__ctl_ref *ctl;
  cxr__chan_block *cb;
  cxr_heap *heap;
  cxr__conn_block *blk;
  cxr__rview req, resp;
  uint64_t *cancel;          /* cancel words the server reads (cxr__conn_cancels) */
  cxr__cslot *slot;
  unsigned index;
  uint32_t gen;
  uint32_t pid;
  cxr__proc_id server;
  int64_t default_deadline, peer_timeout;
  /* pending table: ntab == ring_slots, so responses always fit the response ring */
  struct cxr_future *tab;
  uint32_t ntab;
  uint64_t uid;          /* unique in this process (never reused) */
  struct cxr_conn *open_next; /* the process's open connections (rpc/call.c) */
  uint32_t *free_idx;
  uint32_t nfree;
  pthread_mutex_t lock;
  /* The thread that has been the only one to use the rings (rpc/sole.h): 0 before the first
   * call, CXR__SOLE_SHARED once another thread did. */
  uintptr_t sole;        /* atomic */
  uint32_t sole_busy;    /* atomic: the sole user is inside a ring operation */
  int dead;              /* atomic: 0, or the code every call now ends with */
  int64_t next_check;    /* atomic: when liveness is checked next */
  unsigned sleeping;     /* atomic: our threads asleep on the response futex */
  /* completion thread for cxr_future_then */
  pthread_mutex_t qlock;
  pthread_t cthread;
  bool cstarted;
  int cstop;             /* atomic */
  unsigned armed;        /* atomic: callbacks waiting for a pending call */
  struct cxr_future *qhead, *qtail;
  struct cxr__rconn *remote;  /* set for "ucx://" connections (rpc/remote.c) */
  struct cxr__seal_cli *seal; /* sealed calls (rpc/seal_glue.c), or NULL */
};

/* The callback state word of the call of generation gen in state st (CXR__CB_*). */
static inline uint64_t cxr__cb_word(uint64_t gen, unsigned st) { return gen << 32 | st; }

/* Readies a free table entry for a new call: the next generation (never 0: a call id with
 * generation 0 is malformed), no outcome, no callback. The caller then sets the deadline and
 * publishes CXR__F_PENDING. */
static inline void cxr__future_reset(struct cxr_future *f) {
  uint32_t gen = __atomic_load_n(&f->gen, __ATOMIC_RELAXED) + 1;
  if (gen == 0) gen = 1;
  __atomic_store_n(&f->gen, gen, __ATOMIC_RELAXED);
  f->err = 0;
  f->result = NULL;
  f->taken = false;
  f->seal = 0;
  f->cb = NULL;
  f->cb_user = NULL;
  f->qnext = NULL;
  __atomic_store_n(&f->cb_state, cxr__cb_word(gen, CXR__CB_NONE), __ATOMIC_RELAXED);
}

/* The callback state of f's current call. */
static inline unsigned cxr__cb_state(const struct cxr_future *f) {
  return (uint32_t)__atomic_load_n(&f->cb_state, __ATOMIC_SEQ_CST);
}

/* Sets the callback state of f's current call (by the future's user). */
static inline void cxr__cb_set(struct cxr_future *f, unsigned st) {
  uint64_t gen = __atomic_load_n(&f->gen, __ATOMIC_RELAXED);
  __atomic_store_n(&f->cb_state, cxr__cb_word(gen, st), __ATOMIC_SEQ_CST);
}

/* Takes back f's armed callback (a future freed before its callback ran: cxr_future_then(3)
 * says that may drop it): true if this did, not a fire racing with it. */
static inline bool cxr__cb_disarm(struct cxr_future *f) {
  uint64_t gen = __atomic_load_n(&f->gen, __ATOMIC_RELAXED);
  uint64_t armed = cxr__cb_word(gen, CXR__CB_ARMED);
  return __atomic_compare_exchange_n(&f->cb_state, &armed, cxr__cb_word(gen, CXR__CB_NONE),
                                     false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* Moves an armed callback of the call of generation gen to FIRED: true for the one thread
 * that does, which then hands it to be run. The generation is part of the word because a
 * thread that published an outcome may fire it late: the owner may have seen the outcome,
 * freed the future and made a new call on the same entry meanwhile, and armed its callback,
 * which a check of the state alone would then run before its call has an outcome (found by
 * a review, 2026-11-28). */
static inline bool cxr__cb_fire(struct cxr_future *f, uint32_t gen) {
  uint64_t armed = cxr__cb_word(gen, CXR__CB_ARMED);
  /* A plain (seq_cst) load first: no locked instruction when no callback is armed. */
  if (__atomic_load_n(&f->cb_state, __ATOMIC_SEQ_CST) != armed) return false;
  return __atomic_compare_exchange_n(&f->cb_state, &armed, cxr__cb_word(gen, CXR__CB_FIRED),
                                     false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* The id a call travels under: its entry's generation << 32 | its index in the table. */
static inline uint64_t cxr__future_call_id(const struct cxr_future *f) {
  return (uint64_t)__atomic_load_n(&f->gen, __ATOMIC_RELAXED) << 32 | f->index;
}

/* Ends a pending call locally (timeout, cancel, dead peer) while its response may still
 * come: PENDING -> BUSY -> ORPHAN, so a deliverer racing with us either wins first or sees
 * ORPHAN and drops the late answer. False if the call already had an outcome; on true the
 * caller fires the future's callback (each transport has its own way) for the call whose id
 * *id gets: read while the entry is BUSY, since once ORPHAN is out the owner may free the
 * future and the entry carry a new call. */
static inline bool cxr__future_orphan(struct cxr_future *f, int err, uint64_t *id) {
  uint32_t s = CXR__F_PENDING;
  if (!__atomic_compare_exchange_n(&f->state, &s, CXR__F_BUSY, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return false;
  *id = cxr__future_call_id(f);
  f->err = err;
  f->result = NULL;
  __atomic_store_n(&f->state, CXR__F_ORPHAN, __ATOMIC_SEQ_CST);
  return true;
}

/* call.c */
uint64_t cxr__conn_uid(void);
int cxr__conn_table_init(cxr_conn *c, uint32_t n);
void cxr__conn_table_fini(cxr_conn *c);
void cxr__conn_fail_all(cxr_conn *c, int err);
void cxr__conn_stop_completion(cxr_conn *c);
/* conn.c: 0, or the code calls must end with (peer dead, channel closed). Cheap unless a
 * check is due (every peer_timeout/2). */
int cxr__conn_check(cxr_conn *c, bool force);

#endif
