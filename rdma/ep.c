/* Endpoints: cold connects (UCX client-server + a hello), the fast-connect directory of
 * known hosts (worker address, exports) and its pool of ready endpoints, the listener,
 * failures and closing. Rules: never call UCX while holding r->lock (UCX callbacks take it
 * under the worker's own lock); never call UCX while holding an endpoint's ulock for writing,
 * and never take ulock in a UCX callback (a poster holds it for reading while it waits for
 * the worker's lock). */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdma/internal.h"

int cxr__parse_hostport(const char *s, struct sockaddr_in *sa);

#define HELLO_MAGIC 0x63787268u /* "cxrh" */
#define HELLO_VERSION 1u

typedef struct hello_req {
  uint32_t magic, version;
  uint64_t token;
} hello_req;

typedef struct hello_rep {
  uint32_t magic, version;
  uint64_t token;
  uint32_t waddr_len, nexps;
} hello_rep;

typedef struct exp_wire {
  char name[EXPORT_NAME_MAX + 1];
  uint64_t base, len;
  uint32_t rlen, pad;
} exp_wire;

struct hello_wait {
  struct hello_wait *next;
  uint64_t token;
  atomic_int done;
  hello_rep rep;
  void *data;
  size_t dlen;
};

/* ---- server side: accept and answer hellos ---- */

static cxr_rdma_ep *ep_new(cxr_rdma *r, const char *host) {
  cxr_rdma_ep *ep = calloc(1, sizeof *ep);
  if (ep == NULL) return NULL;
  ep->r = r;
  pthread_mutex_lock(&r->lock);
  ep->id = ++r->next_ep_id;
  pthread_mutex_unlock(&r->lock);
  /* The default kind prefers readers: a poster never waits behind a closer that waits for
   * it. Closers do not starve: posters check the status, set first, before taking it. */
  pthread_rwlock_init(&ep->ulock, NULL);
  snprintf(ep->host, sizeof ep->host, "%s", host ? host : "");
  return ep;
}

/* Every endpoint from ep_new goes through here (its lock with it), on error paths too. */
static void ep_free(cxr_rdma_ep *ep) {
  pthread_rwlock_destroy(&ep->ulock);
  free(ep);
}

static void ep_link(cxr_rdma_ep *ep) {
  cxr_rdma *r = ep->r;
  pthread_mutex_lock(&r->lock);
  ep->handle = ep->uep;  /* published by the lock to ep_on */
  ep->next = r->eps;
  r->eps = ep;
  pthread_mutex_unlock(&r->lock);
}

/* The start of its close: ep leaves r->eps for r->closing_eps, marked closed, in one step
 * under r->lock; a receive counted before it is seen by the close's waits, one after it is
 * refused (cxr__recv_count). */
static void closing_begin(cxr_rdma_ep *ep) {
  cxr_rdma *r = ep->r;
  pthread_mutex_lock(&r->lock);
  __atomic_store_n(&ep->closed, true, __ATOMIC_RELEASE);  /* read without the lock: reply */
  for (cxr_rdma_ep **pp = &r->eps; *pp; pp = &(*pp)->next) {
    if (*pp == ep) {
      *pp = ep->next;
      break;
    }
  }
  ep->closing_uep = __atomic_load_n(&ep->uep, __ATOMIC_RELAXED);
  ep->closing_next = r->closing_eps;
  r->closing_eps = ep;
  pthread_mutex_unlock(&r->lock);
}

/* Its handle is closed (UCX drops messages on a closed handle): off r->closing_eps. */
static void closing_end(cxr_rdma_ep *ep) {
  cxr_rdma *r = ep->r;
  pthread_mutex_lock(&r->lock);
  for (cxr_rdma_ep **pp = &r->closing_eps; *pp; pp = &(*pp)->closing_next) {
    if (*pp == ep) {
      *pp = ep->closing_next;
      break;
    }
  }
  pthread_mutex_unlock(&r->lock);
}

void cxr__conn_cb(ucp_conn_request_h req, void *arg) {
  cxr_rdma *r = arg;
  char peer[HOSTKEY_MAX] = "";
  ucp_conn_request_attr_t a = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
  if (ucp_conn_request_query(req, &a) == UCS_OK && a.client_address.ss_family == AF_INET) {
    struct sockaddr_in *sa = (struct sockaddr_in *)&a.client_address;
    char ip[32];
    inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof ip);
    snprintf(peer, sizeof peer, "%s:%u", ip, ntohs(sa->sin_port));
  }
  cxr_rdma_ep *ep = ep_new(r, peer);
  if (ep == NULL) {
    ucp_listener_reject(r->listener, req);
    return;
  }
  ep->server_side = true;
  ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                                     UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                     UCP_EP_PARAM_FIELD_ERR_HANDLER,
                       .conn_request = req,
                       .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                       .err_handler = {.cb = cxr__ep_err_cb, .arg = ep}};
  ucs_status_t st = ucp_ep_create(r->worker, &p, &ep->uep);
  if (st != UCS_OK) {
    CXR_WARN("rdma: cannot accept %s: %s", peer, ucs_status_string(st));
    ep_free(ep);
    return;
  }
  ep_link(ep);
  CXR_DEBUG("rdma: accepted %s", peer);
}

/* Answers to hellos not yet sent, per client (the UCX endpoint they go on) and engine-wide:
 * past the bound a hello goes unanswered (its client's connect times out). Answers are
 * posted, not awaited, so a client that sends hellos and never reads would otherwise grow
 * the engine's memory without bound (a review of 623921e). Every client may always have
 * one answer out: its others, HELLOS_CLIENT_MAX in all, take places from an engine-wide
 * pool of HELLOS_SHARED_MAX. With a plain engine-wide bound, the clients that flood (one of
 * them, before 8503918; 64 of them, or one with 64 connections, since) took every place and
 * every other client's connect timed out (rdma_test AClientFloodingHellosStarvesOnlyItself,
 * ManyClientsFloodingHellosStarveNobodyElse). A client's first place costs no more than
 * its endpoint does already, and one is all a connect or refresh needs: its answer leaves
 * in microseconds. */
#define HELLOS_CLIENT_MAX 16
#define HELLOS_SHARED_MAX 1024

