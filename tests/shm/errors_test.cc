// Every bad case has its own error code and none crashes: bad roots, truncated or forged
// heap files, taken address ranges. Also explicit heap paths (as for a DAX device) and the
// cache-line persistence path of libpmem2.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <signal.h>

#include <algorithm>
#include <set>
#include <thread>

#include <cxrpc/shm.h>

#include "shm/layout.h"
#include "shm/log.h" /* cxr__set_error */
#include "shm/sync.h"
#include "tests/shm/util.h"

using namespace shmtest;

static std::string g_root = setup_root("errors_test");

TEST(Errors, TheDefaultRootIsMadeForEveryUserWhateverTheUmask) {
  // The default root was made mkdir(01777) under the caller's umask: 01755 under 022, so
  // no user but its maker could create a heap in it (docs say 01777), and its maker owned
  // the folder cxrpcd's socket lives in. Here on a fresh /dev/shm of a child's own, before
  // anything sets this process's runtime up (a child of an initialised one takes it as is).
  pid_t pid = spawn([&]() -> int {
    if (unshare(CLONE_NEWNS) != 0) return 77;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
    if (mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=64m,mode=1777") != 0) return 77;
    unsetenv("CXRPC_ROOT");
    umask(022);
    if (cxr_init(nullptr) != 0) return 10;
    struct stat st;
    if (stat("/dev/shm/cxrpc", &st) != 0) return 11;
    return (st.st_mode & 07777) == 01777 ? 0 : 12;
  });
  int rc = wait_child(pid);
  if (rc != 77) EXPECT_EQ(rc, 0) << "the default root is not 01777";
  else fprintf(stderr, "default root case not run: cannot mount a tmpfs here\n");
}

// Must run first (the test above only inits a child): the runtime is not initialised yet,
// and a failed cxr_init leaves it so.
TEST(Errors, A_RootMissingOrNotWritable) {
  cxr_init_opts o;
  cxr_init_opts_init(&o);
  std::string missing = g_root + "/no/such/folder";
  o.root = missing.c_str();
  EXPECT_EQ(cxr_init(&o), CXR_ENOENT);
  // A file where the folder should be.
  std::string file = g_root + "-file";
  int fd = open(file.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  o.root = file.c_str();
  EXPECT_EQ(cxr_init(&o), CXR_EACCES);
  unlink(file.c_str());
  // A read-only mount (root ignores permission bits, not a read-only file system). The
  // mount happens in a child's own mount namespace.
  std::string ro = g_root + "-ro";
  mkdir(ro.c_str(), 0777);
  pid_t pid = spawn([&]() -> int {
    if (unshare(CLONE_NEWNS) != 0) return 77;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
    if (mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=1m") != 0) return 77;
    cxr_init_opts co;
    cxr_init_opts_init(&co);
    co.root = ro.c_str();
    int rc = cxr_init(&co);
    return rc == CXR_EACCES ? 0 : 10 - rc;
  });
  int rc = wait_child(pid);
  rmdir(ro.c_str());
  if (rc != 77) EXPECT_EQ(rc, 0);
  else fprintf(stderr, "read-only mount case not run: cannot mount a tmpfs here\n");
  // The window itself already taken by another mapping: init refuses.
  pid_t wp = spawn([&]() -> int {
    const char *w = getenv("CXRPC_WINDOW");
    uintptr_t lo = w ? (uintptr_t)strtoull(w, nullptr, 0) : 0x600000000000ull;
    void *m = mmap((void *)(lo + (64 << 20)), 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS |
                   MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED) return 20;
    int rc = cxr_init(nullptr);
    if (rc != CXR_EADDRINUSE) return 30 - rc;
    // Functions that set the runtime up on first use report the same reason.
    return cxr_root() == nullptr && cxr_last_error() == CXR_EADDRINUSE ? 0 : 40;
  });
  EXPECT_EQ(wait_child(wp), 0);
  // A process of pod 1 gets its heaps in pod 1's slice of the window.
  pid_t pp = spawn([&]() -> int {
    cxr_init_opts po;
    cxr_init_opts_init(&po);
    po.pod = 1;
    if (cxr_init(&po) != 0) return 10;
    uintptr_t sb;
    size_t ss;
    if (cxr_pod_slice(1, &sb, &ss) != 0) return 11;
    cxr_heap *h;
    std::string n = uniq("pod1");
    if (cxr_heap_create(&h, n.c_str(), 1 << 20, nullptr) != 0) return 12;
    uintptr_t b = (uintptr_t)cxr_heap_base(h);
    cxr_heap_opts ho;
    cxr_heap_opts_init(&ho);
    uintptr_t s0;
    cxr_pod_slice(0, &s0, nullptr);
    ho.addr = s0;  // pod 0's slice is not ours
    cxr_heap *x;
    int rc = cxr_heap_create(&x, uniq("pod0").c_str(), 1 << 20, &ho);
    cxr_heap_close(h);
    cxr_heap_unlink(n.c_str());
    if (rc != CXR_ERANGE) return 13;
    return b >= sb && b < sb + ss ? 0 : 14;
  });
  EXPECT_EQ(wait_child(pp), 0);
  // CXRPC_POD names the pod when the options leave it to the environment; an explicit pod,
  // 0 included, wins over it; text that is not a slice number is refused.
  auto pod_of_heap = [&](const char *env, bool explicit_zero) -> int {
    pid_t p = spawn([&]() -> int {
      setenv("CXRPC_POD", env, 1);
      cxr_init_opts o;
      cxr_init_opts_init(&o);
      if (explicit_zero) o.pod = 0;
      int rc = cxr_init(explicit_zero ? &o : nullptr);
      if (rc == CXR_EINVAL) return 100;
      if (rc != 0) return 101;
      cxr_heap *h;
      std::string n = uniq("podenv");
      if (cxr_heap_create(&h, n.c_str(), 1 << 20, nullptr) != 0) return 102;
      uintptr_t b = (uintptr_t)cxr_heap_base(h);
      cxr_heap_close(h);
      cxr_heap_unlink(n.c_str());
      for (unsigned k = 0; k < 16; k++) {
        uintptr_t sb;
        size_t ss;
        if (cxr_pod_slice(k, &sb, &ss) == 0 && b >= sb && b < sb + ss) return (int)k;
      }
      return 103;
    });
    return wait_child(p);
  };
  EXPECT_EQ(pod_of_heap("2", false), 2);
  EXPECT_EQ(pod_of_heap("2", true), 0);  // was 2: a zero pod meant "default"
  EXPECT_EQ(pod_of_heap("two", false), 100);
  EXPECT_EQ(pod_of_heap("2x", false), 100);
  EXPECT_EQ(pod_of_heap("-1", false), 100);
  EXPECT_EQ(pod_of_heap("16", false), 100);  // not below the 16 slices
  // Nothing was initialised by the failures: the real root still works.
  EXPECT_EQ(cxr_init(nullptr), 0);
  EXPECT_STREQ(cxr_root(), g_root.c_str());
}

TEST(Errors, BadWindowOptions) {
  cxr_init_opts o;
  cxr_init_opts_init(&o);
  o.window_base = 0x123;  // not aligned
  EXPECT_EQ(cxr_init(&o), CXR_EINVAL);
  cxr_init_opts_init(&o);
  o.pod = 20;
  o.pod_slices = 16;
  EXPECT_EQ(cxr_init(&o), CXR_EINVAL);
}

namespace {

// The damaged-file cases share one shape: make a heap and close it, forge its file, check
// that open refuses with the code for that damage, remove the heap (also when a case stops
// early).
struct ClosedHeap {
  std::string name, path;
  explicit ClosedHeap(const char *tag, size_t size = 1 << 20) : name(uniq(tag)) {
    cxr_heap *h = nullptr;
    EXPECT_EQ(cxr_heap_create(&h, name.c_str(), size, nullptr), 0);
    cxr_heap_close(h);
    path = g_root + "/" + name + ".heap";
  }
  ~ClosedHeap() { EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0) << name; }

  // Writes n bytes at off into the heap file, as a forger would.
  void patch(size_t off, const void *v, size_t n) {
    int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, v, n, (off_t)off), (ssize_t)n);
    close(fd);
  }

  // Open refuses with `code` and hands back no handle. An AssertionResult, so a failure
  // names the caller's line.
  ::testing::AssertionResult open_fails_with(int code) {
    cxr_heap *h = nullptr;
    int rc = cxr_heap_open(&h, name.c_str());
    if (rc == code && h == nullptr) return ::testing::AssertionSuccess();
    if (rc == 0) cxr_heap_close(h);
    return ::testing::AssertionFailure() << "cxr_heap_open(" << name << ") gave " << rc << " ("
                                         << cxr_strerror(rc) << "), handle " << (void *)h
                                         << "; expected " << code << " (" << cxr_strerror(code)
                                         << ") and no handle";
  }
};

}  // namespace

