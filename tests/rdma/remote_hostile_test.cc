// A hostile or broken peer talking to a channel's UCX listener with hand-made messages:
// every bad address, length, count and id gets an error reply (or is dropped) and the
// server keeps serving a well-behaved client afterwards. Real server process, loopback.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <cxrpc/rdma.h>
#include "rdma/open_ucx.h"
#include "rpc/remote_wire.h"
#include "tests/rdma/proc.h"

namespace {

struct Replies {
  std::atomic<int> opens{0}, calls{0};
  std::atomic<int> open_status{1}, call_status{1};
  std::atomic<uint64_t> conn_id{0}, rs_addr{0};
  // The bytes the last reply shipped (after its range table), by value: 0xAA, 0xBB, other.
  std::atomic<long> aa{0}, bb{0}, other{0};
  std::atomic<int> calls_ok{0};    // replies with status 0
  std::atomic<long> aa_total{0};   // 0xAA bytes of every reply
  std::atomic<uint64_t> call_token{0};  // the token of the last call reply
};

void on_open_rep(cxr_rdma_msg *m, void *user) {
  Replies *r = (Replies *)user;
  size_t hl;
  const r_open_rep *h = (const r_open_rep *)cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h) return;
  r->conn_id = h->conn_id;
  r->rs_addr = h->rs_addr;
  r->open_status = h->status;
  r->opens++;
}

void on_call_rep(cxr_rdma_msg *m, void *user) {
  Replies *r = (Replies *)user;
  size_t hl;
  const r_call_rep *h = (const r_call_rep *)cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h) return;
  size_t dl;
  const unsigned char *d = (const unsigned char *)cxr_rdma_msg_data(m, &dl);
  long aa = 0, bb = 0, other = 0;
  for (size_t i = (size_t)h->nranges * sizeof(r_range); d != nullptr && i < dl; i++)
    d[i] == 0xAA ? aa++ : d[i] == 0xBB ? bb++ : other++;
  r->aa = aa, r->bb = bb, r->other = other;
  r->aa_total += aa;
  if (h->status == 0) r->calls_ok++;
  r->call_status = h->status;
  r->call_token = h->token;
  r->calls++;
}

bool wait_count(std::atomic<int> &v, int n) {
  for (int i = 0; i < 5000 && v.load() < n; i++) usleep(1000);
  return v.load() >= n;
}

// Where pod k's slice of the address window starts (16 slices, as shm cuts it).
uintptr_t slice_of(unsigned k) {
  uintptr_t lo = 0x600000000000ull, hi = 0x700000000000ull;
  const char *w = getenv("CXRPC_WINDOW");
  if (w && *w) sscanf(w, "%lx-%lx", (unsigned long *)&lo, (unsigned long *)&hi);
  uintptr_t slice = ((hi - lo) / 16) & ~(uintptr_t)((2u << 20) - 1);
  return lo + k * slice;
}
// Pod 5's slice (the server is pod 1): free on the server's side.
uintptr_t pod5_slice() { return slice_of(5); }

// Holds up the engine's progress thread (run there by cxr_rdma_defer) until released: this
// side then takes no message in, as a client that stopped reading.
struct Stall {
  std::atomic<int> state{0};  // 1 holding, 2 released
};
void stall(void *user) {
  Stall *s = (Stall *)user;
  s->state = 1;
  for (int i = 0; i < 20000 && s->state.load() != 2; i++) usleep(1000);
}
// Releases the stall when it goes out of scope (also when an assertion ends a test early).
struct Release {
  Stall &s;
  ~Release() { s.state = 2; }
};
// Runs stall() on r's progress thread and waits until it holds it.
bool hold(cxr_rdma *r, Stall &st) {
  if (cxr_rdma_defer(r, stall, &st) != 0) return false;
  for (int i = 0; i < 5000 && st.state.load() != 1; i++) usleep(1000);
  return st.state.load() == 1;
}

class Hostile : public ::testing::Test {
 protected:
  cxrt::Proc server;
  std::string host, root;
  cxr_rdma *r = nullptr;
  cxr_rdma_ep *ep = nullptr;
  Replies rep;
  uint64_t next_call = 1;

  void SetUp() override {
    const char *t = getenv("TEST_TMPDIR");
    root = std::string(t ? t : "/tmp") + "/hostile";
    mkdir(root.c_str(), 0700);
    ASSERT_TRUE(cxrt::start_kv_server(server, &host, root, 0));
    ASSERT_EQ(cxr_rdma_open(&r, nullptr), 0);
    ASSERT_EQ(cxr_rdma_am_set(r, R_OPEN_REP, on_open_rep, &rep), 0);
    ASSERT_EQ(cxr_rdma_am_set(r, R_CALL_REP, on_call_rep, &rep), 0);
    ASSERT_EQ(cxr_rdma_connect(r, host.c_str(), 0, &ep), 0);
  }
  void TearDown() override {
    held.state = 2;  // (stalled_client's, also when an assertion ended the test early)
    if (ep) cxr_rdma_ep_close(ep);
    if (r) cxr_rdma_close(r);
  }

