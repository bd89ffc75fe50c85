// examples/docstore's bounded count of a tree read where it lies (a client's request): a
// graph whose shared subtrees make it a tree of 2^50 values is refused within the bounds,
// where the unbounded count walked every path (the server's Count, before 2026-11-23: a
// client that swapped the root after validation kept a worker busy for good).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "examples/docstore/json.h"
#include "tests/root.h"

namespace {

// levels objects deep, each an object whose two members both hold the next level (2^levels
// paths through levels * 3 + 1 blocks), or nullptr.
docstore_Value *shared_levels(cxr_heap *h, int levels) {
  docstore_Value *next = docstore_Value_new(h);
  for (int level = 0; next && level < levels; level++) {
    docstore_Value *v = docstore_Value_new(h);
    docstore_Object *o = docstore_Object_new(h);
    if (!v || !o || !CXR_VEC_ALLOC(h, o->members, 2)) return nullptr;
    for (int k = 0; k < 2; k++) o->members.items[k].value = next;
    v->kind_case = 5;
    v->kind.object = o;
    next = v;
  }
  return next;
}

TEST(DocstoreCount, SharedSubtreesAreCountedWithinTheBounds) {
  cxrt::setup_root("docstore-count");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, "docstore-count", 1 << 20, nullptr), 0);
  docstore_Value *next = shared_levels(h, 50);
  ASSERT_NE(next, nullptr);
  cxr_range r = {cxr_heap_base(h), cxr_heap_size(h)};
  uint64_t n = 0;
  EXPECT_EQ(json_count_within(next, &r, 1u << 20, 64, &n), CXR_EINVAL);
  EXPECT_LE(n, (uint64_t)1 << 20);
  // A tree within the bounds counts as the unbounded count does; depth is bounded too.
  char err[64];
  docstore_Value *t = json_parse(h, "{\"a\": [1, 2, {\"b\": \"c\"}], \"d\": null}", err,
                                 sizeof err);
  ASSERT_NE(t, nullptr) << err;
  n = 0;
  EXPECT_EQ(json_count_within(t, &r, 1u << 20, 64, &n), 0);
  EXPECT_EQ(n, json_count(t));
  n = 0;
  EXPECT_EQ(json_count_within(t, &r, 1u << 20, 1, &n), CXR_EINVAL);
  cxr_heap_close(h);
  cxr_heap_unlink("docstore-count");
}

// Members with no value cost no count but cost a look each: an object of 2000 such members
// shared by 1000 references is 2 million looks for 1001 values. The bound on values alone
// let it through (the same graph at a million by a million kept a worker for an hour: a
// review, 2026-11-28); looks now count against the bound too.
TEST(DocstoreCount, MembersWithoutValuesCountAgainstTheBound) {
  cxrt::setup_root("docstore-count-null");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, "docstore-count-null", 1 << 20, nullptr), 0);
  docstore_Value *empty = docstore_Value_new(h), *root = docstore_Value_new(h);
  docstore_Object *eo = docstore_Object_new(h), *ro = docstore_Object_new(h);
  ASSERT_TRUE(empty && root && eo && ro);
  ASSERT_TRUE(CXR_VEC_ALLOC(h, eo->members, 2000));  // (values NULL)
  ASSERT_TRUE(CXR_VEC_ALLOC(h, ro->members, 1000));
  for (int k = 0; k < 1000; k++) ro->members.items[k].value = empty;
  empty->kind_case = 5;
  empty->kind.object = eo;
  root->kind_case = 5;
  root->kind.object = ro;
  cxr_range r = {cxr_heap_base(h), cxr_heap_size(h)};
  uint64_t n = 0;
  EXPECT_EQ(json_count_within(root, &r, 1u << 20, 64, &n), CXR_EINVAL);
  n = 0;  // within a larger bound it counts what json_count does
  EXPECT_EQ(json_count_within(root, &r, 1u << 22, 64, &n), 0);
  EXPECT_EQ(n, json_count(root));
  cxr_heap_close(h);
  cxr_heap_unlink("docstore-count-null");
}