TEST(Errors, TruncatedFile) {
  ClosedHeap heap("trunc");
  ASSERT_EQ(truncate(heap.path.c_str(), 256 << 10), 0);
  EXPECT_TRUE(heap.open_fails_with(CXR_ETRUNCATED));
  ASSERT_EQ(truncate(heap.path.c_str(), 10), 0);
  EXPECT_TRUE(heap.open_fails_with(CXR_ETRUNCATED));
}

TEST(Errors, BadMagicAndVersion) {
  ClosedHeap heap("magic");
  uint32_t v = 99;
  heap.patch(offsetof(cxr__hdr, version), &v, sizeof v);
  EXPECT_TRUE(heap.open_fails_with(CXR_EVERSION));
  uint64_t m = 0x1122334455667788ull;
  heap.patch(offsetof(cxr__hdr, magic), &m, sizeof m);
  EXPECT_TRUE(heap.open_fails_with(CXR_EBADMAGIC));
}

TEST(Errors, HeaderAddressOrSizeOutsideTheWindow) {
  uintptr_t wb;
  size_t ws;
  {
    ClosedHeap heap("range");
    uint64_t addr = 0x1000;
    heap.patch(offsetof(cxr__hdr, addr), &addr, sizeof addr);
    EXPECT_TRUE(heap.open_fails_with(CXR_ERANGE));
    ASSERT_EQ(cxr_window(&wb, &ws), 0);
    addr = wb + ws - (512 << 10);  // starts inside, ends outside
    heap.patch(offsetof(cxr__hdr, addr), &addr, sizeof addr);
    EXPECT_TRUE(heap.open_fails_with(CXR_ERANGE));
  }
  {
    // The heap file itself is big enough for its size field; the size runs past the window.
    ClosedHeap big("range2", 4 << 20);
    uint64_t addr = wb + ws - (2 << 20);
    big.patch(offsetof(cxr__hdr, addr), &addr, sizeof addr);
    EXPECT_TRUE(big.open_fails_with(CXR_ERANGE));
  }
  // Heap options out of the pod's slice.
  cxr_heap *h = nullptr;
  cxr_heap_opts o;
  cxr_heap_opts_init(&o);
  o.addr = wb + ws + (2 << 20);
  EXPECT_EQ(cxr_heap_create(&h, uniq("range3").c_str(), 1 << 20, &o), CXR_ERANGE);
}

