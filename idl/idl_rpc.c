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

cxr_range cxr__call_arg_extent(cxr_call *call, const void *args) {
  cxr_range r = cxr_call_arg_range(call);
  size_t len = cxr_call_arg_len(call);
  uintptr_t a = (uintptr_t)args, lo = (uintptr_t)r.p;
  /* Only an extent inside the heap narrows the range (an inline copy lies elsewhere and
   * is then checked, and refused, against the heap). */
  if (len && r.p && a >= lo && a - lo < r.len && len <= r.len - (a - lo)) {
    r.p = args;
    r.len = len;
  }
  return r;
}
