/* The UCX context, the worker, its progress thread, active messages and request waits. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rdma/internal.h"
#include "rdma/open_ucx.h"
#include "shm/env.h"

int cxr__rdma_status(ucs_status_t s) {
  switch (s) {
    case UCS_OK: return 0;
    /* Over TCP, UCX reports a peer killed mid-connection as a reset or (after its
     * keepalive or a refused reconnect) an endpoint timeout: either way the peer is gone. */
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED: return CXR_EPEERDEAD;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED: return CXR_ENOTCONN;
    case UCS_ERR_TIMED_OUT: return CXR_ETIMEDOUT;
    case UCS_ERR_CANCELED: return CXR_ECANCELED;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE: return CXR_ENOMEM;
    case UCS_ERR_INVALID_PARAM: return CXR_EINVAL;
    case UCS_ERR_UNSUPPORTED: return CXR_ENOSYS;
    case UCS_ERR_EXCEEDS_LIMIT: return CXR_EFULL;  /* a receiver refused the data (msg_admit) */
    case UCS_ERR_NO_ELEM: return CXR_ENOENT;
    default: return CXR_EIO;
  }
}

int64_t cxr__deadline(int64_t d) { return d > 0 ? d : cxr_now_ns() + 2000000000; }

/* A size from the environment: a number (decimal, or 0x hexadecimal) with an optional k, M
 * or G suffix, at least 1; *v is left alone when the variable is unset, and when it is bad
 * (with a warning: cxr__env_bytes). */
static void env_size(const char *name, size_t *v) {
  uint64_t n;
  cxr__env_bytes(name, *v, 1, SIZE_MAX, &n);
  *v = (size_t)n;
}

size_t cxr__remote_heap_bytes(void) {
  uint64_t mb;
  cxr__env_u64("CXRPC_REMOTE_HEAP_MB", 64, 1, 65536, &mb);
  return (size_t)mb << 20;
}

/* The default bound on one received message's data. A remote call ships its argument graph
 * (up to its connection heap: $CXRPC_REMOTE_HEAP_MB, 1 to 65536 MiB, 64 by default; see
 * rpc/remote_client.c) in one message with its range table (at most 65536 ranges, 1 MiB),
 * so a heap above 1 GiB raises the default to that heap + 2 MiB. */
static size_t msg_max_default(void) {
  size_t v = (size_t)1 << 30;
  size_t heap = cxr__remote_heap_bytes();
  if (heap + (2u << 20) > v) v = heap + (2u << 20);
  env_size("CXRPC_RDMA_MSG_MAX", &v);
  return v;
}

void cxr_rdma_opts_init(cxr_rdma_opts *o) {
  if (o == NULL) return;
  memset(o, 0, sizeof *o);
  o->pin_budget = 64u << 20;
  env_size("CXRPC_RDMA_PIN_BUDGET", &o->pin_budget);
  o->pin_mode = CXR_RDMA_PIN_AUTO;
  const char *m = getenv("CXRPC_RDMA_PIN");
  if (m != NULL && !strcmp(m, "always")) o->pin_mode = CXR_RDMA_PIN_ALWAYS;
  if (m != NULL && !strcmp(m, "never")) o->pin_mode = CXR_RDMA_PIN_NEVER;
  o->spin_ns = 2000000;
  o->pool = 2;
  o->msg_max = msg_max_default();
  env_size("CXRPC_RDMA_QUEUE_MAX", &o->queue_max);
}

/* ---- requests ---- */

rdma_op *cxr__op_new(void) {
  rdma_op *op = calloc(1, sizeof *op);
  return op;
}

/* Frees an op and what it owns. */
/* A buffer handed over with a send (an op's, or one that never reached UCX) goes. */
static void owned_drop(void *owned, void (*owned_free)(void *)) {
  if (owned_free) owned_free(owned);
  else free(owned);
}

static void op_free(rdma_op *op) {
  free(op->hdr_copy);
  owned_drop(op->owned, op->owned_free);
  free(op);
}

void cxr__op_release(rdma_op *op) {
  if (op->keep != NULL && op->status != UCS_OK) {
    pthread_mutex_lock(&op->keep->lock);
    op->next = op->keep->graves;
    op->keep->graves = op;
    pthread_mutex_unlock(&op->keep->lock);
    return;
  }
  op_free(op);
}

static void bare_flushed(void *request, ucs_status_t status, void *open) {
  atomic_fetch_sub((atomic_int *)open, 1);
  ucp_request_free(request);
}

/* UCX 1.13 ends a rendezvous send when its data is put and the put's acknowledgement to the
 * receiver (ATP) is handed over, before the receiver has either: the receive completes only
 * at the ATP. A message on a bare handle (a reply to a client that came from our worker
 * address) has no endpoint of ours whose graceful close would flush it, and cxr_rdma_close
 * destroyed the worker right after such a send ended: the client's connection was torn down
 * with the data or the ATP unread, and its receive failed (close_reply_test, 1 MiB replies to
 * a warm client, lost 3 to 7 runs in 25). So the send stays counted on the engine until a
 * flush of the handle, posted here, ends: over TCP that waits for the receiver's own
 * acknowledgement of the data, sent after it has read the ATP. Runs inside the send's UCX
 * callback, or right after a send UCX did in place (am_send), where the handle is alive
 * (UCX may destroy a handle it made once its peer fails, so it is not kept for later);
 * posting a flush there is allowed. True if the flush counts down `open`. */
static bool bare_flush(ucp_ep_h uep, atomic_int *open) {
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                           UCP_OP_ATTR_FIELD_USER_DATA,
                           .cb.send = bare_flushed, .user_data = open};
  return UCS_PTR_IS_PTR(ucp_ep_flush_nbx(uep, &p));
}

static void op_finish(rdma_op *op, ucs_status_t status) {
  op->status = status;
  if (op->open && !(op->flush_uep && status == UCS_OK && bare_flush(op->flush_uep, op->open)))
    cxr__req_end(op->ep, op->open);
  int expect = 0;
  /* The waiter gave up: the op is ours to release. */
  if (!atomic_compare_exchange_strong(&op->state, &expect, 1)) cxr__op_release(op);
}

void cxr__op_cb(void *request, ucs_status_t status, void *user_data) {
  op_finish(user_data, status);
  ucp_request_free(request);
}

