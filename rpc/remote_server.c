/* Calls across racks, the server half: a channel's UCX listener, replicas of clients' heaps,
 * result heaps, dispatch on the listener's progress thread (see rpc/remote_client.c). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rpc/remote_int.h"
#include "shm/env.h"

typedef struct rres {
  uint64_t root;
  uint32_t n;
  uint64_t *blocks;
} rres;

/* Replies posted and not yet sent (UCX holds them until the client takes them), and the
 * bytes of replica copies they own (reply_own): counted so that they can be bounded
 * (reply_admit), and given back by each reply's completion. */
typedef struct rout {
  unsigned replies;  /* atomic */
  size_t copied;     /* atomic */
} rout;

/* A connection's result heap, shared with the replies UCX may still be sending from it: a
 * reply is posted, not waited for (reply_call), and stays UCX's until it is sent or its
 * endpoint ends (a client that does not read), and the connection may be gone by then. The
 * heap goes back to the spares, or is closed, only when the connection and every such reply
 * have let go: given to the next connection earlier, that one's results would go out in
 * this one's late reply; closed earlier, UCX would read unmapped memory. */
typedef struct rheap {
  int refs;    /* atomic: the connection, and each reply that UCX holds */
  cxr_heap *hs;
  spares *to;  /* where it goes at the end (set before the connection lets go); NULL: closed */
  rout out;    /* the connection's replies not yet sent (they may outlive it, as the heap) */
} rheap;

static void rheap_put(rheap *h) {
  if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (h->to) cxr__rem_spare_give(h->to, h->hs);
  else cxr_heap_close(h->hs);
  free(h);
}

typedef struct rsconn {
  struct rsconn *next;
  cxr_rdma_ep *ep;   /* the accepted endpoint it came through (NULL: a pooled one) */
  uint64_t id, token;
  uintptr_t hc_addr;
  size_t hc_size;
  cxr_heap *hs;
  rheap *held;       /* hs, shared with replies in flight (see rheap) */
  cxr__sconn sc;     /* what cxr_call_heap and the counters read */
  cxr__cslot slot;
  char who[64];
  pthread_mutex_t rlock;  /* res (workers may run calls of one connection at once) */
  rres *res;
  uint32_t nres, rescap;
  /* Per index of the client's pending table, the last call id given up on (rlock): a call
   * in flight owns its index, so no cancel of one is forgotten, however many come at once
   * (a hostile client's other ids only land on its own calls' words). */
  uint64_t cancelled[R_CALLS_IN_FLIGHT];
  int users;              /* calls running on it (under the listener's lock) */
  bool dead;              /* closed while in use: the last call destroys it */
  cxr_rdma_msg *close_msg; /* the client's CLOSE, answered once the replica is gone */
} rsconn;

/* A call waiting for a worker thread (channels with more than one worker). */
typedef struct rjob {
  struct rjob *next;
  cxr_rdma_msg *m;
  size_t bytes;     /* what it holds, counted in the listener's qbytes */
  int64_t arrived;  /* cxr_now_ns() when the progress thread received it */
} rjob;

/* Bounds on the calls waiting for a worker: the engine stops counting a message once it is
 * handed over, so a client that floods calls (to a bogus connection too) and then stops
 * reading its replies (each worker's reply then waited its send deadline; they are posted
 * now, see REPLIES_OUT_MAX) grew this queue until the server ran out of memory (a review,
 * 2026-11-28). Calls past them are answered CXR_EFULL at once. */
#define QUEUE_CALLS_MAX 65536
#define QUEUE_BYTES_MAX ((size_t)1 << 30)

/* Bounds on the replies not yet sent. Replies are posted, not waited for: waiting (up to the
 * 2 s send deadline) for a client with a valid token that calls and never reads held up the
 * progress thread that far per call (one worker: every other client of the channel, its
 * connects too), or each worker (remote_hostile_test
 * AClientThatNeverReadsItsRepliesHoldsUpNoOtherClient). Unsent replies cost memory instead:
 * per connection at most as many as the client may have calls in flight (a client that
 * reads takes each within microseconds, so a reading client never has more), and replica
 * copies of at most the replica's size (any one reply goes when none is unsent); answers to
 * calls of no connection (a wrong id or token, a full queue) count per client with the
 * answers to OPEN and CLOSE (ANSWERS_CLIENT_MAX). Past a bound a reply is dropped and
 * counted (the connection's `dropped`, and a warning): its call ends at the client's own
 * deadline, its result blocks are freed at once, and a client that only paused gets its
 * later replies again. The connection is not ended instead: ending it would not free what
 * UCX already holds (that goes with the client's endpoint, shared by its other
 * connections), and a paused client would lose its results. */
#define REPLIES_OUT_MAX R_CALLS_IN_FLIGHT

/* Bounds on the answers outside connections not yet sent (to OPENs, CLOSEs, and calls of no
 * connection: a wrong id or token, a full queue): per client (the UCX endpoint they go on)
 * and for the channel. They are posted, not waited for: waiting (up to the 2 s send
 * deadline, on the progress thread) for a client that sends OPENs or CLOSEs and never reads
 * held up every other client of the channel once its socket buffers were full
 * (remote_hostile_test AClientFloodingOpensAndClosesHoldsUpNoOtherClient). A reading client
 * takes each answer within microseconds, so it never has more than a few unsent; past a
 * bound an OPEN is dropped unanswered before any work (a flooder makes no connection), and
 * a CLOSE still closes but goes unanswered, and a call's error is not sent (the call ends
 * at its client's deadline); each is counted with a rate-limited warning. With a bound for
 * the channel alone one such client held every place: answers to calls of no connection had
 * only that (1024), and a client that never read took every other client's quick errors
 * (remote_hostile_test ClientsThatNeverReadTheirErrorsTakeNoOtherClientsErrors), as it did
 * the engine's hello answers (rdma/ep.c, HELLOS_CLIENT_MAX); so, as there, every client may
 * always have one answer out and its others come from the channel's shared ANSWERS_OUT_MAX. */
