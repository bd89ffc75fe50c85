/* Private: the structures shared by the rdma/ files (not installed). */
#ifndef CXRPC_RDMA_INTERNAL_H
#define CXRPC_RDMA_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <stdatomic.h>
#include <ucp/api/ucp.h>

#include <cxrpc/rdma.h>
#include "rdma/places.h"
#include "shm/log.h"

/* Internal message ids (users get CXR_RDMA_AM_USER_MIN and above). */
enum { AM_HELLO = 1, AM_HELLO_REPLY = 2 };
enum { HOSTKEY_MAX = 80, EXPORT_NAME_MAX = 31, HDR_MAX = 1024, POOL_MAX = 8 };
enum { CXR_RDMA_AM_INLINE = 1 };  /* internal flag: handler runs inside the UCX callback */

struct cxr_rdma_msg {
  cxr_rdma *r;
  unsigned id;
  ucp_ep_h reply_ep;  /* NULL when the sender asked for no reply */
  void *hdr;
  size_t hlen;
  void *data;
  size_t dlen;
  bool kept;
  bool *kept_out;     /* while its handler runs: where cxr_rdma_msg_keep reports (the
                         message may belong to another thread as soon as it is kept) */
  bool owned;         /* hdr/data are our malloc'd copies */
  size_t charge;      /* bytes counted in r->queued until a handler gets it (0: none) */
  cxr_rdma_ep *ref;   /* the endpoint of ours it came on, accepted or opened by us, held (its
                         memory stays until the message goes: a reply sees its close), or
                         NULL (a client that connected from our worker address) */
  struct cxr_rdma_msg *next;
};

typedef struct am_slot {
  cxr_rdma *r;
  unsigned id;
  cxr_rdma_am_fn fn;
  void *user;
  int flags;
} am_slot;

typedef struct rdma_export {
  char name[EXPORT_NAME_MAX + 1];
  uint64_t base, len;
  void *rkey;
  size_t rlen;
} rdma_export;

/* What the directory knows about one host: its worker address and exports, and a pool of
 * ready endpoints. Entries live until the object closes; `valid` drops when the host dies. */
typedef struct rdma_host {
  struct rdma_host *next;
  char key[HOSTKEY_MAX];
  void *waddr;
  size_t waddr_len;
  rdma_export *exps;
  unsigned nexps;
  struct sockaddr_in sa;  /* where its listener answered */
  bool has_sa;
  cxr_rdma_ep *pool[POOL_MAX];
  unsigned npool;
  bool valid;
  bool refilling;
} rdma_host;

struct cxr_rdma_rkey {
  struct cxr_rdma_rkey *next;
  cxr_rdma_ep *ep;
  ucp_rkey_h rk;
  char name[EXPORT_NAME_MAX + 1];
  uint64_t base, len;
};

struct cxr_rdma_ep {
  cxr_rdma *r;
  /* The UCX handle, shared by every thread using the endpoint. A missed deadline in one of
   * them closes it while others post on it, so it is read only through cxr__ep_use (ulock
   * held for reading while a request is posted, never while waiting) and taken out under
   * ulock for writing before it is closed (ep.c, "the UCX handle's lifetime"). */
  ucp_ep_h uep;
  ucp_ep_h handle;      /* the same handle as made, never cleared: ep_on finds the endpoint by
                           it while a missed deadline's close of it is under way (uclose 1) */
  pthread_rwlock_t ulock;
  atomic_int uclose;    /* 0 open, 1 its handle is being closed, 2 closed */
  atomic_int open_ops;  /* one-sided ops posted on the handle that UCX has not finished (mem.c) */
  atomic_int open_sends; /* messages posted on the handle that UCX has not finished (worker.c,
                            am_send; replies too, on an accepted endpoint): UCX may read their
                            data, the caller's, until then */
  atomic_int open_recvs; /* rendezvous receives of messages that came on its handle (ep.c,
                            cxr__recv_count) that UCX has not ended: its close ends them */
  atomic_int reqs;      /* the three above together (cxr__req_begin/end), and the calls that
                           may end it holding it (cxr__ep_enter/leave), plus EP_REQS_ORPHAN once
                           its close returned before they ended: the last to end frees it */
  char host[HOSTKEY_MAX];
  _Atomic int status;
  bool server_side;     /* accepted by our listener */
  bool pooled;          /* sitting in a host's pool, not handed out */
  bool closing;
  int refs;             /* messages still holding it (under r->lock) */
  bool zombie;          /* accepted, failed while held: closed when the last message goes */
  bool closed;          /* its close has begun (ep_destroy): no reply on it, no rendezvous
                           receive; written under r->lock, read atomically */
  bool kept;            /* closed while held: freed by the last message (under r->lock) */
  void (*on_err)(cxr_rdma_ep *, int, void *);
  void *on_err_user;
  cxr_rdma_rkey *rkeys; /* protected by r->lock */
  cxr_rdma_ep *next;    /* r->eps, or r->parked */
  ucp_ep_h closing_uep; /* its handle while on r->closing_eps (under r->lock) */
  cxr_rdma_ep *closing_next;  /* r->closing_eps */
  cxr_rdma_ep *orphan_next;   /* r->orphans (under r->lock) */
  bool orphaned;              /* on r->orphans */
  uint64_t id;          /* unique in its engine (r->next_ep_id): an address may be reused */
};