static void cpu_relax(void) { __asm__ __volatile__("pause" ::: "memory"); }

int cxr__op_await(cxr_rdma *r, rdma_op *op, int64_t deadline) {
  atomic_fetch_add(&r->waiters, 1);
  int64_t start = cxr_now_ns(), now = start;
  /* Busy-poll the worker ourselves (the lowest latency); after a while, back off so a
   * long wait (a link down) does not burn a core. */
  while (atomic_load(&op->state) == 0 && now < deadline) {
    if (ucp_worker_progress(r->worker) == 0) {
      if (now - start > 200000) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
      } else {
        cpu_relax();
      }
    }
    now = cxr_now_ns();
  }
  atomic_fetch_sub(&r->waiters, 1);
  int expect = 0;
  return atomic_compare_exchange_strong(&op->state, &expect, 2) ? CXR_ETIMEDOUT : 0;
}

void cxr__op_abandon(rdma_op *op) {
  int expect = 0;
  if (!atomic_compare_exchange_strong(&op->state, &expect, 2)) cxr__op_release(op);
}

int cxr__op_wait(cxr_rdma *r, ucs_status_ptr_t p, rdma_op *op, int64_t deadline) {
  if (p == NULL) {  /* completed in place */
    op_free(op);
    return 0;
  }
  if (UCS_PTR_IS_ERR(p)) {
    op_free(op);
    return cxr__rdma_status(UCS_PTR_STATUS(p));
  }
  if (cxr__op_await(r, op, deadline) != 0) return CXR_ETIMEDOUT;
  int rc = cxr__rdma_status(op->status);
  op_free(op);
  return rc;
}

unsigned cxr__rdma_progress(cxr_rdma *r) { return ucp_worker_progress(r->worker); }
void cxr__rdma_waiter(cxr_rdma *r, int delta) { atomic_fetch_add(&r->waiters, delta); }

