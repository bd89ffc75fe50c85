// The attack suite: every way we know for a sender to get around a seal (or to hurt the
// receiver), tried between real processes in three set-ups:
//   cooperative      - plain process, heap is a named file on /dev/shm (shm's default)
//   enforced         - the sender runs under `cxrpcd run`, same named heap file
//   enforced+memfd   - under cxrpcd, and the heap is a memfd sealed with F_SEAL_FUTURE_WRITE
//                      | F_SEAL_SHRINK once both sides have mapped it
// Each row: the sender seals a page, the receiver checks it (the seal is active), the
// sender attacks and writes a marker through whatever it gained; "closed" means the bytes
// the receiver sees did not change (and reading them did not fault). The verdicts are
// asserted here and tabled in tests/sandbox/README.md; the test prints the table it saw.
#include <gtest/gtest.h>
#include <dirent.h>
#include <errno.h>

#include <atomic>
#include <thread>

#include "tests/sandbox/enforced.h"

using namespace sbx;

namespace {

enum Mode { COOP = 0, ENFORCED = 1, MEMFD = 2 };
const char *const kModeName[] = {"cooperative", "enforced", "enforced+memfd"};

struct Row {
  int kind;
  const char *name;
  bool closed[3];   // expected verdict per mode
  int eperm_from;   // first mode in which the syscall itself is refused with EPERM (-1: none)
};

// Expected verdicts. See README.md for why each is what it is.
const Row kRows[] = {
    {AT_MPROTECT, "mprotect(PROT_WRITE) of the sealed page", {false, true, true}, ENFORCED},
    {AT_PKEY_MPROTECT, "pkey_mprotect(PROT_WRITE, pkey -1)", {false, true, true}, ENFORCED},
    {AT_MMAP_FIXED, "mmap(MAP_FIXED) of the heap file over the page", {false, true, true}, ENFORCED},
    {AT_MREMAP_ALIAS, "mremap(p, 0, n): second mapping, then mprotect", {false, true, true}, ENFORCED},
    {AT_MREMAP_MOVE, "mremap the page out of the window, then mprotect", {false, true, true}, ENFORCED},
    {AT_MUNMAP_REMAP, "munmap, then mmap read-write at the same place", {false, true, true}, ENFORCED},
    {AT_MADV_REMOVE, "madvise(MADV_REMOVE) (punches the shared page)", {false, true, true}, ENFORCED},
    {AT_PROC_MEM, "write through /proc/self/mem", {true, true, true}, -1},
    {AT_FD_MAP_OUTSIDE, "kept fd: shared writable mapping outside the window", {false, true, true}, ENFORCED},
    {AT_FD_MAP_WINDOW, "kept fd: shared writable mapping elsewhere in the window", {false, false, true}, -1},
    {AT_PWRITE, "kept fd: pwrite to the heap file", {false, false, true}, -1},
    {AT_OPEN_PATH, "open the heap file by path, then pwrite", {false, false, true}, -1},
    {AT_PROCESS_VM_WRITEV, "process_vm_writev to itself", {true, true, true}, ENFORCED},
    {AT_PTRACE_CHILD, "ptrace(POKEDATA) from a child", {true, true, true}, ENFORCED},
    {AT_FALLOCATE, "fallocate(PUNCH_HOLE) on the kept fd", {false, false, true}, -1},
    {AT_WRITE_TABLE, "make the seal table writable to fake \"done\"", {true, true, true}, -1},
    {AT_REMAP_FILE_PAGES, "remap_file_pages: writable page onto the sealed offset",
     {false, true, true}, ENFORCED},
    {AT_SHMAT_REMAP, "shmat(SHM_REMAP) of a SysV segment over the page", {true, true, true},
     ENFORCED},
    // Last: the heap stays truncated for the rows after it.
    {AT_FTRUNCATE, "ftruncate the heap file (receiver reads fault)", {false, false, true}, -1},
};
const int kNRows = sizeof kRows / sizeof kRows[0];

struct Result {
  bool closed;
  int rc;
};
Result g_results[3][kNRows];
bool g_ran[3];

class Attack : public ::testing::TestWithParam<int> {
 protected:
  Supervisor sup;
  Heap heap;
  cxr_seal_table *t = nullptr;
  Agent ag;
  int mode() const { return GetParam(); }

