/*
 * Sealed calls and sandboxed handlers: the glue between rpc/ and cxrpc/sandbox.h.
 *
 * Server: each connection slot gets a seal table (created with the slot, emptied for each
 * new tenant) whose memfd number is published in the slot (cxr__cslot.seal_fd). A sealed
 * call is checked against the client's real page protections before the handler runs and
 * marked done after it.
 *
 * Client: the table is opened through /proc/<server>/fd/<n> (read-only; the memfd is sealed
 * against writable views, so the mapping may sit anywhere, even for a client under cxrpcd)
 * on the first sealed call, seals happen before the descriptor is pushed and releases when
 * the call's entry is freed (batched).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cxrpc/seal.h>

#include "rpc/client.h"
#include "rpc/seal_glue.h"
#include "rpc/seal_helper.h"
#include "sandbox/internal.h"
#include "shm/env.h"
#include "shm/log.h"

#define TABLE_SLOTS 1024u

typedef struct cxr__seal_srv {
  pthread_mutex_t mu;
  cxr_seal_table *t;
  uint32_t peer_gen; /* tenancy the peer was set for (0: none) */
  int peer_rc;
} cxr__seal_srv;

typedef struct cxr__seal_chan {
  bool enforce, restrict_threads;
  unsigned n;
  cxr__seal_srv *srv;
  /* With restricted workers (no open, no socket), a helper thread opens the client's maps
   * file and talks to cxrpcd on their behalf. */
  cxr__seal_helper helper;
} cxr__seal_chan;

static int peer_setup(cxr__seal_chan *s, cxr__sconn *sc, cxr__seal_srv *v);

/* The helper's work: a restricted worker's peer set-up. */
static int peer_setup_for(void *ctx, void *req) {
  cxr__seal_chan *s = ctx;
  cxr__sconn *sc = req;
  return peer_setup(s, sc, &s->srv[sc->index]);
}

typedef struct cxr__seal_cli {
  pthread_mutex_t mu;
  cxr_seal_table *t;
  /* Seals still held by the server when their call ended (under mu). Each holds a slot of
   * the table, so there are never more than its slots. norphans is written atomically:
   * callers peek at it without the lock. */
  cxr_seal_id *orphans;
  unsigned norphans, cap;
} cxr__seal_cli;

