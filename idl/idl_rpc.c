/* The parts of the idl runtime that stubs and skeletons need from rpc. */
#include <cxrpc/idl.h>

int cxr__graph_ranges(const void *m, size_t size, cxr__rinfn walk, cxr_ranges *rg) {
  cxr_ranges_init(rg);
  int rc = cxr_ranges_add(rg, m, size);
  if (!rc) rc = walk(m, rg, 0);
  /* Merged: fewer ranges to ship, none twice. Blocks have in-band headers or are whole
   * pages, so distinct small blocks never touch and each range still starts a block. */
  if (!rc) cxr_ranges_merge(rg);
  if (rc) cxr_ranges_free(rg);
  return rc;
}

const cxr_call_opts *cxr__stub_opts(cxr_conn *c, const void *rq, size_t size, cxr__rinfn walk,
                                    const cxr_call_opts *o, cxr_call_opts *tmp, cxr_ranges *rg,
                                    int *err) {
  *err = 0;
  cxr_ranges_init(rg);
  if (!cxr_conn_is_remote(c) || (o && o->ranges)) return o;
  if ((*err = cxr__graph_ranges(rq, size, walk, rg)) != 0) return NULL;
  if (o) *tmp = *o;
  else cxr_call_opts_init(tmp);
  tmp->ranges = rg->items;
  tmp->nranges = rg->count;
  return tmp;
}

int cxr__skel_result(cxr_call *call, const void *rs, size_t size, cxr__rinfn walk) {
  if (!rs) return 0;
  cxr_ranges rg;
  int rc = cxr__graph_ranges(rs, size, walk, &rg);
  if (rc) return rc;
  rc = cxr_call_set_result_ranges(call, rg.items, rg.count);  /* copies them */
  cxr_ranges_free(&rg);
  return rc;
}

/* The bytes of r from p on: 0 when p lies outside r. */
static size_t room_at(cxr_range r, const void *p) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)r.p;
  return r.p && a >= lo && a - lo < r.len ? r.len - (a - lo) : 0;
}

cxr_range cxr__call_arg_extent(cxr_call *call, const void *args) {
  cxr_range r = cxr_call_arg_range(call);
  size_t len = cxr_call_arg_len(call);
  /* Only an extent inside the heap narrows the range (an inline copy lies elsewhere and
   * is then checked, and refused, against the heap). */
  if (len && len <= room_at(r, args)) {
    r.p = args;
    r.len = len;
  }
  return r;
}

int cxr__skel_arg_check(cxr_call *call, const void *args, size_t size) {
  /* [args, args + arg_len) is what the server checked (inside the heap or the replica) or
   * copied (an inline argument): a struct within it is readable. Else the struct itself
   * must lie in the heap (a caller that stated no length, as the stubs do). */
  if (cxr_call_arg_len(call) >= size) return 0;
  size_t room = room_at(cxr_call_arg_range(call), args);
  /* The transports take an argument by pointer only inside that range: one outside it is
   * an inline copy (CXR_CALL_INLINE), and one shorter than its struct is a truncated
   * message, not a bad pointer. */
  if (room == 0) return CXR_EPROTO;
  return size <= room ? 0 : CXR_EBADPTR;
}