  void SetUp() override {
    if (mode() != COOP) {
      ASSERT_TRUE(start_supervisor(&sup));
    }
    ASSERT_TRUE(make_heap(&heap, 256 * 4096, mode() == MEMFD));
    ASSERT_EQ(cxr_seal_table_create(&t, nullptr), 0);
    ASSERT_TRUE(spawn_agent(&ag, heap, t, 1, mode() == COOP ? nullptr : &sup));
    ASSERT_EQ(agent_do(&ag, AG_FLUSH).rc, 0);
    if (mode() == MEMFD) {
      ASSERT_EQ(seal_memfd_heap(&heap), 0);
    }
    ASSERT_EQ(cxr_seal_table_set_peer(t, ag.pid, heap.p(), heap.size), 0);
    if (mode() != COOP) {
      ASSERT_EQ(cxr_seal_table_enforce(t, sup.sock.c_str()), 0);
      EXPECT_TRUE(cxr_seal_table_enforced(t));
    }
  }
  void TearDown() override {
    if (ag.pid > 0) stop_agent(&ag);
    cxr_seal_table_close(t);
    if (heap.fd >= 0) (void)!ftruncate(heap.fd, (off_t)heap.size);  // after the truncation row
    drop_heap(&heap);
    stop_supervisor(&sup);
  }
  unsigned char *page(int i) { return heap.p() + (size_t)(8 + 4 * i) * 4096; }
};

TEST_P(Attack, EveryRowHasTheExpectedVerdict) {
  for (int i = 0; i < kNRows; i++) {
    const Row &r = kRows[i];
    SCOPED_TRACE(r.name);
    unsigned char *p = page(i);
    agent_msg m = agent_do(&ag, AG_SEAL, (uintptr_t)p, 4096);
    ASSERT_EQ(m.rc, 0);
    cxr_seal_id id = m.r;
    ASSERT_EQ(cxr_seal_table_check(t, id, p, 4096), 0);
    ASSERT_EQ(unchanged(p, 4096, 0x11), 1);
    m = agent_do(&ag, AG_ATTACK, (uint64_t)r.kind, (uintptr_t)p, 4096);
    ASSERT_NE(m.rc, -9999) << "the agent died or hung";
    int same = unchanged(p, 4096, 0x11);
    bool closed = same == 1;
    if (r.kind == AT_WRITE_TABLE) closed = m.rc != 0;  // the table stayed read-only
    g_results[mode()][i] = {closed, m.rc};
    EXPECT_EQ(closed, r.closed[mode()]) << kModeName[mode()] << ": attack returned " << m.rc
                                        << ", receiver's bytes " << (same == 1 ? "unchanged"
                                        : same == 0 ? "CHANGED" : "fault on read");
    if (r.eperm_from >= 0 && mode() >= r.eperm_from) {
      EXPECT_EQ(m.rc, -EPERM);
    }
    // The receiver finishes; the sender's release is allowed now (whatever the attack left).
    EXPECT_EQ(cxr_seal_table_done(t, id), 0);
    agent_do(&ag, AG_RELEASE, id);
  }
  g_ran[mode()] = true;
}

INSTANTIATE_TEST_SUITE_P(Modes, Attack, ::testing::Values(COOP, ENFORCED, MEMFD),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return std::string(i.param == COOP ? "Cooperative"
                                              : i.param == ENFORCED ? "Enforced" : "EnforcedMemfd");
                         });

// Enforced mode, step by step.
using Enforced = EnforcedTest;