void cxr__progress_until(cxr_rdma *r, bool (*done)(void *), void *arg, int64_t deadline) {
  cxr__rdma_waiter(r, 1);
  while (!done(arg) && cxr_now_ns() < deadline)
    if (cxr__rdma_progress(r) == 0) {
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
  cxr__rdma_waiter(r, -1);
}

void cxr__rdma_set_tick(cxr_rdma *r, void (*fn)(void *), void *user) {
  pthread_mutex_lock(&r->lock);
  r->tick_user = user;
  r->tick = fn;
  pthread_mutex_unlock(&r->lock);
}

/* ---- deferred work and messages, run by the progress thread ---- */

void cxr__wake(cxr_rdma *r) { ucp_worker_signal(r->worker); }

static int defer(cxr_rdma *r, void (*fn)(void *), void *user, bool wake) {
  if (r == NULL || fn == NULL) return CXR_EINVAL;
  /* (After the close only a kept message's last hold on a failed endpoint defers work.) */
  if (atomic_load(&r->closed)) return CXR_ECLOSED;
  rdma_defer *d = malloc(sizeof *d);
  if (d == NULL) return CXR_ENOMEM;
  d->fn = fn;
  d->user = user;
  d->next = NULL;
  pthread_mutex_lock(&r->lock);
  if (r->dq_tail) r->dq_tail->next = d; else r->dq_head = d;
  r->dq_tail = d;
  pthread_mutex_unlock(&r->lock);
  /* Only a sleeping progress thread needs the (lock-taking) worker signal; a spinning one
   * finds the queue on its next turn. */
  if (wake && atomic_load(&r->asleep)) cxr__wake(r);
  return 0;
}

int cxr_rdma_defer(cxr_rdma *r, void (*fn)(void *), void *user) {
  if (r != NULL && cxr__rdma_copy(r)) return CXR_ECLOSED; /* no progress thread runs it */
  return defer(r, fn, user, true);
}
int cxr__rdma_defer_quiet(cxr_rdma *r, void (*fn)(void *), void *user) {
  return defer(r, fn, user, false);
}

static void msg_enqueue(cxr_rdma *r, cxr_rdma_msg *m) {
  pthread_mutex_lock(&r->lock);
  m->next = NULL;
  if (r->mq_tail) r->mq_tail->next = m; else r->mq_head = m;
  r->mq_tail = m;
  pthread_mutex_unlock(&r->lock);
}

/* The struct alone: UCX and everything else of the engine went in cxr_rdma_close. */
static void engine_free(cxr_rdma *r) {
  pthread_mutex_destroy(&r->lock);
  pthread_mutex_destroy(&r->bounce_lock);
  free(r);
}

/* Lets go of one of r->refs: the close's, or a kept message's. */
static void engine_put(cxr_rdma *r) {
  if (atomic_fetch_sub(&r->refs, 1) == 1) engine_free(r);
}

void cxr_rdma_msg_free(cxr_rdma_msg *m) {
  /* A fork child's copy of a message is left alone: dropping its endpoint could close it. */
  if (m == NULL || cxr__rdma_copy(m->r)) return;
  cxr_rdma *r = m->r;
  bool kept = m->kept;
  if (m->ref) cxr__ep_drop(m->ref);  /* under r->lock: the engine goes after */
  if (m->owned) {
    free(m->hdr);
    free(m->data);
  }
  free(m);
  if (kept) engine_put(r);
}

static unsigned run_queued(cxr_rdma *r) {
  unsigned n = 0;
  for (;;) {
    pthread_mutex_lock(&r->lock);
    rdma_defer *d = r->dq_head;
    cxr_rdma_msg *m = NULL;
    if (d) {
      r->dq_head = d->next;
      if (!r->dq_head) r->dq_tail = NULL;
    } else if ((m = r->mq_head) != NULL) {
      r->mq_head = m->next;
      if (!r->mq_head) r->mq_tail = NULL;
      r->queued -= m->charge;  /* its handler has it now (and may keep it) */
      m->charge = 0;
    }
    am_slot slot = m ? r->am[m->id] : (am_slot){0};
    pthread_mutex_unlock(&r->lock);
    if (d) {
      d->fn(d->user);
      free(d);
    } else if (m) {
      bool kept = false;
      m->kept_out = &kept;
      if (slot.fn) slot.fn(m, slot.user);
      if (!kept) cxr_rdma_msg_free(m);  /* a kept message is not ours to touch any more */
    } else {
      break;
    }
    n++;
  }
  return n;
}

/* A message's hold on its endpoint is given back even after cxr__eps_close_all closed every
 * one: a held endpoint's memory stays until its last message goes (ep.c, ep_release). */
static void drop_messages(cxr_rdma *r) {
  for (;;) {
    pthread_mutex_lock(&r->lock);
    cxr_rdma_msg *m = r->mq_head;
    if (m) {
      r->mq_head = m->next;
      if (!r->mq_head) r->mq_tail = NULL;
      r->queued -= m->charge;
    }
    pthread_mutex_unlock(&r->lock);
    if (m == NULL) break;
    cxr_rdma_msg_free(m);
  }
}

/* ---- receiving active messages ---- */

/* What a message costs beyond its header and data (its struct, the allocations' headers). */
enum { MSG_OVERHEAD = 256 };

/* Gives back what an admitted message counted in r->queued (see msg_admit). */
static void queue_uncharge(cxr_rdma *r, size_t charge) {
  pthread_mutex_lock(&r->lock);
  r->queued -= charge;
  pthread_mutex_unlock(&r->lock);
}

static void msg_uncharge(cxr_rdma *r, cxr_rdma_msg *m) {
  if (m->charge == 0) return;
  queue_uncharge(r, m->charge);
  m->charge = 0;
}

static void deliver(am_slot *s, cxr_rdma_msg *m) {
  if (s->flags & CXR_RDMA_AM_INLINE) {
    if (s->fn) s->fn(m, s->user);
    msg_uncharge(s->r, m);
    cxr_rdma_msg_free(m);
  } else {
    msg_enqueue(s->r, m);  /* run_queued gives its charge back */
  }
}

/* A rendezvous receive UCX holds, counted on the endpoint of ours its message came on,
 * accepted or opened by us (whose close, forced then, ends it), or else on the engine, whose
 * close waits for it as for a message on a bare handle (bare_left). Until 2026-11-28 nothing
 * counted them, and an engine closed while a large message was arriving from a client that
 * stopped (through the listener: the endpoint's graceful close gave up with the receive on
 * it) or from a warm client (running or stopped) aborted in ucp_worker_destroy (UCX 1.13:
 * proto_reqs not empty in ucp_ep.c): close_silent_test, 3 of its 4 cases, 3 runs in 3 each.
 * Then only accepted endpoints counted them: one arriving on an endpoint we opened went on
 * the engine, so that endpoint's close was graceful and gave up at 200 ms with the receive
 * and its buffer still with UCX, and the engine's close left the worker undestroyed
 * (close_silent_test ClosingOurEndpointEndsALargeMessageArrivingOnIt, 3 in 3; a review).
 * One counted only after its endpoint's close had begun (found the endpoint idle, chose a
 * graceful close) still went on the engine the same way: it is refused now (cxr__recv_count). */
typedef struct rndv_ctx {
  am_slot *slot;
  cxr_rdma_msg *m;
  atomic_int *open;  /* its endpoint's open_recvs, or the engine's bare_recvs */
  cxr_rdma_ep *ep;   /* that endpoint (NULL: the engine) */
} rndv_ctx;

/* The count goes last, once nothing here touches the message's endpoint any more. */
static void recv_untrack(rndv_ctx *c) {
  atomic_int *open = c->open;
  cxr_rdma_ep *ep = c->ep;
  free(c);
  cxr__req_end(ep, open);
}

static void rndv_done(void *request, ucs_status_t status, size_t length, void *user) {
  rndv_ctx *c = user;
  if (status == UCS_OK) {
    deliver(c->slot, c->m);
  } else {
    msg_uncharge(c->slot->r, c->m);
    cxr_rdma_msg_free(c->m);
  }
  recv_untrack(c);
  ucp_request_free(request);
}

static void *copy16(const void *src, size_t len) {
  void *p = NULL;
  if (posix_memalign(&p, 16, len ? len : 16) != 0) return NULL;
  if (len && src) memcpy(p, src, len);
  return p;
}

/* Decides on a message from what its sender announced, before anything is allocated for
 * it: its id has a handler, its header is no larger than ours (HDR_MAX), its data fits
 * msg_max, and the bytes of messages received and not yet handed to a handler stay within
 * queue_max (an empty queue takes any one message). Returns the bytes it now counts in
 * r->queued, or 0 if it is refused: *st is then what a rendezvous sender's request ends
 * with. A peer announcing gigabytes (cheap for it: untouched memory) or flooding messages
 * used to make us allocate all of it (tests/rdma/rdma_test). */
static size_t msg_admit(am_slot *s, size_t hlen, size_t dlen, ucs_status_t *st) {
  cxr_rdma *r = s->r;
  *st = UCS_OK;
  if (hlen > HDR_MAX || dlen > r->msg_max) {
    pthread_mutex_lock(&r->lock);
    uint64_t n = ++r->msgs_too_big;
    pthread_mutex_unlock(&r->lock);
    if (cxr__log_due(n))
      CXR_WARN("rdma: dropped a message (id %u, header %zu, %zu bytes): above the engine's "
               "limit of %zu (msg_max, $CXRPC_RDMA_MSG_MAX); %llu so far", s->id, hlen, dlen,
               r->msg_max, (unsigned long long)n);
    *st = UCS_ERR_EXCEEDS_LIMIT;
    return 0;
  }
  size_t charge = hlen + dlen + MSG_OVERHEAD;
  pthread_mutex_lock(&r->lock);
  bool handled = s->fn != NULL, full = false;
  uint64_t n = 0;
  if (handled && r->queued && charge > r->queue_max - r->queued) {
    full = true;
    n = ++r->msgs_queue_full;
  } else if (handled) {
    r->queued += charge;
  } else {
    r->msgs_unhandled++;
  }
  pthread_mutex_unlock(&r->lock);
  if (!handled) {
    CXR_DEBUG("rdma: dropped a message for id %u: no handler", s->id);
    return 0;
  }
  if (full) {
    if (cxr__log_due(n))
      CXR_WARN("rdma: dropped a message (id %u, %zu bytes): messages waiting for their "
               "handlers fill the engine's %zu bytes (queue_max, $CXRPC_RDMA_QUEUE_MAX); "
               "%llu so far", s->id, dlen, r->queue_max, (unsigned long long)n);
    *st = UCS_ERR_EXCEEDS_LIMIT;
    return 0;
  }
  return charge;
}

static void count_no_memory(cxr_rdma *r) {
  pthread_mutex_lock(&r->lock);
  r->msgs_no_memory++;
  pthread_mutex_unlock(&r->lock);
}

static ucs_status_t am_recv_cb(void *arg, const void *header, size_t header_length,
                               void *data, size_t length, const ucp_am_recv_param_t *param) {
  am_slot *s = arg;
  cxr_rdma *r = s->r;
  bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  /* Closing: every message is dropped unserved, and a rendezvous receive started while the
   * close progresses the worker would only keep it waiting (a warm client sending back to
   * back always had one in flight when bare_left gave up: the worker was left undestroyed
   * at every close; a review). */
  if (atomic_load(&r->stop)) return rndv ? UCS_ERR_CANCELED : UCS_OK;
  ucs_status_t refused;
  size_t charge = msg_admit(s, header_length, length, &refused);
  /* Refused: eager data is UCX's own and goes when we return; a rendezvous receive that is
   * never started costs nothing, and its sender's request ends with our status. */
  if (charge == 0) return rndv ? refused : UCS_OK;
  cxr_rdma_msg *m = calloc(1, sizeof *m);
  if (m == NULL) {
    queue_uncharge(r, charge);
    count_no_memory(r);
    return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
  }
  m->r = r;
  m->id = s->id;
  m->owned = true;
  m->charge = charge;
  m->reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
  /* An endpoint of ours stays while the message may still answer on it: an accepted one open,
   * one we opened in memory at least, so a reply sees its close (reply). */
  if (m->reply_ep) m->ref = cxr__ep_hold(r, m->reply_ep);
  m->hlen = header_length;
  m->hdr = copy16(header, header_length);
  if (m->hdr == NULL) goto drop;
  m->dlen = length;
  if (rndv) {
    m->data = copy16(NULL, length);
    rndv_ctx *c = malloc(sizeof *c);
    if (m->data == NULL || c == NULL) {
      free(c);
      goto drop;
    }
    /* Counted before UCX has it: its callback may run elsewhere. */
    atomic_int *open = cxr__recv_count(r, m->ref);
    if (open == NULL) {  /* its endpoint's close has begun: never started, like at r->stop */
      free(c);
      msg_uncharge(r, m);
      cxr_rdma_msg_free(m);
      return UCS_ERR_CANCELED;
    }
    *c = (rndv_ctx){.slot = s, .m = m, .open = open,
                    .ep = open == &r->bare_recvs ? NULL : m->ref};
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = rndv_done,
                             .user_data = c};
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(r->worker, data, m->data, length, &p);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) recv_untrack(c); /* no callback comes */
    if (sp == NULL) deliver(s, m);
    else if (UCS_PTR_IS_ERR(sp)) goto drop;
    return UCS_OK;
  }
  m->data = copy16(data, length);
  if (m->data == NULL) goto drop;
  deliver(s, m);
  return UCS_OK;
