// Enforced mode end to end: a server with CXRPC_ENFORCE=1 and a client program under
// `cxrpcd run`. While the handler holds the client's sealed argument, the client's attempts
// to unseal it are refused by the supervisor and the handler's bytes do not change; after
// the call, the release goes through.
#include <gtest/gtest.h>

#include "tests/root.h"
#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <string>

#include <cxrpc/seal.h>

#include "tests/sandbox/harness.h"

using namespace sbx;

namespace {

std::atomic<int> g_in{0}, g_go{0};

int h_hold(cxr_call *call, const void *args, void **result, void *user) {
  g_in = 1;
  for (int i = 0; i < 2000 && !g_go; i++) usleep(5000);  // bounded: 10 s
  const unsigned char *b = (const unsigned char *)args;
  for (size_t i = 0; i < 4096; i++)
    if (b[i] != 0x5a) return CXR_ECORRUPT;
  return cxr_call_check_sealed(call, args, 4096);
}

bool read_line(FILE *f, char *buf, size_t n) {
  struct pollfd p = {fileno(f), POLLIN, 0};
  if (poll(&p, 1, 20000) != 1) return false;
  return fgets(buf, (int)n, f) != nullptr;
}

TEST(RpcEnforce, SupervisedClientCannotUnsealWhileTheServerHoldsTheArgument) {
  std::string root = cxrt::setup_root("rpcenf");
  Supervisor sup;
  ASSERT_TRUE(start_supervisor(&sup));
  setenv("CXRPC_ENFORCE", "1", 1);
  setenv("CXRPC_CXRPCD", sup.sock.c_str(), 1);
  std::string name = "enf" + std::to_string(getpid() % 100000);
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  o.conn_heap_size = 8u << 20;
  o.max_conns = 4;
  o.pool = 1;
  cxr_channel *ch = nullptr;
  ASSERT_EQ(cxr_channel_open(&ch, name.c_str(), &o), 0);
  ASSERT_EQ(cxr_channel_on(ch, 1, h_hold, nullptr), 0);
  ASSERT_EQ(cxr_channel_start(ch), 0);

  int in[2], out[2];
  ASSERT_EQ(pipe(in), 0);
  ASSERT_EQ(pipe(out), 0);
  std::string cx = runfile("tools/cxrpcd/cxrpcd"), cl = runfile("tests/sandbox/rpc_client");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    execl(cx.c_str(), "cxrpcd", "run", "--socket", sup.sock.c_str(), "--", cl.c_str(),
          name.c_str(), (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  FILE *from = fdopen(out[0], "r");
  char line[128] = "";
  ASSERT_TRUE(read_line(from, line, sizeof line));
  EXPECT_STREQ(line, "called 0\n");
  for (int i = 0; i < 2000 && !g_in; i++) usleep(5000);
  ASSERT_EQ(g_in.load(), 1) << "the sealed call never reached the handler";
  ASSERT_EQ(write(in[1], "attack\n", 7), 7);
  ASSERT_TRUE(read_line(from, line, sizeof line));
  // mprotect and mremap refused by the supervisor; a plain store faults.
  EXPECT_STREQ(line, "attack -1 -1 -14\n");
  g_go = 1;
  ASSERT_TRUE(read_line(from, line, sizeof line));
  EXPECT_STREQ(line, "done 0\n");  // the handler saw the bytes unchanged and sealed
  ASSERT_TRUE(read_line(from, line, sizeof line));
  EXPECT_STREQ(line, "write 0\n");  // released after done: writable again
  int st = 0;
  for (int i = 0; i < 1000 && waitpid(pid, &st, WNOHANG) == 0; i++) usleep(10000);
  if (waitpid(pid, &st, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
  }
  fclose(from);
  close(in[1]);
  uint64_t allowed = 0, refused = 0;
  EXPECT_TRUE(supervisor_stats(sup, &allowed, &refused));
  EXPECT_GE(refused, 2u);
  cxr_channel_close(ch);
  stop_supervisor(&sup);
  unsetenv("CXRPC_ENFORCE");
}

}  // namespace
