/* The one place a validated call meets its handler. The sandbox layer wraps this (seal
 * check, memory domain, fault containment) without touching the rest of rpc/. */
#include <stdio.h>
#include <unistd.h>

#include "rpc/remote.h"
#include "rpc/seal_glue.h"
#include "rpc/server.h"
#include "sandbox/internal.h"
#include "shm/log.h"

int cxr__dispatch(cxr_call *call, cxr_handler fn, void *user, void **result) {
  *result = NULL;
  /* Neither sealed nor sandboxed: nothing to wrap (what cxr__seal_dispatch would do too),
   * one call less on the round trip. */
  if (!(call->flags & CXR_CALL_SEAL) && !call->ch->o.untrusted)
    return fn(call, call->args, result, user);
  return cxr__seal_dispatch(call, fn, user, result); /* rpc/seal_glue.c */
}

/* ---- accessors for handlers ---- */

cxr_heap *cxr_call_heap(cxr_call *call) {
  if (call == NULL || call->sc == NULL) return cxr__fail_null(CXR_EINVAL);
  return call->sc->heap;
}

size_t cxr_call_arg_len(cxr_call *call) { return call ? call->arg_len : 0; }

bool cxr_call_cancelled(cxr_call *call) {
  if (call == NULL) return false;
  if (call->cancel != NULL && CXR__LD(call->cancel) == call->call_id) return true;
  if (call->remote != NULL && cxr__remote_call_cancelled(call)) return true;
  return call->deadline != 0 && cxr_now_ns() > call->deadline;
}

cxr_range cxr_call_arg_range(cxr_call *call) {
  cxr_range r = {NULL, 0};
  if (call != NULL && call->remote) return cxr__remote_arg_range(call);
  if (call == NULL || call->sc == NULL) return r;
  r.p = cxr_heap_base(call->sc->heap);
  r.len = cxr_heap_size(call->sc->heap);
  return r;
}

int cxr_call_set_result_ranges(cxr_call *call, const cxr_range *r, size_t n) {
  if (call == NULL || (r == NULL && n != 0)) return CXR_EINVAL;
  if (call->remote) return cxr__remote_set_result_ranges(call, r, n);
  return 0; /* in the pod the client maps the same heap: nothing to ship */
}

/* The real uid of process pid, from /proc (not from anything the process wrote). */
static int proc_uid(int pid, unsigned *uid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  FILE *f = fopen(path, "re");
  if (f == NULL) return CXR_EPEERDEAD;
  int rc = CXR_EIO;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "Uid: %u", uid) == 1) {
      rc = 0;
      break;
    }
  fclose(f);
  return rc;
}

/* Checks the pid a client wrote when it claimed its slot: another process than ours that
 * maps this connection's heap (so one that could open the channel's files: the client, or
 * a client of this slot before it that keeps its mapping for reconnects), and its uid is
 * read from /proc. Done once per tenancy. */
static bool verify_peer(cxr__sconn *sc, int pid, unsigned *uid) {
  if (__atomic_load_n(&sc->peer_gen, __ATOMIC_ACQUIRE) == sc->gen &&
      __atomic_load_n(&sc->peer_pid, __ATOMIC_RELAXED) == pid) {
    *uid = __atomic_load_n(&sc->peer_uid, __ATOMIC_RELAXED);
    return true;
  }
  /* We map every connection heap: our own pid counts only for a client of ours. */
  if (pid == (int)getpid() && !cxr__conn_held_here(sc->blk, sc->gen)) return false;
  uint64_t dev, ino, off, pdev, pino, poff;
  if (pid <= 0 || cxr__vma_backing((uintptr_t)sc->blk, &dev, &ino, &off) != 0 ||
      cxr__vma_backing_of(pid, (uintptr_t)sc->blk, &pdev, &pino, &poff) != 0 ||
      pdev != dev || pino != ino || poff != off || proc_uid(pid, uid) != 0)
    return false;
  /* Several workers may get here at once: they store the same values. */
  __atomic_store_n(&sc->peer_pid, pid, __ATOMIC_RELAXED);
  __atomic_store_n(&sc->peer_uid, *uid, __ATOMIC_RELAXED);
  __atomic_store_n(&sc->peer_gen, sc->gen, __ATOMIC_RELEASE);
  return true;
}

void cxr__call_kind(cxr_call *call, bool *untrusted, bool *remote) {
  if (untrusted) *untrusted = call == NULL || call->ch == NULL || call->ch->o.untrusted;
  if (remote) *remote = call != NULL && call->remote != NULL;
}

int cxr_call_peer(cxr_call *call, cxr_peer *out) {
  if (call == NULL || out == NULL || call->sc == NULL) return CXR_EINVAL;
  if (call->remote) return cxr__remote_peer(call, out);
  out->pid = (int)cxr__owner_pid(CXR__LD(&call->sc->slot->owner));
  out->host[0] = '\0';
  out->trusted = !call->ch->o.untrusted;
  out->verified = verify_peer(call->sc, out->pid, &out->uid);
  if (!out->verified) out->uid = CXR__LD(&call->sc->slot->client_uid);
  return 0;
}