/* Takes a place for one answer on `uep`: false when the client or the engine has none left. */
static bool hello_place_take(cxr_rdma *r, ucp_ep_h uep) {
  pthread_mutex_lock(&r->lock);
  bool ok = cxr__place_take(&r->hellos_out, uep, HELLOS_CLIENT_MAX, HELLOS_SHARED_MAX);
  pthread_mutex_unlock(&r->lock);
  return ok;
}

/* Gives the place back (inside UCX callbacks too: no UCX calls). */
static void hello_place_give(cxr_rdma *r, ucp_ep_h uep) {
  pthread_mutex_lock(&r->lock);
  cxr__place_give(&r->hellos_out, uep);
  pthread_mutex_unlock(&r->lock);
}

typedef struct hello_buf {
  cxr_rdma *r;
  ucp_ep_h uep;
  char data[];
} hello_buf;

static void hello_buf_free(void *p) { /* inside a UCX callback: no UCX calls */
  hello_buf *b = p;
  hello_place_give(b->r, b->uep);
  free(b);
}

void cxr__hello_server(cxr_rdma_msg *m, void *user) {
  cxr_rdma *r = m->r;
  hello_req rq;
  if (m->hlen != sizeof rq || m->reply_ep == NULL) return;
  memcpy(&rq, m->hdr, sizeof rq);
  if (rq.magic != HELLO_MAGIC || rq.version != HELLO_VERSION) return;
  if (!hello_place_take(r, m->reply_ep)) {
    CXR_DEBUG("rdma: a hello from %s goes unanswered: its answers unsent fill its %d places "
              "or the engine's %d shared ones", m->ref ? m->ref->host : "a worker-address client",
              HELLOS_CLIENT_MAX, HELLOS_SHARED_MAX);
    return;
  }
  ucp_address_t *wa = NULL;
  size_t walen = 0;
  if (ucp_worker_get_address(r->worker, &wa, &walen) != UCS_OK) {
    hello_place_give(r, m->reply_ep);
    return;
  }
  /* Snapshot the exports under the lock, then send without it. */
  size_t cap = walen + 8, n = 0;
  pthread_mutex_lock(&r->lock);
  for (cxr_rdma_mr *mr = r->mrs; mr; mr = mr->next)
    if (mr->exported) cap += sizeof(exp_wire) + ((mr->rkey_len + 7) & ~(size_t)7);
  hello_buf *hb = malloc(sizeof *hb + cap);
  char *buf = hb ? hb->data : NULL;
  size_t off = 0;
  if (buf != NULL) {
    memcpy(buf, wa, walen);
    off = (walen + 7) & ~(size_t)7;
    for (cxr_rdma_mr *mr = r->mrs; mr; mr = mr->next) {
      if (!mr->exported) continue;
      exp_wire w = {.base = (uint64_t)(uintptr_t)mr->p, .len = mr->len,
                    .rlen = (uint32_t)mr->rkey_len};
      snprintf(w.name, sizeof w.name, "%s", mr->name);
      memcpy(buf + off, &w, sizeof w);
      off += sizeof w;
      memcpy(buf + off, mr->rkey_buf, mr->rkey_len);
      off += (mr->rkey_len + 7) & ~(size_t)7;
      n++;
    }
  }
  pthread_mutex_unlock(&r->lock);
  ucp_worker_release_address(r->worker, wa);
  if (buf == NULL) {
    hello_place_give(r, m->reply_ep);
    return;
  }
  hello_rep rep = {.magic = HELLO_MAGIC, .version = HELLO_VERSION, .token = rq.token,
                   .waddr_len = (uint32_t)walen, .nexps = (uint32_t)n};
  struct iovec iov = {buf, off};
  /* Not waited for: this runs on the progress thread, and a client that sends hellos and
   * never reads stalled the whole engine 2 s per hello (the reply's deadline; rdma_test).
   * The buffer goes with the reply, freed once UCX is done with it. */
  hb->r = r;
  hb->uep = m->reply_ep;
  int rc = cxr__rdma_reply_post(m, AM_HELLO_REPLY, &rep, sizeof rep, &iov, 1, hb,
                                hello_buf_free);
  if (rc) CXR_DEBUG("rdma: hello reply failed: %s", cxr_strerror(rc));
}

/* Inline (inside UCX's callback): copy the answer to its waiter. */
void cxr__hello_reply(cxr_rdma_msg *m, void *user) {
  cxr_rdma *r = m->r;
  hello_rep rep;
  if (m->hlen != sizeof rep) return;
  memcpy(&rep, m->hdr, sizeof rep);
  pthread_mutex_lock(&r->lock);
  for (struct hello_wait *w = r->hellos; w; w = w->next) {
    if (w->token != rep.token || atomic_load(&w->done)) continue;
    w->rep = rep;
    w->data = malloc(m->dlen ? m->dlen : 1);
    if (w->data) {
      memcpy(w->data, m->data, m->dlen);
      w->dlen = m->dlen;
    }
    atomic_store(&w->done, 1);
    break;
  }
  pthread_mutex_unlock(&r->lock);
}

/* Parses and checks a hello answer (a peer is not trusted to send sane lengths). */
static int parse_hello(struct hello_wait *w, void **waddr, size_t *walen, rdma_export **exps,
                       unsigned *nexps) {
  if (w->rep.magic != HELLO_MAGIC || w->rep.version != HELLO_VERSION || w->data == NULL)
    return CXR_EPROTO;
  const char *d = w->data;
  size_t len = w->dlen, wl = w->rep.waddr_len;
  if (wl == 0 || wl > len || w->rep.nexps > 4096) return CXR_EPROTO;
  size_t off = (wl + 7) & ~(size_t)7;
  rdma_export *e = calloc(w->rep.nexps ? w->rep.nexps : 1, sizeof *e);
  void *wa = malloc(wl);
  if (e == NULL || wa == NULL) {
    free(e);
    free(wa);
    return CXR_ENOMEM;
  }
  memcpy(wa, d, wl);
  unsigned i = 0;
  for (; i < w->rep.nexps; i++) {
    exp_wire x;
    if (off > len || len - off < sizeof x) break;
    memcpy(&x, d + off, sizeof x);
    off += sizeof x;
    if (x.rlen == 0 || x.rlen > len - off || x.len == 0 || x.base + x.len < x.base) break;
    x.name[EXPORT_NAME_MAX] = '\0';
    memcpy(e[i].name, x.name, sizeof e[i].name);
    e[i].base = x.base;
    e[i].len = x.len;
    e[i].rlen = x.rlen;
    e[i].rkey = malloc(x.rlen);
    if (e[i].rkey == NULL) break;
    memcpy(e[i].rkey, d + off, x.rlen);
    off += ((size_t)x.rlen + 7) & ~(size_t)7;
  }
  if (i != w->rep.nexps) {
    for (unsigned j = 0; j < i; j++) free(e[j].rkey);
    free(e);
    free(wa);
    return CXR_EPROTO;
  }
  *waddr = wa;
  *walen = wl;
  *exps = e;
  *nexps = i;
  return 0;
}