TEST(Errors, AddressRangeAlreadyTaken) {
  cxr_heap *a = nullptr, *b = nullptr;
  std::string na = uniq("taken-a");
  ASSERT_EQ(cxr_heap_create(&a, na.c_str(), 1 << 20, nullptr), 0);
  cxr_heap_opts o;
  cxr_heap_opts_init(&o);
  // Another heap's range (the registry refuses).
  o.addr = (uintptr_t)cxr_heap_base(a);
  EXPECT_EQ(cxr_heap_create(&b, uniq("taken-b").c_str(), 1 << 20, &o), CXR_EADDRINUSE);
  // A foreign mapping inside the window that the registry knows nothing about.
  uintptr_t free_addr = (uintptr_t)cxr_heap_base(a) + (64 << 20);
  void *foreign = mmap((void *)free_addr, 1 << 20, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_EQ(foreign, (void *)free_addr);
  o.addr = free_addr;
  std::string nb = uniq("taken-c");
  EXPECT_EQ(cxr_heap_create(&b, nb.c_str(), 1 << 20, &o), CXR_EADDRINUSE);
  EXPECT_EQ(cxr_heap_open(&b, nb.c_str()), CXR_ENOENT);  // nothing half-made remains
  // Give the range back to the reservation.
  mmap((void *)free_addr, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  EXPECT_EQ(cxr_heap_create(&b, nb.c_str(), 1 << 20, &o), 0);
  EXPECT_EQ((uintptr_t)cxr_heap_base(b), free_addr);
  cxr_heap_close(b);
  cxr_heap_close(a);
  EXPECT_EQ(cxr_heap_unlink(na.c_str()), 0);
  EXPECT_EQ(cxr_heap_unlink(nb.c_str()), 0);
}

TEST(Errors, TheHeapNameComesFromOurCopyNotTheSharedHeader) {
  // Any holder can write the header: one that overwrites the name (no NUL left) changes
  // nothing for what cxr_heap_name tells us, nor reads past the field.
  std::string name = uniq("named");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 2 << 20, nullptr), 0);
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  char saved[sizeof hdr->name];
  memcpy(saved, hdr->name, sizeof saved);
  memset(hdr->name, 'X', sizeof hdr->name);
  EXPECT_STREQ(cxr_heap_name(h), name.c_str());
  memcpy(hdr->name, saved, sizeof saved);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
}