// A pointer the client swapped after validation to memory outside the call's argument range
// (here: this process's own memory, as the server's store heap would be): the count refuses
// it before reading there, where it followed it (and counted what it found) before.
TEST(DocstoreCount, PointersOutsideTheRangeAreRefused) {
  cxrt::setup_root("docstore-count-range");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, "docstore-count-range", 1 << 20, nullptr), 0);
  cxr_range r = {cxr_heap_base(h), cxr_heap_size(h)};
  char err[64];
  docstore_Value *t = json_parse(h, "{\"a\": [1, 2], \"b\": {\"c\": \"d\"}}", err, sizeof err);
  ASSERT_NE(t, nullptr) << err;
  uint64_t n = 0;
  ASSERT_EQ(json_count_within(t, &r, 1u << 20, 64, &n), 0);
  ASSERT_EQ(n, 6u);
  // Private memory: a value, an object, an array and an array's items, each reached in turn.
  static docstore_Value outside_value[2];
  static docstore_Object outside_object;
  static docstore_Array outside_array;
  outside_value[0].kind_case = 3;
  docstore_Member *m = t->kind.object->members.items;  // "a", then "b"
  docstore_Value *a = m[0].value, *b = m[1].value;
  struct Case {
    const char *what;
    std::function<void()> swap, restore;
  };
  docstore_Array *keep_array = a->kind.array;
  docstore_Object *keep_object = b->kind.object;
  docstore_Value *keep_items = keep_array->items.items;
  Case cases[] = {
      {"a member's value", [&] { m[1].value = &outside_value[0]; }, [&] { m[1].value = b; }},
      {"an object", [&] { b->kind.object = &outside_object; },
       [&] { b->kind.object = keep_object; }},
      {"an array", [&] { a->kind.array = &outside_array; }, [&] { a->kind.array = keep_array; }},
      {"an array's items", [&] { keep_array->items.items = outside_value; },
       [&] { keep_array->items.items = keep_items; }},
  };
  for (const Case &c : cases) {
    c.swap();
    n = 0;
    EXPECT_EQ(json_count_within(t, &r, 1u << 20, 64, &n), CXR_EBADPTR) << c.what;
    c.restore();
  }
  // Items that start inside the range but whose count runs past its end.
  keep_array->items.items = (docstore_Value *)((char *)r.p + r.len) - 1;
  n = 0;
  EXPECT_EQ(json_count_within(t, &r, 1u << 20, 64, &n), CXR_EBADPTR);
  keep_array->items.items = keep_items;
  n = 0;
  EXPECT_EQ(json_count_within(t, &r, 1u << 20, 64, &n), 0);
  EXPECT_EQ(n, 6u);
  cxr_heap_close(h);
  cxr_heap_unlink("docstore-count-range");
}

// A _free of a graph a peer can still write (a handler's result left in the client's heap when
// the handler fails, a half-built copy there) followed every pointer it found: rewritten
// into a cycle it recursed until the stack ran out, into shared subtrees it walked 2^50
// paths (a review, 2026-11-28). Now the walk enters only allocated blocks of the heap, each
// once (a block met again is freed already or an ancestor), and frees each graph whole.
TEST(DocstoreFree, AGraphRewrittenIntoACycleOrSharedSubtreesIsFreedWithinBounds) {
  cxrt::setup_root("docstore-free");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, "docstore-free", 1 << 20, nullptr), 0);
  cxr_heap_stats before, after;
  ASSERT_EQ(cxr_heap_get_stats(h, &before), 0);
  int64_t t0 = cxr_now_ns();
  // A cycle: an object whose member holds the object's own value.
  docstore_Value *v = docstore_Value_new(h);
  docstore_Object *o = docstore_Object_new(h);
  ASSERT_TRUE(v && o);
  ASSERT_TRUE(CXR_VEC_ALLOC(h, o->members, 1));
  o->members.items[0].value = v;
  v->kind_case = 5;
  v->kind.object = o;
  uint64_t e0 = cxr__free_entered();
  docstore_Value_free(h, v);
  EXPECT_EQ(cxr__free_entered() - e0, 3u) << "each of its 3 blocks once";
  docstore_Value *next = shared_levels(h, 30);  // 2^30 paths
  ASSERT_NE(next, nullptr);
  e0 = cxr__free_entered();
  docstore_Value_free(h, next);
  EXPECT_EQ(cxr__free_entered() - e0, 30u * 3 + 1) << "each of its blocks once";
  // A pointer to memory outside the heap is left alone.
  static docstore_Object outside;
  docstore_Value *x = docstore_Value_new(h);
  ASSERT_NE(x, nullptr);
  x->kind_case = 5;
  x->kind.object = &outside;
  docstore_Value_free(h, x);
  printf("three rewritten graphs freed in %lld ms\n", (long long)((cxr_now_ns() - t0) / 1000000));
  // Each graph was freed whole, and the heap still works.
  ASSERT_EQ(cxr_heap_get_stats(h, &after), 0);
  EXPECT_EQ(after.used, before.used);
  void *p = cxr_heap_alloc(h, 64);
  EXPECT_NE(p, nullptr);
  cxr_heap_free(h, p);
  cxr_heap_close(h);
  cxr_heap_unlink("docstore-free");
}

// A graph of shared subtrees costs its _free one entry per distinct block, whatever the
// heap's size: when the bound was the heap's size in bytes (efa1204, reverted), the walk
// entered the same blocks again and again until it had entered a heap's worth (about 2^32
// entries in a 64 GiB heap); under 2^24 blocks and items, 2^24 entries in any heap.
TEST(DocstoreFree, SharedSubtreesCostOneEntryPerBlockInAnyHeap) {
  for (size_t size : {size_t(1) << 20, size_t(64) << 20}) {
    std::string name = "docstore-free-size-" + std::to_string(size);
    cxrt::setup_root(name.c_str());
    cxr_heap *h = nullptr;
    ASSERT_EQ(cxr_heap_create(&h, name.c_str(), size, nullptr), 0);
    docstore_Value *next = shared_levels(h, 40);  // 2^40 paths
    ASSERT_NE(next, nullptr);
    uint64_t e0 = cxr__free_entered();
    docstore_Value_free(h, next);
    EXPECT_EQ(cxr__free_entered() - e0, 40u * 3 + 1) << size << "-byte heap";
    cxr_heap_close(h);
    cxr_heap_unlink(name.c_str());
  }
}

}  // namespace
