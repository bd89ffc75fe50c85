/* For close_silent_test: bytes of messages an engine admitted and no handler got yet (a
 * rendezvous receive in progress counts from its start, rdma/worker.c msg_admit). */
#include "rdma/internal.h"

size_t cxrt_rdma_queued(cxr_rdma *r) {
  pthread_mutex_lock(&r->lock);
  size_t q = r->queued;
  pthread_mutex_unlock(&r->lock);
  return q;
}
