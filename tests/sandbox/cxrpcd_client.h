// Talking to cxrpcd's socket directly, as the cxrpcd suites do: one request on a fresh
// connection, attaching a process under the enforcement filter (optionally as another
// user), registering tables, and a cxrpcd started under a lower descriptor limit.
#ifndef CXRPC_TESTS_SANDBOX_CXRPCD_CLIENT_H
#define CXRPC_TESTS_SANDBOX_CXRPCD_CLIENT_H

#include <errno.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sysmacros.h>

#include "tests/sandbox/harness.h"

namespace sbx {

// One request on a fresh connection: the reply's status, or -9999 if none came within 2 s.
// *conn, if given, receives the connection (left open), else it is closed.
inline int request(const Supervisor &sup, uint32_t type, int64_t pid, uint64_t base, uint64_t size,
            int fd, int *conn = nullptr) {
  int c = cxr__cxrpcd_connect(sup.sock.c_str(), 1000000000ll);
  if (c < 0) return -9999;
  cxr__cxrpcd_msg m = {};
  m.magic = CXR__CXRPCD_MAGIC;
  m.type = type;
  m.pid = pid;
  m.base = base;
  m.size = size;
  int rc = -9999;
  if (cxr__msg_send(c, &m, fd) == 0 && cxr__msg_recv(c, &m, NULL, 2000000000ll) == 0 &&
      m.type == CXR__MSG_REPLY)
    rc = m.status;
  if (conn) *conn = c;
  else close(c);
  return rc;
}

inline int attach(const Supervisor &sup, int64_t pid, int fd) {
  uintptr_t wbase;
  size_t wsize;
  cxr__sbx_window(&wbase, &wsize);
  return request(sup, CXR__MSG_ATTACH, pid, wbase, wsize, fd);
}

// Registers a fresh table (cxr_seal_table_create's) for pid: cxr_seal_table_enforce's answer.
inline int register_for(const Supervisor &sup, int64_t pid) {
  cxr_seal_table *t = nullptr;
  if (cxr_seal_table_create(&t, nullptr) != 0) return -9999;
  int rc = cxr_seal_table_set_peer(t, (int)pid, nullptr, 0);
  if (rc == 0) rc = cxr_seal_table_enforce(t, sup.sock.c_str());
  cxr_seal_table_close(t);
  return rc;
}

// Puts this process under the enforcement filter (irreversible: children only): its listener.
inline int filter_self() {
  uintptr_t wbase;
  size_t wsize;
  cxr__sbx_window(&wbase, &wsize);
  return cxr__enforce_filter_load(wbase, wsize);
}

// Makes this process uid's alone (no root, no supplementary groups): whether it could.
inline bool become(uid_t uid) {
  return setgroups(0, nullptr) == 0 && setgid((gid_t)uid) == 0 && setuid(uid) == 0;
}

// Forks a child that puts itself under the filter and attaches to sup (it exits 1 if it
// cannot): the child's pid in the parent, 0 in the child (*nfd: its listener, kept). A
// nonzero uid: the child first becomes that uid's.
inline pid_t fork_attached(const Supervisor &sup, int *nfd, uid_t uid = 0) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (uid != 0 && !become(uid)) _exit(2);
  *nfd = filter_self();
  if (*nfd < 0 || attach(sup, getpid(), *nfd) != 0) _exit(1);
  return 0;
}

inline bool stats_answer(const Supervisor &sup) {
  uint64_t a = 0, r = 0;
  return supervisor_stats(sup, &a, &r);
}

// A table whose first record is being written (claimed, no length yet): it holds the whole
// window, so a process it is registered for has every raise there refused. The fd, or -1;
// *w is the maker's writable view.
inline int window_holding_table(cxr__seal_hdr **w) {
  int fd = fake_table(4, kTableSeals, w);
  if (fd < 0) return -1;
  cxr__seal_rec *r = cxr__seal_recs(*w);
  __atomic_store_n(&r[0].len, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&r[0].state, (uint64_t)CXR__SEAL_CLAIM, __ATOMIC_RELEASE);
  return fd;
}

// One registration of table fd for pid on connection c: the reply's status (-9999: none).
inline int register_on(int c, int64_t pid, int fd) {
  cxr__cxrpcd_msg m = {};
  m.magic = CXR__CXRPCD_MAGIC;
  m.type = CXR__MSG_REGISTER;
  m.pid = pid;
  if (cxr__msg_send(c, &m, fd) != 0 || cxr__msg_recv(c, &m, NULL, 2000000000ll) != 0 ||
      m.type != CXR__MSG_REPLY)
    return -9999;
  return m.status;
}