TEST(Errors, AFailedCreateRemovesOnlyAFileItMade) {
  // An explicit path naming a file that already exists: a create that fails after opening
  // it (here: the size is over RLIMIT_FSIZE, so ftruncate fails) leaves the file as it was;
  // a file the create made itself is removed again.
  std::string existing = g_root + "-precious.img", fresh = g_root + "-fresh.img";
  FILE *f = fopen(existing.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("precious", f);
  fclose(f);
  std::string first = uniq("first");  // the registry file exists before the limit is set
  cxr_heap *made = nullptr;
  ASSERT_EQ(cxr_heap_create(&made, first.c_str(), 2 << 20, nullptr), 0);
  cxr_heap_close(made);
  EXPECT_EQ(cxr_heap_unlink(first.c_str()), 0);
  pid_t pid = spawn([&]() -> int {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {1 << 20, 1 << 20};  /* above the registry file, below the heap */
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 10;
    cxr_heap *h = nullptr;
    cxr_heap_opts o;
    cxr_heap_opts_init(&o);
    o.path = existing.c_str();
    int dbg = cxr_heap_create(&h, uniq("precious").c_str(), 2 << 20, &o);
    if (dbg == 0) return 11;
    o.path = fresh.c_str();
    if (cxr_heap_create(&h, uniq("fresh").c_str(), 2 << 20, &o) == 0) return 12;
    return 0;
  });
  ASSERT_EQ(wait_child(pid), 0);
  char buf[16] = {0};
  f = fopen(existing.c_str(), "r");
  ASSERT_NE(f, nullptr) << "a failed create deleted a file it did not make";
  EXPECT_NE(fgets(buf, sizeof buf, f), nullptr);
  fclose(f);
  EXPECT_STREQ(buf, "precious");
  EXPECT_NE(access(fresh.c_str(), F_OK), 0) << "a failed create left its own file behind";
  unlink(existing.c_str());
}

TEST(Errors, ExplicitPathLikeADaxDeviceWithCacheLinePersistence) {
  // libpmem2 takes its cache-line path (flush instructions instead of msync) when forced.
  std::string path = g_root + "-dax.img";
  std::string name = uniq("dax");
  pid_t pid = spawn([&]() -> int {
    setenv("PMEM2_FORCE_GRANULARITY", "CACHE_LINE", 1);
    cxr_heap *h = nullptr;
    cxr_heap_opts o;
    cxr_heap_opts_init(&o);
    o.path = path.c_str();
    if (cxr_heap_create(&h, name.c_str(), 2 << 20, &o) != 0) return 10;
    char *p = (char *)cxr_heap_alloc(h, 64);
    strcpy(p, "persisted");
    if (cxr_heap_persist(h, p, 64) != 0) return 11;
    cxr_heap_set_root(h, p);
    cxr_heap_close(h);
    return 0;
  });
  ASSERT_EQ(wait_child(pid), 0);
  cxr_heap *h = nullptr;
  // The path already holds a heap: another name cannot take it.
  cxr_heap_opts o;
  cxr_heap_opts_init(&o);
  o.path = path.c_str();
  EXPECT_EQ(cxr_heap_create(&h, uniq("dax-other").c_str(), 2 << 20, &o), CXR_EEXIST);
  ASSERT_EQ(cxr_heap_open(&h, name.c_str()), 0);
  EXPECT_STREQ((char *)cxr_heap_get_root(h), "persisted");
  cxr_heap_info info[8];
  size_t n = 0;
  ASSERT_EQ(cxr_registry_list(info, 8, &n), 0);
  bool found = false;
  for (size_t i = 0; i < n && i < 8; i++)
    if (name == info[i].name) {
      found = true;
      EXPECT_EQ(path, info[i].path);
      EXPECT_EQ(info[i].holders, 1u);
    }
  EXPECT_TRUE(found);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST(Errors, TooManyHolders) {
  std::string name = uniq("holders");
  cxr_heap *h[CXR_MAX_HOLDERS + 1];
  ASSERT_EQ(cxr_heap_create(&h[0], name.c_str(), 1 << 20, nullptr), 0);
  for (unsigned i = 1; i < CXR_MAX_HOLDERS; i++) ASSERT_EQ(cxr_heap_open(&h[i], name.c_str()), 0);
  EXPECT_EQ(cxr_heap_open(&h[CXR_MAX_HOLDERS], name.c_str()), CXR_EFULL);
  for (unsigned i = 0; i < CXR_MAX_HOLDERS; i++) cxr_heap_close(h[i]);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
  EXPECT_TRUE(list_dir(g_root).empty());
}

// A holder that scribbles over the allocator's shared lists (bug or hostility) must not
// make another crash or hand out memory twice: lists are checked and rebuilt.
// A 2 MiB heap with 300 live 64-byte blocks, whose metadata the damage cases overwrite.
static void heap_with_blocks(const std::string &name, cxr_heap **h, std::vector<void *> *live) {
  ASSERT_EQ(cxr_heap_create(h, name.c_str(), 2 << 20, nullptr), 0);
  for (int i = 0; i < 300; i++) live->push_back(cxr_heap_alloc(*h, 64));
}

TEST(Errors, DamagedFreeListsAreRebuiltNotFollowed) {
  std::string name = uniq("damaged");
  cxr_heap *h = nullptr;
  std::vector<void *> live;
  ASSERT_NO_FATAL_FAILURE(heap_with_blocks(name, &h, &live));
  void *big = cxr_heap_alloc_pages(h, 64 << 10);
  ASSERT_NE(big, nullptr);
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  std::set<void *> seen(live.begin(), live.end());
  // A class list pointing at a live block: enough 64-byte allocations to drain this
  // thread's cache and refill from it.
  hdr->central[3] = (uint64_t)((char *)live[5] - (char *)hdr) - 16;
  for (int i = 0; i < 200; i++) {
    void *q = cxr_heap_alloc(h, 64);
    ASSERT_NE(q, nullptr);
    EXPECT_TRUE(seen.insert(q).second) << "handed out twice: " << q;
  }
  // Class lists pointing at garbage.
  hdr->central[5] = 12345;
  void *c5 = cxr_heap_alloc(h, 90);
  EXPECT_NE(c5, nullptr);
  hdr->central[7] = 1ull << 40;
  void *c7 = cxr_heap_alloc(h, 128);
  EXPECT_NE(c7, nullptr);
  // The free-run list head out of range.
  hdr->free_runs = 0xFFFFFFF0u;
  void *p = cxr_heap_alloc_pages(h, 8192);
  EXPECT_NE(p, nullptr);
  EXPECT_GE(hdr->rebuilds, 3u);
  cxr_heap_free(h, c5);
  cxr_heap_free(h, c7);
  for (void *q : seen) cxr_heap_free(h, q);
  cxr_heap_free(h, p);
  cxr_heap_free(h, big);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
}

TEST(Errors, DamageIsLoggedAFewLinesAtATime) {
  // Any holder can write a heap (a client its connection heap). Each rebuild walks every
  // tag again, and used to log every damaged one each time: a holder that keeps scribbling
  // could flood the log. Now a rebuild logs at most 8 entries and a count, and at most one
  // rebuild a second logs at all. Here 100 bad tags and two rebuilds: 200 lines before.
  std::string name = uniq("floodlog");
  cxr_heap *h = nullptr;
  std::vector<void *> live;
  ASSERT_NO_FATAL_FAILURE(heap_with_blocks(name, &h, &live));
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  for (int i = 0; i < 100; i++) {  // headers 16 bytes before the blocks
    cxr__blk *b = (cxr__blk *)((char *)live[2 * i] - 16);
    b->tag.store(0xF000000000000000ull, std::memory_order_relaxed);
  }
  testing::internal::CaptureStderr();
  hdr->central[5] = 12345;  // two damaged class lists: two rebuilds
  void *a = cxr_heap_alloc(h, 90);
  hdr->central[7] = 1ull << 40;
  void *b = cxr_heap_alloc(h, 128);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
  EXPECT_GE(hdr->rebuilds, 2u);
  size_t lines = 0;
  for (size_t at = 0; (at = err.find("has a bad tag", at)) != std::string::npos; at++) lines++;
  EXPECT_LE(lines, 8u) << err;
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
}

// A holder on another host cannot be checked by pid: its lease decides. (The slot is
// forged here, as a process on another host of the pod would have written it.)
TEST(Lease, HolderOnAnotherHostIsDeadWhenItsLeaseExpires) {
  std::string name = uniq("lease");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, nullptr), 0);
  ASSERT_EQ(cxr_heap_renew(h), 0);
  EXPECT_EQ(cxr_heap_renew(nullptr), CXR_EINVAL);
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  auto forge = [&](unsigned i, int64_t lease) {
    cxr__slot *s = &hdr->slots[i];
    s->gen = 1000 + i;
    s->pid = 1;  // alive here, but on another host it means nothing
    s->start_time = 1;
    s->host = 0x1234;
    s->lease_ns = lease;
    s->state = CXR_SLOT_LIVE;
  };
  forge(CXR_MAX_HOLDERS - 1, now - 3600ll * 1000000000);  // lease long expired
  forge(CXR_MAX_HOLDERS - 2, now);                         // fresh lease
  cxr_heap_stats st;
  cxr_heap_stats(h, &st);
  EXPECT_EQ(st.holders, 3u);
  EXPECT_EQ(cxr_heap_reap(h), 1);
  cxr_heap_stats(h, &st);
  EXPECT_EQ(st.holders, 2u);
  EXPECT_EQ((unsigned)hdr->slots[CXR_MAX_HOLDERS - 1].state, (unsigned)CXR_SLOT_FREE);
  EXPECT_EQ((unsigned)hdr->slots[CXR_MAX_HOLDERS - 2].state, (unsigned)CXR_SLOT_LIVE);
  hdr->slots[CXR_MAX_HOLDERS - 2].state = CXR_SLOT_FREE;
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
}

