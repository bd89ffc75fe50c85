/* Calls on a connection: the pending table (call id = generation << 32 | index), pushing
 * requests, draining responses (any waiting thread delivers responses for everyone),
 * waiting with spin / yield / futex sleep, deadlines, cancellation, and futures with
 * callbacks run on a per-connection completion thread started on first use.
 *
 * A late response (its call timed out or was cancelled) finds its entry ORPHAN or
 * ABANDONED: the result block is freed and the response dropped. A response whose call id
 * matches no pending call is counted (cli.stray) and dropped without touching its
 * pointer. */
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rpc/client.h"
#include "rpc/remote.h"
#include "rpc/sole.h"
#include "shm/log.h"

/* ---- the pending table ---- */

/* The process's open connections, so that a thread's exit can give back the entry it kept
 * (spare_entry, below): without that, every thread that made a call and exited took one
 * entry of the table with it, and after as many threads as the table has entries (a pool
 * larger than that, or short-lived threads) every call failed with CXR_EFULL. A fork child
 * starts with none: the connections it inherits are the parent's (forget_inherited). */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static cxr_conn *open_list;
static pthread_once_t open_once = PTHREAD_ONCE_INIT;
static pthread_key_t spare_key;

static void open_prepare(void) { pthread_mutex_lock(&open_lock); }
static void open_parent(void) { pthread_mutex_unlock(&open_lock); }
static uint64_t tables_gone; /* (spare_drop) */
static void open_child(void) {
  open_list = NULL;
  /* The parent's connections are gone here: a spare naming one must be looked for again
   * (spare_drop), even by a thread whose last look matched. */
  __atomic_fetch_add(&tables_gone, 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&open_lock);
}
static void spare_at_exit(void *unused);
static void open_setup(void) {
  pthread_atfork(open_prepare, open_parent, open_child);
  pthread_key_create(&spare_key, spare_at_exit);
}

/* An entry back on the free list (c->lock held). nfree is also read without the lock, by
 * entry_release: written atomically. */
static void free_push(cxr_conn *c, uint32_t index) {
  c->free_idx[c->nfree] = index;
  __atomic_store_n(&c->nfree, c->nfree + 1, __ATOMIC_RELAXED);
}

static void open_add(cxr_conn *c) {
  pthread_once(&open_once, open_setup);
  pthread_mutex_lock(&open_lock);
  c->open_next = open_list;
  open_list = c;
  pthread_mutex_unlock(&open_lock);
}

static void open_remove(cxr_conn *c) {
  pthread_once(&open_once, open_setup);
  pthread_mutex_lock(&open_lock);
  for (cxr_conn **p = &open_list; *p != NULL; p = &(*p)->open_next)
    if (*p == c) {
      *p = c->open_next;
      break;
    }
  pthread_mutex_unlock(&open_lock);
}

int cxr__conn_table_init(cxr_conn *c, uint32_t n) {
  c->tab = calloc(n, sizeof *c->tab);
  c->free_idx = calloc(n, sizeof *c->free_idx);
  if (c->tab == NULL || c->free_idx == NULL) return CXR_ENOMEM;
  c->ntab = n;
  for (uint32_t i = 0; i < n; i++) {
    c->tab[i].index = i;
    c->tab[i].c = c;
    c->free_idx[i] = n - 1 - i;
  }
  c->nfree = n;
  open_add(c);
  return 0;
}

/* tables_gone: connections whose table went, ever (and forks): a thread whose spare names
 * another connection looks for it among the open ones only when this moved since its last
 * look (spare_drop). */

void cxr__conn_table_fini(cxr_conn *c) {
  if (c->tab != NULL) {
    open_remove(c);
    __atomic_fetch_add(&tables_gone, 1, __ATOMIC_RELAXED); /* after: see spare_drop */
  }
  free(c->tab);
  free(c->free_idx);
  c->tab = NULL;
  c->free_idx = NULL;
  c->ntab = 0;
}

/* Each thread keeps the entry it freed last (of one connection, named by its unique id):
 * a thread making call after call takes and returns it without touching the shared free
 * list or its lock. */
static __thread struct {
  uint64_t conn;
  uint32_t index;
  bool at_exit;  /* spare_key set: spare_at_exit runs when the thread ends */
} spare_entry;

/* The thread ends: the entry it kept goes back to its connection, if that is still open. */
static void spare_at_exit(void *unused) {
  (void)unused;
  uint64_t uid = spare_entry.conn;
  spare_entry.conn = 0;
  if (uid == 0) return;
  pthread_mutex_lock(&open_lock);
  for (cxr_conn *c = open_list; c != NULL; c = c->open_next)
    if (c->uid == uid) {
      pthread_mutex_lock(&c->lock);
      free_push(c, spare_entry.index);
      pthread_mutex_unlock(&c->lock);
      break;
    }
  pthread_mutex_unlock(&open_lock);
}

