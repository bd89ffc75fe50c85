// The rdma_peer server process of the rdma tests: started on a free loopback port, it
// exports "mem" (4 MiB, byte i is i & 0xff) and "spare", and echoes message 20 as 21.
#pragma once
#include <gtest/gtest.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include <cxrpc/rdma.h>
#include "rdma/open_ucx.h"
#include "tests/rdma/proc.h"

namespace cxrt {

struct Peer {
  Proc p;
  int port = 0;
  uintptr_t mem = 0;
  // env: extra environment entries ("K=V") for the peer.
  bool start(const std::vector<std::string> &env = {}) {
    if (!p.start({"tests/rdma/rdma_peer", "serve", "127.0.0.1:0"}, env)) return false;
    std::string l = p.line(10000);
    void *m = nullptr;
    if (sscanf(l.c_str(), "READY %d %p", &port, &m) != 2) return false;
    mem = (uintptr_t)m;
    return true;
  }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port); }
};

// Where the one-sided and peer-death cases start: the peer process, an engine of our own
// with default options, one endpoint to the peer. Its fatal failures stop only this function:
// call it inside ASSERT_NO_FATAL_FAILURE.
inline void open_and_connect(Peer &peer, cxr_rdma **r, cxr_rdma_ep **ep) {
  ASSERT_TRUE(peer.start());
  ASSERT_EQ(cxr_rdma_open(r, nullptr), 0);
  ASSERT_EQ(cxr_rdma_connect(*r, peer.addr().c_str(), 0, ep), 0);
}

// The peer, an engine, an endpoint and the key of the peer's "mem" export.
struct Mem {
  Peer peer;
  cxr_rdma *r = nullptr;
  cxr_rdma_ep *ep = nullptr;
  cxr_rdma_rkey *rk = nullptr;
  uint64_t base = 0;
};

inline void connect_mem(Mem &m) {
  ASSERT_NO_FATAL_FAILURE(open_and_connect(m.peer, &m.r, &m.ep));
  ASSERT_EQ(cxr_rdma_rkey_get(m.ep, "mem", &m.rk, &m.base, nullptr), 0);
}

// Stops the peer and waits until it is stopped.
inline void stop(Peer &peer) {
  ASSERT_EQ(kill(peer.p.pid, SIGSTOP), 0);
  int ws = 0;
  ASSERT_EQ(waitpid(peer.p.pid, &ws, WUNTRACED), peer.p.pid);
  ASSERT_TRUE(WIFSTOPPED(ws));
}

// connect_mem, one get answered (the request path works), then the peer stopped (alive,
// answering nothing) until SIGCONT.
inline void connect_and_stop(Mem &m) {
  ASSERT_NO_FATAL_FAILURE(connect_mem(m));
  uint64_t w;
  ASSERT_EQ(cxr_rdma_get(m.ep, m.rk, m.base, &w, 8, cxr_now_ns() + 5000000000), 0);
  ASSERT_NO_FATAL_FAILURE(stop(m.peer));
}

// Waits up to `ms` for the peer to exit: true if it did (then it is reaped).
inline bool died_within(Peer &peer, int ms) {
  int ws = 0;
  for (int i = 0; i < ms / 10; i++, usleep(10000))
    if (waitpid(peer.p.pid, &ws, WNOHANG) == peer.p.pid) {
      peer.p.pid = -1;
      return true;
    }
  return false;
}

// UCX settings for an engine whose messages of 64 bytes and more go by rendezvous. Given to
// cxr__rdma_open_ucx: UCX_RNDV_THRESH set around an open was read by every engine opened
// meanwhile, and setenv may move environ under another thread's getenv.
inline const char *const kRndvAt64[] = {"RNDV_THRESH", "64", nullptr};

// A server engine of ours (listening on loopback, replies of 64 bytes and more by
// rendezvous: UCX keeps such a reply until the client fetches its data) and an rdma_peer
// client process that reached it from its worker address: a cold connect (which teaches the
// client that address), then a warm one (which closes the cold endpoint) and a ping on it.
// Our handler keeps the ping unanswered in `m`: no accepted endpoint of ours is behind it,
// only UCX's reply handle (rdma/worker.c, reply). The client sits in its ping (up to 5 s).
struct WarmAsk {
  cxr_rdma *r = nullptr;
  Proc client;
  std::atomic<cxr_rdma_msg *> m{nullptr};

  static void on_ping(cxr_rdma_msg *msg, void *user) {
    cxr_rdma_msg_keep(msg);
    ((WarmAsk *)user)->m.store(msg);
  }
};

// A server engine of ours on a free loopback port whose messages of 64 bytes and more go by
// rendezvous (UCX's RNDV_THRESH, given to this engine alone: no setenv while threads run);
// `queue_max` is its cxr_rdma_opts field (0: the default).
inline int open_rndv_server(cxr_rdma **r, size_t queue_max = 0) {
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  o.listen = "127.0.0.1:0";
  o.queue_max = queue_max;
  return cxr__rdma_open_ucx(r, &o, kRndvAt64);
}

// Starts an rdma_peer client in `c` and connects it to r's listener; when `warm`, connects
// again, from r's worker address (the first connect taught it that; the cold endpoint is
// closed). Call it inside ASSERT_NO_FATAL_FAILURE.
inline void start_client(Proc &c, cxr_rdma *r, bool warm) {
  std::string addr = "127.0.0.1:" + std::to_string(cxr_rdma_port(r));
  ASSERT_TRUE(c.start({"tests/rdma/rdma_peer", "client"}));
  ASSERT_EQ(c.line(10000), "READY");
  ASSERT_EQ(c.ask("connect " + addr + " 5000", 10000), "ok");
  if (warm) {
    ASSERT_EQ(c.ask("connect " + addr + " 5000", 10000), "ok");
  }
}

inline void warm_ask(WarmAsk &w) {
  ASSERT_EQ(open_rndv_server(&w.r), 0);
  ASSERT_EQ(cxr_rdma_am_set(w.r, 20, WarmAsk::on_ping, &w), 0);
  ASSERT_NO_FATAL_FAILURE(start_client(w.client, w.r, true));
  ASSERT_TRUE(w.client.say("ping 5000"));
  for (int i = 0; i < 5000 && w.m.load() == nullptr; i++) usleep(1000);
  ASSERT_NE(w.m.load(), nullptr) << "the ping did not come";
}

}  // namespace cxrt
