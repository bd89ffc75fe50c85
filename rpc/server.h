/* Private to rpc/: the server's process-local view of a channel (channel.c, serve.c). */
#ifndef CXRPC_RPC_SERVER_H
#define CXRPC_RPC_SERVER_H

#include <pthread.h>

#include "rpc/internal.h"
#include "shm/proc.h"
#include "shm/reg_deadline.h"

#define CXR__METHOD_SLOTS 512u  /* open-addressing table; at most half used */

/* One connection slot as the server sees it: its own mapping and ring views. */
typedef struct cxr__sconn {
  /* What a worker reads of every connection on every pass, together at the start: an
   * idle connection then costs a pass one line of ours and its watched slot. */
  int live;                  /* atomic: workers may poll it */
  int retiring;              /* atomic: the manager is taking it back */
  /* One worker only (it alone pops the request ring): the slot at its head and the seq that
   * says it holds a request. The manager sets them with the rings (live 0), the worker after
   * each batch it pops. */
  const uint32_t *next_seq;
  uint32_t next_want;
  cxr_heap *heap;            /* NULL while the slot has no heap */
  cxr__conn_block *blk;
  cxr__rview req, resp;
  uint64_t *cancel;          /* the client's cancel words (cxr__conn_cancels) */
  cxr__cslot *slot;          /* in the control block */
  unsigned index;
  uint32_t gen;              /* generation of the current tenancy */
  int resp_stalled;          /* atomic: its answer ring was found full this tenancy */
  uint64_t *snap;            /* workers' passes when its retirement began (manager only) */
  unsigned nsnap;
  int64_t snap_at;           /* when snap was taken (manager only) */
  cxr__proc_id client;       /* owner, read once after it claimed the slot */
  /* The client's identity as the kernel confirmed it (cxr_call_peer), for tenancy peer_gen
   * (atomic, written last): its pid maps this heap, peer_uid is its real uid. */
  uint32_t peer_gen;
  int peer_pid;
  unsigned peer_uid;
  size_t baseline_used;      /* heap bytes used by a fresh connection */
  bool pending, pending_dead; /* manager: a recycle waits for workers to leave */
  /* Manager only, what no client can write: the slot was published READY and not taken
   * back since (its heap may be a tenant's); the tenant is a connection of this process
   * (cxr__conn_held_here, seen while it was claimed); liveness ticks it claimed the slot
   * without writing its start time. */
  bool readied, ours;
  unsigned unstarted;
  bool damaged;              /* manager: its heap's file was shrunk under us (bus_guard.h) */
} cxr__sconn;

/* The request-ring slot a single worker watches next (after the rings were set up or the
 * worker popped): head from the ring, index masked with the private geometry. */
static inline void cxr__sconn_watch(cxr__sconn *sc) {
  uint64_t head = CXR__LDX(&sc->req.r->head);
  sc->next_seq = &sc->req.s[head & sc->req.mask].seq;
  sc->next_want = (uint32_t)(head + 1);
}

/* A worker's pass counter: bumped (release) at the start of every poll pass. A pass that
 * starts after the manager cleared `live` (and ran a process-wide barrier) never touches
 * that connection, so once every worker moved past the pass it was in, the connection can
 * be reused or unmapped. No locked instruction on the call path. */
typedef struct cxr__wpass {
  uint64_t v;
} __attribute__((aligned(64))) cxr__wpass;
#define CXR__MAX_WORKERS 64u

typedef struct cxr__method {
  uint32_t id;
  bool used;
  cxr_handler fn;
  void *user;
} cxr__method;

struct cxr_channel {
  cxr_channel_opts o;
  /* cxr__fork_epoch when opened: in a child made by fork(2), which has none of its threads,
   * it refuses start/serve/on (CXR_ECLOSED) and stop/close leave it alone. */
  unsigned fork_epoch;
  char name[CXR__CHAN_NAME_MAX + 1];
  cxr_heap *ctl;
  cxr__chan_block *cb;
  cxr__sconn *conns;
  cxr__method methods[CXR__METHOD_SLOTS];
  unsigned nmethods;
  cxr__proc_id self;
  uint32_t heap_seq;         /* makes heap names unique */
  int stop;                  /* atomic */
  int running;               /* atomic: serve/start in progress */
  int stoppers;              /* atomic: cxr_channel_stop calls under way (close_rest waits) */
  bool background;           /* threads came from cxr_channel_start */
  bool finish_on_return;     /* (lock) cxr_channel_close gave up waiting for a serve() on
                                another thread: that serve() finishes the close */
  pthread_t *threads;        /* workers (and the manager last) */
  unsigned nthreads;
  pthread_mutex_t lock;      /* serialises start/stop/close */
  unsigned wnext;            /* atomic: worker ids handed out since start */
  unsigned members;          /* atomic: bumped whenever a connection's live or retiring
                                changes (a single worker rebuilds its watch list) */
  cxr__wpass wpass[CXR__MAX_WORKERS];
  /* Atomic words, set by the manager for slots it saw claimed and cleared when it takes one
   * back: workers serve these whatever the shared active map says (any client can clear
   * another's bit there, which left that client unserved for good). */
  uint64_t claimed[CXR__MAX_CONNS / 64];
  struct cxr__rlisten *remote; /* listener for other racks (rpc/remote.c), or NULL */
  struct cxr__seal_chan *seal; /* seal tables of the slots (rpc/seal_glue.c), or NULL */
  uint64_t forged_seen;        /* (manager) forged slot states taken back since open */
  uint64_t repairs_seen;       /* (manager) cxr__bus_repairs() when it last looked */
  uint64_t shrunk_seen;        /* (manager) connection heaps found shrunk since open */
  uint64_t overfilled_seen;     /* atomic: tenancies whose answer ring was found full */
  uint64_t shrunk_unread;      /* (manager) failed looks for shrunk heaps in a row */
  bool ctl_damaged;            /* (manager) the control heap's file was shrunk */
  cxr__lock_budget lock_budget; /* the connection heaps' lock waits (shm/reg_deadline.h) */
};

/* serve.c */
/* How long the server waits for a connection heap's lock (its client can write the word: one
 * that leaves it "held" would otherwise stop a worker, and so every connection it serves,
 * for the lock's 2 s bound, once per heap). A client thread preempted while it holds the
 * lock rarely keeps it this long; a handler's allocation then fails instead. */
#define CXR__SERVER_HEAP_LOCK_CAP_NS 50000000
/* How long those waits may last together each second, per channel, when they end without
 * the lock (cxr__lock_budget): a client reconnecting to jam each fresh heap cost a worker
 * the cap once per connect. Past it, a connection heap's lock is tried a few times only. */
#define CXR__SERVER_HEAP_LOCK_BUDGET_NS 100000000

void *cxr__worker_main(void *arg);
/* channel.c */
void *cxr__manager_main(void *arg);
const cxr__method *cxr__method_find(const cxr_channel *ch, uint32_t id);
void cxr__sconn_free_result(cxr__sconn *sc, uint64_t ptr);

#endif
