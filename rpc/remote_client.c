/*
 * Calls across racks over UCX (cxrpc/rdma.h), behind the same API as calls in the pod.
 *
 * Memory: the client's connection heap (in its pod's slice of the address window) has a
 * replica in the server at the same address; the server's result heap for the connection
 * (in the server pod's slice) has a replica in the client at the same address. Pods own
 * disjoint slices (CXRPC_POD), so both replicas land on addresses that are free on the
 * other side. A call ships exactly the byte ranges of the argument graph into the server's
 * replica (cxr_call_opts.ranges; default: the heap block at args) together with the call
 * in one active message; the reply ships the result graph's ranges
 * (cxr_call_set_result_ranges; default: the block at *result) into the client's replica.
 * Pointers stay valid on both sides, nothing is serialized.
 *
 * Results live in the server's heap: the client gives them back with cxr_conn_free (the
 * release rides on the next call); closing the connection frees them all.
 *
 * Threads: server handlers run on the listener's progress thread (one at a time per
 * channel). Client calls busy-poll the UCX worker from the calling thread (the lowest
 * latency), then back off; the progress thread sweeps deadlines of futures with callbacks.
 * Every length, range and pointer a peer sends is checked before use.
 */
/* This file: the client half. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "rpc/remote_int.h"

struct cxr__rconn {
  struct cxr__rconn *next;
  cxr_conn *c;
  uint64_t token, conn_id;
  cxr_rdma_ep *ep;
  char host[80], chan[CXR__CHAN_NAME_MAX + 1];
  uintptr_t hc_addr, rs_addr;
  size_t hc_size, rs_size;
  bool rs_mapped;
  int open_done;  /* atomic */
  int close_done; /* atomic: the server let go of our heap's replica */
  bool open_sent;
  r_open_rep open_rep;
  int cb_queued;  /* atomic: callbacks handed to the progress thread and not yet returned */
  uint64_t *rel;  /* result roots to give back (under c->lock) */
  uint32_t nrel;
};

/* The process's UCX engine for remote clients: made on first use, kept for the process's
 * life so that its fast-connect directory outlives single connections. */
static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;
static cxr_rdma *engine;  /* set once, never freed */
static spares client_spares = {.lock = PTHREAD_MUTEX_INITIALIZER};
static cxr_rdma *eng(void) { return __atomic_load_n(&engine, __ATOMIC_ACQUIRE); }
static struct cxr__rconn *rt_conns;

static struct cxr__rconn *find_conn(uint64_t token) {
  for (struct cxr__rconn *r = rt_conns; r; r = r->next)
    if (r->token == token) return r;
  return NULL;
}

/* A token for a new connection (under rt_lock): random and unused here. Replies are matched
 * to connections by it, and the server wants it with every call, so a peer that never saw
 * it can neither answer our calls nor act on our connection (tokens were 1, 2, 3...). */
static uint64_t new_token(void) {
  for (;;) {
    uint64_t t = 0;
    if (getrandom(&t, sizeof t, 0) != (ssize_t)sizeof t) { /* no entropy: still unique */
      static uint64_t fallback;
      t = (uint64_t)cxr_now_ns() ^ ((uint64_t)getpid() << 32) ^ ++fallback;
    }
    if (t != 0 && find_conn(t) == NULL) return t;
  }
}

static bool final(uint32_t s) { return s == CXR__F_DONE || s == CXR__F_ORPHAN; }

static void run_cb(void *arg) {
  cxr_future *f = arg;
  struct cxr__rconn *rc = f->c->remote; /* (the callback may free f) */
  f->taken = true;
  f->cb(f->err, f->result, f->cb_user);
  __atomic_sub_fetch(&rc->cb_queued, 1, __ATOMIC_SEQ_CST);
}

/* Hands the armed callback of the call of generation gen to be run (exactly once). */
static void fire(cxr_future *f, uint32_t gen) {
  if (!cxr__cb_fire(f, gen)) return;
  struct cxr__rconn *rc = f->c->remote;
  __atomic_add_fetch(&rc->cb_queued, 1, __ATOMIC_SEQ_CST);
  if (cxr__rdma_defer_quiet(eng(), run_cb, f) != 0) /* no wake-up: we may hold rt_lock */
    __atomic_sub_fetch(&rc->cb_queued, 1, __ATOMIC_SEQ_CST);
}

/* Ends a pending call locally; on true, *id (if not NULL) gets its call id as read while the
 * entry was still ours (the owner may free the future and call again on the entry as soon as
 * the outcome is out: a CANCEL must name the call that ended, not the next one). */
static bool expire(cxr_future *f, int err, uint64_t *id) {
  uint64_t mine;
  if (!cxr__future_orphan(f, err, &mine)) return false;
  if (id != NULL) *id = mine;
  fire(f, (uint32_t)(mine >> 32));
  return true;
}