TEST(Errors, AFreeThatCannotTakeTheHeapLockSaysWhyAndADeadHoldersLockIsTakenOver) {
  // Another process holds the heap's lock and does not let it go: a free of a page run
  // cannot proceed and says so in cxr_last_error, instead of returning with a stale code.
  // Once that holder is killed, the next free takes the lock over and works.
  std::string name = uniq("heldlock");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 4 << 20, nullptr), 0);
  void *run = cxr_heap_alloc(h, 64 << 10);
  ASSERT_NE(run, nullptr);
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t holder = spawn([&]() -> int {
    uint64_t me = cxr__plock_self_id();
    if (me == 0 || cxr__plock_lock(&hdr->lock, me, 5000000000ll) != 0) return 10;
    if (write(ready[1], "h", 1) != 1) return 11;
    pause();  // until killed, the lock held
    return 12;
  });
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  cxr_heap_free(h, (char *)run + 1);  // a different code first
  ASSERT_EQ(cxr_last_error(), CXR_EBADPTR);
  cxr_heap_free(h, run);
  EXPECT_EQ(cxr_last_error(), CXR_ETIMEDOUT);
  kill(holder, SIGKILL);
  EXPECT_EQ(wait_child(holder), 128 + SIGKILL);
  cxr_heap_free(h, run);  // the run comes back: nothing is in use
  EXPECT_EQ(__atomic_load_n(&hdr->lock.word, __ATOMIC_SEQ_CST), 0u);
  cxr_heap_stats st;
  ASSERT_EQ(cxr_heap_stats(h, &st), 0);
  EXPECT_EQ(st.used, 0u);
  for (int fd : ready) close(fd);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
}

