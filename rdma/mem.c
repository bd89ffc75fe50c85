/* Memory: registration with UCP_MEM_MAP_NONBLOCK, the pinned-memory budget (a registration
 * cache with LRU eviction and a pinned bounce buffer), exports and remote keys, and the
 * one-sided operations. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rdma/internal.h"

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Whether UCX can carry traffic over the device: one of its ports is up. A device this
 * process cannot open (no permission on its uverbs file) reports no ports. */
static bool dev_usable(const cxr_rdma_dev_info *d) {
  for (unsigned p = 0; p < d->nports && p < 4; p++)
    if (strcmp(d->ports[p].state, "active") == 0) return true;
  return false;
}

/* AUTO pins only where a device needs pinned memory: a usable verbs device without
 * on-demand paging. Over TCP and shared memory nothing needs pinning. (Until 2026-11-28 a
 * device that could not be opened, or had every port down, also switched pinning on, and
 * exports past the pin budget then failed with CXR_EFULL; found by review.) */
static int resolve_pin_mode(int mode) {
  if (mode != CXR_RDMA_PIN_AUTO) return mode;
  cxr_rdma_dev_info d[4];
  size_t n = 0;
  char why[64];
  if (cxr_rdma_devices(d, 4, &n, why, sizeof why) != 0 || n == 0) return CXR_RDMA_PIN_NEVER;
  for (size_t i = 0; i < n && i < 4; i++)
    if (dev_usable(&d[i]) && !d[i].odp) return CXR_RDMA_PIN_ALWAYS;
  return CXR_RDMA_PIN_NEVER;
}

/* Pins (mlock) a page-rounded range; caller holds r->lock and checked the budget. */
static int pin(cxr_rdma *r, void *p, size_t len, void **base, size_t *plen) {
  uintptr_t ps = page_size(), a = (uintptr_t)p & ~(ps - 1);
  uintptr_t e = ((uintptr_t)p + len + ps - 1) & ~(ps - 1);
  if (mlock((void *)a, e - a) != 0) return cxr__from_errno(errno);
  *base = (void *)a;
  *plen = e - a;
  r->pinned += *plen;
  if (r->pinned > r->pinned_peak) r->pinned_peak = r->pinned;
  return 0;
}

static void unpin(cxr_rdma *r, cxr_rdma_mr *mr) {
  if (mr->pin_len == 0) return;
  munlock(mr->pin_base, mr->pin_len);
  r->pinned -= mr->pin_len;
  mr->pin_len = 0;
}

int cxr__pin_init(cxr_rdma *r, const cxr_rdma_opts *o) {
  r->pin_mode = resolve_pin_mode(o->pin_mode);
  r->pin_budget = o->pin_budget;
  if (r->pin_mode != CXR_RDMA_PIN_ALWAYS) return 0;
  size_t ps = page_size();
  size_t b = o->bounce_size ? o->bounce_size : r->pin_budget / 8;
  if (b > (1u << 20)) b = 1u << 20;
  b &= ~(ps - 1);
  if (b < ps || b > r->pin_budget) {
    CXR_ERR("rdma: pin budget %zu too small for a bounce buffer", r->pin_budget);
    return CXR_EINVAL;
  }
  r->bounce = mmap(NULL, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r->bounce == MAP_FAILED) {
    r->bounce = NULL;
    return CXR_ENOMEM;
  }
  void *base;
  size_t plen;
  int rc = pin(r, r->bounce, b, &base, &plen);
  if (rc) {
    CXR_ERR("rdma: cannot pin the bounce buffer: %s", cxr_strerror(rc));
    munmap(r->bounce, b);
    r->bounce = NULL;
    return rc;
  }
  r->bounce_size = b;
  return 0;
}

static void mr_free_locked(cxr_rdma *r, cxr_rdma_mr *mr, ucp_mem_h *memh, void **rkey) {
  for (cxr_rdma_mr **pp = &r->mrs; *pp; pp = &(*pp)->next)
    if (*pp == mr) {
      *pp = mr->next;
      break;
    }
  unpin(r, mr);
  r->registered -= mr->len;
  *memh = mr->memh;
  *rkey = mr->rkey_buf;
}

