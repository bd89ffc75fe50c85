// ALock inside one process (the pod cohort only): mutual exclusion between threads, the
// in-cohort budget, and waiters whose deadline passes leaving the queue cleanly (the
// releaser passes over them and the lock keeps working). And one remote participant (a real
// rdma_peer process holding the lock over UCX on TCP) whose step times out.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <atomic>
#include <thread>
#include <vector>

#include <cxrpc/rdma.h>
#include "tests/rdma/peer.h"

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

// Starts a peer, connects to it and writes a fresh lock into its memory: `far` reaches it.
void remote_lock(cxrt::Peer &peer, cxr_rdma *r, cxr_alock_ref *far) {
  ASSERT_TRUE(peer.start());
  cxr_rdma_ep *ep;
  ASSERT_EQ(cxr_rdma_connect(r, peer.addr().c_str(), cxr_now_ns() + 5000 * kMs, &ep), 0);
  cxr_rdma_rkey *rk;
  uint64_t base;
  ASSERT_EQ(cxr_rdma_rkey_get(ep, "mem", &rk, &base, nullptr), 0);
  cxr_alock *img = new_lock();  // the lock's initial words
  ASSERT_NE(img, nullptr);
  uint64_t addr = (base + 16384 + 63) & ~(uint64_t)63;
  int rc = cxr_rdma_put(ep, rk, addr, img, sizeof *img, cxr_now_ns() + 5000 * kMs);
  free(img);
  ASSERT_EQ(rc, 0);
  far->ep = ep;
  far->rk = rk;
  far->addr = addr;
}

// A remote step that misses its own 2 s bound (here the first read of a lock wait, its peer
// SIGSTOPped) spends the ref: later calls through it return CXR_ENOTCONN without touching
// the lock, even on another endpoint to another lock, since a timed-out atomic step may
// still apply at the lock later (the endpoint stays open for those) and the participant no
// longer knows where it stands. Setting budget_left back to 0 makes the ref usable again.
// The timed-out step (8 bytes) leaves its endpoint open, and the stopped peer, resumed, gets
// the late request: its reply lands in the op's own memory, not in the step's stack word.
TEST(Alock, ARemoteRefWhoseStepTimedOutIsSpent) {
  cxr_rdma *r;
  ASSERT_EQ(cxr_rdma_open(&r, nullptr), 0);
  cxrt::Peer stopped, fresh;
  cxr_alock_ref far = {};
  ASSERT_NO_FATAL_FAILURE(remote_lock(stopped, r, &far));
  ASSERT_EQ(cxr_alock_lock(&far, cxr_now_ns() + 5000 * kMs), 0);
  ASSERT_EQ(cxr_alock_unlock(&far), 0);
  ASSERT_EQ(kill(stopped.p.pid, SIGSTOP), 0);
  int ws = 0;
  ASSERT_EQ(waitpid(stopped.p.pid, &ws, WUNTRACED), stopped.p.pid);
  EXPECT_EQ(cxr_alock_lock(&far, cxr_now_ns() + 100 * kMs), CXR_ETIMEDOUT);
  cxr_rdma_ep *stopped_ep = far.ep;
  cxr_rdma_rkey *stopped_rk = far.rk;
  uint64_t stopped_addr = far.addr;
  EXPECT_EQ(cxr_rdma_ep_status(stopped_ep), 0) << "a timed-out 8-byte step ended the endpoint";
  ASSERT_EQ(kill(stopped.p.pid, SIGCONT), 0);
  uint64_t spent = far.budget_left;
  ASSERT_NO_FATAL_FAILURE(remote_lock(fresh, r, &far));
  EXPECT_EQ(cxr_alock_lock(&far, cxr_now_ns() + 5000 * kMs), CXR_ENOTCONN);
  EXPECT_EQ(cxr_alock_unlock(&far), CXR_ENOTCONN);
  EXPECT_EQ(far.budget_left, spent);
  far.budget_left = 0;
  EXPECT_EQ(cxr_alock_lock(&far, cxr_now_ns() + 5000 * kMs), 0);
  EXPECT_EQ(cxr_alock_unlock(&far), 0);
  uint64_t w;  // the resumed peer's endpoint still serves
  EXPECT_EQ(cxr_rdma_get(stopped_ep, stopped_rk, stopped_addr, &w, 8, cxr_now_ns() + 5000 * kMs),
            0);
  cxr_rdma_close(r);
}

}  // namespace
