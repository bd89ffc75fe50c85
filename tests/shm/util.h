// Helpers for the shm suites: a CXRPC_ROOT of the test's own, forked children with a
// bounded wait, unique names.
#ifndef CXRPC_TESTS_SHM_UTIL_H
#define CXRPC_TESTS_SHM_UTIL_H

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/root.h"
#include <cxrpc/shm.h>

namespace shmtest {

using cxrt::setup_root;  // tests/root.h

// Most cases want a heap that goes away with its last holder, so that they can end by
// checking that nothing is left under the root. 0 or the CXR_E* code of cxr_heap_create.
inline int create_self_removing(cxr_heap **h, const std::string &name, size_t size,
                                bool keep_orphans = false) {
  cxr_heap_opts o;
  cxr_heap_opts_init(&o);
  o.remove_on_last_close = true;
  o.keep_orphans = keep_orphans;
  return cxr_heap_create(h, name.c_str(), size, &o);
}

inline std::string uniq(const char *base) {
  static int n;
  return std::string(base) + "-" + std::to_string(getpid()) + "-" + std::to_string(++n);
}

// Runs fn in a child process; its return value is the exit status.
inline pid_t spawn(const std::function<int()> &fn) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = fn();
    _exit(rc);
  }
  return pid;
}

// Waits at most timeout_ms; kills the child on timeout. Returns its exit status, 128+sig
// when killed by a signal, or -1 on timeout.
inline int wait_child(pid_t pid, int timeout_ms = 20000) {
  for (int waited = 0;; waited += 5) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0) return -2;
    if (waited >= timeout_ms) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(5000);
  }
}

// Files in a folder (without . and ..).
inline std::vector<std::string> list_dir(const std::string &dir) {
  std::vector<std::string> out;
  DIR *d = opendir(dir.c_str());
  if (!d) return out;
  while (struct dirent *e = readdir(d))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) out.push_back(e->d_name);
  closedir(d);
  return out;
}

inline uint64_t fnv(const void *p, size_t n, uint64_t h = 1469598103934665603ull) {
  const unsigned char *c = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

}  // namespace shmtest
#endif
