#include <gtest/gtest.h>
#include <errno.h>
#include <string.h>

#include <cxrpc/base.h>
#include "shm/log.h"

TEST(Base, EveryCodeHasItsOwnMessage) {
  for (int e = CXR_ERRNO_MIN; e <= 0; e++) {
    const char *m = cxr_strerror(e);
    ASSERT_NE(m, nullptr);
    EXPECT_STRNE(m, "unknown error") << e;
    for (int f = CXR_ERRNO_MIN; f < e; f++) EXPECT_STRNE(m, cxr_strerror(f)) << e << " " << f;
  }
  EXPECT_STREQ(cxr_strerror(1), "unknown error");
  EXPECT_STREQ(cxr_strerror(CXR_ERRNO_MIN - 1), "unknown error");
}

TEST(Base, LastErrorIsPerThreadAndSetByFailNull) {
  EXPECT_EQ(cxr__fail_null(CXR_ENOMEM), nullptr);
  EXPECT_EQ(cxr_last_error(), CXR_ENOMEM);
  EXPECT_EQ(cxr__from_errno(EEXIST), CXR_EEXIST);
  EXPECT_EQ(cxr__from_errno(ESRCH), CXR_EPEERDEAD);
}

TEST(Base, ClockIsMonotonic) {
  int64_t a = cxr_now_ns(), b = cxr_now_ns();
  EXPECT_GT(a, 0);
  EXPECT_GE(b, a);
}
