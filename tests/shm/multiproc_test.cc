// Real processes on one heap: random stress with checksums across 4 processes x 2 threads,
// SIGKILL in the middle of allocating, removal after the last holder, concurrent creators.
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <set>

#include <cxrpc/shm.h>

#include "tests/shm/util.h"

using namespace shmtest;

static std::string g_root = setup_root("multiproc_test");

namespace {

// A mailbox in the heap through which threads of different processes hand blocks over, so
// blocks are freed by a process that did not allocate them.
constexpr int kBox = 64;
struct Posted {
  std::atomic<uint64_t> ptr;  // 0 = empty
  uint64_t size, sum;
};
struct Shared {
  Posted box[kBox];
  std::atomic<uint64_t> handed;
};

struct Live {
  unsigned char *p;
  size_t size;
  uint64_t sum;
};

uint64_t xs(uint64_t *s) {  // xorshift64
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

size_t pick_size(uint64_t r) {
  switch (r % 8) {
    case 0: return 1 + r % 64;
    case 1: case 2: return 16 + r % 512;
    case 3: return 500 + r % 4000;
    case 4: return 4000 + r % 4193;
    case 5: return 9000 + r % 30000;  // page runs
    default: return 8 + r % 200;
  }
}

struct Worker {
  cxr_heap *h;
  Shared *sh;
  uint64_t seed;
  int ops;
  int proc;
  int error = 0;
};

// Which mailbox slot to use. TSan sees only its own process: a block handed to another
// process, freed there and reallocated here would look like a race to it (the ordering goes
// through the other process). Under TSan each process keeps to its own slots.
Posted &box_slot(Worker *w, uint64_t r) {
#if defined(__SANITIZE_THREAD__)
  return w->sh->box[(uint64_t)w->proc * (kBox / 4) + r % (kBox / 4)];
#else
  return w->sh->box[r % kBox];
#endif
}

void *work(void *arg) {
  Worker *w = (Worker *)arg;
  uint64_t s = w->seed;
  std::vector<Live> live;
  auto verify_free = [&](unsigned char *p, size_t size, uint64_t sum) {
    if (!cxr_heap_contains(w->h, p, size) || fnv(p, size) != sum) w->error = 1;
    cxr_heap_free(w->h, p);
  };
  for (int i = 0; i < w->ops && !w->error; i++) {
    uint64_t r = xs(&s);
    if (r % 3 != 0 && live.size() < 100) {
      size_t size = pick_size(xs(&s));
      unsigned char *p = (unsigned char *)cxr_heap_alloc(w->h, size);
      if (!p) {
        w->error = 2;
        break;
      }
      for (size_t k = 0; k < size; k++) p[k] = (unsigned char)(xs(&s) >> 11);
      live.push_back({p, size, fnv(p, size)});
    } else if (!live.empty()) {
      size_t k = xs(&s) % live.size();
      Live l = live[k];
      live[k] = live.back();
      live.pop_back();
      if (fnv(l.p, l.size) != l.sum) {
        w->error = 3;
        break;
      }
      // Hand it to whoever takes it next (maybe another process), or free it.
      Posted &slot = box_slot(w, xs(&s));
      uint64_t expect = 0;
      if (r % 2 && slot.ptr.load() == 0) {
        // Claim with a marker, fill, then publish.
        if (slot.ptr.compare_exchange_strong(expect, 1)) {
          slot.size = l.size;
          slot.sum = l.sum;
          slot.ptr.store((uint64_t)l.p);
          w->sh->handed++;
          continue;
        }
      }
      verify_free(l.p, l.size, l.sum);
    }
    if (r % 5 == 0) {  // take something another thread posted
      Posted &slot = box_slot(w, xs(&s));
      uint64_t v = slot.ptr.load();
      if (v > 1 && slot.ptr.compare_exchange_strong(v, 1)) {
        size_t size = slot.size;
        uint64_t sum = slot.sum;
        slot.ptr.store(0);
        verify_free((unsigned char *)v, size, sum);
      }
    }
  }
  for (Live &l : live) verify_free(l.p, l.size, l.sum);
  return nullptr;
}

// Three cases end a child holding h with SIGKILL and check the same thing: it died of the
// signal, one reap took its lease back. st gets the heap's statistics after the reap. Every
// step runs even when an earlier one fails; the result names each that failed.
::testing::AssertionResult killed_and_reaped(cxr_heap *h, pid_t pid, cxr_heap_stats *st) {
  std::string why;
  int status = wait_child(pid);
  if (status != 128 + SIGKILL)
    why += " child ended with " + std::to_string(status) + ", not SIGKILL;";
  int reaped = cxr_heap_reap(h);
  if (reaped != 1) why += " reap took " + std::to_string(reaped) + " leases, not 1;";
  memset(st, 0, sizeof *st);
  int rc = cxr_heap_stats(h, st);
  if (rc != 0) why += std::string(" stats: ") + cxr_strerror(rc) + ";";
  if (why.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << why;
}

}  // namespace

TEST(MultiProc, FourProcessesTwoThreadsRandomOpsNoCorruption) {
  std::string name = uniq("stress");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 32 << 20), 0);
  Shared *sh = (Shared *)cxr_heap_alloc(h, sizeof(Shared));
  ASSERT_NE(sh, nullptr);
  memset((void *)sh, 0, sizeof *sh);
  cxr_heap_set_root(h, sh);
  cxr_heap_stats st0;
  ASSERT_EQ(cxr_heap_stats(h, &st0), 0);