drop:
  CXR_WARN("rdma: dropped a message (id %u, %zu bytes): out of memory", s->id, length);
  count_no_memory(r);
  msg_uncharge(r, m);
  cxr_rdma_msg_free(m);
  return UCS_OK;
}

int cxr__am_set(cxr_rdma *r, unsigned id, cxr_rdma_am_fn fn, void *user, int flags) {
  pthread_mutex_lock(&r->lock);
  r->am[id].r = r;
  r->am[id].id = id;
  r->am[id].fn = fn;
  r->am[id].user = user;
  r->am[id].flags = flags;
  pthread_mutex_unlock(&r->lock);
  ucp_am_handler_param_t hp = {
      .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
      .id = id,
      .flags = UCP_AM_FLAG_WHOLE_MSG,
      .cb = am_recv_cb,
      .arg = &r->am[id]};
  ucs_status_t st = ucp_worker_set_am_recv_handler(r->worker, &hp);
  return cxr__rdma_status(st);
}

int cxr_rdma_am_set(cxr_rdma *r, unsigned id, cxr_rdma_am_fn fn, void *user) {
  if (r == NULL || id < CXR_RDMA_AM_USER_MIN || id > CXR_RDMA_AM_MAX) return CXR_EINVAL;
  if (cxr__rdma_copy(r)) return CXR_ECLOSED;
  return cxr__am_set(r, id, fn, user, 0);
}

unsigned cxr_rdma_msg_id(const cxr_rdma_msg *m) { return m ? m->id : 0; }
const void *cxr_rdma_msg_hdr(const cxr_rdma_msg *m, size_t *len) {
  if (m == NULL) return NULL;
  if (len) *len = m->hlen;
  return m->hdr;
}
const void *cxr_rdma_msg_data(const cxr_rdma_msg *m, size_t *len) {
  if (m == NULL) return NULL;
  if (len) *len = m->dlen;
  return m->data;
}
void cxr_rdma_msg_keep(cxr_rdma_msg *m) {
  if (m == NULL || cxr__rdma_copy(m->r)) return;
  /* Handlers run before the close is past the progress thread: the engine is still open. */
  if (!m->kept) atomic_fetch_add(&m->r->refs, 1);
  m->kept = true;
  if (m->kept_out) *m->kept_out = true;
  m->kept_out = NULL;
}

/* ---- sending ---- */

/* Every iov entry names memory: no NULL base under a length, no range that wraps, and a
 * total that fits a size_t. UCX would read such an entry, fail the send and end the
 * connection (CXR_EPEERDEAD for every later call), so it is refused before. */
static bool iov_ok(const struct iovec *iov, size_t niov) {
  size_t total = 0;
  for (size_t i = 0; i < niov; i++) {
    uintptr_t b = (uintptr_t)iov[i].iov_base;
    size_t n = iov[i].iov_len;
    if (n && (b == 0 || n > UINTPTR_MAX - b || n > SIZE_MAX - total)) return false;
    total += n;
  }
  return true;
}

