// Generated message code over real heaps: random messages survive shared memory ->
// protobuf-c -> wire bytes -> protobuf-c -> shared memory; the validator accepts every
// built message and refuses each class of malformed graph; copy, free, equal, ranges.
#include <gtest/gtest.h>

#include "tests/root.h"
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <link.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/idl/everything.cxr.h"
#include "tests/idl/everything.pb-c.h"  /* pack, unpack */
#include "shm/log.h"                      /* cxr__set_error */

namespace {

std::string g_root = [] {
  std::string r = cxrt::setup_root("idl-msg");
  return r;
}();

typedef cxrtest_Everything Ev;
typedef cxrtest_open_Tree Tree;

class Msg : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cxr_init(nullptr), 0);
    static int n;
    name = "idlmsg-" + std::to_string(getpid()) + "-" + std::to_string(++n);
    ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 32u << 20, nullptr), 0);
    name2 = name + "b";
    ASSERT_EQ(cxr_heap_create(&h2, name2.c_str(), 32u << 20, nullptr), 0);
    cxr_limits_init(&lim);
  }
  void TearDown() override {
    cxr_heap_close(h);
    cxr_heap_close(h2);
    cxr_heap_unlink(name.c_str());
    cxr_heap_unlink(name2.c_str());
  }
  cxr_range range(cxr_heap *x) { return cxr_range{cxr_heap_base(x), cxr_heap_size(x)}; }
  size_t used(cxr_heap *x) {
    cxr_heap_stats st;
    EXPECT_EQ(cxr_heap_stats(x, &st), 0);
    return st.used;
  }
  int validate(const Ev *m) {
    cxr_range r = range(h);
    return cxrtest_Everything_validate(m, &r, &lim);
  }

  // ---- random messages ----
  std::string rstr(std::mt19937_64 &rng, size_t max = 24) {
    std::string s;
    size_t n = rng() % (max + 1);
    for (size_t i = 0; i < n; i++) s += (char)('a' + rng() % 26);
    return s;
  }
  void set_str(cxr_str *s, const std::string &v) {
    ASSERT_EQ(cxr_str_set(h, s, v.data(), v.size()), 0);
  }
  cxrtest_Leaf *leaf(std::mt19937_64 &rng) {
    cxrtest_Leaf *l = cxrtest_Leaf_new(h);
    EXPECT_NE(l, nullptr);
    if (rng() % 2) l->has_id = true, l->id = (int32_t)rng();
    if (rng() % 2) {
      l->has_label = true;
      set_str(&l->label, rstr(rng));
    }
    return l;
  }
  void fill_leaf(std::mt19937_64 &rng, cxrtest_Leaf *l) {
    cxrtest_Leaf *t = leaf(rng);
    *l = *t;
    cxr_heap_free(h, t);  // only the struct: its string now belongs to *l
  }
  Tree *tree(std::mt19937_64 &rng, int depth) {
    Tree *t = cxrtest_open_Tree_new(h);
    set_str(&t->name, rstr(rng, 12));
    t->kind = (int32_t)(rng() % 5) - 1;  // open enum: any value, -1 and 3 included
    if (rng() % 2) {
      std::string d = rstr(rng, 40);
      EXPECT_EQ(cxr_bytes_set(h, &t->data, d.data(), d.size()), 0);
    }
    if (depth < 3) {
      uint64_t n = rng() % 4;
      if (n) {
        EXPECT_NE(CXR_VEC_ALLOC(h, t->children, n), nullptr);
        for (uint64_t i = 0; i < n; i++) {
          Tree *c = tree(rng, depth + 1);
          t->children.items[i] = *c;
          cxr_heap_free(h, c);
        }
      }
      if (rng() % 3 == 0) t->link = tree(rng, depth + 1);
    }
    if (uint64_t n = rng() % 5) {
      CXR_VEC_ALLOC(h, t->sizes, n);
      for (uint64_t i = 0; i < n; i++) t->sizes.items[i] = (int64_t)rng();
    }
    if (uint64_t n = rng() % 3) {
      CXR_VEC_ALLOC(h, t->attrs, n);
      for (uint64_t i = 0; i < n; i++) {
        set_str(&t->attrs.items[i].key, "k" + std::to_string(i));
        set_str(&t->attrs.items[i].value, rstr(rng));
      }
    }
    switch (rng() % 4) {
      case 1:
        t->payload_case = 8;
        set_str(&t->payload.text, rstr(rng));
        break;
      case 2:
        t->payload_case = 9;
        t->payload.number = (double)(int64_t)rng() / 7.0;
        break;
      case 3:
        t->payload_case = 10;
        t->payload.payload_kind = 77;
        break;
    }
    if (uint64_t n = rng() % 3) {
      CXR_VEC_ALLOC(h, t->kinds, n);
      for (uint64_t i = 0; i < n; i++) t->kinds.items[i] = (int32_t)(rng() % 100);
    }
    return t;
  }
  Ev *random_ev(uint64_t seed) {
    std::mt19937_64 rng(seed);
    Ev *m = cxrtest_Everything_new(h);
    EXPECT_NE(m, nullptr);
    m->id = (int64_t)rng();
    set_str(&m->name, rstr(rng));
    m->must = leaf(rng);
    auto maybe = [&]() { return rng() % 2 == 0; };
    if (maybe()) m->has_f_double = true, m->f_double = (double)(int64_t)rng() / 3.0;
    if (maybe()) m->has_f_float = true, m->f_float = (float)(int32_t)rng() / 5.0f;
    if (maybe()) m->has_f_int32 = true, m->f_int32 = (int32_t)rng();
    if (maybe()) m->has_f_int64 = true, m->f_int64 = (int64_t)rng();
    if (maybe()) m->has_f_uint32 = true, m->f_uint32 = (uint32_t)rng();
    if (maybe()) m->has_f_uint64 = true, m->f_uint64 = rng();
    if (maybe()) m->has_f_sint32 = true, m->f_sint32 = (int32_t)rng();
    if (maybe()) m->has_f_sint64 = true, m->f_sint64 = (int64_t)rng();
    if (maybe()) m->has_f_fixed32 = true, m->f_fixed32 = (uint32_t)rng();
    if (maybe()) m->has_f_fixed64 = true, m->f_fixed64 = rng();
    if (maybe()) m->has_f_sfixed32 = true, m->f_sfixed32 = (int32_t)rng();
    if (maybe()) m->has_f_sfixed64 = true, m->f_sfixed64 = (int64_t)rng();
    if (maybe()) m->has_f_bool = true, m->f_bool = rng() % 2;
    if (maybe()) m->has_f_string = true, set_str(&m->f_string, rstr(rng, 100));
    if (maybe()) {
      m->has_f_bytes = true;
      std::string b = rstr(rng, 50);
      b += '\0';  // bytes may hold NUL
      EXPECT_EQ(cxr_bytes_set(h, &m->f_bytes, b.data(), b.size()), 0);
    }
    if (maybe()) m->has_color = true, m->color = 1 + rng() % 3;
    if (maybe()) {
      m->inner = cxrtest_Everything_Inner_new(h);
      cxrtest_Everything_Inner *in = m->inner;
      for (int d = 0; d < (int)(rng() % 4); d++) {
        in->has_mode = true;
        in->mode = rng() % 2;
        if (uint64_t n = rng() % 3) {
          CXR_VEC_ALLOC(h, in->notes, n);
          for (uint64_t i = 0; i < n; i++) set_str(&in->notes.items[i], rstr(rng));
        }
        in->child = cxrtest_Everything_Inner_new(h);
        in = in->child;
      }
    }
    if (maybe()) m->tree = tree(rng, 0);
// Lists of 0 to 4 items; about a third stay zeroed (items NULL), the rest are allocated,
// empty ones included (a block nothing reads, which free must give back).
#define RND_VEC(f, expr)                                   \
  if (uint64_t n = rng() % 5; rng() % 3) {                 \
    EXPECT_NE(CXR_VEC_ALLOC(h, m->f, n), nullptr);         \
    EXPECT_EQ(m->f.count, n);                              \
    for (uint64_t i = 0; i < n; i++) m->f.items[i] = expr; \
  }
    RND_VEC(r_double, (double)(int64_t)rng() / 9.0);
    RND_VEC(r_float, (float)(int32_t)rng() / 3.0f);
    RND_VEC(r_int32, (int32_t)rng());
    RND_VEC(r_int64, (int64_t)rng());
    RND_VEC(r_uint32, (uint32_t)rng());
    RND_VEC(r_uint64, rng());
    RND_VEC(r_sint32, (int32_t)rng());
    RND_VEC(r_sfixed64, (int64_t)rng());
    RND_VEC(r_bool, (bool)(rng() % 2));
    RND_VEC(r_color, (int32_t)(1 + rng() % 3));
    RND_VEC(r_packed, (int32_t)rng());
    if (uint64_t n = rng() % 4) {
      CXR_VEC_ALLOC(h, m->r_string, n);
      for (uint64_t i = 0; i < n; i++) set_str(&m->r_string.items[i], rstr(rng));
    }
    if (uint64_t n = rng() % 4) {
      CXR_VEC_ALLOC(h, m->r_bytes, n);
      for (uint64_t i = 0; i < n; i++) {
        std::string b = rstr(rng);
        cxr_bytes_set(h, &m->r_bytes.items[i], b.data(), b.size());
      }
    }
    if (uint64_t n = rng() % 4) {
      CXR_VEC_ALLOC(h, m->r_leaf, n);
      for (uint64_t i = 0; i < n; i++) fill_leaf(rng, &m->r_leaf.items[i]);
    }
    if (uint64_t n = rng() % 3) {
      CXR_VEC_ALLOC(h, m->by_name, n);
      for (uint64_t i = 0; i < n; i++) {
        set_str(&m->by_name.items[i].key, "n" + std::to_string(i));
        if (rng() % 2) m->by_name.items[i].value = leaf(rng);
      }
    }
    if (uint64_t n = rng() % 3) {
      CXR_VEC_ALLOC(h, m->labels, n);
      for (uint64_t i = 0; i < n; i++) {
        m->labels.items[i].key = (int32_t)i * 7;
        set_str(&m->labels.items[i].value, rstr(rng));
      }
    }
    if (uint64_t n = rng() % 3) {
      CXR_VEC_ALLOC(h, m->modes, n);
      for (uint64_t i = 0; i < n; i++) {
        set_str(&m->modes.items[i].key, rstr(rng, 5));
        m->modes.items[i].value = rng() % 2;
      }
    }
    if (uint64_t n = rng() % 3) {
      CXR_VEC_ALLOC(h, m->blobs, n);
      for (uint64_t i = 0; i < n; i++) {
        m->blobs.items[i].key = rng();
        std::string b = rstr(rng);
        cxr_bytes_set(h, &m->blobs.items[i].value, b.data(), b.size());
      }
    }
    switch (rng() % 7) {
      case 1: m->choice_case = 50, m->choice.c_int = (int32_t)rng(); break;
      case 2: m->choice_case = 51, set_str(&m->choice.c_str, rstr(rng)); break;
      case 3: m->choice_case = 52, m->choice.c_leaf = leaf(rng); break;
      case 4: m->choice_case = 53, m->choice.c_color = 2; break;
      case 5: m->choice_case = 54, m->choice.c_bool = true; break;
      case 6: {
        m->choice_case = 55;
        std::string b = rstr(rng);
        cxr_bytes_set(h, &m->choice.c_bytes, b.data(), b.size());
        break;
      }
    }
    if (maybe()) m->has_class_ = true, m->class_ = 42;
    if (maybe()) m->has_Mixed_Case = true, set_str(&m->Mixed_Case, "MiXeD");
    return m;
  }

  std::string name, name2;
  cxr_heap *h = nullptr, *h2 = nullptr;
  cxr_limits lim;
};

