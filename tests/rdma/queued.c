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

/* Rendezvous receives the engine refused because their endpoint was closing (rdma/ep.c,
 * cxr__recv_count). */
uint64_t cxrt_rdma_refused_closing(cxr_rdma *r) {
  pthread_mutex_lock(&r->lock);
  uint64_t n = r->rndv_refused_closing;
  pthread_mutex_unlock(&r->lock);
  return n;
}

/* The endpoint of ours a message holds (NULL: none). */
cxr_rdma_ep *cxrt_rdma_msg_ref(cxr_rdma_msg *m) { return m->ref; }

/* Ends the endpoint as a missed deadline does (rdma/ep.c, cxr__ep_end; held as rdma/mem.c rma
 * holds it), running fn(arg, u) in its window: its UCX handle `u` taken out of the endpoint
 * and not yet closed. With fn NULL the hook is left alone: another thread's end may be in its
 * window (one hook at a time). Each call counts in cxrt_rdma_ep_ends_in once it holds it. */
static void (*window_fn)(void *, void *);
static void *window_arg;
static atomic_uint ends_in;
static void window(cxr_rdma_ep *ep, ucp_ep_h u) {
  (void)ep;
  window_fn(window_arg, u);
}

void cxrt_rdma_ep_end(cxr_rdma_ep *ep, void (*fn)(void *arg, void *u), void *arg) {
  if (fn) {
    window_fn = fn;
    window_arg = arg;
    cxr__ep_end_window = window;
  }
  cxr__ep_enter(ep);
  atomic_fetch_add(&ends_in, 1);
  cxr__ep_end(ep);
  if (fn) cxr__ep_end_window = NULL;
  cxr__ep_leave(ep);
}

unsigned cxrt_rdma_ep_ends_in(void) { return atomic_load(&ends_in); }

/* Whether the endpoint's close has begun (rdma/ep.c, closing_begin: on r->closing_eps). */
bool cxrt_rdma_ep_closing(cxr_rdma_ep *ep) { return cxr__ep_closed(ep); }

/* Posts message `id` (header, data) on a bare UCX handle, asking for replies on it: the
 * request to poll with cxrt_rdma_req_done (NULL: done in place; an error: 1). */
void *cxrt_rdma_post_on(void *u, unsigned id, const void *hdr, size_t hlen, const void *data,
                        size_t len) {
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                           .flags = UCP_AM_SEND_FLAG_REPLY};
  ucs_status_ptr_t sp = ucp_am_send_nbx(u, id, hdr, hlen, data, len, &p);
  return UCS_PTR_IS_ERR(sp) ? (void *)1 : sp;
}

/* Whether a request of cxrt_rdma_post_on ended (then it is given back to UCX). */
bool cxrt_rdma_req_done(void *req) {
  if (req == NULL || req == (void *)1) return true;
  if (ucp_request_check_status(req) == UCS_INPROGRESS) return false;
  ucp_request_free(req);
  return true;
}

/* Progresses the engine's worker once on the calling thread. */
unsigned cxrt_rdma_progress(cxr_rdma *r) { return cxr__rdma_progress(r); }

/* Closed endpoints whose requests outlived their close (r->orphans), and in *idle those of
 * them with no request left: their last request should have freed them. */
unsigned cxrt_rdma_orphans(cxr_rdma *r, unsigned *idle) {
  unsigned n = 0;
  *idle = 0;
  pthread_mutex_lock(&r->lock);
  for (cxr_rdma_ep *ep = r->orphans; ep; ep = ep->orphan_next, n++)
    if (atomic_load(&ep->open_ops) + atomic_load(&ep->open_sends) +
        atomic_load(&ep->open_recvs) == 0)
      (*idle)++;
  pthread_mutex_unlock(&r->lock);
  return n;
}
