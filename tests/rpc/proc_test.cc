// Real processes: servers and clients started with posix_spawn (rpc_peer), killed with
// SIGKILL in the middle of calls. Every wait is bounded; nothing here fails on timing
// except the bounds that stand for "never a hang".
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "rpc/internal.h"
#include "tests/rpc/methods.h"
#include "tests/rpc/rings.h"
#include "tests/rpc/util.h"

using namespace rpctest;

namespace {

class Proc : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { setup_root("rpc-proc"); }
  // A server process with `workers` workers on a fresh channel named after `tag`, and this
  // process connected to it (most cases start so; each ends them itself).
  void serve(const char *tag, int workers) {
    name = uniq(tag);
    srv = start_server(name, workers);
    ASSERT_GT(srv.pid, 0);
    ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  }
  std::string name;
  Peer srv;
  cxr_conn *c = nullptr;
};

cxr_conn_info find_conn(const std::string &name, int pid) {
  cxr_conn_info ci[16];
  size_t n = 0;
  if (cxr_channel_inspect(name.c_str(), nullptr, ci, 16, &n) != 0) return cxr_conn_info{};
  for (size_t i = 0; i < n && i < 16; i++)
    if (ci[i].client_pid == pid && strcmp(ci[i].state, "ready") != 0) return ci[i];
  return cxr_conn_info{};
}

TEST_F(Proc, CallsAcrossProcessesReturnTheRightResults) {
  ASSERT_NO_FATAL_FAILURE(serve("pc", 2));
  cxr_heap *h = cxr_conn_heap(c);
  void *res = nullptr;
  ASSERT_EQ(cxr_conn_call(c, M_PID, nullptr, &res, nullptr), 0);
  ASSERT_NE(res, nullptr);
  EXPECT_EQ(*(int64_t *)res, srv.pid);
  cxr_heap_free(h, res);
  // The server process checks who we are with the kernel: our pid maps the connection's
  // heap, and the uid is ours as /proc says.
  res = nullptr;
  ASSERT_EQ(cxr_conn_call(c, M_PEER, nullptr, &res, nullptr), 0);
  ASSERT_NE(res, nullptr);
  EXPECT_TRUE(((cxr_peer *)res)->verified);
  EXPECT_EQ(((cxr_peer *)res)->pid, (int)getpid());
  EXPECT_EQ(((cxr_peer *)res)->uid, (unsigned)getuid());
  cxr_heap_free(h, res);
  std::atomic<int> good{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; t++)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 300; i++) {
        add_args *a = (add_args *)cxr_heap_alloc(h, sizeof *a);
        a->a = t;
        a->b = i;
        void *r = nullptr;
        if (cxr_conn_call(c, M_ADD, a, &r, nullptr) == 0 && r && *(int64_t *)r == t + i) good++;
        if (r) cxr_heap_free(h, r);
        cxr_heap_free(h, a);
      }
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(good.load(), 900);
  // Many in flight: each thread keeps 32 async calls outstanding, answers checked one by one.
  std::atomic<int> good_async{0};
  std::vector<std::thread> ta;
  for (int t = 0; t < 3; t++)
    ta.emplace_back([&, t] {
      for (int round = 0; round < 20; round++) {
        cxr_future *f[32];
        for (int i = 0; i < 32; i++) {
          add_args a = {t * 100000 + round * 100, i};
          cxr_call_opts o = inline_opts(sizeof a);
          if (cxr_conn_call_async(c, M_ADD, &a, &f[i], &o) != 0) f[i] = nullptr;
        }
        for (int i = 0; i < 32; i++) {
          if (!f[i]) continue;
          void *r = nullptr;
          if (cxr_future_wait(f[i], 0, &r) == 0 && r && *(int64_t *)r == t * 100000 + round * 100 + i)
            good_async++;
          if (r) cxr_heap_free(h, r);
          cxr_future_free(f[i]);
        }
      }
    });
  for (auto &t : ta) t.join();
  EXPECT_EQ(good_async.load(), 3 * 20 * 32);
  cxr_conn_close(c);
  stop_peer(srv);
}

