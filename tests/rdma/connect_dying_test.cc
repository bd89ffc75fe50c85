// Endpoints made to a host whose process dies while they connect. UCX 1.13's TCP transport
// connects with a blocking connect(2) and sends its connection request inside ucp_ep_create;
// when the peer resets that fresh connection between the two and refuses the reconnect, UCX
// marks the half-made endpoint failed (scheduling its destruction) and then gives it its send
// side anyway: the next worker progress aborted the process ("tcp_ep.c:478 Assertion `!(ep->
// flags & UCT_TCP_EP_FLAG_CTX_TYPE_TX)' failed", uct_tcp_ep_destroy_progress; CI, ep_share_test,
// where the engine's pool refill connected to a peer being killed). Here one thread makes
// endpoints from the host's worker address (warm connects, no pool) as fast as it can while
// the stopped peer is killed under it, round after round: the process must live.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include <cxrpc/rdma.h>
#include "tests/rdma/peer.h"

namespace {

const int64_t kMs = 1000000, kSec = 1000 * kMs;

TEST(RdmaConnectDying, EndpointsMadeWhileTheirPeerDiesDoNotAbortTheProcess) {
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  o.pool = 0;  // every warm connect makes a new endpoint from the worker address
  cxr_rdma *r;
  ASSERT_EQ(cxr_rdma_open(&r, &o), 0);
  const int kRounds = 40;
  for (int round = 0; round < kRounds; round++) {
    cxrt::Peer peer;
    ASSERT_TRUE(peer.start());
    cxr_rdma_ep *first;
    ASSERT_EQ(cxr_rdma_connect(r, peer.addr().c_str(), cxr_now_ns() + 10 * kSec, &first), 0);
    ASSERT_NO_FATAL_FAILURE(cxrt::stop(peer));
    std::atomic<bool> go{true};
    std::vector<cxr_rdma_ep *> eps;
    std::thread maker([&] {
      // A stopped peer's kernel still completes the handshake: each endpoint connects.
      for (int64_t end = cxr_now_ns() + 2 * kSec; go && cxr_now_ns() < end && eps.size() < 400;) {
        cxr_rdma_ep *ep;
        if (cxr_rdma_connect(r, peer.addr().c_str(), cxr_now_ns() + 50 * kMs, &ep) == 0)
          eps.push_back(ep);
      }
    });
    usleep(500 + (round * 977) % 4000);  // kill at a different point of a connect each round
    peer.p.kill9();
    usleep(20000);
    go = false;
    maker.join();
    for (cxr_rdma_ep *ep : eps) cxr_rdma_ep_close(ep);
    cxr_rdma_ep_close(first);
  }
  cxr_rdma_close(r);
}

}  // namespace