/* Tells the server we gave up on f: it does not run the call if it still waits for a worker,
 * and a running handler sees it (cxr_call_cancelled). Only from user threads, never the
 * progress thread (the send may wait, at most 10 ms). Best effort: a lost CANCEL only means
 * the handler runs to its end and its answer is discarded. */
static void tell_server(cxr_conn *c, uint64_t call_id) {
  struct cxr__rconn *rc = c->remote;
  if (rc == NULL || rc->ep == NULL || __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE)) return;
  r_cancel m = {.magic = R_MAGIC, .conn_id = rc->conn_id, .token = rc->token,
                .call_id = call_id};
  int err = cxr_rdma_am_send(rc->ep, R_CANCEL, &m, sizeof m, NULL, 0, cxr_now_ns() + 10000000);
  if (err) CXR_DEBUG("remote %s: cancel not sent: %s", rc->chan, cxr_strerror(err));
}

/* Puts a FREE entry back on the free list. */
static void entry_push(cxr_future *f) {
  cxr_conn *c = f->c;
  pthread_mutex_lock(&c->lock);
  c->free_idx[c->nfree++] = f->index;
  pthread_mutex_unlock(&c->lock);
}

static void entry_release(cxr_future *f) {
  __atomic_store_n(&f->state, CXR__F_FREE, __ATOMIC_RELEASE);
  entry_push(f);
}

static void queue_release(cxr_conn *c, uint64_t root) {
  if (root == 0) return;
  struct cxr__rconn *rc = c->remote;
  pthread_mutex_lock(&c->lock);
  if (rc->nrel < R_MAX_REL) rc->rel[rc->nrel++] = root;
  else CXR_WARN("remote %s: too many results not given back; the server keeps one", rc->chan);
  pthread_mutex_unlock(&c->lock);
}

static void fail_all(cxr_conn *c, int err) {
  for (uint32_t i = 0; c->tab && i < c->ntab; i++) expire(&c->tab[i], err, NULL);
}

static void on_ep_error(cxr_rdma_ep *ep, int err, void *user) {
  cxr_conn *c = user;
  int zero = 0;
  if (err == CXR_ENOTCONN) err = CXR_EPEERDEAD;  /* the server's host or process is gone */
  __atomic_compare_exchange_n(&c->dead, &zero, err, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  fail_all(c, __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE));
}

/* Inline (inside UCX's callback): the answer to an open. */
static void on_open_rep(cxr_rdma_msg *m, void *user) {
  size_t hl;
  const r_open_rep *h = cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h || h->magic != R_MAGIC) return;
  pthread_mutex_lock(&rt_lock);
  struct cxr__rconn *rc = find_conn(h->token);
  if (rc && !__atomic_load_n(&rc->open_done, __ATOMIC_ACQUIRE)) {
    rc->open_rep = *h;
    __atomic_store_n(&rc->open_done, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&rt_lock);
}

/* Inline: the server has dropped the connection (and its replica of our heap). */
static void on_close_rep(cxr_rdma_msg *m, void *user) {
  size_t hl;
  const r_close *h = cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h || h->magic != R_MAGIC) return;
  pthread_mutex_lock(&rt_lock);
  struct cxr__rconn *rc = find_conn(h->token);
  if (rc) __atomic_store_n(&rc->close_done, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&rt_lock);
}

/* Checks the reply's ranges against our two heaps and copies them in. */
static int land_result(struct cxr__rconn *rc, const r_call_rep *h, const char *d, size_t dl) {
  if (h->nranges > R_MAX_RANGES || dl / sizeof(r_range) < h->nranges) return CXR_EPROTO;
  const r_range *tab = (const r_range *)d;
  size_t off = h->nranges * sizeof(r_range), total = 0;
  for (uint32_t i = 0; i < h->nranges; i++) {
    r_range g;
    memcpy(&g, &tab[i], sizeof g);
    if (!cxr__rem_inside(g.addr, g.len, rc->rs_addr, rc->rs_size) &&
        !cxr__rem_inside(g.addr, g.len, rc->hc_addr, rc->hc_size))
      return CXR_EBADPTR;
    if (g.len > dl - off - total) return CXR_EPROTO;
    total += g.len;
  }
  if (off + total != dl) return CXR_EPROTO;
  if (h->result != 0 && !cxr__rem_inside(h->result, 1, rc->rs_addr, rc->rs_size)) return CXR_EBADPTR;
  for (uint32_t i = 0; i < h->nranges; i++) {
    r_range g;
    memcpy(&g, &tab[i], sizeof g);
    memcpy((void *)(uintptr_t)g.addr, d + off, g.len);
    off += g.len;
  }
  return 0;
}

