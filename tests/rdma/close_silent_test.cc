// Closing an endpoint and then its engine while one-sided ops are still pending at a target
// that stays stopped through every bounded wait: neither process may abort. Its own binary,
// because the engine's UCX worker is left undestroyed on purpose then (rdma/worker.c,
// leave_to_ucx), which the sanitizers see as UCX's own trouble at exit; the suppressions
// below are compiled into this binary only.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <string>
#include <vector>

#include <cxrpc/rdma.h>
#include "tests/rdma/peer.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

// tests/rdma/queued.c
extern "C" size_t cxrt_rdma_queued(cxr_rdma *r);
extern "C" unsigned cxrt_rdma_left_to_ucx(void);
extern "C" int cxrt_rdma_am_set_inline(cxr_rdma *r, unsigned id, cxr_rdma_am_fn fn, void *user);
extern "C" int cxrt_rdma_bare_recvs(cxr_rdma *r);
extern "C" int cxrt_rdma_ep_recvs(cxr_rdma_ep *ep);
extern "C" int cxrt_rdma_recvs(cxr_rdma *r);
extern "C" uint64_t cxrt_rdma_refused_closing(cxr_rdma *r);
extern "C" cxr_rdma_ep *cxrt_rdma_msg_ref(cxr_rdma_msg *m);
extern "C" void cxrt_rdma_ep_end(cxr_rdma_ep *ep, void (*fn)(void *arg, void *u), void *arg);
extern "C" void *cxrt_rdma_post_on(void *u, unsigned id, const void *hdr, size_t hlen,
                                   const void *data, size_t len);
extern "C" bool cxrt_rdma_req_done(void *req);
extern "C" unsigned cxrt_rdma_progress(cxr_rdma *r);
extern "C" unsigned cxrt_rdma_ep_ends_in(void);
extern "C" bool cxrt_rdma_ep_closing(cxr_rdma_ep *ep);
extern "C" unsigned cxrt_rdma_orphans(cxr_rdma *r, unsigned *idle);

// LeakSanitizer: the engine stays reachable, but UCX keeps its endpoints in mmap'd pools it
// does not scan, so what they point to (the endpoints' extensions, the client's socket
// connection manager endpoint) looks leaked. UCX has no frame pointers: a fast unwind would
// stop at ucs_malloc, before the frames named here.
extern "C" const char *__lsan_default_options() { return "fast_unwind_on_malloc=0"; }
extern "C" const char *__lsan_default_suppressions() {
  return "leak:ucp_ep_create_base\nleak:uct_tcp_sockcm_ep_create\n";
}
// ThreadSanitizer: at exit, UCX's library destructor destroys the async context's lock while
// UCX's async thread, alive for the worker left in place, still takes it.
extern "C" const char *__tsan_default_suppressions() {
  return "race:ucs_async_remove_handler\n";
}

