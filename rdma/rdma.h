/*
 * cxrpc/rdma.h: the cross-rack engine over UCX (RDMA where there is a device, TCP where
 * there is none): a worker with its own progress thread, endpoints with fast connect,
 * memory registration under a pinned-memory budget, one-sided get/put/64-bit atomics,
 * active messages, and RDMA device discovery through rdma-core.
 *
 * Threads: every function may be called from any thread. Message handlers run on the
 * object's progress thread (see cxr_rdma_am_fn).
 *
 * Fast connect (after KRCORE): the first connect to a host ("HOST:PORT") makes a UCX
 * client-server endpoint and asks the host for its worker address and its exported memory
 * (names, addresses, remote keys). That answer is kept in a per-object directory, and the
 * progress thread keeps a small pool of ready endpoints to each known host, so a later
 * connect to the same host takes an endpoint from the pool: no round trip.
 *
 * Pinned memory (after NP-RDMA): registrations use UCP_MEM_MAP_NONBLOCK (on-demand paging
 * where the NIC offers it). Where a transport needs pinned memory, or with
 * CXR_RDMA_PIN_ALWAYS, pinned bytes stay under a fixed budget: a registration cache that
 * evicts idle registrations, and bounce buffers for transfers that do not fit.
 */
#ifndef CXRPC_RDMA_H
#define CXRPC_RDMA_H

#include <sys/uio.h>

#include <cxrpc/base.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cxr_rdma cxr_rdma;           /* UCX context + worker + progress thread */
typedef struct cxr_rdma_ep cxr_rdma_ep;     /* a logical connection to one host */
typedef struct cxr_rdma_mr cxr_rdma_mr;     /* local memory registered (and maybe exported) */
typedef struct cxr_rdma_rkey cxr_rdma_rkey; /* remote memory, usable on one endpoint */
typedef struct cxr_rdma_msg cxr_rdma_msg;   /* a received active message */

enum cxr_rdma_pin_mode {
  CXR_RDMA_PIN_AUTO = 0,   /* pin only where the transport cannot page on demand */
  CXR_RDMA_PIN_ALWAYS = 1, /* pin (mlock) every registration, under the budget */
  CXR_RDMA_PIN_NEVER = 2,  /* never pin; registrations rely on on-demand paging */
};

typedef struct cxr_rdma_opts {
  const char *listen;  /* "ADDR:PORT" to accept connections (port 0: any); NULL: none */
  size_t pin_budget;   /* bytes this object may keep pinned; default $CXRPC_RDMA_PIN_BUDGET
                          or 64 MiB */
  int pin_mode;        /* enum cxr_rdma_pin_mode; default $CXRPC_RDMA_PIN (auto|always|never) */
  size_t bounce_size;  /* pinned bounce buffer (part of the budget); default budget/8, at
                          most 1 MiB */
  int64_t spin_ns;     /* the progress thread busy-polls this long after the last event,
                          then sleeps on the worker's event fd; default 2 ms */
  unsigned pool;       /* ready endpoints kept per known host; default 2 */
  size_t msg_max;      /* the most data one received message may carry: a larger one is
                          dropped before anything is allocated for it; default
                          $CXRPC_RDMA_MSG_MAX, or 1 GiB (a $CXRPC_REMOTE_HEAP_MB above it:
                          that heap + 2 MiB); 0: the same */
  size_t queue_max;    /* the most bytes of received messages not yet handed to a handler
                          (its own receive or the progress thread's queue); new ones past it
                          are dropped; default $CXRPC_RDMA_QUEUE_MAX; 0: msg_max + 1 GiB */
} cxr_rdma_opts;

void cxr_rdma_opts_init(cxr_rdma_opts *o);
/* Also sets SIGPIPE to ignored if it is at its default: a peer dying while UCX writes to
 * its socket must end calls with an error, not kill this process. */
int cxr_rdma_open(cxr_rdma **r, const cxr_rdma_opts *o);
/* Closes every endpoint, stops the progress thread, unregisters memory. If endpoints closed
 * with one-sided ops or sends pending at a silent target still have them after a last
 * bounded wait (200 ms), or replies to clients that connected from our worker address are
 * still pending after one (1 s), the UCX worker and context are left undestroyed (logged):
 * a bounded leak, since no way of destroying them under such requests is safe with UCX 1.13
 * (cxr_rdma_close(3)). */
void cxr_rdma_close(cxr_rdma *r);
/* The port the listener is bound to (0 when not listening). */
int cxr_rdma_port(const cxr_rdma *r);

/* ---- endpoints ---- */