// What a child that registers tables of its own for itself reports.
struct RegReport {
  pid_t pid = -1;  // the child's (reports come in the order children read go, not forked)
  int accepted = -1;
  int dup = 0;      // the status of the same table registered again
  int refused = 0;  // the status of the first one refused
  int64_t decide_ns = -1;
};

// Forks an attached child that creates n tables of `slots` records, registers the first
// twice and then all of them for itself on one connection, once it reads a byte from go;
// then times a notified raise (the second: the first faults the tables in), writes its
// report to out and waits to be killed. A nonzero uid: the child is that uid's.
inline pid_t registering_child(const Supervisor &sup, int n, unsigned slots, int go, int out,
                        uid_t uid = 0) {
  int nfd = -1;
  pid_t pid = fork_attached(sup, &nfd, uid);
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left behind by a failed assertion
  char b;
  if (read(go, &b, 1) != 1) _exit(1);
  RegReport rep;
  rep.pid = getpid();
  rep.accepted = 0;
  cxr_seal_opts o;
  cxr_seal_opts_init(&o);
  o.slots = slots;
  int c = cxr__cxrpcd_connect(sup.sock.c_str(), 2000000000ll);
  if (c < 0) _exit(1);
  for (int i = 0; i < n; i++) {
    cxr_seal_table *t = nullptr;  // kept (and so mapped) until the child is killed
    if (cxr_seal_table_create(&t, &o) != 0) _exit(1);
    int rc = register_on(c, getpid(), cxr_seal_table_fd(t));
    if (i == 0) rep.dup = register_on(c, getpid(), cxr_seal_table_fd(t));
    if (rc == 0) rep.accepted++;
    else if (rep.refused == 0) rep.refused = rc;
  }
  uintptr_t wbase;
  size_t wsize;
  cxr__sbx_window(&wbase, &wsize);
  void *p = (void *)(wbase + wsize / 2 + 0x123000);
  mprotect(p, 4096, PROT_READ | PROT_WRITE);  // notified; cxrpcd's first read of the tables
  int64_t t0 = cxr_now_ns();
  mprotect(p, 4096, PROT_READ | PROT_WRITE);
  rep.decide_ns = cxr_now_ns() - t0;
  (void)!write(out, &rep, sizeof rep);
  pause();
  _exit(0);
}


// Lets a registering_child go (a byte on go) and reads its report from out (20 s at most).
inline bool next_report(int go, int out, RegReport *rep) {
  struct pollfd p = {out, POLLIN, 0};
  return write(go, "g", 1) == 1 && poll(&p, 1, 20000) == 1 &&
         read(out, rep, sizeof *rep) == (ssize_t)sizeof *rep;
}

// Makes pid the next one forked (ns_last_pid: root in the pid namespace): whether it could.
inline bool give_next_pid(pid_t pid) {
  FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
  bool set = f && fprintf(f, "%d", pid - 1) > 0;
  if (f) set = fclose(f) == 0 && set;
  return set;
}

// Descriptors at which cxrpcd's tables are whole (its registrations too: 256 per uid); it
// cuts them to a quarter each of what a lower RLIMIT_NOFILE leaves.
constexpr rlim_t kWholeTables = 8192;

// Whether this process may give cxrpcd kWholeTables descriptors (root may raise its hard
// limit only in the first user namespace; Bazel's sandbox is another).
inline bool can_give_whole_tables() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return false;
  if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= kWholeTables) return true;
  struct rlimit up = {rl.rlim_cur, kWholeTables};
  if (setrlimit(RLIMIT_NOFILE, &up) != 0) return false;
  setrlimit(RLIMIT_NOFILE, &rl);
  return true;
}

// start_supervisor's, with RLIMIT_NOFILE set to soft/hard for cxrpcd.
inline bool start_limited(Supervisor *s, rlim_t soft, rlim_t hard) {
  char dir[] = "/tmp/cxrpcd-test-XXXXXX";
  if (mkdtemp(dir) == NULL) return false;
  s->sock = std::string(dir) + "/sock";
  std::string bin = runfile("tools/cxrpcd/cxrpcd");
  s->pid = fork();
  if (s->pid < 0) return false;
  if (s->pid == 0) {
    struct rlimit rl = {soft, hard};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
    execl(bin.c_str(), "cxrpcd", "serve", "--socket", s->sock.c_str(), (char *)NULL);
    _exit(127);
  }
  int c = cxr__cxrpcd_connect(s->sock.c_str(), 10000000000ll);
  if (c < 0) return false;
  close(c);
  return true;
}

