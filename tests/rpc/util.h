// Helpers for the rpc suites: a CXRPC_ROOT of the test's own, unique names, peer processes
// started with posix_spawn (exec: a fresh process, no inherited mappings or threads), bounded
// waits, and counters of descriptors and mappings.
#ifndef CXRPC_TESTS_RPC_UTIL_H
#define CXRPC_TESTS_RPC_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/root.h"
#include <cxrpc/rpc.h>

extern char **environ;

namespace rpctest {

using cxrt::setup_root;  // tests/root.h

// Options for a call whose small argument travels inline in the descriptor.
inline cxr_call_opts inline_opts(size_t len, int64_t deadline_ns = 0) {
  cxr_call_opts o;
  cxr_call_opts_init(&o);
  o.flags = CXR_CALL_INLINE;
  o.arg_len = len;
  o.deadline_ns = deadline_ns;
  return o;
}

inline std::string uniq(const char *base) {
  static int n;
  return std::string(base) + std::to_string(getpid() % 100000) + "-" + std::to_string(++n);
}

// A binary of this workspace in the test's runfiles, e.g. "tests/rpc/rpc_peer".
inline std::string runfile(const char *rel) {
  const char *s = getenv("TEST_SRCDIR");
  const char *w = getenv("TEST_WORKSPACE");
  return std::string(s ? s : ".") + "/" + (w ? w : "cxrpc") + "/" + rel;
}

inline std::string peer_path() { return runfile("tests/rpc/rpc_peer"); }

struct Peer {
  pid_t pid = -1;
  int out = -1;  // its stdout
};

inline Peer spawn_bin(const std::string &path, const std::vector<std::string> &args,
                      bool merge_stderr = false);
inline Peer spawn_peer(const std::vector<std::string> &args) { return spawn_bin(peer_path(), args); }

// Starts path with args; its stdout (and stderr if merge_stderr) come back through p.out.
inline Peer spawn_bin(const std::string &path, const std::vector<std::string> &args,
                      bool merge_stderr) {
  Peer p;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return p;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  if (merge_stderr) posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  std::vector<char *> argv;
  argv.push_back((char *)path.c_str());
  for (auto &a : args) argv.push_back((char *)a.c_str());
  argv.push_back(nullptr);
  if (posix_spawn(&p.pid, path.c_str(), &fa, nullptr, argv.data(), environ) != 0) p.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  p.out = fds[0];
  return p;
}

// Reads one line from the peer within timeout_ms ("" on timeout or EOF).
inline std::string read_line(const Peer &p, int timeout_ms = 10000) {
  std::string line;
  for (int waited = 0; waited < timeout_ms;) {
    struct pollfd pf = {p.out, POLLIN, 0};
    int r = poll(&pf, 1, 50);
    waited += 50;
    if (r <= 0) continue;
    char c;
    ssize_t n = read(p.out, &c, 1);
    if (n <= 0) return "";
    if (c == '\n') return line;
    line += c;
  }
  return "";
}

// Waits at most timeout_ms; kills on timeout. Exit status, 128+signal, or -1 on timeout.
inline int wait_peer(Peer &p, int timeout_ms = 20000) {
  int rc = -1;
  for (int waited = 0; p.pid > 0; waited += 5) {
    int st;
    pid_t r = waitpid(p.pid, &st, WNOHANG);
    if (r == p.pid) {
      rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (r < 0) break;
    if (waited >= timeout_ms) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &st, 0);
      break;
    }
    usleep(5000);
  }
  if (p.out >= 0) close(p.out);
  p.out = -1;
  p.pid = -1;
  return rc;
}

// True while p has not exited (a zombie still answers kill(pid, 0)).
inline bool alive(const Peer &p) {
  int st;
  return p.pid > 0 && waitpid(p.pid, &st, WNOHANG) == 0 && kill(p.pid, 0) == 0;
}

// Kills and reaps p when it goes out of scope: an ASSERT's early return must not leave a
// server running.
struct Reap {
  Peer &p;
  ~Reap() {
    if (p.pid > 0) kill(p.pid, SIGKILL);
    wait_peer(p);
  }
};

inline Peer start_server(const std::string &name, int workers = 1) {
  Peer p = spawn_peer({"server", name, std::to_string(workers)});
  if (p.pid > 0 && read_line(p) != "ready") {
    kill(p.pid, SIGKILL);
    wait_peer(p);
  }
  return p;
}

// Everything the peer writes until it exits (at most timeout_ms).
inline std::string read_all(Peer &p, int timeout_ms = 30000) {
  std::string out;
  for (int waited = 0; waited < timeout_ms;) {
    struct pollfd pf = {p.out, POLLIN, 0};
    int r = poll(&pf, 1, 50);
    waited += 50;
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = read(p.out, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, (size_t)n);
  }
  return out;
}

inline void stop_peer(Peer &p) {
  if (p.pid > 0) kill(p.pid, SIGTERM);
  wait_peer(p);
}

inline int count_dir(const char *dir) {
  int n = 0;
  DIR *d = opendir(dir);
  if (!d) return -1;
  while (struct dirent *e = readdir(d))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

inline int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF)
    if (c == '\n') n++;
  fclose(f);
  return n;
}

inline int64_t ms_since(int64_t t0) { return (cxr_now_ns() - t0) / 1000000; }

// A connect that waits up to 20 s for the server to ready a slot (the default is 2 s): for
// tests that connect beyond the pool, where a loaded machine or TSan can make the server's
// new heap late, and a late slot is not what the test looks for.
inline int connect_patiently(cxr_conn **c, const std::string &name) {
  cxr_conn_opts o;
  cxr_conn_opts_init(&o);
  o.connect_timeout_ns = 20000000000;
  return cxr_connect(c, name.c_str(), &o);
}

// Polls cond every 2 ms for at most timeout_ms.
template <class F>
inline bool eventually(F cond, int timeout_ms = 5000) {
  int64_t t0 = cxr_now_ns();
  while (!cond()) {
    if (ms_since(t0) > timeout_ms) return false;
    usleep(2000);
  }
  return true;
}

}  // namespace rpctest

#endif