/* Inline: the answer to a call. */
static void on_call_rep(cxr_rdma_msg *m, void *user) {
  size_t hl, dl;
  const r_call_rep *h = cxr_rdma_msg_hdr(m, &hl);
  const char *d = cxr_rdma_msg_data(m, &dl);
  if (hl != sizeof *h || h->magic != R_MAGIC) return;
  pthread_mutex_lock(&rt_lock);  /* holds off a close while we write into its memory */
  struct cxr__rconn *rc = find_conn(h->token);
  if (rc == NULL) goto out;
  cxr_conn *c = rc->c;
  uint32_t idx = (uint32_t)h->call_id, gen = (uint32_t)(h->call_id >> 32);
  if (idx >= c->ntab || gen == 0) goto out;
  cxr_future *f = &c->tab[idx];
  int status = h->status;
  if (status > 0 || status < CXR_ERRNO_MIN) status = CXR_EPROTO;
  /* The generation is compared and the state taken under c->lock, which a new call holds
   * while it readies an entry (cxr__future_reset to PENDING): a late reply never takes an
   * entry that carries another call, not even for a moment (a review found one holding a
   * live call's entry BUSY, which fail_all, cancel and poll then misread). Futures leave
   * their states without the lock, so BUSY (an expire under way) is waited out. */
  uint32_t s = CXR__F_FREE;
  pthread_mutex_lock(&c->lock);
  bool ours = __atomic_load_n(&f->gen, __ATOMIC_RELAXED) == gen;
  while (ours) {
    s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
    uint32_t to = s == CXR__F_PENDING ? CXR__F_BUSY : s == CXR__F_ORPHAN ? CXR__F_DONE : s;
    if (s == CXR__F_BUSY) {
      cxr__cpu_relax();
      continue;
    }
    if (to == s || __atomic_compare_exchange_n(&f->state, &s, to, false, __ATOMIC_SEQ_CST,
                                               __ATOMIC_ACQUIRE))
      break;
  }
  pthread_mutex_unlock(&c->lock);
  if (ours && s == CXR__F_PENDING) { /* the answer, ours to deliver (BUSY) */
    void *result = (void *)(uintptr_t)h->result;
    int lr = land_result(rc, h, d, dl);
    if (lr) {
      CXR_WARN("remote %s: bad reply: %s", rc->chan, cxr_strerror(lr));
      queue_release(c, h->result);
      status = lr;
      result = NULL;
    }
    f->err = status;
    f->result = status == 0 ? result : NULL;
    if (status != 0 && result != NULL && lr == 0) queue_release(c, h->result);
    __atomic_store_n(&f->state, CXR__F_DONE, __ATOMIC_SEQ_CST);
    fire(f, gen);
  } else if (!ours || s != CXR__F_DONE) {
    /* Late: its caller gave up (ORPHAN, now DONE with the caller's error: nobody reads the
     * result), or freed the future (FREE: the entry goes back at once,
     * cxr__remote_future_free), or the entry carries a newer call. The result goes back to
     * the server. DONE: a second reply to one call (a broken server): the first one's
     * result stays. */
    queue_release(c, h->result);
    if (ours && s == CXR__F_ORPHAN) fire(f, gen);
  }
out:
  pthread_mutex_unlock(&rt_lock);
}

/* Deadlines of futures nobody waits on (callbacks armed): swept by the progress thread. */
static void sweep(void *user) {
  int64_t now = cxr_now_ns();
  pthread_mutex_lock(&rt_lock);
  for (struct cxr__rconn *rc = rt_conns; rc; rc = rc->next) {
    cxr_conn *c = rc->c;
    for (uint32_t i = 0; i < c->ntab; i++) {
      cxr_future *f = &c->tab[i];
      /* (the deadline atomically: the entry's owner may be writing the next call's) */
      if (__atomic_load_n(&f->state, __ATOMIC_ACQUIRE) != CXR__F_PENDING ||
          now < __atomic_load_n(&f->deadline, __ATOMIC_RELAXED))
        continue;
      /* Looked at again under c->lock, which a new call holds while it readies the entry:
       * the call that was due may have ended and its entry carry a new one (which this
       * timed out, until a review of 2026-11-28). Its callback fires outside the lock. */
      uint64_t id;
      pthread_mutex_lock(&c->lock);
      bool ended = now >= __atomic_load_n(&f->deadline, __ATOMIC_RELAXED) &&
                   cxr__future_orphan(f, CXR_ETIMEDOUT, &id);
      pthread_mutex_unlock(&c->lock);
      if (ended) fire(f, (uint32_t)(id >> 32));
    }
  }
  pthread_mutex_unlock(&rt_lock);
}

/* Lock order: UCX's own locks, then rt_lock, then a connection's lock. So UCX is never
 * called with rt_lock held (the engine is made under a lock of its own). */
static pthread_mutex_t rt_make_lock = PTHREAD_MUTEX_INITIALIZER;

/* At exit the engine's progress thread must stop before UCX's own destructors run. */
static void engine_at_exit(void) {
  pthread_mutex_lock(&rt_make_lock);
  cxr_rdma *r = __atomic_exchange_n(&engine, NULL, __ATOMIC_ACQ_REL);
  pthread_mutex_unlock(&rt_make_lock);
  if (r) cxr_rdma_close(r);
  cxr__rem_spares_drop(&client_spares);
}