/* Sends a hello on ep and waits for the answer; updates the directory entry for ep->host. */
static int hello(cxr_rdma_ep *ep, int64_t deadline) {
  cxr_rdma *r = ep->r;
  struct hello_wait w = {0};
  pthread_mutex_lock(&r->lock);
  w.token = ++r->next_token ^ ((uint64_t)(uintptr_t)ep << 16);
  w.next = r->hellos;
  r->hellos = &w;
  pthread_mutex_unlock(&r->lock);
  hello_req rq = {.magic = HELLO_MAGIC, .version = HELLO_VERSION, .token = w.token};
  int rc = cxr__ep_am_send(ep, AM_HELLO, UCP_AM_SEND_FLAG_REPLY, &rq, sizeof rq, NULL, 0,
                           deadline, true);
  if (rc == 0) {
    atomic_fetch_add(&r->waiters, 1);
    int64_t start = cxr_now_ns();
    while (!atomic_load(&w.done) && !atomic_load(&ep->status) && cxr_now_ns() < deadline) {
      if (ucp_worker_progress(r->worker) == 0 && cxr_now_ns() - start > 200000) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
      }
    }
    atomic_fetch_sub(&r->waiters, 1);
  }
  pthread_mutex_lock(&r->lock);
  for (struct hello_wait **pp = &r->hellos; *pp; pp = &(*pp)->next)
    if (*pp == &w) {
      *pp = w.next;
      break;
    }
  pthread_mutex_unlock(&r->lock);
  if (rc == 0 && !atomic_load(&w.done))
    rc = atomic_load(&ep->status) ? atomic_load(&ep->status) : CXR_ETIMEDOUT;
  void *wa = NULL;
  size_t walen = 0;
  rdma_export *exps = NULL;
  unsigned nexps = 0;
  if (rc == 0) rc = parse_hello(&w, &wa, &walen, &exps, &nexps);
  free(w.data);
  if (rc) return rc;
  /* Store what we learnt in the directory. */
  rdma_export *old = NULL;
  unsigned nold = 0;
  void *oldwa = NULL;
  pthread_mutex_lock(&r->lock);
  rdma_host *h = cxr__host_find(r, ep->host);
  if (h == NULL && (h = calloc(1, sizeof *h)) != NULL) {
    snprintf(h->key, sizeof h->key, "%s", ep->host);
    h->next = r->hosts;
    r->hosts = h;
  }
  if (h != NULL) {
    old = h->exps;
    nold = h->nexps;
    oldwa = h->waddr;
    h->exps = exps;
    h->nexps = nexps;
    h->waddr = wa;
    h->waddr_len = walen;
    h->valid = true;
  }
  pthread_mutex_unlock(&r->lock);
  if (h == NULL) {
    old = exps;
    nold = nexps;
    oldwa = wa;
    rc = CXR_ENOMEM;
  }
  for (unsigned i = 0; i < nold; i++) free(old[i].rkey);
  free(old);
  free(oldwa);
  return rc;
}

/* ---- endpoints for a known host (no round trip on the caller's thread) ----
 * Made from the host's worker address. (Client-server endpoints made from its listener
 * address would let the host hear when we go, but idle ones of those stalled the worker
 * for tens of seconds while a link was down in UCX 1.13: CXRPC_RDMA_POOL_SOCKADDR=1 still
 * selects them.) */

typedef struct ep_where {
  bool has_sa;
  struct sockaddr_in sa;
  void *wa;
} ep_where;

/* Where a known host can be reached: its listener's address if we have it, and `wa` (a copy
 * of its worker address, or NULL). Hold r->lock. */
static ep_where where_of(const rdma_host *h, void *wa) {
  return (ep_where){.has_sa = h->has_sa, .sa = h->sa, .wa = wa};
}

static int ep_from_waddr(cxr_rdma *r, const char *key, const ep_where *w, cxr_rdma_ep **out) {
  cxr_rdma_ep *ep = ep_new(r, key);
  if (ep == NULL) return CXR_ENOMEM;
  ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                     UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                     UCP_EP_PARAM_FIELD_ERR_HANDLER,
                       .address = w->wa,
                       .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                       .err_handler = {.cb = cxr__ep_err_cb, .arg = ep}};
  if (w->has_sa && (w->wa == NULL || getenv("CXRPC_RDMA_POOL_SOCKADDR") != NULL)) {
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr = (ucs_sock_addr_t){.addr = (const struct sockaddr *)&w->sa, .addrlen = sizeof w->sa};
  }
  ucs_status_t st = ucp_ep_create(r->worker, &p, &ep->uep);
  if (st != UCS_OK) {
    ep_free(ep);
    return cxr__rdma_status(st);
  }
  ep_link(ep);
  *out = ep;
  return 0;
}

static void ep_destroy(cxr_rdma_ep *ep);

/* Deferred: tops up the pool of ready endpoints for one host. */
static void refill(void *arg) {
  cxr_rdma_ep *probe = arg;  /* a heap copy of the key, in an ep-shaped box */
  cxr_rdma *r = probe->r;
  for (;;) {
    void *wa = NULL;
    ep_where w = {0};
    pthread_mutex_lock(&r->lock);
    rdma_host *h = cxr__host_find(r, probe->host);
    if (h && h->valid && h->npool < r->pool_target && h->waddr) {
      wa = malloc(h->waddr_len);
      if (wa) memcpy(wa, h->waddr, h->waddr_len);
      w = where_of(h, wa);
    }
    if (h && !wa) h->refilling = false;
    pthread_mutex_unlock(&r->lock);
    if (wa == NULL) break;
    cxr_rdma_ep *ep = NULL;
    int rc = ep_from_waddr(r, probe->host, &w, &ep);
    free(wa);
    if (rc) {
      CXR_DEBUG("rdma: pool for %s: %s", probe->host, cxr_strerror(rc));
      break;
    }
    bool kept = false;
    pthread_mutex_lock(&r->lock);
    h = cxr__host_find(r, probe->host);
    if (h && h->valid && h->npool < r->pool_target) {
      ep->pooled = true;
      h->pool[h->npool++] = ep;
      kept = true;
    }
    pthread_mutex_unlock(&r->lock);
    if (!kept) {
      ep_destroy(ep);
      break;
    }
  }
  pthread_mutex_lock(&r->lock);  /* whatever ended the loop, a later connect may refill */
  rdma_host *h = cxr__host_find(r, probe->host);
  if (h) h->refilling = false;
  pthread_mutex_unlock(&r->lock);
  CXR_DEBUG("rdma: pool for %s refilled", probe->host);
  ep_free(probe);
}