  int open(const char *chan, uint64_t addr, uint64_t size) {
    r_open o = {};
    o.magic = R_MAGIC;
    o.version = 1;
    o.token = 77;
    o.heap_addr = addr;
    o.heap_size = size;
    snprintf(o.chan, sizeof o.chan, "%s", chan);
    int n = rep.opens.load();
    if (cxr_rdma_am_send(ep, R_OPEN, &o, sizeof o, nullptr, 0, 0) != 0) return 1;
    if (!wait_count(rep.opens, n + 1)) return 2;
    return rep.open_status.load();
  }
  // Sends a call with the given header fields and raw data; the server's status, or 2 if
  // nothing came back.
  int call(r_call h, const std::vector<char> &data) {
    h.magic = R_MAGIC;
    h.call_id = next_call++ << 32 | 1;
    if (h.token == 0) h.token = 77;  // the token our open sent
    if (h.deadline_rel == 0) h.deadline_rel = 1000000000;
    struct iovec iov = {(void *)data.data(), data.size()};
    int n = rep.calls.load();
    if (cxr_rdma_am_send(ep, R_CALL, &h, sizeof h, data.empty() ? nullptr : &iov,
                         data.empty() ? 0 : 1, 0) != 0)
      return 1;
    if (!wait_count(rep.calls, n + 1)) return 2;
    return rep.call_status.load();
  }
  // A server started with env ("K=V" entries) in place of the fixture's; salt tells its
  // root and port apart (start_kv_server).
  void restart_server(const std::vector<std::string> &env, int salt) {
    cxr_rdma_ep_close(ep);
    ep = nullptr;
    ASSERT_EQ(server.stop(), 0);
    std::string dir = root + std::to_string(salt);
    mkdir(dir.c_str(), 0700);
    ASSERT_TRUE(cxrt::start_kv_server(server, &host, dir, salt, env));
    ASSERT_EQ(cxr_rdma_connect(r, host.c_str(), 0, &ep), 0);
  }
  // A server of one worker: handlers, and their replies, run on its engine's progress thread.
  void one_worker_server() { restart_server({"REMOTE_PEER_WORKERS=1"}, 1); }
  // Posts an inline call (never waits: a waiting send would progress our worker and take
  // its replies in). Its arguments stay in the fixture, which outlives the endpoint.
  void post_call(uint64_t conn, uint32_t method, int64_t a0, int64_t a1) {
    ASSERT_LT(nposted, sizeof posted / sizeof posted[0]);
    int64_t *args = posted[nposted++];
    args[0] = a0, args[1] = a1;
    r_call h = {};
    h.magic = R_MAGIC;
    h.conn_id = conn;
    h.method = method;
    h.call_id = next_call++ << 32 | 1;
    h.token = 77;
    h.deadline_rel = 30000000000;
    h.flags = CXR_CALL_INLINE;
    h.inline_len = h.arg_len = 2 * sizeof *args;
    struct iovec iov = {args, 2 * sizeof *args};
    ASSERT_EQ(cxr_rdma_am_post(ep, R_CALL, &h, sizeof h, &iov, 1), 0);
  }
  // A one-worker server, an honest client of it (connected, one call done), and our own
  // connection *id, whose replies we stop reading (`held` holds our progress thread) after
  // n calls whose results are `size` bytes of 0xAA, then a marker (a spin of 0 ms).
  void stalled_client(cxrt::Proc &honest, uint64_t *id, int n, int64_t size);
  Stall held;
  int64_t posted[512][2];
  size_t nposted = 0;
  static void put_range(std::vector<char> &d, uint64_t addr, uint64_t len) {
    r_range g = {addr, len};
    d.insert(d.end(), (char *)&g, (char *)&g + sizeof g);
  }
};

TEST_F(Hostile, BadOpensAreRefused) {
  EXPECT_EQ(open("nope", pod5_slice(), 1 << 20), CXR_ENOENT);
  EXPECT_EQ(open("kv", 0x1000, 1 << 20), CXR_ERANGE);            // outside the window
  EXPECT_EQ(open("kv", pod5_slice() + 12, 1 << 20), CXR_ERANGE);  // not page aligned
  EXPECT_EQ(open("kv", pod5_slice(), 0), CXR_ERANGE);
  EXPECT_EQ(open("kv", pod5_slice(), ~0ull & ~4095ull), CXR_ERANGE);  // absurd size
  // Over the server's own heaps (pod 1's slice starts with its channel heap).
  EXPECT_EQ(open("kv", slice_of(1), 1 << 20), CXR_EADDRINUSE);
  EXPECT_EQ(open("kv", pod5_slice(), 1 << 20), 0);
  // The same range twice: refused, the first replica is not disturbed.
  EXPECT_EQ(open("kv", pod5_slice(), 1 << 20), CXR_EADDRINUSE);
}

TEST_F(Hostile, ReplicasPastTheChannelsBudgetAreRefused) {
  // A client names its heap's range; the server makes a replica of that size. Without a
  // bound a client could name terabytes (it was accepted, inside the window and free).
  // The budget (CXRPC_REMOTE_REPLICA_MB, default 64 GiB) covers all connections together.
  // (Sizes that fit the smaller window the sanitizer configs use.)
  const uint64_t kGiB = 1ull << 30;
  EXPECT_EQ(open("kv", pod5_slice(), 65 * kGiB), CXR_EFULL);
  EXPECT_EQ(open("kv", slice_of(6), 64 * kGiB), 0);
  EXPECT_EQ(open("kv", pod5_slice(), 1 << 20), CXR_EFULL);  // the budget is spent
}

