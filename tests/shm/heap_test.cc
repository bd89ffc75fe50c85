// Heaps in one process and two: create, open, allocate, free, statistics, root pointer,
// removal, and two processes following each other's pointers at the same address.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include <cxrpc/shm.h>

#include "shm/layout.h" /* where the lock word is, to overwrite it as a peer could */
#include "shm/sync.h"
#include "tests/shm/util.h"

using namespace shmtest;

static std::string g_root = setup_root("heap_test");

TEST(Heap, InitReservesTheWindowAndSlices) {
  ASSERT_EQ(cxr_init(nullptr), 0);
  uintptr_t base;
  size_t size;
  ASSERT_EQ(cxr_window(&base, &size), 0);
  EXPECT_GT(size, 0u);
  uintptr_t s0, s1;
  size_t z0, z1;
  ASSERT_EQ(cxr_pod_slice(0, &s0, &z0), 0);
  ASSERT_EQ(cxr_pod_slice(1, &s1, &z1), 0);
  EXPECT_EQ(s0, base);
  EXPECT_EQ(s1, s0 + z0);
  EXPECT_EQ(cxr_pod_slice(1000, &s1, &z1), CXR_EINVAL);
  EXPECT_STREQ(cxr_root(), g_root.c_str());
  // Same options again: fine; other options: busy.
  cxr_init_opts o;
  cxr_init_opts_init(&o);
  o.root = "/somewhere/else";
  EXPECT_EQ(cxr_init(&o), CXR_EBUSY);
}

TEST(Heap, CreateAllocFreeStats) {
  std::string name = uniq("basic");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 4 << 20, nullptr), 0);
  EXPECT_STREQ(cxr_heap_name(h), name.c_str());
  EXPECT_EQ(cxr_heap_size(h), 4u << 20);
  uintptr_t wb;
  size_t ws;
  cxr_window(&wb, &ws);
  uintptr_t base = (uintptr_t)cxr_heap_base(h);
  EXPECT_GE(base, wb);
  EXPECT_LT(base, wb + ws);
  EXPECT_EQ(base % (2 << 20), 0u);

  cxr_heap_stats st0;
  ASSERT_EQ(cxr_heap_stats(h, &st0), 0);
  EXPECT_EQ(st0.used, 0u);
  EXPECT_EQ(st0.holders, 1u);
  EXPECT_GT(st0.capacity, 3u << 20);

  std::vector<void *> ps;
  for (size_t sz : {1, 16, 17, 100, 1000, 4000, 8192, 8193, 65536, 200000}) {
    void *p = cxr_heap_alloc(h, sz);
    ASSERT_NE(p, nullptr) << sz;
    EXPECT_EQ((uintptr_t)p % 16, 0u);
    EXPECT_TRUE(cxr_heap_contains(h, p, sz));
    EXPECT_GE(cxr_heap_usable_size(h, p), sz);
    memset(p, 0xAB, sz);
    ps.push_back(p);
  }
  cxr_heap_stats st;
  ASSERT_EQ(cxr_heap_stats(h, &st), 0);
  EXPECT_GT(st.used, 200000u);
  EXPECT_GE(st.allocs, 10u);
  for (void *p : ps) cxr_heap_free(h, p);
  ASSERT_EQ(cxr_heap_stats(h, &st), 0);
  EXPECT_EQ(st.used, 0u);
  EXPECT_GE(st.frees, 10u);

  void *pg = cxr_heap_alloc_pages(h, 5000);
  ASSERT_NE(pg, nullptr);
  EXPECT_EQ((uintptr_t)pg % 4096, 0u);
  EXPECT_EQ(cxr_heap_usable_size(h, pg), 8192u);
  void *al = cxr_heap_alloc_aligned(h, 64, 10);
  ASSERT_NE(al, nullptr);
  EXPECT_EQ((uintptr_t)al % 64, 0u);
  EXPECT_EQ(cxr_heap_alloc_aligned(h, 3, 10), nullptr);
  EXPECT_EQ(cxr_last_error(), CXR_EINVAL);
  char *r = (char *)cxr_heap_alloc(h, 10);
  strcpy(r, "abcdefghi");
  r = (char *)cxr_heap_realloc(h, r, 3000);
  ASSERT_NE(r, nullptr);
  EXPECT_STREQ(r, "abcdefghi");
  cxr_heap_free(h, r);
  cxr_heap_free(h, al);
  cxr_heap_free(h, pg);
  ASSERT_EQ(cxr_heap_stats(h, &st), 0);
  EXPECT_EQ(st.used, 0u);

  // Pointers that are not allocations are refused, not followed.
  cxr_heap_free(h, (char *)cxr_heap_base(h) + 100);
  EXPECT_EQ(cxr_last_error(), CXR_EBADPTR);
  int local;
  cxr_heap_free(h, &local);
  EXPECT_EQ(cxr_last_error(), CXR_EBADPTR);
  void *d = cxr_heap_alloc(h, 32);
  cxr_heap_free(h, d);
  cxr_heap_free(h, d);  // double free: reported, not corrupting
  EXPECT_EQ(cxr_last_error(), CXR_EINVAL);
  EXPECT_FALSE(cxr_heap_contains(h, &local, 1));
  EXPECT_EQ(cxr_heap_persist(h, &local, 4), CXR_EBADPTR);

  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), CXR_ENOENT);
}