  std::vector<pid_t> pids;
  for (int p = 0; p < 4; p++) {
    pids.push_back(spawn([&, p]() -> int {
      cxr_heap *c = nullptr;
      if (cxr_heap_open(&c, name.c_str()) != 0) return 10;
      Shared *csh = (Shared *)cxr_heap_get_root(c);
      if (csh != sh) return 11;
      Worker w[2];
      pthread_t t[2];
      for (int k = 0; k < 2; k++) {
        w[k].h = c;
        w[k].sh = csh;
        w[k].seed = 0x9E3779B97F4A7C15ull * (p * 2 + k + 1);
        w[k].ops = 6000;
        w[k].proc = p;
        pthread_create(&t[k], nullptr, work, &w[k]);
      }
      for (int k = 0; k < 2; k++) pthread_join(t[k], nullptr);
      cxr_heap_close(c);
      for (int k = 0; k < 2; k++)
        if (w[k].error) return 20 + w[k].error;
      return 0;
    }));
  }
  for (pid_t pid : pids) EXPECT_EQ(wait_child(pid, 60000), 0);
  // What is still posted: verify and free it here (a third party frees).
  int left = 0;
  for (int i = 0; i < kBox; i++) {
    uint64_t v = sh->box[i].ptr.load();
    if (v > 1) {
      EXPECT_EQ(fnv((void *)v, sh->box[i].size), sh->box[i].sum);
      cxr_heap_free(h, (void *)v);
      left++;
    }
  }
  EXPECT_GT(sh->handed.load(), 0u);
  cxr_heap_stats st;
  ASSERT_EQ(cxr_heap_stats(h, &st), 0);
  EXPECT_EQ(st.used, st0.used) << "left " << left;
  EXPECT_EQ(st.holders, 1u);
  EXPECT_GT(st.allocs, 8000u);
  EXPECT_EQ(st.allocs - st0.allocs, st.frees - st0.frees);
  cxr_heap_free(h, sh);
  cxr_heap_close(h);
  EXPECT_TRUE(list_dir(g_root).empty());
}