#define ANSWERS_CLIENT_MAX 64u
#define ANSWERS_OUT_MAX 16384u

struct cxr__rlisten {
  cxr_channel *ch;
  cxr_rdma *r;
  spares heaps;  /* empty result heaps for the next connections */
  pthread_mutex_t lock;
  rsconn *conns;
  uint64_t next_id;
  unsigned nconns;
  size_t replica_bytes; /* the replicas' address space, all connections (replica_budget) */
  size_t replica_max;   /* their bound, read once when the listener starts (replica_budget) */
  /* Handlers run on the progress thread when the channel has one worker (the lowest
   * latency); with more, on that many threads of their own, so a slow handler holds up
   * neither other calls nor new connections. */
  pthread_mutex_t qlock;
  pthread_cond_t qcond;
  rjob *qhead, *qtail;
  unsigned qcalls;  /* waiting calls, and their bytes (QUEUE_CALLS_MAX, QUEUE_BYTES_MAX) */
  size_t qbytes;
  bool qstop;
  pthread_t *workers;
  unsigned nworkers;
  /* Answers outside connections not yet sent, by client (ANSWERS_CLIENT_MAX) and in all
   * (ANSWERS_OUT_MAX), under alock: taken by handlers, given back inside UCX callbacks
   * (nothing else is locked under it, no UCX call made). */
  pthread_mutex_t alock;
  cxr__places answers_out;
  uint64_t answers_dropped;  /* atomic: answers dropped past them */
};

struct cxr__rcall {
  rsconn *rc;
  cxr_range *ranges;
  size_t nranges;
  bool set;
};

static void sconn_destroy(struct cxr__rlisten *l, rsconn *c);

/* The connection with that id, held for a call (rs_put lets go). */
static rsconn *rs_get(struct cxr__rlisten *l, uint64_t id) {
  pthread_mutex_lock(&l->lock);
  rsconn *c = l->conns;
  while (c && c->id != id) c = c->next;
  if (c) c->users++;
  pthread_mutex_unlock(&l->lock);
  return c;
}

static void rs_put(struct cxr__rlisten *l, rsconn *c) {
  pthread_mutex_lock(&l->lock);
  bool destroy = --c->users == 0 && c->dead;
  pthread_mutex_unlock(&l->lock);
  if (destroy) sconn_destroy(l, c);
}

/* Gives back replica address space reserved in on_open. */
static void unreserve(struct cxr__rlisten *l, size_t bytes) {
  pthread_mutex_lock(&l->lock);
  l->replica_bytes -= bytes;
  pthread_mutex_unlock(&l->lock);
}

/* c is already out of the list: destroy it now, or when its last call ends. close_msg,
 * if the client closed it, is answered by sconn_destroy: the client reuses its heap, at the
 * same addresses, once it has that answer, so the replica must be gone first (a call that
 * had just answered and not yet let go of c once made the reconnect find it still mapped). */
static void retire(struct cxr__rlisten *l, rsconn *c, cxr_rdma_msg *close_msg) {
  pthread_mutex_lock(&l->lock);
  bool busy = c->users > 0;
  if (busy) c->dead = true;
  if (close_msg) {
    if (busy) cxr_rdma_msg_keep(close_msg);
    c->close_msg = close_msg;
  }
  pthread_mutex_unlock(&l->lock);
  if (!busy) sconn_destroy(l, c);
}

static void res_free(rsconn *c, uint32_t i) {
  for (uint32_t k = 0; k < c->res[i].n; k++) cxr_heap_free(c->hs, (void *)(uintptr_t)c->res[i].blocks[k]);
  free(c->res[i].blocks);
  c->res[i] = c->res[--c->nres];
}

static void release_root(rsconn *c, uint64_t root) {
  pthread_mutex_lock(&c->rlock);
  for (uint32_t i = 0; i < c->nres; i++)
    if (c->res[i].root == root) {
      res_free(c, i);
      break;
    }
  pthread_mutex_unlock(&c->rlock);
}

/* Takes a place for one answer to m's client: false when the client (by the UCX endpoint
 * the answer goes on) or the channel has none left (see ANSWERS_CLIENT_MAX). */
static bool answer_take(struct cxr__rlisten *l, cxr_rdma_msg *m) {
  if (m->reply_ep == NULL) return false; /* (the sender asked for no answer) */
  pthread_mutex_lock(&l->alock);
  bool ok = cxr__place_take(&l->answers_out, m->reply_ep, ANSWERS_CLIENT_MAX, ANSWERS_OUT_MAX);
  pthread_mutex_unlock(&l->alock);
  return ok;
}

/* Gives a place back (inside UCX callbacks too: no UCX calls). */
static void answer_give(struct cxr__rlisten *l, ucp_ep_h uep) {
  pthread_mutex_lock(&l->alock);
  cxr__place_give(&l->answers_out, uep);
  pthread_mutex_unlock(&l->alock);
}

static void answer_dropped(struct cxr__rlisten *l, const char *what) {
  uint64_t n = __atomic_add_fetch(&l->answers_dropped, 1, __ATOMIC_RELAXED);
  if (cxr__log_due(n))
    CXR_WARN("remote %s: %s goes unanswered: its client leaves %u answers unsent (or all "
             "clients %u), or it asked for none; %llu dropped so far", l->ch->name, what,
             ANSWERS_CLIENT_MAX, ANSWERS_OUT_MAX, (unsigned long long)n);
}

/* What a posted answer holds until UCX is done with it: its place (the header is the
 * engine's copy). */
