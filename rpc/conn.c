/* The client side of a connection: transport choice, fast connect (claim a ready slot
 * with one CAS and map its heap: no file is created), liveness checks and close. */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rpc/client.h"
#include "rpc/remote.h"
#include "rpc/seal_glue.h"
#include "shm/log.h"
#include "shm/reg_deadline.h"

void cxr_conn_opts_init(cxr_conn_opts *o) {
  if (o == NULL) return;
  memset(o, 0, sizeof *o);
  o->default_deadline_ns = 5000000000;
  o->connect_timeout_ns = 2000000000;
  o->peer_timeout_ns = 100000000;
}

void cxr_call_opts_init(cxr_call_opts *o) {
  if (o != NULL) memset(o, 0, sizeof *o);
}

int cxr__transport_for(const char *target) {
  if (strncmp(target, "ucx://", 6) == 0) return CXR__TRANSPORT_UCX;
  if (strstr(target, "://") != NULL) return CXR_EINVAL;
  return CXR__TRANSPORT_POD;
}

/* Sealing (cxr__call_seal, cxr__call_release) lives in rpc/seal_glue.c. */

/* ---- mappings kept per process ----
 * The only process-wide state of rpc/: a short list of mapped control heaps with reference
 * counts, so that many connections to one channel share one mapping and one lease, and with
 * each a few spare mappings of connection heaps this process used before. Mapping a heap
 * file costs hundreds of microseconds (shm), claiming a slot a CAS: a process that connects
 * again to a slot it has seen (the pool recycles the same few heaps) maps nothing. Unused
 * channel mappings stay (at most IDLE_MAX) until their server goes away. */
#define IDLE_MAX 4
static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;
static cxr__ctl_ref *ctl_list;

static bool ctl_usable(cxr__chan_block *cb) {
  if (CXR__LD(&cb->state) != CXR__CHAN_OPEN) return false;
  cxr__proc_id id = {.pid = cb->server_pid, .start_time = cb->server_start, .host = cb->server_host};
  return cxr__proc_alive(&id);
}

static void ctl_destroy(cxr__ctl_ref *r) {
  for (unsigned i = 0; i < r->nspare; i++) cxr_heap_close(r->spare[i]);
  if (r->heap) cxr_heap_close(r->heap);
  free(r);
}

/* Closes unused channel mappings beyond IDLE_MAX and those whose server is gone.
 * Called with ctl_lock held. */
static void ctl_trim(void) {
  unsigned idle = 0;
  for (cxr__ctl_ref **p = &ctl_list; *p != NULL;) {
    cxr__ctl_ref *r = *p;
    if (r->refs == 0 && (++idle > IDLE_MAX || !ctl_usable(r->cb))) {
      *p = r->next;
      ctl_destroy(r);
      continue;
    }
    p = &r->next;
  }
}

/* Takes ctl_lock by a connect's deadline (a cxr_now_ns() time, never 0 here): another
 * thread may hold it while it maps a control heap, which waits for the pod registry's lock. */
static int ctl_lock_by(int64_t until) { return cxr__mutex_lock_by(&ctl_lock, until); }