static void schedule_refill(cxr_rdma *r, const char *key) {
  pthread_mutex_lock(&r->lock);
  rdma_host *h = cxr__host_find(r, key);
  bool go = h && h->valid && !h->refilling && h->npool < r->pool_target;
  if (go) h->refilling = true;
  pthread_mutex_unlock(&r->lock);
  if (!go) return;
  cxr_rdma_ep *probe = ep_new(r, key);
  if (probe == NULL || cxr_rdma_defer(r, refill, probe) != 0) {
    if (probe) ep_free(probe);
    pthread_mutex_lock(&r->lock);
    if (h) h->refilling = false;
    pthread_mutex_unlock(&r->lock);
  }
}

/* Takes a ready endpoint for a known host, or makes one from its worker address. */
static cxr_rdma_ep *warm(cxr_rdma *r, const char *key) {
  cxr_rdma_ep *ep = NULL;
  void *wa = NULL;
  ep_where w = {0};
  pthread_mutex_lock(&r->lock);
  rdma_host *h = cxr__host_find(r, key);
  if (h && h->valid) {
    w = where_of(h, NULL);
    while (h->npool > 0 && ep == NULL) {
      cxr_rdma_ep *e = h->pool[--h->npool];
      e->pooled = false;
      if (atomic_load(&e->status) == 0) ep = e;
      else e->closing = true;  /* failed while pooled: its error job frees it */
    }
    if (ep) r->pool_hits++;
    if (ep == NULL && h->waddr && (wa = malloc(h->waddr_len)) != NULL)
      memcpy(wa, h->waddr, h->waddr_len);
  }
  pthread_mutex_unlock(&r->lock);
  if (ep == NULL && wa != NULL) {
    w.wa = wa;
    if (ep_from_waddr(r, key, &w, &ep) != 0) ep = NULL;
  }
  free(wa);
  if (ep) schedule_refill(r, key);
  return ep;
}

static int cold(cxr_rdma *r, const char *key, const struct sockaddr_in *sa, int64_t deadline,
                cxr_rdma_ep **out) {
  cxr_rdma_ep *ep = ep_new(r, key);
  if (ep == NULL) return CXR_ENOMEM;
  ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                     UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                     UCP_EP_PARAM_FIELD_ERR_HANDLER,
                       .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                       .sockaddr = {.addr = (const struct sockaddr *)sa, .addrlen = sizeof *sa},
                       .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                       .err_handler = {.cb = cxr__ep_err_cb, .arg = ep}};
  ucs_status_t st = ucp_ep_create(r->worker, &p, &ep->uep);
  if (st != UCS_OK) {
    ep_free(ep);
    CXR_INFO("rdma: cannot connect to %s: %s", key, ucs_status_string(st));
    return cxr__rdma_status(st) == CXR_EPEERDEAD ? CXR_ENOTCONN : cxr__rdma_status(st);
  }
  ep_link(ep);
  int rc = hello(ep, deadline);
  if (rc) {
    /* Nobody answering at that address is "not connected", not a dead peer. */
    if (rc == CXR_EPEERDEAD) rc = CXR_ENOTCONN;
    CXR_INFO("rdma: connect to %s failed: %s", key, cxr_strerror(rc));
    cxr__ep_force_close(ep);  /* nothing to flush to a peer that never answered */
    cxr_rdma_ep_close(ep);
    return rc;
  }
  pthread_mutex_lock(&r->lock);
  r->cold++;
  rdma_host *h = cxr__host_find(r, key);
  if (h) {
    h->sa = *sa;
    h->has_sa = true;
  }
  pthread_mutex_unlock(&r->lock);
  schedule_refill(r, key);
  *out = ep;
  return 0;
}

int cxr_rdma_connect(cxr_rdma *r, const char *hostport, int64_t deadline_ns,
                     cxr_rdma_ep **out) {
  if (out) *out = NULL;
  if (r == NULL || hostport == NULL || out == NULL) return CXR_EINVAL;
  if (strlen(hostport) >= HOSTKEY_MAX) return CXR_ENAMETOOLONG;
  if (cxr__rdma_copy(r)) return CXR_ECLOSED;
  int64_t deadline = cxr__deadline(deadline_ns);
  cxr_rdma_ep *ep = warm(r, hostport);
  if (ep) {
    pthread_mutex_lock(&r->lock);
    r->warm++;
    pthread_mutex_unlock(&r->lock);
    *out = ep;
    return 0;
  }
  struct sockaddr_in sa;
  int rc = cxr__parse_hostport(hostport, &sa);
  if (rc) return rc;
  return cold(r, hostport, &sa, deadline, out);
}

int cxr_rdma_refresh(cxr_rdma_ep *ep, int64_t deadline_ns) {
  if (ep == NULL || ep->server_side) return CXR_EINVAL;
  if (cxr__rdma_copy(ep->r)) return CXR_ECLOSED;
  int st = atomic_load(&ep->status);
  if (st) return st;
  return hello(ep, cxr__deadline(deadline_ns));
}

void cxr_rdma_forget(cxr_rdma *r, const char *hostport) {
  if (r == NULL || hostport == NULL || cxr__rdma_copy(r)) return;
  cxr_rdma_ep *drop[POOL_MAX];
  unsigned n = 0;
  pthread_mutex_lock(&r->lock);
  rdma_host *h = cxr__host_find(r, hostport);
  if (h) {
    h->valid = false;
    /* Not pooled from here, under the lock: an endpoint failing meanwhile has its error job
     * (which closes a pooled one) leave it to us; cleared after the unlock, both closed it
     * (a review: a double close, and closing_eps looped into itself). */
    while (h->npool) {
      drop[n] = h->pool[--h->npool];
      drop[n++]->pooled = false;
    }
  }
  pthread_mutex_unlock(&r->lock);
  for (unsigned i = 0; i < n; i++) cxr_rdma_ep_close(drop[i]);
}