TEST(Heap, RootPointerAndReopenInSameProcess) {
  std::string name = uniq("root");
  cxr_heap *h = nullptr, *h2 = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, nullptr), 0);
  EXPECT_EQ(cxr_heap_get_root(h), nullptr);
  EXPECT_EQ(cxr_last_error(), CXR_ENOENT);
  int *x = (int *)cxr_heap_alloc(h, sizeof(int));
  *x = 42;
  ASSERT_EQ(cxr_heap_set_root(h, x), 0);
  int local;
  EXPECT_EQ(cxr_heap_set_root(h, &local), CXR_EBADPTR);
  ASSERT_EQ(cxr_heap_persist(h, x, sizeof *x), 0);
  ASSERT_EQ(cxr_heap_open(&h2, name.c_str()), 0);
  EXPECT_EQ(cxr_heap_base(h2), cxr_heap_base(h));
  EXPECT_EQ(*(int *)cxr_heap_get_root(h2), 42);
  cxr_heap_stats st;
  cxr_heap_stats(h2, &st);
  EXPECT_EQ(st.holders, 2u);
  cxr_heap_close(h);
  // A heap persists after its holders close until it is unlinked.
  cxr_heap_close(h2);
  ASSERT_EQ(cxr_heap_open(&h, name.c_str()), 0);
  EXPECT_EQ(*(int *)cxr_heap_get_root(h), 42);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
  EXPECT_EQ(cxr_heap_open(&h, name.c_str()), CXR_ENOENT);
}

TEST(Heap, NamesAndArguments) {
  cxr_heap *h = nullptr;
  std::string longname(CXR_NAME_MAX + 1, 'x');
  EXPECT_EQ(cxr_heap_create(&h, longname.c_str(), 1 << 20, nullptr), CXR_ENAMETOOLONG);
  EXPECT_EQ(cxr_heap_open(&h, longname.c_str()), CXR_ENAMETOOLONG);
  EXPECT_EQ(cxr_heap_create(&h, "", 1 << 20, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, "a/b", 1 << 20, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(nullptr, "x", 1 << 20, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, "tiny", 100, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_open(&h, "does-not-exist"), CXR_ENOENT);
  EXPECT_EQ(cxr_heap_alloc(nullptr, 10), nullptr);
  EXPECT_EQ(cxr_last_error(), CXR_EINVAL);
  std::string name = uniq("dup");
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, nullptr), 0);
  cxr_heap *h2 = nullptr;
  EXPECT_EQ(cxr_heap_create(&h2, name.c_str(), 1 << 20, nullptr), CXR_EEXIST);
  cxr_heap_close(h);
  cxr_heap_unlink(name.c_str());
}

