/*
 * ALock (cxrpc/rdma.h): one lock for processes in the pod (CPU atomics) and hosts in other
 * racks (UCX atomics), after the ALock design. Two MCS queues, one per cohort, whose heads
 * compete by Peterson's algorithm; a cohort keeps the lock for at most `budget` handoffs.
 *
 * Which word each side touches, and how:
 *   ltail, lnodes[]   pod processes only, CPU atomics
 *   rtail, rnodes[]   remote hosts only, UCX operations (atomics, 8-byte get/put)
 *   victim            both, plain 8-byte writes (and reads)
 *   the other tail    read only (plain 8-byte read, or an 8-byte RDMA get)
 * so no word ever sees CPU atomics and NIC atomics at once.
 *
 * Node states: 1 waiting, 0 granted (the cohort keeps the lock), 2 granted but must compete
 * (budget spent), 3 abandoned by a waiter whose deadline passed (the releaser passes over
 * it), 4 passed over or released (its owner may use the node again).
 *
 * A pod process that dies (SIGKILL) holding the lock or waiting for it would leave the
 * local queue stuck. Pod nodes therefore record their owner (pid, start time, host) and
 * their predecessor, a granted pod node says so in its state (a head that found the queue
 * empty stores "compete"), and a released one goes back to "passed". A pod waiter that has
 * waited a while walks back from its predecessor over dead owners' nodes (recover): a dead
 * waiter's node is marked abandoned, so its releaser passes over it as over one that timed
 * out; a dead head's node is claimed (a CAS to "passed", so one recoverer wins) and the
 * waiter takes its place as the head and competes. A process that reuses the slot of a
 * dead instance releases what that instance held first (recover_slot). Remote hosts are
 * not checked: their nodes cannot be (and the remote cohort waits for a pod process to come
 * by when a dead pod head has no successor).
 */
#include <sched.h>
#include <stddef.h>
#include <string.h>

#include "rdma/internal.h"
#include "shm/proc.h"

enum { W_WAIT = 1, W_KEEP = 0, W_COMPETE = 2, W_ABANDONED = 3, W_PASSED = 4 };
static bool is_granted(uint64_t st) { return st == W_KEEP || st == W_COMPETE; }
enum { COHORT_LOCAL = 1, COHORT_REMOTE = 2 };

#define LD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

int cxr_alock_init(cxr_alock *l, unsigned budget) {
  if (l == NULL || ((uintptr_t)l % 64) != 0) return CXR_EINVAL;
  memset(l, 0, sizeof *l);
  l->budget = budget ? budget : CXR_ALOCK_BUDGET;
  for (unsigned i = 0; i < CXR_ALOCK_SLOTS; i++) {
    l->lnodes[i].locked = W_PASSED;
    l->rnodes[i].locked = W_PASSED;
  }
  return 0;
}

static bool is_remote(const cxr_alock_ref *r) { return r->local == NULL; }

/* Each remote operation gets its own bound; the lock's deadline is checked between them. */
static int64_t op_deadline(void) { return cxr_now_ns() + 2000000000; }

/* A remote step that missed its own bound leaves this participant not knowing where it
 * stands: a timed-out atomic (tail swap, node CAS) or 8-byte put (node word) may still
 * apply at the lock later, its result lost, and a timed-out get leaves a read never seen;
 * the endpoint stays open for all of them (they go through memory the op owns, mem.c), so
 * nothing refuses the next step. So the ref is spent: later calls on it return CXR_ENOTCONN
 * without touching the lock (a retry would enqueue the slot a second time, or act on a grant
 * it never saw). While a timed-out step still force-closed the endpoint, that close refused
 * the later steps; the lock was no more recoverable then (a write in flight could land all
 * the same; cxr_alock_lock(3), BUGS). budget_left never holds this value otherwise (a budget
 * is an unsigned int). */
#define REF_SPENT UINT64_MAX

static int step(cxr_alock_ref *r, int rc) {
  if (rc == CXR_ETIMEDOUT) r->budget_left = REF_SPENT;
  return rc;
}