// Runs `cxrpcd serve --socket path`: its pid; *err receives the read end of its stderr.
inline pid_t serve_at(const std::string &path, int *err) {
  int pe[2];
  if (pipe2(pe, O_CLOEXEC) != 0) return -1;
  std::string bin = runfile("tools/cxrpcd/cxrpcd");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pe[1], 2);
    execl(bin.c_str(), "cxrpcd", "serve", "--socket", path.c_str(), (char *)NULL);
    _exit(127);
  }
  close(pe[1]);
  *err = pe[0];
  return pid;
}

// n ints from fd within 10 s (false if they did not come).
inline bool read_ints(int fd, int *v, int n) {
  for (int i = 0; i < n; i++) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1 || read(fd, &v[i], sizeof v[i]) != (ssize_t)sizeof v[i])
      return false;
  }
  return true;
}

inline void put_int(int fd, int v) { (void)!write(fd, &v, sizeof v); }

// A raise in the window where nothing is mapped: -ENOMEM once let through, -EPERM if refused.
inline int raise_in_window() {
  uintptr_t wbase;
  size_t wsize;
  cxr__sbx_window(&wbase, &wsize);
  void *p = (void *)(wbase + wsize / 2 + 0x123000);
  return mprotect(p, 4096, PROT_READ | PROT_WRITE) == 0 ? 0 : -errno;
}

// A supervised process of uid, driven by one byte at a time: 'r' raise_in_window(), 'm'
// maps each of fds read-only and keeps them (as a sender takes its servers' tables); each
// answered with an int.
struct Puppet {
  pid_t pid = -1;
  int ctl = -1;
};

// Its fds mapped: 0, or the first mmap's -errno.
inline int map_all(const std::vector<int> &fds) {
  for (int fd : fds)
    if (mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) return -errno;
  return 0;
}

inline bool spawn_puppet(const Supervisor &sup, uid_t uid, const std::vector<int> &fds,
                         Puppet *p) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return false;
  int nfd = -1;
  p->pid = fork_attached(sup, &nfd, uid);
  if (p->pid < 0) return false;
  if (p->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(sv[0]);
    char c;
    while (read(sv[1], &c, 1) == 1)
      put_int(sv[1], c == 'r' ? raise_in_window() : c == 'm' ? map_all(fds) : -EINVAL);
    _exit(0);
  }
  close(sv[1]);
  p->ctl = sv[0];
  return true;
}

inline bool spawn_puppet(const Supervisor &sup, uid_t uid, int fd, Puppet *p) {
  return spawn_puppet(sup, uid, std::vector<int>{fd}, p);
}

// The puppet's answer (-9999: none within 10 s, as when it could not attach).
inline int puppet_do(Puppet *p, char c) {
  int rc = -9999;
  if (write(p->ctl, &c, 1) != 1 || !read_ints(p->ctl, &rc, 1)) return -9999;
  return rc;
}

inline void end_puppet(Puppet *p) {
  if (p->pid > 0) kill(p->pid, SIGKILL), waitpid(p->pid, nullptr, 0);
  close(p->ctl);
  p->pid = -1;
}

// How many of process pid's mappings are of fd's file (/proc/pid/maps), or -1 if unreadable.
inline int mappings_of(pid_t pid, int fd) {
  struct stat st;
  FILE *f = fopen(("/proc/" + std::to_string(pid) + "/maps").c_str(), "re");
  if (!f || fstat(fd, &st) != 0) {
    if (f) fclose(f);
    return -1;
  }
  int n = 0;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    unsigned maj, mnr;
    unsigned long long ino;
    if (sscanf(line, "%*x-%*x %*s %*x %x:%x %llu", &maj, &mnr, &ino) == 3)
      n += maj == major(st.st_dev) && mnr == minor(st.st_dev) && ino == st.st_ino;
  }
  fclose(f);
  return n;
}

// Its exit status within 5 s, or -1 (then it is killed).
inline int exit_within_5s(pid_t pid) {
  int st = 0;
  for (int i = 0; i < 500; i++) {
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

}  // namespace sbx
#endif