TEST_F(Proc, KilledServerEndsEveryPendingCallWithPeerDead) {
  ASSERT_NO_FATAL_FAILURE(serve("ks", 1));
  // Async calls queued behind a long one, plus sync calls from several threads.
  std::vector<cxr_future *> fs;
  for (int i = 0; i < 10; i++) {
    sleep_args a = {3000};
    cxr_call_opts o = inline_opts(sizeof a, 30000000000);
    cxr_future *f;
    ASSERT_EQ(cxr_conn_call_async(c, M_SLEEP, &a, &f, &o), 0);
    fs.push_back(f);
  }
  std::atomic<int> peer_dead{0}, other{0};
  std::atomic<int64_t> worst_ms{0};
  std::atomic<int64_t> killed_at{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; t++)
    ts.emplace_back([&] {
      sleep_args a = {3000};
      cxr_call_opts o = inline_opts(sizeof a, 30000000000);
      int rc = cxr_conn_call(c, M_SLEEP, &a, nullptr, &o);
      int64_t ms = (cxr_now_ns() - killed_at.load()) / 1000000;
      if (ms > worst_ms.load()) worst_ms = ms;
      (rc == CXR_EPEERDEAD ? peer_dead : other)++;
    });
  usleep(100000);  // everybody is waiting (the first call runs, the rest queue)
  killed_at = cxr_now_ns();
  kill(srv.pid, SIGKILL);
  // No waitpid yet: the dead server stays a zombie, which must count as dead.
  for (auto *f : fs) {
    int rc = cxr_future_wait(f, 10000000000, nullptr);
    int64_t ms = (cxr_now_ns() - killed_at.load()) / 1000000;
    if (ms > worst_ms.load()) worst_ms = ms;
    (rc == CXR_EPEERDEAD ? peer_dead : other)++;
    cxr_future_free(f);
  }
  for (auto &t : ts) t.join();
  EXPECT_EQ(peer_dead.load(), 13);
  EXPECT_EQ(other.load(), 0);
  EXPECT_LT(worst_ms.load(), 5000);  // the bound for "never a hang" (default detection 100 ms)
  printf("dead server detected after %lld ms (peer_timeout 100 ms)\n", (long long)worst_ms.load());
  // Later calls fail at once.
  EXPECT_EQ(cxr_conn_call(c, M_NOOP, nullptr, nullptr, nullptr), CXR_EPEERDEAD);
  cxr_conn_close(c);
  wait_peer(srv);
  // A new server can take the name over from the dead one.
  Peer srv2 = start_server(name, 1);
  ASSERT_GT(srv2.pid, 0);
  ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  EXPECT_EQ(cxr_conn_call(c, M_NOOP, nullptr, nullptr, nullptr), 0);
  cxr_conn_close(c);
  stop_peer(srv2);
}

