// The rdma engine between network namespaces (another rack: UCX over TCP on a veth, no
// shared memory), every actor a real process: echo and atomics, a link taken down
// (deadlines, then the same endpoint recovers), a peer killed with SIGKILL
// (CXR_EPEERDEAD), and hosts that do not exist.
#include <gtest/gtest.h>

#include <string>

#include "tests/netns/fixture.h"

namespace {

using cxrt::fails_with;

// Node 0: the client; node 1: the peer it connects to.
class NetnsRdma : public cxrt::NetnsTest {
 protected:
  NetnsRdma() : NetnsTest(2, nullptr) {}
  bool client(cxrt::Proc &c) {
    return c.start({"tests/rdma/rdma_peer", "client"}, {}, net.ns[0]) && c.line(10000) == "READY";
  }
};

TEST_F(NetnsRdma, EchoAtomicsLinkDownAndRecoveryThenPeerKilled) {
  cxrt::Proc peer, c;
  std::string host = std::string(net.ip[1]) + ":7400";
  ASSERT_TRUE(peer.start({"tests/rdma/rdma_peer", "serve", host}, {}, net.ns[1]));
  std::string ready = peer.line(10000);
  ASSERT_EQ(ready.rfind("READY 7400", 0), 0u) << ready;
  ASSERT_TRUE(client(c));
  ASSERT_EQ(ask(c, "connect " + host + " 5000"), "ok");
  ASSERT_EQ(ask(c, "ping 5000"), "ok");
  // The first word of "mem" holds bytes 00 01 .. 07 (little-endian 0x0706050403020100).
  EXPECT_EQ(ask(c, "fadd"), "ok 506097522914230528");
  EXPECT_EQ(ask(c, "fadd"), "ok 506097522914230529");

  // Link down: nothing comes back within a deadline, but the endpoint is not declared dead.
  ASSERT_EQ(cxrt_net_link(&net, 1, false), 0);
  EXPECT_EQ(ask(c, "ping 500"), "timeout");
  EXPECT_EQ(ask(c, "ping 500"), "timeout");
  ASSERT_EQ(cxrt_net_link(&net, 1, true), 0);
  // Link up: the same endpoint carries messages again (TCP retransmits), within a bound.
  bool back = false;
  for (int i = 0; i < 30 && !back; i++) back = ask(c, "ping 500") == "ok";
  EXPECT_TRUE(back);

  // The peer is killed: the endpoint ends with CXR_EPEERDEAD (-13) within a bound.
  peer.kill9();
  EXPECT_EQ(ask(c, "watch 10000"), "status -13");
  EXPECT_EQ(c.stop(), 0);
}

TEST_F(NetnsRdma, HostsThatDoNotExistFailWithinTheDeadline) {
  cxrt::Proc c;
  ASSERT_TRUE(client(c));
  // Nobody has 10.77.0.99: ARP goes unanswered. -12 timed out, -26 not connected.
  EXPECT_TRUE(fails_with(ask(c, "connect 10.77.0.99:7400 1000"), {-12, -26}, 3000));
  // A node that exists but has no listener on that port: refused.
  EXPECT_TRUE(
      fails_with(ask(c, std::string("connect ") + net.ip[1] + ":7401 1000"), {-12, -26}, 3000));
  EXPECT_EQ(c.stop(), 0);
}

}  // namespace