typedef struct answer_own {
  struct cxr__rlisten *l;
  ucp_ep_h uep;
} answer_own;

static void answer_own_free(void *p) { /* inside a UCX callback: no UCX calls */
  answer_own *o = p;
  answer_give(o->l, o->uep);
  free(o);
}

/* Posts an answer whose place answer_take gave (given back once UCX is done with it, or
 * now if it does not go). */
static void answer_post(struct cxr__rlisten *l, cxr_rdma_msg *m, unsigned id, const void *hdr,
                        size_t hlen) {
  answer_own *o = malloc(sizeof *o);
  if (o == NULL) {
    answer_give(l, m->reply_ep);
    return;
  }
  *o = (answer_own){.l = l, .uep = m->reply_ep};
  int rc = cxr__rdma_reply_post(m, id, hdr, hlen, NULL, 0, o, answer_own_free);
  if (rc) CXR_DEBUG("remote %s: answer %u failed: %s", l->ch->name, id, cxr_strerror(rc));
}

static void close_ack(struct cxr__rlisten *l, cxr_rdma_msg *m) {
  if (!answer_take(l, m)) return answer_dropped(l, "a CLOSE");
  size_t hl;
  const r_close *h = cxr_rdma_msg_hdr(m, &hl);
  r_close ack = {.magic = R_MAGIC, .conn_id = h->conn_id, .token = h->token,
                 .heap_addr = h->heap_addr};
  answer_post(l, m, R_CLOSE_REP, &ack, sizeof ack);
}

static void sconn_destroy(struct cxr__rlisten *l, rsconn *c) {
  while (c->nres) res_free(c, 0);
  free(c->res);
  pthread_mutex_destroy(&c->rlock);
  c->held->to = l ? &l->heaps : NULL; /* (l NULL: the engine is closed, no reply is left) */
  rheap_put(c->held);
  /* Replies ship copies of what they send from the replica (reply_call): it can go now. */
  cxr__rem_replica_unmap(c->hc_addr, c->hc_size);
  if (l) unreserve(l, c->hc_size);
  cxr_rdma_msg *m = c->close_msg;
  bool kept = c->dead; /* kept by retire() while calls ran: ours to free */
  free(c);
  if (m == NULL) return;
  if (l) close_ack(l, m); /* (l NULL: the engine is closed, nobody to answer) */
  if (kept) cxr_rdma_msg_free(m);
}

/* A client that came through our listener went away (died or closed): its connections go
 * too. Deferred to the progress thread, after whatever handler is running. */
typedef struct gone_arg {
  struct cxr__rlisten *l;
  cxr_rdma_ep *ep;
} gone_arg;

static void reap_gone(void *arg) {
  gone_arg g = *(gone_arg *)arg;
  free(arg);
  for (;;) {
    pthread_mutex_lock(&g.l->lock);
    rsconn *c = NULL;
    for (rsconn **pp = &g.l->conns; *pp; pp = &(*pp)->next)
      if ((*pp)->ep == g.ep) {
        c = *pp;
        *pp = c->next;
        g.l->nconns--;
        break;
      }
    pthread_mutex_unlock(&g.l->lock);
    if (c == NULL) break;
    CXR_INFO("remote %s: client %s gone: connection %llu reclaimed", g.l->ch->name, c->who,
             (unsigned long long)c->id);
    retire(g.l, c, NULL);
  }
}

static void on_client_gone(cxr_rdma_ep *ep, int err, void *user) {
  gone_arg *g = malloc(sizeof *g);
  if (g == NULL) return;
  g->l = user;
  g->ep = ep;
  if (cxr_rdma_defer(g->l->r, reap_gone, g) != 0) free(g);
}

/* Answers an OPEN whose place on_open took. */
static void reply_open(struct cxr__rlisten *l, cxr_rdma_msg *m, int st, uint64_t token,
                       uint64_t id, cxr_heap *hs) {
  r_open_rep rep = {.magic = R_MAGIC, .status = st, .token = token, .conn_id = id};
  if (hs) {
    rep.rs_addr = (uint64_t)(uintptr_t)cxr_heap_base(hs);
    rep.rs_size = cxr_heap_size(hs);
  }
  answer_post(l, m, R_OPEN_REP, &rep, sizeof rep);
}

/* The most address space the replicas of one channel's remote clients take together
 * (CXRPC_REMOTE_REPLICA_MB, default 64 GiB: the largest heap a client makes). A client
 * names its heap's range in its OPEN; without a bound one could name terabytes, and land
 * data at ever new offsets of that private memory (a review, 2026-11-28). Read when the
 * listener starts (replica_max): each OPEN used to parse the variable again. */
static size_t replica_budget(void) {
  uint64_t mb; /* at most 16 TiB */
  cxr__env_u64("CXRPC_REMOTE_REPLICA_MB", 65536, 1, 1ull << 24, &mb);
  return (size_t)mb << 20;
}