TEST(Heap, FullHeapGivesEnomemAndRecovers) {
  std::string name = uniq("full");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, nullptr), 0);
  std::vector<void *> ps;
  for (int i = 0; i < 100000; i++) {
    void *p = cxr_heap_alloc(h, 1000);
    if (!p) break;
    ps.push_back(p);
  }
  EXPECT_EQ(cxr_last_error(), CXR_ENOMEM);
  EXPECT_GT(ps.size(), 500u);
  EXPECT_EQ(cxr_heap_alloc_pages(h, 1 << 20), nullptr);
  EXPECT_EQ(cxr_last_error(), CXR_ENOMEM);
  for (void *p : ps) cxr_heap_free(h, p);
  cxr_heap_stats st;
  cxr_heap_stats(h, &st);
  EXPECT_EQ(st.used, 0u);
  // Slabs left free go back to the page pool when pages run out: a big run fits again.
  void *big = cxr_heap_alloc_pages(h, 512 << 10);
  EXPECT_NE(big, nullptr);
  cxr_heap_free(h, big);
  // And the other way round: pages freed by big runs serve small blocks.
  std::vector<void *> runs;
  while (void *r = cxr_heap_alloc_pages(h, 64 << 10)) runs.push_back(r);
  EXPECT_GT(runs.size(), 8u);
  for (void *r : runs) cxr_heap_free(h, r);
  void *small = cxr_heap_alloc(h, 3000);
  EXPECT_NE(small, nullptr);
  cxr_heap_free(h, small);
  cxr_heap_close(h);
  cxr_heap_unlink(name.c_str());
}

// A linked structure built by one process, walked by another at the same address.
struct Node {
  Node *next;
  uint64_t value;
};

TEST(Heap, TwoProcessesFollowEachOthersPointers) {
  std::string name = uniq("share");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 2 << 20), 0);
  Node *head = nullptr;
  uint64_t sum = 0;
  for (uint64_t i = 1; i <= 1000; i++) {
    Node *n = (Node *)cxr_heap_alloc(h, sizeof(Node));
    ASSERT_NE(n, nullptr);
    n->value = i * 7;
    n->next = head;
    head = n;
    sum += n->value;
  }
  ASSERT_EQ(cxr_heap_set_root(h, head), 0);
  uintptr_t base = (uintptr_t)cxr_heap_base(h);

  // The child opens by name (a fresh mapping would do the same after exec), checks the
  // address, walks the list, then builds its own list for the parent.
  pid_t pid = spawn([&]() -> int {
    cxr_heap *c = nullptr;
    if (cxr_heap_open(&c, name.c_str()) != 0) return 10;
    if ((uintptr_t)cxr_heap_base(c) != base) return 11;
    uint64_t s = 0;
    for (Node *n = (Node *)cxr_heap_get_root(c); n; n = n->next) {
      if (!cxr_heap_contains(c, n, sizeof *n)) return 12;
      s += n->value;
    }
    if (s != sum) return 13;
    Node *mine = nullptr;
    for (uint64_t i = 0; i < 100; i++) {
      Node *n = (Node *)cxr_heap_alloc(c, sizeof(Node));
      if (!n) return 14;
      n->value = i;
      n->next = mine;
      mine = n;
    }
    if (cxr_heap_adopt(c, mine) != 0) return 15;
    cxr_heap_set_root(c, mine);
    cxr_heap_close(c);
    return 0;
  });
  ASSERT_EQ(wait_child(pid), 0);
  uint64_t s = 0;
  int count = 0;
  for (Node *n = (Node *)cxr_heap_get_root(h); n; n = n->next, count++) s += n->value;
  EXPECT_EQ(count, 100);
  EXPECT_EQ(s, 4950u);
  // The child closed cleanly: what it allocated stays allocated (it is still reachable).
  cxr_heap_stats st;
  cxr_heap_stats(h, &st);
  EXPECT_EQ(st.holders, 1u);
  EXPECT_GE(st.used, 1100 * sizeof(Node));
  cxr_heap_close(h);
  // Last holder gone: nothing left under the root.
  EXPECT_TRUE(list_dir(g_root).empty()) << list_dir(g_root).size();
}

