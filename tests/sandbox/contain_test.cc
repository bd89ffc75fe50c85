// Fault containment, range checks, memory domains and the seccomp allow-list of sandbox
// worker threads.
#include <gtest/gtest.h>
#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "tests/sandbox/harness.h"

using namespace sbx;

namespace {

// These fault on purpose. Under the sanitizers they are built uninstrumented: ASan/UBSan
// would report the bad access (NULL, say) before the CPU faults, and TSan's shadow lookup for
// an address outside application memory faults inside the TSan runtime, which TSan treats
// as its own crash. Containing those is not what these tests are about.
#define CXR_FAULTS_ON_PURPOSE \
  __attribute__((noinline, no_sanitize("address", "undefined", "thread")))
CXR_FAULTS_ON_PURPOSE int deref(void *p) { return *(volatile int *)p; }
CXR_FAULTS_ON_PURPOSE int store42(void *p) {
  *(volatile int *)p = 42;
  return 7;
}

TEST(Contain, ReturnsTheFunctionsResult) {
  int x = 0;
  EXPECT_EQ(cxr_sandbox_run(store42, &x), 7);
  EXPECT_EQ(x, 42);
  EXPECT_EQ(cxr_sandbox_run(nullptr, nullptr), CXR_EINVAL);
}

TEST(Contain, NullAndWildPointersBecomeEBADPTR) {
  uint64_t before = cxr_sandbox_faults();
  EXPECT_EQ(cxr_sandbox_run(deref, nullptr), CXR_EBADPTR);
  EXPECT_EQ(cxr_sandbox_run(deref, (void *)16), CXR_EBADPTR);
  // A kernel address: unmapped for us in every configuration (ASan maps much of the rest).
  EXPECT_EQ(cxr_sandbox_run(deref, (void *)0xffff888000000000ull), CXR_EBADPTR);
  EXPECT_EQ(cxr_sandbox_fault_addr(), (void *)0xffff888000000000ull);
  EXPECT_EQ(cxr_sandbox_faults(), before + 3);
}

TEST(Contain, UnmappedAndReadOnlyWindowPages) {
  // Window pages reserved but not backed (PROT_NONE), as shm reserves the window.
  uintptr_t w = window_slot();
  void *r = mmap((void *)w, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
                 MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(r, (void *)w);
  EXPECT_EQ(cxr_sandbox_run(deref, (char *)r + 4096), CXR_EBADPTR);
  ASSERT_EQ(mprotect(r, 4096, PROT_READ), 0);
  EXPECT_EQ(cxr_sandbox_run(deref, r), 0);
  EXPECT_EQ(cxr_sandbox_run(store42, r), CXR_EBADPTR);  // a sealed page, seen from a handler
  munmap(r, 1 << 20);
}

TEST(Contain, BusErrorFromATruncatedHeap) {
  // The sender shrinks the heap file under the receiver: the read is a SIGBUS.
  char path[] = "/dev/shm/cxrpc-sbx-bus-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  void *m = mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  EXPECT_EQ(cxr_sandbox_run(deref, (char *)m + 4096), CXR_EBADPTR);
  munmap(m, 8192);
  close(fd);
}

struct Nested {
  int depth;
};
int nest(void *p) {
  Nested *n = (Nested *)p;
  if (n->depth == 0) return deref(nullptr);
  Nested inner = {n->depth - 1};
  int rc = cxr_sandbox_run(nest, &inner);
  return rc == CXR_EBADPTR ? 100 + n->depth : rc;  // only the innermost level faulted
}

TEST(Contain, NestedSandboxesUnwindOneLevel) {
  Nested n = {3};
  EXPECT_EQ(cxr_sandbox_run(nest, &n), 101);
}

// A handler for an untrusted peer: follows the peer's pointer only after the range check
// (what generated validators do), or raw (the sandbox catches the fault).
struct Req {
  const cxr_range *heap;
  const void *ptr;
  bool check;
};
CXR_FAULTS_ON_PURPOSE int handler(void *p) {
  Req *r = (Req *)p;
  if (r->check) {
    int rc = cxr_range_check(r->heap, r->ptr, sizeof(int), alignof(int));
    if (rc) return rc;
  }
  return *(const volatile int *)r->ptr == 0x11111111 ? 0 : 1;
}

TEST(Contain, ServerKeepsServingThroughBadPointers) {
  Heap h;
  ASSERT_TRUE(make_heap(&h, 1 << 16, false));
  cxr_range heap = {h.p(), h.size};
  static int private_secret = 0x5ec2e7;
  uintptr_t unmapped = h.addr + h.size + (1 << 20);  // in the window, nothing mapped
  int good = 0, bad = 0;
  for (int i = 0; i < 300; i++) {
    Req r = {&heap, nullptr, true};
    switch (i % 5) {
      case 0: r.ptr = h.p() + 64; break;                                  // fine
      case 1: r.ptr = &private_secret; break;                             // private memory
      case 2: r.ptr = h.p() + h.size - 2; break;                          // runs off the end
      case 3: r.ptr = (void *)unmapped; r.check = false; break;           // raw: faults
      case 4: r.ptr = (void *)(uintptr_t)(i * 8); r.check = false; break; // raw: near NULL
    }
    int rc = cxr_sandbox_run(handler, &r);
    if (rc == 0) good++;
    else if (rc == CXR_EBADPTR) bad++;
  }
  EXPECT_EQ(good, 60);
  EXPECT_EQ(bad, 240);
  drop_heap(&h);
}

TEST(Contain, FaultsInManyThreadsAtOnce) {
  std::atomic<int> bad{0};
  std::vector<std::thread> th;
  for (int t = 0; t < 4; t++)
    th.emplace_back([&] {
      for (int i = 0; i < 100; i++)
        if (cxr_sandbox_run(deref, (void *)(uintptr_t)(8 + i)) == CXR_EBADPTR) bad++;
    });
  for (auto &t : th) t.join();
  EXPECT_EQ(bad.load(), 400);
}

TEST(Contain, FaultOutsideASandboxStillKills) {
  int x = 0;
  ASSERT_EQ(cxr_sandbox_run(store42, &x), 7);  // the handler is installed
  pid_t c = fork();
  ASSERT_GE(c, 0);
  if (c == 0) {
    deref(nullptr);
    _exit(0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(c, &st, 0), c);
  // Plain: SIGSEGV. Under ASan its own handler reports and aborts.
  EXPECT_TRUE(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0));
}

TEST(RangeCheck, Bounds) {
  alignas(16) static char mem[80];
  char *buf = mem + 16;  // the range: [mem + 16, mem + 80)
  cxr_range r = {buf, 64};
  EXPECT_EQ(cxr_range_check(&r, buf, 64, 1), 0);
  EXPECT_EQ(cxr_range_check(&r, buf + 60, 4, 4), 0);
  EXPECT_EQ(cxr_range_check(&r, buf + 61, 2, 2), CXR_EBADPTR);  // misaligned
  EXPECT_EQ(cxr_range_check(&r, buf + 1, 64, 1), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, mem + 15, 1, 1), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, nullptr, 0, 1), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(nullptr, buf, 1, 1), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, buf + 8, SIZE_MAX, 1), CXR_EBADPTR);  // wraps
  EXPECT_EQ(cxr_range_check(&r, buf + 64, 0, 1), 0);                  // empty, at the end
  cxr_range wrap = {(void *)(UINTPTR_MAX - 8), 64};
  EXPECT_EQ(cxr_range_check(&wrap, (void *)(UINTPTR_MAX - 4), 1, 1), CXR_EBADPTR);
}

