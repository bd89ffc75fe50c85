// examples/docstore end to end: the real server and client binaries in two processes on a
// root of the test's own; the client exits 0 only when every answer it checks is right
// (including a cyclic document refused by the server's skeleton).
#include <gtest/gtest.h>

#include "tests/root.h"
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "examples/docstore/docstore.cxr.h"
#include "examples/docstore/json.h"

namespace {

pid_t run(const char *path, const char *arg, const std::string &log) {
  pid_t p = fork();
  if (p == 0) {
    FILE *f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(1, 2);
    execl(path, path, arg, (char *)nullptr);
    _exit(127);
  }
  return p;
}

// Waits at most ms for pid; -1 on timeout (the child is then killed).
int wait_for(pid_t pid, int ms) {
  for (int i = 0; i < ms / 10; i++) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

std::string slurp(const std::string &path) {
  std::string s;
  FILE *f = fopen(path.c_str(), "r");
  if (!f) return s;
  char b[4096];
  size_t n;
  while ((n = fread(b, 1, sizeof b, f)) > 0) s.append(b, n);
  fclose(f);
  return s;
}

TEST(Docstore, ServerAndClientAgree) {
  std::string root = cxrt::setup_root("docstore");
  std::string chan = "ds" + std::to_string(getpid());
  pid_t srv = run("examples/docstore/server", chan.c_str(), root + "/server.log");
  pid_t cli = run("examples/docstore/client", chan.c_str(), root + "/client.log");
  int rc = wait_for(cli, 60000);
  std::string out = slurp(root + "/client.log");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("query city == \"London\" -> ada alan"), std::string::npos) << out;
  EXPECT_NE(out.find("put of a cyclic tree -> protocol error"), std::string::npos) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
  kill(srv, SIGTERM);
  EXPECT_EQ(wait_for(srv, 10000), 0) << slurp(root + "/server.log");
  EXPECT_NE(slurp(root + "/server.log").find("stopping with 4 documents"), std::string::npos)
      << slurp(root + "/server.log");
}

cxr_conn *connect_to(const std::string &chan) {
  cxr_conn *c = nullptr;
  for (int i = 0; i < 100; i++) {  // the server may still be starting
    if (cxr_connect(&c, chan.c_str(), nullptr) == 0) return c;
    usleep(100000);
  }
  return nullptr;
}

cxr_call_opts within(int64_t ns) {
  cxr_call_opts o;
  cxr_call_opts_init(&o);
  o.deadline_ns = ns;
  return o;
}

int put(cxr_conn *c, const char *id, const char *json) {
  cxr_heap *h = cxr_conn_heap(c);
  char err[128];
  docstore_PutRequest *p = docstore_PutRequest_new(h);
  if (!p || !(p->doc = docstore_Document_new(h))) return CXR_ENOMEM;
  if (cxr_str_setz(h, &p->doc->id, id) || !(p->doc->root = json_parse(h, json, err, sizeof err)))
    return CXR_EINVAL;
  docstore_PutReply *rs = nullptr;
  cxr_call_opts o = within(2000000000);
  int rc = docstore_DocStore_Put(c, p, &rs, &o);
  if (rc == 0) docstore_PutReply_release(c, rs);
  docstore_PutRequest_free(h, p);
  return rc;
}

// A client that flips the path pointers of its Get and Query requests between its own
// string and an unmapped address while it calls. The server read them again after
// validation with its store lock held: a fault there (contained, the handler abandoned)
// left the lock held and every later call of every client hung (reproduced after ~2000
// such Gets). Now each call ends within its deadline, served or refused (CXR_EBADPTR), and
// another client is served afterwards.
TEST(Docstore, RacingRequestPointersLeaveTheStoreServing) {
  std::string root = cxrt::setup_root("docstore-race");
  std::string chan = "dsr" + std::to_string(getpid());
  pid_t srv = run("examples/docstore/server", chan.c_str(), root + "/server.log");
  cxr_conn *c = connect_to(chan);
  if (c == nullptr || put(c, "a", "{\"k\": \"v\"}") != 0) {
    kill(srv, SIGKILL);
    waitpid(srv, nullptr, 0);
    FAIL() << "no store to race: " << slurp(root + "/server.log");
  }
  cxr_heap *h = cxr_conn_heap(c);
  docstore_GetRequest *g = docstore_GetRequest_new(h);
  docstore_QueryRequest *q = docstore_QueryRequest_new(h);
  ASSERT_TRUE(g && q);
  ASSERT_EQ(cxr_str_setz(h, &g->id, "a"), 0);
  ASSERT_EQ(cxr_str_setz(h, &g->path, "k"), 0);
  ASSERT_EQ(cxr_str_setz(h, &q->path, "k"), 0);
  ASSERT_EQ(cxr_str_setz(h, &q->equals, "v"), 0);
  const char *good = g->path.ptr, *unmapped = (const char *)0x1000;
  int served = 0, refused = 0, calls = 0, other = 0, other_rc = 0;
  uint64_t flips_seen = 0;
  {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> flips{0};
    std::thread peer([&] {
      for (uint64_t k = 0; !stop.load(std::memory_order_relaxed); k++) {
        const char *p = k & 1 ? unmapped : good;
        __atomic_store_n(&g->path.ptr, p, __ATOMIC_RELAXED);
        __atomic_store_n(&q->path.ptr, p, __ATOMIC_RELAXED);
        flips.store(k + 1, std::memory_order_relaxed);
        for (volatile int i = 0; i < 50; i++) {
        }
      }
      __atomic_store_n(&g->path.ptr, good, __ATOMIC_RELAXED);
      __atomic_store_n(&q->path.ptr, good, __ATOMIC_RELAXED);
    });
    // On 2 cores the flipping thread shares one with this one or the server's worker, so the
    // pointer a call sees comes in streaks of thousands of calls (CI saw 10000 calls served
    // in a row, and 10000 refused). So start once it flips, and go on past 10000 calls until
    // both outcomes have been seen (bounded by the deadline).
    const int kCalls = 10000;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto running = [&] { return std::chrono::steady_clock::now() < deadline; };
    while (flips.load(std::memory_order_relaxed) == 0 && running()) std::this_thread::yield();
    for (; (calls < kCalls || refused == 0 || served == 0) && running(); calls++) {
      cxr_call_opts o = within(2000000000);
      int rc;
      if (calls & 1) {
        docstore_QueryReply *rs = nullptr;
        rc = docstore_DocStore_Query(c, q, &rs, &o);
        if (rc == 0) docstore_QueryReply_release(c, rs);
      } else {
        docstore_GetReply *rs = nullptr;
        rc = docstore_DocStore_Get(c, g, &rs, &o);
        if (rc == 0) docstore_GetReply_release(c, rs);
      }
      if (rc == 0) {
        served++;
      } else if (rc == CXR_EBADPTR) {
        refused++;
      } else {  // a timeout: the store is stuck, no use going on
        other++, other_rc = rc;
        break;
      }
    }
    flips_seen = flips.load();
    stop = true;
    peer.join();
  }
  EXPECT_EQ(other, 0) << "call " << calls << ": " << cxr_strerror(other_rc) << " (" << served
                      << " served, " << refused << " refused before)";
  EXPECT_GT(served, 0) << "every call saw the unmapped pointer, of " << calls << " (flips: "
                        << flips_seen << ")";
  EXPECT_GT(refused, 0) << "the flips never hit a call, of " << calls << " (flips: "
                        << flips_seen << ")";
  // Another client, after: served within the deadline. (No ASSERT from here on: the server
  // is stopped at the end whatever happened.)
  cxr_conn *c2 = connect_to(chan);
  EXPECT_NE(c2, nullptr);
  if (c2) {
    cxr_heap *h2 = cxr_conn_heap(c2);
    EXPECT_EQ(put(c2, "b", "{\"x\": \"y\"}"), 0);
    docstore_GetRequest *g2 = docstore_GetRequest_new(h2);
    EXPECT_TRUE(g2 && cxr_str_setz(h2, &g2->id, "a") == 0 && cxr_str_setz(h2, &g2->path, "k") == 0);
    docstore_GetReply *rs = nullptr;
    cxr_call_opts o = within(2000000000);
    EXPECT_EQ(g2 ? docstore_DocStore_Get(c2, g2, &rs, &o) : CXR_ENOMEM, 0);
    EXPECT_TRUE(rs && rs->found && rs->value && rs->value->kind_case == 4 &&
                cxr_str_eq(rs->value->kind.text, "v"));
    if (rs) docstore_GetReply_release(c2, rs);
    cxr_conn_close(c2);
  }
  cxr_conn_close(c);
  kill(srv, SIGTERM);
  EXPECT_EQ(wait_for(srv, 10000), 0) << slurp(root + "/server.log");
}

}  // namespace
