// examples/docstore's bounded count of a tree read where it lies (a client's request): a
// graph whose shared subtrees make it a tree of 2^50 values is refused within the bounds,
// where the unbounded count walked every path (the server's Count, before 2026-11-23: a
// client that swapped the root after validation kept a worker busy for good).
#include <gtest/gtest.h>

#include <string>

#include "examples/docstore/json.h"
#include "tests/root.h"

namespace {

TEST(DocstoreCount, SharedSubtreesAreCountedWithinTheBounds) {
  cxrt::setup_root("docstore-count");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, "docstore-count", 1 << 20, nullptr), 0);
  // 50 levels, each an object whose two members both hold the next level.
  docstore_Value *next = docstore_Value_new(h);
  ASSERT_NE(next, nullptr);
  for (int level = 0; level < 50; level++) {
    docstore_Value *v = docstore_Value_new(h);
    docstore_Object *o = docstore_Object_new(h);
    ASSERT_TRUE(v && o);
    ASSERT_TRUE(CXR_VEC_ALLOC(h, o->members, 2));
    for (int k = 0; k < 2; k++) o->members.items[k].value = next;
    v->kind_case = 5;
    v->kind.object = o;
    next = v;
  }
  uint64_t n = 0;
  EXPECT_FALSE(json_count_within(next, 1u << 20, 64, &n));
  EXPECT_LE(n, (uint64_t)1 << 20);
  // A tree within the bounds counts as the unbounded count does; depth is bounded too.
  char err[64];
  docstore_Value *t = json_parse(h, "{\"a\": [1, 2, {\"b\": \"c\"}], \"d\": null}", err,
                                 sizeof err);
  ASSERT_NE(t, nullptr) << err;
  n = 0;
  EXPECT_TRUE(json_count_within(t, 1u << 20, 64, &n));
  EXPECT_EQ(n, json_count(t));
  n = 0;
  EXPECT_FALSE(json_count_within(t, 1u << 20, 1, &n));
  cxr_heap_close(h);
  cxr_heap_unlink("docstore-count");
}

}  // namespace
