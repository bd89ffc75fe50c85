/* The parts of the idl runtime that stubs and skeletons need from rpc. */
#include <cxrpc/idl.h>

bool cxr__call_untrusted(cxr_call *call) {
  cxr_peer p;
  /* Unknown peer: treat as untrusted, so validation is never skipped by mistake. */
  if (!call || cxr_call_peer(call, &p) != 0) return true;
  return !p.trusted;
}

cxr_range cxr__conn_range(cxr_conn *c) {
  cxr_range r = {NULL, 0};
  cxr_heap *h = c ? cxr_conn_heap(c) : NULL;
  if (h) {
    r.p = cxr_heap_base(h);
    r.len = cxr_heap_size(h);
  }
  return r;
}