void cxr__pin_fini(cxr_rdma *r) {
  for (;;) {
    pthread_mutex_lock(&r->lock);
    cxr_rdma_mr *mr = r->mrs;
    ucp_mem_h memh = NULL;
    void *rk = NULL;
    if (mr) mr_free_locked(r, mr, &memh, &rk);
    pthread_mutex_unlock(&r->lock);
    if (mr == NULL) break;
    if (rk) ucp_rkey_buffer_release(rk);
    if (memh) ucp_mem_unmap(r->ctx, memh);
    free(mr);
  }
  if (r->bounce) {
    munlock(r->bounce, r->bounce_size);
    munmap(r->bounce, r->bounce_size);
    r->pinned -= r->bounce_size;
    r->bounce = NULL;
  }
}

/* Makes room for `need` pinned bytes by dropping idle cached registrations, oldest first.
 * Caller holds r->lock; the dropped ones are returned on *victims for unmapping. */
static bool make_room(cxr_rdma *r, size_t need, cxr_rdma_mr **victims) {
  while (r->pinned + need > r->pin_budget) {
    cxr_rdma_mr *old = NULL;
    for (cxr_rdma_mr *m = r->mrs; m; m = m->next)
      if (m->cached && m->refs == 0 && m->pin_len && (!old || m->last_use < old->last_use))
        old = m;
    if (old == NULL) return false;
    ucp_mem_h memh;
    void *rk;
    mr_free_locked(r, old, &memh, &rk);
    old->next = *victims;
    *victims = old;
    r->evictions++;
  }
  return true;
}

static void free_victims(cxr_rdma *r, cxr_rdma_mr *v) {
  while (v) {
    cxr_rdma_mr *n = v->next;
    if (v->rkey_buf) ucp_rkey_buffer_release(v->rkey_buf);
    if (v->memh) ucp_mem_unmap(r->ctx, v->memh);
    free(v);
    v = n;
  }
}

static size_t pinned_len(const void *p, size_t len) {
  uintptr_t ps = page_size(), a = (uintptr_t)p & ~(ps - 1);
  return (((uintptr_t)p + len + ps - 1) & ~(ps - 1)) - a;
}

static int reg(cxr_rdma *r, void *p, size_t len, bool cached, bool pack, cxr_rdma_mr **out) {
  cxr_rdma_mr *mr = calloc(1, sizeof *mr);
  if (mr == NULL) return CXR_ENOMEM;
  mr->r = r;
  mr->p = p;
  mr->len = len;
  mr->cached = cached;
  cxr_rdma_mr *victims = NULL;
  int rc = 0;
  pthread_mutex_lock(&r->lock);
  if (r->pin_mode == CXR_RDMA_PIN_ALWAYS) {
    size_t need = pinned_len(p, len);
    if (!make_room(r, need, &victims)) rc = CXR_EFULL;
    else rc = pin(r, p, len, &mr->pin_base, &mr->pin_len);
  }
  if (rc == 0) r->registered += len;
  pthread_mutex_unlock(&r->lock);
  free_victims(r, victims);
  if (rc) {
    free(mr);
    return rc;
  }
  ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                           UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                           UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                             .address = p,
                             .length = len,
                             .flags = UCP_MEM_MAP_NONBLOCK};
  ucs_status_t st = ucp_mem_map(r->ctx, &mp, &mr->memh);
  if (st == UCS_OK && pack) st = ucp_rkey_pack(r->ctx, mr->memh, &mr->rkey_buf, &mr->rkey_len);
  if (st != UCS_OK) {
    CXR_WARN("rdma: cannot register %zu bytes: %s", len, ucs_status_string(st));
    if (mr->memh) ucp_mem_unmap(r->ctx, mr->memh);
    pthread_mutex_lock(&r->lock);
    unpin(r, mr);
    r->registered -= len;
    pthread_mutex_unlock(&r->lock);
    free(mr);
    return cxr__rdma_status(st);
  }
  pthread_mutex_lock(&r->lock);
  mr->last_use = ++r->use_clock;
  mr->next = r->mrs;
  r->mrs = mr;
  pthread_mutex_unlock(&r->lock);
  *out = mr;
  return 0;
}

int cxr_rdma_reg(cxr_rdma *r, void *p, size_t len, cxr_rdma_mr **mr) {
  if (mr) *mr = NULL;
  if (r == NULL || p == NULL || len == 0 || mr == NULL || len > UINTPTR_MAX - (uintptr_t)p)
    return CXR_EINVAL;
  if (cxr__rdma_copy(r)) return CXR_ECLOSED;
  return reg(r, p, len, false, true, mr);
}