// A client killed in the middle of a call: its connection is reclaimed (its heap unmapped)
// while ours is served, and the slot is used again. With one worker the server polls a
// private watch list of connections, rebuilt when one is retired (rpc/serve.c): a stale
// entry would touch the unmapped heap.
void killed_client_is_reclaimed(int workers) {
  std::string name = uniq("kc");
  Peer srv = start_server(name, workers);
  ASSERT_GT(srv.pid, 0);
  Peer victim = spawn_peer({"client", name, "300"});
  ASSERT_GT(victim.pid, 0);
  ASSERT_EQ(read_line(victim), "connected");
  cxr_conn *c;
  ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  // Wait until the victim is inside a call on the server, then kill it.
  EXPECT_TRUE(eventually([&] { return find_conn(name, victim.pid).inflight > 0; }, 5000));
  cxr_channel_info before;
  ASSERT_EQ(cxr_channel_inspect(name.c_str(), &before, nullptr, 0, nullptr), 0);
  int victim_pid = victim.pid;
  kill(victim.pid, SIGKILL);
  wait_peer(victim);
  // We keep being served while the server notices and reclaims the dead connection.
  int ok = 0, bad = 0;
  bool reclaimed = false;
  int64_t t0 = cxr_now_ns();
  while (ms_since(t0) < 10000) {
    add_args a = {ok, 1};
    cxr_call_opts o = inline_opts(sizeof a);
    void *r = nullptr;
    if (cxr_conn_call(c, M_ADD, &a, &r, &o) == 0 && r && *(int64_t *)r == ok + 1) ok++;
    else bad++;
    if (r) cxr_heap_free(cxr_conn_heap(c), r);
    cxr_channel_info now;
    if (cxr_channel_inspect(name.c_str(), &now, nullptr, 0, nullptr) == 0 &&
        now.reclaimed > before.reclaimed && find_conn(name, victim_pid).client_pid == 0) {
      reclaimed = true;
      if (ok > 100) break;
    }
  }
  EXPECT_TRUE(reclaimed);
  EXPECT_EQ(bad, 0);
  EXPECT_GT(ok, 100);
  // The reclaimed slot is usable again: connect more clients than the pool holds.
  std::vector<cxr_conn *> more;
  for (int i = 0; i < 6; i++) {
    cxr_conn *x;
    ASSERT_EQ(connect_patiently(&x, name), 0);
    EXPECT_EQ(cxr_conn_call(x, M_NOOP, nullptr, nullptr, nullptr), 0);
    more.push_back(x);
  }
  for (auto *x : more) cxr_conn_close(x);
  cxr_conn_close(c);
  stop_peer(srv);
  EXPECT_EQ(srv.pid, -1);
}

TEST_F(Proc, KilledClientIsReclaimedWhileOthersAreServed) { killed_client_is_reclaimed(2); }
TEST_F(Proc, KilledClientIsReclaimedBySingleWorkerWhileOthersAreServed) {
  killed_client_is_reclaimed(1);
}

// add(a, b) on c: its result, or INT64_MIN with *rc set.
int64_t call_add(cxr_conn *c, int64_t a, int64_t b, int *rc) {
  cxr_heap *h = cxr_conn_heap(c);
  add_args *x = (add_args *)cxr_heap_alloc(h, sizeof *x);
  if (x == nullptr) return *rc = CXR_ENOMEM, INT64_MIN;
  x->a = a, x->b = b;
  void *r = nullptr;
  *rc = cxr_conn_call(c, M_ADD, x, &r, nullptr);
  int64_t v = *rc == 0 && r ? *(int64_t *)r : INT64_MIN;
  if (r) cxr_heap_free(h, r);
  cxr_heap_free(h, x);
  return v;
}

TEST_F(Proc, AChildRefusesTheConnectionItInheritedAndCannotCloseItsParents) {
  ASSERT_NO_FATAL_FAILURE(serve("fk", 2));
  int rc;
  ASSERT_EQ(call_add(c, 1, 2, &rc), 3);
  // A call of the parent's in flight across the fork.
  sleep_args a = {300};
  cxr_call_opts o = inline_opts(sizeof a, 10000000000);
  cxr_future *f = nullptr;
  ASSERT_EQ(cxr_conn_call_async(c, M_SLEEP, &a, &f, &o), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child shares the parent's rings and call ids: it must not call on them, wait on
    // or cancel the parent's call, or give the parent's slot back; a connection of its own
    // works. Each failure sets a bit of the exit code.
    int bad = 0, e;
    if (call_add(c, 5, 6, &e) != INT64_MIN || e != CXR_ECLOSED) bad |= 1;
    if (cxr_future_wait(f, 0, nullptr) != CXR_ECLOSED) bad |= 2;
    if (cxr_future_cancel(f) != CXR_ECLOSED) bad |= 4;
    cxr_future_free(f);
    cxr_conn_close(c);
    cxr_conn *mine = nullptr;
    if (cxr_connect(&mine, name.c_str(), nullptr) != 0 || call_add(mine, 7, 8, &e) != 15) bad |= 8;
    cxr_conn_close(mine);
    _exit(bad);
  }
  Peer kid{child, -1};
  EXPECT_EQ(wait_peer(kid, 20000), 0);  // 0: every check in the child held
  // The parent's call was neither cancelled nor answered to the child, and its connection
  // still works (the child's close used to give its slot back: CXR_ECLOSED here).
  void *res = nullptr;
  EXPECT_EQ(cxr_future_wait(f, 0, &res), 0);
  if (res != nullptr) {
    EXPECT_EQ(*(int64_t *)res, 300);
    cxr_heap_free(cxr_conn_heap(c), res);
  }
  cxr_future_free(f);
  EXPECT_EQ(call_add(c, 20, 22, &rc), 42);
  EXPECT_EQ(rc, 0);
  cxr_conn_close(c);
  stop_peer(srv);
}

