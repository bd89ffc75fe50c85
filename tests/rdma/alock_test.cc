// ALock inside one process (the pod cohort only): mutual exclusion between threads, the
// in-cohort budget, and waiters whose deadline passes leaving the queue cleanly (the
// releaser passes over them and the lock keeps working).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <thread>
#include <vector>

#include <cxrpc/rdma.h>

namespace {

const int64_t kMs = 1000000;

cxr_alock *new_lock() {
  void *p = nullptr;
  if (posix_memalign(&p, 64, sizeof(cxr_alock)) != 0) return nullptr;
  cxr_alock_init((cxr_alock *)p, 0);
  return (cxr_alock *)p;
}

// Waits (bounded) until slot + 1 is the local tail: that waiter has queued.
bool tail_becomes(cxr_alock *l, uint64_t v) {
  int64_t end = cxr_now_ns() + 10000 * kMs;
  while (__atomic_load_n(&l->ltail, __ATOMIC_ACQUIRE) != v && cxr_now_ns() < end)
    std::this_thread::yield();
  return __atomic_load_n(&l->ltail, __ATOMIC_ACQUIRE) == v;
}

TEST(Alock, ThreadsExcludeEachOther) {
  cxr_alock *l = new_lock();
  ASSERT_NE(l, nullptr);
  volatile long counter = 0;
  std::atomic<int> inside{0}, overlaps{0};
  std::vector<std::thread> ts;
  for (unsigned s = 0; s < 4; s++)
    ts.emplace_back([&, s] {
      cxr_alock_ref r = {};
      r.local = l;
      r.slot = s;
      for (int i = 0; i < 4000; i++) {
        ASSERT_EQ(cxr_alock_lock(&r, cxr_now_ns() + 10000 * kMs), 0);
        if (inside.fetch_add(1) != 0) overlaps++;
        counter = counter + 1;
        inside.fetch_sub(1);
        ASSERT_EQ(cxr_alock_unlock(&r), 0);
      }
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(counter, 4 * 4000);
  EXPECT_EQ(l->ltail, 0u);
  EXPECT_EQ(l->rtail, 0u);
  free(l);
}

TEST(Alock, AWaiterWhoseDeadlinePassesLeavesTheQueue) {
  cxr_alock *l = new_lock();
  cxr_alock_ref a = {}, b = {}, c = {};
  a.local = b.local = c.local = l;
  a.slot = 0, b.slot = 1, c.slot = 2;
  ASSERT_EQ(cxr_alock_lock(&a, 0), 0);
  // b queues behind a and gives up; c queues behind b.
  EXPECT_EQ(cxr_alock_lock(&b, cxr_now_ns() + 20 * kMs), CXR_ETIMEDOUT);
  std::atomic<int> c_rc{1};
  std::thread tc([&] { c_rc = cxr_alock_lock(&c, cxr_now_ns() + 10000 * kMs); });
  ASSERT_TRUE(tail_becomes(l, 3));
  ASSERT_EQ(cxr_alock_unlock(&a), 0);  // passes over b, grants c
  tc.join();
  EXPECT_EQ(c_rc.load(), 0);
  EXPECT_EQ(l->lnodes[1].locked, 4u);  // b's node was passed over: b may use it again
  // b can take the lock again after c.
  std::atomic<int> b_rc{1};
  std::thread tb([&] { b_rc = cxr_alock_lock(&b, cxr_now_ns() + 10000 * kMs); });
  ASSERT_TRUE(tail_becomes(l, 2));
  ASSERT_EQ(cxr_alock_unlock(&c), 0);
  tb.join();
  EXPECT_EQ(b_rc.load(), 0);
  ASSERT_EQ(cxr_alock_unlock(&b), 0);
  EXPECT_EQ(l->ltail, 0u);
  free(l);
}

TEST(Alock, BadArguments) {
  cxr_alock_ref r = {};
  EXPECT_EQ(cxr_alock_lock(nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_lock(&r, 0), CXR_EINVAL);  // neither local nor remote
  cxr_alock *l = new_lock();
  r.local = l;
  r.slot = CXR_ALOCK_SLOTS;
  EXPECT_EQ(cxr_alock_lock(&r, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_init(nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_init((cxr_alock *)((char *)l + 8), 0), CXR_EINVAL);  // not aligned
  free(l);
}

}  // namespace