/* Whether an export of that name exists (r->lock held). */
static bool export_named_locked(const cxr_rdma *r, const char *name) {
  for (const cxr_rdma_mr *m = r->mrs; m; m = m->next)
    if (m->exported && !strcmp(m->name, name)) return true;
  return false;
}

int cxr_rdma_export(cxr_rdma *r, const char *name, void *p, size_t len, cxr_rdma_mr **mr) {
  if (mr) *mr = NULL;
  /* A range that wraps would let hosts reading the export reach any address. */
  if (r == NULL || name == NULL || !*name || p == NULL || len == 0 || mr == NULL ||
      len > UINTPTR_MAX - (uintptr_t)p)
    return CXR_EINVAL;
  if (strlen(name) > EXPORT_NAME_MAX) return CXR_ENAMETOOLONG;
  if (cxr__rdma_copy(r)) return CXR_ECLOSED;
  pthread_mutex_lock(&r->lock);
  bool dup = export_named_locked(r, name);
  pthread_mutex_unlock(&r->lock);
  if (dup) return CXR_EEXIST;
  int rc = reg(r, p, len, false, true, mr);
  if (rc) return rc;
  /* Named only if nobody exported the name meanwhile (checked again under the lock: two
   * threads exporting one name could both pass the check above). */
  pthread_mutex_lock(&r->lock);
  dup = export_named_locked(r, name);
  if (!dup) {
    snprintf((*mr)->name, sizeof (*mr)->name, "%s", name);
    (*mr)->exported = true;
  }
  pthread_mutex_unlock(&r->lock);
  if (dup) {
    cxr_rdma_dereg(*mr);
    *mr = NULL;
    return CXR_EEXIST;
  }
  return 0;
}

void cxr_rdma_dereg(cxr_rdma_mr *mr) {
  if (mr == NULL || cxr__rdma_copy(mr->r)) return;
  cxr_rdma *r = mr->r;
  ucp_mem_h memh;
  void *rk;
  pthread_mutex_lock(&r->lock);
  mr_free_locked(r, mr, &memh, &rk);
  pthread_mutex_unlock(&r->lock);
  if (rk) ucp_rkey_buffer_release(rk);
  if (memh) ucp_mem_unmap(r->ctx, memh);
  free(mr);
}

int cxr_rdma_stats_get(const cxr_rdma *cr, cxr_rdma_stats *out) {
  if (cr == NULL || out == NULL) return CXR_EINVAL;
  if (cxr__rdma_copy(cr)) return CXR_ECLOSED; /* its lock may have been held at the fork */
  cxr_rdma *r = (cxr_rdma *)cr;
  pthread_mutex_lock(&r->lock);
  *out = (cxr_rdma_stats){.pinned = r->pinned, .pinned_peak = r->pinned_peak,
                          .pin_budget = r->pin_budget, .registered = r->registered,
                          .evictions = r->evictions, .bounced = r->bounced,
                          .cold_connects = r->cold, .warm_connects = r->warm,
                          .pool_hits = r->pool_hits,
                          .pin_mode = r->pin_mode,
                          .dropped_too_big = r->msgs_too_big,
                          .dropped_queue_full = r->msgs_queue_full,
                          .dropped_unhandled = r->msgs_unhandled,
                          .dropped_no_memory = r->msgs_no_memory};
  for (cxr_rdma_ep *e = r->parked; e; e = e->next) out->parked++;
  for (rdma_host *h = r->hosts; h; h = h->next) {
    out->known_hosts += h->valid;
    out->pooled += h->npool;
  }
  pthread_mutex_unlock(&r->lock);
  return 0;
}

/* ---- remote keys ---- */