// Children allocate in a loop (small blocks from two threads, page runs under the lock)
// until killed with SIGKILL at a random moment; the heap must stay consistent and the
// dead child's memory must come back when it is reaped.
TEST(MultiProc, SigkillInTheMiddleOfAllocatingLeavesHeapConsistent) {
  std::string name = uniq("kill");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 16 << 20), 0);
  cxr_heap_stats st0;
  ASSERT_EQ(cxr_heap_stats(h, &st0), 0);
  uint64_t seed = 12345;
  for (int round = 0; round < 8; round++) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = spawn([&]() -> int {
      close(fds[0]);
      cxr_heap *c = nullptr;
      if (cxr_heap_open(&c, name.c_str()) != 0) return 10;
      struct Arg {
        cxr_heap *c;
        uint64_t s;
      };
      auto loop = [](void *a) -> void * {
        Arg *arg = (Arg *)a;
        std::vector<void *> keep;
        for (;;) {
          size_t size = pick_size(xs(&arg->s));
          void *p = cxr_heap_alloc(arg->c, size);
          if (p) {
            memset(p, 0x5A, size);
            keep.push_back(p);
          }
          if (keep.size() > 300 || (!p && !keep.empty())) {
            for (size_t k = 0; k < keep.size(); k += 2) cxr_heap_free(arg->c, keep[k]);
            keep.clear();
          }
        }
        return nullptr;
      };
      Arg a1{c, 77}, a2{c, 99};
      pthread_t t;
      pthread_create(&t, nullptr, loop, &a1);
      char b = 1;
      if (write(fds[1], &b, 1) != 1) return 11;
      loop(&a2);
      return 0;
    });
    close(fds[1]);
    char b;
    ASSERT_EQ(read(fds[0], &b, 1), 1);
    close(fds[0]);
    usleep(1000 + xs(&seed) % 20000);
    kill(pid, SIGKILL);
    // The lease is over: reaping gives everything back.
    cxr_heap_stats st;
    EXPECT_TRUE(killed_and_reaped(h, pid, &st)) << "round " << round;
    EXPECT_EQ(st.used, st0.used) << "round " << round;
    EXPECT_EQ(st.cached, 0u) << "round " << round;
    EXPECT_EQ(st.holders, 1u);
  }
  // Still a working heap: fill it with a mix, verify, free.
  std::vector<Live> live;
  for (int i = 0; i < 20000; i++) {
    size_t size = pick_size(xs(&seed));
    unsigned char *p = (unsigned char *)cxr_heap_alloc(h, size);
    if (!p) break;
    for (size_t k = 0; k < size; k++) p[k] = (unsigned char)(i + k);
    live.push_back({p, size, fnv(p, size)});
  }
  EXPECT_GT(live.size(), 500u);
  std::set<uintptr_t> seen;
  for (Live &l : live) {
    EXPECT_TRUE(seen.insert((uintptr_t)l.p).second);
    EXPECT_EQ(fnv(l.p, l.size), l.sum);
    cxr_heap_free(h, l.p);
  }
  cxr_heap_stats st;
  cxr_heap_stats(h, &st);
  EXPECT_EQ(st.used, st0.used);
  cxr_heap_close(h);
  EXPECT_TRUE(list_dir(g_root).empty());
}

TEST(MultiProc, KeepOrphansKeepsWhatTheDeadOwned) {
  std::string name = uniq("orphans");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 4 << 20, /*keep_orphans=*/true), 0);
  pid_t pid = spawn([&]() -> int {
    cxr_heap *c = nullptr;
    if (cxr_heap_open(&c, name.c_str()) != 0) return 10;
    char *p = (char *)cxr_heap_alloc(c, 100);
    strcpy(p, "kept");
    void *q = cxr_heap_alloc(c, 100);  // cached blocks come back, allocated stay
    cxr_heap_free(c, q);
    cxr_heap_set_root(c, p);
    kill(getpid(), SIGKILL);
    return 0;
  });
  cxr_heap_stats st;
  EXPECT_TRUE(killed_and_reaped(h, pid, &st));
  EXPECT_EQ(st.used, 112u);
  EXPECT_EQ(st.cached, 0u);
  char *p = (char *)cxr_heap_get_root(h);
  ASSERT_NE(p, nullptr);
  EXPECT_STREQ(p, "kept");
  cxr_heap_free(h, p);
  cxr_heap_stats(h, &st);
  EXPECT_EQ(st.used, 0u);
  cxr_heap_close(h);
}