/* Sends on `uep`, or when `ep` is given on its handle (taken only while posting). */
static int am_send(cxr_rdma *r, cxr_rdma_ep *ep, ucp_ep_h uep, unsigned id, unsigned flags,
                   const void *hdr, size_t hlen, const struct iovec *iov, size_t niov,
                   int64_t deadline, bool wait, void *owned, void (*owned_free)(void *)) {
  if (hlen > HDR_MAX || (hlen && hdr == NULL) || (niov && (iov == NULL || !iov_ok(iov, niov))) ||
      (uep == NULL && ep == NULL)) {
    owned_drop(owned, owned_free);
    return uep == NULL && ep == NULL ? CXR_ENOTCONN : CXR_EINVAL;
  }
  rdma_op *op = cxr__op_new();
  if (op == NULL) {
    owned_drop(owned, owned_free);
    return CXR_ENOMEM;
  }
  op->owned = owned;
  op->owned_free = owned_free;
  /* The header, and the iov array when there are several entries, are copied (one block)
   * so that a send abandoned at its deadline never reads a dead stack frame or an array the
   * caller reused: UCX keeps pointing at both, and reads the array as it sends, until the
   * send completes (tests/rdma/rdma_test). The data stays the caller's. */
  size_t hsz = (hlen + 15) & ~(size_t)15, isz = niov > 1 ? niov * sizeof *iov : 0;
  if (niov > 1 && niov > (SIZE_MAX - hsz) / sizeof *iov) {
    op_free(op);
    return CXR_EINVAL;
  }
  if (hsz + isz) {
    op->hdr_copy = malloc(hsz + isz);
    if (op->hdr_copy == NULL) {
      op_free(op);
      return CXR_ENOMEM;
    }
    if (hlen) memcpy(op->hdr_copy, hdr, hlen);
    if (isz) memcpy((char *)op->hdr_copy + hsz, iov, isz);
  }
  ucp_request_param_t p = cxr__op_param(op);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = flags;
  const void *buf = NULL;
  size_t count = 0;
  if (niov == 1) {
    buf = iov[0].iov_base;
    count = iov[0].iov_len;
  } else if (niov > 1) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    buf = (char *)op->hdr_copy + hsz;
    count = niov;
  }
  int rc = ep ? cxr__ep_use(ep, &uep) : 0;
  if (rc) {
    op_free(op);
    return rc;
  }
  /* Counted on the endpoint until UCX is done with it, as one-sided ops are: closing the
   * endpoint ends a send still pending, so that UCX never reads the caller's data after
   * the close returns (ep.c, ep_destroy). On a bare handle (a reply to a client that came
   * from our worker address: no endpoint of ours to close) it is counted on the engine,
   * whose close waits for it: destroying the worker under it aborted (cxr_rdma_close).
   * Without a request there is no callback to count it down. */
  op->open = ep ? &ep->open_sends : &r->bare_sends;
  op->ep = ep;
  op->flush_uep = ep ? NULL : uep;
  cxr__req_begin(ep, op->open);
  ucs_status_ptr_t sp = ucp_am_send_nbx(uep, id, op->hdr_copy, hlen, buf, count, &p);
  /* Done in place on a bare handle: over TCP the tail of an eager message may still be in
   * UCX's send buffer (a slow reader's full socket), which the engine's close would destroy:
   * it stays counted until a flush ends, as one that completes through its callback does. */
  bool flushing = sp == NULL && !ep && bare_flush(uep, op->open);
  if ((sp == NULL && !flushing) || UCS_PTR_IS_ERR(sp)) cxr__req_end(ep, op->open);
  if (ep) cxr__ep_unuse(ep);
  if (!wait) {
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
      op_free(op);
      return sp == NULL ? 0 : cxr__rdma_status(UCS_PTR_STATUS(sp));
    }
    cxr__op_abandon(op);  /* its callback frees it */
    return 0;
  }
  return cxr__op_wait(r, sp, op, deadline);
}

int cxr__ep_am_send(cxr_rdma_ep *ep, unsigned id, unsigned flags, const void *hdr, size_t hlen,
                    const struct iovec *iov, size_t niov, int64_t deadline, bool wait) {
  return am_send(ep->r, ep, NULL, id, flags, hdr, hlen, iov, niov, deadline, wait, NULL, NULL);
}

int cxr__am_send_owned(cxr_rdma_ep *ep, unsigned id, const void *hdr, size_t hlen,
                       const struct iovec *iov, size_t niov, void *owned, int64_t deadline) {
  return am_send(ep->r, ep, NULL, id, UCP_AM_SEND_FLAG_REPLY, hdr, hlen, iov, niov, deadline,
                 true, owned, NULL);
}

int cxr_rdma_am_send(cxr_rdma_ep *ep, unsigned id, const void *hdr, size_t hlen,
                     const struct iovec *iov, size_t niov, int64_t deadline_ns) {
  if (ep == NULL || id < CXR_RDMA_AM_USER_MIN || id > CXR_RDMA_AM_MAX) return CXR_EINVAL;
  return cxr__ep_am_send(ep, id, UCP_AM_SEND_FLAG_REPLY, hdr, hlen, iov, niov,
                         cxr__deadline(deadline_ns), true);
}

int cxr_rdma_am_post(cxr_rdma_ep *ep, unsigned id, const void *hdr, size_t hlen,
                     const struct iovec *iov, size_t niov) {
  if (ep == NULL || id < CXR_RDMA_AM_USER_MIN || id > CXR_RDMA_AM_MAX) return CXR_EINVAL;
  return cxr__ep_am_send(ep, id, UCP_AM_SEND_FLAG_REPLY, hdr, hlen, iov, niov, 0, false);
}

int cxr_rdma_reply(cxr_rdma_msg *m, unsigned id, const void *hdr, size_t hlen,
                   const struct iovec *iov, size_t niov, int64_t deadline_ns) {
  if (id < CXR_RDMA_AM_USER_MIN) return CXR_EINVAL; /* below: the engine's own ids */
  return cxr__rdma_reply(m, id, hdr, hlen, iov, niov, NULL, NULL, deadline_ns);
}

/* A reply on an endpoint of ours (m->ref, the handle m->reply_ep), accepted or opened by us,
 * is posted and counted on it, as a send is: the endpoint's close then ends it if it is
 * still pending. Sent on the bare handle, it was left to the close's graceful bound, and an
 * engine closed with replies pending to a client that stopped reading aborted in
 * ucp_worker_destroy (UCX 1.13: proto_reqs not empty; rdma_test). Once that endpoint's close
 * has begun the reply fails (CXR_ENOTCONN): its handle is closed, or parked for its
 * one-sided ops only. Messages from a client that connected from our worker address carry
 * only the handle: a reply on it is counted on the engine (bare_sends), which nothing but
 * the engine's close ends. */