static uint64_t next_conn_uid = 1;
uint64_t cxr__conn_uid(void) { return __atomic_fetch_add(&next_conn_uid, 1, __ATOMIC_RELAXED); }

/* Once per thread (off the path of later calls): spare_at_exit will run when it ends. */
static bool spare_arm(void) {
  pthread_once(&open_once, open_setup);
  spare_entry.at_exit = pthread_setspecific(spare_key, &spare_entry) == 0;
  return spare_entry.at_exit;
}

/* The spare names a connection other than the one in hand: forget it if that one closed.
 * Before, a spare of a closed connection stayed for good (only the thread's exit looked),
 * so the thread never kept one again and each of its later calls took the connection's
 * lock twice. Looks under open_lock only when the spare or tables_gone changed since the
 * last look: a thread alternating between two open connections pays a relaxed load. A
 * close removes the connection from the open list before it counts, so a look that still
 * found it open read the count before the close: the next one sees it moved. */
static void spare_drop(void) {
  static __thread struct { uint64_t conn, gone; } seen;
  uint64_t gone = __atomic_load_n(&tables_gone, __ATOMIC_RELAXED);
  if (seen.conn == spare_entry.conn && seen.gone == gone) return;
  bool open = false;
  pthread_mutex_lock(&open_lock);
  for (cxr_conn *o = open_list; o != NULL && !open; o = o->open_next)
    open = o->uid == spare_entry.conn;
  pthread_mutex_unlock(&open_lock);
  seen.conn = spare_entry.conn;
  seen.gone = gone;
  if (!open) spare_entry.conn = 0;
}

static cxr_future *entry_alloc(cxr_conn *c) {
  cxr_future *f = NULL;
  if (spare_entry.conn == c->uid) {
    spare_entry.conn = 0;
    f = &c->tab[spare_entry.index];
  } else {
    pthread_mutex_lock(&c->lock);
    if (c->nfree > 0) {
      __atomic_store_n(&c->nfree, c->nfree - 1, __ATOMIC_RELAXED);
      f = &c->tab[c->free_idx[c->nfree]];
    }
    pthread_mutex_unlock(&c->lock);
  }
  if (f == NULL) return NULL;
  cxr__future_reset(f);
  __atomic_store_n(&f->state, CXR__F_PENDING, __ATOMIC_RELEASE);
  return f;
}

static void entry_release(cxr_future *f) {
  cxr_conn *c = f->c;
  if (f->seal) cxr__call_release(c, f->seal);
  __atomic_store_n(&f->state, CXR__F_FREE, __ATOMIC_RELEASE);
  /* Kept only while at least half the table is on the free list: threads that called once
   * and went on living each kept an entry, and as many of them as the table has entries
   * (256 by default) left every other call CXR_EFULL. (One relaxed load of a line written
   * only under the lock, off the shared path while a thread keeps calling.) A thread that
   * keeps calling on one connection took its spare in entry_alloc, so spare_drop is off its
   * path: the test below costs it a compare of a thread-local word, no locked instruction. */
  if (spare_entry.conn != 0 && spare_entry.conn != c->uid) spare_drop();
  if (spare_entry.conn == 0 && __atomic_load_n(&c->nfree, __ATOMIC_RELAXED) >= c->ntab / 2 &&
      (spare_entry.at_exit || spare_arm())) {
    spare_entry.conn = c->uid;
    spare_entry.index = f->index;
    return;
  }
  pthread_mutex_lock(&c->lock);
  free_push(c, f->index);
  pthread_mutex_unlock(&c->lock);
}

static void result_free(cxr_conn *c, void *p) {
  if (p != NULL && cxr_heap_contains(c->heap, p, 1)) cxr_heap_free(c->heap, p);
}

/* The outcome of a final call: the server's answer (REPLIED) or a local one. */
static int out_err(const cxr_future *f) {
  return __atomic_load_n(&f->state, __ATOMIC_ACQUIRE) == CXR__F_REPLIED ? f->rerr : f->err;
}
static void *out_result(const cxr_future *f) {
  return __atomic_load_n(&f->state, __ATOMIC_ACQUIRE) == CXR__F_REPLIED ? f->rresult : f->result;
}

/* ---- callbacks ---- */

static void completion_wake(cxr_conn *c) {
  __atomic_fetch_add(&c->resp.r->futex, 1, __ATOMIC_SEQ_CST);
  cxr__futex_wake(&c->resp.r->futex, INT_MAX);
}

