/* The kv stubs for C++ suites (kv_client.h). */
#include "tests/rpc/kv_client.h"

#include <stddef.h>
#include <string.h>

#include "examples/kvstore/kv.cxr.h"

/* The request is handed out as its key field: the message's only field, at its start. */
_Static_assert(offsetof(kv_GetRequest, key) == 0, "key first");

int kvc_set(cxr_conn *c, const void *key, size_t kl, const void *value, size_t vl) {
  cxr_heap *h = cxr_conn_heap(c);
  kv_SetRequest *rq = kv_SetRequest_new(h);
  uint8_t *k = cxr_heap_alloc(h, kl ? kl : 1), *v = cxr_heap_alloc(h, vl ? vl : 1);
  int rc = CXR_ENOMEM;
  if (rq && k && v) {
    memcpy(k, key, kl);
    memcpy(v, value, vl);
    rq->key = (cxr_bytes){k, kl};
    rq->value = (cxr_bytes){v, vl};
    kv_SetResponse *rs = NULL;
    rc = kv_KV_Set(c, rq, &rs, NULL);
    if (rs) kv_SetResponse_release(c, rs);
  }
  cxr_heap_free(h, v);
  cxr_heap_free(h, k);
  cxr_heap_free(h, rq);
  return rc;
}

cxr_bytes *kvc_get_request(cxr_conn *c) {
  kv_GetRequest *rq = kv_GetRequest_new(cxr_conn_heap(c));
  return rq ? &rq->key : NULL;
}

int kvc_get(cxr_conn *c, const cxr_bytes *key, int64_t deadline_ns, void *out, size_t cap,
            int64_t *len) {
  cxr_call_opts o;
  cxr_call_opts_init(&o);
  o.deadline_ns = deadline_ns;
  kv_GetResponse *rs = NULL;
  int rc = kv_KV_Get(c, (const kv_GetRequest *)key, &rs, &o);
  *len = -1;
  if (rs != NULL) {
    *len = (int64_t)rs->value.len;
    memcpy(out, rs->value.ptr, rs->value.len < cap ? rs->value.len : cap);
    kv_GetResponse_release(c, rs);
  }
  return rc;
}
