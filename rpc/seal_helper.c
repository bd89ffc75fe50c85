/* The restricted workers' helper thread (rpc/seal_helper.h). */
#include "rpc/seal_helper.h"

#include "shm/base.h"

static void *helper_main(void *arg) {
  cxr__seal_helper *h = arg;
  pthread_mutex_lock(&h->mu);
  while (!h->stop) {
    if (h->req && h->done_seq != h->req_seq) {
      void *req = h->req;
      pthread_mutex_unlock(&h->mu);
      int rc = h->fn(h->ctx, req);
      pthread_mutex_lock(&h->mu);
      h->rc = rc;
      h->done_seq = h->req_seq;
      pthread_cond_broadcast(&h->cv);
      continue;
    }
    pthread_cond_wait(&h->cv, &h->mu);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

int cxr__seal_helper_start(cxr__seal_helper *h, cxr__seal_helper_fn fn, void *ctx) {
  h->fn = fn;
  h->ctx = ctx;
  h->req = NULL;
  h->req_seq = h->done_seq = 0;
  h->stop = false;
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  h->on = pthread_create(&h->thread, NULL, helper_main, h) == 0;
  if (!h->on) {
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
  }
  return h->on ? 0 : CXR_EIO;
}

int cxr__seal_helper_ask(cxr__seal_helper *h, void *req) {
  pthread_mutex_lock(&h->mu);
  /* The slot is busy until its requester has read the answer and cleared it: taking it as
   * soon as the helper answered made the first requester wait for an answer that never
   * came (or clear the second's request). */
  while (h->req != NULL && !h->stop) pthread_cond_wait(&h->cv, &h->mu);
  int rc = CXR_ECLOSED;
  if (!h->stop) {
    uint64_t mine = ++h->req_seq;
    h->req = req;
    pthread_cond_broadcast(&h->cv);
    while (h->done_seq != mine && !h->stop) pthread_cond_wait(&h->cv, &h->mu);
    if (h->done_seq == mine) rc = h->rc;
    h->req = NULL;
    pthread_cond_broadcast(&h->cv);
  }
  pthread_mutex_unlock(&h->mu);
  return rc;
}

void cxr__seal_helper_stop(cxr__seal_helper *h) {
  if (!h->on) return;
  pthread_mutex_lock(&h->mu);
  h->stop = true;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  pthread_join(h->thread, NULL);
  h->on = false;
  /* The lock and condition stay: a requester released by the stop may still be leaving
   * ask (they hold no resources to free). */
}