static void on_open(cxr_rdma_msg *m, void *user) {
  struct cxr__rlisten *l = user;
  cxr_channel *ch = l->ch;
  size_t hl;
  const r_open *h = cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h || h->magic != R_MAGIC) return;
  /* The answer's place first: an OPEN that cannot be answered does no work. */
  if (!answer_take(l, m)) return answer_dropped(l, "an OPEN");
  r_open op = *h;
  op.chan[CXR__CHAN_NAME_MAX] = '\0';
  op.who[sizeof op.who - 1] = '\0';
  if (strcmp(op.chan, ch->name) != 0) return reply_open(l, m, CXR_ENOENT, op.token, 0, NULL);
  pthread_mutex_lock(&l->lock);
  bool full = l->nconns >= ch->o.max_conns;
  uint64_t id = ++l->next_id;
  pthread_mutex_unlock(&l->lock);
  if (full) return reply_open(l, m, CXR_EFULL, op.token, 0, NULL);
  int rc = cxr__rem_replica_map(op.heap_addr, op.heap_size); /* (checks the range) */
  if (rc) return reply_open(l, m, rc, op.token, 0, NULL);
  size_t budget = l->replica_max;
  pthread_mutex_lock(&l->lock);
  bool over = l->replica_bytes > budget || op.heap_size > budget - l->replica_bytes;
  if (!over) l->replica_bytes += op.heap_size; /* held from here: unreserve() */
  pthread_mutex_unlock(&l->lock);
  if (over) {
    CXR_WARN("remote %s: a client's heap of %llu MiB would take the replicas past "
             "CXRPC_REMOTE_REPLICA_MB (%zu MiB): connection refused", ch->name,
             (unsigned long long)(op.heap_size >> 20), budget >> 20);
    cxr__rem_replica_unmap(op.heap_addr, op.heap_size);
    return reply_open(l, m, CXR_EFULL, op.token, 0, NULL);
  }
  rsconn *c = calloc(1, sizeof *c);
  rheap *held = calloc(1, sizeof *held);
  rc = c && held ? 0 : CXR_ENOMEM;
  if (rc == 0 && (c->hs = cxr__rem_spare_take(&l->heaps, ch->o.conn_heap_size)) == NULL)
    rc = cxr__rem_heap_new(&c->hs, "rs", ch->name, ch->o.conn_heap_size);
  if (rc) {
    free(held);
    free(c);
    cxr__rem_replica_unmap(op.heap_addr, op.heap_size);
    unreserve(l, op.heap_size);
    return reply_open(l, m, rc, op.token, 0, NULL);
  }
  *held = (rheap){.refs = 1, .hs = c->hs};
  c->held = held;
  pthread_mutex_init(&c->rlock, NULL);
  c->id = id;
  c->token = op.token;
  c->ep = m->ref && m->ref->server_side ? m->ref : NULL;  /* an accepted one: ours to watch */
  if (c->ep) {
    cxr_rdma_ep_on_error(c->ep, on_client_gone, l);
    if (cxr_rdma_ep_status(c->ep) != 0) on_client_gone(c->ep, cxr_rdma_ep_status(c->ep), l);
  }
  c->hc_addr = op.heap_addr;
  c->hc_size = op.heap_size;
  snprintf(c->who, sizeof c->who, "%s", op.who);
  c->sc.heap = c->hs;
  c->sc.slot = &c->slot;
  c->sc.index = (unsigned)id;
  pthread_mutex_lock(&l->lock);
  c->next = l->conns;
  l->conns = c;
  l->nconns++;
  pthread_mutex_unlock(&l->lock);
  CXR_DEBUG("remote %s: connection %llu from %s", ch->name, (unsigned long long)id, c->who);
  reply_open(l, m, 0, op.token, id, c->hs);
}

static void on_close(cxr_rdma_msg *m, void *user) {
  struct cxr__rlisten *l = user;
  size_t hl;
  const r_close *h = cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h || h->magic != R_MAGIC) return;
  pthread_mutex_lock(&l->lock);
  rsconn *c = NULL;
  /* By id, or (id 0: a connect that gave up before our answer) by heap address; the token
   * must be the one its OPEN came with either way. */
  for (rsconn **pp = &l->conns; *pp; pp = &(*pp)->next)
    if ((*pp)->token == h->token && (h->conn_id ? (*pp)->id == h->conn_id
                                                : (*pp)->hc_addr == h->heap_addr)) {
      c = *pp;
      *pp = c->next;
      l->nconns--;
      break;
    }
  pthread_mutex_unlock(&l->lock);
  if (c) retire(l, c, m); /* answers once the replica is gone */
  else close_ack(l, m);
}

/* What a reply hands UCX with its data: the range table, then copies of the bytes it ships
 * from the client's replica (which goes with the connection, maybe before UCX is done), a
 * hold on the result heap the other ranges lie in (see rheap), and its place in the count
 * of replies not yet sent. The header and the iov array are the engine's copies. */
typedef struct reply_own {
  rheap *held;   /* NULL: a reply to no connection */
  rout *out;     /* where it is counted (NULL: a reply to no connection, in `place`) */
  answer_own place;
  size_t copied; /* bytes of replica copies it owns, counted in out */
  r_range tab[];
} reply_own;

static void reply_own_free(void *p) { /* inside a UCX callback: no UCX calls */
  reply_own *o = p;
  if (o == NULL) return;
  if (o->out) {
    __atomic_sub_fetch(&o->out->copied, o->copied, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&o->out->replies, 1, __ATOMIC_RELEASE);
  } else {
    answer_give(o->place.l, o->place.uep);
  }
  if (o->held) rheap_put(o->held); /* last: out may lie in it */
  free(o);
}

/* Counts a reply in `out` if it fits the bounds (see REPLIES_OUT_MAX): false if not. */
static bool reply_admit(rout *out, unsigned max, size_t copied, size_t copied_max) {
  unsigned n = __atomic_fetch_add(&out->replies, 1, __ATOMIC_ACQUIRE);
  size_t b = __atomic_fetch_add(&out->copied, copied, __ATOMIC_RELAXED);
  if (n == 0 || (n < max && b <= copied_max && copied <= copied_max - b)) return true;
  __atomic_sub_fetch(&out->copied, copied, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&out->replies, 1, __ATOMIC_RELEASE);
  return false;
}

static void count_dropped(struct cxr__rlisten *l, rsconn *c, const r_call *h, const char *why) {
  uint64_t n = c ? CXR__ADD(&c->slot.srv.dropped, 1) + 1 : CXR__ADD(&l->answers_dropped, 1) + 1;
  if (cxr__log_due(n))
    CXR_WARN("remote %s: reply to call %llx on connection %llu dropped: %s; %llu so far",
             l->ch->name, (unsigned long long)h->call_id,
             (unsigned long long)(c ? c->id : 0), why, (unsigned long long)n);
}