TEST_F(Enforced, RaisesBeforeDoneAreRefusedAndReleaseAfterIsAllowed) {
  unsigned char *p = heap.p() + 4 * 4096;
  memset(p, 0x33, 2 * 4096);
  agent_msg m = agent_do(&ag, AG_SEAL, (uintptr_t)p, 2 * 4096);
  ASSERT_EQ(m.rc, 0);
  cxr_seal_id id = m.r;
  ASSERT_EQ(cxr_seal_table_check(t, id, p, 2 * 4096), 0);
  for (int k : {AT_MPROTECT, AT_PKEY_MPROTECT, AT_MUNMAP_REMAP, AT_MREMAP_ALIAS, AT_MADV_REMOVE,
                AT_MMAP_FIXED})
    EXPECT_EQ(agent_do(&ag, AG_ATTACK, (uint64_t)k, (uintptr_t)p + 4096, 4096).rc, -EPERM) << k;
  EXPECT_EQ(agent_do(&ag, AG_RELEASE, id).rc, CXR_EPERM);  // the library's own check
  EXPECT_EQ(unchanged(p, 2 * 4096, 0x33), 1);
  ASSERT_EQ(cxr_seal_table_done(t, id), 0);
  EXPECT_EQ(agent_do(&ag, AG_RELEASE, id).rc, 0);  // the supervisor lets this raise through
  EXPECT_EQ(agent_do(&ag, AG_WRITE, (uintptr_t)p).rc, 0);
  EXPECT_EQ(p[0], AGENT_MARK);
  uint64_t allowed = 0, refused = 0;
  ASSERT_TRUE(supervisor_stats(sup, &allowed, &refused));
  EXPECT_EQ(refused, 6u);
  EXPECT_GE(allowed, 1u);
}

TEST_F(Enforced, UnsealingBeforeTheCheckIsCaughtByTheCheck) {
  // No record is active yet, so the supervisor lets the raise through; the receiver's check
  // then asks the kernel and refuses the claim.
  unsigned char *p = heap.p() + 10 * 4096;
  agent_msg m = agent_do(&ag, AG_SEAL, (uintptr_t)p, 4096);
  ASSERT_EQ(m.rc, 0);
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc, 0);
  EXPECT_EQ(cxr_seal_table_check(t, m.r, p, 4096), CXR_ENOTSEALED);
}

TEST_F(Enforced, OnlySupervisedProcessesCanBeRegistered) {
  cxr_seal_table *other = nullptr;
  ASSERT_EQ(cxr_seal_table_create(&other, nullptr), 0);
  ASSERT_EQ(cxr_seal_table_set_peer(other, getpid(), nullptr, 0), 0);  // we are not supervised
  EXPECT_EQ(cxr_seal_table_enforce(other, sup.sock.c_str()), CXR_EPERM);
  EXPECT_FALSE(cxr_seal_table_enforced(other));
  EXPECT_EQ(cxr_seal_table_enforce(other, "/tmp/no-such-cxrpcd.sock"), CXR_ENOTCONN);
  cxr_seal_table_close(other);
}

TEST_F(Enforced, WithoutTheSupervisorRaisesFailClosed) {
  unsigned char *p = heap.p() + 12 * 4096;
  agent_msg m = agent_do(&ag, AG_SEAL, (uintptr_t)p, 4096);
  ASSERT_EQ(m.rc, 0);
  stop_supervisor(&sup);
  // Nobody answers the notification: the kernel fails the call instead of running it.
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc, -ENOSYS);
  EXPECT_EQ(agent_do(&ag, AG_WRITE, (uintptr_t)p).rc, CXR_EBADPTR);
  // Lowering permissions does not need the supervisor.
  EXPECT_EQ(agent_do(&ag, AG_SEAL, (uintptr_t)p + 4096, 4096).rc, 0);
}

TEST_F(Enforced, RegistrationEndsWithTheReceiversTable) {
  unsigned char *p = heap.p() + 14 * 4096;
  agent_msg m = agent_do(&ag, AG_SEAL, (uintptr_t)p, 4096);
  ASSERT_EQ(m.rc, 0);
  ASSERT_EQ(cxr_seal_table_check(t, m.r, p, 4096), 0);
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc, -EPERM);
  // The receiver goes away (its table and registration with it): the seal no longer binds.
  cxr_seal_table_close(t);
  t = nullptr;
  int rc = -EPERM;
  for (int i = 0; i < 200 && rc == -EPERM; i++) {  // the supervisor notices within a poll
    rc = agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc;
    if (rc == -EPERM) usleep(5000);
  }
  EXPECT_EQ(rc, 0);
}

// Registers a table for the agent (cxrpcd takes only a table the agent maps): the reply's
// status, or -9999. *conn stays open (the registration lasts while
// it does).
static int register_table(const Supervisor &sup, int fd, int64_t pid, int *conn) {
  *conn = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
  if (*conn < 0) return -9999;
  cxr__cxrpcd_msg m = {};
  m.magic = CXR__CXRPCD_MAGIC;
  m.type = CXR__MSG_REGISTER;
  m.pid = pid;
  if (cxr__msg_send(*conn, &m, fd) != 0 || cxr__msg_recv(*conn, &m, NULL, 2000000000ll) != 0 ||
      m.type != CXR__MSG_REPLY)
    return -9999;
  return m.status;
}