static int reply(cxr_rdma_msg *m, unsigned id, const void *hdr, size_t hlen,
                 const struct iovec *iov, size_t niov, void *owned, void (*owned_free)(void *),
                 int64_t deadline_ns, bool wait) {
  int rc = 0;
  if (m == NULL || id > CXR_RDMA_AM_MAX || id == 0) rc = CXR_EINVAL;
  else if (cxr__rdma_copy(m->r) || atomic_load(&m->r->closed)) rc = CXR_ECLOSED;
  else if (m->reply_ep == NULL || (m->ref && cxr__ep_closed(m->ref))) rc = CXR_ENOTCONN;
  if (rc) {
    owned_drop(owned, owned_free);
    return rc;
  }
  return am_send(m->r, m->ref, m->ref ? NULL : m->reply_ep, id, UCP_AM_SEND_FLAG_REPLY, hdr,
                 hlen, iov, niov, cxr__deadline(deadline_ns), wait, owned, owned_free);
}

int cxr__rdma_reply(cxr_rdma_msg *m, unsigned id, const void *hdr, size_t hlen,
                    const struct iovec *iov, size_t niov, void *owned,
                    void (*owned_free)(void *), int64_t deadline_ns) {
  return reply(m, id, hdr, hlen, iov, niov, owned, owned_free, deadline_ns, true);
}

int cxr__rdma_reply_post(cxr_rdma_msg *m, unsigned id, const void *hdr, size_t hlen,
                         const struct iovec *iov, size_t niov, void *owned,
                         void (*owned_free)(void *)) {
  return reply(m, id, hdr, hlen, iov, niov, owned, owned_free, 0, false);
}

/* ---- the progress thread ---- */

static void *progress_main(void *arg) {
  cxr_rdma *r = arg;
  int64_t last = cxr_now_ns(), last_tick = last;
  bool has_tick = false;
  while (!atomic_load(&r->stop)) {
    unsigned n = ucp_worker_progress(r->worker);
    n += run_queued(r);
    int64_t now = cxr_now_ns();
    if (now - last_tick > 10000000) {
      last_tick = now;
      pthread_mutex_lock(&r->lock);
      void (*tick)(void *) = r->tick;
      void *tu = r->tick_user;
      pthread_mutex_unlock(&r->lock);
      has_tick = tick != NULL;
      if (tick) tick(tu);
    }
    if (n) {
      last = now;
      continue;
    }
    if (atomic_load(&r->waiters) > 0) {
      /* An application thread is polling the worker itself: stay out of its way. */
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
      continue;
    }
    if (now - last < r->spin_ns) {
      cpu_relax();
      continue;
    }
    ucs_status_t st = ucp_worker_arm(r->worker);
    if (st == UCS_ERR_BUSY) continue;
    atomic_store(&r->asleep, 1);
    pthread_mutex_lock(&r->lock);
    bool queued = r->dq_head || r->mq_head;
    pthread_mutex_unlock(&r->lock);
    if (!queued) {
      struct pollfd pfd = {.fd = r->efd, .events = POLLIN};
      poll(&pfd, 1, has_tick ? 20 : 100);
    }
    atomic_store(&r->asleep, 0);
    last = cxr_now_ns();
  }
  return NULL;
}

/* ---- open and close ---- */

static int parse_hostport(const char *s, struct sockaddr_in *sa) {
  char host[HOSTKEY_MAX];
  const char *colon = strrchr(s, ':');
  if (colon == NULL || colon == s || (size_t)(colon - s) >= sizeof host) return CXR_EINVAL;
  memcpy(host, s, (size_t)(colon - s));
  host[colon - s] = '\0';
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end != '\0' || port < 0 || port > 65535 || colon[1] == '\0') return CXR_EINVAL;
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return 0;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL) return CXR_ENOENT;
  sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return 0;
}

int cxr__parse_hostport(const char *s, struct sockaddr_in *sa) { return parse_hostport(s, sa); }

/* A peer that dies mid-write must cost an error code, not the process: some UCX socket
 * paths write without MSG_NOSIGNAL, so SIGPIPE is ignored unless the application handles
 * it itself (we change it only from the default, once). */
static void ignore_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGPIPE, &sa, NULL);
  }
}

_Atomic unsigned cxr__rdma_fork_epoch = 1;
static void after_fork_child(void) { atomic_fetch_add(&cxr__rdma_fork_epoch, 1); }

/* Once per process, at the first open: SIGPIPE, and the fork hook (internal.h). */
static void process_setup(void) {
  ignore_sigpipe();
  pthread_atfork(NULL, NULL, after_fork_child);
}

/* Whether UCX_TLS (unset: every transport) lets UCX use TCP. */
static bool tcp_enabled(void) {
  const char *tls = getenv("UCX_TLS");
  if (tls == NULL || !*tls) return true;
  if (tls[0] == '^') return strstr(tls, "tcp") == NULL;
  return strstr(tls, "tcp") != NULL || strstr(tls, "all") != NULL;
}

/* UCX 1.13's TCP transport connects with a blocking connect(2) by default, and inside
 * ucp_ep_create it sends its connection request on the fresh connection. A peer that resets
 * the connection between the two and refuses the retry (its process dying while we connect:
 * the pool refill's endpoints to a peer being killed, tests/rdma/ep_share_test in CI) got the
 * half-made endpoint marked failed, its destruction queued, and then given its send side
 * anyway (uct_tcp_ep_connect in tcp_ep.c); the next worker progress, on any thread, aborted
 * the process ("tcp_ep.c:478 Assertion `!(ep->flags & UCT_TCP_EP_FLAG_CTX_TYPE_TX)' failed",
 * uct_tcp_ep_destroy_progress). Non-blocking connects send nothing before the endpoint is
 * whole: a failure then goes through the endpoint's error handler (tests/rdma/
 * connect_dying_test). A UCX_TCP_CONN_NB of the user's wins. (UCX matches a key it does not
 * know itself against each transport's own option names: only TCP has CONN_NB.) */