/* ---- failures ---- */

/* The failed endpoint by id, not by address: a user may close (free) it before the job runs,
 * and a new endpoint, pooled or accepted, may then get the same address, which the job
 * would have closed in its place. */
typedef struct err_arg {
  cxr_rdma *r;
  uint64_t id;
} err_arg;

static void err_job(void *arg) {
  err_arg a = *(err_arg *)arg;
  free(arg);
  cxr_rdma *r = a.r;
  /* Still ours to handle? (a user close may have raced the failure) */
  pthread_mutex_lock(&r->lock);
  cxr_rdma_ep *ep = r->eps;
  while (ep && ep->id != a.id) ep = ep->next;
  bool drop = ep && (ep->server_side || ep->pooled || ep->closing);
  if (drop && ep->server_side && ep->refs > 0) {
    ep->zombie = true;  /* a queued message still refers to it: the last one closes it */
    drop = false;
  }
  if (drop && ep->pooled) {
    for (rdma_host *h = r->hosts; h; h = h->next)
      for (unsigned i = 0; i < h->npool; i++)
        if (h->pool[i] == ep) h->pool[i] = h->pool[--h->npool];
    ep->pooled = false;
  }
  pthread_mutex_unlock(&r->lock);
  if (drop) cxr_rdma_ep_close(ep);
}

/* Has the progress thread handle the endpoint's failure (err_job; it closes a failed one
 * nobody holds). From UCX callbacks too: no close runs inside one. Without memory the
 * endpoint stays until the engine closes. */
static void err_job_defer(cxr_rdma_ep *ep) {
  err_arg *a = malloc(sizeof *a);
  if (a == NULL) return;
  a->r = ep->r;
  a->id = ep->id;
  if (cxr_rdma_defer(ep->r, err_job, a) != 0) free(a);
}

void cxr__ep_err_cb(void *arg, ucp_ep_h uep, ucs_status_t status) {
  cxr_rdma_ep *ep = arg;
  cxr_rdma *r = ep->r;
  int err = cxr__rdma_status(status);
  if (err == 0 || err == CXR_ECANCELED) err = CXR_ENOTCONN;
  int zero = 0;
  if (!atomic_compare_exchange_strong(&ep->status, &zero, err)) return;
  if (ep->server_side || ep->pooled)  /* a client left, or a spare endpoint: routine */
    CXR_DEBUG("rdma: client %s left: %s", ep->host, ucs_status_string(status));
  else
    CXR_WARN("rdma: endpoint to %s failed: %s (%s)", ep->host, cxr_strerror(err),
             ucs_status_string(status));
  if (!ep->server_side) {
    /* The host (or the path to it) is gone: its pooled endpoints and worker address are
     * stale, so the next connect must be cold. */
    pthread_mutex_lock(&r->lock);
    rdma_host *h = cxr__host_find(r, ep->host);
    if (h) h->valid = false;
    pthread_mutex_unlock(&r->lock);
  }
  /* seq_cst with the status CAS above and the store in cxr_rdma_ep_on_error: see there. */
  void (*cb)(cxr_rdma_ep *, int, void *) = __atomic_load_n(&ep->on_err, __ATOMIC_SEQ_CST);
  if (cb) cb(ep, err, __atomic_load_n(&ep->on_err_user, __ATOMIC_RELAXED));
  err_job_defer(ep);
}

/* Whether a message on UCX handle `uep` finds endpoint e by the copy of its handle: while a
 * missed deadline's close of it is under way (uclose 1; take_uep sets uclose before it
 * clears uep, with release/acquire, so a lookup that reads NULL sees uclose 1). Once closed
 * (uclose 2) not: UCX may give the address to a new endpoint. */
static bool closing_on(const cxr_rdma_ep *e, ucp_ep_h uep) {
  return e->handle == uep && atomic_load(&e->uclose) == 1;
}

/* The endpoint of ours, accepted or opened by us, on UCX handle `uep` (NULL if none), its
 * close begun or not. Hold r->lock. A linked endpoint's handle may be taken out meanwhile
 * (take_uep, a missed deadline on another thread): read atomically. Until its close is done
 * a message may still come on it, found by closing_on: it was found by ep->uep alone, so
 * such a message held no endpoint, its rendezvous receive counted on the engine and a reply
 * went bare on the closing handle (close_silent_test
 * AMessageInAMissedDeadlinesCloseWindowHoldsItsEndpoint). So too once the user's close has
 * begun meanwhile (on r->closing_eps): closing_begin recorded the handle from ep->uep,
 * already NULL (close_silent_test AMessageInTheWindowWhileTheUsersCloseWaitsHoldsItsEndpoint).
 * Live handles win; the closing one is the fallback, so a miss (every message on a bare
 * handle) walks each list once. */
static cxr_rdma_ep *ep_on(cxr_rdma *r, ucp_ep_h uep) {
  cxr_rdma_ep *closing = NULL;
  for (cxr_rdma_ep *e = r->eps; e; e = e->next) {
    if (__atomic_load_n(&e->uep, __ATOMIC_ACQUIRE) == uep) return e;
    if (closing == NULL && closing_on(e, uep)) closing = e;
  }
  for (cxr_rdma_ep *e = r->closing_eps; e; e = e->closing_next) {
    if (e->closing_uep == uep) return e;
    if (closing == NULL && closing_on(e, uep)) closing = e;
  }
  return closing;
}

/* Any endpoint of ours, not only an accepted one: a message that came on one we opened once
 * carried only UCX's handle, and a reply after the endpoint's close (by the message's
 * handler, or on a kept message) posted on that closed handle, inside UCX's freed endpoint,
 * and returned 0 (close_reply_test, AKeptMessageFromAnEndpointWeClosedCannotBeAnswered). */
cxr_rdma_ep *cxr__ep_hold(cxr_rdma *r, ucp_ep_h uep) {
  pthread_mutex_lock(&r->lock);
  cxr_rdma_ep *found = ep_on(r, uep);
  if (found) found->refs++;
  pthread_mutex_unlock(&r->lock);
  return found;
}

bool cxr__ep_closed(cxr_rdma_ep *ep) { return __atomic_load_n(&ep->closed, __ATOMIC_ACQUIRE); }