TEST_F(Hostile, TheReplicaBudgetComesFromTheServersEnvironment) {
  // CXRPC_REMOTE_REPLICA_MB, read once when the server's channel starts listening (each
  // OPEN used to read it again): 2 MiB here, spent by two OPENs of 1 MiB.
  ASSERT_NO_FATAL_FAILURE(restart_server({"CXRPC_REMOTE_REPLICA_MB=2"}, 2));
  EXPECT_EQ(open("kv", pod5_slice(), 3 << 20), CXR_EFULL);
  EXPECT_EQ(open("kv", pod5_slice(), 1 << 20), 0);
  EXPECT_EQ(open("kv", slice_of(6), 1 << 20), 0);
  EXPECT_EQ(open("kv", slice_of(7), 1 << 20), CXR_EFULL);  // the budget is spent
}

// The answer the server gives a call it refuses (no such connection, a wrong token: what a
// client whose connection the server took back meets) must carry the call's token, or the
// real client, which matches replies by token, drops it and waits out its deadline. It
// carried 0 until an audit of 2026-11-28; so did the CXR_EFULL of a full worker queue (the
// same one-line change in on_call; filling 1 GiB of queue is too slow for a test).
TEST_F(Hostile, ARefusalCarriesTheCallersToken) {
  ASSERT_EQ(open("kv", pod5_slice(), 1 << 20), 0);
  uint64_t id = rep.conn_id.load();
  r_call h = {};
  h.method = 2;  // the peer's no-op
  std::vector<char> d;
  h.conn_id = id + 1000;  // no such connection
  h.token = 91;
  EXPECT_EQ(call(h, d), CXR_ECLOSED);
  EXPECT_EQ(rep.call_token.load(), 91u) << "the refusal does not carry the call's token";
  h.conn_id = id;  // ours, with a wrong token
  h.token = 92;
  EXPECT_EQ(call(h, d), CXR_ECLOSED);
  EXPECT_EQ(rep.call_token.load(), 92u);
  h.token = 0;  // (call() puts our token, 77)
  EXPECT_EQ(call(h, d), 0);
  EXPECT_EQ(rep.call_token.load(), 77u);
}

// A call whose root block lies above the other ranges it ships, the sum of the ranges
// larger than what is left of the heap past the root: every range is in the heap. The
// client sent that sum as the argument's length, and the server refused the call
// (CXR_EBADPTR) until an audit of 2026-11-28.
TEST_F(Hostile, ARootAboveItsRangesIsNotRefused) {
  cxrt::Proc c;
  std::string croot = root + "-client";
  mkdir(croot.c_str(), 0700);
  ASSERT_TRUE(c.start({"tests/netns/remote_peer", "client", "ucx://" + host + "/kv"},
                      {"CXRPC_ROOT=" + croot, "CXRPC_POD=2"}));
  ASSERT_EQ(c.line(15000), "READY");
  ASSERT_EQ(c.ask("connect 5000", 15000), "ok");
  std::string small = c.ask("rootlast 8", 15000);  // root + sum inside the 64 MiB heap
  EXPECT_EQ(small.substr(0, 2), "ok") << small;
  std::string big = c.ask("rootlast 40", 15000);  // root at 40 MiB + 40 MiB: past its end
  EXPECT_EQ(big.substr(0, 2), "ok") << big;
  EXPECT_EQ(c.stop(), 0);
}

TEST_F(Hostile, BadCallsGetErrorsAndTheServerKeepsServing) {
  uint64_t base = pod5_slice();
  ASSERT_EQ(open("kv", base, 1 << 20), 0);
  uint64_t id = rep.conn_id.load();
  r_call h = {};
  h.conn_id = id;
  h.method = 2;  // the peer's no-op
  std::vector<char> d;
  EXPECT_EQ(call(h, d), 0);  // a good call first

  // A range outside the replica.
  d.clear();
  put_range(d, base + (1 << 20) - 8, 16);
  d.resize(d.size() + 16);
  h.nranges = 1;
  EXPECT_EQ(call(h, d), CXR_EBADPTR);
  // Ranges that claim more bytes than were sent, or fewer.
  d.clear();
  put_range(d, base + 4096, 64);
  d.resize(d.size() + 10);
  EXPECT_EQ(call(h, d), CXR_EPROTO);
  d.resize(d.size() + 100);
  EXPECT_EQ(call(h, d), CXR_EPROTO);
  // Lengths whose sum wraps around.
  d.clear();
  put_range(d, base + 4096, ~0ull);
  put_range(d, base + 4096, 2);
  d.resize(d.size() + 1);
  h.nranges = 2;
  EXPECT_NE(call(h, d), 0);
  // A count far beyond the data, and beyond any limit.
  d.assign(64, 0);
  h.nranges = 1000000;
  EXPECT_EQ(call(h, d), CXR_EPROTO);
  h.nranges = 0;
  h.nrel = 1u << 30;
  EXPECT_EQ(call(h, d), CXR_EPROTO);
  h.nrel = 0;
  h.inline_len = 4096;
  EXPECT_EQ(call(h, d), CXR_EPROTO);
  h.inline_len = 0;
  // A call naming our connection without its token (a peer that guessed the sequential
  // id, say): refused as if there were no such connection. (It ran before tokens came
  // with calls.)
  d.clear();
  h.token = 78;
  EXPECT_EQ(call(h, d), CXR_ECLOSED);
  h.token = 0;
  // Arguments pointing outside the replica; an unknown method; an unknown connection.
  d.clear();
  h.args = 0x1000;
  h.arg_len = 8;
  EXPECT_EQ(call(h, d), CXR_EBADPTR);
  h.args = 0;
  h.arg_len = 0;
  h.method = 999;
  EXPECT_EQ(call(h, d), CXR_ENOMETHOD);
  h.method = 2;
  h.conn_id = id + 1000;
  EXPECT_EQ(call(h, d), CXR_ECLOSED);
  h.conn_id = id;
  // A deadline already gone: not run.
  h.deadline_rel = -5;
  EXPECT_EQ(call(h, d), CXR_ETIMEDOUT);
  h.deadline_rel = 0;
  // Releases of results that do not exist are ignored.
  d.clear();
  uint64_t bogus[3] = {0, 0x1000, ~0ull};
  d.insert(d.end(), (char *)bogus, (char *)bogus + sizeof bogus);
  h.nrel = 3;
  EXPECT_EQ(call(h, d), 0);
  h.nrel = 0;
  // A header of the wrong size is dropped without an answer.
  char junk[3] = {1, 2, 3};
  EXPECT_EQ(cxr_rdma_am_send(ep, R_CALL, junk, sizeof junk, nullptr, 0, 0), 0);
  EXPECT_EQ(cxr_rdma_am_send(ep, R_OPEN, junk, sizeof junk, nullptr, 0, 0), 0);
  // Still serving: a good call and a real client.
  d.clear();
  EXPECT_EQ(call(h, d), 0);
  cxrt::Proc c;
  ASSERT_TRUE(c.start({"tests/netns/remote_peer", "client", "ucx://" + host + "/kv"},
                      {"CXRPC_ROOT=" + root + "c", "CXRPC_POD=2"}));
  mkdir((root + "c").c_str(), 0700);
  ASSERT_EQ(c.line(15000), "READY");
  EXPECT_EQ(c.ask("connect 5000", 15000), "ok");
  EXPECT_EQ(c.ask("graph 50", 15000).rfind("ok", 0), 0u);
  EXPECT_EQ(c.stop(), 0);
  EXPECT_EQ(server.stop(), 0);
}