/* Connects to "HOST:PORT" (an IPv4 address or a name). Within deadline_ns (absolute,
 * cxr_now_ns() clock; 0 = 2 s from now). A known host costs no round trip.
 * Errors: CXR_ENOENT (unknown host name), CXR_ENOTCONN (refused or unreachable),
 * CXR_ETIMEDOUT, CXR_EPROTO (not a cxrpc peer). */
int cxr_rdma_connect(cxr_rdma *r, const char *hostport, int64_t deadline_ns,
                     cxr_rdma_ep **ep);
/* 0 while usable; else the code that ended it (CXR_EPEERDEAD when the peer died,
 * CXR_ENOTCONN when the link failed). */
int cxr_rdma_ep_status(const cxr_rdma_ep *ep);
const char *cxr_rdma_ep_host(const cxr_rdma_ep *ep);
/* cb runs once when the endpoint fails (not on a close), inside UCX's progress on whichever
 * thread drives it: it must not block or call cxr_rdma functions other than
 * cxr_rdma_defer (which runs work on the progress thread). */
int cxr_rdma_ep_on_error(cxr_rdma_ep *ep, void (*cb)(cxr_rdma_ep *ep, int err, void *user),
                         void *user);
/* Closes the endpoint (bounded: 200 ms for one-sided ops and messages still pending, then
 * 200 ms for the close). One whose ops do not finish, a silent target, is parked on the
 * engine, its UCX handle open, until they do (the next endpoint close then closes it) or
 * cxr_rdma_close; for the caller it is gone either way. Messages still pending after the
 * wait are cancelled instead (the endpoint is force-closed, not parked): once the close
 * returns, UCX no longer reads the data of any send or post made on the endpoint. One
 * exception, with another thread still using the endpoint: on an engine that pins, its large
 * get or put that missed its deadline force-closes the endpoint itself, and when that close
 * has not ended within 1.1 s this close returns with it (and the sends and posts it has yet
 * to cancel) under way: UCX may read their data until it ends (cxr_rdma_ep_close(3)). */
void cxr_rdma_ep_close(cxr_rdma_ep *ep);
/* Forgets what the directory knows about a host and closes its pooled endpoints (its next
 * connect is cold). */
void cxr_rdma_forget(cxr_rdma *r, const char *hostport);

/* ---- active messages ---- */

enum { CXR_RDMA_AM_USER_MIN = 16, CXR_RDMA_AM_MAX = 255 };

/* A handler runs on the progress thread, outside UCX callbacks: it may block briefly,
 * send (cxr_rdma_reply) and keep the message with cxr_rdma_msg_keep; otherwise the
 * message is freed when it returns. Header and data are copies, aligned to 16 bytes. */
typedef void (*cxr_rdma_am_fn)(cxr_rdma_msg *m, void *user);
/* id in [CXR_RDMA_AM_USER_MIN, CXR_RDMA_AM_MAX]. fn NULL removes the handler. */
int cxr_rdma_am_set(cxr_rdma *r, unsigned id, cxr_rdma_am_fn fn, void *user);
/* Sends header (<= 1 KiB) and the data gathered from iov; returns once UCX no longer needs
 * the buffers, or at the deadline (absolute; 0 = 2 s). After CXR_ETIMEDOUT the send goes on:
 * the data buffers are the caller's again once cxr_rdma_ep_close returns (which cancels the
 * send if it is still pending), unless one-sided ops were pending at the silent peer too:
 * the endpoint is parked then, and the data stays with UCX until cxr_rdma_close returns
 * (cxr_rdma_ep_close(3)). CXR_EFULL: the receiver refused a large (rendezvous)
 * message: above its msg_max or past its queue_max. */
int cxr_rdma_am_send(cxr_rdma_ep *ep, unsigned id, const void *hdr, size_t hlen,
                     const struct iovec *iov, size_t niov, int64_t deadline_ns);
/* Same, without waiting: the header is copied, the data must stay valid until the
 * message is sent, or until cxr_rdma_ep_close returns (cxr_rdma_close, as above). */
int cxr_rdma_am_post(cxr_rdma_ep *ep, unsigned id, const void *hdr, size_t hlen,
                     const struct iovec *iov, size_t niov);
/* Answers a message on the endpoint it came from. Same contract as cxr_rdma_am_send, but
 * unless it came on an endpoint the caller opened (then CXR_ENOTCONN once that endpoint is
 * closed), that endpoint is not the caller's to close: after CXR_ETIMEDOUT the data buffers
 * are the caller's again once cxr_rdma_close returns (cxr_rdma_reply(3), BUGS). */
int cxr_rdma_reply(cxr_rdma_msg *m, unsigned id, const void *hdr, size_t hlen,
                   const struct iovec *iov, size_t niov, int64_t deadline_ns);