TEST_F(Msg, RandomMessagesSurviveProtobufWireRoundTrip) {
  size_t base = used(h);
  for (uint64_t seed = 1; seed <= 300; seed++) {
    Ev *m = random_ev(seed);
    ASSERT_EQ(validate(m), 0) << "seed " << seed << ": " << cxr_invalid_str(cxr_invalid_reason());
    Cxrtest__Everything *pb = nullptr;
    ASSERT_EQ(cxrtest_Everything_to_pb(m, &pb), 0) << seed;
    size_t n = cxrtest__everything__get_packed_size(pb);
    std::vector<uint8_t> wire(n);
    ASSERT_EQ(cxrtest__everything__pack(pb, wire.data()), n);
    cxrtest_Everything_pb_free(pb);
    Cxrtest__Everything *back = cxrtest__everything__unpack(nullptr, n, wire.data());
    ASSERT_NE(back, nullptr) << seed;
    Ev *m2 = nullptr;
    ASSERT_EQ(cxrtest_Everything_from_pb(h, back, &m2), 0) << seed;
    cxrtest__everything__free_unpacked(back, nullptr);
    EXPECT_TRUE(cxrtest_Everything_equal(m, m2)) << "seed " << seed;
    EXPECT_EQ(validate(m2), 0) << seed;
    // A change is noticed.
    m2->id ^= 1;
    EXPECT_FALSE(cxrtest_Everything_equal(m, m2));
    cxrtest_Everything_free(h, m);
    cxrtest_Everything_free(h, m2);
  }
  EXPECT_EQ(used(h), base) << "free left blocks behind";
}