int cxr_rdma_rkey_get(cxr_rdma_ep *ep, const char *name, cxr_rdma_rkey **out, uint64_t *base,
                  size_t *len) {
  if (out) *out = NULL;
  if (ep == NULL || name == NULL || out == NULL) return CXR_EINVAL;
  if (cxr__rdma_copy(ep->r)) return CXR_ECLOSED;
  cxr_rdma *r = ep->r;
  void *blob = NULL;
  rdma_export e = {0};
  pthread_mutex_lock(&r->lock);
  for (cxr_rdma_rkey *k = ep->rkeys; k; k = k->next)
    if (!strcmp(k->name, name)) {
      *out = k;
      if (base) *base = k->base;
      if (len) *len = k->len;
      pthread_mutex_unlock(&r->lock);
      return 0;
    }
  rdma_host *h = cxr__host_find(r, ep->host);
  for (unsigned i = 0; h != NULL && i < h->nexps; i++)
    if (!strcmp(h->exps[i].name, name) && (blob = malloc(h->exps[i].rlen)) != NULL) {
      e = h->exps[i];
      memcpy(blob, e.rkey, e.rlen);
      break;
    }
  pthread_mutex_unlock(&r->lock);
  if (blob == NULL) return CXR_ENOENT;
  cxr_rdma_rkey *k = calloc(1, sizeof *k);
  if (k == NULL) {
    free(blob);
    return CXR_ENOMEM;
  }
  /* An endpoint that failed, or that a missed deadline ended (finish() below, maybe in
   * another thread right now), has no UCX endpoint left to unpack a key for: its status, as
   * every operation on it returns. */
  ucp_ep_h uep;
  int rc = cxr__ep_use(ep, &uep);
  if (rc) {
    free(blob);
    free(k);
    return rc;
  }
  ucs_status_t st = ucp_ep_rkey_unpack(uep, blob, &k->rk);
  cxr__ep_unuse(ep);
  free(blob);
  if (st != UCS_OK) {
    free(k);
    return cxr__rdma_status(st);
  }
  k->ep = ep;
  k->base = e.base;
  k->len = e.len;
  snprintf(k->name, sizeof k->name, "%s", name);
  pthread_mutex_lock(&r->lock);
  k->next = ep->rkeys;
  ep->rkeys = k;
  pthread_mutex_unlock(&r->lock);
  *out = k;
  if (base) *base = k->base;
  if (len) *len = k->len;
  return 0;
}

/* ---- one-sided operations ---- */

static int check(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, size_t len) {
  if (ep == NULL || rk == NULL || rk->ep != ep) return CXR_EINVAL;
  if (cxr__rdma_copy(ep->r)) return CXR_ECLOSED;
  if (raddr < rk->base || len > rk->len || raddr - rk->base > rk->len - len) return CXR_ERANGE;
  return atomic_load(&ep->status);
}

/* Gets and puts move through memory their ops own, in chunks of at most this many bytes
 * (rma_bounced), so a missed deadline can abandon the ops and leave the endpoint open: UCX
 * never holds the caller's buffer after the call returns. 64 KiB: the malloc and the memcpy
 * of a chunk are noise next to moving it over a network, and each chunk abandoned at a silent
 * target holds that much heap until the target answers or the endpoint closes. */
#define RMA_BOUNCE_MAX ((size_t)64 * 1024)
/* Chunks of one call in flight at once: enough to keep the link busy (a window of 512 KiB),
 * and the most one timed-out call leaves abandoned. */
enum { RMA_WINDOW = 16 };

/* A missed deadline of a transfer through the caller's own registered buffer (pin mode
 * "always" only, transfer()): UCX cannot cancel a started transfer, so end the endpoint,
 * hoping nothing touches the caller's buffer after we return (UCX 1.13 does not promise it:
 * docs/rdma.md). Other threads' requests on it are cancelled too; their calls return an error
 * (cxr__ep_end, ep.c). */
static int finish(cxr_rdma_ep *ep, int rc) {
  if (rc == CXR_ETIMEDOUT) cxr__ep_end(ep);
  return rc;
}

enum { RMA_GET, RMA_PUT, RMA_FLUSH };

/* A one-sided op is posted between these two: the endpoint's handle is held only while
 * posting, and the op is counted on the endpoint's open_ops until UCX is done with it:
 * closing the endpoint waits for them (bounded) before it closes, and never frees the
 * endpoint under a callback still to come (ep.c, ep_destroy). post_begin: 0 with the handle
 * in *uep, or the endpoint's status (nothing taken). post_end gives the handle back and
 * returns what UCX returned; without a request (done in place, or an error) there is no
 * callback to count the op down, so it does. */
static int post_begin(cxr_rdma_ep *ep, rdma_op *op, ucp_ep_h *uep) {
  int rc = cxr__ep_use(ep, uep);
  if (rc) return rc;
  op->open = &ep->open_ops;
  op->ep = ep;
  cxr__req_begin(ep, op->open);
  return 0;
}

