// A suite that includes this (once, in its one test file) fails if a test wrote its own
// environment: setenv, unsetenv and putenv are interposed (the executable's definitions win
// over libc's). Threads of the code under test (engines', UCX's) call getenv, and setenv may
// move environ under them: undefined. A test gives a variable to a child process instead
// (cxrt::Proc, or `VAR=value cmd` through popen). In a child made by fork, before it execs,
// a write ends the child at once with status kEnvWriteInForkChild: the fork may have left
// glibc's environment lock held by a thread that does not exist there, and putenv hung.
#pragma once
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace cxrt {

const int kEnvWriteInForkChild = 97;

inline std::atomic<int> g_env_writes{0};
inline bool g_in_fork_child = false;  // set by the atfork handler, in the child alone

inline void count_env_write() {
  if (g_in_fork_child) {
    static const char m[] = "env_writes.h: a forked child wrote its environment before exec\n";
    (void)!write(2, m, sizeof m - 1);
    _exit(kEnvWriteInForkChild);
  }
  g_env_writes++;
}

template <typename F>
F next_env_call(const char *name) {
  return (F)dlsym(RTLD_NEXT, name);
}

class NoEnvironmentWrites : public ::testing::Environment {
  void SetUp() override {
    pthread_atfork(nullptr, nullptr, [] { g_in_fork_child = true; });
  }
  void TearDown() override {
    EXPECT_EQ(g_env_writes.load(), 0) << "a test set this process's environment (see setenv)";
  }
};
inline const auto *const kNoEnvironmentWrites =
    ::testing::AddGlobalTestEnvironment(new NoEnvironmentWrites);

}  // namespace cxrt

extern "C" int setenv(const char *k, const char *v, int overwrite) noexcept {
  cxrt::count_env_write();
  return cxrt::next_env_call<int (*)(const char *, const char *, int)>("setenv")(k, v, overwrite);
}

extern "C" int unsetenv(const char *k) noexcept {
  cxrt::count_env_write();
  return cxrt::next_env_call<int (*)(const char *)>("unsetenv")(k);
}

extern "C" int putenv(char *kv) noexcept {
  cxrt::count_env_write();
  return cxrt::next_env_call<int (*)(char *)>("putenv")(kv);
}
