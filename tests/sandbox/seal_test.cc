// Seals in cooperative mode between two real processes: this test is the receiver, agent.c
// the sender. A shared heap file is mapped at the same window address in both.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/sandbox/harness.h"

using namespace sbx;

namespace {

struct SealTest : ::testing::Test {
  Heap heap;
  cxr_seal_table *t = nullptr;
  Agent ag;
  void start(unsigned batch, bool set_peer = true) {
    ASSERT_TRUE(make_heap(&heap, 1 << 20, false));
    ASSERT_EQ(cxr_seal_table_create(&t, nullptr), 0);
    ASSERT_TRUE(spawn_agent(&ag, heap, t, batch, nullptr));
    ASSERT_EQ(agent_do(&ag, AG_FLUSH).rc, 0);  // the agent is up and mapped
    if (set_peer) {
      ASSERT_EQ(cxr_seal_table_set_peer(t, ag.pid, heap.p(), heap.size), 0);
    }
  }
  void TearDown() override {
    if (ag.pid > 0) stop_agent(&ag);
    cxr_seal_table_close(t);
    drop_heap(&heap);
  }
  cxr_seal_id seal(uintptr_t p, size_t n) {
    agent_msg m = agent_do(&ag, AG_SEAL, p, n);
    EXPECT_EQ(m.rc, 0);
    return m.r;
  }
};

TEST_F(SealTest, WritesFaultAfterSealAndWorkAfterRelease) {
  start(1);
  uintptr_t p = heap.addr + 4096;
  EXPECT_EQ(agent_do(&ag, AG_WRITE, p).rc, 0);  // writable before
  memset(heap.p() + 4096, 0x22, 4096);
  cxr_seal_id id = seal(p, 4096);
  EXPECT_EQ(agent_do(&ag, AG_WRITE, p).rc, CXR_EBADPTR);  // the store faults in the sender
  EXPECT_EQ(agent_do(&ag, AG_WRITE, p + 4095).rc, CXR_EBADPTR);
  EXPECT_EQ(agent_do(&ag, AG_WRITE, p + 4096).rc, 0);  // the next page is not sealed
  ASSERT_EQ(cxr_seal_table_check(t, id, heap.p() + 4096, 100), 0);
  EXPECT_EQ(unchanged(heap.p() + 4096, 4096, 0x22), 1);
  ASSERT_EQ(cxr_seal_table_done(t, id), 0);
  EXPECT_EQ(agent_do(&ag, AG_RELEASE, id).rc, 0);
  EXPECT_EQ(agent_do(&ag, AG_WRITE, p).rc, 0);
  EXPECT_EQ(heap.p()[4096], AGENT_MARK);
}

TEST_F(SealTest, ReleaseBeforeDoneIsRefused) {
  start(1);
  uintptr_t p = heap.addr + 8192;
  cxr_seal_id id = seal(p, 2 * 4096);
  EXPECT_EQ(agent_do(&ag, AG_RELEASE, id).rc, CXR_EAGAIN);  // not even checked yet
  ASSERT_EQ(cxr_seal_table_check(t, id, heap.p() + 8192, 2 * 4096), 0);
  EXPECT_EQ(agent_do(&ag, AG_RELEASE, id).rc, CXR_EPERM);  // active: refused
  EXPECT_EQ(agent_do(&ag, AG_CANCEL, id).rc, CXR_EPERM);   // and no way around it
  EXPECT_EQ(agent_do(&ag, AG_WRITE, p).rc, CXR_EBADPTR);
  ASSERT_EQ(cxr_seal_table_done(t, id), 0);
  EXPECT_EQ(cxr_seal_table_done(t, id), CXR_EINVAL);  // done once
  EXPECT_EQ(agent_do(&ag, AG_RELEASE, id).rc, 0);
  EXPECT_EQ(agent_do(&ag, AG_RELEASE, id).rc, CXR_EINVAL);  // released once
  EXPECT_EQ(agent_do(&ag, AG_WRITE, p + 4096).rc, 0);
}

TEST_F(SealTest, CancelOfUncheckedSealRestoresWrite) {
  start(1);
  uintptr_t p = heap.addr + 3 * 4096;
  cxr_seal_id id = seal(p, 4096);
  EXPECT_EQ(agent_do(&ag, AG_CANCEL, id).rc, 0);
  EXPECT_EQ(agent_do(&ag, AG_WRITE, p).rc, 0);
  // The receiver checking it afterwards finds it no longer sealed.
  EXPECT_EQ(cxr_seal_table_check(t, id, heap.p() + 3 * 4096, 4096), CXR_ENOTSEALED);
}

TEST_F(SealTest, UnsealedArgumentClaimedSealedIsRejected) {
  start(1);
  uintptr_t p = heap.addr + 16 * 4096;
  // A made-up id for pages the sender never sealed.
  cxr_seal_id fake = (1u << 20) | 5;
  EXPECT_EQ(cxr_seal_table_check(t, fake, heap.p() + 16 * 4096, 64), CXR_ENOTSEALED);
  // A real id, but for other pages than the ones claimed.
  cxr_seal_id id = seal(p, 4096);
  EXPECT_EQ(cxr_seal_table_check(t, id, heap.p() + 17 * 4096, 64), CXR_ENOTSEALED);
  // A sealed range that is only partly sealed (the claim runs one page further).
  EXPECT_EQ(cxr_seal_table_check(t, id, heap.p() + 16 * 4096, 4097), CXR_ENOTSEALED);
  // The sender unseals behind the library's back (cooperative mode allows the mprotect):
  // the receiver's check asks the kernel and refuses.
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, p, 4096).rc, 0);
  EXPECT_EQ(cxr_seal_table_check(t, id, heap.p() + 16 * 4096, 64), CXR_ENOTSEALED);
  cxr_seal_stats st;
  ASSERT_EQ(cxr_seal_table_stats(t, &st), 0);
  EXPECT_EQ(st.not_sealed, 4u);
  // Garbage ids from a hostile sender.
  EXPECT_EQ(cxr_seal_table_check(t, ~0u, heap.p(), 64), CXR_ENOTSEALED);
  EXPECT_EQ(cxr_seal_table_check(t, 3, heap.p(), 64), CXR_ENOTSEALED);  // generation 0
}