// A heap file no registry entry names (its creator died before registering it) is removed
// by the next registry sweep.
TEST(Heap, StrayHeapFilesAreRemoved) {
  std::string stray = g_root + "/" + uniq("stray") + ".heap";
  FILE *f = fopen(stray.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("half-made", f);
  fclose(f);
  cxr_heap *h = nullptr;
  std::string name = uniq("after-stray");
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, nullptr), 0);
  EXPECT_NE(access(stray.c_str(), F_OK), 0);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
  EXPECT_TRUE(list_dir(g_root).empty());
}

// Threads of one process: allocate, hand blocks to each other through a queue, free what
// others allocated, open and close their own handles and read statistics, all at once
// (run under TSan too).
TEST(Heap, ThreadsInOneProcess) {
  std::string name = uniq("threads");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 8 << 20), 0);
  cxr_heap_stats st0;
  cxr_heap_stats(h, &st0);
  struct Shared {
    cxr_heap *h;
    const char *name;
    pthread_mutex_t mu;
    std::vector<std::pair<unsigned char *, size_t>> q;
    std::atomic<int> errors{0};
  } sh;
  sh.h = h;
  sh.name = name.c_str();
  pthread_mutex_init(&sh.mu, nullptr);
  auto run = [](void *arg) -> void * {
    Shared *s = (Shared *)arg;
    uint64_t seed = (uint64_t)pthread_self() | 1;
    cxr_heap *own = nullptr;
    if (cxr_heap_open(&own, s->name) != 0) s->errors++;
    for (int i = 0; i < 4000; i++) {
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      size_t size = 1 + seed % 3000;
      cxr_heap *use = (seed >> 20) & 1 ? own : s->h;
      unsigned char *p = (unsigned char *)cxr_heap_alloc(use, size);
      if (!p) {
        s->errors++;
        break;
      }
      memset(p, (int)(size & 0xFF), size);
      pthread_mutex_lock(&s->mu);
      s->q.push_back({p, size});
      std::pair<unsigned char *, size_t> take{nullptr, 0};
      if (s->q.size() > 50) {
        take = s->q[seed % s->q.size()];
        s->q[seed % s->q.size()] = s->q.back();
        s->q.pop_back();
      }
      pthread_mutex_unlock(&s->mu);
      if (take.first) {
        for (size_t k = 0; k < take.second; k++)
          if (take.first[k] != (unsigned char)(take.second & 0xFF)) {
            s->errors++;
            break;
          }
        cxr_heap_free((seed >> 21) & 1 ? own : s->h, take.first);
      }
      if (i % 500 == 0) {
        cxr_heap_stats st;
        cxr_heap_stats(s->h, &st);
      }
    }
    cxr_heap_close(own);
    return nullptr;
  };
  pthread_t t[4];
  for (auto &x : t) pthread_create(&x, nullptr, run, &sh);
  for (auto &x : t) pthread_join(x, nullptr);
  EXPECT_EQ(sh.errors.load(), 0);
  for (auto &e : sh.q) cxr_heap_free(h, e.first);
  cxr_heap_stats st;
  cxr_heap_stats(h, &st);
  EXPECT_EQ(st.used, st0.used);
  EXPECT_EQ(st.holders, 1u);
  cxr_heap_close(h);
  EXPECT_TRUE(list_dir(g_root).empty());
}