static void tcp_connect_nonblocking(ucp_config_t *cfg) {
  if (getenv("UCX_TCP_CONN_NB") != NULL || !tcp_enabled()) return;
  ucs_status_t st = ucp_config_modify(cfg, "CONN_NB", "y");
  if (st != UCS_OK)
    CXR_WARN("rdma: cannot make UCX's TCP connects non-blocking: %s", ucs_status_string(st));
}

/* The caller's settings for this engine (open_ucx.h): false when UCX refuses one. */
static bool config_modify(ucp_config_t *cfg, const char *const *kv) {
  for (; kv != NULL && kv[0] != NULL; kv += 2) {
    ucs_status_t st = kv[1] ? ucp_config_modify(cfg, kv[0], kv[1]) : UCS_ERR_INVALID_PARAM;
    if (st != UCS_OK) {
      CXR_ERR("rdma: UCX refuses %s=%s: %s", kv[0], kv[1] ? kv[1] : "(none)",
              ucs_status_string(st));
      return false;
    }
  }
  return true;
}

int cxr_rdma_open(cxr_rdma **out, const cxr_rdma_opts *o) {
  return cxr__rdma_open_ucx(out, o, NULL);
}

int cxr__rdma_open_ucx(cxr_rdma **out, const cxr_rdma_opts *o, const char *const *kv) {
  if (out == NULL) return CXR_EINVAL;
  *out = NULL;
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, process_setup);
  cxr_rdma_opts def;
  if (o == NULL) {
    cxr_rdma_opts_init(&def);
    o = &def;
  }
  if (o->pool > POOL_MAX || o->spin_ns < 0 ||
      (o->pin_mode != CXR_RDMA_PIN_AUTO && o->pin_mode != CXR_RDMA_PIN_ALWAYS &&
       o->pin_mode != CXR_RDMA_PIN_NEVER))
    return CXR_EINVAL;
  /* In a fork child of a process that had opened an engine (the hook counted the fork),
   * UCX's own process state is the parent's: an engine opened there connected to nobody (a
   * 3 s connect timed out), so none is made. A child that needs one execs a program. */
  if (atomic_load(&cxr__rdma_fork_epoch) != 1) return CXR_ECLOSED;
  struct sockaddr_in lsa;
  if (o->listen != NULL) {
    int rc = parse_hostport(o->listen, &lsa);
    if (rc) return rc;
  }
  cxr_rdma *r = calloc(1, sizeof *r);
  if (r == NULL) return CXR_ENOMEM;
  r->epoch = atomic_load(&cxr__rdma_fork_epoch);
  atomic_init(&r->refs, 1);  /* the open engine's; kept messages add theirs */
  pthread_mutex_init(&r->lock, NULL);
  pthread_mutex_init(&r->bounce_lock, NULL);
  r->spin_ns = o->spin_ns;
  r->pool_target = o->pool;
  /* Bounds on what peers make us allocate (msg_admit); halved SIZE_MAX keeps the sums of
   * charges from wrapping. */
  r->msg_max = o->msg_max ? o->msg_max : msg_max_default();
  if (r->msg_max > SIZE_MAX / 4) r->msg_max = SIZE_MAX / 4;
  r->queue_max = o->queue_max ? o->queue_max : r->msg_max + ((size_t)1 << 30);
  if (r->queue_max > SIZE_MAX / 2) r->queue_max = SIZE_MAX / 2;
  r->efd = -1;
  int rc = CXR_EIO;

  ucp_config_t *cfg = NULL;
  ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
  if (st != UCS_OK) goto fail;
  tcp_connect_nonblocking(cfg);
  if (!config_modify(cfg, kv)) {
    ucp_config_release(cfg);
    rc = CXR_EINVAL;
    goto fail;
  }
  ucp_params_t cp = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                     .features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_AMO64 |
                                 UCP_FEATURE_WAKEUP,
                     .mt_workers_shared = 1};
  st = ucp_init(&cp, cfg, &r->ctx);
  ucp_config_release(cfg);
  if (st != UCS_OK) {
    CXR_ERR("rdma: ucp_init failed: %s", ucs_status_string(st));
    goto fail;
  }
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_MULTI};
  st = ucp_worker_create(r->ctx, &wp, &r->worker);
  if (st != UCS_OK) {
    CXR_ERR("rdma: ucp_worker_create failed: %s", ucs_status_string(st));
    goto fail;
  }
  st = ucp_worker_get_efd(r->worker, &r->efd);
  if (st != UCS_OK) goto fail;
  rc = cxr__pin_init(r, o);
  if (rc) goto fail;
  /* Every id gets a handler before any peer can reach us; ids nobody set drop their
   * messages. A message for an id UCX has no handler for crashed the receiving process
   * (UCX 1.13, ucp_am_handler_reply; seen when a client sent a message id an older or
   * foreign server did not know), so a peer must not be able to choose one. */
  for (unsigned id = 0; !rc && id <= CXR_RDMA_AM_MAX; id++) rc = cxr__am_set(r, id, NULL, NULL, 0);
  if (!rc) rc = cxr__am_set(r, AM_HELLO, cxr__hello_server, NULL, 0);
  if (!rc) rc = cxr__am_set(r, AM_HELLO_REPLY, cxr__hello_reply, NULL, CXR_RDMA_AM_INLINE);
  if (rc) goto fail;
  if (o->listen != NULL) {
    ucp_listener_params_t lp = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (const struct sockaddr *)&lsa, .addrlen = sizeof lsa},
        .conn_handler = {.cb = cxr__conn_cb, .arg = r}};
    st = ucp_listener_create(r->worker, &lp, &r->listener);
    if (st != UCS_OK) {
      CXR_ERR("rdma: cannot listen on %s: %s", o->listen,
              st == UCS_ERR_BUSY ? "port in use" : ucs_status_string(st));
      rc = st == UCS_ERR_BUSY ? CXR_EBUSY : cxr__rdma_status(st);
      goto fail;
    }
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    if (ucp_listener_query(r->listener, &la) == UCS_OK)
      r->port = ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port);
  }
  if (pthread_create(&r->thread, NULL, progress_main, r) != 0) {
    rc = CXR_ENOMEM;
    goto fail;
  }
  r->thread_started = true;
  *out = r;
  return 0;
fail:
  cxr_rdma_close(r);
  return rc;
}