TEST_F(SealTest, CheckRefusesOutsideTheHeapAndDoubleClaims) {
  start(1);
  uintptr_t p = heap.addr + 20 * 4096;
  cxr_seal_id id = seal(p, 4096);
  EXPECT_EQ(cxr_seal_table_check(t, id, heap.p() + heap.size, 10), CXR_EBADPTR);
  EXPECT_EQ(cxr_seal_table_check(t, id, heap.p() - 4096, 10), CXR_EBADPTR);
  EXPECT_EQ(cxr_seal_table_check(t, id, (void *)UINTPTR_MAX, 10), CXR_EBADPTR);
  ASSERT_EQ(cxr_seal_table_check(t, id, heap.p() + 20 * 4096, 10), 0);
  EXPECT_EQ(cxr_seal_table_check(t, id, heap.p() + 20 * 4096, 10), CXR_EBUSY);
  EXPECT_EQ(cxr_seal_table_done(t, id), 0);
  EXPECT_EQ(agent_do(&ag, AG_RELEASE, id).rc, 0);
}

TEST_F(SealTest, SettingThePeerWhileAnotherThreadChecksIsSafe) {
  // One thread sets the peer again and again (each time a new maps descriptor, the old one
  // closed) while this one checks seals: every check verifies with a descriptor that stays
  // open (before, a check could read one being closed, or its number reused: errors, and a
  // data race under TSan).
  start(1);
  std::atomic<bool> stop{false};
  std::atomic<int> sets{0};
  std::thread setter([&] {
    while (!stop.load()) {
      if (cxr_seal_table_set_peer(t, ag.pid, heap.p(), heap.size) == 0) sets.fetch_add(1);
    }
  });
  // At least 200 checks, and on until the setter has run 20 times among them (a loaded
  // machine may not schedule it for the first ones), bounded.
  for (int i = 0; i < 200 || (sets.load() < 20 && i < 100000); i++) {
    size_t off = (size_t)(30 + i % 8) * 4096;
    cxr_seal_id id = seal(heap.addr + off, 4096);
    ASSERT_EQ(cxr_seal_table_check(t, id, heap.p() + off, 4096), 0) << i;
    ASSERT_EQ(cxr_seal_table_done(t, id), 0);
    ASSERT_EQ(agent_do(&ag, AG_RELEASE, id).rc, 0);
  }
  stop.store(true);
  setter.join();
  EXPECT_GT(sets.load(), 0);
}