TEST(Heap, ALockWordNobodyReleasesCostsAnErrorNotAHang) {
  // Any process that maps a heap can write its lock word (a connection heap's client can):
  // one naming a holder that never unlocks. Allocations that take the lock fail with
  // CXR_ETIMEDOUT after a bounded wait (2 s, then briefly), work again once the word is
  // clear, and the close does not hang. (Before: the first such allocation waited forever.)
  std::string name = uniq("stuck");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 8 << 20), 0);
  void *a = cxr_heap_alloc(h, 1 << 20);  // a large block: always under the lock
  ASSERT_NE(a, nullptr);
  cxr_heap_free(h, a);
  uint64_t *word = &static_cast<cxr__hdr *>(cxr_heap_base(h))->lock.word;
  ASSERT_EQ(__atomic_load_n(word, __ATOMIC_SEQ_CST), 0u);
  // "Held" by a process that lives (this one: no thread of it holds the lock) and never
  // unlocks. (A word naming no live process is taken over: errors_test.)
  const uint64_t held = cxr__plock_self_id();
  ASSERT_NE(held, 0u);
  __atomic_store_n(word, held, __ATOMIC_SEQ_CST);
  EXPECT_EQ(cxr_heap_alloc(h, 1 << 20), nullptr);
  EXPECT_EQ(cxr_last_error(), CXR_ETIMEDOUT);
  EXPECT_EQ(cxr_heap_alloc(h, 1 << 20), nullptr);  // now after a short wait
  EXPECT_EQ(cxr_last_error(), CXR_ETIMEDOUT);
  __atomic_store_n(word, 0u, __ATOMIC_SEQ_CST);
  void *b = cxr_heap_alloc(h, 1 << 20);
  EXPECT_NE(b, nullptr);
  cxr_heap_free(h, b);
  __atomic_store_n(word, held, __ATOMIC_SEQ_CST);
  // The lock was had again, so the handle waits the full bound again (not the brief one).
  int64_t t0 = cxr_now_ns();
  EXPECT_EQ(cxr_heap_alloc(h, 1 << 20), nullptr);
  EXPECT_GE(cxr_now_ns() - t0, 1000000000);
  cxr_heap_close(h);  // returns: its flushes give up
}

TEST(Heap, ACloseThatCannotTakeTheLockStillLetsTheHeapGo) {
  // A close that gave up on a lock word nobody releases left its holder slot live under its
  // own, living pid, and nothing came back to it: a remove-on-last-close heap kept its file
  // and its registry entry (one of the pod's 256) for as long as the process lived.
  std::string name = uniq("stuckclose");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 2 << 20), 0);
  std::string path = g_root + "/" + name + ".heap";
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void *peer = mmap(nullptr, sizeof(cxr__hdr), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(peer, MAP_FAILED);  // the header as another process maps it
  uint64_t *word = &static_cast<cxr__hdr *>(peer)->lock.word;
  __atomic_store_n(word, cxr__plock_self_id(), __ATOMIC_SEQ_CST);  // never unlocked
  cxr_heap_close(h);  // gives up on the lock after 2 s
  __atomic_store_n(word, 0u, __ATOMIC_SEQ_CST);
  munmap(peer, sizeof(cxr__hdr));
  cxr_heap_info info[64];
  size_t n = 0;
  ASSERT_EQ(cxr_registry_list(info, 64, &n), 0);  // sweeps
  for (size_t i = 0; i < n && i < 64; i++)
    EXPECT_NE(name, info[i].name) << "still registered, holders " << info[i].holders;
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "file left behind";
  // A heap that stays: the next reaper releases such a slot as a clean close, so what the
  // closed handle allocated stays allocated (others may point to it).
  std::string kept = uniq("stuckclose");
  cxr_heap *h2 = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, kept.c_str(), 2 << 20, nullptr), 0);
  ASSERT_EQ(cxr_heap_open(&h2, kept.c_str()), 0);
  void *p = cxr_heap_alloc(h, 64);
  ASSERT_NE(p, nullptr);
  word = &static_cast<cxr__hdr *>(cxr_heap_base(h))->lock.word;
  __atomic_store_n(word, cxr__plock_self_id(), __ATOMIC_SEQ_CST);
  cxr_heap_close(h);
  __atomic_store_n(word, 0u, __ATOMIC_SEQ_CST);
  EXPECT_EQ(cxr_heap_reap(h2), 1);
  cxr_heap_stats st;
  ASSERT_EQ(cxr_heap_stats(h2, &st), 0);
  EXPECT_EQ(st.holders, 1u);
  EXPECT_EQ(cxr_heap_usable_size(h2, p), 64u);
  cxr_heap_free(h2, p);
  cxr_heap_close(h2);
  EXPECT_EQ(cxr_heap_unlink(kept.c_str()), 0);
}

