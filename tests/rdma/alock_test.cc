// ALock in the pod cohort: mutual exclusion between threads, the in-cohort budget, waiters
// whose deadline passes leaving the queue cleanly (the releaser passes over them and the lock
// keeps working), and child processes killed while holding the lock or waiting for it. And one remote participant (a real
// rdma_peer process holding the lock over UCX on TCP) whose step times out.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <cxrpc/rdma.h>
#include "tests/rdma/peer.h"

namespace {

const int64_t kMs = 1000000;

cxr_alock *new_lock() {
  void *p = nullptr;
  if (posix_memalign(&p, 64, sizeof(cxr_alock)) != 0) return nullptr;
  cxr_alock_init((cxr_alock *)p, 0);
  return (cxr_alock *)p;
}

// Waits (bounded) until slot + 1 is the local tail: that waiter has queued.
bool tail_becomes(cxr_alock *l, uint64_t v) {
  int64_t end = cxr_now_ns() + 10000 * kMs;
  while (__atomic_load_n(&l->ltail, __ATOMIC_ACQUIRE) != v && cxr_now_ns() < end)
    std::this_thread::yield();
  return __atomic_load_n(&l->ltail, __ATOMIC_ACQUIRE) == v;
}

TEST(Alock, ThreadsExcludeEachOther) {
  cxr_alock *l = new_lock();
  ASSERT_NE(l, nullptr);
  volatile long counter = 0;
  std::atomic<int> inside{0}, overlaps{0};
  std::vector<std::thread> ts;
  for (unsigned s = 0; s < 4; s++)
    ts.emplace_back([&, s] {
      cxr_alock_ref r = {};
      r.local = l;
      r.slot = s;
      for (int i = 0; i < 4000; i++) {
        ASSERT_EQ(cxr_alock_lock(&r, cxr_now_ns() + 10000 * kMs), 0);
        if (inside.fetch_add(1) != 0) overlaps++;
        counter = counter + 1;
        inside.fetch_sub(1);
        ASSERT_EQ(cxr_alock_unlock(&r), 0);
      }
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(counter, 4 * 4000);
  EXPECT_EQ(l->ltail, 0u);
  EXPECT_EQ(l->rtail, 0u);
  free(l);
}

TEST(Alock, AWaiterWhoseDeadlinePassesLeavesTheQueue) {
  cxr_alock *l = new_lock();
  cxr_alock_ref a = {}, b = {}, c = {};
  a.local = b.local = c.local = l;
  a.slot = 0, b.slot = 1, c.slot = 2;
  ASSERT_EQ(cxr_alock_lock(&a, 0), 0);
  // b queues behind a and gives up; c queues behind b.
  EXPECT_EQ(cxr_alock_lock(&b, cxr_now_ns() + 20 * kMs), CXR_ETIMEDOUT);
  std::atomic<int> c_rc{1};
  std::thread tc([&] { c_rc = cxr_alock_lock(&c, cxr_now_ns() + 10000 * kMs); });
  ASSERT_TRUE(tail_becomes(l, 3));
  ASSERT_EQ(cxr_alock_unlock(&a), 0);  // passes over b, grants c
  tc.join();
  EXPECT_EQ(c_rc.load(), 0);
  EXPECT_EQ(l->lnodes[1].locked, 4u);  // b's node was passed over: b may use it again
  // b can take the lock again after c.
  std::atomic<int> b_rc{1};
  std::thread tb([&] { b_rc = cxr_alock_lock(&b, cxr_now_ns() + 10000 * kMs); });
  ASSERT_TRUE(tail_becomes(l, 2));
  ASSERT_EQ(cxr_alock_unlock(&c), 0);
  tb.join();
  EXPECT_EQ(b_rc.load(), 0);
  ASSERT_EQ(cxr_alock_unlock(&b), 0);
  EXPECT_EQ(l->ltail, 0u);
  free(l);
}

// ---- pod processes that die ----

// A lock in memory shared with child processes (as pod processes share a heap).
cxr_alock *shared_lock() {
  void *p = mmap(nullptr, sizeof(cxr_alock), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  cxr_alock_init((cxr_alock *)p, 0);
  return (cxr_alock *)p;
}

// A child process that takes the lock through `slot` and then waits to be killed; the
// parent may first wait until it holds the lock (held = true) or until it is queued (the
// tail names its slot). Returns its pid (-1 on failure).
pid_t child_locking(cxr_alock *l, unsigned slot, bool held) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    cxr_alock_ref r = {};
    r.local = l;
    r.slot = slot;
    int rc = cxr_alock_lock(&r, cxr_now_ns() + 60000 * kMs);
    char c = rc == 0 ? 'h' : 'e';
    if (write(fds[1], &c, 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(fds[1]);
  bool ok = pid > 0;
  if (ok && held) {
    char c = 0;
    ok = read(fds[0], &c, 1) == 1 && c == 'h';
  } else if (ok) {
    ok = tail_becomes(l, slot + 1);
  }
  close(fds[0]);
  if (!ok && pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

void kill_child(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// A child takes the lock through `slot` and is killed holding it.
bool dies_holding(cxr_alock *l, unsigned slot) {
  pid_t a = child_locking(l, slot, true);
  if (a <= 0) return false;
  kill_child(a);
  return true;
}

// A pod participant's ref to lock l through `slot`.
cxr_alock_ref pod_ref(cxr_alock *l, unsigned slot) {
  cxr_alock_ref r = {};
  r.local = l;
  r.slot = slot;
  return r;
}

// Takes and gives back the lock through `slot` (deadline 20 s): 0, or what failed.
int lock_unlock(cxr_alock *l, unsigned slot) {
  cxr_alock_ref r = {};
  r.local = l;
  r.slot = slot;
  int rc = cxr_alock_lock(&r, cxr_now_ns() + 20000 * kMs);
  return rc ? rc : cxr_alock_unlock(&r);
}

TEST(Alock, APodProcessThatDiesHoldingTheLockIsRecoveredByTheNextWaiter) {
  // SIGKILL while holding the lock used to leave it held for good: every later attempt
  // ended with CXR_ETIMEDOUT. The next pod waiter finds the dead head and takes its place.
  cxr_alock *l = shared_lock();
  ASSERT_NE(l, nullptr);
  ASSERT_TRUE(dies_holding(l, 1));
  EXPECT_EQ(lock_unlock(l, 0), 0);
  EXPECT_EQ(lock_unlock(l, 0), 0);  // and again: nothing is left behind
  EXPECT_EQ(l->ltail, 0u);
  munmap(l, sizeof *l);
}

TEST(Alock, APodProcessThatDiesWaitingIsPassedOver) {
  // The holder lives; a process queued behind it dies; a third waits behind that one. When
  // the holder unlocks, the lock reaches the third (it used to be handed to the dead one).
  cxr_alock *l = shared_lock();
  ASSERT_NE(l, nullptr);
  cxr_alock_ref h = pod_ref(l, 0);
  ASSERT_EQ(cxr_alock_lock(&h, 0), 0);
  pid_t b = child_locking(l, 1, false);
  ASSERT_GT(b, 0);
  kill_child(b);
  std::atomic<int> c_rc{1};
  std::thread tc([&] { c_rc = lock_unlock(l, 2); });
  ASSERT_TRUE(tail_becomes(l, 3));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(cxr_alock_unlock(&h), 0);
  tc.join();
  EXPECT_EQ(c_rc.load(), 0);
  EXPECT_EQ(lock_unlock(l, 1), 0);  // the dead one's slot can be used again
  EXPECT_EQ(l->ltail, 0u);
  munmap(l, sizeof *l);
}

TEST(Alock, ADeadHolderAndADeadWaiterBehindItAreBothRecovered) {
  cxr_alock *l = shared_lock();
  ASSERT_NE(l, nullptr);
  pid_t a = child_locking(l, 1, true);
  ASSERT_GT(a, 0);
  pid_t b = child_locking(l, 2, false);
  ASSERT_GT(b, 0);
  kill_child(b);
  kill_child(a);
  EXPECT_EQ(lock_unlock(l, 3), 0);
  EXPECT_EQ(lock_unlock(l, 1), 0);
  EXPECT_EQ(lock_unlock(l, 2), 0);
  EXPECT_EQ(l->ltail, 0u);
  munmap(l, sizeof *l);
}

TEST(Alock, AProcessReusingADeadOnesSlotReleasesWhatItHeld) {
  // A restarted process takes the slot its dead predecessor held the lock through: it
  // releases that first (it used to queue behind its own node and wait for itself).
  cxr_alock *l = shared_lock();
  ASSERT_NE(l, nullptr);
  ASSERT_TRUE(dies_holding(l, 1));
  pid_t again = fork();
  if (again == 0) _exit(lock_unlock(l, 1) == 0 ? 0 : 1);
  int st = 0;
  ASSERT_EQ(waitpid(again, &st, 0), again);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_EQ(lock_unlock(l, 0), 0);
  EXPECT_EQ(l->ltail, 0u);
  munmap(l, sizeof *l);
}

TEST(Alock, AWaiterThatGaveUpDoesNotStopTheRecoveryOfADeadHolderAheadOfIt) {
  // b (alive, this process) tries the lock with a short deadline behind a holder that then
  // dies: b's node stays abandoned in the queue. Recovery used to stop at b's live owner,
  // so every later waiter and b itself timed out for good (a review found it).
  cxr_alock *l = shared_lock();
  ASSERT_NE(l, nullptr);
  pid_t h = child_locking(l, 0, true);
  ASSERT_GT(h, 0);
  cxr_alock_ref b = pod_ref(l, 1);
  ASSERT_EQ(cxr_alock_lock(&b, cxr_now_ns() + 2 * kMs), CXR_ETIMEDOUT);
  kill_child(h);
  EXPECT_EQ(lock_unlock(l, 2), 0);
  EXPECT_EQ(lock_unlock(l, 1), 0);  // b's slot too
  EXPECT_EQ(l->ltail, 0u);
  munmap(l, sizeof *l);
}

TEST(Alock, ReusingTheSlotOfAProcessKilledMidReleaseGrantsNoSecondHolder) {
  // What a process killed inside its release leaves (after granting its successor, before
  // its node went back to passed): its node granted, its next word naming a successor that
  // has since held the lock and queued again behind the current holder. The slot's next
  // owner handed over from that stale word, so the successor entered beside the holder.
  cxr_alock *l = shared_lock();
  ASSERT_NE(l, nullptr);
  cxr_alock_ref a = {}, b = {}, c = {};
  a.local = b.local = c.local = l;
  a.slot = 0, b.slot = 1, c.slot = 2;
  ASSERT_EQ(cxr_alock_lock(&a, 0), 0);
  std::atomic<int> brc{1};
  std::thread tb([&] { brc = cxr_alock_lock(&b, cxr_now_ns() + 5000 * kMs); });
  ASSERT_TRUE(tail_becomes(l, 2));
  ASSERT_EQ(cxr_alock_unlock(&a), 0);
  tb.join();
  ASSERT_EQ(brc.load(), 0);
  ASSERT_EQ(l->lnodes[0].next, 2u);  // a's next still names b
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  l->lnodes[0].locked = 2;  // granted, must compete
  l->lnodes[0].owner_pid = (uint64_t)dead;
  ASSERT_EQ(cxr_alock_unlock(&b), 0);
  ASSERT_EQ(cxr_alock_lock(&c, 0), 0);
  brc = 1;
  std::thread tb2([&] { brc = cxr_alock_lock(&b, cxr_now_ns() + 5000 * kMs); });
  ASSERT_TRUE(tail_becomes(l, 2));  // b waits behind c
  cxr_alock_ref a2 = pod_ref(l, 0);  // the slot's next owner (the node's owner is dead)
  std::atomic<int> arc{1};
  std::thread ta([&] { arc = cxr_alock_lock(&a2, cxr_now_ns() + 5000 * kMs); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(brc.load(), 1) << "b took the lock while c holds it";
  ASSERT_EQ(cxr_alock_unlock(&c), 0);
  tb2.join();
  EXPECT_EQ(brc.load(), 0);
  if (brc.load() == 0) {
    EXPECT_EQ(cxr_alock_unlock(&b), 0);
  }
  ta.join();
  EXPECT_EQ(arc.load(), 0);
  if (arc.load() == 0) {
    EXPECT_EQ(cxr_alock_unlock(&a2), 0);
  }
  EXPECT_EQ(l->ltail, 0u);
  munmap(l, sizeof *l);
}

TEST(Alock, BadArguments) {
  cxr_alock_ref r = {};
  EXPECT_EQ(cxr_alock_lock(nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_lock(&r, 0), CXR_EINVAL);  // neither local nor remote
  cxr_alock *l = new_lock();
  r.local = l;
  r.slot = CXR_ALOCK_SLOTS;
  EXPECT_EQ(cxr_alock_lock(&r, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_init(nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_init((cxr_alock *)((char *)l + 8), 0), CXR_EINVAL);  // not aligned
  free(l);
}

// Starts a peer, connects to it and writes a fresh lock into its memory: `far` reaches it.
void remote_lock(cxrt::Peer &peer, cxr_rdma *r, cxr_alock_ref *far) {
  ASSERT_TRUE(peer.start());
  cxr_rdma_ep *ep;
  ASSERT_EQ(cxr_rdma_connect(r, peer.addr().c_str(), cxr_now_ns() + 5000 * kMs, &ep), 0);
  cxr_rdma_rkey *rk;
  uint64_t base;
  ASSERT_EQ(cxr_rdma_rkey_get(ep, "mem", &rk, &base, nullptr), 0);
  cxr_alock *img = new_lock();  // the lock's initial words
  ASSERT_NE(img, nullptr);
  uint64_t addr = (base + 16384 + 63) & ~(uint64_t)63;
  int rc = cxr_rdma_put(ep, rk, addr, img, sizeof *img, cxr_now_ns() + 5000 * kMs);
  free(img);
  ASSERT_EQ(rc, 0);
  far->ep = ep;
  far->rk = rk;
  far->addr = addr;
}

TEST(Alock, ASuccessorLinkingLateBehindADeadHeadIsStillHandedTheLock) {
  // A dead head (granted, next 0) whose successor has swapped the tail but links itself
  // late: the slot's next owner must still hand over. A first version of the "still due"
  // check gave the link 10 ms and then dropped the hand-over: the successor waited for good
  // and the new owner timed out behind it (a review of that version).
  cxr_alock *l = shared_lock();
  ASSERT_NE(l, nullptr);
  ASSERT_EQ(lock_unlock(l, 0), 0);  // slot 0's owner words: this process's
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  l->lnodes[0].owner_pid = (uint64_t)dead;  // slot 0: the dead head
  l->lnodes[0].locked = 2;                  // granted, must compete
  l->lnodes[0].next = 0;
  l->lnodes[1].owner_pid = 0;  // slot 1: its successor (an unknown owner counts alive),
  l->lnodes[1].prev = 0;       // which has swapped the tail and not linked itself yet
  l->lnodes[1].next = 0;
  l->lnodes[1].locked = 1;
  l->ltail = 2;
  cxr_alock_ref a2 = pod_ref(l, 0);  // the slot's next owner
  std::atomic<int> arc{1};
  std::thread ta([&] { arc = cxr_alock_lock(&a2, cxr_now_ns() + 5000 * kMs); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the successor, preempted
  __atomic_store_n(&l->lnodes[1].prev, 1, __ATOMIC_RELEASE);   // links itself
  __atomic_store_n(&l->lnodes[0].next, 2, __ATOMIC_RELEASE);
  int64_t end = cxr_now_ns() + 3000 * kMs;
  while (__atomic_load_n(&l->lnodes[1].locked, __ATOMIC_ACQUIRE) == 1 && cxr_now_ns() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_NE(l->lnodes[1].locked, 1u) << "the successor was never handed the lock";
  cxr_alock_ref s1 = pod_ref(l, 1);
  if (l->lnodes[1].locked != 1) {
    EXPECT_EQ(cxr_alock_unlock(&s1), 0);
  }
  ta.join();
  EXPECT_EQ(arc.load(), 0);
  if (arc.load() == 0) {
    EXPECT_EQ(cxr_alock_unlock(&a2), 0);
  }
  munmap(l, sizeof *l);
}

TEST(Alock, AHolderKilledWhilePassingOverAWaiterThatGaveUpStrandsNobody) {
  // The holder d is killed inside its hand-over after marking an abandoned successor a
  // passed and before granting a's successor s: d's node granted with next = a, a passed.
  // s's recovery stopped at a (a live owner, not abandoned) and the slot's next owner saw
  // a passed, not waiting, so nobody granted s: both timed out (a review).
  cxr_alock *l = shared_lock();
  ASSERT_NE(l, nullptr);
  pid_t d = child_locking(l, 0, true);
  ASSERT_GT(d, 0);
  cxr_alock_ref a = pod_ref(l, 1);
  ASSERT_EQ(cxr_alock_lock(&a, cxr_now_ns() + 30 * kMs), CXR_ETIMEDOUT);  // a abandoned
  std::atomic<int> src{1};
  cxr_alock_ref s = pod_ref(l, 2);
  std::thread ts([&] { src = cxr_alock_lock(&s, cxr_now_ns() + 5000 * kMs); });
  ASSERT_TRUE(tail_becomes(l, 3));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(__atomic_load_n(&l->lnodes[0].next, __ATOMIC_ACQUIRE), 2u);
  ASSERT_EQ(__atomic_load_n(&l->lnodes[1].next, __ATOMIC_ACQUIRE), 3u);
  __atomic_store_n(&l->lnodes[1].locked, 4, __ATOMIC_RELEASE);  // d: a passed over ...
  kill_child(d);                                                 // ... and d dies
  cxr_alock_ref a2 = pod_ref(l, 0);  // slot 0's next owner
  std::atomic<int> arc{1};
  std::thread ta([&] { arc = cxr_alock_lock(&a2, cxr_now_ns() + 5000 * kMs); });
  ts.join();
  EXPECT_EQ(src.load(), 0) << "s was never handed the lock: " << cxr_strerror(src.load());
  if (src.load() == 0) {
    EXPECT_EQ(cxr_alock_unlock(&s), 0);
  }
  ta.join();
  EXPECT_EQ(arc.load(), 0) << cxr_strerror(arc.load());
  if (arc.load() == 0) {
    EXPECT_EQ(cxr_alock_unlock(&a2), 0);
  }
  EXPECT_EQ(lock_unlock(l, 1), 0);  // a's slot works again
  EXPECT_EQ(l->ltail, 0u);
  munmap(l, sizeof *l);
}

// A remote ref unlocking twice handed over again from its node's stale next word: here to a
// waiter that had held the lock since and queued again behind the current holder, which
// then entered beside it (a review). The ref now knows it does not hold the lock.
TEST(Alock, ARemoteRefUnlockingTwiceGrantsNoSecondHolder) {
  cxr_rdma *r;
  ASSERT_EQ(cxr_rdma_open(&r, nullptr), 0);
  cxrt::Peer peer;
  cxr_alock_ref a = {};
  ASSERT_NO_FATAL_FAILURE(remote_lock(peer, r, &a));
  cxr_alock_ref b = a, c = a;
  b.slot = 1;
  c.slot = 2;
  EXPECT_EQ(cxr_alock_unlock(&a), CXR_EINVAL);  // never locked
  ASSERT_EQ(cxr_alock_lock(&a, cxr_now_ns() + 5000 * kMs), 0);
  std::atomic<int> brc{1};
  std::thread tb([&] { brc = cxr_alock_lock(&b, cxr_now_ns() + 10000 * kMs); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // b queues behind a
  ASSERT_EQ(cxr_alock_unlock(&a), 0);
  tb.join();
  ASSERT_EQ(brc.load(), 0);
  ASSERT_EQ(cxr_alock_unlock(&b), 0);
  ASSERT_EQ(cxr_alock_lock(&c, cxr_now_ns() + 5000 * kMs), 0);
  brc = 1;
  std::thread tb2([&] { brc = cxr_alock_lock(&b, cxr_now_ns() + 10000 * kMs); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // b queues behind c
  EXPECT_EQ(cxr_alock_unlock(&a), CXR_EINVAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(brc.load(), 1) << "b took the lock while c holds it";
  ASSERT_EQ(cxr_alock_unlock(&c), 0);
  tb2.join();
  EXPECT_EQ(brc.load(), 0);
  EXPECT_EQ(cxr_alock_unlock(&b), 0);
  cxr_rdma_close(r);
}

// A remote step that misses its own 2 s bound (here the first read of a lock wait, its peer
// SIGSTOPped) spends the ref: later calls through it return CXR_ENOTCONN without touching
// the lock, even on another endpoint to another lock, since a timed-out atomic step may
// still apply at the lock later (the endpoint stays open for those) and the participant no
// longer knows where it stands. Setting budget_left back to 0 makes the ref usable again.
// The timed-out step (8 bytes) leaves its endpoint open, and the stopped peer, resumed, gets
// the late request: its reply lands in the op's own memory, not in the step's stack word.
TEST(Alock, ARemoteRefWhoseStepTimedOutIsSpent) {
  cxr_rdma *r;
  ASSERT_EQ(cxr_rdma_open(&r, nullptr), 0);
  cxrt::Peer stopped, fresh;
  cxr_alock_ref far = {};
  ASSERT_NO_FATAL_FAILURE(remote_lock(stopped, r, &far));
  ASSERT_EQ(cxr_alock_lock(&far, cxr_now_ns() + 5000 * kMs), 0);
  ASSERT_EQ(cxr_alock_unlock(&far), 0);
  ASSERT_EQ(kill(stopped.p.pid, SIGSTOP), 0);
  int ws = 0;
  ASSERT_EQ(waitpid(stopped.p.pid, &ws, WUNTRACED), stopped.p.pid);
  EXPECT_EQ(cxr_alock_lock(&far, cxr_now_ns() + 100 * kMs), CXR_ETIMEDOUT);
  cxr_rdma_ep *stopped_ep = far.ep;
  cxr_rdma_rkey *stopped_rk = far.rk;
  uint64_t stopped_addr = far.addr;
  EXPECT_EQ(cxr_rdma_ep_status(stopped_ep), 0) << "a timed-out 8-byte step ended the endpoint";
  ASSERT_EQ(kill(stopped.p.pid, SIGCONT), 0);
  uint64_t spent = far.budget_left;
  ASSERT_NO_FATAL_FAILURE(remote_lock(fresh, r, &far));
  EXPECT_EQ(cxr_alock_lock(&far, cxr_now_ns() + 5000 * kMs), CXR_ENOTCONN);
  EXPECT_EQ(cxr_alock_unlock(&far), CXR_ENOTCONN);
  EXPECT_EQ(far.budget_left, spent);
  far.budget_left = 0;
  EXPECT_EQ(cxr_alock_lock(&far, cxr_now_ns() + 5000 * kMs), 0);
  EXPECT_EQ(cxr_alock_unlock(&far), 0);
  uint64_t w;  // the resumed peer's endpoint still serves
  EXPECT_EQ(cxr_rdma_get(stopped_ep, stopped_rk, stopped_addr, &w, 8, cxr_now_ns() + 5000 * kMs),
            0);
  cxr_rdma_close(r);
}

}  // namespace