// A client asks for a 16 MiB result and stops reading before it comes, then closes: the
// server posts the reply, which UCX holds (and will send from the result heap once the
// client reads again), and the connection goes. Its result heap must not serve a later
// connection before UCX is done with it: that connection's results would go out in the late
// reply, to this client. (Before the heap was held, the late reply here carried the later
// client's 0xBB bytes instead of its own 0xAA.)
TEST_F(Hostile, AReplyStillInFlightKeepsItsResultHeapFromOtherConnections) {
  ASSERT_EQ(open("kv", pod5_slice(), 1 << 20), 0);
  uint64_t id = rep.conn_id.load(), rs = rep.rs_addr.load();
  Stall st;
  Release release{st};
  ASSERT_TRUE(hold(r, st));
  // Posted, not waited for (a waiting send would progress the worker itself and take the
  // reply in): the call, then the close behind it.
  int64_t fill[2] = {16 << 20, 0xAA};
  r_call h = {};
  h.magic = R_MAGIC;
  h.conn_id = id;
  h.method = 9;  // the peer's M_FILL
  h.call_id = 1ull << 32 | 1;
  h.token = 77;
  h.deadline_rel = 30000000000;
  h.flags = CXR_CALL_INLINE;
  h.inline_len = sizeof fill;
  h.arg_len = sizeof fill;
  struct iovec iov = {fill, sizeof fill};
  ASSERT_EQ(cxr_rdma_am_post(ep, R_CALL, &h, sizeof h, &iov, 1), 0);
  usleep(2000000);  // the handler has run and the reply waits for us (a close before the
                    // call reached a worker would leave nothing to run it on; 2 s, for
                    // sanitizer builds on a loaded machine)
  r_close cl = {R_MAGIC, 0, id, 77, 0};
  ASSERT_EQ(cxr_rdma_am_post(ep, R_CLOSE, &cl, sizeof cl, nullptr, 0), 0);
  usleep(2200000);  // the close goes through (it waited behind the server's 2 s reply wait
                    // until replies were posted)

  // Later clients, each keeping its connection (and so its result heap), fill theirs.
  mkdir((root + "c").c_str(), 0700);
  cxrt::Proc later[3];
  bool reused = false;
  for (auto &c : later) {
    ASSERT_TRUE(c.start({"tests/netns/remote_peer", "client", "ucx://" + host + "/kv"},
                        {"CXRPC_ROOT=" + root + "c", "CXRPC_POD=2"}));
    ASSERT_EQ(c.line(15000), "READY");
    ASSERT_EQ(c.ask("connect 5000", 15000), "ok");
    std::string a = c.ask("fill 16777216 187", 15000);  // 0xBB
    ASSERT_EQ(a.rfind("ok ", 0), 0u) << a;
    unsigned long res = 0, base = 0;
    ASSERT_EQ(sscanf(a.c_str(), "ok %lx %lx", &res, &base), 2) << a;
    if (base == rs) reused = true;
  }
  EXPECT_FALSE(reused) << "a later connection got the result heap of a reply in flight";
  // The client reads again: its reply comes, with its own bytes only.
  st.state = 2;
  EXPECT_TRUE(wait_count(rep.calls, 1));
  EXPECT_EQ(rep.call_status.load(), 0);
  EXPECT_EQ(rep.bb.load(), 0);
  EXPECT_EQ(rep.aa.load(), 16 << 20);
  // Once UCX is done with it, the heap serves connections again; the server still serves.
  bool back = false;
  for (int i = 0; i < 50 && !back; i++) {
    cxrt::Proc c;
    ASSERT_TRUE(c.start({"tests/netns/remote_peer", "client", "ucx://" + host + "/kv"},
                        {"CXRPC_ROOT=" + root + "c", "CXRPC_POD=2"}));
    ASSERT_EQ(c.line(15000), "READY");
    ASSERT_EQ(c.ask("connect 5000", 15000), "ok");
    std::string a = c.ask("fill 4096 204", 15000);
    EXPECT_EQ(c.stop(), 0);
    unsigned long res = 0, base = 0;
    ASSERT_EQ(sscanf(a.c_str(), "ok %lx %lx", &res, &base), 2) << a;
    back = base == rs;
    if (!back) usleep(20000);
  }
  EXPECT_TRUE(back) << "the held result heap never came back to the spares";
  for (auto &c : later) EXPECT_EQ(c.stop(), 0);
  EXPECT_EQ(server.stop(), 0);
}

