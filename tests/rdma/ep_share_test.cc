// One endpoint shared by many threads when its peer stops answering and then dies: the
// endpoint ends (its peer killed while stopped) while the others are posting, waiting or
// about to post on it (gets and puts of any size, and atomics, only time out at their
// deadline: the endpoint stays open for them). Every call must end with 0 or a CXR_E* code
// within a bound, nothing may crash (the handle used to be closed and freed under threads
// that had read it), and once the endpoint failed every new call returns its status. Real
// peer process over UCX on TCP (loopback), stopped with SIGSTOP. The other tests: atomics
// that time out leave the endpoint and their target alive, and an endpoint and engine closed
// to a stopped target leave both processes alive (with ops pending: close_silent_test).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <cxrpc/rdma.h>
#include "tests/rdma/peer.h"

namespace {

const int64_t kMs = 1000000, kSec = 1000 * kMs;

bool valid_code(int rc) { return rc == 0 || (rc <= CXR_EINVAL && rc >= CXR_ERRNO_MIN); }

// What one thread does, again and again, on the shared endpoint: one call with `deadline`
// (absolute) returning its code.
struct Kind {
  const char *name;
  int64_t budget;  // each call's deadline, from its start, once the peer is stopped
  std::function<int(int64_t deadline)> call;
};

// Before the peer stops every call has this much time: a short deadline missed on a slow
// machine would end the endpoint before the race this test is about.
const int64_t kCalm = 5 * kSec;

struct Result {
  std::atomic<int> ok{0}, errs{0}, bad{0}, slow{0};
  std::atomic<int> after{1};  // the call made after the endpoint failed (1: none made)
  std::atomic<int> status_then{0};
  std::atomic<int> first_err{0};  // for the log
  std::atomic<bool> done{false};
};

// Loops until the endpoint has failed, then makes one more call, which must return the
// status. A call that takes far longer than its deadline (and the close that may follow
// it) counts as hung; the loop also gives up at `give_up`.
void run(cxr_rdma_ep *ep, const Kind &k, Result &res, const std::atomic<bool> &stopped,
         int64_t give_up) {
  while (cxr_now_ns() < give_up) {
    int64_t t0 = cxr_now_ns(), budget = stopped ? k.budget : kCalm;
    int rc = k.call(t0 + budget);
    if (cxr_now_ns() - t0 > budget + 10 * kSec) res.slow++;
    if (!valid_code(rc)) res.bad++;
    (rc == 0 ? res.ok : res.errs)++;
    if (rc != 0 && res.first_err == 0) res.first_err = rc;
    int st = cxr_rdma_ep_status(ep);
    if (st != 0) {
      res.status_then = st;
      res.after = k.call(cxr_now_ns() + k.budget);
      break;
    }
    if (!strcmp(k.name, "am_post")) usleep(100);  // it does not wait: do not flood
  }
  res.done = true;
}

TEST(RdmaShare, AMissedDeadlineEndsASharedEndpointWithErrorsNotCrashes) {
  cxr_rdma *r;
  ASSERT_EQ(cxr_rdma_open(&r, nullptr), 0);
  std::map<int, int> codes;  // every code seen, for the log
  const int kRounds = 20;
  for (int round = 0; round < kRounds; round++) {
    cxrt::Peer peer;
    ASSERT_TRUE(peer.start());
    cxr_rdma_ep *ep;
    ASSERT_EQ(cxr_rdma_connect(r, peer.addr().c_str(), 0, &ep), 0) << round;
    cxr_rdma_rkey *rk;
    uint64_t base;
    size_t len;
    ASSERT_EQ(cxr_rdma_rkey_get(ep, "mem", &rk, &base, &len), 0);
    // Each thread its own slice of the export (puts and atomics do not disturb the gets).
    auto get = [=](uint64_t off) {
      return [=](int64_t d) {
        unsigned char b[256];
        return cxr_rdma_get(ep, rk, base + off, b, sizeof b, d);
      };
    };
    std::vector<Kind> kinds = {
        {"get 10ms", 10 * kMs, get(0)},
        {"get 15ms", 15 * kMs, get(4096)},
        {"get 400ms", 400 * kMs, get(8192)},
        {"put 300ms", 300 * kMs,
         [=](int64_t d) {
           unsigned char b[4096];
           memset(b, round, sizeof b);
           return cxr_rdma_put(ep, rk, base + 65536, b, sizeof b, d);
         }},
        {"fadd 250ms", 250 * kMs,
         [=](int64_t d) {
           uint64_t old;
           return cxr_rdma_fadd64(ep, rk, base + 131072, 1, &old, d);
         }},
        {"cswap 60ms", 60 * kMs,
         [=](int64_t d) {
           uint64_t old;
           return cxr_rdma_cswap64(ep, rk, base + 131080, 0, 1, &old, d);
         }},
        {"am_send 350ms", 350 * kMs,
         [=](int64_t d) { return cxr_rdma_am_send(ep, 30, "s", 1, nullptr, 0, d); }},
        {"am_post", 0, [=](int64_t) { return cxr_rdma_am_post(ep, 30, "p", 1, nullptr, 0); }},
        {"refresh 200ms", 200 * kMs, [=](int64_t d) { return cxr_rdma_refresh(ep, d); }},
    };
    std::vector<Result> res(kinds.size());
    std::atomic<bool> stopped{false};
    int64_t give_up = cxr_now_ns() + 60 * kSec;
    std::vector<std::thread> ts;
    for (size_t i = 0; i < kinds.size(); i++)
      ts.emplace_back(run, ep, std::cref(kinds[i]), std::ref(res[i]), std::cref(stopped),
                      give_up);
    // Every thread has had a call answered before the peer stops (bounded wait).
    int64_t end = cxr_now_ns() + 20 * kSec;
    for (size_t i = 0; i < res.size(); i++)
      while (res[i].ok.load() == 0 && !res[i].done && cxr_now_ns() < end) usleep(1000);
    ASSERT_EQ(kill(peer.p.pid, SIGSTOP), 0);
    int ws = 0;
    ASSERT_EQ(waitpid(peer.p.pid, &ws, WUNTRACED), peer.p.pid);
    stopped = true;
    // Calls started before the stop may wait up to kCalm; the peer's death (SIGKILL, its
    // sockets reset) ends the endpoint under them (no call's deadline ends it any more).
    peer.p.kill9();
    // The threads end within the bound run() keeps; a hang past it is a failure, and
    // joining a hung thread would hang the test: abort then.
    end = give_up + 15 * kSec;
    for (size_t i = 0; i < res.size(); i++)
      while (!res[i].done && cxr_now_ns() < end) usleep(1000);
    for (size_t i = 0; i < res.size(); i++)
      if (!res[i].done) {
        fprintf(stderr, "round %d: thread %s hung\n", round, kinds[i].name);
        std::abort();
      }
    for (auto &t : ts) t.join();
    int st = cxr_rdma_ep_status(ep);
    EXPECT_NE(st, 0) << "round " << round << ": the endpoint never failed";
    for (size_t i = 0; i < kinds.size(); i++) {
      SCOPED_TRACE(std::string("round ") + std::to_string(round) + ", " + kinds[i].name);
      EXPECT_GT(res[i].ok.load(), 0);
      EXPECT_EQ(res[i].bad.load(), 0) << "a call returned something other than 0 or CXR_E*";
      EXPECT_EQ(res[i].slow.load(), 0) << "a call hung far past its deadline";
      EXPECT_EQ(res[i].status_then.load(), st);
      EXPECT_EQ(res[i].after.load(), st) << "a call after the failure";
      codes[res[i].first_err.load()]++;
    }
    // A key never looked up on this endpoint is refused with its status, not unpacked.
    cxr_rdma_rkey *spare;
    EXPECT_EQ(cxr_rdma_rkey_get(ep, "spare", &spare, nullptr, nullptr), st);
    cxr_rdma_ep_close(ep);
    peer.p.kill9();
  }
  for (auto &c : codes)
    printf("a thread's first error: %s x%d\n",
           c.first ? cxr_strerror(c.first) : "none, it saw the status first", c.second);
  cxr_rdma_close(r);
}

using cxrt::Mem;
using cxrt::connect_mem;
using cxrt::stop;

// A missed deadline of an atomic abandons the request (its reply lands in memory the request
// owns) and leaves the endpoint open. Before, it force-closed the endpoint, and the target of
// UCX 1.13's emulated atomics over TCP aborted when it resumed with several atomic requests
// pending from that endpoint (ucp_atomic_req_handler: "Fatal: unexpected error: Endpoint
// timeout"; 4 runs in 4). Here: 4 threads each let a fadd, a swap and a cswap time out on a
// SIGSTOPped peer; resumed, the peer must live, apply every abandoned atomic, and serve the
// same endpoint and a fresh connection. Under ASan, LSan checks that the abandoned requests
// were freed.
TEST(RdmaShare, TimedOutAtomicsLeaveTheEndpointAndTheirTargetAlive) {
  Mem m;
  ASSERT_NO_FATAL_FAILURE(connect_mem(m));
  cxrt::Peer &peer = m.peer;
  cxr_rdma *r = m.r;
  cxr_rdma_ep *ep = m.ep;
  cxr_rdma_rkey *rk = m.rk;
  uint64_t base = m.base;
  const int kThreads = 4, kFadds = 3;
  // Thread k's words: a counter, a swap target and a cswap target (one cache line each).
  auto word = [&](int k, int i) { return base + 4096 + 64 * (3 * k + i); };
  uint64_t init[kThreads][3];
  for (int k = 0; k < kThreads; k++)
    for (int i = 0; i < 3; i++)
      ASSERT_EQ(cxr_rdma_get(ep, rk, word(k, i), &init[k][i], 8, cxr_now_ns() + 5 * kSec), 0);
  std::atomic<bool> stopped{false};
  std::atomic<int> calm_done{0};
  std::vector<std::vector<int>> late(kThreads);
  std::vector<std::thread> ts;
  for (int k = 0; k < kThreads; k++)
    ts.emplace_back([&, k] {
      uint64_t old;
      // One answered atomic first: the request path works before the stop.
      EXPECT_EQ(cxr_rdma_fadd64(ep, rk, word(k, 0), 0, &old, cxr_now_ns() + kCalm), 0);
      calm_done++;
      for (int64_t end = cxr_now_ns() + 20 * kSec; !stopped && cxr_now_ns() < end;)
        usleep(1000);
      // Several atomics pending at once from this endpoint (4 threads x 5).
      for (int i = 0; i < kFadds; i++)
        late[k].push_back(cxr_rdma_fadd64(ep, rk, word(k, 0), 1, &old, cxr_now_ns() + 50 * kMs));
      late[k].push_back(
          cxr_rdma_swap64(ep, rk, word(k, 1), 100 + k, &old, cxr_now_ns() + 50 * kMs));
      late[k].push_back(cxr_rdma_cswap64(ep, rk, word(k, 2), init[k][2], 200 + k, &old,
                                         cxr_now_ns() + 50 * kMs));
    });
  for (int64_t end = cxr_now_ns() + 20 * kSec; calm_done < kThreads && cxr_now_ns() < end;)
    usleep(1000);
  ASSERT_NO_FATAL_FAILURE(stop(peer));
  stopped = true;
  for (auto &t : ts) t.join();
  for (int k = 0; k < kThreads; k++)
    for (int rc : late[k]) EXPECT_EQ(rc, CXR_ETIMEDOUT) << "thread " << k;
  EXPECT_EQ(cxr_rdma_ep_status(ep), 0) << "a timed-out atomic ended the endpoint";
  ASSERT_EQ(kill(peer.p.pid, SIGCONT), 0);
  // The same endpoint works again, and every abandoned atomic was applied at the target.
  uint64_t old = 0;
  EXPECT_EQ(cxr_rdma_fadd64(ep, rk, word(0, 0), 0, &old, cxr_now_ns() + 10 * kSec), 0);
  for (int k = 0; k < kThreads; k++) {
    uint64_t want[3] = {init[k][0] + kFadds, 100 + (uint64_t)k, 200 + (uint64_t)k}, v[3] = {};
    for (int64_t end = cxr_now_ns() + 10 * kSec; cxr_now_ns() < end; usleep(10000)) {
      bool all = true;
      for (int i = 0; i < 3; i++) {
        if (cxr_rdma_get(ep, rk, word(k, i), &v[i], 8, cxr_now_ns() + 5 * kSec) != 0) v[i] = 0;
        all = all && v[i] == want[i];
      }
      if (all) break;
    }
    for (int i = 0; i < 3; i++) EXPECT_EQ(v[i], want[i]) << "thread " << k << ", word " << i;
  }
  // The target lives on, and serves a new connection.
  ASSERT_FALSE(cxrt::died_within(peer, 1500)) << "the target process died";
  cxr_rdma *r2;
  cxr_rdma_ep *ep2;
  cxr_rdma_rkey *rk2;
  ASSERT_EQ(cxr_rdma_open(&r2, nullptr), 0);
  ASSERT_EQ(cxr_rdma_connect(r2, peer.addr().c_str(), 0, &ep2), 0);
  ASSERT_EQ(cxr_rdma_rkey_get(ep2, "mem", &rk2, nullptr, nullptr), 0);
  EXPECT_EQ(cxr_rdma_fadd64(ep2, rk2, word(0, 0), 1, &old, cxr_now_ns() + 5 * kSec), 0);
  EXPECT_EQ(old, init[0][0] + kFadds);
  cxr_rdma_close(r2);
  cxr_rdma_ep_close(ep);
  cxr_rdma_close(r);
}

// An endpoint (and the engine's pooled endpoints) to a stopped target closed, then the
// engine, with nothing pending (with one-sided ops pending: close_silent_test). Each
// graceful close waits for the target's disconnect, which does not come within its 200 ms
// bound; the close request abandoned to its callback then made ucp_worker_destroy abort
// ("req->flags & UCP_REQUEST_FLAG_RELEASED", 5 runs in 5). Now the close request is released
// to UCX at the bound.
TEST(RdmaShare, ClosingEndpointsToAStoppedTargetAbortsNeitherProcess) {
  Mem m;
  ASSERT_NO_FATAL_FAILURE(cxrt::connect_and_stop(m));
  cxr_rdma_ep_close(m.ep);
  cxr_rdma_close(m.r);
  ASSERT_EQ(kill(m.peer.p.pid, SIGCONT), 0);
  EXPECT_FALSE(cxrt::died_within(m.peer, 1000)) << "the resumed target died";
}

// An endpoint closed with atomics pending at a stopped target is parked (its UCX handle kept
// open for them), not leaked for the engine's life: once the target resumes and answers
// them, the next endpoint close closes it too, and the engine then closes with nothing left
// over (ASan's leak check: nothing kept). cxr_rdma_stats_get counts parked endpoints.
TEST(RdmaShare, AParkedEndpointIsClosedOnceItsOpsFinish) {
  Mem m;
  ASSERT_NO_FATAL_FAILURE(cxrt::connect_and_stop(m));
  uint64_t old;
  for (int i = 0; i < 3; i++)
    EXPECT_EQ(cxr_rdma_fadd64(m.ep, m.rk, m.base + 8192, 1, &old, cxr_now_ns() + 30 * kMs),
              CXR_ETIMEDOUT);
  cxr_rdma_ep_close(m.ep);
  cxr_rdma_stats st;
  ASSERT_EQ(cxr_rdma_stats_get(m.r, &st), 0);
  EXPECT_EQ(st.parked, 1u) << "closed with atomics pending at a stopped target";
  ASSERT_EQ(kill(m.peer.p.pid, SIGCONT), 0);
  // Endpoints opened and closed while the engine's progress thread lets the target's answers
  // in (bounded): one of those closes finds the parked endpoint's ops done and closes it.
  for (int64_t end = cxr_now_ns() + 10 * kSec; st.parked != 0 && cxr_now_ns() < end;) {
    cxr_rdma_ep *ep;
    ASSERT_EQ(cxr_rdma_connect(m.r, m.peer.addr().c_str(), cxr_now_ns() + 5 * kSec, &ep), 0);
    usleep(20000);
    cxr_rdma_ep_close(ep);
    ASSERT_EQ(cxr_rdma_stats_get(m.r, &st), 0);
  }
  EXPECT_EQ(st.parked, 0u) << "the parked endpoint outlived its ops";
  cxr_rdma_close(m.r);
  EXPECT_FALSE(cxrt::died_within(m.peer, 300)) << "the target died";
}

}  // namespace
