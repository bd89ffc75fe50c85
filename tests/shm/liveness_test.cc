// Liveness checks of heap holders (reaps, heap-lock takeovers) where /proc says less than
// "no such process": on a thread that may not open files (a sandbox worker under
// cxr_sandbox_restrict_thread, CXRPC_SANDBOX_THREADS=1, whose seccomp policy refuses open
// with EPERM), and for a process whose main thread exited while others run on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cxrpc/sandbox.h>
#include <cxrpc/shm.h>

#include "shm/layout.h"
#include "shm/proc.h"
#include "shm/sync.h"
#include "tests/shm/util.h"

using namespace shmtest;

static std::string g_root = setup_root("liveness_test");
static cxr_heap *g_heap;  // the heap of the main-thread case, for its child's thread

struct Probe {
  cxr_heap *h;
  cxr__hdr *hdr;
  cxr__proc_id child;
  uint64_t child_word;
  int restrict_rc = -1, reaped = -1;
  bool alive = false, dead_word = true, lock_taken = true;
};

// On a restricted thread: what the liveness checks say of the live child, a reap, and a
// wait for the heap lock the child "holds" (as if it were inside an allocation), which
// must wait and give up, not take the lock over.
static void *probe(void *arg) {
  Probe *p = static_cast<Probe *>(arg);
  p->restrict_rc = cxr_sandbox_restrict_thread();
  if (p->restrict_rc != 0) return nullptr;
  p->alive = cxr__proc_alive(&p->child);
  p->dead_word = cxr__plock_holder_dead(p->child_word);
  p->reaped = cxr_heap_reap(p->h);
  __atomic_store_n(&p->hdr->lock.word, p->child_word, __ATOMIC_SEQ_CST);
  uint64_t me = 1;  // (this thread cannot read its own identity either: any other word)
  p->lock_taken = cxr__plock_lock(&p->hdr->lock, me, 50000000ll) != CXR_ETIMEDOUT;
  __atomic_store_n(&p->hdr->lock.word, 0u, __ATOMIC_SEQ_CST);
  return nullptr;
}

TEST(Liveness, AThreadThatCannotOpenProcNeverTakesALiveHolderForDead) {
  // Before: every pid read as gone there, so a reap on such a thread (a handler whose
  // allocation ran out of memory reaps) gave a live holder's memory back to the heap, and
  // a wait there for the heap's lock would have taken it from its live holder.
  std::string name = uniq("restricted");
  cxr_heap *h = nullptr;
  ASSERT_EQ(create_self_removing(&h, name, 4 << 20), 0);
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(h);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  void *theirs = nullptr;  // the child's block, at the same address in both processes
  pid_t holder = spawn([&]() -> int {
    if (cxr_heap_renew(h) != 0) return 10;  // a lease of its own (inherited handle)
    void *p = cxr_heap_alloc(h, 1 << 20);
    if (p == nullptr || write(ready[1], &p, sizeof p) != sizeof p) return 11;
    pause();  // alive, holding its block, until killed
    return 12;
  });
  ASSERT_EQ(read(ready[0], &theirs, sizeof theirs), (ssize_t)sizeof theirs);
  cxr__proc_id child = {};
  child.pid = holder;
  child.host = cxr__host_id();
  ASSERT_EQ(cxr__proc_start_time(holder, &child.start_time), 0);
  const uint64_t child_word = cxr__plock_id(child.pid, child.start_time);

  Probe pr;
  pr.h = h;
  pr.hdr = hdr;
  pr.child = child;
  pr.child_word = child_word;
  pthread_t t;  // (not std::thread: UBSan's vptr check of its state needs /proc there)
  ASSERT_EQ(pthread_create(&t, nullptr, probe, &pr), 0);
  ASSERT_EQ(pthread_join(t, nullptr), 0);
  ASSERT_EQ(pr.restrict_rc, 0);
  EXPECT_TRUE(pr.alive) << "a live process read as dead on a restricted thread";
  EXPECT_FALSE(pr.dead_word) << "a live holder's lock word read as a dead one's";
  EXPECT_EQ(pr.reaped, 0) << "the reap gave back a live holder's memory";
  EXPECT_FALSE(pr.lock_taken) << "the lock was taken over from its live holder";
  EXPECT_EQ(cxr_heap_usable_size(h, theirs), (size_t)1 << 20);  // still the child's
  // Once the child is gone, an unrestricted reap gives its block back.
  kill(holder, SIGKILL);
  EXPECT_EQ(wait_child(holder), 128 + SIGKILL);
  EXPECT_EQ(cxr_heap_reap(h), 1);
  for (int fd : ready) close(fd);
  cxr_heap_close(h);
}