TEST_F(Msg, CopyBetweenHeapsIsDeepAndEqual) {
  for (uint64_t seed = 1000; seed < 1050; seed++) {
    Ev *m = random_ev(seed);
    Ev *c = nullptr;
    ASSERT_EQ(cxrtest_Everything_copy(h2, m, &c), 0);
    EXPECT_TRUE(cxrtest_Everything_equal(m, c));
    cxr_range r2 = range(h2), r1 = range(h);
    // Every pointer of the copy is in h2, none in h.
    EXPECT_EQ(cxrtest_Everything_validate(c, &r2, &lim), 0);
    EXPECT_EQ(cxrtest_Everything_validate(c, &r1, &lim), CXR_EBADPTR);
    // The ranges of the copy lie in h2 and cover the root.
    cxr_ranges rs;
    cxr_ranges_init(&rs);
    ASSERT_EQ(cxrtest_Everything_ranges(c, &rs), 0);
    ASSERT_GE(rs.count, 2u);
    EXPECT_EQ(rs.items[0].p, c);
    EXPECT_EQ(rs.items[0].len, sizeof *c);
    for (size_t i = 0; i < rs.count; i++)
      EXPECT_TRUE(cxr_heap_contains(h2, rs.items[i].p, rs.items[i].len));
    size_t before = cxr_ranges_bytes(&rs);
    cxr_ranges_merge(&rs);
    EXPECT_LE(cxr_ranges_bytes(&rs), before);
    for (size_t i = 1; i < rs.count; i++)
      EXPECT_GT((uintptr_t)rs.items[i].p, (uintptr_t)rs.items[i - 1].p + rs.items[i - 1].len);
    cxr_ranges_free(&rs);
    cxrtest_Everything_free(h, m);
    cxrtest_Everything_free(h2, c);
  }
}

TEST_F(Msg, RangesAreExact) {
  cxrtest_Leaf *l = cxrtest_Leaf_new(h);
  l->has_label = true;
  cxr_str_setz(h, &l->label, "abc");
  cxr_ranges rs;
  cxr_ranges_init(&rs);
  ASSERT_EQ(cxrtest_Leaf_ranges(l, &rs), 0);
  ASSERT_EQ(rs.count, 2u);
  EXPECT_EQ(rs.items[0].p, l);
  EXPECT_EQ(rs.items[0].len, sizeof *l);
  EXPECT_EQ(rs.items[1].p, l->label.ptr);
  EXPECT_EQ(rs.items[1].len, 3u);
  cxr_ranges_free(&rs);
  cxrtest_Leaf_free(h, l);
}

// ---- the validator refuses each class of malformed graph ----

TEST_F(Msg, ValidatorRefusesPointerOutOfRange) {
  Ev *m = random_ev(7);
  cxrtest_Leaf outside = {};
  cxrtest_Leaf *keep = m->must;
  m->must = &outside;  // private memory of this process
  EXPECT_EQ(validate(m), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_RANGE);
  m->must = keep;
  // A range that ends before the root.
  cxr_range r = {cxr_heap_base(h), (size_t)((char *)m - (char *)cxr_heap_base(h))};
  EXPECT_EQ(cxrtest_Everything_validate(m, &r, &lim), CXR_EBADPTR);
  EXPECT_EQ(validate(m), 0);
}

TEST_F(Msg, ValidatorRefusesLengthPastTheEnd) {
  Ev *m = random_ev(8);
  char *end = (char *)cxr_heap_base(h) + cxr_heap_size(h);
  m->has_f_string = true;
  m->f_string.ptr = end - 10;
  m->f_string.len = 11;
  EXPECT_EQ(validate(m), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_LENGTH);
  m->f_string.len = 10;
  EXPECT_EQ(validate(m), 0);
  // A huge count that would overflow count * size.
  m->r_int64.items = (int64_t *)cxr_heap_base(h);
  m->r_int64.count = UINT64_MAX / 4;
  EXPECT_EQ(validate(m), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_LENGTH);
  m->r_int64.count = 0;
  // Over max_len, though inside the range.
  lim.max_len = 5;
  EXPECT_EQ(validate(m), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_LENGTH);
  cxr_limits_init(&lim);
  // NULL with a length.
  m->f_string.ptr = nullptr;
  EXPECT_EQ(validate(m), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_NULL);
}