static uint64_t node_addr(const cxr_alock_ref *r, unsigned slot, size_t field) {
  return r->addr + offsetof(cxr_alock, rnodes) + slot * sizeof(cxr_alock_node) + field;
}

/* ---- the cohort's own words ---- */

static int node_get(cxr_alock_ref *r, unsigned slot, size_t field, uint64_t *v) {
  if (!is_remote(r)) {
    *v = LD((uint64_t *)((char *)&r->local->lnodes[slot] + field));
    return 0;
  }
  return step(r, cxr_rdma_get(r->ep, r->rk, node_addr(r, slot, field), v, 8, op_deadline()));
}

static int node_put(cxr_alock_ref *r, unsigned slot, size_t field, uint64_t v) {
  if (!is_remote(r)) {
    ST((uint64_t *)((char *)&r->local->lnodes[slot] + field), v);
    return 0;
  }
  return step(r, cxr_rdma_put(r->ep, r->rk, node_addr(r, slot, field), &v, 8, op_deadline()));
}

static int node_cas(cxr_alock_ref *r, unsigned slot, size_t field, uint64_t expect,
                    uint64_t desired, uint64_t *old) {
  if (!is_remote(r)) {
    uint64_t *w = (uint64_t *)((char *)&r->local->lnodes[slot] + field);
    uint64_t e = expect;
    __atomic_compare_exchange_n(w, &e, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    *old = e;
    return 0;
  }
  return step(r, cxr_rdma_cswap64(r->ep, r->rk, node_addr(r, slot, field), expect, desired, old,
                                  op_deadline()));
}

static int tail_swap(cxr_alock_ref *r, uint64_t v, uint64_t *old) {
  if (!is_remote(r)) {
    *old = __atomic_exchange_n(&r->local->ltail, v, __ATOMIC_ACQ_REL);
    return 0;
  }
  return step(r, cxr_rdma_swap64(r->ep, r->rk, r->addr + offsetof(cxr_alock, rtail), v, old,
                                 op_deadline()));
}

static int tail_cas(cxr_alock_ref *r, uint64_t expect, uint64_t desired, uint64_t *old) {
  if (!is_remote(r)) {
    uint64_t e = expect;
    __atomic_compare_exchange_n(&r->local->ltail, &e, desired, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    *old = e;
    return 0;
  }
  return step(r, cxr_rdma_cswap64(r->ep, r->rk, r->addr + offsetof(cxr_alock, rtail), expect,
                                  desired, old, op_deadline()));
}

/* ---- shared words: plain 8-byte reads and writes ---- */

static int other_tail(cxr_alock_ref *r, uint64_t *v) {
  if (!is_remote(r)) {
    *v = __atomic_load_n(&r->local->rtail, __ATOMIC_ACQUIRE);  /* a plain 8-byte load on x86 */
    return 0;
  }
  return step(r, cxr_rdma_get(r->ep, r->rk, r->addr + offsetof(cxr_alock, ltail),
                             v, 8, op_deadline()));
}

static int victim_get(cxr_alock_ref *r, uint64_t *v) {
  if (!is_remote(r)) {
    *v = __atomic_load_n(&r->local->victim, __ATOMIC_RELAXED);
    return 0;
  }
  return step(r, cxr_rdma_get(r->ep, r->rk, r->addr + offsetof(cxr_alock, victim),
                             v, 8, op_deadline()));
}

static int victim_put(cxr_alock_ref *r, uint64_t v) {
  if (!is_remote(r)) {
    /* A plain store, then a full fence so it is visible before we read the other tail
     * (Peterson needs store-load order; a seq_cst store would be a locked xchg). */
    __atomic_store_n(&r->local->victim, v, __ATOMIC_RELAXED);
    __asm__ __volatile__("mfence" ::: "memory");  /* (TSan rejects atomic_thread_fence) */
    return 0;
  }
  /* cxr_rdma_put returns once the write is visible at the target (flushed). */
  return step(r, cxr_rdma_put(r->ep, r->rk, r->addr + offsetof(cxr_alock, victim),
                             &v, 8, op_deadline()));
}

static int budget_of(cxr_alock_ref *r, uint64_t *b) {
  if (!is_remote(r)) {
    *b = r->local->budget;
    return 0;
  }
  return step(r, cxr_rdma_get(r->ep, r->rk, r->addr + offsetof(cxr_alock, budget),
                             b, 8, op_deadline()));
}

static void backoff(cxr_alock_ref *r, unsigned i) {
  if (is_remote(r)) return;  /* each remote read already costs a round trip */
  if (i < 1000) __builtin_ia32_pause();
  else sched_yield();
}

/* ---- release: hand the lock (or the queue head) to the next waiter ---- */

/* Hands over from node `slot`: to the successor with the cohort kept (budget left) or with
 * the duty to compete; passes over successors that abandoned; or empties the queue. In
 * `recovery` (a dead instance's hand-over, recover_slot) it also passes over successors
 * already passed over: the instance was killed between passing over one and granting the
 * next (a review), and each node it goes on to must still name the one before as its
 * predecessor (a pod node's owner may have queued it again since). */
static int hand_over_from(cxr_alock_ref *r, unsigned slot, uint64_t budget_left,
                          bool recovery) {
  unsigned cur = slot;
  bool own = true, was_passed = false;
  for (;;) {
    uint64_t nx = 0, old = 0;
    int rc = node_get(r, cur, offsetof(cxr_alock_node, next), &nx);
    if (rc) return rc;
    if (nx == 0) {
      rc = tail_cas(r, cur + 1, 0, &old);
      if (rc) return rc;
      /* An empty queue: our own node is not in it, so the caller does not hold the lock
       * (only the tail's owner empties it). Waiting for a successor would take 10 s. */
      if (own && old == 0) return CXR_EINVAL;
      if (old != cur + 1) {
        /* A successor swapped the tail and is about to link itself: wait for it. */
        int64_t end = cxr_now_ns() + 10000000000;
        for (unsigned i = 0; nx == 0; i++) {
          if ((rc = node_get(r, cur, offsetof(cxr_alock_node, next), &nx)) != 0) return rc;
          if (nx == 0 && cxr_now_ns() > end) return CXR_EPEERDEAD; /* it died mid-enqueue */
          if (nx == 0) backoff(r, i);
        }
      }
    }
    if (!own && !was_passed &&
        (rc = node_put(r, cur, offsetof(cxr_alock_node, locked), W_PASSED)) != 0)
      return rc;
    if (nx == 0) return 0;  /* the queue is empty: this cohort's flag is down */
    if (nx > CXR_ALOCK_SLOTS) return CXR_ECORRUPT;
    unsigned succ = (unsigned)nx - 1;
    if (recovery && LD(&r->local->lnodes[succ].prev) != cur + 1) return 0; /* moved on */
    uint64_t left = budget_left > 1 ? budget_left - 1 : 0;
    uint64_t grant = left > 0 ? W_KEEP : W_COMPETE;
    if (grant == W_KEEP &&
        (rc = node_put(r, succ, offsetof(cxr_alock_node, budget), left)) != 0)
      return rc;
    if ((rc = node_cas(r, succ, offsetof(cxr_alock_node, locked), W_WAIT, grant, &old)) != 0)
      return rc;
    if (old == W_WAIT) return 0;
    if (old != W_ABANDONED && !(recovery && old == W_PASSED)) return CXR_ECORRUPT;
    cur = succ;  /* it left: continue from its node, then mark it passed */
    own = false;
    was_passed = old == W_PASSED;
  }
}

static int hand_over(cxr_alock_ref *r, unsigned slot, uint64_t budget_left) {
  return hand_over_from(r, slot, budget_left, false);
}

/* hand_over, then (a pod node) out of the queue: its state says so, so that nobody takes it
 * for a dead head. */
static int release_from(cxr_alock_ref *r, unsigned slot, uint64_t budget_left) {
  int rc = hand_over(r, slot, budget_left);
  if (rc == 0 && !is_remote(r)) rc = node_put(r, slot, offsetof(cxr_alock_node, locked), W_PASSED);
  return rc;
}

int cxr_alock_unlock(cxr_alock_ref *r) {
  if (r == NULL || r->slot >= CXR_ALOCK_SLOTS || (r->local == NULL && (r->ep == NULL || r->rk == NULL)))
    return CXR_EINVAL;
  if (is_remote(r) && r->budget_left == REF_SPENT) return CXR_ENOTCONN;
  /* A pod holder's node stays granted until it releases (nobody else writes it while its
   * owner lives): any other state means this ref does not hold the lock, and handing over
   * from its stale next word would grant the lock to a waiter while another holds it. */
  if (!is_remote(r) && !is_granted(LD(&r->local->lnodes[r->slot].locked))) return CXR_EINVAL;
  /* A remote node's state cannot be read without a round trip, so the ref remembers: a
   * second unlock would hand over from the stale next word too (a review). */
  if (is_remote(r) && !r->held) return CXR_EINVAL;
  r->held = false;
  return release_from(r, r->slot, r->budget_left);
}

/* ---- pod nodes of dead processes ---- */

/* A waiter looks for dead owners ahead of it after this long, and again each time after:
 * a look reads /proc once per node it walks past. */
#define RECOVER_EVERY_NS 5000000

/* This process's identity, read once (and again in a child made by fork(2)). NULL when
 * /proc cannot say: such a process's nodes are never taken for dead. */
static pthread_mutex_t self_mu = PTHREAD_MUTEX_INITIALIZER;
static int self_known; /* atomic */
static cxr__proc_id self_id;

static void forget_self(void) { __atomic_store_n(&self_known, 0, __ATOMIC_RELEASE); }
static void watch_fork(void) { pthread_atfork(NULL, NULL, forget_self); }

static const cxr__proc_id *self(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, watch_fork);
  if (__atomic_load_n(&self_known, __ATOMIC_ACQUIRE)) return &self_id;
  pthread_mutex_lock(&self_mu);
  if (!__atomic_load_n(&self_known, __ATOMIC_RELAXED) && cxr__proc_self_id(&self_id) == 0)
    __atomic_store_n(&self_known, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&self_mu);
  return __atomic_load_n(&self_known, __ATOMIC_ACQUIRE) ? &self_id : NULL;
}

/* Who owns a pod node (zeros: nobody known). */
static cxr__proc_id owner_of(const cxr_alock_node *x) {
  return (cxr__proc_id){.pid = (int32_t)LD(&x->owner_pid),
                        .start_time = LD(&x->owner_start),
                        .host = LD(&x->owner_host)};
}

/* The node's owner has exited (a zombie counts). Unknown owners, and owners on other hosts
 * of the pod (which /proc here cannot see), count as alive. */
static bool owner_dead(const cxr_alock_node *x) {
  cxr__proc_id id = owner_of(x);
  return id.pid > 0 && !cxr__proc_alive(&id);
}

/* Our own process (no /proc read: this runs on every pod lock). */
static bool owned_here(const cxr_alock_node *x) {
  const cxr__proc_id *me = self();
  cxr__proc_id id = owner_of(x);
  return me != NULL && id.pid == me->pid && id.start_time == me->start_time &&
         id.host == me->host;
}

/* A pod node's state from `from` to `to` (the node words' own CAS: node_cas); true if it
 * was `from`. Pod steps cannot fail. */
static bool state_cas(cxr_alock_ref *r, unsigned slot, uint64_t from, uint64_t to) {
  uint64_t old = 0;
  node_cas(r, slot, offsetof(cxr_alock_node, locked), from, to, &old);
  return old == from;
}

/* Walks back from `pred`, the pod node ahead of ours (r->slot) in the queue, over nodes
 * whose owners died and nodes whose live owners gave up waiting (abandoned): a dead waiter's
 * node is marked abandoned (whoever hands the lock over passes over it); a dead head's node
 * is claimed (one CAS to passed: one recoverer wins) and ours becomes the head, which
 * competes. Stops at a live owner's node that waits or holds (it will hand over) or where
 * the way back is not known. True when our node was granted. The links walked are stable
 * while we wait: a node ahead of us cannot be passed over, or re-enqueued, without the lock
 * reaching us first; an abandoned node's owner does not touch it until it is passed over,
 * which is why its state is read again after its link (a review found a live waiter that
 * had timed out, ahead of us, stopping every recovery of a dead holder ahead of it). */
static bool recover(cxr_alock_ref *r, unsigned pred) {
  unsigned path[CXR_ALOCK_SLOTS], n = 0, cur = pred, from = r->slot;
  uint64_t st = 0, p = 0, nx = 0;
  while (n < CXR_ALOCK_SLOTS && cur != r->slot) {
    if (!owner_dead(&r->local->lnodes[cur])) {
      /* A live owner's node we may walk past: one that gave up, or one passed over by a
       * releaser killed before it granted the node after it (its next still names ours:
       * a review); read again after its link, which its owner rewrites only after that. */
      node_get(r, cur, offsetof(cxr_alock_node, locked), &st);
      node_get(r, cur, offsetof(cxr_alock_node, next), &nx);
      bool gone = st == W_ABANDONED || (st == W_PASSED && nx == from + 1);
      if (!gone) return false;
      uint64_t st2 = 0, nx2 = 0;
      node_get(r, cur, offsetof(cxr_alock_node, prev), &p);
      node_get(r, cur, offsetof(cxr_alock_node, locked), &st2);
      node_get(r, cur, offsetof(cxr_alock_node, next), &nx2);
      if (st2 != st || nx2 != nx || p == 0 || p > CXR_ALOCK_SLOTS) return false;
      path[n++] = cur; /* passed below if a dead head is found: its owner waits for that */
      from = cur;
      cur = (unsigned)p - 1;
      continue;
    }
    path[n++] = cur;
    node_get(r, cur, offsetof(cxr_alock_node, locked), &st);
    if (is_granted(st)) {
      if (!state_cas(r, cur, st, W_PASSED)) return false;
      state_cas(r, r->slot, W_WAIT, W_COMPETE); /* (a grant that came meanwhile stays) */
      for (unsigned k = 0; k + 1 < n; k++) /* the waiters between (dead or gone): out */
        state_cas(r, path[k], W_ABANDONED, W_PASSED); /* (a passed one may be queued again) */
      return true;
    }
    if (st == W_WAIT) state_cas(r, cur, W_WAIT, W_ABANDONED);
    node_get(r, cur, offsetof(cxr_alock_node, prev), &p);
    if (p == 0 || p > CXR_ALOCK_SLOTS) return false;
    from = cur;
    cur = (unsigned)p - 1;
  }
  return false;
}

/* Whether a node waits behind `slot` (its prev names it; it waits or gave up). */
static bool waits_behind(const cxr_alock *l, unsigned slot) {
  for (unsigned i = 0; i < CXR_ALOCK_SLOTS; i++) {
    uint64_t st = LD(&l->lnodes[i].locked);
    if ((st == W_WAIT || st == W_ABANDONED) && LD(&l->lnodes[i].prev) == slot + 1) return true;
  }
  return false;
}

/* From `slot` along next words (first: nx) over nodes passed over already, each naming the
 * one before as its predecessor: whether the line reaches a node that waits or gave up. */
static bool waits_down_the_line(const cxr_alock *l, unsigned slot, uint64_t nx) {
  unsigned before = slot;
  for (unsigned k = 0; k < CXR_ALOCK_SLOTS && nx != 0 && nx <= CXR_ALOCK_SLOTS; k++) {
    unsigned n = (unsigned)nx - 1;
    uint64_t st = LD(&l->lnodes[n].locked);
    if (LD(&l->lnodes[n].prev) != before + 1) return false;
    if (st == W_WAIT || st == W_ABANDONED) return true;
    if (st != W_PASSED) return false;
    nx = LD(&l->lnodes[n].next);
    before = n;
  }
  return false;
}

/* Whether a live process is queueing and has not written its predecessor yet (it waits with
 * prev 0: between its tail swap and its prev store; a head stores "compete" instead). */
static bool enqueue_under_way(const cxr_alock *l, unsigned skip) {
  for (unsigned i = 0; i < CXR_ALOCK_SLOTS; i++)
    if (i != skip && LD(&l->lnodes[i].locked) == W_WAIT && LD(&l->lnodes[i].prev) == 0 &&
        !owner_dead(&l->lnodes[i]))
      return true;
  return false;
}

/* Whether the dead instance's granted node `slot` still heads the queue, so that its
 * hand-over is still due. A process killed inside release_from, after hand_over granted the
 * successor but before its own node went back to passed, leaves it granted with a stale
 * next word; handing over from that again granted a waiter that had since queued behind
 * the real holder: two holders (found by a review). Due if a node still waits behind this
 * one, or the tail still names it; with no successor linked, a queueing process may be
 * about to name it (a first version gave it 10 ms, and a successor preempted longer was
 * never served: a review of that), so this waits while one is under way (at most 10 s, as
 * hand_over waits for a link). */
static bool hand_over_due(cxr_alock_ref *r, unsigned slot) {
  cxr_alock *l = r->local;
  uint64_t me = slot + 1;
  int64_t end = cxr_now_ns() + 10000000000;
  for (unsigned i = 0;; i++) {
    /* Looked at first: a queueing process writes its prev, then links itself, so one seen
     * under way here is seen behind us below once it is no longer under way (checked the
     * other way round, a prev written between the two looks was missed: TSan's timing
     * showed it) */
    bool under_way = enqueue_under_way(l, slot);
    uint64_t nx = LD(&l->lnodes[slot].next);
    if (nx > CXR_ALOCK_SLOTS) return false;
    if (nx != 0) return waits_down_the_line(l, slot, nx);
    if (LD(&l->ltail) == me || waits_behind(l, slot)) return true;
    if (!under_way || cxr_now_ns() > end) return false;
    backoff(r, i);
  }
}

/* Our slot's node was last used by a process that died: release the head position it held
 * (if still due), or mark its wait abandoned (the loop in cxr_alock_lock then waits until
 * it is passed over), before the node is used again. */
static int recover_slot(cxr_alock_ref *r) {
  cxr_alock_node *x = &r->local->lnodes[r->slot];
  if (owned_here(x) || !owner_dead(x)) return 0;
  uint64_t st = 0;
  node_get(r, r->slot, offsetof(cxr_alock_node, locked), &st);
  if (is_granted(st)) {
    bool due = hand_over_due(r, r->slot);
    if (state_cas(r, r->slot, st, W_PASSED) && due) return hand_over_from(r, r->slot, 0, true);
    return 0;
  }
  if (st == W_WAIT) state_cas(r, r->slot, W_WAIT, W_ABANDONED);
  return 0;
}

/* A pod node's owner is this process from now on. */
static void claim_slot(cxr_alock_node *x) {
  const cxr__proc_id *me = self();
  ST(&x->owner_pid, me ? (uint64_t)(uint32_t)me->pid : 0);
  ST(&x->owner_start, me ? me->start_time : 0);
  ST(&x->owner_host, me ? me->host : 0);
}

/* ---- acquire ---- */

int cxr_alock_lock(cxr_alock_ref *r, int64_t deadline_ns) {
  if (r == NULL || r->slot >= CXR_ALOCK_SLOTS || (r->local == NULL && (r->ep == NULL || r->rk == NULL)))
    return CXR_EINVAL;
  if (is_remote(r) && r->budget_left == REF_SPENT) return CXR_ENOTCONN;
  int64_t deadline = deadline_ns > 0 ? deadline_ns : INT64_MAX;
  unsigned me = r->slot;
  uint64_t cohort = is_remote(r) ? COHORT_REMOTE : COHORT_LOCAL, st = 0, pred = 0, old = 0;
  int rc;
  if (!is_remote(r) && (rc = recover_slot(r)) != 0) return rc;
  /* Our node may still sit in the queue from an attempt we abandoned: wait until the
   * releaser has passed over it. */
  for (unsigned i = 0;; i++) {
    if ((rc = node_get(r, me, offsetof(cxr_alock_node, locked), &st)) != 0) return rc;
    if (st != W_ABANDONED) break;
    if (cxr_now_ns() > deadline) return CXR_ETIMEDOUT;
    backoff(r, i);
  }
  cxr_alock_node *mine = is_remote(r) ? NULL : &r->local->lnodes[me];
  if (mine) {
    if (!owned_here(mine)) claim_slot(mine);
    node_put(r, me, offsetof(cxr_alock_node, prev), 0); /* not known until we are queued */
  }
  if ((rc = node_put(r, me, offsetof(cxr_alock_node, next), 0)) != 0) return rc;
  if ((rc = node_put(r, me, offsetof(cxr_alock_node, locked), W_WAIT)) != 0) return rc;
  if ((rc = tail_swap(r, me + 1, &pred)) != 0) return rc;
  if (pred > CXR_ALOCK_SLOTS) return CXR_ECORRUPT;
  st = W_COMPETE;
  if (mine && pred == 0) node_put(r, me, offsetof(cxr_alock_node, locked), W_COMPETE); /* head */
  if (pred != 0) {
    if (mine) node_put(r, me, offsetof(cxr_alock_node, prev), pred);
    if ((rc = node_put(r, (unsigned)pred - 1, offsetof(cxr_alock_node, next), me + 1)) != 0)
      return rc;
    int64_t look = 0;
    for (unsigned i = 0;; i++) {
      if ((rc = node_get(r, me, offsetof(cxr_alock_node, locked), &st)) != 0) return rc;
      if (st != W_WAIT) break;
      if (mine && i >= 1000) { /* waited a while: a dead process ahead of us? */
        int64_t now = cxr_now_ns();
        if (look == 0) look = now + RECOVER_EVERY_NS;
        if (now >= look) {
          look = now + RECOVER_EVERY_NS;
          if (recover(r, (unsigned)pred - 1)) continue; /* re-read our state */
        }
      }
      if (cxr_now_ns() > deadline) {
        /* Leave the queue: the releaser will pass over us. */
        if ((rc = node_cas(r, me, offsetof(cxr_alock_node, locked), W_WAIT, W_ABANDONED, &old)) != 0)
          return rc;
        if (old == W_WAIT) return CXR_ETIMEDOUT;
        st = old;  /* granted meanwhile */
        break;
      }
      backoff(r, i);
    }
    if (st == W_KEEP) { /* the cohort kept the lock: no need to compete */
      rc = node_get(r, me, offsetof(cxr_alock_node, budget), &r->budget_left);
      r->held = rc == 0;
      return rc;
    }
    if (st != W_COMPETE) return CXR_ECORRUPT;
  }
  /* Head of our cohort's queue: Peterson against the other cohort's head. Our flag is our
   * tail, non-zero while we are queued. */
  if ((rc = victim_put(r, cohort)) != 0) return rc;
  for (unsigned i = 0;; i++) {
    uint64_t t = 0, v = 0;
    if ((rc = other_tail(r, &t)) != 0) return rc;
    if (t == 0) break;
    if ((rc = victim_get(r, &v)) != 0) return rc;
    if (v != cohort) break;
    if (cxr_now_ns() > deadline) {
      /* Give the head position up: the next waiter competes in our place. */
      int rr = release_from(r, me, 0);
      return rr ? rr : CXR_ETIMEDOUT;
    }
    backoff(r, i);
  }
  rc = budget_of(r, &r->budget_left);
  r->held = rc == 0;
  return rc;
}