unsigned cxr_rdma_msg_id(const cxr_rdma_msg *m);
const void *cxr_rdma_msg_hdr(const cxr_rdma_msg *m, size_t *len);
const void *cxr_rdma_msg_data(const cxr_rdma_msg *m, size_t *len);
/* Keeps the message after the handler returns; the owner frees it with cxr_rdma_msg_free,
 * also after cxr_rdma_close (a reply then fails with CXR_ECLOSED). */
void cxr_rdma_msg_keep(cxr_rdma_msg *m);
void cxr_rdma_msg_free(cxr_rdma_msg *m);

/* Runs fn(user) on the progress thread soon (e.g. to answer a kept message later). */
int cxr_rdma_defer(cxr_rdma *r, void (*fn)(void *user), void *user);

/* ---- memory ---- */

/* Registers [p, p + len) for remote access (UCP_MEM_MAP_NONBLOCK). Counts against the pin
 * budget when pinning applies; CXR_EFULL when it cannot fit even after evicting idle
 * registrations. */
int cxr_rdma_reg(cxr_rdma *r, void *p, size_t len, cxr_rdma_mr **mr);
void cxr_rdma_dereg(cxr_rdma_mr *mr);
/* Registers and advertises [p, p + len) under `name` (<= 31 chars) to every host that
 * connects afterwards (and to earlier ones on cxr_rdma_refresh). */
int cxr_rdma_export(cxr_rdma *r, const char *name, void *p, size_t len, cxr_rdma_mr **mr);
/* The remote key of a host's export by name, from the directory (no round trip once the
 * host is known); *base and *len give the exported range. CXR_ENOENT if not exported. */
int cxr_rdma_rkey_get(cxr_rdma_ep *ep, const char *name, cxr_rdma_rkey **rk, uint64_t *base,
                  size_t *len);
/* Asks the host again for its exports (one round trip). */
int cxr_rdma_refresh(cxr_rdma_ep *ep, int64_t deadline_ns);

/* One-sided operations; all wait until done or the absolute deadline (0 = 2 s). Atomics
 * and gets/puts of any size go through memory of their own (gets/puts in chunks of at most
 * 64 KiB, several in flight; a put copies src first, a get copies a chunk into dst only when
 * it succeeded, an atomic's reply never lands in *old): a missed deadline returns
 * CXR_ETIMEDOUT at once and leaves the endpoint open; the ops still pending are abandoned,
 * may still apply at the target, and are freed when UCX completes or cancels them. The one
 * exception, an engine that pins (CXR_RDMA_PIN_ALWAYS): a get or put above 64 KiB uses
 * pinned memory no abandoned op may keep, so its missed deadline ends the endpoint
 * (CXR_ETIMEDOUT now, CXR_ENOTCONN afterwards; cxr_rdma_get(3), BUGS).
 * Remote ranges are checked against the export before anything is sent (CXR_ERANGE). */
int cxr_rdma_put(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, const void *src,
                 size_t len, int64_t deadline_ns);
int cxr_rdma_get(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, void *dst, size_t len,
                 int64_t deadline_ns);
int cxr_rdma_fadd64(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, uint64_t add,
                    uint64_t *old, int64_t deadline_ns);
/* Writes `desired` at raddr if it holds `expected`; *old gets what was there (equal to
 * expected when the swap happened). */
int cxr_rdma_cswap64(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, uint64_t expected,
                     uint64_t desired, uint64_t *old, int64_t deadline_ns);
int cxr_rdma_swap64(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, uint64_t value,
                    uint64_t *old, int64_t deadline_ns);

typedef struct cxr_rdma_stats {
  size_t pinned;          /* bytes pinned now */
  size_t pinned_peak;     /* most bytes ever pinned at once */
  size_t pin_budget;
  size_t registered;      /* bytes registered (pinned or not) */
  uint64_t evictions;     /* idle registrations dropped to fit the budget */
  uint64_t bounced;       /* bytes moved through bounce buffers */
  uint64_t cold_connects, warm_connects;
  uint64_t pool_hits;     /* warm connects served by a ready pooled endpoint */
  unsigned known_hosts;
  unsigned pooled;        /* ready endpoints waiting in the pools now */
  int pin_mode;           /* the mode in force (auto resolved to always or never) */
  unsigned parked;        /* closed endpoints kept open for one-sided ops still pending
                             (cxr_rdma_ep_close(3)) */
  /* Messages received and dropped before reaching a handler: above msg_max, beyond
   * queue_max, for an id without handler, and for want of memory. */
  uint64_t dropped_too_big, dropped_queue_full, dropped_unhandled, dropped_no_memory;
} cxr_rdma_stats;
int cxr_rdma_stats_get(const cxr_rdma *r, cxr_rdma_stats *out);

/* ---- ALock: one lock for processes in the pod and hosts in other racks ---- */