enum { M_NOOP = 2, M_SPIN = 5, M_FILL = 9 };  // the peer's methods

// A client of the channel (a real process), connected.
bool honest_client(cxrt::Proc &c, const std::string &host, const std::string &root) {
  mkdir((root + "c").c_str(), 0700);
  return c.start({"tests/netns/remote_peer", "client", "ucx://" + host + "/kv"},
                 {"CXRPC_ROOT=" + root + "c", "CXRPC_POD=2"}) &&
         c.line(15000) == "READY" && c.ask("connect 5000", 15000) == "ok";
}

// Whether the server's spin handler has run (the marker a stalled client posts behind its
// other calls: a one-worker server runs one client's calls in order), asked by `c` for at
// most ~20 s.
bool marker_ran(cxrt::Proc &c) {
  for (int i = 0; i < 200; i++) {
    long started = 0, stopped = 0;
    std::string a = c.ask("spincounts", 15000);
    if (sscanf(a.c_str(), "ok %ld %ld", &started, &stopped) == 2 && started >= 1) return true;
    usleep(100000);
  }
  return false;
}

void Hostile::stalled_client(cxrt::Proc &honest, uint64_t *id, int n, int64_t size) {
  ASSERT_NO_FATAL_FAILURE(one_worker_server());
  ASSERT_TRUE(honest_client(honest, host, root));
  ASSERT_EQ(honest.ask("noop 5000", 15000), "ok");
  ASSERT_EQ(open("kv", pod5_slice(), 1 << 20), 0);
  *id = rep.conn_id.load();
  ASSERT_TRUE(hold(r, held));
  for (int i = 0; i < n; i++) ASSERT_NO_FATAL_FAILURE(post_call(*id, M_FILL, size, 0xAA));
  ASSERT_NO_FATAL_FAILURE(post_call(*id, M_SPIN, 0, 0));
}

// A client with a valid token that calls and never reads its replies (its progress thread
// held up; 4 MiB results go by rendezvous, which waits for it to fetch them) holds up no
// other client. On a server of one worker, handlers and their replies run on its engine's
// progress thread, and each reply used to wait up to 2 s (its send deadline) for UCX to
// send it: every other client of the channel, connects too, waited behind each such call
// (here the honest client's calls, 1 s deadline each, all ended CXR_ETIMEDOUT). Replies are
// posted now, not waited for.
TEST_F(Hostile, AClientThatNeverReadsItsRepliesHoldsUpNoOtherClient) {
  const int kCalls = 4;
  cxrt::Proc honest;
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(stalled_client(honest, &id, kCalls, 4 << 20));
  for (int i = 0; i < 5; i++) {
    int64_t t0 = cxr_now_ns();
    std::string a = honest.ask("noop 1000", 15000);
    EXPECT_EQ(a, "ok") << "honest call " << i << " took " << (cxr_now_ns() - t0) / 1000000
                       << " ms";
  }
  EXPECT_TRUE(marker_ran(honest)) << "the server never ran the stalled client's calls";
  // The stalled client reads again: every reply comes, whole.
  held.state = 2;
  EXPECT_TRUE(wait_count(rep.calls, kCalls + 1));
  EXPECT_EQ(rep.calls_ok.load(), kCalls + 1);
  EXPECT_EQ(rep.aa_total.load(), (long)kCalls << 22);
  EXPECT_EQ(honest.stop(), 0);
  EXPECT_EQ(server.stop(), 0);
}

// The replies a client does not read are bounded per connection (as many as a client may
// have calls in flight, 256): past that they are dropped (their results freed, the calls
// end at the client's deadline), so such a client cannot grow the server's memory without
// bound; the connection serves it again once it reads. (Before, the server waited for each
// reply, 2 s per call, and all of them stayed with UCX.)
TEST_F(Hostile, RepliesAClientDoesNotReadAreBoundedPerConnection) {
  const int kCalls = 300;
  cxrt::Proc honest;
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(stalled_client(honest, &id, kCalls, 128 << 10));
  EXPECT_TRUE(marker_ran(honest)) << "the server never ran the stalled client's calls";
  held.state = 2;
  EXPECT_TRUE(wait_count(rep.calls, 256));
  usleep(500000);  // any more replies that were going to come have come
  int got = rep.calls.load();
  EXPECT_LT(got, kCalls + 1) << "no reply was dropped";  // (256 here: all were unsent)
  EXPECT_EQ(rep.aa_total.load() % (128 << 10), 0);  // each reply that came is whole
  // The connection serves its client again.
  r_call h = {};
  h.conn_id = id;
  h.method = M_NOOP;
  EXPECT_EQ(call(h, {}), 0);
  EXPECT_EQ(honest.stop(), 0);
  EXPECT_EQ(server.stop(), 0);
}