// Rewrites, as any process of the pod can (the registry file is open to all of them), the
// registry entry of heap `name`: its path and, when unlinked, the flag saying the file goes
// with its last holder (shm/registry.h: used, flags, name, path). False if not found.
bool forge_registry_entry(const std::string &name, const std::string &path, bool unlinked) {
  std::string reg = g_root + "/registry";
  int fd = open(reg.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  void *p = fstat(fd, &st) == 0 ? mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                                       fd, 0)
                                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) return false;
  char *base = static_cast<char *>(p);
  char key[CXR_NAME_MAX + 1] = {};
  memcpy(key, name.c_str(), name.size());
  bool found = false;
  for (size_t off = 8; !found && off + sizeof key + 256 <= (size_t)st.st_size; off += 4) {
    if (memcmp(base + off, key, sizeof key) != 0) continue;
    uint32_t *flags = reinterpret_cast<uint32_t *>(base + off - 4);
    if (unlinked) *flags |= 0x100u;  // CXR_REG_UNLINKED
    char *path_field = base + off + sizeof key;
    memset(path_field, 0, 256);
    memcpy(path_field, path.c_str(), path.size());
    found = true;
  }
  munmap(p, st.st_size);
  return found;
}

TEST(Heap, ARegistryEntryNamingAFifoOrAnotherFileNeitherHangsNorRemovesIt) {
  // Any process of the pod can write the registry. An entry whose path named a FIFO hung the
  // next sweep in its open (and the registry's lock with it: every create, open and connect
  // of the pod waited); one naming another file, flagged unlinked, had the sweeper delete
  // it (a review, 2026-11-28). Now a sweep looks only at regular files and devices, and
  // removes a file only when its header says it is that entry's heap.
  std::string a = uniq("forged"), b = uniq("forged");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, a.c_str(), 2 << 20, nullptr), 0);
  cxr_heap_close(h);
  ASSERT_EQ(cxr_heap_create(&h, b.c_str(), 2 << 20, nullptr), 0);
  cxr_heap_close(h);
  std::string fifo = g_root + "/" + uniq("fifo"), victim = g_root + "/" + uniq("victim");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  int fd = open(victim.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  auto sweep = [] {  // in a child, which a hang cannot take down with us
    pid_t child = spawn([] {
      size_t n = 0;
      return cxr_registry_list(nullptr, 0, &n) == 0 ? 0 : 1;  // (it sweeps first)
    });
    return wait_child(child, 5000);
  };
  ASSERT_TRUE(forge_registry_entry(b, victim, true));
  EXPECT_EQ(sweep(), 0);
  EXPECT_EQ(access(victim.c_str(), F_OK), 0) << "the sweep deleted a file the entry named";
  ASSERT_TRUE(forge_registry_entry(a, fifo, true));
  EXPECT_EQ(sweep(), 0) << "the sweep hung on the FIFO";
  unlink(fifo.c_str());
  unlink(victim.c_str());
  unlink((g_root + "/" + a + ".heap").c_str());
  unlink((g_root + "/" + b + ".heap").c_str());
}