struct cxr_rdma_mr {
  cxr_rdma *r;
  void *p;
  size_t len;
  ucp_mem_h memh;
  void *rkey_buf;
  size_t rkey_len;
  char name[EXPORT_NAME_MAX + 1];
  bool exported;
  bool cached;          /* in the registration cache (evictable when refs == 0) */
  void *pin_base;
  size_t pin_len;       /* bytes we pinned (0: not pinned) */
  int refs;
  uint64_t last_use;
  cxr_rdma_mr *next;
};

typedef struct rdma_defer {
  struct rdma_defer *next;
  void (*fn)(void *);
  void *user;
} rdma_defer;

/* Bumped in every child made by fork(2), by a hook the first cxr_rdma_open installs. UCX is
 * not fork-safe: in a child, an engine opened under an older epoch is the parent's copy,
 * whose sockets are the parent's and whose threads are not there. Each public call refuses
 * such a copy (CXR_ECLOSED; the calls that return nothing do nothing), before it takes a
 * lock the parent may have held or touches UCX: a child's put on it once reset the parent's
 * connection and aborted the parent (tests/rdma/rdma_test). cxr_rdma_open refuses too once
 * the epoch moved: a new engine in such a child does not work. */
extern _Atomic unsigned cxr__rdma_fork_epoch;

struct cxr_rdma {
  unsigned epoch;         /* cxr__rdma_fork_epoch when opened (a fork child's copy is older) */
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_listener_h listener;
  int port;
  int efd;
  pthread_t thread;
  bool thread_started;
  atomic_bool stop;
  atomic_int waiters;
  /* Small gets/puts that UCX ended with an error (cancelled by a close, endpoint failed):
   * their op-owned buffers are kept until the worker is destroyed, since UCX 1.13 was seen
   * writing a get's late reply after a force close (mem.c). Under lock. */
  struct rdma_op *graves;
  /* Endpoints closed with one-sided ops still pending at a silent target: not closed in UCX
   * until the ops finish (ep.c, ep_park). Under lock. */
  cxr_rdma_ep *parked;
  /* Endpoints whose close has begun and whose UCX handle is not closed yet (parked ones
   * too): a message that arrives on that handle meanwhile still finds its endpoint (ep.c,
   * ep_on), and a rendezvous one is refused. Under lock. */
  cxr_rdma_ep *closing_eps;
  /* Closed endpoints whose requests outlived the close: the last to end frees one (the
   * engine's close waits for them, cxr__eps_orphans_left). Under lock. */
  cxr_rdma_ep *orphans;
  struct cxr_rdma *next_abandoned;  /* closed, UCX left undestroyed (worker.c) */
  atomic_int asleep;   /* the progress thread sleeps on the event fd: wake it to defer */
  /* Messages posted on a bare UCX handle, no endpoint of ours (replies and hello answers to
   * a client that connected from our worker address) that UCX has not finished: the close
   * waits for them, as an endpoint's close does for its open_sends (worker.c, am_send). */
  atomic_int bare_sends;
  /* Rendezvous receives UCX holds for messages with no endpoint of ours behind them (ep.c,
   * cxr__recv_count): the close waits for them as for bare_sends; destroying the worker
   * under one aborted (UCX 1.13: proto_reqs not empty; close_silent_test). */
  atomic_int bare_recvs;
  /* 1 while the engine is open, and 1 per message kept with cxr_rdma_msg_keep and not freed
   * yet: the last to let go frees this struct (worker.c, engine_put). A kept message freed
   * after cxr_rdma_close read the freed engine, and gave its endpoint's hold back under the
   * freed lock (close_reply_test, AKeptMessage...OutlivesTheClose, ASan). */
  atomic_int refs;
  /* cxr_rdma_close is past its last wait: no reply (the worker is gone) and no deferred work
   * (nothing runs it) any more, for the kept messages that still reach the engine. */
  atomic_bool closed;
  void (*tick)(void *);
  void *tick_user;
  int64_t spin_ns;
  unsigned pool_target;
  size_t msg_max;          /* the most data one received message may carry (set at open) */
  size_t queue_max;        /* the most bytes of messages received and not yet handled */

