// cxrpcd's own defences, against processes that talk to its socket directly: what it takes
// as a supervised process's listener, who may register a table for whom, how long a client
// may hold a place, and who owns the socket path. A real cxrpcd process each time.
#include <gtest/gtest.h>
#include <errno.h>
#include <linux/kcmp.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/un.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/sandbox/cxrpcd_client.h"
#include "tests/sandbox/enforced.h"

using namespace sbx;


TEST(CxrpcdAttach, ADescriptorThatIsNoSeccompListenerIsRefused) {
  // A process without any filter sent ATTACH with a memfd: accepted, it then counted as
  // supervised (a server registered its tables and accepted its sealed calls, while it
  // could mprotect the sealed pages at will), and cxrpcd span on the memfd (always
  // readable, every receive ENOTTY).
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  EXPECT_EQ(register_for(sup, getpid()), CXR_EPERM);
  int fd = memfd_create("not-a-listener", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(attach(sup, getpid(), fd), CXR_EINVAL);
  close(fd);
  EXPECT_EQ(register_for(sup, getpid()), CXR_EPERM);
  EXPECT_TRUE(stats_answer(sup));
  stop_supervisor(&sup);
}

TEST(CxrpcdAttach, AnUnfilteredProcessCannotAttachItsChildsListener) {
  // A real listener proves a filter, not that the sender is under it: a child installs the
  // enforcement filter and hands its listener to us (no filter); we must not count as
  // supervised.
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(sv[0]);
    int nfd = filter_self();
    cxr__cxrpcd_msg m = {};
    m.magic = CXR__CXRPCD_MAGIC;
    m.type = CXR__MSG_REPLY;
    m.status = nfd < 0 ? nfd : 0;
    cxr__msg_send(sv[1], &m, nfd);
    char b;
    (void)!read(sv[1], &b, 1);  // until the parent is done
    _exit(0);
  }
  close(sv[1]);
  cxr__cxrpcd_msg m = {};
  int nfd = -1;
  ASSERT_EQ(cxr__msg_recv(sv[0], &m, &nfd, 10000000000ll), 0);
  ASSERT_EQ(m.status, 0);
  ASSERT_GE(nfd, 0);
  EXPECT_EQ(attach(sup, getpid(), nfd), CXR_EPERM);
  EXPECT_EQ(register_for(sup, getpid()), CXR_EPERM);
  close(nfd);
  close(sv[0]);
  int st;
  waitpid(child, &st, 0);
  stop_supervisor(&sup);
}

TEST(CxrpcdAttach, AListenerItsSenderAlsoReadsDoesNotStopTheSupervisor) {
  // The receive blocks while no notification is pending. A process that attaches its own
  // listener and keeps reading a copy takes notifications cxrpcd was woken for, and cxrpcd
  // waited in the receive for good (no client served, no other process decided). Now the
  // wait is cut short and that process is dropped.
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  int done[2];
  ASSERT_EQ(pipe2(done, O_CLOEXEC), 0);
  int nfd = -1;
  pid_t child = fork_attached(sup, &nfd);
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(done[0]);
    // Our own reader, answering what it takes (so the raisers go on).
    std::thread reader([nfd] {
      struct seccomp_notif req;
      struct seccomp_notif_resp resp;
      for (;;) {
        memset(&req, 0, sizeof req);
        if (ioctl(nfd, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) continue;
        memset(&resp, 0, sizeof resp);
        resp.id = req.id;
        resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        ioctl(nfd, SECCOMP_IOCTL_NOTIF_SEND, &resp);
      }
    });
    reader.detach();
    // Raises in the window (on nothing mapped: ENOMEM once let through), from 4 threads.
    uintptr_t wbase;
    size_t wsize;
    cxr__sbx_window(&wbase, &wsize);
    void *p = (void *)(wbase + wsize / 2 + 0x123000);
    std::vector<std::thread> raisers;
    for (int k = 0; k < 4; k++)
      raisers.emplace_back([p] {
        for (int i = 0; i < 3000; i++) mprotect(p, 4096, PROT_READ | PROT_WRITE);
      });
    for (auto &r : raisers) r.join();
    (void)!write(done[1], "x", 1);
    pause();  // alive, holding the listener, making no more syscalls
    _exit(0);
  }
  close(done[1]);
  struct pollfd p = {done[0], POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 20000), 1) << "the raisers took over 20 s";
  // cxrpcd answers within 2 s (it was left waiting in a receive, answering no one).
  EXPECT_TRUE(stats_answer(sup));
  kill(child, SIGKILL);
  int st;
  waitpid(child, &st, 0);
  close(done[0]);
  stop_supervisor(&sup);
}

