// cxrpcd with several users: every other suite runs as root alone. cxrpcd serves every user
// of the machine (the pod root is 01777), bounds each uid's places (SO_PEERCRED) so that one
// cannot lock the others out, and must keep each user's processes out of the others' reach.
// The children here become other users: nobody, and two uids no account has. Bazel's
// sandbox maps no uid but root (setuid fails there), so this suite runs unsandboxed; where
// it cannot change uid it skips.
#include <gtest/gtest.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <string>
#include <vector>

#include "tests/sandbox/cxrpcd_client.h"

using namespace sbx;

namespace {

const uid_t kUidA = 65534, kUidB = 61017, kUidC = 61018;

// As the pod root is: every user reaches the socket's directory.
bool open_dir(const Supervisor &sup) {
  return chmod(sup.sock.substr(0, sup.sock.rfind('/')).c_str(), 01777) == 0;
}

// Runs fn(out) in a child that became uid's, then waits to be killed: the child's pid.
template <class F>
pid_t as_user(uid_t uid, int out, F fn) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (!become(uid)) _exit(100);
  // Not left behind by a failed assertion: set after the uid change, which clears it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(101);
  fn(out);
  pause();
  _exit(0);
}

void end(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// Whether a child of ours can become another user (not under Bazel's sandbox).
bool can_change_uid() {
  pid_t k = fork();
  if (k == 0) _exit(become(kUidA) ? 0 : 1);
  int st = 1;
  return k > 0 && waitpid(k, &st, 0) == k && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// A cxrpcd every user reaches, and a pipe the children report on (io[1]).
class CxrpcdUsers : public ::testing::Test {
 protected:
  Supervisor sup;
  int io[2] = {-1, -1};
  void SetUp() override {
    if (!can_change_uid()) GTEST_SKIP() << "cannot become uid " << kUidA << " here";
    ASSERT_EQ(pipe2(io, O_CLOEXEC), 0);
  }
  void TearDown() override {
    stop_supervisor(&sup);
    for (int fd : io)
      if (fd >= 0) close(fd);
  }
  // At fd_limit descriptors if given (cxrpcd's tables then small), else as it starts.
  bool serve(rlim_t fd_limit = 0) {
    bool up = fd_limit ? start_limited(&sup, fd_limit, fd_limit) : start_supervisor(&sup);
    return up && open_dir(sup);
  }
};

}  // namespace

TEST_F(CxrpcdUsers, AnotherUserReachesTheSocketAndIsSupervised) {
  // cxrpcd bound its socket under its umask (0755 for root's 022): only its own uid could
  // connect (EACCES for everyone else), so no other user could run a program under it, ask
  // its stats or register a table, and the per-uid bounds served no one.
  ASSERT_TRUE(serve());
  Puppet p;
  ASSERT_TRUE(spawn_puppet(sup, kUidA, -1, &p));
  EXPECT_EQ(puppet_do(&p, 'r'), -ENOMEM) << "a process of uid " << kUidA << " is not supervised";
  pid_t b = as_user(kUidB, io[1], [&](int out) {
    uint64_t a = 0, r = 0;
    put_int(out, supervisor_stats(sup, &a, &r) ? 1 : 0);
  });
  int answered = 0;
  ASSERT_TRUE(read_ints(io[0], &answered, 1));
  EXPECT_EQ(answered, 1) << "uid " << kUidB << " got no stats";
  end(b);
  end_puppet(&p);
}

TEST_F(CxrpcdUsers, OneUserAtItsProcessBoundLeavesPlacesToAnother) {
  // At a limit of 144 descriptors cxrpcd's tables are small (a uid's share a few places):
  // one uid attaches until refused, and another still attaches.
  ASSERT_TRUE(serve(144));
  auto attaching = [&](int out) {
    int nfd = filter_self();
    put_int(out, nfd < 0 ? nfd : attach(sup, getpid(), nfd));
  };
  std::vector<pid_t> kids;
  int rc = 0, taken = 0;
  while (rc == 0 && kids.size() < 40) {  // the whole table is under 40
    kids.push_back(as_user(kUidA, io[1], attaching));
    ASSERT_TRUE(read_ints(io[0], &rc, 1));
    taken += rc == 0;
  }
  EXPECT_GE(taken, 1);
  EXPECT_EQ(rc, CXR_EFULL) << "uid " << kUidA << " attached " << taken << " processes";
  kids.push_back(as_user(kUidB, io[1], attaching));
  ASSERT_TRUE(read_ints(io[0], &rc, 1));
  EXPECT_EQ(rc, 0) << "uid " << kUidB << " was refused while only uid " << kUidA << " was full";
  for (pid_t k : kids) end(k);
}

TEST_F(CxrpcdUsers, OneUsersConnectionsDoNotCloseAnothers) {
  // A uid at its client bound gives up its own oldest connection that sent nothing: here
  // another uid's connection, opened before and idle, must stay and be answered.
  ASSERT_TRUE(serve(144));
  int go[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  pid_t b = as_user(kUidB, io[1], [&](int out) {
    int c = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
    int64_t connected = cxr_now_ns();
    put_int(out, c >= 0);
    char x;
    if (read(go[0], &x, 1) != 1) return;
    // cxrpcd closes a connection idle for 1 s: past 900 ms (a loaded machine) the answer
    // says nothing about uid A (2: not judged).
    if (cxr_now_ns() - connected > 900000000) {
      put_int(out, 2);
      return;
    }
    cxr__cxrpcd_msg m = {};
    m.magic = CXR__CXRPCD_MAGIC;
    m.type = CXR__MSG_STATS;
    put_int(out, c >= 0 && cxr__msg_send(c, &m, -1) == 0 &&
                     cxr__msg_recv(c, &m, NULL, 2000000000ll) == 0);
  });
  int v[3] = {0, 0, 0};
  ASSERT_TRUE(read_ints(io[0], v, 1));
  ASSERT_EQ(v[0], 1) << "uid " << kUidB << " could not connect";
  usleep(20000);  // accepted before the others
  pid_t a = as_user(kUidA, io[1], [&](int out) {
    std::vector<int> conns;
    for (int i = 0; i < 40; i++) conns.push_back(cxr__cxrpcd_connect(sup.sock.c_str(), 0));
    // Answered once every connection before it was accepted (in order): by then the
    // first was given up for the later ones.
    put_int(out, stats_answer(sup));
    struct pollfd p = {conns[0], POLLIN, 0};
    put_int(out, conns[0] >= 0 && poll(&p, 1, 0) == 1 && (p.revents & POLLHUP));
  });
  ASSERT_TRUE(read_ints(io[0], v + 1, 2));
  EXPECT_EQ(v[1], 1) << "uid " << kUidA << " got no answer";
  EXPECT_EQ(v[2], 1) << "uid " << kUidA << "'s oldest connection was kept past its bound";
  ASSERT_EQ(write(go[1], "g", 1), 1);
  ASSERT_TRUE(read_ints(io[0], v, 1));
  end(a);
  end(b);
  close(go[0]);
  close(go[1]);
  if (v[0] == 2) GTEST_SKIP() << "uid " << kUidB << "'s connection idled near cxrpcd's 1 s";
  EXPECT_EQ(v[0], 1) << "uid " << kUidB << "'s connection was closed for uid " << kUidA << "'s";
}

TEST_F(CxrpcdUsers, OneUserAtItsRegistrationBoundLeavesPlacesToAnother) {
  // A registrant uid holds at most 256 registrations: four of its processes register 64
  // tables each (a pid's bound), a fifth is refused, and another uid's process still
  // registers one. (At whole tables: a low descriptor limit cuts them.)
  if (!can_give_whole_tables()) GTEST_SKIP() << "cannot give cxrpcd " << kWholeTables << " fds";
  ASSERT_TRUE(serve(kWholeTables));
  const int K = 6;  // four of uid A, the refused fifth, then uid B's
  int go[K][2];
  int *out = io;
  pid_t kids[K];
  for (int k = 0; k < K; k++) {
    ASSERT_EQ(pipe2(go[k], O_CLOEXEC), 0);
    kids[k] = registering_child(sup, k < 4 ? 64 : 1, 16, go[k][0], out[1], k < 5 ? kUidA : kUidB);
    ASSERT_GE(kids[k], 0);
  }
  RegReport rep[K];
  for (int k = 0; k < K; k++)  // one after the other
    ASSERT_TRUE(next_report(go[k][1], out[0], &rep[k])) << "child " << k << " did not report";
  for (int k = 0; k < 4; k++) EXPECT_EQ(rep[k].accepted, 64) << "child " << k;
  EXPECT_EQ(rep[4].accepted, 0) << "uid " << kUidA << "'s 257th registration was taken";
  EXPECT_EQ(rep[4].refused, CXR_EFULL);
  EXPECT_EQ(rep[5].accepted, 1) << "uid " << kUidB << " was refused: " << rep[5].refused;
  for (int k = 0; k < K; k++) {
    end(kids[k]);
    close(go[k][0]);
    close(go[k][1]);
  }
}

TEST_F(CxrpcdUsers, AnotherUserCannotAttachOrRegisterForAProcess) {
  // What the protocol offers (ATTACH, REGISTER, STATS), tried by uid B on uid A's
  // supervised process: attaching in its name, registering a table it never took, and
  // taking (through /proc) the table its server gave it. Each refused, and the process is
  // decided as before.
  ASSERT_TRUE(serve());
  cxr__seal_hdr *w = nullptr;
  int given = window_holding_table(&w);  // what A's server gives A
  ASSERT_GE(given, 0);
  Puppet p;
  ASSERT_TRUE(spawn_puppet(sup, kUidA, given, &p));
  ASSERT_EQ(puppet_do(&p, 'r'), -ENOMEM);
  ASSERT_EQ(puppet_do(&p, 'm'), 0);
  pid_t victim = p.pid;
  pid_t b = as_user(kUidB, io[1], [&](int out) {
    cxr__seal_hdr *mine = nullptr;
    int fd = window_holding_table(&mine);  // before the filter: no one reads its listener
    int nfd = filter_self();               // under a filter, with a listener of its own
    put_int(out, nfd < 0 ? nfd : attach(sup, victim, nfd));
    put_int(out, fd < 0 ? fd : request(sup, CXR__MSG_REGISTER, victim, 0, 0, fd));
    std::string path = "/proc/" + std::to_string(victim) + "/map_files";
    int dfd = open(("/proc/" + std::to_string(victim) + "/fd").c_str(), O_RDONLY | O_DIRECTORY);
    put_int(out, dfd >= 0 ? 0 : -errno);
    put_int(out, access(path.c_str(), R_OK) == 0 ? 0 : -errno);
  });
  int v[4];
  ASSERT_TRUE(read_ints(io[0], v, 4));
  EXPECT_EQ(v[0], CXR_EPERM) << "uid " << kUidB << " attached in the name of uid " << kUidA;
  EXPECT_EQ(v[1], CXR_EPERM) << "uid " << kUidB << " registered a table for uid " << kUidA;
  EXPECT_EQ(v[2], -EACCES) << "uid " << kUidB << " opened uid " << kUidA << "'s descriptors";
  EXPECT_EQ(v[3], -EACCES) << "uid " << kUidB << " reached uid " << kUidA << "'s mappings";
  EXPECT_EQ(puppet_do(&p, 'r'), -ENOMEM) << "uid " << kUidB << "'s requests counted";
  // A's server registers the table A took, and it counts.
  int conn = -1;
  EXPECT_EQ(request(sup, CXR__MSG_REGISTER, victim, 0, 0, given, &conn), 0);
  EXPECT_EQ(puppet_do(&p, 'r'), -EPERM);
  close(conn);
  end(b);
  end_puppet(&p);
  munmap(w, cxr__seal_bytes(4));
  close(given);
}

TEST_F(CxrpcdUsers, ATableRegisteredFirstByAnotherUserLastsWhileItsServerHoldsIt) {
  // A table registered for a pid was refused (CXR_EEXIST) to every later registrant: uid B,
  // who got hold of the table A's server gave A, registered it for A's process first, and
  // A's server was refused (rpc then refuses its sealed calls) while the process's
  // protection lasted only as long as B's connection. Now each registrant holds the table
  // for that process, and the registration lasts until the last of them drops it.
  ASSERT_TRUE(serve());
  cxr__seal_hdr *w = nullptr;
  int given = window_holding_table(&w);  // what A's server gives A: every raise refused
  ASSERT_GE(given, 0);
  Puppet p;
  ASSERT_TRUE(spawn_puppet(sup, kUidA, given, &p));
  ASSERT_EQ(puppet_do(&p, 'm'), 0);
  ASSERT_EQ(puppet_do(&p, 'r'), -ENOMEM);
  pid_t victim = p.pid;
  pid_t b = as_user(kUidB, io[1], [&](int out) {  // keeps its connection open until killed
    int c = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
    put_int(out, c < 0 ? c : register_on(c, victim, given));
  });
  int rc = -1;
  ASSERT_TRUE(read_ints(io[0], &rc, 1));
  ASSERT_EQ(rc, 0) << "uid " << kUidB << " could not register the table";
  int conn = -1;  // A's server (root here) registers the same table
  EXPECT_EQ(request(sup, CXR__MSG_REGISTER, victim, 0, 0, given, &conn), 0);
  end(b);  // B's connection closed (its process is gone once end returns)
  // cxrpcd has read B's hangup before it accepts a later connection (clients first).
  ASSERT_TRUE(stats_answer(sup));
  EXPECT_EQ(puppet_do(&p, 'r'), -EPERM) << "A's registration ended with uid " << kUidB
                                        << "'s connection";
  close(conn);  // the last registrant: the table no longer counts
  ASSERT_TRUE(stats_answer(sup));
  EXPECT_EQ(puppet_do(&p, 'r'), -ENOMEM);
  end_puppet(&p);
  munmap(w, cxr__seal_bytes(4));
  close(given);
}

TEST_F(CxrpcdUsers, ARegistrationEndsWithTheProcessItNames) {
  // A registration named a pid and lasted while its registrant's connection did: once the
  // process exited, the next process given its pid (of any user) was decided with the old
  // process's server's tables (here one that holds the whole window: every raise refused)
  // and its pid's places were taken. Here uid B registers for uid A's process, which
  // exits, and uid C's process is given its pid at once (ns_last_pid).
  ASSERT_TRUE(serve());
  cxr__seal_hdr *w = nullptr;
  int given = window_holding_table(&w);
  ASSERT_GE(given, 0);
  Puppet p;
  ASSERT_TRUE(spawn_puppet(sup, kUidA, given, &p));
  ASSERT_EQ(puppet_do(&p, 'm'), 0);
  pid_t old = p.pid;
  pid_t b = as_user(kUidB, io[1], [&](int out) {  // keeps its connection open
    int c = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
    put_int(out, c < 0 ? c : register_on(c, old, given));
  });
  int rc = -1;
  ASSERT_TRUE(read_ints(io[0], &rc, 1));
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(puppet_do(&p, 'r'), -EPERM);
  end_puppet(&p);
  std::string dir = "/proc/" + std::to_string(old);
  for (int i = 0; i < 200 && access(dir.c_str(), F_OK) == 0; i++) usleep(10000);
  Puppet q;
  for (int attempt = 0; attempt < 10 && q.pid != old; attempt++) {  // the pid may free late
    if (q.pid > 0) end_puppet(&q);
    usleep(attempt * 50000);
    if (!give_next_pid(old)) break;
    ASSERT_TRUE(spawn_puppet(sup, kUidC, -1, &q));
  }
  bool reused = q.pid == old;
  if (reused) {
    EXPECT_EQ(puppet_do(&q, 'r'), -ENOMEM) << "uid " << kUidC << "'s process was decided with "
                                           << "the table uid " << kUidB << " registered for "
                                           << "uid " << kUidA << "'s";
  }
  if (q.pid > 0) end_puppet(&q);
  end(b);
  munmap(w, cxr__seal_bytes(4));
  close(given);
  if (!reused) GTEST_SKIP() << "cannot give the next process pid " << old;
}

namespace {

// A folder of /tmp given to uid (mode 0755), as a pod root its first user made is: the path
// of a socket in it ("" if it could not be made).
std::string dir_of(uid_t uid) {
  char dir[] = "/tmp/cxrpcd-own-XXXXXX";
  if (mkdtemp(dir) == NULL) return "";
  if (chown(dir, uid, (gid_t)uid) != 0 || chmod(dir, 0755) != 0) {
    rmdir(dir);
    return "";
  }
  return std::string(dir) + "/s";
}

void remove_dir_of(const std::string &sock) {
  unlink(sock.c_str());
  rmdir(sock.substr(0, sock.rfind('/')).c_str());
}

// What the owner of the socket's folder can do: unlink cxrpcd's socket and listen there
// itself, answering every request "done" (REPLY, status 0). For each request it reports on
// out whether a descriptor came with it (1) or not (0); first a -1 once it listens.
void fake_cxrpcd(const std::string &sock, int out) {
  struct sockaddr_un a = {};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sock.c_str());
  int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  unlink(sock.c_str());
  if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 8) != 0) _exit(1);
  chmod(sock.c_str(), 0666);
  put_int(out, -1);
  for (int i = 0; i < 8; i++) {  // bounded; the test kills it
    int c = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    cxr__cxrpcd_msg m = {};
    int fd = -1;
    if (cxr__msg_recv(c, &m, &fd, 5000000000ll) == 0) {
      put_int(out, fd >= 0 ? 1 : 0);
      m = {};
      m.magic = CXR__CXRPCD_MAGIC;
      m.type = CXR__MSG_REPLY;
      m.status = 0;
      cxr__msg_send(c, &m, -1);
    }
    if (fd >= 0) close(fd);
    close(c);
  }
}