static int ctl_get(const char *channel, cxr__ctl_ref **out, int64_t until) {
  char name[CXR_NAME_MAX + 1];
  snprintf(name, sizeof name, "ch.%s", channel);
  if (ctl_lock_by(until) != 0) return CXR_ETIMEDOUT;
  for (cxr__ctl_ref **p = &ctl_list; *p != NULL; p = &(*p)->next) {
    cxr__ctl_ref *r = *p;
    if (strcmp(r->name, name) != 0) continue;
    /* The server's liveness (a /proc read) is checked at most every 10 ms here; a server
     * that died since is found by the first call within its peer timeout. */
    int64_t now = cxr_now_ns();
    bool fresh = now - r->checked_ns < 10000000 && CXR__LD(&r->cb->state) == CXR__CHAN_OPEN;
    if (fresh || ctl_usable(r->cb)) {
      if (!fresh) r->checked_ns = now;
      r->refs++;
      *p = r->next; /* most recently used first */
      r->next = ctl_list;
      ctl_list = r;
      *out = r;
      pthread_mutex_unlock(&ctl_lock);
      return 0;
    }
    r->name[0] = '\0'; /* stale (server gone or channel re-created): never match again */
  }
  ctl_trim();
  cxr__ctl_ref *r = calloc(1, sizeof *r);
  int rc = r ? cxr_heap_open(&r->heap, name) : CXR_ENOMEM;
  if (rc != 0) goto fail;
  cxr__chan_block *cb = cxr_heap_get_root(r->heap);
  /* Check the block before trusting any field of it. */
  if (!cxr__block_ok(r->heap, cb, sizeof *cb, _Alignof(cxr__chan_block)) ||
      cb->magic != CXR__CHAN_MAGIC) {
    rc = cb == NULL ? CXR_ENOENT : CXR_EBADMAGIC;
    goto fail;
  }
  if (cb->version != CXR__VERSION) {
    rc = CXR_EVERSION;
    goto fail;
  }
  uint32_t max = cb->max_conns, ring = cb->ring_slots;
  if (max == 0 || max > CXR__MAX_CONNS || ring < 2 || ring > CXR__MAX_RING || (ring & (ring - 1)) ||
      !cxr_heap_contains(r->heap, cb, cxr__chan_block_size(max))) {
    rc = CXR_ECORRUPT;
    goto fail;
  }
  if (!ctl_usable(cb)) {
    rc = CXR_ENOENT; /* a stale channel whose server is gone */
    goto fail;
  }
  snprintf(r->name, sizeof r->name, "%s", name);
  r->checked_ns = cxr_now_ns();
  r->cb = cb;
  r->max_conns = max;
  r->ring_slots = ring;
  r->refs = 1;
  r->next = ctl_list;
  ctl_list = r;
  *out = r;
  pthread_mutex_unlock(&ctl_lock);
  return 0;
fail:
  if (r) ctl_destroy(r);
  pthread_mutex_unlock(&ctl_lock);
  return rc;
}

static void ctl_put(cxr__ctl_ref *ref) {
  pthread_mutex_lock(&ctl_lock);
  ref->refs--;
  ctl_trim();
  pthread_mutex_unlock(&ctl_lock);
}

/* A mapping of connection heap `name` kept from an earlier connection, or NULL (also when
 * ctl_lock stays taken until `until`: the caller maps the heap itself, by then too). */
static cxr_heap *spare_take(cxr__ctl_ref *ref, const char *name, int64_t until) {
  cxr_heap *h = NULL;
  if (ctl_lock_by(until) != 0) return NULL;
  for (unsigned i = 0; i < ref->nspare; i++) {
    if (strcmp(cxr_heap_name(ref->spare[i]), name) == 0) {
      h = ref->spare[i];
      ref->spare[i] = ref->spare[--ref->nspare];
      break;
    }
  }
  pthread_mutex_unlock(&ctl_lock);
  return h;
}

/* Keeps a connection heap mapped for a later connect (closes the oldest beyond the limit). */
static void spare_put(cxr__ctl_ref *ref, cxr_heap *h) {
  cxr_heap *drop = NULL;
  pthread_mutex_lock(&ctl_lock);
  if (ref->nspare == CXR__SPARE_MAX) {
    drop = ref->spare[0];
    memmove(&ref->spare[0], &ref->spare[1], (CXR__SPARE_MAX - 1) * sizeof ref->spare[0]);
    ref->nspare--;
  }
  ref->spare[ref->nspare++] = h;
  pthread_mutex_unlock(&ctl_lock);
  if (drop) cxr_heap_close(drop);
}

/* This process's identity, read from /proc once (again after a fork). */
static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;
static int self_id(cxr__proc_id *out) {
  static cxr__proc_id id;
  pthread_mutex_lock(&id_lock);
  int rc = 0;
  if (id.pid != (int32_t)getpid()) rc = cxr__proc_self_id(&id);
  *out = id;
  pthread_mutex_unlock(&id_lock);
  return rc;
}

