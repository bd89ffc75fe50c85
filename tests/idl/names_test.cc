// Generated code for a .proto whose names meet C's (tests/idl/names.proto): it compiles, and
// the members carry the documented escapes.
#include <gtest/gtest.h>
#include <stdio.h>  // EOF, BUFSIZ: before the generated header on purpose

#include "tests/idl/names.cxr.h"

namespace {

TEST(Names, UpperCaseMembersGetAnUnderscore) {
  cxrtest_names_Macros m = {};
  m.SIZE_MAX_ = 1;
  m.INT32_MAX_ = 2;
  m.EOF_ = 3;
  m.NULL__case = 5;
  m.NULL_.UINT8_MAX_ = 4;
  EXPECT_EQ(m.BUFSIZ_.count, 0u);
  EXPECT_EQ(m.SIZE_MAX_ + m.INT32_MAX_ + m.EOF_ + m.NULL_.UINT8_MAX_, 10);
  cxrtest_names_Shout_handlers h = {};
  EXPECT_EQ(h.GET_, nullptr);
}

}  // namespace