// Whether a report is waiting on fd (the fake reports before it replies, so a request it
// answered has left one by the time its client has the answer).
bool report_waiting(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

}  // namespace

TEST_F(CxrpcdUsers, AListenerOfAnotherUserIsNotTakenForCxrpcd) {
  // Clients never checked who listened on the socket: the owner of its folder (a pod root
  // is made by its first user, 01755 under umask 022) could unlink cxrpcd's socket and bind
  // its own. An enforcing server then handed it its seal table and believed its client
  // enforced (cxr_seal_table_enforce returned 0), and `cxrpcd run` handed it the program's
  // seccomp listener and ran the program unsupervised. Now a listener whose uid is neither
  // root, the client's, nor $CXRPC_CXRPCD_UID is refused (CXR_EPERM) before anything is sent.
  std::string sock = dir_of(kUidB);
  ASSERT_FALSE(sock.empty());
  pid_t fake = as_user(kUidB, io[1], [&](int out) { fake_cxrpcd(sock, out); });
  int up = 0;
  ASSERT_TRUE(read_ints(io[0], &up, 1));
  ASSERT_EQ(up, -1);
  cxr_seal_table *t = nullptr;
  ASSERT_EQ(cxr_seal_table_create(&t, nullptr), 0);
  ASSERT_EQ(cxr_seal_table_set_peer(t, getpid(), nullptr, 0), 0);
  EXPECT_EQ(cxr_seal_table_enforce(t, sock.c_str()), CXR_EPERM);
  EXPECT_FALSE(cxr_seal_table_enforced(t));
  cxr_seal_table_close(t);
  EXPECT_FALSE(report_waiting(io[0])) << "the fake cxrpcd was sent the seal table";
  // `cxrpcd run`: no supervisor, so the program is not run (127).
  std::string bin = runfile("tools/cxrpcd/cxrpcd");
  pid_t run = fork();
  ASSERT_GE(run, 0);
  if (run == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    execl(bin.c_str(), "cxrpcd", "run", "--socket", sock.c_str(), "--", "true", (char *)NULL);
    _exit(126);
  }
  EXPECT_EQ(exit_within_5s(run), 127) << "`cxrpcd run` ran its program under the fake";
  EXPECT_FALSE(report_waiting(io[0])) << "the fake cxrpcd was sent a seccomp listener";
  // Unless the client names that uid as its cxrpcd's.
  setenv("CXRPC_CXRPCD_UID", std::to_string(kUidB).c_str(), 1);
  int c = cxr__cxrpcd_connect(sock.c_str(), 1000000000ll);
  unsetenv("CXRPC_CXRPCD_UID");
  EXPECT_GE(c, 0);
  if (c >= 0) close(c);
  end(fake);
  remove_dir_of(sock);
}