TEST_F(Proc, AClientNamingAnotherProcessIsNotVerified) {
  // A client writes another pid into its slot (with that process's start time, so the
  // liveness check does not reclaim the slot first) and a uid into the control block, then
  // calls: the server does not confirm it, neither as the server itself (which maps every
  // connection heap) nor as a process that does not map this one. Named as itself, it is
  // confirmed, with its real uid rather than the one it wrote.
  ASSERT_NO_FATAL_FAILURE(serve("imp", 1));
  auto ask = [&](int pid) {
    Peer p = spawn_peer({"impostor", name, std::to_string(pid)});
    std::string l = read_line(p, 45000);  // the peer waits up to 20 s to connect, 20 s more
    EXPECT_EQ(wait_peer(p), 0);
    return l;
  };
  EXPECT_EQ(ask(srv.pid), "peer 0 " + std::to_string(srv.pid) + " 4242");
  EXPECT_EQ(ask(1), "peer 0 1 4242");
  std::string own = ask(0);
  EXPECT_EQ(own.rfind("peer 1 ", 0), 0u) << own;
  EXPECT_EQ(own.substr(own.rfind(' ') + 1), std::to_string(getuid())) << own;
  cxr_conn_close(c);
  stop_peer(srv);
}

TEST_F(Proc, AForgedCloseDoesNotReadyASlotWhoseRecycleWaitsForAWorker) {
  // A client writes RECLAIM into its own slot (the server takes it back: BUSY), then FREE,
  // while a worker is inside a long handler of another connection (so the recycle waits
  // for it). The server must not hand the slot out again before the recycle is done: it
  // used to make it READY at once, a new client claimed it and called, and the recycle then
  // unmapped the heap under that call (the server died).
  ASSERT_NO_FATAL_FAILURE(serve("forge", 2));
  cxr_conn *busy = nullptr;
  ASSERT_EQ(cxr_connect(&busy, name.c_str(), nullptr), 0);
  // The handler is long enough that it is still running when the state is read below,
  // however slowly a loaded machine gets there (else READY would be right).
  sleep_args a = {4000};
  cxr_call_opts o = inline_opts(sizeof a, 20000000000);
  const uint64_t taken = requests_taken(busy);
  ASSERT_NE(taken, UINT64_MAX);
  cxr_future *f = nullptr;
  ASSERT_EQ(cxr_conn_call_async(busy, M_SLEEP, &a, &f, &o), 0);
  // A worker is inside that handler once the server took the request off the ring.
  ASSERT_TRUE(eventually([&] { return requests_taken(busy) > taken; }, 10000));
  cxr_heap *ctl = nullptr;
  ASSERT_EQ(cxr_heap_open(&ctl, ("ch." + name).c_str()), 0);
  auto *cb = (cxr__chan_block *)cxr_heap_get_root(ctl);
  auto *blk = (cxr__conn_block *)cxr_heap_get_root(cxr_conn_heap(c));
  ASSERT_NE(cb, nullptr);
  ASSERT_NE(blk, nullptr);
  uint64_t *owner = &cb->slots[blk->slot].owner;
  uint64_t o0 = __atomic_load_n(owner, __ATOMIC_ACQUIRE);
  uint32_t gen = cxr__owner_gen(o0);
  __atomic_store_n(owner, cxr__owner(getpid(), CXR__SLOT_RECLAIM, gen), __ATOMIC_RELEASE);
  EXPECT_TRUE(eventually([&] {
    return cxr__owner_state(__atomic_load_n(owner, __ATOMIC_ACQUIRE)) == CXR__SLOT_BUSY;
  }));
  __atomic_store_n(owner, cxr__owner(0, CXR__SLOT_FREE, gen), __ATOMIC_RELEASE);
  // Other clients take every ready slot, so that the pool wants more.
  std::vector<cxr_conn *> more(3, nullptr);
  for (auto &m : more) ASSERT_EQ(cxr_connect(&m, name.c_str(), nullptr), 0);
  usleep(300000);
  unsigned st = cxr__owner_state(__atomic_load_n(owner, __ATOMIC_ACQUIRE));
  EXPECT_TRUE(st == CXR__SLOT_FREE || st == CXR__SLOT_BUSY)
      << "state " << st << ": the slot was handed out again while its recycle waited";
  // Whatever slots they got, the server serves them all, before and after the recycle.
  for (auto *m : more) EXPECT_EQ(cxr_conn_call(m, M_NOOP, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(cxr_future_wait(f, 0, nullptr), 0);
  cxr_future_free(f);
  usleep(200000);
  for (auto *m : more) EXPECT_EQ(cxr_conn_call(m, M_NOOP, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(cxr_conn_call(busy, M_NOOP, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(kill(srv.pid, 0), 0);
  for (auto *m : more) cxr_conn_close(m);
  cxr_conn_close(busy);
  cxr_conn_close(c);  // (taken back by the server: its calls fail, its close is quiet)
  cxr_heap_close(ctl);
  stop_peer(srv);
}

TEST_F(Proc, ScribbledRingsHurtOnlyTheirConnection) {
  // A client process overwrites its request ring's positions, sequence numbers and
  // descriptors with garbage. The server neither crashes nor hangs, keeps serving us, the
  // scribbler's own call ends (any code, by its deadline at the latest), and its slot comes
  // back when it closes.
  ASSERT_NO_FATAL_FAILURE(serve("sc", 2));
  cxr_channel_info before;
  ASSERT_EQ(cxr_channel_inspect(name.c_str(), &before, nullptr, 0, nullptr), 0);
  Peer bad = spawn_peer({"scribble", name, "100"});
  ASSERT_GT(bad.pid, 0);
  int ok = 0;
  int64_t t0 = cxr_now_ns();
  for (;;) {  // calls of ours while it scribbles, until it reports
    struct pollfd pf = {bad.out, POLLIN, 0};
    if (poll(&pf, 1, 0) > 0 || ms_since(t0) > 20000) break;
    void *res = nullptr;
    if (cxr_conn_call(c, M_PID, nullptr, &res, nullptr) == 0 && res && *(int64_t *)res == srv.pid) ok++;
    if (res) cxr_heap_free(cxr_conn_heap(c), res);
    if (ok > 100000) usleep(100);
  }
  std::string line = read_line(bad, 10000);
  EXPECT_EQ(line.rfind("scribbled", 0), 0u) << line;
  EXPECT_EQ(wait_peer(bad), 0);
  EXPECT_GT(ok, 0);
  EXPECT_EQ(kill(srv.pid, 0), 0);
  EXPECT_TRUE(eventually([&] {
    cxr_channel_info now;
    return cxr_channel_inspect(name.c_str(), &now, nullptr, 0, nullptr) == 0 &&
           now.disconnects > before.disconnects && now.connected == 1;
  }, 5000));
  void *res = nullptr;
  EXPECT_EQ(cxr_conn_call(c, M_PID, nullptr, &res, nullptr), 0);
  if (res) cxr_heap_free(cxr_conn_heap(c), res);
  cxr_conn_close(c);
  stop_peer(srv);
}

TEST_F(Proc, AClientThatShrinksItsHeapFileDoesNotKillTheServer) {
  // Any client can truncate its connection heap's file (it opens it for writing): the
  // server's next look at that heap past the new end raised SIGBUS and the server died.
  // Now the server's accesses there find private zero pages (shm/bus_guard.h), it keeps
  // serving, and its manager takes the shrunk heap's connection back (a fresh heap).
  ASSERT_NO_FATAL_FAILURE(serve("shr", 2));
  for (long keep : {0L, 4096L}) {
    cxr_channel_info before;
    ASSERT_EQ(cxr_channel_inspect(name.c_str(), &before, nullptr, 0, nullptr), 0);
    Peer bad = spawn_peer({"shrink", name, std::to_string(keep)});
    ASSERT_GT(bad.pid, 0);
    EXPECT_EQ(read_line(bad, 10000), "shrunk");  // and it stays alive: not reclaimed as dead
    int ok = 0;
    for (int i = 0; i < 200; i++) {  // ~1 s of calls of ours while the server finds it
      void *res = nullptr;
      ok += cxr_conn_call(c, M_PID, nullptr, &res, nullptr) == 0 && res &&
            *(int64_t *)res == srv.pid;
      if (res) cxr_heap_free(cxr_conn_heap(c), res);
      usleep(5000);
    }
    EXPECT_EQ(ok, 200) << "keep " << keep;
    EXPECT_TRUE(eventually([&] {
      cxr_channel_info now;
      return cxr_channel_inspect(name.c_str(), &now, nullptr, 0, nullptr) == 0 &&
             now.reclaimed > before.reclaimed;
    })) << "keep " << keep << ": the shrunk heap's connection was not taken back";
    kill(bad.pid, SIGKILL);
    wait_peer(bad);
    int st = 0;
    EXPECT_EQ(waitpid(srv.pid, &st, WNOHANG), 0) << "the server died: signal "
                                                  << (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  }
  cxr_conn_close(c);
  stop_peer(srv);
}

TEST_F(Proc, MalformedDescriptorsFromAnotherProcessGetErrorReplies) {
  ASSERT_NO_FATAL_FAILURE(serve("mf", 1));
  cxr_heap *h = cxr_conn_heap(c);
  uint32_t n = cxr__conn_table_size(c);
  int local = 0;
  struct Case {
    uint64_t id;
    uint32_t method, flags;
    uint64_t ptr, len;
    int want;
  } cases[] = {
      {(uint64_t)3 << 32 | 1, 4242, 0, 0, 0, CXR_ENOMETHOD},
      {(uint64_t)3 << 32 | 1, M_ADD, 0, (uint64_t)(uintptr_t)&local, 4, CXR_EBADPTR},
      {(uint64_t)3 << 32 | 1, M_ADD, 0, (uint64_t)(uintptr_t)cxr_heap_base(h), cxr_heap_size(h) * 2,
       CXR_EBADPTR},
      {7, M_NOOP, 0, 0, 0, CXR_EPROTO},                        // generation 0
      {(uint64_t)1 << 32 | n, M_NOOP, 0, 0, 0, CXR_EPROTO},    // index beyond the table
      {(uint64_t)3 << 32 | 1, M_NOOP, CXR_CALL_INLINE, 0, 4096, CXR_EPROTO},
      {(uint64_t)3 << 32 | 1, M_NOOP, 1u << 12, 0, 0, CXR_EPROTO},
  };
  for (auto &k : cases) {
    cxr__desc d;
    memset(&d, 0, sizeof d);
    d.call_id = k.id;
    d.method = k.method;
    d.flags = k.flags;
    d.ptr = k.ptr;
    d.len = k.len;
    ASSERT_EQ(cxr__conn_push_raw(c, &d), 0);
    cxr__desc r;
    ASSERT_EQ(cxr__conn_pop_raw(c, &r, 10000000000), 0);
    EXPECT_EQ(r.call_id, k.id);
    EXPECT_EQ(r.status, k.want) << "method " << k.method;
    EXPECT_EQ(r.ptr, 0u);
  }
  EXPECT_EQ(kill(srv.pid, 0), 0);  // still running
  void *res = nullptr;
  ASSERT_EQ(cxr_conn_call(c, M_PID, nullptr, &res, nullptr), 0);
  EXPECT_EQ(*(int64_t *)res, srv.pid);
  cxr_heap_free(h, res);
  EXPECT_GE(find_conn(name, getpid()).malformed, 7u);
  cxr_conn_close(c);
  stop_peer(srv);
}

}  // namespace