TEST_F(Msg, ValidatorRefusesCyclesAndSharedNodes) {
  Ev *m = random_ev(9);
  m->inner = cxrtest_Everything_Inner_new(h);
  m->inner->child = cxrtest_Everything_Inner_new(h);
  m->inner->child->child = m->inner;  // a cycle of two
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_CYCLE);
  m->inner->child->child = m->inner->child;  // a self loop
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_CYCLE);
  m->inner->child->child = nullptr;
  EXPECT_EQ(validate(m), 0);
  // A tree whose link points back at an element of an inline array above it.
  Tree *t = cxrtest_open_Tree_new(h);
  CXR_VEC_ALLOC(h, t->children, 3);
  t->children.items[2].link = &t->children.items[0];
  m->tree = t;
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_CYCLE);
  t->children.items[2].link = t;  // back to the root of the tree
  EXPECT_EQ(validate(m), CXR_EPROTO);
  t->children.items[2].link = nullptr;
  EXPECT_EQ(validate(m), 0);
  // Two fields sharing one node (a DAG) is refused too: work stays linear.
  m->choice_case = 52;
  m->choice.c_leaf = m->must;
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_CYCLE);
}

TEST_F(Msg, ValidatorBoundsDepthAndNodes) {
  Ev *m = random_ev(10);
  m->inner = cxrtest_Everything_Inner_new(h);
  cxrtest_Everything_Inner *in = m->inner;
  for (int i = 0; i < 100; i++) in = in->child = cxrtest_Everything_Inner_new(h);
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_DEPTH);
  lim.max_depth = 200;
  EXPECT_EQ(validate(m), 0);
  lim.max_nodes = 50;
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_NODES);
  // A 100000-deep chain never recurses past max_depth (no stack overflow).
  cxr_limits_init(&lim);
  for (int i = 0; i < 100000; i++) in = in->child = cxrtest_Everything_Inner_new(h);
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_DEPTH);
}

// A limit left zero takes its default, the ones set apply: setting max_len alone left
// max_nodes and max_depth 0, and every graph was refused (no node fits in 0).
TEST_F(Msg, ZeroLimitsTakeTheirDefaults) {
  Ev *m = random_ev(11);
  m->inner = nullptr;
  cxr_range r = range(h);
  cxr_limits only = {0, 0, 1u << 20};
  EXPECT_EQ(cxrtest_Everything_validate(m, &r, &only), 0)
      << cxr_invalid_str(cxr_invalid_reason());
  m->has_f_string = true;
  set_str(&m->f_string, "0123456789");
  only.max_len = 5;
  EXPECT_EQ(cxrtest_Everything_validate(m, &r, &only), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_LENGTH);
  m->has_f_string = false;
  m->f_string = cxr_str{nullptr, 0};
  // max_depth alone, deeper than the default (64); then max_nodes alone.
  m->inner = cxrtest_Everything_Inner_new(h);
  cxrtest_Everything_Inner *in = m->inner;
  for (int i = 0; i < 100; i++) in = in->child = cxrtest_Everything_Inner_new(h);
  only = cxr_limits{200, 0, 0};
  EXPECT_EQ(cxrtest_Everything_validate(m, &r, &only), 0)
      << cxr_invalid_str(cxr_invalid_reason());
  only = cxr_limits{0, 50, 0};
  EXPECT_EQ(cxrtest_Everything_validate(m, &r, &only), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_NODES);
  only = cxr_limits{0, 1000, 0};
  EXPECT_EQ(cxrtest_Everything_validate(m, &r, &only), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_DEPTH);  // the default depth
}

// Each bool of a repeated field is read, so each counts against max_nodes (as each closed
// enum does): the bytes read stay bounded however many messages share one array.
TEST_F(Msg, ValidatorCountsRepeatedBoolsAgainstMaxNodes) {
  Ev *m = cxrtest_Everything_new(h);
  ASSERT_NE(m, nullptr);
  set_str(&m->name, "bools");
  m->must = cxrtest_Leaf_new(h);
  const uint64_t kBools = 1000;
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_bool, kBools), nullptr);
  lim.max_nodes = 2 + kBools;  // the root, must and each bool
  EXPECT_EQ(validate(m), 0);
  lim.max_nodes = 1 + kBools;
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_NODES);
  // 4 MiB of bools: far under max_len (256 MiB), over the default 2^20 nodes.
  cxr_heap_free(h, m->r_bool.items);
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_bool, 4u << 20), nullptr);
  cxr_limits_init(&lim);
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_NODES);
  cxrtest_Everything_free(h, m);
}

TEST_F(Msg, ValidatorRefusesMisalignedPointers) {
  Ev *m = random_ev(11);
  char *raw = (char *)cxr_heap_alloc(h, sizeof(cxrtest_Leaf) + 16);
  memset(raw, 0, sizeof(cxrtest_Leaf) + 16);
  m->must = (cxrtest_Leaf *)(raw + 4);
  EXPECT_EQ(validate(m), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_ALIGN);
  m->must = (cxrtest_Leaf *)(raw + 8);
  EXPECT_EQ(validate(m), 0);
  m->r_int64.items = (int64_t *)(raw + 2);
  m->r_int64.count = 1;
  EXPECT_EQ(validate(m), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_ALIGN);
}