TEST(CxrpcdAttach, ProcessesSharingAListenerAttachItOnce) {
  // A filtered process's children inherit its listener, and each attached it under its own
  // pid: one notification made every such entry readable, one receive took it and each of
  // the others waited out the receive's 50 ms timer. With 40 children cxrpcd answered no
  // one (no client, no other supervised process) for about 2 s per notification. Now a
  // listener already attached is refused (CXR_EBUSY) while its process lives.
  if (syscall(SYS_kcmp, getpid(), getpid(), KCMP_FILE, 0, 0) < 0)
    GTEST_SKIP() << "no kcmp here (" << strerror(errno) << "): cxrpcd cannot tell listeners apart";
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  const int N = 40;
  int ready[2], go[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  pid_t c = fork();
  ASSERT_GE(c, 0);
  if (c == 0) {
    int nfd = filter_self();
    if (nfd < 0) _exit(3);
    for (int i = 0; i < N; i++) {
      if (fork() != 0) continue;
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // gone with c
      int rc = attach(sup, getpid(), nfd);
      char r = rc == 0 ? 'a' : rc == CXR_EBUSY ? 'b' : 'e';
      (void)!write(ready[1], &r, 1);
      pause();
      _exit(0);
    }
    uintptr_t wbase;
    size_t wsize;
    cxr__sbx_window(&wbase, &wsize);
    char b;
    while (read(go[0], &b, 1) == 1) {
      // Notified (nothing is mapped there: ENOMEM once let through).
      mprotect((void *)(wbase + wsize / 2 + 0x123000), 4096, PROT_READ | PROT_WRITE);
      (void)!write(ready[1], "m", 1);
    }
    _exit(0);
  }
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < N; i++) {
    char r = 0;
    ASSERT_EQ(read(ready[0], &r, 1), 1);
    counts[r == 'a' ? 0 : r == 'b' ? 1 : 2]++;
  }
  EXPECT_EQ(counts[0], 1);
  EXPECT_EQ(counts[1], N - 1);
  for (int round = 0; round < 3; round++) {
    ASSERT_EQ(write(go[1], "g", 1), 1);
    char m;
    ASSERT_EQ(read(ready[0], &m, 1), 1);
    ASSERT_EQ(m, 'm');
    int64_t t0 = cxr_now_ns();
    EXPECT_TRUE(stats_answer(sup));
    EXPECT_LT(cxr_now_ns() - t0, 300000000ll) << "cxrpcd stalled after one notification";
  }
  kill(c, SIGKILL);
  waitpid(c, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  close(go[0]);
  close(go[1]);
  stop_supervisor(&sup);
}

TEST(CxrpcdRegister, RegistrationsAreBoundedPerPidAndPerRegistrant) {
  // One process registered one table of its own for itself 1024 times on one connection:
  // the global table was full and every other server's registration refused (CXR_EFULL).
  // Now the same table is registered once per pid (CXR_EEXIST), a pid is named by at most
  // 64 registrations of one registrant uid and a registrant uid holds at most 256 (at whole
  // tables: a low descriptor limit cuts them).
  if (!can_give_whole_tables()) GTEST_SKIP() << "cannot give cxrpcd " << kWholeTables << " fds";
  Supervisor sup;
  ASSERT_TRUE(start_limited(&sup, kWholeTables, kWholeTables));
  const int K = 5;
  int go[2], out[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  pid_t kids[K];
  for (int k = 0; k < K; k++) {
    kids[k] = registering_child(sup, 70, 1024, go[0], out[1]);
    ASSERT_GE(kids[k], 0);
  }
  RegReport rep[K];
  for (int k = 0; k < K; k++)  // one after the other: who is refused is then known
    ASSERT_TRUE(next_report(go[1], out[0], &rep[k])) << "child " << k << " did not report";
  for (int k = 0; k < K - 1; k++) {
    EXPECT_EQ(rep[k].accepted, 64) << "child " << k;
    EXPECT_EQ(rep[k].dup, CXR_EEXIST) << "child " << k;
    EXPECT_EQ(rep[k].refused, CXR_EFULL) << "child " << k;
  }
  EXPECT_EQ(rep[K - 1].accepted, 0) << "the uid's 257th registration was taken";
  EXPECT_EQ(rep[K - 1].refused, CXR_EFULL);
  // Its registrations gone with it, one child's place is free for another.
  kill(rep[0].pid, SIGKILL);
  waitpid(rep[0].pid, nullptr, 0);
  int64_t end = cxr_now_ns() + 2000000000ll;
  int rc = -1;
  while ((rc = register_for(sup, rep[K - 1].pid)) != CXR_EPERM && cxr_now_ns() < end)
    usleep(10000);
  EXPECT_EQ(rc, CXR_EPERM);  // past the bound: the table is not the child's (it does not map it)
  EXPECT_TRUE(stats_answer(sup));
  for (int k = 0; k < K; k++) {
    if (kids[k] == rep[0].pid) continue;
    kill(kids[k], SIGKILL);
    waitpid(kids[k], nullptr, 0);
  }
  for (int fd : {go[0], go[1], out[0], out[1]}) close(fd);
  stop_supervisor(&sup);
}

TEST(CxrpcdRegister, AConnectionWhoseRegistrationsEndedHoldsNoPlace) {
  // A connection that registered once was marked for good as holding a registration: it was
  // never closed for idling and never given up for its uid's new ones, though the process it
  // registered for had ended. A uid whose connections all did so had its every new
  // connection closed at once. Here the uid's share is 3 (cxrpcd at 144 descriptors): three
  // connections register for one process, which exits, and a fourth is still served.
  Supervisor sup;
  ASSERT_TRUE(start_limited(&sup, 144, 144));
  const int K = 3;
  std::vector<int> tables;
  std::vector<cxr__seal_hdr *> views(K);
  for (int i = 0; i < K; i++) {
    tables.push_back(fake_table(4, kTableSeals, &views[i]));
    ASSERT_GE(tables[i], 0);
  }
  Puppet p;
  ASSERT_TRUE(spawn_puppet(sup, 0, tables, &p));
  ASSERT_EQ(puppet_do(&p, 'm'), 0);
  int conns[K];
  for (int i = 0; i < K; i++) {
    conns[i] = cxr__cxrpcd_connect(sup.sock.c_str(), 2000000000ll);
    ASSERT_GE(conns[i], 0);
    ASSERT_EQ(register_on(conns[i], p.pid, tables[i]), 0) << i;
  }
  end_puppet(&p);
  EXPECT_TRUE(stats_answer(sup)) << "a new connection was closed for three that hold nothing";
  struct pollfd pf = {conns[0], POLLIN, 0};  // the oldest, given up for it
  EXPECT_EQ(poll(&pf, 1, 2000), 1);
  for (int i = 0; i < K; i++) {
    close(conns[i]);
    munmap(views[i], cxr__seal_bytes(4));
    close(tables[i]);
  }
  stop_supervisor(&sup);
}

TEST(CxrpcdRegister, ARegistrationOfAnExitedProcessGoesWithoutARequest) {
  // A registration whose process had exited was dropped only when a request asked
  // (a REGISTER, a notification for its pid, a connection of a uid at its bound): until then
  // cxrpcd kept its mapping of the table, its pidfd and its registrant's place. Now its
  // pidfd is in cxrpcd's poll: here the process exits and, with no request sent, cxrpcd
  // unmaps the table and closes the registrant's connection (idle once it holds nothing).
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  cxr__seal_hdr *w = nullptr;
  int table = fake_table(4, kTableSeals, &w);
  ASSERT_GE(table, 0);
  Puppet p;
  ASSERT_TRUE(spawn_puppet(sup, 0, table, &p));
  ASSERT_EQ(puppet_do(&p, 'm'), 0);
  int conn = -1;
  ASSERT_EQ(request(sup, CXR__MSG_REGISTER, p.pid, 0, 0, table, &conn), 0);
  ASSERT_EQ(mappings_of(sup.pid, table), 1);
  end_puppet(&p);
  int left = -1;  // bounded: 10 s (it goes within the loop's next pass)
  for (int i = 0; i < 1000 && (left = mappings_of(sup.pid, table)) != 0; i++) usleep(10000);
  EXPECT_EQ(left, 0) << "cxrpcd still maps the table of a process that exited";
  struct pollfd pf = {conn, POLLIN, 0};  // closed 1 s after its request, once it holds none
  EXPECT_EQ(poll(&pf, 1, 5000), 1) << "the registrant's connection still holds its place";
  close(conn);
  munmap(w, cxr__seal_bytes(4));
  close(table);
  stop_supervisor(&sup);
}

TEST(CxrpcdRegister, APidsTablesAreBoundedSoADecisionStaysCheap) {
  // A process registered its own largest table (2^20 records) 128 times for itself: each
  // of its raises then walked 2^27 records (~150 ms) while cxrpcd answered no one. Now a
  // pid's tables hold at most 2^21 records per registering user (2^23 in all).
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  int go[2], out[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  pid_t kid = registering_child(sup, 4, CXR_SEAL_SLOTS_MAX, go[0], out[1]);
  ASSERT_GE(kid, 0);
  RegReport rep;
  ASSERT_TRUE(next_report(go[1], out[0], &rep)) << "the child did not report";
  EXPECT_EQ(rep.accepted, 2);
  EXPECT_EQ(rep.refused, CXR_EFULL);
  // The time is printed, not asserted: tests never fail on timing (a few ms alone; 158 ms
  // was seen with other suites running on 2 CPUs). The bound above is what keeps it cheap.
  printf("one decision over 2^21 records: %.2f ms\n", rep.decide_ns / 1e6);
  kill(kid, SIGKILL);
  waitpid(kid, nullptr, 0);
  for (int fd : {go[0], go[1], out[0], out[1]}) close(fd);
  stop_supervisor(&sup);
}

namespace {

// The CPU time process pid has used (utime + stime, in clock ticks), or -1.
long long cpu_ticks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t p = all.rfind(')');
  if (p == std::string::npos) return -1;
  std::istringstream in(all.substr(p + 2));  // from field 3 on
  std::string skip;
  for (int k = 3; k < 14; k++) in >> skip;
  long long ut = 0, st = 0;
  return in >> ut >> st ? ut + st : -1;
}

}  // namespace

TEST(CxrpcdLimits, TheSoftFdLimitIsRaisedToTheHardOne) {
  // Full tables need about 3100 descriptors and the soft limit is often 1024: past it,
  // /proc opens and pidfd_open failed and attaches and registrations were refused.
  struct rlimit ours;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &ours), 0);
  rlim_t hard = ours.rlim_max < 4096 ? ours.rlim_max : 4096;  // we may not raise it
  if (hard <= 64) GTEST_SKIP() << "a hard fd limit of " << hard;
  Supervisor sup;
  ASSERT_TRUE(start_limited(&sup, 64, hard));
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/limits", (int)sup.pid);
  FILE *f = fopen(path, "re");
  ASSERT_NE(f, nullptr);
  long long soft = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "Max open files", 14)) soft = strtoll(line + 14, NULL, 10);
  fclose(f);
  EXPECT_EQ(soft, (long long)hard);
  stop_supervisor(&sup);
}

