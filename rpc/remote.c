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
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rdma/internal.h"
#include "rpc/client.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "shm/log.h"

#include "rpc/remote_wire.h"

static bool inside(uint64_t a, uint64_t len, uintptr_t base, size_t size) {
  return a >= base && len <= size && a - base <= size - len;
}

/* ---- spare heaps: a connection heap nobody uses any more is kept for the next one ----
 * Creating a heap costs milliseconds (a file, a mapping, the registry); reusing an empty
 * one costs nothing. Only heaps with no live allocation are kept. */
typedef struct spares {
  pthread_mutex_t lock;
  cxr_heap *h[8];
  unsigned n;
} spares;

static cxr_heap *spare_take(spares *s, size_t size) {
  cxr_heap *h = NULL;
  pthread_mutex_lock(&s->lock);
  for (unsigned i = 0; i < s->n && h == NULL; i++)
    if (cxr_heap_size(s->h[i]) == size) {
      h = s->h[i];
      s->h[i] = s->h[--s->n];
    }
  pthread_mutex_unlock(&s->lock);
  return h;
}

static void spare_give(spares *s, cxr_heap *h) {
  if (h == NULL) return;
  cxr_heap_stats st;
  bool keep = cxr_heap_stats(h, &st) == 0 && st.used == 0;
  pthread_mutex_lock(&s->lock);
  if (keep && s->n < sizeof s->h / sizeof s->h[0]) {
    s->h[s->n++] = h;
    h = NULL;
  }
  pthread_mutex_unlock(&s->lock);
  if (h) cxr_heap_close(h);
}

static void spares_drop(spares *s) {
  pthread_mutex_lock(&s->lock);
  while (s->n) cxr_heap_close(s->h[--s->n]);
  pthread_mutex_unlock(&s->lock);
}

/* Creates a heap whose name goes at once (the file goes with the last mapping). */
static int heap_new(cxr_heap **h, const char *prefix, const char *chan, size_t size) {
  static _Atomic unsigned seq;
  char name[CXR_NAME_MAX + 1];
  snprintf(name, sizeof name, "%s.%.32s.%d.%u", prefix, chan, (int)getpid(), seq++);
  int rc = cxr_heap_create(h, name, size, NULL);
  if (rc == 0) cxr_heap_unlink(name);
  return rc;
}

/* ---- replicas: plain memory at a peer's heap address, inside our window ---- */

static pthread_mutex_t rep_lock = PTHREAD_MUTEX_INITIALIZER;

/* Is [a, a + len) only our PROT_NONE window reservation (no heap, no other replica)? */
static int range_free(uintptr_t a, size_t len) {
  uintptr_t wb;
  size_t ws;
  int rc = cxr_window(&wb, &ws);
  if (rc) return rc;
  if (!inside(a, len, wb, ws) || a % 4096 || len % 4096 || len == 0) return CXR_ERANGE;
  FILE *f = fopen("/proc/self/maps", "re");
  if (f == NULL) return CXR_EIO;
  char line[512];
  uintptr_t covered = a;
  rc = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (hi <= a || lo >= a + len) continue;
    if (strcmp(perms, "---p") != 0) {
      rc = CXR_EADDRINUSE;
      break;
    }
    if (lo <= covered && hi > covered) covered = hi;
  }
  fclose(f);
  if (rc == 0 && covered < a + len) rc = CXR_EADDRINUSE;
  return rc;
}

static int replica_map(uintptr_t a, size_t len) {
  pthread_mutex_lock(&rep_lock);
  int rc = range_free(a, len);
  if (rc == 0) {
    void *p = mmap((void *)a, len, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) rc = cxr__from_errno(errno);
  }
  pthread_mutex_unlock(&rep_lock);
  if (rc) CXR_WARN("remote: cannot place a replica at %#lx (+%zu): %s", (unsigned long)a, len,
                   cxr_strerror(rc));
  return rc;
}

