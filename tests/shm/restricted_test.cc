// Liveness checks on a thread that may not open files: a sandbox worker under
// cxr_sandbox_restrict_thread (CXRPC_SANDBOX_THREADS=1), whose seccomp policy refuses open
// with EPERM. Such a thread cannot read /proc, and that is not evidence that a process died.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <pthread.h>

#include <cxrpc/sandbox.h>
#include <cxrpc/shm.h>

#include "shm/layout.h"
#include "shm/proc.h"
#include "shm/sync.h"
#include "tests/shm/util.h"

using namespace shmtest;

static std::string g_root = setup_root("restricted_test");

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

TEST(Restricted, AThreadThatCannotOpenProcNeverTakesALiveHolderForDead) {
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
