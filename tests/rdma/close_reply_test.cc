// An engine closed right after it answered: the answer must still reach a client that reads.
// A server engine of ours and an rdma_peer client process; the client pings (message 20),
// our handler answers (21) and, once UCX has the answer, the test thread closes the engine at
// once. The client must get the answer ("ok"): never lose it ("gone": its endpoint failed
// with no answer; "timeout"). Each case runs kRuns times, a fresh engine each time, for the
// four ways an answer leaves: to a client that came through our listener (an accepted
// endpoint of ours) or from our worker address (a warm connect: only UCX's reply handle), and
// eager (1 byte) or by rendezvous (1 MiB, UCX_RNDV_THRESH 64 for the engine); and a large
// eager one to a warm client through small socket buffers.
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

// A way of answering: the engine's UCX settings (nullptr: cxrt::open_rndv_server's), the
// client's extra environment, the answer's size.
struct Way {
  const char *const *kv;
  std::vector<std::string> client_env;
  size_t bytes;
};

int open_server(cxr_rdma **r, const Way &w) {
  if (w.kv == nullptr) return cxrt::open_rndv_server(r);  // (1 byte is eager all the same)
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  o.listen = "127.0.0.1:0";
  return cxr__rdma_open_ucx(r, &o, w.kv);
}