static ucs_status_ptr_t post_end(cxr_rdma_ep *ep, ucs_status_ptr_t sp) {
  cxr__ep_unuse(ep);
  if (sp == NULL || UCS_PTR_IS_ERR(sp)) cxr__req_end(ep, &ep->open_ops);
  return sp;
}

/* Posts a get, put or flush of `op` (post_begin/post_end). */
static ucs_status_ptr_t rma_post(cxr_rdma_ep *ep, rdma_op *op, int kind, cxr_rdma_rkey *rk,
                                 uint64_t raddr, void *buf, size_t len, int *rc) {
  ucp_ep_h uep;
  *rc = post_begin(ep, op, &uep);
  if (*rc) return NULL;
  ucp_request_param_t p = cxr__op_param(op);
  return post_end(ep, kind == RMA_PUT   ? ucp_put_nbx(uep, buf, len, raddr, rk->rk, &p)
                      : kind == RMA_GET ? ucp_get_nbx(uep, buf, len, raddr, rk->rk, &p)
                                        : ucp_ep_flush_nbx(uep, &p));
}

/* One get, put or flush on the caller's buffer, waited for until `deadline`. */
static int rma_one(cxr_rdma_ep *ep, int kind, cxr_rdma_rkey *rk, uint64_t raddr, void *buf,
                   size_t len, int64_t deadline) {
  rdma_op *op = cxr__op_new();
  if (op == NULL) return CXR_ENOMEM;
  int rc;
  ucs_status_ptr_t sp = rma_post(ep, op, kind, rk, raddr, buf, len, &rc);
  if (rc) {
    free(op);
    return rc;
  }
  return cxr__op_wait(ep->r, sp, op, deadline);
}

static int rma(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, void *buf, size_t len,
               bool is_put, int64_t deadline) {
  cxr__ep_enter(ep);  /* until after finish: its own op may be the endpoint's last request */
  int rc = rma_one(ep, is_put ? RMA_PUT : RMA_GET, rk, raddr, buf, len, deadline);
  /* A put is complete locally; flush so it is visible at the target on return. */
  if (rc == 0 && is_put) rc = rma_one(ep, RMA_FLUSH, rk, raddr, buf, len, deadline);
  rc = finish(ep, rc);
  cxr__ep_leave(ep);
  return rc;
}

/* One chunk of a get or put: an op and the bytes it moves, one allocation. */
typedef struct rma_chunk {
  rdma_op op;
  size_t off, len;  /* where in the caller's buffer */
  _Alignas(16) unsigned char data[];
} rma_chunk;

/* Posts the chunk [off, off + n) of the caller's buffer through a buffer of its own (a put
 * copies the caller's bytes in first). Returns the chunk while UCX holds it; NULL once it is
 * over, with *rc its result (a get done in place is copied out already). */
static rma_chunk *chunk_post(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, void *buf,
                             size_t off, size_t n, bool is_put, int *rc) {
  rma_chunk *c = malloc(sizeof *c + n);
  if (c == NULL) {
    *rc = CXR_ENOMEM;
    return NULL;
  }
  memset(&c->op, 0, sizeof c->op);
  c->op.keep = ep->r;
  c->off = off;
  c->len = n;
  if (is_put) memcpy(c->data, (char *)buf + off, n);
  ucs_status_ptr_t sp = rma_post(ep, &c->op, is_put ? RMA_PUT : RMA_GET, rk, raddr + off,
                                 c->data, n, rc);
  if (*rc == 0 && sp != NULL && !UCS_PTR_IS_ERR(sp)) return c;
  if (*rc == 0 && sp != NULL) *rc = cxr__rdma_status(UCS_PTR_STATUS(sp));
  if (*rc == 0 && !is_put) memcpy((char *)buf + off, c->data, n);
  free(c);  /* UCX never kept it */
  return NULL;
}

/* A get or put of any size through op-owned buffers, RMA_BOUNCE_MAX bytes per op and up to
 * RMA_WINDOW ops in flight (as atomics keep their operands in their op): a put copies the
 * caller's bytes into each chunk before posting it, a get copies a chunk out only when that
 * chunk succeeded. The oldest chunk is waited for (cxr__op_await, which progresses the worker
 * for all of them), then the window refills. A missed deadline (or a chunk's error) abandons
 * every chunk still with UCX (state 2, cxr__op_abandon) and returns at once; the endpoint
 * stays open (the target may only be slow), and each chunk's callback releases it when UCX
 * completes or cancels it (an op UCX ended with an error is parked until the worker is
 * destroyed, rdma_op.keep: UCX 1.13 was seen copying a get's reply after a force close). A
 * put is flushed at the end so it is visible at the target on return. */
