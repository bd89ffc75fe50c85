// The one piece every suite needs first: a CXRPC_ROOT of the test binary's own
// ($TEST_TMPDIR/<tag>-<pid>), set before the first cxr_* call and before any thread starts,
// and environment writes checked to happen with no other thread. Header-only (//tests:root).
#ifndef CXRPC_TESTS_ROOT_H
#define CXRPC_TESTS_ROOT_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace cxrt {

// This process's threads (entries of /proc/self/task), or -1 if it cannot tell.
inline int thread_count() {
  DIR *d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != nullptr;) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Threads of the sanitizer's own, which read no environment: TSan starts a background thread
// with the first thread of the program.
#if defined(__SANITIZE_THREAD__)
const int kRuntimeThreads = 1;
#else
const int kRuntimeThreads = 0;
#endif

// Whether the caller is this process's one thread (the sanitizer's aside). A thread just
// joined may still be listed for a moment (it is woken before the kernel reaps it): waits up
// to 2 s for that.
inline bool alone() {
  auto ok = [] { return thread_count() >= 1 && thread_count() <= 1 + kRuntimeThreads; };
  for (int i = 0; i < 200 && !ok(); i++) usleep(10000);
  return ok();
}

// setenv/unsetenv for a test, done only when no other thread runs: threads of the code under
// test call getenv, and setenv may move environ under them (undefined). False, with nothing
// written, otherwise: set the variable before the threads start and clear it after they
// end, or give it to a child process.
inline bool setenv_alone(const char *k, const char *v) { return alone() && setenv(k, v, 1) == 0; }
inline bool unsetenv_alone(const char *k) { return alone() && unsetenv(k) == 0; }

// Sets CXRPC_ROOT: only while no other thread runs (see setenv_alone), so call it before any
// (at file scope, or where the suite's threads have all ended). Aborts with a message if
// threads run: call_test set it again mid-binary beside a UCX engine's progress thread.
inline std::string setup_root(const char *tag) {
  const char *t = getenv("TEST_TMPDIR");
  std::string root = std::string(t ? t : "/tmp") + "/" + tag + "-" + std::to_string(getpid());
  mkdir(root.c_str(), 0777);
  if (!setenv_alone("CXRPC_ROOT", root.c_str())) {
    fprintf(stderr, "setup_root(%s): %d threads run: setenv may move environ under their "
            "getenv; set the root before they start\n", tag, thread_count());
    abort();
  }
  return root;
}

}  // namespace cxrt

#endif