/* Bytes of the result ranges that lie in the client's replica (they ship as copies). */
static size_t replica_bytes(const rsconn *c, const cxr_range *rg, size_t nr) {
  size_t copied = 0;
  for (size_t i = 0; i < nr; i++)
    if (cxr__rem_inside((uintptr_t)rg[i].p, rg[i].len, c->hc_addr, c->hc_size)) copied += rg[i].len;
  return copied;
}

/* Fills own's range table and copies, and the iov (nr + 1 entries at most): how many. */
static size_t reply_iov(rsconn *c, reply_own *own, const cxr_range *rg, size_t nr,
                        struct iovec *iov) {
  size_t n = 0;
  if (nr) iov[n++] = (struct iovec){own->tab, nr * sizeof(r_range)};
  char *copy = (char *)&own->tab[nr];
  for (size_t i = 0; i < nr; i++) {
    own->tab[i] = (r_range){(uint64_t)(uintptr_t)rg[i].p, rg[i].len};
    if (rg[i].len == 0) continue;
    const void *from = rg[i].p;
    if (cxr__rem_inside((uintptr_t)from, rg[i].len, c->hc_addr, c->hc_size)) {
      memcpy(copy, from, rg[i].len);
      from = copy;
      copy += rg[i].len;
    }
    iov[n++] = (struct iovec){(void *)from, rg[i].len};
  }
  return n;
}

/* A reply's own block for nr ranges and `copied` bytes of copies (NULL: no memory). */
static reply_own *reply_own_alloc(size_t nr, size_t copied) {
  if (copied > SIZE_MAX - sizeof(reply_own) - nr * sizeof(r_range)) return NULL;
  return malloc(sizeof(reply_own) + nr * sizeof(r_range) + copied);
}

/* c: the connection the result ranges belong to (NULL: a call of no connection, which has
 * none). Posted, not waited for, within the bounds of REPLIES_OUT_MAX. False when the
 * result does not go (the reply dropped past the bounds, failed before it reached UCX, or
 * sent as CXR_ENOMEM): the client never learns of it, so it is the caller's to free. */
static bool reply_call(struct cxr__rlisten *l, rsconn *c, cxr_rdma_msg *m, const r_call *h,
                       uint64_t token, int st, void *result, const cxr_range *rg, size_t nr) {
  r_call_rep rep = {.magic = R_MAGIC, .status = st, .token = token, .call_id = h->call_id,
                    .result = (uint64_t)(uintptr_t)result};
  if (c == NULL) nr = 0;
  size_t copied = nr ? replica_bytes(c, rg, nr) : 0;
  struct iovec stack_iov[9];
  struct iovec *iov = nr + 1 <= 9 ? stack_iov : malloc((nr + 1) * sizeof *iov);
  reply_own *own = iov ? reply_own_alloc(nr, copied) : NULL;
  if (nr && own == NULL) { /* no memory for the result: the error alone */
    rep.status = CXR_ENOMEM, rep.result = 0, nr = 0, copied = 0;
    own = reply_own_alloc(0, 0);
  }
  rep.nranges = (uint32_t)nr;
  rout *out = c ? &c->held->out : NULL;
  bool fits = own && (c ? reply_admit(out, REPLIES_OUT_MAX, copied, c->hc_size)
                        : answer_take(l, m));
  if (!fits) {
    count_dropped(l, c, h, own ? "too many replies not yet sent (a client that does not "
                                 "read)" : "out of memory");
    free(own);
    if (iov != stack_iov) free(iov);
    return false;
  }
  *own = (reply_own){.held = c ? c->held : NULL, .out = out, .place = {l, m->reply_ep},
                     .copied = copied};
  if (c) __atomic_add_fetch(&c->held->refs, 1, __ATOMIC_RELAXED); /* the connection holds one */
  size_t n = reply_iov(c, own, rg, nr, iov);
  /* own goes with the reply, freed (its count given back, the heap let go) once UCX is done
   * with it; the engine copies the header and the iov array. */
  int rc = cxr__rdma_reply_post(m, R_CALL_REP, &rep, sizeof rep, n ? iov : NULL, n, own,
                                reply_own_free);
  if (rc) CXR_DEBUG("remote: reply to call %llx failed: %s", (unsigned long long)h->call_id,
                    cxr_strerror(rc));
  if (iov != stack_iov) free(iov);
  return rc == 0 && rep.result == (uint64_t)(uintptr_t)result;
}

/* Checks a call's data against the replica and gives back the results it releases; the
 * argument bytes land (land_args) only if the call runs. */
static int check_args(rsconn *c, const r_call *h, const char *d, size_t dl, const char **inl) {
  if (h->nranges > R_MAX_RANGES || h->nrel > R_MAX_REL || h->inline_len > CXR__INLINE_MAX)
    return CXR_EPROTO;
  size_t meta = h->nranges * sizeof(r_range) + h->nrel * sizeof(uint64_t) + h->inline_len;
  if (meta > dl) return CXR_EPROTO;
  const char *tab = d;
  size_t off = meta, total = 0;
  for (uint32_t i = 0; i < h->nranges; i++) {
    r_range g;
    memcpy(&g, tab + i * sizeof g, sizeof g);
    if (!cxr__rem_inside(g.addr, g.len, c->hc_addr, c->hc_size)) return CXR_EBADPTR;
    if (g.len > dl - off - total) return CXR_EPROTO;
    total += g.len;
  }
  if (off + total != dl) return CXR_EPROTO;
  for (uint32_t i = 0; i < h->nrel; i++) {
    uint64_t root;
    memcpy(&root, d + h->nranges * sizeof(r_range) + i * sizeof root, sizeof root);
    release_root(c, root);
  }
  *inl = d + h->nranges * sizeof(r_range) + h->nrel * sizeof(uint64_t);
  return 0;
}