/* ---- connect ---- */

/* Claims a READY slot with one CAS. Returns its index, or -1 (none ready; *any_free says
 * whether waiting can help). */
static int claim_slot(const cxr__ctl_ref *r, uint32_t pid, bool *any_free) {
  cxr__chan_block *cb = r->cb;
  *any_free = false;
  for (unsigned k = 0; k < r->max_conns; k++) {
    cxr__cslot *s = &cb->slots[k];
    uint64_t o = CXR__LD(&s->owner);
    unsigned st = cxr__owner_state(o);
    if (st != CXR__SLOT_CLAIMED) *any_free = true;
    if (st != CXR__SLOT_READY) continue;
    if (CXR__CAS(&s->owner, &o, cxr__owner(pid, CXR__SLOT_CLAIMED, cxr__owner_gen(o)))) return (int)k;
  }
  return -1;
}

/* True when at most half the pool is ready: then the manager is woken to refill. */
static bool pool_low(const cxr__ctl_ref *r) {
  cxr__chan_block *cb = r->cb;
  unsigned ready = 0;
  for (unsigned i = 0; i < r->max_conns && ready * 2 <= cb->pool; i++)
    ready += cxr__owner_state(CXR__LD(&cb->slots[i].owner)) == CXR__SLOT_READY;
  return ready * 2 <= cb->pool;
}

/* ---- connections this process holds as a client ----
 * A server in this same process uses it to tell one of our own clients from a process that
 * merely wrote our pid into a slot (cxr_call_peer). Keyed by the connection block's
 * address, the same in both views, and the tenancy's generation. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static struct held_conn { const void *blk; uint32_t gen; } *held;
static size_t nheld, held_cap;

static void held_add(const void *blk, uint32_t gen) {
  pthread_mutex_lock(&held_lock);
  if (nheld == held_cap) {
    size_t cap = held_cap ? 2 * held_cap : 16;
    struct held_conn *n = realloc(held, cap * sizeof *n);
    if (n != NULL) held = n, held_cap = cap;
  }
  if (nheld < held_cap) held[nheld++] = (struct held_conn){blk, gen};
  pthread_mutex_unlock(&held_lock);
}

static void held_remove(const void *blk, uint32_t gen) {
  pthread_mutex_lock(&held_lock);
  for (size_t i = 0; i < nheld; i++)
    if (held[i].blk == blk && held[i].gen == gen) {
      held[i] = held[--nheld];
      break;
    }
  pthread_mutex_unlock(&held_lock);
}

/* Connections of this process closed lately, for a server in this same process: it reuses
 * the heap of its own clients only (cxr__conn_closed_here). A ring: entries no server here
 * asks about (connections to other processes' channels) are overwritten. */
#define CLOSED_HERE 64
static struct held_conn closed_here[CLOSED_HERE];
static unsigned closed_next;

static void held_close(const void *blk, uint32_t gen) {
  held_remove(blk, gen);
  pthread_mutex_lock(&held_lock);
  closed_here[closed_next++ % CLOSED_HERE] = (struct held_conn){blk, gen};
  pthread_mutex_unlock(&held_lock);
}

bool cxr__conn_closed_here(const void *blk, uint32_t gen) {
  bool found = false;
  pthread_mutex_lock(&held_lock);
  for (unsigned i = 0; i < CLOSED_HERE && !found; i++)
    if (closed_here[i].blk == blk && closed_here[i].gen == gen) {
      closed_here[i] = (struct held_conn){NULL, 0};
      found = true;
    }
  pthread_mutex_unlock(&held_lock);
  return found;
}

bool cxr__conn_held_here(const void *blk, uint32_t gen) {
  bool found = false;
  pthread_mutex_lock(&held_lock);
  for (size_t i = 0; i < nheld && !found; i++) found = held[i].blk == blk && held[i].gen == gen;
  pthread_mutex_unlock(&held_lock);
  return found;
}

