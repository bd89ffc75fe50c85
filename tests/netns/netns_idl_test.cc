// Generated stubs and skeletons across racks: a tree.Tree server in one rack (its own
// namespace, root and pod), clients in another rack over UCX on TCP and in the server's pod
// over shared memory. Each client sends 60 random pointer-rich trees (names, blobs of up to
// 3000 bytes, repeated messages, strings, maps), half sync, half async; the server (an
// untrusted channel: the skeleton validates each request graph in its replica) answers
// with a deep copy built in its heap, which the stub validates inside
// cxr_conn_result_range and the client compares and gives back with _release.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/netns/fixture.h"

namespace {

const char *kPeer = "tests/netns/idl_peer";

// Node 0: the server's rack (pod 1) and a client in its pod; node 1: another rack (pod 2).
class NetnsIdl : public cxrt::NetnsTest {
 protected:
  NetnsIdl() : NetnsTest(2, "idl", {"/pod", "/rack"}) {}
};

TEST_F(NetnsIdl, GeneratedStubsCallAcrossRacksAndInThePod) {
  cxrt::Proc s, remote, pod;
  std::string listen = std::string("ucx://") + net.ip[0] + ":7410";
  ASSERT_TRUE(s.start({kPeer, "server", "tree", listen}, root_env("/pod", "1"), net.ns[0]));
  ASSERT_EQ(s.line(15000), "READY");
  ASSERT_TRUE(
      remote.start({kPeer, "client", listen + "/tree", "60"}, root_env("/rack", "2"), net.ns[1]));
  ASSERT_TRUE(pod.start({kPeer, "client", "tree", "60"}, root_env("/pod", "1"), net.ns[0]));
  EXPECT_EQ(remote.line(15000), "READY");
  EXPECT_EQ(pod.line(15000), "READY");
  EXPECT_EQ(remote.line(60000), "ok remote");
  EXPECT_EQ(pod.line(60000), "ok pod");
  // Clean exits (under the sanitizers a report would change the exit code).
  EXPECT_EQ(remote.stop(10000), 0);
  EXPECT_EQ(pod.stop(10000), 0);
  EXPECT_EQ(s.stop(10000), 0);
}

}  // namespace
