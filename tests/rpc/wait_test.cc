// The adaptive waiting policy's verdict (rpc/wait.c), fed clock readings directly: spinning
// that loses the CPU a quarter of the time or more blocks for a while; short gaps from
// light background work, and slow but steady polling (a TSan build), do not.
#include <gtest/gtest.h>

#include "rpc/internal.h"

namespace {

// Spins from `start` for `total` ns, one tick every `tick` ns, with a gap of `gap` ns after
// every `every` ticks (0: none). Returns the time reached.
int64_t spin_for(cxr__waitpol *p, int64_t start, int64_t total, int64_t tick, int64_t gap,
                 int every) {
  cxr__wait_spin_start(p, start);
  int64_t now = start;
  for (int i = 1; now - start < total; i++) {
    now += tick;
    if (every > 0 && i % every == 0) now += gap;
    cxr__wait_tick(p, now);
  }
  return now;
}

const int64_t US = 1000, MS = 1000000;

TEST(Wait, LightBackgroundGapsKeepSpinning) {
  // 0.5 us ticks; a 50 us preemption every 5 ms of spinning: 1 % off the CPU.
  cxr__waitpol p = {};
  int64_t now = spin_for(&p, 1 * MS, 40 * MS, 500, 50 * US, 10000);
  EXPECT_FALSE(cxr__wait_contended(&p, now));
  int64_t spin, yield;
  cxr__wait_windows(&p, now + 1, &spin, &yield);
  EXPECT_GT(spin, 0);
}

TEST(Wait, SharingTheCpuBlocksThenProbesAgain) {
  // 3 ms slices away after every 3 ms of spinning: half the time off the CPU.
  cxr__waitpol p = {};
  int64_t now = spin_for(&p, 1 * MS, 40 * MS, 500, 3 * MS, 6000);
  EXPECT_TRUE(cxr__wait_contended(&p, now));
  int64_t spin = -1, yield = -1;
  cxr__wait_windows(&p, now + 1 * MS, &spin, &yield);
  EXPECT_EQ(spin, 0);  // blocking: no spin, no yield
  EXPECT_EQ(yield, 0);
  cxr__wait_windows(&p, now + 60 * MS, &spin, &yield);  // 50 ms later: probing
  EXPECT_GT(spin, 0);
  // Once the CPU is free again, a few ms of clean spinning outweigh the halved history.
  now = spin_for(&p, now + 60 * MS, 40 * MS, 500, 0, 0);
  EXPECT_FALSE(cxr__wait_contended(&p, now));
}

TEST(Wait, SlowSteadyPollingIsNoGap) {
  // A build that polls 60x slower (TSan): 30 us between ticks, every one of them.
  cxr__waitpol p = {};
  int64_t now = spin_for(&p, 1 * MS, 40 * MS, 30 * US, 0, 0);
  EXPECT_FALSE(cxr__wait_contended(&p, now));
  // ... but losing the CPU still shows there.
  now = spin_for(&p, now, 80 * MS, 30 * US, 4 * MS, 100);
  EXPECT_TRUE(cxr__wait_contended(&p, now));
}

TEST(Wait, TooLittleSpinningGivesNoVerdict) {
  // One long gap in the first spin of a thread is not enough to judge.
  cxr__waitpol p = {};
  int64_t now = spin_for(&p, 1 * MS, 60 * US, 500, 5 * MS, 50);
  EXPECT_FALSE(cxr__wait_contended(&p, now));
}

TEST(Wait, RefusedSleepsBackOffFromNothingTo10MsWhileNothingMoves) {
  // A busy ring's refusals in a row with the same mark (its tail): the first sleeps not at
  // all, then 20 us doubling, capped at 10 ms however long it lasts. A moved tail (a live
  // producer, maybe publishing without having seen us) starts again with no sleep.
  cxr__busy b = {};
  EXPECT_EQ(cxr__busy_sleep_ns(&b, 7), 0);
  EXPECT_EQ(cxr__busy_sleep_ns(&b, 7), 20 * US);
  EXPECT_EQ(cxr__busy_sleep_ns(&b, 7), 40 * US);
  int64_t t = 0;
  for (int i = 0; i < 100; i++) t = cxr__busy_sleep_ns(&b, 7);
  EXPECT_EQ(t, 10 * MS);
  EXPECT_EQ(cxr__busy_sleep_ns(&b, 8), 0);
  EXPECT_EQ(cxr__busy_sleep_ns(&b, 8), 20 * US);
  b.n = 0;  // progress (a call handled, an unrefused sleep): from the start again
  EXPECT_EQ(cxr__busy_sleep_ns(&b, 8), 0);
}

}  // namespace