TEST(Domain, PrivateMemoryFaultsInsideTheSandbox) {
  if (!cxr_domain_supported()) {
    void *p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_EQ(cxr_domain_protect(p, 4096), CXR_ENOSYS);
    munmap(p, 4096);
    GTEST_SKIP() << "no protection keys on this CPU (pkey_alloc fails)";
  }
  int *p = (int *)mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_EQ(cxr_domain_protect(p, 4096), 0);
  *p = 5;                                            // fine outside
  EXPECT_EQ(cxr_sandbox_run(deref, p), CXR_EBADPTR);  // not inside
  EXPECT_EQ(*p, 5);
  EXPECT_EQ(cxr_sandbox_run(store42, p), CXR_EBADPTR);
  *p = 6;  // rights restored after the contained fault
  munmap(p, 4096);
}

// Sandbox threads are plain pthreads running C-style code: under UBSan, C++ vptr checks on
// a restricted thread would need to open files to resolve types, which the policy forbids.
struct Probe {
  int pipe_w;
  int restrict_rc = -1, open_rc = 0, open_errno = 0, sock_errno = 0, exec_errno = 0;
  int mprot_errno = 0, fork_errno = 0;
  bool malloc_ok = false, mmap_ok = false, write_ok = false;
};

void *probe_thread(void *arg) {
  Probe *p = (Probe *)arg;
  p->restrict_rc = cxr_sandbox_restrict_thread();
  if (p->restrict_rc != 0) return nullptr;
  p->open_rc = open("/etc/hostname", O_RDONLY);
  p->open_errno = errno;
  errno = 0;
  if (socket(AF_INET, SOCK_STREAM, 0) < 0) p->sock_errno = errno;
  char *argv[] = {(char *)"/bin/true", nullptr};
  errno = 0;
  syscall(SYS_execve, "/bin/true", argv, environ);
  p->exec_errno = errno;
  static char page[8192] __attribute__((aligned(4096)));
  errno = 0;
  if (mprotect(page, 4096, PROT_READ) != 0) p->mprot_errno = errno;
  errno = 0;
  if (syscall(SYS_fork) < 0) p->fork_errno = errno;
  void *m = malloc(1 << 20);  // large: its own mmap
  p->malloc_ok = m != nullptr;
  free(m);
  void *a = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  p->mmap_ok = a != MAP_FAILED;
  if (p->mmap_ok) munmap(a, 4096);
  p->write_ok = write(p->pipe_w, "x", 1) == 1;  // descriptors it already has still work
  return nullptr;
}