/* Copies a checked call's argument bytes into the replica. Only for a call that runs: the
 * bytes of one that expired or was cancelled while it waited for a worker are as old as the
 * call, and the client may have given its block to a newer call that shipped it since. */
static void land_args(rsconn *c, const r_call *h, const char *d) {
  size_t off = h->nranges * sizeof(r_range) + h->nrel * sizeof(uint64_t) + h->inline_len;
  for (uint32_t i = 0; i < h->nranges; i++) {
    r_range g;
    memcpy(&g, d + i * sizeof g, sizeof g);
    if (g.len) memcpy((void *)(uintptr_t)g.addr, d + off, g.len);
    off += g.len;
  }
}

/* Records which blocks of our heap a result occupies, so a release frees them all. */
static void keep_result_locked(rsconn *c, void *result, const cxr_range *rg, size_t nr);

/* Whether a result range names a block of the result besides its root: one that starts a
 * block of our heap (ranges in the argument replica are the client's). */
static bool extra_block(rsconn *c, const void *result, const cxr_range *r) {
  return r->p != result && cxr_heap_usable_size(c->hs, r->p) > 0;
}

static void keep_result(rsconn *c, void *result, const cxr_range *rg, size_t nr) {
  if (result == NULL) return;
  pthread_mutex_lock(&c->rlock);
  keep_result_locked(c, result, rg, nr);
  pthread_mutex_unlock(&c->rlock);
}

static void keep_result_locked(rsconn *c, void *result, const cxr_range *rg, size_t nr) {
  if (c->nres == c->rescap) {
    uint32_t cap = c->rescap ? 2 * c->rescap : 16;
    rres *n = realloc(c->res, cap * sizeof *n);
    if (n == NULL) return;
    c->res = n;
    c->rescap = cap;
  }
  rres *r = &c->res[c->nres];
  r->root = (uint64_t)(uintptr_t)result;
  r->blocks = malloc((nr + 1) * sizeof *r->blocks);
  r->n = 0;
  if (r->blocks == NULL) return;
  r->blocks[r->n++] = r->root;
  for (size_t i = 0; i < nr; i++)
    if (extra_block(c, result, &rg[i])) r->blocks[r->n++] = (uint64_t)(uintptr_t)rg[i].p;
  c->nres++;
}

/* A failed call ships no result: the blocks a release would have freed (the root and each
 * range that starts a block of our heap, as keep_result_locked records them) are freed now. */
static void drop_result(rsconn *c, void *result, const cxr_range *rg, size_t nr) {
  if (result == NULL) return;
  for (size_t i = 0; i < nr; i++)
    if (extra_block(c, result, &rg[i])) cxr_heap_free(c->hs, (void *)rg[i].p);
  cxr_heap_free(c->hs, result);
}

static void run_call(struct cxr__rlisten *l, cxr_rdma_msg *m, const r_call *hp, rsconn *c,
                     int64_t arrived);

static uint64_t *cancel_word(rsconn *c, uint64_t call_id) {
  return &c->cancelled[(uint32_t)call_id % R_CALLS_IN_FLIGHT];
}

static bool was_cancelled(rsconn *c, uint64_t call_id) {
  pthread_mutex_lock(&c->rlock);
  bool hit = *cancel_word(c, call_id) == call_id;
  pthread_mutex_unlock(&c->rlock);
  return hit;
}

bool cxr__remote_call_cancelled(cxr_call *call) {
  return call->remote != NULL && was_cancelled(call->remote->rc, call->call_id);
}

/* On the progress thread (so also while workers run handlers): the client gave up. */
static void on_cancel(cxr_rdma_msg *m, void *user) {
  struct cxr__rlisten *l = user;
  size_t hl;
  const r_cancel *hp = cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *hp || hp->magic != R_MAGIC || hp->call_id == 0) return;
  rsconn *c = rs_get(l, hp->conn_id);
  if (c == NULL) return;
  if (c->token == hp->token) {
    pthread_mutex_lock(&c->rlock);
    *cancel_word(c, hp->call_id) = hp->call_id;
    pthread_mutex_unlock(&c->rlock);
  }
  rs_put(l, c);
}

/* One call: find its connection and hold it while the handler runs. arrived: when the
 * progress thread received it (its deadline counts from then, queueing included). */
static void handle_call(struct cxr__rlisten *l, cxr_rdma_msg *m, int64_t arrived) {
  size_t hl;
  const r_call *hp = cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *hp || hp->magic != R_MAGIC) return;
  r_call h = *hp;
  rsconn *c = rs_get(l, h.conn_id);
  if (c != NULL && c->token != h.token) { /* not its client: as if there were no such id */
    rs_put(l, c);
    c = NULL;
  }
  if (c == NULL) {
    reply_call(l, NULL, m, &h, h.token, CXR_ECLOSED, NULL, NULL, 0);
    return;
  }
  run_call(l, m, &h, c, arrived);
  rs_put(l, c);
}

static void *worker_main(void *arg) {
  struct cxr__rlisten *l = arg;
  pthread_mutex_lock(&l->qlock);
  for (;;) {
    while (l->qhead == NULL && !l->qstop) pthread_cond_wait(&l->qcond, &l->qlock);
    if (l->qstop) break;
    rjob *j = l->qhead;
    l->qhead = j->next;
    if (l->qhead == NULL) l->qtail = NULL;
    l->qcalls--;
    l->qbytes -= j->bytes;
    pthread_mutex_unlock(&l->qlock);
    handle_call(l, j->m, j->arrived);
    cxr_rdma_msg_free(j->m);
    free(j);
    pthread_mutex_lock(&l->qlock);
  }
  pthread_mutex_unlock(&l->qlock);
  return NULL;
}

