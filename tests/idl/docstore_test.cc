// examples/docstore end to end: the real server and client binaries in two processes on a
// root of the test's own; the client exits 0 only when every answer it checks is right
// (including a cyclic document refused by the server's skeleton).
#include <gtest/gtest.h>

#include "tests/root.h"
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>

namespace {

pid_t run(const char *path, const char *arg, const std::string &log) {
  pid_t p = fork();
  if (p == 0) {
    FILE *f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(1, 2);
    execl(path, path, arg, (char *)nullptr);
    _exit(127);
  }
  return p;
}

// Waits at most ms for pid; -1 on timeout (the child is then killed).
int wait_for(pid_t pid, int ms) {
  for (int i = 0; i < ms / 10; i++) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

std::string slurp(const std::string &path) {
  std::string s;
  FILE *f = fopen(path.c_str(), "r");
  if (!f) return s;
  char b[4096];
  size_t n;
  while ((n = fread(b, 1, sizeof b, f)) > 0) s.append(b, n);
  fclose(f);
  return s;
}

TEST(Docstore, ServerAndClientAgree) {
  std::string root = cxrt::setup_root("docstore");
  std::string chan = "ds" + std::to_string(getpid());
  pid_t srv = run("examples/docstore/server", chan.c_str(), root + "/server.log");
  pid_t cli = run("examples/docstore/client", chan.c_str(), root + "/client.log");
  int rc = wait_for(cli, 60000);
  std::string out = slurp(root + "/client.log");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("query city == \"London\" -> ada alan"), std::string::npos) << out;
  EXPECT_NE(out.find("put of a cyclic tree -> protocol error"), std::string::npos) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
  kill(srv, SIGTERM);
  EXPECT_EQ(wait_for(srv, 10000), 0) << slurp(root + "/server.log");
  EXPECT_NE(slurp(root + "/server.log").find("stopping with 4 documents"), std::string::npos)
      << slurp(root + "/server.log");
}

}  // namespace