// A client that sends messages and never reads their answers: an engine of its own with a
// small socket receive buffer, its progress thread held up (hold), talking to a server with
// small send buffers (flood_server), so that the server's answers stop leaving after a few
// hundred, whatever the machine's socket defaults.
struct Flooder {
  cxr_rdma *r = nullptr;
  cxr_rdma_ep *ep = nullptr;
  Stall held;
  std::atomic<int> answers{0};  // answers taken in once it reads again (any kind)

  static void on_answer(cxr_rdma_msg *, void *user) { ((std::atomic<int> *)user)->fetch_add(1); }
  bool start(const std::string &host) {
    // A small receive buffer: the answers back up soon once it stops reading. A large
    // send buffer: what it posts while its progress thread is held goes out only as far as
    // the socket takes it. For this engine alone: setting UCX_TCP_* in the environment
    // around the open raced with other engines' threads calling getenv (setenv may move
    // environ). The keys are the transport's field names (open_ucx.h).
    const char *const kv[] = {"RCVBUF", "4k", "SNDBUF", "4m", nullptr};
    return cxr__rdma_open_ucx(&r, nullptr, kv) == 0 &&
           cxr_rdma_am_set(r, R_OPEN_REP, on_answer, &answers) == 0 &&
           cxr_rdma_am_set(r, R_CLOSE_REP, on_answer, &answers) == 0 &&
           cxr_rdma_am_set(r, R_CALL_REP, on_answer, &answers) == 0 &&
           cxr_rdma_connect(r, host.c_str(), 0, &ep) == 0 && round_trip() && hold(r, held);
  }
  // One CLOSE answered before the progress thread is held: UCX has finished setting the
  // endpoint up (its TCP connects are non-blocking), so what is posted while it is held goes
  // out at once instead of waiting in UCX for progress.
  bool round_trip() {
    r_close c = {};
    c.magic = R_MAGIC;
    c.conn_id = 999999;
    if (cxr_rdma_am_send(ep, R_CLOSE, &c, sizeof c, nullptr, 0, 0) != 0) return false;
    return wait_count(answers, 1);
  }
  // Reads again; how many answers came once they stop coming (at most ~20 s).
  int release() {
    held.state = 2;
    int last = -1;
    for (int i = 0; i < 40 && answers.load() != last; i++) {
      last = answers.load();
      usleep(500000);
    }
    return answers.load();
  }
  ~Flooder() {
    held.state = 2;
    if (ep) cxr_rdma_ep_close(ep);
    if (r) cxr_rdma_close(r);
  }
};

// The fixture's server again, with small socket send buffers; the fixture's endpoint is
// left closed (a test connects it later).
void flood_server(cxrt::Proc &server, std::string *host, const std::string &root,
                  cxr_rdma_ep **ep) {
  cxr_rdma_ep_close(*ep);
  *ep = nullptr;
  ASSERT_EQ(server.stop(), 0);
  mkdir((root + "f").c_str(), 0700);
  ASSERT_TRUE(cxrt::start_kv_server(server, host, root + "f", 2,
                                    {"UCX_TCP_SNDBUF=4k", "REMOTE_PEER_WORKERS=1"}));
}

// A client that sends OPENs and CLOSEs and never reads their answers holds up no other
// client. The server's engine runs OPEN and CLOSE on its progress thread, and each answer
// used to wait up to 2 s (the send deadline) for UCX to send it: once the flooder's socket
// buffers were full, the progress thread waited 2 s per message, and another client's
// connect (its hello, then its OPEN) timed out behind them. The answers are posted now, and
// at most 64 per client stay unsent (the rest are dropped, their OPENs not served).
TEST_F(Hostile, AClientFloodingOpensAndClosesHoldsUpNoOtherClient) {
  const int kFlood = 3000;
  ASSERT_NO_FATAL_FAILURE(flood_server(server, &host, root, &ep));
  Flooder f;
  ASSERT_TRUE(f.start(host));
  for (int i = 0; i < kFlood; i++) {
    if (i % 2) {
      r_close c = {};
      c.magic = R_MAGIC;
      c.conn_id = 1000000 + i;  // no such connection: answered at once
      c.token = 5;
      ASSERT_EQ(cxr_rdma_am_post(f.ep, R_CLOSE, &c, sizeof c, nullptr, 0), 0);
      continue;
    }
    r_open o = {};
    o.magic = R_MAGIC;
    o.version = 1;
    o.token = 5;
    o.heap_addr = slice_of(6);
    o.heap_size = 1 << 20;
    snprintf(o.chan, sizeof o.chan, "nope");  // no such channel: answered at once
    ASSERT_EQ(cxr_rdma_am_post(f.ep, R_OPEN, &o, sizeof o, nullptr, 0), 0);
  }
  usleep(300000);  // the server takes the flood in
  // Another client connects cold, opens and calls, each within generous deadlines.
  int64_t t0 = cxr_now_ns();
  ASSERT_EQ(cxr_rdma_connect(r, host.c_str(), cxr_now_ns() + 10 * 1000000000ll, &ep), 0)
      << "the connect took " << (cxr_now_ns() - t0) / 1000000 << " ms";
  ASSERT_EQ(open("kv", pod5_slice(), 1 << 20), 0)
      << "the OPEN took " << (cxr_now_ns() - t0) / 1000000 << " ms";
  r_call h = {};
  h.conn_id = rep.conn_id.load();
  h.method = M_NOOP;
  EXPECT_EQ(call(h, {}), 0);
  // The flooder reads again: the answers it left unsent were bounded.
  int got = f.release();
  printf("the flooder got %d answers of %d\n", got, kFlood);
  EXPECT_GT(got, 0);
  EXPECT_LT(got, kFlood) << "no answer was dropped";
  EXPECT_EQ(server.stop(), 0);
}