static int rma_bounced(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, void *buf,
                       size_t len, bool is_put, int64_t deadline) {
  rma_chunk *win[RMA_WINDOW];
  size_t head = 0, count = 0, off = 0;
  int rc = 0;
  while (rc == 0 && (off < len || count > 0)) {
    while (rc == 0 && off < len && count < RMA_WINDOW) {
      size_t n = len - off < RMA_BOUNCE_MAX ? len - off : RMA_BOUNCE_MAX;
      rma_chunk *c = chunk_post(ep, rk, raddr, buf, off, n, is_put, &rc);
      if (c) win[(head + count++) % RMA_WINDOW] = c;
      off += n;
    }
    if (count == 0) break;
    rma_chunk *c = win[head];
    head = (head + 1) % RMA_WINDOW;
    count--;
    if (cxr__op_await(ep->r, &c->op, deadline) != 0) {
      rc = CXR_ETIMEDOUT;  /* c is abandoned already; its callback releases it */
      break;
    }
    int crc = cxr__rdma_status(c->op.status);
    if (crc == 0 && !is_put) memcpy((char *)buf + c->off, c->data, c->len);
    cxr__op_release(&c->op);  /* parked if UCX ended it with an error */
    if (rc == 0) rc = crc;
  }
  for (; count > 0; head = (head + 1) % RMA_WINDOW, count--) cxr__op_abandon(&win[head]->op);
  if (rc == 0 && is_put) rc = rma_one(ep, RMA_FLUSH, rk, raddr, NULL, 0, deadline);
  return rc;
}

/* Finds (or makes) a cached registration covering [p, p + len) and holds it. */
static cxr_rdma_mr *rcache_get(cxr_rdma *r, void *p, size_t len) {
  pthread_mutex_lock(&r->lock);
  for (cxr_rdma_mr *m = r->mrs; m; m = m->next)
    if ((char *)p >= (char *)m->p && (char *)p + len <= (char *)m->p + m->len) {
      m->refs++;
      m->last_use = ++r->use_clock;
      pthread_mutex_unlock(&r->lock);
      return m;
    }
  /* Leave room for the bounce buffer's share: a transfer bigger than what the budget can
   * ever hold goes through it instead. */
  bool fits = pinned_len(p, len) <= r->pin_budget - (r->bounce ? r->bounce_size : 0);
  pthread_mutex_unlock(&r->lock);
  if (!fits) return NULL;
  cxr_rdma_mr *m = NULL;
  if (reg(r, p, len, true, false, &m) != 0) return NULL;
  pthread_mutex_lock(&r->lock);
  m->refs++;
  pthread_mutex_unlock(&r->lock);
  return m;
}

static void rcache_put(cxr_rdma *r, cxr_rdma_mr *m) {
  pthread_mutex_lock(&r->lock);
  m->refs--;
  pthread_mutex_unlock(&r->lock);
}

static int transfer(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, void *buf, size_t len,
                    bool is_put, int64_t deadline_ns) {
  int rc = check(ep, rk, raddr, len);
  if (rc) return rc;
  if (len == 0) return 0;
  if (buf == NULL) return CXR_EINVAL;
  cxr_rdma *r = ep->r;
  int64_t deadline = cxr__deadline(deadline_ns);
  /* Through op-owned chunks (never registered by us; UCX copies or registers them itself).
   * Only pin mode "always" moves a larger transfer through pinned memory under the budget:
   * the caller's registered buffer or the engine's one pinned bounce buffer, neither of which
   * a timed-out op may keep, so a missed deadline there still ends the endpoint (finish). */
  if (len <= RMA_BOUNCE_MAX || r->pin_mode != CXR_RDMA_PIN_ALWAYS)
    return rma_bounced(ep, rk, raddr, buf, len, is_put, deadline);
  cxr_rdma_mr *m = rcache_get(r, buf, len);
  if (m) {
    rc = rma(ep, rk, raddr, buf, len, is_put, deadline);
    rcache_put(r, m);
    return rc;
  }
  /* Too big to pin within the budget: move it through the pinned bounce buffer. */
  pthread_mutex_lock(&r->bounce_lock);
  for (size_t off = 0; off < len && rc == 0; off += r->bounce_size) {
    size_t n = len - off < r->bounce_size ? len - off : r->bounce_size;
    if (is_put) memcpy(r->bounce, (char *)buf + off, n);
    rc = rma(ep, rk, raddr + off, r->bounce, n, is_put, deadline);
    if (rc == 0 && !is_put) memcpy((char *)buf + off, r->bounce, n);
  }
  pthread_mutex_unlock(&r->bounce_lock);
  pthread_mutex_lock(&r->lock);
  if (rc == 0) r->bounced += len;
  pthread_mutex_unlock(&r->lock);
  return rc;
}