TEST_F(Msg, ValidatorRefusesBadClosedEnumsBoolsAndOneofs) {
  Ev *m = random_ev(12);
  m->has_color = true;
  m->color = 7;  // Color is closed (proto2): 1, 2, 3 only
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_ENUM);
  m->has_color = false;  // an absent value is not checked
  EXPECT_EQ(validate(m), 0);
  CXR_VEC_ALLOC(h, m->r_color, 2);
  m->r_color.items[0] = 1;  // items[1] stays 0: not a Color
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_ENUM);
  m->r_color.items[1] = 3;
  EXPECT_EQ(validate(m), 0);
  // Open enums (proto3) take any value.
  m->tree = cxrtest_open_Tree_new(h);
  m->tree->kind = 123456;
  EXPECT_EQ(validate(m), 0);
  // A bool byte that is neither 0 nor 1.
  memset(&m->has_f_bool, 2, 1);
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_BOOL);
  memset(&m->has_f_bool, 0, 1);
  m->choice_case = 99;
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_ONEOF);
  m->choice_case = 0;
  m->must = nullptr;  // required
  EXPECT_EQ(validate(m), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_REQUIRED);
  EXPECT_EQ(cxrtest_Everything_validate(nullptr, nullptr, nullptr), CXR_EINVAL);
}

TEST_F(Msg, ValidatorSurvivesRandomBytes) {
  // Random words, a third of them pointers into the block: never a crash, never a read
  // outside the heap (ASan would see it in private memory; the heap's edges are checked).
  std::mt19937_64 rng(5);
  const size_t n = 64 << 10;
  uint64_t *blk = (uint64_t *)cxr_heap_alloc(h, n);
  ASSERT_NE(blk, nullptr);
  int ok = 0;
  for (int round = 0; round < 300; round++) {
    for (size_t i = 0; i < n / 8; i++) {
      uint64_t r = rng();
      switch (r % 3) {
        case 0: blk[i] = (uintptr_t)blk + (rng() % n & ~(uint64_t)(rng() % 2 ? 7 : 0)); break;
        case 1: blk[i] = rng() % 64; break;
        default: blk[i] = r; break;
      }
    }
    cxr_range r = {blk, n};
    ok += cxrtest_Everything_validate((const Ev *)blk, &r, &lim) == 0;
    cxrtest_open_Tree_validate((const Tree *)(blk + 8), &r, &lim);
  }
  EXPECT_LT(ok, 300);
}

TEST_F(Msg, FromProtobufRefusesOutOfDomainClosedEnum) {
  Cxrtest__Everything pb = CXRTEST__EVERYTHING__INIT;
  Cxrtest__Leaf must = CXRTEST__LEAF__INIT;
  pb.name = (char *)"x";
  pb.must = &must;
  pb.has_color = 1;
  pb.color = (Cxrtest__Color)9;
  Ev *m = nullptr;
  size_t base = used(h);
  EXPECT_EQ(cxrtest_Everything_from_pb(h, &pb, &m), CXR_EPROTO);
  EXPECT_EQ(used(h), base);
  pb.color = CXRTEST__COLOR__BLUE;
  ASSERT_EQ(cxrtest_Everything_from_pb(h, &pb, &m), 0);
  EXPECT_EQ(m->color, cxrtest_Color_BLUE);
  EXPECT_TRUE(cxr_str_eq(m->name, "x"));
  cxrtest_Everything_free(h, m);
  // A string with an embedded NUL cannot become a protobuf-c string.
  Ev *e = random_ev(3);
  e->has_f_string = true;
  cxr_str_set(h, &e->f_string, "a\0b", 3);
  Cxrtest__Everything *out = nullptr;
  EXPECT_EQ(cxrtest_Everything_to_pb(e, &out), CXR_EINVAL);
}

TEST_F(Msg, MethodIdsAreFnv1aOfTheFullName) {
  EXPECT_EQ(cxr_method_id("a"), 0xe40c292cu);  // the published FNV-1a test vector
  EXPECT_EQ(cxr_method_id(""), 0x811c9dc5u);
  EXPECT_EQ(cxrtest_Store_Put_ID, cxr_method_id("cxrtest.Store/Put"));
  EXPECT_EQ(cxrtest_Store_Walk_ID, cxr_method_id("cxrtest.Store/Walk"));
  EXPECT_EQ(cxrtest_Admin_Ping_ID, cxr_method_id("cxrtest.Admin/Ping"));
  EXPECT_NE(cxrtest_Store_Put_ID, cxrtest_Admin_Ping_ID);
}

// A heap of its own for a _free test, and its bytes in use and stats when it was made.
struct ScratchHeap {
  std::string name;
  cxr_heap *h = nullptr;
  size_t used0 = 0;
  cxr_heap_stats st0 = {};
  ScratchHeap(const char *tag, size_t size) {
    name = std::string(tag) + "-" + std::to_string(getpid());
    EXPECT_EQ(cxr_heap_create(&h, name.c_str(), size, nullptr), 0);
    used0 = used();
    EXPECT_EQ(cxr_heap_get_stats(h, &st0), 0);
  }
  ~ScratchHeap() {
    cxr_heap_close(h);
    cxr_heap_unlink(name.c_str());
  }
  size_t used() {
    cxr_heap_stats st;
    EXPECT_EQ(cxr_heap_get_stats(h, &st), 0);
    return st.used;
  }
};

// _free bounds its walk so that a graph a peer rewrote into shared subtrees cannot walk
// 2^50 paths. That bound was 2^24 blocks and items per call, so a caller's own message with
// a repeated field of more items than that stayed allocated in its heap (the whole field:
// 256 MiB here, logged as "a graph rewritten by a peer?"). The walk now enters each block
// once (docstore_count_test), and a tree is freed whole however many items it holds.
TEST(Free, AMessageOfMoreThan2To24ItemsIsFreedWhole) {
  ScratchHeap sh("idlbigfree", 320u << 20);
  cxr_heap *h = sh.h;
  ASSERT_NE(h, nullptr);
  int64_t t0 = cxr_now_ns();
  Ev *m = cxrtest_Everything_new(h);
  ASSERT_NE(m, nullptr);
  const uint64_t n = (1u << 24) + 1;  // empty strings: 16 bytes of items each
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_string, n), nullptr);
  ASSERT_EQ(cxr_str_setz(h, &m->r_string.items[n - 1], "the last one"), 0);
  m->must = cxrtest_Leaf_new(h);  // a block after the field: the walk goes on past it
  ASSERT_NE(m->must, nullptr);
  cxrtest_Everything_free(h, m);
  EXPECT_EQ(sh.used(), sh.used0) << "left allocated by _free";
  printf("built and freed %llu items in %lld ms\n", (unsigned long long)n,
         (long long)((cxr_now_ns() - t0) / 1000000));
}