TEST(CxrpcdLimits, ConnectionsPastTheFdLimitDoNotSpinTheSupervisor) {
  // At its fd limit accept4 failed (EMFILE) with the connection still queued, so the
  // listening socket stayed readable and the loop span until clients went. Now the tables
  // fit the limit, and after EMFILE the socket is left alone for 100 ms.
  Supervisor sup;
  ASSERT_TRUE(start_limited(&sup, 128, 128));
  std::vector<int> conns;
  struct sockaddr_un a = {};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sup.sock.c_str());
  // More than the limit, for 500 ms at most: a full backlog refuses (EAGAIN) and we retry.
  int64_t end = cxr_now_ns() + 500000000ll;
  while (conns.size() < 180 && cxr_now_ns() < end) {
    int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(c, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) == 0) {
      conns.push_back(c);
    } else {
      close(c);
      usleep(1000);
    }
  }
  usleep(50000);
  long long t0 = cpu_ticks(sup.pid);
  usleep(500000);  // within the 1 s clients have: none has gone yet
  long long used = cpu_ticks(sup.pid) - t0;
  long hz = sysconf(_SC_CLK_TCK);
  EXPECT_LT(used * 1000 / hz, 150) << "cxrpcd used " << used * 1000 / hz << " ms of CPU in 500"
                                    << " (" << conns.size() << " connections)";
  for (int c : conns) close(c);
  int64_t t1 = cxr_now_ns();
  EXPECT_TRUE(stats_answer(sup));
  EXPECT_LT(cxr_now_ns() - t1, 2000000000ll);
  stop_supervisor(&sup);
}