int cxr_rdma_put(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, const void *src,
                 size_t len, int64_t deadline_ns) {
  return transfer(ep, rk, raddr, (void *)src, len, true, deadline_ns);
}

int cxr_rdma_get(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, void *dst, size_t len,
                 int64_t deadline_ns) {
  return transfer(ep, rk, raddr, dst, len, false, deadline_ns);
}

/* Atomics: the operand and the reply live in the op (heap), never on our stack or in the
 * caller's `old`, so a missed deadline needs no close: the waiter abandons the op (state 2,
 * as cxr__op_wait does) and returns at once, and cxr__op_cb frees it, reply and all, when
 * UCX completes or cancels it later (the reply arrives, or the endpoint is closed or fails).
 * The endpoint stays usable: the target may only be slow. Closing it here instead made UCX
 * 1.13 targets over TCP abort (ucp_atomic_req_handler, "Endpoint timeout") when they
 * resumed with several such atomics pending (tests/rdma/ep_share_test). For CSWAP, UCX
 * takes the value to compare in `buffer` and the new value in `reply_buffer`, which
 * receives the old value. */
static int amo(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, ucp_atomic_op_t opc,
               uint64_t operand, uint64_t reply_in, uint64_t *old, int64_t deadline_ns) {
  int rc = check(ep, rk, raddr, 8);
  if (rc) return rc;
  if (raddr % 8) return CXR_EINVAL;
  typedef struct {
    rdma_op op;
    uint64_t operand, reply;
  } amo_op;
  amo_op *a = calloc(1, sizeof *a);
  if (a == NULL) return CXR_ENOMEM;
  a->operand = operand;
  a->reply = reply_in;
  a->op.keep = ep->r;  /* its reply buffer, like a small get's: parked if UCX ends it failing */
  ucp_request_param_t p = cxr__op_param(&a->op);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  p.datatype = ucp_dt_make_contig(8);
  p.reply_buffer = &a->reply;
  ucp_ep_h uep;
  rc = post_begin(ep, &a->op, &uep);
  if (rc) {
    free(a);
    return rc;
  }
  ucs_status_ptr_t sp =
      post_end(ep, ucp_atomic_op_nbx(uep, opc, &a->operand, 1, raddr, rk->rk, &p));
  /* The op (== a, its first member) is freed by its callback if abandoned; read the reply
   * first. */
  if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
    if (sp == NULL && old) *old = a->reply;
    free(a);
    return sp == NULL ? 0 : cxr__rdma_status(UCS_PTR_STATUS(sp));
  }
  if (cxr__op_await(ep->r, &a->op, cxr__deadline(deadline_ns)) != 0) return CXR_ETIMEDOUT;
  rc = cxr__rdma_status(a->op.status);
  if (rc == 0 && old) *old = a->reply;
  cxr__op_release(&a->op);
  return rc;
}

int cxr_rdma_fadd64(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, uint64_t add,
                    uint64_t *old, int64_t deadline_ns) {
  return amo(ep, rk, raddr, UCP_ATOMIC_OP_ADD, add, 0, old, deadline_ns);
}

int cxr_rdma_cswap64(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, uint64_t expected,
                     uint64_t desired, uint64_t *old, int64_t deadline_ns) {
  return amo(ep, rk, raddr, UCP_ATOMIC_OP_CSWAP, expected, desired, old, deadline_ns);
}

int cxr_rdma_swap64(cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t raddr, uint64_t value,
                    uint64_t *old, int64_t deadline_ns) {
  return amo(ep, rk, raddr, UCP_ATOMIC_OP_SWAP, value, 0, old, deadline_ns);
}