/* Called by whoever made the outcome of the call of generation gen final: hands its armed
 * callback to the completion thread (exactly once: cxr__cb_fire decides). */
static void fire(cxr_future *f, uint32_t gen) {
  if (!cxr__cb_fire(f, gen)) return;
  cxr_conn *c = f->c;
  pthread_mutex_lock(&c->qlock);
  f->qnext = NULL;
  if (c->qtail) c->qtail->qnext = f; else c->qhead = f;
  c->qtail = f;
  pthread_mutex_unlock(&c->qlock);
  __atomic_fetch_sub(&c->armed, 1, __ATOMIC_SEQ_CST);
  completion_wake(c);
}

/* ---- outcomes ---- */

static __thread int64_t tl_outcome_pause; /* cxr__test_pause_after_outcome (tests only) */
void cxr__test_pause_after_outcome(int64_t ns) { tl_outcome_pause = ns; }
static void outcome_pause(void) {
  if (__builtin_expect(tl_outcome_pause <= 0, 1)) return;
  struct timespec ts = {tl_outcome_pause / 1000000000, tl_outcome_pause % 1000000000};
  nanosleep(&ts, NULL);
}

/* Ends a pending call locally (timeout, cancel, dead peer): its response may still come. */
static bool expire(cxr_future *f, int err) {
  uint64_t id;
  if (!cxr__future_orphan(f, err, &id)) return false;
  outcome_pause();
  /* Tell the server we gave up (not for a dead peer or a closed channel): a request still
   * queued is not run, and a running handler may stop (cxr_call_cancelled). The id is the
   * one read while the entry was ours: the owner may since have freed the future and made a
   * new call on the entry, which another thread's cancel must not touch (a review found
   * the new call cancelled). */
  cxr_conn *c = f->c;
  if ((err == CXR_ECANCELED || err == CXR_ETIMEDOUT) && c->cancel != NULL)
    CXR__ST(&c->cancel[f->index], id);
  fire(f, (uint32_t)(id >> 32));
  return true;
}

static void deliver(cxr_conn *c, const cxr__desc *d) {
  uint32_t idx = (uint32_t)d->call_id, gen = (uint32_t)(d->call_id >> 32);
  cxr__cli_ctr *ctr = &c->slot->cli;
  if (idx >= c->ntab || gen == 0 || __atomic_load_n(&c->tab[idx].gen, __ATOMIC_RELAXED) != gen) {
    CXR__ADD(&ctr->stray, 1);
    return;
  }
  cxr_future *f = &c->tab[idx];
  void *ptr = (void *)(uintptr_t)d->ptr;
  int status = d->status;
  if (status > 0 || status < CXR_ERRNO_MIN) status = CXR_EPROTO;
  if (ptr != NULL && !cxr_heap_contains(c->heap, ptr, 1)) {
    status = CXR_EBADPTR; /* never touch a pointer outside our heap */
    ptr = NULL;
  }
  for (;;) {
    uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
    if (s == CXR__F_PENDING) {
      /* The answer goes to fields only we write, then one CAS publishes it (expire()
       * writes err/result only after winning its own CAS). */
      f->rerr = status;
      f->rresult = ptr;
      if (!__atomic_compare_exchange_n(&f->state, &s, CXR__F_REPLIED, false, __ATOMIC_SEQ_CST,
                                       __ATOMIC_ACQUIRE))
        continue;
      if (status == CXR_ETIMEDOUT) CXR__ADD(&ctr->timeouts, 1); /* expired in the queue */
      else if (status != 0) CXR__ADD(&ctr->errors, 1);
      outcome_pause();
      fire(f, gen);
      /* Wake threads of ours asleep on the ring: one of them may wait for this call. The
       * private count keeps us off the shared line the server rings. */
      if (__atomic_load_n(&c->sleeping, __ATOMIC_SEQ_CST) != 0) completion_wake(c);
      return;
    }
    if (s == CXR__F_ORPHAN) {
      if (!__atomic_compare_exchange_n(&f->state, &s, CXR__F_DONE, false, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE))
        continue;
      result_free(c, ptr);
      CXR__ADD(&ctr->late, 1);
      return;
    }
    if (s == CXR__F_ABANDONED) {
      if (!__atomic_compare_exchange_n(&f->state, &s, CXR__F_BUSY, false, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE))
        continue;
      result_free(c, ptr);
      CXR__ADD(&ctr->late, 1);
      entry_release(f);
      return;
    }
    if (s == CXR__F_BUSY) {
      cxr__cpu_relax();
      continue;
    }
    CXR__ADD(&ctr->stray, 1); /* a second response to one call */
    return;
  }
}