TEST(Errors, AnUnlockWritesNothingAPeerPointedItAt) {
  // Any holder can write the heap's lock while another process holds it. With a glibc
  // robust mutex there, the unlock followed the list links kept in the mutex and stored
  // through them (a peer that pointed them at the holder's memory chose what it wrote
  // where). This lock's unlock writes only its own word, and leaves a word it does not
  // recognise to the next locker, which takes it over.
  std::string name = uniq("lockbytes");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 4 << 20), 0);
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  void *kept = cxr_heap_alloc(h, 1 << 20);
  ASSERT_NE(kept, nullptr);
  memset(kept, 0x5a, 1 << 20);
  static uint64_t canary[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t me = cxr__plock_self_id();
  ASSERT_NE(me, 0u);
  ASSERT_EQ(cxr__plock_lock(&hdr->lock, me, 1000000000ll), 0);
  uint64_t *bytes = reinterpret_cast<uint64_t *>(&hdr->lock);
  for (size_t i = 0; i < sizeof hdr->lock / sizeof(uint64_t); i++)
    bytes[i] = reinterpret_cast<uintptr_t>(canary);
  cxr__plock_unlock(&hdr->lock, me);
  for (int i = 0; i < 8; i++) EXPECT_EQ(canary[i], (uint64_t)i + 1);
  EXPECT_EQ(bytes[0], reinterpret_cast<uintptr_t>(canary));  // not ours: left as written
  // A word no process could have written (pid beyond the kernel's limit): the next
  // allocation that needs the lock takes it over, repairs, and goes on.
  __atomic_store_n(&hdr->lock.word, CXR_PLOCK_PID_MASK, __ATOMIC_SEQ_CST);
  int64_t t0 = cxr_now_ns();
  void *b = cxr_heap_alloc(h, 1 << 20);
  EXPECT_NE(b, nullptr);
  EXPECT_LT(cxr_now_ns() - t0, 1000000000);  // not the 2 s a live holder gets
  EXPECT_EQ(__atomic_load_n(&hdr->lock.word, __ATOMIC_SEQ_CST), 0u);
  EXPECT_EQ(static_cast<unsigned char *>(kept)[(1 << 20) - 1], 0x5a);
  cxr_heap_free(h, b);
  cxr_heap_free(h, kept);
  cxr_heap_stats st;
  ASSERT_EQ(cxr_heap_stats(h, &st), 0);
  EXPECT_EQ(st.used, 0u);
  cxr_heap_close(h);
}

