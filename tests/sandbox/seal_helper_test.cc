// The restricted workers' helper thread (rpc/seal_helper.h), driven directly: the race it
// had needs two first sealed calls of a tenancy at the same moment, rare through rpc.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "rpc/internal.h"
#include "rpc/seal_helper.h"

namespace {

using Clock = std::chrono::steady_clock;

// Everything the requesters touch, on the heap: if one hangs, the test fails and leaves
// this behind for the hung thread rather than freeing it under it.
struct Shared {
  cxr__seal_helper h{};
  std::atomic<int> finished{0}, wrong{0}, gate{0};
  std::atomic<long> answered{0};
  int ids[3] = {1, 2, 3};
  std::atomic<int> rcs[3] = {{1}, {1}, {1}};
};

int answer_id(void *ctx, void *req) { return *static_cast<int *>(req); }

// Holds the helper inside a request until the test opens the gate.
int wait_gate(void *ctx, void *req) {
  auto *sh = static_cast<Shared *>(ctx);
  while (!sh->gate.load()) usleep(100);
  return *static_cast<int *>(req);
}

// Waits until `want` requesters have finished; gives up after `secs` without an answer.
bool finished_within(Shared *sh, int want, int secs) {
  auto until = Clock::now() + std::chrono::seconds(secs);
  for (long seen = sh->answered.load(); sh->finished.load() < want; usleep(1000)) {
    if (sh->answered.load() != seen) {
      seen = sh->answered.load();
      until = Clock::now() + std::chrono::seconds(secs);
    }
    if (Clock::now() > until) return false;
  }
  return true;
}

// Joins the threads if they finished, else leaves them (and sh) to the process's end.
void join_or_leave(std::vector<std::thread> &ts, bool done) {
  for (auto &t : ts) done ? t.join() : t.detach();
}

TEST(SealHelper, ManyRequestersAtOnceEachGetTheirOwnAnswer) {
  auto *sh = new Shared;
  ASSERT_EQ(cxr__seal_helper_start(&sh->h, answer_id, sh), 0);
  constexpr int kThreads = 4, kRounds = 5000;
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; i++)
    ts.emplace_back([sh, i] {
      int me = i + 1;
      for (int k = 0; k < kRounds; k++, sh->answered++)
        if (cxr__seal_helper_ask(&sh->h, &me) != me) sh->wrong++;
      sh->finished++;
    });
  bool done = finished_within(sh, kThreads, 5);
  EXPECT_TRUE(done) << "a requester waits for an answer that never comes";
  EXPECT_EQ(sh->wrong.load(), 0);
  if (done) cxr__seal_helper_stop(&sh->h);
  join_or_leave(ts, done);
  if (done) delete sh;
}

TEST(SealHelper, StopReleasesTheRequestersItHasNotAnswered) {
  auto *sh = new Shared;
  ASSERT_EQ(cxr__seal_helper_start(&sh->h, wait_gate, sh), 0);
  auto ask = [sh](int i) {
    sh->rcs[i] = cxr__seal_helper_ask(&sh->h, &sh->ids[i]);
    sh->finished++;
  };
  std::vector<std::thread> ts;
  ts.emplace_back(ask, 0);
  for (bool held = false; !held; usleep(100)) {  // the helper holds request 1 at the gate
    pthread_mutex_lock(&sh->h.mu);
    held = sh->h.req != nullptr;
    pthread_mutex_unlock(&sh->h.mu);
  }
  ts.emplace_back(ask, 1);  // waits for the slot
  std::thread stop([sh] { cxr__seal_helper_stop(&sh->h); });
  EXPECT_TRUE(finished_within(sh, 2, 5)) << "the stop left a requester waiting";
  EXPECT_EQ(sh->rcs[0].load(), CXR_ECLOSED);  // asked, not answered before the stop
  EXPECT_EQ(sh->rcs[1].load(), CXR_ECLOSED);  // never asked
  sh->gate = 1;  // the helper finishes its request and ends
  stop.join();
  ts.emplace_back(ask, 2);  // after the stop: refused at once
  bool done = finished_within(sh, 3, 5);
  EXPECT_TRUE(done) << "a request after the stop waits for good";
  EXPECT_EQ(sh->rcs[2].load(), CXR_ECLOSED);
  join_or_leave(ts, done);
  if (done) delete sh;
}

}  // namespace
