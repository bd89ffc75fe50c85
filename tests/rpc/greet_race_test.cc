// The README tour's Greeter (examples/greet, `greet --server`) against a client that rewrites
// its request during the calls. The channel is untrusted but the calls are not sealed, so
// the skeleton validates a request the client can still change. A flipper thread toggles the
// request's name and tag pointers between strings of the calling connection and a secret in
// another connection's heap (both mapped by the server) while the test thread keeps calling
// Say. A handler that reads a field again after validation copies the secret into the reply
// ("hello, SECRET-OF-A", a review found). The server must answer each call with the good
// strings or CXR_EBADPTR, never the secret, and stay up.
#include <gtest/gtest.h>
#include <stdio.h>

#include <atomic>
#include <string>
#include <thread>

#include "examples/greet/greet.cxr.h"
#include "tests/rpc/util.h"

using namespace rpctest;

namespace {

constexpr char kSecret[] = "SECRET-OF-A";
constexpr int64_t kRaceNs = 2000000000;  // the whole race: a leak may take many calls
constexpr int kMaxCalls = 1000000;       // a bound on the calls too, whatever the speed

// A copy of z in h (NUL-terminated), or nullptr.
const char *put(cxr_heap *h, const char *z) {
  char *p = (char *)cxr_heap_alloc(h, strlen(z) + 1);
  if (p) memcpy(p, z, strlen(z) + 1);
  return p;
}

TEST(GreetRace, RewrittenRequestPointersNeverReachAnotherConnectionsHeap) {
  setup_root("rpc-greetrace");
  std::string name = uniq("greetrace");
  Peer srv = spawn_bin(runfile("examples/greet/greet"), {"--server", name}, true);
  ASSERT_GT(srv.pid, 0);
  Reap reap{srv};
  std::string ready = read_line(srv, 20000);
  ASSERT_EQ(ready, "ready");

  cxr_conn *a = nullptr, *b = nullptr;
  ASSERT_EQ(cxr_connect(&a, name.c_str(), nullptr), 0);
  ASSERT_EQ(cxr_connect(&b, name.c_str(), nullptr), 0);
  const char *secret = put(cxr_conn_heap(a), kSecret);  // the victim's private data
  cxr_heap *h = cxr_conn_heap(b);
  const char *good = put(h, "bob........"), *tag = put(h, "tag........");
  ASSERT_TRUE(secret && good && tag);
  greet_Hello *rq = greet_Hello_new(h);
  ASSERT_NE(rq, nullptr);
  ASSERT_NE(CXR_VEC_ALLOC(h, rq->tags, 1), nullptr);
  rq->name = {good, sizeof kSecret - 1};
  rq->tags.items[0] = {tag, sizeof kSecret - 1};

  // The client's side of the race is deliberate: relaxed atomic stores (the server's reads
  // are in another process, out of TSan's sight).
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> flips{0};
  std::thread flipper([&] {
    for (uint64_t k = 0; !stop.load(std::memory_order_relaxed); k++) {
      __atomic_store_n(&rq->name.ptr, k & 1 ? secret : good, __ATOMIC_RELAXED);
      __atomic_store_n(&rq->tags.items[0].ptr, k & 2 ? secret : tag, __ATOMIC_RELAXED);
      flips.store(k + 1, std::memory_order_relaxed);
      for (volatile int i = 0; i < 50; i++) {
      }
    }
  });
  int calls = 0, served = 0, refused = 0, leaked = 0, other = 0;
  std::string first_leak, first_other;
  int64_t t0 = cxr_now_ns();
  while (flips.load(std::memory_order_relaxed) == 0 && cxr_now_ns() - t0 < kRaceNs)
    std::this_thread::yield();
  // On 2 cores the outcomes come in streaks (the old handler leaked once in ~1000 calls, or
  // in none of 20000): the whole time, unless a leak ends it sooner.
  for (; calls < kMaxCalls && leaked == 0 && cxr_now_ns() - t0 < kRaceNs; calls++) {
    cxr_call_opts o;
    cxr_call_opts_init(&o);
    o.deadline_ns = 2000000000;
    greet_Reply *rs = nullptr;
    int rc = greet_Greeter_Say(b, rq, &rs, &o);
    if (rc == 0) {
      std::string text(rs->text.ptr, rs->text.len);
      if (text.find("SECRET") != std::string::npos) {
        if (leaked++ == 0) first_leak = text;
      } else {
        served++;
      }
      greet_Reply_release(b, rs);
    } else if (rc == CXR_EBADPTR) {
      refused++;
    } else {
      if (other++ == 0) first_other = cxr_strerror(rc);
      if (!alive(srv)) break;
    }
  }
  stop.store(true);
  flipper.join();
  rq->name.ptr = good;
  rq->tags.items[0].ptr = tag;

  EXPECT_EQ(leaked, 0) << "of " << calls << " calls; first reply: " << first_leak;
  EXPECT_EQ(other, 0) << "of " << calls << " calls, first: " << first_other;
  if (served == 0 || refused == 0)  // a weaker case on a loaded machine, not a failure
    fprintf(stderr, "greet_race_test: the race did not run both ways (%d served, %d refused)\n",
            served, refused);
  ASSERT_TRUE(alive(srv)) << read_all(srv, 2000);
  greet_Reply *rs = nullptr;
  ASSERT_EQ(greet_Greeter_Say(b, rq, &rs, nullptr), 0);  // a normal call, answered correctly
  EXPECT_EQ(std::string(rs->text.ptr, rs->text.len), "hello, bob........ [tag........]");
  greet_Reply_release(b, rs);
  cxr_conn_close(a);
  cxr_conn_close(b);
  kill(srv.pid, SIGTERM);
  std::string out = read_all(srv);
  EXPECT_EQ(wait_peer(srv, 20000), 0) << out;  // and a clean exit
}

}  // namespace