TEST_F(Enforced, ATableItsOwnerCanShrinkIsRefused) {
  // A valid table in a memfd without F_SEAL_SHRINK: once registered, its owner truncated it
  // and cxrpcd's next walk of it died of SIGBUS (every supervised raise then failed with
  // ENOSYS). cxrpcd refuses the registration and goes on serving the real table.
  cxr__seal_hdr *w = nullptr;
  int fd = fake_table(4, F_SEAL_FUTURE_WRITE, &w);
  ASSERT_GE(fd, 0);
  int conn = -1;
  EXPECT_EQ(register_table(sup, fd, ag.pid, &conn), CXR_ENOTSEALED);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  // A raise outside any seal makes cxrpcd walk every table registered for the agent.
  unsigned char *p = heap.p() + 20 * 4096;
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc, 0);
  // The real table is still enforced.
  agent_msg m = agent_do(&ag, AG_SEAL, (uintptr_t)p + 4096, 4096);
  ASSERT_EQ(m.rc, 0);
  ASSERT_EQ(cxr_seal_table_check(t, m.r, p + 4096, 4096), 0);
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p + 4096, 4096).rc, -EPERM);
  uint64_t allowed = 0, refused = 0;
  EXPECT_TRUE(supervisor_stats(sup, &allowed, &refused));
  EXPECT_EQ(refused, 1u);
  if (conn >= 0) close(conn);
  munmap(w, cxr__seal_bytes(4));
  close(fd);
}

TEST_F(Enforced, ATableWhoseSlotCountGrowsIsWalkedInsideItsMapping) {
  // A sealed table of 4 slots whose owner keeps flipping the header's slot count to the
  // maximum: cxrpcd re-read the count at every step of its walk, so a raise after its check
  // walked it off its mapping (it died, or read other memory as records). Every raise below
  // is outside any seal, so each must be allowed, and cxrpcd must live through them.
  cxr__seal_hdr *w = nullptr;
  int fd = fake_table(4, kTableSeals, &w);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(agent_do(&ag, AG_MAP_TABLE, (uint64_t)getpid(), (uint64_t)fd).rc, 0);  // takes it
  int conn = -1;
  ASSERT_EQ(register_table(sup, fd, ag.pid, &conn), 0);
  std::atomic<bool> stop{false};
  std::thread flip([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      __atomic_store_n(&w->slots, 4u, __ATOMIC_RELAXED);
      for (int j = 0; j < 20; j++) __asm__ volatile("pause");
      __atomic_store_n(&w->slots, CXR_SEAL_SLOTS_MAX, __ATOMIC_RELAXED);
      for (int j = 0; j < 200; j++) __asm__ volatile("pause");
    }
  });
  unsigned char *p = heap.p() + 24 * 4096;
  int bad = 0, rc = 0;
  for (int i = 0; i < 3000 && bad == 0; i++) {
    rc = agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc;
    if (rc != 0) bad = i + 1;
  }
  stop.store(true);
  flip.join();
  EXPECT_EQ(bad, 0) << "raise " << bad << " returned " << rc;
  int st = 0;
  EXPECT_EQ(waitpid(sup.pid, &st, WNOHANG), 0)
      << "cxrpcd died: " << (WIFSIGNALED(st) ? "signal " : "exit ")
      << (WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  if (conn >= 0) close(conn);
  munmap(w, cxr__seal_bytes(4));
  close(fd);
}

// Prints the verdicts this run saw, as the README table's rows.
class PrintTable : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!g_ran[0] && !g_ran[1] && !g_ran[2]) return;
    printf("\n| attack | cooperative | enforced | enforced+memfd |\n|---|---|---|---|\n");
    for (int i = 0; i < kNRows; i++) {
      printf("| %s |", kRows[i].name);
      for (int m = 0; m < 3; m++)
        printf(" %s (%d) |", !g_ran[m] ? "-" : g_results[m][i].closed ? "closed" : "OPEN",
               g_results[m][i].rc);
      printf("\n");
    }
  }
};
::testing::Environment *const g_env = ::testing::AddGlobalTestEnvironment(new PrintTable);

}  // namespace

