// cxrpcd's polls of the pidfds it keeps (registrations, attached processes, cached threads),
// seen from inside: the supervisor is linked in and serves from a child of the test, and
// poll(2) is interposed for this whole program (the executable's definition wins over
// libc's), so a test can count the polls made over pidfds and make them fail the way only
// the kernel otherwise does (ENOMEM).
#include <gtest/gtest.h>
#include <errno.h>
#include <time.h>

#include <atomic>

#include "tests/sandbox/cxrpcd_client.h"

extern "C" {
#include "tools/cxrpcd/supervisor.h"
}

using namespace sbx;

namespace {

// Shared with the serving child (an anonymous shared mapping made before it is forked).
struct PollState {
  std::atomic<int> fail{0};          // nonzero: polls over pidfds fail with ENOMEM
  std::atomic<long> pidfd_polls{0};  // polls over pidfds so far
  std::atomic<int> fail_main{0};     // the next this many main-loop polls fail with ENOMEM
  std::atomic<int> fail_multi{0};    // nonzero: polls over two pidfds or more fail (ENOMEM)
  std::atomic<long> multi_polls{0};  // polls over two pidfds or more so far
};

PollState *g_polls;  // set in the serving child only
volatile sig_atomic_t g_stop;

bool is_pidfd(int fd) {
  char path[64], name[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, name, sizeof name - 1);
  if (n <= 0) return false;
  name[n] = '\0';
  return strstr(name, "pidfd") != nullptr;
}

void on_term(int) { g_stop = 1; }

// A cxrpcd serving from a child of this process, polls counted in *ps: like
// start_supervisor's (stop_supervisor stops it).
bool serve_here(Supervisor *s, PollState *ps) {
  char dir[] = "/tmp/cxrpcd-test-XXXXXX";
  if (mkdtemp(dir) == NULL) return false;
  s->sock = std::string(dir) + "/sock";
  s->pid = fork();
  if (s->pid < 0) return false;
  if (s->pid == 0) {
    g_polls = ps;
    struct rlimit rl;  // as `cxrpcd serve` does: whole tables where the hard limit allows
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, nullptr);
    _exit(cxrpcd_serve(s->sock.c_str(), &g_stop) == 0 ? 0 : 1);
  }
  int c = cxr__cxrpcd_connect(s->sock.c_str(), 10000000000ll);  // bounded: 10 s
  if (c < 0) return false;
  close(c);
  return true;
}

PollState *shared_poll_state() {
  void *m = mmap(nullptr, sizeof(PollState), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
  return m == MAP_FAILED ? nullptr : new (m) PollState;
}

}  // namespace

// glibc declares poll's array write-only (the kernel fills in revents), so reading fds[0].fd
// here looks like a read of something uninitialized to the compiler.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
extern "C" int poll(struct pollfd *fds, nfds_t n, int timeout) {
  // The main loop's poll: several descriptors, the listening socket (or -1) first.
  if (g_polls && n > 1 && !is_pidfd(fds[0].fd) && g_polls->fail_main > 0) {
    g_polls->fail_main--;
    errno = ENOMEM;
    return -1;
  }
  // The kernel allocates only for larger sets: a poll over one pidfd may work while the
  // poll over all of them fails.
  if (g_polls && n > 1 && is_pidfd(fds[0].fd)) {
    g_polls->multi_polls++;
    if (g_polls->fail_multi) {
      errno = ENOMEM;
      return -1;
    }
  }
  if (g_polls && n > 0 && is_pidfd(fds[0].fd)) {
    g_polls->pidfd_polls++;
    if (g_polls->fail) {
      errno = ENOMEM;
      return -1;
    }
  }
  struct timespec ts = {timeout / 1000, (timeout % 1000) * 1000000l};
  return ppoll(fds, n, timeout < 0 ? nullptr : &ts, nullptr);
}