TEST(Heap, ALiveHeapWhoseEntryNamesAnotherPathIsNoStray) {
  // Any process of the pod can rewrite an entry's path. The live heap's file, named by no
  // entry then, was removed as a stray by the next sweep (cxrpcctl channels lists, and a
  // listing sweeps): a live channel vanished (a review, 2026-11-28). A stray goes now only
  // when no live process holds it (or it is no heap at all).
  std::string a = uniq("renamed");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, a.c_str(), 2 << 20, nullptr), 0);
  std::string file = g_root + "/" + a + ".heap";
  ASSERT_TRUE(forge_registry_entry(a, g_root + "/elsewhere.heap", false));
  size_t n = 0;
  EXPECT_EQ(cxr_registry_list(nullptr, 0, &n), 0);
  EXPECT_EQ(access(file.c_str(), F_OK), 0) << "the sweep removed a live heap's file";
  ASSERT_TRUE(forge_registry_entry(a, file, false));
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(a.c_str()), 0);
  EXPECT_NE(access(file.c_str(), F_OK), 0);
}

extern "C" int64_t cxr__reg_wait_ns;  // shm/registry.h: how long the registry's flock is awaited

TEST(Heap, ARegistryLockNobodyReleasesCostsAnErrorNotAHang) {
  // Any process that can open the pod's registry (read access is enough) can take its
  // flock and keep it. Creating, opening and removing heaps then fail with CXR_ETIMEDOUT
  // after a bounded wait (10 s; lowered here), closing still returns, and all of it works
  // again once the holder lets go. (Before: each of them waited forever.)
  std::string name = uniq("reglock"), other = uniq("reglock");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 2 << 20), 0);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  std::string path = g_root + "/registry";
  pid_t holder = spawn([&] {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) return 1;
    if (write(ready[1], "x", 1) != 1) return 1;
    pause();
    return 0;
  });
  ASSERT_GT(holder, 0);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  int64_t saved = cxr__reg_wait_ns;
  cxr__reg_wait_ns = 300000000;
  int64_t t0 = cxr_now_ns();
  cxr_heap *h2 = nullptr;
  EXPECT_EQ(cxr_heap_create(&h2, other.c_str(), 2 << 20, nullptr), CXR_ETIMEDOUT);
  EXPECT_GE(cxr_now_ns() - t0, 300000000);
  EXPECT_EQ(cxr_heap_open(&h2, name.c_str()), CXR_ETIMEDOUT);  // now after a brief wait
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), CXR_ETIMEDOUT);
  void *p = cxr_heap_alloc(h, 64);  // a heap already open does not need the registry
  EXPECT_NE(p, nullptr);
  cxr_heap_free(h, p);
  kill(holder, SIGKILL);  // the kernel drops its lock
  EXPECT_EQ(wait_child(holder), 128 + SIGKILL);
  ASSERT_EQ(cxr_heap_open(&h2, name.c_str()), 0);
  cxr_heap_close(h2);
  // Had again: the next wait is the full bound, not the brief one.
  holder = spawn([&] {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) return 1;
    if (write(ready[1], "x", 1) != 1) return 1;
    pause();
    return 0;
  });
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  t0 = cxr_now_ns();
  EXPECT_EQ(cxr_heap_open(&h2, name.c_str()), CXR_ETIMEDOUT);
  EXPECT_GE(cxr_now_ns() - t0, 300000000);
  cxr_heap_close(h);  // returns (the registry's part is skipped)
  kill(holder, SIGKILL);
  EXPECT_EQ(wait_child(holder), 128 + SIGKILL);
  cxr__reg_wait_ns = saved;
  close(ready[0]);
  close(ready[1]);
  // The heap left registered by the skipped close is swept by the next registry user.
  EXPECT_EQ(cxr_heap_create(&h2, other.c_str(), 2 << 20, nullptr), 0);
  cxr_heap_close(h2);
  EXPECT_EQ(cxr_heap_unlink(other.c_str()), 0);
  EXPECT_EQ(cxr_heap_open(&h2, name.c_str()), CXR_ENOENT);
}