/* The lock lives in pod memory (a shared heap the pod maps; a pod host exports it for
 * other racks with cxr_rdma_export). Its first cache line is the lock word: a remote MCS
 * tail, a local MCS tail and a Peterson victim word. Processes in the pod touch only the
 * local tail (CPU atomics) and their queue nodes; remote hosts only the remote tail (UCX
 * atomics) and theirs; both write the victim word with plain 8-byte writes (atomic between
 * CPU and NIC, unlike mixing CPU and NIC atomics on one word). The head of each cohort's
 * MCS queue competes with the other cohort's head by Peterson's algorithm; the lock passes
 * inside a cohort without competing up to `budget` - 1 times, then the next holder competes,
 * which lets a waiting cohort in. No local access ever goes through the NIC. */
enum { CXR_ALOCK_SLOTS = 64, CXR_ALOCK_BUDGET = 5 };

typedef struct cxr_alock_node {
  uint64_t next;    /* successor's slot + 1, 0 = none */
  uint64_t locked;  /* 1 wait, 0 yours (cohort kept), 2 yours to compete, 3 abandoned, 4 passed */
  uint64_t budget;  /* in-cohort handoffs left when it was passed */
  /* Pod nodes only: who uses the slot (pid, start time, host), and the predecessor's slot
   * + 1 at its last enqueue (0: none yet known), so that a waiter can tell a dead process's
   * node ahead of it and recover the lock (cxr_alock_lock(3)). */
  uint64_t owner_pid, owner_start, owner_host;
  uint64_t prev;
  uint64_t pad[1];
} cxr_alock_node;

typedef struct cxr_alock {
  uint64_t rtail;   /* remote MCS tail: UCX atomics only */
  uint64_t ltail;   /* local MCS tail: CPU atomics only */
  uint64_t victim;  /* Peterson: plain 8-byte writes from both cohorts */
  uint64_t budget;  /* holders in a row per cohort before one competes (set at init) */
  uint64_t pad[4];
  cxr_alock_node lnodes[CXR_ALOCK_SLOTS];  /* pod processes (CPU only) */
  cxr_alock_node rnodes[CXR_ALOCK_SLOTS];  /* remote hosts (UCX only) */
} __attribute__((aligned(64))) cxr_alock;

/* How one participant reaches the lock. Each concurrent participant of a cohort needs its
 * own slot (0 .. CXR_ALOCK_SLOTS-1): a thread or process in the pod, a thread on a host. */
typedef struct cxr_alock_ref {
  cxr_alock *local;     /* in the pod: the lock as mapped here; NULL for a remote host */
  cxr_rdma_ep *ep;      /* remote: an endpoint to a pod host exporting the lock */
  cxr_rdma_rkey *rk;
  uint64_t addr;        /* remote: the lock's address in the pod */
  unsigned slot;
  uint64_t budget_left; /* private */
  bool held;            /* private: a remote ref's lock returned 0 and no unlock since */
} cxr_alock_ref;

/* budget 0 = CXR_ALOCK_BUDGET. Only while nobody uses the lock. */
int cxr_alock_init(cxr_alock *l, unsigned budget);
/* deadline_ns absolute (cxr_now_ns clock; 0 = no deadline). CXR_ETIMEDOUT leaves the queue
 * cleanly; remote errors (CXR_EPEERDEAD...) end the attempt. A remote step that misses its
 * own 2 s bound (CXR_ETIMEDOUT too) spends the ref: later lock/unlock through it return
 * CXR_ENOTCONN until budget_left is set back to 0 (cxr_alock_lock(3)). */
int cxr_alock_lock(cxr_alock_ref *r, int64_t deadline_ns);
int cxr_alock_unlock(cxr_alock_ref *r);

/* ---- device discovery (rdma-core) ---- */

typedef struct cxr_rdma_port_info {
  unsigned num;
  char state[16];       /* "active", "down", ... */
  char link_layer[16];  /* "InfiniBand", "Ethernet" */
  unsigned gids;        /* GID table length */
  unsigned pkeys;       /* P_Key table length */
} cxr_rdma_port_info;

typedef struct cxr_rdma_dev_info {
  char name[64];
  char transport[16];
  bool odp;             /* on-demand paging for RC (implicit or explicit) */
  bool dc;              /* dynamically connected transport (mlx5) */
  unsigned nports;
  cxr_rdma_port_info ports[4];
} cxr_rdma_dev_info;

/* Fills up to max devices; *n gets how many exist (0 here: no device). A machine without
 * RDMA support is not an error: it returns 0 with *n = 0 and *why says why (errno text). */
int cxr_rdma_devices(cxr_rdma_dev_info *out, size_t max, size_t *n, char *why, size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