/* One answer off the response ring, if there is one (0), by the sole user's operation when
 * this thread is the connection's sole user (rpc/sole.h). */
static int answer_pop(cxr_conn *c, cxr__desc *d) {
  if (!cxr__sole_begin(c)) return cxr__sole_gone(c) ? CXR_EAGAIN : cxr__ring_pop(&c->resp, d);
  int rc = cxr__ring_pop_single(&c->resp, d);
  cxr__sole_end(c);
  return rc;
}

/* A request onto the ring (0), or CXR_EFULL; a call (not a test's raw descriptor) is
 * counted. The calls counter is the sole user's alone too while it is one: no locked
 * instruction for it either. */
static int request_push(cxr_conn *c, const cxr__desc *d, bool count, int64_t stall_ns) {
  cxr__cli_ctr *ctr = &c->slot->cli;
  if (!cxr__sole_begin(c)) {
    if (cxr__sole_gone(c)) return CXR_EIO; /* the connection is dead: its error follows */
    int rc = cxr__ring_push(&c->req, d);
    if (rc != 0) return rc;
    if (count) CXR__ADD(&ctr->calls, 1);
    cxr__bell_after_push(&c->cb->doorbell, &c->cb->srv_sleepers);
    return 0;
  }
  int rc = cxr__ring_push_single(&c->req, d);
  if (rc == 0 && count) {
    uint64_t n = CXR__LDX(&ctr->calls);
    if (stall_ns > 0) { /* only from cxr__conn_push_stalled (tests) */
      struct timespec ts = {stall_ns / 1000000000, stall_ns % 1000000000};
      nanosleep(&ts, NULL);
    }
    CXR__STX(&ctr->calls, n + 1);
  }
  cxr__sole_end(c);
  if (rc == 0) cxr__bell_after_store(&c->cb->doorbell, &c->cb->srv_sleepers);
  return rc;
}

static unsigned drain(cxr_conn *c) {
  cxr__desc d;
  unsigned n = 0;
  while (n < c->ntab && answer_pop(c, &d) == 0) {
    deliver(c, &d);
    n++;
  }
  return n;
}

void cxr__conn_fail_all(cxr_conn *c, int err) {
  for (uint32_t i = 0; c->tab != NULL && i < c->ntab; i++) expire(&c->tab[i], err);
}

static bool final(uint32_t s) {
  return s == CXR__F_DONE || s == CXR__F_ORPHAN || s == CXR__F_REPLIED;
}

/* How long (ns, at most t) a thread may sleep on the answers ring: t while the ring is
 * empty, else cxr__busy_sleep_ns with the ring's tail as the mark. A ring whose tail is
 * ahead of any published answer (a worker between its tail CAS and its publish, or a
 * server stopped or hostile there) kept every sleep refused: until 2026-11-28 a waiting
 * caller spun at full CPU to its deadline, and the completion thread for as long as
 * callbacks were armed. A live worker's answer is either published by the next try (a
 * moved tail starts the count again, no sleep) or rung for: it sees the sleeper counted. */
static int64_t resp_sleep_ns(cxr_conn *c, cxr__busy *refused, int64_t t) {
  if (!cxr__ring_busy(&c->resp)) {
    refused->n = 0;
    return t;
  }
  /* An answer published (we are counted as a sleeper by now) is taken at once: one that
   * came between two refusals rang nobody, and would wait out a backoff step (a review). */
  if (cxr__ring_nonempty(&c->resp)) {
    refused->n = 0;
    return 0;
  }
  int64_t busy = cxr__busy_sleep_ns(refused, CXR__LDX(&c->resp.r->tail));
  return busy < t ? busy : t;
}

/* Waits until f has an outcome, its deadline passes, the peer dies, or `until` (absolute)
 * passes. Returns 0 when f is final, CXR_EAGAIN when `until` passed first. */
static __thread cxr__waitpol tl_wait;