TEST(MultiProc, NothingLeftAfterTheLastHolderExitsOrDies) {
  std::string a = uniq("exit"), b = uniq("die");
  // Created by children; the parent never holds them.
  pid_t p1 = spawn([&]() -> int {
    cxr_heap *c;
    if (create_self_removing(&c, a, 1 << 20) != 0) return 10;
    cxr_heap_alloc(c, 100);
    exit(0);  // no close: the lease goes at exit
  });
  EXPECT_EQ(wait_child(p1), 0);
  EXPECT_TRUE(list_dir(g_root).empty());
  pid_t p2 = spawn([&]() -> int {
    cxr_heap *c;
    if (cxr_heap_create(&c, b.c_str(), 1 << 20, nullptr) != 0) return 10;
    cxr_heap_alloc(c, 100);
    if (cxr_heap_unlink(b.c_str()) != 0) return 11;
    kill(getpid(), SIGKILL);
    return 0;
  });
  EXPECT_EQ(wait_child(p2), 128 + SIGKILL);
  // The unlinked heap's holder died: the next look at the registry removes it.
  EXPECT_FALSE(list_dir(g_root).empty());
  size_t n = 99;
  ASSERT_EQ(cxr_registry_list(nullptr, 0, &n), 0);
  EXPECT_EQ(n, 0u);
  EXPECT_TRUE(list_dir(g_root).empty());
}

TEST(MultiProc, ConcurrentCreatorsGetDisjointRangesAndOneWinsAName) {
  const int N = 6;
  std::string base = uniq("cc");
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < N; i++)
    pids.push_back(spawn([&, i]() -> int {
      close(go[1]);
      char b;
      if (read(go[0], &b, 1) != 0) return 9;  // released when the parent closes
      cxr_heap *c;
      std::string n = base + "-" + std::to_string(i);
      if (cxr_heap_create(&c, n.c_str(), 3 << 20, nullptr) != 0) return 10;
      int rc = cxr_heap_create(&c, (base + "-same").c_str(), 1 << 20, nullptr);
      return rc == 0 ? 0 : rc == CXR_EEXIST ? 1 : 12;
    }));
  close(go[0]);
  close(go[1]);
  int winners = 0;
  for (pid_t pid : pids) {
    int rc = wait_child(pid);
    EXPECT_TRUE(rc == 0 || rc == 1) << rc;
    winners += rc == 0;
  }
  EXPECT_EQ(winners, 1);
  cxr_heap_info info[16];
  size_t n = 0;
  ASSERT_EQ(cxr_registry_list(info, 16, &n), 0);
  ASSERT_EQ(n, (size_t)N + 1);
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      EXPECT_TRUE(info[i].addr + info[i].size <= info[j].addr ||
                  info[j].addr + info[j].size <= info[i].addr)
          << info[i].name << " " << info[j].name;
  for (size_t i = 0; i < n; i++) {
    EXPECT_EQ(info[i].holders, 0u);  // the creators exited
    EXPECT_EQ(cxr_heap_unlink(info[i].name), 0);
  }
  EXPECT_TRUE(list_dir(g_root).empty());
}