// One run: a fresh engine, the client connects (twice when `warm`: the second from our worker
// address), pings; the engine is closed as soon as its answer is done. The client's verdict.
std::string answer_then_close(cxrt::Proc &client, bool warm, const Way &w) {
  Answerer a;
  a.data.assign(w.bytes, 'z');
  cxr_rdma *r = nullptr;
  int rc = open_server(&r, w);
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

void runs(bool warm, const Way &w) {
  cxrt::Proc client;
  ASSERT_TRUE(client.start({"tests/rdma/rdma_peer", "client"}, w.client_env));
  ASSERT_EQ(client.line(10000), "READY");
  int lost = 0;
  for (int i = 0; i < kRuns; i++) {
    std::string v = answer_then_close(client, warm, w);
    if (v != "ok") {
      lost++;
      ADD_FAILURE() << "run " << i << ": " << v;
    }
  }
  printf("%d of %d answers lost\n", lost, kRuns);
  EXPECT_EQ(client.stop(5000), 0) << "the client died";
}

void runs(bool warm, size_t bytes) { runs(warm, Way{nullptr, {}, bytes}); }

TEST(CloseReply, AnEagerAnswerThroughTheListenerSurvivesTheClose) { runs(false, 0); }
TEST(CloseReply, ARendezvousAnswerThroughTheListenerSurvivesTheClose) { runs(false, 1 << 20); }
TEST(CloseReply, AnEagerAnswerToAWarmClientSurvivesTheClose) { runs(true, 0); }
TEST(CloseReply, ARendezvousAnswerToAWarmClientSurvivesTheClose) { runs(true, 1 << 20); }

// A large eager answer to a warm client that reads slowly: 128 KiB in one UCX fragment
// (segments of 256 KiB on both sides, no rendezvous, no zero-copy), through sockets of 4 KiB
// buffers (the engine's send side, the client's receive side). UCX copies the fragment into
// its send buffer, the socket takes a few KiB, and the send is done in place: the rest is
// still in UCX's buffer when cxr_rdma_reply returns. The close must not destroy the worker
// before it has left (a flush of the handle, 4435e1c). Without that the client's endpoint
// failed with no answer ("gone") in 24 runs of 25.
const char *const kEagerBig[] = {"RNDV_THRESH", "inf", "ZCOPY_THRESH", "inf",
                                 "TX_SEG_SIZE", "256k", "RX_SEG_SIZE", "256k",
                                 "SNDBUF", "4k", nullptr};
TEST(CloseReply, ALargeEagerAnswerToASlowWarmClientSurvivesTheClose) {
  std::vector<std::string> env = {"UCX_TCP_TX_SEG_SIZE=256k", "UCX_TCP_RX_SEG_SIZE=256k",
                                  "UCX_TCP_RCVBUF=4k"};
  runs(true, Way{kEagerBig, env, 128 << 10});
}

// A message that came on an endpoint we opened (the peer's echo, 21, of our ping), answered
// after we closed that endpoint: by a handler that closes it first, or later on the kept
// message. The reply must fail with CXR_ENOTCONN, never post on the closed UCX handle.
struct OwnEcho {
  cxr_rdma_ep *ep = nullptr;
  bool close_in_handler = false;
  std::atomic<cxr_rdma_msg *> kept{nullptr};
  std::atomic<int> rc{1};  // the handler's reply (1: not answered)

  static void on_echo(cxr_rdma_msg *m, void *user) {
    OwnEcho *e = (OwnEcho *)user;
    if (!e->close_in_handler) {
      cxr_rdma_msg_keep(m);
      e->kept.store(m);
      return;
    }
    cxr_rdma_ep_close(e->ep);
    e->rc.store(cxr_rdma_reply(m, 20, "q", 1, nullptr, 0, cxr_now_ns() + 1000000000));
  }
};

void reply_after_close(bool in_handler) {
  cxrt::Peer peer;
  cxr_rdma *r = nullptr;
  OwnEcho e;
  e.close_in_handler = in_handler;
  ASSERT_NO_FATAL_FAILURE(cxrt::open_and_connect(peer, &r, &e.ep));
  ASSERT_EQ(cxr_rdma_am_set(r, 21, OwnEcho::on_echo, &e), 0);
  ASSERT_EQ(cxr_rdma_am_send(e.ep, 20, "p", 1, nullptr, 0, 0), 0);
  for (int i = 0; i < 5000 && e.kept.load() == nullptr && e.rc.load() == 1; i++) usleep(1000);
  if (in_handler) {
    EXPECT_EQ(e.rc.load(), CXR_ENOTCONN);
  } else {
    cxr_rdma_msg *m = e.kept.load();
    ASSERT_NE(m, nullptr) << "no echo";
    cxr_rdma_ep_close(e.ep);
    EXPECT_EQ(cxr_rdma_reply(m, 20, "q", 1, nullptr, 0, cxr_now_ns() + 1000000000),
              CXR_ENOTCONN);
    cxr_rdma_msg_free(m);
  }
  cxr_rdma_close(r);
}

TEST(CloseReply, AKeptMessageFromAnEndpointWeClosedCannotBeAnswered) {
  reply_after_close(false);
}
TEST(CloseReply, AHandlerThatClosesItsMessagesEndpointCannotAnswerOnIt) {
  reply_after_close(true);
}

// Messages kept past their engine's close (cxr_rdma_msg_keep(3)): the engine's memory stays
// until the last one is freed. Each is still whole, a reply to it fails with CXR_ECLOSED (its
// connection went with the close), and it is freed after the close. Until 2026-11-28 the
// close freed the engine under them: the reply and cxr_rdma_msg_free read it (ASan:
// heap-use-after-free in cxr_rdma_msg_free, and in the reply before it), and the free gave
// the endpoint's hold back under the engine's freed lock.
struct Keeper {
  std::atomic<int> n{0};
  cxr_rdma_msg *kept[2] = {nullptr, nullptr};

  static void on_msg(cxr_rdma_msg *m, void *user) {
    Keeper *k = (Keeper *)user;
    int i = k->n.load();
    if (i >= 2) return;  // (only two are asked for)
    cxr_rdma_msg_keep(m);
    k->kept[i] = m;
    k->n.store(i + 1);
  }

  bool wait(int want) {
    for (int i = 0; i < 5000 && n.load() < want; i++) usleep(1000);
    return n.load() >= want;
  }
};

// After the close: m is the client's ping ("p", message 20), and cannot be answered.
void check_kept(cxr_rdma_msg *m) {
  size_t hl = 0, dl = 1;
  const char *h = (const char *)cxr_rdma_msg_hdr(m, &hl);
  EXPECT_EQ(cxr_rdma_msg_id(m), 20u);
  ASSERT_EQ(hl, 1u);
  EXPECT_EQ(h[0], 'p');
  cxr_rdma_msg_data(m, &dl);
  EXPECT_EQ(dl, 0u);
  EXPECT_EQ(cxr_rdma_reply(m, 21, "a", 1, nullptr, 0, cxr_now_ns() + 1000000000), CXR_ECLOSED);
}

// Two pings from an rdma_peer client, kept unanswered; the engine closed; both freed after.
void kept_past_close(bool warm) {
  Keeper k;
  cxr_rdma *r = nullptr;
  ASSERT_EQ(cxrt::open_rndv_server(&r), 0);
  ASSERT_EQ(cxr_rdma_am_set(r, 20, Keeper::on_msg, &k), 0);
  cxrt::Proc client;
  ASSERT_NO_FATAL_FAILURE(cxrt::start_client(client, r, warm));
  // Each ping waits for an echo that never comes: 300 ms, or until the close ends it.
  ASSERT_TRUE(client.say("ping 300"));
  ASSERT_TRUE(k.wait(1)) << "the first ping did not come";
  EXPECT_EQ(client.line(10000), "timeout");
  ASSERT_TRUE(client.say("ping 300"));
  ASSERT_TRUE(k.wait(2)) << "the second ping did not come";
  cxr_rdma_close(r);
  std::string got = client.line(10000);  // "timeout", or "gone" as the close ended it
  EXPECT_TRUE(got == "timeout" || got.rfind("gone", 0) == 0) << got;
  ASSERT_NO_FATAL_FAILURE(check_kept(k.kept[0]));
  cxr_rdma_msg_free(k.kept[0]);  // the engine stays: the other one still holds it
  ASSERT_NO_FATAL_FAILURE(check_kept(k.kept[1]));
  cxr_rdma_msg_free(k.kept[1]);  // the last: the engine's memory goes
  EXPECT_EQ(client.stop(5000), 0) << "the client died";
}

TEST(CloseReply, AKeptMessageThroughTheListenerOutlivesTheClose) { kept_past_close(false); }
TEST(CloseReply, AKeptMessageFromAWarmClientOutlivesTheClose) { kept_past_close(true); }

// The peer's echo on an endpoint we opened, kept, and freed after the engine's close (which
// closed that endpoint too) and nothing else.
TEST(CloseReply, AKeptMessageFromAnEndpointWeOpenedOutlivesTheClose) {
  cxrt::Peer peer;
  cxr_rdma *r = nullptr;
  OwnEcho e;
  ASSERT_NO_FATAL_FAILURE(cxrt::open_and_connect(peer, &r, &e.ep));
  ASSERT_EQ(cxr_rdma_am_set(r, 21, OwnEcho::on_echo, &e), 0);
  ASSERT_EQ(cxr_rdma_am_send(e.ep, 20, "p", 1, nullptr, 0, 0), 0);
  for (int i = 0; i < 5000 && e.kept.load() == nullptr; i++) usleep(1000);
  cxr_rdma_msg *m = e.kept.load();
  ASSERT_NE(m, nullptr) << "no echo";
  cxr_rdma_close(r);
  cxr_rdma_msg_free(m);
}

}  // namespace