TEST(Errors, AHeaderNameWithoutItsEndIsLoggedBounded) {
  // Any holder can write the header: one that overwrites the name's terminator and every
  // byte after it, to the end of the heap, made the next log line naming the heap read on
  // into the unmapped memory after it (SIGSEGV in the logging process). In a child, so that
  // a crash is a failed expectation rather than the end of the suite.
  std::string name = uniq("noname");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 3 << 20), 0);  // not a 2 MiB multiple: a gap after
  pid_t pid = spawn([&]() -> int {
    if (cxr_heap_renew(h) != 0) return 9;  // its own lease first: the free below takes no lock
    char *base = static_cast<char *>(cxr_heap_base(h));
    size_t off = offsetof(cxr__hdr, name);
    memset(base + off, 'x', (3u << 20) - off);
    cxr_heap_free(h, base + 1);  // refused (whatever the code), and logged with the name
    return 0;
  });
  EXPECT_EQ(wait_child(pid), 0) << "0: refused and logged; 139: SIGSEGV";
  cxr_heap_close(h);
}

// The page-map entry of the page run at p, as a peer that maps the heap sees it.
static cxr__pme *run_head_entry(cxr_heap *h, void *p) {
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  uint64_t pg = ((char *)p - (char *)hdr - hdr->data_off) / CXR_PAGE;
  return (cxr__pme *)((char *)hdr + hdr->map_off) + pg;
}

TEST(Errors, ARunLengthRewrittenWhileAFreeWaitsForTheLockIsNotFollowed) {
  // Any holder can write the page map. One that holds the heap's lock while another process
  // frees a page run, and rewrites that run's length before it unlocks: the free checked
  // the length before it waited for the lock and read it again after, then wrote a boundary
  // tag 32 GiB past the page map (SIGSEGV, or another heap's memory). Now it refuses.
  std::string name = uniq("regrown");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 4 << 20), 0);
  void *run = cxr_heap_alloc_pages(h, 64 << 10);
  ASSERT_NE(run, nullptr);
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  cxr__pme *head = run_head_entry(h, run);
  uint64_t w0 = head->w0.load();
  ASSERT_EQ(cxr__pm_kind(w0), (unsigned)CXR_PM_LARGE);
  ASSERT_EQ(cxr__pm_npages(w0), 16u);
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  pid_t victim = spawn([&]() -> int {
    if (cxr_heap_renew(h) != 0) return 10;  // its own lease, taken before the lock is held
    char c;
    if (write(ready[1], "v", 1) != 1 || read(go[0], &c, 1) != 1) return 11;
    cxr_heap_free(h, run);  // finds a good run, then waits for the lock
    return cxr_last_error() == CXR_ECORRUPT ? 0 : 12;
  });
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  pid_t hostile = spawn([&]() -> int {
    uint64_t me = cxr__plock_self_id();
    if (me == 0 || cxr__plock_lock(&hdr->lock, me, 5000000000ll) != 0) return 20;
    if (write(ready[1], "h", 1) != 1) return 21;
    // A waiter sets the waiters bit in the lock word before it sleeps.
    for (int ms = 0; !(__atomic_load_n(&hdr->lock.word, __ATOMIC_SEQ_CST) & CXR_PLOCK_WAITERS);
         ms++) {
      if (ms > 1500) return 22;  // the victim waits 2 s at most
      usleep(1000);
    }
    head->w0.store(cxr__pm_w0(CXR_PM_LARGE, 0, cxr__pm_slot(w0), 0x7ffffff0u));
    cxr__plock_unlock(&hdr->lock, me);
    return 0;
  });
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(write(go[1], "g", 1), 1);
  EXPECT_EQ(wait_child(hostile), 0);
  EXPECT_EQ(wait_child(victim), 0) << "0: refused; 139: SIGSEGV";
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
  head->w0.store(w0);  // repaired: the run frees as usual
  cxr_heap_free(h, run);
  EXPECT_EQ(head->w0.load() >> 56, (uint64_t)CXR_PM_FREE);
  cxr_heap_close(h);
}