// A child that uses a handle inherited over fork gets a lease of its own on first use, so
// its allocations are its own (and come back when it dies), not its parent's.
TEST(MultiProc, InheritedHandleTakesItsOwnLease) {
  std::string name = uniq("inherit");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 2 << 20), 0);
  void *mine = cxr_heap_alloc(h, 48);  // also fills this thread's cache
  ASSERT_NE(mine, nullptr);
  // The child must never get a block that sits in the parent's cache.
  const int K = 40;
  void **theirs = (void **)cxr_heap_alloc(h, K * sizeof(void *));
  memset(theirs, 0, K * sizeof(void *));
  pid_t first = spawn([&]() -> int {
    for (int i = 0; i < K; i++)
      if (!(theirs[i] = cxr_heap_alloc(h, 48))) return 10;
    cxr_heap_close(h);
    return 0;
  });
  ASSERT_EQ(wait_child(first), 0);
  std::set<void *> child_blocks(theirs, theirs + K);
  for (int i = 0; i < K; i++) {
    void *p = cxr_heap_alloc(h, 48);
    EXPECT_EQ(child_blocks.count(p), 0u) << "block handed out twice: " << p;
  }
  cxr_heap_stats st0;
  cxr_heap_stats(h, &st0);
  pid_t pid = spawn([&]() -> int {
    void *p = cxr_heap_alloc(h, 48);
    if (!p || p == mine) return 10;
    cxr_heap_stats st;
    if (cxr_heap_stats(h, &st) != 0 || st.holders != 2) return 11;
    cxr_heap_free(h, mine);  // freeing the parent's block is allowed
    if (!cxr_heap_alloc(h, 5000)) return 12;
    kill(getpid(), SIGKILL);
    return 0;
  });
  cxr_heap_stats st;
  EXPECT_TRUE(killed_and_reaped(h, pid, &st));
  EXPECT_EQ(st.holders, 1u);
  EXPECT_EQ(st.used, st0.used - 48);  // the child's blocks came back, and `mine` was freed
  // The parent's cache is untouched by the child's death.
  void *q = cxr_heap_alloc(h, 48);
  EXPECT_NE(q, nullptr);
  cxr_heap_free(h, q);
  cxr_heap_close(h);
  EXPECT_TRUE(list_dir(g_root).empty());
}

// Processes creating, joining, closing and unlinking heaps at the same time: the registry
// stays consistent (every create either works or says why) and nothing is left behind.
TEST(MultiProc, RegistryChurnLeavesNothingBehind) {
  std::string base = uniq("churn");
  std::vector<pid_t> pids;
  for (int p = 0; p < 4; p++)
    pids.push_back(spawn([&, p]() -> int {
      uint64_t s = 1000 + p;
      for (int i = 0; i < 25; i++) {
        std::string mine = base + "-" + std::to_string(p) + "-" + std::to_string(i % 3);
        cxr_heap *h = nullptr;
        cxr_heap_opts o;
        cxr_heap_opts_init(&o);
        o.remove_on_last_close = (xs(&s) & 1) != 0;
        // Create or join. A neighbour that joined the last one of this name may close it
        // (and, as its last holder, remove it) between our EEXIST and our open: then again.
        int rc = CXR_ENOENT;
        for (int t = 0; t < 100 && rc == CXR_ENOENT; t++) {
          rc = cxr_heap_create(&h, mine.c_str(), 1 << 20, &o);
          if (rc == CXR_EEXIST) rc = cxr_heap_open(&h, mine.c_str());
        }
        if (rc != 0) return 100 - rc;  // 100 + the code's magnitude, to tell them apart
        if (!cxr_heap_alloc(h, 100)) return 11;
        // Join a neighbour's heap if it exists right now.
        std::string other = base + "-" + std::to_string((p + 1) % 4) + "-" + std::to_string(xs(&s) % 3);
        cxr_heap *g = nullptr;
        rc = cxr_heap_open(&g, other.c_str());
        if (rc == 0) {
          void *q = cxr_heap_alloc(g, 64);
          if (!q) return 12;
          cxr_heap_free(g, q);
          cxr_heap_close(g);
        } else if (rc != CXR_ENOENT) {
          return 13;
        }
        cxr_heap_close(h);
        if (xs(&s) % 2) {
          rc = cxr_heap_unlink(mine.c_str());
          if (rc != 0 && rc != CXR_ENOENT) return 14;
        }
      }
      for (int i = 0; i < 3; i++) cxr_heap_unlink((base + "-" + std::to_string(p) + "-" + std::to_string(i)).c_str());
      return 0;
    }));
  for (pid_t pid : pids) EXPECT_EQ(wait_child(pid, 60000), 0);
  size_t n = 99;
  ASSERT_EQ(cxr_registry_list(nullptr, 0, &n), 0);
  EXPECT_EQ(n, 0u);
  EXPECT_TRUE(list_dir(g_root).empty()) << list_dir(g_root).size();
}