static int runtime(cxr_rdma **out) {
  pthread_mutex_lock(&rt_make_lock);
  int rc = 0;
  cxr_rdma *r = eng();
  if (r == NULL) {
    cxr_rdma_opts o;
    cxr_rdma_opts_init(&o);
    rc = cxr_rdma_open(&r, &o);
    if (rc == 0) rc = cxr__am_set(r, R_OPEN_REP, on_open_rep, NULL, CXR_RDMA_AM_INLINE);
    if (rc == 0) rc = cxr__am_set(r, R_CALL_REP, on_call_rep, NULL, CXR_RDMA_AM_INLINE);
    if (rc == 0) rc = cxr__am_set(r, R_CLOSE_REP, on_close_rep, NULL, CXR_RDMA_AM_INLINE);
    if (rc == 0) cxr__rdma_set_tick(r, sweep, NULL);
    if (rc != 0 && r) {
      cxr_rdma_close(r);
      r = NULL;
    }
    if (r) {
      __atomic_store_n(&engine, r, __ATOMIC_RELEASE);
      atexit(engine_at_exit);
    }
  }
  *out = r;
  pthread_mutex_unlock(&rt_make_lock);
  return rc;
}

/* Busy-polls the worker until f is final, `until` passes (CXR_EAGAIN) or its deadline
 * (the future then ends with CXR_ETIMEDOUT). */