// Every test: a cxrpcd serving from a child, its polls counted in (and steered by) *ps.
class CxrpcdPidfd : public ::testing::Test {
 protected:
  void SetUp() override {
    ps = shared_poll_state();
    ASSERT_NE(ps, nullptr);
    ASSERT_TRUE(serve_here(&sup, ps));
  }
  void TearDown() override {
    stop_supervisor(&sup);
    if (ps) munmap(ps, sizeof *ps);
  }
  // A puppet attached to this cxrpcd that maps *table (a table holding its window, viewed
  // at *w). Call it inside ASSERT_NO_FATAL_FAILURE.
  void MappingPuppet(int *table, cxr__seal_hdr **w, Puppet *p) {
    *table = window_holding_table(w);
    ASSERT_GE(*table, 0);
    ASSERT_TRUE(spawn_puppet(sup, 0, *table, p));
    ASSERT_EQ(puppet_do(p, 'm'), 0);
  }
  PollState *ps = nullptr;
  Supervisor sup;
};

TEST_F(CxrpcdPidfd, AFailedPollKeepsTheRegistrationOfALiveProcess) {
  // Whether a registration's process had exited was a poll of its pidfd, and a failed
  // poll (ENOMEM) counted as an exit: the registration was dropped while its process
  // lived, and with it every refusal its table made (here every raise in the window). Now
  // it is kept, a warning logged, and asked again next time.
  cxr__seal_hdr *w = nullptr;
  int table = -1;
  Puppet p;
  ASSERT_NO_FATAL_FAILURE(MappingPuppet(&table, &w, &p));
  EXPECT_EQ(puppet_do(&p, 'r'), -ENOMEM);  // no table yet: let through
  int conn = -1;
  ASSERT_EQ(request(sup, CXR__MSG_REGISTER, p.pid, 0, 0, table, &conn), 0);
  EXPECT_EQ(puppet_do(&p, 'r'), -EPERM);
  ps->fail = 1;  // each decision first drops the registrations of its pid that ended
  EXPECT_EQ(puppet_do(&p, 'r'), -EPERM) << "a failed poll dropped the registration";
  ps->fail = 0;
  EXPECT_EQ(puppet_do(&p, 'r'), -EPERM) << "the registration is gone";
  close(conn);
  end_puppet(&p);
  munmap(w, cxr__seal_bytes(4));
  close(table);
}

TEST_F(CxrpcdPidfd, ARegistrationPollsThePidfdsOnce) {
  // Each REGISTER first drops the registrations whose process ended, and polled their
  // pidfds one at a time: with 40 registrations, 42 polls for one request (1024 syscalls
  // at a full table). Now one poll over them all, one for the pid's attach and one for the
  // named process: 3 whatever the count.
  const int K = 40;
  std::vector<int> tables;
  std::vector<cxr__seal_hdr *> views;
  for (int i = 0; i <= K; i++) {
    cxr__seal_hdr *w = nullptr;
    int fd = fake_table(4, kTableSeals, &w);
    ASSERT_GE(fd, 0);
    tables.push_back(fd);
    views.push_back(w);
  }
  Puppet p;
  ASSERT_TRUE(spawn_puppet(sup, 0, tables, &p));
  ASSERT_EQ(puppet_do(&p, 'm'), 0);
  int conn = cxr__cxrpcd_connect(sup.sock.c_str(), 2000000000ll);
  ASSERT_GE(conn, 0);
  for (int i = 0; i < K; i++) ASSERT_EQ(register_on(conn, p.pid, tables[i]), 0) << i;
  long before = ps->pidfd_polls;
  ASSERT_EQ(register_on(conn, p.pid, tables[K]), 0);
  long polls = ps->pidfd_polls - before;
  printf("pidfd polls for one REGISTER over %d registrations: %ld\n", K, polls);
  EXPECT_LE(polls, 3);
  close(conn);
  end_puppet(&p);
  for (int i = 0; i <= K; i++) {
    munmap(views[i], cxr__seal_bytes(4));
    close(tables[i]);
  }
}

TEST_F(CxrpcdPidfd, AFailedMainPollDoesNotEndServe) {
  // The main loop's poll failing (ENOMEM, the kernel's memory) ended `serve` at once, and
  // with it every supervised process's raises failed for good. Now it waits 10 ms and polls
  // again (for up to 5 s of failures in a row): 20 failures later it still answers.
  ps->fail_main = 20;
  int c = cxr__cxrpcd_connect(sup.sock.c_str(), 10000000000ll);  // bounded: 10 s
  ASSERT_GE(c, 0);
  close(c);
  for (int i = 0; i < 300 && ps->fail_main > 0; i++) usleep(10000);  // bounded: 3 s
  EXPECT_EQ(ps->fail_main, 0) << "the main loop stopped polling";
  int st = 0;
  EXPECT_EQ(waitpid(sup.pid, &st, WNOHANG), 0) << "cxrpcd stopped after a failed poll";
  EXPECT_EQ(request(sup, CXR__MSG_STATS, 0, 0, 0, -1), 0) << "cxrpcd does not answer";
}

