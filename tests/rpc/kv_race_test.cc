// The kv server against a client that rewrites its request while the server reads it: the
// request lives in the client's connection heap, which the client can keep writing during
// the call. A flipper thread toggles a Get request's key length between a valid 8 and 64 KiB
// (the key points at 64 KiB of heap, so the long length passes the heap bounds check and only
// the KV_KEY_MAX check stands between it and the handler's key buffer on the stack) while
// the test thread keeps calling Get with it. A handler that reads the length twice (check,
// then use) copies 64 KiB into its 250-byte buffer and the server dies for every client. The
// server must survive, answer every racing Get with either the value or CXR_EINVAL (the
// length it read once), and still answer a normal call. Also a request pointer at the end
// of the heap (heap_end).
#include <gtest/gtest.h>
#include <stdio.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "examples/kvstore/kv.cxr.h"
#include "tests/rpc/kv_client.h"
#include "tests/rpc/util.h"

using namespace rpctest;

namespace {

constexpr char kKey[] = "race-key";         // 8 bytes, no terminator sent
constexpr uint64_t kKeyLen = sizeof kKey - 1;
constexpr uint64_t kLongLen = 64 << 10;     // > KV_KEY_MAX, inside the key's block
constexpr int64_t kRaceNs = 2000000000;     // per channel kind: both stay within 5 s
constexpr uint64_t kMaxGets = 2000000;      // a bound on the calls too, whatever the speed
constexpr int kFlippers = 1;                // 2 CPUs here: one flipper, one caller, one worker

// Get: "" with the error, the value on a hit, "<miss>" on a miss that succeeded.
int get(cxr_conn *c, const cxr_bytes *rq, std::string *value) {
  char buf[64];
  int64_t len;
  // 3 s: a dead server ends the call sooner (the connection's liveness check); a late answer
  // on a loaded machine under TSan must not count as a wrong one.
  int rc = kvc_get(c, rq, 3000000000, buf, sizeof buf, &len);
  if (len >= 0) value->assign(buf, std::min<size_t>((size_t)len, sizeof buf));
  else *value = rc == 0 ? "<miss>" : "";
  return rc;
}

// kv_server on a channel of its own, killed when this goes out of scope (Reap). ready: its
// first line ("... ready ..." when it is).
struct Server {
  Peer p;
  Reap reap{p};
  std::string ready;
  Server(const std::string &name, const char *heap_mib, bool untrusted) {
    std::vector<std::string> args = {"--channel", name, "--heap", heap_mib};
    if (untrusted) args.push_back("--untrusted");
    p = spawn_bin(runfile("examples/kvstore/kv_server"), args, true);
    ready = p.pid > 0 ? read_line(p, 20000) : "kv_server did not start";
  }
  // What a dead server said ("stack smashing detected", ASan's report, ...), "" if alive.
  std::string last_words() { return alive(p) ? "" : "died:\n" + read_all(p, 2000); }
  // SIGTERM, then its exit status (0: a clean exit) and what it wrote meanwhile.
  int stop(std::string *out) {
    kill(p.pid, SIGTERM);
    *out = read_all(p);
    return wait_peer(p, 20000);
  }
};

void race(bool untrusted) {
  std::string name = uniq("kvrace");
  Server server(name, "16", untrusted);
  ASSERT_NE(server.ready.find("ready"), std::string::npos) << server.ready;

  cxr_conn *c = nullptr;
  ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  uint8_t *key = (uint8_t *)cxr_heap_alloc(cxr_conn_heap(c), kLongLen);
  ASSERT_NE(key, nullptr);
  memset(key, 'x', kLongLen);
  memcpy(key, kKey, kKeyLen);
  const std::string want = "the value";
  ASSERT_EQ(kvc_set(c, kKey, kKeyLen, want.data(), want.size()), 0);
  cxr_bytes *rq = kvc_get_request(c);  // the request's key field
  ASSERT_NE(rq, nullptr);
  *rq = {key, kKeyLen};
  std::string got;
  ASSERT_EQ(get(c, rq, &got), 0);
  ASSERT_EQ(got, want);

  // The client's side of the race is deliberate: relaxed atomic stores, so that only the
  // server's reads (another process, out of TSan's sight) are in question.
  std::atomic<bool> stop{false};
  std::vector<std::thread> flippers;
  for (int i = 0; i < kFlippers; i++)
    flippers.emplace_back([&] {
      for (uint64_t n = 0; !stop.load(std::memory_order_relaxed); n++)
        __atomic_store_n(&rq->len, (n & 1) ? kLongLen : kKeyLen, __ATOMIC_RELAXED);
    });
  uint64_t gets = 0, hits = 0, refused = 0, wrong = 0;
  std::string first_wrong;
  int64_t t0 = cxr_now_ns();
  bool dead = false;
  for (; gets < kMaxGets && cxr_now_ns() - t0 < kRaceNs; gets++) {
    int rc = get(c, rq, &got);
    if (rc == 0 && got == want) hits++;
    else if (rc == CXR_EINVAL && got.empty()) refused++;
    else if (wrong++ == 0) first_wrong = std::string(cxr_strerror(rc)) + " " + got;
    if ((gets & 255) == 0 && !alive(server.p)) {
      dead = true;
      break;
    }
  }
  stop.store(true);
  for (auto &t : flippers) t.join();
  rq->len = kKeyLen;

  std::string out = server.last_words();
  dead = dead || !out.empty();
  EXPECT_FALSE(dead) << "server died after " << gets << " racing Gets: " << out;
  EXPECT_EQ(wrong, 0u) << "of " << gets << " Gets, first: " << first_wrong;
  // Both lengths usually reach the server; a machine too loaded to run the flipper at all
  // makes the case weaker, not failed (tests never fail on timing).
  if (hits == 0 || refused == 0)
    fprintf(stderr, "kv_race_test: the race did not run both ways (%lu hits, %lu refused)\n",
            (unsigned long)hits, (unsigned long)refused);
  if (!dead) {
    ASSERT_EQ(get(c, rq, &got), 0);  // a normal call, answered correctly
    EXPECT_EQ(got, want);
  }
  cxr_conn_close(c);
  if (!dead) {
    EXPECT_EQ(server.stop(&out), 0) << out;  // and a clean exit
  }
}

// A request pointer at the last byte of the connection heap, with arg_len 1 (the byte the
// server checks lies inside): the handler would read the request struct past the heap's
// end. Behind the heap the server mapped highest lies only the window's reserve, so the
// trusted kv_server (whose skeleton does not validate) died of SIGSEGV for every client, a
// review found. The skeleton must refuse it with CXR_EBADPTR on every connection. The
// server keeps spare heaps mapped above those in use: the test takes every connection the
// server has (so the highest heap is one of ours) and tries each.
void heap_end(bool untrusted) {
  std::string name = uniq("kvend");
  Server server(name, "1", untrusted);
  ASSERT_NE(server.ready.find("ready"), std::string::npos) << server.ready;

  constexpr int kMaxConns = 64;  // kv_server takes 32
  cxr_conn *c[kMaxConns] = {};
  int n = 0;
  while (n < kMaxConns && cxr_connect(&c[n], name.c_str(), nullptr) == 0) n++;
  ASSERT_GT(n, 0);
  for (int i = n - 1; i >= 0; i--) {
    cxr_heap *h = cxr_conn_heap(c[i]);
    const char *end = (const char *)cxr_heap_base(h) + cxr_heap_size(h);
    cxr_call_opts o;
    cxr_call_opts_init(&o);
    o.arg_len = 1;
    o.deadline_ns = 3000000000;  // a dead server ends the call sooner
    void *res = nullptr;
    EXPECT_EQ(cxr_conn_call(c[i], kv_KV_Get_ID, end - 1, &res, &o), CXR_EBADPTR)
        << "connection " << i;
    EXPECT_EQ(res, nullptr);
    if (!alive(server.p)) break;
  }
  std::string out = server.last_words();
  ASSERT_TRUE(out.empty()) << "the server " << out;
  // Every connection is still served.
  const std::string want = "v";
  for (int i = 0; i < n; i++) {
    ASSERT_EQ(kvc_set(c[i], "k", 1, want.data(), want.size()), 0) << "connection " << i;
    cxr_bytes *rq = kvc_get_request(c[i]);
    ASSERT_NE(rq, nullptr);
    uint8_t *key = (uint8_t *)cxr_heap_alloc(cxr_conn_heap(c[i]), 1);
    ASSERT_NE(key, nullptr);
    key[0] = 'k';
    *rq = {key, 1};
    std::string got;
    EXPECT_EQ(get(c[i], rq, &got), 0);
    EXPECT_EQ(got, want);
  }
  for (int i = 0; i < n; i++) cxr_conn_close(c[i]);
  EXPECT_EQ(server.stop(&out), 0) << out;
}

TEST(KvRace, TrustedChannelRefusesARequestAtTheHeapsEnd) {
  setup_root("rpc-kvrace");
  heap_end(false);
}

TEST(KvRace, UntrustedChannelRefusesARequestAtTheHeapsEnd) {
  setup_root("rpc-kvrace");
  heap_end(true);
}

TEST(KvRace, TrustedChannelSurvivesAKeyLengthRewrittenDuringGet) {
  setup_root("rpc-kvrace");
  race(false);
}

TEST(KvRace, UntrustedChannelSurvivesAKeyLengthRewrittenDuringGet) {
  setup_root("rpc-kvrace");
  race(true);
}

}  // namespace