TEST_F(CxrpcdUsers, ServeRefusesAFolderOthersCanReplaceItsSocketIn) {
  // `cxrpcd serve` bound its socket in any folder: one another user owns (who can unlink
  // the socket and bind its own), or one anyone may write without the sticky bit. Now it
  // does not start (exit 1); root's folders, its own and sticky shared ones stay fine.
  std::string sock = dir_of(kUidB);
  ASSERT_FALSE(sock.empty());
  int err = -1;
  pid_t s = serve_at(sock, &err);
  ASSERT_GT(s, 0);
  EXPECT_EQ(exit_within_5s(s), 1) << "cxrpcd served in a folder of uid " << kUidB;
  close(err);
  std::string dir = sock.substr(0, sock.rfind('/'));
  ASSERT_EQ(chown(dir.c_str(), 0, 0), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  s = serve_at(sock, &err);
  ASSERT_GT(s, 0);
  EXPECT_EQ(exit_within_5s(s), 1) << "cxrpcd served in a folder anyone may write";
  close(err);
  ASSERT_EQ(chmod(dir.c_str(), 01777), 0);  // as the pod root is: served
  sup.sock = sock;
  sup.pid = serve_at(sock, &err);
  ASSERT_GT(sup.pid, 0);
  close(err);
  int c = cxr__cxrpcd_connect(sock.c_str(), 10000000000ll);  // bounded: 10 s
  EXPECT_GE(c, 0) << "cxrpcd did not serve in a sticky folder of root's";
  if (c >= 0) close(c);
}

TEST_F(CxrpcdUsers, ServeRefusesAPathAnotherUserCanSwapAFolderOf) {
  // `cxrpcd serve` checked only the socket's own folder: a folder of root's inside one of
  // uid B's passed, though B can rename it away and put one of its own at its name (and the
  // socket with it); so did a symlink whose target lies under B's folder. Now every folder
  // up to "/" is checked, through symlinks (which must be root's or ours too); a root-owned
  // path of sound folders, through a symlink too, is still served.
  std::string sock = dir_of(kUidB);  // B's folder (0755)
  ASSERT_FALSE(sock.empty());
  std::string outer = sock.substr(0, sock.rfind('/'));
  std::string inner = outer + "/root";  // root's, 0755, inside B's
  ASSERT_EQ(mkdir(inner.c_str(), 0755), 0);
  char links[] = "/tmp/cxrpcd-link-XXXXXX";  // root's, 0700
  ASSERT_NE(mkdtemp(links), nullptr);
  std::string to_inner = std::string(links) + "/in", to_sound = std::string(links) + "/ok";
  char sound[] = "/tmp/cxrpcd-ok-XXXXXX";  // root's, 0700
  ASSERT_NE(mkdtemp(sound), nullptr);
  ASSERT_EQ(symlink(inner.c_str(), to_inner.c_str()), 0);
  ASSERT_EQ(symlink("../../tmp/./", to_sound.c_str()), 0);  // relative: /tmp
  int err = -1;
  for (const std::string &path : {inner + "/s", to_inner + "/s"}) {
    pid_t s = serve_at(path, &err);
    ASSERT_GT(s, 0);
    EXPECT_EQ(exit_within_5s(s), 1) << "cxrpcd served at " << path << " under uid " << kUidB
                                    << "'s folder";
    char msg[512] = {};
    (void)!read(err, msg, sizeof msg - 1);
    close(err);
    EXPECT_NE(strstr(msg, outer.c_str()), nullptr) << msg;
    unlink(path.c_str());
  }
  // A folder of root's open to all without the sticky bit, above a sound one, is refused too.
  ASSERT_EQ(chown(outer.c_str(), 0, 0), 0);
  ASSERT_EQ(chmod(outer.c_str(), 0777), 0);
  pid_t s = serve_at(inner + "/s", &err);
  ASSERT_GT(s, 0);
  EXPECT_EQ(exit_within_5s(s), 1) << "cxrpcd served under a folder anyone may write";
  close(err);
  // A symlink of B's to sound folders: B may re-point it whatever folder it stands in (in a
  // sticky /tmp too), so it is refused like B's folders (a review found it served).
  std::string b_link = std::string(links) + "/b";
  ASSERT_EQ(symlink(sound, b_link.c_str()), 0);
  ASSERT_EQ(lchown(b_link.c_str(), kUidB, (gid_t)-1), 0);
  s = serve_at(b_link + "/s", &err);
  ASSERT_GT(s, 0);
  EXPECT_EQ(exit_within_5s(s), 1) << "cxrpcd served through uid " << kUidB << "'s symlink";
  char why[512] = {};
  (void)!read(err, why, sizeof why - 1);
  close(err);
  EXPECT_NE(strstr(why, "symlink"), nullptr) << why;
  unlink((b_link + "/s").c_str());
  unlink(b_link.c_str());
  // Through a symlink to sound folders (/tmp: root's, sticky): served.
  std::string ok = to_sound + std::string(sound).substr(4) + "/s";  // links/ok/cxrpcd-ok-*/s
  sup.sock = ok;
  sup.pid = serve_at(ok, &err);
  ASSERT_GT(sup.pid, 0);
  close(err);
  int c = cxr__cxrpcd_connect(ok.c_str(), 10000000000ll);  // bounded: 10 s
  EXPECT_GE(c, 0) << "cxrpcd did not serve at " << ok;
  if (c >= 0) close(c);
  stop_supervisor(&sup);  // unlinks the socket and removes its folder (through the link)
  unlink(to_inner.c_str());
  unlink(to_sound.c_str());
  rmdir(links);
  rmdir(sound);
  rmdir(inner.c_str());
  rmdir(outer.c_str());
}

TEST_F(CxrpcdUsers, ServeInAUserNamespaceThatMapsNoRootWarnsAndServes) {
  // In a user namespace that maps only its user (a rootless container, Bazel's sandbox run
  // by a user), "/" and /tmp show as the overflow uid: the walk up to "/" refused every
  // path there, a review found. Such folders now pass with a warning, and B's own folder
  // is served.
  std::string sock = dir_of(kUidB);
  ASSERT_FALSE(sock.empty());
  int pe[2];
  ASSERT_EQ(pipe2(pe, O_CLOEXEC), 0);
  // Opened as root: B may not reach the runfiles, which lie under root's home.
  int bin = open(runfile("tools/cxrpcd/cxrpcd").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(bin, 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(pe[1], 2);
    if (setgroups(0, nullptr) != 0 || setresgid(kUidB, kUidB, kUidB) != 0 ||
        setresuid(kUidB, kUidB, kUidB) != 0)
      _exit(126);
    prctl(PR_SET_DUMPABLE, 1);  // after setuid /proc/self is root's: uid_map could not open
    if (unshare(CLONE_NEWUSER) != 0) _exit(125);  // user namespaces not allowed here
    int m = open("/proc/self/uid_map", O_WRONLY | O_CLOEXEC);
    std::string map = std::to_string(kUidB) + " " + std::to_string(kUidB) + " 1\n";
    if (m < 0 || write(m, map.data(), map.size()) != (ssize_t)map.size()) _exit(124);
    close(m);
    char *const argv[] = {(char *)"cxrpcd", (char *)"serve", (char *)"--socket",
                          (char *)sock.c_str(), nullptr};
    fexecve(bin, argv, environ);
    _exit(127);
  }
  close(bin);
  close(pe[1]);
  struct stat st;
  int status = 0;
  bool listening = false, exited = false;
  for (int i = 0; i < 500 && !listening && !exited; i++) {  // bounded: 5 s
    listening = lstat(sock.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!listening && !exited) usleep(10000);
  }
  if (!exited) {
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
  }
  char msg[1024] = {};
  (void)!read(pe[0], msg, sizeof msg - 1);
  close(pe[0]);
  remove_dir_of(sock);
  if (exited && WIFEXITED(status) && WEXITSTATUS(status) == 125)
    GTEST_SKIP() << "this kernel does not let a user make a user namespace";
  ASSERT_FALSE(exited && WIFEXITED(status) && WEXITSTATUS(status) >= 124)
      << "setting up the namespace failed: " << WEXITSTATUS(status);
  EXPECT_TRUE(listening) << "cxrpcd did not serve in its own folder: " << msg;
  EXPECT_NE(strstr(msg, "outside this user namespace"), nullptr) << msg;
}

TEST_F(CxrpcdUsers, OneUserAtAPidsBoundLeavesPlacesForThatPidToAnother) {
  // A pid's 64 registrations were one bound for every registrant: one user that the process
  // took tables from (uid B here) registered 64 for it, and every other server's
  // registration for that process was refused (CXR_EFULL), so their sealed calls went
  // unenforced. Now the bound is per registrant uid and pid: B's 65th is refused, and root,
  // C and A each register 64 for the same process. Four times that is the pid's bound in all
  // (its decisions walk every table): a fifth uid's is refused.
  if (!can_give_whole_tables()) GTEST_SKIP() << "cannot give cxrpcd " << kWholeTables << " fds";
  ASSERT_TRUE(serve(kWholeTables));
  const int K = 4 * 64 + 2;  // B's 65, 64 each for root, C and A, one for a fifth uid
  std::vector<int> tables;
  std::vector<cxr__seal_hdr *> views(K);
  for (int i = 0; i < K; i++) {
    tables.push_back(fake_table(4, kTableSeals, &views[i]));
    ASSERT_GE(tables[i], 0);
  }
  Puppet p;  // uid A's, mapping them all (as from several servers)
  ASSERT_TRUE(spawn_puppet(sup, kUidA, tables, &p));
  ASSERT_EQ(puppet_do(&p, 'm'), 0);
  pid_t target = p.pid;
  std::vector<pid_t> kids;
  // uid registers tables[from, from + n) for target on one connection it keeps: how many
  // were taken, and the last one's status.
  auto register_as = [&](uid_t uid, int from, int n, int *v) {
    kids.push_back(as_user(uid, io[1], [&](int out) {
      int c = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
      int taken = 0, last = c;
      for (int i = from; i < from + n && c >= 0; i++) {
        last = register_on(c, target, tables[i]);
        taken += last == 0;
      }
      put_int(out, taken);
      put_int(out, last);
    }));
    return read_ints(io[0], v, 2);
  };
  int v[2] = {0, 0};
  ASSERT_TRUE(register_as(kUidB, 0, 65, v));
  EXPECT_EQ(v[0], 64) << "uid " << kUidB << "'s registrations for one pid";
  EXPECT_EQ(v[1], CXR_EFULL) << "uid " << kUidB << "'s 65th for that pid";
  ASSERT_TRUE(register_as(0, 65, 64, v));
  EXPECT_EQ(v[0], 64) << "root's registrations: uid " << kUidB << " took the pid's bound";
  ASSERT_TRUE(register_as(kUidC, 129, 64, v));
  EXPECT_EQ(v[0], 64);
  ASSERT_TRUE(register_as(kUidA, 193, 64, v));
  EXPECT_EQ(v[0], 64);
  ASSERT_TRUE(register_as(kUidC + 1, 257, 1, v));
  EXPECT_EQ(v[1], CXR_EFULL) << "a fifth uid's registration past the pid's bound in all";
  for (pid_t k : kids) end(k);
  end_puppet(&p);
  for (int i = 0; i < K; i++) {
    munmap(views[i], cxr__seal_bytes(4));
    close(tables[i]);
  }
}