// The bytes of TLS (its PT_TLS segment) of the loaded object holding the code at addr: every
// thread of a process that loads it gets that much, whether it uses it or not.
size_t tls_bytes_of_object_at(const void *addr) {
  struct q {
    uintptr_t a;
    size_t tls;
    bool found;
  } x = {(uintptr_t)addr, 0, false};
  dl_iterate_phdr(
      [](struct dl_phdr_info *info, size_t, void *arg) {
        q *x = (q *)arg;
        bool here = false;
        size_t tls = 0;
        for (int i = 0; i < info->dlpi_phnum; i++) {
          const ElfW(Phdr) &ph = info->dlpi_phdr[i];
          uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && x->a >= lo && x->a < lo + ph.p_memsz) here = true;
          if (ph.p_type == PT_TLS) tls = ph.p_memsz;
        }
        if (!here) return 0;
        x->tls = tls, x->found = true;
        return 1;
      },
      &x);
  EXPECT_TRUE(x.found);
  return x.tls;
}

// A _free's set of the blocks it is inside of was a static thread-local table of
// CXR__MAX_DEPTH levels (72 KiB), so every thread of every process linking cxrpc carried it
// (73776 bytes of PT_TLS in the idl library), freeing or not. It is allocated at a thread's
// first _free now, and freed at its exit.
TEST(Free, AThreadThatNeverFreesCarriesNoWalkTable) {
  size_t tls = tls_bytes_of_object_at((const void *)&cxr__free_enter);
  EXPECT_LT(tls, 1024u) << "bytes of TLS in each thread for the idl runtime";
}

// Threads that each free messages nested deeper than the table's first size (it grows)
// free them whole; under ASan, LeakSanitizer finds any table a thread's exit left behind.
TEST(Free, ManyThreadsFreeNestedMessagesWhole) {
  ScratchHeap sh("idlthrfree", 16u << 20);
  cxr_heap *h = sh.h;
  ASSERT_NE(h, nullptr);
  const int kThreads = 6, kRounds = 3, kLevels = 300;  // 300 > 64, 128 and 256 levels
  std::vector<uint64_t> entered(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++)
    ts.emplace_back([&, t] {
      for (int r = 0; r < kRounds; r++) {
        Ev *m = cxrtest_Everything_new(h);
        if (!m || cxr_str_setz(h, &m->name, "nested")) return;
        cxrtest_Everything_Inner **in = &m->inner;
        for (int l = 0; l < kLevels && (*in = cxrtest_Everything_Inner_new(h)); l++) {
          if (CXR_VEC_ALLOC(h, (*in)->notes, 1)) cxr_str_setz(h, &(*in)->notes.items[0], "n");
          in = &(*in)->child;
        }
        uint64_t e0 = cxr__free_entered();
        cxrtest_Everything_free(h, m);
        entered[t] += cxr__free_entered() - e0;
      }
    });
  for (auto &t : ts) t.join();
  for (int t = 0; t < kThreads; t++)
    EXPECT_EQ(entered[t], kRounds * (1 + 2 * kLevels)) << "thread " << t;
  EXPECT_EQ(sh.used(), sh.used0) << "left allocated by _free";
}

// Validates m (validation accepts the graph), frees it with _free and expects no error, no
// log line (at WARN and above) and each block allocated in sh since it was made freed once.
void expect_freed_once_quietly(ScratchHeap &sh, Ev *m) {
  cxr_range r = {cxr_heap_base(sh.h), cxr_heap_size(sh.h)};
  ASSERT_EQ(cxrtest_Everything_validate(m, &r, nullptr), 0) << "a graph validation accepts";
  testing::internal::CaptureStderr();
  int level = cxr_log_level();
  cxr_log_set_level(CXR_LOG_WARN);
  cxr__set_error(0);
  cxrtest_Everything_free(sh.h, m);
  int err = cxr_last_error();
  cxr_log_set_level(level);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, 0) << cxr_strerror(err);
  EXPECT_EQ(log, "") << "logged by _free";
  cxr_heap_stats st1;
  ASSERT_EQ(cxr_heap_get_stats(sh.h, &st1), 0);
  EXPECT_EQ(st1.frees - sh.st0.frees, st1.allocs - sh.st0.allocs) << "each block freed once";
  EXPECT_EQ(sh.used(), sh.used0) << "left allocated by _free";
}

// String bodies and scalar arrays are leaves of a _free walk, never entered: two fields
// naming one (validation allows it) had it freed twice, the heap refusing the second and
// logging "not allocated (double free?)" or, for a page run, "not an allocation of this
// heap" (last error CXR_EINVAL or CXR_EBADPTR). Now it is freed once, without a word, at
// the end of the walk (cxr__free_leaf).
TEST(Free, ALeafNamedByTwoFieldsIsFreedOnce) {
  ScratchHeap sh("idlleaffree", 1u << 20);
  cxr_heap *h = sh.h;
  ASSERT_NE(h, nullptr);
  Ev *m = cxrtest_Everything_new(h);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(cxr_str_setz(h, &m->name, "shared body"), 0);
  m->f_string = m->name;  // a string field, a bytes field and a list item share one body
  m->f_bytes.ptr = (const uint8_t *)m->name.ptr;
  m->f_bytes.len = m->name.len;
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_string, 1), nullptr);
  m->r_string.items[0] = m->name;
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_int32, 4), nullptr);
  m->r_sint32 = m->r_int32;  // two scalar fields share one array
  m->must = cxrtest_Leaf_new(h);
  ASSERT_NE(m->must, nullptr);
  m->must->has_label = true;
  m->must->label = m->name;  // and a field of another message
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_double, 2000), nullptr);  // a page run, not a slab block
  m->r_float.items = (float *)m->r_double.items;
  m->r_float.count = 1;
  expect_freed_once_quietly(sh, m);
}

