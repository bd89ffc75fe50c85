// The descriptor ring on its own: order, full/empty, many producers and consumers, and two
// processes sharing it through a MAP_SHARED mapping.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "rpc/internal.h"

namespace {

// A request ring (v) and an answer ring (a) over the same slots, as in a connection.
struct Ring {
  void *mem;
  cxr__rview v, a;
  size_t size;
  explicit Ring(uint32_t slots) {
    size = 2 * sizeof(cxr__ring) + slots * sizeof(cxr__slot);
    mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    v = cxr__rview{};
    v.r = (cxr__ring *)mem;
    v.s = (cxr__slot *)((char *)mem + 2 * sizeof(cxr__ring));
    v.mask = slots - 1;
    a = v;
    a.r = (cxr__ring *)mem + 1;
    a.answers = true;
    cxr__ring_init(&v);
    cxr__ring_init(&a);
  }
  ~Ring() { munmap(mem, size); }
};

TEST(Ring, FifoFullAndEmpty) {
  Ring r(8);
  cxr__desc d = {}, out;
  EXPECT_EQ(cxr__ring_pop(&r.v, &out), CXR_EAGAIN);
  EXPECT_FALSE(cxr__ring_nonempty(&r.v));
  for (int i = 0; i < 8; i++) {
    d.call_id = 100 + i;
    ASSERT_EQ(cxr__ring_push(&r.v, &d), 0);
  }
  EXPECT_EQ(cxr__ring_push(&r.v, &d), CXR_EFULL);
  EXPECT_TRUE(cxr__ring_nonempty(&r.v));
  for (int i = 0; i < 8; i++) {
    ASSERT_EQ(cxr__ring_pop(&r.v, &out), 0);
    EXPECT_EQ(out.call_id, (uint64_t)(100 + i));
  }
  EXPECT_EQ(cxr__ring_pop(&r.v, &out), CXR_EAGAIN);
}

TEST(Ring, ManyProducersManyConsumersLoseNothing) {
  Ring r(64);
  const int producers = 3, consumers = 2, per = 20000;
  std::atomic<uint64_t> sum{0}, count{0};
  std::vector<std::thread> ts;
  for (int p = 0; p < producers; p++)
    ts.emplace_back([&, p] {
      cxr__desc d = {};
      for (int i = 1; i <= per; i++) {
        d.call_id = (uint64_t)p << 32 | (uint64_t)i;
        d.ptr = (uint64_t)i;
        while (cxr__ring_push(&r.v, &d) != 0) std::this_thread::yield();
      }
    });
  for (int c = 0; c < consumers; c++)
    ts.emplace_back([&] {
      cxr__desc out;
      while (count.load() < (uint64_t)producers * per) {
        if (cxr__ring_pop(&r.v, &out) == 0) {
          EXPECT_EQ(out.ptr, out.call_id & 0xffffffff);
          sum += out.ptr;
          count++;
        } else {
          std::this_thread::yield();
        }
      }
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(count.load(), (uint64_t)producers * per);
  EXPECT_EQ(sum.load(), (uint64_t)producers * per * (per + 1) / 2);
}

// Requests and answers share each slot's first line: neither may disturb the other's
// fields, whatever order they are written and read in, and every field travels whole.
TEST(Ring, ARequestAndItsAnswerShareASlotAndKeepTheirFields) {
  Ring r(4);
  for (int round = 0; round < 3; round++) {
    for (uint32_t i = 0; i < 4; i++) {
      cxr__desc q = {}, ans = {};
      q.call_id = 0x1234567800000000ull | i;
      q.method = 0xfedcba98u - i;
      q.flags = CXR_CALL_INLINE;
      q.seal = 0xa5a5a5a5u;
      q.ptr = 0xffffffffffff0000ull + i;  // a request's pointer travels whole (64 bits)
      q.len = CXR__INLINE_MAX;
      q.deadline = INT64_MAX - i;
      for (uint32_t k = 0; k < CXR__INLINE_MAX; k++) q.data[k] = (unsigned char)(k * 7 + i);
      ans.call_id = ~q.call_id;
      ans.status = CXR_ERRNO_MIN;
      ans.ptr = (CXR__RESULT_ADDR_LIMIT - 8) - i;
      // Odd rounds answer first: a position's answer may land before its request is read.
      bool answer_first = round & 1;
      if (answer_first) {
        ASSERT_EQ(cxr__ring_push(&r.a, &ans), 0);
      }
      ASSERT_EQ(cxr__ring_push(&r.v, &q), 0);
      if (!answer_first) {
        ASSERT_EQ(cxr__ring_push(&r.a, &ans), 0);
      }
    }
    for (uint32_t i = 0; i < 4; i++) {
      cxr__desc q, ans;
      ASSERT_EQ(cxr__ring_pop(&r.a, &ans), 0);
      ASSERT_EQ(cxr__ring_pop_single(&r.v, &q), 0);
      EXPECT_EQ(q.call_id, 0x1234567800000000ull | i);
      EXPECT_EQ(q.method, 0xfedcba98u - i);
      EXPECT_EQ(q.flags, (uint32_t)CXR_CALL_INLINE);
      EXPECT_EQ(q.seal, 0xa5a5a5a5u);
      EXPECT_EQ(q.ptr, 0xffffffffffff0000ull + i);
      EXPECT_EQ(q.len, (uint64_t)CXR__INLINE_MAX);
      EXPECT_EQ(q.deadline, INT64_MAX - (int64_t)i);
      for (uint32_t k = 0; k < CXR__INLINE_MAX; k++)
        ASSERT_EQ(q.data[k], (unsigned char)(k * 7 + i)) << k;
      EXPECT_EQ(ans.call_id, ~(0x1234567800000000ull | i));
      EXPECT_EQ(ans.status, CXR_ERRNO_MIN);
      EXPECT_EQ(ans.ptr, (CXR__RESULT_ADDR_LIMIT - 8) - i);
    }
    cxr__desc none;
    EXPECT_EQ(cxr__ring_pop(&r.v, &none), CXR_EAGAIN);
    EXPECT_EQ(cxr__ring_pop(&r.a, &none), CXR_EAGAIN);
  }
}

// Both sides spin, yielding now and then: when another test shares the two cores, the
// parent and the child may share one, and a pure spin waits out a whole time slice per
// round trip.
TEST(Ring, TwoProcessesShareIt) {
  Ring rings(16);
  cxr__rview &req = rings.v, &resp = rings.a;
  const int n = 5000;
  pid_t pid = fork();
  if (pid == 0) {  // echo server: answers each request with ptr + 1
    cxr__desc d;
    unsigned spins = 0;
    for (int i = 0; i < n;) {
      if (cxr__ring_pop(&req, &d) != 0) {
        if (++spins % 256 == 0) sched_yield();
        continue;
      }
      d.ptr += 1;
      while (cxr__ring_push(&resp, &d) != 0) {
      }
      i++;
    }
    _exit(0);
  }
  cxr__desc d = {}, out;
  uint64_t got = 0;
  int64_t t0 = cxr_now_ns();
  for (int i = 0; i < n && cxr_now_ns() - t0 < 20000000000; i++) {
    d.ptr = (uint64_t)i;
    while (cxr__ring_push(&req, &d) != 0) {
    }
    for (unsigned spins = 1; cxr__ring_pop(&resp, &out) != 0; spins++) {
      if (cxr_now_ns() - t0 > 20000000000) break;
      if (spins % 256 == 0) sched_yield();
    }
    if (out.ptr == (uint64_t)i + 1) got++;
  }
  if (got != (uint64_t)n) kill(pid, SIGKILL);  // it may wait for requests that never come
  int st;
  waitpid(pid, &st, 0);
  EXPECT_EQ(got, (uint64_t)n);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

}  // namespace