int cxr_rdma_port(const cxr_rdma *r) { return r ? r->port : 0; }

/* Engines whose close left their UCX worker undestroyed (leave_to_ucx): kept reachable. */
static cxr_rdma *abandoned;
static unsigned abandoned_count;  /* how many so far (cxr__rdma_left_to_ucx) */
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;

/* The end of cxr_rdma_close when endpoints still have one-sided ops pending at a target
 * silent through every bounded wait (ep.c, ep_park), or messages on bare handles are still
 * pending at a client that stopped reading (bare_sends_left): with UCX 1.13 no way to
 * destroy the worker under them is safe (a force close of their endpoint made
 * ucp_worker_destroy assert and the resumed target abort; destroying the worker with them in
 * place asserted too). So the worker and the context, the parked endpoints, the ops and the
 * parked op buffers are left as they are: a bounded leak (the engine's UCX state plus those
 * ops, at most 16 chunks of 64 KiB per timed-out get or put, and the pending messages'
 * buffers), logged, in a case that needs a peer stopped for the whole close. Nothing
 * progresses the worker any more, so nothing reads a caller's data either; a peer that
 * resumes finds its connection open (or reset, once this process exits), not a vanished
 * endpoint. */
static void leave_to_ucx(cxr_rdma *r, unsigned parked, int bare) {
  CXR_WARN("rdma: still with UCX at the close: requests of %u endpoint(s) at a silent "
           "target, %d message(s) to or from clients that stopped; the UCX worker and context "
           "are left undestroyed (UCX 1.13 aborts destroying them)", parked, bare);
  pthread_mutex_lock(&abandoned_lock);
  r->next_abandoned = abandoned;
  abandoned = r;
  abandoned_count++;
  pthread_mutex_unlock(&abandoned_lock);
}

unsigned cxr__rdma_left_to_ucx(void) {
  pthread_mutex_lock(&abandoned_lock);
  unsigned n = abandoned_count;
  pthread_mutex_unlock(&abandoned_lock);
  return n;
}

static bool no_bare(void *arg) {
  cxr_rdma *r = arg;
  return atomic_load(&r->bare_sends) == 0 && atomic_load(&r->bare_recvs) == 0;
}

/* Messages on bare UCX handles (replies and hello answers to clients that connected from our
 * worker address, rpc/remote_server.c posts its call replies) have no endpoint of ours whose
 * close would end them, and UCX 1.13 aborts destroying the worker under one still pending
 * (ucp_ep_destroy_base: proto_reqs not empty; rdma_test, close_silent_test). They get
 * the worker progressed for them, up to 1 s (one to a reading client ends in microseconds; a
 * large one goes by rendezvous, a round trip or two); so do rendezvous receives of messages
 * from such clients. Returns how many are still left (a client that stopped: the close then
 * leaves the worker to UCX, with the receive buffers its requests hold). Such a receive is
 * not cancelled by force-closing UCX's handle: a warm client stopped mid-send then aborted
 * when it resumed (UCX 1.13: tcp_iface.c "ep->conn_state != UCT_TCP_EP_CONN_STATE_CLOSED"),
 * 3 runs in 3. */
static int bare_left(cxr_rdma *r) {
  cxr__progress_until(r, no_bare, r, cxr_now_ns() + 1000000000);
  return atomic_load(&r->bare_sends) + atomic_load(&r->bare_recvs);
}

void cxr_rdma_close(cxr_rdma *r) {
  /* In a child made by fork(2) the engine is a copy of the parent's: its progress thread is
   * not there to join, and its sockets are the parent's, so closing it would hang the child
   * or end the parent's endpoints. The copy is left alone (the child's exit drops it). */
  if (r == NULL || cxr__rdma_copy(r)) return;
  atomic_store(&r->stop, true); /* (also read by am_recv_cb while the waits below progress) */
  if (r->thread_started) {
    cxr__wake(r);
    pthread_join(r->thread, NULL);
  }
  if (r->listener) ucp_listener_destroy(r->listener);
  if (r->worker) {
    /* No more pool refills: every host is forgotten before the endpoints go. */
    pthread_mutex_lock(&r->lock);
    for (rdma_host *h = r->hosts; h; h = h->next) h->valid = false;
    pthread_mutex_unlock(&r->lock);
    drop_messages(r);  /* nobody serves them now; they hold endpoints */
    run_queued(r);
    cxr__eps_close_all(r);
  }
  unsigned parked = r->worker ? cxr__eps_unpark(r, 200000000) : 0;  /* one last wait */
  int bare = r->worker ? bare_left(r) : 0;
  /* Closed endpoints whose requests outlived their close (force-closed rendezvous sends
   * UCX 1.13 may never end): destroying the worker drops those requests unended. */
  unsigned orphans = r->worker ? cxr__eps_orphans_left(r, cxr_now_ns() + 200000000) : 0;
  /* After those waits, which progress the worker: messages that came meanwhile are not
   * served (their handlers would reply through endpoints closed by then), and the error
   * handling an endpoint that failed meanwhile deferred (with an argument it allocated)
   * runs, or the argument would be freed below without it. */
  drop_messages(r);
  if (r->worker) run_queued(r);
  atomic_store(&r->closed, true);  /* kept messages that outlive the close see it */
  cxr__pin_fini(r);
  /* Messages and work nobody will run any more. */
  drop_messages(r);
  while (r->dq_head) {
    rdma_defer *d = r->dq_head;
    r->dq_head = d->next;
    free(d);
  }
  for (rdma_host *h = r->hosts, *n; h; h = n) {
    n = h->next;
    for (unsigned i = 0; i < h->nexps; i++) free(h->exps[i].rkey);
    free(h->exps);
    free(h->waddr);
    free(h);
  }
  if (parked || bare || orphans) {
    leave_to_ucx(r, parked + orphans, bare); /* kept reachable, never freed (r->refs > 0) */
    return;
  }
  if (r->worker) ucp_worker_destroy(r->worker);
  if (r->ctx) ucp_cleanup(r->ctx);
  /* UCX is gone: nothing can write into the parked ops' buffers any more. */
  for (rdma_op *op = r->graves, *n; op; op = n) {
    n = op->next;
    op_free(op);
  }
  /* Messages still kept hold the struct (and the lock their endpoints are dropped under):
   * the last one freed frees it. */
  engine_put(r);
}