using CxrpcdEnforced = EnforcedTest;

TEST_F(CxrpcdEnforced, IdleConnectionsDoNotLockOthersOut) {
  // 256 clients filled cxrpcd's table for good if they never sent anything: every later
  // connection was closed at once, so `cxrpcd run` and enforcing servers were refused. Now
  // a connection has 1 s to send, and a user at its bound gives up its own oldest idle one.
  std::vector<int> idle;
  for (int i = 0; i < 300; i++) {
    int c = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
    ASSERT_GE(c, 0);
    idle.push_back(c);
  }
  usleep(100000);  // all accepted
  int64_t t0 = cxr_now_ns();
  EXPECT_TRUE(stats_answer(sup));
  EXPECT_LT(cxr_now_ns() - t0, 1500000000ll);
  // The registration made before, whose connection sends nothing more, still holds.
  EXPECT_EQ(raise_over_active_seal(4), -EPERM);
  // Within about a second every idle connection is closed by cxrpcd.
  int open = 0;
  int64_t end = cxr_now_ns() + 3000000000ll;  // one bound for all of them
  for (int c : idle) {
    int64_t left = end - cxr_now_ns();
    struct pollfd p = {c, POLLIN, 0};
    if (poll(&p, 1, left > 0 ? (int)(left / 1000000) : 0) != 1) open++;
    close(c);
  }
  EXPECT_EQ(open, 0);
  EXPECT_EQ(raise_over_active_seal(5), -EPERM);
}