static int rwait(cxr_conn *c, cxr_future *f, int64_t until) {
  cxr_rdma *rt = eng();
  int64_t start = cxr_now_ns();
  int rc = 0;
  cxr__rdma_waiter(rt, 1);
  for (;;) {
    if (final(__atomic_load_n(&f->state, __ATOMIC_ACQUIRE))) break;
    unsigned n = cxr__rdma_progress(rt);
    if (final(__atomic_load_n(&f->state, __ATOMIC_ACQUIRE))) break;
    int64_t now = cxr_now_ns();
    if (now >= f->deadline) {
      uint64_t id;
      if (expire(f, CXR_ETIMEDOUT, &id)) {
        CXR__ADD(&c->slot->cli.timeouts, 1);
        tell_server(c, id);
      }
      continue;
    }
    int dead = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
    if (dead) {
      expire(f, dead, NULL);
      continue;
    }
    if (now >= until) {
      rc = CXR_EAGAIN;
      break;
    }
    if (n == 0 && now - start > 200000) {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
  cxr__rdma_waiter(rt, -1);
  return rc;
}

static void rconn_free(cxr_conn *c) {
  struct cxr__rconn *rc = c->remote;
  if (rc) {
    pthread_mutex_lock(&rt_lock);
    for (struct cxr__rconn **pp = &rt_conns; *pp; pp = &(*pp)->next)
      if (*pp == rc) {
        *pp = rc->next;
        break;
      }
    pthread_mutex_unlock(&rt_lock);
    if (rc->ep) cxr_rdma_ep_close(rc->ep);
    if (rc->rs_mapped) cxr__rem_replica_unmap(rc->rs_addr, rc->rs_size);
    /* The heap may serve the next connection only once no server holds a replica of it
     * (or none ever did): otherwise that server would refuse the same range. */
    bool reusable = __atomic_load_n(&rc->close_done, __ATOMIC_ACQUIRE) || !rc->open_sent;
    free(rc->rel);
    free(rc);
    if (!reusable && c->heap) {
      cxr_heap_close(c->heap);
      c->heap = NULL;
    }
  }
  free(c->slot);
  cxr__conn_table_fini(c);
  cxr__rem_spare_give(&client_spares, c->heap);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->qlock);
  free(c);
}

/* A connect that fails after its OPEN went out (deadline, a refused replica) tells the
 * server to drop what the OPEN made there, without waiting for the answer: with a pooled
 * endpoint the server hears of no endpoint failure, so the connection would otherwise stay
 * until the channel closes. Without the OPEN's answer the server knows it by our token and
 * heap address; the OPEN, sent before on the same endpoint, reaches it first. */
static void abandon_open(struct cxr__rconn *x) {
  bool answered = __atomic_load_n(&x->open_done, __ATOMIC_ACQUIRE) && x->open_rep.status == 0;
  r_close cl = {.magic = R_MAGIC, .conn_id = answered ? x->open_rep.conn_id : 0,
                .token = x->token, .heap_addr = x->hc_addr};
  int rc = cxr_rdma_am_post(x->ep, R_CLOSE, &cl, sizeof cl, NULL, 0);
  if (rc) CXR_DEBUG("remote %s: close after a failed connect not sent: %s", x->chan,
                    cxr_strerror(rc));
}

int cxr__remote_connect(cxr_conn **out, const char *target, const cxr_conn_opts *o) {
  char host[80], chan[CXR__CHAN_NAME_MAX + 1];
  int rc = cxr__rem_parse_target(target, host, sizeof host, chan, sizeof chan);
  if (rc) return rc;
  int64_t deadline = cxr__after(cxr_now_ns(), o->connect_timeout_ns);
  cxr_rdma *r;
  if ((rc = runtime(&r)) != 0) return rc;
  rc = cxr_init(NULL);
  if (rc != 0 && rc != CXR_EBUSY) return rc;

  cxr_conn *c = calloc(1, sizeof *c);
  if (c != NULL) c->fork_epoch = cxr__fork_epoch;
  struct cxr__rconn *x = calloc(1, sizeof *x);
  cxr__cslot *slot = calloc(1, sizeof *slot);  /* counters only: nobody else reads them */
  if (c == NULL || x == NULL || slot == NULL) {
    free(c), free(x), free(slot);
    return CXR_ENOMEM;
  }
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->qlock, NULL);
  c->transport = CXR__TRANSPORT_UCX;
  c->default_deadline = o->default_deadline_ns;
  c->peer_timeout = o->peer_timeout_ns;
  c->slot = slot;
  c->remote = x;
  x->c = c;
  snprintf(x->host, sizeof x->host, "%s", host);
  snprintf(x->chan, sizeof x->chan, "%s", chan);
  x->rel = calloc(R_MAX_REL, sizeof *x->rel);
  if (x->rel == NULL || (rc = cxr__conn_table_init(c, R_CALLS_IN_FLIGHT)) != 0) {
    rc = rc ? rc : CXR_ENOMEM;
    goto fail;
  }
  /* Our connection heap: an empty one left by an earlier connection, or a new one. */
  size_t heap_size = cxr__remote_heap_bytes();
  c->heap = cxr__rem_spare_take(&client_spares, heap_size);
  if (c->heap == NULL && (rc = cxr__rem_heap_new(&c->heap, "rc", chan, heap_size)) != 0)
    goto fail;
  x->hc_addr = (uintptr_t)cxr_heap_base(c->heap);
  x->hc_size = cxr_heap_size(c->heap);

  bool retried = false;
again:
  if ((rc = cxr_rdma_connect(r, host, deadline, &x->ep)) != 0) {
    CXR_INFO("remote: cannot reach %s: %s", host, cxr_strerror(rc));
    goto fail;
  }
  pthread_mutex_lock(&rt_lock);
  x->token = new_token();
  x->next = rt_conns;
  rt_conns = x;
  pthread_mutex_unlock(&rt_lock);
  cxr_rdma_ep_on_error(x->ep, on_ep_error, c);
  if (cxr_rdma_ep_status(x->ep) != 0)  /* it failed before we listened */
    on_ep_error(x->ep, cxr_rdma_ep_status(x->ep), c);

  r_open op = {.magic = R_MAGIC, .version = 1, .token = x->token, .heap_addr = x->hc_addr,
               .heap_size = x->hc_size};
  snprintf(op.chan, sizeof op.chan, "%s", chan);
  char hn[40] = "";
  gethostname(hn, sizeof hn - 1);
  snprintf(op.who, sizeof op.who, "%.40s/%d", hn, (int)getpid());
  x->open_sent = true;
  rc = cxr_rdma_am_send(x->ep, R_OPEN, &op, sizeof op, NULL, 0, deadline);
  if (rc == 0) {
    cxr__rdma_waiter(r, 1);
    while (!__atomic_load_n(&x->open_done, __ATOMIC_ACQUIRE) && cxr_now_ns() < deadline &&
           !__atomic_load_n(&c->dead, __ATOMIC_ACQUIRE))
      if (cxr__rdma_progress(r) == 0) usleep(20);
    cxr__rdma_waiter(r, -1);
    if (!__atomic_load_n(&x->open_done, __ATOMIC_ACQUIRE)) {
      rc = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
      if (rc == 0) rc = CXR_ETIMEDOUT;
    } else {
      rc = x->open_rep.status;
      if (rc > 0 || rc < CXR_ERRNO_MIN) rc = CXR_EPROTO;
    }
  }
  if (rc && (rc == CXR_EPEERDEAD || rc == CXR_ENOTCONN) && !retried && cxr_now_ns() < deadline) {
    /* The directory may still know a server process that has since gone (a restart on
     * the same port, noticed by nobody yet): forget it and connect once more, cold. */
    retried = true;
    pthread_mutex_lock(&rt_lock);
    for (struct cxr__rconn **pp = &rt_conns; *pp; pp = &(*pp)->next)
      if (*pp == x) {
        *pp = x->next;
        break;
      }
    pthread_mutex_unlock(&rt_lock);
    cxr_rdma_ep_close(x->ep);
    x->ep = NULL;
    cxr_rdma_forget(r, host);
    __atomic_store_n(&c->dead, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&x->open_done, 0, __ATOMIC_RELEASE);
    CXR_INFO("remote: %s went away since we knew it; connecting again", host);
    goto again;
  }
  if (rc) {
    CXR_INFO("remote: open of %s on %s failed: %s", chan, host, cxr_strerror(rc));
    goto fail;
  }
  x->conn_id = x->open_rep.conn_id;
  x->rs_addr = x->open_rep.rs_addr;
  x->rs_size = x->open_rep.rs_size;
  rc = x->rs_size == 0 || x->rs_size > (64ull << 30) ? CXR_EPROTO  /* a peer's word: bound it */
                                                    : cxr__rem_replica_map(x->rs_addr, x->rs_size);
  if (rc != 0) goto fail;
  x->rs_mapped = true;
  *out = c;
  return 0;
fail:
  if (x->open_sent && x->ep) abandon_open(x);
  rconn_free(c);
  return rc;
}