  pthread_mutex_t lock;    /* everything below */
  am_slot am[CXR_RDMA_AM_MAX + 1];
  rdma_defer *dq_head, *dq_tail;
  cxr_rdma_msg *mq_head, *mq_tail;
  rdma_host *hosts;
  cxr_rdma_ep *eps;
  cxr_rdma_mr *mrs;
  struct hello_wait *hellos;
  cxr__places hellos_out;  /* answers to hellos UCX still holds (HELLOS_*_MAX, ep.c) */
  uint64_t next_token;
  uint64_t next_ep_id;
  uint64_t use_clock;
  size_t queued;           /* bytes of admitted messages no handler got yet (worker.c) */
  uint64_t msgs_too_big, msgs_queue_full;  /* messages dropped before any allocation */
  uint64_t msgs_unhandled, msgs_no_memory;  /* ... for an id without handler; out of memory */
  uint64_t rndv_refused_closing;  /* rendezvous receives refused: their endpoint was closing
                                     (ep.c, cxr__recv_count; tests read it) */

  int pin_mode;
  size_t pin_budget, pinned, pinned_peak, registered;
  uint64_t evictions, bounced, cold, warm, pool_hits;
  pthread_mutex_t bounce_lock;
  void *bounce;
  size_t bounce_size;
};

/* In a child made by fork(2): r is the parent's copy (see cxr__rdma_fork_epoch). */
static inline bool cxr__rdma_copy(const cxr_rdma *r) {
  return r->epoch != atomic_load_explicit(&cxr__rdma_fork_epoch, memory_order_relaxed);
}

/* The directory's entry for a host ("ADDR:PORT", one entry per key), or NULL. Hold r->lock. */
static inline rdma_host *cxr__host_find(cxr_rdma *r, const char *key) {
  rdma_host *h = r->hosts;
  while (h && strcmp(h->key, key)) h = h->next;
  return h;
}

/* worker.c */
int cxr__rdma_status(ucs_status_t s);
/* Waits for a request; ctx protocol in worker.c. */
typedef struct rdma_op {
  atomic_int state;   /* 0 pending, 1 done, 2 abandoned by the waiter */
  ucs_status_t status;
  uint64_t value;     /* atomics: compare/swap operand in, old value out */
  void *hdr_copy;     /* the header, then a send's iov array (niov > 1); freed with the op */
  void *owned;        /* caller's buffer handed over with the send, freed with the op */
  void (*owned_free)(void *);  /* how (NULL: free); runs inside a UCX callback, so it must
                                  not call UCX */
  atomic_int *open;   /* counted down when UCX finishes the op (an endpoint's open_ops or
                         open_sends, or the engine's bare_sends) */
  cxr_rdma_ep *ep;    /* the endpoint `open` is on (NULL: the engine), for cxr__req_end */
  ucp_ep_h flush_uep; /* a message on a bare UCX handle: counted down only once a flush of
                         the handle posted at its completion ends (worker.c, bare_flush) */
  cxr_rdma *keep;     /* set: ended with an error, the op is parked on keep->graves, not freed */
  struct rdma_op *next;  /* on keep->graves */
} rdma_op;
rdma_op *cxr__op_new(void);
/* Frees a finished op (what it owns too), or parks it (see `keep`). */
void cxr__op_release(rdma_op *op);
/* Waits for an op UCX holds until `deadline`: 0 once it finished (the op is still the
 * caller's: read op->status, then cxr__op_release), or CXR_ETIMEDOUT: abandoned, its
 * callback releases it. */