static bool env_on(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

/* ---- server ---- */

static cxr__seal_chan *chan_get(cxr_channel *ch) {
  if (ch->seal) return ch->seal;
  cxr__seal_chan *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->n = ch->o.max_conns;
  s->srv = calloc(s->n, sizeof *s->srv);
  if (!s->srv) {
    free(s);
    return NULL;
  }
  for (unsigned i = 0; i < s->n; i++) pthread_mutex_init(&s->srv[i].mu, NULL);
  s->enforce = env_on("CXRPC_ENFORCE");
  s->restrict_threads = env_on("CXRPC_SANDBOX_THREADS");
  if (s->restrict_threads) cxr__seal_helper_start(&s->helper, peer_setup_for, s);
  ch->seal = s;
  return s;
}

void cxr__seal_slot_ready(cxr_channel *ch, cxr__sconn *sc) {
  cxr__seal_chan *s = chan_get(ch);
  if (!s || sc->index >= s->n) return;
  cxr__seal_srv *v = &s->srv[sc->index];
  pthread_mutex_lock(&v->mu);
  if (!v->t) {
    cxr_seal_opts o;
    cxr_seal_opts_init(&o);
    o.slots = TABLE_SLOTS;
    int rc = cxr_seal_table_create(&v->t, &o);
    if (rc) {
      CXR_WARN("channel %s: slot %u: no seal table: %s", ch->name, sc->index, cxr_strerror(rc));
      v->t = NULL;
    }
  } else {
    cxr__seal_table_reset(v->t);
  }
  v->peer_gen = 0;
  v->peer_rc = 0;
  CXR__ST(&sc->slot->seal_fd, v->t ? (uint32_t)cxr_seal_table_fd(v->t) + 1 : 0u);
  pthread_mutex_unlock(&v->mu);
}

void cxr__seal_channel_close(cxr_channel *ch) {
  cxr__seal_chan *s = ch->seal;
  if (!s) return;
  cxr__seal_helper_stop(&s->helper);
  for (unsigned i = 0; i < s->n; i++) {
    cxr_seal_table_close(s->srv[i].t);
    pthread_mutex_destroy(&s->srv[i].mu);
  }
  free(s->srv);
  free(s);
  ch->seal = NULL;
}

bool cxr__seal_restricts_workers(const cxr_channel *ch) {
  return ch->o.untrusted && ch->seal && ch->seal->restrict_threads;
}

/* This worker's seccomp policy: 0 not tried yet, 1 on, -1 refused by the kernel. */
static _Thread_local int thread_policy;

/* Puts this worker under the policy once. A worker the kernel would not restrict refuses
 * its untrusted calls (CXR_EPERM) rather than run them with the whole process's rights. */
static int restrict_worker(void) {
  if (thread_policy == 0) {
    thread_policy = cxr_sandbox_restrict_thread() == 0 ? 1 : -1;
    if (thread_policy < 0)
      CXR_WARN("sandbox: worker thread not restricted: its untrusted calls are refused");
  }
  return thread_policy > 0 ? 0 : CXR_EPERM;
}

/* The client of this tenancy, once: its pid for the kernel check, and cxrpcd if enforced. */
static int peer_ready(cxr__seal_chan *s, cxr__sconn *sc, cxr__seal_srv *v) {
  if (__atomic_load_n(&v->peer_gen, __ATOMIC_ACQUIRE) == sc->gen) return v->peer_rc;
  if (thread_policy > 0 && s->helper.on) return cxr__seal_helper_ask(&s->helper, sc);
  return peer_setup(s, sc, v);
}

static int peer_setup(cxr__seal_chan *s, cxr__sconn *sc, cxr__seal_srv *v) {
  pthread_mutex_lock(&v->mu);
  if (v->peer_gen != sc->gen) {
    int pid = (int)cxr__owner_pid(CXR__LD(&sc->slot->owner));
    int rc = cxr_seal_table_set_peer(v->t, pid, cxr_heap_base(sc->heap), cxr_heap_size(sc->heap));
    if (!rc && s->enforce) {
      rc = cxr_seal_table_enforce(v->t, NULL);
      if (rc) CXR_WARN("seal: client %d is not under cxrpcd (%s): sealed calls refused", pid,
                       cxr_strerror(rc));
    }
    v->peer_rc = rc ? (rc == CXR_EPEERDEAD ? rc : CXR_EPERM) : 0;
    __atomic_store_n(&v->peer_gen, sc->gen, __ATOMIC_RELEASE);
  }
  int rc = v->peer_rc;
  pthread_mutex_unlock(&v->mu);
  return rc;
}

typedef struct run_ctx {
  cxr_call *call;
  cxr_handler fn;
  void *user;
  void **result;
} run_ctx;

static int run_handler(void *arg) {
  run_ctx *r = arg;
  return r->fn(r->call, r->call->args, r->result, r->user);
}

int cxr__seal_dispatch(cxr_call *call, cxr_handler fn, void *user, void **result) {
  cxr_channel *ch = call->ch;
  cxr__seal_chan *s = ch->seal;
  cxr__seal_srv *v = NULL;
  bool sealed = (call->flags & CXR_CALL_SEAL) != 0;
  if (sealed) {
    if (call->remote || !call->sc || !s || call->sc->index >= s->n || !call->args ||
        call->arg_len == 0 || (call->flags & CXR_CALL_INLINE))
      return CXR_ENOTSEALED;
    v = &s->srv[call->sc->index];
    if (!v->t) return CXR_ENOTSEALED;
    int rc = peer_ready(s, call->sc, v);
    if (rc) return rc;
    rc = cxr_seal_table_check(v->t, call->seal, call->args, call->arg_len);
    if (rc) return rc;
  }
  int rc;
  if (ch->o.untrusted) {
    rc = s && s->restrict_threads ? restrict_worker() : 0;
    if (rc == 0) {
      run_ctx r = {call, fn, user, result};
      rc = cxr_sandbox_run(run_handler, &r);
      if (rc == CXR_EBADPTR) *result = NULL; /* a fault may have left it half-written */
    }
  } else {
    rc = fn(call, call->args, result, user);
  }
  if (sealed) cxr_seal_table_done(v->t, call->seal);
  return rc;
}

int cxr_call_check_sealed(cxr_call *call, const void *p, size_t len) {
  if (!call || !p || !(call->flags & CXR_CALL_SEAL) || !call->args) return CXR_ENOTSEALED;
  uintptr_t lo = (uintptr_t)call->args & ~(uintptr_t)(CXR__PAGE - 1);
  uintptr_t hi = ((uintptr_t)call->args + call->arg_len + CXR__PAGE - 1) & ~(uintptr_t)(CXR__PAGE - 1);
  uintptr_t a = (uintptr_t)p;
  if (a + len < a || a < lo || a + len > hi) return CXR_ENOTSEALED;
  return 0;
}

/* ---- client ---- */

/* $CXRPC_SEAL_BATCH, 1 to what a table takes (a larger one made every sealed call of the
 * connection fail with CXR_EINVAL); else the default, with a warning. */
static unsigned batch_from_env(void) {
  cxr_seal_opts o;
  cxr_seal_opts_init(&o);
  uint64_t v;
  cxr__env_u64("CXRPC_SEAL_BATCH", o.release_batch, 1, CXR_SEAL_SLOTS_MAX, &v);
  return (unsigned)v;
}

static int cli_attach(cxr_conn *c, cxr__seal_cli *k) {
  uint32_t n = CXR__LD(&c->slot->seal_fd);
  if (n == 0) return CXR_ENOSYS; /* the server has no table for this slot */
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%u", (int)c->server.pid, n - 1);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? CXR_EPEERDEAD : cxr__from_errno(errno);
  cxr_seal_opts o;
  cxr_seal_opts_init(&o);
  o.release_batch = batch_from_env();
  int rc = cxr_seal_table_attach(&k->t, fd, &o);
  close(fd);
  return rc;
}

static cxr__seal_cli *cli_get(cxr_conn *c, int *rc) {
  cxr__seal_cli *k = __atomic_load_n(&c->seal, __ATOMIC_ACQUIRE);
  if (k) return k;
  pthread_mutex_lock(&c->lock);
  k = c->seal;
  if (!k && (k = calloc(1, sizeof *k)) != NULL) {
    pthread_mutex_init(&k->mu, NULL);
    *rc = cli_attach(c, k);
    if (*rc) {
      pthread_mutex_destroy(&k->mu);
      free(k);
      k = NULL;
    } else {
      __atomic_store_n(&c->seal, k, __ATOMIC_RELEASE);
    }
  } else if (!k) {
    *rc = CXR_ENOMEM;
  }
  pthread_mutex_unlock(&c->lock);
  return k;
}

/* Ends a seal whose call is over: released if the server marked it done, cancelled if it
 * never checked it (or its check failed). CXR_EPERM while the server holds it. */
static int end_seal(cxr__seal_cli *k, cxr_seal_id id) {
  int rc = cxr_seal_table_release(k->t, id);
  return rc == CXR_EAGAIN ? cxr_seal_table_cancel(k->t, id) : rc;
}

static bool has_orphans(cxr__seal_cli *k) {
  return __atomic_load_n(&k->norphans, __ATOMIC_ACQUIRE) != 0;
}

/* Seals whose call ended while the server still held them: ended once it lets go. */
static void retry_orphans(cxr__seal_cli *k) {
  pthread_mutex_lock(&k->mu);
  for (unsigned i = 0; i < k->norphans;) {
    int rc = end_seal(k, k->orphans[i]);
    if (rc == CXR_EPERM) {
      i++;
      continue;
    }
    if (rc) CXR_DEBUG("seal: end of %u: %s", k->orphans[i], cxr_strerror(rc));
    k->orphans[i] = k->orphans[k->norphans - 1];
    __atomic_store_n(&k->norphans, k->norphans - 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&k->mu);
}

/* Keeps a seal the server still holds, to end later. Caller holds mu. */
static void add_orphan(cxr__seal_cli *k, cxr_seal_id id) {
  if (k->norphans == k->cap) {
    unsigned cap = k->cap ? 2 * k->cap : 64;
    cxr_seal_id *o = realloc(k->orphans, cap * sizeof *o);
    if (!o) {
      CXR_WARN("seal: no memory to keep seal %u the server holds; its pages stay read-only", id);
      return;
    }
    k->orphans = o;
    k->cap = cap;
  }
  k->orphans[k->norphans] = id;
  __atomic_store_n(&k->norphans, k->norphans + 1, __ATOMIC_RELEASE);
}

int cxr__call_seal(cxr_conn *c, const void *args, size_t len, uint32_t *seal) {
  *seal = 0;
  if (!args || len == 0) return CXR_EINVAL;
  if ((uintptr_t)args % CXR__PAGE) return CXR_EINVAL; /* seal whole pages: cxr_heap_alloc_pages */
  int rc = 0;
  cxr__seal_cli *k = cli_get(c, &rc);
  if (!k) return rc;
  if (has_orphans(k)) retry_orphans(k);
  cxr_seal_id id;
  rc = cxr_seal_table_seal(k->t, args, len, &id);
  if (!rc) *seal = id;
  return rc;
}

void cxr__call_release(cxr_conn *c, uint32_t seal) {
  cxr__seal_cli *k = __atomic_load_n(&c->seal, __ATOMIC_ACQUIRE);
  if (!k || !seal) return;
  int rc = end_seal(k, seal);
  if (rc == CXR_EPERM) { /* still in the server's hands */
    pthread_mutex_lock(&k->mu);
    add_orphan(k, seal);
    pthread_mutex_unlock(&k->mu);
  } else if (rc) {
    CXR_DEBUG("seal: release of %u: %s", seal, cxr_strerror(rc));
  }
}

int cxr_conn_seal_flush(cxr_conn *c) {
  if (!c) return CXR_EINVAL;
  cxr__seal_cli *k = __atomic_load_n(&c->seal, __ATOMIC_ACQUIRE);
  if (!k) return 0;
  if (has_orphans(k)) retry_orphans(k);
  return cxr_seal_table_flush(k->t);
}

int cxr_conn_seal_stats(cxr_conn *c, cxr_seal_stats *out) {
  if (!c || !out) return CXR_EINVAL;
  cxr__seal_cli *k = __atomic_load_n(&c->seal, __ATOMIC_ACQUIRE);
  if (!k) {
    memset(out, 0, sizeof *out);
    return 0;
  }
  return cxr_seal_table_stats(k->t, out);
}

void cxr__seal_conn_close(cxr_conn *c) {
  cxr__seal_cli *k = c->seal;
  if (!k) return;
  retry_orphans(k);
  if (k->norphans) { /* the connection ends: nothing will be marked done any more */
    cxr_seal_table_peer_dead(k->t);
    for (unsigned i = 0; i < k->norphans; i++) cxr_seal_table_release(k->t, k->orphans[i]);
  }
  cxr_seal_table_close(k->t); /* sweeps pending releases */
  free(k->orphans);
  pthread_mutex_destroy(&k->mu);
  free(k);
  c->seal = NULL;
}
