// ALock across a pod and another rack: two processes of the pod (two namespaces sharing one
// root) take the lock with CPU atomics, two hosts of another rack with UCX atomics over TCP,
// all at once. Every critical section reads a counter, claims an owner word, checks it and
// writes the counter back: a lost update or a foreign owner means mutual exclusion broke.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "tests/netns/fixture.h"

namespace {

// Nodes 0, 1: two hosts of pod 1 (one root); nodes 2, 3: two hosts of another rack (pod 2).
class NetnsAlock : public cxrt::NetnsTest {
 protected:
  NetnsAlock() : NetnsTest(4, "alock", {"/pod", "/rack"}) {}
};

TEST_F(NetnsAlock, MutualExclusionAcrossThePodAndARemoteRack) {
  std::vector<std::string> pod_env = root_env("/pod", "1");
  std::vector<std::string> rack_env = root_env("/rack", "2");
  // Under TSan: UCX's software emulation of the NIC writes the words ALock shares between
  // CPU and NIC with plain 8-byte writes by design; see alock_tsan.supp.
  if (const char *ts = getenv("TSAN_OPTIONS")) {
    // history_size=7 (the most): keep the progress thread's stacks restorable, so the
    // libucp rule can match.
    std::string o = std::string("TSAN_OPTIONS=") + ts +
                    ":history_size=7:suppressions=tests/netns/alock_tsan.supp";
    pod_env.push_back(o);
    rack_env.push_back(o);
  }
  const long L = 3000, R = 150;
  std::string listen = std::string(net.ip[0]) + ":7500";
  const char *bin = "tests/netns/alock_peer";
  cxrt::Proc host, local, r0, r1;
  ASSERT_TRUE(host.start({bin, "host", listen, std::to_string(L), "0"}, pod_env, net.ns[0]));
  ASSERT_EQ(host.line(15000), "READY");
  ASSERT_TRUE(local.start({bin, "local", std::to_string(L), "1"}, pod_env, net.ns[1]));
  ASSERT_TRUE(r0.start({bin, "remote", listen, std::to_string(R), "0"}, rack_env, net.ns[2]));
  ASSERT_TRUE(r1.start({bin, "remote", listen, std::to_string(R), "1"}, rack_env, net.ns[3]));
  for (cxrt::Proc *p : {&local, &r0, &r1}) ASSERT_EQ(p->line(15000), "READY");
  for (cxrt::Proc *p : {&host, &local, &r0, &r1}) p->say("go");
  for (cxrt::Proc *p : {&host, &local, &r0, &r1}) EXPECT_EQ(p->line(60000), "done 0 0");
  host.say("check");
  EXPECT_EQ(host.line(15000), "count " + std::to_string(2 * L + 2 * R));
  for (cxrt::Proc *p : {&local, &r0, &r1, &host}) {
    p->say("quit");
    EXPECT_EQ(p->stop(), 0);
  }
}

}  // namespace