// Clients that send calls of no connection and never read their errors take no other
// client's errors. Such answers (CXR_ECLOSED for a wrong id or token) had one bound for the
// whole channel (1024 unsent): the flooders' held them all, and another client's call of no
// connection got no answer (it timed out here). They are bounded per client now (with the
// answers to OPEN and CLOSE, 64 each), so a flooder loses only its own. How far one flood
// gets while its client reads nothing varies with UCX (in some runs the server takes no
// more in after about 1000 calls, until the flooder reads), hence three flooders at once.
TEST_F(Hostile, ClientsThatNeverReadTheirErrorsTakeNoOtherClientsErrors) {
  const int kFlood = 3000, kFlooders = 3;
  ASSERT_NO_FATAL_FAILURE(flood_server(server, &host, root, &ep));
  std::vector<std::unique_ptr<Flooder>> fs;
  for (int k = 0; k < kFlooders; k++) {
    fs.emplace_back(new Flooder);
    ASSERT_TRUE(fs.back()->start(host));
  }
  for (int i = 0; i < kFlood; i++) {
    for (int k = 0; k < kFlooders; k++) {
      r_call h = {};
      h.magic = R_MAGIC;
      h.conn_id = 1000000 + i;  // no such connection: answered CXR_ECLOSED at once
      h.call_id = (uint64_t)(i + 1) << 32 | 1;
      h.token = 5;
      h.method = M_NOOP;
      h.deadline_rel = 30000000000;
      ASSERT_EQ(cxr_rdma_am_post(fs[k]->ep, R_CALL, &h, sizeof h, nullptr, 0), 0);
    }
    if (i % 100 == 99) usleep(20000);  // the server reads them as they come
  }
  usleep(500000);  // the server takes the floods in
  ASSERT_EQ(cxr_rdma_connect(r, host.c_str(), cxr_now_ns() + 10 * 1000000000ll, &ep), 0);
  for (int i = 0; i < 3; i++) {
    r_call h = {};
    h.conn_id = 999;  // no such connection either
    h.method = M_NOOP;
    EXPECT_EQ(call(h, {}), CXR_ECLOSED) << "try " << i << " (2: no answer within 5 s)";
  }
  for (int k = 0; k < kFlooders; k++) {
    int got = fs[k]->release();
    printf("flooder %d got %d answers of %d\n", k, got, kFlood);
    EXPECT_GT(got, 0);
    EXPECT_LT(got, kFlood) << "no answer was dropped";
  }
  EXPECT_EQ(server.stop(), 0);
}

// The other way round: a hostile server. A client (a real process) connects to a fake
// listener that answers opens correctly and calls with broken replies; each call ends with
// an error code and the client keeps working.
struct FakeServer {
  std::atomic<int> mode{0};
  uint64_t rs = 0;  // the "result heap" it claims, in pod 6's slice
  std::atomic<int> late_released{0};  // calls that gave back the late result (mode 6)
};

void fake_open(cxr_rdma_msg *m, void *user) {
  FakeServer *f = (FakeServer *)user;
  size_t hl;
  const r_open *h = (const r_open *)cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h) return;
  r_open_rep rep = {R_MAGIC, 0, h->token, 1, f->rs, 1 << 20};
  cxr_rdma_reply(m, R_OPEN_REP, &rep, sizeof rep, nullptr, 0, 0);
}

void fake_close(cxr_rdma_msg *m, void *user) {
  size_t hl;
  const r_close *h = (const r_close *)cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h) return;
  r_close ack = *h;
  cxr_rdma_reply(m, R_CLOSE_REP, &ack, sizeof ack, nullptr, 0, 0);
}

void fake_call(cxr_rdma_msg *m, void *user) {
  FakeServer *f = (FakeServer *)user;
  size_t hl;
  const r_call *h = (const r_call *)cxr_rdma_msg_hdr(m, &hl);
  if (hl != sizeof *h) return;
  r_call_rep rep = {R_MAGIC, 0, 0, h->call_id, 0, 0, 0};
  // The releases a call carries follow its range table.
  size_t dl = 0;
  const char *in = (const char *)cxr_rdma_msg_data(m, &dl);
  for (uint32_t i = 0; in && i < h->nrel; i++) {
    uint64_t rel;
    size_t off = h->nranges * sizeof(r_range) + i * sizeof rel;
    if (off + sizeof rel > dl) break;
    memcpy(&rel, in + off, sizeof rel);
    if (rel == f->rs + 64) f->late_released++;
  }
  std::vector<char> d;
  int32_t pid = 4242;
  auto range = [&](uint64_t a, uint64_t len) {
    r_range g = {a, len};
    d.insert(d.end(), (char *)&g, (char *)&g + sizeof g);
  };
  int md = f->mode.load();
  if (md == 6) f->mode.compare_exchange_strong(md, 0);  // one late answer, then good ones
  switch (md) {
    case 1:  // a range outside both of the client's heaps
      range(0x1000, 4), d.resize(d.size() + 4), rep.nranges = 1;
      break;
    case 2:  // ranges that claim more bytes than came
      range(f->rs, 64), d.resize(d.size() + 4), rep.nranges = 1;
      break;
    case 3:  // a result pointer outside the result heap
      rep.result = 0x1000;
      break;
    case 4:  // a status that is no CXR_E* code
      rep.status = 5;
      break;
    case 5:  // no answer at all
      return;
    case 6:  // an answer after the client's 2 ms deadline, naming a result of its own
      usleep(50000);
      rep.result = f->rs + 64;
      break;
    default:  // a good answer: 4 bytes at the start of the result heap
      range(f->rs, 4);
      d.insert(d.end(), (char *)&pid, (char *)&pid + 4);
      rep.nranges = 1;
      rep.result = f->rs;
  }
  // Replies must carry the client's token (random; every call carries it).
  rep.token = h->token;
  struct iovec iov = {d.data(), d.size()};
  cxr_rdma_reply(m, R_CALL_REP, &rep, sizeof rep, d.empty() ? nullptr : &iov, d.empty() ? 0 : 1, 0);
}