/* Counted under r->lock, as the close begins (closing_begin): a count made before it is
 * seen by the close's waits (ep_destroy, ep_close_free), which then force the close and end
 * the receive. A receive after it is refused: it once counted on the engine (its handle was
 * on no endpoint of ours any more), so the endpoint's close, having found it idle, was
 * graceful and gave up at 200 ms with the receive in UCX, and the engine's close left the
 * worker undestroyed (close_silent_test ClosingOurEndpointAsALargeMessageIsAdmittedRefusesIt,
 * under ASan). */
atomic_int *cxr__recv_count(cxr_rdma *r, cxr_rdma_ep *ep) {
  pthread_mutex_lock(&r->lock);
  atomic_int *open = &r->bare_recvs;
  /* Nor once its handle is being closed by a missed deadline (take_uep): the force close
   * may already have cancelled what it had. */
  if (ep != NULL)
    open = __atomic_load_n(&ep->closed, __ATOMIC_RELAXED) || atomic_load(&ep->uclose) != 0
               ? NULL : &ep->open_recvs;
  if (open) cxr__req_begin(open == &r->bare_recvs ? NULL : ep, open);
  else r->rndv_refused_closing++;
  pthread_mutex_unlock(&r->lock);
  return open;
}

/* The last message off a failed endpoint has it closed on the progress thread, not here: a
 * message is also freed inside UCX callbacks (a receive that failed), where a close would
 * call UCX and take the endpoint's ulock for writing while a reply on another thread holds
 * it for reading and waits for the worker's lock (TSan, rdma_test, once replies took ulock). */
void cxr__ep_drop(cxr_rdma_ep *ep) {
  cxr_rdma *r = ep->r;
  pthread_mutex_lock(&r->lock);
  bool last = --ep->refs == 0, free_it = last && ep->kept, close = last && ep->zombie;
  pthread_mutex_unlock(&r->lock);
  if (free_it) ep_free(ep);  /* closed already: no UCX call, fine inside a UCX callback */
  else if (close) err_job_defer(ep);
}

int cxr_rdma_ep_status(const cxr_rdma_ep *ep) {
  if (ep == NULL) return CXR_EINVAL;
  return cxr__rdma_copy(ep->r) ? CXR_ECLOSED : atomic_load((_Atomic int *)&ep->status);
}
const char *cxr_rdma_ep_host(const cxr_rdma_ep *ep) { return ep ? ep->host : ""; }

int cxr_rdma_ep_on_error(cxr_rdma_ep *ep, void (*cb)(cxr_rdma_ep *, int, void *), void *user) {
  if (ep == NULL) return CXR_EINVAL;
  if (cxr__rdma_copy(ep->r)) return CXR_ECLOSED;
  /* Set from any thread while the progress thread may be failing the endpoint: the user
   * pointer first, published by the function pointer. A caller that then reads the status
   * (rpc/remote_server.c) must not miss a failure whose callback missed cb: with release
   * here and acquire there, the store and the later load could pass each other on x86 (a
   * store-buffer reorder) and the client would never be reaped; seq_cst on both sides and
   * on the status orders them (at worst both see each other: the callback runs twice). */
  __atomic_store_n(&ep->on_err_user, user, __ATOMIC_RELAXED);
  __atomic_store_n(&ep->on_err, cb, __ATOMIC_SEQ_CST);
  return 0;
}

/* ---- the UCX handle's lifetime ----
 * Several threads may use one endpoint, and one of them may end it (a missed deadline,
 * cxr__ep_end) while the others are about to post, or are posting, on its UCX handle. A
 * poster reads the handle and hands UCX its request under ulock for reading; the closer sets
 * the status first (new posters stop before the lock), takes the handle out under ulock for
 * writing (waiting only for posts under way, never for completions), then closes it outside
 * the lock. The force close cancels every request still on the handle: their waiters get
 * CXR_ECANCELED (or their deadline), and UCX touches none of their buffers afterwards. */

int cxr__ep_use(cxr_rdma_ep *ep, ucp_ep_h *uep) {
  if (cxr__rdma_copy(ep->r)) return CXR_ECLOSED; /* every post, whoever asks */
  int st = atomic_load(&ep->status);
  if (st) return st;
  pthread_rwlock_rdlock(&ep->ulock);
  st = atomic_load(&ep->status);
  /* Not once its close began (closing_begin precedes take_uep's write lock): a parked
   * endpoint gets its handle back, and a reply that passed its own look at `closed` before
   * the close went out on it (a review). */
  if (st == 0 && ep->uep != NULL && !__atomic_load_n(&ep->closed, __ATOMIC_ACQUIRE)) {
    *uep = ep->uep;
    return 0;
  }
  pthread_rwlock_unlock(&ep->ulock);
  return st ? st : CXR_ENOTCONN;
}

void cxr__ep_unuse(cxr_rdma_ep *ep) { pthread_rwlock_unlock(&ep->ulock); }

/* Takes the handle out of the endpoint once no post is under way (NULL if already out). */
static ucp_ep_h take_uep(cxr_rdma_ep *ep) {
  pthread_rwlock_wrlock(&ep->ulock);
  ucp_ep_h u = ep->uep;
  /* uclose first: ep_on, under r->lock alone, that reads the handle out finds uclose 1 */
  if (u) atomic_store(&ep->uclose, 1);
  __atomic_store_n(&ep->uep, NULL, __ATOMIC_RELEASE);
  pthread_rwlock_unlock(&ep->ulock);
  return u;
}

static bool request_done(void *req) { return ucp_request_check_status(req) != UCS_INPROGRESS; }

/* Closes a handle taken out of its endpoint and waits for the close until `deadline`; then
 * marks the endpoint closed. The close request has no callback: it is polled, then given back
 * with ucp_request_free whether it finished or not, so UCX frees it itself when it ends. A
 * graceful close of an endpoint whose peer is stopped does not finish (it waits for the
 * peer's disconnect), and one abandoned to a callback instead, not yet released, made
 * ucp_worker_destroy abort ("req->flags & UCP_REQUEST_FLAG_RELEASED" in ucp_ep.c, UCX 1.13:
 * the endpoint's last disconnect step still queued with the user's unreleased request), 10
 * runs in 10 for an engine closed with an endpoint to a stopped peer. */