TEST_F(CxrpcdEnforced, OnlyATableTheSenderTookIsRegisteredForIt) {
  // Anyone who could reach the socket registered a table of its own for any supervised
  // pid, and cxrpcd then refused that process's raises and unmaps wherever the table said:
  // here a record being written (claimed, no length yet), which holds the whole window.
  // Now the named process must map the table (a sender maps its server's table before it
  // seals anything).
  cxr__seal_hdr *w = nullptr;
  int fd = window_holding_table(&w);
  ASSERT_GE(fd, 0);
  int conn = -1;
  EXPECT_EQ(request(sup, CXR__MSG_REGISTER, ag.pid, 0, 0, fd, &conn), CXR_EPERM);
  unsigned char *p = heap.p() + 8 * 4096;  // no seal there
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc, 0);
  close(conn);  // (a registration would have lasted until now)
  // Once the sender took it, the same table is registered and counts.
  ASSERT_EQ(agent_do(&ag, AG_MAP_TABLE, (uint64_t)getpid(), (uint64_t)fd).rc, 0);
  EXPECT_EQ(request(sup, CXR__MSG_REGISTER, ag.pid, 0, 0, fd, &conn), 0);
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p + 4096, 4096).rc, -EPERM);
  close(conn);
  munmap(w, cxr__seal_bytes(4));
  close(fd);
}