TEST(Errors, UsableSizeOfARunBeingRewrittenStaysInsideTheHeap) {
  // usable_size checked a run's length and then read it again: a holder rewriting it in
  // between made it report up to 16 TiB, and cxr_heap_realloc then copied that much.
  std::string name = uniq("usable");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 4 << 20), 0);
  void *run = cxr_heap_alloc_pages(h, 64 << 10);
  ASSERT_NE(run, nullptr);
  cxr__pme *head = run_head_entry(h, run);
  uint64_t w0 = head->w0.load();
  uint64_t bad = cxr__pm_w0(CXR_PM_LARGE, 0, cxr__pm_slot(w0), 0x7ffffff0u);
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      head->w0.store(bad);
      head->w0.store(w0);
    }
  });
  size_t worst = 0;
  int64_t until = cxr_now_ns() + 1000000000;
  while (cxr_now_ns() < until && worst <= cxr_heap_size(h))
    for (int i = 0; i < 1000; i++) worst = std::max(worst, cxr_heap_usable_size(h, run));
  stop = true;
  scribbler.join();
  head->w0.store(w0);
  EXPECT_LE(worst, (size_t)(64 << 10));
  EXPECT_EQ(cxr_heap_usable_size(h, run), (size_t)(64 << 10));
  cxr_heap_free(h, run);
  cxr_heap_close(h);
}

TEST(Errors, AHeaderThatGrewPastTheRegistrysSizeIsRefused) {
  // A holder can grow a heap's file and write a larger size, with the geometry to match,
  // into its header. The next process to open it mapped it across the heap after it (which
  // then failed to open with CXR_EADDRINUSE). The registry's size decides now.
  std::string na = uniq("grown-a"), nb = uniq("grown-b");
  cxr_heap *a = nullptr, *b = nullptr;
  ASSERT_EQ(cxr_heap_create(&a, na.c_str(), 2 << 20, nullptr), 0);
  ASSERT_EQ(cxr_heap_create(&b, nb.c_str(), 2 << 20, nullptr), 0);
  ASSERT_EQ((uintptr_t)cxr_heap_base(b), (uintptr_t)cxr_heap_base(a) + (2 << 20));
  cxr_heap_close(a);
  cxr_heap_close(b);
  std::string path = g_root + "/" + na + ".heap";
  pid_t pid = spawn([&]() -> int {
    cxr_heap *ha = nullptr;
    if (cxr_heap_open(&ha, na.c_str()) != 0) return 10;
    if (truncate(path.c_str(), 4 << 20) != 0) return 11;
    cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(ha);
    hdr->size = 4 << 20;
    cxr__geometry(hdr->size, &hdr->map_off, &hdr->data_off, &hdr->npages);
    cxr_heap_close(ha);
    return 0;
  });
  ASSERT_EQ(wait_child(pid), 0);
  a = nullptr;
  EXPECT_EQ(cxr_heap_open(&a, na.c_str()), CXR_ECORRUPT);
  EXPECT_EQ(a, nullptr);
  if (a) cxr_heap_close(a);
  EXPECT_EQ(cxr_heap_open(&b, nb.c_str()), 0);
  if (b) cxr_heap_close(b);
  EXPECT_EQ(cxr_heap_unlink(na.c_str()), 0);
  EXPECT_EQ(cxr_heap_unlink(nb.c_str()), 0);
}

// cxr__heap_free_shared (an idl _free's string bodies and arrays, which two fields may
// name): a block freed already, slab or page run, is left without a log line or an error;
// a pointer outside the heap is still refused as by cxr_heap_free.
TEST(Errors, ASharedFreeOfAFreedBlockIsQuietAndOfAForeignPointerRefused) {
  std::string name = uniq("sharedfree");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, nullptr), 0);
  cxr_heap_stats st0, st1;
  ASSERT_EQ(cxr_heap_get_stats(h, &st0), 0);
  void *small = cxr_heap_alloc(h, 40), *run = cxr_heap_alloc(h, 3 * CXR_SMALL_MAX);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(run, nullptr);
  testing::internal::CaptureStderr();
  cxr__set_error(0);
  for (int i = 0; i < 2; i++) {
    cxr__heap_free_shared(h, small);
    cxr__heap_free_shared(h, run);
  }
  int err = cxr_last_error();
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, 0) << cxr_strerror(err);
  EXPECT_EQ(log, "");
  ASSERT_EQ(cxr_heap_get_stats(h, &st1), 0);
  EXPECT_EQ(st1.frees - st0.frees, 2u);
  EXPECT_EQ(st1.used, st0.used);
  int outside = 0;
  cxr__heap_free_shared(h, &outside);
  EXPECT_EQ(cxr_last_error(), CXR_EBADPTR);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
}