// Points s at block p (8 bytes of it: any length inside the heap validates).
void name_block(cxr_str *s, const void *p) {
  s->ptr = (const char *)p;
  s->len = 8;
}

// A string body naming a block the walk was inside of (its own message, an ancestor, or
// the list of strings it is an item of) was freed as a leaf: the walk went on reading that
// block freed (its later fields, its own free), then freed it again, logged "not allocated
// (double free?)" with last error CXR_EINVAL, and a message freed early took the rest of
// its walk with it. Such a leaf is now left to the block's own free (cxr__free_leaf).
TEST(Free, AStringNamingItsOwnMessageOrAnAncestorIsFreedOnce) {
  ScratchHeap sh("idlancfree", 1u << 20);
  cxr_heap *h = sh.h;
  ASSERT_NE(h, nullptr);
  Ev *m = cxrtest_Everything_new(h);
  ASSERT_NE(m, nullptr);
  name_block(&m->name, m);  // the message itself, before its other fields are walked
  m->must = cxrtest_Leaf_new(h);
  ASSERT_NE(m->must, nullptr);
  m->must->has_label = true;
  name_block(&m->must->label, m);  // the parent
  ASSERT_NE(m->inner = cxrtest_Everything_Inner_new(h), nullptr);
  ASSERT_NE(m->inner->child = cxrtest_Everything_Inner_new(h), nullptr);
  cxrtest_Everything_Inner *child = m->inner->child;
  ASSERT_NE(CXR_VEC_ALLOC(h, child->notes, 4), nullptr);
  name_block(&child->notes.items[0], m);            // the root, two levels up
  name_block(&child->notes.items[1], m->inner);     // the parent
  name_block(&child->notes.items[2], child);        // the list's own message
  name_block(&child->notes.items[3], child->notes.items);  // the list itself
  m->choice_case = 51;  // c_str
  name_block(&m->choice.c_str, m);  // a oneof's member
  expect_freed_once_quietly(sh, m);
}

// A bytes field or scalar array naming a message block of its message's subtree (a field
// further on, a list of messages, a message in a oneof) freed it before the walk got
// there, which refused the block, freed already (logged "a _free left 1 item(s) at"), and
// leaked what it held. The walk now frees the blocks it enters before the leaves
// (walk_fields in idl/gen/emit_copy.c), which then find them freed and leave them.
TEST(Free, ABytesOrArrayFieldNamingANestedMessageBlockIsFreedOnce) {
  ScratchHeap sh("idlnestfree", 1u << 20);
  cxr_heap *h = sh.h;
  ASSERT_NE(h, nullptr);
  Ev *m = cxrtest_Everything_new(h);
  ASSERT_NE(m, nullptr);
  ASSERT_NE(m->inner = cxrtest_Everything_Inner_new(h), nullptr);  // field 19
  ASSERT_NE(CXR_VEC_ALLOC(h, m->inner->notes, 1), nullptr);
  ASSERT_EQ(cxr_str_setz(h, &m->inner->notes.items[0], "held by inner"), 0);
  m->f_bytes.ptr = (const uint8_t *)m->inner;  // field 17
  m->f_bytes.len = 8;
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_leaf, 2), nullptr);  // field 35
  m->r_leaf.items[1].has_label = true;
  ASSERT_EQ(cxr_str_setz(h, &m->r_leaf.items[1].label, "held by r_leaf"), 0);
  m->r_int32.items = (int32_t *)m->r_leaf.items;  // field 25
  m->r_int32.count = 2;
  ASSERT_NE(m->tree = cxrtest_open_Tree_new(h), nullptr);
  ASSERT_NE(m->tree->link = cxrtest_open_Tree_new(h), nullptr);  // field 5
  ASSERT_EQ(cxr_str_setz(h, &m->tree->link->name, "held by link"), 0);
  m->tree->data.ptr = (const uint8_t *)m->tree->link;  // field 4
  m->tree->data.len = 8;
  ASSERT_NE(CXR_VEC_ALLOC(h, m->tree->children, 2), nullptr);
  m->tree->children.items[1].data.ptr = (const uint8_t *)m->tree->children.items;
  m->tree->children.items[1].data.len = 8;  // the list of messages it is in: an ancestor
  m->choice_case = 52;  // c_leaf
  ASSERT_NE(m->choice.c_leaf = cxrtest_Leaf_new(h), nullptr);
  m->r_double.items = (double *)m->choice.c_leaf;  // field 23, before the oneof
  m->r_double.count = 1;
  m->must = cxrtest_Leaf_new(h);
  ASSERT_NE(m->must, nullptr);
  expect_freed_once_quietly(sh, m);
}

// An item of a list of strings (field 32) naming a list of messages further on in the same
// message (field 35): the messages are freed first, so the item finds the block freed.
TEST(Free, AStringItemNamingALaterListOfMessagesIsFreedOnce) {
  ScratchHeap sh("idlitemfree", 1u << 20);
  cxr_heap *h = sh.h;
  ASSERT_NE(h, nullptr);
  Ev *m = cxrtest_Everything_new(h);
  ASSERT_NE(m, nullptr);
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_leaf, 2), nullptr);
  m->r_leaf.items[0].has_label = true;
  ASSERT_EQ(cxr_str_setz(h, &m->r_leaf.items[0].label, "held by r_leaf"), 0);
  ASSERT_NE(CXR_VEC_ALLOC(h, m->r_string, 2), nullptr);
  ASSERT_EQ(cxr_str_setz(h, &m->r_string.items[1], "its own"), 0);
  name_block(&m->r_string.items[0], m->r_leaf.items);
  m->must = cxrtest_Leaf_new(h);
  ASSERT_NE(m->must, nullptr);
  expect_freed_once_quietly(sh, m);
}