static int close_uep(cxr_rdma_ep *ep, ucp_ep_h u, bool force, int64_t deadline) {
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                           .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
  ucs_status_ptr_t sp = ucp_ep_close_nbx(u, &p);
  int rc = 0;
  if (UCS_PTR_IS_ERR(sp)) {
    rc = cxr__rdma_status(UCS_PTR_STATUS(sp));
  } else if (sp != NULL) {
    cxr__progress_until(ep->r, request_done, sp, deadline);
    ucs_status_t st = ucp_request_check_status(sp);
    rc = st == UCS_INPROGRESS ? CXR_ETIMEDOUT : cxr__rdma_status(st);
    ucp_request_free(sp);
  }
  atomic_store(&ep->uclose, 2);
  return rc;
}

static bool no_ops(void *ep) { return atomic_load(&((cxr_rdma_ep *)ep)->open_ops) == 0; }

/* Waits (bounded, progressing the worker) until no one-sided op (get, put, flush, atomic)
 * posted on the endpoint is left with UCX: 0 then, or how many are left. */
static int ops_done(cxr_rdma_ep *ep, int64_t deadline) {
  cxr__progress_until(ep->r, no_ops, ep, deadline);
  return atomic_load(&ep->open_ops);
}

static bool idle(void *arg) {
  cxr_rdma_ep *ep = arg;
  return atomic_load(&ep->open_ops) == 0 && atomic_load(&ep->open_sends) == 0 &&
         atomic_load(&ep->open_recvs) == 0;
}

/* Same for one-sided ops and messages (sends, posts) together: true once none is left. */
static bool all_done(cxr_rdma_ep *ep, int64_t deadline) {
  cxr__progress_until(ep->r, idle, ep, deadline);
  return idle(ep);
}

