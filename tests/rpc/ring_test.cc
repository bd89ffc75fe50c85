// The descriptor ring on its own: order, full/empty, many producers and consumers, and two
// processes sharing it through a MAP_SHARED mapping.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "rpc/internal.h"

namespace {

struct Ring {
  void *mem;
  cxr__rview v;
  size_t size;
  explicit Ring(uint32_t slots) {
    size = sizeof(cxr__ring) + slots * sizeof(cxr__desc);
    mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    v.r = (cxr__ring *)mem;
    v.d = (cxr__desc *)((char *)mem + sizeof(cxr__ring));
    v.mask = slots - 1;
    v.head_seen = 0;
    cxr__ring_init(&v);
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

TEST(Ring, TwoProcessesShareIt) {
  Ring req(16), resp(16);
  const int n = 5000;
  pid_t pid = fork();
  if (pid == 0) {  // echo server: answers each request with ptr + 1
    cxr__desc d;
    for (int i = 0; i < n;) {
      if (cxr__ring_pop(&req.v, &d) != 0) continue;
      d.ptr += 1;
      while (cxr__ring_push(&resp.v, &d) != 0) {
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
    while (cxr__ring_push(&req.v, &d) != 0) {
    }
    while (cxr__ring_pop(&resp.v, &out) != 0 && cxr_now_ns() - t0 < 20000000000) {
    }
    if (out.ptr == (uint64_t)i + 1) got++;
  }
  int st;
  waitpid(pid, &st, 0);
  EXPECT_EQ(got, (uint64_t)n);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

}  // namespace