/* Gives the range back to the window reservation. */
static void replica_unmap(uintptr_t a, size_t len) {
  pthread_mutex_lock(&rep_lock);
  mmap((void *)a, len, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
       0);
  pthread_mutex_unlock(&rep_lock);
}

/* "ucx://HOST:PORT/name" -> "HOST:PORT", "name" */
static int parse_target(const char *t, char *host, size_t hlen, char *name, size_t nlen) {
  if (strncmp(t, "ucx://", 6) != 0) return CXR_EINVAL;
  t += 6;
  const char *slash = strchr(t, '/');
  if (slash == NULL || slash == t || slash[1] == '\0') return CXR_EINVAL;
  if ((size_t)(slash - t) >= hlen) return CXR_ENAMETOOLONG;
  if (strlen(slash + 1) > CXR__CHAN_NAME_MAX || strlen(slash + 1) >= nlen) return CXR_ENAMETOOLONG;
  memcpy(host, t, (size_t)(slash - t));
  host[slash - t] = '\0';
  snprintf(name, nlen, "%s", slash + 1);
  return 0;
}

/* =========================== client =========================== */

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
static uint64_t rt_token;

static struct cxr__rconn *find_conn(uint64_t token) {
  for (struct cxr__rconn *r = rt_conns; r; r = r->next)
    if (r->token == token) return r;
  return NULL;
}

static bool final(uint32_t s) { return s == CXR__F_DONE || s == CXR__F_ORPHAN; }

static void run_cb(void *arg) {
  cxr_future *f = arg;
  f->taken = true;
  f->cb(f->err, f->result, f->cb_user);
}

static void fire(cxr_future *f) {
  uint32_t armed = CXR__CB_ARMED;
  if (__atomic_compare_exchange_n(&f->cb_state, &armed, CXR__CB_FIRED, false, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST))
    cxr__rdma_defer_quiet(eng(), run_cb, f);  /* no wake-up: we may hold rt_lock */
}