TEST_F(CxrpcdEnforced, ASecondSupervisorDoesNotTakeTheSocket) {
  // A second `cxrpcd serve` on the same path unlinked the first's socket and served there:
  // the first kept its supervised processes, whose later registrations reached the second
  // and were refused (CXR_EPERM: not its own). Now it refuses to start.
  int err = -1;
  pid_t second = serve_at(sup.sock, &err);
  ASSERT_GT(second, 0);
  EXPECT_EQ(exit_within_5s(second), 1) << "the second cxrpcd did not refuse to start";
  char msg[256] = {};
  (void)!read(err, msg, sizeof msg - 1);
  close(err);
  EXPECT_NE(strstr(msg, "another cxrpcd"), nullptr) << msg;
  // The agent's next registration still reaches the supervisor that supervises it.
  cxr_seal_table *t2 = nullptr;
  ASSERT_EQ(cxr_seal_table_create(&t2, nullptr), 0);
  ASSERT_EQ(agent_do(&ag, AG_MAP_TABLE, (uint64_t)getpid(), (uint64_t)cxr_seal_table_fd(t2)).rc,
            0);
  ASSERT_EQ(cxr_seal_table_set_peer(t2, ag.pid, heap.p(), heap.size), 0);
  EXPECT_EQ(cxr_seal_table_enforce(t2, sup.sock.c_str()), 0);
  cxr_seal_table_close(t2);
}

namespace {

// A socket bound at <dir>/sock in a fresh dir.
struct BoundSocket {
  char dir[24] = "/tmp/cxrpcd-test-XXXXXX";
  std::string path;
  struct sockaddr_un a = {};
  int fd = -1;
};

bool bind_fresh(BoundSocket *b) {
  if (mkdtemp(b->dir) == nullptr) return false;
  b->path = std::string(b->dir) + "/sock";
  b->a.sun_family = AF_UNIX;
  snprintf(b->a.sun_path, sizeof b->a.sun_path, "%s", b->path.c_str());
  b->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  return b->fd >= 0 && bind(b->fd, (struct sockaddr *)&b->a, sizeof b->a) == 0;
}

}  // namespace

TEST(CxrpcdSocket, ConnectsToAFullQueueGiveUp) {
  // A cxrpcd with a full client table accepts no one and its queue fills; clients (and a
  // second `cxrpcd serve` checking the path) connected with no bound and waited for good.
  // Here a socket that never accepts, its queue full.
  BoundSocket b;
  ASSERT_TRUE(bind_fresh(&b));
  ASSERT_EQ(listen(b.fd, 0), 0);
  const std::string &path = b.path;
  struct sockaddr_un &a = b.a;
  std::vector<int> queued;
  for (int i = 0; i < 16; i++) {
    int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(c, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) != 0) {
      close(c);
      break;
    }
    queued.push_back(c);
  }
  ASSERT_LT(queued.size(), 16u) << "the queue did not fill";
  // A client, in a child (if it hung, we could not stop it): its answer as its status.
  pid_t kid = fork();
  ASSERT_GE(kid, 0);
  if (kid == 0) _exit(-cxr__cxrpcd_connect(path.c_str(), 300000000ll));
  int64_t t0 = cxr_now_ns();
  int rc = exit_within_5s(kid);
  EXPECT_EQ(rc, -CXR_ETIMEDOUT) << "the client's connect did not give up";
  EXPECT_LT(cxr_now_ns() - t0, 2000000000ll);
  // `cxrpcd serve` takes a full queue for a live cxrpcd's and does not start.
  int err = -1;
  pid_t second = serve_at(path, &err);
  ASSERT_GT(second, 0);
  EXPECT_EQ(exit_within_5s(second), 1) << "cxrpcd serve hung or replaced the socket";
  close(err);
  for (int c : queued) close(c);
  close(b.fd);
  unlink(path.c_str());
  rmdir(b.dir);
}

TEST(CxrpcdSocket, AStaleSocketIsReplaced) {
  // A socket no one listens on (its cxrpcd died) is unlinked and taken.
  BoundSocket b;
  ASSERT_TRUE(bind_fresh(&b));
  close(b.fd);  // left behind, as by a cxrpcd that died
  const std::string &path = b.path;
  int err = -1;
  Supervisor sup;
  sup.sock = path;
  sup.pid = serve_at(path, &err);
  ASSERT_GT(sup.pid, 0);
  close(err);
  int c = cxr__cxrpcd_connect(path.c_str(), 5000000000ll);
  EXPECT_GE(c, 0);
  if (c >= 0) close(c);
  EXPECT_TRUE(stats_answer(sup));
  stop_supervisor(&sup);  // and the directory
}