int cxr__op_await(cxr_rdma *r, rdma_op *op, int64_t deadline);
/* Hands an op UCX may still hold to its callback (state 2), or releases it now if UCX
 * already finished it. */
void cxr__op_abandon(rdma_op *op);
void cxr__op_cb(void *request, ucs_status_t status, void *user_data);
/* Request parameters that complete `op` through cxr__op_cb. */
static inline ucp_request_param_t cxr__op_param(rdma_op *op) {
  return (ucp_request_param_t){.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = cxr__op_cb, .user_data = op};
}
/* 0, the op's error, or CXR_ETIMEDOUT (then the op belongs to its callback). */
int cxr__op_wait(cxr_rdma *r, ucs_status_ptr_t p, rdma_op *op, int64_t deadline_ns);
int64_t cxr__deadline(int64_t deadline_ns);
/* $CXRPC_REMOTE_HEAP_MB (1 to 65536, default 64) in bytes: rpc's remote client heap, which
 * also sizes the default msg_max; read here once for both (a bad value: a warning). */
size_t cxr__remote_heap_bytes(void);
void cxr__wake(cxr_rdma *r);
/* cxr_rdma_reply for any id 1-255: the engine's own replies (ids below 16) go through it.
 * `owned` (or NULL; may hold data iov points to) is freed once UCX no longer needs it, also
 * when the wait gives up at the deadline or the reply fails: by owned_free, or free() when
 * that is NULL. owned_free is how a caller learns that UCX has let go of the data (it may
 * run inside a UCX callback on any thread that progresses the worker: no UCX calls in it). */
int cxr__rdma_reply(cxr_rdma_msg *m, unsigned id, const void *hdr, size_t hlen,
                    const struct iovec *iov, size_t niov, void *owned,
                    void (*owned_free)(void *), int64_t deadline_ns);
/* Same without waiting (`owned` freed with owned_free, or free() when NULL): returns once
 * UCX has the reply, or an error found before it was sent; a later failure is not
 * reported. */
int cxr__rdma_reply_post(cxr_rdma_msg *m, unsigned id, const void *hdr, size_t hlen,
                         const struct iovec *iov, size_t niov, void *owned,
                         void (*owned_free)(void *));
/* Sends on an endpoint that other threads may end meanwhile: its status if it failed. */
int cxr__ep_am_send(cxr_rdma_ep *ep, unsigned id, unsigned flags, const void *hdr, size_t hlen,
                    const struct iovec *iov, size_t niov, int64_t deadline_ns, bool wait);
/* Same (waiting, on an endpoint others may end), and `owned` (malloc'd; may hold iov and the
 * data it points to) is freed once UCX no longer needs it, even when the wait gives up at
 * the deadline. */
int cxr__am_send_owned(cxr_rdma_ep *ep, unsigned id, const void *hdr, size_t hlen,
                       const struct iovec *iov, size_t niov, void *owned, int64_t deadline_ns);
/* cxr_rdma_defer without waking the worker (safe under the caller's own locks); the
 * progress thread finds it within its poll period (20 ms with a tick set). */
int cxr__rdma_defer_quiet(cxr_rdma *r, void (*fn)(void *), void *user);
/* fn(user) runs on the progress thread at least every 20 ms (deadline sweeps). */
void cxr__rdma_set_tick(cxr_rdma *r, void (*fn)(void *), void *user);
/* Progresses the worker on the calling thread (a waiter); returns events handled. */
unsigned cxr__rdma_progress(cxr_rdma *r);
/* Progresses the worker on the calling thread until done(arg) or `deadline`, napping 50 us
 * whenever it was idle (the progress thread steps aside meanwhile). */
void cxr__progress_until(cxr_rdma *r, bool (*done)(void *), void *arg, int64_t deadline);
void cxr__rdma_waiter(cxr_rdma *r, int delta);
int cxr__am_set(cxr_rdma *r, unsigned id, cxr_rdma_am_fn fn, void *user, int flags);
/* How many engines' closes so far left their UCX worker undestroyed (leave_to_ucx): a close
 * that should have destroyed it did not (tests/rdma/queued.c). */
unsigned cxr__rdma_left_to_ucx(void);