/* Gives a claimed slot back for the server to recycle: on its next tick, or now if the pool
 * runs low (waking the manager costs the closer a system call and, on a busy machine, its
 * CPU while the manager recycles). */
static void release_slot(const cxr__ctl_ref *r, unsigned k, uint32_t pid, uint32_t gen) {
  cxr__chan_block *cb = r->cb;
  cxr__cslot *s = &cb->slots[k];
  __atomic_fetch_and(&cb->active[k / 64], ~(1ull << (k % 64)), __ATOMIC_SEQ_CST);
  uint64_t o = cxr__owner(pid, CXR__SLOT_CLAIMED, gen);
  CXR__CAS(&s->owner, &o, cxr__owner(pid, CXR__SLOT_CLOSING, gen));
  if (pool_low(r)) cxr__bell_ring(&cb->mgr_bell, &cb->mgr_sleepers);
}

/* fork(2) from a thread while another holds one of this file's locks would leave it held
 * for good in the child: they are taken around the fork (none nests in another). Installed
 * after shm's own hooks (cxr_init), so ours run first and a thread of ours that holds
 * ctl_lock while it waits for a lock of shm can finish. */
static void locks_take(void) {
  pthread_mutex_lock(&ctl_lock);
  pthread_mutex_lock(&held_lock);
  pthread_mutex_lock(&id_lock);
}
static void locks_give(void) {
  pthread_mutex_unlock(&id_lock);
  pthread_mutex_unlock(&held_lock);
  pthread_mutex_unlock(&ctl_lock);
}
static pthread_once_t locks_once = PTHREAD_ONCE_INIT;
static void locks_install(void) { pthread_atfork(locks_take, locks_give, locks_give); }

/* give_up: the connect timeout's end (a cxr_now_ns() time), also this thread's registry
 * deadline meanwhile (set by cxr_connect). */