TEST_F(CxrpcdPidfd, AFailedPollOfARegistrationBacksOff) {
  // A registration whose process ended has a ready pidfd, and the main loop asks which
  // ones ended (one poll over them) whenever one is ready. While that poll failed (ENOMEM)
  // the pidfd stayed ready and the loop asked again at once: a busy spin of thousands of
  // polls (and warnings) a second. Now it leaves the pidfds out for 10 ms, doubling, so a
  // few polls in 200 ms; the registration is kept meanwhile and goes once a poll works.
  cxr__seal_hdr *w = nullptr;
  int table = -1;
  Puppet p;
  ASSERT_NO_FATAL_FAILURE(MappingPuppet(&table, &w, &p));
  int conn = -1;
  ASSERT_EQ(request(sup, CXR__MSG_REGISTER, p.pid, 0, 0, table, &conn), 0);
  ASSERT_EQ(mappings_of(sup.pid, table), 1);  // cxrpcd maps a registered table
  ps->fail = 1;
  end_puppet(&p);  // its pidfd is ready from now on
  long before = ps->pidfd_polls;
  usleep(200000);
  long polls = ps->pidfd_polls - before;
  printf("pidfd polls in 200 ms while they fail: %ld\n", polls);
  EXPECT_LE(polls, 20) << "a failed poll is asked again at once";
  EXPECT_EQ(mappings_of(sup.pid, table), 1) << "a registration went while poll failed";
  ps->fail = 0;
  int left = 1;
  for (int i = 0; i < 500 && (left = mappings_of(sup.pid, table)) != 0; i++)  // bounded: 5 s
    usleep(10000);
  EXPECT_EQ(left, 0) << "the ended process's registration stayed once poll worked";
  close(conn);
  munmap(w, cxr__seal_bytes(4));
  close(table);
}

TEST_F(CxrpcdPidfd, APollOverOneProcesssPidfdDoesNotResetTheBackOff) {
  // While the poll over every registration fails, a notification's poll over one process's
  // pidfd can work; it used to end the run of failures, so each notification restarted the
  // back-off at 10 ms (and warned): 7-18 failed full polls in 200 ms of raises, 1 now.
  cxr__seal_hdr *wa = nullptr, *wb = nullptr;
  int ta = -1, tb = -1;
  Puppet a, b;
  ASSERT_NO_FATAL_FAILURE(MappingPuppet(&ta, &wa, &a));
  ASSERT_NO_FATAL_FAILURE(MappingPuppet(&tb, &wb, &b));
  int ca = -1, cb = -1;
  ASSERT_EQ(request(sup, CXR__MSG_REGISTER, a.pid, 0, 0, ta, &ca), 0);
  ASSERT_EQ(request(sup, CXR__MSG_REGISTER, b.pid, 0, 0, tb, &cb), 0);
  ps->fail_multi = 1;
  end_puppet(&b);  // its pidfd is ready from now on: the full poll is asked, and fails
  usleep(300000);  // the back-off grows past 200 ms with no notification
  long before = ps->multi_polls;
  int64_t t0 = cxr_now_ns();
  for (int i = 0; i < 200 && cxr_now_ns() - t0 < 200000000ll; i++) {  // bounded: 200 ms
    EXPECT_EQ(puppet_do(&a, 'r'), -EPERM);  // a notified raise, refused by a's table
    usleep(2000);
  }
  long failed = ps->multi_polls - before;
  printf("failing full polls in 200 ms of notifications: %ld\n", failed);
  EXPECT_LE(failed, 3) << "a poll over one pidfd restarted the back-off";
  ps->fail_multi = 0;
  close(ca);
  close(cb);
  end_puppet(&a);
  munmap(wa, cxr__seal_bytes(4));
  munmap(wb, cxr__seal_bytes(4));
  close(ta);
  close(tb);
}
