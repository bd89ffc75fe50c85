// Real child processes for the rdma and netns tests: spawn a binary (optionally inside a
// network namespace), read its "READY ..." line with a bound, and kill it at the end.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char **environ;

namespace cxrt {

struct Proc {
  pid_t pid = -1;
  int out = -1;   // its stdout
  int in = -1;    // its stdin (closing it asks peers to exit)
  std::string buf;

  // Runs argv with extra environment entries ("K=V"); inside netns `ns` when not empty.
  // Everything the child needs is made before the fork: a child of a process with threads
  // may call only async-signal-safe functions until it execs (putenv or malloc there hung
  // if another thread held glibc's environment or heap lock at the fork).
  bool start(const std::vector<std::string> &argv, const std::vector<std::string> &env = {},
             const std::string &ns = "") {
    std::vector<std::string> args;
    // `ip netns exec` also remounts /sys for the namespace: UCX finds its network
    // devices in /sys/class/net, which a bare setns() would leave showing the host's.
    if (!ns.empty()) args = {"/usr/sbin/ip", "netns", "exec", ns};
    args.insert(args.end(), argv.begin(), argv.end());
    std::vector<std::string> envs = child_env(env);
    std::vector<char *> a = c_strings(args), e = c_strings(envs);
    int po[2], pi[2];
    if (pipe2(po, O_CLOEXEC)) return false;
    if (pipe2(pi, O_CLOEXEC)) return close(po[0]), close(po[1]), false;
    pid = fork();
    if (pid == 0) {
      static const char kFailed[] = "proc.h: execve failed\n";
      if (dup2(po[1], 1) == 1 && dup2(pi[0], 0) == 0) execve(a[0], a.data(), e.data());
      (void)!write(2, kFailed, sizeof kFailed - 1);
      _exit(127);
    }
    close(po[1]);
    close(pi[0]);
    if (pid < 0) return close(po[0]), close(pi[1]), false;
    out = po[0];
    in = pi[1];
    return true;
  }

  // This process's environment with each entry of extra ("K=V") in place of K's own, as
  // putenv in the child made it (an entry without '=' removes K, as putenv does).
  static std::vector<std::string> child_env(const std::vector<std::string> &extra) {
    auto key = [](const std::string &kv) { return kv.substr(0, kv.find('=')); };
    std::vector<std::string> out;
    for (char **v = environ; *v; v++) {
      bool replaced = false;
      for (auto &x : extra) replaced = replaced || key(x) == key(*v);
      if (!replaced) out.push_back(*v);
    }
    for (size_t i = 0; i < extra.size(); i++) {  // the last entry of a key wins
      bool later = false;
      for (size_t j = i + 1; j < extra.size(); j++) later = later || key(extra[j]) == key(extra[i]);
      if (!later && extra[i].find('=') != std::string::npos) out.push_back(extra[i]);
    }
    return out;
  }

  // argv/envp for execve: pointers into strs, which must outlive them; null-terminated.
  static std::vector<char *> c_strings(std::vector<std::string> &strs) {
    std::vector<char *> p;
    for (auto &s : strs) p.push_back(&s[0]);
    p.push_back(nullptr);
    return p;
  }

  // The next line of its stdout within timeout_ms ("" on timeout or EOF).
  std::string line(int timeout_ms) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
      size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return l;
      }
      struct timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      long left = timeout_ms - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
      if (left <= 0) return "";
      struct pollfd p = {out, POLLIN, 0};
      if (poll(&p, 1, (int)left) <= 0) continue;
      char b[4096];
      ssize_t n = read(out, b, sizeof b);
      if (n <= 0) return "";
      buf.append(b, (size_t)n);
    }
  }

  // Sends a line to its stdin.
  bool say(const std::string &s) {
    std::string l = s + "\n";
    return write(in, l.data(), l.size()) == (ssize_t)l.size();
  }

  // The peers' request/answer step: sends cmd, returns the next line within timeout_ms.
  std::string ask(const std::string &cmd, int timeout_ms) {
    say(cmd);
    return line(timeout_ms);
  }

  void kill9() {
    if (pid > 0) kill(pid, SIGKILL);
  }

  // Closes its stdin, waits up to timeout_ms for it to exit, then kills it. Exit code or -1.
  int stop(int timeout_ms = 3000) {
    if (pid <= 0) return -1;
    if (in >= 0) close(in), in = -1;
    int st = 0;
    for (int i = 0; i < timeout_ms / 10; i++) {
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    pid = -1;
    return -1;
  }

  ~Proc() {
    stop(1000);
    if (out >= 0) close(out);
  }
};

// Starts tests/netns/remote_peer serving channel "kv" on a loopback port of its own, with
// CXRPC_ROOT root and CXRPC_POD 1, into server (which must not run yet); *host gets
// "127.0.0.1:PORT". Loopback is shared by the suites running in parallel (the same pid in
// every sandbox: salt tells suites apart), and used ports linger in TIME_WAIT: the port
// varies with time and is retried. False if no server came up.
// env: more entries for the server ("REMOTE_PEER_WORKERS=1", say).
inline bool start_kv_server(Proc &server, std::string *host, const std::string &root,
                            int salt, const std::vector<std::string> &env = {}) {
  for (int tries = 0; tries < 20; tries++) {
    int port = 20000 + (int)((getpid() * 7 + time(nullptr) * 31 + tries * 101 + salt) % 30000);
    *host = "127.0.0.1:" + std::to_string(port);
    Proc p;
    std::vector<std::string> e = {"CXRPC_ROOT=" + root, "CXRPC_POD=1"};
    e.insert(e.end(), env.begin(), env.end());
    if (!p.start({"tests/netns/remote_peer", "server", "kv", "ucx://" + *host}, e))
      return false;
    if (p.line(15000) == "READY") {
      std::swap(server.pid, p.pid);
      std::swap(server.in, p.in);
      std::swap(server.out, p.out);
      return true;
    }
  }
  return false;
}

}  // namespace cxrt