static int connect_pod(cxr_conn *c, const char *name, int64_t give_up) {
  if (strnlen(name, CXR__CHAN_NAME_MAX + 1) > CXR__CHAN_NAME_MAX) return CXR_ENAMETOOLONG;
  if (name[0] == '\0') return CXR_EINVAL;
  int rc = cxr_init(NULL);
  if (rc != 0 && rc != CXR_EBUSY) return rc;
  pthread_once(&locks_once, locks_install);
  c->fork_epoch = cxr__fork_epoch; /* after cxr_init: its atfork hook bumps the epoch */
  if ((rc = ctl_get(name, &c->ctl, give_up)) != 0) return rc;
  cxr__chan_block *cb = c->ctl->cb;
  c->cb = cb;
  c->pid = (uint32_t)getpid();
  int k;
  for (;;) {
    bool any_free;
    uint32_t v = __atomic_load_n(&cb->pool_bell, __ATOMIC_SEQ_CST);
    if ((k = claim_slot(c->ctl, c->pid, &any_free)) >= 0) break;
    if (!any_free) return CXR_EFULL;
    if (!ctl_usable(cb)) return CXR_ENOENT;
    int64_t left = give_up - cxr_now_ns();
    if (left <= 0) return CXR_ETIMEDOUT;
    /* Ask the manager for a refill and sleep until it rings the pool bell. */
    cxr__bell_ring(&cb->mgr_bell, &cb->mgr_sleepers);
    __atomic_fetch_add(&cb->pool_sleepers, 1, __ATOMIC_SEQ_CST);
    if ((k = claim_slot(c->ctl, c->pid, &any_free)) >= 0) {
      __atomic_fetch_sub(&cb->pool_sleepers, 1, __ATOMIC_SEQ_CST);
      break;
    }
    cxr__futex_wait(&cb->pool_bell, v, left < 10000000 ? left : 10000000);
    __atomic_fetch_sub(&cb->pool_sleepers, 1, __ATOMIC_SEQ_CST);
  }
  cxr__cslot *s = &cb->slots[k];
  c->index = (unsigned)k;
  c->slot = s;
  c->gen = cxr__owner_gen(CXR__LDX(&s->owner));
  cxr__proc_id self;
  if (self_id(&self) == 0) CXR__ST(&s->client_start, self.start_time);
  CXR__ST(&s->client_uid, (uint32_t)getuid());
  CXR__ST(&s->since_ns, cxr_now_ns());
  CXR__ADD(&cb->connects, 1);
  /* Wake the manager to refill once the pool is half used (it also refills on its own
   * tick, every peer_timeout/2): most connects make no system call for it. */
  if (pool_low(c->ctl)) cxr__bell_ring(&cb->mgr_bell, &cb->mgr_sleepers);

  char heap_name[CXR_NAME_MAX + 1];
  memcpy(heap_name, s->heap, sizeof heap_name);
  heap_name[CXR_NAME_MAX] = '\0';
  uint64_t blk_addr = CXR__LDX(&s->conn_block);
  c->heap = spare_take(c->ctl, heap_name, give_up);
  if (c->heap == NULL && (rc = cxr_heap_open(&c->heap, heap_name)) != 0) goto fail;
  uint32_t ring = c->ctl->ring_slots;
  cxr__conn_block *b = (cxr__conn_block *)(uintptr_t)blk_addr;
  if (cxr_heap_get_root(c->heap) != b ||
      !cxr__block_ok(c->heap, b, cxr__conn_block_size(ring), _Alignof(cxr__conn_block)) ||
      b->magic != CXR__CONN_MAGIC || b->version != CXR__VERSION || b->ring_slots != ring ||
      b->slot != (uint32_t)k || b->gen != c->gen || b->slots != (uint64_t)(uintptr_t)cxr__conn_slots(b, (unsigned)k)) {
    rc = CXR_ECORRUPT;
    goto fail;
  }
  c->blk = b;
  cxr__conn_views(b, ring, (unsigned)k, &c->req, &c->resp);
  c->cancel = cxr__conn_cancels(b, ring, (unsigned)k);
  c->server = (cxr__proc_id){.pid = cb->server_pid, .start_time = cb->server_start,
                             .host = cb->server_host};
  if ((rc = cxr__conn_table_init(c, ring)) != 0) goto fail;
  held_add(b, c->gen);
  /* Now the server may poll it. */
  __atomic_fetch_or(&cb->active[k / 64], 1ull << (k % 64), __ATOMIC_SEQ_CST);
  return 0;
fail:
  release_slot(c->ctl, (unsigned)k, c->pid, c->gen);
  c->slot = NULL;
  return rc;
}

int cxr_connect(cxr_conn **out, const char *target, const cxr_conn_opts *opts) {
  if (out == NULL) return CXR_EINVAL;
  *out = NULL;
  if (target == NULL) return CXR_EINVAL;
  cxr_conn_opts o;
  if (opts) o = *opts; else cxr_conn_opts_init(&o);
  if (o.default_deadline_ns == 0) o.default_deadline_ns = 5000000000;
  if (o.connect_timeout_ns == 0) o.connect_timeout_ns = 2000000000;
  if (o.peer_timeout_ns == 0) o.peer_timeout_ns = 100000000;
  if (o.default_deadline_ns < 0 || o.connect_timeout_ns < 0 || o.peer_timeout_ns < 0) return CXR_EINVAL;
  int t = cxr__transport_for(target);
  if (t < 0) return t;
  if (t == CXR__TRANSPORT_UCX) return cxr__remote_connect(out, target, &o);
  cxr_conn *c = calloc(1, sizeof *c);
  if (c == NULL) return CXR_ENOMEM;
  c->transport = t;
  c->uid = cxr__conn_uid();
  c->default_deadline = o.default_deadline_ns;
  c->peer_timeout = o.peer_timeout_ns;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->qlock, NULL);
  /* The heap opens give up by the connect timeout, also on a registry lock nobody frees. */
  int64_t give_up = cxr__after(cxr_now_ns(), o.connect_timeout_ns);
  int64_t prev = cxr__reg_deadline_set(give_up);
  int rc = connect_pod(c, target, give_up);
  cxr__reg_deadline_set(prev);
  if (rc != 0) {
    cxr__conn_table_fini(c);
    if (c->heap) cxr_heap_close(c->heap);
    if (c->ctl) ctl_put(c->ctl);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->qlock);
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