static void *hold_and_wait(void *arg) {
  int fd = *static_cast<int *>(arg);
  void *p = nullptr;  // the block this thread allocated, at the same address in the parent
  if (cxr_heap_renew(g_heap) != 0 || (p = cxr_heap_alloc(g_heap, 1 << 20)) == nullptr) _exit(10);
  if (write(fd, &p, sizeof p) != sizeof p) _exit(11);
  pause();  // until killed
  return nullptr;
}

TEST(Liveness, AProcessWhoseMainThreadExitedIsAliveWhileOthersRun) {
  // /proc shows such a process as a zombie (its leader's state); it was taken for dead, so a
  // reap gave its live allocations back to the heap and a wait for a lock it held would have
  // taken the lock over.
  std::string name = uniq("mainexited");
  ASSERT_EQ(create_self_removing(&g_heap, name, 4 << 20), 0);
  cxr__hdr *hdr = (cxr__hdr *)cxr_heap_base(g_heap);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t holder = spawn([&]() -> int {
    pthread_t t;
    if (pthread_create(&t, nullptr, hold_and_wait, &ready[1]) != 0) return 12;
    // The main thread ends and the process lives on in t (the raw system call: pthread_exit
    // would unwind through the test framework's frames).
    syscall(SYS_exit, 0);
    return 13;
  });
  close(ready[1]);  // a child that fails before writing ends the read
  ready[1] = -1;
  void *theirs = nullptr;
  ASSERT_EQ(read(ready[0], &theirs, sizeof theirs), (ssize_t)sizeof theirs)
      << "the child could not lock the heap after its main thread exited";
  bool zombie_leader = false;  // wait until /proc shows the exited main thread
  for (int i = 0; i < 400 && !zombie_leader; i++) {
    char path[64], buf[512] = {0};
    snprintf(path, sizeof path, "/proc/%d/stat", (int)holder);
    FILE *f = fopen(path, "r");
    if (f != nullptr) {
      if (fgets(buf, sizeof buf, f) == nullptr) buf[0] = '\0';
      fclose(f);
    }
    const char *p = strrchr(buf, ')');
    zombie_leader = p != nullptr && p[1] == ' ' && p[2] == 'Z';
    if (!zombie_leader) usleep(5000);
  }
  ASSERT_TRUE(zombie_leader);
  cxr__proc_id child = {};
  child.pid = holder;
  child.host = cxr__host_id();
  ASSERT_EQ(cxr__proc_start_time(holder, &child.start_time), 0) << "taken for gone";
  EXPECT_TRUE(cxr__proc_alive(&child));
  const uint64_t child_word = cxr__plock_id(child.pid, child.start_time);
  EXPECT_FALSE(cxr__plock_holder_dead(child_word));
  EXPECT_EQ(cxr_heap_reap(g_heap), 0) << "the reap gave back a live holder's memory";
  EXPECT_EQ(cxr_heap_usable_size(g_heap, theirs), (size_t)1 << 20);
  __atomic_store_n(&hdr->lock.word, child_word, __ATOMIC_SEQ_CST);
  EXPECT_EQ(cxr__plock_lock(&hdr->lock, 1, 50000000ll), CXR_ETIMEDOUT)
      << "the lock was taken over from its live holder";
  __atomic_store_n(&hdr->lock.word, 0u, __ATOMIC_SEQ_CST);
  kill(holder, SIGKILL);
  EXPECT_EQ(wait_child(holder), 128 + SIGKILL);
  EXPECT_EQ(cxr_heap_reap(g_heap), 1);  // gone now: its block comes back
  close(ready[0]);
  cxr_heap_close(g_heap);
  g_heap = nullptr;
}