int cxr__remote_call_async(cxr_conn *c, uint32_t method, const void *args, cxr_future **out,
                           const cxr_call_opts *o) {
  struct cxr__rconn *rc = c->remote;
  cxr_call_opts def;
  if (o == NULL) {
    cxr_call_opts_init(&def);
    o = &def;
  }
  if (o->deadline_ns < 0 || (o->flags & ~(unsigned)(CXR_CALL_SEAL | CXR_CALL_INLINE)) ||
      (o->flags & (CXR_CALL_SEAL | CXR_CALL_INLINE)) == (CXR_CALL_SEAL | CXR_CALL_INLINE) ||
      (o->ranges == NULL && o->nranges != 0) || o->nranges > R_MAX_RANGES)
    return CXR_EINVAL; /* SEAL|INLINE: refused as in the pod, where it cannot work */
  /* The ranges to ship: given, or the heap block at args. Sealing has nothing to protect
   * here: the server reads its own private replica. */
  cxr_range one;
  const cxr_range *rg = o->ranges;
  size_t nr = o->nranges, inl = 0;
  if (o->flags & CXR_CALL_INLINE) {
    if (o->arg_len > CXR__INLINE_MAX || (args == NULL && o->arg_len)) return CXR_EINVAL;
    inl = o->arg_len;
  } else if (args != NULL) {
    size_t len = o->arg_len ? o->arg_len : cxr_heap_usable_size(c->heap, args);
    if (len == 0 || !cxr_heap_contains(c->heap, args, len)) return CXR_EBADPTR;
    if (rg == NULL) {
      one = (cxr_range){args, len};
      rg = &one;
      nr = 1;
    }
  } else if (o->arg_len) {
    return CXR_EINVAL;
  }
  size_t bytes = 0;
  for (size_t i = 0; i < nr; i++) {
    if (rg[i].len && !cxr_heap_contains(c->heap, rg[i].p, rg[i].len)) return CXR_EBADPTR;
    bytes += rg[i].len;
  }
  if (bytes > rc->hc_size) return CXR_EINVAL;
  int dead = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
  if (dead) return dead;

  int64_t now = cxr_now_ns(), rel = o->deadline_ns ? o->deadline_ns : c->default_deadline;
  pthread_mutex_lock(&c->lock);
  cxr_future *f = c->nfree ? &c->tab[c->free_idx[--c->nfree]] : NULL;
  uint32_t nrel = rc->nrel;
  /* One allocation owned by the send: range table, releases, inline bytes, iov array. */
  size_t meta = nr * sizeof(r_range) + nrel * sizeof(uint64_t) + inl;
  char *own = f ? malloc(meta + (nr + 1) * sizeof(struct iovec)) : NULL;
  if (own) {
    memcpy(own + nr * sizeof(r_range), rc->rel, nrel * sizeof(uint64_t));
    rc->nrel = 0;
    /* Readied under the lock: a late reply or the sweep looks at an entry's generation
     * and state under it too (on_call_rep, sweep). */
    cxr__future_reset(f);
    __atomic_store_n(&f->deadline, cxr__after(now, rel), __ATOMIC_RELAXED); /* (sweep) */
    __atomic_store_n(&f->state, CXR__F_PENDING, __ATOMIC_RELEASE);
  } else if (f) {
    c->free_idx[c->nfree++] = f->index;
    f = NULL;
  }
  pthread_mutex_unlock(&c->lock);
  if (f == NULL) return own == NULL && c->nfree ? CXR_ENOMEM : CXR_EFULL;

  r_range *tab = (r_range *)own;
  struct iovec *iov = (struct iovec *)(own + meta);
  for (size_t i = 0; i < nr; i++) tab[i] = (r_range){(uint64_t)(uintptr_t)rg[i].p, rg[i].len};
  if (inl) memcpy(own + nr * sizeof(r_range) + nrel * sizeof(uint64_t), args, inl);
  size_t niov = 0;
  iov[niov++] = (struct iovec){own, meta};
  for (size_t i = 0; i < nr; i++)
    if (rg[i].len) iov[niov++] = (struct iovec){(void *)rg[i].p, rg[i].len};
  r_call h = {.magic = R_MAGIC, .method = method, .conn_id = rc->conn_id,
              .call_id = cxr__future_call_id(f), .token = rc->token,
              .args = inl ? 0 : (uint64_t)(uintptr_t)args, .arg_len = inl ? inl : o->arg_len,
              .deadline_rel = rel, .flags = o->flags & ~(unsigned)CXR_CALL_SEAL,
              .nranges = (uint32_t)nr, .nrel = nrel, .inline_len = (uint32_t)inl};
  if (o->ranges == NULL && args != NULL && !inl) h.arg_len = rg[0].len;
  int err = cxr__am_send_owned(rc->ep, R_CALL, &h, sizeof h, iov, niov, own, f->deadline);
  if (err) {
    /* Not sent (or not within the deadline): the call ends here. A send that gave up at its
     * deadline is still UCX's and may go out later (a receiver that does not take a large
     * argument in time): the server is told not to run it, as for a reply that came late.
     * (It counts the deadline from the call's arrival, so it would run it.) */
    uint64_t id = cxr__future_call_id(f); /* (f is still this thread's alone) */
    expire(f, err, NULL);
    int d = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
    if (err == CXR_ETIMEDOUT) tell_server(c, id);
    /* The entry goes back now, as any freed orphan's does (a late reply, if the call went
     * out after all, gives its result back). Until 2026-11-28 a refused call's entry (the
     * receiver's message or queue bound: CXR_EFULL) waited for a reply that never came,
     * and 256 of them left a live connection answering every call with CXR_EFULL. */
    cxr_future_free(f);
    CXR__ADD(&c->slot->cli.errors, 1);
    return d ? d : err;
  }
  CXR__ADD(&c->slot->cli.calls, 1);
  *out = f;
  return 0;
}

