// The SIGBUS guard (shm/bus_guard.h): an access past the end of a watched heap whose file
// another process shrank reads a private zero page instead of killing this process, and the
// heap is reported damaged; a SIGBUS in a heap not watched, or outside the heap window,
// still reaches the handler that was installed before the guard.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cxrpc/shm.h>

#include "shm/bus_guard.h"
#include "tests/shm/util.h"

using namespace shmtest;

static std::string g_root = setup_root("bus_guard_test");
static sigjmp_buf g_jump;
static volatile sig_atomic_t g_earlier;  // faults the earlier handler saw

static void earlier(int, siginfo_t *, void *) {
  g_earlier = g_earlier + 1;
  siglongjmp(g_jump, 1);
}

TEST(BusGuard, AShrunkHeapReadsZerosAndIsReportedOtherFaultsGoToTheEarlierHandler) {
  ASSERT_EQ(cxr_init(nullptr), 0);
  struct sigaction sa, before;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = earlier;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  ASSERT_EQ(sigaction(SIGBUS, &sa, &before), 0);
  ASSERT_EQ(cxr__bus_guard_install(), 0);
  ASSERT_EQ(cxr__bus_guard_install(), 0);  // once per process

  cxr_heap *h = nullptr;
  const std::string name = uniq("shrunk");
  ASSERT_EQ(create_self_removing(&h, name, 4u << 20), 0);
  cxr__bus_guard_watch(cxr_heap_base(h), cxr_heap_size(h), true);
  char *p = static_cast<char *>(cxr_heap_alloc(h, 64 << 10));
  ASSERT_NE(p, nullptr);
  memset(p, 0x5a, 64 << 10);
  uintptr_t base[2] = {(uintptr_t)cxr_heap_base(h), (uintptr_t)p};
  size_t size[2] = {cxr_heap_size(h), 1};
  bool hit[2] = {true, true};
  ASSERT_EQ(cxr__bus_damaged(base, size, 2, hit), 0);
  EXPECT_FALSE(hit[0]);

  // Another process (any holder) shrinks the file to its first page.
  const std::string path = g_root + "/" + name + ".heap";
  ASSERT_EQ(truncate(path.c_str(), 4096), 0);
  uint64_t r0 = cxr__bus_repairs();
  volatile char *v = p;
  EXPECT_EQ(v[100], 0) << "a repaired page reads as zeros";
  v[200] = 7;  // and takes writes, in this process only
  EXPECT_EQ(v[200], 7);
  EXPECT_EQ(cxr__bus_repairs(), r0 + 1);
  ASSERT_EQ(cxr__bus_damaged(base, size, 2, hit), 0);
  EXPECT_TRUE(hit[0]);
  EXPECT_TRUE(hit[1]);
  EXPECT_EQ(g_earlier, 0);

  // A heap nobody asked the guard to watch: its SIGBUS is not the guard's.
  cxr_heap *u = nullptr;
  const std::string uname = uniq("unwatched");
  const std::string upath = g_root + "/" + uname + ".heap";
  ASSERT_EQ(create_self_removing(&u, uname, 4u << 20), 0);
  char *q = static_cast<char *>(cxr_heap_alloc(u, 64 << 10));
  ASSERT_NE(q, nullptr);
  memset(q, 1, 64 << 10);
  ASSERT_EQ(truncate(upath.c_str(), 4096), 0);
  if (sigsetjmp(g_jump, 1) == 0) {
    (void)*(volatile char *)q;
    ADD_FAILURE() << "no SIGBUS past the end of a shrunk heap";
  }
  EXPECT_EQ(g_earlier, 1);
  EXPECT_EQ(cxr__bus_repairs(), r0 + 1);
  // Grown back (zeros past the first page), so that closing it does not fault again.
  ASSERT_EQ(truncate(upath.c_str(), 4u << 20), 0);

  // A file mapping outside the window: its SIGBUS is not the guard's either.
  const std::string other = g_root + "/outside";
  int fd = open(other.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  volatile char *o = static_cast<char *>(mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0));
  ASSERT_NE((void *)o, MAP_FAILED);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  if (sigsetjmp(g_jump, 1) == 0) {
    (void)o[4096];
    ADD_FAILURE() << "no SIGBUS past the end of a shrunk file";
  }
  EXPECT_EQ(g_earlier, 2);
  EXPECT_EQ(cxr__bus_repairs(), r0 + 1);
  munmap((void *)o, 8192);
  close(fd);
  unlink(other.c_str());

  void *hb = cxr_heap_base(h);
  size_t hs = cxr_heap_size(h);
  cxr_heap_close(h);  // watched until unmapped: the close touches shrunk pages too
  cxr__bus_guard_watch(hb, hs, false);
  cxr_heap_close(u);
  sigaction(SIGBUS, &before, nullptr);
}