static int wait_entry(cxr_conn *c, cxr_future *f, int64_t until) {
  /* The clock is first read after 16 polls: a call answered within them (the polling
   * path) never reads it here. */
  int64_t start = 0, spin = 0, yield_ns = 0;
  bool checked = false;
  cxr__busy refused; /* set with start, off the path of a call answered within 16 polls */
  for (unsigned i = 0;; i++) {
    if (final(__atomic_load_n(&f->state, __ATOMIC_ACQUIRE))) return 0;
    drain(c);
    if (final(__atomic_load_n(&f->state, __ATOMIC_ACQUIRE))) return 0;
    if (((i + 1) & 15) != 0 && i < 100000) { /* the clock every 16 polls, not on the first */
      cxr__cpu_relax();
      continue;
    }
    int64_t now = cxr_now_ns();
    if (start == 0) {
      start = now;
      refused = (cxr__busy){0};
      cxr__wait_windows(&tl_wait, start, &spin, &yield_ns);
      cxr__wait_spin_start(&tl_wait, now);
    }
    if (now >= f->deadline) {
      if (expire(f, CXR_ETIMEDOUT)) CXR__ADD(&c->slot->cli.timeouts, 1);
      continue;
    }
    int dead = cxr__conn_check(c, false);
    if (dead != 0) { /* its fail_all ended f, unless f was sent just after that pass */
      expire(f, dead);
      continue;
    }
    if (now >= until) return CXR_EAGAIN;
    int64_t idle = now - start;
    if (idle < spin) {
      cxr__wait_tick(&tl_wait, now);
      cxr__cpu_relax();
      continue;
    }
    if (!checked && spin > 0) { /* the spin window ran out: was our spinning off the CPU? */
      checked = true;
      if (cxr__wait_contended(&tl_wait, now)) yield_ns = 0;
    }
    if (idle < spin + yield_ns) {
      sched_yield();
      continue;
    }
    /* Sleep on the ring's futex; the server (or a thread of ours delivering for us) rings. */
    cxr__ring *r = c->resp.r;
    uint32_t v = __atomic_load_n(&r->futex, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&r->sleepers, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&c->sleeping, 1, __ATOMIC_SEQ_CST);
    if (!final(__atomic_load_n(&f->state, __ATOMIC_SEQ_CST))) {
      int64_t t = f->deadline - now;
      if (until - now < t) t = until - now;
      if (c->peer_timeout / 2 < t) t = c->peer_timeout / 2;
      t = resp_sleep_ns(c, &refused, t > 0 ? t : 1);
      if (t > 0) cxr__futex_wait(&r->futex, v, t);
    }
    __atomic_fetch_sub(&c->sleeping, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_sub(&r->sleepers, 1, __ATOMIC_SEQ_CST);
  }
}

/* ---- calls ---- */

int cxr_conn_call_async(cxr_conn *c, uint32_t method, const void *args, cxr_future **out,
                        const cxr_call_opts *o) {
  if (out == NULL) return CXR_EINVAL;
  *out = NULL;
  if (c != NULL && cxr__fork_inherited(c->fork_epoch)) return CXR_ECLOSED;
  if (c != NULL && c->remote) return cxr__remote_call_async(c, method, args, out, o);
  if (c == NULL || c->tab == NULL) return CXR_EINVAL;
  static const cxr_call_opts defaults; /* what cxr_call_opts_init gives: all zero */
  if (o == NULL) o = &defaults;
  if (o->deadline_ns < 0 || (o->flags & ~(unsigned)(CXR_CALL_SEAL | CXR_CALL_INLINE)) ||
      (o->flags & (CXR_CALL_SEAL | CXR_CALL_INLINE)) == (CXR_CALL_SEAL | CXR_CALL_INLINE) ||
      (o->ranges == NULL && o->nranges != 0))
    return CXR_EINVAL; /* an inline copy cannot be sealed: the server could never check it */
  cxr__desc d;
  cxr__desc_set(&d, 0, method, o->flags);
  if (o->flags & CXR_CALL_INLINE) {
    if (o->arg_len > CXR__INLINE_MAX || (args == NULL && o->arg_len != 0)) return CXR_EINVAL;
    if (o->arg_len) memcpy(d.data, args, o->arg_len);
    if (o->arg_len % 8) /* the ring copies whole words: no stack bytes to the peer */
      memset(d.data + o->arg_len, 0, 8 - o->arg_len % 8);
    d.len = o->arg_len;
  } else if (args != NULL) {
    size_t len = o->arg_len;
    if (!cxr_heap_contains(c->heap, args, len ? len : 1)) return CXR_EBADPTR;
    if (len == 0 && (o->flags & CXR_CALL_SEAL)) len = cxr_heap_usable_size(c->heap, args);
    d.ptr = (uint64_t)(uintptr_t)args;
    d.len = len;
  } else if (o->arg_len != 0) {
    return CXR_EINVAL;
  }
  int dead = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
  if (dead) return dead;
  cxr_future *f = entry_alloc(c);
  if (f == NULL) return CXR_EFULL;
  /* Long deadlines start from the coarse clock (at most a tick early: <= 4 % at 100 ms),
   * short ones from the precise one. */
  int64_t rel = o->deadline_ns ? o->deadline_ns : c->default_deadline;
  int64_t now = rel >= 100000000 ? cxr__coarse_ns() : cxr_now_ns();
  d.deadline = cxr__after(now, rel);
  /* (atomically: the completion thread reads armed entries' deadlines, expire_armed) */
  __atomic_store_n(&f->deadline, d.deadline, __ATOMIC_RELAXED);
  d.call_id = cxr__future_call_id(f);
  if (o->flags & CXR_CALL_SEAL) {
    int rc = cxr__call_seal(c, args, d.len, &d.seal);
    if (rc != 0) {
      entry_release(f);
      return rc;
    }
    f->seal = d.seal;
  }
  /* The ring holds ring_slots descriptors and the table as many calls, so it is full only
   * while the server is behind: wait for room, within the deadline. */
  for (unsigned i = 0; request_push(c, &d, true, 0) != 0; i++) {
    drain(c);
    int rc = cxr__conn_check(c, false);
    if (rc == 0 && cxr_now_ns() >= f->deadline) rc = CXR_ETIMEDOUT;
    if (rc != 0) {
      if (rc == CXR_ETIMEDOUT) CXR__ADD(&c->slot->cli.timeouts, 1);
      entry_release(f);
      return rc;
    }
    cxr__bell_after_push(&c->cb->doorbell, &c->cb->srv_sleepers);
    if (i < 64) cxr__cpu_relax(); else sched_yield();
  }
  *out = f;
  return 0;
}

int cxr_conn_call(cxr_conn *c, uint32_t method, const void *args, void **result,
                  const cxr_call_opts *o) {
  if (result != NULL) *result = NULL; /* also when the call is never sent, pod or remote */
  if (c != NULL && c->remote) { /* (a pod call is checked in cxr_conn_call_async) */
    if (cxr__fork_inherited(c->fork_epoch)) return CXR_ECLOSED;
    return cxr__remote_call(c, method, args, result, o);
  }
  cxr_future *f;
  int rc = cxr_conn_call_async(c, method, args, &f, o);
  if (rc != 0) return rc;
  /* Two pauses (~50 ns here) before the first look at the answer, whose line the request
   * was just written to: it cannot come sooner than a round trip (0.06-0.4 µs), and polling
   * that line at once made the call ~0.1-0.15x the floor slower (docs/rpc.md). Only here:
   * a future waited for among many in flight may be answered already (16 in flight lost
   * 40 % of its calls/s with the pauses in every wait). */
  cxr__cpu_relax();
  cxr__cpu_relax();
  wait_entry(c, f, INT64_MAX);
  /* The common end: the server answered and no callback is armed (none can be: the future
   * never left this function), so nothing else touches f any more. */
  if (__atomic_load_n(&f->state, __ATOMIC_ACQUIRE) == CXR__F_REPLIED) {
    rc = f->rerr;
    if (result != NULL) *result = f->rresult;
    else result_free(c, f->rresult);
    entry_release(f);
    return rc;
  }
  rc = out_err(f);
  if (result != NULL) {
    *result = out_result(f);
    f->taken = true;
  }
  cxr_future_free(f);
  return rc;
}

/* ---- futures ---- */

int cxr_future_poll(cxr_future *f, void **result) {
  if (f == NULL || f->c == NULL) return CXR_EINVAL;
  if (result) *result = NULL;
  if (cxr__fork_inherited(f->c->fork_epoch)) return CXR_ECLOSED;
  if (f->c->remote) return cxr__remote_future_poll(f, result);
  cxr_conn *c = f->c;
  uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
  if (!final(s)) {
    drain(c);
    s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
  }
  if (!final(s)) {
    int dead;
    if (cxr_now_ns() >= f->deadline) {
      if (expire(f, CXR_ETIMEDOUT)) CXR__ADD(&c->slot->cli.timeouts, 1);
    } else if ((dead = cxr__conn_check(c, false)) != 0) {
      expire(f, dead); /* (see wait_entry) */
    }
    s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
    if (!final(s)) return CXR_EAGAIN;
  }
  if (result) {
    *result = out_result(f);
    f->taken = true;
  }
  return out_err(f);
}

int cxr_future_wait(cxr_future *f, int64_t timeout_ns, void **result) {
  if (f == NULL || f->c == NULL || timeout_ns < 0) return CXR_EINVAL;
  if (result) *result = NULL;
  if (cxr__fork_inherited(f->c->fork_epoch)) return CXR_ECLOSED;
  if (f->c->remote) return cxr__remote_future_wait(f, timeout_ns, result);
  int64_t until = timeout_ns == 0 ? INT64_MAX : cxr__after(cxr_now_ns(), timeout_ns);
  if (wait_entry(f->c, f, until) != 0) return CXR_EAGAIN;
  if (result) {
    *result = out_result(f);
    f->taken = true;
  }
  return out_err(f);
}

int cxr_future_cancel(cxr_future *f) {
  if (f == NULL || f->c == NULL) return CXR_EINVAL;
  if (cxr__fork_inherited(f->c->fork_epoch)) return CXR_ECLOSED; /* its id is the parent's call */
  if (f->c->remote) return cxr__remote_future_cancel(f);
  uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
  if (s == CXR__F_FREE || s == CXR__F_ABANDONED) return CXR_EINVAL;
  if (expire(f, CXR_ECANCELED)) {
    CXR__ADD(&f->c->slot->cli.cancels, 1);
    return 0;
  }
  return CXR_EBUSY; /* it had already ended: its outcome stands */
}

void cxr_future_free(cxr_future *f) {
  if (f == NULL || f->c == NULL || cxr__fork_inherited(f->c->fork_epoch)) return;
  if (f->c->remote) {
    cxr__remote_future_free(f);
    return;
  }
  for (;;) {
    uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
    switch (s) {
      case CXR__F_PENDING:
        if (expire(f, CXR_ECANCELED)) CXR__ADD(&f->c->slot->cli.cancels, 1);
        continue;
      case CXR__F_DONE:
      case CXR__F_REPLIED:
        if (!f->taken && out_result(f) != NULL) result_free(f->c, out_result(f));
        if (cxr__cb_disarm(f)) __atomic_fetch_sub(&f->c->armed, 1, __ATOMIC_SEQ_CST);
        entry_release(f);
        return;
      case CXR__F_ORPHAN:
        if (__atomic_compare_exchange_n(&f->state, &s, CXR__F_ABANDONED, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
          return; /* the late response releases it */
        continue;
      case CXR__F_BUSY:
        cxr__cpu_relax();
        continue;
      default:
        return; /* already freed */
    }
  }
}

/* ---- the completion thread ---- */

static void run_callbacks(cxr_conn *c) {
  for (;;) {
    pthread_mutex_lock(&c->qlock);
    cxr_future *f = c->qhead;
    if (f) {
      c->qhead = f->qnext;
      if (c->qhead == NULL) c->qtail = NULL;
    }
    pthread_mutex_unlock(&c->qlock);
    if (f == NULL) return;
    void (*cb)(int, void *, void *) = f->cb;
    void *user = f->cb_user, *result = out_result(f);
    int err = out_err(f);
    f->taken = true;
    cb(err, result, user); /* may free f: not touched after this */
  }
}

static void expire_armed(cxr_conn *c, int64_t now, int64_t *next) {
  for (uint32_t i = 0; i < c->ntab; i++) {
    cxr_future *f = &c->tab[i];
    if (cxr__cb_state(f) != CXR__CB_ARMED) continue;
    if (__atomic_load_n(&f->state, __ATOMIC_ACQUIRE) != CXR__F_PENDING) continue;
    int64_t deadline = __atomic_load_n(&f->deadline, __ATOMIC_RELAXED);
    if (now >= deadline) {
      if (expire(f, CXR_ETIMEDOUT)) CXR__ADD(&c->slot->cli.timeouts, 1);
    } else if (deadline < *next) {
      *next = deadline;
    }
  }
}

static void *completion_main(void *arg) {
  cxr_conn *c = arg;
  cxr__ring *r = c->resp.r;
  cxr__busy refused = {0};
  while (!__atomic_load_n(&c->cstop, __ATOMIC_ACQUIRE)) {
    uint32_t v = __atomic_load_n(&r->futex, __ATOMIC_SEQ_CST);
    run_callbacks(c);
    bool armed = __atomic_load_n(&c->armed, __ATOMIC_SEQ_CST) > 0;
    int64_t now = cxr_now_ns(), next = now + 1000000000;
    if (armed) {
      drain(c);
      int dead = cxr__conn_check(c, false);
      if (dead != 0) cxr__conn_fail_all(c, dead); /* also calls sent after its first pass */
      expire_armed(c, now, &next);
      int64_t check = now + (c->peer_timeout / 2 > 0 ? c->peer_timeout / 2 : 1);
      if (check < next) next = check;
    }
    pthread_mutex_lock(&c->qlock);
    bool queued = c->qhead != NULL;
    pthread_mutex_unlock(&c->qlock);
    if (queued) continue;
    /* Count as a sleeper only while callbacks wait for responses: then the server rings. */
    if (armed) {
      __atomic_fetch_add(&r->sleepers, 1, __ATOMIC_SEQ_CST);
      __atomic_fetch_add(&c->sleeping, 1, __ATOMIC_SEQ_CST);
    }
    int64_t t = next - now > 0 ? next - now : 1;
    if (armed) t = resp_sleep_ns(c, &refused, t);
    if (t > 0 && !__atomic_load_n(&c->cstop, __ATOMIC_ACQUIRE)) cxr__futex_wait(&r->futex, v, t);
    if (armed) {
      __atomic_fetch_sub(&c->sleeping, 1, __ATOMIC_SEQ_CST);
      __atomic_fetch_sub(&r->sleepers, 1, __ATOMIC_SEQ_CST);
    }
  }
  run_callbacks(c);
  return NULL;
}

int cxr_future_then(cxr_future *f, void (*cb)(int err, void *result, void *user), void *user) {
  if (f == NULL || f->c == NULL || cb == NULL) return CXR_EINVAL;
  if (cxr__fork_inherited(f->c->fork_epoch)) return CXR_ECLOSED;
  if (f->c->remote) return cxr__remote_future_then(f, cb, user);
  cxr_conn *c = f->c;
  uint32_t s = __atomic_load_n(&f->state, __ATOMIC_ACQUIRE);
  if (s == CXR__F_FREE || s == CXR__F_ABANDONED) return CXR_EINVAL;
  if (cxr__cb_state(f) != CXR__CB_NONE) return CXR_EBUSY;
  if (final(s)) { /* already done: run it now, in the caller */
    cxr__cb_set(f, CXR__CB_FIRED);
    f->taken = true;
    cb(out_err(f), out_result(f), user);
    return 0;
  }
  pthread_mutex_lock(&c->qlock);
  int rc = 0;
  if (!c->cstarted) {
    if (pthread_create(&c->cthread, NULL, completion_main, c) == 0) c->cstarted = true;
    else rc = CXR_EIO;
  }
  pthread_mutex_unlock(&c->qlock);
  if (rc != 0) return rc;
  f->cb = cb;
  f->cb_user = user;
  __atomic_fetch_add(&c->armed, 1, __ATOMIC_SEQ_CST);
  cxr__cb_set(f, CXR__CB_ARMED);
  /* If the outcome landed meanwhile, whoever wins the CAS in fire() queues it. */
  if (final(__atomic_load_n(&f->state, __ATOMIC_SEQ_CST)))
    fire(f, __atomic_load_n(&f->gen, __ATOMIC_RELAXED));
  completion_wake(c);
  return 0;
}

void cxr__conn_stop_completion(cxr_conn *c) {
  if (!c->cstarted) return;
  /* Pending callbacks end with CXR_ECLOSED before the thread goes. */
  cxr__conn_fail_all(c, CXR_ECLOSED);
  __atomic_store_n(&c->cstop, 1, __ATOMIC_RELEASE);
  completion_wake(c);
  pthread_join(c->cthread, NULL);
  c->cstarted = false;
}

/* ---- raw access for tests (internal.h) ---- */

int cxr__conn_push_raw(cxr_conn *c, const cxr__desc *d) {
  if (c == NULL || d == NULL) return CXR_EINVAL;
  return request_push(c, d, false, 0);
}

int cxr__conn_push_stalled(cxr_conn *c, const cxr__desc *d, int64_t stall_ns) {
  if (c == NULL || d == NULL || stall_ns < 0) return CXR_EINVAL;
  return request_push(c, d, true, stall_ns);
}

int cxr__conn_pop_raw(cxr_conn *c, cxr__desc *out, int64_t timeout_ns) {
  if (c == NULL || out == NULL) return CXR_EINVAL;
  int64_t until = cxr_now_ns() + timeout_ns;
  while (answer_pop(c, out) != 0) {
    if (cxr_now_ns() >= until) return CXR_ETIMEDOUT;
    sched_yield();
  }
  return 0;
}

int cxr__conn_pop_once(cxr_conn *c, cxr__desc *out) {
  if (c == NULL || out == NULL) return CXR_EINVAL;
  return answer_pop(c, out);
}

bool cxr__conn_shared(cxr_conn *c) {
  return c != NULL && __atomic_load_n(&c->sole, __ATOMIC_RELAXED) == CXR__SOLE_SHARED;
}

uint32_t cxr__conn_table_size(cxr_conn *c) { return c ? c->ntab : 0; }
uint32_t cxr__conn_table_free(cxr_conn *c) {
  return c ? __atomic_load_n(&c->nfree, __ATOMIC_RELAXED) : 0;
}

void cxr__conn_mark_dead(cxr_conn *c, int err) {
  int zero = 0;
  __atomic_compare_exchange_n(&c->dead, &zero, err, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

int cxr__conn_rings(cxr_conn *c, cxr__rview *req, cxr__rview *resp) {
  if (c == NULL || c->tab == NULL || req == NULL || resp == NULL) return CXR_EINVAL;
  *req = c->req;
  *resp = c->resp;
  return 0;
}