/* Another thread took the handle out and is closing it: wait (bounded) until it is closed. */
static void wait_closed(cxr_rdma_ep *ep, int64_t deadline) {
  while (atomic_load(&ep->uclose) == 1 && cxr_now_ns() < deadline) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

void (*cxr__ep_end_window)(cxr_rdma_ep *ep, ucp_ep_h u);

/* The caller holds the endpoint (cxr__ep_enter): a user's close that gives up waiting for
 * this one (wait_closed, 1.1 s) returns with it under way, and a second thread's end waits
 * for it here in the endpoint's memory, which the close of the first once freed under it
 * (close_silent_test AMissedDeadlineWaitingForAnothersCloseOutlivesTheUsersClose). */
void cxr__ep_end(cxr_rdma_ep *ep) {
  cxr__ep_force_close(ep);
  ucp_ep_h u = take_uep(ep);
  if (u) {
    void (*window)(cxr_rdma_ep *, ucp_ep_h) = cxr__ep_end_window;
    if (window) window(ep, u);
    /* (the second counted from here: a test's window must not spend the close's time) */
    close_uep(ep, u, true, cxr_now_ns() + 1000000000);
    return;
  }
  wait_closed(ep, cxr_now_ns() + 1100000000);
}

/* ---- closing ---- */

static void rkeys_destroy(cxr_rdma_ep *ep) {
  cxr_rdma *r = ep->r;
  pthread_mutex_lock(&r->lock);
  cxr_rdma_rkey *rk = ep->rkeys;
  ep->rkeys = NULL;
  pthread_mutex_unlock(&r->lock);
  while (rk) {
    cxr_rdma_rkey *n = rk->next;
    ucp_rkey_destroy(rk->rk);
    free(rk);
    rk = n;
  }
}

/* Set in ep->reqs by the end of an endpoint's close: the requests still counted there then
 * (and the calls holding it, a missed deadline's end under way) keep it, and the last of
 * them frees it. */
enum { EP_REQS_ORPHAN = 1 << 30 };

/* A closed endpoint nothing of UCX's holds any more leaves r->orphans and is freed, or left
 * to the last message holding it (cxr__ep_hold), which frees it (cxr__ep_drop). No UCX
 * call: fine inside a UCX callback. */
static void ep_release(cxr_rdma_ep *ep) {
  cxr_rdma *r = ep->r;
  pthread_mutex_lock(&r->lock);
  for (cxr_rdma_ep **pp = &r->orphans; ep->orphaned && *pp; pp = &(*pp)->orphan_next)
    if (*pp == ep) {
      *pp = ep->orphan_next;
      ep->orphaned = false;
      break;
    }
  bool held = ep->kept = ep->refs > 0;
  pthread_mutex_unlock(&r->lock);
  if (!held) ep_free(ep);
}

static bool no_orphans(void *arg) {
  cxr_rdma *r = arg;
  pthread_mutex_lock(&r->lock);
  bool none = r->orphans == NULL;
  pthread_mutex_unlock(&r->lock);
  return none;
}

unsigned cxr__eps_orphans_left(cxr_rdma *r, int64_t deadline) {
  cxr__progress_until(r, no_orphans, r, deadline);
  unsigned n = 0;
  pthread_mutex_lock(&r->lock);
  for (cxr_rdma_ep *ep = r->orphans; ep; ep = ep->orphan_next) n++;
  pthread_mutex_unlock(&r->lock);
  return n;
}

static void reqs_drop(cxr_rdma_ep *ep) {
  if (atomic_fetch_sub(&ep->reqs, 1) == EP_REQS_ORPHAN + 1) ep_release(ep);
}

void cxr__req_end(cxr_rdma_ep *ep, atomic_int *open) {
  atomic_fetch_sub(open, 1);
  if (ep) reqs_drop(ep);  /* last: the endpoint may be gone after it */
}

void cxr__ep_leave(cxr_rdma_ep *ep) { reqs_drop(ep); }

/* Closes a handle taken out of its endpoint (NULL: none, or another thread's close under
 * way), then frees the endpoint, its remote keys first. A flush to a silent peer could take
 * forever: the close is bounded (200 ms), and a failed endpoint is force-closed. So is one
 * with messages still pending (ep_destroy gave them their wait): the data of a send that
 * timed out is the caller's, who may free it once the close returns, and a graceful close
 * abandoned at its bound left the send with UCX, which read the data when the peer resumed
 * (a buffer made inaccessible then: UCX 1.13 aborted in tcp_ep.c; rdma_test). A force close
 * cancels every request on the handle; their callbacks, awaited below, end UCX's use of the
 * data. */
static void ep_close_free(cxr_rdma_ep *ep, ucp_ep_h u) {
  rkeys_destroy(ep);
  if (u) {
    bool force = atomic_load(&ep->status) != 0 || atomic_load(&ep->open_sends) != 0 ||
                 atomic_load(&ep->open_recvs) != 0;
    int rc = close_uep(ep, u, force, cxr_now_ns() + 200000000);
    if (rc == CXR_ETIMEDOUT) CXR_DEBUG("rdma: close of %s did not finish", ep->host);
  } else {
    wait_closed(ep, cxr_now_ns() + 1100000000);  /* a missed deadline's close under way */
  }
  closing_end(ep);
  /* The close cancels what was left; their callbacks are awaited (bounded). One still to
   * come counts down in the endpoint's memory, and a missed deadline's call still under way
   * (wait_closed gave up on its close) holds it: the last of them frees the endpoint
   * (cxr__req_end, cxr__ep_leave). It was kept for good: a leak (close_silent_test
   * AnEndpointWhoseRequestsOutliveItsCloseIsFreedByTheLast). */
  if (!all_done(ep, cxr_now_ns() + 100000000)) {
    CXR_WARN("rdma: requests to %s outlived the endpoint's close; the last to end frees it",
             ep->host);
    /* The engine's close waits for them too (cxr__eps_orphans_left): UCX 1.13's force
     * close does not always cancel a rendezvous send whose receiver stopped, and
     * ucp_worker_destroy then drops it without its callback ("not returned to mpool"),
     * its op and this endpoint unreachable (LeakSanitizer: 1 run in 4 to 8 of that
     * test). Such an engine leaves its worker to UCX, as for parked endpoints. */
    pthread_mutex_lock(&ep->r->lock);
    ep->orphan_next = ep->r->orphans;
    ep->r->orphans = ep;
    ep->orphaned = true;
    pthread_mutex_unlock(&ep->r->lock);
  }
  if (atomic_fetch_add(&ep->reqs, EP_REQS_ORPHAN) == 0) ep_release(ep);
}

/* One-sided ops still with UCX (atomics, chunks of gets/puts abandoned at their deadline,
 * mem.c) get a bounded wait (200 ms) before the endpoint closes. If they do not finish, the
 * target has been silent all along, and no close of the handle is safe with UCX 1.13: a
 * force close cancels them, and the target, resumed, aborted on the requests of an endpoint
 * that was gone (ucp_atomic_req_handler, ucp_get_req_handler, ucp_put_handler: "Endpoint
 * timeout"); a graceful close leaves them on the handle, and ucp_worker_destroy then asserted
 * on them (ucp_ep_destroy_base: proto_reqs not empty). (A separate ucp_ep_flush_nbx instead
 * of the wait crashed now and then: UCX purging the pending flush at the force close, SEGV in
 * ucp_request_memory_dereg.) So such an endpoint is parked on the engine, its handle open and
 * its remote keys alive for the ops, its user callback gone, and closed by cxr__eps_unpark
 * once its ops finished (a target that resumes finds its endpoint alive). The endpoint is
 * gone for its user either way. */
static void parked_push(cxr_rdma *r, cxr_rdma_ep *ep) {
  pthread_mutex_lock(&r->lock);
  ep->next = r->parked;
  r->parked = ep;
  pthread_mutex_unlock(&r->lock);
}

static void ep_park(cxr_rdma_ep *ep, ucp_ep_h u) {
  __atomic_store_n(&ep->on_err, NULL, __ATOMIC_RELEASE);
  pthread_rwlock_wrlock(&ep->ulock);
  ep->uep = u;
  pthread_rwlock_unlock(&ep->ulock);
  atomic_store(&ep->uclose, 0);
  parked_push(ep->r, ep);
  CXR_INFO("rdma: endpoint to %s closed with one-sided ops pending at a silent target: "
           "parked until they finish or the engine closes", ep->host);
}

/* A live endpoint's one-sided ops and messages get one bounded wait (200 ms) together.
 * Ops left after it park the endpoint, messages left or not: a force close cancels the
 * ops, and the target, resumed, aborted on them (a review of the first version, which
 * forced the close when messages were left too: close_silent_test). A parked endpoint's
 * handle stays open, so UCX may still read the data of a send left on it until its ops
 * finish or the engine closes (rdma.h says so). Messages alone force the close
 * (ep_close_free), which ends UCX's use of their data before the close returns. */
static void ep_destroy(cxr_rdma_ep *ep) {
  cxr__eps_unpark(ep->r, 0);  /* parked endpoints whose ops finished meanwhile */
  closing_begin(ep);  /* before its handle goes: replies and large messages stop at this */
  ucp_ep_h u = take_uep(ep);
  if (u && atomic_load(&ep->status) == 0 && !all_done(ep, cxr_now_ns() + 200000000) &&
      atomic_load(&ep->open_ops) != 0) {
    ep_park(ep, u);
    return;
  }
  ep_close_free(ep, u);
}

unsigned cxr__eps_unpark(cxr_rdma *r, int64_t wait_ns) {
  pthread_mutex_lock(&r->lock);
  cxr_rdma_ep *ep = r->parked;
  r->parked = NULL;
  pthread_mutex_unlock(&r->lock);
  int64_t deadline = cxr_now_ns() + wait_ns;  /* shared by all of them */
  unsigned left = 0;
  while (ep) {
    cxr_rdma_ep *next = ep->next;
    if (atomic_load(&ep->status) != 0 || ops_done(ep, deadline) == 0) {
      ep_close_free(ep, take_uep(ep));
      ep = next;
      continue;
    }
    left++;
    parked_push(r, ep);
    ep = next;
  }
  return left;
}

void cxr__ep_force_close(cxr_rdma_ep *ep) {
  int zero = 0;
  atomic_compare_exchange_strong(&ep->status, &zero, CXR_ENOTCONN);
}

void cxr_rdma_ep_close(cxr_rdma_ep *ep) {
  if (ep == NULL || cxr__rdma_copy(ep->r)) return;
  ep_destroy(ep);
}

void cxr__eps_close_all(cxr_rdma *r) {
  for (;;) {
    pthread_mutex_lock(&r->lock);
    cxr_rdma_ep *ep = r->eps;
    for (rdma_host *h = r->hosts; h; h = h->next) h->npool = 0;
    pthread_mutex_unlock(&r->lock);
    if (ep == NULL) break;
    ep_destroy(ep);
  }
}