int cxr__remote_call(cxr_conn *c, uint32_t method, const void *args, void **result,
                     const cxr_call_opts *o) {
  cxr_future *f;
  int rc = cxr__remote_call_async(c, method, args, &f, o);
  if (rc != 0) return rc;
  rwait(c, f, INT64_MAX);
  rc = f->err;
  if (result != NULL) {
    *result = f->result;
    f->taken = true;
  }
  cxr_future_free(f);
  return rc;
}

int cxr__remote_future_poll(cxr_future *f, void **result) {
  cxr_conn *c = f->c;
  if (!final(__atomic_load_n(&f->state, __ATOMIC_ACQUIRE))) rwait(c, f, 0);
  if (!final(__atomic_load_n(&f->state, __ATOMIC_ACQUIRE))) return CXR_EAGAIN;
  if (result) {
    *result = f->result;
    f->taken = true;
  }
  return f->err;
}

int cxr__remote_future_wait(cxr_future *f, int64_t timeout_ns, void **result) {
  int64_t until = timeout_ns == 0 ? INT64_MAX : cxr__after(cxr_now_ns(), timeout_ns);
  if (rwait(f->c, f, until) != 0) return CXR_EAGAIN;
  if (result) {
    *result = f->result;
    f->taken = true;
  }
  return f->err;
}

int cxr__remote_future_then(cxr_future *f, void (*cb)(int, void *, void *), void *user) {
  uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
  if (s == CXR__F_FREE || s == CXR__F_ABANDONED) return CXR_EINVAL;
  if (cxr__cb_state(f) != CXR__CB_NONE) return CXR_EBUSY;
  if (final(s)) {
    cxr__cb_set(f, CXR__CB_FIRED);
    f->taken = true;
    cb(f->err, f->result, user);
    return 0;
  }
  f->cb = cb;
  f->cb_user = user;
  cxr__cb_set(f, CXR__CB_ARMED);
  if (final(__atomic_load_n(&f->state, __ATOMIC_SEQ_CST)))
    fire(f, __atomic_load_n(&f->gen, __ATOMIC_RELAXED));
  return 0;
}

int cxr__remote_future_cancel(cxr_future *f) {
  uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
  if (s == CXR__F_FREE || s == CXR__F_ABANDONED) return CXR_EINVAL;
  uint64_t id;
  if (expire(f, CXR_ECANCELED, &id)) {
    CXR__ADD(&f->c->slot->cli.cancels, 1);
    tell_server(f->c, id);
    return 0;
  }
  return CXR_EBUSY;
}