/* On the progress thread: run it here (one worker) or hand it to the workers. */
static void on_call(cxr_rdma_msg *m, void *user) {
  struct cxr__rlisten *l = user;
  int64_t arrived = cxr_now_ns();
  if (l->nworkers == 0) return handle_call(l, m, arrived);
  size_t hl, dl;
  const r_call *hp = cxr_rdma_msg_hdr(m, &hl);
  cxr_rdma_msg_data(m, &dl);
  rjob *j = malloc(sizeof *j);
  pthread_mutex_lock(&l->qlock);
  int refuse = j == NULL ? CXR_ENOMEM : l->qstop ? CXR_ECLOSED : 0;
  if (!refuse && (l->qcalls >= QUEUE_CALLS_MAX || dl > QUEUE_BYTES_MAX - l->qbytes))
    refuse = CXR_EFULL;
  if (!refuse) {
    cxr_rdma_msg_keep(m);
    j->m = m;
    j->bytes = dl;
    j->arrived = arrived;
    j->next = NULL;
    if (l->qtail) l->qtail->next = j; else l->qhead = j;
    l->qtail = j;
    l->qcalls++;
    l->qbytes += dl;
    pthread_cond_signal(&l->qcond);
  }
  pthread_mutex_unlock(&l->qlock);
  if (refuse) {
    free(j);
    if (hl == sizeof *hp) reply_call(l, NULL, m, hp, hp->token, refuse, NULL, NULL, 0);
  }
}

static void run_call(struct cxr__rlisten *l, cxr_rdma_msg *m, const r_call *hp, rsconn *c,
                     int64_t arrived) {
  cxr_channel *ch = l->ch;
  size_t dl;
  const char *d = cxr_rdma_msg_data(m, &dl);
  r_call h = *hp;
  cxr__srv_ctr *ctr = &c->slot.srv;
  CXR__ADD(&ctr->calls, 1);
  CXR__ADD(&ctr->bytes_in, dl);
  const char *inl = NULL;
  int st = check_args(c, &h, d, dl, &inl);
  if (st) {
    CXR__ADD(&ctr->malformed, 1);
    reply_call(l, c, m, &h, c->token, st, NULL, NULL, 0);
    return;
  }
  unsigned char inl_buf[CXR__INLINE_MAX] __attribute__((aligned(16)));
  struct cxr__rcall rcall = {.rc = c};
  cxr_call call = {.ch = ch, .sc = &c->sc, .call_id = h.call_id, .method = h.method,
                   .flags = h.flags & CXR_CALL_INLINE, .remote = &rcall};
  if (h.flags & CXR_CALL_INLINE) {
    memcpy(inl_buf, inl, h.inline_len);
    call.args = inl_buf;
    call.arg_len = h.inline_len;
  } else if (h.args != 0) {
    if (!cxr__rem_inside(h.args, h.arg_len ? h.arg_len : 1, c->hc_addr, c->hc_size)) {
      reply_call(l, c, m, &h, c->token, CXR_EBADPTR, NULL, NULL, 0);
      return;
    }
    call.args = (const void *)(uintptr_t)h.args;
    call.arg_len = h.arg_len;
  }
  const cxr__method *me = NULL;
  void *result = NULL;
  /* deadline_rel comes from the peer: no overflow whatever it says. */
  int64_t deadline = h.deadline_rel > INT64_MAX - arrived ? INT64_MAX : arrived + h.deadline_rel;
  if (!__atomic_load_n(&ch->running, __ATOMIC_ACQUIRE) || __atomic_load_n(&ch->stop, __ATOMIC_ACQUIRE))
    st = CXR_EAGAIN;  /* opened but not serving (yet, or any more) */
  else if ((me = cxr__method_find(ch, h.method)) == NULL)
    st = CXR_ENOMETHOD;
  else if (h.deadline_rel <= 0 || cxr_now_ns() > deadline) {
    st = CXR_ETIMEDOUT;  /* expired before it got here, or while it waited for a worker */
    CXR__ADD(&ctr->expired, 1);
  } else if (was_cancelled(c, h.call_id)) {
    st = CXR_ECANCELED;  /* cancelled while it waited for a worker: not run */
    CXR__ADD(&ctr->cancelled, 1);
  }
  if (st == 0) {
    land_args(c, &h, d);
    /* The client's clock is not ours: its deadline arrives as time left, from arrival. */
    call.deadline = deadline;
    st = cxr__dispatch(&call, me->fn, me->user, &result);
    if (st > 0 || st < CXR_ERRNO_MIN) st = CXR_EIO;
  }
  if (st == 0 && cxr_now_ns() > call.deadline) CXR__ADD(&ctr->expired, 1);
  cxr_range one;
  const cxr_range *rg = NULL;
  size_t nr = 0;
  if (result != NULL && !cxr_heap_contains(c->hs, result, 1)) {
    CXR_WARN("remote %s: handler for method %u returned a pointer outside the call heap",
             ch->name, h.method);
    st = CXR_EBADPTR;
    result = NULL;
  }
  if (result != NULL && rcall.set) {
    rg = rcall.ranges;
    nr = rcall.nranges;
  } else if (result != NULL) {
    one = (cxr_range){result, cxr_heap_usable_size(c->hs, result)};
    if (one.len == 0) one.len = 1;
    rg = &one;
    nr = 1;
  }
  for (size_t i = 0; i < nr; i++)
    if (!cxr_heap_contains(c->hs, rg[i].p, rg[i].len ? rg[i].len : 1) &&
        !cxr__rem_inside((uintptr_t)rg[i].p, rg[i].len, c->hc_addr, c->hc_size)) {
      CXR_WARN("remote %s: result range %zu is outside the connection's heaps", ch->name, i);
      st = CXR_EBADPTR;
    }
  if (st != 0) {
    drop_result(c, result, rg, nr);
    result = NULL;
    nr = 0;
    CXR__ADD(&ctr->errors, 1);
  }
  keep_result(c, result, rg, nr);
  size_t out = 0;
  for (size_t i = 0; i < nr; i++) out += rg[i].len;
  CXR__ADD(&ctr->bytes_out, out);
  /* A result whose reply does not go is never released by the client: freed now. */
  if (!reply_call(l, c, m, &h, c->token, st, result, rg, nr) && result != NULL)
    release_root(c, (uint64_t)(uintptr_t)result);
  free(rcall.ranges);
}

