// The umbrella header compiles on its own, in C++, and exposes every layer.
#include <gtest/gtest.h>

#include <cxrpc/cxrpc.h>

TEST(Umbrella, ExposesEveryLayer) {
  EXPECT_STREQ(cxr_strerror(CXR_EPEERDEAD), "peer died");
  cxr_heap_opts ho;
  cxr_heap_opts_init(&ho);
  cxr_channel_opts co;
  cxr_channel_opts_init(&co);
  EXPECT_GT(co.ring_slots, 0u);
  EXPECT_NE(cxr_method_id("greet.Greeter/Say"), 0u);
}