// A graph of siblings: inner (field 19) with a child, tree (field 20) with a link and two
// children (the second with a link), must (22), a list of strings (32), a list of messages
// (35) and a oneof's message (52). Most blocks hold a string, so a block whose walk is
// refused leaves bytes in use; the fields the tests point at blocks hold nothing.
Ev *sibling_graph(cxr_heap *h) {
  Ev *m = cxrtest_Everything_new(h);
  if (m == nullptr || !(m->inner = cxrtest_Everything_Inner_new(h)) ||
      !(m->inner->child = cxrtest_Everything_Inner_new(h)) ||
      !CXR_VEC_ALLOC(h, m->inner->notes, 2) || !CXR_VEC_ALLOC(h, m->inner->child->notes, 2) ||
      !(m->tree = cxrtest_open_Tree_new(h)) || !(m->tree->link = cxrtest_open_Tree_new(h)) ||
      !CXR_VEC_ALLOC(h, m->tree->children, 2) ||
      !(m->tree->children.items[1].link = cxrtest_open_Tree_new(h)) ||
      !(m->must = cxrtest_Leaf_new(h)) || !CXR_VEC_ALLOC(h, m->r_string, 2) ||
      !CXR_VEC_ALLOC(h, m->r_leaf, 1) || !(m->choice.c_leaf = cxrtest_Leaf_new(h)))
    return nullptr;
  m->choice_case = 52;  // c_leaf
  m->must->has_label = true;
  m->r_leaf.items[0].has_label = true;
  m->choice.c_leaf->has_label = true;
  cxr_str *held[] = {&m->name, &m->inner->notes.items[0], &m->inner->child->notes.items[0],
                     &m->tree->name, &m->tree->link->name, &m->tree->children.items[0].name,
                     &m->tree->children.items[1].link->name, &m->r_string.items[1],
                     &m->r_leaf.items[0].label};
  for (cxr_str *s : held)
    if (cxr_str_setz(h, s, "held")) return nullptr;
  return m;
}

// A leaf (string body, bytes, scalar array) naming a block of a sibling's subtree that the
// walk enters after the leaf (validation allows it) freed that block first: its walk then
// found it freed, logged "a _free left N item(s) at ..." and leaked what it held (the
// passes of b44567d and 43c7e91 order the fields of one message only). The leaves of a
// top-level _free are now freed after all of its blocks (cxr__free_leaf).
TEST(Free, ALeafNamingABlockOfALaterSiblingsSubtreeIsFreedOnce) {
  ScratchHeap sh("idlsibfree", 1u << 20);
  Ev *m = sibling_graph(sh.h);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(cxr_str_setz(sh.h, &m->choice.c_leaf->label, "held"), 0);
  cxrtest_open_Tree *t = m->tree;
  name_block(&m->inner->child->notes.items[1], t->link);  // two levels down in field 20
  name_block(&m->inner->notes.items[1], t->children.items);  // a list of messages there
  t->data.ptr = (const uint8_t *)m->must;  // a bytes field of 20 naming field 22
  t->data.len = 8;
  t->children.items[0].data.ptr = (const uint8_t *)t->children.items[1].link;  // list items
  t->children.items[0].data.len = 8;
  t->sizes.items = (int64_t *)m->r_leaf.items;  // a scalar array naming field 35
  t->sizes.count = 1;
  t->link->data.ptr = (const uint8_t *)m->r_string.items;  // the parent's list of strings
  t->link->data.len = 8;
  name_block(&m->must->label, m->choice.c_leaf);  // a oneof's message, walked last
  expect_freed_once_quietly(sh, m);
}

// The other way round (B before A): a leaf naming a block of a sibling's subtree walked
// before it, which finds that block freed by its walk and leaves it.
TEST(Free, ALeafNamingABlockOfAnEarlierSiblingsSubtreeIsFreedOnce) {
  ScratchHeap sh("idlsib2free", 1u << 20);
  Ev *m = sibling_graph(sh.h);
  ASSERT_NE(m, nullptr);
  cxrtest_open_Tree *t = m->tree;
  t->link->data.ptr = (const uint8_t *)m->inner->child;  // field 20 naming field 19's subtree
  t->link->data.len = 8;
  name_block(&m->must->label, t->children.items);  // field 22 naming a list in field 20
  t->children.items[1].data.ptr = (const uint8_t *)t->children.items[0].name.ptr;
  t->children.items[1].data.len = 4;  // a later item naming an earlier item's leaf
  name_block(&m->r_string.items[0], m->inner->notes.items);  // a list of strings, field 19's
  name_block(&m->choice.c_leaf->label, m->r_leaf.items);  // the oneof naming field 35
  expect_freed_once_quietly(sh, m);
}

// A list of strings freed alone (no message around it) frees its items' bodies before it
// returns: they are not left for a later _free, which may be in another heap.
TEST(Free, AListOfStringsFreedAloneFreesItsItems) {
  ScratchHeap sh("idlstrsfree", 1u << 20);
  cxr_vec_str v = {};
  ASSERT_NE(CXR_VEC_ALLOC(sh.h, v, 3), nullptr);
  for (uint64_t i = 0; i < v.count; i++) ASSERT_EQ(cxr_str_setz(sh.h, &v.items[i], "held"), 0);
  cxr__free_strs(sh.h, &v);
  EXPECT_EQ(sh.used(), sh.used0) << "left allocated by cxr__free_strs";
}

TEST(Generated, HeaderCarriesProtoComments) {
  std::ifstream f("tests/idl/everything.cxr.h");
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  EXPECT_NE(s.find("A closed enum: validators refuse values outside the list"), std::string::npos);
  EXPECT_NE(s.find("Every scalar type, presence, required"), std::string::npos);
  EXPECT_NE(s.find("Stores a document."), std::string::npos);
  EXPECT_NE(s.find("class_;"), std::string::npos);  // keyword escaped
}

}  // namespace