// A fake server (an engine with the fake handlers above) on a free port, and a real
// client process connected to it through channel "kv" (root: TEST_TMPDIR/dir).
struct FakeRig {
  FakeServer f;
  cxr_rdma *r = nullptr;
  cxrt::Proc c;
};

void start_fake(FakeRig &g, const char *dir) {
  FakeServer &f = g.f;
  cxr_rdma **r = &g.r;
  cxrt::Proc &c = g.c;
  f.rs = slice_of(6);
  *r = nullptr;
  std::string host;
  for (int tries = 0; tries < 20 && *r == nullptr; tries++) {
    host = "127.0.0.1:" +
           std::to_string(20000 + (int)((getpid() * 13 + time(nullptr) * 37 + tries * 97) % 30000));
    cxr_rdma_opts o;
    cxr_rdma_opts_init(&o);
    o.listen = host.c_str();
    if (cxr_rdma_open(r, &o) != 0) *r = nullptr;
  }
  ASSERT_NE(*r, nullptr);
  ASSERT_EQ(cxr_rdma_am_set(*r, R_OPEN, fake_open, &f), 0);
  ASSERT_EQ(cxr_rdma_am_set(*r, R_CALL, fake_call, &f), 0);
  ASSERT_EQ(cxr_rdma_am_set(*r, R_CLOSE, fake_close, &f), 0);
  const char *t = getenv("TEST_TMPDIR");
  std::string root = std::string(t ? t : "/tmp") + "/" + dir;
  mkdir(root.c_str(), 0700);
  ASSERT_TRUE(c.start({"tests/netns/remote_peer", "client", "ucx://" + host + "/kv"},
                      {"CXRPC_ROOT=" + root, "CXRPC_POD=2"}));
  ASSERT_EQ(c.line(15000), "READY");
  ASSERT_EQ(c.ask("connect 5000", 15000), "ok");
  EXPECT_EQ(c.ask("whoami", 15000), "ok 4242");
}

TEST(HostileServer, BrokenRepliesEndCallsWithErrors) {
  FakeRig g;
  start_fake(g, "hostile-server");
  if (HasFatalFailure()) return;
  const char *want[] = {nullptr, "err -14", "err -21", "err -14", "err -21", "err -12"};
  for (int mode = 1; mode <= 5; mode++) {
    g.f.mode = mode;
    // 5 s for the modes that answer (a slow round trip is not the error looked for), 500 ms
    // for the one that never does.
    EXPECT_EQ(g.c.ask(mode == 5 ? "noop 500" : "noop 5000", 15000), want[mode]) << "mode " << mode;
  }
  g.f.mode = 0;
  EXPECT_EQ(g.c.ask("whoami", 15000), "ok 4242");
  EXPECT_EQ(g.c.stop(), 0);
  cxr_rdma_close(g.r);
}

// Calls whose replies never come (a reply the server dropped or refused) must not use up the
// connection's 256 table entries for good: until an audit of 2026-11-28 each kept its entry
// waiting for its reply, and the 256th call failed at once with CXR_EFULL. A reply that
// comes after its call was given up only gives its result back (the next call carries it).
TEST(HostileServer, LostRepliesDoNotUseUpTheConnection) {
  FakeRig g;
  start_fake(g, "hostile-server2");
  if (HasFatalFailure()) return;
  g.f.mode = 5;  // no answers
  for (int i = 0; i < 260; i++) ASSERT_EQ(g.c.ask("noop 2", 15000), "err -12") << i;
  g.f.mode = 0;
  EXPECT_EQ(g.c.ask("whoami", 15000), "ok 4242");
  g.f.mode = 6;  // one late answer: its future is freed by then, its result goes back
  EXPECT_EQ(g.c.ask("noop 2", 15000), "err -12");
  // The release rides on the next call once the late answer is in (50 ms after the call).
  for (int i = 0; i < 100 && g.f.late_released.load() == 0; i++) {
    EXPECT_EQ(g.c.ask("whoami", 15000), "ok 4242");
    usleep(50000);
  }
  EXPECT_EQ(g.f.late_released.load(), 1) << "the late answer's result was not given back";
  EXPECT_EQ(g.c.stop(), 0);
  cxr_rdma_close(g.r);
}

}  // namespace
