// The fixture every multi-host suite starts from, so the set-up is written once: skip where
// namespaces cannot be made, n nodes on the switch of netns.h, a scratch folder of the test's
// own holding one CXRPC_ROOT per pod or rack, and the namespaces deleted after the test
// whatever happened in it.
#ifndef CXRPC_TESTS_NETNS_FIXTURE_H
#define CXRPC_TESTS_NETNS_FIXTURE_H

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tests/netns/netns.h"
#include "tests/rdma/proc.h"

namespace cxrt {

class NetnsTest : public ::testing::Test {
 protected:
  // nodes: how many namespaces; tag: their names' tag (nullptr: the test's name); roots:
  // folders made under tmp, e.g. {"/pod", "/rack"}, each the CXRPC_ROOT of one pod or rack.
  NetnsTest(int nodes, const char *tag, std::vector<std::string> roots = {})
      : nodes_(nodes), tag_(tag), roots_(std::move(roots)) {}

  cxrt_net net = {};  // zeroed: TearDown runs even when SetUp skipped
  std::string tmp;    // $TEST_TMPDIR/<test name>, when there are roots

  void SetUp() override {
    if (!cxrt_net_available()) GTEST_SKIP() << "needs root and no sandbox for network namespaces";
    const char *name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (!roots_.empty()) {
      const char *t = getenv("TEST_TMPDIR");
      tmp = std::string(t ? t : "/tmp") + "/" + name;
      mkdir(tmp.c_str(), 0700);
      for (const std::string &d : roots_) mkdir((tmp + d).c_str(), 0700);
    }
    ASSERT_EQ(cxrt_net_up(&net, tag_ ? tag_ : name, nodes_), 0);
  }
  void TearDown() override { cxrt_net_down(&net); }

  // The environment of a peer in pod `pod` whose CXRPC_ROOT is the folder tmp + root.
  std::vector<std::string> root_env(const std::string &root, const char *pod) const {
    return {"CXRPC_ROOT=" + tmp + root, std::string("CXRPC_POD=") + pod};
  }

  // A command to a peer and its answer line ("" when none came within ms).
  static std::string ask(Proc &c, const std::string &cmd, int ms = 30000) { return c.ask(cmd, ms); }

 private:
  int nodes_;
  const char *tag_;
  std::vector<std::string> roots_;
};

// A peer's answer to a call that must fail: "err <code> <ms>" with code one of `codes`, in
// less than max_ms. An AssertionResult, so a failure names the caller's line and the answer.
inline ::testing::AssertionResult fails_with(const std::string &answer,
                                             std::initializer_list<int> codes, int max_ms) {
  int code = 0, ms = 0;
  if (sscanf(answer.c_str(), "err %d %d", &code, &ms) != 2)
    return ::testing::AssertionFailure() << "answer \"" << answer
                                         << "\" is not \"err <code> <ms>\"";
  bool known = false;
  for (int c : codes) known = known || c == code;
  if (!known) return ::testing::AssertionFailure() << "unexpected code in \"" << answer << "\"";
  if (ms >= max_ms)
    return ::testing::AssertionFailure() << "took " << ms << " ms (bound " << max_ms << "): \""
                                         << answer << "\"";
  return ::testing::AssertionSuccess();
}

}  // namespace cxrt

#endif
