// The enforced set-up several suites start from: a real cxrpcd, the agent (the sender)
// under `cxrpcd run` on a named heap file, and the receiver's table registered for it.
#ifndef CXRPC_TESTS_SANDBOX_ENFORCED_H
#define CXRPC_TESTS_SANDBOX_ENFORCED_H

#include <gtest/gtest.h>

#include "tests/sandbox/harness.h"

namespace sbx {

class EnforcedTest : public ::testing::Test {
 protected:
  Supervisor sup;
  Heap heap;
  cxr_seal_table *t = nullptr;
  Agent ag;
  void SetUp() override {
    ASSERT_TRUE(start_supervisor(&sup));
    ASSERT_TRUE(make_heap(&heap, 64 * 4096, false));
    ASSERT_EQ(cxr_seal_table_create(&t, nullptr), 0);
    ASSERT_TRUE(spawn_agent(&ag, heap, t, 1, &sup));
    ASSERT_EQ(agent_do(&ag, AG_FLUSH).rc, 0);
    ASSERT_EQ(cxr_seal_table_set_peer(t, ag.pid, heap.p(), heap.size), 0);
    ASSERT_EQ(cxr_seal_table_enforce(t, sup.sock.c_str()), 0);
  }
  void TearDown() override {
    if (ag.pid > 0) stop_agent(&ag);
    cxr_seal_table_close(t);
    drop_heap(&heap);
    stop_supervisor(&sup);
  }
  // Seals a page, has the receiver check it, and tries to make it writable: the raise's
  // result (-EPERM while the table's registration holds), the seal then done and released.
  int raise_over_active_seal(int page) {
    unsigned char *p = heap.p() + (size_t)page * 4096;
    agent_msg m = agent_do(&ag, AG_SEAL, (uintptr_t)p, 4096);
    if (m.rc != 0 || cxr_seal_table_check(t, m.r, p, 4096) != 0) return -9999;
    int rc = agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc;
    cxr_seal_table_done(t, m.r);
    agent_do(&ag, AG_RELEASE, m.r);
    return rc;
  }
};

}  // namespace sbx
#endif
