// A white-box look at a connection's request ring, for suites that need to know the
// server has taken a call (they depend on //rpc:internal; util.h's users need not).
#ifndef CXRPC_TESTS_RPC_RINGS_H
#define CXRPC_TESTS_RPC_RINGS_H

#include <stdint.h>

#include "rpc/internal.h"

namespace rpctest {

// How many requests the server has taken off c's request ring (the ring's head), or
// UINT64_MAX if c has no rings: read before a call, then wait for it to move, and a worker
// is inside that call's handler (instead of sleeping and hoping it is).
inline uint64_t requests_taken(cxr_conn *c) {
  cxr__rview req, resp;
  if (cxr__conn_rings(c, &req, &resp) != 0) return UINT64_MAX;
  return __atomic_load_n(&req.r->head, __ATOMIC_ACQUIRE);
}

}  // namespace rpctest

#endif