TEST(CxrpcdDecisions, AReusedThreadIdIsDecidedForItsNewProcess) {
  // cxrpcd cached which process a thread id belongs to and never let go: once the thread
  // exited, a new process given that id (after pid wrap) was decided with the old
  // process's tables, and its raise over its own active seal went through. Here the new
  // process gets the id at once: ns_last_pid (root in the test's pid namespace).
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  // A supervised process (no tables) whose second thread makes a decided syscall and exits.
  int tp[2];
  ASSERT_EQ(pipe2(tp, O_CLOEXEC), 0);
  int nfd = -1;
  pid_t first = fork_attached(sup, &nfd);
  ASSERT_GE(first, 0);
  if (first == 0) {
    close(nfd);
    uintptr_t wbase;
    size_t wsize;
    cxr__sbx_window(&wbase, &wsize);
    pid_t tid = 0;
    std::thread th([&] {
      tid = (pid_t)syscall(SYS_gettid);
      mprotect((void *)(wbase + wsize / 2 + 0x123000), 4096, PROT_READ | PROT_WRITE);
    });
    th.join();
    (void)!write(tp[1], &tid, sizeof tid);
    pause();
    _exit(0);
  }
  close(tp[1]);
  pid_t tid = 0;
  struct pollfd pp = {tp[0], POLLIN, 0};
  ASSERT_EQ(poll(&pp, 1, 10000), 1);
  ASSERT_EQ(read(tp[0], &tid, sizeof tid), (ssize_t)sizeof tid);
  close(tp[0]);
  ASSERT_GT(tid, 0);
  ASSERT_NE(tid, first);
  // The next process forked gets that id, once the thread's id is free (a join returns a
  // moment before the kernel lets go of it).
  std::string tdir = "/proc/" + std::to_string(tid);
  for (int i = 0; i < 200 && access(tdir.c_str(), F_OK) == 0; i++) usleep(10000);
  Heap heap;
  ASSERT_TRUE(make_heap(&heap, 64 * 4096, false));
  cxr_seal_table *t = nullptr;
  ASSERT_EQ(cxr_seal_table_create(&t, nullptr), 0);
  Agent ag;
  bool set = false;
  pid_t got = -1;
  for (int attempt = 0; attempt < 10 && got != tid; attempt++) {  // the id may free late
    if (ag.pid > 0) stop_agent(&ag);
    usleep(attempt * 50000);
    set = give_next_pid(tid);
    if (!set) break;
    ASSERT_TRUE(spawn_agent(&ag, heap, t, 1, &sup));
    got = ag.pid;
  }
  if (!set || ag.pid != tid) {
    if (ag.pid > 0) stop_agent(&ag);
    cxr_seal_table_close(t);
    drop_heap(&heap);
    kill(first, SIGKILL);
    waitpid(first, nullptr, 0);
    stop_supervisor(&sup);
    GTEST_SKIP() << "cannot give the next process id " << tid << " (ns_last_pid: "
                 << (set ? "written" : strerror(errno)) << ", got " << got << ")";
  }
  ASSERT_EQ(agent_do(&ag, AG_FLUSH).rc, 0);
  ASSERT_EQ(cxr_seal_table_set_peer(t, ag.pid, heap.p(), heap.size), 0);
  ASSERT_EQ(cxr_seal_table_enforce(t, sup.sock.c_str()), 0);
  unsigned char *p = heap.p() + 4 * 4096;
  agent_msg m = agent_do(&ag, AG_SEAL, (uintptr_t)p, 4096);
  ASSERT_EQ(m.rc, 0);
  ASSERT_EQ(cxr_seal_table_check(t, m.r, p, 4096), 0);
  EXPECT_EQ(agent_do(&ag, AG_ATTACK, AT_MPROTECT, (uintptr_t)p, 4096).rc, -EPERM);
  EXPECT_EQ(unchanged(p, 4096, 0x11), 1);
  cxr_seal_table_done(t, m.r);
  stop_agent(&ag);
  cxr_seal_table_close(t);
  drop_heap(&heap);
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  stop_supervisor(&sup);
}