namespace {

const int64_t kMs = 1000000, kSec = 1000 * kMs;

using cxrt::Mem;

// One-sided ops abandoned at their deadline (atomics, a 256 KiB get and put in chunks), and
// given `with_send` a 1 MiB message too, then their endpoint and engine closed while the
// target is still stopped; the target, resumed, must live and serve a new engine's
// connection.
void close_with_pending_then_resume(bool with_send) {
  Mem m;
  ASSERT_NO_FATAL_FAILURE(cxrt::connect_and_stop(m));
  uint64_t old;
  for (int i = 0; i < 4; i++)
    EXPECT_EQ(
        cxr_rdma_fadd64(m.ep, m.rk, m.base + 8192 + 64 * i, 1, &old, cxr_now_ns() + 30 * kMs),
        CXR_ETIMEDOUT);
  std::vector<unsigned char> b(256 << 10, 0x5a);
  EXPECT_EQ(cxr_rdma_get(m.ep, m.rk, m.base + (1 << 20), b.data(), b.size(),
                         cxr_now_ns() + 30 * kMs),
            CXR_ETIMEDOUT);
  EXPECT_EQ(cxr_rdma_put(m.ep, m.rk, m.base + (2 << 20), b.data(), b.size(),
                         cxr_now_ns() + 30 * kMs),
            CXR_ETIMEDOUT);
  std::vector<unsigned char> big(1 << 20, 0x33);  // kept until the engine is closed
  struct iovec iov = {big.data(), big.size()};
  if (with_send) {
    EXPECT_EQ(cxr_rdma_am_send(m.ep, CXR_RDMA_AM_USER_MIN, nullptr, 0, &iov, 1,
                               cxr_now_ns() + 30 * kMs),
              CXR_ETIMEDOUT);
  }
  EXPECT_EQ(cxr_rdma_ep_status(m.ep), 0);
  int64_t t0 = cxr_now_ns();
  cxr_rdma_ep_close(m.ep);
  cxr_rdma_close(m.r);
  printf("closing with ops pending at a stopped target took %.0f ms\n",
         (cxr_now_ns() - t0) / 1e6);
  ASSERT_EQ(kill(m.peer.p.pid, SIGCONT), 0);
  ASSERT_FALSE(cxrt::died_within(m.peer, 1500)) << "the resumed target died";
  cxr_rdma *r2;
  cxr_rdma_ep *ep2;
  cxr_rdma_rkey *rk2;
  uint64_t base2;
  ASSERT_EQ(cxr_rdma_open(&r2, nullptr), 0);
  ASSERT_EQ(cxr_rdma_connect(r2, m.peer.addr().c_str(), cxr_now_ns() + 10 * kSec, &ep2), 0);
  ASSERT_EQ(cxr_rdma_rkey_get(ep2, "mem", &rk2, &base2, nullptr), 0);
  EXPECT_EQ(cxr_rdma_fadd64(ep2, rk2, base2 + 8192, 0, &old, cxr_now_ns() + 10 * kSec), 0);
  cxr_rdma_close(r2);
  EXPECT_FALSE(cxrt::died_within(m.peer, 100)) << "the target died";
}

// The endpoint's close waits 200 ms for the ops; they do not finish, so its UCX handle is
// parked on the engine instead of force-closed, and cxr_rdma_close, with ops still pending
// on it after another bounded wait, leaves the UCX worker and context undestroyed (a
// logged, bounded leak). Before (force close at the endpoint's close) it failed 5 runs in 5:
// 3 with cxr_rdma_close aborting in ucp_worker_destroy ("req->flags &
// UCP_REQUEST_FLAG_RELEASED"), 2 with the resumed target aborting ("Endpoint timeout").
TEST(RdmaClose, ClosingWithOpsPendingAtAStoppedTargetAbortsNeitherProcess) {
  close_with_pending_then_resume(false);
}

// The same with a message left too: the endpoint is parked all the same. A first version of
// counting messages at the close (2026-11-28) force-closed such an endpoint, and the resumed
// target died 3 runs in 3 (found by a review of it).
TEST(RdmaClose, ClosingWithOpsAndASendPendingAtAStoppedTargetAbortsNeitherProcess) {
  close_with_pending_then_resume(true);
}

// A reply posted to a client that reached the engine from its worker address (a warm
// connect: no accepted endpoint of ours, only UCX's reply handle), 1 MiB by rendezvous, with
// the client stopped so that it stays with UCX; then the engine closes. Such replies went
// uncounted, and cxr_rdma_close destroyed the worker under it and aborted (UCX 1.13:
// "ucs_hlist_is_empty(&ucp_ep_ext_gen(ep)->proto_reqs)" in ucp_ep.c, 4 runs in 4). The
// engine counts them now, progresses the worker up to 1 s at the close, and leaves the
// worker undestroyed when one is still pending (a logged, bounded leak: this binary, for
// its sanitizer suppressions). The client stays stopped throughout.
TEST(RdmaClose, ClosingWithAReplyPendingToAStoppedWarmClientDoesNotAbort) {
  cxrt::WarmAsk w;
  ASSERT_NO_FATAL_FAILURE(cxrt::warm_ask(w));
  ASSERT_EQ(kill(w.client.pid, SIGSTOP), 0);
  int ws = 0;
  ASSERT_EQ(waitpid(w.client.pid, &ws, WUNTRACED), w.client.pid);
  // UCX may hold it as long as the worker lives, which is to the end of the process here.
  static std::vector<char> data(1 << 20, 's');
  struct iovec iov = {data.data(), data.size()};
  EXPECT_EQ(cxr_rdma_reply(w.m.load(), 21, "a", 1, &iov, 1, cxr_now_ns() + 20 * kMs),
            CXR_ETIMEDOUT);
  cxr_rdma_msg_free(w.m.load());
  int64_t t0 = cxr_now_ns();
  cxr_rdma_close(w.r);  // aborted here
  EXPECT_LT(cxr_now_ns() - t0, 3 * kSec) << "the close is bounded";
  w.client.kill9();
}


// ---- Closing an engine while a large message arrives ----
// An rdma_peer client sends 64 MiB (message 20, its `sendgone` with a 3 s deadline) to a
// server engine of ours (UCX_RNDV_THRESH 64); as soon as the engine has admitted it (its
// bytes are counted while the rendezvous receive runs) the engine is closed, with the client
// still sending or stopped (resumed after the close). The receive UCX holds must be ended or
// waited for, its buffer freed once (or, to a stopped warm client, left reachable with the
// worker), nothing freed touched (ASan), the close bounded, and the client must live. On the
// old code every case but the first aborted in ucp_worker_destroy (UCX 1.13: proto_reqs not
// empty in ucp_ep.c), 3 in 3.
const int kRecvRuns = 3;

std::atomic<int> handled{0};
void on_big(cxr_rdma_msg *, void *) { handled.fetch_add(1); }

// One run; true if the receive was still in flight when the close began.
bool close_while_receiving(bool warm, bool stop_client) {
  cxr_rdma *r = nullptr;
  int rc = cxrt::open_rndv_server(&r);
  EXPECT_EQ(rc, 0);
  if (rc) return false;
  EXPECT_EQ(cxr_rdma_am_set(r, 20, on_big, nullptr), 0);
  cxrt::Proc c;
  cxrt::start_client(c, r, warm);
  if (testing::Test::HasFatalFailure()) {
    cxr_rdma_close(r);
    return false;
  }
  int before = handled.load();
  c.say("sendgone 67108864 3000");
  int64_t end = cxr_now_ns() + 5 * kSec;
  // Until UCX holds the receive (admitted bytes count from before it is posted).
  while (cxrt_rdma_recvs(r) == 0 && handled.load() == before && cxr_now_ns() < end) {
  }
  bool stopped = false;
  if (stop_client) {
    stopped = kill(c.pid, SIGSTOP) == 0;
    int ws = 0;
    if (stopped) {
      EXPECT_EQ(waitpid(c.pid, &ws, WUNTRACED), c.pid);
    }
  }
  // In flight: a receive UCX still holds, counted on the engine or an endpoint. (Bytes
  // admitted and not handled also count a message whose receive is done and that waits in
  // the queue for its handler, with nothing left to UCX: a review.)
  bool in_flight = cxrt_rdma_recvs(r) != 0;
  bool waits = cxrt_rdma_queued(r) != 0 && handled.load() == before;
  int64_t t0 = cxr_now_ns();
  cxr_rdma_close(r);
  int64_t took = cxr_now_ns() - t0;
  printf("in flight %d (admitted, unhandled %d), the close took %.1f ms\n", in_flight, waits,
         took / 1e6);
  EXPECT_LT(took, 3 * kSec) << "the close is bounded";
  if (stopped) kill(c.pid, SIGCONT);
  std::string a = c.line(15000);
  EXPECT_EQ(a.rfind("closed ", 0), 0u) << "the client died: " << a;
  EXPECT_EQ(c.stop(5000), 0) << "the client died";
  return in_flight;
}

void runs(bool warm, bool stop_client) {
  int in_flight = 0;
  for (int i = 0; i < kRecvRuns; i++) in_flight += close_while_receiving(warm, stop_client);
  printf("%d of %d closes with the receive in flight\n", in_flight, kRecvRuns);
  if (in_flight == 0) GTEST_SKIP() << "every message arrived before the close: nothing checked";
}

// ---- Closing an engine while a warm client sends large messages back to back ----
// An rdma_peer client that reached the engine from its worker address (a warm connect:
// receives from it count on the engine, bare_recvs) posts 2 MiB messages every 200 us
// without waiting (its `stream`: more than the engine takes in, so one is always on its way),
// by rendezvous, to a handler that frees each at once (inline: none waits in the engine's
// queue, which would fill and refuse the rest). The engine is closed mid-stream, 8 times.
// Its close must end with the worker destroyed, not leave it to UCX (rdma/worker.c,
// leave_to_ucx): it waits up to 1 s for the receives under way and refuses the ones that
// arrive meanwhile. Before 4435e1c it started those too, so the count seldom reached 0: the
// close waited out its 1 s and left the worker undestroyed (a review of 909cf15).
std::atomic<int> streamed{0};
void on_streamed(cxr_rdma_msg *, void *) { streamed.fetch_add(1); }

TEST(RdmaClose, AWarmClientSendingBackToBackDoesNotKeepTheWorkerFromItsEnd) {
  for (int run = 0; run < 8; run++) {
    cxr_rdma *r = nullptr;
    ASSERT_EQ(cxrt::open_rndv_server(&r, 32 << 20), 0);  // 16 receives under way at most
    ASSERT_EQ(cxrt_rdma_am_set_inline(r, 20, on_streamed, nullptr), 0);
    cxrt::Proc c;
    ASSERT_NO_FATAL_FAILURE(cxrt::start_client(c, r, true));
    int before = streamed.load();
    ASSERT_TRUE(c.say("stream 2097152 8000"));
    int64_t end = cxr_now_ns() + 5 * kSec;
    while (streamed.load() < before + 16 && cxr_now_ns() < end) usleep(1000);
    ASSERT_GE(streamed.load(), before + 16) << "the stream did not come";
    unsigned left = cxrt_rdma_left_to_ucx();
    int64_t t0 = cxr_now_ns();
    cxr_rdma_close(r);
    int64_t took = cxr_now_ns() - t0;
    printf("run %d: %d messages, the close took %.1f ms\n", run, streamed.load() - before,
           took / 1e6);
    EXPECT_EQ(cxrt_rdma_left_to_ucx(), left) << "the close left the worker to UCX";
    EXPECT_LT(took, 3 * kSec) << "the close is bounded";
    std::string a = c.line(15000);
    EXPECT_EQ(a.rfind("streamed ", 0), 0u) << "the client died: " << a;
    EXPECT_EQ(c.stop(5000), 0) << "the client died";
  }
}

TEST(RdmaClose, ThroughTheListenerWhileTheClientSends) { runs(false, false); }
TEST(RdmaClose, ThroughTheListenerWithTheClientStopped) { runs(false, true); }
TEST(RdmaClose, FromAWarmClientWhileItSends) { runs(true, false); }
TEST(RdmaClose, FromAWarmClientWithItStopped) { runs(true, true); }


// ---- Closing an endpoint of ours while a large message arrives on it ----
// Our engine connects to an rdma_peer server and sends it 64 MiB (message 20), which the
// peer echoes back (21) by rendezvous; then the peer is stopped mid-send and our endpoint
// closed. The receive UCX holds must count on that endpoint, whose close (200 ms, then
// forced) cancels it: none may be left on the engine after the endpoint's close, and the
// engine's close must then destroy the worker. It counted on the engine (bare_recvs:
// cxr__ep_hold found only accepted endpoints), so the endpoint's close was graceful, gave up
// at 200 ms with the receive and its 64 MiB buffer still with UCX, and the engine's close
// left the worker undestroyed (a review of 909cf15). The peer, resumed, must live.
std::atomic<int> echoed{0};
void on_echoed(cxr_rdma_msg *, void *) { echoed.fetch_add(1); }

// One run; true if the receive was still in flight when the endpoint's close began. Given
// `at_admission`, the peer is stopped and the endpoint closed as soon as the echo is admitted
// (its bytes counted), before the receive is posted and counted (see below).
bool close_ours_while_receiving(std::vector<char> &big, bool at_admission = false) {
  cxrt::Peer peer;
  cxr_rdma *r = nullptr;
  cxr_rdma_ep *ep = nullptr;
  EXPECT_NO_FATAL_FAILURE(cxrt::open_and_connect(peer, &r, &ep));
  if (ep == nullptr) {
    cxr_rdma_close(r);
    return false;
  }
  EXPECT_EQ(cxr_rdma_am_set(r, 21, on_echoed, nullptr), 0);
  int before = echoed.load();
  struct iovec iov = {big.data(), big.size()};
  EXPECT_EQ(cxr_rdma_am_send(ep, 20, "b", 1, &iov, 1, cxr_now_ns() + 10 * kSec), 0);
  int64_t end = cxr_now_ns() + 5 * kSec;
  // Until UCX holds the receive: it is counted after its buffer is allocated (64 MiB: under
  // ASan the endpoint's close began before that when the peer was stopped at the admission).
  auto recvs = [&] { return cxrt_rdma_ep_recvs(ep) + cxrt_rdma_bare_recvs(r); };
  auto started = [&] { return at_admission ? cxrt_rdma_queued(r) != 0 : recvs() != 0; };
  while (!started() && echoed.load() == before && cxr_now_ns() < end) {
  }
  bool in_flight = false;
  if (at_admission) {  // no wait for the stop: the close begins while the receive is set up
    in_flight = echoed.load() == before;
    EXPECT_EQ(kill(peer.p.pid, SIGSTOP), 0);
  } else {
    EXPECT_NO_FATAL_FAILURE(cxrt::stop(peer));
    in_flight = recvs() != 0;
  }
  int64_t t0 = cxr_now_ns();
  cxr_rdma_ep_close(ep);
  double took = (cxr_now_ns() - t0) / 1e6;
  int left_on_engine = cxrt_rdma_bare_recvs(r);
  unsigned left = cxrt_rdma_left_to_ucx();
  if (at_admission) {
    int ws = 0;
    EXPECT_EQ(waitpid(peer.p.pid, &ws, WUNTRACED), peer.p.pid);
  }
  cxr_rdma_close(r);
  printf("in flight %d, the endpoint's close took %.1f ms\n", in_flight, took);
  EXPECT_EQ(left_on_engine, 0) << "the receive outlived its endpoint's close";
  EXPECT_EQ(cxrt_rdma_left_to_ucx(), left) << "the engine's close left the worker to UCX";
  EXPECT_EQ(kill(peer.p.pid, SIGCONT), 0);
  EXPECT_FALSE(cxrt::died_within(peer, 1500)) << "the resumed peer died";
  return in_flight;
}

void close_ours_runs(int n, bool at_admission) {
  std::vector<char> big(64 << 20, 'e');
  int in_flight = 0;
  for (int i = 0; i < n; i++) in_flight += close_ours_while_receiving(big, at_admission);
  printf("%d of %d closes with the receive in flight\n", in_flight, n);
  if (in_flight == 0) GTEST_SKIP() << "every echo arrived before the close: nothing checked";
}

TEST(RdmaClose, ClosingOurEndpointEndsALargeMessageArrivingOnIt) {
  close_ours_runs(kRecvRuns, false);
}

// The endpoint's close begun while the echo's receive is being set up: admitted (counted in
// the engine's queued bytes) on the progress thread, its 64 MiB buffer being allocated, its
// receive not yet posted nor counted. The close found the endpoint idle and chose a graceful
// close; the receive, posted then, found no endpoint of ours on its handle and counted on the
// engine: the endpoint's close gave up at 200 ms with it in UCX and the engine's close left
// the worker undestroyed. A rendezvous message on an endpoint whose close has begun is now
// refused. The race is not forced: under ASan the allocation is slow enough that every close
// here hit it (the earlier helper: 9 in 9); a plain build seldom does. The run passes on the
// new code either way.
TEST(RdmaClose, ClosingOurEndpointAsALargeMessageIsAdmittedRefusesIt) {
  close_ours_runs(3 * kRecvRuns, true);
}

// ---- A message arriving while a missed deadline closes our endpoint's handle ----
// cxr__ep_end (a one-sided op's missed deadline) takes the UCX handle out of the endpoint,
// then closes it: a message may still arrive on the handle in between. The test forces it
// there (the window hook): on the handle, it sends the rdma_peer server a small message and
// a 1 MiB one (message 20, echoed as 21; the peer's echoes of 64 bytes and more go by
// rendezvous), and progresses until both echoes came in. Both must hold the endpoint: the
// large one's receive is refused (the handle is being closed), the small one, kept, cannot
// be answered (CXR_ENOTCONN). Before, the endpoint was found by its handle field alone,
// which the window had cleared: the small echo held no endpoint (a reply would have gone
// bare on the closed handle) and the large one's receive ran, counted on the engine.
struct Window {
  cxr_rdma *r = nullptr;
  uint64_t refused0 = 0;
  std::atomic<cxr_rdma_msg *> small{nullptr};
  std::atomic<int> large{0};
  int bare_seen = 0;
  bool both = false;
};

void on_window_echo(cxr_rdma_msg *m, void *user) {
  Window *w = (Window *)user;
  size_t hl = 0;
  const char *h = (const char *)cxr_rdma_msg_hdr(m, &hl);
  if (hl == 1 && h[0] == 's') {
    cxr_rdma_msg_keep(m);
    w->small.store(m);
  } else {
    w->large.fetch_add(1);
  }
}

void in_window(void *arg, void *u) {
  Window *w = (Window *)arg;
  static std::vector<char> big(1 << 20, 'w');
  void *rs = cxrt_rdma_post_on(u, 20, "s", 1, nullptr, 0);
  void *rb = cxrt_rdma_post_on(u, 20, "b", 1, big.data(), big.size());
  int64_t end = cxr_now_ns() + 10 * kSec;
  while (cxr_now_ns() < end) {
    cxrt_rdma_progress(w->r);
    if (rs && cxrt_rdma_req_done(rs)) rs = nullptr;  // given back to UCX: not polled again
    if (rb && cxrt_rdma_req_done(rb)) rb = nullptr;
    bool sent = rs == nullptr && rb == nullptr;
    w->bare_seen = std::max(w->bare_seen, cxrt_rdma_bare_recvs(w->r));
    bool large_in = cxrt_rdma_refused_closing(w->r) != w->refused0 || w->large.load() != 0;
    if (sent && large_in && w->small.load() != nullptr) {
      w->both = true;
      return;
    }
  }
}

TEST(RdmaClose, AMessageInAMissedDeadlinesCloseWindowHoldsItsEndpoint) {
  cxrt::Peer peer;
  ASSERT_TRUE(peer.start({"UCX_RNDV_THRESH=64"}));
  Window w;
  cxr_rdma_ep *ep = nullptr;
  ASSERT_EQ(cxr_rdma_open(&w.r, nullptr), 0);
  ASSERT_EQ(cxr_rdma_connect(w.r, peer.addr().c_str(), cxr_now_ns() + 10 * kSec, &ep), 0);
  ASSERT_EQ(cxr_rdma_am_set(w.r, 21, on_window_echo, &w), 0);
  w.refused0 = cxrt_rdma_refused_closing(w.r);
  cxrt_rdma_ep_end(ep, in_window, &w);
  EXPECT_EQ(cxr_rdma_ep_status(ep), CXR_ENOTCONN);
  ASSERT_TRUE(w.both) << "the echoes did not come within 10 s";
  cxr_rdma_msg *m = w.small.load();
  EXPECT_EQ(cxrt_rdma_msg_ref(m), ep) << "the small echo holds no endpoint";
  EXPECT_EQ(cxrt_rdma_refused_closing(w.r), w.refused0 + 1) << "the large echo was not refused";
  EXPECT_EQ(w.large.load(), 0) << "the large echo was received";
  EXPECT_EQ(w.bare_seen, 0) << "the large echo's receive counted on the engine";
  if (cxrt_rdma_msg_ref(m) == ep) {  // else the reply would post on the closed UCX handle
    EXPECT_EQ(cxr_rdma_reply(m, 22, "r", 1, nullptr, 0, cxr_now_ns() + kSec), CXR_ENOTCONN);
  }
  cxr_rdma_msg_free(m);
  cxr_rdma_ep_close(ep);
  cxr_rdma_close(w.r);
  EXPECT_FALSE(cxrt::died_within(peer, 100)) << "the peer died";
}

// ---- An endpoint whose requests outlive its close ----
// A missed deadline's close of the endpoint's handle (cxr__ep_end) held in its window, its
// handle taken out and not yet closed, while the user closes the endpoint with a 64 MiB post
// still pending to a stopped peer. The user's close waits for that close (1.1 s), gives up,
// and returns with the post and that close still under way; once the window is let go, the
// force close cancels the post. The endpoint must then be freed by the last of them. It was
// kept for good (ep_close_free: "its memory is kept"): LeakSanitizer reported it here under
// ASan (a plain build runs the same path, unchecked).
struct Gate {
  std::atomic<bool> in{false}, go{false};
};

void hold_window(void *arg, void *) {
  Gate *g = (Gate *)arg;
  g->in.store(true);
  int64_t end = cxr_now_ns() + 10 * kSec;
  while (!g->go.load() && cxr_now_ns() < end) usleep(1000);
}

// Not inlined: no copy of the endpoint's address stays in a live frame for the leak check.
__attribute__((noinline)) void close_under_a_held_end(double *took_ms) {
  cxrt::Peer peer;
  cxr_rdma *r = nullptr;
  cxr_rdma_ep *ep = nullptr;
  ASSERT_NO_FATAL_FAILURE(cxrt::open_and_connect(peer, &r, &ep));
  ASSERT_NO_FATAL_FAILURE(cxrt::stop(peer));
  static std::vector<char> big(64 << 20, 'h');  // UCX may read it until the handle's close
  struct iovec iov = {big.data(), big.size()};
  EXPECT_EQ(cxr_rdma_am_post(ep, 20, "h", 1, &iov, 1), 0);
  Gate g;
  std::thread t([ep, &g] { cxrt_rdma_ep_end(ep, hold_window, &g); });
  for (int i = 0; i < 10000 && !g.in.load(); i++) usleep(1000);
  EXPECT_TRUE(g.in.load()) << "the missed deadline's close did not reach its window";
  int64_t t0 = cxr_now_ns();
  cxr_rdma_ep_close(ep);
  *took_ms = (cxr_now_ns() - t0) / 1e6;
  g.go.store(true);
  t.join();
  // The endpoint waits on the engine's orphans until its last request ends, which frees it.
  // UCX 1.13 may never end the force-closed 64 MiB send (the engine's close then leaves the
  // worker to UCX, the endpoint reachable there), but an orphan with no request left is
  // the regression: an endpoint its last request did not free (LeakSanitizer cannot see it
  // then, so it is counted here).
  unsigned idle = 0, orphans = cxrt_rdma_orphans(r, &idle);
  for (int i = 0; i < 200 && orphans != 0 && idle == 0; i++) {
    usleep(10000);
    orphans = cxrt_rdma_orphans(r, &idle);
  }
  EXPECT_EQ(idle, 0u) << "a closed endpoint with no request left was not freed";
  unsigned left = cxrt_rdma_left_to_ucx();
  cxr_rdma_close(r);
  if (orphans == 0) {
    EXPECT_EQ(cxrt_rdma_left_to_ucx(), left) << "the close left the worker";
  }
  EXPECT_EQ(kill(peer.p.pid, SIGCONT), 0);
  EXPECT_FALSE(cxrt::died_within(peer, 200)) << "the resumed peer died";
}

TEST(RdmaClose, AnEndpointWhoseRequestsOutliveItsCloseIsFreedByTheLast) {
  double took = 0;
  ASSERT_NO_FATAL_FAILURE(close_under_a_held_end(&took));
  printf("the endpoint's close took %.0f ms\n", took);
  // It waited for the held close (1.1 s) and returned before it: the path under test.
  EXPECT_GT(took, 1000) << "the close did not wait for the missed deadline's close";
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_EQ(__lsan_do_recoverable_leak_check(), 0) << "the endpoint was never freed";
#endif
}

// ---- Two missed deadlines on one endpoint and the user's close ----
// One thread's missed deadline holds its close of the handle in its window; the user closes
// the endpoint meanwhile, and 500 ms later a second thread's missed deadline finds no handle
// and waits for that close (wait_closed). The user's close gives up (1.1 s) and returns, the
// first close is let go, and the endpoint must outlive the second thread's wait: the first
// close freed it (its hold was the last) while the second still polled it, and ASan reported
// a heap-use-after-free in wait_closed every run. The 500 ms only make the second wait
// outlast the user's close (the path under test); the first close is let go only once both
// ends hold the endpoint, whatever the timing.
__attribute__((noinline)) void two_ends_and_a_close() {
  cxrt::Peer peer;
  cxr_rdma *r = nullptr;
  cxr_rdma_ep *ep = nullptr;
  ASSERT_NO_FATAL_FAILURE(cxrt::open_and_connect(peer, &r, &ep));
  unsigned in0 = cxrt_rdma_ep_ends_in();
  Gate g;
  std::thread t1([ep, &g] { cxrt_rdma_ep_end(ep, hold_window, &g); });
  for (int i = 0; i < 10000 && !g.in.load(); i++) usleep(1000);
  EXPECT_TRUE(g.in.load()) << "the first missed deadline's close did not reach its window";
  std::atomic<bool> closed{false};
  std::thread t2([ep, &closed] {
    cxr_rdma_ep_close(ep);
    closed.store(true);
  });
  // The second end starts once the user's close has begun (its 1.1 s wait under way), so
  // that the second end's own wait outlasts it.
  for (int i = 0; i < 10000 && !cxrt_rdma_ep_closing(ep); i++) usleep(1000);
  usleep(500 * 1000);
  std::thread t3([ep] { cxrt_rdma_ep_end(ep, nullptr, nullptr); });
  for (int i = 0; i < 10000 && !(closed.load() && cxrt_rdma_ep_ends_in() == in0 + 2); i++)
    usleep(1000);
  EXPECT_TRUE(closed.load()) << "the user's close did not return";
  g.go.store(true);
  t1.join();
  t2.join();
  t3.join();
  cxr_rdma_close(r);
}

TEST(RdmaClose, AMissedDeadlineWaitingForAnothersCloseOutlivesTheUsersClose) {
  ASSERT_NO_FATAL_FAILURE(two_ends_and_a_close());
}

// ---- A message in that window while the user's close waits for it ----
// A missed deadline's close held in its window, and the user's close begun meanwhile (the
// endpoint on r->closing_eps, its close waiting for the missed deadline's): a small message
// posted on the taken-out handle to the rdma_peer server, its echo must hold the endpoint.
// closing_begin recorded the handle it closes (closing_uep) from the endpoint, already NULL
// then, and ep_on looked for the handle on r->eps only by the copy kept for such a close: the
// echo held no endpoint (a reply would have gone bare on the closing handle, a rendezvous
// receive on the engine), every run. The echo must come before the user's close gives up
// waiting (1.1 s): a loopback echo takes milliseconds.
struct Overlap {
  cxr_rdma *r = nullptr;
  cxr_rdma_ep *ep = nullptr;
  std::atomic<bool> in{false}, closed{false}, late{false};
  std::atomic<int> got{0};
  std::atomic<cxr_rdma_ep *> ref{nullptr};
};

void on_overlap_echo(cxr_rdma_msg *m, void *user) {
  Overlap *o = (Overlap *)user;
  o->late.store(o->closed.load());  // (closed: the user's close returned, it gave up)
  o->ref.store(cxrt_rdma_msg_ref(m));
  o->got.fetch_add(1);
}

void in_overlap_window(void *arg, void *u) {
  Overlap *o = (Overlap *)arg;
  o->in.store(true);
  int64_t end = cxr_now_ns() + 10 * kSec;
  while (!cxrt_rdma_ep_closing(o->ep) && cxr_now_ns() < end) usleep(1000);
  void *rs = cxrt_rdma_post_on(u, 20, "s", 1, nullptr, 0);
  while (cxr_now_ns() < end && (o->got.load() == 0 || rs != nullptr)) {
    cxrt_rdma_progress(o->r);
    if (rs && cxrt_rdma_req_done(rs)) rs = nullptr;  // given back to UCX: not polled again
  }
}

TEST(RdmaClose, AMessageInTheWindowWhileTheUsersCloseWaitsHoldsItsEndpoint) {
  cxrt::Peer peer;
  ASSERT_TRUE(peer.start());
  Overlap o;
  ASSERT_EQ(cxr_rdma_open(&o.r, nullptr), 0);
  ASSERT_EQ(cxr_rdma_connect(o.r, peer.addr().c_str(), cxr_now_ns() + 10 * kSec, &o.ep), 0);
  ASSERT_EQ(cxr_rdma_am_set(o.r, 21, on_overlap_echo, &o), 0);
  cxr_rdma_ep *ep = o.ep;
  std::thread t1([ep, &o] { cxrt_rdma_ep_end(ep, in_overlap_window, &o); });
  for (int i = 0; i < 10000 && !o.in.load(); i++) usleep(1000);
  EXPECT_TRUE(o.in.load()) << "the missed deadline's close did not reach its window";
  std::thread t2([ep, &o] {
    cxr_rdma_ep_close(ep);
    o.closed.store(true);
  });
  t2.join();
  t1.join();
  int got = o.got.load();
  bool late = o.late.load();
  cxr_rdma_ep *ref = o.ref.load();
  cxr_rdma_close(o.r);
  EXPECT_FALSE(cxrt::died_within(peer, 100)) << "the peer died";
  ASSERT_EQ(got, 1) << "the echo did not come within 10 s";
  // A machine so loaded that a loopback echo took over 1.1 s has not tested the window.
  if (late) GTEST_SKIP() << "the echo came only after the user's close gave up";
  EXPECT_EQ(ref, ep) << "the echo held no endpoint";
}

}  // namespace
