/* The one place a validated call meets its handler. The sandbox layer wraps this (seal
 * check, memory domain, fault containment) without touching the rest of rpc/. */
#include "rpc/remote.h"
#include "rpc/seal_glue.h"
#include "rpc/server.h"
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

int cxr_call_peer(cxr_call *call, cxr_peer *out) {
  if (call == NULL || out == NULL || call->sc == NULL) return CXR_EINVAL;
  if (call->remote) return cxr__remote_peer(call, out);
  out->pid = (int)cxr__owner_pid(CXR__LD(&call->sc->slot->owner));
  out->uid = CXR__LD(&call->sc->slot->client_uid);
  out->host[0] = '\0';
  out->trusted = !call->ch->o.untrusted;
  return 0;
}
