// cxrt::Proc on its own: a child gets this process's environment with the entries it was
// given in place of their keys' own, and between fork and exec it calls nothing but
// async-signal-safe functions. Its putenv there hung if another of the parent's threads held
// glibc's environment lock at the fork (rdma and netns suites fork beside engines' threads).
#include <gtest/gtest.h>

#include <string>

#include "tests/rdma/env_writes.h"
#include "tests/rdma/proc.h"

namespace {

// The child's view of three variables: one given, one of ours replaced, one removed.
const char kShow[] =
    "echo \"$CXRT_GIVEN|$TEST_TMPDIR|${TEST_WORKSPACE-unset}|$(env | grep -c ^TEST_TMPDIR=)\"";

TEST(Proc, TheChildGetsItsEntriesAndWritesNoEnvironmentBeforeExec) {
  ASSERT_NE(getenv("TEST_TMPDIR"), nullptr);  // bazel sets both
  ASSERT_NE(getenv("TEST_WORKSPACE"), nullptr);
  cxrt::Proc p;
  // The env_writes.h interposer ends a forked child that writes its environment with 97.
  ASSERT_TRUE(
      p.start({"/bin/sh", "-c", kShow}, {"CXRT_GIVEN=1", "TEST_TMPDIR=/x", "TEST_WORKSPACE"}));
  EXPECT_EQ(p.line(10000), "1|/x|unset|1");
  EXPECT_EQ(p.stop(10000), 0) << cxrt::kEnvWriteInForkChild << ": it wrote its environment";
}

TEST(Proc, TheLastEntryOfAKeyWins) {
  cxrt::Proc p;
  ASSERT_TRUE(p.start({"/bin/sh", "-c", "echo \"$CXRT_GIVEN\""}, {"CXRT_GIVEN=1", "CXRT_GIVEN=2"}));
  EXPECT_EQ(p.line(10000), "2");
  EXPECT_EQ(p.stop(10000), 0);
}

TEST(Proc, AMissingBinaryEndsTheChildWith127) {
  cxrt::Proc p;
  ASSERT_TRUE(p.start({"/nonexistent/cxrt-proc-test"}));
  EXPECT_EQ(p.line(10000), "");
  EXPECT_EQ(p.stop(10000), 127);
}

}  // namespace
