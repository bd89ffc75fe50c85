/* Private to rpc/ (tests may include it): the helper thread that does for restricted
 * workers what their seccomp policy forbids them (opening a client's maps file, talking to
 * cxrpcd). One request at a time: a requester takes the slot, the helper answers, and the
 * slot stays the requester's until it has read the answer. */
#ifndef CXRPC_RPC_SEAL_HELPER_H
#define CXRPC_RPC_SEAL_HELPER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int (*cxr__seal_helper_fn)(void *ctx, void *req);

typedef struct cxr__seal_helper {
  cxr__seal_helper_fn fn;
  void *ctx;
  pthread_t thread;
  bool on, stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void *req; /* the request in the slot, or NULL: the slot is free */
  int rc;
  uint64_t req_seq, done_seq;
} cxr__seal_helper;

/* Starts the helper thread, which runs fn(ctx, req) for each request. Returns 0 or
 * CXR_EIO (no thread; h->on stays false). */
int cxr__seal_helper_start(cxr__seal_helper *h, cxr__seal_helper_fn fn, void *ctx);
/* Has the helper run fn on req (non-NULL) and returns its result; waits for the slot first.
 * CXR_ECLOSED once the helper is stopping (the request may not have run). */
int cxr__seal_helper_ask(cxr__seal_helper *h, void *req);
/* Stops and joins the helper; requesters still waiting get CXR_ECLOSED. h may be freed once
 * no requester is inside cxr__seal_helper_ask. */
void cxr__seal_helper_stop(cxr__seal_helper *h);

#ifdef __cplusplus
}
#endif

#endif
