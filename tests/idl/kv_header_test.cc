// A C++ file that includes a generated header whose protoc-c header C++ cannot parse (kv.proto
// has rpc Delete: protoc-c's kv.pb-c.h has a member named delete). The .cxr.h declares the
// protoc-c types it names and leaves the .pb-c.h to the .cxr.c, so this compiles.
#include <gtest/gtest.h>

#include "examples/kvstore/kv.cxr.h"

namespace {

TEST(KvHeader, CompilesInCxxAndNamesTheProtocCTypes) {
  kv_KV_handlers h = {};
  EXPECT_EQ(h.Delete, nullptr);
  Kv__GetRequest *pb = nullptr;  // declared by kv.cxr.h, defined only in kv.pb-c.h
  kv_GetRequest_pb_free(pb);     // NULL: nothing to free
  EXPECT_EQ(kv_KV_Delete_ID, cxr_method_id("kv.KV/Delete"));
}

}  // namespace