namespace {

int open_fds(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (readdir(d) != nullptr) n++;
  closedir(d);
  return n;
}

// One STATS request carrying `nfds` descriptors (a request carries at most one).
bool send_stats(int c, int nfds, int flags = 0) {
  cxr__cxrpcd_msg m = {};
  m.magic = CXR__CXRPCD_MAGIC;
  m.type = CXR__MSG_STATS;
  struct iovec iov = {&m, sizeof m};
  union {
    char buf[CMSG_SPACE(4 * sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds > 0) {
    int fds[4] = {0, 1, 2, 0};
    mh.msg_control = u.buf;
    mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(h), fds, nfds * sizeof(int));
  }
  return sendmsg(c, &mh, MSG_NOSIGNAL | flags) == (ssize_t)sizeof m;
}

}  // namespace

TEST(Supervisor, DescriptorsARequestShouldNotCarryAreClosed) {
  // Every descriptor the kernel installs with a request is closed unless kept: two fit the
  // buffer cxrpcd used to receive into, and it closed only the first (one leaked per
  // request, until accept failed at the descriptor limit). Now such a request is refused.
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  int before = open_fds(sup.pid);
  ASSERT_GT(before, 0);
  for (int i = 0; i < 200; i++) {
    int c = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
    ASSERT_GE(c, 0);
    cxr__cxrpcd_msg r;
    if (send_stats(c, 2)) cxr__msg_recv(c, &r, nullptr, 2000000000ll);  // stats, or refused
    close(c);
  }
  // Its last closes handled (polled for up to 5 s: a leak stays at about +200).
  int after = open_fds(sup.pid);
  for (int i = 0; i < 250 && after > before + 2; i++) {
    usleep(20000);
    after = open_fds(sup.pid);
  }
  EXPECT_LE(after, before + 2) << "cxrpcd kept descriptors it was sent";
  uint64_t allowed = 0, refused = 0;
  EXPECT_TRUE(supervisor_stats(sup, &allowed, &refused));
  stop_supervisor(&sup);
}

TEST(Supervisor, AClientThatNeverReadsItsRepliesDoesNotStopTheSupervisor) {
  // cxrpcd answers on one thread; its sends to a client that reads nothing used to block
  // once that socket was full, and with them every supervised process's notified syscall.
  // Now that client is dropped.
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  int c = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
  ASSERT_GE(c, 0);
  int sent = 0;
  int64_t end = cxr_now_ns() + 2000000000;  // requests for 2 s (or until dropped), unread
  while (cxr_now_ns() < end) {
    if (send_stats(c, 0, MSG_DONTWAIT)) {
      sent++;
    } else if (errno == EAGAIN) {
      struct pollfd p = {c, POLLOUT, 0};
      poll(&p, 1, 10);
    } else {
      break;  // dropped
    }
  }
  uint64_t allowed = 0, refused = 0;
  EXPECT_TRUE(supervisor_stats(sup, &allowed, &refused)) << sent << " requests sent, unread";
  close(c);
  stop_supervisor(&sup);
}

TEST(Supervisor, AMessageLongerThanTheProtocolsIsRefused) {
  // A SEQPACKET message is cut to the reader's buffer (MSG_TRUNC): a valid head followed by
  // anything must not pass for a request or reply.
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  struct {
    cxr__cxrpcd_msg m;
    char tail[8];
  } big = {};
  big.m.magic = CXR__CXRPCD_MAGIC;
  big.m.type = CXR__MSG_REPLY;
  ASSERT_EQ(send(sv[0], &big, sizeof big, MSG_NOSIGNAL), (ssize_t)sizeof big);
  cxr__cxrpcd_msg r;
  EXPECT_EQ(cxr__msg_recv(sv[1], &r, nullptr, 1000000000ll), CXR_EPROTO);
  ASSERT_EQ(send(sv[0], &big.m, sizeof big.m, MSG_NOSIGNAL), (ssize_t)sizeof big.m);
  EXPECT_EQ(cxr__msg_recv(sv[1], &r, nullptr, 1000000000ll), 0);  // the exact size passes
  close(sv[0]);
  close(sv[1]);
}
