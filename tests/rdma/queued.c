/* For close_silent_test: the engine's internals its cases look at (rdma/internal.h is C
 * only). */
#include "rdma/internal.h"

/* Bytes of messages an engine admitted and no handler got yet (a rendezvous receive in
 * progress counts from its start, rdma/worker.c msg_admit). */
size_t cxrt_rdma_queued(cxr_rdma *r) {
  pthread_mutex_lock(&r->lock);
  size_t q = r->queued;
  pthread_mutex_unlock(&r->lock);
  return q;
}

/* Engines whose close left their UCX worker undestroyed so far (rdma/worker.c,
 * leave_to_ucx). */
unsigned cxrt_rdma_left_to_ucx(void) { return cxr__rdma_left_to_ucx(); }

/* A handler run inside UCX's callback (CXR_RDMA_AM_INLINE): a message it got is freed at
 * once, so none waits in the engine's queue. */
int cxrt_rdma_am_set_inline(cxr_rdma *r, unsigned id, cxr_rdma_am_fn fn, void *user) {
  return cxr__am_set(r, id, fn, user, CXR_RDMA_AM_INLINE);
}

/* Rendezvous receives UCX holds for the engine (rdma/worker.c, am_recv_cb): those counted on
 * the engine (bare_recvs), on one endpoint (open_recvs), and on the engine and all its
 * endpoints together. */
int cxrt_rdma_bare_recvs(cxr_rdma *r) { return atomic_load(&r->bare_recvs); }
int cxrt_rdma_ep_recvs(cxr_rdma_ep *ep) { return atomic_load(&ep->open_recvs); }
int cxrt_rdma_recvs(cxr_rdma *r) {
  int n = atomic_load(&r->bare_recvs);
  pthread_mutex_lock(&r->lock);
  for (cxr_rdma_ep *ep = r->eps; ep; ep = ep->next) n += atomic_load(&ep->open_recvs);
  pthread_mutex_unlock(&r->lock);
  return n;
}