void cxr__remote_future_free(cxr_future *f) {
  uint64_t id;
  for (;;) {
    uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
    switch (s) {
      case CXR__F_PENDING:
        if (expire(f, CXR_ECANCELED, &id)) tell_server(f->c, id);
        continue;
      case CXR__F_DONE:
        if (!f->taken && f->result != NULL) queue_release(f->c, (uint64_t)(uintptr_t)f->result);
        entry_release(f);
        return;
      case CXR__F_ORPHAN:
        /* Back at once: a late reply, if any, finds it FREE or a newer generation and only
         * gives its result back. Until 2026-11-28 the entry waited for that reply
         * (ABANDONED), and kept it for good when none came (a reply the server dropped or
         * refused): after 256 such calls a live connection answered every call CXR_EFULL.
         * A CAS: a late reply may be making it DONE meanwhile. */
        if (!__atomic_compare_exchange_n(&f->state, &s, CXR__F_FREE, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
          continue;
        entry_push(f);
        return;
      case CXR__F_BUSY:
        continue;
      default:
        return;
    }
  }
}

/* Whether the progress thread is done with c's futures: no answer being delivered (BUSY)
 * and no callback handed over and not yet returned. */
static bool quiet(cxr_conn *c) {
  for (uint32_t i = 0; i < c->ntab; i++)
    if (__atomic_load_n(&c->tab[i].state, __ATOMIC_SEQ_CST) == CXR__F_BUSY) return false;
  return __atomic_load_n(&c->remote->cb_queued, __ATOMIC_SEQ_CST) == 0; /* (after the scan) */
}

/* Waits up to 1 s for quiet(c). */
static bool wait_quiet(cxr_conn *c) {
  for (int i = 0; i < 2000 && !quiet(c); i++) usleep(500);
  return quiet(c);
}

void cxr__remote_close(cxr_conn *c) {
  struct cxr__rconn *rc = c->remote;
  /* Calls made from here on fail at once, as in the pod (conn.c): a callback fail_all
   * fires may call again, and that call's future would go with the table, never to end
   * (until an audit of 2026-11-28). */
  int zero = 0;
  __atomic_compare_exchange_n(&c->dead, &zero, CXR_ECLOSED, false, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
  fail_all(c, CXR_ECLOSED);
  /* Callbacks handed to the progress thread must have returned before the table goes (they
   * read their future, and may free it). Until 2026-11-23 this waited for their futures to
   * be FREE, which a callback that frees its own future never makes them (ABANDONED): every
   * such close took the whole second, then freed the table anyway. An answer being
   * delivered meanwhile (BUSY: fail_all passed it by) fires its callback after that pass, so
   * the wait covers deliveries too, and is made again after the CLOSE round trip, by which
   * the progress thread has taken in every answer sent before it (until 2026-11-28 such a
   * callback ran on the freed table: a review). */
  bool stuck = !wait_quiet(c);
  if (rc->ep && cxr_rdma_ep_status(rc->ep) == 0) {
    r_close cl = {.magic = R_MAGIC, .conn_id = rc->conn_id, .token = rc->token};
    int64_t end = cxr_now_ns() + 200000000;
    if (cxr_rdma_am_send(rc->ep, R_CLOSE, &cl, sizeof cl, NULL, 0, end) == 0) {
      cxr_rdma *r = eng();
      cxr__rdma_waiter(r, 1);
      while (!__atomic_load_n(&rc->close_done, __ATOMIC_ACQUIRE) && cxr_now_ns() < end &&
             cxr_rdma_ep_status(rc->ep) == 0)
        if (cxr__rdma_progress(r) == 0) usleep(20);
      cxr__rdma_waiter(r, -1);
    }
  }
  if (!stuck) stuck = !wait_quiet(c);
  if (stuck) {
    /* Still queued after 1 s: behind a callback that runs long, or that closes us from
     * the progress thread they wait on. Their memory stays (a leak, not a use after free). */
    CXR_WARN("remote %s: closed with callbacks still queued; its memory is left to them",
             rc->chan);
    return;
  }
  rconn_free(c);
}

/* Gives a call's result back: in the pod the block returns to the connection heap; across
 * racks the server frees the result's blocks in its heap (the release rides on the next
 * call). */
void cxr_conn_free(cxr_conn *c, void *result) {
  if (c == NULL || result == NULL || cxr__fork_inherited(c->fork_epoch)) return;
  if (c->remote == NULL) {
    if (c->heap && cxr_heap_contains(c->heap, result, 1)) cxr_heap_free(c->heap, result);
    return;
  }
  struct cxr__rconn *rc = c->remote;
  if (cxr__rem_inside((uintptr_t)result, 1, rc->rs_addr, rc->rs_size))
    queue_release(c, (uint64_t)(uintptr_t)result);
  else if (cxr_heap_contains(c->heap, result, 1))
    cxr_heap_free(c->heap, result);
}

bool cxr_conn_is_remote(const cxr_conn *c) { return c != NULL && c->remote != NULL; }

/* Where a call's result may live: the connection heap in the pod, the replica of the
 * server's result heap across racks (typed stubs validate results against it). */
cxr_range cxr_conn_result_range(cxr_conn *c) {
  cxr_range r = {NULL, 0};
  if (c == NULL) return r;
  if (c->remote != NULL) {
    r.p = (const void *)c->remote->rs_addr;
    r.len = c->remote->rs_size;
  } else if (c->heap != NULL) {
    r.p = cxr_heap_base(c->heap);
    r.len = cxr_heap_size(c->heap);
  }
  return r;
}