/* ep.c */
void cxr__ep_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status);
void cxr__hello_server(cxr_rdma_msg *m, void *user);
void cxr__hello_reply(cxr_rdma_msg *m, void *user);
void cxr__conn_cb(ucp_conn_request_h req, void *arg);
void cxr__eps_close_all(cxr_rdma *r);
/* Closes the parked endpoints whose ops finished, waiting for them up to wait_ns (0: only
 * those done already; every endpoint close does that); returns how many still have ops with
 * UCX (they stay parked, open). */
unsigned cxr__eps_unpark(cxr_rdma *r, int64_t wait_ns);
void cxr__ep_force_close(cxr_rdma_ep *ep);
/* The UCX handle to post one request on: 0 with ep->ulock held for reading (give it back
 * with cxr__ep_unuse as soon as UCX has the request, before waiting for it), or the
 * endpoint's status (CXR_ENOTCONN once its handle is closed) without the lock. */
int cxr__ep_use(cxr_rdma_ep *ep, ucp_ep_h *uep);
void cxr__ep_unuse(cxr_rdma_ep *ep);
/* Ends the endpoint after a missed deadline: its status becomes CXR_ENOTCONN and its UCX
 * handle is force-closed, which cancels every request on it; returns once the close is done
 * (by this thread or another one ending it at the same time), up to about a second. The
 * caller holds the endpoint (cxr__ep_enter). */
void cxr__ep_end(cxr_rdma_ep *ep);
/* A call that may end the endpoint (mem.c rma) holds it from before it posts until after
 * cxr__ep_end: a user's close may give up waiting for that end and return meanwhile, and then
 * neither the call's own cancelled request (its last) nor another thread's end may free the
 * endpoint under it; the last hold or request to go frees it (cxr__ep_leave: no UCX call). */
static inline void cxr__ep_enter(cxr_rdma_ep *ep) { atomic_fetch_add(&ep->reqs, 1); }
void cxr__ep_leave(cxr_rdma_ep *ep);
/* Progresses the worker until no closed endpoint has requests left (r->orphans) or until
 * deadline; returns how many still have. */
unsigned cxr__eps_orphans_left(cxr_rdma *r, int64_t deadline);
/* Tests only (NULL otherwise): run by cxr__ep_end once it has taken the handle `u` out of the
 * endpoint and before it closes it, the window in which a message may still arrive on it
 * (close_silent_test forces one there). */
extern void (*cxr__ep_end_window)(cxr_rdma_ep *ep, ucp_ep_h u);
/* The endpoint of ours, accepted or opened by us, behind a reply endpoint, with a reference
 * (NULL if none): given back by cxr__ep_drop. */
cxr_rdma_ep *cxr__ep_hold(cxr_rdma *r, ucp_ep_h uep);
/* Whether its close has begun (then no message is answered on it: CXR_ENOTCONN). */
bool cxr__ep_closed(cxr_rdma_ep *ep);
/* Counts a rendezvous receive of a message that came on endpoint `ep` of ours (the one the
 * message holds; open_recvs: its close ends the receive) or, NULL, on no endpoint of ours
 * (bare_recvs, the engine's); returns the counter, to count down once UCX ended the receive,
 * or NULL if the endpoint's close has begun: the receive is refused then. */
atomic_int *cxr__recv_count(cxr_rdma *r, cxr_rdma_ep *ep);
/* Gives back a reference of cxr__ep_hold: the last one frees an endpoint closed meanwhile. */
void cxr__ep_drop(cxr_rdma_ep *ep);
/* A request UCX now holds, counted on `open`: one of endpoint ep's counters (open_ops,
 * open_sends, open_recvs) and its total, or with ep NULL one of the engine's. */
static inline void cxr__req_begin(cxr_rdma_ep *ep, atomic_int *open) {
  if (ep) atomic_fetch_add(&ep->reqs, 1);
  atomic_fetch_add(open, 1);
}
/* Counts it down once UCX ended it: the last request of an endpoint whose close returned
 * before they ended frees it (no UCX call: fine inside a UCX callback). */
void cxr__req_end(cxr_rdma_ep *ep, atomic_int *open);

/* mem.c */
int cxr__pin_init(cxr_rdma *r, const cxr_rdma_opts *o);
void cxr__pin_fini(cxr_rdma *r);

#endif