/* A connection this process got over fork: its slot, rings and completion thread are the
 * parent's, so only this process's copies go (a cross-rack one's engine is the parent's
 * too and not fork-safe: it is left as it is). */
static void forget_inherited(cxr_conn *c) {
  if (c->remote) return;
  if (c->blk != NULL) held_remove(c->blk, c->gen);
  cxr__conn_table_fini(c);
  if (c->heap) cxr_heap_close(c->heap);
  if (c->ctl) ctl_put(c->ctl);
  free(c); /* its mutexes may be held by a parent thread that does not exist here */
}

cxr_heap *cxr_conn_heap(cxr_conn *c) {
  if (c == NULL || c->heap == NULL) return cxr__fail_null(CXR_EINVAL);
  return c->heap;
}

int cxr__conn_check(cxr_conn *c, bool force) {
  int dead = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
  if (dead) return dead;
  int64_t now = cxr_now_ns();
  int64_t due = __atomic_load_n(&c->next_check, __ATOMIC_ACQUIRE);
  if (!force && now < due) return 0;
  int64_t period = c->peer_timeout / 2 > 0 ? c->peer_timeout / 2 : 1;
  if (!__atomic_compare_exchange_n(&c->next_check, &due, now + period, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE) && !force)
    return 0;
  int err = 0;
  if (CXR__LD(&c->cb->state) != CXR__CHAN_OPEN) err = CXR_ECLOSED;
  else if (!cxr__proc_alive(&c->server)) err = CXR_EPEERDEAD;
  else {
    uint64_t o = CXR__LD(&c->slot->owner);
    if (cxr__owner_pid(o) != c->pid || cxr__owner_state(o) != CXR__SLOT_CLAIMED ||
        cxr__owner_gen(o) != c->gen)
      err = CXR_ECLOSED; /* the server took the connection back */
  }
  if (err) {
    int zero = 0;
    if (__atomic_compare_exchange_n(&c->dead, &zero, err, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      /* Bounded: every client of the channel can write the control block's name. */
      CXR_INFO("connection to %.*s: %s", (int)CXR__CHAN_NAME_MAX, c->cb->name,
               cxr_strerror(err));
      if (err == CXR_EPEERDEAD) CXR__ADD(&c->slot->cli.peer_dead, 1);
    }
    cxr__conn_fail_all(c, __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE));
    return __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
  }
  return 0;
}

void cxr_conn_close(cxr_conn *c) {
  if (c == NULL) return;
  if (cxr__fork_inherited(c->fork_epoch)) {
    forget_inherited(c);
    return;
  }
  if (c->remote) {
    cxr__remote_close(c);
    return;
  }
  /* Calls made from here on fail at once: a callback the completion thread runs as it stops
   * may call again and arm a callback of its own, which no thread would then run (and its
   * future went with the table). */
  int was_dead = 0;
  __atomic_compare_exchange_n(&c->dead, &was_dead, CXR_ECLOSED, false, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
  cxr__conn_stop_completion(c);
  cxr__conn_fail_all(c, CXR_ECLOSED);
  if (c->blk != NULL) held_close(c->blk, c->gen);
  if (c->slot != NULL) release_slot(c->ctl, c->index, c->pid, c->gen);
  cxr__conn_table_fini(c);
  cxr__seal_conn_close(c);
  if (c->heap) {
    /* Keep the mapping only if the server may hand this heap out again. */
    if (was_dead == 0) spare_put(c->ctl, c->heap);
    else cxr_heap_close(c->heap);
  }
  if (c->ctl) ctl_put(c->ctl);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->qlock);
  free(c);
}