static bool expire(cxr_future *f, int err) {
  uint32_t s = CXR__F_PENDING;
  if (!__atomic_compare_exchange_n(&f->state, &s, CXR__F_BUSY, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return false;
  f->err = err;
  f->result = NULL;
  __atomic_store_n(&f->state, CXR__F_ORPHAN, __ATOMIC_SEQ_CST);
  fire(f);
  return true;
}

static void entry_release(cxr_future *f) {
  cxr_conn *c = f->c;
  __atomic_store_n(&f->state, CXR__F_FREE, __ATOMIC_RELEASE);
  pthread_mutex_lock(&c->lock);
  c->free_idx[c->nfree++] = f->index;
  pthread_mutex_unlock(&c->lock);
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
  for (uint32_t i = 0; c->tab && i < c->ntab; i++) expire(&c->tab[i], err);
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
    if (!inside(g.addr, g.len, rc->rs_addr, rc->rs_size) &&
        !inside(g.addr, g.len, rc->hc_addr, rc->hc_size))
      return CXR_EBADPTR;
    if (g.len > dl - off - total) return CXR_EPROTO;
    total += g.len;
  }
  if (off + total != dl) return CXR_EPROTO;
  if (h->result != 0 && !inside(h->result, 1, rc->rs_addr, rc->rs_size)) return CXR_EBADPTR;
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
  if (idx >= c->ntab || gen == 0 || __atomic_load_n(&c->tab[idx].gen, __ATOMIC_RELAXED) != gen)
    goto out;
  cxr_future *f = &c->tab[idx];
  int status = h->status;
  if (status > 0 || status < CXR_ERRNO_MIN) status = CXR_EPROTO;
  for (;;) {
    uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
    if (s == CXR__F_PENDING) {
      if (!__atomic_compare_exchange_n(&f->state, &s, CXR__F_BUSY, false, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE))
        continue;
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
      fire(f);
      break;
    }
    if (s == CXR__F_ORPHAN || s == CXR__F_ABANDONED) {
      if (!__atomic_compare_exchange_n(&f->state, &s, s == CXR__F_ORPHAN ? CXR__F_DONE : CXR__F_BUSY,
                                       false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        continue;
      queue_release(c, h->result);  /* late: nobody will read it */
      if (s == CXR__F_ABANDONED) entry_release(f);
      break;
    }
    if (s == CXR__F_BUSY) continue;
    break;
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
      if (__atomic_load_n(&f->state, __ATOMIC_ACQUIRE) == CXR__F_PENDING && now >= f->deadline)
        expire(f, CXR_ETIMEDOUT);
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
  spares_drop(&client_spares);
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
      if (expire(f, CXR_ETIMEDOUT)) CXR__ADD(&c->slot->cli.timeouts, 1);
      continue;
    }
    int dead = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
    if (dead) {
      expire(f, dead);
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
    if (rc->rs_mapped) replica_unmap(rc->rs_addr, rc->rs_size);
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
  spare_give(&client_spares, c->heap);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->qlock);
  free(c);
}

static size_t remote_heap_size(void) {
  const char *s = getenv("CXRPC_REMOTE_HEAP_MB");
  unsigned long mb = s && *s ? strtoul(s, NULL, 10) : 0;
  return (mb >= 1 && mb <= 65536 ? mb : 64) << 20;
}

int cxr__remote_connect(cxr_conn **out, const char *target, const cxr_conn_opts *o) {
  char host[80], chan[CXR__CHAN_NAME_MAX + 1];
  int rc = parse_target(target, host, sizeof host, chan, sizeof chan);
  if (rc) return rc;
  int64_t deadline = cxr_now_ns() + o->connect_timeout_ns;
  cxr_rdma *r;
  if ((rc = runtime(&r)) != 0) return rc;
  rc = cxr_init(NULL);
  if (rc != 0 && rc != CXR_EBUSY) return rc;

  cxr_conn *c = calloc(1, sizeof *c);
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
  if (x->rel == NULL || (rc = cxr__conn_table_init(c, 256)) != 0) {
    rc = rc ? rc : CXR_ENOMEM;
    goto fail;
  }
  /* Our connection heap: an empty one left by an earlier connection, or a new one. */
  c->heap = spare_take(&client_spares, remote_heap_size());
  if (c->heap == NULL && (rc = heap_new(&c->heap, "rc", chan, remote_heap_size())) != 0) goto fail;
  x->hc_addr = (uintptr_t)cxr_heap_base(c->heap);
  x->hc_size = cxr_heap_size(c->heap);

  if ((rc = cxr_rdma_connect(r, host, deadline, &x->ep)) != 0) {
    CXR_INFO("remote: cannot reach %s: %s", host, cxr_strerror(rc));
    goto fail;
  }
  pthread_mutex_lock(&rt_lock);
  x->token = ++rt_token;
  x->next = rt_conns;
  rt_conns = x;
  pthread_mutex_unlock(&rt_lock);
  cxr_rdma_ep_on_error(x->ep, on_ep_error, c);

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
  if (rc) {
    CXR_INFO("remote: open of %s on %s failed: %s", chan, host, cxr_strerror(rc));
    goto fail;
  }
  x->conn_id = x->open_rep.conn_id;
  x->rs_addr = x->open_rep.rs_addr;
  x->rs_size = x->open_rep.rs_size;
  if ((rc = replica_map(x->rs_addr, x->rs_size)) != 0) {
    r_close cl = {.magic = R_MAGIC, .conn_id = x->conn_id};
    cxr_rdma_am_post(x->ep, R_CLOSE, &cl, sizeof cl, NULL, 0);
    goto fail;
  }
  x->rs_mapped = true;
  *out = c;
  return 0;
fail:
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
      (o->ranges == NULL && o->nranges != 0) || o->nranges > R_MAX_RANGES)
    return CXR_EINVAL;
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

  pthread_mutex_lock(&c->lock);
  cxr_future *f = c->nfree ? &c->tab[c->free_idx[--c->nfree]] : NULL;
  uint32_t nrel = rc->nrel;
  /* One allocation owned by the send: range table, releases, inline bytes, iov array. */
  size_t meta = nr * sizeof(r_range) + nrel * sizeof(uint64_t) + inl;
  char *own = f ? malloc(meta + (nr + 1) * sizeof(struct iovec)) : NULL;
  if (own) {
    memcpy(own + nr * sizeof(r_range), rc->rel, nrel * sizeof(uint64_t));
    rc->nrel = 0;
  } else if (f) {
    c->free_idx[c->nfree++] = f->index;
    f = NULL;
  }
  pthread_mutex_unlock(&c->lock);
  if (f == NULL) return own == NULL && c->nfree ? CXR_ENOMEM : CXR_EFULL;

  uint32_t gen = __atomic_load_n(&f->gen, __ATOMIC_RELAXED) + 1;
  if (gen == 0) gen = 1;
  __atomic_store_n(&f->gen, gen, __ATOMIC_RELAXED);
  f->err = 0;
  f->result = NULL;
  f->taken = false;
  f->seal = 0;
  f->cb = NULL;
  f->cb_user = NULL;
  __atomic_store_n(&f->cb_state, CXR__CB_NONE, __ATOMIC_RELAXED);
  int64_t now = cxr_now_ns(), rel = o->deadline_ns ? o->deadline_ns : c->default_deadline;
  f->deadline = now + rel < now ? INT64_MAX : now + rel;
  __atomic_store_n(&f->state, CXR__F_PENDING, __ATOMIC_RELEASE);

  r_range *tab = (r_range *)own;
  struct iovec *iov = (struct iovec *)(own + meta);
  for (size_t i = 0; i < nr; i++) tab[i] = (r_range){(uint64_t)(uintptr_t)rg[i].p, rg[i].len};
  if (inl) memcpy(own + nr * sizeof(r_range) + nrel * sizeof(uint64_t), args, inl);
  size_t niov = 0;
  iov[niov++] = (struct iovec){own, meta};
  for (size_t i = 0; i < nr; i++)
    if (rg[i].len) iov[niov++] = (struct iovec){(void *)rg[i].p, rg[i].len};
  r_call h = {.magic = R_MAGIC, .method = method, .conn_id = rc->conn_id,
              .call_id = (uint64_t)gen << 32 | f->index,
              .args = inl ? 0 : (uint64_t)(uintptr_t)args, .arg_len = inl ? inl : bytes,
              .deadline_rel = rel, .flags = o->flags & ~(unsigned)CXR_CALL_SEAL,
              .nranges = (uint32_t)nr, .nrel = nrel, .inline_len = (uint32_t)inl};
  if (o->ranges == NULL && args != NULL && !inl) h.arg_len = rg[0].len;
  int err = cxr__am_send_owned(eng(), cxr__rdma_ep_uep(rc->ep), R_CALL, &h, sizeof h, iov, niov,
                               own, f->deadline);
  if (err) {
    /* Not sent (or not within the deadline): the call ends here. */
    if (expire(f, err == CXR_ETIMEDOUT ? CXR_ETIMEDOUT : err)) {
    }
    int d = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
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
  int64_t until = timeout_ns == 0 ? INT64_MAX : cxr_now_ns() + timeout_ns;
  if (until < 0) until = INT64_MAX;
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
  if (__atomic_load_n(&f->cb_state, __ATOMIC_ACQUIRE) != CXR__CB_NONE) return CXR_EBUSY;
  if (final(s)) {
    __atomic_store_n(&f->cb_state, CXR__CB_FIRED, __ATOMIC_RELEASE);
    f->taken = true;
    cb(f->err, f->result, user);
    return 0;
  }
  f->cb = cb;
  f->cb_user = user;
  __atomic_store_n(&f->cb_state, CXR__CB_ARMED, __ATOMIC_SEQ_CST);
  if (final(__atomic_load_n(&f->state, __ATOMIC_SEQ_CST))) fire(f);
  return 0;
}

int cxr__remote_future_cancel(cxr_future *f) {
  uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
  if (s == CXR__F_FREE || s == CXR__F_ABANDONED) return CXR_EINVAL;
  if (expire(f, CXR_ECANCELED)) {
    CXR__ADD(&f->c->slot->cli.cancels, 1);
    return 0;
  }
  return CXR_EBUSY;
}

void cxr__remote_future_free(cxr_future *f) {
  for (;;) {
    uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
    switch (s) {
      case CXR__F_PENDING:
        expire(f, CXR_ECANCELED);
        continue;
      case CXR__F_DONE:
        if (!f->taken && f->result != NULL) queue_release(f->c, (uint64_t)(uintptr_t)f->result);
        entry_release(f);
        return;
      case CXR__F_ORPHAN:
        if (__atomic_compare_exchange_n(&f->state, &s, CXR__F_ABANDONED, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
          return;
        continue;
      case CXR__F_BUSY:
        continue;
      default:
        return;
    }
  }
}

void cxr__remote_close(cxr_conn *c) {
  struct cxr__rconn *rc = c->remote;
  fail_all(c, CXR_ECLOSED);
  /* Callbacks still queued on the progress thread must run before the table goes. */
  for (int i = 0; i < 2000; i++) {
    bool queued = false;
    for (uint32_t k = 0; k < c->ntab; k++)
      if (__atomic_load_n(&c->tab[k].cb_state, __ATOMIC_ACQUIRE) == CXR__CB_FIRED &&
          __atomic_load_n(&c->tab[k].state, __ATOMIC_ACQUIRE) != CXR__F_FREE)
        queued = true;
    if (!queued) break;
    usleep(500);
  }
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
  rconn_free(c);
}

/* Gives a call's result back: in the pod the block returns to the connection heap; across
 * racks the server frees the result's blocks in its heap (the release rides on the next
 * call). */
void cxr_conn_free(cxr_conn *c, void *result) {
  if (c == NULL || result == NULL) return;
  if (c->remote == NULL) {
    if (c->heap && cxr_heap_contains(c->heap, result, 1)) cxr_heap_free(c->heap, result);
    return;
  }
  struct cxr__rconn *rc = c->remote;
  if (inside((uintptr_t)result, 1, rc->rs_addr, rc->rs_size))
    queue_release(c, (uint64_t)(uintptr_t)result);
  else if (cxr_heap_contains(c->heap, result, 1))
    cxr_heap_free(c->heap, result);
}

/* =========================== server =========================== */

typedef struct rres {
  uint64_t root;
  uint32_t n;
  uint64_t *blocks;
} rres;

typedef struct rsconn {
  struct rsconn *next;
  cxr_rdma_ep *ep;   /* the accepted endpoint it came through (NULL: a pooled one) */
  uint64_t id, token;
  uintptr_t hc_addr;
  size_t hc_size;
  cxr_heap *hs;
  cxr__sconn sc;     /* what cxr_call_heap and the counters read */
  cxr__cslot slot;
  char who[64];
  rres *res;
  uint32_t nres, rescap;
} rsconn;

struct cxr__rlisten {
  cxr_channel *ch;
  cxr_rdma *r;
  spares heaps;  /* empty result heaps for the next connections */
  pthread_mutex_t lock;
  rsconn *conns;
  uint64_t next_id;
  unsigned nconns;
};

struct cxr__rcall {
  rsconn *rc;
  cxr_range *ranges;
  size_t nranges;
  bool set;
};

static rsconn *sfind(struct cxr__rlisten *l, uint64_t id) {
  for (rsconn *c = l->conns; c; c = c->next)
    if (c->id == id) return c;
  return NULL;
}

static void res_free(rsconn *c, uint32_t i) {
  for (uint32_t k = 0; k < c->res[i].n; k++) cxr_heap_free(c->hs, (void *)(uintptr_t)c->res[i].blocks[k]);
  free(c->res[i].blocks);
  c->res[i] = c->res[--c->nres];
}

static void release_root(rsconn *c, uint64_t root) {
  for (uint32_t i = 0; i < c->nres; i++)
    if (c->res[i].root == root) {
      res_free(c, i);
      return;
    }
}

static void sconn_destroy(struct cxr__rlisten *l, rsconn *c) {
  while (c->nres) res_free(c, 0);
  free(c->res);
  if (l) spare_give(&l->heaps, c->hs);
  else if (c->hs) cxr_heap_close(c->hs);
  replica_unmap(c->hc_addr, c->hc_size);
  free(c);
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
    sconn_destroy(g.l, c);
  }
}

static void on_client_gone(cxr_rdma_ep *ep, int err, void *user) {
  gone_arg *g = malloc(sizeof *g);
  if (g == NULL) return;
  g->l = user;
  g->ep = ep;
  if (cxr_rdma_defer(g->l->r, reap_gone, g) != 0) free(g);
}

static void reply_open(cxr_rdma_msg *m, int st, uint64_t token, uint64_t id, cxr_heap *hs) {
  r_open_rep rep = {.magic = R_MAGIC, .status = st, .token = token, .conn_id = id};
  if (hs) {
    rep.rs_addr = (uint64_t)(uintptr_t)cxr_heap_base(hs);
    rep.rs_size = cxr_heap_size(hs);
  }
  cxr_rdma_reply(m, R_OPEN_REP, &rep, sizeof rep, NULL, 0, 0);
}

static void on_open(cxr_rdma_msg *m, void *user) {
  struct cxr__rlisten *l = user;
  cxr_channel *ch = l->ch;
  size_t hl;
  const r_open *h = cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h || h->magic != R_MAGIC) return;
  r_open op = *h;
  op.chan[CXR__CHAN_NAME_MAX] = '\0';
  op.who[sizeof op.who - 1] = '\0';
  if (strcmp(op.chan, ch->name) != 0) return reply_open(m, CXR_ENOENT, op.token, 0, NULL);
  pthread_mutex_lock(&l->lock);
  bool full = l->nconns >= ch->o.max_conns;
  uint64_t id = ++l->next_id;
  pthread_mutex_unlock(&l->lock);
  if (full) return reply_open(m, CXR_EFULL, op.token, 0, NULL);
  int rc = replica_map(op.heap_addr, op.heap_size);
  if (rc) return reply_open(m, rc, op.token, 0, NULL);
  rsconn *c = calloc(1, sizeof *c);
  rc = c ? 0 : CXR_ENOMEM;
  if (c && (c->hs = spare_take(&l->heaps, ch->o.conn_heap_size)) == NULL)
    rc = heap_new(&c->hs, "rs", ch->name, ch->o.conn_heap_size);
  if (rc) {
    free(c);
    replica_unmap(op.heap_addr, op.heap_size);
    return reply_open(m, rc, op.token, 0, NULL);
  }
  c->id = id;
  c->token = op.token;
  c->ep = m->ref;
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
  reply_open(m, 0, op.token, id, c->hs);
}

static void on_close(cxr_rdma_msg *m, void *user) {
  struct cxr__rlisten *l = user;
  size_t hl;
  const r_close *h = cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h || h->magic != R_MAGIC) return;
  pthread_mutex_lock(&l->lock);
  rsconn *c = NULL;
  for (rsconn **pp = &l->conns; *pp; pp = &(*pp)->next)
    if ((*pp)->id == h->conn_id) {
      c = *pp;
      *pp = c->next;
      l->nconns--;
      break;
    }
  pthread_mutex_unlock(&l->lock);
  if (c) sconn_destroy(l, c);
  r_close ack = {.magic = R_MAGIC, .conn_id = h->conn_id, .token = h->token};
  cxr_rdma_reply(m, R_CLOSE_REP, &ack, sizeof ack, NULL, 0, 0);
}

static void reply_call(cxr_rdma_msg *m, const r_call *h, uint64_t token, int st, void *result,
                       const cxr_range *rg, size_t nr) {
  r_call_rep rep = {.magic = R_MAGIC, .status = st, .token = token, .call_id = h->call_id,
                    .result = (uint64_t)(uintptr_t)result, .nranges = (uint32_t)nr};
  struct iovec stack_iov[9];
  struct iovec *iov = nr + 1 <= 9 ? stack_iov : malloc((nr + 1) * sizeof *iov);
  r_range *tab = malloc(nr ? nr * sizeof *tab : 1);
  if (iov == NULL || tab == NULL) {
    rep.status = CXR_ENOMEM, rep.result = 0, rep.nranges = 0, nr = 0;
  }
  size_t n = 0;
  if (nr) iov[n++] = (struct iovec){tab, nr * sizeof *tab};
  for (size_t i = 0; i < nr; i++) {
    tab[i] = (r_range){(uint64_t)(uintptr_t)rg[i].p, rg[i].len};
    if (rg[i].len) iov[n++] = (struct iovec){(void *)rg[i].p, rg[i].len};
  }
  int rc = cxr_rdma_reply(m, R_CALL_REP, &rep, sizeof rep, n ? iov : NULL, n, 0);
  if (rc) CXR_DEBUG("remote: reply to call %llx failed: %s", (unsigned long long)h->call_id,
                    cxr_strerror(rc));
  if (iov != stack_iov) free(iov);
  free(tab);
}

/* Checks a call's data against the replica and copies it in. */
static int land_args(rsconn *c, const r_call *h, const char *d, size_t dl, const char **inl) {
  if (h->nranges > R_MAX_RANGES || h->nrel > R_MAX_REL || h->inline_len > CXR__INLINE_MAX)
    return CXR_EPROTO;
  size_t meta = h->nranges * sizeof(r_range) + h->nrel * sizeof(uint64_t) + h->inline_len;
  if (meta > dl) return CXR_EPROTO;
  const char *tab = d;
  size_t off = meta, total = 0;
  for (uint32_t i = 0; i < h->nranges; i++) {
    r_range g;
    memcpy(&g, tab + i * sizeof g, sizeof g);
    if (!inside(g.addr, g.len, c->hc_addr, c->hc_size)) return CXR_EBADPTR;
    if (g.len > dl - off - total) return CXR_EPROTO;
    total += g.len;
  }
  if (off + total != dl) return CXR_EPROTO;
  for (uint32_t i = 0; i < h->nranges; i++) {
    r_range g;
    memcpy(&g, tab + i * sizeof g, sizeof g);
    if (g.len) memcpy((void *)(uintptr_t)g.addr, d + off, g.len);
    off += g.len;
  }
  for (uint32_t i = 0; i < h->nrel; i++) {
    uint64_t root;
    memcpy(&root, d + h->nranges * sizeof(r_range) + i * sizeof root, sizeof root);
    release_root(c, root);
  }
  *inl = d + h->nranges * sizeof(r_range) + h->nrel * sizeof(uint64_t);
  return 0;
}

/* Records which blocks of our heap a result occupies, so a release frees them all. */
static void keep_result(rsconn *c, void *result, const cxr_range *rg, size_t nr) {
  if (result == NULL) return;
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
    if (rg[i].p != result && cxr_heap_usable_size(c->hs, rg[i].p) > 0)
      r->blocks[r->n++] = (uint64_t)(uintptr_t)rg[i].p;
  c->nres++;
}

static void on_call(cxr_rdma_msg *m, void *user) {
  struct cxr__rlisten *l = user;
  cxr_channel *ch = l->ch;
  size_t hl, dl;
  const r_call *hp = cxr_rdma_msg_hdr(m, &hl);
  const char *d = cxr_rdma_msg_data(m, &dl);
  if (hl != sizeof *hp || hp->magic != R_MAGIC) return;
  r_call h = *hp;
  pthread_mutex_lock(&l->lock);
  rsconn *c = sfind(l, h.conn_id);
  pthread_mutex_unlock(&l->lock);
  if (c == NULL) return reply_call(m, &h, 0, CXR_ECLOSED, NULL, NULL, 0);
  cxr__srv_ctr *ctr = &c->slot.srv;
  CXR__ADD(&ctr->calls, 1);
  CXR__ADD(&ctr->bytes_in, dl);
  const char *inl = NULL;
  int st = land_args(c, &h, d, dl, &inl);
  if (st) {
    CXR__ADD(&ctr->malformed, 1);
    return reply_call(m, &h, c->token, st, NULL, NULL, 0);
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
    if (!inside(h.args, h.arg_len ? h.arg_len : 1, c->hc_addr, c->hc_size))
      return reply_call(m, &h, c->token, CXR_EBADPTR, NULL, NULL, 0);
    call.args = (const void *)(uintptr_t)h.args;
    call.arg_len = h.arg_len;
  }
  const cxr__method *me = NULL;
  void *result = NULL;
  if (!__atomic_load_n(&ch->running, __ATOMIC_ACQUIRE) || __atomic_load_n(&ch->stop, __ATOMIC_ACQUIRE))
    st = CXR_EAGAIN;  /* opened but not serving (yet, or any more) */
  else if ((me = cxr__method_find(ch, h.method)) == NULL)
    st = CXR_ENOMETHOD;
  else if (h.deadline_rel <= 0)
    st = CXR_ETIMEDOUT;
  if (st == 0) {
    /* The client's clock is not ours: its deadline arrives as time left. */
    call.deadline = cxr_now_ns() + h.deadline_rel;
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
        !inside((uintptr_t)rg[i].p, rg[i].len, c->hc_addr, c->hc_size)) {
      CXR_WARN("remote %s: result range %zu is outside the connection's heaps", ch->name, i);
      st = CXR_EBADPTR;
    }
  if (st != 0) {
    if (result) cxr_heap_free(c->hs, result);
    result = NULL;
    nr = 0;
    CXR__ADD(&ctr->errors, 1);
  }
  keep_result(c, result, rg, nr);
  size_t out = 0;
  for (size_t i = 0; i < nr; i++) out += rg[i].len;
  CXR__ADD(&ctr->bytes_out, out);
  reply_call(m, &h, c->token, st, result, rg, nr);
  free(rcall.ranges);
}

int cxr__remote_listen(cxr_channel *ch, const char *listen) {
  if (strncmp(listen, "ucx://", 6) != 0 || strlen(listen) > 6 + 79) return CXR_EINVAL;
  struct cxr__rlisten *l = calloc(1, sizeof *l);
  if (l == NULL) return CXR_ENOMEM;
  l->ch = ch;
  pthread_mutex_init(&l->lock, NULL);
  pthread_mutex_init(&l->heaps.lock, NULL);
  /* Result heaps ready before the first client, as the pod keeps a pool of ready slots. */
  for (unsigned i = 0; i < ch->o.pool && i < 8; i++) {
    cxr_heap *h;
    if (heap_new(&h, "rs", ch->name, ch->o.conn_heap_size) == 0) spare_give(&l->heaps, h);
  }
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  o.listen = listen + 6;
  int rc = cxr_rdma_open(&l->r, &o);
  if (rc == 0) rc = cxr__am_set(l->r, R_OPEN, on_open, l, 0);
  if (rc == 0) rc = cxr__am_set(l->r, R_CALL, on_call, l, 0);
  if (rc == 0) rc = cxr__am_set(l->r, R_CLOSE, on_close, l, 0);
  if (rc != 0) {
    CXR_ERR("channel %s: cannot listen on %s: %s", ch->name, listen, cxr_strerror(rc));
    cxr_rdma_close(l->r);
    spares_drop(&l->heaps);
    pthread_mutex_destroy(&l->lock);
    free(l);
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
  cxr_rdma_close(l->r);  /* no handler runs after this */
  while (l->conns) {
    rsconn *c = l->conns;
    l->conns = c->next;
    sconn_destroy(NULL, c);
  }
  spares_drop(&l->heaps);
  pthread_mutex_destroy(&l->lock);
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
  return 0;
}

/* Port the channel's listener is bound to (tests and tools): 0 when not listening. */
int cxr__remote_port(cxr_channel *ch) {
  return ch && ch->remote ? cxr_rdma_port(ch->remote->r) : 0;
}
