// An engine closed right after it answered: the answer must still reach a client that reads.
// A server engine of ours and an rdma_peer client process; the client pings (message 20),
// our handler answers (21) and, once UCX has the answer, the test thread closes the engine at
// once. The client must get the answer ("ok"): never lose it ("gone": its endpoint failed
// with no answer; "timeout"). Each case runs kRuns times, a fresh engine each time, for the
// four ways an answer leaves: to a client that came through our listener (an accepted
// endpoint of ours) or from our worker address (a warm connect: only UCX's reply handle), and
// eager (1 byte) or by rendezvous (1 MiB, UCX_RNDV_THRESH 64 for the engine).
#include <gtest/gtest.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/uio.h>

#include <atomic>
#include <string>
#include <vector>

#include <cxrpc/rdma.h>
#include "tests/rdma/peer.h"

namespace {

const int kRuns = 25;

struct Answerer {
  std::vector<char> data;
  std::atomic<int> rc{1};  // the answer's cxr_rdma_reply (1: not answered yet)

  static void on_ping(cxr_rdma_msg *m, void *user) {
    Answerer *a = (Answerer *)user;
    struct iovec iov = {a->data.data(), a->data.size()};
    // Waited for: 0 once UCX counts the answer as finished.
    a->rc.store(cxr_rdma_reply(m, 21, "a", 1, a->data.empty() ? nullptr : &iov,
                               a->data.empty() ? 0 : 1, 0));
  }
};

// One run: a fresh engine, the client connects (twice when `warm`: the second from our worker
// address), pings; the engine is closed as soon as its answer is done. The client's verdict.
std::string answer_then_close(cxrt::Proc &client, bool warm, size_t bytes) {
  Answerer a;
  a.data.assign(bytes, 'z');
  cxr_rdma *r = nullptr;
  int rc = cxrt::open_rndv_server(&r);  // (a reply of 1 byte is eager all the same)
  if (rc) return "open " + std::to_string(rc);
  cxr_rdma_am_set(r, 20, Answerer::on_ping, &a);
  std::string addr = "127.0.0.1:" + std::to_string(cxr_rdma_port(r));
  std::string got = client.ask("connect " + addr + " 5000", 10000);
  if (got == "ok" && warm) got = client.ask("connect " + addr + " 5000", 10000);
  if (got != "ok") {
    cxr_rdma_close(r);
    return "connect: " + got;
  }
  client.say("ping 5000");
  for (int i = 0; i < 5000 && a.rc.load() == 1; i++) usleep(1000);
  int replied = a.rc.load();
  cxr_rdma_close(r);  // right after UCX finished the answer
  got = client.line(10000);
  if (replied != 0) return "reply " + std::to_string(replied) + ", client: " + got;
  return got;
}

void runs(bool warm, size_t bytes) {
  cxrt::Proc client;
  ASSERT_TRUE(client.start({"tests/rdma/rdma_peer", "client"}));
  ASSERT_EQ(client.line(10000), "READY");
  int lost = 0;
  for (int i = 0; i < kRuns; i++) {
    std::string v = answer_then_close(client, warm, bytes);
    if (v != "ok") {
      lost++;
      ADD_FAILURE() << "run " << i << ": " << v;
    }
  }
  printf("%d of %d answers lost\n", lost, kRuns);
  EXPECT_EQ(client.stop(5000), 0) << "the client died";
}

TEST(CloseReply, AnEagerAnswerThroughTheListenerSurvivesTheClose) { runs(false, 0); }
TEST(CloseReply, ARendezvousAnswerThroughTheListenerSurvivesTheClose) { runs(false, 1 << 20); }
TEST(CloseReply, AnEagerAnswerToAWarmClientSurvivesTheClose) { runs(true, 0); }
TEST(CloseReply, ARendezvousAnswerToAWarmClientSurvivesTheClose) { runs(true, 1 << 20); }

}  // namespace