TEST(ThreadPolicy, SandboxThreadCannotOpenSocketOrExec) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  Probe p;
  p.pipe_w = pipefd[1];
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, nullptr, probe_thread, &p), 0);
  ASSERT_EQ(pthread_join(th, nullptr), 0);
  ASSERT_EQ(p.restrict_rc, 0);
  EXPECT_EQ(p.open_rc, -1);
  EXPECT_EQ(p.open_errno, EPERM);
  EXPECT_EQ(p.sock_errno, EPERM);
  EXPECT_EQ(p.exec_errno, EPERM);
  EXPECT_EQ(p.mprot_errno, EPERM);
  EXPECT_EQ(p.fork_errno, EPERM);
  EXPECT_TRUE(p.malloc_ok);
  EXPECT_TRUE(p.mmap_ok);
  EXPECT_TRUE(p.write_ok);
  // Only that thread: this one still opens files.
  int fd = open("/proc/self/stat", O_RDONLY);
  EXPECT_GE(fd, 0);
  close(fd);
  close(pipefd[0]);
  close(pipefd[1]);
}

void *restricted_fault(void *arg) {
  int *rc = (int *)arg;
  if (cxr_sandbox_restrict_thread() != 0) return nullptr;
  *rc = cxr_sandbox_run(deref, (void *)24);
  return nullptr;
}

TEST(ThreadPolicy, RestrictedHandlerFaultsAreStillContained) {
  int rc = 0;
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, nullptr, restricted_fault, &rc), 0);
  ASSERT_EQ(pthread_join(th, nullptr), 0);
  EXPECT_EQ(rc, CXR_EBADPTR);
}

// The test above alone in a new process, where no earlier test has used the sandbox: the
// restricted thread is the first (as an untrusted server's worker is under
// CXRPC_SANDBOX_THREADS), and the fault handlers must be in place before its policy forbids
// sigaction (they were not: every cxr_sandbox_run of that process returned CXR_EIO).
TEST(ThreadPolicy, FirstSandboxUseOnARestrictedThreadInAFreshProcess) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/proc/self/exe", "contain_test",
          "--gtest_filter=ThreadPolicy.RestrictedHandlerFaultsAreStillContained", (char *)nullptr);
    _exit(127);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "the restricted thread's sandbox failed in a fresh process";
}

}  // namespace