TEST_F(SealTest, OverlappingSealsAreRefused) {
  start(1);
  uintptr_t p = heap.addr + 24 * 4096;
  seal(p, 2 * 4096);
  EXPECT_EQ(agent_do(&ag, AG_SEAL, p + 4096, 4096).rc, CXR_EBUSY);
  EXPECT_EQ(agent_do(&ag, AG_SEAL, p + 1, 4096).rc, CXR_EINVAL);  // not page-aligned
}

TEST_F(SealTest, BatchedReleaseSweepsOnceAtTheThreshold) {
  start(16);
  uintptr_t base = heap.addr + 64 * 4096;
  std::vector<cxr_seal_id> ids;
  for (int i = 0; i < 16; i++) {
    ids.push_back(seal(base + i * 4096, 4096));
    ASSERT_EQ(cxr_seal_table_check(t, ids[i], (void *)(base + i * 4096), 4096), 0);
    ASSERT_EQ(cxr_seal_table_done(t, ids[i]), 0);
  }
  for (int i = 0; i < 15; i++) ASSERT_EQ(agent_do(&ag, AG_RELEASE, ids[i]).rc, 0);
  // Released but not swept: still read-only.
  EXPECT_EQ(agent_do(&ag, AG_WRITE, base).rc, CXR_EBADPTR);
  EXPECT_EQ(agent_do(&ag, AG_WRITE, base + 14 * 4096).rc, CXR_EBADPTR);
  ASSERT_EQ(agent_do(&ag, AG_RELEASE, ids[15]).rc, 0);  // the 16th: one sweep
  for (int i = 0; i < 16; i++) EXPECT_EQ(agent_do(&ag, AG_WRITE, base + i * 4096).rc, 0);
  // Re-sealing a page whose release is pending sweeps first, then seals.
  cxr_seal_id a = seal(base, 4096);
  ASSERT_EQ(cxr_seal_table_check(t, a, (void *)base, 1), 0);
  ASSERT_EQ(cxr_seal_table_done(t, a), 0);
  ASSERT_EQ(agent_do(&ag, AG_RELEASE, a).rc, 0);
  cxr_seal_id b = seal(base, 4096);
  EXPECT_EQ(cxr_seal_table_check(t, b, (void *)base, 1), 0);
  EXPECT_EQ(agent_do(&ag, AG_WRITE, base).rc, CXR_EBADPTR);
}

TEST_F(SealTest, WithoutPeerTheCheckCannotVerify) {
  start(1, false);
  uintptr_t p = heap.addr + 30 * 4096;
  cxr_seal_id id = seal(p, 4096);
  EXPECT_EQ(cxr_seal_table_check(t, id, heap.p() + 30 * 4096, 1), 0);  // trusted claim
  EXPECT_EQ(cxr_seal_table_done(t, id), 0);
}

TEST_F(SealTest, TheSenderCannotWriteTheTable) {
  start(1);
  agent_msg m = agent_do(&ag, AG_ATTACK, AT_WRITE_TABLE, 0, 0);
  EXPECT_EQ(m.rc, -EACCES);   // mprotect: the memfd is sealed against writable views
  EXPECT_EQ(m.r, (uint64_t)EPERM);  // and a fresh writable mapping is refused too
}