int cxr__remote_listen(cxr_channel *ch, const char *listen) {
  if (strncmp(listen, "ucx://", 6) != 0 || strlen(listen) > 6 + 79) return CXR_EINVAL;
  struct cxr__rlisten *l = calloc(1, sizeof *l);
  if (l == NULL) return CXR_ENOMEM;
  l->ch = ch;
  l->replica_max = replica_budget();
  pthread_mutex_init(&l->lock, NULL);
  pthread_mutex_init(&l->heaps.lock, NULL);
  pthread_mutex_init(&l->qlock, NULL);
  pthread_mutex_init(&l->alock, NULL);
  pthread_cond_init(&l->qcond, NULL);
  if (ch->o.workers > 1 && (l->workers = calloc(ch->o.workers, sizeof *l->workers)) != NULL)
    for (unsigned i = 0; i < ch->o.workers; i++)
      if (pthread_create(&l->workers[l->nworkers], NULL, worker_main, l) == 0) l->nworkers++;
  /* Result heaps ready before the first client, as the pod keeps a pool of ready slots. */
  for (unsigned i = 0; i < ch->o.pool && i < 8; i++) {
    cxr_heap *h;
    if (cxr__rem_heap_new(&h, "rs", ch->name, ch->o.conn_heap_size) == 0) cxr__rem_spare_give(&l->heaps, h);
  }
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  o.listen = listen + 6;
  int rc = cxr_rdma_open(&l->r, &o);
  if (rc == 0) rc = cxr__am_set(l->r, R_OPEN, on_open, l, 0);
  if (rc == 0) rc = cxr__am_set(l->r, R_CALL, on_call, l, 0);
  if (rc == 0) rc = cxr__am_set(l->r, R_CLOSE, on_close, l, 0);
  if (rc == 0) rc = cxr__am_set(l->r, R_CANCEL, on_cancel, l, 0);
  if (rc != 0) {
    CXR_ERR("channel %s: cannot listen on %s: %s", ch->name, listen, cxr_strerror(rc));
    ch->remote = l;
    cxr__remote_stop(ch);
    return rc;
  }
  CXR_INFO("channel %s: listening on %s (port %d)", ch->name, listen, cxr_rdma_port(l->r));
  ch->remote = l;
  return 0;
}

void cxr__remote_stop(cxr_channel *ch) {
  struct cxr__rlisten *l = ch->remote;
  if (l == NULL) return;
  ch->remote = NULL;
  /* Workers first (one may be answering a call), then calls nobody will run (they hold
   * endpoints the engine is about to close), then the engine: no handler runs after. */
  pthread_mutex_lock(&l->qlock);
  l->qstop = true;
  pthread_cond_broadcast(&l->qcond);
  pthread_mutex_unlock(&l->qlock);
  for (unsigned i = 0; i < l->nworkers; i++) pthread_join(l->workers[i], NULL);
  free(l->workers);
  pthread_mutex_lock(&l->qlock);
  while (l->qhead) {
    rjob *j = l->qhead;
    l->qhead = j->next;
    cxr_rdma_msg_free(j->m);
    free(j);
  }
  l->qtail = NULL;
  l->qcalls = 0;
  l->qbytes = 0;
  pthread_mutex_unlock(&l->qlock);
  if (l->r) cxr_rdma_close(l->r);
  while (l->conns) {
    rsconn *c = l->conns;
    l->conns = c->next;
    sconn_destroy(NULL, c);
  }
  cxr__rem_spares_drop(&l->heaps);
  /* Places of answers UCX never finished (the engine left them when it closed). */
  cxr__places_drop(&l->answers_out);
  pthread_mutex_destroy(&l->lock);
  pthread_mutex_destroy(&l->qlock);
  pthread_mutex_destroy(&l->alock);
  pthread_cond_destroy(&l->qcond);
  free(l);
}

cxr_range cxr__remote_arg_range(cxr_call *call) {
  rsconn *c = call->remote->rc;
  return (cxr_range){(const void *)c->hc_addr, c->hc_size};
}

int cxr__remote_set_result_ranges(cxr_call *call, const cxr_range *r, size_t n) {
  struct cxr__rcall *rc = call->remote;
  if (n > R_MAX_RANGES) return CXR_EINVAL;
  cxr_range *copy = n ? malloc(n * sizeof *copy) : NULL;
  if (n && copy == NULL) return CXR_ENOMEM;
  if (n) memcpy(copy, r, n * sizeof *copy);
  free(rc->ranges);
  rc->ranges = copy;
  rc->nranges = n;
  rc->set = true;
  return 0;
}

int cxr__remote_peer(cxr_call *call, cxr_peer *out) {
  rsconn *c = call->remote->rc;
  out->pid = -1;
  out->uid = 0;
  snprintf(out->host, sizeof out->host, "%s", c->who);
  out->trusted = !call->ch->o.untrusted;
  out->verified = false; /* what the client said about itself */
  return 0;
}