// A receiver's table of `slots` slots and a sender attached to it that releases at once.
void table_pair(unsigned slots, cxr_seal_table **rx, cxr_seal_table **tx) {
  cxr_seal_opts o;
  cxr_seal_opts_init(&o);
  o.slots = slots;
  o.release_batch = 1;
  ASSERT_EQ(cxr_seal_table_create(rx, &o), 0);
  ASSERT_EQ(cxr_seal_table_attach(tx, cxr_seal_table_fd(*rx), &o), 0);
}

TEST(SealApi, ArgumentsAreValidated) {
  cxr_seal_table *t = nullptr;
  cxr_seal_opts o;
  cxr_seal_opts_init(&o);
  EXPECT_EQ(o.slots, 1024u);
  EXPECT_EQ(o.release_batch, 1024u);
  EXPECT_EQ(cxr_seal_table_create(nullptr, nullptr), CXR_EINVAL);
  o.slots = 0;
  EXPECT_EQ(cxr_seal_table_create(&t, &o), CXR_EINVAL);
  ASSERT_EQ(cxr_seal_table_create(&t, nullptr), 0);
  cxr_seal_id id;
  EXPECT_EQ(cxr_seal_table_seal(t, (void *)4096, 4096, &id), CXR_EINVAL);  // receiver handle
  EXPECT_EQ(cxr_seal_table_check(t, 0, nullptr, 1), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_set_peer(t, -1, nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_set_peer(t, getpid(), (void *)1, 4096), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_enforce(t, "/nonexistent/cxrpcd.sock"), CXR_EINVAL);  // no peer yet
  cxr_seal_table *s = nullptr;
  EXPECT_EQ(cxr_seal_table_attach(&s, -1, nullptr), CXR_EINVAL);
  int junk = memfd_create("junk", 0);
  ASSERT_EQ(ftruncate(junk, 8192), 0);
  EXPECT_EQ(cxr_seal_table_attach(&s, junk, nullptr), CXR_EBADMAGIC);
  close(junk);
  ASSERT_EQ(cxr_seal_table_attach(&s, cxr_seal_table_fd(t), nullptr), 0);
  EXPECT_EQ(cxr_seal_table_seal(s, nullptr, 4096, &id), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_release(s, 12345), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_done(s, 0), CXR_EINVAL);  // sender handle
  cxr_seal_table_close(s);
  cxr_seal_table_close(t);
  cxr_seal_table_close(nullptr);
}

TEST(SealApi, SlotsRunOut) {
  cxr_seal_table *t = nullptr, *s = nullptr;
  ASSERT_NO_FATAL_FAILURE(table_pair(4, &t, &s));
  void *m = mmap(nullptr, 8 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  cxr_seal_id ids[5];
  for (int i = 0; i < 4; i++) ASSERT_EQ(cxr_seal_table_seal(s, (char *)m + i * 4096, 1, &ids[i]), 0);
  EXPECT_EQ(cxr_seal_table_seal(s, (char *)m + 4 * 4096, 1, &ids[4]), CXR_EFULL);
  EXPECT_EQ(cxr_seal_table_cancel(s, ids[0]), 0);
  EXPECT_EQ(cxr_seal_table_seal(s, (char *)m + 4 * 4096, 1, &ids[4]), 0);
  EXPECT_NE(ids[4], ids[0]);  // a new generation on the reused slot
  // A seal whose pages the sender unmapped: cancelling it frees its slot (nothing is left to
  // make writable; it used to fail with CXR_ENOMEM and hold the slot for good).
  void *gone = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ASSERT_EQ(cxr_seal_table_cancel(s, ids[1]), 0);
  cxr_seal_id g;
  ASSERT_EQ(cxr_seal_table_seal(s, gone, 1, &g), 0);
  munmap(gone, 4096);
  EXPECT_EQ(cxr_seal_table_cancel(s, g), 0);
  ASSERT_EQ(cxr_seal_table_seal(s, (char *)m + 1 * 4096, 1, &ids[1]), 0);  // slot back
  cxr_range r;
  ASSERT_EQ(cxr_seal_table_range(s, ids[4], &r), 0);
  EXPECT_EQ(r.p, (char *)m + 4 * 4096);
  EXPECT_EQ(r.len, 4096u);
  cxr_seal_table_peer_dead(s);  // the receiver is gone: everything may be released
  for (int i = 1; i < 5; i++) EXPECT_EQ(cxr_seal_table_release(s, ids[i]), 0);
  ((volatile char *)m)[0] = 1;
  ((volatile char *)m)[4 * 4096] = 1;
  cxr_seal_table_close(s);
  cxr_seal_table_close(t);
  munmap(m, 8 * 4096);
}

TEST(SealApi, AttachNeedsTheSealsThatPinTheSize) {
  // A valid header in a memfd its maker can still shrink: after the attach, an ftruncate
  // would make every read of the table fault (SIGBUS) in the sender. Refused unless the file
  // carries every seal cxr_seal_table_create sets (attach used to accept it: 0).
  for (unsigned seals : {0u, (unsigned)F_SEAL_FUTURE_WRITE,
                         (unsigned)(F_SEAL_FUTURE_WRITE | F_SEAL_GROW | F_SEAL_SEAL),
                         kTableSeals & ~(unsigned)F_SEAL_GROW}) {
    SCOPED_TRACE(seals);
    cxr__seal_hdr *w = nullptr;
    int fd = fake_table(4, seals, &w);
    ASSERT_GE(fd, 0);
    cxr_seal_table *s = nullptr;
    EXPECT_EQ(cxr_seal_table_attach(&s, fd, nullptr), CXR_ENOTSEALED);
    EXPECT_EQ(s, nullptr);
    cxr_seal_table_close(s);
    munmap(w, cxr__seal_bytes(4));
    close(fd);
  }
  // The same table with every seal is accepted.
  cxr__seal_hdr *w = nullptr;
  int fd = fake_table(4, kTableSeals, &w);
  ASSERT_GE(fd, 0);
  cxr_seal_table *s = nullptr;
  EXPECT_EQ(cxr_seal_table_attach(&s, fd, nullptr), 0);
  cxr_seal_table_close(s);
  munmap(w, cxr__seal_bytes(4));
  close(fd);
}

// The table's maker flips its header's slot count between 4 (what the file holds) and the
// maximum while a reader in another process works on the table; the reader must stay inside
// its mapping (followed here by a guard page) and inside the 4 slots. Returns the reader's
// wait status (0: it exited 0), or -1. `reader` runs in the child for about a second.
template <typename F>
int race_slots(cxr__seal_hdr *w, F reader) {
  pid_t c = fork();
  if (c < 0) return -1;
  if (c == 0) _exit(reader());
  int st = 0;
  int64_t t0 = cxr_now_ns();
  for (;;) {
    for (int k = 0; k < 1000; k++) {
      __atomic_store_n(&w->slots, 4u, __ATOMIC_RELAXED);
      for (int j = 0; j < 20; j++) __asm__ volatile("pause");
      __atomic_store_n(&w->slots, CXR_SEAL_SLOTS_MAX, __ATOMIC_RELAXED);
      for (int j = 0; j < 200; j++) __asm__ volatile("pause");
    }
    pid_t r = waitpid(c, &st, WNOHANG);
    if (r == c) break;
    if (r < 0 || cxr_now_ns() - t0 > 60000000000ll) {  // bounded: 60 s
      kill(c, SIGKILL);
      waitpid(c, &st, 0);
      return -1;
    }
  }
  __atomic_store_n(&w->slots, 4u, __ATOMIC_RELAXED);
  return st;
}

TEST(SealApi, ThePolicyReadsTheSlotCountOnce) {
  // cxrpcd's decision walks a registered table with cxr__seal_overlaps_active. It checked the
  // header, then re-read the slot count at every step: a raise in between walked it off its
  // mapping (the child died of SIGSEGV on the guard page).
  cxr__seal_hdr *w = nullptr;
  int fd = fake_table(4, kTableSeals, &w);
  ASSERT_GE(fd, 0);
  size_t bytes = cxr__seal_bytes(4);
  char *area = (char *)mmap(nullptr, bytes + 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(area, MAP_FAILED);
  ASSERT_EQ(mmap(area, bytes, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0), (void *)area);
  int st = race_slots(w, [&] {
    int64_t t0 = cxr_now_ns();
    while (cxr_now_ns() - t0 < 1000000000ll)
      if (cxr__seal_overlaps_active(area, bytes, 0, UINT64_MAX)) return 2;  // nothing active
    return 0;
  });
  EXPECT_EQ(st, 0) << (WIFSIGNALED(st) ? "reader killed by signal " : "reader exit ")
                   << (WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  munmap(area, bytes + 4096);
  munmap(w, bytes);
  close(fd);
}

TEST(SealApi, AttachReadsTheSlotCountOnce) {
  // attach checked the header, then read the slot count again for its own bookkeeping: a
  // raise in between gave the sender more slots than the mapping holds (a fifth seal was
  // accepted, and its record lay past the mapping).
  cxr__seal_hdr *w = nullptr;
  int fd = fake_table(4, kTableSeals, &w);
  ASSERT_GE(fd, 0);
  int st = race_slots(w, [&] {
    char *pg = (char *)mmap(nullptr, 5 * 4096, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pg == MAP_FAILED) return 3;
    int64_t t0 = cxr_now_ns();
    while (cxr_now_ns() - t0 < 1000000000ll) {
      cxr_seal_table *s = nullptr;
      int rc = cxr_seal_table_attach(&s, fd, nullptr);
      if (rc == CXR_ECORRUPT) continue;  // saw the raised count: refused, fine
      if (rc != 0) return 4;
      cxr_seal_id id[5];
      for (int k = 0; k < 4; k++)
        if (cxr_seal_table_seal(s, pg + k * 4096, 4096, &id[k]) != 0) return 5;
      if (cxr_seal_table_seal(s, pg + 4 * 4096, 4096, &id[4]) != CXR_EFULL) return 6;
      for (int k = 0; k < 4; k++) cxr_seal_table_cancel(s, id[k]);
      cxr_seal_table_close(s);
    }
    return 0;
  });
  EXPECT_EQ(st, 0) << (WIFSIGNALED(st) ? "reader killed by signal " : "reader exit ")
                   << (WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  munmap(w, cxr__seal_bytes(4));
  close(fd);
}

}  // namespace

// A receiver and a sender table in this process, over a heap of ours (the check asks the
// kernel about our own pages).
struct SealOneProcess : ::testing::Test {
  Heap heap;
  cxr_seal_table *rx = nullptr, *tx = nullptr;
  unsigned char *p = nullptr;
  void SetUp() override {
    ASSERT_TRUE(make_heap(&heap, 16 * 4096, false));
    ASSERT_NO_FATAL_FAILURE(table_pair(16, &rx, &tx));
    ASSERT_EQ(cxr_seal_table_set_peer(rx, getpid(), heap.p(), heap.size), 0);
    p = heap.p() + 4 * 4096;
  }
  void TearDown() override {
    cxr_seal_table_close(tx);
    cxr_seal_table_close(rx);
    drop_heap(&heap);
  }
  static int store(void *q) {
    *(volatile unsigned char *)q = 1;
    return 0;
  }
  bool writable() { return cxr_sandbox_run(store, p) == 0; }
};

TEST_F(SealOneProcess, ALateCheckOfAnEarlierSealOfTheSlotHoldsTheSlotsSeal) {
  cxr_seal_id id1, id2;
  ASSERT_EQ(cxr_seal_table_seal(tx, p, 4096, &id1), 0);
  ASSERT_EQ(cxr_seal_table_cancel(tx, id1), 0);  // the call ended before the receiver saw it
  ASSERT_EQ(cxr_seal_table_seal(tx, p, 4096, &id2), 0);  // the next call: same slot, gen + 1
  ASSERT_EQ(id1 & 0xfffff, id2 & 0xfffff);
  ASSERT_NE(id1, id2);
  // The first call's descriptor arrives late: its pages are sealed (by the second seal), so
  // the receiver cannot tell, and relies on them until done.
  ASSERT_EQ(cxr_seal_table_check(rx, id1, p, 4096), 0);
  EXPECT_EQ(cxr_seal_table_release(tx, id2), CXR_EPERM);
  EXPECT_EQ(cxr_seal_table_cancel(tx, id2), CXR_EPERM);
  EXPECT_FALSE(writable());
  EXPECT_EQ(cxr_seal_table_check(rx, id2, p, 4096), CXR_EBUSY);  // the slot is taken
  ASSERT_EQ(cxr_seal_table_done(rx, id1), 0);
  EXPECT_EQ(cxr_seal_table_release(tx, id2), CXR_EAGAIN);  // never checked as itself
  EXPECT_EQ(cxr_seal_table_cancel(tx, id2), 0);
  EXPECT_TRUE(writable());
}

TEST_F(SealOneProcess, AnIdNeverComesBackToTheLastOneCheckedOnItsSlot) {
  cxr_seal_id done_id, id;
  ASSERT_EQ(cxr_seal_table_seal(tx, p, 4096, &done_id), 0);
  ASSERT_EQ(cxr_seal_table_check(rx, done_id, p, 4096), 0);
  ASSERT_EQ(cxr_seal_table_done(rx, done_id), 0);
  ASSERT_EQ(cxr_seal_table_release(tx, done_id), 0);
  // Calls that never reach the receiver, on the same slot, twice round the 12-bit
  // generations: none may be taken for the one it marked done.
  int same = 0, released = 0;
  for (int i = 0; i < 2 * 4096; i++) {
    ASSERT_EQ(cxr_seal_table_seal(tx, p, 4096, &id), 0);
    ASSERT_EQ(id & 0xfffff, done_id & 0xfffff);
    same += id == done_id;
    int rc = cxr_seal_table_release(tx, id);
    released += rc == 0;
    if (rc != 0) {
      ASSERT_EQ(cxr_seal_table_cancel(tx, id), 0);
    }
  }
  EXPECT_EQ(same, 0);
  EXPECT_EQ(released, 0) << "a seal the receiver never checked was released";
}

TEST(SandboxWindow, AWindowCxrInitRefusesIsNotTakenButWarnedAbout) {
  // The sandbox had its own twin of shm's window parser: it took a page-aligned window that
  // cxr_init refuses (2 MiB alignment), so the launcher allowed one window and the program
  // used another; junk fell back to the default without a word. One parser now
  // (cxr__parse_window): such a window gives the default and a warning.
  const char *was = getenv("CXRPC_WINDOW");
  std::string saved = was ? was : "";
  setenv("CXRPC_WINDOW", "0x600000001000-0x700000000000", 1);
  uintptr_t base = 0;
  size_t size = 0;
  int level = cxr_log_level();
  cxr_log_set_level(CXR_LOG_WARN);
  testing::internal::CaptureStderr();
  EXPECT_EQ(cxr__sbx_window(&base, &size), 0);
  std::string err = testing::internal::GetCapturedStderr();
  cxr_log_set_level(level);
  EXPECT_EQ(base, 0x600000000000u);
  EXPECT_EQ(size, 0x100000000000u);
  EXPECT_NE(err.find("CXRPC_WINDOW=0x600000001000-0x700000000000:"), std::string::npos) << err;
  setenv("CXRPC_WINDOW", "0x650000000000-0x700000000000", 1);
  EXPECT_EQ(cxr__sbx_window(&base, &size), 0);
  EXPECT_EQ(base, 0x650000000000u);
  EXPECT_EQ(size, 0xb0000000000u);
  if (was) setenv("CXRPC_WINDOW", saved.c_str(), 1);
  else unsetenv("CXRPC_WINDOW");
}
